/*
 * The plan of a communicator: the rings (one per channel), the two
 * complementary trees, and the cost model that picks algorithm x protocol
 * for each call. Built once at init from the topology of every host and
 * where each rank runs; read by the core on every call.
 *
 * Rules:
 *  - Deterministic: the same input gives the same plan on every rank and in
 *    every process (no time budgets, no addresses, no hashing of pointers).
 *  - Memory is proportional to ranks x channels (plus the host topologies);
 *    16,384 ranks plan in well under a second (bench/plan_scale.c).
 *  - A plan is immutable after cfx_plan_build except for the "already
 *    explained" bits cfx_plan_choose keeps (atomics): any number of threads
 *    may call cfx_plan_choose on one plan.
 *
 * Rings. Ring c visits every rank once: rings[c * n_ranks + i] is the i-th
 * rank; rank r sends to the next position and receives from the previous
 * one (cfx_plan_ring_next/prev). Hosts are visited in order of their
 * lowest rank; inside a host the order is the best the search found
 * (NVLink before PCI before SYS; widest bottleneck; fewest slow hops). With
 * several hosts each ring leaves a host from the rank nearest the NIC it
 * uses (ring_nets) and enters the next host through the same NIC index.
 *
 * On one host whose ranks are host (CPU) ranks placed in rank order (as
 * cfx_plan_default_cpu places them), every ring is 0, 1, ..., n-1. GPU
 * ranks get the searched order. The communicator's rings run in these
 * orders (src/core/algo.c, order_rings).
 *
 * Trees. trees[0] and trees[1] are NCCL's double binary tree: the hosts form
 * two binary trees in which no host is interior in both (mirror image for an
 * even number of hosts, shifted by one for an odd number); inside each host
 * the ranks form a chain whose head (the rank nearest the tree's NIC) joins
 * the inter-host tree. Each tree carries half the data of an allreduce.
 */
#ifndef CFX_PLAN_PLAN_H
#define CFX_PLAN_PLAN_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "conflux.h"
#include "src/coll/op.h"
#include "src/topo/topo.h"

/* Algorithms. Append only: a new one adds its name in tuning.c and its
 * time in model.c. DIRECT is the one-shot allreduce (every rank sends its
 * input to every other and reduces all of them; host ranks, at most
 * CFX_DIRECT_MAX_RANKS). */
enum cfx_plan_algo {
    CFX_ALGO_RING = 0,
    CFX_ALGO_TREE = 1,
    CFX_ALGO_DIRECT = 2,  /* One-shot allreduce (src/coll/direct.h). */
    CFX_ALGO_TWOSHOT = 3, /* Two-shot allreduce (src/coll/twoshot.h). */
    CFX_ALGO_COUNT
};

/* Protocols, NCCL's: LL (8-byte flag+data lines, lowest latency), LL128
 * (128-byte lines, NVLink), SIMPLE (bulk copies with a flag per slot; the
 * only one host ranks have). */
enum cfx_plan_proto {
    CFX_PROTO_LL = 0,
    CFX_PROTO_LL128 = 1,
    CFX_PROTO_SIMPLE = 2,
    CFX_PROTO_COUNT
};

/* Collectives the model covers: CFX_COLL_ALLREDUCE .. CFX_COLL_REDUCESCATTER. */
#define CFX_PLAN_COLLS 5

#define CFX_PLAN_MAX_CHANNELS      32
#define CFX_PLAN_TREE_MAX_CHILDREN 3 /* The next rank of the chain + two hosts. */

/* Where one rank runs. */
struct cfx_plan_rank_loc {
    int node; /* Host index, 0..n_nodes-1. */
    int gpu;  /* CUDA device number (a GPU "dev" of the host's topology), or -1: host rank. */
    int cpu;  /* Host ranks: index of the CPU (NUMA domain) among the topology's CPUs;
               * -1: spread as cfx_plan_default_cpu does. Ignored for GPU ranks. */
};

