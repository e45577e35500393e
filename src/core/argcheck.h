/*
 * Argument checks, done once at the API entry (NCCL's argcheck). Each returns
 * cfxSuccess or an error with a sentence naming the function and argument.
 */
#ifndef CFX_CORE_ARGCHECK_H
#define CFX_CORE_ARGCHECK_H

#include <stddef.h>

#include "conflux.h"

cfxResult_t cfx_argcheck_ptr(const void *ptr, const char *fn, const char *arg);
/* A live communicator: not NULL, not destroyed. */
cfxResult_t cfx_argcheck_comm(const struct cfxComm *comm, const char *fn);
/* A live communicator that has not been finalized (cfxInvalidUsage if it has). */
cfxResult_t cfx_argcheck_comm_usable(const struct cfxComm *comm, const char *fn);
cfxResult_t cfx_argcheck_nranks_rank(int nranks, int rank, const char *fn);
cfxResult_t cfx_argcheck_type(cfxDataType_t type, const char *fn);
cfxResult_t cfx_argcheck_op(cfxRedOp_t op, const char *fn);
cfxResult_t cfx_argcheck_root(const struct cfxComm *comm, int root, const char *fn);
/* count elements of type must fit in size_t bytes, times @p multiple
 * (e.g. nranks for an allgather's receive buffer). */
cfxResult_t cfx_argcheck_count(size_t count, cfxDataType_t type, size_t multiple, const char *fn);
/* A buffer may be NULL only when count is 0. */
cfxResult_t cfx_argcheck_buffer(const void *buf, size_t count, const char *fn, const char *arg);
/* A cfxConfig_t the caller filled from CFX_CONFIG_INITIALIZER (NULL is fine). */
cfxResult_t cfx_argcheck_config(const cfxConfig_t *config, const char *fn);

#endif /* CFX_CORE_ARGCHECK_H */
