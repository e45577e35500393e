/*
 * The net-plugin transport over cfxtest (tests/netplugin: an NCCL net
 * plugin of the project's own, over TCP on 127.0.0.1; CFX_TEST_NET_PLUGIN
 * names its build with v11, v10 and v9 tables, CFX_TEST_NET_PLUGIN_V10,
 * _V9 and _V8 its builds for older NCCL releases). Every rank is a
 * process claiming its own host, so every connection between ranks crosses
 * the "network" and CFX_NET_PLUGIN makes it a plugin one: collectives with
 * checked results, the older tables, a plugin that does not load, a killed
 * rank. Nothing here measures a real network.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/coll_check.h"
#include "tests/harness.h"
#include "tests/registered_rounds.h"
#include "transports/net/conn.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The test plugin named by @p var, or a skip saying why there is none. */
static const char *test_plugin(const char *var)
{
    const char *path = getenv(var);
    if (path != NULL && path[0] && strchr(path, '/') == NULL)
        return path; /* A plugin name, for the library path. */
    if (path == NULL || path[0] == '\0' || access(path, R_OK) != 0)
        cr_skip_test("no test net plugin (%s=%s): run through ctest, or set it to "
                     "build/tests/netplugin/libnccl-net-cfxtest.so",
                     var, path ? path : "unset");
    return path;
}

/* Every process its own host: every connection crosses the "network". */
static void own_host(struct cfx_test_rank *ctx)
{
    char host[32];
    snprintf(host, sizeof(host), "net-test-host-%d", ctx->rank);
    cfx_test_setenv("CFX_HOSTID", host);
}

/* ------------------------------------------------------------ collectives */

static void allreduces_of_every_size(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    static const size_t counts[] = {1, 5, 6, 7, 1000, 4097, 65536, 1 << 20};
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]) && !ctx->slot_failed; i++)
        cfx_test_allreduce_check(ctx, comm, counts[i]);
    if (!ctx->slot_failed)
        RANK_CFX(ctx, cfxCommFinalize(comm));
    cfxCommDestroy(comm);
}

/* Runs @p fn on @p nranks processes with CFX_NET_PLUGIN=@p spec and logs;
 * counts[i] gets the number of log lines holding needles[i]. */
static void run_counting(const char *spec, int nranks, cfx_test_rank_fn fn,
                         const char *const *needles, int *counts, int n)
{
    cfx_test_setenv("CFX_NET_PLUGIN", spec);
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "coll");
    struct cfx_test_options opts = {
        .nranks = nranks, .mode = CFX_TEST_PROCS, .deadline_s = 90, .before_rank = own_host};
    char report[8192];
    int ok = cfx_test_run(&opts, fn, report, sizeof(report));
    for (int i = 0; i < n; i++)
        counts[i] = cfx_test_count_in_logs(logs, needles[i]);
    if (ok)
        cfx_test_remove_logs(logs);
    cfx_test_logs_off();
    cfx_test_setenv("CFX_NET_PLUGIN", NULL);
    cr_assert(ok, "%s(logs kept in %s.*)", report, logs);
}

/* Runs @p fn over the plugin in @p var (or, after a '=', the
 * CFX_NET_PLUGIN value itself) with logs; returns the number of
 * "via net-plugin" connection lines and of socket ones. */
static void run_over_plugin(const char *var, int nranks, cfx_test_rank_fn fn, int *via_plugin_p,
                            int *via_socket_p, int *loaded_p, const char *loaded_needle)
{
    const char *const needles[] = {"via net-plugin", "via socket", loaded_needle};
    int counts[3];
    run_counting(var[0] == '=' ? var + 1 : test_plugin(var), nranks, fn, needles, counts, 3);
    *via_plugin_p = counts[0], *via_socket_p = counts[1], *loaded_p = counts[2];
    cr_log_info("%d ranks: %d connection lines via net-plugin, %d via socket, %d lines \"%s\"",
                nranks, *via_plugin_p, *via_socket_p, *loaded_p, loaded_needle);
}

ParameterizedTestParameters(net_plugin, allreduce_of_every_size_over_the_plugin)
{
    static int ranks[] = {2, 3, 4};
    return cr_make_param_array(int, ranks, 3);
}

ParameterizedTest(int *nranks, net_plugin, allreduce_of_every_size_over_the_plugin, .timeout = 150)
{
    int plugin, socket, loaded;
    run_over_plugin("CFX_TEST_NET_PLUGIN", *nranks, allreduces_of_every_size, &plugin, &socket,
                    &loaded, "(ncclNetPlugin_v11, name \"cfxtest\")");
    cr_assert_geq(plugin, *nranks, "only %d connections via net-plugin in the logs", plugin);
    cr_assert_eq(socket, 0, "%d connections via socket with a net plugin loaded", socket);
    cr_assert_geq(loaded, *nranks, "the ranks did not log the plugin they loaded (%d lines)",
                  loaded);
}

/* The plugin in rendezvous (a message leaves only once its receive is
 * posted, as over RDMA): every size still arrives whole and in order. */
Test(net_plugin, allreduce_of_every_size_over_a_rendezvous_plugin, .timeout = 150)
{
    int plugin, socket, loaded;
    cfx_test_setenv("CFXTEST_RENDEZVOUS", "1");
    run_over_plugin("CFX_TEST_NET_PLUGIN", 3, allreduces_of_every_size, &plugin, &socket, &loaded,
                    "(ncclNetPlugin_v11, name \"cfxtest\")");
    cfx_test_setenv("CFXTEST_RENDEZVOUS", NULL);
    cr_assert_geq(plugin, 3, "only %d connections via net-plugin in the logs", plugin);
    cr_assert_eq(socket, 0, "%d connections via socket with a net plugin loaded", socket);
}

/* Plugins built for older NCCL releases: a library is used through the
 * newest table it exports (cfxtest10 exports v10 and v9, cfxtest9 v9,
 * cfxtest8 v8), and each table's calls carry the job. */
static const struct {
    const char *var;    /* The environment variable naming the build. */
    const char *needle; /* What the load line must say. */
} older_tables[] = {
    {"CFX_TEST_NET_PLUGIN_V10", "(ncclNetPlugin_v10, name \"cfxtest10\")"},
    {"CFX_TEST_NET_PLUGIN_V9", "(ncclNetPlugin_v9, name \"cfxtest9\")"},
    {"CFX_TEST_NET_PLUGIN_V8", "(ncclNetPlugin_v8, name \"cfxtest8\")"},
};

/* An index into older_tables (criterion's parameters must hold no pointer). */
ParameterizedTestParameters(net_plugin, allreduce_over_an_older_table)
{
    static int which[] = {0, 1, 2};
    return cr_make_param_array(int, which, 3);
}

ParameterizedTest(int *which, net_plugin, allreduce_over_an_older_table, .timeout = 150)
{
    const char *var = older_tables[*which].var, *needle = older_tables[*which].needle;
    int plugin, socket, loaded;
    run_over_plugin(var, 2, allreduces_of_every_size, &plugin, &socket, &loaded, needle);
    cr_assert_geq(plugin, 2, "only %d connections via net-plugin in the logs", plugin);
    cr_assert_eq(socket, 0, "%d connections via socket with a net plugin loaded", socket);
    cr_assert_geq(loaded, 2, "the ranks did not log %s (%d lines)", needle, loaded);
}

static void broadcast_and_allgather(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    static const size_t counts[] = {3, 1000, 300000};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        size_t count = counts[c];
        int root = (int)(c % (size_t)ctx->nranks);
        int *data = malloc(count * sizeof(int));
        int *all = malloc(count * (size_t)ctx->nranks * sizeof(int));
        RANK_ASSERT(ctx, data && all, "malloc");
        for (size_t i = 0; i < count; i++)
            data[i] = ctx->rank == root ? (int)(i * 3 + 1) : -1;
        RANK_CFX(ctx, cfxBroadcast(data, data, count, cfxInt32, root, comm, NULL));
        for (size_t i = 0; i < count; i++)
            RANK_ASSERT(ctx, data[i] == (int)(i * 3 + 1), "broadcast of %zu from %d: [%zu] = %d",
                        count, root, i, data[i]);
        for (size_t i = 0; i < count; i++)
            data[i] = ctx->rank * 1000003 + (int)i;
        RANK_CFX(ctx, cfxAllGather(data, all, count, cfxInt32, comm, NULL));
        for (int r = 0; r < ctx->nranks; r++)
            for (size_t i = 0; i < count; i++)
                RANK_ASSERT(ctx, all[(size_t)r * count + i] == r * 1000003 + (int)i,
                            "allgather of %zu: rank %d's [%zu] = %d", count, r, i,
                            all[(size_t)r * count + i]);
        free(data);
        free(all);
    }
    RANK_CFX(ctx, cfxCommFinalize(comm));
    cfxCommDestroy(comm);
}

