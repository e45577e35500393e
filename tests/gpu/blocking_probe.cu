/*
 * Which CUDA calls wait for a kernel that is still running in the same
 * context? Conflux's GPU ranks that share a process (threads, one GPU) may
 * set up memory (pin a FIFO, allocate) while another rank's kernel spins
 * waiting for them; a call that waits for that kernel deadlocks them until
 * CFX_TIMEOUT. This probe launches a kernel that spins on a flag in mapped
 * memory, makes each call from a helper thread, and reports whether the
 * call returned while the kernel still ran (within 2 s) or only after the
 * flag released it. Facts for docs/architecture.md, read on a real GPU by
 * scripts/gpu_check.sh; exit 77 (SKIP) without one, 1 on a CUDA error.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            printf("FAIL: %s: %s\n", #call, cudaGetErrorString(err_));                             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static __global__ void spin(volatile int *flag, volatile int *started)
{
    if (threadIdx.x != 0)
        return;
    *started = 1;
    __threadfence_system();
    while (*flag == 0)
        ;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

struct probe {
    const char *name;
    void (*call)(void);
    volatile int done;
};

static void *state_a, *state_b;
static size_t shm_bytes = 1 << 20;
static cudaStream_t other;

static void call_host_register(void)
{
    CHECK(cudaHostRegister(state_a, 1 << 20, cudaHostRegisterPortable | cudaHostRegisterMapped));
}
static void call_host_unregister(void)
{
    CHECK(cudaHostUnregister(state_a));
}
static void call_host_register_shm(void)
{
    CHECK(cudaHostRegister(state_b, shm_bytes, cudaHostRegisterPortable | cudaHostRegisterMapped));
}
static void call_host_unregister_shm(void)
{
    CHECK(cudaHostUnregister(state_b));
}
static void *dev_mem;
static void call_malloc(void)
{
    CHECK(cudaMalloc(&dev_mem, 1 << 20));
}
static void call_free(void)
{
    CHECK(cudaFree(dev_mem));
}
static void *pinned;
static void call_malloc_host(void)
{
    CHECK(cudaHostAlloc(&pinned, 1 << 20, cudaHostAllocPortable | cudaHostAllocMapped));
}
static void call_free_host(void)
{
    CHECK(cudaFreeHost(pinned));
}
static void call_stream_create(void)
{
    CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
}
static void call_event_create(void)
{
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CHECK(cudaEventDestroy(ev));
}
static void call_memset_async_other(void)
{
    CHECK(cudaMemsetAsync(dev_mem, 0, 1 << 20, other));
    CHECK(cudaStreamSynchronize(other));
}

static char pageable[1 << 20];
static void *pinned_buf;
static void call_htod_pageable(void)
{
    CHECK(cudaMemcpyAsync(dev_mem, pageable, sizeof(pageable), cudaMemcpyHostToDevice, other));
    CHECK(cudaStreamSynchronize(other));
}
static void call_dtoh_pageable(void)
{
    CHECK(cudaMemcpyAsync(pageable, dev_mem, sizeof(pageable), cudaMemcpyDeviceToHost, other));
    CHECK(cudaStreamSynchronize(other));
}
static void call_htod_pinned(void)
{
    CHECK(cudaMemcpyAsync(dev_mem, pinned_buf, 1 << 20, cudaMemcpyHostToDevice, other));
    CHECK(cudaStreamSynchronize(other));
}
static void call_memset_legacy(void)
{
    CHECK(cudaMemset(dev_mem, 0, 1 << 20));
    CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}
static void call_legacy_sync(void)
{
    CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}
static void nothing(void *arg)
{
    (void)arg;
}
static void call_host_func(void)
{
    CHECK(cudaLaunchHostFunc(other, nothing, NULL));
    CHECK(cudaStreamSynchronize(other));
}

static struct probe probes[] = {
    {"cudaHostRegister (malloc'd 1 MiB)", call_host_register, 0},
    {"cudaHostUnregister (that)", call_host_unregister, 0},
    {"cudaHostRegister (a MAP_SHARED memfd, 1 MiB)", call_host_register_shm, 0},
    {"cudaHostUnregister (that)", call_host_unregister_shm, 0},
    {"cudaMalloc (1 MiB)", call_malloc, 0},
    {"cudaStreamCreate (non-blocking)", call_stream_create, 0},
    {"cudaMemsetAsync on another stream + its sync", call_memset_async_other, 0},
    {"cudaMemcpyAsync HtoD, pageable, other stream + sync", call_htod_pageable, 0},
    {"cudaMemcpyAsync DtoH, pageable, other stream + sync", call_dtoh_pageable, 0},
    {"cudaMemcpyAsync HtoD, pinned, other stream + sync", call_htod_pinned, 0},
    {"cudaLaunchHostFunc, other stream + sync", call_host_func, 0},
    {"cudaStreamSynchronize(cudaStreamLegacy)", call_legacy_sync, 0},
    {"cudaMemset (legacy stream) + legacy sync", call_memset_legacy, 0},
    {"cudaFree (that)", call_free, 0},
    {"cudaHostAlloc (1 MiB)", call_malloc_host, 0},
    {"cudaFreeHost (that)", call_free_host, 0},
    {"cudaEventCreate + Destroy", call_event_create, 0},
};

static void *run_probe(void *arg)
{
    struct probe *p = (struct probe *)arg;
    CHECK(cudaSetDevice(0));
    p->call();
    __atomic_store_n(&p->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

int main(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        printf("SKIP: no CUDA device: %s\n", err != cudaSuccess ? cudaGetErrorString(err) : "none");
        return 77;
    }
    CHECK(cudaSetDevice(0));
    state_a = aligned_alloc(4096, 1 << 20);
    memset(state_a, 0, 1 << 20);
    int fd = memfd_create("cfx-probe", 0);
    if (fd < 0 || ftruncate(fd, (off_t)shm_bytes) != 0) {
        printf("FAIL: memfd\n");
        return 1;
    }
    state_b = mmap(NULL, shm_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    memset(state_b, 0, shm_bytes);
    int *flag = NULL, *started = NULL;
    CHECK(cudaHostAlloc(&pinned_buf, 1 << 20, cudaHostAllocPortable));
    CHECK(cudaHostAlloc((void **)&flag, 64, cudaHostAllocMapped | cudaHostAllocPortable));
    CHECK(cudaHostAlloc((void **)&started, 64, cudaHostAllocMapped | cudaHostAllocPortable));
    cudaStream_t spin_stream;
    CHECK(cudaStreamCreateWithFlags(&spin_stream, cudaStreamNonBlocking));
    printf("probe: each call made from another thread while a kernel of this context spins\n");
    int waited = 0;
    for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
        struct probe *p = &probes[i];
        __atomic_store_n(flag, 0, __ATOMIC_RELEASE);
        __atomic_store_n(started, 0, __ATOMIC_RELEASE);
        spin<<<1, 32, 0, spin_stream>>>(flag, started);
        CHECK(cudaGetLastError());
        double t0 = now_ms();
        while (!__atomic_load_n(started, __ATOMIC_ACQUIRE) && now_ms() - t0 < 5000)
            usleep(100);
        if (!__atomic_load_n(started, __ATOMIC_ACQUIRE)) {
            printf("FAIL: the spinning kernel never started\n");
            return 1;
        }
        pthread_t thread;
        double start = now_ms();
        pthread_create(&thread, NULL, run_probe, p);
        while (!__atomic_load_n(&p->done, __ATOMIC_ACQUIRE) && now_ms() - start < 2000)
            usleep(200);
        int blocked = !__atomic_load_n(&p->done, __ATOMIC_ACQUIRE);
        __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
        pthread_join(thread, NULL);
        double took = now_ms() - start;
        CHECK(cudaStreamSynchronize(spin_stream));
        waited += blocked;
        printf("  %-46s %s (%.1f ms)\n", p->name,
               blocked ? "WAITS for the running kernel" : "returns while it runs", took);
    }
    printf("PASS: %d of %zu calls wait for a running kernel\n", waited,
           sizeof(probes) / sizeof(probes[0]));
    return 0;
}
