/*
 * The shared-memory transport. The receiver owns the FIFO: an anonymous
 * shared file (memfd; ranks in different processes of one host) or plain
 * memory (ranks that are threads of one process), allocated and pre-faulted
 * in setup. The sender maps the very same FIFO, so a posted slot is already
 * where the receiver reads it: no copy and no progress thread.
 *
 * A memfd has no name anywhere: the sender opens the receiver's descriptor
 * through /proc/<pid>/fd/<fd> (the kernel allows it to a process of the same
 * user, or with CAP_SYS_PTRACE), and the receiver keeps that descriptor open
 * only until the sender has mapped the FIFO. The memory lives exactly as
 * long as a mapping or a descriptor of it, so a process killed at any moment
 * leaves nothing behind, in /dev/shm or elsewhere.
 *
 * Single copy: a receiver may also read its sender's memory directly
 * (read_peer: process_vm_readv, or a plain copy between threads of one
 * process), so a large allgather copies each byte once, from the sender's
 * user buffer into the receiver's, instead of through a slot. At
 * connect the receiver reads a known word of the sender's once; only if that
 * works (the kernel allows it: same user, dumpable, and no Yama ptrace
 * restriction in the way) is the connector marked peer_readable.
 *
 * Peer mappings (map_peer, CFX_TRANSPORT_FLAG_PEER_MAP): between threads of
 * one process a peer's address is a pointer here already; between processes
 * shm maps nothing but FIFOs, so map_peer refuses with a sentence.
 *
 * GPU ranks (place.mem CFX_MEM_HOST_PINNED, reader CFX_READER_KERNEL): the
 * FIFO is still host memory, and each side registers its mapping with CUDA
 * (cuMemHostRegister, device-mapped), so a kernel reads and writes it at the
 * same address and a host thread still can; between threads the memory is
 * registered once, by the side that needs it first, and unregistered by the
 * side that frees it. FIFOs in device memory are another transport's.
 * A GPU rank's FIFO also holds LL slots ([n_steps] of CFX_LL_SLOT_BYTES,
 * page aligned after the payload slots, zeroed with them), so an operation
 * the plan runs in LL moves its small steps as LL words here too (kernels
 * poll them in the pinned memory; a host thread decodes them through a
 * plain stage of its own, src/coll/prims.c). The receiver says so in its
 * connect info (CFX_SHM_FLAG_LL) and the sender sizes the FIFO by it.
 */
#include "transports/shm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "src/util/check.h"
#include "src/util/cuda.h"
#include "src/util/error.h"
#include "src/util/host.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"
#include "transports/shm/wire.h"

CFX_PARAM_INT(shm_disable, "SHM_DISABLE", 0, 0, 1,
              "1: never use shared memory between ranks of one host (sockets instead)");

/* Between connect_check calls of a waiting connect. */
#define CHECK_EVERY_NS (50 * CFX_NS_PER_MS)

/* Per-connector state. */
struct shm_conn {
    enum cfx_shm_kind kind;
    void *base;
    size_t bytes;
    int memfd; /* Receiver, CFX_SHM_KIND_MEMFD: open until the sender has mapped it; else -1. */
    int peer_pid;
    int pinned;     /* CFX_SHM_KIND_MEMFD: this side's mapping is registered, device + 1; else 0. */
    int host_slots; /* The slots follow the control block (shm); 0: control block only (p2p). */
    int ll;         /* LL slots follow the payload slots (a GPU rank's FIFO). */
};
_Static_assert(sizeof(struct shm_conn) <= CFX_SHM_CONN_BYTES, "see transports/shm/shm.h");

/* Per-communicator state. */
struct shm_ctx {
    int rank;
    uint64_t probe; /* The word receivers read once to test read_peer. */
    int64_t connect_timeout_s;
    const int *abort_flag;
    cfxResult_t (*connect_check)(void *arg, int peer_rank); /* May be NULL. */
    void *connect_check_arg;
};

/* The core's verdict on a peer we wait for or cannot reach (gone, gave up,
 * out of time), or cfxSuccess. */
static cfxResult_t check_peer(const struct shm_ctx *ctx, int peer_rank)
{
    return ctx->connect_check ? ctx->connect_check(ctx->connect_check_arg, peer_rank) : cfxSuccess;
}