Test(net_plugin, broadcast_and_allgather_over_the_plugin_3_ranks, .timeout = 150)
{
    int plugin, socket, loaded;
    run_over_plugin("CFX_TEST_NET_PLUGIN", 3, broadcast_and_allgather, &plugin, &socket, &loaded,
                    "ncclNetPlugin_v9");
    cr_assert_geq(plugin, 3, "only %d connections via net-plugin in the logs", plugin);
    cr_assert_eq(socket, 0, "%d connections via socket with a net plugin loaded", socket);
}

/* ------------------------------------------------------------ failures */

/* Runs @p fn, whose init must fail, on 2 processes, each its own host,
 * with CFX_NET_PLUGIN=@p spec, @p var=@p value (@p var NULL: none) and
 * CFX_TIMEOUT=5; @p arg for the ranks. */
static void init_fail_run(const char *spec, const char *var, const char *value, cfx_test_rank_fn fn,
                          void *arg)
{
    cfx_test_setenv("CFX_NET_PLUGIN", spec);
    if (var != NULL)
        cfx_test_setenv(var, value);
    cfx_test_setenv("CFX_TIMEOUT", "5");
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 40, .before_rank = own_host, .arg = arg};
    char report[8192];
    int ok = cfx_test_run(&opts, fn, report, sizeof(report));
    cfx_test_setenv("CFX_NET_PLUGIN", NULL);
    if (var != NULL)
        cfx_test_setenv(var, NULL);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
    cr_assert(ok, "%s", report);
}

static void init_must_fail_naming_the_plugin(struct cfx_test_rank *ctx)
{
    const char *spec = ctx->arg;
    cfxComm_t comm = NULL;
    cfx_test_step(ctx, "init with CFX_NET_PLUGIN=%s", spec);
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    RANK_ASSERT(ctx, res != cfxSuccess, "init succeeded with a plugin that does not exist");
    const char *why = cfxGetLastError(NULL);
    RANK_ASSERT(ctx, strstr(why, spec) != NULL && strstr(why, "CFX_NET_PLUGIN") != NULL,
                "the sentence does not name the plugin: %s", why);
}

static void plugin_must_not_load(const char *spec)
{
    init_fail_run(spec, NULL, NULL, init_must_fail_naming_the_plugin, (void *)spec);
}

Test(net_plugin, a_plugin_that_does_not_load_fails_init_with_a_sentence, .timeout = 60)
{
    plugin_must_not_load("/nonexistent");
}

static void *kill_me_soon(void *arg)
{
    (void)arg;
    usleep(300 * 1000);
    kill(getpid(), SIGKILL);
    return NULL;
}

static void allreduce_until_rank_two_dies(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    size_t count = 1 << 18;
    float *data = calloc(count, sizeof(float));
    RANK_ASSERT(ctx, data != NULL, "malloc");
    if (ctx->rank == 2) {
        pthread_t killer;
        pthread_create(&killer, NULL, kill_me_soon, NULL);
    }
    cfxResult_t res = cfxSuccess;
    double start = 0;
    for (int i = 0; i < 1000000 && res == cfxSuccess; i++) {
        cfx_test_step(ctx, "allreduce %d while rank 2 dies", i);
        start = now_s();
        res = cfxAllReduce(data, data, count, cfxFloat32, cfxSum, comm, NULL);
    }
    double took = now_s() - start;
    const char *why = cfxGetLastError(comm);
    RANK_ASSERT(ctx, res == cfxRemoteError, "the call returned %s: %s", cfxGetErrorString(res),
                why);
    RANK_ASSERT(ctx, took < 12, "the failing call took %.1f s (CFX_TIMEOUT=10)", took);
    RANK_ASSERT(ctx, strstr(why, "rank 2") != NULL, "the sentence does not name rank 2: %s", why);
    cfxCommDestroy(comm);
    free(data);
}

/* 4 processes, each its own host, run @p fn with CFX_NET_PLUGIN=@p spec
 * (NULL: unset) and CFX_TIMEOUT=10; rank 2 is killed on the way. */
static void killed_rank_run_with(const char *spec, void (*fn)(struct cfx_test_rank *))
{
    cfx_test_setenv("CFX_NET_PLUGIN", spec);
    cfx_test_setenv("CFX_TIMEOUT", "10");
    struct cfx_test_options opts = {.nranks = 4,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 90,
                                    .killed_ranks = 1ull << 2,
                                    .before_rank = own_host};
    char report[8192];
    int ok = cfx_test_run(&opts, fn, report, sizeof(report));
    cfx_test_setenv("CFX_NET_PLUGIN", NULL);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
    cr_assert(ok, "%s", report);
}

static void killed_rank_run(const char *spec)
{
    killed_rank_run_with(spec, allreduce_until_rank_two_dies);
}

Test(net_plugin, killed_rank_fails_every_survivor_within_the_timeout, .timeout = 150)
{
    killed_rank_run(test_plugin("CFX_TEST_NET_PLUGIN"));
}

/* Each rank sends to the next and receives from the one before, in one
 * group, between buffers registered with cfxCommRegister (over a net,
 * receives wait for each slot's header to land in the buffer), until rank
 * 2 dies: every survivor's call fails within the timeout naming rank 2
 * (the group's receive from rank 2 is what failed on rank 3, not its first
 * operation, the send: its poison must carry rank 2 on), and none hangs in
 * a receive that waits for a header. */
static void registered_ring_until_rank_two_dies(struct cfx_test_rank *ctx)
{
    int n = ctx->nranks, r = ctx->rank;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, n, ctx->id, r));
    size_t count = REF_COUNT;
    float *out = calloc(count, sizeof(float)), *in = calloc(count, sizeof(float));
    RANK_ASSERT(ctx, out && in, "malloc");
    void *ho, *hi;
    RANK_CFX(ctx, cfxCommRegister(comm, out, count * sizeof(float), &ho));
    RANK_CFX(ctx, cfxCommRegister(comm, in, count * sizeof(float), &hi));
    cfxResult_t res = cfxSuccess;
    double start = 0;
    for (int i = 0; i < 1000000 && res == cfxSuccess; i++) {
        if (r == 2 && i == 20) /* Connected, and mid-traffic for the others. */
            kill(getpid(), SIGKILL);
        cfx_test_step(ctx, "exchange %d while rank 2 dies", i);
        start = now_s();
        res = cfxGroupStart();
        if (res == cfxSuccess)
            res = cfxSend(out, count, cfxFloat32, (r + 1) % n, comm, NULL);
        if (res == cfxSuccess)
            res = cfxRecv(in, count, cfxFloat32, (r + n - 1) % n, comm, NULL);
        cfxResult_t end = cfxGroupEnd();
        if (res == cfxSuccess)
            res = end;
    }
    double took = now_s() - start;
    const char *why = cfxGetLastError(comm);
    RANK_ASSERT(ctx, res == cfxRemoteError, "the call returned %s: %s", cfxGetErrorString(res),
                why);
    RANK_ASSERT(ctx, took < 12, "the failing call took %.1f s (CFX_TIMEOUT=10)", took);
    RANK_ASSERT(ctx, strstr(why, "rank 2") != NULL, "the sentence does not name rank 2: %s", why);
    cfxCommDestroy(comm);
    free(out);
    free(in);
}

/* 0: the socket transport (no net plugin); 1: the built-in socket net; 2:
 * the built-in verbs net (fake-verbs). */
