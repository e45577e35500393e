/*
 * The rest of NCCL's API: cfxAlltoAll, cfxGather and cfxScatter on 1-4 ranks
 * (processes and threads, shm and sockets, every type, counts 0 and odd,
 * every root, in place), PreMulSum reductions against a reference,
 * cfxMemAlloc and the registration calls, and every bad argument's result
 * and sentence.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/coll_check.h"
#include "tests/harness.h"

#define ASSERT_SENTENCE(comm, word)                                                                \
    cr_assert(strstr(cfxGetLastError(comm), (word)) != NULL,                                       \
              "cfxGetLastError does not mention \"%s\": \"%s\"", (word), cfxGetLastError(comm))

enum transport { SHM, SOCKET };

struct api_case {
    enum transport transport;
    int nranks;
    enum cfx_test_mode mode;
};

static cfxComm_t solo(void)
{
    cfxComm_t comm;
    cr_assert_eq(cfxCommInitAll(&comm, 1, NULL), cfxSuccess, "%s", cfxGetLastError(NULL));
    return comm;
}

/* The byte at @p i of the block rank @p from sends to rank @p to. */
static unsigned char block_byte(int from, int to, size_t i, int seed)
{
    uint64_t h = (uint64_t)from * 2654435761u + (uint64_t)to * 40503u + i * 97u + (uint64_t)seed;
    return (unsigned char)(h ^ (h >> 11));
}

static void fill_block(char *p, int from, int to, size_t bytes, int seed)
{
    for (size_t i = 0; i < bytes; i++)
        p[i] = (char)block_byte(from, to, i, seed);
}

/* The first wrong byte of a block, or -1. */
static long check_block(const char *p, int from, int to, size_t bytes, int seed)
{
    for (size_t i = 0; i < bytes; i++)
        if ((unsigned char)p[i] != block_byte(from, to, i, seed))
            return (long)i;
    return -1;
}

static const size_t counts[] = {0, 1, 7, 1001};
#define N_COUNTS (sizeof(counts) / sizeof(counts[0]))

/* One alltoall, gather (root), scatter (root) of every type and count. */
static void moves_rank(struct cfx_test_rank *ctx)
{
    int n = ctx->nranks, r = ctx->rank;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, n, ctx->id, r));
    size_t max_block = counts[N_COUNTS - 1] * 8;
    char *send = malloc(max_block * (size_t)n), *recv = malloc(max_block * (size_t)n);
    RANK_ASSERT(ctx, send && recv, "out of memory");
    int seed = 0;
    for (int t = 0; t < cfxNumTypes; t++)
        for (size_t c = 0; c < N_COUNTS; c++) {
            size_t count = counts[c], block = count * ref_size((cfxDataType_t)t);
            seed++;
            /* Alltoall: block j of this rank goes to rank j. */
            for (int j = 0; j < n; j++)
                fill_block(send + (size_t)j * block, r, j, block, seed);
            memset(recv, 0xee, block * (size_t)n);
            cfx_test_step(ctx, "alltoall type %d count %zu", t, count);
            RANK_CFX(ctx, cfxAlltoAll(send, recv, count, (cfxDataType_t)t, comm, NULL));
            for (int i = 0; i < n; i++) {
                long bad = check_block(recv + (size_t)i * block, i, r, block, seed);
                RANK_ASSERT(ctx, bad < 0,
                            "alltoall type %d count %zu: block from rank %d wrong at byte %ld", t,
                            count, i, bad);
            }
            for (int root = 0; root < n; root++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    seed++;
                    /* Gather: in place, the root's block already sits in recvbuff. */
                    char *gsend = in_place && r == root ? recv + (size_t)root * block : send;
                    memset(recv, 0xee, block * (size_t)n);
                    fill_block(gsend, r, root, block, seed);
                    cfx_test_step(ctx, "gather type %d count %zu root %d%s", t, count, root,
                                  in_place ? " in place" : "");
                    RANK_CFX(ctx,
                             cfxGather(gsend, recv, count, (cfxDataType_t)t, root, comm, NULL));
                    for (int i = 0; r == root && i < n; i++) {
                        long bad = check_block(recv + (size_t)i * block, i, root, block, seed);
                        RANK_ASSERT(ctx, bad < 0,
                                    "gather type %d count %zu root %d%s: block of rank %d wrong "
                                    "at byte %ld",
                                    t, count, root, in_place ? " in place" : "", i, bad);
                    }
                    /* Scatter: in place, the root receives into its own block of sendbuff. */
                    seed++;
                    for (int j = 0; r == root && j < n; j++)
                        fill_block(send + (size_t)j * block, root, j, block, seed);
                    char *srecv = in_place && r == root ? send + (size_t)root * block : recv;
                    if (srecv == recv)
                        memset(recv, 0xee, block);
                    cfx_test_step(ctx, "scatter type %d count %zu root %d%s", t, count, root,
                                  in_place ? " in place" : "");
                    RANK_CFX(ctx,
                             cfxScatter(send, srecv, count, (cfxDataType_t)t, root, comm, NULL));
                    long bad = check_block(srecv, root, r, block, seed);
                    RANK_ASSERT(ctx, bad < 0,
                                "scatter type %d count %zu root %d%s: wrong at byte %ld", t, count,
                                root, in_place ? " in place" : "", bad);
                }
        }
    /* Inside a group, two alltoalls run together. */
    size_t count = 33, block = count * 4;
    char *send2 = malloc(block * (size_t)n), *recv2 = malloc(block * (size_t)n);
    RANK_ASSERT(ctx, send2 && recv2, "out of memory");
    for (int j = 0; j < n; j++) {
        fill_block(send + (size_t)j * block, r, j, block, 1001);
        fill_block(send2 + (size_t)j * block, r, j, block, 1002);
    }
    cfx_test_step(ctx, "two alltoalls in a group");
    RANK_CFX(ctx, cfxGroupStart());
    RANK_CFX(ctx, cfxAlltoAll(send, recv, count, cfxFloat32, comm, NULL));
    RANK_CFX(ctx, cfxAlltoAll(send2, recv2, count, cfxFloat32, comm, NULL));
    RANK_CFX(ctx, cfxGroupEnd());
    for (int i = 0; i < n; i++) {
        RANK_ASSERT(ctx, check_block(recv + (size_t)i * block, i, r, block, 1001) < 0,
                    "grouped alltoall 1: block from rank %d wrong", i);
        RANK_ASSERT(ctx, check_block(recv2 + (size_t)i * block, i, r, block, 1002) < 0,
                    "grouped alltoall 2: block from rank %d wrong", i);
    }
    free(send2);
    free(recv2);
    free(send);
    free(recv);
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

