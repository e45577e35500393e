/*
 * GPU ranks on CUDA streams (src/exec/cuda.h): device buffers enqueue a
 * kernel on the caller's stream and return, the stream observes completion;
 * the legacy stream; groups of several communicators from one thread; host
 * buffers on a stream run in stream order; one rank per GPU unless
 * CFX_MULTI_RANK_GPU_ENABLE=1; failures inside kernels (a mismatch, a dead
 * or stopped peer, an abort, a timeout) surface as the communicator's error
 * with a sentence naming the rank; graph capture and replay.
 *
 * On this machine the driver is tests/fakecuda (CFX_TEST_FAKECUDA), which
 * runs Conflux's kernel on CPU threads; CFX_TEST_GPU=1 runs the same tests
 * on the machine's GPU (scripts/gpu_check.sh). Without either: SKIP.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "src/core/comm.h"
#include "src/exec/cuda.h"
#include "src/util/param.h"
#include "src/util/verbs.h"
#include "tests/harness_gpu.h"

#if CFX_HAVE_CUDA

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The driver for this test, or a skip saying why there is none; several
 * ranks share one GPU. */
static const char *use_gpu(void)
{
    const char *why = NULL;
    const char *driver = cfx_test_use_cuda(&why);
    if (driver == NULL)
        cr_skip_test("%s", why);
    cfx_test_setenv("CFX_MULTI_RANK_GPU_ENABLE", "1");
    return driver;
}

/* A rank's GPU, buffers of n floats, and a communicator of GPU ranks. */
struct gpu_rank {
    struct cfx_test_gpu gpu;
    float *dsend, *drecv;
    float *host;
    size_t n;
    cfxComm_t comm;
};

/* Opens device @p device for the rank (0 in most tests: one GPU for all). */
/* The GPU and the buffers, no communicator yet. */
static int gpu_rank_prepare(struct cfx_test_rank *ctx, struct gpu_rank *g, size_t n, int device)
{
    memset(g, 0, sizeof(*g));
    if (!cfx_test_gpu_open(ctx, device, &g->gpu))
        return 0;
    g->n = n;
    g->host = malloc((n > 0 ? n : 1) * sizeof(float));
    g->dsend = cfx_test_gpu_alloc(ctx, &g->gpu, n * sizeof(float));
    g->drecv = cfx_test_gpu_alloc(ctx, &g->gpu, n * sizeof(float));
    return g->host != NULL && g->dsend != NULL && g->drecv != NULL;
}

static int gpu_rank_open_on(struct cfx_test_rank *ctx, struct gpu_rank *g, size_t n, int device)
{
    if (!gpu_rank_prepare(ctx, g, n, device))
        return 0;
    cfxResult_t res = cfxCommInitRank(&g->comm, ctx->nranks, ctx->id, ctx->rank);
    if (res != cfxSuccess) {
        cfx_test_fail(ctx, __FILE__, __LINE__, "init: %s", cfxGetLastError(NULL));
        return 0;
    }
    return 1;
}

static int gpu_rank_open(struct cfx_test_rank *ctx, struct gpu_rank *g, size_t n)
{
    return gpu_rank_open_on(ctx, g, n, 0);
}

static void gpu_rank_close(struct gpu_rank *g)
{
    if (g->comm != NULL)
        cfxCommDestroy(g->comm);
    cfx_test_gpu_free(&g->gpu, g->dsend);
    cfx_test_gpu_free(&g->gpu, g->drecv);
    cfx_test_gpu_close(&g->gpu);
    free(g->host);
}

static float input_of(int rank, size_t i)
{
    return (float)(rank + 1) + (float)(i % 13);
}

static float sum_of(int nranks, size_t i)
{
    return (float)(nranks * (nranks + 1) / 2) + (float)nranks * (float)(i % 13);
}

/* Fill the device send buffer with this rank's inputs. */
static int put_inputs(struct cfx_test_rank *ctx, struct gpu_rank *g)
{
    for (size_t i = 0; i < g->n; i++)
        g->host[i] = input_of(ctx->rank, i);
    return cfx_test_gpu_put(ctx, &g->gpu, g->dsend, g->host, g->n * sizeof(float));
}

/* The device recv buffer holds the sum of every rank's inputs. */
static int check_sums(struct cfx_test_rank *ctx, struct gpu_rank *g, const float *device)
{
    if (!cfx_test_gpu_get(ctx, &g->gpu, g->host, device, g->n * sizeof(float)))
        return 0;
    for (size_t i = 0; i < g->n; i++)
        if (g->host[i] != sum_of(ctx->nranks, i)) {
            cfx_test_fail(ctx, __FILE__, __LINE__, "element %zu is %g, not %g", i,
                          (double)g->host[i], (double)sum_of(ctx->nranks, i));
            return 0;
        }
    return 1;
}

/* ------------------------------------------------ enqueued on the stream */

/* A host function that holds the stream until the flag is set. */
static void CUDA_CB hold_stream(void *arg)
{
    volatile int *flag = arg;
    while (!*flag)
        usleep(1000);
}

struct enqueue_case {
    int nranks;
    enum cfx_test_mode mode;
    size_t count;
    int sockets; /* CFX_SHM_DISABLE=1: the socket transport, its proxy polling the FIFOs. */
    /* Each rank its own host, verbs (fake-verbs) between them: 1 staged
     * through the pinned FIFO; else the slots in device memory (GPUDirect
     * RDMA, CFX_NET_GDR_LEVEL=SYS) as enum gdr_case says. */
    int verbs;
    /* Each rank its own host, the net-plugin transport between them over
     * the test plugin (CFX_TEST_NET_PLUGIN): 1, the proxy moves the
     * kernels' slots from and into pinned host memory through the plugin;
     * 2, the slots are in device memory and the plugin moves them there
     * (GPUDirect RDMA: CFXTEST_PTR_CUDA=1, CFX_NET_GDR_LEVEL=SYS); 3, the
     * same on a device that cannot flush from the host
     * (FAKECUDA_NO_RDMA_FLUSH=1): receivers flush with the plugin's iflush,
     * and the plugin hides each payload until its flush completes
     * (CFXTEST_LAZY_CUDA=1); 4, as 2 with a plugin that takes dma-bufs
     * (CFXTEST_DMABUF=1): the slots go to it through regMrDmaBuf. 5 and 6,
     * Conflux's verbs net (CFX_NET_PLUGIN=builtin:ib) over fake-verbs with
     * the slots in device memory: 5 registered by address
     * (CFX_IB_PEERMEM=1, CFX_DMABUF_ENABLE=0) on a device that cannot
     * flush from the host, so receivers flush with the net's iflush (an
     * RDMA read on its loopback queue pair); 6 as dma-bufs, flushed by the
     * driver; 7, the default settings (the net takes dma-bufs, no
     * nvidia-peermem) on a driver that cannot export dma-bufs
     * (FAKECUDA_NO_DMABUF=1): the slots stay in pinned host memory, each
     * connection end saying why. */
    int net_plugin;
};

/* How the GPUDirect RDMA cases register device memory and flush. */
enum gdr_case {
    GDR_DMABUF = 2,        /* dma-buf, flushed by cuFlushGPUDirectRDMAWrites. */
    GDR_PEERMEM = 3,       /* ibv_reg_mr of device memory (CFX_IB_PEERMEM=1), cuFlush... */
    GDR_DMABUF_READ = 4,   /* dma-buf, flushed by a loopback RDMA read (CFX_IB_GDR_FLUSH=read). */
    GDR_PEERMEM_NOCUF = 5, /* peermem on a device that cannot flush from the host: the read. */
    GDR_NEITHER = 6,       /* CFX_DMABUF_ENABLE=0 and no peermem module: staged, INFO says why. */
};

/* The settings of a verbs case (NULL: unset). */
static void gdr_env(int verbs)
{
    cfx_test_setenv("CFX_NET_GDR_LEVEL", verbs >= GDR_DMABUF ? "SYS" : NULL);
    cfx_test_setenv(
        "CFX_DMABUF_ENABLE",
        verbs == GDR_PEERMEM || verbs == GDR_PEERMEM_NOCUF || verbs == GDR_NEITHER ? "0" : NULL);
    cfx_test_setenv("CFX_IB_PEERMEM",
                    verbs == GDR_PEERMEM || verbs == GDR_PEERMEM_NOCUF ? "1" : NULL);
    cfx_test_setenv("CFX_IB_GDR_FLUSH", verbs == GDR_DMABUF_READ ? "read" : NULL);
    cfx_test_setenv("FAKECUDA_NO_RDMA_FLUSH", verbs == GDR_PEERMEM_NOCUF ? "1" : NULL);
}

/* Every process its own host: the verbs transport carries every connection. */
static void own_host(struct cfx_test_rank *ctx)
{
    char host[32];
    snprintf(host, sizeof(host), "cuda-ib-host-%d", ctx->rank);
    cfx_test_setenv("CFX_HOSTID", host);
    cfx_verbs_api_reset();
}

/* The call returns while the stream is held (it only enqueued); once the
 * stream runs, the result is there. */
