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

#endif /* CFX_CORE_ENQUEUE_H */
