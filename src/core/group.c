/*
 * Groups and launching. Between cfxGroupStart and cfxGroupEnd this thread's
 * operations are queued (in a per-thread array that only grows when a group
 * is larger than any before it); at the outermost cfxGroupEnd, or at once for
 * a call outside a group, the missing point-to-point connections are built
 * and one executor (src/exec/exec.h), picked by the memory the buffers live
 * in, runs the operations together. The array is freed
 * when its thread exits (a pthread key's destructor).
 */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cfx_build_config.h"
#include "kernels/reduce.h"
#include "src/core/blame.h"
#include "src/core/comm.h"
#include "src/core/enqueue.h"
#include "src/core/probe.h"
#include "src/exec/cuda.h"
#include "src/exec/exec.h"
#include "src/util/check.h"
#include "src/util/log.h"
#include "src/util/param.h"

CFX_PARAM_SIZE(zero_copy_min, "ZERO_COPY_MIN_BYTES", 64 << 10, 1, INT64_MAX,
               "Smallest send from a registered buffer (cfxCommRegister) that a transport "
               "moves from the buffer itself (verbs: the NIC reads it) instead of a copy in "
               "the FIFO");

static _Thread_local int group_depth;
static _Thread_local struct cfx_op *group_ops;
static _Thread_local int group_count;
static _Thread_local int group_capacity;
static _Thread_local cfxResult_t group_error;
static _Thread_local char group_error_text[CFX_ERROR_MAX];

/* Holds this thread's group_ops, so that the array goes with the thread. */
static pthread_key_t group_ops_key;
static pthread_once_t group_ops_key_once = PTHREAD_ONCE_INIT;
static int group_ops_key_made;

static void make_group_ops_key(void)
{
    group_ops_key_made = pthread_key_create(&group_ops_key, free) == 0;
}

int cfx_core_group_active(void)
{
    return group_depth > 0;
}

cfxResult_t cfx_core_group_add(const struct cfx_op *op)
{
    if (group_count == group_capacity) {
        int capacity = group_capacity ? group_capacity * 2 : 64;
        pthread_once(&group_ops_key_once, make_group_ops_key);
        if (!group_ops_key_made)
            return cfx_error_set(cfxSystemError, CFX_LOG_COLL,
                                 "cannot create the per-thread group key (too many pthread keys)");
        struct cfx_op *grown = realloc(group_ops, sizeof(*grown) * (size_t)capacity);
        if (grown == NULL)
            return cfx_error_set(cfxSystemError, CFX_LOG_COLL,
                                 "out of memory for a group of %d operations", capacity);
        group_ops = grown;
        pthread_setspecific(group_ops_key, grown);
        group_capacity = capacity;
    }
    group_ops[group_count++] = *op;
    return cfxSuccess;
}

void cfx_core_group_fail(cfxResult_t res)
{
    if (group_error == cfxSuccess) {
        group_error = res;
        snprintf(group_error_text, sizeof(group_error_text), "%s", cfx_error_thread_last());
    }
}

/* The executor of each memory kind (NULL: refused). The CUDA executor
 * registers for CFX_MEM_DEVICE here. */
static const struct cfx_executor *executors[CFX_MEM_KINDS] = {
    [CFX_MEM_HOST] = &cfx_exec_host,
#if CFX_HAVE_CUDA
    [CFX_MEM_DEVICE] = &cfx_exec_cuda,
#endif
};

const struct cfx_executor *cfx_core_exec_set(enum cfx_mem_kind kind,
                                             const struct cfx_executor *exec)
{
    assert(kind >= 0 && kind < CFX_MEM_KINDS);
    assert(exec == NULL || exec->version == CFX_EXEC_VERSION);
    const struct cfx_executor *old = executors[kind];
    executors[kind] = exec;
    return old;
}

static const char *api_name(enum cfx_coll_kind kind)
{
    switch (kind) {
    case CFX_COLL_ALLREDUCE: return "cfxAllReduce";
    case CFX_COLL_BROADCAST: return "cfxBroadcast";
    case CFX_COLL_REDUCE: return "cfxReduce";
    case CFX_COLL_ALLGATHER: return "cfxAllGather";
    case CFX_COLL_REDUCESCATTER: return "cfxReduceScatter";
    case CFX_COLL_SEND: return "cfxSend";
    case CFX_COLL_RECV: return "cfxRecv";
    case CFX_COLL_ALLTOALL: return "cfxAlltoAll";
    case CFX_COLL_GATHER: return "cfxGather";
    case CFX_COLL_SCATTER: return "cfxScatter";
    }
    return "?";
}

/* The one place an executor is chosen: by the memory kind of the batch's
 * buffers. One executor runs a whole batch (a group's operations depend on
 * each other), so a batch that mixes kinds is refused, as is a kind no
 * executor serves. */
