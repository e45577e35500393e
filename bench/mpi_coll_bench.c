/*
 * mpi_coll_bench: Open MPI's MPI_Allreduce (float32, MPI_SUM), MPI_Bcast
 * (float32, root 0), MPI_Allgather or MPI_Alltoall (float32), timed exactly
 * as conflux-perf times cfxAllReduce, cfxBroadcast, cfxAllGather or
 * cfxAlltoAll out of place, for bench/compare.sh. Also built as mpi_allreduce_bench, its former
 * name.
 *
 *   mpirun -np 2 --mca pml ob1 --mca btl self,vader bench/mpi_coll_bench -b 8 -e 128M -f 2
 *   mpirun -np 2 --mca pml ob1 --mca btl self,vader bench/mpi_coll_bench -C allgather -b 1M
 *
 * Flags, the sweep, the sizes, the timing rule and the table: sweep.h. MPI
 * carries the timed calls and the few bookkeeping ones (time and error
 * totals), nothing else; only rank 0 prints. MPI_Bcast has one buffer: the
 * root's is its send buffer, the others' their receive buffer (conflux-perf's
 * out-of-place broadcast also copies the root's send buffer into its receive
 * buffer; MPI's does not). Exit codes: 0 good, 1 wrong results or an MPI
 * error, 2 usage.
 */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "sweep.h"

static const char launch_help[] =
    "Ranks: started by mpirun. Choose the transport with --mca btl, e.g.\n"
    "  shared memory:  --mca pml ob1 --mca btl self,vader\n"
    "  loopback TCP:   --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo";

/* Keep in enum sweep_coll order. */
static const char *const mpi_names[] = {"MPI_Allreduce", "MPI_Bcast", "MPI_Allgather",
                                        "MPI_Alltoall"};

struct mpi_bench {
    const struct sweep_options *opt;
    int rank;
    int nranks;
    char *send_buf;
    char *recv_buf;
    long long wrong; /* this rank's wrong elements over all checks */
    double busbw_sum;
    int busbw_count;
};

/* One call of the collective at offset (iter mod steps) * size; an MPI error code. */
static int coll_at(const struct mpi_bench *b, const struct sweep_sizing *sz, long iter)
{
    size_t shift = sz->total_bytes * ((size_t)iter % sz->steps);
    char *send = b->send_buf + shift;
    char *recv = b->recv_buf + shift;
    int count = (int)sz->count;
    switch (b->opt->coll) {
    case SWEEP_ALLREDUCE:
        return MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    case SWEEP_BROADCAST:
        return MPI_Bcast(b->rank == SWEEP_ROOT ? send : recv, count, MPI_FLOAT, SWEEP_ROOT,
                         MPI_COMM_WORLD);
    case SWEEP_ALLGATHER:
        return MPI_Allgather(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, MPI_COMM_WORLD);
    case SWEEP_ALLTOALL:
        return MPI_Alltoall(send, count, MPI_FLOAT, recv, count, MPI_FLOAT, MPI_COMM_WORLD);
    }
    return MPI_ERR_OTHER;
}

static int warmup(const struct mpi_bench *b, size_t bytes)
{
    struct sweep_sizing sz;
    sweep_sizing_init(b->opt, bytes, b->nranks, &sz);
    for (long iter = 0; iter < b->opt->warmup_iters; iter++)
        if (coll_at(b, &sz, iter) != MPI_SUCCESS)
            return -1;
    return 0;
}

/* Wrong elements of this rank's output of the checked call (offset 0). */
static size_t verify(const struct mpi_bench *b, const struct sweep_sizing *sz)
{
    const float *recv = (const float *)b->recv_buf;
    size_t wrong = 0;
    switch (b->opt->coll) {
    case SWEEP_ALLREDUCE: return sweep_verify(recv, sz->count, b->nranks);
    case SWEEP_BROADCAST:
        /* The root's buffer is its input: it must come back unchanged. */
        if (b->rank == SWEEP_ROOT)
            recv = (const float *)b->send_buf;
        return sweep_verify_copy(recv, sz->count, SWEEP_ROOT);
    case SWEEP_ALLGATHER:
        for (int r = 0; r < b->nranks; r++)
            wrong += sweep_verify_copy(recv + (size_t)r * sz->count, sz->count, r);
        return wrong;
    case SWEEP_ALLTOALL:
        /* Block r is rank r's block for this rank: its send elements from
         * rank * count on. */
        for (int r = 0; r < b->nranks; r++)
            wrong += sweep_verify_copy_at(recv + (size_t)r * sz->count, sz->count, r,
                                          (size_t)b->rank * sz->count);
        return wrong;
    }
    return sz->count;
}

