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
 */
#ifndef CFX_TRANSPORTS_TRANSPORT_H
#define CFX_TRANSPORTS_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "conflux.h"
#include "src/conn/fifo.h"

#define CFX_TRANSPORT_VERSION 1
#define CFX_CONNECT_INFO_BYTES 256

/* Capability flags a transport reports. */
#define CFX_TRANSPORT_FLAG_PEER_MAP 0x1u /* Slots are in memory both ranks map directly. */
#define CFX_TRANSPORT_FLAG_PROGRESS 0x2u /* Needs kick() after post/release. */

enum cfx_conn_dir { CFX_CONN_SEND = 0, CFX_CONN_RECV = 1 };

struct cfx_transport;

/* One side of a connection, owned by the communicator. */
struct cfx_connector {
    struct cfx_conn view; /* What the data path polls and fills (src/conn/fifo.h). */
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

/* Set a connector's FIFO (transports, in setup): the control block, the
 * slots after it, and the data path's view of both. */
static inline void cfx_connector_set_fifo(struct cfx_connector *conn, struct cfx_fifo *fifo,
                                          char *slots, size_t slot_bytes, int n_steps)
{
    conn->fifo = fifo;
    conn->slots = slots;
    conn->slot_bytes = slot_bytes;
    conn->n_steps = n_steps;
    cfx_fifo_view(&conn->view, fifo, slots, slot_bytes, n_steps);
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
static inline cfxResult_t cfx_conn_read_peer(struct cfx_connector *conn, void *dst,
                                             uint64_t remote, size_t bytes)
{
    return conn->transport->read_peer(conn->transport_ctx, conn, dst, remote, bytes);
}

#endif /* CFX_TRANSPORTS_TRANSPORT_H */
