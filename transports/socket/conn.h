/*
 * The socket transport's own types, shared by its files: socket.c (the ops
 * table, setup, connect, close, the data-path ops), stream.c (striped send
 * and receive), handshake.c (listener, hellos, connect) and poison.c
 * (stopping a stream on purpose). Nothing outside transports/socket includes
 * this.
 */
#ifndef CFX_TRANSPORTS_SOCKET_CONN_H
#define CFX_TRANSPORTS_SOCKET_CONN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "src/proxy/proxy.h"
#include "src/util/error.h"
#include "src/util/socket.h"
#include "transports/socket/wire.h"
#include "transports/transport.h"

#define MAX_SOCKS CFX_SOCK_MAX_SOCKS /* Clamp of NSOCKS_PERTHREAD x SOCKET_NTHREADS. */
_Static_assert(MAX_SOCKS <= CFX_PROXY_MAX_FDS, "the proxy watches every socket of a connection");
#define MIN_PART_BYTES   (64 * 1024) /* Smallest stripe; smaller slots use socket 0 only. */
#define ACCEPT_SLICE_MS  50          /* Longest wait of connect() between checks. */
#define HELLO_TIMEOUT_NS (10 * CFX_NS_PER_SEC) /* A socket silent this long is a stranger. */
#define MAX_PENDING      256                   /* Accepted sockets still owing their hello. */
#define DRIVE_LEASE_NS   (200 * 1000)          /* See cfx_proxy_lease. */
#define WAIT_MAX_FDS     64

/* One socket's walk through the slots. */
struct cfx_sock_stream {
    int fd;
    uint64_t step; /* Next slot this socket works on. */
    size_t offset; /* Bytes of that slot's frame (header on socket 0, then the part) done. */
    int eof;       /* Receiver socket 0: the peer closed it between slots. */
};

/* Offers a receiver keeps at once (sock_offer): message m at m % SOCK_OFFERS. */
#define SOCK_OFFERS 8

/* A receive's offer: message msg - 1 (0: none) may land in the `bytes` at
 * `data`. Written by the user thread, read by passes; a reader takes it only
 * if msg reads the same before and after data and bytes (a seqlock). */
struct cfx_sock_offer {
    _Atomic uint64_t msg;
    _Atomic uintptr_t data;
    _Atomic uint64_t bytes;
};

/* What a connector knows of each slot index besides the FIFO. The sender's
 * fields are written by the user thread before it posts the slot and read
 * by passes for that slot only (each names the step it is for, so a value
 * of an earlier use of the index is never taken); the receiver's by passes. */
struct cfx_sock_slot {
    const char *ref;    /* Sender (post_ref): the payload lives here, in user memory, */
    uint64_t ref_step;  /* for step ref_step - 1. */
    uint64_t at_msg;    /* Sender (post_at): message at_msg - 1, */
    uint64_t at_offset; /* at this offset, */
    uint64_t at_step;   /* for step at_step - 1. */
    char *dest; /* Receiver: where the payload lands (an offered buffer), or NULL: the slot. */
};

/* Per-connector state. */
struct cfx_sock_conn {
    enum cfx_conn_dir dir;
    int self_rank;
    int peer_rank;
    struct cfx_fifo *fifo;
    char *slots;
    size_t slot_bytes;
    int n_steps;
    void *mem;        /* The FIFO block: control block, then the slots. */
    int pinned;       /* A GPU rank's: mem registered with CUDA for device pinned - 1; else 0. */
    int64_t moved_ns; /* Pinned: when a pass last moved bytes (the proxy polls faster after). */
    uint64_t conn_id;
    int nsocks;
    struct cfx_sock_stream streams[MAX_SOCKS];
    /* Connect (under the ctx's accept_lock). */
    int n_arrived; /* Receiver: sockets attached so far. */
    int awaiting;  /* Receiver: on the ctx's awaiting list. */
    struct cfx_sock_conn *await_next;
    /* Progress (the proxy's pass runs under the proxy's lock). */
    int registered; /* Added to the proxy (set and read by user threads). */
    struct cfx_proxy_client client;
    struct cfx_sock_slot *slot_meta; /* [n_steps] */
    struct cfx_sock_offer offers[SOCK_OFFERS];
    uint64_t ref_slots;      /* Sender: slots sent from user memory (INFO at close). */
    uint64_t in_place_slots; /* Receiver: slots received into offered buffers (INFO at close). */
    uint64_t done_step;      /* Sender: slots released; receiver: slots posted. */
    uint64_t header_count;   /* Receiver: headers read (sizes known). */
    struct cfx_sock_header header_in; /* Receiver: socket 0's header being read. */
    int poison_in;                    /* Receiver: socket 0 brought a poison header. */
    cfxResult_t poison_in_reason;
    /* Poison: set by the user side (poison op); the progress thread finishes
     * what was posted, sends a poison header, and shuts the sockets down. */
    _Atomic int poison_reason;
    _Atomic int poison_blame;
    int poison_done;
    int64_t poison_deadline_ns;
    /* Who moves bytes: the progress thread or a user thread waiting on the
     * connector, whichever comes first (conn_drive). */
    _Alignas(CFX_CACHE_LINE) _Atomic int busy; /* A thread is moving bytes. */
    _Atomic int wanted;                        /* A pass is owed (by the busy thread). */
    _Atomic int probe_owed; /* Sender: a socket turned readable (the peer wrote back). */
    /* Failure: written by the progress thread, then `failed` is set (release). */
    _Alignas(CFX_CACHE_LINE) _Atomic int failed;
    cfxResult_t failed_res;
    int blame_rank;
    char error[CFX_ERROR_MAX];
};

