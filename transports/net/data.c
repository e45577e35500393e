/*
 * The net-plugin transport's data path: a pass over a connector tests its
 * outstanding requests, then posts what may go: a sender's isends (each
 * posted slot's header, then its payload, empty when inline), a
 * receiver's irecvs (both of each free slot, ahead: the header into its
 * staging line, the payload straight into the slot; while an offer is
 * live, the payload's once its header says where it goes). At most
 * NET_MAX_REQUESTS per comm; a call that returns a NULL request is retried
 * on a later pass. Any plugin call that fails fails the connector once,
 * with a sentence naming both ranks, the plugin, the call and its result.
 * The protocol is in conn.h.
 *
 * Threads: a pass is made by whichever thread asks first
 * (cfx_net_conn_drive, lock-free as the ib transport's): the plugin's
 * isend, irecv and test on a comm are only ever called by the thread
 * holding `busy`.
 */
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "src/util/cuda.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/time.h"
#include "transports/net/conn.h"

#define CFX_NET_WARNING_FRESH_NS (1000 * 1000 * 1000ll)

static const char *dir_name(enum cfx_conn_dir dir)
{
    return dir == CFX_CONN_SEND ? "send" : "receive";
}

/* Fail the connector (driving thread): keep the first failure. */
__attribute__((format(printf, 4, 5))) static void
conn_fail(struct cfx_net_conn *nc, cfxResult_t res, int blame_rank, const char *fmt, ...)
{
    if (atomic_load_explicit(&nc->failed, memory_order_relaxed))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nc->error, sizeof(nc->error), fmt, ap);
    va_end(ap);
    nc->failed_res = res;
    nc->blame_rank = blame_rank;
    atomic_store_explicit(&nc->failed, 1, memory_order_release);
    CFX_INFO(CFX_LOG_NET, "%s", nc->error); /* The call that meets it reports it. */
}

/* A plugin call failed: the connection is gone. The plugin's warning of
 * the last second, if any, says why in its words (a net's own failure: a
 * port down, a queue pair in error). Who is to blame: the peer, except
 * when one of Conflux's own nets says the failure is local (anything but
 * ncclRemoteError: a port or queue pair of this rank's broke), which they
 * say precisely; an external plugin's codes are not trusted so far (some
 * answer ncclSystemError for a peer that died), so its failures blame the
 * peer as before. */
static void call_failed(struct cfx_net_conn *nc, const char *call, ncclResult_t res)
{
    char warning[256], said[280] = "";
    if (cfx_net_plugin_last_warning(warning, sizeof(warning), CFX_NET_WARNING_FRESH_NS))
        snprintf(said, sizeof(said), " (its last warning: %s)", warning);
    int local = nc->plugin->builtin && res != ncclRemoteError;
    conn_fail(nc,
              !local                     ? cfxRemoteError
              : res == ncclInvalidUsage  ? cfxInvalidUsage
              : res == ncclInternalError ? cfxInternalError
                                         : cfxSystemError,
              local ? nc->self_rank : nc->peer_rank,
              "net-plugin: rank %d's %s connection to rank %d failed%s: plugin %s's %s returned "
              "%s%s",
              nc->self_rank, dir_name(nc->dir), nc->peer_rank, local ? " at this end" : "",
              nc->plugin->name, call, cfx_net_result_name(res), said);
}

/* Test one request; 1 when it completed (*req cleared, *bytes_p set). */
static int request_test(struct cfx_net_conn *nc, void **req, int *bytes_p)
{
    if (*req == NULL)
        return 0;
    int done = 0, bytes = 0;
    ncclResult_t res = cfx_net_plugin_test(nc->plugin, *req, &done, &bytes);
    if (res != ncclSuccess) {
        call_failed(nc, "test", res);
        return 0;
    }
    if (!done)
        return 0;
    *req = NULL;
    nc->n_reqs--;
    if (bytes_p)
        *bytes_p = bytes;
    return 1;
}

/* ============================================================ sender */

/* Posts one isend of @p bytes at @p data (registered as @p mhandle) into
 * *req_p; 1 when it went, 0 when the plugin said "not now" or failed (the
 * connector failed then). */
