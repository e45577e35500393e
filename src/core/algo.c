/*
 * Algorithm choice: at init each communicator asks the planner (src/plan)
 * for rings, two complementary trees and a cost model, from the host
 * topology (src/topo, detected once per process, or CFX_TOPO_FILE) and where
 * each rank runs; every call then asks it ring, tree or direct. Allreduce
 * runs on any of the three, broadcast and reduce on the ring (chain) or the
 * trees, allgather and reduce-scatter on the ring. Tree connectors are built
 * at the first tree call; the direct all-pairs connectors at init, when the
 * plan may pick the direct allreduce (a rank that connected at its first
 * direct call would wait forever for peers that run a mismatched ring call).
 * All are kept for the life of the communicator.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/reduce.h"
#include "src/bootstrap/bootstrap.h"
#include "src/core/comm.h"
#include "src/plan/plan.h"
#include "src/topo/topo.h"
#include "src/util/check.h"
#include "src/util/cuda.h"
#include "src/util/log.h"
#include "src/util/param.h"

CFX_PARAM_INT(min_nchannels, "MIN_NCHANNELS", 1, 1, 32,
              "Fewest rings a GPU communicator splits large ring allreduces, broadcasts and "
              "reduces over (1..32; CFX_MAX_NCHANNELS and 16 bound it)");

static const char *check_ring_order(const char *text, char *buf, size_t len)
{
    (void)buf;
    (void)len;
    return strcmp(text, "plan") == 0 || strcmp(text, "rank") == 0 ? NULL : "expected plan or rank";
}

CFX_PARAM_STR_CHECKED(ring_order, "RING_ORDER", "plan", check_ring_order,
                      "The order of the rings: plan (the planner's, hosts one after the other "
                      "and GPUs by their links) or rank (0, 1, ..., n-1 whatever the topology); "
                      "the same on every rank");

static pthread_once_t topo_once = PTHREAD_ONCE_INIT;
static struct cfx_topo_system *host_topo; /* Kept for the life of the process. */

static void detect_once(void)
{
    if (cfx_topo_detect(&host_topo) != cfxSuccess) {
        CFX_INFO(CFX_LOG_GRAPH, "topology detection failed (%s); collectives use the ring",
                 cfx_error_thread_last());
        cfx_error_thread_clear();
        host_topo = NULL;
    }
}

const struct cfx_topo_system *cfx_core_algo_topology(void)
{
    pthread_once(&topo_once, detect_once);
    return host_topo;
}

static void plan_build(struct cfxComm *comm);

/* Every rank planned from its own host's topology (alike in a homogeneous
 * job). Where they differ (hosts of other kinds, a CFX_TOPO_FILE on some
 * ranks only, an interface still coming up during detection) the ranks would
 * pick different schedules and wait for each other forever: compare the
 * plans' signatures, and on any difference all ranks drop the plan. */
static cfxResult_t plan_agree(struct cfxComm *comm)
{
    uint64_t *sigs = calloc((size_t)comm->nranks, sizeof(*sigs));
    if (sigs == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT,
                             "out of memory comparing the plans of %d ranks", comm->nranks);
    sigs[comm->rank] = comm->plan ? cfx_plan_signature(comm->plan) : 0;
    if (comm->plan && strcmp(param_ring_order(), "rank") == 0)
        sigs[comm->rank] ^= 0x52494e47u; /* Ranks that ring differently drop the plan. */
    cfxResult_t res = cfx_bootstrap_allgather(comm->bootstrap, sigs, sizeof(*sigs));
    int other = -1;
    for (int r = 0; res == cfxSuccess && r < comm->nranks && other < 0; r++)
        if (sigs[r] != sigs[comm->rank])
            other = r;
    if (other >= 0) {
        CFX_WARN(CFX_LOG_TUNING,
                 "rank %d planned %s and rank %d %s (their hosts' topologies differ as "
                 "detected, or CFX_TOPO_FILE/CFX_ALGO/CFX_PROTO differ); every rank uses the "
                 "ring",
                 comm->rank, comm->plan ? "differently" : "nothing", other,
                 sigs[other] ? "a plan" : "nothing");
        cfx_core_algo_fini_plan(comm);
    }
    free(sigs);
    return res;
}

