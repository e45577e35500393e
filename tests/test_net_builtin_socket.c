/*
 * Conflux's built-in socket net (transports/net/builtin_socket.c) called
 * directly through its ncclNet_v9 table, in one process over loopback (as
 * ctest sets CFX_SOCKET_IFNAME=lo): the contract the net-plugin transport
 * relies on, one behaviour per test. Connections through the whole
 * library are in test_transport_net.c (suite net_builtin) and the
 * conformance suite.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "src/util/socket.h"
#include "src/util/time.h"
#include "tests/net_pair.h"
#include "transports/net/builtin.h"

static const ncclNet_v9_t *const net = &cfx_net_builtin_socket;

/* The socket net's pair: init, then listen and connect. */
static void pair_open(struct net_pair *p)
{
    cr_assert_eq(net->init(NULL), ncclSuccess, "init");
    net_pair_open(p, net);
}

Test(builtin_socket, reports_one_device_that_moves_host_memory)
{
    cr_assert_eq(net->init(NULL), ncclSuccess);
    ncclNetProperties_v9_t props;
    cr_assert_eq(net->getProperties(0, &props), ncclSuccess);
    cr_assert_str_eq(props.name, "lo", "CFX_SOCKET_IFNAME=lo gave device %s", props.name);
    cr_assert_eq(props.ptrSupport, NCCL_PTR_HOST);
    cr_assert_eq(props.maxRecvs, 1);
    cr_assert_gt(props.speed, 0);
    cr_assert_eq(net->getProperties(1, &props), ncclInvalidArgument, "a second device");
    void *mhandle = NULL;
    char buf[64];
    cr_assert_eq(net->regMr(NULL, buf, sizeof(buf), NCCL_PTR_HOST, &mhandle), ncclSuccess);
    cr_assert_eq(net->deregMr(NULL, mhandle), ncclSuccess);
    cr_assert_eq(net->regMr(NULL, buf, sizeof(buf), NCCL_PTR_CUDA, &mhandle), ncclInvalidArgument,
                 "CUDA memory registered on a host-only net");
}

/* Sizes 0 to 1 MiB + 3 queued all at once, arriving whole, in order. */
Test(builtin_socket, messages_of_every_size_arrive_whole_and_in_order)
{
    struct net_pair p;
    pair_open(&p);
    static const size_t sizes[] = {0, 1, 7, 8, 4095, 4096, 9000, 65536, (1 << 20) + 3, 16};
    enum { N = sizeof(sizes) / sizeof(sizes[0]) };
    unsigned char *out[N], *in[N];
    void *sreq[N], *rreq[N];
    for (int i = 0; i < N; i++) {
        out[i] = malloc(sizes[i] + 1);
        in[i] = malloc(sizes[i] + 64);
        for (size_t b = 0; b < sizes[i]; b++)
            out[i][b] = (unsigned char)(b * 7 + (size_t)i);
        memset(in[i], 0xee, sizes[i] + 64);
        rreq[i] = net_pair_post_recv(&p, in[i], sizes[i] + 64, NULL); /* Room to spare. */
        cr_assert_not_null(rreq[i], "receive %d refused", i);
        sreq[i] = NULL;
        cr_assert_eq(net->isend(p.send, out[i], sizes[i], 0, NULL, &sreq[i]), ncclSuccess);
        cr_assert_not_null(sreq[i], "send %d refused", i);
    }
    for (int i = 0; i < N; i++) {
        int got = -1;
        cr_assert_eq(net_pair_wait(&p, rreq[i], &got), ncclSuccess, "receive %d", i);
        cr_assert_eq((size_t)got, sizes[i], "receive %d: %d bytes, not %zu", i, got, sizes[i]);
        cr_assert(memcmp(in[i], out[i], sizes[i]) == 0, "receive %d: wrong bytes", i);
        cr_assert_eq(in[i][sizes[i]], 0xee, "receive %d wrote past its message", i);
        cr_assert_eq(net_pair_wait(&p, sreq[i], &got), ncclSuccess, "send %d", i);
        free(out[i]);
        free(in[i]);
    }
    net_pair_close(&p);
}

