/*
 * The transport interface as a contract (transports/transport.h, version
 * 2): every table starts with its version and name and either leaves each
 * optional op NULL or honours it (shm's map_peer between threads and
 * between processes, setup's refusal of placements it cannot make), the core
 * hands transports each peer's device, path class and nearest NIC, and
 * connections of one peer pair on several channels never take each other's
 * connect info.
 */
#include <criterion/criterion.h>
#include <libgen.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/core/comm.h"
#include "src/topo/topo.h"
#include "tests/harness.h"
#include "transports/faulty/faulty.h"
#include "transports/shm/shm.h"
#include "transports/transport.h"

static const char *fixture(const char *name)
{
    static char path[1024];
    char src[1024];
    snprintf(src, sizeof(src), "%s", __FILE__);
    snprintf(path, sizeof(path), "%s/topo/%s", dirname(src), name);
    return path;
}

/* ------------------------------------------------------------ the tables */

Test(transport_table, every_table_starts_with_version_and_name_and_keeps_its_contracts)
{
    cr_assert_eq(offsetof(struct cfx_transport, version), 0);
    cr_assert_lt(offsetof(struct cfx_transport, name), offsetof(struct cfx_transport, flags));
    cr_assert_lt(offsetof(struct cfx_transport, read_peer), offsetof(struct cfx_transport, reg_mem),
                 "version 2's ops come after version 1's (append only)");
    int n = 0;
    for (int t = 0; cfx_transports[t] != NULL; t++, n++) {
        const struct cfx_transport *tr = cfx_transports[t];
        cr_assert_eq(tr->version, CFX_TRANSPORT_VERSION, "transport %d", t);
        cr_assert(tr->name != NULL && tr->name[0] != '\0', "transport %d has no name", t);
        cr_assert(tr->init && tr->fini && tr->can_connect && tr->setup && tr->connect &&
                      tr->close && tr->check,
                  "%s lacks a mandatory op", tr->name);
        cr_assert_eq(!!(tr->flags & CFX_TRANSPORT_FLAG_PROGRESS), tr->kick != NULL,
                     "%s: kick exactly when it asks for kicks", tr->name);
        cr_assert_eq(!!(tr->flags & CFX_TRANSPORT_FLAG_PEER_MAP), tr->map_peer != NULL,
                     "%s: CFX_TRANSPORT_FLAG_PEER_MAP exactly when it has map_peer", tr->name);
        cr_assert_eq(tr->reg_mem != NULL, tr->dereg_mem != NULL,
                     "%s: reg_mem and dereg_mem come together", tr->name);
    }
    cr_assert_geq(n, 3);
}

/* Every transport that does not claim device placement is refused it by
 * the core's check, with a sentence naming the transport. */
Test(transport_table, placements_a_transport_cannot_make_are_refused_by_name)
{
    struct cfx_conn_place host = CFX_CONN_PLACE_HOST;
    struct cfx_conn_place device = {
        .mem = CFX_MEM_DEVICE, .device = 1, .reader = CFX_READER_HOST_THREAD};
    struct cfx_conn_place kernel = {
        .mem = CFX_MEM_HOST_PINNED, .device = 0, .reader = CFX_READER_KERNEL};
    for (int t = 0; cfx_transports[t] != NULL; t++) {
        const struct cfx_transport *tr = cfx_transports[t];
        char want[128];
        cr_assert_eq(cfx_transport_place_check(tr, &host), cfxSuccess, "%s", tr->name);
        if (!(tr->flags & CFX_TRANSPORT_FLAG_PLACE_DEVICE)) {
            cr_assert_eq(cfx_transport_place_check(tr, &device), cfxInvalidUsage, "%s", tr->name);
            snprintf(want, sizeof(want), "%s: cannot place a FIFO in device memory", tr->name);
            cr_assert(strstr(cfxGetLastError(NULL), want), "%s", cfxGetLastError(NULL));
        }
        if (!(tr->flags & CFX_TRANSPORT_FLAG_READER_KERNEL)) {
            cr_assert_eq(cfx_transport_place_check(tr, &kernel), cfxInvalidUsage, "%s", tr->name);
            snprintf(want, sizeof(want), "%s: cannot have a FIFO read by a kernel", tr->name);
            cr_assert(strstr(cfxGetLastError(NULL), want), "%s", cfxGetLastError(NULL));
        }
    }
}

