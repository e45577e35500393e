/*
 * The CUDA executor's kernel, as code both a GPU and a CPU compile: what
 * one launch carries (struct cfx_kernel_args, its one by-value parameter),
 * what its blocks report to the host (struct cfx_kernel_report, in
 * host-mapped memory), and how one block runs its operation
 * (cfx_kernel_lead / cfx_kernel_data / cfx_kernel_commit over
 * src/coll/steploop.h). kernel.cu wraps these in the __global__ function
 * the GPU runs; tests/fakecuda runs the very same functions on a CPU
 * thread, one block after another, so the kernel's logic (its steps,
 * failures, abort and poison checks, reports) is tested without a GPU.
 *
 * One launch runs the operations of a batch (a call or a group) on one
 * stream: each block runs a chain of them (args.block_first), one after
 * the other; operations that share a connector are in one chain. A
 * block's leader thread (thread 0) decides each step (cfx_kernel_lead:
 * ready? then plan it), every thread of the block moves its share of the
 * step's elements (cfx_kernel_data), and the leader commits it
 * (cfx_kernel_commit); the kernel synchronises the block between the
 * three. While a block waits it polls, every spin_check idle rounds, the
 * communicator's abort word and the closed words of the connectors it
 * waits on, so an abort, a timeout the host declares, or a peer's poison
 * ends it.
 *
 * A team: with args.team > 1 each chain runs on that many blocks. The
 * first (the leader) runs lead and commit as a lone block does and
 * publishes each planned step in the chain's struct cfx_kernel_team, in
 * device memory; the others (helpers) move their share of the step's data
 * and acknowledge it; the leader commits once all have. A step's data is
 * then split over team x CFX_KERNEL_THREADS threads, for steps big enough
 * that one block's bandwidth would bound them. Helpers never decide
 * anything: a failure, abort or timeout is the leader's, which then
 * publishes the end, as after the last op.
 *
 * The report: each operation owns a report slot of its communicator's
 * shared memory while it runs (launches of one communicator never overlap:
 * they are stream ordered), counts the steps it ran (heartbeat), says
 * which peer it waits for, and on its way out why it ended; a failure is
 * kept in the slot and sets the communicator's abort word. Plain stores at
 * system scope; the host reads them (exec/cuda/cuda.c).
 */
#ifndef CFX_EXEC_CUDA_KERNEL_H
#define CFX_EXEC_CUDA_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#include "src/coll/steploop.h"

#define CFX_KERNEL_NAME "cfx_kernel_batch"

/* What one launch can carry. A launch's one parameter comes in two sizes:
 * the narrow one stays within CUDA's classic 4 KiB (15 operations of 192
 * bytes, 14 views of 72 bytes: one direct allreduce of 8 ranks has 14), the wide one
 * within the 32764 bytes CUDA 12.1 allows on sm_70 and newer (64
 * operations, 256 views: an all-to-all of 32 ranks in one group), for
 * groups the narrow one cannot carry. Launching the narrow one keeps the
 * common launch's parameter copy small. Larger groups go far: the launch
 * passes a pointer to the same layout with room for 255 operations (and a
 * table of chains of its own) in the first communicator's pinned host
 * memory (struct cfx_kernel_far; its views stay 256, the most a byte's
 * first_view reaches). CFX_KERNEL_MAX_OPS bounds all three (a
 * communicator's report slots). */
#define CFX_KERNEL_NARROW_OPS   15
#define CFX_KERNEL_NARROW_VIEWS 14
#define CFX_KERNEL_WIDE_OPS     64
#define CFX_KERNEL_WIDE_VIEWS   256
#define CFX_KERNEL_FAR_OPS      255
#define CFX_KERNEL_FAR_VIEWS    256
#define CFX_KERNEL_MAX_OPS      CFX_KERNEL_FAR_OPS
#define CFX_KERNEL_WIDE_NAME    "cfx_kernel_batch_wide"
#define CFX_KERNEL_FAR_NAME     "cfx_kernel_batch_far"
/* Threads per block the executor launches (the CPU runs one). */
#define CFX_KERNEL_THREADS 512
/* Idle rounds between a waiting block's checks of the abort and closed
 * words (each a load from host memory). */