static cfxResult_t choose_executor(const struct cfx_op *ops, int n_ops,
                                   const struct cfx_executor **exec_p)
{
    enum cfx_mem_kind kind = ops[0].mem_kind;
    for (int i = 1; i < n_ops; i++)
        if (ops[i].mem_kind != kind)
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                                 "cfxGroupEnd: the group mixes host and GPU buffers (%s and %s); "
                                 "one group runs on one executor, so group them separately",
                                 api_name(ops[0].kind), api_name(ops[i].kind));
    const struct cfx_executor *exec = executors[kind];
    if (exec == NULL)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                             "%s: GPU buffers are not supported by this build (no CUDA)",
                             api_name(ops[0].kind));
    for (int i = 0; i < n_ops && kind == CFX_MEM_DEVICE; i++)
        if (ops[i].exec_state == NULL)
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                                 "%s: GPU buffers on rank %d, a host rank (no CUDA context was "
                                 "current when it was initialised)",
                                 api_name(ops[i].kind), ops[i].rank);
    /* One kernel launch carries at most CFX_EXEC_CUDA_MAX_OPS; the ops on
     * a stream (of one communicator or several) go in several launches up
     * to CFX_EXEC_CUDA_MAX_GROUP_OPS. Host buffers on a stream go as one
     * host function on one stream. */
    for (int i = 0; i < n_ops; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = ops[j].stream == ops[i].stream;
        if (seen)
            continue; /* Counted with the stream's first op. */
        int on_stream = 0;
        for (int j = i; j < n_ops; j++)
            on_stream += ops[j].stream == ops[i].stream;
        if (kind == CFX_MEM_DEVICE && on_stream > CFX_EXEC_CUDA_MAX_GROUP_OPS)
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                                 "cfxGroupEnd: %d GPU operations on one stream, more than the %d "
                                 "a group may put on one stream: split the group",
                                 on_stream, CFX_EXEC_CUDA_MAX_GROUP_OPS);
        if (kind == CFX_MEM_HOST && ops[i].stream != ops[0].stream)
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                                 "cfxGroupEnd: host buffers on two streams in one group; a "
                                 "group of host buffers runs on one stream");
    }
    *exec_p = exec;
    return cfxSuccess;
}

/* The connector an operation runs on; point-to-point ones may not exist yet. */
static struct cfx_connector **send_slot(struct cfx_op *op)
{
    struct cfxComm *comm = op->owner;
    if (op->kind == CFX_COLL_SEND)
        return &comm->p2p_send[op->root];
    if (op->kind == CFX_COLL_RECV)
        return NULL;
    return op->channel > 0 ? &comm->ring_more_send[op->channel - 1] : &comm->ring_send;
}

static struct cfx_connector **recv_slot(struct cfx_op *op)
{
    struct cfxComm *comm = op->owner;
    if (op->kind == CFX_COLL_RECV)
        return &comm->p2p_recv[op->root];
    if (op->kind == CFX_COLL_SEND)
        return NULL;
    return op->channel > 0 ? &comm->ring_more_recv[op->channel - 1] : &comm->ring_recv;
}

static int already_requested(const struct cfx_conn_request *reqs, int n,
                             struct cfx_connector **out_p)
{
    for (int i = 0; i < n; i++)
        if (reqs[i].out_p == out_p)
            return 1;
    return 0;
}

/* The tree an op runs on (0 or 1). */
static int tree_index(const struct cfx_op *op)
{
    return (int)(op->tree - ((struct cfxComm *)op->owner)->trees);
}

static int root_of(const struct cfx_op *op)
{
    return op->kind == CFX_COLL_BROADCAST || op->kind == CFX_COLL_REDUCE ? op->root : -1;
}

/* Build the point-to-point, tree and direct connectors these operations need
 * (first use only). */
