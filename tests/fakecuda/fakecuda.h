/*
 * fake-cuda: a libcuda.so.1 of Conflux's own, FOR TESTS ONLY. It implements
 * the CUDA driver functions src/util/cuda.c resolves, on CPUs: "device"
 * memory is host memory, each stream is a worker thread that runs its work
 * in order, and a kernel is a host function from the registry in kernels.h
 * whose blocks the stream's thread runs round-robin. It keeps CUDA's rules
 * (contexts per thread, legacy-stream ordering, capture rules, bounds of
 * allocations, no CUDA across fork) so that Conflux's mistakes show here
 * before a GPU sees them. Nothing measured over it is a GPU figure. See
 * README.md beside this file.
 *
 * Environment (read at the first successful cuInit, FAKECUDA_DEBUG at the
 * first call):
 *   FAKECUDA_DEVICES=N            devices (default 1, at most FC_MAX_DEVICES)
 *   FAKECUDA_NO_DEVICE=1          cuInit fails with CUDA_ERROR_NO_DEVICE
 *   FAKECUDA_NO_PEER=1            cuDeviceCanAccessPeer answers 0
 *   FAKECUDA_NO_DMABUF=1          no dma-buf export (cuMemGetHandleForAddressRange)
 *   FAKECUDA_NO_CUMEM=1           no cuMem virtual memory management (NOT_SUPPORTED)
 *   FAKECUDA_LAUNCH_FAIL_AFTER=N  cuLaunchKernel calls after the first N
 *                                 fail with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
 *   FAKECUDA_LAZY_US=N            cuMemsetD8 of device memory and cuMemcpyHtoD
 *                                 from pageable memory land N us late (2000)
 *   FAKECUDA_HOST_FN_SERIAL=0     host functions of different streams may run
 *                                 at once (default 1: one at a time)
 *   FAKECUDA_CONCURRENT_BLOCKS=0  a launch's blocks take turns on its stream's
 *                                 thread (default 1: a thread each, at once)
 *   FAKECUDA_DEBUG=1              one "fakecuda:" line per call on stderr
 *
 * Locking: one process-wide mutex (fc.lock) guards every object below.
 * Stream workers drop it while they run work (a kernel pass, a host
 * function, a copy), and every waiter sleeps on fc.progress, which is
 * broadcast whenever any work completes. Internal header: only the
 * fake-cuda sources include it.
 */
#ifndef CFX_FAKECUDA_H
#define CFX_FAKECUDA_H

#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

#define FC_MAX_DEVICES       64
#define FC_DRIVER_VERSION    13000
#define FC_TOTAL_MEM         (80ull << 30)
#define FC_DEVICE_ALIGN      256
#define FC_HOST_ALIGN        4096
#define FC_MAX_BLOCK_THREADS 1024
#define FC_MAX_DYNAMIC_SMEM  49152 /* without cuFuncSetAttribute, which is not here */
#define FC_STATE_ALIGN       64    /* of each block's state (kernels.h) */
/* cuMemGetAllocationGranularity, minimum and recommended: an H100's and an
 * H200's answer. cuMemCreate sizes and cuMemMap addresses are multiples. */
#define FC_VMM_GRANULARITY ((size_t)2 << 20)

/* Exported symbols: everything else is hidden (C_VISIBILITY_PRESET). */
#define FC_EXPORT __attribute__((visibility("default")))

/* Knobs from the environment (see the header comment). */
struct fc_knobs {
    int n_devices;
    int no_device;
    int no_peer;
    int no_dmabuf;          /* FAKECUDA_NO_DMABUF: the devices say they cannot export dma-bufs */
    int no_rdma_flush;      /* FAKECUDA_NO_RDMA_FLUSH: no host flush of GPUDirect RDMA writes */
    int no_cumem;           /* FAKECUDA_NO_CUMEM: no virtual memory management (cuMem*) */
    long launch_fail_after; /* -1: off */
    uint64_t lazy_ns;       /* FAKECUDA_LAZY_US: how late a "synchronous" set or copy lands */
    int host_fn_serial;     /* FAKECUDA_HOST_FN_SERIAL (default 1): one host function at a time */
    int concurrent_blocks;  /* FAKECUDA_CONCURRENT_BLOCKS (default 1): a thread per block */
    /* FAKECUDA_RESIDENT_BLOCKS (0: all): blocks of a launch that run at
     * once, as a GPU with room for that many: block b starts only once
     * b - N blocks have finished (a block that waits for a later one
     * hangs, as it would there). */
    long resident_blocks;
};

