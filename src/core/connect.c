/*
 * Connection setup: picks a transport for each pair of ranks (the first in
 * priority order whose can_connect accepts), lets both sides set up, trades
 * their connect info over the bootstrap, and connects. Runs at init (the
 * ring) and at the first use of a peer (point to point) or of an algorithm
 * (tree, direct); never on the data path of an established connection.
 */
#include <stdlib.h>
#include <string.h>

#include "src/core/comm.h"
#include "src/util/check.h"
#include "src/util/log.h"

/* What one side tells the other. */
struct conn_msg {
    uint32_t transport; /* Index in cfx_transports: both sides must agree. */
    uint32_t reserved;
    uint64_t slot_bytes;
    char info[CFX_CONNECT_INFO_BYTES];
};

/* The message a side of direction @p dir sends for connection kind @p kind. */
static uint32_t conn_tag(int kind, enum cfx_conn_dir dir)
{
    return 0x434e0000u | ((uint32_t)kind << 8) | (uint32_t)dir;
}

/* The slot size of a requested connector. */
static size_t slot_bytes_of(const struct cfx_conn_request *req)
{
    return req->slot_bytes ? req->slot_bytes : req->comm->slot_bytes;
}

static const char *kind_name(int kind)
{
    switch (kind) {
    case CFX_CONN_KIND_RING: return "ring";
    case CFX_CONN_KIND_P2P: return "p2p";
    case CFX_CONN_KIND_DIRECT: return "direct";
    default: return kind >= CFX_CONN_KIND_RELAY_UP(0) ? "relay" : "tree";
    }
}

static struct cfx_transport_peer peer_of(const struct cfxComm *comm, int rank)
{
    const struct cfx_peer_info *info = &comm->peers[rank];
    return (struct cfx_transport_peer){
        .rank = rank, .pid = info->pid, .cuda_dev = info->cuda_dev, .host_hash = info->host_hash};
}

static cfxResult_t pick_transport(struct cfxComm *comm, int peer, int *index_p)
{
    struct cfx_transport_peer self = peer_of(comm, comm->rank), other = peer_of(comm, peer);
    for (int t = 0; cfx_transports[t] != NULL && t < CFX_MAX_TRANSPORTS; t++) {
        const struct cfx_transport *tr = cfx_transports[t];
        if (comm->transport_ctx[t] == NULL) {
            struct cfx_transport_env env = {.rank = comm->rank,
                                            .nranks = comm->nranks,
                                            .abort_flag = &comm->abort_flag,
                                            .connect_timeout_s = cfx_bootstrap_timeout_s()};
            CFX_CHECK(tr->init(&env, &comm->transport_ctx[t]));
        }
        if (tr->can_connect(comm->transport_ctx[t], &self, &other)) {
            *index_p = t;
            return cfxSuccess;
        }
    }
    return cfx_error_set(cfxSystemError, CFX_LOG_INIT,
                         "rank %d: no transport can reach rank %d (host %s)", comm->rank, peer,
                         comm->peers[peer].host_id);
}

static void close_conn(struct cfx_connector *conn)
{
    if (conn == NULL)
        return;
    if (conn->transport)
        conn->transport->close(conn->transport_ctx, conn);
    free(conn);
}

/* Phase 1 for one request: set up our side and send our info to the peer. */
static cfxResult_t setup_one(struct cfx_conn_request *req)
{
    struct cfxComm *comm = req->comm;
    CFX_CHECK(pick_transport(comm, req->peer, &req->transport));
    const struct cfx_transport *tr = cfx_transports[req->transport];
    struct cfx_connector *conn = calloc(1, sizeof(*conn));
    if (conn == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "out of memory for a connector");
    conn->peer_rank = req->peer;
    conn->dir = req->dir;
    conn->transport = tr;
    conn->transport_ctx = comm->transport_ctx[req->transport];
    req->conn = conn;
    struct conn_msg msg = {.transport = (uint32_t)req->transport, .slot_bytes = slot_bytes_of(req)};
    struct cfx_transport_peer peer = peer_of(comm, req->peer);
    CFX_CHECK(tr->setup(conn->transport_ctx, &peer, slot_bytes_of(req), comm->n_steps, conn,
                        msg.info));
    return cfx_bootstrap_send(comm->bootstrap, req->peer, conn_tag(req->kind, req->dir), &msg,
                              sizeof(msg));
}

/* Phase 3/4 for one request: receive the peer's info and connect. */
static cfxResult_t connect_one(struct cfx_conn_request *req, const struct conn_msg *peer_msg)
{
    struct cfxComm *comm = req->comm;
    if (peer_msg->transport != (uint32_t)req->transport ||
        peer_msg->slot_bytes != slot_bytes_of(req))
        return cfx_error_set(cfxInternalError, CFX_LOG_INIT,
                             "rank %d and rank %d chose different transports (%u, %d) or buffer "
                             "sizes (%llu, %zu); set CFX_BUFFSIZE/CFX_SHM_DISABLE alike on all ranks",
                             comm->rank, req->peer, peer_msg->transport, req->transport,
                             (unsigned long long)peer_msg->slot_bytes, slot_bytes_of(req));
    CFX_CHECK(req->conn->transport->connect(req->conn->transport_ctx, req->conn, peer_msg->info));
    CFX_INFO(CFX_LOG_INIT, "connection %s rank %d %s rank %d via %s", kind_name(req->kind),
             comm->rank, req->dir == CFX_CONN_SEND ? "->" : "<-", req->peer,
             req->conn->transport->name);
    return cfxSuccess;
}

