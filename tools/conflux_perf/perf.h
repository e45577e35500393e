/*
 * conflux-perf: bandwidth and latency sweeps of the Conflux collectives, with
 * nccl-tests' flags, table and bus-bandwidth formulas, so the scripts written
 * for nccl-tests read its output unchanged. docs/performance.md is the manual.
 *
 * The pieces, each in its own file:
 *   options.c  the command line (subcommand, nccl-tests flags, --np, --json)
 *   colls.c    the table of collectives: buffer counts, busbw factor, the call
 *   check.c    input values whose reduction is exact, and their verification
 *   report.c   the text table and the JSON file (rank 0 only)
 *   bench.c    one rank's run: buffers, warmup, timed loops, checks
 *   memory.c   --mem: host buffers or the rank's GPU, and which GPU
 *   gpu.c      --mem device: the CUDA driver loaded at run time, one rank's
 *              GPU, stream and buffers (gpu_none.c: a build without CUDA)
 *   launch.c   where ranks come from: --np fork, RANK/WORLD_SIZE, mpirun, one
 *   mpi.c      MPI_Bcast of the unique id, when built with MPI
 */
#ifndef CFX_PERF_H
#define CFX_PERF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "conflux.h"

/* "every value" for the type, op and root options. */
#define PERF_ALL -1

/* Exit codes: 0 all good; 1 a check failed or a call failed; 2 bad usage. */
#define PERF_EXIT_OK     0
#define PERF_EXIT_FAILED 1
#define PERF_EXIT_USAGE  2

/* ------------------------------------------------------------ collectives */

/* Element counts of one call for a size of `count` elements (nccl-tests'
 * getCollByteCount). The in-place offsets are multiplied by the rank. */
struct perf_counts {
    size_t send;                /* elements read from the send buffer */
    size_t recv;                /* elements written to the receive buffer */
    size_t param;               /* the count argument of the call */
    size_t send_inplace_offset; /* in place: sendbuff = recvbuff + this*rank */
    size_t recv_inplace_offset; /* in place: recvbuff = recvbuff + this*rank */
};

enum perf_coll_kind {
    PERF_ALLREDUCE,
    PERF_BROADCAST,
    PERF_REDUCE,
    PERF_ALLGATHER,
    PERF_REDUCESCATTER,
    PERF_SENDRECV,
    PERF_ALLTOALL,
    PERF_GATHER,
    PERF_SCATTER,
};

/* Flags of struct perf_coll. */
#define PERF_COLL_HAS_OP           0x1 /* takes a reduction op */
#define PERF_COLL_HAS_ROOT         0x2 /* takes a root rank */
#define PERF_COLL_NO_INPLACE_CHECK 0x4 /* in place is timed, not checked (sendrecv) */
#define PERF_COLL_NO_INPLACE       0x8 /* no in-place form (alltoall): not run */

/* One collective. Rules: `run` is one call on `stream`: on host buffers with
 * stream NULL it is done when it returns; on device buffers it is enqueued
 * on the rank's stream (completes later). It returns the Conflux result
 * unchanged. */
struct perf_coll {
    const char *name; /* subcommand, e.g. "allreduce" */
    enum perf_coll_kind kind;
    unsigned flags;
    void (*counts)(size_t count, int nranks, struct perf_counts *counts_p);
    /* busbw = algbw * bus_factor(nranks); algbw = max(send, recv) bytes / time. */
    double (*bus_factor)(int nranks);
    cfxResult_t (*run)(const void *sendbuff, void *recvbuff, size_t count, cfxDataType_t type,
                       cfxRedOp_t op, int root, cfxComm_t comm, cfxStream_t stream);
};

/* The collective called `name`, or NULL. */
const struct perf_coll *perf_coll_find(const char *name);
/* Names of every collective, for the usage text: "allreduce|broadcast|...". */
const char *perf_coll_names(void);

/* ------------------------------------------------------------ options */

