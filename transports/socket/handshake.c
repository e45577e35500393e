/*
 * The socket transport's connection handshake. The receiver's setup writes
 * {listener address, random 64-bit connection id, socket count}; the
 * sender's connect opens that many sockets to the listener and presents a
 * hello {magic, rank, id, index, count} on each. The receiver's connect
 * accepts until its own connection is complete; sockets of other
 * connectors of this communicator are attached to them on the way (the
 * pending list, under accept_lock), strangers are closed.
 */
#include <assert.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "src/util/host.h"
#include "src/util/log.h"
#include "src/util/time.h"
#include "transports/socket/conn.h"

static int aborted(const int *abort_flag)
{
    return abort_flag && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE);
}

/* The core's verdict on a peer a connect waits for (gone, gave up, out of
 * time), or cfxSuccess. */
static cfxResult_t check_peer(const struct cfx_sock_ctx *ctx, int peer_rank)
{
    return ctx->connect_check ? ctx->connect_check(ctx->connect_check_arg, peer_rank) : cfxSuccess;
}

/* Receiver: a fresh connection id, unique among those still awaited. */
cfxResult_t cfx_sock_conn_id_pick(struct cfx_sock_ctx *ctx, uint64_t *id_p)
{
    for (;;) {
        uint64_t id;
        cfxResult_t res = cfx_host_random(&id, sizeof(id));
        if (res != cfxSuccess)
            return res;
        int taken = id == 0;
        for (struct cfx_sock_conn *sc = ctx->awaiting; sc && !taken; sc = sc->await_next)
            taken = sc->conn_id == id;
        if (!taken) {
            *id_p = id;
            return cfxSuccess;
        }
    }
}

void cfx_sock_awaiting_remove(struct cfx_sock_ctx *ctx, struct cfx_sock_conn *sc)
{
    for (struct cfx_sock_conn **link = &ctx->awaiting; *link; link = &(*link)->await_next)
        if (*link == sc) {
            *link = sc->await_next;
            break;
        }
    sc->awaiting = 0;
}

/* Close a socket that is not one of ours, saying why. */
static void stranger_drop(struct cfx_sock_pending *p, const char *why)
{
    union cfx_sockaddr from;
    socklen_t len = sizeof(from);
    char where[80] = "?";
    if (getpeername(p->fd, &from.sa, &len) == 0)
        cfx_socket_addr_format(&from, where, sizeof(where));
    CFX_WARN(CFX_LOG_NET, "socket transport: closed a connection from %s: %s", where, why);
    cfx_socket_close(&p->fd);
}

