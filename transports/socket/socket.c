/*
 * The TCP socket transport: the ops table and each connector's life. Each
 * side of a connection has a local FIFO; the bytes of posted slots move
 * over TCP, striped across several sockets per connection (stream.c), and
 * fill the receiver's FIFO. The user side only posts, releases and kicks.
 * Files: socket.c (this: lifecycle, setup, connect, close, the data-path
 * ops), stream.c (the wire format and the passes that move bytes),
 * handshake.c (listener, connection ids, hellos), poison.c (a failed rank
 * stops its streams and says why); conn.h holds their shared types.
 *
 * Threads: bytes move in passes over a connector, made by whichever thread
 * asks first (cfx_sock_conn_drive: lock-free, a pass owed to a busy
 * connector is made by its holder): the user thread in kick() after a post
 * or release and in progress()/wait() while the executor waits, or the
 * process's proxy thread (src/proxy) for what nobody else moves. connect()
 * adds each connector to the proxy with its sockets (edge-triggered) and
 * close() removes it: once that returns the proxy no longer touches the
 * connector. While user threads move bytes they hold the proxy's lease, so
 * it naps on its eventfd alone.
 * Wire fields are in host order, as in the bootstrap: the magics catch a peer
 * of another build or byte order. docs/transports.md describes it all.
 */
#include "transports/socket/socket.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "src/proxy/proxy.h"
#include "src/util/cuda.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/socket.h"
#include "src/util/time.h"
#include "transports/socket/conn.h"
#include "transports/socket/wire.h"

CFX_PARAM_INT(nsocks_perthread, "NSOCKS_PERTHREAD", 2, 1, CFX_SOCK_MAX_SOCKS,
              "Socket transport: sockets per connection per helper thread (NCCL meaning)");
CFX_PARAM_INT(socket_nthreads, "SOCKET_NTHREADS", 1, 1, CFX_SOCK_MAX_SOCKS,
              "Socket transport: helper threads per connection; sockets = NSOCKS_PERTHREAD x "
              "SOCKET_NTHREADS (one progress thread serves them all)");
CFX_PARAM_INT(socket_spin_us, "SOCKET_SPIN_US", 0, 0, 1000000,
              "Socket transport: microseconds the (process-wide) progress thread spins when idle "
              "before it sleeps");

/* Zeroed memory aligned for the _Alignas members of conn.h (calloc gives 16). */
static void *zalloc_aligned(size_t bytes)
{
    void *mem = NULL;
    if (posix_memalign(&mem, CFX_CACHE_LINE, bytes) != 0)
        return NULL;
    memset(mem, 0, bytes);
    return mem;
}

/* The proxy's pass over one connector (proxy thread, under its lock). */
static int conn_proxy_progress(void *arg)
{
    struct cfx_sock_conn *sc = arg;
    int moved = cfx_sock_conn_drive(sc);
    if (sc->pinned) /* A GPU rank's connector: its kernel never kicks. */
        atomic_store_explicit(&sc->client.poll_ns,
                              cfx_proxy_kernel_poll_ns(&sc->moved_ns, moved, cfx_time_now_ns()),
                              memory_order_relaxed);
    return moved;
}

/* A socket of the connector turned ready (proxy thread): a sender's socket
 * readable means the receiver wrote back (a poison) or closed. */
static void conn_proxy_ready(void *arg, uint32_t events)
{
    struct cfx_sock_conn *sc = arg;
    if (sc->dir == CFX_CONN_SEND && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
        atomic_store_explicit(&sc->probe_owed, 1, memory_order_relaxed);
        cfx_sock_conn_drive(sc);
    }
}

/* Hand a connected connector to the process's proxy thread. */
static cfxResult_t proxy_add(struct cfx_sock_ctx *ctx, struct cfx_sock_conn *sc)
{
    int fds[MAX_SOCKS];
    for (int s = 0; s < sc->nsocks; s++)
        fds[s] = sc->streams[s].fd;
    sc->client.progress = conn_proxy_progress;
    sc->client.ready = conn_proxy_ready;
    sc->client.arg = sc;
    atomic_store_explicit(&sc->client.poll_ns, sc->pinned ? CFX_PROXY_KERNEL_FAST_NS : 0,
                          memory_order_relaxed);
    uint32_t events = EPOLLIN | EPOLLRDHUP | (sc->dir == CFX_CONN_SEND ? EPOLLOUT : 0);
    cfxResult_t res = cfx_proxy_add(ctx->proxy, &sc->client, fds, sc->nsocks, events);
    if (res != cfxSuccess) {
        char cause[CFX_ERROR_MAX];
        snprintf(cause, sizeof(cause), "%s", cfx_error_thread_last());
        return cfx_error_set(res, CFX_LOG_NET,
                             "socket transport: cannot hand the connection to rank %d to the "
                             "progress thread: %s",
                             sc->peer_rank, cause);
    }
    sc->registered = 1;
    return cfxSuccess;
}

