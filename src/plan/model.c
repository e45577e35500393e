/*
 * The cost model, alpha-beta-gamma: time(collective, algorithm, protocol, bytes) =
 *   alpha: latency (a base cost plus one hop latency per step on the
 *          critical path, per link class and protocol)
 * + beta:  bytes x (bytes the busiest link carries per byte of data)
 *          / (bandwidth of the rings or trees, GB/s, times the protocol's share)
 * + gamma: bytes x (bytes the busiest rank reduces per byte of data)
 *          / (reduction bandwidth; host ranks only: GPUs reduce inside their
 *          copies at memory speed, far above any link).
 *
 * Algorithms: ring, tree (double binary tree, chains inside hosts), the
 * direct one-shot allreduce (host ranks; GPU ranks of one host) and the
 * two-shot allreduce (GPU ranks of one host).
 *
 * The bandwidths come from the rings the search built on the hosts' links
 * (plan->model.ring_bw, intra_bw, net_bw); the per-hop latencies from the
 * slowest link class inside hosts and from the network (RDMA or sockets).
 * Constants and the figures they were checked against are in docs/tuning.md.
 */
#include <math.h>

#include "src/plan/internal.h"

#define TREE_EFFICIENCY 0.90 /* Reduce-up/broadcast-down pipelines lose ~10% (NCCL's figure). */

/* Protocol share of the link bandwidth: LL sends 4 data bytes per 8 and
 * polls each line; LL128 120 of every 128 bytes. */
static const double proto_share[CFX_PROTO_COUNT] = {0.25, 0.92, 1.0};

/* GPU latencies, us. Base: launching and finishing one call. */
static const double gpu_base_us[CFX_ALGO_COUNT][CFX_PROTO_COUNT] = {
    {5.0, 6.0, 8.0},  /* ring */
    {6.0, 7.0, 10.0}, /* tree */
    {5.0, 6.0, 8.0},  /* direct (one-shot; GPU ranks of one host) */
    {5.0, 6.0, 8.0}   /* two-shot (GPU ranks of one host) */
};
/* Per step on a hop of each link class inside a host (LOC: same device). */
static const double gpu_hop_us[CFX_LINK_TYPES][CFX_PROTO_COUNT] = {
    {0.3, 0.6, 1.0}, /* LOC */
    {0.6, 1.3, 3.0}, /* NVL */
    {1.0, 2.2, 5.0}, /* PCI */
    {1.5, 3.0, 6.5}, /* SYS */
    {3.0, 5.0, 10.0} /* NET (unused inside a host) */
};
/* Per step across hosts: [0] sockets, [1] RDMA. */
static const double gpu_net_hop_us[2][CFX_PROTO_COUNT] = {{20.0, 24.0, 30.0}, {3.0, 5.0, 10.0}};

/* Host ranks (Simple only): a call through the host executor, a slot
 * hand-off through shared memory (fitted: 2.2 us for a 2-rank allreduce),
 * and the network. */
#define HOST_BASE_US     1.0
#define HOST_LOC_HOP_US  0.6
#define HOST_SYS_HOP_US  1.0
#define HOST_NET_SOCK_US 30.0
#define HOST_NET_RDMA_US 8.0
/* Direct allreduce, per peer beyond the first: one more slot posted and
 * taken, and one more reduction call. Its reductions read slots that just
 * arrived and are still in cache, so they run faster than the ring's
 * streaming ones (CFX_HOST_REDUCE_BW): fitted so that on 2 ranks over shared
 * memory direct and ring cross near 64 KiB, as measured (docs/tuning.md). */
#define HOST_DIRECT_PEER_US   0.15
#define HOST_DIRECT_REDUCE_BW 7.5
/* GPU direct allreduce: one more slot posted per peer and chunk. */
#define GPU_DIRECT_POST_US 0.5

void cfx_plan_model_init(struct cfx_plan *plan)
{
    struct cfx_plan_model *md = &plan->model;
    for (int a = 0; a < CFX_ALGO_COUNT; a++)
        for (int p = 0; p < CFX_PROTO_COUNT; p++)
            md->base_us[a][p] = md->host_ranks ? HOST_BASE_US : gpu_base_us[a][p];
    for (int p = 0; p < CFX_PROTO_COUNT; p++) {
        if (md->host_ranks) {
            md->intra_hop_us[p] =
                md->intra_class >= CFX_LINK_SYS ? HOST_SYS_HOP_US : HOST_LOC_HOP_US;
            md->net_hop_us[p] = md->rdma ? HOST_NET_RDMA_US : HOST_NET_SOCK_US;
            md->reduce_bw = CFX_HOST_REDUCE_BW;
        } else {
            md->intra_hop_us[p] = gpu_hop_us[md->intra_class][p];
            md->net_hop_us[p] = gpu_net_hop_us[md->rdma ? 1 : 0][p];
        }
    }
}

