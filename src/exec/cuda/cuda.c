/*
 * The CUDA executor: see src/exec/cuda.h. Launches the kernel of kernel.h
 * on the callers' streams through the driver API (src/util/cuda.h), keeps
 * each communicator's work in order across streams with one event, runs
 * host buffers on streams through host functions, and watches every
 * communicator's reports from one thread per process.
 */
#include "src/exec/cuda.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "src/exec/cuda/kernel.h"
#include "src/exec/host.h"
#include "src/util/check.h"
#include "src/util/cuda.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"

#if CFX_HAVE_CUDA

CFX_PARAM_INT(cuda_host_batches, "CUDA_HOST_BATCHES", 32, 1, 4096,
              "Batches of host buffers that may wait on CUDA streams at once (per process)");
CFX_PARAM_INT(cuda_blocks, "CUDA_BLOCKS", 16, 1, 64,
              "Most thread blocks one chain of GPU operations runs on: one leads, every block "
              "moves a share of each big step's data");
CFX_PARAM_SIZE(cuda_block_bytes, "CUDA_BLOCK_BYTES", 64 << 10, 1024, 1u << 30,
               "Bytes of a step's data per block of the CUDA kernel: a chain whose steps are "
               "smaller runs on fewer blocks (one for small messages)");
CFX_PARAM_INT(cuda_threads, "CUDA_THREADS", CFX_KERNEL_THREADS, 32, CFX_KERNEL_THREADS,
              "Threads per block of the CUDA executor's kernel (a multiple of 32)");

/* The kernel image (src/exec/CMakeLists.txt: the fatbin of kernel.cu). */
extern const unsigned char cfx_kernel_image[];
extern const unsigned long cfx_kernel_image_size;

CFX_STATIC_ASSERT(CFX_EXEC_CUDA_MAX_OPS == CFX_KERNEL_MAX_OPS,
                  "the interface says what a launch carries");

#define WATCH_EVERY_NS (1 * CFX_NS_PER_MS)
#define STALL_ASK_NS   (100 * CFX_NS_PER_MS) /* How often a stall asks stalled(). */
#define MAX_DEVICES    64
/* Far launches in flight per communicator before the next waits. */
#define CFX_CUDA_FAR_BUFFERS 2

/* Where an op goes when a stream's ops are split over launches
 * (launch_split): collectives first (round -1) by their place among their
 * communicator's collectives (seq), then sends and receives by round and
 * message; call order (op) last. */
struct split_key {
    int round;
    int op;
    uint64_t seq;
};

struct cfx_cuda_comm {
    struct cfx_cuda_comm_desc desc;
    CUfunction fn;      /* The narrow launch's kernel. */
    CUfunction fn_wide; /* The wide launch's. */
    CUfunction fn_far;  /* The far launch's. */
    /* The far launches' arguments (pinned, device-mapped), used in turn;
     * far_done[i] is recorded after the launch that reads far[i], which
     * far_busy[i] says happened (a later launch waits for it first). */
    struct cfx_kernel_far *far[CFX_CUDA_FAR_BUFFERS];
    CUevent far_done[CFX_CUDA_FAR_BUFFERS];
    int far_busy[CFX_CUDA_FAR_BUFFERS];
    int far_next;
    struct cfx_kernel_comm *mapped; /* Host-mapped (the same address on the device). */
    void *teams;                    /* Device memory: mapped->teams. */
    int team_cap;                   /* Most blocks per chain on this device (team_for). */
    CUevent done;                   /* Recorded after the last eager launch. */
    CUstream last_stream;           /* The stream of that launch. */
    int launched;                   /* done was recorded at least once. */
    /* A batch's ops on a stream whose first op is this communicator's, in
     * the order they are split over launches (launch_split): their keys,
     * then their indices into the batch. */
    struct split_key order_keys[CFX_EXEC_CUDA_MAX_GROUP_OPS];
    int order[CFX_EXEC_CUDA_MAX_GROUP_OPS];
    uint64_t split_colls; /* Its collectives keyed so far in that split. */
    /* The watcher's (under watch_lock). */
    uint64_t last_beats;
    int64_t stalled_since_ns;
    int64_t stall_asked_ns; /* When stalled() was last called. */
    struct cfx_cuda_comm *next;
    /* The recorded failure: written once by the watcher, then `failed`. */
    _Atomic int failed;
    cfxResult_t fail_res;
    int fail_blame;
    struct cfx_fingerprint fail_print;
    char fail_text[CFX_ERROR_MAX];
};

/* The host-batch records, their mapped words and thread (below), made once
 * per process when its first GPU communicator opens: setup, not a call. */
static cfxResult_t host_batches_open(const struct cfx_cuda_api *cu);

/* ------------------------------------------------------------ kernel per device */

static pthread_mutex_t module_lock = PTHREAD_MUTEX_INITIALIZER;
static CUfunction device_fn[MAX_DEVICES];
static CUfunction device_fn_wide[MAX_DEVICES];
static CUfunction device_fn_far[MAX_DEVICES];

/* Conflux's kernels on @p device: the narrow launch's, the wide one's and
 * the far one's. */
static cfxResult_t kernel_of(const struct cfx_cuda_api *cu, int device, CUfunction *fn_p,
                             CUfunction *wide_p, CUfunction *far_p)
{
    if (device < 0 || device >= MAX_DEVICES)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT, "CUDA device %d is out of range",
                             device);
    cfxResult_t res = cfxSuccess;
    pthread_mutex_lock(&module_lock);
    if (device_fn[device] == NULL) {
        CUmodule module;
        CUfunction fn = NULL, wide = NULL, far = NULL;
        CUresult err = cu->module_load_data(&module, cfx_kernel_image);
        if (err == CUDA_SUCCESS) {
            err = cu->module_get_function(&fn, module, CFX_KERNEL_NAME);
            if (err == CUDA_SUCCESS)
                err = cu->module_get_function(&wide, module, CFX_KERNEL_WIDE_NAME);
            if (err == CUDA_SUCCESS)
                err = cu->module_get_function(&far, module, CFX_KERNEL_FAR_NAME);
            if (err != CUDA_SUCCESS)
                cu->module_unload(module);
        }
        if (err != CUDA_SUCCESS) {
            res = cfx_cuda_error(err, CFX_LOG_INIT,
                                 "cannot load Conflux's kernel on this GPU (built for the "
                                 "architectures of CMAKE_CUDA_ARCHITECTURES)");
        } else {
            device_fn[device] = fn;
            device_fn_wide[device] = wide;
            device_fn_far[device] = far;
            CFX_INFO(CFX_LOG_INIT, "cuda: kernel loaded on device %d (%lu-byte image)", device,
                     cfx_kernel_image_size);
        }
    }
    *wide_p = device_fn_wide[device];
    *far_p = device_fn_far[device];
    *fn_p = device_fn[device];
    pthread_mutex_unlock(&module_lock);
    return res;
}

/* ------------------------------------------------------------ watcher */

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watch_cond = PTHREAD_COND_INITIALIZER;
static struct cfx_cuda_comm *watched;
static int watch_running;
static pthread_t watch_thread;

static const char *kind_name(int kind)
{
    return cfx_coll_name((enum cfx_coll_kind)kind);
}

/* Record @p c's failure (first one only) and stop its kernels. */
__attribute__((format(printf, 5, 6))) static int record_failure(struct cfx_cuda_comm *c,
                                                                cfxResult_t res, int blame,
                                                                const struct cfx_kernel_failure *f,
                                                                const char *fmt, ...)
{
    if (atomic_load_explicit(&c->failed, memory_order_relaxed))
        return 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->fail_text, sizeof(c->fail_text), fmt, ap);
    va_end(ap);
    c->fail_res = res;
    c->fail_blame = blame;
    memset(&c->fail_print, 0, sizeof(c->fail_print));
    if (f != NULL)
        c->fail_print = f->print;
    if (cfx_load_relaxed_u32((uint32_t *)&c->mapped->abort_word) == 0)
        cfx_store_release_u32((uint32_t *)&c->mapped->abort_word, CFX_KERNEL_ABORT_BROKEN);
    atomic_store_explicit(&c->failed, 1, memory_order_release);
    CFX_WARN(CFX_LOG_COLL, "%s", c->fail_text);
    return 1;
}

