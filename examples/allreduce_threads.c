/*
 * allreduce_threads: one process holds every rank of a communicator and one
 * thread drives them all, the way a single-process multi-GPU NCCL program
 * does. Run: ./allreduce_threads [nranks] [count]
 *
 * cfxCommInitAll creates the nranks communicators. Inside one
 * cfxGroupStart/cfxGroupEnd the thread queues one cfxAllReduce per rank;
 * cfxGroupEnd starts them together and returns when all are done. Without the
 * group, the first cfxAllReduce would wait for ranks that never get called.
 *
 * Prints one line; exits 0 only when every rank holds the exact sum.
 */
#define _POSIX_C_SOURCE 200809L
#include <conflux.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_RANKS 64

/* Small integers: every partial sum is exact in float, in any order. */
static float input_value(int rank, size_t i)
{
    return (float)(i % 1024) + (float)rank;
}

static float expected_sum(int nranks, size_t i)
{
    return (float)nranks * (float)(i % 1024) + (float)(nranks * (nranks - 1) / 2);
}

static int report(const char *what, cfxResult_t res)
{
    fprintf(stderr, "allreduce_threads: %s failed: %s (%s)\n", what, cfxGetErrorString(res),
            cfxGetLastError(NULL));
    return 1;
}

int main(int argc, char **argv)
{
    int nranks = argc > 1 ? atoi(argv[1]) : 4;
    long count_arg = argc > 2 ? atol(argv[2]) : 1 << 20;
    if (argc > 3 || nranks < 1 || nranks > MAX_RANKS || count_arg < 1) {
        fprintf(stderr, "usage: %s [nranks 1..%d] [count >= 1]\n", argv[0], MAX_RANKS);
        return 2;
    }
    size_t count = (size_t)count_arg;
    /* A single-process demo: keep sockets on loopback unless told otherwise. */
    setenv("CFX_SOCKET_IFNAME", "lo", 0);

    cfxComm_t comms[MAX_RANKS];
    float *send[MAX_RANKS] = {NULL}, *recv[MAX_RANKS] = {NULL};
    int status = 1;
    for (int r = 0; r < nranks; r++) {
        send[r] = malloc(count * sizeof(float));
        recv[r] = malloc(count * sizeof(float));
        if (send[r] == NULL || recv[r] == NULL) {
            fprintf(stderr, "allreduce_threads: out of memory for %zu floats\n", count);
            goto out_free;
        }
        for (size_t i = 0; i < count; i++) {
            send[r][i] = input_value(r, i);
            recv[r][i] = -1.0f;
        }
    }

    cfxResult_t res = cfxCommInitAll(comms, nranks, NULL);
    if (res != cfxSuccess) {
        report("cfxCommInitAll", res);
        goto out_free;
    }

    /* One thread, every rank: queue them all, then run them together. */
    res = cfxGroupStart();
    for (int r = 0; r < nranks && res == cfxSuccess; r++)
        res = cfxAllReduce(send[r], recv[r], count, cfxFloat, cfxSum, comms[r], NULL);
    cfxResult_t end_res = cfxGroupEnd();
    if (res != cfxSuccess || end_res != cfxSuccess) {
        report(res != cfxSuccess ? "cfxAllReduce" : "cfxGroupEnd",
               res != cfxSuccess ? res : end_res);
        goto out_destroy;
    }

    int wrong_ranks = 0;
    for (int r = 0; r < nranks; r++) {
        for (size_t i = 0; i < count; i++) {
            if (recv[r][i] != expected_sum(nranks, i)) {
                fprintf(stderr, "allreduce_threads: rank %d element %zu is %g, expected %g\n", r, i,
                        (double)recv[r][i], (double)expected_sum(nranks, i));
                wrong_ranks++;
                break;
            }
        }
    }
    printf("%s: allreduce of %zu floats over %d ranks in one process, %d wrong\n",
           wrong_ranks ? "FAILED" : "OK", count, nranks, wrong_ranks);
    status = wrong_ranks ? 1 : 0;

out_destroy:
    /* cfxCommFinalize is a blocking barrier over the ranks, which one thread
     * cannot enter for all of them; every operation has completed, so each
     * communicator is simply released (cfxCommDestroy waits for no peer). */
    for (int r = 0; r < nranks; r++)
        cfxCommDestroy(comms[r]);
out_free:
    for (int r = 0; r < nranks; r++) {
        free(send[r]);
        free(recv[r]);
    }
    return status;
}
