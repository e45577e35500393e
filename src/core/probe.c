/*
 * Mismatch probe. Slot fingerprints catch most mismatched calls at the first
 * slot, but some mismatches move no data at all (reduce with different
 * roots: every rank waits to receive). When a collective has been stuck for
 * CFX_MISMATCH_PROBE_MS, its rank sends its fingerprint to its ring
 * neighbours over the bootstrap and compares theirs: the same sequence
 * number with a different operation is a mismatch, reported at once instead
 * of at CFX_TIMEOUT. Costs nothing until a call is stuck.
 */
#include <string.h>

#include "src/coll/op.h"
#include "src/core/comm.h"
#include "src/core/probe.h"
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
        CFX_INFO(CFX_LOG_COLL, "rank %d: %s #%llu stuck for %lld ms; comparing with ranks %d and %d",
                 comm->rank, cfx_coll_name(op->kind), (unsigned long long)op->print.seq,
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
