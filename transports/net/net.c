/*
 * The net-plugin transport: an NCCL net plugin (CFX_NET_PLUGIN, loaded by
 * plugin.c) carries the traffic between hosts, unchanged. This file holds
 * the ops table and each connector's life: setup allocates and touches the
 * FIFO block and (receiver) listens; connect calls the plugin's
 * non-blocking connect/accept until the comm exists, then registers the
 * block once; close lingers for a sender's posted slots, then closes the
 * comms and deregisters. The protocol is in conn.h and docs/transports.md;
 * data.c moves the bytes.
 *
 * Threads: as with the ib transport, a pass over a connector is made by
 * whichever thread asks first (cfx_net_conn_drive): the user thread after a
 * post or release and while it waits, or the process's proxy thread, which
 * passes over connectors with work in flight every NET_POLL_NS. Plugin
 * calls on one comm are thus never concurrent.
 */
#include "transports/net/net.h"

#include <assert.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "src/util/check.h"
#include "src/util/cuda.h"
#include "src/util/log.h"
#include "src/util/time.h"
#include "transports/net/conn.h"

#define CONNECT_NAP_NS   (200 * 1000)        /* Between two connect/accept calls. */
#define CONNECT_CHECK_NS (100 * 1000 * 1000) /* How often the core is asked about the peer. */

/* ============================================================ lifecycle */

static void net_fini(void *ctx_v);

/* The devices of this rank's connections: the plugin's devices named as
 * the topology's ports nearest this rank (env->nic_near, the nearest
 * first; the peer picks its own on its side, as NCCL's ranks do), channel
 * c on the (c mod n)-th; else device 0 alone. Says which at INFO. */
static void pick_devs(struct cfx_net_ctx *ctx, const struct cfx_net_plugin *plugin,
                      const struct cfx_transport_env *env)
{
    const char *near = env->nic_near != NULL && env->nic_near[0] ? env->nic_near
                       : env->nic_name != NULL                   ? env->nic_name
                                                                 : "";
    char list[256] = "";
    for (const char *at = near; *at && ctx->n_devs < NET_MAX_DEVS;) {
        size_t len = strcspn(at, ",");
        int dev = cfx_net_plugin_use_dev(plugin, cfx_net_plugin_find_dev(plugin, at, len));
        int seen = 0;
        for (int i = 0; i < ctx->n_devs; i++)
            seen |= ctx->devs[i] == dev;
        if (dev >= 0 && !seen) {
            size_t used = strlen(list);
            snprintf(list + used, sizeof(list) - used, "%s%d (%s)", ctx->n_devs ? ", " : "", dev,
                     plugin->dev_name[dev]);
            ctx->devs[ctx->n_devs++] = dev;
        }
        at += len + (at[len] == ',');
    }
    int nearest = ctx->n_devs > 0;
    ctx->nic_path = nearest ? env->nic_path : -1;
    if (nearest) {
        CFX_INFO(CFX_LOG_NET | CFX_LOG_INIT,
                 "net-plugin: rank %d uses device%s %s, the topology's nearest port%s%s", ctx->rank,
                 ctx->n_devs > 1 ? "s" : "", list, ctx->n_devs > 1 ? "s" : "",
                 ctx->n_devs > 1 ? " (channel c on the (c mod n)-th)" : "");
        return;
    }
    ctx->devs[0] = cfx_net_plugin_use_dev(plugin, 0);
    ctx->n_devs = 1;
    CFX_INFO(CFX_LOG_NET | CFX_LOG_INIT, "net-plugin: rank %d uses device %d (%s): %s%s%s",
             ctx->rank, ctx->devs[0], plugin->dev_name[ctx->devs[0]],
             near[0] ? "no device of the plugin is named " : "",
             near[0] ? near : "the topology names no port near this rank",
             near[0] ? ", the topology's nearest port(s)" : "");
}

/* Whether CFX_NET lets the loaded @p plugin carry traffic between hosts
 * (NCCL_NET's rule: the network whose name it is, without case; unset:
 * any). A name that neither Conflux's networks (IB, Socket) nor the plugin
 * has is cfxInvalidUsage with a sentence, as NCCL's "network not found". */
static cfxResult_t plugin_chosen(const struct cfx_net_plugin *plugin, int rank, int *chosen_p)
{
    enum cfx_net_choice choice = cfx_transport_net_choice();
    const char *name = cfx_transport_net_name();
    *chosen_p = plugin != NULL && (choice == CFX_NET_ANY || strcasecmp(name, plugin->name) == 0);
    if (choice == CFX_NET_NAMED && !*chosen_p)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_NET | CFX_LOG_INIT,
                             "CFX_NET=%s names no network of rank %d: Conflux's own are IB and "
                             "Socket%s%s%s",
                             name, rank, plugin ? ", and the net plugin loaded is named \"" : "",
                             plugin ? plugin->name : " (no net plugin is loaded: CFX_NET_PLUGIN)",
                             plugin ? "\"" : "");
    if (plugin != NULL && !*chosen_p)
        CFX_INFO(CFX_LOG_NET | CFX_LOG_INIT,
                 "net-plugin: %s (\"%s\") not used by rank %d: CFX_NET=%s names another network",
                 plugin->path, plugin->name, rank, name);
    return cfxSuccess;
}

/* Per-communicator state. With CFX_NET_PLUGIN unset the transport accepts
 * no pair; set, the plugin must load and have a device, or init fails
 * (someone who asks for a plugin gets an error, not another network), and
 * it carries traffic between hosts if CFX_NET is unset or names it. */
