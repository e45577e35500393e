/*
 * One rank's run of conflux-perf, the loop nccl-tests runs:
 *   choose host or device memory (--mem; device: the GPU's context current
 *   before cfxCommInitRank, a stream of the rank's own); allocate the send
 *   and receive buffers once, at the largest size, and touch them; for each
 *   type, op and root: warm up (-w calls at the largest size, then at the
 *   smallest); then for each size, out of place and in place: one untimed
 *   call, -n timed iterations of -m calls each with no barrier in between
 *   (host calls complete before they return; device calls are enqueued and
 *   the stream is synchronised before the clock stops, so the wall time of
 *   the loop is the time of the calls), the mean per call combined across
 *   ranks as -a says, then -c checked calls.
 * Device mode checks through host staging copies: inputs are filled there
 * and copied to the GPU, outputs copied back after a sync and verified
 * there, with check.c as for host buffers.
 * Like nccl-tests, iteration i works at offset (i mod steps) * size inside the
 * buffers, so small sizes do not run from one hot cache line.
 * Rules: every rank runs the same sequence of Conflux calls (the timing and
 * error totals are Conflux collectives too, on host buffers with stream
 * NULL, after the rank's stream is synchronised); only rank 0 prints.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "perf.h"

#define CHECK_SEED_TIMED 99 /* inputs of the timed calls, when checking */

struct perf_bench {
    const struct perf_options *opt;
    const struct perf_coll *coll;
    cfxComm_t comm;
    int rank;
    int nranks;
    struct perf_gpu *gpu; /* device mode: this rank's GPU; NULL: host buffers */
    cfxStream_t stream;   /* of the timed and checked calls: the GPU's, or NULL */
    char *send_buf;       /* the call's buffers: host or device memory */
    char *recv_buf;
    char *send_host; /* where checks fill and verify: the buffers themselves (host), */
    char *recv_host; /* or host staging copies of them (device; NULL without -c) */
    size_t buf_bytes;
    char notes[512];         /* "# ..." lines of the header: what --mem chose, and why */
    struct perf_report *rep; /* rank 0 only */
    long long errors;        /* this rank's checks with wrong elements */
    double busbw_sum;
    int busbw_count;
    uint32_t check_seed;
    struct perf_enqueue enqueue; /* device mode, this rank's own */
    long enqueue_first_calls;
};

