/*
 * Blame agreement. A failure reaches the ranks of a communicator by several
 * roads at once: a rank sees its peer's socket close, another hears a
 * poisoned connector, others reach CFX_TIMEOUT together, each waiting for a
 * different peer. Each rank's own view names the peer next to it, so left
 * alone the ranks name different culprits.
 *
 * So every failing rank tells every other rank, over the bootstrap, its
 * link: the peer it failed through (the one it waited for, or whose
 * connector failed or was poisoned), itself when the failure began here, or
 * "unknown". Each rank then follows the links from itself: a link to itself
 * ends the chain there; a rank that cannot be reached (its process is gone)
 * or that tells nothing within CFX_BLAME_WINDOW_MS (stopped, hung, or never
 * in the call) ends it at that rank; a cycle of ranks that all told ends at
 * its lowest rank. An unknown link ends at the lowest rank that cannot be
 * reached, else the lowest that stayed silent. The chains of one failure
 * meet, so the ranks that told agree. Nothing here runs before a failure.
 */
#include "src/core/blame.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "src/bootstrap/bootstrap.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"

CFX_PARAM_INT(blame_window_ms, "BLAME_WINDOW_MS", 1000, 1, 600000,
              "Milliseconds a failing rank waits for the other ranks' account of a failure "
              "before it blames the rank that stayed silent");

#define BLAME_TAG      0x424c0001u /* "BL": a rank's account of its failure. */
#define BLAME_PING_TAG 0x424c0002u /* Is the rank still there? (never read) */
#define BLAME_MAGIC    0x426c616du
#define PING_MAX_MS    200 /* Longest wait to reach one rank. */
#define POLL_NS        (5 * CFX_NS_PER_MS)

/* What a failing rank tells the others. */
struct blame_msg {
    uint32_t magic;
    int32_t rank;
    int32_t link; /* Peer it failed through, itself, or CFX_BLAME_UNKNOWN. */
    int32_t reason;
};

enum heard_state { NOT_YET = 0, HEARD, GONE };

struct walk {
    struct cfxComm *comm;
    struct blame_msg *msgs; /* [nranks] */
    unsigned char *state;   /* [nranks]: enum heard_state. */
    int *visited;           /* [nranks]: position in the chain + 1, 0: not on it. */
    int64_t deadline_ns;
};

void cfx_core_blame_tell(struct cfxComm *comm, cfxResult_t reason, int link_rank)
{
    if (comm->bootstrap == NULL || __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE))
        return;
    struct blame_msg msg = {
        .magic = BLAME_MAGIC, .rank = comm->rank, .link = link_rank, .reason = (int32_t)reason};
    int64_t window_ms = param_blame_window_ms();
    int64_t deadline = cfx_time_now_ns() + window_ms * CFX_NS_PER_MS;
    /* Self first: the walk reads this rank's own account like the others'. */
    for (int i = 0; i < comm->nranks; i++) {
        int peer = (comm->rank + i) % comm->nranks;
        int64_t left_ms = (deadline - cfx_time_now_ns()) / CFX_NS_PER_MS;
        if (left_ms <= 0)
            break;
        if (cfx_bootstrap_send_within(comm->bootstrap, peer, BLAME_TAG, &msg, sizeof(msg),
                                      (int)(left_ms < PING_MAX_MS ? left_ms : PING_MAX_MS)) !=
            cfxSuccess) {
            CFX_INFO(CFX_LOG_COLL, "rank %d: rank %d did not take this rank's failure account",
                     comm->rank, peer);
            cfx_error_thread_clear();
        }
    }
}

/* Whether @p rank's account is here (taking any that wait to be accepted). */
static int heard(struct walk *w, int rank)
{
    if (w->state[rank] == HEARD)
        return 1;
    struct blame_msg msg;
    int got = 0;
    if (cfx_bootstrap_try_recv(w->comm->bootstrap, rank, BLAME_TAG, &msg, sizeof(msg), &got) !=
        cfxSuccess) {
        cfx_error_thread_clear();
        return 0;
    }
    if (!got || msg.magic != BLAME_MAGIC || msg.rank != rank)
        return 0;
    w->msgs[rank] = msg;
    w->state[rank] = HEARD;
    return 1;
}

/* Whether @p rank can still be reached (its bootstrap listener answers);
 * a rank that cannot is GONE. */
static int reachable(struct walk *w, int rank)
{
    if (w->state[rank] == GONE)
        return 0;
    int64_t left_ms = (w->deadline_ns - cfx_time_now_ns()) / CFX_NS_PER_MS;
    int wait_ms = left_ms < 1 ? 1 : left_ms > PING_MAX_MS ? PING_MAX_MS : (int)left_ms;
    int32_t ping = w->comm->rank;
    if (cfx_bootstrap_send_within(w->comm->bootstrap, rank, BLAME_PING_TAG, &ping, sizeof(ping),
                                  wait_ms) == cfxSuccess)
        return 1;
    cfx_error_thread_clear();
    if (heard(w, rank)) /* It told, then left. */
        return 1;
    w->state[rank] = GONE;
    return 0;
}

