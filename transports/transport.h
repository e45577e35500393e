/*
 * The transport interface. A transport moves slots of a connector's FIFO
 * from one rank to another; everything above it (collectives, executors) only
 * touches FIFOs through the inline functions below (the host executor's:
 * src/conn/fifo.h's operations plus the transport's kick), and never tests a
 * transport's name: it reads the transport's capability flags. The FIFO's
 * layout and operations live in src/conn/fifo.h, which compiles for kernels
 * too.
 *
 * A connection between two ranks is a send connector on one side and a
 * receive connector on the other. Each connector presents the same shape to
 * its owner: a FIFO of n_steps slots of slot_bytes each, with a tail (slots
 * posted by the producer) and a head (slots released by the consumer), each
 * on its own cache line. How a posted slot reaches the other side is the
 * transport's business:
 *   - shm: the receiver's FIFO lives in memory both processes map, so the
 *     sender's connector points at the very same FIFO;
 *   - socket: each side has a local FIFO and a progress thread moves posted
 *     slots over TCP and fills the receiver's FIFO.
 *
 * Lifecycle: init (per communicator) -> for each connection: setup on both
 * sides, exchange the connect info blobs (the core does it, over the
 * bootstrap) -> connect -> ... data path ... -> close -> fini.
 * All memory is allocated and touched in setup/connect; the data path never
 * allocates, maps or registers memory.
 *
 * Layering: a transport includes src/conn, src/util and conflux.h only. What
 * it knows of ranks (device, path class, nearest NIC) and where its FIFOs
 * must live come from the core through struct cfx_transport_peer and
 * struct cfx_conn_place; it never includes src/topo or src/core.
 */
#ifndef CFX_TRANSPORTS_TRANSPORT_H
#define CFX_TRANSPORTS_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "conflux.h"
#include "src/conn/fifo.h"

/* 2: struct cfx_conn_place (connector.place), the peer's device, path and
 * NIC, and the optional reg_mem/dereg_mem/flush/map_peer ops. */
#define CFX_TRANSPORT_VERSION  2
#define CFX_CONNECT_INFO_BYTES 256

/* Capability flags a transport reports. The core reads them; it never
 * tests a transport's name. */
#define CFX_TRANSPORT_FLAG_PEER_MAP 0x1u /* map_peer works between some ranks (see map_peer). */
#define CFX_TRANSPORT_FLAG_PROGRESS 0x2u /* Needs kick() after post/release. */
/* setup can place a FIFO in device memory / have it read by a kernel on a
 * device. Without them the core refuses such a placement before setup. */
#define CFX_TRANSPORT_FLAG_PLACE_DEVICE  0x4u
#define CFX_TRANSPORT_FLAG_READER_KERNEL 0x8u
/* After connect() returns on both sides, the core tells each side that the
 * other has connected too (one more message each way over the bootstrap),
 * and only then hands the connector to an executor: for transports whose
 * first bytes are lost or delayed when they reach a peer that has not
 * connected yet (an RC queue pair drops them and retries after its ACK
 * timeout, seconds later). */
#define CFX_TRANSPORT_FLAG_CONNECT_ACK 0x10u
/* post_ref and offer take any host memory, registered or not (the kernel
 * copies it: a socket's sendmsg/recv): the core gives them the handle
 * CFX_REG_ANY_HOST instead of a registration (cfxCommRegister). Such a
 * transport touches a buffer it was given only while the operation runs:
 * once the connector is poisoned (how every failed call ends) it neither
 * sends from a posted reference nor writes into an offer again. */
#define CFX_TRANSPORT_FLAG_ANY_HOST_MEMORY 0x20u
#define CFX_REG_ANY_HOST                   ((void *)&cfx_reg_any_host)
extern const char cfx_reg_any_host; /* Its address is the handle above (transport.c). */

enum cfx_conn_dir { CFX_CONN_SEND = 0, CFX_CONN_RECV = 1 };

/* Kinds of memory: where one side of a connection keeps its FIFO (with who
 * reads it, below), and where an operation's buffers live (src/coll/op.h). */