/* Take a connector back: once this returns the proxy never touches it. */
static void proxy_remove(struct cfx_sock_ctx *ctx, struct cfx_sock_conn *sc)
{
    cfx_proxy_remove(ctx->proxy, &sc->client);
    sc->registered = 0;
}

/* ============================================================ lifecycle */

static void sock_fini(void *ctx_v);

/* Listen where the core asked (env->listen_ifaddr), else where CFX_SOCKET_IFNAME says. */
static cfxResult_t listen_open(struct cfx_sock_ctx *ctx, const char *ifaddr)
{
    union cfx_sockaddr addr;
    char ifname[64] = "";
    cfxResult_t res;
    if (ifaddr && ifaddr[0]) {
        char text[300];
        snprintf(text, sizeof(text), strchr(ifaddr, ':') ? "[%s]:0" : "%s:0", ifaddr);
        res = cfx_socket_addr_parse(text, &addr);
        snprintf(ifname, sizeof(ifname), "given");
    } else {
        res = cfx_socket_pick_address(&addr, ifname, sizeof(ifname));
    }
    if (res != cfxSuccess)
        return res;
    res = cfx_socket_listen(&addr, &ctx->listen_fd, &ctx->listen_addr);
    if (res != cfxSuccess)
        return res;
    char where[80];
    cfx_socket_addr_format(&ctx->listen_addr, where, sizeof(where));
    snprintf(ctx->listen_text, sizeof(ctx->listen_text), "%s (%s)", where, ifname);
    return cfxSuccess;
}

/* Per-communicator state: a listener, and a reference on the process's
 * proxy (which starts its thread for the first user). Blocks briefly. */
static cfxResult_t sock_init(const struct cfx_transport_env *env, void **ctx_p)
{
    cfxResult_t res;
    struct cfx_sock_ctx *ctx = zalloc_aligned(sizeof(*ctx));
    if (ctx == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_NET, "socket transport: out of memory");
    ctx->rank = env->rank;
    ctx->abort_flag = env->abort_flag;
    ctx->connect_timeout_s = env->connect_timeout_s;
    ctx->connect_check = env->connect_check;
    ctx->connect_check_arg = env->connect_check_arg;
    ctx->listen_fd = -1;
    pthread_mutex_init(&ctx->accept_lock, NULL);
    int64_t per_thread = param_nsocks_perthread(), threads = param_socket_nthreads();
    per_thread = per_thread < 1 ? 1 : per_thread > MAX_SOCKS ? MAX_SOCKS : per_thread;
    threads = threads < 1 ? 1 : threads > MAX_SOCKS ? MAX_SOCKS : threads;
    ctx->nsocks = per_thread * threads > MAX_SOCKS ? MAX_SOCKS : (int)(per_thread * threads);
    int64_t spin_us = param_socket_spin_us();
    int64_t spin_ns = spin_us < 0 ? 0 : spin_us * 1000;

    ctx->pending = calloc(MAX_PENDING, sizeof(*ctx->pending));
    if (ctx->pending == NULL) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_NET, "socket transport: out of memory");
        goto err_fini;
    }
    res = listen_open(ctx, env->listen_ifaddr);
    if (res != cfxSuccess)
        goto err_fini;
    res = cfx_proxy_get(spin_ns, &ctx->proxy);
    if (res != cfxSuccess)
        goto err_fini;
    CFX_INFO(CFX_LOG_NET, "socket transport: rank %d listens on %s, %d socket(s) per connection",
             ctx->rank, ctx->listen_text, ctx->nsocks);
    *ctx_p = ctx;
    return cfxSuccess;

err_fini:
    sock_fini(ctx);
    return res;
}

/* Gives back the proxy (the last user stops its thread), closes everything,
 * frees; accepts NULL and half-built state. Connectors must have been
 * closed. Never blocks on peers. */