/* ------------------------------------------------------------------ shm */

/* Two shm contexts of one process, as two ranks that are threads. */
struct shm_pair {
    int abort_flag;
    void *ctx[2];
    struct cfx_transport_peer peer[2];
};

static void shm_pair_init(struct shm_pair *p)
{
    memset(p, 0, sizeof(*p));
    for (int r = 0; r < 2; r++) {
        struct cfx_transport_env env = {
            .rank = r, .nranks = 2, .abort_flag = &p->abort_flag, .connect_timeout_s = 10};
        cr_assert_eq(cfx_shm_transport.init(&env, &p->ctx[r]), cfxSuccess, "%s",
                     cfxGetLastError(NULL));
        p->peer[r] = (struct cfx_transport_peer){
            .rank = r, .pid = (int)getpid(), .cuda_dev = -1, .host_hash = 1, .nic_index = -1};
    }
}

static void shm_pair_fini(struct shm_pair *p)
{
    for (int r = 0; r < 2; r++)
        cfx_shm_transport.fini(p->ctx[r]);
}

/* A connector of @p rank towards the other, not yet set up. */
static struct cfx_connector shm_conn(struct shm_pair *p, int rank, enum cfx_conn_dir dir,
                                     struct cfx_conn_place place)
{
    return (struct cfx_connector){.peer_rank = 1 - rank,
                                  .dir = dir,
                                  .place = place,
                                  .transport = &cfx_shm_transport,
                                  .transport_ctx = p->ctx[rank],
                                  .blame_rank = -1};
}

Test(transport_shm, setup_refuses_a_fifo_in_device_memory_or_read_by_a_kernel)
{
    struct shm_pair p;
    shm_pair_init(&p);
    char info[CFX_CONNECT_INFO_BYTES];
    struct cfx_conn_place refused[2] = {
        {.mem = CFX_MEM_DEVICE, .device = 0, .reader = CFX_READER_HOST_THREAD},
        {.mem = CFX_MEM_HOST, .device = 0, .reader = CFX_READER_KERNEL},
    };
    const char *sentence[2] = {"shm: cannot place a FIFO in device memory",
                               "shm: cannot have a FIFO read by a kernel"};
    for (int i = 0; i < 2; i++)
        for (int dir = 0; dir < 2; dir++) {
            struct cfx_connector conn = shm_conn(&p, 1, (enum cfx_conn_dir)dir, refused[i]);
            cr_assert_eq(cfx_shm_transport.setup(p.ctx[1], &p.peer[0], 4096, 4, &conn, info),
                         cfxInvalidUsage);
            cr_assert(strstr(cfxGetLastError(NULL), sentence[i]), "%s", cfxGetLastError(NULL));
            cr_assert_null(conn.fifo, "a refused setup made no FIFO");
            cfx_shm_transport.close(p.ctx[1], &conn);
        }
    shm_pair_fini(&p);
}

