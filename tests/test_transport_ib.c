/*
 * The verbs transport. With the machine's own libibverbs (no RDMA device
 * here: no NIC, and a kernel without InfiniBand) it must say why at INFO
 * and leave the job to sockets, or fail init with a sentence under
 * CFX_NET=IB. Over tests/fakeverbs (a libibverbs of the project's own that
 * behaves like an RC NIC, moving bytes over TCP; CFX_TEST_FAKEVERBS names
 * it) every rank claims its own host and CFX_NET=IB makes every connection
 * a verbs one: collectives, a killed rank, and each of the fake NIC's fault
 * knobs. Nothing here measures RDMA: no RDMA hardware is involved.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/util/verbs.h"
#include "tests/coll_check.h"
#include "tests/coll_rounds.h"
#include "tests/harness.h"
#include "tests/registered_rounds.h"

int cfx_ib_hca_match(const char *spec, const char *name, int port); /* transports/ib/device.c */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Every connection between hosts over the fake NIC, or a skip saying why
 * there is none. */
static void use_fake(void)
{
    if (cfx_test_use_fakeverbs() == NULL)
        cr_skip_test("no fake-verbs library (CFX_TEST_FAKEVERBS=%s): built without the verbs "
                     "headers?",
                     getenv("CFX_TEST_FAKEVERBS") ? getenv("CFX_TEST_FAKEVERBS") : "unset");
}

/* Every process its own host: every connection crosses the "network". */
static void own_host(struct cfx_test_rank *ctx)
{
    char host[32];
    snprintf(host, sizeof(host), "ib-test-host-%d", ctx->rank);
    cfx_test_setenv("CFX_HOSTID", host);
    cfx_verbs_api_reset();
}

/* ------------------------------------------------------------ CFX_IB_HCA */

Test(ib_hca, the_filter_reads_nccls_syntax)
{
    cr_assert(cfx_ib_hca_match(NULL, "mlx5_0", 1));
    cr_assert(cfx_ib_hca_match("", "mlx5_0", 1));
    cr_assert(cfx_ib_hca_match("mlx5", "mlx5_1", 1), "a prefix matches");
    cr_assert(!cfx_ib_hca_match("=mlx5", "mlx5_1", 1), "= wants the whole name");
    cr_assert(cfx_ib_hca_match("=mlx5_1", "mlx5_1", 2));
    cr_assert(cfx_ib_hca_match("mlx5_0:1,mlx5_1", "mlx5_1", 2));
    cr_assert(!cfx_ib_hca_match("mlx5_0:1,mlx5_1", "mlx5_0", 2), "port 2 of mlx5_0 is not listed");
    cr_assert(!cfx_ib_hca_match("^mlx5_0", "mlx5_0", 1), "^ excludes");
    cr_assert(cfx_ib_hca_match("^mlx5_0", "mlx5_1", 1));
    cr_assert(!cfx_ib_hca_match("^=mlx5_1:1", "mlx5_1", 1));
    cr_assert(cfx_ib_hca_match("^=mlx5_1:1", "mlx5_1", 2));
    cr_assert(!cfx_ib_hca_match("bnxt", "mlx5_0", 1));
}

/* ------------------------------------------------------------ without a device */

static void a_few_allreduces(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    static const size_t counts[] = {1, 5, 1000, 65536, 1 << 20};
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]) && !ctx->slot_failed; i++)
        cfx_test_allreduce_check(ctx, comm, counts[i]);
    if (!ctx->slot_failed)
        RANK_CFX(ctx, cfxCommFinalize(comm));
    cfxCommDestroy(comm);
}

Test(ib_off, without_a_verbs_device_sockets_carry_the_job_and_info_says_why, .timeout = 60)
{
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "nodev");
    cfx_test_setenv("CFX_IB_VERBS_LIB", NULL); /* The machine's own libibverbs, if any. */
    cfx_test_setenv("CFX_NET", NULL);
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 40, .before_rank = own_host};
    CFX_TEST_RUN(&opts, a_few_allreduces);
    int why = cfx_test_count_in_logs(logs, "ib: not used by rank");
    int socket = cfx_test_count_in_logs(logs, "socket transport: rank 0 -> rank 1 connected");
    int ib = cfx_test_count_in_logs(logs, "ib: rank 0 -> rank 1 connected");
    cfx_test_remove_logs(logs);
    cr_assert_geq(why, 2, "each rank says at INFO why verbs is not used (%d lines)", why);
    cr_assert_geq(socket, 1, "no socket connection from rank 0 to rank 1 in the log");
    cr_assert_eq(ib, 0, "a verbs connection without a verbs device");
}

