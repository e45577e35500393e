/*
 * Building a plan: where each rank runs, one ring search per kind of host,
 * the rings and trees over all ranks, and the cost model. See plan.h.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/plan/internal.h"
#include "src/util/check.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"

CFX_PARAM_INT(max_nchannels, "MAX_NCHANNELS", CFX_PLAN_MAX_CHANNELS, 1, CFX_PLAN_MAX_CHANNELS,
              "Most rings (channels) the planner builds (1..32)");

int cfx_plan_max_channels(void)
{
    return (int)param_max_nchannels();
}

struct builder {
    const struct cfx_plan_input *in;
    struct cfx_plan *plan;
    int *unit;         /* [n_ranks]: topology node each rank runs on. */
    int *node_start;   /* [n_nodes + 1]: CSR of ranks per host, in rank order. */
    int *node_ranks;   /* [n_ranks] */
    int *node_pattern; /* [n_nodes] */
    int n_patterns;
    struct plan_pattern *patterns; /* [n_nodes] at most. */
    uint64_t *pattern_hash;
};

static const struct cfx_topo_system *system_of(const struct cfx_plan_input *in, int node)
{
    return in->systems ? in->systems[node] : in->system;
}

int cfx_plan_default_cpu(const struct cfx_topo_system *sys, int local_rank, int local_nranks)
{
    int n_cpus = sys->count[CFX_TOPO_CPU] > 0 ? sys->count[CFX_TOPO_CPU] : 1;
    if (local_nranks <= 0)
        return 0;
    return (int)((long long)local_rank * n_cpus / local_nranks);
}

/* Where every rank runs, as topology nodes. */
static cfxResult_t resolve_units(struct builder *b)
{
    const struct cfx_plan_input *in = b->in;
    int n = in->n_ranks;
    int host_ranks = -1;
    int *local_index = calloc((size_t)n, sizeof(int));
    int *local_count = calloc((size_t)in->n_nodes, sizeof(int));
    cfxResult_t res = cfxSuccess;
    if (local_index == NULL || local_count == NULL) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for %d ranks", n);
        goto out;
    }
    for (int r = 0; r < n; r++) {
        int node = in->locs ? in->locs[r].node : r / in->ranks_per_node;
        if (node < 0 || node >= in->n_nodes) {
            res = cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH,
                                "rank %d is on host %d, outside 0..%d", r, node, in->n_nodes - 1);
            goto out;
        }
        local_index[r] = local_count[node]++;
    }
    for (int node = 0; node < in->n_nodes; node++)
        if (local_count[node] == 0) {
            res = cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH, "host %d has no rank", node);
            goto out;
        }
    for (int r = 0; r < n; r++) {
        int node = in->locs ? in->locs[r].node : r / in->ranks_per_node;
        const struct cfx_topo_system *sys = system_of(in, node);
        int gpu, cpu;
        if (in->locs) {
            gpu = in->locs[r].gpu;
            cpu = in->locs[r].cpu;
        } else {
            gpu = sys->count[CFX_TOPO_GPU] > 0 ? local_index[r] : -1;
            cpu = -1;
        }
        int unit;
        if (gpu >= 0) {
            unit = cfx_topo_find_gpu(sys, gpu);
            if (unit < 0) {
                res = cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH,
                                    "rank %d runs on GPU %d, which host %d's topology (%s, %d "
                                    "GPUs) does not have",
                                    r, gpu, node, sys->source, sys->count[CFX_TOPO_GPU]);
                goto out;
            }
        } else {
            if (cpu < 0)
                cpu = cfx_plan_default_cpu(sys, local_index[r], local_count[node]);
            unit = cfx_topo_nth(sys, CFX_TOPO_CPU, cpu);
            if (unit < 0) {
                res = cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH,
                                    "rank %d runs on CPU %d, which host %d's topology (%s) "
                                    "does not have",
                                    r, cpu, node, sys->source);
                goto out;
            }
        }
        int is_host = gpu < 0;
        if (host_ranks >= 0 && host_ranks != is_host) {
            res = cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH,
                                "rank %d is a %s rank and others are not: one plan needs all GPU "
                                "or all host ranks",
                                r, is_host ? "host" : "GPU");
            goto out;
        }
        host_ranks = is_host;
        b->unit[r] = unit;
    }
    b->plan->model.host_ranks = host_ranks;
    /* Ranks per host, in rank order. */
    b->node_start[0] = 0;
    for (int node = 0; node < in->n_nodes; node++)
        b->node_start[node + 1] = b->node_start[node] + local_count[node];
    for (int r = 0; r < n; r++) {
        int node = in->locs ? in->locs[r].node : r / in->ranks_per_node;
        b->node_ranks[b->node_start[node] + local_index[r]] = r;
    }
