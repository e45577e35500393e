/*
 * --mem device: one rank's GPU. conflux-perf links only Conflux's public API,
 * so it loads the CUDA driver itself, as libconflux does (src/util/cuda.c):
 * dlopen of CFX_CUDA_DRIVER_LIB (default "libcuda.so.1"), dlsym of the few
 * functions below by the ABI names <cuda.h> maps them to (cuMemAlloc is
 * cuMemAlloc_v2). A library opened twice is loaded once, so Conflux and
 * conflux-perf share the driver, its contexts, streams and pointers.
 * Rules: probe in the rank's own process (CUDA does not survive fork); the
 * rank's thread keeps its GPU's context current. Built when CMake found the
 * CUDA toolkit (<cuda.h> gives the types); gpu_none.c otherwise.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "perf.h"

#define GPU_XSTR(x) GPU_STR(x)
#define GPU_STR(x)  #x

/* The functions conflux-perf calls, each typed by <cuda.h>'s prototype. */
static struct gpu_driver {
    __typeof__(&cuGetErrorString) get_error_string;
    __typeof__(&cuGetErrorName) get_error_name;
    __typeof__(&cuInit) init;
    __typeof__(&cuDeviceGetCount) device_get_count;
    __typeof__(&cuDeviceGet) device_get;
    __typeof__(&cuDeviceGetName) device_get_name;
    __typeof__(&cuDeviceGetPCIBusId) device_get_pci_bus_id;
    __typeof__(&cuDevicePrimaryCtxRetain) primary_ctx_retain;
    __typeof__(&cuCtxSetCurrent) ctx_set_current;
    __typeof__(&cuMemAlloc) mem_alloc;
    __typeof__(&cuMemFree) mem_free;
    __typeof__(&cuMemHostAlloc) mem_host_alloc;
    __typeof__(&cuMemFreeHost) mem_free_host;
    __typeof__(&cuMemcpyHtoD) memcpy_htod;
    __typeof__(&cuMemcpyDtoH) memcpy_dtoh;
    __typeof__(&cuMemcpyAsync) memcpy_async;
    __typeof__(&cuMemsetD8) memset_d8;
    __typeof__(&cuStreamCreate) stream_create;
    __typeof__(&cuStreamSynchronize) stream_synchronize;
    __typeof__(&cuStreamDestroy) stream_destroy;
    __typeof__(&cuEventCreate) event_create;
    __typeof__(&cuEventRecord) event_record;
    __typeof__(&cuEventSynchronize) event_synchronize;
    __typeof__(&cuEventDestroy) event_destroy;
    __typeof__(&cuEventElapsedTime) event_elapsed_time; /* optional: wall time without it */
} drv;

/* Where each function goes, its ABI name (the macro <cuda.h> maps the plain
 * name to, expanded), and whether the run needs it. */
#define GPU_SYM(field, fn, required)                                                               \
    {                                                                                              \
        offsetof(struct gpu_driver, field), GPU_XSTR(fn), required                                 \
    }

static const struct gpu_sym {
    size_t offset;
    const char *name;
    int required;
} gpu_syms[] = {
    GPU_SYM(get_error_string, cuGetErrorString, 1),
    GPU_SYM(get_error_name, cuGetErrorName, 1),
    GPU_SYM(init, cuInit, 1),
    GPU_SYM(device_get_count, cuDeviceGetCount, 1),
    GPU_SYM(device_get, cuDeviceGet, 1),
    GPU_SYM(device_get_name, cuDeviceGetName, 1),
    GPU_SYM(device_get_pci_bus_id, cuDeviceGetPCIBusId, 1),
    GPU_SYM(primary_ctx_retain, cuDevicePrimaryCtxRetain, 1),
    GPU_SYM(ctx_set_current, cuCtxSetCurrent, 1),
    GPU_SYM(mem_alloc, cuMemAlloc, 1),
    GPU_SYM(mem_free, cuMemFree, 1),
    GPU_SYM(mem_host_alloc, cuMemHostAlloc, 1),
    GPU_SYM(mem_free_host, cuMemFreeHost, 1),
    GPU_SYM(memcpy_htod, cuMemcpyHtoD, 1),
    GPU_SYM(memcpy_dtoh, cuMemcpyDtoH, 1),
    GPU_SYM(memcpy_async, cuMemcpyAsync, 1),
    GPU_SYM(memset_d8, cuMemsetD8, 1),
    GPU_SYM(stream_create, cuStreamCreate, 1),
    GPU_SYM(stream_synchronize, cuStreamSynchronize, 1),
    GPU_SYM(stream_destroy, cuStreamDestroy, 1),
    GPU_SYM(event_create, cuEventCreate, 1),
    GPU_SYM(event_record, cuEventRecord, 1),
    GPU_SYM(event_synchronize, cuEventSynchronize, 1),
    GPU_SYM(event_destroy, cuEventDestroy, 1),
    GPU_SYM(event_elapsed_time, cuEventElapsedTime, 0),
};

