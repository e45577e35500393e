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
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/core/comm.h"
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

static int gpu_rank_open(struct cfx_test_rank *ctx, struct gpu_rank *g, size_t n)
{
    memset(g, 0, sizeof(*g));
    if (!cfx_test_gpu_open(ctx, 0, &g->gpu))
        return 0;
    g->n = n;
    g->host = malloc((n > 0 ? n : 1) * sizeof(float));
    g->dsend = cfx_test_gpu_alloc(ctx, &g->gpu, n * sizeof(float));
    g->drecv = cfx_test_gpu_alloc(ctx, &g->gpu, n * sizeof(float));
    if (g->host == NULL || g->dsend == NULL || g->drecv == NULL)
        return 0;
    cfxResult_t res = cfxCommInitRank(&g->comm, ctx->nranks, ctx->id, ctx->rank);
    if (res != cfxSuccess) {
        cfx_test_fail(ctx, __FILE__, __LINE__, "init: %s", cfxGetLastError(NULL));
        return 0;
    }
    return 1;
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
};

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
    gpu_rank_close(&g);
}

ParameterizedTestParameters(cuda, allreduce_is_enqueued_and_the_stream_completes_it)
{
    static struct enqueue_case cases[] = {
        {1, CFX_TEST_THREADS, 1000}, {2, CFX_TEST_THREADS, 7},     {2, CFX_TEST_THREADS, 1 << 20},
        {3, CFX_TEST_THREADS, 4099}, {4, CFX_TEST_PROCS, 1 << 18}, {2, CFX_TEST_PROCS, 1},
    };
    return cr_make_param_array(struct enqueue_case, cases, sizeof(cases) / sizeof(cases[0]));
}

ParameterizedTest(struct enqueue_case *ec, cuda, allreduce_is_enqueued_and_the_stream_completes_it,
                  .timeout = 300)
{
    cr_log_info("%d ranks as %s, %zu floats, on %s", ec->nranks,
                ec->mode == CFX_TEST_PROCS ? "processes" : "threads", ec->count, use_gpu());
    struct cfx_test_options opts = {
        .nranks = ec->nranks, .mode = ec->mode, .deadline_s = 240, .arg = ec};
    CFX_TEST_RUN(&opts, allreduce_returns_before_the_stream_runs);
}

#else

Test(cuda, skipped_without_cuda)
{
    cr_skip_test("built without the CUDA toolkit (CFX_HAVE_CUDA is 0)");
}

#endif
