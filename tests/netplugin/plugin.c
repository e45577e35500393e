/*
 * cfxtest: an NCCL net plugin for Conflux's tests only (never installed).
 * One device, "lo", over plain TCP on 127.0.0.1: listen binds an ephemeral
 * port and writes it into the handle; connect and accept never block (the
 * comm stays NULL until the socket is there; connect always returns NULL on
 * its first call, so callers must retry); isend/irecv queue a request
 * (NULL when the comm's table of CFXTEST_MAX_REQUESTS is full) and test
 * moves bytes, in posting order, without blocking. On the wire each message
 * is an 8-byte size then its bytes; size 0 is allowed; a message larger
 * than the receive posted for it is an error (ncclInternalError), and so is
 * anything after the peer went away (ncclRemoteError).
 *
 * Knobs for failure tests, read at init: CFXTEST_NDEV=n reports n
 * devices ("lo", "lo1", ...; default 1, 0 for none), CFXTEST_FAIL_AFTER_SENDS=n
 * makes every isend after the first n of this process fail with
 * ncclSystemError. CFXTEST_PTR_CUDA=1 says the devices move CUDA memory too
 * (NCCL_PTR_CUDA) and registers it like host memory: the plugin still
 * moves bytes with the CPU, so this is for fake-cuda only, whose device
 * memory is host memory. iflush of CUDA memory returns a request that is
 * done at its second test; of host memory, none. CFXTEST_LAZY_CUDA=1
 * plays a NIC whose writes into GPU memory are not visible before a flush:
 * a receive into CUDA memory reports done with its bytes hidden (kept
 * aside, 0xa5 in their place) until an iflush of that buffer completes, so
 * a caller that reads them earlier reads garbage. CFXTEST_DMABUF=1 (with
 * CFXTEST_PTR_CUDA=1) says the devices take dma-bufs (NCCL_PTR_DMABUF) and
 * checks each regMrDmaBuf's descriptor. CFXTEST_PCI_PATHS="a;b;..." gives
 * the devices those PCI paths (props.pciPath; unset: none), for the
 * loader's merging by distance; CFXTEST_VDEV_FAIL=1 makes every
 * makeVDevice fail (ncclInternalError). CFXTEST_RENDEZVOUS=1
 * plays an RDMA NIC's rendezvous: a message leaves only once its receive
 * is posted at the other end (each irecv sends the sender a one-byte
 * clear-to-send back over the connection, which the sender must have read
 * before it starts the message), so a protocol that posts its receives
 * late pays a round trip per message, as over NCCL's ib plugin.
 *
 * Built four times, as plugins for several NCCL releases are:
 * libnccl-net-cfxtest.so exports ncclNetPlugin_v11, _v10 and _v9 (a
 * loader must take the newest), libnccl-net-cfxtest10.so (CFXTEST_V10)
 * _v10 and _v9, libnccl-net-cfxtest9.so (CFXTEST_V9) _v9 only, and
 * libnccl-net-cfxtest8.so (CFXTEST_V8) _v8 only. The v11 table checks that
 * listen and connect get the context its init made, and the v10 one that
 * connect gets a config; either fails the call (ncclInvalidArgument, with
 * a warning) when not.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transports/net/nccl_net.h"

#define CFXTEST_MAX_REQUESTS 8
/* Every table's name field: the build's name. */
#if defined(CFXTEST_V10)
#define CFXTEST_NAME "cfxtest10"
#elif defined(CFXTEST_V9)
#define CFXTEST_NAME "cfxtest9"
#else
#define CFXTEST_NAME "cfxtest"
#endif
#define CFXTEST_MAGIC 0x74786663u /* "cfxt" */

static ncclDebugLogger_t logger;
static int n_devices = 1;
static long fail_after_sends = -1; /* -1: never. */
static int ptr_cuda;               /* CFXTEST_PTR_CUDA=1. */
static int lazy_cuda;              /* CFXTEST_LAZY_CUDA=1. */
static int rendezvous;             /* CFXTEST_RENDEZVOUS=1. */
static int dmabuf;                 /* CFXTEST_DMABUF=1 (with CFXTEST_PTR_CUDA). */
static char pci_paths[8][128];     /* CFXTEST_PCI_PATHS, per device ("": none). */
static int vdev_fail;              /* CFXTEST_VDEV_FAIL=1. */
static _Atomic long sends;         /* isends of this process (any thread). */

