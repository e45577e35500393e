/*
 * The verbs net: Conflux's verbs byte mover as an ncclNet_v9-shaped table
 * ("IB"), behind the net driver's one internal interface
 * (transports/net/builtin.h; CFX_NET_PLUGIN=builtin:ib). The ports are the
 * verbs transport's (device.c: active ports, CFX_IB_HCA, GID choice), and
 * its queue pair settings (CFX_IB_TIMEOUT, _RETRY_CNT, _SL, _TC); only the
 * plain RC subset of verbs is used.
 *
 * CFX_IB_QPS_PER_CONNECTION RC queue pairs per comm (the sender's count;
 * the receiver takes it), set up over a TCP connection (the interface
 * CFX_SOCKET_IFNAME picks) that stays open for the comm's life:
 *   - the sender sends its queue pairs' addresses and its clear-to-send
 *     FIFO (IBN_REQUESTS records, registered for remote writes), the
 *     receiver creates as many queue pairs, connects them (RTR, RTS),
 *     posts its receives and answers with its own addresses; the sender
 *     connects and sends one "ready" byte, and only then does either side
 *     return its comm, so no write reaches a queue pair not ready for it;
 *   - irecv k writes a clear-to-send record (the buffer's address, rkey and
 *     size, with k + 1 at both ends) into record k mod n of the sender's
 *     FIFO, over queue pair 0; isend k waits for that record (a NULL
 *     request until it is there: call again) and RDMA-writes the message
 *     straight into the buffer with RDMA_WRITE_WITH_IMM, the bytes written
 *     as the immediate: whole on queue pair k mod Q, or split in 128-byte
 *     aligned parts over all Q with CFX_IB_SPLIT_DATA_ON_QPS=1 (NCCL's
 *     two ways). Each queue pair delivers in order, so the receiver knows
 *     which message an immediate on queue pair q is for; a receive
 *     completes when all its parts' immediates arrived, a send when all
 *     its writes completed;
 *   - a completion in error fails the comm (ncclRemoteError for the peer
 *     or the path gone), and so does the TCP connection closing under it,
 *     which is how a receiver with nothing in flight learns that its
 *     sender died;
 *   - async events (read without blocking from the device's descriptor,
 *     by whichever comm's test() comes first, every IBN_ALIVE_NS and at
 *     once after a completion in error): a queue pair's fatal event fails
 *     its comm, a port error or device fatal event every comm on the
 *     port, each with a sentence naming the port and the event. A flushed
 *     completion (a queue pair gone to error) waits up to IB_FLUSH_WHY_NS
 *     for the event that says why before it fails the comm itself.
 * Memory: host memory always; device memory (GPUDirect RDMA, NCCL's rule)
 * as a dma-buf (NCCL_PTR_DMABUF, regMrDmaBuf: CFX_DMABUF_ENABLE and a
 * libibverbs and kernel that take them) or by address through
 * nvidia-peermem (regMr of NCCL_PTR_CUDA: CFX_IB_PEERMEM). A receive comm
 * then has a loopback queue pair for iflush, a one-byte RDMA read of the
 * buffer that completes after the NIC's writes into it are visible to the
 * GPU. Registration is through every port of the comm's device; nothing on
 * the data path registers memory.
 */
#include "cfx_build_config.h"
#include "transports/net/builtin.h"

#if CFX_HAVE_VERBS

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "src/util/socket.h"
#include "src/util/time.h"
#include "transports/ib/conn.h"

#define IBN_MAGIC    0x4346584e45544942ull  /* "CFXNETIB" */
#define IBN_REQUESTS 32                     /* Outstanding per comm; clear-to-send records. */
#define IBN_SQ_DEPTH (2 * IBN_REQUESTS + 8) /* Per queue pair. */
#define IBN_CQ_DEPTH (IBN_SQ_DEPTH + IBN_REQUESTS + 8)
#define IBN_WR_CTS   ((uint64_t)1 << 32)  /* A clear-to-send write; else a request index, */
#define IBN_WR_QP(q) ((uint64_t)(q) << 8) /* | the queue pair it went on. */
#define IBN_ALIGN    128                  /* Parts of a split message start so aligned. */
#define IBN_ALIVE_NS (10 * 1000 * 1000)   /* How often test() looks at the TCP connection. */
#define IBN_MAX_DEVS (2 * IB_MAX_NICS)    /* Ports, then virtual devices. */
#define IBN_FLUSHES  8                    /* iflush reads in flight per receive comm. */
#define IBN_WR_FLUSH ((uint64_t)1 << 33)  /* An iflush's read; | its index. */

/* A device: one port (devices 0 .. n_nics - 1), or a virtual device of
 * several (makeVDevice), whose comms put queue pair q on port q mod n. */
struct ibn_dev {
    int n;
    int port[IB_MAX_NICS]; /* Indices into ibn_ctx.nic. */
    char name[64];         /* "mlx5_0" or "mlx5_0+mlx5_1", as NCCL names them. */
    char label[64];        /* "mlx5_0:1" or "mlx5_0:1+mlx5_1:1", for sentences. */
};

static ncclDebugLogger_t logger;
static struct cfx_ib_ctx ibn_ctx; /* The ports, once per process (init). */
static int ibn_ready;
static struct ibn_dev ibn_devs[IBN_MAX_DEVS];
static int ibn_n_devs;
static char ibn_dev_pci[IB_MAX_NICS][256];
static union cfx_sockaddr ibn_oob_addr; /* Where the TCP connections listen. */
/* NCCL_PTR_HOST, | NCCL_PTR_CUDA with nvidia-peermem (device memory by
 * address), | NCCL_PTR_DMABUF with dma-bufs (init): NCCL's bits. */
static int ibn_ptr_support;
static pthread_mutex_t ibn_async_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((format(printf, 3, 4))) static void ibn_log(ncclDebugLogLevel level, int line,
                                                          const char *fmt, ...)
{
    if (logger == NULL)
        return;
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    logger(level, NCCL_LOG_SUBSYS_NET, "transports/ib/net.c", line, "%s", text);
}
#define IBN_WARN(...) ibn_log(NCCL_LOG_WARN, __LINE__, __VA_ARGS__)
#define IBN_INFO(...) ibn_log(NCCL_LOG_INFO, __LINE__, __VA_ARGS__)

/* A clear-to-send record: `seq` and `check` are both k + 1 for irecv k;
 * the NIC places a write in order, and the sender reads `check` first and
 * `seq` last, so equal values mean a whole record. */
struct ibn_cts {
    uint64_t seq;
    uint64_t addr;
    uint64_t size;
    uint32_t rkey[IB_MAX_NICS]; /* The buffer's, through each of the receiver's ports. */
    uint64_t check;
};

/* A registration: through each port of the comm's device. */
struct ibn_mr {
    int n;
    int cuda; /* Device memory (NCCL_PTR_CUDA): an iflush reads it. */
    struct ibv_mr *mr[IB_MAX_NICS];
};

/* What each side sends the other over TCP. */
struct ibn_info {
    uint64_t magic;
    uint64_t nonce; /* The listener's, from the handle. */
    uint32_t qpn[IB_MAX_QPS];
    uint32_t psn;
    uint32_t n_qps;    /* The sender's; the receiver answers with as many. */
    uint32_t split;    /* The sender's CFX_IB_SPLIT_DATA_ON_QPS. */
    uint32_t cts_rkey; /* Through its port 0. */
    uint64_t cts_addr; /* Sender: its clear-to-send FIFO. */
    uint32_t n_ports;  /* Its queue pair q is on its port q mod n_ports. */
    uint32_t pad;
    struct cfx_ib_info_nic nic[IB_MAX_NICS];
};

