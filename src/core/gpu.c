/*
 * GPU ranks in the core: the checks and state a communicator of GPU ranks
 * needs beside the host path (see comm.h: cfx_core_gpu_*). The executor
 * itself is src/exec/cuda.h; this file decides which ranks are GPU ranks'
 * peers on one device, and carries failures the CUDA watcher finds into
 * the communicator's error with the same machinery as the host path
 * (poison, flight recorder, blame agreement).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/blame.h"
#include "src/core/comm.h"
#include "src/core/probe.h"
#include "src/exec/cuda.h"
#include "src/util/check.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"

CFX_PARAM_INT(multi_rank_gpu_enable, "MULTI_RANK_GPU_ENABLE", 0, 0, 1,
              "1: ranks of one communicator may share a GPU (as threads or processes); each "
              "rank then needs a stream of its own");

/* Whether ranks @p a and @p b of @p comm are on one GPU. */
static int same_gpu(const struct cfxComm *comm, int a, int b)
{
    const struct cfx_peer_info *x = &comm->peers[a], *y = &comm->peers[b];
    if (x->cuda_dev < 0 || y->cuda_dev < 0 || x->host_hash != y->host_hash)
        return 0;
    if (x->busid[0] && y->busid[0])
        return strcmp(x->busid, y->busid) == 0;
    return x->cuda_dev == y->cuda_dev; /* The topology does not know the bus ids. */
}

/* Watcher thread: a failure is recorded. Tell the peers now when no call
 * holds the communicator; else the call's gpu_surface does. */
static void gpu_failed(void *owner)
{
    struct cfxComm *comm = owner;
    if (!cfx_core_inspect(comm)) {
        __atomic_store_n(&comm->gpu_poison_pending, 1, __ATOMIC_RELEASE);
        return;
    }
    int blame = comm->rank;
    struct cfx_fingerprint print;
    cfxResult_t res = cfx_exec_cuda_comm_failure(comm->cuda, &blame, &print);
    if (res != cfxSuccess)
        cfx_core_poison_all(comm, res, blame);
    cfx_core_release(comm);
}

/* Watcher thread, while a kernel of the communicator stalls: the peers'
 * health, as cfxCommGetAsyncError asks it (when no call holds it). */
static cfxResult_t gpu_stalled(void *owner, int *blame_p)
{
    struct cfxComm *comm = owner;
    if (!cfx_core_inspect(comm))
        return cfxSuccess; /* A call is in: ask again later. */
    cfxResult_t res = cfx_core_probe_connectors(comm, 1, blame_p);
    cfx_core_release(comm);
    return res;
}

/* CUDA runs kernels of different streams at once only while each stream
 * has a hardware queue of its own; a process has CUDA_DEVICE_MAX_CONNECTIONS
 * of them per device (8 unless set before CUDA initialises; 32 at most).
 * Ranks of one process on one GPU wait for each other's kernels: when their
 * streams outnumber the queues, two of them can share one, the second
 * kernel waits for the first, and the first for the second (seen with 8
 * ranks as threads on an H200). Said once per process. */
