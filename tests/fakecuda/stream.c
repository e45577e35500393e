/*
 * fake-cuda streams: the work queue of each stream, its worker thread, the
 * legacy default stream's ordering, synchronisation, host functions. See
 * fakecuda.h.
 *
 * Ordering model. Every stream runs its ops in order on its own worker
 * thread (started at its first op). An op may wait for marks: points in
 * other streams' work (an event's record, another stream's tail). CUDA's
 * legacy rules become marks at enqueue time: an op on the legacy stream
 * waits for the tail of every blocking stream of its context, and an op on
 * a blocking stream waits for the legacy stream's tail. Non-blocking
 * streams get neither.
 */
#include "fakecuda.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IDLE_YIELD_NS 1000000 /* idle rounds before a kernel starts to nap */
#define IDLE_NAP_NS   50000

/* ------------------------------------------------------------ marks */

struct fc_mark *fc_mark_new(void)
{
    struct fc_mark *mark = calloc(1, sizeof(*mark));
    if (mark != NULL)
        mark->refs = 1;
    return mark;
}

void fc_mark_ref(struct fc_mark *mark)
{
    mark->refs++;
}

void fc_mark_unref(struct fc_mark *mark)
{
    if (mark != NULL && --mark->refs == 0)
        free(mark);
}

void fc_mark_signal(struct fc_mark *mark)
{
    mark->done = 1;
    mark->done_ns = fc_now_ns();
}

void fc_mark_wait(const struct fc_mark *mark)
{
    while (!mark->done)
        pthread_cond_wait(&fc.progress, &fc.lock);
}

/* ------------------------------------------------------------ work */

void fc_work_release(struct fc_work *work)
{
    if (work->kind == FC_WORK_KERNEL) {
        free(work->kernel.params);
        work->kernel.params = NULL;
    } else if (work->kind == FC_WORK_COPY) {
        free(work->copy.staging);
        work->copy.staging = NULL;
    }
}

int fc_work_clone(struct fc_work *dst, const struct fc_work *src)
{
    *dst = *src;
    if (src->kind == FC_WORK_COPY && src->copy.staging != NULL) {
        if ((dst->copy.staging = malloc(src->copy.bytes)) == NULL)
            return -1;
        memcpy(dst->copy.staging, src->copy.staging, src->copy.bytes);
        dst->copy.src = dst->copy.staging;
        return 0;
    }
    if (src->kind != FC_WORK_KERNEL)
        return 0;
    size_t bytes = src->kernel.kernel->param_bytes;
    dst->kernel.params = malloc(bytes != 0 ? bytes : 1);
    if (dst->kernel.params == NULL)
        return -1;
    memcpy(dst->kernel.params, src->kernel.params, bytes);
    return 0;
}

/* Byte distance between two blocks' states (each FC_STATE_ALIGN-aligned). */
static size_t state_stride(const struct fakecuda_kernel *kernel)
{
    return (kernel->state_bytes + FC_STATE_ALIGN - 1) & ~(size_t)(FC_STATE_ALIGN - 1);
}

/* Zeroed states for @p n_blocks blocks, or NULL. */
static void *states_new(size_t stride, unsigned n_blocks)
{
    if (n_blocks > SIZE_MAX / stride)
        return NULL;
    void *states = aligned_alloc(FC_STATE_ALIGN, stride * n_blocks);
    if (states != NULL)
        memset(states, 0, stride * n_blocks);
    return states;
}

/* One idle round of a waiter (a kernel's blocks, a stream waiting on
 * memory): yield for IDLE_YIELD_NS from the first idle round (*idle_since,
 * 0: none yet), then nap, so many waiters on few cores all progress. */
static void idle_backoff(uint64_t *idle_since)
{
    uint64_t now = fc_now_ns();
    if (*idle_since == 0)
        *idle_since = now;
    if (now - *idle_since < IDLE_YIELD_NS) {
        sched_yield();
    } else {
        struct timespec nap = {.tv_sec = 0, .tv_nsec = IDLE_NAP_NS};
        nanosleep(&nap, NULL);
    }
}

