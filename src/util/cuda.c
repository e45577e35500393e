/*
 * The CUDA driver at run time (see cuda.h): dlopen, dlsym of every function
 * by the ABI name <cuda.h> gives it, cuInit once.
 */
#include "src/util/cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "src/util/check.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"

CFX_PARAM_STR(cuda_driver_lib, "CUDA_DRIVER_LIB", "libcuda.so.1",
              "CUDA driver library to load at run time (a file name or a path)");

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int load_done;
/* Set once, under load_lock, with release: read anywhere with acquire. */
static const struct cfx_cuda_api *_Atomic loaded_api;
/* Set in a child forked after this process loaded the driver: CUDA does not
 * survive fork, so the child must not use the parent's table. */
static int forked_after_load;
static char load_why[400];

static const char *driver_lib_name(void)
{
    const char *name = param_cuda_driver_lib();
    return name != NULL && name[0] != '\0' ? name : "libcuda.so.1";
}

int cfx_cuda_in_process(void)
{
    if (strcmp(driver_lib_name(), "libcuda.so.1") != 0)
        return 1; /* CFX_CUDA_DRIVER_LIB names a driver: use it. */
    void *lib = dlopen(driver_lib_name(), RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (lib == NULL)
        return 0;
    dlclose(lib); /* Drops the reference RTLD_NOLOAD took; the program's stays. */
    return 1;
}

#if CFX_HAVE_CUDA

static struct cfx_cuda_api api_table;
static void *api_lib;

#define CU_XSTR(x) CU_STR(x)
#define CU_STR(x)  #x

/* Every function: where it goes, its ABI name (the macro <cuda.h> maps the
 * plain name to, expanded), and whether it is required. The static assert
 * holds each field's type to <cuda.h>'s prototype. */
#define CU_SYM(field, fn, required)                                                                \
    {                                                                                              \
        offsetof(struct cfx_cuda_api, field), CU_XSTR(fn), required                                \
    }

#define CU_SAME_TYPE(field, fn)                                                                    \
    _Static_assert(__builtin_types_compatible_p(__typeof__(((struct cfx_cuda_api *)0)->field),     \
                                                __typeof__(&fn)),                                  \
                   #field " has the signature of " #fn)

static const struct cu_sym {
    size_t offset;
    const char *name;
    int required;
} cu_syms[] = {
    CU_SYM(get_error_string, cuGetErrorString, 1),
    CU_SYM(get_error_name, cuGetErrorName, 1),
    CU_SYM(init, cuInit, 1),
    CU_SYM(driver_get_version, cuDriverGetVersion, 1),
    CU_SYM(device_get_count, cuDeviceGetCount, 1),
    CU_SYM(device_get, cuDeviceGet, 1),
    CU_SYM(device_get_attribute, cuDeviceGetAttribute, 1),
    CU_SYM(device_get_name, cuDeviceGetName, 1),
    CU_SYM(device_get_pci_bus_id, cuDeviceGetPCIBusId, 1),
    CU_SYM(device_can_access_peer, cuDeviceCanAccessPeer, 1),
    CU_SYM(device_total_mem, cuDeviceTotalMem, 1),
    CU_SYM(primary_ctx_retain, cuDevicePrimaryCtxRetain, 1),
    CU_SYM(primary_ctx_release, cuDevicePrimaryCtxRelease, 1),
    CU_SYM(ctx_get_current, cuCtxGetCurrent, 1),
    CU_SYM(ctx_set_current, cuCtxSetCurrent, 1),
    CU_SYM(ctx_get_device, cuCtxGetDevice, 1),
    CU_SYM(ctx_enable_peer_access, cuCtxEnablePeerAccess, 1),
    CU_SYM(pointer_get_attribute, cuPointerGetAttribute, 1),
    CU_SYM(pointer_get_attributes, cuPointerGetAttributes, 1),
    CU_SYM(mem_alloc, cuMemAlloc, 1),
    CU_SYM(mem_free, cuMemFree, 1),
    CU_SYM(mem_host_alloc, cuMemHostAlloc, 1),
    CU_SYM(mem_free_host, cuMemFreeHost, 1),
    CU_SYM(mem_host_register, cuMemHostRegister, 1),
    CU_SYM(mem_host_unregister, cuMemHostUnregister, 1),
    CU_SYM(mem_host_get_device_pointer, cuMemHostGetDevicePointer, 1),
    CU_SYM(memcpy_htod, cuMemcpyHtoD, 1),
    CU_SYM(memcpy_dtoh, cuMemcpyDtoH, 1),
    CU_SYM(memcpy_async, cuMemcpyAsync, 1),
    CU_SYM(memcpy_htod_async, cuMemcpyHtoDAsync, 1),
    CU_SYM(memcpy_dtoh_async, cuMemcpyDtoHAsync, 1),
    CU_SYM(memset_d8, cuMemsetD8, 1),
    CU_SYM(memset_d8_async, cuMemsetD8Async, 1),
    CU_SYM(stream_create, cuStreamCreate, 1),
    CU_SYM(stream_destroy, cuStreamDestroy, 1),
    CU_SYM(stream_synchronize, cuStreamSynchronize, 1),
    CU_SYM(stream_query, cuStreamQuery, 1),
    CU_SYM(stream_wait_event, cuStreamWaitEvent, 1),
    CU_SYM(stream_is_capturing, cuStreamIsCapturing, 1),
    CU_SYM(launch_host_func, cuLaunchHostFunc, 1),
    CU_SYM(stream_wait_value_32, cuStreamWaitValue32, 0),
    CU_SYM(thread_exchange_capture_mode, cuThreadExchangeStreamCaptureMode, 0),
    CU_SYM(event_create, cuEventCreate, 1),
    CU_SYM(event_record, cuEventRecord, 1),
    CU_SYM(event_query, cuEventQuery, 1),
    CU_SYM(event_synchronize, cuEventSynchronize, 1),
    CU_SYM(event_destroy, cuEventDestroy, 1),
    CU_SYM(event_elapsed_time, cuEventElapsedTime, 0),
    CU_SYM(module_load_data, cuModuleLoadData, 1),
    CU_SYM(module_get_function, cuModuleGetFunction, 1),
    CU_SYM(module_unload, cuModuleUnload, 1),
    CU_SYM(launch_kernel, cuLaunchKernel, 1),
    CU_SYM(stream_begin_capture, cuStreamBeginCapture, 0),
    CU_SYM(stream_end_capture, cuStreamEndCapture, 0),
    CU_SYM(graph_instantiate, cuGraphInstantiate, 0),
    CU_SYM(graph_launch, cuGraphLaunch, 0),
    CU_SYM(graph_destroy, cuGraphDestroy, 0),
    CU_SYM(graph_exec_destroy, cuGraphExecDestroy, 0),
    CU_SYM(mem_get_handle_for_address_range, cuMemGetHandleForAddressRange, 0),
    CU_SYM(flush_gpu_direct_rdma_writes, cuFlushGPUDirectRDMAWrites, 0),
    CU_SYM(ipc_get_mem_handle, cuIpcGetMemHandle, 0),
    CU_SYM(ipc_open_mem_handle, cuIpcOpenMemHandle, 0),
    CU_SYM(ipc_close_mem_handle, cuIpcCloseMemHandle, 0),
    CU_SYM(mem_get_allocation_granularity, cuMemGetAllocationGranularity, 0),
    CU_SYM(mem_create, cuMemCreate, 0),
    CU_SYM(mem_release, cuMemRelease, 0),
    CU_SYM(mem_address_reserve, cuMemAddressReserve, 0),
    CU_SYM(mem_address_free, cuMemAddressFree, 0),
    CU_SYM(mem_map, cuMemMap, 0),
    CU_SYM(mem_unmap, cuMemUnmap, 0),
    CU_SYM(mem_set_access, cuMemSetAccess, 0),
    CU_SYM(mem_export_to_shareable_handle, cuMemExportToShareableHandle, 0),
    CU_SYM(mem_import_from_shareable_handle, cuMemImportFromShareableHandle, 0),
};

CU_SAME_TYPE(get_error_string, cuGetErrorString);
CU_SAME_TYPE(get_error_name, cuGetErrorName);
CU_SAME_TYPE(init, cuInit);
CU_SAME_TYPE(driver_get_version, cuDriverGetVersion);
CU_SAME_TYPE(device_get_count, cuDeviceGetCount);
CU_SAME_TYPE(device_get, cuDeviceGet);
CU_SAME_TYPE(device_get_attribute, cuDeviceGetAttribute);
CU_SAME_TYPE(device_get_name, cuDeviceGetName);
CU_SAME_TYPE(device_get_pci_bus_id, cuDeviceGetPCIBusId);
CU_SAME_TYPE(device_can_access_peer, cuDeviceCanAccessPeer);
CU_SAME_TYPE(device_total_mem, cuDeviceTotalMem);
CU_SAME_TYPE(primary_ctx_retain, cuDevicePrimaryCtxRetain);
CU_SAME_TYPE(primary_ctx_release, cuDevicePrimaryCtxRelease);
CU_SAME_TYPE(ctx_get_current, cuCtxGetCurrent);
CU_SAME_TYPE(ctx_set_current, cuCtxSetCurrent);
CU_SAME_TYPE(ctx_get_device, cuCtxGetDevice);
CU_SAME_TYPE(ctx_enable_peer_access, cuCtxEnablePeerAccess);
CU_SAME_TYPE(pointer_get_attribute, cuPointerGetAttribute);
CU_SAME_TYPE(pointer_get_attributes, cuPointerGetAttributes);
CU_SAME_TYPE(mem_alloc, cuMemAlloc);
CU_SAME_TYPE(mem_free, cuMemFree);
CU_SAME_TYPE(mem_host_alloc, cuMemHostAlloc);
CU_SAME_TYPE(mem_free_host, cuMemFreeHost);
CU_SAME_TYPE(mem_host_register, cuMemHostRegister);
CU_SAME_TYPE(mem_host_unregister, cuMemHostUnregister);
CU_SAME_TYPE(mem_host_get_device_pointer, cuMemHostGetDevicePointer);
CU_SAME_TYPE(memcpy_htod, cuMemcpyHtoD);
CU_SAME_TYPE(memcpy_dtoh, cuMemcpyDtoH);
CU_SAME_TYPE(memcpy_async, cuMemcpyAsync);
CU_SAME_TYPE(memcpy_htod_async, cuMemcpyHtoDAsync);
CU_SAME_TYPE(memcpy_dtoh_async, cuMemcpyDtoHAsync);
CU_SAME_TYPE(memset_d8, cuMemsetD8);
CU_SAME_TYPE(memset_d8_async, cuMemsetD8Async);
CU_SAME_TYPE(stream_create, cuStreamCreate);
CU_SAME_TYPE(stream_destroy, cuStreamDestroy);
CU_SAME_TYPE(stream_synchronize, cuStreamSynchronize);
CU_SAME_TYPE(stream_query, cuStreamQuery);
CU_SAME_TYPE(stream_wait_event, cuStreamWaitEvent);
CU_SAME_TYPE(stream_is_capturing, cuStreamIsCapturing);
CU_SAME_TYPE(launch_host_func, cuLaunchHostFunc);
CU_SAME_TYPE(stream_wait_value_32, cuStreamWaitValue32);
CU_SAME_TYPE(thread_exchange_capture_mode, cuThreadExchangeStreamCaptureMode);
CU_SAME_TYPE(event_create, cuEventCreate);
CU_SAME_TYPE(event_record, cuEventRecord);
CU_SAME_TYPE(event_query, cuEventQuery);
CU_SAME_TYPE(event_synchronize, cuEventSynchronize);
CU_SAME_TYPE(event_destroy, cuEventDestroy);
CU_SAME_TYPE(event_elapsed_time, cuEventElapsedTime);
CU_SAME_TYPE(module_load_data, cuModuleLoadData);
CU_SAME_TYPE(module_get_function, cuModuleGetFunction);
CU_SAME_TYPE(module_unload, cuModuleUnload);
CU_SAME_TYPE(launch_kernel, cuLaunchKernel);
CU_SAME_TYPE(stream_begin_capture, cuStreamBeginCapture);
CU_SAME_TYPE(stream_end_capture, cuStreamEndCapture);
CU_SAME_TYPE(graph_instantiate, cuGraphInstantiate);
CU_SAME_TYPE(graph_launch, cuGraphLaunch);
CU_SAME_TYPE(graph_destroy, cuGraphDestroy);
CU_SAME_TYPE(graph_exec_destroy, cuGraphExecDestroy);
CU_SAME_TYPE(mem_get_handle_for_address_range, cuMemGetHandleForAddressRange);
CU_SAME_TYPE(flush_gpu_direct_rdma_writes, cuFlushGPUDirectRDMAWrites);
CU_SAME_TYPE(ipc_get_mem_handle, cuIpcGetMemHandle);
CU_SAME_TYPE(ipc_open_mem_handle, cuIpcOpenMemHandle);
CU_SAME_TYPE(ipc_close_mem_handle, cuIpcCloseMemHandle);
CU_SAME_TYPE(mem_get_allocation_granularity, cuMemGetAllocationGranularity);
CU_SAME_TYPE(mem_create, cuMemCreate);
CU_SAME_TYPE(mem_release, cuMemRelease);
CU_SAME_TYPE(mem_address_reserve, cuMemAddressReserve);
CU_SAME_TYPE(mem_address_free, cuMemAddressFree);
CU_SAME_TYPE(mem_map, cuMemMap);
CU_SAME_TYPE(mem_unmap, cuMemUnmap);
CU_SAME_TYPE(mem_set_access, cuMemSetAccess);
CU_SAME_TYPE(mem_export_to_shareable_handle, cuMemExportToShareableHandle);
CU_SAME_TYPE(mem_import_from_shareable_handle, cuMemImportFromShareableHandle);

/* The driver's name for @p err ("CUDA_ERROR_NO_DEVICE"), or its number. */
static const char *error_name(CUresult err, char *buf, size_t len)
{
    const char *name = NULL;
    if (api_table.get_error_name != NULL && api_table.get_error_name(err, &name) == CUDA_SUCCESS &&
        name != NULL)
        return name;
    snprintf(buf, len, "CUDA error %d", (int)err);
    return buf;
}

/* Fill api_table from @p lib; 0, or -1 with load_why set. */
static int resolve_all(void *lib, const char *lib_name)
{
    for (size_t i = 0; i < sizeof(cu_syms) / sizeof(cu_syms[0]); i++) {
        const struct cu_sym *sym = &cu_syms[i];
        void *fn = dlsym(lib, sym->name);
        if (fn == NULL && sym->required) {
            snprintf(load_why, sizeof(load_why),
                     "%s has no %s (a CUDA driver older than 11.0, or not the CUDA driver)",
                     lib_name, sym->name);
            return -1;
        }
        memcpy((char *)&api_table + sym->offset, &fn, sizeof(fn));
    }
    return 0;
}

static void load_locked(void)
{
    const char *lib_name = driver_lib_name();
    void *lib = dlopen(lib_name, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *err = dlerror();
        snprintf(load_why, sizeof(load_why),
                 "no CUDA driver (%s): this host has no NVIDIA driver, or CFX_CUDA_DRIVER_LIB "
                 "names the wrong file",
                 err != NULL ? err : lib_name);
        return;
    }
    memset(&api_table, 0, sizeof(api_table));
    if (resolve_all(lib, lib_name) != 0) {
        dlclose(lib);
        return;
    }
    char buf[32];
    CUresult err = api_table.init(0);
    if (err != CUDA_SUCCESS) {
        const char *hint = err == CUDA_ERROR_NO_DEVICE ? "the CUDA driver found no GPU"
                           : err == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH ||
                                   err == CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE
                               ? "the CUDA driver is older than this CUDA needs, or no GPU is "
                                 "usable"
                               : "cuInit failed";
        snprintf(load_why, sizeof(load_why), "%s (%s from %s)", hint, error_name(err, buf, 32),
                 lib_name);
        dlclose(lib);
        memset(&api_table, 0, sizeof(api_table));
        return;
    }
    if (api_table.driver_get_version(&api_table.driver_version) != CUDA_SUCCESS)
        api_table.driver_version = 0;
    api_lib = lib;
    atomic_store_explicit(&loaded_api, &api_table, memory_order_release);
    CFX_INFO(CFX_LOG_INIT, "cuda: loaded %s (driver API %d.%d)", lib_name,
             api_table.driver_version / 1000, api_table.driver_version % 1000 / 10);
}

cfxResult_t cfx_cuda_error(CUresult err, int subsys, const char *what)
{
    char buf[32];
    const char *text = NULL;
    if (api_table.get_error_string == NULL || api_table.get_error_string(err, &text) != 0 ||
        text == NULL)
        text = "unknown error";
    cfxResult_t res = err == CUDA_ERROR_OUT_OF_MEMORY ? cfxSystemError : cfxUnhandledCudaError;
    return cfx_error_set(res, subsys, "%s: %s (%s)", what, text, error_name(err, buf, sizeof(buf)));
}

/* Primary contexts retained so far, by device (retained once, for life). */
#define CUDA_MAX_DEVICES 64
static CUcontext primary[CUDA_MAX_DEVICES];
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;

static cfxResult_t primary_of(const struct cfx_cuda_api *cu, int device, CUcontext *ctx_p)
{
    if (device < 0 || device >= CUDA_MAX_DEVICES)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT, "CUDA device %d is out of range",
                             device);
    pthread_mutex_lock(&primary_lock);
    CUresult err = CUDA_SUCCESS;
    if (primary[device] == NULL) {
        CUdevice dev;
        CUcontext retained = NULL;
        err = cu->device_get(&dev, device);
        if (err == CUDA_SUCCESS)
            err = cu->primary_ctx_retain(&retained, dev);
        if (err == CUDA_SUCCESS) /* cfx_cuda_enter reads it without the lock. */
            __atomic_store_n(&primary[device], retained, __ATOMIC_RELEASE);
    }
    CUcontext ctx = primary[device];
    pthread_mutex_unlock(&primary_lock);
    if (err != CUDA_SUCCESS)
        return cfx_cuda_error(err, CFX_LOG_INIT, "cannot retain the GPU's primary context");
    *ctx_p = ctx;
    return cfxSuccess;
}

cfxResult_t cfx_cuda_enter(int device)
{
    const char *why;
    const struct cfx_cuda_api *cu = cfx_cuda_api(&why);
    if (cu == NULL)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_INIT, "CUDA is not usable here: %s", why);
    CUcontext current = NULL;
    CUdevice dev;
    if (cu->ctx_get_current(&current) == CUDA_SUCCESS && current != NULL) {
        /* The device's primary context (the runtime's): one call per enqueue. */
        int known = device >= 0 && device < CUDA_MAX_DEVICES;
        if (known && current == __atomic_load_n(&primary[device], __ATOMIC_ACQUIRE))
            return cfxSuccess;
        if (cu->ctx_get_device(&dev) == CUDA_SUCCESS && (int)dev == device) {
            CUcontext ctx = NULL; /* Learn the primary's handle, once per device. */
            if (known && __atomic_load_n(&primary[device], __ATOMIC_ACQUIRE) == NULL)
                (void)primary_of(cu, device, &ctx);
            return cfxSuccess;
        }
    }
    CUcontext ctx = NULL;
    CFX_CHECK(primary_of(cu, device, &ctx));
    CFX_CU_CHECK(cu, ctx_set_current(ctx), CFX_LOG_INIT, "cannot make the GPU's context current");
    return cfxSuccess;
}

