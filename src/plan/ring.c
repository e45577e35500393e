/*
 * Ring search for one kind of host (see internal.h).
 *
 * Channels are added one at a time. Each new channel is the order of the
 * host's ranks that gets the most bandwidth given the links the channels
 * before it already use (every directed link's effective capacity is shared
 * equally by the hops crossing it); among equals, the one whose slowest hop
 * class is nearest (NVL before PCI before SYS), with the fewest such hops,
 * then the first in rank order. Channels are added up to the maximum and
 * the plan keeps the fewest whose total is within 1% of the best total.
 *
 * On one host a channel is a cycle starting at local rank 0. Across hosts it
 * is a path: it picks the least used NET, leaves from the rank nearest that
 * NET and enters at the next nearest rank, so the ring leaves and enters the
 * host through the NIC closest to the rank it leaves from, and every host
 * uses the same NIC index for the channel (rail alignment).
 *
 * The depth-first search tries the nearest next rank first and prunes any
 * partial order that can no longer beat the best; it stops after a fixed
 * number of steps (not a time), so every rank finds the same rings.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/plan/internal.h"
#include "src/util/check.h"
#include "src/util/error.h"
#include "src/util/log.h"

#define SEARCH_STEPS 40000
#define GAIN_MIN     1.01

struct hop {
    enum cfx_topo_path_type type;
    int n_links;
    int first; /* Into search.link_pool. */
};

struct score {
    double bw;
    int worst;       /* Slowest hop class. */
    int worst_count; /* Hops of that class. */
    int type_sum;
};

struct search {
    struct plan_pattern *pat;
    const struct cfx_topo_system *sys;
    int host_ranks;
    int n_dlinks;
    int *link_base; /* [n_nodes]: first directed link id of each node. */
    double *cap;    /* [n_dlinks]: effective capacity. */
    int *load;      /* [n_dlinks]: hops of kept channels on each link. */
    int *extra;     /* [n_dlinks]: hops of the channel being searched. */
    /* Hop between two topology nodes, cached by (node, node). */
    struct hop *hops; /* [n_nodes * n_nodes], n_links < 0: not computed. */
    int *link_pool;
    int pool_used, pool_cap;
    /* Depth-first state. */
    int m;
    int *order, *best_order, *visited, *cand;
    double *shares; /* [m * m]: candidate shares per depth. */
    struct score best;
    int have_best;
    long steps;
    int fixed_end; /* Local index that must come last (-1: none, a cycle). */
    double chan_max;
    struct score nic_score; /* Contribution of the NIC paths of this channel. */
    int min_type;           /* Nearest class of any hop between two of the host's units. */
    /* [n_nodes]: the call of dfs that last listed a candidate on each unit. */
    unsigned long *unit_seen;
    unsigned long calls;
};

static double eff(enum cfx_topo_link_type type)
{
    switch (type) {
    case CFX_LINK_NVL: return CFX_EFF_NVL;
    case CFX_LINK_PCI: return CFX_EFF_PCI;
    case CFX_LINK_SYS: return CFX_EFF_SYS;
    case CFX_LINK_NET: return CFX_EFF_NET;
    default: return 1.0;
    }
}

static const struct hop *hop_between(struct search *s, int a, int b)
{
    int n = s->sys->n_nodes;
    struct hop *h = &s->hops[(size_t)a * (size_t)n + (size_t)b];
    if (h->n_links >= 0)
        return h;
    const struct cfx_topo_path *p = cfx_topo_path(s->sys, a, b);
    h->type = p->type;
    h->first = s->pool_used;
    h->n_links = 0;
    if (s->pool_used + p->hops > s->pool_cap) {
        int cap = 2 * s->pool_cap + p->hops + 64;
        int *pool = realloc(s->link_pool, (size_t)cap * sizeof(*pool));
        if (pool == NULL) {
            h->n_links = 0; /* Out of memory: treat as free; the caller still works. */
            return h;
        }
        s->link_pool = pool;
        s->pool_cap = cap;
    }
    for (int at = b; at != a && p->hops > 0;) {
        const struct cfx_topo_path *step = cfx_topo_path(s->sys, a, at);
        if (step->prev < 0)
            break;
        s->link_pool[s->pool_used++] = s->link_base[step->prev] + step->prev_link;
        h->n_links++;
        at = step->prev;
    }
    return h;
}

