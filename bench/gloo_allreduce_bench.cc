/*
 * gloo_allreduce_bench: Gloo's ring allreduce (gloo::allreduce with
 * AllreduceOptions::Algorithm::RING, float32 sum, gloo::sum<float>) over its
 * TCP transport, timed exactly as conflux-perf times cfxAllReduce out of
 * place, for bench/compare.sh. Gloo has no shared-memory transport: ranks on
 * one host talk TCP over loopback.
 *
 *   mkdir /tmp/store && for r in 0 1; do
 *     RANK=$r WORLD_SIZE=2 GLOO_STORE_DIR=/tmp/store GLOO_SOCKET_IFNAME=lo \
 *       bench/gloo_allreduce_bench -b 8 -e 128M -f 2 & done; wait
 *
 * Flags, the sweep, the timing rule and the table: sweep.h. The ranks meet
 * through a gloo::rendezvous::FileStore in GLOO_STORE_DIR (a fresh, empty
 * directory every ranks can reach: keys of an earlier run would mislead the
 * rendezvous), then connect a full mesh of TCP pairs on the address of
 * GLOO_SOCKET_IFNAME (the variable PyTorch uses for the same thing). Only
 * rank 0 prints. Exit codes: 0 good, 1 wrong results or a Gloo error, 2 usage.
 */
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include <gloo/allreduce.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include "sweep.h"

namespace {

const char launch_help[] =
    "Ranks: one process each, with in its environment\n"
    "  RANK, WORLD_SIZE      this rank and the number of ranks (required)\n"
    "  GLOO_STORE_DIR        a fresh, empty directory all ranks share (required)\n"
    "  GLOO_SOCKET_IFNAME    interface whose address the TCP pairs use (default lo)\n"
    "  GLOO_TIMEOUT_S        seconds a call may take before Gloo fails it (default 300)";

struct gloo_bench {
    const sweep_options *opt;
    std::shared_ptr<gloo::Context> context;
    int rank;
    int nranks;
    char *send_buf;
    char *recv_buf;
    long long wrong; // this rank's wrong elements over all checks
    double busbw_sum;
    int busbw_count;
};

void reduce_sum_float(void *out, const void *in_a, const void *in_b, size_t count)
{
    gloo::sum<float>(out, in_a, in_b, count);
}

// One out-of-place float32 sum allreduce of `count` elements; throws on error.
void allreduce(const gloo_bench &b, float *send, float *recv, size_t count)
{
    gloo::AllreduceOptions opts(b.context);
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setInput(send, count);
    opts.setOutput(recv, count);
    opts.setReduceFunction(reduce_sum_float);
    gloo::allreduce(opts);
}

void allreduce_at(const gloo_bench &b, const sweep_sizing &sz, long iter)
{
    size_t shift = sz.total_bytes * (static_cast<size_t>(iter) % sz.steps);
    allreduce(b, reinterpret_cast<float *>(b.send_buf + shift),
              reinterpret_cast<float *>(b.recv_buf + shift), sz.count);
}

void warmup(const gloo_bench &b, size_t bytes)
{
    sweep_sizing sz;
    sweep_sizing_init(b.opt, bytes, b.nranks, &sz);
    for (long iter = 0; iter < b.opt->warmup_iters; iter++)
        allreduce_at(b, sz, iter);
}

// A sum over ranks of bookkeeping values (times, error counts).
template <typename T> T sum_over_ranks(const gloo_bench &b, T value)
{
    T result = 0;
    gloo::AllreduceOptions opts(b.context);
    opts.setInput(&value, 1);
    opts.setOutput(&result, 1);
    opts.setReduceFunction(
        static_cast<void (*)(void *, const void *, const void *, size_t)>(&gloo::sum<T>));
    gloo::allreduce(opts);
    return result;
}

void time_size(gloo_bench &b, size_t bytes)
{
    const sweep_options *opt = b.opt;
    sweep_sizing sz;
    sweep_sizing_init(opt, bytes, b.nranks, &sz);
    allreduce_at(b, sz, 0);
    double start = sweep_now_s();
    for (long iter = 0; iter < opt->iters; iter++)
        allreduce_at(b, sz, iter);
    double seconds = (sweep_now_s() - start) / static_cast<double>(opt->iters);
    seconds = sum_over_ranks(b, seconds) / b.nranks;
    if (b.rank == 0) {
        b.busbw_sum += sweep_print_row(stdout, opt, &sz, seconds, b.nranks);
        b.busbw_count++;
    }
    for (long c = 0; c < opt->check_iters; c++) {
        std::memset(b.recv_buf, 0xff, sz.total_bytes);
        allreduce_at(b, sz, 0);
        b.wrong += static_cast<long long>(
            sweep_verify(reinterpret_cast<float *>(b.recv_buf), sz.count, b.nranks));
    }
}

void run(gloo_bench &b)
{
    const sweep_options *opt = b.opt;
    if (b.rank == 0) {
        char title[128];
        std::snprintf(title, sizeof(title),
                      "gloo_allreduce_bench: gloo::allreduce (ring) over TCP, Gloo %d.%d.%d",
                      GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH);
        sweep_print_header(stdout, title, opt, b.nranks);
    }
    warmup(b, opt->max_bytes);
    warmup(b, opt->min_bytes);
    size_t bytes = opt->min_bytes;
    do {
        time_size(b, bytes);
    } while ((bytes = sweep_next_bytes(opt, bytes)) != 0);
}

// A whole number from the environment in [min, max]; -1 when absent or bad.
long env_long(const char *name, long min, long max)
{
    const char *text = std::getenv(name);
    if (text == nullptr || text[0] == '\0')
        return -1;
    char *end = nullptr;
    long value = std::strtol(text, &end, 10);
    return (*end == '\0' && value >= min && value <= max) ? value : -1;
}

} // namespace