struct ibn_handle {
    uint64_t magic;
    uint64_t nonce;
    struct cfx_sockaddr_wire addr;
    int32_t dev;
    int32_t pad;
    struct ibn_stage *stage; /* The sender's connect in progress (its copy of the handle). */
};
_Static_assert(sizeof(struct ibn_handle) <= NCCL_NET_HANDLE_MAXSIZE, "fits the handle");

struct ibn_comm;

struct ibn_request {
    struct ibn_comm *comm;
    int used, done;
    int left;   /* Parts (completions) still to come. */
    uint64_t k; /* The message's number on the comm. */
    uint64_t size;
};

struct ibn_comm {
    int is_send;
    int dev;
    /* The device's ports, each with its completion queue; queue pair q
     * is on port q mod n_ports, the peer's on its port q mod peer_ports. */
    int n_ports, peer_ports;
    struct cfx_ib_nic *port[IB_MAX_NICS];
    struct ibv_cq *cq[IB_MAX_NICS];
    int fd; /* The TCP connection: setup, then liveness. */
    struct ibv_qp *qp[IB_MAX_QPS];
    int n_qps;
    int split; /* Each message over all queue pairs; else message k on k mod n_qps. */
    int max_inline;
    int sq_used[IB_MAX_QPS]; /* Signaled send work requests not completed yet. */
    /* Receiver: the number of the message the next immediate on queue
     * pair q belongs to. */
    uint64_t qnext[IB_MAX_QPS];
    /* Set (release) by an async event on one of the queue pairs: its name. */
    const char *_Atomic qp_event;
    /* Sender: the FIFO the receiver writes into. Receiver: the sources
     * of its writes (registered, for a NIC without inline data) and where
     * they go. */
    struct ibn_cts *cts;
    struct ibv_mr *cts_mr;
    uint64_t peer_cts_addr;
    uint32_t peer_cts_rkey;
    struct ibn_request req[IBN_REQUESTS];
    /* Message k's request is order[k mod IBN_REQUESTS] for k in [head,
     * tail); ended[k mod IBN_REQUESTS] once it completed. tail is also
     * the next message's k. */
    int order[IBN_REQUESTS];
    unsigned char ended[IBN_REQUESTS];
    uint64_t head, tail;
    ncclResult_t failed;
    int64_t alive_ns; /* When test() last looked at the TCP connection. */
    /* A flushed completion whose cause (an async event) is not known yet:
     * when it came and its status; the comm fails IB_FLUSH_WHY_NS later
     * with the status, or as soon as the event is read, with the event. */
    int64_t flushed_ns;
    enum ibv_wc_status flushed_status;
    /* Receiver, when the device moves CUDA memory: iflush reads one byte
     * of the last buffer received through this queue pair, connected to
     * itself on port 0 (completions on cq[0]), into flush_sink. */
    struct ibv_qp *flush_qp;
    struct ibv_mr *flush_mr;
    uint64_t flush_sink;
    struct ibn_request flush_req[IBN_FLUSHES];
};

struct ibn_listen {
    int fd;
    int dev;
    uint64_t nonce;
    struct ibn_stage *pending; /* An accepted connection being set up. */
};

/* A connection being set up, on either side. */
struct ibn_stage {
    int fd;
    int step; /* Sender: 0 connecting, 1 sending info, 2 receiving, 3 ready byte. */
    struct ibn_comm *comm;
    struct ibn_info mine, theirs;
    size_t sent, got;
};

/* ------------------------------------------------------------ comms */

static void comm_free(struct ibn_comm *c)
{
    if (c == NULL)
        return;
    const struct cfx_verbs_api *ibv = ibn_ctx.ibv;
    for (int q = 0; q < c->n_qps; q++)
        if (c->qp[q])
            ibv->destroy_qp(c->qp[q]);
    if (c->flush_qp)
        ibv->destroy_qp(c->flush_qp);
    if (c->flush_mr)
        ibv->dereg_mr(c->flush_mr);
    for (int p = 0; p < c->n_ports; p++)
        if (c->cq[p])
            ibv->destroy_cq(c->cq[p]);
    if (c->cts_mr)
        ibv->dereg_mr(c->cts_mr);
    free(c->cts);
    if (c->fd >= 0)
        close(c->fd);
    free(c);
}

/* A comm on device @p dev with its @p n_qps queue pairs in INIT and its
 * clear-to-send records registered; NULL (with a warning) on failure. */