static void init_must_fail_for_want_of_verbs(struct cfx_test_rank *ctx)
{
    cfxComm_t comm = NULL;
    cfx_test_step(ctx, "init under CFX_NET=IB without a device");
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    RANK_ASSERT(ctx, res != cfxSuccess, "init succeeded without any verbs device");
    const char *why = cfxGetLastError(NULL);
    RANK_ASSERT(ctx, strstr(why, "CFX_NET=IB") != NULL && strstr(why, "no verbs device") != NULL,
                "the sentence does not say CFX_NET=IB and why verbs cannot run: %s", why);
}

Test(ib_off, net_ib_without_a_device_fails_init_with_a_sentence, .timeout = 60)
{
    cfx_test_setenv("CFX_IB_VERBS_LIB", NULL);
    cfx_test_setenv("CFX_NET", "IB");
    cfx_test_setenv("CFX_TIMEOUT", "5");
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 40, .before_rank = own_host};
    CFX_TEST_RUN(&opts, init_must_fail_for_want_of_verbs);
}

/* ------------------------------------------------------------ over fake-verbs */

ParameterizedTestParameters(ib_fake, allreduce_over_verbs)
{
    static int ranks[] = {2, 3, 4};
    return cr_make_param_array(int, ranks, 3);
}

ParameterizedTest(int *nranks, ib_fake, allreduce_over_verbs, .timeout = 120)
{
    use_fake();
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "fake");
    struct cfx_test_options opts = {
        .nranks = *nranks, .mode = CFX_TEST_PROCS, .deadline_s = 90, .before_rank = own_host};
    CFX_TEST_RUN(&opts, a_few_allreduces);
    int ib = cfx_test_count_in_logs(logs, "ib: rank 0 -> rank 1 connected");
    int socket = cfx_test_count_in_logs(logs, "socket transport: rank 0 -> rank 1 connected");
    cfx_test_remove_logs(logs);
    cr_assert_geq(ib, 1, "no verbs connection from rank 0 to rank 1 in the log");
    cr_assert_eq(socket, 0, "a socket connection under CFX_NET=IB");
}

Test(ib_fake, roce_link_layer_connects_through_the_ipv4_gid, .timeout = 120)
{
    use_fake();
    cfx_test_setenv("FAKEVERBS_LINK_LAYER", "roce");
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "roce");
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 90, .before_rank = own_host};
    CFX_TEST_RUN(&opts, a_few_allreduces);
    int roce = cfx_test_count_in_logs(logs, "(RoCE, lid");
    cfx_test_remove_logs(logs);
    cfx_test_setenv("FAKEVERBS_LINK_LAYER", NULL);
    cr_assert_geq(roce, 2, "the ranks did not report RoCE ports");
}

Test(ib_fake, hca_filter_that_excludes_every_port_leaves_sockets, .timeout = 120)
{
    use_fake();
    cfx_test_setenv("CFX_NET", NULL);
    cfx_test_setenv("CFX_IB_HCA", "^fake");
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "hca");
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 90, .before_rank = own_host};
    CFX_TEST_RUN(&opts, a_few_allreduces);
    int why = cfx_test_count_in_logs(logs, "that CFX_IB_HCA=^fake lets through");
    int socket = cfx_test_count_in_logs(logs, "socket transport: rank 0 -> rank 1 connected");
    cfx_test_remove_logs(logs);
    cfx_test_setenv("CFX_IB_HCA", NULL);
    cr_assert_geq(why, 2, "the ranks did not say the filter left no port");
    cr_assert_geq(socket, 1, "sockets did not carry the job");
}

Test(ib_fake, slots_striped_over_four_queue_pairs_arrive_in_order, .timeout = 120)
{
    use_fake();
    cfx_test_setenv("CFX_IB_QPS_PER_CONNECTION", "4");
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "qps");
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 90, .before_rank = own_host};
    CFX_TEST_RUN(&opts, a_few_allreduces);
    int four = cfx_test_count_in_logs(logs, "; 4 queue pair(s) on 1 port(s))");
    cfx_test_remove_logs(logs);
    cfx_test_setenv("CFX_IB_QPS_PER_CONNECTION", NULL);
    cr_assert_geq(four, 3, "the connections did not use 4 queue pairs (%d lines)", four);
}

/* ------------------------------------------------ registered buffers */

/* Alltoalls of REF_COUNT floats per peer from a send buffer registered
 * (or not: @p arg), each send buffer overwritten the moment the call
 * returns: a send that returned before the NIC had read it delivers the
 * overwritten values. Then the buffer is deregistered and used once more. */
