/*
 * A program written for NCCL, against NVIDIA's nccl.h, linked to the
 * drop-in libnccl.so.2 (bindings/nccl), not to NVIDIA's library: it checks
 * first that the library it runs on is the drop-in. Four forked ranks with
 * host buffers and a NULL stream run every collective and check the
 * results against values computed here: all-reduce with every op (Avg and
 * PreMulSum included) over every type except the FP8 ones, broadcast,
 * bcast, reduce, all-gather, reduce-scatter, all-to-all, gather, scatter,
 * grouped send/receive; communicators from ncclCommInitRank,
 * ncclCommInitRankConfig (NCCL_CONFIG_INITIALIZER), ncclCommInitRankScalable
 * and ncclCommSplit; refused calls and their sentences. The parent then
 * checks ncclGetVersion, error strings, config checks and ncclCommInitAll.
 *
 * --device-buffers: the same, with each rank a GPU rank. After the fork it
 * loads the CUDA driver (CFX_CUDA_DRIVER_LIB, default libcuda.so.1), makes
 * device rank % count's primary context current (what cudaSetDevice does)
 * and creates a non-blocking stream; every call that takes buffers runs on
 * device memory on that stream, the host arrays copied in before it and
 * back after cuStreamSynchronize, so the checks are the same ("twins",
 * below). ncclCommCuDevice must name that device and ncclMemAlloc give
 * device memory. Host-only in both modes: ncclCommWindowRegister's refusal (refused
 * whatever the buffer) and everything the parent checks (ncclCommInitAll
 * makes host ranks in one process).
 *
 * Deadline: each rank dies by SIGALRM after RANK_DEADLINE_S, naming the
 * step it hung at; the parent kills what is left after PARENT_DEADLINE_S
 * and names the ranks that hung.
 * Exit 0 when all passed, 1 otherwise.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <nccl.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NRANKS 4
#ifndef RANK_DEADLINE_S
#define RANK_DEADLINE_S 120
#endif
#define PARENT_DEADLINE_S (RANK_DEADLINE_S + 30)
#define COUNT             1031 /* Odd, so no type divides it evenly into chunks. */

#ifndef CFX_DROPIN_PATH
#error "CFX_DROPIN_PATH: the drop-in's libnccl.so.2, set by tests/nccl/CMakeLists.txt"
#endif

static int my_rank = -1;
static char step[200] = "start";

