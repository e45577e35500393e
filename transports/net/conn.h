/*
 * The net-plugin transport's own types, shared by its files: plugin.c
 * (loading the library once per process, the v8 to v11 calls behind one face,
 * the logger), net.c (the ops table, setup, connect, close), data.c (the
 * passes that post isend/irecv and test them, failures). Nothing outside
 * transports/net includes this.
 *
 * The protocol (docs/transports.md, "net-plugin"): each side of a
 * connection has a local FIFO in one block of host memory, registered with
 * the plugin once after connect: [FIFO control block][slots][headers].
 * For each posted slot k the sender isends, on its one send comm and in
 * this order, the slot's 80-byte header (its 64-byte info line, and the
 * message and offset post_at gave it), then the payload (empty when it
 * travels inside the info line, size <= CFX_SLOT_INLINE_BYTES). It
 * releases slot k once both sends tested done. The receiver posts both
 * receives of slot k ahead, while slot k of its FIFO is free (k < head +
 * n_steps) and its request budget allows: the header into
 * staging[k % n_steps], then the payload (at most slot_bytes) straight
 * into the slot; when header_first() says so (an offer is live, or
 * buffers are registered and the slot may be an offered receive's), the
 * payload's receive waits for the header, and goes into the offered user
 * buffer when the header names the offered message. When both are in and
 * agree, it copies the line into the FIFO (CFX_SLOT_IN_PLACE when the
 * payload went into the user's buffer) and posts the slot. The plugin's
 * in-order matching of messages on a comm is what keeps the two streams
 * in step; the receiver's irecvs are its flow control (the plugin holds a
 * send until the matching receive is posted or buffers it), and posting
 * them ahead lets a rendezvous plugin move the next slots without a round
 * trip each.
 *
 * Poison: a sender that is told to stop sends, after the slots it already
 * sent, one more slot: a header whose line has size NET_POISON_SIZE and
 * seq 0 (from staging[n_steps], the poison's own), carrying the reason in
 * print.count and the rank to blame in print.root, then an empty payload;
 * the receiver's check() reports it. A receiver cannot tell its sender
 * anything (a comm goes one way): its peer learns of it when the comm is
 * closed, or by its own timeout.
 */
#ifndef CFX_TRANSPORTS_NET_CONN_H
#define CFX_TRANSPORTS_NET_CONN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "src/proxy/proxy.h"
#include "src/util/error.h"
#include "transports/net/nccl_net.h"
#include "transports/transport.h"

#define NET_MAX_REQUESTS  NCCL_NET_MAX_REQUESTS_V8 /* Outstanding per comm, at most. */
#define NET_POLL_NS       (200 * 1000)       /* Proxy pass interval while work is in flight. */
#define NET_IDLE_POLL_NS  (1000 * 1000)      /* A receiver waiting for its next slot. */
#define NET_LINGER_NS     (2 * 1000000000LL) /* close(): posted slots still get this long. */
#define NET_POISON_SIZE   0xffffffffu /* An info line with this size (and seq 0) is a poison. */
#define NET_INFO_MAGIC    0x43464e50u /* "CFNP" */
#define NET_NAME_MAX      64
#define NET_MAX_DEVS      16   /* Devices of a plugin Conflux looks at. */
#define NET_REG_MAX_CONNS 4096 /* Connections a registered buffer reaches. */
#define NET_OFFERS        8    /* Receiver: offers (receives into user buffers) at once. */

/* The loaded plugin, one per process (plugin.c): v8 to v11 behind one face. */
struct cfx_net_plugin {
    int version; /* 8 to 11: the newest table the library exports. */
    const ncclNet_v8_t *v8;
    const ncclNet_v9_t *v9;
    const ncclNet_v10_t *v10;
    const ncclNet_v11_t *v11;
    /* v11: the context init made, handed to every listen and connect. One
     * per process (NCCL makes one per communicator; a plugin keeps in it
     * what init's config said, here the same for every communicator). */
    void *ctx;
    char path[256];                            /* What dlopen took. */
    char name[NET_NAME_MAX];                   /* The table's name field. */
    int n_devs;                                /* As devices() said. */
    char dev_name[NET_MAX_DEVS][NET_NAME_MAX]; /* The first NET_MAX_DEVS devices' names. */
    int ptr_support[NET_MAX_DEVS];
    /* CFX_NET_FORCE_MERGE: the virtual device each device was merged into
     * (makeVDevice, v9 and later), or -1. Connections use that one. */
    int merged_into[NET_MAX_DEVS];
    int builtin;    /* One of Conflux's own nets (builtin.h), no library. */
    int has_iflush; /* The table's iflush is set. */
    int has_dmabuf; /* The table's regMrDmaBuf is set. */
};

