/*
 * The executor interface: what runs a batch of operations' schedules. The
 * core (src/core/group.c) picks one executor per batch by the memory its
 * buffers live in (enum cfx_mem_kind, src/coll/op.h) and hands it the
 * prepared operations; the executor drives their schedules (src/coll) until
 * they are done. Layers: core -> exec -> coll -> conn: an executor calls
 * the schedules, never the core; the core never calls a schedule's steps.
 *
 * An executor is a `static const struct cfx_executor`, version first, ops
 * append-only: the host executor (src/exec/host.c: cfx_exec_host) for host
 * memory, the CUDA executor (src/exec/cuda.h: cfx_exec_cuda, a kernel that
 * runs the same schedules on the caller's stream) for device memory.
 *
 * A launch may end before its operations do (a kernel queued on a stream):
 * launch answers cfxInProgress, and the caller then calls test until it
 * answers anything else, or wait once. Every result other than cfxInProgress
 * is final: the batch is over, every op's `done` is set and its `result`
 * says how it ended, and the executor holds nothing of the batch any more.
 */
#ifndef CFX_EXEC_EXEC_H
#define CFX_EXEC_EXEC_H

#include <stdint.h>

#include "src/coll/op.h"

#define CFX_EXEC_VERSION 1

/* One launch: the operations, where they run, and the executor's state.
 * The caller fills the first part (cfx_exec_batch_init) and keeps the batch
 * and its ops in place until a final result; the rest is the executor's. */
struct cfx_exec_batch {
    struct cfx_op *ops;
    int n_ops;
    cfxStream_t stream; /* NULL: the launch completes before it returns. */
    int aborted;        /* Set by abort from any thread (atomic). */
    /* Set by an executor whose launch put the batch on streams: the ops
     * now run there (the stream observes them), and the caller neither
     * tests nor waits for them. */
    int enqueued;
    /* The host executor's waiting state (idle rounds, last progress). */
    uint64_t idle;
    int64_t last_progress_ns; /* 0: progress in the last round. */
    int64_t timeout_s;        /* CFX_TIMEOUT, read at the first idle check (-1: not yet). */
};

struct cfx_executor {
    int version; /* CFX_EXEC_VERSION. Must be first. */
    const char *name;

    /* Start the batch's operations, prepared by cfx_coll_prepare (claims
     * are the executor's). May run them to completion: with a NULL stream
     * the host executor does, and returns a final result. Returns
     * cfxSuccess (all done), cfxInProgress (call test or wait), or the
     * first failure (a sentence is set; each op's result says which
     * failed). Never allocates. */
    cfxResult_t (*launch)(const struct cfx_executor *exec, struct cfx_exec_batch *batch);

    /* Make what progress can be made now, without blocking. Returns
     * cfxInProgress while some op is not done, else a final result as
     * launch does. Also ends the batch with cfxTimeout after CFX_TIMEOUT
     * without progress, and with cfxRemoteError once aborted. Call only
     * after cfxInProgress. */
    cfxResult_t (*test)(const struct cfx_executor *exec, struct cfx_exec_batch *batch);

    /* Block until the batch is over (or CFX_TIMEOUT, or an abort, or a
     * failed peer): never returns cfxInProgress. Call only after
     * cfxInProgress. */
    cfxResult_t (*wait)(const struct cfx_executor *exec, struct cfx_exec_batch *batch);

    /* Ask a running batch to end: safe from any thread, does not block, and
     * may come before or during test/wait (the batch must not have been
     * reinitialised). The next test, or the waiting wait at its next idle
     * check, ends a batch that is not over with cfxRemoteError ("... was
     * aborted"); a batch that finishes first keeps its result. */
    void (*abort)(const struct cfx_executor *exec, struct cfx_exec_batch *batch);
};

/* Fill @p batch for a launch of ops[0..n_ops) on @p stream. */
static inline void cfx_exec_batch_init(struct cfx_exec_batch *batch, struct cfx_op *ops, int n_ops,
                                       cfxStream_t stream)
{
    batch->ops = ops;
    batch->n_ops = n_ops;
    batch->stream = stream;
    batch->aborted = 0;
    batch->enqueued = 0;
    batch->idle = 0;
    batch->last_progress_ns = 0;
    batch->timeout_s = -1;
}

/* The host executor: host memory, on the calling thread (src/exec/host.c). */
extern const struct cfx_executor cfx_exec_host;

#endif /* CFX_EXEC_EXEC_H */
