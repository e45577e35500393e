/*
 * An outside MPI program written against conflux.h the way an NCCL user
 * writes one: MPI shares the unique id, then every collective, data type and
 * op runs on host buffers and is checked against tests/coll_check.h; alltoall,
 * gather and scatter are checked against MPI's own (MPI_BYTE blocks).
 * Usage: mpirun -np N ./mpi_collectives   (prints one summary line on rank 0)
 */
#include <conflux.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/coll_check.h"

#define CFXCHECK(call)                                                                             \
    do {                                                                                           \
        cfxResult_t r_ = (call);                                                                   \
        if (r_ != cfxSuccess) {                                                                    \
            fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, #call, cfxGetErrorString(r_),   \
                    cfxGetLastError(comm));                                                        \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

static int rank, nranks;
static cfxComm_t comm;
static long checks, failures;

static void expect(int ok, const char *what, cfxDataType_t t, int op, size_t i)
{
    checks++;
    if (!ok && failures++ < 10)
        fprintf(stderr, "rank %d: %s type %d op %d element %zu wrong\n", rank, what, (int)t, op, i);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    cfxUniqueId id;
    if (rank == 0)
        CFXCHECK(cfxGetUniqueId(&id));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    CFXCHECK(cfxCommInitRank(&comm, nranks, id, rank));

    const size_t counts[] = {1, 1000 + 7};
    size_t max_count = 1007 * (size_t)nranks;
    char *send = malloc(max_count * 8), *recv = malloc(max_count * 8);
    char *mpi_recv = malloc(max_count * 8);
    for (int t = 0; t < cfxNumTypes; t++) {
        size_t es = ref_size((cfxDataType_t)t);
        for (size_t ci = 0; ci < 2; ci++) {
            size_t count = counts[ci];
            for (int op = 0; op < cfxNumOps; op++) {
                int seed = t * 10 + op + (int)ci;
                double v;
                uint64_t bits;
                /* allreduce */
                ref_fill((cfxDataType_t)t, (cfxRedOp_t)op, rank, seed, send, count);
                CFXCHECK(
                    cfxAllReduce(send, recv, count, (cfxDataType_t)t, (cfxRedOp_t)op, comm, NULL));
                for (size_t i = 0; i < count; i++) {
                    ref_reduce((cfxDataType_t)t, (cfxRedOp_t)op, nranks, i, seed, &v, &bits);
                    expect(ref_matches((cfxDataType_t)t, (cfxRedOp_t)op, recv + i * es, v, bits),
                           "allreduce", (cfxDataType_t)t, op, i);
                }
                /* reduce to the last rank */
                int root = nranks - 1;
                CFXCHECK(cfxReduce(send, recv, count, (cfxDataType_t)t, (cfxRedOp_t)op, root, comm,
                                   NULL));
                for (size_t i = 0; rank == root && i < count; i++) {
                    ref_reduce((cfxDataType_t)t, (cfxRedOp_t)op, nranks, i, seed, &v, &bits);
                    expect(ref_matches((cfxDataType_t)t, (cfxRedOp_t)op, recv + i * es, v, bits),
                           "reduce", (cfxDataType_t)t, op, i);
                }
                /* reduce-scatter */
                ref_fill((cfxDataType_t)t, (cfxRedOp_t)op, rank, seed, send,
                         count * (size_t)nranks);
                CFXCHECK(cfxReduceScatter(send, recv, count, (cfxDataType_t)t, (cfxRedOp_t)op, comm,
                                          NULL));
                for (size_t i = 0; i < count; i++) {
                    ref_reduce((cfxDataType_t)t, (cfxRedOp_t)op, nranks, (size_t)rank * count + i,
                               seed, &v, &bits);
                    expect(ref_matches((cfxDataType_t)t, (cfxRedOp_t)op, recv + i * es, v, bits),
                           "reducescatter", (cfxDataType_t)t, op, i);
                }
            }
            /* Data movement: the bytes of rank r's input. */
            ref_fill((cfxDataType_t)t, cfxMax, rank, t, send, count);
            CFXCHECK(cfxAllGather(send, recv, count, (cfxDataType_t)t, comm, NULL));
            for (int q = 0; q < nranks; q++) {
                char expected[8];
                for (size_t i = 0; i < count; i++) {
                    ref_store((cfxDataType_t)t, expected,
                              (double)ref_input((cfxDataType_t)t, cfxMax, q, i, t),
                              (uint64_t)ref_input((cfxDataType_t)t, cfxMax, q, i, t));
                    expect(memcmp(recv + ((size_t)q * count + i) * es, expected, es) == 0,
                           "allgather", (cfxDataType_t)t, -1, i);
                }
            }
            int root = 1 % nranks;
            memcpy(recv, send, count * es);
            CFXCHECK(cfxBroadcast(send, recv, count, (cfxDataType_t)t, root, comm, NULL));
            for (size_t i = 0; i < count; i++) {
                char expected[8];
                int64_t x = ref_input((cfxDataType_t)t, cfxMax, root, i, t);
                ref_store((cfxDataType_t)t, expected, (double)x, (uint64_t)x);
                expect(memcmp(recv + i * es, expected, es) == 0, "broadcast", (cfxDataType_t)t, -1,
                       i);
            }
            /* alltoall, gather, scatter: the same bytes as MPI's */
            int block = (int)(count * es);
            ref_fill((cfxDataType_t)t, cfxMax, rank, t + 7, send, count * (size_t)nranks);
            CFXCHECK(cfxAlltoAll(send, recv, count, (cfxDataType_t)t, comm, NULL));
            MPI_Alltoall(send, block, MPI_BYTE, mpi_recv, block, MPI_BYTE, MPI_COMM_WORLD);
            expect(memcmp(recv, mpi_recv, (size_t)block * (size_t)nranks) == 0, "alltoall",
                   (cfxDataType_t)t, -1, 0);
            for (int gr = 0; gr < nranks; gr++) {
                CFXCHECK(cfxGather(send, recv, count, (cfxDataType_t)t, gr, comm, NULL));
                MPI_Gather(send, block, MPI_BYTE, mpi_recv, block, MPI_BYTE, gr, MPI_COMM_WORLD);
                if (rank == gr)
                    expect(memcmp(recv, mpi_recv, (size_t)block * (size_t)nranks) == 0, "gather",
                           (cfxDataType_t)t, -1, 0);
                CFXCHECK(cfxScatter(send, recv, count, (cfxDataType_t)t, gr, comm, NULL));
                MPI_Scatter(send, block, MPI_BYTE, mpi_recv, block, MPI_BYTE, gr, MPI_COMM_WORLD);
                expect(memcmp(recv, mpi_recv, (size_t)block) == 0, "scatter", (cfxDataType_t)t, -1,
                       0);
            }
            ref_fill((cfxDataType_t)t, cfxMax, rank, t, send, count); /* send/recv's input */
            /* send/recv around the ring, in a group */
            int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
            CFXCHECK(cfxGroupStart());
            CFXCHECK(cfxSend(send, count, (cfxDataType_t)t, next, comm, NULL));
            CFXCHECK(cfxRecv(recv, count, (cfxDataType_t)t, prev, comm, NULL));
            CFXCHECK(cfxGroupEnd());
            for (size_t i = 0; i < count; i++) {
                char expected[8];
                int64_t x = ref_input((cfxDataType_t)t, cfxMax, prev, i, t);
                ref_store((cfxDataType_t)t, expected, (double)x, (uint64_t)x);
                expect(memcmp(recv + i * es, expected, es) == 0, "send/recv", (cfxDataType_t)t, -1,
                       i);
            }
        }
    }
    CFXCHECK(cfxCommFinalize(comm));
    CFXCHECK(cfxCommDestroy(comm));
    long totals[2] = {checks, failures}, sums[2];
    MPI_Reduce(totals, sums, 2, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("mpi conformance, %d ranks: %ld checks, %ld wrong\n", nranks, sums[0], sums[1]);
    free(send);
    free(recv);
    free(mpi_recv);
    MPI_Finalize();
    return failures ? 1 : 0;
}
