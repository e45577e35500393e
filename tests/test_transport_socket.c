/*
 * The socket transport, two "ranks" as two transport contexts in one process
 * (over loopback): slots of every size cross in both directions with their
 * content intact through wraparound and backpressure; connectors of one
 * communicator connect in any order; a peer that goes away is a remote error
 * naming it; strangers at the listener are turned away; connect is bounded
 * by its timeout and the abort flag; an idle progress thread sleeps.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/socket.h"
#include "src/util/time.h"
#include "transports/socket/socket.h"

static const struct cfx_transport *const tp = &cfx_socket_transport;

/* ------------------------------------------------------------ helpers */

/* One "rank": its transport context and the environment it was given. */
struct rank_side {
    int rank;
    int abort_flag;
    struct cfx_transport_env env;
    struct cfx_transport_peer self;
    void *ctx;
};

static void use_loopback(int nsocks_perthread, int nthreads)
{
    char text[32];
    setenv("CFX_SOCKET_IFNAME", "lo", 1);
    setenv("CFX_CONF_FILE", "/nonexistent", 1);
    snprintf(text, sizeof(text), "%d", nsocks_perthread);
    setenv("CFX_NSOCKS_PERTHREAD", text, 1);
    snprintf(text, sizeof(text), "%d", nthreads);
    setenv("CFX_SOCKET_NTHREADS", text, 1);
    cfx_param_reset_all();
}

static void side_init(struct rank_side *side, int rank, int64_t timeout_s)
{
    memset(side, 0, sizeof(*side));
    side->rank = rank;
    side->env = (struct cfx_transport_env){
        .rank = rank, .nranks = 2, .abort_flag = &side->abort_flag, .connect_timeout_s = timeout_s};
    side->self = (struct cfx_transport_peer){.rank = rank, .pid = getpid(), .cuda_dev = -1};
    cfxResult_t res = tp->init(&side->env, &side->ctx);
    cr_assert_eq(res, cfxSuccess, "init of rank %d: %s", rank, cfx_error_thread_last());
}

static void side_fini(struct rank_side *side)
{
    tp->fini(side->ctx);
    side->ctx = NULL;
}

/* Set up @p conn of @p side towards @p peer; @p info gets its connect info. */
static void conn_setup(struct rank_side *side, const struct rank_side *peer, enum cfx_conn_dir dir,
                       size_t slot_bytes, int n_steps, struct cfx_connector *conn,
                       unsigned char *info)
{
    memset(conn, 0, sizeof(*conn));
    conn->dir = dir;
    conn->peer_rank = peer->rank;
    conn->transport = tp;
    conn->transport_ctx = side->ctx;
    cfxResult_t res = tp->setup(side->ctx, &peer->self, slot_bytes, n_steps, conn, info);
    cr_assert_eq(res, cfxSuccess, "setup: %s", cfx_error_thread_last());
    cr_assert(conn->fifo != NULL && conn->slots != NULL);
    cr_assert_eq((uintptr_t)conn->slots - (uintptr_t)conn->fifo, cfx_fifo_slots_offset());
}

/* Payload sizes: empty, tiny, odd, around the stripe size, full, random. */
static size_t size_for(uint64_t seq, size_t slot_bytes)
{
    static const size_t fixed[] = {0,    1,     2,     3,     63,         64,    4095,
                                   4097, 65535, 65536, 65537, 131072 + 7, 200003};
    size_t n_fixed = sizeof(fixed) / sizeof(fixed[0]);
    size_t pick = (size_t)(seq % (n_fixed + 3));
    size_t size;
    if (pick < n_fixed)
        size = fixed[pick];
    else if (pick == n_fixed)
        size = slot_bytes;
    else if (pick == n_fixed + 1)
        size = slot_bytes - 1;
    else
        size = (size_t)((seq * 2654435761u) % (slot_bytes + 1));
    return size < slot_bytes ? size : slot_bytes;
}

static unsigned char byte_for(uint64_t seq, size_t i, unsigned tag)
{
    return (unsigned char)(seq * 131u + i * 7u + (i >> 9) + tag * 29u);
}

static void slot_fill(char *slot, uint64_t seq, size_t size, unsigned tag)
{
    for (size_t i = 0; i < size; i++)
        slot[i] = (char)byte_for(seq, i, tag);
}

/* Index of the first wrong byte, or -1. */
static long slot_verify(const char *slot, uint64_t seq, size_t size, unsigned tag)
{
    for (size_t i = 0; i < size; i++)
        if ((unsigned char)slot[i] != byte_for(seq, i, tag))
            return (long)i;
    return -1;
}

