/* Argument checks: see argcheck.h. */
#include "src/core/argcheck.h"

#include <stdint.h>

#include "kernels/reduce.h"
#include "src/bootstrap/wire.h"
#include "src/core/comm.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"

cfxResult_t cfx_argcheck_ptr(const void *ptr, const char *fn, const char *arg)
{
    if (ptr == NULL)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT, "%s: %s is NULL", fn, arg);
    return cfxSuccess;
}

cfxResult_t cfx_argcheck_comm(const struct cfxComm *comm, const char *fn)
{
    if (comm == NULL)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT, "%s: comm is NULL", fn);
    if (!cfx_core_comm_live(comm))
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: comm is not a live communicator (destroyed, or never created)",
                             fn);
    return cfxSuccess;
}

cfxResult_t cfx_argcheck_comm_usable(const struct cfxComm *comm, const char *fn)
{
    cfxResult_t res = cfx_argcheck_comm(comm, fn);
    if (res != cfxSuccess)
        return res;
    if (comm->finalized)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_INIT,
                             "%s: the communicator was finalized; only cfxCommDestroy may follow",
                             fn);
    return cfxSuccess;
}

cfxResult_t cfx_argcheck_nranks_rank(int nranks, int rank, const char *fn)
{
    if (nranks < 1 || nranks > CFX_BOOTSTRAP_MAX_RANKS)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: nranks = %d is out of range [1, %d]", fn, nranks,
                             CFX_BOOTSTRAP_MAX_RANKS);
    if (rank < 0 || rank >= nranks)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: rank = %d is out of range [0, %d)", fn, rank, nranks);
    return cfxSuccess;
}

cfxResult_t cfx_argcheck_type(cfxDataType_t type, const char *fn)
{
    if ((int)type < 0 || type >= cfxNumTypes)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                             "%s: datatype %d is not a cfxDataType_t (0..%d)", fn, (int)type,
                             cfxNumTypes - 1);
    return cfxSuccess;
}

cfxResult_t cfx_argcheck_op(cfxRedOp_t op, const char *fn)
{
    if ((int)op < 0 || op >= cfxNumOps)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                             "%s: op %d is not a cfxRedOp_t (0..%d)", fn, (int)op, cfxNumOps - 1);
    return cfxSuccess;
}

cfxResult_t cfx_argcheck_root(const struct cfxComm *comm, int root, const char *fn)
{
    if (root < 0 || root >= comm->nranks)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                             "%s: root = %d is out of range [0, %d)", fn, root, comm->nranks);
    return cfxSuccess;
}

cfxResult_t cfx_argcheck_count(size_t count, cfxDataType_t type, size_t multiple, const char *fn)
{
    size_t elem = cfx_type_size(type);
    if (multiple == 0)
        multiple = 1;
    size_t bytes; /* Overflow checks without divisions (this runs on every call). */
    if (elem == 0 || __builtin_mul_overflow(count, elem, &bytes) ||
        __builtin_mul_overflow(bytes, multiple, &bytes) || bytes > PTRDIFF_MAX)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                             "%s: count = %zu elements of %zu bytes (x%zu) overflows the address "
                             "space",
                             fn, count, elem, multiple);
    return cfxSuccess;
}

cfxResult_t cfx_argcheck_buffer(const void *buf, size_t count, const char *fn, const char *arg)
{
    if (buf == NULL && count > 0)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL, "%s: %s is NULL but count is %zu",
                             fn, arg, count);
    return cfxSuccess;
}

static int undef_or_range(int value, int lo, int hi)
{
    return value == CFX_CONFIG_UNDEF_INT || (value >= lo && value <= hi);
}

cfxResult_t cfx_argcheck_config(const cfxConfig_t *config, const char *fn)
{
    if (config == NULL)
        return cfxSuccess;
    if (config->magic != 0xcafebeef || config->size < offsetof(cfxConfig_t, blocking))
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: config was not initialised with CFX_CONFIG_INITIALIZER "
                             "(magic 0x%x, size %zu)",
                             fn, config->magic, config->size);
    if (config->size > sizeof(cfxConfig_t))
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: config is %zu bytes, larger than this library knows (%zu); "
                             "the program was built against a newer conflux.h",
                             fn, config->size, sizeof(cfxConfig_t));
    if (!undef_or_range(config->blocking, 0, 1))
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: config->blocking = %d; use 0 or 1", fn, config->blocking);
    if (!undef_or_range(config->splitShare, 0, 1))
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: config->splitShare = %d; use 0 or 1", fn, config->splitShare);
    if (!undef_or_range(config->minCTAs, 1, 1024) || !undef_or_range(config->maxCTAs, 1, 1024) ||
        (config->minCTAs != CFX_CONFIG_UNDEF_INT && config->maxCTAs != CFX_CONFIG_UNDEF_INT &&
         config->minCTAs > config->maxCTAs))
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: config->minCTAs = %d, maxCTAs = %d; need 1 <= min <= max <= 1024",
                             fn, config->minCTAs, config->maxCTAs);
    /* A caller built against an older conflux.h has no timeout field. */
    if (config->size >= offsetof(cfxConfig_t, timeout) + sizeof(int) &&
        !undef_or_range(config->timeout, 0, CFX_PARAM_SECONDS_MAX))
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: config->timeout = %d; use seconds, 0 (wait forever) to %d", fn,
                             config->timeout, CFX_PARAM_SECONDS_MAX);
    return cfxSuccess;
}