enum cfx_mem_kind {
    CFX_MEM_HOST = 0,        /* Pageable host memory. */
    CFX_MEM_HOST_PINNED = 1, /* Host memory pinned for a device (cudaHostAlloc). */
    CFX_MEM_DEVICE = 2,      /* Memory of device place.device. */
    CFX_MEM_KINDS = 3,       /* Count. */
};
enum cfx_reader {
    CFX_READER_HOST_THREAD = 0, /* The executor's thread (today's host executor). */
    CFX_READER_PROXY = 1,       /* A transport's or the core's progress thread. */
    CFX_READER_KERNEL = 2,      /* A kernel running on device place.device. */
};
struct cfx_conn_place {
    enum cfx_mem_kind mem;
    int device; /* CUDA device index for CFX_MEM_DEVICE / CFX_READER_KERNEL; else -1. */
    enum cfx_reader reader;
};
/* What the core asks for today: host memory, read by a host thread. */
#define CFX_CONN_PLACE_HOST                                                                        \
    ((struct cfx_conn_place){.mem = CFX_MEM_HOST, .device = -1, .reader = CFX_READER_HOST_THREAD})

/* How data travels from one rank's device to another's, nearest first: the
 * path classes of src/topo (NCCL's names), restated here so that
 * transports stay below the topology. The core fills them. */
enum cfx_path_class {
    CFX_PATH_CLASS_LOC = 0, /* Same device (or both ranks on host memory of one process). */
    CFX_PATH_CLASS_NVL = 1, /* NVLink, directly or through NVSwitches. */
    CFX_PATH_CLASS_NVB = 2, /* NVLink through an intermediate GPU. */
    CFX_PATH_CLASS_PIX = 3, /* At most one PCI switch. */
    CFX_PATH_CLASS_PXB = 4, /* Several PCI switches, not through a CPU. */
    CFX_PATH_CLASS_PHB = 5, /* Through one CPU's host bridge (host memory of one host). */
    CFX_PATH_CLASS_SYS = 6, /* Across the inter-socket link, or not known better on one host. */
    CFX_PATH_CLASS_NET = 7, /* Across the network: another host. */
};

#define CFX_TRANSPORT_BUSID_MAX    32
#define CFX_TRANSPORT_NIC_NAME_MAX 64
#define CFX_TRANSPORT_NIC_NEAR_MAX 256 /* A list of names: "mlx5_0,mlx5_1". */

struct cfx_transport;

/* One side of a connection, owned by the communicator. */
struct cfx_connector {
    struct cfx_conn view;  /* What the data path polls and fills (src/conn/fifo.h). */
    struct cfx_fifo *fifo; /* The control block view points into (the transport's memory). */
    char *slots;
    size_t slot_bytes;
    int n_steps;
    int peer_rank;
    enum cfx_conn_dir dir;
    const struct cfx_transport *transport;
    void *transport_ctx; /* The transport's per-communicator state. */
    void *priv;          /* The transport's per-connector state. */
    void *owner;         /* The executor's claim (the operation using it). */
    /* Set by the caller before setup: where this side's FIFO lives and who
     * reads it (setup refuses what it cannot do, with a sentence). */
    struct cfx_conn_place place;
    int channel;    /* Which channel of the peer pair (0..CFX_CONN_MAX_CHANNELS-1). */
    int blame_rank; /* Set by check() on failure: the rank the failure is about. */
    /* Receive side: read_peer() works on this connector (its transport
     * offers it and connect() read the peer's memory once successfully). */
    int peer_readable;
    /* Point to point, both sides: the smallest send that goes single copy
     * (the receiver reads the sender's buffer, src/coll/pull.h), as the
     * receiver published it in the FIFO (cfx_fifo.pull_min); 0 until known,
     * CFX_PULL_NEVER for none. Set by the core, not by transports. */
    uint64_t pull_min;
    /* Point to point: send (or receive) operations launched on this
     * connector, the number of the next one's message (offer, post_at).
     * Set by the core. */
    uint64_t p2p_msgs;
    /* Slots in device memory (p2p; ib with GPUDirect RDMA): this rank's
     * device + 1 (its context reaches them, a peer's memory included),
     * else 0. A host thread cannot load or store them: the host executor
     * (host buffers of a GPU rank) copies a slot's payload through stage
     * (slot_bytes, at least an LL slot, of pinned host memory) on stage_stream, a stream of that
     * device. Info lines (and the payloads that fit in them) stay host
     * memory. Set by the transport, with cfx_connector_stage_init. LL
     * slots in host memory (shm) come with a plain stage only
     * (cfx_connector_ll_stage_init; slots_device 0, no stream). */
    int slots_device;
    char *stage;
    void *stage_stream;
};

