/*
 * The verbs transport's data path: a pass over a connector polls its
 * completion queue, then posts what may go: a sender's slots (payload write,
 * then the info write with the immediate), a receiver's credit, a poison, a
 * keepalive. Failures (a completion with an error status, an async event, a
 * peer breaking the protocol) fail the connector once, with a sentence
 * naming the peer, the NIC and the status. The protocol is in conn.h.
 *
 * Threads: a pass is made by whichever thread asks first
 * (cfx_ib_conn_drive, lock-free as the socket transport's): ibv_post_send,
 * ibv_post_recv and ibv_poll_cq on a connector's queue pair and completion
 * queue are only ever called by the thread holding `busy`.
 */
#include "cfx_build_config.h"

#if CFX_HAVE_VERBS

#include <assert.h>
#include <endian.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "src/util/cuda.h"
#include "src/util/log.h"
#include "src/util/time.h"
#include "transports/ib/conn.h"

#define POLL_BATCH 16

static const char *dir_name(enum cfx_conn_dir dir)
{
    return dir == CFX_CONN_SEND ? "send" : "receive";
}

/* Fail the connector (driving thread): keep the first failure. */
__attribute__((format(printf, 4, 5))) static void conn_fail(struct cfx_ib_conn *ic, cfxResult_t res,
                                                            int blame_rank, const char *fmt, ...)
{
    if (atomic_load_explicit(&ic->failed, memory_order_relaxed))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ic->error, sizeof(ic->error), fmt, ap);
    va_end(ap);
    ic->failed_res = res;
    ic->blame_rank = blame_rank;
    atomic_store_explicit(&ic->failed, 1, memory_order_release);
    CFX_INFO(CFX_LOG_NET, "%s", ic->error); /* The call that meets it reports it. */
}

/* Fail the connector (driving thread) for the async event @p what on one of
 * its queue pairs, on port @p nic. A flush recorded just before, whose cause
 * was not known yet (check() holds it back for IB_FLUSH_WHY_NS), gives way
 * to it. */
static void conn_fail_qp_event(struct cfx_ib_conn *ic, const char *what, const char *nic)
{
    if (atomic_load_explicit(&ic->failed, memory_order_relaxed) && ic->flushed_ns != 0 &&
        cfx_time_now_ns() - ic->flushed_ns < IB_FLUSH_WHY_NS) {
        ic->flushed_ns = 0;
        atomic_store_explicit(&ic->failed, 0, memory_order_relaxed);
    }
    conn_fail(ic, cfxSystemError, ic->self_rank,
              "ib: rank %d's queue pair to rank %d on %s failed: %s", ic->self_rank, ic->peer_rank,
              nic, what);
}

/* The first port this connector uses that an async event broke, or NULL. */
static const struct cfx_ib_nic *fatal_nic(const struct cfx_ib_conn *ic)
{
    for (int n = 0; n < ic->n_nics; n++)
        if (atomic_load_explicit(&ic->ctx->nic[n].fatal, memory_order_acquire))
            return &ic->ctx->nic[n];
    return NULL;
}

static const char *qp_label(const struct cfx_ib_conn *ic, int q)
{
    return cfx_ib_qp_nic(ic, q)->port.label;
}

/* ============================================================ posting */

/* One RDMA write of @p len bytes at @p local (inside the block) to @p remote
 * (the peer's block); with the immediate @p imm when @p with_imm. Signaled,
 * except a slot's payload: the info write that follows it on the same queue
 * pair is, and its completion means both are done (its send-queue entry
 * frees both: slot_written). Small writes go inline when the NIC allows. 0,
 * or the errno of ibv_post_send. */
static int post_write_to(struct cfx_ib_conn *ic, int q, uint64_t wr_id, const void *local,
                         uint32_t lkey, uint32_t len, uint64_t remote, uint32_t rkey, int with_imm,
                         uint32_t imm)
{
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)local, .length = len, .lkey = lkey};
    struct ibv_send_wr wr = {
        .wr_id = wr_id,
        .sg_list = &sge,
        .num_sge = len > 0 ? 1 : 0,
        .opcode = with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
        .send_flags = (IB_WR_KIND(wr_id) == IB_WR_PAYLOAD ? 0 : IBV_SEND_SIGNALED) |
                      ((int)len <= ic->max_inline ? IBV_SEND_INLINE : 0),
        .imm_data = htobe32(imm),
    };
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    struct ibv_send_wr *bad = NULL;
    int err = ibv_post_send(ic->qp[q], &wr, &bad);
    if (err == 0) {
        ic->sq_used[q]++;
        ic->sq_total++;
    }
    return err;
}

