/*
 * The NCCL host API, each call forwarded to its Conflux twin: arguments
 * translated where the ABIs differ (results, configs), checked by Conflux,
 * results translated back. See docs/api.md, "NCCL drop-in".
 */
#include <string.h>

#include "bindings/nccl/shim.h"

/* ---------------------------------------------------------------- memory, version, ids */

CFX_NCCL_API ncclResult_t pncclMemAlloc(void **ptr, size_t size)
{
    return cfx_nccl_result_from(cfxMemAlloc(ptr, size));
}
CFX_NCCL_ALIAS(ncclMemAlloc);

CFX_NCCL_API ncclResult_t pncclMemFree(void *ptr)
{
    return cfx_nccl_result_from(cfxMemFree(ptr));
}
CFX_NCCL_ALIAS(ncclMemFree);

/* The NCCL API level implemented, not Conflux's own version. */
CFX_NCCL_API ncclResult_t pncclGetVersion(int *version)
{
    if (version == NULL)
        return cfx_nccl_refuse(ncclInvalidArgument, NULL, "ncclGetVersion: version is NULL");
    *version = CFX_NCCL_VERSION_CODE;
    return ncclSuccess;
}
CFX_NCCL_ALIAS(ncclGetVersion);

CFX_NCCL_API ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId)
{
    return cfx_nccl_result_from(cfxGetUniqueId((cfxUniqueId *)(void *)uniqueId));
}
CFX_NCCL_ALIAS(ncclGetUniqueId);

/* ---------------------------------------------------------------- communicators */

static cfxUniqueId to_cfx_id(const ncclUniqueId *id)
{
    cfxUniqueId cid;
    memcpy(&cid, id, sizeof(cid));
    return cid;
}

CFX_NCCL_API ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                                  int rank, ncclConfig_t *config)
{
    cfxConfig_t storage, *cfx_config;
    ncclResult_t res =
        cfx_nccl_config_to_cfx(config, &storage, &cfx_config, "ncclCommInitRankConfig");
    if (res != ncclSuccess)
        return res;
    return cfx_nccl_result_from(cfxCommInitRankConfig((cfxComm_t *)(void *)comm, nranks,
                                                      to_cfx_id(&commId), rank, cfx_config));
}
CFX_NCCL_ALIAS(ncclCommInitRankConfig);

CFX_NCCL_API ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                            int rank)
{
    return cfx_nccl_result_from(
        cfxCommInitRank((cfxComm_t *)(void *)comm, nranks, to_cfx_id(&commId), rank));
}
CFX_NCCL_ALIAS(ncclCommInitRank);

/* devlist NULL means host ranks in Conflux (NCCL: the first ndev GPUs). */
CFX_NCCL_API ncclResult_t pncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
    return cfx_nccl_result_from(cfxCommInitAll((cfxComm_t *)(void *)comm, ndev, devlist));
}
CFX_NCCL_ALIAS(ncclCommInitAll);

/* ncclUniqueId and cfxUniqueId are both 128 bytes of char (abi.c
 * checks), so the array is passed as it is. */
CFX_NCCL_API ncclResult_t pncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank,
                                                    int nId, ncclUniqueId *commIds,
                                                    ncclConfig_t *config)
{
    cfxConfig_t storage, *cfx_config;
    ncclResult_t res =
        cfx_nccl_config_to_cfx(config, &storage, &cfx_config, "ncclCommInitRankScalable");
    if (res != ncclSuccess)
        return res;
    return cfx_nccl_result_from(cfxCommInitRankScalable((cfxComm_t *)(void *)newcomm, nranks,
                                                        myrank, nId, (cfxUniqueId *)(void *)commIds,
                                                        cfx_config));
}
CFX_NCCL_ALIAS(ncclCommInitRankScalable);

CFX_NCCL_API ncclResult_t pncclCommFinalize(ncclComm_t comm)
{
    return cfx_nccl_result_from(cfxCommFinalize(cfx_nccl_comm(comm)));
}
CFX_NCCL_ALIAS(ncclCommFinalize);

CFX_NCCL_API ncclResult_t pncclCommDestroy(ncclComm_t comm)
{
    return cfx_nccl_result_from(cfxCommDestroy(cfx_nccl_comm(comm)));
}
CFX_NCCL_ALIAS(ncclCommDestroy);

CFX_NCCL_API ncclResult_t pncclCommAbort(ncclComm_t comm)
{
    return cfx_nccl_result_from(cfxCommAbort(cfx_nccl_comm(comm)));
}
CFX_NCCL_ALIAS(ncclCommAbort);

CFX_NCCL_API ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                         ncclConfig_t *config)
{
    cfxConfig_t storage, *cfx_config;
    ncclResult_t res = cfx_nccl_config_to_cfx(config, &storage, &cfx_config, "ncclCommSplit");
    if (res != ncclSuccess)
        return res;
    return cfx_nccl_result_from(
        cfxCommSplit(cfx_nccl_comm(comm), color, key, (cfxComm_t *)(void *)newcomm, cfx_config));
}
CFX_NCCL_ALIAS(ncclCommSplit);

