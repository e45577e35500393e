/*
 * cfxCommShrink: a rank of 4 is killed, the survivors see the failure, shrink
 * to 3 and keep allreducing correctly (over shm and over sockets), with the
 * parent destroyed before the child is used again; a healthy shrink that
 * leaves a rank out; ranks that pass different lists all fail; bad
 * arguments are refused with a sentence.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"

static void use_transport(int socket)
{
    cfx_test_setenv("CFX_SHM_DISABLE", socket ? "1" : NULL);
}

/* @p rounds allreduces on @p comm, each checked: element i of rank r is
 * r + i + round, so the sum is known on every rank. */
static void allreduce_checked(struct cfx_test_rank *ctx, cfxComm_t comm, int rounds, size_t count)
{
    int rank, nranks;
    RANK_CFX(ctx, cfxCommUserRank(comm, &rank));
    RANK_CFX(ctx, cfxCommCount(comm, &nranks));
    int32_t *data = malloc(count * sizeof(int32_t));
    RANK_ASSERT(ctx, data != NULL, "malloc");
    for (int round = 0; round < rounds; round++) {
        for (size_t i = 0; i < count; i++)
            data[i] = rank + (int32_t)i + round;
        cfx_test_step(ctx, "allreduce %d of %d on %d ranks", round, rounds, nranks);
        cfxResult_t res = cfxAllReduce(data, data, count, cfxInt32, cfxSum, comm, NULL);
        if (res != cfxSuccess)
            free(data);
        RANK_ASSERT(ctx, res == cfxSuccess, "allreduce %d on %d ranks returned %s: %s", round,
                    nranks, cfxGetErrorString(res), cfxGetLastError(comm));
        for (size_t i = 0; i < count; i++) {
            int32_t want = nranks * (nranks - 1) / 2 + nranks * ((int32_t)i + round);
            if (data[i] != want) {
                int32_t got = data[i];
                free(data);
                RANK_ASSERT(ctx, 0, "allreduce %d on %d ranks: element %zu is %d, not %d", round,
                            nranks, i, got, want);
            }
        }
    }
    free(data);
}

/* ---------------------------------------------------- a rank dies */

static void survivors_shrink_after_rank_two_dies(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    allreduce_checked(ctx, comm, 3, 1000);
    if (ctx->rank == 2)
        kill(getpid(), SIGKILL);
    /* The survivors learn it from a call that fails naming rank 2. */
    float *data = calloc(1 << 16, sizeof(float));
    RANK_ASSERT(ctx, data != NULL, "calloc");
    cfxResult_t res = cfxSuccess;
    for (int i = 0; i < 100000 && res == cfxSuccess; i++) {
        cfx_test_step(ctx, "allreduce %d while rank 2 is dead", i);
        res = cfxAllReduce(data, data, 1 << 16, cfxFloat32, cfxSum, comm, NULL);
    }
    free(data);
    RANK_ASSERT(ctx, res == cfxRemoteError, "the call returned %s: %s", cfxGetErrorString(res),
                cfxGetLastError(comm));
    RANK_ASSERT(ctx, strstr(cfxGetLastError(comm), "rank 2") != NULL,
                "the sentence does not name rank 2: %s", cfxGetLastError(comm));
    int dead[] = {2};
    cfxComm_t shrunk = NULL;
    RANK_CFX(ctx, cfxCommShrink(comm, dead, 1, &shrunk, NULL, CFX_SHRINK_ABORT));
    int rank, nranks;
    RANK_CFX(ctx, cfxCommCount(shrunk, &nranks));
    RANK_CFX(ctx, cfxCommUserRank(shrunk, &rank));
    RANK_ASSERT(ctx, nranks == 3, "the shrunk communicator has %d ranks, not 3", nranks);
    RANK_ASSERT(ctx, rank == (ctx->rank < 2 ? ctx->rank : ctx->rank - 1),
                "parent rank %d became rank %d", ctx->rank, rank);
    allreduce_checked(ctx, shrunk, 20, 1000);
    /* The parent goes first; the child keeps working without it. */
    RANK_CFX(ctx, cfxCommAbort(comm));
    allreduce_checked(ctx, shrunk, 5, 1 << 18);
    RANK_CFX(ctx, cfxCommFinalize(shrunk));
    RANK_CFX(ctx, cfxCommDestroy(shrunk));
}