/* One block on a thread of its own, as a GPU runs a launch's blocks at
 * once: passes until it finishes; idle passes yield, then nap. */
struct block_run {
    const struct fc_work *work;
    void *state;
    unsigned block;
    unsigned *finished; /* Blocks of the launch finished (FAKECUDA_RESIDENT_BLOCKS). */
};

/* Whether block @p b of a launch may run, @p finished of its blocks being
 * done: all may, or the first FAKECUDA_RESIDENT_BLOCKS not yet finished. */
static int admitted(unsigned b, unsigned finished)
{
    long room = fc.knobs.resident_blocks;
    return room <= 0 || (long)b < (long)finished + room;
}

static void *block_main(void *arg)
{
    struct block_run *run = arg;
    const struct fakecuda_kernel *kernel = run->work->kernel.kernel;
    fc_tls_worker = 1;
    uint64_t idle_since = 0;
    while (!admitted(run->block, __atomic_load_n(run->finished, __ATOMIC_ACQUIRE)))
        idle_backoff(&idle_since); /* No room yet: earlier blocks hold the "GPU". */
    idle_since = 0;
    for (;;) {
        int result = kernel->pass(run->state, run->work->kernel.params, run->block,
                                  run->work->kernel.n_blocks, run->work->kernel.threads);
        if (result == 0) {
            __atomic_fetch_add(run->finished, 1, __ATOMIC_ACQ_REL);
            return NULL;
        }
        if (result == 1) {
            idle_since = 0;
            continue;
        }
        idle_backoff(&idle_since);
    }
}

/* The blocks of a launch at once, a thread each (FAKECUDA_CONCURRENT_BLOCKS,
 * the default); 0 when threads could not be made (then run_kernel goes
 * round-robin). */
static int run_kernel_concurrently(const struct fc_work *work, void *block_states, size_t stride)
{
    unsigned n_blocks = work->kernel.n_blocks;
    struct block_run *runs = calloc(n_blocks, sizeof(*runs));
    pthread_t *threads = calloc(n_blocks, sizeof(*threads));
    if (runs == NULL || threads == NULL) {
        free(runs);
        free(threads);
        return 0;
    }
    unsigned started = 0, finished = 0;
    for (unsigned b = 0; b < n_blocks; b++)
        runs[b] = (struct block_run){
            work, stride != 0 ? (char *)block_states + (size_t)b * stride : NULL, b, &finished};
    for (; started < n_blocks; started++) {
        if (pthread_create(&threads[started], NULL, block_main, &runs[started]) != 0)
            break;
    }
    /* Blocks that got no thread run here (they may wait on the others). */
    for (unsigned b = started; b < n_blocks; b++)
        block_main(&runs[b]);
    for (unsigned b = 0; b < started; b++)
        pthread_join(threads[b], NULL);
    free(runs);
    free(threads);
    return 1;
}

/* Every block in turn until all are finished; idle rounds yield, then nap,
 * so that many launches on few cores all progress. */
static void run_kernel(const struct fc_work *work, void *block_states)
{
    const struct fakecuda_kernel *kernel = work->kernel.kernel;
    unsigned n_blocks = work->kernel.n_blocks;
    size_t stride = state_stride(kernel);
    if (n_blocks > 1 && fc.knobs.concurrent_blocks &&
        run_kernel_concurrently(work, block_states, stride))
        return;
    unsigned char *finished = calloc(n_blocks, 1);
    if (finished == NULL) {
        fprintf(stderr, "fakecuda: out of memory running kernel %s\n", kernel->name);
        abort();
    }
    unsigned remaining = n_blocks;
    uint64_t idle_since = 0;
    while (remaining > 0) {
        int progressed = 0;
        for (unsigned b = 0; b < n_blocks; b++) {
            if (finished[b] || !admitted(b, n_blocks - remaining))
                continue;
            void *state = stride != 0 ? (char *)block_states + (size_t)b * stride : NULL;
            int result =
                kernel->pass(state, work->kernel.params, b, n_blocks, work->kernel.threads);
            if (result == 0) {
                finished[b] = 1;
                remaining--;
                progressed = 1;
            } else if (result == 1) {
                progressed = 1;
            }
        }
        if (progressed || remaining == 0) {
            idle_since = 0;
            continue;
        }
        idle_backoff(&idle_since);
    }
    free(finished);
}

