/*
 * The planner: on every fixture, for 1 to 64 hosts, the rings visit every
 * rank once, stay on NVLink inside NVSwitch hosts, cross between hosts once
 * per host boundary and leave each host from the rank nearest their NIC; the
 * double binary trees are valid, complementary and shallow; the choice moves
 * from latency-bound trees to rings as sizes grow, and for host ranks from
 * the direct allreduce to the ring; the model meets public NCCL figures
 * within 25%; CFX_ALGO/CFX_PROTO and the TUNING log work.
 */
#include <criterion/criterion.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/plan/plan.h"
#include "src/util/error.h"
#include "tests/harness.h"

static const char *fixture(const char *name)
{
    static char path[1024];
    char src[1024];
    snprintf(src, sizeof(src), "%s", __FILE__);
    snprintf(path, sizeof(path), "%s/topo/%s", dirname(src), name);
    return path;
}

static struct cfx_topo_system *load(const char *name)
{
    struct cfx_topo_system *sys = NULL;
    cr_assert_eq(cfx_topo_load_xml(fixture(name), &sys), cfxSuccess, "%s: %s", name,
                 cfx_error_thread_last());
    return sys;
}

static struct cfx_plan *plan_for(const struct cfx_topo_system *sys, int nodes, int rpn)
{
    struct cfx_plan_input in = {
        .n_ranks = nodes * rpn, .n_nodes = nodes, .system = sys, .ranks_per_node = rpn};
    struct cfx_plan *plan = NULL;
    cr_assert_eq(cfx_plan_build(&in, &plan), cfxSuccess, "%s x%d: %s", sys->source, nodes,
                 cfx_error_thread_last());
    return plan;
}

/* The topology node a rank runs on under the block layout. */
static int unit_of(const struct cfx_topo_system *sys, int rank, int rpn)
{
    int local = rank % rpn;
    if (sys->count[CFX_TOPO_GPU])
        return cfx_topo_find_gpu(sys, local);
    return cfx_topo_nth(sys, CFX_TOPO_CPU, cfx_plan_default_cpu(sys, local, rpn));
}

static int net_node(const struct cfx_topo_system *sys, int dev)
{
    for (int n = 0; n < sys->n_nodes; n++)
        if (sys->nodes[n].type == CFX_TOPO_NET && sys->nodes[n].net.dev == dev)
            return n;
    return -1;
}

struct fixture_case {
    const char *file;
    int rpn; /* 0: one per GPU. */
};

static const struct fixture_case cases[] = {
    {"dgx-a100.xml", 0},    {"dgx-h100.xml", 0},       {"pcie-4gpu.xml", 0},
    {"cpu-2socket.xml", 4}, {"vm-h100-socket.xml", 0}, {"partial-4gpu.xml", 0},
};
#define N_CASES (sizeof(cases) / sizeof(cases[0]))

static void check_rings(const struct cfx_plan *plan, const struct cfx_topo_system *sys, int nodes,
                        int rpn, const char *what)
{
    int n = plan->n_ranks;
    cr_assert_geq(plan->n_channels, 1, "%s", what);
    char *seen = calloc((size_t)n, 1);
    for (int c = 0; c < plan->n_channels; c++) {
        const int *ring = &plan->rings[(size_t)c * n];
        memset(seen, 0, (size_t)n);
        int crossings = 0;
        for (int i = 0; i < n; i++) {
            int a = ring[i], b = ring[(i + 1) % n];
            cr_assert(a >= 0 && a < n && !seen[a], "%s ring %d: rank %d twice or bad", what, c, a);
            seen[a] = 1;
            cr_assert_eq(plan->ring_pos[(size_t)c * n + a], i, "%s ring %d position", what, c);
            cr_assert_eq(cfx_plan_ring_next(plan, c, a), b, "%s ring %d next", what, c);
            cr_assert_eq(cfx_plan_ring_prev(plan, c, b), a, "%s ring %d prev", what, c);
            int across = a / rpn != b / rpn;
            crossings += across;
            enum cfx_topo_path_type hop = plan->ring_hops[(size_t)c * n + i];
            cr_assert_eq(hop == CFX_PATH_NET, across, "%s ring %d hop %d->%d is %s", what, c, a, b,
                         cfx_topo_path_type_name(hop));
            if (!across && sys->count[CFX_TOPO_NVS] && n > 1)
                cr_assert_eq(hop, CFX_PATH_NVL,
                             "%s ring %d hop %d->%d inside an NVSwitch host "
                             "is %s",
                             what, c, a, b, cfx_topo_path_type_name(hop));
            if (across) {
                /* Leaves from the rank nearest the NIC, enters through the same NIC index. */
                int host = a / rpn, next_host = b / rpn;
                int dev = plan->ring_nets[(size_t)c * nodes + host];
                cr_assert_eq(plan->ring_nets[(size_t)c * nodes + next_host], dev,
                             "%s ring %d: NIC index changes between hosts", what, c);
                int net = net_node(sys, dev);
                cr_assert_neq(net, -1, "%s ring %d: NET %d", what, c, dev);
                enum cfx_topo_path_type best = CFX_PATH_DIS;
                for (int r = host * rpn; r < (host + 1) * rpn; r++) {
                    enum cfx_topo_path_type t = cfx_topo_path(sys, unit_of(sys, r, rpn), net)->type;
                    if (t < best)
                        best = t;
                }
                cr_assert_eq(cfx_topo_path(sys, unit_of(sys, a, rpn), net)->type, best,
                             "%s ring %d leaves host %d from rank %d, not nearest NET %d", what, c,
                             host, a, dev);
            }
        }
        cr_assert_eq(crossings, nodes > 1 ? nodes : 0, "%s ring %d crosses %d times", what, c,
                     crossings);
    }
    free(seen);
}

