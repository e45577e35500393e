/*
 * fake-cuda events. A record enqueues a no-op on the stream whose
 * completion is the event's mark (so it also waits for what the legacy
 * rules make that stream wait for); recording again replaces the mark. An
 * event recorded in a capturing stream holds that capture's frontier
 * instead (graph.c) and cannot be queried or waited for from the host.
 */
#include "fakecuda.h"

#include <stdlib.h>

#define EVENT_FLAGS (CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS)

static void event_free(struct CUevent_st *event)
{
    fc_handle_remove(&event->handle);
    fc_mark_unref(event->rec);
    fc_frontier_free(&event->cap_frontier);
    free(event);
}

void fc_ctx_destroy_events(struct CUctx_st *ctx)
{
    struct fc_handle *it = fc.handles[FC_HANDLE_EVENT];
    while (it != NULL) {
        struct fc_handle *next = it->next;
        struct CUevent_st *event = (struct CUevent_st *)it;
        if (event->ctx == ctx)
            event_free(event);
        it = next;
    }
}

FC_EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    if (phEvent == NULL || (Flags & ~(unsigned)EVENT_FLAGS) != 0)
        err = CUDA_ERROR_INVALID_VALUE;
    else if ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING))
        err = CUDA_ERROR_INVALID_VALUE;
    else if (Flags & CU_EVENT_INTERPROCESS)
        err = CUDA_ERROR_NOT_SUPPORTED; /* no IPC in the fake */
    else
        err = fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS) {
        struct CUevent_st *event = calloc(1, sizeof(*event));
        if (event == NULL) {
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            event->ctx = ctx;
            event->flags = Flags;
            fc_handle_add(&event->handle, FC_HANDLE_EVENT);
            *phEvent = event;
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuEventDestroy(CUevent hEvent)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (!fc_handle_live(hEvent, FC_HANDLE_EVENT))
        err = CUDA_ERROR_INVALID_HANDLE;
    else
        event_free(hEvent);
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    struct CUstream_st *stream = NULL;
    if (!fc_handle_live(hEvent, FC_HANDLE_EVENT))
        err = CUDA_ERROR_INVALID_HANDLE;
    else if ((err = fc_ctx_current(&ctx)) == CUDA_SUCCESS)
        err = fc_stream_resolve(hStream, ctx, &stream);
    if (err == CUDA_SUCCESS && stream->ctx != hEvent->ctx)
        err = CUDA_ERROR_INVALID_HANDLE; /* "must be from the same context" */
    if (err == CUDA_SUCCESS && stream->kind == FC_STREAM_LEGACY)
        err = fc_capture_legacy_use(ctx, 0);
    if (err == CUDA_SUCCESS) {
        if (stream->capture != NULL) {
            err = fc_capture_record_event(stream, hEvent);
        } else {
            struct fc_work nop = {.kind = FC_WORK_NOP};
            struct fc_mark *mark = NULL;
            err = fc_stream_submit(stream, &nop, NULL, &mark);
            if (err == CUDA_SUCCESS) {
                fc_mark_unref(hEvent->rec);
                hEvent->rec = mark;
                hEvent->cap_id = 0;
                fc_frontier_free(&hEvent->cap_frontier);
            }
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuEventQuery(CUevent hEvent)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (!fc_handle_live(hEvent, FC_HANDLE_EVENT))
        err = CUDA_ERROR_INVALID_HANDLE;
    else if (hEvent->cap_id != 0)
        err = CUDA_ERROR_CAPTURED_EVENT;
    else if ((err = fc_capture_unsafe_call()) != CUDA_SUCCESS)
        ; /* Potentially unsafe while a capture forbids it (PyTorch's NCCL watchdog met this). */
    else if (hEvent->rec != NULL && !hEvent->rec->done)
        err = CUDA_ERROR_NOT_READY;
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuEventSynchronize(CUevent hEvent)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (!fc_handle_live(hEvent, FC_HANDLE_EVENT)) {
        err = CUDA_ERROR_INVALID_HANDLE;
    } else if (hEvent->cap_id != 0) {
        err = CUDA_ERROR_CAPTURED_EVENT;
    } else if ((err = fc_capture_unsafe_call()) != CUDA_SUCCESS) {
        /* Potentially unsafe while a capture forbids it. */
    } else if (hEvent->rec != NULL) {
        struct fc_mark *mark = hEvent->rec;
        fc_mark_ref(mark); /* the event may be recorded again or destroyed meanwhile */
        fc_mark_wait(mark);
        fc_mark_unref(mark);
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (pMilliseconds == NULL) {
        err = CUDA_ERROR_INVALID_VALUE;
    } else if (!fc_handle_live(hStart, FC_HANDLE_EVENT) || !fc_handle_live(hEnd, FC_HANDLE_EVENT)) {
        err = CUDA_ERROR_INVALID_HANDLE;
    } else if ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING) {
        err = CUDA_ERROR_INVALID_HANDLE;
    } else if (hStart->cap_id != 0 || hEnd->cap_id != 0) {
        err = CUDA_ERROR_CAPTURED_EVENT;
    } else if (hStart->rec == NULL || hEnd->rec == NULL) {
        err = CUDA_ERROR_INVALID_HANDLE; /* never recorded */
    } else if (!hStart->rec->done || !hEnd->rec->done) {
        err = CUDA_ERROR_NOT_READY;
    } else {
        double ns = (double)hEnd->rec->done_ns - (double)hStart->rec->done_ns;
        *pMilliseconds = (float)(ns / 1e6);
    }
    fc_unlock();
    return fc_ret(__func__, err);
}