static void say_fail(int line, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say_fail(int line, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (my_rank >= 0)
        fprintf(stderr, "FAIL rank %d, dropin_test.c:%d (%s): %s\n", my_rank, line, step, text);
    else
        fprintf(stderr, "FAIL parent, dropin_test.c:%d: %s\n", line, text);
}

/* SIGALRM in a rank: say where it hung, then die. */
static void deadline_passed(int sig)
{
    (void)sig;
    char text[300];
    int n = snprintf(text, sizeof(text), "FAIL rank %d: hung past %d s at: %s\n", my_rank,
                     RANK_DEADLINE_S, step);
    if (n > 0)
        (void)!write(2, text, (size_t)n < sizeof(text) ? (size_t)n : sizeof(text) - 1);
    _exit(3);
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            say_fail(__LINE__, __VA_ARGS__);                                                       \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#define NCCL_OK(call)                                                                              \
    do {                                                                                           \
        snprintf(step, sizeof(step), "%s", #call);                                                 \
        ncclResult_t ok_res_ = (call);                                                             \
        CHECK(ok_res_ == ncclSuccess, "%s returned %d (%s): %s", #call, (int)ok_res_,              \
              ncclGetErrorString(ok_res_), ncclGetLastError(NULL));                                \
    } while (0)

#define RUN(call)                                                                                  \
    do {                                                                                           \
        if ((call) != 0)                                                                           \
            return 1;                                                                              \
    } while (0)

/* ---------------------------------------------------------------- device mode */

static int device_mode;          /* --device-buffers */
static cudaStream_t coll_stream; /* Every collective's stream: NULL in host mode. */
static int device_ordinal = -1;  /* Device mode: this rank's device. */

#define CU_XSTR(x) CU_STR(x)
#define CU_STR(x)  #x

/* The driver functions device mode calls, each with <cuda.h>'s prototype,
 * resolved by the ABI name <cuda.h> maps it to (cuMemAlloc_v2, ...), as
 * src/util/cuda.c resolves them. */
static struct cu_driver {
    __typeof__(&cuGetErrorString) get_error_string;
    __typeof__(&cuInit) init;
    __typeof__(&cuDeviceGetCount) device_get_count;
    __typeof__(&cuDeviceGet) device_get;
    __typeof__(&cuDevicePrimaryCtxRetain) primary_ctx_retain;
    __typeof__(&cuDevicePrimaryCtxRelease) primary_ctx_release;
    __typeof__(&cuCtxSetCurrent) ctx_set_current;
    __typeof__(&cuStreamCreate) stream_create;
    __typeof__(&cuStreamSynchronize) stream_synchronize;
    __typeof__(&cuStreamDestroy) stream_destroy;
    __typeof__(&cuMemAlloc) mem_alloc;
    __typeof__(&cuMemFree) mem_free;
    __typeof__(&cuMemcpyHtoDAsync) memcpy_htod_async;
    __typeof__(&cuMemcpyDtoH) memcpy_dtoh;
    __typeof__(&cuPointerGetAttribute) pointer_get_attribute;
} cu;

#define CU_FN(field, fn)                                                                           \
    {                                                                                              \
        offsetof(struct cu_driver, field), CU_XSTR(fn)                                             \
    }

static const struct cu_fn {
    size_t offset;
    const char *name;
} cu_fns[] = {
    CU_FN(get_error_string, cuGetErrorString),
    CU_FN(init, cuInit),
    CU_FN(device_get_count, cuDeviceGetCount),
    CU_FN(device_get, cuDeviceGet),
    CU_FN(primary_ctx_retain, cuDevicePrimaryCtxRetain),
    CU_FN(primary_ctx_release, cuDevicePrimaryCtxRelease),
    CU_FN(ctx_set_current, cuCtxSetCurrent),
    CU_FN(stream_create, cuStreamCreate),
    CU_FN(stream_synchronize, cuStreamSynchronize),
    CU_FN(stream_destroy, cuStreamDestroy),
    CU_FN(mem_alloc, cuMemAlloc),
    CU_FN(mem_free, cuMemFree),
    CU_FN(memcpy_htod_async, cuMemcpyHtoDAsync),
    CU_FN(memcpy_dtoh, cuMemcpyDtoH),
    CU_FN(pointer_get_attribute, cuPointerGetAttribute),
};

static const char *cu_error(CUresult res)
{
    const char *text = NULL;
    if (cu.get_error_string == NULL || cu.get_error_string(res, &text) != CUDA_SUCCESS ||
        text == NULL)
        text = "an unknown CUresult";
    return text;
}

/* Leaves step as it is: a wait for the stream that hangs names the call it waits for. */
#define CU_OK(call)                                                                                \
    do {                                                                                           \
        CUresult cu_res_ = (call);                                                                 \
        CHECK(cu_res_ == CUDA_SUCCESS, "%s returned %d (%s)", #call, (int)cu_res_,                 \
              cu_error(cu_res_));                                                                  \
    } while (0)

static CUdevice cu_device;
static CUcontext cu_ctx;

/* In a rank, after the fork (CUDA does not survive one): the driver,
 * device my_rank % count's primary context current on this thread, which
 * makes the rank a GPU rank at ncclCommInitRank, and a non-blocking stream. */
static int device_open(void)
{
    const char *lib_name = getenv("CFX_CUDA_DRIVER_LIB");
    if (lib_name == NULL || lib_name[0] == '\0')
        lib_name = "libcuda.so.1";
    snprintf(step, sizeof(step), "loading the CUDA driver %s", lib_name);
    void *lib = dlopen(lib_name, RTLD_NOW | RTLD_LOCAL);
    CHECK(lib != NULL, "dlopen: %s", dlerror());
    for (size_t i = 0; i < sizeof(cu_fns) / sizeof(cu_fns[0]); i++) {
        void *fn = dlsym(lib, cu_fns[i].name);
        CHECK(fn != NULL, "%s has no %s", lib_name, cu_fns[i].name);
        memcpy((char *)&cu + cu_fns[i].offset, &fn, sizeof(fn));
    }
    snprintf(step, sizeof(step), "opening a CUDA device on %s", lib_name);
    int n_devices = 0;
    CU_OK(cu.init(0));
    CU_OK(cu.device_get_count(&n_devices));
    CHECK(n_devices > 0, "the driver has no device");
    device_ordinal = my_rank % n_devices;
    CU_OK(cu.device_get(&cu_device, device_ordinal));
    CU_OK(cu.primary_ctx_retain(&cu_ctx, cu_device));
    CU_OK(cu.ctx_set_current(cu_ctx));
    CUstream stream;
    CU_OK(cu.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    coll_stream = stream;
    printf("rank %d: device %d of %d, a non-blocking stream\n", my_rank, device_ordinal, n_devices);
    return 0;
}

static int device_close(void)
{
    CU_OK(cu.stream_destroy(coll_stream));
    coll_stream = NULL;
    CU_OK(cu.ctx_set_current(NULL));
    CU_OK(cu.primary_ctx_release(cu_device));
    return 0;
}

/* Twins: the checks read host arrays; each array a collective touches has a
 * twin, where the call sees it: in host mode the array itself, in device
 * mode device memory of its size (twin) or a device buffer given (twin_at,
 * for ncclMemAlloc's). twins_in copies every array into its twin on the
 * stream before a call; twins_out waits for the stream and copies every
 * twin back. Made at a function's start, freed at its end. */
struct twin {
    char *host;
    size_t bytes;
    char *dev;
    int owned; /* cuMemAlloc'd here: twins_free frees it. */
};

enum { MAX_TWINS = 4 };
static struct twin twins[MAX_TWINS];
static int n_twins;

static int twin_at(void *host, size_t bytes, void *where)
{
    CHECK(n_twins < MAX_TWINS, "more than %d twins", MAX_TWINS);
    twins[n_twins++] = (struct twin){.host = host, .bytes = bytes, .dev = where};
    return 0;
}

static int twin(void *host, size_t bytes)
{
    if (!device_mode)
        return twin_at(host, bytes, host);
    CUdeviceptr mem;
    CU_OK(cu.mem_alloc(&mem, bytes));
    RUN(twin_at(host, bytes, (void *)(uintptr_t)mem));
    twins[n_twins - 1].owned = 1;
    return 0;
}

/* Where the call sees @p host, which lies in a twinned array; NULL (and a
 * FAIL line) elsewhere, which the call then refuses. */
static void *dev(const void *host)
{
    for (int i = 0; i < n_twins; i++) {
        const struct twin *t = &twins[i];
        if ((const char *)host >= t->host && (const char *)host < t->host + t->bytes)
            return t->dev + ((const char *)host - t->host);
    }
    say_fail(__LINE__, "%p is in no twinned array", host);
    return NULL;
}

/* In device mode the copy in is queued on the stream, so the collective
 * follows it in stream order (cuMemcpyHtoD from pageable memory can return
 * before its DMA lands, unordered with a non-blocking stream). */
static int twins_in(void)
{
    for (int i = 0; i < n_twins; i++) {
        const struct twin *t = &twins[i];
        if (device_mode)
            CU_OK(cu.memcpy_htod_async((CUdeviceptr)(uintptr_t)t->dev, t->host, t->bytes,
                                       coll_stream));
        else if (t->dev != t->host)
            memcpy(t->dev, t->host, t->bytes);
    }
    return 0;
}

static int twins_out(void)
{
    if (device_mode)
        CU_OK(cu.stream_synchronize(coll_stream));
    for (int i = 0; i < n_twins; i++) {
        const struct twin *t = &twins[i];
        if (device_mode)
            CU_OK(cu.memcpy_dtoh(t->host, (CUdeviceptr)(uintptr_t)t->dev, t->bytes));
        else if (t->dev != t->host)
            memcpy(t->host, t->dev, t->bytes);
    }
    return 0;
}

static int twins_free(void)
{
    for (int i = 0; i < n_twins; i++)
        if (twins[i].owned)
            CU_OK(cu.mem_free((CUdeviceptr)(uintptr_t)twins[i].dev));
    n_twins = 0;
    return 0;
}

/* A call that takes buffers, on the twins: copied in, run, waited for,
 * copied back. */
#define NCCL_TWINS(call)                                                                           \
    do {                                                                                           \
        RUN(twins_in());                                                                           \
        NCCL_OK(call);                                                                             \
        RUN(twins_out());                                                                          \
    } while (0)

/* ---------------------------------------------------------------- typed values */

static size_t type_size(ncclDataType_t type)
{
    switch (type) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
    }
}

static int is_float(ncclDataType_t type)
{
    return type == ncclFloat16 || type == ncclBfloat16 || type == ncclFloat32 ||
           type == ncclFloat64;
}

/* IEEE half, exact for the small integers and quarters used here. */
static uint16_t half_from(double v)
{
    if (v == 0)
        return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    int e;
    double m = frexp(fabs(v), &e); /* |v| = m * 2^e, m in [0.5, 1). */
    uint16_t frac = (uint16_t)lround((m * 2 - 1) * 1024);
    return (uint16_t)(sign | (uint16_t)(e - 1 + 15) << 10 | frac);
}

static double half_to(uint16_t h)
{
    int exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
    double v = exp == 0 ? ldexp(frac, -24) : ldexp(1 + frac / 1024.0, exp - 15);
    return (h & 0x8000) ? -v : v;
}

static void store(ncclDataType_t type, void *buf, size_t i, double v)
{
    switch (type) {
    case ncclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t *)buf)[i] = half_from(v); break;
    case ncclFloat32: ((float *)buf)[i] = (float)v; break;
    case ncclFloat64: ((double *)buf)[i] = v; break;
    case ncclBfloat16: {
        float f = (float)v;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        ((uint16_t *)buf)[i] = (uint16_t)(bits >> 16);
        break;
    }
    default: break;
    }
}

static double load(ncclDataType_t type, const void *buf, size_t i)
{
    switch (type) {
    case ncclInt8: return ((const int8_t *)buf)[i];
    case ncclUint8: return ((const uint8_t *)buf)[i];
    case ncclInt32: return ((const int32_t *)buf)[i];
    case ncclUint32: return ((const uint32_t *)buf)[i];
    case ncclInt64: return (double)((const int64_t *)buf)[i];
    case ncclUint64: return (double)((const uint64_t *)buf)[i];
    case ncclFloat16: return half_to(((const uint16_t *)buf)[i]);
    case ncclFloat32: return ((const float *)buf)[i];
    case ncclFloat64: return ((const double *)buf)[i];
    case ncclBfloat16: {
        uint32_t bits = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
    }
    default: return NAN;
    }
}

/* Rank @p rank's input element @p i: 1..11, exact in every type. */
static double input(int rank, size_t i)
{
    return 1 + (double)((rank * 7 + i * 3) % 11);
}

/* The reduction of element @p i over all ranks. */
static double reduced(ncclRedOp_t op, ncclDataType_t type, size_t i, double premul)
{
    double acc = input(0, i);
    for (int r = 1; r < NRANKS; r++) {
        double x = input(r, i);
        switch (op) {
        case ncclProd: acc *= x; break;
        case ncclMax: acc = fmax(acc, x); break;
        case ncclMin: acc = fmin(acc, x); break;
        default: acc += x; break;
        }
    }
    if (op == ncclAvg)
        acc = is_float(type) ? acc / NRANKS : trunc(acc / NRANKS);
    if (premul != 0)
        acc *= premul;
    return acc;
}

static const char *op_name(ncclRedOp_t op)
{
    static const char *const names[] = {"sum", "prod", "max", "min", "avg"};
    return (unsigned)op < 5 ? names[op] : "premulsum";
}

/* ---------------------------------------------------------------- the ranks */

/* All-reduce @p op over @p type; @p premul != 0: a PreMulSum op of that
 * scalar made on @p comm. Out of place, then in place. */
static int allreduce_case(ncclComm_t comm, ncclDataType_t type, ncclRedOp_t op, double premul)
{
    size_t bytes = COUNT * type_size(type);
    char *send = malloc(bytes), *recv = malloc(bytes);
    CHECK(send && recv, "out of memory");
    RUN(twin(send, bytes));
    RUN(twin(recv, bytes));
    for (size_t i = 0; i < COUNT; i++)
        store(type, send, i, input(my_rank, i));
    ncclRedOp_t use = op;
    if (premul != 0) {
        char scalar[8];
        store(type, scalar, 0, premul);
        NCCL_OK(ncclRedOpCreatePreMulSum(&use, scalar, type, ncclScalarHostImmediate, comm));
        CHECK(use >= ncclNumOps, "a PreMulSum op is %d, below ncclNumOps", (int)use);
    }
    for (int in_place = 0; in_place < 2; in_place++) {
        snprintf(step, sizeof(step), "ncclAllReduce %s type %d%s", op_name(use), (int)type,
                 in_place ? " in place" : "");
        char *out = in_place ? send : recv;
        RUN(twins_in());
        ncclResult_t res = ncclAllReduce(dev(send), dev(out), COUNT, type, use, comm, coll_stream);
        CHECK(res == ncclSuccess, "%s", ncclGetLastError(comm));
        RUN(twins_out());
        for (size_t i = 0; i < COUNT; i++) {
            double want = reduced(op, type, i, premul), got = load(type, out, i);
            CHECK(got == want, "element %zu is %g, expected %g", i, got, want);
        }
    }
    if (premul != 0)
        NCCL_OK(ncclRedOpDestroy(use, comm));
    RUN(twins_free());
    free(send);
    free(recv);
    return 0;
}

static int allreduce_all(ncclComm_t comm)
{
    static const ncclDataType_t types[] = {ncclInt8,    ncclUint8,   ncclInt32,   ncclUint32,
                                           ncclInt64,   ncclUint64,  ncclFloat16, ncclFloat32,
                                           ncclFloat64, ncclBfloat16};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        ncclDataType_t type = types[t];
        for (ncclRedOp_t op = ncclSum; op <= ncclAvg; op++) {
            /* 11^4 does not fit 8 bits, nor 16-bit floats exactly. */
            if (op == ncclProd && (type_size(type) < 4))
                continue;
            RUN(allreduce_case(comm, type, op, 0));
        }
        /* PreMulSum: 2 * sum for every type; 0.5 * sum for the floats. */
        RUN(allreduce_case(comm, type, ncclSum, 2));
        if (is_float(type))
            RUN(allreduce_case(comm, type, ncclSum, 0.5));
    }
    return 0;
}

