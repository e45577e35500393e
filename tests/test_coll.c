/*
 * Collective conformance: every collective, data type, op, count, root and
 * in/out-of-place form, over shared memory and sockets, with 1, 2, 3, 4 and
 * 8 ranks as processes and as threads. Results are checked element by element
 * against tests/coll_check.h, which computes them independently.
 *
 * Allreduce, reduce and broadcast also run forced onto the planner's two trees (CFX_ALGO=tree),
 * once on one host (chains) and once with every process claiming its own
 * host (binary trees across "hosts", over sockets).
 *
 * Allreduce also runs forced onto each single algorithm (CFX_ALGO=direct,
 * CFX_ALGO=ring) at every count, since the planner gives small counts to the
 * direct one-shot schedule and large ones to the ring. The direct cases also
 * check that every rank folds the inputs in rank order (bit for bit, with
 * inexact floats), that direct calls run inside groups with other calls, and
 * that the all-pairs connectors are built once and then reused.
 *
 * Allgather also runs with the single-copy path forced on at every count
 * (CFX_SINGLE_COPY_MIN_BYTES=1: ranks read each other's buffers), which must
 * be on over shared memory and off over sockets, and with it turned off, also
 * when only one rank turns it off (the ranks agree: all or none).
 *
 * The suite also runs on device buffers (GPU ranks, the CUDA executor, on
 * each rank's stream), over shm with 1, 2, 3, 4 and 8 ranks as threads and
 * 2 and 4 as processes on one GPU (CFX_MULTI_RANK_GPU_ENABLE=1), every
 * collective but the one-host-per-rank trees (those need sockets, which
 * cannot serve GPU ranks yet). The same run_* bodies serve both: they fill
 * and check host buffers, and on device buffers CALL_ON copies those to
 * device mirrors before each call and back after it. On this machine the
 * driver is tests/fakecuda (CFX_TEST_FAKECUDA), which runs Conflux's kernel
 * on CPU threads; CFX_TEST_GPU=1 runs them on the machine's GPU. Without
 * either they report SKIP.
 *
 * Trimmed to fit CI: the 1M+3-element count runs for a few (type, op) pairs
 * per collective rather than all of them, and reduce/broadcast try every
 * root for small counts but only the first and last root for large ones.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/core/comm.h"
#include "tests/coll_check.h"
#include "tests/harness.h"
#include "tests/harness_gpu.h"

/* IB: the verbs transport over tests/fakeverbs (CFX_TEST_FAKEVERBS), every
 * process its own host, CFX_NET=IB. NET_PLUGIN: the net-plugin transport over
 * tests/netplugin (CFX_TEST_NET_PLUGIN), every process its own host.
 * NET_BUILTIN: the same transport over Conflux's built-in socket net
 * (CFX_NET_PLUGIN=builtin:socket), NET_BUILTIN_IB over its built-in verbs
 * net on fake-verbs (CFX_NET_PLUGIN=builtin:ib), every process its own
 * host. */
enum transport {
    SHM = 0,
    SOCKET = 1,
    IB = 2,
    NET_PLUGIN = 3,
    P2P = 4,
    NET_BUILTIN = 5,
    NET_BUILTIN_IB = 6
};
enum coll {
    ALLREDUCE,
    REDUCE,
    BROADCAST,
    ALLGATHER,
    REDUCESCATTER,
    SENDRECV,
    ALLREDUCE_TREE,
    REDUCE_TREE,
    BROADCAST_TREE,
    ALLREDUCE_TREE_HOSTS,
    REDUCE_TREE_HOSTS,
    BROADCAST_TREE_HOSTS,
    N_COLLS
};

static const char *coll_names[] = {"allreduce",
                                   "reduce",
                                   "broadcast",
                                   "allgather",
                                   "reducescatter",
                                   "sendrecv",
                                   "allreduce on the trees",
                                   "reduce on the trees",
                                   "broadcast on the trees",
                                   "allreduce on the trees, one host per rank",
                                   "reduce on the trees, one host per rank",
                                   "broadcast on the trees, one host per rank"};

static int on_trees(enum coll c)
{
    return c >= ALLREDUCE_TREE;
}

static int one_host_per_rank(enum coll c)
{
    return c >= ALLREDUCE_TREE_HOSTS;
}
static const char *type_names[] = {"int8",    "uint8",   "int32",   "uint32",   "int64", "uint64",
                                   "float16", "float32", "float64", "bfloat16", "e4m3",  "e5m2"};
static const char *op_names[] = {"sum", "prod", "max", "min", "avg"};

#define LARGE_COUNT ((size_t)(1u << 20) + 3)
static const size_t small_counts[] = {0, 1, 7, 1023};

/* Where a case's buffers live: host memory, or device memory of the rank's
 * GPU (a GPU rank: the CUDA executor, on the rank's stream). */
enum mem_kind { HOST_MEM = 0, DEVICE_MEM = 1 };

struct suite_case {
    enum transport transport;
    int nranks;
    enum cfx_test_mode mode;
    enum coll coll;
    enum mem_kind mem;
    int p2p_read;       /* CFX_P2P_READ_ENABLE=1: the slots in the sender's device memory. */
    int allreduce_algo; /* Allreduce on device buffers: 1 CFX_ALGO=direct, 2 twoshot. */
};

/* Large counts for these (type, op) pairs only. */
static int large_for(cfxDataType_t t, cfxRedOp_t op)
{
    return (t == cfxFloat32 && op == cfxSum) || (t == cfxBfloat16 && op == cfxAvg) ||
           (t == cfxInt64 && op == cfxMax);
}

/* A rank's buffers. The checks fill and read send and recv, host memory,
 * in both kinds. On device buffers dsend and drecv mirror them (the same
 * size) on the rank's GPU: the calls get the mirrors, D(), and the rank's
 * stream, S(), and CALL_ON copies the first span bytes of both buffers to
 * the device before each call and back after it. */
struct ctx_bufs {
    char *send;
    char *recv;
    size_t bytes;
    char *dsend; /* NULL on host buffers. */
    char *drecv;
    size_t span; /* Bytes of each buffer the next call touches, guard bytes included. */
#if CFX_HAVE_CUDA
    struct cfx_test_gpu gpu;
#endif
};

/* Buffers sized for the largest case, allocated once per rank. */
static int bufs_init(struct ctx_bufs *b, int nranks)
{
    memset(b, 0, sizeof(*b));
    b->bytes = LARGE_COUNT * 8 * (size_t)nranks + 64; /* + the guard bytes the checks write */
    b->send = malloc(b->bytes);
    b->recv = malloc(b->bytes);
    return b->send && b->recv;
}

static int on_device(const struct ctx_bufs *b)
{
    return b != NULL && b->dsend != NULL;
}

/* The buffer a call gets for @p host, a pointer into send or recv: on device
 * buffers the same offset of its mirror (NULL stays NULL), else itself. */
static void *buf_for_call(const struct ctx_bufs *b, const void *host)
{
    const char *p = host;
    if (!on_device(b) || p == NULL)
        return (void *)p;
    if (p >= b->send && p <= b->send + b->bytes)
        return b->dsend + (p - b->send);
    if (p >= b->recv && p <= b->recv + b->bytes)
        return b->drecv + (p - b->recv);
    fprintf(stderr, "test_coll: %p is in neither buffer of a device case\n", host);
    abort();
}
#define D(b, host) buf_for_call((b), (host))

#if CFX_HAVE_CUDA
/* The stream a call gets: the rank's on device buffers, else none. */
#define S(b) (on_device(b) ? (b)->gpu.stream : NULL)

/* Make this rank a GPU rank (device 0 current, a stream of its own) and
 * allocate the device mirrors: before cfxCommInitRank. 0: failure recorded. */
static int bufs_open_gpu(struct cfx_test_rank *ctx, struct ctx_bufs *b)
{
    if (!cfx_test_gpu_open(ctx, 0, &b->gpu))
        return 0;
    b->dsend = cfx_test_gpu_alloc(ctx, &b->gpu, b->bytes);
    b->drecv = cfx_test_gpu_alloc(ctx, &b->gpu, b->bytes);
    return b->dsend != NULL && b->drecv != NULL;
}

/* Before a call on device buffers: the first span bytes of send and recv to
 * their mirrors, on the rank's stream (the call is behind them). After it
 * (!to_device): wait for the call, then those bytes back to the host. */
static int bufs_copy(struct cfx_test_rank *ctx, struct ctx_bufs *b, int to_device, const char *desc)
{
    if (!on_device(b))
        return 1;
    const struct cfx_cuda_api *cu = b->gpu.cu;
    CUstream stream = b->gpu.stream;
    size_t span = b->span < b->bytes ? b->span : b->bytes;
    CUdeviceptr dsend = (CUdeviceptr)(uintptr_t)b->dsend, drecv = (CUdeviceptr)(uintptr_t)b->drecv;
    const char *what = to_device ? "cuMemcpyHtoDAsync" : "cuStreamSynchronize";
    CUresult err = CUDA_SUCCESS;
    if (to_device) {
        err = cu->memcpy_htod_async(dsend, b->send, span, stream);
        if (err == CUDA_SUCCESS)
            err = cu->memcpy_htod_async(drecv, b->recv, span, stream);
    } else {
        err = cu->stream_synchronize(stream);
        if (err == CUDA_SUCCESS) {
            what = "cuMemcpyDtoHAsync";
            err = cu->memcpy_dtoh_async(b->send, dsend, span, stream);
        }
        if (err == CUDA_SUCCESS)
            err = cu->memcpy_dtoh_async(b->recv, drecv, span, stream);
        if (err == CUDA_SUCCESS) {
            what = "cuStreamSynchronize";
            err = cu->stream_synchronize(stream);
        }
    }
    if (err != CUDA_SUCCESS) {
        const char *name = NULL;
        cu->get_error_name(err, &name);
        cfx_test_fail(ctx, __FILE__, __LINE__, "%s: %s of %zu bytes %s the device: %s (%d)", desc,
                      what, span, to_device ? "to" : "from", name ? name : "?", (int)err);
        return 0;
    }
    return 1;
}