CUstreamCaptureMode cfx_cuda_relaxed_begin(const struct cfx_cuda_api *cu)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (cu == NULL || cu->thread_exchange_capture_mode == NULL ||
        cu->thread_exchange_capture_mode(&mode) != CUDA_SUCCESS)
        return CU_STREAM_CAPTURE_MODE_RELAXED; /* Nothing to restore. */
    return mode;
}

void cfx_cuda_relaxed_end(const struct cfx_cuda_api *cu, CUstreamCaptureMode previous)
{
    if (cu != NULL && cu->thread_exchange_capture_mode != NULL &&
        previous != CU_STREAM_CAPTURE_MODE_RELAXED)
        cu->thread_exchange_capture_mode(&previous);
}

cfxResult_t cfx_cuda_current_device(int *device_p)
{
    const char *why;
    const struct cfx_cuda_api *cu = cfx_cuda_api(&why);
    if (cu == NULL)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_INIT, "CUDA is not usable here: %s", why);
    CUcontext current = NULL;
    CFX_CU_CHECK(cu, ctx_get_current(&current), CFX_LOG_INIT, "cuCtxGetCurrent");
    if (current == NULL) {
        CFX_CHECK(cfx_cuda_enter(0));
        *device_p = 0;
        return cfxSuccess;
    }
    CUdevice dev;
    CFX_CU_CHECK(cu, ctx_get_device(&dev), CFX_LOG_INIT, "cuCtxGetDevice");
    *device_p = (int)dev;
    return cfxSuccess;
}