ParameterizedTestParameters(shrink, killed_rank_is_dropped_and_the_rest_go_on)
{
    static int transports[] = {0, 1};
    return cr_make_param_array(int, transports, 2);
}

ParameterizedTest(int *socket, shrink, killed_rank_is_dropped_and_the_rest_go_on, .timeout = 120)
{
    cr_log_info("over %s", *socket ? "sockets" : "shm");
    use_transport(*socket);
    cfx_test_setenv("CFX_TIMEOUT", "10");
    struct cfx_test_options opts = {
        .nranks = 4, .mode = CFX_TEST_PROCS, .deadline_s = 90, .killed_ranks = 1ull << 2};
    CFX_TEST_RUN(&opts, survivors_shrink_after_rank_two_dies);
}

/* ---------------------------------------------- a healthy parent */

static void leave_rank_one_out(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    allreduce_checked(ctx, comm, 2, 100);
    if (ctx->rank == 1) { /* Left out: does not call cfxCommShrink. */
        RANK_CFX(ctx, cfxCommDestroy(comm));
        return;
    }
    int out[] = {1};
    cfxComm_t shrunk = NULL;
    RANK_CFX(ctx, cfxCommShrink(comm, out, 1, &shrunk, NULL, CFX_SHRINK_DEFAULT));
    allreduce_checked(ctx, shrunk, 10, 5000);
    RANK_CFX(ctx, cfxCommDestroy(comm));
    allreduce_checked(ctx, shrunk, 2, 100);
    RANK_CFX(ctx, cfxCommDestroy(shrunk));
}

Test(shrink, a_healthy_communicator_leaves_a_rank_out, .timeout = 60)
{
    struct cfx_test_options opts = {.nranks = 4, .mode = CFX_TEST_THREADS, .deadline_s = 50};
    CFX_TEST_RUN(&opts, leave_rank_one_out);
}

/* ---------------------------------------- lists that disagree */

