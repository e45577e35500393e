/*
 * ProcessGroupConflux: c10d operations mapped onto Conflux calls. See the
 * header for the rules; docs/pytorch.md for what a user sees.
 */
#include "process_group_conflux.hpp"

#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace cfx_torch {

namespace {

/* Conflux's type for a tensor, or a clear error for one it lacks. */
cfxDataType_t cfx_type(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return cfxFloat32;
    case at::kDouble: return cfxFloat64;
    case at::kHalf: return cfxFloat16;
    case at::kBFloat16: return cfxBfloat16;
    case at::kChar: return cfxInt8;
    case at::kByte: return cfxUint8;
    case at::kInt: return cfxInt32;
    case at::kLong: return cfxInt64;
    default:
      TORCH_CHECK(false, "conflux: tensors of dtype ", tensor.scalar_type(),
                  " are not supported (float32, float64, float16, bfloat16, int8, uint8, "
                  "int32, int64 are)");
  }
  return cfxFloat32; /* Unreachable. */
}

/* Checks what every tensor given to Conflux must be: on the CPU, of a type
 * Conflux has. */
void check_tensor(const at::Tensor& tensor) {
  TORCH_CHECK(tensor.device().is_cpu(), "conflux: only CPU tensors are supported, got one on ",
              tensor.device());
  TORCH_CHECK(!tensor.is_sparse(), "conflux: sparse tensors are not supported");
  (void)cfx_type(tensor);
}

void check_single(const std::vector<at::Tensor>& tensors, const char* what) {
  TORCH_CHECK(tensors.size() == 1, "conflux: ", what, " takes exactly one tensor, got ",
              tensors.size());
  check_tensor(tensors[0]);
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "conflux: ", what,
              ": tensors of different dtypes (", a.scalar_type(), ", ", b.scalar_type(), ")");
  TORCH_CHECK(a.numel() == b.numel(), "conflux: ", what, ": tensors of different sizes (",
              a.numel(), " and ", b.numel(), " elements)");
}

cfxRedOp_t cfx_op(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return cfxSum;
    case c10d::ReduceOp::PREMUL_SUM: return cfxSum; /* After the multiply. */
    case c10d::ReduceOp::AVG: return cfxAvg;
    case c10d::ReduceOp::PRODUCT: return cfxProd;
    case c10d::ReduceOp::MIN: return cfxMin;
    case c10d::ReduceOp::MAX: return cfxMax;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      TORCH_CHECK(false, "conflux: bitwise reductions (BAND, BOR, BXOR) are not supported; "
                         "use SUM, AVG, PRODUCT, MIN, MAX or PREMUL_SUM");
    default: TORCH_CHECK(false, "conflux: unknown reduce op ", static_cast<int>(op.op_));
  }
  return cfxSum; /* Unreachable. */
}

/* The factor PREMUL_SUM multiplies tensor `index` by. */
at::Scalar premul_factor(const c10d::ReduceOp& op, size_t index) {
  TORCH_CHECK(op.supplement_.defined(), "conflux: PREMUL_SUM without a factor");
  /* Only PREMUL_SUM carries a supplement, and it is always this type. */
  auto* supplement = static_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  if (supplement->tensor_factors.empty()) return supplement->double_factor;
  TORCH_CHECK(index < supplement->tensor_factors.size(),
              "conflux: PREMUL_SUM has no factor for tensor ", index);
  return supplement->tensor_factors[index].item();
}

/* A contiguous tensor to hand Conflux; unstage() copies results back. */
at::Tensor stage(const at::Tensor& tensor) {
  return tensor.is_contiguous() ? tensor : tensor.contiguous();
}

void unstage(at::Tensor& tensor, const at::Tensor& staged) {
  if (!staged.is_same(tensor)) tensor.copy_(staged);
}

}  // namespace

template <typename Body>
c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::run(c10d::OpType op_type,
                                                        std::vector<at::Tensor> outputs,
                                                        Body&& body) {
  auto work = c10::make_intrusive<WorkConflux>(rank_, op_type, std::move(outputs));
  std::function<void()> task = [this, work, body = std::forward<Body>(body)]() mutable {
    std::exception_ptr error;
    try {
      body();
    } catch (...) {
      error = std::current_exception();
      failed_ = true;
    }
    work->complete(error);
  };
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    queue_.push_back(std::move(task));
  }
  queue_cv_.notify_one();
  return work;
}

void ProcessGroupConflux::work_loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return; /* Stopped, and nothing left to run. */
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

/* ------------------------------------------------------------------ Work */