static void bufs_close_gpu(struct ctx_bufs *b)
{
    if (b->gpu.cu == NULL)
        return;
    cfx_test_gpu_free(&b->gpu, b->dsend);
    cfx_test_gpu_free(&b->gpu, b->drecv);
    cfx_test_gpu_close(&b->gpu);
    b->dsend = b->drecv = NULL;
}
#else
#define S(b) ((cfxStream_t)NULL)

static int bufs_open_gpu(struct cfx_test_rank *ctx, struct ctx_bufs *b)
{
    (void)b;
    cfx_test_fail(ctx, __FILE__, __LINE__, "device buffers in a build without CUDA");
    return 0;
}

static int bufs_copy(struct cfx_test_rank *ctx, struct ctx_bufs *b, int to_device, const char *desc)
{
    (void)ctx;
    (void)b;
    (void)to_device;
    (void)desc;
    return 1;
}

static void bufs_close_gpu(struct ctx_bufs *b)
{
    (void)b;
}
#endif

/* A call that must succeed. With buffers @p b on the device, span bytes of
 * both go there first, and after the call (and its stream) back, so the
 * checks read the host buffers in both kinds. */
#define CALL_ON(ctx, b, desc, call)                                                                \
    do {                                                                                           \
        if (!bufs_copy((ctx), (b), 1, (desc)))                                                     \
            return;                                                                                \
        cfxResult_t call_res_ = (call);                                                            \
        RANK_ASSERT(ctx, call_res_ == cfxSuccess, "%s: %s: %s", desc,                              \
                    cfxGetErrorString(call_res_), cfxGetLastError(comm));                          \
        if (!bufs_copy((ctx), (b), 0, (desc)))                                                     \
            return;                                                                                \
    } while (0)
/* A call on host buffers. */
#define CALL(ctx, desc, call) CALL_ON(ctx, (struct ctx_bufs *)NULL, desc, call)

/* ---------------------------------------------------------------- reductions */

static void run_allreduce(struct cfx_test_rank *ctx, cfxComm_t comm, struct ctx_bufs *b)
{
    int n = ctx->nranks, r = ctx->rank;
    for (int t = 0; t < cfxNumTypes; t++)
        for (int op = 0; op < cfxNumOps; op++)
            for (size_t c = 0; c < 5; c++) {
                size_t count = c < 4 ? small_counts[c] : LARGE_COUNT;
                if (c == 4 && !large_for((cfxDataType_t)t, (cfxRedOp_t)op))
                    continue;
                for (int in_place = 0; in_place < 2; in_place++) {
                    char desc[128];
                    snprintf(desc, sizeof(desc), "allreduce %s %s count %zu %s", type_names[t],
                             op_names[op], count, in_place ? "in place" : "out of place");
                    cfx_test_step(ctx, "%s", desc);
                    int seed = (int)(t * 31 + op * 7 + c);
                    ref_fill((cfxDataType_t)t, (cfxRedOp_t)op, r, seed, b->send, count);
                    memset(b->recv, 0xee, count * ref_size((cfxDataType_t)t) + 8);
                    char *out = in_place ? b->send : b->recv;
                    b->span = count * ref_size((cfxDataType_t)t) + 64;
                    CALL_ON(ctx, b, desc,
                            cfxAllReduce(D(b, b->send), D(b, out), count, (cfxDataType_t)t,
                                         (cfxRedOp_t)op, comm, S(b)));
                    for (size_t i = 0; i < count; i++) {
                        double v;
                        uint64_t bits;
                        ref_reduce((cfxDataType_t)t, (cfxRedOp_t)op, n, i, seed, &v, &bits);
                        RANK_ASSERT(ctx,
                                    ref_matches((cfxDataType_t)t, (cfxRedOp_t)op,
                                                out + i * ref_size((cfxDataType_t)t), v, bits),
                                    "%s: element %zu wrong (expected %g)", desc, i, v);
                    }
                    if (!in_place)
                        RANK_ASSERT(
                            ctx, (unsigned char)b->recv[count * ref_size((cfxDataType_t)t)] == 0xee,
                            "%s: wrote past the end of recvbuff", desc);
                }
            }
}

static void run_reduce(struct cfx_test_rank *ctx, cfxComm_t comm, struct ctx_bufs *b)
{
    int n = ctx->nranks, r = ctx->rank;
    for (int t = 0; t < cfxNumTypes; t++)
        for (int op = 0; op < cfxNumOps; op++)
            for (size_t c = 0; c < 5; c++) {
                size_t count = c < 4 ? small_counts[c] : LARGE_COUNT;
                if (c == 4 && !large_for((cfxDataType_t)t, (cfxRedOp_t)op))
                    continue;
                for (int root = 0; root < n; root++) {
                    if (c >= 2 && root != 0 && root != n - 1)
                        continue;
                    int in_place = (root + (int)c) % 2;
                    char desc[128];
                    snprintf(desc, sizeof(desc), "reduce %s %s count %zu root %d %s", type_names[t],
                             op_names[op], count, root, in_place ? "in place" : "out of place");
                    cfx_test_step(ctx, "%s", desc);
                    int seed = (int)(t * 31 + op * 7 + c + (size_t)root * 3);
                    size_t bytes = count * ref_size((cfxDataType_t)t);
                    ref_fill((cfxDataType_t)t, (cfxRedOp_t)op, r, seed, b->send, count);
                    memset(b->recv, 0xee, bytes + 8);
                    char *out = in_place ? b->send : b->recv;
                    b->span = bytes + 64;
                    CALL_ON(ctx, b, desc,
                            cfxReduce(D(b, b->send), D(b, out), count, (cfxDataType_t)t,
                                      (cfxRedOp_t)op, root, comm, S(b)));
                    if (r != root) {
                        /* Non-roots keep their input and their untouched recvbuff. */
                        RANK_ASSERT(ctx,
                                    bytes == 0 || (unsigned char)b->recv[0] == 0xee || in_place,
                                    "%s: a non-root recvbuff was written", desc);
                        continue;
                    }
                    for (size_t i = 0; i < count; i++) {
                        double v;
                        uint64_t bits;
                        ref_reduce((cfxDataType_t)t, (cfxRedOp_t)op, n, i, seed, &v, &bits);
                        RANK_ASSERT(ctx,
                                    ref_matches((cfxDataType_t)t, (cfxRedOp_t)op,
                                                out + i * ref_size((cfxDataType_t)t), v, bits),
                                    "%s: element %zu wrong (expected %g)", desc, i, v);
                    }
                }
            }
}

static void run_reducescatter(struct cfx_test_rank *ctx, cfxComm_t comm, struct ctx_bufs *b)
{
    int n = ctx->nranks, r = ctx->rank;
    for (int t = 0; t < cfxNumTypes; t++)
        for (int op = 0; op < cfxNumOps; op++)
            for (size_t c = 0; c < 5; c++) {
                size_t count = c < 4 ? small_counts[c] : LARGE_COUNT / 4;
                if (c == 4 && !large_for((cfxDataType_t)t, (cfxRedOp_t)op))
                    continue;
                for (int in_place = 0; in_place < 2; in_place++) {
                    char desc[128];
                    snprintf(desc, sizeof(desc), "reducescatter %s %s recvcount %zu %s",
                             type_names[t], op_names[op], count,
                             in_place ? "in place" : "out of place");
                    cfx_test_step(ctx, "%s", desc);
                    size_t es = ref_size((cfxDataType_t)t);
                    int seed = (int)(t * 31 + op * 7 + c);
                    /* Element j of the full vector is element j of the reference. */
                    ref_fill((cfxDataType_t)t, (cfxRedOp_t)op, r, seed, b->send, count * (size_t)n);
                    memset(b->recv, 0xee, count * es + 8);
                    char *out = in_place ? b->send + (size_t)r * count * es : b->recv;
                    b->span = count * es * (size_t)n + 64;
                    CALL_ON(ctx, b, desc,
                            cfxReduceScatter(D(b, b->send), D(b, out), count, (cfxDataType_t)t,
                                             (cfxRedOp_t)op, comm, S(b)));
                    for (size_t i = 0; i < count; i++) {
                        double v;
                        uint64_t bits;
                        ref_reduce((cfxDataType_t)t, (cfxRedOp_t)op, n, (size_t)r * count + i, seed,
                                   &v, &bits);
                        RANK_ASSERT(
                            ctx,
                            ref_matches((cfxDataType_t)t, (cfxRedOp_t)op, out + i * es, v, bits),
                            "%s: element %zu wrong (expected %g)", desc, i, v);
                    }
                    if (!in_place)
                        RANK_ASSERT(ctx, (unsigned char)b->recv[count * es] == 0xee,
                                    "%s: wrote past the end of recvbuff", desc);
                }
            }
}

/* ------------------------------------------------------------- data movement */

/* Byte pattern of (rank, i): copies are checked bit for bit. */
static unsigned char pattern(int rank, size_t i, int seed)
{
    return (unsigned char)(rank * 131 + i * 7 + (size_t)seed * 13 + (i >> 9));
}

static const cfxDataType_t move_types[] = {cfxInt8, cfxFloat16, cfxFloat32, cfxFloat64};

