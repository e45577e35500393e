/*
 * Rounds between buffers registered with cfxCommRegister that the verbs
 * transport's tests (test_transport_ib.c) and the net-plugin transport's
 * (test_transport_net.c) share. Header-only: each test file is its own
 * executable.
 */
#ifndef CFX_TESTS_REGISTERED_ROUNDS_H
#define CFX_TESTS_REGISTERED_ROUNDS_H

#include <stdlib.h>

#include "conflux.h"
#include "tests/coll_check.h"
#include "tests/harness.h"

/* Floats per peer: two full 512 KiB slots and a 12-byte tail (small
 * enough to ride in a slot's info line). */
#define REF_COUNT ((size_t)(2 * 131072 + 3))

/* Alltoalls of REF_COUNT floats per peer with both buffers registered,
 * all ranks at once (each rank its own host): each slot lands in the
 * receiver's buffer or in its FIFO depending on whether the receiver's
 * offer was there first; the results must not tell. */
static void ref_alltoall_both_registered(struct cfx_test_rank *ctx)
{
    int n = ctx->nranks, r = ctx->rank;
    size_t all = REF_COUNT * (size_t)n;
    float *send = calloc(all, sizeof(float)), *recv = calloc(all, sizeof(float));
    RANK_ASSERT(ctx, send && recv, "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, n, ctx->id, r));
    void *hs, *hr;
    RANK_CFX(ctx, cfxCommRegister(comm, send, all * sizeof(float), &hs));
    RANK_CFX(ctx, cfxCommRegister(comm, recv, all * sizeof(float), &hr));
    for (int round = 0; round < 6 && !ctx->slot_failed; round++) {
        cfx_test_step(ctx, "alltoall round %d", round);
        ref_tagged_fill(send, n, r, REF_COUNT, round);
        for (size_t i = 0; i < all; i++)
            recv[i] = -3.0f;
        RANK_CFX(ctx, cfxAlltoAll(send, recv, REF_COUNT, cfxFloat32, comm, NULL));
        int from;
        long bad = ref_tagged_check(recv, n, r, REF_COUNT, round, &from);
        RANK_ASSERT(ctx, bad < 0, "round %d: element %ld (from rank %d) is %g", round, bad, from,
                    bad < 0 ? 0.0 : recv[bad]);
    }
    RANK_CFX(ctx, cfxCommDeregister(comm, hs));
    RANK_CFX(ctx, cfxCommDeregister(comm, hr));
    if (!ctx->slot_failed)
        RANK_CFX(ctx, cfxCommFinalize(comm));
    cfxCommDestroy(comm);
    free(send);
    free(recv);
}

#endif /* CFX_TESTS_REGISTERED_ROUNDS_H */