int cfx_cuda_is_device_ptr(const void *ptr, int *device_p)
{
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    if (cu == NULL || ptr == NULL)
        return 0;
    /* One call for both (each enqueue asks, for each of its buffers). */
    unsigned int type = 0;
    int ordinal = 0;
    CUpointer_attribute attributes[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                         CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    void *data[2] = {&type, &ordinal};
    if (cu->pointer_get_attributes(2, attributes, data, (CUdeviceptr)(uintptr_t)ptr) !=
            CUDA_SUCCESS ||
        type != CU_MEMORYTYPE_DEVICE)
        return 0;
    if (device_p != NULL)
        *device_p = ordinal;
    return 1;
}

int cfx_cuda_rank_device(void)
{
    if (!cfx_cuda_in_process())
        return -1;
    const struct cfx_cuda_api *cu = cfx_cuda_api(NULL);
    CUcontext current = NULL;
    CUdevice dev;
    if (cu == NULL || cu->ctx_get_current(&current) != CUDA_SUCCESS || current == NULL ||
        cu->ctx_get_device(&dev) != CUDA_SUCCESS)
        return -1;
    return (int)dev;
}

cfxResult_t cfx_cuda_select(int device)
{
    const char *why;
    const struct cfx_cuda_api *cu = cfx_cuda_api(&why);
    if (cu == NULL)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "CUDA device %d requested but no GPU is usable (%s); pass devlist = "
                             "NULL for host ranks",
                             device, why);
    int count = 0;
    CFX_CU_CHECK(cu, device_get_count(&count), CFX_LOG_INIT, "cuDeviceGetCount");
    if (device < 0 || device >= count)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "CUDA device %d requested but this machine has %d", device, count);
    return cfx_cuda_enter(device);
}