static struct ibn_comm *comm_new(int dev, int is_send, int n_qps, int split)
{
    const struct cfx_verbs_api *ibv = ibn_ctx.ibv;
    struct ibn_comm *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->fd = -1;
    c->is_send = is_send;
    c->dev = dev;
    c->n_ports = ibn_devs[dev].n;
    for (int p = 0; p < c->n_ports; p++)
        c->port[p] = &ibn_ctx.nic[ibn_devs[dev].port[p]];
    c->n_qps = n_qps;
    c->split = split;
    for (int i = 0; i < IBN_REQUESTS; i++)
        c->req[i].comm = c;
    for (int q = 0; q < n_qps; q++)
        c->qnext[q] = split ? 0 : (uint64_t)q;
    if (posix_memalign((void **)&c->cts, 4096, IBN_REQUESTS * sizeof(struct ibn_cts)) != 0) {
        c->cts = NULL;
        goto err;
    }
    memset(c->cts, 0, IBN_REQUESTS * sizeof(struct ibn_cts));
    c->cts_mr = ibv->reg_mr(c->port[0]->pd, c->cts, IBN_REQUESTS * sizeof(struct ibn_cts),
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (c->cts_mr == NULL)
        goto err;
    int flushes = !is_send && (ibn_ptr_support & (NCCL_PTR_CUDA | NCCL_PTR_DMABUF));
    for (int p = 0; p < c->n_ports; p++) {
        int on_port = (n_qps - p + c->n_ports - 1) / c->n_ports; /* Queue pairs on port p. */
        int depth = on_port * IBN_CQ_DEPTH + 1 + (p == 0 && flushes ? IBN_FLUSHES : 0);
        c->cq[p] = ibv->create_cq(c->port[p]->dev, depth, NULL, NULL, 0);
        if (c->cq[p] == NULL)
            goto err;
    }
    if (flushes) {
        for (int i = 0; i < IBN_FLUSHES; i++)
            c->flush_req[i].comm = c;
        c->flush_mr = ibv->reg_mr(c->port[0]->pd, &c->flush_sink, sizeof(c->flush_sink),
                                  IBV_ACCESS_LOCAL_WRITE);
        if (c->flush_mr == NULL ||
            cfx_ib_loopback_qp(&ibn_ctx, c->port[0], c->cq[0], c, IBN_FLUSHES, cfx_ib_random_psn(),
                               &c->flush_qp) != cfxSuccess)
            goto err;
    }
    struct ibv_qp_init_attr init = {
        .qp_context = c, /* For its async events. */
        .cap = {.max_send_wr = IBN_SQ_DEPTH,
                .max_recv_wr = IBN_REQUESTS,
                .max_send_sge = 1,
                .max_recv_sge = 1,
                .max_inline_data = sizeof(struct ibn_cts)},
        .qp_type = IBV_QPT_RC,
    };
    for (int q = 0; q < n_qps; q++) {
        struct cfx_ib_nic *port = c->port[q % c->n_ports];
        struct ibv_qp_init_attr asked = init;
        asked.send_cq = asked.recv_cq = c->cq[q % c->n_ports];
        c->qp[q] = ibv->create_qp(port->pd, &asked);
        if (c->qp[q] == NULL) {
            asked.cap = init.cap; /* A NIC without inline data: sources are registered. */
            asked.cap.max_inline_data = 0;
            c->qp[q] = ibv->create_qp(port->pd, &asked);
        }
        if (c->qp[q] == NULL)
            goto err;
        if (q == 0)
            c->max_inline = (int)asked.cap.max_inline_data; /* Clear-to-sends go on 0. */
        struct ibv_qp_attr attr = {.qp_state = IBV_QPS_INIT,
                                   .pkey_index = 0,
                                   .port_num = (uint8_t)port->port.port,
                                   .qp_access_flags =
                                       IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE};
        if (ibv->modify_qp(c->qp[q], &attr,
                           IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) !=
            0)
            goto err;
    }
    return c;

err:
    IBN_WARN("verbs net: cannot set up queue pairs on %s: %s", ibn_devs[dev].label,
             strerror(errno ? errno : ENOMEM));
    comm_free(c);
    return NULL;
}

/* This side's half of the setup exchange. */
static void info_fill(const struct ibn_comm *c, uint64_t nonce, uint32_t psn, struct ibn_info *info)
{
    memset(info, 0, sizeof(*info));
    info->magic = IBN_MAGIC;
    info->nonce = nonce;
    for (int q = 0; q < c->n_qps; q++)
        info->qpn[q] = c->qp[q]->qp_num;
    info->n_qps = (uint32_t)c->n_qps;
    info->split = (uint32_t)c->split;
    info->psn = psn;
    info->cts_addr = (uint64_t)(uintptr_t)c->cts;
    info->cts_rkey = c->cts_mr->rkey;
    info->n_ports = (uint32_t)c->n_ports;
    for (int p = 0; p < c->n_ports; p++) {
        const struct cfx_ib_port *port = &c->port[p]->port;
        memcpy(info->nic[p].gid, port->gid.raw, sizeof(info->nic[p].gid));
        info->nic[p].lid = port->lid;
        info->nic[p].mtu = (uint8_t)port->mtu;
        info->nic[p].link_layer = (uint8_t)port->link_layer;
        snprintf(info->nic[p].name, sizeof(info->nic[p].name), "%.11s", port->label);
    }
}

/* Whether the peer's half of the exchange is one this side can use. */
static int info_valid(const struct ibn_info *info, uint64_t nonce)
{
    return info->magic == IBN_MAGIC && info->nonce == nonce && info->n_qps >= 1 &&
           info->n_qps <= IB_MAX_QPS && info->n_ports >= 1 && info->n_ports <= IB_MAX_NICS;
}

/* RTR and RTS, queue pair q to the peer's queue pair q (@p theirs). */
static int comm_connect_qp(struct ibn_comm *c, const struct ibn_info *mine,
                           const struct ibn_info *theirs)
{
    for (int q = 0; q < c->n_qps; q++) {
        const struct cfx_ib_info_nic *peer = &theirs->nic[q % theirs->n_ports];
        char what[96];
        snprintf(what, sizeof(what), "the verbs net's queue pair %d to %.11s (qpn %u)", q,
                 peer->name, theirs->qpn[q]);
        if (cfx_ib_qp_rtr_rts(&ibn_ctx, c->qp[q], &c->port[q % c->n_ports]->port, peer,
                              theirs->qpn[q], theirs->psn, mine->psn, what) != cfxSuccess) {
            IBN_WARN("verbs net: cannot connect %s", what);
            return -1;
        }
    }
    c->peer_cts_addr = theirs->cts_addr;
    c->peer_cts_rkey = theirs->cts_rkey;
    c->peer_ports = (int)theirs->n_ports;
    return 0;
}

/* Receiver: one receive on queue pair @p q for an immediate (no buffer:
 * the data is written); its wr_id says which queue pair. */
static int post_imm_recv(struct ibn_comm *c, int q)
{
    struct ibv_recv_wr wr = {.wr_id = (uint64_t)q, .sg_list = NULL, .num_sge = 0}, *bad = NULL;
    return ibv_post_recv(c->qp[q], &wr, &bad);
}

/* ------------------------------------------------------------ non-blocking exchange */

/* Moves what is left of @p len bytes at @p buf (*done_p so far): 1 when
 * all moved, 0 to call again, -1 when the peer is gone or the call failed. */
static int move_some(int fd, int out, void *buf, size_t len, size_t *done_p)
{
    while (*done_p < len) {
        ssize_t n =
            out ? send(fd, (char *)buf + *done_p, len - *done_p, MSG_NOSIGNAL | MSG_DONTWAIT)
                : recv(fd, (char *)buf + *done_p, len - *done_p, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return 0;
        if (n <= 0)
            return -1;
        *done_p += (size_t)n;
    }
    return 1;
}

static void stage_free(struct ibn_stage *st)
{
    if (st == NULL)
        return;
    if (st->comm != NULL)
        comm_free(st->comm); /* Closes the fd it took. */
    else if (st->fd >= 0)
        close(st->fd);
    free(st);
}

/* ------------------------------------------------------------ the table */

/* Whether the ports take dma-bufs (CFX_DMABUF_ENABLE, ibv_reg_dmabuf_mr in
 * libibverbs, and a kernel that knows it: NCCL's probe, a registration of
 * no descriptor that must fail for another reason than "not supported");
 * NULL, or why not. */
static const char *dmabuf_why_not(void)
{
    if (!ibn_ctx.dmabuf_enable)
        return "CFX_DMABUF_ENABLE=0";
    if (ibn_ctx.ibv->reg_dmabuf_mr == NULL)
        return "libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later needed)";
    for (int d = 0; d < ibn_ctx.n_nics; d++) {
        errno = 0;
        struct ibv_mr *mr = ibn_ctx.ibv->reg_dmabuf_mr(ibn_ctx.nic[d].pd, 0, 0, 0, -1, 0);
        if (mr != NULL)
            ibn_ctx.ibv->dereg_mr(mr);
        else if (errno == EOPNOTSUPP || errno == EPROTONOSUPPORT)
            return "the kernel's verbs take no dma-buf";
    }
    return NULL;
}

static ncclResult_t ibn_init(ncclDebugLogger_t log_function)
{
    logger = log_function;
    if (ibn_ready)
        return ncclSuccess;
    const char *why = NULL;
    ibn_ctx.rank = -1;
    ibn_ctx.ibv = cfx_verbs_api(&why);
    if (ibn_ctx.ibv == NULL) {
        IBN_WARN("verbs net: %s", why ? why : "libibverbs cannot be loaded");
        return ncclSystemError;
    }
    cfx_ib_ctx_qp_params(&ibn_ctx);
    if (cfx_ib_device_open(&ibn_ctx) != cfxSuccess) {
        IBN_WARN("verbs net: %s", ibn_ctx.why_not);
        return ncclSystemError;
    }
    for (int d = 0; d < ibn_ctx.n_nics; d++) {
        /* Async events are read by test() without blocking. */
        int fd = ibn_ctx.nic[d].dev->async_fd;
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
            IBN_WARN("verbs net: cannot make %s's async event descriptor non-blocking: %s",
                     ibn_ctx.nic[d].port.label, strerror(errno));
            cfx_ib_device_close(&ibn_ctx);
            return ncclSystemError;
        }
    }
    char ifname[64];
    if (cfx_socket_pick_address(&ibn_oob_addr, ifname, sizeof(ifname)) != cfxSuccess) {
        IBN_WARN("verbs net: no interface for its setup connections (CFX_SOCKET_IFNAME)");
        cfx_ib_device_close(&ibn_ctx);
        return ncclSystemError;
    }
    for (int d = 0; d < ibn_ctx.n_nics; d++) {
        char path[128];
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device",
                 ibn_ctx.nic[d].port.dev_name);
        if (realpath(path, ibn_dev_pci[d]) == NULL)
            ibn_dev_pci[d][0] = '\0';
        struct ibn_dev *dev = &ibn_devs[d];
        *dev = (struct ibn_dev){.n = 1, .port = {d}};
        snprintf(dev->name, sizeof(dev->name), "%s", ibn_ctx.nic[d].port.dev_name);
        snprintf(dev->label, sizeof(dev->label), "%s", ibn_ctx.nic[d].port.label);
    }
    ibn_n_devs = ibn_ctx.n_nics;
    /* Device memory (GPUDirect RDMA): NCCL's rule, dma-buf or peermem. */
    const char *no_dmabuf = dmabuf_why_not();
    int peermem = cfx_ib_peermem_usable(&ibn_ctx);
    ibn_ptr_support =
        NCCL_PTR_HOST | (peermem ? NCCL_PTR_CUDA : 0) | (no_dmabuf == NULL ? NCCL_PTR_DMABUF : 0);
    ibn_ready = 1;
    IBN_INFO("verbs net: %d port(s), setup connections over %s; device memory: %s%s%s%s",
             ibn_ctx.n_nics, ifname, no_dmabuf == NULL ? "as dma-bufs" : "no dma-buf (",
             no_dmabuf == NULL ? "" : no_dmabuf, no_dmabuf == NULL ? "" : ")",
             peermem                ? ", by address (nvidia-peermem)"
             : ibn_ctx.peermem == 0 ? ", not by address (CFX_IB_PEERMEM=0)"
                                    : ", not by address (nvidia-peermem is not loaded)");
    return ncclSuccess;
}