/* A complete hello: attach the socket to its connector, or drop it. */
static void hello_dispatch(struct cfx_sock_ctx *ctx, struct cfx_sock_pending *p)
{
    const struct cfx_sock_hello *hello = &p->hello;
    if (hello->magic != CFX_SOCK_HELLO_MAGIC) {
        stranger_drop(p, cfx_sock_hello_refusal(hello, -1, 0));
        return;
    }
    struct cfx_sock_conn *sc = ctx->awaiting;
    while (sc && sc->conn_id != hello->conn_id)
        sc = sc->await_next;
    if (sc == NULL) {
        stranger_drop(p, "unknown connection id");
        return;
    }
    const char *refusal = cfx_sock_hello_refusal(hello, sc->peer_rank, sc->nsocks);
    if (refusal != NULL || sc->streams[hello->index].fd >= 0) {
        char why[200];
        snprintf(why, sizeof(why),
                 "bad hello for the connection from rank %d (%s: rank %d, socket %u of %u)",
                 sc->peer_rank, refusal ? refusal : "a second socket with that index", hello->rank,
                 hello->index, hello->count);
        stranger_drop(p, why);
        return;
    }
    int one = 1;
    setsockopt(p->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sc->streams[hello->index].fd = p->fd;
    sc->n_arrived++;
    p->fd = -1;
}

/* Accept what waits on the listener, read hellos, attach the finished ones
 * to their connectors (caller holds accept_lock). */
static void accept_service(struct cfx_sock_ctx *ctx)
{
    int64_t now = cfx_time_now_ns();
    for (;;) {
        int fd = accept4(ctx->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                CFX_WARN(CFX_LOG_NET, "socket transport: accept on %s failed: %s", ctx->listen_text,
                         strerror(errno));
            break;
        }
        if (ctx->n_pending == MAX_PENDING) {
            stranger_drop(&ctx->pending[0], "too many connections owe their hello");
            ctx->pending[0] = ctx->pending[--ctx->n_pending];
        }
        ctx->pending[ctx->n_pending++] = (struct cfx_sock_pending){.fd = fd, .since_ns = now};
    }
    for (int i = 0; i < ctx->n_pending;) {
        struct cfx_sock_pending *p = &ctx->pending[i];
        ssize_t n =
            recv(p->fd, (char *)&p->hello + p->got, sizeof(p->hello) - p->got, MSG_DONTWAIT);
        if (n > 0) {
            p->got += (size_t)n;
            if (p->got == sizeof(p->hello))
                hello_dispatch(ctx, p);
        } else if (n == 0) {
            stranger_drop(p, "closed before its hello");
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            stranger_drop(p, "failed before its hello");
        } else if (now - p->since_ns > HELLO_TIMEOUT_NS) {
            stranger_drop(p, "no hello in time");
        }
        if (p->fd < 0)
            *p = ctx->pending[--ctx->n_pending];
        else
            i++;
    }
}

/* Receiver: accept until every socket of @p sc has arrived. */
cfxResult_t cfx_sock_connect_recv(struct cfx_sock_ctx *ctx, struct cfx_sock_conn *sc,
                                  const struct cfx_sock_info *info)
{
    const char *why = cfx_sock_info_refusal(info, CFX_CONN_RECV, sc->peer_rank);
    if (why != NULL)
        return cfx_error_set(cfxInternalError, CFX_LOG_NET,
                             "socket transport: the connect info from rank %d is not a socket "
                             "sender's (%s: magic 0x%08x, rank %d)",
                             sc->peer_rank, why, info->magic, info->rank);
    cfxResult_t res = cfxSuccess;
    int64_t deadline = cfx_time_deadline_s(ctx->connect_timeout_s);
    pthread_mutex_lock(&ctx->accept_lock);
    for (;;) {
        accept_service(ctx);
        if (sc->n_arrived == sc->nsocks)
            break;
        if (aborted(ctx->abort_flag)) {
            res = cfx_error_set(cfxRemoteError, CFX_LOG_NET,
                                "socket transport: rank %d aborted while waiting for rank %d to "
                                "connect",
                                ctx->rank, sc->peer_rank);
            goto out_unlock;
        }
        res = check_peer(ctx, sc->peer_rank);
        if (res != cfxSuccess)
            goto out_unlock;
        if (cfx_time_now_ns() >= deadline) {
            res = cfx_error_set(cfxTimeout, CFX_LOG_NET,
                                "socket transport: rank %d did not open its connection to rank %d "
                                "(%d of %d sockets arrived at %s within %lld s); check that rank "
                                "%d is running and can reach this address (CFX_SOCKET_IFNAME)",
                                sc->peer_rank, ctx->rank, sc->n_arrived, sc->nsocks,
                                ctx->listen_text, (long long)ctx->connect_timeout_s, sc->peer_rank);
            goto out_unlock;
        }
        struct pollfd fds[1 + MAX_PENDING];
        int n_fds = 0;
        fds[n_fds++] = (struct pollfd){.fd = ctx->listen_fd, .events = POLLIN};
        for (int i = 0; i < ctx->n_pending; i++)
            fds[n_fds++] = (struct pollfd){.fd = ctx->pending[i].fd, .events = POLLIN};
        pthread_mutex_unlock(&ctx->accept_lock);
        /* Another thread may close a pending fd meanwhile: a spurious wake at worst. */
        poll(fds, (nfds_t)n_fds, cfx_time_left_ms(deadline, ACCEPT_SLICE_MS));
        pthread_mutex_lock(&ctx->accept_lock);
    }
    cfx_sock_awaiting_remove(ctx, sc);
out_unlock:
    pthread_mutex_unlock(&ctx->accept_lock);
    return res;
}

/* Sender: open the receiver's socket count to its listener, say hello on each. */
cfxResult_t cfx_sock_connect_send(struct cfx_sock_ctx *ctx, struct cfx_sock_conn *sc,
                                  const struct cfx_sock_info *info)
{
    union cfx_sockaddr addr;
    const char *why = cfx_sock_info_refusal(info, CFX_CONN_SEND, sc->peer_rank);
    if (why != NULL || cfx_socket_addr_from_wire(&info->addr, &addr) != cfxSuccess)
        return cfx_error_set(cfxInternalError, CFX_LOG_NET,
                             "socket transport: the connect info from rank %d is not a socket "
                             "receiver's (%s: magic 0x%08x, rank %d, %u sockets)",
                             sc->peer_rank, why ? why : "bad address", info->magic, info->rank,
                             info->nsocks);
    sc->nsocks = (int)info->nsocks;
    sc->conn_id = info->conn_id;
    char where[80], peer[120];
    cfx_socket_addr_format(&addr, where, sizeof(where));
    snprintf(peer, sizeof(peer), "rank %d at %s", sc->peer_rank, where);
    int64_t deadline = cfx_time_deadline_s(ctx->connect_timeout_s);
    for (int s = 0; s < sc->nsocks; s++) {
        cfxResult_t res;
        /* In slices, asking the core between them whether the peer is still there. */
        for (;;) {
            int64_t slice = cfx_time_now_ns() + ACCEPT_SLICE_MS * CFX_NS_PER_MS;
            res = cfx_socket_connect(&addr, slice < deadline ? slice : deadline, ctx->abort_flag,
                                     &sc->streams[s].fd);
            if (res != cfxTimeout || cfx_time_now_ns() >= deadline)
                break;
            cfxResult_t verdict = check_peer(ctx, sc->peer_rank);
            if (verdict != cfxSuccess)
                return verdict;
            cfx_error_thread_clear();
        }
        if (res == cfxTimeout)
            return cfx_error_set(res, CFX_LOG_NET,
                                 "socket transport: %s did not accept connection %d of %d from "
                                 "rank %d within %lld s; check that rank %d is running and "
                                 "reachable (CFX_SOCKET_IFNAME)",
                                 peer, s + 1, sc->nsocks, ctx->rank,
                                 (long long)ctx->connect_timeout_s, sc->peer_rank);
        if (res != cfxSuccess) {
            char cause[CFX_ERROR_MAX];
            snprintf(cause, sizeof(cause), "%s", cfx_error_thread_last());
            return cfx_error_set(res, CFX_LOG_NET,
                                 "socket transport: rank %d cannot connect to %s: %s", ctx->rank,
                                 peer, cause);
        }
        int one = 1;
        setsockopt(sc->streams[s].fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        struct cfx_sock_hello hello = {CFX_SOCK_HELLO_MAGIC, ctx->rank, sc->conn_id, (uint32_t)s,
                                       (uint32_t)sc->nsocks};
        res = cfx_socket_send_all(sc->streams[s].fd, &hello, sizeof(hello), deadline,
                                  ctx->abort_flag, peer);
        if (res != cfxSuccess)
            return res;
    }
    return cfxSuccess;
}
