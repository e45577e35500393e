/*
 * fake-verbs (tests/fakeverbs) behaves like a strict RC NIC: devices and
 * ports, the QP state machine, RDMA writes, sends and immediates between two
 * processes, ordering, protection errors, RNR, queue depth, dead peers, and
 * each fault knob. Two-process tests fork: the child opens the device itself
 * and reports through its exit status ("child: line N: why" on stderr); the
 * QP numbers travel over a socketpair. Every wait has a deadline.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TEST_DEADLINE_S 60
#define WAIT_MS         5000
#define BUF_BYTES       (2u << 20)
#define MIB             (1u << 20)
#define RNR_FOREVER     7
#define TIMEOUT_14      14 /* 4.096 us * 2^14 = 67 ms per try */

/* Fail the child process with the line that failed. */
#define CHILD_CHECK(cond)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "child: line %d: %s failed\n", __LINE__, #cond);                       \
            _exit(1);                                                                              \
        }                                                                                          \
    } while (0)

/* What a peer needs to reach this endpoint. */
struct ep_info {
    uint32_t qpn;
    uint16_t lid;
    union ibv_gid gid;
    uint64_t addr;
    uint32_t rkey;
    uint32_t rkey_readonly;
};

struct ep {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    unsigned char *buf;
    struct ibv_mr *mr;
    struct ibv_mr *mr_readonly; /* local write only: no remote write or read */
    struct ep_info info;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Open device 0 and build PD, CQ, QP (RESET) and the MRs; 0 on success. */
static int ep_open(struct ep *ep, uint32_t sq_depth, int sig_all)
{
    memset(ep, 0, sizeof(*ep));
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (list == NULL || n < 1)
        return -1;
    ep->ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    if (ep->ctx == NULL)
        return -1;
    ep->pd = ibv_alloc_pd(ep->ctx);
    ep->cq = ibv_create_cq(ep->ctx, 8192, NULL, NULL, 0);
    struct ibv_qp_init_attr init = {.send_cq = ep->cq,
                                    .recv_cq = ep->cq,
                                    .cap = {.max_send_wr = sq_depth,
                                            .max_recv_wr = 256,
                                            .max_send_sge = 1,
                                            .max_recv_sge = 1,
                                            .max_inline_data = 64},
                                    .qp_type = IBV_QPT_RC,
                                    .sq_sig_all = sig_all};
    ep->qp = ibv_create_qp(ep->pd, &init);
    ep->buf = aligned_alloc(4096, BUF_BYTES);
    if (ep->pd == NULL || ep->cq == NULL || ep->qp == NULL || ep->buf == NULL)
        return -1;
    memset(ep->buf, 0, BUF_BYTES);
    ep->mr = ibv_reg_mr(ep->pd, ep->buf, BUF_BYTES,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    ep->mr_readonly = ibv_reg_mr(ep->pd, ep->buf, BUF_BYTES, IBV_ACCESS_LOCAL_WRITE);
    if (ep->mr == NULL || ep->mr_readonly == NULL)
        return -1;
    struct ibv_port_attr port;
    if (ibv_query_port(ep->ctx, 1, &port) != 0 || ibv_query_gid(ep->ctx, 1, 0, &ep->info.gid) != 0)
        return -1;
    ep->info.qpn = ep->qp->qp_num;
    ep->info.lid = port.lid;
    ep->info.addr = (uint64_t)(uintptr_t)ep->buf;
    ep->info.rkey = ep->mr->rkey;
    ep->info.rkey_readonly = ep->mr_readonly->rkey;
    return 0;
}

static void ep_close(struct ep *ep)
{
    if (ep->qp != NULL)
        ibv_destroy_qp(ep->qp);
    if (ep->mr_readonly != NULL)
        ibv_dereg_mr(ep->mr_readonly);
    if (ep->mr != NULL)
        ibv_dereg_mr(ep->mr);
    if (ep->cq != NULL)
        ibv_destroy_cq(ep->cq);
    if (ep->pd != NULL)
        ibv_dealloc_pd(ep->pd);
    if (ep->ctx != NULL)
        ibv_close_device(ep->ctx);
    free(ep->buf);
}

static int to_init(struct ibv_qp *qp)
{
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_INIT,
                               .pkey_index = 0,
                               .port_num = 1,
                               .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                                  IBV_ACCESS_REMOTE_READ};
    return ibv_modify_qp(qp, &attr,
                         IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct ibv_qp *qp, const struct ep_info *peer)
{
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_RTR,
                               .path_mtu = IBV_MTU_4096,
                               .dest_qp_num = peer->qpn,
                               .rq_psn = 0,
                               .max_dest_rd_atomic = 1,
                               .min_rnr_timer = 1,
                               .ah_attr = {.dlid = peer->lid, .port_num = 1}};
    if (peer->lid == 0) {
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.dgid = peer->gid;
        attr.ah_attr.grh.hop_limit = 1;
    }
    return ibv_modify_qp(qp, &attr,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int to_rts(struct ibv_qp *qp, uint8_t timeout, uint8_t retry_cnt, uint8_t rnr_retry)
{
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_RTS,
                               .timeout = timeout,
                               .retry_cnt = retry_cnt,
                               .rnr_retry = rnr_retry,
                               .sq_psn = 0,
                               .max_rd_atomic = 1};
    return ibv_modify_qp(qp, &attr,
                         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* INIT, RTR to @p peer, RTS; 0 on success. */
static int connect_qp(struct ep *ep, const struct ep_info *peer, uint8_t rnr_retry)
{
    if (to_init(ep->qp) != 0 || to_rtr(ep->qp, peer) != 0)
        return -1;
    return to_rts(ep->qp, TIMEOUT_14, 7, rnr_retry);
}

/* One completion within WAIT_MS; 1, or 0 on timeout. */
static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
    uint64_t deadline = now_ms() + WAIT_MS;
    while (now_ms() < deadline) {
        if (ibv_poll_cq(cq, 1, wc) == 1)
            return 1;
        usleep(100);
    }
    return 0;
}

/* No completion arrives for @p ms. */
static int no_wc_for(struct ibv_cq *cq, unsigned ms)
{
    struct ibv_wc wc;
    uint64_t deadline = now_ms() + ms;
    while (now_ms() < deadline) {
        if (ibv_poll_cq(cq, 1, &wc) == 1)
            return 0;
        usleep(1000);
    }
    return 1;
}

static int post_write(struct ep *ep, enum ibv_wr_opcode opcode, uint64_t wr_id, size_t local_off,
                      uint32_t length, uint64_t remote_addr, uint32_t rkey, int signaled,
                      uint32_t imm)
{
    struct ibv_sge sge = {
        .addr = (uint64_t)(uintptr_t)(ep->buf + local_off), .length = length, .lkey = ep->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = wr_id,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = opcode,
                             .send_flags = signaled ? IBV_SEND_SIGNALED : 0,
                             .imm_data = htonl(imm)};
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    struct ibv_send_wr *bad = NULL;
    return ibv_post_send(ep->qp, &wr, &bad);
}

static int post_read(struct ep *ep, uint64_t wr_id, size_t local_off, uint32_t length,
                     uint64_t remote_addr, uint32_t rkey);

static int post_recv(struct ep *ep, uint64_t wr_id, size_t off, uint32_t length)
{
    struct ibv_sge sge = {
        .addr = (uint64_t)(uintptr_t)(ep->buf + off), .length = length, .lkey = ep->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr *bad = NULL;
    return ibv_post_recv(ep->qp, &wr, &bad);
}

static void xfer(int fd, void *out, const void *in, size_t len)
{
    cr_assert_eq(write(fd, in, len), (ssize_t)len);
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)out + got, len - got);
        cr_assert_gt(n, 0, "peer went away during the exchange");
        got += (size_t)n;
    }
}

/* Child side of xfer: exits on failure. */
static void child_xfer(int fd, void *out, const void *in, size_t len)
{
    CHILD_CHECK(write(fd, in, len) == (ssize_t)len);
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)out + got, len - got);
        CHILD_CHECK(n > 0);
        got += (size_t)n;
    }
}

