/*
 * The peer-memory transport: GPU ranks of one host whose GPUs reach each
 * other (the same GPU, or cuDeviceCanAccessPeer: NVLink or PCIe peer to
 * peer) within CFX_P2P_LEVEL. The payload slots live in the receiver's
 * device memory and the sender's kernel writes straight into them (a P2P
 * write over NVLink or PCIe); the receiver's kernel reads them from its own
 * memory. Nothing copies them on the way: no proxy, no staging. In read
 * mode (CFX_P2P_READ_ENABLE; by default over NVLink between sm_80 GPUs, as
 * NCCL decides) the slots live in the sender's memory instead: the sender
 * writes locally and the receiver's kernel reads them over the link. The
 * side whose memory holds the slots is their owner; the other maps them.
 * The same allocation holds the connection's LL slots after the payload
 * slots (src/conn/fifo.h), so an operation the plan runs in LL moves its
 * words the same way, every 4 bytes with their flag, no fence.
 *
 * The control block (tail, head, info lines with the payloads of 24 bytes
 * or less, closed word) is shm's: host memory both processes map, pinned
 * and device-mapped for each side's GPU (transports/shm/shm.h). So every
 * word a host thread reads or writes stays host memory: the watcher reads
 * the counters, poison and check work on the closed word as with shm, and
 * a dead peer is seen the same way. Only the bulk payload moves GPU to GPU.
 * The cost: a kernel polls its flags over PCIe, a microsecond where flags in
 * device memory would take a fraction of one (see docs/transports.md).
 *
 * How the mapper reaches the owner's slots:
 *   - P2P/direct: the ranks are threads of one process: the pointer itself,
 *     with peer access enabled between the two devices when they differ;
 *   - P2P/CUMEM: other processes, where the driver has cuMem (VMM)
 *     allocations exportable as file descriptors (CFX_CUMEM_ENABLE, on by
 *     default): the owner allocates the slots with cuMemCreate and hands
 *     the descriptor over a Unix-domain socket of its own (an abstract
 *     name, served by the proxy thread, so the owner never waits for the
 *     mapper); the mapper maps it (cuMemMap, cuMemSetAccess for its
 *     device). Either side may let go first: the memory lives until its
 *     last mapping is gone;
 *   - P2P/IPC: other processes otherwise: legacy CUDA IPC (cuIpcGetMemHandle
 *     on the owner, cuIpcOpenMemHandle with lazy peer access on the
 *     mapper).
 * The log line names the mode, with "/read" in read mode (NCCL's words).
 *
 * A host thread of a GPU rank (host buffers on a GPU rank) reaches the
 * slots only through copies on a stream of its device (the connector's
 * stage, src/coll/prims.c).
 */
#include "transports/p2p/p2p.h"

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "src/proxy/proxy.h"
#include "src/util/atomics.h"
#include "src/util/check.h"
#include "src/util/cuda.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"
#include "transports/shm/shm.h"
#include "transports/shm/wire.h"

CFX_PARAM_INT(p2p_disable, "P2P_DISABLE", 0, 0, 1,
              "1: never connect GPU ranks through peer memory (shm staging instead)");

/* NCCL's names of the path classes, LOC nearest. */
static int p2p_level_of(const char *text)
{
    static const struct {
        const char *name;
        int level;
    } levels[] = {{"LOC", CFX_PATH_CLASS_LOC}, {"NVL", CFX_PATH_CLASS_NVL},
                  {"NVB", CFX_PATH_CLASS_NVB}, {"PIX", CFX_PATH_CLASS_PIX},
                  {"PXB", CFX_PATH_CLASS_PXB}, {"PHB", CFX_PATH_CLASS_PHB},
                  {"SYS", CFX_PATH_CLASS_SYS}};
    for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
        if (strcasecmp(text, levels[i].name) == 0)
            return levels[i].level;
    return -1;
}