static void check_trees(const struct cfx_plan *plan, int nodes, int rpn, const char *what)
{
    int n = plan->n_ranks;
    int log2_nodes = 0;
    while ((2 << log2_nodes) <= nodes)
        log2_nodes++;
    char *interior[2] = {calloc((size_t)nodes, 1), calloc((size_t)nodes, 1)};
    for (int t = 0; t < 2; t++) {
        const struct cfx_plan_tree *tree = &plan->trees[t];
        int roots = 0, max_depth = 0;
        for (int r = 0; r < n; r++) {
            int p = tree->parent[r];
            if (p < 0) {
                roots++;
                cr_assert_eq(tree->root, r, "%s tree %d root", what, t);
            } else {
                int listed = 0;
                for (int k = 0; k < CFX_PLAN_TREE_MAX_CHILDREN; k++)
                    listed += tree->children[p][k] == r;
                cr_assert_eq(listed, 1, "%s tree %d: %d not a child of its parent %d", what, t, r,
                             p);
                if (p / rpn != r / rpn)
                    interior[t][p / rpn] = 1;
            }
            for (int k = 0; k < CFX_PLAN_TREE_MAX_CHILDREN; k++) {
                int child = tree->children[r][k];
                if (child >= 0)
                    cr_assert_eq(tree->parent[child], r, "%s tree %d child %d", what, t, child);
            }
            int depth = 0;
            for (int up = r; tree->parent[up] >= 0; up = tree->parent[up])
                cr_assert_leq(++depth, n, "%s tree %d: a cycle above rank %d", what, t, r);
            if (depth > max_depth)
                max_depth = depth;
        }
        cr_assert_eq(roots, 1, "%s tree %d has %d roots", what, t, roots);
        cr_assert_eq(max_depth, tree->depth, "%s tree %d depth", what, t);
        cr_assert_leq(tree->depth, log2_nodes + rpn + 1, "%s tree %d depth %d", what, t,
                      tree->depth);
    }
    for (int h = 0; h < nodes; h++)
        cr_assert(!(interior[0][h] && interior[1][h]), "%s: host %d interior in both trees", what,
                  h);
    free(interior[0]);
    free(interior[1]);
}

static void check_choices(struct cfx_plan *plan, const char *what)
{
    const enum cfx_coll_kind colls[] = {CFX_COLL_ALLREDUCE, CFX_COLL_BROADCAST, CFX_COLL_REDUCE,
                                        CFX_COLL_ALLGATHER, CFX_COLL_REDUCESCATTER};
    for (size_t k = 0; k < sizeof(colls) / sizeof(colls[0]); k++)
        for (size_t bytes = 8; bytes <= ((size_t)8 << 30); bytes *= 4) {
            struct cfx_plan_choice ch;
            cr_assert_eq(cfx_plan_choose(plan, colls[k], bytes, &ch), cfxSuccess);
            /* The choice is the model's fastest enabled candidate. */
            for (int a = 0; a < CFX_ALGO_COUNT; a++)
                for (int p = 0; p < CFX_PROTO_COUNT; p++)
                    if (plan->model.enabled[colls[k]][a][p])
                        cr_assert_leq(ch.predicted_us,
                                      cfx_plan_predict_us(plan, colls[k], a, p, bytes),
                                      "%s %s %zu B", what, cfx_coll_name(colls[k]), bytes);
            cr_assert(isfinite(ch.predicted_us));
        }
}

Test(plan, every_fixture_plans_valid_rings_and_trees_for_1_to_64_hosts)
{
    for (size_t f = 0; f < N_CASES; f++) {
        struct cfx_topo_system *sys = load(cases[f].file);
        int rpn = cases[f].rpn ? cases[f].rpn : sys->count[CFX_TOPO_GPU];
        for (int nodes = 1; nodes <= 64; nodes++) {
            char what[96];
            snprintf(what, sizeof(what), "%s x%d", cases[f].file, nodes);
            struct cfx_plan *plan = plan_for(sys, nodes, rpn);
            check_rings(plan, sys, nodes, rpn, what);
            check_trees(plan, nodes, rpn, what);
            if (nodes == 1 || nodes == 2 || nodes == 5 || nodes == 64)
                check_choices(plan, what);
            cfx_plan_free(plan);
        }
        cfx_topo_free(sys);
    }
}