static cfxResult_t connect_missing(struct cfx_op *ops, int n_ops)
{
    int missing = 0;
    struct cfx_conn_request probe[CFX_CORE_TREE_REQUESTS + CFX_CORE_DIRECT_REQUESTS];
    for (int i = 0; i < n_ops; i++)
        if (ops[i].tree)
            missing += cfx_core_algo_tree_requests(ops[i].owner, tree_index(&ops[i]),
                                                   root_of(&ops[i]), probe);
        else if (ops[i].direct)
            missing += cfx_core_algo_direct_requests(ops[i].owner, probe);
    for (int i = 0; i < n_ops; i++) {
        if (ops[i].channel > 0) { /* A ring channel's first use. */
            missing += (*send_slot(&ops[i]) == NULL) + (*recv_slot(&ops[i]) == NULL);
            continue;
        }
        if (ops[i].kind != CFX_COLL_SEND && ops[i].kind != CFX_COLL_RECV)
            continue;
        struct cfx_connector **slot =
            ops[i].kind == CFX_COLL_SEND ? send_slot(&ops[i]) : recv_slot(&ops[i]);
        missing += *slot == NULL;
    }
    if (missing == 0)
        return cfxSuccess;
    struct cfx_conn_request *reqs = calloc((size_t)missing, sizeof(*reqs));
    if (reqs == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_P2P, "out of memory while connecting peers");
    int n = 0;
    for (int i = 0; i < n_ops; i++) {
        if (!ops[i].tree && !ops[i].direct)
            continue;
        struct cfx_conn_request mine[CFX_CORE_TREE_REQUESTS + CFX_CORE_DIRECT_REQUESTS];
        int k = ops[i].tree ? cfx_core_algo_tree_requests(ops[i].owner, tree_index(&ops[i]),
                                                          root_of(&ops[i]), mine)
                            : cfx_core_algo_direct_requests(ops[i].owner, mine);
        for (int j = 0; j < k; j++)
            if (!already_requested(reqs, n, mine[j].out_p)) {
                reqs[n] = mine[j];
                reqs[n++].op = &ops[i];
            }
    }
    for (int i = 0; i < n_ops; i++) {
        struct cfx_op *op = &ops[i];
        if (op->channel == 0)
            continue;
        struct cfxComm *comm = op->owner;
        struct cfx_connector **to = send_slot(op), **from = recv_slot(op);
        if (*to == NULL && !already_requested(reqs, n, to))
            reqs[n++] =
                (struct cfx_conn_request){.comm = comm,
                                          .peer = cfx_core_algo_ring_next(comm, op->channel),
                                          .dir = CFX_CONN_SEND,
                                          .kind = CFX_CONN_KIND_RING,
                                          .channel = op->channel,
                                          .out_p = to,
                                          .op = op};
        if (*from == NULL && !already_requested(reqs, n, from))
            reqs[n++] =
                (struct cfx_conn_request){.comm = comm,
                                          .peer = cfx_core_algo_ring_prev(comm, op->channel),
                                          .dir = CFX_CONN_RECV,
                                          .kind = CFX_CONN_KIND_RING,
                                          .channel = op->channel,
                                          .out_p = from,
                                          .op = op};
    }
    for (int i = 0; i < n_ops; i++) {
        struct cfx_op *op = &ops[i];
        if (op->kind != CFX_COLL_SEND && op->kind != CFX_COLL_RECV)
            continue;
        int sending = op->kind == CFX_COLL_SEND;
        struct cfx_connector **slot = sending ? send_slot(op) : recv_slot(op);
        if (*slot != NULL || already_requested(reqs, n, slot))
            continue;
        reqs[n++] = (struct cfx_conn_request){.comm = op->owner,
                                              .peer = op->root,
                                              .dir = sending ? CFX_CONN_SEND : CFX_CONN_RECV,
                                              .kind = CFX_CONN_KIND_P2P,
                                              .out_p = slot,
                                              .op = op};
    }
    cfxResult_t res = cfx_core_connect_batch(reqs, n);
    free(reqs);
    return res;
}

/* The index of @p tr in cfx_transports (registrations are kept by it), or -1. */
static int transport_index(const struct cfx_transport *tr)
{
    for (int t = 0; t < CFX_MAX_TRANSPORTS && cfx_transports[t] != NULL; t++)
        if (cfx_transports[t] == tr)
            return t;
    return -1;
}
/* How a send or receive of host memory moves: single copy (the receiver
 * reads the sender's buffer: src/coll/pull.h), where both sides decide
 * alike from its size and the threshold the receiver published at
 * connect; else, for a send from a registered buffer (any host buffer,
 * for a transport with CFX_TRANSPORT_FLAG_ANY_HOST_MEMORY), by reference
 * (the transport reads the buffer: src/coll/p2p.h), which the receiver
 * does not see, and a receive into one is offered to the transport (it
 * may write slots in place); else through the slots. */