/* Bandwidth a hop would get if it were added once more. */
static double hop_share(const struct search *s, const struct hop *h)
{
    double bw = INFINITY;
    for (int i = 0; i < h->n_links; i++) {
        int l = s->link_pool[h->first + i];
        double share = s->cap[l] / (s->load[l] + s->extra[l] + 1);
        if (share < bw)
            bw = share;
    }
    return bw;
}

static void hop_add(struct search *s, const struct hop *h, int *counts, int delta)
{
    for (int i = 0; i < h->n_links; i++)
        counts[s->link_pool[h->first + i]] += delta;
}

static int better(const struct score *a, const struct score *b)
{
    if (a->bw > b->bw * (1 + 1e-9))
        return 1;
    if (a->bw < b->bw * (1 - 1e-9))
        return 0;
    if (a->worst != b->worst)
        return a->worst < b->worst;
    if (a->worst_count != b->worst_count)
        return a->worst_count < b->worst_count;
    return a->type_sum < b->type_sum;
}

static struct score extend(struct score sc, enum cfx_topo_path_type type, double bw)
{
    if (bw < sc.bw)
        sc.bw = bw;
    if ((int)type > sc.worst) {
        sc.worst = (int)type;
        sc.worst_count = 1;
    } else if ((int)type == sc.worst) {
        sc.worst_count++;
    }
    sc.type_sum += (int)type;
    return sc;
}

static int unit(const struct search *s, int local)
{
    return s->pat->units[local];
}

/* The best score any completion of a partial order at @p depth (scored
 * @p sc) could reach: no hop of the rest is nearer than s->min_type, and
 * more hops never raise the bandwidth. Each part is at least as good as the
 * completion's, so a bound that does not beat the best prunes the subtree
 * (with uniform hops, such as a CPU host's, that ends the search at the
 * first complete order instead of running it to SEARCH_STEPS). */
static struct score completion_bound(const struct search *s, int depth, struct score sc)
{
    int total = s->fixed_end >= 0 ? s->m - 1 : (s->m > 1 ? s->m : 0);
    int rest = total - (depth - 1);
    if (rest <= 0)
        return sc;
    if (s->min_type > sc.worst) {
        sc.worst = s->min_type;
        sc.worst_count = rest;
    } else if (s->min_type == sc.worst) {
        sc.worst_count += rest;
    }
    sc.type_sum += rest * s->min_type;
    return sc;
}

static void dfs(struct search *s, int depth, struct score sc)
{
    if (s->steps++ > SEARCH_STEPS)
        return;
    if (s->have_best) {
        struct score bound = completion_bound(s, depth, sc);
        if (!better(&bound, &s->best))
            return;
    }
    int last = s->order[depth - 1];
    if (depth == s->m - (s->fixed_end >= 0 ? 1 : 0)) {
        int end = s->fixed_end >= 0 ? s->fixed_end : s->order[0];
        if (s->fixed_end >= 0 && s->m > 1)
            s->order[depth] = end;
        if (s->m > 1 || s->fixed_end < 0) {
            const struct hop *h = hop_between(s, unit(s, last), unit(s, end));
            if (s->m > 1)
                sc = extend(sc, h->type, hop_share(s, h));
        }
        if (!s->have_best || better(&sc, &s->best)) {
            s->best = sc;
            s->have_best = 1;
            memcpy(s->best_order, s->order, (size_t)s->m * sizeof(int));
        }
        return;
    }
    /* Candidates nearest first: class, then bandwidth, then local index.
     * Ranks on the same unit are interchangeable (a hop's class and share
     * depend on its units only), so only the first such rank is a candidate:
     * the orders the others would lead to score the same and come later. */
    int *cand = s->cand + (size_t)depth * (size_t)s->m;
    double *shares = s->shares + (size_t)depth * (size_t)s->m;
    unsigned long call = ++s->calls;
    int n = 0;
    for (int v = 0; v < s->m; v++) {
        if (s->visited[v] || v == s->fixed_end || s->unit_seen[unit(s, v)] == call)
            continue;
        s->unit_seen[unit(s, v)] = call;
        const struct hop *h = hop_between(s, unit(s, last), unit(s, v));
        double share = hop_share(s, h);
        int i = n++;
        for (; i > 0; i--) {
            const struct hop *o = hop_between(s, unit(s, last), unit(s, cand[i - 1]));
            if (o->type < h->type || (o->type == h->type && shares[i - 1] >= share))
                break;
            cand[i] = cand[i - 1];
            shares[i] = shares[i - 1];
        }
        cand[i] = v;
        shares[i] = share;
    }
    for (int i = 0; i < n; i++) {
        int v = cand[i];
        const struct hop *h = hop_between(s, unit(s, last), unit(s, v));
        struct score next = extend(sc, h->type, shares[i]);
        s->visited[v] = 1;
        s->order[depth] = v;
        hop_add(s, h, s->extra, 1);
        dfs(s, depth + 1, next);
        hop_add(s, h, s->extra, -1);
        s->visited[v] = 0;
        if (s->steps > SEARCH_STEPS)
            break;
    }
}