static void allreduce_returns_before_the_stream_runs(struct cfx_test_rank *ctx)
{
    const struct enqueue_case *ec = ctx->arg;
    struct gpu_rank g;
    if (!gpu_rank_open(ctx, &g, ec->count) || !put_inputs(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    static volatile int released[8];
    released[ctx->rank] = 0;
    RANK_ASSERT(ctx,
                g.gpu.cu->launch_host_func(g.gpu.stream, hold_stream,
                                           (void *)&released[ctx->rank]) == CUDA_SUCCESS,
                "cuLaunchHostFunc");
    double start = now_s();
    cfx_test_step(ctx, "allreduce of %zu floats on a held stream", ec->count);
    cfxResult_t res =
        cfxAllReduce(g.dsend, g.drecv, ec->count, cfxFloat32, cfxSum, g.comm, g.gpu.stream);
    double took = now_s() - start;
    int busy = g.gpu.cu->stream_query(g.gpu.stream) == CUDA_ERROR_NOT_READY;
    released[ctx->rank] = 1;
    RANK_ASSERT(ctx, res == cfxSuccess, "allreduce: %s", cfxGetLastError(g.comm));
    RANK_ASSERT(ctx, took < 2.0, "the call took %.2f s: it waited for the stream", took);
    RANK_ASSERT(ctx, busy, "the stream was idle right after the call");
    cfx_test_step(ctx, "synchronize and check");
    if (cfx_test_gpu_sync(ctx, &g.gpu))
        check_sums(ctx, &g, g.drecv);
    /* Host buffers on the same GPU rank, over the same connections (the
     * host executor; slots in device memory through the connector's stage). */
    cfx_test_step(ctx, "host allreduce of %zu floats", ec->count);
    for (size_t i = 0; i < ec->count && !ctx->slot_failed; i++)
        g.host[i] = input_of(ctx->rank, i);
    RANK_CFX(ctx, cfxAllReduce(g.host, g.host, ec->count, cfxFloat32, cfxSum, g.comm, NULL));
    for (size_t i = 0; i < ec->count; i++)
        RANK_ASSERT(ctx, g.host[i] == sum_of(ctx->nranks, i),
                    "host buffers: element %zu is %g, not %g", i, (double)g.host[i],
                    (double)sum_of(ctx->nranks, i));
    gpu_rank_close(&g);
}

ParameterizedTestParameters(cuda, allreduce_is_enqueued_and_the_stream_completes_it)
{
    static struct enqueue_case cases[] = {
        {1, CFX_TEST_THREADS, 1000, 0, 0, 0},
        {2, CFX_TEST_THREADS, 7, 0, 0, 0},
        {2, CFX_TEST_THREADS, 1 << 20, 0, 0, 0},
        {3, CFX_TEST_THREADS, 4099, 0, 0, 0},
        {4, CFX_TEST_PROCS, 1 << 18, 0, 0, 0},
        {2, CFX_TEST_PROCS, 1, 0, 0, 0},
        {3, CFX_TEST_THREADS, 70001, 1, 0, 0},
        {2, CFX_TEST_PROCS, 1 << 20, 1, 0, 0},
        {2, CFX_TEST_PROCS, 1 << 20, 0, 1, 0},
        {3, CFX_TEST_PROCS, 70001, 0, 1, 0},
        {2, CFX_TEST_PROCS, 1 << 20, 0, 2, 0},
        {3, CFX_TEST_PROCS, 70001, 0, 2, 0},
        {2, CFX_TEST_PROCS, 1 << 20, 0, GDR_PEERMEM, 0},
        {3, CFX_TEST_PROCS, 70001, 0, GDR_DMABUF_READ, 0},
        {2, CFX_TEST_PROCS, 1 << 20, 0, GDR_PEERMEM_NOCUF, 0},
        {2, CFX_TEST_PROCS, 4099, 0, GDR_NEITHER, 0},
        {2, CFX_TEST_PROCS, 1 << 20, 0, 0, 1},
        {3, CFX_TEST_PROCS, 70001, 0, 0, 1},
        {2, CFX_TEST_PROCS, 1 << 20, 0, 0, 2},
        {3, CFX_TEST_PROCS, 70001, 0, 0, 2},
        {2, CFX_TEST_PROCS, 1 << 20, 0, 0, 3},
        {3, CFX_TEST_PROCS, 70001, 0, 0, 3},
        {2, CFX_TEST_PROCS, 1 << 20, 0, 0, 4},
        {2, CFX_TEST_PROCS, 1 << 20, 0, 0, 5},
        {3, CFX_TEST_PROCS, 70001, 0, 0, 5},
        {2, CFX_TEST_PROCS, 1 << 20, 0, 0, 6},
        {2, CFX_TEST_PROCS, 1 << 20, 0, 0, 7},
    };
    return cr_make_param_array(struct enqueue_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct enqueue_case *ec, cuda, allreduce_is_enqueued_and_the_stream_completes_it,
                  .timeout = 300)
{
    cr_log_info("%d ranks as %s, %zu floats, over %s, on %s", ec->nranks,
                ec->mode == CFX_TEST_PROCS ? "processes" : "threads", ec->count,
                ec->verbs == GDR_DMABUF          ? "verbs (fake-verbs), GPUDirect RDMA (dma-buf)"
                : ec->verbs == GDR_PEERMEM       ? "verbs (fake-verbs), GPUDirect RDMA (peermem)"
                : ec->verbs == GDR_DMABUF_READ   ? "verbs (fake-verbs), dma-buf, read flush"
                : ec->verbs == GDR_PEERMEM_NOCUF ? "verbs (fake-verbs), peermem, no cuFlush"
                : ec->verbs == GDR_NEITHER       ? "verbs (fake-verbs), neither dma-buf nor peermem"
                : ec->verbs == 1                 ? "verbs (fake-verbs), staged"
                : ec->net_plugin == 7
                    ? "the verbs net (fake-verbs), dma-bufs the driver cannot export"
                : ec->net_plugin == 6 ? "the verbs net (fake-verbs), GPUDirect RDMA, dma-buf"
                : ec->net_plugin == 5 ? "the verbs net (fake-verbs), peermem, flushed by its iflush"
                : ec->net_plugin == 4 ? "the test net plugin, GPUDirect RDMA, dma-buf"
                : ec->net_plugin == 3 ? "the test net plugin, GPUDirect RDMA flushed by its iflush"
                : ec->net_plugin == 2 ? "the test net plugin, GPUDirect RDMA (one host per rank)"
                : ec->net_plugin      ? "the test net plugin (one host per rank)"
                : ec->sockets         ? "sockets"
                                      : "shm",
                use_gpu());
    if (ec->verbs && cfx_test_use_fakeverbs() == NULL)
        cr_skip_test("no fake-verbs library (CFX_TEST_FAKEVERBS unset or unreadable)");
    if (ec->verbs >= GDR_DMABUF && strcmp(use_gpu(), "GPU") == 0)
        cr_skip_test("fake-verbs moves bytes with the CPU, which cannot reach a GPU's memory");
    if (ec->verbs == GDR_NEITHER && cfx_verbs_peermem_loaded())
        cr_skip_test("this host has nvidia-peermem loaded");
    int verbs_net = ec->net_plugin >= 5;
    const char *plugin = verbs_net ? "builtin:ib" : getenv("CFX_TEST_NET_PLUGIN");
    if (ec->net_plugin && !verbs_net && (plugin == NULL || access(plugin, R_OK) != 0))
        cr_skip_test("no test net plugin (CFX_TEST_NET_PLUGIN unset: run through ctest)");
    if (verbs_net && cfx_test_use_fakeverbs() == NULL)
        cr_skip_test("no fake-verbs library (CFX_TEST_FAKEVERBS unset or unreadable)");
    if (ec->net_plugin >= 2 && strcmp(use_gpu(), "GPU") == 0)
        cr_skip_test("the test plugin moves bytes with the CPU, which cannot reach a GPU's memory");
    cfx_test_setenv("CFXTEST_PTR_CUDA", ec->net_plugin >= 2 && !verbs_net ? "1" : NULL);
    cfx_test_setenv("CFX_SHM_DISABLE", ec->sockets ? "1" : NULL);
    cfx_test_setenv("CFX_NET_PLUGIN", ec->net_plugin ? plugin : NULL);
    gdr_env(ec->verbs);
    if (ec->net_plugin) { /* After gdr_env, which sets these for verbs. */
        cfx_test_setenv("CFX_NET_GDR_LEVEL", ec->net_plugin >= 2 ? "SYS" : NULL);
        cfx_test_setenv("FAKECUDA_NO_RDMA_FLUSH",
                        ec->net_plugin == 3 || ec->net_plugin == 5 ? "1" : NULL);
        /* Payloads hidden until their flush completes: read earlier, wrong. */
        cfx_test_setenv("CFXTEST_LAZY_CUDA", ec->net_plugin == 3 ? "1" : NULL);
        cfx_test_setenv("CFXTEST_DMABUF", ec->net_plugin == 4 ? "1" : NULL);
        cfx_test_setenv("CFX_IB_PEERMEM", ec->net_plugin == 5 ? "1" : NULL);
        cfx_test_setenv("CFX_DMABUF_ENABLE", ec->net_plugin == 5 ? "0" : NULL);
        cfx_test_setenv("FAKECUDA_NO_DMABUF", ec->net_plugin == 7 ? "1" : NULL);
    }
    struct cfx_test_options opts = {.nranks = ec->nranks,
                                    .mode = ec->mode,
                                    .deadline_s = 240,
                                    .arg = ec,
                                    .before_rank = ec->verbs || ec->net_plugin ? own_host : NULL};
    char logs[128];
    if (ec->verbs || ec->net_plugin)
        cfx_test_log_to(logs, sizeof(logs), ec->verbs ? "cuda-ib" : "cuda-net");
    CFX_TEST_RUN(&opts, allreduce_returns_before_the_stream_runs);
    if (ec->net_plugin) {
        int pinned = cfx_test_count_in_logs(logs, "), a GPU rank's slots in pinned host memory");
        int device = cfx_test_count_in_logs(logs, "), a GPU rank's slots in device memory");
        int flushed = cfx_test_count_in_logs(logs, "flushed the plugin's writes into device");
        int by_iflush = cfx_test_count_in_logs(logs, "with the plugin's iflush");
        int dmabuf =
            cfx_test_count_in_logs(logs, "slots in device memory (GPUDirect RDMA, dma-buf)");
        int no_dmabuf = cfx_test_count_in_logs(
            logs, "registered with regMr, not as a dma-buf: the plugin's device takes no dma-buf");
        int other = cfx_test_count_in_logs(logs, "socket transport: rank 0 -> rank 1 connected");
        int dmabuf_only = cfx_test_count_in_logs(logs, "takes device memory as dma-bufs only, and");
        cfx_test_remove_logs(logs);
        cfx_test_setenv("CFX_NET_PLUGIN", NULL);
        cfx_test_setenv("CFXTEST_PTR_CUDA", NULL);
        cfx_test_setenv("CFX_NET_GDR_LEVEL", NULL);
        cfx_test_setenv("FAKECUDA_NO_RDMA_FLUSH", NULL);
        cfx_test_setenv("CFXTEST_LAZY_CUDA", NULL);
        cfx_test_setenv("CFXTEST_DMABUF", NULL);
        cfx_test_setenv("CFX_IB_PEERMEM", NULL);
        cfx_test_setenv("CFX_DMABUF_ENABLE", NULL);
        cfx_test_setenv("FAKECUDA_NO_DMABUF", NULL);
        /* Each rank's ring send and receive at least. */
        int want = 2 * ec->nranks;
        if (ec->net_plugin == 7)
            cr_assert_geq(dmabuf_only, want, "%d connection ends said why they stage", dmabuf_only);
        if (ec->net_plugin >= 2 && ec->net_plugin != 7) {
            cr_assert(device >= want && pinned == 0,
                      "%d connection ends had their slots in device memory, %d in pinned memory",
                      device, pinned);
            cr_assert_geq(flushed, ec->nranks, "%d receivers flushed the plugin's writes", flushed);
            if (ec->net_plugin == 3 || ec->net_plugin == 5)
                cr_assert_eq(by_iflush, flushed,
                             "%d of %d receivers flushed with the plugin's iflush", by_iflush,
                             flushed);
            else
                cr_assert_eq(by_iflush, 0,
                             "%d receivers used the plugin's iflush beside the driver", by_iflush);
            if (ec->net_plugin == 4 || ec->net_plugin == 6)
                cr_assert(dmabuf >= want && no_dmabuf == 0,
                          "%d connection ends registered their slots as dma-bufs, %d said why not",
                          dmabuf, no_dmabuf);
            else
                cr_assert(dmabuf == 0 && no_dmabuf >= want,
                          "%d connection ends registered their slots as dma-bufs with a plugin "
                          "that takes none; %d said why not",
                          dmabuf, no_dmabuf);
        } else {
            cr_assert(pinned >= want && device == 0,
                      "%d connection ends went through the plugin from pinned memory, %d from "
                      "device memory",
                      pinned, device);
        }
        cr_assert_eq(other, 0, "a socket connection beside the plugin");
    }
    if (ec->verbs) {
        int ib = cfx_test_count_in_logs(logs, "ib: rank 0 -> rank 1 connected");
        int socket = cfx_test_count_in_logs(logs, "socket transport: rank 0 -> rank 1 connected");
        int in_device = cfx_test_count_in_logs(logs, "slots in device 0's memory (GPUDirect RDMA");
        int staged = cfx_test_count_in_logs(logs, "slots staged through pinned host memory");
        int flushed = cfx_test_count_in_logs(logs, "flushed the NIC's writes into device memory");
        int dmabuf = cfx_test_count_in_logs(logs, "(GPUDirect RDMA, dma-buf");
        int peermem = cfx_test_count_in_logs(logs, "(GPUDirect RDMA, nvidia-peermem");
        int by_read = cfx_test_count_in_logs(logs, "flushed by an RDMA read on a loopback");
        int reads = cfx_test_count_in_logs(logs, "time(s) (RDMA reads)");
        int cuda_flushes = cfx_test_count_in_logs(logs, "time(s) (cuFlushGPUDirectRDMAWrites)");
        int no_flush_why = cfx_test_count_in_logs(logs, "cannot flush GPUDirect RDMA writes");
        int neither = cfx_test_count_in_logs(
            logs, "no dma-buf: CFX_DMABUF_ENABLE=0; no nvidia-peermem: the kernel module");
        cfx_test_remove_logs(logs);
        cfx_test_setenv("CFX_NET", NULL);
        cfx_test_setenv("CFX_IB_VERBS_LIB", NULL);
        gdr_env(0);
        cr_assert_geq(ib, 1, "no verbs connection from rank 0 to rank 1 in the log");
        cr_assert_eq(socket, 0, "a socket connection under CFX_NET=IB");
        /* Each rank's ring send and receive at least. */
        int want = 2 * ec->nranks;
        if (ec->verbs >= GDR_DMABUF && ec->verbs != GDR_NEITHER) {
            int read_flush = ec->verbs == GDR_DMABUF_READ || ec->verbs == GDR_PEERMEM_NOCUF;
            cr_assert_geq(in_device, want, "%d connection ends had their slots in device memory",
                          in_device);
            cr_assert_eq(staged, 0, "a connection staged through host memory");
            cr_assert_geq(flushed, ec->nranks, "%d receivers flushed the NIC's writes", flushed);
            if (ec->verbs == GDR_PEERMEM || ec->verbs == GDR_PEERMEM_NOCUF)
                cr_assert(peermem >= want && dmabuf == 0,
                          "%d ends registered through nvidia-peermem, %d as dma-bufs", peermem,
                          dmabuf);
            else
                cr_assert(dmabuf >= want && peermem == 0,
                          "%d ends registered as dma-bufs, %d through nvidia-peermem", dmabuf,
                          peermem);
            if (read_flush)
                cr_assert(by_read >= ec->nranks && reads >= ec->nranks && cuda_flushes == 0,
                          "receivers flushing by RDMA read: %d said so, %d counted reads, %d "
                          "counted cuFlushGPUDirectRDMAWrites",
                          by_read, reads, cuda_flushes);
            else
                cr_assert(by_read == 0 && reads == 0 && cuda_flushes >= ec->nranks,
                          "receivers flushing by cuFlushGPUDirectRDMAWrites: %d, by read: %d",
                          cuda_flushes, reads);
            if (ec->verbs == GDR_PEERMEM_NOCUF)
                cr_assert_geq(no_flush_why, ec->nranks,
                              "the read flush was chosen %d time(s) saying why", no_flush_why);
        } else {
            if (ec->verbs == GDR_NEITHER)
                cr_assert_geq(neither, want, "%d staged ends said why not dma-buf nor peermem",
                              neither);
            cr_assert_geq(staged, want, "%d connection ends staged through host memory", staged);
            cr_assert_eq(in_device, 0, "slots in device memory without CFX_NET_GDR_LEVEL=SYS");
        }
    }
}

/* ------------------------------------------------ NICs near a GPU */

/* A host whose GPU 0 shares a PCI switch with two ports, lo1 and lo2 (as
 * near as each other), and has a third, lo, on the CPU's root (farther):
 * the test plugin's devices 1, 2 and 0 (CFXTEST_NDEV=3). */
static char near_topo[64];

static void own_host_near_topo(struct cfx_test_rank *ctx)
{
    own_host(ctx);
    cfx_test_setenv("CFX_TOPO_FILE", near_topo);
}

#define NEAR_PCI(busid, cls, body)                                                                 \
    "<pci busid=\"" busid "\" class=\"" cls "\" vendor=\"0x15b3\" device=\"0x101d\" "              \
    "link_speed=\"16.0 GT/s PCIe\" link_width=\"16\">" body "</pci>\n"
#define NEAR_NET(name, dev)                                                                        \
    "<nic><net name=\"" name "\" dev=\"" dev "\" speed=\"100000\" port=\"1\" guid=\"0x" dev        \
    "\" maxconn=\"131072\" gdr=\"1\"/></nic>"

static void big_allreduce(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    if (gpu_rank_open(ctx, &g, (size_t)1 << 20) && put_inputs(ctx, &g)) {
        RANK_CFX(ctx,
                 cfxAllReduce(g.dsend, g.drecv, g.n, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
        RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
        check_sums(ctx, &g, g.drecv);
    }
    gpu_rank_close(&g);
}

/* A GPU rank spreads its channels over the plugin devices named as its
 * nearest ports (channel c on the (c mod 2)-th), and none goes over the
 * farther one: 2 processes, each its own host, CFX_MIN_NCHANNELS=2, one
 * 4 MiB allreduce over both rings. */
Test(cuda, channels_spread_over_the_plugin_devices_nearest_the_gpu, .timeout = 150)
{
    cr_log_info("on %s", use_gpu());
    const char *plugin = getenv("CFX_TEST_NET_PLUGIN");
    if (plugin == NULL || access(plugin, R_OK) != 0)
        cr_skip_test("no test net plugin (CFX_TEST_NET_PLUGIN unset: run through ctest)");
    if (strcmp(use_gpu(), "GPU") == 0)
        cr_skip_test("the topology file names a GPU by fake-cuda's device 0, not this machine's");
    snprintf(near_topo, sizeof(near_topo), "/tmp/cfx-near-topo-XXXXXX");
    int fd = mkstemp(near_topo);
    cr_assert_geq(fd, 0, "mkstemp");
    FILE *f = fdopen(fd, "w");
    cr_assert_not_null(f);
    fputs("<system version=\"1\">\n<cpu numaid=\"0\" affinity=\"ffffffff\" arch=\"x86_64\" "
          "vendor=\"GenuineIntel\" familyid=\"6\" modelid=\"143\">\n" NEAR_PCI(
              "0000:10:00.0", "0x060400",
              "\n" NEAR_PCI("0000:11:00.0", "0x030200",
                            "<gpu dev=\"0\" sm=\"90\" rank=\"0\" gdr=\"1\"/>")
                  NEAR_PCI("0000:12:00.0", "0x020000", NEAR_NET("lo1", "1"))
                      NEAR_PCI("0000:13:00.0", "0x020000", NEAR_NET("lo2", "2")))
              NEAR_PCI("0000:31:00.0", "0x020000", NEAR_NET("lo", "0")) "</cpu>\n</system>\n",
          f);
    fclose(f);
    cfx_test_setenv("CFX_NET_PLUGIN", plugin);
    cfx_test_setenv("CFXTEST_NDEV", "3");
    cfx_test_setenv("CFX_MIN_NCHANNELS", "2");
    cfx_test_setenv("CFX_ALGO", "Ring");
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "cuda-near");
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 120, .before_rank = own_host_near_topo};
    char report[8192];
    int ok = cfx_test_run(&opts, big_allreduce, report, sizeof(report));
    int said = cfx_test_count_in_logs(
        logs, "uses devices 1 (lo1), 2 (lo2), the topology's nearest ports (channel c on");
    int on_lo1 = cfx_test_count_in_logs(logs, "(plugin cfxtest, device 1: lo1, channel 0)");
    int on_lo2 = cfx_test_count_in_logs(logs, "(plugin cfxtest, device 2: lo2, channel 1)");
    int on_lo = cfx_test_count_in_logs(logs, "(plugin cfxtest, device 0: lo, channel");
    if (ok)
        cfx_test_remove_logs(logs);
    cfx_test_logs_off();
    cfx_test_setenv("CFX_NET_PLUGIN", NULL);
    cfx_test_setenv("CFXTEST_NDEV", NULL);
    cfx_test_setenv("CFX_MIN_NCHANNELS", NULL);
    cfx_test_setenv("CFX_ALGO", NULL);
    unlink(near_topo);
    cr_assert(ok, "%s(logs kept in %s.*)", report, logs);
    cr_assert_geq(said, 2, "%d ranks said they spread over lo1 and lo2", said);
    /* Each rank's ring send and receive on each channel. */
    cr_assert_geq(on_lo1, 4, "%d connection ends of channel 0 on lo1", on_lo1);
    cr_assert_geq(on_lo2, 4, "%d connection ends of channel 1 on lo2", on_lo2);
    cr_assert_eq(on_lo, 0, "%d connection ends on lo, the farther port", on_lo);
}

/* ------------------------------------------------ stream order */

/* Held streams: a host function waits for released[rank]. */
static volatile int released[8];

static int hold(struct cfx_test_rank *ctx, struct gpu_rank *g)
{
    released[ctx->rank] = 0;
    if (g->gpu.cu->launch_host_func(g->gpu.stream, hold_stream, (void *)&released[ctx->rank]) ==
        CUDA_SUCCESS)
        return 1;
    cfx_test_fail(ctx, __FILE__, __LINE__, "cuLaunchHostFunc");
    return 0;
}

/* A copy queued on the stream before the call (behind a held stream, so it
 * has not run when the call is made) is what the call reduces. */
static void call_sees_work_queued_before_it(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    size_t n = 5000;
    if (!gpu_rank_open(ctx, &g, n) || !hold(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    for (size_t i = 0; i < n; i++)
        g.host[i] = input_of(ctx->rank, i);
    RANK_ASSERT(ctx,
                g.gpu.cu->memcpy_htod_async((CUdeviceptr)(uintptr_t)g.dsend, g.host,
                                            n * sizeof(float), g.gpu.stream) == CUDA_SUCCESS,
                "cuMemcpyHtoDAsync");
    cfx_test_step(ctx, "allreduce behind the queued copy");
    cfxResult_t res = cfxAllReduce(g.dsend, g.drecv, n, cfxFloat32, cfxSum, g.comm, g.gpu.stream);
    released[ctx->rank] = 1;
    RANK_ASSERT(ctx, res == cfxSuccess, "allreduce: %s", cfxGetLastError(g.comm));
    /* The host buffer is pageable: its copy may be taken at the call, or
     * when the stream reaches it; either way the inputs are the ones above. */
    if (cfx_test_gpu_sync(ctx, &g.gpu))
        check_sums(ctx, &g, g.drecv);
    gpu_rank_close(&g);
}

Test(cuda, a_call_reduces_what_work_queued_before_it_on_the_stream_wrote, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_THREADS, .deadline_s = 90};
    CFX_TEST_RUN(&opts, call_sees_work_queued_before_it);
}

/* Rank 0 alternates two streams, the first held: its second call must wait
 * for its first (a communicator's calls run in call order, whatever their
 * streams), else it would meet the peers' first call and fail. */
static void two_streams_in_call_order(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    size_t n = 2048;
    if (!gpu_rank_open(ctx, &g, n) || !put_inputs(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    CUstream other = NULL;
    RANK_ASSERT(ctx, g.gpu.cu->stream_create(&other, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS,
                "stream");
    if (ctx->rank == 0 && !hold(ctx, &g))
        return;
    cfx_test_step(ctx, "allreduce on the first stream");
    RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, n, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    cfx_test_step(ctx, "allreduce on the second stream");
    RANK_CFX(ctx, cfxAllReduce(g.drecv, g.drecv, n, cfxFloat32, cfxSum, g.comm,
                               ctx->rank == 0 ? other : g.gpu.stream));
    usleep(200 * 1000); /* Time for a second call that did not wait to go wrong. */
    released[0] = 1;
    RANK_ASSERT(ctx, g.gpu.cu->stream_synchronize(other) == CUDA_SUCCESS, "sync");
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    cfxResult_t seen = cfxSuccess;
    RANK_CFX(ctx, cfxCommGetAsyncError(g.comm, &seen));
    RANK_ASSERT(ctx, seen == cfxSuccess, "async error: %s", cfxGetLastError(g.comm));
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, n * sizeof(float)), "get");
    for (size_t i = 0; i < n; i++)
        RANK_ASSERT(ctx, g.host[i] == sum_of(ctx->nranks, i) * (float)ctx->nranks,
                    "element %zu is %g", i, (double)g.host[i]);
    g.gpu.cu->stream_destroy(other);
    gpu_rank_close(&g);
}

Test(cuda, calls_of_one_communicator_on_two_streams_run_in_call_order, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 90};
    CFX_TEST_RUN(&opts, two_streams_in_call_order);
}

/* Host buffers of a GPU rank with a stream: the host executor runs them
 * when the stream reaches them, after what was queued before. */
struct host_on_stream {
    float *send;
    int rank;
    size_t n;
};

static void CUDA_CB write_inputs(void *arg)
{
    struct host_on_stream *h = arg;
    for (size_t i = 0; i < h->n; i++)
        h->send[i] = input_of(h->rank, i);
}

static void host_buffers_in_stream_order(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    size_t n = 70000;
    if (!gpu_rank_open(ctx, &g, 1) || !hold(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    float *send = calloc(n, sizeof(float)), *recv = calloc(n, sizeof(float));
    RANK_ASSERT(ctx, send && recv, "out of memory");
    struct host_on_stream h = {.send = send, .rank = ctx->rank, .n = n};
    RANK_ASSERT(ctx, g.gpu.cu->launch_host_func(g.gpu.stream, write_inputs, &h) == CUDA_SUCCESS,
                "cuLaunchHostFunc");
    cfx_test_step(ctx, "allreduce of host buffers on the held stream");
    double start = now_s();
    cfxResult_t res = cfxAllReduce(send, recv, n, cfxFloat32, cfxSum, g.comm, g.gpu.stream);
    double took = now_s() - start;
    released[ctx->rank] = 1;
    RANK_ASSERT(ctx, res == cfxSuccess, "allreduce: %s", cfxGetLastError(g.comm));
    RANK_ASSERT(ctx, took < 2.0, "the call took %.2f s: it did not wait for the stream", took);
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    for (size_t i = 0; i < n; i++)
        RANK_ASSERT(ctx, recv[i] == sum_of(ctx->nranks, i), "element %zu is %g, not %g", i,
                    (double)recv[i], (double)sum_of(ctx->nranks, i));
    /* The same buffers at once (NULL stream) right after: in order too. */
    cfx_test_step(ctx, "allreduce of host buffers, NULL stream");
    RANK_CFX(ctx, cfxAllReduce(send, recv, n, cfxFloat32, cfxSum, g.comm, NULL));
    for (size_t i = 0; i < n; i++)
        RANK_ASSERT(ctx, recv[i] == sum_of(ctx->nranks, i), "element %zu is %g", i,
                    (double)recv[i]);
    free(send);
    free(recv);
    gpu_rank_close(&g);
}

Test(cuda, host_buffers_on_a_stream_run_when_the_stream_reaches_them, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 90};
    CFX_TEST_RUN(&opts, host_buffers_in_stream_order);
}

/* The legacy (NULL) stream: one rank per process and GPU works; ranks that
 * share a GPU in one process are refused (their kernels would wait for each
 * other forever). */
static void legacy_stream_allreduce(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    size_t n = 3000;
    if (!gpu_rank_open(ctx, &g, n) || !put_inputs(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    cfx_test_step(ctx, "allreduce on the NULL stream");
    cfxResult_t res = cfxAllReduce(g.dsend, g.drecv, n, cfxFloat32, cfxSum, g.comm, NULL);
    if (ctx->mode == CFX_TEST_THREADS) {
        RANK_ASSERT(ctx, res == cfxInvalidUsage, "NULL stream on a shared GPU: %s",
                    cfxGetErrorString(res));
        RANK_ASSERT(ctx, strstr(cfxGetLastError(g.comm), "legacy (NULL) stream") != NULL, "%s",
                    cfxGetLastError(g.comm));
    } else {
        RANK_ASSERT(ctx, res == cfxSuccess, "allreduce: %s", cfxGetLastError(g.comm));
        RANK_ASSERT(ctx, g.gpu.cu->stream_synchronize(NULL) == CUDA_SUCCESS, "sync legacy");
        check_sums(ctx, &g, g.drecv);
    }
    gpu_rank_close(&g);
}

Test(cuda, the_legacy_stream_runs_one_rank_per_process_and_refuses_shared_gpus, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    struct cfx_test_options procs = {.nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 60};
    CFX_TEST_RUN(&procs, legacy_stream_allreduce);
    struct cfx_test_options threads = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 60};
    CFX_TEST_RUN(&threads, legacy_stream_allreduce);
}

/* ------------------------------------------------ several communicators, one thread */

#define GROUP_RANKS 4

#define LONG_ROUNDS 64 /* Allreduces per rank in the long group. */
#define LONG_MSGS   40 /* Sends to the next rank (and receives) per rank. */
#define LONG_COUNT  16 /* Floats per operation. */

/* A group of the GROUP_RANKS ranks' operations on one stream, more than
 * one launch carries (LONG_ROUNDS allreduces and LONG_MSGS sends and
 * receives around the ring per rank, 576 in all), called rank by rank:
 * every allreduce of rank 0 first, then rank 1's, ... A split of the
 * stream in call order would put rank 0's first allreduces in a launch
 * without their peers' and hang; split by the operations' keys, every
 * result is right. Then a group of more than a group may put on one stream
 * is refused before anything runs. */
static void long_group_on_one_stream(const struct cfx_cuda_api *cu, cfxComm_t *comms,
                                     const CUdeviceptr *send, CUstream stream)
{
    CUdeviceptr sums[GROUP_RANKS], got[GROUP_RANKS];
    size_t sums_n = (size_t)LONG_ROUNDS * LONG_COUNT, got_n = (size_t)LONG_MSGS * LONG_COUNT;
    for (int r = 0; r < GROUP_RANKS; r++) {
        cr_assert_eq(cu->mem_alloc(&sums[r], sums_n * sizeof(float)), CUDA_SUCCESS);
        cr_assert_eq(cu->mem_alloc(&got[r], got_n * sizeof(float)), CUDA_SUCCESS);
    }
    size_t bytes = LONG_COUNT * sizeof(float);
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    for (int r = 0; r < GROUP_RANKS; r++) {
        for (int k = 0; k < LONG_ROUNDS; k++)
            cr_assert_eq(cfxAllReduce((void *)(uintptr_t)(send[r] + k * bytes),
                                      (void *)(uintptr_t)(sums[r] + k * bytes), LONG_COUNT,
                                      cfxFloat32, cfxSum, comms[r], stream),
                         cfxSuccess, "%s", cfxGetLastError(comms[r]));
        for (int k = 0; k < LONG_MSGS; k++) {
            cr_assert_eq(cfxSend((void *)(uintptr_t)(send[r] + k * bytes), LONG_COUNT, cfxFloat32,
                                 (r + 1) % GROUP_RANKS, comms[r], stream),
                         cfxSuccess, "%s", cfxGetLastError(comms[r]));
            cr_assert_eq(cfxRecv((void *)(uintptr_t)(got[r] + k * bytes), LONG_COUNT, cfxFloat32,
                                 (r + GROUP_RANKS - 1) % GROUP_RANKS, comms[r], stream),
                         cfxSuccess, "%s", cfxGetLastError(comms[r]));
        }
    }
    cr_assert_eq(cfxGroupEnd(), cfxSuccess, "%s", cfxGetLastError(NULL));
    cr_assert_eq(cu->stream_synchronize(stream), CUDA_SUCCESS);
    float *host = malloc(sums_n * sizeof(float));
    for (int r = 0; r < GROUP_RANKS; r++) {
        cr_assert_eq(cu->memcpy_dtoh(host, sums[r], sums_n * sizeof(float)), CUDA_SUCCESS);
        for (size_t i = 0; i < sums_n; i++)
            cr_assert_eq(host[i], sum_of(GROUP_RANKS, i), "rank %d allreduce %zu element %zu: %g",
                         r, i / LONG_COUNT, i % LONG_COUNT, (double)host[i]);
        cr_assert_eq(cu->memcpy_dtoh(host, got[r], got_n * sizeof(float)), CUDA_SUCCESS);
        int from = (r + GROUP_RANKS - 1) % GROUP_RANKS;
        for (size_t i = 0; i < got_n; i++)
            cr_assert_eq(host[i], input_of(from, i), "rank %d message %zu element %zu: %g", r,
                         i / LONG_COUNT, i % LONG_COUNT, (double)host[i]);
    }
    free(host);
    /* More than a group may put on one stream: refused on every rank. */
    int too_many = CFX_EXEC_CUDA_MAX_GROUP_OPS / GROUP_RANKS + 1;
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    for (int k = 0; k < too_many; k++)
        for (int r = 0; r < GROUP_RANKS; r++)
            cr_assert_eq(cfxAllReduce((void *)(uintptr_t)send[r], (void *)(uintptr_t)sums[r],
                                      LONG_COUNT, cfxFloat32, cfxSum, comms[r], stream),
                         cfxSuccess, "%s", cfxGetLastError(comms[r]));
    cfxResult_t res = cfxGroupEnd();
    cr_assert_eq(res, cfxInvalidUsage, "%d allreduces on one stream gave %s",
                 too_many * GROUP_RANKS, cfxGetErrorString(res));
    const char *why = cfxGetLastError(comms[0]);
    cr_assert(strstr(why, "split the group") != NULL, "the refusal says: %s", why);
    for (int r = 0; r < GROUP_RANKS; r++) {
        cu->mem_free(sums[r]);
        cu->mem_free(got[r]);
    }
}

/* One thread drives GROUP_RANKS GPU ranks (cfxCommInitAll) in one group:
 * on one stream each, and all on one stream (one kernel for all; then a
 * group of theirs that one launch cannot carry, in several). */
static void one_thread_group(int one_stream)
{
    const struct cfx_cuda_api *cu = cfx_cuda_api(NULL);
    cr_assert_not_null(cu);
    int devs[GROUP_RANKS] = {0, 0, 0, 0};
    cfxComm_t comms[GROUP_RANKS];
    cr_assert_eq(cfxCommInitAll(comms, GROUP_RANKS, devs), cfxSuccess, "%s", cfxGetLastError(NULL));
    cr_assert_eq(cfx_cuda_select(0), cfxSuccess);
    CUstream streams[GROUP_RANKS];
    CUdeviceptr send[GROUP_RANKS], recv[GROUP_RANKS];
    size_t n = 10007;
    float *host = malloc(n * sizeof(float));
    for (int r = 0; r < GROUP_RANKS; r++) {
        cr_assert_eq(cu->stream_create(&streams[r], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        cr_assert_eq(cu->mem_alloc(&send[r], n * sizeof(float)), CUDA_SUCCESS);
        cr_assert_eq(cu->mem_alloc(&recv[r], n * sizeof(float)), CUDA_SUCCESS);
        for (size_t i = 0; i < n; i++)
            host[i] = input_of(r, i);
        cr_assert_eq(cu->memcpy_htod(send[r], host, n * sizeof(float)), CUDA_SUCCESS);
    }
    /* From pageable memory the copies land late, on the legacy stream. */
    cr_assert_eq(cu->stream_synchronize(NULL), CUDA_SUCCESS);
    for (int round = 0; round < 3; round++) {
        cr_assert_eq(cfxGroupStart(), cfxSuccess);
        for (int r = 0; r < GROUP_RANKS; r++)
            cr_assert_eq(cfxAllReduce((void *)(uintptr_t)send[r], (void *)(uintptr_t)recv[r], n,
                                      cfxFloat32, cfxSum, comms[r], streams[one_stream ? 0 : r]),
                         cfxSuccess, "%s", cfxGetLastError(comms[r]));
        cr_assert_eq(cfxGroupEnd(), cfxSuccess, "%s", cfxGetLastError(NULL));
    }
    if (one_stream)
        long_group_on_one_stream(cu, comms, send, streams[0]);
    for (int r = 0; r < GROUP_RANKS; r++) {
        cr_assert_eq(cu->stream_synchronize(streams[r]), CUDA_SUCCESS);
        cr_assert_eq(cu->memcpy_dtoh(host, recv[r], n * sizeof(float)), CUDA_SUCCESS);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(host[i], sum_of(GROUP_RANKS, i), "rank %d element %zu: %g", r, i,
                         (double)host[i]);
    }
    for (int r = 0; r < GROUP_RANKS; r++) {
        cr_assert_eq(cfxCommDestroy(comms[r]), cfxSuccess);
        cu->mem_free(send[r]);
        cu->mem_free(recv[r]);
        cu->stream_destroy(streams[r]);
    }
    free(host);
}

Test(cuda, one_thread_drives_four_gpu_ranks_in_a_group_on_their_own_streams, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    one_thread_group(0);
}

Test(cuda, one_thread_drives_four_gpu_ranks_in_a_group_on_one_stream, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    one_thread_group(1);
}

/* Several collectives of one communicator in one group share its ring:
 * their slots must not mix (one chain of blocks runs them in call order),
 * while independent ones (sends to other peers) still run side by side. */
static void group_of_calls_sharing_the_ring(struct cfx_test_rank *ctx)
{
    enum { CALLS = 3, ROUNDS = 10 };
    struct gpu_rank g;
    size_t n = 50000;
    if (!gpu_rank_open(ctx, &g, n * CALLS)) {
        gpu_rank_close(&g);
        return;
    }
    for (size_t i = 0; i < n * CALLS; i++)
        g.host[i] = input_of(ctx->rank, i);
    RANK_ASSERT(ctx, cfx_test_gpu_put(ctx, &g.gpu, g.dsend, g.host, n * CALLS * sizeof(float)),
                "put");
    for (int round = 0; round < ROUNDS; round++) {
        cfx_test_step(ctx, "round %d: a group of %d allreduces", round, CALLS);
        RANK_CFX(ctx, cfxGroupStart());
        for (int c = 0; c < CALLS; c++)
            RANK_CFX(ctx, cfxAllReduce(g.dsend + (size_t)c * n, g.drecv + (size_t)c * n, n,
                                       cfxFloat32, cfxSum, g.comm, g.gpu.stream));
        RANK_CFX(ctx, cfxGroupEnd());
        RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
        cfxResult_t seen = cfxSuccess;
        RANK_CFX(ctx, cfxCommGetAsyncError(g.comm, &seen));
        RANK_ASSERT(ctx, seen == cfxSuccess, "round %d: %s", round, cfxGetLastError(g.comm));
    }
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, n * CALLS * sizeof(float)),
                "get");
    for (size_t i = 0; i < n * CALLS; i++)
        RANK_ASSERT(ctx, g.host[i] == sum_of(ctx->nranks, i), "element %zu is %g, not %g", i,
                    (double)g.host[i], (double)sum_of(ctx->nranks, i));
    gpu_rank_close(&g);
}

Test(cuda, a_group_of_calls_sharing_connectors_runs_them_in_call_order, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_PROCS, .deadline_s = 90};
    CFX_TEST_RUN(&opts, group_of_calls_sharing_the_ring);
}

/* ------------------------------------------------ devices */

static void two_ranks_on_one_gpu_are_refused(struct cfx_test_rank *ctx)
{
    struct cfx_test_gpu gpu;
    if (!cfx_test_gpu_open(ctx, 0, &gpu))
        return;
    cfxComm_t comm = NULL;
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    const char *why = cfxGetLastError(NULL);
    RANK_ASSERT(ctx, res == cfxInvalidUsage, "init gave %s", cfxGetErrorString(res));
    RANK_ASSERT(ctx,
                strstr(why, "ranks 0 and 1 of this communicator are both on GPU") != NULL &&
                    strstr(why, "CFX_MULTI_RANK_GPU_ENABLE=1") != NULL,
                "%s", why);
    cfx_test_gpu_close(&gpu);
}

static void each_rank_reports_its_device(struct cfx_test_rank *ctx)
{
    struct cfx_test_gpu gpu;
    if (!cfx_test_gpu_open(ctx, ctx->rank, &gpu))
        return;
    cfxComm_t comm;
    RANK_CFX(ctx, cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank));
    int device = -2;
    RANK_CFX(ctx, cfxCommCuDevice(comm, &device));
    RANK_ASSERT(ctx, device == ctx->rank, "cfxCommCuDevice says %d on rank %d", device, ctx->rank);
    cfx_test_allreduce_check(ctx, comm, 1000); /* Host buffers on a GPU rank, at once. */
    RANK_CFX(ctx, cfxCommDestroy(comm));
    cfx_test_gpu_close(&gpu);
}

Test(cuda, two_ranks_on_one_gpu_are_refused_unless_multi_rank_gpu_is_enabled, .timeout = 60)
{
    cr_log_info("on %s", use_gpu());
    cfx_test_setenv("CFX_MULTI_RANK_GPU_ENABLE", NULL);
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 40};
    CFX_TEST_RUN(&opts, two_ranks_on_one_gpu_are_refused);
}

Test(cuda, each_rank_is_bound_to_the_device_current_at_init, .timeout = 60)
{
    const char *driver = use_gpu();
    if (strcmp(driver, "fake-cuda") != 0)
        cr_skip_test("needs 3 GPUs; the fake driver has them (FAKECUDA_DEVICES=3)");
    cfx_test_setenv("FAKECUDA_DEVICES", "3");
    cfx_test_setenv("CFX_MULTI_RANK_GPU_ENABLE", NULL);
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_THREADS, .deadline_s = 40};
    CFX_TEST_RUN(&opts, each_rank_reports_its_device);
}

/* ------------------------------------------------ failures inside kernels */

/* Poll cfxCommGetAsyncError until it reports something, at most @p limit_s. */
static cfxResult_t async_error_within(cfxComm_t comm, double limit_s)
{
    double start = now_s();
    cfxResult_t seen = cfxSuccess;
    while (now_s() - start < limit_s) {
        if (cfxCommGetAsyncError(comm, &seen) != cfxSuccess || seen != cfxSuccess)
            break;
        usleep(10000);
    }
    return seen;
}

/* Every receiver's flush by RDMA read fails (fake-verbs' FAKEVERBS_FAIL_READS):
 * the slots that arrived are never posted, so the GPU allreduce fails on
 * every rank rather than read bytes a flush did not cover, and the stream
 * still completes. */
static void failed_flush_fails_the_call(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    if (!gpu_rank_open(ctx, &g, 1 << 16) || !put_inputs(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    cfx_test_step(ctx, "allreduce whose flushes fail");
    cfxResult_t res = cfxAllReduce(g.dsend, g.drecv, g.n, cfxFloat32, cfxSum, g.comm, g.gpu.stream);
    cfxResult_t seen = res != cfxSuccess ? res : async_error_within(g.comm, 30);
    RANK_ASSERT(ctx, seen != cfxSuccess, "the allreduce succeeded though every flush failed");
    cfx_test_step(ctx, "the stream after the failure");
    RANK_ASSERT(ctx, g.gpu.cu->stream_synchronize(g.gpu.stream) == CUDA_SUCCESS,
                "the stream did not finish after the failure");
    gpu_rank_close(&g);
}

Test(cuda, a_failed_flush_read_fails_the_gpu_allreduce_with_a_sentence, .timeout = 150)
{
    cr_log_info("2 processes, each its own host, GPUDirect RDMA with the read flush, every read "
                "failing, on %s",
                use_gpu());
    if (cfx_test_use_fakeverbs() == NULL)
        cr_skip_test("no fake-verbs library (CFX_TEST_FAKEVERBS unset or unreadable)");
    if (strcmp(use_gpu(), "GPU") == 0)
        cr_skip_test("fake-verbs moves bytes with the CPU, which cannot reach a GPU's memory");
    gdr_env(GDR_DMABUF_READ);
    cfx_test_setenv("FAKEVERBS_FAIL_READS", "1");
    cfx_test_setenv("CFX_TIMEOUT", "20");
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "gdr-flush-fails");
    struct cfx_test_options opts = {
        .nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 120, .before_rank = own_host};
    CFX_TEST_RUN(&opts, failed_flush_fails_the_call);
    int named = cfx_test_count_in_logs(logs, "'s read that flushes rank ");
    cfx_test_remove_logs(logs);
    cfx_test_logs_off();
    gdr_env(0);
    cfx_test_setenv("FAKEVERBS_FAIL_READS", NULL);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
    cfx_test_setenv("CFX_NET", NULL);
    cfx_test_setenv("CFX_IB_VERBS_LIB", NULL);
    cr_assert_geq(named, 1, "no rank's log says that the read flushing the NIC's writes failed");
}

/* Rank 1 calls with another count: every rank's kernel stops, and the
 * failure surfaces on every rank as cfxInvalidUsage naming a mismatch. */
static void mismatched_counts_on_gpu(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    if (!gpu_rank_open(ctx, &g, 4096) || !put_inputs(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    size_t count = ctx->rank == 1 ? 2048 : 4096;
    cfx_test_step(ctx, "mismatched allreduce");
    RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, count, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    cfx_test_step(ctx, "waiting for the asynchronous error");
    cfxResult_t seen = async_error_within(g.comm, 20);
    RANK_ASSERT(ctx, seen == cfxInvalidUsage, "async error %s: %s", cfxGetErrorString(seen),
                cfxGetLastError(g.comm));
    RANK_ASSERT(ctx, g.gpu.cu->stream_synchronize(g.gpu.stream) == CUDA_SUCCESS,
                "the stream did not finish after the failure");
    cfxResult_t next =
        cfxAllReduce(g.dsend, g.drecv, count, cfxFloat32, cfxSum, g.comm, g.gpu.stream);
    RANK_ASSERT(ctx, next == cfxInvalidUsage, "the next call gave %s", cfxGetErrorString(next));
    RANK_ASSERT(ctx, strstr(cfxGetLastError(g.comm), "broken by an earlier error") != NULL, "%s",
                cfxGetLastError(g.comm));
    gpu_rank_close(&g);
}

Test(cuda, mismatched_calls_on_gpu_fail_every_rank_with_invalid_usage, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "gpu-mismatch");
    struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_THREADS, .deadline_s = 90};
    CFX_TEST_RUN(&opts, mismatched_counts_on_gpu);
    /* The flight recorder shows the GPU operation, failed, on each rank. */
    int failed_4096 =
        cfx_test_count_in_logs(logs, "allreduce #0 (float32 sum, count 4096): failed");
    int failed_2048 =
        cfx_test_count_in_logs(logs, "allreduce #0 (float32 sum, count 2048): failed");
    cfx_test_remove_logs(logs);
    cfx_test_logs_off();
    cr_assert(failed_4096 == 2 && failed_2048 == 1,
              "flight recorder lines of the failed GPU allreduce: %d of count 4096 (2 ranks), %d "
              "of 2048 (1 rank)",
              failed_4096, failed_2048);
}

/* Rank 0 waits in its kernel for rank 1, which never calls; another thread
 * aborts rank 0's communicator: the kernel ends (the stream completes)
 * within a second. */
struct abort_job {
    cfxComm_t comm;
    double at;
    cfxResult_t res;
};

static void *abort_soon(void *arg)
{
    struct abort_job *job = arg;
    usleep(300 * 1000);
    job->at = now_s();
    job->res = cfxCommAbort(job->comm);
    return NULL;
}

static void abort_ends_the_kernel(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    if (!gpu_rank_open(ctx, &g, 1 << 16) || !put_inputs(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    if (ctx->rank == 1) {
        sleep(3); /* Never calls: rank 0's kernel waits for it. */
        gpu_rank_close(&g);
        return;
    }
    RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, g.n, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    struct abort_job job = {.comm = g.comm};
    pthread_t thread;
    pthread_create(&thread, NULL, abort_soon, &job);
    cfx_test_step(ctx, "waiting for the stream after the abort");
    CUresult err = g.gpu.cu->stream_synchronize(g.gpu.stream);
    double done = now_s();
    pthread_join(thread, NULL);
    g.comm = NULL; /* Aborted: freed. */
    RANK_ASSERT(ctx, err == CUDA_SUCCESS, "stream: CUDA error %d", (int)err);
    RANK_ASSERT(ctx, job.res == cfxSuccess, "abort: %s", cfxGetErrorString(job.res));
    RANK_ASSERT(ctx, done - job.at < 1.0, "the kernel ended %.2f s after the abort", done - job.at);
    gpu_rank_close(&g);
}

Test(cuda, abort_from_another_thread_ends_a_waiting_kernel_within_a_second, .timeout = 60)
{
    cr_log_info("on %s", use_gpu());
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 40};
    CFX_TEST_RUN(&opts, abort_ends_the_kernel);
}

/* Rank 1 never calls: rank 0's kernel makes no progress, and after
 * CFX_TIMEOUT the watcher stops it; the error names rank 1. */
static void timeout_names_the_peer(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    if (!gpu_rank_open(ctx, &g, 1024) || !put_inputs(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    if (ctx->rank == 1) {
        sleep(6);
        gpu_rank_close(&g);
        return;
    }
    RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, g.n, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    double start = now_s();
    cfx_test_step(ctx, "waiting for the timeout");
    cfxResult_t seen = async_error_within(g.comm, 10);
    double took = now_s() - start;
    const char *why = cfxGetLastError(g.comm);
    RANK_ASSERT(ctx, seen == cfxTimeout, "async error %s: %s", cfxGetErrorString(seen), why);
    RANK_ASSERT(ctx, took > 1.5 && took < 5, "the timeout came after %.2f s (CFX_TIMEOUT=2)", took);
    RANK_ASSERT(ctx, strstr(why, "waits for rank 1") != NULL, "%s", why);
    /* Rank 1 never posted into its fresh FIFO to rank 0: the sentence says so. */
    RANK_ASSERT(ctx, strstr(why, "(to receive; the FIFO's head 0, tail 0, slot 0's seq 0)") != NULL,
                "%s", why);
    RANK_ASSERT(ctx, g.gpu.cu->stream_synchronize(g.gpu.stream) == CUDA_SUCCESS,
                "the stream did not finish after the timeout");
    gpu_rank_close(&g);
}

Test(cuda, a_kernel_without_progress_times_out_naming_the_rank_it_waits_for, .timeout = 60)
{
    cr_log_info("on %s", use_gpu());
    cfx_test_setenv("CFX_TIMEOUT", "2");
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 40};
    CFX_TEST_RUN(&opts, timeout_names_the_peer);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
}

/* Lines of /proc/self/maps naming fake-cuda device memory (its own
 * allocations, cuMem mappings, and other processes' opened through IPC or
 * imported as descriptors), and this process's open descriptors. */
static int device_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, "fakecuda-device") != NULL || strstr(line, "fakecuda-vmm") != NULL;
    if (f != NULL)
        fclose(f);
    return n;
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    while (d != NULL && readdir(d) != NULL)
        n++;
    if (d != NULL)
        closedir(d);
    return n;
}

/* What this process's descriptors point at ("socket:[123]", "/memfd:x
 * (deleted)", ...), one per line, into @p buf. */
static void fd_targets(char *buf, size_t size)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    size_t used = 0;
    buf[0] = '\0';
    while (d != NULL && (e = readdir(d)) != NULL && used + 256 < size) {
        char path[300], target[200];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, target, sizeof(target) - 1);
        if (len <= 0 || e->d_name[0] == '.')
            continue;
        target[len] = '\0';
        used += (size_t)snprintf(buf + used, size - used, "%s\n", target);
    }
    if (d != NULL)
        closedir(d);
}

/* A descriptor open now that points at nothing listed in @p before (the
 * directory handle fd_targets itself opens aside), or NULL. */
static const char *fd_not_in(const char *before)
{
    static char now[16384];
    fd_targets(now, sizeof(now));
    for (char *line = strtok(now, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char want[256];
        snprintf(want, sizeof(want), "%s\n", line);
        if (strstr(before, want) == NULL && strncmp(line, "/proc/", 6) != 0)
            return line;
    }
    return NULL;
}

/* Rank 2 of 3 (processes) is killed while the others loop allreduces on
 * their streams: each survivor's error names rank 2, well before the
 * timeout (the watcher asks the transports while a kernel stalls). The
 * ranks share one GPU, so they connect over p2p (cuMem where the driver
 * has it): under fake-cuda each survivor's destroy leaves as many device
 * mappings and descriptors as it had before init (its slots, the dead
 * rank's slots it mapped, the hand-over sockets, the control blocks). */
static void killed_peer_is_named(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    const int *fake = ctx->arg;
    if (!gpu_rank_prepare(ctx, &g, 1 << 14, 0)) {
        gpu_rank_close(&g);
        return;
    }
    static char before[16384];
    int maps = device_mappings(), fds = open_fds();
    fd_targets(before, sizeof(before));
    cfx_test_step(ctx, "init");
    RANK_CFX(ctx, cfxCommInitRank(&g.comm, ctx->nranks, ctx->id, ctx->rank));
    if (ctx->slot_failed || !put_inputs(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    RANK_ASSERT(ctx, strcmp(g.comm->ring_send->transport->name, "p2p") == 0,
                "the ring goes over %s, not p2p", g.comm->ring_send->transport->name);
    double start = now_s();
    cfxResult_t res = cfxSuccess;
    for (int i = 0; res == cfxSuccess && now_s() - start < 20; i++) {
        if (ctx->rank == 2 && i == 20)
            kill(getpid(), SIGKILL);
        cfx_test_step(ctx, "allreduce %d", i);
        res = cfxAllReduce(g.dsend, g.drecv, g.n, cfxFloat32, cfxSum, g.comm, g.gpu.stream);
        if (res == cfxSuccess && g.gpu.cu->stream_synchronize(g.gpu.stream) != CUDA_SUCCESS)
            break;
        cfxResult_t seen = cfxSuccess;
        if (res == cfxSuccess && cfxCommGetAsyncError(g.comm, &seen) == cfxSuccess)
            res = seen;
    }
    double took = now_s() - start;
    const char *why = cfxGetLastError(g.comm);
    RANK_ASSERT(ctx, res != cfxSuccess, "no error after %.1f s", took);
    RANK_ASSERT(ctx, took < 8, "the failure took %.1f s (CFX_TIMEOUT=15)", took);
    RANK_ASSERT(ctx, strstr(why, "rank 2") != NULL, "the sentence does not name rank 2: %s", why);
    cfx_test_step(ctx, "destroy after the peer died");
    RANK_CFX(ctx, cfxCommDestroy(g.comm));
    g.comm = NULL;
    if (*fake) {
        RANK_ASSERT(ctx, device_mappings() == maps, "%d device mappings after destroy, %d before",
                    device_mappings(), maps);
        /* As many descriptors as before init (rank 0 may have fewer: the
         * bootstrap root's, opened by its cfxGetUniqueId, end with the
         * communicator), and none of them opened since. */
        int now = open_fds();
        RANK_ASSERT(ctx, ctx->rank == 0 ? now <= fds : now == fds,
                    "%d descriptors open after destroy, %d before init", now, fds);
        const char *left = fd_not_in(before);
        RANK_ASSERT(ctx, left == NULL, "a descriptor opened since init is still open: %s", left);
    }
    gpu_rank_close(&g);
}

Test(cuda, a_killed_peer_process_is_named_by_every_survivor, .timeout = 90)
{
    static int fake;
    const char *driver = use_gpu();
    cr_log_info("on %s", driver);
    fake = strcmp(driver, "fake-cuda") == 0;
    cfx_test_setenv("CFX_TIMEOUT", "15");
    struct cfx_test_options opts = {.nranks = 3,
                                    .mode = CFX_TEST_PROCS,
                                    .deadline_s = 60,
                                    .killed_ranks = 1ull << 2,
                                    .arg = &fake};
    CFX_TEST_RUN(&opts, killed_peer_is_named);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
}

/* ------------------------------------------------ the rest of the API on device buffers */

#define API_RANKS 4
#define API_COUNT 1031 /* Elements per block: odd, several chunks of nothing. */

static int32_t block_value(int from, int to, size_t i)
{
    return from * 1000000 + to * 10000 + (int32_t)(i % 9973);
}

/* Alltoall, gather and scatter (root 1) of device buffers, then an
 * allreduce with a PreMulSum op (host scalar), on each rank's stream. */
static void rest_of_the_api(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    size_t all = (size_t)API_COUNT * API_RANKS;
    if (!gpu_rank_open(ctx, &g, all)) {
        gpu_rank_close(&g);
        return;
    }
    int r = ctx->rank, n = ctx->nranks, root = 1;
    int32_t *host = (int32_t *)g.host;
    int32_t *dsend = (int32_t *)g.dsend, *drecv = (int32_t *)g.drecv;
    for (int to = 0; to < n; to++)
        for (size_t i = 0; i < API_COUNT; i++)
            host[(size_t)to * API_COUNT + i] = block_value(r, to, i);
    RANK_ASSERT(ctx, cfx_test_gpu_put(ctx, &g.gpu, dsend, host, all * 4), "put");

    cfx_test_step(ctx, "alltoall");
    RANK_CFX(ctx, cfxAlltoAll(dsend, drecv, API_COUNT, cfxInt32, g.comm, g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, host, drecv, all * 4), "get");
    for (int from = 0; from < n; from++)
        for (size_t i = 0; i < API_COUNT; i++)
            RANK_ASSERT(ctx, host[(size_t)from * API_COUNT + i] == block_value(from, r, i),
                        "alltoall: block %d element %zu is %d", from, i,
                        host[(size_t)from * API_COUNT + i]);

    cfx_test_step(ctx, "gather to rank %d", root);
    for (size_t i = 0; i < API_COUNT; i++)
        host[i] = block_value(r, root, i);
    RANK_ASSERT(ctx, cfx_test_gpu_put(ctx, &g.gpu, dsend, host, API_COUNT * 4), "put");
    RANK_CFX(ctx, cfxGather(dsend, drecv, API_COUNT, cfxInt32, root, g.comm, g.gpu.stream));
    if (r == root) {
        RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, host, drecv, all * 4), "get");
        for (int from = 0; from < n; from++)
            for (size_t i = 0; i < API_COUNT; i++)
                RANK_ASSERT(ctx, host[(size_t)from * API_COUNT + i] == block_value(from, root, i),
                            "gather: block %d element %zu", from, i);
    }

    cfx_test_step(ctx, "scatter from rank %d", root);
    for (int to = 0; to < n; to++)
        for (size_t i = 0; i < API_COUNT; i++)
            host[(size_t)to * API_COUNT + i] = block_value(r, to, i) + 7;
    RANK_ASSERT(ctx, cfx_test_gpu_put(ctx, &g.gpu, dsend, host, all * 4), "put");
    RANK_CFX(ctx, cfxScatter(dsend, drecv, API_COUNT, cfxInt32, root, g.comm, g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, host, drecv, API_COUNT * 4), "get");
    for (size_t i = 0; i < API_COUNT; i++)
        RANK_ASSERT(ctx, host[i] == block_value(root, r, i) + 7, "scatter: element %zu is %d", i,
                    host[i]);

    cfx_test_step(ctx, "allreduce with a PreMulSum op");
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "put");
    float scalar = 0.5f;
    cfxRedOp_t premul;
    RANK_CFX(ctx,
             cfxRedOpCreatePreMulSum(&premul, &scalar, cfxFloat32, cfxScalarHostImmediate, g.comm));
    RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, all, cfxFloat32, premul, g.comm, g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, all * 4), "get");
    for (size_t i = 0; i < all; i++)
        RANK_ASSERT(ctx, g.host[i] == sum_of(n, i) * 0.5f, "premulsum: element %zu is %g", i,
                    (double)g.host[i]);
    RANK_CFX(ctx, cfxRedOpDestroy(premul, g.comm));

    /* A scalar in device memory (cfxScalarDevice) is read when the call
     * runs: here a copy queued before it (behind a held stream) sets it. */
    cfx_test_step(ctx, "allreduce with a PreMulSum op, device scalar");
    float *dscalar = cfx_test_gpu_alloc(ctx, &g.gpu, sizeof(float));
    RANK_ASSERT(ctx, dscalar != NULL && cfx_test_gpu_put(ctx, &g.gpu, dscalar, &scalar, 4),
                "scalar");
    RANK_CFX(ctx, cfxRedOpCreatePreMulSum(&premul, dscalar, cfxFloat32, cfxScalarDevice, g.comm));
    RANK_ASSERT(ctx, hold(ctx, &g), "hold");
    static float quarter = 0.25f;
    RANK_ASSERT(ctx,
                g.gpu.cu->memcpy_htod_async((CUdeviceptr)(uintptr_t)dscalar, &quarter, 4,
                                            g.gpu.stream) == CUDA_SUCCESS,
                "scalar copy");
    cfxResult_t res = cfxAllReduce(g.dsend, g.drecv, all, cfxFloat32, premul, g.comm, g.gpu.stream);
    released[ctx->rank] = 1;
    RANK_ASSERT(ctx, res == cfxSuccess, "device-scalar allreduce: %s", cfxGetLastError(g.comm));
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, all * 4), "get");
    for (size_t i = 0; i < all; i++)
        RANK_ASSERT(ctx, g.host[i] == sum_of(n, i) * 0.25f,
                    "device premulsum: element %zu is %g, not %g", i, (double)g.host[i],
                    (double)(sum_of(n, i) * 0.25f));
    float host_in[4] = {1, 2, 3, 4}, host_out[4];
    res = cfxAllReduce(host_in, host_out, 4, cfxFloat32, premul, g.comm, NULL);
    RANK_ASSERT(ctx, res == cfxInvalidUsage, "a device scalar on host buffers gave %s",
                cfxGetErrorString(res));
    RANK_CFX(ctx, cfxRedOpDestroy(premul, g.comm));
    cfx_test_gpu_free(&g.gpu, dscalar);

    cfx_test_step(ctx, "cfxMemAlloc on a GPU rank's thread");
    void *mem = NULL;
    RANK_CFX(ctx, cfxMemAlloc(&mem, 4096));
    int device = -1;
    RANK_ASSERT(ctx, cfx_cuda_is_device_ptr(mem, &device) && device == 0,
                "cfxMemAlloc gave no device memory");
    RANK_CFX(ctx, cfxMemFree(mem));
    gpu_rank_close(&g);
}

