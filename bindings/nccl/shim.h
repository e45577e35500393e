/*
 * The drop-in's internals shared by its files: translation between NCCL's
 * ABI (nccl_abi.h) and Conflux's (conflux.h), the drop-in's own last-error
 * sentence, and the environment mapping.
 *
 * Rules: every exported function is defined as pnccl<Name> with CFX_NCCL_API
 * and given its weak ncclName alias with CFX_NCCL_ALIAS, as NCCL does; each
 * forwards to cfx<Name> and returns through cfx_nccl_result_from.
 */
#ifndef CFX_NCCL_SHIM_H
#define CFX_NCCL_SHIM_H

#include "bindings/nccl/nccl_abi.h"
#include "conflux.h"

#define CFX_NCCL_API __attribute__((visibility("default")))

/* The weak ncclName that applications call, an alias of pncclName. */
#define CFX_NCCL_ALIAS(name)                                                                       \
    extern __typeof__(p##name) name __attribute__((weak, alias("p" #name), visibility("default")))

/* The communicator handle is the same pointer under either name. */
static inline cfxComm_t cfx_nccl_comm(ncclComm_t comm)
{
    return (cfxComm_t)(void *)comm;
}

/* Conflux's result as NCCL's (cfxTimeout, which NCCL 2.28 lacks, becomes
 * ncclRemoteError). A failure forgets the drop-in's own sentence, so that
 * ncclGetLastError reports Conflux's newer one. */
ncclResult_t cfx_nccl_result_from(cfxResult_t res);

/* NCCL's result as Conflux's (values outside NCCL's range: cfxNumResults). */
cfxResult_t cfx_nccl_result_to_cfx(ncclResult_t res);

/* Data types and ops have NCCL's values in Conflux (abi.c asserts it), so
 * they pass unchanged, dynamic PreMulSum ops included; Conflux checks them. */
static inline cfxDataType_t cfx_nccl_type(ncclDataType_t type)
{
    return (cfxDataType_t)type;
}

static inline cfxRedOp_t cfx_nccl_op(ncclRedOp_t op)
{
    return (cfxRedOp_t)op;
}

/* Fail with @p res and remember a sentence for ncclGetLastError (this thread;
 * @p comm, or NULL when none applies). Logged to stderr at CFX_DEBUG=WARN
 * and above. Returns @p res. */
ncclResult_t cfx_nccl_refuse(ncclResult_t res, ncclComm_t comm, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The drop-in's sentence for @p comm (or NULL: the thread's last), or NULL
 * when the last failure was Conflux's. */
const char *cfx_nccl_refusal(ncclComm_t comm);

/* Translate an NCCL config of any 2.x layout (a prefix of ncclConfig_t)
 * into @p out. NULL stays NULL (*out_p = NULL). On failure the sentence
 * is set and *out_p is left alone. */
ncclResult_t cfx_nccl_config_to_cfx(const ncclConfig_t *config, cfxConfig_t *out,
                                    cfxConfig_t **out_p, const char *fn);

/* Set CFX_X from NCCL_X where CFX_X is unset (or was set by an earlier call
 * of this function); @p logging_only: only the logging variables. */
void cfx_nccl_env_apply(int logging_only);

/* The Conflux log level (0 none .. 4 trace) CFX_DEBUG asks for. */
int cfx_nccl_log_level(void);

#endif /* CFX_NCCL_SHIM_H */
