/*
 * The root listener. An id from cfxGetUniqueId is served by its process's
 * shared root: one listener and one thread per listen address, whatever
 * the number of ids, so an id that is never used costs a few bytes until
 * CFX_BOOTSTRAP_TIMEOUT passes, not a descriptor and a thread. A
 * CFX_COMM_ID root is one listener and thread of its own, for one job, at
 * the address the variable names. Either way a root collects every rank's
 * hello, matches it to its job by the secret, then answers each rank with
 * the table of listener addresses.
 *
 * Strangers (wrong magic or secret, garbage, impossible ranks, oversized
 * counts, slow or idle senders) are closed and logged without disturbing
 * the legitimate ranks: all sockets are non-blocking and multiplexed with
 * poll, a full table of half-open connections makes room by closing its
 * oldest one (a rank greets at once, so the oldest is an idle stranger),
 * and nothing is allocated from a size a remote chose beyond the validated
 * rank count.
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

enum job_state {
    JOB_JOINING,  /* Seats left. */
    JOB_SETTLING, /* Every seat taken; waiting settle_ns for a duplicate claim. */
    JOB_FAILED,   /* Contested or out of descriptors: refuse everyone until the deadline. */
};

/* One id's communicator, from the id's creation until its ranks are answered. */
struct job {
    struct job *next;
    uint64_t secret;
    uint64_t owner_nonce;
    int64_t settle_ns;
    enum job_state state;
    struct cfx_bootstrap_reply failure; /* JOB_FAILED: what every claimer is told. */
    int nranks;                         /* 0 until the first valid hello. */
    int arrived;
    int *rank_fds;
    struct cfx_sockaddr_wire *table;
    int64_t deadline_ns;
    int64_t settled_ns; /* JOB_SETTLING: when to answer. */
};

/* A listener and the thread that serves it. */
struct root {
    struct root *next; /* Shared roots of this process. */
    int listen_fd;
    int shared; /* Serves ids of cfxGetUniqueId; lives while any of them is pending. */
    pid_t pid;  /* A shared root's thread exists only in the process that started it. */
    union cfx_sockaddr addr; /* Shared: the address asked for (port 0). */
    struct cfx_sockaddr_wire bound;
    pthread_mutex_t lock; /* Guards jobs (ids are added from other threads). */
    struct job *jobs;
    struct pending_conn pending[MAX_PENDING];
    int n_pending;
};

/* This process's shared roots. */
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static struct root *shared_roots;

/* One descriptor per process, held while any root runs, so that at EMFILE
 * a root can still accept and answer one connection. */
static pthread_mutex_t spare_lock = PTHREAD_MUTEX_INITIALIZER;
static int spare_fd = -1;
static int roots_running; /* Root threads alive; the spare is closed at 0. */

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

static void reply_all(struct job *job, const struct cfx_bootstrap_reply *reply)
{
    int64_t deadline = cfx_time_now_ns() + 10 * CFX_NS_PER_SEC;
    int with_table = reply->status == CFX_BOOTSTRAP_OK || reply->status == CFX_BOOTSTRAP_MISSING;
    /* Highest rank first: rank 0 usually runs this thread's process, and on
     * a failed join it may return and exit before the others are answered. */
    for (int r = job->nranks - 1; r >= 0; r--) {
        if (job->rank_fds[r] < 0)
            continue;
        char peer[32];
        snprintf(peer, sizeof(peer), "rank %d", r);
        if (cfx_socket_send_all(job->rank_fds[r], reply, sizeof(*reply), deadline, NULL, peer) !=
                cfxSuccess ||
            (with_table && cfx_socket_send_all(job->rank_fds[r], job->table,
                                               sizeof(*job->table) * (size_t)job->nranks, deadline,
                                               NULL, peer) != cfxSuccess))
            CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap root: could not answer rank %d", r);
        close(job->rank_fds[r]);
        job->rank_fds[r] = -1;
    }
}

/* Refuse every rank that joined and everyone after: the job cannot form. */
static void fail_job(struct job *job, const struct cfx_bootstrap_reply *reply)
{
    job->failure = *reply;
    job->state = JOB_FAILED;
    if (job->nranks > 0)
        reply_all(job, reply);
    int64_t linger = cfx_time_now_ns() + FAILED_LINGER_NS;
    if (job->deadline_ns > linger)
        job->deadline_ns = linger;
}

