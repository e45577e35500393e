/*
 * The communicator: who the ranks are, where they live, and the bootstrap
 * that connects them. Later layers (transports, plans) hang their state here.
 */
#ifndef CFX_CORE_COMM_H
#define CFX_CORE_COMM_H

#include <stdatomic.h>
#include <stdint.h>

#include "conflux.h"
#include "src/bootstrap/bootstrap.h"
#include "src/coll/op.h"
#include "src/util/error.h"
#include "src/util/host.h"
#include "src/util/time.h"
#include "transports/transport.h"

#define CFX_MAX_TRANSPORTS 8

#define CFX_COMM_MAGIC UINT64_C(0x434658434f4d4d31) /* "CFXCOMM1" */
#define CFX_COMM_DEAD  UINT64_C(0xdeadc0ffeedeadc0)

/* Collectives whose algorithm or protocol the plan chooses per call:
 * allreduce, broadcast and reduce (algorithm and protocol), allgather and
 * reduce-scatter (protocol: they run on the ring), the first values of
 * enum cfx_coll_kind. */
#define CFX_CORE_ALGO_KINDS 5

/* Rings a GPU communicator may split a large ring collective over, and the
 * least bytes a channel then carries (below that, fewer channels: a small
 * call keeps the latency of one). */
#define CFX_RING_CHANNELS          16
#define CFX_RING_CHANNEL_MIN_BYTES ((size_t)256 * 1024)

/* Allgather between threads of one process: the least bytes per rank
 * that take the single-copy path by default (CFX_SINGLE_COPY_MIN_BYTES=-1;
 * never between processes, where the FIFO ran faster from 2 MiB per rank,
 * docs/performance.md). */
#define CFX_SINGLE_COPY_THREADS_MIN ((uint64_t)1 << 20)

/* Point to point between threads of one process: the smallest send the
 * receiver copies straight from the sender's buffer by default
 * (CFX_P2P_SINGLE_COPY_MIN_BYTES=-1). Between processes the default is
 * never: process_vm_readv, which pins each page, ran 1.3-2.4x slower than
 * the FIFO's two copies (docs/performance.md). */
#define CFX_P2P_SINGLE_COPY_THREADS_MIN ((uint64_t)256 * 1024)

/* What every rank tells the others at init. Fixed size: it is all-gathered. */
struct cfx_peer_info {
    int32_t rank;
    int32_t cuda_dev; /* -1: host only. */
    int32_t pid;
    uint32_t pid_ns; /* Inode of its PID namespace (0: unknown): pids compare only within one. */
    uint64_t host_hash;
    char host_id[CFX_HOST_ID_MAX];
    /* Where the rank sits on its host (locate.c): its GPU's PCI bus id ("":
     * none), and its nearest network port (name "" and index -1: none). */
    char busid[CFX_TRANSPORT_BUSID_MAX];
    char nic_name[CFX_TRANSPORT_NIC_NAME_MAX];
    int32_t nic_index;
    int32_t nic_path; /* enum cfx_path_class from its GPU to that port; -1: host rank, unknown. */
};

/* One operation in the flight recorder. */
enum cfx_flight_state { CFX_FLIGHT_QUEUED, CFX_FLIGHT_RUNNING, CFX_FLIGHT_DONE, CFX_FLIGHT_FAILED };
struct cfx_flight_entry {
    struct cfx_fingerprint print;
    enum cfx_flight_state state;
    cfxResult_t result;
    uint64_t start_ticks; /* cfx_time_ticks of the communicator's flight_origin. */
    uint64_t end_ticks;   /* 0 until the operation ends. */
    uint64_t step;
    uint64_t n_steps;
};

/* A reduction of cfxRedOpCreatePreMulSum: the sum times a scalar. */
struct cfx_core_premul {
    int in_use;
    cfxDataType_t type;
    int premul;           /* CFX_PREMUL_HOST or CFX_PREMUL_DEVICE (src/coll/work.h). */
    uint64_t scalar_bits; /* HOST: one element of type, in its low bytes; DEVICE: its address. */
};

