/*
 * The transport interface. A transport moves slots of a connector's FIFO
 * from one rank to another; everything above it (collectives, executors) only
 * touches FIFOs through the inline functions below, and never tests a
 * transport's name: it reads the transport's capability flags.
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
 */
#ifndef CFX_TRANSPORTS_TRANSPORT_H
#define CFX_TRANSPORTS_TRANSPORT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "conflux.h"

#define CFX_TRANSPORT_VERSION 1
#define CFX_CONNECT_INFO_BYTES 256
#define CFX_MAX_STEPS 64
#define CFX_CACHE_LINE 64

/* Capability flags a transport reports. */
#define CFX_TRANSPORT_FLAG_PEER_MAP 0x1u /* Slots are in memory both ranks map directly. */
#define CFX_TRANSPORT_FLAG_PROGRESS 0x2u /* Needs kick() after post/release. */

enum cfx_conn_dir { CFX_CONN_SEND = 0, CFX_CONN_RECV = 1 };

/* What each slot says about the operation that posted it, so the receiver
 * can tell that both ranks run the same operation (mismatch detection). */
struct cfx_fingerprint {
    uint64_t seq;   /* Per-communicator collective number, or per-peer message number. */
    uint64_t count; /* Elements. */
    int32_t root;   /* Root, or -1. */
    uint8_t kind;   /* enum cfx_coll_kind of the operation (send for point to point). */
    uint8_t type;   /* cfxDataType_t. */
    uint8_t op;     /* cfxRedOp_t, or 0xff. */
    uint8_t valid;  /* 1 when set. */
    uint32_t slot;  /* The connector's slot number (low 32 bits), set by cfx_conn_post: the
                     * receiver expects its own count, so a lost slot is seen at once. */
    uint32_t zero;  /* No padding: fingerprints are compared with memcmp. */
};

/* Payloads up to this size travel inside the slot's info line. */
#define CFX_SLOT_INLINE_BYTES 24

/* What the consumer reads of a slot besides its data: one cache line, with
 * a small payload inside it, so a small slot costs the consumer two cache
 * lines (the tail's and this one) and its producer no store to the slot. */
struct cfx_slot_info {
    _Alignas(CFX_CACHE_LINE) uint32_t size; /* Bytes in the slot. */
    _Atomic uint32_t seq; /* Slot number + 1 (low 32 bits) once posted, stored last (release):
                           * the consumer polls this line, not the tail's. */
    struct cfx_fingerprint print;                        /* Who posted it. */
    _Alignas(8) char inline_data[CFX_SLOT_INLINE_BYTES]; /* The payload, when that small. */
};
_Static_assert(sizeof(struct cfx_slot_info) == CFX_CACHE_LINE, "slot info is one cache line");

/* The FIFO control block. Lives at the start of the connector's memory; the
 * slots follow at fifo_slots_offset(). Counters only grow. */
struct cfx_fifo {
    _Alignas(CFX_CACHE_LINE) _Atomic uint64_t tail; /* Posted by the producer. */
    _Alignas(CFX_CACHE_LINE) _Atomic uint64_t head; /* Released by the consumer. */
    struct cfx_slot_info info[CFX_MAX_STEPS]; /* Each posted slot's size and fingerprint. */
    _Alignas(CFX_CACHE_LINE) _Atomic int closed; /* 0, or the cfxResult_t that broke a side (shm). */
    _Atomic int attached;                        /* Set by the sender once mapped (shm). */
    _Atomic int refs;                            /* Sides holding process-local memory (shm). */
};

/* Bytes from the FIFO control block to slot 0 (page aligned). */
static inline size_t cfx_fifo_slots_offset(void)
{
    return (sizeof(struct cfx_fifo) + 4095) & ~(size_t)4095;
}

struct cfx_transport;

/* One side of a connection, owned by the communicator. */
struct cfx_connector {
    struct cfx_fifo *fifo;
    char *slots;
    size_t slot_bytes;
    int n_steps;
    int peer_rank;
    enum cfx_conn_dir dir;
    const struct cfx_transport *transport;
    void *transport_ctx; /* The transport's per-communicator state. */
    void *priv;          /* The transport's per-connector state. */
    void *owner;         /* The executor's claim (the operation using it). */
    uint64_t head_seen;  /* Producer: the consumer's head when last read (cfx_conn_can_post). */
    int blame_rank;      /* Set by check() on failure: the rank the failure is about. */
    /* Receive side: read_peer() works on this connector (its transport
     * offers it and connect() read the peer's memory once successfully). */
    int peer_readable;
};

/* What a transport may know about a rank (filled by the core). */
struct cfx_transport_peer {
    int rank;
    int pid;
    int cuda_dev;
    uint64_t host_hash;
};

/* What a transport learns about its communicator at init. */
struct cfx_transport_env {
    int rank;
    int nranks;
    const int *abort_flag; /* Polled by blocking waits (connect). */
    int64_t connect_timeout_s;
    const char *listen_ifaddr; /* Address family/interface hint: "host" form or NULL. */
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
     * peer_rank, transport and transport_ctx first; setup fills fifo, slots,
     * slot_bytes, n_steps and priv. */
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
};