cfxResult_t cfx_cuda_host_register(void *ptr, size_t bytes, int device)
{
    CFX_CHECK(cfx_cuda_enter(device));
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    CFX_CU_CHECK(
        cu,
        mem_host_register(ptr, bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
        CFX_LOG_ALLOC, "cannot pin a FIFO's host memory for the GPU (cuMemHostRegister)");
    return cfxSuccess;
}

/* Zero @p bytes of device memory at @p ptr of the current context and wait
 * for it, on a non-blocking stream of its own: cuMemsetD8 would run on the
 * legacy stream, which waits for every blocking stream's work, so a
 * connection made while a kernel runs (point to point, connected at first
 * use) would wait behind that kernel, which may wait for this very rank. */
static CUresult clear_device(const struct cfx_cuda_api *cu, CUdeviceptr ptr, size_t bytes)
{
    CUstream stream = NULL;
    CUresult err = cu->stream_create(&stream, CU_STREAM_NON_BLOCKING);
    if (err == CUDA_SUCCESS)
        err = cu->memset_d8_async(ptr, 0, bytes, stream);
    if (err == CUDA_SUCCESS)
        err = cu->stream_synchronize(stream);
    if (stream != NULL)
        cu->stream_destroy(stream);
    return err;
}

cfxResult_t cfx_cuda_mem_alloc(void **ptr_p, size_t bytes)
{
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    if (cu == NULL)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_ALLOC, "CUDA is not loaded");
    CUdeviceptr ptr = 0;
    CFX_CU_CHECK(cu, mem_alloc(&ptr, bytes), CFX_LOG_ALLOC, "cannot allocate device memory");
    /* Touched now, not by the first call, and waited for: a set still in
     * flight could land after the caller's first copy into the buffer. */
    CUresult err = clear_device(cu, ptr, bytes);
    if (err != CUDA_SUCCESS) {
        cu->mem_free(ptr);
        return cfx_cuda_error(err, CFX_LOG_ALLOC, "cannot clear device memory");
    }
    *ptr_p = (void *)(uintptr_t)ptr;
    return cfxSuccess;
}

