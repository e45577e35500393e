/*
 * The TCP socket transport. Each side of a connection has a local FIFO; a
 * progress (proxy) thread per communicator moves posted slots over TCP,
 * striped across several sockets per connection, and fills the receiver's
 * FIFO. The user side only posts, releases and kicks.
 *
 * Connection: the receiver's setup writes {listener address, random 64-bit
 * connection id, socket count}; the sender's connect opens that many sockets
 * to the listener and presents a hello {magic, rank, id, index, count} on
 * each. The receiver's connect accepts until its own connection is complete;
 * sockets of other connectors of this communicator are attached to them on
 * the way (the stash), strangers are closed.
 *
 * Data: per slot, socket 0 carries a header {magic, step, size}, then the
 * payload is split in up to nsocks contiguous parts (at least MIN_PART_BYTES
 * each), part i on socket i. Every socket walks the slots in order on its
 * own, so several slots are in flight at once; a slot is released (sender)
 * or posted (receiver) when every socket is past it.
 *
 * Threads: bytes move in passes over a connector, made by whichever thread
 * asks first (conn_drive: lock-free, a pass owed to a busy connector is made
 * by its holder): the user thread in kick() after a post or release and in
 * progress()/wait() while the executor waits, or the progress thread for
 * what nobody else moves. The progress thread sleeps in epoll_wait
 * (edge-triggered sockets plus an eventfd); while user threads move bytes
 * themselves it naps on the eventfd alone. It holds proxy_lock while it walks
 * the connector list; register/unregister take it too, so once close()
 * returns the thread no longer touches the connector.
 * Wire fields are in host order, as in the bootstrap: the magics catch a peer
 * of another build or byte order. docs/transports.md describes it all.
 */
#include "transports/socket/socket.h"

#include <assert.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "src/proxy/proxy.h"
#include "src/util/error.h"
#include "src/util/host.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/socket.h"
#include "src/util/time.h"
#include "transports/socket/wire.h"

CFX_PARAM_INT(nsocks_perthread, "NSOCKS_PERTHREAD", 2, 1, CFX_SOCK_MAX_SOCKS,
              "Socket transport: sockets per connection per helper thread (NCCL meaning)");
CFX_PARAM_INT(socket_nthreads, "SOCKET_NTHREADS", 1, 1, CFX_SOCK_MAX_SOCKS,
              "Socket transport: helper threads per connection; sockets = NSOCKS_PERTHREAD x "
              "SOCKET_NTHREADS (one progress thread serves them all)");
CFX_PARAM_INT(socket_spin_us, "SOCKET_SPIN_US", 0, 0, 1000000,
              "Socket transport: microseconds the progress thread spins when idle before it "
              "sleeps");

#define MAX_SOCKS        CFX_SOCK_MAX_SOCKS /* Clamp of NSOCKS_PERTHREAD x SOCKET_NTHREADS. */
_Static_assert(MAX_SOCKS <= CFX_PROXY_MAX_FDS, "the proxy watches every socket of a connection");
#define MIN_PART_BYTES   (64 * 1024) /* Smallest stripe; smaller slots use socket 0 only. */
#define ACCEPT_SLICE_MS  50          /* Longest wait of connect() between checks. */
#define HELLO_TIMEOUT_NS (10 * CFX_NS_PER_SEC) /* A socket silent this long is a stranger. */
#define MAX_PENDING      256                   /* Accepted sockets still owing their hello. */
#define DRIVE_LEASE_NS   (200 * 1000) /* See cfx_proxy_lease. */
#define WAIT_MAX_FDS     64

/* One socket's walk through the slots. */
struct stream {
    int fd;
    uint64_t step; /* Next slot this socket works on. */
    size_t offset; /* Bytes of that slot's frame (header on socket 0, then the part) done. */
    int eof;       /* Receiver socket 0: the peer closed it between slots. */
};