static cfxResult_t choose_p2p_path(struct cfx_op *op)
{
    if (op->kind != CFX_COLL_SEND && op->kind != CFX_COLL_RECV)
        return cfxSuccess;
    struct cfx_connector *conn = *(op->kind == CFX_COLL_SEND ? send_slot(op) : recv_slot(op));
    if (conn == NULL)
        return cfxSuccess;
    /* Both sides number every operation of the pair, whatever its path. */
    op->p2p_msg = conn->p2p_msgs++;
    uint64_t bytes = (uint64_t)op->count * cfx_type_size(op->type), min;
    if (bytes == 0 || op->mem_kind != CFX_MEM_HOST)
        return cfxSuccess;
    CFX_CHECK(cfx_core_pull_threshold(op->owner, conn, &min));
    op->pull = min != CFX_PULL_NEVER && bytes >= min;
    /* Else, from (or into) a buffer registered with the connector's
     * transport, if it can move the data from (or into) it. */
    int t = transport_index(conn->transport);
    if (op->pull || t < 0 || bytes < (uint64_t)param_zero_copy_min())
        return cfxSuccess;
    int any = (conn->transport->flags & CFX_TRANSPORT_FLAG_ANY_HOST_MEMORY) != 0;
    if (op->kind == CFX_COLL_SEND && conn->transport->post_ref != NULL)
        op->ref_handle =
            any ? CFX_REG_ANY_HOST : cfx_core_reg_find(op->owner, t, op->sendbuff, bytes);
    if (op->kind == CFX_COLL_RECV && conn->transport->offer != NULL) {
        void *handle =
            any ? CFX_REG_ANY_HOST : cfx_core_reg_find(op->owner, t, op->recvbuff, bytes);
        if (handle != NULL)
            CFX_CHECK(cfx_conn_offer(conn, op->p2p_msg, op->recvbuff, bytes, handle));
    }
    return cfxSuccess;
}

/* Collectives of host memory whose final output travels (allreduce,
 * broadcast, allgather; ring, chain or tree) of at least
 * CFX_ZERO_COPY_MIN_BYTES: over a transport that moves any host memory,
 * steps that send final output (CFX_PRIM_FINAL) send it from the output
 * (src/coll/prims.c, by_ref), and this rank offers its output to each of
 * its receive connectors of such a transport under the operation's key,
 * so final slots from a peer land where the step would copy them (slots
 * that are not final carry no key and never match). The key: the
 * operation's sequence number, the half of a tree operation (the two
 * halves share the number), and the top bit, which keeps it apart from
 * the point-to-point message numbers; alike on every rank. Over a
 * transport that moves only registered memory (verbs) the same holds where
 * the user registered the output (offers, final sends) or the input (stable
 * sends) with cfxCommRegister. */
static void choose_coll_path(struct cfx_op *op)
{
    op->coll_key = 0;
    op->reg_transport = NULL;
    op->reg_out = NULL;
    op->reg_in = NULL;
    if ((op->kind != CFX_COLL_ALLREDUCE && op->kind != CFX_COLL_BROADCAST &&
         op->kind != CFX_COLL_ALLGATHER) ||
        op->mem_kind != CFX_MEM_HOST || op->pull || op->direct || op->nranks < 2)
        return;
    uint64_t out_bytes = cfx_op_blocks_bytes(op, cfx_type_size(op->type));
    if (out_bytes == 0 || out_bytes < (uint64_t)param_zero_copy_min())
        return;
    struct cfxComm *comm = op->owner;
    int half = op->tree != NULL && op->tree == &comm->trees[1];
    op->coll_key = op->print.seq | ((uint64_t)half << 62) | ((uint64_t)1 << 63);
    /* A transport that moves only registered memory (verbs): the user's
     * registrations with it of the whole output and input, if any. */
    for (int c = 0; c < op->n_conns && op->reg_transport == NULL; c++) {
        const struct cfx_transport *tr = op->conns[c] ? op->conns[c]->transport : NULL;
        int t = tr ? transport_index(tr) : -1;
        if (t < 0 || (tr->flags & CFX_TRANSPORT_FLAG_ANY_HOST_MEMORY) || tr->post_ref == NULL)
            continue;
        op->reg_transport = tr;
        op->reg_out = cfx_core_reg_find(comm, t, op->recvbuff, out_bytes);
        op->reg_in =
            cfx_core_reg_find(comm, t, op->sendbuff, (uint64_t)op->count * cfx_type_size(op->type));
    }
    for (int c = 0; c < op->n_conns; c++) {
        struct cfx_connector *from = op->conns[c];
        if (from == NULL || from->dir != CFX_CONN_RECV || from->transport->offer == NULL)
            continue;
        void *handle = (from->transport->flags & CFX_TRANSPORT_FLAG_ANY_HOST_MEMORY)
                           ? CFX_REG_ANY_HOST
                       : from->transport == op->reg_transport ? op->reg_out
                                                              : NULL;
        if (handle == NULL)
            continue;
        if (cfx_conn_offer(from, op->coll_key, op->recvbuff, out_bytes, handle) != cfxSuccess)
            CFX_INFO(CFX_LOG_COLL,
                     "%s on rank %d: rank %d's slots come through the FIFO (no offer)",
                     cfx_coll_name(op->kind), op->rank, from->peer_rank);
    }
}

/* Whether ops[i] is the first operation of its communicator in the batch. */
static int first_of_comm(const struct cfx_op *ops, int i)
{
    for (int j = 0; j < i; j++)
        if (ops[j].owner == ops[i].owner)
            return 0;
    return 1;
}