cfxResult_t cfx_cuda_mem_free(void *ptr)
{
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    CFX_CU_CHECK(cu, mem_free((CUdeviceptr)(uintptr_t)ptr), CFX_LOG_ALLOC,
                 "cannot free device memory");
    return cfxSuccess;
}

void cfx_cuda_host_unregister(void *ptr, int device)
{
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    if (ptr == NULL || cu == NULL || cfx_cuda_enter(device) != cfxSuccess)
        return;
    CUresult err = cu->mem_host_unregister(ptr);
    if (err != CUDA_SUCCESS)
        CFX_INFO(CFX_LOG_ALLOC, "cuMemHostUnregister(%p) failed with CUDA error %d", ptr, (int)err);
}

int cfx_cuda_dmabuf_supported(int device, const char **why_p)
{
    const char *why = NULL;
    const struct cfx_cuda_api *cu = cfx_cuda_api(&why);
    int yes = 0;
    CUdevice dev;
    if (cu == NULL) {
        /* why from the loader */
    } else if (cu->mem_get_handle_for_address_range == NULL) {
        why = "the CUDA driver has no cuMemGetHandleForAddressRange (CUDA 11.7 or later needed)";
    } else if (cu->device_get(&dev, device) != CUDA_SUCCESS ||
               cu->device_get_attribute(&yes, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) !=
                   CUDA_SUCCESS ||
               !yes) {
        yes = 0;
        why = "the device does not support dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)";
    }
    if (why_p != NULL)
        *why_p = yes ? NULL : why;
    return yes;
}

int cfx_cuda_rdma_flush_supported(int device, const char **why_p)
{
    const char *why = NULL;
    const struct cfx_cuda_api *cu = cfx_cuda_api(&why);
    int options = 0;
    CUdevice dev;
    if (cu == NULL) {
        /* why from the loader */
    } else if (cu->flush_gpu_direct_rdma_writes == NULL) {
        why = "the CUDA driver has no cuFlushGPUDirectRDMAWrites (CUDA 11.3 or later needed)";
    } else if (cu->device_get(&dev, device) != CUDA_SUCCESS ||
               cu->device_get_attribute(&options,
                                        CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
                                        dev) != CUDA_SUCCESS ||
               !(options & CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST)) {
        options = 0;
        why = "the device cannot flush GPUDirect RDMA writes from the host "
              "(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS)";
    }
    int yes = (options & CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST) != 0;
    if (why_p != NULL)
        *why_p = yes ? NULL : why;
    return yes;
}

cfxResult_t cfx_cuda_dmabuf_fd(void *ptr, size_t bytes, int device, int *fd_p)
{
    CFX_CHECK(cfx_cuda_enter(device));
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    if (cu->mem_get_handle_for_address_range == NULL)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_NET,
                             "the CUDA driver has no cuMemGetHandleForAddressRange");
    int fd = -1;
    CFX_CU_CHECK(cu,
                 mem_get_handle_for_address_range(&fd, (CUdeviceptr)(uintptr_t)ptr, bytes,
                                                  CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                 CFX_LOG_NET, "cannot export device memory as a dma-buf");
    *fd_p = fd;
    return cfxSuccess;
}

cfxResult_t cfx_cuda_flush_rdma_writes(int device)
{
    CFX_CHECK(cfx_cuda_enter(device));
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    if (cu->flush_gpu_direct_rdma_writes == NULL)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_NET,
                             "the CUDA driver has no cuFlushGPUDirectRDMAWrites");
    CFX_CU_CHECK(cu,
                 flush_gpu_direct_rdma_writes(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                                              CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER),
                 CFX_LOG_NET, "cannot flush the NIC's writes into device memory");
    return cfxSuccess;
}

/* ------------------------------------------------------------ peer memory */

int cfx_cuda_device_of_busid(const char *busid)
{
    const struct cfx_cuda_api *cu = cfx_cuda_api(NULL);
    int count = 0;
    if (cu == NULL || busid == NULL || busid[0] == '\0' ||
        cu->device_get_count(&count) != CUDA_SUCCESS)
        return -1;
    for (int d = 0; d < count; d++) {
        CUdevice dev;
        char id[32] = "";
        if (cu->device_get(&dev, d) == CUDA_SUCCESS &&
            cu->device_get_pci_bus_id(id, (int)sizeof(id), dev) == CUDA_SUCCESS &&
            strcasecmp(id, busid) == 0)
            return d;
    }
    return -1;
}

int cfx_cuda_can_access_peer(int device, int peer)
{
    const struct cfx_cuda_api *cu = cfx_cuda_api(NULL);
    if (cu == NULL || device < 0 || peer < 0)
        return 0;
    if (device == peer)
        return 1;
    CUdevice a, b;
    int can = 0;
    return cu->device_get(&a, device) == CUDA_SUCCESS && cu->device_get(&b, peer) == CUDA_SUCCESS &&
           cu->device_can_access_peer(&can, a, b) == CUDA_SUCCESS && can;
}

int cfx_cuda_compute_capability(int device)
{
    const struct cfx_cuda_api *cu = cfx_cuda_api(NULL);
    CUdevice dev;
    int major = 0, minor = 0;
    if (cu == NULL || device < 0 || cu->device_get(&dev, device) != CUDA_SUCCESS ||
        cu->device_get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) !=
            CUDA_SUCCESS ||
        cu->device_get_attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) !=
            CUDA_SUCCESS)
        return -1;
    return major * 10 + minor;
}

