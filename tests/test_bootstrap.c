/*
 * The bootstrap network: allgather, barrier and messages between ranks; a
 * missing rank is a timeout that names it; strangers at the root are turned
 * away while the real ranks still join.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "src/bootstrap/bootstrap.h"
#include "src/bootstrap/wire.h"
#include "src/util/error.h"
#include "src/util/time.h"
#include "tests/harness.h"

struct shape {
    int nranks;
    enum cfx_test_mode mode;
};

/* ------------------------------------------------ allgather, barrier, p2p */

#define BIG_BYTES (1 << 20) /* Larger than socket buffers: both directions must flow. */

static void exchange(struct cfx_test_rank *ctx)
{
    struct cfx_bootstrap *bs = NULL;
    int n = ctx->nranks, me = ctx->rank;
    cfx_test_step(ctx, "cfx_bootstrap_init");
    cfxResult_t res = cfx_bootstrap_init(&ctx->id, me, n, NULL, &bs);
    RANK_ASSERT(ctx, res == cfxSuccess, "init: %s", cfxGetLastError(NULL));
    RANK_ASSERT(ctx, cfx_bootstrap_rank(bs) == me && cfx_bootstrap_nranks(bs) == n, "identity");

    /* Small allgather: three ints per rank. */
    int small[64 * 3];
    for (int i = 0; i < 3; i++)
        small[me * 3 + i] = me * 1000 + i;
    cfx_test_step(ctx, "small allgather");
    RANK_ASSERT(ctx, cfx_bootstrap_allgather(bs, small, 3 * sizeof(int)) == cfxSuccess, "%s",
                cfxGetLastError(NULL));
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 3; i++)
            RANK_ASSERT(ctx, small[r * 3 + i] == r * 1000 + i, "small[%d][%d] = %d", r, i,
                        small[r * 3 + i]);

    /* Large allgather. */
    unsigned char *big = malloc((size_t)BIG_BYTES * (size_t)n);
    RANK_ASSERT(ctx, big != NULL, "malloc");
    for (size_t i = 0; i < BIG_BYTES; i++)
        big[(size_t)me * BIG_BYTES + i] = (unsigned char)(i * 31 + (size_t)me);
    cfx_test_step(ctx, "large allgather");
    res = cfx_bootstrap_allgather(bs, big, BIG_BYTES);
    int bad = -1;
    for (int r = 0; r < n && bad < 0 && res == cfxSuccess; r++)
        for (size_t i = 0; i < BIG_BYTES; i++)
            if (big[(size_t)r * BIG_BYTES + i] != (unsigned char)(i * 31 + (size_t)r)) {
                bad = r;
                break;
            }
    free(big);
    RANK_ASSERT(ctx, res == cfxSuccess, "large allgather: %s", cfxGetLastError(NULL));
    RANK_ASSERT(ctx, bad < 0, "large allgather: block of rank %d is wrong", bad);

    cfx_test_step(ctx, "barrier");
    RANK_ASSERT(ctx, cfx_bootstrap_barrier(bs) == cfxSuccess, "%s", cfxGetLastError(NULL));

    /* Messages: two tags to the next rank, sent in one order, received in the other. */
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    int a = me * 10 + 1, b = me * 10 + 2, got_a = -1, got_b = -1;
    cfx_test_step(ctx, "send to rank %d", next);
    RANK_ASSERT(ctx, cfx_bootstrap_send(bs, next, 2, &b, sizeof(b)) == cfxSuccess, "%s",
                cfxGetLastError(NULL));
    RANK_ASSERT(ctx, cfx_bootstrap_send(bs, next, 1, &a, sizeof(a)) == cfxSuccess, "%s",
                cfxGetLastError(NULL));
    cfx_test_step(ctx, "recv from rank %d", prev);
    RANK_ASSERT(ctx, cfx_bootstrap_recv(bs, prev, 1, &got_a, sizeof(got_a)) == cfxSuccess, "%s",
                cfxGetLastError(NULL));
    RANK_ASSERT(ctx, cfx_bootstrap_recv(bs, prev, 2, &got_b, sizeof(got_b)) == cfxSuccess, "%s",
                cfxGetLastError(NULL));
    RANK_ASSERT(ctx, got_a == prev * 10 + 1 && got_b == prev * 10 + 2, "got %d and %d from %d",
                got_a, got_b, prev);

    /* A size that disagrees with the sender's is an error, not corruption. */
    if (n > 1) {
        cfx_test_step(ctx, "size mismatch");
        RANK_ASSERT(ctx, cfx_bootstrap_send(bs, next, 3, &a, sizeof(a)) == cfxSuccess, "%s",
                    cfxGetLastError(NULL));
        long long wide = 0;
        res = cfx_bootstrap_recv(bs, prev, 3, &wide, sizeof(wide));
        RANK_ASSERT(ctx, res == cfxInternalError, "mismatched size returned %d", res);
        RANK_ASSERT(ctx, strstr(cfx_error_thread_last(), "expected 8") != NULL, "sentence: %s",
                    cfx_error_thread_last());
    }
    /* Messages are setup data: a larger one is refused before it leaves. */
    static char too_big[CFX_BOOTSTRAP_MAX_MESSAGE_BYTES + 1];
    cfx_test_step(ctx, "oversized send");
    res = cfx_bootstrap_send(bs, next, 4, too_big, sizeof(too_big));
    RANK_ASSERT(ctx, res == cfxInternalError, "an oversized send returned %d", res);
    cfx_test_step(ctx, "final barrier");
    RANK_ASSERT(ctx, cfx_bootstrap_barrier(bs) == cfxSuccess, "%s", cfxGetLastError(NULL));
    cfx_bootstrap_destroy(bs);
}