static void sock_fini(void *ctx_v)
{
    struct cfx_sock_ctx *ctx = ctx_v;
    if (ctx == NULL)
        return;
    cfx_proxy_put(ctx->proxy); /* close() every connector before fini(). */
    for (int i = 0; i < ctx->n_pending; i++)
        cfx_socket_close(&ctx->pending[i].fd);
    cfx_socket_close(&ctx->listen_fd);
    free(ctx->pending);
    pthread_mutex_destroy(&ctx->accept_lock);
    free(ctx);
}

/* ============================================================ connection */

/* Any two ranks that can reach each other over TCP, except ranks on
 * different hosts under CFX_NET=IB (verbs only there). Pure. */
static int sock_can_connect(void *ctx, const struct cfx_transport_peer *self,
                            const struct cfx_transport_peer *peer)
{
    (void)ctx;
    (void)self;
    return peer->path != CFX_PATH_CLASS_NET || cfx_transport_net_choice() != CFX_NET_IB;
}

/* Allocates and touches this side's FIFO; the receiver also gets a
 * connection id and waits on the ctx's list for its sockets. Writes a
 * struct cfx_sock_info to @p info_out. Does not block on the peer. */
static cfxResult_t sock_setup(void *ctx_v, const struct cfx_transport_peer *peer, size_t slot_bytes,
                              int n_steps, struct cfx_connector *conn, void *info_out)
{
    struct cfx_sock_ctx *ctx = ctx_v;
    assert(n_steps >= 1 && n_steps <= CFX_MAX_STEPS && slot_bytes > 0);
    if (slot_bytes > (SIZE_MAX - cfx_fifo_slots_offset()) / (size_t)n_steps)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_NET,
                             "socket transport: %d slots of %zu bytes do not fit in memory",
                             n_steps, slot_bytes);
    size_t bytes = cfx_fifo_slots_offset() + (size_t)n_steps * slot_bytes;
    struct cfx_sock_conn *sc = zalloc_aligned(sizeof(*sc));
    if (sc == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_NET, "socket transport: out of memory");
    for (int s = 0; s < MAX_SOCKS; s++)
        sc->streams[s].fd = -1;
    if (posix_memalign(&sc->mem, 4096, bytes) != 0) {
        free(sc);
        return cfx_error_set(cfxSystemError, CFX_LOG_NET,
                             "socket transport: out of memory for a %zu-byte FIFO to rank %d",
                             bytes, peer->rank);
    }
    memset(sc->mem, 0, bytes); /* Touch every page now, never on the data path. */
    sc->slot_meta = calloc((size_t)n_steps, sizeof(*sc->slot_meta));
    if (sc->slot_meta == NULL) {
        free(sc->mem);
        free(sc);
        return cfx_error_set(cfxSystemError, CFX_LOG_NET, "socket transport: out of memory");
    }
    if (conn->place.reader == CFX_READER_KERNEL) {
        /* A GPU rank: its kernel reads and writes this FIFO; the proxy
         * moves it over TCP (polling: a kernel cannot kick). */
        cfxResult_t res =
            conn->place.mem != CFX_MEM_HOST_PINNED
                ? cfx_error_set(cfxInvalidUsage, CFX_LOG_NET,
                                "socket transport: a FIFO a kernel reads must be pinned host "
                                "memory (connection with rank %d)",
                                peer->rank)
                : cfx_cuda_host_register(sc->mem, bytes, conn->place.device);
        if (res != cfxSuccess) {
            free(sc->slot_meta);
            free(sc->mem);
            free(sc);
            return res;
        }
        sc->pinned = conn->place.device + 1;
    }
    sc->dir = conn->dir;
    sc->self_rank = ctx->rank;
    sc->peer_rank = peer->rank;
    sc->blame_rank = -1;
    sc->fifo = sc->mem;
    sc->slots = (char *)sc->mem + cfx_fifo_slots_offset();
    sc->slot_bytes = slot_bytes;
    sc->n_steps = n_steps;
    cfx_store_relaxed_u64(&sc->fifo->tail, 0);
    cfx_store_relaxed_u64(&sc->fifo->head, 0);

    struct cfx_sock_info info = {.magic = CFX_SOCK_INFO_MAGIC_SEND, .rank = ctx->rank};
    if (sc->dir == CFX_CONN_RECV) {
        pthread_mutex_lock(&ctx->accept_lock);
        cfxResult_t res = cfx_sock_conn_id_pick(ctx, &sc->conn_id);
        if (res == cfxSuccess) {
            sc->nsocks = ctx->nsocks;
            sc->await_next = ctx->awaiting;
            ctx->awaiting = sc;
            sc->awaiting = 1;
        }
        pthread_mutex_unlock(&ctx->accept_lock);
        if (res != cfxSuccess) {
            free(sc->slot_meta);
            free(sc->mem);
            free(sc);
            return res;
        }
        info.magic = CFX_SOCK_INFO_MAGIC_RECV;
        info.nsocks = (uint32_t)sc->nsocks;
        info.conn_id = sc->conn_id;
        cfx_socket_addr_to_wire(&ctx->listen_addr, &info.addr);
    }
    memcpy(info_out, &info, sizeof(info));
    cfx_connector_set_fifo(conn, sc->fifo, sc->slots, slot_bytes, n_steps);
    conn->peer_rank = peer->rank;
    conn->priv = sc;
    return cfxSuccess;
}

