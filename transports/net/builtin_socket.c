/*
 * Conflux's built-in socket net: an ncclNet_v9-shaped table over TCP, the
 * first network behind the net driver's one internal interface (the face
 * in conn.h that external NCCL plugins sit behind too). CFX_NET_PLUGIN=
 * builtin:socket selects it; no library is loaded. The socket transport
 * stays the default between hosts until this path matches it (see
 * docs/transports.md, "net-plugin").
 *
 * One device: the interface CFX_SOCKET_IFNAME (and CFX_SOCKET_FAMILY)
 * picks, as for the bootstrap and the socket transport. Every call keeps
 * the contract of NCCL's net API:
 *   - listen binds that interface's address, port 0, and writes it into the
 *     handle with a random nonce; connect and accept never block: they
 *     return a NULL comm until the connection is there and its hello (the
 *     magic and the listener's nonce) has gone across, and a connection
 *     whose hello is wrong is dropped, never accepted;
 *   - isend/irecv queue a request (NULL when the comm's BSN_MAX_REQUESTS
 *     are taken: call again) and never block; test moves bytes, in posting
 *     order, with non-blocking system calls: the sender writes as many
 *     queued messages as the kernel takes in one sendmsg, the receiver reads
 *     ahead into a small buffer while it waits for a message's header and
 *     reads large payloads straight into the receive's buffer;
 *   - on the wire each message is an 8-byte size then its bytes; a message
 *     larger than the receive posted for it fails the receiving comm
 *     (ncclInvalidUsage), a peer that closed or reset fails it
 *     (ncclRemoteError), and a failed comm stays failed;
 *   - memory: host memory only (ptrSupport NCCL_PTR_HOST); regMr has
 *     nothing to pin and returns a handle that only marks the buffer as
 *     registered.
 *
 * Threads: the driver never calls into one comm from two threads at once;
 * the device table is written once, by init, before any other call.
 */
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "src/util/socket.h"
#include "transports/net/builtin.h"

#define BSN_MAGIC        0x4346584e45544231ull /* "CFXNETB1" */
#define BSN_MAX_REQUESTS 32                    /* Outstanding per comm. */
#define BSN_READ_AHEAD   8192 /* Receiver's buffer for headers and small payloads. */
#define BSN_DIRECT_MIN   4096 /* A payload remainder at least this long is read in place. */
#define BSN_MAX_IOV      64   /* iovecs in one sendmsg: 32 messages' header and payload. */
#define BSN_DEFAULT_MBPS 10000

static ncclDebugLogger_t logger;
static int n_devs;
static char dev_name[IF_NAMESIZE];
static char dev_pci[256];
static int dev_speed = BSN_DEFAULT_MBPS;
static union cfx_sockaddr dev_addr;

#define BSN_WARN(...) bsn_log(NCCL_LOG_WARN, __LINE__, __VA_ARGS__)
#define BSN_INFO(...) bsn_log(NCCL_LOG_INFO, __LINE__, __VA_ARGS__)

__attribute__((format(printf, 3, 4))) static void bsn_log(ncclDebugLogLevel level, int line,
                                                          const char *fmt, ...);

/* What listen writes and connect reads (the caller's NCCL_NET_HANDLE_MAXSIZE
 * bytes); the connect stage lives in the caller's copy, so that repeated
 * connect calls with the same handle pick up where the last one stopped. */
struct bsn_handle {
    uint64_t magic;
    uint64_t nonce;
    struct cfx_sockaddr_wire addr;
    /* The sender's stage: 0 none yet, 1 connecting, 2 hello partly sent. */
    int32_t stage;
    int32_t fd;
    int32_t hello_sent;
};
_Static_assert(sizeof(struct bsn_handle) <= NCCL_NET_HANDLE_MAXSIZE, "fits the handle");

struct bsn_hello {
    uint64_t magic;
    uint64_t nonce;
};

struct bsn_listen {
    int fd;
    uint64_t nonce;
    int pending_fd; /* An accepted connection whose hello is still coming; -1: none. */
    size_t hello_got;
    struct bsn_hello hello;
};

struct bsn_comm;