/* The plugin, loaded on first call (thread-safe, once per process), or
 * NULL when CFX_NET_PLUGIN is unset. cfxSystemError with a sentence when
 * it is set and the library cannot be loaded, has neither table, fails
 * init, or has no device (the same sentence on every later call). */
cfxResult_t cfx_net_plugin_get(const struct cfx_net_plugin **plugin_p);

/* The plugin's calls, version-independent. Each returns its ncclResult_t. */
/* The device named @p nic_name ("mlx5_0"; a ":port" suffix on either
 * name is ignored; @p len bytes of it, a name in a list) that moves host
 * memory, or -1. */
int cfx_net_plugin_find_dev(const struct cfx_net_plugin *p, const char *nic_name, size_t len);
/* The device a connection meant for device @p dev uses: the virtual device
 * it was merged into (CFX_NET_FORCE_MERGE), else @p dev. */
int cfx_net_plugin_use_dev(const struct cfx_net_plugin *p, int dev);
ncclResult_t cfx_net_plugin_listen(const struct cfx_net_plugin *p, int dev, void *handle,
                                   void **listen_comm_p);
ncclResult_t cfx_net_plugin_connect(const struct cfx_net_plugin *p, int dev, void *handle,
                                    void **send_comm_p);
ncclResult_t cfx_net_plugin_accept(const struct cfx_net_plugin *p, void *listen_comm,
                                   void **recv_comm_p);
/* @p type: NCCL_PTR_HOST or NCCL_PTR_CUDA. */
ncclResult_t cfx_net_plugin_reg_mr(const struct cfx_net_plugin *p, void *comm, void *data,
                                   size_t bytes, int type, void **mhandle_p);
/* Registers @p bytes of device memory at @p data through the dma-buf @p fd
 * that covers exactly them (offset 0; the caller closes fd after). Only
 * with has_dmabuf. */
ncclResult_t cfx_net_plugin_reg_mr_dmabuf(const struct cfx_net_plugin *p, void *comm, void *data,
                                          size_t bytes, int fd, void **mhandle_p);
ncclResult_t cfx_net_plugin_dereg_mr(const struct cfx_net_plugin *p, void *comm, void *mhandle);
ncclResult_t cfx_net_plugin_isend(const struct cfx_net_plugin *p, void *send_comm, void *data,
                                  size_t bytes, void *mhandle, void **request_p);
ncclResult_t cfx_net_plugin_irecv(const struct cfx_net_plugin *p, void *recv_comm, void *data,
                                  size_t bytes, void *mhandle, void **request_p);
ncclResult_t cfx_net_plugin_test(const struct cfx_net_plugin *p, void *request, int *done_p,
                                 int *bytes_p);
/* Make @p bytes received at @p data (registered as NCCL_PTR_CUDA) visible
 * to the GPU; *request_p NULL: nothing to wait for. Only with has_iflush. */
ncclResult_t cfx_net_plugin_iflush(const struct cfx_net_plugin *p, void *recv_comm, void *data,
                                   size_t bytes, void *mhandle, void **request_p);
ncclResult_t cfx_net_plugin_close_send(const struct cfx_net_plugin *p, void *send_comm);
ncclResult_t cfx_net_plugin_close_recv(const struct cfx_net_plugin *p, void *recv_comm);
ncclResult_t cfx_net_plugin_close_listen(const struct cfx_net_plugin *p, void *listen_comm);
/* How far apart two devices of a net are, from their PCI paths (sysfs
 * directories, as getProperties gives them), nearest first with NCCL's
 * names: PORT for ports of one PCI device (one function, or functions of
 * one device), PIX behind one PCI switch, PXB behind several, PHB under
 * different root ports of one host bridge, SYS under different roots;
 * UNKNOWN when a path is missing or not a PCI device's. Pure. */
enum cfx_net_dist {
    CFX_NET_DIST_LOC,
    CFX_NET_DIST_PORT,
    CFX_NET_DIST_PIX,
    CFX_NET_DIST_PXB,
    CFX_NET_DIST_PHB,
    CFX_NET_DIST_SYS,
    CFX_NET_DIST_UNKNOWN
};
enum cfx_net_dist cfx_net_pci_distance(const char *a, const char *b);

/* The plugin's last warning into @p buf when it came within @p within_ns
 * (<= 0: whenever); 0 when there is none. */
