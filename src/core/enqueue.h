/* Queueing and launching operations (group.c), used by the API entry points (enqueue.c). */
#ifndef CFX_CORE_ENQUEUE_H
#define CFX_CORE_ENQUEUE_H

#include "src/coll/op.h"

int cfx_core_group_active(void);
/* Queue a copy of @p op in this thread's group. */
cfxResult_t cfx_core_group_add(const struct cfx_op *op);
/* Remember that a call inside the group was refused (cfxGroupEnd reports it). */
void cfx_core_group_fail(cfxResult_t res);
/* Connect what is missing, then run the operations to completion. The
 * caller holds every communicator of the batch (cfx_core_claim) throughout.
 * Numbers each operation (its fingerprint's sequence) first. */
cfxResult_t cfx_core_launch(struct cfx_op *ops, int n_ops);

struct cfx_executor;
/* Make @p exec (NULL: none, refused) the executor of operations on memory
 * of @p kind; returns the previous one. For tests (an executor that wraps
 * the host one) and, later, the CUDA executor's registration: call it while
 * no launch is in flight. */
const struct cfx_executor *cfx_core_exec_set(enum cfx_mem_kind kind,
                                             const struct cfx_executor *exec);

#endif /* CFX_CORE_ENQUEUE_H */
