/*
 * fake-verbs devices, contexts, protection domains, memory regions, async
 * events and the knobs and identity read at the first open. See fakeverbs.h.
 */
#include "fakeverbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* verbs.h turns these names into inline wrappers: the symbols are ours. */
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

#define FV_DEFAULT_DIR "/tmp/cfx-fakeverbs"
#define FV_LID_SPACE   0xBFFE /* unicast LIDs 1..0xBFFF */

struct fv_global fv = {
    .lock = PTHREAD_MUTEX_INITIALIZER, .epoll_fd = -1, .wake_fd = -1, .listen_fd = -1};

static struct fv_device devices[FV_MAX_DEVICES];

void fv_log(const char *fmt, ...)
{
    if (!fv.knobs.log)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "fake-verbs: [pid %d] %s\n", (int)getpid(), line);
}

uint64_t fv_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static long env_long(const char *name, long fallback)
{
    const char *value = getenv(name);
    if (value == NULL || value[0] == '\0')
        return fallback;
    return strtol(value, NULL, 10);
}

uint32_t fv_random_u32(void)
{
    uint32_t value = 0;
    if (getrandom(&value, sizeof(value), 0) != sizeof(value))
        value = (uint32_t)rand() ^ ((uint32_t)getpid() << 16) ^ (uint32_t)fv_now_ms();
    return value;
}

/* The namespace's address: FAKEVERBS_ADDR, else the first UP non-loopback
 * IPv4 interface, else 127.0.0.1. */
static struct in_addr namespace_addr(void)
{
    struct in_addr addr = {.s_addr = htonl(INADDR_LOOPBACK)};
    const char *forced = getenv("FAKEVERBS_ADDR");
    if (forced != NULL && forced[0] != '\0' && inet_pton(AF_INET, forced, &addr) == 1)
        return addr;
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) != 0)
        return addr;
    for (struct ifaddrs *it = list; it != NULL; it = it->ifa_next) {
        if (it->ifa_addr == NULL || it->ifa_addr->sa_family != AF_INET)
            continue;
        if (!(it->ifa_flags & IFF_UP) || (it->ifa_flags & IFF_LOOPBACK))
            continue;
        addr = ((struct sockaddr_in *)it->ifa_addr)->sin_addr;
        break;
    }
    freeifaddrs(list);
    return addr;
}

/* LID and GIDs: every process of one network namespace gets the same ones. */
static void identity_init(void)
{
    struct stat ns;
    uint64_t ns_id = 1;
    if (stat("/proc/self/ns/net", &ns) == 0)
        ns_id = (uint64_t)ns.st_ino;
    fv.ident.addr = namespace_addr();
    uint64_t mixed = ns_id * 0x9E3779B97F4A7C15ull;
    fv.ident.lid = fv.knobs.roce ? 0 : (uint16_t)(1 + (mixed >> 40) % FV_LID_SPACE);
    memset(fv.ident.gid, 0, sizeof(fv.ident.gid));
    fv.ident.gid[0].raw[0] = 0xfe;
    fv.ident.gid[0].raw[1] = 0x80;
    for (int i = 0; i < 8; i++)
        fv.ident.gid[0].raw[8 + i] = (uint8_t)(ns_id >> (8 * (7 - i)));
    fv.ident.n_gids = 1;
    if (fv.knobs.roce || fv.knobs.roce_devices) {
        fv.ident.gid[1].raw[10] = 0xff;
        fv.ident.gid[1].raw[11] = 0xff;
        memcpy(&fv.ident.gid[1].raw[12], &fv.ident.addr.s_addr, 4);
        fv.ident.n_gids = 2;
    }
}