static ncclResult_t ibn_devices(int *ndev)
{
    *ndev = ibn_ready ? ibn_n_devs : 0; /* Ports, then virtual devices (NCCL's count). */
    return ncclSuccess;
}

/* Port @p n's speed in Mbps, from its width and speed codes (NCCL's table). */
static int port_speed(int n)
{
    struct ibv_port_attr attr;
    if (ibn_ctx.ibv->query_port(ibn_ctx.nic[n].dev, (uint8_t)ibn_ctx.nic[n].port.port, &attr) != 0)
        return 100000;
    static const int lane_mbps[] = {2500, 5000, 10000, 10000, 14000, 25000, 50000, 100000};
    int code = 0;
    while (code < 7 && !(attr.active_speed & (1u << code)))
        code++;
    int lanes = attr.active_width == 2   ? 4
                : attr.active_width == 4 ? 8
                : attr.active_width == 8 ? 12
                                         : 1;
    return lane_mbps[code] * lanes;
}

static ncclResult_t ibn_get_properties(int dev, ncclNetProperties_v9_t *props)
{
    if (!ibn_ready || dev < 0 || dev >= ibn_n_devs)
        return ncclInvalidArgument;
    const struct ibn_dev *d = &ibn_devs[dev];
    int first = d->port[0];
    memset(props, 0, sizeof(*props));
    props->name = (char *)d->name;
    props->pciPath = ibn_dev_pci[first][0] ? ibn_dev_pci[first] : NULL;
    props->guid = (uint64_t)dev;
    props->ptrSupport = ibn_ptr_support;
    for (int p = 0; p < d->n; p++)
        props->speed += port_speed(d->port[p]);
    props->port = ibn_ctx.nic[first].port.port;
    props->maxComms = 65536;
    props->maxRecvs = 1;
    props->netDeviceType = NCCL_NET_DEVICE_HOST;
    props->vProps.ndevs = d->n;
    for (int p = 0; p < d->n; p++)
        props->vProps.devs[p] = d->port[p];
    props->maxP2pBytes = (size_t)1 << 31;
    props->maxCollBytes = (size_t)1 << 31;
    return ncclSuccess;
}

static const char *link_layer_name(int link_layer)
{
    return link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
}

/* A virtual device of ports @p props lists (each at most once, all of one
 * link layer): its comms
 * put queue pair q on its port q mod n, CFX_IB_QPS_PER_CONNECTION per
 * port, and register memory through every one of them. */
static ncclResult_t ibn_make_vdevice(int *d, ncclNetVDeviceProps_v9_t *props)
{
    if (!ibn_ready || props == NULL || props->ndevs < 1 || props->ndevs > IB_MAX_NICS) {
        IBN_WARN("verbs net: a virtual device of %d ports (1 to %d)", props ? props->ndevs : -1,
                 IB_MAX_NICS);
        return ncclInvalidArgument;
    }
    if (ibn_n_devs == IBN_MAX_DEVS) {
        IBN_WARN("verbs net: no room for another virtual device (%d devices)", IBN_MAX_DEVS);
        return ncclInvalidUsage;
    }
    struct ibn_dev v = {.n = props->ndevs};
    for (int p = 0; p < props->ndevs; p++) {
        int n = props->devs[p];
        for (int e = 0; e < p; e++)
            if (props->devs[e] == n)
                n = -1;
        if (n < 0 || n >= ibn_ctx.n_nics) {
            IBN_WARN("verbs net: a virtual device can hold ports 0 to %d, each once, not %d",
                     ibn_ctx.n_nics - 1, props->devs[p]);
            return ncclInvalidArgument;
        }
        /* One protocol for all its queue pairs: InfiniBand addresses by
         * LID, RoCE by GID (NCCL refuses such merges too). */
        const struct cfx_ib_port *port = &ibn_ctx.nic[n].port, *head = &ibn_ctx.nic[v.port[0]].port;
        if (p > 0 && port->link_layer != head->link_layer) {
            IBN_WARN("verbs net: cannot merge %s (%s) with %s (%s): their link layers differ "
                     "(CFX_IB_HCA can pick ports of one link layer)",
                     head->label, link_layer_name(head->link_layer), port->label,
                     link_layer_name(port->link_layer));
            return ncclInvalidUsage;
        }
        v.port[p] = n;
        size_t used = strlen(v.name), lused = strlen(v.label);
        snprintf(v.name + used, sizeof(v.name) - used, "%s%s", p ? "+" : "",
                 ibn_ctx.nic[n].port.dev_name);
        snprintf(v.label + lused, sizeof(v.label) - lused, "%s%s", p ? "+" : "",
                 ibn_ctx.nic[n].port.label);
    }
    *d = ibn_n_devs;
    ibn_devs[ibn_n_devs++] = v;
    IBN_INFO("verbs net: virtual device %d is %s", *d, v.label);
    return ncclSuccess;
}