/* The fingerprint slot @p seq of stream @p tag carries. */
static struct cfx_fingerprint print_for(uint64_t seq, unsigned tag)
{
    return (struct cfx_fingerprint){.seq = seq,
                                    .count = seq * 3 + tag,
                                    .root = (int32_t)tag,
                                    .kind = 1,
                                    .type = 7,
                                    .op = 2,
                                    .valid = 1};
}

/* Post slot @p seq of stream @p tag on @p tx. */
static void post_one(struct cfx_connector *tx, uint64_t seq, unsigned tag)
{
    size_t size = size_for(seq, tx->slot_bytes);
    struct cfx_fingerprint print = print_for(seq, tag);
    slot_fill(cfx_conn_post_slot(tx, size), seq, size, tag);
    cfx_conn_post(tx, size, &print);
}

/* Take, check and release slot @p seq of stream @p tag from @p rx; 0 when it is right. */
static int take_one(struct cfx_connector *rx, uint64_t seq, unsigned tag, char *why,
                    size_t why_size)
{
    size_t bytes = 0;
    const struct cfx_fingerprint *print;
    const char *slot = cfx_conn_take_slot(rx, &bytes, &print);
    size_t want = size_for(seq, rx->slot_bytes);
    struct cfx_fingerprint expected = print_for(seq, tag);
    expected.slot = (uint32_t)seq; /* cfx_conn_post numbers the slots; seq counts them. */
    long bad = bytes == want ? slot_verify(slot, seq, bytes, tag) : -2;
    if (bad == -1 && memcmp(print, &expected, sizeof(expected)) != 0)
        bad = -3;
    cfx_conn_release(rx);
    if (bad == -1)
        return 0;
    if (bad == -3)
        snprintf(why, why_size, "slot %llu of stream %u: the fingerprint did not travel with it",
                 (unsigned long long)seq, tag);
    else if (bad == -2)
        snprintf(why, why_size, "slot %llu of stream %u: %zu bytes, expected %zu",
                 (unsigned long long)seq, tag, bytes, want);
    else
        snprintf(why, why_size, "slot %llu of stream %u: byte %ld of %zu is wrong",
                 (unsigned long long)seq, tag, bad, bytes);
    return -1;
}

/* Wait (bounded) for a connector to report a failure. */
static cfxResult_t wait_for_failure(struct cfx_connector *conn, int drain, double seconds)
{
    int64_t deadline = cfx_time_now_ns() + (int64_t)(seconds * 1e9);
    for (;;) {
        cfxResult_t res = tp->check(conn->transport_ctx, conn);
        if (res != cfxSuccess)
            return res;
        if (drain && cfx_conn_can_take(conn)) {
            size_t bytes;
            const struct cfx_fingerprint *print;
            cfx_conn_take_slot(conn, &bytes, &print);
            cfx_conn_release(conn);
        }
        if (cfx_time_now_ns() > deadline)
            return cfxSuccess;
        usleep(200);
    }
}

/* ------------------------------------------- streaming in both directions */

struct shape {
    int nsocks_perthread;
    int nthreads;
    size_t slot_bytes;
    int n_steps;
    int n_slots;
};

struct duplex_rank {
    struct rank_side *side;
    struct cfx_connector tx, rx;
    const unsigned char *peer_rx_info; /* For our tx. */
    const unsigned char *peer_tx_info; /* For our rx. */
    int rx_first;                      /* Connect the receiver first (blocks on the peer). */
    int n_slots;
    char failure[512];
};

static void *duplex_main(void *arg)
{
    struct duplex_rank *r = arg;
    void *ctx = r->side->ctx;
    cfxResult_t res;
    for (int pass = 0; pass < 2; pass++) {
        int do_rx = (pass == 0) == (r->rx_first != 0);
        res = do_rx ? tp->connect(ctx, &r->rx, r->peer_tx_info)
                    : tp->connect(ctx, &r->tx, r->peer_rx_info);
        if (res != cfxSuccess) {
            snprintf(r->failure, sizeof(r->failure), "connect %s: %s", do_rx ? "rx" : "tx",
                     cfx_error_thread_last());
            return NULL;
        }
    }
    unsigned my_tag = (unsigned)r->side->rank, peer_tag = 1u - my_tag;
    uint64_t sent = 0, got = 0, n = (uint64_t)r->n_slots;
    int64_t deadline = cfx_time_now_ns() + 60 * CFX_NS_PER_SEC;
    while (sent < n || got < n) {
        int moved = 0;
        if (sent < n && cfx_conn_can_post(&r->tx)) {
            post_one(&r->tx, sent++, my_tag);
            moved = 1;
        }
        if (got < n && cfx_conn_can_take(&r->rx)) {
            /* Now and then a slow consumer: the sender must wait for free slots. */
            if (got % 41 == 40)
                usleep(3000);
            if (take_one(&r->rx, got, peer_tag, r->failure, sizeof(r->failure)) != 0)
                return NULL;
            got++;
            moved = 1;
        }
        if (moved)
            continue;
        if ((res = tp->check(ctx, &r->tx)) != cfxSuccess ||
            (res = tp->check(ctx, &r->rx)) != cfxSuccess) {
            snprintf(r->failure, sizeof(r->failure), "check: %s", cfx_error_thread_last());
            return NULL;
        }
        if (cfx_time_now_ns() > deadline) {
            snprintf(r->failure, sizeof(r->failure),
                     "stuck: sent %llu, received %llu of %llu slots", (unsigned long long)sent,
                     (unsigned long long)got, (unsigned long long)n);
            return NULL;
        }
        sched_yield();
    }
    /* Everything posted is on the wire once the sender's FIFO is empty. */
    while (cfx_load_acquire_u64(&r->tx.fifo->head) < n) {
        if (cfx_time_now_ns() > deadline) {
            snprintf(r->failure, sizeof(r->failure), "the last slots never left");
            return NULL;
        }
        usleep(100);
    }
    return NULL;
}

