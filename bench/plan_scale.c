/*
 * cfx_plan_scale: how planning grows with the number of ranks.
 *
 *   cfx_plan_scale [--topo-file FILE] [--max-nodes N] [--reps R]
 *
 * For 1, 16, 128, ..., N hosts (default 2,048) of the given topology
 * (default tests/topo/dgx-h100.xml: 8 GPUs per host, so 16,384 ranks at the
 * end), prints the best of R builds (default 3) of cfx_plan_build, the bytes
 * the plan holds and their share per rank, the growth of the process's
 * resident memory over the build, and the cost of one cfx_plan_choose call.
 * The bound: 16,384 ranks under 1 s, memory proportional to ranks.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/plan/plan.h"
#include "src/util/error.h"

#ifndef CFX_SOURCE_DIR
#define CFX_SOURCE_DIR "."
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static size_t plan_bytes(const struct cfx_plan *plan)
{
    size_t cells = (size_t)plan->n_channels * (size_t)plan->n_ranks;
    size_t bytes = sizeof(*plan);
    bytes += cells * (2 * sizeof(int) + 1); /* rings, ring_pos, hops */
    bytes += (size_t)plan->n_channels * (size_t)plan->n_nodes * sizeof(int); /* ring_nets */
    bytes += (size_t)plan->n_channels * sizeof(double);
    bytes += (size_t)plan->n_nodes * sizeof(int);
    bytes += 2 * (size_t)plan->n_ranks * (sizeof(int) + sizeof(int[CFX_PLAN_TREE_MAX_CHILDREN]));
    return bytes;
}

int main(int argc, char **argv)
{
    const char *file = CFX_SOURCE_DIR "/tests/topo/dgx-h100.xml";
    int max_nodes = 2048, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--topo-file") == 0 && i + 1 < argc)
            file = argv[++i];
        else if (strcmp(argv[i], "--max-nodes") == 0 && i + 1 < argc)
            max_nodes = atoi(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--topo-file FILE] [--max-nodes N] [--reps R]\n", argv[0]);
            return 2;
        }
    }
    if (max_nodes < 1 || reps < 1)
        return 2;
    struct cfx_topo_system *sys = NULL;
    if (cfx_topo_load_xml(file, &sys) != cfxSuccess) {
        fprintf(stderr, "%s\n", cfx_error_thread_last());
        return 1;
    }
    int rpn = sys->count[CFX_TOPO_GPU] ? sys->count[CFX_TOPO_GPU] : 2 * sys->count[CFX_TOPO_CPU];
    printf("# %s, %d ranks per host; best of %d builds\n", file, rpn, reps);
    printf("# %6s %7s %9s %8s %12s %10s %10s %10s\n", "hosts", "ranks", "build_ms", "channels",
           "plan_bytes", "bytes/rank", "rss_kib", "choose_ns");
    int status = 0;
    for (int nodes = 1;;
         nodes = nodes * 8 > max_nodes && nodes < max_nodes ? max_nodes : nodes * 8) {
        struct cfx_plan_input in = {
            .n_ranks = nodes * rpn, .n_nodes = nodes, .system = sys, .ranks_per_node = rpn};
        double best = 1e30;
        long rss_growth = 0;
        struct cfx_plan *plan = NULL;
        for (int r = 0; r < reps; r++) {
            long rss_before = rss_kib();
            double t0 = now_s();
            if (cfx_plan_build(&in, &plan) != cfxSuccess) {
                fprintf(stderr, "%s\n", cfx_error_thread_last());
                cfx_topo_free(sys);
                return 1;
            }
            double t = now_s() - t0;
            if (t < best)
                best = t;
            if (r == 0)
                rss_growth = rss_kib() - rss_before;
            if (r + 1 < reps)
                cfx_plan_free(plan);
        }
        struct cfx_plan_choice ch;
        const int calls = 100000;
        double t0 = now_s();
        for (int i = 0; i < calls; i++)
            cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, (size_t)64 << (i % 24), &ch);
        double choose_ns = (now_s() - t0) / calls * 1e9;
        size_t bytes = plan_bytes(plan);
        printf("  %6d %7d %9.2f %8d %12zu %10.1f %10ld %10.0f\n", nodes, in.n_ranks, best * 1e3,
               plan->n_channels, bytes, (double)bytes / in.n_ranks, rss_growth, choose_ns);
        if (in.n_ranks >= 16384 && best >= 1.0)
            status = 1;
        cfx_plan_free(plan);
        if (nodes >= max_nodes)
            break;
    }
    cfx_topo_free(sys);
    return status;
}