int cfx_net_plugin_last_warning(char *buf, size_t len, int64_t within_ns);
/* "ncclRemoteError (6)", for sentences. */
const char *cfx_net_result_name(ncclResult_t res);

/* The connect info a side sends its peer (at most CFX_CONNECT_INFO_BYTES). */
struct cfx_net_info {
    uint32_t magic;
    int32_t rank;
    uint32_t dir;
    uint32_t n_steps;
    uint64_t slot_bytes;
    char handle[NCCL_NET_HANDLE_MAXSIZE]; /* The receiver's listen handle. */
};
_Static_assert(sizeof(struct cfx_net_info) <= CFX_CONNECT_INFO_BYTES, "fits the connect info");

/* Per-communicator state. */
struct cfx_net_ctx {
    int rank;
    /* The plugin devices this rank's connections use, channel c on
     * devs[c % n_devs]: those named as the topology's ports nearest this
     * rank (nic_near, the nearest first), else device 0
     * alone. */
    int devs[NET_MAX_DEVS];
    int n_devs;
    /* The path class from this rank's GPU to those ports, or -1: unknown
     * (a host rank, or device 0 for want of a name). */
    int nic_path;
    int gdr_level;                       /* cfx_transport_gdr_level(). */
    const struct cfx_net_plugin *plugin; /* NULL: CFX_NET_PLUGIN unset, accepts no pair. */
    const int *abort_flag;
    int64_t connect_timeout_s;
    cfxResult_t (*connect_check)(void *arg, int peer_rank);
    void *connect_check_arg;
    struct cfx_proxy *proxy;
    /* User buffers registered with the plugin (reg_mem), and the connected
     * host connections of either direction by registration slot (NULL:
     * free); under reg_lock (setup time). */
    pthread_mutex_t reg_lock;
    struct cfx_net_reg *regs;
    _Atomic int n_regs; /* How many (read by the data path without the lock). */
    struct cfx_net_conn *joined[NET_REG_MAX_CONNS];
};

/* A user buffer registered with the plugin for zero-copy sends and
 * receives (reg_mem): the plugin registers memory per comm, so once with
 * each connected connection's comm, now and as later ones connect:
 * mhandle[s] is the registration with the comm of registration slot s
 * (NULL: none), so a send or receive finds its handle without a search
 * (post_ref, offer). */
struct cfx_net_reg {
    char *buf;
    size_t bytes;
    struct cfx_net_reg *next;
    void *mhandle[NET_REG_MAX_CONNS];
};

/* What goes over the comm ahead of each slot's payload: its info line,
 * and the message and offset the sender gave it (post_at: mark is the
 * message + 1; 0: none), so a receiver that offered that message's buffer
 * posts the payload's receive there. */
struct cfx_net_header {
    struct cfx_slot_info info;
    uint64_t mark;
    uint64_t offset;
};

/* Receiver: a receive into a registered user buffer (offer). `mark` (the
 * message + 1; 0: free) is stored last by the user thread (release) and
 * cleared by the driving thread once `left` bytes of the message arrived,
 * in place or not. */
struct cfx_net_offer {
    _Atomic uint64_t mark;
    char *data;
    uint64_t bytes;
    uint64_t left; /* Driving thread's. */
    void *mhandle;
};

/* One slot's requests, on either side. */
struct cfx_net_slot {
    void *req_info, *req_data; /* Outstanding requests (NULL: none or done). */
    int info_done, data_done;
    /* Receiver flushing through the plugin (gdr_iflush): 1 once the
     * payload's iflush is posted (req_flush outstanding), 2 once done. */
    void *req_flush;
    int flush_state;
    int data_bytes; /* Receiver: bytes the payload's test reported. */
    int in_place;   /* Receiver: the payload's receive went into an offered buffer. */
};

