/*
 * What Conflux does when the bytes between ranks go wrong, shown with the
 * fault-injecting transport (CFX_FAULT, transports/faulty/): a dropped slot
 * is a cfxTimeout naming the sender, a short slot an internal error naming
 * it, an altered fingerprint a mismatch (cfxInvalidUsage), a closed
 * connection a cfxRemoteError on both sides, a late slot nothing at all.
 * Each runs over shm and sockets, with ranks as processes and as threads.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/harness.h"
#include "transports/faulty/faulty.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ----------------------------------------------------------- the syntax */

Test(faulty_spec, parses_every_kind_and_option)
{
    struct cfx_fault_spec spec;
    char why[256];
    cfxResult_t res =
        cfx_fault_spec_parse("drop:rank=1:after=3,delay:ms=20:count=2,truncate:peer=2:keep=10,"
                             "corrupt:what=print,close:rank=0:after_bytes=1M",
                             &spec, why, sizeof(why));
    cr_assert_eq(res, cfxSuccess, "%s", why);
    cr_assert_eq(spec.n_rules, 5);
    cr_assert(spec.rules[0].kind == CFX_FAULT_DROP && spec.rules[0].rank == 1 &&
              spec.rules[0].peer == -1 && spec.rules[0].after == 3 && spec.rules[0].count == 1);
    cr_assert(spec.rules[1].kind == CFX_FAULT_DELAY && spec.rules[1].ms == 20 &&
              spec.rules[1].count == 2 && spec.rules[1].rank == -1);
    cr_assert(spec.rules[2].kind == CFX_FAULT_TRUNCATE && spec.rules[2].peer == 2 &&
              spec.rules[2].keep == 10);
    cr_assert(spec.rules[3].kind == CFX_FAULT_CORRUPT && spec.rules[3].what == CFX_FAULT_PRINT);
    cr_assert(spec.rules[4].kind == CFX_FAULT_CLOSE && spec.rules[4].rank == 0 &&
              spec.rules[4].after_bytes == 1u << 20);
}

Test(faulty_spec, defaults_delay_every_slot_and_hit_others_once)
{
    struct cfx_fault_spec spec;
    char why[256];
    cr_assert_eq(cfx_fault_spec_parse("delay,truncate", &spec, why, sizeof(why)), cfxSuccess);
    cr_assert(spec.rules[0].count == 0 && spec.rules[0].ms == 100);
    cr_assert(spec.rules[1].count == 1 && spec.rules[1].keep == -1);
    cr_assert_eq(cfx_fault_spec_parse("", &spec, why, sizeof(why)), cfxSuccess);
    cr_assert_eq(spec.n_rules, 0);
}

Test(faulty_spec, parses_kill_moments)
{
    struct cfx_fault_spec spec;
    char why[256];
    cr_assert_eq(cfx_fault_spec_parse("kill:rank=2:at=setup,kill:at=connect,kill:after=9", &spec,
                                      why, sizeof(why)),
                 cfxSuccess, "%s", why);
    cr_assert(spec.rules[0].kind == CFX_FAULT_KILL && spec.rules[0].at == CFX_FAULT_AT_SETUP &&
              spec.rules[0].rank == 2);
    cr_assert(spec.rules[1].at == CFX_FAULT_AT_CONNECT && spec.rules[2].at == CFX_FAULT_AT_DATA &&
              spec.rules[2].after == 9);
}

static const char *bad_specs[] = {
    "explode",
    "drop:rank",
    "drop:rank=x",
    "drop:rank=-1",
    "drop:ms=3",
    "delay:what=print",
    "corrupt:what=both",
    "drop,",
    "drop:after=99999999999999999999",
    "drop:bogus=1",
    "truncate:keep=1T",
    ",drop",
    "drop:",
    "drop:rank=4294967296",
    "delay:ms=4G",
    "kill:at=later",
    "drop:at=setup",
    "drop,drop,drop,drop,drop,drop,drop,drop,drop",
};

#define N_BAD_SPECS (sizeof(bad_specs) / sizeof(bad_specs[0]))
static int bad_spec_index[N_BAD_SPECS];

/* Parameters are indices: the worker processes see other addresses. */
ParameterizedTestParameters(faulty_spec, refuses_malformed_text_with_a_sentence)
{
    for (size_t i = 0; i < N_BAD_SPECS; i++)
        bad_spec_index[i] = (int)i;
    return cr_make_param_array(int, bad_spec_index, N_BAD_SPECS);
}

ParameterizedTest(int *index, faulty_spec, refuses_malformed_text_with_a_sentence)
{
    const char *text = bad_specs[*index];
    struct cfx_fault_spec spec;
    char why[256];
    cr_log_info("CFX_FAULT=%s", text);
    cr_assert_eq(cfx_fault_spec_parse(text, &spec, why, sizeof(why)), cfxInvalidArgument,
                 "accepted \"%s\"", text);
    cr_assert(strlen(why) > 10, "no sentence for \"%s\"", text);
}

