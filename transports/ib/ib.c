/*
 * The verbs RDMA transport (InfiniBand, RoCE): the ops table and each
 * connector's life. libibverbs is loaded at run time (src/util/verbs.h);
 * with no library, no device or no active port the transport says why once
 * at INFO and accepts no pair, so the socket transport carries the job.
 * Only the plain RC subset of verbs is used (ibv_create_qp, ibv_post_send,
 * ibv_post_recv, ibv_poll_cq). The protocol is in conn.h and
 * docs/transports.md; data.c moves the bytes.
 *
 * Memory: each connector's FIFO, slots and mailbox are one block, allocated,
 * touched and registered (ibv_reg_mr) in setup; the data path never
 * registers anything. Threads: as with sockets, a pass over a connector is
 * made by whichever thread asks first (cfx_ib_conn_drive): the user thread
 * after a post or release and while it waits, or the process's proxy thread
 * (src/proxy), which passes over connectors with work in flight every
 * IB_POLL_NS and handles the device's async events.
 */
#include "transports/ib/ib.h"

#include "cfx_build_config.h"

#if CFX_HAVE_VERBS

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <unistd.h>

#include "src/util/check.h"
#include "src/util/cuda.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"
#include "transports/ib/conn.h"

CFX_PARAM_INT(ib_disable, "IB_DISABLE", 0, 0, 1,
              "1: never use the verbs transport (sockets carry traffic between hosts)");
CFX_PARAM_INT(ib_timeout, "IB_TIMEOUT", 20, 1, 31,
              "Verbs transport: local ACK timeout exponent (4.096 us x 2^value, NCCL meaning)");
CFX_PARAM_INT(ib_retry_cnt, "IB_RETRY_CNT", 7, 0, 7, "Verbs transport: transport retries");
CFX_PARAM_INT(ib_sl, "IB_SL", 0, 0, 15, "Verbs transport: InfiniBand service level");
CFX_PARAM_INT(ib_tc, "IB_TC", 0, 0, 255, "Verbs transport: traffic class (GRH, RoCE)");
CFX_PARAM_INT(ib_qps_per_connection, "IB_QPS_PER_CONNECTION", 1, 1, IB_MAX_QPS,
              "Verbs transport and verbs net: queue pairs per connection; slots (the verbs "
              "net: messages) are striped over them");
CFX_PARAM_INT(ib_split_data_on_qps, "IB_SPLIT_DATA_ON_QPS", 0, 0, 1,
              "Verbs net: 1 splits every message over all of a comm's queue pairs, 0 sends "
              "each message whole on the next queue pair in turn (NCCL's meaning)");
CFX_PARAM_INT(ib_peermem, "IB_PEERMEM", -1, -1, 1,
              "GPUDirect RDMA without dma-buf: -1 registers device memory with ibv_reg_mr when "
              "nvidia-peermem (or nv_peer_mem) is loaded, 1 always tries, 0 never");

static const char *check_gdr_flush(const char *text, char *buf, size_t len)
{
    (void)buf;
    (void)len;
    return strcasecmp(text, "auto") == 0 || strcasecmp(text, "read") == 0 ? NULL
                                                                          : "expected auto or read";
}

CFX_PARAM_STR_CHECKED(ib_gdr_flush, "IB_GDR_FLUSH", "auto", check_gdr_flush,
                      "GPUDirect RDMA: how a receiver makes the NIC's writes visible to its GPU "
                      "(auto: cuFlushGPUDirectRDMAWrites where the device can, else an RDMA read "
                      "on a loopback queue pair; read: always the read)");
CFX_PARAM_INT(ib_spin_us, "IB_SPIN_US", 0, 0, 1000000,
              "Verbs transport: microseconds the progress thread spins when idle before it sleeps");

/* ============================================================ lifecycle */

static void ib_fini(void *ctx_v);

/* The proxy's pass over one connector. */
static int conn_proxy_progress(void *arg)
{
    return cfx_ib_conn_drive(arg);
}

/* The async client has nothing to pass over: its events come by ready(). */
static int async_proxy_progress(void *arg)
{
    (void)arg;
    return 0;
}

void cfx_ib_ctx_qp_params(struct cfx_ib_ctx *ctx)
{
    ctx->timeout = (int)param_ib_timeout();
    ctx->retry_cnt = (int)param_ib_retry_cnt();
    ctx->sl = (int)param_ib_sl();
    ctx->tc = (int)param_ib_tc();
    ctx->qps_per_conn = (int)param_ib_qps_per_connection();
    ctx->split_data = (int)param_ib_split_data_on_qps();
    ctx->dmabuf_enable = cfx_transport_dmabuf_enable();
    ctx->peermem = (int)param_ib_peermem();
    ctx->flush_read_forced = strcasecmp(param_ib_gdr_flush(), "read") == 0;
}

int cfx_ib_peermem_usable(const struct cfx_ib_ctx *ctx)
{
    return ctx->peermem == 1 || (ctx->peermem < 0 && cfx_verbs_peermem_loaded());
}

uint32_t cfx_ib_random_psn(void)
{
    uint32_t psn = 0;
    if (getrandom(&psn, sizeof(psn), GRND_NONBLOCK) != (ssize_t)sizeof(psn))
        psn = (uint32_t)cfx_time_now_ns();
    return psn & 0xffffff;
}

/* Per-communicator state. Never fails for want of a device: the transport
 * is then only unusable (can_connect says no), and CFX_NET=IB turns that
 * into an error. */