Test(plan, choices_move_from_latency_bound_trees_to_rings_as_sizes_grow)
{
    struct cfx_topo_system *sys = load("dgx-h100.xml");
    for (int nodes = 3; nodes <= 64; nodes *= 2) {
        struct cfx_plan *plan = plan_for(sys, nodes, 8);
        struct cfx_plan_choice small, large;
        cr_assert_eq(cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, 8, &small), cfxSuccess);
        cr_assert_eq(cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, (size_t)8 << 30, &large),
                     cfxSuccess);
        cr_expect_eq(small.algo, CFX_ALGO_TREE, "%d hosts, 8 B: %s", nodes,
                     cfx_plan_algo_name(small.algo));
        cr_expect_eq(small.proto, CFX_PROTO_LL, "%d hosts, 8 B", nodes);
        cr_expect_eq(large.algo, CFX_ALGO_RING, "%d hosts, 8 GiB: %s", nodes,
                     cfx_plan_algo_name(large.algo));
        cr_expect_eq(large.proto, CFX_PROTO_SIMPLE, "%d hosts, 8 GiB", nodes);
        /* Once the ring wins it keeps winning. */
        int ring_from = -1;
        for (int b = 3; b <= 33; b++) {
            struct cfx_plan_choice ch;
            cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, (size_t)1 << b, &ch);
            if (ch.algo == CFX_ALGO_RING && ring_from < 0)
                ring_from = b;
            if (ring_from >= 0)
                cr_expect_eq(ch.algo, CFX_ALGO_RING, "%d hosts, 2^%d B after ring at 2^%d", nodes,
                             b, ring_from);
        }
        cfx_plan_free(plan);
    }
    cfx_topo_free(sys);
}

/* ------------------------------------------------------------ host data path */

Test(plan, host_ranks_on_one_host_ring_in_rank_order)
{
    struct cfx_topo_system *fixture_sys = load("cpu-2socket.xml");
    struct cfx_topo_system *detected = NULL;
    cfx_test_setenv("CFX_TOPO_FILE", NULL);
    cr_assert_eq(cfx_topo_detect(&detected), cfxSuccess, "%s", cfx_error_thread_last());
    const struct cfx_topo_system *systems[2] = {fixture_sys, detected};
    for (int s = 0; s < 2; s++) {
        if (systems[s]->count[CFX_TOPO_GPU])
            continue; /* A GPU host plans GPU ranks by default. */
        for (int n = 1; n <= 16; n++) {
            struct cfx_plan *plan = plan_for(systems[s], 1, n);
            cr_expect(plan->model.host_ranks);
            for (int c = 0; c < plan->n_channels; c++)
                for (int i = 0; i < n; i++)
                    cr_assert_eq(plan->rings[(size_t)c * n + i], i, "%s, %d ranks, ring %d",
                                 systems[s]->source, n, c);
            struct cfx_plan_choice ch;
            cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, 1 << 20, &ch);
            cr_expect_eq(ch.proto, CFX_PROTO_SIMPLE, "host ranks have only Simple");
            cr_expect_eq(ch.algo, CFX_ALGO_RING, "one host: the ring");
            cfx_plan_free(plan);
        }
    }
    cfx_topo_free(fixture_sys);
    cfx_topo_free(detected);
}

Test(plan, nvswitch_host_rings_in_gpu_order)
{
    struct cfx_topo_system *sys = load("dgx-a100.xml");
    struct cfx_plan *plan = plan_for(sys, 1, 8);
    for (int c = 0; c < plan->n_channels; c++)
        for (int i = 0; i < 8; i++)
            cr_expect_eq(plan->rings[(size_t)c * 8 + i], i);
    cfx_plan_free(plan);
    cfx_topo_free(sys);
}

/* ------------------------------------------------------------ input */

static int plans_equal(const struct cfx_plan *a, const struct cfx_plan *b)
{
    size_t cells = (size_t)a->n_channels * (size_t)a->n_ranks;
    if (a->n_channels != b->n_channels || a->n_ranks != b->n_ranks)
        return 0;
    if (memcmp(a->rings, b->rings, cells * sizeof(int)) ||
        memcmp(a->ring_nets, b->ring_nets, (size_t)a->n_channels * a->n_nodes * sizeof(int)))
        return 0;
    for (int t = 0; t < 2; t++)
        if (memcmp(a->trees[t].parent, b->trees[t].parent, (size_t)a->n_ranks * sizeof(int)))
            return 0;
    return a->model.ring_bw == b->model.ring_bw;
}

Test(plan, the_same_input_gives_the_same_plan_from_copies_or_one_system)
{
    enum { nodes = 5 };
    struct cfx_topo_system *copies[nodes];
    for (int i = 0; i < nodes; i++)
        copies[i] = load("dgx-h100.xml");
    struct cfx_plan_input in = {.n_ranks = nodes * 8,
                                .n_nodes = nodes,
                                .systems = (const struct cfx_topo_system *const *)copies,
                                .ranks_per_node = 8};
    struct cfx_plan *from_copies = NULL;
    cr_assert_eq(cfx_plan_build(&in, &from_copies), cfxSuccess, "%s", cfx_error_thread_last());
    struct cfx_plan *replicated = plan_for(copies[0], nodes, 8);
    struct cfx_plan *again = plan_for(copies[0], nodes, 8);
    cr_expect(plans_equal(replicated, again), "two builds differ");
    cr_expect(plans_equal(replicated, from_copies), "copies plan differently from one system");
    cfx_plan_free(from_copies);
    cfx_plan_free(replicated);
    cfx_plan_free(again);
    for (int i = 0; i < nodes; i++)
        cfx_topo_free(copies[i]);
}