WorkConflux::WorkConflux(int rank, c10d::OpType op_type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, op_type), outputs_(std::move(outputs)) {
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

void WorkConflux::complete(std::exception_ptr error) {
  if (error) {
    finish(error);
    future_->setError(error);
  } else {
    finish();
    future_->markCompleted(c10::IValue(outputs_));
  }
}

std::vector<at::Tensor> WorkConflux::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> WorkConflux::getFuture() { return future_; }

/* ------------------------------------------------------------ lifecycle */

ProcessGroupConflux::ProcessGroupConflux(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int size, std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size) {
  /* Each group's timeout becomes its communicator's (config.timeout, whole
   * seconds rounded up), unless the user set CFX_TIMEOUT: that wins. */
  cfxConfig_t config = CFX_CONFIG_INITIALIZER;
  if (std::getenv("CFX_TIMEOUT") == nullptr && timeout.count() > 0) {
    long long seconds = (timeout.count() + 999) / 1000;
    config.timeout = static_cast<int>(std::min<long long>(seconds, 1000000000));
  }
  cfxUniqueId id;
  if (rank == 0) {
    check(cfxGetUniqueId(&id), "cfxGetUniqueId");
    std::vector<uint8_t> bytes(reinterpret_cast<uint8_t*>(&id),
                               reinterpret_cast<uint8_t*>(&id) + sizeof(id));
    store->set(kUniqueIdKey, bytes);
  } else {
    std::vector<uint8_t> bytes = store->get(kUniqueIdKey);
    TORCH_CHECK(bytes.size() == sizeof(id), "conflux: the unique id in the store has ",
                bytes.size(), " bytes, not ", sizeof(id));
    std::memcpy(&id, bytes.data(), sizeof(id));
  }
  check(cfxCommInitRankConfig(&comm_, size, id, rank, &config), "cfxCommInitRankConfig");
  init();
  worker_ = std::thread([this] { work_loop(); });
}

ProcessGroupConflux::~ProcessGroupConflux() {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stop_ = true;
  }
  queue_cv_.notify_one();
  /* Queued operations still run (or fail) before the join. A group whose
   * last reference goes away inside one of its own operations (a future's
   * callback) cannot join itself: its worker ends after this task. */
  if (worker_.joinable()) {
    if (worker_.get_id() == std::this_thread::get_id())
      worker_.detach();
    else
      worker_.join();
  }
  if (comm_ == nullptr) return;
  if (failed_)
    cfxCommAbort(comm_);
  else
    cfxCommDestroy(comm_);
}

c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroupConflux::create(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const std::chrono::duration<float>& timeout) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  return c10::make_intrusive<ProcessGroupConflux>(store, rank, size, ms);
}

void ProcessGroupConflux::check(cfxResult_t result, const char* what) {
  if (result == cfxSuccess) return;
  const char* last = comm_ != nullptr ? cfxGetLastError(comm_) : cfxGetLastError(nullptr);
  std::string message = std::string("conflux: ") + what + " failed on rank " +
                        std::to_string(rank_) + ": " + cfxGetErrorString(result);
  if (last != nullptr && last[0] != '\0') message += ": " + std::string(last);
  throw std::runtime_error(message);
}