/* A buffer of cfxCommRegister (no transport uses it yet). */
struct cfx_core_reg {
    void *buff;
    size_t size;
    enum cfx_mem_kind mem;
    int device;
    /* Per transport (index of cfx_transports): registered there (reg_mem),
     * and its handle. */
    uint8_t on[CFX_MAX_TRANSPORTS];
    void *handles[CFX_MAX_TRANSPORTS];
    struct cfx_core_reg *next;
};

/* Release the records of cfxCommRegister (comm_free, after every
 * transport let go of them: cfx_core_reg_release). */
void cfx_core_reg_free_all(struct cfxComm *comm);

/* Register @p reg with transport @p t, whose context exists (cfxCommRegister,
 * and connect.c when it makes a context after registrations): a transport
 * that cannot use that kind of memory is left out with an INFO line. */
cfxResult_t cfx_core_reg_with(struct cfxComm *comm, struct cfx_core_reg *reg, int t);

/* Every registration's handle with transport @p t released (before its fini). */
void cfx_core_reg_release(struct cfxComm *comm, int t);

/* The handle with transport @p t of a registration that holds the @p bytes
 * at @p buf; NULL if none does. */
void *cfx_core_reg_find(const struct cfxComm *comm, int t, const void *buf, size_t bytes);

struct cfxComm {
    uint64_t magic; /* CFX_COMM_MAGIC while alive (atomic: cfx_core_comm_live). */
    int rank;
    int nranks;
    int cuda_dev;
    int local_rank;   /* Index among the ranks of this host. */
    int local_nranks; /* Ranks on this host. */
    int abort_flag;   /* Set by cfxCommAbort; every wait polls it. */
    /* Set by cfxCommAbort and cfxCommRevoke: running operations end (the
     * executor polls it; the bootstrap keeps working after a revoke). */
    int stop_ops;
    int revoked; /* cfxCommRevoke: only shrink, split, destroy and abort follow. */
    int finalized;
    cfxResult_t async_error;
    int blocking;
    int split_count;
    struct cfx_bootstrap *bootstrap;
    struct cfx_peer_info *peers; /* nranks entries. */
    /* This rank's network ports as near as its nearest (peers[rank].nic_name
     * first), comma-separated, for transports that spread channels over
     * several (locate.c); "": none known. */
    char nic_near[CFX_TRANSPORT_NIC_NEAR_MAX];
    /* [nranks], made at the first failure notice read: 1 for each peer that
     * told this rank why it failed, so its later exit is not taken for the
     * cause (cfx_core_peer_dead). NULL until then. */
    uint8_t *noticed;
    /* Data path: built at init (ring) or at first use (point to point). */
    size_t slot_bytes;
    int n_steps;
    void *transport_ctx[CFX_MAX_TRANSPORTS]; /* Per transport, made on first use. */
    struct cfx_connector *ring_send;         /* To the next rank of ring 0. */
    struct cfx_connector *ring_recv;         /* From the previous one. */
    /* GPU ranks: more rings, channels 1..ring_channels-1 (the plan's
     * channel count within CFX_MIN/MAX_NCHANNELS), connected at their
     * first use; a large ring collective is split over them, one chain
     * (thread block team) each. 1 for host ranks. */
    int ring_channels;
    struct cfx_connector *ring_more_send[CFX_RING_CHANNELS - 1];
    struct cfx_connector *ring_more_recv[CFX_RING_CHANNELS - 1];
    /* The order of each ring (the plan's rings, CFX_RING_ORDER; algo.c):
     * ring_ranks[c * nranks + i] is the rank at position i of ring c, and
     * ring_pos[c * nranks + r] the position of rank r. Ring c's ops carry
     * the table when ring_permuted has bit c (a ring other than 0, 1, ...,
     * n-1); for a GPU communicator the tables are registered with CUDA
     * (ring_tables_pinned), as kernels read them. NULL when nranks < 2. */
    int32_t *ring_ranks;
    int32_t *ring_pos;
    uint32_t ring_permuted;
    int ring_tables_pinned;
    /* Allgathers of at least single_copy_min bytes (per rank) read
     * straight from the peer's buffer (src/coll/pull.h): every
     * rank's ring_recv is peer_readable and CFX_SINGLE_COPY is on (agreed at
     * init: all ranks or none). */
    int single_copy;
    size_t single_copy_min;
    /* Point to point: what this rank's receive connectors offer their
     * senders as the single-copy threshold (CFX_PULL_NEVER: none), where
     * they can read the sender's memory (connect.c publishes it): from a
     * rank of this process (a plain copy), and from a rank of another
     * (process_vm_readv). */
    uint64_t p2p_single_copy_min;
    uint64_t p2p_single_copy_min_far;
    /* Slot size of point-to-point FIFOs between host ranks of one host
     * over shm (CFX_P2P_LOCAL_BUFFSIZE / CFX_STEPS, at most slot_bytes). */
    size_t p2p_local_slot_bytes;
    /* Connection setup (connect.c): peers whose pid means a process here
     * (one host, one PID namespace), so that a pid gone later means a dead
     * rank; and the deadline of the batch being connected. */
    uint8_t *pid_watched;            /* [nranks] */
    int64_t connect_deadline_ns;     /* 0: none. */
    int connect_blame_rank;          /* Set by a failed connect_check: whom it is about. */
    struct cfx_connector **p2p_send; /* [nranks], NULL until first use. */
    struct cfx_connector **p2p_recv;
    /* Mismatch detection and the flight recorder. */
    int check_mismatch;
    int spin_limit;    /* Idle polls before yielding: fewer when ranks outnumber cores. */
    int64_t timeout_s; /* A call's longest wait without progress: config.timeout or CFX_TIMEOUT. */
    const char *timeout_name; /* Which of the two, for messages. */
    uint64_t coll_seq;        /* Collectives submitted so far. */
    /* Collectives numbered below coll_settled have finished on this rank (the
     * last of them: settled_print): a slot of one of them still waiting in a
     * FIFO was sent by a rank that called something else (probe.c). */
    uint64_t coll_settled;
    struct cfx_fingerprint settled_print;
    int64_t async_checked_ns;        /* When cfxCommGetAsyncError last asked the transports. */
    int async_peer_left;             /* A peer left: cfxCommGetAsyncError asks them no more. */
    uint64_t *p2p_send_seq;          /* [nranks]: messages sent to each peer. */
    uint64_t *p2p_recv_seq;          /* [nranks]: messages received from each peer. */
    struct cfx_flight_entry *flight; /* Ring of flight_mask + 1 (a power of two) entries. */
    int flight_size;                 /* Entries shown (CFX_FLIGHT_RECORDER); 0: off. */
    uint64_t flight_mask;
    struct cfx_time_ticks_origin flight_origin; /* Converts the entries' ticks. */
    uint64_t flight_count;                      /* Entries ever recorded. */
    /* Who uses the communicator (CFX_COMM_IDLE, _IN_CALL, _CLOSED, _INSPECTED): one call
     * at a time holds it (cfx_core_claim); destroy and abort close it. */
    int active_calls;
    int closing; /* Set once by the first cfxCommDestroy or cfxCommAbort. */
    /* Algorithm choice (algo.c): the plan, and this rank's links in its two trees. */
    struct cfx_plan *plan;
    /* The last choice of each collective the plan chooses for (allreduce,
     * broadcast, reduce): (bytes + 1) << 2 | algorithm, 0 when none. */
    _Atomic uint64_t algo_last[CFX_CORE_ALGO_KINDS];
    struct cfx_tree_links trees[2];
    /* Relays between a rooted call's root and a tree's root: [tree][peer]. */
    struct cfx_connector **relay_send[2];
    struct cfx_connector **relay_recv[2];
    /* Direct allreduce: connectors to and from every peer, built at init
     * (cfx_core_algo_connect) when the plan may use them. */
    struct cfx_direct_links direct;
    int direct_complete; /* Every connector of direct is built. */
    /* cfxRedOpCreatePreMulSum ops (redop.c): op cfxNumOps + i is premul[i]. */
    struct cfx_core_premul premul[CFX_MAX_PREMULSUM_OPS];
    /* cfxCommRegister's records (redop.c), newest first; freed at destroy. */
    struct cfx_core_reg *regs;
    /* Alltoall, gather, scatter (enqueue.c): room for their sends and
     * receives, 2 * nranks ops, allocated at the first such call. */
    struct cfx_op *batch_ops;
    /* A GPU rank's CUDA state (gpu.c, src/exec/cuda.h); NULL for a host rank. */
    struct cfx_cuda_comm *cuda;
    int gpu_poison_pending;  /* The watcher found a failure but could not tell the peers. */
    int gpu_shared;          /* Another rank of this process is on the same GPU. */
    uint64_t gpu_unreaped;   /* Flight entries from here on may be GPU work not yet seen done. */
    int64_t gpu_reaped_ns;   /* When a call last tried to reap (cfx_core_gpu_reap_soon) ... */
    uint64_t gpu_reap_tried; /* ... and flight_count then. */
    struct cfxComm *registry_next;
    struct cfxComm *quarantine_next; /* handle.c: destroyed headers, oldest first. */
    char name[64];
    char last_error[CFX_ERROR_MAX];
};

