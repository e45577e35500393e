/*
 * Conflux's kernels (src/exec/cuda/kernel.h: "cfx_kernel_batch" and its
 * wide twin, which differ only in the size of their parameter, and the far
 * one, whose parameter is the address of the same layout) for
 * fake-cuda: the very functions the GPU's __global__ wrapper calls
 * (src/exec/cuda/kernel.cu), compiled for the CPU. One pass is one round
 * of the wrapper's loop: the leader decides; for a step, every thread of
 * the block moves its share (the threads run one after another here, each
 * with its own tid, so the split of a step between threads is exercised
 * too); then the leader commits. In a team (args.team > 1) the leader
 * publishes the step, moves its share, and commits in a later pass, once
 * the helper blocks (their own passes) have moved theirs.
 */
#include "kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/exec/cuda/kernel.h"

static int conflux_pass_on(void *state, const struct cfx_kernel_args *args, unsigned block,
                           unsigned threads_per_block)
{
    struct cfx_kernel_block *b = state;
    if (args->abi != CFX_KERNEL_ABI) {
        /* A library built from another kernel.h than this fake: rebuild both. */
        fprintf(stderr,
                "fake-cuda: cfx_kernel_batch launched with parameter layout %#x, this fake "
                "knows %#x: rebuild the library and the fake from one tree\n",
                args->abi, CFX_KERNEL_ABI);
        abort();
    }
    unsigned team = cfx_kernel_team_size(args), chain = block / team, member = block % team;
    unsigned threads = threads_per_block ? threads_per_block : 1;
    if (!b->team_joined)
        cfx_kernel_team_join(b, args, chain);
    if (member != 0) { /* A helper: the leader's steps, its share of each. */
        int action = cfx_kernel_team_next(b);
        if (action == CFX_KERNEL_IDLE)
            return 2;
        for (unsigned tid = 0; action == CFX_KERNEL_STEP && tid < threads; tid++)
            cfx_kernel_data(b, member * threads + tid, team * threads);
        cfx_kernel_team_ack(b);
        return action == CFX_KERNEL_FINISHED ? 0 : 1;
    }
    if (b->team_wait != 0) { /* The leader, waiting for its helpers. */
        int acked = cfx_kernel_team_wait(b, args, chain, team, b->team_wait);
        if (acked == 0)
            return 2;
        if (acked < 0)
            return 0; /* Stopped: the op ended ABORTED, the helpers were told. */
        if (b->team_wait == CFX_KERNEL_FINISHED) {
            cfx_kernel_team_clear(b);
            return 0;
        }
        b->team_wait = 0;
        cfx_kernel_commit(b, args, chain);
        return 1;
    }
    switch (cfx_kernel_lead(b, args, chain)) {
    case CFX_KERNEL_FINISHED:
        if (team == 1)
            return 0;
        cfx_kernel_team_publish(b, CFX_KERNEL_FINISHED);
        b->team_wait = CFX_KERNEL_FINISHED;
        return 1;
    case CFX_KERNEL_IDLE: return 2;
    default: break;
    }
    if (team > 1)
        cfx_kernel_team_publish(b, CFX_KERNEL_STEP);
    for (unsigned tid = 0; tid < threads; tid++)
        cfx_kernel_data(b, tid, team * threads);
    if (team > 1) {
        b->team_wait = CFX_KERNEL_STEP;
        return 1;
    }
    cfx_kernel_commit(b, args, chain);
    return 1;
}

/* The narrow and the wide launch: the parameter is the arguments. */
static int conflux_pass(void *state, const void *params, unsigned block, unsigned n_blocks,
                        unsigned threads_per_block)
{
    (void)n_blocks;
    return conflux_pass_on(state, params, block, threads_per_block);
}

/* The far launch: the parameter is their address. */
static int conflux_pass_far(void *state, const void *params, unsigned block, unsigned n_blocks,
                            unsigned threads_per_block)
{
    (void)n_blocks;
    const struct cfx_kernel_args *args;
    memcpy(&args, params, sizeof(args));
    return conflux_pass_on(state, args, block, threads_per_block);
}

const struct fakecuda_kernel fakecuda_conflux_kernel = {
    .name = CFX_KERNEL_NAME,
    .param_bytes = sizeof(struct cfx_kernel_narrow),
    .state_bytes = sizeof(struct cfx_kernel_block),
    .pass = conflux_pass,
};

const struct fakecuda_kernel fakecuda_conflux_kernel_wide = {
    .name = CFX_KERNEL_WIDE_NAME,
    .param_bytes = sizeof(struct cfx_kernel_wide),
    .state_bytes = sizeof(struct cfx_kernel_block),
    .pass = conflux_pass,
};

const struct fakecuda_kernel fakecuda_conflux_kernel_far = {
    .name = CFX_KERNEL_FAR_NAME,
    .param_bytes = sizeof(const struct cfx_kernel_args *),
    .state_bytes = sizeof(struct cfx_kernel_block),
    .pass = conflux_pass_far,
};