static int aborted(const struct walk *w)
{
    return __atomic_load_n(&w->comm->abort_flag, __ATOMIC_ACQUIRE);
}

static void nap(void)
{
    struct timespec ts = {0, POLL_NS};
    nanosleep(&ts, NULL);
}

/* Wait until the deadline for @p rank's account: 1 when heard. */
static int wait_for(struct walk *w, int rank)
{
    if (heard(w, rank))
        return 1;
    if (!reachable(w, rank))
        return w->state[rank] == HEARD;
    while (cfx_time_now_ns() < w->deadline_ns && !aborted(w)) {
        if (heard(w, rank))
            return 1;
        nap();
    }
    return heard(w, rank);
}

/* Unknown link: the lowest rank that is gone, else the lowest that stays
 * silent until the deadline, else @p fallback. */
static int lowest_missing(struct walk *w, int fallback, char *why, size_t size)
{
    int n = w->comm->nranks;
    for (int r = 0; r < n; r++)
        if (!heard(w, r) && !reachable(w, r)) {
            snprintf(why, size, "rank %d is gone (it cannot be reached)", r);
            return r;
        }
    for (int r = 0; r < n; r++)
        if (!wait_for(w, r)) {
            snprintf(why, size, "rank %d did not answer within CFX_BLAME_WINDOW_MS=%lld ms", r,
                     (long long)param_blame_window_ms());
            return r;
        }
    snprintf(why, size, "every rank answered; rank %d failed without knowing why", fallback);
    return fallback;
}

/* The chain from this rank: see the file comment. */
static int follow(struct walk *w, char *why, size_t size, cfxResult_t *origin_p)
{
    int n = w->comm->nranks;
    char chain[160];
    size_t used = (size_t)snprintf(chain, sizeof(chain), "%d", w->comm->rank);
    int cur = w->comm->rank;
    for (int hops = 1;; hops++) {
        w->visited[cur] = hops;
        if (!wait_for(w, cur)) {
            if (w->state[cur] == GONE)
                snprintf(why, size, "rank %d is gone (links %s)", cur, chain);
            else
                snprintf(why, size,
                         "rank %d did not answer within CFX_BLAME_WINDOW_MS=%lld ms: stopped, "
                         "hung, or not in this call (links %s)",
                         cur, (long long)param_blame_window_ms(), chain);
            return cur;
        }
        int link = w->msgs[cur].link;
        if (link == cur) {
            snprintf(why, size, "the failure began at rank %d (%s; links %s)", cur,
                     cfxGetErrorString((cfxResult_t)w->msgs[cur].reason), chain);
            *origin_p = (cfxResult_t)w->msgs[cur].reason;
            return cur;
        }
        if (link < 0 || link >= n)
            return lowest_missing(w, cur, why, size);
        if (w->visited[link]) {
            int lowest = link;
            for (int r = 0; r < n; r++)
                if (w->visited[r] >= w->visited[link] && r < lowest)
                    lowest = r;
            snprintf(why, size, "ranks wait for each other in a cycle (links %s -> %d)", chain,
                     link);
            return lowest;
        }
        if (used < sizeof(chain))
            used += (size_t)snprintf(chain + used, sizeof(chain) - used, " -> %d", link);
        cur = link;
    }
}

int cfx_core_blame_agree(struct cfxComm *comm, char *why, size_t why_size, cfxResult_t *origin_p)
{
    int n = comm->nranks;
    *origin_p = cfxSuccess;
    snprintf(why, why_size, "this rank failed here");
    if (comm->bootstrap == NULL || n < 2 || __atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE))
        return comm->rank;
    struct walk w = {.comm = comm,
                     .msgs = calloc((size_t)n, sizeof(*w.msgs)),
                     .state = calloc((size_t)n, sizeof(*w.state)),
                     .visited = calloc((size_t)n, sizeof(*w.visited)),
                     .deadline_ns = cfx_time_now_ns() + param_blame_window_ms() * CFX_NS_PER_MS};
    int blamed = comm->rank;
    if (w.msgs && w.state && w.visited)
        blamed = follow(&w, why, why_size, origin_p);
    free(w.msgs);
    free(w.state);
    free(w.visited);
    CFX_INFO(CFX_LOG_COLL, "rank %d blames rank %d: %s", comm->rank, blamed, why);
    return blamed;
}

cfxResult_t cfx_core_blame_explain(struct cfxComm *comm, cfxResult_t res, const char *what,
                                   const char *seen)
{
    char why[256];
    cfxResult_t origin;
    int blamed = cfx_core_blame_agree(comm, why, sizeof(why), &origin);
    /* Every rank returns what the failure was where it began (a mismatch
     * stays cfxInvalidUsage on the ranks whose connection to it broke
     * first), as a poisoned connector would have told them. */
    if (origin != cfxSuccess && blamed != comm->rank)
        res = origin;
    return cfx_error_set(res, CFX_LOG_COLL,
                         "%s on rank %d failed because of rank %d: %s. This "
                         "rank saw: %s",
                         what, comm->rank, blamed, why, seen);
}