/* ------------------------------------------------------------ lifecycle */

static cfxResult_t shm_init(const struct cfx_transport_env *env, void **ctx_p)
{
    struct shm_ctx *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_SHM, "shm: out of memory");
    ctx->rank = env->rank;
    ctx->connect_timeout_s = env->connect_timeout_s;
    ctx->abort_flag = env->abort_flag;
    ctx->connect_check = env->connect_check;
    ctx->connect_check_arg = env->connect_check_arg;
    ctx->probe = 0x436f6e666c757800ull ^ ((uint64_t)getpid() << 8) ^ (uint64_t)(uintptr_t)ctx;
    *ctx_p = ctx;
    return cfxSuccess;
}

static void shm_fini(void *ctx)
{
    free(ctx);
}

static int ctx_self_rank(void *ctx_v)
{
    return ctx_v ? ((struct shm_ctx *)ctx_v)->rank : -1;
}

/* ----------------------------------------------------------- connection */

static int shm_can_connect(void *ctx, const struct cfx_transport_peer *self,
                           const struct cfx_transport_peer *peer)
{
    (void)ctx;
    return !param_shm_disable() && self->host_hash == peer->host_hash;
}

/* The control block, its payload slots (shm) and its LL slots (a GPU
 * rank's FIFO), in one block. */
static size_t fifo_bytes(size_t slot_bytes, int n_steps, int host_slots, int ll)
{
    size_t payload_end = cfx_fifo_slots_offset() + (host_slots ? slot_bytes * (size_t)n_steps : 0);
    return host_slots && ll ? cfx_ll_block_bytes(payload_end, n_steps) : payload_end;
}

/* The view of a control block at @p base; its slots follow it, or (p2p)
 * they are wherever the caller put them (conn->slots, NULL until then);
 * then its LL slots, if it has them. */
static void attach_fifo(struct cfx_connector *conn, const struct shm_conn *sc, void *base,
                        size_t slot_bytes, int n_steps)
{
    cfx_connector_set_fifo(conn, base,
                           sc->host_slots ? (char *)base + cfx_fifo_slots_offset() : conn->slots,
                           slot_bytes, n_steps);
    if (sc->ll)
        cfx_connector_set_ll(conn, base, cfx_fifo_slots_offset() + slot_bytes * (size_t)n_steps);
}

/* Receiver: a fresh, zeroed, pre-faulted FIFO in a memfd whose size is
 * sealed, so the sender can trust that it never shrinks under its mapping. */