static void child_signal(int fd)
{
    char byte = 1;
    CHILD_CHECK(write(fd, &byte, 1) == 1);
}

static void child_wait_signal(int fd)
{
    char byte;
    CHILD_CHECK(read(fd, &byte, 1) == 1);
}

static void parent_signal(int fd)
{
    char byte = 1;
    cr_assert_eq(write(fd, &byte, 1), 1);
}

static void parent_wait_signal(int fd)
{
    char byte;
    cr_assert_eq(read(fd, &byte, 1), 1, "the child did not answer");
}

static void pattern_fill(unsigned char *buf, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = (unsigned char)((i * 131u + seed) ^ (i >> 9));
}

static int pattern_ok(const unsigned char *buf, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        if (buf[i] != (unsigned char)((i * 131u + seed) ^ (i >> 9)))
            return 0;
    return 1;
}

/* The child's exit status within WAIT_MS. */
static void wait_child(pid_t pid)
{
    int status = 0;
    uint64_t deadline = now_ms() + WAIT_MS;
    pid_t done = 0;
    while ((done = waitpid(pid, &status, WNOHANG)) == 0 && now_ms() < deadline)
        usleep(1000);
    if (done == 0)
        kill(pid, SIGKILL);
    cr_assert_eq(done, pid, "the child did not finish in time");
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status 0x%x)",
              status);
}

/* Fork a responder running @p child_main(fd); the parent gets the other end. */
static pid_t fork_peer(void (*child_main)(int fd), int *fd_p)
{
    int fds[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        alarm(TEST_DEADLINE_S);
        child_main(fds[1]);
        _exit(0);
    }
    close(fds[1]);
    *fd_p = fds[0];
    return pid;
}

/* Child: a connected responder QP; the parent's info comes back in @p peer. */
static void child_connect(struct ep *ep, int fd, struct ep_info *peer)
{
    CHILD_CHECK(ep_open(ep, 64, 0) == 0);
    child_xfer(fd, peer, &ep->info, sizeof(*peer));
    CHILD_CHECK(connect_qp(ep, peer, RNR_FOREVER) == 0);
}

static void parent_connect(struct ep *ep, int fd, struct ep_info *peer, uint32_t sq_depth)
{
    cr_assert_eq(ep_open(ep, sq_depth, 0), 0);
    xfer(fd, peer, &ep->info, sizeof(*peer));
    cr_assert_eq(connect_qp(ep, peer, RNR_FOREVER), 0);
}

static void setup_deadline(void)
{
    alarm(TEST_DEADLINE_S);
}

TestSuite(fakeverbs, .init = setup_deadline);

/* ------------------------------------------------------------ devices */

Test(fakeverbs, device_list_query_device_port_and_gid_infiniband)
{
    int n = -1;
    struct ibv_device **list = ibv_get_device_list(&n);
    cr_assert_not_null(list);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(ibv_get_device_name(list[0]), "fake_0");
    cr_assert_eq(list[0]->node_type, IBV_NODE_CA);
    struct ibv_context *ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    cr_assert_not_null(ctx);
    struct ibv_device_attr dev;
    cr_assert_eq(ibv_query_device(ctx, &dev), 0);
    cr_assert_eq(dev.max_qp_wr, 4096);
    cr_assert_eq(dev.max_cqe, 65536);
    cr_assert_eq(dev.max_sge, 1);
    cr_assert_eq(dev.phys_port_cnt, 1);
    struct ibv_port_attr port;
    cr_assert_eq(ibv_query_port(ctx, 1, &port), 0);
    cr_assert_eq(port.state, IBV_PORT_ACTIVE);
    cr_assert_eq(port.active_mtu, IBV_MTU_4096);
    cr_assert_eq(port.link_layer, IBV_LINK_LAYER_INFINIBAND);
    cr_assert_neq(port.lid, 0);
    union ibv_gid gid;
    cr_assert_eq(ibv_query_gid(ctx, 1, 0, &gid), 0);
    cr_assert(gid.raw[0] == 0xfe && gid.raw[1] == 0x80, "GID 0 is link-local");
    cr_assert_neq(ibv_query_gid(ctx, 1, 1, &gid), 0, "IB has one GID");
    cr_assert_eq(ctx->device->node_type, IBV_NODE_CA);
    cr_assert_geq(ctx->async_fd, 0);
    cr_assert_eq(ibv_close_device(ctx), 0);
}

Test(fakeverbs, roce_link_layer_has_lid_0_and_an_ipv4_mapped_gid)
{
    setenv("FAKEVERBS_LINK_LAYER", "roce", 1);
    setenv("FAKEVERBS_ADDR", "127.0.0.1", 1);
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_context *ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    cr_assert_not_null(ctx);
    struct ibv_port_attr port;
    cr_assert_eq(ibv_query_port(ctx, 1, &port), 0);
    cr_assert_eq(port.link_layer, IBV_LINK_LAYER_ETHERNET);
    cr_assert_eq(port.lid, 0);
    union ibv_gid gid;
    cr_assert_eq(ibv_query_gid(ctx, 1, 1, &gid), 0);
    static const unsigned char mapped[16] = {0, 0, 0,    0,    0,   0, 0, 0,
                                             0, 0, 0xff, 0xff, 127, 0, 0, 1};
    cr_assert_arr_eq(gid.raw, mapped, 16);
    ibv_close_device(ctx);
}