cfxResult_t cfx_core_connect_batch(struct cfx_conn_request *reqs, int n_reqs)
{
    cfxResult_t res = cfxSuccess;
    struct conn_msg *peer_msgs = calloc((size_t)(n_reqs > 0 ? n_reqs : 1), sizeof(*peer_msgs));
    if (peer_msgs == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "out of memory while connecting");
    for (int i = 0; i < n_reqs; i++)
        CFX_CHECK_GOTO(setup_one(&reqs[i]), res, fail);
    for (int i = 0; i < n_reqs; i++) {
        enum cfx_conn_dir other = reqs[i].dir == CFX_CONN_SEND ? CFX_CONN_RECV : CFX_CONN_SEND;
        CFX_CHECK_GOTO(cfx_bootstrap_recv(reqs[i].comm->bootstrap, reqs[i].peer,
                                          conn_tag(reqs[i].kind, other), &peer_msgs[i],
                                          sizeof(peer_msgs[i])),
                       res, fail);
    }
    /* Send sides first: a receive side may wait for its sender to attach. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n_reqs; i++)
            if ((reqs[i].dir == CFX_CONN_SEND) == (pass == 0))
                CFX_CHECK_GOTO(connect_one(&reqs[i], &peer_msgs[i]), res, fail);
    for (int i = 0; i < n_reqs; i++) {
        *reqs[i].out_p = reqs[i].conn;
        reqs[i].conn = NULL;
    }
    free(peer_msgs);
    return cfxSuccess;
fail:
    for (int i = 0; i < n_reqs; i++) {
        close_conn(reqs[i].conn);
        reqs[i].conn = NULL;
    }
    free(peer_msgs);
    return res;
}

/* Every tree connector slot of @p comm, for teardown and poisoning. */
static int tree_conns(struct cfxComm *comm, struct cfx_connector ***slots)
{
    int n = 0;
    for (int t = 0; t < 2; t++) {
        struct cfx_tree_links *links = &comm->trees[t];
        slots[n++] = &links->to_parent;
        slots[n++] = &links->from_parent;
        for (int c = 0; c < CFX_TREE_MAX_CHILDREN; c++) {
            slots[n++] = &links->to_child[c];
            slots[n++] = &links->from_child[c];
        }
    }
    return n;
}

#define MAX_TREE_SLOTS (2 * (2 + 2 * CFX_TREE_MAX_CHILDREN))

void cfx_core_disconnect_all(struct cfxComm *comm)
{
    close_conn(comm->ring_send);
    close_conn(comm->ring_recv);
    comm->ring_send = comm->ring_recv = NULL;
    struct cfx_connector **slots[MAX_TREE_SLOTS];
    int n = tree_conns(comm, slots);
    for (int i = 0; i < n; i++) {
        close_conn(*slots[i]);
        *slots[i] = NULL;
    }
    for (int t = 0; t < 2; t++)
        for (int r = 0; comm->relay_send[t] && r < comm->nranks; r++) {
            close_conn(comm->relay_send[t][r]);
            close_conn(comm->relay_recv[t][r]);
            comm->relay_send[t][r] = comm->relay_recv[t][r] = NULL;
        }
    for (int r = 0; r < CFX_DIRECT_MAX_RANKS; r++) {
        close_conn(comm->direct.to[r]);
        close_conn(comm->direct.from[r]);
        comm->direct.to[r] = comm->direct.from[r] = NULL;
    }
    for (int r = 0; comm->p2p_send && r < comm->nranks; r++) {
        close_conn(comm->p2p_send[r]);
        close_conn(comm->p2p_recv[r]);
    }
    free(comm->p2p_send);
    free(comm->p2p_recv);
    comm->p2p_send = comm->p2p_recv = NULL;
    for (int t = 0; t < CFX_MAX_TRANSPORTS; t++) {
        if (comm->transport_ctx[t])
            cfx_transports[t]->fini(comm->transport_ctx[t]);
        comm->transport_ctx[t] = NULL;
    }
}

static void poison_conn(struct cfx_connector *conn, cfxResult_t reason, int blame_rank)
{
    if (conn && conn->transport && conn->transport->poison)
        conn->transport->poison(conn->transport_ctx, conn, reason, blame_rank);
}

void cfx_core_poison_all(struct cfxComm *comm, cfxResult_t reason, int blame_rank)
{
    if (blame_rank < 0)
        blame_rank = comm->rank;
    poison_conn(comm->ring_send, reason, blame_rank);
    poison_conn(comm->ring_recv, reason, blame_rank);
    struct cfx_connector **slots[MAX_TREE_SLOTS];
    int n = tree_conns(comm, slots);
    for (int i = 0; i < n; i++)
        poison_conn(*slots[i], reason, blame_rank);
    for (int t = 0; t < 2; t++)
        for (int r = 0; comm->relay_send[t] && r < comm->nranks; r++) {
            poison_conn(comm->relay_send[t][r], reason, blame_rank);
            poison_conn(comm->relay_recv[t][r], reason, blame_rank);
        }
    for (int r = 0; r < CFX_DIRECT_MAX_RANKS; r++) {
        poison_conn(comm->direct.to[r], reason, blame_rank);
        poison_conn(comm->direct.from[r], reason, blame_rank);
    }
    for (int r = 0; comm->p2p_send && r < comm->nranks; r++) {
        poison_conn(comm->p2p_send[r], reason, blame_rank);
        poison_conn(comm->p2p_recv[r], reason, blame_rank);
    }
}
