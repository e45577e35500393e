/*
 * Connection setup: picks a transport for each pair of ranks (the first in
 * priority order whose can_connect accepts), lets both sides set up, trades
 * their connect info over the bootstrap, and connects. Runs at init (the
 * ring) and at the first use of a peer (point to point) or of an algorithm
 * (tree, direct); never on the data path of an established connection.
 */
#include <assert.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/reduce.h"
#include "src/core/comm.h"
#include "src/core/probe.h"
#include "src/exec/host.h"
#include "src/util/check.h"
#include "src/util/log.h"

/* What one side tells the other. */
struct conn_msg {
    uint32_t transport; /* Index in cfx_transports: both sides must agree. */
    uint32_t reserved;
    uint64_t slot_bytes;
    char info[CFX_CONNECT_INFO_BYTES];
};

/* What a rank whose connecting failed tells the peers of its batch, so
 * that they stop waiting for it and can say why. */
struct conn_notice {
    int32_t reason;     /* cfxResult_t. */
    int32_t blame_rank; /* The rank the failure is about (a dead rank, or the sender). */
};

#define NOTICE_TAG 0x434e46ffu /* "CNF": never a cfx_core_conn_tag() (bit 7 set). */
/* A connection's tag with bit 7 set: "connected" of a transport that asks
 * for it (CFX_TRANSPORT_FLAG_CONNECT_ACK). Kinds stay below 0x46, so never
 * NOTICE_TAG. */
#define READY_TAG_BIT  0x80u
#define WAIT_SLICE_MS  50    /* Longest wait between checks of the peers. */
#define NOTICE_SEND_MS 200   /* How long a notice may take to leave. */
#define DEATH_POLL_US  10000 /* Between looks at a dying peer. */

/* "CN", the kind, then the channel and the direction: channel << 1 | dir
 * stays below 0x80 (CFX_CONN_MAX_CHANNELS is 64), so NOTICE_TAG is never one. */