Test(fakeverbs, device_count_from_the_environment)
{
    setenv("FAKEVERBS_DEVICES", "3", 1);
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(ibv_get_device_name(list[2]), "fake_2");
    cr_assert_null(list[3]);
    ibv_free_device_list(list);
}

Test(fakeverbs, zero_devices_is_an_empty_list)
{
    setenv("FAKEVERBS_DEVICES", "0", 1);
    int n = -1;
    struct ibv_device **list = ibv_get_device_list(&n);
    cr_assert_not_null(list);
    cr_assert_eq(n, 0);
    cr_assert_null(list[0]);
    ibv_free_device_list(list);
}

Test(fakeverbs, every_symbol_resolves_at_ibverbs_1_1_by_path)
{
    const char *path = getenv("FAKEVERBS_LIB");
    if (path == NULL) {
        cr_skip_test("FAKEVERBS_LIB is not set (ctest sets it)");
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(lib, "%s", dlerror());
    static const char *const names[] = {
        "ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_open_device",
        "ibv_close_device",    "ibv_query_device",     "ibv_query_port",      "ibv_query_gid",
        "ibv_alloc_pd",        "ibv_dealloc_pd",       "ibv_reg_mr",          "ibv_dereg_mr",
        "ibv_create_cq",       "ibv_destroy_cq",       "ibv_create_qp",       "ibv_modify_qp",
        "ibv_destroy_qp",      "ibv_get_async_event",  "ibv_ack_async_event", "ibv_wc_status_str",
        "ibv_event_type_str"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        cr_assert_not_null(dlvsym(lib, names[i], "IBVERBS_1.1"), "%s@IBVERBS_1.1", names[i]);
    cr_assert_null(dlvsym(lib, "fv_qp_find", "IBVERBS_1.1"), "internals stay hidden");
    dlclose(lib);
}

/* ------------------------------------------------------------ state machine */

Test(fakeverbs, qp_state_machine_rejects_bad_transitions_and_missing_masks)
{
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 16, 0), 0);
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_RTR};
    cr_assert_eq(ibv_modify_qp(ep.qp, &attr, IBV_QP_STATE), EINVAL, "RESET -> RTR");
    attr = (struct ibv_qp_attr){.qp_state = IBV_QPS_INIT, .port_num = 1};
    cr_assert_eq(ibv_modify_qp(ep.qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT),
                 EINVAL, "INIT without ACCESS_FLAGS");
    cr_assert_eq(post_recv(&ep, 1, 0, 64), EINVAL, "post_recv in RESET");
    cr_assert_eq(to_init(ep.qp), 0);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, 8, ep.info.addr, ep.info.rkey, 1, 0),
                 EINVAL, "post_send in INIT");
    cr_assert_eq(post_recv(&ep, 1, 0, 64), 0, "post_recv in INIT");
    attr = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS};
    cr_assert_eq(ibv_modify_qp(ep.qp, &attr, IBV_QP_STATE), EINVAL, "INIT -> RTS");
    attr = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR,
                                .path_mtu = IBV_MTU_4096,
                                .dest_qp_num = ep.info.qpn,
                                .ah_attr = {.dlid = ep.info.lid, .port_num = 1}};
    cr_assert_eq(ibv_modify_qp(ep.qp, &attr,
                               IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC),
                 EINVAL, "RTR without MIN_RNR_TIMER");
    cr_assert_eq(to_rtr(ep.qp, &ep.info), 0);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, 8, ep.info.addr, ep.info.rkey, 1, 0),
                 EINVAL, "post_send in RTR");
    attr = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7};
    cr_assert_eq(ibv_modify_qp(ep.qp, &attr,
                               IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                   IBV_QP_MAX_QP_RD_ATOMIC),
                 EINVAL, "RTS without SQ_PSN");
    cr_assert_eq(to_rts(ep.qp, TIMEOUT_14, 7, RNR_FOREVER), 0);
    cr_assert_eq(ep.qp->state, IBV_QPS_RTS);
    attr = (struct ibv_qp_attr){.qp_state = IBV_QPS_INIT};
    cr_assert_eq(ibv_modify_qp(ep.qp, &attr, IBV_QP_STATE), EINVAL, "RTS -> INIT");
    attr = (struct ibv_qp_attr){.qp_state = IBV_QPS_ERR};
    cr_assert_eq(ibv_modify_qp(ep.qp, &attr, IBV_QP_STATE), 0);
    struct ibv_wc wc;
    cr_assert_eq(wait_wc(ep.cq, &wc), 1, "the receive posted in INIT flushes");
    cr_assert_eq(wc.status, IBV_WC_WR_FLUSH_ERR);
    cr_assert_eq(wc.wr_id, 1);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 7, 0, 8, ep.info.addr, ep.info.rkey, 0, 0), 0);
    cr_assert_eq(wait_wc(ep.cq, &wc), 1, "a WR posted in ERR flushes");
    cr_assert_eq(wc.status, IBV_WC_WR_FLUSH_ERR);
    cr_assert_eq(wc.wr_id, 7);
    ep_close(&ep);
}

/* ------------------------------------------------------------ two processes */

static void write_imm_child(int fd)
{
    struct ep ep;
    struct ep_info peer;
    child_connect(&ep, fd, &peer);
    CHILD_CHECK(post_recv(&ep, 42, 0, 0) == 0);
    child_signal(fd);
    struct ibv_wc wc;
    CHILD_CHECK(wait_wc(ep.cq, &wc) == 1);
    CHILD_CHECK(wc.status == IBV_WC_SUCCESS);
    CHILD_CHECK(wc.wr_id == 42);
    CHILD_CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
    CHILD_CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
    CHILD_CHECK(ntohl(wc.imm_data) == 0xC0FFEE);
    CHILD_CHECK(wc.byte_len == 4096);
    CHILD_CHECK(wc.qp_num == ep.qp->qp_num);
    /* The 1 MiB written before the immediate is there already. */
    CHILD_CHECK(pattern_ok(ep.buf, MIB, 7));
    CHILD_CHECK(pattern_ok(ep.buf + MIB, 4096, 9));
    child_signal(fd);
    ep_close(&ep);
}