/* A failure record of a block, as a sentence. Returns 1 when recorded. */
static int failure_of(struct cfx_cuda_comm *c, const struct cfx_kernel_failure *f)
{
    int rank = c->desc.rank;
    const char *what = kind_name(f->print.kind);
    unsigned long long seq = (unsigned long long)f->print.seq, step = (unsigned long long)f->step;
    switch (f->status) {
    case CFX_KERNEL_END_MISMATCH:
        return record_failure(c, cfxInvalidUsage, rank, f,
                              "%s #%llu on rank %d (GPU) received a slot from rank %d that belongs "
                              "to another operation: the ranks called mismatched collectives "
                              "(another kind, count, type, op or root)",
                              what, seq, rank, f->peer);
    case CFX_KERNEL_END_LOST_SLOT:
        return record_failure(c, cfxInternalError, rank, f,
                              "%s #%llu on rank %d (GPU): a slot from rank %d is out of turn at "
                              "step %llu (a slot was lost)",
                              what, seq, rank, f->peer, step);
    case CFX_KERNEL_END_BAD_SIZE:
        return record_failure(c, cfxInvalidUsage, rank, f,
                              "%s #%llu on rank %d (GPU): a slot from rank %d has the wrong size "
                              "at step %llu: the ranks called mismatched collectives",
                              what, seq, rank, f->peer, step);
    case CFX_KERNEL_END_CLOSED: {
        /* The closed word: the reason in the low byte, blame + 1 above. */
        cfxResult_t reason = (cfxResult_t)(f->detail & 0xff);
        int blame = (f->detail >> 8) - 1;
        if (blame < 0)
            blame = f->peer;
        return record_failure(
            c, reason == cfxSuccess ? cfxRemoteError : reason, f->peer, f,
            "%s #%llu on rank %d (GPU) stopped at step %llu: rank %d closed its "
            "connection because of rank %d (%s)",
            what, seq, rank, step, f->peer, blame,
            cfx_error_result_string(reason == cfxSuccess ? cfxRemoteError : reason));
    }
    case CFX_KERNEL_END_ABORTED:
        if (f->detail == CFX_KERNEL_ABORT_USER)
            return record_failure(c, cfxRemoteError, rank, f,
                                  "%s #%llu on rank %d (GPU) was aborted (cfxCommAbort)", what, seq,
                                  rank);
        return 0; /* Stopped for a failure recorded elsewhere. */
    default: return 0;
    }
}

/* At a timeout: every report of every communicator of this process that a
 * block used, at WARN (which FIFO each waits on, and where each last
 * posted), so a slot that never arrived can be traced to its sender when
 * the ranks share the process. watch_lock held. */
/* A FIFO's tail word as this host thread reads it now (FIFOs of GPU ranks
 * are host memory; a word the kernel named is one of them), into @p buf. */
static const char *word_now(uint64_t at, char *buf)
{
    if (at == 0 || at % sizeof(uint64_t) != 0)
        return "-";
    snprintf(buf, 24, "%llu",
             (unsigned long long)cfx_load_acquire_u64((const uint64_t *)(uintptr_t)at));
    return buf;
}

static void dump_reports(const struct cfx_cuda_comm *stuck)
{
    char now_wait[24], now_post[24];
    for (const struct cfx_cuda_comm *c = watched; c != NULL; c = c->next)
        for (int b = 0; b < CFX_KERNEL_MAX_OPS; b++) {
            const struct cfx_kernel_report *r = &c->mapped->reports[b];
            uint64_t begun = cfx_load_acquire_u64(&r->begun);
            if (begun == 0)
                continue;
            CFX_WARN(CFX_LOG_COLL,
                     "cuda: %s rank %d report %d: %s #%llu, begun %llu, ended %llu, end %d, step "
                     "%llu, waits for rank %d (tail word %#llx: head %llu, tail %llu; memory now "
                     "%s), posts to tail word %#llx at its count %llu (memory now %s)",
                     c == stuck ? "stuck" : "other", c->desc.rank, b, kind_name(r->running.kind),
                     (unsigned long long)r->running.seq, (unsigned long long)begun,
                     (unsigned long long)cfx_load_acquire_u64(&r->ended), (int)r->end_status,
                     (unsigned long long)r->step, (int)r->waiting_peer,
                     (unsigned long long)r->wait_tail_at, (unsigned long long)r->seen_head,
                     (unsigned long long)r->seen_tail, word_now(r->wait_tail_at, now_wait),
                     (unsigned long long)r->posted_tail_at, (unsigned long long)r->posted_tail,
                     word_now(r->posted_tail_at, now_post));
        }
}

/* Record the first failure @p c's blocks reported (a block's own before
 * one that only stopped for another's). 1 when one was recorded now.
 * watch_lock held. */
static int record_reported(struct cfx_cuda_comm *c)
{
    const struct cfx_kernel_failure *aborted = NULL;
    for (int b = 0; b < CFX_KERNEL_MAX_OPS; b++) {
        const struct cfx_kernel_failure *f = &c->mapped->reports[b].failure;
        uint32_t status = cfx_load_acquire_u32((const uint32_t *)&f->status);
        if (status == CFX_KERNEL_END_ABORTED)
            aborted = f;
        else if (status != 0 && failure_of(c, f))
            return 1;
    }
    return aborted != NULL && failure_of(c, aborted);
}

void cfx_exec_cuda_comm_scan(struct cfx_cuda_comm *c)
{
    if (c == NULL || atomic_load_explicit(&c->failed, memory_order_acquire))
        return;
    pthread_mutex_lock(&watch_lock);
    int recorded = record_reported(c);
    pthread_mutex_unlock(&watch_lock);
    if (recorded)
        c->desc.failed(c->desc.owner);
}

static void watch_one(struct cfx_cuda_comm *c, int64_t now)
{
    if (atomic_load_explicit(&c->failed, memory_order_acquire))
        return;
    if (record_reported(c))
        goto failed;
    uint64_t beats = 0;
    int running = -1;
    for (int b = 0; b < CFX_KERNEL_MAX_OPS; b++) {
        struct cfx_kernel_report *r = &c->mapped->reports[b];
        uint64_t begun = cfx_load_acquire_u64(&r->begun), ended = cfx_load_acquire_u64(&r->ended);
        beats += cfx_load_relaxed_u64(&r->heartbeat);
        if (begun != ended && running < 0)
            running = b;
    }
    if (running < 0 || beats != c->last_beats) {
        c->last_beats = beats;
        c->stalled_since_ns = now;
        c->stall_asked_ns = now;
        return;
    }
    /* The op a stalled block runs: what a failure found now is about. */
    struct cfx_kernel_report *r = &c->mapped->reports[running];
    struct cfx_kernel_failure f = {.step = cfx_load_relaxed_u64(&r->step)};
    f.print = r->running;
    if (now - c->stall_asked_ns >= STALL_ASK_NS && c->desc.stalled != NULL) {
        c->stall_asked_ns = now;
        int blame = c->desc.rank;
        cfxResult_t res = c->desc.stalled(c->desc.owner, &blame);
        if (res != cfxSuccess) {
            char why[CFX_ERROR_MAX];
            snprintf(why, sizeof(why), "%s", cfx_error_thread_last());
            if (!atomic_load_explicit(&c->failed, memory_order_acquire))
                dump_reports(c); /* Once, with the failure it comes with. */
            if (record_failure(c, res, blame, &f, "%s", why))
                goto failed;
        }
    }
    if (c->desc.timeout_s <= 0 || now - c->stalled_since_ns < c->desc.timeout_s * CFX_NS_PER_SEC)
        return;
    int peer = (int)cfx_load_relaxed_u32((const uint32_t *)&r->waiting_peer);
    /* The FIFO as the block last saw it: a slot posted but not seen, or
     * never posted, or a full FIFO. */
    unsigned long long head = cfx_load_relaxed_u64(&r->seen_head),
                       tail = cfx_load_relaxed_u64(&r->seen_tail);
    unsigned seq = cfx_load_relaxed_u32(&r->seen_seq);
    int send = (int)cfx_load_relaxed_u32((const uint32_t *)&r->seen_send);
    dump_reports(c);
    if (record_failure(c, cfxTimeout, peer >= 0 ? peer : c->desc.rank, &f,
                       "%s #%llu on rank %d (GPU) made no progress for %s=%lld s: step %llu waits "
                       "for rank %d (to %s; the FIFO's head %llu, tail %llu, slot %llu's seq %u)",
                       kind_name(f.print.kind), (unsigned long long)f.print.seq, c->desc.rank,
                       c->desc.timeout_name, (long long)c->desc.timeout_s,
                       (unsigned long long)f.step, peer, send ? "send" : "receive", head, tail,
                       send ? tail : head, seq))
        cfx_store_release_u32((uint32_t *)&c->mapped->abort_word, CFX_KERNEL_ABORT_TIMEOUT);
failed:
    c->desc.failed(c->desc.owner);
}

