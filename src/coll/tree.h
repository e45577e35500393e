/*
 * Tree schedules: allreduce, broadcast and reduce over one of the plan's two
 * complementary trees. The core splits a call in two halves, one per tree
 * (NCCL's double binary tree), and runs both together. One chunk per slot;
 * every rank runs two phases, each over all chunks:
 *
 *   allreduce  up:   leaves send their input to the parent; inner ranks
 *                    receive every child's slot, reduce them with their
 *                    input and send the sum up (one step); the tree root
 *                    writes the result (and divides for cfxAvg)
 *              down: the tree root sends the result to each child; others
 *                    receive it from the parent, forwarding to the first
 *                    child in the same step, then send it to the others
 *   broadcast  fwd:  the call's root, when it is not the tree root, sends
 *                    its data to the tree root (over a dedicated connector)
 *              down: as for allreduce
 *   reduce     up:   as for allreduce, but the tree root sends the sum to the
 *                    call's root when that is another rank
 *              back: the call's root receives it (and divides for cfxAvg),
 *                    interleaved with its own up phase (reduce_root_phase)
 *
 * A rank's input is only read in the first phase and its output written in
 * the second (or by the tree root at the end of the first), and where the
 * two phases interleave a step writes only chunks whose input was read
 * before, so in-place buffers are safe.
 */
#ifndef CFX_COLL_TREE_H
#define CFX_COLL_TREE_H

#include "src/coll/work.h"

static inline CFX_HOST_DEVICE int cfx_tree_is_root(const struct cfx_work *w)
{
    return w->links.tree_root;
}

/* Steps per chunk in each phase, for this rank. */
static inline CFX_HOST_DEVICE void cfx_tree_phase_steps(const struct cfx_work *w, int *first_p,
                                                        int *second_p)
{
    const struct cfx_links *t = &w->links;
    int down = cfx_tree_is_root(w) ? t->n_children : (t->n_children > 0 ? t->n_children : 1);
    switch (w->kind) {
    case CFX_COLL_BROADCAST:
        /* The relay runs between the call's root and the tree root, when they differ. */
        *first_p = (w->rank == w->root) != cfx_tree_is_root(w) &&
                           (w->rank == w->root || cfx_tree_is_root(w))
                       ? 1
                       : 0;
        *second_p = down;
        break;
    case CFX_COLL_REDUCE:
        *first_p = 1;
        *second_p = w->rank == w->root && !cfx_tree_is_root(w) ? 1 : 0;
        break;
    default:
        *first_p = 1;
        *second_p = down;
        break;
    }
}

static inline CFX_HOST_DEVICE uint64_t cfx_tree_steps(const struct cfx_work *w)
{
    if (cfx_work_chunks(w) == 0)
        return 0; /* Empty: no steps (the core asks again with a handshake). */
    int first, second;
    cfx_tree_phase_steps(w, &first, &second);
    return cfx_work_chunks_min1(w) * (uint64_t)(first + second);
}

/* Up: children's slots reduced with the input, sent up (or kept at the top). */
static inline CFX_HOST_DEVICE void cfx_tree_describe_up(const struct cfx_work *w, const char *in,
                                                        char *out, struct cfx_step *step)
{
    const struct cfx_links *t = &w->links;
    step->input = in;
    step->output = out;
    if (t->n_children == 0) {
        step->flags = CFX_PRIM_SEND | CFX_PRIM_STABLE;
        step->send = t->to_parent;
        return;
    }
    step->flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE;
    step->recv = t->from_child[0];
    step->n_recv_more = t->n_children - 1;
    for (int c = 1; c < t->n_children; c++)
        step->recv_more[c - 1] = t->from_child[c];
    if (!cfx_tree_is_root(w)) {
        step->flags |= CFX_PRIM_SEND;
        step->send = t->to_parent;
    } else if (w->kind == CFX_COLL_REDUCE && w->root != w->rank) {
        step->flags |= CFX_PRIM_SEND;
        step->send = w->links.send; /* To the call's root. */
    } else {
        step->flags |= CFX_PRIM_OUT | (w->redop == cfxAvg ? CFX_PRIM_AVG : 0);
    }
}

