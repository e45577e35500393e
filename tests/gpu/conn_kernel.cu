/*
 * The connector layer (src/conn/fifo.h) inside a kernel: block 0 produces,
 * block 1 consumes, over a FIFO in device memory, with the same inline
 * operations the host executor runs. Built whenever CUDA is found (so nvcc
 * compiles the connector into a kernel in every such build); run by ctest,
 * which reports SKIP (exit 77) where no GPU can run it.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "src/conn/fifo.h"
}

#define N_STEPS    8
#define SLOT_BYTES 4096
#define N_SLOTS    10000

struct gpu_fifo {
    struct cfx_fifo ctrl;
    char slots[N_STEPS * SLOT_BYTES];
};

static __device__ size_t slot_size(uint64_t i)
{
    return (size_t)((i * 97) % SLOT_BYTES) + 1;
}

/* One thread of each block: the protocol, not the copy speed, is checked. */
static __global__ void produce_consume(struct gpu_fifo *fifo, unsigned long long *errors)
{
    if (threadIdx.x != 0)
        return;
    struct cfx_conn c;
    c.tail = &fifo->ctrl.tail;
    c.head = &fifo->ctrl.head;
    c.info = fifo->ctrl.info;
    c.slots = fifo->slots;
    c.slot_bytes = SLOT_BYTES;
    c.n_steps = N_STEPS;
    c.peer = -1;
    c.closed = 0;
    c.head_seen = 0;
    if (blockIdx.x == 0) {
        for (uint64_t i = 0; i < N_SLOTS; i++) {
            while (!cfx_fifo_can_post(&c))
                ;
            size_t bytes = slot_size(i);
            char *dst = cfx_fifo_post_slot(&c, bytes);
            for (size_t b = 0; b < bytes; b++)
                dst[b] = (char)(i + b);
            struct cfx_fingerprint print;
            memset(&print, 0, sizeof(print));
            print.seq = i;
            print.valid = 1;
            cfx_fifo_post(&c, bytes, &print);
        }
    } else {
        for (uint64_t i = 0; i < N_SLOTS; i++) {
            while (!cfx_fifo_can_take(&c))
                ;
            size_t bytes;
            const struct cfx_fingerprint *print;
            const char *src = cfx_fifo_take_slot(&c, &bytes, &print);
            if (bytes != slot_size(i) || print->seq != i || print->slot != (uint32_t)i)
                atomicAdd(errors, 1ull);
            for (size_t b = 0; b < bytes; b++)
                if (src[b] != (char)(i + b)) {
                    atomicAdd(errors, 1ull);
                    break;
                }
            cfx_fifo_release(&c);
        }
    }
}

int main(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        printf("SKIP: no CUDA device: %s\n", err != cudaSuccess ? cudaGetErrorString(err) : "none");
        return 77;
    }
    struct gpu_fifo *fifo = NULL;
    unsigned long long *errors = NULL;
    if (cudaMalloc(&fifo, sizeof(*fifo)) != cudaSuccess ||
        cudaMallocManaged(&errors, sizeof(*errors)) != cudaSuccess) {
        printf("FAIL: cannot allocate the FIFO\n");
        return 1;
    }
    cudaMemset(fifo, 0, sizeof(*fifo));
    *errors = 0;
    /* Two blocks must run at once: one block per SM is enough for that. */
    produce_consume<<<2, 32>>>(fifo, errors);
    err = cudaDeviceSynchronize();
    if (err != cudaSuccess) {
        printf("FAIL: kernel: %s\n", cudaGetErrorString(err));
        return 1;
    }
    unsigned long long bad = *errors;
    cudaFree(fifo);
    cudaFree(errors);
    if (bad != 0) {
        printf("FAIL: %llu wrong slots of %d\n", bad, N_SLOTS);
        return 1;
    }
    printf("PASS: %d slots crossed between two blocks over src/conn/fifo.h\n", N_SLOTS);
    return 0;
}
