/*
 * Point-to-point schedules (send, receive: one slot per chunk) and the
 * one-rank schedule every collective reduces to when nranks is 1.
 */
#include "src/coll/schedule.h"

/* ------------------------------------------------------ point to point */

static void send_describe(const struct cfx_op *op, uint64_t index, struct cfx_prim_step *step)
{
    size_t offset, len;
    cfx_coll_chunk_of(op, index, &offset, &len);
    step->flags = CFX_PRIM_SEND;
    step->input = cfx_coll_at(op->sendbuff, offset, op->elem_bytes);
    step->output = NULL;
    step->n_elems = len;
}

static void recv_describe(const struct cfx_op *op, uint64_t index, struct cfx_prim_step *step)
{
    size_t offset, len;
    cfx_coll_chunk_of(op, index, &offset, &len);
    step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT;
    step->input = NULL;
    step->output = cfx_coll_at(op->recvbuff, offset, op->elem_bytes);
    step->n_elems = len;
}

const struct cfx_schedule cfx_p2p_send = {.n_steps = cfx_coll_chunk_steps,
                                          .describe = send_describe};
const struct cfx_schedule cfx_p2p_recv = {.n_steps = cfx_coll_chunk_steps,
                                          .describe = recv_describe};

/* ------------------------------------------------------------ one rank */

static uint64_t local_steps(const struct cfx_op *op)
{
    return op->count > 0 ? 1 : 0;
}

/* With one rank every collective is a copy (reduce-scatter and allgather of
 * one block, an average over one rank). */
static void local_describe(const struct cfx_op *op, uint64_t index, struct cfx_prim_step *step)
{
    (void)index;
    /* A PreMulSum over one rank still multiplies (the finish of cfxAvg,
     * a division by 1, is skipped). */
    step->flags = CFX_PRIM_OUT | (op->premul ? CFX_PRIM_AVG : 0);
    step->input = op->sendbuff;
    step->output = op->recvbuff;
    step->n_elems = op->count;
}

const struct cfx_schedule cfx_local_copy = {.n_steps = local_steps, .describe = local_describe};