static void release_all(struct cfx_op *ops, int n_ops)
{
    for (int i = 0; i < n_ops; i++)
        if (first_of_comm(ops, i))
            cfx_core_release(ops[i].owner);
}

/* Claim every communicator of the group once (one call at a time per
 * communicator). The operations of a communicator destroyed since they were
 * queued are dropped (their header is still readable, see handle.c) and
 * *dropped_p counts them; the rest keep their order, *n_ops_p of them. A
 * communicator another thread is using fails the whole group: nothing is
 * claimed on return, and *n_ops_p is 0. */
static cfxResult_t claim_all(struct cfx_op *ops, int *n_ops_p, int *dropped_p)
{
    int n_ops = *n_ops_p, kept = 0;
    struct cfxComm *gone = NULL;
    for (int i = 0; i < n_ops; i++) {
        struct cfxComm *comm = ops[i].owner;
        int first = first_of_comm(ops, i);
        if (!first) {
            /* Claimed with its first operation, or dropped with it. */
            if (comm != gone && cfx_core_comm_live(comm))
                ops[kept++] = ops[i];
            continue;
        }
        cfxResult_t res = cfx_core_claim(comm, "cfxGroupEnd");
        if (res == cfxSuccess && !cfx_core_comm_live(comm)) {
            cfx_core_release(comm);
            res = cfxInvalidArgument;
        }
        if (res == cfxInvalidArgument) {
            gone = comm;
            continue;
        }
        if (res != cfxSuccess) {
            release_all(ops, kept);
            *n_ops_p = 0; /* Their sentences belong to the thread that holds them. */
            return res;
        }
        ops[kept++] = ops[i];
    }
    *dropped_p = n_ops - kept;
    *n_ops_p = kept;
    return cfxSuccess;
}

/* The operation of ops[@p i]'s communicator, at @p i or after it, that met
 * the failure (its blame_rank set: the peer it failed through, or this
 * rank), else @p i: in a group (a send and a receive, say) the one whose
 * connector failed says whom to blame, not the first of the batch. */
static int failed_op_of_comm(const struct cfx_op *ops, int n_ops, int i)
{
    for (int j = i; j < n_ops; j++)
        if (ops[j].owner == ops[i].owner && ops[j].blame_rank >= 0)
            return j;
    return i;
}

/* After a failure: every communicator of the batch is broken, its peers are
 * told (so they stop waiting), its flight recorder goes to the log, and its
 * ranks agree on the rank to blame (blame.c), which the sentence names. */
static cfxResult_t break_comms(struct cfx_op *ops, int n_ops, cfxResult_t res)
{
    char seen[CFX_ERROR_MAX];
    snprintf(seen, sizeof(seen), "%s", cfx_error_thread_last());
    int told = 0;
    cfxResult_t agreed = cfxSuccess; /* The first communicator's, after agreeing. */
    for (int i = 0; i < n_ops; i++) {
        struct cfxComm *comm = ops[i].owner;
        if (comm->async_error != cfxSuccess)
            continue;
        const struct cfx_op *failed = &ops[failed_op_of_comm(ops, n_ops, i)];
        cfxResult_t reason = failed->result != cfxSuccess ? failed->result : res;
        int blame = failed->blame_rank;
        comm->async_error = reason;
        cfx_core_poison_all(comm, reason, blame);
        if (comm->flight_size > 0)
            cfx_core_flight_dump(comm, cfxGetErrorString(reason));
        cfx_core_blame_tell(comm, reason, blame >= 0 ? blame : comm->rank);
        ops[i].blame_rank = CFX_BLAME_UNKNOWN; /* Told: agree below, once per communicator. */
        told++;
    }
    for (int i = 0; i < n_ops && told > 0; i++) {
        if (ops[i].blame_rank != CFX_BLAME_UNKNOWN)
            continue;
        char op_text[160];
        cfx_coll_print_format(&ops[i].print, op_text, sizeof(op_text));
        struct cfxComm *comm = ops[i].owner;
        comm->async_error = cfx_core_blame_explain(comm, comm->async_error, op_text, seen);
        if (agreed == cfxSuccess)
            agreed = comm->async_error;
    }
    return agreed == cfxSuccess ? res : agreed;
}

/* Number the operations (the collectives of a communicator; the messages
 * between two ranks, per direction) and enter them in the flight recorder,
 * at launch: an operation of a group that never ran took no number, so its
 * communicator stays in step with its peers. The second half of a tree
 * operation (on trees[1], queued right after its first half) shares the
 * first half's number and entry. */
