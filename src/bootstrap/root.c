/*
 * The root listener: one thread per unique id. It collects every rank's
 * hello, then answers each with the table of listener addresses. Strangers
 * (wrong magic or secret, garbage, impossible ranks, oversized counts, slow
 * senders) are closed and logged without disturbing the legitimate ranks:
 * all sockets are non-blocking and multiplexed with poll, and nothing is
 * allocated from a size a remote chose beyond the validated rank count.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/bootstrap/wire.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/time.h"


#define MAX_PENDING 256

struct pending_conn {
    int fd;
    size_t got;
    int64_t since_ns;
    struct cfx_bootstrap_hello hello;
};

struct root {
    int listen_fd;
    uint64_t secret;
    int nranks; /* 0 until the first valid hello. */
    int arrived;
    int *rank_fds;
    struct cfx_sockaddr_wire *table;
    struct pending_conn pending[MAX_PENDING];
    int n_pending;
    int64_t deadline_ns;
};

static void drop_pending(struct root *root, int index, const char *why)
{
    struct pending_conn *conn = &root->pending[index];
    CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap root: closed a connection: %s", why);
    close(conn->fd);
    root->pending[index] = root->pending[--root->n_pending];
}

/* A full hello arrived: register the rank or explain the refusal. */
static void admit(struct root *root, int index)
{
    struct pending_conn *conn = &root->pending[index];
    const struct cfx_bootstrap_hello *hello = &conn->hello;
    const char *why = cfx_bootstrap_hello_refusal(hello, root->secret, root->nranks);
    if (why != NULL) {
        if (root->nranks != 0 && hello->nranks != root->nranks)
            CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap root: rank %d says nranks=%d, others said %d",
                     hello->rank, hello->nranks, root->nranks);
        return drop_pending(root, index, why);
    }
    if (root->nranks == 0) {
        root->rank_fds = malloc(sizeof(int) * (size_t)hello->nranks);
        root->table = calloc((size_t)hello->nranks, sizeof(*root->table));
        if (root->rank_fds == NULL || root->table == NULL) {
            free(root->rank_fds);
            free(root->table);
            root->rank_fds = NULL;
            root->table = NULL;
            return drop_pending(root, index, "out of memory for the rank table");
        }
        for (int r = 0; r < hello->nranks; r++)
            root->rank_fds[r] = -1;
        root->nranks = hello->nranks;
        root->deadline_ns = cfx_time_deadline_s(cfx_bootstrap_timeout_s());
    }
    if (root->rank_fds[hello->rank] >= 0)
        return drop_pending(root, index, "a second connection claimed an already joined rank");
    root->rank_fds[hello->rank] = conn->fd;
    root->table[hello->rank] = hello->listen_addr;
    root->arrived++;
    CFX_INFO(CFX_LOG_BOOTSTRAP, "bootstrap root: rank %d of %d joined (%d/%d)", hello->rank,
             root->nranks, root->arrived, root->nranks);
    root->pending[index] = root->pending[--root->n_pending];
}

static void read_pending(struct root *root, int index)
{
    struct pending_conn *conn = &root->pending[index];
    char *buf = (char *)&conn->hello;
    ssize_t n = recv(conn->fd, buf + conn->got, sizeof(conn->hello) - conn->got, 0);
    if (n == 0)
        return drop_pending(root, index, "peer closed before finishing its greeting");
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        return drop_pending(root, index, "receive error");
    }
    conn->got += (size_t)n;
    if (conn->got >= sizeof(conn->hello.magic) && conn->hello.magic != CFX_BOOTSTRAP_MAGIC)
        return drop_pending(root, index, "bad magic (not a Conflux rank)");
    if (conn->got == sizeof(conn->hello))
        admit(root, index);
}