/* Where the buffers live (--mem). */
enum perf_mem {
    PERF_MEM_AUTO,   /* device when this rank can use a GPU, else host */
    PERF_MEM_HOST,   /* host memory, stream NULL (never loads the CUDA driver) */
    PERF_MEM_DEVICE, /* cuMemAlloc, one stream per rank; an error without a GPU */
};

struct perf_options {
    const struct perf_coll *coll;
    size_t min_bytes;
    size_t max_bytes;
    size_t step_bytes;
    size_t step_factor; /* > 1: multiply; else add step_bytes */
    int iters;
    int warmup_iters;
    int agg_iters;   /* calls per timed iteration, in one group when > 1 */
    int check_iters; /* checked calls per size and placement (0 = no check) */
    int type;        /* cfxDataType_t or PERF_ALL */
    int op;          /* cfxRedOp_t or PERF_ALL */
    int root;        /* rank or PERF_ALL */
    int average;     /* time across ranks: 0 rank 0, 1 mean, 2 min, 3 max */
    int np;          /* > 0: fork this many local ranks */
    int threads;     /* > 1: this many ranks as threads of this one process (-t) */
    /* The threads launcher set CFX_MULTI_RANK_GPU_ENABLE=1 (ranks outnumber
     * the GPUs; set once, before the threads, since setenv is not thread-safe). */
    int multi_rank_set;
    enum perf_mem mem;
    int local_register; /* -R 1: the buffers registered with cfxCommRegister */
    const char *json_path;
    char command[1024]; /* the command line, for the JSON file */
};

/* Parse argv. Returns PERF_EXIT_OK, or PERF_EXIT_USAGE after printing the
 * problem and the usage to stderr; *help_p is set for -h (usage on stdout). */
int perf_options_parse(int argc, char **argv, struct perf_options *opt_p, int *help_p);
void perf_options_usage(FILE *out, const char *prog);

/* Names as nccl-tests prints them: "float", "bfloat16", "f8e4m3"; "sum". */
const char *perf_type_name(cfxDataType_t type);
const char *perf_op_name(cfxRedOp_t op);
size_t perf_type_size(cfxDataType_t type);
/* "auto", "host", "device". */
const char *perf_mem_name(enum perf_mem mem);

/* ------------------------------------------------------------ data check */

/* The inputs of one checked call; see check.c for why each reduction is exact. */
struct perf_values {
    cfxDataType_t type;
    cfxRedOp_t op;
    int nranks;
    uint32_t seed;
    int reduces;      /* 1: reduction inputs for op; 0: plain copies */
    uint64_t span;    /* values drawn from [0, span]; avg: base in [1, span]; sparse avg: the one
                         nonzero input */
    int sparse;       /* one contributing rank per element (too many ranks for the type) */
    int prod_max_exp; /* prod: each result is 2^t, t <= this */
};

void perf_values_init(struct perf_values *values, const struct perf_coll *coll, cfxDataType_t type,
                      cfxRedOp_t op, int nranks, uint32_t seed);
/* Write `rank`'s inputs for elements first .. first+count-1 to buf[0..count-1]. */
void perf_values_fill(const struct perf_values *values, void *buf, size_t count, int rank,
                      size_t first);
/* Count elements of buf that differ from the reduction over all ranks (or,
 * for copies, from `src_rank`'s input; src_rank < 0 means reduce). */
size_t perf_values_verify(const struct perf_values *values, const void *buf, size_t count,
                          size_t first, int src_rank);

/* ------------------------------------------------------------ report */

struct perf_result {
    size_t bytes;
    size_t count;
    double time_us;
    double algbw;    /* GB/s */
    double busbw;    /* GB/s */
    long long wrong; /* -1: not checked */
    int inplace;
};

struct perf_report;

/* What the header says beside the options. */
struct perf_header {
    const char *rank_lines; /* a "#  Rank ..." line for every rank */
    const char *memory;     /* "host", "device", or "mixed" (the ranks differ); static */
    const char *notes;      /* whole "# ..." lines to add (what --mem chose and why), or "" */
};