static int post_send(struct cfx_net_conn *nc, void *data, size_t bytes, void *mhandle, void **req_p)
{
    void *req = NULL;
    ncclResult_t res = cfx_net_plugin_isend(nc->plugin, nc->comm, data, bytes, mhandle, &req);
    if (res != ncclSuccess) {
        call_failed(nc, "isend", res);
        return 0;
    }
    if (req == NULL)
        return 0;
    *req_p = req;
    nc->n_reqs++;
    return 1;
}

/* Poisoned: once no slot is half sent, send the poison as a slot of its
 * own (the poison header, then an empty payload); test both. */
static int send_poison(struct cfx_net_conn *nc)
{
    if (nc->poison_sent == 2) {
        request_test(nc, &nc->req_poison, NULL);
        request_test(nc, &nc->req_poison_empty, NULL);
        if (nc->req_poison_empty != NULL || nc->req_poison != NULL)
            return 0;
        atomic_store_explicit(&nc->poison_done, 1, memory_order_release);
        return 1;
    }
    if (nc->header_issued || nc->n_reqs >= NET_MAX_REQUESTS)
        return 0;
    struct cfx_net_header *h = &nc->staging[nc->n_steps]; /* The poison's own. */
    if (nc->poison_sent == 0) {
        memset(h, 0, sizeof(*h));
        h->info.size = NET_POISON_SIZE;
        h->info.seq = 0;
        h->info.print.count =
            (uint64_t)atomic_load_explicit(&nc->poison_reason, memory_order_acquire);
        h->info.print.root = atomic_load_explicit(&nc->poison_blame, memory_order_relaxed);
        if (!post_send(nc, h, sizeof(*h), nc->mhandle, &nc->req_poison))
            return 0;
        nc->poison_sent = 1;
        if (nc->n_reqs >= NET_MAX_REQUESTS)
            return 1;
    }
    if (!post_send(nc, h, 0, nc->mhandle, &nc->req_poison_empty))
        return 1;
    nc->poison_sent = 2;
    return 1;
}

static int send_pass(struct cfx_net_conn *nc)
{
    int moved = 0;
    /* Completions, in order up to the first slot not done (releases go in
     * order; a test can cost the plugin a system call). */
    uint64_t last = nc->issued + (nc->header_issued ? 1 : 0);
    for (uint64_t k = nc->released; k < last; k++) {
        struct cfx_net_slot *s = &nc->slot[k % (uint64_t)nc->n_steps];
        if (request_test(nc, &s->req_info, NULL))
            s->info_done = 1, moved = 1;
        if (!s->info_done)
            break;
        if (request_test(nc, &s->req_data, NULL))
            s->data_done = 1, moved = 1;
        if (atomic_load_explicit(&nc->failed, memory_order_relaxed))
            return moved;
        if (!s->data_done)
            break;
    }
    while (nc->released < nc->issued) {
        struct cfx_net_slot *s = &nc->slot[nc->released % (uint64_t)nc->n_steps];
        if (!s->info_done || !s->data_done)
            break;
        nc->released++;
        cfx_store_release_u64(&nc->fifo->head, nc->released);
        moved = 1;
    }
    /* Sends of posted slots, in order, within the request limit; once
     * poisoned, only the payload of a slot whose header went, then the
     * poison. */
    int poisoned = atomic_load_explicit(&nc->poison_reason, memory_order_acquire) != 0;
    uint64_t tail = !poisoned ? cfx_load_acquire_u64(&nc->fifo->tail)
                              : nc->issued + (nc->header_issued ? 1 : 0);
    while (nc->issued < tail && nc->n_reqs < NET_MAX_REQUESTS) {
        uint64_t k = nc->issued;
        size_t index = (size_t)(k % (uint64_t)nc->n_steps);
        struct cfx_net_slot *s = &nc->slot[index];
        const struct cfx_slot_info *info = &nc->fifo->info[index];
        uint32_t size = info->size;
        if (size > nc->slot_bytes) {
            conn_fail(nc, cfxInvalidUsage, nc->self_rank,
                      "net-plugin: rank %d posted %u bytes into a %zu-byte slot for rank %d",
                      nc->self_rank, size, nc->slot_bytes, nc->peer_rank);
            return moved;
        }
        /* The header first (the line, and the message and offset it is
         * of), so a receiver that offered that message's buffer can post
         * the payload's receive there; then the payload, empty when the
         * line carries the bytes. */
        if (!nc->header_issued) {
            struct cfx_net_header *h = &nc->staging[index];
            h->info = *info;
            h->mark = nc->at_mark[index];
            h->offset = nc->at_offset[index];
            void *req = NULL;
            if (!post_send(nc, h, sizeof(*h), nc->mhandle, &req))
                return moved; /* Not now (called again), or failed. */
            nc->at_mark[index] = 0;
            *s = (struct cfx_net_slot){.req_info = req};
            nc->header_issued = 1;
            moved = 1;
            if (nc->n_reqs >= NET_MAX_REQUESTS)
                return moved;
        }
        uint32_t payload = size > CFX_SLOT_INLINE_BYTES ? size : 0;
        /* From the user's registered buffer (post_ref), else the slot. */
        void *from = nc->slots + index * nc->slot_bytes, *mhandle = nc->slots_mhandle;
        if (nc->ref_data[index] != NULL) { /* Never inline: post_ref refuses those. */
            from = (void *)(uintptr_t)nc->ref_data[index];
            mhandle = nc->ref_mhandle[index];
        }
        if (!post_send(nc, from, payload, mhandle, &s->req_data))
            return moved;
        if (nc->ref_data[index] != NULL) {
            nc->ref_sent++;
            nc->ref_data[index] = NULL;
        }
        nc->header_issued = 0;
        nc->issued++;
        moved = 1;
    }
    if (poisoned)
        moved |= send_poison(nc);
    return moved;
}