static const char *check_p2p_level(const char *text, char *buf, size_t len)
{
    (void)buf;
    (void)len;
    return p2p_level_of(text) < 0 ? "expected one of LOC, NVL, NVB, PIX, PXB, PHB, SYS" : NULL;
}

CFX_PARAM_STR_CHECKED(p2p_level, "P2P_LEVEL", "PXB", check_p2p_level,
                      "Peer memory between GPU ranks of one host when the path between their "
                      "GPUs is at most this (NCCL's names: LOC, NVL, NVB, PIX, PXB, PHB, SYS)");

CFX_PARAM_INT(p2p_read_enable, "P2P_READ_ENABLE", -2, -2, 1,
              "1: the slots live in the sender's GPU memory and the receiver's kernel reads "
              "them (P2P read); 0: in the receiver's, written by the sender (P2P write); "
              "negative: read over NVLink between sm_80 GPUs, as NCCL decides");

CFX_PARAM_INT(cumem_enable, "CUMEM_ENABLE", 1, 0, 1,
              "1: GPU ranks of different processes share peer memory as cuMem allocations "
              "exported as file descriptors where the driver can (P2P/CUMEM); 0: legacy CUDA IPC");

/* How the mapper reaches the owner's slots. */
enum p2p_mode { P2P_MODE_DIRECT = 1, P2P_MODE_IPC = 2, P2P_MODE_CUMEM = 3 };

static const char *mode_name(uint32_t mode)
{
    return mode == P2P_MODE_IPC ? "P2P/IPC" : mode == P2P_MODE_CUMEM ? "P2P/CUMEM" : "P2P/direct";
}

/* Longest abstract socket name kept in the connect info (the kernel's
 * autobind names are 5 hex digits after the leading NUL). */
#define P2P_SOCK_NAME_MAX 32

/* The connect info: shm's, then where the slots are. */
struct cfx_p2p_info {
    struct cfx_shm_info shm;
    uint32_t mode;       /* Owner: enum p2p_mode; mapper: 0. */
    uint32_t read;       /* Both: the side set up for read mode (checked alike). */
    int32_t device;      /* The writer of this info's CUDA device (its process's ordinal). */
    uint32_t ll;         /* Owner: LL slots follow the payload slots (cfx_ll_slots_offset). */
    uint64_t slot_bytes; /* Owner: the slots' geometry, checked by the mapper. */
    uint64_t n_steps;
    uint64_t local_addr; /* P2P_MODE_DIRECT: the slots' address in the shared process. */
    union {
        unsigned char handle[CFX_CUDA_IPC_HANDLE_BYTES]; /* P2P_MODE_IPC. */
        struct {                                         /* P2P_MODE_CUMEM: */
            uint64_t bytes;                              /* the allocation's size, and */
            uint32_t name_len;                           /* the socket that hands it over. */
            char name[P2P_SOCK_NAME_MAX];
        } cumem;
    } u;
};
_Static_assert(sizeof(struct cfx_p2p_info) <= CFX_CONNECT_INFO_BYTES, "info too large");

/* Per-connector state: shm's first (it owns conn->priv), then ours. */
struct p2p_conn {
    char shm[CFX_SHM_CONN_BYTES];
    int device;      /* This side's device. */
    int owner;       /* The slots are this side's memory (receiver; sender in read mode). */
    int read;        /* Read mode: the sender owns the slots. */
    void *slots;     /* Owner: its allocation; mapper: the owner's, as mapped here. */
    uint32_t mode;   /* enum p2p_mode (the mapper's once connected). */
    int ipc_open;    /* Mapper: slots came from cuIpcOpenMemHandle. */
    int slots_owned; /* Owner: slots came from cuMemAlloc. */
    /* P2P_MODE_CUMEM: the mapping (both sides; the owner's holds the
     * allocation), and the owner's hand-over: its exported descriptor,
     * the listening socket the proxy serves, the one process allowed to
     * take the descriptor, and whether the proxy watches the socket. */
    struct cfx_cuda_vmm vmm;
    int export_fd;
    int listen_fd;
    int peer_pid;
    int client_added;
    struct cfx_proxy_client client;
};

