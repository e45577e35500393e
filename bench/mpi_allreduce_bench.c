/*
 * mpi_allreduce_bench: MPI_Allreduce (float32, MPI_SUM) timed exactly as
 * conflux-perf times cfxAllReduce out of place, for bench/compare.sh.
 *
 *   mpirun -np 2 --mca pml ob1 --mca btl self,vader bench/mpi_allreduce_bench -b 8 -e 128M -f 2
 *
 * Flags, the sweep, the timing rule and the table: sweep.h. MPI carries the
 * timed calls and the few bookkeeping ones (time and error totals), nothing
 * else; only rank 0 prints. Exit codes: 0 good, 1 wrong results or an MPI
 * error, 2 usage.
 */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "sweep.h"

static const char launch_help[] =
    "Ranks: started by mpirun. Choose the transport with --mca btl, e.g.\n"
    "  shared memory:  --mca pml ob1 --mca btl self,vader\n"
    "  loopback TCP:   --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo";

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

/* The send and receive pointers of call `iter` at `bytes`. */
static void call_buffers(const struct mpi_bench *b, size_t bytes, long iter, void **send_p,
                         void **recv_p)
{
    size_t shift = bytes * ((size_t)iter % sweep_steps(b->opt, bytes));
    *send_p = b->send_buf + shift;
    *recv_p = b->recv_buf + shift;
}

static int allreduce_at(const struct mpi_bench *b, size_t bytes, long iter)
{
    void *send, *recv;
    call_buffers(b, bytes, iter, &send, &recv);
    return MPI_Allreduce(send, recv, (int)(bytes / sizeof(float)), MPI_FLOAT, MPI_SUM,
                         MPI_COMM_WORLD);
}

static int warmup(const struct mpi_bench *b, size_t bytes)
{
    for (long iter = 0; iter < b->opt->warmup_iters; iter++)
        if (allreduce_at(b, bytes, iter) != MPI_SUCCESS)
            return -1;
    return 0;
}

/* One size: untimed call, timed loop, mean over ranks, checks. */
static int time_size(struct mpi_bench *b, size_t bytes)
{
    const struct sweep_options *opt = b->opt;
    if (allreduce_at(b, bytes, 0) != MPI_SUCCESS)
        return -1;
    double start = sweep_now_s();
    for (long iter = 0; iter < opt->iters; iter++)
        if (allreduce_at(b, bytes, iter) != MPI_SUCCESS)
            return -1;
    double seconds = (sweep_now_s() - start) / (double)opt->iters;
    if (MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) !=
        MPI_SUCCESS)
        return -1;
    seconds /= b->nranks;
    if (b->rank == 0) {
        b->busbw_sum += sweep_print_row(stdout, bytes, seconds, b->nranks);
        b->busbw_count++;
    }

    size_t count = bytes / sizeof(float);
    for (long c = 0; c < opt->check_iters; c++) {
        memset(b->recv_buf, 0xff, bytes);
        if (allreduce_at(b, bytes, 0) != MPI_SUCCESS)
            return -1;
        b->wrong += (long long)sweep_verify((const float *)b->recv_buf, count, b->nranks);
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
        fprintf(stderr, "mpi_allreduce_bench: rank %d: cannot allocate 2 x %zu bytes\n", b->rank,
                buf_bytes);
        return -1;
    }
    /* Touch every page now, not in the timed loop; the inputs stay valid throughout. */
    sweep_fill((float *)b->send_buf, buf_bytes / sizeof(float), b->rank);
    memset(b->recv_buf, 0, buf_bytes);

    if (b->rank == 0) {
        char version[MPI_MAX_LIBRARY_VERSION_STRING] = "";
        int len = 0;
        MPI_Get_library_version(version, &len);
        char *newline = strchr(version, '\n');
        if (newline != NULL)
            *newline = '\0';
        char title[MPI_MAX_LIBRARY_VERSION_STRING + 64];
        snprintf(title, sizeof(title), "mpi_allreduce_bench: MPI_Allreduce, %s", version);
        sweep_print_header(stdout, title, opt, b->nranks);
    }
    if (warmup(b, opt->max_bytes) != 0 || warmup(b, opt->min_bytes) != 0)
        return -1;
    size_t bytes = opt->min_bytes;
    do {
        if (time_size(b, bytes / sizeof(float) * sizeof(float)) != 0)
            return -1;
    } while ((bytes = sweep_next_bytes(opt, bytes)) != 0);
    return 0;
}

int main(int argc, char **argv)
{
    struct sweep_options opt;
    int help = 0;
    int status = sweep_options_parse(argc, argv, "mpi_allreduce_bench", launch_help, &opt, &help);
    if (status != SWEEP_EXIT_OK || help)
        return status;

    MPI_Init(&argc, &argv);
    /* Errors come back as codes, so the benchmark can say which call failed. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    struct mpi_bench b = {.opt = &opt};
    MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &b.nranks);

    if (run(&b) != 0) {
        fprintf(stderr, "mpi_allreduce_bench: rank %d: MPI_Allreduce failed\n", b.rank);
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
