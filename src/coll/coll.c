/* Operation dispatch: picks the schedule and runs its ready steps. */
#include <stdio.h>

#include "kernels/reduce.h"
#include "src/coll/op.h"
#include "src/coll/schedule.h"

static const struct cfx_schedule *schedule_of(const struct cfx_op *op)
{
    if (op->nranks == 1 && op->kind != CFX_COLL_SEND && op->kind != CFX_COLL_RECV)
        return &cfx_local_copy;
    if (op->tree)
        return &cfx_tree_schedule;
    if (op->direct)
        return &cfx_direct_allreduce;
    if (op->pull)
        return &cfx_single_copy;
    switch (op->kind) {
    case CFX_COLL_ALLREDUCE: return &cfx_ring_allreduce;
    case CFX_COLL_BROADCAST: return &cfx_chain_broadcast;
    case CFX_COLL_REDUCE: return &cfx_chain_reduce;
    case CFX_COLL_ALLGATHER: return &cfx_ring_allgather;
    case CFX_COLL_REDUCESCATTER: return &cfx_ring_reducescatter;
    case CFX_COLL_SEND: return &cfx_p2p_send;
    case CFX_COLL_RECV: return &cfx_p2p_recv;
    case CFX_COLL_ALLTOALL:
    case CFX_COLL_GATHER:
    case CFX_COLL_SCATTER: break; /* Never an op's kind, only a fingerprint's. */
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
    case CFX_COLL_ALLTOALL: return "alltoall";
    case CFX_COLL_GATHER: return "gather";
    case CFX_COLL_SCATTER: return "scatter";
    }
    return "?";
}

void cfx_coll_prepare(struct cfx_op *op)
{
    op->elem_bytes = cfx_type_size(op->type);
    /* A slot holds whole elements; one rank copies in a single step. */
    size_t slot_bytes = op->count * op->elem_bytes;
    for (int i = 0; i < op->n_conns; i++)
        if (op->conns[i])
            slot_bytes = op->conns[i]->slot_bytes;
    if (op->pull)
        slot_bytes = CFX_PULL_CHUNK_BYTES; /* The data does not go through the slots. */
    op->chunk_elems = slot_bytes / op->elem_bytes;
    if (op->chunk_elems == 0)
        op->chunk_elems = 1;
    op->step = 0;
    op->n_steps = schedule_of(op)->n_steps(op);
    /* With mismatch checks on, even an empty operation trades one round of
     * empty slots, so a rank that called something else is caught. */
    if (op->n_steps == 0 && op->check_prints && schedule_of(op) != &cfx_local_copy) {
        size_t saved = op->count;
        op->count = 1;
        op->n_steps = schedule_of(op)->n_steps(op);
        op->count = saved;
    }
    op->next_index = UINT64_MAX;
    op->claimed = 0;
    op->done = op->n_steps == 0;
    op->result = cfxSuccess;
    op->blame_rank = -1;
}

int cfx_coll_progress(struct cfx_op *op)
{
    int ran = 0;
    while (op->step < op->n_steps) {
        struct cfx_prim_step *step = &op->next;
        if (op->next_index != op->step) {
            /* Field by field: recv_more is read only up to n_recv_more. */
            step->flags = 0;
            step->input = NULL;
            step->output = NULL;
            step->n_elems = 0;
            step->recv = op->recv_conn;
            step->send = op->send_conn;
            step->n_recv_more = 0;
            step->input_pos = 0;
            schedule_of(op)->describe(op, op->step, step);
            op->next_index = op->step;
        }
        if (!cfx_prim_ready(step))
            break;
        cfxResult_t res = cfx_prim_run(op, step);
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

struct cfx_connector *cfx_coll_waiting_on(const struct cfx_op *op, const char **what_p)
{
    if (op->done || op->step >= op->n_steps)
        return NULL;
    struct cfx_prim_step step = {.recv = op->recv_conn, .send = op->send_conn};
    schedule_of(op)->describe(op, op->step, &step);
    if ((step.flags & CFX_PRIM_RECV) && !cfx_conn_can_take(step.recv)) {
        *what_p = "data from";
        return step.recv;
    }
    for (int i = 0; (step.flags & CFX_PRIM_RECV) && i < step.n_recv_more; i++)
        if (!cfx_conn_can_take(step.recv_more[i])) {
            *what_p = "data from";
            return step.recv_more[i];
        }
    if ((step.flags & CFX_PRIM_SEND) && !cfx_conn_can_post(step.send)) {
        *what_p = "a free slot at";
        return step.send;
    }
    return NULL;
}

void cfx_coll_print_format(const struct cfx_fingerprint *print, char *text, size_t size)
{
    static const char *types[] = {"int8",    "uint8",   "int32",   "uint32",   "int64",  "uint64",
                                  "float16", "float32", "float64", "bfloat16", "f8e4m3", "f8e5m2"};
    static const char *ops[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
    if (!print->valid) {
        snprintf(text, size, "(no operation)");
        return;
    }
    char root[32] = "";
    if (print->root >= 0)
        snprintf(root, sizeof(root), " root %d", print->root);
    snprintf(text, size, "%s #%llu (%s%s%s, count %llu%s)",
             cfx_coll_name((enum cfx_coll_kind)print->kind), (unsigned long long)print->seq,
             print->type < 12 ? types[print->type] : "?", print->op < 6 ? " " : "",
             print->op < 6 ? ops[print->op] : "", (unsigned long long)print->count, root);
}