static ncclResult_t ibn_listen(int dev, void *handle_v, void **listen_comm)
{
    if (!ibn_ready || dev < 0 || dev >= ibn_n_devs)
        return ncclInvalidArgument;
    struct ibn_listen *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return ncclSystemError;
    union cfx_sockaddr bound;
    if (cfx_socket_listen(&ibn_oob_addr, &l->fd, &bound) != cfxSuccess) {
        IBN_WARN("verbs net: cannot listen for setup connections");
        free(l);
        return ncclSystemError;
    }
    if (getrandom(&l->nonce, sizeof(l->nonce), 0) != (ssize_t)sizeof(l->nonce))
        l->nonce = (uint64_t)(uintptr_t)l ^ (uint64_t)getpid() << 32;
    l->dev = dev;
    struct ibn_handle *handle = handle_v;
    memset(handle, 0, sizeof(*handle));
    handle->magic = IBN_MAGIC;
    handle->nonce = l->nonce;
    handle->dev = dev;
    cfx_socket_addr_to_wire(&bound, &handle->addr);
    *listen_comm = l;
    return ncclSuccess;
}

/* @p res: ncclRemoteError when the listener or the path is at fault,
 * ncclSystemError when this side could not set itself up. */
static ncclResult_t connect_fail(struct ibn_handle *handle, ncclResult_t res, const char *what)
{
    IBN_WARN("verbs net: connect failed: %s", what);
    stage_free(handle->stage);
    handle->stage = NULL;
    return res;
}

static ncclResult_t ibn_connect(int dev, void *handle_v, void **send_comm,
                                ncclNetDeviceHandle_v9_t **send_dev_comm)
{
    struct ibn_handle *handle = handle_v;
    *send_comm = NULL;
    if (send_dev_comm != NULL)
        *send_dev_comm = NULL;
    if (!ibn_ready || dev < 0 || dev >= ibn_n_devs || handle->magic != IBN_MAGIC)
        return ncclInvalidArgument;
    struct ibn_stage *st = handle->stage;
    if (st == NULL) {
        union cfx_sockaddr addr;
        if (cfx_socket_addr_from_wire(&handle->addr, &addr) != cfxSuccess)
            return ncclInvalidArgument;
        st = calloc(1, sizeof(*st));
        if (st == NULL)
            return ncclSystemError;
        st->fd = -1;
        handle->stage = st;
        /* CFX_IB_QPS_PER_CONNECTION per port of the device, as NCCL. */
        int n_qps = ibn_ctx.qps_per_conn * ibn_devs[dev].n;
        st->comm = comm_new(dev, 1, n_qps < IB_MAX_QPS ? n_qps : IB_MAX_QPS, ibn_ctx.split_data);
        if (st->comm == NULL)
            return connect_fail(handle, ncclSystemError, "no queue pairs here");
        st->fd = socket(addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        st->comm->fd = st->fd;
        if (st->fd < 0 ||
            (connect(st->fd, &addr.sa, cfx_socket_addr_len(&addr)) != 0 && errno != EINPROGRESS))
            return connect_fail(handle, ncclSystemError, strerror(errno));
        info_fill(st->comm, handle->nonce, cfx_ib_random_psn(), &st->mine);
    }
    if (st->step == 0) {
        struct pollfd pfd = {.fd = st->fd, .events = POLLOUT};
        if (poll(&pfd, 1, 0) <= 0)
            return ncclSuccess;
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(st->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0)
            return connect_fail(handle, ncclRemoteError, strerror(err ? err : errno));
        int one = 1;
        setsockopt(st->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        st->step = 1;
    }
    if (st->step == 1) {
        int r = move_some(st->fd, 1, &st->mine, sizeof(st->mine), &st->sent);
        if (r < 0)
            return connect_fail(handle, ncclRemoteError, "the listener went away");
        if (r == 0)
            return ncclSuccess;
        st->step = 2;
    }
    if (st->step == 2) {
        int r = move_some(st->fd, 0, &st->theirs, sizeof(st->theirs), &st->got);
        if (r < 0)
            return connect_fail(handle, ncclRemoteError, "the listener went away");
        if (r == 0)
            return ncclSuccess;
        if (!info_valid(&st->theirs, handle->nonce) ||
            st->theirs.n_qps != (uint32_t)st->comm->n_qps)
            return connect_fail(handle, ncclRemoteError,
                                "the listener answered with something else");
        if (comm_connect_qp(st->comm, &st->mine, &st->theirs) != 0)
            return connect_fail(handle, ncclRemoteError, "the queue pairs did not connect");
        st->step = 3;
        st->sent = 0;
    }
    static const char ready = 'R';
    int r = move_some(st->fd, 1, (void *)&ready, 1, &st->sent);
    if (r < 0)
        return connect_fail(handle, ncclRemoteError, "the listener went away");
    if (r == 0)
        return ncclSuccess;
    *send_comm = st->comm;
    st->comm = NULL;
    free(st);
    handle->stage = NULL;
    return ncclSuccess;
}

static ncclResult_t ibn_accept(void *listen_comm, void **recv_comm,
                               ncclNetDeviceHandle_v9_t **recv_dev_comm)
{
    struct ibn_listen *l = listen_comm;
    *recv_comm = NULL;
    if (recv_dev_comm != NULL)
        *recv_dev_comm = NULL;
    struct ibn_stage *st = l->pending;
    if (st == NULL) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ||
                           errno == ECONNABORTED
                       ? ncclSuccess
                       : ncclSystemError;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        st = calloc(1, sizeof(*st));
        if (st == NULL) {
            close(fd);
            return ncclSystemError;
        }
        st->fd = fd;
        l->pending = st;
    }
    if (st->step == 0) {
        int r = move_some(st->fd, 0, &st->theirs, sizeof(st->theirs), &st->got);
        if (r == 0)
            return ncclSuccess;
        if (r < 0 || !info_valid(&st->theirs, l->nonce)) {
            IBN_WARN("verbs net: dropped a setup connection that did not say hello");
            goto drop;
        }
        st->comm = comm_new(l->dev, 0, (int)st->theirs.n_qps, st->theirs.split != 0);
        if (st->comm == NULL)
            goto drop;
        st->comm->fd = st->fd;
        info_fill(st->comm, l->nonce, cfx_ib_random_psn(), &st->mine);
        for (int q = 0; q < st->comm->n_qps; q++)
            for (int i = 0; i < IBN_REQUESTS; i++)
                if (post_imm_recv(st->comm, q) != 0) {
                    IBN_WARN("verbs net: cannot post receives: %s", strerror(errno));
                    goto drop;
                }
        if (comm_connect_qp(st->comm, &st->mine, &st->theirs) != 0)
            goto drop;
        st->step = 1;
    }
    if (st->step == 1) {
        int r = move_some(st->fd, 1, &st->mine, sizeof(st->mine), &st->sent);
        if (r < 0)
            goto drop;
        if (r == 0)
            return ncclSuccess;
        st->step = 2;
        st->got = 0;
    }
    char ready = 0;
    int r = move_some(st->fd, 0, &ready, 1, &st->got);
    if (r < 0 || (r > 0 && ready != 'R'))
        goto drop;
    if (r == 0)
        return ncclSuccess;
    *recv_comm = st->comm;
    st->comm = NULL;
    free(st);
    l->pending = NULL;
    return ncclSuccess;

drop:
    stage_free(st);
    l->pending = NULL;
    return ncclSuccess; /* Not this connection; the next may be the one. */
}

static ncclResult_t ibn_dereg_mr(void *comm, void *mhandle)
{
    (void)comm;
    struct ibn_mr *m = mhandle;
    if (m != NULL) {
        for (int p = 0; p < m->n; p++)
            ibn_ctx.ibv->dereg_mr(m->mr[p]);
        free(m);
    }
    return ncclSuccess;
}

/* @p size bytes at @p data registered through each of the comm's ports:
 * by address (host memory, or device memory through nvidia-peermem), or,
 * with @p fd >= 0, as the dma-buf @p fd from @p offset (the NIC addresses
 * it at @p data, as NCCL registers it). */
static ncclResult_t reg_ports(struct ibn_comm *c, void *data, size_t size, int type,
                              uint64_t offset, int fd, void **mhandle)
{
    const struct cfx_verbs_api *ibv = ibn_ctx.ibv;
    struct ibn_mr *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return ncclSystemError;
    m->cuda = type == NCCL_PTR_CUDA;
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    for (m->n = 0; m->n < c->n_ports; m->n++) {
        struct ibv_pd *pd = c->port[m->n]->pd;
        m->mr[m->n] =
            fd >= 0 ? ibv->reg_dmabuf_mr(pd, offset, size, (uint64_t)(uintptr_t)data, fd, access)
                    : ibv->reg_mr(pd, data, size, access);
        if (m->mr[m->n] == NULL) {
            IBN_WARN("verbs net: cannot register %zu bytes of %s memory at %p on %s%s: %s", size,
                     m->cuda ? "device" : "host", data, c->port[m->n]->port.label,
                     fd >= 0 ? " (ibv_reg_dmabuf_mr)" : "", strerror(errno));
            ibn_dereg_mr(c, m);
            return ncclSystemError;
        }
    }
    *mhandle = m;
    return ncclSuccess;
}

/* Host memory; device memory only through nvidia-peermem (else
 * regMrDmaBuf). */
static ncclResult_t ibn_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle)
{
    struct ibn_comm *c = comm;
    if (c == NULL || (type != NCCL_PTR_HOST && type != NCCL_PTR_CUDA))
        return ncclInvalidArgument;
    if (type == NCCL_PTR_CUDA && !cfx_ib_peermem_usable(&ibn_ctx)) {
        IBN_WARN("verbs net: regMr of device memory needs nvidia-peermem (not loaded; "
                 "CFX_IB_PEERMEM=1 tries anyway): register it as a dma-buf");
        return ncclInvalidArgument;
    }
    return reg_ports(c, data, size, type, 0, -1, mhandle);
}