/* ============================================================ receiver */

/* The bytes of a slot of message @p mark - 1 arrived (in place or not):
 * its offer, if any, is over once all its bytes did. */
static void offer_count(struct cfx_net_conn *nc, uint64_t mark, uint32_t size)
{
    if (mark == 0)
        return;
    struct cfx_net_offer *o = &nc->offers[(mark - 1) % NET_OFFERS];
    if (atomic_load_explicit(&o->mark, memory_order_acquire) != mark)
        return;
    o->left = size < o->left ? o->left - size : 0;
    if (o->left == 0) {
        atomic_store_explicit(&o->mark, 0, memory_order_release);
        atomic_fetch_sub_explicit(&nc->offers_live, 1, memory_order_release);
    }
}

/* Slot `arrived` has everything: copy its line into the FIFO and post it
 * (marked in place when its payload went into an offered buffer). */
static void slot_arrived(struct cfx_net_conn *nc)
{
    size_t index = (size_t)(nc->arrived % (uint64_t)nc->n_steps);
    const struct cfx_net_header *staged = &nc->staging[index];
    struct cfx_slot_info *info = &nc->fifo->info[index];
    info->size = staged->info.size | (nc->slot[index].in_place ? CFX_SLOT_IN_PLACE : 0);
    info->print = staged->info.print;
    memcpy(info->inline_data, staged->info.inline_data, sizeof(info->inline_data));
    offer_count(nc, staged->mark, staged->info.size);
    cfx_fifo_mark_posted(nc->fifo->info, nc->n_steps, nc->arrived);
    nc->arrived++;
    cfx_store_release_u64(&nc->fifo->tail, nc->arrived);
}

/* Flushing through the plugin (gdr_iflush): slot @p index's payload is
 * visible to the GPU once its iflush completed. 1 when it has; 0 while the
 * flush is in flight or cannot be posted yet (requests), or when it failed
 * (the connector failed). An iflush that returns no request had nothing to
 * do (NCCL's rule). */