static void alltoall_from_registered(struct cfx_test_rank *ctx)
{
    int registered = *(const int *)ctx->arg, n = ctx->nranks, r = ctx->rank;
    size_t all = REF_COUNT * (size_t)n;
    float *send = calloc(all, sizeof(float)), *recv = calloc(all, sizeof(float));
    RANK_ASSERT(ctx, send && recv, "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, n, ctx->id, r));
    void *handle = NULL;
    if (registered)
        RANK_CFX(ctx, cfxCommRegister(comm, send, all * sizeof(float), &handle));
    for (int round = 0; round < 4 && !ctx->slot_failed; round++) {
        if (round == 3 && registered) {
            RANK_CFX(ctx, cfxCommDeregister(comm, handle)); /* The last round copies. */
        }
        cfx_test_step(ctx, "alltoall round %d, %s", round,
                      registered && round < 3 ? "registered" : "not registered");
        ref_tagged_fill(send, n, r, REF_COUNT, round);
        RANK_CFX(ctx, cfxAlltoAll(send, recv, REF_COUNT, cfxFloat32, comm, NULL));
        for (size_t i = 0; i < all; i++)
            send[i] = -1.0f;
        int from;
        long bad = ref_tagged_check(recv, n, r, REF_COUNT, round, &from);
        RANK_ASSERT(ctx, bad < 0, "round %d: element %ld (from rank %d) is %g", round, bad, from,
                    bad < 0 ? 0.0 : recv[bad]);
    }
    if (!ctx->slot_failed)
        RANK_CFX(ctx, cfxCommFinalize(comm));
    cfxCommDestroy(comm);
    free(send);
    free(recv);
}

ParameterizedTestParameters(ib_fake, registered_send_buffers_are_written_from_where_they_are)
{
    static int registered[] = {1, 0};
    return cr_make_param_array(int, registered, 2);
}

ParameterizedTest(int *registered, ib_fake, registered_send_buffers_are_written_from_where_they_are,
                  .timeout = 120)
{
    use_fake();
    cr_log_info("alltoall over fake-verbs, 3 ranks, send buffers %s",
                *registered ? "registered" : "not registered");
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "ref");
    struct cfx_test_options opts = {.nranks = 3,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 90,
                                    .arg = registered,
                                    .before_rank = own_host};
    CFX_TEST_RUN(&opts, alltoall_from_registered);
    int lines = cfx_test_count_in_logs(logs, "slot(s) from registered buffers");
    /* 3 rounds x 2 full slots per peer (the tail goes in the info line), on
     * each sender's connection to each of its peers. */
    int six = cfx_test_count_in_logs(logs, "wrote 6 slot(s) from registered buffers");
    cfx_test_remove_logs(logs);
    if (*registered) {
        cr_assert_eq(lines, 6, "%d of the 6 send connections wrote from registered buffers", lines);
        cr_assert_eq(six, 6, "%d of the 6 send connections wrote 6 slots from them", six);
    } else {
        cr_assert_eq(lines, 0, "%d connections wrote from registered buffers, none registered",
                     lines);
    }
}

/* Receives into registered buffers: rank 1 posts its receive first (its
 * offer goes ahead), rank 0 sends 0.5 s later, so every full slot is
 * written by the NIC straight into rank 1's buffer; rank 1's buffer holds
 * garbage before each round, so a slot that was not (or a stale slot copied
 * over one that was) shows. @p arg: which buffers are registered (bit 0
 * the send buffer, bit 1 the receive buffer). */
