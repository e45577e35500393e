/*
 * A schedule names the primitive step an operation runs at each index. Each
 * algorithm file provides one: the number of steps, and the description of
 * step i. Every rank derives the same sequence from the same arguments.
 */
#ifndef CFX_COLL_SCHEDULE_H
#define CFX_COLL_SCHEDULE_H

#include "src/coll/prims.h"

struct cfx_schedule {
    uint64_t (*n_steps)(const struct cfx_op *op);
    void (*describe)(const struct cfx_op *op, uint64_t index, struct cfx_prim_step *step_p);
};

extern const struct cfx_schedule cfx_ring_allreduce;
extern const struct cfx_schedule cfx_tree_schedule; /* Allreduce, broadcast, reduce. */
extern const struct cfx_schedule cfx_direct_allreduce;
extern const struct cfx_schedule cfx_ring_allgather;
extern const struct cfx_schedule cfx_ring_reducescatter;
extern const struct cfx_schedule cfx_chain_broadcast;
extern const struct cfx_schedule cfx_chain_reduce;
extern const struct cfx_schedule cfx_p2p_send;
extern const struct cfx_schedule cfx_p2p_recv;
extern const struct cfx_schedule cfx_local_copy;  /* One rank: output = input. */
extern const struct cfx_schedule cfx_single_copy; /* Allgather: pull.c. */

/* Bytes a single-copy step reads at once (a chunk of the pipeline). */
#define CFX_PULL_CHUNK_BYTES ((size_t)1 << 20)

/* Chunked schedules (one step per chunk of op->chunk_elems). */
uint64_t cfx_coll_chunk_steps(const struct cfx_op *op);
void cfx_coll_chunk_of(const struct cfx_op *op, uint64_t index, size_t *offset_p, size_t *len_p);

/* base + elems * elem_bytes, or NULL when base is NULL (unused buffers may be NULL). */
static inline char *cfx_coll_at(const void *base, size_t elems, size_t elem_bytes)
{
    return base ? (char *)base + elems * elem_bytes : NULL;
}

/* (a mod n) for a possibly negative a. */
static inline int cfx_mod(int a, int n)
{
    return ((a % n) + n) % n;
}

static inline uint64_t cfx_div_up(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

#endif /* CFX_COLL_SCHEDULE_H */