/* The rings of a GPU communicator: the plan's count, at least
 * CFX_MIN_NCHANNELS, at most CFX_MAX_NCHANNELS and CFX_RING_CHANNELS.
 * Host ranks keep one: one thread runs all of a call's steps. */
static void pick_ring_channels(struct cfxComm *comm)
{
    comm->ring_channels = 1;
    if (comm->plan == NULL)
        return;
    for (int r = 0; r < comm->nranks; r++)
        if (comm->peers[r].cuda_dev < 0)
            return;
    int n = comm->plan->n_channels;
    if (n < (int)param_min_nchannels())
        n = (int)param_min_nchannels();
    if (n > cfx_plan_max_channels())
        n = cfx_plan_max_channels();
    comm->ring_channels = n < 1 ? 1 : n > CFX_RING_CHANNELS ? CFX_RING_CHANNELS : n;
    if (comm->ring_channels > 1)
        CFX_INFO(CFX_LOG_TUNING,
                 "GPU ring collectives of %zu bytes or more split over up to %d rings",
                 2 * CFX_RING_CHANNEL_MIN_BYTES, comm->ring_channels);
}

/* The order of each ring: the plan's (ring c of the plan for channel c,
 * round robin when the communicator has more channels than the plan
 * rings), or 0, 1, ..., n-1 without a plan or with CFX_RING_ORDER=rank.
 * Every rank has the same plan (plan_agree), so the same tables. A GPU
 * communicator's kernels read the tables of permuted rings, so those are
 * registered with CUDA. */
static cfxResult_t order_rings(struct cfxComm *comm)
{
    int n = comm->nranks, channels = comm->ring_channels;
    size_t entries = (size_t)channels * (size_t)n;
    void *mem = NULL;
    if (posix_memalign(&mem, 4096, 2 * entries * sizeof(int32_t)) != 0)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT,
                             "out of memory for the order of %d rings of %d ranks", channels, n);
    comm->ring_ranks = mem;
    comm->ring_pos = comm->ring_ranks + entries;
    int use_plan =
        comm->plan != NULL && comm->plan->n_channels > 0 && strcmp(param_ring_order(), "plan") == 0;
    for (int c = 0; c < channels; c++) {
        int32_t *ranks = comm->ring_ranks + (size_t)c * (size_t)n;
        int32_t *pos = comm->ring_pos + (size_t)c * (size_t)n;
        const int *planned =
            use_plan ? comm->plan->rings + (size_t)(c % comm->plan->n_channels) * (size_t)n : NULL;
        for (int i = 0; i < n; i++)
            ranks[i] = planned ? planned[i] : i;
        for (int i = 0; i < n; i++)
            pos[i] = -1;
        for (int i = 0; i < n; i++) {
            if (ranks[i] < 0 || ranks[i] >= n || pos[ranks[i]] >= 0)
                return cfx_error_set(cfxInternalError, CFX_LOG_INIT,
                                     "the plan's ring %d is not an order of the %d ranks "
                                     "(position %d holds %d)",
                                     c, n, i, ranks[i]);
            pos[ranks[i]] = i;
            if (ranks[i] != i)
                comm->ring_permuted |= 1u << c;
        }
    }
    if (comm->ring_permuted & 1u) {
        const int32_t *ring = comm->ring_ranks;
        char text[160];
        int used = 0;
        for (int i = 0; i < n && used < (int)sizeof(text) - 16; i++)
            used +=
                snprintf(text + used, sizeof(text) - (size_t)used, "%s%d", i ? " " : "", ring[i]);
        if (used >= (int)sizeof(text) - 16)
            snprintf(text + used, sizeof(text) - (size_t)used, " ...");
        CFX_INFO(CFX_LOG_INIT, "rank %d: ring 0 visits %s (rank %d -> %d -> %d)", comm->rank, text,
                 cfx_core_algo_ring_prev(comm, 0), comm->rank, cfx_core_algo_ring_next(comm, 0));
    }
    if (comm->ring_permuted != 0 && comm->cuda_dev >= 0) {
        CFX_CHECK(cfx_cuda_host_register(comm->ring_ranks, 2 * entries * sizeof(int32_t),
                                         comm->cuda_dev));
        comm->ring_tables_pinned = 1;
    }
    return cfxSuccess;
}