/* Transports in priority order, NULL-terminated (transports/registry.c). */
extern const struct cfx_transport *const cfx_transports[];

/* ------------------------------------------------------------ FIFO access */

/* Producer: a slot is free to fill. The consumer's head is read only when
 * the last value seen says the FIFO is full (its line need not cross cores
 * on every post). */
static inline int cfx_conn_can_post(struct cfx_connector *conn)
{
    uint64_t tail = atomic_load_explicit(&conn->fifo->tail, memory_order_relaxed);
    if (tail - conn->head_seen < (uint64_t)conn->n_steps)
        return 1;
    conn->head_seen = atomic_load_explicit(&conn->fifo->head, memory_order_acquire);
    return tail - conn->head_seen < (uint64_t)conn->n_steps;
}

/* Mark slot @p number of a FIFO posted (its info and data written before). */
static inline void cfx_fifo_mark_posted(struct cfx_fifo *fifo, int n_steps, uint64_t number)
{
    atomic_store_explicit(&fifo->info[number % (uint64_t)n_steps].seq, (uint32_t)(number + 1),
                          memory_order_release);
}

/* Where slot @p index of a FIFO keeps a payload of @p bytes: inside its info
 * line when small enough, else in the slot. Producer, consumer and
 * transports all ask here. */
static inline char *cfx_fifo_data(struct cfx_fifo *fifo, char *slots, size_t slot_bytes,
                                  size_t index, size_t bytes)
{
    if (bytes <= CFX_SLOT_INLINE_BYTES)
        return fifo->info[index].inline_data;
    return slots + index * slot_bytes;
}

/* Producer: where to write the next slot's @p bytes of payload. */
static inline char *cfx_conn_post_slot(const struct cfx_connector *conn, size_t bytes)
{
    uint64_t tail = atomic_load_explicit(&conn->fifo->tail, memory_order_relaxed);
    return cfx_fifo_data(conn->fifo, conn->slots, conn->slot_bytes,
                         (size_t)(tail % (uint64_t)conn->n_steps), bytes);
}

/* Producer: publish the filled slot with @p bytes of payload (written where
 * cfx_conn_post_slot(conn, bytes) said), stamped with the operation's
 * fingerprint. */
static inline void cfx_conn_post(struct cfx_connector *conn, size_t bytes,
                                 const struct cfx_fingerprint *print)
{
    uint64_t tail = atomic_load_explicit(&conn->fifo->tail, memory_order_relaxed);
    struct cfx_slot_info *info = &conn->fifo->info[tail % (uint64_t)conn->n_steps];
    info->size = (uint32_t)bytes;
    info->print = *print;
    info->print.slot = (uint32_t)tail;
    cfx_fifo_mark_posted(conn->fifo, conn->n_steps, tail);
    atomic_store_explicit(&conn->fifo->tail, tail + 1, memory_order_release);
    if (conn->transport->flags & CFX_TRANSPORT_FLAG_PROGRESS)
        conn->transport->kick(conn->transport_ctx, conn);
}

/* Consumer: a posted slot is waiting (one load of the slot's info line). */
static inline int cfx_conn_can_take(const struct cfx_connector *conn)
{
    uint64_t head = atomic_load_explicit(&conn->fifo->head, memory_order_relaxed);
    return atomic_load_explicit(&conn->fifo->info[head % (uint64_t)conn->n_steps].seq,
                                memory_order_acquire) == (uint32_t)(head + 1);
}

/* Consumer: the oldest posted slot, its size and its fingerprint. */
static inline const char *cfx_conn_take_slot(const struct cfx_connector *conn, size_t *bytes_p,
                                             const struct cfx_fingerprint **print_p)
{
    uint64_t head = atomic_load_explicit(&conn->fifo->head, memory_order_relaxed);
    size_t index = (size_t)(head % (uint64_t)conn->n_steps);
    size_t bytes = conn->fifo->info[index].size;
    *bytes_p = bytes;
    *print_p = &conn->fifo->info[index].print;
    return cfx_fifo_data(conn->fifo, conn->slots, conn->slot_bytes, index, bytes);
}

/* Consumer: hand the slot back. */
static inline void cfx_conn_release(struct cfx_connector *conn)
{
    uint64_t head = atomic_load_explicit(&conn->fifo->head, memory_order_relaxed);
    atomic_store_explicit(&conn->fifo->head, head + 1, memory_order_release);
    if (conn->transport->flags & CFX_TRANSPORT_FLAG_PROGRESS)
        conn->transport->kick(conn->transport_ctx, conn);
}

/* Consumer (peer_readable connectors only): copy @p bytes at the peer's
 * address @p remote into @p dst. */
static inline cfxResult_t cfx_conn_read_peer(struct cfx_connector *conn, void *dst,
                                             uint64_t remote, size_t bytes)
{
    return conn->transport->read_peer(conn->transport_ctx, conn, dst, remote, bytes);
}

#endif /* CFX_TRANSPORTS_TRANSPORT_H */
