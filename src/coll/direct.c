/*
 * Direct (one-shot) allreduce: every rank sends its whole input to every
 * other rank over all-pairs connectors (op->direct), receives every peer's
 * input, and reduces the n inputs itself. One hand-off of latency instead of
 * the ring's 2(n-1); each rank sends and reduces (n-1) x the data, so it
 * pays off for small messages only.
 *
 * Every rank folds the inputs in rank order, x0 (op) x1 (op) ... (op) x(n-1),
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
#include "src/coll/schedule.h"

/* Chunks of the op; an empty op (a mismatch-check handshake) still has one. */
static uint64_t n_chunks(const struct cfx_op *op)
{
    uint64_t chunks = cfx_coll_chunk_steps(op);
    return chunks > 0 ? chunks : 1;
}

static uint64_t direct_steps(const struct cfx_op *op)
{
    if (cfx_coll_chunk_steps(op) == 0)
        return 0; /* Empty: no steps (the core asks again with a handshake). */
    return n_chunks(op) * (uint64_t)op->nranks;
}

/* Send chunk @p chunk to the @p k-th peer after this rank (k = 0..n-2). */
static void describe_send(const struct cfx_op *op, uint64_t chunk, int k,
                          struct cfx_prim_step *step)
{
    size_t offset, len;
    cfx_coll_chunk_of(op, chunk, &offset, &len);
    int peer = op->rank + 1 + k; /* Below 2n: no division needed. */
    if (peer >= op->nranks)
        peer -= op->nranks;
    step->flags = CFX_PRIM_SEND;
    step->input = cfx_coll_at(op->sendbuff, offset, op->elem_bytes);
    step->output = NULL;
    step->n_elems = len;
    step->send = op->direct->to[peer];
}

/* Receive chunk @p chunk from every peer and fold all inputs in rank order. */
static void describe_reduce(const struct cfx_op *op, uint64_t chunk, struct cfx_prim_step *step)
{
    size_t offset, len;
    cfx_coll_chunk_of(op, chunk, &offset, &len);
    step->flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_OUT | CFX_PRIM_ORDERED |
                  (op->op == cfxAvg ? CFX_PRIM_AVG : 0);
    step->input = cfx_coll_at(op->sendbuff, offset, op->elem_bytes);
    step->output = cfx_coll_at(op->recvbuff, offset, op->elem_bytes);
    step->n_elems = len;
    step->input_pos = op->rank; /* Ranks below this one come first. */
    step->n_recv_more = 0;
    int first = 1;
    for (int peer = 0; peer < op->nranks; peer++) {
        if (peer == op->rank)
            continue;
        if (first)
            step->recv = op->direct->from[peer];
        else
            step->recv_more[step->n_recv_more++] = op->direct->from[peer];
        first = 0;
    }
}

static void direct_describe(const struct cfx_op *op, uint64_t index, struct cfx_prim_step *step)
{
    uint64_t n = (uint64_t)op->nranks;
    if (index < n - 1) {
        describe_send(op, 0, (int)index, step);
        return;
    }
    uint64_t rest = index - (n - 1);
    uint64_t block = 1 + rest / n; /* Sends of chunk `block`, then the reduction of block-1. */
    uint64_t k = rest % n;
    if (block == n_chunks(op) || k == n - 1)
        describe_reduce(op, block - 1, step);
    else
        describe_send(op, block, (int)k, step);
}

const struct cfx_schedule cfx_direct_allreduce = {
    .n_steps = direct_steps,
    .describe = direct_describe,
};
