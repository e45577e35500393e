/*
 * Conflux: collective communication for CPUs and GPUs.
 *
 * This header mirrors nccl.h name for name with the prefix "cfx" instead of
 * "nccl": same argument order, same enum values, same semantics. Porting from
 * NCCL is a sed. It needs no CUDA header: cfxStream_t is the same type as
 * cudaStream_t.
 *
 * SPDX-License-Identifier: BSD-3-Clause
 */
#ifndef CONFLUX_H
#define CONFLUX_H

#include <limits.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(CFX_BUILDING_LIBRARY)
#define CFX_API __attribute__((visibility("default")))
#else
#define CFX_API
#endif

/** @brief Library version, major part. */
#define CFX_MAJOR 0
/** @brief Library version, minor part. */
#define CFX_MINOR 1
/** @brief Library version, patch part. */
#define CFX_PATCH 0
/** @brief Version suffix (empty for releases). */
#define CFX_SUFFIX ""
/** @brief Version as one integer, NCCL's encoding: X*10000 + Y*100 + Z. */
#define CFX_VERSION_CODE (CFX_MAJOR * 10000 + CFX_MINOR * 100 + CFX_PATCH)
/** @brief Encode a version the way CFX_VERSION_CODE is encoded. */
#define CFX_VERSION(X, Y, Z) ((X)*10000 + (Y)*100 + (Z))

/** @brief Result of every Conflux call. Values equal NCCL's. */
typedef enum {
    cfxSuccess = 0,            /**< The call succeeded. */
    cfxUnhandledCudaError = 1, /**< A CUDA call failed. */
    cfxSystemError = 2,        /**< A system call failed (socket, memory, files). */
    cfxInternalError = 3,      /**< A bug in Conflux. */
    cfxInvalidArgument = 4,    /**< A bad argument (NULL pointer, range, type). */
    cfxInvalidUsage = 5,       /**< A wrong call sequence or mismatched use. */
    cfxRemoteError = 6,        /**< A peer failed or went away. */
    cfxInProgress = 7,         /**< A non-blocking operation has not finished. */
    cfxTimeout = 8,            /**< A wait ran past its deadline. */
    cfxNumResults = 9
} cfxResult_t;

/** @brief Element types. Values equal NCCL's. */
typedef enum {
    cfxInt8 = 0,
    cfxChar = 0,
    cfxUint8 = 1,
    cfxInt32 = 2,
    cfxInt = 2,
    cfxUint32 = 3,
    cfxInt64 = 4,
    cfxUint64 = 5,
    cfxFloat16 = 6,
    cfxHalf = 6,
    cfxFloat32 = 7,
    cfxFloat = 7,
    cfxFloat64 = 8,
    cfxDouble = 8,
    cfxBfloat16 = 9,
    cfxFloat8e4m3 = 10,
    cfxFloat8e5m2 = 11,
    cfxNumTypes = 12
} cfxDataType_t;

/** @brief Reduction operations. Values equal NCCL's. */
typedef enum {
    cfxSum = 0,
    cfxProd = 1,
    cfxMax = 2,
    cfxMin = 3,
    cfxAvg = 4, /**< Sum, then divide by the number of ranks. */
    cfxNumOps = 5,
    /* Ops made by cfxRedOpCreatePreMulSum take values from cfxNumOps upward. */
    cfxMaxRedOp = 0x7fffffff /**< The largest valid value (as NCCL's). */
} cfxRedOp_t;

/** @brief Where the scalar of cfxRedOpCreatePreMulSum lives. Values equal NCCL's. */
typedef enum {
    cfxScalarDevice = 0,       /**< Device memory, read at each call (not supported yet). */
    cfxScalarHostImmediate = 1 /**< Host memory, read once at creation. */
} cfxScalarResidence_t;

/** @brief Opaque communicator handle. */
typedef struct cfxComm *cfxComm_t;
/** @brief The null communicator. */
#define CFX_COMM_NULL NULL

