/*
 * NCCL 2.28's ABI as the drop-in libnccl.so.2 exports it: the types, enum
 * values and struct layouts of NVIDIA's nccl.h (and the host functions of
 * nccl_device.h), written out here so that the drop-in never needs NVIDIA's
 * header to build. Every value and offset below is NCCL's; the static
 * assertions in abi.c hold them to that.
 *
 * Each function is declared twice, as nccl.h does: ncclX (weak, what
 * applications call) and pncclX (strong, what a profiling wrapper that
 * interposes ncclX calls on to).
 *
 * Private to bindings/nccl; applications include NVIDIA's nccl.h.
 */
#ifndef CFX_NCCL_ABI_H
#define CFX_NCCL_ABI_H

#include <limits.h>
#include <stddef.h>

/* The API level the drop-in implements: NCCL 2.28 (NCCL's encoding). */
#define CFX_NCCL_MAJOR        2
#define CFX_NCCL_MINOR        28
#define CFX_NCCL_VERSION_CODE (CFX_NCCL_MAJOR * 10000 + CFX_NCCL_MINOR * 100)

typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
typedef struct CUstream_st *cudaStream_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* NCCL 2.28 has no timeout code: ncclNumResults is 8. */
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_CONFIG_MAGIC     0xcafebeef

/* ncclCommShrink and ncclCommRevoke flags. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT   0x01
#define NCCL_REVOKE_DEFAULT 0x00

/* ncclConfig_v22800. Fields were only ever appended, so a config of an older
 * nccl.h is a prefix of this one, its config->size long. */
typedef struct ncclConfig_v22800 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
    int trafficClass;
    const char *commName;
    int collnetEnable;
    int CTAPolicy;
    int shrinkShare;
    int nvlsCTAs;
    int nChannelsPerNetPeer;
    int nvlinkCentricSched;
} ncclConfig_t;

typedef struct ncclSimInfo_v22200 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    float estimatedTime;
} ncclSimInfo_t;

typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5, /* Ops of ncclRedOpCreatePreMulSum take values from here up. */
    ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

typedef enum {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12
} ncclDataType_t;

typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

/* nccl_device.h: only what the host functions' signatures need. */
typedef struct ncclTeam {
    int nRanks, rank, stride;
} ncclTeam_t;
typedef struct ncclDevComm ncclDevComm_t;
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;
typedef struct ncclDevResourceRequirements ncclDevResourceRequirements_t;
typedef struct ncclGinBarrierHandle ncclGinBarrierHandle_t;
typedef struct ncclLsaBarrierHandle ncclLsaBarrierHandle_t;
typedef struct ncclLLA2AHandle ncclLLA2AHandle_t;

#define CFX_NCCL_DECLARE(ret, name, params)                                                        \
    ret name params;                                                                               \
    ret p##name params

/* Memory, version, ids, communicators. */
CFX_NCCL_DECLARE(ncclResult_t, ncclMemAlloc, (void **ptr, size_t size));
CFX_NCCL_DECLARE(ncclResult_t, ncclMemFree, (void *ptr));
CFX_NCCL_DECLARE(ncclResult_t, ncclGetVersion, (int *version));
CFX_NCCL_DECLARE(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommInitRankConfig,
                 (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank,
                  ncclConfig_t *config));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommInitRank,
                 (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommInitAll, (ncclComm_t * comm, int ndev, const int *devlist));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommInitRankScalable,
                 (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds,
                  ncclConfig_t *config));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommFinalize, (ncclComm_t comm));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommDestroy, (ncclComm_t comm));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommAbort, (ncclComm_t comm));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommSplit,
                 (ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommShrink,
                 (ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                  ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags));
CFX_NCCL_DECLARE(const char *, ncclGetErrorString, (ncclResult_t result));
CFX_NCCL_DECLARE(const char *, ncclGetLastError, (ncclComm_t comm));
CFX_NCCL_DECLARE(void, ncclResetDebugInit, (void));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t *asyncError));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int *count));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int *device));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int *rank));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommRegister,
                 (const ncclComm_t comm, void *buff, size_t size, void **handle));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void *handle));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommWindowRegister,
                 (ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags));
CFX_NCCL_DECLARE(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win));
CFX_NCCL_DECLARE(ncclResult_t, ncclRedOpCreatePreMulSum,
                 (ncclRedOp_t * op, void *scalar, ncclDataType_t datatype,
                  ncclScalarResidence_t residence, ncclComm_t comm));
CFX_NCCL_DECLARE(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm));

/* Collectives and point-to-point. */
CFX_NCCL_DECLARE(ncclResult_t, ncclReduce,
                 (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                  ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream));
CFX_NCCL_DECLARE(ncclResult_t, ncclBcast,
                 (void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                  cudaStream_t stream));
CFX_NCCL_DECLARE(ncclResult_t, ncclBroadcast,
                 (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                  int root, ncclComm_t comm, cudaStream_t stream));
CFX_NCCL_DECLARE(ncclResult_t, ncclAllReduce,
                 (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
CFX_NCCL_DECLARE(ncclResult_t, ncclReduceScatter,
                 (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
CFX_NCCL_DECLARE(ncclResult_t, ncclAllGather,
                 (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                  ncclComm_t comm, cudaStream_t stream));
CFX_NCCL_DECLARE(ncclResult_t, ncclAlltoAll,
                 (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                  ncclComm_t comm, cudaStream_t stream));
CFX_NCCL_DECLARE(ncclResult_t, ncclGather,
                 (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                  int root, ncclComm_t comm, cudaStream_t stream));
CFX_NCCL_DECLARE(ncclResult_t, ncclScatter,
                 (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                  int root, ncclComm_t comm, cudaStream_t stream));
CFX_NCCL_DECLARE(ncclResult_t, ncclSend,
                 (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                  ncclComm_t comm, cudaStream_t stream));
CFX_NCCL_DECLARE(ncclResult_t, ncclRecv,
                 (void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                  cudaStream_t stream));
CFX_NCCL_DECLARE(ncclResult_t, ncclGroupStart, (void));
CFX_NCCL_DECLARE(ncclResult_t, ncclGroupEnd, (void));
CFX_NCCL_DECLARE(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo));

/* The host functions of nccl_device.h that return an ncclResult_t. */
CFX_NCCL_DECLARE(ncclResult_t, ncclDevCommCreate,
                 (ncclComm_t comm, ncclDevCommRequirements_t const *reqs,
                  ncclDevComm_t *outDevComm));
CFX_NCCL_DECLARE(ncclResult_t, ncclDevCommDestroy, (ncclComm_t comm, ncclDevComm_t const *devComm));
CFX_NCCL_DECLARE(ncclResult_t, ncclGinBarrierCreateRequirement,
                 (ncclComm_t comm, ncclTeam_t team, int nBarriers,
                  ncclGinBarrierHandle_t *outHandle, ncclDevResourceRequirements_t *outReq));
CFX_NCCL_DECLARE(ncclResult_t, ncclLsaBarrierCreateRequirement,
                 (ncclTeam_t team, int nBarriers, ncclLsaBarrierHandle_t *outHandle,
                  ncclDevResourceRequirements_t *outReq));
CFX_NCCL_DECLARE(ncclResult_t, ncclLLA2ACreateRequirement,
                 (int nBlocks, int nSlots, ncclLLA2AHandle_t *outHandle,
                  ncclDevResourceRequirements_t *outReq));

#endif /* CFX_NCCL_ABI_H */