/* Every handle the user holds starts with this, so that a handle can be
 * checked against the live ones of its kind before it is used. */
enum fc_handle_kind {
    FC_HANDLE_STREAM,
    FC_HANDLE_EVENT,
    FC_HANDLE_MODULE,
    FC_HANDLE_FUNCTION,
    FC_HANDLE_GRAPH,
    FC_HANDLE_GRAPH_EXEC,
    FC_HANDLE_KINDS,
};

struct fc_handle {
    struct fc_handle *next;
    enum fc_handle_kind kind;
};

/* A point in some stream's work: done once everything before it finished.
 * Refcounted; what holds one (an event, a waiting op) holds a reference. */
struct fc_mark {
    int refs;
    int done;
    uint64_t done_ns; /* CLOCK_MONOTONIC when it became done */
};

/* One piece of stream work, as enqueued or as a graph node holds it. */
enum fc_work_kind {
    FC_WORK_NOP,        /* an event record, a wait, a synchronisation point */
    FC_WORK_KERNEL,     /* a registered kernel over n_blocks blocks */
    FC_WORK_HOST_FN,    /* cuLaunchHostFunc */
    FC_WORK_COPY,       /* any memcpy (already bounds-checked) */
    FC_WORK_SET,        /* cuMemsetD8 */
    FC_WORK_WAIT_EVENT, /* graph only: an external event wait node */
    FC_WORK_WAIT_VALUE, /* cuStreamWaitValue32: until a word in memory meets a condition */
};

struct fc_work {
    enum fc_work_kind kind;
    union {
        struct {
            const struct fakecuda_kernel *kernel;
            unsigned n_blocks, threads;
            void *params; /* malloc'd copy of param_bytes, owned */
        } kernel;
        struct {
            CUhostFn fn;
            void *user_data;
        } host;
        struct {
            void *dst;
            const void *src;
            size_t bytes;
            void *staging;     /* owned copy of a pageable source (src points into it), or NULL */
            uint64_t delay_ns; /* lands this late (the lazy "synchronous" copies) */
        } copy;
        struct {
            void *dst;
            unsigned char value;
            size_t bytes;
            uint64_t delay_ns; /* lands this late (cuMemsetD8 of device memory) */
        } set;
        struct {
            const uint32_t *addr;
            uint32_t value;
            unsigned flags; /* CUstreamWaitValue_flags */
        } wait_value;
        struct {
            struct CUevent_st *event;
        } wait;
    };
};

/* One enqueued op of a stream. */
struct fc_op {
    struct fc_op *next;
    struct fc_work work;
    void *block_states;    /* kernels: n_blocks states, zeroed */
    struct fc_mark **deps; /* waited for before it runs */
    unsigned n_deps, cap_deps;
    struct fc_mark *done; /* signalled when it completes; may be NULL */
};

/* The graph nodes a capturing stream's next node depends on. */
struct fc_frontier {
    unsigned *nodes;
    unsigned n, cap;
};

/* One captured node: its work and the nodes it depends on (all earlier,
 * so the creation order is a topological order). */
struct fc_node {
    struct fc_work work;
    unsigned *deps;
    unsigned n_deps;
};

/* One capture sequence: from cuStreamBeginCapture on its origin stream to
 * cuStreamEndCapture there. Other streams join it by waiting on an event
 * recorded in it. */
struct fc_capture {
    uint64_t id;
    struct CUstream_st *origin;
    CUstreamCaptureMode mode;
    pthread_t thread; /* the thread that began it */
    int invalidated;
    struct fc_node *nodes;
    unsigned n_nodes, cap_nodes;
    struct CUstream_st **members; /* streams capturing into it, origin included */
    unsigned n_members, cap_members;
    struct fc_capture *next;
};

enum fc_stream_kind {
    FC_STREAM_USER,       /* cuStreamCreate */
    FC_STREAM_LEGACY,     /* NULL and CU_STREAM_LEGACY */
    FC_STREAM_PER_THREAD, /* CU_STREAM_PER_THREAD */
};

struct CUstream_st {
    struct fc_handle handle; /* Must be first (registered for user streams). */
    struct CUctx_st *ctx;
    enum fc_stream_kind kind;
    int blocking; /* synchronizes with the legacy stream */
    struct fc_op *head, *tail;
    pthread_cond_t work_cond; /* the worker waits here for work */
    int has_worker;
    int destroyed; /* the worker exits (and frees it) once drained */
    struct CUstream_st *ctx_next;
    struct fc_capture *capture; /* capturing into this sequence, or NULL */
    struct fc_frontier frontier;
};