/** @brief Size of a unique id in bytes. */
#define CFX_UNIQUE_ID_BYTES 128
/** @brief Opaque id that ties the ranks of one communicator together. */
typedef struct {
    char internal[CFX_UNIQUE_ID_BYTES];
} cfxUniqueId;

/** @brief Color that makes cfxCommSplit return a NULL communicator. */
#define CFX_SPLIT_NOCOLOR -1

/** @brief cfxCommShrink flags (NCCL's values): shrink a healthy parent. */
#define CFX_SHRINK_DEFAULT 0x00
/** @brief cfxCommShrink flags: the parent may be broken (a rank died); its
 * state is not used, only its bootstrap among the remaining ranks. */
#define CFX_SHRINK_ABORT 0x01
/** @brief cfxCommRevoke flags: the only one (NCCL's value). */
#define CFX_REVOKE_DEFAULT 0x00

/** @brief A CUDA stream, the same type as cudaStream_t. NULL for host work. */
typedef struct CUstream_st *cfxStream_t;

/** @brief Marks an int field of cfxConfig_t as "use the default". */
#define CFX_CONFIG_UNDEF_INT INT_MIN
/** @brief Marks a pointer field of cfxConfig_t as "use the default". */
#define CFX_CONFIG_UNDEF_PTR NULL

/**
 * @brief Communicator options. Initialise with CFX_CONFIG_INITIALIZER and set
 * only the fields you need; unset fields keep their defaults.
 */
typedef struct cfxConfig_v1 {
    /* Must be first: they identify the layout. */
    size_t size;
    unsigned int magic;
    unsigned int version;
    /* Options. */
    int blocking;         /**< 1 (default): calls return when done. */
    const char *commName; /**< A name for logs; not copied past init. */
    int splitShare;       /**< Child shares the parent's resources (hint). */
    int minCTAs;          /**< GPU: minimum thread blocks per collective. */
    int maxCTAs;          /**< GPU: maximum thread blocks per collective. */
    const char *netName;  /**< Force a network transport by name. */
    /** Seconds a blocking call of this communicator may go without progress
     * before it fails with cfxTimeout; 0 waits forever. Default: CFX_TIMEOUT
     * (600). Conflux's own field (NCCL has none): PyTorch's per-group timeout. */
    int timeout;
} cfxConfig_t;

/** @brief Initialiser for cfxConfig_t. */
#define CFX_CONFIG_INITIALIZER                                                                     \
    {                                                                                              \
        sizeof(cfxConfig_t),                              /* size */                               \
            0xcafebeef,                                   /* magic */                              \
            CFX_VERSION(CFX_MAJOR, CFX_MINOR, CFX_PATCH), /* version */                            \
            CFX_CONFIG_UNDEF_INT,                         /* blocking */                           \
            CFX_CONFIG_UNDEF_PTR,                         /* commName */                           \
            CFX_CONFIG_UNDEF_INT,                         /* splitShare */                         \
            CFX_CONFIG_UNDEF_INT,                         /* minCTAs */                            \
            CFX_CONFIG_UNDEF_INT,                         /* maxCTAs */                            \
            CFX_CONFIG_UNDEF_PTR,                         /* netName */                            \
            CFX_CONFIG_UNDEF_INT                          /* timeout */                            \
    }

/**
 * @brief Allocate memory for communication buffers. Host builds: page-aligned
 * host memory, every page touched (zeroed) before return, so that the first
 * collective does not pay for page faults. (Device memory once a GPU executor
 * exists.) Free with cfxMemFree.
 * @param [out] ptr The memory (set only on success).
 * @param [in] size Bytes, > 0.
 * @return cfxSuccess; cfxInvalidArgument (NULL ptr, size 0 or above
 * PTRDIFF_MAX); cfxSystemError when out of memory.
 */
CFX_API cfxResult_t cfxMemAlloc(void **ptr, size_t size);