ParameterizedTestParameters(socket, slots_of_every_size_cross_both_ways_intact)
{
    static struct shape shapes[] = {
        {1, 1, 256 * 1024, 4, 300},  /* One socket. */
        {2, 1, 256 * 1024, 4, 300},  /* The default: two stripes. */
        {2, 2, 1024 * 1024, 8, 120}, /* Four sockets, big slots. */
        {4, 1, 512 * 1024, 2, 200},  /* Two steps: constant backpressure. */
        {1, 1, 4096, 1, 400},        /* One step of one page: every post waits. */
        {16, 4, 512 * 1024, 3, 100}, /* 64 requested: clamped. */
    };
    return cr_make_param_array(struct shape, shapes, sizeof(shapes) / sizeof(shapes[0]));
}

ParameterizedTest(struct shape *shape, socket, slots_of_every_size_cross_both_ways_intact,
                  .timeout = 120)
{
    use_loopback(shape->nsocks_perthread, shape->nthreads);
    struct rank_side sides[2];
    side_init(&sides[0], 0, 20);
    side_init(&sides[1], 1, 20);
    struct duplex_rank ranks[2];
    unsigned char tx_info[2][CFX_CONNECT_INFO_BYTES], rx_info[2][CFX_CONNECT_INFO_BYTES];
    memset(ranks, 0, sizeof(ranks));
    for (int r = 0; r < 2; r++) {
        ranks[r].side = &sides[r];
        ranks[r].n_slots = shape->n_slots;
        ranks[r].rx_first = r == 1;
        conn_setup(&sides[r], &sides[1 - r], CFX_CONN_SEND, shape->slot_bytes, shape->n_steps,
                   &ranks[r].tx, tx_info[r]);
        conn_setup(&sides[r], &sides[1 - r], CFX_CONN_RECV, shape->slot_bytes, shape->n_steps,
                   &ranks[r].rx, rx_info[r]);
    }
    for (int r = 0; r < 2; r++) {
        ranks[r].peer_rx_info = rx_info[1 - r];
        ranks[r].peer_tx_info = tx_info[1 - r];
    }
    pthread_t threads[2];
    for (int r = 0; r < 2; r++)
        cr_assert_eq(pthread_create(&threads[r], NULL, duplex_main, &ranks[r]), 0);
    for (int r = 0; r < 2; r++)
        pthread_join(threads[r], NULL);
    for (int r = 0; r < 2; r++) {
        tp->close(sides[r].ctx, &ranks[r].tx);
        tp->close(sides[r].ctx, &ranks[r].rx);
        side_fini(&sides[r]);
    }
    for (int r = 0; r < 2; r++)
        cr_assert_eq(ranks[r].failure[0], '\0', "rank %d: %s", r, ranks[r].failure);
}

/* ------------------------------------------------- several connectors, any order */

#define N_CONNS 4

