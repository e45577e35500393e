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

#define CFX_PRIM_RECV   0x1u
#define CFX_PRIM_SEND   0x2u
#define CFX_PRIM_REDUCE 0x4u
#define CFX_PRIM_OUT    0x8u
#define CFX_PRIM_AVG    0x10u /* With OUT: divide the result by nranks. */
/* With RECV | REDUCE | OUT: fold the operands strictly left to right in the
 * order recv, recv_more[0], ..., with the local input inserted at position
 * input_pos, so ranks that list the same operands get bitwise identical
 * results. Without it the input comes second and the order is not promised. */
#define CFX_PRIM_ORDERED 0x20u
/* Single copy (a receive connector with peer_readable set). With RECV | OUT:
 * the slot holds the address of the step's data in the sender's memory;
 * read it from there into output. */
#define CFX_PRIM_PULL 0x40u
/* With SEND: post the address where the peer can read this step's data (the
 * output just pulled with RECV | PULL, else the input) instead of the data.
 * That buffer must stay unchanged until the peer has read it: the schedule
 * ends with a round that tells every rank its readers are done. */
#define CFX_PRIM_ADDR 0x80u

/* struct cfx_prim_step (op.h): one step, as a schedule describes it. */

/* Whether the step's FIFOs allow it to run now. Loads only; an executor
 * polls it while the op waits. */
static inline int cfx_prim_ready(const struct cfx_prim_step *step)
{
    if (step->flags & CFX_PRIM_RECV) {
        if (!cfx_conn_can_take(step->recv))
            return 0;
        for (int i = 0; i < step->n_recv_more; i++)
            if (!cfx_conn_can_take(step->recv_more[i]))
                return 0;
    }
    if ((step->flags & CFX_PRIM_SEND) && !cfx_conn_can_post(step->send))
        return 0;
    return 1;
}

/* Runs a ready step. cfxInternalError if a received slot's size disagrees
 * with the schedule (the ranks disagree on the operation). */
cfxResult_t cfx_prim_run(struct cfx_op *op, const struct cfx_prim_step *step);

#endif /* CFX_COLL_PRIMS_H */