/**
 * @brief Free memory from cfxMemAlloc. NULL is a no-op.
 * @param [in] ptr The memory.
 * @return cfxSuccess.
 */
CFX_API cfxResult_t cfxMemFree(void *ptr);

/**
 * @brief Report the library version.
 * @param [out] version CFX_VERSION_CODE of the loaded library.
 * @return cfxSuccess, or cfxInvalidArgument when version is NULL.
 */
CFX_API cfxResult_t cfxGetVersion(int *version);

/**
 * @brief Create a unique id for a new communicator. Call it on one rank and
 * share the id with the others (MPI_Bcast, a file, ...).
 *
 * Starts a root listener in this process that lives until every rank of the
 * communicator has joined (or the bootstrap timeout passes). With
 * CFX_COMM_ID=host:port set, every rank produces the same id and rank 0
 * listens at that address instead.
 * @param [out] uniqueId The id.
 * @return cfxSuccess, cfxInvalidArgument, or cfxSystemError when no listener
 * could be started.
 */
CFX_API cfxResult_t cfxGetUniqueId(cfxUniqueId *uniqueId);

/**
 * @brief Create the communicator of rank @p rank among @p nranks ranks.
 * Collective: every rank calls it with the same id and nranks.
 * @param [out] comm The new communicator (set only on success).
 * @param [in] nranks Number of ranks, >= 1.
 * @param [in] commId The id from cfxGetUniqueId.
 * @param [in] rank This rank, 0 <= rank < nranks.
 * @return cfxSuccess; cfxInvalidArgument; cfxTimeout when ranks are missing
 * (cfxGetLastError(NULL) names them); cfxRemoteError; cfxSystemError.
 */
CFX_API cfxResult_t cfxCommInitRank(cfxComm_t *comm, int nranks, cfxUniqueId commId, int rank);

/**
 * @brief cfxCommInitRank with options.
 * @param [out] comm The new communicator (set only on success).
 * @param [in] nranks Number of ranks, >= 1.
 * @param [in] commId The id from cfxGetUniqueId.
 * @param [in] rank This rank, 0 <= rank < nranks.
 * @param [in] config Options, or NULL for defaults.
 * @return As cfxCommInitRank; cfxInvalidArgument for a malformed config.
 */
CFX_API cfxResult_t cfxCommInitRankConfig(cfxComm_t *comm, int nranks, cfxUniqueId commId, int rank,
                                          cfxConfig_t *config);

/**
 * @brief cfxCommInitRankConfig through several ids, to spread the join over
 * several bootstrap roots (as ncclCommInitRankScalable). The ranks are split
 * into @p nId contiguous blocks (the first nranks % nId blocks one rank
 * larger); the root of commIds[k] serves block k, and commIds[0]'s root also
 * meets the first rank of every other block. Make commIds[k] with
 * cfxGetUniqueId on a rank of block k, so that the roots run in different
 * processes, and pass every rank the same array.
 * @param [out] newcomm The new communicator (set only on success).
 * @param [in] nranks Number of ranks, >= 1.
 * @param [in] myrank This rank, 0 <= myrank < nranks.
 * @param [in] nId Number of ids, 1 <= nId <= nranks.
 * @param [in] commIds nId distinct ids from cfxGetUniqueId, in the same order
 * on every rank (with CFX_COMM_ID, which makes every id the same, ids that
 * are all equal count as one).
 * @param [in] config Options, or NULL for defaults.
 * @return As cfxCommInitRankConfig; cfxInvalidArgument for a bad nId or id.
 */
CFX_API cfxResult_t cfxCommInitRankScalable(cfxComm_t *newcomm, int nranks, int myrank, int nId,
                                            cfxUniqueId *commIds, cfxConfig_t *config);

/**
 * @brief Create @p ndev communicators, one per rank, all in this process.
 * @param [out] comms Array of ndev communicators; comms[i] is rank i.
 * @param [in] ndev Number of ranks, >= 1.
 * @param [in] devlist CUDA device of each rank, or NULL for host ranks.
 * @return cfxSuccess, or the first failure of any rank.
 */