/* Finish a connector: the sender connects and says hello; the receiver
 * accepts until all its sockets have arrived, keeping sockets of the ctx's
 * other connectors for their own connect(). Blocks up to
 * env.connect_timeout_s (cfxTimeout) or until the abort flag
 * (cfxRemoteError); both name the peer. On success the progress thread owns
 * the data path. On failure, close() the connector. */
static cfxResult_t sock_connect(void *ctx_v, struct cfx_connector *conn, const void *peer_info)
{
    struct cfx_sock_ctx *ctx = ctx_v;
    struct cfx_sock_conn *sc = conn->priv;
    struct cfx_sock_info info;
    memcpy(&info, peer_info, sizeof(info));
    cfxResult_t res = sc->dir == CFX_CONN_SEND ? cfx_sock_connect_send(ctx, sc, &info)
                                               : cfx_sock_connect_recv(ctx, sc, &info);
    if (res != cfxSuccess)
        return res;
    res = proxy_add(ctx, sc);
    if (res != cfxSuccess)
        return res;
    CFX_INFO(CFX_LOG_NET, "socket transport: rank %d %s rank %d connected over %d socket(s)",
             ctx->rank, sc->dir == CFX_CONN_SEND ? "->" : "<-", sc->peer_rank, sc->nsocks);
    return cfxSuccess;
}

/* Take the connector from the proxy (synchronously), close its sockets,
 * free its FIFO. Half-built connectors too. Never blocks on the peer; slots
 * not yet on the wire after a brief linger are lost. */
static void sock_close(void *ctx_v, struct cfx_connector *conn)
{
    struct cfx_sock_ctx *ctx = ctx_v;
    struct cfx_sock_conn *sc = conn->priv;
    if (sc == NULL)
        return;
    if (sc->registered) {
        cfx_sock_conn_linger(ctx, sc);
        proxy_remove(ctx, sc);
    }
    pthread_mutex_lock(&ctx->accept_lock);
    if (sc->awaiting)
        cfx_sock_awaiting_remove(ctx, sc);
    pthread_mutex_unlock(&ctx->accept_lock);
    for (int s = 0; s < MAX_SOCKS; s++)
        cfx_socket_close(&sc->streams[s].fd);
    if (sc->ref_slots > 0)
        CFX_INFO(CFX_LOG_NET,
                 "socket transport: rank %d -> rank %d sent %llu slot(s) from user buffers",
                 sc->self_rank, sc->peer_rank, (unsigned long long)sc->ref_slots);
    if (sc->in_place_slots > 0)
        CFX_INFO(CFX_LOG_NET,
                 "socket transport: rank %d <- rank %d received %llu slot(s) into user buffers",
                 sc->self_rank, sc->peer_rank, (unsigned long long)sc->in_place_slots);
    if (sc->pinned)
        cfx_cuda_host_unregister(sc->mem, sc->pinned - 1);
    free(sc->slot_meta);
    free(sc->mem);
    free(sc);
    cfx_connector_forget(conn);
}

/* ============================================================ data path */

/* The executor waits on this connector: do the progress thread's work
 * here, which saves a thread hand-off per slot each way. */
