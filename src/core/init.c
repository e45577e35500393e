/*
 * Communicator lifecycle: create (by id, by split, all in one process),
 * finalize, destroy, abort.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/core/argcheck.h"
#include "src/core/blame.h"
#include "src/core/comm.h"
#include "src/exec/cuda.h"
#include "src/exec/host.h"
#include "src/util/check.h"
#include "src/util/cuda.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"

CFX_PARAM_SIZE(buffsize, "BUFFSIZE", 4 << 20, 64, UINT32_MAX,
               "Bytes of FIFO per connection (split into CFX_STEPS slots)");
CFX_PARAM_INT(steps, "STEPS", 8, INT64_MIN, INT64_MAX, /* Range: pick_geometry. */
              "Slots per connection FIFO, 2..64");
CFX_PARAM_INT(spin_count, "SPIN_COUNT", -1, -1, INT32_MAX,
              "Idle polls of a blocked call before it yields the core; -1: 2000, or 20 when "
              "this host's ranks outnumber the cores this process may run on");
CFX_PARAM_INT(check_mismatch, "CHECK_MISMATCH", 1, 0, 1,
              "1: every slot carries its operation's fingerprint and receivers compare them");
CFX_PARAM_INT(single_copy, "SINGLE_COPY", 1, 0, 1,
              "1: ranks of one host read large allgathers straight from each other's buffers "
              "(one copy, process_vm_readv) where the kernel allows it; 0: always through the "
              "FIFO");
CFX_PARAM_SIZE(single_copy_min, "SINGLE_COPY_MIN_BYTES", -1, -1, INT64_MAX,
               "Smallest allgather (bytes per rank) that takes the single-copy path. -1: 1 MiB "
               "where every rank's ring predecessor is a thread of its process, never where one "
               "is another process (process_vm_readv ran slower than the FIFO there)");
CFX_PARAM_SIZE(p2p_single_copy_min, "P2P_SINGLE_COPY_MIN_BYTES", -1, -1, INT64_MAX,
               "Smallest send (bytes) that the receiver reads straight from the sender's "
               "buffer (one copy; sends, receives, all-to-all, gather, scatter), where "
               "CFX_SINGLE_COPY allows it; the receiver's value is the pair's. -1: 256 KiB "
               "between threads of one process (a plain copy), never between processes (there "
               "process_vm_readv ran 1.3-2.4x slower than the FIFO's two copies)");
CFX_PARAM_SIZE(p2p_local_buffsize, "P2P_LOCAL_BUFFSIZE", 1 << 20, 0, UINT32_MAX,
               "Bytes of a point-to-point FIFO between host ranks of one host over shm (sends, "
               "receives, all-to-all, gather, scatter), in CFX_STEPS slots; 0: CFX_BUFFSIZE. "
               "Small, so that the 2(n-1) such FIFOs of a rank stay in cache");

/* Fields of @p config the caller actually has (an older header may be smaller). */
static int config_int(const cfxConfig_t *config, size_t offset, int fallback)
{
    if (config == NULL || config->size < offset + sizeof(int))
        return fallback;
    int value;
    memcpy(&value, (const char *)config + offset, sizeof(value));
    return value == CFX_CONFIG_UNDEF_INT ? fallback : value;
}

static void print_version_once(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, cfx_core_print_version);
}

/* Free what @p comm holds; its header stays, dead (handle.c). The caller
 * has closed it (no call can hold it), or never handed it out. */
static void comm_free(struct cfxComm *comm)
{
    if (comm == NULL)
        return;
    cfx_core_registry_remove(comm);
    cfx_core_gpu_close(comm); /* Its kernels are done with the connectors first. */
    cfx_core_disconnect_all(comm);
    cfx_core_algo_fini(comm);
    cfx_bootstrap_destroy(comm->bootstrap);
    cfx_core_flight_fini(comm);
    free(comm->p2p_send_seq);
    free(comm->p2p_recv_seq);
    free(comm->pid_watched);
    free(comm->peers);
    free(comm->noticed);
    free(comm->batch_ops);
    comm->batch_ops = NULL;
    cfx_core_reg_free_all(comm);
    cfx_core_handle_retire(comm);
}

static cfxResult_t comm_alloc(int rank, int nranks, const cfxConfig_t *config,
                              struct cfxComm **comm_p)
{
    struct cfxComm *comm = cfx_core_handle_alloc();
    if (comm == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "out of memory for a communicator");
    comm->rank = rank;
    comm->nranks = nranks;
    comm->blocking = config_int(config, offsetof(cfxConfig_t, blocking), 1);
    comm->timeout_s = config_int(config, offsetof(cfxConfig_t, timeout), -1);
    comm->timeout_name = "config.timeout";
    if (comm->timeout_s < 0) {
        comm->timeout_s = cfx_exec_host_timeout_s();
        comm->timeout_name = "CFX_TIMEOUT";
    }
    const char *name = NULL;
    if (config && config->size >= offsetof(cfxConfig_t, commName) + sizeof(char *))
        name = config->commName;
    snprintf(comm->name, sizeof(comm->name), "%s", name ? name : "");
    comm->cuda_dev = cfx_cuda_rank_device();
    *comm_p = comm;
    return cfxSuccess;
}

/* Fewest slots per FIFO that every schedule can run with. */
#define MIN_STEPS 2

