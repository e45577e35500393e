/*
 * Mismatch probe. Slot fingerprints catch most mismatched calls at the first
 * slot, but some mismatches move no data at all (reduce with different
 * roots: every rank waits to receive). When a collective has been stuck for
 * CFX_MISMATCH_PROBE_MS, its rank sends its fingerprint to its ring
 * neighbours over the bootstrap and compares theirs: the same sequence
 * number with a different operation is a mismatch, reported at once instead
 * of at CFX_TIMEOUT. Costs nothing until a call is stuck.
 *
 * Others finish everywhere without a rank ever taking a mismatched slot
 * (broadcasts from roots 0 and 1: each root only sends, and the data goes to
 * a rank whose call receives nothing on that connector). What they leave
 * behind is the evidence: a slot of a collective that has finished on the
 * receiving rank, waiting in one of its FIFOs. Each launch and each
 * cfxCommGetAsyncError look for such slots (the posted flag of each
 * collective FIFO's next slot); the rank that finds one breaks its
 * communicator and poisons its connectors, so the ranks that only sent learn
 * of it from the transports (cfxCommGetAsyncError asks them) or at their
 * next call.
 */
#include <stdio.h>
#include <string.h>

#include "src/coll/op.h"
#include "src/core/comm.h"
#include "src/core/probe.h"
#include "src/plan/plan.h"
#include "src/util/check.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"

CFX_PARAM_INT(mismatch_probe_ms, "MISMATCH_PROBE_MS", 1000, 0, CFX_PARAM_SECONDS_MAX,
              "Milliseconds a collective may be stuck before its rank compares fingerprints with "
              "its neighbours over the bootstrap");

#define PROBE_TAG 0x50520000u /* "PR" + low 16 bits of the sequence number. */

static uint32_t probe_tag(uint64_t seq)
{
    return PROBE_TAG | (uint32_t)(seq & 0xffffu);
}

static cfxResult_t compare_with(struct cfx_op *op, struct cfxComm *comm, int peer)
{
    uint32_t tag = probe_tag(op->print.seq);
    for (;;) {
        struct cfx_fingerprint theirs;
        int got = 0;
        cfxResult_t res =
            cfx_bootstrap_try_recv(comm->bootstrap, peer, tag, &theirs, sizeof(theirs), &got);
        if (res != cfxSuccess || !got)
            return res;
        if (theirs.seq != op->print.seq)
            continue; /* A stale probe of an older operation. */
        if (memcmp(&theirs, &op->print, sizeof(theirs)) == 0)
            return cfxSuccess;
        char mine[160], other[160];
        cfx_coll_print_format(&op->print, mine, sizeof(mine));
        cfx_coll_print_format(&theirs, other, sizeof(other));
        op->blame_rank = op->rank;
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                             "mismatched operations: rank %d runs %s but rank %d runs %s; every "
                             "rank must call the same collectives in the same order with the "
                             "same count, type, op and root",
                             op->rank, mine, peer, other);
    }
}

cfxResult_t cfx_core_probe_stall(struct cfx_op *op, int64_t stalled_ns)
{
    struct cfxComm *comm = op->owner;
    if (!comm->check_mismatch || comm->nranks < 2 || op->kind == CFX_COLL_SEND ||
        op->kind == CFX_COLL_RECV || stalled_ns < param_mismatch_probe_ms() * CFX_NS_PER_MS)
        return cfxSuccess;
    int next = (comm->rank + 1) % comm->nranks;
    int prev = (comm->rank + comm->nranks - 1) % comm->nranks;
    if (!op->probe_sent) {
        op->probe_sent = 1;
        CFX_INFO(CFX_LOG_COLL,
                 "rank %d: %s #%llu stuck for %lld ms; comparing with ranks %d and %d", comm->rank,
                 cfx_coll_name(op->kind), (unsigned long long)op->print.seq,
                 (long long)(stalled_ns / CFX_NS_PER_MS), prev, next);
        /* Best effort: a neighbour that already left cannot be told, and its
         * connectors will say why it left. */
        int peers[2] = {next, prev};
        for (int i = 0; i < (prev != next ? 2 : 1); i++)
            if (cfx_bootstrap_send_within(comm->bootstrap, peers[i], probe_tag(op->print.seq),
                                          &op->print, sizeof(op->print), 500) != cfxSuccess) {
                CFX_INFO(CFX_LOG_COLL, "rank %d: rank %d did not take the mismatch probe",
                         comm->rank, peers[i]);
                cfx_error_thread_clear();
            }
    }
    CFX_CHECK(compare_with(op, comm, prev));
    if (prev != next)
        CFX_CHECK(compare_with(op, comm, next));
    return cfxSuccess;
}

/* ------------------------------------------------------ after the fact */