static cfxResult_t net_init(const struct cfx_transport_env *env, void **ctx_p)
{
    const struct cfx_net_plugin *plugin = NULL;
    cfxResult_t res = cfx_net_plugin_get(&plugin);
    if (res != cfxSuccess)
        return res; /* The sentence names the plugin and what failed. */
    int chosen = 0;
    res = plugin_chosen(plugin, env->rank, &chosen);
    if (res != cfxSuccess)
        return res;
    if (!chosen)
        plugin = NULL;
    struct cfx_net_ctx *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_NET, "net-plugin: out of memory");
    ctx->rank = env->rank;
    ctx->gdr_level = cfx_transport_gdr_level();
    ctx->plugin = plugin;
    ctx->abort_flag = env->abort_flag;
    ctx->connect_timeout_s = env->connect_timeout_s;
    ctx->connect_check = env->connect_check;
    ctx->connect_check_arg = env->connect_check_arg;
    pthread_mutex_init(&ctx->reg_lock, NULL);
    if (plugin != NULL) {
        pick_devs(ctx, plugin, env);
        res = cfx_proxy_get(0, &ctx->proxy);
        if (res != cfxSuccess) {
            net_fini(ctx);
            return res;
        }
    }
    *ctx_p = ctx;
    return cfxSuccess;
}

/* Releases what init made; accepts NULL. Connectors are closed first. */
static void net_fini(void *ctx_v)
{
    struct cfx_net_ctx *ctx = ctx_v;
    if (ctx == NULL)
        return;
    cfx_proxy_put(ctx->proxy);
    pthread_mutex_destroy(&ctx->reg_lock);
    free(ctx);
}

/* ============================================================ pending accepts */

/* Receive connectors set up but not accepted yet, every communicator's of
 * this process. A plugin's connect may wait for the receiver's accept
 * (NCCL's verbs net does, and Conflux's own: transports/ib/net.c), and the
 * core connects every send side before any receive side (and a thread may
 * connect several communicators' ranks in one batch), so whoever waits on
 * a connect or an accept accepts for all of them; the connector's own
 * connect later finds its comm there. Accept calls on one listener are
 * never concurrent: they run under pending_lock. */
static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cfx_net_conn *pending_head;

static void pending_add(struct cfx_net_conn *nc)
{
    pthread_mutex_lock(&pending_lock);
    nc->pending_next = pending_head;
    pending_head = nc;
    nc->pending = 1;
    pthread_mutex_unlock(&pending_lock);
}

static void pending_unlink_locked(struct cfx_net_conn *nc)
{
    for (struct cfx_net_conn **at = &pending_head; *at != NULL; at = &(*at)->pending_next)
        if (*at == nc) {
            *at = nc->pending_next;
            break;
        }
    nc->pending = 0;
}

static void pending_remove(struct cfx_net_conn *nc)
{
    pthread_mutex_lock(&pending_lock);
    if (nc->pending)
        pending_unlink_locked(nc);
    pthread_mutex_unlock(&pending_lock);
}

/* One accept for each pending receiver; a receiver that got its comm or a
 * failure (kept in accept_res for its own connect to report) leaves the
 * list. Returns 1 when @p mine (NULL: none) is no longer pending. */
static int pending_accept_all(struct cfx_net_conn *mine)
{
    pthread_mutex_lock(&pending_lock);
    for (struct cfx_net_conn *nc = pending_head, *next; nc != NULL; nc = next) {
        next = nc->pending_next;
        ncclResult_t res = cfx_net_plugin_accept(nc->plugin, nc->listen_comm, &nc->comm);
        if (res != ncclSuccess || nc->comm != NULL) {
            nc->accept_res = res;
            pending_unlink_locked(nc);
        }
    }
    int done = mine != NULL && !mine->pending;
    pthread_mutex_unlock(&pending_lock);
    return done;
}

/* ============================================================ registrations */

/* Registers @p reg with the comm of connection @p nc, in registration
 * slot @p slot (reg_lock held). */
static cfxResult_t reg_on(struct cfx_net_reg *reg, struct cfx_net_conn *nc, int slot)
{
    ncclResult_t res = cfx_net_plugin_reg_mr(nc->plugin, nc->comm, reg->buf, reg->bytes,
                                             NCCL_PTR_HOST, &reg->mhandle[slot]);
    if (res == ncclSuccess)
        return cfxSuccess;
    reg->mhandle[slot] = NULL;
    return cfx_error_set(cfxSystemError, CFX_LOG_NET,
                         "net-plugin: rank %d cannot register the %zu-byte user buffer at %p for "
                         "rank %d with plugin %s: regMr returned %s",
                         nc->self_rank, reg->bytes, (void *)reg->buf, nc->peer_rank,
                         nc->plugin->name, cfx_net_result_name(res));
}

/* Deregisters @p reg from every connection it is on (reg_lock held). */
static void reg_off_all(struct cfx_net_ctx *ctx, struct cfx_net_reg *reg)
{
    for (int slot = 0; slot < NET_REG_MAX_CONNS; slot++)
        if (reg->mhandle[slot] != NULL) {
            struct cfx_net_conn *nc = ctx->joined[slot];
            cfx_net_plugin_dereg_mr(nc->plugin, nc->comm, reg->mhandle[slot]);
            reg->mhandle[slot] = NULL;
        }
}

/* A connection that connected (a send connection, or a host rank's
 * receive connection) takes a registration slot, and every registered
 * buffer is registered with its comm there. Without a free slot (more than
 * NET_REG_MAX_CONNS connections) it has none: its sends and receives go
 * through its slots. */