static void knobs_read_once(void)
{
    if (fv.knobs_read)
        return;
    fv.knobs_read = 1;
    fv.knobs.n_devices = (int)env_long("FAKEVERBS_DEVICES", 1);
    if (fv.knobs.n_devices < 0)
        fv.knobs.n_devices = 0;
    if (fv.knobs.n_devices > FV_MAX_DEVICES)
        fv.knobs.n_devices = FV_MAX_DEVICES;
    const char *link = getenv("FAKEVERBS_LINK_LAYER");
    fv.knobs.roce = link != NULL && (strcmp(link, "roce") == 0 || strcmp(link, "ethernet") == 0);
    const char *roce_devices = getenv("FAKEVERBS_ROCE_DEVICES");
    for (const char *at = roce_devices; at != NULL && *at != '\0';) {
        char *end = NULL;
        long d = strtol(at, &end, 10);
        if (end == at)
            break;
        if (d >= 0 && d < FV_MAX_DEVICES)
            fv.knobs.roce_devices |= 1u << d;
        at = *end == ',' ? end + 1 : end;
    }
    fv.knobs.log = env_long("FAKEVERBS_LOG", 0) != 0;
    fv.knobs.fail_after_writes = env_long("FAKEVERBS_FAIL_AFTER_WRITES", -1);
    fv.knobs.fail_reads = env_long("FAKEVERBS_FAIL_READS", 0) != 0;
    fv.knobs.lose_completion = env_long("FAKEVERBS_LOSE_COMPLETION", -1);
    fv.knobs.port_down_after_ms = env_long("FAKEVERBS_PORT_DOWN_AFTER_MS", -1);
    const char *down = getenv("FAKEVERBS_PORT_DOWN_DEVICE");
    fv.knobs.port_down_device = -1;
    if (down != NULL && strncmp(down, "fake_", 5) == 0)
        fv.knobs.port_down_device = atoi(down + 5);
    fv.knobs.qp_fatal_after_ms = env_long("FAKEVERBS_ASYNC_QP_FATAL_AFTER_MS", -1);
    const char *dir = getenv("FAKEVERBS_DIR");
    snprintf(fv.knobs.dir, sizeof(fv.knobs.dir), "%s",
             dir != NULL && dir[0] != '\0' ? dir : FV_DEFAULT_DIR);
    identity_init();
}

/* ------------------------------------------------------------ identity */

uint16_t fv_device_lid(int dev)
{
    if (fv.ident.lid == 0)
        return 0; /* RoCE */
    return (uint16_t)(1 + (fv.ident.lid - 1 + dev) % FV_LID_SPACE);
}

void fv_device_gid(int dev, int i, union ibv_gid *gid)
{
    *gid = fv.ident.gid[i];
    if (i == 0)
        gid->raw[8] ^= (uint8_t)(dev << 4); /* The port GUID differs per device. */
}

int fv_device_port_down(int dev)
{
    return fv.port_down && (fv.knobs.port_down_device < 0 || fv.knobs.port_down_device == dev);
}

int fv_context_device(const struct ibv_context *context)
{
    return ((const struct fv_device *)context->device)->index;
}

/* ------------------------------------------------------------ async events */

void fv_async_post_ctx(struct fv_context *ctx, enum ibv_event_type type, void *element)
{
    struct fv_async *item = calloc(1, sizeof(*item));
    if (item == NULL)
        return;
    item->event.event_type = type;
    if (type == IBV_EVENT_CQ_ERR)
        item->event.element.cq = element;
    else if (type == IBV_EVENT_PORT_ERR || type == IBV_EVENT_PORT_ACTIVE)
        item->event.element.port_num = FV_PORT_NUM;
    else
        item->event.element.qp = element;
    if (ctx->events_tail != NULL)
        ctx->events_tail->next = item;
    else
        ctx->events_head = item;
    ctx->events_tail = item;
    uint64_t one = 1;
    if (write(ctx->ibctx.async_fd, &one, sizeof(one)) != sizeof(one))
        fv_log("cannot signal the async fd: %s", strerror(errno));
    fv_log("async event %s", ibv_event_type_str(type));
}

FV_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
    struct fv_context *ctx = (struct fv_context *)context;
    uint64_t one;
    /* A semaphore eventfd: blocks unless the user made it O_NONBLOCK. */
    if (read(context->async_fd, &one, sizeof(one)) != sizeof(one))
        return -1;
    pthread_mutex_lock(&fv.lock);
    struct fv_async *item = ctx->events_head;
    if (item != NULL) {
        ctx->events_head = item->next;
        if (ctx->events_head == NULL)
            ctx->events_tail = NULL;
    }
    pthread_mutex_unlock(&fv.lock);
    if (item == NULL) {
        errno = EAGAIN;
        return -1;
    }
    *event = item->event;
    free(item);
    return 0;
}

FV_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
    (void)event;
}

/* ------------------------------------------------------------ fork */

static void atfork_prepare(void)
{
    pthread_mutex_lock(&fv.lock);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&fv.lock);
}

/* The child has no service thread and must not touch its parent's sockets:
 * it starts with no device open, like a fresh process. */