/* A slot of a finished collective waiting in @p conn: its sentence. */
static cfxResult_t leftover_in(struct cfxComm *comm, struct cfx_connector *conn)
{
    if (conn == NULL || !cfx_conn_can_take(conn))
        return cfxSuccess;
    size_t bytes;
    const struct cfx_fingerprint *posted;
    (void)cfx_conn_take_slot(conn, &bytes, &posted);
    struct cfx_fingerprint theirs = *posted;
    if (!theirs.valid || theirs.kind == CFX_COLL_SEND || theirs.seq >= comm->coll_settled)
        return cfxSuccess; /* Point to point, or a collective this rank has yet to run. */
    char mine[160], other[160];
    if (comm->settled_print.valid && comm->settled_print.seq == theirs.seq)
        cfx_coll_print_format(&comm->settled_print, mine, sizeof(mine));
    else
        snprintf(mine, sizeof(mine), "collective #%llu", (unsigned long long)theirs.seq);
    cfx_coll_print_format(&theirs, other, sizeof(other));
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                         "mismatched operations: rank %d finished %s, but rank %d sent it data of "
                         "%s that no call of rank %d took; every rank must call the same "
                         "collectives in the same order with the same count, type, op and root",
                         comm->rank, mine, conn->peer_rank, other, comm->rank);
}

/* A slot of @p mine's collective, posted differently, waiting in @p conn. */
static cfxResult_t conflict_in(struct cfxComm *comm, struct cfx_connector *conn,
                               const struct cfx_fingerprint *mine)
{
    if (conn == NULL || conn->view.info == NULL || !cfx_conn_can_take(conn))
        return cfxSuccess;
    size_t bytes;
    const struct cfx_fingerprint *posted;
    (void)cfx_conn_take_slot(conn, &bytes, &posted);
    struct cfx_fingerprint theirs = *posted;
    if (!theirs.valid || theirs.kind == CFX_COLL_SEND || theirs.seq != mine->seq)
        return cfxSuccess;
    if (theirs.kind == mine->kind && theirs.root == mine->root && theirs.count == mine->count &&
        theirs.type == mine->type && theirs.op == mine->op)
        return cfxSuccess;
    char text_mine[160], text_theirs[160];
    cfx_coll_print_format(mine, text_mine, sizeof(text_mine));
    cfx_coll_print_format(&theirs, text_theirs, sizeof(text_theirs));
    return cfx_error_set(cfxInvalidUsage, CFX_LOG_COLL,
                         "mismatched operations: rank %d runs %s but rank %d sent it data of %s "
                         "(found while connecting for the call: rank %d runs another schedule "
                         "and will not connect); every rank must call the same collectives in "
                         "the same order with the same count, type, op and root",
                         comm->rank, text_mine, conn->peer_rank, text_theirs, conn->peer_rank);
}

cfxResult_t cfx_core_probe_conflict(struct cfxComm *comm, const struct cfx_op *op, int *blame_p)
{
    *blame_p = comm->rank;
    if (!comm->check_mismatch || op == NULL || op->kind == CFX_COLL_SEND ||
        op->kind == CFX_COLL_RECV)
        return cfxSuccess;
    const struct cfx_fingerprint *mine = &op->print;
    CFX_CHECK(conflict_in(comm, comm->ring_recv, mine));
    for (int c = 0; c < CFX_RING_CHANNELS - 1; c++)
        CFX_CHECK(conflict_in(comm, comm->ring_more_recv[c], mine));
    for (int peer = 0; peer < comm->nranks && peer < CFX_DIRECT_MAX_RANKS; peer++)
        CFX_CHECK(conflict_in(comm, comm->direct.from[peer], mine));
    if (comm->plan == NULL)
        return cfxSuccess;
    for (int t = 0; t < 2; t++) {
        const struct cfx_tree_links *links = &comm->trees[t];
        CFX_CHECK(conflict_in(comm, links->from_parent, mine));
        for (int c = 0; c < links->n_children; c++)
            CFX_CHECK(conflict_in(comm, links->from_child[c], mine));
        if (comm->relay_recv[t] == NULL)
            continue;
        for (int r = 0; r < comm->nranks; r++)
            CFX_CHECK(conflict_in(comm, comm->relay_recv[t][r], mine));
    }
    return cfxSuccess;
}

cfxResult_t cfx_core_probe_leftovers(struct cfxComm *comm, int *blame_p)
{
    *blame_p = -1;
    if (!comm->check_mismatch || comm->coll_settled == 0)
        return cfxSuccess;
    CFX_CHECK(leftover_in(comm, comm->ring_recv));
    for (int c = 0; c < CFX_RING_CHANNELS - 1; c++)
        CFX_CHECK(leftover_in(comm, comm->ring_more_recv[c]));
    for (int peer = 0; peer < comm->nranks && peer < CFX_DIRECT_MAX_RANKS; peer++)
        CFX_CHECK(leftover_in(comm, comm->direct.from[peer]));
    if (comm->plan == NULL)
        return cfxSuccess;
    for (int t = 0; t < 2; t++) {
        const struct cfx_tree_links *links = &comm->trees[t];
        CFX_CHECK(leftover_in(comm, links->from_parent));
        for (int c = 0; c < links->n_children; c++)
            CFX_CHECK(leftover_in(comm, links->from_child[c]));
        if (comm->relay_recv[t] == NULL)
            continue;
        /* Relays: a call's root has one from the tree root; the tree root
         * one from each call root it has served. */
        int top = comm->plan->trees[t].root;
        if (comm->rank != top) {
            if (top >= 0)
                CFX_CHECK(leftover_in(comm, comm->relay_recv[t][top]));
            continue;
        }
        for (int r = 0; r < comm->nranks; r++)
            CFX_CHECK(leftover_in(comm, comm->relay_recv[t][r]));
    }
    return cfxSuccess;
}

