/*
 * A collective or point-to-point operation as the core describes it and the
 * host executor tracks it: buffers, shape, the connectors it moves data
 * through, the host's bookkeeping, and its progress. cfx_coll_prepare
 * compiles the description into the op's work descriptor (work.h: plain
 * data, what every executor's step loop reads); src/exec (above) drives
 * many operations at once. An operation never blocks: progress runs the
 * steps that are ready and returns.
 */
#ifndef CFX_COLL_OP_H
#define CFX_COLL_OP_H

#include <stddef.h>
#include <stdint.h>

#include "conflux.h"
#include "src/coll/work.h"
#include "transports/transport.h"

/* A rank's place in one tree, with the connectors of each edge. */
struct cfx_tree_links {
    int parent; /* -1 at the root. */
    int n_children;
    int children[CFX_TREE_MAX_CHILDREN];
    struct cfx_connector *to_parent;   /* Up: partial results. */
    struct cfx_connector *from_parent; /* Down: final results. */
    struct cfx_connector *to_child[CFX_TREE_MAX_CHILDREN];
    struct cfx_connector *from_child[CFX_TREE_MAX_CHILDREN];
};

/* A rank's connectors to and from every other rank, for the direct
 * allreduce (indexed by peer rank; NULL at this rank's own index). */
struct cfx_direct_links {
    struct cfx_connector *to[CFX_DIRECT_MAX_RANKS];
    struct cfx_connector *from[CFX_DIRECT_MAX_RANKS];
};

/* Where an operation's buffers live (enum cfx_mem_kind, transports/
 * transport.h) picks the executor that runs it (src/exec/exec.h). */

struct cfx_op {
    /* What (set by the caller). */
    enum cfx_coll_kind kind;
    const void *sendbuff;
    void *recvbuff;
    size_t count; /* Elements; per rank for allgather and reduce-scatter. */
    cfxDataType_t type;
    cfxRedOp_t op;
    /* cfxRedOpCreatePreMulSum: op is cfxAvg (reduce as a sum) and the
     * finish multiplies by the scalar, one element of type in premul_bits. */
    int premul;
    uint64_t premul_bits;
    int root; /* Broadcast/reduce root, or the peer of send/recv. */
    int rank;
    int nranks;
    struct cfx_connector *send_conn; /* To the next rank (or the peer). */
    struct cfx_connector *recv_conn; /* From the previous rank (or the peer). */
    /* Tree allreduce: this rank's links in the tree carrying this op (NULL: ring). */
    const struct cfx_tree_links *tree;
    /* Direct allreduce: this rank's all-pairs connectors (NULL: not direct). */
    const struct cfx_direct_links *direct;
    int twoshot; /* With direct: the two-shot schedule, not the one-shot. */
    /* The LL protocol (cfx_work.proto; src/conn/fifo.h): set alike on every
     * rank by the plan; connectors with LL slots carry LL words, and every
     * step is cut to what an LL slot holds. Ring and tree schedules only. */
    int ll;
    /* Allgather on the ring, single copy: slots carry addresses and each
     * rank reads the data from its predecessor's buffer (only where every
     * ring_recv is peer_readable; src/coll/pull.h). */
    int pull;
    /* Ring ops: which of the communicator's rings it runs on (0: ring_send
     * and ring_recv; c > 0: ring_more_send/recv[c - 1]). */
    int channel;
    /* Ring ops on a ring in another order than 0, 1, ..., n-1: the rank at
     * each position (cfx_work.ring) and the position of each rank; NULL:
     * position = rank. Set by the core with the channel. */
    const int32_t *ring_ranks;
    const int32_t *ring_pos;
    /* Allgather and reduce-scatter: elements from one rank's block to the
     * next in the n-block buffer; 0 means count. A channel's part of a call
     * has the call's count here (cfx_work.pitch). */
    size_t pitch;
    /* A send from a buffer registered with its connector's transport
     * (cfxCommRegister): the registration's handle there, and the
     * transport moves the data from the buffer itself (src/coll/p2p.h);
     * NULL: through the slots. */
    void *ref_handle;
    /* Point to point: the number of this operation's message on its
     * connector (cfx_connector.p2p_msgs at launch), which a transport with
     * post_at/offer uses to match a registered receive with its send. */
    uint64_t p2p_msg;
    /* Ring and chain collectives of host memory over a transport that moves
     * any host memory (CFX_TRANSPORT_FLAG_ANY_HOST_MEMORY): nonzero, the
     * key of this operation's slots (its sequence number with the top bit
     * set, alike on every rank), and steps that send final output send it
     * from the output itself (post_ref), marked with the key and their
     * offset in the output (post_at), so a receiver that offered its
     * output under the key takes them in place. 0: through the slots. */
    uint64_t coll_key;
    /* With coll_key, over a transport that moves registered memory only
     * (verbs): that transport, and the registrations (cfxCommRegister) with
     * it that hold the whole output and the whole input (NULL: none), so
     * final output and stable input go from where they are there too. */
    const struct cfx_transport *reg_transport;
    void *reg_out;
    void *reg_in;
    /* Peer table entries a slot was posted to by reference (post_ref): the
     * operation is done only once they are drained (cfx_coll_progress). */
    uint32_t ref_conns;
    enum cfx_mem_kind mem_kind; /* Of both buffers. */
    cfxStream_t stream;         /* The call's stream (NULL: the legacy stream / at once). */
    void *exec_state; /* The communicator's state in a stream executor (src/exec/cuda.h). */
    int n_conns;      /* Entries of conns (below). */
    const int *abort_flag;
    void *owner; /* The communicator (opaque below the core). */
    /* Mismatch detection: what this op stamps on the slots it sends and
     * expects on those it receives (kind: the sender's kind). */
    struct cfx_fingerprint print;
    struct cfx_fingerprint expect;
    int check_prints; /* Compare received fingerprints (CFX_CHECK_MISMATCH). */
    uint64_t record;  /* The owner's bookkeeping (flight recorder entry). */
    /* Called by the executor while the op is blocked (stalled_ns since its
     * last progress); an error fails the op. May be NULL. */
    cfxResult_t (*on_stall)(struct cfx_op *op, int64_t stalled_ns);
    int probe_sent;    /* on_stall's own state. */
    int spin_limit;    /* Idle polls before yielding (the owner knows if cores are scarce). */
    int64_t timeout_s; /* Longest wait without progress, s (0: forever; -1: CFX_TIMEOUT). */
    /* Progress (set by cfx_coll_prepare and cfx_coll_progress). */
    size_t elem_bytes;
    uint64_t step;
    uint64_t n_steps;
    uint64_t next_index; /* The step described in next; UINT64_MAX: none yet. */
    int claimed;         /* The executor's: the op holds all its connectors. */
    int done;
    cfxResult_t result;
    int blame_rank; /* On failure: the peer it failed through (-1: it began here). */
    /* Arrays, last: each is written before it is read (n_conns and
     * next_index say what is valid), so cfx_op_clear leaves them alone. */
    /* The peer table: every connector the op uses (claimed in issue order
     * by the executor); steps and work.links name them by index. */
    struct cfx_connector *conns[CFX_OP_MAX_CONNS];
    /* What the schedules read: the fields above as plain data, with the
     * algorithm's id and the links as indices into conns (cfx_coll_prepare). */
    struct cfx_work work;
    /* The step at index next_index as the schedule described it: an op
     * that waits polls its FIFOs without describing the step again. */
    struct cfx_step next;
};

