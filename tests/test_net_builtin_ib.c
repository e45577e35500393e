/*
 * Conflux's built-in verbs net (transports/ib/net.c) called directly
 * through its ncclNet_v9 table, in one process over tests/fakeverbs (a
 * libibverbs of the project's own: these are fake-verbs results, never an
 * RDMA NIC's). One behaviour per test; connections through the whole
 * library are in test_transport_net.c (suite net_builtin_ib) and the
 * conformance suite. Without fake-verbs (a build without the verbs
 * headers) every test reports SKIP.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/harness.h"
#include "tests/net_pair.h"
#include "transports/net/builtin.h"

/* The table, initialized over fake-verbs, or a skip saying why not. */
static const ncclNet_v9_t *verbs_net(void)
{
    if (cfx_net_builtin_ib == NULL)
        cr_skip_test("built without the verbs headers: no verbs net");
    if (cfx_test_use_fakeverbs() == NULL)
        cr_skip_test("no fake-verbs library (CFX_TEST_FAKEVERBS unset: run through ctest)");
    const ncclNet_v9_t *net = cfx_net_builtin_ib;
    cr_assert_eq(net->init(NULL), ncclSuccess, "init over fake-verbs");
    return net;
}

/* The verbs net's pair over fake-verbs. */
static void pair_open(struct net_pair *p)
{
    net_pair_open(p, verbs_net());
}

/* isend until it takes the message (it answers NULL until the receive's
 * clear-to-send is there), testing @p progress meanwhile. */
static void *send_when_cleared(const struct net_pair *p, void *data, size_t bytes, void *mhandle,
                               ncclResult_t *res_p)
{
    void *request = NULL;
    double end = net_pair_now_s() + 5;
    while (request == NULL && net_pair_now_s() < end) {
        *res_p = p->net->isend(p->send, data, bytes, 0, mhandle, &request);
        if (*res_p != ncclSuccess)
            return NULL;
    }
    return request;
}

Test(builtin_ib, messages_of_every_size_land_in_place_whole_and_in_order)
{
    struct net_pair p;
    pair_open(&p);
    static const size_t sizes[] = {0, 1, 7, 64, 4096, 65537, (1 << 20) + 3, 16};
    enum { N = sizeof(sizes) / sizeof(sizes[0]) };
    unsigned char *out[N], *in[N];
    void *mout[N], *min[N], *sreq[N], *rreq[N];
    for (int i = 0; i < N; i++) {
        out[i] = malloc(sizes[i] + 1);
        in[i] = malloc(sizes[i] + 64);
        for (size_t b = 0; b < sizes[i]; b++)
            out[i][b] = (unsigned char)(b * 13 + (size_t)i);
        memset(in[i], 0xee, sizes[i] + 64);
        cr_assert_eq(p.net->regMr(p.send, out[i], sizes[i] + 1, NCCL_PTR_HOST, &mout[i]),
                     ncclSuccess);
        cr_assert_eq(p.net->regMr(p.recv, in[i], sizes[i] + 64, NCCL_PTR_HOST, &min[i]),
                     ncclSuccess);
        rreq[i] = net_pair_post_recv(&p, in[i], sizes[i] + 64, min[i]);
        cr_assert_not_null(rreq[i], "receive %d refused", i);
    }
    for (int i = 0; i < N; i++) {
        ncclResult_t res = ncclSuccess;
        sreq[i] = send_when_cleared(&p, out[i], sizes[i], mout[i], &res);
        cr_assert_eq(res, ncclSuccess, "send %d", i);
        cr_assert_not_null(sreq[i], "send %d was never cleared", i);
    }
    for (int i = 0; i < N; i++) {
        int got = -1;
        cr_assert_eq(net_pair_wait(&p, rreq[i], &got), ncclSuccess, "receive %d", i);
        cr_assert_eq((size_t)got, sizes[i], "receive %d: %d bytes, not %zu", i, got, sizes[i]);
        cr_assert(memcmp(in[i], out[i], sizes[i]) == 0, "receive %d: wrong bytes", i);
        cr_assert_eq(in[i][sizes[i]], 0xee, "receive %d wrote past its message", i);
        cr_assert_eq(net_pair_wait(&p, sreq[i], &got), ncclSuccess, "send %d", i);
        p.net->deregMr(p.send, mout[i]);
        p.net->deregMr(p.recv, min[i]);
        free(out[i]);
        free(in[i]);
    }
    net_pair_close(&p);
}