static int rooted_and_gathers(ncclComm_t comm)
{
    int32_t a[COUNT], b[NRANKS * COUNT];
    double d[COUNT];
    RUN(twin(a, sizeof(a)));
    RUN(twin(b, sizeof(b)));
    RUN(twin(d, sizeof(d)));
    /* Broadcast from rank 2, out of place. */
    for (size_t i = 0; i < COUNT; i++)
        a[i] = (int32_t)(my_rank * 1000 + (int)i), b[i] = -1;
    NCCL_TWINS(ncclBroadcast(dev(a), dev(b), COUNT, ncclInt32, 2, comm, coll_stream));
    for (size_t i = 0; i < COUNT; i++)
        CHECK(b[i] == (int32_t)(2000 + i), "broadcast element %zu is %d", i, b[i]);
    /* Bcast from rank 1, in place. */
    for (size_t i = 0; i < COUNT; i++)
        d[i] = my_rank == 1 ? 0.25 * (double)i : -1;
    NCCL_TWINS(ncclBcast(dev(d), COUNT, ncclFloat64, 1, comm, coll_stream));
    for (size_t i = 0; i < COUNT; i++)
        CHECK(d[i] == 0.25 * (double)i, "bcast element %zu is %g", i, d[i]);
    /* Reduce (max) to rank 3. */
    for (size_t i = 0; i < COUNT; i++)
        a[i] = (int32_t)input(my_rank, i), b[i] = -1;
    NCCL_TWINS(ncclReduce(dev(a), dev(b), COUNT, ncclInt32, ncclMax, 3, comm, coll_stream));
    if (my_rank == 3)
        for (size_t i = 0; i < COUNT; i++)
            CHECK(b[i] == reduced(ncclMax, ncclInt32, i, 0), "reduce element %zu is %d", i, b[i]);
    /* All-gather: block r holds r*100 + i. */
    for (size_t i = 0; i < COUNT; i++)
        a[i] = (int32_t)(my_rank * 100 + (int)i);
    NCCL_TWINS(ncclAllGather(dev(a), dev(b), COUNT, ncclInt32, comm, coll_stream));
    for (int r = 0; r < NRANKS; r++)
        for (size_t i = 0; i < COUNT; i++)
            CHECK(b[r * COUNT + i] == (int32_t)(r * 100 + (int)i), "allgather block %d[%zu] = %d",
                  r, i, b[r * COUNT + i]);
    /* Reduce-scatter (sum): rank r gets block r of the sum. */
    for (size_t i = 0; i < NRANKS * COUNT; i++)
        b[i] = (int32_t)input(my_rank, i);
    NCCL_TWINS(ncclReduceScatter(dev(b), dev(a), COUNT, ncclInt32, ncclSum, comm, coll_stream));
    for (size_t i = 0; i < COUNT; i++) {
        double want = reduced(ncclSum, ncclInt32, (size_t)my_rank * COUNT + i, 0);
        CHECK(a[i] == want, "reducescatter element %zu is %d, expected %g", i, a[i], want);
    }
    RUN(twins_free());
    return 0;
}

