/*
 * The executor interface (src/exec/exec.h): the host executor keeps the
 * launch/test/wait/abort contract, and the core launches every operation
 * through the executor registered for its memory kind.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cfx_build_config.h"
#include "src/core/comm.h"
#include "src/core/enqueue.h"
#include "src/exec/exec.h"
#include "tests/harness.h"

#define COUNT 1024

/* Two ranks of one process (cfxCommInitAll: one thread may drive both). */
static void init_two(cfxComm_t comms[2])
{
    cr_assert_eq(cfxCommInitAll(comms, 2, NULL), cfxSuccess, "%s", cfxGetLastError(NULL));
}

/* A ring allreduce (float sum) of rank comm->rank, made by hand as the core
 * would make it, ready for an executor. */
static void make_ring_allreduce(struct cfxComm *comm, const float *in, float *out,
                                struct cfx_op *op)
{
    cfx_op_clear(op);
    op->kind = CFX_COLL_ALLREDUCE;
    op->sendbuff = in;
    op->recvbuff = out;
    op->count = COUNT;
    op->type = cfxFloat32;
    op->op = cfxSum;
    op->rank = comm->rank;
    op->nranks = comm->nranks;
    op->abort_flag = &comm->abort_flag;
    op->owner = comm;
    op->spin_limit = comm->spin_limit;
    op->send_conn = comm->ring_send;
    op->recv_conn = comm->ring_recv;
    op->conns[op->n_conns++] = op->send_conn;
    op->conns[op->n_conns++] = op->recv_conn;
    cfx_coll_prepare(op);
}

static void fill(float *in, int rank)
{
    for (int i = 0; i < COUNT; i++)
        in[i] = (float)(rank * 1000 + i);
}

static void expect_sum(const float *out)
{
    for (int i = 0; i < COUNT; i++)
        cr_assert_eq(out[i], (float)(0 * 1000 + i) + (float)(1 * 1000 + i), "element %d: %f", i,
                     (double)out[i]);
}

/* A launch on a stream may end before its ops: the host executor answers
 * cfxInProgress for an allreduce whose peer has not started, keeps
 * answering it from test, and answers cfxSuccess from test once the peer
 * runs, with the right result. */
Test(exec, host_test_reports_in_progress_until_the_op_completes, .timeout = 60)
{
    cfxComm_t comms[2];
    init_two(comms);
    static float in[2][COUNT], out[2][COUNT];
    struct cfx_op ops[2];
    struct cfx_exec_batch batch[2];
    for (int r = 0; r < 2; r++) {
        fill(in[r], r);
        make_ring_allreduce(comms[r], in[r], out[r], &ops[r]);
    }
    const struct cfx_executor *exec = &cfx_exec_host;
    cfxStream_t stream = (cfxStream_t)&batch; /* Any non-NULL stream: launch must not block. */
    cfx_exec_batch_init(&batch[0], &ops[0], 1, stream);
    cr_assert_eq(exec->launch(exec, &batch[0]), cfxInProgress, "%s", cfxGetLastError(NULL));
    for (int i = 0; i < 100; i++)
        cr_assert_eq(exec->test(exec, &batch[0]), cfxInProgress, "rank 1 has not started");
    cr_assert_not(ops[0].done);
    cfx_exec_batch_init(&batch[1], &ops[1], 1, stream);
    cfxResult_t res[2] = {cfxInProgress, exec->launch(exec, &batch[1])};
    /* Bounded: 2 ranks of 1 KiB finish in a few passes; 10 s means a hang. */
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (res[0] == cfxInProgress || res[1] == cfxInProgress) {
        for (int r = 0; r < 2; r++)
            if (res[r] == cfxInProgress)
                res[r] = exec->test(exec, &batch[r]);
        clock_gettime(CLOCK_MONOTONIC, &now);
        cr_assert_lt(now.tv_sec - start.tv_sec, 10,
                     "test never completed the allreduce (step %llu of %llu on rank 0)",
                     (unsigned long long)ops[0].step, (unsigned long long)ops[0].n_steps);
    }
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(res[r], cfxSuccess, "rank %d: %s", r, cfxGetLastError(NULL));
        cr_assert(ops[r].done && ops[r].result == cfxSuccess);
        expect_sum(out[r]);
    }
    for (int r = 0; r < 2; r++)
        cr_assert_eq(cfxCommDestroy(comms[r]), cfxSuccess);
}