/* Down: the result from the parent (or, at the top, the rank's own) to the children. */
static inline CFX_HOST_DEVICE void cfx_tree_describe_down(const struct cfx_work *w, int k,
                                                          const char *in, char *out,
                                                          struct cfx_step *step)
{
    const struct cfx_links *t = &w->links;
    step->output = out;
    if (cfx_tree_is_root(w)) {
        step->flags = CFX_PRIM_SEND | CFX_PRIM_FINAL;
        step->send = t->to_child[k];
        step->input = out;
        /* A broadcast from the tree root starts from its input. */
        if (k == 0 && w->kind == CFX_COLL_BROADCAST && w->root == w->rank) {
            step->flags |= CFX_PRIM_OUT;
            step->input = in;
        }
        return;
    }
    if (k == 0) {
        step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT;
        step->recv = t->from_parent;
        step->input = NULL;
        if (t->n_children > 0) {
            step->flags |= CFX_PRIM_SEND | CFX_PRIM_FINAL;
            step->send = t->to_child[0];
        }
        return;
    }
    step->flags = CFX_PRIM_SEND | CFX_PRIM_FINAL;
    step->input = out;
    step->send = t->to_child[k];
}

/* The call's root of a reduce that is not the tree root: sends its chunks up
 * and receives the results over the relay. Run one phase after the other, it
 * would deadlock once the op has more chunks than the relay FIFO has slots:
 * the tree root blocks on the full relay, so its subtrees stop taking slots,
 * so this rank's up phase never ends and it never empties the relay.
 * Interleaved instead: up(0 .. L-1), then up(c) and back(c - L) in turns,
 * then the last L backs, with the lag L at most the relay's depth, so the
 * tree root always has room for every chunk this rank has sent up. */
static inline CFX_HOST_DEVICE int cfx_tree_reduce_root_interleaved(const struct cfx_work *w)
{
    return w->kind == CFX_COLL_REDUCE && w->rank == w->root && !cfx_tree_is_root(w);
}

static inline CFX_HOST_DEVICE void cfx_tree_reduce_root_phase(const struct cfx_work *w,
                                                              uint64_t index, int *in_first_p,
                                                              uint64_t *chunk_p)
{
    uint64_t chunks = cfx_work_chunks_min1(w);
    uint64_t lag = w->links.relay_slots > 0 ? (uint64_t)w->links.relay_slots : 1;
    if (lag > chunks)
        lag = chunks;
    uint64_t pairs_end = lag + 2 * (chunks - lag);
    if (index < lag) {
        *in_first_p = 1;
        *chunk_p = index;
    } else if (index < pairs_end) {
        uint64_t j = index - lag;
        *in_first_p = j % 2 == 0;
        *chunk_p = lag + j / 2 - (*in_first_p ? 0 : lag);
    } else {
        *in_first_p = 0;
        *chunk_p = chunks - lag + (index - pairs_end);
    }
}

static inline CFX_HOST_DEVICE void cfx_tree_describe(const struct cfx_work *w, uint64_t index,
                                                     struct cfx_step *step)
{
    int first, second, in_first, k;
    uint64_t chunk;
    cfx_tree_phase_steps(w, &first, &second);
    if (cfx_tree_reduce_root_interleaved(w)) {
        cfx_tree_reduce_root_phase(w, index, &in_first, &chunk);
        k = 0;
    } else {
        uint64_t first_total = cfx_work_chunks_min1(w) * (uint64_t)first;
        in_first = index < first_total;
        uint64_t local = in_first ? index : index - first_total;
        int per_chunk = in_first ? first : second;
        chunk = local / (uint64_t)per_chunk;
        k = (int)(local % (uint64_t)per_chunk);
    }
    uint64_t offset, len;
    cfx_work_chunk_of(w, chunk, &offset, &len);
    const char *in = cfx_coll_at(w->sendbuff, offset, w->elem_bytes);
    char *out = cfx_coll_at(w->recvbuff, offset, w->elem_bytes);
    step->n_elems = len;
    step->n_recv_more = 0;
    if (w->kind == CFX_COLL_BROADCAST && in_first) {
        /* Relay from the call's root to the tree root. */
        step->output = out;
        if (w->rank == w->root) {
            step->flags = CFX_PRIM_SEND | CFX_PRIM_OUT | CFX_PRIM_FINAL;
            step->input = in;
            step->send = w->links.send;
        } else {
            step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT;
            step->input = NULL;
            step->recv = w->links.recv;
        }
        return;
    }
    if (w->kind == CFX_COLL_REDUCE && !in_first) {
        /* The call's root receives the result from the tree root. */
        step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT | (w->redop == cfxAvg ? CFX_PRIM_AVG : 0);
        step->input = NULL;
        step->output = out;
        step->recv = w->links.recv;
        return;
    }
    if (in_first)
        cfx_tree_describe_up(w, in, out, step);
    else
        cfx_tree_describe_down(w, k, in, out, step);
}

#endif /* CFX_COLL_TREE_H */
