/*
 * The CUDA executor (exec.h's interface for CFX_MEM_DEVICE, and what the
 * core needs besides to run communicators of GPU ranks on CUDA streams).
 *
 * Device buffers: launch enqueues, for each stream of the batch, one kernel
 * (src/exec/cuda/kernel.h: a block per operation) on that stream and
 * returns; the stream observes completion. Operations of several
 * communicators (ranks one thread drives in a group) on one stream share
 * the launch; one communicator's operations in one batch use one stream.
 *
 * Order: the work of one communicator runs in the order it was enqueued,
 * whatever the streams: a launch on a stream other than the communicator's
 * previous one first waits for the previous one's event (except while the
 * stream captures a graph: a captured launch is ordered by the graph).
 * Host buffers on a stream (cfx_exec_cuda_host_enqueue) run on the host
 * executor when the stream reaches them (cuLaunchHostFunc), ordered the
 * same way; host buffers with a NULL stream run at once, after
 * cfx_exec_cuda_comm_quiesce.
 *
 * Failures are asynchronous: a kernel that fails (a mismatch, a closed
 * connector), or whose blocks make no progress for the communicator's
 * timeout while they run, is found by the process's watcher thread, which
 * stops the communicator's kernels (its abort word), records the failure
 * with a sentence naming the peer, and calls the communicator's `failed`
 * hook so the core can tell the peers. The core surfaces the failure at the
 * next call (cfx_exec_cuda_comm_failure).
 */
#ifndef CFX_EXEC_CUDA_H
#define CFX_EXEC_CUDA_H

#include <stdint.h>

#include "src/exec/exec.h"

struct cfx_cuda_comm;

/* Most GPU operations one kernel launch carries (its far arguments;
 * src/exec/cuda/kernel.h). */
#define CFX_EXEC_CUDA_MAX_OPS 255
/* Most GPU operations on one stream in a batch, of one communicator or of
 * several: more than one launch carries (or than a captured one does) go
 * in several launches one after the other, in an order every rank takes
 * alike (src/exec/cuda/cuda.c, "Groups of several launches"). */
#define CFX_EXEC_CUDA_MAX_GROUP_OPS 4096

/* What a communicator's CUDA state is made from. */
struct cfx_cuda_comm_desc {
    int device;
    int rank;
    /* GPU ranks of this process on this device (this one included): the
     * device's blocks are shared among their kernels, which run at once. */
    int ranks_on_device;
    int64_t timeout_s; /* A running kernel's longest time without progress; 0: forever. */
    const char *timeout_name;
    void *owner;                 /* Handed to the hooks. */
    void (*failed)(void *owner); /* Watcher thread, once, after a failure is recorded. */
    /* Watcher thread, every 100 ms that a running kernel of the
     * communicator makes no progress: whether its peers are all right (a
     * peer process that died, a connector a peer poisoned). cfxSuccess, or
     * the failure with its sentence and *blame_p, which the watcher records.
     * Must not block. */
    cfxResult_t (*stalled)(void *owner, int *blame_p);
};

/* Make @p desc's communicator's CUDA state: the kernel loaded on its device
 * (once per process and device), its host-mapped abort word and reports,
 * its event; registers it with the watcher. Setup time only. */
cfxResult_t cfx_exec_cuda_comm_open(const struct cfx_cuda_comm_desc *desc,
                                    struct cfx_cuda_comm **state_p);

/* Wait for the communicator's enqueued work, then free everything (accepts
 * NULL). After cfx_exec_cuda_comm_abort the wait ends as soon as the
 * kernels see their abort word. */
void cfx_exec_cuda_comm_close(struct cfx_cuda_comm *state);

/* Block until every piece of work enqueued on the communicator has run
 * (before host work on the NULL stream touches its connectors). A failure
 * recorded meanwhile is returned as cfx_exec_cuda_comm_failure does. */
cfxResult_t cfx_exec_cuda_comm_quiesce(struct cfx_cuda_comm *state);

/* Whether work enqueued on the communicator may still be pending (never
 * blocks, changes nothing: any thread; a captured graph's replays are not
 * counted). */
int cfx_exec_cuda_comm_busy(struct cfx_cuda_comm *state);

/* The communicator's recorded asynchronous failure: cfxSuccess, or its
 * result with this thread's sentence set to it, *blame_p the rank it came
 * through (the peer, or this rank when it began here) and *print_p the
 * operation's fingerprint. */
cfxResult_t cfx_exec_cuda_comm_failure(struct cfx_cuda_comm *state, int *blame_p,
                                       struct cfx_fingerprint *print_p);

/* Record a failure found outside a kernel (a host batch a stream ran) as the
 * watcher records a kernel's: @p res and @p text (copied), about @p blame,
 * in the operation @p print; stops the kernels, calls the failed hook. The
 * first failure stays. Any thread. */
void cfx_exec_cuda_comm_fail(struct cfx_cuda_comm *state, cfxResult_t res, int blame,
                             const struct cfx_fingerprint *print, const char *text);

/* Record now a failure the communicator's blocks reported that the watcher
 * has not read yet (and call the failed hook), as the watcher would: for a
 * caller that found the communicator's work over and is about to settle it
 * as done. Any thread; does not wait for the GPU. */
void cfx_exec_cuda_comm_scan(struct cfx_cuda_comm *state);

/* Stop the communicator's kernels (cfxCommAbort, revoke, a failure the core
 * learnt of): they end at their next check of the abort word. Any thread,
 * never blocks. */
void cfx_exec_cuda_comm_abort(struct cfx_cuda_comm *state, int broken);

/* Run @p ops (host buffers, prepared and connected; copied here) on the
 * host executor when @p stream reaches them, then on_done(ops, n_ops, result)
 * on the thread that ran them (this process's host-batch thread, or with a
 * driver without cuStreamWaitValue32 the stream's callback thread: either
 * way it must not call CUDA); the stream's later work waits until then.
 * Every communicator of the ops must have CUDA state (op->exec_state).
 * Waits for a free slot when CFX_CUDA_HOST_BATCHES batches are pending. */
cfxResult_t cfx_exec_cuda_host_enqueue(cfxStream_t stream, const struct cfx_op *ops, int n_ops,
                                       void (*on_done)(struct cfx_op *ops, int n_ops,
                                                       cfxResult_t res));

/* Whether @p stream is capturing a graph (1), not (0); cfxUnhandledCudaError
 * with a sentence when the driver cannot say. */
cfxResult_t cfx_exec_cuda_stream_capturing(cfxStream_t stream, int *capturing_p);

/* Device buffers on streams (exec.h). launch: one kernel per stream of the
 * batch, enqueued; sets batch->enqueued and returns cfxSuccess, or fails
 * before anything is enqueued. */
extern const struct cfx_executor cfx_exec_cuda;

#endif /* CFX_EXEC_CUDA_H */
