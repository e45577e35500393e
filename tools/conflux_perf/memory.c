/*
 * Which memory a rank measures (--mem), decided in the rank's own process,
 * after --np forks (CUDA does not survive fork), before its unique id is
 * made and cfxCommInitRank runs:
 *   host    host buffers, stream NULL; the CUDA driver is never loaded here.
 *   device  the rank's GPU (gpu.c): its index on this host modulo the GPUs,
 *           its primary context current (so Conflux makes the rank a GPU
 *           rank), a stream of its own; no usable GPU is an error.
 *   auto    device when a GPU is usable, else host, saying why.
 * --np or -t ranks that outnumber the GPUs share them:
 * CFX_MULTI_RANK_GPU_ENABLE=1 is set for them (unless the user set it),
 * since Conflux refuses that otherwise; -t ranks share one CUDA context. What was chosen, and why,
 * goes to the header's notes.
 */
#include <stdlib.h>
#include <string.h>

#include "perf.h"

/* A whole number >= 0 from the environment, or -1. */
static int env_index(const char *name)
{
    const char *text = getenv(name);
    char *end = NULL;
    if (text == NULL || text[0] == '\0')
        return -1;
    long value = strtol(text, &end, 10);
    return *end == '\0' && value >= 0 && value < (1L << 20) ? (int)value : -1;
}

/* The GPU of this rank: its index on this host modulo the GPUs. A rank
 * forked by --np is the index-th child (a LOCAL_RANK it inherited is its
 * parent's); else the launcher's LOCAL_RANK (torchrun), OMPI_COMM_WORLD_-
 * LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID; else the rank. */
static int pick_device(int rank, int local_rank, int count)
{
    static const char *const local_vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                             "MPI_LOCALRANKID", "SLURM_LOCALID"};
    int index = local_rank;
    for (size_t v = 0; index < 0 && v < sizeof(local_vars) / sizeof(local_vars[0]); v++)
        index = env_index(local_vars[v]);
    return (index >= 0 ? index : rank) % count;
}

int perf_memory_choose(const struct perf_options *opt, int rank, int local_rank,
                       struct perf_gpu **gpu_p, char *notes, size_t notes_bytes)
{
    *gpu_p = NULL;
    notes[0] = '\0';
    if (opt->mem == PERF_MEM_HOST)
        return 0;
    const char *why = "";
    int count = perf_gpu_probe(&why);
    if (count == 0 && opt->mem == PERF_MEM_AUTO) {
        snprintf(notes, notes_bytes, "# --mem auto: host buffers, no GPU is usable: %s\n", why);
        return 0;
    }
    if (count == 0) {
        if (local_rank <= 0) /* --np ranks share the host and the answer: say it once */
            fprintf(stderr, "conflux-perf: rank %d: --mem device, but no GPU is usable: %s\n", rank,
                    why);
        return -1;
    }
    int here = opt->np > 0 ? opt->np : opt->threads; /* ranks on this host, when it knows */
    if (opt->multi_rank_set ||
        (local_rank >= 0 && opt->np > count && getenv("CFX_MULTI_RANK_GPU_ENABLE") == NULL)) {
        if (!opt->multi_rank_set) /* -t ranks: their launcher set it before the threads */
            setenv("CFX_MULTI_RANK_GPU_ENABLE", "1", 1);
        snprintf(notes, notes_bytes,
                 "# CFX_MULTI_RANK_GPU_ENABLE=1 set by conflux-perf: %d ranks share %d GPU%s\n",
                 here, count, count == 1 ? "" : "s");
    }
    struct perf_gpu *gpu = perf_gpu_open(pick_device(rank, local_rank, count), rank);
    if (gpu == NULL)
        return -1;
    *gpu_p = gpu;
    return 0;
}