/* Bytes each rank reduces per byte of data on a ring (gamma's share). */
static double ring_reduce_factor(enum cfx_coll_kind coll, int n)
{
    switch (coll) {
    case CFX_COLL_ALLREDUCE:
    case CFX_COLL_REDUCESCATTER: return (double)(n - 1) / n;
    case CFX_COLL_REDUCE: return 1.0;
    default: return 0.0;
    }
}

/* nccl-tests' factor from algorithm bandwidth to bus bandwidth. */
static double bus_factor(enum cfx_coll_kind coll, int n)
{
    if (n <= 1)
        return 1.0;
    switch (coll) {
    case CFX_COLL_ALLREDUCE: return 2.0 * (n - 1) / n;
    case CFX_COLL_ALLGATHER:
    case CFX_COLL_REDUCESCATTER: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

double cfx_plan_busbw(enum cfx_coll_kind coll, int n_ranks, size_t bytes, double us)
{
    if (us <= 0 || bytes == 0)
        return 0;
    return (double)bytes * bus_factor(coll, n_ranks) / (us * 1e3);
}

static double ring_time(const struct cfx_plan_model *md, enum cfx_coll_kind coll,
                        enum cfx_plan_proto proto, double bytes, double *lat_p)
{
    double n = md->n_ranks, nodes = md->n_nodes;
    double steps, inter;
    switch (coll) {
    case CFX_COLL_ALLREDUCE:
        steps = 2 * (n - 1);
        inter = nodes > 1 ? steps * nodes / n : 0;
        break;
    case CFX_COLL_ALLGATHER:
    case CFX_COLL_REDUCESCATTER:
        steps = n - 1;
        inter = nodes > 1 ? steps * nodes / n : 0;
        break;
    default: /* Broadcast and reduce: a pipeline along the ring cut open. */
        steps = n - 1;
        inter = nodes - 1;
        break;
    }
    double lat = md->base_us[CFX_ALGO_RING][proto] + (steps - inter) * md->intra_hop_us[proto] +
                 inter * md->net_hop_us[proto];
    double bw = md->ring_bw * proto_share[proto];
    double reduce = md->reduce_bw > 0 ? ring_reduce_factor(coll, md->n_ranks) / md->reduce_bw : 0;
    *lat_p = lat;
    return lat + bytes * (bus_factor(coll, md->n_ranks) / bw + reduce) / 1e3;
}

static double tree_time(const struct cfx_plan_model *md, enum cfx_coll_kind coll,
                        enum cfx_plan_proto proto, double bytes, double *lat_p)
{
    if (coll != CFX_COLL_ALLREDUCE && coll != CFX_COLL_BROADCAST && coll != CFX_COLL_REDUCE)
        return INFINITY;
    int allreduce = coll == CFX_COLL_ALLREDUCE;
    double chain =
        (md->max_local - 1) * md->intra_hop_us[proto] + md->tree_net_depth * md->net_hop_us[proto];
    double lat = md->base_us[CFX_ALGO_TREE][proto] + (allreduce ? 2 : 1) * chain;
    /* Bytes on the busiest NIC and on the busiest link inside a host, per
     * byte of data: the chain sends everything up and everything down. */
    double per_byte = 0;
    if (md->n_nodes > 1 && md->net_bw > 0)
        per_byte = md->tree_net_factor[allreduce ? 0 : 1] / md->net_bw;
    if (md->max_local > 1 && isfinite(md->intra_bw) && md->intra_bw > 0)
        per_byte = fmax(per_byte, (allreduce ? 2.0 : 1.0) / md->intra_bw);
    double reduce = md->reduce_bw > 0 && coll != CFX_COLL_BROADCAST
                        ? md->tree_reduce_factor / md->reduce_bw
                        : 0;
    *lat_p = lat;
    return lat + bytes * (per_byte / (proto_share[proto] * TREE_EFFICIENCY) + reduce) / 1e3;
}

/* The one-shot allreduce (src/coll/direct.h): one hand-off for the first
 * slot, one more per further chunk; each rank sends (n-1) x bytes and
 * reduces (n-1) x bytes. Allreduce only, at most CFX_DIRECT_MAX_RANKS; GPU
 * ranks on one host only (Simple: the kernel's slots; its sends are n-1
 * postings per chunk, each a system-scope fence and stores to the pinned
 * control block, GPU_DIRECT_POST_US: not measured on a GPU yet). */
static double direct_time(const struct cfx_plan_model *md, enum cfx_coll_kind coll,
                          enum cfx_plan_proto proto, double bytes, double *lat_p)
{
    if (coll != CFX_COLL_ALLREDUCE || md->n_ranks > CFX_DIRECT_MAX_RANKS)
        return INFINITY;
    if (!md->host_ranks && (md->n_nodes > 1 || proto != CFX_PROTO_SIMPLE))
        return INFINITY;
    double n = md->n_ranks;
    double hop = md->n_nodes > 1 ? md->net_hop_us[proto] : md->intra_hop_us[proto];
    double chunks = ceil(bytes / (double)CFX_DIRECT_SLOT_BYTES);
    if (chunks < 1)
        chunks = 1;
    double per_peer = md->host_ranks ? HOST_DIRECT_PEER_US : GPU_DIRECT_POST_US * chunks;
    double lat = md->base_us[CFX_ALGO_DIRECT][proto] + chunks * hop + (n - 2) * per_peer;
    double bw = md->ring_bw * proto_share[proto];
    double reduce = md->host_ranks && md->reduce_bw > 0 ? (n - 1) / HOST_DIRECT_REDUCE_BW : 0;
    *lat_p = lat;
    return lat + bytes * ((n - 1) / bw + reduce) / 1e3;
}

/* The two-shot allreduce (src/coll/twoshot.h): two hand-offs per round of
 * one chunk per segment, 2(n-1) postings per round, and each rank sends
 * 2(n-1)/n x bytes, as on the ring. GPU ranks of one host only, in Simple
 * (for host ranks it is not offered: not measured against their ring). */
static double twoshot_time(const struct cfx_plan_model *md, enum cfx_coll_kind coll,
                           enum cfx_plan_proto proto, double bytes, double *lat_p)
{
    if (coll != CFX_COLL_ALLREDUCE || md->host_ranks || md->n_nodes > 1 ||
        proto != CFX_PROTO_SIMPLE || md->n_ranks > CFX_DIRECT_MAX_RANKS)
        return INFINITY;
    double n = md->n_ranks;
    double rounds = ceil(bytes / n / (double)CFX_DIRECT_SLOT_BYTES);
    if (rounds < 1)
        rounds = 1;
    double lat = md->base_us[CFX_ALGO_TWOSHOT][proto] +
                 rounds * (2 * md->intra_hop_us[proto] + 2 * (n - 2) * GPU_DIRECT_POST_US);
    double bw = md->ring_bw * proto_share[proto];
    *lat_p = lat;
    return lat + bytes * (2 * (n - 1) / n / bw) / 1e3;
}

/* Time in us of one candidate, and its latency part; INFINITY if it cannot run. */
double cfx_plan_model_time(const struct cfx_plan *plan, enum cfx_coll_kind coll,
                           enum cfx_plan_algo algo, enum cfx_plan_proto proto, size_t bytes,
                           double *lat_p)
{
    const struct cfx_plan_model *md = &plan->model;
    double lat = 0;
    double t = INFINITY;
    if ((unsigned)coll >= CFX_PLAN_COLLS || (unsigned)algo >= CFX_ALGO_COUNT ||
        (unsigned)proto >= CFX_PROTO_COUNT)
        goto out;
    if (md->host_ranks && proto != CFX_PROTO_SIMPLE)
        goto out;
    if (md->n_ranks <= 1) {
        t = algo == CFX_ALGO_RING ? 0.0 : INFINITY;
        goto out;
    }
    if (algo == CFX_ALGO_RING)
        t = ring_time(md, coll, proto, (double)bytes, &lat);
    else if (algo == CFX_ALGO_TREE)
        t = tree_time(md, coll, proto, (double)bytes, &lat);
    else if (algo == CFX_ALGO_DIRECT)
        t = direct_time(md, coll, proto, (double)bytes, &lat);
    else if (algo == CFX_ALGO_TWOSHOT)
        t = twoshot_time(md, coll, proto, (double)bytes, &lat);
out:
    if (lat_p)
        *lat_p = lat;
    return t;
}

double cfx_plan_predict_us(const struct cfx_plan *plan, enum cfx_coll_kind coll,
                           enum cfx_plan_algo algo, enum cfx_plan_proto proto, size_t bytes)
{
    return cfx_plan_model_time(plan, coll, algo, proto, bytes, NULL);
}
