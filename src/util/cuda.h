/*
 * The CUDA driver API loaded at run time. libconflux links neither libcuda
 * nor libcudart: the first caller of cfx_cuda_api() dlopens CFX_CUDA_DRIVER_LIB
 * (default "libcuda.so.1", the driver every CUDA install puts on the loader's
 * path) and resolves each function by the ABI name <cuda.h> maps it to
 * (cuMemAlloc is cuMemAlloc_v2), so one build runs on hosts with and without
 * a GPU, and a test library with the same names (tests/fakecuda) can stand in
 * for the driver on machines without one.
 *
 * Contexts: Conflux works in each device's primary context, the one the CUDA
 * runtime (and so PyTorch) uses, so streams and pointers a program got from
 * cudart are valid here as they are. cfx_cuda_enter() makes it current on
 * the calling thread when no context is.
 *
 * Built only when the CUDA toolkit was found (CFX_HAVE_CUDA); without it
 * cfx_cuda_api() always answers NULL with a reason.
 */
#ifndef CFX_UTIL_CUDA_H
#define CFX_UTIL_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "cfx_build_config.h"
#include "conflux.h"

#if CFX_HAVE_CUDA
#include <cuda.h>

/* The functions Conflux (and its tests) call, each with <cuda.h>'s signature
 * of the ABI name cuda.c resolves. Append only. Optional ones are NULL when
 * the driver lacks them. */