/* post_write_to into the peer's block. */
static int post_write_from(struct cfx_ib_conn *ic, int q, uint64_t wr_id, const void *local,
                           uint32_t lkey, uint32_t len, uint64_t remote, int with_imm, uint32_t imm)
{
    return post_write_to(ic, q, wr_id, local, lkey, len, remote, ic->peer_rkey[q], with_imm, imm);
}

/* post_write_from out of the connection's own block. */
static int post_write(struct cfx_ib_conn *ic, int q, uint64_t wr_id, const void *local,
                      uint32_t len, uint64_t remote, int with_imm, uint32_t imm)
{
    return post_write_from(ic, q, wr_id, local, ic->mr[q % ic->n_nics]->lkey, len, remote, with_imm,
                           imm);
}

static void post_failed(struct cfx_ib_conn *ic, int q, int err, const char *what)
{
    conn_fail(ic, cfxSystemError, ic->peer_rank, "ib: rank %d cannot post %s to rank %d on %s: %s",
              ic->self_rank, what, ic->peer_rank, qp_label(ic, q), strerror(err));
}

cfxResult_t cfx_ib_post_recvs(struct cfx_ib_conn *ic, int q, int count)
{
    for (int i = 0; i < count; i++) {
        /* No scatter list: the writes land in place; the receive only
         * carries the immediate. */
        struct ibv_recv_wr wr = {.wr_id = IB_WR_ID(IB_WR_RECV, 0), .sg_list = NULL, .num_sge = 0};
        struct ibv_recv_wr *bad = NULL;
        int err = ibv_post_recv(ic->qp[q], &wr, &bad);
        if (err != 0)
            return cfx_error_set_errno(err, CFX_LOG_NET,
                                       "ib: rank %d cannot post a receive for rank %d on %s",
                                       ic->self_rank, ic->peer_rank, qp_label(ic, q));
    }
    return cfxSuccess;
}

/* Sender: whether the receiver offered message @p msg, with room for
 * @p size bytes at @p offset: then *remote_p and *rkey_p say where they go
 * (the key for queue pair @p q's port at the receiver). The record is read
 * last word first (see struct cfx_ib_offer). */
static int offer_for(struct cfx_ib_conn *ic, int q, uint64_t msg, uint64_t offset, uint32_t size,
                     uint64_t *remote_p, uint32_t *rkey_p)
{
    const struct cfx_ib_offer *o = &ic->box->offers[msg % IB_OFFERS];
    uint64_t check = cfx_load_acquire_u64(&o->check);
    uint64_t bytes = cfx_load_relaxed_u64(&o->bytes), addr = cfx_load_relaxed_u64(&o->addr);
    uint32_t rkey = cfx_load_relaxed_u32(&o->rkey[q % ic->peer_n_nics]);
    uint64_t first = cfx_load_acquire_u64(&o->msg_plus1);
    if (check != msg + 1 || first != msg + 1 || offset > bytes || size > bytes - offset)
        return 0;
    *remote_p = addr + offset;
    *rkey_p = rkey;
    return 1;
}

/* Receiver: write the offers made since the last pass into the sender's
 * ring. */
static int send_offers(struct cfx_ib_conn *ic)
{
    int moved = 0;
    uint64_t made = atomic_load_explicit(&ic->offers_made, memory_order_acquire);
    while (ic->offers_posted < made && ic->sq_used[0] < ic->sq_depth) {
        size_t at = (size_t)(ic->offers_posted % IB_OFFERS);
        const struct cfx_ib_offer *src = &ic->box->offer_src[at];
        uint64_t msg = src->msg_plus1 - 1;
        int err = post_write(ic, 0, IB_WR_ID(IB_WR_OFFER, 0), src, sizeof(*src),
                             ic->peer_box + offsetof(struct cfx_ib_mailbox, offers) +
                                 (msg % IB_OFFERS) * sizeof(struct cfx_ib_offer),
                             0, 0);
        if (err != 0) {
            post_failed(ic, 0, err, "an offer");
            return moved;
        }
        ic->offers_posted++;
        moved = 1;
    }
    return moved;
}