static void run_broadcast(struct cfx_test_rank *ctx, cfxComm_t comm, struct ctx_bufs *b)
{
    int n = ctx->nranks, r = ctx->rank;
    for (size_t ti = 0; ti < sizeof(move_types) / sizeof(move_types[0]); ti++)
        for (size_t c = 0; c < 5; c++) {
            cfxDataType_t t = move_types[ti];
            size_t count = c < 4 ? small_counts[c] : LARGE_COUNT;
            size_t bytes = count * ref_size(t);
            for (int root = 0; root < n; root++) {
                if (c >= 2 && root != 0 && root != n - 1)
                    continue;
                for (int in_place = 0; in_place < 2; in_place++) {
                    char desc[128];
                    snprintf(desc, sizeof(desc), "broadcast %s count %zu root %d %s", type_names[t],
                             count, root, in_place ? "in place" : "out of place");
                    cfx_test_step(ctx, "%s", desc);
                    int seed = (int)(c + ti * 5);
                    for (size_t i = 0; i < bytes; i++)
                        b->send[i] = (char)pattern(r, i, seed);
                    memset(b->recv, 0xee, bytes + 8);
                    char *out = in_place ? b->send : b->recv;
                    b->span = bytes + 64;
                    CALL_ON(ctx, b, desc,
                            in_place ? cfxBcast(D(b, b->send), count, t, root, comm, S(b))
                                     : cfxBroadcast(D(b, b->send), D(b, b->recv), count, t, root,
                                                    comm, S(b)));
                    for (size_t i = 0; i < bytes; i++)
                        RANK_ASSERT(ctx, (unsigned char)out[i] == pattern(root, i, seed),
                                    "%s: byte %zu wrong", desc, i);
                    RANK_ASSERT(ctx, in_place || (unsigned char)b->recv[bytes] == 0xee,
                                "%s: wrote past the end", desc);
                }
            }
        }
    /* Large enough for the root's non-temporal output stores, with buffers
     * off every alignment the stores need. */
    size_t count = ((size_t)8 << 20) + 11;
    char *send = b->send + 5, *recv = b->recv + 3;
    const char *desc = "broadcast int8, 8 MiB + 11, unaligned buffers, out of place";
    cfx_test_step(ctx, "%s", desc);
    for (size_t i = 0; i < count; i++)
        send[i] = (char)pattern(r, i, 99);
    memset(b->recv, 0xee, count + 16);
    b->span = count + 64;
    CALL_ON(ctx, b, desc, cfxBroadcast(D(b, send), D(b, recv), count, cfxInt8, n - 1, comm, S(b)));
    for (size_t i = 0; i < count; i++)
        RANK_ASSERT(ctx, (unsigned char)recv[i] == pattern(n - 1, i, 99), "%s: byte %zu wrong",
                    desc, i);
    RANK_ASSERT(ctx, (unsigned char)b->recv[2] == 0xee && (unsigned char)recv[count] == 0xee,
                "%s: wrote outside the buffer", desc);
}

static void run_allgather(struct cfx_test_rank *ctx, cfxComm_t comm, struct ctx_bufs *b)
{
    int n = ctx->nranks, r = ctx->rank;
    for (size_t ti = 0; ti < sizeof(move_types) / sizeof(move_types[0]); ti++)
        for (size_t c = 0; c < 5; c++) {
            cfxDataType_t t = move_types[ti];
            size_t count = c < 4 ? small_counts[c] : LARGE_COUNT / 4;
            size_t block = count * ref_size(t);
            for (int in_place = 0; in_place < 2; in_place++) {
                char desc[128];
                snprintf(desc, sizeof(desc), "allgather %s sendcount %zu %s", type_names[t], count,
                         in_place ? "in place" : "out of place");
                cfx_test_step(ctx, "%s", desc);
                int seed = (int)(c + ti * 5);
                memset(b->recv, 0xee, block * (size_t)n + 8);
                char *src = in_place ? b->recv + (size_t)r * block : b->send;
                for (size_t i = 0; i < block; i++)
                    src[i] = (char)pattern(r, i, seed);
                b->span = block * (size_t)n + 64;
                CALL_ON(ctx, b, desc, cfxAllGather(D(b, src), D(b, b->recv), count, t, comm, S(b)));
                for (int q = 0; q < n; q++)
                    for (size_t i = 0; i < block; i++)
                        RANK_ASSERT(ctx,
                                    (unsigned char)b->recv[(size_t)q * block + i] ==
                                        pattern(q, i, seed),
                                    "%s: byte %zu of rank %d's block wrong", desc, i, q);
                RANK_ASSERT(ctx, (unsigned char)b->recv[block * (size_t)n] == 0xee,
                            "%s: wrote past the end", desc);
            }
        }
}

/* Every rank sends a distinct block to every rank (itself included) in one
 * group, receives in the opposite order: an all-to-all that would deadlock
 * if a group's sends and receives did not progress together. */
static void run_sendrecv(struct cfx_test_rank *ctx, cfxComm_t comm, struct ctx_bufs *b)
{
    int n = ctx->nranks, r = ctx->rank;
    for (size_t c = 0; c < 5; c++) {
        size_t count = c < 4 ? small_counts[c] : LARGE_COUNT / 8;
        size_t bytes = count * 4;
        char desc[128];
        snprintf(desc, sizeof(desc), "all-to-all send/recv of %zu float32 per pair", count);
        cfx_test_step(ctx, "%s", desc);
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < bytes; i++)
                b->send[(size_t)q * bytes + i] = (char)pattern(r * 64 + q, i, (int)c);
        memset(b->recv, 0xee, bytes * (size_t)n);
        b->span = bytes * (size_t)n + 64;
        CALL_ON(ctx, b, desc, cfxGroupStart());
        for (int k = 0; k < n; k++) {
            int to = (r + k) % n, from = (r - k + n) % n;
            CALL_ON(
                ctx, b, desc,
                cfxRecv(D(b, b->recv + (size_t)from * bytes), count, cfxFloat32, from, comm, S(b)));
            CALL_ON(ctx, b, desc,
                    cfxSend(D(b, b->send + (size_t)to * bytes), count, cfxFloat32, to, comm, S(b)));
        }
        CALL_ON(ctx, b, desc, cfxGroupEnd());
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < bytes; i++)
                RANK_ASSERT(ctx,
                            (unsigned char)b->recv[(size_t)q * bytes + i] ==
                                pattern(q * 64 + r, i, (int)c),
                            "%s: byte %zu from rank %d wrong", desc, i, q);
    }
    /* Outside a group, a plain ring exchange: even ranks send first. The
     * ints are on the stack, or on device buffers the first bytes of send
     * and recv. */
    if (n > 1) {
        int next = (r + 1) % n, prev = (r + n - 1) % n;
        int out_int, in_int;
        int *out = on_device(b) ? (int *)b->send : &out_int;
        int *in = on_device(b) ? (int *)b->recv : &in_int;
        *out = r * 1000 + 1;
        *in = -1;
        b->span = 64;
        cfx_test_step(ctx, "blocking send/recv ring");
        if (r % 2 == 0) {
            CALL_ON(ctx, b, "send", cfxSend(D(b, out), 1, cfxInt32, next, comm, S(b)));
            CALL_ON(ctx, b, "recv", cfxRecv(D(b, in), 1, cfxInt32, prev, comm, S(b)));
        } else {
            CALL_ON(ctx, b, "recv", cfxRecv(D(b, in), 1, cfxInt32, prev, comm, S(b)));
            CALL_ON(ctx, b, "send", cfxSend(D(b, out), 1, cfxInt32, next, comm, S(b)));
        }
        RANK_ASSERT(ctx, *in == prev * 1000 + 1, "ring exchange got %d", *in);
    }
}

typedef void (*coll_fn)(struct cfx_test_rank *, cfxComm_t, struct ctx_bufs *);
static const coll_fn coll_fns[] = {run_allreduce,     run_reduce,    run_broadcast, run_allgather,
                                   run_reducescatter, run_sendrecv,  run_allreduce, run_reduce,
                                   run_broadcast,     run_allreduce, run_reduce,    run_broadcast};

/* Every process claims its own host: sockets between all ranks, and the
 * planner builds real binary trees across "hosts". Runs before the rank makes
 * or uses anything of Conflux's (no thread may read the environment yet). */
static void claim_own_host(struct cfx_test_rank *ctx)
{
    char host[32];
    snprintf(host, sizeof(host), "simulated-host-%d", ctx->rank);
    cfx_test_setenv("CFX_HOSTID", host);
}

/* On device buffers the rank opens its GPU before init, which makes it a
 * GPU rank. */
static void conformance_rank(struct cfx_test_rank *ctx)
{
    const struct suite_case *sc = ctx->arg;
    struct ctx_bufs b;
    RANK_ASSERT(ctx, bufs_init(&b, ctx->nranks), "out of memory");
    if (sc->mem == DEVICE_MEM && !bufs_open_gpu(ctx, &b))
        return;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    if (sc->mem == DEVICE_MEM && ctx->nranks > 1 && comm->ring_send != NULL) {
        /* GPU ranks of one host: the transport the case names. */
        const char *want = sc->transport == P2P ? "p2p" : "shm";
        const char *got = comm->ring_send->transport->name;
        RANK_ASSERT(ctx, strcmp(got, want) == 0, "the ring's connection went over %s, not %s", got,
                    want);
    }
    if ((sc->transport == NET_PLUGIN || sc->transport == NET_BUILTIN ||
         sc->transport == NET_BUILTIN_IB) &&
        ctx->nranks > 1 && comm->ring_send != NULL) {
        /* Every rank its own host: the net-plugin transport, whichever net. */
        const char *got = comm->ring_send->transport->name;
        RANK_ASSERT(ctx, strcmp(got, "net-plugin") == 0,
                    "the ring's connection went over %s, not net-plugin", got);
    }
    coll_fns[sc->coll](ctx, comm, &b);
    if (sc->allreduce_algo && !ctx->slot_failed) {
        /* The forced algorithm ran over the all-pairs connectors. */
        struct cfx_connector *to = comm->direct.to[(ctx->rank + 1) % ctx->nranks];
        RANK_ASSERT(ctx, to != NULL, "no all-pairs connector: the allreduces did not go %s",
                    sc->allreduce_algo == 1 ? "one-shot" : "two-shot");
        const char *want = sc->transport == P2P ? "p2p" : "shm";
        RANK_ASSERT(ctx, to == NULL || strcmp(to->transport->name, want) == 0,
                    "the all-pairs connector went over %s, not %s", to ? to->transport->name : "-",
                    want);
    }
    if (!ctx->slot_failed) {
        RANK_CFX(ctx, cfxCommFinalize(comm));
    }
    cfxCommDestroy(comm);
    bufs_close_gpu(&b);
    free(b.send);
    free(b.recv);
}

#define N_CASES (2 * 5 * 2 * N_COLLS + 4 * 3 * N_COLLS + (5 + 2 + 3 + 2) * N_COLLS + 6)
static struct suite_case all_cases[N_CASES];