#define LOG_WARN(...)                                                                              \
    do {                                                                                           \
        if (logger)                                                                                \
            logger(NCCL_LOG_WARN, NCCL_LOG_SUBSYS_NET, __FILE__, __LINE__, __VA_ARGS__);           \
    } while (0)

/* The handle: where to connect, and the connect's own state between calls. */
struct handle {
    uint32_t magic;
    uint32_t addr; /* Network order. */
    uint16_t port; /* Network order. */
    int stage;     /* 0: not started, 1: connect in progress. */
    int fd;
};
_Static_assert(sizeof(struct handle) <= NCCL_NET_HANDLE_MAXSIZE, "fits the handle");

struct comm;

struct request {
    struct comm *comm;
    int used;
    int done;
    char *data;
    size_t size;     /* Send: bytes; receive: the most accepted. */
    uint64_t header; /* Send: size; receive: the size that came. */
    size_t moved;    /* Bytes of header and data moved so far. */
    int flush;       /* An iflush's request: done at its second test. */
    int flush_tests;
    int cuda;    /* A receive into memory registered as CUDA memory. */
    int cleared; /* CFXTEST_RENDEZVOUS: a send that took its clear-to-send. */
};

/* CFXTEST_LAZY_CUDA: a receive's bytes not yet flushed into place. */
struct hidden {
    char *data; /* NULL: free entry. */
    size_t size;
    char *saved;
};

struct comm {
    int fd;
    int is_send;
    ncclResult_t error; /* Sticky. */
    struct request reqs[CFXTEST_MAX_REQUESTS];
    int queue[CFXTEST_MAX_REQUESTS]; /* Unfinished requests, in posting order. */
    int q_first, q_len;
    struct hidden hidden[CFXTEST_MAX_REQUESTS];
    /* CFXTEST_RENDEZVOUS: a receiver's clear-to-send bytes not yet
     * written; a sender's read and not yet used. */
    int cts_owed;
    int cts_credit;
};

struct listen_comm {
    int fd;
};

/* ============================================================ setup */

static ncclResult_t tp_init(ncclDebugLogger_t log)
{
    logger = log;
    const char *text = getenv("CFXTEST_NDEV");
    if (text != NULL && text[0])
        n_devices = atoi(text);
    n_devices = n_devices < 0 ? 0 : n_devices > 8 ? 8 : n_devices;
    text = getenv("CFXTEST_FAIL_AFTER_SENDS");
    if (text != NULL && text[0])
        fail_after_sends = atol(text);
    text = getenv("CFXTEST_PTR_CUDA");
    ptr_cuda = text != NULL && atoi(text) == 1;
    text = getenv("CFXTEST_LAZY_CUDA");
    lazy_cuda = text != NULL && atoi(text) == 1;
    text = getenv("CFXTEST_RENDEZVOUS");
    rendezvous = text != NULL && atoi(text) == 1;
    text = getenv("CFXTEST_DMABUF");
    dmabuf = ptr_cuda && text != NULL && atoi(text) == 1;
    text = getenv("CFXTEST_VDEV_FAIL");
    vdev_fail = text != NULL && atoi(text) == 1;
    text = getenv("CFXTEST_PCI_PATHS");
    for (int d = 0; text != NULL && *text && d < 8; d++) {
        size_t len = strcspn(text, ";");
        snprintf(pci_paths[d], sizeof(pci_paths[d]), "%.*s", (int)len, text);
        text += len + (text[len] == ';');
    }
    if (logger)
        logger(NCCL_LOG_INFO, NCCL_LOG_SUBSYS_NET, __FILE__, __LINE__,
               "cfxtest plugin: %d device(s) over TCP on %s", n_devices, "127.0.0.1");
    return ncclSuccess;
}

/* Virtual devices (makeVDevice, v9 and later): device n_devices + k is
 * the k-th, made of vdev_members[k]. They move bytes as device 0 does (one
 * TCP connection: this plugin does not stripe), and say so when used. */
#define CFXTEST_MAX_VDEVS 4
static int n_vdevs;
static ncclNetVDeviceProps_v9_t vdev_members[CFXTEST_MAX_VDEVS];
static char vdev_names[CFXTEST_MAX_VDEVS][64];

