/*
 * fake-verbs wire: the one service thread of a process. It owns a TCP
 * listening socket (the "port" of the namespace's device), one connection per
 * requester QP to the process that owns the destination QP, and the
 * connections other processes opened to this one. Requester side: sends the
 * WQEs post_send queued, in order, go-back-N on a NAK (RNR, destination not
 * ready), and completes them when the responder's answer comes back.
 * Responder side: validates each message (sequence, QP state, receive, rkey,
 * bounds, access), writes the payload straight into this process's memory,
 * consumes a receive, and answers ACK or NAK. Both sides always read, so two
 * processes writing large messages at each other cannot deadlock; answers
 * are 8 bytes per message and at most max_send_wr are outstanding.
 */
#include "fakeverbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define FV_HELLO_MAGIC     0x46564831u /* "FVH1" */
#define FV_ID_WAKE         1u
#define FV_ID_LISTEN       2u
#define FV_ID_FIRST_CONN   16u
#define FV_ID_REQ_BIT      (1ull << 62)
#define FV_EPOLL_BATCH     64
#define FV_IDLE_WAIT_MS    100
#define FV_BUSY_WAIT_MS    1
#define FV_DISCARD_BYTES   65536
#define FV_RNR_FOREVER     7
#define FV_TIMEOUT_UNIT_NS 4096ull

enum fv_resp_status {
    FV_ACK = 0,
    FV_NAK_RNR = 1,
    FV_NAK_NOT_READY = 2,
    FV_NAK_ACCESS = 3,
    FV_NAK_INVALID = 4,
    FV_NO_ANSWER = 5, /* out of sequence after a NAK: dropped */
};

struct fv_hello {
    uint32_t magic;
    uint32_t dest_qpn;
    uint32_t src_qpn;
    uint32_t first_seq; /* sequence number of the first message to come */
};

/* One message: the header, then length payload bytes. */
struct fv_msg_hdr {
    uint32_t seq;
    uint32_t opcode; /* enum ibv_wr_opcode */
    uint32_t imm;    /* as the user gave it (network order) */
    uint32_t rkey;
    uint64_t remote_addr;
    uint32_t length;
    uint32_t reserved;
};

struct fv_resp {
    uint32_t seq;
    uint32_t status; /* enum fv_resp_status */
};

/* A connection another process opened to this one. */
struct fv_resp_conn {
    int fd;
    uint64_t id;
    struct fv_hello hello;
    size_t hello_len;
    struct fv_msg_hdr hdr;
    size_t hdr_len;
    uint32_t expect_seq;
    /* The message whose payload is being read. */
    unsigned char *target; /* NULL: discard */
    size_t payload_left;
    enum fv_resp_status verdict;
    /* Answers not yet written. */
    unsigned char *tx;
    size_t tx_len, tx_cap;
    int want_out;
    struct fv_resp_conn *next;
};

static unsigned char discard_buf[FV_DISCARD_BYTES];

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static void epoll_set(int fd, uint64_t id, int want_out, int op)
{
    struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0u), .data.u64 = id};
    epoll_ctl(fv.epoll_fd, op, fd, &ev);
}

/* ------------------------------------------------------------ requester */

void fv_wire_conn_close(struct fv_qp *qp)
{
    struct fv_req_conn *conn = &qp->conn;
    if (conn->fd >= 0) {
        epoll_ctl(fv.epoll_fd, EPOLL_CTL_DEL, conn->fd, NULL);
        close(conn->fd);
    }
    memset(conn, 0, sizeof(*conn));
    conn->fd = -1;
    conn->state = FV_CONN_NONE;
}

static uint64_t retry_budget_ms(const struct fv_qp *qp)
{
    if (qp->timeout == 0)
        return UINT64_MAX; /* 0: infinite, as the IB spec says */
    uint64_t once_ns = FV_TIMEOUT_UNIT_NS << (qp->timeout > 31 ? 31 : qp->timeout);
    return once_ns * (qp->retry_cnt + 1u) / 1000000u + 1u;
}

static uint64_t retry_spacing_ms(const struct fv_qp *qp)
{
    uint64_t budget = retry_budget_ms(qp);
    uint64_t spacing =
        budget == UINT64_MAX ? FV_RETRY_MAX_SPACING_MS : budget / (qp->retry_cnt + 1u);
    if (spacing < 1)
        spacing = 1;
    return spacing > FV_RETRY_MAX_SPACING_MS ? FV_RETRY_MAX_SPACING_MS : spacing;
}