/* No receive posted: isend answers NULL (its clear-to-send is not there),
 * and takes the message once the receive is posted. */
Test(builtin_ib, a_send_waits_for_its_receive_to_be_posted)
{
    struct net_pair p;
    pair_open(&p);
    static char out[32] = "clear to send, then the message", in[32];
    void *mo = NULL, *mi = NULL, *sreq = NULL;
    cr_assert_eq(p.net->regMr(p.send, out, sizeof(out), NCCL_PTR_HOST, &mo), ncclSuccess);
    cr_assert_eq(p.net->regMr(p.recv, in, sizeof(in), NCCL_PTR_HOST, &mi), ncclSuccess);
    for (int i = 0; i < 1000; i++) {
        cr_assert_eq(p.net->isend(p.send, out, sizeof(out), 0, mo, &sreq), ncclSuccess);
        cr_assert_null(sreq, "a send was taken before its receive was posted");
    }
    void *rreq = net_pair_post_recv(&p, in, sizeof(in), mi);
    ncclResult_t res = ncclSuccess;
    sreq = send_when_cleared(&p, out, sizeof(out), mo, &res);
    cr_assert_not_null(sreq);
    int got = 0;
    cr_assert_eq(net_pair_wait(&p, rreq, &got), ncclSuccess);
    cr_assert_str_eq(in, out);
    net_pair_close(&p);
}

/* A message larger than its receive fails the sending comm for good. */
Test(builtin_ib, an_oversized_message_fails_the_sending_comm)
{
    struct net_pair p;
    pair_open(&p);
    static char out[100], in[50];
    void *mo = NULL, *mi = NULL;
    cr_assert_eq(p.net->regMr(p.send, out, sizeof(out), NCCL_PTR_HOST, &mo), ncclSuccess);
    cr_assert_eq(p.net->regMr(p.recv, in, sizeof(in), NCCL_PTR_HOST, &mi), ncclSuccess);
    net_pair_post_recv(&p, in, sizeof(in), mi);
    ncclResult_t res = ncclSuccess;
    send_when_cleared(&p, out, sizeof(out), mo, &res);
    cr_assert_eq(res, ncclInvalidUsage, "100 bytes into a receive of 50");
    void *again = NULL;
    cr_assert_eq(p.net->isend(p.send, out, 10, 0, mo, &again), ncclInvalidUsage,
                 "the failed comm took another send");
    net_pair_close(&p);
}

/* The sender goes away: the receiver's pending receive fails with
 * ncclRemoteError (its setup connection closed), not a hang. */
Test(builtin_ib, a_closed_peer_fails_a_pending_receive_with_remote_error)
{
    struct net_pair p;
    pair_open(&p);
    static char in[64];
    void *mi = NULL;
    cr_assert_eq(p.net->regMr(p.recv, in, sizeof(in), NCCL_PTR_HOST, &mi), ncclSuccess);
    void *rreq = net_pair_post_recv(&p, in, sizeof(in), mi);
    p.net->closeSend(p.send);
    p.send = NULL;
    int got = 0;
    cr_assert_eq(net_pair_wait(&p, rreq, &got), ncclRemoteError);
    net_pair_close(&p);
}

Test(builtin_ib, reports_its_ports_as_devices_that_move_host_memory)
{
    const ncclNet_v9_t *net = verbs_net();
    ncclNetProperties_v9_t props;
    cr_assert_eq(net->getProperties(0, &props), ncclSuccess);
    cr_assert_str_eq(props.name, "fake_0", "device 0 is %s", props.name);
    cr_assert_eq(props.port, 1);
    cr_assert_eq(props.ptrSupport, NCCL_PTR_HOST);
    cr_assert_gt(props.speed, 0);
    cr_assert_str_eq(net->name, "IB");
}