/* Sender: write posted slots while the receiver has room for them. */
static int send_slots(struct cfx_ib_conn *ic)
{
    int moved = 0;
    uint64_t tail = cfx_load_acquire_u64(&ic->fifo->tail);
    uint64_t credit = cfx_load_acquire_u64(&ic->box->credit);
    while (ic->sent < tail && ic->sent < credit + (uint64_t)ic->n_steps) {
        uint64_t k = ic->sent;
        int q = (int)(k % (uint64_t)ic->n_qps);
        if (ic->sq_used[q] + 2 > ic->sq_depth)
            break;
        size_t index = (size_t)(k % (uint64_t)ic->n_steps);
        struct cfx_slot_info *info = &ic->fifo->info[index];
        uint32_t size = info->size;
        if (size > ic->slot_bytes) {
            conn_fail(ic, cfxInvalidUsage, ic->self_rank,
                      "ib: rank %d posted %u bytes into a %zu-byte slot for rank %d", ic->self_rank,
                      size, ic->slot_bytes, ic->peer_rank);
            return moved;
        }
        int err = 0;
        /* Where the payload goes: the receiver's slot, or its own buffer
         * when it offered the slot's message (offer_for). */
        uint64_t remote = ic->peer_slots + index * ic->slot_bytes;
        uint32_t rkey = ic->peer_slots_rkey[q];
        if (size > CFX_SLOT_INLINE_BYTES && ic->at_msg[index] != 0 &&
            offer_for(ic, q, ic->at_msg[index] - 1, ic->at_offset[index], size, &remote, &rkey)) {
            info->size = size | CFX_SLOT_IN_PLACE;
            ic->in_place_slots++;
        }
        ic->at_msg[index] = 0;
        uint64_t ref = ic->ref_addr[index];
        if (ref != 0) {
            /* Straight from the user's registered buffer (post_ref). */
            err = post_write_to(ic, q, IB_WR_ID(IB_WR_PAYLOAD, k), (const void *)(uintptr_t)ref,
                                ic->ref_reg[index]->mr[q % ic->n_nics]->lkey, size, remote, rkey, 0,
                                0);
            ic->ref_addr[index] = 0;
            ic->ref_slots++;
        } else if (size > CFX_SLOT_INLINE_BYTES) {
            /* The slot's own region: the block's, or in device memory its own. */
            const struct ibv_mr *own =
                ic->gdr_device ? ic->slots_mr[q % ic->n_nics] : ic->mr[q % ic->n_nics];
            err =
                post_write_to(ic, q, IB_WR_ID(IB_WR_PAYLOAD, k), ic->slots + index * ic->slot_bytes,
                              own->lkey, size, remote, rkey, 0, 0);
        }
        if (err == 0 && size > CFX_SLOT_INLINE_BYTES)
            ic->payload_mask |= 1ull << index; /* Unsignaled: its entry frees with the slot's. */
        if (err == 0)
            err = post_write(ic, q, IB_WR_ID(IB_WR_SLOT, k), info, sizeof(*info),
                             ic->peer_box + offsetof(struct cfx_ib_mailbox, staged) +
                                 index * sizeof(struct cfx_slot_info),
                             1, (uint32_t)k);
        if (err != 0) {
            post_failed(ic, q, err, "a slot");
            return moved;
        }
        ic->sent++;
        moved = 1;
    }
    return moved;
}

/* Receiver: tell the sender how far this side has released. */
static int send_credit(struct cfx_ib_conn *ic)
{
    uint64_t head = cfx_load_acquire_u64(&ic->fifo->head);
    if (head == ic->credit_sent || ic->credits_inflight >= IB_CREDITS_IN_FLIGHT ||
        ic->sq_used[0] >= ic->sq_depth)
        return 0;
    ic->box->credit_src = head;
    int err = post_write(ic, 0, IB_WR_ID(IB_WR_CREDIT, 0), &ic->box->credit_src, sizeof(uint64_t),
                         ic->peer_box + offsetof(struct cfx_ib_mailbox, credit), 0, 0);
    if (err != 0) {
        post_failed(ic, 0, err, "a credit");
        return 0;
    }
    ic->credit_sent = head;
    ic->credits_inflight++;
    return 1;
}