Test(fakeverbs, write_1mib_then_write_with_imm_lands_before_the_recv_completion)
{
    int fd;
    pid_t pid = fork_peer(write_imm_child, &fd);
    struct ep ep;
    struct ep_info peer;
    parent_connect(&ep, fd, &peer, 64);
    pattern_fill(ep.buf, MIB, 7);
    pattern_fill(ep.buf + MIB, 4096, 9);
    parent_wait_signal(fd);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, MIB, peer.addr, peer.rkey, 0, 0), 0);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE_WITH_IMM, 2, MIB, 4096, peer.addr + MIB,
                            peer.rkey, 1, 0xC0FFEE),
                 0);
    struct ibv_wc wc;
    cr_assert_eq(wait_wc(ep.cq, &wc), 1, "no completion for the write with immediate");
    cr_assert_eq(wc.status, IBV_WC_SUCCESS, "%s", ibv_wc_status_str(wc.status));
    cr_assert_eq(wc.wr_id, 2, "the unsignaled write has no completion");
    cr_assert_eq(wc.opcode, IBV_WC_RDMA_WRITE);
    cr_assert_eq(wc.qp_num, ep.qp->qp_num);
    parent_wait_signal(fd);
    wait_child(pid);
    ep_close(&ep);
}

static void send_child(int fd)
{
    struct ep ep;
    struct ep_info peer;
    child_connect(&ep, fd, &peer);
    CHILD_CHECK(post_recv(&ep, 10, 0, 4096) == 0);
    CHILD_CHECK(post_recv(&ep, 11, 4096, 4096) == 0);
    child_signal(fd);
    struct ibv_wc wc;
    CHILD_CHECK(wait_wc(ep.cq, &wc) == 1);
    CHILD_CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 10 && wc.opcode == IBV_WC_RECV);
    CHILD_CHECK(wc.byte_len == 1000 && !(wc.wc_flags & IBV_WC_WITH_IMM));
    CHILD_CHECK(pattern_ok(ep.buf, 1000, 3));
    CHILD_CHECK(wait_wc(ep.cq, &wc) == 1);
    CHILD_CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 11 && wc.opcode == IBV_WC_RECV);
    CHILD_CHECK(wc.byte_len == 32 && (wc.wc_flags & IBV_WC_WITH_IMM));
    CHILD_CHECK(ntohl(wc.imm_data) == 77);
    CHILD_CHECK(pattern_ok(ep.buf + 4096, 32, 5));
    child_signal(fd);
    ep_close(&ep);
}

Test(fakeverbs, send_and_send_with_imm_fill_posted_receives)
{
    int fd;
    pid_t pid = fork_peer(send_child, &fd);
    struct ep ep;
    struct ep_info peer;
    parent_connect(&ep, fd, &peer, 64);
    pattern_fill(ep.buf, 1000, 3);
    pattern_fill(ep.buf + 8192, 32, 5);
    parent_wait_signal(fd);
    cr_assert_eq(post_write(&ep, IBV_WR_SEND, 1, 0, 1000, 0, 0, 1, 0), 0);
    /* Inline: the buffer may change right after the post. */
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)(ep.buf + 8192), .length = 32};
    struct ibv_send_wr wr = {.wr_id = 2,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND_WITH_IMM,
                             .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE,
                             .imm_data = htonl(77)};
    struct ibv_send_wr *bad;
    cr_assert_eq(ibv_post_send(ep.qp, &wr, &bad), 0);
    memset(ep.buf + 8192, 0, 32);
    struct ibv_wc wc;
    for (uint64_t id = 1; id <= 2; id++) {
        cr_assert_eq(wait_wc(ep.cq, &wc), 1);
        cr_assert_eq(wc.status, IBV_WC_SUCCESS, "%s", ibv_wc_status_str(wc.status));
        cr_assert_eq(wc.wr_id, id);
        cr_assert_eq(wc.opcode, IBV_WC_SEND);
    }
    parent_wait_signal(fd);
    wait_child(pid);
    ep_close(&ep);
}

#define N_ORDERED 3000

static void ordering_child(int fd)
{
    struct ep ep;
    struct ep_info peer;
    child_connect(&ep, fd, &peer);
    CHILD_CHECK(post_recv(&ep, 1, 0, 0) == 0);
    child_signal(fd);
    struct ibv_wc wc;
    CHILD_CHECK(wait_wc(ep.cq, &wc) == 1);
    CHILD_CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM);
    /* Slot i was written by writes i (value i) then i + N (value i + N). */
    const uint64_t *slots = (const uint64_t *)ep.buf;
    for (uint64_t i = 0; i < N_ORDERED / 2; i++)
        CHILD_CHECK(slots[i] == i + N_ORDERED / 2);
    child_signal(fd);
    ep_close(&ep);
}

Test(fakeverbs, many_writes_land_in_order_and_complete_in_order)
{
    int fd;
    pid_t pid = fork_peer(ordering_child, &fd);
    struct ep ep;
    struct ep_info peer;
    parent_connect(&ep, fd, &peer, 256);
    uint64_t *values = (uint64_t *)(ep.buf + MIB);
    for (uint64_t i = 0; i < N_ORDERED; i++)
        values[i] = i;
    parent_wait_signal(fd);
    uint64_t next_wc = 0;
    struct ibv_wc wc;
    for (uint64_t i = 0; i <= N_ORDERED; i++) {
        size_t slot = i % (N_ORDERED / 2);
        enum ibv_wr_opcode opcode = i == N_ORDERED ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
        uint32_t length = i == N_ORDERED ? 0 : 8;
        int rc;
        uint64_t deadline = now_ms() + WAIT_MS;
        while ((rc = post_write(&ep, opcode, i, MIB + i * 8, length, peer.addr + slot * 8,
                                peer.rkey, 1, 0)) == ENOMEM) {
            cr_assert_lt(now_ms(), deadline, "the send queue never drained");
            while (ibv_poll_cq(ep.cq, 1, &wc) == 1) {
                cr_assert_eq(wc.status, IBV_WC_SUCCESS);
                cr_assert_eq(wc.wr_id, next_wc++, "completions out of order");
            }
        }
        cr_assert_eq(rc, 0);
    }
    while (next_wc <= N_ORDERED) {
        cr_assert_eq(wait_wc(ep.cq, &wc), 1, "missing completion %llu",
                     (unsigned long long)next_wc);
        cr_assert_eq(wc.status, IBV_WC_SUCCESS);
        cr_assert_eq(wc.wr_id, next_wc++, "completions out of order");
    }
    parent_wait_signal(fd);
    wait_child(pid);
    ep_close(&ep);
}

