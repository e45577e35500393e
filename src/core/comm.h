/*
 * The communicator: who the ranks are, where they live, and the bootstrap
 * that connects them. Later layers (transports, plans) hang their state here.
 */
#ifndef CFX_CORE_COMM_H
#define CFX_CORE_COMM_H

#include <stdint.h>

#include "conflux.h"
#include "src/bootstrap/bootstrap.h"
#include "src/util/error.h"
#include "src/util/host.h"

#define CFX_COMM_MAGIC UINT64_C(0x434658434f4d4d31) /* "CFXCOMM1" */
#define CFX_COMM_DEAD UINT64_C(0xdeadc0ffeedeadc0)

/* What every rank tells the others at init. Fixed size: it is all-gathered. */
struct cfx_peer_info {
    int32_t rank;
    int32_t cuda_dev; /* -1: host only. */
    int32_t pid;
    uint32_t reserved;
    uint64_t host_hash;
    char host_id[CFX_HOST_ID_MAX];
};

struct cfxComm {
    uint64_t magic; /* CFX_COMM_MAGIC while alive. */
    int rank;
    int nranks;
    int cuda_dev;
    int local_rank;   /* Index among the ranks of this host. */
    int local_nranks; /* Ranks on this host. */
    int abort_flag;   /* Set by cfxCommAbort; every wait polls it. */
    int finalized;
    cfxResult_t async_error;
    int blocking;
    int split_count;
    struct cfx_bootstrap *bootstrap;
    struct cfx_peer_info *peers; /* nranks entries. */
    char name[64];
    char last_error[CFX_ERROR_MAX];
};

/* API entry/exit bookkeeping: clears this thread's error sentence, sets the
 * log rank; on failure copies the sentence into comm->last_error. */
void cfx_core_api_enter(cfxComm_t comm);
cfxResult_t cfx_core_api_exit(cfxComm_t comm, cfxResult_t res);

/* Print the version line at CFX_DEBUG=VERSION or above (once per process). */
void cfx_core_print_version(void);

#endif /* CFX_CORE_COMM_H */