CFX_API cfxResult_t cfxCommInitAll(cfxComm_t *comms, int ndev, const int *devlist);

/**
 * @brief Split a communicator into sub-communicators by color, ordered by key
 * (ties broken by rank in the parent). Collective over the parent.
 * @param [in] comm Parent communicator.
 * @param [in] color Ranks with the same color share a child; CFX_SPLIT_NOCOLOR
 * ranks get NULL.
 * @param [in] key Order of ranks in the child.
 * @param [out] newcomm The child, or NULL for CFX_SPLIT_NOCOLOR.
 * @param [in] config Options for the child, or NULL to inherit.
 * @return cfxSuccess, cfxInvalidArgument, cfxInvalidUsage, or a bootstrap
 * failure.
 */
CFX_API cfxResult_t cfxCommSplit(cfxComm_t comm, int color, int key, cfxComm_t *newcomm,
                                 cfxConfig_t *config);

/**
 * @brief Build a new communicator of the parent's ranks but those listed,
 * also after some of them died: "a rank failed, drop it and continue".
 * Called by every remaining rank (not by the excluded ones), which keep
 * their order; nothing is sent to an excluded rank. The parent is left as it
 * is (destroy or abort it after).
 * @param [in] comm Parent communicator (may be broken by a dead peer).
 * @param [in] excludeRanksList Parent ranks to leave out (any order, no
 * duplicates, not the calling rank); may be NULL when excludeRanksCount is 0.
 * @param [in] excludeRanksCount Entries of the list, 0 .. nranks-1.
 * @param [out] newcomm The new communicator.
 * @param [in] config Options for it, or NULL to inherit the parent's.
 * @param [in] shrinkFlags CFX_SHRINK_DEFAULT or CFX_SHRINK_ABORT.
 * @return cfxSuccess; cfxInvalidArgument for a bad list or flag;
 * cfxInvalidUsage when the remaining ranks pass different lists (every one
 * of them fails); a bootstrap failure (e.g. cfxRemoteError naming a listed
 * rank's survivor that died too) within CFX_BOOTSTRAP_TIMEOUT.
 */
/**
 * @brief Stop the communicator's work and keep it for cfxCommShrink,
 * cfxCommSplit or cfxCommDestroy: a call another thread has in it fails, the
 * peers' calls that wait on this rank fail, and later collectives (and
 * cfxCommFinalize) return cfxInvalidUsage with a sentence. Returns once no
 * call is in the communicator.
 * @param [in] comm The communicator.
 * @param [in] revokeFlags CFX_REVOKE_DEFAULT.
 * @return cfxSuccess, cfxInvalidArgument, or cfxInProgress when a call of
 * another thread is still in after 5 s.
 */
CFX_API cfxResult_t cfxCommRevoke(cfxComm_t comm, int revokeFlags);

CFX_API cfxResult_t cfxCommShrink(cfxComm_t comm, int *excludeRanksList, int excludeRanksCount,
                                  cfxComm_t *newcomm, cfxConfig_t *config, int shrinkFlags);

/**
 * @brief Finish all outstanding work and synchronise with the peers so the
 * communicator can be destroyed. Collective.
 * @param [in] comm The communicator.
 * @return cfxSuccess; cfxInvalidUsage when called twice; a peer failure.
 */
CFX_API cfxResult_t cfxCommFinalize(cfxComm_t comm);

/**
 * @brief Release a communicator. Local: waits for no peer. Call
 * cfxCommFinalize first for an orderly shutdown.
 * @param [in] comm The communicator; invalid afterwards.
 * @return cfxSuccess or cfxInvalidArgument.
 */
CFX_API cfxResult_t cfxCommDestroy(cfxComm_t comm);

/**
 * @brief Stop every operation on the communicator and release it without
 * waiting for peers. Safe to call when peers are dead or hung.
 * @param [in] comm The communicator; invalid afterwards.
 * @return cfxSuccess or cfxInvalidArgument.
 */