/* A responder that only stays connected until the parent says so. */
static void idle_child(int fd)
{
    struct ep ep;
    struct ep_info peer;
    child_connect(&ep, fd, &peer);
    child_signal(fd);
    child_wait_signal(fd);
    ep_close(&ep);
}

static void expect_status(struct ep *ep, uint64_t wr_id, enum ibv_wc_status status)
{
    struct ibv_wc wc;
    cr_assert_eq(wait_wc(ep->cq, &wc), 1, "no completion for wr %llu", (unsigned long long)wr_id);
    cr_assert_eq(wc.wr_id, wr_id);
    cr_assert_eq(wc.status, status, "wr %llu: got %s, want %s", (unsigned long long)wr_id,
                 ibv_wc_status_str(wc.status), ibv_wc_status_str(status));
}

Test(fakeverbs, write_to_an_rkey_without_remote_write_is_rem_access_err_then_flush)
{
    int fd;
    pid_t pid = fork_peer(idle_child, &fd);
    struct ep ep;
    struct ep_info peer;
    parent_connect(&ep, fd, &peer, 64);
    parent_wait_signal(fd);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, 64, peer.addr, peer.rkey, 1, 0), 0);
    expect_status(&ep, 1, IBV_WC_SUCCESS);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 2, 0, 64, peer.addr, peer.rkey_readonly, 1, 0),
                 0);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 3, 0, 64, peer.addr, peer.rkey, 0, 0), 0);
    expect_status(&ep, 2, IBV_WC_REM_ACCESS_ERR);
    expect_status(&ep, 3, IBV_WC_WR_FLUSH_ERR);
    cr_assert_eq(ep.qp->state, IBV_QPS_ERR);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 4, 0, 64, peer.addr, peer.rkey, 0, 0), 0);
    expect_status(&ep, 4, IBV_WC_WR_FLUSH_ERR);
    parent_signal(fd);
    wait_child(pid);
    ep_close(&ep);
}

/* Deregisters the region a 2 MiB write is arriving into as soon as its
 * first byte has landed (mid-payload, unless all of it came at once), then
 * fills the buffer with a canary that must stay: no byte lands after
 * ibv_dereg_mr returned, as with a NIC. */
static void dereg_under_a_write_child(int fd)
{
    struct ep ep;
    struct ep_info peer;
    child_connect(&ep, fd, &peer);
    child_signal(fd);
    child_wait_signal(fd);
    uint64_t end = now_ms() + 5000;
    while (__atomic_load_n(&ep.buf[0], __ATOMIC_ACQUIRE) == 0 && now_ms() < end)
        ;
    CHILD_CHECK(ep.buf[0] != 0);
    int whole = __atomic_load_n(&ep.buf[BUF_BYTES - 1], __ATOMIC_ACQUIRE) != 0;
    CHILD_CHECK(ibv_dereg_mr(ep.mr) == 0);
    ep.mr = NULL;
    memset(ep.buf, 0x5a, BUF_BYTES);
    usleep(300 * 1000);
    size_t changed = 0;
    for (size_t b = 0; b < BUF_BYTES; b++)
        changed += ep.buf[b] != 0x5a;
    CHILD_CHECK(changed == 0);
    unsigned char said = whole ? 'W' : 'P'; /* Whole before the deregistration, or part. */
    CHILD_CHECK(write(fd, &said, 1) == 1);
    child_signal(fd);
    child_wait_signal(fd);
    ep_close(&ep);
}

Test(fakeverbs, no_byte_lands_in_a_region_after_it_is_deregistered)
{
    int fd;
    pid_t pid = fork_peer(dereg_under_a_write_child, &fd);
    struct ep ep;
    struct ep_info peer;
    parent_connect(&ep, fd, &peer, 64);
    pattern_fill(ep.buf, BUF_BYTES, 3);
    ep.buf[0] = 0xff, ep.buf[BUF_BYTES - 1] = 0xff; /* What the child watches for. */
    parent_wait_signal(fd);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, BUF_BYTES, peer.addr, peer.rkey, 1, 0),
                 0);
    parent_signal(fd);
    struct ibv_wc wc;
    cr_assert_eq(wait_wc(ep.cq, &wc), 1, "no completion for the write");
    cr_assert(wc.status == IBV_WC_SUCCESS || wc.status == IBV_WC_REM_ACCESS_ERR, "%s",
              ibv_wc_status_str(wc.status));
    unsigned char said = 0;
    cr_assert_eq(read(fd, &said, 1), 1, "the child's canary check failed");
    cr_log_info("the write ended with %s; %s", ibv_wc_status_str(wc.status),
                said == 'P' ? "the region went mid-payload"
                            : "it had landed whole before the region went");
    parent_wait_signal(fd); /* The child found its canary whole. */
    parent_signal(fd);
    wait_child(pid);
    ep_close(&ep);
}

Test(fakeverbs, write_out_of_bounds_is_rem_access_err_and_zero_length_skips_the_rkey)
{
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 0), 0);
    cr_assert_eq(connect_qp(&ep, &ep.info, RNR_FOREVER), 0);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, 0, 0, 0xdead, 1, 0), 0);
    expect_status(&ep, 1, IBV_WC_SUCCESS);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 2, 0, 64, ep.info.addr + BUF_BYTES - 32,
                            ep.info.rkey, 1, 0),
                 0);
    expect_status(&ep, 2, IBV_WC_REM_ACCESS_ERR);
    ep_close(&ep);
}

Test(fakeverbs, local_sge_outside_its_lkey_is_loc_prot_err)
{
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 0), 0);
    cr_assert_eq(connect_qp(&ep, &ep.info, RNR_FOREVER), 0);
    cr_assert_eq(
        post_write(&ep, IBV_WR_RDMA_WRITE, 1, BUF_BYTES - 8, 64, ep.info.addr, ep.info.rkey, 1, 0),
        0);
    expect_status(&ep, 1, IBV_WC_LOC_PROT_ERR);
    cr_assert_eq(ep.qp->state, IBV_QPS_ERR);
    ep_close(&ep);
}

static void rnr_child(int fd)
{
    struct ep ep;
    struct ep_info peer;
    child_connect(&ep, fd, &peer);
    child_signal(fd);
    child_wait_signal(fd); /* the write with immediate is posted */
    usleep(300 * 1000);
    CHILD_CHECK(post_recv(&ep, 5, 0, 0) == 0);
    struct ibv_wc wc;
    CHILD_CHECK(wait_wc(ep.cq, &wc) == 1);
    CHILD_CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 5);
    CHILD_CHECK(ntohl(wc.imm_data) == 99);
    CHILD_CHECK(pattern_ok(ep.buf, 4096, 1));
    child_signal(fd);
    ep_close(&ep);
}

