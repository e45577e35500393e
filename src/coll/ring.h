/*
 * Ring schedules: every rank sends to the next position of its ring and
 * receives from the previous one, pipelined one slot at a time. r below is
 * the rank's position (its rank when the ring is 0, 1, ..., n-1; see
 * cfx_work.ring): the allreduce's blocks are numbered by position (every
 * rank ends with all of them, so no rank needs to know whose is whose),
 * while an allgather's or reduce-scatter's block B is the block of the rank
 * at position B (cfx_work_block_rank).
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
#ifndef CFX_COLL_RING_H
#define CFX_COLL_RING_H

#include "src/coll/work.h"

/* Block b of the round starting at element base that holds round_elems. */
static inline CFX_HOST_DEVICE void cfx_ring_round_block(uint64_t base, uint64_t round_elems, int n,
                                                        int b, uint64_t *offset_p, uint64_t *len_p)
{
    uint64_t per = cfx_div_up(round_elems, (uint64_t)n);
    uint64_t start = per * (uint64_t)b;
    *offset_p = base + start;
    *len_p = start >= round_elems ? 0 : (round_elems - start < per ? round_elems - start : per);
}

/* ------------------------------------------------------------ allreduce */

static inline CFX_HOST_DEVICE uint64_t cfx_ring_allreduce_steps(const struct cfx_work *w)
{
    uint64_t per_round = (uint64_t)w->chunk_elems * (uint64_t)w->nranks;
    return cfx_div_up(w->count, per_round) * (uint64_t)(2 * w->nranks - 1);
}

static inline CFX_HOST_DEVICE void
cfx_ring_allreduce_describe(const struct cfx_work *w, uint64_t index, struct cfx_step *step)
{
    int n = w->nranks, r = w->rank;
    uint64_t per_round = (uint64_t)w->chunk_elems * (uint64_t)n;
    uint64_t round = index / (uint64_t)(2 * n - 1);
    int k = (int)(index % (uint64_t)(2 * n - 1));
    uint64_t base = round * per_round;
    uint64_t round_elems = w->count - base < per_round ? w->count - base : per_round;
    int block;
    unsigned flags;
    if (k == 0) {
        block = cfx_mod(r - 1, n);
        flags = CFX_PRIM_SEND | CFX_PRIM_STABLE;
    } else if (k < n - 1) {
        block = cfx_mod(r - 1 - k, n);
        flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_SEND;
    } else if (k == n - 1) {
        block = r;
        flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_OUT | CFX_PRIM_SEND | CFX_PRIM_FINAL;
        if (w->redop == cfxAvg)
            flags |= CFX_PRIM_AVG;
    } else if (k < 2 * n - 2) {
        block = cfx_mod(r - (k - n + 1), n);
        flags = CFX_PRIM_RECV | CFX_PRIM_OUT | CFX_PRIM_SEND | CFX_PRIM_FINAL;
    } else {
        block = cfx_mod(r + 1, n);
        flags = CFX_PRIM_RECV | CFX_PRIM_OUT;
    }
    uint64_t offset, len;
    cfx_ring_round_block(base, round_elems, n, block, &offset, &len);
    step->flags = flags;
    step->input = cfx_coll_at(w->sendbuff, offset, w->elem_bytes);
    step->output = cfx_coll_at(w->recvbuff, offset, w->elem_bytes);
    step->n_elems = len;
}

/* ------------------------------------------------- per-block ring rounds */

/* Allgather and reduce-scatter: rounds of one chunk of every block, n steps each. */
static inline CFX_HOST_DEVICE uint64_t cfx_ring_block_steps(const struct cfx_work *w)
{
    return cfx_div_up(w->count, w->chunk_elems) * (uint64_t)w->nranks;
}

static inline CFX_HOST_DEVICE void cfx_ring_round_of(const struct cfx_work *w, uint64_t index,
                                                     int *k_p, uint64_t *offset_p, uint64_t *len_p)
{
    uint64_t round = index / (uint64_t)w->nranks;
    *k_p = (int)(index % (uint64_t)w->nranks);
    *offset_p = round * w->chunk_elems;
    uint64_t left = w->count - *offset_p;
    *len_p = left < w->chunk_elems ? left : w->chunk_elems;
}

static inline CFX_HOST_DEVICE void
cfx_ring_allgather_describe(const struct cfx_work *w, uint64_t index, struct cfx_step *step)
{
    int n = w->nranks, r = w->rank, k;
    uint64_t offset, len;
    cfx_ring_round_of(w, index, &k, &offset, &len);
    int block;
    if (k == 0) {
        block = r;
        step->flags = CFX_PRIM_SEND | CFX_PRIM_OUT | CFX_PRIM_FINAL;
    } else if (k < n - 1) {
        block = cfx_mod(r - k, n);
        step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT | CFX_PRIM_SEND | CFX_PRIM_FINAL;
    } else {
        block = cfx_mod(r + 1, n);
        step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT;
    }
    step->input = cfx_coll_at(w->sendbuff, offset, w->elem_bytes);
    step->output = cfx_coll_at(
        w->recvbuff, (uint64_t)cfx_work_block_rank(w, block) * w->pitch + offset, w->elem_bytes);
    step->n_elems = len;
}

static inline CFX_HOST_DEVICE void
cfx_ring_reducescatter_describe(const struct cfx_work *w, uint64_t index, struct cfx_step *step)
{
    int n = w->nranks, r = w->rank, k;
    uint64_t offset, len;
    cfx_ring_round_of(w, index, &k, &offset, &len);
    int block = cfx_mod(r - 1 - k, n); /* k = n-1 gives block r. */
    if (k == 0)
        step->flags = CFX_PRIM_SEND;
    else if (k < n - 1)
        step->flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_SEND;
    else
        step->flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_OUT |
                      (w->redop == cfxAvg ? CFX_PRIM_AVG : 0);
    step->input = cfx_coll_at(
        w->sendbuff, (uint64_t)cfx_work_block_rank(w, block) * w->pitch + offset, w->elem_bytes);
    step->output = cfx_coll_at(w->recvbuff, offset, w->elem_bytes);
    step->n_elems = len;
}

/* Allgather and reduce-scatter have the same number of steps. */
#define cfx_ring_allgather_steps     cfx_ring_block_steps
#define cfx_ring_reducescatter_steps cfx_ring_block_steps

#endif /* CFX_COLL_RING_H */
