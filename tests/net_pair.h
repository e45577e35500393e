/*
 * A send comm and a receive comm of one ncclNet_v9 table connected to each
 * other in one process, for the tests that call Conflux's built-in nets'
 * tables directly (test_net_builtin_socket.c, test_net_builtin_ib.c).
 * Header-only: each test file is its own executable.
 */
#ifndef CFX_TESTS_NET_PAIR_H
#define CFX_TESTS_NET_PAIR_H

#include <criterion/criterion.h>
#include <string.h>
#include <time.h>

#include "transports/net/nccl_net.h"

static inline double net_pair_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct net_pair {
    const ncclNet_v9_t *net;
    int dev;
    void *listen, *send, *recv;
    char handle[NCCL_NET_HANDLE_MAXSIZE];
};

/* Calls connect and accept on a listening pair until both comms exist, 5 s
 * at most (a net's connect may finish only once accept has answered). */
static inline void net_pair_connect(struct net_pair *p)
{
    double end = net_pair_now_s() + 5;
    while ((p->send == NULL || p->recv == NULL) && net_pair_now_s() < end) {
        if (p->send == NULL)
            cr_assert_eq(p->net->connect(p->dev, p->handle, &p->send, NULL), ncclSuccess,
                         "connect");
        if (p->recv == NULL)
            cr_assert_eq(p->net->accept(p->listen, &p->recv, NULL), ncclSuccess, "accept");
    }
    cr_assert(p->send != NULL && p->recv != NULL, "not connected within 5 s (send %p, recv %p)",
              p->send, p->recv);
}

/* @p net (initialized) listening on device @p dev, then connected from
 * the same device. */
static inline void net_pair_open_dev(struct net_pair *p, const ncclNet_v9_t *net, int dev)
{
    memset(p, 0, sizeof(*p));
    p->net = net;
    p->dev = dev;
    int n = 0;
    cr_assert_eq(net->devices(&n), ncclSuccess);
    cr_assert_gt(n, dev, "%d devices, no device %d", n, dev);
    cr_assert_eq(net->listen(dev, p->handle, &p->listen), ncclSuccess, "listen");
    net_pair_connect(p);
}

/* On device 0. */
static inline void net_pair_open(struct net_pair *p, const ncclNet_v9_t *net)
{
    net_pair_open_dev(p, net, 0);
}

static inline void net_pair_close(struct net_pair *p)
{
    if (p->send)
        p->net->closeSend(p->send);
    if (p->recv)
        p->net->closeRecv(p->recv);
    if (p->listen)
        p->net->closeListen(p->listen);
}

/* Tests @p request until done or failed, 5 s at most; its size into *size_p. */
static inline ncclResult_t net_pair_wait(const struct net_pair *p, void *request, int *size_p)
{
    double end = net_pair_now_s() + 5;
    while (net_pair_now_s() < end) {
        int done = 0;
        ncclResult_t res = p->net->test(request, &done, size_p);
        if (res != ncclSuccess || done)
            return res;
    }
    cr_assert_fail("a request was not done within 5 s");
    return ncclInternalError;
}

/* irecv of @p bytes at @p data (registered as @p mhandle) on the pair's
 * receive comm: the request, or NULL when the net has no room. */
static inline void *net_pair_post_recv(const struct net_pair *p, void *data, size_t bytes,
                                       void *mhandle)
{
    void *request = NULL;
    int tag = 0;
    cr_assert_eq(p->net->irecv(p->recv, 1, &data, &bytes, &tag, &mhandle, &request), ncclSuccess);
    return request;
}

#endif /* CFX_TESTS_NET_PAIR_H */