struct perf_gpu {
    int rank;
    int device;
    CUstream stream;
    char name[96];
    char busid[32];
};

static pthread_once_t probe_once = PTHREAD_ONCE_INIT; /* -t ranks probe from their threads */
static int probe_count;
static char probe_why[512];

int perf_gpu_built(void)
{
    return 1;
}

/* "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)". */
static void describe_error(CUresult err, char *out, size_t out_bytes)
{
    const char *name = NULL, *text = NULL;
    if (drv.get_error_name == NULL || drv.get_error_name(err, &name) != CUDA_SUCCESS)
        name = NULL;
    if (drv.get_error_string == NULL || drv.get_error_string(err, &text) != CUDA_SUCCESS)
        text = NULL;
    if (name != NULL)
        snprintf(out, out_bytes, "%s (%s)", name, text != NULL ? text : "no description");
    else
        snprintf(out, out_bytes, "CUDA error %d", (int)err);
}

/* Print "rank R: <what> failed: <error>" and return -1. */
static int gpu_failed(const struct perf_gpu *gpu, const char *what, CUresult err)
{
    char text[256];
    describe_error(err, text, sizeof(text));
    fprintf(stderr, "conflux-perf: rank %d: %s failed: %s\n", gpu->rank, what, text);
    return -1;
}

/* Return -1 from the enclosing function when a driver call fails. */
#define GPU_CALL(gpu, what, call)                                                                  \
    do {                                                                                           \
        CUresult err_ = (call);                                                                    \
        if (err_ != CUDA_SUCCESS)                                                                  \
            return gpu_failed((gpu), (what), err_);                                                \
    } while (0)

/* Load, resolve, cuInit, count; the count, or 0 with probe_why set. */
static int probe_load(void)
{
    const char *env = getenv("CFX_CUDA_DRIVER_LIB");
    const char *lib_name = env != NULL && env[0] != '\0' ? env : "libcuda.so.1";
    void *lib = dlopen(lib_name, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *err = dlerror();
        snprintf(probe_why, sizeof(probe_why),
                 "no CUDA driver (%s): this host has no NVIDIA driver, or CFX_CUDA_DRIVER_LIB "
                 "names the wrong file",
                 err != NULL ? err : lib_name);
        return 0;
    }
    for (size_t i = 0; i < sizeof(gpu_syms) / sizeof(gpu_syms[0]); i++) {
        void *fn = dlsym(lib, gpu_syms[i].name);
        if (fn == NULL && gpu_syms[i].required) {
            snprintf(probe_why, sizeof(probe_why),
                     "%s has no %s: not the CUDA driver, or one older than this build's CUDA",
                     lib_name, gpu_syms[i].name);
            memset(&drv, 0, sizeof(drv));
            dlclose(lib);
            return 0;
        }
        memcpy((char *)&drv + gpu_syms[i].offset, &fn, sizeof(fn));
    }
    char text[256];
    CUresult err = drv.init(0);
    if (err != CUDA_SUCCESS) {
        describe_error(err, text, sizeof(text));
        snprintf(probe_why, sizeof(probe_why), "%s: cuInit failed: %s",
                 err == CUDA_ERROR_NO_DEVICE ? "the CUDA driver found no GPU" : lib_name, text);
        return 0; /* The library stays loaded: Conflux may open it too. */
    }
    int count = 0;
    err = drv.device_get_count(&count);
    if (err != CUDA_SUCCESS) {
        describe_error(err, text, sizeof(text));
        snprintf(probe_why, sizeof(probe_why), "%s: cuDeviceGetCount failed: %s", lib_name, text);
        return 0;
    }
    if (count <= 0)
        snprintf(probe_why, sizeof(probe_why), "the CUDA driver found no GPU (%s)", lib_name);
    return count > 0 ? count : 0;
}

static void probe_once_run(void)
{
    probe_count = probe_load();
}

int perf_gpu_probe(const char **why_p)
{
    pthread_once(&probe_once, probe_once_run);
    if (probe_count == 0 && why_p != NULL)
        *why_p = probe_why;
    return probe_count;
}