/* FIFO geometry from CFX_BUFFSIZE and CFX_STEPS; every rank must agree. */
static cfxResult_t pick_geometry(struct cfxComm *comm)
{
    int64_t steps = param_steps(), bytes = param_buffsize();
    /* A ring step takes a slot and posts one in the same step: with one slot
     * per FIFO every rank would hold its only send slot while waiting for a
     * free one downstream, forever. */
    if (steps < MIN_STEPS || steps > CFX_MAX_STEPS)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "CFX_STEPS=%lld is out of range: slots per FIFO must be %d..%d (a "
                             "ring step holds one slot while it waits for another)",
                             (long long)steps, MIN_STEPS, CFX_MAX_STEPS);
    if (bytes < steps * 64 || bytes >= ((int64_t)1 << 32))
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "CFX_BUFFSIZE=%lld is out of range with CFX_STEPS=%lld: at least 64 "
                             "bytes per slot, less than 4 GiB",
                             (long long)bytes, (long long)steps);
    size_t slot = (size_t)(bytes / steps);
    slot = slot >= 4096 ? slot & ~(size_t)4095 : slot & ~(size_t)63;
    comm->slot_bytes = slot;
    comm->n_steps = (int)steps;
    int64_t local = param_p2p_local_buffsize();
    if (local != 0 && local < steps * 64)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "CFX_P2P_LOCAL_BUFFSIZE=%lld is out of range with CFX_STEPS=%lld: "
                             "0, or at least 64 bytes per slot",
                             (long long)local, (long long)steps);
    size_t local_slot = local == 0 ? slot : (size_t)(local / steps);
    local_slot = local_slot >= 4096 ? local_slot & ~(size_t)4095 : local_slot & ~(size_t)63;
    comm->p2p_local_slot_bytes = local_slot < slot ? local_slot : slot;
    return cfxSuccess;
}

/* The peer tables, and the ring every collective runs on (ring 0 of the
 * plan, or rank + 1; cfx_core_algo_ring_next). */
static cfxResult_t connect_ring(struct cfxComm *comm)
{
    comm->p2p_send = calloc((size_t)comm->nranks, sizeof(*comm->p2p_send));
    comm->p2p_recv = calloc((size_t)comm->nranks, sizeof(*comm->p2p_recv));
    comm->p2p_send_seq = calloc((size_t)comm->nranks, sizeof(*comm->p2p_send_seq));
    comm->p2p_recv_seq = calloc((size_t)comm->nranks, sizeof(*comm->p2p_recv_seq));
    if (comm->p2p_send == NULL || comm->p2p_recv == NULL || comm->p2p_send_seq == NULL ||
        comm->p2p_recv_seq == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "out of memory for the peer tables");
    if (comm->nranks == 1)
        return cfxSuccess;
    struct cfx_conn_request reqs[2] = {
        {.comm = comm,
         .peer = cfx_core_algo_ring_next(comm, 0),
         .dir = CFX_CONN_SEND,
         .kind = CFX_CONN_KIND_RING,
         .out_p = &comm->ring_send},
        {.comm = comm,
         .peer = cfx_core_algo_ring_prev(comm, 0),
         .dir = CFX_CONN_RECV,
         .kind = CFX_CONN_KIND_RING,
         .out_p = &comm->ring_recv},
    };
    return cfx_core_connect_batch(reqs, 2);
}

/* Whether allgathers may take the single-copy path: each
 * rank reads from its ring predecessor, so every rank's ring_recv must read
 * its peer's memory. The ranks would run different schedules if they
 * decided alone: they share what each can do and its threshold, and all take
 * the path only if all can, from the largest threshold up. */
static cfxResult_t agree_single_copy(struct cfxComm *comm)
{
    if (comm->nranks < 2)
        return cfxSuccess;
    struct offer {
        uint64_t able;
        uint64_t min_bytes;
    } *offers = calloc((size_t)comm->nranks, sizeof(*offers));
    if (offers == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "out of memory for %d ranks' offers",
                             comm->nranks);
    struct cfx_connector *recv = comm->ring_recv;
    int64_t min_bytes = param_single_copy_min();
    /* By default only from a thread of this process: process_vm_readv
     * from another ran slower than the FIFO. */
    int by_default = min_bytes < 0;
    if (by_default)
        min_bytes = (int64_t)CFX_SINGLE_COPY_THREADS_MIN;
    /* Not for GPU ranks: their allgathers of device memory never pull, and
     * one of host memory must run the schedule its device-buffer peers
     * run (and split over the rings alike). */
    offers[comm->rank] =
        (struct offer){.able = param_single_copy() != 0 && comm->cuda_dev < 0 &&
                               recv->peer_readable && recv->transport->read_peer &&
                               (!by_default || cfx_core_same_process(comm, recv->peer_rank)),
                       .min_bytes = (uint64_t)min_bytes};
    cfxResult_t res = cfx_bootstrap_allgather(comm->bootstrap, offers, sizeof(*offers));
    int unable = -1;
    uint64_t min_all = 0;
    for (int r = 0; res == cfxSuccess && r < comm->nranks; r++) {
        if (!offers[r].able && unable < 0)
            unable = r;
        if (offers[r].min_bytes > min_all)
            min_all = offers[r].min_bytes;
    }
    free(offers);
    if (res != cfxSuccess)
        return res;
    comm->single_copy = unable < 0;
    comm->single_copy_min = (size_t)min_all;
    if (unable < 0)
        CFX_INFO(CFX_LOG_INIT, "single-copy allgather from %zu bytes per rank",
                 comm->single_copy_min);
    else
        CFX_INFO(CFX_LOG_INIT,
                 "no single-copy path: rank %d cannot read its ring neighbour's memory (another "
                 "host, CFX_SINGLE_COPY=0, a GPU rank, the kernel refuses, or another process "
                 "while CFX_SINGLE_COPY_MIN_BYTES is unset)",
                 unable);
    return cfxSuccess;
}