static void *watch_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&watch_lock);
    while (watch_running) {
        if (watched == NULL) {
            pthread_cond_wait(&watch_cond, &watch_lock);
            continue;
        }
        int64_t now = cfx_time_now_ns();
        for (struct cfx_cuda_comm *c = watched; c != NULL; c = c->next)
            watch_one(c, now);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += WATCH_EVERY_NS;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&watch_cond, &watch_lock, &until);
    }
    pthread_mutex_unlock(&watch_lock);
    return NULL;
}

static cfxResult_t watch_add(struct cfx_cuda_comm *c)
{
    pthread_mutex_lock(&watch_lock);
    if (!watch_running) {
        watch_running = 1;
        int err = pthread_create(&watch_thread, NULL, watch_main, NULL);
        if (err != 0) {
            watch_running = 0;
            pthread_mutex_unlock(&watch_lock);
            return cfx_error_set_errno(err, CFX_LOG_INIT, "cuda: cannot start the watcher thread");
        }
        pthread_setname_np(watch_thread, "cfx-cuda-watch");
    }
    c->stalled_since_ns = cfx_time_now_ns();
    c->next = watched;
    watched = c;
    pthread_cond_signal(&watch_cond);
    pthread_mutex_unlock(&watch_lock);
    return cfxSuccess;
}

/* Unlink @p c; the last one stops the thread. */
static void watch_remove(struct cfx_cuda_comm *c)
{
    pthread_mutex_lock(&watch_lock);
    for (struct cfx_cuda_comm **p = &watched; *p != NULL; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    int stop = watched == NULL && watch_running;
    if (stop) {
        watch_running = 0;
        pthread_cond_signal(&watch_cond);
    }
    pthread_mutex_unlock(&watch_lock);
    if (stop)
        pthread_join(watch_thread, NULL);
}

/* ------------------------------------------------------------ communicator */

/* The far launches' argument buffers and their events (setup time). */
static cfxResult_t far_open(const struct cfx_cuda_api *cu, struct cfx_cuda_comm *c)
{
    for (int i = 0; i < CFX_CUDA_FAR_BUFFERS; i++) {
        void *far = NULL;
        CUresult err = cu->mem_host_alloc(&far, sizeof(struct cfx_kernel_far),
                                          CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
        if (err != CUDA_SUCCESS)
            return cfx_cuda_error(err, CFX_LOG_INIT,
                                  "cannot allocate the arguments of large kernel launches");
        memset(far, 0, sizeof(struct cfx_kernel_far)); /* Touched now, not at a launch. */
        c->far[i] = far;
        err = cu->event_create(&c->far_done[i], CU_EVENT_DISABLE_TIMING);
        if (err != CUDA_SUCCESS)
            return cfx_cuda_error(err, CFX_LOG_INIT, "cannot create the communicator's event");
    }
    return cfxSuccess;
}

/* Undo far_open, whatever part of it ran (no launch reads them any more). */
static void far_close(const struct cfx_cuda_api *cu, struct cfx_cuda_comm *c)
{
    for (int i = 0; i < CFX_CUDA_FAR_BUFFERS; i++) {
        if (c->far_done[i] != NULL)
            cu->event_destroy(c->far_done[i]);
        if (c->far[i] != NULL)
            cu->mem_free_host(c->far[i]);
        c->far_done[i] = NULL;
        c->far[i] = NULL;
    }
}

/* Most blocks a chain of this communicator's runs on: CFX_CUDA_BLOCKS, and
 * no more than half the device's SMs shared among the process's GPU ranks
 * on it. A team's blocks wait for each other and the ranks' kernels for
 * each other's, so all must be resident at once; two blocks of
 * CFX_KERNEL_THREADS per SM leave room for the ranks' other chains and
 * other work (a block that never gets an SM hangs its whole launch). */
static int team_cap_for(int sms, int ranks_on_device)
{
    int ranks = ranks_on_device > 0 ? ranks_on_device : 1;
    int cap = sms / (2 * ranks);
    int most = (int)param_cuda_blocks();
    if (cap > most)
        cap = most;
    return cap > 0 ? cap : 1;
}

cfxResult_t cfx_exec_cuda_comm_open(const struct cfx_cuda_comm_desc *desc,
                                    struct cfx_cuda_comm **state_p)
{
    const char *why;
    const struct cfx_cuda_api *cu = cfx_cuda_api(&why);
    if (cu == NULL)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_INIT, "rank %d: CUDA is not usable: %s",
                             desc->rank, why);
    CFX_CHECK(cfx_cuda_enter(desc->device));
    CUdevice dev;
    int unified = 0, host_ptr = 0;
    CFX_CU_CHECK(cu, device_get(&dev, desc->device), CFX_LOG_INIT, "cuDeviceGet");
    CFX_CU_CHECK(cu, device_get_attribute(&unified, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, dev),
                 CFX_LOG_INIT, "cuDeviceGetAttribute");
    CFX_CU_CHECK(cu,
                 device_get_attribute(
                     &host_ptr, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, dev),
                 CFX_LOG_INIT, "cuDeviceGetAttribute");
    int sms = 0;
    CFX_CU_CHECK(cu, device_get_attribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                 CFX_LOG_INIT, "cuDeviceGetAttribute");
    if (!unified || !host_ptr)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_INIT,
                             "rank %d: CUDA device %d lacks unified addressing of registered host "
                             "memory, which Conflux's GPU path needs",
                             desc->rank, desc->device);
    struct cfx_cuda_comm *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "out of memory");
    c->desc = *desc;
    c->team_cap = team_cap_for(sms, desc->ranks_on_device);
    CFX_INFO(CFX_LOG_INIT,
             "cuda: rank %d: chains run on at most %d blocks (CFX_CUDA_BLOCKS %d; %d SMs, %d "
             "GPU rank(s) of this process on device %d)",
             desc->rank, c->team_cap, (int)param_cuda_blocks(), sms, desc->ranks_on_device,
             desc->device);
    cfxResult_t res = kernel_of(cu, desc->device, &c->fn, &c->fn_wide, &c->fn_far);
    if (res == cfxSuccess)
        res = host_batches_open(cu);
    if (res != cfxSuccess)
        goto err_free;
    void *mapped = NULL;
    CUresult err = cu->mem_host_alloc(&mapped, sizeof(struct cfx_kernel_comm),
                                      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (err != CUDA_SUCCESS) {
        res = cfx_cuda_error(err, CFX_LOG_INIT, "cannot allocate the kernels' reports");
        goto err_free;
    }
    memset(mapped, 0, sizeof(struct cfx_kernel_comm));
    c->mapped = mapped;
    res = cfx_cuda_mem_alloc(&c->teams, CFX_KERNEL_MAX_OPS * sizeof(struct cfx_kernel_team));
    if (res != cfxSuccess)
        goto err_mapped;
    c->mapped->teams = (uint64_t)(uintptr_t)c->teams;
    err = cu->event_create(&c->done, CU_EVENT_DISABLE_TIMING);
    if (err != CUDA_SUCCESS) {
        res = cfx_cuda_error(err, CFX_LOG_INIT, "cannot create the communicator's event");
        goto err_teams;
    }
    res = far_open(cu, c);
    if (res != cfxSuccess)
        goto err_far;
    res = watch_add(c);
    if (res != cfxSuccess)
        goto err_far;
    *state_p = c;
    return cfxSuccess;

err_far:
    far_close(cu, c);
    cu->event_destroy(c->done);
err_teams:
    cfx_cuda_mem_free(c->teams);
err_mapped:
    cu->mem_free_host(c->mapped);
err_free:
    free(c);
    return res;
}

