/*
 * The CUDA executor's kernel (see kernel.h): a team of args.team blocks
 * (or one) per chain of a batch's operations, CFX_KERNEL_THREADS threads
 * each. Thread 0 of the first block leads (decides and plans each step,
 * publishes it to the team, commits it); every thread of the team moves
 * its share of a planned step's elements. Built into a fatbin (sm_80, sm_90, and PTX for newer
 * GPUs) that libconflux carries as data and loads with cuModuleLoadData:
 * the library links no CUDA runtime.
 */
#include <string.h>

extern "C++" {
#include "src/exec/cuda/kernel.h"
}

/* A helper block of a team: take each step the leader publishes, move
 * this block's share of it, acknowledge; until the end. */
static __device__ void run_helper(struct cfx_kernel_block *block, int *action, unsigned tid,
                                  unsigned share, unsigned shares)
{
    for (;;) {
        if (tid == 0) {
            int next;
            while ((next = cfx_kernel_team_next(block)) == CFX_KERNEL_IDLE)
                ;
            *action = next;
        }
        __syncthreads();
        if (*action == CFX_KERNEL_FINISHED) {
            if (tid == 0)
                cfx_kernel_team_ack(block);
            return;
        }
        cfx_kernel_data(block, share, shares);
        __syncthreads(); /* Every thread's stores before thread 0 acknowledges them. */
        if (tid == 0) {
            __threadfence_system();
            cfx_kernel_team_ack(block);
        }
        __syncthreads(); /* Nobody reads `action` while thread 0 rewrites it. */
    }
}

/* One launch, whichever size its parameter (@p args points into it). */
static __device__ __forceinline__ void run_batch(const struct cfx_kernel_args *args)
{
    __shared__ struct cfx_kernel_block block;
    __shared__ int action;
    __shared__ int stopped; /* The leader gave up waiting for its helpers (set once). */
    const unsigned tid = threadIdx.x, nthreads = blockDim.x;
    const unsigned team = cfx_kernel_team_size(args);
    const unsigned chain = blockIdx.x / team, member = blockIdx.x % team;
    /* This thread's place in its team, and the team's threads. */
    const unsigned share = member * nthreads + tid, shares = team * nthreads;
    if (tid == 0) {
        block.started = 0;
        stopped = 0;
        cfx_kernel_team_join(&block, args, chain);
    }
    __syncthreads();
    if (member != 0) {
        run_helper(&block, &action, tid, share, shares);
        return;
    }
    for (;;) {
        if (tid == 0)
            action = cfx_kernel_lead(&block, args, chain);
        __syncthreads();
        if (action == CFX_KERNEL_FINISHED) {
            if (tid == 0 && team > 1) {
                int acked;
                cfx_kernel_team_publish(&block, CFX_KERNEL_FINISHED);
                while ((acked = cfx_kernel_team_wait(&block, args, chain, team,
                                                     CFX_KERNEL_FINISHED)) == 0)
                    ;
                if (acked > 0)
                    cfx_kernel_team_clear(&block);
            }
            return;
        }
        if (action == CFX_KERNEL_STEP) {
            if (tid == 0 && team > 1)
                cfx_kernel_team_publish(&block, CFX_KERNEL_STEP);
            cfx_kernel_data(&block, share, shares);
            __syncthreads(); /* Every thread's stores before the leader publishes them. */
            if (tid == 0) {
                int acked = 1;
                while (team > 1 && (acked = cfx_kernel_team_wait(&block, args, chain, team,
                                                                 CFX_KERNEL_STEP)) == 0)
                    ;
                if (acked > 0) {
                    __threadfence_system();
                    cfx_kernel_commit(&block, args, chain);
                } else {
                    stopped = 1; /* The communicator stopped while helpers were away. */
                }
            }
        }
        __syncthreads(); /* Nobody reads `action` while the leader rewrites it. */
        if (stopped)
            return;
    }
}

extern "C" __global__ void __launch_bounds__(CFX_KERNEL_THREADS)
    cfx_kernel_batch(const __grid_constant__ struct cfx_kernel_narrow args)
{
    run_batch(&args.head);
}

/* Groups the narrow parameter cannot carry (up to 32764 bytes of
 * parameter: CUDA 12.1 and newer, sm_70 and newer). */
extern "C" __global__ void __launch_bounds__(CFX_KERNEL_THREADS)
    cfx_kernel_batch_wide(const __grid_constant__ struct cfx_kernel_wide args)
{
    run_batch(&args.head);
}

/* Groups the wide parameter cannot carry: the parameter is the address of
 * their struct cfx_kernel_far (pinned host memory, mapped). */
extern "C" __global__ void __launch_bounds__(CFX_KERNEL_THREADS)
    cfx_kernel_batch_far(const struct cfx_kernel_args *args)
{
    run_batch(args);
}