Test(cuda, alltoall_gather_scatter_and_premulsum_run_on_device_buffers, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    struct cfx_test_options opts = {
        .nranks = API_RANKS, .mode = CFX_TEST_THREADS, .deadline_s = 90};
    CFX_TEST_RUN(&opts, rest_of_the_api);
}

/* ------------------------------------------------ groups wider than a narrow launch */

#define WIDE_RANKS 4
#define WIDE_MSGS  4    /* Messages each way per pair: 2 x 3 x 4 = 24 ops per rank. */
#define WIDE_COUNT 1500 /* Floats per message. */
/* Allreduces (two connectors each, on the ring) in a group that only a far
 * launch carries (more than 64 operations), in one that no launch carries
 * (more than 255 operations: several launches), and in one a group may not
 * hold. */
#define WIDE_FAR_CALLS  100
#define WIDE_FAR_GROUPS 5
#define WIDE_SEVERAL    (CFX_EXEC_CUDA_MAX_OPS + 45)
#define WIDE_TOO_MANY   (CFX_EXEC_CUDA_MAX_GROUP_OPS + 1)

static float wide_value(int from, int to, int msg, size_t i)
{
    return (float)(from * 1000 + to * 100 + msg * 10) + (float)(i % 7);
}

/* The send buffer of @p msgs messages of @p count floats to each rank
 * (block `to` holds them in order), put on the device. */
