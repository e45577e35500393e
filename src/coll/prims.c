/* Primitives: see prims.h. */
#include "src/coll/prims.h"

#include <string.h>

#include "kernels/reduce.h"
#include "src/util/error.h"
#include "src/util/log.h"

int cfx_prim_ready(const struct cfx_prim_step *step)
{
    if ((step->flags & CFX_PRIM_RECV) && !cfx_conn_can_take(step->recv))
        return 0;
    if ((step->flags & CFX_PRIM_SEND) && !cfx_conn_can_post(step->send))
        return 0;
    return 1;
}

cfxResult_t cfx_prim_run(struct cfx_op *op, const struct cfx_prim_step *step)
{
    unsigned flags = step->flags;
    size_t n = step->n_elems;
    size_t bytes = n * op->elem_bytes;
    const char *received = NULL;
    char *slot_out = NULL;
    if (flags & CFX_PRIM_RECV) {
        size_t got;
        const struct cfx_fingerprint *print;
        received = cfx_conn_take_slot(step->recv, &got, &print);
        if (op->check_prints && memcmp(print, &op->expect, sizeof(*print)) != 0) {
            char mine[160], theirs[160];
            cfx_coll_print_format(&op->expect, mine, sizeof(mine));
            cfx_coll_print_format(print, theirs, sizeof(theirs));
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                                 "mismatched operations: rank %d runs %s but rank %d sent data "
                                 "of %s; every rank must call the same collectives in the same "
                                 "order with the same count, type, op and root",
                                 op->rank, mine, step->recv->peer_rank, theirs);
        }
        if (got != bytes)
            return cfx_error_set(cfxInternalError, CFX_LOG_COLL,
                                 "%s: rank %d received %zu bytes from rank %d where the schedule "
                                 "expects %zu; the ranks disagree on the operation",
                                 cfx_coll_name(op->kind), op->rank, got, step->recv->peer_rank,
                                 bytes);
    }
    if (flags & CFX_PRIM_SEND)
        slot_out = cfx_conn_post_slot(step->send);

    /* The value this step produces: received (op) input, or one of them. */
    const char *value = received ? received : step->input;
    if (flags & CFX_PRIM_OUT) {
        if (flags & CFX_PRIM_REDUCE)
            cfx_reduce_host(step->output, received, step->input, n, op->type, op->op);
        else if (step->output != value && bytes)
            memcpy(step->output, value, bytes);
        if (flags & CFX_PRIM_AVG)
            cfx_reduce_avg_finish(step->output, step->output, n, op->type, op->nranks);
        value = step->output;
    }
    if (flags & CFX_PRIM_SEND) {
        if ((flags & CFX_PRIM_REDUCE) && !(flags & CFX_PRIM_OUT))
            cfx_reduce_host(slot_out, received, step->input, n, op->type, op->op);
        else if (bytes)
            memcpy(slot_out, value, bytes);
    }
    if (flags & CFX_PRIM_RECV)
        cfx_conn_release(step->recv);
    if (flags & CFX_PRIM_SEND)
        cfx_conn_post(step->send, bytes, &op->print);
    return cfxSuccess;
}
