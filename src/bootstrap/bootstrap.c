/* Bootstrap: see bootstrap.h for the contract, wire.h for the frames. */
#include "src/bootstrap/bootstrap.h"

#include <errno.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/bootstrap/wire.h"
#include "src/util/check.h"
#include "src/util/error.h"
#include "src/util/host.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"

CFX_PARAM_INT(bootstrap_timeout, "BOOTSTRAP_TIMEOUT", 300, 0, CFX_PARAM_SECONDS_MAX,
              "Seconds a bootstrap step (join, allgather, barrier, message) may take; 0 = forever");
CFX_PARAM_INT(bootstrap_frame_ms, "BOOTSTRAP_FRAME_TIMEOUT_MS", 2000, 1, CFX_PARAM_SECONDS_MAX,
              "Milliseconds a connecting peer has to send its whole greeting");
CFX_PARAM_INT(bootstrap_settle_ms, "BOOTSTRAP_SETTLE_MS", 250, 0, 600000,
              "With CFX_COMM_ID, milliseconds the root waits once every rank joined, so a second "
              "job on the same CFX_COMM_ID is caught by its duplicate claims");
CFX_PARAM_STR_CHECKED(
    comm_id, "COMM_ID", NULL, cfx_socket_addr_param_check,
    "host:port of the root listener; makes every rank produce the same unique id");

#define ROOT_PROBE_NS (300 * CFX_NS_PER_MS) /* A live root's listener answers well within. */

_Static_assert(sizeof(struct cfx_bootstrap_id) <= CFX_UNIQUE_ID_BYTES, "id too large");

struct unexpected_msg {
    struct unexpected_msg *next;
    int src_rank;
    uint32_t tag;
    size_t size;
    char payload[];
};

/* Half-open connections a rank's listener keeps: a peer's header and
 * payload arrive at once, so more than this are idle strangers. */
#define MAX_PENDING_PEERS 32

/* A connection to a rank's listener whose header (then payload) is still
 * arriving. */
struct pending_peer {
    int fd;
    int64_t since_ns;
    size_t got; /* Bytes of the header, then of the payload. */
    struct cfx_bootstrap_peer_hdr hdr;
    struct unexpected_msg *msg; /* Once a message header passed its checks. */
};

struct cfx_bootstrap {
    int rank;
    int nranks;
    uint64_t secret;
    uint64_t owner_nonce; /* Rank 0 with CFX_COMM_ID: proves to the root it started it. */
    const int *abort_flag;
    int listen_fd;
    struct pending_peer pending[MAX_PENDING_PEERS];
    int n_pending;
    union cfx_sockaddr listen_addr;
    struct cfx_sockaddr_wire *table; /* Every rank's listener. */
    int ring_send_fd;                /* To rank+1. */
    int ring_recv_fd;                /* From rank-1. */
    struct unexpected_msg *unexpected;
};

/* Header of each ring step, checked so mismatched callers fail loudly. */
struct ring_hdr {
    uint64_t size;
    uint32_t step;
    uint32_t reserved;
};

int64_t cfx_bootstrap_timeout_s(void)
{
    return param_bootstrap_timeout();
}

int64_t cfx_bootstrap_frame_ns(void)
{
    return param_bootstrap_frame_ms() * CFX_NS_PER_MS;
}

int64_t cfx_bootstrap_settle_ns(void)
{
    return param_bootstrap_settle_ms() * CFX_NS_PER_MS;
}

int cfx_bootstrap_rank(const struct cfx_bootstrap *bs)
{
    return bs->rank;
}

int cfx_bootstrap_nranks(const struct cfx_bootstrap *bs)
{
    return bs->nranks;
}

cfxResult_t cfx_bootstrap_peer_addr(const struct cfx_bootstrap *bs, int peer,
                                    union cfx_sockaddr *addr_p)
{
    if (peer < 0 || peer >= bs->nranks)
        return cfxInvalidArgument;
    return cfx_socket_addr_from_wire(&bs->table[peer], addr_p);
}

static int64_t op_deadline(void)
{
    return cfx_time_deadline_s(param_bootstrap_timeout());
}

static int aborted(const struct cfx_bootstrap *bs)
{
    return bs->abort_flag && __atomic_load_n(bs->abort_flag, __ATOMIC_ACQUIRE);
}

static const char *timeout_hint(void)
{
    return "check that every rank was started and can reach the others, "
           "or raise CFX_BOOTSTRAP_TIMEOUT";
}

/* ------------------------------------------------------------------ ids */

static cfxResult_t id_from_comm_id(const char *text, struct cfx_bootstrap_id *id)
{
    union cfx_sockaddr addr;
    CFX_CHECK(cfx_socket_addr_parse(text, &addr));
    memset(id, 0, sizeof(*id));
    id->magic = CFX_BOOTSTRAP_MAGIC;
    /* Every rank must derive the same id: the secret comes from the text. */
    id->secret = cfx_host_hash(text) ^ UINT64_C(0x9e3779b97f4a7c15);
    id->flags = CFX_BOOTSTRAP_ID_COMM_ID;
    cfx_socket_addr_to_wire(&addr, &id->root);
    return cfxSuccess;
}

static cfxResult_t pick_listen_address(int local, union cfx_sockaddr *addr_p)
{
    if (local) {
        memset(addr_p, 0, sizeof(*addr_p));
        addr_p->sin.sin_family = AF_INET;
        addr_p->sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return cfxSuccess;
    }
    char ifname[64];
    CFX_CHECK(cfx_socket_pick_address(addr_p, ifname, sizeof(ifname)));
    char where[80];
    cfx_socket_addr_format(addr_p, where, sizeof(where));
    CFX_INFO(CFX_LOG_BOOTSTRAP, "bootstrap uses interface %s (%s)", ifname, where);
    return cfxSuccess;
}

cfxResult_t cfx_bootstrap_id_create(cfxUniqueId *id, int local)
{
    struct cfx_bootstrap_id bid;
    const char *comm_id = param_comm_id();
    memset(id, 0, sizeof(*id));
    if (comm_id && comm_id[0] && !local) {
        CFX_CHECK(id_from_comm_id(comm_id, &bid));
        memcpy(id->internal, &bid, sizeof(bid));
        return cfxSuccess;
    }
    memset(&bid, 0, sizeof(bid));
    bid.magic = CFX_BOOTSTRAP_MAGIC;
    bid.flags = local ? CFX_BOOTSTRAP_ID_LOCAL : 0;
    CFX_CHECK(cfx_host_random(&bid.secret, sizeof(bid.secret)));
    union cfx_sockaddr addr;
    CFX_CHECK(pick_listen_address(local, &addr));
    CFX_CHECK(cfx_bootstrap_root_add_id(&addr, bid.secret, &bid.root));
    memcpy(id->internal, &bid, sizeof(bid));
    return cfxSuccess;
}

int cfx_bootstrap_id_valid(const cfxUniqueId *id)
{
    struct cfx_bootstrap_id bid;
    memcpy(&bid, id->internal, sizeof(bid));
    return bid.magic == CFX_BOOTSTRAP_MAGIC;
}

int cfx_bootstrap_id_info(const cfxUniqueId *id, uint64_t *secret_p)
{
    struct cfx_bootstrap_id bid;
    memcpy(&bid, id->internal, sizeof(bid));
    *secret_p = bid.secret;
    return (bid.flags & CFX_BOOTSTRAP_ID_COMM_ID) != 0;
}

/* ------------------------------------------------------------ messages */

static void peer_name(int rank, char *text, size_t size)
{
    snprintf(text, size, "bootstrap peer rank %d", rank);
}

/* A tag in words for error sentences. The users of the bootstrap name a
 * tag by two letters in its high 16 bits and a detail in the low 16; the
 * families known here are the core's (src/core/connect.c, probe.c,
 * blame.c) and this file's own (shrink). */