ParameterizedTestParameters(conformance, collective)
{
    static const int ranks[] = {1, 2, 3, 4, 8};
    int k = 0;
    for (int tr = 0; tr < 2; tr++)
        for (int ri = 0; ri < 5; ri++)
            for (int m = 0; m < 2; m++)
                for (int c = 0; c < N_COLLS; c++) {
                    /* One host per rank needs processes (threads share CFX_HOSTID),
                     * and it is sockets whatever the transport setting: once. */
                    if (one_host_per_rank((enum coll)c) && (m == CFX_TEST_THREADS || tr == SOCKET))
                        continue;
                    all_cases[k++] = (struct suite_case){.transport = (enum transport)tr,
                                                         .nranks = ranks[ri],
                                                         .mode = (enum cfx_test_mode)m,
                                                         .coll = (enum coll)c};
                }
    /* Over verbs and the net-plugin transport: processes, one host each, so
     * the tree cases are the across-hosts ones already. */
    static const int ib_ranks[] = {2, 3, 8};
    static const enum transport net_transports[] = {IB, NET_PLUGIN, NET_BUILTIN, NET_BUILTIN_IB};
    for (int t = 0; t < 4; t++)
        for (int ri = 0; ri < 3; ri++)
            for (int c = 0; c <= BROADCAST_TREE; c++)
                all_cases[k++] = (struct suite_case){.transport = net_transports[t],
                                                     .nranks = ib_ranks[ri],
                                                     .mode = CFX_TEST_PROCS,
                                                     .coll = (enum coll)c};
    /* On device buffers: p2p (slots in the receiver's device memory; IPC
     * between processes), every rank on one GPU, 2 and 4 ranks as
     * processes; the trees on one host only (one host per rank is
     * sockets). Then shm (CFX_P2P_DISABLE=1: FIFOs in pinned host memory of
     * its segments) at 2 and 4 threads and 2 processes. And p2p in read mode
     * (the receivers' kernels read the senders' slots) at 3 threads and 3
     * processes. */
    for (int ri = 0; ri < 5; ri++)
        for (int m = 0; m < 2; m++)
            for (int c = 0; c <= BROADCAST_TREE; c++) {
                if (ranks[ri] == 3)
                    all_cases[k++] = (struct suite_case){.transport = P2P,
                                                         .nranks = 3,
                                                         .mode = (enum cfx_test_mode)m,
                                                         .coll = (enum coll)c,
                                                         .mem = DEVICE_MEM,
                                                         .p2p_read = 1};
                if (m == CFX_TEST_PROCS && ranks[ri] != 2 && ranks[ri] != 4)
                    continue;
                all_cases[k++] = (struct suite_case){.transport = P2P,
                                                     .nranks = ranks[ri],
                                                     .mode = (enum cfx_test_mode)m,
                                                     .coll = (enum coll)c,
                                                     .mem = DEVICE_MEM};
                if (ranks[ri] == 2 || (ranks[ri] == 4 && m == CFX_TEST_THREADS))
                    all_cases[k++] = (struct suite_case){.transport = SHM,
                                                         .nranks = ranks[ri],
                                                         .mode = (enum cfx_test_mode)m,
                                                         .coll = (enum coll)c,
                                                         .mem = DEVICE_MEM};
            }
    /* The one-shot and two-shot allreduces on device buffers, forced: 4
     * threads and 3 processes over p2p, 3 threads over shm. */
    for (int algo = 1; algo <= 2; algo++) {
        all_cases[k++] = (struct suite_case){.transport = P2P,
                                             .nranks = 4,
                                             .mode = CFX_TEST_THREADS,
                                             .coll = ALLREDUCE,
                                             .mem = DEVICE_MEM,
                                             .allreduce_algo = algo};
        all_cases[k++] = (struct suite_case){.transport = P2P,
                                             .nranks = 3,
                                             .mode = CFX_TEST_PROCS,
                                             .coll = ALLREDUCE,
                                             .mem = DEVICE_MEM,
                                             .allreduce_algo = algo};
        all_cases[k++] = (struct suite_case){.transport = SHM,
                                             .nranks = 3,
                                             .mode = CFX_TEST_THREADS,
                                             .coll = ALLREDUCE,
                                             .mem = DEVICE_MEM,
                                             .allreduce_algo = algo};
    }
    return cr_make_param_array(struct suite_case, all_cases, (size_t)k);
}

/* The fake NIC of tests/fakeverbs for every connection between hosts, or a
 * skip saying why there is none. */
static void use_fakeverbs(void)
{
    if (cfx_test_use_fakeverbs() == NULL)
        cr_skip_test("no fake-verbs library (CFX_TEST_FAKEVERBS unset: built without the verbs "
                     "headers?)");
}

/* The test net plugin of tests/netplugin for every connection between
 * hosts, or a skip saying why there is none. */
static void use_net_plugin(void)
{
    const char *lib = getenv("CFX_TEST_NET_PLUGIN");
    if (lib == NULL || lib[0] == '\0')
        cr_skip_test("no test net plugin (CFX_TEST_NET_PLUGIN unset: run through ctest)");
    cfx_test_setenv("CFX_NET_PLUGIN", lib);
}

static const char *const transport_names[] = {"shm",
                                              "socket",
                                              "verbs (fake-verbs)",
                                              "net-plugin (cfxtest)",
                                              "p2p",
                                              "net-plugin (builtin:socket)",
                                              "net-plugin (builtin:ib, fake-verbs)"};

ParameterizedTest(struct suite_case *sc, conformance, collective, .timeout = 900)
{
    /* Device buffers: the driver (the GPU, or fake-cuda) for the ranks. */
    const char *why = NULL, *driver = NULL;
    char where[64] = "";
    if (sc->mem == DEVICE_MEM) {
        driver = cfx_test_use_cuda(&why);
        snprintf(where, sizeof(where), " on device buffers (%s)",
                 driver ? driver : "no CUDA driver");
    }
    static const char *const algos[] = {"", " (one-shot)", " (two-shot)"};
    cr_log_info("%s%s over %s%s, %d ranks as %s%s", coll_names[sc->coll], algos[sc->allreduce_algo],
                transport_names[sc->transport], sc->p2p_read ? " (read mode)" : "", sc->nranks,
                sc->mode == CFX_TEST_PROCS ? "processes" : "threads", where);
    if (sc->mem == DEVICE_MEM && driver == NULL)
        cr_skip_test("%s", why);
    const char *device_only = getenv("CFX_TEST_DEVICE_ONLY");
    if (sc->mem == HOST_MEM && device_only != NULL && strcmp(device_only, "1") == 0)
        cr_skip_test("host buffers: CFX_TEST_DEVICE_ONLY=1 (scripts/gpu_check.sh)");
    cfx_test_setenv("CFX_MULTI_RANK_GPU_ENABLE", sc->mem == DEVICE_MEM ? "1" : NULL);
    if (sc->transport == IB)
        use_fakeverbs();
    if (sc->transport == NET_PLUGIN)
        use_net_plugin();
    if (sc->transport == NET_BUILTIN)
        cfx_test_setenv("CFX_NET_PLUGIN", "builtin:socket");
    if (sc->transport == NET_BUILTIN_IB) {
        use_fakeverbs(); /* Sets CFX_NET=IB, which names this net too. */
        cfx_test_setenv("CFX_NET_PLUGIN", "builtin:ib");
    }
    cfx_test_setenv("CFX_SHM_DISABLE", sc->transport == SOCKET ? "1" : NULL);
    /* GPU ranks of one host go over p2p unless it is off. */
    cfx_test_setenv("CFX_P2P_DISABLE", sc->transport == SHM ? "1" : NULL);
    cfx_test_setenv("CFX_P2P_READ_ENABLE", sc->p2p_read ? "1" : NULL);
    static const char *const algo_settings[] = {NULL, "allreduce:direct", "allreduce:twoshot"};
    cfx_test_setenv("CFX_ALGO", on_trees(sc->coll) ? "tree" : algo_settings[sc->allreduce_algo]);
    struct cfx_test_options opts = {
        .nranks = sc->nranks,
        .mode = sc->mode,
        .deadline_s = 600,
        .arg = sc,
        .before_rank = one_host_per_rank(sc->coll) || sc->transport == IB ||
                               sc->transport == NET_PLUGIN || sc->transport == NET_BUILTIN ||
                               sc->transport == NET_BUILTIN_IB
                           ? claim_own_host
                           : NULL};
    CFX_TEST_RUN(&opts, conformance_rank);
}

/* ------------------------------------------------- one algorithm at every count */

struct algo_case {
    enum transport transport;
    int nranks;
    enum cfx_test_mode mode;
    int direct; /* CFX_ALGO=direct, else CFX_ALGO=ring (a flag: parameters hold no pointers). */
};

/* Inexact float inputs: the result depends on the order of the fold. */
static double inexact_input(int rank, size_t i)
{
    double v = 0.1 + rank * 1.37 + (double)i * 0.013;
    return (rank + i) % 3 == 0 ? -v : v;
}

/* Direct allreduce of float32 and float64 values whose sum rounds: every
 * rank must hold x0 + x1 + ... + x(n-1) folded left to right, bit for bit,
 * in and out of place, in one slot and over several. */
