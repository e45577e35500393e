/*
 * Where NCCL's ABI and Conflux's meet: the assertions that the values passed
 * unchanged really are equal, the translation of results and configs, and
 * the drop-in's own last-error sentence.
 */
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "bindings/nccl/shim.h"

/* Passed unchanged: the same bytes, the same values. */
static_assert(sizeof(ncclUniqueId) == 128 && sizeof(cfxUniqueId) == sizeof(ncclUniqueId),
              "ncclUniqueId is 128 bytes, as cfxUniqueId");
static_assert(sizeof(ncclRedOp_t) == sizeof(cfxRedOp_t) && sizeof(ncclRedOp_t) == 4,
              "ncclRedOp_t is an int-sized enum, as cfxRedOp_t");
static_assert(sizeof(ncclDataType_t) == sizeof(cfxDataType_t), "ncclDataType_t size");
static_assert(sizeof(ncclResult_t) == sizeof(cfxResult_t), "ncclResult_t size");
static_assert(ncclSum == (int)cfxSum && ncclProd == (int)cfxProd && ncclMax == (int)cfxMax &&
                  ncclMin == (int)cfxMin && ncclAvg == (int)cfxAvg &&
                  ncclNumOps == (int)cfxNumOps && ncclMaxRedOp == (int)cfxMaxRedOp,
              "reduction ops (and the first dynamic PreMulSum op) have NCCL's values in Conflux");
static_assert(ncclInt8 == (int)cfxInt8 && ncclUint8 == (int)cfxUint8 &&
                  ncclInt32 == (int)cfxInt32 && ncclUint32 == (int)cfxUint32 &&
                  ncclInt64 == (int)cfxInt64 && ncclUint64 == (int)cfxUint64 &&
                  ncclFloat16 == (int)cfxFloat16 && ncclFloat32 == (int)cfxFloat32 &&
                  ncclFloat64 == (int)cfxFloat64 && ncclBfloat16 == (int)cfxBfloat16 &&
                  ncclFloat8e4m3 == (int)cfxFloat8e4m3 && ncclFloat8e5m2 == (int)cfxFloat8e5m2 &&
                  ncclNumTypes == (int)cfxNumTypes,
              "data types have NCCL's values in Conflux");
static_assert(ncclScalarDevice == (int)cfxScalarDevice &&
                  ncclScalarHostImmediate == (int)cfxScalarHostImmediate,
              "scalar residences have NCCL's values in Conflux");
static_assert(NCCL_CONFIG_UNDEF_INT == CFX_CONFIG_UNDEF_INT, "'unset' config ints agree");
static_assert(NCCL_SHRINK_DEFAULT == CFX_SHRINK_DEFAULT && NCCL_SHRINK_ABORT == CFX_SHRINK_ABORT &&
                  NCCL_REVOKE_DEFAULT == CFX_REVOKE_DEFAULT,
              "shrink and revoke flags have NCCL's values");

/* ncclConfig_v22800 as NCCL 2.28 lays it out (LP64). Translated field by
 * field: cfxConfig_t orders its fields differently. */
static_assert(sizeof(ncclConfig_t) == 80, "ncclConfig_t is 80 bytes");
static_assert(
    offsetof(ncclConfig_t, size) == 0 && offsetof(ncclConfig_t, magic) == 8 &&
        offsetof(ncclConfig_t, version) == 12 && offsetof(ncclConfig_t, blocking) == 16 &&
        offsetof(ncclConfig_t, cgaClusterSize) == 20 && offsetof(ncclConfig_t, minCTAs) == 24 &&
        offsetof(ncclConfig_t, maxCTAs) == 28 && offsetof(ncclConfig_t, netName) == 32 &&
        offsetof(ncclConfig_t, splitShare) == 40 && offsetof(ncclConfig_t, trafficClass) == 44 &&
        offsetof(ncclConfig_t, commName) == 48 && offsetof(ncclConfig_t, collnetEnable) == 56 &&
        offsetof(ncclConfig_t, CTAPolicy) == 60 && offsetof(ncclConfig_t, shrinkShare) == 64 &&
        offsetof(ncclConfig_t, nvlsCTAs) == 68 &&
        offsetof(ncclConfig_t, nChannelsPerNetPeer) == 72 &&
        offsetof(ncclConfig_t, nvlinkCentricSched) == 76,
    "ncclConfig_t field offsets are NCCL 2.28's");
static_assert(sizeof(ncclSimInfo_t) == 24 && offsetof(ncclSimInfo_t, estimatedTime) == 16,
              "ncclSimInfo_t layout");