ParameterizedTestParameters(bootstrap, allgather_barrier_and_messages)
{
    static struct shape shapes[] = {{1, CFX_TEST_PROCS},   {2, CFX_TEST_PROCS},
                                    {5, CFX_TEST_PROCS},   {8, CFX_TEST_PROCS},
                                    {2, CFX_TEST_THREADS}, {7, CFX_TEST_THREADS}};
    return cr_make_param_array(struct shape, shapes, sizeof(shapes) / sizeof(shapes[0]));
}

ParameterizedTest(struct shape *shape, bootstrap, allgather_barrier_and_messages, .timeout = 120)
{
    cr_log_info("%d ranks as %s", shape->nranks,
                shape->mode == CFX_TEST_PROCS ? "processes" : "threads");
    struct cfx_test_options opts = {.nranks = shape->nranks, .mode = shape->mode, .deadline_s = 90};
    CFX_TEST_RUN(&opts, exchange);
}

/* ------------------------------------------------------ missing rank */

static void expect_missing_rank_two(struct cfx_test_rank *ctx)
{
    cfxComm_t comm = NULL;
    cfx_test_step(ctx, "cfxCommInitRank while rank 2 never comes");
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    RANK_ASSERT(ctx, res == cfxTimeout, "init returned %s, expected a timeout",
                cfxGetErrorString(res));
    RANK_ASSERT(ctx, comm == NULL, "comm set on failure");
    RANK_ASSERT(ctx, strstr(cfxGetLastError(NULL), "rank(s) 2 of 4 never joined") != NULL,
                "sentence does not name rank 2: %s", cfxGetLastError(NULL));
}

Test(bootstrap, missing_rank_is_a_timeout_that_names_it, .timeout = 60)
{
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", "2");
    struct cfx_test_options opts = {
        .nranks = 4, .mode = CFX_TEST_PROCS, .deadline_s = 30, .skip_ranks = 1ull << 2};
    CFX_TEST_RUN(&opts, expect_missing_rank_two);
}

/* ------------------------------------------------------ strangers */

