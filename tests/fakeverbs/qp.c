/*
 * fake-verbs completion queues and RC queue pairs: the state machine with the
 * attribute masks the IB spec requires, the send and receive queues, the
 * posting checks (lkey bounds, queue depth, state) and the completions,
 * retired in posting order. Everything runs under fv.lock; the wire moves
 * what post_send queued (wire.c). See fakeverbs.h.
 */
#include "fakeverbs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define FV_INIT_MASK (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
#define FV_RTR_MASK                                                                                \
    (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |                \
     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
#define FV_RTS_MASK                                                                                \
    (IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |         \
     IBV_QP_MAX_QP_RD_ATOMIC)

/* ------------------------------------------------------------ CQ */

FV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                                       struct ibv_comp_channel *channel, int comp_vector)
{
    (void)comp_vector;
    if (cqe < 1 || cqe > FV_MAX_CQE || channel != NULL) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_cq *cq = calloc(1, sizeof(*cq));
    if (cq == NULL)
        goto err_nomem;
    cq->ring = calloc((size_t)cqe, sizeof(*cq->ring));
    if (cq->ring == NULL)
        goto err_free_cq;
    cq->capacity = cqe;
    cq->ibcq.context = context;
    cq->ibcq.cq_context = cq_context;
    cq->ibcq.cqe = cqe;
    pthread_mutex_init(&cq->ibcq.mutex, NULL);
    pthread_cond_init(&cq->ibcq.cond, NULL);
    return &cq->ibcq;

err_free_cq:
    free(cq);
err_nomem:
    errno = ENOMEM;
    return NULL;
}

FV_EXPORT int ibv_destroy_cq(struct ibv_cq *ibcq)
{
    struct fv_cq *cq = (struct fv_cq *)ibcq;
    pthread_mutex_lock(&fv.lock);
    for (struct fv_qp *qp = fv.qps; qp != NULL; qp = qp->next) {
        if (qp->ibqp.send_cq == ibcq || qp->ibqp.recv_cq == ibcq) {
            pthread_mutex_unlock(&fv.lock);
            return EBUSY;
        }
    }
    pthread_mutex_unlock(&fv.lock);
    pthread_cond_destroy(&ibcq->cond);
    pthread_mutex_destroy(&ibcq->mutex);
    free(cq->ring);
    free(cq);
    return 0;
}

void fv_cq_push(struct fv_cq *cq, const struct ibv_wc *wc)
{
    fv.completions_made++;
    if (fv.knobs.lose_completion > 0 && fv.completions_made == fv.knobs.lose_completion) {
        fv_log("lost completion %ld (wr_id %llu) on purpose", fv.completions_made,
               (unsigned long long)wc->wr_id);
        return;
    }
    if (cq->overflowed)
        return;
    if (cq->count == cq->capacity) {
        cq->overflowed = 1;
        fv_log("CQ overflow (%d entries)", cq->capacity);
        fv_async_post_ctx((struct fv_context *)cq->ibcq.context, IBV_EVENT_CQ_ERR, &cq->ibcq);
        for (struct fv_qp *qp = fv.qps; qp != NULL; qp = qp->next)
            if (qp->ibqp.send_cq == &cq->ibcq || qp->ibqp.recv_cq == &cq->ibcq)
                fv_qp_to_error(qp);
        return;
    }
    cq->ring[(cq->head + cq->count) % cq->capacity] = *wc;
    cq->count++;
}

int fv_cq_poll(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc)
{
    struct fv_cq *cq = (struct fv_cq *)ibcq;
    int n = 0;
    pthread_mutex_lock(&fv.lock);
    while (n < num_entries && cq->count > 0) {
        wc[n++] = cq->ring[cq->head];
        cq->head = (cq->head + 1) % cq->capacity;
        cq->count--;
    }
    pthread_mutex_unlock(&fv.lock);
    return n;
}

/* ------------------------------------------------------------ completions */

static struct fv_send_wqe *sq_slot(struct fv_qp *qp, uint32_t counter)
{
    return &qp->sq[counter % qp->cap.max_send_wr];
}

