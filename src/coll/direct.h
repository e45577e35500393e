/*
 * Direct (one-shot) allreduce: every rank sends its whole input to every
 * other rank over all-pairs connectors (w->direct), receives every peer's
 * input, and reduces the n inputs itself. One hand-off of latency instead of
 * the ring's 2(n-1); each rank sends and reduces (n-1) x the data, so it
 * pays off for small messages only.
 *
 * Every rank folds the inputs in rank order, x0 (w) x1 (w) ... (w) x(n-1),
 * with the same kernels, so all ranks hold bitwise identical results (the
 * rounding of floating-point sums depends on the order). cfxAvg sums, then
 * divides once.
 *
 * The data is cut into chunks of one slot. Rank r runs n steps per chunk
 * (C chunks, C*n steps), sending chunk j+1 before reducing chunk j so that
 * peers can work on the next chunk while this rank reduces:
 *   send chunk 0 to r+1, r+2, ..., r-1             (n-1 steps)
 *   for j = 1 .. C-1: send chunk j to every peer,   (n-1 steps)
 *                     recv-reduce chunk j-1         (1 step: all peers' slots)
 *   recv-reduce chunk C-1                           (1 step)
 * A connector never holds more than two of this op's slots, so any FIFO
 * depth of two or more suffices. A chunk's input is sent before its output
 * is written, so in-place buffers are safe.
 */
#ifndef CFX_COLL_DIRECT_H
#define CFX_COLL_DIRECT_H

#include "src/coll/work.h"

/* Chunks of the op; an empty op (a mismatch-check handshake) still has one. */
static inline CFX_HOST_DEVICE uint64_t cfx_direct_allreduce_steps(const struct cfx_work *w)
{
    /* Empty: no steps (the core asks again with a handshake). */
    return cfx_work_chunks(w) * (uint64_t)w->nranks;
}

/* Send chunk @p chunk to the @p k-th peer after this rank (k = 0..n-2). */
static inline CFX_HOST_DEVICE void
cfx_direct_describe_send(const struct cfx_work *w, uint64_t chunk, int k, struct cfx_step *step)
{
    uint64_t offset, len;
    cfx_work_chunk_of(w, chunk, &offset, &len);
    int peer = w->rank + 1 + k; /* Below 2n: no division needed. */
    if (peer >= w->nranks)
        peer -= w->nranks;
    step->flags = CFX_PRIM_SEND;
    step->input = cfx_coll_at(w->sendbuff, offset, w->elem_bytes);
    step->output = NULL;
    step->n_elems = len;
    step->send = w->links.to[peer];
}

/* A step that receives from every peer, in rank order (recv, recv_more). */
static inline CFX_HOST_DEVICE void cfx_direct_recv_from_all(const struct cfx_work *w,
                                                            struct cfx_step *step)
{
    step->n_recv_more = 0;
    int first = 1;
    for (int peer = 0; peer < w->nranks; peer++) {
        if (peer == w->rank)
            continue;
        if (first)
            step->recv = w->links.from[peer];
        else
            step->recv_more[step->n_recv_more++] = w->links.from[peer];
        first = 0;
    }
}

/* Receive chunk @p chunk from every peer and fold all inputs in rank order. */
static inline CFX_HOST_DEVICE void cfx_direct_describe_reduce(const struct cfx_work *w,
                                                              uint64_t chunk, struct cfx_step *step)
{
    uint64_t offset, len;
    cfx_work_chunk_of(w, chunk, &offset, &len);
    step->flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_OUT | CFX_PRIM_ORDERED |
                  (w->redop == cfxAvg ? CFX_PRIM_AVG : 0);
    step->input = cfx_coll_at(w->sendbuff, offset, w->elem_bytes);
    step->output = cfx_coll_at(w->recvbuff, offset, w->elem_bytes);
    step->n_elems = len;
    step->input_pos = w->rank; /* Ranks below this one come first. */
    cfx_direct_recv_from_all(w, step);
}

static inline CFX_HOST_DEVICE void
cfx_direct_allreduce_describe(const struct cfx_work *w, uint64_t index, struct cfx_step *step)
{
    uint64_t n = (uint64_t)w->nranks;
    if (index < n - 1) {
        cfx_direct_describe_send(w, 0, (int)index, step);
        return;
    }
    uint64_t rest = index - (n - 1);
    uint64_t block = 1 + rest / n; /* Sends of chunk `block`, then the reduction of block-1. */
    uint64_t k = rest % n;
    if (block == cfx_work_chunks_min1(w) || k == n - 1)
        cfx_direct_describe_reduce(w, block - 1, step);
    else
        cfx_direct_describe_send(w, block, (int)k, step);
}

#endif /* CFX_COLL_DIRECT_H */