#define DEATH_GRACE_MS 500 /* A peer's sockets close before its process is seen gone. */

/* A failed init (a peer went silent or away) while a peer's process is
 * gone: whatever broke here (a transport, the bootstrap, a neighbour that
 * gave up) broke because that rank died, so the sentence says so first. */
static cfxResult_t blame_dead_peer(struct cfxComm *comm, cfxResult_t res)
{
    /* Only failures about a peer: a refused setting fails every rank alike. */
    if (comm == NULL || (res != cfxRemoteError && res != cfxTimeout))
        return res;
    char cause[CFX_ERROR_MAX], died[48], gone[48];
    snprintf(cause, sizeof(cause), "%s", cfx_error_thread_last());
    int dead = cfx_core_peer_dead(comm, DEATH_GRACE_MS);
    if (dead >= 0) {
        snprintf(died, sizeof(died), "rank %d died", dead);
        snprintf(gone, sizeof(gone), "rank %d is gone", dead);
        /* Before this rank exits too: the others must not take that for the cause. */
        cfx_core_tell_peers_dead(comm, dead);
    }
    if (dead < 0 || strstr(cause, died) != NULL || strstr(cause, gone) != NULL) {
        if (strcmp(cause, cfx_error_thread_last()) != 0) /* A failed look replaced it. */
            cfx_error_set(res, CFX_LOG_INIT, "%s", cause);
        return res; /* Nothing to add. */
    }
    return cfx_error_set(cfxRemoteError, CFX_LOG_INIT,
                         "rank %d died during communicator init (its process, pid %d, exited or "
                         "was killed), so rank %d's init failed: %s",
                         dead, comm->peers[dead].pid, comm->rank, cause);
}

/* Everything after the bootstrap exists: learn who the peers are. */
static cfxResult_t comm_setup(struct cfxComm *comm)
{
    comm->peers = calloc((size_t)comm->nranks, sizeof(*comm->peers));
    if (comm->peers == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "out of memory for the peer table");
    struct cfx_peer_info *me = &comm->peers[comm->rank];
    me->rank = comm->rank;
    me->cuda_dev = comm->cuda_dev;
    me->pid = (int32_t)getpid();
    me->pid_ns = cfx_core_pid_ns();
    cfx_host_identity(me->host_id, sizeof(me->host_id));
    me->host_hash = cfx_host_hash(me->host_id);
    /* Its GPU and nearest NIC, for the transports (one rank alone has no peer). */
    cfx_core_locate_rank(comm->nranks > 1 ? cfx_core_algo_topology() : NULL, me->cuda_dev, me);
    cfx_core_locate_near_nics(comm->nranks > 1 ? cfx_core_algo_topology() : NULL, me->cuda_dev,
                              comm->nic_near, sizeof(comm->nic_near));
    CFX_CHECK(cfx_bootstrap_allgather(comm->bootstrap, comm->peers, sizeof(*comm->peers)));
    for (int r = 0; r < comm->nranks; r++) {
        if (comm->peers[r].rank != r)
            return cfx_error_set(cfxInternalError, CFX_LOG_INIT,
                                 "peer table entry %d claims rank %d", r, comm->peers[r].rank);
        comm->peers[r].host_id[sizeof(comm->peers[r].host_id) - 1] = '\0';
        comm->peers[r].busid[sizeof(comm->peers[r].busid) - 1] = '\0';
        comm->peers[r].nic_name[sizeof(comm->peers[r].nic_name) - 1] = '\0';
        if (comm->peers[r].host_hash == me->host_hash) {
            if (r < comm->rank)
                comm->local_rank++;
            comm->local_nranks++;
        }
    }
    CFX_CHECK(cfx_core_peers_watch(comm));
    CFX_CHECK(cfx_core_gpu_setup(comm));
    CFX_CHECK(pick_geometry(comm));
    CFX_CHECK(cfx_core_algo_init(comm)); /* The plan, and so the rings' order. */
    CFX_CHECK(connect_ring(comm));
    CFX_CHECK(agree_single_copy(comm));
    int64_t p2p_min = param_p2p_single_copy_min();
    comm->p2p_single_copy_min = !param_single_copy() ? CFX_PULL_NEVER
                                : p2p_min < 0        ? CFX_P2P_SINGLE_COPY_THREADS_MIN
                                : p2p_min == 0       ? 1
                                                     : (uint64_t)p2p_min;
    comm->p2p_single_copy_min_far =
        param_single_copy() && p2p_min >= 0 ? comm->p2p_single_copy_min : CFX_PULL_NEVER;
    CFX_CHECK(cfx_core_algo_connect(comm));
    CFX_CHECK(cfx_core_flight_init(comm));
    comm->check_mismatch = param_check_mismatch() != 0;
    comm->spin_limit = (int)param_spin_count();
    if (comm->spin_limit < 0) {
        cpu_set_t cpus;
        int n_cpus = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
        comm->spin_limit = comm->local_nranks > n_cpus ? 20 : 2000;
    }
    __atomic_store_n(&comm->magic, CFX_COMM_MAGIC, __ATOMIC_RELEASE);
    cfx_core_registry_add(comm);
    CFX_INFO(CFX_LOG_INIT,
             "comm %p%s%s rank %d nranks %d cudaDev %d localRank %d localRanks %d - Init COMPLETE",
             (void *)comm, comm->name[0] ? " name " : "", comm->name, comm->rank, comm->nranks,
             comm->cuda_dev, comm->local_rank, comm->local_nranks);
    return cfxSuccess;
}

