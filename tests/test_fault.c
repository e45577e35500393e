/*
 * Failures are errors with sentences, never hangs: CFX_TIMEOUT, a rank
 * killed mid-collective, cfxCommAbort from another thread, and ranks that
 * call mismatched collectives. Over shm and sockets, ranks as processes.
 * The flight recorder's SIGUSR1 dump says which rank is where.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

static const char *transport_names[] = {"shm", "socket"};

static void use_transport(int socket)
{
    cfx_test_setenv("CFX_SHM_DISABLE", socket ? "1" : NULL);
}

/* ------------------------------------------------------------- timeout */

static void silent_rank_two(struct cfx_test_rank *ctx)
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
    RANK_ASSERT(ctx, res == cfxTimeout, "allreduce returned %s: %s", cfxGetErrorString(res),
                cfxGetLastError(comm));
    RANK_ASSERT(ctx, took < 3.5, "the timeout took %.1f s with CFX_TIMEOUT=1", took);
    /* Rank 0 waits for rank 2; rank 1 waits for rank 0 (or hears from it). */
    RANK_ASSERT(ctx, strstr(cfxGetLastError(comm), ctx->rank == 0 ? "rank 2" : "rank ") != NULL,
                "the sentence names no peer: %s", cfxGetLastError(comm));
    if (ctx->rank == 0)
        RANK_ASSERT(ctx,
                    strstr(cfxGetLastError(comm), "allreduce #0") != NULL &&
                        strstr(cfxGetLastError(comm), "CFX_TIMEOUT") != NULL,
                    "the sentence does not name the operation: %s", cfxGetLastError(comm));
    cfxResult_t async;
    RANK_CFX(ctx, cfxCommGetAsyncError(comm, &async));
    RANK_ASSERT(ctx, async == cfxTimeout, "async error %d", async);
    start = now_s();
    res = cfxAllReduce(data, data, 1024, cfxFloat32, cfxSum, comm, NULL);
    RANK_ASSERT(ctx, res == cfxTimeout && now_s() - start < 0.1,
                "a later call returned %s after %.2f s; it should fail fast",
                cfxGetErrorString(res), now_s() - start);
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

ParameterizedTestParameters(fault, timeout_names_the_rank_that_did_not_answer)
{
    static int transports[] = {0, 1};
    return cr_make_param_array(int, transports, 2);
}

ParameterizedTest(int *socket, fault, timeout_names_the_rank_that_did_not_answer, .timeout = 60)
{
    cr_log_info("over %s", transport_names[*socket]);
    use_transport(*socket);
    cfx_test_setenv("CFX_TIMEOUT", "1");
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 30};
    CFX_TEST_RUN(&opts, silent_rank_two);
}

/* Each communicator keeps its own timeout: config.timeout = 1 on one (and
 * on its split child, which inherits it), CFX_TIMEOUT = 30 on another. */
static void silent_rank_two_per_comm(struct cfx_test_rank *ctx)
{
    cfxConfig_t config = CFX_CONFIG_INITIALIZER;
    config.timeout = 1;
    cfxComm_t quick, slow, child;
    RANK_CFX(ctx, cfxCommInitRankConfig(&quick, ctx->nranks, ctx->id, ctx->rank, &config));
    RANK_CFX(ctx, cfxCommSplit(quick, 0, ctx->rank, &slow, NULL));
    /* slow is quick's child: it inherits 1 s. A fresh init has CFX_TIMEOUT's 30 s. */
    child = slow;
    cfxConfig_t fresh = CFX_CONFIG_INITIALIZER;
    RANK_CFX(ctx, cfxCommSplit(quick, 0, ctx->rank, &slow, &fresh));
    float data[256] = {0};
    cfxComm_t quick_ones[2] = {quick, child};
    for (int c = 0; c < 2; c++) {
        if (ctx->rank == 2)
            continue;
        cfx_test_step(ctx, "allreduce on %s without rank 2", c ? "the child" : "quick");
        double start = now_s();
        cfxResult_t res = cfxAllReduce(data, data, 256, cfxFloat32, cfxSum, quick_ones[c], NULL);
        double took = now_s() - start;
        RANK_ASSERT(ctx, res == cfxTimeout, "allreduce returned %s: %s", cfxGetErrorString(res),
                    cfxGetLastError(quick_ones[c]));
        RANK_ASSERT(ctx, took < 3.5, "the timeout took %.1f s with config.timeout = 1", took);
    }
    if (ctx->rank == 2) {
        cfx_test_step(ctx, "rank 2 stays away from both, then joins slow");
        sleep(4);
    }
    cfx_test_step(ctx, "allreduce on slow (CFX_TIMEOUT=30) with every rank");
    for (int i = 0; i < 256; i++)
        data[i] = (float)(ctx->rank + 1);
    RANK_CFX(ctx, cfxAllReduce(data, data, 256, cfxFloat32, cfxSum, slow, NULL));
    RANK_ASSERT(ctx, data[255] == 6.0f, "sum %g", (double)data[255]);
    RANK_CFX(ctx, cfxCommDestroy(slow));
    RANK_CFX(ctx, cfxCommDestroy(child));
    RANK_CFX(ctx, cfxCommDestroy(quick));
}