static ncclResult_t tp_devices(int *ndev)
{
    *ndev = n_devices + n_vdevs;
    return ncclSuccess;
}

static char *dev_names[] = {"lo", "lo1", "lo2", "lo3", "lo4", "lo5", "lo6", "lo7"};

/* Whether @p dev is a device of ours (a caller passing anything else gets
 * ncclInvalidArgument); a virtual one says so at INFO. */
static int dev_ok(int dev, const char *call)
{
    if (dev < 0 || dev >= n_devices + n_vdevs) {
        LOG_WARN("cfxtest plugin: %s on device %d, which does not exist", call, dev);
        return 0;
    }
    if (dev >= n_devices && logger)
        logger(NCCL_LOG_INFO, NCCL_LOG_SUBSYS_NET, __FILE__, __LINE__,
               "cfxtest plugin: %s on virtual device %d (%s)", call, dev,
               vdev_names[dev - n_devices]);
    return 1;
}

__attribute__((unused)) static ncclResult_t tp_make_vdevice(int *d, ncclNetVDeviceProps_v9_t *props)
{
    if (d == NULL || props == NULL || props->ndevs < 1 ||
        props->ndevs > NCCL_NET_MAX_DEVS_PER_NIC_V9 || n_vdevs == CFXTEST_MAX_VDEVS)
        return ncclInvalidArgument;
    if (vdev_fail) {
        LOG_WARN("cfxtest plugin: makeVDevice fails on purpose (CFXTEST_VDEV_FAIL=1)");
        return ncclInternalError;
    }
    char *name = vdev_names[n_vdevs];
    name[0] = '\0';
    for (int i = 0; i < props->ndevs; i++) {
        if (props->devs[i] < 0 || props->devs[i] >= n_devices)
            return ncclInvalidArgument; /* Only physical devices merge. */
        size_t used = strlen(name);
        snprintf(name + used, 64 - used, "%s%s", i ? "+" : "", dev_names[props->devs[i]]);
    }
    vdev_members[n_vdevs] = *props;
    *d = n_devices + n_vdevs++;
    return ncclSuccess;
}

static ncclResult_t tp_listen(int dev, void *handle_v, void **listen_comm)
{
    if (!dev_ok(dev, "listen"))
        return ncclInvalidArgument;
    struct handle *handle = handle_v;
    memset(handle_v, 0, NCCL_NET_HANDLE_MAXSIZE);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return ncclSystemError;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &len) != 0) {
        LOG_WARN("cfxtest: cannot listen: %s", strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    struct listen_comm *lc = calloc(1, sizeof(*lc));
    if (lc == NULL) {
        close(fd);
        return ncclSystemError;
    }
    lc->fd = fd;
    handle->magic = CFXTEST_MAGIC;
    handle->addr = addr.sin_addr.s_addr;
    handle->port = addr.sin_port;
    handle->fd = -1;
    *listen_comm = lc;
    return ncclSuccess;
}

static struct comm *comm_new(int fd, int is_send)
{
    struct comm *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->fd = fd;
    c->is_send = is_send;
    for (int i = 0; i < CFXTEST_MAX_REQUESTS; i++)
        c->reqs[i].comm = c;
    return c;
}

static ncclResult_t tp_connect_any(int dev, void *handle_v, void **send_comm)
{
    struct handle *handle = handle_v;
    *send_comm = NULL;
    if (!dev_ok(dev, handle->stage == 0 ? "connect" : "connect (again)"))
        return ncclInvalidArgument;
    if (handle->magic != CFXTEST_MAGIC) {
        LOG_WARN("cfxtest: connect to a handle that is not one of ours");
        return ncclInternalError;
    }
    if (handle->stage == 0) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return ncclSystemError;
        struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = handle->port};
        addr.sin_addr.s_addr = handle->addr;
        if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 && errno != EINPROGRESS) {
            LOG_WARN("cfxtest: connect: %s", strerror(errno));
            close(fd);
            return ncclSystemError;
        }
        handle->fd = fd;
        handle->stage = 1;
        return ncclSuccess; /* Always "not yet" once: callers must call again. */
    }
    struct pollfd pfd = {.fd = handle->fd, .events = POLLOUT};
    if (poll(&pfd, 1, 0) <= 0)
        return ncclSuccess;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(handle->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        LOG_WARN("cfxtest: connect: %s", strerror(err ? err : errno));
        close(handle->fd);
        handle->fd = -1;
        handle->stage = 0;
        return ncclSystemError;
    }
    struct comm *c = comm_new(handle->fd, 1);
    if (c == NULL)
        return ncclSystemError;
    handle->stage = 2;
    *send_comm = c;
    return ncclSuccess;
}

