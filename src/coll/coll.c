/* Operation dispatch: picks the schedule and runs its ready steps. */
#include "kernels/reduce.h"
#include "src/coll/op.h"
#include "src/coll/schedule.h"

static const struct cfx_schedule *schedule_of(const struct cfx_op *op)
{
    if (op->nranks == 1 && op->kind != CFX_COLL_SEND && op->kind != CFX_COLL_RECV)
        return &cfx_local_copy;
    switch (op->kind) {
    case CFX_COLL_ALLREDUCE: return &cfx_ring_allreduce;
    case CFX_COLL_BROADCAST: return &cfx_chain_broadcast;
    case CFX_COLL_REDUCE: return &cfx_chain_reduce;
    case CFX_COLL_ALLGATHER: return &cfx_ring_allgather;
    case CFX_COLL_REDUCESCATTER: return &cfx_ring_reducescatter;
    case CFX_COLL_SEND: return &cfx_p2p_send;
    case CFX_COLL_RECV: return &cfx_p2p_recv;
    }
    return &cfx_local_copy;
}

const char *cfx_coll_name(enum cfx_coll_kind kind)
{
    switch (kind) {
    case CFX_COLL_ALLREDUCE: return "allreduce";
    case CFX_COLL_BROADCAST: return "broadcast";
    case CFX_COLL_REDUCE: return "reduce";
    case CFX_COLL_ALLGATHER: return "allgather";
    case CFX_COLL_REDUCESCATTER: return "reducescatter";
    case CFX_COLL_SEND: return "send";
    case CFX_COLL_RECV: return "recv";
    }
    return "?";
}

void cfx_coll_prepare(struct cfx_op *op)
{
    op->elem_bytes = cfx_type_size(op->type);
    /* A slot holds whole elements; one rank copies in a single step. */
    size_t slot_bytes = op->send_conn ? op->send_conn->slot_bytes
                        : op->recv_conn ? op->recv_conn->slot_bytes
                                        : op->count * op->elem_bytes;
    op->chunk_elems = slot_bytes / op->elem_bytes;
    if (op->chunk_elems == 0)
        op->chunk_elems = 1;
    op->step = 0;
    op->n_steps = schedule_of(op)->n_steps(op);
    op->done = op->n_steps == 0;
    op->result = cfxSuccess;
}

int cfx_coll_progress(struct cfx_op *op)
{
    const struct cfx_schedule *schedule = schedule_of(op);
    int ran = 0;
    while (op->step < op->n_steps) {
        struct cfx_prim_step step;
        schedule->describe(op, op->step, &step);
        if (!cfx_prim_ready(op, &step))
            break;
        cfxResult_t res = cfx_prim_run(op, &step);
        if (res != cfxSuccess) {
            op->result = res;
            op->done = 1;
            return ran;
        }
        op->step++;
        ran++;
    }
    if (op->step == op->n_steps)
        op->done = 1;
    return ran;
}