static int personalized(ncclComm_t comm)
{
    enum { N = 97 };
    int32_t send[NRANKS * N], recv[NRANKS * N], ring_in[N], pair_in[N];
    RUN(twin(send, sizeof(send)));
    RUN(twin(recv, sizeof(recv)));
    RUN(twin(ring_in, sizeof(ring_in)));
    RUN(twin(pair_in, sizeof(pair_in)));
    /* All-to-all: the block from s to d holds s*10000 + d*100 + i. */
    for (int d = 0; d < NRANKS; d++)
        for (int i = 0; i < N; i++)
            send[d * N + i] = my_rank * 10000 + d * 100 + i;
    NCCL_TWINS(ncclAlltoAll(dev(send), dev(recv), N, ncclInt32, comm, coll_stream));
    for (int s = 0; s < NRANKS; s++)
        for (int i = 0; i < N; i++)
            CHECK(recv[s * N + i] == s * 10000 + my_rank * 100 + i, "alltoall from %d [%d] = %d", s,
                  i, recv[s * N + i]);
    /* Gather to rank 1. */
    memset(recv, 0xff, sizeof(recv));
    NCCL_TWINS(ncclGather(dev(send), dev(recv), N, ncclInt32, 1, comm, coll_stream));
    if (my_rank == 1)
        for (int s = 0; s < NRANKS; s++)
            for (int i = 0; i < N; i++)
                CHECK(recv[s * N + i] == s * 10000 + i, "gather from %d [%d] = %d", s, i,
                      recv[s * N + i]);
    /* Scatter from rank 2: rank d gets 20000 + d*100 + i. */
    memset(recv, 0xff, sizeof(recv));
    NCCL_TWINS(ncclScatter(dev(send), dev(recv), N, ncclInt32, 2, comm, coll_stream));
    for (int i = 0; i < N; i++)
        CHECK(recv[i] == 20000 + my_rank * 100 + i, "scatter [%d] = %d", i, recv[i]);
    /* A ring and a pairwise swap, all in one group. */
    int next = (my_rank + 1) % NRANKS, prev = (my_rank + NRANKS - 1) % NRANKS;
    int partner = my_rank ^ 1;
    RUN(twins_in());
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(dev(send + next * N), N, ncclInt32, next, comm, coll_stream));
    NCCL_OK(ncclRecv(dev(ring_in), N, ncclInt32, prev, comm, coll_stream));
    NCCL_OK(ncclRecv(dev(pair_in), N, ncclInt32, partner, comm, coll_stream));
    NCCL_OK(ncclSend(dev(send + partner * N), N, ncclInt32, partner, comm, coll_stream));
    NCCL_OK(ncclGroupEnd());
    RUN(twins_out());
    for (int i = 0; i < N; i++) {
        CHECK(ring_in[i] == prev * 10000 + my_rank * 100 + i, "ring recv [%d] = %d", i, ring_in[i]);
        CHECK(pair_in[i] == partner * 10000 + my_rank * 100 + i, "pair recv [%d] = %d", i,
              pair_in[i]);
    }
    RUN(twins_free());
    return 0;
}

