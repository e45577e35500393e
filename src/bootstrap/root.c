/*
 * The root listener: one thread per unique id. It collects every rank's
 * hello, then answers each with the table of listener addresses. Strangers
 * (wrong magic or secret, garbage, impossible ranks, oversized counts, slow
 * or idle senders) are closed and logged without disturbing the legitimate
 * ranks: all sockets are non-blocking and multiplexed with poll, a full
 * table of half-open connections makes room by closing its oldest one (a
 * rank greets at once, so the oldest is an idle stranger), and nothing is
 * allocated from a size a remote chose beyond the validated rank count.
 *
 * One job per id: a rank claimed twice, counts that disagree, or (with
 * CFX_COMM_ID) a rank 0 other than the one that started the root mean two
 * jobs share the id. The root then answers every rank that joined or comes
 * later with CFX_BOOTSTRAP_CONFLICT, so no rank gets a seat in the wrong job.
 */
#include <errno.h>
#include <fcntl.h>
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
/* How long a root that refuses a contested job keeps answering at most. */
#define FAILED_LINGER_NS (300 * CFX_NS_PER_SEC)

struct pending_conn {
    int fd;
    size_t got;
    int64_t since_ns;
    struct cfx_bootstrap_hello hello;
};

enum root_state {
    ROOT_JOINING,  /* Seats left. */
    ROOT_SETTLING, /* Every seat taken; waiting settle_ns for a duplicate claim. */
    ROOT_FAILED,   /* Contested or out of descriptors: refuse everyone until the deadline. */
};

struct root {
    int listen_fd;
    uint64_t secret;
    uint64_t owner_nonce;
    int64_t settle_ns;
    enum root_state state;
    struct cfx_bootstrap_reply failure; /* ROOT_FAILED: what every claimer is told. */
    int nranks; /* 0 until the first valid hello. */
    int arrived;
    int *rank_fds;
    struct cfx_sockaddr_wire *table;
    struct pending_conn pending[MAX_PENDING];
    int n_pending;
    int64_t deadline_ns;
    int64_t settled_ns; /* ROOT_SETTLING: when to answer. */
};

/* One descriptor per process, held so that at EMFILE a root can still
 * accept and answer one connection. */
static pthread_mutex_t spare_lock = PTHREAD_MUTEX_INITIALIZER;
static int spare_fd = -1;

static void drop_pending(struct root *root, int index, const char *why)
{
    struct pending_conn *conn = &root->pending[index];
    CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap root: closed a connection: %s", why);
    close(conn->fd);
    root->pending[index] = root->pending[--root->n_pending];
}

/* Best effort: a refusal is one small frame on a fresh socket. */
static void send_refusal(int fd, const struct cfx_bootstrap_reply *reply, int rank)
{
    char peer[48];
    snprintf(peer, sizeof(peer), "rank %d (refused)", rank);
    if (cfx_socket_send_all(fd, reply, sizeof(*reply), cfx_time_now_ns() + CFX_NS_PER_SEC, NULL,
                            peer) != cfxSuccess)
        CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap root: could not tell rank %d why it was refused",
                 rank);
}

static void reply_all(struct root *root, const struct cfx_bootstrap_reply *reply)
{
    int64_t deadline = cfx_time_now_ns() + 10 * CFX_NS_PER_SEC;
    int with_table = reply->status == CFX_BOOTSTRAP_OK || reply->status == CFX_BOOTSTRAP_MISSING;
    /* Highest rank first: rank 0 usually runs this thread's process, and on
     * a failed join it may return and exit before the others are answered. */
    for (int r = root->nranks - 1; r >= 0; r--) {
        if (root->rank_fds[r] < 0)
            continue;
        char peer[32];
        snprintf(peer, sizeof(peer), "rank %d", r);
        if (cfx_socket_send_all(root->rank_fds[r], reply, sizeof(*reply), deadline, NULL, peer) !=
                cfxSuccess ||
            (with_table && cfx_socket_send_all(root->rank_fds[r], root->table,
                                               sizeof(*root->table) * (size_t)root->nranks,
                                               deadline, NULL, peer) != cfxSuccess))
            CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap root: could not answer rank %d", r);
        close(root->rank_fds[r]);
        root->rank_fds[r] = -1;
    }
}