/* The ids of an init through @p n_ids ids, checked: valid, and distinct
 * unless all are one CFX_COMM_ID id (*n_used_p = 1 then). */
static cfxResult_t check_ids(const cfxUniqueId *ids, int n_ids, int nranks, const char *fn,
                             int *n_used_p)
{
    if (ids == NULL)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT, "%s: commIds is NULL", fn);
    if (n_ids < 1 || n_ids > nranks)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: nId = %d; it must be between 1 and nranks (%d)", fn, n_ids,
                             nranks);
    int comm_ids = 0, all_equal = 1;
    for (int i = 0; i < n_ids; i++) {
        uint64_t secret;
        if (!cfx_bootstrap_id_valid(&ids[i]))
            return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                                 "%s: commIds[%d] is not a Conflux unique id; make it with "
                                 "cfxGetUniqueId and pass it unchanged to all",
                                 fn, i);
        comm_ids += cfx_bootstrap_id_info(&ids[i], &secret);
        if (memcmp(&ids[i], &ids[0], sizeof(ids[0])) != 0)
            all_equal = 0;
    }
    *n_used_p = n_ids;
    if (all_equal && n_ids > 1 && comm_ids == n_ids) {
        CFX_INFO(CFX_LOG_INIT,
                 "%s: the %d ids are one CFX_COMM_ID id; every rank joins through its root", fn,
                 n_ids);
        *n_used_p = 1;
        return cfxSuccess;
    }
    if (comm_ids > 0 && n_ids > 1)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: an id from CFX_COMM_ID among %d ids; with CFX_COMM_ID every "
                             "id is the same, so pass nId = 1 (or unset CFX_COMM_ID)",
                             fn, n_ids);
    for (int i = 1; i < n_ids; i++)
        for (int j = 0; j < i; j++)
            if (memcmp(&ids[i], &ids[j], sizeof(ids[0])) == 0)
                return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                                     "%s: commIds[%d] is commIds[%d]; each id names one root, "
                                     "call cfxGetUniqueId once per id",
                                     fn, i, j);
    return cfxSuccess;
}

/* Init through one id (@p scalable 0: cfxCommInitRank(Config)) or several. */
static cfxResult_t init_rank(cfxComm_t *comm_p, int nranks, const cfxUniqueId *ids, int n_ids,
                             int scalable, int rank, cfxConfig_t *config, const char *fn)
{
    cfx_core_api_enter(NULL);
    cfx_log_set_rank(rank);
    print_version_once();
    struct cfxComm *comm = NULL;
    cfxResult_t res;
    int n_used = 1;
    CFX_CHECK_GOTO(cfx_argcheck_ptr(comm_p, fn, "comm"), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_nranks_rank(nranks, rank, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_config(config, fn), res, out);
    CFX_CHECK_GOTO(cfx_param_check_all(), res, out);
    if (!scalable) {
        if (!cfx_bootstrap_id_valid(&ids[0])) {
            res = cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                                "%s: commId is not a Conflux unique id; make it with "
                                "cfxGetUniqueId on one rank and pass it unchanged to all",
                                fn);
            goto out;
        }
    } else {
        CFX_CHECK_GOTO(check_ids(ids, n_ids, nranks, fn, &n_used), res, out);
    }
    CFX_CHECK_GOTO(comm_alloc(rank, nranks, config, &comm), res, out);
    CFX_CHECK_GOTO(
        cfx_bootstrap_init_scalable(ids, n_used, rank, nranks, &comm->abort_flag, &comm->bootstrap),
        res, err_free);
    CFX_CHECK_GOTO(comm_setup(comm), res, err_free);
    *comm_p = comm;
    goto out;
err_free:
    res = blame_dead_peer(comm, res);
    comm_free(comm);
out:
    return cfx_core_api_exit(NULL, res);
}

CFX_API cfxResult_t cfxCommInitRankConfig(cfxComm_t *comm_p, int nranks, cfxUniqueId commId,
                                          int rank, cfxConfig_t *config)
{
    return init_rank(comm_p, nranks, &commId, 1, 0, rank, config, "cfxCommInitRankConfig");
}

CFX_API cfxResult_t cfxCommInitRankScalable(cfxComm_t *newcomm, int nranks, int myrank, int nId,
                                            cfxUniqueId *commIds, cfxConfig_t *config)
{
    return init_rank(newcomm, nranks, commIds, nId, 1, myrank, config, "cfxCommInitRankScalable");
}

CFX_API cfxResult_t cfxCommInitRank(cfxComm_t *comm_p, int nranks, cfxUniqueId commId, int rank)
{
    return cfxCommInitRankConfig(comm_p, nranks, commId, rank, NULL);
}

/* ------------------------------------------------------------ InitAll */