static ncclResult_t tp_accept_any(void *listen_comm, void **recv_comm)
{
    struct listen_comm *lc = listen_comm;
    *recv_comm = NULL;
    int fd = accept4(lc->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return ncclSuccess;
        LOG_WARN("cfxtest: accept: %s", strerror(errno));
        return ncclSystemError;
    }
    struct comm *c = comm_new(fd, 0);
    if (c == NULL) {
        close(fd);
        return ncclSystemError;
    }
    *recv_comm = c;
    return ncclSuccess;
}

static ncclResult_t tp_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle)
{
    (void)comm;
    (void)data;
    (void)size;
    if (type != NCCL_PTR_HOST && !(type == NCCL_PTR_CUDA && ptr_cuda))
        return ncclInternalError;
    int *kind = malloc(sizeof(int));
    if (kind == NULL)
        return ncclSystemError;
    *kind = type;
    *mhandle = kind;
    return ncclSuccess;
}

/* CFXTEST_DMABUF: CUDA memory handed over as a dma-buf. The bytes still
 * move through the address (fake-cuda's device memory is host memory);
 * the descriptor must be open, of whole pages, offset 0 as Conflux gives. */
static ncclResult_t tp_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset,
                                     int fd, void **mhandle)
{
    (void)comm;
    (void)data;
    if (!dmabuf || type != NCCL_PTR_CUDA || offset != 0 || size == 0 || size % 4096 != 0 ||
        fcntl(fd, F_GETFD) < 0) {
        LOG_WARN("cfxtest: regMrDmaBuf of %zu bytes, type %d, offset %llu, fd %d refused", size,
                 type, (unsigned long long)offset, fd);
        return ncclInvalidArgument;
    }
    return tp_reg_mr(comm, data, size, type, mhandle);
}

static ncclResult_t tp_dereg_mr(void *comm, void *mhandle)
{
    (void)comm;
    free(mhandle);
    return ncclSuccess;
}

/* ============================================================ requests */

static struct request *request_new(struct comm *c, char *data, size_t size)
{
    if (c->q_len == CFXTEST_MAX_REQUESTS)
        return NULL;
    for (int i = 0; i < CFXTEST_MAX_REQUESTS; i++) {
        struct request *r = &c->reqs[i];
        if (!r->used) {
            *r = (struct request){.comm = c, .used = 1, .data = data, .size = size};
            if (c->is_send)
                r->header = size;
            c->queue[(c->q_first + c->q_len) % CFXTEST_MAX_REQUESTS] = i;
            c->q_len++;
            return r;
        }
    }
    return NULL;
}

/* CFXTEST_RENDEZVOUS: a receiver writes the clear-to-send bytes it owes;
 * a sender reads those that came. Without blocking. */