static void send_into_registered(struct cfx_test_rank *ctx)
{
    int which = *(const int *)ctx->arg, r = ctx->rank;
    float *buf = calloc(REF_COUNT, sizeof(float));
    RANK_ASSERT(ctx, buf, "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, r));
    void *handle = NULL;
    if ((r == 0 && (which & 1)) || (r == 1 && (which & 2)))
        RANK_CFX(ctx, cfxCommRegister(comm, buf, REF_COUNT * sizeof(float), &handle));
    /* A small message first connects the pair: a receive launched before
     * its connection exists offers only once connected, as the sender
     * starts. */
    int hello = r;
    if (r == 0)
        RANK_CFX(ctx, cfxSend(&hello, 1, cfxInt32, 1, comm, NULL));
    else
        RANK_CFX(ctx, cfxRecv(&hello, 1, cfxInt32, 0, comm, NULL));
    for (int round = 0; round < 3 && !ctx->slot_failed; round++) {
        for (size_t i = 0; i < REF_COUNT; i++)
            buf[i] = r == 0 ? ref_tagged(0, 1, i, round) : -7.0f;
        if (r == 0) {
            usleep(500 * 1000);
            RANK_CFX(ctx, cfxSend(buf, REF_COUNT, cfxFloat32, 1, comm, NULL));
        } else {
            RANK_CFX(ctx, cfxRecv(buf, REF_COUNT, cfxFloat32, 0, comm, NULL));
            for (size_t i = 0; i < REF_COUNT; i++)
                if (buf[i] != ref_tagged(0, 1, i, round)) {
                    RANK_ASSERT(ctx, 0, "round %d: element %zu is %g, not %g", round, i, buf[i],
                                ref_tagged(0, 1, i, round));
                    break;
                }
        }
    }
    if (handle != NULL)
        RANK_CFX(ctx, cfxCommDeregister(comm, handle));
    if (!ctx->slot_failed)
        RANK_CFX(ctx, cfxCommFinalize(comm));
    cfxCommDestroy(comm);
    free(buf);
}

ParameterizedTestParameters(ib_fake, registered_receive_buffers_are_written_in_place)
{
    static int which[] = {2, 3, 1, 0};
    return cr_make_param_array(int, which, 4);
}

ParameterizedTest(int *which, ib_fake, registered_receive_buffers_are_written_in_place,
                  .timeout = 120)
{
    use_fake();
    cr_log_info("send/recv over fake-verbs, send buffer %s, receive buffer %s",
                (*which & 1) ? "registered" : "not registered",
                (*which & 2) ? "registered" : "not registered");
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "in-place");
    struct cfx_test_options opts = {.nranks = 2,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 90,
                                    .arg = which,
                                    .before_rank = own_host};
    CFX_TEST_RUN(&opts, send_into_registered);
    int lines = cfx_test_count_in_logs(logs, "slot(s) into registered receive buffers");
    /* 3 rounds x 2 full slots (the 12-byte tail goes in the info line). */
    int six = cfx_test_count_in_logs(logs, "rank 0 -> rank 1 wrote 6 slot(s) into registered");
    int from = cfx_test_count_in_logs(logs, "rank 0 -> rank 1 wrote 6 slot(s) from registered");
    cfx_test_remove_logs(logs);
    if (*which & 2)
        cr_assert(lines == 1 && six == 1, "rank 0 did not write its 6 full slots in place");
    else
        cr_assert_eq(lines, 0, "%d connections wrote in place, none registered", lines);
    cr_assert_eq(from, (*which & 1) ? 1 : 0, "slots from the registered send buffer: %d", from);
}

Test(ib_fake, alltoall_between_registered_buffers_is_exact_however_slots_land, .timeout = 120)
{
    use_fake();
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 90, .before_rank = own_host};
    CFX_TEST_RUN(&opts, ref_alltoall_both_registered);
}

/* The shared collective rounds (tests/coll_rounds.h) between buffers
 * registered with cfxCommRegister (or not: @p arg): over verbs, final
 * output and the allreduce's first sends are written from the user's
 * buffers, and final slots into the next rank's output where it offered it. */
static void collectives_between_registered(struct cfx_test_rank *ctx)
{
    int registered = *(const int *)ctx->arg;
    size_t all = REF_COUNT * (size_t)ctx->nranks;
    float *in = calloc(all, sizeof(float)), *out = calloc(all, sizeof(float));
    RANK_ASSERT(ctx, in && out, "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    void *in_handle = NULL, *out_handle = NULL;
    if (registered) {
        RANK_CFX(ctx, cfxCommRegister(comm, in, all * sizeof(float), &in_handle));
        RANK_CFX(ctx, cfxCommRegister(comm, out, all * sizeof(float), &out_handle));
    }
    ref_collective_rounds(ctx, comm, in, out, REF_COUNT);
    if (registered && !ctx->slot_failed) {
        RANK_CFX(ctx, cfxCommDeregister(comm, in_handle));
        RANK_CFX(ctx, cfxCommDeregister(comm, out_handle));
    }
    if (!ctx->slot_failed)
        RANK_CFX(ctx, cfxCommFinalize(comm));
    cfxCommDestroy(comm);
    free(in);
    free(out);
}

ParameterizedTestParameters(ib_fake, collectives_write_final_output_between_registered_buffers)
{
    static int registered[] = {1, 0};
    return cr_make_param_array(int, registered, 2);
}

ParameterizedTest(int *registered, ib_fake,
                  collectives_write_final_output_between_registered_buffers, .timeout = 120)
{
    use_fake();
    cr_log_info("allreduce, broadcast, allgather over fake-verbs, 3 ranks, buffers %s",
                *registered ? "registered" : "not registered");
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "ib-coll");
    struct cfx_test_options opts = {.nranks = 3,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 90,
                                    .arg = registered,
                                    .before_rank = own_host};
    CFX_TEST_RUN(&opts, collectives_between_registered);
    int from = cfx_test_count_in_logs(logs, "slot(s) from registered buffers");
    int into = cfx_test_count_in_logs(logs, "slot(s) into registered receive buffers");
    cfx_test_remove_logs(logs);
    if (*registered) {
        cr_assert_geq(from, 3, "%d send connections wrote from registered buffers", from);
        cr_assert_geq(into, 3, "%d send connections wrote into registered receive buffers", into);
    } else {
        cr_assert(from == 0 && into == 0,
                  "nothing registered, yet %d connections wrote from and %d into registered "
                  "buffers",
                  from, into);
    }
}

