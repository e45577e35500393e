/*
 * Pieces of the planner shared between its files (internal to src/plan).
 *
 * A pattern is what the ring search finds for one kind of host (one
 * topology with one set of local ranks): for each channel, the order of the
 * host's local ranks, and with several hosts the NET it leaves and enters
 * through. Hosts with the same topology and the same local placement share
 * one pattern, so a 2,048-host plan searches once.
 */
#ifndef CFX_PLAN_INTERNAL_H
#define CFX_PLAN_INTERNAL_H

#include "src/plan/plan.h"

/* Effective share of a link's nominal bandwidth a transfer achieves
 * (docs/tuning.md gives the sources). */
#define CFX_EFF_NVL 0.80
#define CFX_EFF_PCI 0.80
#define CFX_EFF_SYS 1.00 /* Inter-socket figures are already effective. */
#define CFX_EFF_NET 0.94
/* What one channel can move (one GPU thread block), GB/s. */
#define CFX_GPU_CHANNEL_MAX_BW 40.0
/* What one host rank moves in total (one CPU thread copying between
 * shared-memory slots), and how fast it reduces, GB/s. Fitted to the host
 * data path's measured 2-rank allreduce (docs/tuning.md). */
#define CFX_HOST_RANK_MAX_BW 3.0
#define CFX_HOST_REDUCE_BW   4.0

struct plan_pattern {
    const struct cfx_topo_system *sys;
    int m;      /* Local ranks. */
    int *units; /* [m]: topology node (GPU, or CPU for host ranks) of each local rank. */
    int multi;  /* Searched for several hosts (paths between NICs) or one (cycles). */
    int n_channels;
    int *order;              /* [n_channels * m]: local indices in ring order. */
    int *net;                /* [n_channels]: NET node used (-1: one host). */
    unsigned char *hop_type; /* [n_channels * m]: path type order[i] -> order[i+1]
                              * (last: the wrap on one host, NET across hosts). */
    double *channel_bw;      /* [n_channels] */
    double total_bw, intra_bw, net_bw;
    enum cfx_topo_link_type intra_class;
    int rdma;
    long search_steps; /* Orders the depth-first search tried, all channels. */
};

/* Search the rings of one kind of host. @p host_ranks: the units are CPUs. */
cfxResult_t cfx_plan_pattern_search(struct plan_pattern *pat, int host_ranks, int max_channels);
void cfx_plan_pattern_free(struct plan_pattern *pat);

/* Build plan->trees from plan->node_order and each host's chain for each
 * tree (chains[t][node]: node_nranks[node] ranks, head first); also sets
 * the model's tree factors. */
cfxResult_t cfx_plan_trees_build(struct cfx_plan *plan, const int *node_nranks, int **chains[2]);

/* Fill plan->model's constants (bandwidths are set by the builder). */
void cfx_plan_model_init(struct cfx_plan *plan);

/* Time in us of one candidate and its latency part (may be NULL);
 * INFINITY when it cannot run. */
double cfx_plan_model_time(const struct cfx_plan *plan, enum cfx_coll_kind coll,
                           enum cfx_plan_algo algo, enum cfx_plan_proto proto, size_t bytes,
                           double *lat_p);

/* Parse CFX_ALGO / CFX_PROTO into plan->model.enabled. */
void cfx_plan_tuning_init(struct cfx_plan *plan);

#endif /* CFX_PLAN_INTERNAL_H */