ParameterizedTestParameters(net_builtin,
                            killed_rank_fails_receives_into_registered_buffers_within_the_timeout)
{
    static int which[] = {0, 1, 2};
    return cr_make_param_array(int, which, 3);
}

ParameterizedTest(int *which, net_builtin,
                  killed_rank_fails_receives_into_registered_buffers_within_the_timeout,
                  .timeout = 150)
{
    cr_log_info("over %s", *which == 2   ? "the built-in verbs net (fake-verbs)"
                           : *which == 1 ? "the built-in socket net"
                                         : "the socket transport");
    if (*which == 2 && cfx_test_use_fakeverbs() == NULL)
        cr_skip_test("no fake-verbs library (CFX_TEST_FAKEVERBS unset)");
    killed_rank_run_with(*which == 2   ? "builtin:ib"
                         : *which == 1 ? "builtin:socket"
                                       : NULL,
                         registered_ring_until_rank_two_dies);
}

/* ------------------------------------------------------------ CFX_NET */

/* CFX_NET names a network as NCCL_NET does, without case: the plugin's
 * name makes it carry every connection between hosts, Socket leaves it
 * unused (sockets carry them), any other name fails init. */
Test(net_plugin, cfx_net_naming_the_plugin_makes_it_carry_the_job, .timeout = 150)
{
    cfx_test_setenv("CFX_NET", "CFXtest");
    int plugin, socket, loaded;
    run_over_plugin("CFX_TEST_NET_PLUGIN", 2, allreduces_of_every_size, &plugin, &socket, &loaded,
                    "not used by rank");
    cfx_test_setenv("CFX_NET", NULL);
    cr_assert_geq(plugin, 2, "only %d connections via net-plugin under CFX_NET=CFXtest", plugin);
    cr_assert_eq(socket, 0, "%d connections via socket under CFX_NET=CFXtest", socket);
    cr_assert_eq(loaded, 0, "the plugin was left unused although CFX_NET named it");
}

Test(net_plugin, cfx_net_socket_leaves_the_plugin_unused, .timeout = 150)
{
    cfx_test_setenv("CFX_NET", "socket");
    int plugin, socket, unused;
    run_over_plugin("CFX_TEST_NET_PLUGIN", 2, allreduces_of_every_size, &plugin, &socket, &unused,
                    "(\"cfxtest\") not used by rank");
    cfx_test_setenv("CFX_NET", NULL);
    cr_assert_eq(plugin, 0, "%d connections via net-plugin under CFX_NET=socket", plugin);
    cr_assert_geq(socket, 2, "only %d connections via socket under CFX_NET=socket", socket);
    cr_assert_geq(unused, 2, "the ranks did not say the plugin was left unused (%d lines)", unused);
}

static void init_must_fail_naming_cfx_net(struct cfx_test_rank *ctx)
{
    cfxComm_t comm = NULL;
    cfx_test_step(ctx, "init with CFX_NET=carrier-pigeon");
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    RANK_ASSERT(ctx, res == cfxInvalidUsage, "init returned %s", cfxGetErrorString(res));
    const char *why = cfxGetLastError(NULL);
    RANK_ASSERT(ctx,
                strstr(why, "CFX_NET=carrier-pigeon names no network") != NULL &&
                    strstr(why, "\"cfxtest\"") != NULL,
                "the sentence does not name CFX_NET and the plugin: %s", why);
}

Test(net_plugin, cfx_net_naming_no_network_fails_init_with_a_sentence, .timeout = 60)
{
    init_fail_run(test_plugin("CFX_TEST_NET_PLUGIN"), "CFX_NET", "carrier-pigeon",
                  init_must_fail_naming_cfx_net, NULL);
}

static void init_must_fail_for_want_of_a_device(struct cfx_test_rank *ctx)
{
    cfxComm_t comm = NULL;
    cfx_test_step(ctx, "init with a plugin that reports no device");
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    RANK_ASSERT(ctx, res == cfxSystemError, "init returned %s with a plugin without devices",
                cfxGetErrorString(res));
    const char *why = cfxGetLastError(NULL);
    RANK_ASSERT(ctx, strstr(why, "cfxtest") != NULL && strstr(why, "no device") != NULL,
                "the sentence does not say the plugin has no device: %s", why);
}

Test(net_plugin, a_plugin_without_devices_fails_init_with_a_sentence, .timeout = 60)
{
    init_fail_run(test_plugin("CFX_TEST_NET_PLUGIN"), "CFXTEST_NDEV", "0",
                  init_must_fail_for_want_of_a_device, NULL);
}

/* ------------------------------------------------------------ virtual devices */

/* CFX_NET_FORCE_MERGE: the plugin's two devices merged into its virtual
 * device 2 (makeVDevice), which then carries every connection. */
Test(net_plugin, devices_merged_into_a_virtual_device_carry_the_connections, .timeout = 150)
{
    cfx_test_setenv("CFXTEST_NDEV", "2");
    cfx_test_setenv("CFX_NET_FORCE_MERGE", "lo,lo1");
    int plugin, socket, merged;
    run_over_plugin("CFX_TEST_NET_PLUGIN", 3, allreduces_of_every_size, &plugin, &socket, &merged,
                    "merged devices 0 (lo), 1 (lo1) into virtual device 2 (lo+lo1, 20000 Mbps; "
                    "CFX_NET_FORCE_MERGE=lo,lo1)");
    cfx_test_setenv("CFXTEST_NDEV", NULL);
    cfx_test_setenv("CFX_NET_FORCE_MERGE", NULL);
    cr_assert_geq(merged, 3, "the ranks did not log the merge (%d lines)", merged);
    cr_assert_geq(plugin, 3, "only %d connections via net-plugin in the logs", plugin);
    cr_assert_eq(socket, 0, "%d connections via socket with a net plugin loaded", socket);
}

/* CFX_NET_MERGE_LEVEL: devices at most that far apart (by their PCI
 * paths) merged without CFX_NET_FORCE_MERGE, as NCCL merges the ports of
 * a dual-port NIC by default. */
struct merge_case {
    char level[8];   /* CFX_NET_MERGE_LEVEL ("": the default, PORT). */
    char paths[200]; /* CFXTEST_PCI_PATHS of devices lo and lo1. */
    int merged;
    char why[48];
};