/* A bad CFX_FAULT fails init with the parser's sentence, on every rank. */
static void init_with_bad_spec(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    cfx_test_step(ctx, "cfxCommInitRank with CFX_FAULT=explode");
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    RANK_ASSERT(ctx, res == cfxInvalidArgument, "init returned %s", cfxGetErrorString(res));
    RANK_ASSERT(ctx,
                strstr(cfxGetLastError(NULL), "CFX_FAULT") != NULL &&
                    strstr(cfxGetLastError(NULL), "explode") != NULL,
                "sentence: %s", cfxGetLastError(NULL));
}

Test(faulty_spec, malformed_spec_fails_init_with_invalid_argument, .timeout = 60)
{
    cfx_test_setenv("CFX_FAULT", "explode");
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 30};
    CFX_TEST_RUN(&opts, init_with_bad_spec);
}

/* ----------------------------------------------------- the behaviours */

/* Each case runs over one transport with ranks as processes or threads. */
struct fault_case {
    int socket;
    enum cfx_test_mode mode;
};

static struct fault_case fault_cases[] = {
    {0, CFX_TEST_PROCS}, {1, CFX_TEST_PROCS}, {0, CFX_TEST_THREADS}, {1, CFX_TEST_THREADS}};
#define N_FAULT_CASES ((size_t)(sizeof(fault_cases) / sizeof(fault_cases[0])))

static void use_case(const struct fault_case *fc, const char *fault, const char *timeout)
{
    cr_log_info("over %s, ranks as %s, CFX_FAULT=%s", fc->socket ? "socket" : "shm",
                fc->mode == CFX_TEST_PROCS ? "processes" : "threads", fault);
    cfx_test_setenv("CFX_SHM_DISABLE", fc->socket ? "1" : NULL);
    cfx_test_setenv("CFX_TIMEOUT", timeout);
    cfx_test_setenv("CFX_FAULT", fault);
}

#define FAULT_TEST(name)                                                                           \
    ParameterizedTestParameters(faulty, name)                                                      \
    {                                                                                              \
        return cr_make_param_array(struct fault_case, fault_cases, N_FAULT_CASES);                 \
    }                                                                                              \
    ParameterizedTest(struct fault_case *fc, faulty, name, .timeout = 120)

/* Fill rank r's input so a sum is exact and says who sent what. */
static void fill(int32_t *buf, size_t count, int rank)
{
    for (size_t i = 0; i < count; i++)
        buf[i] = (int32_t)((i % 1000) + 1000 * (size_t)(rank + 1));
}

static int32_t expected_sum(size_t i, int nranks)
{
    int32_t sum = 0;
    for (int r = 0; r < nranks; r++)
        sum += (int32_t)((i % 1000) + 1000 * (size_t)(r + 1));
    return sum;
}