static void send_wc(struct fv_qp *qp, const struct fv_send_wqe *wqe, enum ibv_wc_status status)
{
    struct ibv_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = wqe->wr_id;
    wc.status = status;
    wc.opcode = (wqe->opcode == IBV_WR_SEND || wqe->opcode == IBV_WR_SEND_WITH_IMM) ? IBV_WC_SEND
                : wqe->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ
                                                  : IBV_WC_RDMA_WRITE;
    wc.byte_len = wqe->length;
    wc.qp_num = qp->ibqp.qp_num;
    if (status != IBV_WC_SUCCESS && status != IBV_WC_WR_FLUSH_ERR)
        fv_log("QP 0x%x wr_id %llu: %s", qp->ibqp.qp_num, (unsigned long long)wqe->wr_id,
               ibv_wc_status_str(status));
    fv_cq_push((struct fv_cq *)qp->ibqp.send_cq, &wc);
}

static void recv_flush_wc(struct fv_qp *qp, uint64_t wr_id)
{
    struct ibv_wc wc;
    memset(&wc, 0, sizeof(wc));
    wc.wr_id = wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qp->ibqp.qp_num;
    fv_cq_push((struct fv_cq *)qp->ibqp.recv_cq, &wc);
}

void fv_qp_to_error(struct fv_qp *qp)
{
    if (qp->ibqp.state == IBV_QPS_ERR)
        return;
    qp->ibqp.state = IBV_QPS_ERR;
    fv_log("QP 0x%x -> ERR", qp->ibqp.qp_num);
    fv_wire_conn_close(qp);
    /* Acknowledged unsignaled WRs retire silently; the rest flush. */
    for (uint32_t i = qp->sq_acked; i != qp->sq_tail; i++)
        send_wc(qp, sq_slot(qp, i), IBV_WC_WR_FLUSH_ERR);
    qp->sq_head = qp->sq_acked = qp->sq_sent = qp->sq_tail;
    for (uint32_t i = qp->rq_head; i != qp->rq_tail; i++)
        recv_flush_wc(qp, qp->rq[i % qp->cap.max_recv_wr].wr_id);
    qp->rq_head = qp->rq_tail;
}

void fv_qp_complete_acked(struct fv_qp *qp)
{
    struct fv_send_wqe *wqe = sq_slot(qp, qp->sq_acked);
    qp->sq_acked++;
    qp->conn.retry_start_ms = 0;
    qp->conn.rnr_count = 0;
    if (wqe->signaled) {
        send_wc(qp, wqe, IBV_WC_SUCCESS);
        qp->sq_head = qp->sq_acked;
    }
}

void fv_qp_fail_head(struct fv_qp *qp, enum ibv_wc_status status)
{
    struct fv_send_wqe *wqe = sq_slot(qp, qp->sq_acked);
    qp->sq_acked++;
    qp->sq_head = qp->sq_acked;
    if (qp->sq_sent - qp->sq_head > qp->sq_tail - qp->sq_head)
        qp->sq_sent = qp->sq_acked;
    send_wc(qp, wqe, status);
    fv_qp_to_error(qp);
}

/* ------------------------------------------------------------ QP */

struct fv_qp *fv_qp_find(uint32_t qpn)
{
    for (struct fv_qp *qp = fv.qps; qp != NULL; qp = qp->next)
        if (qp->ibqp.qp_num == qpn)
            return qp;
    return NULL;
}

