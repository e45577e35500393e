/*
 * Blame agreement (blame.c): after a failure, the surviving ranks of a
 * communicator agree on the one rank to name, so every rank's sentence
 * blames the same rank. See docs/troubleshooting.md for the rule.
 */
#ifndef CFX_CORE_BLAME_H
#define CFX_CORE_BLAME_H

#include <stddef.h>

#include "src/core/comm.h"

/* The link of a failure whose peer is not known (a bootstrap exchange). */
#define CFX_BLAME_UNKNOWN (-2)

/* Tell every other rank of @p comm that this rank failed with @p reason
 * through @p link_rank: the peer it waited for or heard the failure from,
 * this rank when the failure began here, or CFX_BLAME_UNKNOWN. Best effort
 * (a rank that cannot be reached is skipped); bounded by CFX_BLAME_WINDOW_MS.
 * Call it for every failing communicator of a batch before any
 * cfx_core_blame_agree, so ranks driven by one thread hear each other. */
void cfx_core_blame_tell(struct cfxComm *comm, cfxResult_t reason, int link_rank);

/* After cfx_core_blame_tell: follow the chain of links from this rank, with
 * the other ranks' messages, to the rank the failure began at; every rank
 * that told computes the same. Waits at most CFX_BLAME_WINDOW_MS for ranks
 * that have not told yet (a rank that never does is the one blamed). Returns
 * the blamed rank and writes why into @p why (@p why_size bytes);
 * *origin_p is the result the failure had where it began, when that rank
 * told it, else cfxSuccess. */
int cfx_core_blame_agree(struct cfxComm *comm, char *why, size_t why_size, cfxResult_t *origin_p);

/* cfx_core_blame_agree, then this thread's error sentence becomes "@p what
 * on rank R failed because of rank B: why. This rank saw: @p seen" (the
 * sentence of the failure, kept before cfx_core_blame_tell, which may
 * clear it). Returns the failure's result where it began when another rank
 * told it (so every rank returns the same), else @p res. */
cfxResult_t cfx_core_blame_explain(struct cfxComm *comm, cfxResult_t res, const char *what,
                                   const char *seen);

#endif /* CFX_CORE_BLAME_H */