struct init_all_rank {
    pthread_t thread;
    cfxUniqueId id;
    int rank;
    int nranks;
    int device; /* -1: host rank. */
    cfxComm_t comm;
    cfxResult_t res;
    char error[CFX_ERROR_MAX];
};

static void *init_all_thread(void *arg)
{
    struct init_all_rank *job = arg;
    job->res = cfxSuccess;
    if (job->device >= 0)
        job->res = cfx_cuda_select(job->device);
    if (job->res == cfxSuccess)
        job->res = cfxCommInitRank(&job->comm, job->nranks, job->id, job->rank);
    snprintf(job->error, sizeof(job->error), "%s", cfx_error_thread_last());
    return NULL;
}

CFX_API cfxResult_t cfxCommInitAll(cfxComm_t *comms, int ndev, const int *devlist)
{
    const char *fn = "cfxCommInitAll";
    cfx_core_api_enter(NULL);
    cfxResult_t res;
    struct init_all_rank *jobs = NULL;
    int started = 0;
    CFX_CHECK_GOTO(cfx_argcheck_ptr(comms, fn, "comms"), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_nranks_rank(ndev, 0, fn), res, out);
    jobs = calloc((size_t)ndev, sizeof(*jobs));
    if (jobs == NULL) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_INIT, "%s: out of memory", fn);
        goto out;
    }
    CFX_CHECK_GOTO(cfx_param_check_all(), res, out); /* Before a root starts for nothing. */
    cfxUniqueId id;
    CFX_CHECK_GOTO(cfx_bootstrap_id_create(&id, 1), res, out);
    res = cfxSuccess;
    for (int i = 0; i < ndev && res == cfxSuccess; i++) {
        jobs[i] = (struct init_all_rank){
            .id = id, .rank = i, .nranks = ndev, .device = devlist ? devlist[i] : -1};
        int err = pthread_create(&jobs[i].thread, NULL, init_all_thread, &jobs[i]);
        if (err != 0)
            res = cfx_error_set_errno(err, CFX_LOG_INIT, "%s: cannot start thread %d", fn, i);
        else
            started++;
    }
    /* A failed start leaves the started ranks waiting for the rest until the
     * bootstrap timeout; they then fail too and are joined here. */
    for (int i = 0; i < started; i++)
        pthread_join(jobs[i].thread, NULL);
    for (int i = 0; i < started && res == cfxSuccess; i++)
        if (jobs[i].res != cfxSuccess) {
            res = cfx_error_set(jobs[i].res, CFX_LOG_INIT, "%s: rank %d: %s", fn, i, jobs[i].error);
        }
    if (res != cfxSuccess) {
        for (int i = 0; i < started; i++)
            if (jobs[i].res == cfxSuccess)
                cfxCommDestroy(jobs[i].comm);
        goto out;
    }
    for (int i = 0; i < ndev; i++)
        comms[i] = jobs[i].comm;
out:
    free(jobs);
    return cfx_core_api_exit(NULL, res);
}

/* --------------------------------------------------- split and shrink */

/* A child of @p comm as rank @p rank of @p nranks over the bootstrap
 * *bs_p (taken over, *bs_p set to NULL): options from @p config, or the
 * parent's when NULL. On failure *child_p may hold a half-built child for
 * the caller to free. */
static cfxResult_t child_setup(struct cfxComm *comm, const cfxConfig_t *config, int rank,
                               int nranks, struct cfx_bootstrap **bs_p, struct cfxComm **child_p)
{
    cfxResult_t res = comm_alloc(rank, nranks, config, child_p);
    if (res != cfxSuccess)
        return res;
    struct cfxComm *child = *child_p;
    if (config == NULL) {
        child->blocking = comm->blocking;
        child->timeout_s = comm->timeout_s;
        child->timeout_name = comm->timeout_name;
        memcpy(child->name, comm->name, sizeof(child->name));
    }
    child->bootstrap = *bs_p;
    *bs_p = NULL;
    /* The child's waits poll its own flag: the parent may be destroyed first. */
    cfx_bootstrap_set_abort_flag(child->bootstrap, &child->abort_flag);
    cfx_log_set_rank(rank);
    res = comm_setup(child);
    cfx_log_set_rank(comm->rank);
    return res;
}

/* -------------------------------------------------------------- split */

/* After the split's exchange, every rank tells the others how it ended
 * (@p mine: its result), over the parent, so that a split that failed on
 * one rank fails on all. On success (everyone succeeded) returns
 * cfxSuccess; when this rank failed, its own result (its sentence stays);
 * when another failed, that rank's result with a sentence naming it. The
 * exchange keeps the parent in step either way; *exchanged_p says whether
 * it happened. */
static cfxResult_t split_verdict(struct cfxComm *comm, cfxResult_t mine, int *exchanged_p)
{
    const char *fn = "cfxCommSplit";
    *exchanged_p = 0;
    int32_t *results = calloc((size_t)comm->nranks, sizeof(*results));
    if (results == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "%s: out of memory for %d results", fn,
                             comm->nranks);
    results[comm->rank] = (int32_t)mine;
    cfxResult_t res = cfx_bootstrap_allgather(comm->bootstrap, results, sizeof(*results));
    if (res == cfxSuccess) {
        *exchanged_p = 1;
        res = mine;
        for (int r = 0; r < comm->nranks && res == cfxSuccess; r++) {
            if (results[r] == cfxSuccess)
                continue;
            cfxResult_t theirs = results[r] > cfxSuccess && results[r] < cfxNumResults
                                     ? (cfxResult_t)results[r]
                                     : cfxInternalError;
            if (theirs == cfxInvalidArgument)
                res = cfx_error_set(theirs, CFX_LOG_INIT,
                                    "%s: parent rank %d refused its arguments, so no rank split "
                                    "(see that rank's cfxGetLastError); the parent communicator "
                                    "is unchanged",
                                    fn, r);
            else
                res = cfx_error_set(theirs, CFX_LOG_INIT,
                                    "%s: parent rank %d could not build its part of the new "
                                    "communicator (%s), so no rank keeps one; the parent "
                                    "communicator is unchanged",
                                    fn, r, cfxGetErrorString(theirs));
        }
    }
    free(results);
    return res;
}