struct cfx_cuda_api {
    int driver_version; /* cuDriverGetVersion: 12040 is CUDA 12.4. */
    /* Errors. */
    CUresult (*get_error_string)(CUresult error, const char **str);
    CUresult (*get_error_name)(CUresult error, const char **str);
    /* Devices. */
    CUresult (*init)(unsigned int flags);
    CUresult (*driver_get_version)(int *version);
    CUresult (*device_get_count)(int *count);
    CUresult (*device_get)(CUdevice *device, int ordinal);
    CUresult (*device_get_attribute)(int *value, CUdevice_attribute attrib, CUdevice dev);
    CUresult (*device_get_name)(char *name, int len, CUdevice dev);
    CUresult (*device_get_pci_bus_id)(char *bus_id, int len, CUdevice dev);
    CUresult (*device_can_access_peer)(int *can, CUdevice dev, CUdevice peer);
    CUresult (*device_total_mem)(size_t *bytes, CUdevice dev);
    /* Contexts. */
    CUresult (*primary_ctx_retain)(CUcontext *ctx, CUdevice dev);
    CUresult (*primary_ctx_release)(CUdevice dev);
    CUresult (*ctx_get_current)(CUcontext *ctx);
    CUresult (*ctx_set_current)(CUcontext ctx);
    CUresult (*ctx_get_device)(CUdevice *device);
    CUresult (*ctx_enable_peer_access)(CUcontext peer, unsigned int flags);
    /* Memory. */
    CUresult (*pointer_get_attribute)(void *data, CUpointer_attribute attribute, CUdeviceptr ptr);
    CUresult (*pointer_get_attributes)(unsigned int n, CUpointer_attribute *attributes, void **data,
                                       CUdeviceptr ptr);
    CUresult (*mem_alloc)(CUdeviceptr *dptr, size_t bytes);
    CUresult (*mem_free)(CUdeviceptr dptr);
    CUresult (*mem_host_alloc)(void **pp, size_t bytes, unsigned int flags);
    CUresult (*mem_free_host)(void *p);
    CUresult (*mem_host_register)(void *p, size_t bytes, unsigned int flags);
    CUresult (*mem_host_unregister)(void *p);
    CUresult (*mem_host_get_device_pointer)(CUdeviceptr *dptr, void *p, unsigned int flags);
    CUresult (*memcpy_htod)(CUdeviceptr dst, const void *src, size_t bytes);
    CUresult (*memcpy_dtoh)(void *dst, CUdeviceptr src, size_t bytes);
    CUresult (*memcpy_async)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream);
    CUresult (*memcpy_htod_async)(CUdeviceptr dst, const void *src, size_t bytes, CUstream stream);
    CUresult (*memcpy_dtoh_async)(void *dst, CUdeviceptr src, size_t bytes, CUstream stream);
    CUresult (*memset_d8)(CUdeviceptr dst, unsigned char value, size_t n);
    CUresult (*memset_d8_async)(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream);
    /* Streams and events. */
    CUresult (*stream_create)(CUstream *stream, unsigned int flags);
    CUresult (*stream_destroy)(CUstream stream);
    CUresult (*stream_synchronize)(CUstream stream);
    CUresult (*stream_query)(CUstream stream);
    CUresult (*stream_wait_event)(CUstream stream, CUevent event, unsigned int flags);
    CUresult (*stream_is_capturing)(CUstream stream, CUstreamCaptureStatus *status);
    CUresult (*launch_host_func)(CUstream stream, CUhostFn fn, void *user_data);
    /* Optional (NULL: the driver lacks it): a stream waits until a 32-bit
     * word in mapped memory reaches a value (host buffers on streams). */
    CUresult (*stream_wait_value_32)(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                     unsigned int flags);
    /* Optional: the calling thread's stream-capture mode (cfx_cuda_relaxed_begin). */
    CUresult (*thread_exchange_capture_mode)(CUstreamCaptureMode *mode);
    CUresult (*event_create)(CUevent *event, unsigned int flags);
    CUresult (*event_record)(CUevent event, CUstream stream);
    CUresult (*event_query)(CUevent event);
    CUresult (*event_synchronize)(CUevent event);
    CUresult (*event_destroy)(CUevent event);
    CUresult (*event_elapsed_time)(float *ms, CUevent start, CUevent end);
    /* Kernels. */
    CUresult (*module_load_data)(CUmodule *module, const void *image);
    CUresult (*module_get_function)(CUfunction *fn, CUmodule module, const char *name);
    CUresult (*module_unload)(CUmodule module);
    CUresult (*launch_kernel)(CUfunction f, unsigned int grid_x, unsigned int grid_y,
                              unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                              unsigned int block_z, unsigned int shared_bytes, CUstream stream,
                              void **params, void **extra);
    /* Graphs (capture and replay; tests drive them, the executor only asks
     * whether a stream captures). */
    CUresult (*stream_begin_capture)(CUstream stream, CUstreamCaptureMode mode);
    CUresult (*stream_end_capture)(CUstream stream, CUgraph *graph);
    CUresult (*graph_instantiate)(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
    CUresult (*graph_launch)(CUgraphExec exec, CUstream stream);
    CUresult (*graph_destroy)(CUgraph graph);
    CUresult (*graph_exec_destroy)(CUgraphExec exec);
    /* GPUDirect RDMA (optional): a dma-buf descriptor for a range of
     * device memory, for a NIC to register (CUDA 11.7), and the flush that
     * makes a NIC's writes into device memory visible to the GPU (11.3). */
    CUresult (*mem_get_handle_for_address_range)(void *handle, CUdeviceptr dptr, size_t size,
                                                 CUmemRangeHandleType type,
                                                 unsigned long long flags);
    CUresult (*flush_gpu_direct_rdma_writes)(CUflushGPUDirectRDMAWritesTarget target,
                                             CUflushGPUDirectRDMAWritesScope scope);
    /* Legacy CUDA IPC (optional): device memory of one process mapped in
     * another (transports/p2p). */
    CUresult (*ipc_get_mem_handle)(CUipcMemHandle *handle, CUdeviceptr dptr);
    CUresult (*ipc_open_mem_handle)(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags);
    CUresult (*ipc_close_mem_handle)(CUdeviceptr dptr);
    /* cuMem virtual memory management (optional, CUDA 10.2; transports/p2p's
     * P2P/CUMEM): physical allocations exported as file descriptors and
     * mapped by another process. */
    CUresult (*mem_get_allocation_granularity)(size_t *granularity, const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option);
    CUresult (*mem_create)(CUmemGenericAllocationHandle *handle, size_t size,
                           const CUmemAllocationProp *prop, unsigned long long flags);
    CUresult (*mem_release)(CUmemGenericAllocationHandle handle);
    CUresult (*mem_address_reserve)(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags);
    CUresult (*mem_address_free)(CUdeviceptr ptr, size_t size);
    CUresult (*mem_map)(CUdeviceptr ptr, size_t size, size_t offset,
                        CUmemGenericAllocationHandle handle, unsigned long long flags);
    CUresult (*mem_unmap)(CUdeviceptr ptr, size_t size);
    CUresult (*mem_set_access)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count);
    CUresult (*mem_export_to_shareable_handle)(void *shareable, CUmemGenericAllocationHandle handle,
                                               CUmemAllocationHandleType type,
                                               unsigned long long flags);
    CUresult (*mem_import_from_shareable_handle)(CUmemGenericAllocationHandle *handle,
                                                 void *os_handle, CUmemAllocationHandleType type);
};
#else
struct cfx_cuda_api; /* Never defined: no CUDA toolkit at build time. */
#endif