#define PCI_ROOT "/sys/devices/pci0000:00/0000:00:02.0/0000:10:00.0/"
ParameterizedTestParameters(net_plugin, devices_near_enough_are_merged_by_distance)
{
    static struct merge_case cases[] = {
        /* Two functions of one device: the ports of a dual-port NIC. */
        {"", PCI_ROOT "0000:11:00.0/0000:12:00.0;" PCI_ROOT "0000:11:00.0/0000:12:00.1", 1,
         "CFX_NET_MERGE_LEVEL=PORT, PORT apart"},
        {"LOC", PCI_ROOT "0000:11:00.0/0000:12:00.0;" PCI_ROOT "0000:11:00.0/0000:12:00.1", 0, ""},
        /* Two devices behind one PCI switch. */
        {"", PCI_ROOT "0000:11:00.0/0000:12:00.0;" PCI_ROOT "0000:11:01.0/0000:13:00.0", 0, ""},
        {"PIX", PCI_ROOT "0000:11:00.0/0000:12:00.0;" PCI_ROOT "0000:11:01.0/0000:13:00.0", 1,
         "CFX_NET_MERGE_LEVEL=PIX, PIX apart"},
        /* Different roots: only SYS merges them. */
        {"PHB",
         "/sys/devices/pci0000:00/0000:00:02.0/0000:10:00.0;"
         "/sys/devices/pci0000:80/0000:80:02.0/0000:90:00.0",
         0, ""},
        {"SYS",
         "/sys/devices/pci0000:00/0000:00:02.0/0000:10:00.0;"
         "/sys/devices/pci0000:80/0000:80:02.0/0000:90:00.0",
         1, "CFX_NET_MERGE_LEVEL=SYS, SYS apart"},
    };
    return cr_make_param_array(struct merge_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct merge_case *mc, net_plugin, devices_near_enough_are_merged_by_distance,
                  .timeout = 150)
{
    cr_log_info("CFX_NET_MERGE_LEVEL=%s, paths %s: %s", mc->level[0] ? mc->level : "(unset)",
                mc->paths, mc->merged ? "merged" : "apart");
    cfx_test_setenv("CFXTEST_NDEV", "2");
    cfx_test_setenv("CFXTEST_PCI_PATHS", mc->paths);
    cfx_test_setenv("CFX_NET_MERGE_LEVEL", mc->level[0] ? mc->level : NULL);
    char merged_line[160];
    snprintf(merged_line, sizeof(merged_line),
             "merged devices 0 (lo), 1 (lo1) into virtual device 2 (lo+lo1, 20000 Mbps; %s)",
             mc->why);
    const char *const needles[] = {"merged devices", merged_line,
                                   "(plugin cfxtest, device 2:", "via net-plugin"};
    int counts[4];
    run_counting(test_plugin("CFX_TEST_NET_PLUGIN"), 2, allreduces_of_every_size, needles, counts,
                 4);
    cfx_test_setenv("CFXTEST_NDEV", NULL);
    cfx_test_setenv("CFXTEST_PCI_PATHS", NULL);
    cfx_test_setenv("CFX_NET_MERGE_LEVEL", NULL);
    cr_log_info("%d merge lines (%d as expected), %d connections on device 2, %d via net-plugin",
                counts[0], counts[1], counts[2], counts[3]);
    cr_assert_geq(counts[3], 2, "only %d connections via net-plugin", counts[3]);
    if (mc->merged) {
        cr_assert_geq(counts[1], 2, "the ranks did not log \"%s\"", merged_line);
        cr_assert_geq(counts[2], 2, "only %d connections on the virtual device", counts[2]);
    } else {
        cr_assert_eq(counts[0], 0, "%d merge lines for devices that stay apart", counts[0]);
        cr_assert_eq(counts[2], 0, "%d connections on a virtual device", counts[2]);
    }
}

/* A plugin whose makeVDevice fails: merging by distance gives way (the
 * devices stay apart, a line says why), where a forced merge fails init. */
Test(net_plugin, a_failed_merge_by_distance_leaves_the_devices_apart, .timeout = 150)
{
    cfx_test_setenv("CFXTEST_NDEV", "2");
    cfx_test_setenv("CFXTEST_VDEV_FAIL", "1");
    cfx_test_setenv("CFXTEST_PCI_PATHS",
                    PCI_ROOT "0000:11:00.0/0000:12:00.0;" PCI_ROOT "0000:11:00.0/0000:12:00.1");
    const char *const needles[] = {
        "failed makeVDevice of 0 (lo), 1 (lo1) (CFX_NET_MERGE_LEVEL=PORT, "
        "PORT apart): ncclInternalError (3); the devices stay apart",
        "via net-plugin", "(plugin cfxtest, device 2:"};
    int counts[3];
    run_counting(test_plugin("CFX_TEST_NET_PLUGIN"), 2, allreduces_of_every_size, needles, counts,
                 3);
    cfx_test_setenv("CFXTEST_NDEV", NULL);
    cfx_test_setenv("CFXTEST_VDEV_FAIL", NULL);
    cfx_test_setenv("CFXTEST_PCI_PATHS", NULL);
    cr_assert_geq(counts[0], 2, "the ranks did not say the merge failed (%d lines)", counts[0]);
    cr_assert_geq(counts[1], 2, "only %d connections via net-plugin", counts[1]);
    cr_assert_eq(counts[2], 0, "%d connections on a virtual device that was never made", counts[2]);
}

/* The distance between two devices from their PCI paths, NCCL's classes. */
Test(net_plugin, pci_distance_classes)
{
    static const struct {
        const char *a, *b;
        enum cfx_net_dist want;
    } cases[] = {
        {PCI_ROOT "0000:12:00.0", PCI_ROOT "0000:12:00.0", CFX_NET_DIST_PORT},
        {PCI_ROOT "0000:12:00.0", PCI_ROOT "0000:12:00.1", CFX_NET_DIST_PORT},
        {PCI_ROOT "0000:11:00.0/0000:12:00.0", PCI_ROOT "0000:11:01.0/0000:13:00.0",
         CFX_NET_DIST_PIX},
        {PCI_ROOT "0000:11:00.0/0000:12:00.0",
         PCI_ROOT "0000:11:01.0/0000:13:00.0/0000:14:00.0/0000:15:00.0", CFX_NET_DIST_PXB},
        {"/sys/devices/pci0000:00/0000:00:02.0/0000:10:00.0",
         "/sys/devices/pci0000:00/0000:00:03.0/0000:20:00.0", CFX_NET_DIST_PHB},
        {"/sys/devices/pci0000:00/0000:00:02.0/0000:10:00.0",
         "/sys/devices/pci0000:80/0000:80:02.0/0000:90:00.0", CFX_NET_DIST_SYS},
        {NULL, PCI_ROOT "0000:12:00.0", CFX_NET_DIST_UNKNOWN},
        {"/sys/devices/virtual/net/lo", PCI_ROOT "0000:12:00.0", CFX_NET_DIST_UNKNOWN},
        {"", "", CFX_NET_DIST_UNKNOWN},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        enum cfx_net_dist got = cfx_net_pci_distance(cases[i].a, cases[i].b);
        cr_expect_eq(got, cases[i].want, "case %zu (%s, %s): %d, not %d", i,
                     cases[i].a ? cases[i].a : "NULL", cases[i].b, (int)got, (int)cases[i].want);
        cr_expect_eq(cfx_net_pci_distance(cases[i].b, cases[i].a), got, "case %zu is not symmetric",
                     i);
    }
}

/* The same with the connection and plugin lines counted. */
static void merged_run(int *on_vdev_p, int *on_lo_p, int *plugin_saw_p)
{
    cfx_test_setenv("CFXTEST_NDEV", "2");
    cfx_test_setenv("CFX_NET_FORCE_MERGE", "lo,lo1;");
    const char *const needles[] = {"(plugin cfxtest, device 2: lo+lo1, channel 0)",
                                   "(plugin cfxtest, device 0: lo,",
                                   "cfxtest plugin: listen on virtual device 2"};
    int counts[3];
    run_counting(test_plugin("CFX_TEST_NET_PLUGIN"), 2, allreduces_of_every_size, needles, counts,
                 3);
    cfx_test_setenv("CFXTEST_NDEV", NULL);
    cfx_test_setenv("CFX_NET_FORCE_MERGE", NULL);
    *on_vdev_p = counts[0], *on_lo_p = counts[1], *plugin_saw_p = counts[2];
}

Test(net_plugin, connections_listen_and_connect_on_the_virtual_device, .timeout = 150)
{
    int on_vdev, on_lo, plugin_saw;
    merged_run(&on_vdev, &on_lo, &plugin_saw);
    cr_log_info("%d connection lines on the virtual device, %d on lo, %d plugin listens on it",
                on_vdev, on_lo, plugin_saw);
    cr_assert_geq(on_vdev, 2, "only %d connection lines name the virtual device", on_vdev);
    cr_assert_eq(on_lo, 0, "%d connections on device 0 although it was merged", on_lo);
    cr_assert_geq(plugin_saw, 2, "the plugin saw %d listens on its virtual device", plugin_saw);
}

static void init_must_fail_saying(struct cfx_test_rank *ctx)
{
    const char *needle = ctx->arg;
    cfxComm_t comm = NULL;
    cfx_test_step(ctx, "init with CFX_NET_FORCE_MERGE it cannot carry out");
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    RANK_ASSERT(ctx, res == cfxSystemError, "init returned %s", cfxGetErrorString(res));
    const char *why = cfxGetLastError(NULL);
    RANK_ASSERT(ctx, strstr(why, "CFX_NET_FORCE_MERGE") != NULL && strstr(why, needle) != NULL,
                "the sentence does not say \"%s\": %s", needle, why);
}

static void merge_must_fail(const char *var, const char *merge, const char *needle)
{
    cfx_test_setenv("CFXTEST_NDEV", "2");
    init_fail_run(test_plugin(var), "CFX_NET_FORCE_MERGE", merge, init_must_fail_saying,
                  (void *)needle);
    cfx_test_setenv("CFXTEST_NDEV", NULL);
}

Test(net_plugin, a_merge_naming_an_unknown_device_fails_init_with_a_sentence, .timeout = 60)
{
    merge_must_fail("CFX_TEST_NET_PLUGIN", "lo,mlx5_9", "names mlx5_9");
}

Test(net_plugin, a_merge_of_one_device_twice_fails_init_with_a_sentence, .timeout = 60)
{
    merge_must_fail("CFX_TEST_NET_PLUGIN", "lo,lo1;lo1", "in two groups");
}

Test(net_plugin, a_merge_with_a_v8_plugin_fails_init_with_a_sentence, .timeout = 60)
{
    merge_must_fail("CFX_TEST_NET_PLUGIN_V8", "lo,lo1", "no makeVDevice");
}

/* ------------------------------------------------------------ user buffers */

/* REF_COUNT (tests/registered_rounds.h): two full 512 KiB slots and a
 * 12-byte tail (the tail rides in the info line). */

/* Rank 0 sends from a buffer registered with cfxCommRegister (or not:
 * @p arg 0) and overwrites it as soon as the send returns; rank 1
 * receives into a registered buffer holding garbage and checks every
 * element. Registered, the plugin sends each full slot's payload from the
 * user's buffer (no copy into a slot), and a payload read from the slot,
 * or from the buffer after the send returned, shows; and, rank 0 sending
 * only once rank 1's receive is surely launched (rank 1 says it is about
 * to launch it, and rank 0 waits 100 ms more: its offer is live), receives
 * each full payload into the user's buffer, which a receive step that
 * still copied from its slot would overwrite with the slot's stale bytes.
 * Then an allreduce between registered buffers (its raw input and final
 * output go from them). */
static void send_from_registered(struct cfx_test_rank *ctx)
{
    int registered = *(const int *)ctx->arg, r = ctx->rank;
    float *buf = calloc(REF_COUNT, sizeof(float)), *out = calloc(REF_COUNT, sizeof(float));
    RANK_ASSERT(ctx, buf && out, "out of memory");
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, r));
    /* Rank 1's receive buffer is registered before its connection from
     * rank 0 exists: a connection that had no registration to go by when
     * it posted its first receives ahead posted them into its slots, and
     * a posted receive cannot be taken back. The rest are registered with
     * connections that exist already. */
    void *hb = NULL, *ho = NULL;
    if (registered && r == 1)
        RANK_CFX(ctx, cfxCommRegister(comm, buf, REF_COUNT * sizeof(float), &hb));
    int hello = r; /* Connects the pair first. */
    if (r == 0)
        RANK_CFX(ctx, cfxSend(&hello, 1, cfxInt32, 1, comm, NULL));
    else
        RANK_CFX(ctx, cfxRecv(&hello, 1, cfxInt32, 0, comm, NULL));
    if (registered) {
        if (r == 0)
            RANK_CFX(ctx, cfxCommRegister(comm, buf, REF_COUNT * sizeof(float), &hb));
        RANK_CFX(ctx, cfxCommRegister(comm, out, REF_COUNT * sizeof(float), &ho));
    }
    for (int round = 0; round < 3 && !ctx->slot_failed; round++) {
        cfx_test_step(ctx, "round %d", round);
        int ready = round;
        if (r == 0) {
            ref_tagged_msg_fill(buf, 0, 1, REF_COUNT, round);
            RANK_CFX(ctx, cfxRecv(&ready, 1, cfxInt32, 1, comm, NULL));
            usleep(100 * 1000); /* Rank 1 launched its receive meanwhile. */
            RANK_CFX(ctx, cfxSend(buf, REF_COUNT, cfxFloat32, 1, comm, NULL));
            ref_fill_value(buf, REF_COUNT, -1.0f);
        } else {
            ref_fill_value(buf, REF_COUNT, -7.0f);
            RANK_CFX(ctx, cfxSend(&ready, 1, cfxInt32, 0, comm, NULL));
            RANK_CFX(ctx, cfxRecv(buf, REF_COUNT, cfxFloat32, 0, comm, NULL));
            long bad = ref_tagged_msg_check(buf, 0, 1, REF_COUNT, round);
            RANK_ASSERT(ctx, bad < 0, "round %d: element %ld is %g, not %g", round, bad,
                        bad < 0 ? 0.0 : (double)buf[bad],
                        bad < 0 ? 0.0 : (double)ref_tagged(0, 1, (size_t)bad, round));
        }
    }
    cfx_test_step(ctx, "an allreduce between registered buffers");
    for (size_t i = 0; i < REF_COUNT; i++)
        buf[i] = (float)(r + 1) + (float)(i % 7);
    RANK_CFX(ctx, cfxAllReduce(buf, out, REF_COUNT, cfxFloat32, cfxSum, comm, NULL));
    for (size_t i = 0; i < REF_COUNT; i++)
        if (out[i] != 3.0f + 2.0f * (float)(i % 7)) {
            RANK_ASSERT(ctx, 0, "allreduce element %zu is %g", i, (double)out[i]);
            break;
        }
    if (hb != NULL)
        RANK_CFX(ctx, cfxCommDeregister(comm, hb));
    if (ho != NULL)
        RANK_CFX(ctx, cfxCommDeregister(comm, ho));
    if (!ctx->slot_failed)
        RANK_CFX(ctx, cfxCommFinalize(comm));
    cfxCommDestroy(comm);
    free(buf);
    free(out);
}