static void stamp(struct cfx_op *ops, int n_ops)
{
    for (int i = 0; i < n_ops; i++) {
        struct cfx_op *op = &ops[i];
        struct cfxComm *comm = op->owner;
        if (op->tree == &comm->trees[1]) {
            assert(i > 0 && ops[i - 1].owner == comm && ops[i - 1].tree == &comm->trees[0]);
            op->print.seq = ops[i - 1].print.seq;
            op->record = ops[i - 1].record;
        } else if (op->kind == CFX_COLL_SEND) {
            op->print.seq = comm->p2p_send_seq[op->root]++;
        } else if (op->kind == CFX_COLL_RECV) {
            op->print.seq = comm->p2p_recv_seq[op->root]++;
        } else {
            op->print.seq = comm->coll_seq++;
        }
        op->expect.seq = op->print.seq;
        if (op->tree != &comm->trees[1])
            op->record = cfx_core_flight_record(comm, &op->print);
    }
}

/* Before running: slots of collectives that finished on this rank but still
 * wait in its FIFOs mean an earlier call was mismatched (probe.c). Each
 * communicator of the batch is looked at (consecutive ops of one only once). */
static cfxResult_t check_leftovers(struct cfx_op *ops, int n_ops)
{
    for (int i = 0; i < n_ops; i++) {
        if (i > 0 && ops[i].owner == ops[i - 1].owner)
            continue;
        if (ops[i].exec_state != NULL)
            continue; /* A GPU rank's kernels check every slot themselves. */
        int blame;
        cfxResult_t res = cfx_core_probe_leftovers(ops[i].owner, &blame);
        if (res != cfxSuccess) {
            ops[i].result = res;
            ops[i].blame_rank = blame;
            for (int j = 0; j < n_ops; j++)
                cfx_core_flight_update(ops[j].owner, ops[j].record, CFX_FLIGHT_FAILED, res, 0, 0);
            return break_comms(ops, n_ops, res);
        }
    }
    return cfxSuccess;
}

/* After a batch ran: its collectives have finished on this rank. */
static void settle(struct cfx_op *ops, int n_ops)
{
    for (int i = 0; i < n_ops; i++) {
        struct cfxComm *comm = ops[i].owner;
        if (ops[i].kind == CFX_COLL_SEND || ops[i].kind == CFX_COLL_RECV ||
            ops[i].print.seq < comm->coll_settled)
            continue;
        comm->coll_settled = ops[i].print.seq + 1;
        comm->settled_print = ops[i].print;
    }
}

/* A send to this rank itself completes only with a receive from itself in
 * the same launch (and the other way round): refuse a batch where the
 * counts differ, naming the first call without its match, before anything
 * runs. */
static cfxResult_t check_self_matches(const struct cfx_op *ops, int n_ops)
{
    for (int i = 0; i < n_ops; i++) {
        const struct cfxComm *comm = ops[i].owner;
        if ((ops[i].kind != CFX_COLL_SEND && ops[i].kind != CFX_COLL_RECV) ||
            ops[i].root != comm->rank)
            continue;
        int balance = 0, first = 1;
        for (int j = 0; j < n_ops; j++) {
            if (ops[j].owner != comm || ops[j].root != comm->rank)
                continue;
            if (ops[j].kind == CFX_COLL_SEND || ops[j].kind == CFX_COLL_RECV)
                balance += ops[j].kind == ops[i].kind ? 1 : -1;
            if (j < i && ops[j].kind == ops[i].kind)
                first = 0;
        }
        if (balance > 0 && first) {
            int sending = ops[i].kind == CFX_COLL_SEND;
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_P2P,
                                 "rank %d's %s rank %d, itself (%zu bytes) has no matching %s "
                                 "rank %d, itself in the same group, so it could never complete; "
                                 "a send to this rank and its receive must be in one group",
                                 comm->rank, sending ? "cfxSend to" : "cfxRecv from", comm->rank,
                                 ops[i].count * cfx_type_size(ops[i].type),
                                 sending ? "cfxRecv from" : "cfxSend to", comm->rank);
        }
    }
    return cfxSuccess;
}

static cfxResult_t complete(struct cfx_op *ops, int n_ops, cfxResult_t res);
static void host_batch_done(struct cfx_op *ops, int n_ops, cfxResult_t res);