Test(fault, config_timeout_is_per_communicator, .timeout = 60)
{
    cfx_test_setenv("CFX_TIMEOUT", "30");
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 40};
    CFX_TEST_RUN(&opts, silent_rank_two_per_comm);
}

/* ------------------------------------------------------- killed rank */

static void *kill_me_soon(void *arg)
{
    (void)arg;
    usleep(300 * 1000);
    kill(getpid(), SIGKILL);
    return NULL;
}

/* Case 2 of the killed-rank test: shm, with allgathers on the single-copy
 * path (survivors read the dying rank's memory, or wait for it to read
 * theirs). */
#define KILLED_IN_SINGLE_COPY 2

static void allreduce_until_rank_two_dies(struct cfx_test_rank *ctx)
{
    int single_copy = *(const int *)ctx->arg == KILLED_IN_SINGLE_COPY;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    RANK_ASSERT(ctx, !single_copy || comm->single_copy, "single copy is off over shm");
    size_t count = 1 << 20;
    float *data = calloc(count * (size_t)ctx->nranks, sizeof(float));
    RANK_ASSERT(ctx, data != NULL, "malloc");
    if (ctx->rank == 2) {
        pthread_t killer;
        pthread_create(&killer, NULL, kill_me_soon, NULL);
    }
    cfxResult_t res = cfxSuccess;
    double start = 0;
    for (int i = 0; i < 100000 && res == cfxSuccess; i++) {
        cfx_test_step(ctx, "%s %d while rank 2 dies", single_copy ? "allgather" : "allreduce", i);
        start = now_s();
        res = single_copy ? cfxAllGather(data + count * (size_t)ctx->rank, data, count, cfxFloat32,
                                         comm, NULL)
                          : cfxAllReduce(data, data, count, cfxFloat32, cfxSum, comm, NULL);
    }
    double took = now_s() - start;
    RANK_ASSERT(ctx, res == cfxRemoteError, "the call returned %s: %s", cfxGetErrorString(res),
                cfxGetLastError(comm));
    RANK_ASSERT(ctx, took < 12, "the failing call took %.1f s (CFX_TIMEOUT=10)", took);
    RANK_ASSERT(ctx, strstr(cfxGetLastError(comm), "rank 2") != NULL,
                "the sentence does not name rank 2: %s", cfxGetLastError(comm));
    start = now_s();
    res = cfxAllReduce(data, data, 16, cfxFloat32, cfxSum, comm, NULL);
    RANK_ASSERT(ctx, res == cfxRemoteError && now_s() - start < 0.1,
                "a later call returned %s after %.2f s", cfxGetErrorString(res), now_s() - start);
    cfxResult_t async;
    RANK_CFX(ctx, cfxCommGetAsyncError(comm, &async));
    RANK_ASSERT(ctx, async == cfxRemoteError, "async error %d", async);
    RANK_CFX(ctx, cfxCommDestroy(comm));
    free(data);
}

/* Segments this test's processes left in /dev/shm. */
static int leftover_segments(void)
{
    DIR *dir = opendir("/dev/shm");
    if (dir == NULL)
        return 0;
    int found = 0;
    for (struct dirent *e; (e = readdir(dir));)
        if (strncmp(e->d_name, "cfx-", 4) == 0) {
            int pid = atoi(e->d_name + 4);
            if (pid > getpid() && pid < getpid() + 64)
                found++;
        }
    closedir(dir);
    return found;
}

ParameterizedTestParameters(fault, killed_rank_fails_every_survivor_with_its_name)
{
    static int transports[] = {0, 1, KILLED_IN_SINGLE_COPY};
    return cr_make_param_array(int, transports, 3);
}

ParameterizedTest(int *socket, fault, killed_rank_fails_every_survivor_with_its_name, .timeout = 90)
{
    int single_copy = *socket == KILLED_IN_SINGLE_COPY;
    cr_log_info("over %s%s", transport_names[single_copy ? 0 : *socket],
                single_copy ? ", allgathers on the single-copy path" : "");
    use_transport(single_copy ? 0 : *socket);
    cfx_test_setenv("CFX_TIMEOUT", "10");
    /* Between processes single copy is off unless a threshold is set. */
    cfx_test_setenv("CFX_SINGLE_COPY_MIN_BYTES", single_copy ? "1M" : NULL);
    struct cfx_test_options opts = {.nranks = 4,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 60,
                                    .killed_ranks = 1ull << 2,
                                    .arg = socket};
    CFX_TEST_RUN(&opts, allreduce_until_rank_two_dies);
    cfx_test_setenv("CFX_SINGLE_COPY_MIN_BYTES", NULL);
    cr_assert_eq(leftover_segments(), 0, "shared-memory segments were left in /dev/shm");
}

