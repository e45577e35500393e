/*
 * The host executor (exec.h's interface): drives a batch of operations on
 * the calling thread until all are done, interleaving them so that operations that depend on each
 * other (a group's sends and receives, every rank of cfxCommInitAll driven by
 * one thread) all make progress. Operations that share a connector run in
 * the order given. Waiting spins briefly, then yields, then sleeps, so many
 * ranks on few cores still progress.
 */
#ifndef CFX_EXEC_HOST_H
#define CFX_EXEC_HOST_H

#include "src/exec/exec.h"

/* Runs on the calling thread (cfx_exec_host, declared in exec.h): launch
 * with a NULL stream runs the batch to completion; test is one pass over
 * the ops (claim, run the ready steps) plus the idle checks every
 * HEALTH_EVERY idle calls, and at once after an abort; wait is the loop that
 * spins, yields and sleeps. */

/* CFX_TIMEOUT in seconds (0 = never): also bounds the connection setup a
 * call's first use of a peer or an algorithm needs. */
int64_t cfx_exec_host_timeout_s(void);

#endif /* CFX_EXEC_HOST_H */
