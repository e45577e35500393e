/*
 * Every schedule, registered in one place, and the dispatch by id that the
 * host executor and a kernel share.
 *
 * A schedule is two functions of a work descriptor (work.h), compiled for
 * the host and for the device (CFX_HOST_DEVICE, defined in its own header):
 *   uint64_t cfx_<name>_steps(const struct cfx_work *w);
 *   void cfx_<name>_describe(const struct cfx_work *w, uint64_t i, struct cfx_step *s);
 * Every rank derives the same sequence of steps from the same arguments;
 * describe writes only the fields of step i it sets (the caller resets the
 * step first: cfx_step_reset).
 *
 * Adding an algorithm: its own header (src/coll/<name>.h, with the two
 * functions), then one line in the #include list and one in
 * CFX_SCHEDULES below. Nothing else in src/coll or src/exec changes. (The
 * core still decides when to use it and which connectors it needs.)
 */
#ifndef CFX_COLL_SCHEDULES_H
#define CFX_COLL_SCHEDULES_H

#include "src/coll/work.h"

#include "src/coll/chain.h"
#include "src/coll/direct.h"
#include "src/coll/p2p.h"
#include "src/coll/pull.h"
#include "src/coll/ring.h"
#include "src/coll/tree.h"
#include "src/coll/twoshot.h"

/* X(ID, name): the schedule cfx_<name>_steps/_describe as CFX_SCHED_<ID>. */
#define CFX_SCHEDULES(X)                                                                           \
    X(LOCAL_COPY, local_copy) /* One rank: output = input. */                                      \
    X(RING_ALLREDUCE, ring_allreduce)                                                              \
    X(RING_ALLGATHER, ring_allgather)                                                              \
    X(RING_REDUCESCATTER, ring_reducescatter)                                                      \
    X(CHAIN_BROADCAST, chain_broadcast)                                                            \
    X(CHAIN_REDUCE, chain_reduce)                                                                  \
    X(TREE, tree)                           /* Allreduce, broadcast, reduce. */                    \
    X(DIRECT_ALLREDUCE, direct_allreduce)   /* One shot, all pairs. */                             \
    X(TWOSHOT_ALLREDUCE, twoshot_allreduce) /* Reduce-scatter, allgather: all pairs. */            \
    X(PULL_ALLGATHER, pull_allgather)       /* Single copy: slots carry addresses. */              \
    X(P2P_SEND, p2p_send)                                                                          \
    X(P2P_RECV, p2p_recv)                                                                          \
    X(PULL_SEND, pull_send) /* Single copy: the receiver reads the sender's buffer. */             \
    X(PULL_RECV, pull_recv)                                                                        \
    X(REF_SEND, ref_send) /* From a registered buffer: the transport reads it. */

enum cfx_sched {
#define CFX_SCHED_ENUM(id, name) CFX_SCHED_##id,
    CFX_SCHEDULES(CFX_SCHED_ENUM)
#undef CFX_SCHED_ENUM
        CFX_SCHED_COUNT
};

/* Steps of @p w's schedule (0 for an unknown id). */
static inline CFX_HOST_DEVICE uint64_t cfx_schedule_steps(const struct cfx_work *w)
{
    switch (w->algo) {
#define CFX_SCHED_STEPS(id, name)                                                                  \
    case CFX_SCHED_##id: return cfx_##name##_steps(w);
        CFX_SCHEDULES(CFX_SCHED_STEPS)
#undef CFX_SCHED_STEPS
    }
    return 0;
}

/* Step @p index of @p w's schedule into @p step (reset first). */
static inline CFX_HOST_DEVICE void cfx_schedule_describe(const struct cfx_work *w, uint64_t index,
                                                         struct cfx_step *step)
{
    cfx_step_reset(w, step);
    switch (w->algo) {
#define CFX_SCHED_DESCRIBE(id, name)                                                               \
    case CFX_SCHED_##id: cfx_##name##_describe(w, index, step); return;
        CFX_SCHEDULES(CFX_SCHED_DESCRIBE)
#undef CFX_SCHED_DESCRIBE
    }
}

/* Name for logs and tests: "ring_allreduce", ... */
static inline const char *cfx_schedule_name(int algo)
{
    switch (algo) {
#define CFX_SCHED_NAME(id, name)                                                                   \
    case CFX_SCHED_##id: return #name;
        CFX_SCHEDULES(CFX_SCHED_NAME)
#undef CFX_SCHED_NAME
    }
    return "?";
}

/*
 * Finish a work descriptor whose shape and links are set: elements per
 * chunk from the connectors' @p slot_bytes (an LL slot's data at most, for
 * LL), and the number of steps. With
 * mismatch checks on, even an empty operation (not on one rank) trades one
 * round of empty slots, so a rank that called something else is caught.
 */
static inline CFX_HOST_DEVICE void cfx_work_finish(struct cfx_work *w, uint64_t slot_bytes)
{
    if (w->pitch == 0)
        w->pitch = w->count; /* Blocks side by side. */
    /* The data does not go through the slots. */
    if (w->algo == CFX_SCHED_PULL_ALLGATHER)
        slot_bytes = CFX_PULL_CHUNK_BYTES;
    if (w->algo == CFX_SCHED_PULL_SEND || w->algo == CFX_SCHED_PULL_RECV)
        slot_bytes = CFX_PULL_P2P_CHUNK_BYTES;
    else if (w->proto == CFX_WORK_PROTO_LL && slot_bytes > CFX_LL_DATA_BYTES)
        slot_bytes = CFX_LL_DATA_BYTES;
    w->chunk_elems = w->elem_bytes ? slot_bytes / w->elem_bytes : 0;
    if (w->chunk_elems == 0)
        w->chunk_elems = 1;
    w->n_steps = cfx_schedule_steps(w);
    if (w->n_steps == 0 && w->check_prints && w->algo != CFX_SCHED_LOCAL_COPY) {
        uint64_t saved = w->count;
        w->count = 1;
        w->n_steps = cfx_schedule_steps(w);
        w->count = saved;
    }
}

#endif /* CFX_COLL_SCHEDULES_H */