static int put_messages(struct cfx_test_rank *ctx, struct gpu_rank *g, int msgs, size_t count)
{
    const size_t block = (size_t)msgs * count, all = block * (size_t)ctx->nranks;
    for (int to = 0; to < ctx->nranks; to++)
        for (int m = 0; m < msgs; m++)
            for (size_t i = 0; i < count; i++)
                g->host[(size_t)to * block + (size_t)m * count + i] =
                    wide_value(ctx->rank, to, m, i);
    return cfx_test_gpu_put(ctx, &g->gpu, g->dsend, g->host, all * sizeof(float));
}

/* The receive buffer holds every peer's messages in their places; 0
 * (failure recorded, naming @p what) otherwise. */
static int check_messages(struct cfx_test_rank *ctx, struct gpu_rank *g, int msgs, size_t count,
                          const char *what)
{
    const int n = ctx->nranks, r = ctx->rank;
    const size_t block = (size_t)msgs * count;
    if (!cfx_test_gpu_get(ctx, &g->gpu, g->host, g->drecv, block * (size_t)n * sizeof(float)))
        return 0;
    for (int from = 0; from < n; from++)
        for (int m = 0; m < msgs && from != r; m++)
            for (size_t i = 0; i < count; i++) {
                float got = g->host[(size_t)from * block + (size_t)m * count + i];
                if (got != wide_value(from, r, m, i)) {
                    cfx_test_fail(ctx, __FILE__, __LINE__,
                                  "%s: message %d from rank %d, element %zu: %g, not %g", what, m,
                                  from, i, (double)got, (double)wide_value(from, r, m, i));
                    return 0;
                }
            }
    return 1;
}