/* The loaded table, or NULL when CUDA cannot be used here; then, when
 * @p why_p is not NULL, *why_p says why in a sentence ("no CUDA driver
 * (libcuda.so.1: cannot open ...)", "the CUDA driver found no GPU
 * (CUDA_ERROR_NO_DEVICE)", "... driver too old (CUDA_ERROR_INSUFFICIENT_DRIVER)").
 * Loads and calls cuInit once per process, thread-safe; the first failure
 * is logged at INFO (subsystem INIT). The library stays loaded until the
 * process exits. In a child forked after the parent loaded it: NULL (CUDA
 * does not survive fork). */
const struct cfx_cuda_api *cfx_cuda_api(const char **why_p);

/* Whether this process uses CUDA already: the driver library is loaded
 * (the program, or its CUDA runtime, opened it), or CFX_CUDA_DRIVER_LIB
 * names one. Loads nothing and never calls cuInit, so a host-only program
 * on a GPU machine pays nothing for CUDA (the core asks this before it
 * treats a rank as a GPU rank). */
int cfx_cuda_in_process(void);

/* The CUDA device of a rank this thread starts now: the device of the
 * context current on this thread, when this process uses CUDA
 * (cfx_cuda_in_process) and one is current; else -1, a host rank. So a
 * program makes its ranks GPU ranks as with NCCL, by cudaSetDevice (or any
 * CUDA call on the device) before init, and a host-only program on a GPU
 * machine never loads CUDA. */
int cfx_cuda_rank_device(void);

/* Make device @p device's primary context current on this thread
 * (cfxCommInitAll's devlist). cfxInvalidArgument with a sentence when CUDA
 * is not usable or there is no such device. */
cfxResult_t cfx_cuda_select(int device);

#if CFX_HAVE_CUDA

/* Set the sentence for a failed driver call (what the caller tried, the
 * driver's name and text for @p err) at @p subsys and return the result it
 * maps to: cfxUnhandledCudaError, or cfxSystemError for out-of-memory. */
cfxResult_t cfx_cuda_error(CUresult err, int subsys, const char *what);

/* Return cfx_cuda_error() from the enclosing function when @p call fails. */
#define CFX_CU_CHECK(cu, call, subsys, what)                                                       \
    do {                                                                                           \
        CUresult cfx_cu_err_ = (cu)->call;                                                         \
        if (cfx_cu_err_ != CUDA_SUCCESS)                                                           \
            return cfx_cuda_error(cfx_cu_err_, subsys, what);                                      \
    } while (0)