static ncclResult_t cts_progress(struct comm *c)
{
    while (c->error == ncclSuccess && !c->is_send && c->cts_owed > 0) {
        char bytes[CFXTEST_MAX_REQUESTS] = {0};
        ssize_t n = send(c->fd, bytes, (size_t)c->cts_owed, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            break;
        if (n <= 0) {
            LOG_WARN("cfxtest: clear-to-send: %s", strerror(errno));
            c->error = ncclRemoteError;
            break;
        }
        c->cts_owed -= (int)n;
    }
    while (c->error == ncclSuccess && c->is_send) {
        char bytes[64];
        ssize_t n = recv(c->fd, bytes, sizeof(bytes), MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            break;
        if (n <= 0) {
            LOG_WARN("cfxtest: clear-to-send: %s",
                     n == 0 ? "the peer closed the connection" : strerror(errno));
            c->error = ncclRemoteError;
            break;
        }
        c->cts_credit += (int)n;
    }
    return c->error;
}

/* Move bytes of the oldest unfinished requests, without blocking. */
static ncclResult_t comm_progress(struct comm *c)
{
    if (rendezvous && cts_progress(c) != ncclSuccess)
        return c->error;
    while (c->error == ncclSuccess && c->q_len > 0) {
        struct request *r = &c->reqs[c->queue[c->q_first]];
        if (rendezvous && c->is_send && !r->cleared) {
            if (c->cts_credit == 0)
                return ncclSuccess; /* Its receive is not posted yet. */
            c->cts_credit--;
            r->cleared = 1;
        }
        for (;;) {
            size_t total = sizeof(r->header) + (size_t)r->header;
            if (r->moved >= sizeof(r->header) && r->moved == total)
                break;
            char *at;
            size_t want;
            if (r->moved < sizeof(r->header)) {
                at = (char *)&r->header + r->moved;
                want = sizeof(r->header) - r->moved;
            } else {
                at = r->data + (r->moved - sizeof(r->header));
                want = total - r->moved;
            }
            ssize_t n = c->is_send ? send(c->fd, at, want, MSG_NOSIGNAL | MSG_DONTWAIT)
                                   : recv(c->fd, at, want, MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
                return ncclSuccess;
            if (n <= 0) {
                LOG_WARN("cfxtest: %s: %s", c->is_send ? "send" : "recv",
                         n == 0 ? "the peer closed the connection" : strerror(errno));
                c->error = ncclRemoteError;
                return c->error;
            }
            r->moved += (size_t)n;
            if (!c->is_send && r->moved == sizeof(r->header) && r->header > r->size) {
                LOG_WARN("cfxtest: a %llu-byte message for a %zu-byte receive",
                         (unsigned long long)r->header, r->size);
                c->error = ncclInternalError;
                return c->error;
            }
        }
        r->done = 1;
        c->q_first = (c->q_first + 1) % CFXTEST_MAX_REQUESTS;
        c->q_len--;
    }
    return c->error;
}

static ncclResult_t tp_isend_any(void *send_comm, void *data, size_t size, void *mhandle,
                                 void **request)
{
    (void)mhandle;
    struct comm *c = send_comm;
    *request = NULL;
    if (c->error != ncclSuccess)
        return c->error;
    if (fail_after_sends >= 0 && sends >= fail_after_sends) {
        LOG_WARN("cfxtest: isend fails on purpose after %ld sends (CFXTEST_FAIL_AFTER_SENDS)",
                 sends);
        return ncclSystemError;
    }
    struct request *r = request_new(c, data, size);
    if (r == NULL)
        return ncclSuccess; /* Full: call again later. */
    *request = r;
    sends++;
    return comm_progress(c);
}

static ncclResult_t tp_irecv_any(void *recv_comm, int n, void **data, size_t size, void **mhandles,
                                 void **request)
{
    struct comm *c = recv_comm;
    *request = NULL;
    if (n != 1)
        return ncclInternalError; /* maxRecvs is 1. */
    if (c->error != ncclSuccess)
        return c->error;
    struct request *r = request_new(c, data[0], size);
    if (r == NULL)
        return ncclSuccess;
    r->cuda = mhandles != NULL && mhandles[0] != NULL && *(int *)mhandles[0] == NCCL_PTR_CUDA;
    *request = r;
    if (rendezvous) {
        c->cts_owed++;
        return cts_progress(c);
    }
    return ncclSuccess;
}

static ncclResult_t tp_iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                              void **request)
{
    (void)sizes;
    struct comm *c = recv_comm;
    *request = NULL; /* Host memory: nothing to flush. */
    if (n < 1 || mhandles == NULL || mhandles[0] == NULL || *(int *)mhandles[0] != NCCL_PTR_CUDA)
        return ncclSuccess;
    /* Local: it flushes bytes that are here, also after the peer left. */
    for (int i = 0; i < CFXTEST_MAX_REQUESTS; i++) {
        struct request *r = &c->reqs[i];
        if (!r->used) { /* Not queued: it moves no bytes. */
            memset(r, 0, sizeof(*r));
            r->comm = c;
            r->used = 1;
            r->flush = 1;
            r->data = data[0]; /* The buffer whose hidden bytes it shows. */
            *request = r;
            return ncclSuccess;
        }
    }
    return ncclInternalError; /* More requests than maxRecvs allows. */
}

/* CFXTEST_LAZY_CUDA: the bytes a receive just completed stay out of sight
 * until an iflush of its buffer completes. */
static ncclResult_t hide(struct request *r)
{
    for (int i = 0; i < CFXTEST_MAX_REQUESTS; i++) {
        struct hidden *h = &r->comm->hidden[i];
        if (h->data == NULL) {
            h->saved = malloc(r->header);
            if (h->saved == NULL)
                return ncclSystemError;
            memcpy(h->saved, r->data, r->header);
            memset(r->data, 0xa5, r->header);
            h->data = r->data;
            h->size = r->header;
            return ncclSuccess;
        }
    }
    LOG_WARN("cfxtest: more than %d receives into CUDA memory wait for a flush",
             CFXTEST_MAX_REQUESTS);
    return ncclInternalError;
}

static ncclResult_t tp_test(void *request, int *done, int *sizes)
{
    struct request *r = request;
    if (r->flush) {
        *done = ++r->flush_tests >= 2;
        if (*done) {
            for (int i = 0; i < CFXTEST_MAX_REQUESTS; i++) {
                struct hidden *h = &r->comm->hidden[i];
                if (h->data == r->data) { /* The flush makes them visible. */
                    memcpy(h->data, h->saved, h->size);
                    free(h->saved);
                    h->data = NULL;
                }
            }
            if (sizes)
                *sizes = 0;
            r->used = 0;
        }
        return ncclSuccess;
    }
    ncclResult_t res = comm_progress(r->comm);
    /* A request that completed is done, even when a later one on its comm
     * then failed (a peer that closed after its last message). */
    if (res != ncclSuccess && !r->done)
        return res;
    *done = r->done;
    if (r->done) {
        if (sizes)
            *sizes = (int)r->header;
        r->used = 0;
        if (r->cuda && lazy_cuda && r->header > 0)
            return hide(r);
    }
    return ncclSuccess;
}

static ncclResult_t comm_close(void *comm)
{
    struct comm *c = comm;
    if (c == NULL)
        return ncclSuccess;
    for (int i = 0; i < CFXTEST_MAX_REQUESTS; i++)
        free(c->hidden[i].data ? c->hidden[i].saved : NULL);
    close(c->fd);
    free(c);
    return ncclSuccess;
}

static ncclResult_t tp_close_listen(void *listen_comm)
{
    struct listen_comm *lc = listen_comm;
    if (lc == NULL)
        return ncclSuccess;
    close(lc->fd);
    free(lc);
    return ncclSuccess;
}

/* ============================================================ tables */

#define PLUGIN_EXPORT __attribute__((visibility("default")))

#ifdef CFXTEST_V8

static ncclResult_t tp_properties(int dev, ncclNetProperties_v8_t *props)
{
    if (dev < 0 || dev >= n_devices)
        return ncclInvalidArgument;
    memset(props, 0, sizeof(*props));
    props->name = dev_names[dev];
    props->ptrSupport =
        NCCL_PTR_HOST | (ptr_cuda ? NCCL_PTR_CUDA : 0) | (dmabuf ? NCCL_PTR_DMABUF : 0);
    props->speed = 10000;
    props->maxComms = 65536;
    props->maxRecvs = 1;
    props->netDeviceType = NCCL_NET_DEVICE_HOST;
    return ncclSuccess;
}

static ncclResult_t tp_connect(int dev, void *handle, void **send_comm,
                               ncclNetDeviceHandle_v8_t **dev_comm)
{
    (void)dev_comm;
    return tp_connect_any(dev, handle, send_comm);
}

static ncclResult_t tp_accept(void *listen_comm, void **recv_comm,
                              ncclNetDeviceHandle_v8_t **dev_comm)
{
    (void)dev_comm;
    return tp_accept_any(listen_comm, recv_comm);
}

static ncclResult_t tp_isend(void *send_comm, void *data, int size, int tag, void *mhandle,
                             void **request)
{
    (void)tag;
    if (size < 0)
        return ncclInvalidArgument;
    return tp_isend_any(send_comm, data, (size_t)size, mhandle, request);
}

static ncclResult_t tp_irecv(void *recv_comm, int n, void **data, int *sizes, int *tags,
                             void **mhandles, void **request)
{
    (void)tags;
    if (n != 1 || sizes[0] < 0)
        return ncclInvalidArgument;
    return tp_irecv_any(recv_comm, n, data, (size_t)sizes[0], mhandles, request);
}

PLUGIN_EXPORT const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = "cfxtest8",
    .init = tp_init,
    .devices = tp_devices,
    .getProperties = tp_properties,
    .listen = tp_listen,
    .connect = tp_connect,
    .accept = tp_accept,
    .regMr = tp_reg_mr,
    .regMrDmaBuf = tp_reg_mr_dmabuf,
    .deregMr = tp_dereg_mr,
    .isend = tp_isend,
    .irecv = tp_irecv,
    .iflush = tp_iflush,
    .test = tp_test,
    .closeSend = comm_close,
    .closeRecv = comm_close,
    .closeListen = tp_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
};

#else

static ncclResult_t tp_properties(int dev, ncclNetProperties_v9_t *props)
{
    if (dev < 0 || dev >= n_devices + n_vdevs)
        return ncclInvalidArgument;
    memset(props, 0, sizeof(*props));
    int virtual = dev >= n_devices;
    props->name = virtual ? vdev_names[dev - n_devices] : dev_names[dev];
    props->ptrSupport =
        NCCL_PTR_HOST | (ptr_cuda ? NCCL_PTR_CUDA : 0) | (dmabuf ? NCCL_PTR_DMABUF : 0);
    props->speed = 10000 * (virtual ? vdev_members[dev - n_devices].ndevs : 1);
    props->maxComms = 65536;
    props->maxRecvs = 1;
    props->netDeviceType = NCCL_NET_DEVICE_HOST;
    props->vProps.ndevs = 1;
    props->vProps.devs[0] = dev;
    if (virtual)
        props->vProps = vdev_members[dev - n_devices];
    const char *pci = pci_paths[props->vProps.devs[0]]; /* A virtual device: its first's. */
    props->pciPath = pci[0] ? (char *)pci : NULL;
    props->maxP2pBytes = (size_t)1 << 31;
    props->maxCollBytes = (size_t)1 << 31;
    return ncclSuccess;
}

static ncclResult_t tp_connect(int dev, void *handle, void **send_comm,
                               ncclNetDeviceHandle_v9_t **dev_comm)
{
    (void)dev_comm;
    return tp_connect_any(dev, handle, send_comm);
}

static ncclResult_t tp_accept(void *listen_comm, void **recv_comm,
                              ncclNetDeviceHandle_v9_t **dev_comm)
{
    (void)dev_comm;
    return tp_accept_any(listen_comm, recv_comm);
}

static ncclResult_t tp_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                             void **request)
{
    (void)tag;
    return tp_isend_any(send_comm, data, size, mhandle, request);
}