/* Every collective, through the wrapper, checked element by element. */
static void every_collective_exact(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    int n = ctx->nranks;
    size_t count = (1u << 18) + 3; /* Several slots per step. */
    int32_t *in = malloc(count * sizeof(int32_t) * (size_t)n);
    int32_t *out = malloc(count * sizeof(int32_t) * (size_t)n);
    RANK_ASSERT(ctx, in && out, "malloc");
    fill(in, count * (size_t)n, ctx->rank);
    RANK_CFX(ctx, cfxAllReduce(in, out, count, cfxInt32, cfxSum, comm, NULL));
    for (size_t i = 0; i < count; i++)
        RANK_ASSERT(ctx, out[i] == expected_sum(i, n), "allreduce[%zu] = %d", i, out[i]);
    RANK_CFX(ctx, cfxBroadcast(in, out, count, cfxInt32, n - 1, comm, NULL));
    for (size_t i = 0; i < count; i++)
        RANK_ASSERT(ctx, out[i] == (int32_t)((i % 1000) + 1000 * (size_t)n), "broadcast[%zu] = %d",
                    i, out[i]);
    RANK_CFX(ctx, cfxAllGather(in, out, count, cfxInt32, comm, NULL));
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i += 997)
            RANK_ASSERT(
                ctx, out[(size_t)r * count + i] == (int32_t)((i % 1000) + 1000 * (size_t)(r + 1)),
                "allgather block %d [%zu] = %d", r, i, out[(size_t)r * count + i]);
    RANK_CFX(ctx, cfxReduceScatter(in, out, count, cfxInt32, cfxSum, comm, NULL));
    for (size_t i = 0; i < count; i++)
        RANK_ASSERT(ctx, out[i] == expected_sum((size_t)ctx->rank * count + i, n),
                    "reducescatter[%zu] = %d", i, out[i]);
    int peer_to = (ctx->rank + 1) % n, peer_from = (ctx->rank + n - 1) % n;
    RANK_CFX(ctx, cfxGroupStart());
    RANK_CFX(ctx, cfxSend(in, count, cfxInt32, peer_to, comm, NULL));
    RANK_CFX(ctx, cfxRecv(out, count, cfxInt32, peer_from, comm, NULL));
    RANK_CFX(ctx, cfxGroupEnd());
    for (size_t i = 0; i < count; i++)
        RANK_ASSERT(ctx, out[i] == (int32_t)((i % 1000) + 1000 * (size_t)(peer_from + 1)),
                    "recv[%zu] = %d", i, out[i]);
    RANK_CFX(ctx, cfxCommFinalize(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
    free(in);
    free(out);
}

/* A rule that never fires: the wrapper alone changes nothing. */
FAULT_TEST(rule_for_another_rank_changes_nothing)
{
    use_case(fc, "drop:rank=99", "30");
    struct cfx_test_options opts = {.nranks = 3, .mode = fc->mode, .deadline_s = 90};
    CFX_TEST_RUN(&opts, every_collective_exact);
}

/* Late slots are still the right slots. */
FAULT_TEST(delayed_slots_keep_every_result_exact)
{
    use_case(fc, "delay:ms=2:count=20,delay:rank=1:after=20:ms=50:count=2", "30");
    struct cfx_test_options opts = {.nranks = 3, .mode = fc->mode, .deadline_s = 90};
    CFX_TEST_RUN(&opts, every_collective_exact);
}

/* Rank 0 sends one slot to rank 1, which never gets it. */
static void dropped_message(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    int32_t data[256];
    fill(data, 256, ctx->rank);
    if (ctx->rank == 0) {
        RANK_CFX(ctx, cfxSend(data, 256, cfxInt32, 1, comm, NULL));
        /* Stay: a sender that leaves is a remote error, not a lost slot. */
        cfx_test_step(ctx, "rank 0 keeps its communicator while rank 1 waits");
        usleep(3000 * 1000);
    } else {
        cfx_test_step(ctx, "cfxRecv of a slot that is dropped");
        double start = now_s();
        cfxResult_t res = cfxRecv(data, 256, cfxInt32, 0, comm, NULL);
        double took = now_s() - start;
        RANK_ASSERT(ctx, res == cfxTimeout, "recv returned %s: %s", cfxGetErrorString(res),
                    cfxGetLastError(comm));
        RANK_ASSERT(ctx, took < 1 + 2.5, "the timeout took %.1f s with CFX_TIMEOUT=1", took);
        RANK_ASSERT(ctx, strstr(cfxGetLastError(comm), "waiting for data from rank 0") != NULL,
                    "the sentence does not name the sender: %s", cfxGetLastError(comm));
    }
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

FAULT_TEST(dropped_slot_is_a_timeout_naming_the_sender)
{
    use_case(fc, "drop:rank=1:peer=0", "1");
    struct cfx_test_options opts = {.nranks = 2, .mode = fc->mode, .deadline_s = 30};
    CFX_TEST_RUN(&opts, dropped_message);
}

/* What each rank of a 3-rank allreduce must see when rank 1's input breaks. */
struct expect {
    cfxResult_t rank1;      /* Rank 1's result. */
    const char *rank1_text; /* In rank 1's sentence. */
    cfxResult_t others;     /* The others' result; cfxSuccess: any failure. */
    int others_may_succeed; /* The fault need not reach the others. */
    double within_s;        /* Every rank returns within this. */
    double linger_s;        /* Ranks keep their communicator this long after the call. */
    size_t count;
};

static struct expect g_expect;

static void broken_allreduce(struct cfx_test_rank *ctx)
{
    const struct expect *e = &g_expect;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    int32_t *in = malloc(e->count * sizeof(int32_t)), *out = malloc(e->count * sizeof(int32_t));
    RANK_ASSERT(ctx, in && out, "malloc");
    fill(in, e->count, ctx->rank);
    cfx_test_step(ctx, "allreduce that rank 1's fault breaks");
    double start = now_s();
    cfxResult_t res = cfxAllReduce(in, out, e->count, cfxInt32, cfxSum, comm, NULL);
    double took = now_s() - start;
    const char *text = cfxGetLastError(comm);
    if (ctx->rank == 1) {
        RANK_ASSERT(ctx, res == e->rank1, "rank 1 got %s, expected %s: %s", cfxGetErrorString(res),
                    cfxGetErrorString(e->rank1), text);
        RANK_ASSERT(ctx, strstr(text, e->rank1_text) != NULL, "rank 1's sentence lacks \"%s\": %s",
                    e->rank1_text, text);
    } else if (e->others_may_succeed) {
        cfx_test_step(ctx, "rank %d returned %s", ctx->rank, cfxGetErrorString(res));
    } else if (e->others != cfxSuccess) {
        RANK_ASSERT(ctx, res == e->others, "rank %d got %s, expected %s: %s", ctx->rank,
                    cfxGetErrorString(res), cfxGetErrorString(e->others), text);
    } else {
        RANK_ASSERT(ctx, res != cfxSuccess, "rank %d succeeded though rank 1 failed", ctx->rank);
    }
    RANK_ASSERT(ctx, took < e->within_s, "rank %d returned after %.1f s (limit %.1f s)", ctx->rank,
                took, e->within_s);
    cfxResult_t async;
    RANK_CFX(ctx, cfxCommGetAsyncError(comm, &async));
    RANK_ASSERT(ctx, async == res, "async error %s, call returned %s", cfxGetErrorString(async),
                cfxGetErrorString(res));
    if (e->linger_s > took)
        usleep((useconds_t)((e->linger_s - took) * 1e6));
    RANK_CFX(ctx, cfxCommDestroy(comm));
    free(in);
    free(out);
}

static void run_broken(const struct fault_case *fc, struct expect e)
{
    g_expect = e;
    struct cfx_test_options opts = {.nranks = 3, .mode = fc->mode, .deadline_s = 60};
    CFX_TEST_RUN(&opts, broken_allreduce);
}

/* Slots carry their number on the connector, so the slot after the lost one
 * is refused at once by rank 1, naming the sender (without the number it
 * would take it in the lost one's place and time out later, results
 * wrong). The others may finish: rank 1 sent everything before its last
 * receive. */
FAULT_TEST(dropped_slot_in_allreduce_is_seen_at_once_by_the_rank_that_misses_it)
{
    use_case(fc, "drop:rank=1:after=1", "30");
    run_broken(fc, (struct expect){.rank1 = cfxInternalError,
                                   .rank1_text = "from rank 0 arrived where slot",
                                   .others_may_succeed = 1,
                                   .within_s = 4,
                                   .linger_s = 3.5,
                                   .count = 1536});
}

/* A short slot: rank 1's schedule notices the size and names the sender. */
FAULT_TEST(truncated_slot_is_an_internal_error_naming_the_sender)
{
    use_case(fc, "truncate:rank=1:after=1", "5");
    run_broken(fc, (struct expect){.rank1 = cfxInternalError,
                                   .rank1_text = "from rank 0 where the schedule expects",
                                   .within_s = 4,
                                   .count = 1536});
}

/* An altered fingerprint reads as another operation: a mismatch. */
FAULT_TEST(corrupt_fingerprint_is_invalid_usage_on_every_rank)
{
    use_case(fc, "corrupt:rank=1:after=1:what=print", "5");
    run_broken(fc, (struct expect){.rank1 = cfxInvalidUsage,
                                   .rank1_text = "mismatched",
                                   .others = cfxInvalidUsage,
                                   .within_s = 4,
                                   .count = 1536});
}

/* Rank 1 closes the connection from rank 0 mid-allreduce (after 1 MiB). */
FAULT_TEST(closed_connection_is_a_remote_error_on_every_rank)
{
    use_case(fc, "close:rank=1:after_bytes=1M", "10");
    run_broken(fc, (struct expect){.rank1 = cfxRemoteError,
                                   .rank1_text = "fault injection",
                                   .others = cfxRemoteError,
                                   .within_s = 6,
                                   .count = 4u << 20});
}

/* A flipped payload byte is not detected: Conflux has no payload checksum
 * (the fingerprint covers the operation, not the data). */
static void corrupted_message(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    uint8_t data[4096];
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 7);
    if (ctx->rank == 0) {
        RANK_CFX(ctx, cfxSend(data, sizeof(data), cfxUint8, 1, comm, NULL));
    } else {
        uint8_t got[4096];
        RANK_CFX(ctx, cfxRecv(got, sizeof(got), cfxUint8, 0, comm, NULL));
        int differ = 0;
        for (size_t i = 0; i < sizeof(got); i++)
            differ += got[i] != data[i];
        unsigned flipped = (data[100] ^ 0xffu) & 0xffu;
        RANK_ASSERT(ctx, differ == 1 && got[100] == flipped,
                    "%d bytes differ; byte 100 is 0x%02x, sent 0x%02x", differ, got[100],
                    data[100]);
    }
    RANK_CFX(ctx, cfxCommFinalize(comm));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

FAULT_TEST(corrupt_payload_arrives_silently)
{
    use_case(fc, "corrupt:rank=1:offset=100", "10");
    struct cfx_test_options opts = {.nranks = 2, .mode = fc->mode, .deadline_s = 30};
    CFX_TEST_RUN(&opts, corrupted_message);
}
