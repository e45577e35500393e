/*
 * Nothing outlives a communicator: after destroy, abort or a failed init
 * the process has the file descriptors, threads and shared-memory segments
 * it had before; after a rank is killed with SIGKILL at any moment, /dev/shm
 * holds nothing of the job. (Leaked memory is LeakSanitizer's job: CI runs
 * this suite under ASan.)
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"

/* ------------------------------------------------------------ counting */

static int count_entries(const char *path)
{
    DIR *dir = opendir(path);
    if (dir == NULL)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));)
        if (e->d_name[0] != '.')
            n++;
    closedir(dir);
    return n;
}

/* Segments named for a process that no longer exists ("cfx-<pid>-...", the
 * names the shm transport used before its FIFOs became memfds),
 * as a space-separated list in @p names; returns how many. */
static int orphan_segments(char *names, size_t size)
{
    DIR *dir = opendir("/dev/shm");
    if (dir == NULL)
        return 0;
    int n = 0;
    names[0] = '\0';
    for (struct dirent *e; (e = readdir(dir));) {
        if (strncmp(e->d_name, "cfx-", 4) != 0)
            continue;
        int pid = atoi(e->d_name + 4);
        if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
            n++;
            size_t used = strlen(names);
            snprintf(names + used, size - used, "%s ", e->d_name);
        }
    }
    closedir(dir);
    return n;
}

/* Remove the orphans in @p names that are not in @p old_names (this test's
 * debris), so a failure does not fill /dev/shm. */
static void remove_new_orphans(const char *names, const char *old_names)
{
    char copy[1024], path[300];
    snprintf(copy, sizeof(copy), "%s", names);
    for (char *save = NULL, *name = strtok_r(copy, " ", &save); name;
         name = strtok_r(NULL, " ", &save)) {
        if (strstr(old_names, name) != NULL)
            continue;
        snprintf(path, sizeof(path), "/%s", name);
        shm_unlink(path);
    }
}

/* Segments of this process (threads ranks). */
static int own_segments(void)
{
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "cfx-%d-", (int)getpid());
    DIR *dir = opendir("/dev/shm");
    if (dir == NULL)
        return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(dir);
    return n;
}

struct census {
    int fds, threads, segments;
};

static struct census take_census(void)
{
    return (struct census){count_entries("/proc/self/fd"), count_entries("/proc/self/task"),
                           own_segments()};
}

/* Threads the library started may take a moment to exit (the root thread
 * leaves once it has answered every rank): wait up to 2 s for the census to
 * come back to @p before. */
static void assert_census_back_to(struct census before, const char *after_what)
{
    struct census now = take_census();
    for (int i = 0; i < 200; i++) {
        if (now.fds <= before.fds && now.threads <= before.threads &&
            now.segments <= before.segments)
            break;
        usleep(10 * 1000);
        now = take_census();
    }
    cr_assert_leq(now.fds, before.fds, "%d file descriptors open after %s (%d before)", now.fds,
                  after_what, before.fds);
    cr_assert_leq(now.threads, before.threads, "%d threads after %s (%d before)", now.threads,
                  after_what, before.threads);
    cr_assert_leq(now.segments, before.segments, "%d shm segments after %s (%d before)",
                  now.segments, after_what, before.segments);
}

static const char *transport_names[] = {"shm", "socket"};

static void use_transport(int socket)
{
    cfx_test_setenv("CFX_SHM_DISABLE", socket ? "1" : NULL);
}

static int transports[] = {0, 1};

#define OVER_EACH_TRANSPORT(name)                                                                  \
    ParameterizedTestParameters(hygiene, name)                                                     \
    {                                                                                              \
        return cr_make_param_array(int, transports, 2);                                            \
    }                                                                                              \
    ParameterizedTest(int *socket, hygiene, name, .timeout = 60)

/* ------------------------------------------------------------- destroy */

/* Everything that makes connections: the ring, point to point with every
 * peer, and a split communicator. */