/* Channels one pair of ranks may connect per kind of connection. */
#define CFX_CONN_MAX_CHANNELS 64

/* What a transport may know about a rank (filled by the core, from the
 * peer table and the topology; transports never include src/topo). */
struct cfx_transport_peer {
    int rank;
    int pid;
    int cuda_dev;
    uint64_t host_hash;
    /* PCI bus id of the rank's GPU ("0000:17:00.0"), "" for a host rank or
     * when the topology does not know it. */
    char busid[CFX_TRANSPORT_BUSID_MAX];
    /* From the rank whose core filled this to this rank: LOC for itself,
     * NET on another host, else the topology's class between the two GPUs
     * (PHB/SYS between host ranks of one host). */
    enum cfx_path_class path;
    /* The NIC port nearest the rank on its own host ("mlx5_0", "eth0") and
     * its index among that host's network ports; "" and -1: none known. */
    char nic_name[CFX_TRANSPORT_NIC_NAME_MAX];
    int nic_index;
};

/* What a transport learns about its communicator at init. */
struct cfx_transport_env {
    int rank;
    int nranks;
    const int *abort_flag; /* Polled by blocking waits (connect). */
    int64_t connect_timeout_s;
    const char *listen_ifaddr; /* Address family/interface hint: "host" form or NULL. */
    /* The network port nearest this rank as the topology sees it ("mlx5_0"
     * or "mlx5_0:1"; the core's nic_name of this rank), or NULL / "" when it
     * names none: a transport with several ports puts that one first.
     * Valid during init only. */
    const char *nic_name;
    /* The path class from this rank's GPU to that port (GPUDirect RDMA
     * decisions); -1: a host rank, or not known. */
    int nic_path;
    /* The ports as near as that one (the same path class from the GPU; for
     * a host rank, the same speed), comma-separated, nic_name first: a
     * transport may spread its channels over them. NULL or "": none known.
     * Valid during init only. */
    const char *nic_near;
    /* Optional (may be NULL): connect() calls it with its peer's rank
     * between the slices of each wait (at least every 100 ms) and when it
     * cannot reach the peer. Anything but cfxSuccess, with its sentence set
     * (the peer is gone, gave up, or the call that needs the connection ran
     * out of time), ends the wait: connect() returns that result as is. */
    cfxResult_t (*connect_check)(void *arg, int peer_rank);
    void *connect_check_arg;
};

struct cfx_transport {
    uint32_t version; /* Must be first: CFX_TRANSPORT_VERSION. */
    const char *name; /* For logs only: never compared by the core. */
    uint32_t flags;   /* CFX_TRANSPORT_FLAG_*. */

    /* ---- lifecycle ---- */
    /* Per-communicator state (listeners, threads). Blocks briefly. */
    cfxResult_t (*init)(const struct cfx_transport_env *env, void **ctx_p);
    /* Releases everything init made; accepts NULL. Never blocks on peers. */
    void (*fini)(void *ctx);