/* Two claims for one seat, or two counts: another job shares this id. */
static void contest(struct job *job, int claimer_fd, const struct cfx_bootstrap_hello *hello,
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
                 hello->nranks, job->nranks);
    struct cfx_bootstrap_reply reply = {.magic = CFX_BOOTSTRAP_MAGIC,
                                        .status = CFX_BOOTSTRAP_CONFLICT,
                                        .nranks = job->nranks ? job->nranks : hello->nranks,
                                        .conflict_rank = conflict_rank,
                                        .conflict_nranks = conflict_nranks};
    fail_job(job, &reply);
    reply.nranks = hello->nranks;
    if (conflict_rank < 0)
        reply.conflict_nranks = job->nranks;
    send_refusal(claimer_fd, &reply, hello->rank);
}

/* A rank that holds the secret of @p job claims a seat: take it, or refuse. */
static void claim(struct job *job, int fd, const struct cfx_bootstrap_hello *hello)
{
    if (job->state == JOB_FAILED) {
        struct cfx_bootstrap_reply reply = job->failure;
        reply.nranks = hello->nranks;
        send_refusal(fd, &reply, hello->rank);
        close(fd);
        return;
    }
    if (job->nranks != 0 && hello->nranks != job->nranks) {
        contest(job, fd, hello, -1, hello->nranks);
        close(fd);
        return;
    }
    int foreign_rank0 =
        job->owner_nonce != 0 && hello->rank == 0 && hello->owner_nonce != job->owner_nonce;
    if (foreign_rank0 || (job->nranks != 0 && job->rank_fds[hello->rank] >= 0)) {
        contest(job, fd, hello, hello->rank, hello->nranks);
        close(fd);
        return;
    }
    if (job->nranks == 0) {
        job->rank_fds = malloc(sizeof(int) * (size_t)hello->nranks);
        job->table = calloc((size_t)hello->nranks, sizeof(*job->table));
        if (job->rank_fds == NULL || job->table == NULL) {
            free(job->rank_fds);
            free(job->table);
            job->rank_fds = NULL;
            job->table = NULL;
            CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap root: out of memory for a table of %d ranks",
                     hello->nranks);
            close(fd);
            return;
        }
        for (int r = 0; r < hello->nranks; r++)
            job->rank_fds[r] = -1;
        job->nranks = hello->nranks;
        job->deadline_ns = cfx_time_deadline_s(cfx_bootstrap_timeout_s());
    }
    job->rank_fds[hello->rank] = fd;
    job->table[hello->rank] = hello->listen_addr;
    job->arrived++;
    CFX_INFO(CFX_LOG_BOOTSTRAP, "bootstrap root: rank %d of %d joined (%d/%d)", hello->rank,
             job->nranks, job->arrived, job->nranks);
    if (job->arrived == job->nranks) {
        job->state = JOB_SETTLING;
        job->settled_ns = cfx_time_now_ns() + job->settle_ns;
    }
}

