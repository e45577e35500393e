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
 * naming the peer. A step here is run by one thread, element by element;
 * the CUDA executor spreads a step's elements over the threads of a block.
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
}

/* dst[i] = a[i] (op) b[i] for n elements of the work's type. */
static inline CFX_HOST_DEVICE void cfx_steploop_reduce(char *dst, const char *a, const char *b,
                                                       uint64_t n, int type, int redop)
{
    switch (type) {
#define CFX_SL_TYPE(enumv, name, T)                                                                \
    case enumv: {                                                                                  \
        T *d = (T *)dst;                                                                           \
        const T *x = (const T *)a, *y = (const T *)b;                                              \
        for (uint64_t i = 0; i < n; i++) {                                                         \
            switch (redop) {                                                                       \
            case cfxProd: d[i] = cfx_prod_##name(x[i], y[i]); break;                               \
            case cfxMax: d[i] = cfx_max_##name(x[i], y[i]); break;                                 \
            case cfxMin: d[i] = cfx_min_##name(x[i], y[i]); break;                                 \
            default: d[i] = cfx_sum_##name(x[i], y[i]); break; /* Sum, Avg, PreMulSum. */          \
            }                                                                                      \
        }                                                                                          \
        break;                                                                                     \
    }
        CFX_REDUCE_FOR_EACH_TYPE(CFX_SL_TYPE)
#undef CFX_SL_TYPE
    default: break;
    }
}

/* The finish of cfxAvg (x / nranks) or of a PreMulSum (x * scalar), in place. */
static inline CFX_HOST_DEVICE void cfx_steploop_finish(const struct cfx_work *w, char *out,
                                                       uint64_t n)
{
    switch (w->type) {
#define CFX_SL_FINISH(enumv, name, T)                                                              \
    case enumv: {                                                                                  \
        T *d = (T *)out;                                                                           \
        T scalar;                                                                                  \
        memcpy(&scalar, &w->premul_bits, sizeof(T));                                               \
        for (uint64_t i = 0; i < n; i++)                                                           \
            d[i] = w->premul ? cfx_prod_##name(d[i], scalar)                                       \
                             : cfx_avg_finish_##name(d[i], w->nranks);                             \
        break;                                                                                     \
    }
        CFX_REDUCE_FOR_EACH_TYPE(CFX_SL_FINISH)
#undef CFX_SL_FINISH
    default: break;
    }
}