#define CFX_KERNEL_SPIN_CHECK 4096

/* How a block ended (report.end_status); 0 while it runs. */
enum cfx_kernel_end {
    CFX_KERNEL_END_NONE = 0,
    CFX_KERNEL_END_DONE = 1,
    CFX_KERNEL_END_MISMATCH = 2,  /* CFX_STEPLOOP_MISMATCH. */
    CFX_KERNEL_END_LOST_SLOT = 3, /* CFX_STEPLOOP_LOST_SLOT. */
    CFX_KERNEL_END_BAD_SIZE = 4,  /* CFX_STEPLOOP_BAD_SIZE. */
    CFX_KERNEL_END_CLOSED = 5,    /* A connector it waited on was closed (detail: its word). */
    CFX_KERNEL_END_ABORTED = 6,   /* The abort word was set (detail: its value). */
};
CFX_STATIC_ASSERT((int)CFX_KERNEL_END_MISMATCH == (int)CFX_STEPLOOP_MISMATCH &&
                      (int)CFX_KERNEL_END_LOST_SLOT == (int)CFX_STEPLOOP_LOST_SLOT &&
                      (int)CFX_KERNEL_END_BAD_SIZE == (int)CFX_STEPLOOP_BAD_SIZE,
                  "a step loop's failure is its block's end");

/* Values of the abort word (nonzero stops every block that reads it). */
enum cfx_kernel_abort {
    CFX_KERNEL_ABORT_NONE = 0,
    CFX_KERNEL_ABORT_USER = 1,    /* cfxCommAbort (or a revoke). */
    CFX_KERNEL_ABORT_TIMEOUT = 2, /* The host saw no progress for the timeout. */
    CFX_KERNEL_ABORT_FAILED = 3,  /* A block of the communicator failed (set by the kernel). */
    CFX_KERNEL_ABORT_BROKEN = 4,  /* The host learnt of a failure elsewhere (a poisoned peer). */
};

/* How one block ended, kept: the first failure of a slot is never
 * overwritten (later launches of a broken communicator end ABORTED). */
struct cfx_kernel_failure {
    int32_t status; /* enum cfx_kernel_end, 0 while none. */
    int32_t detail; /* The closed or abort word. */
    int32_t peer;   /* The peer it came through, or -1. */
    int32_t reserved;
    uint64_t step;                /* The step it failed at. */
    struct cfx_fingerprint print; /* The op's. */
};

/* One block's report (host-mapped, three cache lines: what changes while it
 * runs, what it runs, how it failed). */
struct cfx_kernel_report {
    CFX_ALIGNAS(CFX_CACHE_LINE) uint64_t begun; /* Blocks started in this slot. */
    uint64_t ended;                             /* Blocks finished in this slot. */
    uint64_t heartbeat;                         /* Steps run, all launches. */
    uint64_t step;                              /* The step it is at (while waiting). */
    int32_t waiting_peer;                       /* The peer it waits on, or -1. */
    int32_t end_status;                         /* enum cfx_kernel_end of the last block. */
    /* What the FIFO it waits on looked like at its last check (the host's
     * timeout sentence says it): the consumer's head, the producer's tail,
     * and the seq word of the slot the wait is about (recv: the next slot
     * to take, which the producer stamps head + 1; send: the slot to fill). */
    uint64_t seen_head;
    uint64_t seen_tail;
    uint32_t seen_seq;
    int32_t seen_send; /* 1: it waits to send (for a free slot); 0: to receive. */
    CFX_ALIGNAS(CFX_CACHE_LINE) struct cfx_fingerprint running; /* The op it runs. */
    /* Where the wait noted above looks (the FIFO's tail word), and the tail
     * word it posts to and its own count there: while it waits, those of
     * the step's send (if any); once an op ends, those it last posted to.
     * So a lost slot can be traced across ranks of one process. */
    uint64_t wait_tail_at;
    uint64_t posted_tail_at;
    uint64_t posted_tail;
    CFX_ALIGNAS(CFX_CACHE_LINE) struct cfx_kernel_failure failure;
};
CFX_STATIC_ASSERT(sizeof(struct cfx_kernel_report) == 3 * CFX_CACHE_LINE, "three lines per block");