/* API entry/exit bookkeeping: clears this thread's error sentence, sets the
 * log rank; on failure copies the sentence into comm->last_error. */
void cfx_core_api_enter(cfxComm_t comm);
cfxResult_t cfx_core_api_exit(cfxComm_t comm, cfxResult_t res);

/* A connection this rank needs: built by cfx_core_connect_batch. */
struct cfx_conn_request {
    struct cfxComm *comm;
    int peer;
    enum cfx_conn_dir dir;
    int kind;                     /* CFX_CONN_KIND_*: keeps bootstrap tags apart. */
    int channel;                  /* 0..CFX_CONN_MAX_CHANNELS-1: so does this. */
    struct cfx_connector **out_p; /* Where the finished connector goes. */
    size_t slot_bytes;            /* FIFO slot size; 0: the communicator's. */
    const struct cfx_op *op;      /* The call that needs it at first use; NULL at init. */
    /* Filled while connecting. */
    struct cfx_connector *conn;
    int transport;
};

#define CFX_CONN_KIND_RING          1
#define CFX_CONN_KIND_P2P           2
#define CFX_CONN_KIND_TREE_UP(t)    (3 + 2 * (t))
#define CFX_CONN_KIND_TREE_DOWN(t)  (4 + 2 * (t))
#define CFX_CONN_KIND_RELAY_UP(t)   (7 + 2 * (t)) /* Call root -> tree root. */
#define CFX_CONN_KIND_RELAY_DOWN(t) (8 + 2 * (t)) /* Tree root -> call root. */
#define CFX_CONN_KIND_DIRECT        11            /* All pairs, direct allreduce. */

