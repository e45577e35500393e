/*
 * fake-cuda virtual memory management, the cuMem API: physical allocations
 * (cuMemCreate, or imported from a file descriptor), address reservations,
 * mappings and their access, and the export of allocations as POSIX file
 * descriptors. See fakecuda.h.
 *
 * An allocation is a memfd named "fakecuda-vmm-dev<N>", N its device, so
 * that a descriptor passed to another process (fork, SCM_RIGHTS) says which
 * device the memory is on; all of the memfd is payload. A reservation is
 * PROT_NONE anonymous memory. cuMemMap maps the memfd over part of it,
 * still PROT_NONE (a mapping without access faults, as on a GPU), and
 * registers the range as device memory of the allocation's device
 * (FC_MEM_VMM), so copies, sets, pointer attributes and kernels treat it as
 * such; cuMemSetAccess opens it. None of this belongs to a context (the
 * driver's cuMem allocations survive a context's reset), and none of it
 * needs a current one.
 */
#include "fakecuda.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MEMFD_PREFIX "fakecuda-vmm-dev"

/* What a reservation is where nothing is mapped. */
#define RESERVED_PROT  PROT_NONE
#define RESERVED_FLAGS (MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)

static int device_valid(int dev)
{
    return dev >= 0 && dev < fc.knobs.n_devices;
}

/* Every cuMem call: NOT_SUPPORTED where the devices have no VMM
 * (FAKECUDA_NO_CUMEM), as their attributes then say. */
static CUresult vmm_supported(void)
{
    return fc.knobs.no_cumem ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS;
}

/* ------------------------------------------------------------ allocations */

/* The live allocation whose handle is @p handle, or NULL (unknown or
 * released). */
static struct fc_vmm_alloc *vmm_find(CUmemGenericAllocationHandle handle)
{
    for (struct fc_vmm_alloc *vmm = fc.vmm_allocs; vmm != NULL; vmm = vmm->next)
        if (vmm->handle == handle && !vmm->released)
            return vmm;
    return NULL;
}

/* A new allocation over @p fd (owned from now on) with its handle's
 * reference, or NULL (the fd is closed). */
static struct fc_vmm_alloc *vmm_new(int fd, size_t bytes, int device, unsigned handle_types)
{
    struct fc_vmm_alloc *vmm = calloc(1, sizeof(*vmm));
    if (vmm == NULL) {
        close(fd);
        return NULL;
    }
    vmm->handle = ++fc.last_vmm_handle; /* never 0 */
    vmm->fd = fd;
    vmm->bytes = bytes;
    vmm->device = device;
    vmm->handle_types = handle_types;
    vmm->refs = 1;
    vmm->next = fc.vmm_allocs;
    fc.vmm_allocs = vmm;
    return vmm;
}

/* Drop a reference: the last one frees the memory. */
static void vmm_unref(struct fc_vmm_alloc *vmm)
{
    if (--vmm->refs > 0)
        return;
    for (struct fc_vmm_alloc **it = &fc.vmm_allocs; *it != NULL; it = &(*it)->next) {
        if (*it == vmm) {
            *it = vmm->next;
            break;
        }
    }
    if (vmm->charged)
        fc.used_bytes[vmm->device] -= vmm->bytes;
    close(vmm->fd);
    fc_log("cuMem: %zu bytes of device %d freed", vmm->bytes, vmm->device);
    free(vmm);
}

/* What the fake supports: pinned memory on a device, which must be valid
 * (else @p bad_device). */
static CUresult prop_check(const CUmemAllocationProp *prop, CUresult bad_device)
{
    if (prop == NULL || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->win32HandleMetaData != NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return device_valid(prop->location.id) ? CUDA_SUCCESS : bad_device;
}

FC_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                                 const CUmemAllocationProp *prop,
                                                 CUmemAllocationGranularity_flags option)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    err = vmm_supported();
    if (err == CUDA_SUCCESS &&
        (granularity == NULL || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                                 option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)))
        err = CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS)
        err = prop_check(prop, CUDA_ERROR_INVALID_VALUE);
    if (err == CUDA_SUCCESS)
        *granularity = FC_VMM_GRANULARITY;
    fc_unlock();
    return fc_ret(__func__, err);
}

/* A memfd of @p bytes whose name says it is device @p device's memory. */
static int memfd_for(int device, size_t bytes)
{
    char name[32];
    snprintf(name, sizeof(name), MEMFD_PREFIX "%d", device);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)bytes) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