/* Bit 0: the buffers are registered; bit 1: over the built-in socket net;
 * bit 2: over the built-in verbs net (fake-verbs); else the test plugin. */
ParameterizedTestParameters(net_plugin, sends_and_receives_of_registered_buffers_skip_the_slots)
{
    static int which[] = {1, 0, 3, 2, 5, 4};
    return cr_make_param_array(int, which, 6);
}

ParameterizedTest(int *which, net_plugin, sends_and_receives_of_registered_buffers_skip_the_slots,
                  .timeout = 150)
{
    static int registered[1];
    registered[0] = *which & 1;
    cr_log_info("%s buffers over %s", *registered ? "registered" : "unregistered",
                *which & 4   ? "the built-in verbs net (fake-verbs)"
                : *which & 2 ? "the built-in socket net"
                             : "the test plugin");
    if (*which & 4 && cfx_test_use_fakeverbs() == NULL)
        cr_skip_test("no fake-verbs library (CFX_TEST_FAKEVERBS unset)");
    cfx_test_setenv("CFX_NET_PLUGIN", *which & 4   ? "builtin:ib"
                                      : *which & 2 ? "builtin:socket"
                                                   : test_plugin("CFX_TEST_NET_PLUGIN"));
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "ref");
    struct cfx_test_options opts = {.nranks = 2,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 120,
                                    .arg = registered,
                                    .before_rank = own_host};
    char report[8192];
    int ok = cfx_test_run(&opts, send_from_registered, report, sizeof(report));
    int p2p = cfx_test_count_in_logs(
        logs, "rank 0 -> rank 1 sent 6 payload(s) from registered user buffers");
    int any = cfx_test_count_in_logs(logs, "from registered user buffers");
    int in_place = cfx_test_count_in_logs(
        logs, "rank 1 <- rank 0 received 6 payload(s) into registered user buffers");
    int any_in = cfx_test_count_in_logs(logs, "into registered user buffers");
    if (ok && (*registered ? in_place == 1 : any_in == 0))
        cfx_test_remove_logs(logs);
    cfx_test_logs_off();
    cfx_test_setenv("CFX_NET_PLUGIN", NULL);
    cr_assert(ok, "%s(logs kept in %s.*)", report, logs);
    cr_log_info("%d lines of rank 0's 6 payloads to rank 1, %d lines in all", p2p, any);
    if (*registered) {
        cr_assert_eq(p2p, 1,
                     "rank 0's send connection to rank 1 did not send its 6 full "
                     "payloads from the user's buffer");
        cr_assert_geq(any - p2p, 2, "%d ring connections sent from the registered buffers",
                      any - p2p);
        cr_assert(in_place == 1 && any_in == 1,
                  "rank 1's receive connection from rank 0 did not receive its 6 full payloads "
                  "into the user's buffer (%d lines of it, %d in all; logs kept in %s.*)",
                  in_place, any_in, logs);
    } else {
        cr_assert_eq(any, 0, "%d connections sent from user buffers nobody registered", any);
        cr_assert_eq(any_in, 0, "%d connections received into user buffers nobody registered",
                     any_in);
    }
}

