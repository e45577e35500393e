/*
 * Conflux's kernel (src/exec/cuda/kernel.h: "cfx_kernel_batch") for
 * fake-cuda: the very functions the GPU's __global__ wrapper calls
 * (src/exec/cuda/kernel.cu), compiled for the CPU. One pass is one round
 * of the wrapper's loop: the leader decides; for a step, every thread of
 * the block moves its share (the threads run one after another here, each
 * with its own tid, so the split of a step between threads is exercised
 * too); then the leader commits.
 */
#include "kernels.h"

#include <stdio.h>
#include <stdlib.h>

#include "src/exec/cuda/kernel.h"

static int conflux_pass(void *state, const void *params, unsigned block, unsigned n_blocks,
                        unsigned threads_per_block)
{
    (void)n_blocks;
    struct cfx_kernel_block *b = state;
    const struct cfx_kernel_args *args = params;
    if (args->abi != CFX_KERNEL_ABI) {
        /* A library built from another kernel.h than this fake: rebuild both. */
        fprintf(stderr,
                "fake-cuda: cfx_kernel_batch launched with parameter layout %#x, this fake "
                "knows %#x: rebuild the library and the fake from one tree\n",
                args->abi, CFX_KERNEL_ABI);
        abort();
    }
    switch (cfx_kernel_lead(b, args, block)) {
    case CFX_KERNEL_FINISHED: return 0;
    case CFX_KERNEL_IDLE: return 2;
    default: break;
    }
    unsigned threads = threads_per_block ? threads_per_block : 1;
    for (unsigned tid = 0; tid < threads; tid++)
        cfx_kernel_data(b, tid, threads);
    cfx_kernel_commit(b, args, block);
    return 1;
}

const struct fakecuda_kernel fakecuda_conflux_kernel = {
    .name = CFX_KERNEL_NAME,
    .param_bytes = sizeof(struct cfx_kernel_args),
    .state_bytes = sizeof(struct cfx_kernel_block),
    .pass = conflux_pass,
};