Test(plan, ranks_spread_round_robin_over_hosts_still_ring_host_by_host)
{
    struct cfx_topo_system *sys = load("dgx-h100.xml");
    const int nodes = 4, n = 32;
    struct cfx_plan_rank_loc locs[32];
    for (int r = 0; r < n; r++)
        locs[r] = (struct cfx_plan_rank_loc){.node = r % nodes, .gpu = r / nodes, .cpu = -1};
    struct cfx_plan_input in = {.n_ranks = n, .n_nodes = nodes, .system = sys, .locs = locs};
    struct cfx_plan *plan = NULL;
    cr_assert_eq(cfx_plan_build(&in, &plan), cfxSuccess, "%s", cfx_error_thread_last());
    for (int c = 0; c < plan->n_channels; c++) {
        int crossings = 0;
        for (int i = 0; i < n; i++) {
            int a = plan->rings[(size_t)c * n + i], b = plan->rings[(size_t)c * n + (i + 1) % n];
            crossings += locs[a].node != locs[b].node;
        }
        cr_expect_eq(crossings, nodes, "ring %d crosses %d times", c, crossings);
    }
    cr_expect_eq(plan->node_order[0], 0);
    cfx_plan_free(plan);
    cfx_topo_free(sys);
}

Test(plan, inconsistent_input_is_refused_with_a_sentence)
{
    struct cfx_topo_system *sys = load("pcie-4gpu.xml");
    struct cfx_plan *plan = NULL;
    struct cfx_plan_rank_loc locs[2] = {{.node = 0, .gpu = 0}, {.node = 0, .gpu = 9}};
    struct cfx_plan_input in = {.n_ranks = 2, .n_nodes = 1, .system = sys, .locs = locs};
    cr_expect_eq(cfx_plan_build(&in, &plan), cfxInvalidArgument);
    cr_expect(strstr(cfx_error_thread_last(), "GPU 9") != NULL, "%s", cfx_error_thread_last());
    locs[1] = (struct cfx_plan_rank_loc){.node = 0, .gpu = -1, .cpu = 0};
    cr_expect_eq(cfx_plan_build(&in, &plan), cfxInvalidArgument);
    cr_expect(strstr(cfx_error_thread_last(), "all GPU or all host") != NULL, "%s",
              cfx_error_thread_last());
    in = (struct cfx_plan_input){.n_ranks = 4, .n_nodes = 2, .system = sys, .ranks_per_node = 3};
    cr_expect_eq(cfx_plan_build(&in, &plan), cfxInvalidArgument);
    locs[0] = (struct cfx_plan_rank_loc){.node = 0, .gpu = 0};
    locs[1] = (struct cfx_plan_rank_loc){.node = 0, .gpu = 1};
    in = (struct cfx_plan_input){.n_ranks = 2, .n_nodes = 2, .system = sys, .locs = locs};
    cr_expect_eq(cfx_plan_build(&in, &plan), cfxInvalidArgument);
    cr_expect(strstr(cfx_error_thread_last(), "host 1 has no rank") != NULL, "%s",
              cfx_error_thread_last());
    cr_expect_null(plan);
    struct cfx_plan_choice ch;
    plan = plan_for(sys, 1, 4);
    cr_expect_eq(cfx_plan_choose(plan, CFX_COLL_SEND, 8, &ch), cfxInvalidArgument);
    cfx_plan_free(plan);
    cfx_topo_free(sys);
}

/* ------------------------------------------------------------ model */

static double busbw_at(struct cfx_plan *plan, size_t bytes)
{
    struct cfx_plan_choice ch;
    cr_assert_eq(cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, bytes, &ch), cfxSuccess);
    return ch.busbw_gbs;
}

/* Public NCCL figures (docs/tuning.md names the sources). */
Test(plan, model_meets_public_nccl_figures_within_25_percent)
{
    struct cfx_topo_system *a100 = load("dgx-a100.xml");
    struct cfx_topo_system *h100 = load("dgx-h100.xml");
    struct cfx_plan *plan = plan_for(a100, 1, 8);
    for (size_t bytes = (size_t)1 << 30; bytes <= (size_t)8 << 30; bytes *= 8) {
        double bw = busbw_at(plan, bytes);
        cr_expect(fabs(bw / 230.0 - 1) <= 0.25, "8xA100 allreduce %zu B: %.1f GB/s vs 230", bytes,
                  bw);
    }
    cfx_plan_free(plan);
    plan = plan_for(h100, 1, 8);
    for (size_t bytes = (size_t)1 << 30; bytes <= (size_t)8 << 30; bytes *= 8) {
        double bw = busbw_at(plan, bytes);
        cr_expect(fabs(bw / 370.0 - 1) <= 0.25, "8xH100 allreduce %zu B: %.1f GB/s vs 370", bytes,
                  bw);
    }
    cfx_plan_free(plan);
    /* One 400 Gb/s NIC per GPU across hosts: 46-49 GB/s per NIC (ring). */
    cfx_test_setenv("CFX_ALGO", "ring");
    for (int nodes = 2; nodes <= 32; nodes *= 4) {
        plan = plan_for(h100, nodes, 8);
        double per_nic = busbw_at(plan, (size_t)8 << 30) / 8;
        cr_expect(per_nic >= 46 * 0.75 && per_nic <= 49 * 1.25,
                  "%d x 8xH100: %.1f GB/s per NIC vs 46-49", nodes, per_nic);
        cfx_plan_free(plan);
    }
    /* 8xA100 hosts with eight 200 Gb/s HDR NICs: 192 GB/s ring busbw. */
    for (int nodes = 2; nodes <= 32; nodes *= 4) {
        plan = plan_for(a100, nodes, 8);
        double bw = busbw_at(plan, (size_t)8 << 30);
        cr_expect(fabs(bw / 192.0 - 1) <= 0.25, "%d x 8xA100: %.1f GB/s vs 192", nodes, bw);
        cfx_plan_free(plan);
    }
    cfx_topo_free(a100);
    cfx_topo_free(h100);
}

