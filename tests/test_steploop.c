/*
 * Every schedule through the step loop a kernel runs (src/coll/steploop.h,
 * compiled here as host code): 1 to 8 ranks in one thread, each rank a work
 * descriptor and a peer table of FIFO views over host memory, driven round
 * robin until every rank is done. Results are checked against a reference
 * computed directly; a round in which no rank can move is a deadlock and
 * fails naming each stuck rank's step. Also: slot counts and sizes that
 * force many chunks, in-place buffers, Avg and PreMulSum finishes, and a
 * mismatched fingerprint reported as a status on the right connector.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/reduce.h"
#include "src/coll/steploop.h"

#define MAX_RANKS 8
/* Per rank: up to two work descriptors (point to point runs a send and a receive). */
#define MAX_LOOPS (2 * MAX_RANKS)

struct rank_state {
    struct cfx_work work;
    struct cfx_conn conns[CFX_OP_MAX_CONNS];
    struct cfx_steploop loop;
};

struct world {
    int nranks;
    int n_steps;       /* FIFO depth. */
    size_t slot_bytes; /* Slot size. */
    struct rank_state st[MAX_LOOPS];
    void *blocks[4 * MAX_RANKS * MAX_RANKS]; /* FIFO memory, freed at the end. */
    int n_blocks;
};

/* Tests of the LL protocol set this: every FIFO gets LL slots (2: every
 * other one), and every operation but the single-copy ones runs LL. */
static int g_ll;

/* A FIFO from loop @p a (producer) to loop @p b (consumer); *ia_p and
 * *ib_p receive the indices in their peer tables. */
static void fifo_between(struct world *wd, int a, int b, int8_t *ia_p, int8_t *ib_p)
{
    size_t slots_end = cfx_fifo_slots_offset() + (size_t)wd->n_steps * wd->slot_bytes;
    size_t ll_at = (slots_end + 63) & ~(size_t)63;
    size_t bytes = g_ll ? ll_at + (size_t)wd->n_steps * CFX_LL_SLOT_BYTES : slots_end;
    void *block = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
    cr_assert_not_null(block);
    memset(block, 0, bytes);
    wd->blocks[wd->n_blocks++] = block;
    struct cfx_fifo *fifo = block;
    char *slots = (char *)block + cfx_fifo_slots_offset();
    struct rank_state *sa = &wd->st[a], *sb = &wd->st[b];
    cr_assert(sa->work.n_conns < CFX_OP_MAX_CONNS && sb->work.n_conns < CFX_OP_MAX_CONNS);
    *ia_p = (int8_t)sa->work.n_conns++;
    *ib_p = (int8_t)sb->work.n_conns++;
    cfx_fifo_view(&sa->conns[*ia_p], fifo, slots, wd->slot_bytes, wd->n_steps);
    cfx_fifo_view(&sb->conns[*ib_p], fifo, slots, wd->slot_bytes, wd->n_steps);
    /* g_ll 2: every other FIFO only (an LL operation over connectors of
     * both kinds, as where some peers are over the network). */
    if (g_ll == 1 || (g_ll == 2 && wd->n_blocks % 2 == 0))
        sa->conns[*ia_p].ll = sb->conns[*ib_p].ll = (uint64_t *)((char *)block + ll_at);
}

static void world_free(struct world *wd)
{
    for (int i = 0; i < wd->n_blocks; i++)
        free(wd->blocks[i]);
    wd->n_blocks = 0;
}

/* Every loop's work: shape, fingerprints, no links yet. */
static void world_init(struct world *wd, int n_loops, int nranks, int n_steps, size_t slot_bytes)
{
    memset(wd, 0, sizeof(*wd));
    wd->nranks = nranks;
    wd->n_steps = n_steps;
    wd->slot_bytes = slot_bytes;
    for (int i = 0; i < n_loops; i++) {
        struct cfx_work *w = &wd->st[i].work;
        memset(&w->links, CFX_NO_CONN, sizeof(w->links));
        w->links.tree_root = 0;
        w->links.n_children = 0;
        w->links.relay_slots = 0;
    }
}

static void set_work(struct cfx_work *w, enum cfx_sched algo, enum cfx_coll_kind kind,
                     cfxDataType_t type, cfxRedOp_t redop, int rank, int nranks, int root,
                     uint64_t count, const void *sendbuff, void *recvbuff)
{
    w->algo = (uint8_t)algo;
    w->kind = (uint8_t)kind;
    w->type = (uint8_t)type;
    w->redop = (uint8_t)redop;
    w->rank = rank;
    w->nranks = nranks;
    w->root = root;
    w->count = count;
    w->pitch = 0; /* Blocks side by side (cfx_work_finish). */
    w->elem_bytes = type == cfxFloat64 ? 8 : 4;
    w->sendbuff = sendbuff;
    w->recvbuff = recvbuff;
    w->check_prints = 1;
    struct cfx_fingerprint print = {.seq = 42,
                                    .count = count,
                                    .root = root,
                                    .kind = (uint8_t)(kind == CFX_COLL_RECV ? CFX_COLL_SEND : kind),
                                    .type = (uint8_t)type,
                                    .op = (uint8_t)redop,
                                    .valid = 1};
    w->print = print;
    w->expect = print;
}

/* Drives loops [0, n_loops) until all are done. Returns the first failure
 * status, or 0; a round without progress fails the test naming the steps. */
