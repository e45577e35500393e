/*
 * The work descriptor: what one rank's part of one operation is, as every
 * executor sees it. Plain data of a fixed size (no host pointers into the
 * communicator, links by value, connectors named by a small index into the
 * operation's peer table), so the host executor reads it in place and a
 * CUDA executor copies it into a kernel's arguments as it is. The host's
 * bookkeeping of an operation (claims, stall hooks, the flight recorder)
 * stays in struct cfx_op (op.h), which holds one of these.
 *
 * A schedule (src/coll/schedules.h) turns a work descriptor and a step
 * index into a struct cfx_step: what that step moves where. Everything here
 * compiles as C and as CUDA (CFX_HOST_DEVICE, src/util/atomics.h).
 */
#ifndef CFX_COLL_WORK_H
#define CFX_COLL_WORK_H

#include <stddef.h>
#include <stdint.h>

#include "conflux.h"
#include "src/conn/fifo.h"

enum cfx_coll_kind {
    CFX_COLL_ALLREDUCE,
    CFX_COLL_BROADCAST,
    CFX_COLL_REDUCE,
    CFX_COLL_ALLGATHER,
    CFX_COLL_REDUCESCATTER,
    CFX_COLL_SEND,
    CFX_COLL_RECV,
    /* Run as sends and receives (kind SEND, RECV) whose fingerprints carry
     * these kinds, so a peer in another call is told apart. */
    CFX_COLL_ALLTOALL,
    CFX_COLL_GATHER,
    CFX_COLL_SCATTER,
};

#define CFX_TREE_MAX_CHILDREN 3

/* Most ranks the direct (one-shot) allreduce runs on: each rank holds a
 * connector to and from every other rank, and reduces all inputs in one step. */
#define CFX_DIRECT_MAX_RANKS 8
/* Slot size of the direct connectors (at most the communicator's slot size):
 * the algorithm is for small messages; larger ones go in several chunks. */
#define CFX_DIRECT_SLOT_BYTES ((size_t)64 << 10)

/* Entries of an operation's peer table (the direct allreduce's 2 per peer). */
#define CFX_OP_MAX_CONNS (2 * CFX_DIRECT_MAX_RANKS)

/* Connectors one reduction step reads at once. */
#define CFX_PRIM_MAX_RECV (CFX_DIRECT_MAX_RANKS - 1)

/* "No connector" in a link or a step. */
#define CFX_NO_CONN ((int8_t)-1)

/*
 * A rank's links for the operation, by value: indices into the peer table
 * (CFX_NO_CONN where absent). Each schedule reads the part it needs.
 */
struct cfx_links {
    int8_t send, recv; /* Ring, chain and point to point; the tree's relay. */
    /* Tree. */
    int8_t tree_root; /* 1 at the top of the tree. */
    int8_t n_children;
    int8_t to_parent, from_parent;
    int8_t to_child[CFX_TREE_MAX_CHILDREN], from_child[CFX_TREE_MAX_CHILDREN];
    /* Direct allreduce: by peer rank (CFX_NO_CONN at this rank's own). */
    int8_t to[CFX_DIRECT_MAX_RANKS], from[CFX_DIRECT_MAX_RANKS];
    /* Tree reduce at a call root below the tree root: slots of the relay
     * connector (how far its receives may lag its sends). */
    uint32_t relay_slots;
};

struct cfx_work {
    uint8_t algo;  /* enum cfx_sched (schedules.h): which schedule. */
    uint8_t kind;  /* enum cfx_coll_kind. */
    uint8_t type;  /* cfxDataType_t. */
    uint8_t redop; /* cfxRedOp_t (cfxAvg also for PreMulSum, see premul). */
    /* cfxRedOpCreatePreMulSum: reduce as a sum, then multiply by the scalar:
     * CFX_PREMUL_HOST, one element of type in premul_bits; CFX_PREMUL_DEVICE,
     * premul_bits holds the device address of that element, which the kernel
     * reads when the operation starts (cfxScalarDevice). */
    uint8_t premul;
    uint8_t check_prints; /* Compare received fingerprints (CFX_CHECK_MISMATCH). */
    uint8_t n_conns;      /* Entries of the peer table. */
    uint8_t proto;        /* enum cfx_work_proto: how its slots travel. */
    int32_t rank, nranks;
    int32_t root; /* Broadcast/reduce root, or the peer of send/recv. */
    uint32_t elem_bytes;
    uint64_t count; /* Elements; per rank for allgather and reduce-scatter. */
    /* Allgather and reduce-scatter: elements from the start of one rank's
     * block to the next one's in the n-block buffer (count, or the whole
     * call's count for the part of a call one channel moves). */
    uint64_t pitch;
    uint64_t chunk_elems; /* Elements per slot. */
    uint64_t n_steps;
    uint64_t premul_bits;
    const void *sendbuff;
    void *recvbuff;
    /* Ring and chain schedules on a ring in another order than 0, 1, ...,
     * n-1: rank and root above are positions on the ring, and ring[p] is
     * the rank at position p (whose block an allgather or reduce-scatter
     * step names: cfx_work_block_rank). NULL: positions are ranks. Host
     * memory, registered with CUDA for a GPU communicator's kernels. */
    const int32_t *ring;
    /* Mismatch detection: stamped on the slots sent, expected on those received. */
    struct cfx_fingerprint print, expect;
    struct cfx_links links;
};
CFX_STATIC_ASSERT(sizeof(struct cfx_work) == 184, "the work descriptor keeps its size");

/* Values of cfx_work.proto. LL (src/conn/fifo.h) only where every
 * connector of the operation has LL slots (cfx_conn.ll) and the step loop
 * runs it; never for single-copy schedules. */