/* What the kernels of one communicator share with the host (host-mapped
 * memory, one block per communicator): its abort word, where its teams
 * meet, and a report slot per chain of a launch. */
struct cfx_kernel_comm {
    CFX_ALIGNAS(CFX_CACHE_LINE)
    int32_t abort_word; /* Nonzero stops every block (enum cfx_kernel_abort). */
    int32_t reserved;
    /* Device address of CFX_KERNEL_MAX_OPS struct cfx_kernel_team, one per
     * report slot (a chain meets at its first op's), zero between launches. */
    uint64_t teams;
    struct cfx_kernel_report reports[CFX_KERNEL_MAX_OPS];
};

/* One operation of a launch: its work, its communicator's shared memory and
 * its report slot there, and where its views start. */
struct cfx_kernel_op {
    struct cfx_work work;
    struct cfx_kernel_comm *comm; /* Host-mapped. */
    uint8_t slot;                 /* Its report: comm->reports[slot]. */
    uint8_t first_view;           /* Its peer table: views[first_view .. + work.n_conns). */
    uint8_t reserved[6];
};

/* The head of the kernel's one parameter, by value: the operations follow
 * it (cap_ops of them), then the views (cfx_kernel_args_ops/_views).
 * Operations of several communicators (ranks a thread drives in one group)
 * may share a launch. */
struct cfx_kernel_args {
    uint32_t abi; /* CFX_KERNEL_ABI: a kernel built from another kernel.h refuses it. */
    uint32_t spin_check;
    uint16_t n_views;
    uint8_t n_ops;
    uint8_t n_blocks; /* Chains: the grid is n_blocks x team blocks. */
    uint8_t cap_ops;  /* Room for operations: CFX_KERNEL_NARROW_OPS, _WIDE_OPS or _FAR_OPS. */
    uint8_t team;     /* Blocks per chain (0 or 1: each chain alone). */
    /* Block b runs ops[block_first[b] .. block_first[b + 1]) one after the
     * other: operations that share a connector go in one block, in call
     * order (two blocks posting to one FIFO would mix their slots). A far
     * launch keeps its (longer) table after its views instead
     * (cfx_kernel_block_firsts). */
    uint8_t block_first[CFX_KERNEL_WIDE_OPS + 1];
    uint8_t pad[1];
};

/* The two parameters a launch passes ("cfx_kernel_batch" takes the narrow
 * one, CFX_KERNEL_WIDE_NAME the wide one). */
struct cfx_kernel_narrow {
    struct cfx_kernel_args head;
    struct cfx_kernel_op ops[CFX_KERNEL_NARROW_OPS];
    struct cfx_conn views[CFX_KERNEL_NARROW_VIEWS];
};
struct cfx_kernel_wide {
    struct cfx_kernel_args head;
    struct cfx_kernel_op ops[CFX_KERNEL_WIDE_OPS];
    struct cfx_conn views[CFX_KERNEL_WIDE_VIEWS];
};
/* A far launch's arguments, in memory the device reads (the launch's
 * parameter is their address). */
struct cfx_kernel_far {
    struct cfx_kernel_args head;
    struct cfx_kernel_op ops[CFX_KERNEL_FAR_OPS];
    struct cfx_conn views[CFX_KERNEL_FAR_VIEWS];
    uint8_t block_first[CFX_KERNEL_FAR_OPS + 1];
};
CFX_STATIC_ASSERT(sizeof(struct cfx_kernel_narrow) <= 4096, "the narrow launch fits 4 KiB");
CFX_STATIC_ASSERT(sizeof(struct cfx_kernel_wide) <= 32764, "the wide launch fits 32764 bytes");
CFX_STATIC_ASSERT(offsetof(struct cfx_kernel_narrow, ops) == sizeof(struct cfx_kernel_args) &&
                      offsetof(struct cfx_kernel_wide, ops) == sizeof(struct cfx_kernel_args),
                  "the operations follow the head");
