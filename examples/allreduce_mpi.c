/*
 * allreduce_mpi: MPI starts the processes and carries the unique id; Conflux
 * does the allreduce. The pattern of every NCCL + MPI program.
 *
 *   mpirun -np 4 ./allreduce_mpi [count]
 *
 * Rank 0 calls cfxGetUniqueId and MPI_Bcast hands the id to the others; each
 * rank then calls cfxCommInitRank with its MPI rank. Set CFX_SOCKET_IFNAME
 * (e.g. mpirun -x CFX_SOCKET_IFNAME=lo for a single machine) to choose the
 * interface Conflux uses between hosts.
 *
 * Each rank prints one line and rank 0 a summary; the exit code is non-zero
 * when any rank got a wrong result or a call failed.
 */
#include <conflux.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

/* A failed Conflux call on one rank would leave the others waiting for it:
 * MPI_Abort ends them all with a non-zero exit code. */
#define CFX_OR_ABORT(call)                                                                         \
    do {                                                                                           \
        cfxResult_t res_ = (call);                                                                 \
        if (res_ != cfxSuccess) {                                                                  \
            fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, #call, cfxGetErrorString(res_), \
                    cfxGetLastError(NULL));                                                        \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
        }                                                                                          \
    } while (0)

/* Small integers: every partial sum is exact in float, in any order. */
static float input_value(int rank, size_t i)
{
    return (float)(i % 1024) + (float)rank;
}

static float expected_sum(int nranks, size_t i)
{
    return (float)nranks * (float)(i % 1024) + (float)(nranks * (nranks - 1) / 2);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    long count_arg = argc > 1 ? atol(argv[1]) : 1 << 20;
    if (argc > 2 || count_arg < 1 || nranks > 4096) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np <1..4096> %s [count >= 1]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    size_t count = (size_t)count_arg;

    cfxUniqueId id;
    if (rank == 0)
        CFX_OR_ABORT(cfxGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    cfxComm_t comm;
    CFX_OR_ABORT(cfxCommInitRank(&comm, nranks, id, rank));

    float *send = malloc(count * sizeof(float)), *recv = malloc(count * sizeof(float));
    if (send == NULL || recv == NULL) {
        fprintf(stderr, "rank %d: out of memory for %zu floats\n", rank, count);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (size_t i = 0; i < count; i++) {
        send[i] = input_value(rank, i);
        recv[i] = -1.0f;
    }
    CFX_OR_ABORT(cfxAllReduce(send, recv, count, cfxFloat, cfxSum, comm, NULL));

    long wrong = 0;
    for (size_t i = 0; i < count; i++) {
        if (recv[i] != expected_sum(nranks, i) && wrong++ == 0)
            fprintf(stderr, "rank %d: element %zu is %g, expected %g\n", rank, i, (double)recv[i],
                    (double)expected_sum(nranks, i));
    }
    printf("rank %d of %d: allreduce of %zu floats %s\n", rank, nranks, count,
           wrong ? "WRONG" : "OK");
    fflush(stdout);

    int failed = wrong != 0, failed_ranks = 0;
    MPI_Allreduce(&failed, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("%s: %d ranks, %d failed\n", failed_ranks ? "FAILED" : "OK", nranks, failed_ranks);

    CFX_OR_ABORT(cfxCommFinalize(comm));
    CFX_OR_ABORT(cfxCommDestroy(comm));
    free(send);
    free(recv);
    MPI_Finalize();
    return failed_ranks ? 1 : 0;
}