static int drive(struct world *wd, int n_loops)
{
    for (int i = 0; i < n_loops; i++) {
        uint8_t algo = wd->st[i].work.algo;
        if (g_ll && algo != CFX_SCHED_PULL_ALLGATHER && algo != CFX_SCHED_PULL_SEND &&
            algo != CFX_SCHED_PULL_RECV)
            wd->st[i].work.proto = CFX_WORK_PROTO_LL;
        cfx_work_finish(&wd->st[i].work, wd->slot_bytes);
        cfx_steploop_init(&wd->st[i].loop, &wd->st[i].work, wd->st[i].conns);
    }
    for (;;) {
        int ran = 0, done = 0;
        for (int i = 0; i < n_loops; i++) {
            struct cfx_steploop *l = &wd->st[i].loop;
            ran += cfx_steploop_progress(l);
            if (l->status > CFX_STEPLOOP_DONE)
                return l->status;
            done += l->status == CFX_STEPLOOP_DONE;
        }
        if (done == n_loops) {
            /* Every slot posted was taken: the ranks agreed on every step. */
            for (int b = 0; b < wd->n_blocks; b++) {
                const struct cfx_fifo *f = wd->blocks[b];
                cr_assert_eq(f->tail, f->head,
                             "%s: a FIFO ends with %llu slots posted and %llu taken",
                             cfx_schedule_name(wd->st[0].work.algo), (unsigned long long)f->tail,
                             (unsigned long long)f->head);
            }
            return 0;
        }
        if (ran == 0) {
            char text[512] = "";
            for (int i = 0; i < n_loops; i++) {
                const struct cfx_steploop *l = &wd->st[i].loop;
                char one[64];
                snprintf(one, sizeof(one), " [%d: %s step %llu/%llu]", i,
                         cfx_schedule_name(l->work->algo), (unsigned long long)l->step,
                         (unsigned long long)l->work->n_steps);
                strncat(text, one, sizeof(text) - strlen(text) - 1);
            }
            cr_assert_fail("deadlock: no loop can move:%s", text);
            return -1;
        }
    }
}

/* ------------------------------------------------------------ references */

static int32_t input_value(int rank, uint64_t i, cfxRedOp_t redop)
{
    if (redop == cfxProd)
        return 1 + (int32_t)((rank + i) % 2);
    return (int32_t)((rank * 7 + i * 3) % 11) - 5;
}

static int32_t fold_int(int32_t a, int32_t b, cfxRedOp_t redop)
{
    switch (redop) {
    case cfxProd: return a * b;
    case cfxMax: return a > b ? a : b;
    case cfxMin: return a < b ? a : b;
    default: return a + b;
    }
}

/* Ring connectivity: loop r sends to r+1, receives from r-1. */
static void ring_links(struct world *wd, int n)
{
    for (int r = 0; r < n; r++) {
        int8_t s, v;
        fifo_between(wd, r, (r + 1) % n, &s, &v);
        wd->st[r].work.links.send = s;
        wd->st[(r + 1) % n].work.links.recv = v;
    }
}

/* ---------------------------------------------------- reduction families */

enum family { RING_AR, TREE_AR, DIRECT_AR, TWOSHOT_AR, CHAIN_REDUCE, TREE_REDUCE, RING_RS };

/* Tree with @p arity children per rank, rooted at rank 0, plus the relay
 * between the call's @p root and rank 0 when they differ. */
static void tree_links(struct world *wd, int n, int arity, int root)
{
    for (int r = 1; r < n; r++) {
        int parent = (r - 1) / arity;
        struct cfx_links *c = &wd->st[r].work.links, *p = &wd->st[parent].work.links;
        int k = p->n_children++;
        fifo_between(wd, r, parent, &c->to_parent, &p->from_child[k]);
        fifo_between(wd, parent, r, &p->to_child[k], &c->from_parent);
    }
    wd->st[0].work.links.tree_root = 1;
    if (root != 0 && n > 1) {
        struct cfx_links *at_root = &wd->st[root].work.links, *top = &wd->st[0].work.links;
        fifo_between(wd, root, 0, &at_root->send, &top->recv);
        fifo_between(wd, 0, root, &top->send, &at_root->recv);
        at_root->relay_slots = (uint32_t)wd->n_steps;
        top->relay_slots = (uint32_t)wd->n_steps;
    }
}

static void direct_links(struct world *wd, int n)
{
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++)
            if (a != b)
                fifo_between(wd, a, b, &wd->st[a].work.links.to[b], &wd->st[b].work.links.from[a]);
}