    /* ---- connection ---- */
    /* Whether this transport can connect @p self and @p peer. Pure. */
    int (*can_connect)(void *ctx, const struct cfx_transport_peer *self,
                       const struct cfx_transport_peer *peer);
    /* Allocate and touch this side's resources for a connector to @p peer,
     * and write up to CFX_CONNECT_INFO_BYTES of connect info for the peer's
     * connect(). Does not block on the peer. The caller sets conn->dir,
     * peer_rank, channel, place, transport and transport_ctx first; setup
     * fills fifo, slots, slot_bytes, n_steps and priv. conn->place says
     * where this side's FIFO must live and who reads it: a placement the
     * transport cannot make is cfxInvalidUsage with a sentence ("shm: cannot
     * place a FIFO in device memory"), never a FIFO somewhere else. (The
     * core also refuses device memory and kernel readers up front for a
     * transport without CFX_TRANSPORT_FLAG_PLACE_DEVICE / _READER_KERNEL.)
     * After a failed setup the caller closes the connector. */
    cfxResult_t (*setup)(void *ctx, const struct cfx_transport_peer *peer, size_t slot_bytes,
                         int n_steps, struct cfx_connector *conn, void *info_out);
    /* Finish the connector with the peer's connect info. May block until the
     * peer connects too, bounded by env.connect_timeout_s and the abort flag;
     * cfxTimeout / cfxRemoteError name the peer. */
    cfxResult_t (*connect)(void *ctx, struct cfx_connector *conn, const void *peer_info);
    /* Release a connector (half-built ones too, e.g. after a failed
     * connect). Never blocks on the peer. Every connector of a transport
     * context is closed before its fini. */
    void (*close)(void *ctx, struct cfx_connector *conn);

    /* ---- data path ---- */
    /* After a post or release on a connector of this transport (only called
     * when CFX_TRANSPORT_FLAG_PROGRESS is set). Must not block. */
    void (*kick)(void *ctx, struct cfx_connector *conn);
    /* This side failed with @p reason (cfxRemoteError, cfxInvalidUsage for a
     * mismatch, cfxTimeout) about rank @p blame_rank: make the peer's check()
     * report both soon, so a failure spreads instead of leaving peers
     * waiting. Keeps the memory (close still follows). Must not block. */
    void (*poison)(void *ctx, struct cfx_connector *conn, cfxResult_t reason, int blame_rank);
    /* cfxSuccess while the connector is healthy; cfxRemoteError (with a
     * sentence naming the peer) once its peer is gone; cfxInvalidUsage when
     * the peer broke the protocol (e.g. an oversized slot); a poisoned peer's
     * reason. On failure sets conn->blame_rank. Must not block. */
    cfxResult_t (*check)(void *ctx, struct cfx_connector *conn);
    /* Optional (may be NULL): move this connector's bytes from the caller's
     * thread, as the transport's own progress thread would, while the caller
     * waits on it. Returns nonzero when anything moved. Must not block; a
     * transport busy elsewhere may do nothing. */
    int (*progress)(void *ctx, struct cfx_connector *conn);
    /* Optional (may be NULL): block until one of @p conns (all of this
     * transport and context) can move bytes, then move them; at most
     * @p timeout_ns. For transports whose data arrives through the kernel,
     * where spinning on system calls costs more than sleeping in one.
     * Returns nonzero when anything moved. */
    int (*wait)(void *ctx, struct cfx_connector *const *conns, int n_conns, int64_t timeout_ns);
    /* Optional (may be NULL): on a receive connector with peer_readable
     * set, copy @p bytes from address @p remote of the peer's memory (an
     * address the peer announced in a slot) into @p dst: the single-copy
     * path, where data skips the FIFO. Blocks only for the copy itself.
     * cfxRemoteError once the peer is gone; cfxInternalError when @p remote
     * is not readable memory of the peer. */
    cfxResult_t (*read_peer)(void *ctx, struct cfx_connector *conn, void *dst, uint64_t remote,
                             size_t bytes);

