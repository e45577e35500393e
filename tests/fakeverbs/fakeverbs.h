/*
 * fake-verbs: a libibverbs.so.1 of Conflux's own, FOR TESTS ONLY. It behaves
 * like a strict RC RDMA NIC (state machine, lkey/rkey checks, RNR, retry
 * timeouts, flushes, ordered completions) but moves every byte over TCP
 * through one service thread per process, so nothing measured over it is an
 * RDMA figure. See README.md beside this file.
 *
 * Environment (each read once, at the first ibv_open_device of the process):
 *   FAKEVERBS_DEVICES=N          devices fake_0.. (default 1; 0: empty list)
 *   FAKEVERBS_LINK_LAYER=roce    Ethernet link layer (GID 1 = ::ffff:a.b.c.d,
 *                                lid 0); default InfiniBand (distinct LID and
 *                                fe80:: GID per network namespace and device)
 *   FAKEVERBS_ROCE_DEVICES=1,3   those devices Ethernet, the others as
 *                                FAKEVERBS_LINK_LAYER says (GID 1 on all)
 *   FAKEVERBS_ADDR=a.b.c.d       address of the service (default: first UP
 *                                non-loopback IPv4 interface, else 127.0.0.1)
 *   FAKEVERBS_DIR=path           QP registry (default /tmp/cfx-fakeverbs)
 *   FAKEVERBS_LOG=1              one "fake-verbs:" line per notable event
 *   FAKEVERBS_FAIL_AFTER_WRITES=N   the (N+1)th RDMA write posted in this
 *                                process completes with IBV_WC_RETRY_EXC_ERR
 *                                and its QP moves to ERR
 *   FAKEVERBS_LOSE_COMPLETION=N  the Nth completion (1-based) this process
 *                                would generate is silently dropped
 *   FAKEVERBS_PORT_DOWN_AFTER_MS=N  N ms after the first open: port DOWN,
 *                                IBV_EVENT_PORT_ERR, every QP to ERR
 *   FAKEVERBS_PORT_DOWN_DEVICE=fake_K  only that device's port goes down
 *                                (its contexts get the event, its QPs ERR)
 *   FAKEVERBS_ASYNC_QP_FATAL_AFTER_MS=N  N ms after the first QP reaches RTS:
 *                                IBV_EVENT_QP_FATAL for it, that QP to ERR
 *
 * Locking: one process-wide mutex (fv.lock) guards every object below; the
 * service thread holds it while it handles events and drops it in epoll_wait.
 * Internal header: only the fake-verbs sources include it.
 */
#ifndef CFX_FAKEVERBS_H
#define CFX_FAKEVERBS_H

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FV_MAX_DEVICES          16
#define FV_MAX_QP_WR            4096
#define FV_MAX_CQE              65536
#define FV_MAX_INLINE           256
#define FV_MAX_SGE              1
#define FV_RNR_DELAY_MS         2
#define FV_RETRY_MAX_SPACING_MS 20
#define FV_PORT_NUM             1

/* Exported symbols: everything else is hidden by the version script. */
#define FV_EXPORT __attribute__((visibility("default")))

/* Knobs from the environment (see the header comment); -1 = off. */
struct fv_knobs {
    int n_devices;
    int roce;
    unsigned roce_devices; /* FAKEVERBS_ROCE_DEVICES: bit d, device d is Ethernet. */
    int log;
    long fail_after_writes;
    int fail_reads;
    long lose_completion;
    long port_down_after_ms;
    int port_down_device; /* -1: every device. */
    long qp_fatal_after_ms;
    char dir[256];
};

/* The identity every process of one network namespace shares. */
struct fv_identity {
    struct in_addr addr;
    uint16_t lid;
    union ibv_gid gid[2]; /* [0] link-local, [1] IPv4-mapped (RoCE only) */
    int n_gids;
};

struct fv_device {
    struct ibv_device ibdev; /* Must be first. */
    int index;
};

/* One queued async event of a context. */
struct fv_async {
    struct ibv_async_event event;
    struct fv_async *next;
};

struct fv_context {
    struct ibv_context ibctx; /* Must be first. */
    struct fv_async *events_head, *events_tail;
    struct fv_context *next;
};

struct fv_mr {
    struct ibv_mr ibmr; /* Must be first. */
    int access;
    struct fv_mr *next;
};