/* A split that failed out of step (its exchange over the parent did not
 * complete here): the parent's bootstrap may be out of step with the other
 * ranks', which fail the same way, so the parent is broken on every rank. */
static cfxResult_t split_break_parent(struct cfxComm *comm, cfxResult_t res)
{
    char cause[CFX_ERROR_MAX];
    snprintf(cause, sizeof(cause), "%s", cfx_error_thread_last());
    if (comm->async_error == cfxSuccess)
        comm->async_error = res;
    return cfx_error_set(res, CFX_LOG_INIT,
                         "cfxCommSplit failed on this rank before every rank agreed (%s); the "
                         "parent communicator is broken on every rank: destroy it",
                         cause);
}

/* Every rank of the parent calls cfxCommSplit, and either every rank gets
 * its new communicator (or NULL for CFX_SPLIT_NOCOLOR) or every rank fails:
 * a rank whose arguments are refused still takes part (as NOCOLOR) and all
 * learn it in the verdict, with the parent usable after; a failure while the
 * ranks exchange over the parent breaks the parent on all of them. */
CFX_API cfxResult_t cfxCommSplit(cfxComm_t comm, int color, int key, cfxComm_t *newcomm,
                                 cfxConfig_t *config)
{
    const char *fn = "cfxCommSplit";
    cfx_core_api_enter(comm);
    cfxResult_t res;
    struct cfxComm *child = NULL;
    struct cfx_bootstrap *child_bs = NULL;
    int child_rank = 0, child_nranks = 0, exchanged = 0;
    int *parent_ranks = NULL;
    CFX_CHECK_GOTO(cfx_argcheck_comm_usable(comm, fn), res, out);
    res = cfx_core_claim(comm, fn);
    if (res != cfxSuccess)
        return cfx_core_api_exit(NULL, res); /* The holder's sentence stays. */
    cfxResult_t refused = cfx_argcheck_ptr(newcomm, fn, "newcomm");
    if (refused == cfxSuccess)
        refused = cfx_argcheck_config(config, fn);
    if (refused == cfxSuccess && color < 0 && color != CFX_SPLIT_NOCOLOR)
        refused = cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                                "%s: color = %d; use a color >= 0 or CFX_SPLIT_NOCOLOR", fn, color);
    int take_color = refused == cfxSuccess ? color : CFX_SPLIT_NOCOLOR;
    res = cfx_bootstrap_split(comm->bootstrap, take_color, key, &comm->abort_flag, &child_bs,
                              &child_rank, &child_nranks, &parent_ranks);
    if (res != cfxSuccess) {
        res = split_break_parent(comm, res);
        goto release;
    }
    comm->split_count++;
    res = refused;
    if (res == cfxSuccess && take_color != CFX_SPLIT_NOCOLOR) {
        res = child_setup(comm, config, child_rank, child_nranks, &child_bs, &child);
    }
    res = split_verdict(comm, res, &exchanged);
    if (!exchanged)
        res = split_break_parent(comm, res);
    if (res != cfxSuccess)
        goto err_child;
    if (take_color == CFX_SPLIT_NOCOLOR) {
        *newcomm = NULL;
        goto release;
    }
    CFX_INFO(CFX_LOG_INIT, "split: parent rank %d color %d key %d -> rank %d of %d", comm->rank,
             color, key, child_rank, child_nranks);
    *newcomm = child;
    goto release;
err_child:
    res = blame_dead_peer(child, res);
    comm_free(child);
    cfx_bootstrap_destroy(child_bs);
release:
    free(parent_ranks);
    res = cfx_core_api_exit(comm, res);
    cfx_core_release(comm);
    return res;
out:
    return cfx_core_api_exit(comm, res);
}

/* ------------------------------------------------------------- shrink */

static int compare_ints(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

/* The excluded ranks, sorted into @p sorted (caller's array of @p count),
 * checked: in range, distinct, not this rank. */
static cfxResult_t check_excluded(const struct cfxComm *comm, const int *list, int count,
                                  int *sorted, const char *fn)
{
    if (count < 0 || count >= comm->nranks)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: excludeRanksCount = %d; it must be in [0, %d) (at least one rank "
                             "remains)",
                             fn, count, comm->nranks);
    if (count > 0 && list == NULL)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "%s: excludeRanksList is NULL with excludeRanksCount = %d", fn, count);
    for (int i = 0; i < count; i++) {
        if (list[i] < 0 || list[i] >= comm->nranks)
            return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                                 "%s: excludeRanksList[%d] = %d is not a rank of the parent "
                                 "(0 .. %d)",
                                 fn, i, list[i], comm->nranks - 1);
        if (list[i] == comm->rank)
            return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                                 "%s: excludeRanksList[%d] is this rank (%d); an excluded rank "
                                 "does not call cfxCommShrink",
                                 fn, i, list[i]);
        sorted[i] = list[i];
    }
    qsort(sorted, (size_t)count, sizeof(*sorted), compare_ints);
    for (int i = 1; i < count; i++)
        if (sorted[i] == sorted[i - 1])
            return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                                 "%s: rank %d is listed twice in excludeRanksList", fn, sorted[i]);
    return cfxSuccess;
}