Test(socket, connectors_connected_in_reverse_order_get_their_own_sockets, .timeout = 60)
{
    use_loopback(4, 1); /* Four sockets each: sixteen arrive at rank 1's listener. */
    struct rank_side sides[2];
    side_init(&sides[0], 0, 20);
    side_init(&sides[1], 1, 20);
    const size_t slot_bytes = 512 * 1024;
    struct cfx_connector tx[N_CONNS], rx[N_CONNS];
    unsigned char tx_info[N_CONNS][CFX_CONNECT_INFO_BYTES],
        rx_info[N_CONNS][CFX_CONNECT_INFO_BYTES];
    for (int i = 0; i < N_CONNS; i++) {
        conn_setup(&sides[0], &sides[1], CFX_CONN_SEND, slot_bytes, 4, &tx[i], tx_info[i]);
        conn_setup(&sides[1], &sides[0], CFX_CONN_RECV, slot_bytes, 4, &rx[i], rx_info[i]);
    }
    /* Every sender first (they do not wait for the receiver's connect)... */
    for (int i = 0; i < N_CONNS; i++)
        cr_assert_eq(tp->connect(sides[0].ctx, &tx[i], rx_info[i]), cfxSuccess, "tx %d: %s", i,
                     cfx_error_thread_last());
    /* ...then the receivers, last first: the first accepts everybody's sockets. */
    for (int i = N_CONNS - 1; i >= 0; i--)
        cr_assert_eq(tp->connect(sides[1].ctx, &rx[i], tx_info[i]), cfxSuccess, "rx %d: %s", i,
                     cfx_error_thread_last());

    /* Each connector carries its own stream, striped slots included. */
    const uint64_t n = 24;
    uint64_t sent[N_CONNS] = {0}, got[N_CONNS] = {0};
    int64_t deadline = cfx_time_now_ns() + 30 * CFX_NS_PER_SEC;
    char why[256] = "";
    for (int busy = 1; busy;) {
        busy = 0;
        for (int i = 0; i < N_CONNS; i++) {
            if (sent[i] < n && cfx_conn_can_post(&tx[i]))
                post_one(&tx[i], sent[i]++, 10u + (unsigned)i);
            if (got[i] < n && cfx_conn_can_take(&rx[i])) {
                cr_assert_eq(take_one(&rx[i], got[i], 10u + (unsigned)i, why, sizeof(why)), 0,
                             "connector %d: %s", i, why);
                got[i]++;
            }
            busy |= sent[i] < n || got[i] < n;
            cr_assert_eq(tp->check(sides[0].ctx, &tx[i]), cfxSuccess, "%s",
                         cfx_error_thread_last());
            cr_assert_eq(tp->check(sides[1].ctx, &rx[i]), cfxSuccess, "%s",
                         cfx_error_thread_last());
        }
        cr_assert(cfx_time_now_ns() < deadline, "stuck");
        sched_yield();
    }
    for (int i = 0; i < N_CONNS; i++) {
        tp->close(sides[0].ctx, &tx[i]);
        tp->close(sides[1].ctx, &rx[i]);
    }
    side_fini(&sides[0]);
    side_fini(&sides[1]);
}

/* ------------------------------------------------------ a peer goes away */

/* A connected pair, rank 0 sends to rank 1. */
struct pair {
    struct rank_side sides[2];
    struct cfx_connector tx, rx;
};

static void pair_open(struct pair *p, size_t slot_bytes, int n_steps)
{
    unsigned char tx_info[CFX_CONNECT_INFO_BYTES], rx_info[CFX_CONNECT_INFO_BYTES];
    side_init(&p->sides[0], 0, 20);
    side_init(&p->sides[1], 1, 20);
    conn_setup(&p->sides[0], &p->sides[1], CFX_CONN_SEND, slot_bytes, n_steps, &p->tx, tx_info);
    conn_setup(&p->sides[1], &p->sides[0], CFX_CONN_RECV, slot_bytes, n_steps, &p->rx, rx_info);
    cr_assert_eq(tp->connect(p->sides[0].ctx, &p->tx, rx_info), cfxSuccess, "%s",
                 cfx_error_thread_last());
    cr_assert_eq(tp->connect(p->sides[1].ctx, &p->rx, tx_info), cfxSuccess, "%s",
                 cfx_error_thread_last());
}

static void pair_close(struct pair *p)
{
    tp->close(p->sides[0].ctx, &p->tx);
    tp->close(p->sides[1].ctx, &p->rx);
    side_fini(&p->sides[0]);
    side_fini(&p->sides[1]);
}

Test(socket, sender_closing_mid_slot_is_a_remote_error_naming_it, .timeout = 60)
{
    use_loopback(2, 1);
    struct pair p;
    /* One step, and a slot larger than the sockets buffer: while rank 1 holds
     * slot 0, slot 1 cannot get across whole. */
    const size_t slot_bytes = 32 * 1024 * 1024;
    pair_open(&p, slot_bytes, 1);
    struct cfx_fingerprint print = print_for(0, 7);
    slot_fill(cfx_conn_post_slot(&p.tx, 1000), 0, 1000, 7);
    cfx_conn_post(&p.tx, 1000, &print);
    int64_t deadline = cfx_time_now_ns() + 20 * CFX_NS_PER_SEC;
    while (!cfx_conn_can_take(&p.rx) || !cfx_conn_can_post(&p.tx)) {
        cr_assert(cfx_time_now_ns() < deadline, "the first slot never arrived");
        usleep(100);
    }
    slot_fill(cfx_conn_post_slot(&p.tx, slot_bytes), 1, slot_bytes, 7);
    cfx_conn_post(&p.tx, slot_bytes, &print);
    usleep(50 * 1000);
    tp->close(p.sides[0].ctx, &p.tx);

    /* What arrived whole is still there... */
    size_t bytes = 0;
    const struct cfx_fingerprint *got_print;
    const char *slot = cfx_conn_take_slot(&p.rx, &bytes, &got_print);
    cr_assert_eq(bytes, 1000u);
    cr_assert_eq(slot_verify(slot, 0, bytes, 7), -1);
    cfx_conn_release(&p.rx);
    /* ...then the cut slot is an error that names the sender. */
    cfx_error_thread_clear();
    cfxResult_t res = wait_for_failure(&p.rx, 0, 10);
    cr_assert_eq(res, cfxRemoteError, "check returned %d", (int)res);
    cr_assert(strstr(cfx_error_thread_last(), "rank 0") != NULL, "sentence: %s",
              cfx_error_thread_last());
    cr_assert(!cfx_conn_can_take(&p.rx), "a cut slot was posted");
    cr_assert_eq(tp->check(p.sides[1].ctx, &p.rx), cfxRemoteError, "it stays failed");
    pair_close(&p);
}