Test(fakeverbs, rnr_write_with_imm_completes_once_the_peer_posts_a_receive)
{
    int fd;
    pid_t pid = fork_peer(rnr_child, &fd);
    struct ep ep;
    struct ep_info peer;
    parent_connect(&ep, fd, &peer, 64);
    pattern_fill(ep.buf, 4096, 1);
    parent_wait_signal(fd);
    cr_assert_eq(
        post_write(&ep, IBV_WR_RDMA_WRITE_WITH_IMM, 1, 0, 4096, peer.addr, peer.rkey, 1, 99), 0);
    parent_signal(fd);
    cr_assert(no_wc_for(ep.cq, 150), "completed before the receive was posted");
    expect_status(&ep, 1, IBV_WC_SUCCESS);
    parent_wait_signal(fd);
    wait_child(pid);
    ep_close(&ep);
}

Test(fakeverbs, rnr_with_a_finite_retry_count_is_rnr_retry_exc_err)
{
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 0), 0);
    cr_assert_eq(to_init(ep.qp), 0);
    cr_assert_eq(to_rtr(ep.qp, &ep.info), 0);
    cr_assert_eq(to_rts(ep.qp, TIMEOUT_14, 7, 2), 0);
    cr_assert_eq(post_write(&ep, IBV_WR_SEND, 1, 0, 16, 0, 0, 1, 0), 0);
    expect_status(&ep, 1, IBV_WC_RNR_RETRY_EXC_ERR);
    ep_close(&ep);
}

Test(fakeverbs, send_queue_full_is_enomem_and_unsignaled_wrs_hold_their_slots)
{
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 4, 0), 0);
    cr_assert_eq(connect_qp(&ep, &ep.info, RNR_FOREVER), 0);
    uint64_t remote = ep.info.addr + MIB;
    /* The first write carries an immediate and no receive is posted: it
     * waits in RNR (forever), and the writes behind it cannot complete, so
     * the queue stays full whatever the service thread's timing. */
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE_WITH_IMM, 0, 0, 8, remote, ep.info.rkey, 0, 7),
                 0);
    for (uint64_t i = 1; i < 3; i++)
        cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, i, 0, 8, remote, ep.info.rkey, 0, 0), 0);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 3, 0, 8, remote, ep.info.rkey, 1, 0), 0);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 4, 0, 8, remote, ep.info.rkey, 1, 0), ENOMEM);
    /* A receive lets them all through: its completion and write 3's, in either order. */
    cr_assert_eq(post_recv(&ep, 50, 0, 0), 0);
    int seen_recv = 0, seen_write = 0;
    for (int n = 0; n < 2; n++) {
        struct ibv_wc wc;
        cr_assert_eq(wait_wc(ep.cq, &wc), 1, "completion %d of 2 did not come", n + 1);
        cr_assert_eq(wc.status, IBV_WC_SUCCESS, "wr %llu: %s", (unsigned long long)wc.wr_id,
                     ibv_wc_status_str(wc.status));
        seen_recv += wc.wr_id == 50;
        seen_write += wc.wr_id == 3;
    }
    cr_assert(seen_recv == 1 && seen_write == 1, "completions: receive %d, write 3 %d", seen_recv,
              seen_write);
    /* The signaled completion retired the unsignaled ones before it. */
    for (uint64_t i = 0; i < 4; i++)
        cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 10 + i, 0, 8, remote, ep.info.rkey, 0, 0),
                     0);
    usleep(100 * 1000);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 20, 0, 8, remote, ep.info.rkey, 1, 0), ENOMEM,
                 "done but unsignaled WRs still fill the queue");
    ep_close(&ep);
}

static void dies_child(int fd)
{
    struct ep ep;
    struct ep_info peer;
    child_connect(&ep, fd, &peer);
    child_signal(fd);
    child_wait_signal(fd);
    kill(getpid(), SIGKILL);
}

Test(fakeverbs, dead_peer_is_retry_exc_err_within_2_seconds)
{
    int fd;
    pid_t pid = fork_peer(dies_child, &fd);
    struct ep ep;
    struct ep_info peer;
    parent_connect(&ep, fd, &peer, 64);
    parent_wait_signal(fd);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, 64, peer.addr, peer.rkey, 1, 0), 0);
    expect_status(&ep, 1, IBV_WC_SUCCESS);
    parent_signal(fd);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    uint64_t start = now_ms();
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 2, 0, 64, peer.addr, peer.rkey, 1, 0), 0);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 3, 0, 64, peer.addr, peer.rkey, 1, 0), 0);
    expect_status(&ep, 2, IBV_WC_RETRY_EXC_ERR);
    cr_assert_lt(now_ms() - start, 2000);
    expect_status(&ep, 3, IBV_WC_WR_FLUSH_ERR);
    ep_close(&ep);
}

Test(fakeverbs, absent_destination_qp_is_retry_exc_err_after_the_timeout)
{
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 0), 0);
    struct ep_info nowhere = ep.info;
    nowhere.qpn = 0x42; /* below the range fake-verbs hands out */
    cr_assert_eq(to_init(ep.qp), 0);
    cr_assert_eq(to_rtr(ep.qp, &nowhere), 0);
    cr_assert_eq(to_rts(ep.qp, TIMEOUT_14, 2, RNR_FOREVER), 0); /* 3 x 67 ms */
    uint64_t start = now_ms();
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, 8, ep.info.addr, ep.info.rkey, 1, 0), 0);
    expect_status(&ep, 1, IBV_WC_RETRY_EXC_ERR);
    uint64_t took = now_ms() - start;
    cr_assert(took >= 150 && took < 3000, "gave up after %llu ms", (unsigned long long)took);
    ep_close(&ep);
}

Test(fakeverbs, wrong_dlid_is_like_no_destination)
{
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 0), 0);
    struct ep_info elsewhere = ep.info;
    elsewhere.lid = (uint16_t)(ep.info.lid + 1);
    cr_assert_eq(to_init(ep.qp), 0);
    cr_assert_eq(to_rtr(ep.qp, &elsewhere), 0);
    cr_assert_eq(to_rts(ep.qp, 10, 1, RNR_FOREVER), 0);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, 8, ep.info.addr, ep.info.rkey, 1, 0), 0);
    expect_status(&ep, 1, IBV_WC_RETRY_EXC_ERR);
    ep_close(&ep);
}