/* Per-connector state. */
struct sock_conn {
    enum cfx_conn_dir dir;
    int self_rank;
    int peer_rank;
    struct cfx_fifo *fifo;
    char *slots;
    size_t slot_bytes;
    int n_steps;
    void *mem; /* The FIFO block: control block, then the slots. */
    uint64_t conn_id;
    int nsocks;
    struct stream streams[MAX_SOCKS];
    /* Connect (under the ctx's accept_lock). */
    int n_arrived; /* Receiver: sockets attached so far. */
    int awaiting;  /* Receiver: on the ctx's awaiting list. */
    struct sock_conn *await_next;
    /* Progress (the proxy's pass runs under the proxy's lock). */
    int registered; /* Added to the proxy (set and read by user threads). */
    struct cfx_proxy_client client;
    uint64_t done_step;           /* Sender: slots released; receiver: slots posted. */
    uint64_t header_count;        /* Receiver: headers read (sizes known). */
    struct cfx_sock_header header_in; /* Receiver: socket 0's header being read. */
    int poison_in;                /* Receiver: socket 0 brought a poison header. */
    cfxResult_t poison_in_reason;
    /* Poison: set by the user side (poison op); the progress thread finishes
     * what was posted, sends a poison header, and shuts the sockets down. */
    _Atomic int poison_reason;
    _Atomic int poison_blame;
    int poison_done;
    int64_t poison_deadline_ns;
    /* Who moves bytes: the progress thread or a user thread waiting on the
     * connector, whichever comes first (conn_drive). */
    _Alignas(CFX_CACHE_LINE) _Atomic int busy; /* A thread is moving bytes. */
    _Atomic int wanted;                        /* A pass is owed (by the busy thread). */
    _Atomic int probe_owed; /* Sender: a socket turned readable (the peer wrote back). */
    /* Failure: written by the progress thread, then `failed` is set (release). */
    _Alignas(CFX_CACHE_LINE) _Atomic int failed;
    cfxResult_t failed_res;
    int blame_rank;
    char error[CFX_ERROR_MAX];
};

/* An accepted socket that has not finished its hello. */
struct pending {
    int fd;
    size_t got;
    int64_t since_ns;
    struct cfx_sock_hello hello;
};

/* Per-communicator state. */
struct sock_ctx {
    int rank;
    const int *abort_flag;
    int64_t connect_timeout_s;
    cfxResult_t (*connect_check)(void *arg, int peer_rank); /* May be NULL. */
    void *connect_check_arg;
    int nsocks;
    int listen_fd;
    union cfx_sockaddr listen_addr;
    char listen_text[96];
    /* Connect: who waits for sockets, and sockets that owe a hello. */
    pthread_mutex_t accept_lock;
    struct sock_conn *awaiting;
    struct pending *pending;
    int n_pending;
    struct cfx_proxy *proxy; /* The process's progress thread (src/proxy). */
};

static int aborted(const int *abort_flag)
{
    return abort_flag && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE);
}

/* The core's verdict on a peer a connect waits for (gone, gave up, out of
 * time), or cfxSuccess. */
static cfxResult_t check_peer(const struct sock_ctx *ctx, int peer_rank)
{
    return ctx->connect_check ? ctx->connect_check(ctx->connect_check_arg, peer_rank) : cfxSuccess;
}

static void close_fd(int *fd)
{
    cfx_socket_close(fd);
}

/* Zeroed memory aligned for the _Alignas members below (calloc gives 16). */
static void *zalloc_aligned(size_t bytes)
{
    void *mem = NULL;
    if (posix_memalign(&mem, CFX_CACHE_LINE, bytes) != 0)
        return NULL;
    memset(mem, 0, bytes);
    return mem;
}

static const char *dir_name(enum cfx_conn_dir dir)
{
    return dir == CFX_CONN_SEND ? "send" : "receive";
}

/* ============================================================ progress */

/* Part @p index of a @p size-byte slot striped over @p nsocks sockets. */
static void slot_part(size_t size, int nsocks, int index, size_t *off_p, size_t *len_p)
{
    size_t parts = size / MIN_PART_BYTES;
    if (parts < 1)
        parts = 1;
    if (parts > (size_t)nsocks)
        parts = (size_t)nsocks;
    size_t each = (size + parts - 1) / parts;
    size_t off = (size_t)index * each;
    if ((size_t)index >= parts || off >= size) {
        *off_p = 0;
        *len_p = 0;
        return;
    }
    *off_p = off;
    *len_p = size - off < each ? size - off : each;
}

/* Mark a connector failed (progress thread) and keep the sentence for
 * check(): cfx_error_set() would leave it in this thread only. A peer that
 * closed between slots is how every job ends, so that is logged at INFO;
 * the rest is a WARN and the process's last error. */
static void conn_fail(struct sock_conn *sc, cfxResult_t res, int orderly, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void conn_fail(struct sock_conn *sc, cfxResult_t res, int orderly, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sc->error, sizeof(sc->error), fmt, ap);
    va_end(ap);
    sc->failed_res = res;
    if (sc->blame_rank < 0)
        sc->blame_rank = sc->peer_rank;
    atomic_store_explicit(&sc->failed, 1, memory_order_release);
    /* The proxy thread serves every communicator: say whose rank this is. */
    int rank_before = cfx_log_set_rank(sc->self_rank);
    if (orderly)
        CFX_INFO(CFX_LOG_NET, "%s", sc->error);
    else
        cfx_error_set(res, CFX_LOG_NET, "%s", sc->error);
    cfx_log_set_rank(rank_before);
}

