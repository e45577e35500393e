/*
 * fake-verbs requester side: how a QP finds its destination and sends to it.
 * The registry (files under FAKEVERBS_DIR, one per QP number, created with
 * O_EXCL) tells which process owns a QP number and where its service
 * listens; the requester checks the address vector against that device,
 * connects, sends the queued WQEs in order, rewinds on a NAK (go-back-N:
 * RNR, destination not ready) and completes WQEs as the answers arrive.
 * Runs on the service thread (wire.c) under fv.lock. See fakeverbs.h.
 */
#include "fakeverbs.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define FV_QPN_MIN         0x100
#define FV_QPN_MASK        0xFFFFFF
#define FV_QPN_TRIES       256
#define FV_RNR_FOREVER     7
#define FV_TIMEOUT_UNIT_NS 4096ull

/* ------------------------------------------------------------ registry */

static int pid_alive(pid_t pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH);
}

static void registry_path(uint32_t qpn, char *path, size_t size)
{
    snprintf(path, size, "%s/qp-%06x", fv.knobs.dir, qpn);
}

static int gid_parse(const char *hex, union ibv_gid *gid)
{
    if (strlen(hex) != 32)
        return -1;
    for (int i = 0; i < 16; i++) {
        unsigned byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1)
            return -1;
        gid->raw[i] = (uint8_t)byte;
    }
    return 0;
}

static void gid_format(const union ibv_gid *gid, char hex[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", gid->raw[i]);
}

static int registry_read(const char *path, struct in_addr *addr_p, uint16_t *port_p, pid_t *pid_p,
                         uint16_t *lid_p, union ibv_gid *gids_p)
{
    int result = -1;
    FILE *file = fopen(path, "r");
    if (file == NULL)
        return -1;
    char ip[64], gid0[64], gid1[64];
    unsigned port, lid;
    int pid;
    if (fscanf(file, "%63s %u %d %u %63s %63s", ip, &port, &pid, &lid, gid0, gid1) != 6)
        goto out_close;
    if (inet_pton(AF_INET, ip, addr_p) != 1 || gid_parse(gid0, &gids_p[0]) != 0 ||
        gid_parse(gid1, &gids_p[1]) != 0)
        goto out_close;
    *port_p = (uint16_t)port;
    *pid_p = (pid_t)pid;
    *lid_p = (uint16_t)lid;
    result = 0;
out_close:
    fclose(file);
    return result;
}

int fv_registry_lookup(uint32_t qpn, struct in_addr *addr_p, uint16_t *port_p, pid_t *pid_p,
                       uint16_t *lid_p, union ibv_gid *gids_p)
{
    char path[320];
    registry_path(qpn, path, sizeof(path));
    return registry_read(path, addr_p, port_p, pid_p, lid_p, gids_p);
}

/* Remove the files of dead processes (a crashed test leaves them). */
void fv_registry_reclaim(void)
{
    DIR *dir = opendir(fv.knobs.dir);
    if (dir == NULL)
        return;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (strncmp(entry->d_name, "qp-", 3) != 0)
            continue;
        char path[600];
        snprintf(path, sizeof(path), "%s/%s", fv.knobs.dir, entry->d_name);
        struct in_addr addr;
        uint16_t port, lid;
        pid_t pid;
        union ibv_gid gids[2];
        if (registry_read(path, &addr, &port, &pid, &lid, gids) == 0 && !pid_alive(pid))
            unlink(path);
    }
    closedir(dir);
}

int fv_registry_add_qp(int dev, uint32_t *qpn_p)
{
    char ip[INET_ADDRSTRLEN], gid0[33], gid1[33];
    inet_ntop(AF_INET, &fv.ident.addr, ip, sizeof(ip));
    union ibv_gid gid;
    fv_device_gid(dev, 0, &gid);
    gid_format(&gid, gid0);
    fv_device_gid(dev, 1, &gid);
    gid_format(&gid, gid1);
    for (int attempt = 0; attempt < FV_QPN_TRIES; attempt++) {
        uint32_t qpn = fv_random_u32() & FV_QPN_MASK;
        if (qpn < FV_QPN_MIN)
            continue;
        char path[320];
        registry_path(qpn, path, sizeof(path));
        int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
        if (fd < 0) {
            if (errno != EEXIST)
                return -1;
            continue;
        }
        char line[256];
        int len = snprintf(line, sizeof(line), "%s %u %d %u %s %s\n", ip, fv.listen_port,
                           (int)getpid(), fv_device_lid(dev), gid0, gid1);
        int ok = write(fd, line, (size_t)len) == len;
        close(fd);
        if (!ok) {
            unlink(path);
            return -1;
        }
        *qpn_p = qpn;
        return 0;
    }
    errno = EAGAIN;
    return -1;
}