Test(transport_shm, map_peer_between_threads_gives_a_pointer_to_the_peers_buffer)
{
    struct shm_pair p;
    shm_pair_init(&p);
    char send_info[CFX_CONNECT_INFO_BYTES], recv_info[CFX_CONNECT_INFO_BYTES];
    struct cfx_connector send = shm_conn(&p, 0, CFX_CONN_SEND, CFX_CONN_PLACE_HOST);
    struct cfx_connector recv = shm_conn(&p, 1, CFX_CONN_RECV, CFX_CONN_PLACE_HOST);
    cr_assert_eq(cfx_shm_transport.setup(p.ctx[0], &p.peer[1], 4096, 4, &send, send_info),
                 cfxSuccess);
    cr_assert_eq(cfx_shm_transport.setup(p.ctx[1], &p.peer[0], 4096, 4, &recv, recv_info),
                 cfxSuccess);
    /* Before connect there is nothing to map. */
    void *ptr = NULL;
    cr_assert_eq(cfx_conn_map_peer(&send, 0x1000, 8, &ptr), cfxInvalidUsage);
    cr_assert_eq(cfx_shm_transport.connect(p.ctx[0], &send, recv_info), cfxSuccess);
    cr_assert_eq(cfx_shm_transport.connect(p.ctx[1], &recv, send_info), cfxSuccess, "%s",
                 cfxGetLastError(NULL));
    /* Rank 0's buffer, announced by address; rank 1 maps and uses it. */
    uint64_t *buffer = calloc(16, sizeof(*buffer));
    cr_assert_not_null(buffer);
    for (int i = 0; i < 16; i++)
        buffer[i] = 1000 + (uint64_t)i;
    cr_assert_eq(cfx_conn_map_peer(&recv, (uint64_t)(uintptr_t)buffer, 16 * sizeof(*buffer), &ptr),
                 cfxSuccess, "%s", cfxGetLastError(NULL));
    uint64_t *mapped = ptr;
    for (int i = 0; i < 16; i++)
        cr_assert_eq(mapped[i], 1000 + (uint64_t)i);
    mapped[3] = 42;
    cr_assert_eq(buffer[3], 42, "a store through the mapping lands in the peer's buffer");
    /* A closed peer is reported, not mapped. */
    cfx_shm_transport.close(p.ctx[0], &send);
    cr_assert_eq(cfx_conn_map_peer(&recv, (uint64_t)(uintptr_t)buffer, 8, &ptr), cfxRemoteError);
    cfx_shm_transport.close(p.ctx[1], &recv);
    free(buffer);
    shm_pair_fini(&p);
}

/* Over a communicator: rank 0 announces a buffer's address; rank 1 maps it
 * through its ring connector (shm: one host). */
static void map_peer_over_the_ring(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    static uint64_t buffer[2][4]; /* Per rank: threads share it, processes each have one. */
    uint64_t *mine = buffer[ctx->rank];
    for (int i = 0; i < 4; i++)
        mine[i] = 7000 + (uint64_t)(ctx->rank * 10 + i);
    uint64_t addr = (uint64_t)(uintptr_t)mine;
    if (ctx->rank == 0) {
        RANK_CFX(ctx, cfxSend(&addr, 1, cfxUint64, 1, comm, NULL));
    } else {
        RANK_CFX(ctx, cfxRecv(&addr, 1, cfxUint64, 0, comm, NULL));
        struct cfx_connector *conn = comm->ring_recv;
        RANK_ASSERT(ctx, conn != NULL && conn->peer_rank == 0, "no ring connector from rank 0");
        RANK_ASSERT(ctx, strcmp(conn->transport->name, "shm") == 0,
                    "the ring runs over %s, not shm", conn->transport->name);
        void *ptr = NULL;
        cfxResult_t res = cfx_conn_map_peer(conn, addr, 4 * sizeof(uint64_t), &ptr);
        if (ctx->mode == CFX_TEST_THREADS) {
            RANK_ASSERT(ctx, res == cfxSuccess, "map_peer between threads: %s",
                        cfxGetLastError(NULL));
            const uint64_t *peer = ptr;
            for (int i = 0; i < 4; i++)
                RANK_ASSERT(ctx, peer[i] == 7000 + (uint64_t)i, "word %d of rank 0's buffer: %llu",
                            i, (unsigned long long)peer[i]);
        } else {
            RANK_ASSERT(ctx, res == cfxInvalidUsage, "map_peer between processes returned %d",
                        (int)res);
            RANK_ASSERT(ctx, strstr(cfxGetLastError(NULL), "it is another process") != NULL,
                        "sentence: %s", cfxGetLastError(NULL));
        }
    }
    /* Rank 0's buffer must outlive rank 1's reads. */
    float one = 1.0f, sum = 0.0f;
    RANK_CFX(ctx, cfxAllReduce(&one, &sum, 1, cfxFloat32, cfxSum, comm, NULL));
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(transport_shm, map_peer_works_between_threads_of_a_communicator)
{
    cfx_test_setenv("CFX_SHM_DISABLE", NULL);
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 60};
    CFX_TEST_RUN(&opts, map_peer_over_the_ring);
}