static void two_queue_pairs_in_rank_one(struct cfx_test_rank *ctx)
{
    own_host(ctx);
    if (ctx->rank == 1)
        cfx_test_setenv("CFX_IB_QPS_PER_CONNECTION", "2");
}

static void init_fails_naming_the_setting(struct cfx_test_rank *ctx)
{
    cfxComm_t comm = NULL;
    cfx_test_step(ctx, "init with queue pair counts that differ");
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    RANK_ASSERT(ctx, res != cfxSuccess, "init succeeded with different queue pair counts");
    RANK_ASSERT(ctx, strstr(cfxGetLastError(NULL), "CFX_IB_QPS_PER_CONNECTION") != NULL,
                "the sentence does not name the setting: %s", cfxGetLastError(NULL));
}

Test(ib_fake, queue_pair_counts_that_differ_fail_init_naming_the_setting, .timeout = 120)
{
    use_fake();
    cfx_test_setenv("CFX_TIMEOUT", "10");
    struct cfx_test_options opts = {.nranks = 2,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 60,
                                    .before_rank = two_queue_pairs_in_rank_one};
    CFX_TEST_RUN(&opts, init_fails_naming_the_setting);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
}

/* ------------------------------------------------------------ failures */

static void *kill_me_soon(void *arg)
{
    (void)arg;
    usleep(300 * 1000);
    kill(getpid(), SIGKILL);
    return NULL;
}