cfxResult_t cfx_core_algo_init(struct cfxComm *comm)
{
    comm->ring_channels = 1;
    for (int t = 0; t < 2; t++)
        comm->trees[t] = (struct cfx_tree_links){.parent = -1};
    if (comm->nranks < 2)
        return cfxSuccess;
    plan_build(comm);
    cfxResult_t res = plan_agree(comm);
    pick_ring_channels(comm);
    return res == cfxSuccess ? order_rings(comm) : res;
}

int cfx_core_algo_ring_next(const struct cfxComm *comm, int channel)
{
    int n = comm->nranks;
    if (comm->ring_ranks == NULL)
        return (comm->rank + 1) % n;
    size_t base = (size_t)channel * (size_t)n;
    int pos = comm->ring_pos[base + (size_t)comm->rank] + 1;
    return comm->ring_ranks[base + (size_t)(pos == n ? 0 : pos)];
}

int cfx_core_algo_ring_prev(const struct cfxComm *comm, int channel)
{
    int n = comm->nranks;
    if (comm->ring_ranks == NULL)
        return (comm->rank + n - 1) % n;
    size_t base = (size_t)channel * (size_t)n;
    int pos = comm->ring_pos[base + (size_t)comm->rank];
    return comm->ring_ranks[base + (size_t)(pos == 0 ? n - 1 : pos - 1)];
}

void cfx_core_algo_ring_order(const struct cfxComm *comm, struct cfx_op *op)
{
    op->ring_ranks = op->ring_pos = NULL;
    if (!(comm->ring_permuted & (1u << op->channel)))
        return;
    size_t base = (size_t)op->channel * (size_t)comm->nranks;
    op->ring_ranks = comm->ring_ranks + base;
    op->ring_pos = comm->ring_pos + base;
}

int cfx_core_algo_ring_channels(const struct cfxComm *comm, enum cfx_coll_kind kind, size_t count,
                                cfxDataType_t type)
{
    if (comm->ring_channels <= 1 || kind == CFX_COLL_SEND || kind == CFX_COLL_RECV)
        return 1;
    size_t elem = cfx_type_size(type), bytes = count * elem;
    if (kind == CFX_COLL_ALLGATHER || kind == CFX_COLL_REDUCESCATTER)
        bytes *= (size_t)comm->nranks; /* What the ring moves: every block. */
    else if (kind != CFX_COLL_ALLREDUCE && kind != CFX_COLL_BROADCAST && kind != CFX_COLL_REDUCE)
        return 1;
    size_t n = bytes / CFX_RING_CHANNEL_MIN_BYTES;
    /* Each part holds a whole 64-byte line of count at least. */
    size_t lines = count / (64 / elem);
    if (n > lines)
        n = lines;
    return n < 2 ? 1 : n < (size_t)comm->ring_channels ? (int)n : comm->ring_channels;
}