static ncclResult_t ibn_reg_mr_dmabuf(void *comm, void *data, size_t size, int type,
                                      uint64_t offset, int fd, void **mhandle)
{
    struct ibn_comm *c = comm;
    if (c == NULL || (type != NCCL_PTR_HOST && type != NCCL_PTR_CUDA))
        return ncclInvalidArgument;
    if (fd < 0 || type == NCCL_PTR_HOST)
        return ibn_reg_mr(comm, data, size, type, mhandle);
    if (!(ibn_ptr_support & NCCL_PTR_DMABUF)) {
        IBN_WARN("verbs net: regMrDmaBuf, but this libibverbs or its devices take no dma-buf");
        return ncclInvalidArgument;
    }
    return reg_ports(c, data, size, type, offset, fd, mhandle);
}

/* A free request for the next message (k = tail); NULL when all are
 * taken or IBN_REQUESTS messages are in flight. request_queue() then makes
 * it message k once its work is posted. */
static struct ibn_request *request_take(struct ibn_comm *c, int *index_p)
{
    if (c->tail - c->head == IBN_REQUESTS)
        return NULL;
    for (int i = 0; i < IBN_REQUESTS; i++)
        if (!c->req[i].used) {
            struct ibn_request *r = &c->req[i];
            *r = (struct ibn_request){.comm = c, .used = 1, .k = c->tail};
            *index_p = i;
            return r;
        }
    return NULL;
}

static void request_queue(struct ibn_comm *c, int index, int parts)
{
    c->req[index].left = parts;
    c->order[c->tail % IBN_REQUESTS] = index;
    c->ended[c->tail % IBN_REQUESTS] = 0;
    c->tail++;
}

/* One part of @p r completed (a write, or an immediate that arrived). */
static void part_done(struct ibn_comm *c, struct ibn_request *r)
{
    if (--r->left > 0)
        return;
    r->done = 1;
    c->ended[r->k % IBN_REQUESTS] = 1;
    while (c->head != c->tail && c->ended[c->head % IBN_REQUESTS]) {
        c->ended[c->head % IBN_REQUESTS] = 0;
        c->head++;
    }
}

static ncclResult_t comm_fail(struct ibn_comm *c, ncclResult_t res, const char *why)
{
    if (c->failed == ncclSuccess) {
        c->failed = res;
        IBN_WARN("verbs net: %s comm on %s failed: %s", c->is_send ? "send" : "receive",
                 ibn_devs[c->dev].label, why);
    }
    return c->failed;
}

/* Reads every port's async events without blocking, on whichever comm's
 * thread comes first (the others go on, unless @p wait: the events are
 * read meanwhile). A queue pair's event is left on its comm, a port's on
 * the port. */
static void async_drain(int wait)
{
    if (wait)
        pthread_mutex_lock(&ibn_async_lock); /* A drain under way may be reading the cause. */
    else if (pthread_mutex_trylock(&ibn_async_lock) != 0)
        return;
    const struct cfx_verbs_api *ibv = ibn_ctx.ibv;
    for (int d = 0; d < ibn_ctx.n_nics; d++) {
        struct cfx_ib_nic *nic = &ibn_ctx.nic[d];
        struct ibv_async_event event;
        while (ibv->get_async_event(nic->dev, &event) == 0) {
            const char *what = ibv->event_type_str(event.event_type);
            switch (cfx_ib_event_scope(event.event_type)) {
            case CFX_IB_EVENT_QP: {
                /* The comm is still there: destroying a queue pair waits
                 * for its events to be acknowledged. */
                struct ibn_comm *c = event.element.qp ? event.element.qp->qp_context : NULL;
                if (c != NULL)
                    atomic_store_explicit(&c->qp_event, what, memory_order_release);
                break;
            }
            case CFX_IB_EVENT_PORT:
                if (cfx_ib_nic_mark_fatal(nic, "", "", what))
                    IBN_WARN("verbs net: %s", nic->fatal_error);
                break;
            case CFX_IB_EVENT_OTHER:
                IBN_INFO("verbs net: %s: async event: %s", nic->port.label, what);
                break;
            }
            ibv->ack_async_event(&event);
        }
    }
    pthread_mutex_unlock(&ibn_async_lock);
}

/* The comm's failure for an async event read so far, or ncclSuccess. */
static ncclResult_t comm_check_events(struct ibn_comm *c)
{
    const char *what = atomic_load_explicit(&c->qp_event, memory_order_acquire);
    if (what != NULL) {
        char why[160];
        snprintf(why, sizeof(why), "an async event on one of its queue pairs: %s", what);
        return comm_fail(c, ncclSystemError, why);
    }
    for (int p = 0; p < c->n_ports; p++)
        if (atomic_load_explicit(&c->port[p]->fatal, memory_order_acquire))
            return comm_fail(c, ncclSystemError, c->port[p]->fatal_error);
    return c->failed;
}