static cfxResult_t ib_init(const struct cfx_transport_env *env, void **ctx_p)
{
    struct cfx_ib_ctx *ctx = NULL;
    if (posix_memalign((void **)&ctx, CFX_CACHE_LINE, sizeof(*ctx)) != 0)
        return cfx_error_set(cfxSystemError, CFX_LOG_NET, "ib: out of memory");
    memset(ctx, 0, sizeof(*ctx));
    ctx->rank = env->rank;
    cfx_ib_ctx_qp_params(ctx);
    ctx->nic_path = env->nic_path;
    ctx->gdr_level = cfx_transport_gdr_level();
    enum cfx_net_choice net = cfx_transport_net_choice();
    const char *why = NULL;
    if (param_ib_disable() || net == CFX_NET_SOCKET || net == CFX_NET_NAMED) {
        snprintf(ctx->why_not, sizeof(ctx->why_not), "turned off (%s%s)",
                 param_ib_disable() ? "CFX_IB_DISABLE=1" : "CFX_NET=",
                 param_ib_disable() ? "" : cfx_transport_net_name());
    } else if ((ctx->ibv = cfx_verbs_api(&why)) == NULL) {
        snprintf(ctx->why_not, sizeof(ctx->why_not), "%s", why ? why : "libibverbs not loaded");
    } else {
        ctx->nearest = env->nic_name;
        if (cfx_ib_device_open(ctx) == cfxSuccess)
            ctx->usable = 1;
        ctx->nearest = NULL; /* The caller's string. */
    }
    if (!ctx->usable) {
        if (net == CFX_NET_IB) {
            cfxResult_t res = cfx_error_set(cfxSystemError, CFX_LOG_NET,
                                            "CFX_NET=IB, but the verbs transport cannot run on "
                                            "rank %d: %s",
                                            ctx->rank, ctx->why_not);
            ib_fini(ctx);
            return res;
        }
        CFX_INFO(CFX_LOG_NET, "ib: not used by rank %d: %s; sockets carry traffic between hosts",
                 ctx->rank, ctx->why_not);
        *ctx_p = ctx;
        return cfxSuccess;
    }
    cfxResult_t res = cfx_proxy_get(param_ib_spin_us() * 1000, &ctx->proxy);
    if (res != cfxSuccess)
        goto err_fini;
    /* Each device's async events come through the proxy: its fd, non-blocking. */
    for (int n = 0; n < ctx->n_nics; n++) {
        struct cfx_ib_nic *nic = &ctx->nic[n];
        int fd = nic->dev->async_fd;
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
            res = cfx_error_set_errno(errno, CFX_LOG_NET,
                                      "ib: cannot make %s's async event descriptor non-blocking",
                                      nic->port.label);
            goto err_fini;
        }
        nic->async_client.progress = async_proxy_progress;
        nic->async_client.ready = cfx_ib_async_ready;
        nic->async_client.arg = nic;
        res = cfx_proxy_add(ctx->proxy, &nic->async_client, &fd, 1, EPOLLIN);
        if (res != cfxSuccess)
            goto err_fini;
        nic->async_added = 1;
    }
    *ctx_p = ctx;
    return cfxSuccess;

err_fini:
    ib_fini(ctx);
    return res;
}

/* Releases what init made; accepts NULL. Connectors are closed first. */
static void ib_fini(void *ctx_v)
{
    struct cfx_ib_ctx *ctx = ctx_v;
    if (ctx == NULL)
        return;
    for (int n = 0; n < ctx->n_nics; n++)
        if (ctx->nic[n].async_added)
            cfx_proxy_remove(ctx->proxy, &ctx->nic[n].async_client);
    cfx_proxy_put(ctx->proxy);
    if (ctx->ibv)
        cfx_ib_device_close(ctx);
    free(ctx);
}

/* ============================================================ connection */

/* Ranks on different hosts, when this rank has a usable port. Pure. */
static int ib_can_connect(void *ctx_v, const struct cfx_transport_peer *self,
                          const struct cfx_transport_peer *peer)
{
    const struct cfx_ib_ctx *ctx = ctx_v;
    (void)self;
    return ctx->usable && peer->path == CFX_PATH_CLASS_NET;
}

/* Queue pair @p q on its port, in INIT, with that port's completion queue
 * for both queues. */
static cfxResult_t qp_create(struct cfx_ib_ctx *ctx, struct cfx_ib_conn *ic, int q)
{
    const struct cfx_verbs_api *ibv = ctx->ibv;
    struct cfx_ib_nic *nic = cfx_ib_qp_nic(ic, q);
    struct ibv_cq *cq = ic->cq[q % ic->n_nics];
    struct ibv_qp_init_attr init = {
        .qp_context = ic, /* Async events name the queue pair: they find the connector. */
        .send_cq = cq,
        .recv_cq = cq,
        .cap = {.max_send_wr = (uint32_t)ic->sq_depth,
                .max_recv_wr = (uint32_t)ic->n_steps,
                .max_send_sge = 1,
                .max_recv_sge = 1,
                .max_inline_data = sizeof(struct cfx_slot_info)},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 0,
    };
    if (q > 0 && ic->max_inline == 0)
        init.cap.max_inline_data = 0;
    ic->qp[q] = ibv->create_qp(nic->pd, &init);
    if (ic->qp[q] == NULL && q == 0) {
        init.cap.max_inline_data = 0; /* A NIC without inline data: sources are registered. */
        ic->qp[q] = ibv->create_qp(nic->pd, &init);
    }
    if (ic->qp[q] == NULL)
        return cfx_error_set_errno(errno, CFX_LOG_NET,
                                   "ib: cannot create a queue pair on %s for rank %d",
                                   nic->port.label, ic->peer_rank);
    if (q == 0 || (int)init.cap.max_inline_data < ic->max_inline)
        ic->max_inline = (int)init.cap.max_inline_data;
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_INIT,
                               .pkey_index = 0,
                               .port_num = (uint8_t)nic->port.port,
                               .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE};
    int err = ibv->modify_qp(ic->qp[q], &attr,
                             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (err != 0)
        return cfx_error_set_errno(err, CFX_LOG_NET,
                                   "ib: cannot move the queue pair for rank %d to INIT on %s",
                                   ic->peer_rank, nic->port.label);
    return cfxSuccess;
}

/* RTR then RTS: @p qp on @p port, to queue pair @p dest_qpn behind the port
 * @p theirs describes, whose send queue starts at @p rq_psn; this side's
 * starts at @p sq_psn. @p what names the queue pair in sentences. */
