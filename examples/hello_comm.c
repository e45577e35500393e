/*
 * hello_comm: four local processes form a communicator, split it in two, and
 * say who is who. Run: ./hello_comm [nranks]
 *
 * Rank 0 makes the unique id and hands it to the others through a pipe, the
 * way an MPI program would use MPI_Bcast.
 */
#define _POSIX_C_SOURCE 200809L
#include <conflux.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cfxResult_t res_ = (call);                                                                 \
        if (res_ != cfxSuccess) {                                                                  \
            fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, #call, cfxGetErrorString(res_), \
                    cfxGetLastError(NULL));                                                        \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static int run_rank(int rank, int nranks, int id_pipe[2])
{
    cfxUniqueId id;
    if (rank == 0) {
        CHECK(cfxGetUniqueId(&id));
        for (int r = 1; r < nranks; r++)
            if (write(id_pipe[1], &id, sizeof(id)) != (ssize_t)sizeof(id))
                return 1;
    } else if (read(id_pipe[0], &id, sizeof(id)) != (ssize_t)sizeof(id)) {
        return 1;
    }
    cfxComm_t comm, half;
    int count, me, device, half_rank, half_count;
    CHECK(cfxCommInitRank(&comm, nranks, id, rank));
    CHECK(cfxCommCount(comm, &count));
    CHECK(cfxCommUserRank(comm, &me));
    CHECK(cfxCommCuDevice(comm, &device));
    /* Even and odd ranks each form a child communicator, in reverse order. */
    CHECK(cfxCommSplit(comm, rank % 2, -rank, &half, NULL));
    CHECK(cfxCommUserRank(half, &half_rank));
    CHECK(cfxCommCount(half, &half_count));
    printf("rank %d of %d: pid %d, %s, %s half: rank %d of %d\n", me, count, (int)getpid(),
           device < 0 ? "host only" : "GPU", rank % 2 ? "odd" : "even", half_rank, half_count);
    fflush(stdout);
    CHECK(cfxCommFinalize(half));
    CHECK(cfxCommDestroy(half));
    CHECK(cfxCommFinalize(comm));
    CHECK(cfxCommDestroy(comm));
    return 0;
}

int main(int argc, char **argv)
{
    int nranks = argc > 1 ? atoi(argv[1]) : 4;
    if (nranks < 1 || nranks > 64) {
        fprintf(stderr, "usage: %s [nranks 1..64]\n", argv[0]);
        return 2;
    }
    /* A single-host demo: keep the bootstrap on loopback unless told otherwise. */
    setenv("CFX_SOCKET_IFNAME", "lo", 0);
    int id_pipe[2];
    if (pipe(id_pipe) != 0)
        return 1;
    for (int r = 0; r < nranks; r++) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(run_rank(r, nranks, id_pipe));
        if (pid < 0) {
            perror("fork");
            return 1;
        }
    }
    int failures = 0, status;
    while (wait(&status) > 0)
        failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("%s: %d ranks, %d failed\n", failures ? "FAILED" : "OK", nranks, failures);
    return failures ? 1 : 0;
}