static void format_tag(uint32_t tag, char *text, size_t size)
{
    static const struct {
        char letters[3];
        const char *meaning;
    } families[] = {{"CN", "connection setup"},
                    {"PR", "mismatch probe"},
                    {"BL", "failure report"},
                    {"SH", "shrink"}};
    char letters[3] = {(char)(tag >> 24), (char)(tag >> 16), '\0'};
    unsigned detail = tag & 0xffffu;
    for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
        if (strcmp(letters, families[i].letters) == 0) {
            snprintf(text, size, "%s \"%s\" 0x%04x", families[i].meaning, letters, detail);
            return;
        }
    }
    if (letters[0] >= 'A' && letters[0] <= 'Z' && letters[1] >= 'A' && letters[1] <= 'Z')
        snprintf(text, size, "tag \"%s\" 0x%04x", letters, detail);
    else
        snprintf(text, size, "tag %u", tag);
}

/* Append, so messages of one (peer, tag) are matched in order. */
static void queue_append(struct cfx_bootstrap *bs, struct unexpected_msg *msg)
{
    struct unexpected_msg **tail = &bs->unexpected;
    while (*tail)
        tail = &(*tail)->next;
    msg->next = NULL;
    *tail = msg;
}

static void pending_drop(struct cfx_bootstrap *bs, int index, const char *why)
{
    struct pending_peer *conn = &bs->pending[index];
    if (why != NULL)
        CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap rank %d: closed a connection: %s", bs->rank, why);
    close(conn->fd);
    free(conn->msg);
    bs->pending[index] = bs->pending[--bs->n_pending];
}

/* Read what connection @p index has sent; file it once complete (a ring
 * link, or a message into the unexpected queue) and set *filed_p. */
static cfxResult_t pending_read(struct cfx_bootstrap *bs, int index, int *filed_p)
{
    struct pending_peer *conn = &bs->pending[index];
    int in_payload = conn->msg != NULL;
    char *buf = in_payload ? conn->msg->payload : (char *)&conn->hdr;
    size_t want = in_payload ? conn->msg->size : sizeof(conn->hdr);
    if (conn->got < want) {
        ssize_t n = recv(conn->fd, buf + conn->got, want - conn->got, 0);
        if (n == 0) {
            pending_drop(bs, index, "peer closed before finishing its greeting or message");
            return cfxSuccess;
        }
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                pending_drop(bs, index, "receive error");
            return cfxSuccess;
        }
        conn->got += (size_t)n;
        if (conn->got < want)
            return cfxSuccess;
    }
    if (in_payload) {
        struct unexpected_msg *msg = conn->msg;
        conn->msg = NULL;
        pending_drop(bs, index, NULL);
        queue_append(bs, msg);
        *filed_p = 1;
        return cfxSuccess;
    }
    const char *why = cfx_bootstrap_peer_hdr_refusal(&conn->hdr, bs->secret, bs->rank, bs->nranks,
                                                     bs->ring_recv_fd >= 0);
    if (why != NULL) {
        pending_drop(bs, index, why);
        return cfxSuccess;
    }
    if (conn->hdr.kind == CFX_BOOTSTRAP_KIND_RING) {
        int one = 1;
        setsockopt(conn->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        bs->ring_recv_fd = conn->fd;
        bs->pending[index] = bs->pending[--bs->n_pending];
        *filed_p = 1;
        return cfxSuccess;
    }
    struct unexpected_msg *msg = malloc(sizeof(*msg) + conn->hdr.size);
    if (msg == NULL) {
        pending_drop(bs, index, "out of memory");
        return cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP,
                             "bootstrap rank %d: out of memory for a %llu-byte message", bs->rank,
                             (unsigned long long)conn->hdr.size);
    }
    *msg = (struct unexpected_msg){
        .src_rank = conn->hdr.src_rank, .tag = conn->hdr.tag, .size = conn->hdr.size};
    conn->msg = msg;
    conn->got = 0;
    return pending_read(bs, index, filed_p);
}

/* Accept every connection waiting on the listener. A full table of
 * half-open connections closes its oldest, an idle stranger: a peer sends
 * its header as soon as it connects. */
static cfxResult_t accept_waiting(struct cfx_bootstrap *bs, int *filed_p)
{
    for (;;) {
        int fd = accept4(bs->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return cfxSuccess;
            return cfx_error_set_errno(errno, CFX_LOG_BOOTSTRAP,
                                       "bootstrap rank %d: cannot accept a peer's connection "
                                       "(for too many open files, raise `ulimit -n`)",
                                       bs->rank);
        }
        if (bs->n_pending == MAX_PENDING_PEERS) {
            int oldest = 0;
            for (int i = 1; i < bs->n_pending; i++)
                if (bs->pending[i].since_ns < bs->pending[oldest].since_ns)
                    oldest = i;
            pending_drop(bs, oldest, "too many half-open connections; closed the oldest");
        }
        int index = bs->n_pending++;
        bs->pending[index] = (struct pending_peer){.fd = fd, .since_ns = cfx_time_now_ns()};
        CFX_CHECK(pending_read(bs, index, filed_p));
    }
}

/* Serve the listener until a connection was filed (a ring link, or a
 * message into the unexpected queue) or @p deadline_ns passes: cfxTimeout
 * then, without a sentence (the caller knows whom it waited for). Each pass
 * accepts what waits and reads what arrived without blocking, so a deadline
 * of "now" still takes in what is already here. A stranger that does not
 * greet within CFX_BOOTSTRAP_FRAME_TIMEOUT_MS is closed; no stranger ever
 * moves the deadline. */
static cfxResult_t serve_listener(struct cfx_bootstrap *bs, int64_t deadline_ns)
{
    int64_t frame_ns = cfx_bootstrap_frame_ns();
    struct pollfd fds[MAX_PENDING_PEERS + 1];
    for (;;) {
        int filed = 0;
        for (int i = bs->n_pending - 1; i >= 0; i--)
            CFX_CHECK(pending_read(bs, i, &filed));
        CFX_CHECK(accept_waiting(bs, &filed));
        if (filed)
            return cfxSuccess;
        int64_t now = cfx_time_now_ns();
        for (int i = bs->n_pending - 1; i >= 0; i--)
            if (now - bs->pending[i].since_ns > frame_ns)
                pending_drop(bs, i,
                             "greeting or message not finished in time (slow or idle "
                             "sender)");
        if (aborted(bs))
            return cfx_error_set(cfxRemoteError, CFX_LOG_BOOTSTRAP, "bootstrap rank %d: aborted",
                                 bs->rank);
        if (now >= deadline_ns)
            return cfxTimeout;
        int n_fds = 0;
        fds[n_fds++] = (struct pollfd){.fd = bs->listen_fd, .events = POLLIN};
        for (int i = 0; i < bs->n_pending; i++)
            fds[n_fds++] = (struct pollfd){.fd = bs->pending[i].fd, .events = POLLIN};
        poll(fds, (nfds_t)n_fds, cfx_time_left_ms(deadline_ns, 100));
    }
}

static cfxResult_t connect_peer(struct cfx_bootstrap *bs, int peer, uint32_t kind, uint32_t tag,
                                uint64_t size, int64_t deadline_ns, int *fd_p)
{
    union cfx_sockaddr addr;
    if (cfx_socket_addr_from_wire(&bs->table[peer], &addr) != cfxSuccess)
        return cfx_error_set(cfxInternalError, CFX_LOG_BOOTSTRAP,
                             "bootstrap: no address for rank %d", peer);
    int fd;
    CFX_CHECK(cfx_socket_connect(&addr, deadline_ns, bs->abort_flag, &fd));
    struct cfx_bootstrap_peer_hdr hdr = {.magic = CFX_BOOTSTRAP_MAGIC,
                                         .secret = bs->secret,
                                         .kind = kind,
                                         .src_rank = bs->rank,
                                         .tag = tag,
                                         .size = size};
    char name[48];
    peer_name(peer, name, sizeof(name));
    cfxResult_t res = cfx_socket_send_all(fd, &hdr, sizeof(hdr), deadline_ns, bs->abort_flag, name);
    if (res != cfxSuccess) {
        close(fd);
        return res;
    }
    *fd_p = fd;
    return cfxSuccess;
}