struct bsn_request {
    struct bsn_comm *comm;
    int used;     /* Handed to the caller, not yet tested done. */
    int done;     /* Every byte moved. */
    char *data;   /* The caller's buffer. */
    size_t bytes; /* Send: the message's size; receive: the buffer's. */
    /* Send: bytes of header then payload written. Receive: payload bytes
     * read, once the header is in (have_size). */
    size_t moved;
    uint64_t size; /* Send: the header (the size, as it goes); receive: the message's size. */
    int have_size;
};

struct bsn_comm {
    int fd;
    int is_send;
    ncclResult_t failed; /* Sticky once not ncclSuccess. */
    struct bsn_request req[BSN_MAX_REQUESTS];
    /* The requests not yet done, in posting order: order[head..tail). */
    int order[BSN_MAX_REQUESTS];
    unsigned head, tail;
    /* Receiver: bytes read ahead, rbuf[rpos..rlen). */
    size_t rpos, rlen;
    char rbuf[BSN_READ_AHEAD];
};

static char registered_mark; /* Its address is every regMr handle. */

static void bsn_log(ncclDebugLogLevel level, int line, const char *fmt, ...)
{
    if (logger == NULL)
        return;
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    logger(level, NCCL_LOG_SUBSYS_NET, "transports/net/builtin_socket.c", line, "%s", text);
}

/* The interface's speed from sysfs (Mbps), or the default for one that has
 * none (loopback, most virtual interfaces); its PCI path, or "". */
static void read_sysfs(const char *ifname)
{
    char path[128], text[64];
    snprintf(path, sizeof(path), "/sys/class/net/%s/speed", ifname);
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        if (fgets(text, sizeof(text), f) != NULL && atoi(text) > 0)
            dev_speed = atoi(text);
        fclose(f);
    }
    snprintf(path, sizeof(path), "/sys/class/net/%s/device", ifname);
    if (realpath(path, dev_pci) == NULL)
        dev_pci[0] = '\0';
}

static ncclResult_t bsn_init(ncclDebugLogger_t log_function)
{
    logger = log_function;
    if (n_devs > 0)
        return ncclSuccess;
    char ifname[IF_NAMESIZE];
    if (cfx_socket_pick_address(&dev_addr, ifname, sizeof(ifname)) != cfxSuccess) {
        BSN_WARN("no interface for the built-in socket net (CFX_SOCKET_IFNAME)");
        return ncclSystemError;
    }
    snprintf(dev_name, sizeof(dev_name), "%s", ifname);
    read_sysfs(ifname);
    n_devs = 1;
    char where[80];
    cfx_socket_addr_format(&dev_addr, where, sizeof(where));
    BSN_INFO("built-in socket net: device 0 is %s (%s, %d Mbps)", dev_name, where, dev_speed);
    return ncclSuccess;
}

static ncclResult_t bsn_devices(int *ndev)
{
    *ndev = n_devs;
    return ncclSuccess;
}

static ncclResult_t bsn_get_properties(int dev, ncclNetProperties_v9_t *props)
{
    if (dev != 0 || n_devs == 0)
        return ncclInvalidArgument;
    memset(props, 0, sizeof(*props));
    props->name = dev_name;
    props->pciPath = dev_pci[0] ? dev_pci : NULL;
    props->guid = 0;
    props->ptrSupport = NCCL_PTR_HOST;
    props->speed = dev_speed;
    props->latency = 0;
    props->maxComms = 65536;
    props->maxRecvs = 1;
    props->netDeviceType = NCCL_NET_DEVICE_HOST;
    props->vProps.ndevs = 1;
    props->vProps.devs[0] = 0;
    props->maxP2pBytes = (size_t)1 << 31;
    props->maxCollBytes = (size_t)1 << 31;
    return ncclSuccess;
}

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static ncclResult_t bsn_listen(int dev, void *handle_v, void **listen_comm)
{
    if (dev != 0 || n_devs == 0)
        return ncclInvalidArgument;
    struct bsn_listen *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return ncclSystemError;
    union cfx_sockaddr bound;
    if (cfx_socket_listen(&dev_addr, &l->fd, &bound) != cfxSuccess) {
        BSN_WARN("built-in socket net: cannot listen on %s", dev_name);
        free(l);
        return ncclSystemError;
    }
    if (getrandom(&l->nonce, sizeof(l->nonce), 0) != (ssize_t)sizeof(l->nonce))
        l->nonce = (uint64_t)(uintptr_t)l ^ (uint64_t)getpid() << 32;
    l->pending_fd = -1;
    struct bsn_handle *handle = handle_v;
    memset(handle, 0, sizeof(*handle));
    handle->magic = BSN_MAGIC;
    handle->nonce = l->nonce;
    cfx_socket_addr_to_wire(&bound, &handle->addr);
    handle->fd = -1;
    *listen_comm = l;
    return ncclSuccess;
}