struct p2p_ctx {
    int rank;
    void *shm; /* A shm transport context for the control blocks. */
    const int *abort_flag;
    int64_t connect_timeout_s;
    cfxResult_t (*connect_check)(void *arg, int peer_rank);
    void *connect_check_arg;
    struct cfx_proxy *proxy; /* Taken at the first P2P/CUMEM owner. */
};

/* ------------------------------------------------------------ lifecycle */

static cfxResult_t p2p_init(const struct cfx_transport_env *env, void **ctx_p)
{
    struct p2p_ctx *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_P2P, "p2p: out of memory");
    ctx->rank = env->rank;
    ctx->abort_flag = env->abort_flag;
    ctx->connect_timeout_s = env->connect_timeout_s;
    ctx->connect_check = env->connect_check;
    ctx->connect_check_arg = env->connect_check_arg;
    cfxResult_t res = cfx_shm_transport.init(env, &ctx->shm);
    if (res != cfxSuccess) {
        free(ctx);
        return res;
    }
    *ctx_p = ctx;
    return cfxSuccess;
}

static void p2p_fini(void *ctx_v)
{
    struct p2p_ctx *ctx = ctx_v;
    if (ctx == NULL)
        return;
    cfx_shm_transport.fini(ctx->shm);
    cfx_proxy_put(ctx->proxy);
    free(ctx);
}

/* ------------------------------------------------ P2P/CUMEM hand-over */

/* The owner's descriptor of its slots goes to the mapper over a Unix
 * socket (a descriptor cannot travel in the connect info). The owner
 * listens on an abstract name the kernel picks (autobind), and its
 * process's proxy thread answers: so the owner's setup and connect never
 * wait for the mapper, whichever of the two connects first (connect.c
 * connects send sides first). Only the mapper's process gets the
 * descriptor (its pid, from SO_PEERCRED); once, with the allocation's
 * size. */

#define HANDOVER_SLICE_MS 100

static int handover_progress(void *arg)
{
    (void)arg;
    return 0; /* All the work is in handover_ready. */
}

/* Proxy thread: answer every pending connection. */
static void handover_ready(void *arg, uint32_t events)
{
    (void)events;
    struct p2p_conn *pc = arg;
    int fd;
    while ((fd = accept4(pc->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
        struct ucred cred;
        socklen_t len = sizeof(cred);
        int ours =
            getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid == pc->peer_pid;
        if (ours && pc->export_fd >= 0) { /* Not handed over yet. */
            uint64_t bytes = pc->vmm.bytes;
            struct iovec iov = {.iov_base = &bytes, .iov_len = sizeof(bytes)};
            union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
            } control;
            memset(&control, 0, sizeof(control));
            struct msghdr msg = {.msg_iov = &iov,
                                 .msg_iovlen = 1,
                                 .msg_control = control.buf,
                                 .msg_controllen = sizeof(control.buf)};
            struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
            cmsg->cmsg_level = SOL_SOCKET;
            cmsg->cmsg_type = SCM_RIGHTS;
            cmsg->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cmsg), &pc->export_fd, sizeof(int));
            if (sendmsg(fd, &msg, MSG_NOSIGNAL) == (ssize_t)sizeof(bytes)) {
                close(pc->export_fd); /* The mapper holds its own now. */
                pc->export_fd = -1;
            }
        }
        close(fd);
    }
}