/* A device's primary context (the only kind there is here). */
struct CUctx_st {
    int device;
    int refs;   /* cuDevicePrimaryCtxRetain count */
    int active; /* retained at least once since the last reset */
    uint64_t generation;
    uint64_t peers; /* bit d: peer access to device d's context enabled */
    struct CUstream_st *legacy;
    struct CUstream_st *streams; /* all of them, legacy included */
};

struct CUevent_st {
    struct fc_handle handle; /* Must be first. */
    struct CUctx_st *ctx;
    unsigned flags;
    struct fc_mark *rec; /* the last record outside capture, or NULL */
    uint64_t cap_id;     /* nonzero: last recorded in that capture */
    struct fc_frontier cap_frontier;
};

struct CUmod_st {
    struct fc_handle handle; /* Must be first. */
    struct CUctx_st *ctx;
    struct CUfunc_st *functions;
};

struct CUfunc_st {
    struct fc_handle handle; /* Must be first. */
    struct CUmod_st *module;
    const struct fakecuda_kernel *kernel;
    struct CUfunc_st *module_next;
};

struct CUgraph_st {
    struct fc_handle handle; /* Must be first. */
    struct fc_node *nodes;
    unsigned n_nodes;
};

struct CUgraphExec_st {
    struct fc_handle handle; /* Must be first. */
    struct fc_work *works;   /* in creation order */
    unsigned n_works;
    struct fc_mark *last; /* end of the latest launch, or NULL */
};

/* Memory the fake knows: device allocations, pinned host allocations,
 * registered host ranges. Never overlapping; kept sorted by base. */
enum fc_mem_kind {
    FC_MEM_DEVICE,
    FC_MEM_HOST_ALLOC,
    FC_MEM_REGISTERED,
    FC_MEM_IPC, /* another process's device allocation, opened by cuIpcOpenMemHandle */
    FC_MEM_VMM, /* a cuMemMap mapping of a cuMem allocation inside a reservation */
};

/* Device memory: this process's own, another's mapped through IPC, or a
 * cuMem allocation (either) mapped by cuMemMap. */
static inline int fc_kind_is_device(enum fc_mem_kind kind)
{
    return kind == FC_MEM_DEVICE || kind == FC_MEM_IPC || kind == FC_MEM_VMM;
}

/* A physical allocation of the cuMem API (vmm.c): cuMemCreate's, or one
 * imported from a file descriptor. It lives while its handle (until
 * cuMemRelease) or a mapping holds a reference, as the driver's does. */
struct fc_vmm_alloc {
    struct fc_vmm_alloc *next;
    /* Its CUmemGenericAllocationHandle: a serial number, never reused in
     * the process, so that a stale handle stays invalid. */
    CUmemGenericAllocationHandle handle;
    int fd; /* memfd "fakecuda-vmm-dev<device>" of exactly bytes */
    size_t bytes;
    int device;            /* the device the memory is on */
    unsigned handle_types; /* CUmemAllocationHandleType bits it may be exported as */
    int charged;           /* cuMemCreate's: counted in fc.used_bytes[device] */
    int released;          /* cuMemRelease'd: the handle is no longer valid */
    int refs;              /* the handle, until released, and one per mapping */
};

/* An address range of cuMemAddressReserve: PROT_NONE anonymous memory
 * wherever nothing is mapped. */
struct fc_reservation {
    uintptr_t base;
    size_t bytes;
};

struct fc_alloc {
    uintptr_t base;
    size_t bytes;
    enum fc_mem_kind kind;
    struct CUctx_st *ctx;
    unsigned flags;
    /* FC_MEM_DEVICE: the memfd the allocation is a shared mapping of (so
     * cuIpcGetMemHandle can hand it to another process); FC_MEM_IPC,
     * FC_MEM_VMM (whose allocation holds the memfd) and host kinds: -1. */
    int fd;
    size_t mapped; /* FC_MEM_DEVICE, FC_MEM_IPC, FC_MEM_VMM: bytes mapped (page multiple). */
    /* FC_MEM_VMM: the allocation mapped here (the mapping holds a
     * reference), and the devices (bit d) cuMemSetAccess let read it and
     * write it. ctx is its device's primary context, active or not. */
    struct fc_vmm_alloc *vmm;
    uint64_t readers, writers;
};