static void run_rank_order_fold(struct cfx_test_rank *ctx, cfxComm_t comm, struct ctx_bufs *b)
{
    int n = ctx->nranks, r = ctx->rank;
    static const size_t counts[] = {1, 1027, 40000};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
        for (int dbl = 0; dbl < 2; dbl++)
            for (int in_place = 0; in_place < 2; in_place++) {
                size_t count = counts[c];
                char desc[128];
                snprintf(desc, sizeof(desc), "rank-order fold %s count %zu %s",
                         dbl ? "float64" : "float32", count,
                         in_place ? "in place" : "out of place");
                cfx_test_step(ctx, "%s", desc);
                for (size_t i = 0; i < count; i++) {
                    if (dbl)
                        ((double *)b->send)[i] = inexact_input(r, i);
                    else
                        ((float *)b->send)[i] = (float)inexact_input(r, i);
                }
                char *out = in_place ? b->send : b->recv;
                CALL(ctx, desc,
                     cfxAllReduce(b->send, out, count, dbl ? cfxFloat64 : cfxFloat32, cfxSum, comm,
                                  NULL));
                for (size_t i = 0; i < count; i++) {
                    if (dbl) {
                        double acc = inexact_input(0, i), got;
                        for (int q = 1; q < n; q++)
                            acc = acc + inexact_input(q, i);
                        memcpy(&got, out + i * 8, 8);
                        RANK_ASSERT(ctx, memcmp(&acc, &got, 8) == 0,
                                    "%s: element %zu is %.17g, the rank-order fold gives %.17g",
                                    desc, i, got, acc);
                    } else {
                        float acc = (float)inexact_input(0, i), got;
                        for (int q = 1; q < n; q++)
                            acc = acc + (float)inexact_input(q, i);
                        memcpy(&got, out + i * 4, 4);
                        RANK_ASSERT(ctx, memcmp(&acc, &got, 4) == 0,
                                    "%s: element %zu is %.9g, the rank-order fold gives %.9g", desc,
                                    i, (double)got, (double)acc);
                    }
                }
            }
}

/* Several direct allreduces (one of them in place, one empty) and a ring of
 * sends and receives in one group. */
static void run_direct_in_group(struct cfx_test_rank *ctx, cfxComm_t comm, struct ctx_bufs *b)
{
    int n = ctx->nranks, r = ctx->rank;
    const char *desc = "group of direct allreduces and send/recv";
    cfx_test_step(ctx, "%s", desc);
    int32_t *a = (int32_t *)b->send, *a_out = (int32_t *)b->recv;
    int32_t *c = a + 64, *d = a + 128, *token_out = a + 192, *token_in = a + 193;
    for (int i = 0; i < 64; i++) {
        a[i] = r + i;
        c[i] = r * 2;
        d[i] = 1;
    }
    *token_out = 1000 + r;
    *token_in = -1;
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    CALL(ctx, desc, cfxGroupStart());
    CALL(ctx, desc, cfxAllReduce(a, a_out, 64, cfxInt32, cfxSum, comm, NULL));
    if (n > 1) {
        CALL(ctx, desc, cfxSend(token_out, 1, cfxInt32, next, comm, NULL));
        CALL(ctx, desc, cfxRecv(token_in, 1, cfxInt32, prev, comm, NULL));
    }
    CALL(ctx, desc, cfxAllReduce(c, c, 64, cfxInt32, cfxMax, comm, NULL));
    CALL(ctx, desc, cfxAllReduce(d, d, 0, cfxInt32, cfxSum, comm, NULL));
    CALL(ctx, desc, cfxGroupEnd());
    for (int i = 0; i < 64; i++) {
        RANK_ASSERT(ctx, a_out[i] == n * (n - 1) / 2 + n * i, "%s: sum[%d] = %d", desc, i,
                    a_out[i]);
        RANK_ASSERT(ctx, c[i] == (n - 1) * 2, "%s: max[%d] = %d", desc, i, c[i]);
        RANK_ASSERT(ctx, d[i] == 1, "%s: an empty allreduce wrote its buffer", desc);
    }
    RANK_ASSERT(ctx, n == 1 || *token_in == 1000 + prev, "%s: received %d from rank %d", desc,
                *token_in, prev);
}

static void algo_rank(struct cfx_test_rank *ctx)
{
    const struct algo_case *ac = ctx->arg;
    int direct = ac->direct;
    struct ctx_bufs b;
    RANK_ASSERT(ctx, bufs_init(&b, ctx->nranks), "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    struct cfx_direct_links first = {{NULL}, {NULL}};
    if (direct) {
        run_direct_in_group(ctx, comm, &b);
        first = comm->direct;
        for (int q = 0; q < ctx->nranks && !ctx->slot_failed; q++)
            RANK_ASSERT(ctx, (q == ctx->rank) == (first.to[q] == NULL && first.from[q] == NULL),
                        "after the first direct call rank %d has %s connectors with rank %d",
                        ctx->rank, first.to[q] ? "" : "no", q);
    }
    if (!ctx->slot_failed)
        run_allreduce(ctx, comm, &b);
    if (direct && !ctx->slot_failed)
        run_rank_order_fold(ctx, comm, &b);
    if (direct && !ctx->slot_failed)
        RANK_ASSERT(ctx, memcmp(&first, &comm->direct, sizeof(first)) == 0,
                    "the direct connectors were rebuilt after the first call");
    if (!ctx->slot_failed) {
        RANK_CFX(ctx, cfxCommFinalize(comm));
    }
    cfxCommDestroy(comm);
    free(b.send);
    free(b.recv);
}

#define N_ALGO_CASES (2 * 6 * 2)
static struct algo_case direct_cases[N_ALGO_CASES], ring_cases[N_ALGO_CASES];

static size_t algo_cases(struct algo_case *cases, int direct)
{
    static const int ranks[] = {1, 2, 3, 4, 5, 8};
    size_t k = 0;
    for (int tr = 0; tr < 2; tr++)
        for (int ri = 0; ri < 6; ri++)
            for (int m = 0; m < 2; m++)
                cases[k++] = (struct algo_case){.transport = (enum transport)tr,
                                                .nranks = ranks[ri],
                                                .mode = (enum cfx_test_mode)m,
                                                .direct = direct};
    return k;
}

static void run_algo_case(const struct algo_case *ac)
{
    const char *algo = ac->direct ? "direct" : "ring";
    cr_log_info("allreduce with CFX_ALGO=%s over %s, %d ranks as %s", algo,
                ac->transport == SHM ? "shm" : "socket", ac->nranks,
                ac->mode == CFX_TEST_PROCS ? "processes" : "threads");
    cfx_test_setenv("CFX_SHM_DISABLE", ac->transport == SOCKET ? "1" : NULL);
    cfx_test_setenv("CFX_ALGO", algo);
    struct cfx_test_options opts = {
        .nranks = ac->nranks, .mode = ac->mode, .deadline_s = 600, .arg = (void *)ac};
    CFX_TEST_RUN(&opts, algo_rank);
}

ParameterizedTestParameters(direct, allreduce)
{
    size_t k = algo_cases(direct_cases, 1);
    return cr_make_param_array(struct algo_case, direct_cases, k);
}

ParameterizedTest(struct algo_case *ac, direct, allreduce, .timeout = 900)
{
    run_algo_case(ac);
}

ParameterizedTestParameters(ring, allreduce)
{
    size_t k = algo_cases(ring_cases, 0);
    return cr_make_param_array(struct algo_case, ring_cases, k);
}

ParameterizedTest(struct algo_case *ac, ring, allreduce, .timeout = 900)
{
    run_algo_case(ac);
}

/* ------------------------------------------------ single-copy allgather */

struct single_copy_case {
    enum transport transport;
    int nranks;
    enum cfx_test_mode mode;
    int off; /* CFX_SINGLE_COPY=0: 1 on every rank, 2 on the last rank only. */
    /* CFX_SINGLE_COPY_MIN_BYTES unset: 1 MiB between threads of one
     * process, never between processes. */
    int by_default;
};

/* Runs before the rank reads any parameter: the last rank alone refuses. */
static void last_rank_refuses_single_copy(struct cfx_test_rank *ctx)
{
    if (ctx->rank == ctx->nranks - 1)
        cfx_test_setenv("CFX_SINGLE_COPY", "0");
}

static void single_copy_rank(struct cfx_test_rank *ctx)
{
    const struct single_copy_case *sc = ctx->arg;
    struct ctx_bufs b;
    RANK_ASSERT(ctx, bufs_init(&b, ctx->nranks), "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    int expect = sc->transport == SHM && !sc->off && ctx->nranks > 1 &&
                 !(sc->by_default && sc->mode == CFX_TEST_PROCS);
    RANK_ASSERT(ctx, comm->single_copy == expect,
                "single copy is %s over %s with CFX_SINGLE_COPY=%s on %d ranks%s",
                comm->single_copy ? "on" : "off", sc->transport == SHM ? "shm" : "sockets",
                sc->off == 2 ? "0 on the last rank only" : (sc->off ? "0" : "1"), ctx->nranks,
                sc->by_default ? " by default" : "");
    size_t threshold = sc->by_default ? (size_t)1 << 20 : 1;
    RANK_ASSERT(ctx, !expect || comm->single_copy_min == threshold, "threshold %zu, not %zu",
                comm->single_copy_min, threshold);
    if (!ctx->slot_failed)
        run_allgather(ctx, comm, &b);
    if (!ctx->slot_failed) {
        RANK_CFX(ctx, cfxCommFinalize(comm));
    }
    cfxCommDestroy(comm);
    free(b.send);
    free(b.recv);
}

#define N_SINGLE_COPY_CASES (4 * 2 + 2 + 2 + 1 + 2)
static struct single_copy_case single_copy_cases[N_SINGLE_COPY_CASES];

ParameterizedTestParameters(single_copy, allgather)
{
    static const int ranks[] = {2, 3, 4, 8};
    size_t k = 0;
    for (int ri = 0; ri < 4; ri++)
        for (int m = 0; m < 2; m++)
            single_copy_cases[k++] = (struct single_copy_case){
                .transport = SHM, .nranks = ranks[ri], .mode = (enum cfx_test_mode)m};
    for (int m = 0; m < 2; m++) {
        single_copy_cases[k++] = (struct single_copy_case){
            .transport = SOCKET, .nranks = 3, .mode = (enum cfx_test_mode)m};
        single_copy_cases[k++] = (struct single_copy_case){
            .transport = SHM, .nranks = 3, .mode = (enum cfx_test_mode)m, .off = 1};
    }
    /* Processes: each has an environment of its own. */
    single_copy_cases[k++] =
        (struct single_copy_case){.transport = SHM, .nranks = 3, .mode = CFX_TEST_PROCS, .off = 2};
    for (int m = 0; m < 2; m++)
        single_copy_cases[k++] = (struct single_copy_case){
            .transport = SHM, .nranks = 3, .mode = (enum cfx_test_mode)m, .by_default = 1};
    return cr_make_param_array(struct single_copy_case, single_copy_cases, k);
}

ParameterizedTest(struct single_copy_case *sc, single_copy, allgather, .timeout = 900)
{
    cr_log_info("allgather with CFX_SINGLE_COPY=%s from %s over %s, %d ranks as %s",
                sc->off == 2 ? "0 on the last rank only" : (sc->off ? "0" : "1"),
                sc->by_default ? "the default" : "1 byte", sc->transport == SHM ? "shm" : "socket",
                sc->nranks, sc->mode == CFX_TEST_PROCS ? "processes" : "threads");
    cfx_test_setenv("CFX_SHM_DISABLE", sc->transport == SOCKET ? "1" : NULL);
    cfx_test_setenv("CFX_SINGLE_COPY", sc->off == 1 ? "0" : "1");
    cfx_test_setenv("CFX_SINGLE_COPY_MIN_BYTES", sc->by_default ? NULL : "1");
    struct cfx_test_options opts = {.nranks = sc->nranks,
                                    .mode = sc->mode,
                                    .deadline_s = 600,
                                    .arg = (void *)sc,
                                    .before_rank =
                                        sc->off == 2 ? last_rank_refuses_single_copy : NULL};
    CFX_TEST_RUN(&opts, single_copy_rank);
}

/* ------------------------------------------ single-copy point to point */

/* Sends at least as large as the receiver's threshold (CFX_P2P_SINGLE_COPY_
 * MIN_BYTES) are read by the receiver straight from the sender's buffer
 * (src/coll/pull.h); both sides must pick the same schedule for every
 * message, or the data and the slot numbers go wrong. */
struct p2p_copy_case {
    enum transport transport;
    int nranks;
    enum cfx_test_mode mode;
    /* 0: every send of 1 byte or more single copy (sockets: none);
     * 1: the last rank turns single copy off (CFX_SINGLE_COPY=0);
     * 2: each rank offers its own threshold (p2p_threshold_of);
     * 3: the default (unset): 256 KiB between threads, never between
     *    processes. */
    int variant;
};

static uint64_t p2p_threshold_of(int rank)
{
    return rank == 0 ? 1 : (uint64_t)rank * 300000;
}

/* The threshold a pair with @p receiver as its receive side agreed on. */
static uint64_t p2p_expected(const struct p2p_copy_case *pc, int receiver)
{
    if (pc->transport == SOCKET || (pc->variant == 1 && receiver == pc->nranks - 1))
        return CFX_PULL_NEVER;
    if (pc->variant == 3)
        return pc->mode == CFX_TEST_PROCS ? CFX_PULL_NEVER : 256 * 1024;
    return pc->variant == 2 ? p2p_threshold_of(receiver) : 1;
}

/* Runs before the rank reads any parameter (processes: an environment each). */
static void p2p_copy_env(struct cfx_test_rank *ctx)
{
    const struct p2p_copy_case *pc = ctx->arg;
    char value[32];
    snprintf(value, sizeof(value), "%llu",
             (unsigned long long)(pc->variant == 2 ? p2p_threshold_of(ctx->rank) : 1));
    cfx_test_setenv("CFX_P2P_SINGLE_COPY_MIN_BYTES", pc->variant == 3 ? NULL : value);
    if (pc->variant == 1 && ctx->rank == ctx->nranks - 1)
        cfx_test_setenv("CFX_SINGLE_COPY", "0");
}

/* cfxAlltoAll at counts below, at and above the thresholds, and over
 * several pull chunks (CFX_PULL_CHUNK_BYTES); a different pattern per call. */
static void run_alltoall_sizes(struct cfx_test_rank *ctx, cfxComm_t comm, struct ctx_bufs *b)
{
    static const size_t counts[] = {1, 1000, 74999, 75000, 150001, 600003};
    int n = ctx->nranks, r = ctx->rank;
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        size_t bytes = counts[c] * 4;
        char desc[96];
        snprintf(desc, sizeof(desc), "alltoall of %zu float32 per peer", counts[c]);
        cfx_test_step(ctx, "%s", desc);
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < bytes; i++)
                b->send[(size_t)q * bytes + i] = (char)pattern(r * 64 + q, i, (int)c + 7);
        memset(b->recv, 0xee, bytes * (size_t)n);
        CALL_ON(ctx, b, desc, cfxAlltoAll(b->send, b->recv, counts[c], cfxFloat32, comm, NULL));
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < bytes; i++)
                if ((unsigned char)b->recv[(size_t)q * bytes + i] !=
                    pattern(q * 64 + r, i, (int)c + 7)) {
                    RANK_ASSERT(ctx, 0, "%s: byte %zu from rank %d wrong", desc, i, q);
                    return;
                }
    }
}

