/*
 * conflux-topo: what Conflux sees and what it would do with it.
 *
 *   conflux-topo                          detect this host, plan for its ranks
 *   conflux-topo --topo-file F            plan from an NCCL topology XML file
 *   conflux-topo --nodes N                N hosts like this one, joined by their NICs
 *   conflux-topo --ranks-per-node R       ranks per host (host ranks on CPU-only hosts;
 *                                         default: one per GPU, else 2 per NUMA domain)
 *   conflux-topo --json                   one JSON object instead of the text report
 *   conflux-topo --dot FILE               Graphviz picture of the topology and rings
 *   conflux-topo --dump-xml FILE          the topology as NCCL XML (detection's result)
 *
 * CFX_ALGO, CFX_PROTO and CFX_DEBUG_SUBSYS=GRAPH,TUNING apply as in the library.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/util/error.h"
#include "topo_tool.h"

static void usage(FILE *out, const char *argv0)
{
    fprintf(out,
            "usage: %s [--topo-file FILE] [--nodes N] [--ranks-per-node R] [--json]\n"
            "          [--dot FILE] [--dump-xml FILE]\n",
            argv0);
}

static int parse_count(const char *text, int *out)
{
    char *end = NULL;
    long value = strtol(text, &end, 10);
    if (end == text || *end || value < 1 || value > 1 << 20)
        return -1;
    *out = (int)value;
    return 0;
}

int main(int argc, char **argv)
{
    const char *topo_file = NULL, *dot_file = NULL, *dump_file = NULL;
    int n_nodes = 1, ranks_per_node = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--json") == 0) {
            json = 1;
        } else if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout, argv[0]);
            return 0;
        } else if (value && strcmp(arg, "--topo-file") == 0) {
            topo_file = value;
            i++;
        } else if (value && strcmp(arg, "--dot") == 0) {
            dot_file = value;
            i++;
        } else if (value && strcmp(arg, "--dump-xml") == 0) {
            dump_file = value;
            i++;
        } else if (value && strcmp(arg, "--nodes") == 0 && parse_count(value, &n_nodes) == 0) {
            i++;
        } else if (value && strcmp(arg, "--ranks-per-node") == 0 &&
                   parse_count(value, &ranks_per_node) == 0) {
            i++;
        } else {
            fprintf(stderr, "%s: bad argument '%s'\n", argv[0], arg);
            usage(stderr, argv[0]);
            return 2;
        }
    }

    struct cfx_topo_system *sys = NULL;
    cfxResult_t res = topo_file ? cfx_topo_load_xml(topo_file, &sys) : cfx_topo_detect(&sys);
    if (res != cfxSuccess) {
        fprintf(stderr, "%s: %s\n", argv[0], cfx_error_thread_last());
        return 1;
    }
    if (dump_file && cfx_topo_dump_xml(sys, dump_file) != cfxSuccess) {
        fprintf(stderr, "%s: %s\n", argv[0], cfx_error_thread_last());
        cfx_topo_free(sys);
        return 1;
    }
    if (ranks_per_node == 0)
        ranks_per_node = sys->count[CFX_TOPO_GPU]
                             ? sys->count[CFX_TOPO_GPU]
                             : 2 * (sys->count[CFX_TOPO_CPU] ? sys->count[CFX_TOPO_CPU] : 1);
    if (sys->count[CFX_TOPO_GPU] && ranks_per_node > sys->count[CFX_TOPO_GPU]) {
        fprintf(stderr, "%s: %d ranks per node, but the host has %d GPUs\n", argv[0],
                ranks_per_node, sys->count[CFX_TOPO_GPU]);
        cfx_topo_free(sys);
        return 2;
    }
    long long n_ranks = (long long)n_nodes * ranks_per_node;
    if (n_ranks > (1 << 24)) {
        fprintf(stderr, "%s: %lld ranks is more than this tool plans\n", argv[0], n_ranks);
        cfx_topo_free(sys);
        return 2;
    }
    struct cfx_plan_input in = {.n_ranks = (int)n_ranks,
                                .n_nodes = n_nodes,
                                .system = sys,
                                .ranks_per_node = ranks_per_node};
    struct cfx_plan *plan = NULL;
    if (cfx_plan_build(&in, &plan) != cfxSuccess) {
        fprintf(stderr, "%s: %s\n", argv[0], cfx_error_thread_last());
        cfx_topo_free(sys);
        return 1;
    }
    struct topo_report rep = {
        .sys = sys, .plan = plan, .n_nodes = n_nodes, .ranks_per_node = ranks_per_node};
    int status = 0;
    if (json)
        topo_report_json(&rep, stdout);
    else
        topo_report_text(&rep, stdout);
    if (dot_file && topo_report_dot(&rep, dot_file) != 0) {
        fprintf(stderr, "%s: cannot write %s\n", argv[0], dot_file);
        status = 1;
    }
    cfx_plan_free(plan);
    cfx_topo_free(sys);
    return status;
}