/* NCCL's shrink and revoke flags have Conflux's values (static asserts in abi.c). */
CFX_NCCL_API ncclResult_t pncclCommShrink(ncclComm_t comm, int *excludeRanksList,
                                          int excludeRanksCount, ncclComm_t *newcomm,
                                          ncclConfig_t *config, int shrinkFlags)
{
    cfxConfig_t storage, *cfx_config;
    ncclResult_t res = cfx_nccl_config_to_cfx(config, &storage, &cfx_config, "ncclCommShrink");
    if (res != ncclSuccess)
        return res;
    return cfx_nccl_result_from(cfxCommShrink(cfx_nccl_comm(comm), excludeRanksList,
                                              excludeRanksCount, (cfxComm_t *)(void *)newcomm,
                                              cfx_config, shrinkFlags));
}
CFX_NCCL_ALIAS(ncclCommShrink);

CFX_NCCL_API ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    return cfx_nccl_result_from(cfxCommRevoke(cfx_nccl_comm(comm), revokeFlags));
}
CFX_NCCL_ALIAS(ncclCommRevoke);

/* ncclSimInfo_t is cfxSimInfo_t, magic included (static asserts in abi.c). */
CFX_NCCL_API ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
    return cfx_nccl_result_from(cfxGroupSimulateEnd((cfxSimInfo_t *)(void *)simInfo));
}
CFX_NCCL_ALIAS(ncclGroupSimulateEnd);

CFX_NCCL_API ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    cfxResult_t async = cfxSuccess;
    cfxResult_t res = cfxCommGetAsyncError(cfx_nccl_comm(comm), asyncError ? &async : NULL);
    if (res == cfxSuccess)
        *asyncError = cfx_nccl_result_from(async);
    return cfx_nccl_result_from(res);
}
CFX_NCCL_ALIAS(ncclCommGetAsyncError);

CFX_NCCL_API ncclResult_t pncclCommCount(const ncclComm_t comm, int *count)
{
    return cfx_nccl_result_from(cfxCommCount(cfx_nccl_comm(comm), count));
}
CFX_NCCL_ALIAS(ncclCommCount);

/* -1 for a host communicator. */
CFX_NCCL_API ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device)
{
    return cfx_nccl_result_from(cfxCommCuDevice(cfx_nccl_comm(comm), device));
}
CFX_NCCL_ALIAS(ncclCommCuDevice);

CFX_NCCL_API ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank)
{
    return cfx_nccl_result_from(cfxCommUserRank(cfx_nccl_comm(comm), rank));
}
CFX_NCCL_ALIAS(ncclCommUserRank);

CFX_NCCL_API ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
                                            void **handle)
{
    return cfx_nccl_result_from(cfxCommRegister(cfx_nccl_comm(comm), buff, size, handle));
}
CFX_NCCL_ALIAS(ncclCommRegister);

CFX_NCCL_API ncclResult_t pncclCommDeregister(const ncclComm_t comm, void *handle)
{
    return cfx_nccl_result_from(cfxCommDeregister(cfx_nccl_comm(comm), handle));
}
CFX_NCCL_ALIAS(ncclCommDeregister);

CFX_NCCL_API ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar,
                                                    ncclDataType_t datatype,
                                                    ncclScalarResidence_t residence,
                                                    ncclComm_t comm)
{
    return cfx_nccl_result_from(
        cfxRedOpCreatePreMulSum((cfxRedOp_t *)(void *)op, scalar, cfx_nccl_type(datatype),
                                (cfxScalarResidence_t)residence, cfx_nccl_comm(comm)));
}
CFX_NCCL_ALIAS(ncclRedOpCreatePreMulSum);

CFX_NCCL_API ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    return cfx_nccl_result_from(cfxRedOpDestroy(cfx_nccl_op(op), cfx_nccl_comm(comm)));
}
CFX_NCCL_ALIAS(ncclRedOpDestroy);

/* ---------------------------------------------------------------- errors */

/* NCCL's names for its codes; they point at NCCL_DEBUG, which the drop-in
 * maps to CFX_DEBUG. */
CFX_NCCL_API const char *pncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the Conflux developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclNumResults: break;
    }
    return "unknown result code";
}
CFX_NCCL_ALIAS(ncclGetErrorString);

CFX_NCCL_API const char *pncclGetLastError(ncclComm_t comm)
{
    const char *own = cfx_nccl_refusal(comm);
    return own ? own : cfxGetLastError(cfx_nccl_comm(comm));
}
CFX_NCCL_ALIAS(ncclGetLastError);

/* Conflux reads its logging variables once, at its first log line: this
 * maps NCCL_DEBUG* again, which only matters before that line. */
