/*
 * Point to point over the socket transport straight from and into user
 * buffers: a send of at least CFX_ZERO_COPY_MIN_BYTES goes out of the
 * user's buffer (sendmsg from it: no copy into a slot), and a receive that
 * is waiting when its slots arrive takes them straight into its buffer
 * (recv() into it: no copy out of a slot). No registration is needed: the
 * kernel copies any host memory. Every process is its own host and
 * CFX_NET=Socket, so every connection is a TCP one. The tests check the
 * values, that neither buffer is used after its call returned (the send
 * buffer is overwritten as soon as the send returns; a receive that timed
 * out keeps what its owner wrote into it afterwards), and, through the INFO
 * lines each connection writes at close, that the slots took that path.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/coll_check.h"
#include "tests/coll_rounds.h"
#include "tests/harness.h"

/* Two full 512 KiB slots and a 12-byte tail (the tail rides in the info line). */
#define COUNT ((size_t)(2 * 131072 + 3))

/* Every process its own host; sockets between them. */
static void own_host(struct cfx_test_rank *ctx)
{
    char host[32];
    snprintf(host, sizeof(host), "sock-test-host-%d", ctx->rank);
    cfx_test_setenv("CFX_HOSTID", host);
    cfx_test_setenv("CFX_NET", "Socket");
}

/* Rank 1 posts its receive first, rank 0 sends 0.3 s later: every full
 * slot arrives while the receive waits. The receive buffer holds garbage
 * before each round and the send buffer is overwritten when the send
 * returns, so a slot taken from the wrong place shows. */
static void send_then_overwrite(struct cfx_test_rank *ctx)
{
    int r = ctx->rank;
    float *buf = calloc(COUNT, sizeof(float));
    RANK_ASSERT(ctx, buf, "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, r));
    int hello = r; /* Connects the pair first. */
    if (r == 0)
        RANK_CFX(ctx, cfxSend(&hello, 1, cfxInt32, 1, comm, NULL));
    else
        RANK_CFX(ctx, cfxRecv(&hello, 1, cfxInt32, 0, comm, NULL));
    for (int round = 0; round < 3 && !ctx->slot_failed; round++) {
        cfx_test_step(ctx, "round %d", round);
        if (r == 0) {
            ref_tagged_msg_fill(buf, 0, 1, COUNT, round);
            usleep(300 * 1000);
            RANK_CFX(ctx, cfxSend(buf, COUNT, cfxFloat32, 1, comm, NULL));
            ref_fill_value(buf, COUNT, -1.0f);
        } else {
            ref_fill_value(buf, COUNT, -7.0f);
            RANK_CFX(ctx, cfxRecv(buf, COUNT, cfxFloat32, 0, comm, NULL));
            long bad = ref_tagged_msg_check(buf, 0, 1, COUNT, round);
            RANK_ASSERT(ctx, bad < 0, "round %d: element %ld is %g, not %g", round, bad,
                        bad < 0 ? 0.0 : (double)buf[bad],
                        bad < 0 ? 0.0 : (double)ref_tagged(0, 1, (size_t)bad, round));
        }
    }
    if (!ctx->slot_failed)
        RANK_CFX(ctx, cfxCommFinalize(comm));
    cfxCommDestroy(comm);
    free(buf);
}

ParameterizedTestParameters(socket_user_buffers, sends_and_receives_skip_the_slots)
{
    static int zero_copy[] = {1, 0};
    return cr_make_param_array(int, zero_copy, 2);
}

ParameterizedTest(int *zero_copy, socket_user_buffers, sends_and_receives_skip_the_slots,
                  .timeout = 120)
{
    cr_log_info("send/recv over sockets, %s",
                *zero_copy ? "straight from and into user buffers" : "CFX_ZERO_COPY_MIN_BYTES=1G");
    cfx_test_setenv("CFX_ZERO_COPY_MIN_BYTES", *zero_copy ? NULL : "1G");
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "sock-ub");
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 90, .before_rank = own_host};
    CFX_TEST_RUN(&opts, send_then_overwrite);
    /* 3 rounds x 2 full slots. */
    int sent = cfx_test_count_in_logs(logs, "rank 0 -> rank 1 sent 6 slot(s) from user buffers");
    int got = cfx_test_count_in_logs(logs, "rank 1 <- rank 0 received 6 slot(s) into user buffers");
    int any = cfx_test_count_in_logs(logs, "user buffers");
    cfx_test_remove_logs(logs);
    cfx_test_setenv("CFX_ZERO_COPY_MIN_BYTES", NULL);
    if (*zero_copy) {
        cr_assert_eq(sent, 1, "rank 0 did not send its 6 full slots from its buffer");
        cr_assert_eq(got, 1, "rank 1 did not receive the 6 full slots into its buffer");
    } else {
        cr_assert_eq(any, 0, "%d connections used user buffers below the threshold", any);
    }
}