cfxResult_t cfx_ib_qp_rtr_rts(struct cfx_ib_ctx *ctx, struct ibv_qp *qp,
                              const struct cfx_ib_port *port, const struct cfx_ib_info_nic *theirs,
                              uint32_t dest_qpn, uint32_t rq_psn, uint32_t sq_psn, const char *what)
{
    const struct cfx_verbs_api *ibv = ctx->ibv;
    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu =
            (enum ibv_mtu)(theirs->mtu < (uint32_t)port->mtu ? theirs->mtu : (uint32_t)port->mtu),
        .dest_qp_num = dest_qpn,
        .rq_psn = rq_psn,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = 12,
        .ah_attr = {.dlid = theirs->lid,
                    .sl = (uint8_t)ctx->sl,
                    .src_path_bits = 0,
                    .port_num = (uint8_t)port->port},
    };
    int global = port->link_layer == IBV_LINK_LAYER_ETHERNET || port->gid_index >= 0;
    if (global) {
        attr.ah_attr.is_global = 1;
        memcpy(attr.ah_attr.grh.dgid.raw, theirs->gid, sizeof(theirs->gid));
        attr.ah_attr.grh.sgid_index = (uint8_t)(port->gid_index < 0 ? 0 : port->gid_index);
        attr.ah_attr.grh.hop_limit = 255;
        attr.ah_attr.grh.traffic_class = (uint8_t)ctx->tc;
    }
    int err = ibv->modify_qp(qp, &attr,
                             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (err != 0)
        return cfx_error_set_errno(err, CFX_LOG_NET, "ib: cannot move %s to RTR", what);
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = (uint8_t)ctx->timeout;
    attr.retry_cnt = (uint8_t)ctx->retry_cnt;
    attr.rnr_retry = 7;
    attr.sq_psn = sq_psn;
    attr.max_rd_atomic = 1;
    err = ibv->modify_qp(qp, &attr,
                         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (err != 0)
        return cfx_error_set_errno(err, CFX_LOG_NET, "ib: cannot move %s to RTS", what);
    return cfxSuccess;
}

/* Queue pair @p q with the peer's queue pair @p q. */
static cfxResult_t qp_connect(struct cfx_ib_ctx *ctx, struct cfx_ib_conn *ic,
                              const struct cfx_ib_info *peer, int q)
{
    char what[96];
    snprintf(what, sizeof(what), "the queue pair to rank %d (%s, qpn %u)", ic->peer_rank,
             ic->peer_nic[q], peer->qpn[q]);
    return cfx_ib_qp_rtr_rts(ctx, ic->qp[q], &cfx_ib_qp_nic(ic, q)->port,
                             &peer->nic[q % (int)peer->n_nics], peer->qpn[q], peer->psn, ic->psn,
                             what);
}

/* GPUDirect RDMA for a GPU rank's connector on device @p device: how its
 * slots may live in the device's memory (the NIC writes and reads them
 * there), or IB_GDR_NONE with @p why (of @p len bytes) saying why not.
 * dma-buf first (CFX_DMABUF_ENABLE), then nvidia-peermem (CFX_IB_PEERMEM). */
static enum ib_gdr_mode gdr_wanted(struct cfx_ib_ctx *ctx, int device, char *why, size_t len)
{
    if (ctx->gdr_level < 0) {
        snprintf(why, len, "CFX_NET_GDR_LEVEL=LOC");
        return IB_GDR_NONE;
    }
    if (ctx->nic_path < 0 && ctx->gdr_level < CFX_PATH_CLASS_SYS) {
        snprintf(why, len,
                 "the topology does not say how far the NIC is from the GPU (CFX_NET_GDR_LEVEL=SYS "
                 "uses it anyway)");
        return IB_GDR_NONE;
    }
    if (ctx->gdr_level < CFX_PATH_CLASS_SYS && ctx->nic_path > ctx->gdr_level) { /* SYS: always. */
        snprintf(why, len, "the NIC is farther from the GPU than CFX_NET_GDR_LEVEL allows");
        return IB_GDR_NONE;
    }
    const char *no_dmabuf = NULL;
    if (!ctx->dmabuf_enable)
        no_dmabuf = "CFX_DMABUF_ENABLE=0";
    else if (ctx->ibv->reg_dmabuf_mr == NULL)
        no_dmabuf = "libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later needed)";
    else if (cfx_cuda_dmabuf_supported(device, &no_dmabuf))
        return IB_GDR_DMABUF;
    if (cfx_ib_peermem_usable(ctx))
        return IB_GDR_PEERMEM;
    snprintf(why, len, "no dma-buf: %s; no nvidia-peermem: %s", no_dmabuf,
             ctx->peermem == 0 ? "CFX_IB_PEERMEM=0" : "the kernel module is not loaded");
    return IB_GDR_NONE;
}

/* The slots of @p ic in device @p device's memory, registered through each
 * port (as a dma-buf, or by address through nvidia-peermem); remote read
 * too, for a flush by loopback read. Undone by close on failure. */
static cfxResult_t gdr_slots(struct cfx_ib_ctx *ctx, struct cfx_ib_conn *ic, int device,
                             enum ib_gdr_mode mode, size_t slots_bytes)
{
    size_t bytes = (slots_bytes + 4095) & ~(size_t)4095;
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    CFX_CHECK(cfx_cuda_select(device));
    CFX_CHECK(cfx_cuda_mem_alloc(&ic->dev_raw, bytes + 4096));
    ic->gdr_device = device + 1;
    ic->gdr_mode = mode;
    ic->dev_mem = (char *)(((uintptr_t)ic->dev_raw + 4095) & ~(uintptr_t)4095);
    for (int n = 0; n < ic->n_nics; n++) {
        if (mode == IB_GDR_PEERMEM) {
            ic->slots_mr[n] = ctx->ibv->reg_mr(ctx->nic[n].pd, ic->dev_mem, bytes, access);
            if (ic->slots_mr[n] == NULL)
                return cfx_error_set_errno(errno, CFX_LOG_NET,
                                           "ib: cannot register %zu bytes of device %d's memory on "
                                           "%s (ibv_reg_mr of a device pointer: is nvidia-peermem "
                                           "loaded? CFX_IB_PEERMEM=0 stages through host memory)",
                                           bytes, device, ctx->nic[n].port.label);
            continue;
        }
        int fd = -1;
        CFX_CHECK(cfx_cuda_dmabuf_fd(ic->dev_mem, bytes, device, &fd));
        ic->slots_mr[n] = ctx->ibv->reg_dmabuf_mr(ctx->nic[n].pd, 0, bytes,
                                                  (uint64_t)(uintptr_t)ic->dev_mem, fd, access);
        int err = errno;
        close(fd); /* The registration holds the dma-buf. */
        if (ic->slots_mr[n] == NULL)
            return cfx_error_set_errno(err, CFX_LOG_NET,
                                       "ib: cannot register %zu bytes of device %d's memory on %s "
                                       "(ibv_reg_dmabuf_mr)",
                                       bytes, device, ctx->nic[n].port.label);
    }
    return cfxSuccess;
}

cfxResult_t cfx_ib_loopback_qp(struct cfx_ib_ctx *ctx, struct cfx_ib_nic *nic, struct ibv_cq *cq,
                               void *context, int depth, uint32_t psn, struct ibv_qp **qp_p)
{
    const struct cfx_verbs_api *ibv = ctx->ibv;
    struct ibv_qp_init_attr init = {
        .qp_context = context,
        .send_cq = cq,
        .recv_cq = cq,
        .cap = {.max_send_wr = (uint32_t)depth,
                .max_recv_wr = 1,
                .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 0,
    };
    struct ibv_qp *qp = ibv->create_qp(nic->pd, &init);
    if (qp == NULL)
        return cfx_error_set_errno(
            errno, CFX_LOG_NET, "ib: cannot create the flush's queue pair on %s", nic->port.label);
    *qp_p = qp;
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_INIT,
                               .pkey_index = 0,
                               .port_num = (uint8_t)nic->port.port,
                               .qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE};
    int err = ibv->modify_qp(qp, &attr,
                             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (err != 0)
        return cfx_error_set_errno(err, CFX_LOG_NET,
                                   "ib: cannot move the flush's queue pair to INIT on %s",
                                   nic->port.label);
    struct cfx_ib_info_nic self = {.lid = nic->port.lid,
                                   .mtu = (uint8_t)nic->port.mtu,
                                   .link_layer = (uint8_t)nic->port.link_layer};
    memcpy(self.gid, nic->port.gid.raw, sizeof(self.gid));
    return cfx_ib_qp_rtr_rts(ctx, qp, &nic->port, &self, qp->qp_num, psn, psn,
                             "the flush's queue pair (connected to itself)");
}

/* A receiver's flush by RDMA read: a queue pair on port 0 connected to
 * itself, with a completion queue of its own, that may read the slots. */
static cfxResult_t flush_qp_open(struct cfx_ib_ctx *ctx, struct cfx_ib_conn *ic)
{
    struct cfx_ib_nic *nic = &ctx->nic[0];
    ic->flush_cq = ctx->ibv->create_cq(nic->dev, 4, ic, NULL, 0);
    if (ic->flush_cq == NULL)
        return cfx_error_set_errno(errno, CFX_LOG_NET,
                                   "ib: cannot create the flush's completion queue on %s",
                                   nic->port.label);
    return cfx_ib_loopback_qp(ctx, nic, ic->flush_cq, ic, 2, ic->psn, &ic->flush_qp);
}

/* Undo gdr_slots (any part of it). */
static void gdr_slots_free(struct cfx_ib_ctx *ctx, struct cfx_ib_conn *ic)
{
    if (ic->flush_qp != NULL)
        ctx->ibv->destroy_qp(ic->flush_qp);
    if (ic->flush_cq != NULL)
        ctx->ibv->destroy_cq(ic->flush_cq);
    ic->flush_qp = NULL;
    ic->flush_cq = NULL;
    for (int n = 0; n < IB_MAX_NICS; n++)
        if (ic->slots_mr[n])
            ctx->ibv->dereg_mr(ic->slots_mr[n]);
    memset(ic->slots_mr, 0, sizeof(ic->slots_mr));
    ic->gdr_mode = IB_GDR_NONE;
    if (ic->dev_raw != NULL && cfx_cuda_select(ic->gdr_device - 1) == cfxSuccess)
        cfx_cuda_mem_free(ic->dev_raw);
    ic->dev_raw = NULL;
    ic->dev_mem = NULL;
    ic->gdr_device = 0;
}

/* Allocates, touches and registers this side's block; creates the
 * completion queue and the queue pair; a receiver posts its receives. Writes
 * a struct cfx_ib_info. Does not block on the peer. */
static cfxResult_t ib_setup(void *ctx_v, const struct cfx_transport_peer *peer, size_t slot_bytes,
                            int n_steps, struct cfx_connector *conn, void *info_out)
{
    struct cfx_ib_ctx *ctx = ctx_v;
    const struct cfx_verbs_api *ibv = ctx->ibv;
    assert(ctx->usable && n_steps >= 1 && n_steps <= CFX_MAX_STEPS && slot_bytes > 0);
    if (conn->place.mem == CFX_MEM_DEVICE)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_NET,
                             "ib: cannot place a FIFO in device memory yet (GPUDirect RDMA); "
                             "pinned host memory is staged through (connection with rank %d)",
                             peer->rank);
    if (conn->place.reader == CFX_READER_KERNEL && conn->place.mem != CFX_MEM_HOST_PINNED)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_NET,
                             "ib: a FIFO a kernel reads must be pinned host memory (connection "
                             "with rank %d)",
                             peer->rank);
    size_t slots_off = cfx_fifo_slots_offset();
    if (slot_bytes > (SIZE_MAX / 2 - slots_off) / (size_t)n_steps || slot_bytes > UINT32_MAX)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_NET,
                             "ib: %d slots of %zu bytes do not fit in memory", n_steps, slot_bytes);
    /* A GPU rank's slots go to its device's memory when GPUDirect RDMA
     * can reach them; its FIFO's control block stays in pinned host memory
     * (the proxy reads it), as do the mailboxes. */
    char no_gdr[CFX_ERROR_MAX] = "not wanted";
    enum ib_gdr_mode gdr = conn->place.reader == CFX_READER_KERNEL
                               ? gdr_wanted(ctx, conn->place.device, no_gdr, sizeof(no_gdr))
                               : IB_GDR_NONE;
    size_t slots_bytes = (size_t)n_steps * slot_bytes;
    size_t box_off = (slots_off + (gdr ? 0 : slots_bytes) + 4095) & ~(size_t)4095;
    size_t bytes = box_off + ((sizeof(struct cfx_ib_mailbox) + 4095) & ~(size_t)4095);

    struct cfx_ib_conn *ic = NULL;
    if (posix_memalign((void **)&ic, CFX_CACHE_LINE, sizeof(*ic)) != 0)
        return cfx_error_set(cfxSystemError, CFX_LOG_NET, "ib: out of memory");
    memset(ic, 0, sizeof(*ic));
    conn->priv = ic;
    ic->ctx = ctx;
    ic->dir = conn->dir;
    ic->self_rank = ctx->rank;
    ic->peer_rank = peer->rank;
    ic->blame_rank = -1;
    ic->n_steps = n_steps;
    ic->slot_bytes = slot_bytes;
    /* Per slot a payload and an info write, plus credits, a poison and a keepalive. */
    ic->sq_depth = 2 * n_steps + IB_CREDITS_IN_FLIGHT + 4;
    if (posix_memalign(&ic->mem, 4096, bytes) != 0) {
        ic->mem = NULL;
        return cfx_error_set(cfxSystemError, CFX_LOG_NET,
                             "ib: out of memory for a %zu-byte FIFO to rank %d", bytes, peer->rank);
    }
    memset(ic->mem, 0, bytes); /* Touch every page now, never on the data path. */
    ic->mem_bytes = bytes;
    if (conn->place.reader == CFX_READER_KERNEL) {
        /* A GPU rank: its kernel fills and drains this FIFO through the
         * mapping, and the NIC reads and writes the same pages (staged
         * through host memory: no GPUDirect RDMA). */
        CFX_CHECK(cfx_cuda_host_register(ic->mem, bytes, conn->place.device));
        ic->pinned = conn->place.device + 1;
    }
    ic->fifo = ic->mem;
    ic->slots = (char *)ic->mem + slots_off;
    ic->box = (struct cfx_ib_mailbox *)((char *)ic->mem + box_off);

    ic->n_qps = ctx->qps_per_conn;
    ic->n_nics = ic->n_qps < ctx->n_nics ? ic->n_qps : ctx->n_nics;
    int flush_read = 0;
    if (gdr) {
        CFX_CHECK(gdr_slots(ctx, ic, conn->place.device, gdr, slots_bytes));
        ic->slots = ic->dev_mem;
        /* A receiver flushes the NIC's writes before it posts them. */
        const char *no_cuda_flush = NULL;
        const char *flush = "";
        if (ic->dir == CFX_CONN_RECV) {
            flush = "; flushed by cuFlushGPUDirectRDMAWrites";
            flush_read = ctx->flush_read_forced ||
                         !cfx_cuda_rdma_flush_supported(conn->place.device, &no_cuda_flush);
            if (flush_read)
                flush = "; flushed by an RDMA read on a loopback queue pair";
        }
        CFX_INFO(CFX_LOG_NET,
                 "ib: rank %d %s rank %d: slots in device %d's memory (GPUDirect RDMA, %s%s%s%s)",
                 ctx->rank, ic->dir == CFX_CONN_SEND ? "->" : "<-", peer->rank, conn->place.device,
                 gdr == IB_GDR_DMABUF ? "dma-buf" : "nvidia-peermem", flush,
                 no_cuda_flush ? ": " : "", no_cuda_flush ? no_cuda_flush : "");
    } else if (conn->place.reader == CFX_READER_KERNEL) {
        CFX_INFO(CFX_LOG_NET,
                 "ib: rank %d %s rank %d: slots staged through pinned host memory (no GPUDirect "
                 "RDMA: %s)",
                 ctx->rank, ic->dir == CFX_CONN_SEND ? "->" : "<-", peer->rank, no_gdr);
    }
    for (int n = 0; n < ic->n_nics; n++) {
        struct cfx_ib_nic *nic = &ctx->nic[n];
        ic->mr[n] =
            ibv->reg_mr(nic->pd, ic->mem, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        if (ic->mr[n] == NULL)
            return cfx_error_set_errno(errno, CFX_LOG_NET,
                                       "ib: cannot register %zu bytes for rank %d on %s "
                                       "(locked-memory limit? see ulimit -l)",
                                       bytes, peer->rank, nic->port.label);
        /* The queue pairs on this port: q = n, n + n_nics, ... */
        int qps_here = (ic->n_qps - n + ic->n_nics - 1) / ic->n_nics;
        int cqe = qps_here * (ic->sq_depth + n_steps) + 8;
        ic->cq[n] = ibv->create_cq(nic->dev, cqe, ic, NULL, 0);
        if (ic->cq[n] == NULL)
            return cfx_error_set_errno(errno, CFX_LOG_NET,
                                       "ib: cannot create a completion queue on %s for rank %d",
                                       nic->port.label, peer->rank);
    }
    for (int q = 0; q < ic->n_qps; q++) {
        CFX_CHECK(qp_create(ctx, ic, q));
        if (ic->dir == CFX_CONN_RECV)
            CFX_CHECK(cfx_ib_post_recvs(ic, q, n_steps));
    }
    ic->psn = cfx_ib_random_psn();
    if (flush_read)
        CFX_CHECK(flush_qp_open(ctx, ic));

    struct cfx_ib_info info = {.magic = IB_INFO_MAGIC,
                               .rank = ctx->rank,
                               .dir = (uint32_t)conn->dir,
                               .n_qps = (uint32_t)ic->n_qps,
                               .psn = ic->psn,
                               .n_steps = (uint32_t)n_steps,
                               .n_nics = (uint32_t)ic->n_nics,
                               .slot_bytes = slot_bytes,
                               .mem_addr = (uint64_t)(uintptr_t)ic->mem,
                               .slots_addr = (uint64_t)(uintptr_t)ic->slots,
                               .box_offset = box_off};
    for (int q = 0; q < ic->n_qps; q++)
        info.qpn[q] = ic->qp[q]->qp_num;
    for (int n = 0; n < ic->n_nics; n++) {
        const struct cfx_ib_port *port = &ctx->nic[n].port;
        struct cfx_ib_info_nic *out = &info.nic[n];
        memcpy(out->gid, port->gid.raw, sizeof(out->gid));
        out->rkey = ic->mr[n]->rkey;
        out->slots_rkey = ic->gdr_device ? ic->slots_mr[n]->rkey : ic->mr[n]->rkey;
        out->lid = port->lid;
        out->mtu = (uint8_t)port->mtu;
        out->link_layer = (uint8_t)port->link_layer;
        snprintf(out->name, sizeof(out->name), "%.11s", port->label);
    }
    memcpy(info_out, &info, sizeof(info));
    cfx_connector_set_fifo(conn, ic->fifo, ic->slots, slot_bytes, n_steps);
    conn->peer_rank = peer->rank;
    if (gdr) /* Host buffers of this GPU rank reach device slots through copies. */
        CFX_CHECK(cfx_connector_stage_init(conn, conn->place.device));
    return cfxSuccess;
}