static void run_reduction(enum family fam, int n, uint64_t count, cfxRedOp_t redop, int in_place,
                          int n_steps, size_t slot_bytes, int arity, int root)
{
    static struct world wd;
    world_init(&wd, n, n, n_steps, slot_bytes);
    int rs = fam == RING_RS;
    uint64_t in_count = rs ? count * (uint64_t)n : count;
    int32_t *in[MAX_RANKS], *out[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        in[r] = malloc((in_count + 1) * sizeof(int32_t));
        out[r] = malloc((count + 1) * sizeof(int32_t));
        for (uint64_t i = 0; i < in_count; i++)
            in[r][i] = input_value(r, i, redop);
        for (uint64_t i = 0; i < count; i++)
            out[r][i] = -999;
    }
    enum cfx_sched algo = fam == RING_AR        ? CFX_SCHED_RING_ALLREDUCE
                          : fam == TREE_AR      ? CFX_SCHED_TREE
                          : fam == DIRECT_AR    ? CFX_SCHED_DIRECT_ALLREDUCE
                          : fam == TWOSHOT_AR   ? CFX_SCHED_TWOSHOT_ALLREDUCE
                          : fam == CHAIN_REDUCE ? CFX_SCHED_CHAIN_REDUCE
                          : fam == TREE_REDUCE  ? CFX_SCHED_TREE
                                                : CFX_SCHED_RING_REDUCESCATTER;
    enum cfx_coll_kind kind = (fam == CHAIN_REDUCE || fam == TREE_REDUCE) ? CFX_COLL_REDUCE
                              : rs                                        ? CFX_COLL_REDUCESCATTER
                                                                          : CFX_COLL_ALLREDUCE;
    if (n == 1)
        algo = CFX_SCHED_LOCAL_COPY;
    for (int r = 0; r < n; r++) {
        void *recv = in_place ? (rs ? (void *)(in[r] + (uint64_t)r * count) : (void *)in[r])
                              : (void *)out[r];
        set_work(&wd.st[r].work, algo, kind, cfxInt32, redop, r, n,
                 kind == CFX_COLL_REDUCE ? root : -1, count, in[r], recv);
    }
    if (n > 1) {
        if (fam == RING_AR || fam == CHAIN_REDUCE || fam == RING_RS)
            ring_links(&wd, n);
        else if (fam == DIRECT_AR || fam == TWOSHOT_AR)
            direct_links(&wd, n);
        else
            tree_links(&wd, n, arity, kind == CFX_COLL_REDUCE ? root : 0);
    }
    int status = drive(&wd, n);
    cr_assert_eq(status, 0, "%s on %d ranks, count %llu: status %d",
                 cfx_schedule_name(wd.st[0].work.algo), n, (unsigned long long)count, status);
    /* Reference: the fold over every rank's input (computed before running
     * in place, from the same formula). */
    for (int r = 0; r < n; r++) {
        if (kind == CFX_COLL_REDUCE && r != root)
            continue;
        const int32_t *got = (const int32_t *)wd.st[r].work.recvbuff;
        for (uint64_t i = 0; i < count; i++) {
            uint64_t at = rs ? (uint64_t)r * count + i : i;
            int32_t want = input_value(0, at, redop);
            for (int q = 1; q < n; q++)
                want = fold_int(want, input_value(q, at, redop), redop);
            if (got[i] != want)
                cr_assert_fail(
                    "%s on %d ranks, count %llu, op %d%s: rank %d element %llu is %d, not %d",
                    cfx_schedule_name(wd.st[r].work.algo), n, (unsigned long long)count, (int)redop,
                    in_place ? " in place" : "", r, (unsigned long long)i, got[i], want);
            if (got[i] != want)
                break;
        }
    }
    for (int r = 0; r < n; r++) {
        free(in[r]);
        free(out[r]);
    }
    world_free(&wd);
}

static const uint64_t counts[] = {0, 1, 7, 300, 4099};

/* An allgather and a reduce-scatter of @p count per rank on @p n ranks run
 * as @p parts parts, as a GPU communicator cuts them over its rings: part
 * c moves the same elements of every rank's block (sendbuff and recvbuff
 * moved by its first element, count its share, pitch the whole count);
 * each part runs alone (on rings of its own they are independent), and
 * together they write every block whole, in and out of place. */
static void run_parts_with_a_pitch(int n, uint64_t count, int parts, int in_place)
{
    static struct world wd;
    uint64_t all = count * (uint64_t)n;
    int32_t *ag_in[MAX_RANKS], *ag_out[MAX_RANKS], *rs_in[MAX_RANKS], *rs_out[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        ag_out[r] = malloc(all * sizeof(int32_t));
        rs_in[r] = malloc(all * sizeof(int32_t));
        rs_out[r] = malloc(count * sizeof(int32_t));
        for (uint64_t i = 0; i < all; i++) {
            ag_out[r][i] = -999;
            rs_in[r][i] = input_value(r, i, cfxSum);
        }
        ag_in[r] = in_place ? ag_out[r] + (uint64_t)r * count : malloc(count * sizeof(int32_t));
        for (uint64_t i = 0; i < count; i++) {
            ag_in[r][i] = input_value(r, i, cfxSum);
            rs_out[r][i] = -999;
        }
    }
    uint64_t per = count / (uint64_t)parts, at = 0;
    for (int c = 0; c < parts; c++, at += per) {
        uint64_t len = c == parts - 1 ? count - at : per;
        for (int rs = 0; rs < 2; rs++) {
            world_init(&wd, n, n, 4, 64);
            for (int r = 0; r < n; r++) {
                struct cfx_work *w = &wd.st[r].work;
                if (rs)
                    set_work(w, CFX_SCHED_RING_REDUCESCATTER, CFX_COLL_REDUCESCATTER, cfxInt32,
                             cfxSum, r, n, -1, len, rs_in[r] + at, rs_out[r] + at);
                else
                    set_work(w, CFX_SCHED_RING_ALLGATHER, CFX_COLL_ALLGATHER, cfxInt32, cfxSum, r,
                             n, -1, len, ag_in[r] + at, ag_out[r] + at);
                w->pitch = count;
            }
            ring_links(&wd, n);
            int status = drive(&wd, n);
            cr_assert_eq(status, 0, "part %d of %s on %d ranks: status %d", c,
                         rs ? "reduce-scatter" : "allgather", n, status);
            world_free(&wd);
        }
    }
    for (int r = 0; r < n; r++) {
        for (uint64_t i = 0; i < all; i++) {
            int32_t want = input_value((int)(i / count), i % count, cfxSum);
            cr_assert_eq(ag_out[r][i], want,
                         "allgather, %d parts on %d ranks%s: rank %d element %llu is %d, not %d",
                         parts, n, in_place ? " in place" : "", r, (unsigned long long)i,
                         ag_out[r][i], want);
        }
        for (uint64_t i = 0; i < count; i++) {
            uint64_t x = (uint64_t)r * count + i;
            int32_t want = 0;
            for (int q = 0; q < n; q++)
                want += input_value(q, x, cfxSum);
            cr_assert_eq(rs_out[r][i], want,
                         "reduce-scatter, %d parts on %d ranks: rank %d element %llu is %d, not %d",
                         parts, n, r, (unsigned long long)i, rs_out[r][i], want);
        }
        if (!in_place)
            free(ag_in[r]);
        free(ag_out[r]);
        free(rs_in[r]);
        free(rs_out[r]);
    }
}

