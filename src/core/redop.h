/* Reductions of cfxRedOpCreatePreMulSum as the collectives use them (redop.c). */
#ifndef CFX_CORE_REDOP_H
#define CFX_CORE_REDOP_H

#include "conflux.h"
#include "src/coll/op.h"

struct cfxComm;

/* A call's reduction as its operation runs it (struct cfx_op's op, premul
 * and premul_bits). */
struct cfx_core_redop {
    cfxRedOp_t op;
    int premul;
    uint64_t premul_bits;
};

/* Resolve a call's @p op: a built-in one as it is; an op of
 * cfxRedOpCreatePreMulSum (made for @p type) as cfxAvg with its scalar.
 * cfxInvalidArgument with a sentence for any other value. */
cfxResult_t cfx_core_redop_resolve(struct cfxComm *comm, cfxRedOp_t op, cfxDataType_t type,
                                   const char *fn, struct cfx_core_redop *red_p);

#endif /* CFX_CORE_REDOP_H */