/* Build every requested connector (of one or several communicators): set up
 * and exchange connect info over each communicator's bootstrap, then connect
 * all send sides before any receive side, so no rank waits on another that
 * waits on it. Setup-time only. On failure nothing of the batch remains. */
cfxResult_t cfx_core_connect_batch(struct cfx_conn_request *reqs, int n_reqs);

/* The bootstrap tag of the connect info a side of direction @p dir sends
 * for a connection of @p kind (CFX_CONN_KIND_*) on @p channel: distinct for
 * every (kind, dir, channel), and never another message's tag of connect.c. */
uint32_t cfx_core_conn_tag(int kind, enum cfx_conn_dir dir, int channel);

/* Where ranks sit (locate.c), from a host topology (NULL: unknown). Fill
 * @p info's busid, nic_name and nic_index for a rank on CUDA device
 * @p cuda_dev (-1: a host rank) of this host. */
struct cfx_topo_system;
void cfx_core_locate_rank(const struct cfx_topo_system *sys, int cuda_dev,
                          struct cfx_peer_info *info);
/* This rank's network ports as near as the nearest cfx_core_locate_rank
 * names (the same path class from its GPU and, for a host rank, the same
 * speed), the nearest first, then in node order: "mlx5_0,mlx5_1" into
 * @p out (at most CFX_TRANSPORT_NIC_NEAR_MAX bytes; "" when none). */