/* Make the calling thread's stream-capture mode RELAXED until
 * cfx_cuda_relaxed_end(previous). CUDA forbids "potentially unsafe" calls
 * (cuEventQuery and cuEventSynchronize among them) on a thread while it or,
 * in the default GLOBAL mode, any other thread captures a graph, and such a
 * call invalidates the capture; Conflux's own queries of work recorded
 * outside any capture are safe, so it makes them in RELAXED mode, as
 * PyTorch's NCCL watchdog does. A driver without the call: a no-op. */
CUstreamCaptureMode cfx_cuda_relaxed_begin(const struct cfx_cuda_api *cu);
void cfx_cuda_relaxed_end(const struct cfx_cuda_api *cu, CUstreamCaptureMode previous);

/* The device of the context current on this thread, or when none is
 * current, device 0's primary context made current (as the runtime does at
 * its first call). cfxSuccess with *device_p, or a sentence. */
cfxResult_t cfx_cuda_current_device(int *device_p);

/* Make device @p device's primary context current on this thread unless a
 * context of that device already is. The context stays retained for the
 * process's life (the runtime keeps it too). */
cfxResult_t cfx_cuda_enter(int device);

#endif

/* Where @p ptr points: CFX_MEM_DEVICE-like answers without transport.h:
 * 1 with *device_p for device memory (cuMemAlloc, cudaMalloc, managed), 0
 * for host memory of any kind (pageable, pinned, registered) and for
 * pointers the driver does not know. Never fails. */
int cfx_cuda_is_device_ptr(const void *ptr, int *device_p);

/* Pin and map @p bytes of host memory at @p ptr for every GPU of the process
 * (cuMemHostRegister, portable and device-mapped), device @p device's
 * context made current first: kernels then read and write it at the same
 * address (CFX_CUDA needs unified addressing). Setup time only. cfxSuccess,
 * or a sentence (no CUDA, out of pinnable memory). */
cfxResult_t cfx_cuda_host_register(void *ptr, size_t bytes, int device);

/* @p bytes of device memory on the current context's device, zeroed
 * (cfxMemAlloc on a GPU rank's thread); free with cfx_cuda_mem_free. */
cfxResult_t cfx_cuda_mem_alloc(void **ptr_p, size_t bytes);
cfxResult_t cfx_cuda_mem_free(void *ptr);

/* Undo cfx_cuda_host_register (accepts NULL), device @p device's context
 * made current first (any thread may unpin). Never fails loudly. */
void cfx_cuda_host_unregister(void *ptr, int device);
/* GPUDirect RDMA through dma-buf: whether device @p device's memory can be
 * handed to a NIC as a dma-buf (the driver has cuMemGetHandleForAddressRange
 * and the device says CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED); 0 with
 * *why_p set otherwise. */
int cfx_cuda_dmabuf_supported(int device, const char **why_p);
/* A dma-buf descriptor for @p bytes of device @p device's memory at @p ptr
 * (both aligned to the host page size); the caller closes it once the NIC
 * registered it. Setup time. */
cfxResult_t cfx_cuda_dmabuf_fd(void *ptr, size_t bytes, int device, int *fd_p);
/* Make what a NIC wrote into device @p device's memory visible to that
 * device's kernels (cuFlushGPUDirectRDMAWrites, to the owner), from any
 * thread: device @p device's context is made current first. */
cfxResult_t cfx_cuda_flush_rdma_writes(int device);
/* Whether cfx_cuda_flush_rdma_writes works for device @p device: the driver
 * has cuFlushGPUDirectRDMAWrites (CUDA 11.3) and the device lists
 * CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST among its
 * CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS; 0 with *why_p
 * set otherwise. */
int cfx_cuda_rdma_flush_supported(int device, const char **why_p);

/* ---- Peer memory (transports/p2p). Setup time only, except the copies. */

/* Bytes of an IPC handle (CU_IPC_HANDLE_SIZE). */
#define CFX_CUDA_IPC_HANDLE_BYTES 64

/* The ordinal, in this process, of the GPU at PCI bus id @p busid
 * ("0000:17:00.0", case ignored), or -1 when this process does not see it. */