/* The buffers of one size. */
struct sizing {
    struct perf_counts counts;
    size_t elem_bytes;
    size_t total_bytes; /* the larger of send and receive: the printed size */
    size_t steps;       /* distinct offsets in the buffers */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void report_failure(const struct perf_bench *b, const char *call, cfxResult_t res)
{
    fprintf(stderr, "conflux-perf: rank %d: %s failed: %s: %s\n", b->rank, call,
            cfxGetErrorString(res), cfxGetLastError(b->comm));
}

/* Return -1 from the enclosing function when a Conflux call fails. */
#define BENCH_CALL(b, name, call)                                                                  \
    do {                                                                                           \
        cfxResult_t res_ = (call);                                                                 \
        if (res_ != cfxSuccess) {                                                                  \
            report_failure((b), (name), res_);                                                     \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

static void sizing_init(const struct perf_bench *b, size_t bytes, cfxDataType_t type,
                        struct sizing *sz)
{
    sz->elem_bytes = perf_type_size(type);
    b->coll->counts(bytes / sz->elem_bytes, b->nranks, &sz->counts);
    size_t elems = sz->counts.send > sz->counts.recv ? sz->counts.send : sz->counts.recv;
    sz->total_bytes = elems * sz->elem_bytes;
    sz->steps = sz->total_bytes ? b->buf_bytes / sz->total_bytes : 1;
    if (sz->steps == 0)
        sz->steps = 1;
}

/* The send and receive pointers of iteration `iter` inside the buffers at
 * send_base and recv_base (the call's, or the host copies of them). */
static void place_buffers(const struct perf_bench *b, const struct sizing *sz, char *send_base,
                          char *recv_base, int inplace, long iter, char **send_p, char **recv_p)
{
    size_t shift = sz->total_bytes * ((size_t)iter % sz->steps);
    size_t rank = (size_t)b->rank;
    char *recv = recv_base + shift;
    *send_p =
        inplace ? recv + sz->counts.send_inplace_offset * sz->elem_bytes * rank : send_base + shift;
    *recv_p = inplace ? recv + sz->counts.recv_inplace_offset * sz->elem_bytes * rank : recv;
}

static cfxResult_t start_call(const struct perf_bench *b, const struct sizing *sz,
                              cfxDataType_t type, cfxRedOp_t op, int root, int inplace, long iter)
{
    char *send, *recv;
    place_buffers(b, sz, b->send_buf, b->recv_buf, inplace, iter, &send, &recv);
    return b->coll->run(send, recv, sz->counts.param, type, op, root, b->comm, b->stream);
}

/* Wait until the calls enqueued so far are done (device mode; a host call
 * is done when it returns), and surface an error the GPU work hit. */
static int complete_calls(const struct perf_bench *b)
{
    if (b->gpu == NULL)
        return 0;
    if (perf_gpu_sync(b->gpu) != 0)
        return -1;
    cfxResult_t async_res = cfxSuccess;
    BENCH_CALL(b, "cfxCommGetAsyncError", cfxCommGetAsyncError(b->comm, &async_res));
    BENCH_CALL(b, "the calls on the stream", async_res);
    return 0;
}

/* ------------------------------------------------------------ check */

/* Inputs for the call at offset 0, outputs set to 0xff; in device mode
 * filled on the host and copied to the GPU (the first total_bytes of both
 * buffers: everything the call at offset 0 reads or writes). */
static int prepare_data(const struct perf_bench *b, const struct sizing *sz,
                        const struct perf_values *values, int root, int inplace)
{
    char *send, *recv;
    place_buffers(b, sz, b->send_host, b->recv_host, inplace, 0, &send, &recv);
    memset(inplace ? b->recv_host : recv, 0xff,
           inplace ? sz->total_bytes : sz->counts.recv * sz->elem_bytes);
    /* Broadcast and scatter read sendbuff on the root only. */
    int from_root = b->coll->kind == PERF_BROADCAST || b->coll->kind == PERF_SCATTER;
    if (!from_root || b->rank == root)
        perf_values_fill(values, send, sz->counts.send, from_root ? root : b->rank, 0);
    if (b->gpu == NULL || sz->total_bytes == 0)
        return 0;
    if (perf_gpu_to_device(b->gpu, b->recv_buf, b->recv_host, sz->total_bytes) != 0)
        return -1;
    if (!inplace && perf_gpu_to_device(b->gpu, b->send_buf, b->send_host, sz->total_bytes) != 0)
        return -1;
    return 0;
}

/* Device mode: the outputs of the call at offset 0 back on the host, once
 * the call is done. */
static int fetch_outputs(const struct perf_bench *b, const struct sizing *sz)
{
    if (complete_calls(b) != 0)
        return -1;
    if (b->gpu == NULL || sz->total_bytes == 0)
        return 0;
    return perf_gpu_to_host(b->gpu, b->recv_host, b->recv_buf, sz->total_bytes);
}

/* Wrong elements of this rank's output of the call at offset 0 (host copy). */
static size_t verify_data(const struct perf_bench *b, const struct sizing *sz,
                          const struct perf_values *values, int root, int inplace)
{
    char *send, *recv;
    place_buffers(b, sz, b->send_host, b->recv_host, inplace, 0, &send, &recv);
    size_t block = sz->counts.param, n = (size_t)b->nranks, wrong = 0;
    switch (b->coll->kind) {
    case PERF_ALLREDUCE: return perf_values_verify(values, recv, block, 0, -1);
    case PERF_REDUCE: return b->rank == root ? perf_values_verify(values, recv, block, 0, -1) : 0;
    case PERF_REDUCESCATTER:
        return perf_values_verify(values, recv, block, block * (size_t)b->rank, -1);
    case PERF_BROADCAST: return perf_values_verify(values, recv, block, 0, root);
    case PERF_SENDRECV:
        return perf_values_verify(values, recv, block, 0, (b->rank - 1 + b->nranks) % b->nranks);
    case PERF_ALLGATHER:
        for (size_t j = 0; j < n; j++)
            wrong +=
                perf_values_verify(values, recv + j * block * sz->elem_bytes, block, 0, (int)j);
        return wrong;
    case PERF_ALLTOALL: /* Block j: elements [rank*block, ...) of rank j's input. */
        for (size_t j = 0; j < n; j++)
            wrong += perf_values_verify(values, recv + j * block * sz->elem_bytes, block,
                                        block * (size_t)b->rank, (int)j);
        return wrong;
    case PERF_GATHER:
        for (size_t j = 0; b->rank == root && j < n; j++)
            wrong +=
                perf_values_verify(values, recv + j * block * sz->elem_bytes, block, 0, (int)j);
        return wrong;
    case PERF_SCATTER:
        return perf_values_verify(values, recv, block, block * (size_t)b->rank, root);
    }
    return 0;
}

/* -c checked calls; *wrong_p is the total over ranks of the last one. */
static int run_checks(struct perf_bench *b, const struct sizing *sz, cfxDataType_t type,
                      cfxRedOp_t op, int root, int inplace, long long *wrong_p)
{
    long long wrong = 0;
    for (int c = 0; c < b->opt->check_iters; c++) {
        struct perf_values values;
        perf_values_init(&values, b->coll, type, op, b->nranks, ++b->check_seed);
        if (prepare_data(b, sz, &values, root, inplace) != 0)
            return -1;
        BENCH_CALL(b, b->coll->name, start_call(b, sz, type, op, root, inplace, 0));
        if (fetch_outputs(b, sz) != 0)
            return -1;
        long long local = (long long)verify_data(b, sz, &values, root, inplace);
        if (local > 0)
            b->errors++;
        wrong = local;
        BENCH_CALL(b, "cfxAllReduce (wrong count)",
                   cfxAllReduce(&wrong, &wrong, 1, cfxInt64, cfxSum, b->comm, NULL));
        if (wrong > 0)
            break;
    }
    *wrong_p = wrong;
    return 0;
}

/* ------------------------------------------------------------ timing */

/* Combine this rank's seconds per call across ranks, as -a says. */
static int combine_time(struct perf_bench *b, double *seconds)
{
    static const cfxRedOp_t ops[] = {cfxSum, cfxSum, cfxMin, cfxMax};
    if (b->opt->average == 0) {
        BENCH_CALL(b, "cfxBroadcast (time)",
                   cfxBroadcast(seconds, seconds, 1, cfxFloat64, 0, b->comm, NULL));
        return 0;
    }
    BENCH_CALL(b, "cfxAllReduce (time)",
               cfxAllReduce(seconds, seconds, 1, cfxFloat64, ops[b->opt->average], b->comm, NULL));
    if (b->opt->average == 1)
        *seconds /= b->nranks;
    return 0;
}

/* One timed call's time from call to return (device mode). */
static void note_enqueue(struct perf_bench *b, const struct sizing *sz, double seconds)
{
    struct perf_enqueue *e = &b->enqueue;
    double us = seconds * 1e6;
    e->mean_us += (us - e->mean_us) / (double)++e->calls;
    if (e->calls == 1)
        e->first_bytes = sz->total_bytes;
    if (sz->total_bytes == e->first_bytes) {
        long first = ++b->enqueue_first_calls;
        e->first_mean_us += (us - e->first_mean_us) / (double)first;
    }
}

static int time_one(struct perf_bench *b, const struct sizing *sz, cfxDataType_t type,
                    cfxRedOp_t op, int root, int inplace, struct perf_result *res)
{
    const struct perf_options *opt = b->opt;
    const char *name = b->coll->name;
    if (inplace && (b->coll->flags & PERF_COLL_NO_INPLACE)) {
        /* No in-place form (alltoall): the columns say nan and N/A. */
        *res = (struct perf_result){.bytes = sz->total_bytes,
                                    .count = sz->counts.param,
                                    .time_us = NAN,
                                    .algbw = NAN,
                                    .busbw = NAN,
                                    .wrong = -1,
                                    .inplace = 1};
        return 0;
    }
    if (opt->check_iters > 0) {
        struct perf_values values;
        perf_values_init(&values, b->coll, type, op, b->nranks, CHECK_SEED_TIMED);
        if (prepare_data(b, sz, &values, root, inplace) != 0)
            return -1;
    }
    BENCH_CALL(b, name, start_call(b, sz, type, op, root, inplace, 0));
    if (complete_calls(b) != 0)
        return -1;

    double start = now_s();
    for (long iter = 0; iter < opt->iters; iter++) {
        if (opt->agg_iters > 1)
            BENCH_CALL(b, "cfxGroupStart", cfxGroupStart());
        for (long a = 0; a < opt->agg_iters; a++) {
            double called = b->gpu != NULL ? now_s() : 0.0;
            BENCH_CALL(b, name,
                       start_call(b, sz, type, op, root, inplace, iter * opt->agg_iters + a));
            if (b->gpu != NULL)
                note_enqueue(b, sz, now_s() - called);
        }
        if (opt->agg_iters > 1)
            BENCH_CALL(b, "cfxGroupEnd", cfxGroupEnd());
    }
    if (complete_calls(b) != 0) /* the time includes completion, as nccl-tests' */
        return -1;
    double seconds = (now_s() - start) / ((double)opt->iters * opt->agg_iters);
    if (combine_time(b, &seconds) != 0)
        return -1;

    res->bytes = sz->total_bytes;
    res->count = sz->counts.param;
    res->inplace = inplace;
    res->time_us = seconds * 1e6;
    res->algbw = (double)sz->total_bytes / 1e9 / seconds;
    res->busbw = res->algbw * b->coll->bus_factor(b->nranks);
    res->wrong = -1;
    if (opt->check_iters > 0 && !(inplace && (b->coll->flags & PERF_COLL_NO_INPLACE_CHECK)))
        if (run_checks(b, sz, type, op, root, inplace, &res->wrong) != 0)
            return -1;
    b->busbw_sum += res->busbw;
    b->busbw_count++;
    return 0;
}

static int warmup(struct perf_bench *b, size_t bytes, cfxDataType_t type, cfxRedOp_t op, int root)
{
    struct sizing sz;
    sizing_init(b, bytes, type, &sz);
    for (long iter = 0; iter < b->opt->warmup_iters; iter++)
        BENCH_CALL(b, b->coll->name, start_call(b, &sz, type, op, root, 0, iter));
    return complete_calls(b);
}

/* The sweep over sizes for one type, op and root. */
static int sweep(struct perf_bench *b, cfxDataType_t type, cfxRedOp_t op, const char *op_name,
                 int root)
{
    const struct perf_options *opt = b->opt;
    int call_root = root < 0 ? 0 : root;
    if (warmup(b, opt->max_bytes, type, op, call_root) != 0 ||
        warmup(b, opt->min_bytes, type, op, call_root) != 0)
        return -1;
    for (size_t bytes = opt->min_bytes; bytes <= opt->max_bytes;) {
        struct sizing sz;
        sizing_init(b, bytes, type, &sz);
        perf_report_row_start(b->rep, sz.total_bytes, sz.counts.param, type, op_name, root);
        for (int inplace = 0; inplace <= 1; inplace++) {
            struct perf_result res;
            if (time_one(b, &sz, type, op, call_root, inplace, &res) != 0)
                return -1;
            perf_report_result(b->rep, type, op_name, root, &res);
        }
        perf_report_row_end(b->rep);
        size_t next = opt->step_factor > 1 ? bytes * opt->step_factor : bytes + opt->step_bytes;
        if (next <= bytes)
            break; /* 0 * factor, or overflow */
        bytes = next;
    }
    return 0;
}

/* ------------------------------------------------------------ setup */

/* "#  Rank ..." lines for every rank, gathered with cfxAllGather, and the
 * memory kind of the run: "host", "device", or "mixed" when ranks differ. */
struct rank_line {
    int32_t rank;
    int32_t pid;
    int32_t device; /* -1: host buffers */
    char host[56];
    char busid[20];
    char gpu_name[64];
};

static void format_rank_line(const struct rank_line *line, char *out, size_t out_bytes)
{
    if (line->device < 0)
        snprintf(out, out_bytes,
                 "#  Rank %2d Group  0 Pid %6d on %10s device -1 [cpu] host memory\n",
                 (int)line->rank, (int)line->pid, line->host);
    else
        snprintf(out, out_bytes, "#  Rank %2d Group  0 Pid %6d on %10s device %2d [%s] %s\n",
                 (int)line->rank, (int)line->pid, line->host, (int)line->device, line->busid,
                 line->gpu_name);
}

static int gather_rank_lines(struct perf_bench *b, char **text_p, const char **memory_p)
{
    struct rank_line mine = {.rank = b->rank, .pid = (int32_t)getpid(), .device = -1};
    gethostname(mine.host, sizeof(mine.host) - 1);
    if (b->gpu != NULL) {
        mine.device = perf_gpu_device(b->gpu);
        snprintf(mine.busid, sizeof(mine.busid), "%s", perf_gpu_busid(b->gpu));
        snprintf(mine.gpu_name, sizeof(mine.gpu_name), "%s", perf_gpu_name(b->gpu));
    }
    struct rank_line *all = calloc((size_t)b->nranks, sizeof(*all));
    size_t line_bytes = 256, text_bytes = (size_t)b->nranks * line_bytes + 1;
    char *text = malloc(text_bytes);
    if (all == NULL || text == NULL) {
        fprintf(stderr, "conflux-perf: rank %d: out of memory\n", b->rank);
        free(all);
        free(text);
        return -1;
    }
    cfxResult_t res = cfxAllGather(&mine, all, sizeof(mine), cfxUint8, b->comm, NULL);
    if (res != cfxSuccess) {
        report_failure(b, "cfxAllGather (rank lines)", res);
        free(all);
        free(text);
        return -1;
    }
    int on_gpu = 0;
    text[0] = '\0';
    for (int r = 0; r < b->nranks; r++) {
        format_rank_line(&all[r], text + strlen(text), line_bytes);
        on_gpu += all[r].device >= 0;
    }
    *memory_p = on_gpu == 0 ? "host" : on_gpu == b->nranks ? "device" : "mixed";
    free(all);
    *text_p = text;
    return 0;
}

/* Single-threaded memcpy between the two touched buffers; GB/s (1e9). */
static double measure_memcpy(char *dst, const char *src, size_t bytes)
{
    void *(*volatile copy)(void *, const void *, size_t) = memcpy; /* not optimised away */
    copy(dst, src, bytes);
    int reps = 0;
    double start = now_s(), elapsed;
    do {
        copy(dst, src, bytes);
        reps++;
        elapsed = now_s() - start;
    } while (reps < 3 || (elapsed < 0.2 && reps < 10000));
    return (double)bytes * reps / elapsed / 1e9;
}

/* The footer's copy reference: a host memcpy, or in device mode the GPU's
 * device-to-device copy, so the copy ceiling stands next to the busbw. */
static int measure_copy(struct perf_bench *b, struct perf_copy *copy_p)
{
    size_t bytes = b->opt->max_bytes;
    *copy_p = (struct perf_copy){0};
    if (bytes == 0)
        return 0;
    if (b->gpu != NULL)
        return perf_gpu_copy_bandwidth(b->gpu, b->recv_buf, b->send_buf, bytes, copy_p);
    copy_p->bytes = bytes;
    copy_p->gbps = measure_memcpy(b->recv_buf, b->send_buf, bytes);
    return 0;
}

/* --mem (memory.c): host buffers, or this rank's GPU opened, its stream
 * the one of the timed and checked calls. 0, or -1 printed. */
static int choose_memory(struct perf_bench *b, int local_rank)
{
    if (perf_memory_choose(b->opt, b->rank, local_rank, &b->gpu, b->notes, sizeof(b->notes)) != 0)
        return -1;
    b->stream = b->gpu != NULL ? perf_gpu_stream(b->gpu) : NULL;
    return 0;
}

static int alloc_buffers(struct perf_bench *b)
{
    size_t page = 4096;
    b->buf_bytes = b->opt->max_bytes;
    size_t alloc_bytes = (b->buf_bytes + page - 1) / page * page;
    if (alloc_bytes == 0)
        alloc_bytes = page;
    if (b->gpu != NULL) {
        /* Touched by perf_gpu_alloc (cuMemsetD8); printed when it fails. */
        b->send_buf = perf_gpu_alloc(b->gpu, alloc_bytes);
        b->recv_buf = b->send_buf != NULL ? perf_gpu_alloc(b->gpu, alloc_bytes) : NULL;
        if (b->recv_buf == NULL)
            return -1;
        if (b->opt->check_iters == 0)
            return 0;
        /* Pinned: checks copy through them while other ranks' kernels may
         * spin (ranks as threads share the context). */
        b->send_host = perf_gpu_host_alloc(b->gpu, alloc_bytes);
        b->recv_host = b->send_host != NULL ? perf_gpu_host_alloc(b->gpu, alloc_bytes) : NULL;
    } else {
        b->send_buf = b->send_host = aligned_alloc(page, alloc_bytes);
        b->recv_buf = b->recv_host = aligned_alloc(page, alloc_bytes);
    }
    if (b->send_host == NULL || b->recv_host == NULL) {
        fprintf(stderr, "conflux-perf: rank %d: cannot allocate 2 x %zu bytes\n", b->rank,
                alloc_bytes);
        return -1;
    }
    memset(b->send_host, 0, alloc_bytes); /* touch every page now, not in the timed loop */
    memset(b->recv_host, 0, alloc_bytes);
    return 0;
}

static void free_buffers(struct perf_bench *b)
{
    if (b->gpu != NULL) {
        perf_gpu_free(b->gpu, b->send_buf);
        perf_gpu_free(b->gpu, b->recv_buf);
        perf_gpu_host_free(b->gpu, b->send_host);
        perf_gpu_host_free(b->gpu, b->recv_host);
    } else {
        free(b->send_buf);
        free(b->recv_buf);
    }
}

static int run_all(struct perf_bench *b)
{
    const struct perf_options *opt = b->opt;
    const struct perf_coll *coll = b->coll;
    struct perf_header header = {.notes = b->notes};
    char *rank_lines = NULL;
    if (gather_rank_lines(b, &rank_lines, &header.memory) != 0)
        return -1;
    header.rank_lines = rank_lines;
    perf_report_header(b->rep, &header);
    free(rank_lines);

    int type_first = opt->type == PERF_ALL ? 0 : opt->type;
    int type_last = opt->type == PERF_ALL ? cfxNumTypes - 1 : opt->type;
    int has_op = (coll->flags & PERF_COLL_HAS_OP) != 0;
    int op_first = !has_op ? cfxSum : opt->op == PERF_ALL ? 0 : opt->op;
    int op_last = !has_op ? cfxSum : opt->op == PERF_ALL ? cfxNumOps - 1 : opt->op;
    int has_root = (coll->flags & PERF_COLL_HAS_ROOT) != 0;
    int root_first = !has_root ? -1 : opt->root == PERF_ALL ? 0 : opt->root;
    int root_last = !has_root ? -1 : opt->root == PERF_ALL ? b->nranks - 1 : opt->root;
    for (int t = type_first; t <= type_last; t++)
        for (int o = op_first; o <= op_last; o++)
            for (int r = root_first; r <= root_last; r++)
                if (sweep(b, (cfxDataType_t)t, (cfxRedOp_t)o,
                          has_op ? perf_op_name((cfxRedOp_t)o) : "none", r) != 0)
                    return -1;
    return 0;
}

struct perf_bench *perf_bench_open(const struct perf_options *opt, int rank, int nranks,
                                   int local_rank, int *status_p)
{
    if (opt->root != PERF_ALL && opt->root >= nranks && (opt->coll->flags & PERF_COLL_HAS_ROOT)) {
        if (rank == 0)
            fprintf(stderr, "conflux-perf: -r %d: there are only %d ranks\n", opt->root, nranks);
        *status_p = PERF_EXIT_USAGE;
        return NULL;
    }
    struct perf_bench *b = calloc(1, sizeof(*b));
    if (b == NULL) {
        fprintf(stderr, "conflux-perf: rank %d: out of memory\n", rank);
        *status_p = -1;
        return NULL;
    }
    *b = (struct perf_bench){.opt = opt, .coll = opt->coll, .rank = rank, .nranks = nranks};
    if (choose_memory(b, local_rank) != 0 || alloc_buffers(b) != 0) {
        perf_bench_close(b);
        *status_p = -1;
        return NULL;
    }
    return b;
}

void perf_bench_close(struct perf_bench *b)
{
    if (b == NULL)
        return;
    free_buffers(b);
    perf_gpu_close(b->gpu);
    free(b);
}

int perf_bench_run(struct perf_bench *b, cfxUniqueId id, const char *launch)
{
    const struct perf_options *opt = b->opt;
    int status = -1;
    cfxResult_t res = cfxCommInitRank(&b->comm, b->nranks, id, b->rank);
    if (res != cfxSuccess) {
        fprintf(stderr, "conflux-perf: rank %d: cfxCommInitRank failed: %s: %s\n", b->rank,
                cfxGetErrorString(res), cfxGetLastError(NULL));
        goto out_close;
    }
    void *send_reg = NULL, *recv_reg = NULL;
    if (opt->local_register) {
        size_t reg_bytes = (b->buf_bytes + 4095) / 4096 * 4096;
        res = cfxCommRegister(b->comm, b->send_buf, reg_bytes > 0 ? reg_bytes : 4096, &send_reg);
        if (res == cfxSuccess)
            res =
                cfxCommRegister(b->comm, b->recv_buf, reg_bytes > 0 ? reg_bytes : 4096, &recv_reg);
        if (res != cfxSuccess) {
            report_failure(b, "cfxCommRegister", res);
            goto out_abort;
        }
    }
    if (b->rank == 0)
        b->rep = perf_report_open(opt, b->nranks, launch);
    if (run_all(b) != 0)
        goto out_abort;

    long long errors = b->errors;
    res = cfxAllReduce(&errors, &errors, 1, cfxInt64, cfxSum, b->comm, NULL);
    if (res != cfxSuccess) {
        report_failure(b, "cfxAllReduce (error count)", res);
        goto out_abort;
    }
    status = errors ? PERF_EXIT_FAILED : PERF_EXIT_OK;
    if (b->rank == 0) {
        /* The other ranks wait in cfxCommFinalize, idle, while rank 0 copies. */
        struct perf_copy copy;
        if (measure_copy(b, &copy) != 0)
            status = PERF_EXIT_FAILED;
        double avg = b->busbw_count ? b->busbw_sum / b->busbw_count : 0.0;
        if (perf_report_close(b->rep, &copy, &b->enqueue, errors, avg) != 0)
            status = PERF_EXIT_FAILED;
        b->rep = NULL;
    }
    if (send_reg != NULL)
        cfxCommDeregister(b->comm, send_reg);
    if (recv_reg != NULL)
        cfxCommDeregister(b->comm, recv_reg);
    res = cfxCommFinalize(b->comm);
    if (res != cfxSuccess) {
        report_failure(b, "cfxCommFinalize", res);
        status = -1;
    }
    cfxCommDestroy(b->comm);
    goto out_close;

out_abort:
    perf_report_abandon(b->rep);
    cfxCommAbort(b->comm);
out_close:
    perf_bench_close(b);
    return status;
}