/* 32 requests per comm; the 33rd is a NULL request (call again), and a
 * request tested done frees its place. */
Test(builtin_socket, a_full_request_table_answers_null_until_one_is_done)
{
    struct net_pair p;
    pair_open(&p);
    static char buf[64][8];
    void *rreq[33];
    for (int i = 0; i < 32; i++)
        cr_assert_not_null(rreq[i] = net_pair_post_recv(&p, buf[i], 8, NULL), "receive %d", i);
    cr_assert_null(net_pair_post_recv(&p, buf[32], 8, NULL), "a 33rd receive was queued");
    void *sreq = NULL;
    cr_assert_eq(net->isend(p.send, buf[40], 8, 0, NULL, &sreq), ncclSuccess);
    int got = 0;
    cr_assert_eq(net_pair_wait(&p, rreq[0], &got), ncclSuccess);
    cr_assert_not_null(rreq[32] = net_pair_post_recv(&p, buf[32], 8, NULL),
                       "no room once one was done");
    cr_assert_eq(net_pair_wait(&p, sreq, &got), ncclSuccess);
    net_pair_close(&p);
}

/* A message larger than its receive fails the comm, which stays failed. */
Test(builtin_socket, an_oversized_message_fails_the_receiving_comm)
{
    struct net_pair p;
    pair_open(&p);
    static char out[100], in[50];
    void *rreq = net_pair_post_recv(&p, in, sizeof(in), NULL), *sreq = NULL;
    cr_assert_eq(net->isend(p.send, out, sizeof(out), 0, NULL, &sreq), ncclSuccess);
    int got = 0;
    cr_assert_eq(net_pair_wait(&p, rreq, &got), ncclInvalidUsage, "100 bytes into a receive of 50");
    void *again = NULL;
    size_t bytes = sizeof(in);
    void *data = in, *mhandle = NULL;
    int tag = 0;
    cr_assert_eq(net->irecv(p.recv, 1, &data, &bytes, &tag, &mhandle, &again), ncclInvalidUsage,
                 "the failed comm took another receive");
    net_pair_close(&p);
}

/* The sender goes away: the receiver's pending receive fails with
 * ncclRemoteError, not a hang. */
Test(builtin_socket, a_closed_peer_fails_a_pending_receive_with_remote_error)
{
    struct net_pair p;
    pair_open(&p);
    static char in[64];
    void *rreq = net_pair_post_recv(&p, in, sizeof(in), NULL);
    net->closeSend(p.send);
    p.send = NULL;
    int got = 0;
    cr_assert_eq(net_pair_wait(&p, rreq, &got), ncclRemoteError);
    net_pair_close(&p);
}

/* A connection to the listener that does not say the right hello is
 * dropped; a proper one after it is accepted. */
Test(builtin_socket, a_connection_without_the_hello_is_never_accepted)
{
    struct net_pair p;
    memset(&p, 0, sizeof(p));
    p.net = net;
    cr_assert_eq(net->init(NULL), ncclSuccess);
    cr_assert_eq(net->listen(0, p.handle, &p.listen), ncclSuccess);
    /* The handle starts with the magic and the nonce, then the address. */
    struct cfx_sockaddr_wire wire;
    memcpy(&wire, p.handle + 16, sizeof(wire));
    union cfx_sockaddr addr;
    cr_assert_eq(cfx_socket_addr_from_wire(&wire, &addr), cfxSuccess);
    int fd = -1;
    cr_assert_eq(cfx_socket_connect(&addr, cfx_time_deadline_s(5), NULL, &fd), cfxSuccess);
    static const char stranger[16] = "GET / HTTP/1.0\r\n";
    cr_assert_eq(send(fd, stranger, sizeof(stranger), 0), (ssize_t)sizeof(stranger));
    double end = net_pair_now_s() + 0.5;
    while (net_pair_now_s() < end) {
        cr_assert_eq(net->accept(p.listen, &p.recv, NULL), ncclSuccess);
        cr_assert_null(p.recv, "a connection without the hello was accepted");
    }
    close(fd);
    net_pair_connect(&p); /* The proper connection after it is accepted. */
    net_pair_close(&p);
}
