/* Operation dispatch: compiles an op into its work descriptor and runs its
 * schedule's ready steps (src/coll/schedules.h). */
#include <stdio.h>
#include <string.h>

#include "kernels/reduce.h"
#include "src/coll/op.h"
#include "src/coll/prims.h"
#include "src/coll/schedules.h"

/* Which schedule runs @p op (the core's description picks it). */
static enum cfx_sched algo_of(const struct cfx_op *op)
{
    if (op->nranks == 1 && op->kind != CFX_COLL_SEND && op->kind != CFX_COLL_RECV)
        return CFX_SCHED_LOCAL_COPY;
    if (op->tree)
        return CFX_SCHED_TREE;
    if (op->direct)
        return op->twoshot ? CFX_SCHED_TWOSHOT_ALLREDUCE : CFX_SCHED_DIRECT_ALLREDUCE;
    if (op->ref_handle != NULL)
        return CFX_SCHED_REF_SEND;
    if (op->pull)
        return op->kind == CFX_COLL_SEND   ? CFX_SCHED_PULL_SEND
               : op->kind == CFX_COLL_RECV ? CFX_SCHED_PULL_RECV
                                           : CFX_SCHED_PULL_ALLGATHER;
    switch (op->kind) {
    case CFX_COLL_ALLREDUCE: return CFX_SCHED_RING_ALLREDUCE;
    case CFX_COLL_BROADCAST: return CFX_SCHED_CHAIN_BROADCAST;
    case CFX_COLL_REDUCE: return CFX_SCHED_CHAIN_REDUCE;
    case CFX_COLL_ALLGATHER: return CFX_SCHED_RING_ALLGATHER;
    case CFX_COLL_REDUCESCATTER: return CFX_SCHED_RING_REDUCESCATTER;
    case CFX_COLL_SEND: return CFX_SCHED_P2P_SEND;
    case CFX_COLL_RECV: return CFX_SCHED_P2P_RECV;
    case CFX_COLL_ALLTOALL:
    case CFX_COLL_GATHER:
    case CFX_COLL_SCATTER: break; /* Never an op's kind, only a fingerprint's. */
    }
    return CFX_SCHED_LOCAL_COPY;
}

/* Schedules that run on a ring's send and receive connectors. */
static int on_ring(int sched)
{
    return sched == CFX_SCHED_RING_ALLREDUCE || sched == CFX_SCHED_RING_ALLGATHER ||
           sched == CFX_SCHED_RING_REDUCESCATTER || sched == CFX_SCHED_CHAIN_BROADCAST ||
           sched == CFX_SCHED_CHAIN_REDUCE || sched == CFX_SCHED_PULL_ALLGATHER;
}

/* @p conn's index in the op's peer table (CFX_NO_CONN for NULL). */
static int8_t index_of(const struct cfx_op *op, const struct cfx_connector *conn)
{
    if (conn == NULL)
        return CFX_NO_CONN;
    for (int i = 0; i < op->n_conns; i++)
        if (op->conns[i] == conn)
            return (int8_t)i;
    return CFX_NO_CONN; /* Not in the table: the core did not attach it. */
}

