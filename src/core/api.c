/* Small API entry points: version, ids, queries, errors. */
#include <sched.h>
#include <stdio.h>

#include "cfx_build_config.h"
#include "kernels/reduce.h"
#include "src/core/argcheck.h"
#include "src/core/comm.h"
#include "src/core/probe.h"
#include "src/exec/cuda.h"
#include "src/util/check.h"
#include "src/util/log.h"
#include "src/util/param.h"

void cfx_core_api_enter(cfxComm_t comm)
{
    cfx_error_thread_clear();
    if (comm != NULL && cfx_core_comm_live(comm))
        cfx_log_set_rank(comm->rank);
}

cfxResult_t cfx_core_api_exit(cfxComm_t comm, cfxResult_t res)
{
    if (res != cfxSuccess && comm != NULL && cfx_core_comm_live(comm)) {
        const char *sentence = cfx_error_thread_last();
        snprintf(comm->last_error, sizeof(comm->last_error), "%s",
                 sentence[0] ? sentence : cfxGetErrorString(res));
    }
    return res;
}

cfxResult_t cfx_core_claim_refused(struct cfxComm *comm, int state, const char *fn)
{
    if (state == CFX_COMM_CLOSED)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: comm is not a live communicator (destroyed, or being destroyed "
                             "by another thread)",
                             fn);
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_INIT,
                         "%s: another thread is in a call on comm %p (rank %d); one call at a "
                         "time per communicator: serialize the threads, or give each its own "
                         "communicator (cfxCommSplit)",
                         fn, (void *)comm, comm->rank);
}

cfxResult_t cfx_core_claim_slow(struct cfxComm *comm, int state, const char *fn)
{
    while (state == CFX_COMM_INSPECTED || state == CFX_COMM_IDLE) {
        if (state == CFX_COMM_INSPECTED)
            sched_yield(); /* An inspector holds it for a moment. */
        state = CFX_COMM_IDLE;
        if (__atomic_compare_exchange_n(&comm->active_calls, &state, CFX_COMM_IN_CALL, 0,
                                        __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return cfxSuccess;
    }
    return cfx_core_claim_refused(comm, state, fn);
}

void cfx_core_print_version(void)
{
    if (cfx_log_level_value < 0)
        cfx_log_init();
    if (cfx_log_level_value >= CFX_LOG_VERSION)
        cfx_log(CFX_LOG_VERSION, CFX_LOG_INIT, __FILE__, __LINE__,
                "Conflux version %d.%d.%d%s (cuda %s, verbs %s, hwloc %s, host reductions %s)",
                CFX_MAJOR, CFX_MINOR, CFX_PATCH, CFX_SUFFIX, CFX_HAVE_CUDA ? "on" : "off",
                CFX_HAVE_VERBS ? "on" : "off", CFX_HAVE_HWLOC ? "on" : "off",
                cfx_reduce_isa_name(cfx_reduce_isa_selected()));
}

CFX_API cfxResult_t cfxGetVersion(int *version)
{
    cfx_core_api_enter(NULL);
    cfxResult_t res = cfx_argcheck_ptr(version, "cfxGetVersion", "version");
    if (res == cfxSuccess)
        *version = CFX_VERSION_CODE;
    return cfx_core_api_exit(NULL, res);
}

CFX_API cfxResult_t cfxGetUniqueId(cfxUniqueId *uniqueId)
{
    cfx_core_api_enter(NULL);
    cfxResult_t res = cfx_argcheck_ptr(uniqueId, "cfxGetUniqueId", "uniqueId");
    if (res == cfxSuccess)
        res = cfx_param_check_all();
    if (res == cfxSuccess) {
        cfx_core_print_version();
        res = cfx_bootstrap_id_create(uniqueId, 0);
    }
    return cfx_core_api_exit(NULL, res);
}

/* Shared shape of the simple queries: check, then read one int. */
static cfxResult_t query_int(const struct cfxComm *comm, int *out, const char *fn, int value_kind)
{
    cfx_core_api_enter((cfxComm_t)comm);
    cfxResult_t res = cfx_argcheck_comm(comm, fn);
    if (res == cfxSuccess)
        res = cfx_argcheck_ptr(out, fn, "output pointer");
    if (res == cfxSuccess)
        *out = value_kind == 0 ? comm->nranks : value_kind == 1 ? comm->cuda_dev : comm->rank;
    return cfx_core_api_exit((cfxComm_t)comm, res);
}

CFX_API cfxResult_t cfxCommCount(const cfxComm_t comm, int *count)
{
    return query_int(comm, count, "cfxCommCount", 0);
}

CFX_API cfxResult_t cfxCommCuDevice(const cfxComm_t comm, int *device)
{
    return query_int(comm, device, "cfxCommCuDevice", 1);
}

CFX_API cfxResult_t cfxCommUserRank(const cfxComm_t comm, int *rank)
{
    return query_int(comm, rank, "cfxCommUserRank", 2);
}

CFX_API cfxResult_t cfxCommGetAsyncError(cfxComm_t comm, cfxResult_t *asyncError)
{
    const char *fn = "cfxCommGetAsyncError";
    cfx_core_api_enter(comm);
    cfxResult_t res = cfx_argcheck_comm(comm, fn);
    if (res == cfxSuccess)
        res = cfx_argcheck_ptr(asyncError, fn, "asyncError");
    /* Not only what this rank's calls hit: a mismatch its finished calls
     * could not see at return (probe.c). */
    if (res == cfxSuccess && comm->cuda != NULL) {
        /* A GPU rank's work on streams: what the CUDA watcher found (when no
         * other thread holds the communicator; its call surfaces it). */
        if (cfx_core_inspect(comm)) {
            cfx_core_gpu_reap(comm);
            cfx_core_gpu_surface(comm);
            cfx_core_release(comm);
        }
        cfx_error_thread_clear(); /* A failure is the comm's (last_error), not this call's. */
    }
    /* The FIFOs of a GPU rank whose kernels still run are theirs. */
    if (res == cfxSuccess)
        *asyncError = comm->cuda != NULL && cfx_exec_cuda_comm_busy(comm->cuda)
                          ? comm->async_error
                          : cfx_core_probe_async(comm);
    return cfx_core_api_exit(comm, res);
}

CFX_API const char *cfxGetErrorString(cfxResult_t result)
{
    return cfx_error_result_string(result);
}

CFX_API const char *cfxGetLastError(cfxComm_t comm)
{
    if (comm == NULL)
        return cfx_error_process_last();
    if (!cfx_core_comm_live(comm))
        return "cfxGetLastError: comm is not a live communicator";
    return comm->last_error;
}