/* Refuse every rank that joined and everyone after: the job cannot form. */
static void fail_job(struct root *root, const struct cfx_bootstrap_reply *reply)
{
    root->failure = *reply;
    root->state = ROOT_FAILED;
    if (root->nranks > 0)
        reply_all(root, reply);
    int64_t linger = cfx_time_now_ns() + FAILED_LINGER_NS;
    if (root->deadline_ns > linger)
        root->deadline_ns = linger;
}

/* Two claims for one seat, or two counts: another job shares this id. */
static void contest(struct root *root, int claimer_fd, const struct cfx_bootstrap_hello *hello,
                    int conflict_rank, int conflict_nranks)
{
    if (conflict_rank >= 0)
        CFX_WARN(CFX_LOG_BOOTSTRAP,
                 "bootstrap root: rank %d of %d was claimed twice; another job may use this id; "
                 "refusing the whole job",
                 conflict_rank, hello->nranks);
    else
        CFX_WARN(CFX_LOG_BOOTSTRAP,
                 "bootstrap root: a rank says nranks=%d, others said %d; another job may use "
                 "this id; refusing the whole job",
                 hello->nranks, conflict_nranks);
    struct cfx_bootstrap_reply reply = {.magic = CFX_BOOTSTRAP_MAGIC,
                                        .status = CFX_BOOTSTRAP_CONFLICT,
                                        .nranks = root->nranks ? root->nranks : hello->nranks,
                                        .conflict_rank = conflict_rank,
                                        .conflict_nranks = conflict_nranks};
    fail_job(root, &reply);
    reply.nranks = hello->nranks;
    if (conflict_rank < 0)
        reply.conflict_nranks = root->nranks;
    send_refusal(claimer_fd, &reply, hello->rank);
}

/* A full hello arrived: register the rank or explain the refusal. */
static void admit(struct root *root, int index)
{
    struct pending_conn *conn = &root->pending[index];
    struct cfx_bootstrap_hello hello = conn->hello;
    int fd = conn->fd;
    const char *why = cfx_bootstrap_hello_refusal(&hello, root->secret, 0);
    if (why != NULL)
        return drop_pending(root, index, why);
    /* From here on the claimer holds the secret: it is told why, not hung up on. */
    root->pending[index] = root->pending[--root->n_pending];
    if (root->state == ROOT_FAILED) {
        struct cfx_bootstrap_reply reply = root->failure;
        reply.nranks = hello.nranks;
        send_refusal(fd, &reply, hello.rank);
        close(fd);
        return;
    }
    if (root->nranks != 0 && hello.nranks != root->nranks) {
        contest(root, fd, &hello, -1, hello.nranks);
        close(fd);
        return;
    }
    int foreign_rank0 =
        root->owner_nonce != 0 && hello.rank == 0 && hello.owner_nonce != root->owner_nonce;
    if (foreign_rank0 || (root->nranks != 0 && root->rank_fds[hello.rank] >= 0)) {
        contest(root, fd, &hello, hello.rank, hello.nranks);
        close(fd);
        return;
    }
    if (root->nranks == 0) {
        root->rank_fds = malloc(sizeof(int) * (size_t)hello.nranks);
        root->table = calloc((size_t)hello.nranks, sizeof(*root->table));
        if (root->rank_fds == NULL || root->table == NULL) {
            free(root->rank_fds);
            free(root->table);
            root->rank_fds = NULL;
            root->table = NULL;
            CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap root: out of memory for a table of %d ranks",
                     hello.nranks);
            close(fd);
            return;
        }
        for (int r = 0; r < hello.nranks; r++)
            root->rank_fds[r] = -1;
        root->nranks = hello.nranks;
        root->deadline_ns = cfx_time_deadline_s(cfx_bootstrap_timeout_s());
    }
    root->rank_fds[hello.rank] = fd;
    root->table[hello.rank] = hello.listen_addr;
    root->arrived++;
    CFX_INFO(CFX_LOG_BOOTSTRAP, "bootstrap root: rank %d of %d joined (%d/%d)", hello.rank,
             root->nranks, root->arrived, root->nranks);
    if (root->arrived == root->nranks) {
        root->state = ROOT_SETTLING;
        root->settled_ns = cfx_time_now_ns() + root->settle_ns;
    }
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

/* Make room for one more half-open connection: close the oldest. */
static void evict_oldest(struct root *root)
{
    int oldest = 0;
    for (int i = 1; i < root->n_pending; i++)
        if (root->pending[i].since_ns < root->pending[oldest].since_ns)
            oldest = i;
    drop_pending(root, oldest, "too many half-open connections; closed the oldest (idle sender)");
}