static struct api_case all_cases[16];

static int make_cases(void)
{
    int k = 0;
    for (int t = 0; t < 2; t++)
        for (int n = 1; n <= 4; n++)
            for (int m = 0; m < 2; m++)
                all_cases[k++] = (struct api_case){(enum transport)t, n, (enum cfx_test_mode)m};
    return k;
}

ParameterizedTestParameters(alltoall_gather_scatter, every_type_count_root_and_in_place)
{
    return cr_make_param_array(struct api_case, all_cases, (size_t)make_cases());
}

ParameterizedTest(struct api_case *ac, alltoall_gather_scatter, every_type_count_root_and_in_place,
                  .timeout = 600)
{
    cr_log_info("%d ranks as %s over %s", ac->nranks,
                ac->mode == CFX_TEST_PROCS ? "processes" : "threads",
                ac->transport == SHM ? "shm" : "socket");
    cfx_test_setenv("CFX_SHM_DISABLE", ac->transport == SOCKET ? "1" : NULL);
    struct cfx_test_options opts = {
        .nranks = ac->nranks, .mode = ac->mode, .deadline_s = 300, .arg = ac};
    CFX_TEST_RUN(&opts, moves_rank);
}

/* ------------------------------------------------------------ PreMulSum */

/* Rank r's input at element i: small integers, exact in every type. */
static int64_t premul_input(cfxDataType_t t, int rank, size_t i)
{
    int64_t v = (int64_t)((rank * 7 + i * 3) % 5);
    return ref_is_signed(t) ? v - 2 : v;
}

/* The scalar of each type: 3 for integers (products wrap exactly), 0.5 for
 * floats (exact too: the tolerance covers Conflux multiplying the sum). */
static void premul_scalar(cfxDataType_t t, void *out)
{
    ref_store(t, out, ref_is_float(t) ? 0.5 : 3.0, 3);
}