static cfxResult_t conn_join(struct cfx_net_ctx *ctx, struct cfx_net_conn *nc)
{
    cfxResult_t res = cfxSuccess;
    pthread_mutex_lock(&ctx->reg_lock);
    for (int slot = 0; slot < NET_REG_MAX_CONNS && nc->reg_slot < 0; slot++)
        if (ctx->joined[slot] == NULL) {
            ctx->joined[slot] = nc;
            nc->reg_slot = slot;
        }
    for (struct cfx_net_reg *reg = ctx->regs; reg != NULL && res == cfxSuccess && nc->reg_slot >= 0;
         reg = reg->next)
        res = reg_on(reg, nc, nc->reg_slot);
    pthread_mutex_unlock(&ctx->reg_lock);
    return res;
}

/* Before a connection's comm closes: its registrations and its
 * registration slot go. */
static void conn_leave(struct cfx_net_ctx *ctx, struct cfx_net_conn *nc)
{
    int slot = nc->reg_slot;
    if (slot < 0)
        return;
    pthread_mutex_lock(&ctx->reg_lock);
    for (struct cfx_net_reg *reg = ctx->regs; reg != NULL; reg = reg->next)
        if (reg->mhandle[slot] != NULL) {
            cfx_net_plugin_dereg_mr(nc->plugin, nc->comm, reg->mhandle[slot]);
            reg->mhandle[slot] = NULL;
        }
    ctx->joined[slot] = NULL;
    nc->reg_slot = -1;
    pthread_mutex_unlock(&ctx->reg_lock);
}

/* A user buffer, so that sends from it and receives into it go zero copy:
 * the plugin sends the payload from it (post_ref) and receives it there
 * (offer) instead of in a slot. Host memory only (a GPU rank's device
 * buffers go through its kernel and slots). */
static cfxResult_t net_reg_mem(void *ctx_v, void *buf, size_t bytes, enum cfx_mem_kind mem,
                               int device, void **handle_p)
{
    struct cfx_net_ctx *ctx = ctx_v;
    *handle_p = NULL;
    if (ctx->plugin == NULL)
        return cfxSuccess; /* No plugin: nothing will read it. */
    if (mem == CFX_MEM_DEVICE)
        return cfx_error_set(
            cfxInvalidUsage, CFX_LOG_NET,
            "net-plugin: cannot register %zu bytes of device %d's memory for "
            "zero-copy sends and receives (a GPU rank's data goes through its slots)",
            bytes, device);
    struct cfx_net_reg *reg = calloc(1, sizeof(*reg));
    if (reg == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_NET, "net-plugin: out of memory");
    reg->buf = buf;
    reg->bytes = bytes;
    cfxResult_t res = cfxSuccess;
    pthread_mutex_lock(&ctx->reg_lock);
    for (int slot = 0; slot < NET_REG_MAX_CONNS && res == cfxSuccess; slot++)
        if (ctx->joined[slot] != NULL)
            res = reg_on(reg, ctx->joined[slot], slot);
    if (res == cfxSuccess) {
        reg->next = ctx->regs;
        ctx->regs = reg;
        atomic_fetch_add_explicit(&ctx->n_regs, 1, memory_order_release);
    } else {
        reg_off_all(ctx, reg);
    }
    pthread_mutex_unlock(&ctx->reg_lock);
    if (res != cfxSuccess) {
        free(reg);
        return res;
    }
    *handle_p = reg;
    return cfxSuccess;
}

static void net_dereg_mem(void *ctx_v, void *handle)
{
    struct cfx_net_ctx *ctx = ctx_v;
    struct cfx_net_reg *reg = handle;
    if (reg == NULL)
        return;
    pthread_mutex_lock(&ctx->reg_lock);
    for (struct cfx_net_reg **at = &ctx->regs; *at != NULL; at = &(*at)->next)
        if (*at == reg) {
            *at = reg->next;
            atomic_fetch_sub_explicit(&ctx->n_regs, 1, memory_order_release);
            break;
        }
    reg_off_all(ctx, reg);
    pthread_mutex_unlock(&ctx->reg_lock);
    free(reg);
}

/* The next slot's payload is the @p bytes at @p data, inside @p handle's
 * buffer: the payload's isend goes from there (the slot is released once
 * it tested done, so the core's drain gives the buffer back after). Never
 * blocks, allocates or registers: the buffer is registered with this
 * connection's comm already (at reg_mem or at connect). */
static cfxResult_t net_post_ref(void *ctx_v, struct cfx_connector *conn, const void *data,
                                size_t bytes, void *handle)
{
    (void)ctx_v;
    struct cfx_net_conn *nc = conn->priv;
    const struct cfx_net_reg *reg = handle;
    void *mhandle = reg != NULL && nc->reg_slot >= 0 ? reg->mhandle[nc->reg_slot] : NULL;
    if (mhandle == NULL || bytes <= CFX_SLOT_INLINE_BYTES || bytes > nc->slot_bytes ||
        (const char *)data < reg->buf || (const char *)data + bytes > reg->buf + reg->bytes)
        return cfx_error_set(cfxInternalError, CFX_LOG_NET,
                             "net-plugin: rank %d cannot send %zu bytes at %p to rank %d from a "
                             "registration that does not hold them (or too small or large for "
                             "a slot, or not on this connection)",
                             nc->self_rank, bytes, data, nc->peer_rank);
    size_t index = (size_t)(cfx_load_relaxed_u64(&nc->fifo->tail) % (uint64_t)nc->n_steps);
    nc->ref_mhandle[index] = mhandle;
    nc->ref_data[index] = data;
    return cfxSuccess;
}

/* The next slot is message @p msg's bytes at @p offset: its header says
 * so, for the receiver's offer. */
