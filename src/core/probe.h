/* Mismatch probe for stuck collectives (probe.c). */
#ifndef CFX_CORE_PROBE_H
#define CFX_CORE_PROBE_H

#include "src/coll/op.h"

/* The executor's on_stall hook for collectives. */
cfxResult_t cfx_core_probe_stall(struct cfx_op *op, int64_t stalled_ns);

#endif /* CFX_CORE_PROBE_H */
