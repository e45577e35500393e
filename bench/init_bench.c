/*
 * cfx_init_bench: how long N processes of one host take to form a
 * communicator through one id (cfxCommInitRank's one root) or through
 * several (cfxCommInitRankScalable, each id made by the first rank of its
 * block, so each root runs in a different process).
 *
 *   cfx_init_bench NRANKS NIDS [REPS]
 *
 * Each repetition: every rank makes its ids (if it is a block's first
 * rank), all wait at a start line in shared memory, then each times its
 * init; the repetition's figure is the slowest rank's, from the common
 * start to its return (bootstrap and the communicator's setup: its
 * topology exchange and ring). Prints the median, the fastest and the
 * slowest repetition in ms.
 */
#define _GNU_SOURCE
#include <conflux.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 256

struct area {
    cfxUniqueId ids[MAX_RANKS];
    _Atomic int made[MAX_RANKS];
    _Atomic int at_start;
    _Atomic int go;
    int64_t start_ns;
    int64_t end_ns[MAX_RANKS];
    _Atomic int failed;
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void block_of(int nranks, int n, int k, int *first)
{
    *first = k * (nranks / n) + (k < nranks % n ? k : nranks % n);
}

static int run_rank(struct area *a, int rank, int nranks, int n_ids)
{
    for (int k = 0; k < n_ids; k++) {
        int first;
        block_of(nranks, n_ids, k, &first);
        if (first == rank) {
            if (cfxGetUniqueId(&a->ids[k]) != cfxSuccess)
                return 1;
            atomic_store(&a->made[k], 1);
        }
    }
    for (int k = 0; k < n_ids; k++)
        while (!atomic_load(&a->made[k]))
            usleep(100);
    atomic_fetch_add(&a->at_start, 1);
    while (!atomic_load(&a->go))
        ;
    cfxComm_t comm;
    cfxResult_t res = n_ids == 1
                          ? cfxCommInitRank(&comm, nranks, a->ids[0], rank)
                          : cfxCommInitRankScalable(&comm, nranks, rank, n_ids, a->ids, NULL);
    a->end_ns[rank] = now_ns();
    if (res != cfxSuccess) {
        fprintf(stderr, "rank %d: %s\n", rank, cfxGetLastError(NULL));
        return 1;
    }
    cfxCommDestroy(comm);
    return 0;
}

static int compare(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s NRANKS NIDS [REPS]\n", argv[0]);
        return 2;
    }
    int nranks = atoi(argv[1]), n_ids = atoi(argv[2]), reps = argc > 3 ? atoi(argv[3]) : 5;
    if (nranks < 1 || nranks > MAX_RANKS || n_ids < 1 || n_ids > nranks || reps < 1 || reps > 100) {
        fprintf(stderr, "NRANKS 1..%d, NIDS 1..NRANKS, REPS 1..100\n", MAX_RANKS);
        return 2;
    }
    setenv("CFX_SOCKET_IFNAME", "lo", 0);
    struct area *a =
        mmap(NULL, sizeof(*a), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED)
        return 1;
    double ms[100];
    for (int rep = 0; rep < reps; rep++) {
        memset(a, 0, sizeof(*a));
        for (int r = 0; r < nranks; r++) {
            pid_t pid = fork();
            if (pid == 0)
                _exit(run_rank(a, r, nranks, n_ids));
            if (pid < 0)
                return 1;
        }
        while (atomic_load(&a->at_start) < nranks)
            usleep(100);
        a->start_ns = now_ns();
        atomic_store(&a->go, 1);
        int failures = 0, status;
        while (wait(&status) > 0)
            failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failures) {
            fprintf(stderr, "repetition %d: %d rank(s) failed\n", rep, failures);
            return 1;
        }
        int64_t last = a->start_ns;
        for (int r = 0; r < nranks; r++)
            if (a->end_ns[r] > last)
                last = a->end_ns[r];
        ms[rep] = (double)(last - a->start_ns) / 1e6;
    }
    qsort(ms, (size_t)reps, sizeof(ms[0]), compare);
    printf("init of %d ranks through %d id(s): median %.1f ms (fastest %.1f, slowest %.1f; %d "
           "runs)\n",
           nranks, n_ids, ms[reps / 2], ms[0], ms[reps - 1], reps);
    return 0;
}