/* A group of 24 point-to-point calls per rank (more than the narrow
 * launch's 15 operations and 14 views) runs as one wide launch, every
 * message in its place; a group of 100 allreduces (more than the wide
 * launch's 64 operations) runs as a far launch; one of 300 (more than a far
 * launch carries) as several launches; a group of more than a group may
 * hold is refused with a sentence on every rank, and the communicator goes
 * on. */
static void wide_group(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    const int n = ctx->nranks, r = ctx->rank;
    const size_t block = (size_t)WIDE_MSGS * WIDE_COUNT, all = block * (size_t)n;
    if (!gpu_rank_open(ctx, &g, all)) {
        gpu_rank_close(&g);
        return;
    }
    cfx_test_step(ctx, "a group of %d sends and receives", 2 * (n - 1) * WIDE_MSGS);
    RANK_ASSERT(ctx, put_messages(ctx, &g, WIDE_MSGS, WIDE_COUNT), "put");
    RANK_CFX(ctx, cfxGroupStart());
    for (int k = 1; k < n; k++) {
        int to = (r + k) % n, from = (r - k + n) % n;
        for (int m = 0; m < WIDE_MSGS; m++) {
            RANK_CFX(ctx, cfxSend(g.dsend + (size_t)to * block + (size_t)m * WIDE_COUNT, WIDE_COUNT,
                                  cfxFloat32, to, g.comm, g.gpu.stream));
            RANK_CFX(ctx, cfxRecv(g.drecv + (size_t)from * block + (size_t)m * WIDE_COUNT,
                                  WIDE_COUNT, cfxFloat32, from, g.comm, g.gpu.stream));
        }
    }
    RANK_CFX(ctx, cfxGroupEnd());
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    RANK_ASSERT(ctx, check_messages(ctx, &g, WIDE_MSGS, WIDE_COUNT, "point to point"), "messages");

    cfx_test_step(ctx, "a group of %d allreduces (a far launch)", WIDE_FAR_CALLS);
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
    RANK_CFX(ctx, cfxGroupStart());
    for (int k = 0; k < WIDE_FAR_CALLS; k++)
        RANK_CFX(ctx,
                 cfxAllReduce(g.dsend, g.drecv, all, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    RANK_CFX(ctx, cfxGroupEnd());
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu) && check_sums(ctx, &g, g.drecv), "sums");

    cfx_test_step(ctx, "%d far groups back to back", WIDE_FAR_GROUPS);
    /* More far launches in flight than a communicator has argument
     * buffers: a buffer is filled again only once its launch is over. */
    const size_t part = all / WIDE_FAR_GROUPS;
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
    memset(g.host, 0, all * sizeof(float));
    RANK_ASSERT(ctx, cfx_test_gpu_put(ctx, &g.gpu, g.drecv, g.host, all * sizeof(float)), "zeros");
    for (int k = 0; k < WIDE_FAR_GROUPS; k++) {
        RANK_CFX(ctx, cfxGroupStart());
        for (int c = 0; c < WIDE_FAR_CALLS; c++)
            RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv + (size_t)k * part, part, cfxFloat32,
                                       cfxSum, g.comm, g.gpu.stream));
        RANK_CFX(ctx, cfxGroupEnd());
    }
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, all * sizeof(float)), "get");
    for (size_t i = 0; i < part * WIDE_FAR_GROUPS; i++)
        RANK_ASSERT(ctx, g.host[i] == sum_of(ctx->nranks, i % part),
                    "group %zu, element %zu is %g, not %g", i / part, i % part, (double)g.host[i],
                    (double)sum_of(ctx->nranks, i % part));

    cfx_test_step(ctx, "a group of %d allreduces (several launches)", WIDE_SEVERAL);
    const size_t small = all / WIDE_SEVERAL;
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
    RANK_CFX(ctx, cfxGroupStart());
    for (int k = 0; k < WIDE_SEVERAL; k++)
        RANK_CFX(ctx, cfxAllReduce(g.dsend + (size_t)k * small, g.drecv + (size_t)k * small, small,
                                   cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    RANK_CFX(ctx, cfxGroupEnd());
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, all * sizeof(float)), "get");
    for (size_t i = 0; i < small * WIDE_SEVERAL; i++)
        RANK_ASSERT(ctx, g.host[i] == sum_of(ctx->nranks, i), "call %zu, element %zu is %g, not %g",
                    i / small, i % small, (double)g.host[i], (double)sum_of(ctx->nranks, i));

    cfx_test_step(ctx, "a group of %d allreduces", WIDE_TOO_MANY);
    RANK_CFX(ctx, cfxGroupStart());
    for (int k = 0; k < WIDE_TOO_MANY; k++)
        RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, 64, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    cfxResult_t res = cfxGroupEnd();
    RANK_ASSERT(ctx, res == cfxInvalidUsage, "%d allreduces in one group gave %s", WIDE_TOO_MANY,
                cfxGetErrorString(res));
    const char *why = cfxGetLastError(g.comm);
    RANK_ASSERT(ctx, strstr(why, "split the group") != NULL, "the refusal says: %s", why);

    cfx_test_step(ctx, "an allreduce after the refusal");
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
    RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, all, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu) && check_sums(ctx, &g, g.drecv), "sums");
    gpu_rank_close(&g);
}

Test(cuda, wide_far_and_split_groups_run_and_a_wider_one_is_refused, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    struct cfx_test_options opts = {
        .nranks = WIDE_RANKS, .mode = CFX_TEST_THREADS, .deadline_s = 90};
    CFX_TEST_RUN(&opts, wide_group);
}

/* ------------------------------------------------ groups of several launches */

#define SPLIT_RANKS 3
#define SPLIT_MSGS  70   /* Messages each way per pair: 4 x 70 = 280 ops per rank. */
#define SPLIT_COUNT 8192 /* Floats per message: 32 KiB, twice a FIFO of CFX_BUFFSIZE. */
#define SPLIT_CALLS 40   /* Allreduces of SPLIT_COUNT floats mixed into the second group. */

/* A group of 280 sends and receives per rank, more than one launch
 * carries, issued in an order that differs from rank to rank (rank 0 all
 * its sends first, rank 1 all its receives first, rank 2 one peer after
 * the other), with messages larger than a FIFO (so a send waits for its
 * receive): cut into launches in call order, a rank's first launch would
 * wait for receives that its peer put in a later one (and the run would
 * hang); in the order every rank takes alike it completes, every message
 * in its place. Then the same with 40 allreduces of 32 KiB in the group,
 * before the sends and receives on even ranks and after them on odd ones:
 * collectives go first on every rank. */
static void split_group(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    const int n = ctx->nranks, r = ctx->rank;
    const size_t block = (size_t)SPLIT_MSGS * SPLIT_COUNT, all = block * (size_t)n;
    if (!gpu_rank_open(ctx, &g, all)) {
        gpu_rank_close(&g);
        return;
    }
    RANK_ASSERT(ctx, put_messages(ctx, &g, SPLIT_MSGS, SPLIT_COUNT), "put");
    cfx_test_step(ctx, "a group of %d sends and receives", 4 * SPLIT_MSGS);
    RANK_CFX(ctx, cfxGroupStart());
    for (int pass = 0; pass < 2; pass++)
        for (int k = 1; k < n; k++) {
            int peer = (r + k) % n;
            /* Rank 0: sends, then receives; rank 1: the other way round;
             * rank 2: both with one peer, then both with the other. */
            int sends = r == 0 ? pass == 0 : r == 1 ? pass == 1 : 1;
            int recvs = r == 0 ? pass == 1 : r == 1 ? pass == 0 : 1;
            if (r == 2 && (pass == 0) != (k == 1))
                continue;
            for (int m = 0; m < SPLIT_MSGS && sends; m++)
                RANK_CFX(ctx, cfxSend(g.dsend + (size_t)peer * block + (size_t)m * SPLIT_COUNT,
                                      SPLIT_COUNT, cfxFloat32, peer, g.comm, g.gpu.stream));
            for (int m = 0; m < SPLIT_MSGS && recvs; m++)
                RANK_CFX(ctx, cfxRecv(g.drecv + (size_t)peer * block + (size_t)m * SPLIT_COUNT,
                                      SPLIT_COUNT, cfxFloat32, peer, g.comm, g.gpu.stream));
        }
    RANK_CFX(ctx, cfxGroupEnd());
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    cfxResult_t seen = cfxSuccess;
    RANK_CFX(ctx, cfxCommGetAsyncError(g.comm, &seen));
    RANK_ASSERT(ctx, seen == cfxSuccess, "%s", cfxGetLastError(g.comm));
    RANK_ASSERT(ctx, check_messages(ctx, &g, SPLIT_MSGS, SPLIT_COUNT, "point to point"),
                "messages");

    cfx_test_step(ctx, "%d allreduces and %d sends and receives in one group", SPLIT_CALLS,
                  4 * SPLIT_MSGS);
    const size_t ar_all = (size_t)SPLIT_CALLS * SPLIT_COUNT;
    float *ar_in = cfx_test_gpu_alloc(ctx, &g.gpu, ar_all * sizeof(float));
    float *ar_out = cfx_test_gpu_alloc(ctx, &g.gpu, ar_all * sizeof(float));
    float *host = malloc(ar_all * sizeof(float));
    RANK_ASSERT(ctx, ar_in != NULL && ar_out != NULL && host != NULL, "out of memory");
    for (size_t i = 0; i < ar_all; i++)
        host[i] = input_of(r, i);
    RANK_ASSERT(ctx, cfx_test_gpu_put(ctx, &g.gpu, ar_in, host, ar_all * sizeof(float)), "put");
    memset(g.host, 0, all * sizeof(float));
    RANK_ASSERT(ctx, cfx_test_gpu_put(ctx, &g.gpu, g.drecv, g.host, all * sizeof(float)), "zero");
    RANK_CFX(ctx, cfxGroupStart());
    for (int pass = 0; pass < 2; pass++) {
        if ((pass == 0) == (r % 2 == 0))
            for (int c = 0; c < SPLIT_CALLS; c++)
                RANK_CFX(ctx, cfxAllReduce(ar_in + (size_t)c * SPLIT_COUNT,
                                           ar_out + (size_t)c * SPLIT_COUNT, SPLIT_COUNT,
                                           cfxFloat32, cfxSum, g.comm, g.gpu.stream));
        else
            for (int k = 1; k < n; k++)
                for (int m = 0; m < SPLIT_MSGS; m++) {
                    int to = (r + k) % n, from = (r - k + n) % n;
                    RANK_CFX(ctx, cfxSend(g.dsend + (size_t)to * block + (size_t)m * SPLIT_COUNT,
                                          SPLIT_COUNT, cfxFloat32, to, g.comm, g.gpu.stream));
                    RANK_CFX(ctx, cfxRecv(g.drecv + (size_t)from * block + (size_t)m * SPLIT_COUNT,
                                          SPLIT_COUNT, cfxFloat32, from, g.comm, g.gpu.stream));
                }
    }
    RANK_CFX(ctx, cfxGroupEnd());
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, host, ar_out, ar_all * sizeof(float)), "get");
    for (size_t i = 0; i < ar_all; i++)
        RANK_ASSERT(ctx, host[i] == sum_of(n, i), "allreduce %zu, element %zu is %g, not %g",
                    i / SPLIT_COUNT, i % SPLIT_COUNT, (double)host[i], (double)sum_of(n, i));
    RANK_ASSERT(ctx, check_messages(ctx, &g, SPLIT_MSGS, SPLIT_COUNT, "mixed group"), "messages");
    free(host);
    cfx_test_gpu_free(&g.gpu, ar_in);
    cfx_test_gpu_free(&g.gpu, ar_out);
    gpu_rank_close(&g);
}

Test(cuda, a_group_wider_than_a_launch_runs_in_launches_in_one_order_on_every_rank, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    cfx_test_setenv("CFX_BUFFSIZE", "16384");
    struct cfx_test_options opts = {
        .nranks = SPLIT_RANKS, .mode = CFX_TEST_THREADS, .deadline_s = 90};
    CFX_TEST_RUN(&opts, split_group);
}

/* ------------------------------------------------ LL */

#define LL_COUNT 3000 /* Floats: 3 KB chunks on the ring of 4, LL steps. */

/* The header of the last LL slot this rank received on its ring connector
 * matches the connector's count of slots taken: the words carry the flag of
 * that slot (its number + 1) and its size. (The receiving side: its slots
 * are this rank's memory, which a peer that finished first cannot free.)
 * 0 (failure recorded) otherwise. */
static int ring_took_ll(struct cfx_test_rank *ctx, struct gpu_rank *g, const char *what)
{
    struct cfx_connector *from = g->comm->ring_recv;
    if (from == NULL || from->view.ll == NULL) {
        cfx_test_fail(ctx, __FILE__, __LINE__, "%s: the ring connector has no LL slots", what);
        return 0;
    }
    uint64_t head = cfx_load_acquire_u64(from->view.head);
    uint64_t header[CFX_LL_HEADER_WORDS] = {0};
    if (head == 0 || !cfx_test_gpu_get(ctx, &g->gpu, header, cfx_ll_slot(&from->view, head - 1),
                                       sizeof(header))) {
        cfx_test_fail(ctx, __FILE__, __LINE__, "%s: nothing received (head %llu)", what,
                      (unsigned long long)head);
        return 0;
    }
    uint32_t size = 0, check = 0;
    if (!cfx_ll_load(&header[0], cfx_ll_flag(head - 1), &size) ||
        !cfx_ll_load(&header[1], cfx_ll_flag(head - 1), &check) || size == 0 ||
        size > CFX_LL_DATA_BYTES) {
        cfx_test_fail(ctx, __FILE__, __LINE__,
                      "%s: LL slot %llu's header is %016llx %016llx, not that slot's (flag %u)",
                      what, (unsigned long long)(head - 1), (unsigned long long)header[0],
                      (unsigned long long)header[1], cfx_ll_flag(head - 1));
        return 0;
    }
    return 1;
}