/* Owner: listen for the mapper and let the proxy answer it. */
static cfxResult_t handover_offer(struct p2p_ctx *ctx, struct p2p_conn *pc, int peer_rank,
                                  struct cfx_p2p_info *info)
{
    pc->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un addr;
    socklen_t len = sizeof(addr);
    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    /* An address of the family alone: the kernel binds a fresh abstract name. */
    if (pc->listen_fd < 0 || bind(pc->listen_fd, (struct sockaddr *)&addr, sizeof(sa_family_t)) ||
        listen(pc->listen_fd, 4) != 0 ||
        getsockname(pc->listen_fd, (struct sockaddr *)&addr, &len) != 0)
        return cfx_error_set(cfxSystemError, CFX_LOG_P2P,
                             "p2p: cannot listen on a Unix socket to hand rank %d the slots' "
                             "descriptor: %s",
                             peer_rank, strerror(errno));
    size_t name_len = len - offsetof(struct sockaddr_un, sun_path);
    if (len <= offsetof(struct sockaddr_un, sun_path) || name_len > P2P_SOCK_NAME_MAX ||
        addr.sun_path[0] != '\0')
        return cfx_error_set(cfxInternalError, CFX_LOG_P2P,
                             "p2p: the kernel gave the hand-over socket an unexpected name "
                             "(%zu bytes)",
                             name_len);
    memcpy(info->u.cumem.name, addr.sun_path, name_len);
    info->u.cumem.name_len = (uint32_t)name_len;
    info->u.cumem.bytes = pc->vmm.bytes;
    if (ctx->proxy == NULL)
        CFX_CHECK(cfx_proxy_get(0, &ctx->proxy));
    pc->client.progress = handover_progress;
    pc->client.ready = handover_ready;
    pc->client.arg = pc;
    CFX_CHECK(cfx_proxy_add(ctx->proxy, &pc->client, &pc->listen_fd, 1, EPOLLIN));
    pc->client_added = 1;
    return cfxSuccess;
}

/* Mapper: one bounded wait for the owner's descriptor; cfxSuccess with
 * *fd_p, or a sentence naming the peer. */
static cfxResult_t handover_take(struct p2p_ctx *ctx, const struct cfx_connector *conn,
                                 const struct cfx_p2p_info *info, int *fd_p)
{
    int peer = conn->peer_rank;
    if (info->u.cumem.name_len == 0 || info->u.cumem.name_len > P2P_SOCK_NAME_MAX)
        return cfx_error_set(cfxInternalError, CFX_LOG_P2P,
                             "p2p: rank %d described its hand-over socket with a name of %u bytes",
                             peer, (unsigned)info->u.cumem.name_len);
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof(addr));
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, info->u.cumem.name, info->u.cumem.name_len);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + info->u.cumem.name_len);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, len) != 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return cfx_error_set(cfxSystemError, CFX_LOG_P2P,
                             "p2p: cannot reach rank %d's Unix socket for its slots' descriptor: "
                             "%s (ranks of one host in different network namespaces? "
                             "CFX_CUMEM_ENABLE=0 uses legacy CUDA IPC)",
                             peer, strerror(err));
    }
    int64_t deadline = cfx_time_deadline_s(ctx->connect_timeout_s);
    cfxResult_t res = cfxSuccess;
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, cfx_time_left_ms(deadline, HANDOVER_SLICE_MS)) > 0)
            break;
        if (ctx->abort_flag != NULL && __atomic_load_n(ctx->abort_flag, __ATOMIC_ACQUIRE)) {
            res = cfx_error_set(cfxRemoteError, CFX_LOG_P2P,
                                "p2p: rank %d aborted while waiting for rank %d's slots", ctx->rank,
                                peer);
            break;
        }
        if (ctx->connect_check != NULL &&
            (res = ctx->connect_check(ctx->connect_check_arg, peer)) != cfxSuccess)
            break;
        if (cfx_time_now_ns() >= deadline) {
            res = cfx_error_set(cfxTimeout, CFX_LOG_P2P,
                                "p2p: rank %d did not hand over its slots' descriptor within "
                                "%lld s",
                                peer, (long long)ctx->connect_timeout_s);
            break;
        }
    }
    uint64_t bytes = 0;
    int got = -1;
    if (res == cfxSuccess) {
        struct iovec iov = {.iov_base = &bytes, .iov_len = sizeof(bytes)};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } control;
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = control.buf,
                             .msg_controllen = sizeof(control.buf)};
        ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
        struct cmsghdr *cmsg = n == (ssize_t)sizeof(bytes) ? CMSG_FIRSTHDR(&msg) : NULL;
        if (cmsg != NULL && cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS &&
            cmsg->cmsg_len == CMSG_LEN(sizeof(int)))
            memcpy(&got, CMSG_DATA(cmsg), sizeof(int));
        if (got < 0 || bytes != info->u.cumem.bytes) {
            res = cfx_error_set(cfxRemoteError, CFX_LOG_P2P,
                                "p2p: rank %d closed its hand-over socket without the slots' "
                                "descriptor (it refused this process, or it failed)",
                                peer);
            if (got >= 0)
                close(got);
        }
    }
    close(fd);
    if (res == cfxSuccess)
        *fd_p = got;
    return res;
}

