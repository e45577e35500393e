/*
 * Chain schedules for rooted collectives: the ring order, cut open at the
 * root, pipelined one chunk at a time.
 *   broadcast: root -> root+1 -> ... -> root-1; position p = r - root
 *     p = 0: copy-send; 0 < p < n-1: recv-copy-send; p = n-1: recv.
 *   reduce: root+1 -> ... -> root; position p = r - root - 1
 *     p = 0: send; 0 < p < n-1: recv-reduce-send; p = n-1 (root): recv-reduce-copy.
 */
#include "src/coll/schedule.h"

uint64_t cfx_coll_chunk_steps(const struct cfx_op *op)
{
    if (op->count <= op->chunk_elems) /* Small calls: no division. */
        return op->count > 0;
    return cfx_div_up(op->count, op->chunk_elems);
}

void cfx_coll_chunk_of(const struct cfx_op *op, uint64_t index, size_t *offset_p, size_t *len_p)
{
    *offset_p = (size_t)index * op->chunk_elems;
    size_t left = op->count - *offset_p;
    *len_p = left < op->chunk_elems ? left : op->chunk_elems;
}

static void broadcast_describe(const struct cfx_op *op, uint64_t index, struct cfx_prim_step *step)
{
    int n = op->nranks;
    int p = cfx_mod(op->rank - op->root, n);
    size_t offset, len;
    cfx_coll_chunk_of(op, index, &offset, &len);
    if (p == 0)
        step->flags = CFX_PRIM_SEND | CFX_PRIM_OUT;
    else if (p < n - 1)
        step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT | CFX_PRIM_SEND;
    else
        step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT;
    step->input = cfx_coll_at(op->sendbuff, offset, op->elem_bytes);
    step->output = cfx_coll_at(op->recvbuff, offset, op->elem_bytes);
    step->n_elems = len;
}

const struct cfx_schedule cfx_chain_broadcast = {
    .n_steps = cfx_coll_chunk_steps,
    .describe = broadcast_describe,
};

static void reduce_describe(const struct cfx_op *op, uint64_t index, struct cfx_prim_step *step)
{
    int n = op->nranks;
    int p = cfx_mod(op->rank - op->root - 1, n);
    size_t offset, len;
    cfx_coll_chunk_of(op, index, &offset, &len);
    if (p == 0)
        step->flags = CFX_PRIM_SEND;
    else if (p < n - 1)
        step->flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_SEND;
    else
        step->flags =
            CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_OUT | (op->op == cfxAvg ? CFX_PRIM_AVG : 0);
    step->input = cfx_coll_at(op->sendbuff, offset, op->elem_bytes);
    step->output = cfx_coll_at(op->recvbuff, offset, op->elem_bytes);
    step->n_elems = len;
}

const struct cfx_schedule cfx_chain_reduce = {
    .n_steps = cfx_coll_chunk_steps,
    .describe = reduce_describe,
};