CFX_API cfxResult_t cfxCommAbort(cfxComm_t comm);

/**
 * @brief Report an asynchronous error of the communicator.
 * @param [in] comm The communicator.
 * @param [out] asyncError cfxSuccess, or the error that broke the communicator.
 * @return cfxSuccess or cfxInvalidArgument.
 */
CFX_API cfxResult_t cfxCommGetAsyncError(cfxComm_t comm, cfxResult_t *asyncError);

/**
 * @brief Number of ranks in the communicator.
 * @param [in] comm The communicator.
 * @param [out] count Number of ranks.
 * @return cfxSuccess or cfxInvalidArgument.
 */
CFX_API cfxResult_t cfxCommCount(const cfxComm_t comm, int *count);

/**
 * @brief CUDA device of the communicator.
 * @param [in] comm The communicator.
 * @param [out] device The device, or -1 for a host-only communicator.
 * @return cfxSuccess or cfxInvalidArgument.
 */
CFX_API cfxResult_t cfxCommCuDevice(const cfxComm_t comm, int *device);

/**
 * @brief Rank of the caller in the communicator.
 * @param [in] comm The communicator.
 * @param [out] rank The rank.
 * @return cfxSuccess or cfxInvalidArgument.
 */
CFX_API cfxResult_t cfxCommUserRank(const cfxComm_t comm, int *rank);

/**
 * @brief Register a buffer with the communicator for later zero-copy use.
 * Conflux records the registration (checked, listed per communicator, released
 * at cfxCommDestroy) but no transport uses it yet: collectives run the same
 * with or without it. Local: waits for no peer.
 * @param [in] comm The communicator.
 * @param [in] buff Start of the buffer.
 * @param [in] size Bytes, > 0.
 * @param [out] handle The registration (set only on success).
 * @return cfxSuccess; cfxInvalidArgument; cfxSystemError when out of memory.
 */
CFX_API cfxResult_t cfxCommRegister(const cfxComm_t comm, void *buff, size_t size, void **handle);

/**
 * @brief Release a registration of cfxCommRegister.
 * @param [in] comm The communicator it was made on.
 * @param [in] handle The registration; invalid afterwards.
 * @return cfxSuccess; cfxInvalidArgument for a handle this communicator did
 * not make (or already released).
 */
CFX_API cfxResult_t cfxCommDeregister(const cfxComm_t comm, void *handle);

/**
 * @brief Make a reduction that multiplies each rank's input by @p scalar and
 * sums: result = sum over ranks of scalar * x. Usable with cfxAllReduce,
 * cfxReduce and cfxReduceScatter on @p comm, with @p datatype only. Conflux
 * sums first and multiplies the sum once (exact for integers, whose
 * arithmetic wraps; for floats the same up to rounding). Local.
 * @param [out] op The new op, a value from cfxNumOps upward (set only on success).
 * @param [in] scalar Pointer to one element of @p datatype.
 * @param [in] datatype Element type of the scalar and of the calls.
 * @param [in] residence cfxScalarHostImmediate (read now). cfxScalarDevice is
 * refused until a GPU executor exists.
 * @param [in] comm The communicator.
 * @return cfxSuccess; cfxInvalidArgument; cfxInvalidUsage when the
 * communicator holds CFX_MAX_PREMULSUM_OPS ops already.
 */
CFX_API cfxResult_t cfxRedOpCreatePreMulSum(cfxRedOp_t *op, void *scalar, cfxDataType_t datatype,
                                            cfxScalarResidence_t residence, cfxComm_t comm);

/**
 * @brief Destroy an op of cfxRedOpCreatePreMulSum. Local.
 * @param [in] op The op; invalid afterwards.
 * @param [in] comm The communicator it was made on.
 * @return cfxSuccess; cfxInvalidArgument for a built-in op, or one this
 * communicator did not make (or already destroyed).
 */
