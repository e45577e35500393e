/*
 * fake-cuda initialisation, knobs, the fork rule, call logging, handles,
 * devices and primary contexts. See fakecuda.h.
 */
#include "fakecuda.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define FC_DEVICE_NAME "Fake H200 (fakecuda)"
#define FC_PCI_BUS_0   0x10

struct fc_global fc = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .progress = PTHREAD_COND_INITIALIZER,
    .knobs = {.launch_fail_after = -1},
    .next_capture_id = 1,
    .last_vmm_handle = 0xFC00000000000000ull, /* far from small integers (fds) */
};

_Thread_local struct CUctx_st *fc_tls_ctx;
_Thread_local int fc_tls_worker;
_Thread_local CUstreamCaptureMode fc_tls_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

static atomic_int debug_state = -1; /* -1: FAKECUDA_DEBUG not read yet */

static int debug_on(void)
{
    int state = atomic_load_explicit(&debug_state, memory_order_relaxed);
    if (state < 0) {
        const char *value = getenv("FAKECUDA_DEBUG");
        state = value != NULL && value[0] != '\0' && strcmp(value, "0") != 0;
        atomic_store_explicit(&debug_state, state, memory_order_relaxed);
    }
    return state;
}

void fc_log(const char *fmt, ...)
{
    if (!debug_on())
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "fakecuda: [pid %d tid %ld] %s\n", (int)getpid(), (long)syscall(SYS_gettid),
            line);
}

CUresult fc_ret(const char *func, CUresult err)
{
    fc_log("%s -> %s", func, fc_error_name(err));
    return err;
}

uint64_t fc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int fc_grow(void **array, unsigned *cap, unsigned need, size_t size)
{
    if (need <= *cap)
        return 0;
    unsigned new_cap = *cap != 0 ? *cap : 4;
    while (new_cap < need)
        new_cap *= 2;
    void *grown = realloc(*array, (size_t)new_cap * size);
    if (grown == NULL)
        return -1;
    *array = grown;
    *cap = new_cap;
    return 0;
}

/* ------------------------------------------------------------ handles */

void fc_handle_add(struct fc_handle *handle, enum fc_handle_kind kind)
{
    handle->kind = kind;
    handle->next = fc.handles[kind];
    fc.handles[kind] = handle;
}

void fc_handle_remove(struct fc_handle *handle)
{
    for (struct fc_handle **it = &fc.handles[handle->kind]; *it != NULL; it = &(*it)->next) {
        if (*it == handle) {
            *it = handle->next;
            handle->next = NULL;
            return;
        }
    }
}

int fc_handle_live(const void *ptr, enum fc_handle_kind kind)
{
    if (ptr == NULL)
        return 0;
    for (const struct fc_handle *it = fc.handles[kind]; it != NULL; it = it->next)
        if ((const void *)it == ptr)
            return 1;
    return 0;
}

/* ------------------------------------------------------------ fork */

/* Like the real driver, CUDA does not survive fork: a child of a process
 * that called cuInit gets CUDA_ERROR_NOT_INITIALIZED from every call,
 * cuInit included. A child of a process that never did starts fresh. */
static void atfork_prepare(void)
{
    pthread_mutex_lock(&fc.lock);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&fc.lock);
}

static void atfork_child(void)
{
    if (atomic_load(&fc.initialized))
        atomic_store(&fc.forked, 1);
    fc_tls_ctx = NULL;
    pthread_mutex_unlock(&fc.lock);
}

__attribute__((constructor)) static void fork_handlers_install(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* ------------------------------------------------------------ entry */

CUresult fc_lock_enter(void)
{
    if (fc_tls_worker)
        return CUDA_ERROR_NOT_PERMITTED;
    if (atomic_load(&fc.forked) || !atomic_load(&fc.initialized))
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&fc.lock);
    return CUDA_SUCCESS;
}

void fc_unlock(void)
{
    pthread_mutex_unlock(&fc.lock);
}

int fc_ctx_valid(const struct CUctx_st *ctx)
{
    return ctx != NULL && ctx >= &fc.ctxs[0] && ctx < &fc.ctxs[fc.knobs.n_devices];
}

CUresult fc_ctx_current(struct CUctx_st **ctx_p)
{
    struct CUctx_st *ctx = fc_tls_ctx;
    if (!fc_ctx_valid(ctx) || !ctx->active)
        return CUDA_ERROR_INVALID_CONTEXT;
    *ctx_p = ctx;
    return CUDA_SUCCESS;
}

static long env_long(const char *name, long fallback)
{
    const char *value = getenv(name);
    if (value == NULL || value[0] == '\0')
        return fallback;
    return strtol(value, NULL, 10);
}

