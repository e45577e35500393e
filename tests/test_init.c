/*
 * Communicator lifecycle over 1..8 ranks, as processes and as threads:
 * init, queries, split, finalize, destroy, abort, CFX_COMM_ID, InitAll.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/harness.h"

struct shape {
    int nranks;
    enum cfx_test_mode mode;
};

static struct shape all_shapes[] = {
    {1, CFX_TEST_PROCS},   {2, CFX_TEST_PROCS},   {3, CFX_TEST_PROCS},   {4, CFX_TEST_PROCS},
    {8, CFX_TEST_PROCS},   {1, CFX_TEST_THREADS}, {2, CFX_TEST_THREADS}, {3, CFX_TEST_THREADS},
    {4, CFX_TEST_THREADS}, {8, CFX_TEST_THREADS},
};

static const char *mode_name(enum cfx_test_mode mode)
{
    return mode == CFX_TEST_PROCS ? "processes" : "threads";
}

/* ------------------------------------------------------------ init */

static void init_query_finalize_destroy(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    int count = -1, rank = -1, device = -2;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    RANK_CFX(ctx, cfxCommCount(comm, &count));
    RANK_CFX(ctx, cfxCommUserRank(comm, &rank));
    RANK_CFX(ctx, cfxCommCuDevice(comm, &device));
    RANK_ASSERT(ctx, count == ctx->nranks, "count %d, expected %d", count, ctx->nranks);
    RANK_ASSERT(ctx, rank == ctx->rank, "rank %d, expected %d", rank, ctx->rank);
    RANK_ASSERT(ctx, device == -1, "host-only communicator reports device %d", device);
    cfxResult_t async = cfxInternalError;
    RANK_CFX(ctx, cfxCommGetAsyncError(comm, &async));
    RANK_ASSERT(ctx, async == cfxSuccess, "async error %d on a healthy communicator", async);
    RANK_CFX(ctx, cfxCommFinalize(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

ParameterizedTestParameters(init, init_query_finalize_destroy_n_ranks)
{
    return cr_make_param_array(struct shape, all_shapes,
                               sizeof(all_shapes) / sizeof(all_shapes[0]));
}

ParameterizedTest(struct shape *shape, init, init_query_finalize_destroy_n_ranks, .timeout = 120)
{
    cr_log_info("%d ranks as %s", shape->nranks, mode_name(shape->mode));
    struct cfx_test_options opts = {.nranks = shape->nranks, .mode = shape->mode, .deadline_s = 60};
    CFX_TEST_RUN(&opts, init_query_finalize_destroy);
}

/* Destroy is local: ranks may destroy without finalize, in any order. */
static void destroy_without_finalize(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    if (ctx->rank == 0)
        usleep(200 * 1000); /* The others are long gone when rank 0 destroys. */
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(init, destroy_without_finalize_is_local, .timeout = 60)
{
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 30};
    CFX_TEST_RUN(&opts, destroy_without_finalize);
}

/* ------------------------------------------------------------ split */

/* color = rank % 3, key = -rank: children hold every third rank in reverse. */
static void split_by_three_reversed(struct cfx_test_rank *ctx)
{
    cfxComm_t comm, child;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    int color = ctx->rank % 3;
    RANK_CFX(ctx, cfxCommSplit(comm, color, -ctx->rank, &child, NULL));
    RANK_ASSERT(ctx, child != NULL, "split returned NULL for color %d", color);
    int members = 0, position = 0;
    for (int r = 0; r < ctx->nranks; r++)
        if (r % 3 == color) {
            members++;
            if (r > ctx->rank)
                position++;
        }
    int count, rank;
    RANK_CFX(ctx, cfxCommCount(child, &count));
    RANK_CFX(ctx, cfxCommUserRank(child, &rank));
    RANK_ASSERT(ctx, count == members, "child has %d ranks, expected %d", count, members);
    RANK_ASSERT(ctx, rank == position, "child rank %d, expected %d", rank, position);
    /* A grandchild over the child works too. */
    cfxComm_t grandchild;
    RANK_CFX(ctx, cfxCommSplit(child, 0, 0, &grandchild, NULL));
    RANK_CFX(ctx, cfxCommCount(grandchild, &count));
    RANK_ASSERT(ctx, count == members, "grandchild has %d ranks, expected %d", count, members);
    RANK_CFX(ctx, cfxCommFinalize(grandchild));
    RANK_CFX(ctx, cfxCommDestroy(grandchild));
    RANK_CFX(ctx, cfxCommFinalize(child));
    RANK_CFX(ctx, cfxCommDestroy(child));
    /* The parent still works after its children are gone. */
    RANK_CFX(ctx, cfxCommFinalize(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

ParameterizedTestParameters(split, split_by_color_orders_by_key)
{
    return cr_make_param_array(struct shape, all_shapes,
                               sizeof(all_shapes) / sizeof(all_shapes[0]));
}

ParameterizedTest(struct shape *shape, split, split_by_color_orders_by_key, .timeout = 120)
{
    cr_log_info("%d ranks as %s", shape->nranks, mode_name(shape->mode));
    struct cfx_test_options opts = {.nranks = shape->nranks, .mode = shape->mode, .deadline_s = 60};
    CFX_TEST_RUN(&opts, split_by_three_reversed);
}

/* Odd ranks opt out with CFX_SPLIT_NOCOLOR and get NULL. */
static void split_nocolor(struct cfx_test_rank *ctx)
{
    cfxComm_t comm, child = (cfxComm_t)0x1;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    int odd = ctx->rank % 2;
    RANK_CFX(ctx, cfxCommSplit(comm, odd ? CFX_SPLIT_NOCOLOR : 7, ctx->rank, &child, NULL));
    if (odd) {
        RANK_ASSERT(ctx, child == NULL, "CFX_SPLIT_NOCOLOR rank got a communicator");
    } else {
        int count, rank;
        RANK_CFX(ctx, cfxCommCount(child, &count));
        RANK_CFX(ctx, cfxCommUserRank(child, &rank));
        RANK_ASSERT(ctx, count == (ctx->nranks + 1) / 2, "child has %d ranks", count);
        RANK_ASSERT(ctx, rank == ctx->rank / 2, "child rank %d", rank);
        RANK_CFX(ctx, cfxCommFinalize(child));
        RANK_CFX(ctx, cfxCommDestroy(child));
    }
    RANK_CFX(ctx, cfxCommFinalize(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(split, nocolor_ranks_get_null, .timeout = 60)
{
    struct cfx_test_options opts = {.nranks = 5, .mode = CFX_TEST_PROCS, .deadline_s = 30};
    CFX_TEST_RUN(&opts, split_nocolor);
}

/* A config passed to split is honoured (and a bad one refused). */
static void split_with_config(struct cfx_test_rank *ctx)
{
    cfxComm_t comm, child;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    cfxConfig_t bad = CFX_CONFIG_INITIALIZER;
    bad.blocking = 7;
    cfxResult_t res = cfxCommSplit(comm, 0, 0, &child, &bad);
    RANK_ASSERT(ctx, res == cfxInvalidArgument, "bad config gave %d", res);
    RANK_ASSERT(ctx, strstr(cfxGetLastError(comm), "blocking") != NULL, "sentence: %s",
                cfxGetLastError(comm));
    cfxConfig_t config = CFX_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "child";
    RANK_CFX(ctx, cfxCommSplit(comm, 0, 0, &child, &config));
    RANK_CFX(ctx, cfxCommFinalize(child));
    RANK_CFX(ctx, cfxCommDestroy(child));
    RANK_CFX(ctx, cfxCommFinalize(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(split, config_is_checked_and_used, .timeout = 60)
{
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 30};
    CFX_TEST_RUN(&opts, split_with_config);
}

/* Rank 1 passes a bad color: every rank fails at once, naming it, and the
 * parent stays usable by all (a second split, an allreduce, finalize). */
static void split_with_one_bad_color(struct cfx_test_rank *ctx)
{
    cfxComm_t comm, child = NULL;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    cfx_test_step(ctx, "the split where rank 1 passes color -5");
    cfxResult_t res = cfxCommSplit(comm, ctx->rank == 1 ? -5 : 0, 0, &child, NULL);
    RANK_ASSERT(ctx, res == cfxInvalidArgument, "split returned %s: %s", cfxGetErrorString(res),
                cfxGetLastError(comm));
    RANK_ASSERT(ctx, child == NULL, "a failed split left a communicator");
    const char *expect = ctx->rank == 1 ? "color = -5" : "rank 1";
    RANK_ASSERT(ctx, strstr(cfxGetLastError(comm), expect) != NULL,
                "the sentence does not mention \"%s\": %s", expect, cfxGetLastError(comm));
    cfxResult_t async = cfxInternalError;
    RANK_CFX(ctx, cfxCommGetAsyncError(comm, &async));
    RANK_ASSERT(ctx, async == cfxSuccess, "the parent is broken (%d) after a refused split", async);
    RANK_CFX(ctx, cfxCommSplit(comm, ctx->rank % 2, 0, &child, NULL));
    int32_t value = ctx->rank, sum = 0;
    RANK_CFX(ctx, cfxAllReduce(&value, &sum, 1, cfxInt32, cfxSum, comm, NULL));
    RANK_ASSERT(ctx, sum == ctx->nranks * (ctx->nranks - 1) / 2, "sum %d", sum);
    RANK_CFX(ctx, cfxCommFinalize(child));
    RANK_CFX(ctx, cfxCommDestroy(child));
    RANK_CFX(ctx, cfxCommFinalize(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(split, a_bad_color_on_one_rank_fails_the_split_on_every_rank_and_keeps_the_parent,
     .timeout = 60)
{
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", "5");
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 40};
    CFX_TEST_RUN(&opts, split_with_one_bad_color);
}

/* ------------------------------------------------------------ abort */

static void init_then_abort(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    /* Rank 0 aborts at once; the others finalize, which must not hang on rank 0. */
    if (ctx->rank == 0) {
        RANK_CFX(ctx, cfxCommAbort(comm));
        return;
    }
    cfx_test_step(ctx, "cfxCommFinalize after rank 0 aborted");
    cfxResult_t res = cfxCommFinalize(comm);
    /* Rank 0 never enters the barrier, so nobody can complete it. */
    RANK_ASSERT(ctx, res == cfxRemoteError, "finalize after a peer aborted returned %s",
                cfxGetErrorString(res));
    cfxResult_t async;
    RANK_CFX(ctx, cfxCommGetAsyncError(comm, &async));
    RANK_ASSERT(ctx, async == cfxRemoteError, "async error %d", async);
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(abort, abort_releases_without_waiting_for_peers, .timeout = 60)
{
    struct cfx_test_options opts = {.nranks = 4, .mode = CFX_TEST_PROCS, .deadline_s = 30};
    CFX_TEST_RUN(&opts, init_then_abort);
}

/* ------------------------------------------------------------ CFX_COMM_ID */

static void comm_id_init(struct cfx_test_rank *ctx)
{
    init_query_finalize_destroy(ctx);
}

static void comm_id_run(enum cfx_test_mode mode, int nranks)
{
    char addr[64];
    /* A port below Linux's ephemeral range (32768 up), so no outgoing
     * connection of another test holds it; different per test process. */
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", 20000 + (int)(getpid() % 12000));
    cfx_test_setenv("CFX_COMM_ID", addr);
    struct cfx_test_options opts = {
        .nranks = nranks, .mode = mode, .id_mode = CFX_TEST_ID_ENV, .deadline_s = 30};
    CFX_TEST_RUN(&opts, comm_id_init);
}

Test(comm_id, every_rank_derives_the_same_id_processes, .timeout = 60)
{
    comm_id_run(CFX_TEST_PROCS, 4);
}

Test(comm_id, every_rank_derives_the_same_id_threads, .timeout = 60)
{
    comm_id_run(CFX_TEST_THREADS, 3);
}

Test(comm_id, ids_from_comm_id_are_identical, .timeout = 30)
{
    cfx_test_setenv("CFX_COMM_ID", "127.0.0.1:29500");
    cfxUniqueId a, b;
    cr_assert_eq(cfxGetUniqueId(&a), cfxSuccess);
    cr_assert_eq(cfxGetUniqueId(&b), cfxSuccess);
    cr_assert(memcmp(&a, &b, sizeof(a)) == 0, "two ids from one CFX_COMM_ID differ");
}

Test(comm_id, malformed_comm_id_is_an_invalid_argument, .timeout = 30)
{
    cfx_test_setenv("CFX_COMM_ID", "no-port-here");
    cfxUniqueId id;
    cr_assert_eq(cfxGetUniqueId(&id), cfxInvalidArgument);
    cr_assert(strstr(cfxGetLastError(NULL), "no-port-here") != NULL, "sentence: %s",
              cfxGetLastError(NULL));
}

/* ------------------------------------------------------------ scalable */

/* Ids of a scalable init, shared by the ranks (memory mapped before the
 * fork): as processes, the first rank of each id's block makes that id, as
 * a job would, so the roots run in different processes. */
struct scalable_area {
    cfxUniqueId ids[8];
    int ready[8]; /* 1 made, -1 failed. */
};

struct scalable_case {
    int nranks;
    int n_ids;
    enum cfx_test_mode mode;
    struct scalable_area *area;
};

/* The block of id k (NCCL's split: contiguous, the first nranks % n larger). */
static void scalable_block(int nranks, int n, int k, int *first, int *size)
{
    *size = nranks / n + (k < nranks % n);
    *first = k * (nranks / n) + (k < nranks % n ? k : nranks % n);
}

static void scalable_init(struct cfx_test_rank *ctx)
{
    struct scalable_case *c = ctx->arg;
    if (c->mode == CFX_TEST_PROCS) {
        for (int k = 0; k < c->n_ids; k++) {
            int first, size;
            scalable_block(c->nranks, c->n_ids, k, &first, &size);
            if (first == ctx->rank) {
                int made = cfxGetUniqueId(&c->area->ids[k]) == cfxSuccess;
                __atomic_store_n(&c->area->ready[k], made ? 1 : -1, __ATOMIC_RELEASE);
                RANK_ASSERT(ctx, made, "cfxGetUniqueId: %s", cfxGetLastError(NULL));
            }
        }
        cfx_test_step(ctx, "waiting for the ids of the blocks' first ranks");
        for (int k = 0; k < c->n_ids; k++) {
            int ready;
            while ((ready = __atomic_load_n(&c->area->ready[k], __ATOMIC_ACQUIRE)) == 0)
                usleep(1000);
            RANK_ASSERT(ctx, ready == 1, "the rank that makes ids[%d] failed", k);
        }
    }
    cfxComm_t comm;
    RANK_CFX(ctx,
             cfxCommInitRankScalable(&comm, ctx->nranks, ctx->rank, c->n_ids, c->area->ids, NULL));
    int count = -1, rank = -1;
    RANK_CFX(ctx, cfxCommCount(comm, &count));
    RANK_CFX(ctx, cfxCommUserRank(comm, &rank));
    RANK_ASSERT(ctx, count == ctx->nranks && rank == ctx->rank, "count %d rank %d", count, rank);
    /* The bootstrap reaches every rank: a split (its allgather) and a
     * collective (its connections) work. */
    cfxComm_t half;
    RANK_CFX(ctx, cfxCommSplit(comm, ctx->rank % 2, ctx->rank, &half, NULL));
    cfx_test_allreduce_check(ctx, comm, 4099);
    int mine = ctx->rank, sum = -1, want = 0;
    for (int r = ctx->rank % 2; r < ctx->nranks; r += 2)
        want += r;
    RANK_CFX(ctx, cfxAllReduce(&mine, &sum, 1, cfxInt32, cfxSum, half, NULL));
    RANK_ASSERT(ctx, sum == want, "sum over the split's half: %d, expected %d", sum, want);
    RANK_CFX(ctx, cfxCommDestroy(half));
    RANK_CFX(ctx, cfxCommFinalize(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

static struct scalable_case scalable_cases[] = {
    {1, 1, CFX_TEST_PROCS, NULL},   {4, 2, CFX_TEST_PROCS, NULL},   {7, 3, CFX_TEST_PROCS, NULL},
    {8, 8, CFX_TEST_PROCS, NULL},   {5, 2, CFX_TEST_THREADS, NULL}, {8, 3, CFX_TEST_THREADS, NULL},
    {3, 1, CFX_TEST_THREADS, NULL},
};

ParameterizedTestParameters(scalable, every_id_root_serves_its_block)
{
    return cr_make_param_array(struct scalable_case, scalable_cases,
                               sizeof(scalable_cases) / sizeof(scalable_cases[0]));
}

/* Each rank joins through the id of its block and the communicator is
 * whole; the logs show which root served which rank: each root its block,
 * and the root of ids[0] also the first rank of every other block. */
ParameterizedTest(struct scalable_case *c, scalable, every_id_root_serves_its_block, .timeout = 120)
{
    cr_log_info("%d ranks, %d ids, as %s", c->nranks, c->n_ids, mode_name(c->mode));
    struct scalable_area *area =
        mmap(NULL, sizeof(*area), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(area != MAP_FAILED);
    memset(area, 0, sizeof(*area));
    if (c->mode == CFX_TEST_THREADS)
        for (int k = 0; k < c->n_ids; k++)
            cr_assert_eq(cfxGetUniqueId(&area->ids[k]), cfxSuccess, "%s", cfxGetLastError(NULL));
    c->area = area;
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "scalable");
    cfx_test_setenv("CFX_DEBUG_SUBSYS", "INIT,BOOTSTRAP");
    struct cfx_test_options opts = {
        .nranks = c->nranks, .mode = c->mode, .deadline_s = 90, .arg = c};
    CFX_TEST_RUN(&opts, scalable_init);
    cfx_test_logs_off();
    if (c->n_ids > 1) {
        for (int k = 0; k < c->n_ids; k++) {
            int first, size;
            char line[128];
            scalable_block(c->nranks, c->n_ids, k, &first, &size);
            snprintf(line, sizeof(line), "(scalable: through ids[%d] of %d, %d rank(s))", k,
                     c->n_ids, size);
            int seen = cfx_test_count_in_logs(logs, line);
            cr_expect_eq(seen, size, "%d rank(s) said \"%s\", expected %d", seen, line, size);
        }
        /* The roots' own lines: each seat taken once, the hub's extra seats
         * by the first ranks of the other blocks. */
        int joins = cfx_test_count_in_logs(logs, "bootstrap root: rank ");
        cr_expect_eq(joins, c->nranks + c->n_ids - 1, "%d joins at the roots, expected %d", joins,
                     c->nranks + c->n_ids - 1);
    }
    cfx_test_remove_logs(logs);
    munmap(area, sizeof(*area));
}

static void scalable_bad_ids(struct cfx_test_rank *ctx)
{
    cfxUniqueId *ids = ctx->arg;
    cfxComm_t comm = NULL;
    cfxResult_t res = cfxCommInitRankScalable(&comm, 2, ctx->rank, 3, ids, NULL);
    RANK_ASSERT(ctx, res == cfxInvalidArgument && strstr(cfxGetLastError(NULL), "nId = 3"),
                "nId above nranks: %d, %s", res, cfxGetLastError(NULL));
    res = cfxCommInitRankScalable(&comm, 2, ctx->rank, 0, ids, NULL);
    RANK_ASSERT(ctx, res == cfxInvalidArgument, "nId 0: %d", res);
    res = cfxCommInitRankScalable(&comm, 2, ctx->rank, 1, NULL, NULL);
    RANK_ASSERT(ctx, res == cfxInvalidArgument && strstr(cfxGetLastError(NULL), "NULL"),
                "NULL ids: %d, %s", res, cfxGetLastError(NULL));
    cfxUniqueId twice[2] = {ids[0], ids[0]};
    res = cfxCommInitRankScalable(&comm, 2, ctx->rank, 2, twice, NULL);
    RANK_ASSERT(
        ctx, res == cfxInvalidArgument && strstr(cfxGetLastError(NULL), "commIds[1] is commIds[0]"),
        "a repeated id: %d, %s", res, cfxGetLastError(NULL));
    cfxUniqueId junk[2] = {ids[0]};
    memset(&junk[1], 0x5a, sizeof(junk[1]));
    res = cfxCommInitRankScalable(&comm, 2, ctx->rank, 2, junk, NULL);
    RANK_ASSERT(ctx,
                res == cfxInvalidArgument && strstr(cfxGetLastError(NULL), "commIds[1] is not"),
                "a junk id: %d, %s", res, cfxGetLastError(NULL));
    RANK_ASSERT(ctx, comm == NULL, "a refused init set the communicator");
    /* The ids were not used: they still form the communicator. */
    RANK_CFX(ctx, cfxCommInitRankScalable(&comm, 2, ctx->rank, 2, ids, NULL));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(scalable, bad_ids_and_counts_are_refused_with_a_sentence, .timeout = 60)
{
    static cfxUniqueId ids[2];
    for (int k = 0; k < 2; k++)
        cr_assert_eq(cfxGetUniqueId(&ids[k]), cfxSuccess);
    /* Processes: cfxGetLastError(NULL) is the process's last sentence. */
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 30, .arg = ids};
    CFX_TEST_RUN(&opts, scalable_bad_ids);
}

/* A rank of ids[1]'s block that never comes: its block's ranks and the
 * hub's time out, and the sentences say which global ranks the id serves. */
static void scalable_missing_rank(struct cfx_test_rank *ctx)
{
    cfxUniqueId *ids = ctx->arg;
    cfxComm_t comm = NULL;
    cfxResult_t res = cfxCommInitRankScalable(&comm, 4, ctx->rank, 2, ids, NULL);
    const char *why = cfxGetLastError(NULL);
    RANK_ASSERT(ctx, res == cfxTimeout, "init without rank 3: %d (%s)", res, why);
    if (ctx->rank == 2)
        RANK_ASSERT(ctx, strstr(why, "through ids[1], whose seats 0-1 are ranks 2-3") != NULL,
                    "rank 2's sentence: %s", why);
    else
        RANK_ASSERT(ctx, strstr(why, "through ids[0]") != NULL, "rank %d's sentence: %s", ctx->rank,
                    why);
}

Test(scalable, a_missing_rank_times_out_with_the_ranks_its_id_serves, .timeout = 60)
{
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", "3"); /* The roots read it too. */
    static cfxUniqueId ids[2];
    for (int k = 0; k < 2; k++)
        cr_assert_eq(cfxGetUniqueId(&ids[k]), cfxSuccess);
    /* Rank 3 never runs. */
    struct cfx_test_options opts = {
        .nranks = 4, .mode = CFX_TEST_PROCS, .deadline_s = 40, .arg = ids, .skip_ranks = 1ull << 3};
    CFX_TEST_RUN(&opts, scalable_missing_rank);
}

/* ------------------------------------------------------------ InitAll */

ParameterizedTestParameters(init_all, init_all_creates_n_ranks_in_one_process)
{
    static int counts[] = {1, 2, 3, 4, 8};
    return cr_make_param_array(int, counts, sizeof(counts) / sizeof(counts[0]));
}

ParameterizedTest(int *n, init_all, init_all_creates_n_ranks_in_one_process, .timeout = 60)
{
    cfxComm_t comms[8];
    cr_assert_eq(cfxCommInitAll(comms, *n, NULL), cfxSuccess, "%s", cfxGetLastError(NULL));
    for (int i = 0; i < *n; i++) {
        int rank, count, device;
        cr_assert_eq(cfxCommUserRank(comms[i], &rank), cfxSuccess);
        cr_assert_eq(cfxCommCount(comms[i], &count), cfxSuccess);
        cr_assert_eq(cfxCommCuDevice(comms[i], &device), cfxSuccess);
        cr_assert_eq(rank, i);
        cr_assert_eq(count, *n);
        cr_assert_eq(device, -1);
    }
    for (int i = 0; i < *n; i++)
        cr_assert_eq(cfxCommDestroy(comms[i]), cfxSuccess);
}

Test(init_all, devlist_without_gpu_is_refused_with_a_sentence, .timeout = 60)
{
    cfxComm_t comms[2];
    int devlist[2] = {0, 1};
    cfxResult_t res = cfxCommInitAll(comms, 2, devlist);
    if (res == cfxSuccess) {
        cfxCommDestroy(comms[0]);
        cfxCommDestroy(comms[1]);
        cr_skip_test("this machine has usable GPUs: the refusal cannot be shown here");
    }
    cr_assert_eq(res, cfxInvalidArgument);
    cr_assert(strstr(cfxGetLastError(NULL), "CUDA device") != NULL, "sentence: %s",
              cfxGetLastError(NULL));
}

/* ---------------------------------------------------- plans ranks agree on */

/* Each rank plans from its own host's topology. Here they differ: rank 0's
 * host has a network port (so it plans, and would take the direct allreduce
 * for small sizes, whose connectors are built at init), the others' have
 * none (no plan across hosts: the ring). Without agreement rank 0 waited at
 * init for connectors the others never built. Now every rank sees the
 * difference and uses the ring, and the allreduce is exact. */
static char g_bare_topo[64];

static void claim_host_and_topology(struct cfx_test_rank *ctx)
{
    char host[32], src[1024], path[1100];
    snprintf(host, sizeof(host), "plan-agree-host-%d", ctx->rank);
    cfx_test_setenv("CFX_HOSTID", host);
    snprintf(src, sizeof(src), "%s", __FILE__);
    char *slash = strrchr(src, '/');
    if (slash)
        *slash = '\0';
    snprintf(path, sizeof(path), "%s/topo/cpu-2socket.xml", src);
    cfx_test_setenv("CFX_TOPO_FILE", ctx->rank == 0 ? path : g_bare_topo);
}

static void allreduce_across_disagreeing_plans(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    cfx_test_step(ctx, "init with a topology unlike the other ranks'");
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    float in[8], out[8];
    for (int i = 0; i < 8; i++)
        in[i] = (float)(ctx->rank + 1 + i);
    cfx_test_step(ctx, "small allreduce");
    RANK_CFX(ctx, cfxAllReduce(in, out, 8, cfxFloat32, cfxSum, comm, NULL));
    int n = ctx->nranks;
    for (int i = 0; i < 8; i++)
        RANK_ASSERT(ctx, out[i] == (float)(n * (n + 1) / 2 + n * i), "out[%d] = %g", i,
                    (double)out[i]);
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(plan_agreement, ranks_whose_topologies_differ_all_use_the_ring, .timeout = 60)
{
    snprintf(g_bare_topo, sizeof(g_bare_topo), "/tmp/cfx-bare-topo-XXXXXX");
    int fd = mkstemp(g_bare_topo);
    cr_assert(fd >= 0);
    const char *xml = "<system version=\"1\">\n"
                      "  <cpu numaid=\"0\" affinity=\"ffffffff\" arch=\"x86_64\" "
                      "vendor=\"AuthenticAMD\" familyid=\"25\" modelid=\"1\"/>\n"
                      "</system>\n";
    cr_assert_eq(write(fd, xml, strlen(xml)), (ssize_t)strlen(xml));
    close(fd);
    struct cfx_test_options opts = {.nranks = 3,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 30,
                                    .before_rank = claim_host_and_topology};
    CFX_TEST_RUN(&opts, allreduce_across_disagreeing_plans);
    unlink(g_bare_topo);
}

/* ------------------------------------------- two jobs on one CFX_COMM_ID */

#define JOB_RANKS 4

/* Ranks 0-3 of the run are job 0, ranks 4-7 job 1; both jobs start at once
 * with one CFX_COMM_ID (two launchers given one port). Each rank either
 * fails with a sentence that names CFX_COMM_ID, or succeeds with the sum of
 * its own job: never a seat in the other job. */
static void job_of_two_on_one_comm_id(struct cfx_test_rank *ctx)
{
    int job = ctx->rank / JOB_RANKS, job_rank = ctx->rank % JOB_RANKS;
    cfxComm_t comm = NULL;
    cfx_test_step(ctx, "job %d rank %d: cfxCommInitRank", job, job_rank);
    cfxResult_t res = cfxCommInitRank(&comm, JOB_RANKS, ctx->id, job_rank);
    if (res != cfxSuccess) {
        RANK_ASSERT(ctx, strstr(cfxGetLastError(NULL), "CFX_COMM_ID") != NULL,
                    "job %d rank %d: init failed (%s) without naming CFX_COMM_ID: %s", job,
                    job_rank, cfxGetErrorString(res), cfxGetLastError(NULL));
        return;
    }
    int mine = job * 100 + job_rank, sum = -1;
    cfx_test_step(ctx, "job %d rank %d: allreduce", job, job_rank);
    res = cfxAllReduce(&mine, &sum, 1, cfxInt32, cfxSum, comm, NULL);
    if (res == cfxSuccess)
        res = cfxCommFinalize(comm);
    cfxCommDestroy(comm);
    /* A peer of a refused job may fail after init; success must be right. */
    RANK_ASSERT(ctx, res != cfxSuccess || sum == job * 100 * JOB_RANKS + 6,
                "job %d rank %d: allreduce returned success with %d where %d was due: a rank "
                "of the other job took a seat in this one",
                job, job_rank, sum, job * 100 * JOB_RANKS + 6);
}

Test(comm_id, two_jobs_on_one_comm_id_never_share_a_communicator, .timeout = 180)
{
    cfx_test_setenv("CFX_BOOTSTRAP_TIMEOUT", "3");
    /* Several rounds: which job's ranks reach the root first is a race. */
    for (int round = 0; round < 4; round++) {
        char addr[64];
        /* Below the ephemeral range (32768 up), as in comm_id_run. */
        snprintf(addr, sizeof(addr), "127.0.0.1:%d",
                 20000 + (int)((getpid() * 7 + round * 13) % 12000));
        cfx_test_setenv("CFX_COMM_ID", addr);
        struct cfx_test_options opts = {.nranks = 2 * JOB_RANKS,
                                        .mode = CFX_TEST_PROCS,
                                        .id_mode = CFX_TEST_ID_ENV,
                                        .deadline_s = 30};
        CFX_TEST_RUN(&opts, job_of_two_on_one_comm_id);
    }
}