cfxResult_t cfx_cuda_enable_peer_access(int device, int peer)
{
    if (device == peer)
        return cfxSuccess;
    CFX_CHECK(cfx_cuda_enter(peer));
    CUcontext peer_ctx = NULL;
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    CFX_CU_CHECK(cu, ctx_get_current(&peer_ctx), CFX_LOG_P2P, "cuCtxGetCurrent");
    CFX_CHECK(cfx_cuda_enter(device));
    CUresult err = cu->ctx_enable_peer_access(peer_ctx, 0);
    if (err != CUDA_SUCCESS && err != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
        return cfx_cuda_error(err, CFX_LOG_P2P,
                              "cannot enable peer access (cuCtxEnablePeerAccess)");
    return cfxSuccess;
}

int cfx_cuda_ipc_supported(void)
{
    const struct cfx_cuda_api *cu = cfx_cuda_api(NULL);
    return cu != NULL && cu->ipc_get_mem_handle != NULL && cu->ipc_open_mem_handle != NULL &&
           cu->ipc_close_mem_handle != NULL;
}

cfxResult_t cfx_cuda_ipc_export(void *ptr, int device, void *handle)
{
    if (!cfx_cuda_ipc_supported())
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_P2P, "the CUDA driver has no CUDA IPC");
    CFX_CHECK(cfx_cuda_enter(device));
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    CUipcMemHandle h;
    CFX_CU_CHECK(cu, ipc_get_mem_handle(&h, (CUdeviceptr)(uintptr_t)ptr), CFX_LOG_P2P,
                 "cannot export device memory to another process (cuIpcGetMemHandle)");
    memcpy(handle, &h, sizeof(h));
    return cfxSuccess;
}

cfxResult_t cfx_cuda_ipc_open(const void *handle, int device, void **ptr_p)
{
    if (!cfx_cuda_ipc_supported())
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_P2P, "the CUDA driver has no CUDA IPC");
    CFX_CHECK(cfx_cuda_enter(device));
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    CUipcMemHandle h;
    memcpy(&h, handle, sizeof(h));
    CUdeviceptr ptr = 0;
    CFX_CU_CHECK(cu, ipc_open_mem_handle(&ptr, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CFX_LOG_P2P,
                 "cannot map another process's device memory (cuIpcOpenMemHandle)");
    *ptr_p = (void *)(uintptr_t)ptr;
    return cfxSuccess;
}

void cfx_cuda_ipc_close(void *ptr, int device)
{
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    if (ptr == NULL || cu == NULL || cu->ipc_close_mem_handle == NULL ||
        cfx_cuda_enter(device) != cfxSuccess)
        return;
    CUresult err = cu->ipc_close_mem_handle((CUdeviceptr)(uintptr_t)ptr);
    if (err != CUDA_SUCCESS)
        CFX_INFO(CFX_LOG_P2P, "cuIpcCloseMemHandle(%p) failed with CUDA error %d", ptr, (int)err);
}

/* ---- cuMem (VMM) memory shared as file descriptors */