static int send_poison(struct cfx_ib_conn *ic)
{
    int reason = atomic_load_explicit(&ic->poison_reason, memory_order_acquire);
    if (reason == 0 || ic->poison_posted || ic->sq_used[0] >= ic->sq_depth)
        return 0;
    int blame = atomic_load_explicit(&ic->poison_blame, memory_order_relaxed);
    ic->box->poison_src = ((uint64_t)(uint32_t)reason << 32) | (uint32_t)(blame + 1);
    ic->poison_posted = 1;
    int err = post_write(ic, 0, IB_WR_ID(IB_WR_POISON, 0), &ic->box->poison_src, sizeof(uint64_t),
                         ic->peer_box + offsetof(struct cfx_ib_mailbox, poison), 0, 0);
    if (err != 0)
        post_failed(ic, 0, err, "a poison");
    return err == 0;
}

/* Nothing in flight for a while: write a keepalive, so that a dead peer
 * shows as a failed write (IBV_WC_RETRY_EXC_ERR) while this side waits. */
static int send_keepalive(struct cfx_ib_conn *ic)
{
    if (ic->sq_total != 0 || ic->alive_inflight)
        return 0;
    int64_t now = cfx_time_now_ns();
    if (ic->alive_due_ns == 0)
        ic->alive_due_ns = now + IB_KEEPALIVE_NS;
    if (now < ic->alive_due_ns)
        return 0;
    ic->alive_due_ns = now + IB_KEEPALIVE_NS;
    ic->box->alive_src++;
    int err = post_write(ic, 0, IB_WR_ID(IB_WR_ALIVE, 0), &ic->box->alive_src, sizeof(uint64_t),
                         ic->peer_box + offsetof(struct cfx_ib_mailbox, alive), 0, 0);
    if (err != 0) {
        post_failed(ic, 0, err, "a keepalive");
        return 0;
    }
    ic->alive_inflight = 1;
    return 0; /* Not progress of the operation. */
}

/* ============================================================ completions */

static const char *wc_status_text(const struct cfx_ib_conn *ic, enum ibv_wc_status status)
{
    const char *text = ic->ctx->ibv->wc_status_str(status);
    return text ? text : "unknown status";
}

/* What a failed completion means, for the sentence. */
static const char *wc_status_hint(enum ibv_wc_status status)
{
    switch (status) {
    case IBV_WC_RETRY_EXC_ERR: return "the peer or the path to it is gone (IBV_WC_RETRY_EXC_ERR)";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "the peer posted no receive (IBV_WC_RNR_RETRY_EXC_ERR)";
    case IBV_WC_REM_ACCESS_ERR:
        return "the peer refused the write: its memory key or bounds (IBV_WC_REM_ACCESS_ERR)";
    case IBV_WC_WR_FLUSH_ERR: return "the queue pair had already failed (IBV_WC_WR_FLUSH_ERR)";
    case IBV_WC_LOC_PROT_ERR: return "a local memory key or bounds (IBV_WC_LOC_PROT_ERR)";
    default: return "a transport error";
    }
}

/* Which of the connector's queue pairs a completion is about. */
static int qp_index(const struct cfx_ib_conn *ic, uint32_t qp_num)
{
    for (int q = 0; q < ic->n_qps; q++)
        if (ic->qp[q]->qp_num == qp_num)
            return q;
    return -1;
}

/* Receiver with slots in device memory: start making the slots that
 * arrived visible to the GPU (a completion only says the NIC's writes
 * reached the device). Returns 1 when they are (cuFlushGPUDirectRDMAWrites,
 * synchronous), 0 when an RDMA read is in flight for them (flush_done posts
 * them) or the connector failed. */
static int flush_begin(struct cfx_ib_conn *ic)
{
    if (ic->flush_qp == NULL) {
        if (cfx_cuda_flush_rdma_writes(ic->gdr_device - 1) != cfxSuccess) {
            conn_fail(ic, cfxSystemError, ic->self_rank, "ib: rank %d's connection to rank %d: %s",
                      ic->self_rank, ic->peer_rank, cfx_error_thread_last());
            return 0;
        }
        ic->flushed_mask |= ic->arrived_mask;
        ic->gdr_flushes++;
        return 1;
    }
    if (ic->flush_inflight)
        return 0; /* What arrived since waits for the next read. */
    /* A read of the slots through the loopback queue pair: PCIe keeps it
     * behind the NIC's writes into the device, so once it completes they
     * are there. */
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)&ic->box->flush_sink,
                          .length = sizeof(uint32_t),
                          .lkey = ic->mr[0]->lkey};
    struct ibv_send_wr wr = {.wr_id = IB_WR_ID(IB_WR_FLUSH, 0),
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_RDMA_READ,
                             .send_flags = IBV_SEND_SIGNALED};
    wr.wr.rdma.remote_addr = (uint64_t)(uintptr_t)ic->dev_mem;
    wr.wr.rdma.rkey = ic->slots_mr[0]->rkey;
    struct ibv_send_wr *bad = NULL;
    int err = ibv_post_send(ic->flush_qp, &wr, &bad);
    if (err != 0) {
        conn_fail(ic, cfxSystemError, ic->self_rank,
                  "ib: rank %d cannot post the read that flushes rank %d's writes into device %d's "
                  "memory on %s: %s",
                  ic->self_rank, ic->peer_rank, ic->gdr_device - 1, ic->ctx->nic[0].port.label,
                  strerror(err));
        return 0;
    }
    ic->flush_inflight = 1;
    ic->flush_cover = ic->arrived_mask;
    return 0;
}