static ncclResult_t tp_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                             void **mhandles, void **request)
{
    (void)tags;
    if (n != 1)
        return ncclInvalidArgument;
    return tp_irecv_any(recv_comm, n, data, sizes[0], mhandles, request);
}

PLUGIN_EXPORT const ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = CFXTEST_NAME,
    .init = tp_init,
    .devices = tp_devices,
    .getProperties = tp_properties,
    .listen = tp_listen,
    .connect = tp_connect,
    .accept = tp_accept,
    .regMr = tp_reg_mr,
    .regMrDmaBuf = tp_reg_mr_dmabuf,
    .deregMr = tp_dereg_mr,
    .isend = tp_isend,
    .irecv = tp_irecv,
    .iflush = tp_iflush,
    .test = tp_test,
    .closeSend = comm_close,
    .closeRecv = comm_close,
    .closeListen = tp_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = tp_make_vdevice,
};

#ifndef CFXTEST_V9

static ncclResult_t tp_connect10(int dev, ncclNetCommConfig_v10_t *config, void *handle,
                                 void **send_comm, ncclNetDeviceHandle_v10_t **dev_comm)
{
    (void)dev_comm;
    if (config == NULL) {
        LOG_WARN("cfxtest plugin: connect without a config (v10 passes one)");
        return ncclInvalidArgument;
    }
    return tp_connect_any(dev, handle, send_comm);
}

