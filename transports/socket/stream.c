/*
 * The socket transport's data on the wire: per slot, socket 0 carries a
 * header {magic, step, size, fingerprint}, then the payload is split in up
 * to nsocks contiguous parts (at least MIN_PART_BYTES each), part i on
 * socket i. Every socket walks the slots in order on its own, so several
 * slots are in flight at once; a slot is released (sender) or posted
 * (receiver) when every socket is past it. A pass over a connector is made
 * by whichever thread asks first (cfx_sock_conn_drive).
 */
#include <assert.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "src/util/log.h"
#include "src/util/tsan.h"
#include "transports/socket/conn.h"

static const char *dir_name(enum cfx_conn_dir dir)
{
    return dir == CFX_CONN_SEND ? "send" : "receive";
}

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

/* Slot @p index's payload size (without the in-place flag). */
static size_t slot_size(const struct cfx_sock_conn *sc, size_t index)
{
    return sc->fifo->info[index].size & CFX_SLOT_SIZE_MASK;
}

/* Mark a connector failed (progress thread) and keep the sentence for
 * check(): cfx_error_set() would leave it in this thread only. A peer that
 * closed between slots is how every job ends, so that is logged at INFO;
 * the rest is a WARN and the process's last error. */
static void conn_fail(struct cfx_sock_conn *sc, cfxResult_t res, int orderly, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void conn_fail(struct cfx_sock_conn *sc, cfxResult_t res, int orderly, const char *fmt, ...)
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
static int conn_between_slots(const struct cfx_sock_conn *sc)
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
static enum io_verdict io_check(struct cfx_sock_conn *sc, int s, ssize_t n)
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
int cfx_sock_send_progress(struct cfx_sock_conn *sc)
{
    uint64_t tail = cfx_load_acquire_u64(&sc->fifo->tail);
    uint64_t low = UINT64_MAX;
    int moved = 0;
    for (int s = 0; s < sc->nsocks; s++) {
        struct cfx_sock_stream *st = &sc->streams[s];
        while (st->step < tail) {
            size_t index = (size_t)(st->step % (uint64_t)sc->n_steps);
            size_t size = sc->fifo->info[index].size;
            const struct cfx_sock_slot *meta = &sc->slot_meta[index];
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
                /* A slot posted by reference: its payload is in user memory. */
                const char *data =
                    meta->ref_step == st->step + 1
                        ? meta->ref
                        : cfx_fifo_data(sc->fifo->info, sc->slots, sc->slot_bytes, index, size);
                char *part = (char *)data + off;
                int at = meta->at_step == st->step + 1;
                struct cfx_sock_header header = {
                    CFX_SOCK_HEADER_MAGIC,       (uint32_t)st->step,    size,
                    sc->fifo->info[index].print, at ? meta->at_msg : 0, at ? meta->at_offset : 0};
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
                ssize_t n = CFX_SENDMSG(st->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
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
        for (uint64_t number = sc->done_step; number < low; number++)
            sc->ref_slots += sc->slot_meta[number % (uint64_t)sc->n_steps].ref_step == number + 1;
        sc->done_step = low;
        cfx_store_release_u64(&sc->fifo->head, low);
    }
    return moved;
}

/* Receiver: where the @p size bytes at @p offset of message @p msg may
 * land, if its receive offered a buffer that holds them; else NULL. */
static char *offer_dest(struct cfx_sock_conn *sc, uint64_t msg, uint64_t offset, uint64_t size)
{
    struct cfx_sock_offer *o = &sc->offers[msg % SOCK_OFFERS];
    uint64_t seen = atomic_load_explicit(&o->msg, memory_order_acquire);
    if (seen != msg + 1)
        return NULL;
    /* Acquire loads keep the second look at msg after them; a rewrite's
     * data or bytes seen here carries its msg = 0 with it (sock_offer). */
    uintptr_t data = atomic_load_explicit(&o->data, memory_order_acquire);
    uint64_t bytes = atomic_load_explicit(&o->bytes, memory_order_acquire);
    if (atomic_load_explicit(&o->msg, memory_order_relaxed) != seen)
        return NULL; /* Rewritten meanwhile for a later message. */
    if (offset > bytes || size > bytes - offset)
        return NULL;
    return (char *)data + offset;
}

/* Receiver socket 0: the header of slot st->step is complete; check it. */
static int header_accept(struct cfx_sock_conn *sc, struct cfx_sock_stream *st, size_t index)
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
    /* A slot of a message whose receive offered its buffer lands there. */
    struct cfx_sock_slot *meta = &sc->slot_meta[index];
    meta->dest = header->msg != 0 && header->size > CFX_SLOT_INLINE_BYTES
                     ? offer_dest(sc, header->msg - 1, header->offset, header->size)
                     : NULL;
    sc->in_place_slots += meta->dest != NULL;
    sc->fifo->info[index].size = (uint32_t)header->size | (meta->dest ? CFX_SLOT_IN_PLACE : 0);
    sc->fifo->info[index].print = header->print;
    sc->header_count = st->step + 1;
    return 1;
}

/* Receiver: fill free slots from the wire, post those fully received. */
static int recv_progress(struct cfx_sock_conn *sc)
{
    uint64_t head = cfx_load_acquire_u64(&sc->fifo->head);
    uint64_t limit = head + (uint64_t)sc->n_steps; /* Slots below this are free or ours. */
    uint64_t low = UINT64_MAX;
    int moved = 0;
    for (int s = 0; s < sc->nsocks; s++) {
        struct cfx_sock_stream *st = &sc->streams[s];
        size_t head_bytes = s == 0 ? sizeof(struct cfx_sock_header) : 0;
        if (s == 0 && (sc->poison_in || st->eof))
            continue; /* Nothing follows a poison header or the end. */
        /* Socket 0 reads headers into free slots; the others follow the headers. */
        while (st->step < (s == 0 ? limit : sc->header_count)) {
            size_t index = (size_t)(st->step % (uint64_t)sc->n_steps);
            if (st->offset < head_bytes) {
                ssize_t n = CFX_RECV(st->fd, (char *)&sc->header_in + st->offset,
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
            size_t off, len, size = slot_size(sc, index);
            slot_part(size, sc->nsocks, s, &off, &len);
            size_t done = st->offset - head_bytes;
            if (done < len) {
                char *dest = sc->slot_meta[index].dest;
                char *part =
                    (dest ? dest
                          : cfx_fifo_data(sc->fifo->info, sc->slots, sc->slot_bytes, index, size)) +
                    off;
                ssize_t n = CFX_RECV(st->fd, part + done, len - done, MSG_DONTWAIT);
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
static void send_probe(struct cfx_sock_conn *sc)
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

/* One connector's work: its poison, or its bytes. */
static int conn_pass(struct cfx_sock_conn *sc)
{
    /* seq_cst: a poisoner that saw `busy` clear after its store knows every
     * later pass sees the poison (cfx_sock_conn_poison). */
    int reason = atomic_load_explicit(&sc->poison_reason, memory_order_seq_cst);
    if (reason != 0)
        return cfx_sock_poison_progress(
            sc, reason, atomic_load_explicit(&sc->poison_blame, memory_order_relaxed));
    if (atomic_load_explicit(&sc->failed, memory_order_relaxed))
        return 0;
    if (sc->dir == CFX_CONN_RECV)
        return recv_progress(sc);
    if (atomic_exchange_explicit(&sc->probe_owed, 0, memory_order_relaxed)) {
        send_probe(sc);
        if (atomic_load_explicit(&sc->failed, memory_order_relaxed))
            return 1;
    }
    return cfx_sock_send_progress(sc);
}

/* Move a connector's bytes from whichever thread asks: the progress thread,
 * or a user thread after a post or release or while it waits. The first to
 * take `busy` works; one that finds it taken leaves `wanted` set, and the
 * busy thread makes one more pass for it before it lets go. So no thread
 * ever blocks on another (no mutex, no futex), and no request is lost: the
 * holder looks at `wanted` again after it drops `busy`. Returns whether this
 * thread moved anything (0 when it left the work to the holder). */
int cfx_sock_conn_drive(struct cfx_sock_conn *sc)
{
    int moved = 0;
    atomic_store_explicit(&sc->wanted, 1, memory_order_seq_cst);
    while (atomic_load_explicit(&sc->wanted, memory_order_seq_cst)) {
        if (atomic_exchange_explicit(&sc->busy, 1, memory_order_seq_cst))
            return moved; /* The holder will see `wanted`. */
        while (atomic_exchange_explicit(&sc->wanted, 0, memory_order_seq_cst))
            moved |= conn_pass(sc);
        atomic_store_explicit(&sc->busy, 0, memory_order_seq_cst);
    }
    return moved;
}
