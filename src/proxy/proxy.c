/*
 * The process's proxy thread (proxy.h says what it is for). One struct
 * cfx_proxy exists while anybody holds a reference: `current` under
 * registry_lock, counted by `users`. The thread walks the client list under
 * `lock`; add and remove take it too (announcing themselves in
 * lock_waiters, so the thread lets them in between passes instead of
 * re-taking the lock at once).
 */
#include "src/proxy/proxy.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "src/conn/fifo.h" /* CFX_CACHE_LINE */
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/time.h"

#define SLEEP_MS       20 /* Longest sleep of an idle thread. */
#define MAX_EVENTS     64
#define LEASE_SLACK_NS 10000 /* A lease moved by less is not stored again. */

struct cfx_proxy {
    int users; /* Under registry_lock. */
    pthread_t thread;
    int wake_fd;
    int epoll_fd;
    pthread_mutex_t lock;
    struct cfx_proxy_client *clients; /* Under lock. */
    uint64_t generation;              /* Under lock: bumped when a client leaves. */
    _Alignas(CFX_CACHE_LINE) _Atomic int64_t lease_ns; /* Until when user threads move bytes. */
    _Alignas(CFX_CACHE_LINE) _Atomic int lock_waiters;
    _Atomic int stop;
    _Atomic int64_t spin_ns;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cfx_proxy *current;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* A forked child has no proxy thread: its first user starts a fresh proxy
 * (the parent's memory and descriptors are left as they are). */
static void atfork_child(void)
{
    pthread_mutex_init(&registry_lock, NULL);
    current = NULL;
}

static void atfork_install(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* ============================================================ the thread */

/* One pass over every client; caller holds the lock. */
static int pass(struct cfx_proxy *proxy)
{
    int moved = 0;
    for (struct cfx_proxy_client *client = proxy->clients; client; client = client->next)
        moved |= client->progress(client->arg);
    return moved;
}

/* The longest this thread may sleep (ns): SLEEP_MS, or less when a client
 * asks to be passed over more often (poll_ns). Caller holds the lock. */
static int64_t sleep_limit_ns(const struct cfx_proxy *proxy)
{
    int64_t limit = (int64_t)SLEEP_MS * 1000000;
    for (const struct cfx_proxy_client *c = proxy->clients; c; c = c->next) {
        int64_t poll = atomic_load_explicit(&c->poll_ns, memory_order_relaxed);
        if (poll > 0 && poll < limit)
            limit = poll;
    }
    return limit;
}

static int locked_pass(struct cfx_proxy *proxy, uint64_t *generation_p, int64_t *sleep_ns_p)
{
    pthread_mutex_lock(&proxy->lock);
    int moved = pass(proxy);
    if (generation_p)
        *generation_p = proxy->generation;
    if (sleep_ns_p)
        *sleep_ns_p = sleep_limit_ns(proxy);
    pthread_mutex_unlock(&proxy->lock);
    /* Let add/remove in: this loop would otherwise re-take the lock at once. */
    while (atomic_load_explicit(&proxy->lock_waiters, memory_order_relaxed))
        sched_yield();
    return moved;
}

/* Whether @p client is still added (caller holds the lock). Only needed
 * when some client left since the events were gathered: its memory may be
 * gone, so events naming it are dropped. */
static int still_added(const struct cfx_proxy *proxy, const struct cfx_proxy_client *client)
{
    for (const struct cfx_proxy_client *c = proxy->clients; c; c = c->next)
        if (c == client)
            return 1;
    return 0;
}

/* Sleep until a descriptor or cfx_proxy_wake wakes us (or SLEEP_MS, or the
 * shortest poll_ns of a client, passes), then hand out the events. */
static void proxy_sleep(struct cfx_proxy *proxy)
{
    struct epoll_event events[MAX_EVENTS];
    uint64_t generation;
    int64_t limit_ns;
    /* One more look first: work posted since the last pass raised no edge
     * if a user thread already drained its socket. */
    if (locked_pass(proxy, &generation, &limit_ns) ||
        atomic_load_explicit(&proxy->stop, memory_order_acquire))
        return;
    int n;
    int64_t left = atomic_load_explicit(&proxy->lease_ns, memory_order_relaxed) - cfx_time_now_ns();
    if (left > limit_ns)
        left = limit_ns;
    if (left > 0) {
        /* A user thread moves bytes itself: an arrival must not wake this
         * thread too (two cores, two ranks: it would preempt a rank). Nap
         * on the eventfd alone, then take the queued events in one go. */
        struct pollfd wake = {.fd = proxy->wake_fd, .events = POLLIN};
        struct timespec nap = {(time_t)(left / CFX_NS_PER_SEC), (long)(left % CFX_NS_PER_SEC)};
        ppoll(&wake, 1, &nap, NULL);
        n = epoll_wait(proxy->epoll_fd, events, MAX_EVENTS, 0);
    } else if (limit_ns < CFX_NS_PER_MS) {
        /* A client polls faster than epoll_wait's milliseconds. */
        struct timespec until = {0, (long)limit_ns};
        n = epoll_pwait2(proxy->epoll_fd, events, MAX_EVENTS, &until, NULL);
    } else {
        n = epoll_wait(proxy->epoll_fd, events, MAX_EVENTS, (int)((limit_ns + 999999) / 1000000));
    }
    if (n <= 0)
        return;
    pthread_mutex_lock(&proxy->lock);
    int changed = generation != proxy->generation;
    for (int i = 0; i < n; i++) {
        struct cfx_proxy_client *client = events[i].data.ptr;
        if (client == NULL) {
            uint64_t count;
            if (read(proxy->wake_fd, &count, sizeof(count)) < 0) {
                /* EAGAIN: another wake already drained it. */
            }
            continue;
        }
        if (changed && !still_added(proxy, client))
            continue;
        if (client->ready)
            client->ready(client->arg, events[i].events);
    }
    pthread_mutex_unlock(&proxy->lock);
}

static void *proxy_main(void *arg)
{
    struct cfx_proxy *proxy = arg;
    int64_t idle_since = 0;
    while (!atomic_load_explicit(&proxy->stop, memory_order_acquire)) {
        if (locked_pass(proxy, NULL, NULL)) {
            idle_since = 0;
            continue;
        }
        int64_t now = cfx_time_now_ns();
        if (idle_since == 0)
            idle_since = now;
        if (now - idle_since < atomic_load_explicit(&proxy->spin_ns, memory_order_relaxed)) {
            cpu_relax();
            continue;
        }
        proxy_sleep(proxy);
        idle_since = 0;
    }
    return NULL;
}

/* ============================================================ lifecycle */

/* Stops the thread (when it runs), closes, frees; accepts half-built. */
static void proxy_destroy(struct cfx_proxy *proxy, int thread_started)
{
    if (thread_started) {
        atomic_store_explicit(&proxy->stop, 1, memory_order_release);
        cfx_proxy_wake(proxy);
        pthread_join(proxy->thread, NULL);
    }
    assert(proxy->clients == NULL); /* cfx_proxy_remove every client first. */
    if (proxy->epoll_fd >= 0)
        close(proxy->epoll_fd);
    if (proxy->wake_fd >= 0)
        close(proxy->wake_fd);
    pthread_mutex_destroy(&proxy->lock);
    free(proxy);
}

static cfxResult_t proxy_create(struct cfx_proxy **proxy_p)
{
    cfxResult_t res;
    struct cfx_proxy *proxy = NULL;
    if (posix_memalign((void **)&proxy, CFX_CACHE_LINE, sizeof(*proxy)) != 0)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "proxy: out of memory");
    memset(proxy, 0, sizeof(*proxy));
    pthread_mutex_init(&proxy->lock, NULL);
    proxy->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    proxy->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (proxy->wake_fd < 0 || proxy->epoll_fd < 0 ||
        epoll_ctl(proxy->epoll_fd, EPOLL_CTL_ADD, proxy->wake_fd, &ev) != 0) {
        res = cfx_error_set_errno(errno, CFX_LOG_INIT,
                                  "proxy: cannot create the progress thread's descriptors");
        goto err_destroy;
    }
    int err = pthread_create(&proxy->thread, NULL, proxy_main, proxy);
    if (err != 0) {
        res = cfx_error_set_errno(err, CFX_LOG_INIT, "proxy: cannot start the progress thread");
        goto err_destroy;
    }
    pthread_setname_np(proxy->thread, "cfx-proxy");
    *proxy_p = proxy;
    return cfxSuccess;

err_destroy:
    proxy_destroy(proxy, 0);
    return res;
}

cfxResult_t cfx_proxy_get(int64_t spin_ns, struct cfx_proxy **proxy_p)
{
    pthread_once(&atfork_once, atfork_install);
    cfxResult_t res = cfxSuccess;
    pthread_mutex_lock(&registry_lock);
    if (current == NULL) {
        res = proxy_create(&current);
        if (res == cfxSuccess)
            CFX_INFO(CFX_LOG_INIT, "proxy: started the progress thread");
    }
    if (res == cfxSuccess) {
        current->users++;
        int64_t spin = atomic_load_explicit(&current->spin_ns, memory_order_relaxed);
        if (spin_ns > spin)
            atomic_store_explicit(&current->spin_ns, spin_ns, memory_order_relaxed);
        *proxy_p = current;
    }
    pthread_mutex_unlock(&registry_lock);
    return res;
}

void cfx_proxy_put(struct cfx_proxy *proxy)
{
    if (proxy == NULL)
        return;
    pthread_mutex_lock(&registry_lock);
    assert(proxy->users > 0);
    int last = --proxy->users == 0;
    if (proxy != current)
        last = 0; /* The parent's, in a forked child: its thread is not here; leave it. */
    else if (last)
        current = NULL;
    pthread_mutex_unlock(&registry_lock);
    if (last) {
        proxy_destroy(proxy, 1);
        CFX_INFO(CFX_LOG_INIT, "proxy: stopped the progress thread");
    }
}

/* ============================================================ clients */

static void lock_from_user(struct cfx_proxy *proxy)
{
    atomic_fetch_add_explicit(&proxy->lock_waiters, 1, memory_order_relaxed);
    pthread_mutex_lock(&proxy->lock);
    atomic_fetch_sub_explicit(&proxy->lock_waiters, 1, memory_order_relaxed);
}

cfxResult_t cfx_proxy_add(struct cfx_proxy *proxy, struct cfx_proxy_client *client, const int *fds,
                          int n_fds, uint32_t fd_events)
{
    assert(client->progress != NULL);
    if (n_fds < 0 || n_fds > CFX_PROXY_MAX_FDS)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "proxy: %d descriptors for one client (at most %d)", n_fds,
                             CFX_PROXY_MAX_FDS);
    cfxResult_t res = cfxSuccess;
    lock_from_user(proxy);
    for (int i = 0; i < n_fds; i++) {
        struct epoll_event ev = {.events = fd_events | EPOLLET, .data.ptr = client};
        if (epoll_ctl(proxy->epoll_fd, EPOLL_CTL_ADD, fds[i], &ev) != 0) {
            res = cfx_error_set_errno(errno, CFX_LOG_INIT,
                                      "proxy: cannot watch descriptor %d (%d of %d of a client)",
                                      fds[i], i + 1, n_fds);
            for (int j = 0; j < i; j++)
                epoll_ctl(proxy->epoll_fd, EPOLL_CTL_DEL, fds[j], NULL);
            goto out_unlock;
        }
        client->fds[i] = fds[i];
    }
    client->n_fds = n_fds;
    client->prev = NULL;
    client->next = proxy->clients;
    if (proxy->clients)
        proxy->clients->prev = client;
    proxy->clients = client;
out_unlock:
    pthread_mutex_unlock(&proxy->lock);
    if (res == cfxSuccess)
        cfx_proxy_wake(proxy); /* Work may already wait. */
    return res;
}

void cfx_proxy_remove(struct cfx_proxy *proxy, struct cfx_proxy_client *client)
{
    lock_from_user(proxy);
    if (client->prev)
        client->prev->next = client->next;
    else
        proxy->clients = client->next;
    if (client->next)
        client->next->prev = client->prev;
    for (int i = 0; i < client->n_fds; i++)
        epoll_ctl(proxy->epoll_fd, EPOLL_CTL_DEL, client->fds[i], NULL);
    client->n_fds = 0;
    client->next = client->prev = NULL;
    proxy->generation++;
    pthread_mutex_unlock(&proxy->lock);
}

void cfx_proxy_wake(struct cfx_proxy *proxy)
{
    uint64_t one = 1;
    if (write(proxy->wake_fd, &one, sizeof(one)) < 0) {
        /* EAGAIN: the counter is saturated, so the thread wakes anyway. */
    }
}

void cfx_proxy_lease(struct cfx_proxy *proxy, int64_t until_ns)
{
    int64_t lease = atomic_load_explicit(&proxy->lease_ns, memory_order_relaxed);
    if (until_ns > lease + LEASE_SLACK_NS || until_ns < lease - LEASE_SLACK_NS)
        atomic_store_explicit(&proxy->lease_ns, until_ns, memory_order_relaxed);
}