cfxResult_t cfx_exec_cuda_comm_quiesce(struct cfx_cuda_comm *c)
{
    const struct cfx_cuda_api *cu = cfx_cuda_api(NULL);
    if (!c->launched)
        return cfxSuccess;
    /* The event was recorded outside any capture: safe while one runs. */
    CUstreamCaptureMode mode = cfx_cuda_relaxed_begin(cu);
    CUresult err = cu->event_synchronize(c->done);
    cfx_cuda_relaxed_end(cu, mode);
    if (err != CUDA_SUCCESS)
        return cfx_cuda_error(err, CFX_LOG_COLL,
                              "waiting for the communicator's work on its streams");
    c->launched = 0;
    return cfxSuccess;
}

int cfx_exec_cuda_comm_busy(struct cfx_cuda_comm *c)
{
    const struct cfx_cuda_api *cu = cfx_cuda_api(NULL);
    if (c == NULL || !c->launched)
        return 0;
    /* Read only: any thread, also while this or another thread captures a
     * graph (the event is never recorded in a capture). */
    CUstreamCaptureMode mode = cfx_cuda_relaxed_begin(cu);
    int busy = cu->event_query(c->done) == CUDA_ERROR_NOT_READY;
    cfx_cuda_relaxed_end(cu, mode);
    return busy;
}