static int sock_progress(void *ctx_v, struct cfx_connector *conn)
{
    struct cfx_sock_conn *sc = conn->priv;
    if (sc == NULL || !sc->registered)
        return 0;
    cfx_proxy_lease(((struct cfx_sock_ctx *)ctx_v)->proxy, cfx_time_now_ns() + DRIVE_LEASE_NS);
    return cfx_sock_conn_drive(sc);
}

/* The executor has nothing to do until these connectors move: sleep in
 * the kernel on their sockets (receivers with room for data: readable;
 * senders with bytes still to send: writable), then move what came. On
 * loopback and veth a rank that spins on recv() delays its own packets
 * (round trips several times slower than sleeping in poll() here), so this
 * is how a socket rank waits. The progress thread keeps off meanwhile. */
static int sock_wait(void *ctx_v, struct cfx_connector *const *conns, int n_conns,
                     int64_t timeout_ns)
{
    struct cfx_sock_ctx *ctx = ctx_v;
    struct pollfd fds[WAIT_MAX_FDS];
    int nfds = 0;
    for (int c = 0; c < n_conns; c++) {
        struct cfx_sock_conn *sc = conns[c]->priv;
        if (sc == NULL || !sc->registered)
            continue;
        if (atomic_load_explicit(&sc->failed, memory_order_acquire) ||
            atomic_load_explicit(&sc->poison_reason, memory_order_relaxed))
            return 1; /* Let the caller see it. */
        short events = 0;
        uint64_t tail = cfx_load_acquire_u64(&sc->fifo->tail);
        uint64_t head = cfx_load_acquire_u64(&sc->fifo->head);
        if (sc->dir == CFX_CONN_RECV && tail - head < (uint64_t)sc->n_steps)
            events = POLLIN;
        else if (sc->dir == CFX_CONN_SEND && head != tail)
            events = POLLOUT;
        for (int s = 0; events && s < sc->nsocks && nfds < WAIT_MAX_FDS; s++)
            fds[nfds++] = (struct pollfd){.fd = sc->streams[s].fd, .events = events};
    }
    /* The lease covers the sleep: the progress thread naps on its eventfd. */
    cfx_proxy_lease(ctx->proxy, cfx_time_now_ns() + timeout_ns + DRIVE_LEASE_NS);
    if (nfds > 0) {
        struct timespec limit = {(time_t)(timeout_ns / CFX_NS_PER_SEC),
                                 (long)(timeout_ns % CFX_NS_PER_SEC)};
        ppoll(fds, (nfds_t)nfds, &limit, NULL);
    }
    cfx_proxy_lease(ctx->proxy, cfx_time_now_ns() + DRIVE_LEASE_NS);
    int moved = 0;
    for (int c = 0; c < n_conns; c++) {
        struct cfx_sock_conn *sc = conns[c]->priv;
        if (sc != NULL && sc->registered)
            moved |= cfx_sock_conn_drive(sc);
    }
    return moved;
}

/* After a post (sender) or release (receiver): move the bytes at once from
 * this thread (or leave them to the thread moving them now). Whatever that
 * leaves undone (a full socket buffer, data not yet arrived) raises an edge
 * on the progress thread's epoll set later, so no wake is needed. Never
 * blocks. */
static void sock_kick(void *ctx_v, struct cfx_connector *conn)
{
    sock_progress(ctx_v, conn);
}

/* Record the poison and wake the proxy, which sends it (poison.c). Never
 * blocks. */
static void sock_poison(void *ctx_v, struct cfx_connector *conn, cfxResult_t reason, int blame_rank)
{
    struct cfx_sock_conn *sc = conn->priv;
    if (sc == NULL)
        return;
    cfx_sock_conn_poison(sc, reason, blame_rank);
    cfx_proxy_wake(((struct cfx_sock_ctx *)ctx_v)->proxy);
}

/* cfxSuccess while healthy (one atomic load). Once a pass
 * failed the connector: its result (cfxRemoteError when the peer closed,
 * reset or broke the stream; cfxInvalidUsage for an oversized post), with
 * the sentence naming the peer recorded again in the caller's thread. */