static cfxResult_t connect_ring(struct cfx_bootstrap *bs)
{
    if (bs->nranks == 1)
        return cfxSuccess;
    int64_t deadline = op_deadline();
    int next = (bs->rank + 1) % bs->nranks;
    CFX_CHECK(connect_peer(bs, next, CFX_BOOTSTRAP_KIND_RING, 0, 0, deadline, &bs->ring_send_fd));
    while (bs->ring_recv_fd < 0) {
        cfxResult_t res = serve_listener(bs, deadline);
        if (res == cfxTimeout)
            return cfx_error_set(cfxTimeout, CFX_LOG_BOOTSTRAP,
                                 "bootstrap rank %d: rank %d never connected its ring link; %s",
                                 bs->rank, (bs->rank + bs->nranks - 1) % bs->nranks,
                                 timeout_hint());
        CFX_CHECK(res);
    }
    return cfxSuccess;
}

/* Send and receive at once on two sockets, so large steps cannot deadlock. */
static cfxResult_t sendrecv(struct cfx_bootstrap *bs, const char *send_buf, char *recv_buf,
                            size_t size, int64_t deadline_ns)
{
    size_t sent = 0, got = 0;
    int prev = (bs->rank + bs->nranks - 1) % bs->nranks;
    int next = (bs->rank + 1) % bs->nranks;
    char prev_name[48], next_name[48];
    peer_name(prev, prev_name, sizeof(prev_name));
    peer_name(next, next_name, sizeof(next_name));
    while (sent < size || got < size) {
        struct pollfd fds[2] = {{.fd = bs->ring_send_fd, .events = sent < size ? POLLOUT : 0},
                                {.fd = bs->ring_recv_fd, .events = got < size ? POLLIN : 0}};
        if (bs->abort_flag && __atomic_load_n(bs->abort_flag, __ATOMIC_ACQUIRE))
            return cfx_error_set(cfxRemoteError, CFX_LOG_BOOTSTRAP, "bootstrap rank %d: aborted",
                                 bs->rank);
        if (cfx_time_now_ns() >= deadline_ns)
            return cfx_error_set(cfxTimeout, CFX_LOG_BOOTSTRAP,
                                 "bootstrap rank %d: ring step timed out (sent %zu/%zu to rank "
                                 "%d, received %zu/%zu from rank %d); %s",
                                 bs->rank, sent, size, next, got, size, prev, timeout_hint());
        poll(fds, 2, cfx_time_left_ms(deadline_ns, 100));
        if (sent < size) {
            ssize_t n = send(bs->ring_send_fd, send_buf + sent, size - sent, MSG_NOSIGNAL);
            if (n > 0)
                sent += (size_t)n;
            else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return cfx_error_set(cfxRemoteError, CFX_LOG_BOOTSTRAP,
                                     "bootstrap rank %d: %s is gone (send: %s)", bs->rank,
                                     next_name, strerror(errno));
        }
        if (got < size) {
            ssize_t n = recv(bs->ring_recv_fd, recv_buf + got, size - got, 0);
            if (n > 0)
                got += (size_t)n;
            else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                return cfx_error_set(cfxRemoteError, CFX_LOG_BOOTSTRAP,
                                     "bootstrap rank %d: %s closed the connection", bs->rank,
                                     prev_name);
        }
    }
    return cfxSuccess;
}

cfxResult_t cfx_bootstrap_allgather(struct cfx_bootstrap *bs, void *data, size_t size)
{
    char *base = data;
    int n = bs->nranks;
    int64_t deadline = op_deadline();
    for (int step = 0; step < n - 1; step++) {
        int send_slot = (bs->rank - step + n) % n;
        int recv_slot = (bs->rank - step - 1 + n) % n;
        struct ring_hdr out = {.size = size, .step = (uint32_t)step}, in;
        CFX_CHECK(sendrecv(bs, (const char *)&out, (char *)&in, sizeof(in), deadline));
        if (in.size != size || in.step != (uint32_t)step)
            return cfx_error_set(cfxInternalError, CFX_LOG_BOOTSTRAP,
                                 "bootstrap rank %d: allgather mismatch (%zu bytes, step %d here; "
                                 "%llu bytes, step %u from the previous rank)",
                                 bs->rank, size, step, (unsigned long long)in.size, in.step);
        CFX_CHECK(sendrecv(bs, base + (size_t)send_slot * size, base + (size_t)recv_slot * size,
                           size, deadline));
    }
    return cfxSuccess;
}