static int split(ncclComm_t comm)
{
    /* Even and odd ranks, in reverse order of the parent. */
    ncclComm_t child = NULL;
    NCCL_OK(ncclCommSplit(comm, my_rank % 2, NRANKS - my_rank, &child, NULL));
    CHECK(child != NULL, "ncclCommSplit gave no communicator");
    int count = 0, rank = -1;
    NCCL_OK(ncclCommCount(child, &count));
    NCCL_OK(ncclCommUserRank(child, &rank));
    CHECK(count == 2, "child has %d ranks", count);
    CHECK(rank == (my_rank < 2 ? 1 : 0), "parent rank %d is rank %d of its child", my_rank, rank);
    int sum = my_rank;
    RUN(twin(&sum, sizeof(sum)));
    NCCL_TWINS(ncclAllReduce(dev(&sum), dev(&sum), 1, ncclInt32, ncclSum, child, coll_stream));
    CHECK(sum == (my_rank % 2 ? 1 + 3 : 0 + 2), "child all-reduce gave %d", sum);
    RUN(twins_free());
    NCCL_OK(ncclCommFinalize(child));
    NCCL_OK(ncclCommDestroy(child));
    /* Rank 3 out: NCCL_SPLIT_NOCOLOR gives it NULL. */
    child = (ncclComm_t)&child;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.commName = "dropin-split";
    NCCL_OK(ncclCommSplit(comm, my_rank == 3 ? NCCL_SPLIT_NOCOLOR : 0, my_rank, &child, &config));
    if (my_rank == 3) {
        CHECK(child == NULL, "NCCL_SPLIT_NOCOLOR gave a communicator");
    } else {
        NCCL_OK(ncclCommCount(child, &count));
        CHECK(count == 3, "child without rank 3 has %d ranks", count);
        NCCL_OK(ncclCommFinalize(child));
        NCCL_OK(ncclCommDestroy(child));
    }
    return 0;
}