static void net_post_at(void *ctx_v, struct cfx_connector *conn, uint64_t msg, uint64_t offset)
{
    (void)ctx_v;
    struct cfx_net_conn *nc = conn->priv;
    size_t index = (size_t)(cfx_load_relaxed_u64(&nc->fifo->tail) % (uint64_t)nc->n_steps);
    nc->at_mark[index] = msg + 1;
    nc->at_offset[index] = offset;
}

/* Message @p msg may land in the @p bytes at @p data, inside @p handle's
 * buffer: while the offer is live (until all @p bytes of the message
 * arrived, in place or not), each slot's payload receive waits for its
 * header and goes there when the header names @p msg. Best effort, point
 * to point only: nothing for a GPU rank's connector, a buffer not
 * registered with this comm, a collective, or when the offer ring's entry
 * for @p msg is still taken (slots come through the FIFO then). Never
 * blocks, allocates or registers. */
static cfxResult_t net_offer(void *ctx_v, struct cfx_connector *conn, uint64_t msg, void *data,
                             size_t bytes, void *handle)
{
    (void)ctx_v;
    struct cfx_net_conn *nc = conn->priv;
    const struct cfx_net_reg *reg = handle;
    void *mhandle = reg != NULL && nc->reg_slot >= 0 ? reg->mhandle[nc->reg_slot] : NULL;
    /* A collective's key (its top bit) is not taken: only some of its
     * output comes from this peer, so no count would say the offer is over
     * (its slots come through the FIFO). */
    if (mhandle == NULL || bytes == 0 || (msg >> 63) != 0 || (const char *)data < reg->buf ||
        (const char *)data + bytes > reg->buf + reg->bytes)
        return cfxSuccess;
    struct cfx_net_offer *o = &nc->offers[msg % NET_OFFERS];
    if (atomic_load_explicit(&o->mark, memory_order_acquire) != 0)
        return cfxSuccess; /* An older receive's offer is still live. */
    o->data = data;
    o->bytes = bytes;
    o->left = bytes;
    o->mhandle = mhandle;
    atomic_fetch_add_explicit(&nc->offers_live, 1, memory_order_release);
    atomic_store_explicit(&o->mark, msg + 1, memory_order_release);
    return cfxSuccess;
}

/* ============================================================ connection */

/* Ranks on different hosts, when a plugin is loaded. Pure. */
static int net_can_connect(void *ctx_v, const struct cfx_transport_peer *self,
                           const struct cfx_transport_peer *peer)
{
    const struct cfx_net_ctx *ctx = ctx_v;
    (void)self;
    return ctx->plugin != NULL && peer->path == CFX_PATH_CLASS_NET;
}

static const char *dir_arrow(enum cfx_conn_dir dir)
{
    return dir == CFX_CONN_SEND ? "->" : "<-";
}

/* Whether the slots of @p nc in device @p device's memory can go to the
 * plugin as a dma-buf: its device takes them (NCCL_PTR_DMABUF,
 * regMrDmaBuf), CFX_DMABUF_ENABLE allows it and the driver can export the
 * memory; else 0 with *@p why_p saying why not. */
static int dmabuf_usable(const struct cfx_net_conn *nc, int device, const char **why_p)
{
    *why_p = NULL;
    if (!(nc->plugin->ptr_support[nc->dev] & NCCL_PTR_DMABUF) || !nc->plugin->has_dmabuf)
        *why_p = "the plugin's device takes no dma-buf";
    else if (!cfx_transport_dmabuf_enable())
        *why_p = "CFX_DMABUF_ENABLE=0";
    else
        cfx_cuda_dmabuf_supported(device, why_p);
    return *why_p == NULL;
}

/* Whether a GPU rank's slots go in device memory, moved by the plugin
 * (GPUDirect RDMA): its device moves CUDA memory, the NIC is near enough
 * (CFX_NET_GDR_LEVEL, as for verbs), and, on the receiving side, the NIC's
 * writes can be flushed: by the driver (cuFlushGPUDirectRDMAWrites), else
 * by the plugin's iflush (*iflush_p set). 0 with the reason in @p why. */
static int gdr_wanted(const struct cfx_net_ctx *ctx, const struct cfx_net_conn *nc, int device,
                      int *iflush_p, char *why, size_t len)
{
    const char *no_flush = NULL;
    int driver_flush = nc->dir == CFX_CONN_SEND || cfx_cuda_rdma_flush_supported(device, &no_flush);
    *iflush_p = 0;
    /* Device memory: by pointer (NCCL_PTR_CUDA: nvidia-peermem under a
     * verbs plugin), or as a dma-buf the driver can export (NCCL's rule). */
    int ptr = ctx->plugin->ptr_support[nc->dev];
    const char *no_dmabuf = NULL;
    int by_dmabuf = dmabuf_usable(nc, device, &no_dmabuf);
    if (!(ptr & NCCL_PTR_CUDA) && !(ptr & NCCL_PTR_DMABUF))
        snprintf(why, len, "its device %d moves host memory only", nc->dev);
    else if (!(ptr & NCCL_PTR_CUDA) && !by_dmabuf)
        snprintf(why, len, "its device %d takes device memory as dma-bufs only, and %s", nc->dev,
                 no_dmabuf);
    else if (ctx->gdr_level < 0)
        snprintf(why, len, "CFX_NET_GDR_LEVEL=LOC");
    else if (ctx->nic_path < 0 && ctx->gdr_level < CFX_PATH_CLASS_SYS)
        snprintf(why, len,
                 "the topology does not say how far the NIC is from the GPU "
                 "(CFX_NET_GDR_LEVEL=SYS uses it anyway)");
    else if (ctx->gdr_level < CFX_PATH_CLASS_SYS && ctx->nic_path > ctx->gdr_level)
        snprintf(why, len, "the NIC is farther from the GPU than CFX_NET_GDR_LEVEL allows");
    else if (!driver_flush && !ctx->plugin->has_iflush)
        snprintf(why, len,
                 "the driver cannot flush GPUDirect RDMA writes (%s), nor the plugin "
                 "(no iflush)",
                 no_flush ? no_flush : "unknown");
    else {
        *iflush_p = !driver_flush;
        return 1;
    }
    return 0;
}