/* ----------------------------------------------------------- connection */

/* GPU ranks of one host, the path between their GPUs within CFX_P2P_LEVEL,
 * and (where this process sees both GPUs) the driver says one can reach
 * the other's memory. A GPU this process does not see (CUDA_VISIBLE_DEVICES)
 * is taken to be reachable within the level, as CUDA IPC maps memory of
 * GPUs a process does not see; both sides then decide alike. */
static int p2p_can_connect(void *ctx_v, const struct cfx_transport_peer *self,
                           const struct cfx_transport_peer *peer)
{
    (void)ctx_v;
    if (param_p2p_disable() || self->host_hash != peer->host_hash || self->cuda_dev < 0 ||
        peer->cuda_dev < 0 || (int)peer->path > p2p_level_of(param_p2p_level()))
        return 0;
    int same_process = self->pid == peer->pid;
    if (!same_process && !cfx_cuda_ipc_supported() &&
        !(param_cumem_enable() && cfx_cuda_vmm_supported(self->cuda_dev, NULL)))
        return 0;
    int mine = same_process ? self->cuda_dev : cfx_cuda_device_of_busid(self->busid);
    int theirs = same_process ? peer->cuda_dev : cfx_cuda_device_of_busid(peer->busid);
    if (mine < 0 || theirs < 0)
        return !same_process;
    return cfx_cuda_can_access_peer(mine, theirs) && cfx_cuda_can_access_peer(theirs, mine);
}

/* Read mode for the connection from @p sender's GPU to @p receiver's:
 * CFX_P2P_READ_ENABLE, else NCCL's default: over NVLink between GPUs of
 * compute capability 8.0 (a GPU this process does not see is taken to be
 * like its own). Both sides decide alike from the same facts; the connect
 * info carries the decision so that ranks whose settings differ fail with
 * a sentence instead of both owning (or neither owning) the slots. */
static int p2p_use_read(const struct cfx_transport_peer *peer, int device)
{
    int enable = (int)param_p2p_read_enable();
    if (enable >= 0)
        return enable;
    if (peer->path != CFX_PATH_CLASS_NVL)
        return 0;
    int mine = cfx_cuda_compute_capability(device);
    int theirs_dev = cfx_cuda_device_of_busid(peer->busid);
    int theirs = theirs_dev >= 0 ? cfx_cuda_compute_capability(theirs_dev) : mine;
    return mine == 80 && theirs == 80;
}

/* The owner's allocation: the payload slots, then the LL slots
 * (cfx_ll_slots_offset), so every mode that reaches the payload slots,
 * direct, cuMem and IPC, reaches the LL slots too. */
static size_t p2p_slots_bytes(size_t slot_bytes, int n_steps)
{
    return cfx_ll_block_bytes(slot_bytes * (size_t)n_steps, n_steps);
}