cfxResult_t cfx_core_launch(struct cfx_op *ops, int n_ops)
{
    /* Local refusals first: they must not use up sequence numbers (stamp). */
    const struct cfx_executor *exec = NULL;
    cfxResult_t res = choose_executor(ops, n_ops, &exec);
    if (res != cfxSuccess)
        return res;
    res = check_self_matches(ops, n_ops);
    if (res != cfxSuccess)
        return res;
    stamp(ops, n_ops);
    res = check_leftovers(ops, n_ops);
    if (res != cfxSuccess)
        return res;
    res = connect_missing(ops, n_ops);
    for (int i = 0; i < n_ops && res == cfxSuccess; i++)
        res = choose_p2p_path(&ops[i]);
    if (res != cfxSuccess) {
        /* The peers were told; this rank's communicators cannot be trusted either. */
        for (int i = 0; i < n_ops; i++) {
            ops[i].blame_rank = -1;
            cfx_core_flight_update(ops[i].owner, ops[i].record, CFX_FLIGHT_FAILED, res, 0,
                                   ops[i].n_steps);
        }
        return break_comms(ops, n_ops, res);
    }
    for (int i = 0; i < n_ops; i++) {
        if (ops[i].tree || ops[i].direct) {
            if (ops[i].tree)
                cfx_core_algo_tree_op(ops[i].owner, tree_index(&ops[i]), &ops[i]);
            else
                cfx_core_algo_direct_op(ops[i].owner, &ops[i]);
            choose_coll_path(&ops[i]);
            cfx_coll_prepare(&ops[i]);
            cfx_core_flight_update(ops[i].owner, ops[i].record, CFX_FLIGHT_RUNNING, cfxSuccess, 0,
                                   ops[i].n_steps);
            continue;
        }
        struct cfx_connector **s = send_slot(&ops[i]), **r = recv_slot(&ops[i]);
        ops[i].send_conn = s ? *s : NULL;
        ops[i].recv_conn = r ? *r : NULL;
        cfx_core_algo_ring_order(ops[i].owner, &ops[i]);
        ops[i].n_conns = 0;
        if (ops[i].send_conn)
            ops[i].conns[ops[i].n_conns++] = ops[i].send_conn;
        if (ops[i].recv_conn)
            ops[i].conns[ops[i].n_conns++] = ops[i].recv_conn;
        choose_coll_path(&ops[i]);
        cfx_coll_prepare(&ops[i]);
        cfx_core_flight_update(ops[i].owner, ops[i].record, CFX_FLIGHT_RUNNING, cfxSuccess, 0,
                               ops[i].n_steps);
    }
    if (ops[0].mem_kind == CFX_MEM_HOST && ops[0].stream != NULL)
        return cfx_exec_cuda_host_enqueue(ops[0].stream, ops, n_ops, host_batch_done);
    if (ops[0].mem_kind == CFX_MEM_HOST)
        for (int i = 0; i < n_ops; i++)
            if (ops[i].exec_state != NULL && first_of_comm(ops, i)) {
                /* Host buffers at once: after the rank's work on streams. */
                res = cfx_exec_cuda_comm_quiesce(ops[i].exec_state);
                if (res != cfxSuccess)
                    return complete(ops, n_ops, res);
            }
    /* One indirect call per launch; the executor loops over the steps. */
    struct cfx_exec_batch batch;
    cfx_exec_batch_init(&batch, ops, n_ops, NULL);
    res = exec->launch(exec, &batch);
    if (batch.enqueued)
        return res;           /* On streams: the flight entries stay running until reaped. */
    if (res == cfxInProgress) /* Stream NULL: the call completes before it returns. */
        res = exec->wait(exec, &batch);
    return complete(ops, n_ops, res);
}

/* A batch of host buffers a stream ran (the host-batch thread of
 * src/exec/cuda, which must not call CUDA nor use the bootstrap a call may be using): the flight
 * recorder, and a failure handed to the rank's CUDA state, which the next
 * call surfaces (cfx_core_gpu_surface) as if a kernel had failed. */
static void host_batch_done(struct cfx_op *ops, int n_ops, cfxResult_t res)
{
    for (int i = 0; i < n_ops; i++) {
        int ok = ops[i].result == cfxSuccess && res == cfxSuccess;
        cfx_core_flight_update(ops[i].owner, ops[i].record,
                               ok ? CFX_FLIGHT_DONE : CFX_FLIGHT_FAILED, ops[i].result, ops[i].step,
                               ops[i].n_steps);
        if (!ok)
            cfx_exec_cuda_comm_fail(ops[i].exec_state,
                                    ops[i].result != cfxSuccess ? ops[i].result : res,
                                    ops[i].blame_rank >= 0 ? ops[i].blame_rank : ops[i].rank,
                                    &ops[i].print, cfx_error_thread_last());
    }
}

/* After a batch is over (a final result from its executor): the flight
 * recorder, and either the communicators' settled collectives or, after a
 * failure, broken communicators (and the result the ranks agreed on). A
 * launch on a stream will call this when its batch ends, after the call
 * returned. */
static cfxResult_t complete(struct cfx_op *ops, int n_ops, cfxResult_t res)
{
    for (int i = 0; i < n_ops; i++)
        cfx_core_flight_update(ops[i].owner, ops[i].record,
                               ops[i].result == cfxSuccess && res == cfxSuccess ? CFX_FLIGHT_DONE
                                                                                : CFX_FLIGHT_FAILED,
                               ops[i].result, ops[i].step, ops[i].n_steps);
    if (res != cfxSuccess)
        return break_comms(ops, n_ops, res);
    settle(ops, n_ops);
    return cfxSuccess;
}