/* The host data path's own measurement (docs/performance.md: 2 ranks, shm,
 * one NUMA domain): 2.2 us for 8 bytes on the ring, 1.6-2.5 GB/s from 64 KiB
 * up; and the direct/ring crossover measured for docs/tuning.md. */
Test(plan, model_for_host_ranks_meets_the_measured_shm_allreduce)
{
    const char *text = "<system version=\"1\"><cpu numaid=\"0\" arch=\"x86_64\" "
                       "vendor=\"AuthenticAMD\" familyid=\"25\" modelid=\"1\"/></system>\n";
    struct cfx_topo_system *sys = NULL;
    cr_assert_eq(cfx_topo_load_xml_buffer(text, strlen(text), "vm", &sys), cfxSuccess);
    struct cfx_plan *plan = plan_for(sys, 1, 2);
    /* The ring's own 8-byte time (the planner gives 8 bytes to direct). */
    double ring_us =
        cfx_plan_predict_us(plan, CFX_COLL_ALLREDUCE, CFX_ALGO_RING, CFX_PROTO_SIMPLE, 8);
    cr_expect(fabs(ring_us / 2.2 - 1) <= 0.25, "8 B: %.2f us vs 2.2", ring_us);
    /* Direct beats the ring up to 32 KiB and loses from 128 KiB (docs/tuning.md). */
    struct cfx_plan_choice ch;
    cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, (size_t)32 << 10, &ch);
    cr_expect_eq(ch.algo, CFX_ALGO_DIRECT, "32 KiB: %s", cfx_plan_algo_name(ch.algo));
    cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, (size_t)128 << 10, &ch);
    cr_expect_eq(ch.algo, CFX_ALGO_RING, "128 KiB: %s", cfx_plan_algo_name(ch.algo));
    for (size_t bytes = (size_t)64 << 10; bytes <= (size_t)128 << 20; bytes *= 8) {
        double bw = busbw_at(plan, bytes);
        cr_expect(bw >= 1.6 * 0.75 && bw <= 2.5 * 1.25, "%zu B: %.2f GB/s vs 1.6-2.5", bytes, bw);
    }
    cfx_plan_free(plan);
    cfx_topo_free(sys);
}

/* The A800 is an A100 with 8 of its 12 NVLinks: ~160 GB/s inside a host. */
Test(plan, model_meets_the_a800_figure_within_25_percent)
{
    FILE *f = fopen(fixture("dgx-a100.xml"), "r");
    cr_assert_not_null(f);
    static char text[1 << 16];
    size_t used = 0;
    char line[512];
    while (fgets(line, sizeof(line), f))
        if (!strstr(line, "0000:c8:00.0") && !strstr(line, "0000:c9:00.0")) {
            size_t n = strlen(line);
            cr_assert_lt(used + n, sizeof(text));
            memcpy(text + used, line, n);
            used += n;
        }
    fclose(f);
    struct cfx_topo_system *a800 = NULL;
    cr_assert_eq(cfx_topo_load_xml_buffer(text, used, "a800", &a800), cfxSuccess, "%s",
                 cfx_error_thread_last());
    struct cfx_plan *plan = plan_for(a800, 1, 8);
    double bw = busbw_at(plan, (size_t)8 << 30);
    cr_expect(fabs(bw / 160.0 - 1) <= 0.25, "8xA800: %.1f GB/s vs 160", bw);
    cfx_plan_free(plan);
    cfx_topo_free(a800);
}

/* ------------------------------------------------------------ overrides */

static void expect_algo(struct cfx_plan *plan, enum cfx_coll_kind coll, size_t bytes,
                        enum cfx_plan_algo algo, const char *setting)
{
    struct cfx_plan_choice ch;
    cr_assert_eq(cfx_plan_choose(plan, coll, bytes, &ch), cfxSuccess);
    cr_expect_eq(ch.algo, algo, "%s: %s %zu B got %s", setting, cfx_coll_name(coll), bytes,
                 cfx_plan_algo_name(ch.algo));
}

Test(plan, cfx_algo_takes_nccl_syntax)
{
    struct cfx_topo_system *sys = load("dgx-h100.xml");
    const size_t small = 8, large = (size_t)8 << 30;
    struct {
        const char *setting;
        enum cfx_plan_algo allreduce_small, allreduce_large, broadcast_small;
    } rows[] = {
        {"ring", CFX_ALGO_RING, CFX_ALGO_RING, CFX_ALGO_RING},
        {"Tree", CFX_ALGO_TREE, CFX_ALGO_TREE, CFX_ALGO_TREE},
        {"^tree", CFX_ALGO_RING, CFX_ALGO_RING, CFX_ALGO_RING},
        {"allreduce:tree;broadcast:ring", CFX_ALGO_TREE, CFX_ALGO_TREE, CFX_ALGO_RING},
        {"ring,tree;allreduce:^tree", CFX_ALGO_RING, CFX_ALGO_RING, CFX_ALGO_TREE},
        {"ring,nvls", CFX_ALGO_RING, CFX_ALGO_RING, CFX_ALGO_RING},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        cfx_test_setenv("CFX_ALGO", rows[i].setting);
        struct cfx_plan *plan = plan_for(sys, 8, 8);
        expect_algo(plan, CFX_COLL_ALLREDUCE, small, rows[i].allreduce_small, rows[i].setting);
        expect_algo(plan, CFX_COLL_ALLREDUCE, large, rows[i].allreduce_large, rows[i].setting);
        expect_algo(plan, CFX_COLL_BROADCAST, small, rows[i].broadcast_small, rows[i].setting);
        /* Allgather has only the ring, whatever the setting. */
        expect_algo(plan, CFX_COLL_ALLGATHER, large, CFX_ALGO_RING, rows[i].setting);
        cfx_plan_free(plan);
    }
    cfx_topo_free(sys);
}