void cfx_exec_cuda_comm_abort(struct cfx_cuda_comm *c, int broken)
{
    if (c == NULL)
        return;
    uint32_t why = broken ? CFX_KERNEL_ABORT_BROKEN : CFX_KERNEL_ABORT_USER;
    uint32_t expected = 0;
    __atomic_compare_exchange_n((uint32_t *)&c->mapped->abort_word, &expected, why, 0,
                                __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

cfxResult_t cfx_exec_cuda_comm_failure(struct cfx_cuda_comm *c, int *blame_p,
                                       struct cfx_fingerprint *print_p)
{
    if (c == NULL || !atomic_load_explicit(&c->failed, memory_order_acquire))
        return cfxSuccess;
    *blame_p = c->fail_blame;
    *print_p = c->fail_print;
    return cfx_error_set(c->fail_res, CFX_LOG_COLL, "%s", c->fail_text);
}

void cfx_exec_cuda_comm_fail(struct cfx_cuda_comm *c, cfxResult_t res, int blame,
                             const struct cfx_fingerprint *print, const char *text)
{
    struct cfx_kernel_failure f = {.print = *print};
    pthread_mutex_lock(&watch_lock);
    int recorded = record_failure(c, res, blame, &f, "%s", text);
    pthread_mutex_unlock(&watch_lock);
    if (recorded)
        c->desc.failed(c->desc.owner);
}

void cfx_exec_cuda_comm_close(struct cfx_cuda_comm *c)
{
    if (c == NULL)
        return;
    const struct cfx_cuda_api *cu = cfx_cuda_api(NULL);
    if (cfx_cuda_enter(c->desc.device) == cfxSuccess && c->launched) {
        CUstreamCaptureMode mode = cfx_cuda_relaxed_begin(cu);
        cu->event_synchronize(c->done);
        cfx_cuda_relaxed_end(cu, mode);
    }
    watch_remove(c);
    far_close(cu, c);
    cu->event_destroy(c->done);
    cfx_cuda_mem_free(c->teams);
    cu->mem_free_host(c->mapped);
    free(c);
}

cfxResult_t cfx_exec_cuda_stream_capturing(cfxStream_t stream, int *capturing_p)
{
    const struct cfx_cuda_api *cu = cfx_cuda_api(NULL);
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (stream != NULL)
        CFX_CU_CHECK(cu, stream_is_capturing((CUstream)stream, &status), CFX_LOG_COLL,
                     "cuStreamIsCapturing");
    if (status == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                             "the stream's graph capture was invalidated by an earlier call; end "
                             "the capture (cudaStreamEndCapture) first");
    *capturing_p = status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return cfxSuccess;
}

/* Before work for @p c goes on @p stream: order it after @p c's previous
 * work when that went on another stream (not while capturing: a captured
 * launch is ordered by its graph). */
static cfxResult_t order_after_previous(const struct cfx_cuda_api *cu, struct cfx_cuda_comm *c,
                                        CUstream stream, int capturing)
{
    if (!capturing && c->launched && c->last_stream != stream)
        CFX_CU_CHECK(cu, stream_wait_event(stream, c->done, 0), CFX_LOG_COLL,
                     "cannot order the call after the communicator's previous one");
    return cfxSuccess;
}

/* After work for @p c went on @p stream: remember it. */
static cfxResult_t note_launched(const struct cfx_cuda_api *cu, struct cfx_cuda_comm *c,
                                 CUstream stream, int capturing)
{
    if (capturing)
        return cfxSuccess;
    CFX_CU_CHECK(cu, event_record(c->done, stream), CFX_LOG_COLL,
                 "cannot record the communicator's event");
    c->last_stream = stream;
    c->launched = 1;
    return cfxSuccess;
}

/* ------------------------------------------------------------ device launches */

/* Union-find over a launch's ops: the root of @p i's chain. */
static int chain_root(int *parent, int i)
{
    while (parent[i] != i)
        i = parent[i] = parent[parent[i]];
    return i;
}

/* Whether ops @p x and @p y use a connector in common. */
static int share_a_connector(const struct cfx_op *x, const struct cfx_op *y)
{
    for (int i = 0; i < x->n_conns; i++)
        for (int j = 0; j < y->n_conns; j++)
            if (x->conns[i] == y->conns[j])
                return 1;
    return 0;
}

/* Blocks for a chain with @p work among its ops (@p so_far: for the others):
 * one per CFX_CUDA_BLOCK_BYTES of its steps, at most @p most (team_cap). */
static int team_for(const struct cfx_work *work, int most, int so_far)
{
    uint64_t elems = work->chunk_elems < work->count ? work->chunk_elems : work->count;
    uint64_t blocks = elems * work->elem_bytes / (uint64_t)param_cuda_block_bytes();
    int team = blocks >= (uint64_t)most ? most : (int)blocks;
    return team > so_far ? team : so_far;
}

/* How a launch passes its arguments (kernel.h). */
enum launch_kind { LAUNCH_NARROW, LAUNCH_WIDE, LAUNCH_FAR };

/* A far argument buffer of @p c, free: the launch that last read it is
 * over (the host waits for it when both are in flight). */
static cfxResult_t far_take(const struct cfx_cuda_api *cu, struct cfx_cuda_comm *c, int *index_p)
{
    int i = c->far_next;
    if (c->far_busy[i]) {
        CUstreamCaptureMode mode = cfx_cuda_relaxed_begin(cu);
        CUresult err = cu->event_synchronize(c->far_done[i]);
        cfx_cuda_relaxed_end(cu, mode);
        if (err != CUDA_SUCCESS)
            return cfx_cuda_error(err, CFX_LOG_COLL, "cannot wait for an earlier kernel launch");
        c->far_busy[i] = 0;
    }
    c->far_next = (i + 1) % CFX_CUDA_FAR_BUFFERS;
    *index_p = i;
    return cfxSuccess;
}

/* The launch of the batch's ops on @p stream: the ops in chains (those that
 * share a connector, transitively, in one chain in call order), a block
 * per chain; its arguments in @p launch (the narrow parameter where it
 * carries them, else the wide one), or in a far buffer of @p first's
 * (*far_p set to its index) for groups the wide one cannot carry, which a
 * capture refuses (@p capturing: the buffer is used again by later
 * launches, so a replay would read other arguments). */
static cfxResult_t build_args(const struct cfx_cuda_api *cu, struct cfx_op *ops, const int *on,
                              int n, struct cfx_cuda_comm *first, int capturing,
                              struct cfx_kernel_wide *launch, enum launch_kind *kind_p,
                              struct cfx_kernel_args **args_p, int *far_p)
{
    int parent[CFX_KERNEL_MAX_OPS];
    uint32_t n_views = 0;
    if (n > CFX_KERNEL_MAX_OPS)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                             "a group puts %d GPU operations of several communicators on one CUDA "
                             "stream, more than one kernel launch carries (%d): split the group",
                             n, CFX_KERNEL_MAX_OPS);
    for (int k = 0; k < n; k++) {
        parent[k] = k;
        for (int j = 0; j < k; j++)
            if (share_a_connector(&ops[on[j]], &ops[on[k]]))
                parent[chain_root(parent, k)] = chain_root(parent, j);
        n_views += (uint32_t)ops[on[k]].n_conns;
    }
    if (n_views > CFX_KERNEL_FAR_VIEWS)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                             "a group puts %u connectors on one CUDA stream, more than one "
                             "kernel launch carries (%d): split the group",
                             n_views, CFX_KERNEL_FAR_VIEWS);
    enum launch_kind kind = LAUNCH_NARROW;
    if (n > CFX_KERNEL_WIDE_OPS || n_views > CFX_KERNEL_WIDE_VIEWS)
        kind = LAUNCH_FAR;
    else if (n > CFX_KERNEL_NARROW_OPS || n_views > CFX_KERNEL_NARROW_VIEWS)
        kind = LAUNCH_WIDE;
    struct cfx_kernel_args *args = &launch->head;
    *far_p = -1;
    if (kind == LAUNCH_FAR) {
        if (capturing)
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                                 "a group of %d GPU operations on one stream cannot be captured "
                                 "into a CUDA graph: a captured launch carries at most %d; split "
                                 "the group",
                                 n, CFX_KERNEL_WIDE_OPS);
        CFX_CHECK(far_take(cu, first, far_p));
        args = &first->far[*far_p]->head;
    }
    args->abi = CFX_KERNEL_ABI;
    args->n_ops = 0;
    args->n_views = 0;
    args->n_blocks = 0;
    args->spin_check = CFX_KERNEL_SPIN_CHECK;
    args->cap_ops = kind == LAUNCH_FAR    ? CFX_KERNEL_FAR_OPS
                    : kind == LAUNCH_WIDE ? CFX_KERNEL_WIDE_OPS
                                          : CFX_KERNEL_NARROW_OPS;
    args->team = 1;
    memset(args->pad, 0, sizeof(args->pad));
    /* Where this launch keeps its chains (cap_ops says: far ones after their views). */
    uint8_t *block_first = (uint8_t *)(uintptr_t)cfx_kernel_block_firsts(args);
    struct cfx_kernel_op *k_ops = cfx_kernel_args_ops(args);
    struct cfx_conn *views = cfx_kernel_args_views(args);
    int placed[CFX_KERNEL_MAX_OPS] = {0};
    for (int first_op = 0; first_op < n; first_op++) {
        if (placed[first_op])
            continue;
        int root = chain_root(parent, first_op);
        block_first[args->n_blocks++] = (uint8_t)args->n_ops;
        for (int k = first_op; k < n; k++) {
            if (placed[k] || chain_root(parent, k) != root)
                continue;
            placed[k] = 1;
            struct cfx_op *op = &ops[on[k]];
            struct cfx_cuda_comm *c = op->exec_state;
            /* Its report slot: its place among its communicator's ops here. */
            int slot = 0;
            for (int j = 0; j < args->n_ops; j++)
                slot += k_ops[j].comm == c->mapped;
            args->team = (uint8_t)team_for(&op->work, c->team_cap, args->team);
            struct cfx_kernel_op *k_op = &k_ops[args->n_ops++];
            k_op->work = op->work;
            k_op->comm = c->mapped;
            k_op->slot = (uint8_t)slot;
            k_op->first_view = (uint8_t)args->n_views;
            memset(k_op->reserved, 0, sizeof(k_op->reserved));
            for (int v = 0; v < op->n_conns; v++)
                views[args->n_views++] = op->conns[v]->view;
        }
    }
    block_first[args->n_blocks] = (uint8_t)args->n_ops;
    /* Chains share the budget of one: a launch of several (a ring split
     * into channels, a group's peers) runs on at most team_cap blocks in
     * all, one per chain at least, so that every rank's blocks stay
     * resident together (team_cap_for). */
    if (args->n_blocks > 1 && args->n_blocks * args->team > first->team_cap) {
        int team = first->team_cap / args->n_blocks;
        args->team = (uint8_t)(team > 1 ? team : 1);
    }
    *kind_p = kind;
    *args_p = args;
    return cfxSuccess;
}

/* One launch of the @p n ops ops[on[0..n)] on @p stream (@p first: the
 * first one's communicator). */
static cfxResult_t launch_one(const struct cfx_cuda_api *cu, struct cfx_op *ops, const int *on,
                              int n, cfxStream_t stream, struct cfx_cuda_comm *first, int capturing)
{
    /* Filled in place as the narrow or the wide parameter (their heads and
     * operations coincide; the views follow cap_ops operations). */
    union {
        struct cfx_kernel_narrow narrow;
        struct cfx_kernel_wide wide;
    } launch;
    enum launch_kind kind = LAUNCH_NARROW;
    struct cfx_kernel_args *args = NULL;
    int far = -1;
    CFX_CHECK(build_args(cu, ops, on, n, first, capturing, &launch.wide, &kind, &args, &far));
    CUstream s = (CUstream)stream;
    for (int k = 0; k < n; k++)
        CFX_CHECK(order_after_previous(cu, ops[on[k]].exec_state, s, capturing));
    void *params[] = {&launch};
    CUfunction fn = kind == LAUNCH_WIDE ? first->fn_wide : first->fn;
    if (kind == LAUNCH_FAR) {
        params[0] = &args; /* The parameter is the arguments' (mapped) address. */
        fn = first->fn_far;
    }
    CFX_CU_CHECK(cu,
                 launch_kernel(fn, args->n_blocks * args->team, 1, 1,
                               (unsigned)param_cuda_threads(), 1, 1, 0, s, params, NULL),
                 CFX_LOG_COLL, "cannot launch the collective's kernel");
    if (far >= 0) {
        CFX_CU_CHECK(cu, event_record(first->far_done[far], s), CFX_LOG_COLL,
                     "cannot record the communicator's event");
        first->far_busy[far] = 1;
    }
    for (int k = 0; k < n; k++)
        CFX_CHECK(note_launched(cu, ops[on[k]].exec_state, s, capturing));
    return cfxSuccess;
}