FC_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    err = vmm_supported();
    if (err == CUDA_SUCCESS &&
        (handle == NULL || size == 0 || size % FC_VMM_GRANULARITY != 0 || flags != 0))
        err = CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS)
        err = prop_check(prop, CUDA_ERROR_INVALID_DEVICE);
    if (err == CUDA_SUCCESS &&
        ((prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
          prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ||
         prop->allocFlags.usage != 0))
        err = CUDA_ERROR_NOT_SUPPORTED; /* Windows, fabric handles, tile pools */
    int device = err == CUDA_SUCCESS ? prop->location.id : 0;
    if (err == CUDA_SUCCESS && size > FC_TOTAL_MEM - fc.used_bytes[device])
        err = CUDA_ERROR_OUT_OF_MEMORY;
    if (err == CUDA_SUCCESS) {
        int fd = memfd_for(device, size);
        struct fc_vmm_alloc *vmm =
            fd < 0 ? NULL : vmm_new(fd, size, device, (unsigned)prop->requestedHandleTypes);
        if (vmm == NULL) {
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            vmm->charged = 1;
            fc.used_bytes[device] += size;
            *handle = vmm->handle;
            fc_log("cuMemCreate: %zu bytes on device %d", size, device);
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* The handle goes; the memory stays while a mapping holds it. */
FC_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    err = vmm_supported();
    struct fc_vmm_alloc *vmm = err == CUDA_SUCCESS ? vmm_find(handle) : NULL;
    if (err == CUDA_SUCCESS && vmm == NULL)
        err = CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS) {
        vmm->released = 1;
        vmm_unref(vmm);
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* ------------------------------------------------------------ sharing */

/* A new descriptor of the allocation's memfd, the caller's to close. Only
 * for an allocation created to be exported so. */
FC_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                                CUmemGenericAllocationHandle handle,
                                                CUmemAllocationHandleType handleType,
                                                unsigned long long flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    err = vmm_supported();
    const struct fc_vmm_alloc *vmm = err == CUDA_SUCCESS ? vmm_find(handle) : NULL;
    if (err == CUDA_SUCCESS && (shareableHandle == NULL || vmm == NULL || flags != 0))
        err = CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS && handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        err = CUDA_ERROR_NOT_SUPPORTED;
    if (err == CUDA_SUCCESS && !(vmm->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        fc_log("cuMemExportToShareableHandle: not created with POSIX_FILE_DESCRIPTOR requested");
        err = CUDA_ERROR_INVALID_VALUE;
    }
    if (err == CUDA_SUCCESS) {
        int fd = fcntl(vmm->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0)
            err = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *(int *)shareableHandle = fd;
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* The device of a memfd the fake made (its name says), or -1. */
static int memfd_device(int fd)
{
    char path[64], target[128];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t len = readlink(path, target, sizeof(target) - 1);
    if (len <= 0)
        return -1;
    target[len] = '\0';
    int device = -1, end = 0;
    if (sscanf(target, "/memfd:" MEMFD_PREFIX "%d (deleted)%n", &device, &end) != 1 ||
        end != (int)len)
        return -1;
    return device;
}

/* A new handle of the memory @p osHandle (a file descriptor as a pointer,
 * which stays the caller's) stands for: a memfd of cuMemExportToShareableHandle
 * of this or another process, whose device is in its name. */
FC_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                  void *osHandle,
                                                  CUmemAllocationHandleType shHandleType)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    err = vmm_supported();
    if (err == CUDA_SUCCESS && handle == NULL)
        err = CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS && shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        err = CUDA_ERROR_NOT_SUPPORTED;
    int os_fd = (int)(intptr_t)osHandle;
    int device = err == CUDA_SUCCESS ? memfd_device(os_fd) : -1;
    struct stat st;
    if (err == CUDA_SUCCESS && (device < 0 || fstat(os_fd, &st) != 0 || st.st_size <= 0 ||
                                (size_t)st.st_size % FC_VMM_GRANULARITY != 0)) {
        fc_log("cuMemImportFromShareableHandle: fd %d is no exported cuMem allocation", os_fd);
        err = CUDA_ERROR_INVALID_VALUE;
    }
    if (err == CUDA_SUCCESS && !device_valid(device)) {
        fc_log("cuMemImportFromShareableHandle: memory of device %d, which is not here", device);
        err = CUDA_ERROR_INVALID_VALUE;
    }
    if (err == CUDA_SUCCESS) {
        int fd = fcntl(os_fd, F_DUPFD_CLOEXEC, 0);
        struct fc_vmm_alloc *vmm = fd < 0 ? NULL
                                          : vmm_new(fd, (size_t)st.st_size, device,
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (vmm == NULL) {
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *handle = vmm->handle;
            fc_log("cuMemImportFromShareableHandle: %zu bytes of device %d", vmm->bytes, device);
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* ------------------------------------------------------------ reservations */

/* The reservation that holds [base, base + bytes), or NULL. */
static struct fc_reservation *reservation_holding(uintptr_t base, size_t bytes)
{
    for (unsigned i = 0; i < fc.n_reservations; i++) {
        struct fc_reservation *res = &fc.reservations[i];
        if (base >= res->base && bytes <= res->bytes && base - res->base <= res->bytes - bytes)
            return res;
    }
    return NULL;
}

/* The address is at most a hint, and is ignored. The range is aligned to
 * @p alignment or the granularity, whichever is larger, so that cuMemMap
 * may map at its start. */
FC_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                       CUdeviceptr addr, unsigned long long flags)
{
    (void)addr;
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t align = alignment > FC_VMM_GRANULARITY ? alignment : FC_VMM_GRANULARITY;
    err = vmm_supported();
    if (err == CUDA_SUCCESS && (ptr == NULL || size == 0 || size % page != 0 ||
                                (alignment & (alignment - 1)) != 0 || flags != 0))
        err = CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS && size > SIZE_MAX - align)
        err = CUDA_ERROR_OUT_OF_MEMORY;
    unsigned cap = fc.cap_reservations;
    if (err == CUDA_SUCCESS && fc_grow((void **)&fc.reservations, &cap, fc.n_reservations + 1,
                                       sizeof(*fc.reservations)) != 0)
        err = CUDA_ERROR_OUT_OF_MEMORY;
    fc.cap_reservations = cap;
    if (err == CUDA_SUCCESS) {
        /* Over-reserve by the alignment, then trim both ends. */
        void *span = mmap(NULL, size + align, RESERVED_PROT, RESERVED_FLAGS, -1, 0);
        if (span == MAP_FAILED) {
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            uintptr_t start = (uintptr_t)span;
            uintptr_t base = (start + align - 1) & ~(uintptr_t)(align - 1);
            if (base > start)
                munmap(span, base - start);
            if (start + size + align > base + size)
                munmap((void *)(base + size), start + size + align - (base + size));
            fc.reservations[fc.n_reservations++] = (struct fc_reservation){base, size};
            *ptr = (CUdeviceptr)base;
            fc_log("cuMemAddressReserve: %zu bytes at %#lx", size, (unsigned long)base);
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* Exactly a reservation, with nothing mapped in it any more. */
FC_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    err = vmm_supported();
    struct fc_reservation *res =
        err == CUDA_SUCCESS && size != 0 ? reservation_holding((uintptr_t)ptr, size) : NULL;
    if (err == CUDA_SUCCESS && (res == NULL || res->base != (uintptr_t)ptr || res->bytes != size))
        err = CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS && fc_alloc_overlapping(res->base, res->bytes) != NULL) {
        fc_log("cuMemAddressFree: %#lx still has mappings", (unsigned long)res->base);
        err = CUDA_ERROR_INVALID_VALUE;
    }
    if (err == CUDA_SUCCESS) {
        munmap((void *)res->base, res->bytes);
        *res = fc.reservations[--fc.n_reservations];
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* ------------------------------------------------------------ mappings */

/* The mappings that cover [base, base + bytes) exactly, one after another
 * with no gap: the first and their number. CUDA_ERROR_INVALID_VALUE when
 * the range starts or ends inside one, or holds unmapped memory. */
static CUresult mapped_span(uintptr_t base, size_t bytes, size_t *first_p, size_t *n_p)
{
    struct fc_alloc *alloc = fc_alloc_find(base);
    if (bytes == 0 || alloc == NULL || alloc->kind != FC_MEM_VMM || alloc->base != base)
        return CUDA_ERROR_INVALID_VALUE;
    size_t first = (size_t)(alloc - fc.allocs), n = 0, covered = 0;
    while (covered < bytes) {
        if (first + n == fc.n_allocs)
            return CUDA_ERROR_INVALID_VALUE;
        const struct fc_alloc *next = &fc.allocs[first + n];
        if (next->kind != FC_MEM_VMM || next->base != base + covered ||
            next->bytes > bytes - covered)
            return CUDA_ERROR_INVALID_VALUE;
        covered += next->bytes;
        n++;
    }
    *first_p = first;
    *n_p = n;
    return CUDA_SUCCESS;
}

/* All of the allocation, at a granularity-aligned address of a
 * reservation where nothing is mapped; inaccessible until cuMemSetAccess. */
FC_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    uintptr_t base = (uintptr_t)ptr;
    err = vmm_supported();
    struct fc_vmm_alloc *vmm = err == CUDA_SUCCESS ? vmm_find(handle) : NULL;
    if (err == CUDA_SUCCESS && (vmm == NULL || offset != 0 || flags != 0 || size != vmm->bytes ||
                                base % FC_VMM_GRANULARITY != 0))
        err = CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS && reservation_holding(base, size) == NULL) {
        fc_log("cuMemMap: [%#lx, +%zu) is not inside one reservation", (unsigned long)base, size);
        err = CUDA_ERROR_INVALID_VALUE;
    }
    if (err == CUDA_SUCCESS && fc_alloc_overlapping(base, size) != NULL) {
        fc_log("cuMemMap: [%#lx, +%zu) is already mapped", (unsigned long)base, size);
        err = CUDA_ERROR_INVALID_VALUE;
    }
    if (err == CUDA_SUCCESS) {
        void *block = mmap((void *)base, size, PROT_NONE, MAP_SHARED | MAP_FIXED, vmm->fd, 0);
        struct fc_alloc alloc = {.base = base,
                                 .bytes = size,
                                 .kind = FC_MEM_VMM,
                                 .ctx = &fc.ctxs[vmm->device],
                                 .fd = -1,
                                 .mapped = size,
                                 .vmm = vmm};
        if (block == MAP_FAILED || fc_alloc_insert(&alloc) != 0) {
            mmap((void *)base, size, RESERVED_PROT, RESERVED_FLAGS | MAP_FIXED, -1, 0);
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            vmm->refs++;
            fc_log("cuMemMap: %zu bytes of device %d at %#lx", size, vmm->device,
                   (unsigned long)base);
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

void fc_vmm_unmapped(struct fc_alloc *alloc)
{
    mmap((void *)alloc->base, alloc->bytes, RESERVED_PROT, RESERVED_FLAGS | MAP_FIXED, -1, 0);
    vmm_unref(alloc->vmm);
}

/* The whole of one or more mappings, once the work of the contexts that
 * may use them is done (as cuMemFree waits); then their ranges are
 * reserved memory again, and allocations whose handle was released and
 * that no other mapping holds are freed. */
FC_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    size_t first = 0, n = 0;
    err = vmm_supported();
    if (err == CUDA_SUCCESS)
        err = mapped_span((uintptr_t)ptr, size, &first, &n);
    if (err == CUDA_SUCCESS) {
        uint64_t users = 0;
        for (size_t i = first; i < first + n; i++)
            users |= fc.allocs[i].readers | fc.allocs[i].writers | 1ull << fc.allocs[i].ctx->device;
        for (int d = 0; d < fc.knobs.n_devices; d++)
            if ((users & (1ull << d)) && fc.ctxs[d].active)
                fc_ctx_drain(&fc.ctxs[d]);
        err = mapped_span((uintptr_t)ptr, size, &first, &n); /* fc.lock was dropped */
    }
    if (err == CUDA_SUCCESS)
        for (size_t i = 0; i < n; i++)
            fc_alloc_release(&fc.allocs[first]); /* the next one moves down */
    fc_unlock();
    return fc_ret(__func__, err);
}

/* What one CUmemAccessDesc asks, checked: its device, and whether that
 * device may read and write. */
static CUresult access_check(const CUmemAccessDesc *desc)
{
    if (desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        (desc->flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
         desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
         desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
        return CUDA_ERROR_INVALID_VALUE;
    return device_valid(desc->location.id) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* The host protection that lets every device with access do what it may:
 * all "devices" share this one mapping. */
static int access_prot(uint64_t readers, uint64_t writers)
{
    return writers != 0 ? PROT_READ | PROT_WRITE : readers != 0 ? PROT_READ : PROT_NONE;
}

/* The range must be whole mappings. Another device than the memory's gets
 * access as a peer: PEER_ACCESS_UNSUPPORTED with FAKECUDA_NO_PEER, as
 * cuIpcOpenMemHandle answers there. */
FC_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                  size_t count)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    size_t first = 0, n = 0;
    err = vmm_supported();
    if (err == CUDA_SUCCESS && (desc == NULL || count == 0))
        err = CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; err == CUDA_SUCCESS && k < count; k++)
        err = access_check(&desc[k]);
    if (err == CUDA_SUCCESS)
        err = mapped_span((uintptr_t)ptr, size, &first, &n);
    for (size_t i = first; err == CUDA_SUCCESS && i < first + n; i++)
        for (size_t k = 0; k < count; k++)
            if (desc[k].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
                desc[k].location.id != fc.allocs[i].ctx->device && fc.knobs.no_peer)
                err = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    for (size_t i = first; err == CUDA_SUCCESS && i < first + n; i++) {
        struct fc_alloc *alloc = &fc.allocs[i];
        uint64_t readers = alloc->readers, writers = alloc->writers;
        for (size_t k = 0; k < count; k++) {
            uint64_t bit = 1ull << desc[k].location.id;
            readers &= ~bit;
            writers &= ~bit;
            if (desc[k].flags & CU_MEM_ACCESS_FLAGS_PROT_READ)
                readers |= bit;
            if (desc[k].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                writers |= bit;
        }
        if (mprotect((void *)alloc->base, alloc->bytes, access_prot(readers, writers)) != 0) {
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            alloc->readers = readers;
            alloc->writers = writers;
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}