/* Receiver: post every slot whose immediate came, in order: copy its
 * staged info line into the FIFO, mark it posted, advance the tail. With
 * the slots in device memory (GPUDirect RDMA), only slots a flush covered. */
static void post_arrived(struct cfx_ib_conn *ic)
{
    for (;;) {
        size_t index = (size_t)(ic->arrived % (uint64_t)ic->n_steps);
        uint64_t bit = 1ull << index;
        if (!(ic->arrived_mask & bit))
            return;
        if (ic->gdr_device && !(ic->flushed_mask & bit) && !flush_begin(ic))
            return;
        ic->arrived_mask &= ~bit;
        ic->flushed_mask &= ~bit;
        const struct cfx_slot_info *staged = &ic->box->staged[index];
        struct cfx_slot_info *info = &ic->fifo->info[index];
        if ((staged->size & CFX_SLOT_SIZE_MASK) > ic->slot_bytes) {
            conn_fail(ic, cfxInvalidUsage, ic->peer_rank,
                      "ib: rank %d wrote %u bytes into a %zu-byte slot of rank %d", ic->peer_rank,
                      staged->size & CFX_SLOT_SIZE_MASK, ic->slot_bytes, ic->self_rank);
            return;
        }
        info->size = staged->size;
        info->print = staged->print;
        memcpy(info->inline_data, staged->inline_data, sizeof(info->inline_data));
        cfx_fifo_mark_posted(ic->fifo->info, ic->n_steps, ic->arrived);
        ic->arrived++;
        cfx_store_release_u64(&ic->fifo->tail, ic->arrived);
    }
}

/* The flush's completion queue: a read that completed makes the slots it
 * covered visible; they are posted. A failed read fails the connector. */
static int poll_flush(struct cfx_ib_conn *ic)
{
    struct ibv_wc wc;
    int n = ibv_poll_cq(ic->flush_cq, 1, &wc);
    if (n <= 0) {
        if (n < 0)
            conn_fail(ic, cfxSystemError, ic->self_rank,
                      "ib: rank %d cannot poll the flush's completion queue on %s", ic->self_rank,
                      ic->ctx->nic[0].port.label);
        return 0;
    }
    ic->flush_inflight = 0;
    if (wc.status != IBV_WC_SUCCESS) {
        conn_fail(ic, cfxSystemError, ic->self_rank,
                  "ib: rank %d's read that flushes rank %d's writes into device %d's memory failed "
                  "on %s: %s, status %d",
                  ic->self_rank, ic->peer_rank, ic->gdr_device - 1, ic->ctx->nic[0].port.label,
                  wc_status_text(ic, wc.status), (int)wc.status);
        return 1;
    }
    ic->flushed_mask |= ic->flush_cover;
    ic->gdr_flushes++;
    post_arrived(ic);
    return 1;
}

/* A slot's immediate came (on queue pair @p q): both its writes have
 * landed. Slots striped over several queue pairs may come out of turn;
 * they are posted in order. Reposts the receive. */
static void slot_arrived(struct cfx_ib_conn *ic, int q, const struct ibv_wc *wc)
{
    uint32_t number = be32toh(wc->imm_data);
    uint32_t ahead = number - (uint32_t)ic->arrived;
    uint64_t k = ic->arrived + ahead; /* The full slot number. */
    size_t index = (size_t)(k % (uint64_t)ic->n_steps);
    if (ahead >= (uint32_t)ic->n_steps || (ic->arrived_mask & (1ull << index)) ||
        (int)(k % (uint64_t)ic->n_qps) != q) {
        conn_fail(ic, cfxRemoteError, ic->peer_rank,
                  "ib: rank %d wrote slot %u to rank %d, which expected slots %u to %u: the stream "
                  "from rank %d is corrupt",
                  ic->peer_rank, number, ic->self_rank, (uint32_t)ic->arrived,
                  (uint32_t)ic->arrived + (uint32_t)ic->n_steps - 1, ic->peer_rank);
        return;
    }
    ic->arrived_mask |= 1ull << index;
    post_arrived(ic);
    if (cfx_ib_post_recvs(ic, q, 1) != cfxSuccess)
        conn_fail(ic, cfxSystemError, ic->self_rank, "%s", cfx_error_thread_last());
}