CFX_API cfxResult_t cfxRedOpDestroy(cfxRedOp_t op, cfxComm_t comm);

/** @brief Most cfxRedOpCreatePreMulSum ops alive at once on one communicator. */
#define CFX_MAX_PREMULSUM_OPS 64

/**
 * @brief Name of a result code, e.g. "invalid argument".
 * @param [in] result A result code.
 * @return A static string; "unknown result" for values out of range.
 */
CFX_API const char *cfxGetErrorString(cfxResult_t result);

/**
 * @brief The last failure as a human sentence: what failed, on which peer,
 * and what to try.
 * @param [in] comm A communicator, or NULL for the process's last failure.
 * @return A string owned by the library, valid until the next failing call
 * on the same communicator (or, for NULL, in the process); "" when none.
 */
CFX_API const char *cfxGetLastError(cfxComm_t comm);

/* ------------------------------------------------------------------------
 * Collectives and point-to-point. Host buffers with stream == NULL complete
 * before the call returns. With a non-NULL stream (CUDA builds only) the
 * stream is synchronised first. Count 0 is a successful no-op. In-place
 * rules are NCCL's, given with each call.
 * ---------------------------------------------------------------------- */

/**
 * @brief Reduce @p count elements across all ranks; every rank gets the result.
 * In place when sendbuff == recvbuff.
 * @param [in] sendbuff This rank's input.
 * @param [out] recvbuff The reduced result (count elements).
 * @param [in] count Elements per rank.
 * @param [in] datatype Element type.
 * @param [in] op Reduction.
 * @param [in] comm Communicator.
 * @param [in] stream NULL for host buffers.
 * @return cfxSuccess; cfxInvalidArgument; cfxInvalidUsage; cfxRemoteError.
 */
CFX_API cfxResult_t cfxAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                 cfxDataType_t datatype, cfxRedOp_t op, cfxComm_t comm,
                                 cfxStream_t stream);

/**
 * @brief Copy @p count elements from @p root's sendbuff to every rank's recvbuff.
 * In place when sendbuff == recvbuff; sendbuff is read on the root only.
 * @param [in] sendbuff The root's data.
 * @param [out] recvbuff Every rank's copy.
 * @param [in] count Elements.
 * @param [in] datatype Element type.
 * @param [in] root Rank that sends.
 * @param [in] comm Communicator.
 * @param [in] stream NULL for host buffers.
 * @return cfxSuccess; cfxInvalidArgument; cfxInvalidUsage; cfxRemoteError.
 */
CFX_API cfxResult_t cfxBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                 cfxDataType_t datatype, int root, cfxComm_t comm,
                                 cfxStream_t stream);

/**
 * @brief In-place broadcast (the legacy form): cfxBroadcast(buff, buff, ...).
 * @param [in,out] buff Data on the root; the copy elsewhere.
 * @param [in] count Elements.
 * @param [in] datatype Element type.
 * @param [in] root Rank that sends.
 * @param [in] comm Communicator.
 * @param [in] stream NULL for host buffers.
 * @return As cfxBroadcast.
 */
CFX_API cfxResult_t cfxBcast(void *buff, size_t count, cfxDataType_t datatype, int root,
                             cfxComm_t comm, cfxStream_t stream);

/**
 * @brief Reduce @p count elements across all ranks into @p root's recvbuff.
 * In place when sendbuff == recvbuff; recvbuff is written on the root only.
 * @param [in] sendbuff This rank's input.
 * @param [out] recvbuff The result, on the root.
 * @param [in] count Elements per rank.
 * @param [in] datatype Element type.
 * @param [in] op Reduction.
 * @param [in] root Rank that receives.
 * @param [in] comm Communicator.
 * @param [in] stream NULL for host buffers.
 * @return cfxSuccess; cfxInvalidArgument; cfxInvalidUsage; cfxRemoteError.
 */