struct waiter {
    const struct cfx_executor *exec;
    struct cfx_exec_batch *batch;
    cfxResult_t result;
    char sentence[256];
};

static void *wait_batch(void *arg)
{
    struct waiter *w = arg;
    w->result = w->exec->launch(w->exec, w->batch); /* NULL stream: blocks. */
    snprintf(w->sentence, sizeof(w->sentence), "%s", cfxGetLastError(NULL));
    return NULL;
}

/* abort from another thread ends a launch blocked on a peer that never
 * comes, with cfxRemoteError and a sentence that says so. */
Test(exec, host_abort_from_another_thread_ends_a_blocked_launch, .timeout = 60)
{
    cfxComm_t comms[2];
    init_two(comms);
    static float in[COUNT], out[COUNT];
    fill(in, 0);
    struct cfx_op op;
    make_ring_allreduce(comms[0], in, out, &op);
    struct cfx_exec_batch batch;
    cfx_exec_batch_init(&batch, &op, 1, NULL);
    struct waiter w = {.exec = &cfx_exec_host, .batch = &batch, .result = cfxInProgress};
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, wait_batch, &w), 0);
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL); /* Not synchronisation: the abort must work before or during. */
    cfx_exec_host.abort(&cfx_exec_host, &batch);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 10;
    int joined = pthread_timedjoin_np(thread, NULL, &deadline);
    cr_assert_eq(joined, 0, "the aborted launch did not return within 10 s (%s)", strerror(joined));
    cr_assert_eq(w.result, cfxRemoteError, "launch returned %s: %s", cfxGetErrorString(w.result),
                 w.sentence);
    cr_assert(strstr(w.sentence, "allreduce on rank 0 was aborted"), "sentence: %s", w.sentence);
    cr_assert(op.done && op.result == cfxRemoteError);
    /* Rank 0's slots wait unread in rank 1's FIFO: abort, not destroy. */
    for (int r = 0; r < 2; r++)
        cr_assert_eq(cfxCommAbort(comms[r]), cfxSuccess);
}

/* An executor for host memory that counts its calls and lets the host
 * executor do the work, answering cfxInProgress from launch (as a stream
 * launch would) so that the core must wait. */
static int wrapped_launches, wrapped_waits, wrapped_ops;

static cfxResult_t counting_launch(const struct cfx_executor *exec, struct cfx_exec_batch *batch)
{
    (void)exec;
    wrapped_launches++;
    wrapped_ops += batch->n_ops;
    return cfxInProgress;
}

static cfxResult_t counting_test(const struct cfx_executor *exec, struct cfx_exec_batch *batch)
{
    (void)exec;
    return cfx_exec_host.test(&cfx_exec_host, batch);
}

static cfxResult_t counting_wait(const struct cfx_executor *exec, struct cfx_exec_batch *batch)
{
    (void)exec;
    wrapped_waits++;
    return cfx_exec_host.wait(&cfx_exec_host, batch);
}

static void counting_abort(const struct cfx_executor *exec, struct cfx_exec_batch *batch)
{
    (void)exec;
    cfx_exec_host.abort(&cfx_exec_host, batch);
}

static const struct cfx_executor counting_exec = {
    .version = CFX_EXEC_VERSION,
    .name = "counting",
    .launch = counting_launch,
    .test = counting_test,
    .wait = counting_wait,
    .abort = counting_abort,
};

/* The core launches through the executor registered for the buffers'
 * memory kind, once per group, and waits for a launch that is in progress. */
Test(exec, a_group_runs_on_the_executor_of_its_memory_kind_and_waits_for_it, .timeout = 60)
{
    cfxComm_t comms[2];
    init_two(comms);
    static float in[2][COUNT], out[2][COUNT];
    const struct cfx_executor *old = cfx_core_exec_set(CFX_MEM_HOST, &counting_exec);
    cr_assert_eq(old, &cfx_exec_host);
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    for (int r = 0; r < 2; r++) {
        fill(in[r], r);
        cr_assert_eq(cfxAllReduce(in[r], out[r], COUNT, cfxFloat32, cfxSum, comms[r], NULL),
                     cfxSuccess, "%s", cfxGetLastError(NULL));
    }
    cfxResult_t res = cfxGroupEnd();
    cfx_core_exec_set(CFX_MEM_HOST, old);
    cr_assert_eq(res, cfxSuccess, "%s", cfxGetLastError(NULL));
    cr_assert_eq(wrapped_launches, 1, "launches through the interface: %d", wrapped_launches);
    cr_assert_eq(wrapped_waits, 1, "waits after cfxInProgress: %d", wrapped_waits);
    cr_assert_geq(wrapped_ops, 2);
    for (int r = 0; r < 2; r++)
        expect_sum(out[r]);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(cfxCommDestroy(comms[r]), cfxSuccess);
}