Test(transport_shm, map_peer_is_refused_with_a_sentence_between_processes)
{
    cfx_test_setenv("CFX_SHM_DISABLE", NULL);
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 60};
    CFX_TEST_RUN(&opts, map_peer_over_the_ring);
}

/* ---------------------------------------------------- what the core says */

Test(transport_peer, locate_names_a_gpu_its_nearest_nic_and_the_path_between_gpus)
{
    struct cfx_topo_system *sys = NULL;
    cr_assert_eq(cfx_topo_load_xml(fixture("dgx-h100.xml"), &sys), cfxSuccess, "%s",
                 cfxGetLastError(NULL));
    struct cfx_peer_info a = {.rank = 0, .cuda_dev = 0, .host_hash = 5};
    struct cfx_peer_info b = {.rank = 1, .cuda_dev = 1, .host_hash = 5};
    struct cfx_peer_info far = {.rank = 2, .cuda_dev = 0, .host_hash = 6};
    cfx_core_locate_rank(sys, a.cuda_dev, &a);
    cfx_core_locate_rank(sys, b.cuda_dev, &b);
    cr_assert_str_eq(a.busid, "0000:18:00.0");
    cr_assert_str_eq(a.nic_name, "mlx5_0", "GPU 0 shares a PCI switch with mlx5_0");
    cr_assert_eq(a.nic_index, 0);
    cr_assert_str_eq(b.busid, "0000:2a:00.0");
    cr_assert_str_eq(b.nic_name, "mlx5_1");
    cr_assert_eq(b.nic_index, 1);
    cr_assert_eq(cfx_core_locate_path(sys, &a, &a), CFX_PATH_CLASS_LOC);
    cr_assert_eq(cfx_core_locate_path(sys, &a, &b), CFX_PATH_CLASS_NVL);
    cr_assert_eq(cfx_core_locate_path(sys, &a, &far), CFX_PATH_CLASS_NET);
    /* A host rank has no bus id; host ranks of one host meet in host memory. */
    struct cfx_peer_info h = {.rank = 3, .cuda_dev = -1, .host_hash = 5};
    cfx_core_locate_rank(sys, -1, &h);
    cr_assert_str_eq(h.busid, "");
    cr_assert_neq(h.nic_index, -1, "a host with NICs has a nearest one for host ranks too");
    struct cfx_peer_info h2 = {.rank = 4, .cuda_dev = -1, .host_hash = 5};
    enum cfx_path_class host_path = cfx_core_locate_path(sys, &h, &h2);
    cr_assert(host_path == CFX_PATH_CLASS_PHB || host_path == CFX_PATH_CLASS_SYS);
    /* The ports as near as the nearest: GPU 0's own NIC alone (mlx5_1 is
     * behind another switch); for a host rank, every 400 Gb/s port, the
     * nearest first. */
    char near[CFX_TRANSPORT_NIC_NEAR_MAX];
    cfx_core_locate_near_nics(sys, 0, near, sizeof(near));
    cr_assert_str_eq(near, "mlx5_0");
    cfx_core_locate_near_nics(sys, -1, near, sizeof(near));
    char want[CFX_TRANSPORT_NIC_NEAR_MAX];
    snprintf(want, sizeof(want), "%s", h.nic_name);
    for (int n = 0; n < 8; n++) {
        char name[16];
        snprintf(name, sizeof(name), "mlx5_%d", n);
        if (strcmp(name, h.nic_name) != 0)
            snprintf(want + strlen(want), sizeof(want) - strlen(want), ",%s", name);
    }
    cr_assert_str_eq(near, want);
    cfx_core_locate_near_nics(NULL, 0, near, sizeof(near));
    cr_assert_str_eq(near, "");
    cfx_topo_free(sys);
    /* No topology: nothing known but the host. */
    cfx_core_locate_rank(NULL, 0, &a);
    cr_assert(a.busid[0] == '\0' && a.nic_name[0] == '\0' && a.nic_index == -1);
    cr_assert_eq(cfx_core_locate_path(NULL, &h, &h2), CFX_PATH_CLASS_SYS);
}