/* ------------------------------------------------------------ evaluation */

/* Hops of channel @p c in pattern order, including its NIC paths. */
static int channel_hops(struct search *s, int c, const struct hop **out, int include_intra,
                        int include_net)
{
    const struct plan_pattern *pat = s->pat;
    const int *order = &pat->order[(size_t)c * (size_t)pat->m];
    int n = 0;
    if (include_intra) {
        int n_intra = pat->multi ? pat->m - 1 : (pat->m > 1 ? pat->m : 0);
        for (int i = 0; i < n_intra; i++)
            out[n++] = hop_between(s, unit(s, order[i]), unit(s, order[(i + 1) % pat->m]));
    }
    if (include_net && pat->multi) {
        out[n++] = hop_between(s, unit(s, order[pat->m - 1]), pat->net[c]); /* leave */
        out[n++] = hop_between(s, pat->net[c], unit(s, order[0]));          /* enter */
    }
    return n;
}

/* Bandwidth of each channel with all channels in place; returns the sum. */
static double evaluate(struct search *s, int n_channels, int include_intra, int include_net,
                       double *bw_out, const struct hop **scratch)
{
    memset(s->load, 0, (size_t)s->n_dlinks * sizeof(int));
    for (int c = 0; c < n_channels; c++) {
        int n = channel_hops(s, c, scratch, include_intra, include_net);
        for (int i = 0; i < n; i++)
            hop_add(s, scratch[i], s->load, 1);
    }
    double total = 0;
    for (int c = 0; c < n_channels; c++) {
        double bw = s->chan_max;
        int n = channel_hops(s, c, scratch, include_intra, include_net);
        for (int i = 0; i < n; i++)
            for (int k = 0; k < scratch[i]->n_links; k++) {
                int l = s->link_pool[scratch[i]->first + k];
                double share = s->cap[l] / s->load[l];
                if (share < bw)
                    bw = share;
            }
        if (bw_out)
            bw_out[c] = bw;
        total += bw;
    }
    if (s->host_ranks && total > CFX_HOST_RANK_MAX_BW) {
        /* One thread per rank moves every channel. */
        for (int c = 0; bw_out && c < n_channels; c++)
            bw_out[c] *= CFX_HOST_RANK_MAX_BW / total;
        total = CFX_HOST_RANK_MAX_BW;
    }
    return total;
}

/* ------------------------------------------------------------ channels */

/* Rank nearest to NET @p net (direction: rank to NET when @p leaving). */
static int nearest_to_net(struct search *s, int net, int leaving, int exclude, const int *used)
{
    int best = -1;
    for (int v = 0; v < s->m; v++) {
        if (v == exclude)
            continue;
        const struct cfx_topo_path *p = leaving ? cfx_topo_path(s->sys, unit(s, v), net)
                                                : cfx_topo_path(s->sys, net, unit(s, v));
        if (best < 0) {
            best = v;
            continue;
        }
        const struct cfx_topo_path *q = leaving ? cfx_topo_path(s->sys, unit(s, best), net)
                                                : cfx_topo_path(s->sys, net, unit(s, best));
        if (p->type != q->type) {
            if (p->type < q->type)
                best = v;
        } else if (p->bw != q->bw) {
            if (p->bw > q->bw)
                best = v;
        } else if (used[v] < used[best]) {
            best = v;
        }
    }
    return best;
}

