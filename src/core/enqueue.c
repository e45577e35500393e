/*
 * Collective and point-to-point entry points: check the arguments once,
 * describe the operation, then queue it (inside a group) or run it now.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/reduce.h"
#include "src/coll/prims.h"
#include "src/core/argcheck.h"
#include "src/core/comm.h"
#include "src/core/enqueue.h"
#include "src/core/probe.h"
#include "src/core/redop.h"
#include "src/util/check.h"
#include "src/util/cuda.h"
#include "src/util/log.h"

/* Whether this thread's current call holds its communicator, or was refused
 * it because another thread does. */
static _Thread_local int cfx_core_held_by_me;
static _Thread_local int cfx_core_claim_lost;
/* The stream and memory kind of this thread's current call (classify). */
static _Thread_local cfxStream_t call_stream;
static _Thread_local enum cfx_mem_kind call_mem;

/* NCCL's in-place rules allow exact aliasing only: refuse partial overlap. */
static cfxResult_t check_overlap(const void *send, size_t send_bytes, const void *recv,
                                 size_t recv_bytes, const void *in_place_send, const char *fn)
{
    if (send == NULL || recv == NULL || send_bytes == 0 || recv_bytes == 0 || send == in_place_send)
        return cfxSuccess;
    uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    if (s < r + recv_bytes && r < s + send_bytes)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                             "%s: sendbuff and recvbuff overlap without being in place; use the "
                             "in-place form or separate buffers",
                             fn);
    return cfxSuccess;
}

/* The operation of a call: its arguments, every other field zero (but
 * the op's arrays, which are written before they are read). */
static void op_start(struct cfx_op *op, enum cfx_coll_kind kind, const void *sendbuff,
                     void *recvbuff, size_t count, cfxDataType_t type, cfxRedOp_t redop, int root)
{
    cfx_op_clear(op);
    op->kind = kind;
    op->sendbuff = sendbuff;
    op->recvbuff = recvbuff;
    op->count = count;
    op->type = type;
    op->op = redop;
    op->root = root;
}

/* op_start for a reduction resolved by cfx_core_redop_resolve. */
static void op_start_reduce(struct cfx_op *op, enum cfx_coll_kind kind, const void *sendbuff,
                            void *recvbuff, size_t count, cfxDataType_t type,
                            const struct cfx_core_redop *red, int root)
{
    op_start(op, kind, sendbuff, recvbuff, count, type, red->op, root);
    op->premul = red->premul;
    op->premul_bits = red->premul_bits;
}

/* The fingerprints of an operation: what it stamps, what it expects. Its
 * sequence number comes at launch (cfx_core_launch), so that an operation
 * of a group that never runs does not take one. */
static void fingerprint(struct cfxComm *comm, struct cfx_op *op)
{
    int rooted = op->kind == CFX_COLL_BROADCAST || op->kind == CFX_COLL_REDUCE;
    int reduces = op->kind == CFX_COLL_ALLREDUCE || op->kind == CFX_COLL_REDUCE ||
                  op->kind == CFX_COLL_REDUCESCATTER;
    struct cfx_fingerprint print = {.count = op->count,
                                    .root = rooted ? op->root : -1,
                                    .kind = (uint8_t)op->kind,
                                    .type = (uint8_t)op->type,
                                    .op = !reduces     ? 0xff
                                          : op->premul ? (uint8_t)cfxNumOps /* "premulsum" */
                                                       : (uint8_t)op->op,
                                    .valid = 1};
    if (op->kind == CFX_COLL_SEND || op->kind == CFX_COLL_RECV) {
        /* Messages between two ranks are numbered per direction; a receive
         * expects the matching send. */
        print.root = -1;
        print.kind = CFX_COLL_SEND;
    }
    op->print = print;
    op->expect = print;
    op->check_prints = comm->check_mismatch;
    op->on_stall = cfx_core_probe_stall;
    op->spin_limit = comm->spin_limit;
    op->timeout_s = comm->timeout_s;
}