CFX_API cfxResult_t cfxReduce(const void *sendbuff, void *recvbuff, size_t count,
                              cfxDataType_t datatype, cfxRedOp_t op, int root, cfxComm_t comm,
                              cfxStream_t stream);

/**
 * @brief Gather @p sendcount elements from every rank into every rank's
 * recvbuff, rank i's at recvbuff + i*sendcount. In place when
 * sendbuff == recvbuff + rank*sendcount.
 * @param [in] sendbuff This rank's block.
 * @param [out] recvbuff nranks*sendcount elements.
 * @param [in] sendcount Elements per rank.
 * @param [in] datatype Element type.
 * @param [in] comm Communicator.
 * @param [in] stream NULL for host buffers.
 * @return cfxSuccess; cfxInvalidArgument; cfxInvalidUsage; cfxRemoteError.
 */
CFX_API cfxResult_t cfxAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                 cfxDataType_t datatype, cfxComm_t comm, cfxStream_t stream);

/**
 * @brief Reduce nranks*recvcount elements across ranks; rank i gets block i.
 * In place when sendbuff + rank*recvcount == recvbuff.
 * @param [in] sendbuff nranks*recvcount elements.
 * @param [out] recvbuff This rank's reduced block.
 * @param [in] recvcount Elements per rank.
 * @param [in] datatype Element type.
 * @param [in] op Reduction.
 * @param [in] comm Communicator.
 * @param [in] stream NULL for host buffers.
 * @return cfxSuccess; cfxInvalidArgument; cfxInvalidUsage; cfxRemoteError.
 */
CFX_API cfxResult_t cfxReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                     cfxDataType_t datatype, cfxRedOp_t op, cfxComm_t comm,
                                     cfxStream_t stream);

/**
 * @brief Every rank sends @p count elements to every rank: the block for rank
 * j is sendbuff + j*count, the block from rank i lands at recvbuff + i*count.
 * Not in place: sendbuff and recvbuff must not overlap. Runs as a group of
 * sends and receives with every peer at once; the own block is copied locally.
 * @param [in] sendbuff nranks*count elements.
 * @param [out] recvbuff nranks*count elements.
 * @param [in] count Elements per peer.
 * @param [in] datatype Element type.
 * @param [in] comm Communicator.
 * @param [in] stream NULL for host buffers.
 * @return cfxSuccess; cfxInvalidArgument; cfxInvalidUsage; cfxRemoteError.
 */
CFX_API cfxResult_t cfxAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                cfxDataType_t datatype, cfxComm_t comm, cfxStream_t stream);

/**
 * @brief Every rank sends @p count elements to @p root, which places rank
 * i's at recvbuff + i*count. recvbuff is used on the root only. In place
 * when sendbuff == recvbuff + root*count on the root.
 * @param [in] sendbuff count elements.
 * @param [out] recvbuff nranks*count elements, on the root.
 * @param [in] count Elements per rank.
 * @param [in] datatype Element type.
 * @param [in] root Rank that receives.
 * @param [in] comm Communicator.
 * @param [in] stream NULL for host buffers.
 * @return cfxSuccess; cfxInvalidArgument; cfxInvalidUsage; cfxRemoteError.
 */
CFX_API cfxResult_t cfxGather(const void *sendbuff, void *recvbuff, size_t count,
                              cfxDataType_t datatype, int root, cfxComm_t comm, cfxStream_t stream);

/**
 * @brief @p root sends sendbuff + i*count (count elements) to rank i; every
 * rank receives into recvbuff. sendbuff is used on the root only. In place
 * when recvbuff == sendbuff + root*count on the root.
 * @param [in] sendbuff nranks*count elements, on the root.
 * @param [out] recvbuff count elements.
 * @param [in] count Elements per rank.
 * @param [in] datatype Element type.
 * @param [in] root Rank that sends.
 * @param [in] comm Communicator.
 * @param [in] stream NULL for host buffers.
 * @return cfxSuccess; cfxInvalidArgument; cfxInvalidUsage; cfxRemoteError.
 */
