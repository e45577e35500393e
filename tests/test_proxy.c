/*
 * The process's proxy thread (src/proxy): a watched eventfd brings its
 * client's ready() and a pass; remove waits for a callback that is running
 * and none runs after it; every user shares one thread, which stops with
 * the last user and leaves no thread or descriptor behind (a forked child
 * starts its own); bad registrations are refused with a sentence.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "src/proxy/proxy.h"
#include "src/util/error.h"
#include "src/util/time.h"

#define DEADLINE_NS (10 * CFX_NS_PER_SEC)

/* ------------------------------------------------------------ helpers */

static int count_entries(const char *path)
{
    DIR *dir = opendir(path);
    if (dir == NULL)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));)
        if (e->d_name[0] != '.')
            n++;
    closedir(dir);
    return n;
}

/* Threads of this process named "cfx-proxy". */
static int proxy_threads(void)
{
    DIR *dir = opendir("/proc/self/task");
    if (dir == NULL)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], name[64] = "";
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue; /* The thread exited meanwhile. */
        if (fgets(name, sizeof(name), f) && strncmp(name, "cfx-proxy", 9) == 0)
            n++;
        fclose(f);
    }
    closedir(dir);
    return n;
}

/* proxy_threads() once it reads `expected`, or after 2 s. pthread_join
 * returns when the kernel clears the thread's id, a moment before the
 * exited thread leaves /proc/self/task: a count read right after a joining
 * put may still see it. */
static int proxy_threads_settled(int expected)
{
    int64_t deadline = cfx_time_now_ns() + 2 * CFX_NS_PER_SEC;
    int n;
    while ((n = proxy_threads()) != expected && cfx_time_now_ns() < deadline)
        usleep(1000);
    return n;
}

static int tasks_settled(int expected)
{
    int64_t deadline = cfx_time_now_ns() + 2 * CFX_NS_PER_SEC;
    int n;
    while ((n = count_entries("/proc/self/task")) != expected && cfx_time_now_ns() < deadline)
        usleep(1000);
    return n;
}

/* A client that counts its passes and ready() calls; an eventfd to watch. */
struct counter {
    struct cfx_proxy_client client;
    int fd;
    _Atomic int passes;
    _Atomic int readies;
    _Atomic uint64_t drained; /* Sum of what ready() read from the eventfd. */
};

static int counter_progress(void *arg)
{
    struct counter *c = arg;
    atomic_fetch_add(&c->passes, 1);
    return 0;
}

static void counter_ready(void *arg, uint32_t events)
{
    struct counter *c = arg;
    atomic_fetch_add(&c->readies, 1);
    uint64_t value;
    if ((events & EPOLLIN) && read(c->fd, &value, sizeof(value)) == (ssize_t)sizeof(value))
        atomic_fetch_add(&c->drained, value);
}

static void counter_init(struct counter *c)
{
    memset(c, 0, sizeof(*c));
    c->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    cr_assert_geq(c->fd, 0);
    c->client.progress = counter_progress;
    c->client.ready = counter_ready;
    c->client.arg = c;
}

/* Wait (bounded) until @p value reaches @p target. */
static void await_at_least(_Atomic int *value, int target, const char *what)
{
    int64_t deadline = cfx_time_now_ns() + DEADLINE_NS;
    while (atomic_load(value) < target)
        cr_assert(cfx_time_now_ns() < deadline, "%s: %d after 10 s, expected %d", what,
                  atomic_load(value), target);
}

/* ------------------------------------------------------------ tests */

Test(proxy, watched_eventfd_runs_its_callback, .timeout = 30)
{
    struct cfx_proxy *proxy;
    cr_assert_eq(cfx_proxy_get(0, &proxy), cfxSuccess, "%s", cfx_error_thread_last());
    struct counter c;
    counter_init(&c);
    cr_assert_eq(cfx_proxy_add(proxy, &c.client, &c.fd, 1, EPOLLIN), cfxSuccess, "%s",
                 cfx_error_thread_last());
    await_at_least(&c.passes, 1, "passes after add");
    for (uint64_t round = 1; round <= 3; round++) {
        uint64_t one = 1;
        cr_assert_eq(write(c.fd, &one, sizeof(one)), (ssize_t)sizeof(one));
        int64_t deadline = cfx_time_now_ns() + DEADLINE_NS;
        while (atomic_load(&c.drained) < round)
            cr_assert(cfx_time_now_ns() < deadline,
                      "write %llu on the watched eventfd never reached ready() (%d calls)",
                      (unsigned long long)round, atomic_load(&c.readies));
    }
    /* cfx_proxy_wake alone brings a pass over every client. */
    int before = atomic_load(&c.passes);
    cfx_proxy_wake(proxy);
    await_at_least(&c.passes, before + 1, "passes after a wake");
    cfx_proxy_remove(proxy, &c.client);
    close(c.fd);
    cfx_proxy_put(proxy);
}