enum cfx_work_proto {
    CFX_WORK_PROTO_SIMPLE = 0,
    CFX_WORK_PROTO_LL = 1,
};

/* Values of cfx_work.premul (0: no PreMulSum). */
#define CFX_PREMUL_HOST   1
#define CFX_PREMUL_DEVICE 2

/* Step flags: what one step does (the primitives of src/coll/prims.h). */
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
/* Single copy (a receive connector whose peer memory is readable). With
 * RECV | OUT: the slot holds the address of the step's data in the sender's
 * memory; read it from there into output. */
#define CFX_PRIM_PULL 0x40u
/* With SEND: post the address where the peer can read this step's data (the
 * output just pulled with RECV | PULL, else the input) instead of the data.
 * That buffer must stay unchanged until the peer has read it: the schedule
 * ends with a round that tells every rank its readers are done. */
#define CFX_PRIM_ADDR 0x80u
/* Alone: wait until the peer of the send connector has released every
 * slot posted to it (it is done reading the addresses they carried). */
#define CFX_PRIM_DRAIN 0x100u
/* With SEND (host executor): the transport takes the step's input from
 * where it is, a registered buffer (cfx_conn_post_ref), instead of a copy
 * in the slot; a device executor copies as for a plain send. */
#define CFX_PRIM_REF 0x200u
/* With SEND: the data sent is the operation's final output at
 * step->output (written by this step, or by an earlier one, and never
 * again), and every rank's output holds it at the same offset. The host
 * executor may then send it from there by reference over a transport that
 * moves any host memory (cfx_op.coll_key), and the receiver may take it in
 * place; other executors ignore it. */
#define CFX_PRIM_FINAL 0x400u
/* With SEND alone (no RECV, no REDUCE): the data sent is the operation's
 * input at step->input, and nothing this operation writes there before the
 * peer has received it (an in-place output there is the fold of what is
 * sent, so it can only come back after it arrived). The host executor may
 * send it by reference like a FINAL step, without the in-place mark: the
 * receiver reduces it out of its slot. */
#define CFX_PRIM_STABLE 0x800u

/* One step of a schedule: what it moves where. Connectors are indices into
 * the operation's peer table. */
struct cfx_step {
    uint32_t flags;
    int8_t recv; /* RECV: where from (default: links.recv). */
    int8_t send; /* SEND: where to (default: links.send). */
    /* RECV | REDUCE only: more connectors whose slots join the reduction
     * (a tree node with several children). */
    int8_t n_recv_more;
    int8_t input_pos; /* CFX_PRIM_ORDERED: where the input joins the fold (0..n_recv_more+1). */
    int8_t recv_more[CFX_PRIM_MAX_RECV - 1];
    const char *input; /* Local contribution (SEND without RECV, or REDUCE). */
    char *output;      /* Where OUT writes. */
    uint64_t n_elems;
};

/* The step a schedule starts from before it describes index i. */
static inline CFX_HOST_DEVICE void cfx_step_reset(const struct cfx_work *w, struct cfx_step *s)
{
    s->flags = 0;
    s->recv = w->links.recv;
    s->send = w->links.send;
    s->n_recv_more = 0;
    s->input_pos = 0;
    s->input = 0;
    s->output = 0;
    s->n_elems = 0;
}

/* ------------------------------------------------ helpers for schedules */

/* base + elems * elem_bytes, or NULL when base is NULL (unused buffers may be NULL). */
static inline CFX_HOST_DEVICE char *cfx_coll_at(const void *base, uint64_t elems,
                                                uint32_t elem_bytes)
{
    return base ? (char *)base + elems * elem_bytes : (char *)0;
}

/* (a mod n) for a possibly negative a. */
static inline CFX_HOST_DEVICE int cfx_mod(int a, int n)
{
    return ((a % n) + n) % n;
}

/* The rank whose block a ring step at position @p pos names (the user's
 * buffers hold blocks by rank; the ring counts positions). */
static inline CFX_HOST_DEVICE int cfx_work_block_rank(const struct cfx_work *w, int pos)
{
    return w->ring ? w->ring[pos] : pos;
}

static inline CFX_HOST_DEVICE uint64_t cfx_div_up(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b;
}

/* Chunked schedules: one step per chunk of chunk_elems. */
static inline CFX_HOST_DEVICE uint64_t cfx_work_chunks(const struct cfx_work *w)
{
    if (w->count <= w->chunk_elems) /* Small calls: no division. */
        return w->count > 0;
    return cfx_div_up(w->count, w->chunk_elems);
}

/* cfx_work_chunks, but at least one: an empty op (a mismatch-check
 * handshake of one round of empty slots) still has a chunk. */
static inline CFX_HOST_DEVICE uint64_t cfx_work_chunks_min1(const struct cfx_work *w)
{
    uint64_t chunks = cfx_work_chunks(w);
    return chunks > 0 ? chunks : 1;
}

static inline CFX_HOST_DEVICE void cfx_work_chunk_of(const struct cfx_work *w, uint64_t index,
                                                     uint64_t *offset_p, uint64_t *len_p)
{
    *offset_p = index * w->chunk_elems;
    uint64_t left = w->count - *offset_p;
    *len_p = left < w->chunk_elems ? left : w->chunk_elems;
}

/* Bytes a single-copy step reads at once (a chunk of the pipeline). */
#define CFX_PULL_CHUNK_BYTES ((size_t)1 << 20)
/* ... and a single-copy send (one read per chunk, nothing to forward, so
 * larger: 1 MiB chunks ran 25% slower than one read at 16 MiB messages). */
#define CFX_PULL_P2P_CHUNK_BYTES ((size_t)16 << 20)

#endif /* CFX_COLL_WORK_H */
