/*
 * Rounds of collectives whose final output may travel straight between user
 * buffers (a transport that moves any host memory, or buffers registered
 * with cfxCommRegister over verbs), shared by the tests of those paths.
 */
#ifndef CFX_TESTS_COLL_ROUNDS_H
#define CFX_TESTS_COLL_ROUNDS_H

#include <stdlib.h>

#include "tests/coll_check.h"
#include "tests/harness.h"

/* Allreduce and broadcast of @p count floats and allgather of count / n per
 * rank, 4 rounds, out of place and in place, from @p in into @p out (each
 * count x nranks floats): final output is sent from the output and taken
 * into the next rank's output where its offer was waiting. Each output is
 * overwritten as soon as its call returns (a slot sent from it after that
 * would carry the overwritten values to the next rank), and holds garbage
 * before each call. */
static inline void ref_collective_rounds(struct cfx_test_rank *ctx, cfxComm_t comm, float *in,
                                         float *out, size_t count)
{
    int n = ctx->nranks, r = ctx->rank;
    size_t all = count * (size_t)n;
    for (int round = 0; round < 4 && !ctx->slot_failed; round++) {
        int in_place = round % 2;
        float *dst = in_place ? in : out;
        /* Allreduce of count: sum of ref_tagged(q, 0, i, round) over ranks q. */
        cfx_test_step(ctx, "allreduce round %d%s", round, in_place ? " in place" : "");
        for (size_t i = 0; i < count; i++) {
            in[i] = ref_tagged(r, 0, i, round);
            out[i] = -3.0f;
        }
        RANK_CFX(ctx, cfxAllReduce(in, dst, count, cfxFloat32, cfxSum, comm, NULL));
        for (size_t i = 0; i < count && !ctx->slot_failed; i++) {
            float want = 0.0f;
            for (int q = 0; q < n; q++)
                want += ref_tagged(q, 0, i, round);
            if (dst[i] != want) {
                RANK_ASSERT(ctx, 0, "allreduce round %d: element %zu is %g, not %g", round, i,
                            dst[i], want);
                break;
            }
        }
        for (size_t i = 0; i < count; i++)
            dst[i] = -1.0f;
        /* Broadcast from rank round % n. */
        int root = round % n;
        cfx_test_step(ctx, "broadcast round %d from %d", round, root);
        for (size_t i = 0; i < count; i++) {
            in[i] = r == root ? ref_tagged(root, 1, i, round) : -5.0f;
            out[i] = -3.0f;
        }
        RANK_CFX(ctx, cfxBroadcast(in, dst, count, cfxFloat32, root, comm, NULL));
        for (size_t i = 0; i < count && !ctx->slot_failed; i++)
            if (dst[i] != ref_tagged(root, 1, i, round)) {
                RANK_ASSERT(ctx, 0, "broadcast round %d: element %zu is %g, not %g", round, i,
                            dst[i], ref_tagged(root, 1, i, round));
                break;
            }
        for (size_t i = 0; i < count; i++)
            dst[i] = -1.0f;
        /* Allgather of count / n per rank (in place: the rank's own block). */
        size_t per = count / (size_t)n;
        cfx_test_step(ctx, "allgather round %d", round);
        for (size_t i = 0; i < all; i++)
            out[i] = -3.0f;
        float *send = in_place ? out + (size_t)r * per : in;
        for (size_t i = 0; i < per; i++)
            send[i] = ref_tagged(r, 2, i, round);
        RANK_CFX(ctx, cfxAllGather(send, out, per, cfxFloat32, comm, NULL));
        for (int q = 0; q < n && !ctx->slot_failed; q++)
            for (size_t i = 0; i < per; i++)
                if (out[(size_t)q * per + i] != ref_tagged(q, 2, i, round)) {
                    RANK_ASSERT(ctx, 0, "allgather round %d: element %zu of rank %d is %g, not %g",
                                round, i, q, out[(size_t)q * per + i], ref_tagged(q, 2, i, round));
                    break;
                }
        for (size_t i = 0; i < all; i++)
            out[i] = -1.0f;
    }
}

#endif /* CFX_TESTS_COLL_ROUNDS_H */