CFX_STATIC_ASSERT(offsetof(struct cfx_kernel_narrow, views) ==
                          sizeof(struct cfx_kernel_args) +
                              CFX_KERNEL_NARROW_OPS * sizeof(struct cfx_kernel_op) &&
                      offsetof(struct cfx_kernel_wide, views) ==
                          sizeof(struct cfx_kernel_args) +
                              CFX_KERNEL_WIDE_OPS * sizeof(struct cfx_kernel_op),
                  "the views follow cap_ops operations");
CFX_STATIC_ASSERT(offsetof(struct cfx_kernel_far, ops) == sizeof(struct cfx_kernel_args) &&
                      offsetof(struct cfx_kernel_far, views) ==
                          sizeof(struct cfx_kernel_args) +
                              CFX_KERNEL_FAR_OPS * sizeof(struct cfx_kernel_op) &&
                      offsetof(struct cfx_kernel_far, block_first) ==
                          offsetof(struct cfx_kernel_far, views) +
                              CFX_KERNEL_FAR_VIEWS * sizeof(struct cfx_conn),
                  "a far launch: the head, cap_ops operations, the views, the chains");
CFX_STATIC_ASSERT(CFX_KERNEL_FAR_VIEWS <= 256 && CFX_KERNEL_FAR_OPS < 256 &&
                      CFX_KERNEL_WIDE_VIEWS <= 256,
                  "first_view, slot, n_ops, n_blocks and block_first are bytes");

/* A launch's operations and views (they follow its head). */
static inline CFX_HOST_DEVICE struct cfx_kernel_op *
cfx_kernel_args_ops(const struct cfx_kernel_args *a)
{
    return (struct cfx_kernel_op *)(uintptr_t)(a + 1);
}
static inline CFX_HOST_DEVICE struct cfx_conn *
cfx_kernel_args_views(const struct cfx_kernel_args *a)
{
    return (struct cfx_conn *)(uintptr_t)(cfx_kernel_args_ops(a) + a->cap_ops);
}

/* Block b's chain of operations starts at cfx_kernel_block_firsts(a)[b]
 * (and ends where b + 1's starts). */
static inline CFX_HOST_DEVICE const uint8_t *
cfx_kernel_block_firsts(const struct cfx_kernel_args *a)
{
    if (a->cap_ops == CFX_KERNEL_FAR_OPS)
        return (const uint8_t *)(cfx_kernel_args_views(a) + CFX_KERNEL_FAR_VIEWS);
    return a->block_first;
}

/* The parameter's layout, as a number: its version and the narrow size. */
#define CFX_KERNEL_ABI ((uint32_t)(9u << 16) | (uint32_t)sizeof(struct cfx_kernel_narrow))

/* What the leader decided (cfx_kernel_lead). */
enum cfx_kernel_action {
    CFX_KERNEL_IDLE = 0,     /* Nothing ready: lead again. */
    CFX_KERNEL_STEP = 1,     /* A step is planned: data, then commit. */
    CFX_KERNEL_FINISHED = 2, /* The block is over (its report says how). */
};

/* Where a chain's blocks meet (device memory; see "A team" above). The
 * leader publishes an item (a step, or the end) only once every helper
 * acknowledged the one before, so a helper is never more than one behind. */
struct cfx_kernel_team {
    CFX_ALIGNAS(CFX_CACHE_LINE) uint32_t gen;         /* Items published. */
    uint32_t kind;                                    /* The last: CFX_KERNEL_STEP or _FINISHED. */
    CFX_ALIGNAS(CFX_CACHE_LINE) uint32_t acks;        /* Items finished, summed over the helpers. */
    CFX_ALIGNAS(CFX_CACHE_LINE) struct cfx_work work; /* The step's op (its scalar read in). */
    struct cfx_steploop_plan plan;
};