static int connect_to_root(const cfxUniqueId *id)
{
    struct cfx_bootstrap_id bid;
    memcpy(&bid, id->internal, sizeof(bid));
    union cfx_sockaddr addr;
    cr_assert_eq(cfx_socket_addr_from_wire(&bid.root, &addr), cfxSuccess);
    int fd = socket(addr.sa.sa_family, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    cr_assert_eq(connect(fd, &addr.sa, cfx_socket_addr_len(&addr)), 0, "connect to the root");
    return fd;
}

/* The root closed the connection: a read returns EOF (or reset) within 5 s. */
static void assert_closed_by_root(int fd, const char *who)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int ready = poll(&pfd, 1, 5000);
    cr_assert(ready == 1, "%s: the root kept the connection open", who);
    char byte;
    ssize_t n = recv(fd, &byte, 1, 0);
    cr_assert(n <= 0, "%s: the root answered a stranger", who);
    close(fd);
}

static void init_and_destroy(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    RANK_CFX(ctx, cfxCommFinalize(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

static struct cfx_bootstrap_hello hello_for(const cfxUniqueId *id)
{
    struct cfx_bootstrap_id bid;
    memcpy(&bid, id->internal, sizeof(bid));
    struct cfx_bootstrap_hello hello = {
        .magic = CFX_BOOTSTRAP_MAGIC, .secret = bid.secret, .rank = 0, .nranks = 3};
    hello.listen_addr.family = AF_INET;
    return hello;
}

enum stranger { WRONG_SECRET, GARBAGE, OVERSIZED_NRANKS, RANK_OUT_OF_RANGE, SLOW_SENDER };

static void stranger_then_ranks(enum stranger kind, const char *name)
{
    cfx_test_setenv("CFX_BOOTSTRAP_FRAME_TIMEOUT_MS", "500");
    cfxUniqueId id;
    cr_assert_eq(cfxGetUniqueId(&id), cfxSuccess);
    int fd = connect_to_root(&id);
    struct cfx_bootstrap_hello hello = hello_for(&id);
    switch (kind) {
    case WRONG_SECRET: hello.secret ^= 0x5a5a5a5a5a5a5a5aull; break;
    case OVERSIZED_NRANKS: hello.nranks = 0x7fffffff; break;
    case RANK_OUT_OF_RANGE: hello.rank = 3; break;
    case GARBAGE: memset(&hello, 0xab, sizeof(hello)); break;
    case SLOW_SENDER: break;
    }
    /* The slow sender sends half its greeting and stops. */
    size_t bytes = kind == SLOW_SENDER ? sizeof(hello) / 2 : sizeof(hello);
    cr_assert_eq(send(fd, &hello, bytes, 0), (ssize_t)bytes);
    /* The root, still waiting for its ranks, hangs up on the stranger... */
    assert_closed_by_root(fd, name);
    /* ...and then serves the real ranks. */
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_THREADS, .deadline_s = 30, .id = &id};
    CFX_TEST_RUN(&opts, init_and_destroy);
}

Test(bootstrap_root, stranger_with_wrong_secret_is_closed_and_ranks_join, .timeout = 60)
{
    stranger_then_ranks(WRONG_SECRET, "wrong secret");
}

Test(bootstrap_root, stranger_sending_garbage_is_closed_and_ranks_join, .timeout = 60)
{
    stranger_then_ranks(GARBAGE, "garbage");
}

Test(bootstrap_root, oversized_rank_count_is_closed_and_ranks_join, .timeout = 60)
{
    stranger_then_ranks(OVERSIZED_NRANKS, "oversized nranks");
}

Test(bootstrap_root, rank_out_of_range_is_closed_and_ranks_join, .timeout = 60)
{
    stranger_then_ranks(RANK_OUT_OF_RANGE, "rank out of range");
}

Test(bootstrap_root, slow_sender_is_closed_and_ranks_join, .timeout = 60)
{
    stranger_then_ranks(SLOW_SENDER, "slow sender");
}

/* ------------------------------------------------- a rank's listener */

/* A peer that knows the secret still cannot make a rank allocate more than
 * the largest setup message: the header is refused before any allocation. */
Test(bootstrap_peer, message_header_larger_than_a_setup_message_is_refused)
{
    const uint64_t secret = 0x1122334455667788ull;
    struct cfx_bootstrap_peer_hdr hdr = {.magic = CFX_BOOTSTRAP_MAGIC,
                                         .secret = secret,
                                         .kind = CFX_BOOTSTRAP_KIND_MESSAGE,
                                         .src_rank = 1,
                                         .tag = 7};
    cr_assert_leq(CFX_BOOTSTRAP_MAX_MESSAGE_BYTES, 64 * 1024,
                  "the bound must be that of a setup message, not of bulk data");
    const uint64_t accepted[] = {0, 300, CFX_BOOTSTRAP_MAX_MESSAGE_BYTES};
    for (size_t i = 0; i < sizeof(accepted) / sizeof(accepted[0]); i++) {
        hdr.size = accepted[i];
        cr_assert_null(cfx_bootstrap_peer_hdr_refusal(&hdr, secret, 0, 2, 0),
                       "a %llu-byte message was refused", (unsigned long long)hdr.size);
    }
    const uint64_t refused[] = {CFX_BOOTSTRAP_MAX_MESSAGE_BYTES + 1, 1 << 20, 1ull << 30,
                                UINT64_MAX};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        hdr.size = refused[i];
        cr_assert_not_null(cfx_bootstrap_peer_hdr_refusal(&hdr, secret, 0, 2, 0),
                           "a %llu-byte message was accepted", (unsigned long long)hdr.size);
    }
}

/* ------------------------------------------------- duplicate claims */

/* Four ranks claim ranks 0, 1, 1 and 2 of 4: the rank claimed twice fails
 * every rank of the job at once with a sentence, not just the second claimer
 * (and not a timeout about rank 3). */
static void claim_rank_one_twice(struct cfx_test_rank *ctx)
{
    static const int claims[] = {0, 1, 1, 2};
    struct cfx_bootstrap *bs = NULL;
    cfx_test_step(ctx, "cfx_bootstrap_init as rank %d", claims[ctx->rank]);
    cfxResult_t res = cfx_bootstrap_init(&ctx->id, claims[ctx->rank], 4, NULL, &bs);
    RANK_ASSERT(ctx, res != cfxSuccess, "joined as rank %d although rank 1 was claimed twice",
                claims[ctx->rank]);
    RANK_ASSERT(ctx, strstr(cfx_error_thread_last(), "rank 1 was claimed twice") != NULL,
                "sentence does not name the duplicate: %s", cfx_error_thread_last());
}

Test(bootstrap_root, a_rank_claimed_twice_fails_every_rank_of_the_job, .timeout = 60)
{
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", "20");
    struct cfx_test_options opts = {.nranks = 4, .mode = CFX_TEST_THREADS, .deadline_s = 15};
    CFX_TEST_RUN(&opts, claim_rank_one_twice);
}

/* ------------------------------------------------- idle connections */

/* 300 idle connections to the root, more than it keeps half-open: the
 * ranks still join, without waiting for the strangers' greeting time. */
Test(bootstrap_root, idle_connections_beyond_the_pending_slots_do_not_keep_ranks_out, .timeout = 60)
{
    enum { N_IDLE = 300 };
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", "10");
    cfxUniqueId id;
    cr_assert_eq(cfxGetUniqueId(&id), cfxSuccess);
    int fds[N_IDLE];
    for (int i = 0; i < N_IDLE; i++)
        fds[i] = connect_to_root(&id);
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_THREADS, .deadline_s = 30, .id = &id};
    CFX_TEST_RUN(&opts, init_and_destroy);
    for (int i = 0; i < N_IDLE; i++)
        close(fds[i]);
}

