/*
 * Primitives: one step of a schedule moves one slot. A step is described by
 * flags (receive a slot, combine it with local input, write the result to the
 * output, send a slot) and pointers; cfx_prim_ready tells whether its FIFOs
 * allow it to run now, and cfx_prim_run runs it whole. The named primitives of
 * the architecture are flag sets:
 *   send                    SEND                (input -> slot)
 *   recv                    RECV | OUT          (slot -> output)
 *   recv-reduce-send        RECV | REDUCE | SEND
 *   recv-reduce-copy        RECV | REDUCE | OUT
 *   recv-reduce-copy-send   RECV | REDUCE | OUT | SEND
 *   recv-copy-send          RECV | OUT | SEND
 *   copy-send               SEND | OUT          (input -> slot and output)
 * and, for the single-copy schedules, with slots that carry addresses:
 *   pull                    RECV | PULL | OUT   (peer's buffer -> output)
 *   pull-announce           RECV | PULL | OUT | SEND | ADDR
 *   announce                SEND | ADDR [| OUT] (input's address -> slot)
 */
#ifndef CFX_COLL_PRIMS_H
#define CFX_COLL_PRIMS_H

#include "src/coll/op.h"

/* The flags (CFX_PRIM_*) and struct cfx_step are in work.h. Connectors are
 * the op's peer table entries a step names by index. */

/* Whether connector @p conn carries @p op's slots as LL words: an LL op
 * (cfx_work.proto) over a connector with LL slots (src/conn/fifo.h). */
static inline int cfx_prim_ll(const struct cfx_op *op, const struct cfx_connector *conn)
{
    return op->work.proto == CFX_WORK_PROTO_LL && conn->view.ll != NULL;
}

/* Whether @p conn has @p op's next slot: an LL slot counted by its
 * producer's tail (its words may still be on the way: cfx_prim_run waits
 * for them), or a posted Simple slot. */
static inline int cfx_prim_can_take(const struct cfx_op *op, const struct cfx_connector *conn)
{
    if (cfx_prim_ll(op, conn))
        return cfx_load_relaxed_u64(conn->view.tail) > cfx_load_relaxed_u64(conn->view.head);
    return cfx_conn_can_take(conn);
}

/* Whether the step's FIFOs allow it to run now. Loads only; an executor
 * polls it while the op waits. */
static inline int cfx_prim_ready(const struct cfx_op *op, const struct cfx_step *step)
{
    if (step->flags & CFX_PRIM_RECV) {
        if (!cfx_prim_can_take(op, op->conns[step->recv]))
            return 0;
        for (int i = 0; i < step->n_recv_more; i++)
            if (!cfx_prim_can_take(op, op->conns[step->recv_more[i]]))
                return 0;
    }
    if ((step->flags & CFX_PRIM_SEND) && !cfx_conn_can_post(op->conns[step->send]))
        return 0;
    if ((step->flags & CFX_PRIM_DRAIN) && !cfx_conn_drained(op->conns[step->send]))
        return 0;
    return 1;
}

/* dst = src, the output of an operation of @p op_bytes in all: large ones
 * are written with non-temporal stores (read again only after the call, and
 * such stores skip reading each line before writing it). */
void cfx_prim_copy_out(char *restrict dst, const char *restrict src, size_t bytes, size_t op_bytes);

/* Runs a ready step. cfxInternalError if a received slot's size disagrees
 * with the schedule (the ranks disagree on the operation). */
cfxResult_t cfx_prim_run(struct cfx_op *op, const struct cfx_step *step);

#endif /* CFX_COLL_PRIMS_H */