/* Out of descriptors: answer the waiting connection with the spare
 * descriptor, then refuse the whole job, since its ranks cannot all be
 * served. */
static void out_of_descriptors(struct root *root, int err)
{
    CFX_WARN(CFX_LOG_BOOTSTRAP,
             "bootstrap root: cannot accept a connection: %s; raise `ulimit -n` in the root's "
             "process",
             strerror(err));
    struct cfx_bootstrap_reply reply = {.magic = CFX_BOOTSTRAP_MAGIC,
                                        .status = CFX_BOOTSTRAP_NO_FDS,
                                        .nranks = root->nranks,
                                        .conflict_rank = -1};
    if (root->state != ROOT_FAILED)
        fail_job(root, &reply);
    pthread_mutex_lock(&spare_lock);
    if (spare_fd >= 0) {
        close(spare_fd);
        spare_fd = -1;
    }
    int fd = accept4(root->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
        /* Its hello is not read, so its count is unknown: join_root reads
         * this status before it compares counts. */
        reply.nranks = -1;
        send_refusal(fd, &reply, -1);
        close(fd);
    }
    spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pthread_mutex_unlock(&spare_lock);
}

static void accept_waiting(struct root *root)
{
    for (;;) {
        int fd = accept4(root->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            if (err == EINTR || err == ECONNABORTED)
                continue;
            if (err == EMFILE || err == ENFILE) {
                if (root->n_pending > 0) {
                    evict_oldest(root);
                    continue;
                }
                out_of_descriptors(root, err);
            }
            return;
        }
        if (root->n_pending == MAX_PENDING)
            evict_oldest(root);
        int index = root->n_pending++;
        root->pending[index] =
            (struct pending_conn){.fd = fd, .got = 0, .since_ns = cfx_time_now_ns()};
        /* A rank sends its hello as soon as it connects: often it is here already. */
        read_pending(root, index);
    }
}

static void root_run(struct root *root)
{
    int64_t frame_ns = cfx_bootstrap_frame_ns();
    root->deadline_ns = cfx_time_deadline_s(cfx_bootstrap_timeout_s());
    struct pollfd fds[MAX_PENDING + 1];
    for (;;) {
        int64_t now = cfx_time_now_ns();
        if (root->state == ROOT_SETTLING && now >= root->settled_ns) {
            struct cfx_bootstrap_reply reply = {.magic = CFX_BOOTSTRAP_MAGIC,
                                                .status = CFX_BOOTSTRAP_OK,
                                                .nranks = root->nranks,
                                                .conflict_rank = -1};
            reply_all(root, &reply);
            return;
        }
        if (now >= root->deadline_ns) {
            if (root->state == ROOT_FAILED) {
                return;
            } else if (root->nranks > 0) {
                CFX_WARN(CFX_LOG_BOOTSTRAP,
                         "bootstrap root: only %d of %d ranks joined before the timeout",
                         root->arrived, root->nranks);
                struct cfx_bootstrap_reply reply = {.magic = CFX_BOOTSTRAP_MAGIC,
                                                    .status = CFX_BOOTSTRAP_MISSING,
                                                    .nranks = root->nranks,
                                                    .conflict_rank = -1};
                reply_all(root, &reply);
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
        int64_t wake_ns = root->state == ROOT_SETTLING && root->settled_ns < root->deadline_ns
                              ? root->settled_ns
                              : root->deadline_ns;
        int n = poll(fds, (nfds_t)n_fds, cfx_time_left_ms(wake_ns, 100));
        if (n <= 0)
            continue;
        /* Pending connections first, from the back so removal keeps indices. */
        for (int i = n_fds - 1; i >= 1; i--)
            if (fds[i].revents)
                read_pending(root, i - 1);
        if (fds[0].revents & POLLIN)
            accept_waiting(root);
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

cfxResult_t cfx_bootstrap_root_start(int listen_fd, uint64_t secret, uint64_t owner_nonce,
                                     int64_t settle_ns)
{
    struct root *root = calloc(1, sizeof(*root));
    if (root == NULL) {
        close(listen_fd);
        return cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory for the root");
    }
    root->listen_fd = listen_fd;
    root->secret = secret;
    root->owner_nonce = owner_nonce;
    root->settle_ns = settle_ns;
    pthread_mutex_lock(&spare_lock);
    if (spare_fd < 0)
        spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pthread_mutex_unlock(&spare_lock);
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