static int gpu_setup(struct perf_gpu *gpu)
{
    CUdevice dev;
    CUcontext ctx;
    GPU_CALL(gpu, "cuDeviceGet", drv.device_get(&dev, gpu->device));
    GPU_CALL(gpu, "cuDevicePrimaryCtxRetain", drv.primary_ctx_retain(&ctx, dev));
    GPU_CALL(gpu, "cuCtxSetCurrent", drv.ctx_set_current(ctx));
    GPU_CALL(gpu, "cuStreamCreate", drv.stream_create(&gpu->stream, CU_STREAM_NON_BLOCKING));
    if (drv.device_get_name(gpu->name, (int)sizeof(gpu->name), dev) != CUDA_SUCCESS)
        snprintf(gpu->name, sizeof(gpu->name), "GPU %d", gpu->device);
    if (drv.device_get_pci_bus_id(gpu->busid, (int)sizeof(gpu->busid), dev) != CUDA_SUCCESS)
        snprintf(gpu->busid, sizeof(gpu->busid), "%d", gpu->device);
    return 0;
}

struct perf_gpu *perf_gpu_open(int device, int rank)
{
    if (perf_gpu_probe(NULL) <= device || device < 0) {
        fprintf(stderr, "conflux-perf: rank %d: no GPU %d here\n", rank, device);
        return NULL;
    }
    struct perf_gpu *gpu = calloc(1, sizeof(*gpu));
    if (gpu == NULL) {
        fprintf(stderr, "conflux-perf: rank %d: out of memory\n", rank);
        return NULL;
    }
    gpu->rank = rank;
    gpu->device = device;
    if (gpu_setup(gpu) != 0) {
        perf_gpu_close(gpu);
        return NULL;
    }
    return gpu;
}

void perf_gpu_close(struct perf_gpu *gpu)
{
    if (gpu == NULL)
        return;
    if (gpu->stream != NULL && drv.stream_destroy(gpu->stream) != CUDA_SUCCESS)
        fprintf(stderr, "conflux-perf: rank %d: cuStreamDestroy failed\n", gpu->rank);
    free(gpu);
}

cfxStream_t perf_gpu_stream(const struct perf_gpu *gpu)
{
    return gpu->stream; /* cfxStream_t is CUstream (conflux.h). */
}

int perf_gpu_device(const struct perf_gpu *gpu)
{
    return gpu->device;
}

const char *perf_gpu_name(const struct perf_gpu *gpu)
{
    return gpu->name;
}

const char *perf_gpu_busid(const struct perf_gpu *gpu)
{
    return gpu->busid;
}

/* ------------------------------------------------------------ memory */

static CUdeviceptr device_ptr(const void *ptr)
{
    return (CUdeviceptr)(uintptr_t)ptr;
}

void *perf_gpu_alloc(struct perf_gpu *gpu, size_t bytes)
{
    CUdeviceptr ptr = 0;
    CUresult err = drv.mem_alloc(&ptr, bytes);
    if (err != CUDA_SUCCESS) {
        char what[64];
        snprintf(what, sizeof(what), "cuMemAlloc of %zu bytes", bytes);
        gpu_failed(gpu, what, err);
        return NULL;
    }
    /* cuMemsetD8 lands late, on the legacy stream, which the rank's
     * non-blocking stream does not wait for: wait for it here. */
    err = drv.memset_d8(ptr, 0, bytes);
    if (err == CUDA_SUCCESS)
        err = drv.stream_synchronize(NULL);
    if (err != CUDA_SUCCESS) {
        gpu_failed(gpu, "cuMemsetD8", err);
        drv.mem_free(ptr);
        return NULL;
    }
    return (void *)(uintptr_t)ptr;
}

void *perf_gpu_host_alloc(struct perf_gpu *gpu, size_t bytes)
{
    void *ptr = NULL;
    CUresult err = drv.mem_host_alloc(&ptr, bytes, 0);
    if (err != CUDA_SUCCESS) {
        char what[64];
        snprintf(what, sizeof(what), "cuMemHostAlloc of %zu bytes", bytes);
        gpu_failed(gpu, what, err);
        return NULL;
    }
    return ptr;
}

void perf_gpu_host_free(struct perf_gpu *gpu, void *ptr)
{
    if (ptr != NULL && drv.mem_free_host(ptr) != CUDA_SUCCESS)
        fprintf(stderr, "conflux-perf: rank %d: cuMemFreeHost failed\n", gpu->rank);
}