/* Whether got is scalar * (sum of the inputs) of element i. */
static int premul_matches(cfxDataType_t t, int nranks, size_t i, const void *got)
{
    int64_t sum = 0;
    for (int r = 0; r < nranks; r++)
        sum += premul_input(t, r, i);
    if (ref_is_float(t)) {
        double want = 0.5 * (double)sum, have = ref_load_float(t, got);
        double tol = t == cfxFloat8e4m3 || t == cfxFloat8e5m2 ? 0.25 : 1e-3;
        return fabs(have - want) <= tol * (1 + fabs(want));
    }
    uint64_t want = (uint64_t)sum * 3u,
             mask = ref_size(t) == 8 ? ~0ull : (1ull << (8 * ref_size(t))) - 1;
    return (ref_load_bits(t, got) & mask) == (want & mask);
}

static void premul_rank(struct cfx_test_rank *ctx)
{
    int n = ctx->nranks, r = ctx->rank;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, n, ctx->id, r));
    enum { COUNT = 515 };
    char *in = malloc(COUNT * 8 * 4), *out = malloc(COUNT * 8 * 4);
    RANK_ASSERT(ctx, in && out, "out of memory");
    for (int t = 0; t < cfxNumTypes; t++) {
        cfxDataType_t type = (cfxDataType_t)t;
        size_t es = ref_size(type);
        char scalar[8];
        premul_scalar(type, scalar);
        cfxRedOp_t op;
        RANK_CFX(ctx, cfxRedOpCreatePreMulSum(&op, scalar, type, cfxScalarHostImmediate, comm));
        RANK_ASSERT(ctx, op >= cfxNumOps, "op %d is below cfxNumOps", (int)op);
        memset(scalar, 0, sizeof(scalar)); /* Read at creation, not later. */
        /* Allreduce, out of place and in place. */
        for (int in_place = 0; in_place < 2; in_place++) {
            for (size_t i = 0; i < COUNT; i++) {
                int64_t v = premul_input(type, r, i);
                ref_store(type, in + i * es, (double)v, (uint64_t)v);
            }
            char *dst = in_place ? in : out;
            cfx_test_step(ctx, "premulsum allreduce type %d%s", t, in_place ? " in place" : "");
            RANK_CFX(ctx, cfxAllReduce(in, dst, COUNT, type, op, comm, NULL));
            for (size_t i = 0; i < COUNT; i++)
                RANK_ASSERT(ctx, premul_matches(type, n, i, dst + i * es),
                            "premulsum allreduce type %d%s: element %zu wrong", t,
                            in_place ? " in place" : "", i);
        }
        /* Reduce to every root. */
        for (int root = 0; root < n; root++) {
            for (size_t i = 0; i < COUNT; i++) {
                int64_t v = premul_input(type, r, i);
                ref_store(type, in + i * es, (double)v, (uint64_t)v);
            }
            cfx_test_step(ctx, "premulsum reduce type %d root %d", t, root);
            RANK_CFX(ctx, cfxReduce(in, out, COUNT, type, op, root, comm, NULL));
            for (size_t i = 0; r == root && i < COUNT; i++)
                RANK_ASSERT(ctx, premul_matches(type, n, i, out + i * es),
                            "premulsum reduce type %d root %d: element %zu wrong", t, root, i);
        }
        /* Reduce-scatter: rank r gets elements [r*COUNT, (r+1)*COUNT) of the sum. */
        for (size_t i = 0; i < COUNT * (size_t)n; i++) {
            int64_t v = premul_input(type, r, i);
            ref_store(type, in + i * es, (double)v, (uint64_t)v);
        }
        cfx_test_step(ctx, "premulsum reducescatter type %d", t);
        RANK_CFX(ctx, cfxReduceScatter(in, out, COUNT, type, op, comm, NULL));
        for (size_t i = 0; i < COUNT; i++)
            RANK_ASSERT(ctx, premul_matches(type, n, (size_t)r * COUNT + i, out + i * es),
                        "premulsum reducescatter type %d: element %zu wrong", t, i);
        RANK_CFX(ctx, cfxRedOpDestroy(op, comm));
        /* A destroyed op is refused. */
        RANK_ASSERT(ctx, cfxAllReduce(in, out, 1, type, op, comm, NULL) == cfxInvalidArgument,
                    "a destroyed op was accepted");
    }
    free(in);
    free(out);
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

ParameterizedTestParameters(premulsum, every_type_in_allreduce_reduce_and_reducescatter)
{
    return cr_make_param_array(struct api_case, all_cases, (size_t)make_cases());
}

