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

/* One collective. Rules: `run` is one blocking call on host buffers (stream
 * NULL) and returns the Conflux result unchanged. */
struct perf_coll {
    const char *name; /* subcommand, e.g. "allreduce" */
    enum perf_coll_kind kind;
    unsigned flags;
    void (*counts)(size_t count, int nranks, struct perf_counts *counts_p);
    /* busbw = algbw * bus_factor(nranks); algbw = max(send, recv) bytes / time. */
    double (*bus_factor)(int nranks);
    cfxResult_t (*run)(const void *sendbuff, void *recvbuff, size_t count, cfxDataType_t type,
                       cfxRedOp_t op, int root, cfxComm_t comm);
};

/* The collective called `name`, or NULL. */
const struct perf_coll *perf_coll_find(const char *name);
/* Names of every collective, for the usage text: "allreduce|broadcast|...". */
const char *perf_coll_names(void);

/* ------------------------------------------------------------ options */

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

/* Rank 0 only; every function accepts NULL and does nothing then. Open
 * returns NULL only when out of memory; a JSON file it cannot create is
 * reported and makes perf_report_close fail, the run itself goes on. */
struct perf_report *perf_report_open(const struct perf_options *opt, int nranks,
                                     const char *launch);
void perf_report_header(struct perf_report *rep, const char *rank_lines);
void perf_report_row_start(struct perf_report *rep, size_t bytes, size_t count, cfxDataType_t type,
                           const char *op_name, int root);
void perf_report_result(struct perf_report *rep, cfxDataType_t type, const char *op_name, int root,
                        const struct perf_result *res);
void perf_report_row_end(struct perf_report *rep);
/* Footer and JSON trailer; renames the JSON into place. Returns 0, or -1 when
 * the JSON file could not be written (the problem is printed). */
int perf_report_close(struct perf_report *rep, double memcpy_gbps, size_t memcpy_bytes,
                      long long errors, double avg_busbw);
/* After a failed call: flush what was printed, drop the JSON, free. */
void perf_report_abandon(struct perf_report *rep);

/* ------------------------------------------------------------ one rank */

/* Run the whole sweep as `rank` of `nranks`, everyone holding `id`.
 * Returns PERF_EXIT_OK, PERF_EXIT_FAILED (a check failed: every rank returns
 * it, the communicator is closed in order) or -1 (a call failed: printed,
 * the communicator is aborted). */
int perf_bench_run(const struct perf_options *opt, cfxUniqueId id, int rank, int nranks,
                   const char *launch);

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