/* Rank 3 left out by ncclCommShrink (it does not call it); the others
 * allreduce on the result, then revoke it and shrink it again (nobody
 * excluded) into one that works. */
static int shrink(ncclComm_t comm)
{
    snprintf(step, sizeof(step), "shrink");
    if (my_rank == 3)
        return 0;
    int exclude = 3, count = 0, sum = my_rank;
    ncclComm_t shrunk = NULL, again = NULL;
    RUN(twin(&sum, sizeof(sum)));
    NCCL_OK(ncclCommShrink(comm, &exclude, 1, &shrunk, NULL, NCCL_SHRINK_DEFAULT));
    NCCL_OK(ncclCommCount(shrunk, &count));
    CHECK(count == 3, "shrunk communicator has %d ranks", count);
    NCCL_TWINS(ncclAllReduce(dev(&sum), dev(&sum), 1, ncclInt32, ncclSum, shrunk, coll_stream));
    CHECK(sum == 0 + 1 + 2, "all-reduce on the shrunk communicator gave %d", sum);
    NCCL_OK(ncclCommRevoke(shrunk, NCCL_REVOKE_DEFAULT));
    ncclResult_t res =
        ncclAllReduce(dev(&sum), dev(&sum), 1, ncclInt32, ncclSum, shrunk, coll_stream);
    CHECK(res == ncclInvalidUsage && strstr(ncclGetLastError(shrunk), "revoked") != NULL,
          "all-reduce after ncclCommRevoke returned %d: %s", (int)res, ncclGetLastError(shrunk));
    NCCL_OK(ncclCommShrink(shrunk, NULL, 0, &again, NULL, NCCL_SHRINK_ABORT));
    NCCL_OK(ncclCommDestroy(shrunk));
    sum = 1;
    NCCL_TWINS(ncclAllReduce(dev(&sum), dev(&sum), 1, ncclInt32, ncclSum, again, coll_stream));
    CHECK(sum == 3, "all-reduce after the second shrink gave %d", sum);
    NCCL_OK(ncclCommDestroy(again));
    RUN(twins_free());
    return 0;
}

/* Calls Conflux has no equivalent of, and a bad argument. */
static int refusals(ncclComm_t comm)
{
    snprintf(step, sizeof(step), "refused calls");
    ncclResult_t res;
    ncclWindow_t win;
    char buf[64];
    res = ncclCommWindowRegister(comm, buf, sizeof(buf), &win, NCCL_WIN_DEFAULT);
    CHECK(res == ncclInvalidUsage, "ncclCommWindowRegister returned %d", (int)res);
    CHECK(strstr(ncclGetLastError(comm), "window") != NULL, "last error: \"%s\"",
          ncclGetLastError(comm));
    /* The cost model's time for a group that does not run (so nothing to
     * copy in or out). */
    float sim_buf[1024] = {0};
    int x = 0;
    RUN(twin(sim_buf, sizeof(sim_buf)));
    RUN(twin(&x, sizeof(x)));
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    NCCL_OK(ncclGroupStart());
    NCCL_OK(
        ncclAllReduce(dev(sim_buf), dev(sim_buf), 1024, ncclFloat32, ncclSum, comm, coll_stream));
    NCCL_OK(ncclGroupSimulateEnd(&sim));
    CHECK(sim.estimatedTime > 0, "ncclGroupSimulateEnd estimated %g us", sim.estimatedTime);
    /* A failure inside Conflux replaces the drop-in's sentence. */
    res = ncclAllReduce(dev(&x), dev(&x), 1, (ncclDataType_t)99, ncclSum, comm, coll_stream);
    CHECK(res == ncclInvalidArgument, "a bad type returned %d", (int)res);
    const char *last = ncclGetLastError(comm);
    CHECK(last[0] != '\0' && strstr(last, "ncclCommRevoke") == NULL,
          "last error after a bad type: \"%s\"", last);
    ncclResult_t async = ncclInternalError;
    NCCL_OK(ncclCommGetAsyncError(comm, &async));
    CHECK(async == ncclSuccess, "async error %d", (int)async);
    RUN(twins_free());
    return 0;
}

/* ncclMemAlloc's buffer (device memory on a GPU rank, host memory on a
 * host rank), registered, is the twin of a host array. */
static int memory(ncclComm_t comm)
{
    float *buf = NULL, vals[COUNT];
    void *handle = NULL;
    NCCL_OK(ncclMemAlloc((void **)&buf, sizeof(vals)));
    if (device_mode) {
        CUmemorytype type = 0;
        CU_OK(cu.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                       (CUdeviceptr)(uintptr_t)buf));
        CHECK(type == CU_MEMORYTYPE_DEVICE, "ncclMemAlloc on a GPU rank gave memory of type %d",
              (int)type);
    }
    NCCL_OK(ncclCommRegister(comm, buf, sizeof(vals), &handle));
    RUN(twin_at(vals, sizeof(vals), buf));
    for (size_t i = 0; i < COUNT; i++)
        vals[i] = (float)input(my_rank, i);
    NCCL_TWINS(ncclAllReduce(buf, buf, COUNT, ncclFloat32, ncclMin, comm, coll_stream));
    for (size_t i = 0; i < COUNT; i++)
        CHECK(vals[i] == reduced(ncclMin, ncclFloat32, i, 0), "element %zu is %g", i, vals[i]);
    RUN(twins_free());
    NCCL_OK(ncclCommDeregister(comm, handle));
    NCCL_OK(ncclMemFree(buf));
    return 0;
}