/* Every IBN_ALIVE_NS: async events, and whether the peer's end of the TCP
 * connection is still there (a peer that died closes it). */
static ncclResult_t comm_check_alive(struct ibn_comm *c)
{
    int64_t now = cfx_time_now_ns();
    if (now - c->alive_ns < IBN_ALIVE_NS)
        return c->failed;
    c->alive_ns = now;
    async_drain(0);
    if (comm_check_events(c) != ncclSuccess)
        return c->failed;
    char byte;
    ssize_t got = recv(c->fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR))
        return comm_fail(c, ncclRemoteError, "the peer closed its setup connection (gone)");
    return ncclSuccess;
}

static ncclResult_t ibn_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                              void **request)
{
    (void)tag;
    struct ibn_comm *c = send_comm;
    *request = NULL;
    if (comm_check_events(c) != ncclSuccess)
        return c->failed;
    if (c->flushed_ns != 0)
        return ncclSuccess; /* Failing: its cause is awaited (comm_progress). */
    uint64_t k = c->tail;
    struct ibn_cts *cts = &c->cts[k % IBN_REQUESTS];
    uint64_t want = k + 1;
    if (__atomic_load_n(&cts->check, __ATOMIC_ACQUIRE) != want)
        return comm_check_alive(c); /* Its receive is not posted yet: is the peer there? */
    uint64_t addr = __atomic_load_n(&cts->addr, __ATOMIC_RELAXED);
    uint64_t room = __atomic_load_n(&cts->size, __ATOMIC_RELAXED);
    uint32_t rkey[IB_MAX_NICS];
    for (int p = 0; p < c->peer_ports; p++)
        rkey[p] = __atomic_load_n(&cts->rkey[p], __ATOMIC_RELAXED);
    if (__atomic_load_n(&cts->seq, __ATOMIC_ACQUIRE) != want)
        return ncclSuccess;
    if (size > room) {
        char why[96];
        snprintf(why, sizeof(why), "a message of %zu bytes for a receive of %llu", size,
                 (unsigned long long)room);
        return comm_fail(c, ncclInvalidUsage, why);
    }
    /* Whole on queue pair k mod n, or in aligned parts over all of them. */
    int first = c->split ? 0 : (int)(k % (uint64_t)c->n_qps);
    int parts = c->split ? c->n_qps : 1;
    for (int q = first; q < first + parts; q++)
        if (c->sq_used[q] >= IBN_SQ_DEPTH)
            return ncclSuccess;
    int index = 0;
    struct ibn_request *r = request_take(c, &index);
    if (r == NULL)
        return ncclSuccess;
    size_t part = parts == 1 ? size : (size + parts - 1) / parts;
    part = (part + IBN_ALIGN - 1) / IBN_ALIGN * IBN_ALIGN;
    const struct ibn_mr *mr = mhandle;
    for (int i = 0; i < parts; i++) {
        int q = first + i;
        size_t off = (size_t)i * part < size ? (size_t)i * part : size;
        size_t len = size - off < part ? size - off : part;
        struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)data + off,
                              .length = (uint32_t)len,
                              .lkey = mr ? mr->mr[q % c->n_ports]->lkey : 0};
        struct ibv_send_wr wr = {.wr_id = (uint64_t)index | IBN_WR_QP(q),
                                 .sg_list = len ? &sge : NULL,
                                 .num_sge = len ? 1 : 0,
                                 .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                                 .send_flags = IBV_SEND_SIGNALED,
                                 .imm_data = htonl((uint32_t)len),
                                 .wr = {.rdma = {.remote_addr = addr + off,
                                                 .rkey = rkey[q % c->peer_ports]}}},
                           *bad = NULL;
        if (ibv_post_send(c->qp[q], &wr, &bad) != 0) {
            r->used = 0; /* The comm is failed: parts posted before never count. */
            return comm_fail(c, ncclSystemError, "ibv_post_send of a message failed");
        }
        c->sq_used[q]++;
    }
    r->size = size;
    request_queue(c, index, parts);
    *request = r;
    return ncclSuccess;
}

static ncclResult_t ibn_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                              void **mhandles, void **request)
{
    (void)tags;
    struct ibn_comm *c = recv_comm;
    *request = NULL;
    if (n != 1)
        return ncclInvalidArgument; /* maxRecvs is 1. */
    if (comm_check_events(c) != ncclSuccess)
        return c->failed;
    if (c->flushed_ns != 0)
        return ncclSuccess; /* Failing: its cause is awaited (comm_progress). */
    if (c->sq_used[0] >= IBN_SQ_DEPTH)
        return ncclSuccess;
    int index = 0;
    struct ibn_request *r = request_take(c, &index);
    if (r == NULL)
        return ncclSuccess;
    uint64_t k = c->tail;
    struct ibn_cts *src = &c->cts[k % IBN_REQUESTS];
    const struct ibn_mr *mr = mhandles[0];
    *src = (struct ibn_cts){
        .seq = k + 1, .addr = (uint64_t)(uintptr_t)data[0], .size = sizes[0], .check = k + 1};
    for (int p = 0; mr != NULL && p < c->n_ports; p++)
        src->rkey[p] = mr->mr[p]->rkey;
    struct ibv_sge sge = {
        .addr = (uint64_t)(uintptr_t)src, .length = sizeof(*src), .lkey = c->cts_mr->lkey};
    struct ibv_send_wr wr = {.wr_id = IBN_WR_CTS | IBN_WR_QP(0),
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_RDMA_WRITE,
                             .send_flags =
                                 IBV_SEND_SIGNALED |
                                 (c->max_inline >= (int)sizeof(*src) ? IBV_SEND_INLINE : 0),
                             .wr = {.rdma = {.remote_addr = c->peer_cts_addr +
                                                            (k % IBN_REQUESTS) * sizeof(*src),
                                             .rkey = c->peer_cts_rkey}}},
                       *bad = NULL;
    if (ibv_post_send(c->qp[0], &wr, &bad) != 0) {
        r->used = 0;
        return comm_fail(c, ncclSystemError, "ibv_post_send of a clear-to-send failed");
    }
    c->sq_used[0]++;
    request_queue(c, index, c->split ? c->n_qps : 1);
    *request = r;
    return ncclSuccess;
}

/* The comm fails for a completion with @p status. */
static ncclResult_t status_failed(struct ibn_comm *c, enum ibv_wc_status status)
{
    char why[160];
    snprintf(why, sizeof(why), "a completion in error: %s (%d)%s",
             ibn_ctx.ibv->wc_status_str(status), (int)status,
             status == IBV_WC_RETRY_EXC_ERR ? ": the peer or the path is gone" : "");
    int remote = status == IBV_WC_RETRY_EXC_ERR || status == IBV_WC_REM_ACCESS_ERR ||
                 status == IBV_WC_REM_OP_ERR || status == IBV_WC_WR_FLUSH_ERR;
    return comm_fail(c, remote ? ncclRemoteError : ncclSystemError, why);
}

/* A completion in error: the async event behind it when one was read by
 * now (a queue pair or port failure flushes its work), else its status.
 * A flush without a known cause waits up to IB_FLUSH_WHY_NS for one (the
 * event may come after the flushed completions; comm_progress). */