/* Sender: slot @p k's writes completed (on queue pair @p q): its unsignaled
 * payload write's send-queue entry is free too; release every slot done, in
 * order. */
static void slot_written(struct cfx_ib_conn *ic, int q, uint64_t k)
{
    uint64_t bit = 1ull << (k % (uint64_t)ic->n_steps);
    if (ic->payload_mask & bit) {
        ic->payload_mask &= ~bit;
        ic->sq_used[q]--;
        ic->sq_total--;
    }
    uint64_t head = cfx_load_relaxed_u64(&ic->fifo->head); /* Only this side writes it. */
    if (k < head || k >= head + (uint64_t)ic->n_steps)
        return; /* Not a slot in flight (cannot happen on a sane NIC). */
    ic->done_mask |= 1ull << (k % (uint64_t)ic->n_steps);
    uint64_t released = head;
    while (ic->done_mask & (1ull << (released % (uint64_t)ic->n_steps))) {
        ic->done_mask &= ~(1ull << (released % (uint64_t)ic->n_steps));
        released++;
    }
    if (released != head)
        cfx_store_release_u64(&ic->fifo->head, released);
}

static void completion(struct cfx_ib_conn *ic, const struct ibv_wc *wc)
{
    enum ib_wr_kind kind = IB_WR_KIND(wc->wr_id);
    int q = qp_index(ic, wc->qp_num);
    if (q < 0) {
        conn_fail(ic, cfxInternalError, ic->self_rank,
                  "ib: a completion for queue pair %u, not one of the connection to rank %d",
                  wc->qp_num, ic->peer_rank);
        return;
    }
    if (kind != IB_WR_RECV) {
        ic->sq_used[q]--;
        ic->sq_total--;
    }
    /* A failed payload write completes on its own (unsignaled or not): the
     * slot's completion must not free its entry again. */
    if (kind == IB_WR_PAYLOAD)
        ic->payload_mask &= ~(1ull << (IB_WR_VALUE(wc->wr_id) % (uint64_t)ic->n_steps));
    if (wc->status != IBV_WC_SUCCESS) {
        if (kind == IB_WR_CREDIT)
            ic->credits_inflight--;
        if (kind == IB_WR_ALIVE)
            ic->alive_inflight = 0;
        if (kind == IB_WR_OFFER)
            atomic_fetch_add_explicit(&ic->offers_done, 1, memory_order_release);
        if (wc->status == IBV_WC_WR_FLUSH_ERR) {
            /* The queue pair failed before: an async event may say why. */
            for (int n = 0; n < ic->n_nics; n++)
                cfx_ib_async_ready(&ic->ctx->nic[n], 0);
            const struct cfx_ib_nic *fatal = fatal_nic(ic);
            if (fatal != NULL) {
                conn_fail(ic, cfxSystemError, ic->self_rank,
                          "%s (rank %d's %s connection to rank %d lost its work requests)",
                          fatal->fatal_error, ic->self_rank, dir_name(ic->dir), ic->peer_rank);
                return;
            }
            const char *what = atomic_load_explicit(&ic->qp_event, memory_order_acquire);
            if (what != NULL) {
                conn_fail_qp_event(ic, what,
                                   atomic_load_explicit(&ic->qp_event_nic, memory_order_relaxed));
                return;
            }
        }
        if (wc->status == IBV_WC_WR_FLUSH_ERR &&
            !atomic_load_explicit(&ic->failed, memory_order_relaxed))
            ic->flushed_ns = cfx_time_now_ns();
        conn_fail(ic, cfxRemoteError, ic->peer_rank,
                  "ib: rank %d's %s connection to rank %d failed on %s (peer %s): %s, status "
                  "%d: %s",
                  ic->self_rank, dir_name(ic->dir), ic->peer_rank, qp_label(ic, q), ic->peer_nic[q],
                  wc_status_text(ic, wc->status), (int)wc->status, wc_status_hint(wc->status));
        return;
    }
    switch (kind) {
    case IB_WR_PAYLOAD: break;
    case IB_WR_POISON: atomic_store_explicit(&ic->poison_done, 1, memory_order_release); break;
    case IB_WR_SLOT: slot_written(ic, q, IB_WR_VALUE(wc->wr_id)); break;
    case IB_WR_CREDIT: ic->credits_inflight--; break;
    case IB_WR_ALIVE: ic->alive_inflight = 0; break;
    case IB_WR_OFFER: atomic_fetch_add_explicit(&ic->offers_done, 1, memory_order_release); break;
    case IB_WR_RECV: slot_arrived(ic, q, wc); break;
    default:
        conn_fail(ic, cfxInternalError, ic->self_rank,
                  "ib: a completion with an unknown work request id 0x%llx",
                  (unsigned long long)wc->wr_id);
    }
}

