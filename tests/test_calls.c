/*
 * The collective entry points' promises that a single process can show:
 * argument checks with sentences, group rules, one thread driving every
 * communicator of cfxCommInitAll through a group, one call at a time per
 * communicator, and what destroy does to handles, calls and groups.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "src/core/comm.h"
#include "tests/harness.h"

#define ASSERT_SENTENCE(comm, word)                                                                \
    cr_assert(strstr(cfxGetLastError(comm), (word)) != NULL,                                       \
              "cfxGetLastError does not mention \"%s\": \"%s\"", (word), cfxGetLastError(comm))

static cfxComm_t solo(void)
{
    cfxComm_t comm;
    cr_assert_eq(cfxCommInitAll(&comm, 1, NULL), cfxSuccess, "%s", cfxGetLastError(NULL));
    return comm;
}

Test(calls, null_communicator_is_an_invalid_argument_in_every_collective)
{
    float x = 0;
    cr_assert_eq(cfxAllReduce(&x, &x, 1, cfxFloat32, cfxSum, NULL, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "cfxAllReduce: comm is NULL");
    cr_assert_eq(cfxBroadcast(&x, &x, 1, cfxFloat32, 0, NULL, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxBcast(&x, 1, cfxFloat32, 0, NULL, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxReduce(&x, &x, 1, cfxFloat32, cfxSum, 0, NULL, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxAllGather(&x, &x, 1, cfxFloat32, NULL, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxReduceScatter(&x, &x, 1, cfxFloat32, cfxSum, NULL, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxSend(&x, 1, cfxFloat32, 0, NULL, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxRecv(&x, 1, cfxFloat32, 0, NULL, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "cfxRecv: comm is NULL");
}

Test(calls, bad_types_ops_roots_and_peers_are_invalid_arguments)
{
    cfxComm_t comm = solo();
    float x[4] = {0};
    cr_assert_eq(cfxAllReduce(x, x, 1, (cfxDataType_t)12, cfxSum, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "datatype 12");
    cr_assert_eq(cfxAllReduce(x, x, 1, cfxFloat32, (cfxRedOp_t)9, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "op 9");
    cr_assert_eq(cfxReduce(x, x, 1, cfxFloat32, cfxSum, 1, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "root = 1");
    cr_assert_eq(cfxBroadcast(x, x, 1, cfxFloat32, -1, comm, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxSend(x, 1, cfxFloat32, 3, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "peer = 3");
    cr_assert_eq(cfxRecv(x, 1, cfxFloat32, -2, comm, NULL), cfxInvalidArgument);
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

Test(calls, null_buffers_with_a_count_and_overflowing_counts_are_invalid_arguments)
{
    cfxComm_t comm = solo();
    float x[4] = {0};
    cr_assert_eq(cfxAllReduce(NULL, x, 4, cfxFloat32, cfxSum, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "sendbuff is NULL but count is 4");
    cr_assert_eq(cfxAllGather(x, NULL, 1, cfxFloat32, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "recvbuff is NULL");
    cr_assert_eq(cfxAllReduce(x, x, SIZE_MAX / 2, cfxFloat64, cfxSum, comm, NULL),
                 cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "overflows");
    /* Count 0 is a successful no-op, even with NULL buffers. */
    cr_assert_eq(cfxAllReduce(NULL, NULL, 0, cfxFloat32, cfxSum, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

Test(calls, partially_overlapping_buffers_are_refused_and_in_place_is_accepted)
{
    cfxComm_t comm = solo();
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    cr_assert_eq(cfxAllReduce(x, x + 1, 4, cfxFloat32, cfxSum, comm, NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "overlap");
    cr_assert_eq(cfxAllReduce(x, x, 4, cfxFloat32, cfxSum, comm, NULL), cfxSuccess);
    cr_assert_eq(x[0], 1.0f);
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

Test(calls, a_stream_without_a_usable_gpu_is_refused)
{
    cfxComm_t comm = solo();
    float x = 0;
    cfxResult_t res = cfxAllReduce(&x, &x, 1, cfxFloat32, cfxSum, comm, (cfxStream_t)0x1);
    cr_assert_eq(res, cfxInvalidArgument);
    ASSERT_SENTENCE(comm, "stream");
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

Test(calls, finalized_communicators_refuse_collectives)
{
    cfxComm_t comm = solo();
    float x = 0;
    cr_assert_eq(cfxCommFinalize(comm), cfxSuccess);
    cr_assert_eq(cfxAllReduce(&x, &x, 1, cfxFloat32, cfxSum, comm, NULL), cfxInvalidUsage);
    ASSERT_SENTENCE(comm, "finalized");
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

Test(groups, group_end_without_start_is_invalid_usage)
{
    cr_assert_eq(cfxGroupEnd(), cfxInvalidUsage);
    ASSERT_SENTENCE(NULL, "without cfxGroupStart");
}

Test(groups, a_send_to_self_outside_a_group_is_invalid_usage)
{
    cfxComm_t comm = solo();
    float x = 0;
    cr_assert_eq(cfxSend(&x, 1, cfxFloat32, 0, comm, NULL), cfxInvalidUsage);
    ASSERT_SENTENCE(comm, "inside a group");
    /* Inside a group with its match it works. */
    float y = 5, z = 0;
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    cr_assert_eq(cfxSend(&y, 1, cfxFloat32, 0, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxRecv(&z, 1, cfxFloat32, 0, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxGroupEnd(), cfxSuccess, "%s", cfxGetLastError(NULL));
    cr_assert_eq(z, 5.0f);
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

/* A send to this rank itself without its receive in the same group (or a
 * receive without its send) could never complete: refused at the group's
 * end, at once, naming the call, and the communicator still works. */
Test(groups, a_self_send_or_receive_without_its_match_in_the_group_is_refused_at_once,
     .timeout = 30)
{
    cfxComm_t comm = solo();
    float x[16] = {0}, y[16] = {0};
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    cr_assert_eq(cfxSend(x, 16, cfxFloat32, 0, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxGroupEnd(), cfxInvalidUsage, "%s", cfxGetLastError(NULL));
    ASSERT_SENTENCE(NULL, "rank 0's cfxSend to rank 0, itself (64 bytes)");
    ASSERT_SENTENCE(NULL, "no matching cfxRecv from rank 0, itself");
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    cr_assert_eq(cfxRecv(y, 16, cfxFloat32, 0, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxRecv(y, 16, cfxFloat32, 0, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxSend(x, 16, cfxFloat32, 0, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxGroupEnd(), cfxInvalidUsage, "%s", cfxGetLastError(NULL));
    ASSERT_SENTENCE(NULL, "rank 0's cfxRecv from rank 0, itself (64 bytes)");
    /* Refused before anything ran: a matched pair still works. */
    x[3] = 7;
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    cr_assert_eq(cfxSend(x, 16, cfxFloat32, 0, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxRecv(y, 16, cfxFloat32, 0, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxGroupEnd(), cfxSuccess, "%s", cfxGetLastError(NULL));
    cr_assert_eq(y[3], 7.0f);
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

Test(groups, a_refused_call_inside_a_group_fails_the_group_and_runs_nothing)
{
    cfxComm_t comm = solo();
    float x = 3, y = 0;
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    cr_assert_eq(cfxAllReduce(&x, &y, 1, cfxFloat32, cfxSum, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxAllReduce(&x, &y, 1, (cfxDataType_t)77, cfxSum, comm, NULL),
                 cfxInvalidArgument);
    cr_assert_eq(cfxGroupEnd(), cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "none ran");
    cr_assert_eq(y, 0.0f, "an operation of a failed group ran");
    /* The next group is clean. */
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    cr_assert_eq(cfxAllReduce(&x, &y, 1, cfxFloat32, cfxSum, comm, NULL), cfxSuccess);
    cr_assert_eq(cfxGroupEnd(), cfxSuccess);
    cr_assert_eq(y, 3.0f);
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
}

/* One thread drives all ranks of cfxCommInitAll: nested groups, sends and
 * receives in opposite orders, and allreduces, all started at the outer end. */
Test(groups, one_thread_drives_every_rank_of_init_all_in_nested_groups, .timeout = 60)
{
    enum { N = 4, COUNT = 300000 };
    cfxComm_t comms[N];
    cr_assert_eq(cfxCommInitAll(comms, N, NULL), cfxSuccess, "%s", cfxGetLastError(NULL));
    static float in[N][COUNT], out[N][COUNT], ring[N][COUNT];
    for (int r = 0; r < N; r++)
        for (int i = 0; i < COUNT; i++)
            in[r][i] = (float)(r + i % 7);
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    for (int r = 0; r < N; r++) {
        cr_assert_eq(cfxGroupStart(), cfxSuccess);
        /* Even ranks post the receive first, odd ranks the send. */
        int next = (r + 1) % N, prev = (r + N - 1) % N;
        if (r % 2 == 0) {
            cr_assert_eq(cfxRecv(ring[r], COUNT, cfxFloat32, prev, comms[r], NULL), cfxSuccess);
            cr_assert_eq(cfxSend(in[r], COUNT, cfxFloat32, next, comms[r], NULL), cfxSuccess);
        } else {
            cr_assert_eq(cfxSend(in[r], COUNT, cfxFloat32, next, comms[r], NULL), cfxSuccess);
            cr_assert_eq(cfxRecv(ring[r], COUNT, cfxFloat32, prev, comms[r], NULL), cfxSuccess);
        }
        cr_assert_eq(cfxAllReduce(in[r], out[r], COUNT, cfxFloat32, cfxSum, comms[r], NULL),
                     cfxSuccess);
        cr_assert_eq(cfxGroupEnd(), cfxSuccess, "the inner end must not start anything");
    }
    cr_assert_eq(cfxGroupEnd(), cfxSuccess, "%s", cfxGetLastError(NULL));
    for (int r = 0; r < N; r++)
        for (int i = 0; i < COUNT; i++) {
            cr_assert_eq(ring[r][i], in[(r + N - 1) % N][i], "rank %d element %d from prev", r, i);
            float expect = (float)(0 + 1 + 2 + 3 + 4 * (i % 7));
            cr_assert_eq(out[r][i], expect, "rank %d element %d of the allreduce", r, i);
        }
    for (int r = 0; r < N; r++)
        cr_assert_eq(cfxCommDestroy(comms[r]), cfxSuccess);
}

/* ------------------------------------------- one call at a time, destroy */

/* A call of rank 0 of a two-rank cfxCommInitAll, run in its own thread: it
 * blocks until rank 1 joins. */
struct blocked_call {
    pthread_t thread;
    cfxComm_t comm;
    float data[4096];
    cfxResult_t res;
};

static void *blocked_allreduce(void *arg)
{
    struct blocked_call *call = arg;
    call->res = cfxAllReduce(call->data, call->data, 4096, cfxFloat32, cfxSum, call->comm, NULL);
    return NULL;
}

/* Start @p call on @p comm and return once it is inside the communicator
 * (it holds it), or fail the test after 10 s. */
static void start_blocked_call(struct blocked_call *call, cfxComm_t comm)
{
    call->comm = comm;
    for (int i = 0; i < 4096; i++)
        call->data[i] = 1000.0f + (float)i;
    cr_assert_eq(pthread_create(&call->thread, NULL, blocked_allreduce, call), 0);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (__atomic_load_n(&comm->active_calls, __ATOMIC_ACQUIRE) == 0) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        cr_assert(now.tv_sec - start.tv_sec < 10, "the first call never entered the communicator");
        sched_yield();
    }
}

Test(calls, a_second_call_on_a_communicator_in_use_is_invalid_usage, .timeout = 60)
{
    cfx_test_setenv("CFX_TIMEOUT", "20");
    cfxComm_t comms[2];
    cr_assert_eq(cfxCommInitAll(comms, 2, NULL), cfxSuccess, "%s", cfxGetLastError(NULL));
    /* This thread queues an operation on rank 0 in a group ... */
    float mine[4096] = {0};
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    cr_assert_eq(cfxAllReduce(mine, mine, 4096, cfxFloat32, cfxSum, comms[0], NULL), cfxSuccess);
    /* ... then another thread enters a call on rank 0 and waits for rank 1. */
    static struct blocked_call first;
    start_blocked_call(&first, comms[0]);
    cr_assert_eq(cfxGroupEnd(), cfxInvalidUsage, "a group ran on a communicator in use");
    ASSERT_SENTENCE(NULL, "one call at a time");
    /* Every call on rank 0 is refused at once while the first one runs. */
    cr_assert_eq(cfxAllReduce(mine, mine, 4096, cfxFloat32, cfxSum, comms[0], NULL),
                 cfxInvalidUsage);
    ASSERT_SENTENCE(NULL, "one call at a time");
    cr_assert_eq(cfxBroadcast(mine, mine, 1, cfxFloat32, 0, comms[0], NULL), cfxInvalidUsage);
    cr_assert_eq(cfxCommFinalize(comms[0]), cfxInvalidUsage);
    cfxComm_t child = NULL;
    cr_assert_eq(cfxCommSplit(comms[0], 0, 0, &child, NULL), cfxInvalidUsage);
    cr_assert_null(child);
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    cr_assert_eq(cfxSend(mine, 1, cfxFloat32, 1, comms[0], NULL), cfxInvalidUsage);
    cr_assert_eq(cfxGroupEnd(), cfxInvalidUsage);
    ASSERT_SENTENCE(NULL, "none ran");
    /* Rank 1 joins: the first call completes with the right sums. */
    float other[4096];
    for (int i = 0; i < 4096; i++)
        other[i] = 2000.0f;
    cr_assert_eq(cfxAllReduce(other, other, 4096, cfxFloat32, cfxSum, comms[1], NULL), cfxSuccess,
                 "%s", cfxGetLastError(comms[1]));
    pthread_join(first.thread, NULL);
    cr_assert_eq(first.res, cfxSuccess, "%s", cfxGetLastError(comms[0]));
    for (int i = 0; i < 4096; i++) {
        cr_assert_eq(first.data[i], 3000.0f + (float)i, "rank 0 element %d", i);
        cr_assert_eq(other[i], 3000.0f + (float)i, "rank 1 element %d", i);
    }
    /* The communicator is free again. */
    for (int i = 0; i < 4096; i++)
        mine[i] = 1.0f;
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    cr_assert_eq(cfxAllReduce(mine, mine, 4096, cfxFloat32, cfxSum, comms[0], NULL), cfxSuccess);
    cr_assert_eq(cfxAllReduce(other, other, 4096, cfxFloat32, cfxSum, comms[1], NULL), cfxSuccess);
    cr_assert_eq(cfxGroupEnd(), cfxSuccess, "%s", cfxGetLastError(NULL));
    cr_assert_eq(mine[7], 1.0f + 3007.0f);
    cr_assert_eq(cfxCommDestroy(comms[0]), cfxSuccess);
    cr_assert_eq(cfxCommDestroy(comms[1]), cfxSuccess);
}

struct destroy_job {
    cfxComm_t comm;
    cfxResult_t res;
};

static void *destroy_job_run(void *arg)
{
    struct destroy_job *job = arg;
    job->res = cfxCommDestroy(job->comm);
    return NULL;
}

Test(calls, destroy_from_another_thread_fails_the_blocked_call_and_waits_for_it, .timeout = 60)
{
    cfx_test_setenv("CFX_TIMEOUT", "20");
    cfxComm_t comms[2];
    cr_assert_eq(cfxCommInitAll(comms, 2, NULL), cfxSuccess, "%s", cfxGetLastError(NULL));
    static struct blocked_call first;
    start_blocked_call(&first, comms[0]);
    /* Two threads destroy it at once: one does, the other is refused. */
    struct destroy_job second = {.comm = comms[0]};
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, destroy_job_run, &second), 0);
    cfxResult_t mine = cfxCommDestroy(comms[0]);
    pthread_join(thread, NULL);
    cr_assert((mine == cfxSuccess && second.res == cfxInvalidArgument) ||
                  (mine == cfxInvalidArgument && second.res == cfxSuccess),
              "two destroys returned %s and %s", cfxGetErrorString(mine),
              cfxGetErrorString(second.res));
    /* Destroy returned: the call has left the communicator, with an error. */
    pthread_join(first.thread, NULL);
    cr_assert_eq(first.res, cfxRemoteError, "a call cut short by destroy returned %s",
                 cfxGetErrorString(first.res));
    float x = 0;
    cr_assert_eq(cfxAllReduce(&x, &x, 1, cfxFloat32, cfxSum, comms[0], NULL), cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "not a live communicator");
    cr_assert_eq(cfxCommDestroy(comms[1]), cfxSuccess);
}

Test(calls, a_second_destroy_of_a_handle_is_an_invalid_argument)
{
    cfxComm_t comm = solo();
    cr_assert_eq(cfxCommDestroy(comm), cfxSuccess);
    cr_assert_eq(cfxCommDestroy(comm), cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "cfxCommDestroy: comm is not a live communicator");
    cr_assert_eq(cfxCommAbort(comm), cfxInvalidArgument);
    int count;
    cr_assert_eq(cfxCommCount(comm, &count), cfxInvalidArgument);
}

/* A one-rank communicator from cfxCommInitRank: fewer allocations between a
 * destroy and the next create than cfxCommInitAll, as in a program that
 * rebuilds its communicators. */
static cfxComm_t solo_rank(void)
{
    cfxUniqueId id;
    cfxComm_t comm = NULL;
    cr_assert_eq(cfxGetUniqueId(&id), cfxSuccess);
    cr_assert_eq(cfxCommInitRank(&comm, 1, id, 0), cfxSuccess, "%s", cfxGetLastError(NULL));
    return comm;
}

Test(calls, a_stale_handle_never_reaches_a_newer_communicator)
{
    enum { N = 8 };
    cfxComm_t old = solo_rank(), fresh[N];
    cr_assert_eq(cfxCommDestroy(old), cfxSuccess);
    for (int i = 0; i < N; i++) {
        fresh[i] = solo_rank();
        cr_assert_eq(cfxCommDestroy(old), cfxInvalidArgument,
                     "the stale handle destroyed something (new communicator %d)", i);
        float x = 2;
        cr_assert_eq(cfxAllReduce(&x, &x, 1, cfxFloat32, cfxSum, old, NULL), cfxInvalidArgument);
        cr_assert_eq(cfxAllReduce(&x, &x, 1, cfxFloat32, cfxSum, fresh[i], NULL), cfxSuccess, "%s",
                     cfxGetLastError(fresh[i]));
        if (i % 2 == 0)
            cr_assert_eq(cfxCommDestroy(fresh[i]), cfxSuccess);
    }
    for (int i = 1; i < N; i += 2)
        cr_assert_eq(cfxCommDestroy(fresh[i]), cfxSuccess);
}

Test(groups, destroying_a_communicator_with_a_queued_operation_fails_the_group)
{
    cfxComm_t gone = solo(), kept = solo();
    float x = 3, y = 0, u = 4, v = 0;
    cr_assert_eq(cfxGroupStart(), cfxSuccess);
    cr_assert_eq(cfxAllReduce(&x, &y, 1, cfxFloat32, cfxSum, gone, NULL), cfxSuccess);
    cr_assert_eq(cfxAllReduce(&u, &v, 1, cfxFloat32, cfxSum, kept, NULL), cfxSuccess);
    cr_assert_eq(cfxCommDestroy(gone), cfxSuccess);
    cr_assert_eq(cfxGroupEnd(), cfxInvalidArgument);
    ASSERT_SENTENCE(NULL, "destroyed");
    cr_assert_eq(y, 0.0f, "an operation of a destroyed communicator ran");
    /* The operations of live communicators ran, so their peers are not left waiting. */
    cr_assert_eq(v, 4.0f);
    cr_assert_eq(cfxCommDestroy(kept), cfxSuccess);
}