/* Whether no slot is half-way across: a close now loses nothing in flight. */
static int conn_between_slots(const struct sock_conn *sc)
{
    if (sc->dir == CFX_CONN_SEND)
        return cfx_load_acquire_u64(&sc->fifo->tail) == sc->done_step;
    for (int s = 0; s < sc->nsocks; s++)
        if (sc->streams[s].step != sc->header_count || sc->streams[s].offset != 0)
            return 0;
    return 1;
}

enum io_verdict { IO_MOVED, IO_RETRY, IO_BLOCKED, IO_FAILED };

/* Classify a send/recv result on socket @p s; on failure, fail the connector. */
static enum io_verdict io_check(struct sock_conn *sc, int s, ssize_t n)
{
    if (n > 0)
        return IO_MOVED;
    if (n == 0) {
        if (sc->dir == CFX_CONN_SEND)
            return IO_BLOCKED; /* Not returned for a non-empty send; be safe. */
        int orderly = conn_between_slots(sc);
        conn_fail(sc, cfxRemoteError, orderly,
                  "socket transport: rank %d closed its connection to rank %d %s slot %llu "
                  "(socket %d of %d); check whether rank %d exited or failed",
                  sc->peer_rank, sc->self_rank, orderly ? "before" : "in the middle of",
                  (unsigned long long)sc->done_step, s, sc->nsocks, sc->peer_rank);
        return IO_FAILED;
    }
    int err = errno;
    if (err == EINTR)
        return IO_RETRY;
    if (err == EAGAIN || err == EWOULDBLOCK)
        return IO_BLOCKED;
    char reason[128];
    const char *text = strerror_r(err, reason, sizeof(reason));
    conn_fail(sc, cfxRemoteError, 0,
              "socket transport: the connection between rank %d and rank %d failed (%s, socket "
              "%d of %d, after %llu slots): %s; check whether rank %d exited or failed",
              sc->self_rank, sc->peer_rank, dir_name(sc->dir), s, sc->nsocks,
              (unsigned long long)sc->done_step, text, sc->peer_rank);
    return IO_FAILED;
}