/* With the fault injector in front (a rule for a rank that does not exist),
 * every transport call passes through it: it keeps what the core said. */
static void peers_as_told(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    int t = 0;
    while (cfx_transports[t] != NULL && cfx_transports[t] != &cfx_faulty_transport)
        t++;
    RANK_ASSERT(ctx, cfx_transports[t] != NULL && comm->transport_ctx[t] != NULL,
                "the fault injector did not start");
    for (int r = 0; r < ctx->nranks; r++) {
        struct cfx_transport_peer peer;
        RANK_ASSERT(ctx, cfx_faulty_peer_seen(comm->transport_ctx[t], r, &peer),
                    "the core never described rank %d", r);
        RANK_ASSERT(ctx,
                    peer.pid == comm->peers[r].pid && peer.cuda_dev == -1 &&
                        peer.host_hash == comm->peers[r].host_hash,
                    "rank %d: pid %d, device %d", r, peer.pid, peer.cuda_dev);
        RANK_ASSERT(ctx, peer.busid[0] == '\0', "host rank %d has bus id \"%s\"", r, peer.busid);
        /* cpu-2socket.xml: two NUMA domains, one NIC, mlx5_0. */
        RANK_ASSERT(ctx, strcmp(peer.nic_name, "mlx5_0") == 0 && peer.nic_index == 0,
                    "rank %d's nearest NIC: \"%s\" (%d)", r, peer.nic_name, peer.nic_index);
        enum cfx_path_class want = r == ctx->rank ? CFX_PATH_CLASS_LOC : CFX_PATH_CLASS_SYS;
        RANK_ASSERT(ctx, peer.path == want, "path to rank %d: %d, not %d", r, (int)peer.path,
                    (int)want);
    }
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(transport_peer, the_core_describes_each_peers_device_path_and_nic)
{
    cfx_test_setenv("CFX_FAULT", "drop:rank=99");
    cfx_test_setenv("CFX_TOPO_FILE", fixture("cpu-2socket.xml"));
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 60};
    CFX_TEST_RUN(&opts, peers_as_told);
    cfx_test_setenv("CFX_FAULT", NULL);
    cfx_test_setenv("CFX_TOPO_FILE", NULL);
}

/* ------------------------------------------------------------- channels */

Test(conn_tag, every_kind_direction_and_channel_has_its_own_tag)
{
    static uint32_t seen[16 * 2 * CFX_CONN_MAX_CHANNELS];
    int n = 0;
    for (int kind = CFX_CONN_KIND_RING; kind <= CFX_CONN_KIND_DIRECT; kind++)
        for (int dir = 0; dir < 2; dir++)
            for (int ch = 0; ch < CFX_CONN_MAX_CHANNELS; ch++) {
                uint32_t tag = cfx_core_conn_tag(kind, (enum cfx_conn_dir)dir, ch);
                cr_assert_neq(tag, 0x434e46ffu, "the connect-failure notice's tag");
                for (int i = 0; i < n; i++)
                    cr_assert_neq(seen[i], tag, "kind %d dir %d channel %d", kind, dir, ch);
                seen[n++] = tag;
            }
}

/* Two connections each way between ranks 0 and 1, on channels 0 and 1,
 * requested in opposite orders on the two ranks: each connector must meet
 * its own channel's peer, so a slot posted on channel c arrives on c. */