struct fv_cq {
    struct ibv_cq ibcq; /* Must be first. */
    struct ibv_wc *ring;
    int capacity, head, count;
    int overflowed;
};

/* One send work request, copied at post time. */
struct fv_send_wqe {
    uint64_t wr_id;
    enum ibv_wr_opcode opcode;
    int signaled;
    uint32_t seq;
    uint32_t imm;
    uint64_t remote_addr;
    uint32_t rkey;
    uint32_t length;
    const void *payload;             /* user memory, or inline_data */
    void *read_to;                   /* RDMA_READ: the local buffer the bytes land in */
    enum ibv_wc_status local_status; /* not SUCCESS: fails at the head */
    int acked;                       /* the responder answered ACK */
    unsigned char inline_data[FV_MAX_INLINE];
};

struct fv_recv_wqe {
    uint64_t wr_id;
    void *addr;
    uint32_t length;
    enum ibv_wc_status local_status;
};

enum fv_conn_state {
    FV_CONN_NONE,      /* nothing tried yet */
    FV_CONN_WAIT_DEST, /* destination unknown or not matching: retrying */
    FV_CONN_CONNECTING,
    FV_CONN_UP,
};

/* Requester side of the one TCP connection of a QP to its destination. */
struct fv_req_conn {
    enum fv_conn_state state;
    int fd;
    uint64_t id;
    size_t hello_off;    /* bytes of the hello already written */
    size_t tx_off;       /* bytes of the WQE at sq_sent already written */
    int rewind_pending;  /* go back to sq_acked once the current WQE is out */
    unsigned char rx[8]; /* one response being read */
    size_t rx_len;
    int want_out;
    uint64_t next_try_ms;    /* do not send before */
    uint64_t retry_start_ms; /* first drop of the current head, 0: none */
    int rnr_count;
};

struct fv_qp {
    struct ibv_qp ibqp; /* Must be first. */
    struct ibv_qp_cap cap;
    int sq_sig_all;
    int access_flags;
    int resp_access_err; /* Refused a write: takes no more (a NIC's responder goes to ERR). */
    struct ibv_ah_attr ah;
    uint32_t dest_qpn;
    uint8_t timeout, retry_cnt, rnr_retry;
    /* Send ring: head (oldest not retired) <= sq_acked <= sq_sent <= tail,
     * absolute counters; slot = counter % cap.max_send_wr. */
    struct fv_send_wqe *sq;
    uint32_t sq_head, sq_acked, sq_sent, sq_tail;
    struct fv_recv_wqe *rq;
    uint32_t rq_head, rq_tail;
    struct fv_req_conn conn;
    int registered; /* our registry file exists */
    struct fv_qp *next;
};

/* The wire protocol between service threads. A requester connection starts
 * with a hello, then carries messages; the responder answers each message
 * in sequence with an fv_resp. Host byte order: both ends are this machine. */
#define FV_HELLO_MAGIC 0x46564831u  /* "FVH1" */
#define FV_ID_REQ_BIT  (1ull << 62) /* epoll ids of requester connections */

enum fv_resp_status {
    FV_ACK = 0,
    FV_NAK_RNR = 1,
    FV_NAK_NOT_READY = 2,
    FV_NAK_ACCESS = 3,
    FV_NAK_INVALID = 4,
    FV_NO_ANSWER = 5, /* out of sequence after a NAK: dropped */
};

struct fv_hello {
    uint32_t magic;
    uint32_t dest_qpn;
    uint32_t src_qpn;
    uint32_t first_seq; /* sequence number of the first message to come */
};

/* One message: the header, then length payload bytes. */
struct fv_msg_hdr {
    uint32_t seq;
    uint32_t opcode; /* enum ibv_wr_opcode */
    uint32_t imm;    /* as the user gave it (network order) */
    uint32_t rkey;
    uint64_t remote_addr;
    uint32_t length;
    uint32_t reserved;
    uint64_t local_addr; /* RDMA_READ: where the responder puts the bytes (no payload follows). */
};

struct fv_resp {
    uint32_t seq;
    uint32_t status; /* enum fv_resp_status */
};