/* Sender: put posted slots on the wire, release those fully sent. */
static int send_progress(struct sock_conn *sc)
{
    uint64_t tail = cfx_load_acquire_u64(&sc->fifo->tail);
    uint64_t low = UINT64_MAX;
    int moved = 0;
    for (int s = 0; s < sc->nsocks; s++) {
        struct stream *st = &sc->streams[s];
        while (st->step < tail) {
            size_t index = (size_t)(st->step % (uint64_t)sc->n_steps);
            size_t size = sc->fifo->info[index].size;
            if (size > sc->slot_bytes) {
                conn_fail(sc, cfxInvalidUsage, 0,
                          "socket transport: a slot of %zu bytes was posted to rank %d on a "
                          "connector of %zu-byte slots",
                          size, sc->peer_rank, sc->slot_bytes);
                return 1;
            }
            size_t off, len;
            slot_part(size, sc->nsocks, s, &off, &len);
            size_t head_bytes = s == 0 ? sizeof(struct cfx_sock_header) : 0;
            if (st->offset < head_bytes + len) {
                char *part =
                    cfx_fifo_data(sc->fifo->info, sc->slots, sc->slot_bytes, index, size) + off;
                struct cfx_sock_header header = {CFX_SOCK_HEADER_MAGIC, (uint32_t)st->step,
                                                 size, sc->fifo->info[index].print};
                struct iovec iov[2];
                int n_iov = 0;
                if (st->offset < head_bytes) {
                    iov[n_iov++] =
                        (struct iovec){(char *)&header + st->offset, head_bytes - st->offset};
                    if (len > 0)
                        iov[n_iov++] = (struct iovec){part, len};
                } else {
                    size_t done = st->offset - head_bytes;
                    iov[n_iov++] = (struct iovec){part + done, len - done};
                }
                struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
                ssize_t n = sendmsg(st->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
                enum io_verdict verdict = io_check(sc, s, n);
                if (verdict == IO_FAILED)
                    return 1;
                if (verdict == IO_BLOCKED)
                    break;
                if (verdict == IO_RETRY)
                    continue;
                st->offset += (size_t)n;
                moved = 1;
                if (st->offset < head_bytes + len)
                    continue;
            }
            st->step++;
            st->offset = 0;
            moved = 1;
        }
        if (st->step < low)
            low = st->step;
    }
    if (low > sc->done_step) {
        sc->done_step = low;
        cfx_store_release_u64(&sc->fifo->head, low);
    }
    return moved;
}

/* Receiver socket 0: the header of slot st->step is complete; check it. */
static int header_accept(struct sock_conn *sc, struct stream *st, size_t index)
{
    const struct cfx_sock_header *header = &sc->header_in;
    const char *why = cfx_sock_header_refusal(header, st->step, sc->slot_bytes);
    if (why == NULL && header->magic == CFX_SOCK_POISON_MAGIC) {
        /* The sender failed. Slots whose headers came before this may still
         * be arriving on the other sockets: fail once they are in. */
        sc->poison_in_reason = cfx_sock_poison_decode(header, &sc->blame_rank);
        sc->poison_in = 1;
        return 0;
    }
    if (why != NULL) {
        conn_fail(sc, cfxRemoteError, 0,
                  "socket transport: rank %d sent a malformed slot header to rank %d (slot %llu: "
                  "%s; magic 0x%08x, step %u, %llu bytes for %zu-byte slots); the peer runs "
                  "another build or the stream is corrupt",
                  sc->peer_rank, sc->self_rank, (unsigned long long)st->step, why, header->magic,
                  header->step, (unsigned long long)header->size, sc->slot_bytes);
        return 0;
    }
    sc->fifo->info[index].size = (uint32_t)header->size;
    sc->fifo->info[index].print = header->print;
    sc->header_count = st->step + 1;
    return 1;
}

/* Receiver: fill free slots from the wire, post those fully received. */
static int recv_progress(struct sock_conn *sc)
{
    uint64_t head = cfx_load_acquire_u64(&sc->fifo->head);
    uint64_t limit = head + (uint64_t)sc->n_steps; /* Slots below this are free or ours. */
    uint64_t low = UINT64_MAX;
    int moved = 0;
    for (int s = 0; s < sc->nsocks; s++) {
        struct stream *st = &sc->streams[s];
        size_t head_bytes = s == 0 ? sizeof(struct cfx_sock_header) : 0;
        if (s == 0 && (sc->poison_in || st->eof))
            continue; /* Nothing follows a poison header or the end. */
        /* Socket 0 reads headers into free slots; the others follow the headers. */
        while (st->step < (s == 0 ? limit : sc->header_count)) {
            size_t index = (size_t)(st->step % (uint64_t)sc->n_steps);
            if (st->offset < head_bytes) {
                ssize_t n = recv(st->fd, (char *)&sc->header_in + st->offset,
                                 head_bytes - st->offset, MSG_DONTWAIT);
                if (n == 0 && st->offset == 0) {
                    /* The peer closed between slots: the other sockets may
                     * still hold parts of slots already announced. */
                    st->eof = 1;
                    break;
                }
                enum io_verdict verdict = io_check(sc, s, n);
                if (verdict == IO_FAILED)
                    goto publish;
                if (verdict == IO_BLOCKED)
                    break;
                if (verdict == IO_RETRY)
                    continue;
                st->offset += (size_t)n;
                moved = 1;
                if (st->offset < head_bytes)
                    continue;
                if (!header_accept(sc, st, index)) {
                    if (!sc->poison_in)
                        goto publish;
                    moved = 1;
                    break;
                }
            }
            size_t off, len;
            slot_part(sc->fifo->info[index].size, sc->nsocks, s, &off, &len);
            size_t done = st->offset - head_bytes;
            if (done < len) {
                char *part = cfx_fifo_data(sc->fifo->info, sc->slots, sc->slot_bytes, index,
                                           sc->fifo->info[index].size) +
                             off;
                ssize_t n = recv(st->fd, part + done, len - done, MSG_DONTWAIT);
                enum io_verdict verdict = io_check(sc, s, n);
                if (verdict == IO_FAILED)
                    goto publish;
                if (verdict == IO_BLOCKED)
                    break;
                if (verdict == IO_RETRY)
                    continue;
                st->offset += (size_t)n;
                moved = 1;
                if (done + (size_t)n < len)
                    continue;
            }
            st->step++;
            st->offset = 0;
            moved = 1;
        }
    }
publish:
    /* Also after a failure: slots every socket finished before it are whole
     * and must reach the user (a peer that sent, then closed, is no error). */
    for (int s = 0; s < sc->nsocks; s++)
        if (sc->streams[s].step < low)
            low = sc->streams[s].step;
    if (low > sc->done_step) {
        for (uint64_t number = sc->done_step; number < low; number++)
            cfx_fifo_mark_posted(sc->fifo->info, sc->n_steps, number);
        sc->done_step = low;
        cfx_store_release_u64(&sc->fifo->tail, low);
    }
    if (atomic_load_explicit(&sc->failed, memory_order_relaxed))
        return 1;
    if (sc->streams[0].eof && low == sc->header_count) {
        conn_fail(sc, cfxRemoteError, 1,
                  "socket transport: rank %d closed its connection to rank %d before slot %llu; "
                  "check whether rank %d exited or failed",
                  sc->peer_rank, sc->self_rank, (unsigned long long)sc->done_step, sc->peer_rank);
        return 1;
    }
    if (sc->poison_in && low == sc->header_count) {
        cfxResult_t reason = sc->poison_in_reason;
        conn_fail(sc, reason, 1, "rank %d stopped its stream to rank %d because of rank %d: %s%s",
                  sc->peer_rank, sc->self_rank, sc->blame_rank, cfxGetErrorString(reason),
                  reason == cfxInvalidUsage ? " (mismatched collectives; that rank's error says "
                                              "which)"
                                            : "");
        return 1;
    }
    return moved;
}

/* Sender sockets carry nothing back but a receiver's poison header: readable
 * means the receiver failed, closed, or broke. */
static void send_probe(struct sock_conn *sc)
{
    for (int s = 0; s < sc->nsocks; s++) {
        struct cfx_sock_header back;
        ssize_t n = recv(sc->streams[s].fd, &back, sizeof(back), MSG_DONTWAIT | MSG_PEEK);
        if (n == (ssize_t)sizeof(back) && back.magic == CFX_SOCK_POISON_MAGIC) {
            cfxResult_t reason = cfx_sock_poison_decode(&back, &sc->blame_rank);
            conn_fail(sc, reason, 1,
                      "rank %d stopped receiving from rank %d because of rank %d: %s%s",
                      sc->peer_rank, sc->self_rank, sc->blame_rank, cfxGetErrorString(reason),
                      reason == cfxInvalidUsage ? " (mismatched collectives; that rank's error "
                                                  "says which)"
                                                : "");
            return;
        }
        if (n > 0 && n < (ssize_t)sizeof(back) && back.magic == CFX_SOCK_POISON_MAGIC)
            continue; /* The rest of the header is on its way. */
        char byte;
        n = recv(sc->streams[s].fd, &byte, 1, MSG_DONTWAIT);
        if (n == 0) {
            conn_fail(sc, cfxRemoteError, conn_between_slots(sc),
                      "socket transport: rank %d closed its connection from rank %d (socket %d "
                      "of %d, after %llu slots); check whether rank %d exited or failed",
                      sc->peer_rank, sc->self_rank, s, sc->nsocks,
                      (unsigned long long)sc->done_step, sc->peer_rank);
            return;
        }
        if (n > 0) {
            conn_fail(sc, cfxRemoteError, 0,
                      "socket transport: rank %d sent unexpected bytes back to sender rank %d "
                      "(socket %d of %d); the peer runs another build or the stream is corrupt",
                      sc->peer_rank, sc->self_rank, s, sc->nsocks);
            return;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
            io_check(sc, s, n) == IO_FAILED)
            return;
    }
}

#define POISON_GRACE_NS (200 * CFX_NS_PER_MS)

static void shutdown_all(struct sock_conn *sc)
{
    for (int s = 0; s < sc->nsocks; s++)
        if (sc->streams[s].fd >= 0)
            shutdown(sc->streams[s].fd, SHUT_RDWR);
}

/* A poisoned connector: a sender first finishes the slots already posted
 * (briefly), then tells the receiver why it stops; then both directions shut
 * their sockets so the peer notices at once. */
static int poison_progress(struct sock_conn *sc, int reason, int blame_rank)
{
    if (sc->poison_done)
        return 0;
    int64_t now = cfx_time_now_ns();
    if (sc->poison_deadline_ns == 0)
        sc->poison_deadline_ns = now + POISON_GRACE_NS;
    struct cfx_sock_header header = {
        .magic = CFX_SOCK_POISON_MAGIC,
        .size = (uint64_t)(uint32_t)reason | ((uint64_t)(uint32_t)(blame_rank + 1) << 32)};
    if (sc->dir == CFX_CONN_RECV) {
        /* Sockets carry nothing back normally; the sender's probe reads this. */
        if (send(sc->streams[0].fd, &header, sizeof(header), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
            (errno == EAGAIN || errno == EWOULDBLOCK) && now < sc->poison_deadline_ns)
            return 1;
    } else {
        send_progress(sc);
        int idle = !atomic_load_explicit(&sc->failed, memory_order_relaxed);
        uint64_t tail = cfx_load_acquire_u64(&sc->fifo->tail);
        for (int s = 0; s < sc->nsocks && idle; s++)
            idle = sc->streams[s].offset == 0 && sc->streams[s].step == tail;
        if (!idle && now < sc->poison_deadline_ns)
            return 1;
        if (idle) {
            if (send(sc->streams[0].fd, &header, sizeof(header), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
                (errno == EAGAIN || errno == EWOULDBLOCK) && now < sc->poison_deadline_ns)
                return 1;
        }
    }
    shutdown_all(sc);
    __atomic_store_n(&sc->poison_done, 1, __ATOMIC_RELEASE);
    return 1;
}

/* One connector's work: its poison, or its bytes. */
static int conn_pass(struct sock_conn *sc)
{
    int reason = atomic_load_explicit(&sc->poison_reason, memory_order_acquire);
    if (reason != 0)
        return poison_progress(sc, reason,
                               atomic_load_explicit(&sc->poison_blame, memory_order_relaxed));
    if (atomic_load_explicit(&sc->failed, memory_order_relaxed))
        return 0;
    if (sc->dir == CFX_CONN_RECV)
        return recv_progress(sc);
    if (atomic_exchange_explicit(&sc->probe_owed, 0, memory_order_relaxed)) {
        send_probe(sc);
        if (atomic_load_explicit(&sc->failed, memory_order_relaxed))
            return 1;
    }
    return send_progress(sc);
}

/* Move a connector's bytes from whichever thread asks: the progress thread,
 * or a user thread after a post or release or while it waits. The first to
 * take `busy` works; one that finds it taken leaves `wanted` set, and the
 * busy thread makes one more pass for it before it lets go. So no thread
 * ever blocks on another (no mutex, no futex), and no request is lost: the
 * holder looks at `wanted` again after it drops `busy`. Returns whether this
 * thread moved anything (0 when it left the work to the holder). */
static int conn_drive(struct sock_conn *sc)
{
    int moved = 0;
    atomic_store_explicit(&sc->wanted, 1, memory_order_seq_cst);
    while (atomic_load_explicit(&sc->wanted, memory_order_seq_cst)) {
        if (atomic_exchange_explicit(&sc->busy, 1, memory_order_acquire))
            return moved; /* The holder will see `wanted`. */
        while (atomic_exchange_explicit(&sc->wanted, 0, memory_order_seq_cst))
            moved |= conn_pass(sc);
        atomic_store_explicit(&sc->busy, 0, memory_order_seq_cst);
    }
    return moved;
}

/* The proxy's pass over one connector (proxy thread, under its lock). */
static int conn_proxy_progress(void *arg)
{
    return conn_drive(arg);
}

/* A socket of the connector turned ready (proxy thread): a sender's socket
 * readable means the receiver wrote back (a poison) or closed. */
static void conn_proxy_ready(void *arg, uint32_t events)
{
    struct sock_conn *sc = arg;
    if (sc->dir == CFX_CONN_SEND && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
        atomic_store_explicit(&sc->probe_owed, 1, memory_order_relaxed);
        conn_drive(sc);
    }
}

/* Hand a connected connector to the process's proxy thread. */
static cfxResult_t proxy_add(struct sock_ctx *ctx, struct sock_conn *sc)
{
    int fds[MAX_SOCKS];
    for (int s = 0; s < sc->nsocks; s++)
        fds[s] = sc->streams[s].fd;
    sc->client.progress = conn_proxy_progress;
    sc->client.ready = conn_proxy_ready;
    sc->client.arg = sc;
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
static void proxy_remove(struct sock_ctx *ctx, struct sock_conn *sc)
{
    cfx_proxy_remove(ctx->proxy, &sc->client);
    sc->registered = 0;
}

/* ============================================================ lifecycle */

static void sock_fini(void *ctx_v);

/* Listen where the core asked (env->listen_ifaddr), else where CFX_SOCKET_IFNAME says. */
static cfxResult_t listen_open(struct sock_ctx *ctx, const char *ifaddr)
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

/* Per-communicator state: a listener, a progress thread and its wake-up fd.
 * Blocks briefly. */
static cfxResult_t sock_init(const struct cfx_transport_env *env, void **ctx_p)
{
    cfxResult_t res;
    struct sock_ctx *ctx = zalloc_aligned(sizeof(*ctx));
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

/* Stops and joins the progress thread, closes everything, frees; accepts
 * NULL and half-built state. Connectors must have been closed. Never blocks
 * on peers. */
static void sock_fini(void *ctx_v)
{
    struct sock_ctx *ctx = ctx_v;
    if (ctx == NULL)
        return;
    cfx_proxy_put(ctx->proxy); /* close() every connector before fini(). */
    for (int i = 0; i < ctx->n_pending; i++)
        close_fd(&ctx->pending[i].fd);
    close_fd(&ctx->listen_fd);
    free(ctx->pending);
    pthread_mutex_destroy(&ctx->accept_lock);
    free(ctx);
}

/* ============================================================ connection */

/* Any two ranks that can reach each other over TCP. Pure. */
static int sock_can_connect(void *ctx, const struct cfx_transport_peer *self,
                            const struct cfx_transport_peer *peer)
{
    (void)ctx;
    (void)self;
    (void)peer;
    return 1;
}

/* Receiver: a fresh connection id, unique among those still awaited. */
static cfxResult_t conn_id_pick(struct sock_ctx *ctx, uint64_t *id_p)
{
    for (;;) {
        uint64_t id;
        cfxResult_t res = cfx_host_random(&id, sizeof(id));
        if (res != cfxSuccess)
            return res;
        int taken = id == 0;
        for (struct sock_conn *sc = ctx->awaiting; sc && !taken; sc = sc->await_next)
            taken = sc->conn_id == id;
        if (!taken) {
            *id_p = id;
            return cfxSuccess;
        }
    }
}

/* Allocates and touches this side's FIFO; the receiver also gets a
 * connection id and waits on the ctx's list for its sockets. Writes a
 * struct cfx_sock_info to @p info_out. Does not block on the peer. */
static cfxResult_t sock_setup(void *ctx_v, const struct cfx_transport_peer *peer, size_t slot_bytes,
                              int n_steps, struct cfx_connector *conn, void *info_out)
{
    struct sock_ctx *ctx = ctx_v;
    assert(n_steps >= 1 && n_steps <= CFX_MAX_STEPS && slot_bytes > 0);
    if (slot_bytes > (SIZE_MAX - cfx_fifo_slots_offset()) / (size_t)n_steps)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_NET,
                             "socket transport: %d slots of %zu bytes do not fit in memory",
                             n_steps, slot_bytes);
    size_t bytes = cfx_fifo_slots_offset() + (size_t)n_steps * slot_bytes;
    struct sock_conn *sc = zalloc_aligned(sizeof(*sc));
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
        cfxResult_t res = conn_id_pick(ctx, &sc->conn_id);
        if (res == cfxSuccess) {
            sc->nsocks = ctx->nsocks;
            sc->await_next = ctx->awaiting;
            ctx->awaiting = sc;
            sc->awaiting = 1;
        }
        pthread_mutex_unlock(&ctx->accept_lock);
        if (res != cfxSuccess) {
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

static void awaiting_remove(struct sock_ctx *ctx, struct sock_conn *sc)
{
    for (struct sock_conn **link = &ctx->awaiting; *link; link = &(*link)->await_next)
        if (*link == sc) {
            *link = sc->await_next;
            break;
        }
    sc->awaiting = 0;
}

/* Close a socket that is not one of ours, saying why. */
static void stranger_drop(struct pending *p, const char *why)
{
    union cfx_sockaddr from;
    socklen_t len = sizeof(from);
    char where[80] = "?";
    if (getpeername(p->fd, &from.sa, &len) == 0)
        cfx_socket_addr_format(&from, where, sizeof(where));
    CFX_WARN(CFX_LOG_NET, "socket transport: closed a connection from %s: %s", where, why);
    close_fd(&p->fd);
}

/* A complete hello: attach the socket to its connector, or drop it. */
static void hello_dispatch(struct sock_ctx *ctx, struct pending *p)
{
    const struct cfx_sock_hello *hello = &p->hello;
    if (hello->magic != CFX_SOCK_HELLO_MAGIC) {
        stranger_drop(p, cfx_sock_hello_refusal(hello, -1, 0));
        return;
    }
    struct sock_conn *sc = ctx->awaiting;
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
                 sc->peer_rank, refusal ? refusal : "a second socket with that index",
                 hello->rank, hello->index, hello->count);
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
static void accept_service(struct sock_ctx *ctx)
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
        ctx->pending[ctx->n_pending++] = (struct pending){.fd = fd, .since_ns = now};
    }
    for (int i = 0; i < ctx->n_pending;) {
        struct pending *p = &ctx->pending[i];
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
static cfxResult_t connect_recv(struct sock_ctx *ctx, struct sock_conn *sc,
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
    awaiting_remove(ctx, sc);
out_unlock:
    pthread_mutex_unlock(&ctx->accept_lock);
    return res;
}

/* Sender: open the receiver's socket count to its listener, say hello on each. */
static cfxResult_t connect_send(struct sock_ctx *ctx, struct sock_conn *sc,
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
        struct cfx_sock_hello hello = {CFX_SOCK_HELLO_MAGIC, ctx->rank, sc->conn_id,
                                       (uint32_t)s, (uint32_t)sc->nsocks};
        res = cfx_socket_send_all(sc->streams[s].fd, &hello, sizeof(hello), deadline,
                                  ctx->abort_flag, peer);
        if (res != cfxSuccess)
            return res;
    }
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
    struct sock_ctx *ctx = ctx_v;
    struct sock_conn *sc = conn->priv;
    struct cfx_sock_info info;
    memcpy(&info, peer_info, sizeof(info));
    cfxResult_t res =
        sc->dir == CFX_CONN_SEND ? connect_send(ctx, sc, &info) : connect_recv(ctx, sc, &info);
    if (res != cfxSuccess)
        return res;
    res = proxy_add(ctx, sc);
    if (res != cfxSuccess)
        return res;
    CFX_INFO(CFX_LOG_NET, "socket transport: rank %d %s rank %d connected over %d socket(s)",
             ctx->rank, sc->dir == CFX_CONN_SEND ? "->" : "<-", sc->peer_rank, sc->nsocks);
    return cfxSuccess;
}

/* Take the connector from the progress thread (synchronously), close its
 * sockets, free its FIFO. Half-built connectors too. Never blocks on the
 * peer; slots not yet on the wire are lost. */
#define CLOSE_LINGER_NS (500 * CFX_NS_PER_MS)

/* Before closing, let the progress thread put what was posted (and a poison
 * header) on the wire, briefly: a rank that finished first must not cut off
 * a slower peer's last slots. Bounded; the peer's reading is not awaited. */
static void linger(struct sock_ctx *ctx, struct sock_conn *sc)
{
    int64_t deadline = cfx_time_now_ns() + CLOSE_LINGER_NS;
    for (;;) {
        if (atomic_load_explicit(&sc->failed, memory_order_acquire))
            return;
        int poisoned = atomic_load_explicit(&sc->poison_reason, memory_order_acquire) != 0;
        int flushed = sc->dir == CFX_CONN_RECV ||
                      cfx_load_acquire_u64(&sc->fifo->head) ==
                          cfx_load_acquire_u64(&sc->fifo->tail);
        int done = poisoned ? __atomic_load_n(&sc->poison_done, __ATOMIC_ACQUIRE) : flushed;
        if (done || cfx_time_now_ns() > deadline)
            return;
        cfx_proxy_wake(ctx->proxy);
        usleep(200);
    }
}

static void sock_close(void *ctx_v, struct cfx_connector *conn)
{
    struct sock_ctx *ctx = ctx_v;
    struct sock_conn *sc = conn->priv;
    if (sc == NULL)
        return;
    if (sc->registered) {
        linger(ctx, sc);
        proxy_remove(ctx, sc);
    }
    pthread_mutex_lock(&ctx->accept_lock);
    if (sc->awaiting)
        awaiting_remove(ctx, sc);
    pthread_mutex_unlock(&ctx->accept_lock);
    for (int s = 0; s < MAX_SOCKS; s++)
        close_fd(&sc->streams[s].fd);
    free(sc->mem);
    free(sc);
    conn->priv = NULL;
    conn->fifo = NULL;
    conn->slots = NULL;
    memset(&conn->view, 0, sizeof(conn->view));
}

/* ============================================================ data path */

/* The executor waits on this connector: do the progress thread's work
 * here, which saves a thread hand-off per slot each way. */
static int sock_progress(void *ctx_v, struct cfx_connector *conn)
{
    struct sock_conn *sc = conn->priv;
    if (sc == NULL || !sc->registered)
        return 0;
    cfx_proxy_lease(((struct sock_ctx *)ctx_v)->proxy, cfx_time_now_ns() + DRIVE_LEASE_NS);
    return conn_drive(sc);
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
    struct sock_ctx *ctx = ctx_v;
    struct pollfd fds[WAIT_MAX_FDS];
    int nfds = 0;
    for (int c = 0; c < n_conns; c++) {
        struct sock_conn *sc = conns[c]->priv;
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
        struct sock_conn *sc = conns[c]->priv;
        if (sc != NULL && sc->registered)
            moved |= conn_drive(sc);
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

/* cfxSuccess while healthy (one atomic load). Once the progress thread
 * failed the connector: its result (cfxRemoteError when the peer closed,
 * reset or broke the stream; cfxInvalidUsage for an oversized post), with
 * the sentence naming the peer recorded again in the caller's thread. */
static void sock_poison(void *ctx_v, struct cfx_connector *conn, cfxResult_t reason, int blame_rank)
{
    struct sock_conn *sc = conn->priv;
    if (sc == NULL)
        return;
    atomic_store_explicit(&sc->poison_blame, blame_rank, memory_order_relaxed);
    int expected = 0;
    atomic_compare_exchange_strong_explicit(&sc->poison_reason, &expected,
                                            reason == cfxSuccess ? cfxRemoteError : (int)reason,
                                            memory_order_release, memory_order_relaxed);
    cfx_proxy_wake(((struct sock_ctx *)ctx_v)->proxy);
}

static cfxResult_t sock_check(void *ctx_v, struct cfx_connector *conn)
{
    (void)ctx_v;
    struct sock_conn *sc = conn->priv;
    assert(sc != NULL);
    if (!atomic_load_explicit(&sc->failed, memory_order_acquire))
        return cfxSuccess;
    /* Slots that arrived before the failure are still good: let them be taken. */
    if (sc->dir == CFX_CONN_RECV && cfx_conn_can_take(conn))
        return cfxSuccess;
    conn->blame_rank = sc->blame_rank;
    return cfx_error_set(sc->failed_res, CFX_LOG_NET, "%s", sc->error);
}

const struct cfx_transport cfx_socket_transport = {
    .version = CFX_TRANSPORT_VERSION,
    .name = "socket",
    .flags = CFX_TRANSPORT_FLAG_PROGRESS,
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
};