CFX_NCCL_API void pncclResetDebugInit(void)
{
    cfx_nccl_env_apply(1);
}
CFX_NCCL_ALIAS(ncclResetDebugInit);

/* ---------------------------------------------------------------- collectives */

CFX_NCCL_API ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, ncclRedOp_t op, int root,
                                      ncclComm_t comm, cudaStream_t stream)
{
    return cfx_nccl_result_from(cfxReduce(sendbuff, recvbuff, count, cfx_nccl_type(datatype),
                                          cfx_nccl_op(op), root, cfx_nccl_comm(comm), stream));
}
CFX_NCCL_ALIAS(ncclReduce);

CFX_NCCL_API ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                                     ncclComm_t comm, cudaStream_t stream)
{
    return cfx_nccl_result_from(
        cfxBcast(buff, count, cfx_nccl_type(datatype), root, cfx_nccl_comm(comm), stream));
}
CFX_NCCL_ALIAS(ncclBcast);

CFX_NCCL_API ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                         ncclDataType_t datatype, int root, ncclComm_t comm,
                                         cudaStream_t stream)
{
    return cfx_nccl_result_from(cfxBroadcast(sendbuff, recvbuff, count, cfx_nccl_type(datatype),
                                             root, cfx_nccl_comm(comm), stream));
}
CFX_NCCL_ALIAS(ncclBroadcast);

CFX_NCCL_API ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                         cudaStream_t stream)
{
    return cfx_nccl_result_from(cfxAllReduce(sendbuff, recvbuff, count, cfx_nccl_type(datatype),
                                             cfx_nccl_op(op), cfx_nccl_comm(comm), stream));
}
CFX_NCCL_ALIAS(ncclAllReduce);

CFX_NCCL_API ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                             ncclDataType_t datatype, ncclRedOp_t op,
                                             ncclComm_t comm, cudaStream_t stream)
{
    return cfx_nccl_result_from(cfxReduceScatter(sendbuff, recvbuff, recvcount,
                                                 cfx_nccl_type(datatype), cfx_nccl_op(op),
                                                 cfx_nccl_comm(comm), stream));
}
CFX_NCCL_ALIAS(ncclReduceScatter);

CFX_NCCL_API ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                         ncclDataType_t datatype, ncclComm_t comm,
                                         cudaStream_t stream)
{
    return cfx_nccl_result_from(cfxAllGather(sendbuff, recvbuff, sendcount, cfx_nccl_type(datatype),
                                             cfx_nccl_comm(comm), stream));
}
CFX_NCCL_ALIAS(ncclAllGather);

CFX_NCCL_API ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                        ncclDataType_t datatype, ncclComm_t comm,
                                        cudaStream_t stream)
{
    return cfx_nccl_result_from(cfxAlltoAll(sendbuff, recvbuff, count, cfx_nccl_type(datatype),
                                            cfx_nccl_comm(comm), stream));
}
CFX_NCCL_ALIAS(ncclAlltoAll);

CFX_NCCL_API ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count,
                                      ncclDataType_t datatype, int root, ncclComm_t comm,
                                      cudaStream_t stream)
{
    return cfx_nccl_result_from(cfxGather(sendbuff, recvbuff, count, cfx_nccl_type(datatype), root,
                                          cfx_nccl_comm(comm), stream));
}
CFX_NCCL_ALIAS(ncclGather);

CFX_NCCL_API ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                                       ncclDataType_t datatype, int root, ncclComm_t comm,
                                       cudaStream_t stream)
{
    return cfx_nccl_result_from(cfxScatter(sendbuff, recvbuff, count, cfx_nccl_type(datatype), root,
                                           cfx_nccl_comm(comm), stream));
}
CFX_NCCL_ALIAS(ncclScatter);

CFX_NCCL_API ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                                    int peer, ncclComm_t comm, cudaStream_t stream)
{
    return cfx_nccl_result_from(
        cfxSend(sendbuff, count, cfx_nccl_type(datatype), peer, cfx_nccl_comm(comm), stream));
}
CFX_NCCL_ALIAS(ncclSend);

CFX_NCCL_API ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                    ncclComm_t comm, cudaStream_t stream)
{
    return cfx_nccl_result_from(
        cfxRecv(recvbuff, count, cfx_nccl_type(datatype), peer, cfx_nccl_comm(comm), stream));
}
CFX_NCCL_ALIAS(ncclRecv);

CFX_NCCL_API ncclResult_t pncclGroupStart(void)
{
    return cfx_nccl_result_from(cfxGroupStart());
}
CFX_NCCL_ALIAS(ncclGroupStart);

CFX_NCCL_API ncclResult_t pncclGroupEnd(void)
{
    return cfx_nccl_result_from(cfxGroupEnd());
}
CFX_NCCL_ALIAS(ncclGroupEnd);