static void atfork_child(void)
{
    fv_wire_forget_inherited();
    fv.inherited_contexts = fv.contexts;
    fv.inherited_mrs = fv.mrs;
    fv.inherited_qps = fv.qps;
    fv.inherited_resp_conns = fv.resp_conns;
    fv.contexts = NULL;
    fv.mrs = NULL;
    fv.qps = NULL;
    fv.resp_conns = NULL;
    fv.n_open = 0;
    fv.running = 0;
    fv.stop = 0;
    pthread_mutex_unlock(&fv.lock);
}

__attribute__((constructor)) static void fork_handlers_install(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* ------------------------------------------------------------ devices */

FV_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
    pthread_mutex_lock(&fv.lock);
    knobs_read_once();
    int count = fv.knobs.n_devices;
    pthread_mutex_unlock(&fv.lock);
    struct ibv_device **list = calloc((size_t)count + 1, sizeof(*list));
    if (list == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    for (int i = 0; i < count; i++) {
        struct fv_device *dev = &devices[i];
        dev->index = i;
        dev->ibdev.node_type = IBV_NODE_CA;
        dev->ibdev.transport_type = IBV_TRANSPORT_IB;
        snprintf(dev->ibdev.name, sizeof(dev->ibdev.name), "fake_%d", i);
        snprintf(dev->ibdev.dev_name, sizeof(dev->ibdev.dev_name), "uverbs%d", i);
        snprintf(dev->ibdev.dev_path, sizeof(dev->ibdev.dev_path), "/nonexistent/fake-verbs");
        snprintf(dev->ibdev.ibdev_path, sizeof(dev->ibdev.ibdev_path), "/nonexistent/fake-verbs");
        list[i] = &dev->ibdev;
    }
    if (num_devices != NULL)
        *num_devices = count;
    return list;
}

FV_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

FV_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
    return device->name;
}

FV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    struct fv_context *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    ctx->ibctx.async_fd = eventfd(0, EFD_SEMAPHORE | EFD_CLOEXEC);
    if (ctx->ibctx.async_fd < 0)
        goto err_free;
    ctx->ibctx.device = device;
    ctx->ibctx.cmd_fd = -1;
    ctx->ibctx.num_comp_vectors = 1;
    ctx->ibctx.ops.post_send = fv_qp_post_send;
    ctx->ibctx.ops.post_recv = fv_qp_post_recv;
    ctx->ibctx.ops.poll_cq = fv_cq_poll;
    pthread_mutex_init(&ctx->ibctx.mutex, NULL);

    pthread_mutex_lock(&fv.lock);
    knobs_read_once();
    if (fv.n_open == 0) {
        mkdir(fv.knobs.dir, 01777);
        fv_registry_reclaim();
        if (fv_service_start() != 0) {
            pthread_mutex_unlock(&fv.lock);
            goto err_close;
        }
    }
    if (fv.first_open_ms == 0)
        fv.first_open_ms = fv_now_ms();
    fv.n_open++;
    ctx->next = fv.contexts;
    fv.contexts = ctx;
    pthread_mutex_unlock(&fv.lock);
    fv_log("opened %s", device->name);
    return &ctx->ibctx;

err_close:
    pthread_mutex_destroy(&ctx->ibctx.mutex);
    close(ctx->ibctx.async_fd);
err_free:
    free(ctx);
    return NULL;
}

FV_EXPORT int ibv_close_device(struct ibv_context *context)
{
    struct fv_context *ctx = (struct fv_context *)context;
    pthread_mutex_lock(&fv.lock);
    for (struct fv_context **it = &fv.contexts; *it != NULL; it = &(*it)->next) {
        if (*it == ctx) {
            *it = ctx->next;
            break;
        }
    }
    int last = --fv.n_open == 0;
    /* QPs the user left behind stop being reachable with their context. */
    for (struct fv_qp *qp = fv.qps; qp != NULL; qp = qp->next) {
        if (qp->ibqp.context == context && qp->registered) {
            fv_registry_remove_qp(qp->ibqp.qp_num);
            qp->registered = 0;
        }
    }
    pthread_mutex_unlock(&fv.lock);
    if (last)
        fv_service_stop();
    while (ctx->events_head != NULL) {
        struct fv_async *item = ctx->events_head;
        ctx->events_head = item->next;
        free(item);
    }
    close(context->async_fd);
    pthread_mutex_destroy(&context->mutex);
    free(ctx);
    return 0;
}