/* A progress() that, once armed, stays inside until the remover has
 * started, then lingers 50 ms before it leaves: a remove that did not wait
 * for it would return while `inside` is still set. */
struct slow {
    struct cfx_proxy_client client;
    _Atomic int armed;
    _Atomic int inside;
    _Atomic int removing;
    _Atomic int calls;
};

static int slow_progress(void *arg)
{
    struct slow *s = arg;
    atomic_fetch_add(&s->calls, 1);
    if (!atomic_exchange(&s->armed, 0))
        return 0;
    atomic_store(&s->inside, 1);
    int64_t deadline = cfx_time_now_ns() + DEADLINE_NS;
    while (!atomic_load(&s->removing) && cfx_time_now_ns() < deadline) {
    }
    int64_t until = cfx_time_now_ns() + 50 * CFX_NS_PER_MS;
    while (cfx_time_now_ns() < until) {
    }
    atomic_store(&s->inside, 0);
    return 0;
}

Test(proxy, remove_waits_for_a_running_callback, .timeout = 30)
{
    struct cfx_proxy *proxy;
    cr_assert_eq(cfx_proxy_get(0, &proxy), cfxSuccess, "%s", cfx_error_thread_last());
    struct slow *s = calloc(1, sizeof(*s));
    cr_assert_not_null(s);
    s->client.progress = slow_progress;
    s->client.arg = s;
    atomic_store(&s->armed, 1);
    cr_assert_eq(cfx_proxy_add(proxy, &s->client, NULL, 0, 0), cfxSuccess);
    int64_t deadline = cfx_time_now_ns() + DEADLINE_NS;
    while (!atomic_load(&s->inside))
        cr_assert(cfx_time_now_ns() < deadline, "the proxy never called progress()");
    atomic_store(&s->removing, 1);
    cfx_proxy_remove(proxy, &s->client);
    cr_assert_eq(atomic_load(&s->inside), 0,
                 "cfx_proxy_remove returned while the client's progress() was running");
    /* And it never runs again: another client sees passes go by. */
    int calls = atomic_load(&s->calls);
    struct counter c;
    counter_init(&c);
    cr_assert_eq(cfx_proxy_add(proxy, &c.client, NULL, 0, 0), cfxSuccess);
    await_at_least(&c.passes, 3, "passes of the second client");
    cr_assert_eq(atomic_load(&s->calls), calls, "progress() ran after cfx_proxy_remove");
    free(s); /* The owner may free a removed client at once. */
    cfx_proxy_remove(proxy, &c.client);
    close(c.fd);
    cfx_proxy_put(proxy);
}

Test(proxy, last_user_stops_the_thread, .timeout = 30)
{
    int fds_before = count_entries("/proc/self/fd");
    int threads_before = count_entries("/proc/self/task");
    cr_assert_eq(proxy_threads(), 0);
    struct cfx_proxy *first, *second;
    cr_assert_eq(cfx_proxy_get(0, &first), cfxSuccess, "%s", cfx_error_thread_last());
    cr_assert_eq(cfx_proxy_get(1000, &second), cfxSuccess, "%s", cfx_error_thread_last());
    cr_assert_eq(first, second, "two users got two proxies");
    cr_assert_eq(proxy_threads(), 1, "%d proxy threads for two users", proxy_threads());
    cfx_proxy_put(first);
    cr_assert_eq(proxy_threads(), 1, "the thread stopped while a user was left");
    struct counter c;
    counter_init(&c);
    cr_assert_eq(cfx_proxy_add(second, &c.client, &c.fd, 1, EPOLLIN), cfxSuccess);
    await_at_least(&c.passes, 1, "passes with one user left");
    cfx_proxy_remove(second, &c.client);
    close(c.fd);
    cfx_proxy_put(second);
    /* Put joins the thread; only the kernel's reaping may lag. */
    cr_assert_eq(proxy_threads_settled(0), 0, "a proxy thread is left after the last put");
    cr_assert_eq(tasks_settled(threads_before), threads_before);
    cr_assert_eq(count_entries("/proc/self/fd"), fds_before,
                 "%d descriptors open after the last put (%d before)",
                 count_entries("/proc/self/fd"), fds_before);
    /* A later user starts a fresh one. */
    cr_assert_eq(cfx_proxy_get(0, &first), cfxSuccess);
    cr_assert_eq(proxy_threads(), 1);
    cfx_proxy_put(first);
    cr_assert_eq(proxy_threads_settled(0), 0);
    cfx_proxy_put(NULL);
}