/* Small allreduces in LL (CFX_PROTO=LL, on the ring, over the transport
 * named by ctx->arg): on device buffers, the kernels' LL words, and an
 * allgather and a reduce-scatter; then with rank 0 on host buffers, its
 * host thread reads and writes LL words through the connectors' stages
 * while the other ranks' kernels do; the sums are right and every rank's
 * last slot in came as LL words. */
static void ll_allreduces(struct cfx_test_rank *ctx)
{
    const char *transport = ctx->arg;
    struct gpu_rank g;
    if (!gpu_rank_open(ctx, &g, LL_COUNT)) {
        gpu_rank_close(&g);
        return;
    }
    RANK_ASSERT(ctx, strcmp(g.comm->ring_recv->transport->name, transport) == 0,
                "the ring goes over %s, not %s", g.comm->ring_recv->transport->name, transport);
    cfx_test_step(ctx, "an allreduce of device buffers");
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
    RANK_CFX(ctx,
             cfxAllReduce(g.dsend, g.drecv, LL_COUNT, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu) && check_sums(ctx, &g, g.drecv), "sums");
    RANK_ASSERT(ctx, ring_took_ll(ctx, &g, "device buffers"), "LL");

    cfx_test_step(ctx, "an allgather and a reduce-scatter of device buffers");
    const size_t per = LL_COUNT / (size_t)ctx->nranks;
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
    RANK_CFX(ctx, cfxAllGather(g.dsend, g.drecv, per, cfxFloat32, g.comm, g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, per * ctx->nranks * 4), "get");
    for (int r = 0; r < ctx->nranks; r++)
        for (size_t i = 0; i < per; i++)
            RANK_ASSERT(ctx, g.host[(size_t)r * per + i] == input_of(r, i),
                        "allgather: rank %d's element %zu is %g, not %g", r, i,
                        (double)g.host[(size_t)r * per + i], (double)input_of(r, i));
    RANK_ASSERT(ctx, ring_took_ll(ctx, &g, "allgather"), "LL");
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
    RANK_CFX(ctx,
             cfxReduceScatter(g.dsend, g.drecv, per, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, per * 4), "get");
    for (size_t i = 0; i < per; i++) {
        size_t at = (size_t)ctx->rank * per + i;
        RANK_ASSERT(ctx, g.host[i] == sum_of(ctx->nranks, at),
                    "reduce-scatter: element %zu is %g, not %g", i, (double)g.host[i],
                    (double)sum_of(ctx->nranks, at));
    }
    RANK_ASSERT(ctx, ring_took_ll(ctx, &g, "reduce-scatter"), "LL");

    cfx_test_step(ctx, "an allreduce with rank 0 on host buffers");
    float *in = malloc(LL_COUNT * sizeof(float)), *out = malloc(LL_COUNT * sizeof(float));
    RANK_ASSERT(ctx, in != NULL && out != NULL, "out of memory");
    for (size_t i = 0; i < LL_COUNT; i++)
        in[i] = input_of(ctx->rank, i);
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
    if (ctx->rank == 0) {
        RANK_CFX(ctx, cfxAllReduce(in, out, LL_COUNT, cfxFloat32, cfxSum, g.comm, NULL));
        for (size_t i = 0; i < LL_COUNT; i++)
            RANK_ASSERT(ctx, out[i] == sum_of(ctx->nranks, i), "element %zu is %g, not %g", i,
                        (double)out[i], (double)sum_of(ctx->nranks, i));
    } else {
        RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, LL_COUNT, cfxFloat32, cfxSum, g.comm,
                                   g.gpu.stream));
        RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu) && check_sums(ctx, &g, g.drecv), "sums");
    }
    RANK_ASSERT(ctx, ring_took_ll(ctx, &g, "mixed buffers"), "LL");
    free(in);
    free(out);
    gpu_rank_close(&g);
}

Test(cuda, small_collectives_run_in_ll_on_device_and_host_buffers_alike, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    cfx_test_setenv("CFX_PROTO", "LL");
    cfx_test_setenv("CFX_ALGO", "Ring");
    struct cfx_test_options opts = {
        .nranks = 4, .mode = CFX_TEST_THREADS, .deadline_s = 90, .arg = "p2p"};
    CFX_TEST_RUN(&opts, ll_allreduces);
}

/* GPU ranks without peer memory (CFX_P2P_DISABLE=1) meet in shm's pinned
 * FIFOs, whose LL slots carry the same small steps: as threads (one FIFO
 * both map) and as processes (a memfd; the sender learns of the LL slots
 * from the receiver's connect info). */
ParameterizedTestParameters(cuda, small_collectives_run_in_ll_over_shared_memory_too)
{
    static enum cfx_test_mode modes[] = {CFX_TEST_THREADS, CFX_TEST_PROCS};
    return cr_make_param_array(enum cfx_test_mode, modes, sizeof(modes) / sizeof(modes[0]));
}

ParameterizedTest(enum cfx_test_mode *mode, cuda,
                  small_collectives_run_in_ll_over_shared_memory_too, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    cfx_test_setenv("CFX_PROTO", "LL");
    cfx_test_setenv("CFX_ALGO", "Ring");
    cfx_test_setenv("CFX_P2P_DISABLE", "1");
    struct cfx_test_options opts = {
        .nranks = *mode == CFX_TEST_PROCS ? 3 : 4, .mode = *mode, .deadline_s = 90, .arg = "shm"};
    CFX_TEST_RUN(&opts, ll_allreduces);
}

/* ------------------------------------------------ rings split into channels */

#define CHANNEL_COUNT ((size_t)(1 << 20) + 5) /* 4 MiB of floats: 16 parts of 256 KiB. */
/* A block of the allgather and reduce-scatter of 3 ranks: the three blocks
 * make 4 MiB, 16 parts of every block (not a whole number of lines). */
#define CHANNEL_BLOCK (CHANNEL_COUNT / 3)

/* Slots the communicator's extra rings have taken in so far. */
static uint64_t extra_ring_slots(const struct gpu_rank *g)
{
    uint64_t slots = 0;
    for (int c = 0; c < CFX_RING_CHANNELS - 1; c++) {
        struct cfx_connector *from = g->comm->ring_more_recv[c];
        slots += from != NULL ? cfx_load_acquire_u64(from->view.head) : 0;
    }
    return slots;
}

/* Rank @p rank's block of an allgather: input_of(rank, i + rank), so that
 * every block differs. */
static float block_of(int rank, size_t i)
{
    return input_of(rank, i + (size_t)rank);
}

/* An allgather's output of @p n blocks of @p count (host memory) holds
 * every rank's block; 0 (failure recorded, naming @p what) otherwise. */
static int check_blocks(struct cfx_test_rank *ctx, const float *out, int n, size_t count,
                        const char *what)
{
    for (int r = 0; r < n; r++)
        for (size_t i = 0; i < count; i++)
            if (out[(size_t)r * count + i] != block_of(r, i)) {
                cfx_test_fail(ctx, __FILE__, __LINE__, "%s: block %d element %zu is %g, not %g",
                              what, r, i, (double)out[(size_t)r * count + i],
                              (double)block_of(r, i));
                return 0;
            }
    return 1;
}

/* How many of the communicator's extra rings moved data in (each part a
 * ring of its own: its receive connector exists and took slots). */
static int extra_rings_used(const struct gpu_rank *g)
{
    int used = 0;
    for (int c = 0; c < CFX_RING_CHANNELS - 1; c++) {
        struct cfx_connector *from = g->comm->ring_more_recv[c];
        used += from != NULL && cfx_load_acquire_u64(from->view.head) > 0;
    }
    return used;
}

/* A large allreduce, broadcast, reduce, allgather and reduce-scatter of a
 * GPU communicator, split over its rings (ctx->arg: the channels expected
 * in use, 1 when CFX_MAX_NCHANNELS=1): right results on every rank, also
 * with rank 0 on host buffers (its host thread runs the same parts), and
 * the extra rings took slots exactly when expected. */
static void channel_collectives(struct cfx_test_rank *ctx)
{
    int expect = *(const int *)ctx->arg;
    struct gpu_rank g;
    if (!gpu_rank_open(ctx, &g, CHANNEL_COUNT) || !put_inputs(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    RANK_ASSERT(ctx, g.comm->ring_channels == (expect > 1 ? 16 : 1),
                "the communicator has %d rings, not %d", g.comm->ring_channels,
                expect > 1 ? 16 : 1);
    cfx_test_step(ctx, "allreduce");
    RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, CHANNEL_COUNT, cfxFloat32, cfxSum, g.comm,
                               g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu) && check_sums(ctx, &g, g.drecv), "sums");
    RANK_ASSERT(ctx, extra_rings_used(&g) == expect - 1, "%d extra rings took slots, not %d",
                extra_rings_used(&g), expect - 1);

    cfx_test_step(ctx, "broadcast from rank 1");
    RANK_CFX(ctx,
             cfxBroadcast(g.dsend, g.drecv, CHANNEL_COUNT, cfxFloat32, 1, g.comm, g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, CHANNEL_COUNT * 4), "get");
    for (size_t i = 0; i < CHANNEL_COUNT; i++)
        RANK_ASSERT(ctx, g.host[i] == input_of(1, i), "broadcast: element %zu is %g, not %g", i,
                    (double)g.host[i], (double)input_of(1, i));

    cfx_test_step(ctx, "reduce (max) to rank 2");
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
    RANK_CFX(ctx, cfxReduce(g.dsend, g.drecv, CHANNEL_COUNT, cfxFloat32, cfxMax, 2, g.comm,
                            g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    if (ctx->rank == 2) {
        RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, CHANNEL_COUNT * 4), "get");
        for (size_t i = 0; i < CHANNEL_COUNT; i++)
            RANK_ASSERT(ctx, g.host[i] == input_of(ctx->nranks - 1, i),
                        "reduce: element %zu is %g, not %g", i, (double)g.host[i],
                        (double)input_of(ctx->nranks - 1, i));
    }

    cfx_test_step(ctx, "allgather");
    const size_t B = CHANNEL_BLOCK;
    int n = ctx->nranks;
    for (size_t i = 0; i < B; i++)
        g.host[i] = block_of(ctx->rank, i);
    RANK_ASSERT(ctx, cfx_test_gpu_put(ctx, &g.gpu, g.dsend, g.host, B * 4), "put");
    uint64_t before = extra_ring_slots(&g);
    RANK_CFX(ctx, cfxAllGather(g.dsend, g.drecv, B, cfxFloat32, g.comm, g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    RANK_ASSERT(ctx, (extra_ring_slots(&g) > before) == (expect > 1),
                "the extra rings took %llu slots",
                (unsigned long long)(extra_ring_slots(&g) - before));
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, (size_t)n * B * 4), "get");
    RANK_ASSERT(ctx, check_blocks(ctx, g.host, n, B, "allgather"), "allgather");

    cfx_test_step(ctx, "reduce-scatter");
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
    before = extra_ring_slots(&g);
    RANK_CFX(ctx, cfxReduceScatter(g.dsend, g.drecv, B, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    RANK_ASSERT(ctx, (extra_ring_slots(&g) > before) == (expect > 1),
                "the extra rings took %llu slots",
                (unsigned long long)(extra_ring_slots(&g) - before));
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, B * 4), "get");
    for (size_t i = 0; i < B; i++) {
        size_t at = (size_t)ctx->rank * B + i;
        RANK_ASSERT(ctx, g.host[i] == sum_of(n, at), "reduce-scatter: element %zu is %g, not %g", i,
                    (double)g.host[i], (double)sum_of(n, at));
    }

    cfx_test_step(ctx, "allgather in place, rank 0 on host buffers");
    if (ctx->rank == 0) {
        float *buf = malloc((size_t)n * B * sizeof(float));
        RANK_ASSERT(ctx, buf != NULL, "out of memory");
        memset(buf, 0xff, (size_t)n * B * sizeof(float));
        for (size_t i = 0; i < B; i++)
            buf[i] = block_of(0, i);
        RANK_CFX(ctx, cfxAllGather(buf, buf, B, cfxFloat32, g.comm, NULL));
        int ok = check_blocks(ctx, buf, n, B, "host allgather");
        free(buf);
        RANK_ASSERT(ctx, ok, "host allgather");
    } else {
        float *mine = g.drecv + (size_t)ctx->rank * B;
        for (size_t i = 0; i < B; i++)
            g.host[i] = block_of(ctx->rank, i);
        RANK_ASSERT(ctx, cfx_test_gpu_put(ctx, &g.gpu, mine, g.host, B * 4), "put");
        RANK_CFX(ctx, cfxAllGather(mine, g.drecv, B, cfxFloat32, g.comm, g.gpu.stream));
        RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
        RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, (size_t)n * B * 4), "get");
        RANK_ASSERT(ctx, check_blocks(ctx, g.host, n, B, "allgather in place"), "in place");
    }

    cfx_test_step(ctx, "allreduce with rank 0 on host buffers");
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
    if (ctx->rank == 0) {
        float *buf = malloc(CHANNEL_COUNT * sizeof(float));
        RANK_ASSERT(ctx, buf != NULL, "out of memory");
        for (size_t i = 0; i < CHANNEL_COUNT; i++)
            buf[i] = input_of(0, i);
        RANK_CFX(ctx, cfxAllReduce(buf, buf, CHANNEL_COUNT, cfxFloat32, cfxSum, g.comm, NULL));
        for (size_t i = 0; i < CHANNEL_COUNT; i++)
            RANK_ASSERT(ctx, buf[i] == sum_of(ctx->nranks, i), "element %zu is %g, not %g", i,
                        (double)buf[i], (double)sum_of(ctx->nranks, i));
        free(buf);
    } else {
        RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, CHANNEL_COUNT, cfxFloat32, cfxSum, g.comm,
                                   g.gpu.stream));
        RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu) && check_sums(ctx, &g, g.drecv), "sums");
    }
    gpu_rank_close(&g);
}

/* The plan of GPU ranks on one GPU asks for 32 rings (capped at 16): a
 * 4 MiB allreduce, broadcast and reduce run as 16 parts on 16 rings, and
 * so do an allgather and a reduce-scatter of 4 MiB in all (16 parts of
 * every rank's block); CFX_MAX_NCHANNELS=1 keeps one. */
ParameterizedTestParameters(cuda, large_ring_collectives_split_over_the_plans_channels)
{
    static int channels[] = {16, 1};
    return cr_make_param_array(int, channels, sizeof(channels) / sizeof(channels[0]));
}

ParameterizedTest(int *channels, cuda, large_ring_collectives_split_over_the_plans_channels,
                  .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    cfx_test_setenv("CFX_ALGO", "Ring");
    if (*channels == 1)
        cfx_test_setenv("CFX_MAX_NCHANNELS", "1");
    struct cfx_test_options opts = {
        .nranks = 3, .mode = CFX_TEST_THREADS, .deadline_s = 90, .arg = channels};
    CFX_TEST_RUN(&opts, channel_collectives);
}

/* ------------------------------------------------ the cost of an enqueue */

/* Driver calls an in-place allreduce on device buffers may make, from call
 * to return, over a stream of calls: the current context, the buffer's
 * kind, the stream's capture state, the launch and the communicator's
 * event (5), and now and then a reap (an event query between two
 * capture-mode exchanges, at most every millisecond: the window's 64 calls
 * take about 2 ms here, so far fewer than one in two). Each driver call is
 * 0.1-2 us of CPU on a GPU machine, and issue 12 asks for an enqueue of at
 * most 5 us. */
#define ENQUEUE_CALLS     64
#define ENQUEUE_MAX_CALLS (5 * ENQUEUE_CALLS)

/* Each rank marks (on stderr, where fake-cuda's FAKECUDA_DEBUG lines go)
 * the window of its thread's timed calls. */