cfxResult_t cfx_bootstrap_barrier(struct cfx_bootstrap *bs)
{
    /* An allgather of one byte per rank: every rank has entered when it ends. */
    char stack_bytes[64];
    char *bytes = bs->nranks <= 64 ? stack_bytes : malloc((size_t)bs->nranks);
    if (bytes == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory in barrier");
    bytes[bs->rank] = 1;
    cfxResult_t res = cfx_bootstrap_allgather(bs, bytes, 1);
    if (bytes != stack_bytes)
        free(bytes);
    return res;
}

static cfxResult_t size_mismatch(const struct cfx_bootstrap *bs, int peer, uint32_t tag, size_t got,
                                 size_t expected)
{
    char what[64];
    format_tag(tag, what, sizeof(what));
    return cfx_error_set(cfxInternalError, CFX_LOG_BOOTSTRAP,
                         "bootstrap rank %d: message (%s) from rank %d has %zu bytes, expected %zu",
                         bs->rank, what, peer, got, expected);
}

static struct unexpected_msg *take_unexpected(struct cfx_bootstrap *bs, int peer, uint32_t tag)
{
    for (struct unexpected_msg **link = &bs->unexpected; *link; link = &(*link)->next) {
        if ((*link)->src_rank == peer && (*link)->tag == tag) {
            struct unexpected_msg *msg = *link;
            *link = msg->next;
            return msg;
        }
    }
    return NULL;
}

static cfxResult_t send_until(struct cfx_bootstrap *bs, int peer, uint32_t tag, const void *data,
                              size_t size, int64_t deadline);

cfxResult_t cfx_bootstrap_send(struct cfx_bootstrap *bs, int peer, uint32_t tag, const void *data,
                               size_t size)
{
    return send_until(bs, peer, tag, data, size, op_deadline());
}

cfxResult_t cfx_bootstrap_send_within(struct cfx_bootstrap *bs, int peer, uint32_t tag,
                                      const void *data, size_t size, int timeout_ms)
{
    return send_until(bs, peer, tag, data, size,
                      cfx_time_now_ns() + (int64_t)timeout_ms * CFX_NS_PER_MS);
}

static cfxResult_t send_until(struct cfx_bootstrap *bs, int peer, uint32_t tag, const void *data,
                              size_t size, int64_t deadline)
{
    if (peer < 0 || peer >= bs->nranks)
        return cfx_error_set(cfxInternalError, CFX_LOG_BOOTSTRAP, "bootstrap send to rank %d of %d",
                             peer, bs->nranks);
    if (size > CFX_BOOTSTRAP_MAX_MESSAGE_BYTES)
        return cfx_error_set(cfxInternalError, CFX_LOG_BOOTSTRAP,
                             "bootstrap send of %zu bytes to rank %d: messages carry at most %llu "
                             "(setup data only)",
                             size, peer, (unsigned long long)CFX_BOOTSTRAP_MAX_MESSAGE_BYTES);
    if (peer == bs->rank) {
        struct unexpected_msg *msg = malloc(sizeof(*msg) + size);
        if (msg == NULL)
            return cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory");
        *msg = (struct unexpected_msg){.src_rank = peer, .tag = tag, .size = size};
        memcpy(msg->payload, data, size);
        queue_append(bs, msg);
        return cfxSuccess;
    }
    int fd;
    CFX_CHECK(connect_peer(bs, peer, CFX_BOOTSTRAP_KIND_MESSAGE, tag, size, deadline, &fd));
    char name[48];
    peer_name(peer, name, sizeof(name));
    cfxResult_t res = cfx_socket_send_all(fd, data, size, deadline, bs->abort_flag, name);
    close(fd);
    return res;
}

cfxResult_t cfx_bootstrap_try_recv(struct cfx_bootstrap *bs, int peer, uint32_t tag, void *data,
                                   size_t size, int *got_p)
{
    return cfx_bootstrap_recv_within(bs, peer, tag, data, size, 0, got_p);
}

cfxResult_t cfx_bootstrap_recv_within(struct cfx_bootstrap *bs, int peer, uint32_t tag, void *data,
                                      size_t size, int timeout_ms, int *got_p)
{
    int64_t deadline = cfx_time_now_ns() + (int64_t)timeout_ms * CFX_NS_PER_MS;
    struct unexpected_msg *msg = take_unexpected(bs, peer, tag);
    while (msg == NULL) {
        cfxResult_t res = serve_listener(bs, deadline);
        if (res == cfxTimeout) {
            cfx_error_thread_clear();
            *got_p = 0;
            return cfxSuccess;
        }
        CFX_CHECK(res);
        msg = take_unexpected(bs, peer, tag);
    }
    cfxResult_t res = cfxSuccess;
    if (msg->size != size)
        res = size_mismatch(bs, peer, tag, msg->size, size);
    else
        memcpy(data, msg->payload, size);
    free(msg);
    *got_p = res == cfxSuccess;
    return res;
}

cfxResult_t cfx_bootstrap_recv(struct cfx_bootstrap *bs, int peer, uint32_t tag, void *data,
                               size_t size)
{
    int64_t deadline = op_deadline();
    struct unexpected_msg *msg;
    while ((msg = take_unexpected(bs, peer, tag)) == NULL) {
        cfxResult_t res = serve_listener(bs, deadline);
        if (res == cfxTimeout) {
            char what[64];
            format_tag(tag, what, sizeof(what));
            return cfx_error_set(cfxTimeout, CFX_LOG_BOOTSTRAP,
                                 "bootstrap rank %d: no message (%s) from rank %d; %s", bs->rank,
                                 what, peer, timeout_hint());
        }
        CFX_CHECK(res);
    }
    cfxResult_t res = cfxSuccess;
    if (msg->size != size)
        res = size_mismatch(bs, peer, tag, msg->size, size);
    else
        memcpy(data, msg->payload, size);
    free(msg);
    return res;
}

/* ---------------------------------------------------------- lifecycle */

static cfxResult_t bootstrap_alloc(int rank, int nranks, uint64_t secret, const int *abort_flag,
                                   struct cfx_bootstrap **bs_p)
{
    struct cfx_bootstrap *bs = calloc(1, sizeof(*bs));
    if (bs == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory");
    bs->rank = rank;
    bs->nranks = nranks;
    bs->secret = secret;
    bs->abort_flag = abort_flag;
    bs->listen_fd = bs->ring_send_fd = bs->ring_recv_fd = -1;
    bs->table = calloc((size_t)nranks, sizeof(*bs->table));
    if (bs->table == NULL) {
        free(bs);
        return cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory");
    }
    *bs_p = bs;
    return cfxSuccess;
}

void cfx_bootstrap_destroy(struct cfx_bootstrap *bs)
{
    if (bs == NULL)
        return;
    while (bs->n_pending > 0)
        pending_drop(bs, bs->n_pending - 1, NULL);
    cfx_socket_close(&bs->listen_fd);
    cfx_socket_close(&bs->ring_send_fd);
    cfx_socket_close(&bs->ring_recv_fd);
    while (bs->unexpected) {
        struct unexpected_msg *next = bs->unexpected->next;
        free(bs->unexpected);
        bs->unexpected = next;
    }
    free(bs->table);
    free(bs);
}

/* Describe the ranks missing from a root's table: "3, 5 and 2 more". */
static void list_missing(const struct cfx_sockaddr_wire *table, int nranks, char *text, size_t size)
{
    size_t used = 0;
    int listed = 0, more = 0;
    text[0] = '\0';
    for (int r = 0; r < nranks; r++) {
        if (table[r].family != 0)
            continue;
        if (listed < 16 && used + 16 < size) {
            used += (size_t)snprintf(text + used, size - used, "%s%d", listed ? ", " : "", r);
            listed++;
        } else {
            more++;
        }
    }
    if (more && used + 24 < size)
        snprintf(text + used, size - used, " and %d more", more);
}

/* After the root closed our connection: whether it is gone rather than
 * refusing us. A live root accepts a new connection and waits for its
 * hello; a dead one refuses it, or (still on its way out) resets it. */
static int root_gone(const union cfx_sockaddr *root_addr, const int *abort_flag)
{
    int fd = -1;
    cfxResult_t res =
        cfx_socket_connect(root_addr, cfx_time_now_ns() + ROOT_PROBE_NS, abort_flag, &fd);
    cfx_error_thread_clear();
    if (res != cfxSuccess)
        return res == cfxTimeout;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    char byte;
    int gone = poll(&pfd, 1, (int)(ROOT_PROBE_NS / CFX_NS_PER_MS)) > 0 &&
               recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) <= 0;
    cfx_socket_close(&fd);
    return gone;
}

/* Why a job cannot form, as the root said it (CONFLICT, COMPLETE, NO_FDS). */
static cfxResult_t refused(const struct cfx_bootstrap *bs, const struct cfx_bootstrap_id *bid,
                           const char *root_name, const struct cfx_bootstrap_reply *reply)
{
    const char *hint = (bid->flags & CFX_BOOTSTRAP_ID_COMM_ID)
                           ? "another job may use this CFX_COMM_ID: one job per CFX_COMM_ID "
                             "(give each job its own port; see docs/troubleshooting.md)"
                           : "every rank must pass its own rank and the same nranks, and each "
                             "communicator needs its own unique id";
    if (reply->status == CFX_BOOTSTRAP_NO_FDS)
        return cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP,
                             "bootstrap rank %d: %s ran out of file descriptors (too many open "
                             "files) while the ranks joined; raise `ulimit -n` in its process",
                             bs->rank, root_name);
    if (reply->status == CFX_BOOTSTRAP_COMPLETE)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_BOOTSTRAP,
                             "bootstrap rank %d: %s already has every rank of its job; %s",
                             bs->rank, root_name, hint);
    if (reply->conflict_rank >= 0)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_BOOTSTRAP,
                             "bootstrap rank %d: %s refused the job: rank %d was claimed twice; "
                             "%s",
                             bs->rank, root_name, reply->conflict_rank, hint);
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_BOOTSTRAP,
                         "bootstrap rank %d: %s refused the job: ranks disagree on nranks (%d "
                         "here, %d in another claim); %s",
                         bs->rank, root_name, bs->nranks, reply->conflict_nranks, hint);
}

/* One attempt: connect, greet, read the answer's header. cfxRemoteError
 * without a sentence when the root hung up without answering (it closes
 * strangers, and its oldest half-open connections when flooded): the
 * caller tries again. */