FV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init)
{
    struct ibv_qp_cap *cap = &init->cap;
    if (init->qp_type != IBV_QPT_RC || init->srq != NULL || init->send_cq == NULL ||
        init->recv_cq == NULL || cap->max_send_wr < 1 || cap->max_send_wr > FV_MAX_QP_WR ||
        cap->max_recv_wr > FV_MAX_QP_WR || cap->max_send_sge > FV_MAX_SGE ||
        cap->max_recv_sge > FV_MAX_SGE || cap->max_inline_data > FV_MAX_INLINE) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_qp *qp = calloc(1, sizeof(*qp));
    if (qp == NULL)
        goto err_nomem;
    qp->cap = *cap;
    if (qp->cap.max_recv_wr < 1)
        qp->cap.max_recv_wr = 1;
    qp->sq = calloc(qp->cap.max_send_wr, sizeof(*qp->sq));
    qp->rq = calloc(qp->cap.max_recv_wr, sizeof(*qp->rq));
    if (qp->sq == NULL || qp->rq == NULL)
        goto err_free;
    qp->sq_sig_all = init->sq_sig_all;
    qp->conn.fd = -1;
    qp->ibqp.context = pd->context;
    qp->ibqp.qp_context = init->qp_context;
    qp->ibqp.pd = pd;
    qp->ibqp.send_cq = init->send_cq;
    qp->ibqp.recv_cq = init->recv_cq;
    qp->ibqp.state = IBV_QPS_RESET;
    qp->ibqp.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&qp->ibqp.mutex, NULL);
    pthread_cond_init(&qp->ibqp.cond, NULL);

    pthread_mutex_lock(&fv.lock);
    if (fv_registry_add_qp(fv_context_device(pd->context), &qp->ibqp.qp_num) != 0) {
        pthread_mutex_unlock(&fv.lock);
        fv_log("cannot register a QP number under %s", fv.knobs.dir);
        goto err_sync;
    }
    qp->registered = 1;
    qp->ibqp.handle = qp->ibqp.qp_num;
    qp->next = fv.qps;
    fv.qps = qp;
    pthread_mutex_unlock(&fv.lock);
    return &qp->ibqp;

err_sync:
    pthread_cond_destroy(&qp->ibqp.cond);
    pthread_mutex_destroy(&qp->ibqp.mutex);
err_free:
    free(qp->rq);
    free(qp->sq);
    free(qp);
err_nomem:
    errno = ENOMEM;
    return NULL;
}

FV_EXPORT int ibv_destroy_qp(struct ibv_qp *ibqp)
{
    struct fv_qp *qp = (struct fv_qp *)ibqp;
    pthread_mutex_lock(&fv.lock);
    for (struct fv_qp **it = &fv.qps; *it != NULL; it = &(*it)->next) {
        if (*it == qp) {
            *it = qp->next;
            break;
        }
    }
    fv_wire_conn_close(qp);
    if (qp->registered)
        fv_registry_remove_qp(ibqp->qp_num);
    pthread_mutex_unlock(&fv.lock);
    pthread_cond_destroy(&ibqp->cond);
    pthread_mutex_destroy(&ibqp->mutex);
    free(qp->rq);
    free(qp->sq);
    free(qp);
    return 0;
}

/* Whether @p mask holds every bit of @p required. */
static int has_all(int mask, int required)
{
    return (mask & required) == required;
}