void cfx_core_locate_near_nics(const struct cfx_topo_system *sys, int cuda_dev, char *out,
                               size_t size);
/* The path class from rank @p from to rank @p to, both described by the
 * peer table, as seen with @p sys (the host of @p from; NULL: unknown). */
enum cfx_path_class cfx_core_locate_path(const struct cfx_topo_system *sys,
                                         const struct cfx_peer_info *from,
                                         const struct cfx_peer_info *to);
/* This process's topology for the above (detected once; NULL if that failed). */
const struct cfx_topo_system *cfx_core_algo_topology(void);

/* Whether @p peer is a rank of this very process (threads). Pure. */
int cfx_core_same_process(const struct cfxComm *comm, int peer);

/* The slot size of a point-to-point connector to @p peer over a transport
 * that moves slots through memory both ranks map (connect.c asks for
 * those only): the local one (p2p_local_slot_bytes) between host ranks of
 * one host, else 0 (the communicator's). Pure. */
size_t cfx_core_p2p_slot_bytes(const struct cfxComm *comm, int peer);

/* This process's PID namespace, for cfx_peer_info.pid_ns (0: unknown). */
uint32_t cfx_core_pid_ns(void);
/* After the peer table is known at init: note which peers' processes this
 * one can see, so that connection setup notices when one dies. */
cfxResult_t cfx_core_peers_watch(struct cfxComm *comm);
/* After a failure: the rank whose death caused it, or -1. A rank a peer's
 * notice names comes first, then the first peer whose process is gone
 * (peers that sent a notice failed knowingly and are not taken for the
 * cause); looks again for up to @p grace_ms (a peer whose sockets closed
 * may still be on its way out). A failed look may replace this thread's
 * error sentence. */
int cfx_core_peer_dead(struct cfxComm *comm, int64_t grace_ms);

/* After init failed because rank @p dead died: tell every other live peer
 * (a notice, as a failed connect sends), so that a rank that fails after
 * this one left blames @p dead, not this rank's exit. Waits at most a
 * moment per peer. */
void cfx_core_tell_peers_dead(struct cfxComm *comm, int dead);

/* A point-to-point connector's single-copy threshold (*min_p, bytes;
 * CFX_PULL_NEVER: none), as its receive side published it at connect: a
 * send side whose receiver is still connecting waits for it, bounded by
 * the communicator's timeout, the abort flag and the peer's health. */
cfxResult_t cfx_core_pull_threshold(struct cfxComm *comm, struct cfx_connector *conn,
                                    uint64_t *min_p);

/* Close every connector and transport of a communicator. Never blocks. */
void cfx_core_disconnect_all(struct cfxComm *comm);

/* Algorithm choice (algo.c). Build the plan at init and make sure every
 * rank has the same one (without a plan, or when the ranks' plans differ,
 * every collective uses the ring); fails only when the bootstrap does. Free
 * it with the communicator (fini), or drop just the plan (fini_plan). */
cfxResult_t cfx_core_algo_init(struct cfxComm *comm);
void cfx_core_algo_fini_plan(struct cfxComm *comm);
void cfx_core_algo_fini(struct cfxComm *comm);
/* The schedule a call of @p bytes runs on: the trees (allreduce, broadcast,
 * reduce), the direct one-shot or two-shot allreduce, or the ring
 * (everything else); *ll_p set where the plan runs it in LL (GPU ranks:
 * alike on every rank, whatever each rank's buffers are).
 * A call of the same collective and size as the one before reuses its
 * choice without asking the planner. Never blocks, never allocates. */
enum cfx_core_algo {
    CFX_CORE_ALGO_RING,
    CFX_CORE_ALGO_TREE,
    CFX_CORE_ALGO_DIRECT,
    CFX_CORE_ALGO_TWOSHOT
};
/* The cost model's time (us) for @p op as queued (its algorithm, its size;
 * a send or receive as one hop); 0 without a plan or on one rank. */
