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
#include "transports/transport.h"

#define CFX_MAX_TRANSPORTS 8

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
    /* Data path: built at init (ring) or at first use (point to point). */
    size_t slot_bytes;
    int n_steps;
    void *transport_ctx[CFX_MAX_TRANSPORTS]; /* Per transport, made on first use. */
    struct cfx_connector *ring_send;         /* To rank+1. */
    struct cfx_connector *ring_recv;         /* From rank-1. */
    struct cfx_connector **p2p_send;         /* [nranks], NULL until first use. */
    struct cfx_connector **p2p_recv;
    char name[64];
    char last_error[CFX_ERROR_MAX];
};

/* API entry/exit bookkeeping: clears this thread's error sentence, sets the
 * log rank; on failure copies the sentence into comm->last_error. */
void cfx_core_api_enter(cfxComm_t comm);
cfxResult_t cfx_core_api_exit(cfxComm_t comm, cfxResult_t res);

/* A connection this rank needs: built by cfx_core_connect_batch. */
struct cfx_conn_request {
    struct cfxComm *comm;
    int peer;
    enum cfx_conn_dir dir;
    int kind;                     /* CFX_CONN_KIND_*: keeps bootstrap tags apart. */
    struct cfx_connector **out_p; /* Where the finished connector goes. */
    /* Filled while connecting. */
    struct cfx_connector *conn;
    int transport;
};

#define CFX_CONN_KIND_RING 1
#define CFX_CONN_KIND_P2P 2

/* Build every requested connector (of one or several communicators): set up
 * and exchange connect info over each communicator's bootstrap, then connect
 * all send sides before any receive side, so no rank waits on another that
 * waits on it. Setup-time only. On failure nothing of the batch remains. */
cfxResult_t cfx_core_connect_batch(struct cfx_conn_request *reqs, int n_reqs);

/* Close every connector and transport of a communicator. Never blocks. */
void cfx_core_disconnect_all(struct cfxComm *comm);

/* Print the version line at CFX_DEBUG=VERSION or above (once per process). */
void cfx_core_print_version(void);

#endif /* CFX_CORE_COMM_H */