/* A sender that posts and closes at once (a rank that finished first) must
 * lose nothing: with slots striped over four sockets, one socket's end may
 * be read before another socket's last part. Many rounds, as the race is
 * narrow. */
Test(socket, sender_that_posts_then_closes_delivers_every_slot, .timeout = 120)
{
    use_loopback(4, 1);
    const size_t slot_bytes = 256 * 1024;
    const int n_steps = 8;
    for (int round = 0; round < 40; round++) {
        struct pair p;
        pair_open(&p, slot_bytes, n_steps);
        for (int k = 0; k < n_steps; k++) {
            uint64_t seq = (uint64_t)(round * n_steps + k);
            size_t size = k % 2 ? slot_bytes : size_for(seq, slot_bytes);
            struct cfx_fingerprint print = print_for(seq, 3);
            slot_fill(cfx_conn_post_slot(&p.tx, size), seq, size, 3);
            cfx_conn_post(&p.tx, size, &print);
        }
        tp->close(p.sides[0].ctx, &p.tx);
        int64_t deadline = cfx_time_now_ns() + 20 * CFX_NS_PER_SEC;
        for (int k = 0; k < n_steps; k++) {
            uint64_t seq = (uint64_t)(round * n_steps + k);
            while (!cfx_conn_can_take(&p.rx)) {
                cfxResult_t res = tp->check(p.sides[1].ctx, &p.rx);
                cr_assert(res == cfxSuccess || cfx_conn_can_take(&p.rx),
                          "round %d: slot %d of %d never arrived; the receiver failed first: %s",
                          round, k, n_steps, cfx_error_thread_last());
                cr_assert(cfx_time_now_ns() < deadline, "round %d: slot %d never arrived", round,
                          k);
                usleep(50);
            }
            size_t bytes = 0;
            const struct cfx_fingerprint *print;
            const char *slot = cfx_conn_take_slot(&p.rx, &bytes, &print);
            size_t want = k % 2 ? slot_bytes : size_for(seq, slot_bytes);
            cr_assert_eq(bytes, want, "round %d slot %d: %zu bytes, expected %zu", round, k, bytes,
                         want);
            cr_assert_eq(slot_verify(slot, seq, bytes, 3), -1, "round %d slot %d: wrong bytes",
                         round, k);
            cfx_conn_release(&p.rx);
        }
        /* Then the end of the stream is an orderly remote error. */
        cr_assert_eq(wait_for_failure(&p.rx, 0, 10), cfxRemoteError);
        tp->close(p.sides[1].ctx, &p.rx);
        side_fini(&p.sides[0]);
        side_fini(&p.sides[1]);
    }
}

Test(socket, receiver_closing_is_a_remote_error_for_the_sender, .timeout = 60)
{
    use_loopback(2, 1);
    struct pair p;
    const size_t slot_bytes = 256 * 1024;
    pair_open(&p, slot_bytes, 4);
    tp->close(p.sides[1].ctx, &p.rx);

    /* The sender notices the close even with nothing to send... */
    cfx_error_thread_clear();
    cfxResult_t res = wait_for_failure(&p.tx, 0, 10);
    /* ...and when it keeps sending. */
    for (uint64_t seq = 0; res == cfxSuccess && seq < 100000; seq++) {
        int64_t deadline = cfx_time_now_ns() + 10 * CFX_NS_PER_SEC;
        while (res == cfxSuccess && !cfx_conn_can_post(&p.tx)) {
            res = tp->check(p.sides[0].ctx, &p.tx);
            cr_assert(cfx_time_now_ns() < deadline, "stuck without an error");
            usleep(100);
        }
        if (res == cfxSuccess)
            post_one(&p.tx, seq, 3);
    }
    cr_assert_eq(res, cfxRemoteError, "check returned %d", (int)res);
    cr_assert(strstr(cfx_error_thread_last(), "rank 1") != NULL, "sentence: %s",
              cfx_error_thread_last());
    pair_close(&p);
}

