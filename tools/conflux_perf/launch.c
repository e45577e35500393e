/*
 * Where the ranks come from, first match wins:
 *   -t N            N ranks as threads of this process: it makes the unique
 *                   id, every thread opens its rank (its GPU's context
 *                   current on that thread) and runs it; one CUDA context
 *                   for all, so their kernels run at once (processes on one
 *                   GPU take turns). CFX_SOCKET_IFNAME defaults to lo.
 *   --np N          this process forks N ranks (processes) on this host; rank
 *                   0 makes the unique id and passes it through a pipe, as
 *                   examples/hello_comm.c does. CFX_SOCKET_IFNAME defaults to lo.
 *   RANK, WORLD_SIZE (torchrun style): CFX_COMM_ID = MASTER_ADDR:MASTER_PORT,
 *                   so every rank derives the same id and rank 0 listens there.
 *   mpirun          OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/PMI_SIZE are set:
 *                   with CFX_COMM_ID set, as above; else, when built with MPI,
 *                   MPI_Bcast of rank 0's id; else an error saying what to set.
 *   srun            SLURM_PROCID and SLURM_STEP_ID are set (a task of a job
 *                   step; a batch script alone has no step id), and no MPI
 *                   variables, or only PMI_* in a build without MPI: rank
 *                   SLURM_PROCID of SLURM_STEP_NUM_TASKS (else SLURM_NTASKS);
 *                   the root at MASTER_ADDR:MASTER_PORT, else CFX_COMM_ID, else
 *                   SLURM_LAUNCH_NODE_IPADDR (where srun runs: in sbatch, the
 *                   first node, where task 0 runs) and a port derived from
 *                   SLURM_JOB_ID and SLURM_STEP_ID (slurm_port).
 *   otherwise       one rank.
 * Each returns the process's exit code (perf.h PERF_EXIT_*).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "perf.h"

#define FORK_GRACE_S 20 /* after one rank fails, how long the others get to exit */

static int exit_code(int bench_status)
{
    return bench_status < 0 ? PERF_EXIT_FAILED : bench_status;
}

static int get_unique_id(int rank, cfxUniqueId *id_p)
{
    cfxResult_t res = cfxGetUniqueId(id_p);
    if (res != cfxSuccess) {
        fprintf(stderr, "conflux-perf: rank %d: cfxGetUniqueId failed: %s: %s\n", rank,
                cfxGetErrorString(res), cfxGetLastError(NULL));
        return -1;
    }
    return 0;
}

/* A whole decimal number in [min, max]. */
static int parse_env_int(const char *name, long min, long max, int *value_p)
{
    const char *text = getenv(name);
    char *end = NULL;
    if (text == NULL || text[0] == '\0')
        return -1;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (*end != '\0' || errno != 0 || value < min || value > max)
        return -1;
    *value_p = (int)value;
    return 0;
}

/* Set the rank up (before its id: see perf_bench_open), make or join the
 * unique id from the environment (CFX_COMM_ID), and run it. */
static int run_rank(const struct perf_options *opt, int rank, int nranks, const char *launch)
{
    int status;
    struct perf_bench *bench = perf_bench_open(opt, rank, nranks, -1, &status);
    if (bench == NULL)
        return exit_code(status);
    cfxUniqueId id;
    if (get_unique_id(rank, &id) != 0) {
        perf_bench_close(bench);
        return PERF_EXIT_FAILED;
    }
    return exit_code(perf_bench_run(bench, id, launch));
}

/* ------------------------------------------------------------ --np */

static int read_full(int fd, void *buf, size_t bytes)
{
    char *at = buf;
    while (bytes > 0) {
        ssize_t n = read(fd, at, bytes);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        at += n;
        bytes -= (size_t)n;
    }
    return 0;
}

