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
#include <criterion/parameterized.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* The net's warnings, kept for the tests that check a sentence. */
static char warned[4096];

static void keep_warnings(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                          const char *fmt, ...)
{
    (void)flags;
    (void)file;
    (void)line;
    if (level != NCCL_LOG_WARN)
        return;
    size_t used = strlen(warned);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(warned + used, sizeof(warned) - used, fmt, ap);
    va_end(ap);
    used = strlen(warned);
    if (used + 1 < sizeof(warned))
        strcat(warned, "\n");
}

/* CFX_IB_QPS_PER_CONNECTION and CFX_IB_SPLIT_DATA_ON_QPS for one test
 * (each test is its own process: init reads them once). */
struct qp_case {
    char qps[4]; /* Arrays, not pointers: a test's parameters are copied into its process. */
    char split[4];
};

static void set_qps(const struct qp_case *qc)
{
    cr_log_info("CFX_IB_QPS_PER_CONNECTION=%s CFX_IB_SPLIT_DATA_ON_QPS=%s", qc->qps, qc->split);
    cfx_test_setenv("CFX_IB_QPS_PER_CONNECTION", qc->qps);
    cfx_test_setenv("CFX_IB_SPLIT_DATA_ON_QPS", qc->split);
}

/* One queue pair; three taking messages in turn; three and eight each
 * carrying a part of every message. */