static int modify_locked(struct fv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
    enum ibv_qp_state cur = qp->ibqp.state;
    if (!(mask & IBV_QP_STATE))
        return cur == IBV_QPS_RTS ? 0 : EINVAL;
    enum ibv_qp_state next = attr->qp_state;
    if (next == IBV_QPS_ERR) {
        fv_qp_to_error(qp);
        return 0;
    }
    if (next == IBV_QPS_RESET) {
        fv_wire_conn_close(qp);
        qp->sq_head = qp->sq_acked = qp->sq_sent = qp->sq_tail = 0;
        qp->rq_head = qp->rq_tail = 0;
        memset(&qp->conn, 0, sizeof(qp->conn));
        qp->conn.fd = -1;
        qp->ibqp.state = IBV_QPS_RESET;
        return 0;
    }
    if (next == IBV_QPS_INIT && (cur == IBV_QPS_RESET || cur == IBV_QPS_INIT)) {
        if (cur == IBV_QPS_RESET && !has_all(mask, FV_INIT_MASK))
            return EINVAL;
        if ((mask & IBV_QP_PORT) && attr->port_num != FV_PORT_NUM)
            return EINVAL;
        if (mask & IBV_QP_ACCESS_FLAGS)
            qp->access_flags = (int)attr->qp_access_flags;
    } else if (next == IBV_QPS_RTR && cur == IBV_QPS_INIT) {
        if (!has_all(mask, FV_RTR_MASK) || attr->path_mtu > IBV_MTU_4096 ||
            attr->dest_qp_num > 0xFFFFFF)
            return EINVAL;
        qp->ah = attr->ah_attr;
        qp->dest_qpn = attr->dest_qp_num;
    } else if (next == IBV_QPS_RTS && (cur == IBV_QPS_RTR || cur == IBV_QPS_RTS)) {
        if (cur == IBV_QPS_RTR && !has_all(mask, FV_RTS_MASK))
            return EINVAL;
        if (mask & IBV_QP_TIMEOUT)
            qp->timeout = attr->timeout;
        if (mask & IBV_QP_RETRY_CNT)
            qp->retry_cnt = attr->retry_cnt;
        if (mask & IBV_QP_RNR_RETRY)
            qp->rnr_retry = attr->rnr_retry;
        if (fv.first_rts_ms == 0) {
            fv.first_rts_ms = fv_now_ms();
            fv.first_rts_qpn = qp->ibqp.qp_num;
        }
    } else {
        return EINVAL;
    }
    qp->ibqp.state = next;
    return 0;
}

FV_EXPORT int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask)
{
    pthread_mutex_lock(&fv.lock);
    int result = modify_locked((struct fv_qp *)ibqp, attr, attr_mask);
    pthread_mutex_unlock(&fv.lock);
    if (result == 0)
        fv_service_wake();
    return result;
}

/* Whether [addr, addr + length) lies in an MR of @p pd whose lkey is @p lkey,
 * registered with every flag of @p access. */
static int lkey_covers(struct ibv_pd *pd, uint32_t lkey, uint64_t addr, uint64_t length, int access)
{
    struct fv_mr *mr = fv_mr_find(lkey);
    if (mr == NULL || mr->ibmr.lkey != lkey || mr->ibmr.pd != pd || (mr->access & access) != access)
        return 0;
    uint64_t start = (uint64_t)(uintptr_t)mr->ibmr.addr;
    return addr >= start && length <= mr->ibmr.length && addr - start <= mr->ibmr.length - length;
}

static int post_one_send(struct fv_qp *qp, const struct ibv_send_wr *wr)
{
    if (wr->num_sge < 0 || wr->num_sge > FV_MAX_SGE)
        return EINVAL;
    if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
        wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM &&
        wr->opcode != IBV_WR_RDMA_READ)
        return EINVAL;
    uint32_t length = wr->num_sge == 1 ? wr->sg_list[0].length : 0;
    int is_inline = (wr->send_flags & IBV_SEND_INLINE) != 0;
    if (wr->opcode == IBV_WR_RDMA_READ && is_inline)
        return EINVAL; /* A read has nothing to send inline. */
    if (is_inline && length > qp->cap.max_inline_data)
        return EINVAL;
    if (qp->sq_tail - qp->sq_head == qp->cap.max_send_wr)
        return ENOMEM;
    struct fv_send_wqe *wqe = sq_slot(qp, qp->sq_tail);
    memset(wqe, 0, offsetof(struct fv_send_wqe, inline_data));
    wqe->wr_id = wr->wr_id;
    wqe->opcode = wr->opcode;
    wqe->signaled = qp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
    wqe->seq = qp->sq_tail;
    wqe->imm = wr->imm_data;
    wqe->remote_addr = wr->wr.rdma.remote_addr;
    wqe->rkey = wr->wr.rdma.rkey;
    wqe->length = length;
    wqe->local_status = IBV_WC_SUCCESS;
    if (length > 0 && wr->opcode == IBV_WR_RDMA_READ) {
        /* The bytes land in the gather entry: it needs local write. */
        wqe->read_to = (void *)(uintptr_t)wr->sg_list[0].addr;
        if (!lkey_covers(qp->ibqp.pd, wr->sg_list[0].lkey, wr->sg_list[0].addr, length,
                         IBV_ACCESS_LOCAL_WRITE))
            wqe->local_status = IBV_WC_LOC_PROT_ERR;
    } else if (length > 0 && is_inline) {
        memcpy(wqe->inline_data, (const void *)(uintptr_t)wr->sg_list[0].addr, length);
        wqe->payload = wqe->inline_data;
    } else if (length > 0) {
        wqe->payload = (const void *)(uintptr_t)wr->sg_list[0].addr;
        if (!lkey_covers(qp->ibqp.pd, wr->sg_list[0].lkey, wr->sg_list[0].addr, length, 0))
            wqe->local_status = IBV_WC_LOC_PROT_ERR;
    }
    if (wr->opcode == IBV_WR_RDMA_READ && fv.knobs.fail_reads) {
        fv_log("a read fails on purpose (FAKEVERBS_FAIL_READS)");
        wqe->local_status = IBV_WC_RETRY_EXC_ERR;
    }
    if (wr->opcode == IBV_WR_RDMA_WRITE || wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        fv.writes_posted++;
        if (fv.knobs.fail_after_writes >= 0 && fv.writes_posted == fv.knobs.fail_after_writes + 1) {
            fv_log("write %ld fails on purpose (FAKEVERBS_FAIL_AFTER_WRITES)", fv.writes_posted);
            wqe->local_status = IBV_WC_RETRY_EXC_ERR;
        }
    }
    qp->sq_tail++;
    return 0;
}

