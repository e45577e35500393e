/*
 * fake-cuda stream capture and graphs. While a stream captures, its work
 * becomes nodes of the capture (kernel parameters copied then), each
 * depending on the stream's frontier; events recorded there carry the
 * frontier, and a stream that waits on such an event joins the capture
 * (fork/join across streams). cuStreamEndCapture hands the nodes over as a
 * graph; an instantiated graph replays them in creation order (a
 * topological order) on the launch stream, behind the previous launch of
 * the same executable graph. See fakecuda.h.
 *
 * The capture rules kept: "potentially unsafe" calls under a GLOBAL or
 * THREAD_LOCAL capture, legacy-stream work while a blocking stream
 * captures, waits on events recorded outside the capture, host queries of
 * captured events, pageable memory in captured copies (memory.c).
 */
#include "fakecuda.h"

#include <stdlib.h>
#include <string.h>

#define INSTANTIATE_FLAGS                                                                          \
    (CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |        \
     CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH | CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY)

/* ------------------------------------------------------------ frontiers */

void fc_frontier_free(struct fc_frontier *frontier)
{
    free(frontier->nodes);
    memset(frontier, 0, sizeof(*frontier));
}

static int frontier_add(struct fc_frontier *frontier, unsigned node)
{
    for (unsigned i = 0; i < frontier->n; i++)
        if (frontier->nodes[i] == node)
            return 0;
    if (fc_grow((void **)&frontier->nodes, &frontier->cap, frontier->n + 1,
                sizeof(*frontier->nodes)) != 0)
        return -1;
    frontier->nodes[frontier->n++] = node;
    return 0;
}

int fc_frontier_copy(struct fc_frontier *dst, const struct fc_frontier *src)
{
    dst->n = 0;
    for (unsigned i = 0; i < src->n; i++)
        if (frontier_add(dst, src->nodes[i]) != 0)
            return -1;
    return 0;
}

static int frontier_merge(struct fc_frontier *dst, const struct fc_frontier *src)
{
    for (unsigned i = 0; i < src->n; i++)
        if (frontier_add(dst, src->nodes[i]) != 0)
            return -1;
    return 0;
}

/* ------------------------------------------------------------ captures */

static void nodes_free(struct fc_node *nodes, unsigned n_nodes)
{
    for (unsigned i = 0; i < n_nodes; i++) {
        fc_work_release(&nodes[i].work);
        free(nodes[i].deps);
    }
    free(nodes);
}

void fc_capture_invalidate(struct fc_capture *capture)
{
    if (!capture->invalidated)
        fc_log("capture %llu invalidated", (unsigned long long)capture->id);
    capture->invalidated = 1;
}