static int plugin_flushed(struct cfx_net_conn *nc, struct cfx_net_slot *s, size_t index,
                          uint32_t size)
{
    if (s->flush_state == 2)
        return 1;
    if (s->flush_state == 0) {
        if (nc->n_reqs >= NET_MAX_REQUESTS)
            return 0;
        void *req = NULL;
        ncclResult_t res =
            cfx_net_plugin_iflush(nc->plugin, nc->comm, nc->slots + index * nc->slot_bytes, size,
                                  nc->slots_mhandle, &req);
        if (res != ncclSuccess) {
            call_failed(nc, "iflush", res);
            return 0;
        }
        nc->gdr_flushes++;
        if (req == NULL) {
            s->flush_state = 2;
            return 1;
        }
        s->req_flush = req;
        nc->n_reqs++;
        s->flush_state = 1;
    }
    if (!request_test(nc, &s->req_flush, NULL))
        return 0;
    s->flush_state = 2;
    return 1;
}

/* Slots complete in order go to the FIFO: after every pass, and after a
 * failure too (what arrived whole can still be taken, cfx_net_conn_check). */
static int post_arrived(struct cfx_net_conn *nc)
{
    int moved = 0;
    int flushed = 0;
    while (nc->arrived < nc->posted) {
        size_t index = (size_t)(nc->arrived % (uint64_t)nc->n_steps);
        struct cfx_net_slot *s = &nc->slot[index];
        if (!s->info_done)
            break;
        const struct cfx_slot_info *staged = &nc->staging[index].info;
        uint32_t size = staged->size;
        if (size == NET_POISON_SIZE && staged->seq == 0) {
            /* Nothing follows (its empty payload does not matter). */
            if (!atomic_load_explicit(&nc->peer_poison, memory_order_relaxed)) {
                nc->peer_poison_blame = staged->print.root;
                atomic_store_explicit(&nc->peer_poison, (int)staged->print.count,
                                      memory_order_release);
            }
            return moved;
        }
        if (size > nc->slot_bytes) {
            conn_fail(nc, cfxInvalidUsage, nc->peer_rank,
                      "net-plugin: rank %d sent %u bytes for a %zu-byte slot of rank %d",
                      nc->peer_rank, size, nc->slot_bytes, nc->self_rank);
            return moved;
        }
        if (!s->data_done)
            break;
        int payload = size > CFX_SLOT_INLINE_BYTES ? (int)size : 0;
        if (s->data_bytes != payload) {
            conn_fail(nc, cfxRemoteError, nc->peer_rank,
                      "net-plugin: rank %d's slot %llu says %u bytes but a %d-byte payload "
                      "arrived at rank %d: the stream from rank %d is corrupt",
                      nc->peer_rank, (unsigned long long)nc->arrived, size, s->data_bytes,
                      nc->self_rank, nc->peer_rank);
            return moved;
        }
        if (staged->seq != (uint32_t)(nc->arrived + 1)) {
            conn_fail(nc, cfxRemoteError, nc->peer_rank,
                      "net-plugin: rank %d sent slot %u to rank %d, which expected slot %llu: the "
                      "stream from rank %d is corrupt",
                      nc->peer_rank, staged->seq - 1, nc->self_rank,
                      (unsigned long long)nc->arrived, nc->peer_rank);
            return moved;
        }
        if (nc->gdr_iflush && size > CFX_SLOT_INLINE_BYTES) {
            if (!plugin_flushed(nc, s, index, size))
                return moved; /* In flight, or the connector failed. */
        } else if (nc->gdr && size > CFX_SLOT_INLINE_BYTES && !flushed) {
            /* The plugin wrote the payload into device memory: make its
             * writes visible to the kernel before the slot is posted (one
             * flush covers every payload in so far). */
            cfxResult_t res = cfx_cuda_flush_rdma_writes(nc->gdr - 1);
            if (res != cfxSuccess) {
                conn_fail(nc, res, nc->self_rank,
                          "net-plugin: rank %d cannot flush the plugin's writes from rank %d into "
                          "device %d's memory: %s",
                          nc->self_rank, nc->peer_rank, nc->gdr - 1, cfx_error_thread_last());
                return moved;
            }
            nc->gdr_flushes++;
            flushed = 1;
        }
        slot_arrived(nc);
        moved = 1;
    }
    return moved;
}

/* After the connector failed (for instance the peer closed its comm after
 * its last slot, and this side's receive for the next info line saw the
 * end): the requests of slots already posted may have completed in the
 * plugin before the failure showed in another request's test. Test them
 * once more (a plugin reports a completed request done) and post what
 * arrived whole, so it can still be taken. */