static cfxResult_t greet_root(struct cfx_bootstrap *bs, const struct cfx_bootstrap_id *bid,
                              const union cfx_sockaddr *root_addr, const char *root_name,
                              int64_t deadline, int *fd_p, struct cfx_bootstrap_reply *reply_p)
{
    int fd = -1;
    CFX_CHECK(cfx_socket_connect(root_addr, deadline, bs->abort_flag, &fd));
    struct cfx_bootstrap_hello hello = {.magic = CFX_BOOTSTRAP_MAGIC,
                                        .secret = bid->secret,
                                        .rank = bs->rank,
                                        .nranks = bs->nranks,
                                        .owner_nonce = bs->owner_nonce};
    cfx_socket_addr_to_wire(&bs->listen_addr, &hello.listen_addr);
    cfxResult_t res =
        cfx_socket_send_all(fd, &hello, sizeof(hello), deadline, bs->abort_flag, root_name);
    if (res == cfxSuccess)
        res =
            cfx_socket_recv_all(fd, reply_p, sizeof(*reply_p), deadline, bs->abort_flag, root_name);
    if (res != cfxSuccess) {
        close(fd);
        if (res == cfxRemoteError && !aborted(bs))
            cfx_error_thread_clear();
        return res;
    }
    *fd_p = fd;
    return cfxSuccess;
}

/* Rank side of the join: greet the root, receive the address table.
 * @p deadline: the join's deadline (0: the default, CFX_BOOTSTRAP_TIMEOUT
 * and a little more, as the root reports missing ranks at its deadline). */
static cfxResult_t join_root(struct cfx_bootstrap *bs, const struct cfx_bootstrap_id *bid,
                             int64_t deadline)
{
    union cfx_sockaddr root_addr;
    if (cfx_socket_addr_from_wire(&bid->root, &root_addr) != cfxSuccess)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_BOOTSTRAP,
                             "the unique id holds no valid root address; was it made by "
                             "cfxGetUniqueId and passed unchanged?");
    char root_name[128], where[80];
    cfx_socket_addr_format(&root_addr, where, sizeof(where));
    snprintf(root_name, sizeof(root_name), "the bootstrap root at %s", where);
    int64_t timeout = param_bootstrap_timeout();
    if (deadline == 0)
        deadline = cfx_time_deadline_s(timeout > 0 ? timeout + 5 : 0);
    int fd = -1, hang_ups = 0, backoff_ms = 10;
    struct cfx_bootstrap_reply reply;
    cfxResult_t res;
    for (;;) {
        res = greet_root(bs, bid, &root_addr, root_name, deadline, &fd, &reply);
        if (res != cfxRemoteError || aborted(bs))
            break;
        if (root_gone(&root_addr, bs->abort_flag))
            return cfx_error_set(cfxRemoteError, CFX_LOG_BOOTSTRAP,
                                 "bootstrap rank %d: %s died before every rank had joined: %s "
                                 "exited or was killed",
                                 bs->rank, root_name,
                                 (bid->flags & CFX_BOOTSTRAP_ID_COMM_ID)
                                     ? "rank 0, which serves it under CFX_COMM_ID,"
                                     : "the process that called cfxGetUniqueId (and serves it)");
        hang_ups++;
        if (cfx_time_now_ns() >= deadline) {
            return cfx_error_set(cfxTimeout, CFX_LOG_BOOTSTRAP,
                                 "bootstrap rank %d: %s closed the connection %d times without "
                                 "an answer: the id may be stale (its root gone and the port "
                                 "taken by another), or the root is flooded with connections%s",
                                 bs->rank, root_name, hang_ups,
                                 (bid->flags & CFX_BOOTSTRAP_ID_COMM_ID)
                                     ? "; another job may use this CFX_COMM_ID"
                                     : "");
        }
        poll(NULL, 0, cfx_time_left_ms(deadline, backoff_ms));
        if (backoff_ms < 200)
            backoff_ms *= 2;
    }
    if (res == cfxTimeout) {
        if (bid->flags & CFX_BOOTSTRAP_ID_COMM_ID)
            return cfx_error_set(cfxTimeout, CFX_LOG_BOOTSTRAP,
                                 "bootstrap rank %d: %s (CFX_COMM_ID) did not answer: rank 0 "
                                 "of this job must start and listen there (one job per "
                                 "CFX_COMM_ID); %s",
                                 bs->rank, root_name, timeout_hint());
        return cfx_error_set(cfxTimeout, CFX_LOG_BOOTSTRAP,
                             "bootstrap rank %d: %s never answered; %s", bs->rank, root_name,
                             timeout_hint());
    }
    CFX_CHECK(res);
    /* An out-of-descriptors answer went out before the root read our count. */
    if (reply.magic == CFX_BOOTSTRAP_MAGIC && reply.status == CFX_BOOTSTRAP_NO_FDS) {
        res = refused(bs, bid, root_name, &reply);
        goto out;
    }
    const char *why = cfx_bootstrap_reply_refusal(&reply, bs->nranks);
    if (why != NULL) {
        res = cfx_error_set(cfxRemoteError, CFX_LOG_BOOTSTRAP,
                            "bootstrap rank %d: malformed answer from %s (%s)", bs->rank, root_name,
                            why);
        goto out;
    }
    if (reply.status != CFX_BOOTSTRAP_OK && reply.status != CFX_BOOTSTRAP_MISSING) {
        res = refused(bs, bid, root_name, &reply);
        goto out;
    }
    CFX_CHECK_GOTO(cfx_socket_recv_all(fd, bs->table, sizeof(*bs->table) * (size_t)bs->nranks,
                                       deadline, bs->abort_flag, root_name),
                   res, out);
    if (reply.status != CFX_BOOTSTRAP_OK) {
        char missing[256];
        list_missing(bs->table, bs->nranks, missing, sizeof(missing));
        res = cfx_error_set(cfxTimeout, CFX_LOG_BOOTSTRAP,
                            "bootstrap: rank(s) %s of %d never joined within CFX_BOOTSTRAP_TIMEOUT="
                            "%lld s; %s%s",
                            missing, bs->nranks, (long long)timeout, timeout_hint(),
                            (bid->flags & CFX_BOOTSTRAP_ID_COMM_ID)
                                ? "; or another job used this CFX_COMM_ID and the root it "
                                  "met refused them (one job per CFX_COMM_ID)"
                                : "");
    }
out:
    close(fd);
    return res;
}

/* With CFX_COMM_ID, rank 0 serves as the root at the given address. When
 * the port is taken, rank 0 fails, but first presents itself to whatever
 * root holds it: a root of another job on this CFX_COMM_ID then refuses that
 * whole job (a rank 0 that did not start it), so neither job runs with a
 * rank of the other. */
static cfxResult_t start_comm_id_root(struct cfx_bootstrap *bs, const struct cfx_bootstrap_id *bid)
{
    union cfx_sockaddr addr, bound;
    int fd;
    char where[80];
    CFX_CHECK(cfx_socket_addr_from_wire(&bid->root, &addr));
    cfx_socket_addr_format(&addr, where, sizeof(where));
    cfxResult_t res = cfx_socket_listen(&addr, &fd, &bound);
    if (res != cfxSuccess) {
        int in_use = errno == EADDRINUSE;
        char listen_error[CFX_ERROR_MAX];
        snprintf(listen_error, sizeof(listen_error), "%s", cfx_error_thread_last());
        if (!in_use)
            return cfx_error_set(res, CFX_LOG_BOOTSTRAP,
                                 "rank 0 cannot listen at CFX_COMM_ID (%s): %s; it must be an "
                                 "address of rank 0's host with a free port",
                                 where, listen_error);
        cfxResult_t joined = join_root(bs, bid, cfx_time_now_ns() + cfx_bootstrap_frame_ns());
        if (joined == cfxInvalidUsage)
            return cfx_error_set(cfxInvalidUsage, CFX_LOG_BOOTSTRAP,
                                 "rank 0 cannot listen at CFX_COMM_ID (%s): the root of another "
                                 "job on this CFX_COMM_ID holds the port, and now refuses both "
                                 "jobs; one job per CFX_COMM_ID: give each job its own port",
                                 where);
        return cfx_error_set(res, CFX_LOG_BOOTSTRAP,
                             "rank 0 cannot listen at CFX_COMM_ID (%s): the port is in use (by "
                             "another program, or by another job on this CFX_COMM_ID: one job "
                             "per CFX_COMM_ID); it must be a free port of rank 0's host",
                             where);
    }
    do {
        CFX_CHECK_GOTO(cfx_host_random(&bs->owner_nonce, sizeof(bs->owner_nonce)), res, err_close);
    } while (bs->owner_nonce == 0);
    return cfx_bootstrap_root_start(fd, bid->secret, bs->owner_nonce, cfx_bootstrap_settle_ns());
err_close:
    close(fd);
    return res;
}

