/*
 * The step loop a kernel runs: one rank's work descriptor (work.h), driven
 * through its schedule (schedules.h) over FIFO views (src/conn/fifo.h),
 * with nothing but plain data and the connector's inline operations. It
 * compiles as CUDA for a kernel (tests/gpu/steploop_kernel.cu; the CUDA
 * executor's blocks run it) and as C for the CPU test that drives every
 * schedule through it (tests/test_steploop.c).
 *
 * What it leaves to its executor, by design: moving bytes between agents
 * (a transport's kick; a kernel's FIFOs are in memory both sides reach),
 * timeouts, and sentences. It reports what went wrong as a status and the
 * index of the connector it happened on; the host turns that into an error
 * naming the peer.
 *
 * A step runs in three parts, so that a thread block can share one:
 *   cfx_steploop_plan   (one thread) checks the received slots, reserves the
 *                       slot to send, and writes where every byte comes from
 *                       and goes to into a plan;
 *   cfx_steploop_data   (every thread, each its share of the elements) moves
 *                       and reduces the bytes the plan names;
 *   cfx_steploop_commit (one thread, after the others) releases the received
 *                       slots and posts the sent one.
 * Each element is read, reduced (in registers) and written by one thread,
 * so the threads need no synchronisation between the parts of the data;
 * the executor synchronises them between plan, data and commit.
 * cfx_steploop_progress runs all three on one thread (the CPU test).
 * The host executor runs the same schedules through src/coll/prims.c,
 * whose copies and reductions are the host's vector kernels.
 *
 * Single-copy steps (PULL/ADDR) read the address a slot carries directly:
 * valid where the sender's buffer is mapped into this agent (threads of one
 * process; peer-mapped device memory).
 */
#ifndef CFX_COLL_STEPLOOP_H
#define CFX_COLL_STEPLOOP_H

#include <string.h>

#include "kernels/reduce_ops.h"
#include "src/coll/schedules.h"

enum cfx_steploop_status {
    CFX_STEPLOOP_RUNNING = 0,
    CFX_STEPLOOP_DONE = 1,
    CFX_STEPLOOP_MISMATCH = 2,  /* A slot's fingerprint is another operation's. */
    CFX_STEPLOOP_LOST_SLOT = 3, /* A slot's number is not the one expected. */
    CFX_STEPLOOP_BAD_SIZE = 4,  /* A slot's size is not what the schedule says. */
};

struct cfx_steploop {
    const struct cfx_work *work;
    struct cfx_conn *conns; /* [work->n_conns]: the peer table, as views. */
    uint64_t step;          /* The next step to run. */
    uint64_t described;     /* The index next describes (UINT64_MAX: none). */
    struct cfx_step next;
    int status;          /* enum cfx_steploop_status. */
    int failed_conn;     /* On failure: the peer table index it came from. */
    uint64_t copy_bytes; /* Bytes copied or reduced so far (tests, counters). */
    /* LL: a word whose turning nonzero stops threads waiting for data words
     * (the executor's abort word), or NULL. */
    const int32_t *stop;
    /* This side's counter of each connector, the head of those it receives
     * on and the tail of those it sends on: only this loop writes them
     * while it runs, so they are read from memory once, at init (a kernel's
     * loads of host-mapped FIFOs each cross the bus), and stored through. */
    uint64_t heads[CFX_OP_MAX_CONNS];
    uint64_t tails[CFX_OP_MAX_CONNS];
};

static inline CFX_HOST_DEVICE void
cfx_steploop_init(struct cfx_steploop *l, const struct cfx_work *work, struct cfx_conn *conns)
{
    l->work = work;
    l->conns = conns;
    l->step = 0;
    l->described = UINT64_MAX;
    l->status = work->n_steps == 0 ? CFX_STEPLOOP_DONE : CFX_STEPLOOP_RUNNING;
    l->failed_conn = -1;
    l->copy_bytes = 0;
    l->stop = 0;
    for (int i = 0; i < work->n_conns && i < CFX_OP_MAX_CONNS; i++) {
        l->heads[i] = cfx_load_relaxed_u64(conns[i].head);
        l->tails[i] = cfx_load_relaxed_u64(conns[i].tail);
    }
}