#define N_IDLE_PEERS 20

/* Rank 0 opens idle connections to rank 1's listener, then sends it a
 * message: rank 1 gets it at once, however long strangers may take to greet. */
static void message_past_idle_connections(struct cfx_test_rank *ctx)
{
    struct cfx_bootstrap *bs = NULL;
    int fds[N_IDLE_PEERS];
    int n_fds = 0;
    cfx_test_step(ctx, "cfx_bootstrap_init");
    RANK_ASSERT(ctx, cfx_bootstrap_init(&ctx->id, ctx->rank, 2, NULL, &bs) == cfxSuccess,
                "init: %s", cfx_error_thread_last());
    if (ctx->rank == 0) {
        union cfx_sockaddr addr;
        RANK_ASSERT(ctx, cfx_bootstrap_peer_addr(bs, 1, &addr) == cfxSuccess, "no address");
        for (; n_fds < N_IDLE_PEERS; n_fds++) {
            fds[n_fds] = socket(addr.sa.sa_family, SOCK_STREAM, 0);
            RANK_ASSERT(ctx,
                        fds[n_fds] >= 0 &&
                            connect(fds[n_fds], &addr.sa, cfx_socket_addr_len(&addr)) == 0,
                        "idle connection %d: %s", n_fds, strerror(errno));
        }
    }
    cfx_test_step(ctx, "barrier after the idle connections");
    RANK_ASSERT(ctx, cfx_bootstrap_barrier(bs) == cfxSuccess, "%s", cfx_error_thread_last());
    int value = 42, got = -1;
    if (ctx->rank == 0) {
        cfx_test_step(ctx, "send to rank 1");
        RANK_ASSERT(ctx, cfx_bootstrap_send(bs, 1, 7, &value, sizeof(value)) == cfxSuccess, "%s",
                    cfx_error_thread_last());
    } else {
        cfx_test_step(ctx, "recv from rank 0 behind %d idle connections", N_IDLE_PEERS);
        int64_t start = cfx_time_now_ns();
        cfxResult_t res = cfx_bootstrap_recv(bs, 0, 7, &got, sizeof(got));
        double took_s = (double)(cfx_time_now_ns() - start) / 1e9;
        RANK_ASSERT(ctx, res == cfxSuccess && got == value, "recv: %s", cfx_error_thread_last());
        RANK_ASSERT(ctx, took_s < 1.5, "recv took %.1f s behind idle connections", took_s);
    }
    cfx_test_step(ctx, "final barrier");
    RANK_ASSERT(ctx, cfx_bootstrap_barrier(bs) == cfxSuccess, "%s", cfx_error_thread_last());
    for (int i = 0; i < n_fds; i++)
        close(fds[i]);
    cfx_bootstrap_destroy(bs);
}