/* The head was dropped (no destination, not ready): retry or give up.
 * Returns 0 to retry, -1 when the QP went to ERR. */
static int dropped(struct fv_qp *qp, uint64_t now)
{
    if (qp->conn.retry_start_ms == 0)
        qp->conn.retry_start_ms = now;
    if (now - qp->conn.retry_start_ms >= retry_budget_ms(qp)) {
        fv_log("QP 0x%x -> 0x%x: destination absent or not ready past the timeout", qp->ibqp.qp_num,
               qp->dest_qpn);
        fv_qp_fail_head(qp, IBV_WC_RETRY_EXC_ERR);
        return -1;
    }
    qp->conn.next_try_ms = now + retry_spacing_ms(qp);
    return 0;
}

static int gid_is_zero(const union ibv_gid *gid)
{
    static const union ibv_gid zero;
    return memcmp(gid, &zero, sizeof(zero)) == 0;
}

/* Whether the address vector the QP was given names the device of @p lid /
 * @p gids (what a switch would route it to). */
static int av_matches(const struct fv_qp *qp, uint16_t lid, const union ibv_gid *gids)
{
    if (qp->ah.is_global) {
        for (int i = 0; i < 2; i++)
            if (!gid_is_zero(&gids[i]) && memcmp(&gids[i], &qp->ah.grh.dgid, sizeof(gids[i])) == 0)
                return 1;
        return 0;
    }
    return lid != 0 && qp->ah.dlid == lid;
}

/* Find the destination and start connecting. */
static void req_connect(struct fv_qp *qp, uint64_t now)
{
    struct fv_req_conn *conn = &qp->conn;
    if (now < conn->next_try_ms)
        return;
    struct sockaddr_in peer = {.sin_family = AF_INET};
    uint16_t port, lid;
    pid_t pid;
    union ibv_gid gids[2];
    if (fv_registry_lookup(qp->dest_qpn, &peer.sin_addr, &port, &pid, &lid, gids) != 0 ||
        !av_matches(qp, lid, gids)) {
        conn->state = FV_CONN_WAIT_DEST;
        dropped(qp, now);
        return;
    }
    if (kill(pid, 0) != 0 && errno == ESRCH) {
        fv_log("QP 0x%x -> 0x%x: owner pid %d is dead", qp->ibqp.qp_num, qp->dest_qpn, (int)pid);
        fv_qp_fail_head(qp, IBV_WC_RETRY_EXC_ERR);
        return;
    }
    peer.sin_port = htons(port);
    conn->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (conn->fd < 0) {
        fv_qp_fail_head(qp, IBV_WC_RETRY_EXC_ERR);
        return;
    }
    set_nodelay(conn->fd);
    if (connect(conn->fd, (struct sockaddr *)&peer, sizeof(peer)) != 0 && errno != EINPROGRESS) {
        fv_log("QP 0x%x -> 0x%x: connect: %s", qp->ibqp.qp_num, qp->dest_qpn, strerror(errno));
        fv_qp_fail_head(qp, IBV_WC_RETRY_EXC_ERR);
        return;
    }
    conn->id = FV_ID_REQ_BIT | fv.next_conn_id++;
    conn->state = FV_CONN_CONNECTING;
    conn->want_out = 1;
    epoll_set(conn->fd, conn->id, 1, EPOLL_CTL_ADD);
    fv_log("QP 0x%x connecting to QP 0x%x at %s:%u (pid %d)", qp->ibqp.qp_num, qp->dest_qpn,
           inet_ntoa(peer.sin_addr), port, (int)pid);
}

/* The connection broke: outstanding work fails at once (dead peer). */
static void req_broken(struct fv_qp *qp, const char *why)
{
    fv_log("QP 0x%x -> 0x%x: connection lost (%s)", qp->ibqp.qp_num, qp->dest_qpn, why);
    if (qp->sq_acked != qp->sq_tail)
        fv_qp_fail_head(qp, IBV_WC_RETRY_EXC_ERR);
    else
        fv_wire_conn_close(qp);
}