/* Rank 0 makes the ids and hands them over here (MAP_SHARED): the parent
 * makes no call before it forks, so no Conflux thread (a bootstrap root)
 * exists at fork time. */
struct id_area {
    int ready; /* 1: ids are set; -1: rank 0 failed to make them. */
    ncclUniqueId ids[4];
};

static int share_ids(struct id_area *area)
{
    if (my_rank == 0) {
        int made = 1;
        for (int i = 0; i < 4 && made; i++)
            made = ncclGetUniqueId(&area->ids[i]) == ncclSuccess;
        __atomic_store_n(&area->ready, made ? 1 : -1, __ATOMIC_RELEASE);
        CHECK(made, "ncclGetUniqueId: %s", ncclGetLastError(NULL));
        return 0;
    }
    snprintf(step, sizeof(step), "waiting for rank 0's unique ids");
    int ready;
    while ((ready = __atomic_load_n(&area->ready, __ATOMIC_ACQUIRE)) == 0)
        usleep(1000);
    CHECK(ready == 1, "rank 0 could not make the unique ids");
    return 0;
}

static int run_rank(struct id_area *area)
{
    if (device_mode)
        RUN(device_open());
    RUN(share_ids(area));
    const ncclUniqueId *ids = area->ids;
    ncclComm_t plain, configured, scalable;
    NCCL_OK(ncclCommInitRank(&plain, NRANKS, ids[0], my_rank));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    config.commName = "dropin-config";
    config.cgaClusterSize = 2; /* A GPU hint: accepted and ignored. */
    NCCL_OK(ncclCommInitRankConfig(&configured, NRANKS, ids[1], my_rank, &config));
    NCCL_OK(ncclCommInitRankScalable(&scalable, NRANKS, my_rank, 2, &area->ids[2], NULL));

    int count = 0, rank = -1, device = 0;
    NCCL_OK(ncclCommCount(configured, &count));
    NCCL_OK(ncclCommUserRank(configured, &rank));
    NCCL_OK(ncclCommCuDevice(configured, &device));
    CHECK(count == NRANKS && rank == my_rank, "count %d, rank %d", count, rank);
    CHECK(device == device_ordinal, "ncclCommCuDevice gave %d, expected %d", device,
          device_ordinal);

    RUN(allreduce_all(plain));
    RUN(rooted_and_gathers(configured));
    RUN(personalized(scalable));
    RUN(split(plain));
    RUN(shrink(plain));
    RUN(refusals(plain));
    RUN(memory(configured));

    NCCL_OK(ncclCommFinalize(plain));
    NCCL_OK(ncclCommDestroy(plain));
    NCCL_OK(ncclCommFinalize(configured));
    NCCL_OK(ncclCommDestroy(configured));
    NCCL_OK(ncclCommAbort(scalable));
    if (device_mode)
        RUN(device_close());
    return 0;
}

/* ---------------------------------------------------------------- the parent */

/* The library that serves ncclAllReduce is the drop-in, not NVIDIA's: the
 * one this build made, or CFX_DROPIN_PATH from the environment (the GPU
 * check runs a copy of it, scripts/gpu_bundle.sh). */
static int loaded_dropin(void)
{
    Dl_info info;
    CHECK(dladdr((void *)ncclAllReduce, &info) && info.dli_fname, "dladdr(ncclAllReduce) failed");
    const char *path = getenv("CFX_DROPIN_PATH");
    if (path == NULL || path[0] == '\0')
        path = CFX_DROPIN_PATH;
    char got[PATH_MAX], want[PATH_MAX];
    CHECK(realpath(info.dli_fname, got) && realpath(path, want), "realpath: %s or %s: %s",
          info.dli_fname, path, strerror(errno));
    CHECK(strcmp(got, want) == 0, "ncclAllReduce comes from %s, not the drop-in %s", got, want);
    printf("ncclAllReduce comes from %s\n", got);
    return 0;
}

/* NVIDIA's header lays out what the drop-in's own header (bindings/nccl/
 * nccl_abi.h, asserted in abi.c) says it does. */
static int same_abi(void)
{
    CHECK(sizeof(ncclUniqueId) == 128, "ncclUniqueId is %zu bytes", sizeof(ncclUniqueId));
    CHECK(sizeof(ncclConfig_t) == 80 && offsetof(ncclConfig_t, blocking) == 16 &&
              offsetof(ncclConfig_t, netName) == 32 && offsetof(ncclConfig_t, splitShare) == 40 &&
              offsetof(ncclConfig_t, commName) == 48 &&
              offsetof(ncclConfig_t, nvlinkCentricSched) == 76,
          "ncclConfig_t of nccl.h %d is not the layout nccl_abi.h has (%zu bytes)",
          NCCL_VERSION_CODE, sizeof(ncclConfig_t));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    CHECK(config.magic == 0xcafebeef && config.size == sizeof(config), "config magic 0x%x",
          config.magic);
    CHECK(ncclNumResults == 8 && ncclNumOps == 5 && ncclNumTypes == 12 && ncclBfloat16 == 9 &&
              ncclInProgress == 7 && ncclScalarHostImmediate == 1 && sizeof(ncclRedOp_t) == 4,
          "an enum of nccl.h %d differs from nccl_abi.h", NCCL_VERSION_CODE);
    CHECK(sizeof(ncclSimInfo_t) == 24, "ncclSimInfo_t is %zu bytes", sizeof(ncclSimInfo_t));
    return 0;
}