/* Every remaining rank calls it with the same list; no data connection of
 * the parent is used, and no message goes to an excluded rank, so it works
 * after those ranks died (the parent broken by it). */
CFX_API cfxResult_t cfxCommShrink(cfxComm_t comm, int *excludeRanksList, int excludeRanksCount,
                                  cfxComm_t *newcomm, cfxConfig_t *config, int shrinkFlags)
{
    const char *fn = "cfxCommShrink";
    cfx_core_api_enter(comm);
    cfxResult_t res;
    struct cfxComm *child = NULL;
    struct cfx_bootstrap *child_bs = NULL;
    int *sorted = NULL;
    int child_rank = 0, child_nranks = 0;
    CFX_CHECK_GOTO(cfx_argcheck_comm_usable(comm, fn), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_ptr(newcomm, fn, "newcomm"), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_config(config, fn), res, out);
    if (shrinkFlags != CFX_SHRINK_DEFAULT && shrinkFlags != CFX_SHRINK_ABORT) {
        res = cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                            "%s: shrinkFlags = %d; use CFX_SHRINK_DEFAULT or CFX_SHRINK_ABORT", fn,
                            shrinkFlags);
        goto out;
    }
    sorted = malloc(sizeof(int) * (size_t)(excludeRanksCount > 0 ? excludeRanksCount : 1));
    if (sorted == NULL) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_INIT, "%s: out of memory", fn);
        goto out;
    }
    CFX_CHECK_GOTO(check_excluded(comm, excludeRanksList, excludeRanksCount, sorted, fn), res, out);
    res = cfx_core_claim(comm, fn);
    if (res != cfxSuccess) {
        free(sorted);
        return cfx_core_api_exit(NULL, res); /* The holder's sentence stays. */
    }
    res = cfx_bootstrap_shrink(comm->bootstrap, sorted, excludeRanksCount, &comm->abort_flag,
                               &child_bs, &child_rank, &child_nranks);
    if (res != cfxSuccess) {
        res = cfx_error_set(res, CFX_LOG_INIT,
                            "%s: the remaining ranks could not agree on the new communicator: %s",
                            fn, cfx_error_thread_last());
        goto release;
    }
    res = child_setup(comm, config, child_rank, child_nranks, &child_bs, &child);
    if (res != cfxSuccess)
        goto err_child;
    CFX_INFO(CFX_LOG_INIT, "shrink: parent rank %d of %d -> rank %d of %d (%d excluded%s)",
             comm->rank, comm->nranks, child_rank, child_nranks, excludeRanksCount,
             shrinkFlags == CFX_SHRINK_ABORT ? ", parent aborted" : "");
    *newcomm = child;
    goto release;
err_child:
    res = blame_dead_peer(child, res);
    comm_free(child);
    cfx_bootstrap_destroy(child_bs);
release:
    free(sorted);
    res = cfx_core_api_exit(comm, res);
    cfx_core_release(comm);
    return res;
out:
    free(sorted);
    return cfx_core_api_exit(comm, res);
}

/* ------------------------------------------------------------- revoke */

/* Stop what runs on @p comm and keep it for cfxCommShrink/Split/Destroy:
 * the running call (of another thread) fails with "... was aborted", the
 * peers' calls that wait on this rank fail (their connections are
 * poisoned, as by an abort), and later calls are refused with a sentence.
 * The bootstrap keeps working. Returns once no call is in the communicator. */
CFX_API cfxResult_t cfxCommRevoke(cfxComm_t comm, int revokeFlags)
{
    const char *fn = "cfxCommRevoke";
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(cfx_argcheck_comm_usable(comm, fn), res, out);
    if (revokeFlags != CFX_REVOKE_DEFAULT) {
        res = cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                            "%s: revokeFlags = %d; it must be CFX_REVOKE_DEFAULT (0)", fn,
                            revokeFlags);
        goto out;
    }
    if (__atomic_exchange_n(&comm->revoked, 1, __ATOMIC_ACQ_REL) == 0) {
        __atomic_store_n(&comm->stop_ops, 1, __ATOMIC_RELEASE);
        cfx_exec_cuda_comm_abort(comm->cuda, 0);
        cfx_core_poison_all(comm, cfxRemoteError, comm->rank);
    }
    /* Wait for a call of another thread to leave (it ends at its next idle
     * check, within milliseconds); then hold the communicator once, so its
     * state is settled when this returns. */
    int64_t deadline = cfx_time_now_ns() + 5 * CFX_NS_PER_SEC;
    while ((res = cfx_core_claim(comm, fn)) != cfxSuccess) {
        if (cfx_time_now_ns() >= deadline) {
            res = cfx_error_set(cfxInProgress, CFX_LOG_INIT,
                                "%s: a call of another thread is still in the communicator "
                                "after 5 s; call cfxCommRevoke again, or cfxCommAbort",
                                fn);
            goto out;
        }
        usleep(1000);
    }
    if (comm->async_error == cfxSuccess)
        comm->async_error = cfxInvalidUsage;
    cfx_core_release(comm);
    CFX_INFO(CFX_LOG_INIT, "comm %p rank %d nranks %d - Revoke COMPLETE", (void *)comm, comm->rank,
             comm->nranks);
    res = cfxSuccess;