/* Moves the queue pair to RTS with the peer's and hands the connector to
 * the proxy. Does not wait for the peer: an RC queue pair retries writes
 * that reach a peer not yet ready (for timeout x retry count). */
static cfxResult_t ib_connect(void *ctx_v, struct cfx_connector *conn, const void *peer_info)
{
    struct cfx_ib_ctx *ctx = ctx_v;
    struct cfx_ib_conn *ic = conn->priv;
    struct cfx_ib_info peer;
    memcpy(&peer, peer_info, sizeof(peer));
    enum cfx_conn_dir want = ic->dir == CFX_CONN_SEND ? CFX_CONN_RECV : CFX_CONN_SEND;
    if (peer.magic != IB_INFO_MAGIC || peer.rank != ic->peer_rank || peer.dir != (uint32_t)want ||
        peer.n_steps != (uint32_t)ic->n_steps || peer.slot_bytes != ic->slot_bytes ||
        peer.n_qps > IB_MAX_QPS || peer.n_nics < 1 || peer.n_nics > IB_MAX_NICS)
        return cfx_error_set(cfxInternalError, CFX_LOG_NET,
                             "ib: rank %d sent connect info that does not match this connection "
                             "(another build, or a crossed connection)",
                             ic->peer_rank);
    if (peer.n_qps != (uint32_t)ic->n_qps)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_NET,
                             "ib: rank %d uses %u queue pairs per connection but rank %d uses %d; "
                             "set CFX_IB_QPS_PER_CONNECTION alike on all ranks",
                             ic->peer_rank, peer.n_qps, ic->self_rank, ic->n_qps);
    ic->peer_n_nics = (int)peer.n_nics;
    for (int q = 0; q < ic->n_qps; q++) {
        const struct cfx_ib_info_nic *theirs = &peer.nic[q % ic->peer_n_nics];
        const struct cfx_ib_port *port = &cfx_ib_qp_nic(ic, q)->port;
        snprintf(ic->peer_nic[q], sizeof(ic->peer_nic[q]), "%.*s", (int)sizeof(theirs->name),
                 theirs->name);
        ic->peer_rkey[q] = theirs->rkey;
        ic->peer_slots_rkey[q] = theirs->slots_rkey;
        if (theirs->link_layer != (uint8_t)port->link_layer)
            return cfx_error_set(
                cfxSystemError, CFX_LOG_NET,
                "ib: rank %d's port %s is %s but this rank's %s is %s: they cannot reach each "
                "other; set CFX_IB_HCA or CFX_NET=Socket",
                ic->peer_rank, ic->peer_nic[q],
                theirs->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", port->label,
                port->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand");
    }
    ic->peer_addr = peer.mem_addr;
    ic->peer_slots = peer.slots_addr;
    ic->peer_box = peer.mem_addr + peer.box_offset;
    for (int q = 0; q < ic->n_qps; q++)
        CFX_CHECK(qp_connect(ctx, ic, &peer, q));
    ic->client.progress = conn_proxy_progress;
    ic->client.ready = NULL;
    ic->client.arg = ic;
    atomic_store_explicit(&ic->client.poll_ns, ic->pinned ? CFX_PROXY_KERNEL_FAST_NS : 0,
                          memory_order_relaxed);
    CFX_CHECK(cfx_proxy_add(ctx->proxy, &ic->client, NULL, 0, 0));
    ic->registered = 1;
    /* "fake_0:1 qpn 12 -> fake_0:1 qpn 34, fake_1:1 qpn ... -> ..." */
    char pairs[256] = "";
    for (int q = 0; q < ic->n_qps && q < 4; q++) {
        size_t used = strlen(pairs);
        snprintf(pairs + used, sizeof(pairs) - used, "%s%s qpn %u %s %s qpn %u", q ? ", " : "",
                 cfx_ib_qp_nic(ic, q)->port.label, ic->qp[q]->qp_num,
                 ic->dir == CFX_CONN_SEND ? "->" : "<-", ic->peer_nic[q], peer.qpn[q]);
    }
    CFX_INFO(CFX_LOG_NET, "ib: rank %d %s rank %d connected (%s%s; %d queue pair(s) on %d port(s))",
             ctx->rank, ic->dir == CFX_CONN_SEND ? "->" : "<-", ic->peer_rank, pairs,
             ic->n_qps > 4 ? ", ..." : "", ic->n_qps, ic->n_nics);
    return cfxSuccess;
}