static int fork_rank(const struct perf_options *opt, int rank, const int id_pipe[2])
{
    cfxUniqueId id;
    char launch[64];
    snprintf(launch, sizeof(launch), "fork (--np %d, one process per rank)", opt->np);
    int status;
    /* Exiting closes the pipe: the others read EOF. */
    struct perf_bench *bench = perf_bench_open(opt, rank, opt->np, rank, &status);
    if (bench == NULL)
        return exit_code(status);
    if (rank == 0) {
        close(id_pipe[0]);
        if (get_unique_id(0, &id) != 0)
            goto out_failed;
        for (int r = 1; r < opt->np; r++)
            if (write(id_pipe[1], &id, sizeof(id)) != (ssize_t)sizeof(id)) {
                fprintf(stderr, "conflux-perf: rank 0: cannot pass the unique id on\n");
                goto out_failed;
            }
        close(id_pipe[1]);
    } else {
        int got = read_full(id_pipe[0], &id, sizeof(id));
        close(id_pipe[0]);
        if (got != 0) {
            fprintf(stderr, "conflux-perf: rank %d: rank 0 sent no unique id\n", rank);
            goto out_failed;
        }
    }
    return exit_code(perf_bench_run(bench, id, launch));

out_failed:
    perf_bench_close(bench);
    return PERF_EXIT_FAILED;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wait for every rank; once one fails, the rest get FORK_GRACE_S to notice. */
static int wait_ranks(pid_t *pids, int np)
{
    int remaining = np, result = PERF_EXIT_OK;
    double deadline = 0;
    while (remaining > 0) {
        int wstatus;
        pid_t pid = waitpid(-1, &wstatus, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0)
            break;
        if (pid == 0) {
            if (deadline > 0 && now_s() > deadline) {
                for (int r = 0; r < np; r++)
                    if (pids[r] > 0) {
                        fprintf(stderr,
                                "conflux-perf: rank %d still running %d s after a "
                                "failure; killing it\n",
                                r, FORK_GRACE_S);
                        kill(pids[r], SIGKILL);
                    }
                deadline = 0;
            }
            usleep(20000);
            continue;
        }
        int rank = 0;
        while (rank < np && pids[rank] != pid)
            rank++;
        if (rank == np)
            continue;
        pids[rank] = 0;
        remaining--;
        int code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        if (WIFSIGNALED(wstatus))
            fprintf(stderr, "conflux-perf: rank %d died of signal %d\n", rank, WTERMSIG(wstatus));
        if (code != 0) {
            if (result == PERF_EXIT_OK)
                result = code == PERF_EXIT_USAGE ? PERF_EXIT_USAGE : PERF_EXIT_FAILED;
            if (deadline == 0)
                deadline = now_s() + FORK_GRACE_S;
        }
    }
    return result;
}

static int launch_fork(const struct perf_options *opt)
{
    /* One host: keep the bootstrap on loopback unless told otherwise. */
    setenv("CFX_SOCKET_IFNAME", "lo", 0);
    int id_pipe[2];
    pid_t *pids = calloc((size_t)opt->np, sizeof(*pids));
    if (pids == NULL || pipe(id_pipe) != 0) {
        fprintf(stderr, "conflux-perf: cannot set up %d ranks\n", opt->np);
        free(pids);
        return PERF_EXIT_FAILED;
    }
    fflush(stdout);
    fflush(stderr);
    int result = PERF_EXIT_OK;
    for (int r = 0; r < opt->np; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            if (r != 0)
                close(id_pipe[1]); /* only rank 0 writes: its exit means EOF */
            int code = fork_rank(opt, r, id_pipe);
            fflush(stdout);
            fflush(stderr);
            _exit(code);
        }
        if (pid < 0) {
            perror("conflux-perf: fork");
            for (int k = 0; k < r; k++)
                kill(pids[k], SIGKILL);
            result = PERF_EXIT_FAILED;
            break;
        }
        pids[r] = pid;
    }
    close(id_pipe[0]);
    close(id_pipe[1]);
    int waited = wait_ranks(pids, opt->np);
    free(pids);
    return result != PERF_EXIT_OK ? result : waited;
}

/* ------------------------------------------------------------ -t */

struct thread_rank {
    const struct perf_options *opt;
    int rank;
    cfxUniqueId id;
    char launch[64];
    int code;
};

static void *thread_rank_main(void *arg)
{
    struct thread_rank *t = arg;
    int status;
    struct perf_bench *bench = perf_bench_open(t->opt, t->rank, t->opt->threads, t->rank, &status);
    t->code =
        bench == NULL ? exit_code(status) : exit_code(perf_bench_run(bench, t->id, t->launch));
    return NULL;
}

