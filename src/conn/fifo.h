/*
 * The connector every executor sees: a FIFO of n_steps slots, and the inline
 * operations a producer and a consumer run on it. The lowest layer of the
 * data path: it includes nothing above src/util, calls no transport, and
 * compiles as C for host threads and as CUDA for kernels (every operation
 * is CFX_HOST_DEVICE over src/util/atomics.h).
 *
 * Memory: a FIFO control block (struct cfx_fifo: tail, head, one info line
 * per slot, closed flag) followed by the slots. struct cfx_conn is the view
 * an executor holds: plain pointers to each part, so the parts may live in
 * different memories (the consumer's tail and info lines where it polls,
 * the producer's head where the producer polls; the peer writes remotely),
 * as peer-memory and RDMA transports need. Host transports today point all
 * of them into one block (shm: a segment both processes map; socket: each
 * side's own block, filled by the proxy).
 *
 * Protocol: the producer waits until fewer than n_steps slots are
 * outstanding (tail - head), writes the payload where cfx_fifo_post_slot
 * says, then cfx_fifo_post: info line (size, fingerprint), the line's seq
 * (release: the consumer polls it), then tail (release). The consumer
 * polls the next slot's seq (acquire), reads size, fingerprint and
 * payload, then cfx_fifo_release advances head (release). Counters only
 * grow; a slot's index is its number modulo n_steps.
 */
#ifndef CFX_CONN_FIFO_H
#define CFX_CONN_FIFO_H

#include <stddef.h>
#include <stdint.h>

#include "src/util/atomics.h"

#define CFX_MAX_STEPS  64
#define CFX_CACHE_LINE 64

/* What each slot says about the operation that posted it, so the receiver
 * can tell that both ranks run the same operation (mismatch detection). */
struct cfx_fingerprint {
    uint64_t seq;   /* Per-communicator collective number, or per-peer message number. */
    uint64_t count; /* Elements. */
    int32_t root;   /* Root, or -1. */
    uint8_t kind;   /* enum cfx_coll_kind of the operation (send for point to point). */
    uint8_t type;   /* cfxDataType_t. */
    uint8_t op;     /* cfxRedOp_t, or 0xff. */
    uint8_t valid;  /* 1 when set. */
    uint32_t slot;  /* The connector's slot number (low 32 bits), set by cfx_fifo_post: the
                     * receiver expects its own count, so a lost slot is seen at once. */
    uint32_t zero;  /* No padding: fingerprints are compared with memcmp. */
};

/* Payloads up to this size travel inside the slot's info line. */
#define CFX_SLOT_INLINE_BYTES 24

/* What the consumer reads of a slot besides its data: one cache line, with
 * a small payload inside it, so a small slot costs the consumer two cache
 * lines (the tail's and this one) and its producer no store to the slot. */
struct cfx_slot_info {
    CFX_ALIGNAS(CFX_CACHE_LINE) uint32_t size; /* Bytes in the slot. */
    uint32_t seq; /* Slot number + 1 (low 32 bits) once posted, stored last (release):
                   * the consumer polls this line, not the tail's. */
    struct cfx_fingerprint print;                           /* Who posted it. */
    CFX_ALIGNAS(8) char inline_data[CFX_SLOT_INLINE_BYTES]; /* The payload, when that small. */
};
CFX_STATIC_ASSERT(sizeof(struct cfx_slot_info) == CFX_CACHE_LINE, "slot info is one cache line");

/* The FIFO control block. Lives at the start of the connector's memory; the
 * slots follow at cfx_fifo_slots_offset(). Counters only grow. Every field
 * another agent reads goes through src/util/atomics.h. */
struct cfx_fifo {
    CFX_ALIGNAS(CFX_CACHE_LINE) uint64_t tail;  /* Posted by the producer. */
    CFX_ALIGNAS(CFX_CACHE_LINE) uint64_t head;  /* Released by the consumer. */
    struct cfx_slot_info info[CFX_MAX_STEPS];   /* Each posted slot's size and fingerprint. */
    CFX_ALIGNAS(CFX_CACHE_LINE) int32_t closed; /* 0, or the cfxResult_t that broke a side (shm). */
    int32_t attached;                           /* Set by the sender once mapped (shm). */
    int32_t refs;                               /* Sides holding process-local memory (shm). */
    int32_t pinned; /* Process-local memory registered with CUDA: its device + 1 (shm; the last
                     * side to let go unpins); -1 while a side registers it; 0: not. */
    /* Set by the consumer once connected (point-to-point FIFOs whose memory
     * both sides share): the smallest send that goes single copy
     * (src/coll/pull.h), CFX_PULL_NEVER for none; 0 until it is set. */
    uint64_t pull_min;
};