Test(bootstrap_peer, idle_connections_cost_a_rank_no_time, .timeout = 120)
{
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", "5");
    cfx_test_setenv("CFX_BOOTSTRAP_FRAME_TIMEOUT_MS", "2000");
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 100};
    CFX_TEST_RUN(&opts, message_past_idle_connections);
}

/* ------------------------------------------------- sentences */

/* A message that never comes is named by what its tag means, not by the
 * raw number ("tag 1129185794"). */
static void recv_connection_info_that_never_comes(struct cfx_test_rank *ctx)
{
    struct cfx_bootstrap *bs = NULL;
    RANK_ASSERT(ctx, cfx_bootstrap_init(&ctx->id, ctx->rank, ctx->nranks, NULL, &bs) == cfxSuccess,
                "init: %s", cfx_error_thread_last());
    if (ctx->rank == 1) {
        int value;
        cfx_test_step(ctx, "recv a message rank 0 never sends");
        cfxResult_t res = cfx_bootstrap_recv(bs, 0, 0x434e0102u, &value, sizeof(value));
        RANK_ASSERT(ctx, res == cfxTimeout, "recv returned %d", res);
        RANK_ASSERT(ctx, strstr(cfx_error_thread_last(), "connection setup \"CN\" 0x0102") != NULL,
                    "sentence: %s", cfx_error_thread_last());
    }
    cfx_bootstrap_destroy(bs);
}

Test(bootstrap_peer, a_missing_message_is_named_by_what_its_tag_means, .timeout = 60)
{
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", "1");
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 30};
    CFX_TEST_RUN(&opts, recv_connection_info_that_never_comes);
}

/* ------------------------------------------------- out of descriptors */