static cfxResult_t create_memfd(struct shm_conn *sc, int peer_rank)
{
    int fd = memfd_create("cfx-fifo", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return cfx_error_set_errno(errno, CFX_LOG_SHM,
                                   "shm: cannot create the shared FIFO for rank %d", peer_rank);
    cfxResult_t res = cfxSuccess;
    if (ftruncate(fd, (off_t)sc->bytes) != 0) {
        res = cfx_error_set_errno(errno, CFX_LOG_SHM,
                                  "shm: cannot size the shared FIFO for rank %d to %zu bytes (is "
                                  "memory or the memfd limit exhausted?)",
                                  peer_rank, sc->bytes);
        goto err_close;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        res = cfx_error_set_errno(errno, CFX_LOG_SHM,
                                  "shm: cannot seal the shared FIFO for rank %d", peer_rank);
        goto err_close;
    }
    void *base = mmap(NULL, sc->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) {
        res = cfx_error_set_errno(errno, CFX_LOG_SHM, "shm: cannot map the shared FIFO for rank %d",
                                  peer_rank);
        goto err_close;
    }
    memset(base, 0, sc->bytes); /* Touch every page now, never on the data path. */
    sc->base = base;
    sc->memfd = fd;
    sc->kind = CFX_SHM_KIND_MEMFD;
    return cfxSuccess;
err_close:
    close(fd);
    return res;
}

static void close_memfd(struct shm_conn *sc)
{
    if (sc->memfd >= 0)
        close(sc->memfd);
    sc->memfd = -1;
}

/* For a GPU rank's side: register this side's view of the FIFO with CUDA
 * (a memfd mapping of its own; process-local memory once for both sides). */
static cfxResult_t pin(struct cfx_connector *conn, struct shm_conn *sc)
{
    if (conn->place.mem != CFX_MEM_HOST_PINNED)
        return cfxSuccess;
    int32_t device_plus_1 = conn->place.device + 1;
    if (sc->kind != CFX_SHM_KIND_LOCAL) {
        CFX_CHECK(cfx_cuda_host_register(sc->base, sc->bytes, conn->place.device));
        sc->pinned = device_plus_1;
        return cfxSuccess;
    }
    /* Process-local: the first side registers it (-1 while it does). */
    struct cfx_fifo *fifo = sc->base;
    int32_t seen = 0;
    if (!cfx_cas_i32(&fifo->pinned, &seen, -1)) {
        while (seen == -1)
            seen = cfx_load_acquire_i32(&fifo->pinned); /* The other side is registering. */
        return seen > 0 ? cfxSuccess
                        : cfx_error_set(cfxSystemError, CFX_LOG_SHM,
                                        "shm: rank %d could not pin the FIFO it shares with this "
                                        "rank",
                                        conn->peer_rank);
    }
    cfxResult_t res = cfx_cuda_host_register(sc->base, sc->bytes, conn->place.device);
    cfx_store_release_i32(&fifo->pinned, res == cfxSuccess ? device_plus_1 : 0);
    return res;
}

cfxResult_t cfx_shm_fifo_setup(void *ctx_v, const struct cfx_transport_peer *peer,
                               size_t slot_bytes, int n_steps, struct cfx_connector *conn,
                               void *info_out, size_t priv_bytes, int host_slots)
{
    /* Host memory (pinned for a GPU rank): a FIFO in device memory is
     * another transport's business. */
    if (conn->place.mem == CFX_MEM_DEVICE)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_SHM,
                             "shm: cannot place a FIFO in device memory (device %d, connection "
                             "with rank %d)",
                             conn->place.device, peer->rank);
    if (conn->place.reader == CFX_READER_KERNEL && conn->place.mem != CFX_MEM_HOST_PINNED)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_SHM,
                             "shm: cannot have a FIFO read by a kernel in pageable host memory "
                             "(device %d, connection with rank %d); it must be pinned",
                             conn->place.device, peer->rank);
    struct shm_conn *sc = calloc(1, priv_bytes);
    if (sc == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_SHM, "shm: out of memory");
    conn->priv = sc;
    sc->peer_pid = peer->pid;
    sc->memfd = -1;
    sc->host_slots = host_slots;
    struct cfx_shm_info info = {.kind = CFX_SHM_KIND_NONE};
    if (conn->dir == CFX_CONN_RECV) {
        /* A GPU rank's FIFO has LL slots (its sender learns it from the info). */
        sc->ll = host_slots && conn->place.mem == CFX_MEM_HOST_PINNED;
        info.flags = sc->ll ? CFX_SHM_FLAG_LL : 0;
        sc->bytes = fifo_bytes(slot_bytes, n_steps, host_slots, sc->ll);
        if (peer->pid == (int)getpid()) {
            /* Threads of one process: plain page-aligned memory. */
            void *base = NULL;
            if (posix_memalign(&base, 4096, sc->bytes) != 0)
                return cfx_error_set(cfxSystemError, CFX_LOG_SHM,
                                     "shm: out of memory for a %zu-byte FIFO", sc->bytes);
            memset(base, 0, sc->bytes);
            /* Freed by whichever side closes last. */
            cfx_store_relaxed_i32(&((struct cfx_fifo *)base)->refs, 1);
            sc->base = base;
            sc->kind = CFX_SHM_KIND_LOCAL;
            info.local_addr = (uint64_t)(uintptr_t)base;
        } else {
            cfxResult_t res = create_memfd(sc, peer->rank);
            if (res != cfxSuccess)
                return res;
            info.pid = (int32_t)getpid();
            info.fd = sc->memfd;
        }
        info.kind = sc->kind;
        info.bytes = sc->bytes;
        attach_fifo(conn, sc, sc->base, slot_bytes, n_steps);
        cfxResult_t res = pin(conn, sc);
        if (res == cfxSuccess && sc->ll)
            res = cfx_connector_ll_stage_init(conn);
        if (res != cfxSuccess)
            return res;
    } else {
        /* The sender learns the geometry from its own request. */
        conn->slot_bytes = slot_bytes;
        conn->n_steps = n_steps;
        struct shm_ctx *ctx = ctx_v;
        info.probe_addr = (uint64_t)(uintptr_t)&ctx->probe;
        info.probe_value = ctx->probe;
    }
    memcpy(info_out, &info, sizeof(info));
    return cfxSuccess;
}