/* Bytes from the start of an allgather's output (a reduce-scatter's
 * input) to the end of its last block: n blocks of count, or, for a
 * channel's part, n - 1 pitches and one count. Other kinds: count. */
static inline uint64_t cfx_op_blocks_bytes(const struct cfx_op *op, size_t elem_bytes)
{
    if (op->kind != CFX_COLL_ALLGATHER && op->kind != CFX_COLL_REDUCESCATTER)
        return (uint64_t)op->count * elem_bytes;
    uint64_t pitch = op->pitch ? op->pitch : op->count;
    return ((uint64_t)(op->nranks - 1) * pitch + op->count) * elem_bytes;
}

/* Zero every field of @p op but the arrays at its end (which are written
 * before they are read): what a new call starts from. Field by field, not
 * memset: a constant memset of this size compiles to rep stos on x86-64,
 * whose start-up alone cost ~6% of a tiny allreduce. Keep in step with the
 * struct. */
static inline void cfx_op_clear(struct cfx_op *op)
{
    op->kind = CFX_COLL_ALLREDUCE;
    op->sendbuff = NULL;
    op->recvbuff = NULL;
    op->count = 0;
    op->type = (cfxDataType_t)0;
    op->op = (cfxRedOp_t)0;
    op->premul = 0;
    op->premul_bits = 0;
    op->root = 0;
    op->rank = 0;
    op->nranks = 0;
    op->send_conn = NULL;
    op->recv_conn = NULL;
    op->tree = NULL;
    op->direct = NULL;
    op->twoshot = 0;
    op->ll = 0;
    op->pull = 0;
    op->channel = 0;
    op->ring_ranks = NULL;
    op->ring_pos = NULL;
    op->pitch = 0;
    op->ref_handle = NULL;
    op->p2p_msg = 0;
    op->coll_key = 0;
    op->reg_transport = NULL;
    op->reg_out = NULL;
    op->reg_in = NULL;
    op->ref_conns = 0;
    op->mem_kind = CFX_MEM_HOST;
    op->stream = NULL;
    op->exec_state = NULL;
    op->n_conns = 0;
    op->abort_flag = NULL;
    op->owner = NULL;
    op->print = (struct cfx_fingerprint){0};
    op->expect = (struct cfx_fingerprint){0};
    op->check_prints = 0;
    op->record = 0;
    op->on_stall = NULL;
    op->probe_sent = 0;
    op->spin_limit = 0;
    op->timeout_s = -1;
    op->elem_bytes = 0;
    op->step = 0;
    op->n_steps = 0;
    op->next_index = 0;
    op->claimed = 0;
    op->done = 0;
    op->result = cfxSuccess;
    op->blame_rank = 0;
}

/* Fill the work descriptor and the progress fields; an operation with
 * nothing to move is done at once. */
void cfx_coll_prepare(struct cfx_op *op);

/* Run every step that is ready; returns how many ran (0: blocked). Sets
 * op->done at the end. Never blocks, never allocates. */
int cfx_coll_progress(struct cfx_op *op);

/* The connector a blocked op waits on, with "data from" / "a free slot at"
 * for sentences; NULL when the op is not blocked on a connector. */
struct cfx_connector *cfx_coll_waiting_on(const struct cfx_op *op, const char **what_p);

/* "allreduce #12 float32 sum count 1024 root -1" into @p text. */
void cfx_coll_print_format(const struct cfx_fingerprint *print, char *text, size_t size);

/* Name for logs: "allreduce", ... */
const char *cfx_coll_name(enum cfx_coll_kind kind);

#endif /* CFX_COLL_OP_H */