/* 0: the test plugin; 1: the built-in socket net; 2: the built-in verbs
 * net (fake-verbs). */
ParameterizedTestParameters(net_plugin,
                            alltoall_between_registered_buffers_is_exact_however_slots_land)
{
    static int which[] = {0, 1, 2};
    return cr_make_param_array(int, which, 3);
}

ParameterizedTest(int *which, net_plugin,
                  alltoall_between_registered_buffers_is_exact_however_slots_land, .timeout = 150)
{
    cr_log_info("over %s", *which == 2   ? "the built-in verbs net (fake-verbs)"
                           : *which == 1 ? "the built-in socket net"
                                         : "the test plugin");
    if (*which == 2 && cfx_test_use_fakeverbs() == NULL)
        cr_skip_test("no fake-verbs library (CFX_TEST_FAKEVERBS unset)");
    cfx_test_setenv("CFX_NET_PLUGIN", *which == 2   ? "builtin:ib"
                                      : *which == 1 ? "builtin:socket"
                                                    : test_plugin("CFX_TEST_NET_PLUGIN"));
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "a2a-reg");
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 120, .before_rank = own_host};
    char report[8192];
    int ok = cfx_test_run(&opts, ref_alltoall_both_registered, report, sizeof(report));
    int in_place = cfx_test_count_in_logs(logs, "into registered user buffers");
    if (ok)
        cfx_test_remove_logs(logs);
    cfx_test_logs_off();
    cfx_test_setenv("CFX_NET_PLUGIN", NULL);
    cr_assert(ok, "%s(logs kept in %s.*)", report, logs);
    /* Slots land either way; the figure says how many connections took
     * any in place, for the log. */
    cr_log_info("%d receive connections received payloads into the registered buffers", in_place);
}

/* ------------------------------------------------------------ mismatch */

/* Rank 1 calls the second allreduce with another count: every rank's call
 * returns cfxInvalidUsage within seconds, not at CFX_TIMEOUT (the
 * fingerprint travels in each slot's info line, in the header, the first
 * of its two messages: copying another slot's fails this test, checked). */
static void mismatched_count(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    static float data[4096], out[4096];
    for (int i = 0; i < 4096; i++)
        data[i] = 1.0f;
    RANK_CFX(ctx, cfxAllReduce(data, out, 4096, cfxFloat32, cfxSum, comm, NULL));
    cfx_test_step(ctx, "an allreduce of another count on rank 1");
    double start = now_s();
    cfxResult_t res =
        cfxAllReduce(data, out, ctx->rank == 1 ? 4000 : 4096, cfxFloat32, cfxSum, comm, NULL);
    double took = now_s() - start;
    RANK_ASSERT(ctx, res == cfxInvalidUsage, "the mismatched allreduce returned %s: %s",
                cfxGetErrorString(res), cfxGetLastError(comm));
    RANK_ASSERT(ctx, took < 5, "the mismatch was caught only after %.1f s", took);
    RANK_ASSERT(ctx, strstr(cfxGetLastError(comm), "mismatched") != NULL, "sentence: %s",
                cfxGetLastError(comm));
    cfxCommDestroy(comm);
}

ParameterizedTestParameters(net_plugin, a_mismatch_fails_every_rank_at_once)
{
    static int rendezvous[] = {0, 1};
    return cr_make_param_array(int, rendezvous, 2);
}

static void mismatch_run(const char *spec, int rendezvous)
{
    cfx_test_setenv("CFX_NET_PLUGIN", spec);
    cfx_test_setenv("CFXTEST_RENDEZVOUS", rendezvous ? "1" : NULL);
    cfx_test_setenv("CFX_TIMEOUT", "30");
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 60, .before_rank = own_host};
    char report[8192];
    int ok = cfx_test_run(&opts, mismatched_count, report, sizeof(report));
    cfx_test_setenv("CFX_NET_PLUGIN", NULL);
    cfx_test_setenv("CFXTEST_RENDEZVOUS", NULL);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
    cr_assert(ok, "%s", report);
}

ParameterizedTest(int *rendezvous, net_plugin, a_mismatch_fails_every_rank_at_once, .timeout = 90)
{
    mismatch_run(test_plugin("CFX_TEST_NET_PLUGIN"), *rendezvous);
}

/* ------------------------------------------------------------ devices */

/* Per rank r, a topology whose only port is "lo<r+1>": the test plugin's
 * device r+1 of 3 (CFXTEST_NDEV). Written by the test, read by the rank. */
static char nic_topo[2][64];

static void own_host_and_nic(struct cfx_test_rank *ctx)
{
    own_host(ctx);
    cfx_test_setenv("CFX_TOPO_FILE", nic_topo[ctx->rank]);
}

static void write_nic_topo(char *path, size_t size, int rank)
{
    snprintf(path, size, "/tmp/cfx-net-topo-%d-XXXXXX", rank);
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0, "mkstemp");
    FILE *f = fdopen(fd, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "<system version=\"1\">\n"
            "  <cpu numaid=\"0\" affinity=\"ffffffff\" arch=\"x86_64\" vendor=\"GenuineIntel\" "
            "familyid=\"6\" modelid=\"143\">\n"
            "    <pci busid=\"0000:31:00.0\" class=\"0x020000\" vendor=\"0x15b3\" "
            "device=\"0x101d\" link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">\n"
            "      <nic><net name=\"lo%d\" dev=\"0\" speed=\"100000\" port=\"1\" "
            "guid=\"0x1\" maxconn=\"131072\" gdr=\"0\"/></nic>\n"
            "    </pci>\n"
            "  </cpu>\n"
            "</system>\n",
            rank + 1);
    fclose(f);
}

/* Each rank connects through the plugin's device named as its own nearest
 * port, whatever its peer's is: rank 0 through lo1, rank 1 through lo2. */
Test(net_plugin, each_rank_uses_the_device_of_its_own_nearest_port, .timeout = 150)
{
    for (int r = 0; r < 2; r++)
        write_nic_topo(nic_topo[r], sizeof(nic_topo[r]), r);
    cfx_test_setenv("CFX_NET_PLUGIN", test_plugin("CFX_TEST_NET_PLUGIN"));
    cfx_test_setenv("CFXTEST_NDEV", "3");
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "dev");
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 90, .before_rank = own_host_and_nic};
    char report[8192];
    int ok = cfx_test_run(&opts, allreduces_of_every_size, report, sizeof(report));
    int said0 = cfx_test_count_in_logs(logs, "rank 0 uses device 1 (lo1), the topology's nearest");
    int said1 = cfx_test_count_in_logs(logs, "rank 1 uses device 2 (lo2), the topology's nearest");
    int on0 = cfx_test_count_in_logs(
        logs, "rank 0 -> rank 1 connected (plugin cfxtest, device 1: lo1, channel 0)");
    int on1 = cfx_test_count_in_logs(
        logs, "rank 1 -> rank 0 connected (plugin cfxtest, device 2: lo2, channel 0)");
    int on_first = cfx_test_count_in_logs(logs, "device 0: lo, channel");
    if (ok)
        cfx_test_remove_logs(logs);
    cfx_test_logs_off();
    cfx_test_setenv("CFX_NET_PLUGIN", NULL);
    cfx_test_setenv("CFXTEST_NDEV", NULL);
    for (int r = 0; r < 2; r++)
        unlink(nic_topo[r]);
    cr_assert(ok, "%s(logs kept in %s.*)", report, logs);
    cr_assert_geq(said0, 1, "rank 0 did not say it uses lo1, its nearest port");
    cr_assert_geq(said1, 1, "rank 1 did not say it uses lo2, its nearest port");
    cr_assert_geq(on0, 1, "rank 0's send connection is not on lo1");
    cr_assert_geq(on1, 1, "rank 1's send connection is not on lo2");
    cr_assert_eq(on_first, 0, "%d connections on device 0, which is no rank's nearest", on_first);
}

