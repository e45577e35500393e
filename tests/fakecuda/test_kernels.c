/*
 * The test kernels of kernels.h. Memory other agents read or write is
 * accessed with atomics, as device code would use volatile or atomic
 * accesses for it.
 */
#include "kernels.h"

#define FILL_WORDS_PER_PASS 4096

struct fill_state {
    uint64_t done; /* words of this block's share written so far */
};

static int fill_pass(void *state, const void *params, unsigned block, unsigned n_blocks,
                     unsigned threads_per_block)
{
    (void)threads_per_block;
    const struct fakecuda_test_fill_params *p = params;
    struct fill_state *st = state;
    uint64_t begin = p->n * block / n_blocks;
    uint64_t end = p->n * (block + 1) / n_blocks;
    uint64_t from = begin + st->done;
    uint64_t to = end - from > FILL_WORDS_PER_PASS ? from + FILL_WORDS_PER_PASS : end;
    for (uint64_t i = from; i < to; i++)
        __atomic_store_n(&p->dst[i], p->value, __ATOMIC_RELEASE);
    st->done += to - from;
    return begin + st->done < end ? 1 : 0;
}

const struct fakecuda_kernel fakecuda_test_fill = {
    .name = "fakecuda_test_fill",
    .param_bytes = sizeof(struct fakecuda_test_fill_params),
    .state_bytes = sizeof(struct fill_state),
    .pass = fill_pass,
};

static int wait_flag_pass(void *state, const void *params, unsigned block, unsigned n_blocks,
                          unsigned threads_per_block)
{
    (void)state;
    (void)block;
    (void)n_blocks;
    (void)threads_per_block;
    const struct fakecuda_test_wait_flag_params *p = params;
    if (__atomic_load_n(p->flag, __ATOMIC_ACQUIRE) == 0)
        return 2;
    __atomic_fetch_add(p->done, 1, __ATOMIC_RELEASE);
    return 0;
}

const struct fakecuda_kernel fakecuda_test_wait_flag = {
    .name = "fakecuda_test_wait_flag",
    .param_bytes = sizeof(struct fakecuda_test_wait_flag_params),
    .state_bytes = 0,
    .pass = wait_flag_pass,
};

static int relay_pass(void *state, const void *params, unsigned block, unsigned n_blocks,
                      unsigned threads_per_block)
{
    (void)state;
    (void)threads_per_block;
    const struct fakecuda_test_relay_params *p = params;
    uint32_t next = 0;
    if (block + 1 < n_blocks) {
        next = __atomic_load_n(&p->slots[block + 1], __ATOMIC_ACQUIRE);
        if (next == 0)
            return 2;
    }
    __atomic_store_n(&p->slots[block], next + 1, __ATOMIC_RELEASE);
    return 0;
}

const struct fakecuda_kernel fakecuda_test_relay = {
    .name = "fakecuda_test_relay",
    .param_bytes = sizeof(struct fakecuda_test_relay_params),
    .state_bytes = 0,
    .pass = relay_pass,
};