/* Where one step's bytes come from and go to (cfx_steploop_plan). */
struct cfx_steploop_plan {
    uint64_t n; /* Elements (for a byte copy: bytes). */
    /* A step that moves bytes as they are (single copy): copy_bytes from
     * copy_from to copy_to (either may be NULL: nothing to copy). */
    const char *copy_from;
    char *copy_to;
    /* A step on elements: each element is the fold of operands[0..n_operands)
     * (or operands[0] alone when n_operands is 1), finished when avg, then
     * stored at each of out and slot_out that is not NULL. */
    const char *operands[CFX_PRIM_MAX_RECV + 1];
    int n_operands;
    int avg;
    char *out;
    char *slot_out;
    /* LL (work proto): operands[k] is an LL slot's data words when bit k of
     * ll_in is set, valid once each word carries ll_flag[k]; with ll_out,
     * slot_out is an LL slot's data words, written with ll_out_flag. A
     * thread that waits for a word gives up when *stop (if not NULL) turns
     * nonzero. */
    uint32_t ll_in;
    int ll_out;
    uint32_t ll_flag[CFX_PRIM_MAX_RECV + 1];
    uint32_t ll_out_flag;
    const int32_t *stop;
};

/* The finish of cfxAvg (x / nranks) or of a PreMulSum (x * scalar). */
#define CFX_SL_FINISH(w, name, T, x, scalar)                                                       \
    ((w)->premul ? cfx_prod_##name(x, scalar) : cfx_avg_finish_##name(x, (w)->nranks))

/* One element of type T: fold the operands, finish, store. */
#define CFX_SL_ELEMENT(p, w, name, T, OPFN, e, scalar)                                             \
    do {                                                                                           \
        T v_ = ((const T *)(p)->operands[0])[e];                                                   \
        for (int k_ = 1; k_ < (p)->n_operands; k_++)                                               \
            v_ = OPFN(v_, ((const T *)(p)->operands[k_])[e]);                                      \
        if ((p)->avg)                                                                              \
            v_ = CFX_SL_FINISH(w, name, T, v_, scalar);                                            \
        if ((p)->out)                                                                              \
            ((T *)(p)->out)[e] = v_;                                                               \
        if ((p)->slot_out)                                                                         \
            ((T *)(p)->slot_out)[e] = v_;                                                          \
    } while (0)

#define CFX_SL_LOOP(p, w, name, T, OPFN, from, tid, nthreads, scalar)                              \
    for (uint64_t e_ = (from) + (tid); e_ < (p)->n; e_ += (nthreads))                              \
    CFX_SL_ELEMENT(p, w, name, T, OPFN, e_, scalar)

/* 16 bytes, the unit of the vector path: one 128-bit load or store on a
 * GPU (the pointers are 16-byte aligned there), a memcpy on the CPU. */
struct cfx_pack16 {
    CFX_ALIGNAS(16) uint64_t w[2];
};

static inline CFX_HOST_DEVICE struct cfx_pack16 cfx_pack16_load(const char *p)
{
#if defined(__CUDA_ARCH__)
    return *(const struct cfx_pack16 *)p;
#else
    struct cfx_pack16 v;
    memcpy(&v, p, sizeof(v));
    return v;
#endif
}

static inline CFX_HOST_DEVICE void cfx_pack16_store(char *p, struct cfx_pack16 v)
{
#if defined(__CUDA_ARCH__)
    *(struct cfx_pack16 *)p = v;
#else
    memcpy(p, &v, sizeof(v));
#endif
}

static inline CFX_HOST_DEVICE int cfx_sl_aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

/* Packs a thread keeps in flight (loads issued before the first store). */
#define CFX_SL_UNROLL 4

/* Bytes from @p from to @p to: 16-byte packs (CFX_SL_UNROLL at a time per
 * thread) when both are aligned, then bytes. Returns nothing; thread
 * @p tid of @p nthreads moves packs tid, tid + nthreads, ... */
static inline CFX_HOST_DEVICE void cfx_sl_copy(char *to, const char *from, uint64_t n, unsigned tid,
                                               unsigned nthreads)
{
    uint64_t packs = (cfx_sl_aligned16(to) && cfx_sl_aligned16(from)) ? n / 16 : 0;
    uint64_t i = tid;
    for (; i + (CFX_SL_UNROLL - 1) * (uint64_t)nthreads < packs;
         i += CFX_SL_UNROLL * (uint64_t)nthreads) {
        struct cfx_pack16 v[CFX_SL_UNROLL];
        for (int u = 0; u < CFX_SL_UNROLL; u++)
            v[u] = cfx_pack16_load(from + 16 * (i + (uint64_t)u * nthreads));
        for (int u = 0; u < CFX_SL_UNROLL; u++)
            cfx_pack16_store(to + 16 * (i + (uint64_t)u * nthreads), v[u]);
    }
    for (; i < packs; i += nthreads)
        cfx_pack16_store(to + 16 * i, cfx_pack16_load(from + 16 * i));
    for (uint64_t b = packs * 16 + tid; b < n; b += nthreads)
        to[b] = from[b];
}

/* Whether every pointer of @p p is 16-byte aligned (NULL counts as aligned). */
static inline CFX_HOST_DEVICE int cfx_sl_plan_aligned16(const struct cfx_steploop_plan *p)
{
    int ok = cfx_sl_aligned16(p->out) && cfx_sl_aligned16(p->slot_out);
    for (int k = 0; k < p->n_operands; k++)
        ok &= cfx_sl_aligned16(p->operands[k]);
    return ok;
}

/* One pack of elements of type T: fold, finish, store (as CFX_SL_ELEMENT,
 * 16 / sizeof(T) elements at a time). */
#define CFX_SL_PACK(p, w, name, T, OPFN, i, scalar)                                                \
    do {                                                                                           \
        union {                                                                                    \
            struct cfx_pack16 raw;                                                                 \
            T elt[16 / sizeof(T)];                                                                 \
        } a_, b_;                                                                                  \
        a_.raw = cfx_pack16_load((p)->operands[0] + 16 * (i));                                     \
        for (int k_ = 1; k_ < (p)->n_operands; k_++) {                                             \
            b_.raw = cfx_pack16_load((p)->operands[k_] + 16 * (i));                                \
            for (int j_ = 0; j_ < (int)(16 / sizeof(T)); j_++)                                     \
                a_.elt[j_] = OPFN(a_.elt[j_], b_.elt[j_]);                                         \
        }                                                                                          \
        if ((p)->avg)                                                                              \
            for (int j_ = 0; j_ < (int)(16 / sizeof(T)); j_++)                                     \
                a_.elt[j_] = CFX_SL_FINISH(w, name, T, a_.elt[j_], scalar);                        \
        if ((p)->out)                                                                              \
            cfx_pack16_store((p)->out + 16 * (i), a_.raw);                                         \
        if ((p)->slot_out)                                                                         \
            cfx_pack16_store((p)->slot_out + 16 * (i), a_.raw);                                    \
    } while (0)

/* A step on elements: whole packs when every pointer is aligned, then the
 * elements left (all of them when one is not). */
#define CFX_SL_RUN(p, w, name, T, OPFN, tid, nthreads, scalar)                                     \
    do {                                                                                           \
        uint64_t packs_ = cfx_sl_plan_aligned16(p) ? (p)->n / (16 / sizeof(T)) : 0;                \
        for (uint64_t i_ = (tid); i_ < packs_; i_ += (nthreads))                                   \
            CFX_SL_PACK(p, w, name, T, OPFN, i_, scalar);                                          \
        CFX_SL_LOOP(p, w, name, T, OPFN, packs_ *(16 / sizeof(T)), tid, nthreads, scalar);         \
    } while (0)

/* Idle rounds between a waiting thread's looks at plan.stop. */
#define CFX_SL_LL_SPIN_CHECK 1024

/* Pack @p i (bytes 16i..16i+15, fewer at the end: zeros after) of operand
 * @p k into *v: an LL slot's words once each carries its flag, else plain
 * loads. 0 when the wait was stopped. */
static inline CFX_HOST_DEVICE int cfx_sl_ll_get(const struct cfx_steploop_plan *p, int k,
                                                uint64_t i, uint64_t bytes, struct cfx_pack16 *v)
{
    uint64_t off = 16 * i, n = bytes - off < 16 ? bytes - off : 16;
    if (p->ll_in & (1u << k)) {
        const uint64_t *words = (const uint64_t *)p->operands[k] + 4 * i;
        uint32_t d[4];
        for (int j = 0; j < 4; j++) {
            unsigned spins = 0;
            while (!cfx_ll_load(&words[j], p->ll_flag[k], &d[j]))
                if (++spins % CFX_SL_LL_SPIN_CHECK == 0 && p->stop != 0 &&
                    cfx_load_relaxed_u32((const uint32_t *)p->stop) != 0)
                    return 0;
        }
        memcpy(v, d, sizeof(d));
        return 1;
    }
    const char *from = p->operands[k] + off;
    if (n == 16 && cfx_sl_aligned16(from)) {
        *v = cfx_pack16_load(from);
        return 1;
    }
    char b[16];
    for (int j = 0; j < 16; j++)
        b[j] = j < (int)n ? from[j] : 0;
    memcpy(v, b, sizeof(b));
    return 1;
}

/* Bytes @p n (at most 16) of @p v at @p to. */
static inline CFX_HOST_DEVICE void cfx_sl_put_bytes(char *to, uint64_t n, struct cfx_pack16 v)
{
    if (n == 16 && cfx_sl_aligned16(to)) {
        cfx_pack16_store(to, v);
        return;
    }
    char b[16];
    memcpy(b, &v, sizeof(b));
    for (uint64_t j = 0; j < n; j++)
        to[j] = b[j];
}

/* Store pack @p i of the result: to out (its bytes only), and to slot_out,
 * as LL words with ll_out (all four: the tail of the last pack is zero
 * padding), else as bytes. */
static inline CFX_HOST_DEVICE void cfx_sl_ll_put(const struct cfx_steploop_plan *p, uint64_t i,
                                                 uint64_t bytes, struct cfx_pack16 v)
{
    uint64_t off = 16 * i, n = bytes - off < 16 ? bytes - off : 16;
    if (p->out)
        cfx_sl_put_bytes(p->out + off, n, v);
    if (p->slot_out && !p->ll_out)
        cfx_sl_put_bytes(p->slot_out + off, n, v);
    if (p->slot_out && p->ll_out) {
        uint32_t d[4];
        memcpy(d, &v, sizeof(d));
        uint64_t *words = (uint64_t *)p->slot_out + 4 * i;
        for (int j = 0; j < 4; j++)
            cfx_ll_store(&words[j], d[j], p->ll_out_flag);
    }
}

/* One pack of an LL step: fold the operands (type T), finish, store. */
#define CFX_SL_LL_PACK(p, w, name, T, OPFN, i, bytes, scalar, ok)                                  \
    do {                                                                                           \
        union {                                                                                    \
            struct cfx_pack16 raw;                                                                 \
            T elt[16 / sizeof(T)];                                                                 \
        } a_, b_;                                                                                  \
        ok = cfx_sl_ll_get(p, 0, i, bytes, &a_.raw);                                               \
        for (int k_ = 1; ok && k_ < (p)->n_operands; k_++) {                                       \
            ok = cfx_sl_ll_get(p, k_, i, bytes, &b_.raw);                                          \
            for (int j_ = 0; j_ < (int)(16 / sizeof(T)); j_++)                                     \
                a_.elt[j_] = OPFN(a_.elt[j_], b_.elt[j_]);                                         \
        }                                                                                          \
        if (ok && (p)->avg)                                                                        \
            for (int j_ = 0; j_ < (int)(16 / sizeof(T)); j_++)                                     \
                a_.elt[j_] = CFX_SL_FINISH(w, name, T, a_.elt[j_], scalar);                        \
        if (ok)                                                                                    \
            cfx_sl_ll_put(p, i, bytes, a_.raw);                                                    \
    } while (0)

/* Data of a step with LL slots on either side: this thread's packs. */
#define CFX_SL_LL_RUN(p, w, name, T, OPFN, tid, nthreads, scalar)                                  \
    do {                                                                                           \
        uint64_t bytes_ = (p)->n * sizeof(T), packs_ = (bytes_ + 15) / 16;                         \
        int ok_ = 1;                                                                               \
        for (uint64_t i_ = (tid); ok_ && i_ < packs_; i_ += (nthreads))                            \
            CFX_SL_LL_PACK(p, w, name, T, OPFN, i_, bytes_, scalar, ok_);                          \
    } while (0)

/* Data: this thread's share of what @p p moves: packs (or, unaligned,
 * elements) tid, tid + nthreads, ... Every thread of a step calls it with
 * the same plan; the threads may span several blocks (a team: tid is then
 * the thread's place in the team). */
static inline CFX_HOST_DEVICE void cfx_steploop_data(const struct cfx_work *w,
                                                     const struct cfx_steploop_plan *p,
                                                     unsigned tid, unsigned nthreads)
{
    if (p->copy_from != 0 && p->copy_to != 0 && p->copy_from != p->copy_to) {
        cfx_sl_copy(p->copy_to, p->copy_from, p->n, tid, nthreads);
        return;
    }
    if (p->n_operands == 0 || p->n == 0)
        return;
    if (p->ll_in || p->ll_out) {
        switch (w->type) {
#define CFX_SL_LL_TYPE(enumv, name, T)                                                             \
    case enumv: {                                                                                  \
        T scalar;                                                                                  \
        memcpy(&scalar, &w->premul_bits, sizeof(T));                                               \
        switch (w->redop) {                                                                        \
        case cfxProd: CFX_SL_LL_RUN(p, w, name, T, cfx_prod_##name, tid, nthreads, scalar); break; \
        case cfxMax: CFX_SL_LL_RUN(p, w, name, T, cfx_max_##name, tid, nthreads, scalar); break;   \
        case cfxMin: CFX_SL_LL_RUN(p, w, name, T, cfx_min_##name, tid, nthreads, scalar); break;   \
        default: /* Sum, Avg, PreMulSum. */                                                        \
            CFX_SL_LL_RUN(p, w, name, T, cfx_sum_##name, tid, nthreads, scalar);                   \
            break;                                                                                 \
        }                                                                                          \
        break;                                                                                     \
    }
            CFX_REDUCE_FOR_EACH_TYPE(CFX_SL_LL_TYPE)
#undef CFX_SL_LL_TYPE
        default: break;
        }
        return;
    }
    if (p->n_operands == 1 && !p->avg) {
        /* A plain copy to one or two places (a forwarded slot, an output). */
        if (p->out != 0 && p->slot_out == 0) {
            cfx_sl_copy(p->out, p->operands[0], p->n * w->elem_bytes, tid, nthreads);
            return;
        }
        if (p->slot_out != 0 && p->out == 0) {
            cfx_sl_copy(p->slot_out, p->operands[0], p->n * w->elem_bytes, tid, nthreads);
            return;
        }
    }
    switch (w->type) {
#define CFX_SL_TYPE(enumv, name, T)                                                                \
    case enumv: {                                                                                  \
        T scalar;                                                                                  \
        memcpy(&scalar, &w->premul_bits, sizeof(T));                                               \
        switch (w->redop) {                                                                        \
        case cfxProd: CFX_SL_RUN(p, w, name, T, cfx_prod_##name, tid, nthreads, scalar); break;    \
        case cfxMax: CFX_SL_RUN(p, w, name, T, cfx_max_##name, tid, nthreads, scalar); break;      \
        case cfxMin: CFX_SL_RUN(p, w, name, T, cfx_min_##name, tid, nthreads, scalar); break;      \
        default: /* Sum, Avg, PreMulSum. */                                                        \
            CFX_SL_RUN(p, w, name, T, cfx_sum_##name, tid, nthreads, scalar);                      \
            break;                                                                                 \
        }                                                                                          \
        break;                                                                                     \
    }
        CFX_REDUCE_FOR_EACH_TYPE(CFX_SL_TYPE)
#undef CFX_SL_TYPE
    default: break;
    }
}

/* Whether connector @p index carries this operation's slots as LL: the
 * operation runs LL and the connector has LL slots (at both ends, as its
 * transport gives them; the operation's proto is alike on every rank). */
static inline CFX_HOST_DEVICE int cfx_steploop_ll(const struct cfx_steploop *l, int index)
{
    return l->work->proto == CFX_WORK_PROTO_LL && l->conns[index].ll != 0;
}

/* Whether connector @p index has its next slot (loads only): an LL slot's
 * header, or a Simple slot's posted info line. */
static inline CFX_HOST_DEVICE int cfx_steploop_can_take(struct cfx_steploop *l, int index)
{
    if (cfx_steploop_ll(l, index)) {
        uint32_t bytes, check;
        return cfx_ll_can_take_at(&l->conns[index], l->heads[index], &bytes, &check);
    }
    return cfx_fifo_can_take_at(&l->conns[index], l->heads[index]);
}

/* Whether step @p s may run now (loads only). */
static inline CFX_HOST_DEVICE int cfx_steploop_ready(struct cfx_steploop *l,
                                                     const struct cfx_step *s)
{
    if (s->flags & CFX_PRIM_RECV) {
        if (!cfx_steploop_can_take(l, s->recv))
            return 0;
        for (int i = 0; i < s->n_recv_more; i++)
            if (!cfx_steploop_can_take(l, s->recv_more[i]))
                return 0;
    }
    if ((s->flags & CFX_PRIM_DRAIN) && !cfx_fifo_drained_at(&l->conns[s->send], l->tails[s->send]))
        return 0;
    if ((s->flags & CFX_PRIM_SEND) && !cfx_fifo_can_post_at(&l->conns[s->send], l->tails[s->send]))
        return 0;
    return 1;
}

/* The oldest slot of connector @p index, checked as the host's prims check
 * it; NULL (and l->status set) when it is not what the step expects. */
static inline CFX_HOST_DEVICE const char *cfx_steploop_take(struct cfx_steploop *l, int index,
                                                            uint64_t bytes)
{
    const struct cfx_work *w = l->work;
    struct cfx_conn *c = &l->conns[index];
    uint32_t number = (uint32_t)l->heads[index];
    if (cfx_steploop_ll(l, index)) {
        /* Its header is in (ready): size and check; the data words are
         * waited for as they are read. */
        uint32_t got_bytes = 0, check = 0;
        cfx_ll_can_take_at(c, l->heads[index], &got_bytes, &check);
        if (w->check_prints && check != cfx_ll_check(&w->expect, number))
            l->status = CFX_STEPLOOP_MISMATCH;
        else if (got_bytes != bytes)
            l->status = CFX_STEPLOOP_BAD_SIZE;
        if (l->status != CFX_STEPLOOP_RUNNING) {
            l->failed_conn = index;
            return 0;
        }
        return (const char *)(cfx_ll_slot(c, l->heads[index]) + CFX_LL_HEADER_WORDS);
    }
    size_t got;
    const struct cfx_fingerprint *print;
    const char *slot = cfx_fifo_take_slot_at(c, l->heads[index], &got, &print);
    if (w->check_prints) {
        struct cfx_fingerprint expect = w->expect;
        expect.slot = number;
        if (print->slot != number) {
            l->status = CFX_STEPLOOP_LOST_SLOT;
        } else if (print->seq != expect.seq || print->count != expect.count ||
                   print->root != expect.root || print->kind != expect.kind ||
                   print->type != expect.type || print->op != expect.op ||
                   print->valid != expect.valid) {
            l->status = CFX_STEPLOOP_MISMATCH;
        }
    }
    if (l->status == CFX_STEPLOOP_RUNNING && got != bytes)
        l->status = CFX_STEPLOOP_BAD_SIZE;
    if (l->status != CFX_STEPLOOP_RUNNING) {
        l->failed_conn = index;
        return 0;
    }
    return slot;
}

/* Plan ready step @p s (one thread): check and take its received slots,
 * reserve the slot it sends, and fill @p p. Returns 0, or a failure status
 * (also in l->status; nothing is then released or posted). */
static inline CFX_HOST_DEVICE int
cfx_steploop_plan(struct cfx_steploop *l, const struct cfx_step *s, struct cfx_steploop_plan *p)
{
    const struct cfx_work *w = l->work;
    uint32_t flags = s->flags;
    uint64_t n = s->n_elems, bytes = n * w->elem_bytes;
    p->copy_from = 0;
    p->copy_to = 0;
    p->n_operands = 0;
    p->avg = 0;
    p->out = 0;
    p->slot_out = 0;
    p->ll_in = 0;
    p->ll_out = 0;
    p->stop = l->stop;
    if (flags & (CFX_PRIM_PULL | CFX_PRIM_ADDR | CFX_PRIM_DRAIN)) {
        /* Single copy: slots carry addresses; the data is one byte copy
         * (none for a drain, whose readiness was all it waited for). */
        p->n = bytes;
        const char *value = s->input;
        if (flags & CFX_PRIM_RECV) {
            const char *slot = cfx_steploop_take(l, s->recv, sizeof(uint64_t));
            if (slot == 0)
                return l->status;
            uint64_t remote;
            memcpy(&remote, slot, sizeof(remote));
            value = (const char *)(uintptr_t)remote;
        }
        if ((flags & (CFX_PRIM_RECV | CFX_PRIM_OUT)) && bytes) {
            p->copy_from = value;
            p->copy_to = s->output;
        }
        l->copy_bytes += bytes;
        return 0;
    }
    p->n = n;
    const char *received = 0;
    const char *more[CFX_PRIM_MAX_RECV - 1];
    if (flags & CFX_PRIM_RECV) {
        received = cfx_steploop_take(l, s->recv, bytes);
        for (int i = 0; received && i < s->n_recv_more; i++)
            if ((more[i] = cfx_steploop_take(l, s->recv_more[i], bytes)) == 0)
                received = 0;
        if (received == 0)
            return l->status;
    }
    if ((flags & CFX_PRIM_SEND) && cfx_steploop_ll(l, s->send)) {
        p->slot_out =
            (char *)(cfx_ll_slot(&l->conns[s->send], l->tails[s->send]) + CFX_LL_HEADER_WORDS);
        p->ll_out = 1;
        p->ll_out_flag = cfx_ll_flag(l->tails[s->send]);
    } else if (flags & CFX_PRIM_SEND) {
        p->slot_out = cfx_fifo_post_slot_at(&l->conns[s->send], l->tails[s->send], bytes);
    }
    if (flags & CFX_PRIM_REDUCE) {
        /* Operands in order: recv, recv_more..., with the input at input_pos
         * when ORDERED, else second; folded left to right per element. */
        int input_pos = (flags & CFX_PRIM_ORDERED) ? s->input_pos : 1;
        for (int i = 0; i <= s->n_recv_more; i++) {
            if (i == input_pos)
                p->operands[p->n_operands++] = s->input;
            int from = i == 0 ? s->recv : s->recv_more[i - 1];
            if (cfx_steploop_ll(l, from)) {
                p->ll_in |= 1u << p->n_operands;
                p->ll_flag[p->n_operands] = cfx_ll_flag(l->heads[from]);
            }
            p->operands[p->n_operands++] = i == 0 ? received : more[i - 1];
        }
        if (input_pos == s->n_recv_more + 1)
            p->operands[p->n_operands++] = s->input;
        l->copy_bytes += bytes * (uint64_t)(p->n_operands - 1);
    } else {
        p->operands[0] = received ? received : s->input;
        p->n_operands = 1;
        if (received && cfx_steploop_ll(l, s->recv)) {
            p->ll_in = 1;
            p->ll_flag[0] = cfx_ll_flag(l->heads[s->recv]);
        }
    }
    if (flags & CFX_PRIM_OUT) {
        p->out = s->output;
        p->avg = (flags & CFX_PRIM_AVG) != 0;
    }
    if (p->out == p->operands[0] && p->n_operands == 1 && !p->avg && !p->ll_in)
        p->out = 0; /* In place: the output already holds the value. */
    l->copy_bytes += bytes;
    return 0;
}

/* Hand back the slot taken from connector @p index. */
static inline CFX_HOST_DEVICE void cfx_steploop_release(struct cfx_steploop *l, int index)
{
    cfx_fifo_release_at(&l->conns[index], l->heads[index]++);
}

/* Commit planned step @p s (one thread, after every thread's data): hand
 * back the received slots and post the sent one. */
static inline CFX_HOST_DEVICE void cfx_steploop_commit(struct cfx_steploop *l,
                                                       const struct cfx_step *s)
{
    const struct cfx_work *w = l->work;
    uint32_t flags = s->flags;
    uint64_t bytes = s->n_elems * w->elem_bytes;
    if (flags & (CFX_PRIM_PULL | CFX_PRIM_ADDR | CFX_PRIM_DRAIN)) {
        const char *value = s->input;
        if (flags & CFX_PRIM_RECV) {
            cfx_steploop_release(l, s->recv);
            value = s->output;
        }
        if (flags & CFX_PRIM_SEND) {
            struct cfx_conn *c = &l->conns[s->send];
            uint64_t addr = (uint64_t)(uintptr_t)value;
            memcpy(cfx_fifo_post_slot_at(c, l->tails[s->send], sizeof(addr)), &addr, sizeof(addr));
            cfx_fifo_post_at(c, l->tails[s->send]++, sizeof(addr), &w->print);
        }
        return;
    }
    if (flags & CFX_PRIM_RECV) {
        cfx_steploop_release(l, s->recv);
        for (int i = 0; i < s->n_recv_more; i++)
            cfx_steploop_release(l, s->recv_more[i]);
    }
    if ((flags & CFX_PRIM_SEND) && cfx_steploop_ll(l, s->send)) {
        /* The words carry their flags: no fence, no info line. The tail
         * only counts (its readers are the host's progress reports). */
        struct cfx_conn *c = &l->conns[s->send];
        cfx_ll_post_header(c, l->tails[s->send], bytes, &w->print);
        cfx_store_relaxed_u64(c->tail, ++l->tails[s->send]);
    } else if (flags & CFX_PRIM_SEND) {
        cfx_fifo_post_at(&l->conns[s->send], l->tails[s->send]++, bytes, &w->print);
    }
}

/* The step the loop is at, described (once per index). NULL when the loop
 * is over (done or failed). */
static inline CFX_HOST_DEVICE const struct cfx_step *cfx_steploop_current(struct cfx_steploop *l)
{
    if (l->status != CFX_STEPLOOP_RUNNING)
        return 0;
    if (l->step >= l->work->n_steps) {
        l->status = CFX_STEPLOOP_DONE;
        return 0;
    }
    if (l->described != l->step) {
        cfx_schedule_describe(l->work, l->step, &l->next);
        l->described = l->step;
    }
    return &l->next;
}

/* Runs every step that is ready, on this one thread; returns how many ran
 * (0: blocked, done or failed: see l->status). Never blocks. */
static inline CFX_HOST_DEVICE int cfx_steploop_progress(struct cfx_steploop *l)
{
    int ran = 0;
    const struct cfx_step *s;
    struct cfx_steploop_plan plan;
    while ((s = cfx_steploop_current(l)) != 0 && cfx_steploop_ready(l, s)) {
        if (cfx_steploop_plan(l, s, &plan) != 0)
            return ran;
        cfx_steploop_data(l->work, &plan, 0, 1);
        cfx_steploop_commit(l, s);
        l->step++;
        ran++;
    }
    cfx_steploop_current(l); /* Marks a finished loop DONE. */
    return ran;
}

#endif /* CFX_COLL_STEPLOOP_H */