static cfxResult_t grow(struct plan_pattern *pat, int n_channels)
{
    int m = pat->m;
    int *order = realloc(pat->order, (size_t)n_channels * (size_t)m * sizeof(int));
    if (order)
        pat->order = order;
    int *net = realloc(pat->net, (size_t)n_channels * sizeof(int));
    if (net)
        pat->net = net;
    if (order == NULL || net == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for rings");
    return cfxSuccess;
}

static cfxResult_t search_channels(struct search *s, int max_channels)
{
    struct plan_pattern *pat = s->pat;
    const struct cfx_topo_system *sys = s->sys;
    int m = pat->m;
    int n_nets = pat->multi ? sys->count[CFX_TOPO_NET] : 0;
    int *net_used = calloc((size_t)(n_nets + 1), sizeof(int));
    int *exit_used = calloc((size_t)m, sizeof(int));
    int *entry_used = calloc((size_t)m, sizeof(int));
    const struct hop **scratch = calloc((size_t)m + 2, sizeof(*scratch));
    double *totals = calloc((size_t)max_channels, sizeof(double));
    cfxResult_t res = cfxSuccess;
    if (!net_used || !exit_used || !entry_used || !scratch || !totals) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for the ring search");
        goto out;
    }
    s->min_type = m > 1 ? INT_MAX : 0;
    for (int a = 0; a < m; a++)
        for (int b = 0; b < m; b++)
            if (a != b && (int)hop_between(s, unit(s, a), unit(s, b))->type < s->min_type)
                s->min_type = (int)hop_between(s, unit(s, a), unit(s, b))->type;
    for (int c = 0; c < max_channels; c++) {
        CFX_CHECK_GOTO(grow(pat, c + 1), res, out);
        int entry = 0, exit_rank = -1, net = -1, net_k = 0;
        s->nic_score = (struct score){.bw = s->chan_max, .worst = 0, .worst_count = 0};
        if (pat->multi) {
            for (int k = 1; k < n_nets; k++)
                if (net_used[k] < net_used[net_k])
                    net_k = k;
            net = cfx_topo_nth(sys, CFX_TOPO_NET, net_k);
            exit_rank = nearest_to_net(s, net, 1, -1, exit_used);
            entry = m > 1 ? nearest_to_net(s, net, 0, exit_rank, entry_used) : exit_rank;
        }
        pat->net[c] = net;
        /* Search this channel's order with the kept channels' loads. */
        memset(s->extra, 0, (size_t)s->n_dlinks * sizeof(int));
        evaluate(s, c, 1, 1, NULL, scratch); /* Sets s->load for channels 0..c-1. */
        struct score start = s->nic_score;
        if (pat->multi) {
            const struct hop *out_hop = hop_between(s, unit(s, exit_rank), net);
            start.bw = fmin(start.bw, hop_share(s, out_hop));
            hop_add(s, out_hop, s->extra, 1);
            const struct hop *in_hop = hop_between(s, net, unit(s, entry));
            start.bw = fmin(start.bw, hop_share(s, in_hop));
            hop_add(s, in_hop, s->extra, 1);
        }
        memset(s->visited, 0, (size_t)m * sizeof(int));
        s->order[0] = entry;
        s->visited[entry] = 1;
        s->fixed_end = pat->multi && m > 1 ? exit_rank : -1;
        s->have_best = 0;
        s->steps = 0;
        dfs(s, 1, start);
        pat->search_steps += s->steps;
        if (!s->have_best) {
            res = cfx_error_set(cfxInternalError, CFX_LOG_GRAPH, "ring search found no order");
            goto out;
        }
        memcpy(&pat->order[(size_t)c * (size_t)m], s->best_order, (size_t)m * sizeof(int));
        totals[c] = evaluate(s, c + 1, 1, 1, NULL, scratch);
        if (pat->multi) {
            net_used[net_k]++;
            exit_used[exit_rank]++;
            entry_used[entry]++;
        }
    }
    /* Equal shares make the total dip before it rises (a NIC's second
     * channel halves the first's share), so every count up to the maximum
     * is tried; the fewest channels within 1% of the best total win. */
    double best_total = 0;
    for (int c = 0; c < max_channels; c++)
        if (totals[c] > best_total)
            best_total = totals[c];
    pat->n_channels = 1;
    while (pat->n_channels < max_channels && totals[pat->n_channels - 1] * GAIN_MIN < best_total)
        pat->n_channels++;
    pat->channel_bw = calloc((size_t)pat->n_channels, sizeof(double));
    pat->hop_type = calloc((size_t)pat->n_channels * (size_t)m, 1);
    if (pat->channel_bw == NULL || pat->hop_type == NULL) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for rings");
        goto out;
    }
    pat->total_bw = evaluate(s, pat->n_channels, 1, 1, pat->channel_bw, scratch);
    pat->intra_bw = m > 1 ? evaluate(s, pat->n_channels, 1, 0, NULL, scratch) : INFINITY;
    pat->net_bw = pat->multi ? evaluate(s, pat->n_channels, 0, 1, NULL, scratch) : 0;
    pat->intra_class = CFX_LINK_LOC;
    pat->rdma = pat->multi;
    for (int c = 0; c < pat->n_channels; c++) {
        const int *o = &pat->order[(size_t)c * (size_t)m];
        for (int i = 0; i < m; i++) {
            enum cfx_topo_path_type type;
            if (i + 1 < m)
                type = hop_between(s, unit(s, o[i]), unit(s, o[i + 1]))->type;
            else if (pat->multi)
                type = CFX_PATH_NET;
            else
                type = hop_between(s, unit(s, o[i]), unit(s, o[0]))->type;
            pat->hop_type[(size_t)c * (size_t)m + (size_t)i] = (unsigned char)type;
            if (type != CFX_PATH_NET && cfx_topo_path_link_class(type) > pat->intra_class)
                pat->intra_class = cfx_topo_path_link_class(type);
        }
        if (pat->multi && sys->nodes[pat->net[c]].net.guid == 0)
            pat->rdma = 0;
    }