/* ------------------------------------------------------------- abort */

struct abort_job {
    cfxComm_t comm;
    double aborted_at;
    cfxResult_t res;
};

static void *abort_later(void *arg)
{
    struct abort_job *job = arg;
    usleep(300 * 1000);
    job->aborted_at = now_s();
    job->res = cfxCommAbort(job->comm);
    return NULL;
}

static void abort_from_a_second_thread(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    if (ctx->rank == 0) {
        cfx_test_step(ctx, "rank 0 never joins the allreduce");
        sleep(2);
        RANK_CFX(ctx, cfxCommDestroy(comm));
        return;
    }
    struct abort_job job = {.comm = comm};
    pthread_t thread;
    pthread_create(&thread, NULL, abort_later, &job);
    float data[256] = {0};
    cfx_test_step(ctx, "allreduce that only cfxCommAbort can end");
    cfxResult_t res = cfxAllReduce(data, data, 256, cfxFloat32, cfxSum, comm, NULL);
    double returned_at = now_s();
    pthread_join(thread, NULL);
    RANK_ASSERT(ctx, res != cfxSuccess, "the allreduce succeeded without rank 0");
    RANK_ASSERT(ctx, job.res == cfxSuccess, "cfxCommAbort returned %d", job.res);
    RANK_ASSERT(ctx, returned_at - job.aborted_at < 1.0,
                "the blocked call returned %.2f s after cfxCommAbort",
                returned_at - job.aborted_at);
}

Test(fault, abort_from_another_thread_unblocks_the_call_within_a_second, .timeout = 60)
{
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 30};
    CFX_TEST_RUN(&opts, abort_from_a_second_thread);
}

/* ---------------------------------------------------- flight recorder */

static int count_in_file(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    int n = 0;
    char line[1024];
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* Rank 2 asks for a dump (SIGUSR1) while ranks 0 and 1 wait for it inside
 * their second allreduce; once the dump is written it joins them. */
static void dump_while_two_ranks_wait(struct cfx_test_rank *ctx)
{
    const char *log_path = ctx->arg;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    float data[1024] = {0};
    RANK_CFX(ctx, cfxAllReduce(data, data, 1024, cfxFloat32, cfxSum, comm, NULL));
    if (ctx->rank == 2) {
        cfx_test_step(ctx, "SIGUSR1 while ranks 0 and 1 wait in an allreduce");
        usleep(200 * 1000);
        kill(getpid(), SIGUSR1);
        /* Ranks 0 and 1 remember two operations, rank 2 one. */
        double deadline = now_s() + 10;
        while (count_in_file(log_path, " ms ago") < 5 && now_s() < deadline)
            usleep(10 * 1000);
    }
    cfx_test_step(ctx, "second allreduce");
    RANK_CFX(ctx, cfxAllReduce(data, data, 1024, cfxFloat32, cfxSum, comm, NULL));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

/* Each dump line carries its communicator's rank, and each operation its
 * age ("started X ms ago") followed by a duration only when it ended. */
Test(flight, sigusr1_dump_names_each_rank_and_the_age_of_each_operation, .timeout = 60)
{
    char log_path[64];
    snprintf(log_path, sizeof(log_path), "/tmp/cfx-flight-test.%d.log", (int)getpid());
    unlink(log_path);
    cfx_test_setenv("CFX_DUMP_ON_SIGNAL", "1");
    cfx_test_setenv("CFX_DEBUG_FILE", log_path);
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_THREADS, .deadline_s = 40, .arg = log_path};
    CFX_TEST_RUN(&opts, dump_while_two_ranks_wait);

    FILE *f = fopen(log_path, "r");
    cr_assert(f != NULL, "no log file %s", log_path);
    char line[1024];
    int headers = 0, ops = 0, running = 0, dump_rank = -1;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        const char *bracket = strstr(line, " [");
        cr_assert(bracket != NULL, "a log line without a rank: %s", line);
        int line_rank = atoi(bracket + 2);
        const char *header = strstr(line, "flight recorder of comm ");
        if (header != NULL) {
            int rank = -1, nranks = 0;
            const char *of = strstr(header, " rank ");
            cr_assert(of && sscanf(of, " rank %d of %d", &rank, &nranks) == 2, "header: %s", line);
            cr_assert(strstr(line, "(SIGUSR1)") != NULL, "not a SIGUSR1 dump: %s", line);
            cr_assert_eq(line_rank, rank, "the dump of rank %d is logged as rank [%d]: %s", rank,
                         line_rank, line);
            cr_assert_eq(nranks, 3, "%s", line);
            dump_rank = rank;
            headers++;
            continue;
        }
        const char *started = strstr(line, ", started ");
        if (started == NULL)
            continue;
        cr_assert_eq(line_rank, dump_rank, "an operation of rank %d's dump is logged as [%d]: %s",
                     dump_rank, line_rank, line);
        double age_ms = -1;
        int end = 0;
        cr_assert(sscanf(started, ", started %lf ms ago%n", &age_ms, &end) == 1 && end > 0,
                  "no age: %s", line);
        cr_assert_geq(age_ms, 0.0, "negative age: %s", line);
        const char *rest = started + end;
        if (strstr(line, ": running,") != NULL) {
            running++;
            cr_assert_str_empty(rest, "a running operation has no duration yet: %s", line);
        } else {
            double took_ms = -1;
            cr_assert(sscanf(rest, ", took %lf ms", &took_ms) == 1 && took_ms >= 0 &&
                          took_ms <= age_ms,
                      "an ended operation without a sensible duration: %s", line);
        }
        ops++;
    }
    fclose(f);
    unlink(log_path);
    cr_assert_eq(headers, 3, "%d dumps for 3 communicators", headers);
    cr_assert_eq(ops, 5, "%d operations in the dumps (2 + 2 + 1 expected)", ops);
    cr_assert_eq(running, 2, "%d running operations in the dumps (ranks 0 and 1 expected)",
                 running);
}