int cfx_cuda_device_of_busid(const char *busid);
/* Whether a kernel on device @p device can load and store device
 * @p peer's memory: the same device, or cuDeviceCanAccessPeer says so. */
int cfx_cuda_can_access_peer(int device, int peer);
/* Device @p device's compute capability as major * 10 + minor (80 for
 * sm_80), or -1 when it cannot be asked. */
int cfx_cuda_compute_capability(int device);
/* Let device @p device's primary context reach device @p peer's memory
 * (cuCtxEnablePeerAccess; already enabled is success; the same device:
 * nothing to do). */
cfxResult_t cfx_cuda_enable_peer_access(int device, int peer);
/* Whether the driver has legacy CUDA IPC (cuIpcGetMemHandle and friends). */
int cfx_cuda_ipc_supported(void);
/* Write into @p handle (CFX_CUDA_IPC_HANDLE_BYTES) the IPC handle of the
 * device allocation that starts at @p ptr, on device @p device. */
cfxResult_t cfx_cuda_ipc_export(void *ptr, int device, void *handle);
/* Map another process's allocation named by @p handle into device
 * @p device's context (peer access enabled as needed): *ptr_p. */
cfxResult_t cfx_cuda_ipc_open(const void *handle, int device, void **ptr_p);
/* Undo cfx_cuda_ipc_open (accepts NULL). Never fails loudly. */
void cfx_cuda_ipc_close(void *ptr, int device);
/* cuMem (VMM) device memory that another process can map: the physical
 * allocation, exported as a file descriptor (P2P/CUMEM). Unlike legacy IPC,
 * the memory lives until its last mapping is gone, so either side may let
 * go first. */
struct cfx_cuda_vmm {
    void *ptr;       /* The mapping in this process; NULL: none. */
    size_t bytes;    /* Mapped bytes: the request rounded up to the granularity. */
    uint64_t handle; /* The owner's CUmemGenericAllocationHandle; 0 on an importer. */
    int device;      /* The device whose context maps it here. */
};
/* Whether device @p device can make such memory: the driver has the cuMem
 * calls and the device says CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
 * and CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED; 0
 * with *why_p set otherwise. */
int cfx_cuda_vmm_supported(int device, const char **why_p);
/* At least @p bytes of device @p device's memory, zeroed, mapped here with
 * read-write access for that device, exportable as a file descriptor. */
cfxResult_t cfx_cuda_vmm_alloc(int device, size_t bytes, struct cfx_cuda_vmm *vmm);
/* A new file descriptor for @p vmm's allocation (the caller closes it). */
cfxResult_t cfx_cuda_vmm_export(const struct cfx_cuda_vmm *vmm, int *fd_p);
/* Map the allocation of descriptor @p fd (another process's export, of
 * @p bytes, a granularity multiple) for device @p device's kernels to read
 * and write. @p fd stays the caller's. */
cfxResult_t cfx_cuda_vmm_import(int fd, size_t bytes, int device, struct cfx_cuda_vmm *vmm);
/* Unmap and release (accepts a zeroed @p vmm); never fails loudly. */
void cfx_cuda_vmm_free(struct cfx_cuda_vmm *vmm);
/* A stream of device @p device for a host thread's copies to and from
 * device memory (non-blocking: never ordered behind the legacy stream, so
 * never behind a kernel that waits for this thread). */
cfxResult_t cfx_cuda_copy_stream_create(int device, void **stream_p);
void cfx_cuda_copy_stream_destroy(void *stream, int device);
/* Copy @p bytes from @p src to @p dst (either may be device memory, the
 * other host memory) on @p stream of device @p device, and wait for it:
 * how a host thread reads and writes a FIFO's slots that live in device
 * memory. Allocates nothing. */
cfxResult_t cfx_cuda_copy(void *dst, const void *src, size_t bytes, int device, void *stream);

#endif /* CFX_UTIL_CUDA_H */
