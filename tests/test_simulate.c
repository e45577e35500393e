/*
 * cfxGroupSimulateEnd: the cost model's time for a group, nothing run. The
 * estimate grows with the size and doubles with the operations; the buffers
 * stay untouched; later calls still agree across ranks; bad uses are
 * refused with a sentence.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness.h"

#define COUNT ((size_t)1 << 18) /* 1 MiB of float32. */

static float simulate_allreduces(struct cfx_test_rank *ctx, cfxComm_t comm, float *buf,
                                 size_t count, int n)
{
    cfxSimInfo_t sim = CFX_SIM_INFO_INITIALIZER;
    cfxGroupStart();
    for (int i = 0; i < n; i++)
        cfxAllReduce(buf, buf, count, cfxFloat32, cfxSum, comm, NULL);
    cfxResult_t res = cfxGroupSimulateEnd(&sim);
    if (res != cfxSuccess)
        cfx_test_fail(ctx, __FILE__, __LINE__, "cfxGroupSimulateEnd returned %s: %s",
                      cfxGetErrorString(res), cfxGetLastError(NULL));
    return sim.estimatedTime;
}

static void simulate(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    float *buf = malloc(16 * COUNT * sizeof(float));
    RANK_ASSERT(ctx, buf != NULL, "malloc");
    for (size_t i = 0; i < 16 * COUNT; i++)
        buf[i] = 1.0f;
    float one = simulate_allreduces(ctx, comm, buf, COUNT, 1);
    float two = simulate_allreduces(ctx, comm, buf, COUNT, 2);
    float big = simulate_allreduces(ctx, comm, buf, 16 * COUNT, 1);
    RANK_ASSERT(ctx, one > 0 && isfinite(one), "1 MiB allreduce: estimate %g us", one);
    RANK_ASSERT(ctx, fabsf(two - 2 * one) <= 0.01f * two, "two allreduces: %g us, one: %g us", two,
                one);
    RANK_ASSERT(ctx, big > 4 * one, "16 MiB: %g us, 1 MiB: %g us", big, one);
    for (size_t i = 0; i < 16 * COUNT; i++)
        RANK_ASSERT(ctx, buf[i] == 1.0f, "element %zu changed to %g: something ran", i, buf[i]);
    /* Sends and receives to the next and previous rank. */
    cfxSimInfo_t sim = CFX_SIM_INFO_INITIALIZER;
    int next = (ctx->rank + 1) % ctx->nranks, prev = (ctx->rank + ctx->nranks - 1) % ctx->nranks;
    RANK_CFX(ctx, cfxGroupStart());
    RANK_CFX(ctx, cfxSend(buf, COUNT, cfxFloat32, next, comm, NULL));
    RANK_CFX(ctx, cfxRecv(buf + COUNT, COUNT, cfxFloat32, prev, comm, NULL));
    RANK_CFX(ctx, cfxGroupSimulateEnd(&sim));
    RANK_ASSERT(ctx, sim.estimatedTime > 0 && sim.estimatedTime < one * 4,
                "send/recv of 1 MiB: %g us (allreduce %g us)", sim.estimatedTime, one);
    /* Nested: the outermost end simulates. */
    sim.estimatedTime = -1;
    RANK_CFX(ctx, cfxGroupStart());
    RANK_CFX(ctx, cfxGroupStart());
    RANK_CFX(ctx, cfxAllReduce(buf, buf, COUNT, cfxFloat32, cfxSum, comm, NULL));
    RANK_CFX(ctx, cfxGroupSimulateEnd(&sim));
    RANK_ASSERT(ctx, sim.estimatedTime == -1, "the inner end simulated");
    RANK_CFX(ctx, cfxGroupSimulateEnd(&sim));
    RANK_ASSERT(ctx, fabsf(sim.estimatedTime - one) <= 0.01f * one, "nested: %g us, not %g",
                sim.estimatedTime, one);
    /* Bad uses. */
    RANK_ASSERT(ctx,
                cfxGroupSimulateEnd(&sim) == cfxInvalidUsage &&
                    strstr(cfxGetLastError(NULL), "without cfxGroupStart") != NULL,
                "without a group: %s", cfxGetLastError(NULL));
    cfxSimInfo_t unset;
    memset(&unset, 0, sizeof(unset));
    RANK_CFX(ctx, cfxGroupStart());
    RANK_ASSERT(ctx, cfxGroupSimulateEnd(NULL) == cfxInvalidArgument, "NULL was accepted");
    RANK_ASSERT(ctx,
                cfxGroupSimulateEnd(&unset) == cfxInvalidArgument &&
                    strstr(cfxGetLastError(NULL), "CFX_SIM_INFO_INITIALIZER") != NULL,
                "an unset simInfo: %s", cfxGetLastError(NULL));
    RANK_CFX(ctx, cfxGroupEnd()); /* The refused calls left the group open. */
    /* What was simulated never ran, on any rank: the next call agrees. */
    RANK_CFX(ctx, cfxAllReduce(buf, buf, COUNT, cfxFloat32, cfxSum, comm, NULL));
    RANK_ASSERT(ctx, buf[0] == (float)ctx->nranks && buf[COUNT - 1] == (float)ctx->nranks,
                "allreduce after simulations: %g", buf[0]);
    free(buf);
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(simulate, estimates_a_group_without_running_it, .timeout = 60)
{
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 50};
    CFX_TEST_RUN(&opts, simulate);
}
