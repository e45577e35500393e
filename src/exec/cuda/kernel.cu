/*
 * The CUDA executor's kernel (see kernel.h): one block per operation of a
 * batch, CFX_KERNEL_THREADS threads each. Thread 0 leads (decides and
 * plans each step, commits it); every thread moves its share of a planned
 * step's elements. Built into a fatbin (sm_80, sm_90, and PTX for newer
 * GPUs) that libconflux carries as data and loads with cuModuleLoadData:
 * the library links no CUDA runtime.
 */
#include <string.h>

extern "C++" {
#include "src/exec/cuda/kernel.h"
}

extern "C" __global__ void __launch_bounds__(CFX_KERNEL_THREADS)
    cfx_kernel_batch(const __grid_constant__ struct cfx_kernel_args args)
{
    __shared__ struct cfx_kernel_block block;
    __shared__ int action;
    const unsigned tid = threadIdx.x, nthreads = blockDim.x, b = blockIdx.x;
    if (tid == 0)
        block.started = 0;
    __syncthreads();
    for (;;) {
        if (tid == 0)
            action = cfx_kernel_lead(&block, &args, b);
        __syncthreads();
        if (action == CFX_KERNEL_FINISHED)
            return;
        if (action == CFX_KERNEL_STEP) {
            cfx_kernel_data(&block, tid, nthreads);
            __syncthreads(); /* Every thread's stores before the leader publishes them. */
            if (tid == 0) {
                __threadfence_system();
                cfx_kernel_commit(&block, &args, b);
            }
        }
        __syncthreads(); /* Nobody reads `action` while the leader rewrites it. */
    }
}