static ncclResult_t tp_isend10(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                               void *phandle, void **request)
{
    (void)tag, (void)phandle;
    return tp_isend_any(send_comm, data, size, mhandle, request);
}

static ncclResult_t tp_irecv10(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                               void **mhandles, void **phandles, void **request)
{
    (void)tags, (void)phandles;
    if (n != 1)
        return ncclInvalidArgument;
    return tp_irecv_any(recv_comm, n, data, sizes[0], mhandles, request);
}

static ncclResult_t tp_init10(ncclDebugLogger_t log, ncclProfilerCallback_t prof)
{
    (void)prof;
    return tp_init(log);
}

PLUGIN_EXPORT const ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = CFXTEST_NAME,
    .init = tp_init10,
    .devices = tp_devices,
    .getProperties = tp_properties, /* v10's record is v9's. */
    .listen = tp_listen,
    .connect = tp_connect10,
    .accept = tp_accept,
    .regMr = tp_reg_mr,
    .regMrDmaBuf = tp_reg_mr_dmabuf,
    .deregMr = tp_dereg_mr,
    .isend = tp_isend10,
    .irecv = tp_irecv10,
    .iflush = tp_iflush,
    .test = tp_test,
    .closeSend = comm_close,
    .closeRecv = comm_close,
    .closeListen = tp_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = tp_make_vdevice,
};