/* A call on a communicator an earlier error broke, or that was revoked. */
static cfxResult_t broken(const struct cfxComm *comm, enum cfx_coll_kind kind)
{
    if (comm->revoked)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                             "%s: the communicator was revoked (cfxCommRevoke); only "
                             "cfxCommShrink, cfxCommSplit, cfxCommDestroy and cfxCommAbort may "
                             "follow",
                             cfx_coll_name(kind));
    return cfx_error_set(comm->async_error, CFX_LOG_COLL,
                         "%s: the communicator is broken by an earlier error (%s); destroy it",
                         cfx_coll_name(kind), cfxGetErrorString(comm->async_error));
}

/* An op of this thread's current call on @p comm: its rank, owner, stream,
 * memory kind and executor state. */
static void op_bind(struct cfxComm *comm, struct cfx_op *op)
{
    op->rank = comm->rank;
    op->nranks = comm->nranks;
    op->abort_flag = &comm->stop_ops;
    op->owner = comm;
    op->stream = call_stream;
    op->mem_kind = call_mem;
    op->exec_state = comm->cuda;
}

/* Run or queue; on failure record the sentence on the communicator. */
static cfxResult_t submit(struct cfxComm *comm, struct cfx_op *op)
{
    op_bind(comm, op);
    if (comm->async_error != cfxSuccess)
        return broken(comm, op->kind);
    if (op->premul == CFX_PREMUL_DEVICE && op->mem_kind != CFX_MEM_DEVICE)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                             "%s: a PreMulSum op whose scalar is in device memory "
                             "(cfxScalarDevice) runs on GPU buffers only",
                             cfx_coll_name(op->kind));
    fingerprint(comm, op);
    struct cfx_op parts[CFX_RING_CHANNELS]; /* Two trees' halves, or rings' parts. */
    int n_ops = 1;
    struct cfx_op *ops = op;
    size_t bytes = op->count * cfx_type_size(op->type);
    enum cfx_core_algo algo = cfx_core_algo_choose(comm, op->kind, bytes, &op->ll);
    /* Large allgathers between ranks that read each other's memory: one
     * copy per byte and rank fewer (src/coll/pull.h). */
    if (comm->single_copy && op->kind == CFX_COLL_ALLGATHER && bytes > 0 &&
        bytes >= comm->single_copy_min && op->mem_kind == CFX_MEM_HOST)
        op->pull = 1; /* Not for GPU memory: a peer's device pointer is not this kernel's. */
    if (algo == CFX_CORE_ALGO_DIRECT || algo == CFX_CORE_ALGO_TWOSHOT) {
        op->direct = &comm->direct; /* Its connectors are filled in at launch. */
        op->twoshot = algo == CFX_CORE_ALGO_TWOSHOT;
    }
    if (algo == CFX_CORE_ALGO_TREE) {
        /* Two complementary trees, half of the data each. */
        size_t first = op->count / 2, elem = cfx_type_size(op->type);
        parts[0] = *op;
        parts[1] = *op;
        parts[0].count = first;
        parts[1].count = op->count - first;
        parts[1].sendbuff = op->sendbuff ? (const char *)op->sendbuff + first * elem : NULL;
        parts[1].recvbuff = op->recvbuff ? (char *)op->recvbuff + first * elem : NULL;
        parts[0].tree = &comm->trees[0];
        parts[1].tree = &comm->trees[1];
        ops = parts;
        n_ops = 2;
    }
    int channels = algo == CFX_CORE_ALGO_RING && !op->pull
                       ? cfx_core_algo_ring_channels(comm, op->kind, op->count, op->type)
                       : 1;
    if (channels > 1) {
        /* Rings of their own, a contiguous part each (whole 64-byte
         * lines but the last): on a GPU rank each runs as a chain of its
         * own, in blocks of its own. Every rank splits alike. An allgather
         * or reduce-scatter splits each rank's block alike: part c is the
         * same elements of every block, so its blocks stand a whole
         * block's count apart (pitch), in the output or the input. */
        size_t elem = cfx_type_size(op->type), line = 64 / elem;
        size_t per = op->count / (size_t)channels / line * line, at = 0;
        int blocks = op->kind == CFX_COLL_ALLGATHER || op->kind == CFX_COLL_REDUCESCATTER;
        for (int c = 0; c < channels; c++) {
            parts[c] = *op;
            parts[c].channel = c;
            parts[c].count = c == channels - 1 ? op->count - at : per;
            parts[c].pitch = blocks ? op->count : 0;
            parts[c].sendbuff = op->sendbuff ? (const char *)op->sendbuff + at * elem : NULL;
            parts[c].recvbuff = op->recvbuff ? (char *)op->recvbuff + at * elem : NULL;
            at += per;
        }
        ops = parts;
        n_ops = channels;
    }
    if (cfx_core_group_active()) {
        for (int i = 0; i < n_ops; i++)
            CFX_CHECK(cfx_core_group_add(&ops[i]));
        return cfxSuccess;
    }
    return cfx_core_launch(ops, n_ops); /* check_common holds the communicator. */
}