/* A block's state: __shared__ on the GPU, zeroed memory on the CPU. */
struct cfx_kernel_block {
    struct cfx_work work; /* The op's, with a device scalar read in (PreMulSum). */
    struct cfx_steploop loop;
    struct cfx_steploop_plan plan;
    const struct cfx_step *step; /* The planned step. */
    struct cfx_conn conns[CFX_OP_MAX_CONNS];
    uint64_t idle;
    int started;       /* The block has begun (op is set). */
    int op;            /* The op it runs: an index into args.ops. */
    int op_started;    /* That op has begun. */
    int last_send;     /* The connector its op last posted to (reported at its end), or -1. */
    uint64_t beats;    /* Its op's report's heartbeat (only this block writes it). */
    int team_joined;   /* cfx_kernel_team_join ran. */
    int team_wait;     /* Leader (fakecuda): the item whose acks it awaits, or 0. */
    uint32_t team_gen; /* Leader: items published; helper: items taken. */
    struct cfx_kernel_team *team; /* Its chain's, when args.team > 1. */
};

static inline CFX_HOST_DEVICE void cfx_kernel_store_i32(int32_t *p, int32_t v)
{
    cfx_store_relaxed_u32((uint32_t *)p, (uint32_t)v);
}

/* End the block with @p end. A failure is kept in the slot's failure
 * record (when it holds none) and stops the communicator's other blocks. */
static inline CFX_HOST_DEVICE void cfx_kernel_end(struct cfx_kernel_block *b,
                                                  const struct cfx_kernel_op *op, int32_t end,
                                                  int32_t detail, int32_t peer)
{
    struct cfx_kernel_report *r = &op->comm->reports[op->slot];
    if (end != CFX_KERNEL_END_DONE && cfx_load_relaxed_u32((uint32_t *)&r->failure.status) == 0) {
        r->failure.detail = detail;
        r->failure.peer = peer;
        r->failure.step = b->loop.step;
        r->failure.print = op->work.print;
        cfx_store_release_u32((uint32_t *)&r->failure.status, (uint32_t)end);
    }
    if (end != CFX_KERNEL_END_DONE && end != CFX_KERNEL_END_ABORTED)
        cfx_store_release_u32((uint32_t *)&op->comm->abort_word, CFX_KERNEL_ABORT_FAILED);
    if (b->last_send >= 0) { /* Once per op, not per step: these are host-mapped. */
        const struct cfx_conn *c = &b->conns[b->last_send];
        cfx_store_relaxed_u64(&r->posted_tail_at, (uint64_t)(uintptr_t)c->tail);
        cfx_store_relaxed_u64(&r->posted_tail, cfx_load_relaxed_u64(c->tail));
    }
    cfx_kernel_store_i32(&r->waiting_peer, -1);
    cfx_kernel_store_i32(&r->end_status, end);
    cfx_store_release_u64(&r->ended, cfx_load_relaxed_u64(&r->ended) + 1);
}

/* The abort word of @p op's communicator (acquire). */
static inline CFX_HOST_DEVICE int32_t cfx_kernel_aborted(const struct cfx_kernel_op *op)
{
    return (int32_t)cfx_load_acquire_u32((const uint32_t *)&op->comm->abort_word);
}

/* The connectors step @p s waits on, checked for a closed one: the closed
 * value (and *peer_p) of the first, or 0. */
static inline CFX_HOST_DEVICE int32_t cfx_kernel_closed(struct cfx_kernel_block *b,
                                                        const struct cfx_step *s, int32_t *peer_p)
{
    int8_t waits[CFX_PRIM_MAX_RECV + 1];
    int n = 0;
    if (s->flags & CFX_PRIM_RECV) {
        waits[n++] = s->recv;
        for (int i = 0; i < s->n_recv_more; i++)
            waits[n++] = s->recv_more[i];
    }
    if (s->flags & CFX_PRIM_SEND)
        waits[n++] = s->send;
    for (int i = 0; i < n; i++) {
        int32_t why = cfx_fifo_closed(&b->conns[waits[i]]);
        if (why != 0) {
            *peer_p = b->conns[waits[i]].peer;
            return why;
        }
    }
    return 0;
}

/* The connector step @p s waits on first (an index into b->conns, or -1),
 * and whether it waits to send there. */