static int recv_after_failure(struct cfx_net_conn *nc)
{
    for (uint64_t k = nc->arrived; k < nc->posted; k++) {
        struct cfx_net_slot *s = &nc->slot[k % (uint64_t)nc->n_steps];
        int bytes = 0;
        if (request_test(nc, &s->req_info, &bytes) && bytes == (int)sizeof(struct cfx_net_header))
            s->info_done = 1;
        if (request_test(nc, &s->req_data, &bytes)) {
            s->data_done = 1;
            s->data_bytes = bytes;
        }
    }
    return post_arrived(nc);
}

/* Tests the receives of the slots begun, in order (the header, then the
 * payload), up to the first that is not in whole (slots are posted in
 * order; a test can cost the plugin a system call). 0 when the connector
 * failed. */
static int test_receives(struct cfx_net_conn *nc, int *moved_p)
{
    uint64_t last = nc->posted + (nc->header_posted ? 1 : 0);
    for (uint64_t k = nc->arrived; k < last; k++) {
        struct cfx_net_slot *s = &nc->slot[k % (uint64_t)nc->n_steps];
        int bytes = 0;
        if (request_test(nc, &s->req_info, &bytes)) { /* The first of the two to come. */
            s->info_done = 1, *moved_p = 1;
            if (bytes != (int)sizeof(struct cfx_net_header)) {
                conn_fail(nc, cfxRemoteError, nc->peer_rank,
                          "net-plugin: rank %d sent a %d-byte header for slot %llu to rank %d "
                          "(expected %zu): the stream from rank %d is corrupt",
                          nc->peer_rank, bytes, (unsigned long long)k, nc->self_rank,
                          sizeof(struct cfx_net_header), nc->peer_rank);
                return 0;
            }
        }
        if (atomic_load_explicit(&nc->failed, memory_order_relaxed))
            return 0;
        if (!s->info_done)
            break;
        if (request_test(nc, &s->req_data, &bytes)) {
            s->data_done = 1, *moved_p = 1;
            s->data_bytes = bytes;
        }
        if (!s->data_done)
            break;
    }
    return 1;
}

/* Posts one irecv of at most @p bytes into @p data (registered as
 * @p mhandle) into *req_p; 1 when it went, 0 when the plugin said "not
 * now" or failed (the connector failed then). */
static int post_recv(struct cfx_net_conn *nc, void *data, size_t bytes, void *mhandle, void **req_p)
{
    void *req = NULL;
    ncclResult_t res = cfx_net_plugin_irecv(nc->plugin, nc->comm, data, bytes, mhandle, &req);
    if (res != ncclSuccess) {
        call_failed(nc, "irecv", res);
        return 0;
    }
    if (req == NULL)
        return 0;
    *req_p = req;
    nc->n_reqs++;
    return 1;
}

/* Where slot @p index's payload goes: into the slot, or, when its header
 * came and names an offered message whose buffer holds it, there (*mh_p
 * its registration with this comm; the slot's in_place set). */
static char *payload_dest(struct cfx_net_conn *nc, size_t index, void **mh_p)
{
    struct cfx_net_slot *s = &nc->slot[index];
    const struct cfx_net_header *h = &nc->staging[index];
    *mh_p = nc->slots_mhandle;
    s->in_place = 0;
    if (s->info_done && h->mark != 0 && h->info.size > CFX_SLOT_INLINE_BYTES &&
        h->info.size <= nc->slot_bytes && h->info.seq != 0) {
        struct cfx_net_offer *o = &nc->offers[(h->mark - 1) % NET_OFFERS];
        if (atomic_load_explicit(&o->mark, memory_order_acquire) == h->mark &&
            h->offset <= o->bytes && h->info.size <= o->bytes - h->offset) {
            *mh_p = o->mhandle;
            s->in_place = 1;
            return o->data + h->offset;
        }
    }
    return nc->slots + index * nc->slot_bytes;
}