FV_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *device_attr)
{
    struct fv_device *dev = (struct fv_device *)context->device;
    memset(device_attr, 0, sizeof(*device_attr));
    snprintf(device_attr->fw_ver, sizeof(device_attr->fw_ver), "fake-verbs 1.0");
    device_attr->node_guid = htobe64(0x0002c90300000000ull | (uint64_t)dev->index);
    device_attr->sys_image_guid = device_attr->node_guid;
    device_attr->max_mr_size = UINT64_MAX;
    device_attr->page_size_cap = 0xfffff000;
    device_attr->vendor_id = 0x02c9;
    device_attr->vendor_part_id = 0xfa4e;
    device_attr->max_qp = 1 << 16;
    device_attr->max_qp_wr = FV_MAX_QP_WR;
    device_attr->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN;
    device_attr->max_sge = FV_MAX_SGE;
    device_attr->max_sge_rd = FV_MAX_SGE;
    device_attr->max_cq = 1 << 16;
    device_attr->max_cqe = FV_MAX_CQE;
    device_attr->max_mr = 1 << 20;
    device_attr->max_pd = 1 << 16;
    device_attr->max_qp_rd_atom = 16;
    device_attr->max_qp_init_rd_atom = 16;
    device_attr->max_res_rd_atom = 1 << 20;
    device_attr->atomic_cap = IBV_ATOMIC_NONE;
    device_attr->max_pkeys = 1;
    device_attr->phys_port_cnt = 1;
    return 0;
}

FV_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
                             struct _compat_ibv_port_attr *port_attr)
{
    if (port_num != FV_PORT_NUM)
        return EINVAL;
    struct ibv_port_attr attr;
    memset(&attr, 0, sizeof(attr));
    pthread_mutex_lock(&fv.lock);
    int dev = fv_context_device(context);
    attr.state = fv_device_port_down(dev) ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
    attr.phys_state = fv_device_port_down(dev) ? 3 /* disabled */ : 5 /* link up */;
    attr.lid = fv_device_lid(dev);
    attr.link_layer = fv.knobs.roce || (fv.knobs.roce_devices >> dev & 1)
                          ? IBV_LINK_LAYER_ETHERNET
                          : IBV_LINK_LAYER_INFINIBAND;
    attr.gid_tbl_len = fv.ident.n_gids;
    pthread_mutex_unlock(&fv.lock);
    attr.max_mtu = IBV_MTU_4096;
    attr.active_mtu = IBV_MTU_4096;
    attr.port_cap_flags = 0;
    attr.max_msg_sz = 1u << 31;
    attr.pkey_tbl_len = 1;
    attr.sm_lid = attr.lid;
    attr.lmc = 0;
    attr.active_width = 2;  /* 4x */
    attr.active_speed = 32; /* EDR */
    /* The 1.1 symbol fills rdma-core's compat layout: ibv_port_attr up to
     * port_cap_flags2 (callers pass a whole ibv_port_attr). */
    memcpy(port_attr, &attr, offsetof(struct ibv_port_attr, port_cap_flags2));
    return 0;
}

FV_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index,
                            union ibv_gid *gid)
{
    pthread_mutex_lock(&fv.lock);
    int ok = port_num == FV_PORT_NUM && index >= 0 && index < fv.ident.n_gids;
    if (ok)
        fv_device_gid(fv_context_device(context), index, gid);
    pthread_mutex_unlock(&fv.lock);
    return ok ? 0 : -1;
}

/* ------------------------------------------------------------ PD and MR */

FV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    if (pd == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    pd->context = context;
    pd->handle = fv_random_u32();
    return pd;
}

FV_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
    free(pd);
    return 0;
}

struct fv_mr *fv_mr_find(uint32_t key)
{
    for (struct fv_mr *mr = fv.mrs; mr != NULL; mr = mr->next)
        if (mr->ibmr.lkey == key || mr->ibmr.rkey == key)
            return mr;
    return NULL;
}

/* A key no MR of this process uses (unpredictable-ish, never 0). */
static uint32_t mr_key_new(void)
{
    for (;;) {
        uint32_t key = fv_random_u32();
        if (key != 0 && fv_mr_find(key) == NULL)
            return key;
    }
}

static struct ibv_mr *mr_new(struct ibv_pd *pd, void *addr, size_t length, int access);

FV_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return mr_new(pd, addr, length, access);
}