/* A GPU rank's slots in device memory, registered with the plugin once
 * connected: as a dma-buf where the plugin's device takes one
 * (NCCL_PTR_DMABUF, regMrDmaBuf), CFX_DMABUF_ENABLE allows it and the
 * driver can export the memory (NCCL's order); else with regMr of CUDA
 * memory, which needs the NIC's peer-memory driver (nvidia-peermem). */
static cfxResult_t register_device_slots(struct cfx_net_ctx *ctx, struct cfx_net_conn *nc)
{
    size_t slots_bytes = ((size_t)nc->n_steps * nc->slot_bytes + 4095) & ~(size_t)4095;
    int device = nc->gdr - 1;
    const char *no_dmabuf = NULL;
    dmabuf_usable(nc, device, &no_dmabuf); /* Else NCCL_PTR_CUDA: gdr_wanted checked. */
    ncclResult_t res;
    if (no_dmabuf == NULL) {
        int fd = -1;
        CFX_CHECK(cfx_cuda_dmabuf_fd(nc->slots, slots_bytes, device, &fd));
        res = cfx_net_plugin_reg_mr_dmabuf(nc->plugin, nc->comm, nc->slots, slots_bytes, fd,
                                           &nc->slots_mhandle);
        close(fd); /* The registration holds the dma-buf. */
        nc->gdr_dmabuf = res == ncclSuccess;
    } else {
        res = cfx_net_plugin_reg_mr(nc->plugin, nc->comm, nc->slots, slots_bytes, NCCL_PTR_CUDA,
                                    &nc->slots_mhandle);
    }
    if (res != ncclSuccess) {
        nc->slots_mhandle = NULL;
        return cfx_error_set(cfxSystemError, CFX_LOG_NET,
                             "net-plugin: rank %d cannot register %zu bytes of device %d's "
                             "memory for rank %d with plugin %s: %s returned %s "
                             "(CFX_NET_GDR_LEVEL=LOC stages through host memory)",
                             ctx->rank, slots_bytes, device, nc->peer_rank, nc->plugin->name,
                             no_dmabuf == NULL ? "regMrDmaBuf" : "regMr (NCCL_PTR_CUDA)",
                             cfx_net_result_name(res));
    }
    if (no_dmabuf != NULL)
        CFX_INFO(CFX_LOG_NET,
                 "net-plugin: rank %d %s rank %d: device %d's slots registered with regMr, "
                 "not as a dma-buf: %s",
                 ctx->rank, dir_arrow(nc->dir), nc->peer_rank, device, no_dmabuf);
    return cfxSuccess;
}

/* Allocates and touches this side's block; a receiver listens. Writes a
 * struct cfx_net_info. Does not block on the peer. */