/* Owner: allocate the slots and describe how the mapper reaches them. */
static cfxResult_t own_slots(struct p2p_ctx *ctx, const struct cfx_transport_peer *peer,
                             size_t slot_bytes, int n_steps, struct cfx_connector *conn,
                             struct p2p_conn *pc, struct cfx_p2p_info *info)
{
    size_t bytes = p2p_slots_bytes(slot_bytes, n_steps);
    CFX_CHECK(cfx_cuda_select(pc->device));
    info->ll = 1;
    info->slot_bytes = slot_bytes;
    info->n_steps = (uint64_t)n_steps;
    if (peer->pid == (int)getpid()) {
        info->mode = P2P_MODE_DIRECT;
    } else {
        const char *why = "CFX_CUMEM_ENABLE=0";
        info->mode = param_cumem_enable() && cfx_cuda_vmm_supported(pc->device, &why)
                         ? P2P_MODE_CUMEM
                         : P2P_MODE_IPC;
        if (info->mode == P2P_MODE_IPC)
            CFX_INFO(CFX_LOG_P2P, "p2p: rank %d %s rank %d: legacy CUDA IPC, not cuMem (%s)",
                     ctx->rank, conn->dir == CFX_CONN_RECV ? "<-" : "->", peer->rank, why);
    }
    if (info->mode == P2P_MODE_CUMEM) {
        CFX_CHECK(cfx_cuda_vmm_alloc(pc->device, bytes, &pc->vmm));
        pc->slots = pc->vmm.ptr;
        CFX_CHECK(cfx_cuda_vmm_export(&pc->vmm, &pc->export_fd));
        CFX_CHECK(handover_offer(ctx, pc, peer->rank, info));
    } else {
        CFX_CHECK(cfx_cuda_mem_alloc(&pc->slots, bytes));
        pc->slots_owned = 1;
        if (info->mode == P2P_MODE_DIRECT)
            info->local_addr = (uint64_t)(uintptr_t)pc->slots;
        else
            CFX_CHECK(cfx_cuda_ipc_export(pc->slots, pc->device, info->u.handle));
    }
    pc->mode = info->mode;
    conn->slots = pc->slots;
    conn->view.slots = pc->slots;
    return cfx_connector_stage_init(conn, pc->device);
}

static cfxResult_t p2p_setup(void *ctx_v, const struct cfx_transport_peer *peer, size_t slot_bytes,
                             int n_steps, struct cfx_connector *conn, void *info_out)
{
    struct p2p_ctx *ctx = ctx_v;
    if (conn->place.reader != CFX_READER_KERNEL || conn->place.mem != CFX_MEM_HOST_PINNED)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_P2P,
                             "p2p: connects GPU ranks only, whose FIFOs are read by kernels "
                             "(connection with rank %d)",
                             peer->rank);
    struct cfx_p2p_info info;
    memset(&info, 0, sizeof(info));
    CFX_CHECK(cfx_shm_fifo_setup(ctx->shm, peer, slot_bytes, n_steps, conn, &info.shm,
                                 sizeof(struct p2p_conn), 0));
    struct p2p_conn *pc = conn->priv;
    pc->device = conn->place.device;
    pc->export_fd = -1;
    pc->listen_fd = -1;
    pc->peer_pid = peer->pid;
    pc->read = p2p_use_read(peer, pc->device);
    pc->owner = (conn->dir == CFX_CONN_RECV) != pc->read;
    info.device = pc->device;
    info.read = (uint32_t)pc->read;
    if (pc->owner)
        CFX_CHECK(own_slots(ctx, peer, slot_bytes, n_steps, conn, pc, &info));
    memcpy(info_out, &info, sizeof(info));
    return cfxSuccess;
}