/* Rank 1's plugin fails every isend after its first 40. */
static void isends_fail_in_rank_one(struct cfx_test_rank *ctx)
{
    own_host(ctx);
    if (ctx->rank == 1)
        cfx_test_setenv("CFXTEST_FAIL_AFTER_SENDS", "40");
}

static void allreduce_until_an_isend_fails(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    size_t count = 1 << 16;
    float *data = calloc(count, sizeof(float));
    RANK_ASSERT(ctx, data != NULL, "malloc");
    cfxResult_t res = cfxSuccess;
    double start = now_s(), call = 0;
    for (int i = 0; res == cfxSuccess && now_s() - start < 20; i++) {
        cfx_test_step(ctx, "allreduce %d until rank 1's isend fails", i);
        call = now_s();
        res = cfxAllReduce(data, data, count, cfxFloat32, cfxSum, comm, NULL);
    }
    free(data);
    const char *why = cfxGetLastError(comm);
    RANK_ASSERT(ctx, res != cfxSuccess, "no allreduce failed in 20 s");
    RANK_ASSERT(ctx, now_s() - call < 8, "the failing call took %.1f s (CFX_TIMEOUT=5)",
                now_s() - call);
    RANK_ASSERT(ctx, strstr(why, "rank") != NULL, "the sentence names no rank: %s", why);
    if (ctx->rank == 1)
        RANK_ASSERT(ctx, strstr(why, "plugin cfxtest's isend returned ncclSystemError (2)") != NULL,
                    "rank 1's sentence does not name the plugin, the call and its result: %s", why);
    cfxCommDestroy(comm);
}

Test(net_plugin, a_failing_plugin_call_fails_the_call_with_a_sentence_naming_it, .timeout = 120)
{
    cfx_test_setenv("CFX_NET_PLUGIN", test_plugin("CFX_TEST_NET_PLUGIN"));
    cfx_test_setenv("CFX_TIMEOUT", "5");
    struct cfx_test_options opts = {.nranks = 3,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 90,
                                    .before_rank = isends_fail_in_rank_one};
    char report[8192];
    int ok = cfx_test_run(&opts, allreduce_until_an_isend_fails, report, sizeof(report));
    cfx_test_setenv("CFX_NET_PLUGIN", NULL);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
    cr_assert(ok, "%s", report);
}

/* CFX_NET_PLUGIN=cfxtest finds libnccl-net-cfxtest.so on the library path
 * (NCCL's naming rule). ctest puts the plugin's folder on LD_LIBRARY_PATH;
 * the dynamic loader reads it only at start, so without it: a skip. */
Test(net_plugin, a_plugin_name_finds_libnccl_net_name_so_on_the_library_path, .timeout = 150)
{
    const char *path = test_plugin("CFX_TEST_NET_PLUGIN");
    char dir[512];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash != NULL)
        *slash = '\0';
    const char *search = getenv("LD_LIBRARY_PATH");
    if (search == NULL || strstr(search, dir) == NULL)
        cr_skip_test("LD_LIBRARY_PATH does not hold %s (ctest sets it)", dir);
    int plugin, socket, loaded;
    cfx_test_setenv("CFX_TEST_NET_PLUGIN_NAME", "cfxtest");
    run_over_plugin("CFX_TEST_NET_PLUGIN_NAME", 2, allreduces_of_every_size, &plugin, &socket,
                    &loaded, "loaded libnccl-net-cfxtest.so (ncclNetPlugin_v11");
    cfx_test_setenv("CFX_TEST_NET_PLUGIN_NAME", NULL);
    cr_assert_geq(plugin, 2, "only %d connections via net-plugin in the logs", plugin);
    cr_assert_geq(loaded, 2, "the ranks did not load the plugin by its name (%d lines)", loaded);
}

/* ------------------------------------------------------------ the built-in socket net */

/* CFX_NET_PLUGIN=builtin:socket: Conflux's own socket net behind the same
 * interface as a plugin (transports/net/builtin_socket.c), no library. */
#define BUILTIN_SOCKET        "builtin:socket"
#define BUILTIN_SOCKET_LOADED "using Conflux's built-in net (ncclNetPlugin_v9, name \"Socket\")"

ParameterizedTestParameters(net_builtin, allreduce_of_every_size_over_the_builtin_socket_net)
{
    static int ranks[] = {2, 3, 4};
    return cr_make_param_array(int, ranks, 3);
}

ParameterizedTest(int *nranks, net_builtin, allreduce_of_every_size_over_the_builtin_socket_net,
                  .timeout = 150)
{
    int plugin, socket, loaded;
    run_over_plugin("=" BUILTIN_SOCKET, *nranks, allreduces_of_every_size, &plugin, &socket,
                    &loaded, BUILTIN_SOCKET_LOADED);
    cr_assert_geq(plugin, *nranks, "only %d connections via net-plugin in the logs", plugin);
    cr_assert_eq(socket, 0, "%d connections via the socket transport", socket);
    cr_assert_geq(loaded, *nranks, "the ranks did not log the built-in net (%d lines)", loaded);
}

Test(net_builtin, broadcast_and_allgather_over_the_builtin_socket_net_3_ranks, .timeout = 150)
{
    int plugin, socket, loaded;
    run_over_plugin("=" BUILTIN_SOCKET, 3, broadcast_and_allgather, &plugin, &socket, &loaded,
                    BUILTIN_SOCKET_LOADED);
    cr_assert_geq(plugin, 3, "only %d connections via net-plugin in the logs", plugin);
    cr_assert_eq(socket, 0, "%d connections via the socket transport", socket);
}

Test(net_builtin, killed_rank_fails_every_survivor_within_the_timeout, .timeout = 150)
{
    killed_rank_run(BUILTIN_SOCKET);
}

Test(net_builtin, a_mismatch_fails_every_rank_at_once, .timeout = 90)
{
    mismatch_run(BUILTIN_SOCKET, 0);
}

Test(net_builtin, an_unknown_builtin_net_fails_init_with_a_sentence, .timeout = 60)
{
    plugin_must_not_load("builtin:carrier-pigeon");
}

/* CFX_NET=Socket names the built-in net too (its name is Socket): it
 * carries the job. */
Test(net_builtin, cfx_net_socket_names_the_builtin_socket_net, .timeout = 150)
{
    cfx_test_setenv("CFX_NET", "Socket");
    int plugin, socket, loaded;
    run_over_plugin("=" BUILTIN_SOCKET, 2, allreduces_of_every_size, &plugin, &socket, &loaded,
                    BUILTIN_SOCKET_LOADED);
    cfx_test_setenv("CFX_NET", NULL);
    cr_assert_geq(plugin, 2, "only %d connections via net-plugin in the logs", plugin);
    cr_assert_eq(socket, 0, "%d connections via the socket transport", socket);
}

/* ------------------------------------------------------------ the built-in verbs net */

/* CFX_NET_PLUGIN=builtin:ib: the verbs byte mover behind the same interface
 * (transports/ib/net.c), over tests/fakeverbs (its results are fake-verbs
 * results, never an RDMA NIC's). cfx_test_use_fakeverbs sets CFX_NET=IB,
 * which names this net ("IB") too. */
#define BUILTIN_IB        "builtin:ib"
#define BUILTIN_IB_LOADED "using Conflux's built-in net (ncclNetPlugin_v9, name \"IB\")"

static void use_fakeverbs_or_skip(void)
{
    if (cfx_test_use_fakeverbs() == NULL)
        cr_skip_test("no fake-verbs library (CFX_TEST_FAKEVERBS unset: built without the verbs "
                     "headers?)");
}

/* Runs @p fn over the verbs net; asserts every connection went through it. */
static void run_over_builtin_ib(int nranks, cfx_test_rank_fn fn)
{
    use_fakeverbs_or_skip();
    const char *const needles[] = {"via net-plugin", "via socket", "via ib", BUILTIN_IB_LOADED};
    int counts[4];
    run_counting(BUILTIN_IB, nranks, fn, needles, counts, 4);
    cr_log_info("%d ranks: %d connection lines via net-plugin, %d via socket, %d via ib, %d lines "
                "\"%s\"",
                nranks, counts[0], counts[1], counts[2], counts[3], BUILTIN_IB_LOADED);
    cr_assert_geq(counts[0], nranks, "only %d connections via net-plugin", counts[0]);
    cr_assert_eq(counts[1] + counts[2], 0, "%d connections via socket, %d via ib", counts[1],
                 counts[2]);
    cr_assert_geq(counts[3], nranks, "the ranks did not log the verbs net (%d lines)", counts[3]);
}