static cfxResult_t net_setup(void *ctx_v, const struct cfx_transport_peer *peer, size_t slot_bytes,
                             int n_steps, struct cfx_connector *conn, void *info_out)
{
    struct cfx_net_ctx *ctx = ctx_v;
    assert(ctx->plugin != NULL && n_steps >= 1 && n_steps <= CFX_MAX_STEPS && slot_bytes > 0);
    if (conn->place.mem == CFX_MEM_DEVICE)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_NET,
                             "net-plugin: cannot place a FIFO in device memory (a GPU rank's "
                             "FIFO is pinned host memory; only its slots may be device memory)");
    if (conn->place.reader == CFX_READER_KERNEL && conn->place.mem != CFX_MEM_HOST_PINNED)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_NET,
                             "net-plugin: a FIFO a kernel reads must be pinned host memory "
                             "(connection with rank %d)",
                             peer->rank);
    if (slot_bytes > INT_MAX)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_NET,
                             "net-plugin: %zu-byte slots are larger than a plugin message may be",
                             slot_bytes);
    size_t slots_off = cfx_fifo_slots_offset();
    if (slot_bytes > (SIZE_MAX / 2 - slots_off) / (size_t)n_steps)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_NET,
                             "net-plugin: %d slots of %zu bytes do not fit in memory", n_steps,
                             slot_bytes);
    struct cfx_net_conn *nc = NULL;
    if (posix_memalign((void **)&nc, CFX_CACHE_LINE, sizeof(*nc)) != 0)
        return cfx_error_set(cfxSystemError, CFX_LOG_NET, "net-plugin: out of memory");
    memset(nc, 0, sizeof(*nc));
    conn->priv = nc;
    nc->ctx = ctx;
    nc->plugin = ctx->plugin;
    nc->dir = conn->dir;
    nc->self_rank = ctx->rank;
    nc->peer_rank = peer->rank;
    nc->blame_rank = -1;
    nc->reg_slot = -1;
    nc->n_steps = n_steps;
    nc->slot_bytes = slot_bytes;
    nc->channel = conn->channel;
    nc->dev = ctx->devs[conn->channel % ctx->n_devs];
    /* A GPU rank: its kernel fills and drains the slots in place; the proxy
     * moves them through the plugin, from and into pinned host memory, or
     * (GPUDirect RDMA) the plugin moves them in device memory, and the
     * block holds no slots. */
    char why[200] = "";
    int iflush = 0;
    int gdr = conn->place.reader == CFX_READER_KERNEL &&
              gdr_wanted(ctx, nc, conn->place.device, &iflush, why, sizeof(why));
    size_t slots_bytes = ((size_t)n_steps * slot_bytes + 4095) & ~(size_t)4095;
    /* Headers: one per slot, and the poison's. */
    size_t staging_off =
        (slots_off + (gdr ? 0 : (size_t)n_steps * slot_bytes) + 4095) & ~(size_t)4095;
    size_t bytes = staging_off +
                   (((size_t)(n_steps + 1) * sizeof(struct cfx_net_header) + 4095) & ~(size_t)4095);
    if (posix_memalign(&nc->mem, 4096, bytes) != 0) {
        nc->mem = NULL;
        return cfx_error_set(cfxSystemError, CFX_LOG_NET,
                             "net-plugin: out of memory for a %zu-byte FIFO to rank %d", bytes,
                             peer->rank);
    }
    memset(nc->mem, 0, bytes); /* Touch every page now, never on the data path. */
    nc->mem_bytes = bytes;
    nc->fifo = nc->mem;
    nc->slots = (char *)nc->mem + slots_off;
    nc->staging = (struct cfx_net_header *)((char *)nc->mem + staging_off);
    if (conn->place.reader == CFX_READER_KERNEL) {
        CFX_CHECK(cfx_cuda_host_register(nc->mem, bytes, conn->place.device));
        nc->pinned = conn->place.device + 1;
        if (gdr) {
            CFX_CHECK(cfx_cuda_select(conn->place.device));
            CFX_CHECK(cfx_cuda_mem_alloc(&nc->dev_raw, slots_bytes + 4096));
            nc->gdr = conn->place.device + 1;
            nc->gdr_iflush = iflush;
            nc->slots = (char *)(((uintptr_t)nc->dev_raw + 4095) & ~(uintptr_t)4095);
        } else {
            CFX_INFO(CFX_LOG_NET,
                     "net-plugin: rank %d %s rank %d: slots in pinned host memory, not device "
                     "%d's (no GPUDirect RDMA through plugin %s: %s)",
                     ctx->rank, dir_arrow(conn->dir), peer->rank, conn->place.device,
                     ctx->plugin->name, why);
        }
    }

    struct cfx_net_info info = {.magic = NET_INFO_MAGIC,
                                .rank = ctx->rank,
                                .dir = (uint32_t)conn->dir,
                                .n_steps = (uint32_t)n_steps,
                                .slot_bytes = slot_bytes};
    if (nc->dir == CFX_CONN_RECV) {
        ncclResult_t res = cfx_net_plugin_listen(nc->plugin, nc->dev, nc->handle, &nc->listen_comm);
        if (res != ncclSuccess || nc->listen_comm == NULL)
            return cfx_error_set(cfxSystemError, CFX_LOG_NET,
                                 "net-plugin: rank %d cannot listen for rank %d on %s device %d "
                                 "(%s): listen returned %s",
                                 ctx->rank, peer->rank, nc->plugin->name, nc->dev,
                                 nc->plugin->dev_name[nc->dev], cfx_net_result_name(res));
        memcpy(info.handle, nc->handle, sizeof(info.handle));
        pending_add(nc);
    }
    memcpy(info_out, &info, sizeof(info));
    cfx_connector_set_fifo(conn, nc->fifo, nc->slots, slot_bytes, n_steps);
    conn->peer_rank = peer->rank;
    if (nc->gdr) /* Host buffers of this GPU rank reach device slots through copies. */
        CFX_CHECK(cfx_connector_stage_init(conn, nc->gdr - 1));
    return cfxSuccess;
}

static void nap(void)
{
    struct timespec ts = {0, CONNECT_NAP_NS};
    nanosleep(&ts, NULL);
}

/* The plugin's connect (sender) or accept (receiver) until the comm
 * exists: both are non-blocking, the comm stays NULL until it is ready.
 * Bounded by the connect timeout, the abort flag and the core's verdict on
 * the peer. */
static cfxResult_t comm_establish(struct cfx_net_ctx *ctx, struct cfx_net_conn *nc)
{
    int send = nc->dir == CFX_CONN_SEND;
    int64_t deadline = cfx_time_deadline_s(ctx->connect_timeout_s);
    int64_t next_check = cfx_time_now_ns() + CONNECT_CHECK_NS;
    for (;;) {
        ncclResult_t res = ncclSuccess;
        if (send) {
            res = cfx_net_plugin_connect(nc->plugin, nc->dev, nc->handle, &nc->comm);
            pending_accept_all(NULL); /* The peer's connect may wait for ours. */
        } else if (pending_accept_all(nc)) {
            res = nc->accept_res;
        }
        if (res != ncclSuccess)
            return cfx_error_set(cfxRemoteError, CFX_LOG_NET,
                                 "net-plugin: rank %d cannot %s rank %d through plugin %s: %s "
                                 "returned %s",
                                 ctx->rank, send ? "connect to" : "accept the connection of",
                                 nc->peer_rank, nc->plugin->name, send ? "connect" : "accept",
                                 cfx_net_result_name(res));
        if (send ? nc->comm != NULL : !__atomic_load_n(&nc->pending, __ATOMIC_ACQUIRE))
            return cfxSuccess;
        if (ctx->abort_flag && __atomic_load_n(ctx->abort_flag, __ATOMIC_ACQUIRE))
            return cfx_error_set(cfxRemoteError, CFX_LOG_NET,
                                 "net-plugin: rank %d aborted while connecting with rank %d",
                                 ctx->rank, nc->peer_rank);
        int64_t now = cfx_time_now_ns();
        if (now >= deadline)
            return cfx_error_set(cfxTimeout, CFX_LOG_NET,
                                 "net-plugin: rank %d %s rank %d within %lld s through plugin %s "
                                 "(device %s); check that rank %d is running and reachable",
                                 ctx->rank,
                                 send ? "could not connect to" : "saw no connection from",
                                 nc->peer_rank, (long long)ctx->connect_timeout_s, nc->plugin->name,
                                 nc->plugin->dev_name[nc->dev], nc->peer_rank);
        if (now >= next_check && ctx->connect_check) {
            next_check = now + CONNECT_CHECK_NS;
            cfxResult_t verdict = ctx->connect_check(ctx->connect_check_arg, nc->peer_rank);
            if (verdict != cfxSuccess)
                return verdict;
        }
        nap();
    }
}