int main(int argc, char **argv)
{
    sweep_options opt;
    int help = 0;
    int status = sweep_options_parse(argc, argv, "gloo_allreduce_bench", launch_help,
                                     SWEEP_COLL_BIT(SWEEP_ALLREDUCE), &opt, &help);
    if (status != SWEEP_EXIT_OK || help)
        return status;

    long nranks = env_long("WORLD_SIZE", 1, 4096);
    long rank = env_long("RANK", 0, nranks - 1);
    const char *store_dir = std::getenv("GLOO_STORE_DIR");
    const char *ifname = std::getenv("GLOO_SOCKET_IFNAME");
    long timeout_s = std::getenv("GLOO_TIMEOUT_S") ? env_long("GLOO_TIMEOUT_S", 1, 86400) : 300;
    if (nranks < 1 || rank < 0 || store_dir == nullptr || store_dir[0] == '\0' || timeout_s < 1) {
        std::fprintf(stderr,
                     "gloo_allreduce_bench: set RANK (0..WORLD_SIZE-1), WORLD_SIZE and "
                     "GLOO_STORE_DIR; GLOO_TIMEOUT_S, when set, is 1..86400\n\n%s\n",
                     launch_help);
        return SWEEP_EXIT_USAGE;
    }

    gloo_bench b = {};
    b.opt = &opt;
    b.rank = static_cast<int>(rank);
    b.nranks = static_cast<int>(nranks);
    size_t buf_bytes = sweep_buffer_bytes(&opt);
    b.send_buf = static_cast<char *>(std::aligned_alloc(4096, buf_bytes));
    b.recv_buf = static_cast<char *>(std::aligned_alloc(4096, buf_bytes));
    if (b.send_buf == nullptr || b.recv_buf == nullptr) {
        std::fprintf(stderr, "gloo_allreduce_bench: rank %d: cannot allocate 2 x %zu bytes\n",
                     b.rank, buf_bytes);
        return SWEEP_EXIT_FAILED;
    }
    // Touch every page now, not in the timed loop; the inputs stay valid throughout.
    sweep_fill(reinterpret_cast<float *>(b.send_buf), buf_bytes / sizeof(float), b.rank);
    std::memset(b.recv_buf, 0, buf_bytes);

    long long wrong = 0;
    try {
        gloo::transport::tcp::attr attr;
        attr.iface = ifname && ifname[0] ? ifname : "lo";
        auto device = gloo::transport::tcp::CreateDevice(attr);
        gloo::rendezvous::FileStore store(store_dir);
        auto context = std::make_shared<gloo::rendezvous::Context>(b.rank, b.nranks);
        context->setTimeout(std::chrono::seconds(timeout_s));
        context->connectFullMesh(store, device);
        b.context = context;
        run(b);
        wrong = sum_over_ranks(b, b.wrong);
        if (b.rank == 0)
            sweep_print_footer(stdout, wrong, b.busbw_count ? b.busbw_sum / b.busbw_count : 0.0);
    } catch (const std::exception &e) {
        std::fprintf(stderr, "gloo_allreduce_bench: rank %d: %s\n", b.rank, e.what());
        status = SWEEP_EXIT_FAILED;
    }
    b.context.reset();
    std::free(b.send_buf);
    std::free(b.recv_buf);
    if (status != SWEEP_EXIT_OK)
        return status;
    return wrong ? SWEEP_EXIT_FAILED : SWEEP_EXIT_OK;
}