/* Before the queue pair goes: a poison recorded gets written, else a
 * sender's posted slots get written (the peer's credits permitting); at
 * most IB_LINGER_NS, and not at all once the connector failed. */
static void linger(struct cfx_ib_conn *ic)
{
    int64_t deadline = cfx_time_now_ns() + IB_LINGER_NS;
    for (;;) {
        if (atomic_load_explicit(&ic->failed, memory_order_acquire))
            return;
        int poisoned = atomic_load_explicit(&ic->poison_reason, memory_order_acquire) != 0;
        int flushed = ic->dir == CFX_CONN_RECV || cfx_load_acquire_u64(&ic->fifo->head) ==
                                                      cfx_load_acquire_u64(&ic->fifo->tail);
        int done =
            poisoned ? atomic_load_explicit(&ic->poison_done, memory_order_acquire) : flushed;
        if (done || cfx_time_now_ns() > deadline)
            return;
        if (!cfx_ib_conn_drive(ic))
            sched_yield();
    }
}

/* Takes the connector from the proxy, then destroys the queue pair, the
 * completion queue and the registration, and frees the block. Half-built
 * connectors too. Never waits on the peer beyond the linger. */
static void ib_close(void *ctx_v, struct cfx_connector *conn)
{
    struct cfx_ib_ctx *ctx = ctx_v;
    struct cfx_ib_conn *ic = conn->priv;
    if (ic == NULL)
        return;
    const struct cfx_verbs_api *ibv = ctx->ibv;
    if (ic->ref_slots > 0)
        CFX_INFO(CFX_LOG_NET, "ib: rank %d -> rank %d wrote %llu slot(s) from registered buffers",
                 ic->self_rank, ic->peer_rank, (unsigned long long)ic->ref_slots);
    if (ic->in_place_slots > 0)
        CFX_INFO(CFX_LOG_NET,
                 "ib: rank %d -> rank %d wrote %llu slot(s) into registered receive buffers",
                 ic->self_rank, ic->peer_rank, (unsigned long long)ic->in_place_slots);
    if (ic->registered) {
        linger(ic);
        cfx_proxy_remove(ctx->proxy, &ic->client);
        ic->registered = 0;
    }
    /* Events not read yet (one may be about these queue pairs, which
     * cannot be destroyed before it is acknowledged). */
    for (int n = 0; n < ic->n_nics; n++)
        cfx_ib_async_ready(&ctx->nic[n], 0);
    for (int q = 0; q < IB_MAX_QPS; q++)
        if (ic->qp[q])
            ibv->destroy_qp(ic->qp[q]);
    for (int n = 0; n < IB_MAX_NICS; n++) {
        if (ic->cq[n])
            ibv->destroy_cq(ic->cq[n]);
        if (ic->mr[n])
            ibv->dereg_mr(ic->mr[n]);
    }
    if (ic->pinned)
        cfx_cuda_host_unregister(ic->mem, ic->pinned - 1);
    if (ic->gdr_flushes > 0)
        CFX_INFO(CFX_LOG_NET,
                 "ib: rank %d <- rank %d flushed the NIC's writes into device memory %llu time(s) "
                 "(%s)",
                 ic->self_rank, ic->peer_rank, (unsigned long long)ic->gdr_flushes,
                 ic->flush_qp ? "RDMA reads" : "cuFlushGPUDirectRDMAWrites");
    cfx_connector_stage_fini(conn);
    gdr_slots_free(ctx, ic);
    free(ic->mem);
    free(ic);
    cfx_connector_forget(conn);
}

