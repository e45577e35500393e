/*
 * The kernels fake-cuda can run: host implementations of device kernels,
 * looked up by name in cuModuleGetFunction (the module image itself is
 * ignored). Each takes exactly one parameter, a struct passed by value:
 * cuLaunchKernel copies param_bytes from kernelParams[0] at launch (or
 * capture) time.
 *
 * A launch runs on its stream's thread: each block gets state_bytes of
 * zeroed, 64-byte aligned memory for its life (NULL when state_bytes is 0),
 * allocated when the launch is enqueued (or replayed), then pass() is
 * called on every unfinished block in turn until all returned 0. A block
 * never runs to completion before the others start: blocks may wait on
 * each other, and on other launches, other streams and other processes.
 *
 * To add a kernel: define an `extern const struct fakecuda_kernel` in its
 * own file (of this library), declare it below and list it in kernels.c.
 */
#ifndef CFX_FAKECUDA_KERNELS_H
#define CFX_FAKECUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

struct fakecuda_kernel {
    const char *name;   /* What cuModuleGetFunction asks for. */
    size_t param_bytes; /* Its one by-value parameter. */
    size_t state_bytes; /* Zeroed memory each block gets for its life. */
    /* Run block @p block of @p n_blocks a little. Returns 0 when the block
     * is finished, 1 when it did something, 2 when it is idle (waiting on
     * memory another agent writes). Never blocks. */
    int (*pass)(void *state, const void *params, unsigned block, unsigned n_blocks,
                unsigned threads_per_block);
};

/* Every kernel, NULL-terminated (kernels.c). */
extern const struct fakecuda_kernel *const fakecuda_kernels[];

/* Conflux's own kernel, "cfx_kernel_batch" (conflux_kernel.c: the functions
 * of src/exec/cuda/kernel.h that the GPU runs, compiled for the CPU). */
extern const struct fakecuda_kernel fakecuda_conflux_kernel;
/* Its twin for launches of up to 32764 bytes of parameter,
 * "cfx_kernel_batch_wide". */
extern const struct fakecuda_kernel fakecuda_conflux_kernel_wide;
extern const struct fakecuda_kernel fakecuda_conflux_kernel_far;

/* ---- Test kernels (test_kernels.c), for tests/fakecuda/test_fakecuda.c. */

/* "fakecuda_test_fill": dst[0..n) = value, each block its share, a few
 * thousand words per pass. */
struct fakecuda_test_fill_params {
    uint32_t *dst;
    uint32_t value;
    uint64_t n;
};
extern const struct fakecuda_kernel fakecuda_test_fill;

/* "fakecuda_test_wait_flag": every block waits (idle) until *flag is
 * nonzero, then adds 1 to *done and finishes. */
struct fakecuda_test_wait_flag_params {
    const volatile uint32_t *flag;
    uint32_t *done;
};
extern const struct fakecuda_kernel fakecuda_test_wait_flag;

/* "fakecuda_test_relay": the last block sets slots[n_blocks - 1] = 1; block
 * b waits for slots[b + 1], then sets slots[b] = slots[b + 1] + 1. Block 0
 * finishes last, with n_blocks: it finishes only if every block runs. */
struct fakecuda_test_relay_params {
    uint32_t *slots;
};
extern const struct fakecuda_kernel fakecuda_test_relay;

#endif /* CFX_FAKECUDA_KERNELS_H */
