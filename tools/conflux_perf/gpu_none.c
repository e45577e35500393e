/*
 * perf_gpu_* in a build without the CUDA toolkit (gpu.c is the real one):
 * no GPU is ever usable, so --mem auto means host buffers and --mem device
 * is refused when the options are read.
 */
#include "perf.h"

int perf_gpu_built(void)
{
    return 0;
}

int perf_gpu_probe(const char **why_p)
{
    if (why_p != NULL)
        *why_p = "this conflux-perf was built without CUDA (CMake found no CUDA toolkit)";
    return 0;
}

struct perf_gpu *perf_gpu_open(int device, int rank)
{
    fprintf(stderr, "conflux-perf: rank %d: no GPU %d: built without CUDA\n", rank, device);
    return NULL;
}

void perf_gpu_close(struct perf_gpu *gpu)
{
    (void)gpu;
}

/* Never called: perf_gpu_open never returns a GPU. */
cfxStream_t perf_gpu_stream(const struct perf_gpu *gpu)
{
    (void)gpu;
    return NULL;
}

int perf_gpu_device(const struct perf_gpu *gpu)
{
    (void)gpu;
    return -1;
}

const char *perf_gpu_name(const struct perf_gpu *gpu)
{
    (void)gpu;
    return "";
}

const char *perf_gpu_busid(const struct perf_gpu *gpu)
{
    (void)gpu;
    return "";
}

void *perf_gpu_alloc(struct perf_gpu *gpu, size_t bytes)
{
    (void)gpu;
    (void)bytes;
    return NULL;
}

void perf_gpu_free(struct perf_gpu *gpu, void *ptr)
{
    (void)gpu;
    (void)ptr;
}

void *perf_gpu_host_alloc(struct perf_gpu *gpu, size_t bytes)
{
    (void)gpu;
    (void)bytes;
    return NULL;
}

void perf_gpu_host_free(struct perf_gpu *gpu, void *ptr)
{
    (void)gpu;
    (void)ptr;
}

int perf_gpu_sync(struct perf_gpu *gpu)
{
    (void)gpu;
    return -1;
}

int perf_gpu_to_device(struct perf_gpu *gpu, void *dst, const void *src, size_t bytes)
{
    (void)gpu;
    (void)dst;
    (void)src;
    (void)bytes;
    return -1;
}

int perf_gpu_to_host(struct perf_gpu *gpu, void *dst, const void *src, size_t bytes)
{
    (void)gpu;
    (void)dst;
    (void)src;
    (void)bytes;
    return -1;
}

int perf_gpu_copy_bandwidth(struct perf_gpu *gpu, void *dst, const void *src, size_t bytes,
                            struct perf_copy *copy_p)
{
    (void)gpu;
    (void)dst;
    (void)src;
    (void)bytes;
    (void)copy_p;
    return -1;
}