static void busy_then_destroy(struct cfx_test_rank *ctx)
{
    cfxComm_t comm, half;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    float data[4096] = {0};
    RANK_CFX(ctx, cfxAllReduce(data, data, 4096, cfxFloat32, cfxSum, comm, NULL));
    RANK_CFX(ctx, cfxGroupStart());
    for (int peer = 0; peer < ctx->nranks; peer++) {
        if (peer == ctx->rank)
            continue;
        RANK_CFX(ctx, cfxSend(data, 16, cfxFloat32, peer, comm, NULL));
        RANK_CFX(ctx, cfxRecv(data + 16, 16, cfxFloat32, peer, comm, NULL));
    }
    RANK_CFX(ctx, cfxGroupEnd());
    RANK_CFX(ctx, cfxCommSplit(comm, ctx->rank % 2, ctx->rank, &half, NULL));
    RANK_CFX(ctx, cfxAllReduce(data, data, 4096, cfxFloat32, cfxSum, half, NULL));
    RANK_CFX(ctx, cfxCommFinalize(half));
    RANK_CFX(ctx, cfxCommDestroy(half));
    RANK_CFX(ctx, cfxCommFinalize(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

OVER_EACH_TRANSPORT(destroy_leaves_no_fds_threads_or_segments)
{
    cr_log_info("over %s", transport_names[*socket]);
    use_transport(*socket);
    struct census before = take_census();
    for (int round = 0; round < 2; round++) {
        struct cfx_test_options opts = {.nranks = 4, .mode = CFX_TEST_THREADS, .deadline_s = 40};
        CFX_TEST_RUN(&opts, busy_then_destroy);
    }
    assert_census_back_to(before, "two rounds of init, collectives, split and destroy");
}

/* --------------------------------------------------------------- abort */

/* Rank 0 aborts at once; the others' allreduce then fails and they abort too. */
static void abort_midway(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    float data[4096] = {0};
    RANK_CFX(ctx, cfxAllReduce(data, data, 4096, cfxFloat32, cfxSum, comm, NULL));
    if (ctx->rank == 0) {
        RANK_CFX(ctx, cfxCommAbort(comm));
        return;
    }
    cfx_test_step(ctx, "allreduce without rank 0");
    cfxResult_t res = cfxAllReduce(data, data, 4096, cfxFloat32, cfxSum, comm, NULL);
    RANK_ASSERT(ctx, res != cfxSuccess, "an allreduce without rank 0 succeeded");
    RANK_CFX(ctx, cfxCommAbort(comm));
}

OVER_EACH_TRANSPORT(abort_leaves_no_fds_threads_or_segments)
{
    cr_log_info("over %s", transport_names[*socket]);
    use_transport(*socket);
    cfx_test_setenv("CFX_TIMEOUT", "5");
    struct census before = take_census();
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_THREADS, .deadline_s = 40};
    CFX_TEST_RUN(&opts, abort_midway);
    assert_census_back_to(before, "cfxCommAbort");
}

/* --------------------------------------------------------- failed init */

static void init_fails(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    cfx_test_step(ctx, "init that fails while connecting");
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    RANK_ASSERT(ctx, res != cfxSuccess, "init succeeded");
}

/* A malformed CFX_FAULT fails init after the bootstrap, when the ring's
 * transports start. */
Test(hygiene, failed_init_leaves_no_fds_threads_or_segments, .timeout = 60)
{
    cfx_test_setenv("CFX_FAULT", "explode");
    struct census before = take_census();
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_THREADS, .deadline_s = 40};
    CFX_TEST_RUN(&opts, init_fails);
    assert_census_back_to(before, "a failed init");
}

/* ------------------------------------------------------------- SIGKILL */

/* Every rank runs collectives until it fails; rank 1 dies of SIGKILL where
 * CFX_FAULT says (transports/faulty). */
static void work_until_rank_one_dies(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    cfx_test_step(ctx, "init while rank 1 may die");
    if (cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank) != cfxSuccess)
        return;
    static float data[1 << 20];
    for (int i = 0; i < 50; i++) {
        cfx_test_step(ctx, "allreduce %d while rank 1 may die", i);
        if (cfxAllReduce(data, data, 1 << 20, cfxFloat32, cfxSum, comm, NULL) != cfxSuccess)
            break;
    }
    cfxCommDestroy(comm);
}

/* Rank 1 dies where @p fault says; then no segment of a dead process may
 * be left. */
static void kill_rank_one(const char *fault)
{
    cr_log_info("CFX_FAULT=%s", fault);
    cfx_test_setenv("CFX_FAULT", fault);
    cfx_test_setenv("CFX_TIMEOUT", "5");
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", "5");
    char old_names[1024], names[1024];
    int before = orphan_segments(old_names, sizeof(old_names));
    struct cfx_test_options opts = {
        .nranks = 4, .mode = CFX_TEST_PROCS, .deadline_s = 60, .killed_ranks = 1ull << 1};
    char report[8192];
    cfx_test_run(&opts, work_until_rank_one_dies, report, sizeof(report));
    int after = orphan_segments(names, sizeof(names));
    remove_new_orphans(names, old_names);
    cr_assert_leq(after, before, "segments of dead processes left in /dev/shm: %s", names);
}

/* The sender has the receiver's descriptor number but no name to leave behind. */
Test(hygiene, sigkill_at_connect_leaves_nothing_in_dev_shm, .timeout = 90)
{
    kill_rank_one("kill:rank=1:at=connect");
}

/* Mid-collective: the FIFOs exist only as mappings, which die with the process. */
Test(hygiene, sigkill_mid_collective_leaves_nothing_in_dev_shm, .timeout = 90)
{
    kill_rank_one("kill:rank=1:after=3");
}

/* Between creating its FIFO and sending where it is: no peer knows of it
 * yet. The FIFO has no name (a memfd), so the kernel frees it with the
 * process. */
Test(hygiene, sigkill_between_segment_and_name_leaves_nothing_in_dev_shm, .timeout = 90)
{
    kill_rank_one("kill:rank=1:at=setup");
}