    /* ---- memory (version 2; every op here is optional: NULL = cannot) ---- */
    /* Register @p bytes of a user buffer at @p buf (of kind @p mem, on
     * @p device for device memory) with the transport, so that later
     * operations may move it without a copy (a NIC's memory region). Setup
     * time only: may allocate, pin and block briefly, never on a peer. The
     * buffer stays the caller's: it must outlive the registration and is
     * never freed by the transport. On success *handle_p is an opaque
     * handle (NULL is a valid handle for a transport with nothing to do);
     * cfxInvalidUsage with a sentence for a kind of memory the transport
     * cannot register; cfxSystemError when the system refuses (pinning
     * limits). */
    cfxResult_t (*reg_mem)(void *ctx, void *buf, size_t bytes, enum cfx_mem_kind mem, int device,
                           void **handle_p);
    /* Release a handle reg_mem returned (accepts NULL). Never blocks on a
     * peer. Every handle of a context is deregistered before its fini. */
    void (*dereg_mem)(void *ctx, void *handle);
    /* Receive side: make the @p bytes at @p data (registered as @p handle)
     * that a NIC wrote into device memory visible to the reader of
     * conn->place (GPUDirect RDMA: a read through the NIC that orders the
     * writes before it). Must not block: sets *done_p to 1 once the data is
     * visible, else 0 and the caller calls again (with the same arguments)
     * until it is. cfxRemoteError names the peer if the connection failed.
     * NULL: data a transport writes is visible when it posts the slot. */
    cfxResult_t (*flush)(void *ctx, struct cfx_connector *conn, void *data, size_t bytes,
                         void *handle, int *done_p);
    /* On a connected connector: a pointer through which this rank (a
     * thread, or a kernel on conn->place.device) can load and store the
     * @p bytes at address @p remote of the peer's memory (an address the
     * peer announced, as for read_peer): direct algorithms reduce straight
     * out of it. Never blocks; may map memory, so setup time only. The
     * pointer stays valid until the connector is closed or the peer lets
     * go of the buffer, whichever is first; nothing to release.
     * cfxInvalidUsage with a sentence where the transport cannot map this
     * peer's memory (another process, another host); cfxRemoteError once
     * the peer is gone. A transport reports CFX_TRANSPORT_FLAG_PEER_MAP if
     * and only if it has this op; the core asks only such transports
     * (cfx_conn_map_peer). */
    cfxResult_t (*map_peer)(void *ctx, struct cfx_connector *conn, uint64_t remote, size_t bytes,
                            void **ptr_p);
    /* Send side: the payload of the next slot is the @p bytes at @p data,
     * inside a buffer registered as @p handle (reg_mem): the transport
     * moves it from there instead of from the slot (a NIC reads the user's
     * buffer: zero copy). The caller then posts the slot as usual, with
     * the same size, writes nothing into it, and keeps @p data unchanged
     * until the slot is released (the transport releases a slot once its
     * payload has left). Never blocks, allocates or registers. NULL:
     * cannot. */
    cfxResult_t (*post_ref)(void *ctx, struct cfx_connector *conn, const void *data, size_t bytes,
                            void *handle);
    /* Receive side of point to point: the payload of message @p msg of
     * this connector (the core numbers each direction's send and receive
     * operations alike, from 0) may be written straight into the @p bytes
     * at @p data, registered as @p handle (reg_mem), at the offset the
     * sender gives each slot (post_at); such a slot is posted with
     * CFX_SLOT_IN_PLACE in its size. Best effort: slots sent before the
     * offer reaches the sender go through the FIFO as ever. Called when
     * the receive is launched, before any of its steps; never blocks,
     * allocates or registers. NULL: cannot. */
    cfxResult_t (*offer)(void *ctx, struct cfx_connector *conn, uint64_t msg, void *data,
                         size_t bytes, void *handle);
    /* Send side of point to point, before cfx_conn_post of a slot: that
     * slot carries the bytes at @p offset of message @p msg (see offer).
     * NULL: no transport use for it. */
    void (*post_at)(void *ctx, struct cfx_connector *conn, uint64_t msg, uint64_t offset);
};

/* Transports in priority order, NULL-terminated (transports/registry.c). */
extern const struct cfx_transport *const cfx_transports[];

/* Set a connector's FIFO (transports, in setup): the control block, the
 * slots after it, and the data path's view of both. */