/* Shared end of every entry point; on failure inside a group the group fails
 * too. A call holds its communicator (check_common) until it has written the
 * error sentence, so cfxCommDestroy or cfxCommAbort in another thread waits
 * for it. A call refused because another thread holds the communicator
 * leaves the holder's sentence alone (cfxGetLastError(NULL) has its own). */
static cfxResult_t finish(struct cfxComm *comm, cfxResult_t res)
{
    if (res != cfxSuccess && cfx_core_group_active())
        cfx_core_group_fail(res);
    int held = cfx_core_held_by_me;
    res = cfx_core_api_exit(cfx_core_claim_lost ? NULL : comm, res);
    cfx_core_claim_lost = 0;
    if (held) {
        cfx_core_held_by_me = 0;
        cfx_core_release(comm);
    }
    return res;
}

/* Where a call's buffers live and on what it runs. A GPU rank: device
 * buffers (of its own device) run on the CUDA executor on @p stream (NULL:
 * the legacy stream); host buffers with a stream run in stream order on
 * the host executor, without one at once. A host rank: host buffers only;
 * a stream is synchronised first. */
static cfxResult_t classify(struct cfxComm *comm, cfxStream_t stream, const void *buf_a,
                            const void *buf_b, const char *fn)
{
    call_stream = stream;
    call_mem = CFX_MEM_HOST;
    if (comm->cuda == NULL && stream == NULL)
        return cfxSuccess;
#if CFX_HAVE_CUDA
    const char *why;
    const struct cfx_cuda_api *cu = cfx_cuda_api(&why);
    if (cu == NULL)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                             "%s: a CUDA stream was given but no GPU is usable (%s); pass NULL for "
                             "host buffers",
                             fn, why);
    int dev_a = -1, dev_b = -1;
    int on_a = cfx_cuda_is_device_ptr(buf_a, &dev_a);
    int on_b = on_a; /* In place: one question. */
    if (buf_b != buf_a)
        on_b = cfx_cuda_is_device_ptr(buf_b, &dev_b);
    else
        dev_b = dev_a;
    if (comm->cuda == NULL) {
        if (on_a || on_b)
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                                 "%s: GPU buffers on rank %d, a host rank (no CUDA context was "
                                 "current when it was initialised); call cudaSetDevice before "
                                 "cfxCommInitRank to make it a GPU rank",
                                 fn, comm->rank);
        CFX_CU_CHECK(cu, stream_synchronize((CUstream)stream), CFX_LOG_COLL, "cuStreamSynchronize");
        call_stream = NULL;
        return cfxSuccess;
    }
    if (!on_a && !on_b)
        return cfxSuccess;
    if ((buf_a != NULL && !on_a) || (buf_b != NULL && !on_b))
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                             "%s: one buffer is GPU memory and the other host memory; both must "
                             "be of one kind",
                             fn);
    int dev = on_a ? dev_a : dev_b;
    if ((on_a && dev_a != comm->cuda_dev) || (on_b && dev_b != comm->cuda_dev))
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                             "%s: a buffer is on GPU %d but rank %d runs on GPU %d", fn, dev,
                             comm->rank, comm->cuda_dev);
    if (stream == NULL && comm->gpu_shared)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                             "%s: rank %d shares its GPU with another rank of this process, and "
                             "their kernels on the legacy (NULL) stream would wait for each other "
                             "forever: give each rank a stream of its own",
                             fn, comm->rank);
    call_mem = CFX_MEM_DEVICE;
    return cfxSuccess;