/* Process-wide state. */
struct fc_global {
    pthread_mutex_t lock;
    pthread_cond_t progress; /* broadcast when any work completes */
    atomic_int initialized;  /* cuInit succeeded in this process */
    atomic_int forked;       /* a child of a process that had called cuInit */
    struct fc_knobs knobs;
    struct CUctx_st ctxs[FC_MAX_DEVICES];
    struct fc_handle *handles[FC_HANDLE_KINDS];
    struct fc_alloc *allocs;
    size_t n_allocs, cap_allocs;
    uint64_t used_bytes[FC_MAX_DEVICES];
    struct fc_vmm_alloc *vmm_allocs; /* live cuMem allocations (vmm.c) */
    CUmemGenericAllocationHandle last_vmm_handle;
    struct fc_reservation *reservations;
    unsigned n_reservations, cap_reservations;
    struct fc_capture *captures; /* ongoing (not yet ended) */
    uint64_t next_capture_id;
    long launches; /* cuLaunchKernel calls so far */
};

extern struct fc_global fc;
/* The context current on this thread (cuCtxSetCurrent). */
extern _Thread_local struct CUctx_st *fc_tls_ctx;
/* Set on the fake's own threads: CUDA calls there are not permitted. */
extern _Thread_local int fc_tls_worker;
/* This thread's stream-capture interaction mode (cuThreadExchangeStreamCaptureMode). */
extern _Thread_local CUstreamCaptureMode fc_tls_capture_mode;

/* ------------------------------------------------------------ device.c */

/* Log one line to stderr when FAKECUDA_DEBUG=1. */
void fc_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t fc_now_ns(void);
/* What every entry point but the error strings does first: takes fc.lock
 * and returns CUDA_SUCCESS, or returns (lock not held) NOT_PERMITTED on a
 * worker thread, NOT_INITIALIZED before cuInit or in a forked child. */
CUresult fc_lock_enter(void);
void fc_unlock(void);
/* Log the call (debug) and return @p err. */
CUresult fc_ret(const char *func, CUresult err);
/* The active context current on this thread, or CUDA_ERROR_INVALID_CONTEXT. */
CUresult fc_ctx_current(struct CUctx_st **ctx_p);
/* @p ctx is one of the contexts (active or not). */
int fc_ctx_valid(const struct CUctx_st *ctx);
void fc_handle_add(struct fc_handle *handle, enum fc_handle_kind kind);
void fc_handle_remove(struct fc_handle *handle);
/* @p ptr is a live handle of @p kind. */
int fc_handle_live(const void *ptr, enum fc_handle_kind kind);
/* Array growth: make room for @p need elements of @p size; 0 or -1. */
int fc_grow(void **array, unsigned *cap, unsigned need, size_t size);

/* ------------------------------------------------------------ errors.c */

const char *fc_error_name(CUresult err);

/* ------------------------------------------------------------ stream.c */

struct fc_mark *fc_mark_new(void);
void fc_mark_ref(struct fc_mark *mark);
void fc_mark_unref(struct fc_mark *mark);
void fc_mark_signal(struct fc_mark *mark);
/* Sleep on fc.progress until @p mark is done (fc.lock held). */
void fc_mark_wait(const struct fc_mark *mark);
/* The stream @p handle names for a call in context @p ctx (NULL, LEGACY,
 * PER_THREAD or a live user stream), or INVALID_HANDLE. */
CUresult fc_stream_resolve(CUstream handle, struct CUctx_st *ctx, struct CUstream_st **stream_p);
/* Enqueue @p work on @p stream after the legacy-stream dependencies, after
 * @p extra_dep when not NULL; when @p done_p is not NULL, *done_p is a
 * reference to a mark signalled when the work completes. Consumes the work's
 * payload whatever the result. */
CUresult fc_stream_submit(struct CUstream_st *stream, struct fc_work *work,
                          struct fc_mark *extra_dep, struct fc_mark **done_p);
/* A reference to the mark that @p stream's work so far completes, or NULL
 * when it has none pending. */
struct fc_mark *fc_stream_tail_mark(struct CUstream_st *stream);
/* Run @p work on @p stream or record it when the stream captures (with
 * the legacy-stream and capture checks). Consumes the work's payload. */
CUresult fc_stream_do(struct CUstream_st *stream, struct fc_work *work);
/* Enqueue @p work on @p ctx's legacy stream and wait until it is done:
 * the synchronous copies and sets. Consumes the work's payload. */
