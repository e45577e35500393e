/*
 * The collectives conflux-perf measures, one table entry each. Counts, in-place
 * offsets and bus-bandwidth factors are nccl-tests' (doc/PERFORMANCE.md there):
 * for a size of `count` elements,
 *   allreduce      count in, count out              busbw = algbw * 2(n-1)/n
 *   reducescatter  n*(count/n) in, count/n out      busbw = algbw * (n-1)/n
 *   allgather      count/n in, n*(count/n) out      busbw = algbw * (n-1)/n
 *   broadcast, reduce, sendrecv: count in and out   busbw = algbw
 *   alltoall       n*(count/n) in and out           busbw = algbw * (n-1)/n
 *   gather         count/n in, n*(count/n) out      busbw = algbw * (n-1)/n
 *   scatter        n*(count/n) in, count/n out      busbw = algbw * (n-1)/n
 * and algbw is the larger of the send and receive sizes over the time, so
 * for allgather and reducescatter the size is the total, not one rank's block.
 * Keep the table in subcommand order.
 */
#include <string.h>

#include "perf.h"

/* ------------------------------------------------------------ counts */

static void same_counts(size_t count, int nranks, struct perf_counts *counts_p)
{
    (void)nranks;
    counts_p->send = count;
    counts_p->recv = count;
    counts_p->param = count;
    counts_p->send_inplace_offset = 0;
    counts_p->recv_inplace_offset = 0;
}

static void allgather_counts(size_t count, int nranks, struct perf_counts *counts_p)
{
    size_t block = count / (size_t)nranks;
    counts_p->send = block;
    counts_p->recv = block * (size_t)nranks;
    counts_p->param = block;
    counts_p->send_inplace_offset = block; /* rank's block of recvbuff */
    counts_p->recv_inplace_offset = 0;
}

static void reducescatter_counts(size_t count, int nranks, struct perf_counts *counts_p)
{
    size_t block = count / (size_t)nranks;
    counts_p->send = block * (size_t)nranks;
    counts_p->recv = block;
    counts_p->param = block;
    counts_p->send_inplace_offset = 0;
    counts_p->recv_inplace_offset = block; /* rank's block of sendbuff */
}

static void alltoall_counts(size_t count, int nranks, struct perf_counts *counts_p)
{
    size_t block = count / (size_t)nranks;
    counts_p->send = block * (size_t)nranks;
    counts_p->recv = block * (size_t)nranks;
    counts_p->param = block;
    counts_p->send_inplace_offset = 0;
    counts_p->recv_inplace_offset = 0;
}

/* ------------------------------------------------------------ bus factors */

static double factor_one(int nranks)
{
    (void)nranks;
    return 1.0;
}

static double factor_allreduce(int nranks)
{
    return 2.0 * (double)(nranks - 1) / (double)nranks;
}

static double factor_gather_scatter(int nranks)
{
    return (double)(nranks - 1) / (double)nranks;
}

/* ------------------------------------------------------------ calls */

static cfxResult_t run_allreduce(const void *sendbuff, void *recvbuff, size_t count,
                                 cfxDataType_t type, cfxRedOp_t op, int root, cfxComm_t comm,
                                 cfxStream_t stream)
{
    (void)root;
    return cfxAllReduce(sendbuff, recvbuff, count, type, op, comm, stream);
}

static cfxResult_t run_broadcast(const void *sendbuff, void *recvbuff, size_t count,
                                 cfxDataType_t type, cfxRedOp_t op, int root, cfxComm_t comm,
                                 cfxStream_t stream)
{
    (void)op;
    return cfxBroadcast(sendbuff, recvbuff, count, type, root, comm, stream);
}

static cfxResult_t run_reduce(const void *sendbuff, void *recvbuff, size_t count,
                              cfxDataType_t type, cfxRedOp_t op, int root, cfxComm_t comm,
                              cfxStream_t stream)
{
    return cfxReduce(sendbuff, recvbuff, count, type, op, root, comm, stream);
}

static cfxResult_t run_allgather(const void *sendbuff, void *recvbuff, size_t count,
                                 cfxDataType_t type, cfxRedOp_t op, int root, cfxComm_t comm,
                                 cfxStream_t stream)
{
    (void)op;
    (void)root;
    return cfxAllGather(sendbuff, recvbuff, count, type, comm, stream);
}

static cfxResult_t run_reducescatter(const void *sendbuff, void *recvbuff, size_t count,
                                     cfxDataType_t type, cfxRedOp_t op, int root, cfxComm_t comm,
                                     cfxStream_t stream)
{
    (void)root;
    return cfxReduceScatter(sendbuff, recvbuff, count, type, op, comm, stream);
}

/* A ring shift, as nccl-tests' sendrecv_perf: send to rank+1, receive from
 * rank-1, both in one group. */