/* An accepted socket that has not finished its hello. */
struct cfx_sock_pending {
    int fd;
    size_t got;
    int64_t since_ns;
    struct cfx_sock_hello hello;
};

/* Per-communicator state. */
struct cfx_sock_ctx {
    int rank;
    const int *abort_flag;
    int64_t connect_timeout_s;
    cfxResult_t (*connect_check)(void *arg, int peer_rank); /* May be NULL. */
    void *connect_check_arg;
    int nsocks;
    int listen_fd;
    union cfx_sockaddr listen_addr;
    char listen_text[96];
    /* Connect: who waits for sockets, and sockets that owe a hello. */
    pthread_mutex_t accept_lock;
    struct cfx_sock_conn *awaiting;
    struct cfx_sock_pending *pending;
    int n_pending;
    struct cfx_proxy *proxy; /* The process's progress thread (src/proxy). */
};

/* ---- stream.c: bytes on the wire ---- */

/* Move a connector's bytes from whichever thread asks (lock-free; a pass
 * owed to a busy connector is made by its holder). Returns whether this
 * thread moved anything. Never blocks. */
int cfx_sock_conn_drive(struct cfx_sock_conn *sc);
/* Sender: put posted slots on the wire, release those fully sent. */
int cfx_sock_send_progress(struct cfx_sock_conn *sc);

/* ---- poison.c: stopping a stream on purpose ---- */

/* A poisoned connector's pass (from cfx_sock_conn_drive): finish what was
 * posted (briefly), send the poison header, shut the sockets. */
int cfx_sock_poison_progress(struct cfx_sock_conn *sc, int reason, int blame_rank);
/* Record the poison (user thread; the next pass sends it). Never blocks. */
void cfx_sock_conn_poison(struct cfx_sock_conn *sc, cfxResult_t reason, int blame_rank);
/* Before close: let the proxy flush what was posted, or the poison, for at
 * most CLOSE_LINGER_NS. User thread. */
void cfx_sock_conn_linger(struct cfx_sock_ctx *ctx, struct cfx_sock_conn *sc);

/* ---- handshake.c: listener, hellos, connect ---- */

/* Receiver (setup, under accept_lock): a fresh connection id. */
cfxResult_t cfx_sock_conn_id_pick(struct cfx_sock_ctx *ctx, uint64_t *id_p);
/* Take a receiver off the awaiting list (caller holds accept_lock). */
void cfx_sock_awaiting_remove(struct cfx_sock_ctx *ctx, struct cfx_sock_conn *sc);
/* Receiver: accept until every socket of @p sc has arrived. Bounded by the
 * connect timeout, the abort flag and the core's connect_check. */
cfxResult_t cfx_sock_connect_recv(struct cfx_sock_ctx *ctx, struct cfx_sock_conn *sc,
                                  const struct cfx_sock_info *info);
/* Sender: open the receiver's socket count to its listener, hello on each. */
cfxResult_t cfx_sock_connect_send(struct cfx_sock_ctx *ctx, struct cfx_sock_conn *sc,
                                  const struct cfx_sock_info *info);

#endif /* CFX_TRANSPORTS_SOCKET_CONN_H */