static void plan_build(struct cfxComm *comm)
{
    for (int t = 0; t < 2; t++) {
        comm->relay_send[t] = calloc((size_t)comm->nranks, sizeof(struct cfx_connector *));
        comm->relay_recv[t] = calloc((size_t)comm->nranks, sizeof(struct cfx_connector *));
        if (comm->relay_send[t] == NULL || comm->relay_recv[t] == NULL)
            return; /* No plan: ring only. */
    }
    pthread_once(&topo_once, detect_once);
    if (host_topo == NULL)
        return;
    /* Hosts in order of their first rank; every rank derives the same list. */
    struct cfx_plan_rank_loc *locs = calloc((size_t)comm->nranks, sizeof(*locs));
    if (locs == NULL)
        return;
    int n_nodes = 0, max_local = 0;
    for (int r = 0; r < comm->nranks; r++) {
        int node = -1, local = 0;
        for (int q = 0; q < r && node < 0; q++)
            if (comm->peers[q].host_hash == comm->peers[r].host_hash)
                node = locs[q].node;
        for (int q = 0; q < r; q++)
            local += comm->peers[q].host_hash == comm->peers[r].host_hash;
        if (node < 0)
            node = n_nodes++;
        if (local + 1 > max_local)
            max_local = local + 1;
        locs[r] =
            (struct cfx_plan_rank_loc){.node = node, .gpu = comm->peers[r].cuda_dev, .cpu = -1};
    }
    struct cfx_plan_input in = {.n_ranks = comm->nranks,
                                .n_nodes = n_nodes,
                                .system = host_topo,
                                .locs = locs,
                                .ranks_per_node = max_local};
    if (cfx_plan_build(&in, &comm->plan) != cfxSuccess) {
        CFX_INFO(CFX_LOG_TUNING, "no plan (%s); collectives use the ring", cfx_error_thread_last());
        cfx_error_thread_clear();
        comm->plan = NULL;
    }
    free(locs);
    if (comm->plan == NULL)
        return;
    for (int t = 0; t < 2; t++) {
        const struct cfx_plan_tree *tree = &comm->plan->trees[t];
        struct cfx_tree_links *links = &comm->trees[t];
        links->parent = tree->parent[comm->rank];
        for (int c = 0; c < CFX_PLAN_TREE_MAX_CHILDREN && c < CFX_TREE_MAX_CHILDREN; c++)
            if (tree->children[comm->rank][c] >= 0)
                links->children[links->n_children++] = tree->children[comm->rank][c];
    }
}

void cfx_core_algo_fini_plan(struct cfxComm *comm)
{
    cfx_plan_free(comm->plan);
    comm->plan = NULL;
    for (int k = 0; k < CFX_CORE_ALGO_KINDS; k++)
        atomic_store_explicit(&comm->algo_last[k], 0, memory_order_relaxed);
    for (int t = 0; t < 2; t++)
        comm->trees[t] = (struct cfx_tree_links){.parent = -1};
}

void cfx_core_algo_fini(struct cfxComm *comm)
{
    cfx_plan_free(comm->plan);
    comm->plan = NULL;
    if (comm->ring_tables_pinned)
        cfx_cuda_host_unregister(comm->ring_ranks, comm->cuda_dev);
    free(comm->ring_ranks);
    comm->ring_ranks = comm->ring_pos = NULL;
    comm->ring_permuted = 0;
    comm->ring_tables_pinned = 0;
    for (int t = 0; t < 2; t++) {
        free(comm->relay_send[t]);
        free(comm->relay_recv[t]);
        comm->relay_send[t] = comm->relay_recv[t] = NULL;
    }
}

/* What the planner picks for @p kind at @p bytes; *ll_p set when it runs
 * LL (the plan's LL on the ring or the trees: LL128 is not built yet and
 * runs Simple, the direct schedules are Simple only). */