#else
    (void)buf_a;
    (void)buf_b;
    return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                         "%s: a CUDA stream was given but this Conflux has no CUDA; pass NULL for "
                         "host buffers",
                         fn);
#endif
}

static cfxResult_t check_common(struct cfxComm *comm, cfxDataType_t type, cfxStream_t stream,
                                const void *a, const void *b, const char *fn)
{
    CFX_CHECK(cfx_argcheck_comm_usable(comm, fn));
    cfxResult_t res = cfx_core_claim(comm, fn);
    if (res != cfxSuccess) {
        cfx_core_claim_lost = 1;
        return res;
    }
    cfx_core_held_by_me = 1;
    CFX_CHECK(cfx_argcheck_type(type, fn));
    if (comm->cuda != NULL) {
        cfx_core_gpu_reap_soon(comm);
        cfx_core_gpu_surface(comm); /* A failure found meanwhile breaks the communicator. */
    }
    return classify(comm, stream, a, b, fn);
}

CFX_API cfxResult_t cfxAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                 cfxDataType_t datatype, cfxRedOp_t op, cfxComm_t comm,
                                 cfxStream_t stream)
{
    const char *fn = "cfxAllReduce";
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(check_common(comm, datatype, stream, sendbuff, recvbuff, fn), res, out);
    struct cfx_core_redop red;
    CFX_CHECK_GOTO(cfx_core_redop_resolve(comm, op, datatype, fn, &red), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_count(count, datatype, 1, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_buffer(sendbuff, count, fn, "sendbuff"), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_buffer(recvbuff, count, fn, "recvbuff"), res, out);
    size_t bytes = count * cfx_type_size(datatype);
    CFX_CHECK_GOTO(check_overlap(sendbuff, bytes, recvbuff, bytes, recvbuff, fn), res, out);
    struct cfx_op o;
    op_start_reduce(&o, CFX_COLL_ALLREDUCE, sendbuff, recvbuff, count, datatype, &red, 0);
    res = submit(comm, &o);
out:
    return finish(comm, res);
}

CFX_API cfxResult_t cfxBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                 cfxDataType_t datatype, int root, cfxComm_t comm,
                                 cfxStream_t stream)
{
    const char *fn = "cfxBroadcast";
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(check_common(comm, datatype, stream, sendbuff, recvbuff, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_root(comm, root, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_count(count, datatype, 1, fn), res, out);
    if (comm->rank == root)
        CFX_CHECK_GOTO(cfx_argcheck_buffer(sendbuff, count, fn, "sendbuff (on the root)"), res,
                       out);
    CFX_CHECK_GOTO(cfx_argcheck_buffer(recvbuff, count, fn, "recvbuff"), res, out);
    size_t bytes = count * cfx_type_size(datatype);
    if (comm->rank == root)
        CFX_CHECK_GOTO(check_overlap(sendbuff, bytes, recvbuff, bytes, recvbuff, fn), res, out);
    struct cfx_op o;
    op_start(&o, CFX_COLL_BROADCAST, comm->rank == root ? sendbuff : NULL, recvbuff, count,
             datatype, cfxSum, root);
    res = submit(comm, &o);
out:
    return finish(comm, res);
}

CFX_API cfxResult_t cfxBcast(void *buff, size_t count, cfxDataType_t datatype, int root,
                             cfxComm_t comm, cfxStream_t stream)
{
    return cfxBroadcast(buff, buff, count, datatype, root, comm, stream);
}

CFX_API cfxResult_t cfxReduce(const void *sendbuff, void *recvbuff, size_t count,
                              cfxDataType_t datatype, cfxRedOp_t op, int root, cfxComm_t comm,
                              cfxStream_t stream)
{
    const char *fn = "cfxReduce";
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(check_common(comm, datatype, stream, sendbuff, recvbuff, fn), res, out);
    struct cfx_core_redop red;
    CFX_CHECK_GOTO(cfx_core_redop_resolve(comm, op, datatype, fn, &red), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_root(comm, root, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_count(count, datatype, 1, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_buffer(sendbuff, count, fn, "sendbuff"), res, out);
    if (comm->rank == root) {
        CFX_CHECK_GOTO(cfx_argcheck_buffer(recvbuff, count, fn, "recvbuff (on the root)"), res,
                       out);
        size_t bytes = count * cfx_type_size(datatype);
        CFX_CHECK_GOTO(check_overlap(sendbuff, bytes, recvbuff, bytes, recvbuff, fn), res, out);
    }
    struct cfx_op o;
    op_start_reduce(&o, CFX_COLL_REDUCE, sendbuff, comm->rank == root ? recvbuff : NULL, count,
                    datatype, &red, root);
    res = submit(comm, &o);
out:
    return finish(comm, res);
}

CFX_API cfxResult_t cfxAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                 cfxDataType_t datatype, cfxComm_t comm, cfxStream_t stream)
{
    const char *fn = "cfxAllGather";
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(check_common(comm, datatype, stream, sendbuff, recvbuff, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_count(sendcount, datatype, (size_t)comm->nranks, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_buffer(sendbuff, sendcount, fn, "sendbuff"), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_buffer(recvbuff, sendcount, fn, "recvbuff"), res, out);
    size_t block = sendcount * cfx_type_size(datatype);
    const char *in_place = recvbuff ? (const char *)recvbuff + (size_t)comm->rank * block : NULL;
    CFX_CHECK_GOTO(
        check_overlap(sendbuff, block, recvbuff, block * (size_t)comm->nranks, in_place, fn), res,
        out);
    struct cfx_op o;
    op_start(&o, CFX_COLL_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, cfxSum, 0);
    res = submit(comm, &o);
out:
    return finish(comm, res);
}

CFX_API cfxResult_t cfxReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                     cfxDataType_t datatype, cfxRedOp_t op, cfxComm_t comm,
                                     cfxStream_t stream)
{
    const char *fn = "cfxReduceScatter";
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(check_common(comm, datatype, stream, sendbuff, recvbuff, fn), res, out);
    struct cfx_core_redop red;
    CFX_CHECK_GOTO(cfx_core_redop_resolve(comm, op, datatype, fn, &red), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_count(recvcount, datatype, (size_t)comm->nranks, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_buffer(sendbuff, recvcount, fn, "sendbuff"), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_buffer(recvbuff, recvcount, fn, "recvbuff"), res, out);
    size_t block = recvcount * cfx_type_size(datatype);
    /* In place: recvbuff == sendbuff + rank*recvcount. */
    if (sendbuff != NULL && recvbuff != (const char *)sendbuff + (size_t)comm->rank * block)
        CFX_CHECK_GOTO(
            check_overlap(sendbuff, block * (size_t)comm->nranks, recvbuff, block, NULL, fn), res,
            out);
    struct cfx_op o;
    op_start_reduce(&o, CFX_COLL_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, &red, 0);
    res = submit(comm, &o);
out:
    return finish(comm, res);
}

static cfxResult_t point_to_point(enum cfx_coll_kind kind, const void *sendbuff, void *recvbuff,
                                  size_t count, cfxDataType_t datatype, int peer, cfxComm_t comm,
                                  cfxStream_t stream, const char *fn)
{
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(check_common(comm, datatype, stream, sendbuff, recvbuff, fn), res, out);
    if (peer < 0 || peer >= comm->nranks) {
        res = cfx_error_set(cfxInvalidArgument, CFX_LOG_P2P,
                            "%s: peer = %d is out of range [0, %d)", fn, peer, comm->nranks);
        goto out;
    }
    if (peer == comm->rank && !cfx_core_group_active()) {
        res = cfx_error_set(cfxInvalidUsage, CFX_LOG_P2P,
                            "%s: rank %d's %s itself (%zu elements) outside a group could never "
                            "complete; a send or receive to this rank itself must be inside a "
                            "group with its match",
                            fn, peer, kind == CFX_COLL_SEND ? "send to" : "receive from", count);
        goto out;
    }
    CFX_CHECK_GOTO(cfx_argcheck_count(count, datatype, 1, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_buffer(kind == CFX_COLL_SEND ? sendbuff : recvbuff, count, fn,
                                       kind == CFX_COLL_SEND ? "sendbuff" : "recvbuff"),
                   res, out);
    struct cfx_op o;
    op_start(&o, kind, sendbuff, recvbuff, count, datatype, cfxSum, peer);
    res = submit(comm, &o);
out:
    return finish(comm, res);
}

CFX_API cfxResult_t cfxSend(const void *sendbuff, size_t count, cfxDataType_t datatype, int peer,
                            cfxComm_t comm, cfxStream_t stream)
{
    return point_to_point(CFX_COLL_SEND, sendbuff, NULL, count, datatype, peer, comm, stream,
                          "cfxSend");
}

CFX_API cfxResult_t cfxRecv(void *recvbuff, size_t count, cfxDataType_t datatype, int peer,
                            cfxComm_t comm, cfxStream_t stream)
{
    return point_to_point(CFX_COLL_RECV, NULL, recvbuff, count, datatype, peer, comm, stream,
                          "cfxRecv");
}

/* ------------------------------------------ alltoall, gather, scatter */

/* One send or receive of an alltoall, gather or scatter: a point-to-point
 * operation whose fingerprint names the collective (@p kind, @p root), so
 * that a peer in another call, or the same call with another count, type or
 * root, fails the receive with a sentence. */
static void batch_op(struct cfxComm *comm, struct cfx_op *o, enum cfx_coll_kind p2p_kind,
                     enum cfx_coll_kind kind, const void *sendbuff, void *recvbuff, size_t count,
                     cfxDataType_t type, int peer, int root)
{
    op_start(o, p2p_kind, sendbuff, recvbuff, count, type, cfxSum, peer);
    op_bind(comm, o);
    fingerprint(comm, o);
    o->print.kind = o->expect.kind = (uint8_t)kind;
    o->print.root = o->expect.root = root;
}

/* Run (or queue, inside a group) this rank's part of an alltoall, gather or
 * scatter: a send and a receive per peer as the collective needs them, all
 * at once, so every peer connection carries its block together; the rank's
 * own block is copied here, at the call (inside a group too). The caller
 * checked the arguments; @p root is -1 for alltoall. */
static cfxResult_t submit_batch(struct cfxComm *comm, enum cfx_coll_kind kind, const void *sendbuff,
                                void *recvbuff, size_t count, cfxDataType_t type, int root)
{
    if (comm->async_error != cfxSuccess)
        return broken(comm, kind);
    int rank = comm->rank, nranks = comm->nranks;
    if (comm->batch_ops == NULL && nranks > 1) {
        /* First use, as a first use connects: later calls reuse it. */
        comm->batch_ops = calloc(2 * (size_t)nranks, sizeof(*comm->batch_ops));
        if (comm->batch_ops == NULL)
            return cfx_error_set(cfxSystemError, CFX_LOG_COLL,
                                 "%s: out of memory for the %d sends and receives of a call",
                                 cfx_coll_name(kind), 2 * nranks);
    }
    size_t block = count * cfx_type_size(type);
    const char *send = sendbuff;
    char *recv = recvbuff;
    const char *own_from = NULL;
    char *own_to = NULL;
    struct cfx_op *ops = comm->batch_ops;
    int n = 0;
    for (int peer = 0; peer < nranks; peer++) {
        int sends = kind == CFX_COLL_ALLTOALL || (kind == CFX_COLL_GATHER && peer == root) ||
                    (kind == CFX_COLL_SCATTER && rank == root);
        int receives = kind == CFX_COLL_ALLTOALL || (kind == CFX_COLL_GATHER && rank == root) ||
                       (kind == CFX_COLL_SCATTER && peer == root);
        /* Offsets only into buffers this rank uses (a non-root's may be NULL). */
        const char *from = !sends || kind == CFX_COLL_GATHER ? send : send + (size_t)peer * block;
        char *to = !receives || kind == CFX_COLL_SCATTER ? recv : recv + (size_t)peer * block;
        if (peer == rank && call_mem != CFX_MEM_DEVICE) {
            /* Host memory: copied here. GPU memory: a send to itself and its
             * receive, in the kernel with the rest. */
            if (sends && receives) {
                own_from = from;
                own_to = to;
            }
            continue;
        }
        if (sends)
            batch_op(comm, &ops[n++], CFX_COLL_SEND, kind, from, NULL, count, type, peer, root);
        if (receives)
            batch_op(comm, &ops[n++], CFX_COLL_RECV, kind, NULL, to, count, type, peer, root);
    }
    if (own_to != NULL && own_to != own_from && block > 0)
        cfx_prim_copy_out(own_to, own_from, block, block);
    if (n == 0)
        return cfxSuccess;
    if (cfx_core_group_active()) {
        for (int i = 0; i < n; i++)
            CFX_CHECK(cfx_core_group_add(&ops[i]));
        return cfxSuccess;
    }
    return cfx_core_launch(ops, n); /* check_common holds the communicator. */
}

CFX_API cfxResult_t cfxAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                cfxDataType_t datatype, cfxComm_t comm, cfxStream_t stream)
{
    const char *fn = "cfxAlltoAll";
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(check_common(comm, datatype, stream, sendbuff, recvbuff, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_count(count, datatype, (size_t)comm->nranks, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_buffer(sendbuff, count, fn, "sendbuff"), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_buffer(recvbuff, count, fn, "recvbuff"), res, out);
    size_t all = count * cfx_type_size(datatype) * (size_t)comm->nranks;
    if (sendbuff != NULL && sendbuff == recvbuff && all > 0) {
        res = cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                            "%s: sendbuff == recvbuff; an alltoall cannot run in place, use "
                            "separate buffers",
                            fn);
        goto out;
    }
    CFX_CHECK_GOTO(check_overlap(sendbuff, all, recvbuff, all, NULL, fn), res, out);
    res = submit_batch(comm, CFX_COLL_ALLTOALL, sendbuff, recvbuff, count, datatype, -1);
out:
    return finish(comm, res);
}

CFX_API cfxResult_t cfxGather(const void *sendbuff, void *recvbuff, size_t count,
                              cfxDataType_t datatype, int root, cfxComm_t comm, cfxStream_t stream)
{
    const char *fn = "cfxGather";
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(check_common(comm, datatype, stream, sendbuff, recvbuff, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_root(comm, root, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_count(count, datatype, (size_t)comm->nranks, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_buffer(sendbuff, count, fn, "sendbuff"), res, out);
    if (comm->rank == root) {
        CFX_CHECK_GOTO(cfx_argcheck_buffer(recvbuff, count, fn, "recvbuff (on the root)"), res,
                       out);
        size_t block = count * cfx_type_size(datatype);
        /* In place: sendbuff == recvbuff + root*count. */
        const char *in_place = recvbuff ? (const char *)recvbuff + (size_t)root * block : NULL;
        CFX_CHECK_GOTO(
            check_overlap(sendbuff, block, recvbuff, block * (size_t)comm->nranks, in_place, fn),
            res, out);
    }
    res = submit_batch(comm, CFX_COLL_GATHER, sendbuff, comm->rank == root ? recvbuff : NULL, count,
                       datatype, root);
out:
    return finish(comm, res);
}

CFX_API cfxResult_t cfxScatter(const void *sendbuff, void *recvbuff, size_t count,
                               cfxDataType_t datatype, int root, cfxComm_t comm, cfxStream_t stream)
{
    const char *fn = "cfxScatter";
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(check_common(comm, datatype, stream, sendbuff, recvbuff, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_root(comm, root, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_count(count, datatype, (size_t)comm->nranks, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_buffer(recvbuff, count, fn, "recvbuff"), res, out);
    if (comm->rank == root) {
        CFX_CHECK_GOTO(cfx_argcheck_buffer(sendbuff, count, fn, "sendbuff (on the root)"), res,
                       out);
        size_t block = count * cfx_type_size(datatype);
        /* In place: recvbuff == sendbuff + root*count. */
        if (sendbuff != NULL && recvbuff != (const char *)sendbuff + (size_t)root * block)
            CFX_CHECK_GOTO(
                check_overlap(sendbuff, block * (size_t)comm->nranks, recvbuff, block, NULL, fn),
                res, out);
    }
    res = submit_batch(comm, CFX_COLL_SCATTER, comm->rank == root ? sendbuff : NULL, recvbuff,
                       count, datatype, root);
out:
    return finish(comm, res);
}