static void p2p_copy_rank(struct cfx_test_rank *ctx)
{
    const struct p2p_copy_case *pc = ctx->arg;
    struct ctx_bufs b;
    RANK_ASSERT(ctx, bufs_init(&b, ctx->nranks), "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    if (!ctx->slot_failed)
        run_sendrecv(ctx, comm, &b);
    if (!ctx->slot_failed)
        run_alltoall_sizes(ctx, comm, &b);
    /* Each pair agreed on its receiver's threshold, on both sides. */
    for (int q = 0; q < ctx->nranks && !ctx->slot_failed; q++) {
        if (q == ctx->rank)
            continue;
        struct cfx_connector *to = comm->p2p_send[q], *from = comm->p2p_recv[q];
        RANK_ASSERT(ctx, to && to->pull_min == p2p_expected(pc, q),
                    "the send side to rank %d has threshold %llu, not %llu", q,
                    to ? (unsigned long long)to->pull_min : 0ull,
                    (unsigned long long)p2p_expected(pc, q));
        RANK_ASSERT(ctx, from && from->pull_min == p2p_expected(pc, ctx->rank),
                    "the receive side from rank %d has threshold %llu, not %llu", q,
                    from ? (unsigned long long)from->pull_min : 0ull,
                    (unsigned long long)p2p_expected(pc, ctx->rank));
        /* Host ranks of one host over shm: small FIFOs (CFX_P2P_LOCAL_BUFFSIZE,
         * 1 MiB); over sockets the communicator's. */
        size_t local_slot =
            pc->transport == SHM ? ((size_t)1 << 20) / (size_t)comm->n_steps : comm->slot_bytes;
        RANK_ASSERT(ctx,
                    to && from && to->slot_bytes == local_slot && from->slot_bytes == local_slot,
                    "point-to-point slots to/from rank %d of %zu/%zu bytes, not %zu", q,
                    to ? to->slot_bytes : 0, from ? from->slot_bytes : 0, local_slot);
    }
    if (!ctx->slot_failed) {
        RANK_CFX(ctx, cfxCommFinalize(comm));
    }
    cfxCommDestroy(comm);
    free(b.send);
    free(b.recv);
}

#define N_P2P_COPY_CASES (3 * 2 + 2 + 1 + 1 + 2)
static struct p2p_copy_case p2p_copy_cases[N_P2P_COPY_CASES];

ParameterizedTestParameters(single_copy, point_to_point)
{
    static const int ranks[] = {2, 3, 4};
    size_t k = 0;
    for (int ri = 0; ri < 3; ri++)
        for (int m = 0; m < 2; m++)
            p2p_copy_cases[k++] = (struct p2p_copy_case){
                .transport = SHM, .nranks = ranks[ri], .mode = (enum cfx_test_mode)m};
    for (int m = 0; m < 2; m++)
        p2p_copy_cases[k++] =
            (struct p2p_copy_case){.transport = SOCKET, .nranks = 3, .mode = (enum cfx_test_mode)m};
    /* Processes: each has an environment of its own. */
    p2p_copy_cases[k++] =
        (struct p2p_copy_case){.transport = SHM, .nranks = 3, .mode = CFX_TEST_PROCS, .variant = 1};
    p2p_copy_cases[k++] =
        (struct p2p_copy_case){.transport = SHM, .nranks = 4, .mode = CFX_TEST_PROCS, .variant = 2};
    for (int m = 0; m < 2; m++)
        p2p_copy_cases[k++] = (struct p2p_copy_case){
            .transport = SHM, .nranks = 3, .mode = (enum cfx_test_mode)m, .variant = 3};
    return cr_make_param_array(struct p2p_copy_case, p2p_copy_cases, k);
}

ParameterizedTest(struct p2p_copy_case *pc, single_copy, point_to_point, .timeout = 900)
{
    static const char *variants[] = {"from 1 byte", "off on the last rank",
                                     "from a threshold of each rank's own", "by default"};
    cr_log_info("sends and all-to-all, single copy %s, over %s, %d ranks as %s",
                variants[pc->variant], pc->transport == SHM ? "shm" : "socket", pc->nranks,
                pc->mode == CFX_TEST_PROCS ? "processes" : "threads");
    cfx_test_setenv("CFX_SHM_DISABLE", pc->transport == SOCKET ? "1" : NULL);
    cfx_test_setenv("CFX_SINGLE_COPY", NULL);
    cfx_test_setenv("CFX_P2P_SINGLE_COPY_MIN_BYTES", pc->variant == 3 ? NULL : "1");
    struct cfx_test_options opts = {.nranks = pc->nranks,
                                    .mode = pc->mode,
                                    .deadline_s = 600,
                                    .arg = (void *)pc,
                                    .before_rank =
                                        pc->mode == CFX_TEST_PROCS ? p2p_copy_env : NULL};
    CFX_TEST_RUN(&opts, p2p_copy_rank);
    cfx_test_setenv("CFX_P2P_SINGLE_COPY_MIN_BYTES", NULL);
}

/* ------------------------------------------- rooted calls away from the tree root */

/* Reduce and broadcast on the trees from every root but rank 0 (the trees'
 * roots are elsewhere for most of them, so the data goes through the relay
 * between the call's root and a tree's root), at one slot and at many more
 * chunks than a relay FIFO holds (> 22 MiB: the size that hung). On one host
 * with CFX_ALGO=tree (chains), and on two hosts of ranks/2 ranks each with
 * the planner's own choice (binary trees across the hosts). CFX_TIMEOUT is
 * short: a hang fails in seconds, naming the step and the rank it waits for. */
struct tree_root_case {
    int nranks;
    int two_hosts; /* A flag: CFX_HOSTID = h<rank / (nranks / 2)>, no CFX_ALGO. */
};

#define TREE_ROOT_SMALL ((size_t)1023)
#define TREE_ROOT_LARGE (((size_t)3 << 20) + 5) /* float64: 24 MiB. */

static double tree_root_input(int rank, size_t i)
{
    return (double)((i * 7 + (size_t)rank * 13) % 1009) - 500.0;
}

static void two_hosts_of_half_the_ranks(struct cfx_test_rank *ctx)
{
    char host[32];
    snprintf(host, sizeof(host), "h%d", ctx->rank / (ctx->nranks / 2));
    cfx_test_setenv("CFX_HOSTID", host);
}

static void tree_root_rank(struct cfx_test_rank *ctx)
{
    int n = ctx->nranks, r = ctx->rank;
    double *send = malloc(TREE_ROOT_LARGE * sizeof(double));
    double *recv = malloc(TREE_ROOT_LARGE * sizeof(double));
    RANK_ASSERT(ctx, send && recv, "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, n, ctx->id, r));
    for (int large = 0; large < 2 && !ctx->slot_failed; large++) {
        size_t count = large ? TREE_ROOT_LARGE : TREE_ROOT_SMALL;
        for (size_t i = 0; i < count; i++)
            send[i] = tree_root_input(r, i);
        for (int root = 1; root < n && !ctx->slot_failed; root++) {
            if (large && root != 1 && root != n - 1 && root != n / 2)
                continue;
            char desc[128];
            snprintf(desc, sizeof(desc), "reduce min float64 count %zu root %d", count, root);
            cfx_test_step(ctx, "%s", desc);
            recv[0] = recv[count - 1] = 12345.0;
            CALL(ctx, desc, cfxReduce(send, recv, count, cfxFloat64, cfxMin, root, comm, NULL));
            for (size_t i = 0; r == root && i < count; i++) {
                double want = tree_root_input(0, i);
                for (int q = 1; q < n; q++)
                    want = tree_root_input(q, i) < want ? tree_root_input(q, i) : want;
                RANK_ASSERT(ctx, recv[i] == want, "%s: element %zu is %g, not %g", desc, i, recv[i],
                            want);
            }
            RANK_ASSERT(ctx, r == root || recv[0] == 12345.0,
                        "%s: a non-root's recvbuff was written", desc);
            snprintf(desc, sizeof(desc), "broadcast float64 count %zu root %d", count, root);
            cfx_test_step(ctx, "%s", desc);
            for (size_t i = 0; r != root && i < count; i++)
                recv[i] = -1.0;
            CALL(ctx, desc, cfxBroadcast(send, recv, count, cfxFloat64, root, comm, NULL));
            for (size_t i = 0; i < count; i++)
                RANK_ASSERT(ctx, recv[i] == tree_root_input(root, i),
                            "%s: element %zu is %g, not %g", desc, i, recv[i],
                            tree_root_input(root, i));
        }
    }
    if (!ctx->slot_failed) {
        RANK_CFX(ctx, cfxCommFinalize(comm));
    }
    cfxCommDestroy(comm);
    free(send);
    free(recv);
}

ParameterizedTestParameters(tree, rooted_calls_away_from_the_tree_root)
{
    static struct tree_root_case cases[] = {{4, 0}, {5, 0}, {6, 0}, {4, 1}, {6, 1}};
    return cr_make_param_array(struct tree_root_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct tree_root_case *tc, tree, rooted_calls_away_from_the_tree_root,
                  .timeout = 300)
{
    cr_log_info("reduce and broadcast from roots 1..%d, %d ranks %s", tc->nranks - 1, tc->nranks,
                tc->two_hosts ? "on two hosts, the planner's choice"
                              : "on one host, CFX_ALGO=tree");
    cfx_test_setenv("CFX_SHM_DISABLE", NULL);
    cfx_test_setenv("CFX_ALGO", tc->two_hosts ? NULL : "tree");
    cfx_test_setenv("CFX_TIMEOUT", "5");
    struct cfx_test_options opts = {.nranks = tc->nranks,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 240,
                                    .arg = tc,
                                    .before_rank =
                                        tc->two_hosts ? two_hosts_of_half_the_ranks : NULL};
    CFX_TEST_RUN(&opts, tree_root_rank);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
    cfx_test_setenv("CFX_ALGO", NULL);
}

/* ------------------------------------------------------ rings in the plan's order */

/* Ranks dealt to hosts round robin (CFX_HOSTID = rh<rank % hosts>), as
 * `mpirun --map-by node` places them: ring 0 must be the plan's, each
 * host's ranks one after the other, so it crosses between hosts once per
 * host instead of at every hop, and the connectors must be its; the
 * ring collectives (CFX_ALGO=ring) give every rank the right blocks on
 * it, and broadcast and reduce work from every root. Host buffers, and
 * device buffers (processes; GPU ranks of different hosts go through the
 * proxy and sockets). */
struct ring_order_case {
    int nranks;
    int hosts;
    int device; /* A flag: device buffers. */
};

static void hosts_round_robin(struct cfx_test_rank *ctx)
{
    const struct ring_order_case *rc = ctx->arg;
    char host[32];
    snprintf(host, sizeof(host), "rh%d", ctx->rank % rc->hosts);
    cfx_test_setenv("CFX_HOSTID", host);
}

/* How many times ring 0 of @p comm goes from one host to another (host of
 * rank q: q % hosts); 0 with a ring that is not an order of the ranks. */
static int ring_host_changes(const struct cfxComm *comm, int hosts)
{
    int n = comm->nranks, changes = 0, seen = 0;
    if (comm->ring_ranks == NULL)
        return 0;
    for (int i = 0; i < n; i++) {
        int q = comm->ring_ranks[i], after = comm->ring_ranks[(i + 1) % n];
        if (q < 0 || q >= n || after < 0 || after >= n || (seen & (1 << q)))
            return 0;
        seen |= 1 << q;
        changes += q % hosts != after % hosts;
    }
    return changes;
}

static void ring_order_rank(struct cfx_test_rank *ctx)
{
    const struct ring_order_case *rc = ctx->arg;
    int n = ctx->nranks, r = ctx->rank;
    struct ctx_bufs b;
    RANK_ASSERT(ctx, bufs_init(&b, n), "out of memory");
    if (rc->device && !bufs_open_gpu(ctx, &b))
        return;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, n, ctx->id, r));
    /* Ring 0 visits each host's ranks one after the other: it changes
     * hosts once per host (rank order would change at every hop). */
    int changes = ring_host_changes(comm, rc->hosts);
    RANK_ASSERT(ctx, changes == rc->hosts, "ring 0 changes hosts %d times, not %d", changes,
                rc->hosts);
    int pos = -1;
    for (int i = 0; comm->ring_ranks != NULL && i < n; i++)
        pos = comm->ring_ranks[i] == r ? i : pos;
    int next = pos < 0 ? -1 : comm->ring_ranks[(pos + 1) % n];
    int prev = pos < 0 ? -1 : comm->ring_ranks[(pos + n - 1) % n];
    RANK_ASSERT(ctx, comm->ring_send != NULL && comm->ring_send->peer_rank == next,
                "ring 0 sends to rank %d, not to rank %d (the next on the ring)",
                comm->ring_send ? comm->ring_send->peer_rank : -1, next);
    RANK_ASSERT(ctx, comm->ring_recv != NULL && comm->ring_recv->peer_rank == prev,
                "ring 0 receives from rank %d, not from rank %d (the previous on the ring)",
                comm->ring_recv ? comm->ring_recv->peer_rank : -1, prev);
    run_allreduce(ctx, comm, &b);
    run_allgather(ctx, comm, &b);
    run_reducescatter(ctx, comm, &b);
    /* Rooted calls from every root: positions on the ring, not ranks. */
    for (int root = 0; root < n && !ctx->slot_failed; root++) {
        size_t count = root % 2 ? 5 : 70001;
        int32_t *in = (int32_t *)b.send, *out = (int32_t *)b.recv;
        char desc[128];
        snprintf(desc, sizeof(desc), "broadcast int32 count %zu root %d", count, root);
        cfx_test_step(ctx, "%s", desc);
        for (size_t i = 0; i < count; i++)
            in[i] = r == root ? (int32_t)(i * 3 + (size_t)root) : -1;
        memset(out, 0xee, count * 4 + 8);
        b.span = count * 4 + 64;
        CALL_ON(ctx, &b, desc,
                cfxBroadcast(D(&b, b.send), D(&b, b.recv), count, cfxInt32, root, comm, S(&b)));
        for (size_t i = 0; i < count; i++)
            RANK_ASSERT(ctx, out[i] == (int32_t)(i * 3 + (size_t)root),
                        "%s: element %zu is %d, not %d", desc, i, out[i],
                        (int32_t)(i * 3 + (size_t)root));
        snprintf(desc, sizeof(desc), "reduce sum int32 count %zu root %d", count, root);
        cfx_test_step(ctx, "%s", desc);
        for (size_t i = 0; i < count; i++)
            in[i] = (int32_t)(i + (size_t)r * 1000);
        memset(out, 0xee, count * 4 + 8);
        CALL_ON(
            ctx, &b, desc,
            cfxReduce(D(&b, b.send), D(&b, b.recv), count, cfxInt32, cfxSum, root, comm, S(&b)));
        for (size_t i = 0; r == root && i < count; i++) {
            int32_t want = (int32_t)((size_t)n * i + (size_t)1000 * (size_t)(n * (n - 1) / 2));
            RANK_ASSERT(ctx, out[i] == want, "%s: element %zu is %d, not %d", desc, i, out[i],
                        want);
        }
        RANK_ASSERT(ctx, r == root || (unsigned char)b.recv[0] == 0xee,
                    "%s: a non-root's recvbuff was written", desc);
    }
    if (!ctx->slot_failed) {
        RANK_CFX(ctx, cfxCommFinalize(comm));
    }
    cfxCommDestroy(comm);
    bufs_close_gpu(&b);
    free(b.send);
    free(b.recv);
}

ParameterizedTestParameters(ring, collectives_on_the_plans_ring_across_hosts)
{
    static struct ring_order_case cases[] = {{4, 2, 0}, {5, 2, 0}, {6, 3, 0}, {4, 2, 1}};
    return cr_make_param_array(struct ring_order_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct ring_order_case *rc, ring, collectives_on_the_plans_ring_across_hosts,
                  .timeout = 600)
{
    const char *why = NULL, *driver = rc->device ? cfx_test_use_cuda(&why) : NULL;
    cr_log_info("ring collectives, %d ranks dealt round robin to %d hosts, %s buffers", rc->nranks,
                rc->hosts, rc->device ? "device" : "host");
    if (rc->device && driver == NULL)
        cr_skip_test("%s", why);
    cfx_test_setenv("CFX_MULTI_RANK_GPU_ENABLE", rc->device ? "1" : NULL);
    cfx_test_setenv("CFX_SHM_DISABLE", NULL);
    cfx_test_setenv("CFX_ALGO", "ring");
    cfx_test_setenv("CFX_TIMEOUT", "20");
    struct cfx_test_options opts = {.nranks = rc->nranks,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 500,
                                    .arg = rc,
                                    .before_rank = hosts_round_robin};
    CFX_TEST_RUN(&opts, ring_order_rank);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
    cfx_test_setenv("CFX_ALGO", NULL);
    cfx_test_setenv("CFX_MULTI_RANK_GPU_ENABLE", NULL);
}

/* --------------------------------------------------- the fewest slots per FIFO */

/* CFX_STEPS below 2 cannot work: a ring step receives a slot and sends one
 * at once, so with one slot per FIFO every rank holds its only send slot
 * while it waits for a free one downstream. Init refuses it, naming the
 * variable, the value and the range. */
static void one_slot_refused(struct cfx_test_rank *ctx)
{
    cfxComm_t comm = NULL;
    cfx_test_step(ctx, "cfxCommInitRank with CFX_STEPS=1");
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    const char *why = cfxGetLastError(NULL);
    RANK_ASSERT(ctx, res == cfxInvalidArgument, "init with CFX_STEPS=1 returned %s: %s",
                cfxGetErrorString(res), why);
    RANK_ASSERT(ctx, strstr(why, "CFX_STEPS=1") != NULL && strstr(why, "2..64") != NULL,
                "the sentence does not name CFX_STEPS, the value and the range 2..64: %s", why);
}

Test(steps, one_slot_per_fifo_is_refused_at_init_with_a_sentence, .timeout = 60)
{
    cfx_test_setenv("CFX_STEPS", "1");
    cfx_test_setenv("CFX_TIMEOUT", "5");
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 30};
    CFX_TEST_RUN(&opts, one_slot_refused);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
    cfx_test_setenv("CFX_STEPS", NULL);
}

/* At CFX_STEPS=2 every schedule runs, in one slot and in many (8 KiB slots:
 * 20000 float32 take 10 chunks): allreduce on the algorithm of the case,
 * broadcast and reduce from every root, allgather (single copy over shm from
 * 4 KiB per rank), reduce-scatter, and an all-to-all of sends and receives. */
enum steps_algo { STEPS_RING, STEPS_TREE, STEPS_DIRECT, STEPS_TREE_TWO_HOSTS };
static const char *steps_algo_names[] = {"ring", "tree", "direct", "tree"};

struct steps_case {
    enum transport transport;
    enum steps_algo algo;
};

static void every_collective_at_two_slots(struct cfx_test_rank *ctx)
{
    int n = ctx->nranks, r = ctx->rank;
    static const size_t counts[] = {1, 20000};
    size_t most = counts[1] * (size_t)n;
    int32_t *send = malloc(most * sizeof(int32_t)), *recv = malloc(most * sizeof(int32_t));
    RANK_ASSERT(ctx, send && recv, "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, n, ctx->id, r));
    RANK_ASSERT(ctx, comm->n_steps == 2, "%d slots per FIFO, not 2", comm->n_steps);
    for (size_t c = 0; c < 2 && !ctx->slot_failed; c++) {
        size_t count = counts[c];
        char desc[128];
        for (size_t i = 0; i < most; i++)
            send[i] = (int32_t)(r * 1000 + (int)(i % 997));
        snprintf(desc, sizeof(desc), "allreduce count %zu", count);
        cfx_test_step(ctx, "%s", desc);
        CALL(ctx, desc, cfxAllReduce(send, recv, count, cfxInt32, cfxSum, comm, NULL));
        for (size_t i = 0; i < count; i++)
            RANK_ASSERT(ctx, recv[i] == 1000 * n * (n - 1) / 2 + n * (int)(i % 997),
                        "%s: element %zu is %d", desc, i, recv[i]);
        for (int root = 0; root < n; root++) {
            snprintf(desc, sizeof(desc), "reduce count %zu root %d", count, root);
            cfx_test_step(ctx, "%s", desc);
            CALL(ctx, desc, cfxReduce(send, recv, count, cfxInt32, cfxSum, root, comm, NULL));
            for (size_t i = 0; r == root && i < count; i++)
                RANK_ASSERT(ctx, recv[i] == 1000 * n * (n - 1) / 2 + n * (int)(i % 997),
                            "%s: element %zu is %d", desc, i, recv[i]);
            snprintf(desc, sizeof(desc), "broadcast count %zu root %d", count, root);
            cfx_test_step(ctx, "%s", desc);
            CALL(ctx, desc, cfxBroadcast(send, recv, count, cfxInt32, root, comm, NULL));
            for (size_t i = 0; i < count; i++)
                RANK_ASSERT(ctx, recv[i] == root * 1000 + (int)(i % 997), "%s: element %zu is %d",
                            desc, i, recv[i]);
        }
        snprintf(desc, sizeof(desc), "allgather count %zu", count);
        cfx_test_step(ctx, "%s", desc);
        CALL(ctx, desc, cfxAllGather(send, recv, count, cfxInt32, comm, NULL));
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < count; i++)
                RANK_ASSERT(ctx, recv[(size_t)q * count + i] == q * 1000 + (int)(i % 997),
                            "%s: element %zu of rank %d's block is %d", desc, i, q,
                            recv[(size_t)q * count + i]);
        snprintf(desc, sizeof(desc), "reducescatter count %zu", count);
        cfx_test_step(ctx, "%s", desc);
        CALL(ctx, desc, cfxReduceScatter(send, recv, count, cfxInt32, cfxSum, comm, NULL));
        for (size_t i = 0; i < count; i++)
            RANK_ASSERT(
                ctx, recv[i] == 1000 * n * (n - 1) / 2 + n * (int)(((size_t)r * count + i) % 997),
                "%s: element %zu is %d", desc, i, recv[i]);
        snprintf(desc, sizeof(desc), "all-to-all send/recv count %zu", count);
        cfx_test_step(ctx, "%s", desc);
        CALL(ctx, desc, cfxGroupStart());
        for (int k = 0; k < n; k++) {
            int to = (r + k) % n, from = (r - k + n) % n;
            CALL(ctx, desc,
                 cfxRecv(recv + (size_t)from * count, count, cfxInt32, from, comm, NULL));
            CALL(ctx, desc, cfxSend(send, count, cfxInt32, to, comm, NULL));
        }
        CALL(ctx, desc, cfxGroupEnd());
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < count; i++)
                RANK_ASSERT(ctx, recv[(size_t)q * count + i] == q * 1000 + (int)(i % 997),
                            "%s: element %zu from rank %d is %d", desc, i, q,
                            recv[(size_t)q * count + i]);
    }
    if (!ctx->slot_failed) {
        RANK_CFX(ctx, cfxCommFinalize(comm));
    }
    cfxCommDestroy(comm);
    free(send);
    free(recv);
}

