/*
 * Point-to-point schedules (send, receive: one slot per chunk) and the
 * one-rank schedule every collective reduces to when nranks is 1.
 */
#ifndef CFX_COLL_P2P_H
#define CFX_COLL_P2P_H

#include "src/coll/work.h"

/* ------------------------------------------------------ point to point */

static inline CFX_HOST_DEVICE void cfx_p2p_send_describe(const struct cfx_work *w, uint64_t index,
                                                         struct cfx_step *step)
{
    uint64_t offset, len;
    cfx_work_chunk_of(w, index, &offset, &len);
    step->flags = CFX_PRIM_SEND;
    step->input = cfx_coll_at(w->sendbuff, offset, w->elem_bytes);
    step->output = NULL;
    step->n_elems = len;
}

static inline CFX_HOST_DEVICE void cfx_p2p_recv_describe(const struct cfx_work *w, uint64_t index,
                                                         struct cfx_step *step)
{
    uint64_t offset, len;
    cfx_work_chunk_of(w, index, &offset, &len);
    step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT;
    step->input = NULL;
    step->output = cfx_coll_at(w->recvbuff, offset, w->elem_bytes);
    step->n_elems = len;
}

/* ------------------------------------------------------------ one rank */

static inline CFX_HOST_DEVICE uint64_t cfx_local_copy_steps(const struct cfx_work *w)
{
    return w->count > 0 ? 1 : 0;
}

/* With one rank every collective is a copy (reduce-scatter and allgather of
 * one block, an average over one rank). */
static inline CFX_HOST_DEVICE void cfx_local_copy_describe(const struct cfx_work *w, uint64_t index,
                                                           struct cfx_step *step)
{
    (void)index;
    /* A PreMulSum over one rank still multiplies (the finish of cfxAvg,
     * a division by 1, is skipped). */
    step->flags = CFX_PRIM_OUT | (w->premul ? CFX_PRIM_AVG : 0);
    step->input = (const char *)w->sendbuff;
    step->output = (char *)w->recvbuff;
    step->n_elems = w->count;
}

/* A send whose buffer the transport reads itself (host memory registered
 * with it, cfxCommRegister): the plain send's steps marked CFX_PRIM_REF,
 * then a drain (CFX_PRIM_DRAIN), so the buffer is the caller's again only
 * once every slot's payload has left. The receiver runs the plain receive. */
static inline CFX_HOST_DEVICE uint64_t cfx_ref_send_steps(const struct cfx_work *w)
{
    uint64_t chunks = cfx_work_chunks(w);
    return chunks > 0 ? chunks + 1 : 0;
}

static inline CFX_HOST_DEVICE void cfx_ref_send_describe(const struct cfx_work *w, uint64_t index,
                                                         struct cfx_step *step)
{
    if (index == cfx_work_chunks(w)) {
        step->flags = CFX_PRIM_DRAIN;
        return;
    }
    cfx_p2p_send_describe(w, index, step);
    step->flags |= CFX_PRIM_REF;
}

#define cfx_p2p_send_steps cfx_work_chunks
#define cfx_p2p_recv_steps cfx_work_chunks

#endif /* CFX_COLL_P2P_H */