Test(plan, cfx_proto_takes_nccl_syntax)
{
    struct cfx_topo_system *sys = load("dgx-h100.xml");
    cfx_test_setenv("CFX_PROTO", "Simple");
    struct cfx_plan *plan = plan_for(sys, 4, 8);
    struct cfx_plan_choice ch;
    cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, 8, &ch);
    cr_expect_eq(ch.proto, CFX_PROTO_SIMPLE);
    cfx_plan_free(plan);
    cfx_test_setenv("CFX_PROTO", "^LL;broadcast:LL128");
    plan = plan_for(sys, 4, 8);
    cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, 8, &ch);
    cr_expect_neq(ch.proto, CFX_PROTO_LL);
    cfx_plan_choose(plan, CFX_COLL_BROADCAST, (size_t)1 << 30, &ch);
    cr_expect_eq(ch.proto, CFX_PROTO_LL128);
    cfx_plan_free(plan);
    cfx_topo_free(sys);
    /* LL128 is off by default without NVLink, on when named. */
    sys = load("pcie-4gpu.xml");
    cfx_test_setenv("CFX_PROTO", NULL);
    plan = plan_for(sys, 1, 4);
    cr_expect_not(plan->model.enabled[CFX_COLL_ALLREDUCE][CFX_ALGO_RING][CFX_PROTO_LL128]);
    cfx_plan_free(plan);
    cfx_test_setenv("CFX_PROTO", "LL128");
    plan = plan_for(sys, 1, 4);
    cr_expect(plan->model.enabled[CFX_COLL_ALLREDUCE][CFX_ALGO_RING][CFX_PROTO_LL128]);
    cfx_plan_free(plan);
    cfx_topo_free(sys);
}

/* The direct (one-shot) allreduce: host ranks on one host take it for small
 * messages and the ring for large ones, and the choice never goes back;
 * more than CFX_DIRECT_MAX_RANKS ranks and GPU ranks never take it. */