/* ------------------------------------------------------------ fault knobs */

Test(fakeverbs, fail_after_writes_knob_fails_the_next_write)
{
    setenv("FAKEVERBS_FAIL_AFTER_WRITES", "2", 1);
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 1), 0);
    cr_assert_eq(connect_qp(&ep, &ep.info, RNR_FOREVER), 0);
    for (uint64_t i = 1; i <= 4; i++)
        cr_assert_eq(
            post_write(&ep, IBV_WR_RDMA_WRITE, i, 0, 8, ep.info.addr + MIB, ep.info.rkey, 0, 0), 0);
    expect_status(&ep, 1, IBV_WC_SUCCESS);
    expect_status(&ep, 2, IBV_WC_SUCCESS);
    expect_status(&ep, 3, IBV_WC_RETRY_EXC_ERR);
    expect_status(&ep, 4, IBV_WC_WR_FLUSH_ERR);
    ep_close(&ep);
}

Test(fakeverbs, fail_reads_knob_fails_every_read_and_no_write)
{
    setenv("FAKEVERBS_FAIL_READS", "1", 1);
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 1), 0);
    cr_assert_eq(connect_qp(&ep, &ep.info, RNR_FOREVER), 0);
    cr_assert_eq(
        post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, 8, ep.info.addr + MIB, ep.info.rkey, 0, 0), 0);
    expect_status(&ep, 1, IBV_WC_SUCCESS);
    cr_assert_eq(post_read(&ep, 2, 0, 8, ep.info.addr + MIB, ep.info.rkey), 0);
    expect_status(&ep, 2, IBV_WC_RETRY_EXC_ERR);
    cr_assert_eq(ep.qp->state, IBV_QPS_ERR);
    ep_close(&ep);
}

Test(fakeverbs, lose_completion_knob_drops_exactly_that_completion)
{
    setenv("FAKEVERBS_LOSE_COMPLETION", "2", 1);
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 1), 0);
    cr_assert_eq(connect_qp(&ep, &ep.info, RNR_FOREVER), 0);
    for (uint64_t i = 1; i <= 3; i++)
        cr_assert_eq(
            post_write(&ep, IBV_WR_RDMA_WRITE, i, 0, 8, ep.info.addr + MIB, ep.info.rkey, 0, 0), 0);
    expect_status(&ep, 1, IBV_WC_SUCCESS);
    expect_status(&ep, 3, IBV_WC_SUCCESS);
    cr_assert(no_wc_for(ep.cq, 100));
    ep_close(&ep);
}

/* The next async event within WAIT_MS, seen through the async fd. */
static void expect_async(struct ibv_context *ctx, enum ibv_event_type type,
                         struct ibv_async_event *event)
{
    struct pollfd pfd = {.fd = ctx->async_fd, .events = POLLIN};
    cr_assert_eq(poll(&pfd, 1, WAIT_MS), 1, "the async fd never became readable");
    cr_assert_eq(ibv_get_async_event(ctx, event), 0);
    cr_assert_eq(event->event_type, type, "got %s", ibv_event_type_str(event->event_type));
    ibv_ack_async_event(event);
}

Test(fakeverbs, port_down_knob_reports_port_err_and_flushes_every_qp)
{
    setenv("FAKEVERBS_PORT_DOWN_AFTER_MS", "200", 1);
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 1), 0);
    cr_assert_eq(connect_qp(&ep, &ep.info, RNR_FOREVER), 0);
    cr_assert_eq(post_recv(&ep, 9, 0, 64), 0);
    struct ibv_async_event event;
    expect_async(ep.ctx, IBV_EVENT_PORT_ERR, &event);
    cr_assert_eq(event.element.port_num, 1);
    struct ibv_port_attr port;
    cr_assert_eq(ibv_query_port(ep.ctx, 1, &port), 0);
    cr_assert_eq(port.state, IBV_PORT_DOWN);
    expect_status(&ep, 9, IBV_WC_WR_FLUSH_ERR);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, 8, ep.info.addr, ep.info.rkey, 0, 0), 0);
    expect_status(&ep, 1, IBV_WC_WR_FLUSH_ERR);
    ep_close(&ep);
}

Test(fakeverbs, qp_fatal_knob_raises_qp_fatal_on_the_async_fd)
{
    setenv("FAKEVERBS_ASYNC_QP_FATAL_AFTER_MS", "100", 1);
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 1), 0);
    int flags = fcntl(ep.ctx->async_fd, F_GETFL);
    cr_assert_eq(fcntl(ep.ctx->async_fd, F_SETFL, flags | O_NONBLOCK), 0);
    struct ibv_async_event event;
    errno = 0;
    cr_assert_eq(ibv_get_async_event(ep.ctx, &event), -1, "no event queued yet");
    cr_assert_eq(errno, EAGAIN);
    cr_assert_eq(connect_qp(&ep, &ep.info, RNR_FOREVER), 0);
    expect_async(ep.ctx, IBV_EVENT_QP_FATAL, &event);
    cr_assert_eq(event.element.qp, ep.qp);
    cr_assert_eq(ep.qp->state, IBV_QPS_ERR);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, 8, ep.info.addr, ep.info.rkey, 0, 0), 0);
    expect_status(&ep, 1, IBV_WC_WR_FLUSH_ERR);
    ep_close(&ep);
}

Test(fakeverbs, cq_overflow_raises_cq_err_and_moves_its_qps_to_err)
{
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 1), 0);
    struct ibv_cq *small = ibv_create_cq(ep.ctx, 2, NULL, NULL, 0);
    struct ibv_qp_init_attr init = {.send_cq = small,
                                    .recv_cq = small,
                                    .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1},
                                    .qp_type = IBV_QPT_RC,
                                    .sq_sig_all = 1};
    struct ibv_qp *qp = ibv_create_qp(ep.pd, &init);
    cr_assert_not_null(qp);
    struct ep_info self = ep.info;
    self.qpn = qp->qp_num;
    cr_assert_eq(to_init(qp), 0);
    cr_assert_eq(to_rtr(qp, &self), 0);
    cr_assert_eq(to_rts(qp, TIMEOUT_14, 7, RNR_FOREVER), 0);
    struct ibv_qp *saved = ep.qp;
    ep.qp = qp;
    for (uint64_t i = 0; i < 3; i++)
        cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, i, 0, 8, ep.info.addr, ep.info.rkey, 0, 0),
                     0);
    ep.qp = saved;
    struct ibv_async_event event;
    expect_async(ep.ctx, IBV_EVENT_CQ_ERR, &event);
    cr_assert_eq(event.element.cq, small);
    cr_assert_eq(qp->state, IBV_QPS_ERR);
    cr_assert_eq(ibv_destroy_qp(qp), 0);
    cr_assert_eq(ibv_destroy_cq(small), 0);
    ep_close(&ep);
}