void perf_gpu_free(struct perf_gpu *gpu, void *ptr)
{
    CUresult err = ptr != NULL ? drv.mem_free(device_ptr(ptr)) : CUDA_SUCCESS;
    if (err != CUDA_SUCCESS)
        gpu_failed(gpu, "cuMemFree", err);
}

int perf_gpu_sync(struct perf_gpu *gpu)
{
    GPU_CALL(gpu, "cuStreamSynchronize", drv.stream_synchronize(gpu->stream));
    return 0;
}

int perf_gpu_to_device(struct perf_gpu *gpu, void *dst, const void *src, size_t bytes)
{
    if (perf_gpu_sync(gpu) != 0)
        return -1;
    GPU_CALL(gpu, "cuMemcpyHtoD", drv.memcpy_htod(device_ptr(dst), src, bytes));
    /* From pageable memory it returns before the DMA lands (legacy stream). */
    GPU_CALL(gpu, "cuStreamSynchronize(NULL)", drv.stream_synchronize(NULL));
    return 0;
}

int perf_gpu_to_host(struct perf_gpu *gpu, void *dst, const void *src, size_t bytes)
{
    if (perf_gpu_sync(gpu) != 0)
        return -1;
    GPU_CALL(gpu, "cuMemcpyDtoH", drv.memcpy_dtoh(dst, device_ptr(src), bytes));
    return 0;
}

/* ------------------------------------------------------------ copy bandwidth */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* `reps` copies on the stream; their time in seconds from the events
 * around them (or, without cuEventElapsedTime, the wall time to the sync). */
static int time_copies(struct perf_gpu *gpu, CUevent start, CUevent stop, CUdeviceptr dst,
                       CUdeviceptr src, size_t bytes, int reps, double *seconds_p)
{
    double wall = now_s();
    GPU_CALL(gpu, "cuEventRecord", drv.event_record(start, gpu->stream));
    for (int r = 0; r < reps; r++)
        GPU_CALL(gpu, "cuMemcpyAsync", drv.memcpy_async(dst, src, bytes, gpu->stream));
    GPU_CALL(gpu, "cuEventRecord", drv.event_record(stop, gpu->stream));
    GPU_CALL(gpu, "cuEventSynchronize", drv.event_synchronize(stop));
    wall = now_s() - wall;
    float ms = 0;
    if (drv.event_elapsed_time == NULL) {
        *seconds_p = wall;
        return 0;
    }
    GPU_CALL(gpu, "cuEventElapsedTime", drv.event_elapsed_time(&ms, start, stop));
    *seconds_p = (double)ms * 1e-3;
    return 0;
}

static int copy_loop(struct perf_gpu *gpu, CUevent start, CUevent stop, void *dst, const void *src,
                     size_t bytes, struct perf_copy *copy_p)
{
    double seconds = 0, batch_s = 0;
    long reps = 0;
    int batch = 1;
    /* One copy untimed, then batches, doubling, until about 0.2 s. */
    if (time_copies(gpu, start, stop, device_ptr(dst), device_ptr(src), bytes, 1, &batch_s) != 0)
        return -1;
    while (reps < 3 || (seconds < 0.2 && reps < 10000)) {
        if (time_copies(gpu, start, stop, device_ptr(dst), device_ptr(src), bytes, batch,
                        &batch_s) != 0)
            return -1;
        seconds += batch_s;
        reps += batch;
        if (batch < 1000)
            batch *= 2;
    }
    copy_p->bytes = bytes;
    copy_p->gbps = seconds > 0 ? 2.0 * (double)bytes * (double)reps / seconds / 1e9 : 0.0;
    copy_p->device = 1;
    copy_p->events = drv.event_elapsed_time != NULL;
    return 0;
}

int perf_gpu_copy_bandwidth(struct perf_gpu *gpu, void *dst, const void *src, size_t bytes,
                            struct perf_copy *copy_p)
{
    CUevent start = NULL, stop = NULL;
    CUresult err = drv.event_create(&start, CU_EVENT_DEFAULT);
    if (err == CUDA_SUCCESS)
        err = drv.event_create(&stop, CU_EVENT_DEFAULT);
    int status = err == CUDA_SUCCESS ? copy_loop(gpu, start, stop, dst, src, bytes, copy_p)
                                     : gpu_failed(gpu, "cuEventCreate", err);
    if (stop != NULL)
        drv.event_destroy(stop);
    if (start != NULL)
        drv.event_destroy(start);
    return status;
}