static int process_local(void)
{
    RUN(same_abi());
    int version = 0;
    NCCL_OK(ncclGetVersion(&version));
    CHECK(version / 100 == NCCL_VERSION_CODE / 100,
          "ncclGetVersion says %d; nccl.h is %d (the same major and minor expected)", version,
          NCCL_VERSION_CODE);
    CHECK(version >= NCCL_VERSION(2, 28, 0), "version %d", version);
    for (int res = ncclSuccess; res < ncclNumResults; res++)
        CHECK(ncclGetErrorString((ncclResult_t)res)[0] != '\0', "no string for %d", res);
    CHECK(strstr(ncclGetErrorString(ncclInvalidArgument), "invalid argument"), "%s",
          ncclGetErrorString(ncclInvalidArgument));
    CHECK(strcmp(ncclGetErrorString(ncclNumResults), ncclGetErrorString(ncclSuccess)) != 0,
          "an unknown code reads as success");

    /* A config that NCCL_CONFIG_INITIALIZER did not make. */
    ncclConfig_t bad;
    memset(&bad, 0, sizeof(bad));
    ncclComm_t comm = NULL;
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    ncclResult_t res = ncclCommInitRankConfig(&comm, 1, id, 0, &bad);
    CHECK(res == ncclInvalidArgument && comm == NULL, "a zeroed config gave %d", (int)res);
    CHECK(strstr(ncclGetLastError(NULL), "NCCL_CONFIG_INITIALIZER"), "last error: \"%s\"",
          ncclGetLastError(NULL));
    /* A config of an older nccl.h: only size..blocking. What lies past its
     * size is not read (minCTAs 0 would be refused). */
    ncclConfig_t old = NCCL_CONFIG_INITIALIZER;
    old.size = offsetof(ncclConfig_t, cgaClusterSize);
    old.blocking = 1;
    old.minCTAs = 0;
    NCCL_OK(ncclGetUniqueId(&id));
    NCCL_OK(ncclCommInitRankConfig(&comm, 1, id, 0, &old));
    NCCL_OK(ncclCommDestroy(comm));

    /* Two ranks in this process, driven by one thread through a group. */
    ncclComm_t comms[2];
    NCCL_OK(ncclCommInitAll(comms, 2, NULL));
    double v[2][3] = {{1, 2, 3}, {10, 20, 30}};
    NCCL_OK(ncclGroupStart());
    for (int r = 0; r < 2; r++)
        NCCL_OK(ncclAllReduce(v[r], v[r], 3, ncclFloat64, ncclSum, comms[r], NULL));
    NCCL_OK(ncclGroupEnd());
    for (int r = 0; r < 2; r++)
        CHECK(v[r][0] == 11 && v[r][1] == 22 && v[r][2] == 33, "InitAll all-reduce gave %g %g %g",
              v[r][0], v[r][1], v[r][2]);
    for (int r = 0; r < 2; r++)
        NCCL_OK(ncclCommDestroy(comms[r]));
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc == 2 && strcmp(argv[1], "--device-buffers") == 0) {
        device_mode = 1;
    } else if (argc != 1) {
        fprintf(stderr, "usage: %s [--device-buffers]\n", argv[0]);
        return 2;
    }
    if (loaded_dropin() != 0)
        return 1;
    struct id_area *area =
        mmap(NULL, sizeof(*area), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(area, 0, sizeof(*area));
    pid_t pids[NRANKS];
    for (int r = 0; r < NRANKS; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            my_rank = r;
            signal(SIGALRM, deadline_passed);
            alarm(RANK_DEADLINE_S);
            _exit(run_rank(area) == 0 ? 0 : 1);
        }
        if (pids[r] < 0) {
            perror("fork");
            return 1;
        }
    }
    int failed = 0, left = NRANKS;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            left--;
            for (int r = 0; r < NRANKS; r++)
                if (pids[r] == pid) {
                    pids[r] = 0;
                    if (WIFSIGNALED(status))
                        fprintf(stderr, "FAIL rank %d: killed by signal %d%s\n", r,
                                WTERMSIG(status),
                                WTERMSIG(status) == SIGALRM ? " (its deadline passed: hung)" : "");
                    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                        failed = 1;
                }
            continue;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > PARENT_DEADLINE_S) {
            for (int r = 0; r < NRANKS; r++)
                if (pids[r] > 0) {
                    fprintf(stderr, "FAIL rank %d: hung past %d s, killed\n", r, PARENT_DEADLINE_S);
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                }
            failed = 1;
            break;
        }
        usleep(20000);
    }
    if (!failed)
        printf("%d ranks: every collective matched on %s buffers\n", NRANKS,
               device_mode ? "device" : "host");
    if (process_local() != 0)
        failed = 1;
    if (failed)
        return 1;
    printf("nccl drop-in test: all passed%s\n", device_mode ? " on device buffers" : "");
    return 0;
}