/* ------------------------------------------------------------ fork */

Test(fakeverbs, a_child_forked_after_open_opens_its_own_device)
{
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 0), 0, "the parent opens before the fork");
    int fd;
    pid_t pid = fork_peer(write_imm_child, &fd);
    struct ep_info peer;
    xfer(fd, &peer, &ep.info, sizeof(peer));
    cr_assert_neq(peer.qpn, ep.info.qpn);
    cr_assert_eq(connect_qp(&ep, &peer, RNR_FOREVER), 0);
    pattern_fill(ep.buf, MIB, 7);
    pattern_fill(ep.buf + MIB, 4096, 9);
    parent_wait_signal(fd);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, MIB, peer.addr, peer.rkey, 0, 0), 0);
    cr_assert_eq(post_write(&ep, IBV_WR_RDMA_WRITE_WITH_IMM, 2, MIB, 4096, peer.addr + MIB,
                            peer.rkey, 1, 0xC0FFEE),
                 0);
    expect_status(&ep, 2, IBV_WC_SUCCESS);
    parent_wait_signal(fd);
    wait_child(pid);
    ep_close(&ep);
}

Test(fakeverbs, send_larger_than_the_receive_is_loc_len_err_there_and_rem_inv_req_here)
{
    struct ep requester, responder;
    cr_assert_eq(ep_open(&requester, 64, 0), 0);
    cr_assert_eq(ep_open(&responder, 64, 0), 0, "a second context in the same process");
    cr_assert_eq(connect_qp(&requester, &responder.info, RNR_FOREVER), 0);
    cr_assert_eq(connect_qp(&responder, &requester.info, RNR_FOREVER), 0);
    cr_assert_eq(post_recv(&responder, 5, 0, 8), 0);
    cr_assert_eq(post_write(&requester, IBV_WR_SEND, 1, 0, 64, 0, 0, 1, 0), 0);
    expect_status(&requester, 1, IBV_WC_REM_INV_REQ_ERR);
    expect_status(&responder, 5, IBV_WC_LOC_LEN_ERR);
    cr_assert_eq(requester.qp->state, IBV_QPS_ERR);
    cr_assert_eq(responder.qp->state, IBV_QPS_ERR);
    ep_close(&responder);
    ep_close(&requester);
}

/* ------------------------------------------------------------ RDMA read */

/* Read @p length bytes at @p remote_addr (@p rkey) into ep->buf + local_off. */
static int post_read(struct ep *ep, uint64_t wr_id, size_t local_off, uint32_t length,
                     uint64_t remote_addr, uint32_t rkey)
{
    struct ibv_sge sge = {
        .addr = (uint64_t)(uintptr_t)(ep->buf + local_off), .length = length, .lkey = ep->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = wr_id,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_RDMA_READ,
                             .send_flags = IBV_SEND_SIGNALED};
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    struct ibv_send_wr *bad = NULL;
    return ibv_post_send(ep->qp, &wr, &bad);
}

/* A queue pair connected to itself (a GPUDirect flush's): a read posted
 * behind an unsignaled write sees the write, and completes as a read. */
Test(fakeverbs, loopback_read_behind_a_write_returns_the_written_bytes)
{
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 0), 0);
    cr_assert_eq(connect_qp(&ep, &ep.info, RNR_FOREVER), 0);
    pattern_fill(ep.buf, 8192, 3);
    memset(ep.buf + MIB, 0xee, 2 * 8192);
    cr_assert_eq(
        post_write(&ep, IBV_WR_RDMA_WRITE, 1, 0, 8192, ep.info.addr + MIB, ep.info.rkey, 0, 0), 0);
    cr_assert_eq(post_read(&ep, 2, MIB + 8192, 8192, ep.info.addr + MIB, ep.info.rkey), 0);
    struct ibv_wc wc;
    cr_assert_eq(wait_wc(ep.cq, &wc), 1, "no completion for the read");
    cr_assert_eq(wc.wr_id, 2);
    cr_assert_eq(wc.status, IBV_WC_SUCCESS, "%s", ibv_wc_status_str(wc.status));
    cr_assert_eq(wc.opcode, IBV_WC_RDMA_READ);
    cr_assert_eq(wc.byte_len, 8192);
    cr_assert(pattern_ok(ep.buf + MIB + 8192, 8192, 3),
              "the read did not return the written bytes");
    ep_close(&ep);
}

Test(fakeverbs, read_through_an_rkey_without_remote_read_is_rem_access_err)
{
    struct ep ep;
    cr_assert_eq(ep_open(&ep, 64, 0), 0);
    cr_assert_eq(connect_qp(&ep, &ep.info, RNR_FOREVER), 0);
    memset(ep.buf + MIB, 0x5a, 64);
    cr_assert_eq(post_read(&ep, 1, MIB, 64, ep.info.addr, ep.info.rkey_readonly), 0);
    expect_status(&ep, 1, IBV_WC_REM_ACCESS_ERR);
    cr_assert_eq(ep.qp->state, IBV_QPS_ERR);
    for (int i = 0; i < 64; i++)
        cr_assert_eq(ep.buf[MIB + i], 0x5a, "a refused read wrote byte %d", i);
    ep_close(&ep);
}

/* The responder is another process: its bytes land in this one's buffer. */
static void read_source_child(int fd)
{
    struct ep ep;
    struct ep_info peer;
    child_connect(&ep, fd, &peer);
    pattern_fill(ep.buf, 65536, 11);
    child_signal(fd);
    child_wait_signal(fd);
    ep_close(&ep);
}

Test(fakeverbs, read_from_another_process_lands_in_the_local_buffer)
{
    int fd;
    pid_t pid = fork_peer(read_source_child, &fd);
    struct ep ep;
    struct ep_info peer;
    parent_connect(&ep, fd, &peer, 64);
    parent_wait_signal(fd);
    cr_assert_eq(post_read(&ep, 1, 0, 65536, peer.addr, peer.rkey), 0);
    expect_status(&ep, 1, IBV_WC_SUCCESS);
    cr_assert(pattern_ok(ep.buf, 65536, 11), "the read did not return the peer's bytes");
    parent_signal(fd);
    wait_child(pid);
    ep_close(&ep);
}
