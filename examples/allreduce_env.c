/*
 * allreduce_env: one rank per process, started by anything that sets the
 * torchrun-style variables, no launcher library needed.
 *
 *   RANK=r WORLD_SIZE=n MASTER_ADDR=host MASTER_PORT=port ./allreduce_env [count]
 *
 * Every rank sets CFX_COMM_ID=MASTER_ADDR:MASTER_PORT, so cfxGetUniqueId
 * returns the same id everywhere and rank 0 listens at that address; no id
 * has to travel between the processes. MASTER_ADDR must be an address of
 * rank 0's host. examples/launch_local.sh starts n ranks on this machine.
 *
 * Prints one line; exits 0 only when this rank holds the exact sum.
 */
#define _POSIX_C_SOURCE 200809L
#include <conflux.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Small integers: every partial sum is exact in float, in any order. */
static float input_value(int rank, size_t i)
{
    return (float)(i % 1024) + (float)rank;
}

static float expected_sum(int nranks, size_t i)
{
    return (float)nranks * (float)(i % 1024) + (float)(nranks * (nranks - 1) / 2);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int usage(const char *prog, const char *problem)
{
    fprintf(stderr,
            "%s: %s\n"
            "usage: RANK=r WORLD_SIZE=n MASTER_ADDR=host MASTER_PORT=port %s [count]\n"
            "  RANK         this process's rank, 0 <= r < n\n"
            "  WORLD_SIZE   number of ranks, 1 <= n <= 4096\n"
            "  MASTER_ADDR  address of rank 0's host, e.g. 127.0.0.1\n"
            "  MASTER_PORT  free TCP port there, e.g. 29500\n"
            "  count        floats to allreduce (default 1048576)\n"
            "Set CFX_SOCKET_IFNAME (e.g. lo) to choose the interface.\n",
            prog, problem, prog);
    return 2;
}

/* Parse a whole decimal number in [min, max]; 0 on success. */
static int parse_long(const char *text, long min, long max, long *value_p)
{
    if (text == NULL || text[0] == '\0')
        return -1;
    char *end = NULL;
    long value = strtol(text, &end, 10);
    if (*end != '\0' || value < min || value > max)
        return -1;
    *value_p = value;
    return 0;
}

int main(int argc, char **argv)
{
    const char *rank_text = getenv("RANK"), *size_text = getenv("WORLD_SIZE");
    const char *addr = getenv("MASTER_ADDR"), *port_text = getenv("MASTER_PORT");
    long rank_arg, nranks_arg, port, count_arg = 1 << 20;
    if (!rank_text || !size_text || !addr || !port_text || !addr[0])
        return usage(argv[0], "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT must all be set");
    /* Up to 4096 ranks every sum stays below 2^24, exact in float. */
    if (parse_long(size_text, 1, 4096, &nranks_arg) != 0)
        return usage(argv[0], "WORLD_SIZE is not a number in [1, 4096]");
    if (parse_long(rank_text, 0, nranks_arg - 1, &rank_arg) != 0)
        return usage(argv[0], "RANK is not a number in [0, WORLD_SIZE)");
    if (parse_long(port_text, 1, 65535, &port) != 0)
        return usage(argv[0], "MASTER_PORT is not a port number");
    if (argc > 2 || (argc == 2 && parse_long(argv[1], 1, 1L << 30, &count_arg) != 0))
        return usage(argv[0], "count must be one number in [1, 2^30]");
    int rank = (int)rank_arg, nranks = (int)nranks_arg;
    size_t count = (size_t)count_arg;

    /* host:port, with an IPv6 address in brackets. */
    char comm_id[300];
    int bracket = strchr(addr, ':') != NULL && addr[0] != '[';
    if (snprintf(comm_id, sizeof(comm_id), bracket ? "[%s]:%ld" : "%s:%ld", addr, port) >=
        (int)sizeof(comm_id))
        return usage(argv[0], "MASTER_ADDR is too long");
    setenv("CFX_COMM_ID", comm_id, 1);

    float *send = malloc(count * sizeof(float)), *recv = malloc(count * sizeof(float));
    if (send == NULL || recv == NULL) {
        fprintf(stderr, "rank %d: out of memory for %zu floats\n", rank, count);
        return 1;
    }
    for (size_t i = 0; i < count; i++) {
        send[i] = input_value(rank, i);
        recv[i] = -1.0f;
    }

    int status = 1;
    cfxUniqueId id;
    cfxComm_t comm;
    const char *failed = "cfxGetUniqueId";
    cfxResult_t res = cfxGetUniqueId(&id);
    if (res == cfxSuccess) {
        failed = "cfxCommInitRank";
        res = cfxCommInitRank(&comm, nranks, id, rank);
    }
    if (res != cfxSuccess) {
        fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, failed, cfxGetErrorString(res),
                cfxGetLastError(NULL));
        goto out_free;
    }

    double start_ms = now_ms();
    res = cfxAllReduce(send, recv, count, cfxFloat, cfxSum, comm, NULL);
    double elapsed_ms = now_ms() - start_ms;
    if (res != cfxSuccess) {
        fprintf(stderr, "rank %d: cfxAllReduce failed: %s (%s)\n", rank, cfxGetErrorString(res),
                cfxGetLastError(comm));
        cfxCommAbort(comm);
        goto out_free;
    }
    size_t wrong = 0, first_wrong = 0;
    for (size_t i = 0; i < count; i++) {
        if (recv[i] != expected_sum(nranks, i) && wrong++ == 0)
            first_wrong = i;
    }
    if (wrong)
        fprintf(stderr, "rank %d: element %zu is %g, expected %g (%zu wrong)\n", rank, first_wrong,
                (double)recv[first_wrong], (double)expected_sum(nranks, first_wrong), wrong);
    printf("rank %d of %d: allreduce of %zu floats %s in %.1f ms\n", rank, nranks, count,
           wrong ? "WRONG" : "OK", elapsed_ms);
    fflush(stdout);
    status = wrong ? 1 : 0;

    res = cfxCommFinalize(comm);
    if (res != cfxSuccess) {
        fprintf(stderr, "rank %d: cfxCommFinalize failed: %s (%s)\n", rank, cfxGetErrorString(res),
                cfxGetLastError(comm));
        status = 1;
    }
    cfxCommDestroy(comm);
out_free:
    free(send);
    free(recv);
    return status;
}