/* The op's links by value, as indices into its peer table. */
static void fill_links(const struct cfx_op *op, struct cfx_links *links)
{
    /* Every index CFX_NO_CONN (all ones), then what this op has: a few
     * wide stores, on the path of every call. */
    memset(links, 0xff, sizeof(*links));
    links->tree_root = 0;
    links->n_children = 0;
    links->relay_slots = 0;
    links->send = index_of(op, op->send_conn);
    links->recv = index_of(op, op->recv_conn);
    if (op->tree) {
        const struct cfx_tree_links *t = op->tree;
        links->tree_root = t->parent < 0;
        links->n_children = (int8_t)t->n_children;
        links->to_parent = index_of(op, t->to_parent);
        links->from_parent = index_of(op, t->from_parent);
        for (int c = 0; c < t->n_children; c++) {
            links->to_child[c] = index_of(op, t->to_child[c]);
            links->from_child[c] = index_of(op, t->from_child[c]);
        }
        if (op->recv_conn)
            links->relay_slots = (uint32_t)op->recv_conn->n_steps;
    }
    if (op->direct) {
        for (int peer = 0; peer < op->nranks && peer < CFX_DIRECT_MAX_RANKS; peer++) {
            links->to[peer] = index_of(op, op->direct->to[peer]);
            links->from[peer] = index_of(op, op->direct->from[peer]);
        }
    }
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
    struct cfx_work *w = &op->work;
    op->elem_bytes = cfx_type_size(op->type);
    w->algo = (uint8_t)algo_of(op);
    w->kind = (uint8_t)op->kind;
    w->type = (uint8_t)op->type;
    w->redop = (uint8_t)op->op;
    w->premul = (uint8_t)op->premul;
    w->check_prints = (uint8_t)op->check_prints;
    w->n_conns = (uint8_t)op->n_conns;
    w->proto =
        op->ll && !op->pull && op->direct == NULL ? CFX_WORK_PROTO_LL : CFX_WORK_PROTO_SIMPLE;
    w->rank = op->rank;
    w->nranks = op->nranks;
    w->root = op->root;
    w->ring = NULL;
    if (op->ring_ranks != NULL && on_ring(w->algo)) { /* Positions, not ranks. */
        w->ring = op->ring_ranks;
        w->rank = op->ring_pos[op->rank];
        if (op->root >= 0 && op->root < op->nranks)
            w->root = op->ring_pos[op->root];
    }
    w->elem_bytes = (uint32_t)op->elem_bytes;
    w->count = op->count;
    w->pitch = op->pitch; /* 0: count (cfx_work_finish). */
    w->premul_bits = op->premul_bits;
    w->sendbuff = op->sendbuff;
    w->recvbuff = op->recvbuff;
    w->print = op->print;
    w->expect = op->expect;
    fill_links(op, &w->links);
    /* A slot holds whole elements; one rank copies in a single step. */
    uint64_t slot_bytes = (uint64_t)op->count * op->elem_bytes;
    for (int i = 0; i < op->n_conns; i++)
        if (op->conns[i])
            slot_bytes = op->conns[i]->slot_bytes;
    cfx_work_finish(w, slot_bytes);
    op->step = 0;
    op->ref_conns = 0;
    op->n_steps = w->n_steps;
    op->next_index = UINT64_MAX;
    op->claimed = 0;
    op->done = op->n_steps == 0;
    op->result = cfxSuccess;
    op->blame_rank = -1;
}

/* Every connector the op posted to by reference released its slots. */
static int refs_drained(const struct cfx_op *op)
{
    for (uint32_t left = op->ref_conns; left != 0; left &= left - 1)
        if (!cfx_conn_drained(op->conns[__builtin_ctz(left)]))
            return 0;
    return 1;
}

int cfx_coll_progress(struct cfx_op *op)
{
    int ran = 0;
    while (op->step < op->n_steps) {
        struct cfx_step *step = &op->next;
        if (op->next_index != op->step) {
            cfx_schedule_describe(&op->work, op->step, step);
            op->next_index = op->step;
        }
        if (!cfx_prim_ready(op, step))
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
    /* Slots sent from the user's buffers by reference must have left
     * before the buffers are the caller's again. */
    if (op->step == op->n_steps && refs_drained(op))
        op->done = 1;
    return ran;
}

struct cfx_connector *cfx_coll_waiting_on(const struct cfx_op *op, const char **what_p)
{
    if (op->done)
        return NULL;
    for (uint32_t left = op->ref_conns; op->step >= op->n_steps && left != 0; left &= left - 1)
        if (!cfx_conn_drained(op->conns[__builtin_ctz(left)])) {
            *what_p = "the end of the sends from this rank's buffers to";
            return op->conns[__builtin_ctz(left)];
        }
    if (op->step >= op->n_steps)
        return NULL;
    struct cfx_step step;
    cfx_schedule_describe(&op->work, op->step, &step);
    if ((step.flags & CFX_PRIM_RECV) && !cfx_prim_can_take(op, op->conns[step.recv])) {
        *what_p = "data from";
        return op->conns[step.recv];
    }
    for (int i = 0; (step.flags & CFX_PRIM_RECV) && i < step.n_recv_more; i++)
        if (!cfx_prim_can_take(op, op->conns[step.recv_more[i]])) {
            *what_p = "data from";
            return op->conns[step.recv_more[i]];
        }
    if ((step.flags & CFX_PRIM_SEND) && !cfx_conn_can_post(op->conns[step.send])) {
        *what_p = "a free slot at";
        return op->conns[step.send];
    }
    if ((step.flags & CFX_PRIM_DRAIN) && !cfx_conn_drained(op->conns[step.send])) {
        *what_p = "the end of the reads of this rank's buffer by";
        return op->conns[step.send];
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