Test(steploop, ring_allgather_and_reducescatter_in_parts_a_pitch_apart)
{
    for (int n = 2; n <= MAX_RANKS; n += 3)
        for (int parts = 1; parts <= 5; parts += 2)
            for (int in_place = 0; in_place < 2; in_place++)
                run_parts_with_a_pitch(n, 1003, parts, in_place);
}

static void ring_allreduce_every_size_1_to_8_ranks(void)
{
    for (int n = 1; n <= MAX_RANKS; n++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (int in_place = 0; in_place < 2; in_place++)
                run_reduction(RING_AR, n, counts[c], cfxSum, in_place, 4, 256, 2, 0);
}

Test(steploop, ring_allreduce_every_size_1_to_8_ranks)
{
    ring_allreduce_every_size_1_to_8_ranks();
}

Test(steploop_ll, ring_allreduce_every_size_1_to_8_ranks)
{
    g_ll = 1;
    ring_allreduce_every_size_1_to_8_ranks();
}

static void ring_allreduce_ops_and_fifo_depths(void)
{
    cfxRedOp_t ops[] = {cfxSum, cfxProd, cfxMax, cfxMin};
    for (int n = 2; n <= MAX_RANKS; n += 3)
        for (int o = 0; o < 4; o++)
            for (int depth = 2; depth <= 8; depth *= 2) /* CFX_STEPS is at least 2. */
                run_reduction(RING_AR, n, 1000, ops[o], 0, depth, 64, 2, 0);
}

Test(steploop, ring_allreduce_ops_and_fifo_depths)
{
    ring_allreduce_ops_and_fifo_depths();
}

Test(steploop_ll, ring_allreduce_ops_and_fifo_depths)
{
    g_ll = 1;
    ring_allreduce_ops_and_fifo_depths();
}

static void tree_allreduce_binary_and_ternary(void)
{
    for (int n = 1; n <= MAX_RANKS; n++)
        for (int arity = 2; arity <= CFX_TREE_MAX_CHILDREN; arity++)
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
                for (int in_place = 0; in_place < 2; in_place++)
                    run_reduction(TREE_AR, n, counts[c], cfxSum, in_place, 2, 128, arity, 0);
}

Test(steploop, tree_allreduce_binary_and_ternary)
{
    tree_allreduce_binary_and_ternary();
}

Test(steploop_ll, tree_allreduce_binary_and_ternary)
{
    g_ll = 1;
    tree_allreduce_binary_and_ternary();
}

static void direct_allreduce_folds_in_rank_order(void)
{
    for (int n = 1; n <= MAX_RANKS; n++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (int in_place = 0; in_place < 2; in_place++)
                run_reduction(DIRECT_AR, n, counts[c], c % 2 ? cfxMax : cfxSum, in_place, 4, 256, 2,
                              0);
}

Test(steploop, direct_allreduce_folds_in_rank_order)
{
    direct_allreduce_folds_in_rank_order();
}

Test(steploop_ll, direct_allreduce_folds_in_rank_order)
{
    g_ll = 1;
    direct_allreduce_folds_in_rank_order();
}

/* Segments of every shape (empty ones at counts below n, uneven ones),
 * one round and many (64-byte slots: 16 elements per chunk), FIFOs of the
 * least depth CFX_STEPS allows and deeper, in and out of place. */
static void twoshot_allreduce_every_size_and_depth(void)
{
    for (int n = 1; n <= MAX_RANKS; n++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (int in_place = 0; in_place < 2; in_place++)
                for (int depth = 2; depth <= 4; depth += 2)
                    run_reduction(TWOSHOT_AR, n, counts[c], c % 2 ? cfxMax : cfxSum, in_place,
                                  depth, depth == 2 ? 64 : 256, 2, 0);
}

Test(steploop, twoshot_allreduce_every_size_and_depth)
{
    twoshot_allreduce_every_size_and_depth();
}

Test(steploop_ll, twoshot_allreduce_every_size_and_depth)
{
    g_ll = 1;
    twoshot_allreduce_every_size_and_depth();
}

static void chain_and_tree_reduce_every_root(void)
{
    for (int n = 1; n <= MAX_RANKS; n++)
        for (int root = 0; root < n; root++)
            for (size_t c = 1; c < sizeof(counts) / sizeof(counts[0]); c++) {
                run_reduction(CHAIN_REDUCE, n, counts[c], cfxSum, 0, 4, 256, 2, root);
                run_reduction(TREE_REDUCE, n, counts[c], cfxSum, 0, 2, 128, 2, root);
            }
}

Test(steploop, chain_and_tree_reduce_every_root)
{
    chain_and_tree_reduce_every_root();
}

Test(steploop_ll, chain_and_tree_reduce_every_root)
{
    g_ll = 1;
    chain_and_tree_reduce_every_root();
}

static void ring_reducescatter_every_size(void)
{
    for (int n = 1; n <= MAX_RANKS; n++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (int in_place = 0; in_place < 2; in_place++)
                run_reduction(RING_RS, n, counts[c], cfxSum, in_place, 4, 256, 2, 0);
}

Test(steploop, ring_reducescatter_every_size)
{
    ring_reducescatter_every_size();
}

Test(steploop_ll, ring_reducescatter_every_size)
{
    g_ll = 1;
    ring_reducescatter_every_size();
}

/* ------------------------------------------------------ data movement only */

enum move { CHAIN_BCAST, TREE_BCAST, RING_AG, PULL_AG, P2P, PULL_P2P };

static void run_move(enum move mv, int n, uint64_t count, int root, int n_steps, size_t slot_bytes)
{
    static struct world wd;
    int p2p = mv == P2P || mv == PULL_P2P;
    int n_loops = p2p ? 2 * n : n;
    world_init(&wd, n_loops, n, n_steps, slot_bytes);
    int gather = mv == RING_AG || mv == PULL_AG;
    uint64_t out_count = gather ? count * (uint64_t)n : count;
    int32_t *in[MAX_RANKS], *out[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        in[r] = malloc((count + 1) * sizeof(int32_t));
        out[r] = malloc((out_count + 1) * sizeof(int32_t));
        for (uint64_t i = 0; i < count; i++)
            in[r][i] = (int32_t)(r * 100000 + (int)i);
        for (uint64_t i = 0; i < out_count; i++)
            out[r][i] = -1;
    }
    for (int r = 0; r < n; r++) {
        switch (mv) {
        case CHAIN_BCAST:
        case TREE_BCAST:
            set_work(&wd.st[r].work,
                     n == 1              ? CFX_SCHED_LOCAL_COPY
                     : mv == CHAIN_BCAST ? CFX_SCHED_CHAIN_BROADCAST
                                         : CFX_SCHED_TREE,
                     CFX_COLL_BROADCAST, cfxInt32, cfxSum, r, n, root, count, in[r], out[r]);
            break;
        case RING_AG:
        case PULL_AG:
            set_work(&wd.st[r].work,
                     n == 1          ? CFX_SCHED_LOCAL_COPY
                     : mv == RING_AG ? CFX_SCHED_RING_ALLGATHER
                                     : CFX_SCHED_PULL_ALLGATHER,
                     CFX_COLL_ALLGATHER, cfxInt32, cfxSum, r, n, -1, count, in[r], out[r]);
            break;
        case P2P:
        case PULL_P2P:
            /* Loop r sends to r+1; loop n+r receives from r-1. */
            set_work(&wd.st[r].work, mv == P2P ? CFX_SCHED_P2P_SEND : CFX_SCHED_PULL_SEND,
                     CFX_COLL_SEND, cfxInt32, cfxSum, r, n, (r + 1) % n, count, in[r], NULL);
            set_work(&wd.st[n + r].work, mv == P2P ? CFX_SCHED_P2P_RECV : CFX_SCHED_PULL_RECV,
                     CFX_COLL_RECV, cfxInt32, cfxSum, r, n, (r + n - 1) % n, count, NULL, out[r]);
            break;
        }
    }
    if (p2p) {
        for (int r = 0; r < n; r++) {
            int8_t s, v;
            fifo_between(&wd, r, n + (r + 1) % n, &s, &v);
            wd.st[r].work.links.send = s;
            wd.st[n + (r + 1) % n].work.links.recv = v;
        }
        /* Fingerprints carry the receiver's peer as the sender's root. */
        for (int r = 0; r < n; r++)
            wd.st[n + r].work.expect.root = r;
    } else if (n > 1) {
        if (mv == TREE_BCAST)
            tree_links(&wd, n, 2, root);
        else
            ring_links(&wd, n);
    }
    int status = drive(&wd, n_loops);
    cr_assert_eq(status, 0, "%s on %d ranks, count %llu: status %d",
                 cfx_schedule_name(wd.st[0].work.algo), n, (unsigned long long)count, status);
    for (int r = 0; r < n; r++) {
        for (uint64_t i = 0; i < out_count; i++) {
            int src = gather ? (int)(i / (count ? count : 1)) : p2p ? (r + n - 1) % n : root;
            uint64_t at = gather ? i % count : i;
            int32_t want = (int32_t)(src * 100000 + (int)at);
            if (out[r][i] != want) {
                cr_assert_fail(
                    "%s on %d ranks, count %llu, root %d: rank %d element %llu is %d, not %d",
                    cfx_schedule_name(wd.st[r].work.algo), n, (unsigned long long)count, root, r,
                    (unsigned long long)i, out[r][i], want);
                break;
            }
        }
    }
    for (int r = 0; r < n; r++) {
        free(in[r]);
        free(out[r]);
    }
    world_free(&wd);
}

static void chain_and_tree_broadcast_every_root(void)
{
    for (int n = 1; n <= MAX_RANKS; n++)
        for (int root = 0; root < n; root++)
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
                run_move(CHAIN_BCAST, n, counts[c], root, 4, 256);
                run_move(TREE_BCAST, n, counts[c], root, 2, 128);
            }
}

Test(steploop, chain_and_tree_broadcast_every_root)
{
    chain_and_tree_broadcast_every_root();
}

Test(steploop_ll, chain_and_tree_broadcast_every_root)
{
    g_ll = 1;
    chain_and_tree_broadcast_every_root();
}

static void ring_and_single_copy_allgather(void)
{
    for (int n = 1; n <= MAX_RANKS; n++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            run_move(RING_AG, n, counts[c], 0, 4, 256);
            run_move(PULL_AG, n, counts[c], 0, 2, 256);
        }
}

Test(steploop, ring_and_single_copy_allgather)
{
    ring_and_single_copy_allgather();
}

Test(steploop_ll, ring_and_single_copy_allgather)
{
    g_ll = 1;
    ring_and_single_copy_allgather();
}

static void send_recv_ring_of_pairs(void)
{
    for (int n = 2; n <= MAX_RANKS; n++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            run_move(P2P, n, counts[c], 0, 2, 64);
            run_move(PULL_P2P, n, counts[c], 0, 2, 64);
        }
}

Test(steploop, send_recv_ring_of_pairs)
{
    send_recv_ring_of_pairs();
}

Test(steploop_ll, send_recv_ring_of_pairs)
{
    g_ll = 1;
    send_recv_ring_of_pairs();
}

/* ---------------------------------------------------------- the finishes */

static void avg_and_premulsum_finish_once_on_every_rank(void)
{
    static struct world wd;
    for (int premul = 0; premul < 2; premul++) {
        int n = 4;
        uint64_t count = 500;
        world_init(&wd, n, n, 4, 128);
        float *in[4], *out[4];
        for (int r = 0; r < n; r++) {
            in[r] = malloc(count * sizeof(float));
            out[r] = malloc(count * sizeof(float));
            for (uint64_t i = 0; i < count; i++)
                in[r][i] = (float)(r + (int)(i % 5));
            set_work(&wd.st[r].work, CFX_SCHED_RING_ALLREDUCE, CFX_COLL_ALLREDUCE, cfxFloat32,
                     cfxAvg, r, n, -1, count, in[r], out[r]);
            wd.st[r].work.premul = (uint8_t)premul;
            float scalar = 0.5f;
            memcpy(&wd.st[r].work.premul_bits, &scalar, sizeof(scalar));
        }
        ring_links(&wd, n);
        cr_assert_eq(drive(&wd, n), 0);
        for (int r = 0; r < n; r++)
            for (uint64_t i = 0; i < count; i++) {
                float sum = (float)(0 + 1 + 2 + 3 + 4 * (int)(i % 5));
                float want = premul ? sum * 0.5f : sum / 4.0f;
                cr_assert_eq(out[r][i], want, "%s: rank %d element %llu is %g, not %g",
                             premul ? "premulsum" : "avg", r, (unsigned long long)i, out[r][i],
                             want);
            }
        for (int r = 0; r < n; r++) {
            free(in[r]);
            free(out[r]);
        }
        world_free(&wd);
    }
}

Test(steploop, avg_and_premulsum_finish_once_on_every_rank)
{
    avg_and_premulsum_finish_once_on_every_rank();
}

Test(steploop_ll, avg_and_premulsum_finish_once_on_every_rank)
{
    g_ll = 1;
    avg_and_premulsum_finish_once_on_every_rank();
}

/* ------------------------------------------------------------- mismatch */

static void mismatched_fingerprint_stops_the_loop_on_its_connector(void)
{
    static struct world wd;
    int n = 3;
    uint64_t count = 100;
    world_init(&wd, n, n, 4, 128);
    int32_t buf[3][100];
    for (int r = 0; r < n; r++)
        set_work(&wd.st[r].work, CFX_SCHED_RING_ALLREDUCE, CFX_COLL_ALLREDUCE, cfxInt32, cfxSum, r,
                 n, -1, count, buf[r], buf[r]);
    /* Rank 1 calls a max where the others call a sum. */
    wd.st[1].work.redop = cfxMax;
    wd.st[1].work.print.op = wd.st[1].work.expect.op = cfxMax;
    ring_links(&wd, n);
    int status = drive(&wd, n);
    cr_assert_eq(status, CFX_STEPLOOP_MISMATCH, "status %d", status);
    /* The loop that stopped names its receive connector. */
    int found = 0;
    for (int r = 0; r < n; r++)
        if (wd.st[r].loop.status == CFX_STEPLOOP_MISMATCH) {
            cr_assert_eq(wd.st[r].loop.failed_conn, wd.st[r].work.links.recv);
            found = 1;
        }
    cr_assert(found);
    world_free(&wd);
}

Test(steploop, mismatched_fingerprint_stops_the_loop_on_its_connector)
{
    mismatched_fingerprint_stops_the_loop_on_its_connector();
}

Test(steploop_ll, mismatched_fingerprint_stops_the_loop_on_its_connector)
{
    g_ll = 1;
    mismatched_fingerprint_stops_the_loop_on_its_connector();
}

/* ------------------------------------------- the data split (vector path) */

/* One step's data, split over @p nthreads threads (each its share, as a
 * block or a team of blocks runs it), against the same plan run element
 * by element on one thread. */
static void check_split(const struct cfx_work *w, struct cfx_steploop_plan *p, char *out,
                        char *slot_out, char *ref_out, char *ref_slot, size_t bytes,
                        unsigned nthreads, const char *what)
{
    memset(out, 0xa5, bytes);
    memset(slot_out, 0xa5, bytes);
    memset(ref_out, 0xa5, bytes);
    memset(ref_slot, 0xa5, bytes);
    struct cfx_steploop_plan ref = *p;
    char *want_out = p->out ? ref_out : 0, *want_slot = p->slot_out ? ref_slot : 0;
    ref.out = want_out;
    ref.slot_out = want_slot;
    switch (w->type) {
#define REF_TYPE(enumv, name, T)                                                                   \
    case enumv: {                                                                                  \
        T scalar;                                                                                  \
        memcpy(&scalar, &w->premul_bits, sizeof(T));                                               \
        switch (w->redop) {                                                                        \
        case cfxProd: CFX_SL_LOOP((&ref), w, name, T, cfx_prod_##name, 0, 0, 1, scalar); break;    \
        case cfxMax: CFX_SL_LOOP((&ref), w, name, T, cfx_max_##name, 0, 0, 1, scalar); break;      \
        case cfxMin: CFX_SL_LOOP((&ref), w, name, T, cfx_min_##name, 0, 0, 1, scalar); break;      \
        default: CFX_SL_LOOP((&ref), w, name, T, cfx_sum_##name, 0, 0, 1, scalar); break;          \
        }                                                                                          \
        break;                                                                                     \
    }
        CFX_REDUCE_FOR_EACH_TYPE(REF_TYPE)
#undef REF_TYPE
    default: cr_assert_fail("type %d", w->type);
    }
    for (unsigned t = nthreads; t-- > 0;) /* Any order: shares are disjoint. */
        cfx_steploop_data(w, p, t, nthreads);
    cr_assert(memcmp(out, ref_out, bytes) == 0, "%s: the output differs from one thread's", what);
    cr_assert(memcmp(slot_out, ref_slot, bytes) == 0, "%s: the slot differs from one thread's",
              what);
}

Test(steploop, data_split_over_threads_matches_one_thread_aligned_or_not)
{
    enum { MAX_BYTES = 4099 * 8 + 64 };
    static char src[3][MAX_BYTES] __attribute__((aligned(64)));
    static char out[MAX_BYTES] __attribute__((aligned(64))),
        slot[MAX_BYTES] __attribute__((aligned(64))),
        ref_out[MAX_BYTES] __attribute__((aligned(64))),
        ref_slot[MAX_BYTES] __attribute__((aligned(64)));
    unsigned seed = 12345;
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < MAX_BYTES; i++)
            src[k][i] = (char)((seed = seed * 1103515245u + 12345u) >> 16);
    static const uint64_t sizes[] = {0, 1, 7, 16, 17, 33, 1000, 4099};
    static const unsigned threads[] = {1, 3, 64, 1536};
    static const int ops[] = {cfxSum, cfxProd, cfxMax, cfxMin, cfxAvg};
    int checked = 0;
    for (int type = 0; type < cfxNumTypes; type++) {
        struct cfx_work w;
        memset(&w, 0, sizeof(w));
        w.type = (uint8_t)type;
        w.elem_bytes = (uint32_t)cfx_type_size((cfxDataType_t)type);
        w.nranks = 3;
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
            w.redop = (uint8_t)ops[o];
            for (size_t c = 0; c < sizeof(sizes) / sizeof(sizes[0]); c++) {
                uint64_t n = sizes[c];
                size_t bytes = (size_t)n * w.elem_bytes;
                /* Shift: 0 keeps every pointer 16-byte aligned; one element
                 * off takes the element path (for 16-byte types, too). */
                for (int shift = 0; shift < 2; shift++) {
                    size_t off = shift ? w.elem_bytes : 0;
                    for (int n_ops = 1; n_ops <= 3; n_ops++) {
                        for (int outs = 1; outs <= 3; outs++) {
                            struct cfx_steploop_plan p;
                            memset(&p, 0, sizeof(p));
                            p.n = n;
                            p.n_operands = n_ops;
                            for (int k = 0; k < n_ops; k++)
                                p.operands[k] = src[k] + (k == n_ops - 1 ? off : 0);
                            p.avg = ops[o] == cfxAvg;
                            p.out = (outs & 1) ? out + off : 0;
                            p.slot_out = (outs & 2) ? slot + off : 0;
                            unsigned nt = threads[(type + o + c + (size_t)n_ops) % 4];
                            char what[128];
                            snprintf(what, sizeof(what),
                                     "type %d op %d count %llu shift %d operands %d outs %d "
                                     "threads %u",
                                     type, ops[o], (unsigned long long)n, shift, n_ops, outs, nt);
                            check_split(&w, &p, out + off, slot + off, ref_out + off,
                                        ref_slot + off, bytes, nt, what);
                            checked++;
                        }
                    }
                }
            }
        }
    }
    /* Byte copies (single-copy steps), aligned and not, every thread count. */
    for (size_t c = 0; c < sizeof(sizes) / sizeof(sizes[0]); c++) {
        for (int shift = 0; shift < 3; shift++) {
            for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
                uint64_t n = sizes[c] * 8 + (uint64_t)shift;
                struct cfx_steploop_plan p;
                memset(&p, 0, sizeof(p));
                p.n = n;
                p.copy_from = src[0] + (shift == 1 ? 3 : 0);
                p.copy_to = out + (shift == 2 ? 5 : 0);
                memset(out, 0, MAX_BYTES);
                struct cfx_work w;
                memset(&w, 0, sizeof(w));
                for (unsigned tid = 0; tid < threads[t]; tid++)
                    cfx_steploop_data(&w, &p, tid, threads[t]);
                cr_assert(memcmp(p.copy_to, p.copy_from, n) == 0,
                          "copy of %llu bytes (shift %d) over %u threads differs",
                          (unsigned long long)n, shift, threads[t]);
                cr_assert_eq(p.copy_to[n], 0, "copy of %llu bytes wrote past its end",
                             (unsigned long long)n);
                checked++;
            }
        }
    }
    cr_assert_gt(checked, 2000);
}

/* ------------------------------------------------------------------ LL */

/* An LL operation whose connectors are LL and Simple by turns: each
 * connector carries its slots its own way, the results are the same. */
Test(steploop_ll, connectors_of_both_kinds_in_one_operation)
{
    g_ll = 2;
    for (int n = 2; n <= MAX_RANKS; n++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            run_reduction(RING_AR, n, counts[c], cfxSum, c % 2, 4, 256, 2, 0);
            run_reduction(TREE_AR, n, counts[c], cfxMin, 0, 2, 128, 3, 0);
            run_reduction(DIRECT_AR, n, counts[c], cfxSum, 0, 4, 256, 2, 0);
            run_move(CHAIN_BCAST, n, counts[c], n - 1, 4, 256);
            run_move(RING_AG, n, counts[c], 0, 2, 64);
            run_move(P2P, n, counts[c], 0, 2, 64);
        }
}

/* Slots larger than an LL slot carries: LL steps are cut to its data. */
Test(steploop_ll, steps_are_cut_to_an_ll_slot)
{
    g_ll = 1;
    run_reduction(RING_AR, 3, 20000, cfxSum, 0, 4, 65536, 2, 0);
    run_reduction(TREE_AR, 5, 9000, cfxMax, 1, 2, 65536, 2, 0);
    run_move(RING_AG, 4, 5000, 0, 4, 65536);
    static struct cfx_work w;
    memset(&w, 0, sizeof(w));
    w.algo = CFX_SCHED_RING_ALLREDUCE;
    w.elem_bytes = 4;
    w.nranks = 2;
    w.count = 20000;
    w.proto = CFX_WORK_PROTO_LL;
    cfx_work_finish(&w, 65536);
    cr_assert_eq(w.chunk_elems, CFX_LL_DATA_BYTES / 4, "LL chunks of %llu elements",
                 (unsigned long long)w.chunk_elems);
}

/* One step's data written as LL words by @p nthreads threads (each its
 * share of the packs), then read back by as many threads: the result is
 * the one-thread fold, every type and op, sizes that end inside a pack. */
Test(steploop_ll, words_written_and_read_by_many_threads_round_trip)
{
    enum { MAX_BYTES = 1000 * 8 + 64 };
    static char src[2][MAX_BYTES] __attribute__((aligned(64)));
    static char out[MAX_BYTES] __attribute__((aligned(64))), ref[MAX_BYTES];
    static uint64_t words[2 * (MAX_BYTES / 4) + 8];
    unsigned seed = 777;
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < MAX_BYTES; i++)
            src[k][i] = (char)((seed = seed * 1103515245u + 12345u) >> 16);
    static const uint64_t sizes[] = {1, 3, 16, 17, 1000};
    static const unsigned threads[] = {1, 3, 64};
    static const int ops[] = {cfxSum, cfxProd, cfxMax, cfxMin, cfxAvg};
    uint32_t flag = 7;
    for (int type = 0; type < cfxNumTypes; type++)
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++)
            for (size_t c = 0; c < sizeof(sizes) / sizeof(sizes[0]); c++) {
                struct cfx_work w;
                memset(&w, 0, sizeof(w));
                w.type = (uint8_t)type;
                w.redop = (uint8_t)ops[o];
                w.elem_bytes = (uint32_t)cfx_type_size((cfxDataType_t)type);
                w.nranks = 2;
                uint64_t n = sizes[c];
                size_t bytes = (size_t)n * w.elem_bytes;
                unsigned nt = threads[(type + c) % 3];
                /* Reference: the fold of both sources, one element at a time. */
                struct cfx_steploop_plan rp;
                memset(&rp, 0, sizeof(rp));
                rp.n = n;
                rp.n_operands = 2;
                rp.operands[0] = src[0];
                rp.operands[1] = src[1];
                rp.avg = ops[o] == cfxAvg;
                rp.out = ref;
                cfx_steploop_data(&w, &rp, 0, 1);
                /* The sender folds into LL words. */
                flag++;
                struct cfx_steploop_plan sp = rp;
                sp.out = 0;
                sp.slot_out = (char *)words;
                sp.ll_out = 1;
                sp.ll_out_flag = flag;
                for (unsigned t = nt; t-- > 0;)
                    cfx_steploop_data(&w, &sp, t, nt);
                /* The receiver copies them out. */
                struct cfx_steploop_plan cp;
                memset(&cp, 0, sizeof(cp));
                cp.n = n;
                cp.n_operands = 1;
                cp.operands[0] = (const char *)words;
                cp.ll_in = 1;
                cp.ll_flag[0] = flag;
                cp.out = out + 1; /* Unaligned: its bytes only. */
                memset(out, 0x5a, bytes + 2);
                for (unsigned t = 0; t < nt; t++)
                    cfx_steploop_data(&w, &cp, t, nt);
                cr_assert(memcmp(out + 1, ref, bytes) == 0,
                          "type %d op %d count %llu over %u threads: LL round trip differs", type,
                          ops[o], (unsigned long long)n, nt);
                cr_assert(out[0] == 0x5a && out[bytes + 1] == 0x5a,
                          "type %d count %llu: the LL copy wrote outside its bytes", type,
                          (unsigned long long)n);
                /* Every word of the padded packs carries the flag. */
                for (size_t k = 0; k < (bytes + 15) / 16 * 4; k++)
                    cr_assert_eq((uint32_t)(words[k] >> 32), flag, "word %zu without its flag", k);
            }
}

/* A thread waiting for words that never come gives up when the stop word
 * turns nonzero (a kernel's abort), and a word with another slot's flag
 * is not taken. */
Test(steploop_ll, a_wait_for_words_ends_at_the_stop_word)
{
    static uint64_t words[8];
    for (int k = 0; k < 8; k++)
        words[k] = (uint64_t)0x11111111u | ((uint64_t)4 << 32); /* Slot 3's flag, not 5's. */
    int32_t stop = 1;
    char out[32];
    memset(out, 0x33, sizeof(out));
    struct cfx_work w;
    memset(&w, 0, sizeof(w));
    w.type = cfxInt32;
    w.elem_bytes = 4;
    struct cfx_steploop_plan p;
    memset(&p, 0, sizeof(p));
    p.n = 8;
    p.n_operands = 1;
    p.operands[0] = (const char *)words;
    p.ll_in = 1;
    p.ll_flag[0] = 5;
    p.out = out;
    p.stop = &stop;
    cfx_steploop_data(&w, &p, 0, 1);
    for (size_t i = 0; i < sizeof(out); i++)
        cr_assert_eq(out[i], 0x33, "byte %zu written from words of another slot", i);
}