static inline CFX_HOST_DEVICE int cfx_kernel_waiting_conn(struct cfx_kernel_block *b,
                                                          const struct cfx_step *s, int *send_p)
{
    *send_p = 0;
    if ((s->flags & CFX_PRIM_RECV) && !cfx_fifo_can_take(&b->conns[s->recv]))
        return s->recv;
    for (int i = 0; (s->flags & CFX_PRIM_RECV) && i < s->n_recv_more; i++)
        if (!cfx_fifo_can_take(&b->conns[s->recv_more[i]]))
            return s->recv_more[i];
    *send_p = 1;
    return (s->flags & CFX_PRIM_SEND) ? s->send : -1;
}

/* Note in @p r what step @p s waits for: the peer, and its FIFO's state. */
static inline CFX_HOST_DEVICE void cfx_kernel_note_wait(struct cfx_kernel_block *b,
                                                        const struct cfx_step *s,
                                                        struct cfx_kernel_report *r)
{
    int send = 0;
    int at = cfx_kernel_waiting_conn(b, s, &send);
    if (at < 0) {
        cfx_kernel_store_i32(&r->waiting_peer, -1);
        return;
    }
    const struct cfx_conn *c = &b->conns[at];
    uint64_t head = cfx_load_acquire_u64(c->head), tail = cfx_load_acquire_u64(c->tail);
    uint64_t slot = send ? tail : head;
    cfx_store_relaxed_u64(&r->seen_head, head);
    cfx_store_relaxed_u64(&r->seen_tail, tail);
    cfx_store_relaxed_u64(&r->wait_tail_at, (uint64_t)(uintptr_t)c->tail);
    cfx_store_relaxed_u32(&r->seen_seq,
                          cfx_load_acquire_u32(&c->info[slot % (uint64_t)c->n_steps].seq));
    cfx_kernel_store_i32(&r->seen_send, send);
    cfx_kernel_store_i32(&r->waiting_peer, c->peer);
    if (s->flags & CFX_PRIM_SEND) {
        cfx_store_relaxed_u64(&r->posted_tail_at, (uint64_t)(uintptr_t)b->conns[s->send].tail);
        cfx_store_relaxed_u64(&r->posted_tail, b->loop.tails[s->send]);
    }
}

/* Start block @p b's current op: its views, its step loop, its report. 0,
 * or CFX_KERNEL_FINISHED-worthy when the communicator was stopped (the op
 * ends ABORTED). */
static inline CFX_HOST_DEVICE int cfx_kernel_op_start(struct cfx_kernel_block *b,
                                                      const struct cfx_kernel_args *a)
{
    const struct cfx_kernel_op *op = &cfx_kernel_args_ops(a)[b->op];
    struct cfx_kernel_report *r = &op->comm->reports[op->slot];
    const struct cfx_conn *views = cfx_kernel_args_views(a);
    b->op_started = 1;
    for (int i = 0; i < op->work.n_conns; i++)
        b->conns[i] = views[op->first_view + i];
    b->work = op->work;
    if (b->work.premul == CFX_PREMUL_DEVICE) {
        /* cfxScalarDevice: the scalar as it is when the operation runs. */
        const char *scalar = (const char *)(uintptr_t)op->work.premul_bits;
        b->work.premul_bits = 0;
        memcpy(&b->work.premul_bits, scalar, op->work.elem_bytes);
        b->work.premul = CFX_PREMUL_HOST;
    }
    cfx_steploop_init(&b->loop, &b->work, b->conns);
    /* LL: a thread waiting for data words gives up when the abort word is set. */
    b->loop.stop = &op->comm->abort_word;
    b->idle = 0;
    b->last_send = -1;
    r->running = op->work.print;
    b->beats = cfx_load_relaxed_u64(&r->heartbeat);
    cfx_kernel_store_i32(&r->end_status, CFX_KERNEL_END_NONE);
    cfx_store_release_u64(&r->begun, cfx_load_relaxed_u64(&r->begun) + 1);
    int32_t aborted = cfx_kernel_aborted(op);
    if (aborted != 0) { /* A broken communicator runs nothing more. */
        cfx_kernel_end(b, op, CFX_KERNEL_END_ABORTED, aborted, -1);
        return 1;
    }
    return 0;
}

/* Leader of block @p block: start its ops in turn, and decide each op's
 * next step. Never blocks. */