static cfxResult_t shm_setup(void *ctx_v, const struct cfx_transport_peer *peer, size_t slot_bytes,
                             int n_steps, struct cfx_connector *conn, void *info_out)
{
    return cfx_shm_fifo_setup(ctx_v, peer, slot_bytes, n_steps, conn, info_out,
                              sizeof(struct shm_conn), 1);
}

/* Sender: open the receiver's memfd through /proc and map it. Only a
 * sealed file of exactly the FIFO's size is accepted: whatever the
 * descriptor turns out to be, a mapping of it cannot fault later. */
static cfxResult_t map_peer_memfd(const struct shm_ctx *ctx, struct cfx_connector *conn,
                                  struct shm_conn *sc, const struct cfx_shm_info *info)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)info->pid, (int)info->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        /* A receiver that died after sending its connect info took the
         * descriptor with it: that, not permissions, is then the cause. */
        cfxResult_t why = check_peer(ctx, conn->peer_rank);
        if (why != cfxSuccess)
            return why;
        /* ENOENT: the process no longer holds the descriptor it announced
         * (it keeps it until this side attaches): it is exiting, its
         * descriptors already closed, though not yet seen as ended. A
         * permission problem reads EACCES or EPERM instead. */
        if ((kill(info->pid, 0) != 0 && errno == ESRCH) || err == ENOENT) {
            conn->blame_rank = conn->peer_rank;
            return cfx_error_set(cfxRemoteError, CFX_LOG_SHM,
                                 "rank %d (pid %d) died while connecting: the process exited or "
                                 "was killed",
                                 conn->peer_rank, (int)info->pid);
        }
        return cfx_error_set_errno(err, CFX_LOG_SHM,
                                   "shm: cannot open rank %d's shared FIFO (%s); ranks of one "
                                   "host must run as the same user in one PID namespace, else "
                                   "set CFX_SHM_DISABLE=1",
                                   conn->peer_rank, path);
    }
    cfxResult_t res = cfxSuccess;
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != info->bytes ||
        seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) != (F_SEAL_SHRINK | F_SEAL_SEAL)) {
        res = cfx_error_set(cfxInternalError, CFX_LOG_SHM,
                            "shm: %s is not the sealed %llu-byte FIFO rank %d described", path,
                            (unsigned long long)info->bytes, conn->peer_rank);
        goto out_close;
    }
    void *base = mmap(NULL, info->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (base == MAP_FAILED) {
        res = cfx_error_set_errno(errno, CFX_LOG_SHM, "shm: cannot map rank %d's shared FIFO",
                                  conn->peer_rank);
        goto out_close;
    }
    sc->kind = CFX_SHM_KIND_MEMFD;
    sc->base = base;
    sc->bytes = info->bytes;
out_close:
    close(fd); /* The mapping keeps the memory. */
    return res;
}

/* Sender: map the receiver's FIFO, then say so (the receiver then lets go of
 * its descriptor). */