cfxResult_t cfx_bootstrap_init(const cfxUniqueId *id, int rank, int nranks, const int *abort_flag,
                               struct cfx_bootstrap **bs_p)
{
    struct cfx_bootstrap_id bid;
    memcpy(&bid, id->internal, sizeof(bid));
    struct cfx_bootstrap *bs = NULL;
    cfxResult_t res;
    CFX_CHECK(bootstrap_alloc(rank, nranks, bid.secret, abort_flag, &bs));
    union cfx_sockaddr addr;
    CFX_CHECK_GOTO(pick_listen_address((bid.flags & CFX_BOOTSTRAP_ID_LOCAL) != 0, &addr), res, err);
    CFX_CHECK_GOTO(cfx_socket_listen(&addr, &bs->listen_fd, &bs->listen_addr), res, err);
    if ((bid.flags & CFX_BOOTSTRAP_ID_COMM_ID) && rank == 0)
        CFX_CHECK_GOTO(start_comm_id_root(bs, &bid), res, err);
    CFX_CHECK_GOTO(join_root(bs, &bid, 0), res, err);
    CFX_CHECK_GOTO(connect_ring(bs), res, err);
    CFX_INFO(CFX_LOG_BOOTSTRAP, "bootstrap rank %d of %d ready", rank, nranks);
    *bs_p = bs;
    return cfxSuccess;
err:
    cfx_bootstrap_destroy(bs);
    return res;
}

/* ---------------------------------------------------------------- split */

struct split_entry {
    int32_t color;
    int32_t key;
    int32_t parent_rank;
    int32_t reserved;
    struct cfx_sockaddr_wire listen_addr;
};

static int compare_members(const void *a, const void *b)
{
    const struct split_entry *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->parent_rank < y->parent_rank ? -1 : x->parent_rank > y->parent_rank;
}

cfxResult_t cfx_bootstrap_split(struct cfx_bootstrap *parent, int color, int key,
                                const int *abort_flag, struct cfx_bootstrap **child_p,
                                int *child_rank_p, int *child_nranks_p, int **parent_ranks_p)
{
    cfxResult_t res = cfxSuccess;
    int listen_fd = -1;
    union cfx_sockaddr bound;
    memset(&bound, 0, sizeof(bound));
    if (color >= 0) {
        /* Listen where the parent listens (same interface), any port. */
        union cfx_sockaddr addr = parent->listen_addr;
        if (addr.sa.sa_family == AF_INET)
            addr.sin.sin_port = 0;
        else
            addr.sin6.sin6_port = 0;
        CFX_CHECK(cfx_socket_listen(&addr, &listen_fd, &bound));
    }
    struct split_entry *all = calloc((size_t)parent->nranks, sizeof(*all));
    struct cfx_bootstrap *child = NULL;
    int *parent_ranks = NULL;
    if (all == NULL) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory in split");
        goto out;
    }
    all[parent->rank] =
        (struct split_entry){.color = color, .key = key, .parent_rank = parent->rank};
    if (color >= 0)
        cfx_socket_addr_to_wire(&bound, &all[parent->rank].listen_addr);
    CFX_CHECK_GOTO(cfx_bootstrap_allgather(parent, all, sizeof(*all)), res, out);
    if (color < 0) {
        *child_p = NULL;
        goto out;
    }
    int n_members = 0;
    for (int r = 0; r < parent->nranks; r++)
        if (all[r].color == color)
            all[n_members++] = all[r];
    qsort(all, (size_t)n_members, sizeof(*all), compare_members);
    int child_rank = -1;
    for (int i = 0; i < n_members; i++)
        if (all[i].parent_rank == parent->rank)
            child_rank = i;
    parent_ranks = malloc(sizeof(int) * (size_t)n_members);
    if (parent_ranks == NULL) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory in split");
        goto out;
    }
    CFX_CHECK_GOTO(bootstrap_alloc(child_rank, n_members, parent->secret, abort_flag, &child), res,
                   out);
    for (int i = 0; i < n_members; i++) {
        child->table[i] = all[i].listen_addr;
        parent_ranks[i] = all[i].parent_rank;
    }
    child->listen_fd = listen_fd;
    child->listen_addr = bound;
    listen_fd = -1;
    CFX_CHECK_GOTO(connect_ring(child), res, out);
    *child_p = child;
    *child_rank_p = child_rank;
    *child_nranks_p = n_members;
    *parent_ranks_p = parent_ranks;
    child = NULL;
    parent_ranks = NULL;
out:
    cfx_bootstrap_destroy(child);
    free(parent_ranks);
    free(all);
    cfx_socket_close(&listen_fd);
    return res;
}

/* --------------------------------------------------------------- shrink */

#define SHRINK_TAG_UP   0x53480000u /* "SH" 0: a remaining rank's entry, to the leader. */
#define SHRINK_TAG_DOWN 0x53480100u /* "SH" 0x01nn: part nn of the leader's answer. */

struct shrink_entry {
    int32_t parent_rank;
    uint32_t n_excluded;
    uint64_t excluded_hash; /* FNV-1a of the sorted excluded ranks. */
    struct cfx_sockaddr_wire listen_addr;
};

/* The leader's answer, in parts of at most SHRINK_PART entries. */
#define SHRINK_PART 64
struct shrink_part {
    int32_t status;    /* cfxSuccess, or cfxInvalidUsage: the sets disagree. */
    int32_t disagrees; /* The first rank whose set differs from the leader's. */
    int32_t n_entries;
    int32_t reserved;
    struct cfx_sockaddr_wire table[SHRINK_PART];
};
_Static_assert(sizeof(struct shrink_part) <= CFX_BOOTSTRAP_MAX_MESSAGE_BYTES,
               "a part of the shrink table fits one bootstrap message");

static uint64_t excluded_hash(const int *excluded, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        uint32_t v = (uint32_t)excluded[i];
        for (int b = 0; b < 4; b++) {
            h ^= (v >> (8 * b)) & 0xffu;
            h *= 1099511628211ull;
        }
    }
    return h;
}

void cfx_bootstrap_set_abort_flag(struct cfx_bootstrap *bs, const int *abort_flag)
{
    if (bs != NULL)
        bs->abort_flag = abort_flag;
}

