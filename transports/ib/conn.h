/*
 * The verbs transport's own types, shared by its files: ib.c (the ops
 * table, lifecycle, setup, connect, close), device.c (which NIC, port and
 * GID; CFX_IB_HCA), data.c (the passes that post writes and poll
 * completions, credits, poison, keepalives, failures). Nothing outside
 * transports/ib includes this. Built only with the verbs headers
 * (CFX_HAVE_VERBS).
 *
 * The protocol (docs/transports.md, "ib"): each side of a connection has a
 * local FIFO, as with sockets, in one block of memory registered once at
 * setup: [FIFO control block][slots][mailbox]. The sender RDMA-writes a
 * posted slot's payload into the receiver's slot of the same index, then
 * its info line into the receiver's mailbox (staged[index]) with
 * RDMA_WRITE_WITH_IMM (immediate = slot number): on an RC queue pair that
 * completion at the receiver means both writes have landed. Only then does
 * the receiver copy the staged line into its FIFO and mark the slot posted.
 * The receiver grants slots by RDMA-writing its head (slots released) into
 * the sender's mailbox (credit); the sender writes slot k only while
 * k < credit + n_steps. Either side RDMA-writes a poison word into the
 * other's mailbox when it fails, and a keepalive while it waits, so a dead
 * peer shows as a failed write (IBV_WC_RETRY_EXC_ERR) within the retry
 * time.
 */
#ifndef CFX_TRANSPORTS_IB_CONN_H
#define CFX_TRANSPORTS_IB_CONN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "src/proxy/proxy.h"
#include "src/util/error.h"
#include "src/util/verbs.h"
#include "transports/transport.h"

#define IB_NAME_MAX          64
#define IB_MAX_QPS           8                   /* CFX_IB_QPS_PER_CONNECTION at most. */
#define IB_MAX_NICS          4                   /* Ports a communicator stripes over at most. */
#define IB_CREDITS_IN_FLIGHT 4                   /* Credit writes outstanding at most. */
#define IB_KEEPALIVE_NS      (100 * 1000 * 1000) /* A waiting side writes this often. */
#define IB_POLL_NS           (200 * 1000)        /* Proxy pass interval while work is in flight. */
#define IB_LINGER_NS         (2 * 1000000000LL)  /* close(): posted slots still get this long. */
#define IB_FLUSH_WHY_NS      (100 * 1000 * 1000) /* check() waits this long for a flush's cause. */
#define IB_INFO_MAGIC        0x43464942u         /* "CFIB" */

/* Work request ids: the kind in the top byte, a slot number below. */
enum ib_wr_kind {
    IB_WR_PAYLOAD = 1, /* A slot's payload (the info write follows). */
    IB_WR_SLOT = 2,    /* A slot's info line, with the immediate. */
    IB_WR_CREDIT = 3,
    IB_WR_POISON = 4,
    IB_WR_ALIVE = 5,
    IB_WR_RECV = 6,
    IB_WR_OFFER = 7, /* A registered receive's offer, into the sender's mailbox. */
    IB_WR_FLUSH = 8, /* GPUDirect RDMA: the loopback read that flushes the NIC's writes. */
};

/* How a GPU rank's slots in device memory are registered with the NIC. */
enum ib_gdr_mode {
    IB_GDR_NONE = 0,    /* Slots in pinned host memory, staged. */
    IB_GDR_DMABUF = 1,  /* ibv_reg_dmabuf_mr of a dma-buf CUDA exported. */
    IB_GDR_PEERMEM = 2, /* ibv_reg_mr of the device pointer (nvidia-peermem). */
};

/* Offers a receiver keeps in flight, and the sender's ring of them. */
#define IB_OFFERS 8

/* A receiver's offer (ib_offer): message `msg` may be written at `addr`
 * (`bytes`; through the receiver's port n, key `rkey[n]`). `msg_plus1` and
 * `check` are both msg + 1: the writer's NIC places the record in order, and
 * the sender reads `check` first and `msg_plus1` last, so equal values mean
 * a whole record. */
struct cfx_ib_offer {
    uint64_t msg_plus1;
    uint64_t addr;
    uint64_t bytes;
    uint32_t rkey[IB_MAX_NICS];
    uint64_t check;
};
#define IB_WR_ID(kind, value) (((uint64_t)(kind) << 56) | ((uint64_t)(value) & ((1ull << 56) - 1)))
#define IB_WR_KIND(id)        ((enum ib_wr_kind)((id) >> 56))
#define IB_WR_VALUE(id)       ((id) & ((1ull << 56) - 1))