static cfxResult_t connect_send(const struct shm_ctx *ctx, struct cfx_connector *conn,
                                struct shm_conn *sc, const struct cfx_shm_info *info)
{
    sc->ll = (info->flags & CFX_SHM_FLAG_LL) != 0;
    const char *why =
        sc->ll && !sc->host_slots
            ? "LL slots in a FIFO whose slots are not host memory"
            : cfx_shm_info_refusal(
                  info, fifo_bytes(conn->slot_bytes, conn->n_steps, sc->host_slots, sc->ll),
                  sc->peer_pid, sc->peer_pid == (int)getpid());
    if (why != NULL)
        return cfx_error_set(cfxInternalError, CFX_LOG_SHM,
                             "shm: rank %d described its FIFO with %s", conn->peer_rank, why);
    if (info->kind == CFX_SHM_KIND_LOCAL) {
        sc->kind = CFX_SHM_KIND_LOCAL;
        sc->base = (void *)(uintptr_t)info->local_addr;
        cfx_fetch_add_i32(&((struct cfx_fifo *)sc->base)->refs, 1);
    } else {
        cfxResult_t res = map_peer_memfd(ctx, conn, sc, info);
        if (res != cfxSuccess)
            return res;
    }
    attach_fifo(conn, sc, sc->base, conn->slot_bytes, conn->n_steps);
    CFX_CHECK(pin(conn, sc));
    if (sc->ll)
        CFX_CHECK(cfx_connector_ll_stage_init(conn));
    cfx_store_release_i32(&conn->fifo->attached, 1);
    return cfxSuccess;
}

/* Receiver: whether it may read the sender's memory (one trial read of the
 * word the sender named). Failing is not an error: the FIFO still works. */
static int peer_readable(struct cfx_connector *conn, struct shm_conn *sc,
                         const struct cfx_shm_info *info)
{
    uint64_t word = ~info->probe_value;
    if (info->probe_addr == 0)
        return 0;
    if (sc->kind == CFX_SHM_KIND_LOCAL)
        return 1; /* Threads of one process read each other's memory. */
    struct iovec local = {.iov_base = &word, .iov_len = sizeof(word)};
    struct iovec far = {.iov_base = (void *)(uintptr_t)info->probe_addr, .iov_len = sizeof(word)};
    ssize_t got = process_vm_readv(sc->peer_pid, &local, 1, &far, 1, 0);
    int ok = got == (ssize_t)sizeof(word) && word == info->probe_value;
    CFX_INFO(CFX_LOG_SHM, "shm: single-copy reads of rank %d's memory %s%s%s", conn->peer_rank,
             ok ? "work" : "are not possible (",
             ok ? "" : (got < 0 ? strerror(errno) : "wrong word"),
             ok ? "" : "); large allgathers go through the FIFO");
    return ok;
}

cfxResult_t cfx_shm_fifo_connect(void *ctx_v, struct cfx_connector *conn, const void *peer_info)
{
    struct shm_conn *sc = conn->priv;
    struct cfx_shm_info info;
    memcpy(&info, peer_info, sizeof(info));
    struct shm_ctx *ctx = ctx_v;
    if (conn->dir == CFX_CONN_SEND)
        return connect_send(ctx, conn, sc, &info);
    /* Receiver: wait until the sender has mapped the FIFO; then the
     * descriptor it opened is no longer needed. */
    int64_t deadline = cfx_time_deadline_s(ctx->connect_timeout_s);
    int64_t next_check = cfx_time_now_ns() + CHECK_EVERY_NS;
    while (!cfx_load_acquire_i32(&conn->fifo->attached)) {
        if (cfx_time_now_ns() >= next_check) {
            cfxResult_t why = check_peer(ctx, conn->peer_rank);
            if (why != cfxSuccess)
                return why;
            next_check = cfx_time_now_ns() + CHECK_EVERY_NS;
        }
        if (ctx->abort_flag && __atomic_load_n(ctx->abort_flag, __ATOMIC_ACQUIRE))
            return cfx_error_set(cfxRemoteError, CFX_LOG_SHM, "shm: connect to rank %d aborted",
                                 conn->peer_rank);
        if (cfx_time_now_ns() > deadline)
            return cfx_error_set(cfxTimeout, CFX_LOG_SHM,
                                 "shm: rank %d never mapped the shared FIFO it was given; is it "
                                 "still running?",
                                 conn->peer_rank);
        usleep(100);
    }
    close_memfd(sc);
    conn->peer_readable = peer_readable(conn, sc, &info);
    return cfxSuccess;
}