CFX_API cfxResult_t cfxGroupStart(void)
{
    cfx_core_api_enter(NULL);
    group_depth++;
    return cfxSuccess;
}

CFX_API cfxResult_t cfxGroupEnd(void)
{
    cfx_core_api_enter(NULL);
    if (group_depth == 0)
        return cfx_core_api_exit(NULL, cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                                                     "cfxGroupEnd without cfxGroupStart"));
    if (--group_depth > 0)
        return cfxSuccess;
    cfxResult_t res = group_error;
    int n_ops = group_count;
    group_count = 0;
    group_error = cfxSuccess;
    if (res != cfxSuccess) {
        /* A call in the group was refused: run nothing, report it again. */
        res = cfx_error_set(res, CFX_LOG_COLL,
                            "cfxGroupEnd: a call in the group failed, so none ran: %s",
                            group_error_text);
    } else if (n_ops > 0) {
        int dropped = 0;
        res = claim_all(group_ops, &n_ops, &dropped);
        if (res == cfxSuccess && n_ops > 0) {
            res = cfx_core_launch(group_ops, n_ops);
            release_all(group_ops, n_ops);
        }
        if (res == cfxSuccess && dropped > 0)
            res = cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                                "cfxGroupEnd: %d operation(s) of the group were on a communicator "
                                "destroyed while the group was open; they were dropped, the "
                                "others ran",
                                dropped);
    }
    if (res != cfxSuccess)
        for (int i = 0; i < n_ops; i++)
            cfx_core_api_exit(group_ops[i].owner, res);
    return cfx_core_api_exit(NULL, res);
}

/* The group's time as cfxGroupSimulateEnd reports it (see conflux.h). */
static double simulate(const struct cfx_op *ops, int n_ops)
{
    double slowest = 0;
    for (int i = 0; i < n_ops; i++) {
        struct cfxComm *comm = ops[i].owner;
        if (!first_of_comm(ops, i) || !cfx_core_comm_live(comm))
            continue; /* Done with its first op; or destroyed while the group was open. */
        double coll = 0, sends = 0, recvs = 0;
        for (int j = i; j < n_ops; j++) {
            if (ops[j].owner != comm)
                continue;
            if (ops[j].tree == &comm->trees[1] || ops[j].channel > 0)
                continue; /* Priced with its first half, or its first ring's part. */
            struct cfx_op call = ops[j];
            if (call.tree == NULL && call.kind != CFX_COLL_SEND && call.kind != CFX_COLL_RECV)
                call.count = call.print.count; /* A ring's part: the whole call. */
            double us = cfx_core_algo_predict_us(comm, &call);
            if (ops[j].kind == CFX_COLL_SEND)
                sends += us;
            else if (ops[j].kind == CFX_COLL_RECV)
                recvs += us;
            else
                coll += us;
        }
        double total = coll + (sends > recvs ? sends : recvs);
        if (total > slowest)
            slowest = total;
    }
    return slowest;
}

CFX_API cfxResult_t cfxGroupSimulateEnd(cfxSimInfo_t *simInfo)
{
    const char *fn = "cfxGroupSimulateEnd";
    cfx_core_api_enter(NULL);
    if (simInfo == NULL || simInfo->magic != CFX_SIM_INFO_MAGIC ||
        simInfo->size < sizeof(cfxSimInfo_t))
        return cfx_core_api_exit(NULL, cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                                                     "%s: simInfo is %s; initialise it with "
                                                     "CFX_SIM_INFO_INITIALIZER",
                                                     fn, simInfo == NULL ? "NULL" : "not set up"));
    if (group_depth == 0)
        return cfx_core_api_exit(
            NULL, cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL, "%s without cfxGroupStart", fn));
    if (--group_depth > 0)
        return cfxSuccess; /* Nested: the outermost end simulates. */
    cfxResult_t res = group_error;
    int n_ops = group_count;
    group_count = 0;
    group_error = cfxSuccess;
    if (res != cfxSuccess)
        return cfx_core_api_exit(NULL, cfx_error_set(res, CFX_LOG_COLL,
                                                     "%s: a call in the group failed: %s", fn,
                                                     group_error_text));
    simInfo->estimatedTime = (float)simulate(group_ops, n_ops);
    CFX_INFO(CFX_LOG_COLL, "%s: %d operation(s), %.1f us predicted; none ran", fn, n_ops,
             (double)simInfo->estimatedTime);
    return cfx_core_api_exit(NULL, cfxSuccess);
}