static void lists_disagree(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    if (ctx->rank == 3) { /* Excluded by ranks 0 and 1. */
        RANK_CFX(ctx, cfxCommDestroy(comm));
        return;
    }
    /* Ranks 0 and 1 leave out rank 3; rank 2 leaves out rank 1. */
    int list[] = {ctx->rank == 2 ? 1 : 3};
    cfxComm_t shrunk = NULL;
    cfx_test_step(ctx, "cfxCommShrink with a list that disagrees");
    cfxResult_t res = cfxCommShrink(comm, list, 1, &shrunk, NULL, CFX_SHRINK_DEFAULT);
    RANK_ASSERT(ctx, res == cfxInvalidUsage && shrunk == NULL, "cfxCommShrink returned %s: %s",
                cfxGetErrorString(res), cfxGetLastError(comm));
    RANK_ASSERT(ctx, strstr(cfxGetLastError(comm), "excludeRanksList") != NULL,
                "the sentence does not say why: %s", cfxGetLastError(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(shrink, ranks_that_pass_different_lists_all_fail, .timeout = 60)
{
    struct cfx_test_options opts = {.nranks = 4, .mode = CFX_TEST_THREADS, .deadline_s = 50};
    CFX_TEST_RUN(&opts, lists_disagree);
}

/* ------------------------------------------------- bad arguments */

static void bad_arguments(struct cfx_test_rank *ctx)
{
    cfxComm_t comm, shrunk = NULL;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    struct {
        int list[3];
        int count;
        int flags;
        const char *says;
    } cases[] = {
        {{ctx->rank}, 1, 0, "is this rank"},
        {{5}, 1, 0, "is not a rank of the parent"},
        {{-1}, 1, 0, "is not a rank of the parent"},
        {{1 - ctx->rank, 1 - ctx->rank}, 2, 0, "excludeRanksCount"},
        {{1 - ctx->rank}, 1, 7, "shrinkFlags"},
        {{0}, -1, 0, "excludeRanksCount"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cfxResult_t res =
            cfxCommShrink(comm, cases[i].list, cases[i].count, &shrunk, NULL, cases[i].flags);
        RANK_ASSERT(ctx, res == cfxInvalidArgument, "case %zu returned %s", i,
                    cfxGetErrorString(res));
        RANK_ASSERT(ctx, strstr(cfxGetLastError(comm), cases[i].says) != NULL,
                    "case %zu: the sentence does not say \"%s\": %s", i, cases[i].says,
                    cfxGetLastError(comm));
    }
    RANK_ASSERT(ctx, cfxCommShrink(comm, NULL, 1, &shrunk, NULL, 0) == cfxInvalidArgument,
                "a NULL list with a count was accepted");
    RANK_ASSERT(ctx, cfxCommShrink(comm, NULL, 0, NULL, NULL, 0) == cfxInvalidArgument,
                "a NULL newcomm was accepted");
    /* Excluding nobody is a copy of the parent. */
    RANK_CFX(ctx, cfxCommShrink(comm, NULL, 0, &shrunk, NULL, CFX_SHRINK_DEFAULT));
    allreduce_checked(ctx, shrunk, 2, 100);
    RANK_CFX(ctx, cfxCommDestroy(shrunk));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(shrink, bad_arguments_are_refused_with_a_sentence, .timeout = 60)
{
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 50};
    CFX_TEST_RUN(&opts, bad_arguments);
}

/* --------------------------------------------------------------- revoke */

struct blocked_call {
    cfxComm_t comm;
    cfxResult_t res;
    double took;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *call_that_blocks(void *arg)
{
    struct blocked_call *call = arg;
    static float data[1024];
    double start = now_s();
    call->res = cfxAllReduce(data, data, 1024, cfxFloat32, cfxSum, call->comm, NULL);
    call->took = now_s() - start;
    return NULL;
}

/* Rank 0's call blocks (rank 1 does not join it); rank 0 revokes from
 * another thread, the call ends, later calls are refused, and both ranks
 * shrink (excluding nobody) to a communicator that works. */
static void revoke_then_shrink(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    allreduce_checked(ctx, comm, 1, 100);
    if (ctx->rank == 0) {
        struct blocked_call call = {.comm = comm};
        pthread_t thread;
        RANK_ASSERT(ctx, pthread_create(&thread, NULL, call_that_blocks, &call) == 0, "thread");
        usleep(200 * 1000);
        double start = now_s();
        RANK_CFX(ctx, cfxCommRevoke(comm, CFX_REVOKE_DEFAULT));
        double revoke_took = now_s() - start;
        pthread_join(thread, NULL);
        RANK_ASSERT(ctx, call.res != cfxSuccess && call.took < 5,
                    "the blocked call returned %s after %.2f s", cfxGetErrorString(call.res),
                    call.took);
        RANK_ASSERT(ctx, revoke_took < 2, "cfxCommRevoke took %.2f s", revoke_took);
    } else {
        usleep(400 * 1000); /* Rank 0's call has begun and been revoked. */
        RANK_CFX(ctx, cfxCommRevoke(comm, CFX_REVOKE_DEFAULT));
    }
    float x = 1;
    cfxResult_t res = cfxAllReduce(&x, &x, 1, cfxFloat32, cfxSum, comm, NULL);
    RANK_ASSERT(ctx, res == cfxInvalidUsage && strstr(cfxGetLastError(comm), "revoked") != NULL,
                "a call after the revoke returned %s: %s", cfxGetErrorString(res),
                cfxGetLastError(comm));
    res = cfxCommFinalize(comm);
    RANK_ASSERT(ctx, res == cfxInvalidUsage, "cfxCommFinalize after a revoke returned %s",
                cfxGetErrorString(res));
    RANK_ASSERT(ctx, cfxCommRevoke(comm, 3) == cfxInvalidArgument, "revokeFlags 3 was accepted");
    cfxComm_t fresh = NULL;
    RANK_CFX(ctx, cfxCommShrink(comm, NULL, 0, &fresh, NULL, CFX_SHRINK_ABORT));
    RANK_CFX(ctx, cfxCommDestroy(comm));
    allreduce_checked(ctx, fresh, 5, 4096);
    RANK_CFX(ctx, cfxCommDestroy(fresh));
}

Test(shrink, revoke_stops_a_running_call_and_keeps_the_communicator_for_shrink, .timeout = 60)
{
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 50};
    CFX_TEST_RUN(&opts, revoke_then_shrink);
}