/* Mapper: reach the owner's slots as its info says. */
static cfxResult_t open_slots(struct p2p_ctx *ctx, struct cfx_connector *conn, struct p2p_conn *pc,
                              const struct cfx_p2p_info *info)
{
    if (info->slot_bytes != conn->slot_bytes || info->n_steps != (uint64_t)conn->n_steps)
        return cfx_error_set(cfxInternalError, CFX_LOG_P2P,
                             "p2p: rank %d described %llu slots of %llu bytes where this rank "
                             "expects %d of %zu (CFX_BUFFSIZE or CFX_STEPS differ between ranks?)",
                             conn->peer_rank, (unsigned long long)info->n_steps,
                             (unsigned long long)info->slot_bytes, conn->n_steps, conn->slot_bytes);
    if (info->ll != 1)
        return cfx_error_set(cfxInternalError, CFX_LOG_P2P,
                             "p2p: rank %d's slots come without LL slots (a Conflux of another "
                             "version?)",
                             conn->peer_rank);
    int same_process = pc->peer_pid == (int)getpid();
    if (info->mode == P2P_MODE_DIRECT && same_process && info->local_addr != 0) {
        /* One process: the devices' ordinals are the same here. */
        CFX_CHECK(cfx_cuda_enable_peer_access(pc->device, info->device));
        pc->slots = (void *)(uintptr_t)info->local_addr;
    } else if (info->mode == P2P_MODE_IPC && !same_process) {
        CFX_CHECK(cfx_cuda_ipc_open(info->u.handle, pc->device, &pc->slots));
        pc->ipc_open = 1;
    } else if (info->mode == P2P_MODE_CUMEM && !same_process) {
        size_t need = p2p_slots_bytes(conn->slot_bytes, conn->n_steps);
        if (info->u.cumem.bytes < need)
            return cfx_error_set(cfxInternalError, CFX_LOG_P2P,
                                 "p2p: rank %d's slots are %llu bytes, fewer than the %zu its "
                                 "FIFO needs",
                                 conn->peer_rank, (unsigned long long)info->u.cumem.bytes, need);
        int fd = -1;
        CFX_CHECK(handover_take(ctx, conn, info, &fd));
        cfxResult_t res = cfx_cuda_vmm_import(fd, info->u.cumem.bytes, pc->device, &pc->vmm);
        close(fd);
        CFX_CHECK(res);
        pc->slots = pc->vmm.ptr;
    } else {
        return cfx_error_set(cfxInternalError, CFX_LOG_P2P,
                             "p2p: rank %d described its slots with an unknown mode %u",
                             conn->peer_rank, (unsigned)info->mode);
    }
    pc->mode = info->mode;
    conn->slots = pc->slots;
    conn->view.slots = pc->slots;
    return cfx_connector_stage_init(conn, pc->device);
}

static cfxResult_t p2p_connect(void *ctx_v, struct cfx_connector *conn, const void *peer_info)
{
    struct p2p_ctx *ctx = ctx_v;
    struct cfx_p2p_info info;
    memcpy(&info, peer_info, sizeof(info));
    CFX_CHECK(cfx_shm_fifo_connect(ctx->shm, conn, &info.shm));
    conn->peer_readable = 0; /* No read_peer: payloads go through the slots. */
    struct p2p_conn *pc = conn->priv;
    if (info.read != (uint32_t)pc->read)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_P2P,
                             "p2p: rank %d set up its connection with rank %d for P2P %s, this "
                             "rank for P2P %s (CFX_P2P_READ_ENABLE differs between them?)",
                             conn->peer_rank, ctx->rank, info.read ? "read" : "write",
                             pc->read ? "read" : "write");
    if (!pc->owner)
        CFX_CHECK(open_slots(ctx, conn, pc, &info));
    /* Both sides, once the view is final. */
    cfx_connector_set_ll(conn, pc->slots, conn->slot_bytes * (size_t)conn->n_steps);
    /* The mapper writes the slots (write mode) or reads them (read mode). */
    int mine = pc->owner, me = ctx->rank, peer = conn->peer_rank;
    CFX_INFO(CFX_LOG_P2P,
             "p2p: rank %d %s rank %d connected (%s%s): slots in device %d's memory of rank %d, "
             "%s by device %d of rank %d",
             me, conn->dir == CFX_CONN_SEND ? "->" : "<-", peer, mode_name(pc->mode),
             pc->read ? "/read" : "", mine ? pc->device : (int)info.device, mine ? me : peer,
             pc->read ? "read" : "written", mine ? (int)info.device : pc->device, mine ? peer : me);
    return cfxSuccess;
}