/* What the peer may write into this side's memory, after the slots. */
struct cfx_ib_mailbox {
    CFX_ALIGNAS(CFX_CACHE_LINE) uint64_t credit; /* Sender's: the receiver's head. */
    CFX_ALIGNAS(CFX_CACHE_LINE) uint64_t poison; /* (reason << 32) | (blame rank + 1); 0: none. */
    uint64_t alive;                              /* The peer's keepalive count. */
    /* Sources of this side's small writes, when the NIC cannot inline them. */
    CFX_ALIGNAS(CFX_CACHE_LINE) uint64_t credit_src;
    uint64_t poison_src;
    uint64_t alive_src;
    uint64_t flush_sink; /* Receiver: where a flush's loopback read lands (never read). */
    /* Receiver's: each slot's info line as the sender wrote it. */
    struct cfx_slot_info staged[CFX_MAX_STEPS];
    /* Sender's: the receiver's offers, offer n at n % IB_OFFERS. */
    CFX_ALIGNAS(CFX_CACHE_LINE) struct cfx_ib_offer offers[IB_OFFERS];
    /* Receiver's: the sources of its offer writes. */
    struct cfx_ib_offer offer_src[IB_OFFERS];
};

/* One port of a side, in its connect info: queue pair q of that side lives
 * on its port q % n_nics. */
struct cfx_ib_info_nic {
    uint8_t gid[16];
    uint32_t rkey; /* The side's block, registered through this port's device. */
    uint16_t lid;
    uint8_t mtu;         /* enum ibv_mtu */
    uint8_t link_layer;  /* IBV_LINK_LAYER_* */
    uint32_t slots_rkey; /* The slots' (in device memory with GPUDirect RDMA: their own region). */
    char name[12];       /* For sentences: "fake_0:1". */
};

/* The connect info a side sends its peer (at most CFX_CONNECT_INFO_BYTES). */
struct cfx_ib_info {
    uint32_t magic;
    int32_t rank;
    uint32_t dir;
    uint32_t n_qps;
    uint32_t qpn[IB_MAX_QPS];
    uint32_t psn;
    uint32_t n_steps;
    uint32_t n_nics; /* Ports this side's queue pairs use, 1..IB_MAX_NICS. */
    uint32_t pad;
    uint64_t slot_bytes;
    uint64_t mem_addr;   /* This side's block: FIFO, slots, mailbox. */
    uint64_t slots_addr; /* In the block, or in device memory (GPUDirect RDMA). */
    uint64_t box_offset;
    struct cfx_ib_info_nic nic[IB_MAX_NICS];
};
_Static_assert(sizeof(struct cfx_ib_info) <= CFX_CONNECT_INFO_BYTES, "fits the connect info");

/* A NIC port a communicator uses (device.c). */
struct cfx_ib_port {
    char dev_name[IB_NAME_MAX];
    int port;
    int link_layer; /* IBV_LINK_LAYER_INFINIBAND or _ETHERNET. */
    uint16_t lid;
    enum ibv_mtu mtu;
    int gid_index; /* -1: no GRH (InfiniBand inside one subnet). */
    union ibv_gid gid;
    char label[24]; /* "mlx5_0:1", for sentences. */
};

struct cfx_ib_ctx;

/* One port with its own device context and protection domain (device.c
 * opens the device once per port it takes). */
struct cfx_ib_nic {
    struct cfx_ib_ctx *ctx;
    struct ibv_context *dev;
    struct ibv_pd *pd;
    struct cfx_ib_port port;
    /* Async events: the device's async_fd watched by the proxy. */
    struct cfx_proxy_client async_client;
    int async_added;
    /* Set (release) by an async event that breaks every connection over
     * this port (port down, device fatal), with its sentence; check()
     * reports it to the connections that use the port. */
    _Atomic int fatal;
    char fatal_error[CFX_ERROR_MAX];
};

