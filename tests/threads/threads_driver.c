/*
 * Ranks as threads of one process, without Criterion (which cannot start
 * under ThreadSanitizer): the scenarios where threads meet inside Conflux
 * (rank threads, the process's proxy thread, the root thread, an aborting
 * thread, a failure spreading, two threads on one communicator, a destroy
 * under a call, an executor's batch aborted from another thread) for
 * .ci/run's TSan stage. Also a plain ctest.
 * Exits 0 when every scenario passed; prints the harness report otherwise.
 *
 *   threads_driver [SCENARIO...]      default: all
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/core/comm.h"
#include "src/exec/exec.h"
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

/* Communicators share the process's proxy thread: a split takes another
 * reference, the parent's destroy gives one back while the halves still
 * move bytes through it, and the last destroy stops it, while other ranks'
 * threads take and give back theirs. */
static void proxy_users_come_and_go(struct cfx_test_rank *ctx)
{
    cfxComm_t comm, half;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    RANK_CFX(ctx, cfxCommSplit(comm, ctx->rank % 2, 0, &half, NULL));
    RANK_CFX(ctx, cfxCommDestroy(comm));
    size_t count = (1u << 16) + 3;
    int32_t *data = malloc(count * sizeof(int32_t));
    RANK_ASSERT(ctx, data != NULL, "malloc");
    int half_ranks = 0;
    RANK_CFX(ctx, cfxCommCount(half, &half_ranks));
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < count; i++)
            data[i] = (int32_t)(i % 5) + round;
        RANK_CFX(ctx, cfxAllReduce(data, data, count, cfxInt32, cfxSum, half, NULL));
        for (size_t i = 0; i < count; i++)
            RANK_ASSERT(ctx, data[i] == ((int32_t)(i % 5) + round) * half_ranks,
                        "round %d: allreduce[%zu] = %d", round, i, data[i]);
    }
    RANK_CFX(ctx, cfxCommDestroy(half));
    free(data);
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

struct exec_abort_job {
    struct cfx_exec_batch *batch;
    cfxResult_t res;
};

static void *launch_batch(void *arg)
{
    struct exec_abort_job *job = arg;
    job->res = cfx_exec_host.launch(&cfx_exec_host, job->batch); /* NULL stream: blocks. */
    return NULL;
}

static int exec_abort_over; /* Rank 1's aborted launch returned (atomic). */

/* The executor interface's abort, from another thread: rank 1's host
 * executor waits for rank 0, which never runs its part, until the main
 * thread aborts the batch (src/exec/exec.h). */
