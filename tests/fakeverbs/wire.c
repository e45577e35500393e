/*
 * fake-verbs wire: the one service thread of a process, and the responder
 * side. The thread owns a TCP listening socket (the "port" of the namespace's
 * device), the requester connections of this process's QPs (requester.c) and
 * the connections other processes opened to this one. Responder side:
 * validates each message (sequence, QP state, receive, rkey, bounds, access),
 * writes the payload straight into this process's memory, consumes a receive
 * and answers ACK or NAK. Both sides always read, so two processes writing
 * large messages at each other cannot deadlock; answers are 8 bytes per
 * message and at most max_send_wr messages are outstanding per connection.
 */
#include "fakeverbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define FV_ID_WAKE       1u
#define FV_ID_LISTEN     2u
#define FV_ID_FIRST_CONN 16u
#define FV_EPOLL_BATCH   64
#define FV_IDLE_WAIT_MS  100
#define FV_BUSY_WAIT_MS  1
#define FV_DISCARD_BYTES 65536

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

void fv_wire_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void fv_wire_epoll_set(int fd, uint64_t id, int want_out, int op)
{
    struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0u), .data.u64 = id};
    epoll_ctl(fv.epoll_fd, op, fd, &ev);
}

int fv_wire_send_part(int fd, const void *buf, size_t len, size_t *off)
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

/* Whether an incoming write may land (@p access IBV_ACCESS_REMOTE_WRITE) or
 * a read take its bytes (IBV_ACCESS_REMOTE_READ): rkey of the QP's PD, in
 * bounds, with that access on both the MR and the QP. */
static int remote_allowed(const struct fv_qp *qp, const struct fv_msg_hdr *hdr, int access)
{
    struct fv_mr *mr = fv_mr_find(hdr->rkey);
    if (mr == NULL || mr->ibmr.rkey != hdr->rkey || mr->ibmr.pd != qp->ibqp.pd ||
        !(mr->access & access) || !(qp->access_flags & access))
        return 0;
    uint64_t start = (uint64_t)(uintptr_t)mr->ibmr.addr;
    return hdr->remote_addr >= start && hdr->length <= mr->ibmr.length &&
           hdr->remote_addr - start <= mr->ibmr.length - hdr->length;
}

/* A read's response: the bytes go straight into the requester's buffer
 * (this process's memory, or the requesting process's through
 * process_vm_writev), before the ACK that completes the read. Returns 0 on
 * success. */
