/*
 * The proxy: one progress thread per process, shared by every transport
 * and communicator that needs bytes moved while no user thread moves them
 * (the socket transport's connectors today; verbs completion queues later).
 *
 * A user of the proxy embeds a struct cfx_proxy_client in its own object,
 * fills progress (and optionally ready and the file descriptors to watch)
 * and adds it. The thread then loops: one pass calls every client's
 * progress(); while some pass moves anything it passes again, else it spins
 * (the largest spin any user asked for), then sleeps in epoll_wait on the
 * clients' descriptors (edge-triggered) and its own eventfd, calling ready()
 * for each descriptor that turned ready. cfx_proxy_wake() ends a sleep.
 *
 * The data path stays the user thread's: a transport moves bytes from the
 * thread that posts or waits and only leaves to the proxy what nobody else
 * moves. While user threads move bytes (cfx_proxy_lease), the proxy naps on
 * its eventfd alone so that an arriving packet does not wake two threads.
 *
 * Threads: progress() and ready() run on the proxy thread only, with the
 * proxy's lock held; add and remove take that lock, so once remove returns
 * neither runs for that client again. Callbacks must not block, must not
 * call cfx_proxy_add/remove/get/put, and should take no lock a thread
 * holding one while it calls cfx_proxy_add/remove could hold.
 */
#ifndef CFX_PROXY_PROXY_H
#define CFX_PROXY_PROXY_H

#include <stdatomic.h>
#include <stdint.h>

#include "conflux.h"

#define CFX_PROXY_MAX_FDS 16 /* Descriptors one client may have watched. */

struct cfx_proxy;

/* One registered piece of work, embedded in its owner's object. */
struct cfx_proxy_client {
    /* Set by the owner before cfx_proxy_add; constant while added. */
    /* One pass over this client's work: move what can move without
     * blocking. Returns nonzero when anything moved (the thread passes
     * again at once), 0 when idle. */
    int (*progress)(void *arg);
    /* Optional (may be NULL): one of the watched descriptors turned ready
     * (epoll(7) event bits). May be called spuriously; a pass follows. */
    void (*ready)(void *arg, uint32_t events);
    void *arg;
    /* How often (ns) the sleeping thread must still pass over this client
     * although no descriptor of it turned ready: for work whose progress
     * raises no edge on a descriptor (a verbs completion queue that is
     * polled). 0: descriptors and wakes only. The owner may change it at any
     * time (a relaxed store), e.g. only while it has work in flight; the
     * thread reads it before each sleep. */
    _Atomic int64_t poll_ns;
    /* The proxy's, while added. */
    int fds[CFX_PROXY_MAX_FDS];
    int n_fds;
    struct cfx_proxy_client *next, *prev;
};

/* A client whose connector a GPU kernel posts to and releases (a kernel
 * never kicks): the proxy passes over it every CFX_PROXY_KERNEL_FAST_NS for
 * CFX_PROXY_KERNEL_AFTER_NS after anything moved, else every
 * CFX_PROXY_KERNEL_IDLE_NS (the socket, ib and net-plugin transports). */
#define CFX_PROXY_KERNEL_FAST_NS  ((int64_t)20 * 1000)
#define CFX_PROXY_KERNEL_IDLE_NS  ((int64_t)1000 * 1000)
#define CFX_PROXY_KERNEL_AFTER_NS ((int64_t)50 * 1000 * 1000)

/* The poll interval of such a client after a pass at @p now that moved
 * something (@p moved) or not; *moved_ns keeps when it last did. */
static inline int64_t cfx_proxy_kernel_poll_ns(int64_t *moved_ns, int moved, int64_t now)
{
    if (moved)
        *moved_ns = now;
    return now - *moved_ns < CFX_PROXY_KERNEL_AFTER_NS ? CFX_PROXY_KERNEL_FAST_NS
                                                       : CFX_PROXY_KERNEL_IDLE_NS;
}

/* The process's proxy, started by the first caller (a thread named
 * "cfx-proxy", an epoll set and an eventfd), with one more user counted;
 * every successful get is paired with one cfx_proxy_put. @p spin_ns: how
 * long this user wants the idle thread to spin before it sleeps (the
 * thread spins the largest of these while it runs). Any thread; blocks only
 * briefly (thread creation). cfxSystemError when the thread or its
 * descriptors cannot be made. Safe across fork(): a child starts its own. */
cfxResult_t cfx_proxy_get(int64_t spin_ns, struct cfx_proxy **proxy_p);

/* Give back one user's reference; the last one stops and joins the
 * thread and closes its descriptors, so no thread or descriptor of the
 * proxy is left. Every client this user added must have been removed.
 * Any thread but the proxy's; blocks until the thread exits (at most one
 * pass plus one wake-up). Accepts NULL. A reference taken before fork()
 * and given back in the child is only counted down there (the parent's
 * thread is not in the child). */
void cfx_proxy_put(struct cfx_proxy *proxy);

/* Add @p client, watching @p n_fds descriptors @p fds (0..CFX_PROXY_MAX_FDS,
 * edge-triggered epoll with @p fd_events, e.g. EPOLLIN | EPOLLOUT |
 * EPOLLRDHUP; an eventfd or a completion channel's descriptor works too),
 * then wake the thread: work may already wait. The descriptors stay the
 * caller's; close them only after cfx_proxy_remove. Any thread but the
 * proxy's; takes the proxy lock (waits for the current pass at most).
 * cfxInvalidArgument for too many descriptors; cfxSystemError (with a
 * sentence) when epoll refuses one, nothing added then. */
cfxResult_t cfx_proxy_add(struct cfx_proxy *proxy, struct cfx_proxy_client *client, const int *fds,
                          int n_fds, uint32_t fd_events);

/* Take @p client back: stops watching its descriptors and waits until its
 * progress() and ready() can no longer run (a pass that runs it now
 * finishes first). Once it returns the owner may free the client. Any
 * thread but the proxy's; blocks for at most one pass. */
void cfx_proxy_remove(struct cfx_proxy *proxy, struct cfx_proxy_client *client);

/* End the thread's sleep now, so it passes over every client soon (a
 * poison to send, a close to flush). Any thread; never blocks; one write(2)
 * on the eventfd, so keep it off the per-slot data path. */
void cfx_proxy_wake(struct cfx_proxy *proxy);

/* A user thread moves bytes itself until @p until_ns (cfx_time_now_ns
 * clock; an earlier time ends the lease): meanwhile the sleeping thread
 * naps on its eventfd alone instead of on every descriptor. For the data
 * path: no system call, no lock; one relaxed load, and a store only when
 * the lease moves by more than a few microseconds. Any thread. */
void cfx_proxy_lease(struct cfx_proxy *proxy, int64_t until_ns);

#endif /* CFX_PROXY_PROXY_H */