struct cfx_plan_input {
    int n_ranks;
    int n_nodes;
    /* Topology of each host (n_nodes pointers, which may repeat), or NULL
     * and `system` for hosts that are all alike. Borrowed for the duration
     * of cfx_plan_build; the plan keeps no pointer to them. */
    const struct cfx_topo_system *const *systems;
    const struct cfx_topo_system *system;
    /* Where each rank runs (n_ranks entries), or NULL: rank r runs on host
     * r / ranks_per_node, on GPU r % ranks_per_node if the host has GPUs,
     * else as a host rank placed by cfx_plan_default_cpu. */
    const struct cfx_plan_rank_loc *locs;
    int ranks_per_node;
};

struct cfx_plan_tree {
    int root;    /* The rank at the top (-1 when the plan has no ranks). */
    int *parent; /* [n_ranks]; -1 at the root. */
    int (*children)[CFX_PLAN_TREE_MAX_CHILDREN]; /* [n_ranks]; -1 after the last. */
    int depth;                                   /* Edges from the root to the deepest rank. */
    int net_depth;                               /* The same counting only hops between hosts. */
};

struct cfx_plan_choice {
    enum cfx_plan_algo algo;
    enum cfx_plan_proto proto;
    int n_channels;      /* Rings (or tree pairs) to spread the data over. */
    double predicted_us; /* Model time of the whole call. */
    double busbw_gbs;    /* nccl-tests' bus bandwidth at that time (0 for 0 bytes). */
};

/* The cost model's inputs, derived from the rings and trees (model.c). */
struct cfx_plan_model {
    int host_ranks;                  /* 1: CPU ranks, SIMPLE only. */
    int n_nodes, n_ranks, max_local; /* max_local: most ranks on one host. */
    double ring_bw;                  /* GB/s: sum over channels, effective (what busbw tends to). */
    double intra_bw;                 /* Same with only the hops inside hosts. */
    double net_bw;                   /* Same with only the NIC hops (0: one host). */
    enum cfx_topo_link_type intra_class; /* Slowest link class of the hops inside hosts. */
    int rdma;                            /* Hosts are joined by RDMA NICs (else sockets). */
    /* Bytes on the busiest NIC per byte of data: [0] allreduce, [1] broadcast/reduce. */
    double tree_net_factor[2];
    int tree_net_depth;        /* Deepest of the two trees, hops between hosts. */
    double tree_reduce_factor; /* Bytes the busiest tree rank reduces per byte of data. */
    double reduce_bw;          /* GB/s a rank reduces at (gamma); 0: free (GPU, fused in copies). */
    double base_us[CFX_ALGO_COUNT][CFX_PROTO_COUNT];
    double intra_hop_us[CFX_PROTO_COUNT];
    double net_hop_us[CFX_PROTO_COUNT];
    /* enabled[coll][algo][proto]: the model may pick it (CFX_ALGO, CFX_PROTO, capability). */
    unsigned char enabled[CFX_PLAN_COLLS][CFX_ALGO_COUNT][CFX_PROTO_COUNT];
};

struct cfx_plan {
    int n_ranks;
    int n_nodes;
    int n_channels;
    int *rings;    /* [n_channels * n_ranks]: ranks in ring order. */
    int *ring_pos; /* [n_channels * n_ranks]: position of each rank in each ring. */
    /* [n_channels * n_ranks]: enum cfx_topo_path_type of the hop from position i to i+1. */
    unsigned char *ring_hops;
    int *ring_nets; /* [n_channels * n_nodes]: NET dev each ring uses on each host (-1: none). */
    double *channel_bw; /* [n_channels]: GB/s each ring was given by the search. */
    long search_steps;  /* Orders the ring search tried, every channel of every host kind. */
    struct cfx_plan_tree trees[2];
    int *node_order; /* [n_nodes]: hosts in ring order. */
    struct cfx_plan_model model;
    /* Explanations already logged: bit b of explained[coll] = size bucket 2^b. */
    _Atomic uint64_t explained[CFX_PLAN_COLLS];
    _Atomic unsigned fallback_warned;
};