/* Per-communicator state. */
struct cfx_ib_ctx {
    int rank;
    const struct cfx_verbs_api *ibv; /* NULL: no usable device (usable == 0). */
    int usable;
    char why_not[CFX_ERROR_MAX]; /* Why not usable, for the INFO line. */
    /* The ports, nearest first (the topology's NIC for this rank, then the
     * order libibverbs lists them). A connection's queue pair q uses
     * nic[q % n_nics]: with one queue pair only the nearest port. */
    struct cfx_ib_nic nic[IB_MAX_NICS];
    int n_nics;
    const char *nearest; /* The topology's NIC for this rank (env), during init. */
    /* GPUDirect RDMA: CFX_NET_GDR_LEVEL as a path class (-1: never) and the
     * path from this rank's GPU to its nearest port (-1: not known). */
    int gdr_level;
    int nic_path;
    int dmabuf_enable;     /* CFX_DMABUF_ENABLE. */
    int peermem;           /* CFX_IB_PEERMEM: -1 when the module is loaded, 0 never, 1 always. */
    int flush_read_forced; /* CFX_IB_GDR_FLUSH=read. */
    struct cfx_proxy *proxy;
    /* Queue pair settings (NCCL's variables). */
    int timeout, retry_cnt, sl, tc;
    int qps_per_conn; /* CFX_IB_QPS_PER_CONNECTION (the verbs net reads it here). */
    int split_data;   /* CFX_IB_SPLIT_DATA_ON_QPS (the verbs net only). */
};

/* A user buffer registered through every port's device (reg_mem). */
struct cfx_ib_reg {
    const char *addr;
    size_t length;
    struct ibv_mr *mr[IB_MAX_NICS];
};