void cfx_shm_fifo_close(void *ctx_v, struct cfx_connector *conn)
{
    (void)ctx_v;
    struct shm_conn *sc = conn->priv;
    if (sc == NULL)
        return;
    if (conn->fifo) {
        /* A side that leaves blames itself: its peer must not wait for it. */
        int32_t expected = 0;
        cfx_cas_i32(&conn->fifo->closed, &expected,
                    cfxRemoteError | ((ctx_self_rank(ctx_v) + 1) << 8));
    }
    close_memfd(sc);
    if (sc->kind == CFX_SHM_KIND_MEMFD && sc->base) {
        if (sc->pinned > 0)
            cfx_cuda_host_unregister(sc->base, sc->pinned - 1);
        munmap(sc->base, sc->bytes);
    } else if (sc->kind == CFX_SHM_KIND_LOCAL && sc->base) {
        struct cfx_fifo *fifo = sc->base;
        if (cfx_fetch_add_i32(&fifo->refs, -1) == 1) {
            int32_t pinned = cfx_load_acquire_i32(&fifo->pinned);
            if (pinned > 0)
                cfx_cuda_host_unregister(sc->base, pinned - 1);
            free(sc->base);
        }
    }
    if (sc->ll)
        cfx_connector_stage_fini(conn);
    free(sc);
    cfx_connector_forget(conn);
}

/* ------------------------------------------------------------ data path */

/* fifo->closed: 0, or the reason in the low byte and blame_rank + 1 above. */
static int closed_code(cfxResult_t reason, int blame_rank)
{
    return (reason == cfxSuccess ? cfxRemoteError : (int)reason) | ((blame_rank + 1) << 8);
}

/* The first side to fail records why; the peer's check() reports it. */
void cfx_shm_fifo_poison(void *ctx_v, struct cfx_connector *conn, cfxResult_t reason,
                         int blame_rank)
{
    (void)ctx_v;
    if (conn->fifo == NULL)
        return;
    int32_t expected = 0;
    cfx_cas_i32(&conn->fifo->closed, &expected, closed_code(reason, blame_rank));
}

/* Why the connector is broken (a side closed or poisoned it, or the peer
 * process is gone), or cfxSuccess; @p closed: fifo->closed. */
static cfxResult_t broken(struct cfx_connector *conn, struct shm_conn *sc, int closed)
{
    if (closed) {
        cfxResult_t reason = (cfxResult_t)(closed & 0xff);
        conn->blame_rank = (closed >> 8) - 1;
        if (reason == cfxInvalidUsage)
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_SHM,
                                 "rank %d stopped because rank %d found mismatched collectives "
                                 "(rank %d's error says which)",
                                 conn->peer_rank, conn->blame_rank, conn->blame_rank);
        if (reason == cfxTimeout)
            return cfx_error_set(cfxTimeout, CFX_LOG_SHM,
                                 "rank %d stopped because an operation timed out waiting for "
                                 "rank %d",
                                 conn->peer_rank, conn->blame_rank);
        return cfx_error_set(cfxRemoteError, CFX_LOG_SHM,
                             "rank %d failed or left (reported by rank %d, its neighbour on this "
                             "connection)",
                             conn->blame_rank, conn->peer_rank);
    }
    /* A process killed outright closes nothing: ask the kernel. */
    if (sc->peer_pid != (int)getpid() && kill(sc->peer_pid, 0) != 0 && errno == ESRCH) {
        conn->blame_rank = conn->peer_rank;
        return cfx_error_set(cfxRemoteError, CFX_LOG_SHM,
                             "rank %d (pid %d) is gone: the process exited or was killed",
                             conn->peer_rank, sc->peer_pid);
    }
    return cfxSuccess;
}

cfxResult_t cfx_shm_fifo_check(void *ctx_v, struct cfx_connector *conn)
{
    (void)ctx_v;
    int closed = cfx_load_acquire_i32(&conn->fifo->closed);
    /* Slots posted before the peer left are still good: let them be taken. */
    if (closed && conn->dir == CFX_CONN_RECV && cfx_conn_can_take(conn))
        return cfxSuccess;
    return broken(conn, conn->priv, closed);
}

/* Copy @p bytes at @p remote in the peer's memory into @p dst. A peer that
 * failed may have let go of the buffer it announced: then its failure is
 * the error, not the address. */