/* Every port's completion queue, until each is empty. */
static int poll_completions(struct cfx_ib_conn *ic)
{
    struct ibv_wc wcs[POLL_BATCH];
    int moved = 0;
    for (int c = 0; c < ic->n_nics; c++) {
        for (;;) {
            int n = ibv_poll_cq(ic->cq[c], POLL_BATCH, wcs);
            if (n < 0) {
                conn_fail(ic, cfxSystemError, ic->self_rank,
                          "ib: rank %d cannot poll its completion queue for rank %d on %s",
                          ic->self_rank, ic->peer_rank, ic->ctx->nic[c].port.label);
                return moved;
            }
            for (int i = 0; i < n; i++)
                completion(ic, &wcs[i]);
            moved |= n > 0;
            if (n < POLL_BATCH)
                break;
        }
    }
    if (ic->flush_inflight)
        moved |= poll_flush(ic);
    return moved;
}

/* ============================================================ passes */

int cfx_ib_conn_busy(const struct cfx_ib_conn *ic)
{
    if (ic->sq_total > 0)
        return 1;
    if (ic->dir == CFX_CONN_SEND)
        return ic->sent != cfx_load_acquire_u64(&ic->fifo->tail);
    return ic->flush_inflight || ic->credit_sent != cfx_load_acquire_u64(&ic->fifo->head) ||
           ic->offers_posted != atomic_load_explicit(&ic->offers_made, memory_order_acquire);
}

static int conn_pass(struct cfx_ib_conn *ic)
{
    int moved = poll_completions(ic);
    int failed = atomic_load_explicit(&ic->failed, memory_order_relaxed);
    if (!failed)
        moved |= ic->dir == CFX_CONN_SEND ? send_slots(ic) : send_offers(ic) | send_credit(ic);
    /* A poison goes out even from a failed connector: the peer may be fine. */
    moved |= send_poison(ic);
    if (!failed && atomic_load_explicit(&ic->started, memory_order_relaxed))
        send_keepalive(ic);
    /* The proxy passes again soon only while something is in flight; a
     * kernel's connector always (its kernel posts and releases unseen). */
    failed = atomic_load_explicit(&ic->failed, memory_order_relaxed);
    int64_t poll = !failed && cfx_ib_conn_busy(ic) ? IB_POLL_NS : 0;
    if (ic->pinned && !failed) {
        if (moved)
            atomic_store_explicit(&ic->started, 1, memory_order_relaxed);
        int64_t kernel = cfx_proxy_kernel_poll_ns(&ic->moved_ns, moved, cfx_time_now_ns());
        if (poll == 0 || kernel < poll)
            poll = kernel;
    }
    atomic_store_explicit(&ic->client.poll_ns, poll, memory_order_relaxed);
    return moved;
}

/* Whoever asks first makes the pass; a thread that finds it taken leaves
 * `wanted` set and the holder passes once more (as the socket transport). */
int cfx_ib_conn_drive(struct cfx_ib_conn *ic)
{
    int moved = 0;
    atomic_store_explicit(&ic->wanted, 1, memory_order_seq_cst);
    while (atomic_load_explicit(&ic->wanted, memory_order_seq_cst)) {
        if (atomic_exchange_explicit(&ic->busy, 1, memory_order_acquire))
            return moved;
        while (atomic_exchange_explicit(&ic->wanted, 0, memory_order_seq_cst))
            moved |= conn_pass(ic);
        atomic_store_explicit(&ic->busy, 0, memory_order_seq_cst);
    }
    return moved;
}

/* ============================================================ health */