static void allreduce_until_rank_two_dies(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    size_t count = 1 << 18;
    float *data = calloc(count, sizeof(float));
    RANK_ASSERT(ctx, data != NULL, "malloc");
    if (ctx->rank == 2) {
        pthread_t killer;
        pthread_create(&killer, NULL, kill_me_soon, NULL);
    }
    cfxResult_t res = cfxSuccess;
    double start = 0;
    for (int i = 0; i < 1000000 && res == cfxSuccess; i++) {
        cfx_test_step(ctx, "allreduce %d while rank 2 dies", i);
        start = now_s();
        res = cfxAllReduce(data, data, count, cfxFloat32, cfxSum, comm, NULL);
    }
    double took = now_s() - start;
    RANK_ASSERT(ctx, res == cfxRemoteError, "the call returned %s: %s", cfxGetErrorString(res),
                cfxGetLastError(comm));
    RANK_ASSERT(ctx, took < 12, "the failing call took %.1f s (CFX_TIMEOUT=10)", took);
    RANK_ASSERT(ctx, strstr(cfxGetLastError(comm), "rank 2") != NULL,
                "the sentence does not name rank 2: %s", cfxGetLastError(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
    free(data);
}

ParameterizedTestParameters(ib_fake, killed_rank_fails_every_survivor_with_its_name)
{
    static int nics[] = {1, 2}; /* 2: two fake NICs, a queue pair on each. */
    return cr_make_param_array(int, nics, 2);
}

ParameterizedTest(int *nics, ib_fake, killed_rank_fails_every_survivor_with_its_name,
                  .timeout = 120)
{
    use_fake();
    cr_log_info("%d fake NIC(s) per rank, as many queue pairs per connection", *nics);
    cfx_test_setenv("FAKEVERBS_DEVICES", *nics == 2 ? "2" : NULL);
    cfx_test_setenv("CFX_IB_QPS_PER_CONNECTION", *nics == 2 ? "2" : NULL);
    cfx_test_setenv("CFX_TIMEOUT", "10");
    struct cfx_test_options opts = {.nranks = 4,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 90,
                                    .killed_ranks = 1ull << 2,
                                    .before_rank = own_host};
    CFX_TEST_RUN(&opts, allreduce_until_rank_two_dies);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
    cfx_test_setenv("FAKEVERBS_DEVICES", NULL);
    cfx_test_setenv("CFX_IB_QPS_PER_CONNECTION", NULL);
}

/* One fault knob of the fake NIC, set in rank 1 only. */
struct knob_case {
    char name[48];
    char value[16];
    /* A word the ranks' logs must hold: rank 1 found the fault and said what
     * it was ("": whoever waits times out). Its own call may fail first for
     * a peer's poison, so its sentence need not hold it. */
    char word[48];
    int may_be_harmless; /* The fault may hit nothing that matters (a lost keepalive). */
};

static const struct knob_case *knob_now;

static void knob_in_rank_one(struct cfx_test_rank *ctx)
{
    own_host(ctx);
    if (ctx->rank == 1)
        cfx_test_setenv(knob_now->name, knob_now->value);
}

/* Allreduces of a small and a large count in turn (so every connection the
 * planner makes carries traffic), each result checked, until one fails or
 * 20 s (6 s for a fault that may be harmless) pass. */
static void allreduce_until_the_knob_bites(struct cfx_test_rank *ctx)
{
    const struct knob_case *kc = ctx->arg;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    static const size_t counts[] = {4096, 1 << 20};
    float *data = malloc(counts[1] * sizeof(float));
    RANK_ASSERT(ctx, data != NULL, "malloc");
    cfxResult_t res = cfxSuccess;
    double start = now_s(), call = 0, limit = kc->may_be_harmless ? 6 : 20;
    for (int i = 0; res == cfxSuccess && now_s() - start < limit; i++) {
        size_t count = counts[i % 2];
        for (size_t e = 0; e < count; e++)
            data[e] = (float)(ctx->rank + (int)(e % 5));
        cfx_test_step(ctx, "allreduce %d until %s=%s bites", i, kc->name, kc->value);
        call = now_s();
        res = cfxAllReduce(data, data, count, cfxFloat32, cfxSum, comm, NULL);
        for (size_t e = 0; res == cfxSuccess && e < count; e++) {
            float want = (float)(ctx->nranks * (ctx->nranks - 1) / 2 + ctx->nranks * (int)(e % 5));
            if (data[e] != want) {
                double got = data[e];
                free(data);
                RANK_ASSERT(ctx, 0, "allreduce %d: element %zu is %g, not %g", i, e, got,
                            (double)want);
            }
        }
    }
    free(data);
    if (res == cfxSuccess) {
        cfxCommDestroy(comm);
        RANK_ASSERT(ctx, kc->may_be_harmless, "%s=%s never made an allreduce fail in %.0f s",
                    kc->name, kc->value, limit);
        return;
    }
    RANK_ASSERT(ctx, now_s() - call < 8, "the failing call took %.1f s (CFX_TIMEOUT=5)",
                now_s() - call);
    const char *why = cfxGetLastError(comm);
    RANK_ASSERT(ctx, strstr(why, "rank") != NULL, "the sentence names no rank: %s", why);
    cfxCommDestroy(comm);
}

ParameterizedTestParameters(ib_fake, fault_knob_fails_the_call_with_a_sentence)
{
    static struct knob_case cases[] = {
        {"FAKEVERBS_FAIL_AFTER_WRITES", "200", "(IBV_WC_RETRY_EXC_ERR)", 0},
        {"FAKEVERBS_PORT_DOWN_AFTER_MS", "500", "port 1 on rank 1: port error", 0},
        {"FAKEVERBS_ASYNC_QP_FATAL_AFTER_MS", "500", "rank 1's queue pair to rank", 0},
        /* A lost completion may be a keepalive's (nothing happens) or a
         * slot's: the next one covers it (completions come in order), or
         * the receiver sees the next immediate out of turn (a sentence). */
        {"FAKEVERBS_LOSE_COMPLETION", "300", "", 1},
    };
    return cr_make_param_array(struct knob_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct knob_case *kc, ib_fake, fault_knob_fails_the_call_with_a_sentence,
                  .timeout = 120)
{
    cr_log_info("%s=%s in rank 1", kc->name, kc->value);
    use_fake();
    cfx_test_setenv("CFX_TIMEOUT", "5");
    knob_now = kc;
    struct cfx_test_options opts = {.nranks = 3,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 90,
                                    .arg = kc,
                                    .before_rank = knob_in_rank_one};
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "knob");
    CFX_TEST_RUN(&opts, allreduce_until_the_knob_bites);
    int said = kc->word[0] ? cfx_test_count_in_logs(logs, kc->word) : 1;
    cfx_test_remove_logs(logs);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
    cr_assert_geq(said, 1, "no rank's log says \"%s\"", kc->word);
}

/* ------------------------------------------------ several NICs */

ParameterizedTestParameters(ib_fake, queue_pairs_striped_over_two_nics_carry_every_kind_of_slot)
{
    static int qps[] = {2, 3};
    return cr_make_param_array(int, qps, 2);
}

/* Two fake NICs per rank (distinct LIDs and GIDs: a queue pair addressed
 * to the wrong one is never reached; keys of one NIC's protection domain
 * are refused on the other): queue pair q on port q % 2 at both ends. */
ParameterizedTest(int *qps, ib_fake, queue_pairs_striped_over_two_nics_carry_every_kind_of_slot,
                  .timeout = 120)
{
    use_fake();
    char value[8];
    snprintf(value, sizeof(value), "%d", *qps);
    cfx_test_setenv("FAKEVERBS_DEVICES", "2");
    cfx_test_setenv("CFX_IB_QPS_PER_CONNECTION", value);
    cr_log_info("2 fake NICs per rank, %d queue pairs per connection", *qps);
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "rails");
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 90, .before_rank = own_host};
    CFX_TEST_RUN(&opts, a_few_allreduces);
    /* Alltoalls from registered send buffers: each slot's key is the
     * registration's through the port its queue pair uses. */
    static int registered = 1;
    opts.arg = &registered;
    CFX_TEST_RUN(&opts, alltoall_from_registered);
    char both[64];
    snprintf(both, sizeof(both), "; %d queue pair(s) on 2 port(s))", *qps);
    int striped = cfx_test_count_in_logs(logs, both);
    int second = cfx_test_count_in_logs(logs, "fake_1:1 qpn");
    int crossed = cfx_test_count_in_logs(logs, "fake_0:1 qpn 0 -> fake_1") +
                  cfx_test_count_in_logs(logs, "port(s) on 1 port(s))");
    int six = cfx_test_count_in_logs(logs, "wrote 6 slot(s) from registered buffers");
    int two_ports = cfx_test_count_in_logs(logs, "port 2 of 2");

    /* Receives into a registered buffer: the offer carries a key per port. */
    static int both_registered = 3;
    opts.nranks = 2;
    opts.arg = &both_registered;
    CFX_TEST_RUN(&opts, send_into_registered);
    int in_place = cfx_test_count_in_logs(logs, "wrote 6 slot(s) into registered receive buffers");
    cfx_test_remove_logs(logs);
    cfx_test_setenv("FAKEVERBS_DEVICES", NULL);
    cfx_test_setenv("CFX_IB_QPS_PER_CONNECTION", NULL);
    cr_assert_geq(two_ports, 3, "the ranks did not each say they use 2 ports (%d lines)",
                  two_ports);
    cr_assert_geq(striped, 12, "%d connections of 3 ranks striped over 2 ports (want 12 or more)",
                  striped);
    cr_assert_geq(second, 6, "the second NIC carried no queue pair");
    cr_assert_eq(crossed, 0, "a queue pair paired ports of different index, or used one port");
    cr_assert_eq(six, 6, "%d of the 6 send connections wrote 6 slots from registered buffers", six);
    cr_assert_eq(in_place, 1, "the registered receive was not written in place over 2 ports");
}