static int read_respond(const struct fv_resp_conn *rc)
{
    const struct fv_msg_hdr *hdr = &rc->hdr;
    struct in_addr addr;
    uint16_t port, lid;
    pid_t pid;
    union ibv_gid gids[2];
    if (fv_registry_lookup(rc->hello.src_qpn, &addr, &port, &pid, &lid, gids) != 0)
        return -1;
    void *from = (void *)(uintptr_t)hdr->remote_addr;
    if (pid == getpid()) {
        memcpy((void *)(uintptr_t)hdr->local_addr, from, hdr->length);
        return 0;
    }
    struct iovec local = {.iov_base = from, .iov_len = hdr->length};
    struct iovec remote = {.iov_base = (void *)(uintptr_t)hdr->local_addr, .iov_len = hdr->length};
    return process_vm_writev(pid, &local, 1, &remote, 1, 0) == (ssize_t)hdr->length ? 0 : -1;
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
    if (qp->resp_access_err) {
        rc->verdict = FV_NAK_ACCESS;
        return;
    }
    if (needs_recv(hdr->opcode) && qp->rq_head == qp->rq_tail) {
        rc->verdict = FV_NAK_RNR;
        return;
    }
    rc->verdict = FV_ACK;
    if (hdr->opcode == IBV_WR_RDMA_READ) {
        rc->payload_left = 0; /* The request carries no bytes. */
        if (hdr->length == 0)
            return;
        if (!remote_allowed(qp, hdr, IBV_ACCESS_REMOTE_READ)) {
            fv_log("QP 0x%x: remote access error on a read (rkey 0x%x addr 0x%llx len %u)",
                   qp->ibqp.qp_num, hdr->rkey, (unsigned long long)hdr->remote_addr, hdr->length);
            rc->verdict = FV_NAK_ACCESS;
            if (!qp->resp_access_err)
                fv_async_post_ctx((struct fv_context *)qp->ibqp.context, IBV_EVENT_QP_ACCESS_ERR,
                                  &qp->ibqp);
            qp->resp_access_err = 1;
            return;
        }
        if (read_respond(rc) != 0) {
            fv_log("QP 0x%x: cannot put a read's %u bytes into QP 0x%x's process", qp->ibqp.qp_num,
                   hdr->length, rc->hello.src_qpn);
            rc->verdict = FV_NAK_INVALID;
        }
        return;
    }
    if (hdr->opcode == IBV_WR_RDMA_WRITE || hdr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        if (hdr->length == 0)
            return;
        if (!remote_allowed(qp, hdr, IBV_ACCESS_REMOTE_WRITE)) {
            fv_log("QP 0x%x: remote access error (rkey 0x%x addr 0x%llx len %u)", qp->ibqp.qp_num,
                   hdr->rkey, (unsigned long long)hdr->remote_addr, hdr->length);
            rc->verdict = FV_NAK_ACCESS;
            /* As a NIC's responder, which goes to ERR with an affiliated
             * event: nothing the requester sent after the bad write (a
             * write with immediate behind it) lands. (Its state stays, so
             * a QP connected to itself still gets the NAK.) */
            if (!qp->resp_access_err)
                fv_async_post_ctx((struct fv_context *)qp->ibqp.context, IBV_EVENT_QP_ACCESS_ERR,
                                  &qp->ibqp);
            qp->resp_access_err = 1;
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
    int result = fv_wire_send_part(rc->fd, rc->tx, rc->tx_len, &off);
    memmove(rc->tx, rc->tx + off, rc->tx_len - off);
    rc->tx_len -= off;
    if (result < 0)
        return -1;
    int want_out = result == 0;
    if (want_out != rc->want_out) {
        rc->want_out = want_out;
        fv_wire_epoll_set(rc->fd, rc->id, want_out, EPOLL_CTL_MOD);
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
        fv_wire_nodelay(fd);
        rc->fd = fd;
        rc->id = fv.next_conn_id++;
        rc->next = fv.resp_conns;
        fv.resp_conns = rc;
        fv_wire_epoll_set(fd, rc->id, 0, EPOLL_CTL_ADD);
    }
}

/* ------------------------------------------------------------ service */

static void fault_timers(uint64_t now)
{
    if (fv.knobs.port_down_after_ms >= 0 && !fv.port_down &&
        now - fv.first_open_ms >= (uint64_t)fv.knobs.port_down_after_ms) {
        fv.port_down = 1;
        fv_log("port DOWN on purpose (FAKEVERBS_PORT_DOWN_AFTER_MS, device %d; -1: all)",
               fv.knobs.port_down_device);
        for (struct fv_context *ctx = fv.contexts; ctx != NULL; ctx = ctx->next)
            if (fv_device_port_down(fv_context_device(&ctx->ibctx)))
                fv_async_post_ctx(ctx, IBV_EVENT_PORT_ERR, NULL);
        for (struct fv_qp *qp = fv.qps; qp != NULL; qp = qp->next)
            if (fv_device_port_down(fv_context_device(qp->ibqp.context)))
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
                fv_req_event(qp, ev->events, now);
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
            fv_req_progress(qp, now);
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

void fv_wire_region_gone(uint32_t rkey)
{
    for (struct fv_resp_conn *rc = fv.resp_conns; rc != NULL; rc = rc->next) {
        if (rc->target == NULL || rc->payload_left == 0 || rc->hdr.rkey != rkey ||
            (rc->hdr.opcode != IBV_WR_RDMA_WRITE && rc->hdr.opcode != IBV_WR_RDMA_WRITE_WITH_IMM))
            continue;
        fv_log("a write into a region deregistered under it: the rest of its %u bytes is "
               "dropped and the requester gets a remote access error",
               rc->hdr.length);
        rc->target = NULL;
        rc->verdict = FV_NAK_ACCESS;
    }
}

void fv_wire_forget_inherited(void)
{
    for (struct fv_qp *qp = fv.qps; qp != NULL; qp = qp->next) {
        if (qp->conn.fd >= 0)
            close(qp->conn.fd);
        qp->conn.fd = -1;
    }
    for (struct fv_resp_conn *rc = fv.resp_conns; rc != NULL; rc = rc->next) {
        close(rc->fd);
        rc->fd = -1;
    }
    close_fds();
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
    fv_wire_epoll_set(fv.wake_fd, FV_ID_WAKE, 0, EPOLL_CTL_ADD);
    fv_wire_epoll_set(fv.listen_fd, FV_ID_LISTEN, 0, EPOLL_CTL_ADD);
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
