/*
 * Two-shot allreduce: a reduce-scatter by all pairs, then an allgather by
 * all pairs, over the direct allreduce's connectors (w->links.to/from).
 * The data is cut into n segments, rank r owning segment r (sizes differ by
 * at most one element). Rank r sends segment p of its input to rank p, folds
 * the n contributions to its own segment in rank order (as the one-shot
 * does, so every rank ends with bitwise identical results), and sends the
 * reduced segment to every peer, which copies it into its output. Two
 * hand-offs of latency, where the ring takes 2(n-1), and each rank sends
 * 2(n-1)/n x the data, as on the ring, where the one-shot sends n-1 x: the
 * algorithm for the sizes between the one-shot's and the ring's.
 *
 * Segments go in chunks of one slot; every rank runs C = chunks of the
 * largest segment rounds (a shorter segment's last chunks are empty) of
 * 3n-2 steps each:
 *   send segment p's chunk c to p = r+1, ..., r-1            (n-1 steps)
 *   recv-reduce own segment's chunk c from every peer         (1 step)
 *   send the reduced chunk c to p = r+1, ..., r-1            (n-1 steps)
 *   recv segment q's reduced chunk c from q = r+1, ..., r-1  (n-1 steps)
 * A connector holds at most two of this op's slots (a rank posts its next
 * round's first slot only after its peers' reduced chunks of this round
 * arrived), so any FIFO depth of two or more suffices. In place: a segment's
 * input is sent before the reduced segment is written over it, and each
 * round touches its own chunk only.
 */
#ifndef CFX_COLL_TWOSHOT_H
#define CFX_COLL_TWOSHOT_H

#include "src/coll/direct.h"
#include "src/coll/work.h"

/* Rank @p r's segment: its first element and its length. */
static inline CFX_HOST_DEVICE void cfx_twoshot_segment(const struct cfx_work *w, int r,
                                                       uint64_t *start_p, uint64_t *len_p)
{
    uint64_t n = (uint64_t)w->nranks, q = w->count / n, rem = w->count % n, ur = (uint64_t)r;
    *start_p = ur * q + (ur < rem ? ur : rem);
    *len_p = q + (ur < rem ? 1 : 0);
}

/* Chunk @p chunk of rank @p r's segment: its offset in the buffers (elements) and length. */
static inline CFX_HOST_DEVICE void cfx_twoshot_chunk(const struct cfx_work *w, int r,
                                                     uint64_t chunk, uint64_t *offset_p,
                                                     uint64_t *len_p)
{
    uint64_t start, len;
    cfx_twoshot_segment(w, r, &start, &len);
    uint64_t in = chunk * w->chunk_elems;
    if (in > len)
        in = len;
    uint64_t left = len - in;
    *offset_p = start + in;
    *len_p = left < w->chunk_elems ? left : w->chunk_elems;
}

/* Rounds: the chunks of the largest segment (none for an empty op: the core
 * asks again with a handshake). */
static inline CFX_HOST_DEVICE uint64_t cfx_twoshot_rounds(const struct cfx_work *w)
{
    if (w->count == 0)
        return 0;
    uint64_t largest = cfx_div_up(w->count, (uint64_t)w->nranks);
    return cfx_div_up(largest, w->chunk_elems);
}

static inline CFX_HOST_DEVICE uint64_t cfx_twoshot_allreduce_steps(const struct cfx_work *w)
{
    return cfx_twoshot_rounds(w) * (uint64_t)(3 * w->nranks - 2);
}

/* The @p k-th peer after this rank (k = 0..n-2). */
static inline CFX_HOST_DEVICE int cfx_twoshot_peer(const struct cfx_work *w, int k)
{
    int peer = w->rank + 1 + k; /* Below 2n: no division needed. */
    return peer >= w->nranks ? peer - w->nranks : peer;
}

static inline CFX_HOST_DEVICE void
cfx_twoshot_allreduce_describe(const struct cfx_work *w, uint64_t index, struct cfx_step *step)
{
    int n = w->nranks;
    uint64_t per_round = (uint64_t)(3 * n - 2);
    uint64_t chunk = index / per_round;
    int k = (int)(index % per_round);
    uint64_t offset, len;
    if (k < n - 1) { /* Reduce-scatter: this rank's input of the peer's segment. */
        int peer = cfx_twoshot_peer(w, k);
        cfx_twoshot_chunk(w, peer, chunk, &offset, &len);
        step->flags = CFX_PRIM_SEND;
        step->input = cfx_coll_at(w->sendbuff, offset, w->elem_bytes);
        step->n_elems = len;
        step->send = w->links.to[peer];
        return;
    }
    cfx_twoshot_chunk(w, w->rank, chunk, &offset, &len);
    if (k == n - 1) { /* Fold the own segment's n contributions in rank order. */
        step->flags = CFX_PRIM_RECV | CFX_PRIM_REDUCE | CFX_PRIM_OUT | CFX_PRIM_ORDERED |
                      (w->redop == cfxAvg ? CFX_PRIM_AVG : 0);
        step->input = cfx_coll_at(w->sendbuff, offset, w->elem_bytes);
        step->output = cfx_coll_at(w->recvbuff, offset, w->elem_bytes);
        step->n_elems = len;
        step->input_pos = (int8_t)w->rank; /* Ranks below this one come first. */
        cfx_direct_recv_from_all(w, step);
        return;
    }
    if (k < 2 * n - 1) { /* Allgather: the reduced own segment to every peer. */
        step->flags = CFX_PRIM_SEND;
        step->input = cfx_coll_at(w->recvbuff, offset, w->elem_bytes);
        step->n_elems = len;
        step->send = w->links.to[cfx_twoshot_peer(w, k - n)];
        return;
    }
    int peer = cfx_twoshot_peer(w, k - (2 * n - 1)); /* ... and theirs into the output. */
    cfx_twoshot_chunk(w, peer, chunk, &offset, &len);
    step->flags = CFX_PRIM_RECV | CFX_PRIM_OUT;
    step->output = cfx_coll_at(w->recvbuff, offset, w->elem_bytes);
    step->n_elems = len;
    step->recv = w->links.from[peer];
}

#endif /* CFX_COLL_TWOSHOT_H */