uint32_t cfx_core_conn_tag(int kind, enum cfx_conn_dir dir, int channel)
{
    assert(kind > 0 && kind < 0x100 && channel >= 0 && channel < CFX_CONN_MAX_CHANNELS);
    return 0x434e0000u | ((uint32_t)kind << 8) | ((uint32_t)channel << 1) | (uint32_t)dir;
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

/* ------------------------------------------------------- dead peers */

/* Whether process @p pid has ended: gone, or a zombie nobody reaped yet. */
static int process_ended(int pid)
{
    if (kill(pid, 0) != 0)
        return errno == ESRCH;
    char path[64], text[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *paren = strrchr(text, ')'); /* The name may hold anything but ends here. */
    return paren != NULL && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

uint32_t cfx_core_pid_ns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint32_t)st.st_ino : 0;
}

cfxResult_t cfx_core_peers_watch(struct cfxComm *comm)
{
    comm->pid_watched = calloc((size_t)comm->nranks, 1);
    if (comm->pid_watched == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "out of memory for the peer table");
    const struct cfx_peer_info *me = &comm->peers[comm->rank];
    for (int r = 0; r < comm->nranks; r++)
        /* In another PID namespace the same number is no process, or another one. */
        comm->pid_watched[r] = r != comm->rank && comm->peers[r].host_hash == me->host_hash &&
                               me->pid_ns != 0 && comm->peers[r].pid_ns == me->pid_ns &&
                               comm->peers[r].pid != me->pid;
    return cfxSuccess;
}

static int peer_gone(const struct cfxComm *comm, int peer)
{
    return comm->pid_watched && comm->pid_watched[peer] && process_ended(comm->peers[peer].pid);
}

int cfx_core_peer_dead(struct cfxComm *comm, int64_t grace_ms)
{
    if (comm->peers == NULL || comm->bootstrap == NULL)
        return -1;
    /* Peers that failed because another died said so before they left
     * (their notices): trust those first, and do not take their own exit
     * for the cause. */
    uint8_t *told = calloc((size_t)comm->nranks, 1);
    if (told != NULL && comm->noticed != NULL) /* Notices the connect waits read already. */
        memcpy(told, comm->noticed, (size_t)comm->nranks);
    int64_t until = cfx_time_now_ns() + grace_ms * CFX_NS_PER_MS;
    int dead = -1;
    while (dead < 0) {
        for (int r = 0; r < comm->nranks && dead < 0; r++) {
            struct conn_notice notice;
            int got = 0;
            if (r == comm->rank || cfx_bootstrap_try_recv(comm->bootstrap, r, NOTICE_TAG, &notice,
                                                          sizeof(notice), &got) != cfxSuccess)
                continue;
            if (got && told)
                told[r] = 1;
            if (got && notice.blame_rank != r && notice.blame_rank >= 0 &&
                notice.blame_rank < comm->nranks)
                dead = notice.blame_rank;
        }
        for (int r = 0; r < comm->nranks && dead < 0; r++)
            if ((told == NULL || !told[r]) && peer_gone(comm, r))
                dead = r;
        if (dead >= 0 || cfx_time_now_ns() >= until)
            break;
        usleep(DEATH_POLL_US);
    }
    free(told);
    return dead;
}

/* ------------------------------------------------------ waiting on peers */

/* What one request is for, as its failure sentence starts:
 * "rank 1's cfxRecv from rank 0 (4096 bytes)". */
static void describe(const struct cfx_conn_request *req, char *text, size_t size)
{
    const struct cfx_op *op = req->op;
    int rank = req->comm->rank;
    if (op == NULL) {
        snprintf(text, size, "rank %d's communicator init (its %s connection %s rank %d)", rank,
                 kind_name(req->kind), req->dir == CFX_CONN_SEND ? "to" : "from", req->peer);
        return;
    }
    size_t bytes = op->count * cfx_type_size(op->type);
    if (op->kind == CFX_COLL_SEND || op->kind == CFX_COLL_RECV)
        snprintf(text, size, "rank %d's %s rank %d%s (%zu bytes)", rank,
                 op->kind == CFX_COLL_SEND ? "cfxSend to" : "cfxRecv from", op->root,
                 op->root == rank ? ", itself" : "", bytes);
    else
        snprintf(text, size, "rank %d's %s #%llu (%zu bytes; its %s connection %s rank %d)", rank,
                 cfx_coll_name(op->kind), (unsigned long long)op->print.seq, bytes,
                 kind_name(req->kind), req->dir == CFX_CONN_SEND ? "to" : "from", req->peer);
}

/* The deadline of a batch: the communicator's timeout (config.timeout or
 * CFX_TIMEOUT) when a call needs it, else (init)
 * CFX_BOOTSTRAP_TIMEOUT; 0: none. *seconds_p and *name_p say which. */
static int64_t batch_deadline(const struct cfx_conn_request *reqs, int n_reqs, int64_t *seconds_p,
                              const char **name_p)
{
    int by_call = n_reqs > 0 && reqs[0].op != NULL;
    *seconds_p = by_call ? reqs[0].comm->timeout_s : cfx_bootstrap_timeout_s();
    *name_p = by_call ? reqs[0].comm->timeout_name : "CFX_BOOTSTRAP_TIMEOUT";
    return *seconds_p > 0 ? cfx_time_deadline_s(*seconds_p) : 0;
}

/* Whether @p peer of @p comm can still answer: cfxRemoteError when its
 * process is gone or it told us that a rank died, the reason it gave when
 * it gave up itself, cfxRemoteError when aborted; each with a sentence
 * about the peer (the caller adds what waited). *blame_p: the rank it is
 * about. */
static cfxResult_t watch_peer(struct cfxComm *comm, int peer, int *blame_p)
{
    *blame_p = peer;
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
        *blame_p = comm->rank;
        return cfx_error_set(cfxRemoteError, CFX_LOG_INIT, "the communicator was aborted");
    }
    if (peer == comm->rank)
        return cfxSuccess;
    /* A peer that said why it left is believed before its exit is seen. */
    struct conn_notice notice;
    int got = 0;
    CFX_CHECK(
        cfx_bootstrap_try_recv(comm->bootstrap, peer, NOTICE_TAG, &notice, sizeof(notice), &got));
    if (!got && peer_gone(comm, peer))
        return cfx_error_set(cfxRemoteError, CFX_LOG_INIT,
                             "rank %d is gone (its process, pid %d, exited or was killed)", peer,
                             comm->peers[peer].pid);
    if (!got)
        return cfxSuccess;
    if (comm->noticed == NULL)
        comm->noticed = calloc((size_t)comm->nranks, 1); /* Failure path only. */
    if (comm->noticed != NULL)
        comm->noticed[peer] = 1;
    int blame =
        notice.blame_rank >= 0 && notice.blame_rank < comm->nranks ? notice.blame_rank : peer;
    *blame_p = blame;
    if (blame != peer)
        return cfx_error_set(cfxRemoteError, CFX_LOG_INIT,
                             "rank %d is gone (rank %d, which was connecting to it, saw it die "
                             "and gave up)",
                             blame, peer);
    if (notice.reason == cfxTimeout)
        return cfx_error_set(cfxTimeout, CFX_LOG_INIT,
                             "rank %d gave up first: its own call timed out waiting for this "
                             "rank, so no call there matches this one",
                             peer);
    return cfx_error_set(cfxRemoteError, CFX_LOG_INIT,
                         "rank %d failed while connecting (result %d; its own error says why)",
                         peer, (int)notice.reason);
}

