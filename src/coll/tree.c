/*
 * Tree allreduce: reduce up the tree, then broadcast down, one chunk per
 * slot. The core splits a call over the plan's two complementary trees (each
 * carries half of the data, as NCCL's double binary tree does) and runs both
 * halves together. Per chunk, a rank with m children runs:
 *   up:   m steps recv-reduce (into the output, which accumulates), the
 *         last one also sending the partial result to the parent (a leaf
 *         just sends its input); at the root the last step is final (and
 *         divides for cfxAvg)
 *   down: the root sends the result to each child; others receive it from
 *         the parent (forwarding to the first child in the same step) and
 *         send it on to the other children.
 * The whole up phase runs before the down phase, so in-place buffers are
 * safe: a rank's input is read only while going up.
 */
#include "src/coll/schedule.h"

static int up_steps(const struct cfx_tree_links *t)
{
    return t->n_children > 0 ? t->n_children : 1;
}

static int down_steps(const struct cfx_tree_links *t)
{
    if (t->parent < 0)
        return t->n_children;
    return t->n_children > 0 ? t->n_children : 1;
}

/* Chunks of the op; an empty op (a mismatch-check handshake) still has one. */
static uint64_t n_chunks(const struct cfx_op *op)
{
    uint64_t chunks = cfx_coll_chunk_steps(op);
    return chunks > 0 ? chunks : 1;
}

static uint64_t tree_steps(const struct cfx_op *op)
{
    uint64_t chunks = cfx_coll_chunk_steps(op);
    return chunks * (uint64_t)(up_steps(op->tree) + down_steps(op->tree));
}

static void tree_describe(const struct cfx_op *op, uint64_t index, struct cfx_prim_step *step)
{
    const struct cfx_tree_links *t = op->tree;
    uint64_t chunks = n_chunks(op);
    uint64_t up_total = chunks * (uint64_t)up_steps(t);
    int going_up = index < up_total;
    uint64_t local = going_up ? index : index - up_total;
    int per_chunk = going_up ? up_steps(t) : down_steps(t);
    uint64_t chunk = local / (uint64_t)per_chunk;
    int k = (int)(local % (uint64_t)per_chunk);
    size_t offset, len;
    cfx_coll_chunk_of(op, chunk, &offset, &len);
    const char *in = cfx_coll_at(op->sendbuff, offset, op->elem_bytes);
    char *out = cfx_coll_at(op->recvbuff, offset, op->elem_bytes);
    step->n_elems = len;
    step->output = out;
    if (going_up) {
        if (t->n_children == 0) {
            step->flags = CFX_PRIM_SEND;
            step->input = in;
            step->send = t->to_parent;
            return;
        }
        step->flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_OUT;
        step->recv = t->from_child[k];
        step->input = k == 0 ? in : out;
        if (k == t->n_children - 1) {
            if (t->parent >= 0) {
                step->flags |= CFX_PRIM_SEND;
                step->send = t->to_parent;
            } else if (op->op == cfxAvg) {
                step->flags |= CFX_PRIM_AVG;
            }
        }
        return;
    }
    if (t->parent < 0) {
        step->flags = CFX_PRIM_SEND;
        step->input = out;
        step->send = t->to_child[k];
        return;
    }
    if (k == 0) {
        step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT;
        step->recv = t->from_parent;
        step->input = NULL;
        if (t->n_children > 0) {
            step->flags |= CFX_PRIM_SEND;
            step->send = t->to_child[0];
        }
        return;
    }
    step->flags = CFX_PRIM_SEND;
    step->input = out;
    step->send = t->to_child[k];
}

const struct cfx_schedule cfx_tree_allreduce = {
    .n_steps = tree_steps,
    .describe = tree_describe,
};