/* Alltoalls on every rank at once: each slot lands in place or in the FIFO
 * depending on whether its receive was waiting; the results must not tell.
 * Both buffers are rewritten around each call. */
static void alltoall_rounds(struct cfx_test_rank *ctx)
{
    int n = ctx->nranks, r = ctx->rank;
    size_t all = COUNT * (size_t)n;
    float *send = calloc(all, sizeof(float)), *recv = calloc(all, sizeof(float));
    RANK_ASSERT(ctx, send && recv, "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, n, ctx->id, r));
    for (int round = 0; round < 6 && !ctx->slot_failed; round++) {
        cfx_test_step(ctx, "alltoall round %d", round);
        ref_tagged_fill(send, n, r, COUNT, round);
        for (size_t i = 0; i < all; i++)
            recv[i] = -3.0f;
        RANK_CFX(ctx, cfxAlltoAll(send, recv, COUNT, cfxFloat32, comm, NULL));
        for (size_t i = 0; i < all; i++)
            send[i] = -1.0f;
        int from;
        long bad = ref_tagged_check(recv, n, r, COUNT, round, &from);
        RANK_ASSERT(ctx, bad < 0, "round %d: element %ld (from rank %d) is %g", round, bad, from,
                    bad < 0 ? 0.0 : recv[bad]);
    }
    if (!ctx->slot_failed)
        RANK_CFX(ctx, cfxCommFinalize(comm));
    cfxCommDestroy(comm);
    free(send);
    free(recv);
}

Test(socket_user_buffers, alltoalls_are_exact_however_slots_land, .timeout = 120)
{
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "sock-a2a");
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 90, .before_rank = own_host};
    CFX_TEST_RUN(&opts, alltoall_rounds);
    /* Every send connection sent its 6 rounds x 2 full slots from the user's buffer. */
    int sent = cfx_test_count_in_logs(logs, "sent 12 slot(s) from user buffers");
    cfx_test_remove_logs(logs);
    cr_assert_eq(sent, 6, "%d of the 6 send connections sent 12 slots from user buffers", sent);
}

/* The shared rounds (tests/coll_rounds.h) over the ring of 3 ranks. */
static void collectives_rounds(struct cfx_test_rank *ctx)
{
    size_t all = COUNT * (size_t)ctx->nranks;
    float *in = calloc(all, sizeof(float)), *out = calloc(all, sizeof(float));
    RANK_ASSERT(ctx, in && out, "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    ref_collective_rounds(ctx, comm, in, out, COUNT);
    if (!ctx->slot_failed)
        RANK_CFX(ctx, cfxCommFinalize(comm));
    cfxCommDestroy(comm);
    free(in);
    free(out);
}

Test(socket_user_buffers, ring_collectives_send_and_take_final_output_in_place, .timeout = 120)
{
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "sock-coll");
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 90, .before_rank = own_host};
    CFX_TEST_RUN(&opts, collectives_rounds);
    int sent = cfx_test_count_in_logs(logs, "slot(s) from user buffers");
    int got = cfx_test_count_in_logs(logs, "slot(s) into user buffers");
    cfx_test_remove_logs(logs);
    cr_assert_eq(sent, 3, "%d of the 3 ring connections sent from user buffers", sent);
    cr_assert_eq(got, 3, "%d of the 3 ring connections received into user buffers", got);
}

#define BIG_COUNT                                                                                  \
    ((size_t)16 << 20) /* 64 MiB of floats: more than the FIFO and socket buffers hold. */

/* Rank 1 joins a 64 MiB broadcast 0.5 s late, so rank 0's last slots are
 * still posted (by reference, from its output) when its steps have run:
 * its call must wait until they left, since it overwrites the buffer the
 * moment the call returns (from the end: the slots that could still be
 * posted). On the ring (CFX_ALGO=ring) the root only sends; on the trees
 * it would also receive the second half back, which waits for its sends. */
