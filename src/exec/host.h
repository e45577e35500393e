/*
 * The host executor: drives a batch of operations on the calling thread until
 * all are done, interleaving them so that operations that depend on each
 * other (a group's sends and receives, every rank of cfxCommInitAll driven by
 * one thread) all make progress. Operations that share a connector run in
 * the order given. Waiting spins briefly, then yields, then sleeps, so many
 * ranks on few cores still progress.
 */
#ifndef CFX_EXEC_HOST_H
#define CFX_EXEC_HOST_H

#include "src/coll/op.h"

/* Runs ops[0..n_ops) to completion. Returns cfxSuccess, or the first
 * failure (each op's own result says which failed). Never allocates. */
cfxResult_t cfx_exec_host_run(struct cfx_op *ops, int n_ops);

/* CFX_TIMEOUT in seconds (0 = never): also bounds the connection setup a
 * call's first use of a peer or an algorithm needs. */
int64_t cfx_exec_host_timeout_s(void);

#endif /* CFX_EXEC_HOST_H */