out:
    return cfx_core_api_exit(comm, res);
}

/* ----------------------------------------------------------- teardown */

CFX_API cfxResult_t cfxCommFinalize(cfxComm_t comm)
{
    const char *fn = "cfxCommFinalize";
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(cfx_argcheck_comm_usable(comm, fn), res, out);
    res = cfx_core_claim(comm, fn);
    if (res != cfxSuccess)
        return cfx_core_api_exit(NULL, res); /* The holder's sentence stays. */
    if (comm->revoked) {
        res = cfx_error_set(cfxInvalidUsage, CFX_LOG_INIT,
                            "%s: the communicator was revoked (cfxCommRevoke); destroy it "
                            "instead",
                            fn);
        cfx_core_release(comm);
        return cfx_core_api_exit(comm, res);
    }
    /* Work on streams runs out first (a GPU rank's); the barrier makes sure
     * no peer still needs us when we are destroyed. */
    res = comm->cuda != NULL ? cfx_exec_cuda_comm_quiesce(comm->cuda) : cfxSuccess;
    if (res == cfxSuccess && comm->cuda != NULL) {
        cfx_core_gpu_reap(comm);
        res = cfx_core_gpu_surface(comm);
    }
    if (res != cfxSuccess) {
        res = cfx_core_api_exit(comm, res);
        cfx_core_release(comm);
        return res;
    }
    comm->finalized = 1;
    res = cfx_bootstrap_barrier(comm->bootstrap);
    if (res != cfxSuccess) {
        /* The barrier does not say which peer failed: the ranks agree on it. */
        char seen[CFX_ERROR_MAX];
        snprintf(seen, sizeof(seen), "%s", cfx_error_thread_last());
        cfx_core_blame_tell(comm, res, CFX_BLAME_UNKNOWN);
        res = cfx_core_blame_explain(comm, res, fn, seen);
        comm->async_error = res;
    }
    res = cfx_core_api_exit(comm, res);
    cfx_core_release(comm);
    return res;
out:
    return cfx_core_api_exit(comm, res);
}

/* Close @p comm for good and free it. A call another thread has in it is
 * made to fail (as by cfxCommAbort: the abort flag, and the peers told) and
 * waited for, up to 5 s; @p abort does that even when no call is in. Returns
 * cfxInvalidArgument when another thread closes or closed it first; leaks
 * it (with a warning) when the call does not leave in time. */
static cfxResult_t comm_close(struct cfxComm *comm, int abort, const char *fn)
{
    const char *what = abort ? "Abort" : "Destroy";
    /* One closer only: a second one (another thread, or a stale handle)
     * must not poison or free what the first is freeing. */
    if (__atomic_exchange_n(&comm->closing, 1, __ATOMIC_ACQ_REL))
        return cfx_core_claim_refused(comm, CFX_COMM_CLOSED, fn);
    int aborted = 0;
    int64_t deadline = cfx_time_now_ns() + 5 * CFX_NS_PER_SEC;
    for (;;) {
        if (abort && !aborted) {
            __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_RELEASE);
            __atomic_store_n(&comm->stop_ops, 1, __ATOMIC_RELEASE);
            cfx_exec_cuda_comm_abort(comm->cuda, 0);
            cfx_core_poison_all(comm, cfxRemoteError, -1);
            aborted = 1;
        }
        int state = CFX_COMM_IDLE;
        if (__atomic_compare_exchange_n(&comm->active_calls, &state, CFX_COMM_CLOSED, 0,
                                        __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            break;
        if (state == CFX_COMM_CLOSED)
            return cfx_core_claim_refused(comm, state, fn);
        /* Another thread is in a call: make its waits fail, then wait for it
         * to leave before freeing what it uses (an inspector only takes a
         * moment: no need to fail anything for it). */
        if (state != CFX_COMM_INSPECTED)
            abort = 1;
        if (cfx_time_now_ns() >= deadline) {
            CFX_WARN(CFX_LOG_INIT,
                     "%s: a call on comm %p is still running after 5 s; leaking the "
                     "communicator rather than freeing it under that call",
                     fn, (void *)comm);
            return cfxSuccess;
        }
        usleep(1000);
    }
    CFX_INFO(CFX_LOG_INIT, "comm %p rank %d nranks %d - %s COMPLETE", (void *)comm, comm->rank,
             comm->nranks, what);
    comm_free(comm);
    return cfxSuccess;
}

CFX_API cfxResult_t cfxCommDestroy(cfxComm_t comm)
{
    cfx_core_api_enter(comm);
    cfxResult_t res = cfx_argcheck_comm(comm, "cfxCommDestroy");
    if (res == cfxSuccess)
        res = comm_close(comm, 0, "cfxCommDestroy");
    return cfx_core_api_exit(NULL, res);
}

CFX_API cfxResult_t cfxCommAbort(cfxComm_t comm)
{
    cfx_core_api_enter(comm);
    cfxResult_t res = cfx_argcheck_comm(comm, "cfxCommAbort");
    if (res == cfxSuccess)
        res = comm_close(comm, 1, "cfxCommAbort");
    return cfx_core_api_exit(NULL, res);
}
