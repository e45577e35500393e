/*
 * Ranks as threads of one process, without Criterion (which cannot start
 * under ThreadSanitizer): the scenarios where threads meet inside Conflux
 * (rank threads, the socket progress thread, the root thread, an aborting
 * thread, a failure spreading) for .ci/run's TSan stage. Also a plain ctest.
 * Exits 0 when every scenario passed; prints the harness report otherwise.
 *
 *   threads_driver [SCENARIO...]      default: all
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Every collective, checked, then a split, then destroy. */
static void collectives(struct cfx_test_rank *ctx)
{
    cfxComm_t comm, half;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    int n = ctx->nranks;
    size_t count = (1u << 17) + 5;
    size_t big = (1u << 18) + 5; /* Over 1 MiB per rank: the single-copy allgather. */
    int32_t *in = malloc(big * sizeof(int32_t) * (size_t)n);
    int32_t *out = malloc(big * sizeof(int32_t) * (size_t)n);
    RANK_ASSERT(ctx, in && out, "malloc");
    for (size_t i = 0; i < big * (size_t)n; i++)
        in[i] = (int32_t)(i % 7) + ctx->rank;
    RANK_CFX(ctx, cfxAllReduce(in, out, count, cfxInt32, cfxSum, comm, NULL));
    for (size_t i = 0; i < count; i++)
        RANK_ASSERT(ctx, out[i] == (int32_t)(i % 7) * n + n * (n - 1) / 2, "allreduce[%zu]", i);
    RANK_CFX(ctx, cfxBroadcast(in, out, count, cfxInt32, 1 % n, comm, NULL));
    RANK_CFX(ctx, cfxAllGather(in, out, count, cfxInt32, comm, NULL));
    RANK_CFX(ctx, cfxAllGather(in, out, big, cfxInt32, comm, NULL));
    for (size_t i = 0; i < big * (size_t)n; i++)
        RANK_ASSERT(ctx, out[i] == (int32_t)((i % big) % 7) + (int32_t)(i / big),
                    "allgather[%zu] = %d", i, out[i]);
    RANK_CFX(ctx, cfxReduceScatter(in, out, count, cfxInt32, cfxSum, comm, NULL));
    RANK_CFX(ctx, cfxReduce(in, out, count, cfxInt32, cfxMax, 0, comm, NULL));
    RANK_CFX(ctx, cfxGroupStart());
    RANK_CFX(ctx, cfxSend(in, count, cfxInt32, (ctx->rank + 1) % n, comm, NULL));
    RANK_CFX(ctx, cfxRecv(out, count, cfxInt32, (ctx->rank + n - 1) % n, comm, NULL));
    RANK_CFX(ctx, cfxGroupEnd());
    RANK_ASSERT(ctx, out[3] == 3 + (ctx->rank + n - 1) % n, "recv[3] = %d", out[3]);
    RANK_CFX(ctx, cfxCommSplit(comm, ctx->rank % 2, 0, &half, NULL));
    RANK_CFX(ctx, cfxAllReduce(in, out, count, cfxInt32, cfxSum, half, NULL));
    RANK_CFX(ctx, cfxCommFinalize(half));
    RANK_CFX(ctx, cfxCommDestroy(half));
    RANK_CFX(ctx, cfxCommFinalize(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
    free(in);
    free(out);
}

struct abort_job {
    cfxComm_t comm;
    cfxResult_t res;
};

static void *abort_soon(void *arg)
{
    struct abort_job *job = arg;
    usleep(200 * 1000);
    job->res = cfxCommAbort(job->comm);
    return NULL;
}

/* Rank 0 never calls the allreduce; a second thread of each other rank
 * aborts it while it waits. */
static void abort_from_another_thread(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    if (ctx->rank == 0) {
        usleep(1000 * 1000);
        RANK_CFX(ctx, cfxCommDestroy(comm));
        return;
    }
    struct abort_job job = {.comm = comm};
    pthread_t thread;
    pthread_create(&thread, NULL, abort_soon, &job);
    float data[1024] = {0};
    cfxResult_t res = cfxAllReduce(data, data, 1024, cfxFloat32, cfxSum, comm, NULL);
    pthread_join(thread, NULL);
    RANK_ASSERT(ctx, res != cfxSuccess && job.res == cfxSuccess, "allreduce %d, abort %d", res,
                job.res);
}

/* A fault (CFX_FAULT) breaks a 3-rank allreduce: every rank fails, none hangs. */
static void broken_allreduce(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    size_t count = 1u << 20;
    float *data = calloc(count, sizeof(float));
    RANK_ASSERT(ctx, data != NULL, "calloc");
    double start = now_s();
    cfxResult_t res = cfxAllReduce(data, data, count, cfxFloat32, cfxSum, comm, NULL);
    RANK_ASSERT(ctx, res != cfxSuccess, "the broken allreduce succeeded on rank %d", ctx->rank);
    RANK_ASSERT(ctx, now_s() - start < 10, "rank %d took %.1f s to fail", ctx->rank,
                now_s() - start);
    RANK_CFX(ctx, cfxCommDestroy(comm));
    free(data);
}

/* Ids made from every rank's thread (registered at the process's shared
 * root) while that root serves this run's join. */
static void ids_from_every_thread(struct cfx_test_rank *ctx)
{
    for (int i = 0; i < 20; i++) {
        cfxUniqueId unused;
        RANK_CFX(ctx, cfxGetUniqueId(&unused));
    }
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

struct scenario {
    const char *name;
    int nranks;
    const char *shm_disable; /* NULL: shm between threads; "1": sockets. */
    const char *fault;
    cfx_test_rank_fn fn;
};

static const struct scenario scenarios[] = {
    {"collectives_shm", 4, NULL, NULL, collectives},
    {"collectives_socket", 4, "1", NULL, collectives},
    {"abort_shm", 3, NULL, NULL, abort_from_another_thread},
    {"abort_socket", 3, "1", NULL, abort_from_another_thread},
    {"close_socket", 3, "1", "close:rank=1:after=2", broken_allreduce},
    {"corrupt_print_socket", 3, "1", "corrupt:rank=2:after=1:what=print", broken_allreduce},
    {"truncate_shm", 3, NULL, "truncate:rank=1:after=1", broken_allreduce},
    {"ids_from_every_thread", 4, NULL, NULL, ids_from_every_thread},
};

int main(int argc, char **argv)
{
    setenv("CFX_SOCKET_IFNAME", "lo", 0);
    setenv("CFX_CONF_FILE", "/nonexistent", 0);
    int failed = 0, ran = 0;
    for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++) {
        const struct scenario *sc = &scenarios[i];
        int wanted = argc < 2;
        for (int a = 1; a < argc; a++)
            wanted |= strcmp(argv[a], sc->name) == 0;
        if (!wanted)
            continue;
        cfx_test_setenv("CFX_SHM_DISABLE", sc->shm_disable);
        cfx_test_setenv("CFX_FAULT", sc->fault);
        cfx_test_setenv("CFX_TIMEOUT", "10");
        struct cfx_test_options opts = {
            .nranks = sc->nranks, .mode = CFX_TEST_THREADS, .deadline_s = 120};
        char report[8192];
        double start = now_s();
        int ok = cfx_test_run(&opts, sc->fn, report, sizeof(report));
        printf("%-22s %s (%.1f s)\n%s", sc->name, ok ? "ok" : "FAILED", now_s() - start,
               ok ? "" : report);
        fflush(stdout);
        failed += !ok;
        ran++;
    }
    printf("threads_driver: %d of %d scenarios failed\n", failed, ran);
    return failed ? 1 : 0;
}