static struct bsn_comm *comm_new(int fd, int is_send)
{
    struct bsn_comm *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->fd = fd;
    c->is_send = is_send;
    for (int i = 0; i < BSN_MAX_REQUESTS; i++)
        c->req[i].comm = c;
    return c;
}

/* A failed system call's errno as a result: the peer's end is gone, or not. */
static ncclResult_t errno_result(int err)
{
    return err == ECONNRESET || err == EPIPE || err == ECONNREFUSED || err == ETIMEDOUT ||
                   err == EHOSTUNREACH
               ? ncclRemoteError
               : ncclSystemError;
}

/* Ends a connect attempt kept in @p handle. */
static ncclResult_t connect_fail(struct bsn_handle *handle, const char *what, int err)
{
    BSN_WARN("built-in socket net: connect failed (%s: %s)", what, strerror(err));
    if (handle->fd >= 0)
        close(handle->fd);
    handle->fd = -1;
    handle->stage = 0;
    return errno_result(err);
}

static ncclResult_t bsn_connect(int dev, void *handle_v, void **send_comm,
                                ncclNetDeviceHandle_v9_t **send_dev_comm)
{
    struct bsn_handle *handle = handle_v;
    *send_comm = NULL;
    if (send_dev_comm != NULL)
        *send_dev_comm = NULL;
    if (dev != 0 || handle->magic != BSN_MAGIC)
        return ncclInvalidArgument;
    if (handle->stage == 0) {
        union cfx_sockaddr addr;
        if (cfx_socket_addr_from_wire(&handle->addr, &addr) != cfxSuccess)
            return ncclInvalidArgument;
        int fd = socket(addr.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return connect_fail(handle, "socket", errno);
        handle->fd = fd;
        set_nodelay(fd);
        if (connect(fd, &addr.sa, cfx_socket_addr_len(&addr)) != 0 && errno != EINPROGRESS)
            return connect_fail(handle, "connect", errno);
        handle->stage = 1;
        handle->hello_sent = 0;
    }
    if (handle->stage == 1) {
        struct pollfd pfd = {.fd = handle->fd, .events = POLLOUT};
        if (poll(&pfd, 1, 0) <= 0)
            return ncclSuccess; /* Still connecting. */
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(handle->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
        if (err != 0)
            return connect_fail(handle, "connect", err);
        handle->stage = 2;
    }
    struct bsn_hello hello = {.magic = BSN_MAGIC, .nonce = handle->nonce};
    while (handle->hello_sent < (int)sizeof(hello)) {
        ssize_t n = send(handle->fd, (char *)&hello + handle->hello_sent,
                         sizeof(hello) - (size_t)handle->hello_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return ncclSuccess;
        if (n < 0)
            return connect_fail(handle, "hello", errno);
        handle->hello_sent += (int)n;
    }
    struct bsn_comm *c = comm_new(handle->fd, 1);
    if (c == NULL)
        return connect_fail(handle, "out of memory", ENOMEM);
    handle->fd = -1;
    handle->stage = 0;
    *send_comm = c;
    return ncclSuccess;
}

static ncclResult_t bsn_accept(void *listen_comm, void **recv_comm,
                               ncclNetDeviceHandle_v9_t **recv_dev_comm)
{
    struct bsn_listen *l = listen_comm;
    *recv_comm = NULL;
    if (recv_dev_comm != NULL)
        *recv_dev_comm = NULL;
    for (;;) {
        if (l->pending_fd < 0) {
            int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ||
                           errno == ECONNABORTED))
                return ncclSuccess;
            if (fd < 0) {
                BSN_WARN("built-in socket net: accept failed: %s", strerror(errno));
                return ncclSystemError;
            }
            set_nodelay(fd);
            l->pending_fd = fd;
            l->hello_got = 0;
        }
        while (l->hello_got < sizeof(l->hello)) {
            ssize_t n = recv(l->pending_fd, (char *)&l->hello + l->hello_got,
                             sizeof(l->hello) - l->hello_got, MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return ncclSuccess;
            if (n <= 0)
                break; /* Gone before its hello: drop it. */
            l->hello_got += (size_t)n;
        }
        if (l->hello_got == sizeof(l->hello) && l->hello.magic == BSN_MAGIC &&
            l->hello.nonce == l->nonce) {
            struct bsn_comm *c = comm_new(l->pending_fd, 0);
            if (c == NULL)
                return ncclSystemError;
            l->pending_fd = -1;
            *recv_comm = c;
            return ncclSuccess;
        }
        BSN_WARN("built-in socket net: dropped a connection to %s that did not say hello",
                 dev_name);
        close(l->pending_fd);
        l->pending_fd = -1;
    }
}

static ncclResult_t bsn_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle)
{
    (void)comm, (void)data, (void)size;
    if (type != NCCL_PTR_HOST)
        return ncclInvalidArgument;
    *mhandle = &registered_mark;
    return ncclSuccess;
}

static ncclResult_t bsn_dereg_mr(void *comm, void *mhandle)
{
    (void)comm;
    return mhandle == &registered_mark ? ncclSuccess : ncclInvalidArgument;
}

/* A free request of @p c queued last in posting order, or NULL. */
static struct bsn_request *request_queue(struct bsn_comm *c)
{
    if (c->tail - c->head == BSN_MAX_REQUESTS)
        return NULL;
    for (int i = 0; i < BSN_MAX_REQUESTS; i++) {
        struct bsn_request *r = &c->req[i];
        if (!r->used) {
            r->used = 1;
            r->done = 0;
            r->moved = 0;
            r->have_size = 0;
            c->order[c->tail++ % BSN_MAX_REQUESTS] = i;
            return r;
        }
    }
    return NULL; /* Every request is done but not tested yet. */
}

static ncclResult_t comm_fail(struct bsn_comm *c, ncclResult_t res, const char *what, int err)
{
    if (c->failed == ncclSuccess) {
        c->failed = res;
        BSN_WARN("built-in socket net: %s %s%s%s", c->is_send ? "send" : "receive", what,
                 err ? ": " : "", err ? strerror(err) : "");
    }
    return c->failed;
}

/* Sender: writes queued messages, as many as the kernel takes. */
static ncclResult_t send_progress(struct bsn_comm *c)
{
    while (c->head != c->tail) {
        struct iovec iov[BSN_MAX_IOV];
        int n_iov = 0;
        for (unsigned k = c->head; k != c->tail && n_iov + 2 <= BSN_MAX_IOV; k++) {
            struct bsn_request *r = &c->req[c->order[k % BSN_MAX_REQUESTS]];
            size_t moved = r->moved;
            if (moved < sizeof(r->size)) {
                iov[n_iov++] = (struct iovec){(char *)&r->size + moved, sizeof(r->size) - moved};
                moved = sizeof(r->size);
            }
            size_t sent = moved - sizeof(r->size);
            if (sent < r->bytes)
                iov[n_iov++] = (struct iovec){r->data + sent, r->bytes - sent};
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n_iov};
        ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return ncclSuccess;
        if (n < 0)
            return comm_fail(c, errno_result(errno), "failed", errno);
        size_t left = (size_t)n;
        while (c->head != c->tail) {
            struct bsn_request *r = &c->req[c->order[c->head % BSN_MAX_REQUESTS]];
            size_t need = sizeof(r->size) + r->bytes - r->moved;
            if (left < need) {
                r->moved += left;
                break;
            }
            left -= need;
            r->moved += need;
            r->done = 1;
            c->head++;
        }
    }
    return ncclSuccess;
}

/* Receiver: reads into the read-ahead buffer; 0 when nothing came. */
static ssize_t read_ahead(struct bsn_comm *c)
{
    if (c->rpos > 0) {
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    ssize_t n = recv(c->fd, c->rbuf + c->rlen, sizeof(c->rbuf) - c->rlen, MSG_DONTWAIT);
    if (n > 0)
        c->rlen += (size_t)n;
    return n;
}

static ncclResult_t recv_progress(struct bsn_comm *c)
{
    while (c->head != c->tail) {
        struct bsn_request *r = &c->req[c->order[c->head % BSN_MAX_REQUESTS]];
        ssize_t n = 1;
        if (!r->have_size) {
            if (c->rlen - c->rpos < sizeof(r->size))
                n = read_ahead(c);
            if (c->rlen - c->rpos >= sizeof(r->size)) {
                memcpy(&r->size, c->rbuf + c->rpos, sizeof(r->size));
                c->rpos += sizeof(r->size);
                r->have_size = 1;
                if (r->size > r->bytes) {
                    char what[96];
                    snprintf(what, sizeof(what), "got a message of %llu bytes for a receive of %zu",
                             (unsigned long long)r->size, r->bytes);
                    return comm_fail(c, ncclInvalidUsage, what, 0);
                }
            }
        } else if (c->rpos < c->rlen) {
            size_t take = c->rlen - c->rpos;
            if (take > r->size - r->moved)
                take = (size_t)(r->size - r->moved);
            memcpy(r->data + r->moved, c->rbuf + c->rpos, take);
            c->rpos += take;
            r->moved += take;
        } else if (r->size - r->moved >= BSN_DIRECT_MIN) {
            n = recv(c->fd, r->data + r->moved, (size_t)(r->size - r->moved), MSG_DONTWAIT);
            if (n > 0)
                r->moved += (size_t)n;
        } else if (r->moved < r->size) {
            n = read_ahead(c);
        }
        if (r->have_size && r->moved == r->size) {
            r->done = 1;
            c->head++;
            continue;
        }
        if (n == 0)
            return comm_fail(c, ncclRemoteError, "failed: the peer closed the connection", 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return ncclSuccess;
        if (n < 0)
            return comm_fail(c, errno_result(errno), "failed", errno);
    }
    return ncclSuccess;
}

static ncclResult_t bsn_isend(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                              void **request)
{
    (void)tag, (void)mhandle;
    struct bsn_comm *c = send_comm;
    *request = NULL;
    if (c->failed != ncclSuccess)
        return c->failed;
    struct bsn_request *r = request_queue(c);
    if (r == NULL)
        return ncclSuccess;
    r->data = data;
    r->bytes = size;
    r->size = size;
    *request = r;
    return send_progress(c);
}

static ncclResult_t bsn_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                              void **mhandles, void **request)
{
    (void)tags, (void)mhandles;
    struct bsn_comm *c = recv_comm;
    *request = NULL;
    if (n != 1)
        return ncclInvalidArgument; /* maxRecvs is 1. */
    if (c->failed != ncclSuccess)
        return c->failed;
    struct bsn_request *r = request_queue(c);
    if (r == NULL)
        return ncclSuccess;
    r->data = data[0];
    r->bytes = sizes[0];
    *request = r;
    return ncclSuccess;
}

static ncclResult_t bsn_test(void *request, int *done, int *sizes)
{
    struct bsn_request *r = request;
    struct bsn_comm *c = r->comm;
    *done = 0;
    if (!r->done) {
        ncclResult_t res = c->is_send ? send_progress(c) : recv_progress(c);
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

static ncclResult_t bsn_close_comm(void *comm)
{
    struct bsn_comm *c = comm;
    if (c != NULL) {
        close(c->fd);
        free(c);
    }
    return ncclSuccess;
}

static ncclResult_t bsn_close_listen(void *listen_comm)
{
    struct bsn_listen *l = listen_comm;
    if (l != NULL) {
        close(l->fd);
        if (l->pending_fd >= 0)
            close(l->pending_fd);
        free(l);
    }
    return ncclSuccess;
}

const ncclNet_v9_t cfx_net_builtin_socket = {
    .name = "Socket",
    .init = bsn_init,
    .devices = bsn_devices,
    .getProperties = bsn_get_properties,
    .listen = bsn_listen,
    .connect = bsn_connect,
    .accept = bsn_accept,
    .regMr = bsn_reg_mr,
    .regMrDmaBuf = NULL,
    .deregMr = bsn_dereg_mr,
    .isend = bsn_isend,
    .irecv = bsn_irecv,
    .iflush = NULL,
    .test = bsn_test,
    .closeSend = bsn_close_comm,
    .closeRecv = bsn_close_comm,
    .closeListen = bsn_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = NULL,
};