CUresult fc_legacy_run(struct CUctx_st *ctx, struct fc_work *work);
/* Enqueue @p work on @p ctx's legacy stream and return at once: the
 * "synchronous" calls that CUDA lets return before they land (cuMemsetD8 of
 * device memory, cuMemcpyHtoD from pageable memory). Consumes the payload. */
CUresult fc_legacy_enqueue(struct CUctx_st *ctx, struct fc_work *work);
/* Wait until the work enqueued so far on every stream of @p ctx is done. */
void fc_ctx_drain(struct CUctx_st *ctx);
/* Destroy every stream of @p ctx (drained first). */
void fc_ctx_destroy_streams(struct CUctx_st *ctx);
/* Free the payload of @p work (kernel parameters). */
void fc_work_release(struct fc_work *work);
/* Copy @p src into @p dst, payload included; 0 or -1. */
int fc_work_clone(struct fc_work *dst, const struct fc_work *src);
/* Run @p work here, now (a stream worker, fc.lock not held). */
void fc_work_run(const struct fc_work *work, void *block_states);

/* ------------------------------------------------------------ event.c */

void fc_ctx_destroy_events(struct CUctx_st *ctx);

/* ------------------------------------------------------------ memory.c */

/* The allocation that holds @p addr, or NULL. */
struct fc_alloc *fc_alloc_find(uintptr_t addr);
/* An allocation overlapping [addr, addr + bytes), or NULL. */
struct fc_alloc *fc_alloc_overlapping(uintptr_t addr, size_t bytes);
/* Add @p alloc to the registry (it must overlap none); 0 or -1. */
int fc_alloc_insert(const struct fc_alloc *alloc);
/* Forget @p alloc, freeing or unmapping what it holds (no wait). */
void fc_alloc_release(struct fc_alloc *alloc);
/* [addr, addr + bytes) may be used as one side of a copy: inside one
 * known allocation, or (unless @p must_be_known) outside all of them.
 * CUDA_ERROR_INVALID_VALUE otherwise. */
CUresult fc_mem_check(uintptr_t addr, size_t bytes, int must_be_known);
/* Free the memory and registrations of @p ctx (its reset). cuMem
 * allocations and their mappings belong to no context and stay. */
void fc_mem_reset_ctx(struct CUctx_st *ctx);

/* ------------------------------------------------------------ vmm.c */

/* The FC_MEM_VMM mapping @p alloc goes (fc_alloc_release): its range is
 * PROT_NONE reserved memory again and its allocation loses a reference. */
void fc_vmm_unmapped(struct fc_alloc *alloc);

/* ------------------------------------------------------------ module.c */

void fc_ctx_destroy_modules(struct CUctx_st *ctx);

/* ------------------------------------------------------------ graph.c */

/* A "potentially unsafe" call (cuMemAlloc, synchronous copies, event
 * queries, ...): CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (and the captures
 * that forbid it invalidated) when an ongoing capture forbids it on this
 * thread, by this thread's mode: GLOBAL (the default) is forbidden by its
 * own captures that are not RELAXED and by other threads' GLOBAL ones,
 * THREAD_LOCAL by its own that are not RELAXED, RELAXED by none. */
CUresult fc_capture_unsafe_call(void);
/* Work on @p ctx's legacy stream: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT when a
 * blocking stream of @p ctx captures (those captures invalidated, unless
 * @p query_only). */
CUresult fc_capture_legacy_use(struct CUctx_st *ctx, int query_only);
/* Record @p work as a node of @p stream's capture. Consumes the payload. */
CUresult fc_capture_add(struct CUstream_st *stream, struct fc_work *work);
void fc_capture_invalidate(struct fc_capture *capture);
/* The ongoing capture with id @p id, or NULL. */
struct fc_capture *fc_capture_find(uint64_t id);
/* cuEventRecord and cuStreamWaitEvent on a capturing stream, and a wait
 * that makes a stream join a capture. */
CUresult fc_capture_record_event(struct CUstream_st *stream, struct CUevent_st *event);
CUresult fc_capture_wait_event(struct CUstream_st *stream, struct CUevent_st *event,
                               unsigned flags);
/* End every capture of @p ctx's streams without a graph (its reset). */
void fc_capture_abandon_ctx(struct CUctx_st *ctx);
void fc_frontier_free(struct fc_frontier *frontier);
int fc_frontier_copy(struct fc_frontier *dst, const struct fc_frontier *src);

#endif /* CFX_FAKECUDA_H */