/* ============================================================ memory */

static void ib_dereg_mem(void *ctx_v, void *handle);

/* A user buffer as a memory region of each port's protection domain, so
 * slots can be written from it (post_ref) and into it (offer, with remote
 * write access) over any of them. Host memory only: device memory would
 * need GPUDirect RDMA. */
static cfxResult_t ib_reg_mem(void *ctx_v, void *buf, size_t bytes, enum cfx_mem_kind mem,
                              int device, void **handle_p)
{
    struct cfx_ib_ctx *ctx = ctx_v;
    *handle_p = NULL;
    if (!ctx->usable)
        return cfxSuccess; /* No NIC: nothing will read it. */
    if (mem == CFX_MEM_DEVICE)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_NET,
                             "ib: cannot register %zu bytes of device %d's memory: GPUDirect "
                             "RDMA is not supported yet (the data is staged through host memory)",
                             bytes, device);
    struct cfx_ib_reg *reg = calloc(1, sizeof(*reg));
    if (reg == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_NET, "ib: out of memory");
    reg->addr = buf;
    reg->length = bytes;
    for (int n = 0; n < ctx->n_nics; n++) {
        /* Remote write: the peer's NIC writes registered receives in place (ib_offer). */
        reg->mr[n] = ctx->ibv->reg_mr(ctx->nic[n].pd, buf, bytes,
                                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        if (reg->mr[n] == NULL) {
            cfxResult_t res =
                cfx_error_set_errno(errno, CFX_LOG_NET,
                                    "ib: cannot register the %zu-byte buffer at %p on %s "
                                    "(locked-memory limit? see ulimit -l)",
                                    bytes, buf, ctx->nic[n].port.label);
            ib_dereg_mem(ctx, reg);
            return res;
        }
    }
    *handle_p = reg;
    return cfxSuccess;
}