/*
 * Groups of several launches. The ops on one stream that one launch cannot
 * carry (more than CFX_KERNEL_FAR_OPS ops or CFX_KERNEL_FAR_VIEWS views;
 * while capturing, more than the wide parameter's), of one communicator or
 * of several (ranks one thread drives), go in several launches that the
 * stream runs one after the other, each at most a wide parameter's worth
 * (never a far one: a far buffer may make the host wait for an earlier
 * launch, which may wait for a peer this thread has yet to launch for).
 *
 * A launch must not wait for a peer's op that the peer put in a later
 * launch while that peer's earlier launch waits for one of this rank's
 * later ops. So every rank orders its ops alike before cutting them:
 * first the collectives, in call order (every rank calls them alike); then
 * sends and receives by round and message: a send to rank + d and a
 * receive from rank - d (mod n) are in round d, and the k-th message on
 * a connector is message k on both of its sides (cfx_op.p2p_msg), so each
 * op and its peer's matching op have the same (round, message). The send
 * and the receive of one (round, message) stay in one launch. Then the
 * least (round, message) not done is, on every rank that has it, in the
 * launch running there (every earlier launch holds only lesser ones, all
 * done), at the head of its chains, and so is its match on the peer: it
 * completes, and so on up. Ops of one connector keep their order (their
 * message numbers rise).
 *
 * Several communicators on one stream: each op's key is the same as if
 * its communicator were alone (a collective's place is among its own
 * communicator's collectives), the stream's ops are sorted by key whatever
 * their communicator, and a launch ends only between two different keys.
 * So every launch on every stream holds a range of keys above the ranges
 * of the launches before it, the ops with the least key not done are in
 * the launches running on their streams, and the argument above holds
 * across communicators: ranks of one communicator on one stream have
 * their matching ops in one launch, and ranks elsewhere wait for nothing
 * of a later launch.
 */

/* The round of a send or receive (a send to rank + d, a receive from
 * rank - d: d), or -1 for a collective. */
static int p2p_round(const struct cfx_op *op)
{
    if (op->kind == CFX_COLL_SEND)
        return cfx_mod(op->root - op->rank, op->nranks);
    if (op->kind == CFX_COLL_RECV)
        return cfx_mod(op->rank - op->root, op->nranks);
    return -1;
}

/* The order of two split keys (qsort). */
static int key_compare(const void *a, const void *b)
{
    const struct split_key *x = a, *y = b;
    if (x->round != y->round)
        return x->round < y->round ? -1 : 1; /* Collectives (-1) first. */
    if (x->seq != y->seq)
        return x->seq < y->seq ? -1 : 1;
    return x->op < y->op ? -1 : x->op > y->op; /* Call order. */
}

/* The length of the unit at keys[k]: the ops of one key (a collective of
 * each communicator, a send and a receive of one round and message of
 * each), which stay in one launch. */
static int unit_len(const struct split_key *keys, int n, int k)
{
    int len = 1;
    while (k + len < n && keys[k + len].round == keys[k].round && keys[k + len].seq == keys[k].seq)
        len++;
    return len;
}

/* The connectors of the @p len ops ops[order[k..k+len)]. */
static int unit_views(const struct cfx_op *ops, const int *order, int k, int len)
{
    int views = 0;
    for (int j = k; j < k + len; j++)
        views += ops[order[j]].n_conns;
    return views;
}

/* The @p n ops on @p stream, ops[c->order[0..n)] (one communicator's, or
 * several: @p c is the first one's), in several launches (above). */
static cfxResult_t launch_split(const struct cfx_cuda_api *cu, struct cfx_op *ops, int n,
                                cfxStream_t stream, struct cfx_cuda_comm *c, int capturing)
{
    struct split_key *keys = c->order_keys;
    int *order = c->order;
    for (int k = 0; k < n; k++)
        ((struct cfx_cuda_comm *)ops[order[k]].exec_state)->split_colls = 0;
    for (int k = 0; k < n; k++) {
        const struct cfx_op *op = &ops[order[k]];
        struct cfx_cuda_comm *owner = op->exec_state;
        keys[k].op = order[k];
        keys[k].round = p2p_round(op);
        keys[k].seq = op->p2p_msg;
        if (keys[k].round < 0) /* Its place among its communicator's collectives here. */
            keys[k].seq = owner->split_colls++;
    }
    qsort(keys, (size_t)n, sizeof(*keys), key_compare);
    for (int k = 0; k < n; k++)
        order[k] = keys[k].op;
    /* Refused before anything is launched: a unit no launch of the split
     * carries. */
    for (int k = 0; k < n;) {
        int len = unit_len(keys, n, k), views = unit_views(ops, order, k, len);
        if (len > CFX_KERNEL_WIDE_OPS || views > CFX_KERNEL_WIDE_VIEWS)
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                                 "a group puts %d GPU operations on one CUDA stream that must run "
                                 "in one kernel launch (%d connectors), more than a launch of a "
                                 "long group carries (%d operations, %d connectors): give the "
                                 "communicators streams of their own",
                                 len, views, CFX_KERNEL_WIDE_OPS, CFX_KERNEL_WIDE_VIEWS);
        k += len;
    }
    int start = 0, launches = 0;
    while (start < n) {
        int end = start, views = 0;
        while (end < n) {
            int len = unit_len(keys, n, end), more = unit_views(ops, order, end, len);
            if (end > start &&
                (end + len - start > CFX_KERNEL_WIDE_OPS || views + more > CFX_KERNEL_WIDE_VIEWS))
                break;
            views += more;
            end += len;
        }
        cfxResult_t res = launch_one(cu, ops, order + start, end - start, stream, c, capturing);
        if (res != cfxSuccess) {
            /* The launches already on the stream wait for ops that never
             * come: stop them (the communicators are broken, as the core
             * takes it after a failed launch). */
            for (int k = 0; k < start; k++)
                cfx_exec_cuda_comm_abort(ops[order[k]].exec_state, 1);
            return res;
        }
        launches++;
        start = end;
    }
    CFX_TRACE(CFX_LOG_COLL, "rank %d: %d GPU operations on one stream in %d launches", c->desc.rank,
              n, launches);
    return cfxSuccess;
}

static cfxResult_t launch_stream(const struct cfx_cuda_api *cu, struct cfx_op *ops, int n_ops,
                                 cfxStream_t stream)
{
    struct cfx_cuda_comm *first = NULL;
    int n = 0;
    uint32_t views = 0;
    for (int i = 0; i < n_ops; i++) {
        if (ops[i].stream != stream)
            continue;
        if (first == NULL)
            first = ops[i].exec_state;
        views += (uint32_t)ops[i].n_conns;
        n++;
    }
    CFX_CHECK(cfx_cuda_enter(first->desc.device));
    int capturing = 0;
    CFX_CHECK(cfx_exec_cuda_stream_capturing(stream, &capturing));
    int most_ops = capturing ? CFX_KERNEL_WIDE_OPS : CFX_KERNEL_FAR_OPS;
    uint32_t most_views = capturing ? CFX_KERNEL_WIDE_VIEWS : CFX_KERNEL_FAR_VIEWS;
    if (n > most_ops || views > most_views) {
        if (n > CFX_EXEC_CUDA_MAX_GROUP_OPS) /* group.c refuses these first. */
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                                 "a group puts %d GPU operations on one stream, more than %d: "
                                 "split the group",
                                 n, CFX_EXEC_CUDA_MAX_GROUP_OPS);
        for (int i = 0, k = 0; i < n_ops; i++)
            if (ops[i].stream == stream)
                first->order[k++] = i;
        return launch_split(cu, ops, n, stream, first, capturing);
    }
    int on[CFX_KERNEL_MAX_OPS];
    for (int i = 0, k = 0; i < n_ops; i++)
        if (ops[i].stream == stream)
            on[k++] = i;
    return launch_one(cu, ops, on, n, stream, first, capturing);
}

/* Whether ops[i] is the first op of the batch on its stream. */
static int first_on_stream(const struct cfx_op *ops, int i)
{
    for (int j = 0; j < i; j++)
        if (ops[j].stream == ops[i].stream)
            return 0;
    return 1;
}

