/*
 * Double binary trees across hosts, chains inside each host.
 *
 * Tree 0 is the in-order binary tree over host positions 1..N in which a
 * position's height is the number of trailing zero bits of its number: the
 * root is the largest power of two <= N, and the children of position p
 * (height h > 0) are p - 2^(h-1) and the largest p + 2^k <= N with k < h.
 * Odd positions (even 0-based indices) are the leaves, so the interior
 * hosts are exactly the odd 0-based indices, floor(N/2) of them, and the
 * depth is floor(log2 N).
 *
 * Tree 1 makes the other half interior: for an even N it is tree 0 mirrored
 * (index i -> N-1-i), for an odd N it is tree 0 shifted by one (i -> i+1
 * mod N). Either way no host is interior in both trees (Sanders, Speck and
 * Träff's two-tree idea as NCCL applies it), so each host's NIC carries the
 * traffic of at most one interior position; each tree carries half the data.
 */
#include <stdlib.h>
#include <string.h>

#include "src/plan/internal.h"
#include "src/util/error.h"
#include "src/util/log.h"

/* Children of 0-based position @p i in tree 0 over @p n positions. */
static void btree_children(int n, int i, int child[2])
{
    unsigned p = (unsigned)i + 1;
    int h = __builtin_ctz(p);
    child[0] = child[1] = -1;
    if (h == 0)
        return;
    child[0] = (int)(p - (1u << (h - 1))) - 1;
    for (int k = h - 1; k >= 0; k--)
        if (p + (1u << k) <= (unsigned)n) {
            child[1] = (int)(p + (1u << k)) - 1;
            break;
        }
}

static void tree0_parents(int n, int *parent)
{
    for (int i = 0; i < n; i++)
        parent[i] = -1;
    for (int i = 0; i < n; i++) {
        int child[2];
        btree_children(n, i, child);
        for (int k = 0; k < 2; k++)
            if (child[k] >= 0)
                parent[child[k]] = i;
    }
}

static void tree1_parents(int n, const int *parent0, int *parent1)
{
    for (int i = 0; i < n; i++) {
        if (n % 2 == 0) {
            int q = parent0[n - 1 - i];
            parent1[i] = q < 0 ? -1 : n - 1 - q;
        } else {
            int q = parent0[(i - 1 + n) % n];
            parent1[i] = q < 0 ? -1 : (q + 1) % n;
        }
    }
}

static int add_child(int *children, int rank)
{
    for (int k = 0; k < CFX_PLAN_TREE_MAX_CHILDREN; k++)
        if (children[k] < 0) {
            children[k] = rank;
            return 0;
        }
    return -1;
}

static int position_depth(const int *parent, int *depth, int p)
{
    if (depth[p] >= 0)
        return depth[p];
    int d = 0;
    for (int q = p; parent[q] >= 0 && d <= 64; q = parent[q])
        d++;
    depth[p] = d;
    return d;
}

cfxResult_t cfx_plan_trees_build(struct cfx_plan *plan, const int *node_nranks, int **chains[2])
{
    int n = plan->n_nodes;
    int *par[2] = {calloc((size_t)n, sizeof(int)), calloc((size_t)n, sizeof(int))};
    int *pdepth = calloc((size_t)n, sizeof(int));
    int *n_children = calloc((size_t)n * 2, sizeof(int));
    cfxResult_t res = cfxSuccess;
    if (!par[0] || !par[1] || !pdepth || !n_children) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for trees");
        goto out;
    }
    tree0_parents(n, par[0]);
    tree1_parents(n, par[0], par[1]);
    for (int t = 0; t < 2; t++) {
        struct cfx_plan_tree *tree = &plan->trees[t];
        tree->parent = malloc((size_t)plan->n_ranks * sizeof(int));
        tree->children = malloc((size_t)plan->n_ranks * sizeof(*tree->children));
        if (tree->parent == NULL || tree->children == NULL) {
            res = cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for trees");
            goto out;
        }
        for (int r = 0; r < plan->n_ranks; r++) {
            tree->parent[r] = -1;
            for (int k = 0; k < CFX_PLAN_TREE_MAX_CHILDREN; k++)
                tree->children[r][k] = -1;
        }
        for (int p = 0; p < n; p++)
            pdepth[p] = -1;
        tree->depth = 0;
        tree->net_depth = 0;
        tree->root = -1;
        /* Chains inside hosts: head first. */
        for (int p = 0; p < n; p++) {
            int node = plan->node_order[p];
            const int *chain = chains[t][node];
            int len = node_nranks[node];
            for (int i = 1; i < len; i++) {
                tree->parent[chain[i]] = chain[i - 1];
                add_child(tree->children[chain[i - 1]], chain[i]);
            }
        }
        /* Hosts: heads join the host tree, in position order. */
        for (int p = 0; p < n; p++) {
            int node = plan->node_order[p];
            int head = chains[t][node][0];
            int up = par[t][p];
            if (up < 0) {
                tree->root = head;
            } else {
                int up_head = chains[t][plan->node_order[up]][0];
                tree->parent[head] = up_head;
                if (add_child(tree->children[up_head], head) != 0) {
                    res = cfx_error_set(cfxInternalError, CFX_LOG_GRAPH,
                                        "tree %d: rank %d has too many children", t, up_head);
                    goto out;
                }
                n_children[up * 2 + t]++;
            }
            int d = position_depth(par[t], pdepth, p);
            if (d > tree->net_depth)
                tree->net_depth = d;
            if (d + node_nranks[node] - 1 > tree->depth)
                tree->depth = d + node_nranks[node] - 1;
        }
    }
    /* NIC bytes per byte of data at the busiest host (each tree: half). */
    double f_allreduce = 0, f_bcast = 0;
    for (int p = 0; n > 1 && p < n; p++) {
        int up = (par[0][p] >= 0) + (par[1][p] >= 0);
        int down = n_children[p * 2] + n_children[p * 2 + 1];
        if (0.5 * (up + down) > f_allreduce)
            f_allreduce = 0.5 * (up + down);
        double busiest = 0.5 * (up > down ? up : down);
        if (busiest > f_bcast)
            f_bcast = busiest;
    }
    /* Bytes the busiest rank reduces per byte of data: S/2 per child per tree. */
    double f_reduce = 0;
    for (int r = 0; r < plan->n_ranks; r++) {
        int children = 0;
        for (int t = 0; t < 2; t++)
            for (int k = 0; k < CFX_PLAN_TREE_MAX_CHILDREN; k++)
                children += plan->trees[t].children[r][k] >= 0;
        if (0.5 * children > f_reduce)
            f_reduce = 0.5 * children;
    }
    plan->model.tree_reduce_factor = f_reduce;
    plan->model.tree_net_factor[0] = f_allreduce;
    plan->model.tree_net_factor[1] = f_bcast;
    plan->model.tree_net_depth = plan->trees[0].net_depth > plan->trees[1].net_depth
                                     ? plan->trees[0].net_depth
                                     : plan->trees[1].net_depth;
out:
    free(par[0]);
    free(par[1]);
    free(pdepth);
    free(n_children);
    return res;
}