static void vmm_prop(CUmemAllocationProp *prop, CUdevice dev)
{
    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = dev;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

int cfx_cuda_vmm_supported(int device, const char **why_p)
{
    const char *why = NULL;
    const struct cfx_cuda_api *cu = cfx_cuda_api(&why);
    int vmm = 0, fd = 0;
    CUdevice dev;
    if (cu == NULL) {
        /* why from the loader */
    } else if (cu->mem_create == NULL || cu->mem_export_to_shareable_handle == NULL ||
               cu->mem_import_from_shareable_handle == NULL || cu->mem_map == NULL ||
               cu->mem_set_access == NULL || cu->mem_address_reserve == NULL ||
               cu->mem_get_allocation_granularity == NULL || cu->mem_unmap == NULL ||
               cu->mem_release == NULL || cu->mem_address_free == NULL) {
        why = "the CUDA driver has no cuMem virtual memory calls (CUDA 10.2 or later needed)";
    } else if (cu->device_get(&dev, device) != CUDA_SUCCESS ||
               cu->device_get_attribute(&vmm,
                                        CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                        dev) != CUDA_SUCCESS ||
               cu->device_get_attribute(
                   &fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev) !=
                   CUDA_SUCCESS ||
               !vmm || !fd) {
        vmm = fd = 0;
        why = "the device cannot export cuMem allocations as file descriptors";
    }
    if (why_p != NULL)
        *why_p = vmm && fd ? NULL : why;
    return vmm && fd;
}

/* Reserve an address range for @p bytes, map @p handle there and let
 * device @p dev read and write it. */
static CUresult vmm_map(const struct cfx_cuda_api *cu, CUmemGenericAllocationHandle handle,
                        size_t bytes, size_t align, CUdevice dev, CUdeviceptr *ptr_p)
{
    CUdeviceptr ptr = 0;
    CUresult err = cu->mem_address_reserve(&ptr, bytes, align, 0, 0);
    if (err != CUDA_SUCCESS)
        return err;
    err = cu->mem_map(ptr, bytes, 0, handle, 0);
    if (err != CUDA_SUCCESS) {
        cu->mem_address_free(ptr, bytes);
        return err;
    }
    CUmemAccessDesc access;
    memset(&access, 0, sizeof(access));
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = dev;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    err = cu->mem_set_access(ptr, bytes, &access, 1);
    if (err != CUDA_SUCCESS) {
        cu->mem_unmap(ptr, bytes);
        cu->mem_address_free(ptr, bytes);
        return err;
    }
    *ptr_p = ptr;
    return CUDA_SUCCESS;
}

/* What cuMem calls on @p device need: the device entered, its handle, the
 * allocation's properties and granularity (at least 1). */
static cfxResult_t vmm_begin(int device, int subsys, const struct cfx_cuda_api **cu_p,
                             CUdevice *dev_p, CUmemAllocationProp *prop, size_t *gran_p)
{
    const char *why = NULL;
    if (!cfx_cuda_vmm_supported(device, &why))
        return cfx_error_set(cfxInvalidUsage, subsys, "%s", why);
    CFX_CHECK(cfx_cuda_enter(device));
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    CFX_CU_CHECK(cu, device_get(dev_p, device), subsys, "cuDeviceGet");
    vmm_prop(prop, *dev_p);
    size_t gran = 0;
    CFX_CU_CHECK(cu, mem_get_allocation_granularity(&gran, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                 subsys, "cuMemGetAllocationGranularity");
    *gran_p = gran > 0 ? gran : 1;
    *cu_p = cu;
    return cfxSuccess;
}

cfxResult_t cfx_cuda_vmm_alloc(int device, size_t bytes, struct cfx_cuda_vmm *vmm)
{
    memset(vmm, 0, sizeof(*vmm));
    const struct cfx_cuda_api *cu = NULL;
    CUdevice dev;
    CUmemAllocationProp prop;
    size_t gran = 1;
    CFX_CHECK(vmm_begin(device, CFX_LOG_ALLOC, &cu, &dev, &prop, &gran));
    size_t rounded = (bytes + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle handle = 0;
    CFX_CU_CHECK(cu, mem_create(&handle, rounded, &prop, 0), CFX_LOG_ALLOC,
                 "cannot allocate shareable device memory (cuMemCreate)");
    CUdeviceptr ptr = 0;
    CUresult err = vmm_map(cu, handle, rounded, gran, dev, &ptr);
    if (err == CUDA_SUCCESS) {
        err = clear_device(cu, ptr, rounded);
        if (err != CUDA_SUCCESS) {
            cu->mem_unmap(ptr, rounded);
            cu->mem_address_free(ptr, rounded);
        }
    }
    if (err != CUDA_SUCCESS) {
        cu->mem_release(handle);
        return cfx_cuda_error(err, CFX_LOG_ALLOC,
                              "cannot map and clear shareable device memory (cuMemMap)");
    }
    vmm->ptr = (void *)(uintptr_t)ptr;
    vmm->bytes = rounded;
    vmm->handle = (uint64_t)handle;
    vmm->device = device;
    return cfxSuccess;
}

cfxResult_t cfx_cuda_vmm_export(const struct cfx_cuda_vmm *vmm, int *fd_p)
{
    CFX_CHECK(cfx_cuda_enter(vmm->device));
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    int fd = -1;
    CFX_CU_CHECK(cu,
                 mem_export_to_shareable_handle(&fd, (CUmemGenericAllocationHandle)vmm->handle,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 CFX_LOG_P2P,
                 "cannot export device memory as a file descriptor "
                 "(cuMemExportToShareableHandle)");
    *fd_p = fd;
    return cfxSuccess;
}

cfxResult_t cfx_cuda_vmm_import(int fd, size_t bytes, int device, struct cfx_cuda_vmm *vmm)
{
    memset(vmm, 0, sizeof(*vmm));
    const struct cfx_cuda_api *cu = NULL;
    CUdevice dev;
    CUmemAllocationProp prop;
    size_t gran = 1;
    CFX_CHECK(vmm_begin(device, CFX_LOG_P2P, &cu, &dev, &prop, &gran));
    CUmemGenericAllocationHandle handle = 0;
    CFX_CU_CHECK(cu,
                 mem_import_from_shareable_handle(&handle, (void *)(uintptr_t)fd,
                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                 CFX_LOG_P2P,
                 "cannot import another process's device memory "
                 "(cuMemImportFromShareableHandle)");
    CUdeviceptr ptr = 0;
    CUresult err = vmm_map(cu, handle, bytes, gran, dev, &ptr);
    /* The mapping holds the memory; the handle is not needed any more. */
    cu->mem_release(handle);
    if (err != CUDA_SUCCESS)
        return cfx_cuda_error(err, CFX_LOG_P2P,
                              "cannot map another process's device memory (cuMemMap)");
    vmm->ptr = (void *)(uintptr_t)ptr;
    vmm->bytes = bytes;
    vmm->device = device;
    return cfxSuccess;
}

void cfx_cuda_vmm_free(struct cfx_cuda_vmm *vmm)
{
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    if (vmm->ptr == NULL || cu == NULL || cfx_cuda_enter(vmm->device) != cfxSuccess)
        return;
    CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)vmm->ptr;
    CUresult err = cu->mem_unmap(ptr, vmm->bytes);
    if (err == CUDA_SUCCESS)
        err = cu->mem_address_free(ptr, vmm->bytes);
    if (vmm->handle != 0 && err == CUDA_SUCCESS)
        err = cu->mem_release((CUmemGenericAllocationHandle)vmm->handle);
    if (err != CUDA_SUCCESS)
        CFX_INFO(CFX_LOG_P2P, "releasing cuMem memory at %p failed with CUDA error %d", vmm->ptr,
                 (int)err);
    memset(vmm, 0, sizeof(*vmm));
}

cfxResult_t cfx_cuda_copy_stream_create(int device, void **stream_p)
{
    CFX_CHECK(cfx_cuda_enter(device));
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    CUstream stream = NULL;
    CFX_CU_CHECK(cu, stream_create(&stream, CU_STREAM_NON_BLOCKING), CFX_LOG_ALLOC,
                 "cannot create a stream for copies to device memory");
    *stream_p = stream;
    return cfxSuccess;
}

void cfx_cuda_copy_stream_destroy(void *stream, int device)
{
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    if (stream == NULL || cu == NULL || cfx_cuda_enter(device) != cfxSuccess)
        return;
    cu->stream_destroy((CUstream)stream);
}

cfxResult_t cfx_cuda_copy(void *dst, const void *src, size_t bytes, int device, void *stream)
{
    CFX_CHECK(cfx_cuda_enter(device));
    const struct cfx_cuda_api *cu = atomic_load_explicit(&loaded_api, memory_order_acquire);
    CFX_CU_CHECK(cu,
                 memcpy_async((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes,
                              (CUstream)stream),
                 CFX_LOG_COLL, "cannot copy between a FIFO slot in device memory and host memory");
    CFX_CU_CHECK(cu, stream_synchronize((CUstream)stream), CFX_LOG_COLL,
                 "a copy between a FIFO slot in device memory and host memory failed");
    return cfxSuccess;
}

#else /* !CFX_HAVE_CUDA */

static void load_locked(void)
{
    snprintf(load_why, sizeof(load_why), "this Conflux was built without the CUDA toolkit");
}

#endif

#if !CFX_HAVE_CUDA
int cfx_cuda_rank_device(void)
{
    return -1;
}

int cfx_cuda_is_device_ptr(const void *ptr, int *device_p)
{
    (void)ptr;
    (void)device_p;
    return 0;
}

cfxResult_t cfx_cuda_host_register(void *ptr, size_t bytes, int device)
{
    (void)ptr;
    (void)bytes;
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_ALLOC,
                         "cannot pin memory for CUDA device %d: this Conflux was built without "
                         "CUDA",
                         device);
}

void cfx_cuda_host_unregister(void *ptr, int device)
{
    (void)ptr;
    (void)device;
}

cfxResult_t cfx_cuda_mem_alloc(void **ptr_p, size_t bytes)
{
    (void)ptr_p;
    (void)bytes;
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_ALLOC, "this Conflux was built without CUDA");
}

cfxResult_t cfx_cuda_mem_free(void *ptr)
{
    (void)ptr;
    return cfxSuccess;
}

int cfx_cuda_dmabuf_supported(int device, const char **why_p)
{
    (void)device;
    if (why_p != NULL)
        *why_p = "this Conflux was built without CUDA";
    return 0;
}

int cfx_cuda_rdma_flush_supported(int device, const char **why_p)
{
    (void)device;
    if (why_p != NULL)
        *why_p = "this Conflux was built without CUDA";
    return 0;
}

cfxResult_t cfx_cuda_dmabuf_fd(void *ptr, size_t bytes, int device, int *fd_p)
{
    (void)ptr;
    (void)bytes;
    (void)device;
    *fd_p = -1;
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_NET, "this Conflux was built without CUDA");
}

cfxResult_t cfx_cuda_flush_rdma_writes(int device)
{
    (void)device;
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_NET, "this Conflux was built without CUDA");
}

int cfx_cuda_device_of_busid(const char *busid)
{
    (void)busid;
    return -1;
}

int cfx_cuda_can_access_peer(int device, int peer)
{
    (void)device;
    (void)peer;
    return 0;
}

int cfx_cuda_compute_capability(int device)
{
    (void)device;
    return -1;
}

cfxResult_t cfx_cuda_enable_peer_access(int device, int peer)
{
    (void)device;
    (void)peer;
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_P2P, "this Conflux was built without CUDA");
}