static void warn_hardware_queues(const struct cfxComm *comm, int sharing)
{
    static int warned;
    const char *env = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    long queues = env != NULL && env[0] != '\0' ? strtol(env, NULL, 10) : 8;
    if (sharing <= 1 || sharing < queues || __atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
        return;
    CFX_WARN(CFX_LOG_INIT,
             "rank %d: %d ranks of this communicator run on GPU %d in this process, and CUDA "
             "gives a process %ld hardware queues per GPU (CUDA_DEVICE_MAX_CONNECTIONS%s): "
             "their kernels can end up queued behind each other and time out; set "
             "CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA initialises (see "
             "docs/troubleshooting.md)",
             comm->rank, sharing, comm->cuda_dev, queues, env != NULL ? "" : " unset: 8");
}

cfxResult_t cfx_core_gpu_setup(struct cfxComm *comm)
{
    if (!param_multi_rank_gpu_enable())
        for (int a = 0; a < comm->nranks; a++)
            for (int b = a + 1; b < comm->nranks; b++)
                if (same_gpu(comm, a, b))
                    return cfx_error_set(cfxInvalidUsage, CFX_LOG_INIT,
                                         "ranks %d and %d of this communicator are both on GPU "
                                         "%s of host %s; one rank per GPU, unless "
                                         "CFX_MULTI_RANK_GPU_ENABLE=1 lets ranks share it",
                                         a, b,
                                         comm->peers[a].busid[0] ? comm->peers[a].busid : "(index)",
                                         comm->peers[a].host_id);
    if (comm->cuda_dev < 0)
        return cfxSuccess;
    int sharing = 1; /* Ranks of this process on this GPU, this one included. */
    for (int r = 0; r < comm->nranks; r++)
        if (r != comm->rank && comm->peers[r].pid == comm->peers[comm->rank].pid &&
            same_gpu(comm, r, comm->rank)) {
            comm->gpu_shared = 1;
            sharing++;
        }
    warn_hardware_queues(comm, sharing);
    struct cfx_cuda_comm_desc desc = {.device = comm->cuda_dev,
                                      .rank = comm->rank,
                                      .ranks_on_device = sharing,
                                      .timeout_s = comm->timeout_s,
                                      .timeout_name = comm->timeout_name,
                                      .owner = comm,
                                      .failed = gpu_failed,
                                      .stalled = gpu_stalled};
    CFX_CHECK(cfx_exec_cuda_comm_open(&desc, &comm->cuda));
    comm->gpu_unreaped = comm->flight_count;
    return cfxSuccess;
}

/* Settle the flight entries of GPU work enqueued since the last time: done,
 * or with @p failed (the failure's op fingerprint; NULL: none) that op and
 * those after it failed with @p res. */
static void settle_flight(struct cfxComm *comm, const struct cfx_fingerprint *failed,
                          cfxResult_t res)
{
    for (uint64_t i = comm->gpu_unreaped; comm->flight_size > 0 && i < comm->flight_count; i++) {
        const struct cfx_flight_entry *e = &comm->flight[i & comm->flight_mask];
        if (i + comm->flight_mask + 1 < comm->flight_count || e->state != CFX_FLIGHT_RUNNING)
            continue;
        int ok = failed == NULL || !failed->valid || e->print.seq < failed->seq;
        cfx_core_flight_update(comm, i, ok ? CFX_FLIGHT_DONE : CFX_FLIGHT_FAILED,
                               ok ? cfxSuccess : res, e->n_steps, e->n_steps);
    }
    comm->gpu_unreaped = comm->flight_count;
}

cfxResult_t cfx_core_gpu_surface(struct cfxComm *comm)
{
    if (comm->cuda == NULL || comm->async_error != cfxSuccess)
        return comm->async_error;
    int blame = comm->rank;
    struct cfx_fingerprint print;
    cfxResult_t res = cfx_exec_cuda_comm_failure(comm->cuda, &blame, &print);
    if (res == cfxSuccess)
        return cfxSuccess;
    char seen[CFX_ERROR_MAX];
    snprintf(seen, sizeof(seen), "%s", cfx_error_thread_last());
    comm->async_error = res;
    cfx_core_poison_all(comm, res, blame); /* Again is harmless: the first reason stays. */
    __atomic_store_n(&comm->gpu_poison_pending, 0, __ATOMIC_RELAXED);
    settle_flight(comm, &print, res);
    if (comm->flight_size > 0)
        cfx_core_flight_dump(comm, cfxGetErrorString(res));
    cfx_core_blame_tell(comm, res, blame);
    char op_text[160];
    cfx_coll_print_format(&print, op_text, sizeof(op_text));
    comm->async_error = cfx_core_blame_explain(comm, res, op_text, seen);
    snprintf(comm->last_error, sizeof(comm->last_error), "%s", cfx_error_thread_last());
    return comm->async_error;
}

void cfx_core_gpu_reap(struct cfxComm *comm)
{
    if (comm->cuda == NULL || comm->gpu_unreaped == comm->flight_count ||
        cfx_exec_cuda_comm_busy(comm->cuda))
        return; /* Running: gpu_surface or a later reap settles them. */
    /* Over: a failure a block reported that the watcher has not read yet
     * is recorded now, or its entry would settle as done. */
    cfx_exec_cuda_comm_scan(comm->cuda);
    if (__atomic_load_n(&comm->gpu_poison_pending, __ATOMIC_ACQUIRE) ||
        comm->async_error != cfxSuccess)
        return; /* Failed: gpu_surface settles them. */
    int blame;
    struct cfx_fingerprint print;
    if (cfx_exec_cuda_comm_failure(comm->cuda, &blame, &print) != cfxSuccess) {
        cfx_error_thread_clear(); /* gpu_surface reports it. */
        return;
    }
    settle_flight(comm, NULL, cfxSuccess);
}

#define REAP_EVERY_NS CFX_NS_PER_MS

void cfx_core_gpu_reap_soon(struct cfxComm *comm)
{
    if (comm->cuda == NULL || comm->gpu_unreaped == comm->flight_count)
        return;
    int64_t now = cfx_time_now_ns();
    uint64_t since = comm->flight_count - comm->gpu_reap_tried;
    if (now - comm->gpu_reaped_ns < REAP_EVERY_NS &&
        (comm->flight_size == 0 || since * 2 < (uint64_t)comm->flight_size))
        return;
    comm->gpu_reaped_ns = now;
    comm->gpu_reap_tried = comm->flight_count;
    cfx_core_gpu_reap(comm);
}

void cfx_core_gpu_close(struct cfxComm *comm)
{
    cfx_exec_cuda_comm_close(comm->cuda);
    comm->cuda = NULL;
}
