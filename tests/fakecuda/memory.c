/*
 * fake-cuda memory: the registry of the memory the fake knows, device
 * allocations (host memory: each a shared mapping of a memfd of its own,
 * page aligned, so CUDA IPC can map it in another process), pinned host
 * allocations, registered host ranges, pointer attributes, and the copies
 * and sets with their bounds checks. cuMem mappings (vmm.c) are device
 * memory of the same registry. All of it is host
 * memory: a host-side access to "device" memory is not caught (ASan still
 * sees one past the allocation's rounded size, or after cuMemFree). See
 * fakecuda.h.
 */
#include "fakecuda.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HOST_ALLOC_FLAGS                                                                           \
    (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)
#define HOST_REGISTER_FLAGS                                                                        \
    (CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY |    \
     CU_MEMHOSTREGISTER_READ_ONLY)

static size_t round_up(size_t bytes, size_t align)
{
    return (bytes + align - 1) / align * align;
}

/* ------------------------------------------------------------ registry */

/* Index of the first allocation whose base is above @p addr. */
static size_t upper_index(uintptr_t addr)
{
    size_t lo = 0, hi = fc.n_allocs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (fc.allocs[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

struct fc_alloc *fc_alloc_find(uintptr_t addr)
{
    size_t i = upper_index(addr);
    if (i == 0)
        return NULL;
    struct fc_alloc *alloc = &fc.allocs[i - 1];
    return addr - alloc->base < alloc->bytes ? alloc : NULL;
}

struct fc_alloc *fc_alloc_overlapping(uintptr_t addr, size_t bytes)
{
    size_t i = upper_index(addr + bytes - 1);
    if (i == 0)
        return NULL;
    struct fc_alloc *alloc = &fc.allocs[i - 1];
    return alloc->base + alloc->bytes > addr ? alloc : NULL;
}

int fc_alloc_insert(const struct fc_alloc *alloc)
{
    unsigned cap = (unsigned)fc.cap_allocs;
    if (fc_grow((void **)&fc.allocs, &cap, (unsigned)fc.n_allocs + 1, sizeof(*fc.allocs)) != 0)
        return -1;
    fc.cap_allocs = cap;
    size_t i = upper_index(alloc->base);
    memmove(&fc.allocs[i + 1], &fc.allocs[i], (fc.n_allocs - i) * sizeof(*fc.allocs));
    fc.allocs[i] = *alloc;
    fc.n_allocs++;
    return 0;
}

static void alloc_remove(struct fc_alloc *alloc)
{
    size_t i = (size_t)(alloc - fc.allocs);
    memmove(&fc.allocs[i], &fc.allocs[i + 1], (fc.n_allocs - i - 1) * sizeof(*fc.allocs));
    fc.n_allocs--;
}

/* The allocation of @p kind that starts exactly at @p addr, or NULL. */
static struct fc_alloc *alloc_at(uintptr_t addr, enum fc_mem_kind kind)
{
    struct fc_alloc *alloc = fc_alloc_find(addr);
    return alloc != NULL && alloc->base == addr && alloc->kind == kind ? alloc : NULL;
}

void fc_alloc_release(struct fc_alloc *alloc)
{
    if (alloc->kind == FC_MEM_DEVICE)
        fc.used_bytes[alloc->ctx->device] -= alloc->bytes;
    if (alloc->kind == FC_MEM_VMM) {
        fc_vmm_unmapped(alloc); /* the reservation stays */
    } else if (fc_kind_is_device(alloc->kind)) {
        munmap((void *)alloc->base, alloc->mapped);
        if (alloc->fd >= 0)
            close(alloc->fd);
    } else if (alloc->kind != FC_MEM_REGISTERED) {
        free((void *)alloc->base);
    }
    alloc_remove(alloc);
}

/* Fresh "device" memory: a shared mapping of a memfd of its own, so that
 * another process can map the same pages (cuIpcOpenMemHandle). NULL on
 * failure. */
static void *device_block(size_t bytes, int *fd_p, size_t *mapped_p)
{
    size_t mapped = round_up(bytes, (size_t)sysconf(_SC_PAGESIZE));
    int fd = memfd_create("fakecuda-device", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    void *block = MAP_FAILED;
    if (ftruncate(fd, (off_t)mapped) == 0)
        block = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (block == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    *fd_p = fd;
    *mapped_p = mapped;
    return block;
}

void fc_mem_reset_ctx(struct CUctx_st *ctx)
{
    size_t i = 0;
    while (i < fc.n_allocs) {
        if (fc.allocs[i].ctx == ctx && fc.allocs[i].kind != FC_MEM_VMM)
            fc_alloc_release(&fc.allocs[i]);
        else
            i++;
    }
}

CUresult fc_mem_check(uintptr_t addr, size_t bytes, int must_be_known)
{
    if (bytes == 0)
        return CUDA_SUCCESS;
    if (addr == 0)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fc_alloc *alloc = fc_alloc_find(addr);
    if (alloc == NULL)
        return must_be_known ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    if (bytes > alloc->bytes - (addr - alloc->base)) {
        fc_log("%zu bytes at %#lx run %zu bytes past the end of an allocation of %zu", bytes,
               (unsigned long)addr, bytes - (alloc->bytes - (addr - alloc->base)), alloc->bytes);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* Common head of the calls that allocate, free or (un)register: a current
 * context and no capture that forbids them. */
static CUresult unsafe_call_head(struct CUctx_st **ctx_p)
{
    CUresult err = fc_ctx_current(ctx_p);
    if (err != CUDA_SUCCESS)
        return err;
    return fc_capture_unsafe_call();
}

/* ------------------------------------------------------------ allocation */

FC_EXPORT CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    err = dptr == NULL || bytesize == 0 ? CUDA_ERROR_INVALID_VALUE : unsafe_call_head(&ctx);
    if (err == CUDA_SUCCESS && bytesize > FC_TOTAL_MEM - fc.used_bytes[ctx->device])
        err = CUDA_ERROR_OUT_OF_MEMORY;
    if (err == CUDA_SUCCESS) {
        int fd = -1;
        size_t mapped = 0;
        void *block = device_block(bytesize, &fd, &mapped);
        struct fc_alloc alloc = {.base = (uintptr_t)block,
                                 .bytes = bytesize,
                                 .kind = FC_MEM_DEVICE,
                                 .ctx = ctx,
                                 .fd = fd,
                                 .mapped = mapped};
        if (block == NULL || fc_alloc_insert(&alloc) != 0) {
            if (block != NULL) {
                munmap(block, mapped);
                close(fd);
            }
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            fc.used_bytes[ctx->device] += bytesize;
            *dptr = (CUdeviceptr)(uintptr_t)block;
            fc_log("cuMemAlloc: %zu bytes at %p on device %d", bytesize, block, ctx->device);
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* Forget the allocation of @p kind at @p addr, once the work of its
 * context is done: cudaFree, cudaFreeHost and cudaHostUnregister all wait
 * for the context's running kernels (tests/gpu/blocking_probe.cu on an
 * H200), so a caller whose peer's kernel waits for it hangs here too. */
static CUresult free_at(uintptr_t addr, enum fc_mem_kind kind, CUresult not_found)
{
    struct fc_alloc *alloc = alloc_at(addr, kind);
    if (alloc == NULL)
        return not_found;
    fc_ctx_drain(alloc->ctx);
    alloc = alloc_at(addr, kind); /* fc.lock was dropped: look again */
    if (alloc == NULL)
        return not_found;
    fc_alloc_release(alloc);
    return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemFree(CUdeviceptr dptr)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    err = unsafe_call_head(&ctx);
    if (err == CUDA_SUCCESS && dptr != 0)
        err = free_at((uintptr_t)dptr, FC_MEM_DEVICE, CUDA_ERROR_INVALID_VALUE);
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    if (pp == NULL || bytesize == 0 || (Flags & ~(unsigned)HOST_ALLOC_FLAGS) != 0)
        err = CUDA_ERROR_INVALID_VALUE;
    else
        err = unsafe_call_head(&ctx);
    if (err == CUDA_SUCCESS && bytesize > SIZE_MAX - FC_HOST_ALIGN)
        err = CUDA_ERROR_OUT_OF_MEMORY;
    if (err == CUDA_SUCCESS) {
        void *block = aligned_alloc(FC_HOST_ALIGN, round_up(bytesize, FC_HOST_ALIGN));
        struct fc_alloc alloc = {.base = (uintptr_t)block,
                                 .bytes = bytesize,
                                 .kind = FC_MEM_HOST_ALLOC,
                                 .ctx = ctx,
                                 .flags = Flags,
                                 .fd = -1};
        if (block == NULL || fc_alloc_insert(&alloc) != 0) {
            free(block);
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *pp = block;
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuMemFreeHost(void *p)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    err = unsafe_call_head(&ctx);
    if (err == CUDA_SUCCESS)
        err = free_at((uintptr_t)p, FC_MEM_HOST_ALLOC, CUDA_ERROR_INVALID_VALUE);
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    if (p == NULL || bytesize == 0 || bytesize > UINTPTR_MAX - (uintptr_t)p ||
        (Flags & ~(unsigned)HOST_REGISTER_FLAGS) != 0)
        err = CUDA_ERROR_INVALID_VALUE;
    else
        err = unsafe_call_head(&ctx);
    if (err == CUDA_SUCCESS) {
        const struct fc_alloc *overlap = fc_alloc_overlapping((uintptr_t)p, bytesize);
        struct fc_alloc alloc = {.base = (uintptr_t)p,
                                 .bytes = bytesize,
                                 .kind = FC_MEM_REGISTERED,
                                 .ctx = ctx,
                                 .flags = Flags,
                                 .fd = -1};
        if (overlap != NULL && fc_kind_is_device(overlap->kind))
            err = CUDA_ERROR_INVALID_VALUE; /* device memory is not host memory */
        else if (overlap != NULL)
            err = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        else if (fc_alloc_insert(&alloc) != 0)
            err = CUDA_ERROR_OUT_OF_MEMORY;
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuMemHostUnregister(void *p)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    err = unsafe_call_head(&ctx);
    if (err == CUDA_SUCCESS)
        err = free_at((uintptr_t)p, FC_MEM_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    err = pdptr == NULL || Flags != 0 ? CUDA_ERROR_INVALID_VALUE : fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS) {
        const struct fc_alloc *alloc = fc_alloc_find((uintptr_t)p);
        if (alloc == NULL || fc_kind_is_device(alloc->kind))
            err = CUDA_ERROR_INVALID_VALUE;
        else
            *pdptr = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* ------------------------------------------------------------ attributes */

static CUresult pointer_attribute(void *data, CUpointer_attribute attribute,
                                  const struct fc_alloc *alloc, uintptr_t ptr)
{
    int device = fc_kind_is_device(alloc->kind);
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = alloc->ctx; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = ptr; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (device)
            return CUDA_ERROR_INVALID_VALUE; /* device memory has no host address */
        *(void **)data = (void *)ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)data = 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = alloc->ctx->device;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = alloc->base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = alloc->bytes; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = 1; return CUDA_SUCCESS;
    default: return CUDA_ERROR_NOT_SUPPORTED; /* a real attribute the fake does not answer */
    }
}

FC_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    const struct fc_alloc *alloc = fc_alloc_find((uintptr_t)ptr);
    if (data == NULL || alloc == NULL)
        err = CUDA_ERROR_INVALID_VALUE; /* unknown pointers have no attributes */
    else
        err = pointer_attribute(data, attribute, alloc, (uintptr_t)ptr);
    fc_unlock();
    return fc_ret(__func__, err);
}

/* Several attributes in one call. As the driver: a pointer CUDA does not
 * know is no error here, its attributes read as zeros (MEMORY_TYPE 0: not
 * CUDA's). */
FC_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                          CUpointer_attribute *attributes, void **data,
                                          CUdeviceptr ptr)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    const struct fc_alloc *alloc = fc_alloc_find((uintptr_t)ptr);
    if (attributes == NULL || data == NULL)
        err = CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; err == CUDA_SUCCESS && i < numAttributes; i++) {
        if (data[i] == NULL)
            continue; /* The driver skips an attribute without a place. */
        if (alloc != NULL) {
            err = pointer_attribute(data[i], attributes[i], alloc, (uintptr_t)ptr);
            continue;
        }
        switch (attributes[i]) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)data[i] = 0; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data[i] = 0; break;
        case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data[i] = NULL; break;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER: *(void **)data[i] = NULL; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data[i] = 0; break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data[i] = 0; break;
        default: err = CUDA_ERROR_NOT_SUPPORTED; break;
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* ------------------------------------------------------------ copies */

/* A copy of @p bytes from @p src to @p dst; each side must be known memory
 * when its flag says so (the device side of HtoD, DtoH and sets). */
static CUresult copy_work(uintptr_t dst, int dst_known, uintptr_t src, int src_known, size_t bytes,
                          struct fc_work *work_p)
{
    CUresult err = fc_mem_check(dst, bytes, dst_known);
    if (err == CUDA_SUCCESS)
        err = fc_mem_check(src, bytes, src_known);
    if (err == CUDA_SUCCESS)
        *work_p =
            (struct fc_work){.kind = FC_WORK_COPY, .copy = {(void *)dst, (const void *)src, bytes}};
    return err;
}

/* The synchronous ones: on the legacy stream, returning once done. */
static CUresult copy_sync(uintptr_t dst, int dst_known, uintptr_t src, int src_known, size_t bytes)
{
    struct CUctx_st *ctx = NULL;
    struct fc_work work;
    CUresult err = unsafe_call_head(&ctx);
    if (err == CUDA_SUCCESS)
        err = copy_work(dst, dst_known, src, src_known, bytes, &work);
    if (err == CUDA_SUCCESS && bytes != 0)
        err = fc_legacy_run(ctx, &work);
    return err;
}

/* The asynchronous ones: a stream op. A capture refuses pageable host
 * memory (memory the fake does not know) on either side, as graphs do. */
static CUresult copy_async(uintptr_t dst, int dst_known, uintptr_t src, int src_known, size_t bytes,
                           CUstream hStream)
{
    struct CUctx_st *ctx = NULL;
    struct CUstream_st *stream = NULL;
    struct fc_work work;
    CUresult err = fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS)
        err = fc_stream_resolve(hStream, ctx, &stream);
    if (err == CUDA_SUCCESS)
        err = copy_work(dst, dst_known, src, src_known, bytes, &work);
    if (err != CUDA_SUCCESS || bytes == 0)
        return err;
    if (stream->capture != NULL && (fc_alloc_find(dst) == NULL || fc_alloc_find(src) == NULL)) {
        fc_log("a captured copy touches pageable host memory");
        fc_capture_invalidate(stream->capture);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return fc_stream_do(stream, &work);
}

/* From pageable memory CUDA returns once the source is staged; the DMA
 * lands later, on the legacy stream: late here too (FAKECUDA_LAZY_US). */
static CUresult copy_htod_staged(uintptr_t dst, const void *src, size_t bytes)
{
    struct CUctx_st *ctx = NULL;
    struct fc_work work;
    CUresult err = unsafe_call_head(&ctx);
    if (err == CUDA_SUCCESS)
        err = copy_work(dst, 1, (uintptr_t)src, 0, bytes, &work);
    if (err != CUDA_SUCCESS || bytes == 0)
        return err;
    void *staging = malloc(bytes);
    if (staging == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(staging, src, bytes);
    work.copy.src = staging;
    work.copy.staging = staging;
    work.copy.delay_ns = fc.knobs.lazy_ns;
    return fc_legacy_enqueue(ctx, &work);
}

FC_EXPORT CUresult cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (fc_alloc_find((uintptr_t)srcHost) == NULL && fc_alloc_find((uintptr_t)dstDevice) != NULL &&
        fc_kind_is_device(fc_alloc_find((uintptr_t)dstDevice)->kind))
        err = copy_htod_staged((uintptr_t)dstDevice, srcHost, ByteCount);
    else
        err = copy_sync((uintptr_t)dstDevice, 1, (uintptr_t)srcHost, 0, ByteCount);
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    err = copy_sync((uintptr_t)dstHost, 0, (uintptr_t)srcDevice, 1, ByteCount);
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                 CUstream hStream)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    err = copy_async((uintptr_t)dst, 0, (uintptr_t)src, 0, ByteCount, hStream);
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                     CUstream hStream)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    err = copy_async((uintptr_t)dstDevice, 1, (uintptr_t)srcHost, 0, ByteCount, hStream);
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                     CUstream hStream)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    err = copy_async((uintptr_t)dstHost, 0, (uintptr_t)srcDevice, 1, ByteCount, hStream);
    fc_unlock();
    return fc_ret(__func__, err);
}

/* ------------------------------------------------------------ sets */

FC_EXPORT CUresult cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    err = unsafe_call_head(&ctx);
    if (err == CUDA_SUCCESS)
        err = fc_mem_check((uintptr_t)dstDevice, N, 1);
    if (err == CUDA_SUCCESS && N != 0) {
        struct fc_work work = {.kind = FC_WORK_SET, .set = {(void *)(uintptr_t)dstDevice, uc, N}};
        /* Of device memory it returns before it lands, on the legacy stream
         * (CUDA's "API synchronization behavior"), which non-blocking
         * streams do not wait for: it lands late here, FAKECUDA_LAZY_US. */
        if (fc_kind_is_device(fc_alloc_find((uintptr_t)dstDevice)->kind)) {
            work.set.delay_ns = fc.knobs.lazy_ns;
            err = fc_legacy_enqueue(ctx, &work);
        } else {
            err = fc_legacy_run(ctx, &work);
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                   CUstream hStream)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    struct CUstream_st *stream = NULL;
    err = fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS)
        err = fc_stream_resolve(hStream, ctx, &stream);
    if (err == CUDA_SUCCESS)
        err = fc_mem_check((uintptr_t)dstDevice, N, 1);
    if (err == CUDA_SUCCESS && N != 0) {
        struct fc_work work = {.kind = FC_WORK_SET, .set = {(void *)(uintptr_t)dstDevice, uc, N}};
        err = fc_stream_do(stream, &work);
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* ------------------------------------------------------------ GPUDirect RDMA */

/* A dma-buf of device memory: here a memfd that names nothing (a NIC of
 * tests/fakeverbs registers the address it is given, since fake device
 * memory is host memory); the checks are the driver's: a current context,
 * DMA_BUF_FD, no flags, page-aligned address and size inside one device
 * allocation (cuMemAlloc's, or one cuMemMap mapping). */
FC_EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                                 CUmemRangeHandleType handleType,
                                                 unsigned long long flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    err = fc_ctx_current(&ctx);
    uintptr_t base = (uintptr_t)dptr;
    long page = sysconf(_SC_PAGESIZE);
    if (err == CUDA_SUCCESS &&
        (handle == NULL || handleType != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags != 0 ||
         size == 0 || base % (uintptr_t)page != 0 || size % (size_t)page != 0))
        err = CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS && fc.knobs.no_dmabuf)
        err = CUDA_ERROR_NOT_SUPPORTED;
    if (err == CUDA_SUCCESS) {
        const struct fc_alloc *alloc = fc_alloc_find(base);
        if (alloc == NULL || (alloc->kind != FC_MEM_DEVICE && alloc->kind != FC_MEM_VMM) ||
            base + size > alloc->base + alloc->bytes)
            err = CUDA_ERROR_INVALID_VALUE;
    }
    if (err == CUDA_SUCCESS) {
        int fd = memfd_create("fakecuda-dmabuf", MFD_CLOEXEC);
        if (fd < 0)
            err = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *(int *)handle = fd;
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* Nothing to make visible (the "NIC" wrote host memory); the checks are
 * the driver's. FAKECUDA_NO_RDMA_FLUSH: a device that cannot (NOT_SUPPORTED). */
FC_EXPORT CUresult cuFlushGPUDirectRDMAWrites(CUflushGPUDirectRDMAWritesTarget target,
                                              CUflushGPUDirectRDMAWritesScope scope)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    err = fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS && (target != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX ||
                                (scope != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER &&
                                 scope != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_ALL_DEVICES)))
        err = CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS && fc.knobs.no_rdma_flush)
        err = CUDA_ERROR_NOT_SUPPORTED;
    fc_unlock();
    return fc_ret(__func__, err);
}

/* ------------------------------------------------------------ CUDA IPC */

/* What a fake IPC handle holds (in CUipcMemHandle's 64 bytes). */
struct fc_ipc_handle {
    char magic[8]; /* "fcipc01" */
    int32_t pid;   /* the exporting process ... */
    int32_t fd;    /* ... and its memfd of the allocation */
    uint64_t bytes;
    uint64_t mapped;
    int32_t device;
};
_Static_assert(sizeof(struct fc_ipc_handle) <= CU_IPC_HANDLE_SIZE, "fits a CUipcMemHandle");

static const char ipc_magic[8] = "fcipc01";

/* The driver's checks: a current context, the base of a device allocation
 * of this process (memory opened from another process cannot be exported
 * again). */
FC_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    err = pHandle == NULL ? CUDA_ERROR_INVALID_VALUE : fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS) {
        const struct fc_alloc *alloc = alloc_at((uintptr_t)dptr, FC_MEM_DEVICE);
        if (alloc == NULL) {
            err = CUDA_ERROR_INVALID_VALUE;
        } else {
            struct fc_ipc_handle h = {.pid = (int32_t)getpid(),
                                      .fd = alloc->fd,
                                      .bytes = alloc->bytes,
                                      .mapped = alloc->mapped,
                                      .device = alloc->ctx->device};
            memcpy(h.magic, ipc_magic, sizeof(h.magic));
            memset(pHandle, 0, sizeof(*pHandle));
            memcpy(pHandle->reserved, &h, sizeof(h));
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* Maps the exporter's memfd (through /proc/<pid>/fd, as only a process of
 * the same user can); a handle of this very process is refused as the
 * driver refuses it (CUDA_ERROR_INVALID_CONTEXT), and so is one whose
 * process or allocation is gone. */
FC_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    struct fc_ipc_handle h;
    memcpy(&h, handle.reserved, sizeof(h));
    err = pdptr == NULL || Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS ? CUDA_ERROR_INVALID_VALUE
                                                                       : fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS && memcmp(h.magic, ipc_magic, sizeof(h.magic)) != 0)
        err = CUDA_ERROR_INVALID_HANDLE;
    if (err == CUDA_SUCCESS && h.pid == (int32_t)getpid())
        err = CUDA_ERROR_INVALID_CONTEXT;
    if (err == CUDA_SUCCESS && h.device != ctx->device && !(ctx->peers & (1ull << h.device)) &&
        fc.knobs.no_peer)
        err = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    if (err == CUDA_SUCCESS) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
        int fd = open(path, O_RDWR | O_CLOEXEC);
        struct stat st;
        void *block = MAP_FAILED;
        if (fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size == h.mapped)
            block = mmap(NULL, h.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (fd >= 0)
            close(fd);
        struct fc_alloc alloc = {.base = (uintptr_t)block,
                                 .bytes = h.bytes,
                                 .kind = FC_MEM_IPC,
                                 .ctx = ctx,
                                 .fd = -1,
                                 .mapped = h.mapped};
        if (block == MAP_FAILED) {
            fc_log("cuIpcOpenMemHandle: cannot map %s", path);
            err = CUDA_ERROR_INVALID_HANDLE;
        } else if (fc_alloc_insert(&alloc) != 0) {
            munmap(block, h.mapped);
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *pdptr = (CUdeviceptr)(uintptr_t)block;
            fc_log("cuIpcOpenMemHandle: %llu bytes of pid %d's device %d at %p",
                   (unsigned long long)h.bytes, (int)h.pid, (int)h.device, block);
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    err = fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS) {
        struct fc_alloc *alloc = alloc_at((uintptr_t)dptr, FC_MEM_IPC);
        if (alloc == NULL)
            err = CUDA_ERROR_INVALID_VALUE;
        else
            fc_alloc_release(alloc);
    }
    fc_unlock();
    return fc_ret(__func__, err);
}