static ncclResult_t completion_failed(struct ibn_comm *c, const struct ibv_wc *wc)
{
    async_drain(1);
    if (comm_check_events(c) != ncclSuccess)
        return c->failed;
    if (wc->status == IBV_WC_WR_FLUSH_ERR) {
        c->flushed_ns = cfx_time_now_ns();
        c->flushed_status = wc->status;
        return ncclSuccess;
    }
    return status_failed(c, wc->status);
}

/* One completion of the comm's queue pairs. */
static ncclResult_t completion(struct ibn_comm *c, const struct ibv_wc *wc)
{
    if (wc->status != IBV_WC_SUCCESS)
        return completion_failed(c, wc);
    if (wc->opcode & IBV_WC_RECV) {
        /* A part arrived: queue pair q's next message's. */
        int q = (int)wc->wr_id;
        if (q >= c->n_qps || c->qnext[q] >= c->tail)
            return comm_fail(c, ncclInternalError, "a message with no receive posted");
        uint64_t k = c->qnext[q];
        c->qnext[q] += c->split ? 1 : (uint64_t)c->n_qps;
        struct ibn_request *r = &c->req[c->order[k % IBN_REQUESTS]];
        r->size += ntohl(wc->imm_data);
        part_done(c, r);
        if (post_imm_recv(c, q) != 0)
            return comm_fail(c, ncclSystemError, "ibv_post_recv failed");
        return ncclSuccess;
    }
    if (wc->wr_id & IBN_WR_FLUSH) { /* An iflush's read: the writes before it are visible. */
        c->flush_req[(wc->wr_id & 0xff) % IBN_FLUSHES].done = 1;
        return ncclSuccess;
    }
    c->sq_used[(wc->wr_id >> 8) & 0xff]--;
    if (!(wc->wr_id & IBN_WR_CTS))
        part_done(c, &c->req[(wc->wr_id & 0xff) % IBN_REQUESTS]);
    return ncclSuccess;
}

/* Completions so far; async events and the TCP connection every
 * IBN_ALIVE_NS. */
static ncclResult_t comm_progress(struct ibn_comm *c)
{
    if (c->failed != ncclSuccess)
        return c->failed;
    if (c->flushed_ns != 0) { /* Its work is gone: only the cause is awaited. */
        async_drain(1);
        if (comm_check_events(c) != ncclSuccess)
            return c->failed;
        if (cfx_time_now_ns() - c->flushed_ns < IB_FLUSH_WHY_NS)
            return ncclSuccess;
        return status_failed(c, c->flushed_status);
    }
    for (int p = 0; p < c->n_ports; p++) {
        struct ibv_wc wc[16];
        int n;
        while ((n = ibv_poll_cq(c->cq[p], 16, wc)) > 0)
            for (int i = 0; i < n; i++) {
                ncclResult_t res = completion(c, &wc[i]);
                if (res != ncclSuccess || c->flushed_ns != 0)
                    return res;
            }
        if (n < 0)
            return comm_fail(c, ncclSystemError, "ibv_poll_cq failed");
    }
    return comm_check_alive(c);
}

static ncclResult_t ibn_test(void *request, int *done, int *sizes)
{
    struct ibn_request *r = request;
    struct ibn_comm *c = r->comm;
    *done = 0;
    if (!r->done) {
        ncclResult_t res = comm_progress(c);
        if (res != ncclSuccess)
            return res;
    }
    if (!r->done)
        return c->failed;
    *done = 1;
    if (sizes != NULL)
        *sizes = (int)r->size;
    r->used = 0;
    return ncclSuccess;
}

/* Makes the NIC's writes into the last of @p n received buffers that is
 * device memory (NCCL_PTR_CUDA) visible to the GPU: a one-byte RDMA read
 * of it on the comm's loopback queue pair completes only after them (the
 * PCIe ordering GPUDirect RDMA relies on). No request (nothing to do) for
 * host memory or empty receives, NCCL's rule. */
static ncclResult_t ibn_iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                               void **request)
{
    struct ibn_comm *c = recv_comm;
    *request = NULL;
    if (c == NULL || c->is_send || n < 1 || data == NULL || sizes == NULL || mhandles == NULL)
        return ncclInvalidArgument;
    int last = -1;
    for (int i = 0; i < n; i++) {
        const struct ibn_mr *m = mhandles[i];
        if (m != NULL && m->cuda && sizes[i] > 0)
            last = i;
    }
    if (last < 0)
        return ncclSuccess;
    if (comm_check_events(c) != ncclSuccess)
        return c->failed;
    if (c->flush_qp == NULL) /* Device memory was registered: cannot be. */
        return comm_fail(c, ncclInternalError,
                         "an iflush of device memory with no flush queue pair");
    int index = 0;
    while (index < IBN_FLUSHES && c->flush_req[index].used)
        index++;
    if (index == IBN_FLUSHES) {
        IBN_WARN("verbs net: more than %d iflushes in flight on a receive comm on %s", IBN_FLUSHES,
                 ibn_devs[c->dev].label);
        return ncclInternalError;
    }
    const struct ibn_mr *m = mhandles[last];
    struct ibv_sge sge = {
        .addr = (uint64_t)(uintptr_t)&c->flush_sink, .length = 1, .lkey = c->flush_mr->lkey};
    struct ibv_send_wr wr = {.wr_id = IBN_WR_FLUSH | (uint64_t)index,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_RDMA_READ,
                             .send_flags = IBV_SEND_SIGNALED,
                             .wr = {.rdma = {.remote_addr = (uint64_t)(uintptr_t)data[last],
                                             .rkey = m->mr[0]->rkey}}},
                       *bad = NULL;
    c->flush_req[index] = (struct ibn_request){.comm = c, .used = 1};
    if (ibv_post_send(c->flush_qp, &wr, &bad) != 0) {
        c->flush_req[index].used = 0;
        return comm_fail(c, ncclSystemError, "ibv_post_send of an iflush's read failed");
    }
    *request = &c->flush_req[index];
    return ncclSuccess;
}

static ncclResult_t ibn_close_comm(void *comm)
{
    comm_free(comm);
    return ncclSuccess;
}

static ncclResult_t ibn_close_listen(void *listen_comm)
{
    struct ibn_listen *l = listen_comm;
    if (l != NULL) {
        stage_free(l->pending);
        close(l->fd);
        free(l);
    }
    return ncclSuccess;
}

static const ncclNet_v9_t ibn_table = {
    .name = "IB",
    .init = ibn_init,
    .devices = ibn_devices,
    .getProperties = ibn_get_properties,
    .listen = ibn_listen,
    .connect = ibn_connect,
    .accept = ibn_accept,
    .regMr = ibn_reg_mr,
    .regMrDmaBuf = ibn_reg_mr_dmabuf,
    .deregMr = ibn_dereg_mr,
    .isend = ibn_isend,
    .irecv = ibn_irecv,
    .iflush = ibn_iflush,
    .test = ibn_test,
    .closeSend = ibn_close_comm,
    .closeRecv = ibn_close_comm,
    .closeListen = ibn_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = ibn_make_vdevice,
};

const ncclNet_v9_t *const cfx_net_builtin_ib = &ibn_table;

#else /* !CFX_HAVE_VERBS */

const ncclNet_v9_t *const cfx_net_builtin_ib = NULL;

#endif /* CFX_HAVE_VERBS */
