/*
 * allreduce_env: one rank per process, started by anything that sets the
 * torchrun-style variables, no launcher library needed.
 *
 *   RANK=r WORLD_SIZE=n MASTER_ADDR=host MASTER_PORT=port ./allreduce_env [count]
 *   srun -n n ./allreduce_env [count]
 *
 * Every rank sets CFX_COMM_ID=MASTER_ADDR:MASTER_PORT, so cfxGetUniqueId
 * returns the same id everywhere and rank 0 listens at that address; no id
 * has to travel between the processes. MASTER_ADDR must be an address of
 * rank 0's host. examples/launch_local.sh starts n ranks on this machine.
 *
 * Under srun, without RANK and WORLD_SIZE: rank SLURM_PROCID of
 * SLURM_STEP_NUM_TASKS (else SLURM_NTASKS). Without MASTER_ADDR/MASTER_PORT,
 * a CFX_COMM_ID already set is kept; else the root is the host srun runs on
 * (SLURM_LAUNCH_NODE_IPADDR: in an sbatch script, the first node, where task
 * 0 runs by default) at a port derived from SLURM_JOB_ID and SLURM_STEP_ID.
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
            "   or: srun -n n %s [count]\n"
            "  RANK         this process's rank, 0 <= r < n (srun: SLURM_PROCID)\n"
            "  WORLD_SIZE   number of ranks, 1 <= n <= 4096 (srun: SLURM_NTASKS)\n"
            "  MASTER_ADDR  address of rank 0's host, e.g. 127.0.0.1 (srun: CFX_COMM_ID,\n"
            "               else SLURM_LAUNCH_NODE_IPADDR)\n"
            "  MASTER_PORT  free TCP port there, e.g. 29500 (srun: CFX_COMM_ID, else\n"
            "               derived from SLURM_JOB_ID and SLURM_STEP_ID)\n"
            "  count        floats to allreduce (default 1048576)\n"
            "Set CFX_SOCKET_IFNAME (e.g. lo) to choose the interface.\n",
            prog, problem, prog, prog);
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

/* A task of an srun job step (a batch script alone has no step id). */
static int under_srun(void)
{
    return getenv("RANK") == NULL && getenv("WORLD_SIZE") == NULL &&
           getenv("SLURM_PROCID") != NULL && getenv("SLURM_STEP_ID") != NULL;
}

/* The root's port under srun when nothing names one: the same on every task
 * of a step, mostly different for jobs and steps sharing a node, below
 * Linux's ephemeral ports (32768 up). */
static long slurm_port(long job_id, long step_id)
{
    return 10000 + (long)(((unsigned long)job_id * 31u + (unsigned long)step_id) % 20000u);
}

int main(int argc, char **argv)
{
    int srun = under_srun();
    const char *rank_name = srun ? "SLURM_PROCID" : "RANK";
    const char *size_name = !srun                            ? "WORLD_SIZE"
                            : getenv("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS"
                                                             : "SLURM_NTASKS";
    const char *rank_text = getenv(rank_name), *size_text = getenv(size_name);
    const char *addr = getenv("MASTER_ADDR"), *port_text = getenv("MASTER_PORT");
    long rank_arg, nranks_arg, port, count_arg = 1 << 20;
    if (srun && (!addr || !addr[0] || !port_text)) {
        /* No MASTER_*: CFX_COMM_ID as set, else the srun host and a derived port. */
        long job_id, step_id;
        addr = getenv("SLURM_LAUNCH_NODE_IPADDR");
        if (getenv("CFX_COMM_ID") != NULL)
            addr = NULL;
        else if (!addr || !addr[0] ||
                 parse_long(getenv("SLURM_JOB_ID"), 0, 2147483647L, &job_id) != 0 ||
                 parse_long(getenv("SLURM_STEP_ID"), 0, 2147483647L, &step_id) != 0)
            return usage(argv[0], "under srun, set MASTER_ADDR and MASTER_PORT or CFX_COMM_ID "
                                  "(SLURM_LAUNCH_NODE_IPADDR, SLURM_JOB_ID or SLURM_STEP_ID "
                                  "is missing)");
        else
            port = slurm_port(job_id, step_id);
    } else if (!rank_text || !size_text || !addr || !port_text || !addr[0]) {
        return usage(argv[0], "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT must all be set");
    } else if (parse_long(port_text, 1, 65535, &port) != 0) {
        return usage(argv[0], "MASTER_PORT is not a port number");
    }
    /* Up to 4096 ranks every sum stays below 2^24, exact in float. */
    if (parse_long(size_text, 1, 4096, &nranks_arg) != 0)
        return usage(argv[0], srun ? "SLURM_NTASKS is not a number in [1, 4096]"
                                   : "WORLD_SIZE is not a number in [1, 4096]");
    if (parse_long(rank_text, 0, nranks_arg - 1, &rank_arg) != 0)
        return usage(argv[0], srun ? "SLURM_PROCID is not a number in [0, SLURM_NTASKS)"
                                   : "RANK is not a number in [0, WORLD_SIZE)");
    if (argc > 2 || (argc == 2 && parse_long(argv[1], 1, 1L << 30, &count_arg) != 0))
        return usage(argv[0], "count must be one number in [1, 2^30]");
    int rank = (int)rank_arg, nranks = (int)nranks_arg;
    size_t count = (size_t)count_arg;

    /* host:port, with an IPv6 address in brackets (addr NULL: CFX_COMM_ID as set). */
    if (addr != NULL) {
        char comm_id[300];
        int bracket = strchr(addr, ':') != NULL && addr[0] != '[';
        if (snprintf(comm_id, sizeof(comm_id), bracket ? "[%s]:%ld" : "%s:%ld", addr, port) >=
            (int)sizeof(comm_id))
            return usage(argv[0], "MASTER_ADDR is too long");
        setenv("CFX_COMM_ID", comm_id, 1);
    }

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