/* A sending owner (read mode) whose slots another process or thread reads
 * straight from its memory (direct, legacy IPC; a cuMem mapping keeps the
 * memory itself): the sender's last call returned once it posted, so wait
 * until the receiver has released every slot before freeing them, or the
 * connection broke, or the peer is gone, at most the connect timeout. */
static void wait_for_readers(struct p2p_ctx *ctx, struct cfx_connector *conn)
{
    const struct p2p_conn *pc = conn->priv;
    if (!pc->owner || !pc->read || pc->mode == P2P_MODE_CUMEM || conn->view.tail == NULL)
        return;
    int64_t deadline = cfx_time_deadline_s(ctx->connect_timeout_s);
    while (cfx_load_acquire_u64(conn->view.head) < cfx_load_acquire_u64(conn->view.tail) &&
           __atomic_load_n(conn->view.closed, __ATOMIC_ACQUIRE) == 0 &&
           cfx_shm_fifo_check(ctx->shm, conn) == cfxSuccess && cfx_time_now_ns() < deadline)
        usleep(1000);
    cfx_error_thread_clear(); /* A failed check is not this close's error. */
}

static void p2p_close(void *ctx_v, struct cfx_connector *conn)
{
    struct p2p_ctx *ctx = ctx_v;
    struct p2p_conn *pc = conn->priv;
    if (pc == NULL)
        return;
    cfx_connector_stage_fini(conn);
    if (pc->client_added)
        cfx_proxy_remove(ctx->proxy, &pc->client);
    pc->client_added = 0;
    if (pc->listen_fd >= 0)
        close(pc->listen_fd);
    if (pc->export_fd >= 0)
        close(pc->export_fd);
    pc->listen_fd = pc->export_fd = -1;
    wait_for_readers(ctx, conn);
    /* cuMem: the memory lives on in the peer's mapping, if it still has one. */
    cfx_cuda_vmm_free(&pc->vmm);
    if (pc->ipc_open)
        cfx_cuda_ipc_close(pc->slots, pc->device);
    /* With legacy IPC the mapper's mapping should be closed first; an
     * owner that leaves earlier frees the memory under a mapping no kernel
     * uses any more (the mapper's work on it ended or failed). */
    if (pc->slots_owned && cfx_cuda_select(pc->device) == cfxSuccess)
        cfx_cuda_mem_free(pc->slots);
    pc->slots = NULL;
    pc->ipc_open = 0;
    pc->slots_owned = 0;
    cfx_shm_fifo_close(ctx->shm, conn); /* Frees pc. */
}

/* ------------------------------------------------------------ data path */

static void p2p_poison(void *ctx_v, struct cfx_connector *conn, cfxResult_t reason, int blame_rank)
{
    cfx_shm_fifo_poison(((struct p2p_ctx *)ctx_v)->shm, conn, reason, blame_rank);
}

static cfxResult_t p2p_check(void *ctx_v, struct cfx_connector *conn)
{
    return cfx_shm_fifo_check(((struct p2p_ctx *)ctx_v)->shm, conn);
}

const struct cfx_transport cfx_p2p_transport = {
    .version = CFX_TRANSPORT_VERSION,
    .name = "p2p",
    /* Kernels poll the (pinned) control block and fill the slots. */
    .flags = CFX_TRANSPORT_FLAG_READER_KERNEL,
    /* lifecycle */
    .init = p2p_init,
    .fini = p2p_fini,
    /* connection */
    .can_connect = p2p_can_connect,
    .setup = p2p_setup,
    .connect = p2p_connect,
    .close = p2p_close,
    /* data path */
    .kick = NULL,
    .poison = p2p_poison,
    .check = p2p_check,
    .read_peer = NULL,
    /* memory: nothing yet (registered user buffers, peer mappings) */
    .reg_mem = NULL,
    .dereg_mem = NULL,
    .flush = NULL,
    .map_peer = NULL,
};