Test(plan, host_ranks_take_direct_for_small_allreduces_and_the_ring_for_large)
{
    const char *text = "<system version=\"1\"><cpu numaid=\"0\" arch=\"x86_64\" "
                       "vendor=\"AuthenticAMD\" familyid=\"25\" modelid=\"1\"/></system>\n";
    struct cfx_topo_system *sys = NULL;
    cr_assert_eq(cfx_topo_load_xml_buffer(text, strlen(text), "vm", &sys), cfxSuccess);
    for (int n = 2; n <= 16; n++) {
        struct cfx_plan *plan = plan_for(sys, 1, n);
        struct cfx_plan_choice ch;
        int ring_from = -1;
        for (int b = 0; b <= 30; b++) {
            cr_assert_eq(cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, (size_t)1 << b, &ch),
                         cfxSuccess);
            if (n > CFX_DIRECT_MAX_RANKS) {
                cr_expect_neq(ch.algo, CFX_ALGO_DIRECT, "%d ranks, 2^%d B: direct", n, b);
                continue;
            }
            if (b <= 10)
                cr_expect_eq(ch.algo, CFX_ALGO_DIRECT, "%d ranks, 2^%d B: %s", n, b,
                             cfx_plan_algo_name(ch.algo));
            if (b >= 20)
                cr_expect_eq(ch.algo, CFX_ALGO_RING, "%d ranks, 2^%d B: %s", n, b,
                             cfx_plan_algo_name(ch.algo));
            if (ch.algo != CFX_ALGO_DIRECT && ring_from < 0)
                ring_from = b;
            if (ring_from >= 0)
                cr_expect_neq(ch.algo, CFX_ALGO_DIRECT,
                              "%d ranks: direct at 2^%d B after "
                              "%s at 2^%d",
                              n, b, cfx_plan_algo_name(ch.algo), ring_from);
        }
        /* Only allreduce has a direct schedule. */
        cfx_plan_choose(plan, CFX_COLL_BROADCAST, 8, &ch);
        cr_expect_neq(ch.algo, CFX_ALGO_DIRECT, "%d ranks: direct broadcast", n);
        cfx_plan_free(plan);
    }
    cfx_topo_free(sys);
    /* GPU ranks: direct in Simple (the kernel's slots) on one host only.
     * The model prices the ring with LL, which beats it everywhere, so the
     * plan picks direct (and init connects its all-pairs FIFOs) only where
     * CFX_PROTO or CFX_ALGO rule the ring's LL out. */
    struct cfx_topo_system *gpus = load("dgx-a100.xml");
    struct cfx_plan *plan = plan_for(gpus, 1, 8);
    cr_expect(
        !isfinite(cfx_plan_predict_us(plan, CFX_COLL_ALLREDUCE, CFX_ALGO_DIRECT, CFX_PROTO_LL, 8)),
        "GPU ranks have no direct LL");
    cr_expect(isfinite(cfx_plan_predict_us(plan, CFX_COLL_ALLREDUCE, CFX_ALGO_DIRECT,
                                           CFX_PROTO_SIMPLE, 8)),
              "GPU ranks of one host have a direct allreduce in Simple");
    cr_expect(!cfx_plan_may_pick(plan, CFX_COLL_ALLREDUCE, CFX_ALGO_DIRECT),
              "the ring's LL should win at every size by default");
    cfx_plan_free(plan);
    plan = plan_for(gpus, 2, 8);
    cr_expect(!isfinite(cfx_plan_predict_us(plan, CFX_COLL_ALLREDUCE, CFX_ALGO_DIRECT,
                                            CFX_PROTO_SIMPLE, 8)),
              "GPU ranks of several hosts have no direct allreduce");
    cfx_plan_free(plan);
    cfx_test_setenv("CFX_PROTO", "Simple");
    plan = plan_for(gpus, 1, 8);
    cr_expect(cfx_plan_may_pick(plan, CFX_COLL_ALLREDUCE, CFX_ALGO_DIRECT),
              "with CFX_PROTO=Simple the plan never picks direct on 8 GPUs");
    struct cfx_plan_choice ch;
    cr_assert_eq(cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, 8, &ch), cfxSuccess);
    cr_expect_eq(ch.algo, CFX_ALGO_DIRECT, "8 B on 8 GPUs in Simple: %s",
                 cfx_plan_algo_name(ch.algo));
    /* Two-shot between them: two hand-offs where the ring takes 14, and the
     * ring's bytes per rank where the one-shot sends 7 x. */
    cr_assert_eq(cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, (size_t)256 << 10, &ch), cfxSuccess);
    cr_expect_eq(ch.algo, CFX_ALGO_TWOSHOT, "256 KiB on 8 GPUs in Simple: %s",
                 cfx_plan_algo_name(ch.algo));
    cr_assert_eq(cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, (size_t)1 << 30, &ch), cfxSuccess);
    cr_expect_eq(ch.algo, CFX_ALGO_RING, "1 GiB on 8 GPUs in Simple: %s",
                 cfx_plan_algo_name(ch.algo));
    cr_expect(!isfinite(cfx_plan_predict_us(plan, CFX_COLL_BROADCAST, CFX_ALGO_TWOSHOT,
                                            CFX_PROTO_SIMPLE, 8)),
              "two-shot is an allreduce");
    cfx_plan_free(plan);
    cfx_test_setenv("CFX_PROTO", NULL);
    /* Host ranks: no two-shot in the model (not measured against their ring). */
    struct cfx_topo_system *cpus = NULL;
    cr_assert_eq(cfx_topo_load_xml_buffer(text, strlen(text), "vm", &cpus), cfxSuccess);
    struct cfx_plan *host = plan_for(cpus, 1, 4);
    cr_expect(!isfinite(cfx_plan_predict_us(host, CFX_COLL_ALLREDUCE, CFX_ALGO_TWOSHOT,
                                            CFX_PROTO_SIMPLE, 8)),
              "host ranks have a two-shot in the model");
    cr_expect(!cfx_plan_may_pick(host, CFX_COLL_ALLREDUCE, CFX_ALGO_TWOSHOT),
              "host ranks pick two-shot");
    cfx_plan_free(host);
    cfx_topo_free(cpus);
    cfx_topo_free(gpus);
}

Test(plan, cfx_algo_names_direct)
{
    const char *text = "<system version=\"1\"><cpu numaid=\"0\" arch=\"x86_64\" "
                       "vendor=\"AuthenticAMD\" familyid=\"25\" modelid=\"1\"/></system>\n";
    struct cfx_topo_system *sys = NULL;
    cr_assert_eq(cfx_topo_load_xml_buffer(text, strlen(text), "vm", &sys), cfxSuccess);
    const size_t small = 8, large = (size_t)64 << 20;
    struct {
        const char *setting;
        enum cfx_plan_algo allreduce_small, allreduce_large;
    } rows[] = {
        {"direct", CFX_ALGO_DIRECT, CFX_ALGO_DIRECT},
        {"Direct", CFX_ALGO_DIRECT, CFX_ALGO_DIRECT},
        {"allreduce:direct", CFX_ALGO_DIRECT, CFX_ALGO_DIRECT},
        {"^direct", CFX_ALGO_RING, CFX_ALGO_RING},
        {"ring,direct", CFX_ALGO_DIRECT, CFX_ALGO_RING},
        {"ring", CFX_ALGO_RING, CFX_ALGO_RING},
        {"direct;allreduce:^direct", CFX_ALGO_RING, CFX_ALGO_RING},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        cfx_test_setenv("CFX_ALGO", rows[i].setting);
        struct cfx_plan *plan = plan_for(sys, 1, 4);
        expect_algo(plan, CFX_COLL_ALLREDUCE, small, rows[i].allreduce_small, rows[i].setting);
        expect_algo(plan, CFX_COLL_ALLREDUCE, large, rows[i].allreduce_large, rows[i].setting);
        /* Nothing else has a direct schedule: the model's best runs instead. */
        expect_algo(plan, CFX_COLL_BROADCAST, small, CFX_ALGO_RING, rows[i].setting);
        cfx_plan_free(plan);
    }
    cfx_test_setenv("CFX_ALGO", NULL);
    cfx_topo_free(sys);
}

/* ------------------------------------------------------------ TUNING log */

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no log at %s", path);
    static char text[65536];
    size_t got = fread(text, 1, sizeof(text) - 1, f);
    text[got] = '\0';
    fclose(f);
    return text;
}