/* The proxy's pass over one connector. */
static int conn_proxy_progress(void *arg)
{
    return cfx_net_conn_drive(arg);
}

/* Connects the comm (blocking, bounded), registers the block once and
 * hands the connector to the proxy. */
static cfxResult_t net_connect(void *ctx_v, struct cfx_connector *conn, const void *peer_info)
{
    struct cfx_net_ctx *ctx = ctx_v;
    struct cfx_net_conn *nc = conn->priv;
    struct cfx_net_info peer;
    memcpy(&peer, peer_info, sizeof(peer));
    enum cfx_conn_dir want = nc->dir == CFX_CONN_SEND ? CFX_CONN_RECV : CFX_CONN_SEND;
    if (peer.magic != NET_INFO_MAGIC || peer.rank != nc->peer_rank || peer.dir != (uint32_t)want ||
        peer.n_steps != (uint32_t)nc->n_steps || peer.slot_bytes != nc->slot_bytes)
        return cfx_error_set(cfxInternalError, CFX_LOG_NET,
                             "net-plugin: rank %d sent connect info that does not match this "
                             "connection (another build, or a crossed connection)",
                             nc->peer_rank);
    if (nc->dir == CFX_CONN_SEND)
        memcpy(nc->handle, peer.handle, sizeof(nc->handle)); /* The plugin may write into it. */
    CFX_CHECK(comm_establish(ctx, nc));
    if (nc->listen_comm != NULL) { /* One connection per listener: done with it. */
        cfx_net_plugin_close_listen(nc->plugin, nc->listen_comm);
        nc->listen_comm = NULL;
    }
    ncclResult_t res = cfx_net_plugin_reg_mr(nc->plugin, nc->comm, nc->mem, nc->mem_bytes,
                                             NCCL_PTR_HOST, &nc->mhandle);
    if (res != ncclSuccess)
        return cfx_error_set(cfxSystemError, CFX_LOG_NET,
                             "net-plugin: rank %d cannot register %zu bytes for rank %d with "
                             "plugin %s: regMr returned %s",
                             ctx->rank, nc->mem_bytes, nc->peer_rank, nc->plugin->name,
                             cfx_net_result_name(res));
    nc->slots_mhandle = nc->mhandle;
    if (nc->gdr)
        CFX_CHECK(register_device_slots(ctx, nc));
    /* Before the proxy may pass over it: reg_slot is read there. */
    if (nc->dir == CFX_CONN_SEND || (!nc->pinned && !nc->gdr)) /* A host rank's receives. */
        CFX_CHECK(conn_join(ctx, nc));
    nc->client.progress = conn_proxy_progress;
    nc->client.ready = NULL;
    nc->client.arg = nc;
    nc->moved_ns = cfx_time_now_ns();
    atomic_store_explicit(&nc->client.poll_ns, nc->pinned ? CFX_PROXY_KERNEL_FAST_NS : 0,
                          memory_order_relaxed);
    CFX_CHECK(cfx_proxy_add(ctx->proxy, &nc->client, NULL, 0, 0));
    nc->registered = 1;
    /* What the driver says the slots are, not what was meant. */
    int slots_device = -1;
    int in_device = nc->pinned && cfx_cuda_is_device_ptr(nc->slots, &slots_device);
    CFX_INFO(CFX_LOG_NET,
             "net-plugin: rank %d %s rank %d connected (plugin %s, device %d: %s, channel %d)%s",
             ctx->rank, dir_arrow(nc->dir), nc->peer_rank, nc->plugin->name, nc->dev,
             nc->plugin->dev_name[nc->dev], nc->channel,
             in_device && nc->gdr_dmabuf
                 ? ", a GPU rank's slots in device memory (GPUDirect RDMA, dma-buf)"
             : in_device  ? ", a GPU rank's slots in device memory (GPUDirect RDMA)"
             : nc->pinned ? ", a GPU rank's slots in pinned host memory"
                          : "");
    return cfxSuccess;
}

/* Before the comm goes: a sender's posted slots (or its poison line) get
 * sent, at most NET_LINGER_NS, and not at all once the connector failed. */
static void linger(struct cfx_net_conn *nc)
{
    if (nc->dir != CFX_CONN_SEND)
        return;
    int64_t deadline = cfx_time_now_ns() + NET_LINGER_NS;
    for (;;) {
        if (atomic_load_explicit(&nc->failed, memory_order_acquire))
            return;
        int done =
            atomic_load_explicit(&nc->poison_reason, memory_order_acquire)
                ? atomic_load_explicit(&nc->poison_done, memory_order_acquire)
                : cfx_load_acquire_u64(&nc->fifo->head) == cfx_load_acquire_u64(&nc->fifo->tail);
        if (done)
            return;
        if (cfx_time_now_ns() > deadline)
            return;
        if (!cfx_net_conn_drive(nc))
            sched_yield();
    }
}