static inline CFX_HOST_DEVICE int cfx_kernel_lead(struct cfx_kernel_block *b,
                                                  const struct cfx_kernel_args *a, unsigned block)
{
    if (!b->started) {
        b->started = 1;
        b->op = cfx_kernel_block_firsts(a)[block];
        b->op_started = 0;
    }
    for (;;) {
        if (b->op >= cfx_kernel_block_firsts(a)[block + 1])
            return CFX_KERNEL_FINISHED;
        const struct cfx_kernel_op *op = &cfx_kernel_args_ops(a)[b->op];
        if (!b->op_started && cfx_kernel_op_start(b, a)) {
            b->op++; /* Ended ABORTED: the next one ends the same way. */
            b->op_started = 0;
            continue;
        }
        struct cfx_kernel_report *r = &op->comm->reports[op->slot];
        const struct cfx_step *s = cfx_steploop_current(&b->loop);
        if (s != 0 && cfx_steploop_ready(&b->loop, s)) {
            b->idle = 0;
            if (cfx_steploop_plan(&b->loop, s, &b->plan) == 0) {
                b->step = s;
                return CFX_KERNEL_STEP;
            }
            s = 0; /* The plan failed: the loop's status says why. */
        }
        if (s == 0) {
            const struct cfx_steploop *l = &b->loop;
            if (l->status == CFX_STEPLOOP_DONE) {
                cfx_kernel_end(b, op, CFX_KERNEL_END_DONE, 0, -1);
            } else {
                int32_t peer = l->failed_conn >= 0 ? b->conns[l->failed_conn].peer : -1;
                cfx_kernel_end(b, op, l->status, 0, peer);
            }
            b->op++;
            b->op_started = 0;
            continue;
        }
        if (++b->idle % (a->spin_check ? a->spin_check : CFX_KERNEL_SPIN_CHECK) == 0) {
            cfx_store_relaxed_u64(&r->step, b->loop.step);
            cfx_kernel_note_wait(b, s, r);
            int32_t aborted = cfx_kernel_aborted(op);
            int32_t peer = -1;
            int32_t closed = aborted ? 0 : cfx_kernel_closed(b, s, &peer);
            if (aborted != 0 || closed != 0) {
                if (aborted != 0)
                    cfx_kernel_end(b, op, CFX_KERNEL_END_ABORTED, aborted, -1);
                else
                    cfx_kernel_end(b, op, CFX_KERNEL_END_CLOSED, closed, peer);
                b->op++;
                b->op_started = 0;
                continue;
            }
        }
        return CFX_KERNEL_IDLE;
    }
}

/* Every thread of the block (of the team): its share of the planned step;
 * @p tid is the thread's place among the @p nthreads of the team. */
static inline CFX_HOST_DEVICE void cfx_kernel_data(struct cfx_kernel_block *b, unsigned tid,
                                                   unsigned nthreads)
{
    cfx_steploop_data(&b->work, &b->plan, tid, nthreads);
}

/* ------------------------------------------------------------------ teams */

static inline CFX_HOST_DEVICE unsigned cfx_kernel_team_size(const struct cfx_kernel_args *a)
{
    return a->team > 1 ? a->team : 1;
}

/* Thread 0 of every block, first: its chain's team (none when alone). */
static inline CFX_HOST_DEVICE void
cfx_kernel_team_join(struct cfx_kernel_block *b, const struct cfx_kernel_args *a, unsigned chain)
{
    b->team_joined = 1;
    b->team_wait = 0;
    b->team_gen = 0;
    b->team = 0;
    if (cfx_kernel_team_size(a) > 1) {
        const struct cfx_kernel_op *first =
            &cfx_kernel_args_ops(a)[cfx_kernel_block_firsts(a)[chain]];
        uint64_t teams = cfx_load_relaxed_u64(&first->comm->teams);
        b->team = (struct cfx_kernel_team *)(uintptr_t)teams + first->slot;
    }
}

/* Leader: publish a planned step (its plan and op) or the end
 * (CFX_KERNEL_FINISHED) to the helpers. */
static inline CFX_HOST_DEVICE void cfx_kernel_team_publish(struct cfx_kernel_block *b,
                                                           uint32_t kind)
{
    struct cfx_kernel_team *t = b->team;
    if (kind == CFX_KERNEL_STEP) {
        t->work = b->work;
        t->plan = b->plan;
    }
    t->kind = kind;
    cfx_store_release_u32(&t->gen, ++b->team_gen);
}