static void ib_dereg_mem(void *ctx_v, void *handle)
{
    struct cfx_ib_ctx *ctx = ctx_v;
    struct cfx_ib_reg *reg = handle;
    if (reg == NULL)
        return;
    for (int n = 0; n < IB_MAX_NICS; n++)
        if (reg->mr[n])
            ctx->ibv->dereg_mr(reg->mr[n]);
    free(reg);
}

static cfxResult_t ib_post_ref(void *ctx_v, struct cfx_connector *conn, const void *data,
                               size_t bytes, void *handle)
{
    (void)ctx_v;
    struct cfx_ib_conn *ic = conn->priv;
    const struct cfx_ib_reg *reg = handle;
    if (reg == NULL || bytes <= CFX_SLOT_INLINE_BYTES || bytes > ic->slot_bytes ||
        (const char *)data < reg->addr || (const char *)data + bytes > reg->addr + reg->length)
        return cfx_error_set(cfxInternalError, CFX_LOG_NET,
                             "ib: rank %d cannot send %zu bytes at %p to rank %d from a "
                             "registration that does not hold them (or too small or large for "
                             "a slot)",
                             ic->self_rank, bytes, data, ic->peer_rank);
    size_t index = (size_t)(cfx_load_relaxed_u64(&ic->fifo->tail) % (uint64_t)ic->n_steps);
    ic->ref_addr[index] = (uint64_t)(uintptr_t)data;
    ic->ref_reg[index] = reg;
    return cfxSuccess;
}

/* A registered receive: tell the sender where message @p msg may go. */
static cfxResult_t ib_offer(void *ctx_v, struct cfx_connector *conn, uint64_t msg, void *data,
                            size_t bytes, void *handle)
{
    (void)ctx_v;
    struct cfx_ib_conn *ic = conn->priv;
    const struct cfx_ib_reg *reg = handle;
    if (reg == NULL || (const char *)data < reg->addr ||
        (const char *)data + bytes > reg->addr + reg->length)
        return cfx_error_set(cfxInternalError, CFX_LOG_NET,
                             "ib: rank %d cannot offer %zu bytes at %p to rank %d from a "
                             "registration that does not hold them",
                             ic->self_rank, bytes, data, ic->peer_rank);
    uint64_t made = atomic_load_explicit(&ic->offers_made, memory_order_relaxed);
    if (made - atomic_load_explicit(&ic->offers_done, memory_order_acquire) >= IB_OFFERS)
        return cfxSuccess; /* Best effort: this message goes through the FIFO. */
    struct cfx_ib_offer *src = &ic->box->offer_src[made % IB_OFFERS];
    *src = (struct cfx_ib_offer){
        .msg_plus1 = msg + 1, .addr = (uint64_t)(uintptr_t)data, .bytes = bytes, .check = msg + 1};
    for (int n = 0; n < ic->n_nics; n++)
        src->rkey[n] = reg->mr[n]->rkey;
    atomic_store_explicit(&ic->offers_made, made + 1, memory_order_release);
    cfx_ib_conn_drive(ic);
    return cfxSuccess;
}

/* The next slot is message @p msg's bytes at @p offset (see ib_offer). */
static void ib_post_at(void *ctx_v, struct cfx_connector *conn, uint64_t msg, uint64_t offset)
{
    (void)ctx_v;
    struct cfx_ib_conn *ic = conn->priv;
    size_t index = (size_t)(cfx_load_relaxed_u64(&ic->fifo->tail) % (uint64_t)ic->n_steps);
    ic->at_msg[index] = msg + 1;
    ic->at_offset[index] = offset;
}