static int count_of(const char *text, const char *word)
{
    int n = 0;
    for (const char *at = strstr(text, word); at; at = strstr(at + 1, word))
        n++;
    return n;
}

Test(plan, tuning_log_explains_each_size_bucket_once)
{
    char log_path[64];
    snprintf(log_path, sizeof(log_path), "/tmp/cfx-tuning-log-%d", (int)getpid());
    cfx_test_setenv("CFX_DEBUG", "INFO");
    cfx_test_setenv("CFX_DEBUG_SUBSYS", "TUNING");
    cfx_test_setenv("CFX_DEBUG_FILE", log_path);
    cfx_test_setenv("CFX_ALGO", "tree");
    struct cfx_topo_system *sys = load("dgx-h100.xml");
    struct cfx_plan *plan = plan_for(sys, 4, 8);
    struct cfx_plan_choice ch;
    for (int i = 0; i < 100; i++) /* One bucket: one line. */
        cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, 600 + (size_t)i, &ch);
    cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, (size_t)1 << 30, &ch);
    cfx_plan_choose(plan, CFX_COLL_ALLGATHER, 4096, &ch);
    cfx_plan_choose(plan, CFX_COLL_ALLGATHER, 4097, &ch);
    const char *text = read_all(log_path);
    unlink(log_path);
    cr_expect_eq(count_of(text, "TUNING allreduce 600 B (2^9 bucket)"), 1, "log:\n%s", text);
    cr_expect_eq(count_of(text, "TUNING allreduce "), 2, "log:\n%s", text);
    cr_expect(strstr(text, "tree/LL ") != NULL, "log:\n%s", text);
    cr_expect(strstr(text, "latency-bound") != NULL, "log:\n%s", text);
    cr_expect(strstr(text, "bandwidth-bound") != NULL, "log:\n%s", text);
    cr_expect(strstr(text, "ring/Simple") && strstr(text, "disabled"), "log:\n%s", text);
    cr_expect(strstr(text, "others:") != NULL, "log:\n%s", text);
    cr_expect(strstr(text, "model: GPU ranks, 32 ranks on 4 hosts") != NULL, "log:\n%s", text);
    /* Tree cannot run allgather: the ring, said once, and one line per bucket. */
    cr_expect_eq(count_of(text, "leave nothing that can run allgather"), 1, "log:\n%s", text);
    cr_expect_eq(count_of(text, "TUNING allgather"), 1, "log:\n%s", text);
    cfx_plan_free(plan);
    cfx_topo_free(sys);
}

/* ------------------------------------------------------------ scale */

Test(plan, sixteen_thousand_ranks_plan_in_well_under_a_second)
{
    struct cfx_topo_system *sys = load("dgx-h100.xml");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct cfx_plan *plan = plan_for(sys, 2048, 8);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_expect_lt(s, 1.0, "16,384 ranks took %.3f s", s);
    cr_expect_eq(plan->n_ranks, 16384);
    cfx_plan_free(plan);
    cfx_topo_free(sys);
}

/* The ring search skips orders that only swap ranks of the same unit and
 * stops a branch that cannot beat the best order found. A host whose ranks
 * are all alike (one CPU: every hop the same class and bandwidth) then
 * takes one order per channel; a two-socket host a small fraction of the
 * step limit, where it used to run every channel to the limit (at 64 ranks
 * per process that took 0.1 s of CPU per rank at init). */
Test(plan, ring_search_of_a_uniform_host_stops_at_the_first_complete_order)
{
    char path[] = "/tmp/cfx-test-1socket-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    static const char xml[] =
        "<system version=\"1\">\n"
        "  <cpu numaid=\"0\" affinity=\"ffffffff,ffffffff\" arch=\"x86_64\" vendor=\"GenuineIntel\""
        " familyid=\"6\" modelid=\"143\"/>\n"
        "</system>\n";
    cr_assert_eq(write(fd, xml, sizeof(xml) - 1), (ssize_t)(sizeof(xml) - 1));
    close(fd);
    struct cfx_topo_system *sys = NULL;
    cr_assert_eq(cfx_topo_load_xml(path, &sys), cfxSuccess, "%s", cfx_error_thread_last());
    unlink(path);
    struct cfx_plan *plan = plan_for(sys, 1, 64);
    /* One candidate per depth: 64 steps for the order, one more at its end,
     * for each channel count tried. */
    cr_expect_leq(plan->search_steps, 65L * CFX_PLAN_MAX_CHANNELS, "%ld steps", plan->search_steps);
    for (int i = 0; i < 64; i++)
        cr_assert_eq(plan->rings[i], i, "the ring stays in rank order");
    cfx_plan_free(plan);
    cfx_topo_free(sys);
}

Test(plan, ring_search_of_a_two_socket_host_stays_far_below_its_step_limit)
{
    struct cfx_topo_system *sys = load("cpu-2socket.xml");
    for (int nodes = 1; nodes <= 2; nodes++) {
        struct cfx_plan *plan = plan_for(sys, nodes, 64);
        /* The limit is 40,000 steps a channel, searched for each of up to 32. */
        cr_expect_lt(plan->search_steps, 32L * 4000, "%d host(s) x 64 ranks: %ld search steps",
                     nodes, plan->search_steps);
        cfx_plan_free(plan);
    }
    cfx_topo_free(sys);
}