/* Leader: whether every helper finished every item published. */
static inline CFX_HOST_DEVICE int cfx_kernel_team_acked(const struct cfx_kernel_block *b,
                                                        unsigned team)
{
    return cfx_load_acquire_u32(&b->team->acks) == b->team_gen * (team - 1);
}

/* Leader, waiting for every helper's acknowledgement of the item of @p kind
 * it published last: 1 once all came; 0 to wait on; -1 when the
 * communicator was stopped meanwhile (checked every spin_check rounds: an
 * abort, or a timeout while a helper never got an SM): a step's op then
 * ends ABORTED and the team is told the end, and the leader ends its block
 * without clearing the team (a stopped communicator runs nothing more). */
static inline CFX_HOST_DEVICE int cfx_kernel_team_wait(struct cfx_kernel_block *b,
                                                       const struct cfx_kernel_args *a,
                                                       unsigned chain, unsigned team, int kind)
{
    if (cfx_kernel_team_acked(b, team))
        return 1;
    if (++b->idle % (a->spin_check ? a->spin_check : CFX_KERNEL_SPIN_CHECK) != 0)
        return 0;
    const struct cfx_kernel_op *op = &cfx_kernel_args_ops(
        a)[kind == CFX_KERNEL_STEP ? b->op : cfx_kernel_block_firsts(a)[chain + 1] - 1];
    int32_t aborted = cfx_kernel_aborted(op);
    if (aborted == 0)
        return 0;
    if (kind == CFX_KERNEL_STEP) {
        cfx_kernel_end(b, op, CFX_KERNEL_END_ABORTED, aborted, -1);
        cfx_kernel_team_publish(b, CFX_KERNEL_FINISHED);
    }
    return -1;
}

/* Leader, once the end is acknowledged: the team as the next launch finds
 * it (stream order makes these stores visible to it). */
static inline CFX_HOST_DEVICE void cfx_kernel_team_clear(struct cfx_kernel_block *b)
{
    cfx_store_relaxed_u32(&b->team->gen, 0);
    cfx_store_relaxed_u32(&b->team->acks, 0);
}

/* Helper: the next item (CFX_KERNEL_STEP: its plan and op now in @p b;
 * CFX_KERNEL_FINISHED), or CFX_KERNEL_IDLE while there is none. */
static inline CFX_HOST_DEVICE int cfx_kernel_team_next(struct cfx_kernel_block *b)
{
    struct cfx_kernel_team *t = b->team;
    if (cfx_load_acquire_u32(&t->gen) == b->team_gen)
        return CFX_KERNEL_IDLE;
    b->team_gen++;
    if (t->kind == CFX_KERNEL_FINISHED)
        return CFX_KERNEL_FINISHED;
    b->work = t->work;
    b->plan = t->plan;
    return CFX_KERNEL_STEP;
}

/* Helper, after its share of an item (on a GPU: its block synchronised and
 * its stores fenced at system scope): acknowledge it. */
static inline CFX_HOST_DEVICE void cfx_kernel_team_ack(struct cfx_kernel_block *b)
{
    cfx_fetch_add_u32(&b->team->acks, 1);
}

/* Leader, after every thread's data: publish the step. On a GPU the caller
 * has synchronised the block and fenced its stores at system scope. */
static inline CFX_HOST_DEVICE void
cfx_kernel_commit(struct cfx_kernel_block *b, const struct cfx_kernel_args *a, unsigned block)
{
    (void)block;
    cfx_steploop_commit(&b->loop, b->step);
    b->loop.step++;
    const struct cfx_kernel_op *op = &cfx_kernel_args_ops(a)[b->op];
    struct cfx_kernel_report *r = &op->comm->reports[op->slot];
    if (b->step->flags & CFX_PRIM_SEND)
        b->last_send = b->step->send;
    cfx_store_relaxed_u64(&r->heartbeat, ++b->beats);
}

#endif /* CFX_EXEC_CUDA_KERNEL_H */
