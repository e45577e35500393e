/*
 * ProcessGroupConflux: a torch.distributed (c10d) process group over the
 * Conflux C API (include/conflux.h), for CPU tensors.
 *
 * Rules:
 *  - One cfxComm_t per process group. Rank 0 makes the unique id and puts it
 *    in the c10d store under kUniqueIdKey; the other ranks wait for it there
 *    (the store given to a subgroup carries the group's own prefix).
 *  - Operations are asynchronous, as Gloo's: each is checked on the caller's
 *    thread, then queued to the group's one worker thread, which runs the
 *    Conflux calls (stream NULL) in queue order and completes the Work and
 *    its future; the caller's computation overlaps the communication (DDP's
 *    gradient buckets). A Conflux error does not throw from the operation: it
 *    is kept in the Work, and wait() and the future rethrow it with
 *    Conflux's sentence (cfxGetLastError), which names the peer at fault.
 *  - Bad arguments (a dtype Conflux lacks, a CUDA tensor, a bitwise op) throw
 *    at once, before any rank communicates.
 *  - Non-contiguous tensors are copied into contiguous ones and back.
 *  - Operations from several threads on one group run one at a time, in the
 *    order they were queued; every rank must issue them in the same order.
 */
#pragma once

#include <conflux.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cfx_torch {

/* An operation: its outputs once complete, or the error that stopped it. */
class WorkConflux : public c10d::Work {
 public:
  WorkConflux(int rank, c10d::OpType op_type, std::vector<at::Tensor> outputs);

  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  /* Called once, by the worker: the operation ended (error null: it worked). */
  void complete(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupConflux : public c10d::ProcessGroup {
 public:
  /* Joins the group's communicator through `store`; blocks until every rank
   * of the group has joined. Throws with Conflux's sentence on failure. */
  ProcessGroupConflux(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout);
  ~ProcessGroupConflux() override;

  static constexpr const char* kUniqueIdKey = "conflux/unique_id";

  /* The creator torch.distributed.Backend.register_backend calls. */
  static c10::intrusive_ptr<c10d::ProcessGroup> create(
      const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
      const std::chrono::duration<float>& timeout);

  const std::string getBackendName() const override { return "conflux"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  /* Throws a std::runtime_error naming `what` and Conflux's last error. */
  void check(cfxResult_t result, const char* what);

  /* Queues `body` (the Conflux calls; it owns copies of what it uses) for
   * the worker and returns its Work, completed when the body has run. */
  template <typename Body>
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType op_type, std::vector<at::Tensor> outputs,
                                     Body&& body);

  /* The worker: runs queued bodies in order until stop_ and an empty queue. */
  void work_loop();

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread worker_; /* The only thread that calls Conflux on comm_ after init. */
  cfxComm_t comm_ = nullptr;
  std::atomic<bool> failed_{false}; /* A call failed: abort rather than destroy. */
};

}  // namespace cfx_torch