/* LL slots in a block after its payload slots (p2p's device memory, shm's
 * pinned FIFOs): [n_steps] of CFX_LL_SLOT_BYTES from the first page at or
 * after @p payload_end bytes, so whatever reaches the block (a mapping, a
 * registration) reaches them too. Zeroed with the block: a word holds no LL
 * flag until its slot is first written (src/conn/fifo.h). */
static inline size_t cfx_ll_slots_offset(size_t payload_end)
{
    return (payload_end + 4095) & ~(size_t)4095;
}

/* The size of such a block, its LL slots included. */
static inline size_t cfx_ll_block_bytes(size_t payload_end, int n_steps)
{
    return cfx_ll_slots_offset(payload_end) + CFX_LL_SLOT_BYTES * (size_t)n_steps;
}

/* Point @p conn's view at the LL slots of the block at @p base (after its
 * view's n_steps is set). */
static inline void cfx_connector_set_ll(struct cfx_connector *conn, void *base, size_t payload_end)
{
    conn->view.ll = (uint64_t *)(void *)((char *)base + cfx_ll_slots_offset(payload_end));
}

static inline void cfx_connector_set_fifo(struct cfx_connector *conn, struct cfx_fifo *fifo,
                                          char *slots, size_t slot_bytes, int n_steps)
{
    conn->fifo = fifo;
    conn->slots = slots;
    conn->slot_bytes = slot_bytes;
    conn->n_steps = n_steps;
    cfx_fifo_view(&conn->view, fifo, slots, slot_bytes, n_steps);
    conn->view.peer = conn->peer_rank;
}

/* Transports whose slots live in device memory @p device, after setting
 * the FIFO: pinned host memory and a stream for a host thread's copies of
 * the connector's payloads (slots_device, stage, stage_stream). Setup time. */
cfxResult_t cfx_connector_stage_init(struct cfx_connector *conn, int device);
/* Transports whose LL slots are host memory (shm between GPU ranks): a
 * plain stage of CFX_LL_SLOT_BYTES where a host thread encodes and decodes
 * LL slots (slots_device stays 0). Setup time. */
cfxResult_t cfx_connector_ll_stage_init(struct cfx_connector *conn);
/* Release what cfx_connector_stage_init or _ll_stage_init made (none: nothing). */
void cfx_connector_stage_fini(struct cfx_connector *conn);

/* Forget a connector's FIFO and per-connector state (transports, at the
 * end of close, after freeing them). */
static inline void cfx_connector_forget(struct cfx_connector *conn)
{
    conn->priv = NULL;
    conn->fifo = NULL;
    conn->slots = NULL;
    memset(&conn->view, 0, sizeof(conn->view));
}

/* ------------------------------------------------------------ FIFO access */

/* The host executor's FIFO operations: src/conn/fifo.h's, then the
 * transport's kick where its bytes move by a thread (socket). */

static inline int cfx_conn_can_post(struct cfx_connector *conn)
{
    return cfx_fifo_can_post(&conn->view);
}

static inline char *cfx_conn_post_slot(const struct cfx_connector *conn, size_t bytes)
{
    return cfx_fifo_post_slot(&conn->view, bytes);
}

static inline void cfx_conn_post(struct cfx_connector *conn, size_t bytes,
                                 const struct cfx_fingerprint *print)
{
    cfx_fifo_post(&conn->view, bytes, print);
    if (conn->transport->flags & CFX_TRANSPORT_FLAG_PROGRESS)
        conn->transport->kick(conn->transport_ctx, conn);
}

/* Producer (transports with post_ref): the next slot's payload is @p bytes
 * at @p data in a buffer registered as @p handle; then cfx_conn_post. */
static inline cfxResult_t cfx_conn_post_ref(struct cfx_connector *conn, const void *data,
                                            size_t bytes, void *handle)
{
    return conn->transport->post_ref(conn->transport_ctx, conn, data, bytes, handle);
}

/* Consumer of point to point (transports with offer): message @p msg may
 * land in place at @p data (see offer). */