int fv_qp_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    struct fv_qp *qp = (struct fv_qp *)ibqp;
    int result = 0;
    pthread_mutex_lock(&fv.lock);
    for (; wr != NULL; wr = wr->next) {
        if (qp->ibqp.state == IBV_QPS_ERR) {
            struct fv_send_wqe flushed = {.wr_id = wr->wr_id, .opcode = wr->opcode};
            send_wc(qp, &flushed, IBV_WC_WR_FLUSH_ERR);
            continue;
        }
        result = qp->ibqp.state == IBV_QPS_RTS ? post_one_send(qp, wr) : EINVAL;
        if (result != 0)
            break;
    }
    pthread_mutex_unlock(&fv.lock);
    if (result != 0 && bad_wr != NULL)
        *bad_wr = wr;
    fv_service_wake();
    return result;
}

int fv_qp_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    struct fv_qp *qp = (struct fv_qp *)ibqp;
    int result = 0;
    pthread_mutex_lock(&fv.lock);
    for (; wr != NULL; wr = wr->next) {
        enum ibv_qp_state state = qp->ibqp.state;
        if (state == IBV_QPS_ERR) {
            recv_flush_wc(qp, wr->wr_id);
            continue;
        }
        if (state == IBV_QPS_RESET || wr->num_sge < 0 || wr->num_sge > FV_MAX_SGE) {
            result = EINVAL;
            break;
        }
        if (qp->rq_tail - qp->rq_head == qp->cap.max_recv_wr) {
            result = ENOMEM;
            break;
        }
        struct fv_recv_wqe *rwqe = &qp->rq[qp->rq_tail % qp->cap.max_recv_wr];
        memset(rwqe, 0, sizeof(*rwqe));
        rwqe->wr_id = wr->wr_id;
        rwqe->local_status = IBV_WC_SUCCESS;
        if (wr->num_sge == 1) {
            rwqe->addr = (void *)(uintptr_t)wr->sg_list[0].addr;
            rwqe->length = wr->sg_list[0].length;
            if (rwqe->length > 0 &&
                !lkey_covers(qp->ibqp.pd, wr->sg_list[0].lkey, wr->sg_list[0].addr, rwqe->length,
                             IBV_ACCESS_LOCAL_WRITE))
                rwqe->local_status = IBV_WC_LOC_PROT_ERR;
        }
        qp->rq_tail++;
    }
    pthread_mutex_unlock(&fv.lock);
    if (result != 0 && bad_wr != NULL)
        *bad_wr = wr;
    return result;
}