/* ----------------------------------------------------------- collectives */

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  check_single(tensors, "broadcast");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "conflux: broadcast root ",
              opts.rootRank, " out of range");
  return run(c10d::OpType::BROADCAST, tensors, [=]() mutable {
    at::Tensor staged = stage(tensors[0]);
    check(cfxBroadcast(staged.data_ptr(), staged.data_ptr(), staged.numel(), cfx_type(staged),
                       static_cast<int>(opts.rootRank), comm_, nullptr),
          "broadcast");
    unstage(tensors[0], staged);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "conflux: allreduce of no tensors");
  for (const auto& t : tensors) check_tensor(t);
  cfxRedOp_t op = cfx_op(opts.reduceOp);
  bool premul = opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM;
  return run(c10d::OpType::ALLREDUCE, tensors, [=]() mutable {
    std::vector<at::Tensor> staged;
    for (size_t i = 0; i < tensors.size(); i++)
      staged.push_back(premul ? tensors[i].mul(premul_factor(opts.reduceOp, i)).contiguous()
                              : stage(tensors[i]));
    check(cfxGroupStart(), "cfxGroupStart");
    cfxResult_t result = cfxSuccess;
    for (auto& t : staged) {
      result = cfxAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), cfx_type(t), op, comm_,
                            nullptr);
      if (result != cfxSuccess) break;
    }
    cfxResult_t end = cfxGroupEnd();
    check(result != cfxSuccess ? result : end, "allreduce");
    for (size_t i = 0; i < tensors.size(); i++) unstage(tensors[i], staged[i]);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return allreduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::reduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::ReduceOptions& opts) {
  check_single(tensors, "reduce");
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "conflux: reduce root ",
              opts.rootRank, " out of range");
  cfxRedOp_t op = cfx_op(opts.reduceOp);
  bool premul = opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM;
  return run(c10d::OpType::REDUCE, tensors, [=]() mutable {
    at::Tensor staged = premul ? tensors[0].mul(premul_factor(opts.reduceOp, 0)).contiguous()
                               : stage(tensors[0]);
    check(cfxReduce(staged.data_ptr(), staged.data_ptr(), staged.numel(), cfx_type(staged), op,
                    static_cast<int>(opts.rootRank), comm_, nullptr),
          "reduce");
    unstage(tensors[0], staged);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  check_single(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(size_),
              "conflux: allgather needs one list of ", size_, " output tensors");
  for (const auto& t : outputs[0]) {
    check_tensor(t);
    check_same(t, inputs[0], "allgather");
  }
  (void)opts;
  return run(c10d::OpType::ALLGATHER, outputs[0], [=]() mutable {
    at::Tensor input = stage(inputs[0]);
    int64_t n = input.numel();
    at::Tensor flat = at::empty({n * size_}, input.options());
    check(cfxAllGather(input.data_ptr(), flat.data_ptr(), n, cfx_type(input), comm_, nullptr),
          "allgather");
    for (int r = 0; r < size_; r++)
      outputs[0][r].copy_(flat.narrow(0, r * n, n).view(outputs[0][r].sizes()));
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  check_tensor(input);
  check_tensor(output);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "conflux: _allgather_base: input and output dtypes differ");
  TORCH_CHECK(output.numel() == input.numel() * size_, "conflux: _allgather_base: output has ",
              output.numel(), " elements, not ", size_, " x ", input.numel());
  (void)opts;
  return run(c10d::OpType::_ALLGATHER_BASE, {output}, [=]() mutable {
    at::Tensor in = stage(input);
    at::Tensor out = stage(output);
    check(cfxAllGather(in.data_ptr(), out.data_ptr(), in.numel(), cfx_type(in), comm_, nullptr),
          "_allgather_base");
    unstage(output, out);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  check_single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_),
              "conflux: reduce_scatter needs one list of ", size_, " input tensors");
  for (const auto& t : inputs[0]) {
    check_tensor(t);
    check_same(t, outputs[0], "reduce_scatter");
  }
  cfxRedOp_t op = cfx_op(opts.reduceOp);
  bool premul = opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM;
  return run(c10d::OpType::REDUCE_SCATTER, outputs, [=]() mutable {
    std::vector<at::Tensor> flat_inputs;
    for (const auto& t : inputs[0]) flat_inputs.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_inputs);
    if (premul) flat.mul_(premul_factor(opts.reduceOp, 0));
    at::Tensor out = stage(outputs[0]);
    check(cfxReduceScatter(flat.data_ptr(), out.data_ptr(), out.numel(), cfx_type(out), op,
                           comm_, nullptr),
          "reduce_scatter");
    unstage(outputs[0], out);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_tensor(input);
  check_tensor(output);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "conflux: _reduce_scatter_base: input and output dtypes differ");
  TORCH_CHECK(input.numel() == output.numel() * size_, "conflux: _reduce_scatter_base: input has ",
              input.numel(), " elements, not ", size_, " x ", output.numel());
  cfxRedOp_t op = cfx_op(opts.reduceOp);
  bool premul = opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM;
  return run(c10d::OpType::_REDUCE_SCATTER_BASE, {output}, [=]() mutable {
    at::Tensor in = premul ? input.mul(premul_factor(opts.reduceOp, 0)).contiguous()
                           : stage(input);
    at::Tensor out = stage(output);
    check(cfxReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), cfx_type(out), op, comm_,
                           nullptr),
          "_reduce_scatter_base");
    unstage(output, out);
  });
}