cfxResult_t cfx_bootstrap_shrink(struct cfx_bootstrap *parent, const int *excluded, int n_excluded,
                                 const int *abort_flag, struct cfx_bootstrap **child_p,
                                 int *child_rank_p, int *child_nranks_p)
{
    int n = parent->nranks - n_excluded;
    cfxResult_t res = cfxSuccess;
    int listen_fd = -1;
    union cfx_sockaddr bound;
    struct cfx_bootstrap *child = NULL;
    int *members = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    struct shrink_part *part = calloc(1, sizeof(*part));
    struct cfx_sockaddr_wire *table = calloc((size_t)(n > 0 ? n : 1), sizeof(*table));
    if (members == NULL || part == NULL || table == NULL) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory in shrink");
        goto out;
    }
    int child_rank = -1;
    for (int r = 0, k = 0, m = 0; r < parent->nranks; r++) {
        if (k < n_excluded && excluded[k] == r) {
            k++;
            continue;
        }
        if (r == parent->rank)
            child_rank = m;
        members[m++] = r;
    }
    if (child_rank < 0 || n < 1) {
        res = cfx_error_set(cfxInternalError, CFX_LOG_BOOTSTRAP,
                            "shrink: rank %d is excluded or no rank remains", parent->rank);
        goto out;
    }
    /* Listen where the parent listens (same interface), any port. */
    union cfx_sockaddr addr = parent->listen_addr;
    if (addr.sa.sa_family == AF_INET)
        addr.sin.sin_port = 0;
    else
        addr.sin6.sin6_port = 0;
    CFX_CHECK_GOTO(cfx_socket_listen(&addr, &listen_fd, &bound), res, out);
    struct shrink_entry mine = {.parent_rank = parent->rank,
                                .n_excluded = (uint32_t)n_excluded,
                                .excluded_hash = excluded_hash(excluded, n_excluded)};
    cfx_socket_addr_to_wire(&bound, &mine.listen_addr);
    int leader = members[0];
    if (parent->rank == leader) {
        int32_t status = cfxSuccess, disagrees = -1;
        table[0] = mine.listen_addr;
        for (int i = 1; i < n; i++) {
            struct shrink_entry theirs;
            CFX_CHECK_GOTO(
                cfx_bootstrap_recv(parent, members[i], SHRINK_TAG_UP, &theirs, sizeof(theirs)), res,
                out);
            if (status == cfxSuccess && (theirs.n_excluded != mine.n_excluded ||
                                         theirs.excluded_hash != mine.excluded_hash)) {
                status = cfxInvalidUsage;
                disagrees = members[i];
            }
            table[i] = theirs.listen_addr;
        }
        for (int i = 1; i < n; i++) {
            for (int first = 0, k = 0; first < n; first += SHRINK_PART, k++) {
                int count = n - first < SHRINK_PART ? n - first : SHRINK_PART;
                *part = (struct shrink_part){
                    .status = status, .disagrees = disagrees, .n_entries = count};
                memcpy(part->table, table + first, sizeof(*table) * (size_t)count);
                CFX_CHECK_GOTO(cfx_bootstrap_send(parent, members[i], SHRINK_TAG_DOWN | (uint32_t)k,
                                                  part, sizeof(*part)),
                               res, out);
            }
        }
        if (status != cfxSuccess) {
            res = cfx_error_set(cfxInvalidUsage, CFX_LOG_BOOTSTRAP,
                                "parent rank %d excludes other ranks than parent rank %d; every "
                                "remaining rank must pass the same excludeRanksList",
                                disagrees, leader);
            goto out;
        }
    } else {
        CFX_CHECK_GOTO(cfx_bootstrap_send(parent, leader, SHRINK_TAG_UP, &mine, sizeof(mine)), res,
                       out);
        for (int first = 0, k = 0; first < n; first += SHRINK_PART, k++) {
            CFX_CHECK_GOTO(cfx_bootstrap_recv(parent, leader, SHRINK_TAG_DOWN | (uint32_t)k, part,
                                              sizeof(*part)),
                           res, out);
            if (part->status != cfxSuccess) {
                res = cfx_error_set(cfxInvalidUsage, CFX_LOG_BOOTSTRAP,
                                    "parent rank %d excludes other ranks than parent rank %d; "
                                    "every remaining rank must pass the same excludeRanksList",
                                    part->disagrees, leader);
                goto out;
            }
            int count = n - first < SHRINK_PART ? n - first : SHRINK_PART;
            if (part->n_entries != count) {
                res = cfx_error_set(cfxInternalError, CFX_LOG_BOOTSTRAP,
                                    "shrink: part %d from parent rank %d has %d entries, not %d", k,
                                    leader, part->n_entries, count);
                goto out;
            }
            memcpy(table + first, part->table, sizeof(*table) * (size_t)count);
        }
    }
    CFX_CHECK_GOTO(bootstrap_alloc(child_rank, n, parent->secret, abort_flag, &child), res, out);
    memcpy(child->table, table, sizeof(*table) * (size_t)n);
    child->listen_fd = listen_fd;
    child->listen_addr = bound;
    listen_fd = -1;
    CFX_CHECK_GOTO(connect_ring(child), res, out);
    *child_p = child;
    *child_rank_p = child_rank;
    *child_nranks_p = n;
    child = NULL;
out:
    cfx_bootstrap_destroy(child);
    cfx_socket_close(&listen_fd);
    free(members);
    free(part);
    free(table);
    return res;
}

/* ------------------------------------------------------------- scalable */

/* Every rank's part of the exchanges below: where the communicator's
 * bootstrap listens, and the counts, so ranks that disagree fail loudly. */
struct scalable_entry {
    int32_t nranks;
    int32_t n_ids;
    struct cfx_sockaddr_wire listen_addr;
};

/* A member's record in the hub's exchange: a rank of block 0 sends its own
 * entry, a leader its whole block's (count entries of max_block). */
struct scalable_record {
    int32_t block;
    int32_t count;
    struct scalable_entry entries[];
};

#define SCALABLE_SECRET_MIX UINT64_C(0x5343414c41424c45) /* "SCALABLE" */
#define SCALABLE_CHUNK      (64 << 10)

void cfx_bootstrap_scalable_block(int nranks, int n_ids, int k, int *first_p, int *size_p)
{
    int base = nranks / n_ids, extra = nranks % n_ids;
    *size_p = base + (k < extra);
    *first_p = k * base + (k < extra ? k : extra);
}

int cfx_bootstrap_scalable_root_of(int nranks, int n_ids, int rank)
{
    int base = nranks / n_ids, extra = nranks % n_ids;
    int big = extra * (base + 1); /* Ranks of the larger blocks. */
    return rank < big ? rank / (base + 1) : extra + (rank - big) / base;
}

/* Rank 0 of @p bs sends @p size bytes at @p data along the ring; every
 * other rank receives them from the previous rank and passes them on, in
 * chunks, so the ranks copy at once. */
static cfxResult_t ring_bcast(struct cfx_bootstrap *bs, void *data, size_t size)
{
    char *bytes = data;
    int prev = (bs->rank + bs->nranks - 1) % bs->nranks;
    int next = (bs->rank + 1) % bs->nranks;
    char prev_name[48], next_name[48];
    peer_name(prev, prev_name, sizeof(prev_name));
    peer_name(next, next_name, sizeof(next_name));
    int64_t deadline = op_deadline();
    for (size_t off = 0; off < size; off += SCALABLE_CHUNK) {
        size_t n = size - off < SCALABLE_CHUNK ? size - off : SCALABLE_CHUNK;
        if (bs->rank != 0)
            CFX_CHECK(cfx_socket_recv_all(bs->ring_recv_fd, bytes + off, n, deadline,
                                          bs->abort_flag, prev_name));
        if (next != 0)
            CFX_CHECK(cfx_socket_send_all(bs->ring_send_fd, bytes + off, n, deadline,
                                          bs->abort_flag, next_name));
    }
    return cfxSuccess;
}

/* Join id @p index as @p seat of @p n_seats; a failure's sentence says
 * which global ranks that id serves. */