static int launch_threads(const struct perf_options *given)
{
    setenv("CFX_SOCKET_IFNAME", "lo", 0);
    struct perf_options opt = *given;
    /* Ranks that outnumber the GPUs share them: said to Conflux here, once,
     * before the threads read the environment. */
    /* Ranks of one process on one GPU spin waiting for each other's
     * kernels: each stream needs a hardware queue of its own (8 per GPU
     * unless raised before CUDA starts; docs/troubleshooting.md). */
    if (opt.mem != PERF_MEM_HOST)
        setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    if (opt.mem != PERF_MEM_HOST && getenv("CFX_MULTI_RANK_GPU_ENABLE") == NULL) {
        int count = perf_gpu_probe(NULL);
        if (count > 0 && opt.threads > count) {
            setenv("CFX_MULTI_RANK_GPU_ENABLE", "1", 1);
            opt.multi_rank_set = 1;
        }
    }
    int n = opt.threads;
    struct thread_rank *ranks = calloc((size_t)n, sizeof(*ranks));
    pthread_t *threads = calloc((size_t)n, sizeof(*threads));
    cfxUniqueId id;
    if (ranks == NULL || threads == NULL || get_unique_id(0, &id) != 0) {
        free(ranks);
        free(threads);
        return PERF_EXIT_FAILED;
    }
    int started = 0, result = PERF_EXIT_OK;
    for (; started < n; started++) {
        struct thread_rank *t = &ranks[started];
        *t = (struct thread_rank){.opt = &opt, .rank = started, .id = id};
        snprintf(t->launch, sizeof(t->launch), "threads (-t %d, one process)", n);
        if (pthread_create(&threads[started], NULL, thread_rank_main, t) != 0) {
            /* The started ranks fail their init when the bootstrap times out. */
            fprintf(stderr, "conflux-perf: cannot start rank %d's thread\n", started);
            result = PERF_EXIT_FAILED;
            break;
        }
    }
    for (int r = 0; r < started; r++) {
        pthread_join(threads[r], NULL);
        if (ranks[r].code != PERF_EXIT_OK && result == PERF_EXIT_OK)
            result = ranks[r].code == PERF_EXIT_USAGE ? PERF_EXIT_USAGE : PERF_EXIT_FAILED;
    }
    free(ranks);
    free(threads);
    return result;
}

/* ------------------------------------------------------------ RANK, WORLD_SIZE */

/* CFX_COMM_ID = MASTER_ADDR:MASTER_PORT (an IPv6 address in brackets) when
 * both are set; 0 if it was set. */
static int comm_id_from_master(void)
{
    int port;
    const char *addr = getenv("MASTER_ADDR");
    if (addr == NULL || addr[0] == '\0' || parse_env_int("MASTER_PORT", 1, 65535, &port) != 0)
        return -1;
    char comm_id[300];
    int v6 = strchr(addr, ':') != NULL && addr[0] != '[';
    snprintf(comm_id, sizeof(comm_id), v6 ? "[%s]:%d" : "%s:%d", addr, port);
    setenv("CFX_COMM_ID", comm_id, 1);
    return 0;
}

static int launch_env(const struct perf_options *opt)
{
    int rank, nranks;
    if (parse_env_int("WORLD_SIZE", 1, 1 << 20, &nranks) != 0 ||
        parse_env_int("RANK", 0, nranks - 1, &rank) != 0) {
        fprintf(stderr, "conflux-perf: RANK and WORLD_SIZE must be numbers, 0 <= RANK < "
                        "WORLD_SIZE\n");
        return PERF_EXIT_USAGE;
    }
    if (comm_id_from_master() != 0 && getenv("CFX_COMM_ID") == NULL) {
        fprintf(stderr, "conflux-perf: with RANK and WORLD_SIZE, set MASTER_ADDR (rank 0's "
                        "address) and MASTER_PORT (a free port there), or CFX_COMM_ID=host:port\n");
        return PERF_EXIT_USAGE;
    }
    char launch[400];
    snprintf(launch, sizeof(launch), "RANK/WORLD_SIZE, CFX_COMM_ID=%s", getenv("CFX_COMM_ID"));
    return run_rank(opt, rank, nranks, launch);
}

/* ------------------------------------------------------------ mpirun */