static cfxResult_t cuda_launch(const struct cfx_executor *exec, struct cfx_exec_batch *batch)
{
    (void)exec;
    const struct cfx_cuda_api *cu = cfx_cuda_api(NULL);
    struct cfx_op *ops = batch->ops;
    int n_ops = batch->n_ops;
    /* One communicator's ops go on one stream (one kernel runs them):
     * each op against its communicator's first. */
    for (int i = 0; i < n_ops; i++)
        for (int j = 0; j < i; j++) {
            if (ops[j].exec_state != ops[i].exec_state)
                continue;
            if (ops[j].stream == ops[i].stream)
                break;
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                                 "a group gives rank %d's GPU operations two streams; one "
                                 "communicator's operations in a group must share a stream",
                                 ops[i].rank);
        }
    for (int i = 0; i < n_ops; i++) {
        if (!first_on_stream(ops, i))
            continue;
        cfxResult_t res = launch_stream(cu, ops, n_ops, ops[i].stream);
        if (res != cfxSuccess)
            return res;
    }
    batch->enqueued = 1;
    return cfxSuccess;
}

/* A launch is enqueued whole or not at all: test and wait never run. */
static cfxResult_t cuda_test(const struct cfx_executor *exec, struct cfx_exec_batch *batch)
{
    (void)exec;
    (void)batch;
    return cfxSuccess;
}

static void cuda_abort(const struct cfx_executor *exec, struct cfx_exec_batch *batch)
{
    (void)exec;
    for (int i = 0; i < batch->n_ops; i++)
        cfx_exec_cuda_comm_abort(batch->ops[i].exec_state, 0);
}

const struct cfx_executor cfx_exec_cuda = {
    .version = CFX_EXEC_VERSION,
    .name = "cuda",
    .launch = cuda_launch,
    .test = cuda_test,
    .wait = cuda_test,
    .abort = cuda_abort,
};

/* ------------------------------------------------------------ host buffers on streams */

/*
 * A host batch on a stream runs on this process's host-batch thread, not in
 * the stream's host function: CUDA may run the host functions of all
 * streams on one thread, one after the other, and says a host function must
 * not wait for anything not ordered before it. A batch waits for its peers'
 * batches, which another thread of this process may have put on another
 * stream (ranks one process drives), so it must not block the callback
 * thread (on an H200 two ranks' batches waited for each other until
 * CFX_TIMEOUT). So the stream gets two things: a host function that only
 * says "the stream is here" (state READY), and a wait on a word in mapped
 * memory (cuStreamWaitValue32) that the host-batch thread sets to the
 * batch's number once the batch is over. The thread progresses every ready
 * batch at once (the host executor's test never blocks).
 *
 * Without cuStreamWaitValue32 (an old driver) the host function runs the
 * batch itself, as before: correct for one rank per process.
 */
enum host_batch_state {
    HB_FREE = 0,
    HB_QUEUED,  /* On its stream; the stream has not reached it. */
    HB_READY,   /* The stream reached it: the host-batch thread's now. */
    HB_RUNNING, /* Launched on the host executor. */
};

/* A batch of host buffers on a stream. */
struct host_batch {
    _Atomic int state;     /* enum host_batch_state. */
    _Atomic int cancelled; /* Its stream's wait could not be enqueued: end it unrun. */
    struct cfx_op *ops;
    int n_ops, capacity;
    struct cfx_exec_batch batch;
    void (*on_done)(struct cfx_op *ops, int n_ops, cfxResult_t res);
    uint32_t seq;        /* The number of its latest use: what its stream waits for. */
    uint32_t *done_word; /* In mapped memory (one cache line each). */
    CUdeviceptr done_dev;
};

static pthread_mutex_t host_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t host_cond = PTHREAD_COND_INITIALIZER; /* A batch is READY. */
static struct host_batch *host_batches;
static int n_host_batches;
static void *host_words; /* cuMemHostAlloc'd: n_host_batches cache lines. */
static int host_thread_started;

/* One batch's end: its completion, its word (the stream goes on), free. */
static void host_batch_finish(struct host_batch *hb, cfxResult_t res)
{
    hb->on_done(hb->ops, hb->n_ops, res);
    cfx_store_release_u32(hb->done_word, hb->seq);
    atomic_store_explicit(&hb->state, HB_FREE, memory_order_release);
}

static void *host_thread_main(void *arg)
{
    (void)arg;
    unsigned idle_rounds = 0;
    for (;;) {
        int active = 0;
        for (int i = 0; i < n_host_batches; i++) {
            struct host_batch *hb = &host_batches[i];
            int state = atomic_load_explicit(&hb->state, memory_order_acquire);
            if (state == HB_READY) {
                if (atomic_load_explicit(&hb->cancelled, memory_order_acquire)) {
                    host_batch_finish(hb, cfxInvalidUsage);
                    continue;
                }
                /* Non-NULL stream: launch progresses, never blocks. */
                cfx_exec_batch_init(&hb->batch, hb->ops, hb->n_ops, (cfxStream_t)hb);
                atomic_store_explicit(&hb->state, HB_RUNNING, memory_order_relaxed);
                cfxResult_t res = cfx_exec_host.launch(&cfx_exec_host, &hb->batch);
                if (res != cfxInProgress)
                    host_batch_finish(hb, res);
                else
                    active++;
            } else if (state == HB_RUNNING) {
                cfxResult_t res = cfx_exec_host.test(&cfx_exec_host, &hb->batch);
                if (res != cfxInProgress)
                    host_batch_finish(hb, res);
                else
                    active++;
            }
        }
        if (active > 0) {
            /* Peers on other cores: yield; else nap a little (8 ranks on 2 cores). */
            if (++idle_rounds % 64 != 0) {
                sched_yield();
            } else {
                struct timespec nap = {0, 20000};
                nanosleep(&nap, NULL);
            }
            continue;
        }
        idle_rounds = 0;
        pthread_mutex_lock(&host_lock);
        int ready = 0;
        for (int i = 0; i < n_host_batches && !ready; i++)
            ready = atomic_load_explicit(&host_batches[i].state, memory_order_acquire) == HB_READY;
        if (!ready)
            pthread_cond_wait(&host_cond, &host_lock);
        pthread_mutex_unlock(&host_lock);
    }
    return NULL;
}

/* The stream reached the batch (a CUDA host function: no CUDA, no waiting). */
static void CUDA_CB host_batch_reached(void *arg)
{
    struct host_batch *hb = arg;
    pthread_mutex_lock(&host_lock);
    atomic_store_explicit(&hb->state, HB_READY, memory_order_release);
    pthread_cond_signal(&host_cond);
    pthread_mutex_unlock(&host_lock);
}

/* The stream reached the batch, and this driver cannot make a stream wait
 * for a word: run it here, in the host function. */
static void CUDA_CB host_batch_run_here(void *arg)
{
    struct host_batch *hb = arg;
    cfx_exec_batch_init(&hb->batch, hb->ops, hb->n_ops, NULL);
    cfxResult_t res = cfx_exec_host.launch(&cfx_exec_host, &hb->batch);
    if (res == cfxInProgress)
        res = cfx_exec_host.wait(&cfx_exec_host, &hb->batch);
    host_batch_finish(hb, res);
}

/* The records, their mapped words and the thread, made once per process
 * (host_lock held, a CUDA context current: cfx_exec_cuda_comm_open's). */