/* CUDA may run every stream's host functions on one thread, one after the
 * other ("may be serialized"): so does the fake, always, so that a host
 * function that waits for another stream's host function hangs here too. */
static pthread_mutex_t host_fn_lock = PTHREAD_MUTEX_INITIALIZER;

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
                          .tv_nsec = (long)(ns % 1000000000u)};
    if (ns > 0)
        nanosleep(&ts, NULL);
}

/* Whether cuStreamWaitValue32's condition holds for @p w. */
static int wait_value_met(const struct fc_work *w)
{
    uint32_t now = __atomic_load_n(w->wait_value.addr, __ATOMIC_ACQUIRE);
    uint32_t value = w->wait_value.value;
    switch (w->wait_value.flags & 3u) {
    case CU_STREAM_WAIT_VALUE_GEQ: return (int32_t)(now - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return now == value;
    case CU_STREAM_WAIT_VALUE_AND: return (now & value) != 0;
    default: return ~(now | value) != 0; /* NOR */
    }
}

/* The stream's thread waits for the word like a kernel for memory: yield,
 * then nap. */
static void wait_value(const struct fc_work *work)
{
    uint64_t idle_since = 0;
    while (!wait_value_met(work))
        idle_backoff(&idle_since);
}

void fc_work_run(const struct fc_work *work, void *block_states)
{
    switch (work->kind) {
    case FC_WORK_NOP: break;
    case FC_WORK_WAIT_EVENT: break;
    case FC_WORK_KERNEL: run_kernel(work, block_states); break;
    case FC_WORK_HOST_FN:
        if (fc.knobs.host_fn_serial)
            pthread_mutex_lock(&host_fn_lock);
        work->host.fn(work->host.user_data);
        if (fc.knobs.host_fn_serial)
            pthread_mutex_unlock(&host_fn_lock);
        break;
    case FC_WORK_COPY:
        sleep_ns(work->copy.delay_ns);
        memcpy(work->copy.dst, work->copy.src, work->copy.bytes);
        break;
    case FC_WORK_SET:
        sleep_ns(work->set.delay_ns);
        memset(work->set.dst, work->set.value, work->set.bytes);
        break;
    case FC_WORK_WAIT_VALUE: wait_value(work); break;
    }
}

/* ------------------------------------------------------------ ops */

static int op_add_dep(struct fc_op *op, struct fc_mark *mark)
{
    if (fc_grow((void **)&op->deps, &op->cap_deps, op->n_deps + 1, sizeof(*op->deps)) != 0)
        return -1;
    op->deps[op->n_deps++] = mark;
    return 0;
}

/* Drop the marks that are done; 1 when none is left to wait for. */
static int op_ready(struct fc_op *op)
{
    unsigned kept = 0;
    for (unsigned i = 0; i < op->n_deps; i++) {
        if (op->deps[i]->done)
            fc_mark_unref(op->deps[i]);
        else
            op->deps[kept++] = op->deps[i];
    }
    op->n_deps = kept;
    return kept == 0;
}

static void op_free(struct fc_op *op)
{
    for (unsigned i = 0; i < op->n_deps; i++)
        fc_mark_unref(op->deps[i]);
    free(op->deps);
    fc_mark_unref(op->done);
    fc_work_release(&op->work);
    free(op->block_states);
    free(op);
}

/* ------------------------------------------------------------ streams */

static void stream_unlink(struct CUstream_st *stream)
{
    for (struct CUstream_st **it = &stream->ctx->streams; *it != NULL; it = &(*it)->ctx_next) {
        if (*it == stream) {
            *it = stream->ctx_next;
            return;
        }
    }
}

static void stream_free(struct CUstream_st *stream)
{
    pthread_cond_destroy(&stream->work_cond);
    fc_frontier_free(&stream->frontier);
    free(stream);
}

static void *worker_main(void *arg)
{
    struct CUstream_st *stream = arg;
    fc_tls_worker = 1;
    pthread_mutex_lock(&fc.lock);
    for (;;) {
        while (stream->head == NULL && !stream->destroyed)
            pthread_cond_wait(&stream->work_cond, &fc.lock);
        struct fc_op *op = stream->head;
        if (op == NULL)
            break;
        while (!op_ready(op))
            pthread_cond_wait(&fc.progress, &fc.lock);
        pthread_mutex_unlock(&fc.lock);
        fc_work_run(&op->work, op->block_states);
        pthread_mutex_lock(&fc.lock);
        stream->head = op->next;
        if (stream->head == NULL)
            stream->tail = NULL;
        if (op->done != NULL)
            fc_mark_signal(op->done);
        op_free(op);
        pthread_cond_broadcast(&fc.progress);
    }
    stream_unlink(stream);
    stream_free(stream);
    pthread_mutex_unlock(&fc.lock);
    return NULL;
}

static int stream_start_worker(struct CUstream_st *stream)
{
    if (stream->has_worker)
        return 0;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    int rc = pthread_create(&thread, &attr, worker_main, stream);
    pthread_attr_destroy(&attr);
    if (rc != 0)
        return -1;
    stream->has_worker = 1;
    return 0;
}

static struct CUstream_st *stream_new(struct CUctx_st *ctx, enum fc_stream_kind kind, int blocking)
{
    struct CUstream_st *stream = calloc(1, sizeof(*stream));
    if (stream == NULL)
        return NULL;
    stream->ctx = ctx;
    stream->kind = kind;
    stream->blocking = blocking;
    pthread_cond_init(&stream->work_cond, NULL);
    stream->ctx_next = ctx->streams;
    ctx->streams = stream;
    return stream;
}

/* Pending work still runs; the worker frees the stream once drained. */
static void stream_destroy(struct CUstream_st *stream)
{
    if (stream->kind == FC_STREAM_USER)
        fc_handle_remove(&stream->handle);
    stream->destroyed = 1;
    if (stream->has_worker) {
        pthread_cond_signal(&stream->work_cond);
    } else {
        stream_unlink(stream);
        stream_free(stream);
    }
}

struct fc_mark *fc_stream_tail_mark(struct CUstream_st *stream)
{
    struct fc_op *tail = stream->tail;
    if (tail == NULL)
        return NULL;
    if (tail->done == NULL && (tail->done = fc_mark_new()) == NULL)
        return NULL; /* out of memory: the ordering is lost, not the call */
    fc_mark_ref(tail->done);
    return tail->done;
}

/* The legacy-stream dependencies of new work on @p stream. */
static int add_legacy_deps(struct fc_op *op, struct CUstream_st *stream)
{
    struct CUctx_st *ctx = stream->ctx;
    if (stream->kind == FC_STREAM_LEGACY) {
        for (struct CUstream_st *other = ctx->streams; other != NULL; other = other->ctx_next) {
            if (other == stream || !other->blocking)
                continue;
            struct fc_mark *mark = fc_stream_tail_mark(other);
            if (mark != NULL && op_add_dep(op, mark) != 0) {
                fc_mark_unref(mark);
                return -1;
            }
        }
    } else if (stream->blocking && ctx->legacy != NULL) {
        struct fc_mark *mark = fc_stream_tail_mark(ctx->legacy);
        if (mark != NULL && op_add_dep(op, mark) != 0) {
            fc_mark_unref(mark);
            return -1;
        }
    }
    return 0;
}

CUresult fc_stream_submit(struct CUstream_st *stream, struct fc_work *work,
                          struct fc_mark *extra_dep, struct fc_mark **done_p)
{
    struct fc_op *op = calloc(1, sizeof(*op));
    if (op == NULL) {
        fc_work_release(work);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->work = *work;
    if (work->kind == FC_WORK_KERNEL) {
        size_t stride = state_stride(work->kernel.kernel);
        if (stride != 0 && (op->block_states = states_new(stride, work->kernel.n_blocks)) == NULL)
            goto err_free;
    }
    if (add_legacy_deps(op, stream) != 0)
        goto err_free;
    if (extra_dep != NULL) {
        if (op_add_dep(op, extra_dep) != 0)
            goto err_free;
        fc_mark_ref(extra_dep);
    }
    if (done_p != NULL && (op->done = fc_mark_new()) == NULL)
        goto err_free;
    if (stream_start_worker(stream) != 0)
        goto err_free;
    if (stream->tail != NULL)
        stream->tail->next = op;
    else
        stream->head = op;
    stream->tail = op;
    pthread_cond_signal(&stream->work_cond);
    if (done_p != NULL) {
        fc_mark_ref(op->done);
        *done_p = op->done;
    }
    return CUDA_SUCCESS;

err_free:
    op_free(op);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* The calling thread's CU_STREAM_PER_THREAD stream of each context,
 * destroyed (its work still runs) when the thread exits. */
struct per_thread_streams {
    struct CUstream_st *stream[FC_MAX_DEVICES];
    uint64_t generation[FC_MAX_DEVICES]; /* of the context it was made in */
};

static pthread_key_t per_thread_key;
static pthread_once_t per_thread_once = PTHREAD_ONCE_INIT;

static void per_thread_exit(void *arg)
{
    struct per_thread_streams *streams = arg;
    if (!atomic_load(&fc.forked)) {
        pthread_mutex_lock(&fc.lock);
        for (int i = 0; i < FC_MAX_DEVICES; i++) {
            struct CUstream_st *stream = streams->stream[i];
            if (stream != NULL && fc.ctxs[i].active &&
                fc.ctxs[i].generation == streams->generation[i])
                stream_destroy(stream);
        }
        pthread_mutex_unlock(&fc.lock);
    }
    free(streams);
}

static void per_thread_key_create(void)
{
    pthread_key_create(&per_thread_key, per_thread_exit);
}

static CUresult per_thread_stream(struct CUctx_st *ctx, struct CUstream_st **stream_p)
{
    pthread_once(&per_thread_once, per_thread_key_create);
    struct per_thread_streams *streams = pthread_getspecific(per_thread_key);
    if (streams == NULL) {
        if ((streams = calloc(1, sizeof(*streams))) == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        pthread_setspecific(per_thread_key, streams);
    }
    int dev = ctx->device;
    if (streams->stream[dev] == NULL || streams->generation[dev] != ctx->generation) {
        struct CUstream_st *stream = stream_new(ctx, FC_STREAM_PER_THREAD, 1);
        if (stream == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        streams->stream[dev] = stream;
        streams->generation[dev] = ctx->generation;
    }
    *stream_p = streams->stream[dev];
    return CUDA_SUCCESS;
}

CUresult fc_stream_resolve(CUstream handle, struct CUctx_st *ctx, struct CUstream_st **stream_p)
{
    if (handle == NULL || handle == CU_STREAM_LEGACY) {
        *stream_p = ctx->legacy;
        return CUDA_SUCCESS;
    }
    if (handle == CU_STREAM_PER_THREAD)
        return per_thread_stream(ctx, stream_p);
    if (!fc_handle_live(handle, FC_HANDLE_STREAM))
        return CUDA_ERROR_INVALID_HANDLE;
    *stream_p = handle;
    return CUDA_SUCCESS;
}

CUresult fc_stream_do(struct CUstream_st *stream, struct fc_work *work)
{
    if (stream->kind == FC_STREAM_LEGACY) {
        CUresult err = fc_capture_legacy_use(stream->ctx, 0);
        if (err != CUDA_SUCCESS) {
            fc_work_release(work);
            return err;
        }
    }
    if (stream->capture != NULL)
        return fc_capture_add(stream, work);
    return fc_stream_submit(stream, work, NULL, NULL);
}

CUresult fc_legacy_run(struct CUctx_st *ctx, struct fc_work *work)
{
    CUresult err = fc_capture_legacy_use(ctx, 0);
    if (err != CUDA_SUCCESS) {
        fc_work_release(work);
        return err;
    }
    struct fc_mark *done = NULL;
    err = fc_stream_submit(ctx->legacy, work, NULL, &done);
    if (err != CUDA_SUCCESS)
        return err;
    fc_mark_wait(done);
    fc_mark_unref(done);
    return CUDA_SUCCESS;
}

CUresult fc_legacy_enqueue(struct CUctx_st *ctx, struct fc_work *work)
{
    CUresult err = fc_capture_legacy_use(ctx, 0);
    if (err != CUDA_SUCCESS) {
        fc_work_release(work);
        return err;
    }
    return fc_stream_submit(ctx->legacy, work, NULL, NULL);
}

void fc_ctx_drain(struct CUctx_st *ctx)
{
    for (;;) {
        struct fc_mark *pending = NULL;
        for (struct CUstream_st *s = ctx->streams; s != NULL && pending == NULL; s = s->ctx_next)
            pending = fc_stream_tail_mark(s);
        if (pending == NULL)
            return;
        fc_mark_wait(pending);
        fc_mark_unref(pending);
    }
}

void fc_ctx_destroy_streams(struct CUctx_st *ctx)
{
    struct CUstream_st *stream = ctx->streams;
    while (stream != NULL) {
        struct CUstream_st *next = stream->ctx_next;
        if (!stream->destroyed)
            stream_destroy(stream);
        stream = next;
    }
}

/* Everything before this point on @p stream is done (the legacy stream:
 * as if a no-op was enqueued there now, so earlier blocking-stream work
 * too). fc.lock held; it is dropped while waiting. */
static CUresult stream_sync(struct CUstream_st *stream)
{
    struct fc_mark *mark = NULL;
    if (stream->kind == FC_STREAM_LEGACY) {
        struct fc_work nop = {.kind = FC_WORK_NOP};
        CUresult err = fc_stream_submit(stream, &nop, NULL, &mark);
        if (err != CUDA_SUCCESS)
            return err;
    } else {
        mark = fc_stream_tail_mark(stream);
    }
    if (mark != NULL) {
        fc_mark_wait(mark);
        fc_mark_unref(mark);
    }
    return CUDA_SUCCESS;
}

static int stream_idle(const struct CUstream_st *stream)
{
    if (stream->head != NULL)
        return 0;
    if (stream->kind != FC_STREAM_LEGACY)
        return 1;
    for (const struct CUstream_st *s = stream->ctx->streams; s != NULL; s = s->ctx_next)
        if (s->blocking && s->head != NULL)
            return 0;
    return 1;
}

/* ------------------------------------------------------------ API */

FC_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    if (phStream == NULL || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING) != 0) {
        err = CUDA_ERROR_INVALID_VALUE;
    } else if ((err = fc_ctx_current(&ctx)) == CUDA_SUCCESS) {
        struct CUstream_st *stream =
            stream_new(ctx, FC_STREAM_USER, !(Flags & CU_STREAM_NON_BLOCKING));
        if (stream == NULL) {
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            fc_handle_add(&stream->handle, FC_HANDLE_STREAM);
            *phStream = stream;
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuStreamDestroy(CUstream hStream)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (!fc_handle_live(hStream, FC_HANDLE_STREAM))
        err = CUDA_ERROR_INVALID_HANDLE;
    else if (hStream->capture != NULL)
        err = CUDA_ERROR_ILLEGAL_STATE; /* end the capture first */
    else
        stream_destroy(hStream);
    fc_unlock();
    return fc_ret(__func__, err);
}

/* The stream @p handle names, in the current context. */
static CUresult stream_of_call(CUstream handle, struct CUstream_st **stream_p)
{
    struct CUctx_st *ctx = NULL;
    CUresult err = fc_ctx_current(&ctx);
    if (err != CUDA_SUCCESS)
        return err;
    return fc_stream_resolve(handle, ctx, stream_p);
}

FC_EXPORT CUresult cuStreamSynchronize(CUstream hStream)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUstream_st *stream = NULL;
    err = stream_of_call(hStream, &stream);
    if (err == CUDA_SUCCESS && stream->kind == FC_STREAM_LEGACY)
        err = fc_capture_legacy_use(stream->ctx, 0);
    if (err == CUDA_SUCCESS && stream->capture != NULL) {
        fc_capture_invalidate(stream->capture);
        err = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (err == CUDA_SUCCESS)
        err = stream_sync(stream);
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuStreamQuery(CUstream hStream)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUstream_st *stream = NULL;
    err = stream_of_call(hStream, &stream);
    if (err == CUDA_SUCCESS && stream->kind == FC_STREAM_LEGACY)
        err = fc_capture_legacy_use(stream->ctx, 0);
    if (err == CUDA_SUCCESS && stream->capture != NULL) {
        fc_capture_invalidate(stream->capture);
        err = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (err == CUDA_SUCCESS && !stream_idle(stream))
        err = CUDA_ERROR_NOT_READY;
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUstream_st *stream = NULL;
    err = stream_of_call(hStream, &stream);
    if (err == CUDA_SUCCESS && !fc_handle_live(hEvent, FC_HANDLE_EVENT))
        err = CUDA_ERROR_INVALID_HANDLE;
    if (err == CUDA_SUCCESS && (Flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL) != 0)
        err = CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS && stream->kind == FC_STREAM_LEGACY)
        err = fc_capture_legacy_use(stream->ctx, 0);
    if (err == CUDA_SUCCESS) {
        if (stream->capture != NULL || hEvent->cap_id != 0) {
            err = fc_capture_wait_event(stream, hEvent, Flags);
        } else if (Flags != 0) {
            err = CUDA_ERROR_INVALID_VALUE; /* EXTERNAL is for capture only */
        } else if (hEvent->rec != NULL) {
            struct fc_work nop = {.kind = FC_WORK_NOP};
            err = fc_stream_submit(stream, &nop, hEvent->rec, NULL);
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                       unsigned int flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUstream_st *s = NULL;
    err = stream_of_call(stream, &s);
    /* Memory the GPU reaches (device, pinned or registered), aligned, known flags. */
    if (err == CUDA_SUCCESS &&
        (addr % 4 != 0 || (flags & ~(3u | (unsigned)CU_STREAM_WAIT_VALUE_FLUSH)) != 0 ||
         fc_alloc_find((uintptr_t)addr) == NULL))
        err = CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS)
        err = fc_mem_check((uintptr_t)addr, 4, 1);
    if (err == CUDA_SUCCESS) {
        struct fc_work work = {.kind = FC_WORK_WAIT_VALUE,
                               .wait_value = {(const uint32_t *)(uintptr_t)addr, value, flags}};
        err = fc_stream_do(s, &work);
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUstream_st *stream = NULL;
    err = fn == NULL ? CUDA_ERROR_INVALID_VALUE : stream_of_call(hStream, &stream);
    if (err == CUDA_SUCCESS) {
        struct fc_work work = {.kind = FC_WORK_HOST_FN, .host = {fn, userData}};
        err = fc_stream_do(stream, &work);
    }
    fc_unlock();
    return fc_ret(__func__, err);
}