static cfxResult_t join_part(const cfxUniqueId *ids, int index, int seat, int n_seats, int rank,
                             int first, int size, int n_ids, const int *abort_flag,
                             struct cfx_bootstrap **bs_p)
{
    cfxResult_t res = cfx_bootstrap_init(&ids[index], seat, n_seats, abort_flag, bs_p);
    if (res == cfxSuccess)
        return res;
    char why[768];
    snprintf(why, sizeof(why), "%s", cfx_error_thread_last());
    if (index == 0 && n_seats > size)
        return cfx_error_set(res, CFX_LOG_BOOTSTRAP,
                             "scalable init, rank %d: through ids[0], whose seats 0-%d are ranks "
                             "0-%d and seats %d-%d the first ranks of ids[1]-ids[%d]: %s",
                             rank, size - 1, size - 1, size, n_seats - 1, n_ids - 1, why);
    return cfx_error_set(res, CFX_LOG_BOOTSTRAP,
                         "scalable init, rank %d: through ids[%d], whose seats 0-%d are ranks "
                         "%d-%d: %s",
                         rank, index, n_seats - 1, first, first + size - 1, why);
}

static cfxResult_t entry_check(const struct scalable_entry *entry, int who, int rank, int nranks,
                               int n_ids)
{
    if (entry->nranks == nranks && entry->n_ids == n_ids)
        return cfxSuccess;
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_BOOTSTRAP,
                         "scalable init: rank %d was called with nranks %d and %d ids, rank %d "
                         "with nranks %d and %d ids; every rank must pass the same",
                         who, (int)entry->nranks, (int)entry->n_ids, rank, nranks, n_ids);
}

cfxResult_t cfx_bootstrap_init_scalable(const cfxUniqueId *ids, int n_ids, int rank, int nranks,
                                        const int *abort_flag, struct cfx_bootstrap **bs_p)
{
    if (n_ids == 1)
        return cfx_bootstrap_init(&ids[0], rank, nranks, abort_flag, bs_p);
    int k = cfx_bootstrap_scalable_root_of(nranks, n_ids, rank), first, size, size0, first0;
    cfx_bootstrap_scalable_block(nranks, n_ids, k, &first, &size);
    cfx_bootstrap_scalable_block(nranks, n_ids, 0, &first0, &size0);
    int max_block = size0; /* Block 0 is a largest one. */
    int hub_seats = size0 + n_ids - 1;
    int leader = rank == first;
    struct cfx_bootstrap *block = NULL, *hub = NULL, *bs = NULL;
    struct scalable_entry *mine_block = NULL;
    char *records = NULL;
    struct cfx_sockaddr_wire *table = NULL;
    size_t record_bytes =
        sizeof(struct scalable_record) + sizeof(struct scalable_entry) * (size_t)max_block;
    int listen_fd = -1;
    cfxResult_t res = cfxSuccess;
    struct cfx_bootstrap_id bid0;
    memcpy(&bid0, ids[0].internal, sizeof(bid0));

    /* Each id's root serves one block (NCCL's split: contiguous, the first
     * nranks % n_ids blocks one larger); the root of ids[0] also seats the
     * first rank of every other block: the hub through which blocks meet. */
    if (k > 0)
        CFX_CHECK_GOTO(
            join_part(ids, k, rank - first, size, rank, first, size, n_ids, abort_flag, &block),
            res, out);
    int seat = k == 0 ? rank : size0 + k - 1;
    if (k == 0 || leader)
        CFX_CHECK_GOTO(join_part(ids, 0, seat, hub_seats, rank, 0, size0, n_ids, abort_flag, &hub),
                       res, out);

    /* The communicator's own listener, where the first bootstrap listens. */
    struct cfx_bootstrap *near = block != NULL ? block : hub;
    union cfx_sockaddr addr = near->listen_addr, bound;
    if (addr.sa.sa_family == AF_INET)
        addr.sin.sin_port = 0;
    else
        addr.sin6.sin6_port = 0;
    CFX_CHECK_GOTO(cfx_socket_listen(&addr, &listen_fd, &bound), res, out);
    struct scalable_entry mine = {.nranks = nranks, .n_ids = n_ids};
    cfx_socket_addr_to_wire(&bound, &mine.listen_addr);

    table = calloc((size_t)nranks, sizeof(*table));
    if (table == NULL) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory in scalable init");
        goto out;
    }
    if (block != NULL) {
        mine_block = calloc((size_t)size, sizeof(*mine_block));
        if (mine_block == NULL) {
            res =
                cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory in scalable init");
            goto out;
        }
        mine_block[rank - first] = mine;
        CFX_CHECK_GOTO(cfx_bootstrap_allgather(block, mine_block, sizeof(*mine_block)), res, out);
        for (int i = 0; i < size; i++)
            CFX_CHECK_GOTO(entry_check(&mine_block[i], first + i, rank, nranks, n_ids), res, out);
    }
    if (hub != NULL) {
        records = calloc((size_t)hub_seats, record_bytes);
        if (records == NULL) {
            res =
                cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory in scalable init");
            goto out;
        }
        struct scalable_record *own = (void *)(records + (size_t)seat * record_bytes);
        own->block = k;
        own->count = k == 0 ? 1 : size;
        if (k == 0)
            own->entries[0] = mine;
        else
            memcpy(own->entries, mine_block, sizeof(*mine_block) * (size_t)size);
        CFX_CHECK_GOTO(cfx_bootstrap_allgather(hub, records, record_bytes), res, out);
        for (int s = 0; s < hub_seats; s++) {
            const struct scalable_record *rec = (const void *)(records + (size_t)s * record_bytes);
            int b = s < size0 ? 0 : s - size0 + 1, b_first, b_size;
            cfx_bootstrap_scalable_block(nranks, n_ids, b, &b_first, &b_size);
            int at = b == 0 ? s : b_first, count = b == 0 ? 1 : b_size;
            if (rec->block != b || rec->count != count)
                res = cfx_error_set(cfxInvalidUsage, CFX_LOG_BOOTSTRAP,
                                    "scalable init: seat %d of ids[0] says it brings %d rank(s) "
                                    "of ids[%d], not %d of ids[%d]; every rank must pass the "
                                    "same ids in the same order and the same nranks",
                                    s, (int)rec->count, (int)rec->block, count, b);
            for (int i = 0; i < count && res == cfxSuccess; i++) {
                res = entry_check(&rec->entries[i], at + i, rank, nranks, n_ids);
                table[at + i] = rec->entries[i].listen_addr;
            }
            if (res != cfxSuccess)
                goto out;
        }
    }
    /* A block's first rank hands the table on to the rest of its block. */
    if (block != NULL)
        CFX_CHECK_GOTO(ring_bcast(block, table, sizeof(*table) * (size_t)nranks), res, out);
    if (memcmp(&table[rank], &mine.listen_addr, sizeof(mine.listen_addr)) != 0) {
        res = cfx_error_set(cfxInternalError, CFX_LOG_BOOTSTRAP,
                            "scalable init, rank %d: the table does not hold this rank's own "
                            "listener",
                            rank);
        goto out;
    }

    CFX_CHECK_GOTO(
        bootstrap_alloc(rank, nranks, bid0.secret ^ SCALABLE_SECRET_MIX, abort_flag, &bs), res,
        out);
    memcpy(bs->table, table, sizeof(*table) * (size_t)nranks);
    bs->listen_fd = listen_fd;
    bs->listen_addr = bound;
    listen_fd = -1;
    CFX_CHECK_GOTO(connect_ring(bs), res, out);
    CFX_INFO(CFX_LOG_BOOTSTRAP,
             "bootstrap rank %d of %d ready (scalable: through ids[%d] of %d, %d rank(s))", rank,
             nranks, k, n_ids, size);
    *bs_p = bs;
    bs = NULL;
out:
    cfx_bootstrap_destroy(bs);
    cfx_bootstrap_destroy(block);
    cfx_bootstrap_destroy(hub);
    cfx_socket_close(&listen_fd);
    free(mine_block);
    free(records);
    free(table);
    return res;
}
