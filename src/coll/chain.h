/*
 * Chain schedules for rooted collectives: the ring order, cut open at the
 * root, pipelined one chunk at a time (r and root are positions on the
 * ring, as in ring.h).
 *   broadcast: root -> root+1 -> ... -> root-1; position p = r - root
 *     p = 0: copy-send; 0 < p < n-1: recv-copy-send; p = n-1: recv.
 *   reduce: root+1 -> ... -> root; position p = r - root - 1
 *     p = 0: send; 0 < p < n-1: recv-reduce-send; p = n-1 (root): recv-reduce-copy.
 */
#ifndef CFX_COLL_CHAIN_H
#define CFX_COLL_CHAIN_H

#include "src/coll/work.h"

static inline CFX_HOST_DEVICE void
cfx_chain_broadcast_describe(const struct cfx_work *w, uint64_t index, struct cfx_step *step)
{
    int n = w->nranks;
    int p = cfx_mod(w->rank - w->root, n);
    uint64_t offset, len;
    cfx_work_chunk_of(w, index, &offset, &len);
    if (p == 0)
        step->flags = CFX_PRIM_SEND | CFX_PRIM_OUT | CFX_PRIM_FINAL;
    else if (p < n - 1)
        step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT | CFX_PRIM_SEND | CFX_PRIM_FINAL;
    else
        step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT;
    step->input = cfx_coll_at(w->sendbuff, offset, w->elem_bytes);
    step->output = cfx_coll_at(w->recvbuff, offset, w->elem_bytes);
    step->n_elems = len;
}

static inline CFX_HOST_DEVICE void cfx_chain_reduce_describe(const struct cfx_work *w,
                                                             uint64_t index, struct cfx_step *step)
{
    int n = w->nranks;
    int p = cfx_mod(w->rank - w->root - 1, n);
    uint64_t offset, len;
    cfx_work_chunk_of(w, index, &offset, &len);
    if (p == 0)
        step->flags = CFX_PRIM_SEND;
    else if (p < n - 1)
        step->flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_SEND;
    else
        step->flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_OUT |
                      (w->redop == cfxAvg ? CFX_PRIM_AVG : 0);
    step->input = cfx_coll_at(w->sendbuff, offset, w->elem_bytes);
    step->output = cfx_coll_at(w->recvbuff, offset, w->elem_bytes);
    step->n_elems = len;
}

#define cfx_chain_broadcast_steps cfx_work_chunks
#define cfx_chain_reduce_steps    cfx_work_chunks

#endif /* CFX_COLL_CHAIN_H */