out:
    free(net_used);
    free(exit_used);
    free(entry_used);
    free(scratch);
    free(totals);
    return res;
}

cfxResult_t cfx_plan_pattern_search(struct plan_pattern *pat, int host_ranks, int max_channels)
{
    const struct cfx_topo_system *sys = pat->sys;
    struct search s = {.pat = pat, .sys = sys, .host_ranks = host_ranks, .m = pat->m};
    cfxResult_t res = cfxSuccess;
    int n = sys->n_nodes, m = pat->m;
    if (pat->multi && sys->count[CFX_TOPO_NET] == 0)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH,
                             "a host (%s) has no network port: cannot plan across hosts",
                             sys->source);
    s.chan_max = host_ranks ? CFX_HOST_RANK_MAX_BW : CFX_GPU_CHANNEL_MAX_BW;
    s.link_base = calloc((size_t)n + 1, sizeof(int));
    for (int i = 0; s.link_base && i < n; i++)
        s.link_base[i + 1] = s.link_base[i] + sys->nodes[i].n_links;
    s.n_dlinks = s.link_base ? s.link_base[n] : 0;
    s.cap = calloc((size_t)s.n_dlinks + 1, sizeof(double));
    s.load = calloc((size_t)s.n_dlinks + 1, sizeof(int));
    s.extra = calloc((size_t)s.n_dlinks + 1, sizeof(int));
    s.hops = malloc((size_t)n * (size_t)n * sizeof(*s.hops));
    s.order = calloc((size_t)m, sizeof(int));
    s.best_order = calloc((size_t)m, sizeof(int));
    s.visited = calloc((size_t)m, sizeof(int));
    s.cand = calloc((size_t)m * (size_t)m, sizeof(int));
    s.shares = calloc((size_t)m * (size_t)m, sizeof(double));
    s.unit_seen = calloc((size_t)n, sizeof(*s.unit_seen));
    if (!s.link_base || !s.cap || !s.load || !s.extra || !s.hops || !s.order || !s.best_order ||
        !s.visited || !s.cand || !s.shares || !s.unit_seen) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for the ring search");
        goto out;
    }
    for (size_t i = 0; i < (size_t)n * (size_t)n; i++)
        s.hops[i].n_links = -1;
    for (int i = 0; i < n; i++)
        for (int l = 0; l < sys->nodes[i].n_links; l++) {
            const struct cfx_topo_link *link = &sys->nodes[i].links[l];
            s.cap[s.link_base[i] + l] = link->bw * eff(link->type);
        }
    res = search_channels(&s, max_channels);
out:
    free(s.link_base);
    free(s.cap);
    free(s.load);
    free(s.extra);
    free(s.hops);
    free(s.link_pool);
    free(s.order);
    free(s.best_order);
    free(s.visited);
    free(s.cand);
    free(s.shares);
    free(s.unit_seen);
    return res;
}

void cfx_plan_pattern_free(struct plan_pattern *pat)
{
    if (pat == NULL)
        return;
    free(pat->units);
    free(pat->order);
    free(pat->net);
    free(pat->hop_type);
    free(pat->channel_bw);
    memset(pat, 0, sizeof(*pat));
}