ParameterizedTest(struct api_case *ac, premulsum, every_type_in_allreduce_reduce_and_reducescatter,
                  .timeout = 600)
{
    cr_log_info("%d ranks as %s over %s", ac->nranks,
                ac->mode == CFX_TEST_PROCS ? "processes" : "threads",
                ac->transport == SHM ? "shm" : "socket");
    cfx_test_setenv("CFX_SHM_DISABLE", ac->transport == SOCKET ? "1" : NULL);
    struct cfx_test_options opts = {
        .nranks = ac->nranks, .mode = ac->mode, .deadline_s = 300, .arg = ac};
    CFX_TEST_RUN(&opts, premul_rank);
}

Test(premulsum, bad_arguments_are_invalid_arguments_with_a_sentence)
{
    cfxComm_t comm = solo();
    float two = 2, x[4] = {1, 2, 3, 4}, y[4];
    cfxRedOp_t op;
    cr_assert_eq(cfxRedOpCreatePreMulSum(NULL, &two, cfxFloat32, cfxScalarHostImmediate, comm),
                 cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "op is NULL");
    cr_assert_eq(cfxRedOpCreatePreMulSum(&op, NULL, cfxFloat32, cfxScalarHostImmediate, comm),
                 cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "scalar is NULL");
    cr_assert_eq(
        cfxRedOpCreatePreMulSum(&op, &two, (cfxDataType_t)12, cfxScalarHostImmediate, comm),
        cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "datatype 12");
    cr_assert_eq(cfxRedOpCreatePreMulSum(&op, &two, cfxFloat32, cfxScalarDevice, comm),
                 cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "cfxScalarDevice");
    cr_assert_eq(cfxRedOpCreatePreMulSum(&op, &two, cfxFloat32, (cfxScalarResidence_t)7, comm),
                 cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "residence 7");
    cr_assert_eq(cfxRedOpCreatePreMulSum(&op, &two, cfxFloat32, cfxScalarHostImmediate, NULL),
                 cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "comm is NULL");
    /* One rank: the result is the input times the scalar. */
    cr_assert_eq(cfxRedOpCreatePreMulSum(&op, &two, cfxFloat32, cfxScalarHostImmediate, comm),
                 cfxSuccess, "%s", cfxGetLastError(comm));
    cr_assert_eq(cfxAllReduce(x, y, 4, cfxFloat32, op, comm, NULL), cfxSuccess);
    cr_assert(y[0] == 2 && y[3] == 8, "premulsum over one rank: %g %g", y[0], y[3]);
    /* Only for its own type. */
    cr_assert_eq(cfxAllReduce(x, y, 4, cfxInt32, op, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "was made for datatype 7");
    /* Not a broadcast's or an allgather's op; a value never made is refused. */
    cr_assert_eq(cfxAllReduce(x, y, 4, cfxFloat32, (cfxRedOp_t)(op + 1), comm, NULL),
                 cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "neither a built-in");
    cr_assert_eq(cfxRedOpDestroy(cfxSum, comm), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "built-in reduction");
    cr_assert_eq(cfxRedOpDestroy((cfxRedOp_t)(op + 1), comm), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "was not made by cfxRedOpCreatePreMulSum");
    cr_assert_eq(cfxRedOpDestroy(op, comm), cfxSuccess);
    cr_assert_eq(cfxRedOpDestroy(op, comm), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "destroyed already");
    cr_assert_eq(cfxReduce(x, y, 4, cfxFloat32, op, 0, comm, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxReduceScatter(x, y, 4, cfxFloat32, op, comm, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxRedOpDestroy(op, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

Test(premulsum, a_full_table_is_invalid_usage_and_destroy_frees_a_slot)
{
    cfxComm_t comm = solo();
    int three = 3;
    cfxRedOp_t ops[CFX_MAX_PREMULSUM_OPS], extra;
    for (int i = 0; i < CFX_MAX_PREMULSUM_OPS; i++) {
        cr_assert_eq(
            cfxRedOpCreatePreMulSum(&ops[i], &three, cfxInt32, cfxScalarHostImmediate, comm),
            cfxSuccess);
        cr_assert_eq((int)ops[i], cfxNumOps + i);
    }
    cr_assert_eq(cfxRedOpCreatePreMulSum(&extra, &three, cfxInt32, cfxScalarHostImmediate, comm),
                 cfxInvalidUsage);
    ASSERT_SENTENCE(comm, "destroy some");
    cr_assert_eq(cfxRedOpDestroy(ops[5], comm), cfxSuccess);
    cr_assert_eq(cfxRedOpCreatePreMulSum(&extra, &three, cfxInt32, cfxScalarHostImmediate, comm),
                 cfxSuccess);
    cr_assert_eq(extra, ops[5]);
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

/* ------------------------------------------- alltoall, gather, scatter: bad arguments */

Test(alltoall_gather_scatter, bad_arguments_are_invalid_arguments_with_a_sentence)
{
    cfxComm_t comm = solo();
    float x[8] = {0}, y[8] = {0};
    cr_assert_eq(cfxAlltoAll(x, y, 1, cfxFloat32, NULL, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "cfxAlltoAll: comm is NULL");
    cr_assert_eq(cfxGather(x, y, 1, cfxFloat32, 0, NULL, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxScatter(x, y, 1, cfxFloat32, 0, NULL, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxAlltoAll(NULL, y, 1, cfxFloat32, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "sendbuff is NULL but count is 1");
    cr_assert_eq(cfxAlltoAll(x, NULL, 1, cfxFloat32, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "recvbuff is NULL");
    cr_assert_eq(cfxAlltoAll(x, x, 1, cfxFloat32, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "cannot run in place");
    cr_assert_eq(cfxAlltoAll(x, x + 1, 2, cfxFloat32, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "overlap");
    cr_assert_eq(cfxAlltoAll(x, y, 1, (cfxDataType_t)12, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "datatype 12");
    cr_assert_eq(cfxAlltoAll(x, y, SIZE_MAX / 2, cfxFloat64, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "overflows");
    cr_assert_eq(cfxGather(x, y, 1, cfxFloat32, 1, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "cfxGather: root = 1");
    cr_assert_eq(cfxGather(NULL, y, 1, cfxFloat32, 0, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "sendbuff is NULL");
    cr_assert_eq(cfxGather(x, NULL, 1, cfxFloat32, 0, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "recvbuff (on the root) is NULL");
    cr_assert_eq(cfxGather(x + 1, x, 2, cfxFloat32, 0, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "overlap");
    cr_assert_eq(cfxScatter(x, y, 1, cfxFloat32, -1, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "cfxScatter: root = -1");
    cr_assert_eq(cfxScatter(NULL, y, 1, cfxFloat32, 0, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "sendbuff (on the root) is NULL");
    cr_assert_eq(cfxScatter(x, NULL, 1, cfxFloat32, 0, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "recvbuff is NULL");
    cr_assert_eq(cfxScatter(x, x + 1, 2, cfxFloat32, 0, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "overlap");
    cr_assert_eq(cfxAlltoAll(x, y, 1, cfxFloat32, comm, (cfxStream_t)0x1), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "stream");
    /* Count 0 is a successful no-op, even with NULL buffers. */
    cr_assert_eq(cfxAlltoAll(NULL, NULL, 0, cfxFloat32, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxGather(NULL, NULL, 0, cfxFloat32, 0, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxScatter(NULL, NULL, 0, cfxFloat32, 0, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxCommFinalize(comm), cfxSuccess);
    cr_assert_eq(cfxAlltoAll(x, y, 1, cfxFloat32, comm, NULL), cfxInvalidUsage);
    ASSERT_SENTENCE(comm, "finalized");
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
    cr_assert_eq(cfxAlltoAll(x, y, 1, cfxFloat32, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "not a live communicator");
}

/* Two ranks that call alltoall with different counts, or alltoall against
 * gather: a receive sees the other call's fingerprint and says so. (The
 * other rank may see the first one's failure instead: cfxRemoteError.) */
static void mismatch_rank(struct cfx_test_rank *ctx)
{
    int r = ctx->rank;
    int kind_mismatch = *(const int *)ctx->arg;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, 2, ctx->id, r));
    float send[16] = {0}, recv[16];
    /* Connected first: a peer that never sends would leave the first use
     * waiting to connect until CFX_TIMEOUT. */
    RANK_CFX(ctx, cfxAlltoAll(send, recv, 1, cfxFloat32, comm, NULL));
    cfxResult_t res;
    cfx_test_step(ctx, "mismatched call");
    if (kind_mismatch && r == 1) /* Receives rank 0's block of its alltoall. */
        res = cfxGather(send, recv, 4, cfxFloat32, 1, comm, NULL);
    else
        res = cfxAlltoAll(send, recv, r == 0 ? 4 : 5, cfxFloat32, comm, NULL);
    const char *sentence = cfxGetLastError(comm);
    RANK_ASSERT(ctx, res == cfxInvalidUsage || res == cfxRemoteError,
                "a mismatched call returned %s", cfxGetErrorString(res));
    RANK_ASSERT(ctx, res != cfxInvalidUsage || strstr(sentence, "mismatched"), "sentence: %s",
                sentence);
    if (kind_mismatch && r == 1) {
        RANK_ASSERT(ctx, res == cfxInvalidUsage, "the gather's receive returned %s",
                    cfxGetErrorString(res));
        RANK_ASSERT(ctx, strstr(sentence, "sent data of alltoall"),
                    "the sentence does not name the alltoall: %s", sentence);
    }
    if (!kind_mismatch && strstr(sentence, "mismatched operations"))
        RANK_ASSERT(ctx, strstr(sentence, r == 0 ? "count 5" : "count 4"),
                    "the sentence does not name the other count: %s", sentence);
    cfxCommAbort(comm);
}

Test(alltoall_gather_scatter, a_peer_in_another_call_or_count_is_a_mismatch, .timeout = 120)
{
    for (int kind_mismatch = 0; kind_mismatch < 2; kind_mismatch++) {
        cfx_test_setenv("CFX_SHM_DISABLE", NULL);
        struct cfx_test_options opts = {
            .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 60, .arg = &kind_mismatch};
        CFX_TEST_RUN(&opts, mismatch_rank);
    }
}

/* --------------------------------------------------- memory and registration */

Test(mem, alloc_gives_page_aligned_zeroed_memory_and_refuses_bad_arguments)
{
    void *p = NULL;
    size_t size = 3 * 4096 + 5;
    cr_assert_eq(cfxMemAlloc(&p, size), cfxSuccess, "%s", cfxGetLastError(NULL));
    cr_assert_eq((uintptr_t)p % (uintptr_t)sysconf(_SC_PAGESIZE), 0, "%p is not page aligned", p);
    for (size_t i = 0; i < size; i++)
        cr_assert_eq(((unsigned char *)p)[i], 0, "byte %zu was not touched (zeroed)", i);
    memset(p, 1, size);
    cr_assert_eq(cfxMemFree(p), cfxSuccess);
    cr_assert_eq(cfxMemFree(NULL), cfxSuccess);
    cr_assert_eq(cfxMemAlloc(NULL, 16), cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "cfxMemAlloc: ptr is NULL");
    cr_assert_eq(cfxMemAlloc(&p, 0), cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "size is 0");
    cr_assert_eq(cfxMemAlloc(&p, SIZE_MAX), cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "larger than any allocation");
}

Test(mem, registrations_are_checked_listed_and_released_at_destroy)
{
    cfxComm_t comm = solo(), other = solo();
    char buf[64];
    void *h1 = NULL, *h2 = NULL;
    cr_assert_eq(cfxCommRegister(comm, buf, sizeof(buf), &h1), cfxSuccess);
    cr_assert_eq(cfxCommRegister(comm, buf + 8, 8, &h2), cfxSuccess);
    cr_assert(h1 != NULL && h2 != NULL && h1 != h2);
    cr_assert_eq(cfxCommRegister(comm, NULL, 8, &h1), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "buff is NULL");
    cr_assert_eq(cfxCommRegister(comm, buf, 0, &h1), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "size is 0");
    cr_assert_eq(cfxCommRegister(comm, buf, 8, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "handle is NULL");
    cr_assert_eq(cfxCommRegister(NULL, buf, 8, &h1), cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "comm is NULL");
    /* Another communicator's handle, NULL, a released one: refused. */
    cr_assert_eq(cfxCommDeregister(other, h1), cfxInvalidArgument);
    ASSERT_SENTENCE(other, "not a registration of this communicator");
    cr_assert_eq(cfxCommDeregister(comm, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxCommDeregister(comm, h1), cfxSuccess);
    cr_assert_eq(cfxCommDeregister(comm, h1), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "already deregistered");
    /* h2 stays registered: destroy releases it (LeakSanitizer checks). */
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
    cr_assert_eq(cfxCommDeregister(comm, h2), cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "not a live communicator");
    cr_assert_eq(cfxCommDestroy(other), cfxSuccess);
}