Test(proxy, forked_child_starts_its_own, .timeout = 30)
{
    struct cfx_proxy *proxy;
    cr_assert_eq(cfx_proxy_get(0, &proxy), cfxSuccess);
    /* Fork only once the parent's thread runs its loop: a thread still
     * starting may hold a lock of the C library or of a sanitizer's runtime
     * (ASan's thread registry), which the child would inherit held. */
    struct counter started;
    memset(&started, 0, sizeof(started));
    started.client.progress = counter_progress;
    started.client.arg = &started;
    cr_assert_eq(cfx_proxy_add(proxy, &started.client, NULL, 0, 0), cfxSuccess);
    await_at_least(&started.passes, 2, "passes of the parent's proxy before the fork");
    cfx_proxy_remove(proxy, &started.client);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(20); /* A child that hangs must not outlive the test. */
        /* The parent's thread did not come along: the child's first user
         * must get a running thread, and its last put must stop it. */
        struct cfx_proxy *mine;
        if (proxy_threads() != 0 || cfx_proxy_get(0, &mine) != cfxSuccess)
            _exit(1);
        struct counter c;
        memset(&c, 0, sizeof(c));
        c.client.progress = counter_progress;
        c.client.arg = &c;
        if (cfx_proxy_add(mine, &c.client, NULL, 0, 0) != cfxSuccess)
            _exit(2);
        int64_t deadline = cfx_time_now_ns() + DEADLINE_NS;
        while (atomic_load(&c.passes) < 1)
            if (cfx_time_now_ns() > deadline)
                _exit(3);
        cfx_proxy_remove(mine, &c.client);
        cfx_proxy_put(proxy); /* The parent's reference: counted down only. */
        cfx_proxy_put(mine);
        _exit(proxy_threads_settled(0) == 0 ? 0 : 4);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the forked child's proxy failed (status 0x%x: 1 no fresh proxy, 3 no pass, 4 "
              "thread left)",
              status);
    cr_assert_eq(proxy_threads(), 1, "the parent's thread is gone after the fork");
    cfx_proxy_put(proxy);
}

Test(proxy, bad_registrations_are_refused, .timeout = 30)
{
    struct cfx_proxy *proxy;
    cr_assert_eq(cfx_proxy_get(0, &proxy), cfxSuccess);
    struct counter c;
    counter_init(&c);
    int fds[CFX_PROXY_MAX_FDS + 1];
    for (int i = 0; i <= CFX_PROXY_MAX_FDS; i++)
        fds[i] = c.fd;
    cr_assert_eq(cfx_proxy_add(proxy, &c.client, fds, CFX_PROXY_MAX_FDS + 1, EPOLLIN),
                 cfxInvalidArgument);
    cr_assert(strstr(cfx_error_thread_last(), "descriptors") != NULL, "%s",
              cfx_error_thread_last());
    /* One good descriptor, then a closed one: nothing stays watched. */
    int closed = eventfd(0, EFD_CLOEXEC);
    close(closed);
    int pair[2] = {c.fd, closed};
    cr_assert_eq(cfx_proxy_add(proxy, &c.client, pair, 2, EPOLLIN), cfxSystemError);
    cr_assert(strstr(cfx_error_thread_last(), "cannot watch") != NULL, "%s",
              cfx_error_thread_last());
    /* Not added: the same client and descriptor can be added now. */
    cr_assert_eq(cfx_proxy_add(proxy, &c.client, &c.fd, 1, EPOLLIN), cfxSuccess, "%s",
                 cfx_error_thread_last());
    cfx_proxy_remove(proxy, &c.client);
    close(c.fd);
    cfx_proxy_put(proxy);
}