/* --------------------------------------------- send/recv built operations */

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  check_tensor(input);
  check_tensor(output);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(),
              "conflux: alltoall_base: input and output dtypes differ");
  (void)opts;
  /* Element offsets and counts per peer, from splits along dimension 0. */
  auto layout = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
    std::vector<int64_t> counts(size_), offsets(size_);
    int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    int64_t row = rows > 0 ? t.numel() / rows : 0;
    if (splits.empty()) {
      TORCH_CHECK(rows % size_ == 0, "conflux: alltoall_base: ", which, " has ", rows,
                  " rows, not a multiple of the group size ", size_);
    } else {
      TORCH_CHECK(splits.size() == static_cast<size_t>(size_), "conflux: alltoall_base: ",
                  which, " splits has ", splits.size(), " entries, not ", size_);
    }
    int64_t offset = 0;
    for (int r = 0; r < size_; r++) {
      int64_t n = splits.empty() ? rows / size_ : splits[r];
      TORCH_CHECK(n >= 0, "conflux: alltoall_base: negative split");
      counts[r] = n * row;
      offsets[r] = offset;
      offset += n * row;
    }
    TORCH_CHECK(offset == t.numel(), "conflux: alltoall_base: ", which, " splits cover ", offset,
                " elements of ", t.numel());
    return std::make_pair(counts, offsets);
  };
  auto send_layout = layout(input, input_splits, "input");
  auto recv_layout = layout(output, output_splits, "output");
  return run(c10d::OpType::ALLTOALL_BASE, {output}, [=]() mutable {
    at::Tensor in = stage(input);
    at::Tensor out = stage(output);
    at::Tensor in_flat = in.view({-1});
    at::Tensor out_flat = out.view({-1});
    cfxDataType_t type = cfx_type(in);
    size_t elem = in.element_size();
    auto* in_bytes = static_cast<char*>(in.data_ptr());
    auto* out_bytes = static_cast<char*>(out.data_ptr());
    TORCH_CHECK(send_layout.first[rank_] == recv_layout.first[rank_],
                "conflux: alltoall_base: rank ", rank_, " sends itself ",
                send_layout.first[rank_], " elements but expects ", recv_layout.first[rank_]);
    std::memcpy(out_bytes + recv_layout.second[rank_] * elem,
                in_bytes + send_layout.second[rank_] * elem, send_layout.first[rank_] * elem);
    check(cfxGroupStart(), "cfxGroupStart");
    cfxResult_t result = cfxSuccess;
    for (int r = 0; r < size_ && result == cfxSuccess; r++) {
      if (r == rank_) continue;
      if (send_layout.first[r] > 0)
        result = cfxSend(in_bytes + send_layout.second[r] * elem, send_layout.first[r], type, r,
                         comm_, nullptr);
      if (result == cfxSuccess && recv_layout.first[r] > 0)
        result = cfxRecv(out_bytes + recv_layout.second[r] * elem, recv_layout.first[r], type, r,
                         comm_, nullptr);
    }
    cfxResult_t end = cfxGroupEnd();
    check(result != cfxSuccess ? result : end, "alltoall_base");
    unstage(output, out);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::alltoall(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(outputs.size() == static_cast<size_t>(size_) &&
                  inputs.size() == static_cast<size_t>(size_),
              "conflux: alltoall needs ", size_, " input and ", size_, " output tensors");
  for (int r = 0; r < size_; r++) {
    check_tensor(inputs[r]);
    check_tensor(outputs[r]);
    TORCH_CHECK(inputs[r].scalar_type() == outputs[r].scalar_type(),
                "conflux: alltoall: input and output dtypes differ");
  }
  check_same(inputs[rank_], outputs[rank_], "alltoall (this rank's own tensors)");
  (void)opts;
  return run(c10d::OpType::ALLTOALL, outputs, [=]() mutable {
    std::vector<at::Tensor> in, out;
    for (int r = 0; r < size_; r++) {
      in.push_back(stage(inputs[r]));
      out.push_back(stage(outputs[r]));
    }
    out[rank_].copy_(in[rank_]);
    check(cfxGroupStart(), "cfxGroupStart");
    cfxResult_t result = cfxSuccess;
    for (int r = 0; r < size_ && result == cfxSuccess; r++) {
      if (r == rank_) continue;
      if (in[r].numel() > 0)
        result = cfxSend(in[r].data_ptr(), in[r].numel(), cfx_type(in[r]), r, comm_, nullptr);
      if (result == cfxSuccess && out[r].numel() > 0)
        result = cfxRecv(out[r].data_ptr(), out[r].numel(), cfx_type(out[r]), r, comm_, nullptr);
    }
    cfxResult_t end = cfxGroupEnd();
    check(result != cfxSuccess ? result : end, "alltoall");
    for (int r = 0; r < size_; r++) unstage(outputs[r], out[r]);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  check_single(inputs, "gather");
  int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "conflux: gather root ", root, " out of range");
  if (rank_ == root) {
    TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(size_),
                "conflux: gather needs one list of ", size_, " output tensors on the root");
    for (const auto& t : outputs[0]) {
      check_tensor(t);
      check_same(t, inputs[0], "gather");
    }
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()),
                "conflux: gather takes output tensors only on the root");
  }
  std::vector<at::Tensor> results = rank_ == root ? outputs[0] : std::vector<at::Tensor>{};
  return run(c10d::OpType::GATHER, results, [=]() mutable {
    at::Tensor in = stage(inputs[0]);
    if (rank_ != root) {
      check(cfxSend(in.data_ptr(), in.numel(), cfx_type(in), root, comm_, nullptr), "gather");
      return;
    }
    std::vector<at::Tensor> out;
    for (int r = 0; r < size_; r++) out.push_back(stage(outputs[0][r]));
    out[root].copy_(in.view(out[root].sizes()));
    check(cfxGroupStart(), "cfxGroupStart");
    cfxResult_t result = cfxSuccess;
    for (int r = 0; r < size_ && result == cfxSuccess; r++)
      if (r != root && out[r].numel() > 0)
        result = cfxRecv(out[r].data_ptr(), out[r].numel(), cfx_type(out[r]), r, comm_, nullptr);
    cfxResult_t end = cfxGroupEnd();
    check(result != cfxSuccess ? result : end, "gather");
    for (int r = 0; r < size_; r++) unstage(outputs[0][r], out[r]);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  check_single(outputs, "scatter");
  int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < size_, "conflux: scatter root ", root, " out of range");
  if (rank_ == root) {
    TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(size_),
                "conflux: scatter needs one list of ", size_, " input tensors on the root");
    for (const auto& t : inputs[0]) {
      check_tensor(t);
      check_same(t, outputs[0], "scatter");
    }
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()),
                "conflux: scatter takes input tensors only on the root");
  }
  return run(c10d::OpType::SCATTER, outputs, [=]() mutable {
    at::Tensor out = stage(outputs[0]);
    if (rank_ != root) {
      check(cfxRecv(out.data_ptr(), out.numel(), cfx_type(out), root, comm_, nullptr),
            "scatter");
      unstage(outputs[0], out);
      return;
    }
    std::vector<at::Tensor> in;
    for (int r = 0; r < size_; r++) in.push_back(stage(inputs[0][r]));
    out.copy_(in[root].view(out.sizes()));
    check(cfxGroupStart(), "cfxGroupStart");
    cfxResult_t result = cfxSuccess;
    for (int r = 0; r < size_ && result == cfxSuccess; r++)
      if (r != root && in[r].numel() > 0)
        result = cfxSend(in[r].data_ptr(), in[r].numel(), cfx_type(in[r]), r, comm_, nullptr);
    cfxResult_t end = cfxGroupEnd();
    check(result != cfxSuccess ? result : end, "scatter");
    unstage(outputs[0], out);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::send(std::vector<at::Tensor>& tensors,
                                                         int dst_rank, int tag) {
  check_single(tensors, "send");
  TORCH_CHECK(dst_rank >= 0 && dst_rank < size_ && dst_rank != rank_, "conflux: send to rank ",
              dst_rank, " (group of ", size_, ", this is rank ", rank_, ")");
  (void)tag; /* Conflux matches sends and receives in order per peer. */
  return run(c10d::OpType::SEND, tensors, [=]() mutable {
    at::Tensor staged = stage(tensors[0]);
    check(cfxSend(staged.data_ptr(), staged.numel(), cfx_type(staged), dst_rank, comm_, nullptr),
          "send");
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::recv(std::vector<at::Tensor>& tensors,
                                                         int src_rank, int tag) {
  check_single(tensors, "recv");
  TORCH_CHECK(src_rank >= 0 && src_rank < size_ && src_rank != rank_,
              "conflux: recv from rank ", src_rank, " (group of ", size_, ", this is rank ",
              rank_, ")");
  (void)tag;
  return run(c10d::OpType::RECV, tensors, [=]() mutable {
    at::Tensor staged = stage(tensors[0]);
    check(cfxRecv(staged.data_ptr(), staged.numel(), cfx_type(staged), src_rank, comm_, nullptr),
          "recv");
    unstage(tensors[0], staged);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::recvAnysource(std::vector<at::Tensor>&,
                                                                  int) {
  TORCH_CHECK(false, "conflux: recv from any source is not supported; name the source rank");
  return {}; /* Unreachable. */
}

c10::intrusive_ptr<c10d::Work> ProcessGroupConflux::barrier(const c10d::BarrierOptions& opts) {
  (void)opts;
  return run(c10d::OpType::BARRIER, {}, [=]() mutable {
    uint8_t token = 0;
    check(cfxAllReduce(&token, &token, 1, cfxUint8, cfxSum, comm_, nullptr), "barrier");
  });
}

}  // namespace cfx_torch