static void enqueue_in_a_stream_of_calls(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    if (!gpu_rank_open(ctx, &g, 1024) || !put_inputs(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    /* A first call connects; then the stream of calls. */
    RANK_CFX(ctx, cfxAllReduce(g.drecv, g.drecv, 1024, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    long tid = (long)syscall(SYS_gettid);
    fprintf(stderr, "enqueue-test: begin %ld\n", tid);
    for (int i = 0; i < ENQUEUE_CALLS; i++)
        RANK_CFX(ctx,
                 cfxAllReduce(g.drecv, g.drecv, 1024, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    fprintf(stderr, "enqueue-test: end %ld\n", tid);
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    gpu_rank_close(&g);
}

/* Counts fake-cuda's lines of each marked thread inside its window: their
 * number, and the calls by name for the message. */
static void count_enqueue_calls(FILE *log)
{
    char line[600];
    long open_tid[2] = {-1, -1}, counts[2] = {0, 0}, reaps[2] = {0, 0};
    char names[2][400] = {"", ""};
    int windows = 0;
    while (fgets(line, sizeof(line), log) != NULL) {
        long tid;
        char call[64];
        if (sscanf(line, "enqueue-test: begin %ld", &tid) == 1 && windows < 2) {
            open_tid[windows++] = tid;
            continue;
        }
        if (sscanf(line, "enqueue-test: end %ld", &tid) == 1) {
            for (int w = 0; w < windows; w++)
                if (open_tid[w] == tid)
                    open_tid[w] = -2; /* Closed. */
            continue;
        }
        int pid;
        char arrow[4];
        /* A call's line ("cuName -> CUDA_SUCCESS"), not the fake's notes. */
        if (sscanf(line, "fakecuda: [pid %d tid %ld] %63s %3s", &pid, &tid, call, arrow) != 4 ||
            strcmp(arrow, "->") != 0)
            continue;
        for (int w = 0; w < windows; w++) {
            if (open_tid[w] != tid)
                continue;
            if (strcmp(call, "cuEventQuery") == 0)
                reaps[w]++;
            else if (strcmp(call, "cuThreadExchangeStreamCaptureMode") != 0)
                counts[w]++; /* The exchanges go with the queries. */
            if (strstr(names[w], call) == NULL && strlen(names[w]) + strlen(call) + 2 < 400) {
                strcat(names[w], " ");
                strcat(names[w], call);
            }
        }
    }
    cr_assert_eq(windows, 2, "the log holds %d ranks' windows, not 2", windows);
    for (int w = 0; w < 2; w++) {
        cr_log_info("rank thread %d: %ld driver calls and %ld reaps in %d enqueues (%s)", w,
                    counts[w], reaps[w], ENQUEUE_CALLS, names[w]);
        cr_assert(counts[w] >= ENQUEUE_CALLS,
                  "rank thread %d: %ld driver calls for %d launches: the window is wrong", w,
                  counts[w], ENQUEUE_CALLS);
        cr_assert(counts[w] <= ENQUEUE_MAX_CALLS,
                  "rank thread %d: %ld driver calls in %d enqueues besides the reaps, more than "
                  "%d (%s)",
                  w, counts[w], ENQUEUE_CALLS, ENQUEUE_MAX_CALLS, names[w]);
        cr_assert(reaps[w] <= ENQUEUE_CALLS / 2,
                  "rank thread %d reaped %ld times in %d enqueues: at most every millisecond "
                  "should be far fewer",
                  w, reaps[w], ENQUEUE_CALLS);
    }
}

Test(cuda, an_enqueue_makes_five_driver_calls_and_reaps_now_and_then, .timeout = 60)
{
    const char *driver = use_gpu();
    if (strcmp(driver, "fake-cuda") != 0)
        cr_skip_test("counts fake-cuda's log of driver calls; the driver here is %s", driver);
    char path[] = "/tmp/cfx-enqueue-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0, "mkstemp");
    unlink(path);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    cr_assert(saved >= 0 && dup2(fd, STDERR_FILENO) >= 0, "redirect stderr");
    cfx_test_setenv("FAKECUDA_DEBUG", "1"); /* Read at the first driver call, after this. */
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 40};
    CFX_TEST_RUN(&opts, enqueue_in_a_stream_of_calls);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    FILE *log = fdopen(fd, "r");
    cr_assert(log != NULL, "fdopen");
    rewind(log);
    count_enqueue_calls(log);
    fclose(log);
}

/* ------------------------------------------------ graph capture */

/* Both ranks (threads) between their eager calls and their captures: in
 * CUDA's default GLOBAL mode one thread's synchronous copy during another
 * thread's capture invalidates that capture, so the test's own calls must
 * not overlap a capture (Conflux's calls may: it queries in RELAXED mode). */
static pthread_barrier_t capture_barrier;

/* Allreduces in a captured group: more than the 64 a captured launch carries. */
#define CAPTURE_GROUP 70

/* An allreduce captured on a stream replays correctly three times, with new
 * inputs copied in before each replay (every rank captures the same, in
 * GLOBAL mode, at the same time); so does a captured group of 70
 * allreduces, more than one captured launch carries. */
static void capture_and_replay(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    size_t n = 9000;
    if (!gpu_rank_open(ctx, &g, n)) {
        gpu_rank_close(&g);
        return;
    }
    const struct cfx_cuda_api *cu = g.gpu.cu;
    RANK_ASSERT(ctx, cu->stream_begin_capture != NULL, "the driver cannot capture");
    /* A first call outside the capture: connectors exist before it. */
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
    RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, n, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    int eager_ok = cfx_test_gpu_sync(ctx, &g.gpu) && check_sums(ctx, &g, g.drecv);
    pthread_barrier_wait(&capture_barrier);
    RANK_ASSERT(ctx, eager_ok, "eager");
    cfx_test_step(ctx, "capture");
    RANK_ASSERT(
        ctx, cu->stream_begin_capture(g.gpu.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS,
        "cuStreamBeginCapture");
    cfxResult_t res = cfxAllReduce(g.dsend, g.drecv, n, cfxFloat32, cfxSum, g.comm, g.gpu.stream);
    CUgraph graph = NULL;
    CUresult err = cu->stream_end_capture(g.gpu.stream, &graph);
    pthread_barrier_wait(&capture_barrier);
    RANK_ASSERT(ctx, res == cfxSuccess, "captured allreduce: %s", cfxGetLastError(g.comm));
    RANK_ASSERT(ctx, err == CUDA_SUCCESS, "cuStreamEndCapture: CUDA error %d", (int)err);
    CUgraphExec exec = NULL;
    RANK_ASSERT(ctx, cu->graph_instantiate(&exec, graph, 0) == CUDA_SUCCESS, "instantiate");
    for (int replay = 0; replay < 3; replay++) {
        cfx_test_step(ctx, "replay %d", replay);
        for (size_t i = 0; i < n; i++)
            g.host[i] = input_of(ctx->rank, i) * (float)(replay + 2);
        RANK_ASSERT(ctx, cfx_test_gpu_put(ctx, &g.gpu, g.dsend, g.host, n * sizeof(float)),
                    "inputs");
        RANK_ASSERT(ctx, cu->graph_launch(exec, g.gpu.stream) == CUDA_SUCCESS, "cuGraphLaunch");
        RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
        RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, n * sizeof(float)), "get");
        for (size_t i = 0; i < n; i++)
            RANK_ASSERT(ctx, g.host[i] == sum_of(ctx->nranks, i) * (float)(replay + 2),
                        "replay %d element %zu is %g", replay, i, (double)g.host[i]);
    }
    /* An eager call after the replays still agrees with every peer. */
    RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
    RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, n, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu) && check_sums(ctx, &g, g.drecv), "after");
    cu->graph_exec_destroy(exec);
    cu->graph_destroy(graph);

    /* A group of more operations than a captured launch carries (its
     * arguments by value: 64) is captured as several launches. */
    cfx_test_step(ctx, "capture a group of %d allreduces", CAPTURE_GROUP);
    const size_t part = n / CAPTURE_GROUP;
    pthread_barrier_wait(&capture_barrier);
    RANK_ASSERT(
        ctx, cu->stream_begin_capture(g.gpu.stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS,
        "cuStreamBeginCapture");
    res = cfxGroupStart();
    for (int k = 0; k < CAPTURE_GROUP && res == cfxSuccess; k++)
        res = cfxAllReduce(g.dsend + (size_t)k * part, g.drecv + (size_t)k * part, part, cfxFloat32,
                           cfxSum, g.comm, g.gpu.stream);
    cfxResult_t end = cfxGroupEnd();
    graph = NULL;
    err = cu->stream_end_capture(g.gpu.stream, &graph);
    pthread_barrier_wait(&capture_barrier);
    RANK_ASSERT(ctx, res == cfxSuccess && end == cfxSuccess, "captured group: %s",
                cfxGetLastError(g.comm));
    RANK_ASSERT(ctx, err == CUDA_SUCCESS, "cuStreamEndCapture: CUDA error %d", (int)err);
    RANK_ASSERT(ctx, cu->graph_instantiate(&exec, graph, 0) == CUDA_SUCCESS, "instantiate");
    for (size_t i = 0; i < n; i++)
        g.host[i] = input_of(ctx->rank, i) * 3.0f;
    RANK_ASSERT(ctx, cfx_test_gpu_put(ctx, &g.gpu, g.dsend, g.host, n * sizeof(float)), "inputs");
    RANK_ASSERT(ctx, cu->graph_launch(exec, g.gpu.stream) == CUDA_SUCCESS, "cuGraphLaunch");
    RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu), "sync");
    RANK_ASSERT(ctx, cfx_test_gpu_get(ctx, &g.gpu, g.host, g.drecv, n * sizeof(float)), "get");
    for (size_t i = 0; i < part * CAPTURE_GROUP; i++)
        RANK_ASSERT(ctx, g.host[i] == sum_of(ctx->nranks, i) * 3.0f,
                    "captured group: element %zu is %g", i, (double)g.host[i]);
    cu->graph_exec_destroy(exec);
    cu->graph_destroy(graph);
    gpu_rank_close(&g);
}

Test(cuda, a_captured_allreduce_replays_correctly, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 90};
    pthread_barrier_init(&capture_barrier, NULL, (unsigned)opts.nranks);
    CFX_TEST_RUN(&opts, capture_and_replay);
    pthread_barrier_destroy(&capture_barrier);
}

/* Ranks of one process on one GPU need a hardware queue per stream: with
 * more of them than CUDA_DEVICE_MAX_CONNECTIONS, init warns (once), naming
 * the variable; with enough queues it says nothing. */
static void open_and_allreduce(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    if (gpu_rank_open(ctx, &g, 1024) && put_inputs(ctx, &g))
        RANK_CFX(ctx,
                 cfxAllReduce(g.dsend, g.drecv, g.n, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    gpu_rank_close(&g);
}

Test(cuda, ranks_outnumbering_the_hardware_queues_are_warned_of, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    static const struct {
        const char *queues;
        int warnings;
    } cases[] = {{"3", 1}, {"32", 0}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char logs[128];
        cfx_test_log_to(logs, sizeof(logs), "gpu-queues");
        cfx_test_setenv("CUDA_DEVICE_MAX_CONNECTIONS", cases[i].queues);
        struct cfx_test_options opts = {.nranks = 3, .mode = CFX_TEST_THREADS, .deadline_s = 90};
        CFX_TEST_RUN(&opts, open_and_allreduce);
        int seen = cfx_test_count_in_logs(
            logs, "3 ranks of this communicator run on GPU 0 in this process, and CUDA gives a "
                  "process");
        int named = cfx_test_count_in_logs(logs, "set CUDA_DEVICE_MAX_CONNECTIONS=32");
        cfx_test_remove_logs(logs);
        cfx_test_logs_off();
        cr_assert(seen == cases[i].warnings && named == cases[i].warnings,
                  "CUDA_DEVICE_MAX_CONNECTIONS=%s, 3 ranks in one process: %d warnings (%d "
                  "naming the fix), expected %d",
                  cases[i].queues, seen, named, cases[i].warnings);
    }
    cfx_test_setenv("CUDA_DEVICE_MAX_CONNECTIONS", NULL);
}

/* A chain's team is capped so that every rank's blocks fit the device at
 * once: half its SMs (the fake has 132) shared among the process's GPU
 * ranks on it, and CFX_CUDA_BLOCKS. */
Test(cuda, teams_are_capped_by_the_sms_the_ranks_share, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    if (strcmp(use_gpu(), "fake-cuda") != 0)
        cr_skip_test("the caps below are for the fake's 132 SMs");
    static const struct {
        const char *blocks;
        int nranks;
        enum cfx_test_mode mode;
        const char *line;
    } cases[] = {
        {"64", 3, CFX_TEST_THREADS,
         "chains run on at most 22 blocks (CFX_CUDA_BLOCKS 64; 132 SMs, 3"},
        {"8", 3, CFX_TEST_THREADS, "chains run on at most 8 blocks (CFX_CUDA_BLOCKS 8; 132 SMs, 3"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char logs[128];
        cfx_test_log_to(logs, sizeof(logs), "gpu-teams");
        cfx_test_setenv("CFX_CUDA_BLOCKS", cases[i].blocks);
        struct cfx_test_options opts = {
            .nranks = cases[i].nranks, .mode = cases[i].mode, .deadline_s = 90};
        CFX_TEST_RUN(&opts, open_and_allreduce);
        int seen = cfx_test_count_in_logs(logs, cases[i].line);
        cfx_test_remove_logs(logs);
        cfx_test_logs_off();
        cr_assert(seen == cases[i].nranks, "CFX_CUDA_BLOCKS=%s, %d ranks: %d of them logged \"%s\"",
                  cases[i].blocks, cases[i].nranks, seen, cases[i].line);
    }
    cfx_test_setenv("CFX_CUDA_BLOCKS", NULL);
}

/* Ranks in processes of their own (a process forked after CUDA loaded
 * cannot use it: a test of its own): one GPU rank per process, the cap is
 * CFX_CUDA_BLOCKS up to half the SMs. */
Test(cuda, teams_of_ranks_alone_in_their_process_are_capped_by_half_the_sms, .timeout = 120)
{
    cr_log_info("on %s", use_gpu());
    if (strcmp(use_gpu(), "fake-cuda") != 0)
        cr_skip_test("the caps below are for the fake's 132 SMs");
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "gpu-teams-procs");
    cfx_test_setenv("CFX_CUDA_BLOCKS", "64");
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 90};
    CFX_TEST_RUN(&opts, open_and_allreduce);
    int seen = cfx_test_count_in_logs(
        logs, "chains run on at most 64 blocks (CFX_CUDA_BLOCKS 64; 132 SMs, 1 GPU rank(s)");
    cfx_test_remove_logs(logs);
    cfx_test_logs_off();
    cr_assert(seen == 2, "CFX_CUDA_BLOCKS=64, 2 processes: %d of them logged their cap", seen);
    cfx_test_setenv("CFX_CUDA_BLOCKS", NULL);
}

/* A team whose helper blocks never get room on the device (the fake runs
 * one block of a launch at a time here, FAKECUDA_RESIDENT_BLOCKS=1): the
 * leader waits for their acknowledgements, the watcher declares the
 * timeout, and the leader, seeing the abort word, ends its block, so the
 * stream completes and the call's error comes back. */
static void helpers_never_run(struct cfx_test_rank *ctx)
{
    struct gpu_rank g;
    if (!gpu_rank_open(ctx, &g, 1 << 16) || !put_inputs(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, g.n, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
    double start = now_s();
    cfx_test_step(ctx, "waiting for the timeout");
    cfxResult_t seen = async_error_within(g.comm, 10);
    double took = now_s() - start;
    RANK_ASSERT(ctx, seen == cfxTimeout || seen == cfxRemoteError, "async error %s: %s",
                cfxGetErrorString(seen), cfxGetLastError(g.comm));
    RANK_ASSERT(ctx, took < 6, "the failure came after %.2f s (CFX_TIMEOUT=2)", took);
    cfx_test_step(ctx, "waiting for the stream");
    RANK_ASSERT(ctx, g.gpu.cu->stream_synchronize(g.gpu.stream) == CUDA_SUCCESS,
                "the stream did not finish after the timeout");
    gpu_rank_close(&g);
}

Test(cuda, a_leader_whose_helpers_never_run_stops_at_the_timeout, .timeout = 60)
{
    if (strcmp(use_gpu(), "fake-cuda") != 0)
        cr_skip_test("needs the fake's FAKECUDA_RESIDENT_BLOCKS");
    cfx_test_setenv("CFX_TIMEOUT", "2");
    cfx_test_setenv("CFX_CUDA_BLOCKS", "4");
    cfx_test_setenv("CFX_CUDA_BLOCK_BYTES", "1024");
    cfx_test_setenv("FAKECUDA_RESIDENT_BLOCKS", "1");
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_THREADS, .deadline_s = 40};
    CFX_TEST_RUN(&opts, helpers_never_run);
    cfx_test_setenv("FAKECUDA_RESIDENT_BLOCKS", NULL);
    cfx_test_setenv("CFX_CUDA_BLOCK_BYTES", NULL);
    cfx_test_setenv("CFX_CUDA_BLOCKS", NULL);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
}

/* ------------------------------------------------ peer memory (transports/p2p) */

struct p2p_case {
    int nranks;
    enum cfx_test_mode mode;
    int devices;    /* Rank r on device r % devices (FAKECUDA_DEVICES when 2). */
    int level;      /* CFX_P2P_LEVEL: 0 the default (PXB), 1 LOC, 2 SYS (parameters hold
                     * no pointers: each test runs in a process of its own). */
    int disable;    /* CFX_P2P_DISABLE=1. */
    int no_peer;    /* FAKECUDA_NO_PEER=1: the driver says no GPU reaches another. */
    int expect_p2p; /* 1: p2p carries the ring; 0: shm does. */
    int cumem;      /* Processes: 0 cuMem where the driver has it (P2P/CUMEM), 1
                     * CFX_CUMEM_ENABLE=0, 2 FAKECUDA_NO_CUMEM=1 (both: P2P/IPC). */
    int read;       /* CFX_P2P_READ_ENABLE=1: the slots in the sender's memory. */
    int fake_cuda;  /* Set by the test: the driver is tests/fakecuda. */
};

/* A communicator split off @p g's, one device allreduce on it, then its
 * destroy: as many device mappings and descriptors as before (slots,
 * IPC mappings, stages, the control blocks' memfds all released). A rank
 * alone in its process only (threads share the counts). */
static void nothing_left_after_destroy(struct cfx_test_rank *ctx, struct gpu_rank *g)
{
    static char before[16384];
    int maps = device_mappings(), fds = open_fds();
    fd_targets(before, sizeof(before));
    cfxComm_t split = NULL;
    cfx_test_step(ctx, "split, allreduce, destroy");
    RANK_CFX(ctx, cfxCommSplit(g->comm, 0, ctx->rank, &split, NULL));
    RANK_CFX(ctx, cfxAllReduce(g->dsend, g->drecv, 4099, cfxFloat32, cfxSum, split, g->gpu.stream));
    if (!cfx_test_gpu_sync(ctx, &g->gpu))
        return;
    RANK_ASSERT(ctx, device_mappings() > maps, "the split communicator mapped no device memory");
    RANK_CFX(ctx, cfxCommDestroy(split));
    RANK_ASSERT(ctx, device_mappings() == maps, "%d device mappings after destroy, %d before",
                device_mappings(), maps);
    RANK_ASSERT(ctx, open_fds() == fds, "%d descriptors open after destroy, %d before", open_fds(),
                fds);
    const char *left = fd_not_in(before);
    RANK_ASSERT(ctx, left == NULL, "a descriptor opened by the split is still open: %s", left);
}

/* Device-buffer allreduces of several sizes (one slot, many, and a payload
 * that fits an info line), then host buffers on the GPU rank (the host
 * executor reads and writes the slots through the connector's stage). */
static void allreduces_over_peer_memory(struct cfx_test_rank *ctx)
{
    const struct p2p_case *pc = ctx->arg;
    static const size_t counts[] = {1, 4099, 1 << 20};
    struct gpu_rank g;
    if (!gpu_rank_open_on(ctx, &g, counts[2], ctx->rank % pc->devices) || !put_inputs(ctx, &g)) {
        gpu_rank_close(&g);
        return;
    }
    RANK_ASSERT(ctx,
                strcmp(g.comm->ring_send->transport->name, pc->expect_p2p ? "p2p" : "shm") == 0,
                "the ring goes over %s", g.comm->ring_send->transport->name);
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        cfx_test_step(ctx, "device allreduce of %zu floats", counts[c]);
        RANK_CFX(ctx, cfxAllReduce(g.dsend, g.drecv, counts[c], cfxFloat32, cfxSum, g.comm,
                                   g.gpu.stream));
        if (!cfx_test_gpu_sync(ctx, &g.gpu))
            break;
        size_t n = g.n;
        g.n = counts[c];
        int ok = check_sums(ctx, &g, g.drecv);
        g.n = n;
        if (!ok)
            break;
    }
    if (pc->mode == CFX_TEST_PROCS && pc->expect_p2p && !ctx->slot_failed && pc->fake_cuda)
        nothing_left_after_destroy(ctx, &g);
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]) && !ctx->slot_failed; c++) {
        cfx_test_step(ctx, "host allreduce of %zu floats on the GPU rank", counts[c]);
        for (size_t i = 0; i < counts[c]; i++)
            g.host[i] = input_of(ctx->rank, i);
        RANK_CFX(ctx, cfxAllReduce(g.host, g.host, counts[c], cfxFloat32, cfxSum, g.comm, NULL));
        for (size_t i = 0; i < counts[c]; i++)
            RANK_ASSERT(ctx, g.host[i] == sum_of(ctx->nranks, i),
                        "host buffers: element %zu is %g, not %g", i, (double)g.host[i],
                        (double)sum_of(ctx->nranks, i));
    }
    gpu_rank_close(&g);
}

