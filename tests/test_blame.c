/*
 * Blame converges: when a rank dies, stops, or leaves, every surviving rank's
 * cfxGetLastError names the same rank, the right one, however the failure
 * reached it (first hand, through a poisoned connector, or at CFX_TIMEOUT
 * while everyone waits). Ranks are processes; the failing rank kills or
 * stops itself from a thread while the others run a collective.
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

#include "src/core/comm.h"
#include "tests/harness.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The rank a failure sentence blames: the number after its "because of
 * rank ", or -1 when it names no cause. */
static int blamed_rank(const char *sentence)
{
    const char *at = strstr(sentence, "because of rank ");
    return at ? atoi(at + strlen("because of rank ")) : -1;
}

static void *signal_me_soon(void *arg)
{
    usleep(300 * 1000);
    kill(getpid(), *(const int *)arg);
    return NULL;
}

/* Rank @p victim loops allreduces of @p count floats with the others until a
 * thread of its own sends it @p sig; the survivors assert on the error. */
struct victim_case {
    int victim;
    int sig;
    size_t count;
    double limit_s; /* The failing call must end within this. */
};

static void loop_until_the_victim_fails(struct cfx_test_rank *ctx)
{
    const struct victim_case *vc = ctx->arg;
    static int sig;
    sig = vc->sig;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    float *data = calloc(vc->count, sizeof(float));
    RANK_ASSERT(ctx, data != NULL, "malloc");
    if (ctx->rank == vc->victim) {
        pthread_t thread;
        pthread_create(&thread, NULL, signal_me_soon, &sig);
    }
    cfxResult_t res = cfxSuccess;
    double start = 0;
    for (int i = 0; i < 1000000 && res == cfxSuccess; i++) {
        cfx_test_step(ctx, "allreduce %d while rank %d gets %s", i, vc->victim, strsignal(sig));
        start = now_s();
        res = cfxAllReduce(data, data, vc->count, cfxFloat32, cfxSum, comm, NULL);
    }
    double took = now_s() - start;
    const char *why = cfxGetLastError(comm);
    if (vc->sig == SIGSTOP && ctx->rank == 0)
        kill(comm->peers[vc->victim].pid, SIGKILL); /* Before any assertion can return. */
    RANK_ASSERT(ctx, res != cfxSuccess, "the loop ended without an error");
    RANK_ASSERT(ctx, took < vc->limit_s, "the failing call took %.1f s: %s", took, why);
    RANK_ASSERT(ctx, blamed_rank(why) == vc->victim, "rank %d blames rank %d, not rank %d: %s",
                ctx->rank, blamed_rank(why), vc->victim, why);
    RANK_CFX(ctx, cfxCommDestroy(comm));
    free(data);
}

/* Over sockets, rank 2 of 4 SIGKILLed in a loop of 4 MiB allreduces. */
Test(blame, killed_rank_is_blamed_by_every_survivor_over_sockets, .timeout = 90)
{
    cfx_test_setenv("CFX_SHM_DISABLE", "1");
    cfx_test_setenv("CFX_TIMEOUT", "10");
    static struct victim_case vc = {.victim = 2, .sig = SIGKILL, .count = 1 << 20, .limit_s = 12};
    struct cfx_test_options opts = {.nranks = 4,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 60,
                                    .killed_ranks = 1ull << 2,
                                    .arg = &vc};
    CFX_TEST_RUN(&opts, loop_until_the_victim_fails);
}

/* Rank 1 of 4 SIGSTOPped: everyone else reaches CFX_TIMEOUT at about the
 * same moment, each waiting for a different peer. Rank 0 kills rank 1 at the
 * end. The report must come within CFX_TIMEOUT plus a couple of seconds. */
ParameterizedTestParameters(blame, stopped_rank_is_blamed_by_every_rank_at_the_timeout)
{
    static int transports[] = {0, 1};
    return cr_make_param_array(int, transports, 2);
}