/* Per-connector state. */
struct cfx_net_conn {
    struct cfx_net_ctx *ctx;
    const struct cfx_net_plugin *plugin;
    enum cfx_conn_dir dir;
    int self_rank;
    int peer_rank;
    int channel; /* The core's channel of the connection (which device: ctx->devs). */
    int dev;
    /* Memory: one block, registered once connected. */
    void *mem;
    size_t mem_bytes;
    /* A GPU rank's block: registered with CUDA for device pinned + 1 (its
     * kernel reads and writes the FIFO; the proxy moves the slots). */
    int pinned;
    int64_t moved_ns; /* When a pass last moved something (pinned). */
    /* GPUDirect RDMA through the plugin (a GPU rank whose device the
     * plugin's moves CUDA memory): the payload slots in device gdr - 1's
     * memory (dev_raw, aligned at slots), registered as slots_mhandle;
     * the receiver flushes the plugin's writes before it posts them: with
     * cuFlushGPUDirectRDMAWrites, or where the driver cannot, with the
     * plugin's iflush of each payload (gdr_iflush). Otherwise slots is in
     * mem and slots_mhandle is mhandle. */
    int gdr;
    int gdr_iflush;
    int gdr_dmabuf; /* The slots went to the plugin as a dma-buf (regMrDmaBuf). */
    void *dev_raw;
    void *slots_mhandle;
    uint64_t gdr_flushes; /* Receiver: flushes made. */
    struct cfx_fifo *fifo;
    char *slots;
    size_t slot_bytes;
    int n_steps;
    /* [n_steps] headers: the sender's as it sends them, the receiver's as
     * they came. */
    struct cfx_net_header *staging;
    /* The plugin's objects. */
    char handle[NCCL_NET_HANDLE_MAXSIZE]; /* Receiver: its listen handle; sender: the peer's. */
    void *listen_comm;
    void *comm; /* sendComm or recvComm. */
    /* Receiver: in the process's list of connectors still to accept
     * (net.c, "pending accepts"; under its lock), and what the accept
     * that took it off said. */
    int pending;
    struct cfx_net_conn *pending_next;
    ncclResult_t accept_res;
    void *mhandle;
    int registered; /* Added to the proxy. */
    int reg_slot;   /* In ctx->joined, once a connected host connection; -1: none. */
    /* Sender: slot index i's payload goes from ref_data[i] (a registered
     * user buffer, ref_mhandle[i]) instead of the slot (post_ref); NULL:
     * from the slot. */
    const void *ref_data[CFX_MAX_STEPS];
    void *ref_mhandle[CFX_MAX_STEPS];
    uint64_t ref_sent; /* Payloads sent from user buffers. */
    /* Sender: slot index i is message at_mark[i] - 1's bytes at
     * at_offset[i] (post_at; 0: no mark). */
    uint64_t at_mark[CFX_MAX_STEPS];
    uint64_t at_offset[CFX_MAX_STEPS];
    /* Receiver: offers by message mod NET_OFFERS, how many are live
     * (while any is, a slot's payload receive waits for its header, to be
     * posted where the header says), and payloads received in place. */
    struct cfx_net_offer offers[NET_OFFERS];
    _Atomic int offers_live;
    uint64_t in_place;
    struct cfx_proxy_client client;
    /* Progress, by whichever thread drives (cfx_net_conn_drive). */
    struct cfx_net_slot slot[CFX_MAX_STEPS];
    int n_reqs; /* Requests outstanding on the comm. */
    /* Sender: slots [released, issued) have their sends posted; slot
     * `issued` has its header's send posted when header_issued. */
    uint64_t released, issued;
    int header_issued;
    /* Receiver: slots [arrived, posted) have both receives posted; slot
     * `posted` has its header's receive posted when header_posted. */
    uint64_t arrived, posted;
    int header_posted;
    _Atomic int poison_reason; /* Set by poison(): stop issuing (a sender tells its peer). */
    _Atomic int poison_blame;
    void *req_poison;        /* Sender: the poison header's send, outstanding. */
    void *req_poison_empty;  /* Sender: the empty payload's send after it, outstanding. */
    int poison_sent;         /* Sender: 1: the header's send is posted; 2: the payload's too. */
    _Atomic int poison_done; /* Sender: and completed (close() lingers for it). */
    /* Receiver: the peer's poison line came (reason, blame rank); set by
     * the driving thread, read by check(). */
    _Atomic int peer_poison;
    int peer_poison_blame;
    _Alignas(CFX_CACHE_LINE) _Atomic int busy;
    _Atomic int wanted;
    /* Failure: written by the driving thread, then `failed` (release). */
    _Alignas(CFX_CACHE_LINE) _Atomic int failed;
    cfxResult_t failed_res;
    int blame_rank;
    char error[CFX_ERROR_MAX];
};

/* data.c */
int cfx_net_conn_drive(struct cfx_net_conn *nc);
cfxResult_t cfx_net_conn_check(struct cfx_net_conn *nc, struct cfx_connector *conn);
/* Whether the connector has work in flight the proxy must pass over. */
int cfx_net_conn_busy(const struct cfx_net_conn *nc);

#endif /* CFX_TRANSPORTS_NET_CONN_H */