static enum cfx_core_algo plan_choice(struct cfxComm *comm, enum cfx_coll_kind kind, size_t bytes,
                                      int *ll_p)
{
    struct cfx_plan_choice choice;
    *ll_p = 0;
    if (cfx_plan_choose(comm->plan, kind, bytes, &choice) != cfxSuccess) {
        cfx_error_thread_clear();
        return CFX_CORE_ALGO_RING;
    }
    /* Allgather and reduce-scatter run on their one schedule, the ring. The
     * model offers direct and two-shot (Simple only) for allreduce on at
     * most CFX_DIRECT_MAX_RANKS only. */
    int ring_family = kind == CFX_COLL_ALLGATHER || kind == CFX_COLL_REDUCESCATTER;
    if ((choice.algo == CFX_ALGO_DIRECT || choice.algo == CFX_ALGO_TWOSHOT) &&
        kind == CFX_COLL_ALLREDUCE && comm->nranks <= CFX_DIRECT_MAX_RANKS)
        return choice.algo == CFX_ALGO_DIRECT ? CFX_CORE_ALGO_DIRECT : CFX_CORE_ALGO_TWOSHOT;
    *ll_p = choice.proto == CFX_PROTO_LL;
    return !ring_family && choice.algo == CFX_ALGO_TREE ? CFX_CORE_ALGO_TREE : CFX_CORE_ALGO_RING;
}

/* Largest size the last-choice word holds beside its two bits of algorithm
 * and one of protocol. */
#define CHOICE_MAX_BYTES (UINT64_MAX >> 3)
_Static_assert(CFX_CORE_ALGO_TWOSHOT <= 3, "an algorithm fits in two bits");
_Static_assert(CFX_COLL_ALLREDUCE < CFX_CORE_ALGO_KINDS &&
                   CFX_COLL_BROADCAST < CFX_CORE_ALGO_KINDS &&
                   CFX_COLL_REDUCE < CFX_CORE_ALGO_KINDS &&
                   CFX_COLL_ALLGATHER < CFX_CORE_ALGO_KINDS &&
                   CFX_COLL_REDUCESCATTER < CFX_CORE_ALGO_KINDS,
               "one last choice per collective the plan chooses for");

enum cfx_core_algo cfx_core_algo_choose(struct cfxComm *comm, enum cfx_coll_kind kind, size_t bytes,
                                        int *ll_p)
{
    *ll_p = 0;
    if (comm->plan == NULL || comm->nranks < 2)
        return CFX_CORE_ALGO_RING;
    if ((int)kind >= CFX_CORE_ALGO_KINDS)
        return CFX_CORE_ALGO_RING;
    if (kind == CFX_COLL_ALLGATHER || kind == CFX_COLL_REDUCESCATTER) /* Per rank. */
        bytes = bytes <= SIZE_MAX / (size_t)comm->nranks ? bytes * (size_t)comm->nranks : SIZE_MAX;
    /* Loops call one size over and over. The planner's answer depends only
     * on the collective and the size (the plan is immutable), and the
     * explanation it logs comes with the first call of a size bucket, which
     * the remembered call already made: reuse the answer. One word, so
     * threads sharing the communicator read whole entries. */
    uint64_t key = (uint64_t)bytes < CHOICE_MAX_BYTES ? ((uint64_t)bytes + 1) << 3 : 0;
    uint64_t last = atomic_load_explicit(&comm->algo_last[kind], memory_order_relaxed);
    if (key != 0 && (last & ~(uint64_t)7) == key) {
        *ll_p = (int)((last >> 2) & 1);
        return (enum cfx_core_algo)(last & 3);
    }
    enum cfx_core_algo algo = plan_choice(comm, kind, bytes, ll_p);
    if (key != 0)
        atomic_store_explicit(&comm->algo_last[kind], key | (uint64_t)*ll_p << 2 | (uint64_t)algo,
                              memory_order_relaxed);
    return algo;
}

static void request(struct cfx_conn_request *reqs, int *n, struct cfxComm *comm, int peer,
                    enum cfx_conn_dir dir, int kind, struct cfx_connector **out_p)
{
    if (*out_p != NULL)
        return;
    reqs[(*n)++] = (struct cfx_conn_request){
        .comm = comm, .peer = peer, .dir = dir, .kind = kind, .out_p = out_p};
}