void fv_registry_remove_qp(uint32_t qpn)
{
    char path[320];
    registry_path(qpn, path, sizeof(path));
    unlink(path);
}

/* At exit: the files of this process's QPs (never a forked parent's). */
__attribute__((destructor)) static void registry_cleanup_at_exit(void)
{
    pthread_mutex_lock(&fv.lock);
    for (struct fv_qp *qp = fv.qps; qp != NULL; qp = qp->next) {
        struct in_addr addr;
        uint16_t port, lid;
        pid_t pid;
        union ibv_gid gids[2];
        if (qp->registered &&
            fv_registry_lookup(qp->ibqp.qp_num, &addr, &port, &pid, &lid, gids) == 0 &&
            pid == getpid())
            fv_registry_remove_qp(qp->ibqp.qp_num);
    }
    pthread_mutex_unlock(&fv.lock);
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
    if (!pid_alive(pid)) {
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
    fv_wire_nodelay(conn->fd);
    if (connect(conn->fd, (struct sockaddr *)&peer, sizeof(peer)) != 0 && errno != EINPROGRESS) {
        fv_log("QP 0x%x -> 0x%x: connect: %s", qp->ibqp.qp_num, qp->dest_qpn, strerror(errno));
        fv_qp_fail_head(qp, IBV_WC_RETRY_EXC_ERR);
        return;
    }
    conn->id = FV_ID_REQ_BIT | fv.next_conn_id++;
    conn->state = FV_CONN_CONNECTING;
    conn->want_out = 1;
    fv_wire_epoll_set(conn->fd, conn->id, 1, EPOLL_CTL_ADD);
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

/* Send what is queued; stops at a WQE that fails locally. */
static void req_send(struct fv_qp *qp, uint64_t now)
{
    struct fv_req_conn *conn = &qp->conn;
    struct fv_hello hello = {.magic = FV_HELLO_MAGIC,
                             .dest_qpn = qp->dest_qpn,
                             .src_qpn = qp->ibqp.qp_num,
                             .first_seq = qp->sq_sent};
    int rc = fv_wire_send_part(conn->fd, &hello, sizeof(hello), &conn->hello_off);
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
                                 .length = wqe->length,
                                 .local_addr = (uint64_t)(uintptr_t)wqe->read_to};
        /* A read sends its request only; the responder puts the bytes. */
        uint32_t payload = wqe->opcode == IBV_WR_RDMA_READ ? 0 : wqe->length;
        size_t total = sizeof(hdr) + payload;
        size_t off = conn->tx_off;
        if (off < sizeof(hdr))
            rc = fv_wire_send_part(conn->fd, &hdr, sizeof(hdr), &off);
        if (rc == 1 && payload > 0) {
            size_t payload_off = off - sizeof(hdr);
            rc = fv_wire_send_part(conn->fd, wqe->payload, payload, &payload_off);
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
        fv_wire_epoll_set(conn->fd, conn->id, want_out, EPOLL_CTL_MOD);
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
void fv_req_event(struct fv_qp *qp, uint32_t events, uint64_t now)
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

void fv_req_progress(struct fv_qp *qp, uint64_t now)
{
    if (qp->ibqp.state != IBV_QPS_RTS || (qp->sq_sent == qp->sq_tail && !qp->conn.rewind_pending))
        return;
    if (qp->conn.state == FV_CONN_NONE || qp->conn.state == FV_CONN_WAIT_DEST)
        req_connect(qp, now);
    if (qp->ibqp.state == IBV_QPS_RTS && qp->conn.state == FV_CONN_UP)
        req_send(qp, now);
}
