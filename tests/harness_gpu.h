/*
 * The harness's GPU helpers (tests/harness.c), for tests built with CUDA:
 * cuda.h's types through src/util/cuda.h. Call cfx_test_use_cuda
 * (harness.h) first, in the test, before the ranks run.
 */
#ifndef CFX_TEST_HARNESS_GPU_H
#define CFX_TEST_HARNESS_GPU_H

#include "cfx_build_config.h"
#include "tests/harness.h"

#if CFX_HAVE_CUDA
#include "src/util/cuda.h"

/* A rank's GPU: its device made current (so cfxCommInitRank makes a GPU
 * rank), a stream of its own, and a pinned buffer its copies go through.
 *
 * Ranks that share a process share a CUDA context, and some CUDA calls wait
 * for every running kernel of the context (cuMemFree, cuMemFreeHost,
 * cuMemHostUnregister: tests/gpu/blocking_probe.cu on an H200); a rank whose
 * call waits for a peer's kernel that waits for this rank deadlocks. The
 * helpers' copies and sets stay on the rank's own stream, through pinned
 * memory (CFX_TEST_GPU_PAGEABLE=1: straight from pageable memory, to compare). */
struct cfx_test_gpu {
    const struct cfx_cuda_api *cu;
    CUstream stream;
    int device;
    char *bounce; /* Pinned, bounce_bytes; NULL: copies from pageable memory. */
    size_t bounce_bytes;
};
/* Open device @p device for this rank; on failure records it and returns 0. */
int cfx_test_gpu_open(struct cfx_test_rank *ctx, int device, struct cfx_test_gpu *gpu);
/* @p bytes of device memory (0xee bytes, set on the rank's stream), or NULL (recorded). */
void *cfx_test_gpu_alloc(struct cfx_test_rank *ctx, struct cfx_test_gpu *gpu, size_t bytes);
void cfx_test_gpu_free(struct cfx_test_gpu *gpu, void *ptr);
/* Copies on the rank's stream, waited for: 0, or a failure recorded. */
int cfx_test_gpu_put(struct cfx_test_rank *ctx, struct cfx_test_gpu *gpu, void *dst,
                     const void *src, size_t bytes);
int cfx_test_gpu_get(struct cfx_test_rank *ctx, struct cfx_test_gpu *gpu, void *dst,
                     const void *src, size_t bytes);
/* Wait for the rank's stream: 0, or a failure recorded. */
int cfx_test_gpu_sync(struct cfx_test_rank *ctx, struct cfx_test_gpu *gpu);
void cfx_test_gpu_close(struct cfx_test_gpu *gpu);

#endif

#endif /* CFX_TEST_HARNESS_GPU_H */