static cfxResult_t host_batches_setup(const struct cfx_cuda_api *cu)
{
    if (host_batches != NULL)
        return cfxSuccess;
    int n = (int)param_cuda_host_batches();
    struct host_batch *batches = calloc((size_t)n, sizeof(*batches));
    if (batches == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_COLL, "out of memory");
    void *words = NULL;
    CUresult err = cu->mem_host_alloc(&words, (size_t)n * CFX_CACHE_LINE,
                                      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (err != CUDA_SUCCESS) {
        free(batches);
        return cfx_cuda_error(err, CFX_LOG_COLL, "cannot allocate the host batches' words");
    }
    memset(words, 0, (size_t)n * CFX_CACHE_LINE);
    for (int i = 0; i < n; i++) {
        batches[i].done_word = (uint32_t *)((char *)words + (size_t)i * CFX_CACHE_LINE);
        err = cu->mem_host_get_device_pointer(&batches[i].done_dev, batches[i].done_word, 0);
        if (err != CUDA_SUCCESS) {
            cu->mem_free_host(words);
            free(batches);
            return cfx_cuda_error(err, CFX_LOG_COLL, "cannot map the host batches' words");
        }
    }
    if (cu->stream_wait_value_32 != NULL) {
        pthread_t thread;
        int rc = pthread_create(&thread, NULL, host_thread_main, NULL);
        if (rc != 0) {
            cu->mem_free_host(words);
            free(batches);
            return cfx_error_set_errno(rc, CFX_LOG_COLL,
                                       "cuda: cannot start the host-batch thread");
        }
        pthread_detach(thread);
        pthread_setname_np(thread, "cfx-cuda-host");
        host_thread_started = 1;
    } else {
        CFX_INFO(CFX_LOG_INIT, "cuda: this driver has no cuStreamWaitValue32: host buffers on "
                               "streams run in CUDA's host functions (one rank per process)");
    }
    host_words = words;
    n_host_batches = n;
    host_batches = batches;
    return cfxSuccess;
}

static cfxResult_t host_batches_open(const struct cfx_cuda_api *cu)
{
    pthread_mutex_lock(&host_lock);
    cfxResult_t res = host_batches_setup(cu);
    pthread_mutex_unlock(&host_lock);
    return res;
}

/* A free batch record with room for @p n_ops (waits for one to finish when
 * all are busy), marked QUEUED. The records exist: the rank's communicator
 * opened them. */
static cfxResult_t take_batch(int n_ops, struct host_batch **hb_p)
{
    pthread_mutex_lock(&host_lock);
    assert(host_batches != NULL);
    struct host_batch *hb = NULL;
    for (int spins = 0; hb == NULL; spins++) {
        for (int i = 0; i < n_host_batches && hb == NULL; i++)
            if (atomic_load_explicit(&host_batches[i].state, memory_order_acquire) == HB_FREE)
                hb = &host_batches[i];
        if (hb == NULL) {
            pthread_mutex_unlock(&host_lock);
            struct timespec nap = {0, spins < 100 ? 10000 : 1000000};
            nanosleep(&nap, NULL);
            pthread_mutex_lock(&host_lock);
        }
    }
    if (hb->capacity < n_ops) {
        /* Grows to the largest group seen: once per size, not per call. */
        struct cfx_op *grown = realloc(hb->ops, (size_t)n_ops * sizeof(*grown));
        if (grown == NULL) {
            pthread_mutex_unlock(&host_lock);
            return cfx_error_set(cfxSystemError, CFX_LOG_COLL, "out of memory");
        }
        hb->ops = grown;
        hb->capacity = n_ops;
    }
    atomic_store_explicit(&hb->cancelled, 0, memory_order_relaxed);
    hb->seq++;
    atomic_store_explicit(&hb->state, HB_QUEUED, memory_order_relaxed);
    pthread_mutex_unlock(&host_lock);
    *hb_p = hb;
    return cfxSuccess;
}

cfxResult_t cfx_exec_cuda_host_enqueue(cfxStream_t stream, const struct cfx_op *ops, int n_ops,
                                       void (*on_done)(struct cfx_op *ops, int n_ops,
                                                       cfxResult_t res))
{
    const struct cfx_cuda_api *cu = cfx_cuda_api(NULL);
    struct cfx_cuda_comm *first = ops[0].exec_state;
    CFX_CHECK(cfx_cuda_enter(first->desc.device));
    int capturing = 0;
    CFX_CHECK(cfx_exec_cuda_stream_capturing(stream, &capturing));
    if (capturing)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                             "host buffers on a stream that captures a graph: a replay would run "
                             "the host operation again with the buffers of this call; capture "
                             "GPU buffers only");
    struct host_batch *hb = NULL;
    CFX_CHECK(take_batch(n_ops, &hb));
    memcpy(hb->ops, ops, (size_t)n_ops * sizeof(*ops));
    hb->n_ops = n_ops;
    hb->on_done = on_done;
    CUstream s = (CUstream)stream;
    cfxResult_t res = cfxSuccess;
    for (int i = 0; i < n_ops && res == cfxSuccess; i++)
        res = order_after_previous(cu, ops[i].exec_state, s, 0);
    if (res != cfxSuccess) {
        atomic_store_explicit(&hb->state, HB_FREE, memory_order_release);
        return res;
    }
    CUresult err =
        cu->launch_host_func(s, host_thread_started ? host_batch_reached : host_batch_run_here, hb);
    if (err != CUDA_SUCCESS) {
        atomic_store_explicit(&hb->state, HB_FREE, memory_order_release);
        return cfx_cuda_error(err, CFX_LOG_COLL, "cannot put the host operation on the stream");
    }
    if (host_thread_started) {
        /* Later work on the stream waits until the batch is over. */
        err = cu->stream_wait_value_32(s, hb->done_dev, hb->seq, CU_STREAM_WAIT_VALUE_GEQ);
        if (err != CUDA_SUCCESS) {
            /* The host function is queued: the batch ends unrun, as failed. */
            atomic_store_explicit(&hb->cancelled, 1, memory_order_release);
            return cfx_cuda_error(err, CFX_LOG_COLL,
                                  "cannot make the stream wait for the host operation "
                                  "(cuStreamWaitValue32)");
        }
    }
    for (int i = 0; i < n_ops; i++)
        CFX_CHECK(note_launched(cu, ops[i].exec_state, s, 0));
    return cfxSuccess;
}

#else /* !CFX_HAVE_CUDA: no GPU rank can exist (cfx_cuda_rank_device is -1). */

cfxResult_t cfx_exec_cuda_comm_open(const struct cfx_cuda_comm_desc *desc,
                                    struct cfx_cuda_comm **state_p)
{
    (void)state_p;
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_INIT,
                         "rank %d: this Conflux was built without CUDA", desc->rank);
}

void cfx_exec_cuda_comm_close(struct cfx_cuda_comm *state)
{
    (void)state;
}

cfxResult_t cfx_exec_cuda_comm_quiesce(struct cfx_cuda_comm *state)
{
    (void)state;
    return cfxSuccess;
}

int cfx_exec_cuda_comm_busy(struct cfx_cuda_comm *state)
{
    (void)state;
    return 0;
}

cfxResult_t cfx_exec_cuda_comm_failure(struct cfx_cuda_comm *state, int *blame_p,
                                       struct cfx_fingerprint *print_p)
{
    (void)state;
    (void)blame_p;
    (void)print_p;
    return cfxSuccess;
}

void cfx_exec_cuda_comm_abort(struct cfx_cuda_comm *state, int broken)
{
    (void)state;
    (void)broken;
}

void cfx_exec_cuda_comm_scan(struct cfx_cuda_comm *state)
{
    (void)state;
}

void cfx_exec_cuda_comm_fail(struct cfx_cuda_comm *state, cfxResult_t res, int blame,
                             const struct cfx_fingerprint *print, const char *text)
{
    (void)state;
    (void)res;
    (void)blame;
    (void)print;
    (void)text;
}

cfxResult_t cfx_exec_cuda_host_enqueue(cfxStream_t stream, const struct cfx_op *ops, int n_ops,
                                       void (*on_done)(struct cfx_op *ops, int n_ops,
                                                       cfxResult_t res))
{
    (void)stream;
    (void)ops;
    (void)n_ops;
    (void)on_done;
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL, "this Conflux was built without CUDA");
}

cfxResult_t cfx_exec_cuda_stream_capturing(cfxStream_t stream, int *capturing_p)
{
    (void)stream;
    *capturing_p = 0;
    return cfxSuccess;
}

#endif