static int launch_mpi(const struct perf_options *opt)
{
    int rank, nranks;
    const char *rank_var = getenv("OMPI_COMM_WORLD_RANK") ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK";
    const char *size_var = getenv("OMPI_COMM_WORLD_SIZE") ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
    cfxUniqueId id;
    if (getenv("CFX_COMM_ID") != NULL) {
        if (parse_env_int(size_var, 1, 1 << 20, &nranks) != 0 ||
            parse_env_int(rank_var, 0, nranks - 1, &rank) != 0) {
            fprintf(stderr, "conflux-perf: %s and %s are not a rank and a size\n", rank_var,
                    size_var);
            return PERF_EXIT_USAGE;
        }
        char launch[400];
        snprintf(launch, sizeof(launch), "mpirun, CFX_COMM_ID=%s", getenv("CFX_COMM_ID"));
        return run_rank(opt, rank, nranks, launch);
    }
    if (!perf_mpi_available()) {
        fprintf(stderr, "conflux-perf: started by mpirun, but built without MPI: set "
                        "CFX_COMM_ID=host:port on every rank (an address of rank 0's host and "
                        "a free port), e.g. mpirun -x CFX_COMM_ID=127.0.0.1:29500 ...\n");
        return PERF_EXIT_USAGE;
    }
    if (perf_mpi_share_id(&rank, &nranks, &id) != 0) {
        perf_mpi_finish(1);
        return PERF_EXIT_FAILED;
    }
    int status;
    struct perf_bench *bench = perf_bench_open(opt, rank, nranks, -1, &status);
    if (bench != NULL)
        status = perf_bench_run(bench, id, "mpirun, unique id by MPI_Bcast");
    perf_mpi_finish(status >= 0); /* a failed call: MPI_Abort stops the other ranks */
    return exit_code(status);
}

/* ------------------------------------------------------------ srun */

static int slurm_port(long job_id, long step_id)
{
    /* Every task of a step agrees; jobs and steps that share a node mostly
     * differ; 10000..29999 stays below Linux's ephemeral ports (32768 up). */
    unsigned long mix = (unsigned long)job_id * 31u + (unsigned long)step_id;
    return 10000 + (int)(mix % 20000u);
}

static int launch_slurm(const struct perf_options *opt)
{
    int rank, nranks, job_id, step_id;
    const char *size_var = getenv("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    if (parse_env_int(size_var, 1, 1 << 20, &nranks) != 0 ||
        parse_env_int("SLURM_PROCID", 0, nranks - 1, &rank) != 0) {
        fprintf(stderr, "conflux-perf: SLURM_PROCID and %s are not a rank and a size\n", size_var);
        return PERF_EXIT_USAGE;
    }
    const char *launch_ip = getenv("SLURM_LAUNCH_NODE_IPADDR");
    if (comm_id_from_master() != 0 && getenv("CFX_COMM_ID") == NULL) {
        if (launch_ip == NULL || launch_ip[0] == '\0' ||
            parse_env_int("SLURM_JOB_ID", 0, INT32_MAX, &job_id) != 0 ||
            parse_env_int("SLURM_STEP_ID", 0, INT32_MAX, &step_id) != 0) {
            fprintf(stderr, "conflux-perf: under srun without SLURM_LAUNCH_NODE_IPADDR, "
                            "SLURM_JOB_ID and SLURM_STEP_ID, set MASTER_ADDR (task 0's "
                            "host) and MASTER_PORT, or CFX_COMM_ID=host:port\n");
            return PERF_EXIT_USAGE;
        }
        char comm_id[300];
        int v6 = strchr(launch_ip, ':') != NULL;
        snprintf(comm_id, sizeof(comm_id), v6 ? "[%s]:%d" : "%s:%d", launch_ip,
                 slurm_port(job_id, step_id));
        setenv("CFX_COMM_ID", comm_id, 1);
    }
    char launch[400];
    snprintf(launch, sizeof(launch), "srun (SLURM_PROCID/%s), CFX_COMM_ID=%s", size_var,
             getenv("CFX_COMM_ID"));
    return run_rank(opt, rank, nranks, launch);
}

/* ------------------------------------------------------------ choose */

int perf_launch(const struct perf_options *opt)
{
    if (opt->threads > 1)
        return launch_threads(opt);
    if (opt->np > 0)
        return launch_fork(opt);
    if (getenv("RANK") != NULL || getenv("WORLD_SIZE") != NULL)
        return launch_env(opt);
    /* srun --mpi=pmi2 sets PMI_SIZE too: without MPI, read Slurm's variables. */
    int srun = getenv("SLURM_PROCID") != NULL && getenv("SLURM_STEP_ID") != NULL;
    if (getenv("OMPI_COMM_WORLD_SIZE") != NULL ||
        (getenv("PMI_SIZE") != NULL && !(srun && !perf_mpi_available())))
        return launch_mpi(opt);
    if (srun)
        return launch_slurm(opt);
    return run_rank(opt, 0, 1, "one process (no --np, RANK, mpirun or srun)");
}