static void allreduces_for_three_seconds(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    double start = now_s();
    int more = 1;
    for (int i = 0; more && !ctx->slot_failed; i++) {
        cfx_test_step(ctx, "allreduce %d while fake_1 goes down", i);
        cfx_test_allreduce_check(ctx, comm, i % 2 ? 4096 : 1 << 20);
        /* Rank 0's clock decides for all, so every rank makes as many calls. */
        more = ctx->rank == 0 && now_s() - start < 3;
        RANK_CFX(ctx, cfxAllReduce(&more, &more, 1, cfxInt32, cfxSum, comm, NULL));
    }
    if (!ctx->slot_failed)
        RANK_CFX(ctx, cfxCommFinalize(comm));
    cfxCommDestroy(comm);
}

ParameterizedTestParameters(ib_fake, a_port_down_fails_only_the_connections_that_use_it)
{
    static int qps[] = {1, 2};
    return cr_make_param_array(int, qps, 2);
}

/* Rank 1's second NIC goes down 500 ms in. With one queue pair per
 * connection only the first (nearest) NIC carries traffic: every allreduce
 * succeeds and the event is only said. With two, half of each connection
 * ran over it: the calls fail, and the sentence names that port. */
ParameterizedTest(int *qps, ib_fake, a_port_down_fails_only_the_connections_that_use_it,
                  .timeout = 120)
{
    use_fake();
    char value[8];
    snprintf(value, sizeof(value), "%d", *qps);
    cfx_test_setenv("FAKEVERBS_DEVICES", "2");
    cfx_test_setenv("FAKEVERBS_PORT_DOWN_DEVICE", "fake_1");
    cfx_test_setenv("CFX_IB_QPS_PER_CONNECTION", value);
    cfx_test_setenv("CFX_TIMEOUT", "5");
    static struct knob_case down = {"FAKEVERBS_PORT_DOWN_AFTER_MS", "500",
                                    "fake_1 port 1 on rank 1: port error", 0};
    knob_now = &down;
    struct cfx_test_options opts = {.nranks = 3,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 90,
                                    .arg = &down,
                                    .before_rank = knob_in_rank_one};
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "down");
    if (*qps == 1)
        CFX_TEST_RUN(&opts, allreduces_for_three_seconds);
    else
        CFX_TEST_RUN(&opts, allreduce_until_the_knob_bites);
    int said = cfx_test_count_in_logs(logs, down.word);
    int first = cfx_test_count_in_logs(logs, "fake_0 port 1 on rank 1");
    cfx_test_remove_logs(logs);
    cfx_test_setenv("FAKEVERBS_DEVICES", NULL);
    cfx_test_setenv("FAKEVERBS_PORT_DOWN_DEVICE", NULL);
    cfx_test_setenv("CFX_IB_QPS_PER_CONNECTION", NULL);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
    cr_assert_geq(said, 1, "no rank's log says \"%s\"", down.word);
    cr_assert_eq(first, 0, "the first NIC was said to fail too");
}