/* ------------------------------------------------------------ strangers */

/* The receiver's connect info and the hello, as docs/transports.md gives them. */
struct doc_info {
    uint32_t magic;
    uint32_t nsocks;
    uint64_t conn_id;
    int32_t rank;
    uint32_t reserved;
    struct cfx_sockaddr_wire addr;
};

struct doc_hello {
    uint32_t magic;
    int32_t rank;
    uint64_t conn_id;
    uint32_t index;
    uint32_t count;
};

static int stranger_open(const union cfx_sockaddr *addr, const void *bytes, size_t size)
{
    int fd = -1;
    cr_assert_eq(cfx_socket_connect(addr, cfx_time_deadline_s(5), NULL, &fd), cfxSuccess);
    if (size > 0)
        cr_assert_eq(
            cfx_socket_send_all(fd, bytes, size, cfx_time_deadline_s(5), NULL, "the listener"),
            cfxSuccess);
    return fd;
}

/* Whether the other end closed @p fd within @p ms. */
static int was_closed(int fd, int ms)
{
    int64_t deadline = cfx_time_now_ns() + (int64_t)ms * CFX_NS_PER_MS;
    while (cfx_time_now_ns() < deadline) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 50) > 0) {
            char byte;
            ssize_t n = recv(fd, &byte, 1, MSG_DONTWAIT);
            return n == 0 || n < 0;
        }
    }
    return 0;
}

Test(socket, strangers_are_closed_and_the_real_sender_still_connects, .timeout = 60)
{
    use_loopback(2, 1);
    struct rank_side sides[2];
    side_init(&sides[0], 0, 20);
    side_init(&sides[1], 1, 20);
    struct cfx_connector tx, rx;
    unsigned char tx_info[CFX_CONNECT_INFO_BYTES], rx_info[CFX_CONNECT_INFO_BYTES];
    conn_setup(&sides[0], &sides[1], CFX_CONN_SEND, 128 * 1024, 4, &tx, tx_info);
    conn_setup(&sides[1], &sides[0], CFX_CONN_RECV, 128 * 1024, 4, &rx, rx_info);

    struct doc_info info;
    memcpy(&info, rx_info, sizeof(info));
    union cfx_sockaddr addr;
    cr_assert_eq(cfx_socket_addr_from_wire(&info.addr, &addr), cfxSuccess);
    cr_assert_eq(info.nsocks, 2u);

    char garbage[64];
    memset(garbage, 0x5a, sizeof(garbage));
    const uint32_t hello_magic = 0x48584643u; /* "CFXH" */
    struct doc_hello unknown_id = {hello_magic, 0, info.conn_id ^ 1u, 0, info.nsocks};
    struct doc_hello bad_count = unknown_id;
    bad_count.conn_id = info.conn_id;
    bad_count.count = 99;
    struct doc_hello bad_rank = unknown_id;
    bad_rank.conn_id = info.conn_id;
    bad_rank.rank = 5;
    int strangers[4];
    strangers[0] = stranger_open(&addr, garbage, sizeof(garbage));
    strangers[1] = stranger_open(&addr, &unknown_id, sizeof(unknown_id));
    strangers[2] = stranger_open(&addr, &bad_count, sizeof(bad_count));
    strangers[3] = stranger_open(&addr, &bad_rank, sizeof(bad_rank));
    int silent = stranger_open(&addr, NULL, 0); /* Says nothing at all. */
    usleep(20 * 1000);

    cr_assert_eq(tp->connect(sides[0].ctx, &tx, rx_info), cfxSuccess, "%s",
                 cfx_error_thread_last());
    cr_assert_eq(tp->connect(sides[1].ctx, &rx, tx_info), cfxSuccess, "%s",
                 cfx_error_thread_last());
    for (int i = 0; i < 4; i++)
        cr_assert(was_closed(strangers[i], 3000), "stranger %d was not closed", i);

    char why[256] = "";
    for (uint64_t seq = 0; seq < 20; seq++) {
        int64_t deadline = cfx_time_now_ns() + 10 * CFX_NS_PER_SEC;
        while (!cfx_conn_can_post(&tx))
            cr_assert(cfx_time_now_ns() < deadline, "no free slot");
        post_one(&tx, seq, 1);
        while (!cfx_conn_can_take(&rx))
            cr_assert(cfx_time_now_ns() < deadline, "slot %llu never arrived",
                      (unsigned long long)seq);
        cr_assert_eq(take_one(&rx, seq, 1, why, sizeof(why)), 0, "%s", why);
    }
    for (int i = 0; i < 4; i++)
        close(strangers[i]);
    close(silent);
    tp->close(sides[0].ctx, &tx);
    tp->close(sides[1].ctx, &rx);
    side_fini(&sides[0]);
    side_fini(&sides[1]);
}