ParameterizedTestParameters(builtin_ib, messages_of_every_size_land_in_place_whole_and_in_order)
{
    static struct qp_case cases[] = {{"1", "0"}, {"3", "0"}, {"3", "1"}, {"8", "1"}};
    return cr_make_param_array(struct qp_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct qp_case *qc, builtin_ib,
                  messages_of_every_size_land_in_place_whole_and_in_order)
{
    set_qps(qc);
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

ParameterizedTestParameters(builtin_ib, a_stream_of_messages_wraps_the_request_ring_many_times)
{
    static struct qp_case cases[] = {{"1", "0"}, {"3", "0"}, {"4", "1"}};
    return cr_make_param_array(struct qp_case, cases, sizeof(cases) / sizeof(cases[0]));
}

/* 500 messages of changing sizes, up to DEPTH in flight each way, each
 * receive waited for in its turn while sends go on: every request slot
 * and clear-to-send record is reused many times, and with several queue
 * pairs parts of different messages complete out of their order. */
ParameterizedTest(struct qp_case *qc, builtin_ib,
                  a_stream_of_messages_wraps_the_request_ring_many_times)
{
    enum { COUNT = 500, DEPTH = 24, MAX = 3000 };
    set_qps(qc);
    struct net_pair p;
    pair_open(&p);
    static unsigned char out[DEPTH][MAX], in[DEPTH][MAX];
    void *mo = NULL, *mi = NULL;
    cr_assert_eq(p.net->regMr(p.send, out, sizeof(out), NCCL_PTR_HOST, &mo), ncclSuccess);
    cr_assert_eq(p.net->regMr(p.recv, in, sizeof(in), NCCL_PTR_HOST, &mi), ncclSuccess);
    void *sreq[DEPTH] = {0}, *rreq[DEPTH] = {0};
    int sent = 0, posted = 0, received = 0;
    double end = net_pair_now_s() + 20;
    while (received < COUNT) {
        cr_assert(net_pair_now_s() < end, "stuck at %d received, %d sent, %d posted", received,
                  sent, posted);
        if (posted < COUNT && posted - received < DEPTH) {
            int slot = posted % DEPTH;
            memset(in[slot], 0xee, MAX);
            rreq[slot] = net_pair_post_recv(&p, in[slot], MAX, mi);
            if (rreq[slot] != NULL)
                posted++;
        }
        if (sent < posted && sreq[sent % DEPTH] == NULL) {
            int slot = sent % DEPTH;
            size_t bytes = (size_t)(sent * 37) % MAX;
            for (size_t b = 0; b < bytes; b++)
                out[slot][b] = (unsigned char)(b + (size_t)sent);
            cr_assert_eq(p.net->isend(p.send, out[slot], bytes, 0, mo, &sreq[slot]), ncclSuccess,
                         "send %d", sent);
            if (sreq[slot] != NULL)
                sent++;
        }
        for (int i = 0; i < DEPTH; i++)
            if (sreq[i] != NULL) {
                int done = 0;
                cr_assert_eq(p.net->test(sreq[i], &done, NULL), ncclSuccess);
                if (done)
                    sreq[i] = NULL;
            }
        if (received < posted) {
            int slot = received % DEPTH, done = 0, got = -1;
            cr_assert_eq(p.net->test(rreq[slot], &done, &got), ncclSuccess, "receive %d", received);
            if (done) {
                size_t bytes = (size_t)(received * 37) % MAX;
                cr_assert_eq((size_t)got, bytes, "message %d: %d bytes, not %zu", received, got,
                             bytes);
                for (size_t b = 0; b < bytes; b++)
                    cr_assert_eq(in[slot][b], (unsigned char)(b + (size_t)received),
                                 "message %d byte %zu", received, b);
                cr_assert_eq(in[slot][bytes], 0xee, "message %d wrote past its end", received);
                received++;
            }
        }
    }
    p.net->deregMr(p.send, mo);
    p.net->deregMr(p.recv, mi);
    net_pair_close(&p);
}

/* ------------------------------------------------------------ virtual devices */

/* Two fake ports (distinct LIDs and GIDs; keys of one port's protection
 * domain are refused on the other) merged into virtual device 2. */
static const ncclNet_v9_t *net_with_vdevice(void)
{
    cfx_test_setenv("FAKEVERBS_DEVICES", "2");
    const ncclNet_v9_t *net = verbs_net();
    ncclNetVDeviceProps_v9_t props = {.ndevs = 2, .devs = {0, 1}};
    int vdev = -1;
    cr_assert_eq(net->makeVDevice(&vdev, &props), ncclSuccess);
    cr_assert_eq(vdev, 2, "the virtual device is %d", vdev);
    return net;
}

Test(builtin_ib, a_virtual_device_reports_both_ports)
{
    const ncclNet_v9_t *net = net_with_vdevice();
    int n = 0;
    cr_assert_eq(net->devices(&n), ncclSuccess);
    cr_assert_eq(n, 3, "%d devices: two ports and the virtual device", n);
    ncclNetProperties_v9_t port0, vdev;
    cr_assert_eq(net->getProperties(0, &port0), ncclSuccess);
    cr_assert_eq(net->getProperties(2, &vdev), ncclSuccess);
    cr_assert_str_eq(vdev.name, "fake_0+fake_1");
    cr_assert_eq(vdev.vProps.ndevs, 2);
    cr_assert(vdev.vProps.devs[0] == 0 && vdev.vProps.devs[1] == 1);
    cr_assert_eq(vdev.speed, 2 * port0.speed, "%d Mbps, not twice %d", vdev.speed, port0.speed);
}

Test(builtin_ib, a_virtual_device_of_ports_that_do_not_exist_is_refused)
{
    cfx_test_setenv("FAKEVERBS_DEVICES", "2");
    const ncclNet_v9_t *net = verbs_net();
    static const ncclNetVDeviceProps_v9_t bad[] = {{.ndevs = 0},
                                                   {.ndevs = 2, .devs = {0, 0}},
                                                   {.ndevs = 2, .devs = {0, 2}},
                                                   {.ndevs = 1, .devs = {-1}}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ncclNetVDeviceProps_v9_t props = bad[i];
        int vdev = -1;
        cr_assert_eq(net->makeVDevice(&vdev, &props), ncclInvalidArgument, "case %zu", i);
    }
    int n = 0;
    cr_assert_eq(net->devices(&n), ncclSuccess);
    cr_assert_eq(n, 2, "a refused virtual device counts (%d devices)", n);
}

/* An InfiniBand port and a RoCE port (FAKEVERBS_ROCE_DEVICES) are both
 * devices, but one virtual device refuses them, saying why. */
Test(builtin_ib, ports_of_different_link_layers_are_not_merged)
{
    cfx_test_setenv("FAKEVERBS_DEVICES", "3");
    cfx_test_setenv("FAKEVERBS_ROCE_DEVICES", "1,2");
    const ncclNet_v9_t *net = verbs_net();
    cr_assert_eq(net->init(keep_warnings), ncclSuccess);
    int n = 0;
    cr_assert_eq(net->devices(&n), ncclSuccess);
    cr_assert_eq(n, 3, "%d devices, not the InfiniBand port and the two RoCE ports", n);
    ncclNetVDeviceProps_v9_t mixed = {.ndevs = 2, .devs = {0, 1}};
    int vdev = -1;
    cr_assert_eq(net->makeVDevice(&vdev, &mixed), ncclInvalidUsage);
    cr_assert(strstr(warned, "cannot merge fake_0:1 (InfiniBand) with fake_1:1 (Ethernet): their "
                             "link layers differ") != NULL,
              "no warning says why:\n%s", warned);
    cr_assert_eq(net->devices(&n), ncclSuccess);
    cr_assert_eq(n, 3, "a refused virtual device counts (%d devices)", n);
    ncclNetVDeviceProps_v9_t roce = {.ndevs = 2, .devs = {1, 2}};
    cr_assert_eq(net->makeVDevice(&vdev, &roce), ncclSuccess, "two RoCE ports");
    cr_assert_eq(vdev, 3);
}

/* A comm on the virtual device: queue pair q on port q mod 2 at both ends
 * (one per port with CFX_IB_QPS_PER_CONNECTION=1), each writing with its
 * own port's keys, messages in turn over them or split over both. */
ParameterizedTestParameters(builtin_ib, a_virtual_device_carries_messages_over_both_ports)
{
    static struct qp_case cases[] = {{"1", "0"}, {"1", "1"}, {"2", "0"}};
    return cr_make_param_array(struct qp_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct qp_case *qc, builtin_ib, a_virtual_device_carries_messages_over_both_ports)
{
    set_qps(qc);
    const ncclNet_v9_t *net = net_with_vdevice();
    struct net_pair p;
    net_pair_open_dev(&p, net, 2);
    enum { N = 12 };
    static unsigned char out[N][70000], in[N][70000 + 64];
    void *mo = NULL, *mi = NULL, *sreq[N], *rreq[N];
    cr_assert_eq(p.net->regMr(p.send, out, sizeof(out), NCCL_PTR_HOST, &mo), ncclSuccess);
    cr_assert_eq(p.net->regMr(p.recv, in, sizeof(in), NCCL_PTR_HOST, &mi), ncclSuccess);
    for (int i = 0; i < N; i++) {
        size_t bytes = (size_t)(i * 5813) % 70000;
        for (size_t b = 0; b < bytes; b++)
            out[i][b] = (unsigned char)(b * 7 + (size_t)i);
        memset(in[i], 0xee, sizeof(in[i]));
        rreq[i] = net_pair_post_recv(&p, in[i], sizeof(in[i]), mi);
        cr_assert_not_null(rreq[i]);
        ncclResult_t res = ncclSuccess;
        sreq[i] = send_when_cleared(&p, out[i], bytes, mo, &res);
        cr_assert_eq(res, ncclSuccess, "send %d", i);
        cr_assert_not_null(sreq[i], "send %d was never cleared", i);
    }
    for (int i = 0; i < N; i++) {
        size_t bytes = (size_t)(i * 5813) % 70000;
        int got = -1;
        cr_assert_eq(net_pair_wait(&p, rreq[i], &got), ncclSuccess, "receive %d", i);
        cr_assert_eq((size_t)got, bytes, "receive %d: %d bytes, not %zu", i, got, bytes);
        cr_assert(memcmp(in[i], out[i], bytes) == 0, "receive %d: wrong bytes", i);
        cr_assert_eq(in[i][bytes], 0xee, "receive %d wrote past its message", i);
        cr_assert_eq(net_pair_wait(&p, sreq[i], &got), ncclSuccess, "send %d", i);
    }
    p.net->deregMr(p.send, mo);
    p.net->deregMr(p.recv, mi);
    net_pair_close(&p);
}

/* The virtual device's second port goes down: its comms fail naming that
 * port (so they did use it), while a comm on port 0 alone goes on. */
Test(builtin_ib, a_port_down_fails_the_virtual_devices_comms_and_spares_the_other_port)
{
    cfx_test_setenv("FAKEVERBS_PORT_DOWN_DEVICE", "fake_1");
    cfx_test_setenv("FAKEVERBS_PORT_DOWN_AFTER_MS", "300");
    const ncclNet_v9_t *net = net_with_vdevice();
    cr_assert_eq(net->init(keep_warnings), ncclSuccess);
    struct net_pair on_vdev, on_port0;
    net_pair_open_dev(&on_vdev, net, 2);
    net_pair_open_dev(&on_port0, net, 0);
    static char in[2][64], out[64] = "port 0 is still up";
    void *mi[2] = {NULL, NULL}, *mo = NULL;
    cr_assert_eq(net->regMr(on_vdev.recv, in[0], sizeof(in[0]), NCCL_PTR_HOST, &mi[0]),
                 ncclSuccess);
    cr_assert_eq(net->regMr(on_port0.recv, in[1], sizeof(in[1]), NCCL_PTR_HOST, &mi[1]),
                 ncclSuccess);
    cr_assert_eq(net->regMr(on_port0.send, out, sizeof(out), NCCL_PTR_HOST, &mo), ncclSuccess);
    void *lost = net_pair_post_recv(&on_vdev, in[0], sizeof(in[0]), mi[0]);
    int got = 0;
    cr_assert_eq(net_pair_wait(&on_vdev, lost, &got), ncclSystemError);
    cr_log_info("warnings:\n%s", warned);
    cr_assert(strstr(warned, "comm on fake_0:1+fake_1:1 failed: fake_1 port 1: port error") != NULL,
              "no warning names the virtual device and its port 1:\n%s", warned);
    void *rreq = net_pair_post_recv(&on_port0, in[1], sizeof(in[1]), mi[1]);
    ncclResult_t res = ncclSuccess;
    void *sreq = send_when_cleared(&on_port0, out, sizeof(out), mo, &res);
    cr_assert_eq(res, ncclSuccess);
    cr_assert_eq(net_pair_wait(&on_port0, rreq, &got), ncclSuccess, "port 0's comm failed too");
    cr_assert_eq(net_pair_wait(&on_port0, sreq, &got), ncclSuccess);
    cr_assert_str_eq(in[1], out);
    net->deregMr(on_vdev.recv, mi[0]);
    net->deregMr(on_port0.recv, mi[1]);
    net->deregMr(on_port0.send, mo);
    net_pair_close(&on_vdev);
    net_pair_close(&on_port0);
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
    p.net->deregMr(p.send, mo);
    p.net->deregMr(p.recv, mi);
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
    p.net->deregMr(p.send, mo);
    p.net->deregMr(p.recv, mi);
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
    p.net->deregMr(p.recv, mi);
    net_pair_close(&p);
}

/* The receiver goes away before it posted a receive: the sender's isend,
 * which answers NULL until a clear-to-send comes, fails with
 * ncclRemoteError within a few of its 10 ms liveness looks instead of
 * waiting for ever (a sender with nothing posted has no request to test). */
Test(builtin_ib, a_send_waiting_for_its_clear_to_send_fails_once_the_receiver_is_gone)
{
    struct net_pair p;
    pair_open(&p);
    static char out[64];
    void *mo = NULL, *req = NULL;
    cr_assert_eq(p.net->regMr(p.send, out, sizeof(out), NCCL_PTR_HOST, &mo), ncclSuccess);
    p.net->closeRecv(p.recv);
    p.recv = NULL;
    ncclResult_t res = ncclSuccess;
    double start = net_pair_now_s();
    while (res == ncclSuccess && net_pair_now_s() < start + 5) {
        res = p.net->isend(p.send, out, sizeof(out), 0, mo, &req);
        cr_assert_null(req, "a send was taken with no receive posted");
    }
    cr_assert_eq(res, ncclRemoteError, "isend answered %d for 5 s", (int)res);
    cr_assert_lt(net_pair_now_s() - start, 1.0, "noticed only after %.2f s",
                 net_pair_now_s() - start);
    p.net->deregMr(p.send, mo);
    net_pair_close(&p);
}

/* A fake-verbs fault @p knob=@p value (FAKEVERBS_*: it fires that many ms
 * after the first queue pair is ready, or the device opened): a receive
 * pending across it fails with @p want, and the net's warnings say
 * @p words. */
static void fault_fails_a_pending_receive(const char *knob, const char *value, ncclResult_t want,
                                          const char *words)
{
    cfx_test_setenv(knob, value);
    const ncclNet_v9_t *net = verbs_net();
    cr_assert_eq(net->init(keep_warnings), ncclSuccess);
    struct net_pair p;
    net_pair_open(&p, net);
    static char in[64];
    void *mi = NULL;
    cr_assert_eq(p.net->regMr(p.recv, in, sizeof(in), NCCL_PTR_HOST, &mi), ncclSuccess);
    void *rreq = net_pair_post_recv(&p, in, sizeof(in), mi);
    cr_assert_not_null(rreq);
    int got = 0;
    ncclResult_t res = net_pair_wait(&p, rreq, &got);
    cr_log_info("warnings:\n%s", warned);
    cr_assert_eq(res, want, "the receive ended with %d, not %d", (int)res, (int)want);
    cr_assert(strstr(warned, words) != NULL, "no warning says \"%s\":\n%s", words, warned);
    void *again = NULL;
    char *data = in;
    size_t bytes = sizeof(in);
    int tag = 0;
    cr_assert_eq(p.net->irecv(p.recv, 1, (void **)&data, &bytes, &tag, &mi, &again), want,
                 "the failed comm took another receive");
    p.net->deregMr(p.recv, mi);
    net_pair_close(&p);
    cfx_test_setenv(knob, NULL);
}

/* The receiver's queue pair gets a fatal async event (then goes to the
 * error state, flushing the receive): the comm fails with the event's
 * name as a local error, not as the flush's "peer gone". */
Test(builtin_ib, an_async_queue_pair_event_fails_its_comm_with_the_event_name)
{
    fault_fails_a_pending_receive("FAKEVERBS_ASYNC_QP_FATAL_AFTER_MS", "50", ncclSystemError,
                                  "receive comm on fake_0:1 failed: an async event on one of its "
                                  "queue pairs: local work queue catastrophic error");
}

/* The port goes down (a port error event, every queue pair to error). */
Test(builtin_ib, a_port_error_fails_the_comms_on_that_port_naming_it)
{
    fault_fails_a_pending_receive("FAKEVERBS_PORT_DOWN_AFTER_MS", "300", ncclSystemError,
                                  "comm on fake_0:1 failed: fake_0 port 1: port error");
}

Test(builtin_ib, reports_its_ports_as_devices)
{
    const ncclNet_v9_t *net = verbs_net();
    ncclNetProperties_v9_t props;
    cr_assert_eq(net->getProperties(0, &props), ncclSuccess);
    cr_assert_str_eq(props.name, "fake_0", "device 0 is %s", props.name);
    cr_assert_eq(props.port, 1);
    cr_assert(props.ptrSupport & NCCL_PTR_HOST);
    cr_assert_gt(props.speed, 0);
    cr_assert_str_eq(net->name, "IB");
}

/* ------------------------------------------------------------ device memory */

/* How the ports may take device memory: CFX_DMABUF_ENABLE and
 * CFX_IB_PEERMEM (fake-verbs takes dma-bufs), and the pointer types the
 * devices then report. */
struct gdr_case {
    char dmabuf[4], peermem[4];
    int want; /* ptrSupport. */
};

ParameterizedTestParameters(builtin_ib, reports_device_memory_as_dma_buf_and_peermem_allow)
{
    static struct gdr_case cases[] = {
        {"1", "0", NCCL_PTR_HOST | NCCL_PTR_DMABUF},
        {"0", "1", NCCL_PTR_HOST | NCCL_PTR_CUDA},
        {"1", "1", NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF},
        {"0", "0", NCCL_PTR_HOST},
    };
    return cr_make_param_array(struct gdr_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct gdr_case *gc, builtin_ib,
                  reports_device_memory_as_dma_buf_and_peermem_allow)
{
    cfx_test_setenv("CFX_DMABUF_ENABLE", gc->dmabuf);
    cfx_test_setenv("CFX_IB_PEERMEM", gc->peermem);
    const ncclNet_v9_t *net = verbs_net();
    ncclNetProperties_v9_t props;
    cr_assert_eq(net->getProperties(0, &props), ncclSuccess);
    cr_assert_eq(props.ptrSupport, gc->want,
                 "CFX_DMABUF_ENABLE=%s CFX_IB_PEERMEM=%s: ptrSupport %#x, not %#x", gc->dmabuf,
                 gc->peermem, (unsigned)props.ptrSupport, (unsigned)gc->want);
}

/* Sends @p out to @p in over @p p (registered as @p mo and @p mi), waits
 * for both ends, and checks the bytes. */
static void carry_one(const struct net_pair *p, char *out, char *in, size_t bytes, void *mo,
                      void *mi)
{
    void *rreq = net_pair_post_recv(p, in, bytes, mi);
    cr_assert_not_null(rreq);
    ncclResult_t res = ncclSuccess;
    void *sreq = send_when_cleared(p, out, bytes, mo, &res);
    cr_assert_eq(res, ncclSuccess);
    cr_assert_not_null(sreq);
    int got = 0;
    cr_assert_eq(net_pair_wait(p, sreq, &got), ncclSuccess);
    cr_assert_eq(net_pair_wait(p, rreq, &got), ncclSuccess);
    cr_assert_eq(got, (int)bytes);
    cr_assert(memcmp(in, out, bytes) == 0, "the bytes differ");
}

/* A receive into memory registered as device memory (by address, as
 * nvidia-peermem allows; fake-cuda's device memory is host memory, so a
 * host buffer stands in): iflush returns a request, done once its read
 * completed. Host memory and empty receives need no flush (no request).
 * FAKEVERBS_FAIL_READS=1 fails every RDMA read: the flush's request then
 * fails the comm, so the read is what the request waits for. */
static void iflush_case(int fail_reads)
{
    cfx_test_setenv("CFX_IB_PEERMEM", "1");
    cfx_test_setenv("FAKEVERBS_FAIL_READS", fail_reads ? "1" : NULL);
    const ncclNet_v9_t *net = verbs_net();
    cr_assert_eq(net->init(keep_warnings), ncclSuccess);
    struct net_pair p;
    net_pair_open(&p, net);
    static char out[3000], in[3000], host_in[3000];
    for (size_t i = 0; i < sizeof(out); i++)
        out[i] = (char)(i * 7 + 1);
    void *mo = NULL, *mi = NULL, *mh = NULL;
    cr_assert_eq(p.net->regMr(p.send, out, sizeof(out), NCCL_PTR_HOST, &mo), ncclSuccess);
    cr_assert_eq(p.net->regMr(p.recv, in, sizeof(in), NCCL_PTR_CUDA, &mi), ncclSuccess);
    cr_assert_eq(p.net->regMr(p.recv, host_in, sizeof(host_in), NCCL_PTR_HOST, &mh), ncclSuccess);
    carry_one(&p, out, host_in, sizeof(out), mo, mh);
    void *data = host_in, *freq = NULL;
    int size = (int)sizeof(host_in);
    cr_assert_eq(p.net->iflush(p.recv, 1, &data, &size, &mh, &freq), ncclSuccess);
    cr_assert_null(freq, "an iflush of host memory returned a request");
    carry_one(&p, out, in, sizeof(out), mo, mi);
    data = in;
    size = 0;
    cr_assert_eq(p.net->iflush(p.recv, 1, &data, &size, &mi, &freq), ncclSuccess);
    cr_assert_null(freq, "an iflush of an empty receive returned a request");
    size = (int)sizeof(in);
    cr_assert_eq(p.net->iflush(p.recv, 1, &data, &size, &mi, &freq), ncclSuccess);
    cr_assert_not_null(freq, "an iflush of device memory returned no request");
    int got = -1;
    ncclResult_t res = net_pair_wait(&p, freq, &got);
    if (fail_reads) {
        cr_assert_eq(res, ncclRemoteError, "the failed flush ended with %d", (int)res);
        cr_assert(strstr(warned, "receive comm on fake_0:1 failed: a completion in error") != NULL,
                  "no warning names the failed read:\n%s", warned);
    } else {
        cr_assert_eq(res, ncclSuccess);
        /* Many in a row: each request is given back once done. */
        for (int i = 0; i < 100; i++) {
            cr_assert_eq(p.net->iflush(p.recv, 1, &data, &size, &mi, &freq), ncclSuccess);
            cr_assert_not_null(freq);
            cr_assert_eq(net_pair_wait(&p, freq, &got), ncclSuccess);
        }
    }
    p.net->deregMr(p.send, mo);
    p.net->deregMr(p.recv, mi);
    p.net->deregMr(p.recv, mh);
    net_pair_close(&p);
    cfx_test_setenv("FAKEVERBS_FAIL_READS", NULL);
}

Test(builtin_ib, an_iflush_of_device_memory_waits_for_its_read)
{
    iflush_case(0);
}

Test(builtin_ib, a_failed_flush_read_fails_the_receive_comm)
{
    iflush_case(1);
}

/* Device memory as a dma-buf (fake-verbs takes any open descriptor and
 * addresses the region at the pointer given, as a NIC would); by address
 * only with nvidia-peermem; as a dma-buf only where dma-bufs are taken. */
Test(builtin_ib, device_memory_registers_as_a_dma_buf_or_through_peermem_only)
{
    cfx_test_setenv("CFX_IB_PEERMEM", "0");
    const ncclNet_v9_t *net = verbs_net();
    cr_assert_eq(net->init(keep_warnings), ncclSuccess);
    struct net_pair p;
    net_pair_open(&p, net);
    static char out[8192], in[8192] __attribute__((aligned(4096)));
    memset(out, 0x5a, sizeof(out));
    void *mo = NULL, *mi = NULL, *refused = NULL;
    cr_assert_eq(p.net->regMr(p.recv, in, sizeof(in), NCCL_PTR_CUDA, &refused), ncclInvalidArgument,
                 "regMr of device memory without nvidia-peermem");
    cr_assert(strstr(warned, "needs nvidia-peermem") != NULL, "no warning says why:\n%s", warned);
    int fd = open("/dev/null", O_RDONLY); /* Fake-verbs only checks that it is open. */
    cr_assert_geq(fd, 0);
    cr_assert_eq(p.net->regMrDmaBuf(p.recv, in, sizeof(in), NCCL_PTR_CUDA, 0, fd, &mi),
                 ncclSuccess);
    close(fd);
    cr_assert_eq(p.net->regMr(p.send, out, sizeof(out), NCCL_PTR_HOST, &mo), ncclSuccess);
    carry_one(&p, out, in, sizeof(out), mo, mi);
    void *data = in, *freq = NULL;
    int size = (int)sizeof(in);
    cr_assert_eq(p.net->iflush(p.recv, 1, &data, &size, &mi, &freq), ncclSuccess);
    cr_assert_not_null(freq, "a dma-buf receive needs its flush");
    int got = 0;
    cr_assert_eq(net_pair_wait(&p, freq, &got), ncclSuccess);
    p.net->deregMr(p.send, mo);
    p.net->deregMr(p.recv, mi);
    net_pair_close(&p);
}

Test(builtin_ib, a_dma_buf_is_refused_when_dma_bufs_are_turned_off)
{
    cfx_test_setenv("CFX_DMABUF_ENABLE", "0");
    cfx_test_setenv("CFX_IB_PEERMEM", "0");
    const ncclNet_v9_t *net = verbs_net();
    cr_assert_eq(net->init(keep_warnings), ncclSuccess);
    struct net_pair p;
    net_pair_open(&p, net);
    static char in[4096];
    void *mi = NULL;
    int fd = open("/dev/null", O_RDONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(p.net->regMrDmaBuf(p.recv, in, sizeof(in), NCCL_PTR_CUDA, 0, fd, &mi),
                 ncclInvalidArgument);
    close(fd);
    cr_assert(strstr(warned, "take no dma-buf") != NULL, "no warning says why:\n%s", warned);
    /* Host memory through the same call is a plain registration. */
    cr_assert_eq(p.net->regMrDmaBuf(p.recv, in, sizeof(in), NCCL_PTR_HOST, 0, -1, &mi),
                 ncclSuccess);
    p.net->deregMr(p.recv, mi);
    net_pair_close(&p);
}