out:
    free(local_index);
    free(local_count);
    return res;
}

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

/* One pattern per (topology, local placement); searched once each. */
static cfxResult_t find_patterns(struct builder *b, int max_channels)
{
    const struct cfx_plan_input *in = b->in;
    for (int node = 0; node < in->n_nodes; node++) {
        const struct cfx_topo_system *sys = system_of(in, node);
        const int *ranks = &b->node_ranks[b->node_start[node]];
        int m = b->node_start[node + 1] - b->node_start[node];
        uint64_t h = mix((uint64_t)(uintptr_t)sys, (uint64_t)m);
        for (int i = 0; i < m; i++)
            h = mix(h, (uint64_t)b->unit[ranks[i]]);
        int found = -1;
        for (int p = 0; p < b->n_patterns && found < 0; p++) {
            const struct plan_pattern *pat = &b->patterns[p];
            if (b->pattern_hash[p] != h || pat->sys != sys || pat->m != m)
                continue;
            int same = 1;
            for (int i = 0; i < m && same; i++)
                same = pat->units[i] == b->unit[ranks[i]];
            if (same)
                found = p;
        }
        if (found < 0) {
            struct plan_pattern *pat = &b->patterns[b->n_patterns];
            memset(pat, 0, sizeof(*pat));
            pat->sys = sys;
            pat->m = m;
            pat->multi = in->n_nodes > 1;
            pat->units = malloc((size_t)m * sizeof(int));
            if (pat->units == NULL)
                return cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for rings");
            for (int i = 0; i < m; i++)
                pat->units[i] = b->unit[ranks[i]];
            b->pattern_hash[b->n_patterns] = h;
            found = b->n_patterns++;
            CFX_CHECK(cfx_plan_pattern_search(pat, b->plan->model.host_ranks, max_channels));
            b->plan->search_steps += pat->search_steps;
        }
        b->node_pattern[node] = found;
    }
    return cfxSuccess;
}

static int compare_first_rank(const void *x, const void *y, void *arg)
{
    const struct builder *b = arg;
    int a = *(const int *)x, c = *(const int *)y;
    return b->node_ranks[b->node_start[a]] - b->node_ranks[b->node_start[c]];
}

static cfxResult_t make_rings(struct builder *b)
{
    struct cfx_plan *plan = b->plan;
    int n = plan->n_ranks, n_nodes = plan->n_nodes;
    int nch = CFX_PLAN_MAX_CHANNELS;
    for (int p = 0; p < b->n_patterns; p++)
        if (b->patterns[p].n_channels < nch)
            nch = b->patterns[p].n_channels;
    plan->n_channels = nch;
    size_t cells = (size_t)nch * (size_t)n;
    plan->rings = malloc(cells * sizeof(int));
    plan->ring_pos = malloc(cells * sizeof(int));
    plan->ring_hops = malloc(cells);
    plan->ring_nets = malloc((size_t)nch * (size_t)n_nodes * sizeof(int));
    plan->channel_bw = malloc((size_t)nch * sizeof(double));
    if (!plan->rings || !plan->ring_pos || !plan->ring_hops || !plan->ring_nets ||
        !plan->channel_bw)
        return cfx_error_set(cfxSystemError, CFX_LOG_GRAPH,
                             "out of memory for %d rings of %d "
                             "ranks",
                             nch, n);
    for (int c = 0; c < nch; c++) {
        size_t pos = (size_t)c * (size_t)n;
        plan->channel_bw[c] = INFINITY;
        for (int p = 0; p < n_nodes; p++) {
            int node = plan->node_order[p];
            const struct plan_pattern *pat = &b->patterns[b->node_pattern[node]];
            const int *ranks = &b->node_ranks[b->node_start[node]];
            const int *order = &pat->order[(size_t)c * (size_t)pat->m];
            for (int i = 0; i < pat->m; i++, pos++) {
                plan->rings[pos] = ranks[order[i]];
                unsigned char hop = pat->hop_type[(size_t)c * (size_t)pat->m + (size_t)i];
                if (i + 1 == pat->m && n_nodes > 1)
                    hop = CFX_PATH_NET;
                plan->ring_hops[pos] = hop;
            }
            plan->ring_nets[(size_t)c * (size_t)n_nodes + (size_t)node] =
                pat->net[c] >= 0 ? pat->sys->nodes[pat->net[c]].net.dev : -1;
            if (pat->channel_bw[c] < plan->channel_bw[c])
                plan->channel_bw[c] = pat->channel_bw[c];
        }
        for (int i = 0; i < n; i++)
            plan->ring_pos[(size_t)c * (size_t)n + (size_t)plan->rings[(size_t)c * n + i]] = i;
    }
    return cfxSuccess;
}