/* The root's process has no descriptor left when a rank connects: the rank
 * hears "too many open files" at once, not a timeout. The rank is a child
 * process, which closes its copies of the fillers first. */
Test(bootstrap_root, root_out_of_descriptors_fails_the_rank_fast, .timeout = 60)
{
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", "10");
    cfxUniqueId id;
    cr_assert_eq(cfxGetUniqueId(&id), cfxSuccess);
    int report[2];
    cr_assert_eq(pipe(report), 0);
    enum { MAX_FILLERS = 4096 };
    static int fillers[MAX_FILLERS];
    struct rlimit limit;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &limit), 0);
    struct rlimit low = limit;
    low.rlim_cur = 512;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    int n_fillers = 0;
    while (n_fillers < MAX_FILLERS && (fillers[n_fillers] = dup(report[0])) >= 0)
        n_fillers++;
    cr_assert(n_fillers < MAX_FILLERS && errno == EMFILE, "could not exhaust descriptors");
    pid_t child = fork();
    if (child == 0) {
        for (int i = 0; i < n_fillers; i++)
            close(fillers[i]);
        struct cfx_bootstrap *bs = NULL;
        int64_t start = cfx_time_now_ns();
        cfxResult_t res = cfx_bootstrap_init(&id, 0, 1, NULL, &bs);
        char line[CFX_ERROR_MAX + 64];
        int n = snprintf(line, sizeof(line), "%d %.1f %s", res,
                         (double)(cfx_time_now_ns() - start) / 1e9, cfx_error_thread_last());
        if (write(report[1], line, (size_t)n) < 0)
            _exit(2);
        _exit(0);
    }
    /* report[1] stays open here until the end: closing it would free a descriptor. */
    char line[CFX_ERROR_MAX + 64] = "";
    struct pollfd pfd = {.fd = report[0], .events = POLLIN};
    int ready = poll(&pfd, 1, 30000);
    ssize_t n = ready == 1 ? read(report[0], line, sizeof(line) - 1) : -1;
    for (int i = 0; i < n_fillers; i++)
        close(fillers[i]);
    close(report[0]);
    close(report[1]);
    setrlimit(RLIMIT_NOFILE, &limit);
    waitpid(child, NULL, 0);
    cr_assert(n > 0, "the rank reported nothing within 30 s");
    line[n] = '\0';
    int res = -1;
    double took_s = -1;
    cr_assert_eq(sscanf(line, "%d %lf", &res, &took_s), 2, "report: %s", line);
    cr_assert_neq(res, cfxSuccess, "the rank joined: %s", line);
    cr_assert(strstr(line, "too many open files") != NULL, "sentence: %s", line);
    cr_assert_lt(took_s, 5.0, "the rank waited %.1f s: %s", took_s, line);
}

/* ------------------------------------------------- unused ids */

static int threads_of_this_process(void)
{
    FILE *status = fopen("/proc/self/status", "r");
    cr_assert_not_null(status);
    char line[256];
    int threads = -1;
    while (fgets(line, sizeof(line), status))
        if (sscanf(line, "Threads: %d", &threads) == 1)
            break;
    fclose(status);
    return threads;
}

/* An id that is never used costs neither a descriptor nor a thread: 300
 * ids under `ulimit -n 256` are made, and the last one still works. */
Test(bootstrap_root, unused_ids_cost_no_descriptor_and_no_thread, .timeout = 60)
{
    enum { N_IDS = 300 };
    struct rlimit limit;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &limit), 0);
    limit.rlim_cur = 256;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &limit), 0, "setrlimit: %s", strerror(errno));
    cfxUniqueId id;
    for (int i = 0; i < N_IDS; i++)
        cr_assert_eq(cfxGetUniqueId(&id), cfxSuccess, "id %d of %d: %s", i + 1, N_IDS,
                     cfxGetLastError(NULL));
    int threads = threads_of_this_process();
    cr_assert_lt(threads, 8, "%d ids left %d threads", N_IDS, threads);
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_THREADS, .deadline_s = 30, .id = &id};
    CFX_TEST_RUN(&opts, init_and_destroy);
}