/* The transports' connect_check: the peer's state and the batch's deadline. */
static cfxResult_t connect_check(void *arg, int peer)
{
    struct cfxComm *comm = arg;
    int blame = peer;
    cfxResult_t res = watch_peer(comm, peer, &blame);
    if (res == cfxSuccess && comm->connect_deadline_ns > 0 &&
        cfx_time_now_ns() >= comm->connect_deadline_ns)
        res = cfx_error_set(cfxTimeout, CFX_LOG_INIT,
                            "rank %d did not finish connecting before the deadline", peer);
    if (res != cfxSuccess)
        comm->connect_blame_rank = blame;
    return res;
}

/* What the transports learn of @p rank: the peer table's entry, and the
 * path to it from this rank (src/topo stays above them). */
static struct cfx_transport_peer peer_of(const struct cfxComm *comm, int rank)
{
    const struct cfx_peer_info *info = &comm->peers[rank];
    const struct cfx_topo_system *sys = comm->nranks > 1 ? cfx_core_algo_topology() : NULL;
    struct cfx_transport_peer peer = {.rank = rank,
                                      .pid = info->pid,
                                      .cuda_dev = info->cuda_dev,
                                      .host_hash = info->host_hash,
                                      .path =
                                          cfx_core_locate_path(sys, &comm->peers[comm->rank], info),
                                      .nic_index = info->nic_index};
    snprintf(peer.busid, sizeof(peer.busid), "%s", info->busid);
    snprintf(peer.nic_name, sizeof(peer.nic_name), "%s", info->nic_name);
    return peer;
}

/* Where this rank's side of every connection lives: host memory for a host
 * rank; for a GPU rank, host memory pinned and mapped for its device, which
 * its kernels and host threads (host buffers on a GPU rank) both reach. */
static struct cfx_conn_place place_of(const struct cfxComm *comm)
{
    if (comm->cuda_dev < 0)
        return CFX_CONN_PLACE_HOST;
    return (struct cfx_conn_place){
        .mem = CFX_MEM_HOST_PINNED, .device = comm->cuda_dev, .reader = CFX_READER_KERNEL};
}

/* The first transport, in priority order, that can connect this rank and
 * @p peer and honour @p place; else the sentence of the last refusal. */