static cfxResult_t run_sendrecv(const void *sendbuff, void *recvbuff, size_t count,
                                cfxDataType_t type, cfxRedOp_t op, int root, cfxComm_t comm,
                                cfxStream_t stream)
{
    (void)op;
    (void)root;
    int nranks, rank;
    cfxResult_t res = cfxCommCount(comm, &nranks);
    if (res == cfxSuccess)
        res = cfxCommUserRank(comm, &rank);
    if (res != cfxSuccess)
        return res;
    res = cfxGroupStart();
    if (res != cfxSuccess)
        return res;
    res = cfxSend(sendbuff, count, type, (rank + 1) % nranks, comm, stream);
    if (res == cfxSuccess)
        res = cfxRecv(recvbuff, count, type, (rank - 1 + nranks) % nranks, comm, stream);
    /* Always close the group, so a failure does not leave it open. */
    cfxResult_t end_res = cfxGroupEnd();
    return res != cfxSuccess ? res : end_res;
}

static cfxResult_t run_alltoall(const void *sendbuff, void *recvbuff, size_t count,
                                cfxDataType_t type, cfxRedOp_t op, int root, cfxComm_t comm,
                                cfxStream_t stream)
{
    (void)op;
    (void)root;
    return cfxAlltoAll(sendbuff, recvbuff, count, type, comm, stream);
}

static cfxResult_t run_gather(const void *sendbuff, void *recvbuff, size_t count,
                              cfxDataType_t type, cfxRedOp_t op, int root, cfxComm_t comm,
                              cfxStream_t stream)
{
    (void)op;
    return cfxGather(sendbuff, recvbuff, count, type, root, comm, stream);
}

static cfxResult_t run_scatter(const void *sendbuff, void *recvbuff, size_t count,
                               cfxDataType_t type, cfxRedOp_t op, int root, cfxComm_t comm,
                               cfxStream_t stream)
{
    (void)op;
    return cfxScatter(sendbuff, recvbuff, count, type, root, comm, stream);
}

/* ------------------------------------------------------------ the table */

static const struct perf_coll colls[] = {
    {
        .name = "allreduce",
        .kind = PERF_ALLREDUCE,
        .flags = PERF_COLL_HAS_OP,
        .counts = same_counts,
        .bus_factor = factor_allreduce,
        .run = run_allreduce,
    },
    {
        .name = "broadcast",
        .kind = PERF_BROADCAST,
        .flags = PERF_COLL_HAS_ROOT,
        .counts = same_counts,
        .bus_factor = factor_one,
        .run = run_broadcast,
    },
    {
        .name = "reduce",
        .kind = PERF_REDUCE,
        .flags = PERF_COLL_HAS_OP | PERF_COLL_HAS_ROOT,
        .counts = same_counts,
        .bus_factor = factor_one,
        .run = run_reduce,
    },
    {
        .name = "allgather",
        .kind = PERF_ALLGATHER,
        .flags = 0,
        .counts = allgather_counts,
        .bus_factor = factor_gather_scatter,
        .run = run_allgather,
    },
    {
        .name = "reducescatter",
        .kind = PERF_REDUCESCATTER,
        .flags = PERF_COLL_HAS_OP,
        .counts = reducescatter_counts,
        .bus_factor = factor_gather_scatter,
        .run = run_reducescatter,
    },
    {
        .name = "sendrecv",
        .kind = PERF_SENDRECV,
        .flags = PERF_COLL_NO_INPLACE_CHECK,
        .counts = same_counts,
        .bus_factor = factor_one,
        .run = run_sendrecv,
    },
    {
        .name = "alltoall",
        .kind = PERF_ALLTOALL,
        .flags = PERF_COLL_NO_INPLACE,
        .counts = alltoall_counts,
        .bus_factor = factor_gather_scatter,
        .run = run_alltoall,
    },
    {
        .name = "gather",
        .kind = PERF_GATHER,
        .flags = PERF_COLL_HAS_ROOT,
        .counts = allgather_counts, /* In place: sendbuff = recvbuff + rank*block. */
        .bus_factor = factor_gather_scatter,
        .run = run_gather,
    },
    {
        .name = "scatter",
        .kind = PERF_SCATTER,
        .flags = PERF_COLL_HAS_ROOT,
        .counts = reducescatter_counts, /* In place: recvbuff = sendbuff + rank*block. */
        .bus_factor = factor_gather_scatter,
        .run = run_scatter,
    },
};

const struct perf_coll *perf_coll_find(const char *name)
{
    for (size_t i = 0; i < sizeof(colls) / sizeof(colls[0]); i++)
        if (strcmp(colls[i].name, name) == 0)
            return &colls[i];
    return NULL;
}

const char *perf_coll_names(void)
{
    return "allreduce|broadcast|reduce|allgather|reducescatter|sendrecv|alltoall|gather|scatter";
}