/* Whether the payload receive of slot `posted` waits for its header,
 * which may send it into an offered user buffer (a posted receive cannot
 * be taken back, so one posted ahead into the slot would miss an offer
 * made after it): while an offer is live; and, once the process has
 * registered buffers this connection receives into, unless the slot
 * before it is in flight, its header in, full and of no point-to-point
 * message (a large collective's stream goes on into the slots; after a
 * point-to-point slot, a small one, or when idle, the next slot may be an
 * offered receive's). Else payload receives are posted ahead, into the
 * slots. */
static int header_first(const struct cfx_net_conn *nc)
{
    if (atomic_load_explicit(&nc->offers_live, memory_order_acquire) > 0)
        return 1;
    if (nc->reg_slot < 0 || atomic_load_explicit(&nc->ctx->n_regs, memory_order_acquire) == 0)
        return 0;
    uint64_t k = nc->posted;
    if (k == 0 || k - 1 < nc->arrived)
        return 1;
    size_t prev = (size_t)((k - 1) % (uint64_t)nc->n_steps);
    return !nc->slot[prev].info_done || nc->staging[prev].mark != 0 ||
           nc->staging[prev].info.size != nc->slot_bytes;
}

/* Posts both receives of each free slot of the FIFO ahead of time (its
 * header into its staging line, then its payload straight into the slot,
 * in the order the sender sends them), within the request budget: so a
 * plugin that sends only into a posted receive (RDMA's rendezvous) finds
 * the next slots' receives there and moves them back to back. When
 * header_first says so, a slot's payload receive waits for its header
 * instead, and goes into the offered buffer when the header says the
 * payload is of that message (later slots wait behind it: the comm
 * matches receives in order). One request stays free for an iflush. 1 when
 * any went. */
static int post_receives(struct cfx_net_conn *nc)
{
    int moved = 0;
    int budget = NET_MAX_REQUESTS - (nc->gdr_iflush ? 1 : 0);
    while (!atomic_load_explicit(&nc->poison_reason, memory_order_acquire)) {
        uint64_t head = cfx_load_acquire_u64(&nc->fifo->head);
        if (nc->posted >= head + (uint64_t)nc->n_steps || nc->n_reqs >= budget)
            break;
        size_t index = (size_t)(nc->posted % (uint64_t)nc->n_steps);
        struct cfx_net_slot *s = &nc->slot[index];
        if (!nc->header_posted) {
            void *req = NULL;
            if (!post_recv(nc, &nc->staging[index], sizeof(struct cfx_net_header), nc->mhandle,
                           &req))
                break;
            *s = (struct cfx_net_slot){.req_info = req};
            nc->header_posted = 1;
            moved = 1;
            if (nc->n_reqs >= budget)
                break;
        }
        if (!s->info_done && header_first(nc))
            break; /* Its header says where the payload goes. */
        void *mhandle = NULL;
        char *dest = payload_dest(nc, index, &mhandle);
        size_t room = s->in_place ? nc->staging[index].info.size : nc->slot_bytes;
        if (!post_recv(nc, dest, room, mhandle, &s->req_data))
            break;
        nc->in_place += (uint64_t)s->in_place;
        nc->header_posted = 0;
        nc->posted++;
        moved = 1;
    }
    return moved;
}

static int recv_pass(struct cfx_net_conn *nc)
{
    int moved = 0;
    /* Twice at most: receives just posted are tested at once (small
     * slots often are in already). */
    for (int round = 0; round < 2; round++) {
        if (!test_receives(nc, &moved))
            return moved;
        moved |= post_arrived(nc);
        if (atomic_load_explicit(&nc->failed, memory_order_relaxed) || !post_receives(nc))
            break;
        moved = 1;
    }
    return moved;
}

/* A receiver with a slot partly in (its payload came, its info line not
 * yet) or waiting for its flush: a slot begun of which anything came and
 * that is not posted yet. */
static int recv_busy(const struct cfx_net_conn *nc)
{
    for (uint64_t k = nc->arrived; k < nc->posted; k++) {
        const struct cfx_net_slot *s = &nc->slot[k % (uint64_t)nc->n_steps];
        if (s->data_done || s->info_done)
            return 1;
    }
    return 0;
}

/* ============================================================ passes */