ParameterizedTestParameters(net_builtin_ib, allreduce_of_every_size_over_the_builtin_verbs_net)
{
    static int ranks[] = {2, 3, 4};
    return cr_make_param_array(int, ranks, 3);
}

ParameterizedTest(int *nranks, net_builtin_ib, allreduce_of_every_size_over_the_builtin_verbs_net,
                  .timeout = 150)
{
    run_over_builtin_ib(*nranks, allreduces_of_every_size);
}

Test(net_builtin_ib, broadcast_and_allgather_over_the_builtin_verbs_net_3_ranks, .timeout = 150)
{
    run_over_builtin_ib(3, broadcast_and_allgather);
}

/* CFX_IB_QPS_PER_CONNECTION queue pairs per comm: messages in turn over
 * them, or each split over all (CFX_IB_SPLIT_DATA_ON_QPS=1). */
struct qp_case {
    char qps[4]; /* Arrays, not pointers: a test's parameters are copied into its process. */
    char split[4];
};

ParameterizedTestParameters(net_builtin_ib, allreduce_over_several_queue_pairs_per_comm)
{
    static struct qp_case cases[] = {{"3", "0"}, {"4", "1"}};
    return cr_make_param_array(struct qp_case, cases, 2);
}

ParameterizedTest(struct qp_case *qc, net_builtin_ib, allreduce_over_several_queue_pairs_per_comm,
                  .timeout = 150)
{
    cr_log_info("CFX_IB_QPS_PER_CONNECTION=%s CFX_IB_SPLIT_DATA_ON_QPS=%s", qc->qps, qc->split);
    cfx_test_setenv("CFX_IB_QPS_PER_CONNECTION", qc->qps);
    cfx_test_setenv("CFX_IB_SPLIT_DATA_ON_QPS", qc->split);
    run_over_builtin_ib(3, allreduces_of_every_size);
    cfx_test_setenv("CFX_IB_QPS_PER_CONNECTION", NULL);
    cfx_test_setenv("CFX_IB_SPLIT_DATA_ON_QPS", NULL);
}

/* CFX_NET_FORCE_MERGE over the verbs net: two fake ports per rank merged
 * into its virtual device 2 (makeVDevice), which carries every connection,
 * a queue pair on each port. */
Test(net_builtin_ib, two_ports_merged_into_a_virtual_device_carry_the_job, .timeout = 150)
{
    use_fakeverbs_or_skip();
    cfx_test_setenv("FAKEVERBS_DEVICES", "2");
    cfx_test_setenv("CFX_NET_FORCE_MERGE", "fake_0,fake_1");
    const char *const needles[] = {"(plugin IB, device 2: fake_0+fake_1,", "via net-plugin",
                                   "verbs net: virtual device 2 is fake_0:1+fake_1:1",
                                   "(plugin IB, device 0:", "(plugin IB, device 1:"};
    int counts[5];
    run_counting(BUILTIN_IB, 3, allreduces_of_every_size, needles, counts, 5);
    cfx_test_setenv("FAKEVERBS_DEVICES", NULL);
    cfx_test_setenv("CFX_NET_FORCE_MERGE", NULL);
    cr_log_info("%d connection lines on the virtual device, %d on a port alone, %d via "
                "net-plugin, %d ranks made it",
                counts[0], counts[3] + counts[4], counts[1], counts[2]);
    cr_assert_geq(counts[2], 3, "the ranks did not make the virtual device (%d lines)", counts[2]);
    cr_assert_geq(counts[1], 3, "only %d connections via net-plugin", counts[1]);
    cr_assert_geq(counts[0], 3, "only %d connections on the virtual device", counts[0]);
    cr_assert_eq(counts[3] + counts[4], 0, "%d connections on one port alone",
                 counts[3] + counts[4]);
}

/* Rank 1's fake port goes down 1.5 s after its device opened. */
static void port_down_in_rank_one(struct cfx_test_rank *ctx)
{
    own_host(ctx);
    if (ctx->rank == 1)
        cfx_test_setenv("FAKEVERBS_PORT_DOWN_AFTER_MS", "1500");
}

/* Allreduces until one fails (20 s at most): it must, within the timeout. */
static void allreduce_until_the_port_goes_down(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    enum { COUNT = 1 << 16 };
    static float data[COUNT];
    cfxResult_t res = cfxSuccess;
    double start = now_s(), call = start;
    for (int i = 0; res == cfxSuccess && now_s() - start < 20; i++) {
        cfx_test_step(ctx, "allreduce %d until rank 1's port goes down", i);
        for (size_t e = 0; e < COUNT; e++)
            data[e] = (float)ctx->rank;
        call = now_s();
        res = cfxAllReduce(data, data, COUNT, cfxFloat32, cfxSum, comm, NULL);
    }
    RANK_ASSERT(ctx, res != cfxSuccess, "the port went down and 20 s of allreduces succeeded");
    RANK_ASSERT(ctx, now_s() - call < 8, "the failing call took %.1f s (CFX_TIMEOUT=5)",
                now_s() - call);
    /* The verbs net says the failure is rank 1's own (a port of its broke),
     * so every rank blames rank 1, not a peer in between. */
    const char *why = cfxGetLastError(comm);
    RANK_ASSERT(ctx, strstr(why, "because of rank 1") != NULL,
                "the sentence blames another rank: %s", why);
    cfxCommDestroy(comm);
}

/* A port error event fails the job within the timeout, and the rank whose
 * port it was says which port and what event (the net's warning, also
 * carried into the failed call's sentence). */
Test(net_builtin_ib, a_port_error_fails_every_rank_and_names_the_port, .timeout = 150)
{
    use_fakeverbs_or_skip();
    cfx_test_setenv("CFX_NET_PLUGIN", BUILTIN_IB);
    cfx_test_setenv("CFX_TIMEOUT", "5");
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "portdown");
    struct cfx_test_options opts = {.nranks = 3,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 90,
                                    .before_rank = port_down_in_rank_one};
    char report[8192];
    int ok = cfx_test_run(&opts, allreduce_until_the_port_goes_down, report, sizeof(report));
    int said = cfx_test_count_in_logs(logs, "fake_0 port 1: port error");
    if (ok && said > 0)
        cfx_test_remove_logs(logs);
    cfx_test_logs_off();
    cfx_test_setenv("CFX_NET_PLUGIN", NULL);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
    cr_assert(ok, "%s(logs kept in %s.*)", report, logs);
    cr_assert_geq(said, 1, "no log says \"fake_0 port 1: port error\" (logs kept in %s.*)", logs);
}

Test(net_builtin_ib, killed_rank_fails_every_survivor_within_the_timeout, .timeout = 150)
{
    use_fakeverbs_or_skip();
    killed_rank_run(BUILTIN_IB);
}

Test(net_builtin_ib, a_mismatch_fails_every_rank_at_once, .timeout = 90)
{
    use_fakeverbs_or_skip();
    mismatch_run(BUILTIN_IB, 0);
}

/* With the system's libibverbs (no device on this machine), the verbs
 * net's init fails, and so does the communicator's, with a sentence. */
static void init_must_fail_without_a_verbs_device(struct cfx_test_rank *ctx)
{
    cfxComm_t comm = NULL;
    cfx_test_step(ctx, "init with CFX_NET_PLUGIN=builtin:ib and no verbs device");
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    RANK_ASSERT(ctx, res == cfxSystemError, "init returned %s", cfxGetErrorString(res));
    const char *why = cfxGetLastError(NULL);
    RANK_ASSERT(ctx, strstr(why, "\"IB\"") != NULL || strstr(why, "builtin:ib") != NULL,
                "the sentence does not name the verbs net: %s", why);
}

Test(net_builtin_ib, without_a_verbs_device_init_fails_with_a_sentence, .timeout = 60)
{
    init_fail_run(BUILTIN_IB, NULL, NULL, init_must_fail_without_a_verbs_device, NULL);
}