/* A full hello arrived: hand it to its job, or close a stranger. */
static void admit(struct root *root, int index)
{
    struct pending_conn *conn = &root->pending[index];
    struct cfx_bootstrap_hello hello = conn->hello;
    int fd = conn->fd;
    const char *why = cfx_bootstrap_hello_refusal(&hello, hello.secret, 0);
    if (why != NULL)
        return drop_pending(root, index, why);
    pthread_mutex_lock(&root->lock);
    struct job *job = root->jobs;
    while (job != NULL && job->secret != hello.secret)
        job = job->next;
    pthread_mutex_unlock(&root->lock);
    if (job == NULL)
        return drop_pending(root, index,
                            "wrong secret (not a rank of a communicator of this root)");
    /* From here on the claimer holds the secret: it is told why, not hung up on. */
    root->pending[index] = root->pending[--root->n_pending];
    claim(job, fd, &hello);
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

/* Out of descriptors: refuse the jobs that are joining, since their ranks
 * cannot all be served, and answer the waiting connection through the spare
 * descriptor. */
static void out_of_descriptors(struct root *root, int err)
{
    CFX_WARN(CFX_LOG_BOOTSTRAP,
             "bootstrap root: cannot accept a connection: %s; raise `ulimit -n` in the root's "
             "process",
             strerror(err));
    struct cfx_bootstrap_reply reply = {
        .magic = CFX_BOOTSTRAP_MAGIC, .status = CFX_BOOTSTRAP_NO_FDS, .conflict_rank = -1};
    pthread_mutex_lock(&root->lock);
    for (struct job *job = root->jobs; job != NULL; job = job->next) {
        if (job->state != JOB_FAILED && job->nranks > 0) {
            reply.nranks = job->nranks;
            fail_job(job, &reply);
        }
    }
    pthread_mutex_unlock(&root->lock);
    pthread_mutex_lock(&spare_lock);
    if (spare_fd >= 0) {
        close(spare_fd);
        spare_fd = -1;
    }
    int fd = accept4(root->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
        /* Its hello is not read, so its count is unknown: join_root reads this
         * status before it compares counts. */
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

static void job_free(struct job *job)
{
    for (int r = 0; r < job->nranks; r++)
        if (job->rank_fds[r] >= 0)
            close(job->rank_fds[r]);
    free(job->rank_fds);
    free(job->table);
    free(job);
}

/* Answer or expire the job whose time has come. Returns 1 when it is over. */
static int job_tick(struct job *job, int64_t now)
{
    if (job->state == JOB_SETTLING && now >= job->settled_ns) {
        struct cfx_bootstrap_reply reply = {.magic = CFX_BOOTSTRAP_MAGIC,
                                            .status = CFX_BOOTSTRAP_OK,
                                            .nranks = job->nranks,
                                            .conflict_rank = -1};
        reply_all(job, &reply);
        return 1;
    }
    if (now < job->deadline_ns)
        return 0;
    if (job->state == JOB_FAILED)
        return 1;
    if (job->nranks > 0) {
        CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap root: only %d of %d ranks joined before the timeout",
                 job->arrived, job->nranks);
        struct cfx_bootstrap_reply reply = {.magic = CFX_BOOTSTRAP_MAGIC,
                                            .status = CFX_BOOTSTRAP_MISSING,
                                            .nranks = job->nranks,
                                            .conflict_rank = -1};
        reply_all(job, &reply);
    } else if (job->owner_nonce == 0) {
        CFX_INFO(CFX_LOG_BOOTSTRAP, "bootstrap root: an id was never used; forgetting it");
    } else {
        CFX_WARN(CFX_LOG_BOOTSTRAP, "bootstrap root: no rank joined; giving up");
    }
    return 1;
}

/* Tick every job; returns the earliest time one needs attention next. */
static int64_t tick_jobs(struct root *root, int64_t now)
{
    int64_t wake_ns = now + CFX_NS_PER_SEC;
    pthread_mutex_lock(&root->lock);
    for (struct job **link = &root->jobs; *link != NULL;) {
        struct job *job = *link;
        if (job_tick(job, now)) {
            *link = job->next;
            job_free(job);
            continue;
        }
        int64_t due = job->state == JOB_SETTLING ? job->settled_ns : job->deadline_ns;
        if (due < wake_ns)
            wake_ns = due;
        link = &job->next;
    }
    pthread_mutex_unlock(&root->lock);
    return wake_ns;
}

/* A shared root with no id left leaves this process's list (so the next
 * cfxGetUniqueId starts a new one) and returns 1; else 0. Lock order:
 * shared_lock, then root->lock (as cfx_bootstrap_root_add_id). */
static int shared_root_retire(struct root *root)
{
    pthread_mutex_lock(&shared_lock);
    pthread_mutex_lock(&root->lock);
    int idle = root->jobs == NULL;
    if (idle)
        for (struct root **link = &shared_roots; *link != NULL; link = &(*link)->next)
            if (*link == root) {
                *link = root->next;
                break;
            }
    pthread_mutex_unlock(&root->lock);
    pthread_mutex_unlock(&shared_lock);
    return idle;
}

/* Serve until no job is left: a root of its own then, a shared root once no
 * id of cfxGetUniqueId is pending (joined, failed, or expired after
 * CFX_BOOTSTRAP_TIMEOUT), so nothing of the bootstrap outlives its ids. */
static void root_run(struct root *root)
{
    int64_t frame_ns = cfx_bootstrap_frame_ns();
    struct pollfd fds[MAX_PENDING + 1];
    for (;;) {
        int64_t now = cfx_time_now_ns();
        int64_t wake_ns = tick_jobs(root, now);
        /* A shared root's jobs change under its lock (ids come from other
         * threads); a root of its own has only this thread to change them. */
        if (root->shared ? shared_root_retire(root) : root->jobs == NULL)
            return;
        for (int i = root->n_pending - 1; i >= 0; i--)
            if (now - root->pending[i].since_ns > frame_ns)
                drop_pending(root, i, "greeting not finished in time (slow or idle sender)");
        int n_fds = 0;
        fds[n_fds++] = (struct pollfd){.fd = root->listen_fd, .events = POLLIN};
        for (int i = 0; i < root->n_pending; i++)
            fds[n_fds++] = (struct pollfd){.fd = root->pending[i].fd, .events = POLLIN};
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
    /* No job left (and, shared, off the list: nobody can reach it). */
    for (int i = 0; i < root->n_pending; i++)
        close(root->pending[i].fd);
    if (root->listen_fd >= 0)
        close(root->listen_fd);
    pthread_mutex_destroy(&root->lock);
    free(root);
    pthread_mutex_lock(&spare_lock);
    if (--roots_running == 0 && spare_fd >= 0) {
        close(spare_fd);
        spare_fd = -1;
    }
    pthread_mutex_unlock(&spare_lock);
    return NULL;
}

static struct job *job_new(uint64_t secret, uint64_t owner_nonce, int64_t settle_ns)
{
    struct job *job = calloc(1, sizeof(*job));
    if (job == NULL)
        return NULL;
    job->secret = secret;
    job->owner_nonce = owner_nonce;
    job->settle_ns = settle_ns;
    job->deadline_ns = cfx_time_deadline_s(cfx_bootstrap_timeout_s());
    return job;
}

/* Start @p root's thread; on failure the caller still owns root. */
static cfxResult_t root_thread_start(struct root *root)
{
    pthread_mutex_lock(&spare_lock);
    if (spare_fd < 0)
        spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    roots_running++;
    pthread_mutex_unlock(&spare_lock);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    int err = pthread_create(&thread, &attr, root_thread, root);
    pthread_attr_destroy(&attr);
    if (err != 0) {
        pthread_mutex_lock(&spare_lock);
        if (--roots_running == 0 && spare_fd >= 0) {
            close(spare_fd);
            spare_fd = -1;
        }
        pthread_mutex_unlock(&spare_lock);
        return cfx_error_set_errno(err, CFX_LOG_BOOTSTRAP, "cannot start the root thread");
    }
    return cfxSuccess;
}

cfxResult_t cfx_bootstrap_root_start(int listen_fd, uint64_t secret, uint64_t owner_nonce,
                                     int64_t settle_ns)
{
    struct root *root = calloc(1, sizeof(*root));
    struct job *job = job_new(secret, owner_nonce, settle_ns);
    if (root == NULL || job == NULL) {
        free(root);
        free(job);
        close(listen_fd);
        return cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory for the root");
    }
    root->listen_fd = listen_fd;
    root->jobs = job;
    pthread_mutex_init(&root->lock, NULL);
    cfxResult_t res = root_thread_start(root);
    if (res != cfxSuccess) {
        pthread_mutex_destroy(&root->lock);
        free(job);
        free(root);
        close(listen_fd);
    }
    return res;
}

static int same_address(const union cfx_sockaddr *a, const union cfx_sockaddr *b)
{
    if (a->sa.sa_family != b->sa.sa_family)
        return 0;
    if (a->sa.sa_family == AF_INET)
        return a->sin.sin_addr.s_addr == b->sin.sin_addr.s_addr;
    return memcmp(&a->sin6.sin6_addr, &b->sin6.sin6_addr, sizeof(a->sin6.sin6_addr)) == 0 &&
           a->sin6.sin6_scope_id == b->sin6.sin6_scope_id;
}

/* This process's shared root at @p addr, started on first use. A root
 * inherited through fork has no thread here: it is left alone (its
 * descriptor closed) and a new one started. Call with shared_lock held. */
static cfxResult_t shared_root_at(const union cfx_sockaddr *addr, struct root **root_p)
{
    pid_t me = getpid();
    for (struct root *root = shared_roots; root != NULL; root = root->next) {
        if (!same_address(&root->addr, addr))
            continue;
        if (root->pid == me) {
            *root_p = root;
            return cfxSuccess;
        }
        if (root->listen_fd >= 0) {
            close(root->listen_fd); /* The parent's; its thread serves it there. */
            root->listen_fd = -1;
        }
    }
    struct root *root = calloc(1, sizeof(*root));
    if (root == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory for the root");
    union cfx_sockaddr bound;
    cfxResult_t res = cfx_socket_listen(addr, &root->listen_fd, &bound);
    if (res != cfxSuccess) {
        free(root);
        return res;
    }
    root->shared = 1;
    root->pid = me;
    root->addr = *addr;
    cfx_socket_addr_to_wire(&bound, &root->bound);
    pthread_mutex_init(&root->lock, NULL);
    res = root_thread_start(root);
    if (res != cfxSuccess) {
        pthread_mutex_destroy(&root->lock);
        close(root->listen_fd);
        free(root);
        return res;
    }
    root->next = shared_roots;
    shared_roots = root;
    *root_p = root;
    return cfxSuccess;
}

cfxResult_t cfx_bootstrap_root_add_id(const union cfx_sockaddr *addr, uint64_t secret,
                                      struct cfx_sockaddr_wire *root_p)
{
    struct job *job = job_new(secret, 0, 0);
    if (job == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_BOOTSTRAP, "out of memory for an id");
    pthread_mutex_lock(&shared_lock);
    struct root *root = NULL;
    cfxResult_t res = shared_root_at(addr, &root);
    if (res == cfxSuccess) {
        pthread_mutex_lock(&root->lock);
        job->next = root->jobs;
        root->jobs = job;
        pthread_mutex_unlock(&root->lock);
        *root_p = root->bound;
    } else {
        free(job);
    }
    pthread_mutex_unlock(&shared_lock);
    return res;
}