ParameterizedTest(int *socket, blame, stopped_rank_is_blamed_by_every_rank_at_the_timeout,
                  .timeout = 90)
{
    cr_log_info("over %s", *socket ? "socket" : "shm");
    cfx_test_setenv("CFX_SHM_DISABLE", *socket ? "1" : NULL);
    cfx_test_setenv("CFX_TIMEOUT", "2");
    static struct victim_case vc = {.victim = 1, .sig = SIGSTOP, .count = 1 << 16, .limit_s = 5};
    struct cfx_test_options opts = {.nranks = 4,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 60,
                                    .killed_ranks = 1ull << 1,
                                    .arg = &vc};
    CFX_TEST_RUN(&opts, loop_until_the_victim_fails);
}

/* Rank 2 of 4 dies after a good allreduce; the others then finalize. */
static void finalize_after_rank_two_died(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    float data[256] = {0};
    RANK_CFX(ctx, cfxAllReduce(data, data, 256, cfxFloat32, cfxSum, comm, NULL));
    if (ctx->rank == 2)
        kill(getpid(), SIGKILL);
    /* Let it die before the others finalize. */
    usleep(300 * 1000);
    cfx_test_step(ctx, "finalize without rank 2");
    double start = now_s();
    cfxResult_t res = cfxCommFinalize(comm);
    double took = now_s() - start;
    const char *why = cfxGetLastError(comm);
    RANK_ASSERT(ctx, res != cfxSuccess, "finalize succeeded without rank 2");
    RANK_ASSERT(ctx, took < 6, "finalize took %.1f s: %s", took, why);
    RANK_ASSERT(ctx, blamed_rank(why) == 2, "rank %d blames rank %d, not rank 2: %s", ctx->rank,
                blamed_rank(why), why);
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

ParameterizedTestParameters(blame, finalize_after_a_rank_died_blames_it_on_every_rank)
{
    static int transports[] = {0, 1};
    return cr_make_param_array(int, transports, 2);
}

ParameterizedTest(int *socket, blame, finalize_after_a_rank_died_blames_it_on_every_rank,
                  .timeout = 90)
{
    cr_log_info("over %s", *socket ? "socket" : "shm");
    cfx_test_setenv("CFX_SHM_DISABLE", *socket ? "1" : NULL);
    cfx_test_setenv("CFX_TIMEOUT", "3");
    struct cfx_test_options opts = {
        .nranks = 4, .mode = CFX_TEST_PROCS, .deadline_s = 60, .killed_ranks = 1ull << 2};
    CFX_TEST_RUN(&opts, finalize_after_rank_two_died);
}

/* Rank 2 of 3 never calls the allreduce (it is busy elsewhere, alive): the
 * others time out, each waiting for a different peer, and both name rank 2.
 * Ranks are threads of one process here. */
static void allreduce_without_rank_two(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    if (ctx->rank == 2) {
        cfx_test_step(ctx, "rank 2 stays away from the allreduce");
        sleep(4);
        RANK_CFX(ctx, cfxCommDestroy(comm));
        return;
    }
    float data[1024] = {0};
    cfx_test_step(ctx, "allreduce without rank 2");
    double start = now_s();
    cfxResult_t res = cfxAllReduce(data, data, 1024, cfxFloat32, cfxSum, comm, NULL);
    double took = now_s() - start;
    const char *why = cfxGetLastError(comm);
    RANK_ASSERT(ctx, res == cfxTimeout, "allreduce returned %s: %s", cfxGetErrorString(res), why);
    RANK_ASSERT(ctx, took < 3.5, "the report took %.1f s with CFX_TIMEOUT=1: %s", took, why);
    RANK_ASSERT(ctx, blamed_rank(why) == 2, "rank %d blames rank %d, not rank 2: %s", ctx->rank,
                blamed_rank(why), why);
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(blame, rank_outside_the_call_is_blamed_by_every_rank_in_threads_mode, .timeout = 60)
{
    cfx_test_setenv("CFX_SHM_DISABLE", NULL);
    cfx_test_setenv("CFX_TIMEOUT", "1");
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_THREADS, .deadline_s = 30};
    CFX_TEST_RUN(&opts, allreduce_without_rank_two);
}