struct fc_capture *fc_capture_find(uint64_t id)
{
    for (struct fc_capture *c = fc.captures; c != NULL; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

/* End @p capture: its streams stop capturing; it leaves fc.captures. The
 * nodes stay with the caller. */
static void capture_end(struct fc_capture *capture)
{
    for (unsigned i = 0; i < capture->n_members; i++) {
        capture->members[i]->capture = NULL;
        fc_frontier_free(&capture->members[i]->frontier);
    }
    for (struct fc_capture **it = &fc.captures; *it != NULL; it = &(*it)->next) {
        if (*it == capture) {
            *it = capture->next;
            break;
        }
    }
    free(capture->members);
}

void fc_capture_abandon_ctx(struct CUctx_st *ctx)
{
    struct fc_capture *capture = fc.captures;
    while (capture != NULL) {
        struct fc_capture *next = capture->next;
        int ours = 0;
        for (unsigned i = 0; i < capture->n_members; i++)
            ours |= capture->members[i]->ctx == ctx;
        if (ours) {
            capture_end(capture);
            nodes_free(capture->nodes, capture->n_nodes);
            free(capture);
        }
        capture = next;
    }
}

CUresult fc_capture_unsafe_call(void)
{
    pthread_t self = pthread_self();
    CUresult err = CUDA_SUCCESS;
    if (fc_tls_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return err;
    int others_count = fc_tls_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    for (struct fc_capture *c = fc.captures; c != NULL; c = c->next) {
        int mine = pthread_equal(c->thread, self);
        if ((mine && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!mine && others_count && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            fc_log("a potentially unsafe call during capture %llu", (unsigned long long)c->id);
            fc_capture_invalidate(c);
            err = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    return err;
}

CUresult fc_capture_legacy_use(struct CUctx_st *ctx, int query_only)
{
    CUresult err = CUDA_SUCCESS;
    for (struct fc_capture *c = fc.captures; c != NULL; c = c->next) {
        for (unsigned i = 0; i < c->n_members; i++) {
            const struct CUstream_st *member = c->members[i];
            if (member->ctx == ctx && member->blocking) {
                if (!query_only) {
                    fc_log("legacy-stream work while blocking stream %p captures",
                           (const void *)member);
                    fc_capture_invalidate(c);
                }
                err = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
                break;
            }
        }
    }
    return err;
}

/* A new node for @p work (taken over) after @p stream's frontier, which
 * becomes that node. */
static CUresult capture_append(struct CUstream_st *stream, struct fc_work *work)
{
    struct fc_capture *capture = stream->capture;
    if (fc_grow((void **)&capture->nodes, &capture->cap_nodes, capture->n_nodes + 1,
                sizeof(*capture->nodes)) != 0)
        goto err_oom;
    struct fc_node *node = &capture->nodes[capture->n_nodes];
    memset(node, 0, sizeof(*node));
    if (stream->frontier.n != 0) {
        node->deps = malloc(stream->frontier.n * sizeof(*node->deps));
        if (node->deps == NULL)
            goto err_oom;
        memcpy(node->deps, stream->frontier.nodes, stream->frontier.n * sizeof(*node->deps));
        node->n_deps = stream->frontier.n;
    }
    unsigned index = capture->n_nodes;
    stream->frontier.n = 0;
    if (frontier_add(&stream->frontier, index) != 0) {
        free(node->deps);
        goto err_oom;
    }
    node->work = *work;
    capture->n_nodes++;
    return CUDA_SUCCESS;

err_oom:
    fc_work_release(work);
    fc_capture_invalidate(capture);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult fc_capture_add(struct CUstream_st *stream, struct fc_work *work)
{
    if (stream->capture->invalidated) {
        fc_work_release(work);
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    return capture_append(stream, work);
}

CUresult fc_capture_record_event(struct CUstream_st *stream, struct CUevent_st *event)
{
    struct fc_capture *capture = stream->capture;
    if (capture->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (fc_frontier_copy(&event->cap_frontier, &stream->frontier) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fc_mark_unref(event->rec);
    event->rec = NULL;
    event->cap_id = capture->id;
    return CUDA_SUCCESS;
}

/* @p stream (not capturing) waits on an event of @p capture: it joins. */
static CUresult capture_join(struct fc_capture *capture, struct CUstream_st *stream,
                             const struct CUevent_st *event)
{
    if (stream->kind == FC_STREAM_LEGACY) {
        fc_capture_invalidate(capture);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (fc_grow((void **)&capture->members, &capture->cap_members, capture->n_members + 1,
                sizeof(*capture->members)) != 0 ||
        fc_frontier_copy(&stream->frontier, &event->cap_frontier) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    capture->members[capture->n_members++] = stream;
    stream->capture = capture;
    return CUDA_SUCCESS;
}

CUresult fc_capture_wait_event(struct CUstream_st *stream, struct CUevent_st *event, unsigned flags)
{
    struct fc_capture *capture = stream->capture;
    if (capture != NULL && capture->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (capture != NULL && (flags & CU_EVENT_WAIT_EXTERNAL)) {
        struct fc_work work = {.kind = FC_WORK_WAIT_EVENT, .wait = {event}};
        return capture_append(stream, &work);
    }
    if (event->cap_id != 0) {
        struct fc_capture *source = fc_capture_find(event->cap_id);
        if (source == NULL)
            return CUDA_ERROR_CAPTURED_EVENT; /* recorded in a capture that has ended */
        if (capture == NULL)
            return flags != 0 ? CUDA_ERROR_INVALID_VALUE : capture_join(source, stream, event);
        if (source != capture) {
            fc_capture_invalidate(capture);
            fc_capture_invalidate(source);
            return CUDA_ERROR_STREAM_CAPTURE_MERGE;
        }
        return frontier_merge(&stream->frontier, &event->cap_frontier) != 0
                   ? CUDA_ERROR_OUT_OF_MEMORY
                   : CUDA_SUCCESS;
    }
    if (event->rec == NULL)
        return CUDA_SUCCESS; /* never recorded: nothing to wait for */
    fc_log("capture %llu waits on an event recorded outside it", (unsigned long long)capture->id);
    fc_capture_invalidate(capture);
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
}

/* Every member's frontier is an ancestor (or part) of the origin's. */
static int capture_joined(const struct fc_capture *capture)
{
    unsigned n = capture->n_nodes;
    unsigned char *reached = calloc(n != 0 ? n : 1, 1);
    unsigned *stack = malloc((n != 0 ? n : 1) * sizeof(*stack));
    int joined = reached != NULL && stack != NULL;
    unsigned depth = 0;
    const struct fc_frontier *origin = &capture->origin->frontier;
    for (unsigned i = 0; joined && i < origin->n; i++) {
        if (!reached[origin->nodes[i]]) {
            reached[origin->nodes[i]] = 1;
            stack[depth++] = origin->nodes[i];
        }
    }
    while (joined && depth > 0) {
        const struct fc_node *node = &capture->nodes[stack[--depth]];
        for (unsigned d = 0; d < node->n_deps; d++) {
            if (!reached[node->deps[d]]) {
                reached[node->deps[d]] = 1;
                stack[depth++] = node->deps[d];
            }
        }
    }
    for (unsigned m = 0; joined && m < capture->n_members; m++) {
        const struct fc_frontier *f = &capture->members[m]->frontier;
        for (unsigned i = 0; i < f->n; i++)
            joined &= reached[f->nodes[i]];
    }
    free(stack);
    free(reached);
    return joined;
}

/* ------------------------------------------------------------ API: capture */

FC_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (mode == NULL || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL ||
        *mode > CU_STREAM_CAPTURE_MODE_RELAXED) {
        err = CUDA_ERROR_INVALID_VALUE;
    } else {
        CUstreamCaptureMode previous = fc_tls_capture_mode;
        fc_tls_capture_mode = *mode;
        *mode = previous;
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuStreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    struct CUstream_st *stream = NULL;
    err = fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS)
        err = fc_stream_resolve(hStream, ctx, &stream);
    if (err == CUDA_SUCCESS &&
        (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED))
        err = CUDA_ERROR_INVALID_VALUE;
    else if (err == CUDA_SUCCESS && stream->kind == FC_STREAM_LEGACY)
        err = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    else if (err == CUDA_SUCCESS && stream->capture != NULL)
        err = CUDA_ERROR_ILLEGAL_STATE;
    if (err == CUDA_SUCCESS) {
        struct fc_capture *capture = calloc(1, sizeof(*capture));
        if (capture == NULL || fc_grow((void **)&capture->members, &capture->cap_members, 1,
                                       sizeof(*capture->members)) != 0) {
            free(capture);
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            capture->id = fc.next_capture_id++;
            capture->origin = stream;
            capture->mode = mode;
            capture->thread = pthread_self();
            capture->members[capture->n_members++] = stream;
            capture->next = fc.captures;
            fc.captures = capture;
            stream->capture = capture;
            stream->frontier.n = 0;
            fc_log("capture %llu begins on stream %p (mode %d)", (unsigned long long)capture->id,
                   (void *)stream, (int)mode);
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    struct CUstream_st *stream = NULL;
    err = captureStatus == NULL ? CUDA_ERROR_INVALID_VALUE : fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS)
        err = fc_stream_resolve(hStream, ctx, &stream);
    if (err == CUDA_SUCCESS && stream->kind == FC_STREAM_LEGACY)
        err = fc_capture_legacy_use(ctx, 1);
    if (err == CUDA_SUCCESS) {
        if (stream->capture == NULL)
            *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
        else if (stream->capture->invalidated)
            *captureStatus = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
        else
            *captureStatus = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    struct CUstream_st *stream = NULL;
    struct fc_capture *capture = NULL;
    err = phGraph == NULL ? CUDA_ERROR_INVALID_VALUE : fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS)
        err = fc_stream_resolve(hStream, ctx, &stream);
    if (err == CUDA_SUCCESS && (capture = stream->capture) == NULL)
        err = CUDA_ERROR_ILLEGAL_STATE;
    else if (err == CUDA_SUCCESS && capture->origin != stream)
        err = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    else if (err == CUDA_SUCCESS && capture->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
             !pthread_equal(capture->thread, pthread_self()))
        err = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    if (err == CUDA_SUCCESS) {
        struct CUgraph_st *graph = NULL;
        if (capture->invalidated)
            err = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        else if (!capture_joined(capture))
            err = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
        else if ((graph = calloc(1, sizeof(*graph))) == NULL)
            err = CUDA_ERROR_OUT_OF_MEMORY;
        capture_end(capture);
        if (graph != NULL) {
            graph->nodes = capture->nodes;
            graph->n_nodes = capture->n_nodes;
            fc_handle_add(&graph->handle, FC_HANDLE_GRAPH);
        } else {
            nodes_free(capture->nodes, capture->n_nodes);
        }
        fc_log("capture %llu ends: %u node(s)%s", (unsigned long long)capture->id, capture->n_nodes,
               graph == NULL ? ", no graph" : "");
        free(capture);
        *phGraph = graph;
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* ------------------------------------------------------------ API: graphs */

FC_EXPORT CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      unsigned long long flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (phGraphExec == NULL || !fc_handle_live(hGraph, FC_HANDLE_GRAPH) ||
        (flags & ~(unsigned long long)INSTANTIATE_FLAGS) != 0)
        err = CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *exec = NULL;
    if (err == CUDA_SUCCESS && (exec = calloc(1, sizeof(*exec))) == NULL)
        err = CUDA_ERROR_OUT_OF_MEMORY;
    if (err == CUDA_SUCCESS && hGraph->n_nodes != 0 &&
        (exec->works = calloc(hGraph->n_nodes, sizeof(*exec->works))) == NULL)
        err = CUDA_ERROR_OUT_OF_MEMORY;
    for (unsigned i = 0; err == CUDA_SUCCESS && i < hGraph->n_nodes; i++) {
        if (fc_work_clone(&exec->works[i], &hGraph->nodes[i].work) != 0)
            err = CUDA_ERROR_OUT_OF_MEMORY;
        else
            exec->n_works++;
    }
    if (err == CUDA_SUCCESS) {
        fc_handle_add(&exec->handle, FC_HANDLE_GRAPH_EXEC);
        *phGraphExec = exec;
    } else if (exec != NULL) {
        for (unsigned i = 0; i < exec->n_works; i++)
            fc_work_release(&exec->works[i]);
        free(exec->works);
        free(exec);
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

/* The memory a replayed copy or set touches is still allocated. */
static CUresult exec_memory_check(const struct CUgraphExec_st *exec)
{
    for (unsigned i = 0; i < exec->n_works; i++) {
        const struct fc_work *w = &exec->works[i];
        CUresult err = CUDA_SUCCESS;
        if (w->kind == FC_WORK_COPY) {
            err = fc_mem_check((uintptr_t)w->copy.dst, w->copy.bytes, 1);
            if (err == CUDA_SUCCESS)
                err = fc_mem_check((uintptr_t)w->copy.src, w->copy.bytes, 1);
        } else if (w->kind == FC_WORK_SET) {
            err = fc_mem_check((uintptr_t)w->set.dst, w->set.bytes, 1);
        }
        if (err != CUDA_SUCCESS) {
            fc_log("graph launch: node %u touches memory that was freed", i);
            return err;
        }
    }
    return CUDA_SUCCESS;
}

/* Replay @p exec on @p stream (not capturing): a no-op behind the previous
 * launch, its works in order, a no-op whose mark ends this launch. */
static CUresult exec_submit(struct CUgraphExec_st *exec, struct CUstream_st *stream)
{
    struct fc_work nop = {.kind = FC_WORK_NOP};
    CUresult err = exec_memory_check(exec);
    if (err == CUDA_SUCCESS && exec->last != NULL)
        err = fc_stream_submit(stream, &nop, exec->last, NULL);
    for (unsigned i = 0; err == CUDA_SUCCESS && i < exec->n_works; i++) {
        const struct fc_work *node = &exec->works[i];
        struct fc_work work;
        if (node->kind == FC_WORK_WAIT_EVENT) {
            const struct CUevent_st *event = node->wait.event;
            if (fc_handle_live(event, FC_HANDLE_EVENT) && event->rec != NULL)
                err = fc_stream_submit(stream, &nop, event->rec, NULL);
        } else if (fc_work_clone(&work, node) != 0) {
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            err = fc_stream_submit(stream, &work, NULL, NULL);
        }
    }
    struct fc_mark *done = NULL;
    if (err == CUDA_SUCCESS)
        err = fc_stream_submit(stream, &nop, NULL, &done);
    if (err == CUDA_SUCCESS) {
        fc_mark_unref(exec->last);
        exec->last = done;
    }
    return err;
}

/* Replay @p exec into @p stream's capture (a child graph, inlined). */
static CUresult exec_capture(const struct CUgraphExec_st *exec, struct CUstream_st *stream)
{
    CUresult err =
        stream->capture->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
    for (unsigned i = 0; err == CUDA_SUCCESS && i < exec->n_works; i++) {
        struct fc_work work;
        if (fc_work_clone(&work, &exec->works[i]) != 0)
            err = CUDA_ERROR_OUT_OF_MEMORY;
        else
            err = fc_capture_add(stream, &work);
    }
    return err;
}

FC_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    struct CUstream_st *stream = NULL;
    err = fc_handle_live(hGraphExec, FC_HANDLE_GRAPH_EXEC) ? fc_ctx_current(&ctx)
                                                           : CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS)
        err = fc_stream_resolve(hStream, ctx, &stream);
    if (err == CUDA_SUCCESS && stream->kind == FC_STREAM_LEGACY)
        err = fc_capture_legacy_use(ctx, 0);
    if (err == CUDA_SUCCESS)
        err = stream->capture != NULL ? exec_capture(hGraphExec, stream)
                                      : exec_submit(hGraphExec, stream);
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuGraphDestroy(CUgraph hGraph)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (!fc_handle_live(hGraph, FC_HANDLE_GRAPH)) {
        err = CUDA_ERROR_INVALID_VALUE;
    } else {
        fc_handle_remove(&hGraph->handle);
        nodes_free(hGraph->nodes, hGraph->n_nodes);
        free(hGraph);
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (!fc_handle_live(hGraphExec, FC_HANDLE_GRAPH_EXEC)) {
        err = CUDA_ERROR_INVALID_VALUE;
    } else {
        fc_handle_remove(&hGraphExec->handle);
        for (unsigned i = 0; i < hGraphExec->n_works; i++)
            fc_work_release(&hGraphExec->works[i]);
        free(hGraphExec->works);
        fc_mark_unref(hGraphExec->last);
        free(hGraphExec);
    }
    fc_unlock();
    return fc_ret(__func__, err);
}