/* The copy reference of the footer, measured by rank 0 after the sweep. */
struct perf_copy {
    size_t bytes; /* 0: none */
    double gbps;  /* 1 GB = 1e9 bytes */
    int device;   /* 1: device to device, bytes read + written counted; 0: host memcpy,
                     bytes copied counted */
    int events;   /* device: timed with CUDA events (else wall time after a sync) */
};

/* Device mode: how long rank 0's timed calls took from call to return (the
 * CPU's cost of enqueueing; the GPU finishes them later). */
struct perf_enqueue {
    long calls;           /* 0: none measured (host buffers) */
    double mean_us;       /* over every timed call */
    size_t first_bytes;   /* the smallest size swept */
    double first_mean_us; /* over the timed calls of that size */
};

/* Rank 0 only; every function accepts NULL and does nothing then. Open
 * returns NULL only when out of memory; a JSON file it cannot create is
 * reported and makes perf_report_close fail, the run itself goes on. */
struct perf_report *perf_report_open(const struct perf_options *opt, int nranks,
                                     const char *launch);
void perf_report_header(struct perf_report *rep, const struct perf_header *header);
void perf_report_row_start(struct perf_report *rep, size_t bytes, size_t count, cfxDataType_t type,
                           const char *op_name, int root);
void perf_report_result(struct perf_report *rep, cfxDataType_t type, const char *op_name, int root,
                        const struct perf_result *res);
void perf_report_row_end(struct perf_report *rep);
/* Footer and JSON trailer; renames the JSON into place. Returns 0, or -1 when
 * the JSON file could not be written (the problem is printed). */
int perf_report_close(struct perf_report *rep, const struct perf_copy *copy,
                      const struct perf_enqueue *enq, long long errors, double avg_busbw);
/* After a failed call: flush what was printed, drop the JSON, free. */
void perf_report_abandon(struct perf_report *rep);

/* ------------------------------------------------------------ one rank */

struct perf_bench;

/* One rank, set up before its unique id is made (cfxGetUniqueId reads
 * Conflux's parameters once, and --np ranks may set
 * CFX_MULTI_RANK_GPU_ENABLE here), in the rank's own process, after any
 * fork: the root checked, the memory chosen (--mem; device: the GPU's
 * context made current, before cfxCommInitRank, and a stream created) and
 * the buffers allocated. `local_rank` is the rank's index among the ranks
 * this process forked (--np), else -1. Returns the rank, or NULL with
 * *status_p PERF_EXIT_USAGE or -1 (printed; --mem device without a GPU). */
struct perf_bench *perf_bench_open(const struct perf_options *opt, int rank, int nranks,
                                   int local_rank, int *status_p);
/* Free a rank that is not run (accepts NULL). */
void perf_bench_close(struct perf_bench *bench);
/* Run the whole sweep, everyone holding `id`, then close `bench`.
 * Returns PERF_EXIT_OK, PERF_EXIT_FAILED (a check failed: every rank returns
 * it, the communicator is closed in order) or -1 (a call failed: printed,
 * the communicator is aborted). */
int perf_bench_run(struct perf_bench *bench, cfxUniqueId id, const char *launch);

/* ------------------------------------------------------------ GPU */

/* One rank's GPU (gpu.c): its device, its primary context, its stream. */
struct perf_gpu;

/* Whether this conflux-perf was built with CUDA (gpu.c) or not (gpu_none.c). */
int perf_gpu_built(void);
/* Load the CUDA driver (CFX_CUDA_DRIVER_LIB, else "libcuda.so.1"), cuInit,
 * and count its GPUs; once per process. Call it in the rank's own process,
 * never before --np forks: CUDA does not survive fork. Returns the count, or
 * 0 with *why_p a sentence ("no CUDA driver (...)"). */