FC_EXPORT CUresult cuInit(unsigned int Flags)
{
    if (fc_tls_worker)
        return fc_ret(__func__, CUDA_ERROR_NOT_PERMITTED);
    if (atomic_load(&fc.forked))
        return fc_ret(__func__, CUDA_ERROR_NOT_INITIALIZED);
    if (Flags != 0)
        return fc_ret(__func__, CUDA_ERROR_INVALID_VALUE);
    CUresult err = CUDA_SUCCESS;
    pthread_mutex_lock(&fc.lock);
    if (!atomic_load(&fc.initialized)) {
        long n = env_long("FAKECUDA_DEVICES", 1);
        fc.knobs.n_devices = n < 0 ? 0 : n > FC_MAX_DEVICES ? FC_MAX_DEVICES : (int)n;
        fc.knobs.no_device = env_long("FAKECUDA_NO_DEVICE", 0) != 0;
        fc.knobs.no_peer = env_long("FAKECUDA_NO_PEER", 0) != 0;
        fc.knobs.no_dmabuf = env_long("FAKECUDA_NO_DMABUF", 0) != 0;
        fc.knobs.no_rdma_flush = env_long("FAKECUDA_NO_RDMA_FLUSH", 0) != 0;
        fc.knobs.no_cumem = env_long("FAKECUDA_NO_CUMEM", 0) != 0;
        fc.knobs.launch_fail_after = env_long("FAKECUDA_LAUNCH_FAIL_AFTER", -1);
        fc.knobs.lazy_ns = (uint64_t)env_long("FAKECUDA_LAZY_US", 2000) * 1000u;
        fc.knobs.host_fn_serial = env_long("FAKECUDA_HOST_FN_SERIAL", 1) != 0;
        fc.knobs.concurrent_blocks = env_long("FAKECUDA_CONCURRENT_BLOCKS", 1) != 0;
        fc.knobs.resident_blocks = env_long("FAKECUDA_RESIDENT_BLOCKS", 0);
        if (fc.knobs.no_device || fc.knobs.n_devices == 0) {
            err = CUDA_ERROR_NO_DEVICE;
        } else {
            for (int i = 0; i < fc.knobs.n_devices; i++)
                fc.ctxs[i].device = i;
            atomic_store(&fc.initialized, 1);
            fc_log("cuInit: %d device(s)%s%s", fc.knobs.n_devices,
                   fc.knobs.no_peer ? ", no peer access" : "",
                   fc.knobs.launch_fail_after >= 0 ? ", launches fail after a count" : "");
        }
    }
    pthread_mutex_unlock(&fc.lock);
    return fc_ret(__func__, err);
}

/* Answered without cuInit, as the real driver does. */
FC_EXPORT CUresult cuDriverGetVersion(int *driverVersion)
{
    if (fc_tls_worker)
        return fc_ret(__func__, CUDA_ERROR_NOT_PERMITTED);
    if (driverVersion == NULL)
        return fc_ret(__func__, CUDA_ERROR_INVALID_VALUE);
    *driverVersion = FC_DRIVER_VERSION;
    return fc_ret(__func__, CUDA_SUCCESS);
}

/* ------------------------------------------------------------ devices */

static int device_valid(CUdevice dev)
{
    return dev >= 0 && dev < fc.knobs.n_devices;
}

FC_EXPORT CUresult cuDeviceGetCount(int *count)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (count == NULL)
        err = CUDA_ERROR_INVALID_VALUE;
    else
        *count = fc.knobs.n_devices;
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (device == NULL)
        err = CUDA_ERROR_INVALID_VALUE;
    else if (!device_valid(ordinal))
        err = CUDA_ERROR_INVALID_DEVICE;
    else
        *device = ordinal;
    fc_unlock();
    return fc_ret(__func__, err);
}

/* An H200-like device. Attributes not listed answer 0 ("not supported"). */
static int attribute_value(CUdevice_attribute attrib, CUdevice dev)
{
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return FC_PCI_BUS_0 + dev;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return FC_MAX_BLOCK_THREADS;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return FC_MAX_DYNAMIC_SMEM;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 232448;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return 233472;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 52428800;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 3;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: return 1;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: return !fc.knobs.no_dmabuf;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS:
        return fc.knobs.no_rdma_flush ? 0 : CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return !fc.knobs.no_cumem;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return !fc.knobs.no_cumem;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: return 1;
    default: return 0;
    }
}