/* ------------------------------------------------------- bounded connect */

Test(socket, receiver_connect_times_out_naming_the_missing_sender, .timeout = 30)
{
    use_loopback(2, 1);
    struct rank_side sides[2];
    side_init(&sides[0], 0, 1);
    side_init(&sides[1], 1, 1);
    struct cfx_connector rx;
    unsigned char rx_info[CFX_CONNECT_INFO_BYTES], tx_info[CFX_CONNECT_INFO_BYTES];
    struct cfx_connector tx;
    conn_setup(&sides[0], &sides[1], CFX_CONN_SEND, 4096, 2, &tx, tx_info);
    conn_setup(&sides[1], &sides[0], CFX_CONN_RECV, 4096, 2, &rx, rx_info);
    int64_t start = cfx_time_now_ns();
    cfxResult_t res = tp->connect(sides[1].ctx, &rx, tx_info); /* Rank 0 never connects. */
    int64_t took_ms = (cfx_time_now_ns() - start) / CFX_NS_PER_MS;
    cr_assert_eq(res, cfxTimeout, "connect returned %d", (int)res);
    cr_assert(took_ms >= 900 && took_ms < 5000, "took %lld ms", (long long)took_ms);
    cr_assert(strstr(cfx_error_thread_last(), "rank 0") != NULL, "sentence: %s",
              cfx_error_thread_last());
    tp->close(sides[1].ctx, &rx); /* Half-built connectors close too. */
    tp->close(sides[0].ctx, &tx);
    side_fini(&sides[0]);
    side_fini(&sides[1]);
}

static void *raise_abort(void *arg)
{
    usleep(200 * 1000);
    __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
    return NULL;
}

Test(socket, receiver_connect_stops_on_the_abort_flag, .timeout = 30)
{
    use_loopback(2, 1);
    struct rank_side sides[2];
    side_init(&sides[0], 0, 60);
    side_init(&sides[1], 1, 60);
    struct cfx_connector rx, tx;
    unsigned char rx_info[CFX_CONNECT_INFO_BYTES], tx_info[CFX_CONNECT_INFO_BYTES];
    conn_setup(&sides[0], &sides[1], CFX_CONN_SEND, 4096, 2, &tx, tx_info);
    conn_setup(&sides[1], &sides[0], CFX_CONN_RECV, 4096, 2, &rx, rx_info);
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, raise_abort, &sides[1].abort_flag), 0);
    int64_t start = cfx_time_now_ns();
    cfxResult_t res = tp->connect(sides[1].ctx, &rx, tx_info);
    int64_t took_ms = (cfx_time_now_ns() - start) / CFX_NS_PER_MS;
    pthread_join(thread, NULL);
    cr_assert_eq(res, cfxRemoteError, "connect returned %d", (int)res);
    cr_assert(took_ms < 3000, "took %lld ms", (long long)took_ms);
    cr_assert(strstr(cfx_error_thread_last(), "rank 0") != NULL, "sentence: %s",
              cfx_error_thread_last());
    tp->close(sides[1].ctx, &rx);
    tp->close(sides[0].ctx, &tx);
    side_fini(&sides[0]);
    side_fini(&sides[1]);
}

/* The core's connect_check, as a test sees it: the peer is declared gone
 * on the third look. */
static int gone_checks;

static cfxResult_t gone_on_third_look(void *arg, int peer_rank)
{
    (void)arg;
    if (++gone_checks < 3)
        return cfxSuccess;
    return cfx_error_set(cfxRemoteError, CFX_LOG_NET, "rank %d is gone (test)", peer_rank);
}

/* Both waits of connect (the receiver's accept, the sender's connect to a
 * listener that is no more) end on connect_check's word, with its result
 * and sentence, long before the transport's own 60 s. */