/* ---------------------------------------------------------- mismatch */

enum mismatch {
    DIFFERENT_COLLECTIVE,
    DIFFERENT_COUNT,
    DIFFERENT_TYPE,
    DIFFERENT_OP,
    DIFFERENT_ROOT,
    ZERO_COUNT_ON_ONE_RANK,
    N_MISMATCHES
};
static const char *mismatch_names[] = {"collective", "count", "type", "op", "root", "zero count"};

struct mismatch_case {
    enum mismatch kind;
    int socket;
};

static void mismatched_call(struct cfx_test_rank *ctx)
{
    const struct mismatch_case *mc = ctx->arg;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    float data[4096], out[4096];
    for (int i = 0; i < 4096; i++)
        data[i] = 1.0f;
    /* One good allreduce first: the mismatch is the second operation. */
    RANK_CFX(ctx, cfxAllReduce(data, out, 4096, cfxFloat32, cfxSum, comm, NULL));
    int odd = ctx->rank == 1;
    cfx_test_step(ctx, "mismatched %s", mismatch_names[mc->kind]);
    double start = now_s();
    cfxResult_t res;
    switch (mc->kind) {
    case DIFFERENT_COLLECTIVE:
        res = odd ? cfxBroadcast(data, out, 4096, cfxFloat32, 0, comm, NULL)
                  : cfxAllReduce(data, out, 4096, cfxFloat32, cfxSum, comm, NULL);
        break;
    case DIFFERENT_COUNT:
        res = cfxAllReduce(data, out, odd ? 4000 : 4096, cfxFloat32, cfxSum, comm, NULL);
        break;
    case DIFFERENT_TYPE:
        res = cfxAllReduce(data, out, 4096, odd ? cfxInt32 : cfxFloat32, cfxSum, comm, NULL);
        break;
    case DIFFERENT_OP:
        res = cfxAllReduce(data, out, 4096, cfxFloat32, odd ? cfxMax : cfxSum, comm, NULL);
        break;
    case DIFFERENT_ROOT:
        res = cfxReduce(data, out, 4096, cfxFloat32, cfxSum, odd ? 1 : 0, comm, NULL);
        break;
    default: res = cfxAllReduce(data, out, odd ? 0 : 4096, cfxFloat32, cfxSum, comm, NULL); break;
    }
    double took = now_s() - start;
    RANK_ASSERT(ctx, res == cfxInvalidUsage, "mismatched %s returned %s: %s",
                mismatch_names[mc->kind], cfxGetErrorString(res), cfxGetLastError(comm));
    RANK_ASSERT(ctx, took < 3, "caught only after %.1f s", took);
    RANK_ASSERT(ctx, strstr(cfxGetLastError(comm), "mismatched") != NULL, "sentence: %s",
                cfxGetLastError(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

#define N_MISMATCH_CASES (N_MISMATCHES * 2)
static struct mismatch_case mismatch_cases[N_MISMATCH_CASES];

ParameterizedTestParameters(mismatch, mismatched_calls_all_return_invalid_usage)
{
    for (int k = 0; k < N_MISMATCHES; k++)
        for (int t = 0; t < 2; t++)
            mismatch_cases[k * 2 + t] =
                (struct mismatch_case){.kind = (enum mismatch)k, .socket = t};
    return cr_make_param_array(struct mismatch_case, mismatch_cases, N_MISMATCH_CASES);
}

ParameterizedTest(struct mismatch_case *mc, mismatch, mismatched_calls_all_return_invalid_usage,
                  .timeout = 60)
{
    cr_log_info("different %s over %s", mismatch_names[mc->kind], transport_names[mc->socket]);
    use_transport(mc->socket);
    cfx_test_setenv("CFX_TIMEOUT", "20");
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 30, .arg = mc};
    CFX_TEST_RUN(&opts, mismatched_call);
}

/* With the check off, matching calls still work (and count 0 is free). */
static void matching_calls_without_checks(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    int v = ctx->rank + 1, sum = 0;
    RANK_CFX(ctx, cfxAllReduce(&v, &sum, 1, cfxInt32, cfxSum, comm, NULL));
    RANK_ASSERT(ctx, sum == ctx->nranks * (ctx->nranks + 1) / 2, "sum %d", sum);
    RANK_CFX(ctx, cfxAllReduce(&v, &sum, 0, cfxInt32, cfxSum, comm, NULL));
    RANK_CFX(ctx, cfxCommFinalize(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(mismatch, checks_can_be_turned_off, .timeout = 60)
{
    cfx_test_setenv("CFX_CHECK_MISMATCH", "0");
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 30};
    CFX_TEST_RUN(&opts, matching_calls_without_checks);
}

/* Rooted calls whose roots (or collectives) differ, where some ranks only
 * send and so cannot know at return that nobody took their data: every rank
 * must learn within two seconds, from the call itself or from
 * cfxCommGetAsyncError (a receiver that finds the mismatch, or a rank that
 * finds slots of a finished collective nobody took, breaks the communicator
 * and poisons its connectors), and the next call must fail at once. */
enum silent_mismatch {
    ROOTS_0_AND_1,            /* Broadcast from root 0 on rank 0, from root 1 on the others. */
    BROADCAST_AGAINST_REDUCE, /* Broadcast on rank 0, reduce on the others (root 0). */
    ROOT_1_ON_RANK_1_ONLY,    /* Broadcast from root 1 on rank 1, from root 0 on the others. */
    N_SILENT_MISMATCHES
};
static const char *silent_mismatch_names[] = {
    "broadcast from root 0 on rank 0 and root 1 elsewhere", "broadcast against reduce",
    "broadcast from root 1 on rank 1 only"};

struct silent_case {
    enum silent_mismatch kind;
    int socket;
    /* 0: the planner's choice; 1: CFX_ALGO=ring (the chain); 2: CFX_ALGO=tree,
     * after a broadcast from every root has built every relay; 3:
     * CFX_ALGO=tree with the relays built by the mismatched call itself (a
     * rank that waits to connect its relay finds the other root's slot in
     * its tree FIFO instead of waiting for a peer that never connects). */
    int algo;
    int next_call; /* A flag: a small allreduce right after, before asking for the async error. */
};

static void silent_mismatch_rank(struct cfx_test_rank *ctx)
{
    const struct silent_case *sc = ctx->arg;
    int r = ctx->rank;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, r));
    float data[4096], out[4096];
    for (int i = 0; i < 4096; i++)
        data[i] = (float)r;
    RANK_CFX(ctx, cfxAllReduce(data, out, 4096, cfxFloat32, cfxSum, comm, NULL));
    for (int root = 0; sc->algo == 2 && root < ctx->nranks; root++)
        RANK_CFX(ctx, cfxBroadcast(data, out, 4096, cfxFloat32, root, comm, NULL));
    cfx_test_step(ctx, "%s", silent_mismatch_names[sc->kind]);
    double start = now_s();
    cfxResult_t res;
    switch (sc->kind) {
    case ROOTS_0_AND_1:
        res = cfxBroadcast(data, out, 4096, cfxFloat32, r == 0 ? 0 : 1, comm, NULL);
        break;
    case BROADCAST_AGAINST_REDUCE:
        res = r == 0 ? cfxBroadcast(data, out, 4096, cfxFloat32, 0, comm, NULL)
                     : cfxReduce(data, out, 4096, cfxFloat32, cfxSum, 0, comm, NULL);
        break;
    default: res = cfxBroadcast(data, out, 4096, cfxFloat32, r == 1 ? 1 : 0, comm, NULL); break;
    }
    RANK_ASSERT(ctx, res == cfxSuccess || res == cfxInvalidUsage,
                "the mismatched call returned %s: %s", cfxGetErrorString(res),
                cfxGetLastError(comm));
    RANK_ASSERT(ctx, now_s() - start < 3, "the mismatched call took %.1f s", now_s() - start);
    /* Whichever call or query found it first says so. */
    int said_mismatched = strstr(cfxGetLastError(comm), "mismatched") != NULL;
    if (sc->next_call) {
        /* It may run before the leftovers it should find have arrived; it
         * must not hang, and what it finds breaks the communicator. */
        cfx_test_step(ctx, "a small allreduce after the mismatch");
        cfxResult_t then = cfxAllReduce(data, out, 1, cfxFloat32, cfxSum, comm, NULL);
        RANK_ASSERT(ctx, then == cfxSuccess || then == cfxInvalidUsage,
                    "the allreduce after the mismatch returned %s: %s", cfxGetErrorString(then),
                    cfxGetLastError(comm));
        RANK_ASSERT(ctx, now_s() - start < 3, "the allreduce after the mismatch took %.1f s",
                    now_s() - start);
        said_mismatched |= strstr(cfxGetLastError(comm), "mismatched") != NULL;
    }
    cfxResult_t async = cfxSuccess;
    cfx_test_step(ctx, "waiting for the async error (the call returned %s)",
                  cfxGetErrorString(res));
    while (now_s() - start < 2.0) {
        RANK_CFX(ctx, cfxCommGetAsyncError(comm, &async));
        if (async != cfxSuccess)
            break;
        usleep(1000);
    }
    RANK_ASSERT(ctx, async == cfxInvalidUsage,
                "the mismatched call returned %s and the async error is still %s after %.1f s",
                cfxGetErrorString(res), cfxGetErrorString(async), now_s() - start);
    said_mismatched |= strstr(cfxGetLastError(comm), "mismatched") != NULL;
    RANK_ASSERT(ctx, said_mismatched, "no sentence said mismatched; the last: %s",
                cfxGetLastError(comm));
    double next = now_s();
    res = cfxAllReduce(data, out, 1, cfxFloat32, cfxSum, comm, NULL);
    RANK_ASSERT(ctx, res == cfxInvalidUsage && now_s() - next < 0.1,
                "the next call returned %s after %.2f s", cfxGetErrorString(res), now_s() - next);
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

#define N_SILENT_CASES (N_SILENT_MISMATCHES * 2 * 4 * 2)
static struct silent_case silent_cases[N_SILENT_CASES];

ParameterizedTestParameters(mismatch, ranks_that_only_send_learn_of_a_mismatch_within_two_seconds)
{
    int k = 0;
    for (int m = 0; m < N_SILENT_MISMATCHES; m++)
        for (int t = 0; t < 2; t++)
            for (int algo = 0; algo < 4; algo++)
                for (int next = 0; next < 2; next++)
                    silent_cases[k++] = (struct silent_case){.kind = (enum silent_mismatch)m,
                                                             .socket = t,
                                                             .algo = algo,
                                                             .next_call = next};
    return cr_make_param_array(struct silent_case, silent_cases, (size_t)k);
}

ParameterizedTest(struct silent_case *sc, mismatch,
                  ranks_that_only_send_learn_of_a_mismatch_within_two_seconds, .timeout = 60)
{
    static const char *algos[] = {"the planner's choice", "CFX_ALGO=ring",
                                  "CFX_ALGO=tree, every relay built",
                                  "CFX_ALGO=tree, relays built by the mismatched call"};
    cr_log_info("%s over %s, %s%s", silent_mismatch_names[sc->kind], transport_names[sc->socket],
                algos[sc->algo], sc->next_call ? ", then a small allreduce" : "");
    use_transport(sc->socket);
    cfx_test_setenv("CFX_ALGO", sc->algo == 1 ? "ring" : sc->algo >= 2 ? "tree" : NULL);
    cfx_test_setenv("CFX_TIMEOUT", "20");
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 30, .arg = sc};
    CFX_TEST_RUN(&opts, silent_mismatch_rank);
    cfx_test_setenv("CFX_ALGO", NULL);
}

/* ------------------------------------------- connecting at first use */

/* The first send or receive with a peer connects to it; that wait obeys
 * CFX_TIMEOUT (3 s here), notices a dead peer, and names the call. */

#define FIRST_USE_COUNT (1 << 20) /* 4 MiB of floats: more than the FIFO holds. */

static int sentence_has(cfxComm_t comm, const char *words)
{
    return strstr(cfxGetLastError(comm), words) != NULL;
}

static void recv_from_a_rank_that_exits(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    if (ctx->rank == 0) {
        cfx_test_step(ctx, "rank 0 exits after 1 s without sending");
        sleep(1);
        RANK_CFX(ctx, cfxCommDestroy(comm));
        return;
    }
    float *data = calloc(FIRST_USE_COUNT, sizeof(float));
    RANK_ASSERT(ctx, data != NULL, "malloc");
    cfx_test_step(ctx, "cfxRecv from rank 0, which exits");
    double start = now_s();
    cfxResult_t res = cfxRecv(data, FIRST_USE_COUNT, cfxFloat32, 0, comm, NULL);
    double took = now_s() - start;
    free(data);
    RANK_ASSERT(ctx, res == cfxRemoteError, "the receive returned %s: %s", cfxGetErrorString(res),
                cfxGetLastError(comm));
    RANK_ASSERT(ctx, took < 2.8, "the receive took %.1f s: the dead peer went unnoticed", took);
    RANK_ASSERT(ctx,
                sentence_has(comm, "rank 1's cfxRecv from rank 0 (4194304 bytes)") &&
                    sentence_has(comm, "rank 0 is gone"),
                "the sentence does not name the call and the dead rank: %s", cfxGetLastError(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

ParameterizedTestParameters(first_use, recv_from_a_rank_that_exits_says_it_is_gone)
{
    static int transports[] = {0, 1};
    return cr_make_param_array(int, transports, 2);
}

ParameterizedTest(int *socket, first_use, recv_from_a_rank_that_exits_says_it_is_gone,
                  .timeout = 60)
{
    cr_log_info("over %s", transport_names[*socket]);
    use_transport(*socket);
    cfx_test_setenv("CFX_TIMEOUT", "3");
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 30};
    CFX_TEST_RUN(&opts, recv_from_a_rank_that_exits);
}

/* Two ranks and a pipe each: a rank writes to its own when its call has
 * returned and reads the other's before it leaves, so neither sees the
 * other gone while its call still waits. */
struct send_case {
    int both_send; /* Rank 1 sends to rank 0 too (outside a group), else calls nothing. */
    int pipes[2][2];
};

static void say_done_and_wait_for_the_other(struct cfx_test_rank *ctx, struct send_case *sc)
{
    char byte = 1;
    cfx_test_step(ctx, "waiting for rank %d to return from its call", 1 - ctx->rank);
    if (write(sc->pipes[ctx->rank][1], &byte, 1) != 1 ||
        read(sc->pipes[1 - ctx->rank][0], &byte, 1) != 1)
        cfx_test_fail(ctx, __FILE__, __LINE__, "the pipe between the ranks broke");
}

/* Rank 0 sends to rank 1, which does not receive; both stay until both
 * are done. */
static void sends_without_receives(struct cfx_test_rank *ctx)
{
    struct send_case *sc = ctx->arg;
    int both_send = sc->both_send;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    if (ctx->rank == 1 && !both_send) {
        cfx_test_step(ctx, "rank 1 never calls cfxRecv");
        say_done_and_wait_for_the_other(ctx, sc);
        RANK_CFX(ctx, cfxCommDestroy(comm));
        return;
    }
    float *data = calloc(FIRST_USE_COUNT, sizeof(float));
    RANK_ASSERT(ctx, data != NULL, "malloc");
    int peer = 1 - ctx->rank;
    cfx_test_step(ctx, "cfxSend to rank %d with no cfxRecv there", peer);
    double start = now_s();
    cfxResult_t res = cfxSend(data, FIRST_USE_COUNT, cfxFloat32, peer, comm, NULL);
    double took = now_s() - start;
    free(data);
    say_done_and_wait_for_the_other(ctx, sc);
    RANK_ASSERT(ctx, res == cfxTimeout, "the send returned %s: %s", cfxGetErrorString(res),
                cfxGetLastError(comm));
    RANK_ASSERT(ctx, took > 1.5 && took < 4.5, "the send took %.1f s with CFX_TIMEOUT=3", took);
    char call[96];
    snprintf(call, sizeof(call), "rank %d's cfxSend to rank %d (4194304 bytes)", ctx->rank, peer);
    char unmatched[96];
    snprintf(unmatched, sizeof(unmatched), "no matching cfxRecv on rank %d within CFX_TIMEOUT=3 s",
             peer);
    /* With both sending, one may hear first that the other gave up. */
    RANK_ASSERT(ctx,
                sentence_has(comm, call) &&
                    (sentence_has(comm, unmatched) || (both_send && sentence_has(comm, "gave up"))),
                "the sentence does not name the unmatched call: %s", cfxGetLastError(comm));
    cfxResult_t async;
    RANK_CFX(ctx, cfxCommGetAsyncError(comm, &async));
    RANK_ASSERT(ctx, async == cfxTimeout, "async error %d after the failed send", async);
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

ParameterizedTestParameters(first_use, send_without_a_receive_times_out_naming_the_call)
{
    static int transports[] = {0, 1};
    return cr_make_param_array(int, transports, 2);
}

ParameterizedTest(int *socket, first_use, send_without_a_receive_times_out_naming_the_call,
                  .timeout = 60)
{
    cr_log_info("over %s", transport_names[*socket]);
    use_transport(*socket);
    cfx_test_setenv("CFX_TIMEOUT", "3");
    struct send_case sc = {.both_send = 0};
    cr_assert(pipe(sc.pipes[0]) == 0 && pipe(sc.pipes[1]) == 0, "pipe");
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 30, .arg = &sc};
    CFX_TEST_RUN(&opts, sends_without_receives);
    for (int r = 0; r < 2; r++) {
        close(sc.pipes[r][0]);
        close(sc.pipes[r][1]);
    }
}

ParameterizedTestParameters(first_use, two_ranks_sending_to_each_other_outside_a_group_time_out)
{
    static int transports[] = {0, 1};
    return cr_make_param_array(int, transports, 2);
}

ParameterizedTest(int *socket, first_use, two_ranks_sending_to_each_other_outside_a_group_time_out,
                  .timeout = 60)
{
    cr_log_info("over %s", transport_names[*socket]);
    use_transport(*socket);
    cfx_test_setenv("CFX_TIMEOUT", "3");
    struct send_case sc = {.both_send = 1};
    cr_assert(pipe(sc.pipes[0]) == 0 && pipe(sc.pipes[1]) == 0, "pipe");
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 30, .arg = &sc};
    CFX_TEST_RUN(&opts, sends_without_receives);
    for (int r = 0; r < 2; r++) {
        close(sc.pipes[r][0]);
        close(sc.pipes[r][1]);
    }
}

/* ------------------------------------------------- dying during init */

/* CFX_FAULT of each case (the cases cross into the test's own process by
 * value: no pointers). */
static const char *init_faults[] = {"kill:rank=1:at=connect", "kill:rank=2:at=setup"};

struct init_death {
    int fault; /* Index in init_faults. */
    int nranks;
    int dead; /* The rank that dies. */
    int socket;
};

static void init_while_a_rank_dies(struct cfx_test_rank *ctx)
{
    const struct init_death *death = ctx->arg;
    cfxComm_t comm = NULL;
    cfx_test_step(ctx, "init while rank %d dies (%s)", death->dead, init_faults[death->fault]);
    double start = now_s();
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    double took = now_s() - start;
    RANK_ASSERT(ctx, res != cfxSuccess, "init succeeded while rank %d died", death->dead);
    RANK_ASSERT(ctx, took < 8, "init took %.1f s to fail (CFX_BOOTSTRAP_TIMEOUT=10)", took);
    char died[64], gone[64];
    snprintf(died, sizeof(died), "rank %d died", death->dead);
    snprintf(gone, sizeof(gone), "rank %d is gone", death->dead);
    RANK_ASSERT(ctx, sentence_has(NULL, died) || sentence_has(NULL, gone),
                "the sentence does not say that rank %d died: %s", death->dead,
                cfxGetLastError(NULL));
}

static struct init_death init_deaths[] = {
    {0, 3, 1, 0},
    {0, 3, 1, 1},
    {1, 4, 2, 0},
    {1, 4, 2, 1},
};

ParameterizedTestParameters(init_death, survivors_say_which_rank_died)
{
    return cr_make_param_array(struct init_death, init_deaths,
                               sizeof(init_deaths) / sizeof(init_deaths[0]));
}

ParameterizedTest(struct init_death *death, init_death, survivors_say_which_rank_died,
                  .timeout = 60)
{
    cr_log_info("CFX_FAULT=%s, %d ranks, over %s", init_faults[death->fault], death->nranks,
                transport_names[death->socket]);
    use_transport(death->socket);
    cfx_test_setenv("CFX_FAULT", init_faults[death->fault]);
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", "10");
    struct cfx_test_options opts = {.nranks = death->nranks,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 40,
                                    .killed_ranks = 1ull << death->dead,
                                    .arg = death};
    CFX_TEST_RUN(&opts, init_while_a_rank_dies);
    cfx_test_setenv("CFX_FAULT", NULL);
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", NULL);
}

/* Rank 0 serves the bootstrap root (CFX_COMM_ID) and dies while rank 1
 * waits there for rank 2, which never comes. */
static void *kill_me_later(void *arg)
{
    (void)arg;
    usleep(1500 * 1000); /* Time for rank 1 to reach the root and wait there. */
    kill(getpid(), SIGKILL);
    return NULL;
}

static void join_while_the_root_dies(struct cfx_test_rank *ctx)
{
    cfxComm_t comm = NULL;
    if (ctx->rank == 0) {
        pthread_t killer;
        pthread_create(&killer, NULL, kill_me_later, NULL);
    }
    cfx_test_step(ctx, "init while the root's process dies");
    double start = now_s();
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    double took = now_s() - start;
    RANK_ASSERT(ctx, res == cfxRemoteError, "init returned %s: %s", cfxGetErrorString(res),
                cfxGetLastError(NULL));
    RANK_ASSERT(ctx, took < 8, "init took %.1f s to fail", took);
    RANK_ASSERT(ctx, sentence_has(NULL, "died") && sentence_has(NULL, "rank 0"),
                "the sentence does not say that rank 0 (the root) died: %s", cfxGetLastError(NULL));
}

Test(init_death, a_dead_root_is_named_as_rank_0, .timeout = 60)
{
    /* A port nobody uses now: the kernel's pick for a socket we close. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0 &&
                  getsockname(fd, (struct sockaddr *)&sin, &len) == 0,
              "no free port");
    close(fd);
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", ntohs(sin.sin_port));
    cfx_test_setenv("CFX_COMM_ID", addr);
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", "20");
    struct cfx_test_options opts = {.nranks = 3,
                                    .mode = CFX_TEST_PROCS,
                                    .id_mode = CFX_TEST_ID_ENV,
                                    .deadline_s = 40,
                                    .skip_ranks = 1ull << 2,
                                    .killed_ranks = 1ull << 0};
    CFX_TEST_RUN(&opts, join_while_the_root_dies);
    cfx_test_setenv("CFX_COMM_ID", NULL);
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", NULL);
}