/* Chains for the trees: on several hosts the ring order reversed, so the
 * head is the rank nearest the channel's NIC; on one host the ring order. */
static cfxResult_t make_trees(struct builder *b)
{
    struct cfx_plan *plan = b->plan;
    int n_nodes = plan->n_nodes;
    cfxResult_t res = cfxSuccess;
    int *node_nranks = malloc((size_t)n_nodes * sizeof(int));
    int **chains[2] = {calloc((size_t)n_nodes, sizeof(int *)),
                       calloc((size_t)n_nodes, sizeof(int *))};
    int *pool = malloc(2 * (size_t)plan->n_ranks * sizeof(int));
    if (!node_nranks || !chains[0] || !chains[1] || !pool) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for trees");
        goto out;
    }
    size_t used = 0;
    for (int t = 0; t < 2; t++) {
        int c = t < plan->n_channels ? t : 0;
        for (int node = 0; node < n_nodes; node++) {
            const struct plan_pattern *pat = &b->patterns[b->node_pattern[node]];
            const int *ranks = &b->node_ranks[b->node_start[node]];
            const int *order = &pat->order[(size_t)c * (size_t)pat->m];
            node_nranks[node] = pat->m;
            chains[t][node] = &pool[used];
            for (int i = 0; i < pat->m; i++)
                pool[used++] = ranks[order[n_nodes > 1 ? pat->m - 1 - i : i]];
        }
    }
    res = cfx_plan_trees_build(plan, node_nranks, chains);
out:
    free(node_nranks);
    free(chains[0]);
    free(chains[1]);
    free(pool);
    return res;
}

static void set_model(struct builder *b)
{
    struct cfx_plan_model *md = &b->plan->model;
    md->n_nodes = b->plan->n_nodes;
    md->n_ranks = b->plan->n_ranks;
    md->ring_bw = INFINITY;
    md->intra_bw = INFINITY;
    md->net_bw = INFINITY;
    md->intra_class = CFX_LINK_LOC;
    md->rdma = 1;
    md->max_local = 0;
    for (int p = 0; p < b->n_patterns; p++) {
        const struct plan_pattern *pat = &b->patterns[p];
        double kept = 0, all = 0;
        for (int c = 0; c < pat->n_channels; c++) {
            all += pat->channel_bw[c];
            if (c < b->plan->n_channels)
                kept += pat->channel_bw[c];
        }
        double scale = all > 0 ? kept / all : 1.0;
        md->ring_bw = fmin(md->ring_bw, kept);
        md->intra_bw = fmin(md->intra_bw, pat->intra_bw * scale);
        md->net_bw = fmin(md->net_bw, pat->net_bw * scale);
        if (pat->intra_class > md->intra_class)
            md->intra_class = pat->intra_class;
        md->rdma = md->rdma && pat->rdma;
        if (pat->m > md->max_local)
            md->max_local = pat->m;
    }
    if (b->plan->n_nodes == 1) {
        md->net_bw = 0;
        md->rdma = 0;
    }
}

static void log_plan(const struct cfx_plan *plan)
{
    char line[512];
    for (int c = 0; c < plan->n_channels; c++) {
        size_t used = 0;
        int shown = plan->n_ranks < 24 ? plan->n_ranks : 24;
        for (int i = 0; i < shown && used < sizeof(line); i++) {
            int w = snprintf(line + used, sizeof(line) - used, "%s%d", i ? " " : "",
                             plan->rings[(size_t)c * plan->n_ranks + i]);
            used += w > 0 ? (size_t)w : 0;
        }
        CFX_INFO(CFX_LOG_GRAPH, "ring %d: %s%s (%.1f GB/s)", c, line,
                 shown < plan->n_ranks ? " ..." : "", plan->channel_bw[c]);
    }
    for (int t = 0; t < 2; t++)
        CFX_INFO(CFX_LOG_GRAPH, "tree %d: root %d, depth %d (%d between hosts)", t,
                 plan->trees[t].root, plan->trees[t].depth, plan->trees[t].net_depth);
    const struct cfx_plan_model *md = &plan->model;
    CFX_INFO(CFX_LOG_TUNING,
             "model: %s ranks, %d ranks on %d hosts, %d channels; ring %.1f GB/s (inside hosts "
             "%.1f, NICs %.1f), slowest class inside hosts %s, hop %.1f us, network %s hop %.1f "
             "us; tree NIC factors %.2f/%.2f, depth %d; direct %s",
             md->host_ranks ? "host" : "GPU", plan->n_ranks, plan->n_nodes, plan->n_channels,
             md->ring_bw, md->intra_bw, md->net_bw, cfx_topo_link_type_name(md->intra_class),
             md->intra_hop_us[CFX_PROTO_SIMPLE], md->rdma ? "RDMA" : "socket",
             md->net_hop_us[CFX_PROTO_SIMPLE], md->tree_net_factor[0], md->tree_net_factor[1],
             md->tree_net_depth,
             md->host_ranks && plan->n_ranks <= CFX_DIRECT_MAX_RANKS ? "allreduce (one hop)"
             : md->host_ranks                                        ? "off (too many ranks)"
                                                                     : "off (GPU ranks)");
}