Test(socket, connect_waits_end_when_connect_check_says_the_peer_is_gone, .timeout = 30)
{
    use_loopback(2, 1);
    struct rank_side sides[2];
    for (int r = 0; r < 2; r++) {
        memset(&sides[r], 0, sizeof(sides[r]));
        sides[r].rank = r;
        sides[r].env = (struct cfx_transport_env){.rank = r,
                                                  .nranks = 2,
                                                  .abort_flag = &sides[r].abort_flag,
                                                  .connect_timeout_s = 60,
                                                  .connect_check = gone_on_third_look};
        sides[r].self = (struct cfx_transport_peer){.rank = r, .pid = getpid(), .cuda_dev = -1};
        cr_assert_eq(tp->init(&sides[r].env, &sides[r].ctx), cfxSuccess, "%s",
                     cfx_error_thread_last());
    }
    struct cfx_connector rx, tx;
    unsigned char rx_info[CFX_CONNECT_INFO_BYTES], tx_info[CFX_CONNECT_INFO_BYTES];
    conn_setup(&sides[0], &sides[1], CFX_CONN_SEND, 4096, 2, &tx, tx_info);
    conn_setup(&sides[1], &sides[0], CFX_CONN_RECV, 4096, 2, &rx, rx_info);

    gone_checks = 0;
    int64_t start = cfx_time_now_ns();
    cfxResult_t res = tp->connect(sides[1].ctx, &rx, tx_info); /* Rank 0 never connects. */
    int64_t took_ms = (cfx_time_now_ns() - start) / CFX_NS_PER_MS;
    cr_assert_eq(res, cfxRemoteError, "receiver's connect returned %d", (int)res);
    cr_assert(took_ms < 3000, "the receiver waited %lld ms", (long long)took_ms);
    cr_assert(strstr(cfx_error_thread_last(), "rank 0 is gone (test)") != NULL, "sentence: %s",
              cfx_error_thread_last());

    /* The receiver leaves: its listener refuses, which a sender retries. */
    tp->close(sides[1].ctx, &rx);
    side_fini(&sides[1]);
    gone_checks = 0;
    start = cfx_time_now_ns();
    res = tp->connect(sides[0].ctx, &tx, rx_info);
    took_ms = (cfx_time_now_ns() - start) / CFX_NS_PER_MS;
    cr_assert_eq(res, cfxRemoteError, "sender's connect returned %d", (int)res);
    cr_assert(took_ms < 3000, "the sender waited %lld ms", (long long)took_ms);
    cr_assert(strstr(cfx_error_thread_last(), "rank 1 is gone (test)") != NULL, "sentence: %s",
              cfx_error_thread_last());
    tp->close(sides[0].ctx, &tx);
    side_fini(&sides[0]);
}

/* ------------------------------------------------------------ lifecycle */

Test(socket, half_built_and_empty_connectors_close_and_fini_accepts_null, .timeout = 30)
{
    use_loopback(2, 1);
    struct rank_side sides[2];
    side_init(&sides[0], 0, 5);
    side_init(&sides[1], 1, 5);
    struct cfx_connector never_set_up, tx, rx;
    unsigned char info[CFX_CONNECT_INFO_BYTES];
    memset(&never_set_up, 0, sizeof(never_set_up));
    tp->close(sides[0].ctx, &never_set_up);
    conn_setup(&sides[0], &sides[1], CFX_CONN_SEND, 64 * 1024, CFX_MAX_STEPS, &tx, info);
    conn_setup(&sides[0], &sides[1], CFX_CONN_RECV, 64 * 1024, 3, &rx, info);
    cr_assert_eq(tp->can_connect(sides[0].ctx, &sides[0].self, &sides[1].self), 1);
    tp->close(sides[0].ctx, &tx);
    tp->close(sides[0].ctx, &rx);
    cr_assert(tx.priv == NULL && tx.fifo == NULL && rx.priv == NULL);
    side_fini(&sides[0]);
    side_fini(&sides[1]);
    tp->fini(NULL);
    cr_assert_eq(tp->version, CFX_TRANSPORT_VERSION);
    cr_assert(tp->flags & CFX_TRANSPORT_FLAG_PROGRESS);
}

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

Test(socket, idle_progress_threads_sleep, .timeout = 30)
{
    use_loopback(2, 1);
    struct pair p;
    pair_open(&p, 64 * 1024, 4);
    post_one(&p.tx, 0, 1); /* Some traffic first, then nothing. */
    int64_t deadline = cfx_time_now_ns() + 10 * CFX_NS_PER_SEC;
    while (!cfx_conn_can_take(&p.rx))
        cr_assert(cfx_time_now_ns() < deadline, "the slot never arrived");
    char why[256];
    cr_assert_eq(take_one(&p.rx, 0, 1, why, sizeof(why)), 0, "%s", why);
    usleep(50 * 1000);
    double before = cpu_seconds();
    usleep(500 * 1000);
    double used = cpu_seconds() - before;
    cr_assert(used < 0.1, "two idle progress threads used %.3f s of CPU in 0.5 s", used);
    /* And they wake up for the next slot. */
    post_one(&p.tx, 1, 1);
    deadline = cfx_time_now_ns() + 10 * CFX_NS_PER_SEC;
    while (!cfx_conn_can_take(&p.rx))
        cr_assert(cfx_time_now_ns() < deadline, "the slot after the sleep never arrived");
    cr_assert_eq(take_one(&p.rx, 1, 1, why, sizeof(why)), 0, "%s", why);
    pair_close(&p);
}