#define IB_REG_MEM   ib_reg_mem
#define IB_DEREG_MEM ib_dereg_mem
#define IB_POST_REF  ib_post_ref
#define IB_OFFER     ib_offer
#define IB_POST_AT   ib_post_at

/* ============================================================ data path */

static int ib_progress(void *ctx_v, struct cfx_connector *conn)
{
    (void)ctx_v;
    struct cfx_ib_conn *ic = conn->priv;
    if (ic == NULL || !ic->registered)
        return 0;
    atomic_store_explicit(&ic->started, 1, memory_order_relaxed);
    return cfx_ib_conn_drive(ic);
}

/* After a post or release: write the slot or the credit from this thread. */
static void ib_kick(void *ctx_v, struct cfx_connector *conn)
{
    ib_progress(ctx_v, conn);
}

/* Record the poison; the next pass writes it into the peer's mailbox. */
static void ib_poison(void *ctx_v, struct cfx_connector *conn, cfxResult_t reason, int blame_rank)
{
    (void)ctx_v;
    struct cfx_ib_conn *ic = conn->priv;
    if (ic == NULL)
        return;
    atomic_store_explicit(&ic->poison_blame, blame_rank, memory_order_relaxed);
    atomic_store_explicit(&ic->poison_reason, (int)reason, memory_order_release);
    if (ic->registered)
        cfx_ib_conn_drive(ic);
}

static cfxResult_t ib_check(void *ctx_v, struct cfx_connector *conn)
{
    (void)ctx_v;
    struct cfx_ib_conn *ic = conn->priv;
    assert(ic != NULL);
    /* Asked only once the core's "connected" exchange is over: a GPU
     * rank's connector, which no user thread drives, may send keepalives
     * from now on. */
    atomic_store_explicit(&ic->started, 1, memory_order_relaxed);
    return cfx_ib_conn_check(ic, conn);
}

#else /* !CFX_HAVE_VERBS */

#include <stdlib.h>

#include "src/util/error.h"
#include "src/util/log.h"

/* Built without the verbs headers: the transport accepts no pair; with
 * CFX_NET=IB that is an error saying so. */
static cfxResult_t ib_init(const struct cfx_transport_env *env, void **ctx_p)
{
    if (cfx_transport_net_choice() == CFX_NET_IB)
        return cfx_error_set(cfxSystemError, CFX_LOG_NET,
                             "CFX_NET=IB, but this Conflux was built without the verbs headers "
                             "(libibverbs-dev)");
    static int no_state; /* The core takes a NULL context for "not initialized". */
    CFX_INFO(CFX_LOG_NET, "ib: not used by rank %d: built without the verbs headers", env->rank);
    *ctx_p = &no_state;
    return cfxSuccess;
}

static void ib_fini(void *ctx)
{
    (void)ctx;
}

static int ib_can_connect(void *ctx, const struct cfx_transport_peer *self,
                          const struct cfx_transport_peer *peer)
{
    (void)ctx;
    (void)self;
    (void)peer;
    return 0;
}

/* can_connect never accepts, so nothing below runs; they answer anyway. */
static cfxResult_t ib_setup(void *ctx, const struct cfx_transport_peer *peer, size_t slot_bytes,
                            int n_steps, struct cfx_connector *conn, void *info_out)
{
    (void)ctx;
    (void)slot_bytes;
    (void)n_steps;
    (void)conn;
    (void)info_out;
    return cfx_error_set(cfxInternalError, CFX_LOG_NET,
                         "ib: cannot connect to rank %d: built without the verbs headers",
                         peer->rank);
}

static cfxResult_t ib_connect(void *ctx, struct cfx_connector *conn, const void *peer_info)
{
    (void)ctx;
    (void)peer_info;
    return cfx_error_set(cfxInternalError, CFX_LOG_NET,
                         "ib: cannot connect to rank %d: built without the verbs headers",
                         conn->peer_rank);
}

static void ib_close(void *ctx, struct cfx_connector *conn)
{
    (void)ctx;
    (void)conn;
}

static void ib_kick(void *ctx, struct cfx_connector *conn)
{
    (void)ctx;
    (void)conn;
}

static void ib_poison(void *ctx, struct cfx_connector *conn, cfxResult_t reason, int blame_rank)
{
    (void)ctx;
    (void)conn;
    (void)reason;
    (void)blame_rank;
}

static cfxResult_t ib_check(void *ctx, struct cfx_connector *conn)
{
    (void)ctx;
    (void)conn;
    return cfxSuccess;
}

static int ib_progress(void *ctx, struct cfx_connector *conn)
{
    (void)ctx;
    (void)conn;
    return 0;
}

#define IB_REG_MEM   NULL
#define IB_DEREG_MEM NULL
#define IB_POST_REF  NULL
#define IB_OFFER     NULL
#define IB_POST_AT   NULL

#endif /* CFX_HAVE_VERBS */

/* One table for both builds: without the verbs headers can_connect never
 * accepts, so only init, fini and can_connect ever run. */
const struct cfx_transport cfx_ib_transport = {
    .version = CFX_TRANSPORT_VERSION,
    .name = "ib",
    /* READER_KERNEL: a GPU rank's FIFO in pinned host memory, moved by the
     * proxy (no GPUDirect RDMA yet). */
    .flags = CFX_TRANSPORT_FLAG_PROGRESS | CFX_TRANSPORT_FLAG_CONNECT_ACK |
             CFX_TRANSPORT_FLAG_READER_KERNEL,
    /* lifecycle */
    .init = ib_init,
    .fini = ib_fini,
    /* connection */
    .can_connect = ib_can_connect,
    .setup = ib_setup,
    .connect = ib_connect,
    .close = ib_close,
    /* data path */
    .kick = ib_kick,
    .poison = ib_poison,
    .check = ib_check,
    .progress = ib_progress,
    .wait = NULL,
    .read_peer = NULL,
    /* memory: registered host buffers are written from where they are */
    .reg_mem = IB_REG_MEM,
    .dereg_mem = IB_DEREG_MEM,
    .flush = NULL,
    .map_peer = NULL,
    .post_ref = IB_POST_REF,
    .offer = IB_OFFER,
    .post_at = IB_POST_AT,
};