int cfx_core_algo_direct_requests(struct cfxComm *comm, struct cfx_conn_request *reqs)
{
    int n = 0;
    if (comm->nranks > CFX_DIRECT_MAX_RANKS || comm->direct_complete)
        return 0;
    /* Small slots: the direct allreduce is for small messages, and a rank
     * holds 2(n-1) of these FIFOs. */
    size_t slot =
        comm->slot_bytes < CFX_DIRECT_SLOT_BYTES ? comm->slot_bytes : CFX_DIRECT_SLOT_BYTES;
    for (int peer = 0; peer < comm->nranks; peer++) {
        if (peer == comm->rank)
            continue;
        int first = n;
        request(reqs, &n, comm, peer, CFX_CONN_SEND, CFX_CONN_KIND_DIRECT, &comm->direct.to[peer]);
        request(reqs, &n, comm, peer, CFX_CONN_RECV, CFX_CONN_KIND_DIRECT,
                &comm->direct.from[peer]);
        for (int i = first; i < n; i++)
            reqs[i].slot_bytes = slot;
    }
    /* Connectors stay until the communicator goes: no need to look again. */
    comm->direct_complete = n == 0;
    return n;
}

cfxResult_t cfx_core_algo_connect(struct cfxComm *comm)
{
    /* Only where the plan picks direct or two-shot at some size: GPU ranks,
     * whose model prefers the ring's LL at every size unless CFX_ALGO or
     * CFX_PROTO rule it out, hold no idle all-pairs FIFOs in device memory. */
    if (comm->plan == NULL || comm->nranks < 2 || comm->nranks > CFX_DIRECT_MAX_RANKS ||
        !(cfx_plan_may_pick(comm->plan, CFX_COLL_ALLREDUCE, CFX_ALGO_DIRECT) ||
          cfx_plan_may_pick(comm->plan, CFX_COLL_ALLREDUCE, CFX_ALGO_TWOSHOT)))
        return cfxSuccess;
    struct cfx_conn_request reqs[CFX_CORE_DIRECT_REQUESTS];
    int n = cfx_core_algo_direct_requests(comm, reqs);
    return cfx_core_connect_batch(reqs, n);
}

void cfx_core_algo_direct_op(struct cfxComm *comm, struct cfx_op *op)
{
    op->direct = &comm->direct;
    op->send_conn = op->recv_conn = NULL;
    op->n_conns = 0;
    for (int peer = 0; peer < comm->nranks && peer < CFX_DIRECT_MAX_RANKS; peer++) {
        if (peer == comm->rank)
            continue;
        op->conns[op->n_conns++] = comm->direct.to[peer];
        op->conns[op->n_conns++] = comm->direct.from[peer];
    }
}

/* The rank at the top of tree @p t. */
static int tree_root(struct cfxComm *comm, int t)
{
    return comm->plan->trees[t].root;
}