/* One size: untimed call, timed loop, mean over ranks, checks. */
static int time_size(struct mpi_bench *b, size_t bytes)
{
    const struct sweep_options *opt = b->opt;
    struct sweep_sizing sz;
    sweep_sizing_init(opt, bytes, b->nranks, &sz);
    if (coll_at(b, &sz, 0) != MPI_SUCCESS)
        return -1;
    double start = sweep_now_s();
    for (long iter = 0; iter < opt->iters; iter++)
        if (coll_at(b, &sz, iter) != MPI_SUCCESS)
            return -1;
    double seconds = (sweep_now_s() - start) / (double)opt->iters;
    if (MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) !=
        MPI_SUCCESS)
        return -1;
    seconds /= b->nranks;
    if (b->rank == 0) {
        b->busbw_sum += sweep_print_row(stdout, opt, &sz, seconds, b->nranks);
        b->busbw_count++;
    }

    for (long c = 0; c < opt->check_iters; c++) {
        memset(b->recv_buf, 0xff, sz.total_bytes);
        if (coll_at(b, &sz, 0) != MPI_SUCCESS)
            return -1;
        b->wrong += (long long)verify(b, &sz);
    }
    return 0;
}

static int run(struct mpi_bench *b)
{
    const struct sweep_options *opt = b->opt;
    size_t buf_bytes = sweep_buffer_bytes(opt);
    b->send_buf = aligned_alloc(4096, buf_bytes);
    b->recv_buf = aligned_alloc(4096, buf_bytes);
    if (b->send_buf == NULL || b->recv_buf == NULL) {
        fprintf(stderr, "mpi_coll_bench: rank %d: cannot allocate 2 x %zu bytes\n", b->rank,
                buf_bytes);
        return -1;
    }
    /* Touch every page now, not in the timed loop; the inputs stay valid throughout. */
    if (opt->coll == SWEEP_ALLREDUCE)
        sweep_fill((float *)b->send_buf, buf_bytes / sizeof(float), b->rank);
    else
        sweep_fill_copy((float *)b->send_buf, buf_bytes / sizeof(float), b->rank);
    memset(b->recv_buf, 0, buf_bytes);

    if (b->rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING] = "";
        int len = 0;
        MPI_Get_library_version(version, &len);
        char *newline = strchr(version, '\n');
        if (newline != NULL)
            *newline = '\0';
        char title[MPI_MAX_LIBRARY_VERSION_STRING + 64];
        snprintf(title, sizeof(title), "mpi_coll_bench: %s, %s", mpi_names[opt->coll], version);
        sweep_print_header(stdout, title, opt, b->nranks);
    }
    if (warmup(b, opt->max_bytes) != 0 || warmup(b, opt->min_bytes) != 0)
        return -1;
    size_t bytes = opt->min_bytes;
    do {
        if (time_size(b, bytes) != 0)
            return -1;
    } while ((bytes = sweep_next_bytes(opt, bytes)) != 0);
    return 0;
}

int main(int argc, char **argv)
{
    struct sweep_options opt;
    int help = 0;
    unsigned colls = SWEEP_COLL_BIT(SWEEP_ALLREDUCE) | SWEEP_COLL_BIT(SWEEP_BROADCAST) |
                     SWEEP_COLL_BIT(SWEEP_ALLGATHER) | SWEEP_COLL_BIT(SWEEP_ALLTOALL);
    const char *slash = strrchr(argv[0], '/');
    const char *prog = slash ? slash + 1 : argv[0]; /* or mpi_allreduce_bench */
    int status = sweep_options_parse(argc, argv, prog, launch_help, colls, &opt, &help);
    if (status != SWEEP_EXIT_OK || help)
        return status;
    if (opt.max_bytes / sizeof(float) > INT_MAX) {
        fprintf(stderr, "%s: -e %zu: MPI counts are ints, %d elements at most\n", prog,
                opt.max_bytes, INT_MAX);
        return SWEEP_EXIT_USAGE;
    }

    MPI_Init(&argc, &argv);
    /* Errors come back as codes, so the benchmark can say which call failed. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    struct mpi_bench b = {.opt = &opt};
    MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b.nranks);

    if (run(&b) != 0) {
        fprintf(stderr, "mpi_coll_bench: rank %d: %s failed\n", b.rank, mpi_names[opt.coll]);
        MPI_Abort(MPI_COMM_WORLD, SWEEP_EXIT_FAILED);
    }
    long long wrong = b.wrong;
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (b.rank == 0)
        sweep_print_footer(stdout, wrong, b.busbw_count ? b.busbw_sum / b.busbw_count : 0.0);
    free(b.send_buf);
    free(b.recv_buf);
    MPI_Finalize();
    return wrong ? SWEEP_EXIT_FAILED : SWEEP_EXIT_OK;
}