/* A dma-buf region (GPUDirect RDMA): the descriptor must be open; the
 * region is the @p iova the caller gives, as the NIC would address it
 * (fake-cuda's device memory is host memory at that address). */
FV_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                           uint64_t iova, int fd, int access)
{
    (void)offset;
    if (fd < 0 || fcntl(fd, F_GETFD) < 0) {
        errno = EBADF;
        return NULL;
    }
    if (length == 0 || iova == 0) {
        errno = EINVAL;
        return NULL;
    }
    fv_log("dma-buf region of %zu bytes at 0x%llx (fd %d)", length, (unsigned long long)iova, fd);
    return mr_new(pd, (void *)(uintptr_t)iova, length, access);
}

static struct ibv_mr *mr_new(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    if ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
        errno = EINVAL;
        return NULL;
    }
    struct fv_mr *mr = calloc(1, sizeof(*mr));
    if (mr == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    mr->ibmr.context = pd->context;
    mr->ibmr.pd = pd;
    mr->ibmr.addr = addr;
    mr->ibmr.length = length;
    mr->access = access;
    pthread_mutex_lock(&fv.lock);
    mr->ibmr.lkey = mr_key_new();
    mr->ibmr.rkey = mr_key_new();
    mr->ibmr.handle = mr->ibmr.lkey;
    mr->next = fv.mrs;
    fv.mrs = mr;
    pthread_mutex_unlock(&fv.lock);
    return &mr->ibmr;
}

FV_EXPORT int ibv_dereg_mr(struct ibv_mr *ibmr)
{
    struct fv_mr *mr = (struct fv_mr *)ibmr;
    pthread_mutex_lock(&fv.lock);
    for (struct fv_mr **it = &fv.mrs; *it != NULL; it = &(*it)->next) {
        if (*it == mr) {
            *it = mr->next;
            break;
        }
    }
    fv_wire_region_gone(mr->ibmr.rkey);
    pthread_mutex_unlock(&fv.lock);
    free(mr);
    return 0;
}

/* ------------------------------------------------------------ strings */

FV_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
    static const char *const names[] = {
        [IBV_WC_SUCCESS] = "success",
        [IBV_WC_LOC_LEN_ERR] = "local length error",
        [IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
        [IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
        [IBV_WC_LOC_PROT_ERR] = "local protection error",
        [IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
        [IBV_WC_MW_BIND_ERR] = "memory management operation error",
        [IBV_WC_BAD_RESP_ERR] = "bad response error",
        [IBV_WC_LOC_ACCESS_ERR] = "local access error",
        [IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
        [IBV_WC_REM_ACCESS_ERR] = "remote access error",
        [IBV_WC_REM_OP_ERR] = "remote operation error",
        [IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
        [IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
        [IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
        [IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
        [IBV_WC_REM_ABORT_ERR] = "aborted error",
        [IBV_WC_INV_EECN_ERR] = "invalid EE context number",
        [IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
        [IBV_WC_FATAL_ERR] = "fatal error",
        [IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
        [IBV_WC_GENERAL_ERR] = "general error",
    };
    if ((unsigned)status < sizeof(names) / sizeof(names[0]) && names[status] != NULL)
        return names[status];
    return "unknown";
}

FV_EXPORT const char *ibv_event_type_str(enum ibv_event_type event)
{
    static const char *const names[] = {
        [IBV_EVENT_CQ_ERR] = "CQ error",
        [IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
        [IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
        [IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
        [IBV_EVENT_COMM_EST] = "communication established",
        [IBV_EVENT_SQ_DRAINED] = "send queue drained",
        [IBV_EVENT_PATH_MIG] = "path migrated",
        [IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
        [IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
        [IBV_EVENT_PORT_ACTIVE] = "port active",
        [IBV_EVENT_PORT_ERR] = "port error",
        [IBV_EVENT_LID_CHANGE] = "LID change",
        [IBV_EVENT_PKEY_CHANGE] = "P_Key change",
        [IBV_EVENT_SM_CHANGE] = "SM change",
        [IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
        [IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
        [IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
        [IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
        [IBV_EVENT_GID_CHANGE] = "GID table change",
        [IBV_EVENT_WQ_FATAL] = "WQ fatal",
    };
    if ((unsigned)event < sizeof(names) / sizeof(names[0]) && names[event] != NULL)
        return names[event];
    return "unknown";
}