static void two_channels_to_one_peer(struct cfx_test_rank *ctx)
{
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    int peer = 1 - ctx->rank;
    struct cfx_connector *send[2] = {NULL, NULL}, *recv[2] = {NULL, NULL};
    struct cfx_conn_request reqs[4];
    for (int i = 0; i < 4; i++) {
        int ch = ctx->rank == 0 ? i % 2 : 1 - i % 2;
        enum cfx_conn_dir dir = (i < 2) == (ctx->rank == 0) ? CFX_CONN_SEND : CFX_CONN_RECV;
        reqs[i] = (struct cfx_conn_request){.comm = comm,
                                            .peer = peer,
                                            .dir = dir,
                                            .kind = CFX_CONN_KIND_P2P,
                                            .channel = ch,
                                            .out_p = dir == CFX_CONN_SEND ? &send[ch] : &recv[ch]};
    }
    cfx_test_step(ctx, "connect channels 0 and 1 both ways");
    RANK_ASSERT(ctx, cfx_core_connect_batch(reqs, 4) == cfxSuccess, "connect: %s",
                cfxGetLastError(NULL));
    for (int ch = 0; ch < 2; ch++) {
        RANK_ASSERT(ctx, send[ch]->channel == ch && recv[ch]->channel == ch, "channel %d", ch);
        uint32_t value = 0xc0de0000u | (uint32_t)(ctx->rank << 8) | (uint32_t)ch;
        memcpy(cfx_conn_post_slot(send[ch], sizeof(value)), &value, sizeof(value));
        struct cfx_fingerprint print = {.seq = (uint64_t)ch, .root = -1, .valid = 1};
        cfx_conn_post(send[ch], sizeof(value), &print);
    }
    for (int ch = 0; ch < 2; ch++) {
        cfx_test_step(ctx, "wait for the slot of channel %d", ch);
        struct timespec start, now;
        clock_gettime(CLOCK_MONOTONIC, &start);
        while (!cfx_conn_can_take(recv[ch])) {
            if (recv[ch]->transport->progress)
                recv[ch]->transport->progress(recv[ch]->transport_ctx, recv[ch]);
            RANK_ASSERT(ctx,
                        recv[ch]->transport->check(recv[ch]->transport_ctx, recv[ch]) == cfxSuccess,
                        "channel %d: %s", ch, cfxGetLastError(NULL));
            clock_gettime(CLOCK_MONOTONIC, &now);
            RANK_ASSERT(ctx, now.tv_sec - start.tv_sec < 20, "no slot on channel %d", ch);
            sched_yield();
        }
        size_t bytes;
        const struct cfx_fingerprint *print;
        const char *slot = cfx_conn_take_slot(recv[ch], &bytes, &print);
        uint32_t value;
        memcpy(&value, slot, sizeof(value));
        uint32_t want = 0xc0de0000u | (uint32_t)(peer << 8) | (uint32_t)ch;
        RANK_ASSERT(ctx, bytes == sizeof(value) && value == want,
                    "channel %d got 0x%x (%zu bytes), not 0x%x", ch, value, bytes, want);
        cfx_conn_release(recv[ch]);
    }
    /* Both sides took their slots before either closes. */
    float one = 1.0f, sum = 0.0f;
    RANK_CFX(ctx, cfxAllReduce(&one, &sum, 1, cfxFloat32, cfxSum, comm, NULL));
    for (int ch = 0; ch < 2; ch++) {
        send[ch]->transport->close(send[ch]->transport_ctx, send[ch]);
        recv[ch]->transport->close(recv[ch]->transport_ctx, recv[ch]);
        free(send[ch]);
        free(recv[ch]);
    }
    RANK_CFX(ctx, cfxCommDestroy(comm));
}

Test(conn_tag, two_channels_to_one_peer_both_connect_over_shm)
{
    cfx_test_setenv("CFX_SHM_DISABLE", NULL);
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 60};
    CFX_TEST_RUN(&opts, two_channels_to_one_peer);
}

Test(conn_tag, two_channels_to_one_peer_both_connect_over_sockets)
{
    cfx_test_setenv("CFX_SHM_DISABLE", "1");
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 60};
    CFX_TEST_RUN(&opts, two_channels_to_one_peer);
    cfx_test_setenv("CFX_SHM_DISABLE", NULL);
}