/* Per-connector state. */
struct cfx_ib_conn {
    struct cfx_ib_ctx *ctx;
    enum cfx_conn_dir dir;
    int self_rank;
    int peer_rank;
    /* Memory: one block, registered through each port used (mr[n]); for
     * a GPU rank (place.reader CFX_READER_KERNEL) also pinned for device
     * `pinned - 1` (cuMemHostRegister), its kernel reading and writing the
     * FIFO through the mapping. */
    void *mem;
    size_t mem_bytes;
    int pinned;
    int64_t moved_ns; /* A pinned connector's last pass that moved anything. */
    /* GPUDirect RDMA: the slots in device `gdr_device - 1`'s memory
     * (`dev_mem`, page-aligned inside `dev_raw`), registered through each
     * port as a dma-buf (slots_mr[n]); the NIC reads and writes them there
     * and a receiver flushes before it posts what arrived. 0: the slots
     * are in the block. */
    int gdr_device;
    enum ib_gdr_mode gdr_mode;
    void *dev_raw;
    char *dev_mem;
    struct ibv_mr *slots_mr[IB_MAX_NICS];
    uint64_t gdr_flushes; /* Receiver: flushes made (INFO at close). */
    /* Receiver with slots in device memory: slots (bit: number % n_steps)
     * whose bytes a flush made visible; they are posted only then. Without
     * cuFlushGPUDirectRDMAWrites the flush is an RDMA read of the slots
     * through flush_qp, a queue pair on port 0 connected to itself (PCIe
     * keeps a read behind the writes before it); flush_cover is what the
     * read in flight covers. */
    uint64_t flushed_mask;
    struct ibv_qp *flush_qp;
    struct ibv_cq *flush_cq;
    int flush_inflight;
    uint64_t flush_cover;
    struct cfx_fifo *fifo;
    char *slots;
    size_t slot_bytes;
    int n_steps;
    struct cfx_ib_mailbox *box;
    /* Slot k travels on qp[k % n_qps] (payload and info line together, so
     * RC ordering still covers the slot); credits, poisons and keepalives
     * on qp[0]. Queue pair q lives on this side's port q % n_nics (of
     * ctx->nic) and talks to the peer's port q % peer_n_nics; one
     * completion queue per port used. */
    struct ibv_qp *qp[IB_MAX_QPS];
    int n_qps;
    int n_nics; /* Ports used: min(n_qps, ctx->n_nics). */
    struct ibv_mr *mr[IB_MAX_NICS];
    struct ibv_cq *cq[IB_MAX_NICS];
    uint32_t psn;
    int max_inline;
    int sq_depth; /* Per queue pair. */
    /* The peer's block; each queue pair's key to it and the peer port's
     * name. */
    uint64_t peer_addr, peer_slots, peer_box;
    int peer_n_nics;
    uint32_t peer_rkey[IB_MAX_QPS];
    uint32_t peer_slots_rkey[IB_MAX_QPS];
    char peer_nic[IB_MAX_QPS][20];
    /* Progress, by whichever thread drives (cfx_ib_conn_drive). */
    int registered;
    /* Set by the first user-thread call (the core's "connected" exchange is
     * over): until then the proxy writes nothing on its own (a keepalive
     * reaching a peer not yet connected would be dropped and retried only
     * after the ACK timeout, holding up everything behind it). */
    _Atomic int started;
    struct cfx_proxy_client client;
    int sq_used[IB_MAX_QPS]; /* Work requests posted and not completed, per queue pair. */
    int sq_total;            /* Their sum. */
    /* Sender: slots (bit: number % n_steps) whose payload write, posted
     * unsignaled, still holds a send-queue entry until the slot's info
     * write completes. */
    uint64_t payload_mask;
    uint64_t sent; /* Sender: slots whose writes are posted. */
    /* Sender: slots whose payload is a registered user buffer (post_ref),
     * by slot index: its address and key (0: the slot's own bytes); set by
     * the posting thread before it posts the slot, cleared by the pass
     * that writes it. */
    uint64_t ref_addr[CFX_MAX_STEPS];
    const struct cfx_ib_reg *ref_reg[CFX_MAX_STEPS];
    uint64_t ref_slots; /* Slots written from registered buffers (INFO at close). */
    /* Sender: each posted slot's point-to-point message + 1 and offset
     * (post_at; 0: none), set by the posting thread before it posts. */
    uint64_t at_msg[CFX_MAX_STEPS];
    uint64_t at_offset[CFX_MAX_STEPS];
    uint64_t in_place_slots; /* Sender: slots written into offered buffers (INFO at close). */
    /* Receiver: offers made (by the launching thread, release; each in
     * offer_src[n % IB_OFFERS]), posted and completed (by the driving
     * thread, completed with release). The launching thread makes none
     * while IB_OFFERS are not completed, so no source is rewritten in
     * flight. */
    _Atomic uint64_t offers_made;
    uint64_t offers_posted;
    _Atomic uint64_t offers_done;
    uint64_t done_mask; /* Sender: slots completed past the FIFO's head (bit: number % n_steps). */
    uint64_t arrived;   /* Receiver: slots posted into the FIFO, in order (the tail). */
    uint64_t arrived_mask; /* Receiver: immediates come past `arrived` (bit: number % n_steps). */
    uint64_t credit_sent;  /* Receiver: the head last written to the sender. */
    int credits_inflight;  /* Receiver: credit writes not completed. */
    int alive_inflight;    /* A keepalive not completed. */
    int64_t alive_due_ns;  /* When the next keepalive is due, while waiting. */
    int poison_posted;
    _Atomic int poison_done;   /* Its write completed (close() lingers for it). */
    _Atomic int poison_reason; /* Set by poison(): a poison to write. */
    _Atomic int poison_blame;
    _Alignas(CFX_CACHE_LINE) _Atomic int busy;
    _Atomic int wanted;
    /* Failure: written by the driving thread, then `failed` (release). */
    _Alignas(CFX_CACHE_LINE) _Atomic int failed;
    cfxResult_t failed_res;
    int blame_rank;
    int64_t flushed_ns; /* The failure was a flush (cause unknown), at this time. */
    char error[CFX_ERROR_MAX];
    /* An async event failed a queue pair of this connection: its name
     * (ibv_event_type_str's) and port, stored by whichever thread read the
     * event, so a pass that holds `busy` meanwhile can still say why it was
     * flushed. */
    _Atomic(const char *) qp_event;
    _Atomic(const char *) qp_event_nic;
};

/* This side's port of queue pair @p q. */
static inline struct cfx_ib_nic *cfx_ib_qp_nic(const struct cfx_ib_conn *ic, int q)
{
    return &ic->ctx->nic[q % ic->n_nics];
}

/* device.c: pick and open the ports for @p ctx (ctx->ibv set): every active
 * port CFX_IB_HCA lets through, the topology's nearest (ctx->nearest)
 * first, at most IB_MAX_NICS; fills ctx->nic and ctx->n_nics. cfxSuccess,
 * or cfxSystemError with ctx->why_not set (no device, no active port,
 * CFX_IB_HCA matched none). */
