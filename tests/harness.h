/*
 * Multi-rank test harness. Runs one function on N ranks, as forked processes
 * or as threads of this process, under a deadline. Each rank reports the step
 * it is at (cfx_test_step), so a hang fails with "rank 2 hung at step ...",
 * and failures carry file:line and a sentence. Processes that outlive the
 * deadline are killed; the test then fails.
 */
#ifndef CFX_TEST_HARNESS_H
#define CFX_TEST_HARNESS_H

#include <stdarg.h>

#include "conflux.h"

enum cfx_test_mode { CFX_TEST_PROCS = 0, CFX_TEST_THREADS = 1 };

/* How the ranks get their unique id. */
enum cfx_test_id {
    CFX_TEST_ID_BCAST = 0, /* Rank 0 (or the parent, for threads) calls cfxGetUniqueId. */
    CFX_TEST_ID_ENV = 1,   /* Every rank calls cfxGetUniqueId itself (CFX_COMM_ID). */
};

struct cfx_test_rank {
    int rank;
    int nranks;
    enum cfx_test_mode mode;
    cfxUniqueId id;
    void *arg;
    int slot_failed; /* Set by cfx_test_fail. */
};

typedef void (*cfx_test_rank_fn)(struct cfx_test_rank *ctx);

struct cfx_test_options {
    int nranks;
    enum cfx_test_mode mode;
    enum cfx_test_id id_mode;
    double deadline_s; /* Whole run; default 60. */
    void *arg;
    /* An id made by the test (e.g. to talk to its root first); NULL: the harness makes one. */
    const cfxUniqueId *id;
    /* Ranks that must not run at all (to simulate a missing rank): bitmask. */
    unsigned long long skip_ranks;
    /* Called in each rank before anything else (processes: in the child,
     * before any Conflux thread exists), e.g. to set per-rank variables. */
    void (*before_rank)(struct cfx_test_rank *ctx);
    /* Ranks expected to die by SIGKILL (fault tests): not a failure. */
    unsigned long long killed_ranks;
};

/* Run @p fn on every rank; returns 1 when all ranks finished without failure,
 * else 0 with a report in @p report (one line per failed or hung rank). */
int cfx_test_run(const struct cfx_test_options *opts, cfx_test_rank_fn fn, char *report,
                 size_t report_size);

/* Record the step a rank is at (shown if it hangs). */
void cfx_test_step(struct cfx_test_rank *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Record a failure of this rank (the first one is kept). */
void cfx_test_fail(struct cfx_test_rank *ctx, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Inside a rank function: record and return on failure. */
#define RANK_ASSERT(ctx, cond, ...)                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            cfx_test_fail((ctx), __FILE__, __LINE__, __VA_ARGS__);                                 \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* Inside a rank function: a Conflux call must succeed. */
#define RANK_CFX(ctx, call)                                                                        \
    do {                                                                                           \
        cfx_test_step((ctx), "%s", #call);                                                         \
        cfxResult_t rank_res_ = (call);                                                            \
        RANK_ASSERT((ctx), rank_res_ == cfxSuccess, "%s returned %s: %s", #call,                   \
                    cfxGetErrorString(rank_res_), cfxGetLastError(NULL));                          \
    } while (0)

/* Run and assert inside a Criterion test. */
#define CFX_TEST_RUN(opts, fn)                                                                     \
    do {                                                                                           \
        char run_report_[8192];                                                                    \
        int run_ok_ = cfx_test_run((opts), (fn), run_report_, sizeof(run_report_));                \
        cr_assert(run_ok_, "%s", run_report_);                                                     \
    } while (0)

/* Set an environment variable for the ranks of the next run and forget cached
 * parameters (threads share this process's environment). */
void cfx_test_setenv(const char *name, const char *value);

/* Make the ranks of the next run use tests/fakeverbs, the project's own
 * libibverbs (CFX_TEST_FAKEVERBS, set by ctest), for every connection
 * between hosts (CFX_NET=IB), with a registry of this process's own and its
 * TCP on loopback. Returns the library's path, or NULL (nothing set) when
 * there is none: built without the verbs headers. */
const char *cfx_test_use_fakeverbs(void);

/* GPU tests: point the ranks of the next run at a CUDA driver: the
 * machine's own when CFX_TEST_GPU=1 (scripts/gpu_check.sh on a GPU host),
 * else tests/fakecuda's (CFX_TEST_FAKECUDA, set by ctest), which runs
 * Conflux's kernel on CPU threads. Returns "GPU" or "fake-cuda", or NULL
 * with *why_p saying why neither can run (then skip). Loads no CUDA in the
 * calling process (its ranks do: CUDA does not survive fork). */
const char *cfx_test_use_cuda(const char **why_p);

/* Log INFO lines (subsystems INIT, NET and P2P) of the ranks of the next run to
 * "<prefix>.<pid>", the prefix made from @p what and this process's pid
 * into @p prefix (@p size bytes); old files of that prefix are removed. */
void cfx_test_log_to(char *prefix, size_t size, const char *what);
void cfx_test_logs_off(void);
/* Lines of the files "<prefix>.*" that contain @p needle (-1: cannot read). */
int cfx_test_count_in_logs(const char *prefix, const char *needle);
void cfx_test_remove_logs(const char *prefix);

/* Inside a rank: an in-place float allreduce of @p count elements whose
 * inputs depend on rank and index, each result element checked exactly.
 * A failure is recorded (ctx->slot_failed) with a sentence. */
void cfx_test_allreduce_check(struct cfx_test_rank *ctx, cfxComm_t comm, size_t count);

#endif /* CFX_TEST_HARNESS_H */