FC_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (pi == NULL || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        err = CUDA_ERROR_INVALID_VALUE;
    else if (!device_valid(dev))
        err = CUDA_ERROR_INVALID_DEVICE;
    else
        *pi = attribute_value(attrib, dev);
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (name == NULL || len <= 0)
        err = CUDA_ERROR_INVALID_VALUE;
    else if (!device_valid(dev))
        err = CUDA_ERROR_INVALID_DEVICE;
    else
        snprintf(name, (size_t)len, "%s", FC_DEVICE_NAME);
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (pciBusId == NULL || len <= 0)
        err = CUDA_ERROR_INVALID_VALUE;
    else if (!device_valid(dev))
        err = CUDA_ERROR_INVALID_DEVICE;
    else
        snprintf(pciBusId, (size_t)len, "0000:%02X:00.0", (unsigned)(FC_PCI_BUS_0 + dev));
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (canAccessPeer == NULL)
        err = CUDA_ERROR_INVALID_VALUE;
    else if (!device_valid(dev) || !device_valid(peerDev))
        err = CUDA_ERROR_INVALID_DEVICE;
    else
        *canAccessPeer = dev != peerDev && !fc.knobs.no_peer;
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (bytes == NULL)
        err = CUDA_ERROR_INVALID_VALUE;
    else if (!device_valid(dev))
        err = CUDA_ERROR_INVALID_DEVICE;
    else
        *bytes = (size_t)FC_TOTAL_MEM;
    fc_unlock();
    return fc_ret(__func__, err);
}

/* ------------------------------------------------------------ contexts */

/* First retain since the last reset: the context comes alive with its
 * legacy stream (whose worker starts with its first work). */
static CUresult ctx_activate(struct CUctx_st *ctx)
{
    struct CUstream_st *legacy = calloc(1, sizeof(*legacy));
    if (legacy == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    legacy->ctx = ctx;
    legacy->kind = FC_STREAM_LEGACY;
    legacy->blocking = 1;
    pthread_cond_init(&legacy->work_cond, NULL);
    legacy->ctx_next = ctx->streams;
    ctx->streams = legacy;
    ctx->legacy = legacy;
    ctx->generation++;
    ctx->active = 1;
    return CUDA_SUCCESS;
}

/* The last release: "the context is automatically reset". Its work is
 * waited for, then its streams, events, modules, memory and registrations
 * are gone; the handle stays and a retain makes it active again. */
static void ctx_reset(struct CUctx_st *ctx)
{
    fc_log("context of device %d: last release, reset", ctx->device);
    fc_capture_abandon_ctx(ctx);
    fc_ctx_drain(ctx);
    fc_ctx_destroy_streams(ctx);
    fc_ctx_destroy_events(ctx);
    fc_ctx_destroy_modules(ctx);
    fc_mem_reset_ctx(ctx);
    for (int i = 0; i < fc.knobs.n_devices; i++)
        fc.ctxs[i].peers &= ~(1ull << ctx->device);
    ctx->peers = 0;
    ctx->legacy = NULL;
    ctx->active = 0;
    ctx->generation++;
}

FC_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (pctx == NULL) {
        err = CUDA_ERROR_INVALID_VALUE;
    } else if (!device_valid(dev)) {
        err = CUDA_ERROR_INVALID_DEVICE;
    } else {
        struct CUctx_st *ctx = &fc.ctxs[dev];
        if (!ctx->active)
            err = ctx_activate(ctx);
        if (err == CUDA_SUCCESS) {
            ctx->refs++;
            *pctx = ctx;
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (!device_valid(dev)) {
        err = CUDA_ERROR_INVALID_DEVICE;
    } else if (fc.ctxs[dev].refs == 0) {
        err = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--fc.ctxs[dev].refs == 0) {
        ctx_reset(&fc.ctxs[dev]);
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (pctx == NULL)
        err = CUDA_ERROR_INVALID_VALUE;
    else
        *pctx = fc_tls_ctx;
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (ctx != NULL && !fc_ctx_valid(ctx))
        err = CUDA_ERROR_INVALID_CONTEXT;
    else
        fc_tls_ctx = ctx;
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    if (device == NULL)
        err = CUDA_ERROR_INVALID_VALUE;
    else if ((err = fc_ctx_current(&ctx)) == CUDA_SUCCESS)
        *device = ctx->device;
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    err = Flags != 0 ? CUDA_ERROR_INVALID_VALUE : fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS) {
        if (!fc_ctx_valid(peerContext) || !peerContext->active || peerContext == ctx)
            err = CUDA_ERROR_INVALID_CONTEXT;
        else if (fc.knobs.no_peer)
            err = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
        else if (ctx->peers & (1ull << peerContext->device))
            err = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
        else
            ctx->peers |= 1ull << peerContext->device;
    }
    fc_unlock();
    return fc_ret(__func__, err);
}