/* The topology's NIC for a host rank is its fastest port: fake_1 here. */
Test(ib_fake, the_topologys_nearest_nic_is_the_first_port, .timeout = 120)
{
    use_fake();
    char topo[] = "/tmp/cfx-ib-topo-XXXXXX";
    int fd = mkstemp(topo);
    cr_assert_geq(fd, 0, "mkstemp");
    FILE *f = fdopen(fd, "w");
    fprintf(f, "<system version=\"1\">\n"
               "  <cpu numaid=\"0\" affinity=\"ffffffff\" arch=\"x86_64\" vendor=\"GenuineIntel\" "
               "familyid=\"6\" modelid=\"143\">\n"
               "    <pci busid=\"0000:31:00.0\" class=\"0x020000\" vendor=\"0x15b3\" "
               "device=\"0x101d\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n"
               "      <nic><net name=\"fake_0\" dev=\"0\" speed=\"100000\" port=\"1\" "
               "guid=\"0x1\" maxconn=\"131072\" gdr=\"0\"/></nic>\n"
               "    </pci>\n"
               "    <pci busid=\"0000:32:00.0\" class=\"0x020000\" vendor=\"0x15b3\" "
               "device=\"0x101d\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n"
               "      <nic><net name=\"fake_1\" dev=\"1\" speed=\"200000\" port=\"1\" "
               "guid=\"0x2\" maxconn=\"131072\" gdr=\"0\"/></nic>\n"
               "    </pci>\n"
               "  </cpu>\n"
               "</system>\n");
    fclose(f);
    cfx_test_setenv("FAKEVERBS_DEVICES", "2");
    cfx_test_setenv("CFX_TOPO_FILE", topo);
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "near");
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 90, .before_rank = own_host};
    CFX_TEST_RUN(&opts, a_few_allreduces);
    int nearest = cfx_test_count_in_logs(logs, "uses fake_1 port 1 (InfiniBand");
    int said = cfx_test_count_in_logs(logs, "port 1 of 2, the topology's nearest");
    int on_second = cfx_test_count_in_logs(logs, "(fake_1:1 qpn");
    int on_first = cfx_test_count_in_logs(logs, "(fake_0:1 qpn");
    cfx_test_remove_logs(logs);
    cfx_test_setenv("FAKEVERBS_DEVICES", NULL);
    cfx_test_setenv("CFX_TOPO_FILE", NULL);
    unlink(topo);
    cr_assert_geq(nearest, 2, "the ranks did not take fake_1 (%d lines)", nearest);
    cr_assert_geq(said, 2, "the ranks did not say fake_1 is the topology's nearest");
    cr_assert_geq(on_second, 2, "no connection on fake_1");
    cr_assert_eq(on_first, 0, "a connection on fake_0, which is not the nearest");
}