cfxResult_t cfx_ib_conn_check(struct cfx_ib_conn *ic, struct cfx_connector *conn)
{
    /* Slots that arrived before a failure are still good: let them be taken. */
    int takeable = ic->dir == CFX_CONN_RECV && cfx_conn_can_take(conn);
    const struct cfx_ib_nic *fatal = fatal_nic(ic);
    if (atomic_load_explicit(&ic->failed, memory_order_acquire) && !(ic->flushed_ns && fatal)) {
        if (takeable)
            return cfxSuccess;
        /* Flushed for a reason not known yet: the async event that says why
         * (port down) may be on its way through the proxy thread. */
        if (ic->flushed_ns && cfx_time_now_ns() - ic->flushed_ns < IB_FLUSH_WHY_NS)
            return cfxSuccess;
        conn->blame_rank = ic->blame_rank;
        return cfx_error_set(ic->failed_res, CFX_LOG_NET, "%s", ic->error);
    }
    if (fatal) {
        if (takeable)
            return cfxSuccess;
        conn->blame_rank = ic->self_rank;
        return cfx_error_set(cfxSystemError, CFX_LOG_NET, "%s (rank %d's connection to rank %d)",
                             fatal->fatal_error, ic->self_rank, ic->peer_rank);
    }
    uint64_t poison = cfx_load_acquire_u64(&ic->box->poison);
    if (poison != 0 && !takeable) {
        cfxResult_t reason = (cfxResult_t)(poison >> 32);
        int blame = (int)(uint32_t)poison - 1;
        conn->blame_rank = blame;
        return cfx_error_set(reason, CFX_LOG_NET,
                             "rank %d stopped its connection to rank %d because of rank %d: %s%s",
                             ic->peer_rank, ic->self_rank, blame, cfxGetErrorString(reason),
                             reason == cfxInvalidUsage ? " (mismatched collectives; that rank's "
                                                         "error says which)"
                                                       : "");
    }
    return cfxSuccess;
}

/* ============================================================ async events */

/* Runs on the proxy thread when a port's device's async_fd turns readable,
 * and on a driving thread that met a flushed work request (to learn why). */
void cfx_ib_async_ready(void *arg, uint32_t events)
{
    (void)events;
    struct cfx_ib_nic *nic = arg;
    struct cfx_ib_ctx *ctx = nic->ctx;
    const struct cfx_verbs_api *ibv = ctx->ibv;
    struct ibv_async_event event;
    while (ibv->get_async_event(nic->dev, &event) == 0) {
        const char *what = ibv->event_type_str(event.event_type);
        switch (cfx_ib_event_scope(event.event_type)) {
        case CFX_IB_EVENT_QP: {
            struct cfx_ib_conn *ic = event.element.qp ? event.element.qp->qp_context : NULL;
            if (ic == NULL)
                break;
            /* Said whatever else failed the connection first (a peer's
             * poison may beat this event to the caller). */
            CFX_WARN(CFX_LOG_NET, "ib: rank %d's queue pair to rank %d on %s: %s", ic->self_rank,
                     ic->peer_rank, nic->port.label, what);
            /* The failure record belongs to the thread holding `busy`:
             * take it if free; if a pass runs now (on this thread too, one
             * that met a flushed request), its flushed completions find
             * the event's name here. */
            atomic_store_explicit(&ic->qp_event_nic, nic->port.label, memory_order_relaxed);
            atomic_store_explicit(&ic->qp_event, what, memory_order_release);
            if (!atomic_exchange_explicit(&ic->busy, 1, memory_order_acquire)) {
                conn_fail_qp_event(ic, what, nic->port.label);
                atomic_store_explicit(&ic->busy, 0, memory_order_seq_cst);
                if (atomic_load_explicit(&ic->wanted, memory_order_seq_cst))
                    cfx_ib_conn_drive(ic); /* A pass asked for meanwhile. */
            }
            break;
        }
        case CFX_IB_EVENT_PORT: {
            char on_rank[32];
            snprintf(on_rank, sizeof(on_rank), " on rank %d", ctx->rank);
            if (cfx_ib_nic_mark_fatal(nic, "ib: ", on_rank, what))
                CFX_WARN(CFX_LOG_NET, "%s", nic->fatal_error);
            break;
        }
        case CFX_IB_EVENT_OTHER:
            CFX_INFO(CFX_LOG_NET, "ib: %s: async event: %s", nic->port.label, what);
            break;
        }
        ibv->ack_async_event(&event);
    }
}

#endif /* CFX_HAVE_VERBS */