static cfxResult_t read_peer(struct cfx_connector *conn, struct shm_conn *sc, void *dst,
                             uint64_t remote, size_t bytes)
{
    if (sc->kind == CFX_SHM_KIND_LOCAL) {
        memcpy(dst, (const void *)(uintptr_t)remote, bytes); /* A thread of this process. */
        return cfxSuccess;
    }
    size_t done = 0;
    while (done < bytes) {
        struct iovec local = {.iov_base = (char *)dst + done, .iov_len = bytes - done};
        struct iovec far = {.iov_base = (void *)(uintptr_t)(remote + done),
                            .iov_len = bytes - done};
        ssize_t got = process_vm_readv(sc->peer_pid, &local, 1, &far, 1, 0);
        if (got > 0) {
            done += (size_t)got;
            continue;
        }
        int err = got < 0 ? errno : 0;
        if (err == EINTR)
            continue;
        cfxResult_t why = broken(conn, sc, cfx_load_acquire_i32(&conn->fifo->closed));
        if (why != cfxSuccess)
            return why;
        conn->blame_rank = conn->peer_rank;
        if (err == ESRCH) /* Killed and not yet reaped: kill(pid, 0) still finds it. */
            return cfx_error_set(cfxRemoteError, CFX_LOG_SHM,
                                 "rank %d (pid %d) is gone: the process exited or was killed",
                                 conn->peer_rank, sc->peer_pid);
        return cfx_error_set(cfxInternalError, CFX_LOG_SHM,
                             "shm: cannot read %zu bytes at 0x%llx of rank %d's memory (%s); the "
                             "address it announced is not readable",
                             bytes - done, (unsigned long long)(remote + done), conn->peer_rank,
                             err ? strerror(err) : "nothing read");
    }
    return cfxSuccess;
}

static cfxResult_t shm_read_peer(void *ctx_v, struct cfx_connector *conn, void *dst,
                                 uint64_t remote, size_t bytes)
{
    (void)ctx_v;
    return read_peer(conn, conn->priv, dst, remote, bytes);
}

/* ---------------------------------------------------------------- memory */

/* Threads of one process share an address space: the peer's address is
 * already a pointer here. Another process's memory would need a mapping
 * shm does not make (read_peer copies it instead). */
static cfxResult_t shm_map_peer(void *ctx_v, struct cfx_connector *conn, uint64_t remote,
                                size_t bytes, void **ptr_p)
{
    (void)ctx_v;
    struct shm_conn *sc = conn->priv;
    if (sc == NULL || conn->fifo == NULL)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_SHM,
                             "shm: the connection with rank %d is not connected: nothing to map",
                             conn->peer_rank);
    if (sc->kind != CFX_SHM_KIND_LOCAL)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_SHM,
                             "shm: cannot map rank %d's memory: it is another process (pid %d), "
                             "and shm maps peer memory only between threads of one process",
                             conn->peer_rank, sc->peer_pid);
    cfxResult_t why = broken(conn, sc, cfx_load_acquire_i32(&conn->fifo->closed));
    if (why != cfxSuccess)
        return why;
    if (remote == 0 || remote + bytes < remote)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_SHM,
                             "shm: rank %d's address 0x%llx (+%zu bytes) is not memory",
                             conn->peer_rank, (unsigned long long)remote, bytes);
    *ptr_p = (void *)(uintptr_t)remote;
    return cfxSuccess;
}

const struct cfx_transport cfx_shm_transport = {
    .version = CFX_TRANSPORT_VERSION,
    .name = "shm",
    /* map_peer between threads of one process; FIFOs a kernel can poll
     * (pinned, for GPU ranks). */
    .flags = CFX_TRANSPORT_FLAG_PEER_MAP | CFX_TRANSPORT_FLAG_READER_KERNEL,
    /* lifecycle */
    .init = shm_init,
    .fini = shm_fini,
    /* connection */
    .can_connect = shm_can_connect,
    .setup = shm_setup,
    .connect = cfx_shm_fifo_connect,
    .close = cfx_shm_fifo_close,
    /* data path */
    .kick = NULL,
    .poison = cfx_shm_fifo_poison,
    .check = cfx_shm_fifo_check,
    .read_peer = shm_read_peer,
    /* memory: registration and flushes have nothing to do for host memory */
    .reg_mem = NULL,
    .dereg_mem = NULL,
    .flush = NULL,
    .map_peer = shm_map_peer,
};