ParameterizedTestParameters(steps, every_algorithm_runs_at_two_slots_per_fifo)
{
    static struct steps_case cases[] = {{SHM, STEPS_RING},          {SHM, STEPS_TREE},
                                        {SHM, STEPS_DIRECT},        {SOCKET, STEPS_RING},
                                        {SOCKET, STEPS_TREE},       {SOCKET, STEPS_DIRECT},
                                        {SHM, STEPS_TREE_TWO_HOSTS}};
    return cr_make_param_array(struct steps_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct steps_case *sc, steps, every_algorithm_runs_at_two_slots_per_fifo,
                  .timeout = 120)
{
    int two_hosts = sc->algo == STEPS_TREE_TWO_HOSTS;
    cr_log_info("CFX_STEPS=2, CFX_ALGO=%s over %s%s", steps_algo_names[sc->algo],
                sc->transport == SHM ? "shm" : "socket", two_hosts ? ", two hosts of 2" : "");
    cfx_test_setenv("CFX_SHM_DISABLE", sc->transport == SOCKET ? "1" : NULL);
    cfx_test_setenv("CFX_ALGO", steps_algo_names[sc->algo]);
    cfx_test_setenv("CFX_STEPS", "2");
    cfx_test_setenv("CFX_BUFFSIZE", "16384");
    cfx_test_setenv("CFX_SINGLE_COPY_MIN_BYTES", "4096");
    cfx_test_setenv("CFX_TIMEOUT", "5");
    struct cfx_test_options opts = {.nranks = two_hosts ? 4 : 3,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 90,
                                    .arg = sc,
                                    .before_rank = two_hosts ? two_hosts_of_half_the_ranks : NULL};
    CFX_TEST_RUN(&opts, every_collective_at_two_slots);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
    cfx_test_setenv("CFX_SINGLE_COPY_MIN_BYTES", NULL);
    cfx_test_setenv("CFX_BUFFSIZE", NULL);
    cfx_test_setenv("CFX_STEPS", NULL);
    cfx_test_setenv("CFX_ALGO", NULL);
}