static inline cfxResult_t cfx_conn_offer(struct cfx_connector *conn, uint64_t msg, void *data,
                                         size_t bytes, void *handle)
{
    return conn->transport->offer(conn->transport_ctx, conn, msg, data, bytes, handle);
}

/* Producer of point to point: the next slot is message @p msg's bytes at
 * @p offset (for transports that use it; see post_at). */
static inline void cfx_conn_post_at(struct cfx_connector *conn, uint64_t msg, uint64_t offset)
{
    if (conn->transport->post_at)
        conn->transport->post_at(conn->transport_ctx, conn, msg, offset);
}

/* Consumer: the oldest posted slot's payload is already in place (see
 * CFX_SLOT_IN_PLACE). */
static inline int cfx_conn_in_place(const struct cfx_connector *conn)
{
    return cfx_fifo_in_place_at(&conn->view, cfx_load_relaxed_u64(conn->view.head));
}

/* Producer: the consumer released every slot posted so far. */
static inline int cfx_conn_drained(struct cfx_connector *conn)
{
    return cfx_fifo_drained_at(&conn->view, cfx_load_relaxed_u64(conn->view.tail));
}

static inline int cfx_conn_can_take(const struct cfx_connector *conn)
{
    return cfx_fifo_can_take(&conn->view);
}

static inline const char *cfx_conn_take_slot(const struct cfx_connector *conn, size_t *bytes_p,
                                             const struct cfx_fingerprint **print_p)
{
    return cfx_fifo_take_slot(&conn->view, bytes_p, print_p);
}

static inline void cfx_conn_release(struct cfx_connector *conn)
{
    cfx_fifo_release(&conn->view);
    if (conn->transport->flags & CFX_TRANSPORT_FLAG_PROGRESS)
        conn->transport->kick(conn->transport_ctx, conn);
}

/* Consumer (peer_readable connectors only): copy @p bytes at the peer's
 * address @p remote into @p dst. */
static inline cfxResult_t cfx_conn_read_peer(struct cfx_connector *conn, void *dst, uint64_t remote,
                                             size_t bytes)
{
    return conn->transport->read_peer(conn->transport_ctx, conn, dst, remote, bytes);
}

/* A pointer into the peer's memory at @p remote (see map_peer), or
 * cfxInvalidUsage with a sentence when the connector's transport does not
 * report CFX_TRANSPORT_FLAG_PEER_MAP. Setup time only. */
cfxResult_t cfx_conn_map_peer(struct cfx_connector *conn, uint64_t remote, size_t bytes,
                              void **ptr_p);

/* Which network carries traffic between hosts (CFX_NET, NCCL_NET's
 * meaning: a network's name, compared without case): any usable one (a
 * net plugin first, then verbs, then sockets), verbs ("IB": the verbs
 * transport must run, and nothing else carries traffic between hosts),
 * sockets ("Socket": no verbs, no plugin unless it is named Socket too), or
 * another name, which only the loaded net plugin's can match
 * (cfx_transport_net_name() says which). */
enum cfx_net_choice { CFX_NET_ANY = 0, CFX_NET_IB = 1, CFX_NET_SOCKET = 2, CFX_NET_NAMED = 3 };
enum cfx_net_choice cfx_transport_net_choice(void);
/* CFX_NET as set ("" when unset). */
const char *cfx_transport_net_name(void);

/* CFX_NET_GDR_LEVEL (NCCL's names) as a path class: GPUDirect RDMA is used
 * between a GPU and a NIC at most that far apart; -1 (LOC): never. */
int cfx_transport_gdr_level(void);
/* CFX_DMABUF_ENABLE (NCCL's NCCL_DMABUF_ENABLE): whether device memory may
 * be registered with a NIC as a dma-buf. */
int cfx_transport_dmabuf_enable(void);

/* Whether @p tr can honour @p place at all, from its flags: cfxSuccess, or
 * cfxInvalidUsage with a sentence naming the transport (transports/transport.c). */
cfxResult_t cfx_transport_place_check(const struct cfx_transport *tr,
                                      const struct cfx_conn_place *place);

#endif /* CFX_TRANSPORTS_TRANSPORT_H */