double cfx_core_algo_predict_us(struct cfxComm *comm, const struct cfx_op *op);
enum cfx_core_algo cfx_core_algo_choose(struct cfxComm *comm, enum cfx_coll_kind kind, size_t bytes,
                                        int *ll_p);
/* The ring channels a ring op of @p kind, @p count and @p type runs on: 1,
 * or up to comm->ring_channels for allreduce, broadcast, reduce, allgather
 * and reduce-scatter of GPU communicators, one per CFX_RING_CHANNEL_MIN_BYTES
 * the ring moves (all blocks for allgather and reduce-scatter) and at most
 * one per 64-byte line of count (the same on every rank: arguments and
 * communicator only). */
int cfx_core_algo_ring_channels(const struct cfxComm *comm, enum cfx_coll_kind kind, size_t count,
                                cfxDataType_t type);
/* This rank's neighbours on ring @p channel (rank + 1 and rank - 1 before
 * cfx_core_algo_init ordered the rings). */
int cfx_core_algo_ring_next(const struct cfxComm *comm, int channel);
int cfx_core_algo_ring_prev(const struct cfxComm *comm, int channel);
/* Give a ring op the order of its channel's ring (op->ring_ranks and
 * ring_pos; NULL for a ring in rank order). */
void cfx_core_algo_ring_order(const struct cfxComm *comm, struct cfx_op *op);
/* Requests for the connectors a tree op of tree @p t rooted at @p root
 * (-1: none) still lacks; returns how many were written, at most
 * CFX_CORE_TREE_REQUESTS. */
#define CFX_CORE_TREE_REQUESTS (2 * (1 + CFX_TREE_MAX_CHILDREN) + 2)
int cfx_core_algo_tree_requests(struct cfxComm *comm, int t, int root,
                                struct cfx_conn_request *reqs);
/* Fill an op's tree links and connector list for tree @p t. */
void cfx_core_algo_tree_op(struct cfxComm *comm, int t, struct cfx_op *op);
/* Requests for the direct connectors (to and from every peer) @p comm still
 * lacks; returns how many were written, at most CFX_CORE_DIRECT_REQUESTS. */
#define CFX_CORE_DIRECT_REQUESTS (2 * (CFX_DIRECT_MAX_RANKS - 1))
int cfx_core_algo_direct_requests(struct cfxComm *comm, struct cfx_conn_request *reqs);
/* At init, after cfx_core_algo_init: build the direct connectors when the
 * plan may pick the direct allreduce (every rank decides alike). */
cfxResult_t cfx_core_algo_connect(struct cfxComm *comm);
/* Fill a direct op's links and connector list. */
void cfx_core_algo_direct_op(struct cfxComm *comm, struct cfx_op *op);

/* Mark every connector of @p comm failed with @p reason, about @p blame_rank
 * (-1: this rank), so peers stop waiting and can say whom it is about. */
void cfx_core_poison_all(struct cfxComm *comm, cfxResult_t reason, int blame_rank);

/* GPU ranks (gpu.c). gpu_setup: at init, once the peers are known, refuse
 * two ranks on one GPU (unless CFX_MULTI_RANK_GPU_ENABLE=1) and make a GPU
 * rank's CUDA state. gpu_surface: at the entry of a call (holding the
 * communicator), turn a failure the CUDA watcher recorded into the
 * communicator's error (the peers told, the ranks agreed on the blame);
 * returns comm->async_error. gpu_reap: mark the flight entries of GPU work
 * that has run as done. gpu_close: wait for the work, free the state. */
cfxResult_t cfx_core_gpu_setup(struct cfxComm *comm);
cfxResult_t cfx_core_gpu_surface(struct cfxComm *comm);
void cfx_core_gpu_reap(struct cfxComm *comm);
/* gpu_reap from an enqueue: at most every millisecond, or after half the
 * flight recorder's worth of calls (the event query and the capture-mode
 * exchanges around it are three driver calls a stream of calls need not
 * make each time). */