int cfx_core_algo_tree_requests(struct cfxComm *comm, int t, int root,
                                struct cfx_conn_request *reqs)
{
    int n = 0;
    {
        struct cfx_tree_links *links = &comm->trees[t];
        if (links->parent >= 0) {
            request(reqs, &n, comm, links->parent, CFX_CONN_SEND, CFX_CONN_KIND_TREE_UP(t),
                    &links->to_parent);
            request(reqs, &n, comm, links->parent, CFX_CONN_RECV, CFX_CONN_KIND_TREE_DOWN(t),
                    &links->from_parent);
        }
        for (int c = 0; c < links->n_children; c++) {
            request(reqs, &n, comm, links->children[c], CFX_CONN_RECV, CFX_CONN_KIND_TREE_UP(t),
                    &links->from_child[c]);
            request(reqs, &n, comm, links->children[c], CFX_CONN_SEND, CFX_CONN_KIND_TREE_DOWN(t),
                    &links->to_child[c]);
        }
    }
    int top = tree_root(comm, t);
    if (root >= 0 && root != top) {
        if (comm->rank == root) {
            request(reqs, &n, comm, top, CFX_CONN_SEND, CFX_CONN_KIND_RELAY_UP(t),
                    &comm->relay_send[t][top]);
            request(reqs, &n, comm, top, CFX_CONN_RECV, CFX_CONN_KIND_RELAY_DOWN(t),
                    &comm->relay_recv[t][top]);
        } else if (comm->rank == top) {
            request(reqs, &n, comm, root, CFX_CONN_RECV, CFX_CONN_KIND_RELAY_UP(t),
                    &comm->relay_recv[t][root]);
            request(reqs, &n, comm, root, CFX_CONN_SEND, CFX_CONN_KIND_RELAY_DOWN(t),
                    &comm->relay_send[t][root]);
        }
    }
    return n;
}

void cfx_core_algo_tree_op(struct cfxComm *comm, int t, struct cfx_op *op)
{
    struct cfx_tree_links *links = &comm->trees[t];
    op->tree = links;
    op->send_conn = op->recv_conn = NULL;
    int rooted = op->kind == CFX_COLL_BROADCAST || op->kind == CFX_COLL_REDUCE;
    int top = tree_root(comm, t);
    if (rooted && op->root != top) {
        /* The relay: at the call's root towards the tree root, and back. */
        int peer = comm->rank == op->root ? top : comm->rank == top ? op->root : -1;
        if (peer >= 0) {
            op->send_conn = comm->relay_send[t][peer];
            op->recv_conn = comm->relay_recv[t][peer];
        }
    }
    op->n_conns = 0;
    struct cfx_connector *all[4 + 2 * CFX_TREE_MAX_CHILDREN] = {
        links->to_parent, links->from_parent, op->send_conn, op->recv_conn};
    int n = 4;
    for (int c = 0; c < links->n_children; c++) {
        all[n++] = links->from_child[c];
        all[n++] = links->to_child[c];
    }
    for (int i = 0; i < n && op->n_conns < CFX_OP_MAX_CONNS; i++)
        if (all[i])
            op->conns[op->n_conns++] = all[i];
}

/* ------------------------------------------------------ group simulation */

double cfx_core_algo_predict_us(struct cfxComm *comm, const struct cfx_op *op)
{
    if (comm->plan == NULL || comm->nranks < 2)
        return 0;
    size_t bytes = op->count * cfx_type_size(op->type);
    if (op->kind == CFX_COLL_SEND || op->kind == CFX_COLL_RECV) {
        /* One hop of `bytes`: a ring allgather of nranks such blocks takes
         * nranks-1 of them. */
        double us = cfx_plan_predict_us(comm->plan, CFX_COLL_ALLGATHER, CFX_ALGO_RING,
                                        CFX_PROTO_SIMPLE, bytes * (size_t)comm->nranks);
        return isfinite(us) ? us / (comm->nranks - 1) : 0;
    }
    if (op->kind == CFX_COLL_ALLGATHER || op->kind == CFX_COLL_REDUCESCATTER)
        bytes *= (size_t)comm->nranks; /* The sizes the planner takes (nccl-tests'). */
    enum cfx_plan_algo algo = CFX_ALGO_RING;
    if (op->tree) {
        algo = CFX_ALGO_TREE;
        bytes *= 2; /* One half of the call; the other runs beside it on the second tree. */
    } else if (op->direct) {
        algo = op->twoshot ? CFX_ALGO_TWOSHOT : CFX_ALGO_DIRECT;
    }
    double us = cfx_plan_predict_us(comm->plan, op->kind, algo,
                                    op->ll ? CFX_PROTO_LL : CFX_PROTO_SIMPLE, bytes);
    return isfinite(us) ? us : 0;
}