static cfxResult_t pick_transport(struct cfxComm *comm, int peer,
                                  const struct cfx_conn_place *place, int *index_p)
{
    struct cfx_transport_peer self = peer_of(comm, comm->rank), other = peer_of(comm, peer);
    cfxResult_t refused = cfxSuccess;
    char why[CFX_ERROR_MAX] = "";
    for (int t = 0; cfx_transports[t] != NULL && t < CFX_MAX_TRANSPORTS; t++) {
        const struct cfx_transport *tr = cfx_transports[t];
        if (comm->transport_ctx[t] == NULL) {
            struct cfx_transport_env env = {.rank = comm->rank,
                                            .nranks = comm->nranks,
                                            .abort_flag = &comm->abort_flag,
                                            .connect_timeout_s = cfx_bootstrap_timeout_s(),
                                            .nic_name = comm->peers[comm->rank].nic_name,
                                            .nic_path = comm->peers[comm->rank].nic_path,
                                            .nic_near = comm->nic_near,
                                            .connect_check = connect_check,
                                            .connect_check_arg = comm};
            CFX_CHECK(tr->init(&env, &comm->transport_ctx[t]));
            /* Buffers registered before this transport started. */
            for (struct cfx_core_reg *reg = comm->regs; reg != NULL; reg = reg->next)
                if (cfx_core_reg_with(comm, reg, t) != cfxSuccess)
                    CFX_INFO(CFX_LOG_INIT,
                             "a registered buffer stays unregistered with the %s transport: %s",
                             tr->name, cfx_error_thread_last());
        }
        if (!tr->can_connect(comm->transport_ctx[t], &self, &other))
            continue;
        refused = cfx_transport_place_check(tr, place);
        if (refused == cfxSuccess) {
            *index_p = t;
            return cfxSuccess;
        }
        snprintf(why, sizeof(why), "%s", cfx_error_thread_last());
    }
    if (refused != cfxSuccess)
        return cfx_error_set(refused, CFX_LOG_INIT,
                             "rank %d: no transport that reaches rank %d (host %s) can serve this "
                             "rank's side (%s); %s",
                             comm->rank, peer, comm->peers[peer].host_id,
                             place->reader == CFX_READER_KERNEL ? "a GPU rank" : "a host rank",
                             why);
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

/* Send our connect info for @p req, in slices, watching the peer: a dead
 * peer's listener refuses until the bootstrap's own deadline. */
static cfxResult_t unanswered(const struct cfx_conn_request *req, int64_t seconds,
                              const char *timeout_name);

static cfxResult_t send_info(struct cfx_conn_request *req, const struct conn_msg *msg,
                             uint32_t tag_bits, int64_t deadline, int64_t seconds,
                             const char *timeout_name, int *blame_p)
{
    struct cfxComm *comm = req->comm;
    uint32_t tag = cfx_core_conn_tag(req->kind, req->dir, req->channel) | tag_bits;
    for (;;) {
        cfxResult_t res = cfx_bootstrap_send_within(comm->bootstrap, req->peer, tag, msg,
                                                    sizeof(*msg), 4 * WAIT_SLICE_MS);
        if (res != cfxTimeout)
            return res;
        CFX_CHECK(watch_peer(comm, req->peer, blame_p));
        if (deadline > 0 && cfx_time_now_ns() >= deadline)
            return unanswered(req, seconds, timeout_name);
        cfx_error_thread_clear();
    }
}

/* Phase 1 for one request: set up our side and send our info to the peer. */
static cfxResult_t setup_one(struct cfx_conn_request *req, int64_t deadline, int64_t seconds,
                             const char *timeout_name, int *blame_p)
{
    struct cfxComm *comm = req->comm;
    struct cfx_conn_place place = place_of(comm);
    CFX_CHECK(pick_transport(comm, req->peer, &place, &req->transport));
    const struct cfx_transport *tr = cfx_transports[req->transport];
    /* Point to point through memory both ranks map (a transport that can
     * read the peer's memory: shm) keeps small FIFOs that stay in cache;
     * over a socket, 1 MiB FIFOs ran 1.1-1.5x slower than 4 MiB. */
    if (req->kind == CFX_CONN_KIND_P2P && req->slot_bytes == 0 && tr->read_peer != NULL)
        req->slot_bytes = cfx_core_p2p_slot_bytes(comm, req->peer);
    struct cfx_connector *conn = calloc(1, sizeof(*conn));
    if (conn == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "out of memory for a connector");
    conn->peer_rank = req->peer;
    conn->dir = req->dir;
    conn->channel = req->channel;
    conn->place = place;
    conn->transport = tr;
    conn->transport_ctx = comm->transport_ctx[req->transport];
    req->conn = conn;
    struct conn_msg msg = {.transport = (uint32_t)req->transport, .slot_bytes = slot_bytes_of(req)};
    struct cfx_transport_peer peer = peer_of(comm, req->peer);
    CFX_CHECK(
        tr->setup(conn->transport_ctx, &peer, slot_bytes_of(req), comm->n_steps, conn, msg.info));
    return send_info(req, &msg, 0, deadline, seconds, timeout_name, blame_p);
}

/* The sentence of a request whose peer never sent its side before the
 * batch's deadline: the call it waited for, by name. */
static cfxResult_t unanswered(const struct cfx_conn_request *req, int64_t seconds,
                              const char *timeout_name)
{
    const struct cfx_op *op = req->op;
    if (op == NULL)
        return cfx_error_set(cfxTimeout, CFX_LOG_INIT,
                             "rank %d did not answer within %s=%lld s; check that every rank "
                             "was started and is still running",
                             req->peer, timeout_name, (long long)seconds);
    if (op->kind == CFX_COLL_SEND || op->kind == CFX_COLL_RECV)
        return cfx_error_set(cfxTimeout, CFX_LOG_P2P,
                             "no matching %s on rank %d within %s=%lld s (a send and its receive "
                             "must both be called; two ranks that both send first must put "
                             "their calls in a group)",
                             op->kind == CFX_COLL_SEND ? "cfxRecv" : "cfxSend", req->peer,
                             timeout_name, (long long)seconds);
    return cfx_error_set(cfxTimeout, CFX_LOG_COLL, "rank %d did not call the %s within %s=%lld s",
                         req->peer, cfx_coll_name(op->kind), timeout_name, (long long)seconds);
}

/* Whether @p req's transport wants both sides told "connected" before use. */
static int wants_ack(const struct cfx_conn_request *req)
{
    return (cfx_transports[req->transport]->flags & CFX_TRANSPORT_FLAG_CONNECT_ACK) != 0;
}

/* Phase 2: receive every peer's info, watching the peers and the deadline.
 * With @p tag_bits READY_TAG_BIT: every "connected" of the requests whose
 * transport asks for them instead (phase 4). */
static cfxResult_t recv_infos(struct cfx_conn_request *reqs, int n_reqs, struct conn_msg *peer_msgs,
                              uint32_t tag_bits, int64_t deadline, int64_t seconds,
                              const char *timeout_name, int *failed_p, int *blame_p)
{
    int done = 0;
    char *got = calloc((size_t)(n_reqs > 0 ? n_reqs : 1), 1);
    if (got == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "out of memory while connecting");
    cfxResult_t res = cfxSuccess;
    for (int i = 0; tag_bits && i < n_reqs; i++)
        if (!wants_ack(&reqs[i])) {
            got[i] = 1;
            done++;
        }
    while (done < n_reqs) {
        int waited = 0;
        for (int i = 0; i < n_reqs && res == cfxSuccess; i++) {
            if (got[i])
                continue;
            enum cfx_conn_dir other = reqs[i].dir == CFX_CONN_SEND ? CFX_CONN_RECV : CFX_CONN_SEND;
            int here = 0;
            /* Wait a slice on the first missing message only; take the others as they are. */
            res = cfx_bootstrap_recv_within(
                reqs[i].comm->bootstrap, reqs[i].peer,
                cfx_core_conn_tag(reqs[i].kind, other, reqs[i].channel) | tag_bits, &peer_msgs[i],
                sizeof(peer_msgs[i]), waited ? 0 : WAIT_SLICE_MS, &here);
            waited = 1;
            *failed_p = i;
            if (res == cfxSuccess && here) {
                got[i] = 1;
                done++;
            } else if (res == cfxSuccess) {
                res = watch_peer(reqs[i].comm, reqs[i].peer, blame_p);
                if (res == cfxSuccess)
                    res = cfx_core_probe_conflict(reqs[i].comm, reqs[i].op, blame_p);
            }
        }
        if (res != cfxSuccess || done == n_reqs)
            break;
        if (deadline > 0 && cfx_time_now_ns() >= deadline) {
            for (int i = 0; i < n_reqs; i++)
                if (!got[i]) {
                    *failed_p = i;
                    *blame_p = reqs[i].peer;
                    res = unanswered(&reqs[i], seconds, timeout_name);
                    break;
                }
            break;
        }
    }
    free(got);
    return res;
}

/* A point-to-point receive side tells its sender, in the FIFO control block
 * they share, from which size on it reads the sender's buffer itself
 * (src/coll/pull.h), or CFX_PULL_NEVER; the sender reads it at its first
 * send (cfx_core_pull_threshold). Host ranks only: a GPU rank's buffers may
 * be device memory, which process_vm_readv cannot read. */
static void publish_pull(struct cfxComm *comm, struct cfx_connector *conn)
{
    uint64_t min = CFX_PULL_NEVER;
    if (conn->peer_readable && conn->transport->read_peer != NULL &&
        conn->place.mem == CFX_MEM_HOST && conn->place.reader == CFX_READER_HOST_THREAD)
        min = cfx_core_same_process(comm, conn->peer_rank) ? comm->p2p_single_copy_min
                                                           : comm->p2p_single_copy_min_far;
    conn->pull_min = min;
    cfx_store_release_u64(&conn->fifo->pull_min, min);
}

int cfx_core_same_process(const struct cfxComm *comm, int peer)
{
    const struct cfx_peer_info *me = &comm->peers[comm->rank], *them = &comm->peers[peer];
    return them->host_hash == me->host_hash && strcmp(them->host_id, me->host_id) == 0 &&
           them->pid_ns != 0 && them->pid_ns == me->pid_ns && them->pid == me->pid;
}

size_t cfx_core_p2p_slot_bytes(const struct cfxComm *comm, int peer)
{
    const struct cfx_peer_info *me = &comm->peers[comm->rank], *them = &comm->peers[peer];
    int local_hosts = them->host_hash == me->host_hash && strcmp(them->host_id, me->host_id) == 0 &&
                      me->cuda_dev < 0 && them->cuda_dev < 0;
    return local_hosts ? comm->p2p_local_slot_bytes : 0;
}

/* Largest wait for a receiver's verdict between two looks at the peer. */
#define PULL_LOOK_EVERY_NS (100 * 1000 * 1000)

cfxResult_t cfx_core_pull_threshold(struct cfxComm *comm, struct cfx_connector *conn,
                                    uint64_t *min_p)
{
    if (conn->pull_min == 0 && conn->transport->read_peer == NULL)
        conn->pull_min = CFX_PULL_NEVER; /* Nothing shared to publish in. */
    if (conn->pull_min == 0) {
        /* A send side before its receiver finished connecting: the receive
         * side's connect already saw this side attach, so the wait is short. */
        int64_t deadline = comm->timeout_s > 0 ? cfx_time_deadline_s(comm->timeout_s) : 0;
        int64_t next_look = cfx_time_now_ns() + PULL_LOOK_EVERY_NS;
        uint64_t min;
        while ((min = cfx_load_acquire_u64(&conn->fifo->pull_min)) == 0) {
            int64_t now = cfx_time_now_ns();
            if (now >= next_look) {
                int blame;
                cfxResult_t res = watch_peer(comm, conn->peer_rank, &blame);
                if (res == cfxSuccess && cfx_fifo_closed(&conn->view))
                    res = cfx_error_set(cfxRemoteError, CFX_LOG_P2P,
                                        "rank %d closed its connection before it finished "
                                        "connecting",
                                        conn->peer_rank);
                if (res == cfxSuccess && deadline > 0 && now >= deadline)
                    res = cfx_error_set(cfxTimeout, CFX_LOG_P2P,
                                        "rank %d did not finish connecting its receive side "
                                        "within %lld s (%s)",
                                        conn->peer_rank, (long long)comm->timeout_s,
                                        comm->timeout_name);
                if (res != cfxSuccess)
                    return res;
                next_look = now + PULL_LOOK_EVERY_NS;
            }
            sched_yield();
        }
        conn->pull_min = min;
    }
    *min_p = conn->pull_min;
    return cfxSuccess;
}

/* Phase 3/4 for one request: receive the peer's info and connect. */
static cfxResult_t connect_one(struct cfx_conn_request *req, const struct conn_msg *peer_msg)
{
    struct cfxComm *comm = req->comm;
    if (peer_msg->transport != (uint32_t)req->transport ||
        peer_msg->slot_bytes != slot_bytes_of(req))
        return cfx_error_set(
            cfxInternalError, CFX_LOG_INIT,
            "rank %d and rank %d chose different transports (%u, %d) or buffer "
            "sizes (%llu, %zu); set CFX_BUFFSIZE/CFX_P2P_LOCAL_BUFFSIZE/CFX_SHM_DISABLE alike on "
            "all ranks",
            comm->rank, req->peer, peer_msg->transport, req->transport,
            (unsigned long long)peer_msg->slot_bytes, slot_bytes_of(req));
    CFX_CHECK(req->conn->transport->connect(req->conn->transport_ctx, req->conn, peer_msg->info));
    if (req->kind == CFX_CONN_KIND_P2P && req->dir == CFX_CONN_RECV)
        publish_pull(comm, req->conn);
    char channel[24] = "";
    if (req->channel != 0)
        snprintf(channel, sizeof(channel), " (channel %d)", req->channel);
    CFX_INFO(CFX_LOG_INIT, "connection %s rank %d %s rank %d via %s%s", kind_name(req->kind),
             comm->rank, req->dir == CFX_CONN_SEND ? "->" : "<-", req->peer,
             req->conn->transport->name, channel);
    return cfxSuccess;
}

void cfx_core_tell_peers_dead(struct cfxComm *comm, int dead)
{
    if (comm->peers == NULL || comm->bootstrap == NULL)
        return;
    struct conn_notice notice = {.reason = (int32_t)cfxRemoteError, .blame_rank = dead};
    for (int r = 0; r < comm->nranks; r++) {
        if (r == comm->rank || r == dead || peer_gone(comm, r))
            continue;
        if (cfx_bootstrap_send_within(comm->bootstrap, r, NOTICE_TAG, &notice, sizeof(notice),
                                      NOTICE_SEND_MS) != cfxSuccess)
            CFX_INFO(CFX_LOG_INIT, "rank %d could not tell rank %d that rank %d died", comm->rank,
                     r, dead);
    }
}

/* After a failure: name the call, and tell every other peer of the batch
 * (they may be waiting for us) why, so they fail now and name the rank. */
static cfxResult_t fail_batch(struct cfx_conn_request *reqs, int n_reqs, int failed, int blame,
                              cfxResult_t res)
{
    char what[192], cause[CFX_ERROR_MAX];
    describe(&reqs[failed], what, sizeof(what));
    snprintf(cause, sizeof(cause), "%s", cfx_error_thread_last());
    for (int i = 0; i < n_reqs; i++) {
        struct cfxComm *comm = reqs[i].comm;
        int first = 1;
        for (int j = 0; j < i && first; j++)
            first = reqs[j].comm != comm || reqs[j].peer != reqs[i].peer;
        /* A dead rank hears nothing; the others hear whom it is about. */
        int dead =
            comm == reqs[failed].comm && res == cfxRemoteError && blame != comm->rank ? blame : -1;
        if (!first || reqs[i].peer == comm->rank || reqs[i].peer == dead ||
            peer_gone(comm, reqs[i].peer))
            continue;
        struct conn_notice notice = {.reason = (int32_t)res,
                                     .blame_rank = dead >= 0 ? dead : comm->rank};
        if (cfx_bootstrap_send_within(comm->bootstrap, reqs[i].peer, NOTICE_TAG, &notice,
                                      sizeof(notice), NOTICE_SEND_MS) != cfxSuccess)
            CFX_INFO(CFX_LOG_INIT, "rank %d could not tell rank %d that connecting failed",
                     comm->rank, reqs[i].peer);
    }
    return cfx_error_set(res, CFX_LOG_INIT, "%s: %s", what, cause);
}

cfxResult_t cfx_core_connect_batch(struct cfx_conn_request *reqs, int n_reqs)
{
    cfxResult_t res = cfxSuccess;
    int failed = 0, blame = -1;
    int64_t seconds;
    const char *timeout_name;
    int64_t deadline = batch_deadline(reqs, n_reqs, &seconds, &timeout_name);
    struct conn_msg *peer_msgs = calloc((size_t)(n_reqs > 0 ? n_reqs : 1), sizeof(*peer_msgs));
    if (peer_msgs == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "out of memory while connecting");
    for (int i = 0; i < n_reqs; i++)
        reqs[i].comm->connect_deadline_ns = deadline;
    for (int i = 0; i < n_reqs; i++) {
        failed = i;
        blame = reqs[i].comm->rank;
        CFX_CHECK_GOTO(setup_one(&reqs[i], deadline, seconds, timeout_name, &blame), res, fail);
    }
    blame = -1;
    CFX_CHECK_GOTO(
        recv_infos(reqs, n_reqs, peer_msgs, 0, deadline, seconds, timeout_name, &failed, &blame),
        res, fail);
    /* Send sides first: a receive side may wait for its sender to attach. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n_reqs; i++)
            if ((reqs[i].dir == CFX_CONN_SEND) == (pass == 0)) {
                failed = i;
                blame = reqs[i].peer;
                reqs[i].comm->connect_blame_rank = -1;
                res = connect_one(&reqs[i], &peer_msgs[i]);
                /* Phase 4: tell the peer this side is connected (an RC queue
                 * pair drops what reaches it before then). */
                if (res == cfxSuccess && wants_ack(&reqs[i]))
                    res = send_info(&reqs[i], &peer_msgs[i], READY_TAG_BIT, deadline, seconds,
                                    timeout_name, &blame);
                if (res != cfxSuccess) {
                    if (reqs[i].comm->connect_blame_rank >= 0)
                        blame = reqs[i].comm->connect_blame_rank;
                    goto fail;
                }
            }
    /* ... and hear the same from every such peer before anything is posted. */
    blame = -1;
    CFX_CHECK_GOTO(recv_infos(reqs, n_reqs, peer_msgs, READY_TAG_BIT, deadline, seconds,
                              timeout_name, &failed, &blame),
                   res, fail);
    for (int i = 0; i < n_reqs; i++) {
        *reqs[i].out_p = reqs[i].conn;
        reqs[i].conn = NULL;
        reqs[i].comm->connect_deadline_ns = 0;
    }
    free(peer_msgs);
    return cfxSuccess;
fail:
    if (blame < 0)
        blame = reqs[failed].peer;
    res = fail_batch(reqs, n_reqs, failed, blame, res);
    for (int i = 0; i < n_reqs; i++) {
        close_conn(reqs[i].conn);
        reqs[i].conn = NULL;
        reqs[i].comm->connect_deadline_ns = 0;
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
    for (int c = 0; c < CFX_RING_CHANNELS - 1; c++) {
        close_conn(comm->ring_more_send[c]);
        close_conn(comm->ring_more_recv[c]);
        comm->ring_more_send[c] = comm->ring_more_recv[c] = NULL;
    }
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
        if (comm->transport_ctx[t]) {
            cfx_core_reg_release(comm, t);
            cfx_transports[t]->fini(comm->transport_ctx[t]);
        }
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
    for (int c = 0; c < CFX_RING_CHANNELS - 1; c++) {
        poison_conn(comm->ring_more_send[c], reason, blame_rank);
        poison_conn(comm->ring_more_recv[c], reason, blame_rank);
    }
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