/* cfx_fifo.pull_min: this connection never takes the single-copy path. */
#define CFX_PULL_NEVER UINT64_MAX

/* Bytes from the FIFO control block to slot 0 (page aligned). */
static inline CFX_HOST_DEVICE size_t cfx_fifo_slots_offset(void)
{
    return (sizeof(struct cfx_fifo) + 4095) & ~(size_t)4095;
}

/* One side's view of a FIFO: where each part lives. Plain data: copied into
 * a kernel's work as it is. */
struct cfx_conn {
    uint64_t *tail;             /* The producer's posted count. */
    uint64_t *head;             /* The consumer's released count. */
    struct cfx_slot_info *info; /* [n_steps] info lines. */
    char *slots;                /* [n_steps * slot_bytes] payloads. */
    uint64_t slot_bytes;
    int32_t n_steps;
    int32_t peer;       /* The rank at the other end (for a kernel's failure report). */
    uint64_t head_seen; /* Producer: the consumer's head when last read (cfx_fifo_can_post). */
    /* Nonzero once a side broke the connection (a cfxResult_t), in memory
     * the reader of this view can poll: a kernel that waits here stops. */
    const int32_t *closed;
    /* The LL slots ([n_steps] of CFX_LL_SLOT_BYTES, zeroed at setup, only
     * ever written as LL words), where the consumer polls; NULL: this
     * connector carries Simple slots only. */
    uint64_t *ll;
};

/* Point @p view at a FIFO whose parts are all in one block. */
static inline void cfx_fifo_view(struct cfx_conn *view, struct cfx_fifo *fifo, char *slots,
                                 size_t slot_bytes, int n_steps)
{
    view->tail = &fifo->tail;
    view->head = &fifo->head;
    view->info = fifo->info;
    view->slots = slots;
    view->slot_bytes = slot_bytes;
    view->n_steps = n_steps;
    view->peer = -1;
    view->head_seen = 0;
    view->closed = &fifo->closed;
    view->ll = 0;
}

/* Mark slot @p number posted (its info and data written before). */
static inline CFX_HOST_DEVICE void cfx_fifo_mark_posted(struct cfx_slot_info *info, int n_steps,
                                                        uint64_t number)
{
    cfx_store_release_u32(&info[number % (uint64_t)n_steps].seq, (uint32_t)(number + 1));
}

/* Where slot @p index keeps a payload of @p bytes: inside its info line when
 * small enough, else in the slot. Producer, consumer and transports all ask
 * here. */
static inline CFX_HOST_DEVICE char *cfx_fifo_data(struct cfx_slot_info *info, char *slots,
                                                  size_t slot_bytes, size_t index, size_t bytes)
{
    if (bytes <= CFX_SLOT_INLINE_BYTES)
        return info[index].inline_data;
    return slots + index * slot_bytes;
}

/* Producer: a slot is free to fill. The consumer's head is read only when
 * the last value seen says the FIFO is full (its line need not cross agents
 * on every post). */
static inline CFX_HOST_DEVICE int cfx_fifo_can_post_at(struct cfx_conn *c, uint64_t tail)
{
    if (tail - c->head_seen < (uint64_t)c->n_steps)
        return 1;
    c->head_seen = cfx_load_acquire_u64(c->head);
    return tail - c->head_seen < (uint64_t)c->n_steps;
}

static inline CFX_HOST_DEVICE int cfx_fifo_can_post(struct cfx_conn *c)
{
    return cfx_fifo_can_post_at(c, cfx_load_relaxed_u64(c->tail));
}

/* Producer: every slot it posted (@p tail of them) was released: the
 * consumer is done with all of them. */
static inline CFX_HOST_DEVICE int cfx_fifo_drained_at(struct cfx_conn *c, uint64_t tail)
{
    if (c->head_seen == tail)
        return 1;
    c->head_seen = cfx_load_acquire_u64(c->head);
    return c->head_seen == tail;
}

/*
 * The _at forms take the side's own counter (the producer's tail, the
 * consumer's head) from the caller instead of loading it: only that side
 * writes it, so a caller that keeps a copy (a kernel, whose loads of
 * host-mapped memory each cross the bus) need not read it back.
 */

/* Producer: where to write the next slot's @p bytes of payload. */
static inline CFX_HOST_DEVICE char *cfx_fifo_post_slot_at(const struct cfx_conn *c, uint64_t tail,
                                                          size_t bytes)
{
    return cfx_fifo_data(c->info, c->slots, c->slot_bytes, (size_t)(tail % (uint64_t)c->n_steps),
                         bytes);
}