/* Process-wide state. */
struct fv_global {
    pthread_mutex_t lock;
    int knobs_read;
    struct fv_knobs knobs;
    struct fv_identity ident;
    struct fv_context *contexts;
    int n_open;
    struct fv_mr *mrs;
    struct fv_qp *qps;
    /* Service thread. */
    pthread_t thread;
    int running, stop;
    int epoll_fd, wake_fd, listen_fd;
    uint16_t listen_port;
    struct fv_resp_conn *resp_conns;
    /* In a child forked after an open: the parent's objects, kept reachable
     * and never used (the child opens its own device, as with rdma-core). */
    struct fv_context *inherited_contexts;
    struct fv_mr *inherited_mrs;
    struct fv_qp *inherited_qps;
    struct fv_resp_conn *inherited_resp_conns;
    uint64_t next_conn_id;
    /* Fault knob state. */
    long writes_posted;
    long completions_made;
    uint64_t first_open_ms;
    uint64_t first_rts_ms;
    uint32_t first_rts_qpn;
    int port_down;
    int qp_fatal_done;
};

extern struct fv_global fv;

/* Log one line to stderr when FAKEVERBS_LOG=1. */
void fv_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t fv_now_ms(void);

/* wire.c: close the sockets a forked child inherited (no lock: the child
 * has one thread). */
void fv_wire_forget_inherited(void);
/* The memory region of @p rkey is being deregistered (fv.lock held): an
 * RDMA write through it whose payload is still arriving lands no further
 * (the rest is dropped, the requester gets a remote access error), as a
 * NIC stops DMA into a region once ibv_dereg_mr returns. */
void fv_wire_region_gone(uint32_t rkey);

/* device.c: a device's LID and GID @p i (identity per namespace, varied by
 * device index); whether device @p dev's port is down. Callers hold fv.lock. */
uint16_t fv_device_lid(int dev);
void fv_device_gid(int dev, int i, union ibv_gid *gid);
int fv_device_port_down(int dev);
int fv_context_device(const struct ibv_context *context);
/* device.c: async events, MRs. Callers hold fv.lock. */
void fv_async_post_ctx(struct fv_context *ctx, enum ibv_event_type type, void *element);
struct fv_mr *fv_mr_find(uint32_t key);
/* Random bits (getrandom, else a weaker mix); any thread. */
uint32_t fv_random_u32(void);

/* requester.c: the registry and the requester side. Callers hold fv.lock. */
/* Registry record of @p qpn: 0 and fields set, -1 when there is none. */
int fv_registry_lookup(uint32_t qpn, struct in_addr *addr_p, uint16_t *port_p, pid_t *pid_p,
                       uint16_t *lid_p, union ibv_gid *gids_p);
/* A new QP number for a QP on device @p dev (its LID and GIDs recorded). */
int fv_registry_add_qp(int dev, uint32_t *qpn_p);
void fv_registry_remove_qp(uint32_t qpn);
/* Remove the files of dead processes. */
void fv_registry_reclaim(void);
/* Drop the requester connection of @p qp. */
void fv_wire_conn_close(struct fv_qp *qp);
/* A requester connection is readable or writable (epoll @p events). */
void fv_req_event(struct fv_qp *qp, uint32_t events, uint64_t now);
/* Connect and send what is queued on @p qp, as far as it goes unblocked. */
void fv_req_progress(struct fv_qp *qp, uint64_t now);

/* qp.c: completions and state changes. Callers hold fv.lock. */
struct fv_qp *fv_qp_find(uint32_t qpn);
void fv_cq_push(struct fv_cq *cq, const struct ibv_wc *wc);
/* Move @p qp to ERR: flush every outstanding WR (send and recv). */
void fv_qp_to_error(struct fv_qp *qp);
/* Complete send WQEs the responder acknowledged, in order. */
void fv_qp_complete_acked(struct fv_qp *qp);
/* The head outstanding WQE fails with @p status; QP to ERR. */
void fv_qp_fail_head(struct fv_qp *qp, enum ibv_wc_status status);
int fv_qp_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int fv_qp_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int fv_cq_poll(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc);

/* wire.c: the service thread and the responder side. fv_service_start:
 * fv.lock held; stop and wake: not held. */
int fv_service_start(void);
void fv_service_stop(void);
void fv_service_wake(void);
void fv_wire_nodelay(int fd);
/* Watch @p fd under @p id for input, and output when @p want_out. */
void fv_wire_epoll_set(int fd, uint64_t id, int want_out, int op);
/* Write @p len bytes of @p buf from *@p off on; 1 all written, 0 would
 * block, -1 broken (errno set). */
int fv_wire_send_part(int fd, const void *buf, size_t len, size_t *off);

#endif /* CFX_FAKEVERBS_H */