int perf_gpu_probe(const char **why_p);
/* Make GPU `device`'s primary context current on this thread (before
 * cfxCommInitRank: that makes the rank a GPU rank) and create a
 * non-blocking stream. NULL after printing why. The context stays retained
 * until the process exits, as the CUDA runtime (and Conflux) keep it. */
struct perf_gpu *perf_gpu_open(int device, int rank);
/* Destroy the stream (its work is let finish). Accepts NULL. */
void perf_gpu_close(struct perf_gpu *gpu);
cfxStream_t perf_gpu_stream(const struct perf_gpu *gpu);
int perf_gpu_device(const struct perf_gpu *gpu);
/* The driver's name of the GPU ("NVIDIA H200") and its PCI bus id. */
const char *perf_gpu_name(const struct perf_gpu *gpu);
const char *perf_gpu_busid(const struct perf_gpu *gpu);

/* Every function below prints what failed, with the rank, and returns -1
 * (NULL); 0 on success. */
/* cuMemAlloc `bytes`, every byte set to 0 (cuMemsetD8): touched now. */
void *perf_gpu_alloc(struct perf_gpu *gpu, size_t bytes);
/* cuMemFree. Accepts NULL. */
void perf_gpu_free(struct perf_gpu *gpu, void *ptr);
/* Wait for the work on the rank's stream (cuStreamSynchronize). */
int perf_gpu_sync(struct perf_gpu *gpu);
/* Synchronous copies between host and device memory, after the rank's
 * stream is synchronised (so no call still reads or writes the buffer). */
int perf_gpu_to_device(struct perf_gpu *gpu, void *dst, const void *src, size_t bytes);
int perf_gpu_to_host(struct perf_gpu *gpu, void *dst, const void *src, size_t bytes);
/* Device-to-device copy bandwidth of `bytes` from src to dst (cuMemcpyAsync
 * on the rank's stream, repeated for about 0.2 s): copy_p->gbps counts the
 * bytes read plus the bytes written (2 x bytes / time), as CUDA's
 * bandwidthTest reports device-to-device copies. */
int perf_gpu_copy_bandwidth(struct perf_gpu *gpu, void *dst, const void *src, size_t bytes,
                            struct perf_copy *copy_p);

/* ------------------------------------------------------------ memory */

/* Host memory for staging copies to and from the GPU: pinned (cuMemHostAlloc,
 * so a copy never goes through the driver's pageable path while peers'
 * kernels spin), freed by perf_gpu_host_free. NULL when out of memory. */
void *perf_gpu_host_alloc(struct perf_gpu *gpu, size_t bytes);
void perf_gpu_host_free(struct perf_gpu *gpu, void *ptr);

/* Which memory rank `rank` measures (--mem; memory.c says how): *gpu_p NULL
 * for host buffers, else its GPU, opened (context current, a stream).
 * `local_rank` as for perf_bench_open. The header's "# ..." lines about the
 * choice go to notes (else ""). Returns 0, or -1 printed (--mem device and
 * no usable GPU: said once for --np ranks). */
int perf_memory_choose(const struct perf_options *opt, int rank, int local_rank,
                       struct perf_gpu **gpu_p, char *notes, size_t notes_bytes);

/* ------------------------------------------------------------ launch */

/* Pick the launch mode from the options and the environment, start or join
 * the ranks, and return the process's exit code. */
int perf_launch(const struct perf_options *opt);

/* MPI (mpi.c). perf_mpi_available: built with MPI. perf_mpi_share_id: MPI_Init,
 * rank and size of MPI_COMM_WORLD, rank 0's cfxGetUniqueId broadcast. Returns 0,
 * or -1 after printing why. perf_mpi_finish: MPI_Finalize (ok) or MPI_Abort. */
int perf_mpi_available(void);
int perf_mpi_share_id(int *rank_p, int *nranks_p, cfxUniqueId *id_p);
void perf_mpi_finish(int ok);

#endif /* CFX_PERF_H */