static inline CFX_HOST_DEVICE char *cfx_fifo_post_slot(const struct cfx_conn *c, size_t bytes)
{
    return cfx_fifo_post_slot_at(c, cfx_load_relaxed_u64(c->tail), bytes);
}

/* Producer: publish the filled slot with @p bytes of payload (written where
 * cfx_fifo_post_slot said), stamped with the operation's fingerprint. The
 * caller moves the bytes on (a transport's kick) if its FIFO needs that. */
static inline CFX_HOST_DEVICE void cfx_fifo_post_at(struct cfx_conn *c, uint64_t tail, size_t bytes,
                                                    const struct cfx_fingerprint *print)
{
    struct cfx_slot_info *info = &c->info[tail % (uint64_t)c->n_steps];
    info->size = (uint32_t)bytes;
    info->print = *print;
    info->print.slot = (uint32_t)tail;
    cfx_fifo_mark_posted(c->info, c->n_steps, tail);
    cfx_store_release_u64(c->tail, tail + 1);
}

static inline CFX_HOST_DEVICE void cfx_fifo_post(struct cfx_conn *c, size_t bytes,
                                                 const struct cfx_fingerprint *print)
{
    cfx_fifo_post_at(c, cfx_load_relaxed_u64(c->tail), bytes, print);
}

/* Consumer: a posted slot is waiting (one load of the slot's info line). */
static inline CFX_HOST_DEVICE int cfx_fifo_can_take_at(const struct cfx_conn *c, uint64_t head)
{
    return cfx_load_acquire_u32(&c->info[head % (uint64_t)c->n_steps].seq) == (uint32_t)(head + 1);
}

static inline CFX_HOST_DEVICE int cfx_fifo_can_take(const struct cfx_conn *c)
{
    return cfx_fifo_can_take_at(c, cfx_load_relaxed_u64(c->head));
}

/* In a slot's info size: its payload was written by the transport straight
 * into the receiver's own buffer, where this slot's receive step would copy
 * it (a registered receive, cfxCommRegister), not into the slot. Set only
 * by transports with post_at, on slots of operations that offered their
 * buffer; the size below it is the payload's. */
#define CFX_SLOT_IN_PLACE  0x80000000u
#define CFX_SLOT_SIZE_MASK 0x7fffffffu

/* Consumer: whether the oldest posted slot's payload is in place. */
static inline CFX_HOST_DEVICE int cfx_fifo_in_place_at(const struct cfx_conn *c, uint64_t head)
{
    return (c->info[head % (uint64_t)c->n_steps].size & CFX_SLOT_IN_PLACE) != 0;
}

/* Consumer: the oldest posted slot, its size and its fingerprint. */
static inline CFX_HOST_DEVICE const char *
cfx_fifo_take_slot_at(const struct cfx_conn *c, uint64_t head, size_t *bytes_p,
                      const struct cfx_fingerprint **print_p)
{
    size_t index = (size_t)(head % (uint64_t)c->n_steps);
    size_t bytes = c->info[index].size & CFX_SLOT_SIZE_MASK;
    *bytes_p = bytes;
    *print_p = &c->info[index].print;
    return cfx_fifo_data(c->info, c->slots, c->slot_bytes, index, bytes);
}

static inline CFX_HOST_DEVICE const char *cfx_fifo_take_slot(const struct cfx_conn *c,
                                                             size_t *bytes_p,
                                                             const struct cfx_fingerprint **print_p)
{
    return cfx_fifo_take_slot_at(c, cfx_load_relaxed_u64(c->head), bytes_p, print_p);
}

/* Consumer: hand the slot back. The caller moves the credit on (a
 * transport's kick) if its FIFO needs that. */
static inline CFX_HOST_DEVICE void cfx_fifo_release_at(struct cfx_conn *c, uint64_t head)
{
    cfx_store_release_u64(c->head, head + 1);
}

static inline CFX_HOST_DEVICE void cfx_fifo_release(struct cfx_conn *c)
{
    cfx_fifo_release_at(c, cfx_load_relaxed_u64(c->head));
}

/* Whether a side broke the connection (a cfxResult_t, 0 while healthy). */
static inline CFX_HOST_DEVICE int32_t cfx_fifo_closed(const struct cfx_conn *c)
{
    return c->closed ? (int32_t)cfx_load_acquire_u32((const uint32_t *)c->closed) : 0;
}

/* Consumer: the number of the next slot it will take (low 32 bits). */
static inline CFX_HOST_DEVICE uint32_t cfx_fifo_next_number(const struct cfx_conn *c)
{
    return (uint32_t)cfx_load_relaxed_u64(c->head);
}