CFX_API cfxResult_t cfxScatter(const void *sendbuff, void *recvbuff, size_t count,
                               cfxDataType_t datatype, int root, cfxComm_t comm,
                               cfxStream_t stream);

/**
 * @brief Send @p count elements to @p peer, which calls cfxRecv with the same
 * count and type. Outside a group it returns when the data is sent.
 * @param [in] sendbuff Data.
 * @param [in] count Elements.
 * @param [in] datatype Element type.
 * @param [in] peer Receiving rank (may be this rank, inside a group).
 * @param [in] comm Communicator.
 * @param [in] stream NULL for host buffers.
 * @return cfxSuccess; cfxInvalidArgument; cfxInvalidUsage; cfxRemoteError.
 */
CFX_API cfxResult_t cfxSend(const void *sendbuff, size_t count, cfxDataType_t datatype, int peer,
                            cfxComm_t comm, cfxStream_t stream);

/**
 * @brief Receive @p count elements from @p peer (see cfxSend).
 * @param [out] recvbuff Data.
 * @param [in] count Elements.
 * @param [in] datatype Element type.
 * @param [in] peer Sending rank.
 * @param [in] comm Communicator.
 * @param [in] stream NULL for host buffers.
 * @return cfxSuccess; cfxInvalidArgument; cfxInvalidUsage; cfxRemoteError.
 */
CFX_API cfxResult_t cfxRecv(void *recvbuff, size_t count, cfxDataType_t datatype, int peer,
                            cfxComm_t comm, cfxStream_t stream);

/**
 * @brief Start a group: collectives and sends/receives called until the
 * matching cfxGroupEnd are only queued. Groups nest.
 * @return cfxSuccess.
 */
CFX_API cfxResult_t cfxGroupStart(void);

/**
 * @brief End a group. At the outermost end every queued operation starts
 * together; the call returns when all are done (host buffers). Matching
 * sends and receives in a group never deadlock, whatever their order, and
 * one thread may drive every communicator of cfxCommInitAll.
 * @return cfxSuccess; cfxInvalidUsage without a cfxGroupStart; the first
 * error of a queued operation.
 */
CFX_API cfxResult_t cfxGroupEnd(void);

/** @brief What cfxGroupSimulateEnd reports (NCCL's ncclSimInfo_t layout). */
typedef struct cfxSimInfo_v1 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    float estimatedTime; /**< Microseconds the cost model predicts for the group. */
} cfxSimInfo_t;

/** @brief cfxSimInfo_t's magic (NCCL's value). */
#define CFX_SIM_INFO_MAGIC 0x74685283u
/** @brief Initialiser for cfxSimInfo_t (estimatedTime -1: not simulated yet). */
#define CFX_SIM_INFO_INITIALIZER                                                                   \
    {                                                                                              \
        sizeof(cfxSimInfo_t), CFX_SIM_INFO_MAGIC, CFX_VERSION(CFX_MAJOR, CFX_MINOR, CFX_PATCH),    \
            -1.0f                                                                                  \
    }

/**
 * @brief End a group as cfxGroupEnd does, but run nothing: the queued
 * operations are dropped and simInfo->estimatedTime is the cost model's time
 * for them, in microseconds (per communicator the sum of its collectives'
 * times under the algorithm the planner picks, plus its sends or its
 * receives, whichever take longer, each priced as one hop; the slowest
 * communicator). Every rank must simulate the same group, as it would run
 * it: the dropped operations still count in each communicator's sequence.
 * @param [in,out] simInfo Initialised with CFX_SIM_INFO_INITIALIZER.
 * @return cfxSuccess; cfxInvalidArgument for a NULL or uninitialised
 * simInfo; cfxInvalidUsage without a cfxGroupStart; the first error of a
 * queued operation.
 */
CFX_API cfxResult_t cfxGroupSimulateEnd(cfxSimInfo_t *simInfo);

#ifdef __cplusplus
}
#endif

#endif /* CONFLUX_H */
