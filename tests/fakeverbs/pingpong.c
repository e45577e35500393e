/*
 * fake-verbs across two network namespaces (two_namespaces_test.sh): a
 * server in one namespace and a client in the other exchange their QP
 * information over a side TCP connection, connect RC QPs, then write 4 MiB
 * plus a WRITE_WITH_IMM at each other at the same time and check every byte.
 * Also checks that the two namespaces got different LIDs (InfiniBand) or
 * GIDs (RoCE). Prints "fakeverbs pingpong: OK" and exits 0 on success.
 *
 *   fakeverbs_pingpong server|client ADDR PORT
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK_BYTES   (1u << 20)
#define N_CHUNKS      4
#define AREA_BYTES    (CHUNK_BYTES * N_CHUNKS)
#define WAIT_S        20
#define CONNECT_TRIES 200

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fakeverbs pingpong: %s: line %d: %s failed\n", role, __LINE__,        \
                    #cond);                                                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

struct peer_info {
    uint32_t qpn;
    uint16_t lid;
    union ibv_gid gid;
    uint64_t addr;
    uint32_t rkey;
};

static const char *role = "?";

static int side_channel(int is_server, const char *addr, int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    CHECK(inet_pton(AF_INET, addr, &sa.sin_addr) == 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    if (is_server) {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        CHECK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(fd, 1) == 0);
        int conn = accept(fd, NULL, NULL);
        CHECK(conn >= 0);
        close(fd);
        return conn;
    }
    for (int i = 0; i < CONNECT_TRIES; i++) {
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
            return fd;
        usleep(50 * 1000);
    }
    CHECK(!"the server never answered");
    return -1;
}

static void exchange(int fd, struct peer_info *peer, const struct peer_info *mine)
{
    CHECK(write(fd, mine, sizeof(*mine)) == (ssize_t)sizeof(*mine));
    size_t got = 0;
    while (got < sizeof(*peer)) {
        ssize_t n = read(fd, (char *)peer + got, sizeof(*peer) - got);
        CHECK(n > 0);
        got += (size_t)n;
    }
}

static unsigned char expected_byte(size_t i, unsigned seed)
{
    return (unsigned char)((i * 7u + seed) ^ (i >> 11));
}

static void wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
    time_t deadline = time(NULL) + WAIT_S;
    while (ibv_poll_cq(cq, 1, wc) == 0) {
        CHECK(time(NULL) < deadline);
        usleep(200);
    }
    if (wc->status != IBV_WC_SUCCESS)
        fprintf(stderr, "fakeverbs pingpong: %s: wr %llu: %s\n", role,
                (unsigned long long)wc->wr_id, ibv_wc_status_str(wc->status));
    CHECK(wc->status == IBV_WC_SUCCESS);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s server|client ADDR PORT\n", argv[0]);
        return 2;
    }
    role = argv[1];
    int is_server = strcmp(role, "server") == 0;
    unsigned my_seed = is_server ? 11 : 29, peer_seed = is_server ? 29 : 11;
    int fd = side_channel(is_server, argv[2], atoi(argv[3]));

    struct ibv_device **list = ibv_get_device_list(NULL);
    CHECK(list != NULL && list[0] != NULL);
    struct ibv_context *ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    CHECK(ctx != NULL);
    struct ibv_port_attr port;
    CHECK(ibv_query_port(ctx, 1, &port) == 0);
    int roce = port.link_layer == IBV_LINK_LAYER_ETHERNET;
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    struct ibv_qp_init_attr init = {
        .send_cq = cq,
        .recv_cq = cq,
        .cap = {.max_send_wr = 16, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC};
    struct ibv_qp *qp = ibv_create_qp(pd, &init);
    /* [0, AREA): what this side sends; [AREA, 2 AREA): where the peer writes. */
    unsigned char *buf = malloc(2 * AREA_BYTES);
    CHECK(pd != NULL && cq != NULL && qp != NULL && buf != NULL);
    memset(buf + AREA_BYTES, 0, AREA_BYTES);
    for (size_t i = 0; i < AREA_BYTES; i++)
        buf[i] = expected_byte(i, my_seed);
    struct ibv_mr *mr =
        ibv_reg_mr(pd, buf, 2 * AREA_BYTES, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(mr != NULL);

    struct peer_info mine = {.qpn = qp->qp_num,
                             .lid = port.lid,
                             .addr = (uint64_t)(uintptr_t)(buf + AREA_BYTES),
                             .rkey = mr->rkey};
    CHECK(ibv_query_gid(ctx, 1, roce ? 1 : 0, &mine.gid) == 0);
    struct peer_info peer;
    exchange(fd, &peer, &mine);
    if (roce)
        CHECK(memcmp(&peer.gid, &mine.gid, sizeof(mine.gid)) != 0 && peer.lid == 0);
    else
        CHECK(peer.lid != mine.lid && peer.lid != 0);

    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_INIT,
                               .port_num = 1,
                               .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE};
    CHECK(ibv_modify_qp(qp, &attr,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
    struct ibv_sge rsge = {.addr = (uintptr_t)buf, .length = 0, .lkey = mr->lkey};
    struct ibv_recv_wr rwr = {.wr_id = 100, .sg_list = &rsge, .num_sge = 1}, *bad_rwr;
    CHECK(ibv_post_recv(qp, &rwr, &bad_rwr) == 0);
    attr = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR,
                                .path_mtu = IBV_MTU_4096,
                                .dest_qp_num = peer.qpn,
                                .max_dest_rd_atomic = 1,
                                .min_rnr_timer = 12,
                                .ah_attr = {.dlid = peer.lid, .port_num = 1}};
    if (roce) {
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.dgid = peer.gid;
        attr.ah_attr.grh.sgid_index = 1;
        attr.ah_attr.grh.hop_limit = 1;
    }
    CHECK(ibv_modify_qp(qp, &attr,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
    attr = (struct ibv_qp_attr){
        .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1};
    CHECK(ibv_modify_qp(qp, &attr,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                            IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
    struct peer_info barrier;
    exchange(fd, &barrier, &mine); /* both are in RTS */

    /* Both sides write at the same time: nothing may deadlock. */
    for (unsigned c = 0; c <= N_CHUNKS; c++) {
        int last = c == N_CHUNKS;
        struct ibv_sge sge = {.addr = (uintptr_t)(buf + (size_t)c * CHUNK_BYTES),
                              .length = last ? 0 : CHUNK_BYTES,
                              .lkey = mr->lkey};
        struct ibv_send_wr wr = {.wr_id = c,
                                 .sg_list = &sge,
                                 .num_sge = 1,
                                 .opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                                 .send_flags = last ? IBV_SEND_SIGNALED : 0,
                                 .imm_data = htonl(0xAB)},
                           *bad;
        wr.wr.rdma.remote_addr = peer.addr + (uint64_t)c * CHUNK_BYTES;
        wr.wr.rdma.rkey = peer.rkey;
        CHECK(ibv_post_send(qp, &wr, &bad) == 0);
    }
    int got_send = 0, got_recv = 0;
    while (!got_send || !got_recv) {
        struct ibv_wc wc;
        wait_wc(cq, &wc);
        if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
            CHECK(wc.wr_id == 100 && ntohl(wc.imm_data) == 0xAB);
            for (size_t i = 0; i < AREA_BYTES; i++)
                CHECK(buf[AREA_BYTES + i] == expected_byte(i, peer_seed));
            got_recv = 1;
        } else {
            CHECK(wc.wr_id == N_CHUNKS && wc.opcode == IBV_WC_RDMA_WRITE);
            got_send = 1;
        }
    }
    exchange(fd, &barrier, &mine); /* both checked: now tear down */
    CHECK(ibv_destroy_qp(qp) == 0 && ibv_dereg_mr(mr) == 0 && ibv_destroy_cq(cq) == 0);
    CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0);
    free(buf);
    close(fd);
    printf("fakeverbs pingpong: OK (%s, %s, %u MiB each way)\n", role, roce ? "RoCE" : "InfiniBand",
           AREA_BYTES >> 20);
    return 0;
}