/**
 * @brief Build the plan.
 * @param [in]  in      Hosts, their topologies, and where each rank runs.
 * @param [out] plan_p  The plan; free with cfx_plan_free.
 * @return cfxSuccess; cfxInvalidArgument with a sentence when the input is
 * inconsistent (a rank on a GPU its host does not have, a host with no rank,
 * ranks not matching n_ranks); cfxSystemError when out of memory.
 */
cfxResult_t cfx_plan_build(const struct cfx_plan_input *in, struct cfx_plan **plan_p);

/** @brief Release a plan; accepts NULL and half-built plans. */
void cfx_plan_free(struct cfx_plan *plan);

/**
 * @brief Pick the algorithm and protocol for one call.
 * @param [in] coll   CFX_COLL_ALLREDUCE .. CFX_COLL_REDUCESCATTER.
 * @param [in] bytes  The size nccl-tests reports: the whole buffer (for
 *                    allgather the receive buffer, for reduce-scatter the send buffer).
 * @param [out] out   The choice and its predicted time.
 * @return cfxSuccess; cfxInvalidArgument for send/recv. Never blocks, never
 * allocates. Honours CFX_ALGO and CFX_PROTO (read at build time); with
 * CFX_DEBUG_SUBSYS=TUNING the first call of each (collective, power-of-two
 * size bucket) logs every candidate's time and why the winner won.
 */
cfxResult_t cfx_plan_choose(struct cfx_plan *plan, enum cfx_coll_kind coll, size_t bytes,
                            struct cfx_plan_choice *out);

/** Whether cfx_plan_choose picks @p algo for @p coll at some power-of-two
 *  size up to 1 TiB (the same sizes cfx_plan_signature covers). Pure. */
int cfx_plan_may_pick(const struct cfx_plan *plan, enum cfx_coll_kind coll,
                      enum cfx_plan_algo algo);

/** A hash of every decision the plan makes: its rings, trees, and the
 *  algorithm and protocol cfx_plan_choose picks for each collective at every
 *  power-of-two size up to 1 TiB. Ranks whose signatures differ would run
 *  different schedules. Pure (logs nothing). */
uint64_t cfx_plan_signature(const struct cfx_plan *plan);

/* CFX_MAX_NCHANNELS: the most rings a plan builds (and an executor uses). */
int cfx_plan_max_channels(void);

/** Model time of one (algorithm, protocol) in microseconds; INFINITY when it
 *  cannot run that collective (tree allgather) or the plan lacks it. Ignores
 *  CFX_ALGO/CFX_PROTO. */
double cfx_plan_predict_us(const struct cfx_plan *plan, enum cfx_coll_kind coll,
                           enum cfx_plan_algo algo, enum cfx_plan_proto proto, size_t bytes);

/** nccl-tests' bus bandwidth (GB/s) of @p bytes moved in @p us by @p coll over @p n_ranks. */
double cfx_plan_busbw(enum cfx_coll_kind coll, int n_ranks, size_t bytes, double us);

/** The CPU (index among the topology's CPUs) for the @p local_rank-th of
 *  @p local_nranks host ranks: consecutive blocks per NUMA domain. */
int cfx_plan_default_cpu(const struct cfx_topo_system *sys, int local_rank, int local_nranks);

const char *cfx_plan_algo_name(enum cfx_plan_algo algo); /* "ring", "tree", "direct", "twoshot" */
const char *cfx_plan_proto_name(enum cfx_plan_proto proto); /* "LL", "LL128", "Simple" */

/* Ring neighbours of @p rank in channel @p c. */
static inline int cfx_plan_ring_next(const struct cfx_plan *plan, int c, int rank)
{
    size_t base = (size_t)c * (size_t)plan->n_ranks;
    int pos = plan->ring_pos[base + (size_t)rank] + 1;
    return plan->rings[base + (size_t)(pos == plan->n_ranks ? 0 : pos)];
}

static inline int cfx_plan_ring_prev(const struct cfx_plan *plan, int c, int rank)
{
    size_t base = (size_t)c * (size_t)plan->n_ranks;
    int pos = plan->ring_pos[base + (size_t)rank];
    return plan->rings[base + (size_t)(pos == 0 ? plan->n_ranks - 1 : pos - 1)];
}

#endif /* CFX_PLAN_PLAN_H */