int cfx_net_conn_busy(const struct cfx_net_conn *nc)
{
    if (nc->dir == CFX_CONN_SEND) {
        if (atomic_load_explicit(&nc->poison_reason, memory_order_acquire))
            return !atomic_load_explicit(&nc->poison_done, memory_order_acquire);
        return nc->n_reqs > 0 || nc->issued != cfx_load_acquire_u64(&nc->fifo->tail);
    }
    /* A receiver whose next slot has not begun to come is left to the
     * thread that waits on it; a slot partly in is the proxy's too. */
    return recv_busy(nc);
}

static int conn_pass(struct cfx_net_conn *nc)
{
    int moved = 0;
    if (!atomic_load_explicit(&nc->failed, memory_order_relaxed))
        moved = nc->dir == CFX_CONN_SEND ? send_pass(nc) : recv_pass(nc);
    int failed = atomic_load_explicit(&nc->failed, memory_order_relaxed);
    if (failed && nc->dir == CFX_CONN_RECV)
        moved |= recv_after_failure(nc);
    /* A receiver that only waits for the next info line is passed over
     * now and then too: its user thread may be waiting elsewhere while the
     * plugin needs a test to move the bytes (a plugin over TCP reads in
     * test). */
    int64_t poll_ns = failed                  ? 0
                      : cfx_net_conn_busy(nc) ? NET_POLL_NS
                      : nc->dir == CFX_CONN_RECV && (nc->posted > nc->arrived || nc->header_posted)
                          ? NET_IDLE_POLL_NS
                          : 0;
    if (nc->pinned && !failed) {
        /* A kernel's connector: polled always (its kernel never kicks). */
        int64_t kernel = cfx_proxy_kernel_poll_ns(&nc->moved_ns, moved, cfx_time_now_ns());
        if (poll_ns == 0 || kernel < poll_ns)
            poll_ns = kernel;
    } else if (nc->pinned && nc->dir == CFX_CONN_RECV && nc->arrived < nc->posted) {
        /* Failed, with slots begun: a kernel waiting for them never
         * drives, so the proxy tests them now and then (the plugin may
         * still finish them). */
        poll_ns = CFX_PROXY_KERNEL_IDLE_NS;
    }
    atomic_store_explicit(&nc->client.poll_ns, poll_ns, memory_order_relaxed);
    return moved;
}

/* Whoever asks first makes the pass; a thread that finds it taken leaves
 * `wanted` set and the holder passes once more (as the ib transport). */
int cfx_net_conn_drive(struct cfx_net_conn *nc)
{
    int moved = 0;
    atomic_store_explicit(&nc->wanted, 1, memory_order_seq_cst);
    while (atomic_load_explicit(&nc->wanted, memory_order_seq_cst)) {
        if (atomic_exchange_explicit(&nc->busy, 1, memory_order_acquire))
            return moved;
        while (atomic_exchange_explicit(&nc->wanted, 0, memory_order_seq_cst))
            moved |= conn_pass(nc);
        atomic_store_explicit(&nc->busy, 0, memory_order_seq_cst);
    }
    return moved;
}

/* ============================================================ health */

cfxResult_t cfx_net_conn_check(struct cfx_net_conn *nc, struct cfx_connector *conn)
{
    /* Slots that arrived before a failure are still good: let them be taken. */
    int takeable = nc->dir == CFX_CONN_RECV && cfx_conn_can_take(conn);
    if (atomic_load_explicit(&nc->failed, memory_order_acquire)) {
        if (takeable)
            return cfxSuccess;
        conn->blame_rank = nc->blame_rank;
        return cfx_error_set(nc->failed_res, CFX_LOG_NET, "%s", nc->error);
    }
    int poison = atomic_load_explicit(&nc->peer_poison, memory_order_acquire);
    if (poison != 0 && !takeable) {
        cfxResult_t reason = (cfxResult_t)poison;
        int blame = nc->peer_poison_blame;
        conn->blame_rank = blame;
        return cfx_error_set(reason, CFX_LOG_NET,
                             "rank %d stopped its connection to rank %d because of rank %d: %s%s",
                             nc->peer_rank, nc->self_rank, blame, cfxGetErrorString(reason),
                             reason == cfxInvalidUsage ? " (mismatched collectives; that rank's "
                                                         "error says which)"
                                                       : "");
    }
    return cfxSuccess;
}