/* A peer poisoned @p conn for a mismatch or a timeout: its transport's
 * sentence. A peer that left (cfxRemoteError) is not an error of its own:
 * after a clean cfxCommDestroy it looks the same; then the transports are
 * not asked again (comm->async_peer_left), so a program that polls after
 * its peers left gets one log line about it, not one per poll. */
static cfxResult_t poisoned(struct cfxComm *comm, struct cfx_connector *conn, int gone_too,
                            int *blame_p)
{
    if (conn == NULL || conn->transport == NULL || conn->transport->check == NULL)
        return cfxSuccess;
    cfxResult_t res = conn->transport->check(conn->transport_ctx, conn);
    if (res != cfxInvalidUsage && res != cfxTimeout && !(gone_too && res != cfxSuccess)) {
        if (res != cfxSuccess)
            comm->async_peer_left = 1;
        cfx_error_thread_clear();
        return cfxSuccess;
    }
    *blame_p = conn->blame_rank >= 0 ? conn->blame_rank : conn->peer_rank;
    return res;
}

cfxResult_t cfx_core_probe_connectors(struct cfxComm *comm, int gone_too, int *blame_p)
{
    CFX_CHECK(poisoned(comm, comm->ring_send, gone_too, blame_p));
    CFX_CHECK(poisoned(comm, comm->ring_recv, gone_too, blame_p));
    for (int c = 0; c < CFX_RING_CHANNELS - 1; c++) {
        CFX_CHECK(poisoned(comm, comm->ring_more_send[c], gone_too, blame_p));
        CFX_CHECK(poisoned(comm, comm->ring_more_recv[c], gone_too, blame_p));
    }
    for (int peer = 0; peer < CFX_DIRECT_MAX_RANKS; peer++) {
        CFX_CHECK(poisoned(comm, comm->direct.to[peer], gone_too, blame_p));
        CFX_CHECK(poisoned(comm, comm->direct.from[peer], gone_too, blame_p));
    }
    for (int t = 0; t < 2; t++) {
        const struct cfx_tree_links *links = &comm->trees[t];
        CFX_CHECK(poisoned(comm, links->to_parent, gone_too, blame_p));
        CFX_CHECK(poisoned(comm, links->from_parent, gone_too, blame_p));
        for (int c = 0; c < links->n_children; c++) {
            CFX_CHECK(poisoned(comm, links->to_child[c], gone_too, blame_p));
            CFX_CHECK(poisoned(comm, links->from_child[c], gone_too, blame_p));
        }
        for (int r = 0; comm->relay_send[t] && comm->relay_recv[t] && r < comm->nranks; r++) {
            CFX_CHECK(poisoned(comm, comm->relay_send[t][r], gone_too, blame_p));
            CFX_CHECK(poisoned(comm, comm->relay_recv[t][r], gone_too, blame_p));
        }
    }
    for (int r = 0; comm->p2p_send && comm->p2p_recv && r < comm->nranks; r++) {
        CFX_CHECK(poisoned(comm, comm->p2p_send[r], gone_too, blame_p));
        CFX_CHECK(poisoned(comm, comm->p2p_recv[r], gone_too, blame_p));
    }
    return cfxSuccess;
}

/* Transport checks may cost a system call per connector (shm asks whether
 * the peer's process lives): cfxCommGetAsyncError polled in a loop asks
 * them at most this often. */
#define ASYNC_CHECK_EVERY_NS (10 * CFX_NS_PER_MS)

cfxResult_t cfx_core_probe_async(struct cfxComm *comm)
{
    if (comm->async_error != cfxSuccess || comm->nranks < 2 ||
        __atomic_load_n(&comm->active_calls, __ATOMIC_ACQUIRE) > 0)
        return comm->async_error; /* A call in flight finds out for itself. */
    int blame = -1;
    cfxResult_t res = cfx_core_probe_leftovers(comm, &blame);
    if (res == cfxSuccess) {
        int64_t now = cfx_time_now_ns();
        /* After cfxCommFinalize peers may leave at any time. */
        if (comm->finalized || comm->async_peer_left ||
            now - comm->async_checked_ns < ASYNC_CHECK_EVERY_NS)
            return cfxSuccess;
        comm->async_checked_ns = now;
        res = cfx_core_probe_connectors(comm, 0, &blame);
        if (res == cfxSuccess)
            return cfxSuccess;
    }
    comm->async_error = res;
    snprintf(comm->last_error, sizeof(comm->last_error), "%s", cfx_error_thread_last());
    cfx_core_poison_all(comm, res, blame);
    if (comm->flight_size > 0)
        cfx_core_flight_dump(comm, cfxGetErrorString(res));
    return res;
}