/* Whether step @p s may run now (loads only). */
static inline CFX_HOST_DEVICE int cfx_steploop_ready(struct cfx_steploop *l,
                                                     const struct cfx_step *s)
{
    if (s->flags & CFX_PRIM_RECV) {
        if (!cfx_fifo_can_take(&l->conns[s->recv]))
            return 0;
        for (int i = 0; i < s->n_recv_more; i++)
            if (!cfx_fifo_can_take(&l->conns[s->recv_more[i]]))
                return 0;
    }
    if ((s->flags & CFX_PRIM_SEND) && !cfx_fifo_can_post(&l->conns[s->send]))
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
    uint32_t number = cfx_fifo_next_number(c);
    size_t got;
    const struct cfx_fingerprint *print;
    const char *slot = cfx_fifo_take_slot(c, &got, &print);
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

/* Runs ready step @p s whole. Returns 0, or a failure status (also in l->status). */
static inline CFX_HOST_DEVICE int cfx_steploop_run(struct cfx_steploop *l, const struct cfx_step *s)
{
    const struct cfx_work *w = l->work;
    uint32_t flags = s->flags;
    uint64_t n = s->n_elems, bytes = n * w->elem_bytes;
    if (flags & (CFX_PRIM_PULL | CFX_PRIM_ADDR)) {
        /* Single copy: slots carry addresses. */
        const char *value = s->input;
        if (flags & CFX_PRIM_RECV) {
            const char *slot = cfx_steploop_take(l, s->recv, sizeof(uint64_t));
            if (slot == 0)
                return l->status;
            uint64_t remote;
            memcpy(&remote, slot, sizeof(remote));
            cfx_fifo_release(&l->conns[s->recv]);
            if (bytes)
                memcpy(s->output, (const char *)(uintptr_t)remote, bytes);
            l->copy_bytes += bytes;
            value = s->output;
        }
        if (flags & CFX_PRIM_SEND) {
            struct cfx_conn *c = &l->conns[s->send];
            uint64_t addr = (uint64_t)(uintptr_t)value;
            memcpy(cfx_fifo_post_slot(c, sizeof(addr)), &addr, sizeof(addr));
            cfx_fifo_post(c, sizeof(addr), &w->print);
        }
        if ((flags & CFX_PRIM_OUT) && s->output != value && bytes)
            memcpy(s->output, value, bytes);
        return 0;
    }
    const char *received = 0;
    const char *more[CFX_PRIM_MAX_RECV - 1];
    char *slot_out = 0;
    if (flags & CFX_PRIM_RECV) {
        received = cfx_steploop_take(l, s->recv, bytes);
        for (int i = 0; received && i < s->n_recv_more; i++)
            if ((more[i] = cfx_steploop_take(l, s->recv_more[i], bytes)) == 0)
                received = 0;
        if (received == 0)
            return l->status;
    }
    if (flags & CFX_PRIM_SEND)
        slot_out = cfx_fifo_post_slot(&l->conns[s->send], bytes);
    const char *value = received ? received : s->input;
    if (flags & CFX_PRIM_REDUCE) {
        char *sum = (flags & CFX_PRIM_OUT) ? s->output : slot_out;
        /* Operands in order: recv, recv_more..., with the input at input_pos
         * when ORDERED, else second. Folded left to right; a fold that would
         * overwrite the input before reading it (in place) reads it first
         * because the input is always among the first two operands there. */
        const char *operands[CFX_PRIM_MAX_RECV + 1];
        int n_operands = 0;
        int input_pos = (flags & CFX_PRIM_ORDERED) ? s->input_pos : 1;
        for (int i = 0; i <= s->n_recv_more; i++) {
            if (i == input_pos)
                operands[n_operands++] = s->input;
            operands[n_operands++] = i == 0 ? received : more[i - 1];
        }
        if (input_pos == s->n_recv_more + 1)
            operands[n_operands++] = s->input;
        if (n > 0 && sum == s->input && input_pos >= 2) {
            /* In place with the input late in the fold: element by element,
             * so each input element is read before it is written. */
            for (uint64_t e = 0; e < n; e++) {
                uint64_t at = e * w->elem_bytes;
                char acc[8];
                cfx_steploop_reduce(acc, operands[0] + at, operands[1] + at, 1, w->type, w->redop);
                for (int k = 2; k < n_operands; k++)
                    cfx_steploop_reduce(acc, acc, operands[k] + at, 1, w->type, w->redop);
                memcpy(sum + at, acc, w->elem_bytes);
            }
        } else if (n > 0) {
            cfx_steploop_reduce(sum, operands[0], operands[1], n, w->type, w->redop);
            for (int k = 2; k < n_operands; k++)
                cfx_steploop_reduce(sum, sum, operands[k], n, w->type, w->redop);
        }
        l->copy_bytes += bytes * (uint64_t)(n_operands - 1);
        value = sum;
    }
    if (flags & CFX_PRIM_OUT) {
        if (s->output != value && bytes)
            memcpy(s->output, value, bytes);
        if (flags & CFX_PRIM_AVG)
            cfx_steploop_finish(w, s->output, n);
        value = s->output;
    }
    if ((flags & CFX_PRIM_SEND) && value != slot_out && bytes)
        memcpy(slot_out, value, bytes);
    l->copy_bytes += bytes;
    if (flags & CFX_PRIM_RECV) {
        cfx_fifo_release(&l->conns[s->recv]);
        for (int i = 0; i < s->n_recv_more; i++)
            cfx_fifo_release(&l->conns[s->recv_more[i]]);
    }
    if (flags & CFX_PRIM_SEND)
        cfx_fifo_post(&l->conns[s->send], bytes, &w->print);
    return 0;
}

/* Runs every step that is ready; returns how many ran (0: blocked, done or
 * failed: see l->status). Never blocks. */
static inline CFX_HOST_DEVICE int cfx_steploop_progress(struct cfx_steploop *l)
{
    int ran = 0;
    while (l->status == CFX_STEPLOOP_RUNNING && l->step < l->work->n_steps) {
        if (l->described != l->step) {
            cfx_schedule_describe(l->work, l->step, &l->next);
            l->described = l->step;
        }
        if (!cfx_steploop_ready(l, &l->next))
            break;
        if (cfx_steploop_run(l, &l->next) != 0)
            return ran;
        l->step++;
        ran++;
    }
    if (l->status == CFX_STEPLOOP_RUNNING && l->step == l->work->n_steps)
        l->status = CFX_STEPLOOP_DONE;
    return ran;
}

#endif /* CFX_COLL_STEPLOOP_H */