static cfxResult_t sock_check(void *ctx_v, struct cfx_connector *conn)
{
    (void)ctx_v;
    struct cfx_sock_conn *sc = conn->priv;
    assert(sc != NULL);
    if (!atomic_load_explicit(&sc->failed, memory_order_acquire))
        return cfxSuccess;
    /* Slots that arrived before the failure are still good: let them be taken. */
    if (sc->dir == CFX_CONN_RECV && cfx_conn_can_take(conn))
        return cfxSuccess;
    conn->blame_rank = sc->blame_rank;
    return cfx_error_set(sc->failed_res, CFX_LOG_NET, "%s", sc->error);
}

/* The next slot's payload is the @p bytes at @p data, user memory: the
 * passes send it from there (no copy into the slot). The core posts the
 * slot right after; its send ends in a drain, so the memory is the user's
 * again once every slot is in the kernel. */
static cfxResult_t sock_post_ref(void *ctx_v, struct cfx_connector *conn, const void *data,
                                 size_t bytes, void *handle)
{
    (void)ctx_v;
    (void)bytes;
    (void)handle; /* CFX_REG_ANY_HOST: sendmsg reads any memory of ours. */
    struct cfx_sock_conn *sc = conn->priv;
    uint64_t tail = cfx_load_relaxed_u64(&sc->fifo->tail);
    struct cfx_sock_slot *meta = &sc->slot_meta[tail % (uint64_t)sc->n_steps];
    meta->ref = data;
    meta->ref_step = tail + 1;
    return cfxSuccess;
}

/* The next slot carries the bytes at @p offset of message @p msg: its
 * header says so, for the receiver's offer. */
static void sock_post_at(void *ctx_v, struct cfx_connector *conn, uint64_t msg, uint64_t offset)
{
    (void)ctx_v;
    struct cfx_sock_conn *sc = conn->priv;
    uint64_t tail = cfx_load_relaxed_u64(&sc->fifo->tail);
    struct cfx_sock_slot *meta = &sc->slot_meta[tail % (uint64_t)sc->n_steps];
    meta->at_msg = msg + 1;
    meta->at_offset = offset;
    meta->at_step = tail + 1;
}

/* Receive of message @p msg into the @p bytes at @p data: slots of it whose
 * header has not been read yet are received straight there (recv() into
 * the user's buffer, no copy out of the slot). Kept in a ring of
 * SOCK_OFFERS by message number; a later message's offer replaces it (its
 * remaining slots then come through the FIFO). The buffer is not touched
 * after the receive ends: it takes all of its slots, or fails, which
 * poisons the connector (cfx_sock_conn_poison). */
static cfxResult_t sock_offer(void *ctx_v, struct cfx_connector *conn, uint64_t msg, void *data,
                              size_t bytes, void *handle)
{
    (void)ctx_v;
    (void)handle;
    struct cfx_sock_conn *sc = conn->priv;
    struct cfx_sock_offer *o = &sc->offers[msg % SOCK_OFFERS];
    /* A seqlock without fences (TSan has none): the release stores keep
     * msg = 0 ahead of the new fields for any pass that sees them. */
    atomic_store_explicit(&o->msg, 0, memory_order_relaxed);
    atomic_store_explicit(&o->data, (uintptr_t)data, memory_order_release);
    atomic_store_explicit(&o->bytes, (uint64_t)bytes, memory_order_release);
    atomic_store_explicit(&o->msg, msg + 1, memory_order_release);
    return cfxSuccess;
}

const struct cfx_transport cfx_socket_transport = {
    .version = CFX_TRANSPORT_VERSION,
    .name = "socket",
    /* Kicks after host posts; FIFOs a kernel can use (pinned, polled). */
    .flags = CFX_TRANSPORT_FLAG_PROGRESS | CFX_TRANSPORT_FLAG_READER_KERNEL |
             CFX_TRANSPORT_FLAG_ANY_HOST_MEMORY,
    /* lifecycle */
    .init = sock_init,
    .fini = sock_fini,
    /* connection */
    .can_connect = sock_can_connect,
    .setup = sock_setup,
    .connect = sock_connect,
    .close = sock_close,
    /* data path */
    .kick = sock_kick,
    .poison = sock_poison,
    .check = sock_check,
    .progress = sock_progress,
    .wait = sock_wait,
    /* memory: no registration (the kernel copies any host memory), no peer mappings */
    .reg_mem = NULL,
    .dereg_mem = NULL,
    .flush = NULL,
    .map_peer = NULL,
    /* point to point straight from and into user buffers */
    .post_ref = sock_post_ref,
    .offer = sock_offer,
    .post_at = sock_post_at,
};