/* Takes the connector from the proxy, then closes the plugin's comms,
 * deregisters and frees. Half-built connectors too. Outstanding requests
 * are left to the plugin's close (NCCL callers do the same at teardown). */
static void net_close(void *ctx_v, struct cfx_connector *conn)
{
    struct cfx_net_ctx *ctx = ctx_v;
    struct cfx_net_conn *nc = conn->priv;
    if (nc == NULL)
        return;
    if (nc->registered) {
        linger(nc);
        cfx_proxy_remove(ctx->proxy, &nc->client);
        nc->registered = 0;
    }
    const struct cfx_net_plugin *p = nc->plugin;
    conn_leave(ctx, nc);
    if (nc->ref_sent > 0)
        CFX_INFO(CFX_LOG_NET,
                 "net-plugin: rank %d -> rank %d sent %llu payload(s) from registered user buffers",
                 nc->self_rank, nc->peer_rank, (unsigned long long)nc->ref_sent);
    if (nc->in_place > 0)
        CFX_INFO(CFX_LOG_NET,
                 "net-plugin: rank %d <- rank %d received %llu payload(s) into registered user "
                 "buffers",
                 nc->self_rank, nc->peer_rank, (unsigned long long)nc->in_place);
    if (nc->gdr && nc->gdr_flushes > 0)
        CFX_INFO(CFX_LOG_NET,
                 "net-plugin: rank %d <- rank %d flushed the plugin's writes into device %d's "
                 "memory %llu time(s), %s",
                 nc->self_rank, nc->peer_rank, nc->gdr - 1, (unsigned long long)nc->gdr_flushes,
                 nc->gdr_iflush ? "with the plugin's iflush" : "with cuFlushGPUDirectRDMAWrites");
    if (nc->slots_mhandle != NULL && nc->slots_mhandle != nc->mhandle)
        cfx_net_plugin_dereg_mr(p, nc->comm, nc->slots_mhandle);
    if (nc->mhandle != NULL)
        cfx_net_plugin_dereg_mr(p, nc->comm, nc->mhandle);
    if (nc->comm != NULL) {
        if (nc->dir == CFX_CONN_SEND)
            cfx_net_plugin_close_send(p, nc->comm);
        else
            cfx_net_plugin_close_recv(p, nc->comm);
    }
    pending_remove(nc);
    if (nc->listen_comm != NULL)
        cfx_net_plugin_close_listen(p, nc->listen_comm);
    if (nc->pinned)
        cfx_cuda_host_unregister(nc->mem, nc->pinned - 1);
    cfx_connector_stage_fini(conn);
    if (nc->dev_raw != NULL && cfx_cuda_select(nc->gdr - 1) == cfxSuccess)
        cfx_cuda_mem_free(nc->dev_raw);
    free(nc->mem);
    free(nc);
    cfx_connector_forget(conn);
}

/* ============================================================ data path */

static int net_progress(void *ctx_v, struct cfx_connector *conn)
{
    (void)ctx_v;
    struct cfx_net_conn *nc = conn->priv;
    if (nc == NULL || !nc->registered)
        return 0;
    return cfx_net_conn_drive(nc);
}

/* After a post or release: send the slot or post the receive from this thread. */
static void net_kick(void *ctx_v, struct cfx_connector *conn)
{
    net_progress(ctx_v, conn);
}

/* Stop issuing on this connector; a sender's next pass sends the poison
 * line after what it already sent. A receiver cannot tell its peer (a comm
 * goes one way): that peer learns when this side closes its comm, or by
 * its own timeout. */
static void net_poison(void *ctx_v, struct cfx_connector *conn, cfxResult_t reason, int blame_rank)
{
    (void)ctx_v;
    struct cfx_net_conn *nc = conn->priv;
    if (nc == NULL || reason == cfxSuccess)
        return;
    atomic_store_explicit(&nc->poison_blame, blame_rank, memory_order_relaxed);
    atomic_store_explicit(&nc->poison_reason, (int)reason, memory_order_release);
    if (nc->registered)
        cfx_net_conn_drive(nc);
}

static cfxResult_t net_check(void *ctx_v, struct cfx_connector *conn)
{
    (void)ctx_v;
    struct cfx_net_conn *nc = conn->priv;
    assert(nc != NULL);
    return cfx_net_conn_check(nc, conn);
}

const struct cfx_transport cfx_net_plugin_transport = {
    .version = CFX_TRANSPORT_VERSION,
    .name = "net-plugin",
    /* Kicks after host posts; FIFOs a kernel can use (pinned, polled). */
    .flags = CFX_TRANSPORT_FLAG_PROGRESS | CFX_TRANSPORT_FLAG_CONNECT_ACK |
             CFX_TRANSPORT_FLAG_READER_KERNEL,
    /* lifecycle */
    .init = net_init,
    .fini = net_fini,
    /* connection */
    .can_connect = net_can_connect,
    .setup = net_setup,
    .connect = net_connect,
    .close = net_close,
    /* data path */
    .kick = net_kick,
    .poison = net_poison,
    .check = net_check,
    .progress = net_progress,
    .wait = NULL,
    .read_peer = NULL,
    /* memory: user buffers for zero-copy sends and receives (host memory) */
    .reg_mem = net_reg_mem,
    .dereg_mem = net_dereg_mem,
    .flush = NULL,
    .map_peer = NULL,
    .post_ref = net_post_ref,
    .offer = net_offer,
    .post_at = net_post_at,
};