cfxResult_t cfx_ib_device_open(struct cfx_ib_ctx *ctx);
void cfx_ib_device_close(struct cfx_ib_ctx *ctx);
/* Whether NIC @p name port @p port passes the CFX_IB_HCA filter @p spec
 * (NCCL syntax: "mlx5_0:1,mlx5_1", "^" excludes, "=" matches exactly;
 * NULL or "" passes everything). */
int cfx_ib_hca_match(const char *spec, const char *name, int port);

/* data.c */
int cfx_ib_conn_drive(struct cfx_ib_conn *ic);
cfxResult_t cfx_ib_conn_check(struct cfx_ib_conn *ic, struct cfx_connector *conn);
/* Post @p count receives on queue pair @p q (a receiver keeps n_steps on
 * each; at setup, before the peer connects). */
cfxResult_t cfx_ib_post_recvs(struct cfx_ib_conn *ic, int q, int count);
/* The proxy's handler of one port's device's async events
 * (nic->async_client; @p arg is the struct cfx_ib_nic). */
void cfx_ib_async_ready(void *arg, uint32_t events);
/* Whether the connector still has work in flight (writes posted and not
 * completed, posted slots not yet written, a credit owed). */
int cfx_ib_conn_busy(const struct cfx_ib_conn *ic);

/* device.c, for the verbs transport (data.c) and the verbs net (net.c). */
/* What an async event breaks: a queue pair (fatal, request, access, path
 * migration errors), every connection over the port (port error, device
 * fatal, CQ error), or nothing (the rest, logged only). */
enum cfx_ib_event_scope { CFX_IB_EVENT_OTHER, CFX_IB_EVENT_QP, CFX_IB_EVENT_PORT };
enum cfx_ib_event_scope cfx_ib_event_scope(enum ibv_event_type type);
/* Marks @p nic broken by the event @p what, once, with the sentence
 * "<prefix><device> port <n><suffix>: <what>"; 1 when this call marked it
 * (the caller says so), 0 when it was already. */
int cfx_ib_nic_mark_fatal(struct cfx_ib_nic *nic, const char *prefix, const char *suffix,
                          const char *what);

/* ib.c, for the verbs net (net.c) too. */
/* CFX_IB_TIMEOUT, _RETRY_CNT, _SL, _TC, _QPS_PER_CONNECTION,
 * _SPLIT_DATA_ON_QPS, _PEERMEM, _GDR_FLUSH and CFX_DMABUF_ENABLE into
 * @p ctx. */
void cfx_ib_ctx_qp_params(struct cfx_ib_ctx *ctx);
/* Whether ibv_reg_mr may take device pointers: CFX_IB_PEERMEM=1, or -1
 * (the default) and nvidia-peermem (or nv_peer_mem) is loaded. */
int cfx_ib_peermem_usable(const struct cfx_ib_ctx *ctx);
/* A queue pair on @p nic connected to itself (RTS), whose completions go to
 * @p cq, with @p depth send work requests, that may read memory registered
 * with remote read on the NIC's protection domain: a receiver flushes
 * GPUDirect RDMA writes with a read through it (the read completes after
 * the writes before it are visible). *@p qp_p is set once created (the
 * caller destroys it, on failure too). */
cfxResult_t cfx_ib_loopback_qp(struct cfx_ib_ctx *ctx, struct cfx_ib_nic *nic, struct ibv_cq *cq,
                               void *context, int depth, uint32_t psn, struct ibv_qp **qp_p);
/* A random 24-bit starting packet sequence number. */
uint32_t cfx_ib_random_psn(void);
/* RTR then RTS: @p qp on @p port, to queue pair @p dest_qpn behind the port
 * @p theirs describes, whose send queue starts at @p rq_psn; this side's
 * starts at @p sq_psn. @p what names the queue pair in sentences. */
cfxResult_t cfx_ib_qp_rtr_rts(struct cfx_ib_ctx *ctx, struct ibv_qp *qp,
                              const struct cfx_ib_port *port, const struct cfx_ib_info_nic *theirs,
                              uint32_t dest_qpn, uint32_t rq_psn, uint32_t sq_psn,
                              const char *what);

#endif /* CFX_TRANSPORTS_IB_CONN_H */