static_assert(sizeof(ncclSimInfo_t) == sizeof(cfxSimInfo_t) &&
                  offsetof(ncclSimInfo_t, magic) == offsetof(cfxSimInfo_t, magic) &&
                  offsetof(ncclSimInfo_t, estimatedTime) == offsetof(cfxSimInfo_t, estimatedTime),
              "ncclSimInfo_t is cfxSimInfo_t");
static_assert(sizeof(ncclTeam_t) == 12, "ncclTeam is three ints");

/* The drop-in's last refusal on this thread. */
static _Thread_local struct {
    int set;
    ncclComm_t comm;
    char text[512];
} refusal;

ncclResult_t cfx_nccl_result_from(cfxResult_t res)
{
    if (res != cfxSuccess && res != cfxInProgress)
        refusal.set = 0;
    switch (res) {
    case cfxSuccess: return ncclSuccess;
    case cfxUnhandledCudaError: return ncclUnhandledCudaError;
    case cfxSystemError: return ncclSystemError;
    case cfxInternalError: return ncclInternalError;
    case cfxInvalidArgument: return ncclInvalidArgument;
    case cfxInvalidUsage: return ncclInvalidUsage;
    case cfxRemoteError: return ncclRemoteError;
    case cfxInProgress: return ncclInProgress;
    case cfxTimeout: return ncclRemoteError; /* A peer that never answered. */
    case cfxNumResults: break;
    }
    return ncclInternalError;
}

cfxResult_t cfx_nccl_result_to_cfx(ncclResult_t res)
{
    switch (res) {
    case ncclSuccess: return cfxSuccess;
    case ncclUnhandledCudaError: return cfxUnhandledCudaError;
    case ncclSystemError: return cfxSystemError;
    case ncclInternalError: return cfxInternalError;
    case ncclInvalidArgument: return cfxInvalidArgument;
    case ncclInvalidUsage: return cfxInvalidUsage;
    case ncclRemoteError: return cfxRemoteError;
    case ncclInProgress: return cfxInProgress;
    case ncclNumResults: break;
    }
    return cfxNumResults;
}

ncclResult_t cfx_nccl_refuse(ncclResult_t res, ncclComm_t comm, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(refusal.text, sizeof(refusal.text), fmt, ap);
    va_end(ap);
    refusal.comm = comm;
    refusal.set = 1;
    if (cfx_nccl_log_level() >= 2)
        fprintf(stderr, "conflux-nccl WARN %s\n", refusal.text);
    return res;
}

const char *cfx_nccl_refusal(ncclComm_t comm)
{
    if (refusal.set && (comm == NULL || comm == refusal.comm))
        return refusal.text;
    return NULL;
}

ncclResult_t cfx_nccl_config_to_cfx(const ncclConfig_t *config, cfxConfig_t *out,
                                    cfxConfig_t **out_p, const char *fn)
{
    if (config == NULL) {
        *out_p = NULL;
        return ncclSuccess;
    }
    if (config->magic != NCCL_CONFIG_MAGIC)
        return cfx_nccl_refuse(ncclInvalidArgument, NULL,
                               "%s: the config was not initialised with NCCL_CONFIG_INITIALIZER "
                               "(magic 0x%x, expected 0x%x)",
                               fn, config->magic, NCCL_CONFIG_MAGIC);
    if (config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
        return cfx_nccl_refuse(ncclInvalidArgument, NULL,
                               "%s: config->size = %zu is too small for any ncclConfig_t", fn,
                               config->size);
    /* An older nccl.h's config is a prefix: the fields it lacks stay unset. */
    ncclConfig_t full = {
        .blocking = NCCL_CONFIG_UNDEF_INT,
        .cgaClusterSize = NCCL_CONFIG_UNDEF_INT,
        .minCTAs = NCCL_CONFIG_UNDEF_INT,
        .maxCTAs = NCCL_CONFIG_UNDEF_INT,
        .netName = NCCL_CONFIG_UNDEF_PTR,
        .splitShare = NCCL_CONFIG_UNDEF_INT,
        .commName = NCCL_CONFIG_UNDEF_PTR,
    };
    memcpy(&full, config, config->size < sizeof(full) ? config->size : sizeof(full));
    /* The rest (cgaClusterSize, trafficClass, collnetEnable, CTAPolicy,
     * shrinkShare, nvlsCTAs, nChannelsPerNetPeer, nvlinkCentricSched) are
     * hints for NCCL's GPU kernels and fabrics that Conflux has no use for. */
    *out = (cfxConfig_t)CFX_CONFIG_INITIALIZER;
    out->blocking = full.blocking;
    out->commName = full.commName;
    out->splitShare = full.splitShare;
    out->minCTAs = full.minCTAs;
    out->maxCTAs = full.maxCTAs;
    out->netName = full.netName;
    *out_p = out;
    return ncclSuccess;
}