/* An operation on device memory of a host rank (no CUDA state; in a build
 * without CUDA no executor serves device memory at all) is refused with a
 * sentence before it takes a sequence number, so its communicator stays
 * usable and in step with its peers. */
Test(exec, device_memory_of_a_host_rank_is_refused_before_anything_runs, .timeout = 60)
{
    cfxComm_t comm;
    cr_assert_eq(cfxCommInitAll(&comm, 1, NULL), cfxSuccess, "%s", cfxGetLastError(NULL));
    static float in[COUNT], out[COUNT];
    struct cfx_op op;
    cfx_op_clear(&op);
    op.kind = CFX_COLL_ALLREDUCE;
    op.sendbuff = in;
    op.recvbuff = out;
    op.count = COUNT;
    op.type = cfxFloat32;
    op.op = cfxSum;
    op.rank = 0;
    op.nranks = 1;
    op.abort_flag = &comm->abort_flag;
    op.owner = comm;
    op.mem_kind = CFX_MEM_DEVICE;
    uint64_t seq = comm->coll_seq;
#if CFX_HAVE_CUDA
    cr_assert_eq(cfx_core_launch(&op, 1), cfxInvalidUsage);
    cr_assert(strstr(cfxGetLastError(NULL), "cfxAllReduce: GPU buffers on rank 0, a host rank"),
              "sentence: %s", cfxGetLastError(NULL));
#else
    cr_assert_eq(cfx_core_launch(&op, 1), cfxInvalidArgument);
    cr_assert(strstr(cfxGetLastError(NULL),
                     "cfxAllReduce: GPU buffers are not supported by this build (no CUDA)"),
              "sentence: %s", cfxGetLastError(NULL));
#endif
    cr_assert_eq(comm->coll_seq, seq, "the refused call took a sequence number");
    cr_assert_eq(comm->async_error, cfxSuccess);
    fill(in, 0);
    cr_assert_eq(cfxAllReduce(in, out, COUNT, cfxFloat32, cfxSum, comm, NULL), cfxSuccess, "%s",
                 cfxGetLastError(NULL));
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

/* One executor runs a whole batch (a group's operations depend on each
 * other): a batch that mixes memory kinds is refused with a sentence before
 * anything runs. */
Test(exec, a_group_mixing_memory_kinds_is_refused_before_anything_runs, .timeout = 60)
{
    cfxComm_t comm;
    cr_assert_eq(cfxCommInitAll(&comm, 1, NULL), cfxSuccess, "%s", cfxGetLastError(NULL));
    static float in[2][COUNT], out[2][COUNT];
    struct cfx_op ops[2];
    for (int i = 0; i < 2; i++) {
        cfx_op_clear(&ops[i]);
        ops[i].kind = CFX_COLL_ALLREDUCE;
        ops[i].sendbuff = in[i];
        ops[i].recvbuff = out[i];
        ops[i].count = COUNT;
        ops[i].type = cfxFloat32;
        ops[i].op = cfxSum;
        ops[i].nranks = 1;
        ops[i].abort_flag = &comm->abort_flag;
        ops[i].owner = comm;
    }
    ops[1].mem_kind = CFX_MEM_DEVICE;
    uint64_t seq = comm->coll_seq;
    cr_assert_eq(cfx_core_launch(ops, 2), cfxInvalidUsage);
    cr_assert(strstr(cfxGetLastError(NULL), "the group mixes host and GPU buffers"), "sentence: %s",
              cfxGetLastError(NULL));
    cr_assert_eq(comm->coll_seq, seq, "the refused group took a sequence number");
    cr_assert_eq(comm->async_error, cfxSuccess);
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}