/*
 * LL (low latency), the protocol for small steps between agents that reach
 * each other's memory (NCCL's LL): every 4 bytes of a slot travel in one
 * 8-byte word together with a flag, the slot's number + 1 (low 32 bits),
 * written by one store. The consumer polls the words themselves: a word
 * whose flag is its slot's is valid, with no fence on the producer and no
 * info line or tail to read first. Half of each word is flag, so LL is for
 * small steps; the slots live in a region of their own (cfx_conn.ll) that
 * nothing else writes, so a stale word can only hold an older flag.
 *
 * An LL slot: word 0 {size, flag}, word 1 {check, flag} (check: a hash of
 * the fingerprint and the slot number, for mismatch detection), then the
 * data, 4 bytes per word, zero-padded to 16 bytes. The producer still waits
 * for head (a slot is free) and bumps its tail (relaxed: nobody reads data
 * by it); the consumer still releases head.
 */
#define CFX_LL_SLOT_BYTES   ((size_t)16384)
#define CFX_LL_HEADER_WORDS 2
/* Data bytes one LL slot carries (whole 16-byte packs). */
#define CFX_LL_DATA_BYTES ((((CFX_LL_SLOT_BYTES / 8) - CFX_LL_HEADER_WORDS) * 4) & ~(size_t)15)

/* The LL slot @p number of @p c uses. */
static inline CFX_HOST_DEVICE uint64_t *cfx_ll_slot(const struct cfx_conn *c, uint64_t number)
{
    return c->ll + (size_t)(number % (uint64_t)c->n_steps) * (CFX_LL_SLOT_BYTES / 8);
}

static inline CFX_HOST_DEVICE uint32_t cfx_ll_flag(uint64_t number)
{
    return (uint32_t)(number + 1);
}

/* An LL word: @p data in the low half, @p flag in the high one. */
static inline CFX_HOST_DEVICE uint64_t cfx_ll_word(uint32_t data, uint32_t flag)
{
    return (uint64_t)data | ((uint64_t)flag << 32);
}

static inline CFX_HOST_DEVICE void cfx_ll_store(uint64_t *word, uint32_t data, uint32_t flag)
{
    cfx_store_relaxed_u64(word, cfx_ll_word(data, flag));
}

/* Whether @p word holds @p flag's data (then *data_p is it). */
static inline CFX_HOST_DEVICE int cfx_ll_load(const uint64_t *word, uint32_t flag, uint32_t *data_p)
{
    uint64_t v = cfx_load_relaxed_u64(word);
    *data_p = (uint32_t)v;
    return (uint32_t)(v >> 32) == flag;
}

/* The check word of a slot: the fingerprint's fields and the slot number,
 * mixed into 32 bits (equal fingerprints, equal checks). */
static inline CFX_HOST_DEVICE uint32_t cfx_ll_check(const struct cfx_fingerprint *print,
                                                    uint32_t slot)
{
    uint64_t h = 0x9e3779b97f4a7c15ull;
    uint64_t parts[4] = {print->seq, print->count,
                         (uint64_t)(uint32_t)print->root | ((uint64_t)print->kind << 32) |
                             ((uint64_t)print->type << 40) | ((uint64_t)print->op << 48) |
                             ((uint64_t)print->valid << 56),
                         slot};
    for (int i = 0; i < 4; i++) {
        h ^= parts[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 33;
    }
    return (uint32_t)h ^ (uint32_t)(h >> 32);
}

/* Producer: write LL slot @p number's header (its data words may come
 * before or after: each word carries its own flag). */
static inline CFX_HOST_DEVICE void cfx_ll_post_header(const struct cfx_conn *c, uint64_t number,
                                                      size_t bytes,
                                                      const struct cfx_fingerprint *print)
{
    uint64_t *slot = cfx_ll_slot(c, number);
    uint32_t flag = cfx_ll_flag(number);
    cfx_ll_store(&slot[0], (uint32_t)bytes, flag);
    cfx_ll_store(&slot[1], cfx_ll_check(print, (uint32_t)number), flag);
}

/* Consumer: LL slot @p number's header has arrived (its size and check in
 * *bytes_p and *check_p). */
static inline CFX_HOST_DEVICE int cfx_ll_can_take_at(const struct cfx_conn *c, uint64_t number,
                                                     uint32_t *bytes_p, uint32_t *check_p)
{
    const uint64_t *slot = cfx_ll_slot(c, number);
    uint32_t flag = cfx_ll_flag(number);
    return cfx_ll_load(&slot[0], flag, bytes_p) && cfx_ll_load(&slot[1], flag, check_p);
}

#endif /* CFX_CONN_FIFO_H */