#ifndef CFXTEST_V10

/* The contexts v11's init hands out: their addresses are what listen and
 * connect must get back. */
static int contexts[16];
static _Atomic int n_contexts;

static ncclResult_t tp_init11(void **ctx, uint64_t comm_id, ncclNetCommConfig_v11_t *config,
                              ncclDebugLogger_t log, ncclProfilerCallback_t prof)
{
    (void)comm_id, (void)config, (void)prof;
    int k = atomic_fetch_add(&n_contexts, 1);
    if (ctx == NULL || k >= (int)(sizeof(contexts) / sizeof(contexts[0])))
        return ncclInvalidArgument;
    *ctx = &contexts[k];
    return tp_init(log);
}

static int ctx_known(void *ctx)
{
    for (int k = 0; k < atomic_load(&n_contexts) && k < 16; k++)
        if (ctx == &contexts[k])
            return 1;
    LOG_WARN("cfxtest plugin: a context init did not make (%p)", ctx);
    return 0;
}

static ncclResult_t tp_properties11(int dev, ncclNetProperties_v11_t *props)
{
    ncclNetProperties_v9_t v9;
    ncclResult_t res = tp_properties(dev, &v9);
    if (res != ncclSuccess)
        return res;
    memset(props, 0, sizeof(*props));
    memcpy(props, &v9, sizeof(v9)); /* v11's record is v9's and one more field. */
    props->maxMultiRequestSize = 1;
    return ncclSuccess;
}

static ncclResult_t tp_listen11(void *ctx, int dev, void *handle, void **listen_comm)
{
    return ctx_known(ctx) ? tp_listen(dev, handle, listen_comm) : ncclInvalidArgument;
}

static ncclResult_t tp_connect11(void *ctx, int dev, void *handle, void **send_comm,
                                 ncclNetDeviceHandle_v11_t **dev_comm)
{
    (void)dev_comm;
    return ctx_known(ctx) ? tp_connect_any(dev, handle, send_comm) : ncclInvalidArgument;
}

static ncclResult_t tp_finalize11(void *ctx)
{
    return ctx_known(ctx) ? ncclSuccess : ncclInvalidArgument;
}

PLUGIN_EXPORT const ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = CFXTEST_NAME,
    .init = tp_init11,
    .devices = tp_devices,
    .getProperties = tp_properties11,
    .listen = tp_listen11,
    .connect = tp_connect11,
    .accept = tp_accept,
    .regMr = tp_reg_mr,
    .regMrDmaBuf = tp_reg_mr_dmabuf,
    .deregMr = tp_dereg_mr,
    .isend = tp_isend10,
    .irecv = tp_irecv10,
    .iflush = tp_iflush,
    .test = tp_test,
    .closeSend = comm_close,
    .closeRecv = comm_close,
    .closeListen = tp_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = tp_make_vdevice,
    .finalize = tp_finalize11,
    .setNetAttr = NULL,
};

#endif /* CFXTEST_V10 */
#endif /* CFXTEST_V9 */
#endif /* CFXTEST_V8 */