void cfx_core_gpu_reap_soon(struct cfxComm *comm);
void cfx_core_gpu_close(struct cfxComm *comm);

/* Flight recorder (flight.c). Record returns the entry's index. */
cfxResult_t cfx_core_flight_init(struct cfxComm *comm);
void cfx_core_flight_fini(struct cfxComm *comm);
uint64_t cfx_core_flight_record(struct cfxComm *comm, const struct cfx_fingerprint *print);
void cfx_core_flight_update(struct cfxComm *comm, uint64_t index, enum cfx_flight_state state,
                            cfxResult_t result, uint64_t step, uint64_t n_steps);
void cfx_core_flight_dump(struct cfxComm *comm, const char *why);
/* Live communicators, for the SIGUSR1 dump. */
void cfx_core_registry_add(struct cfxComm *comm);
void cfx_core_registry_remove(struct cfxComm *comm);

/* States of cfxComm.active_calls. */
#define CFX_COMM_IDLE    0
#define CFX_COMM_IN_CALL 1
#define CFX_COMM_CLOSED  2 /* Being destroyed, or destroyed: never leaves this state. */
/* Held for a moment by an inspector (cfxCommGetAsyncError, the CUDA
 * watcher): a call that finds it waits instead of being refused. */
#define CFX_COMM_INSPECTED 3

/* Whether @p comm (not NULL, and a header from cfx_core_handle_alloc or
 * garbage the caller passed) is a live communicator. */
static inline int cfx_core_comm_live(const struct cfxComm *comm)
{
    return __atomic_load_n(&comm->magic, __ATOMIC_ACQUIRE) == CFX_COMM_MAGIC;
}

/* The refusal of a claim that found @p state: cfxInvalidUsage naming the
 * rule (another call holds it) or cfxInvalidArgument (destroyed). */
cfxResult_t cfx_core_claim_refused(struct cfxComm *comm, int state, const char *fn);

/* A claim that found @p state: waits out an inspector, then claims; else
 * cfx_core_claim_refused. */
cfxResult_t cfx_core_claim_slow(struct cfxComm *comm, int state, const char *fn);

/* One call at a time per communicator: a call (a collective, its queueing in
 * a group, the launch of a group, split, finalize) claims a live
 * communicator before it touches its state and releases it when done; a
 * second claim meanwhile is refused with a sentence. One compare-and-swap,
 * nothing more on the per-call path. Destroy and abort wait for the holder
 * (after making its waits fail) and close the communicator for good. */
static inline cfxResult_t cfx_core_claim(struct cfxComm *comm, const char *fn)
{
    int state = CFX_COMM_IDLE;
    if (__atomic_compare_exchange_n(&comm->active_calls, &state, CFX_COMM_IN_CALL, 0,
                                    __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return cfxSuccess;
    return cfx_core_claim_slow(comm, state, fn);
}
static inline void cfx_core_release(struct cfxComm *comm)
{
    __atomic_store_n(&comm->active_calls, CFX_COMM_IDLE, __ATOMIC_RELEASE);
}

/* An inspector's hold on an idle communicator (returns 1; 0 when a call
 * holds it or it is closed: look later); give it back with cfx_core_release.
 * Never waits. An inspector may poison connectors, surface a failure and
 * agree on the blame, but makes no call. */
static inline int cfx_core_inspect(struct cfxComm *comm)
{
    int state = CFX_COMM_IDLE;
    return __atomic_compare_exchange_n(&comm->active_calls, &state, CFX_COMM_INSPECTED, 0,
                                       __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

/* Headers of communicators (handle.c): alloc returns a zeroed header (NULL:
 * out of memory); retire marks it dead and closed and keeps it readable for
 * stale handles instead of freeing it. */
struct cfxComm *cfx_core_handle_alloc(void);
void cfx_core_handle_retire(struct cfxComm *comm);

/* Print the version line at CFX_DEBUG=VERSION or above (once per process). */
void cfx_core_print_version(void);

#endif /* CFX_CORE_COMM_H */
