/*
 * Ring schedules: every rank sends to rank+1 and receives from rank-1,
 * pipelined one slot at a time.
 *
 * Allreduce = reduce-scatter then allgather. The data is cut into rounds of
 * n*chunk elements; each round into n blocks. In a round, rank r runs 2n-1
 * steps (B is the block index, mod n):
 *   k = 0            send                   B = r-1
 *   k = 1 .. n-2     recv-reduce-send       B = r-1-k
 *   k = n-1          recv-reduce-copy-send  B = r     (block r is now final)
 *   k = n .. 2n-3    recv-copy-send         B = r-(k-n+1)
 *   k = 2n-2         recv (copy)            B = r+1
 * Reduce-scatter is the first n steps over blocks of recvcount elements;
 * allgather forwards each rank's block n-1 times.
 */
#include "src/coll/schedule.h"

/* Block b of the round starting at element base that holds round_elems. */
static void round_block(size_t base, size_t round_elems, int n, int b, size_t *offset_p,
                        size_t *len_p)
{
    size_t per = (size_t)cfx_div_up(round_elems, (uint64_t)n);
    size_t start = per * (size_t)b;
    *offset_p = base + start;
    *len_p = start >= round_elems ? 0 : (round_elems - start < per ? round_elems - start : per);
}

/* ------------------------------------------------------------ allreduce */

static uint64_t allreduce_steps(const struct cfx_op *op)
{
    uint64_t per_round = (uint64_t)op->chunk_elems * (uint64_t)op->nranks;
    return cfx_div_up(op->count, per_round) * (uint64_t)(2 * op->nranks - 1);
}

static void allreduce_describe(const struct cfx_op *op, uint64_t index, struct cfx_prim_step *step)
{
    int n = op->nranks, r = op->rank;
    uint64_t per_round = (uint64_t)op->chunk_elems * (uint64_t)n;
    uint64_t round = index / (uint64_t)(2 * n - 1);
    int k = (int)(index % (uint64_t)(2 * n - 1));
    size_t base = (size_t)(round * per_round);
    size_t round_elems = op->count - base < per_round ? op->count - base : (size_t)per_round;
    int block;
    unsigned flags;
    if (k == 0) {
        block = cfx_mod(r - 1, n);
        flags = CFX_PRIM_SEND;
    } else if (k < n - 1) {
        block = cfx_mod(r - 1 - k, n);
        flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_SEND;
    } else if (k == n - 1) {
        block = r;
        flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_OUT | CFX_PRIM_SEND;
        if (op->op == cfxAvg)
            flags |= CFX_PRIM_AVG;
    } else if (k < 2 * n - 2) {
        block = cfx_mod(r - (k - n + 1), n);
        flags = CFX_PRIM_RECV | CFX_PRIM_OUT | CFX_PRIM_SEND;
    } else {
        block = cfx_mod(r + 1, n);
        flags = CFX_PRIM_RECV | CFX_PRIM_OUT;
    }
    size_t offset, len;
    round_block(base, round_elems, n, block, &offset, &len);
    step->flags = flags;
    step->input = cfx_coll_at(op->sendbuff, offset, op->elem_bytes);
    step->output = cfx_coll_at(op->recvbuff, offset, op->elem_bytes);
    step->n_elems = len;
}

const struct cfx_schedule cfx_ring_allreduce = {
    .n_steps = allreduce_steps,
    .describe = allreduce_describe,
};

/* ------------------------------------------------- per-block ring rounds */

/* Allgather and reduce-scatter: rounds of one chunk of every block, n steps each. */
static uint64_t block_ring_steps(const struct cfx_op *op)
{
    return cfx_div_up(op->count, op->chunk_elems) * (uint64_t)op->nranks;
}

static void round_of(const struct cfx_op *op, uint64_t index, int *k_p, size_t *offset_p,
                     size_t *len_p)
{
    uint64_t round = index / (uint64_t)op->nranks;
    *k_p = (int)(index % (uint64_t)op->nranks);
    *offset_p = (size_t)round * op->chunk_elems;
    size_t left = op->count - *offset_p;
    *len_p = left < op->chunk_elems ? left : op->chunk_elems;
}

static void allgather_describe(const struct cfx_op *op, uint64_t index, struct cfx_prim_step *step)
{
    int n = op->nranks, r = op->rank, k;
    size_t offset, len;
    round_of(op, index, &k, &offset, &len);
    int block;
    if (k == 0) {
        block = r;
        step->flags = CFX_PRIM_SEND | CFX_PRIM_OUT;
    } else if (k < n - 1) {
        block = cfx_mod(r - k, n);
        step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT | CFX_PRIM_SEND;
    } else {
        block = cfx_mod(r + 1, n);
        step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT;
    }
    step->input = cfx_coll_at(op->sendbuff, offset, op->elem_bytes);
    step->output = cfx_coll_at(op->recvbuff, ((size_t)block * op->count + offset), op->elem_bytes);
    step->n_elems = len;
}

const struct cfx_schedule cfx_ring_allgather = {
    .n_steps = block_ring_steps,
    .describe = allgather_describe,
};

static void reducescatter_describe(const struct cfx_op *op, uint64_t index,
                                   struct cfx_prim_step *step)
{
    int n = op->nranks, r = op->rank, k;
    size_t offset, len;
    round_of(op, index, &k, &offset, &len);
    int block = cfx_mod(r - 1 - k, n); /* k = n-1 gives block r. */
    if (k == 0)
        step->flags = CFX_PRIM_SEND;
    else if (k < n - 1)
        step->flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_SEND;
    else
        step->flags =
            CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_OUT | (op->op == cfxAvg ? CFX_PRIM_AVG : 0);
    step->input = cfx_coll_at(op->sendbuff, ((size_t)block * op->count + offset), op->elem_bytes);
    step->output = cfx_coll_at(op->recvbuff, offset, op->elem_bytes);
    step->n_elems = len;
}

const struct cfx_schedule cfx_ring_reducescatter = {
    .n_steps = block_ring_steps,
    .describe = reducescatter_describe,
};
