/*
 * Poison: a rank that failed tells its socket peers why before it stops.
 * The user side records the reason (cfx_sock_conn_poison) and wakes the
 * proxy; the next pass over the connector (cfx_sock_poison_progress) lets a
 * sender finish the slots already posted (briefly), sends a poison header
 * {CFX_SOCK_POISON_MAGIC, reason, blame rank}, and shuts the sockets, so
 * the peer's check() reports the reason instead of waiting out its
 * timeout. A receiver sends the header back on socket 0, where the
 * sender's probe (stream.c) reads it.
 */
#include <assert.h>
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "src/util/log.h"

#include "src/util/time.h"
#include "transports/socket/conn.h"

#define POISON_GRACE_NS (200 * CFX_NS_PER_MS)

static void shutdown_all(struct cfx_sock_conn *sc)
{
    for (int s = 0; s < sc->nsocks; s++)
        if (sc->streams[s].fd >= 0)
            shutdown(sc->streams[s].fd, SHUT_RDWR);
}

/* Sender: whether a slot posted and not yet on the wire is a reference to
 * user memory (post_ref). */
static int refs_pending(const struct cfx_sock_conn *sc)
{
    uint64_t tail = cfx_load_acquire_u64(&sc->fifo->tail);
    for (uint64_t number = sc->done_step; number < tail; number++)
        if (sc->slot_meta[number % (uint64_t)sc->n_steps].ref_step == number + 1)
            return 1;
    return 0;
}

/* A poisoned connector: a sender first finishes the slots already posted
 * (briefly), then tells the receiver why it stops; then both directions shut
 * their sockets so the peer notices at once. A sender with slots posted by
 * reference does not finish them: their call has ended (a poison is how a
 * failed call ends), so that memory may be the user's again; it shuts its
 * sockets at once, and the receiver sees the stream cut. */
int cfx_sock_poison_progress(struct cfx_sock_conn *sc, int reason, int blame_rank)
{
    if (sc->poison_done)
        return 0;
    int64_t now = cfx_time_now_ns();
    if (sc->poison_deadline_ns == 0)
        sc->poison_deadline_ns = now + POISON_GRACE_NS;
    struct cfx_sock_header header = {.magic = CFX_SOCK_POISON_MAGIC,
                                     .size = (uint64_t)(uint32_t)reason |
                                             ((uint64_t)(uint32_t)(blame_rank + 1) << 32)};
    if (sc->dir == CFX_CONN_RECV) {
        /* Sockets carry nothing back normally; the sender's probe reads this. */
        if (send(sc->streams[0].fd, &header, sizeof(header), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
            (errno == EAGAIN || errno == EWOULDBLOCK) && now < sc->poison_deadline_ns)
            return 1;
    } else if (refs_pending(sc)) {
        /* Cut: nothing more of user memory goes out. */
    } else {
        cfx_sock_send_progress(sc);
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

#define QUIESCE_MAX_NS (5 * CFX_NS_PER_SEC)

void cfx_sock_conn_poison(struct cfx_sock_conn *sc, cfxResult_t reason, int blame_rank)
{
    atomic_store_explicit(&sc->poison_blame, blame_rank, memory_order_relaxed);
    int expected = 0;
    atomic_compare_exchange_strong_explicit(&sc->poison_reason, &expected,
                                            reason == cfxSuccess ? cfxRemoteError : (int)reason,
                                            memory_order_seq_cst, memory_order_seq_cst);
    /* A pass that began before the poison may be moving bytes from or into
     * the failed call's buffers (post_ref, offers); every pass after it sees
     * the poison and touches neither. Passes never block, so the wait for
     * it is short; the caller's buffers are the user's once this returns. */
    int64_t deadline = 0;
    while (atomic_load_explicit(&sc->busy, memory_order_seq_cst)) {
        int64_t now = cfx_time_now_ns();
        if (deadline == 0)
            deadline = now + QUIESCE_MAX_NS;
        if (now > deadline) {
            CFX_WARN(CFX_LOG_NET,
                     "socket transport: a pass over the connection between rank %d and rank %d "
                     "did not end within 5 s of its poison",
                     sc->self_rank, sc->peer_rank);
            break;
        }
        sched_yield();
    }
}

#define CLOSE_LINGER_NS (500 * CFX_NS_PER_MS)

/* Before closing, let the proxy put what was posted (and a poison
 * header) on the wire, briefly: a rank that finished first must not cut off
 * a slower peer's last slots. Bounded; the peer's reading is not awaited. */
void cfx_sock_conn_linger(struct cfx_sock_ctx *ctx, struct cfx_sock_conn *sc)
{
    int64_t deadline = cfx_time_now_ns() + CLOSE_LINGER_NS;
    for (;;) {
        if (atomic_load_explicit(&sc->failed, memory_order_acquire))
            return;
        int poisoned = atomic_load_explicit(&sc->poison_reason, memory_order_acquire) != 0;
        int flushed = sc->dir == CFX_CONN_RECV || cfx_load_acquire_u64(&sc->fifo->head) ==
                                                      cfx_load_acquire_u64(&sc->fifo->tail);
        int done = poisoned ? __atomic_load_n(&sc->poison_done, __ATOMIC_ACQUIRE) : flushed;
        if (done || cfx_time_now_ns() > deadline)
            return;
        cfx_proxy_wake(ctx->proxy);
        usleep(200);
    }
}
