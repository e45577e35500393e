/*
 * The connector layer (src/conn/fifo.h) on its own, driven by two threads as
 * a producer and a consumer: slots cross in order with their sizes and
 * fingerprints, at most n_steps are outstanding, inline payloads stay in the
 * info line, and the parts of a FIFO may live in separate memories (here:
 * three allocations, as a peer-memory or RDMA transport would place them).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "src/conn/fifo.h"

#define N_STEPS    4
#define SLOT_BYTES 256
#define N_SLOTS    20000

struct split_fifo {
    uint64_t *tail_mem;          /* The consumer's memory: tail. */
    struct cfx_slot_info *infos; /* The consumer's memory: info lines. */
    uint64_t *head_mem;          /* The producer's memory: head. */
    char *slots;
    struct cfx_conn producer, consumer;
};

static void split_fifo_init(struct split_fifo *f)
{
    cr_assert_eq(posix_memalign((void **)&f->tail_mem, CFX_CACHE_LINE, CFX_CACHE_LINE), 0);
    cr_assert_eq(posix_memalign((void **)&f->head_mem, CFX_CACHE_LINE, CFX_CACHE_LINE), 0);
    cr_assert_eq(
        posix_memalign((void **)&f->infos, CFX_CACHE_LINE, N_STEPS * sizeof(struct cfx_slot_info)),
        0);
    f->slots = malloc(N_STEPS * SLOT_BYTES);
    cr_assert_not_null(f->slots);
    memset(f->tail_mem, 0, CFX_CACHE_LINE);
    memset(f->head_mem, 0, CFX_CACHE_LINE);
    memset(f->infos, 0, N_STEPS * sizeof(struct cfx_slot_info));
    struct cfx_conn view = {.tail = f->tail_mem,
                            .head = f->head_mem,
                            .info = f->infos,
                            .slots = f->slots,
                            .slot_bytes = SLOT_BYTES,
                            .n_steps = N_STEPS};
    f->producer = view;
    f->consumer = view;
}

static void split_fifo_free(struct split_fifo *f)
{
    free(f->tail_mem);
    free(f->head_mem);
    free(f->infos);
    free(f->slots);
}

/* Slot i carries (i * 37) % SLOT_BYTES + 1 bytes of the value i & 0xff. */
static size_t slot_size(uint64_t i)
{
    return (size_t)((i * 37) % SLOT_BYTES) + 1;
}

static void *produce(void *arg)
{
    struct split_fifo *f = arg;
    for (uint64_t i = 0; i < N_SLOTS; i++) {
        while (!cfx_fifo_can_post(&f->producer))
            sched_yield();
        size_t bytes = slot_size(i);
        memset(cfx_fifo_post_slot(&f->producer, bytes), (int)(i & 0xff), bytes);
        struct cfx_fingerprint print = {.seq = i, .count = bytes, .root = -1, .valid = 1};
        cfx_fifo_post(&f->producer, bytes, &print);
    }
    return NULL;
}

Test(conn, slots_cross_in_order_between_threads_with_head_and_tail_in_separate_memories)
{
    struct split_fifo f;
    split_fifo_init(&f);
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, produce, &f), 0);
    for (uint64_t i = 0; i < N_SLOTS; i++) {
        while (!cfx_fifo_can_take(&f.consumer))
            sched_yield();
        /* The producer never runs more than n_steps ahead. */
        uint64_t outstanding = cfx_load_acquire_u64(f.tail_mem) - cfx_load_relaxed_u64(f.head_mem);
        cr_assert_leq(outstanding, N_STEPS);
        cr_assert_eq(cfx_fifo_next_number(&f.consumer), (uint32_t)i);
        size_t bytes;
        const struct cfx_fingerprint *print;
        const char *data = cfx_fifo_take_slot(&f.consumer, &bytes, &print);
        cr_assert_eq(bytes, slot_size(i), "slot %llu", (unsigned long long)i);
        cr_assert_eq(print->seq, i);
        cr_assert_eq(print->slot, (uint32_t)i, "cfx_fifo_post numbers the slots");
        size_t index = (size_t)(i % N_STEPS);
        if (bytes <= CFX_SLOT_INLINE_BYTES)
            cr_assert_eq(data, f.infos[index].inline_data, "small payloads ride in the info line");
        else
            cr_assert_eq(data, f.slots + index * SLOT_BYTES);
        for (size_t b = 0; b < bytes; b++)
            cr_assert_eq((unsigned char)data[b], (unsigned char)(i & 0xff), "slot %llu byte %zu",
                         (unsigned long long)i, b);
        cfx_fifo_release(&f.consumer);
    }
    pthread_join(thread, NULL);
    cr_assert_eq(cfx_load_acquire_u64(f.tail_mem), N_SLOTS);
    cr_assert_eq(cfx_load_acquire_u64(f.head_mem), N_SLOTS);
    split_fifo_free(&f);
}

Test(conn, a_full_fifo_refuses_a_post_until_a_slot_is_released)
{
    struct split_fifo f;
    split_fifo_init(&f);
    struct cfx_fingerprint print = {.valid = 1};
    for (int i = 0; i < N_STEPS; i++) {
        cr_assert(cfx_fifo_can_post(&f.producer));
        cfx_fifo_post(&f.producer, 8, &print);
    }
    cr_assert_not(cfx_fifo_can_post(&f.producer), "n_steps slots are outstanding");
    cr_assert(cfx_fifo_can_take(&f.consumer));
    cfx_fifo_release(&f.consumer);
    cr_assert(cfx_fifo_can_post(&f.producer), "one slot came back");
    split_fifo_free(&f);
}