static cfxResult_t check_input(const struct cfx_plan_input *in)
{
    if (in == NULL || in->n_ranks < 1 || in->n_nodes < 1)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH,
                             "a plan needs at least one rank and one host");
    if (in->systems == NULL && in->system == NULL)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH, "a plan needs host topologies");
    for (int node = 0; in->systems && node < in->n_nodes; node++)
        if (in->systems[node] == NULL)
            return cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH, "host %d has no topology",
                                 node);
    if (in->locs == NULL &&
        (in->ranks_per_node < 1 || (long long)in->ranks_per_node * in->n_nodes != in->n_ranks))
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH,
                             "%d ranks do not fill %d hosts of %d ranks", in->n_ranks, in->n_nodes,
                             in->ranks_per_node);
    return cfxSuccess;
}

cfxResult_t cfx_plan_build(const struct cfx_plan_input *in, struct cfx_plan **plan_p)
{
    CFX_CHECK(check_input(in));
    cfxResult_t res = cfxSuccess;
    struct builder b = {.in = in};
    struct cfx_plan *plan = calloc(1, sizeof(*plan));
    if (plan == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for a plan");
    b.plan = plan;
    plan->n_ranks = in->n_ranks;
    plan->n_nodes = in->n_nodes;
    b.unit = malloc((size_t)in->n_ranks * sizeof(int));
    b.node_start = malloc(((size_t)in->n_nodes + 1) * sizeof(int));
    b.node_ranks = malloc((size_t)in->n_ranks * sizeof(int));
    b.node_pattern = malloc((size_t)in->n_nodes * sizeof(int));
    b.patterns = calloc((size_t)in->n_nodes, sizeof(*b.patterns));
    b.pattern_hash = calloc((size_t)in->n_nodes, sizeof(uint64_t));
    plan->node_order = malloc((size_t)in->n_nodes * sizeof(int));
    if (!b.unit || !b.node_start || !b.node_ranks || !b.node_pattern || !b.patterns ||
        !b.pattern_hash || !plan->node_order) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for a plan of %d ranks",
                            in->n_ranks);
        goto out;
    }
    CFX_CHECK_GOTO(resolve_units(&b), res, out);
    int64_t max_channels = param_max_nchannels();
    if (max_channels < 1 || max_channels > CFX_PLAN_MAX_CHANNELS)
        max_channels = CFX_PLAN_MAX_CHANNELS;
    CFX_CHECK_GOTO(find_patterns(&b, (int)max_channels), res, out);
    for (int node = 0; node < in->n_nodes; node++)
        plan->node_order[node] = node;
    qsort_r(plan->node_order, (size_t)in->n_nodes, sizeof(int), compare_first_rank, &b);
    CFX_CHECK_GOTO(make_rings(&b), res, out);
    set_model(&b);
    CFX_CHECK_GOTO(make_trees(&b), res, out);
    cfx_plan_model_init(plan);
    cfx_plan_tuning_init(plan);
    log_plan(plan);
    *plan_p = plan;
    plan = NULL;
out:
    for (int p = 0; p < b.n_patterns; p++)
        cfx_plan_pattern_free(&b.patterns[p]);
    free(b.unit);
    free(b.node_start);
    free(b.node_ranks);
    free(b.node_pattern);
    free(b.patterns);
    free(b.pattern_hash);
    cfx_plan_free(plan);
    return res;
}

void cfx_plan_free(struct cfx_plan *plan)
{
    if (plan == NULL)
        return;
    free(plan->rings);
    free(plan->ring_pos);
    free(plan->ring_hops);
    free(plan->ring_nets);
    free(plan->channel_bw);
    for (int t = 0; t < 2; t++) {
        free(plan->trees[t].parent);
        free(plan->trees[t].children);
    }
    free(plan->node_order);
    free(plan);
}