int cfx_cuda_ipc_supported(void)
{
    return 0;
}

cfxResult_t cfx_cuda_ipc_export(void *ptr, int device, void *handle)
{
    (void)ptr;
    (void)device;
    (void)handle;
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_P2P, "this Conflux was built without CUDA");
}

cfxResult_t cfx_cuda_ipc_open(const void *handle, int device, void **ptr_p)
{
    (void)handle;
    (void)device;
    *ptr_p = NULL;
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_P2P, "this Conflux was built without CUDA");
}

void cfx_cuda_ipc_close(void *ptr, int device)
{
    (void)ptr;
    (void)device;
}

int cfx_cuda_vmm_supported(int device, const char **why_p)
{
    (void)device;
    if (why_p != NULL)
        *why_p = "this Conflux was built without CUDA";
    return 0;
}

cfxResult_t cfx_cuda_vmm_alloc(int device, size_t bytes, struct cfx_cuda_vmm *vmm)
{
    (void)device;
    (void)bytes;
    memset(vmm, 0, sizeof(*vmm));
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_ALLOC, "this Conflux was built without CUDA");
}

cfxResult_t cfx_cuda_vmm_export(const struct cfx_cuda_vmm *vmm, int *fd_p)
{
    (void)vmm;
    *fd_p = -1;
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_P2P, "this Conflux was built without CUDA");
}

cfxResult_t cfx_cuda_vmm_import(int fd, size_t bytes, int device, struct cfx_cuda_vmm *vmm)
{
    (void)fd;
    (void)bytes;
    (void)device;
    memset(vmm, 0, sizeof(*vmm));
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_P2P, "this Conflux was built without CUDA");
}

void cfx_cuda_vmm_free(struct cfx_cuda_vmm *vmm)
{
    memset(vmm, 0, sizeof(*vmm));
}

cfxResult_t cfx_cuda_copy_stream_create(int device, void **stream_p)
{
    (void)device;
    *stream_p = NULL;
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_ALLOC, "this Conflux was built without CUDA");
}

void cfx_cuda_copy_stream_destroy(void *stream, int device)
{
    (void)stream;
    (void)device;
}

cfxResult_t cfx_cuda_copy(void *dst, const void *src, size_t bytes, int device, void *stream)
{
    (void)dst;
    (void)src;
    (void)bytes;
    (void)device;
    (void)stream;
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL, "this Conflux was built without CUDA");
}

cfxResult_t cfx_cuda_select(int device)
{
    return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                         "CUDA device %d requested but this Conflux was built without CUDA; pass "
                         "devlist = NULL for host ranks",
                         device);
}
#endif

static void forked_child(void)
{
    if (atomic_load_explicit(&loaded_api, memory_order_relaxed) != NULL)
        forked_after_load = 1;
    pthread_mutex_init(&load_lock, NULL);
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void atfork_install(void)
{
    pthread_atfork(NULL, NULL, forked_child);
}

const struct cfx_cuda_api *cfx_cuda_api(const char **why_p)
{
    pthread_once(&atfork_once, atfork_install);
    pthread_mutex_lock(&load_lock);
    if (forked_after_load) {
        pthread_mutex_unlock(&load_lock);
        if (why_p != NULL)
            *why_p = "this process was forked from one that had loaded CUDA, and CUDA does not "
                     "survive fork: start the ranks' processes before any CUDA call";
        return NULL;
    }
    if (!load_done) {
        load_done = 1;
        load_locked();
        if (atomic_load_explicit(&loaded_api, memory_order_relaxed) == NULL)
            CFX_INFO(CFX_LOG_INIT, "cuda: off: %s", load_why);
    }
    const struct cfx_cuda_api *api = atomic_load_explicit(&loaded_api, memory_order_relaxed);
    pthread_mutex_unlock(&load_lock);
    if (api == NULL && why_p != NULL)
        *why_p = load_why;
    return api;
}