ParameterizedTestParameters(cuda, gpu_ranks_of_one_host_connect_through_peer_memory)
{
    static struct p2p_case cases[] = {
        {2, CFX_TEST_THREADS, 1, 0, 0, 0, 1, 0, 0, 0},
        {3, CFX_TEST_THREADS, 1, 1, 0, 0, 1, 0, 0, 0},
        {2, CFX_TEST_PROCS, 1, 0, 0, 0, 1, 0, 0, 0},
        {3, CFX_TEST_PROCS, 1, 0, 0, 0, 1, 1, 0, 0},
        {2, CFX_TEST_PROCS, 1, 0, 0, 0, 1, 2, 0, 0},
        {2, CFX_TEST_THREADS, 2, 2, 0, 0, 1, 0, 0, 0},
        {4, CFX_TEST_PROCS, 2, 2, 0, 0, 1, 0, 0, 0},
        {2, CFX_TEST_PROCS, 2, 1, 0, 0, 0, 0, 0, 0},
        {2, CFX_TEST_THREADS, 2, 2, 0, 1, 0, 0, 0, 0},
        {2, CFX_TEST_PROCS, 1, 0, 1, 0, 0, 0, 0, 0},
        /* Read mode: threads across two GPUs, processes over cuMem and IPC. */
        {2, CFX_TEST_THREADS, 2, 2, 0, 0, 1, 0, 1, 0},
        {3, CFX_TEST_PROCS, 1, 0, 0, 0, 1, 0, 1, 0},
        {2, CFX_TEST_PROCS, 2, 2, 0, 0, 1, 1, 1, 0},
    };
    return cr_make_param_array(struct p2p_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct p2p_case *pc, cuda, gpu_ranks_of_one_host_connect_through_peer_memory,
                  .timeout = 300)
{
    const char *driver = use_gpu();
    static const char *const levels[] = {NULL, "LOC", "SYS"};
    const char *level = levels[pc->level];
    static const char *const cumems[] = {"", ", CFX_CUMEM_ENABLE=0", ", FAKECUDA_NO_CUMEM=1"};
    cr_log_info("%d ranks as %s on %d device(s), CFX_P2P_LEVEL=%s%s%s%s%s: expect %s", pc->nranks,
                pc->mode == CFX_TEST_PROCS ? "processes" : "threads", pc->devices,
                level ? level : "(default)", pc->disable ? ", CFX_P2P_DISABLE=1" : "",
                pc->no_peer ? ", no peer access" : "", cumems[pc->cumem],
                pc->read ? ", CFX_P2P_READ_ENABLE=1" : "", pc->expect_p2p ? "p2p" : "shm");
    if ((pc->devices > 1 || pc->cumem == 2) && strcmp(driver, "fake-cuda") != 0)
        cr_skip_test("needs 2 GPUs or a driver without cuMem; the fake driver has them "
                     "(FAKECUDA_DEVICES=2, FAKECUDA_NO_CUMEM=1)");
    pc->fake_cuda = strcmp(driver, "fake-cuda") == 0;
    cfx_test_setenv("FAKECUDA_DEVICES", pc->devices > 1 ? "2" : NULL);
    cfx_test_setenv("FAKECUDA_NO_PEER", pc->no_peer ? "1" : NULL);
    cfx_test_setenv("CFX_P2P_LEVEL", level);
    cfx_test_setenv("CFX_P2P_DISABLE", pc->disable ? "1" : NULL);
    cfx_test_setenv("CFX_CUMEM_ENABLE", pc->cumem == 1 ? "0" : NULL);
    cfx_test_setenv("FAKECUDA_NO_CUMEM", pc->cumem == 2 ? "1" : NULL);
    cfx_test_setenv("CFX_P2P_READ_ENABLE", pc->read ? "1" : NULL);
    struct cfx_test_options opts = {
        .nranks = pc->nranks, .mode = pc->mode, .deadline_s = 240, .arg = pc};
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "cuda-p2p");
    CFX_TEST_RUN(&opts, allreduces_over_peer_memory);
    /* Each end says its mode, with "/read" in read mode. */
    const char *end = pc->read ? "/read)" : ")";
    char line[64];
    snprintf(line, sizeof(line), "connected (P2P/direct%s", end);
    int direct = cfx_test_count_in_logs(logs, line);
    snprintf(line, sizeof(line), "connected (P2P/IPC%s", end);
    int ipc = cfx_test_count_in_logs(logs, line);
    snprintf(line, sizeof(line), "connected (P2P/CUMEM%s", end);
    int cumem = cfx_test_count_in_logs(logs, line);
    int read = cfx_test_count_in_logs(logs, "/read)");
    int shm = cfx_test_count_in_logs(logs, " via shm");
    cfx_test_remove_logs(logs);
    cfx_test_setenv("FAKECUDA_DEVICES", NULL);
    cfx_test_setenv("FAKECUDA_NO_PEER", NULL);
    cfx_test_setenv("CFX_P2P_LEVEL", NULL);
    cfx_test_setenv("CFX_P2P_DISABLE", NULL);
    cfx_test_setenv("CFX_CUMEM_ENABLE", NULL);
    cfx_test_setenv("FAKECUDA_NO_CUMEM", NULL);
    cfx_test_setenv("CFX_P2P_READ_ENABLE", NULL);
    if (!pc->read)
        cr_assert_eq(read, 0, "%d connection ends in read mode, none asked for", read);
    /* Both ends of each rank's ring send at least. */
    int want = 2 * pc->nranks;
    if (!pc->expect_p2p) {
        cr_assert_eq(direct + ipc + cumem, 0, "%d connection ends over p2p", direct + ipc + cumem);
        cr_assert_geq(shm, want, "%d connections over shm", shm);
    } else if (pc->mode == CFX_TEST_THREADS) {
        cr_assert_geq(direct, want, "%d connection ends said P2P/direct", direct);
        cr_assert_eq(ipc + cumem, 0, "threads of one process used CUDA IPC or cuMem");
    } else if (pc->cumem == 0) {
        cr_assert_geq(cumem, want, "%d connection ends said P2P/CUMEM", cumem);
        cr_assert_eq(direct + ipc, 0, "processes used a direct pointer or legacy IPC");
    } else {
        cr_assert_geq(ipc, want, "%d connection ends said P2P/IPC", ipc);
        cr_assert_eq(direct + cumem, 0, "processes used a direct pointer or cuMem");
    }
}

/* Inexact float inputs: their sum's rounding depends on the order of the fold. */
static float inexact_of(int rank, size_t i)
{
    float v = 0.1f + (float)rank * 1.37f + (float)i * 0.013f;
    return (rank + (int)i) % 3 == 0 ? -v : v;
}

struct direct_case {
    int nranks;
    enum cfx_test_mode mode;
    int read;    /* CFX_P2P_READ_ENABLE=1. */
    int twoshot; /* CFX_ALGO=twoshot, else CFX_ALGO=direct. */
};

/* Whether @p got holds the rank-order fold of every rank's inexact inputs. */
static int folded_in_rank_order(struct cfx_test_rank *ctx, const float *got, size_t count,
                                const char *what)
{
    for (size_t i = 0; i < count; i++) {
        float acc = inexact_of(0, i);
        for (int q = 1; q < ctx->nranks; q++)
            acc = acc + inexact_of(q, i);
        if (memcmp(&acc, &got[i], sizeof(float)) != 0) {
            cfx_test_fail(ctx, __FILE__, __LINE__,
                          "%s, count %zu: element %zu is %.9g, the rank-order fold gives %.9g",
                          what, count, i, (double)got[i], (double)acc);
            return 0;
        }
    }
    return 1;
}

/* CFX_ALGO=direct or twoshot on GPU ranks: the one-shot allreduce (each
 * rank's kernel pushes its input into every peer's slots over p2p and folds
 * the n inputs) and the two-shot (all-pairs reduce-scatter, then allgather)
 * give every rank x0 + x1 + ... + x(n-1) folded left to right, bit for bit:
 * device buffers in and out of place, in one slot and over several, counts
 * that leave segments empty or uneven; host buffers of the GPU ranks (the
 * host executor runs the same schedule); a group of two. */
static void direct_on_device(struct cfx_test_rank *ctx)
{
    const struct direct_case *dc = ctx->arg;
    static const size_t counts[] = {1, 1027, 40000, 200003};
    const size_t most = counts[sizeof(counts) / sizeof(counts[0]) - 1];
    struct gpu_rank g;
    if (!gpu_rank_open(ctx, &g, most)) {
        gpu_rank_close(&g);
        return;
    }
    int n = ctx->nranks;
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]) && !ctx->slot_failed; c++)
        for (int in_place = 0; in_place < 2 && !ctx->slot_failed; in_place++) {
            size_t count = counts[c];
            cfx_test_step(ctx, "%s allreduce of %zu floats %s", dc->twoshot ? "two-shot" : "direct",
                          count, in_place ? "in place" : "out of place");
            for (size_t i = 0; i < count; i++)
                g.host[i] = inexact_of(ctx->rank, i);
            if (!cfx_test_gpu_put(ctx, &g.gpu, g.dsend, g.host, count * sizeof(float)))
                break;
            float *out = in_place ? g.dsend : g.drecv;
            RANK_CFX(ctx,
                     cfxAllReduce(g.dsend, out, count, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
            if (!cfx_test_gpu_sync(ctx, &g.gpu) ||
                !cfx_test_gpu_get(ctx, &g.gpu, g.host, out, count * sizeof(float)) ||
                !folded_in_rank_order(ctx, g.host, count, "device buffers"))
                break;
        }
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]) && !ctx->slot_failed; c++) {
        cfx_test_step(ctx, "host allreduce of %zu floats in place on the GPU rank", counts[c]);
        for (size_t i = 0; i < counts[c]; i++)
            g.host[i] = inexact_of(ctx->rank, i);
        RANK_CFX(ctx, cfxAllReduce(g.host, g.host, counts[c], cfxFloat32, cfxSum, g.comm, NULL));
        if (!folded_in_rank_order(ctx, g.host, counts[c], "host buffers"))
            break;
    }
    for (int q = 0; q < n && !ctx->slot_failed; q++)
        RANK_ASSERT(ctx,
                    q == ctx->rank || (g.comm->direct.to[q] != NULL &&
                                       strcmp(g.comm->direct.to[q]->transport->name, "p2p") == 0),
                    "no all-pairs connector over p2p to rank %d: the calls did not go %s", q,
                    dc->twoshot ? "two-shot" : "direct");
    if (!ctx->slot_failed) {
        cfx_test_step(ctx, "a group of two");
        RANK_ASSERT(ctx, put_inputs(ctx, &g), "inputs");
        RANK_CFX(ctx, cfxGroupStart());
        RANK_CFX(ctx,
                 cfxAllReduce(g.dsend, g.drecv, 100, cfxFloat32, cfxSum, g.comm, g.gpu.stream));
        RANK_CFX(ctx, cfxAllReduce(g.dsend + 100, g.drecv + 100, 200, cfxFloat32, cfxSum, g.comm,
                                   g.gpu.stream));
        RANK_CFX(ctx, cfxGroupEnd());
        size_t keep = g.n;
        g.n = 300;
        RANK_ASSERT(ctx, cfx_test_gpu_sync(ctx, &g.gpu) && check_sums(ctx, &g, g.drecv),
                    "the group's sums");
        g.n = keep;
    }
    gpu_rank_close(&g);
}

ParameterizedTestParameters(cuda, one_and_two_shot_allreduces_on_gpu_ranks_fold_in_rank_order)
{
    static struct direct_case cases[] = {
        {2, CFX_TEST_THREADS, 0, 0}, {4, CFX_TEST_THREADS, 0, 0}, {3, CFX_TEST_PROCS, 0, 0},
        {3, CFX_TEST_PROCS, 1, 0},   {2, CFX_TEST_THREADS, 0, 1}, {4, CFX_TEST_THREADS, 0, 1},
        {3, CFX_TEST_PROCS, 0, 1},   {3, CFX_TEST_PROCS, 1, 1},
    };
    return cr_make_param_array(struct direct_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct direct_case *dc, cuda,
                  one_and_two_shot_allreduces_on_gpu_ranks_fold_in_rank_order, .timeout = 240)
{
    cr_log_info("%s: %d ranks as %s on %s%s", dc->twoshot ? "two-shot" : "one-shot", dc->nranks,
                dc->mode == CFX_TEST_PROCS ? "processes" : "threads", use_gpu(),
                dc->read ? ", CFX_P2P_READ_ENABLE=1" : "");
    cfx_test_setenv("CFX_ALGO", dc->twoshot ? "twoshot" : "direct");
    cfx_test_setenv("CFX_P2P_READ_ENABLE", dc->read ? "1" : NULL);
    struct cfx_test_options opts = {
        .nranks = dc->nranks, .mode = dc->mode, .deadline_s = 180, .arg = dc};
    CFX_TEST_RUN(&opts, direct_on_device);
    cfx_test_setenv("CFX_ALGO", NULL);
    cfx_test_setenv("CFX_P2P_READ_ENABLE", NULL);
}

/* Ranks set up for different P2P modes (rank 0 read, rank 1 write) would
 * both own, or both map, each connection's slots: init fails on both
 * instead of writing into memory no one reads. The rank that meets the
 * difference names the setting; the other may hear of the failure first
 * (the peer's notice comes before the connect info it waits for), and then
 * names that rank. At least one rank names the setting (the logs). */
static void read_settings_that_differ(struct cfx_test_rank *ctx)
{
    setenv("CFX_P2P_READ_ENABLE", ctx->rank == 0 ? "1" : "0", 1);
    cfx_param_reset_all();
    struct cfx_test_gpu gpu;
    if (!cfx_test_gpu_open(ctx, 0, &gpu))
        return;
    cfxComm_t comm = NULL;
    cfx_test_step(ctx, "init with CFX_P2P_READ_ENABLE=%d", ctx->rank == 0);
    cfxResult_t res = cfxCommInitRank(&comm, ctx->nranks, ctx->id, ctx->rank);
    const char *last = cfxGetLastError(NULL);
    RANK_ASSERT(ctx, res != cfxSuccess, "init succeeded with P2P read on one rank only");
    char peer_failed[64];
    snprintf(peer_failed, sizeof(peer_failed), "rank %d failed while connecting", 1 - ctx->rank);
    RANK_ASSERT(ctx,
                strstr(last, "CFX_P2P_READ_ENABLE") != NULL || strstr(last, peer_failed) != NULL,
                "the error names neither CFX_P2P_READ_ENABLE nor the peer's failure: %s", last);
    if (comm != NULL)
        cfxCommDestroy(comm);
    cfx_test_gpu_close(&gpu);
}

Test(cuda, p2p_read_set_on_one_rank_only_fails_init, .timeout = 120)
{
    const char *driver = use_gpu();
    cr_log_info("driver: %s", driver);
    char logs[128];
    cfx_test_log_to(logs, sizeof(logs), "p2p-read");
    struct cfx_test_options opts = {.nranks = 2, .mode = CFX_TEST_PROCS, .deadline_s = 90};
    CFX_TEST_RUN(&opts, read_settings_that_differ);
    int named = cfx_test_count_in_logs(logs, "CFX_P2P_READ_ENABLE");
    cfx_test_remove_logs(logs);
    cr_assert_geq(named, 1, "no rank's error names CFX_P2P_READ_ENABLE");
}

#else

Test(cuda, skipped_without_cuda)
{
    cr_skip_test("built without the CUDA toolkit (CFX_HAVE_CUDA is 0)");
}

#endif
