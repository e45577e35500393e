/* Mismatch probe for stuck collectives (probe.c). */
#ifndef CFX_CORE_PROBE_H
#define CFX_CORE_PROBE_H

#include "src/coll/op.h"

/* The executor's on_stall hook for collectives. */
cfxResult_t cfx_core_probe_stall(struct cfx_op *op, int64_t stalled_ns);

struct cfxComm;

/* Before a launch (and from cfxCommGetAsyncError): cfxInvalidUsage, with a
 * sentence, when a slot of a collective that already finished on this rank
 * waits in one of its collective FIFOs: a peer ran another collective (a
 * broadcast from another root, a reduce against a broadcast) and sent data
 * this rank's call never took. @p blame_p: the rank the failure is about (-1:
 * this rank, which found it). Loads of the FIFOs' posted flags only; never
 * blocks, never allocates. cfxSuccess when CFX_CHECK_MISMATCH is off. */
cfxResult_t cfx_core_probe_leftovers(struct cfxComm *comm, int *blame_p);

/* While @p op waits to connect at its first use: a slot of the same
 * collective (same sequence number) from a peer that runs it differently
 * (another root, kind, count, type or op) already waits in one of the
 * communicator's collective FIFOs. That peer will never connect for this
 * call (it runs another schedule), so the wait can only end at CFX_TIMEOUT:
 * cfxInvalidUsage with both fingerprints instead, *blame_p = this rank (it
 * found the mismatch). Cheap (a cache line per connector); never blocks. */
cfxResult_t cfx_core_probe_conflict(struct cfxComm *comm, const struct cfx_op *op, int *blame_p);

/* Every connector of @p comm asked of its transport (check): a connector a
 * peer poisoned (a mismatch, a timeout) and, with @p gone_too, a peer gone.
 * cfxSuccess, or the first failure with its sentence and *blame_p the rank
 * it is about. Never blocks. */
cfxResult_t cfx_core_probe_connectors(struct cfxComm *comm, int gone_too, int *blame_p);

/* cfxCommGetAsyncError's look around while no call uses @p comm: leftover
 * slots (above), and connectors a peer poisoned because it found a mismatch
 * or timed out (asked of the transports at most every few milliseconds, and
 * no more once the communicator is finalized or a peer has left). On
 * either, breaks the communicator as a failed call would (async error,
 * poisoned connectors, the sentence in cfxGetLastError) and returns the
 * error; else the communicator's async error. */
cfxResult_t cfx_core_probe_async(struct cfxComm *comm);

#endif /* CFX_CORE_PROBE_H */