static void late_receiver_broadcast(struct cfx_test_rank *ctx)
{
    int r = ctx->rank;
    float *buf = malloc(BIG_COUNT * sizeof(float));
    RANK_ASSERT(ctx, buf, "out of memory");
    for (size_t i = 0; i < BIG_COUNT; i++)
        buf[i] = r == 0 ? ref_tagged(0, 1, i, 0) : -3.0f;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, r));
    int hello = 0; /* Connects the ring first. */
    RANK_CFX(ctx, cfxAllReduce(&hello, &hello, 1, cfxInt32, cfxSum, comm, NULL));
    if (r == 1)
        usleep(500 * 1000);
    cfx_test_step(ctx, "64 MiB broadcast");
    RANK_CFX(ctx, cfxBroadcast(buf, buf, BIG_COUNT, cfxFloat32, 0, comm, NULL));
    if (r == 0)
        for (size_t i = BIG_COUNT; i-- > 0;)
            buf[i] = -1.0f;
    for (size_t i = 0; r == 1 && i < BIG_COUNT; i++)
        if (buf[i] != ref_tagged(0, 1, i, 0)) {
            RANK_ASSERT(ctx, 0, "element %zu is %g, not %g", i, buf[i], ref_tagged(0, 1, i, 0));
            break;
        }
    if (!ctx->slot_failed)
        RANK_CFX(ctx, cfxCommFinalize(comm));
    cfxCommDestroy(comm);
    free(buf);
}

Test(socket_user_buffers, a_collective_returns_once_its_output_has_left, .timeout = 120)
{
    cfx_test_setenv("CFX_ALGO", "ring");
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 90, .before_rank = own_host};
    CFX_TEST_RUN(&opts, late_receiver_broadcast);
    cfx_test_setenv("CFX_ALGO", NULL);
}

/* Rank 1's receive times out (CFX_TIMEOUT=2) before rank 0 sends; rank 1
 * then writes its own values into the buffer it had offered and checks for
 * a second that they stay; rank 0 sends at 3 s, and its send fails naming
 * rank 1 (whose connection is poisoned and shut). */
static void receive_times_out_then_sender_sends(struct cfx_test_rank *ctx)
{
    int r = ctx->rank;
    float *buf = calloc(COUNT, sizeof(float));
    RANK_ASSERT(ctx, buf, "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, r));
    int hello = r;
    if (r == 0)
        RANK_CFX(ctx, cfxSend(&hello, 1, cfxInt32, 1, comm, NULL));
    else
        RANK_CFX(ctx, cfxRecv(&hello, 1, cfxInt32, 0, comm, NULL));
    if (r == 0) {
        for (size_t i = 0; i < COUNT; i++)
            buf[i] = ref_tagged(0, 1, i, 0);
        sleep(3);
        cfx_test_step(ctx, "send after the receiver timed out");
        cfxResult_t res = cfxSend(buf, COUNT, cfxFloat32, 1, comm, NULL);
        RANK_ASSERT(ctx, res != cfxSuccess, "the send to a receiver that gave up succeeded");
        RANK_ASSERT(ctx, strstr(cfxGetLastError(comm), "rank 1") != NULL,
                    "the send's error does not name rank 1: %s", cfxGetLastError(comm));
    } else {
        cfx_test_step(ctx, "receive that times out");
        cfxResult_t res = cfxRecv(buf, COUNT, cfxFloat32, 0, comm, NULL);
        RANK_ASSERT(ctx, res == cfxTimeout, "the receive returned %s, not a timeout",
                    cfxGetErrorString(res));
        for (size_t i = 0; i < COUNT; i++)
            buf[i] = -9.0f;
        cfx_test_step(ctx, "watch the buffer the receive had offered");
        for (int look = 0; look < 20 && !ctx->slot_failed; look++) {
            usleep(100 * 1000);
            for (size_t i = 0; i < COUNT; i++)
                if (buf[i] != -9.0f) {
                    RANK_ASSERT(ctx, 0, "element %zu of the timed-out receive's buffer became %g",
                                i, buf[i]);
                    break;
                }
        }
    }
    cfxCommDestroy(comm);
    free(buf);
}

Test(socket_user_buffers, a_receive_that_timed_out_leaves_its_buffer_alone, .timeout = 120)
{
    cfx_test_setenv("CFX_TIMEOUT", "2");
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 60, .before_rank = own_host};
    CFX_TEST_RUN(&opts, receive_times_out_then_sender_sends);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
}
