/*
 * How fast a step's data moves on this GPU: cfx_steploop_data (the code the
 * CUDA executor's blocks run for every step, src/coll/steploop.h) over one
 * big step, split over a team of 1 to 64 blocks of CFX_KERNEL_THREADS
 * threads, against cudaMemcpyAsync device to device in the same run. Three
 * steps of the ring allreduce, float32 sum, N bytes per operand:
 *   copy     a single-copy step (N read, N written);
 *   reduce   recv + reduce + send: slot + input to the next slot (2N read, N written);
 *   final    recv + reduce + out + send: to the output and the next slot (2N, 2N).
 * GB/s counts bytes read + written, as the copy's (2N / time, as CUDA's
 * bandwidthTest), so "ratio" is the step's memory traffic rate over the
 * copy's: the issue's target is 85% for a large step's reduce-copy. Every
 * result is checked (a wrong byte fails). SKIP (exit 77) without a GPU.
 *
 *   step_bandwidth [MiB per operand, default 256]
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C++" {
#include "src/exec/cuda/kernel.h"
}

#define REPEAT 20

static __global__ void __launch_bounds__(CFX_KERNEL_THREADS)
    run_step(const struct cfx_work work, const struct cfx_steploop_plan plan)
{
    cfx_steploop_data(&work, &plan, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "step_bandwidth: %s: %s\n", #call, cudaGetErrorString(err_));          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Milliseconds per launch of @p plan on @p blocks blocks (median of REPEAT). */
static float time_step(const struct cfx_work *work, const struct cfx_steploop_plan *plan,
                       unsigned blocks, cudaEvent_t start, cudaEvent_t stop)
{
    float ms[REPEAT];
    run_step<<<blocks, CFX_KERNEL_THREADS>>>(*work, *plan); /* warm */
    CHECK(cudaGetLastError());
    for (int r = 0; r < REPEAT; r++) {
        CHECK(cudaEventRecord(start));
        run_step<<<blocks, CFX_KERNEL_THREADS>>>(*work, *plan);
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        CHECK(cudaEventElapsedTime(&ms[r], start, stop));
    }
    for (int i = 1; i < REPEAT; i++) /* insertion sort: REPEAT is small */
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            float t = ms[j];
            ms[j] = ms[j - 1];
            ms[j - 1] = t;
        }
    return ms[REPEAT / 2];
}

static float time_copy(void *to, const void *from, size_t bytes, cudaEvent_t start,
                       cudaEvent_t stop)
{
    float ms[REPEAT];
    CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice));
    for (int r = 0; r < REPEAT; r++) {
        CHECK(cudaEventRecord(start));
        CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice));
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        CHECK(cudaEventElapsedTime(&ms[r], start, stop));
    }
    for (int i = 1; i < REPEAT; i++)
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            float t = ms[j];
            ms[j] = ms[j - 1];
            ms[j - 1] = t;
        }
    return ms[REPEAT / 2];
}

/* Elements of @p dev that are not @p want (host check of a float buffer). */
static size_t wrong_floats(const float *dev, float *host, size_t n, float want)
{
    CHECK(cudaMemcpy(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++)
        wrong += host[i] != want;
    return wrong;
}

int main(int argc, char **argv)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("SKIP: no CUDA device: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 77;
    }
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 256;
    if (mib == 0 || mib > 4096) {
        fprintf(stderr, "usage: step_bandwidth [MiB per operand, 1-4096]\n");
        return 2;
    }
    size_t bytes = mib << 20, n = bytes / sizeof(float);
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    float *input, *slot_in, *slot_out, *out, *host;
    CHECK(cudaMalloc(&input, bytes));
    CHECK(cudaMalloc(&slot_in, bytes));
    CHECK(cudaMalloc(&slot_out, bytes));
    CHECK(cudaMalloc(&out, bytes));
    host = (float *)malloc(bytes);
    if (host == NULL)
        return 1;
    for (size_t i = 0; i < n; i++)
        host[i] = 1.0f;
    CHECK(cudaMemcpy(input, host, bytes, cudaMemcpyHostToDevice));
    for (size_t i = 0; i < n; i++)
        host[i] = 2.0f;
    CHECK(cudaMemcpy(slot_in, host, bytes, cudaMemcpyHostToDevice));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));

    struct cfx_work work;
    memset(&work, 0, sizeof(work));
    work.type = cfxFloat32;
    work.redop = cfxSum;
    work.elem_bytes = sizeof(float);
    work.nranks = 2;

    float copy_ms = time_copy(out, input, bytes, start, stop);
    double copy_gbps = 2.0 * (double)bytes / (copy_ms * 1e6);
    printf("# step_bandwidth: %s (%d SMs), %zu MiB per operand, float32 sum, %d threads per "
           "block, median of %d launches\n",
           prop.name, prop.multiProcessorCount, mib, CFX_KERNEL_THREADS, REPEAT);
    printf("# GB/s counts bytes read + written; ratio: over cudaMemcpyAsync device to device\n");
    printf("# memcpy D2D: %.3f ms, %.1f GB/s\n", copy_ms, copy_gbps);
    printf("%-8s %6s %10s %10s %7s\n", "step", "blocks", "ms", "GB/s", "ratio");

    static const unsigned teams[] = {1, 2, 4, 8, 16, 32, 64, 132, 264};
    int failed = 0;
    double best_reduce = 0.0;
    for (int kind = 0; kind < 3; kind++) {
        struct cfx_steploop_plan plan;
        memset(&plan, 0, sizeof(plan));
        const char *name;
        double traffic;
        if (kind == 0) {
            name = "copy";
            plan.n = bytes;
            plan.copy_from = (const char *)input;
            plan.copy_to = (char *)slot_out;
            traffic = 2.0 * (double)bytes;
        } else {
            plan.n = n;
            plan.n_operands = 2;
            plan.operands[0] = (const char *)slot_in;
            plan.operands[1] = (const char *)input;
            plan.slot_out = (char *)slot_out;
            plan.out = kind == 2 ? (char *)out : 0;
            name = kind == 1 ? "reduce" : "final";
            traffic = kind == 1 ? 3.0 * (double)bytes : 4.0 * (double)bytes;
        }
        for (size_t t = 0; t < sizeof(teams) / sizeof(teams[0]); t++) {
            CHECK(cudaMemset(slot_out, 0, bytes));
            CHECK(cudaMemset(out, 0, bytes));
            float ms = time_step(&work, &plan, teams[t], start, stop);
            double gbps = traffic / (ms * 1e6);
            size_t wrong = wrong_floats(slot_out, host, n, kind == 0 ? 1.0f : 3.0f);
            if (kind == 2)
                wrong += wrong_floats(out, host, n, 3.0f);
            printf("%-8s %6u %10.3f %10.1f %7.2f%s\n", name, teams[t], ms, gbps, gbps / copy_gbps,
                   wrong ? "  WRONG" : "");
            if (wrong) {
                fprintf(stderr, "step_bandwidth: %s on %u blocks: %zu wrong elements\n", name,
                        teams[t], wrong);
                failed = 1;
            }
            if (kind == 1 && gbps > best_reduce)
                best_reduce = gbps;
        }
    }
    printf("# best reduce step: %.1f GB/s, %.0f%% of the D2D copy's %.1f GB/s\n", best_reduce,
           100.0 * best_reduce / copy_gbps, copy_gbps);
    printf("%s\n", failed ? "FAIL" : "PASS: every step's result is right");
    return failed;
}