static void reply_all(struct root *root, uint32_t status)
{
    struct cfx_bootstrap_reply reply = {
        .magic = CFX_BOOTSTRAP_MAGIC, .status = status, .nranks = root->nranks};
    int64_t deadline = cfx_time_now_ns() + 10 * CFX_NS_PER_SEC;
    /* Highest rank first: rank 0 usually runs this thread's process, and on
     * a failed join it may return and exit before the others are answered. */
    for (int r = root->nranks - 1; r >= 0; r--) {
        if (root->rank_fds[r] < 0)
            continue;
        char peer[32];
        snprintf(peer, sizeof(peer), "rank %d", r);
        if (cfx_socket_send_all(root->rank_fds[r], &reply, sizeof(reply), deadline, NULL, peer) !=
                cfxSuccess ||
            cfx_socket_send_all(root->rank_fds[r], root->table,
                                sizeof(*root->table) * (size_t)root->nranks, deadline, NULL,
                                peer) != cfxSuccess)
            CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap root: could not answer rank %d", r);
        close(root->rank_fds[r]);
        root->rank_fds[r] = -1;
    }
}

static void root_run(struct root *root)
{
    int64_t frame_ns = cfx_bootstrap_frame_ns();
    root->deadline_ns = cfx_time_deadline_s(cfx_bootstrap_timeout_s());
    struct pollfd fds[MAX_PENDING + 1];
    for (;;) {
        if (root->nranks > 0 && root->arrived == root->nranks) {
            reply_all(root, CFX_BOOTSTRAP_OK);
            return;
        }
        int64_t now = cfx_time_now_ns();
        if (now >= root->deadline_ns) {
            if (root->nranks > 0) {
                CFX_WARN(CFX_LOG_BOOTSTRAP,
                         "bootstrap root: only %d of %d ranks joined before the timeout",
                         root->arrived, root->nranks);
                reply_all(root, CFX_BOOTSTRAP_MISSING);
            } else {
                CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap root: no rank joined; giving up");
            }
            return;
        }
        for (int i = root->n_pending - 1; i >= 0; i--)
            if (now - root->pending[i].since_ns > frame_ns)
                drop_pending(root, i, "greeting not finished in time (slow or idle sender)");
        int n_fds = 0;
        fds[n_fds++] = (struct pollfd){.fd = root->listen_fd, .events = POLLIN};
        for (int i = 0; i < root->n_pending; i++)
            fds[n_fds++] = (struct pollfd){.fd = root->pending[i].fd, .events = POLLIN};
        int n = poll(fds, (nfds_t)n_fds, cfx_time_left_ms(root->deadline_ns, 100));
        if (n <= 0)
            continue;
        /* Pending connections first, from the back so removal keeps indices. */
        for (int i = n_fds - 1; i >= 1; i--)
            if (fds[i].revents)
                read_pending(root, i - 1);
        if (fds[0].revents & POLLIN) {
            for (;;) {
                int fd = accept4(root->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                    break;
                if (root->n_pending == MAX_PENDING) {
                    CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap root: too many half-open connections");
                    close(fd);
                    continue;
                }
                root->pending[root->n_pending++] =
                    (struct pending_conn){.fd = fd, .got = 0, .since_ns = cfx_time_now_ns()};
            }
        }
    }
}

static void *root_thread(void *arg)
{
    struct root *root = arg;
    root_run(root);
    for (int i = 0; i < root->n_pending; i++)
        close(root->pending[i].fd);
    for (int r = 0; r < root->nranks; r++)
        if (root->rank_fds[r] >= 0)
            close(root->rank_fds[r]);
    close(root->listen_fd);
    free(root->rank_fds);
    free(root->table);
    free(root);
    return NULL;
}

cfxResult_t cfx_bootstrap_root_start(int listen_fd, uint64_t secret)
{
    struct root *root = calloc(1, sizeof(*root));
    if (root == NULL) {
        close(listen_fd);
        return cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory for the root");
    }
    root->listen_fd = listen_fd;
    root->secret = secret;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    int err = pthread_create(&thread, &attr, root_thread, root);
    pthread_attr_destroy(&attr);
    if (err != 0) {
        close(listen_fd);
        free(root);
        return cfx_error_set_errno(err, CFX_LOG_BOOTSTRAP, "cannot start the root thread");
    }
    return cfxSuccess;
}