/* Write @p len bytes of @p buf from *@p off; 1 done, 0 would block, -1 broken. */
static int send_part(int fd, const void *buf, size_t len, size_t *off)
{
    while (*off < len) {
        ssize_t n = send(fd, (const char *)buf + *off, len - *off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            *off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    }
    return 1;
}

/* Send what is queued; stops at a WQE that fails locally. */
static void req_send(struct fv_qp *qp, uint64_t now)
{
    struct fv_req_conn *conn = &qp->conn;
    struct fv_hello hello = {.magic = FV_HELLO_MAGIC,
                             .dest_qpn = qp->dest_qpn,
                             .src_qpn = qp->ibqp.qp_num,
                             .first_seq = qp->sq_sent};
    int rc = send_part(conn->fd, &hello, sizeof(hello), &conn->hello_off);
    while (rc == 1) {
        if (conn->tx_off == 0 && conn->rewind_pending) {
            qp->sq_sent = qp->sq_acked;
            conn->rewind_pending = 0;
        }
        if (qp->sq_sent == qp->sq_tail || (conn->tx_off == 0 && now < conn->next_try_ms))
            break;
        struct fv_send_wqe *wqe = &qp->sq[qp->sq_sent % qp->cap.max_send_wr];
        if (wqe->local_status != IBV_WC_SUCCESS) {
            if (qp->sq_sent == qp->sq_acked)
                fv_qp_fail_head(qp, wqe->local_status);
            return;
        }
        struct fv_msg_hdr hdr = {.seq = wqe->seq,
                                 .opcode = (uint32_t)wqe->opcode,
                                 .imm = wqe->imm,
                                 .rkey = wqe->rkey,
                                 .remote_addr = wqe->remote_addr,
                                 .length = wqe->length};
        size_t total = sizeof(hdr) + wqe->length;
        size_t off = conn->tx_off;
        if (off < sizeof(hdr))
            rc = send_part(conn->fd, &hdr, sizeof(hdr), &off);
        if (rc == 1 && wqe->length > 0) {
            size_t payload_off = off - sizeof(hdr);
            rc = send_part(conn->fd, wqe->payload, wqe->length, &payload_off);
            off = sizeof(hdr) + payload_off;
        }
        conn->tx_off = off;
        if (off == total) {
            conn->tx_off = 0;
            qp->sq_sent++;
        }
    }
    if (rc < 0) {
        req_broken(qp, strerror(errno));
        return;
    }
    int want_out = rc == 0;
    if (want_out != conn->want_out) {
        conn->want_out = want_out;
        epoll_set(conn->fd, conn->id, want_out, EPOLL_CTL_MOD);
    }
}

static void req_answer(struct fv_qp *qp, const struct fv_resp *resp, uint64_t now)
{
    if (qp->sq_acked == qp->sq_sent || resp->seq != qp->sq[qp->sq_acked % qp->cap.max_send_wr].seq)
        return; /* stale */
    switch ((enum fv_resp_status)resp->status) {
    case FV_ACK: fv_qp_complete_acked(qp); return;
    case FV_NAK_RNR:
        if (qp->rnr_retry != FV_RNR_FOREVER && ++qp->conn.rnr_count > qp->rnr_retry) {
            fv_qp_fail_head(qp, IBV_WC_RNR_RETRY_EXC_ERR);
            return;
        }
        qp->conn.next_try_ms = now + FV_RNR_DELAY_MS;
        break;
    case FV_NAK_NOT_READY:
        if (dropped(qp, now) != 0)
            return;
        break;
    case FV_NAK_ACCESS: fv_qp_fail_head(qp, IBV_WC_REM_ACCESS_ERR); return;
    default: fv_qp_fail_head(qp, IBV_WC_REM_INV_REQ_ERR); return;
    }
    qp->conn.rewind_pending = 1;
}

/* Readable or writable requester connection. */
static void req_event(struct fv_qp *qp, uint32_t events, uint64_t now)
{
    struct fv_req_conn *conn = &qp->conn;
    if (conn->state == FV_CONN_CONNECTING && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(conn->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
            req_broken(qp, strerror(err));
            return;
        }
        conn->state = FV_CONN_UP;
        fv_log("QP 0x%x connected to QP 0x%x", qp->ibqp.qp_num, qp->dest_qpn);
    }
    while (conn->state == FV_CONN_UP) {
        ssize_t n =
            recv(conn->fd, conn->rx + conn->rx_len, sizeof(conn->rx) - conn->rx_len, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            req_broken(qp, n == 0 ? "closed by the peer" : strerror(errno));
            return;
        }
        if (n < 0)
            break;
        conn->rx_len += (size_t)n;
        if (conn->rx_len == sizeof(conn->rx)) {
            struct fv_resp resp;
            memcpy(&resp, conn->rx, sizeof(resp));
            conn->rx_len = 0;
            req_answer(qp, &resp, now);
        }
    }
}

static void req_progress(struct fv_qp *qp, uint64_t now)
{
    if (qp->ibqp.state != IBV_QPS_RTS || (qp->sq_sent == qp->sq_tail && !qp->conn.rewind_pending))
        return;
    if (qp->conn.state == FV_CONN_NONE || qp->conn.state == FV_CONN_WAIT_DEST)
        req_connect(qp, now);
    if (qp->ibqp.state == IBV_QPS_RTS && qp->conn.state == FV_CONN_UP)
        req_send(qp, now);
}

/* ------------------------------------------------------------ responder */

static void resp_queue(struct fv_resp_conn *rc, uint32_t seq, enum fv_resp_status status)
{
    struct fv_resp resp = {.seq = seq, .status = status};
    if (rc->tx_len + sizeof(resp) > rc->tx_cap) {
        size_t cap = rc->tx_cap == 0 ? 4096 : rc->tx_cap * 2;
        unsigned char *grown = realloc(rc->tx, cap);
        if (grown == NULL)
            return;
        rc->tx = grown;
        rc->tx_cap = cap;
    }
    memcpy(rc->tx + rc->tx_len, &resp, sizeof(resp));
    rc->tx_len += sizeof(resp);
}

static void resp_close(struct fv_resp_conn *rc)
{
    for (struct fv_resp_conn **it = &fv.resp_conns; *it != NULL; it = &(*it)->next) {
        if (*it == rc) {
            *it = rc->next;
            break;
        }
    }
    epoll_ctl(fv.epoll_fd, EPOLL_CTL_DEL, rc->fd, NULL);
    close(rc->fd);
    free(rc->tx);
    free(rc);
}

/* Whether an incoming write may land: rkey of the QP's PD, in bounds, with
 * remote write on both the MR and the QP. */
static int write_allowed(const struct fv_qp *qp, const struct fv_msg_hdr *hdr)
{
    struct fv_mr *mr = fv_mr_find(hdr->rkey);
    if (mr == NULL || mr->ibmr.rkey != hdr->rkey || mr->ibmr.pd != qp->ibqp.pd ||
        !(mr->access & IBV_ACCESS_REMOTE_WRITE) || !(qp->access_flags & IBV_ACCESS_REMOTE_WRITE))
        return 0;
    uint64_t start = (uint64_t)(uintptr_t)mr->ibmr.addr;
    return hdr->remote_addr >= start && hdr->length <= mr->ibmr.length &&
           hdr->remote_addr - start <= mr->ibmr.length - hdr->length;
}

static int needs_recv(uint32_t opcode)
{
    return opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM ||
           opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
}

/* A receive completed in error; the responder QP goes to ERR. */
static void recv_failed(struct fv_qp *qp, enum ibv_wc_status status)
{
    struct fv_recv_wqe *rwqe = &qp->rq[qp->rq_head % qp->cap.max_recv_wr];
    struct ibv_wc wc = {
        .wr_id = rwqe->wr_id, .status = status, .opcode = IBV_WC_RECV, .qp_num = qp->ibqp.qp_num};
    qp->rq_head++;
    fv_cq_push((struct fv_cq *)qp->ibqp.recv_cq, &wc);
    fv_qp_to_error(qp);
}

/* A header arrived: decide where its payload goes and what to answer. */
static void resp_decide(struct fv_resp_conn *rc)
{
    struct fv_msg_hdr *hdr = &rc->hdr;
    rc->target = NULL;
    rc->payload_left = hdr->length;
    if (hdr->seq != rc->expect_seq) {
        rc->verdict = FV_NO_ANSWER;
        return;
    }
    struct fv_qp *qp = fv_qp_find(rc->hello.dest_qpn);
    if (qp == NULL || (qp->ibqp.state != IBV_QPS_RTR && qp->ibqp.state != IBV_QPS_RTS)) {
        rc->verdict = FV_NAK_NOT_READY;
        return;
    }
    if (needs_recv(hdr->opcode) && qp->rq_head == qp->rq_tail) {
        rc->verdict = FV_NAK_RNR;
        return;
    }
    rc->verdict = FV_ACK;
    if (hdr->opcode == IBV_WR_RDMA_WRITE || hdr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        if (hdr->length == 0)
            return;
        if (!write_allowed(qp, hdr)) {
            fv_log("QP 0x%x: remote access error (rkey 0x%x addr 0x%llx len %u)", qp->ibqp.qp_num,
                   hdr->rkey, (unsigned long long)hdr->remote_addr, hdr->length);
            rc->verdict = FV_NAK_ACCESS;
            return;
        }
        rc->target = (unsigned char *)(uintptr_t)hdr->remote_addr;
        return;
    }
    struct fv_recv_wqe *rwqe = &qp->rq[qp->rq_head % qp->cap.max_recv_wr];
    if (rwqe->local_status != IBV_WC_SUCCESS || hdr->length > rwqe->length) {
        recv_failed(qp,
                    rwqe->local_status != IBV_WC_SUCCESS ? rwqe->local_status : IBV_WC_LOC_LEN_ERR);
        rc->verdict = FV_NAK_INVALID;
        return;
    }
    rc->target = rwqe->addr;
}

/* The payload is in: complete the receive and answer. */
static void resp_finish(struct fv_resp_conn *rc)
{
    struct fv_msg_hdr *hdr = &rc->hdr;
    if (rc->verdict == FV_NO_ANSWER)
        return;
    resp_queue(rc, hdr->seq, rc->verdict);
    if (rc->verdict != FV_ACK)
        return;
    rc->expect_seq++;
    struct fv_qp *qp = fv_qp_find(rc->hello.dest_qpn);
    if (qp == NULL || !needs_recv(hdr->opcode) || qp->rq_head == qp->rq_tail)
        return;
    struct fv_recv_wqe *rwqe = &qp->rq[qp->rq_head % qp->cap.max_recv_wr];
    qp->rq_head++;
    struct ibv_wc wc = {.wr_id = rwqe->wr_id,
                        .status = IBV_WC_SUCCESS,
                        .opcode = hdr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM
                                      ? IBV_WC_RECV_RDMA_WITH_IMM
                                      : IBV_WC_RECV,
                        .byte_len = hdr->length,
                        .qp_num = qp->ibqp.qp_num,
                        .src_qp = rc->hello.src_qpn};
    if (hdr->opcode != IBV_WR_SEND) {
        wc.wc_flags = IBV_WC_WITH_IMM;
        wc.imm_data = hdr->imm;
    }
    fv_cq_push((struct fv_cq *)qp->ibqp.recv_cq, &wc);
}

/* Read what is there; returns -1 when the connection is gone. */
static int resp_read(struct fv_resp_conn *rc)
{
    for (;;) {
        void *dst;
        size_t want;
        if (rc->hello_len < sizeof(rc->hello)) {
            dst = (char *)&rc->hello + rc->hello_len;
            want = sizeof(rc->hello) - rc->hello_len;
        } else if (rc->hdr_len < sizeof(rc->hdr)) {
            dst = (char *)&rc->hdr + rc->hdr_len;
            want = sizeof(rc->hdr) - rc->hdr_len;
        } else {
            want = rc->payload_left;
            if (rc->target != NULL) {
                dst = rc->target + (rc->hdr.length - rc->payload_left);
            } else {
                dst = discard_buf;
                if (want > sizeof(discard_buf))
                    want = sizeof(discard_buf);
            }
        }
        ssize_t n = want == 0 ? 0 : recv(rc->fd, dst, want, MSG_DONTWAIT);
        if (want > 0 && n == 0)
            return -1;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        if (rc->hello_len < sizeof(rc->hello)) {
            rc->hello_len += (size_t)n;
            if (rc->hello_len == sizeof(rc->hello)) {
                if (rc->hello.magic != FV_HELLO_MAGIC)
                    return -1;
                rc->expect_seq = rc->hello.first_seq;
            }
            continue;
        }
        if (rc->hdr_len < sizeof(rc->hdr)) {
            rc->hdr_len += (size_t)n;
            if (rc->hdr_len == sizeof(rc->hdr))
                resp_decide(rc);
        } else {
            rc->payload_left -= (size_t)n;
        }
        if (rc->hdr_len == sizeof(rc->hdr) && rc->payload_left == 0) {
            resp_finish(rc);
            rc->hdr_len = 0;
        }
    }
}

static int resp_flush(struct fv_resp_conn *rc)
{
    if (rc->tx_len == 0)
        return 0;
    size_t off = 0;
    int result = send_part(rc->fd, rc->tx, rc->tx_len, &off);
    memmove(rc->tx, rc->tx + off, rc->tx_len - off);
    rc->tx_len -= off;
    if (result < 0)
        return -1;
    int want_out = result == 0;
    if (want_out != rc->want_out) {
        rc->want_out = want_out;
        epoll_set(rc->fd, rc->id, want_out, EPOLL_CTL_MOD);
    }
    return 0;
}

static void accept_all(void)
{
    for (;;) {
        int fd = accept4(fv.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        struct fv_resp_conn *rc = calloc(1, sizeof(*rc));
        if (rc == NULL) {
            close(fd);
            return;
        }
        set_nodelay(fd);
        rc->fd = fd;
        rc->id = fv.next_conn_id++;
        rc->next = fv.resp_conns;
        fv.resp_conns = rc;
        epoll_set(fd, rc->id, 0, EPOLL_CTL_ADD);
    }
}

/* ------------------------------------------------------------ service */

static void fault_timers(uint64_t now)
{
    if (fv.knobs.port_down_after_ms >= 0 && !fv.port_down &&
        now - fv.first_open_ms >= (uint64_t)fv.knobs.port_down_after_ms) {
        fv.port_down = 1;
        fv_log("port DOWN on purpose (FAKEVERBS_PORT_DOWN_AFTER_MS)");
        for (struct fv_context *ctx = fv.contexts; ctx != NULL; ctx = ctx->next)
            fv_async_post_ctx(ctx, IBV_EVENT_PORT_ERR, NULL);
        for (struct fv_qp *qp = fv.qps; qp != NULL; qp = qp->next)
            fv_qp_to_error(qp);
    }
    if (fv.knobs.qp_fatal_after_ms >= 0 && !fv.qp_fatal_done && fv.first_rts_ms != 0 &&
        now - fv.first_rts_ms >= (uint64_t)fv.knobs.qp_fatal_after_ms) {
        fv.qp_fatal_done = 1;
        struct fv_qp *qp = fv_qp_find(fv.first_rts_qpn);
        if (qp != NULL) {
            fv_log("QP 0x%x fatal on purpose (FAKEVERBS_ASYNC_QP_FATAL_AFTER_MS)", qp->ibqp.qp_num);
            fv_async_post_ctx((struct fv_context *)qp->ibqp.context, IBV_EVENT_QP_FATAL, &qp->ibqp);
            fv_qp_to_error(qp);
        }
    }
}

/* How long epoll may sleep: short while anything waits on a clock. */
static int wait_ms(void)
{
    if ((fv.knobs.port_down_after_ms >= 0 && !fv.port_down) ||
        (fv.knobs.qp_fatal_after_ms >= 0 && !fv.qp_fatal_done))
        return FV_BUSY_WAIT_MS;
    for (struct fv_qp *qp = fv.qps; qp != NULL; qp = qp->next)
        if (qp->ibqp.state == IBV_QPS_RTS &&
            (qp->sq_sent != qp->sq_tail || qp->conn.rewind_pending) &&
            (qp->conn.state != FV_CONN_UP || qp->conn.next_try_ms != 0))
            return FV_BUSY_WAIT_MS;
    return FV_IDLE_WAIT_MS;
}

static void dispatch(const struct epoll_event *ev, uint64_t now)
{
    uint64_t id = ev->data.u64;
    if (id == FV_ID_WAKE) {
        uint64_t count;
        if (read(fv.wake_fd, &count, sizeof(count)) < 0 && errno != EAGAIN)
            fv_log("wake fd: %s", strerror(errno));
        return;
    }
    if (id == FV_ID_LISTEN) {
        accept_all();
        return;
    }
    if (id & FV_ID_REQ_BIT) {
        for (struct fv_qp *qp = fv.qps; qp != NULL; qp = qp->next) {
            if (qp->conn.fd >= 0 && qp->conn.id == id) {
                req_event(qp, ev->events, now);
                return;
            }
        }
        return;
    }
    for (struct fv_resp_conn *rc = fv.resp_conns; rc != NULL; rc = rc->next) {
        if (rc->id == id) {
            if (resp_read(rc) != 0 || resp_flush(rc) != 0)
                resp_close(rc);
            return;
        }
    }
}

static void *service_main(void *arg)
{
    (void)arg;
    struct epoll_event events[FV_EPOLL_BATCH];
    pthread_mutex_lock(&fv.lock);
    while (!fv.stop) {
        int timeout = wait_ms();
        pthread_mutex_unlock(&fv.lock);
        int n = epoll_wait(fv.epoll_fd, events, FV_EPOLL_BATCH, timeout);
        pthread_mutex_lock(&fv.lock);
        uint64_t now = fv_now_ms();
        for (int i = 0; i < n && !fv.stop; i++)
            dispatch(&events[i], now);
        fault_timers(now);
        for (struct fv_qp *qp = fv.qps; qp != NULL; qp = qp->next) {
            if (qp->conn.next_try_ms != 0 && now >= qp->conn.next_try_ms &&
                qp->conn.state == FV_CONN_UP && !qp->conn.rewind_pending)
                qp->conn.next_try_ms = 0;
            req_progress(qp, now);
        }
        struct fv_resp_conn *next;
        for (struct fv_resp_conn *rc = fv.resp_conns; rc != NULL; rc = next) {
            next = rc->next;
            if (rc->tx_len > 0 && resp_flush(rc) != 0)
                resp_close(rc);
        }
    }
    pthread_mutex_unlock(&fv.lock);
    return NULL;
}

void fv_service_wake(void)
{
    uint64_t one = 1;
    if (fv.wake_fd >= 0 && write(fv.wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        fv_log("wake: %s", strerror(errno));
}

static void close_fds(void)
{
    if (fv.listen_fd >= 0)
        close(fv.listen_fd);
    if (fv.wake_fd >= 0)
        close(fv.wake_fd);
    if (fv.epoll_fd >= 0)
        close(fv.epoll_fd);
    fv.listen_fd = fv.wake_fd = fv.epoll_fd = -1;
}

int fv_service_start(void)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr = fv.ident.addr};
    socklen_t len = sizeof(addr);
    fv.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    fv.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    fv.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fv.epoll_fd < 0 || fv.wake_fd < 0 || fv.listen_fd < 0)
        goto err_close;
    if (bind(fv.listen_fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 ||
        listen(fv.listen_fd, SOMAXCONN) != 0 ||
        getsockname(fv.listen_fd, (struct sockaddr *)&addr, &len) != 0) {
        fv_log("cannot listen on %s: %s", inet_ntoa(fv.ident.addr), strerror(errno));
        goto err_close;
    }
    fv.listen_port = ntohs(addr.sin_port);
    epoll_set(fv.wake_fd, FV_ID_WAKE, 0, EPOLL_CTL_ADD);
    epoll_set(fv.listen_fd, FV_ID_LISTEN, 0, EPOLL_CTL_ADD);
    fv.next_conn_id = FV_ID_FIRST_CONN;
    fv.stop = 0;
    if (pthread_create(&fv.thread, NULL, service_main, NULL) != 0)
        goto err_close;
    fv.running = 1;
    fv_log("service on %s:%u, lid %u", inet_ntoa(fv.ident.addr), fv.listen_port, fv.ident.lid);
    return 0;

err_close:
    close_fds();
    return -1;
}

void fv_service_stop(void)
{
    pthread_mutex_lock(&fv.lock);
    if (!fv.running) {
        pthread_mutex_unlock(&fv.lock);
        return;
    }
    fv.stop = 1;
    pthread_mutex_unlock(&fv.lock);
    fv_service_wake();
    pthread_join(fv.thread, NULL);
    pthread_mutex_lock(&fv.lock);
    while (fv.resp_conns != NULL)
        resp_close(fv.resp_conns);
    for (struct fv_qp *qp = fv.qps; qp != NULL; qp = qp->next)
        fv_wire_conn_close(qp);
    close_fds();
    fv.running = 0;
    pthread_mutex_unlock(&fv.lock);
}