static void exec_abort_from_another_thread(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    if (ctx->rank == 0) {
        cfx_test_step(ctx, "waiting for rank 1's aborted launch");
        while (!__atomic_load_n(&exec_abort_over, __ATOMIC_ACQUIRE))
            usleep(1000);
        RANK_CFX(ctx, cfxCommAbort(comm));
        return;
    }
    static float data[1024];
    struct cfx_op op;
    cfx_op_clear(&op);
    op.kind = CFX_COLL_ALLREDUCE;
    op.sendbuff = data;
    op.recvbuff = data;
    op.count = 1024;
    op.type = cfxFloat32;
    op.op = cfxSum;
    op.rank = comm->rank;
    op.nranks = comm->nranks;
    op.abort_flag = &comm->abort_flag;
    op.owner = comm;
    op.spin_limit = comm->spin_limit;
    op.send_conn = comm->ring_send;
    op.recv_conn = comm->ring_recv;
    op.conns[op.n_conns++] = op.send_conn;
    op.conns[op.n_conns++] = op.recv_conn;
    cfx_coll_prepare(&op);
    struct cfx_exec_batch batch;
    cfx_exec_batch_init(&batch, &op, 1, NULL);
    struct exec_abort_job job = {.batch = &batch, .res = cfxInProgress};
    pthread_t thread;
    pthread_create(&thread, NULL, launch_batch, &job);
    usleep(100 * 1000); /* Not synchronisation: the abort ends the wait whenever it comes. */
    cfx_test_step(ctx, "aborting the batch");
    cfx_exec_host.abort(&cfx_exec_host, &batch);
    pthread_join(thread, NULL);
    __atomic_store_n(&exec_abort_over, 1, __ATOMIC_RELEASE);
    RANK_ASSERT(ctx, job.res == cfxRemoteError && op.done, "launch returned %d (done %d)", job.res,
                op.done);
    RANK_CFX(ctx, cfxCommAbort(comm));
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

/* Wait (yielding) until a call holds @p comm; 0 after 10 s without one. */
static int wait_for_call_in(cfxComm_t comm)
{
    double start = now_s();
    while (__atomic_load_n(&comm->active_calls, __ATOMIC_ACQUIRE) != CFX_COMM_IN_CALL) {
        if (now_s() - start > 10)
            return 0;
        sched_yield();
    }
    return 1;
}

struct call_job {
    cfxComm_t comm;
    float data[4096];
    cfxResult_t res;
};

static void *allreduce_job(void *arg)
{
    struct call_job *job = arg;
    job->res = cfxAllReduce(job->data, job->data, 4096, cfxFloat32, cfxSum, job->comm, NULL);
    return NULL;
}

/* Set by rank 0 once its second thread was refused; rank 1 waits for it
 * before it joins the first thread's allreduce (ranks are threads here). */
static int second_call_refused;

/* Two threads of rank 0 on one communicator: the second is refused with
 * cfxInvalidUsage while the first (waiting for rank 1) holds it, and the
 * first gets the right sums. Then each rank alternates its two threads. */
static void second_thread_refused(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    struct call_job job = {.comm = comm};
    for (int i = 0; i < 4096; i++)
        job.data[i] = (float)(1000 * (ctx->rank + 1) + i);
    if (ctx->rank == 1) {
        double start = now_s();
        while (!__atomic_load_n(&second_call_refused, __ATOMIC_ACQUIRE)) {
            RANK_ASSERT(ctx, now_s() - start < 20, "rank 0 never reported its refusal");
            sched_yield();
        }
        allreduce_job(&job);
    } else {
        pthread_t first;
        RANK_ASSERT(ctx, pthread_create(&first, NULL, allreduce_job, &job) == 0, "thread");
        int entered = wait_for_call_in(comm);
        float mine[4096] = {0};
        cfxResult_t res = entered ? cfxAllReduce(mine, mine, 4096, cfxFloat32, cfxSum, comm, NULL)
                                  : cfxInternalError;
        __atomic_store_n(&second_call_refused, 1, __ATOMIC_RELEASE);
        pthread_join(first, NULL);
        RANK_ASSERT(ctx, entered, "the first call never entered the communicator");
        RANK_ASSERT(ctx, res == cfxInvalidUsage, "the second thread's call returned %s",
                    cfxGetErrorString(res));
        RANK_ASSERT(ctx, strstr(cfxGetLastError(NULL), "one call at a time") != NULL,
                    "sentence: %s", cfxGetLastError(NULL));
    }
    RANK_ASSERT(ctx, job.res == cfxSuccess, "the first call returned %s",
                cfxGetErrorString(job.res));
    for (int i = 0; i < 4096; i++)
        RANK_ASSERT(ctx, job.data[i] == (float)(3000 + 2 * i), "b[%d] = %g", i, job.data[i]);
    /* Threads taking turns (one at a time, ordered by join) are fine. */
    for (int round = 0; round < 4; round++) {
        pthread_t turn;
        RANK_ASSERT(ctx, pthread_create(&turn, NULL, allreduce_job, &job) == 0, "thread");
        pthread_join(turn, NULL);
        RANK_ASSERT(ctx, job.res == cfxSuccess, "round %d: %s", round, cfxGetErrorString(job.res));
    }
    RANK_CFX(ctx, cfxCommFinalize(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

static void *destroy_now(void *arg)
{
    struct abort_job *job = arg;
    job->res = cfxCommDestroy(job->comm);
    return NULL;
}

/* Rank 0's allreduce waits for rank 1, which never calls it; another thread
 * of rank 0 destroys the communicator under it (and a third tries too): the
 * call fails, one destroy returns once it has left, the other is refused,
 * and the handle is refused afterwards. */
static int destroyed_under_call;

static void destroy_under_a_call(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    if (ctx->rank == 1) {
        double start = now_s();
        while (!__atomic_load_n(&destroyed_under_call, __ATOMIC_ACQUIRE)) {
            RANK_ASSERT(ctx, now_s() - start < 20, "rank 0 never destroyed its communicator");
            sched_yield();
        }
        RANK_CFX(ctx, cfxCommDestroy(comm));
        return;
    }
    struct call_job job = {.comm = comm};
    pthread_t first;
    RANK_ASSERT(ctx, pthread_create(&first, NULL, allreduce_job, &job) == 0, "thread");
    int entered = wait_for_call_in(comm);
    /* Two threads destroy it at once: one does, the other is refused. */
    struct abort_job other = {.comm = comm};
    pthread_t second;
    RANK_ASSERT(ctx, pthread_create(&second, NULL, destroy_now, &other) == 0, "thread");
    cfxResult_t res = cfxCommDestroy(comm);
    pthread_join(second, NULL);
    pthread_join(first, NULL);
    __atomic_store_n(&destroyed_under_call, 1, __ATOMIC_RELEASE);
    RANK_ASSERT(ctx, entered, "the call never entered the communicator");
    RANK_ASSERT(ctx,
                (res == cfxSuccess) + (other.res == cfxSuccess) == 1 &&
                    (res == cfxInvalidArgument) + (other.res == cfxInvalidArgument) == 1,
                "the two destroys returned %s and %s", cfxGetErrorString(res),
                cfxGetErrorString(other.res));
    RANK_ASSERT(ctx, job.res != cfxSuccess, "the call under destroy succeeded");
    RANK_ASSERT(ctx, cfxCommDestroy(comm) == cfxInvalidArgument, "a second destroy was accepted");
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
    {"proxy_users_socket", 4, "1", NULL, proxy_users_come_and_go},
    {"abort_shm", 3, NULL, NULL, abort_from_another_thread},
    {"abort_socket", 3, "1", NULL, abort_from_another_thread},
    {"close_socket", 3, "1", "close:rank=1:after=2", broken_allreduce},
    {"corrupt_print_socket", 3, "1", "corrupt:rank=2:after=1:what=print", broken_allreduce},
    {"truncate_shm", 3, NULL, "truncate:rank=1:after=1", broken_allreduce},
    {"second_thread_refused_shm", 2, NULL, NULL, second_thread_refused},
    {"destroy_under_a_call_shm", 2, NULL, NULL, destroy_under_a_call},
    {"exec_abort_shm", 2, NULL, NULL, exec_abort_from_another_thread},
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
