/*
 * The fault-injecting transport: see faulty.h for what it does and
 * docs/troubleshooting.md for CFX_FAULT.
 *
 * Shape. Each connector wraps one connector of the inner transport (the
 * first after this one in the registry that accepts the pair, so shm between
 * ranks of one host and socket otherwise, exactly as without CFX_FAULT):
 *   - send side: the user's connector *is* the inner one (same FIFO); posts
 *     go straight through and kick() is passed on when the inner transport
 *     asks for it;
 *   - receive side: the user reads a FIFO of its own, and this transport
 *     moves each slot from the inner FIFO into it (a copy), applying the
 *     rules on the way. It pumps from check() and kick(), which the executor
 *     calls while it waits for a slot and after it releases one, so no
 *     thread is needed.
 * The wrapper reports CFX_TRANSPORT_FLAG_PROGRESS (it must see every kick)
 * and not CFX_TRANSPORT_FLAG_PEER_MAP: it offers no map_peer (nor reg_mem,
 * flush), since faults act on slots it copies, and its receive FIFO is its
 * own host memory (setup refuses other placements). Everything else
 * (connect info, handshakes, failure detection, poisoning) is the inner
 * transport's own. It keeps the peer descriptions the core gave it, for
 * tests (cfx_faulty_peer_seen).
 */
#include "transports/faulty/faulty.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "src/util/check.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"

CFX_PARAM_STR(fault, "FAULT", NULL,
              "Fault injection for tests: rules such as drop:rank=1:after=3 (see "
              "docs/troubleshooting.md); unset: off");

#define MAX_INNER 8

/* Per-communicator state. */
struct faulty_ctx {
    struct cfx_transport_env env;
    struct cfx_fault_spec spec;
    struct cfx_transport_peer self; /* Learnt in can_connect. */
    /* [env.nranks]: what the core said of each rank (can_connect, setup);
     * rank -1 until then. Read by tests (cfx_faulty_peer_seen). */
    struct cfx_transport_peer *seen;
    void *inner_ctx[MAX_INNER]; /* Per registry entry, made on first use. */
    uint64_t recv_setups;       /* Receive connectors set up / connected so far. */
    uint64_t recv_connects;
};

/* What happens to the slot at the head of the inner FIFO. */
enum head_state { HEAD_UNDECIDED = 0, HEAD_DECIDED = 1 };

/* Per-connector state. */
struct faulty_conn {
    struct cfx_connector inner;
    int inner_open;
    int connected;
    struct cfx_connector *outer;
    void *mem; /* Receive side: the user's FIFO. */
    int pumping;
    /* Receive side: what went through, per connection. */
    uint64_t slots_seen;
    uint64_t bytes_seen;
    uint64_t hits[CFX_FAULT_MAX_RULES];
    enum head_state head;
    int head_rule; /* Index of the rule hitting the head slot, or -1. */
    int64_t head_due_ns;
    /* Set once a close rule fired. */
    int fault_closed;
    char error[CFX_ERROR_MAX];
};

/* ------------------------------------------------------------ lifecycle */

/* Unset CFX_FAULT: no state at all, and can_connect(NULL) says no. */
static cfxResult_t faulty_init(const struct cfx_transport_env *env, void **ctx_p)
{
    const char *text = param_fault();
    *ctx_p = NULL;
    if (text == NULL || text[0] == '\0')
        return cfxSuccess;
    struct cfx_fault_spec spec;
    char why[256];
    if (cfx_fault_spec_parse(text, &spec, why, sizeof(why)) != cfxSuccess)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "CFX_FAULT=\"%s\" is not a fault list: %s; see "
                             "docs/troubleshooting.md",
                             text, why);
    struct faulty_ctx *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "fault injector: out of memory");
    ctx->env = *env;
    ctx->env.listen_ifaddr = NULL; /* Not kept by the core past init. */
    ctx->spec = spec;
    ctx->self.rank = -1;
    ctx->seen = calloc((size_t)(env->nranks > 0 ? env->nranks : 1), sizeof(*ctx->seen));
    if (ctx->seen == NULL) {
        free(ctx);
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "fault injector: out of memory");
    }
    for (int r = 0; r < env->nranks; r++)
        ctx->seen[r].rank = -1;
    CFX_INFO(CFX_LOG_INIT, "fault injector: CFX_FAULT=\"%s\" (%d rule(s)) on rank %d", text,
             spec.n_rules, env->rank);
    *ctx_p = ctx;
    return cfxSuccess;
}

static void faulty_fini(void *ctx_v)
{
    struct faulty_ctx *ctx = ctx_v;
    if (ctx == NULL)
        return;
    for (int t = 0; t < MAX_INNER && cfx_transports[t]; t++)
        if (ctx->inner_ctx[t])
            cfx_transports[t]->fini(ctx->inner_ctx[t]);
    free(ctx->seen);
    free(ctx);
}

/* ----------------------------------------------------------- connection */

/* Keep what the core said of a rank, for cfx_faulty_peer_seen. */
static void note_peer(struct faulty_ctx *ctx, const struct cfx_transport_peer *peer)
{
    if (peer->rank >= 0 && peer->rank < ctx->env.nranks)
        ctx->seen[peer->rank] = *peer;
}

int cfx_faulty_peer_seen(const void *ctx_v, int rank, struct cfx_transport_peer *peer_p)
{
    const struct faulty_ctx *ctx = ctx_v;
    if (ctx == NULL || rank < 0 || rank >= ctx->env.nranks || ctx->seen[rank].rank != rank)
        return 0;
    *peer_p = ctx->seen[rank];
    return 1;
}

/* The inner transport for @p peer: the first after this one that accepts. */
static int inner_pick(struct faulty_ctx *ctx, const struct cfx_transport_peer *peer)
{
    for (int t = 0; t < MAX_INNER && cfx_transports[t]; t++) {
        const struct cfx_transport *tr = cfx_transports[t];
        if (tr == &cfx_faulty_transport)
            continue;
        if (ctx->inner_ctx[t] == NULL && tr->init(&ctx->env, &ctx->inner_ctx[t]) != cfxSuccess) {
            CFX_WARN(CFX_LOG_INIT, "fault injector: transport %s did not start: %s", tr->name,
                     cfx_error_thread_last());
            continue;
        }
        if (tr->can_connect(ctx->inner_ctx[t], &ctx->self, peer))
            return t;
    }
    return -1;
}

/* With CFX_FAULT set: every pair some other transport can connect. Starts
 * the inner transports on first use, as the core would. */
static int faulty_can_connect(void *ctx_v, const struct cfx_transport_peer *self,
                              const struct cfx_transport_peer *peer)
{
    struct faulty_ctx *ctx = ctx_v;
    if (ctx == NULL)
        return 0;
    ctx->self = *self;
    note_peer(ctx, self);
    note_peer(ctx, peer);
    return inner_pick(ctx, peer) >= 0;
}

/* Whether rule @p r applies to this rank and a connection from @p peer_rank. */
static int rule_applies(const struct faulty_ctx *ctx, const struct cfx_fault_rule *r, int peer_rank)
{
    return (r->rank < 0 || r->rank == ctx->env.rank) && (r->peer < 0 || r->peer == peer_rank);
}

/* A kill rule for this moment of making a receive connector: die here. */
static void kill_point(struct faulty_ctx *ctx, int peer_rank, enum cfx_fault_moment at,
                       uint64_t seen)
{
    for (int i = 0; i < ctx->spec.n_rules; i++) {
        const struct cfx_fault_rule *r = &ctx->spec.rules[i];
        if (r->kind != CFX_FAULT_KILL || r->at != at || !rule_applies(ctx, r, peer_rank) ||
            seen < r->after)
            continue;
        CFX_WARN(CFX_LOG_INIT,
                 "fault injector: rank %d dies of SIGKILL at the %s of its "
                 "connection from rank %d (CFX_FAULT rule %d)",
                 ctx->env.rank, at == CFX_FAULT_AT_SETUP ? "setup" : "connect", peer_rank, i + 1);
        raise(SIGKILL);
    }
}

static cfxResult_t faulty_setup(void *ctx_v, const struct cfx_transport_peer *peer,
                                size_t slot_bytes, int n_steps, struct cfx_connector *conn,
                                void *info_out)
{
    struct faulty_ctx *ctx = ctx_v;
    /* The receiver's FIFO is this wrapper's host memory. */
    CFX_CHECK(cfx_transport_place_check(&cfx_faulty_transport, &conn->place));
    note_peer(ctx, peer);
    int t = inner_pick(ctx, peer);
    if (t < 0)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT,
                             "fault injector: no transport can reach rank %d", peer->rank);
    struct faulty_conn *fc = calloc(1, sizeof(*fc));
    if (fc == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "fault injector: out of memory");
    conn->priv = fc;
    fc->outer = conn;
    fc->head_rule = -1;
    fc->inner = (struct cfx_connector){.peer_rank = conn->peer_rank,
                                       .dir = conn->dir,
                                       .place = conn->place,
                                       .channel = conn->channel,
                                       .transport = cfx_transports[t],
                                       .transport_ctx = ctx->inner_ctx[t],
                                       .blame_rank = -1};
    fc->inner_open = 1;
    cfxResult_t res = fc->inner.transport->setup(fc->inner.transport_ctx, peer, slot_bytes, n_steps,
                                                 &fc->inner, info_out);
    if (res != cfxSuccess)
        return res;
    if (conn->dir == CFX_CONN_SEND) {
        /* shm's sender has no FIFO until connect maps the receiver's. */
        if (fc->inner.fifo != NULL)
            cfx_connector_set_fifo(conn, fc->inner.fifo, fc->inner.slots, fc->inner.slot_bytes,
                                   fc->inner.n_steps);
        return cfxSuccess;
    }
    kill_point(ctx, conn->peer_rank, CFX_FAULT_AT_SETUP, ctx->recv_setups++);
    size_t bytes = cfx_fifo_slots_offset() + slot_bytes * (size_t)n_steps;
    if (posix_memalign(&fc->mem, 4096, bytes) != 0) {
        fc->mem = NULL;
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT,
                             "fault injector: out of memory for a %zu-byte FIFO", bytes);
    }
    memset(fc->mem, 0, bytes); /* Touch every page now, never on the data path. */
    cfx_connector_set_fifo(conn, fc->mem, (char *)fc->mem + cfx_fifo_slots_offset(), slot_bytes,
                           n_steps);
    return cfxSuccess;
}

static cfxResult_t faulty_connect(void *ctx_v, struct cfx_connector *conn, const void *peer_info)
{
    struct faulty_ctx *ctx = ctx_v;
    struct faulty_conn *fc = conn->priv;
    if (conn->dir == CFX_CONN_RECV)
        kill_point(ctx, conn->peer_rank, CFX_FAULT_AT_CONNECT, ctx->recv_connects++);
    cfxResult_t res = fc->inner.transport->connect(fc->inner.transport_ctx, &fc->inner, peer_info);
    if (res != cfxSuccess)
        return res;
    if (conn->dir == CFX_CONN_SEND) {
        /* shm maps the receiver's FIFO only now. */
        cfx_connector_set_fifo(conn, fc->inner.fifo, fc->inner.slots, fc->inner.slot_bytes,
                               fc->inner.n_steps);
    }
    fc->connected = 1;
    CFX_INFO(CFX_LOG_INIT, "fault injector: rank %d %s rank %d over %s", ctx->env.rank,
             conn->dir == CFX_CONN_SEND ? "->" : "<-", conn->peer_rank, fc->inner.transport->name);
    return cfxSuccess;
}

static void inner_close(struct faulty_conn *fc)
{
    if (!fc->inner_open)
        return;
    fc->inner_open = 0;
    fc->inner.transport->close(fc->inner.transport_ctx, &fc->inner);
}

static void faulty_close(void *ctx_v, struct cfx_connector *conn)
{
    (void)ctx_v;
    struct faulty_conn *fc = conn->priv;
    if (fc == NULL)
        return;
    inner_close(fc);
    free(fc->mem);
    free(fc);
    cfx_connector_forget(conn);
}

/* ------------------------------------------------------------ data path */

/* The first rule that hits the next slot (of @p bytes) of this connection. */
static int rule_for_slot(struct faulty_ctx *ctx, struct faulty_conn *fc, size_t bytes)
{
    for (int i = 0; i < ctx->spec.n_rules; i++) {
        const struct cfx_fault_rule *r = &ctx->spec.rules[i];
        if (!rule_applies(ctx, r, fc->outer->peer_rank) || fc->slots_seen < r->after ||
            fc->bytes_seen < r->after_bytes || (r->count && fc->hits[i] >= r->count) ||
            (r->kind == CFX_FAULT_KILL && r->at != CFX_FAULT_AT_DATA))
            continue;
        /* A slot with no bytes cannot be cut short or have a byte flipped. */
        if (bytes == 0 && (r->kind == CFX_FAULT_TRUNCATE ||
                           (r->kind == CFX_FAULT_CORRUPT && r->what == CFX_FAULT_DATA)))
            continue;
        fc->hits[i]++;
        return i;
    }
    return -1;
}

/* A close rule fired: close the inner connector, as a failing rank would. */
static void fault_close(struct faulty_ctx *ctx, struct faulty_conn *fc, int rule)
{
    snprintf(fc->error, sizeof(fc->error),
             "rank %d's connection from rank %d was closed by fault injection (CFX_FAULT rule "
             "%d: close after %llu slots, %llu bytes)",
             ctx->env.rank, fc->outer->peer_rank, rule + 1, (unsigned long long)fc->slots_seen,
             (unsigned long long)fc->bytes_seen);
    CFX_WARN(CFX_LOG_NET, "%s", fc->error);
    fc->fault_closed = 1;
    inner_close(fc);
}

/* Receive side: move what the inner FIFO holds into the user's FIFO,
 * applying the rules, in order. Returns how many slots it moved or
 * dropped. Never blocks. */
static int pump(struct faulty_ctx *ctx, struct faulty_conn *fc)
{
    struct cfx_connector *outer = fc->outer;
    int moved = 0;
    if (!fc->connected || fc->fault_closed || fc->pumping)
        return 0;
    fc->pumping = 1;
    while (fc->inner_open && cfx_conn_can_take(&fc->inner) && cfx_conn_can_post(outer)) {
        size_t bytes;
        const struct cfx_fingerprint *print;
        const char *src = cfx_conn_take_slot(&fc->inner, &bytes, &print);
        if (fc->head == HEAD_UNDECIDED) {
            fc->head = HEAD_DECIDED;
            fc->head_rule = rule_for_slot(ctx, fc, bytes);
            fc->head_due_ns = 0;
            if (fc->head_rule >= 0 && ctx->spec.rules[fc->head_rule].kind == CFX_FAULT_DELAY)
                fc->head_due_ns =
                    cfx_time_now_ns() + ctx->spec.rules[fc->head_rule].ms * CFX_NS_PER_MS;
        }
        const struct cfx_fault_rule *rule =
            fc->head_rule >= 0 ? &ctx->spec.rules[fc->head_rule] : NULL;
        enum cfx_fault_kind kind = rule ? rule->kind : 0;
        if (kind == CFX_FAULT_DELAY && cfx_time_now_ns() < fc->head_due_ns)
            break; /* Held back; later slots wait behind it. */
        if (kind == CFX_FAULT_CLOSE) {
            fault_close(ctx, fc, fc->head_rule);
            moved++;
            break;
        }
        if (kind == CFX_FAULT_KILL) {
            CFX_WARN(CFX_LOG_NET,
                     "fault injector: rank %d dies of SIGKILL as slot %llu from "
                     "rank %d arrives (CFX_FAULT rule %d)",
                     ctx->env.rank, (unsigned long long)fc->slots_seen, outer->peer_rank,
                     fc->head_rule + 1);
            raise(SIGKILL);
        }
        fc->head = HEAD_UNDECIDED;
        fc->slots_seen++;
        fc->bytes_seen += bytes;
        moved++;
        if (kind == CFX_FAULT_DROP) {
            CFX_INFO(CFX_LOG_NET, "fault injector: rank %d dropped slot %llu from rank %d",
                     ctx->env.rank, (unsigned long long)fc->slots_seen - 1, outer->peer_rank);
            cfx_conn_release(&fc->inner);
            continue;
        }
        uint64_t tail = cfx_load_relaxed_u64(&outer->fifo->tail);
        size_t index = (size_t)(tail % (uint64_t)outer->n_steps);
        size_t out_bytes = bytes <= outer->slot_bytes ? bytes : outer->slot_bytes;
        struct cfx_fingerprint out_print = *print;
        if (kind == CFX_FAULT_TRUNCATE)
            out_bytes = rule->keep >= 0 && (uint64_t)rule->keep < out_bytes ? (size_t)rule->keep
                                                                            : out_bytes / 2;
        char *dst =
            cfx_fifo_data(outer->fifo->info, outer->slots, outer->slot_bytes, index, out_bytes);
        memcpy(dst, src, out_bytes);
        if (kind == CFX_FAULT_CORRUPT && rule->what == CFX_FAULT_DATA && out_bytes > 0)
            dst[rule->offset % out_bytes] ^= (char)0xff;
        if (kind == CFX_FAULT_CORRUPT && rule->what == CFX_FAULT_PRINT)
            out_print.seq ^= UINT64_C(0x5a5a);
        if (kind != 0)
            CFX_INFO(CFX_LOG_NET, "fault injector: rank %d: %s slot %llu from rank %d",
                     ctx->env.rank, cfx_fault_kind_name(kind),
                     (unsigned long long)fc->slots_seen - 1, outer->peer_rank);
        outer->fifo->info[index].size = (uint32_t)out_bytes;
        outer->fifo->info[index].print = out_print;
        /* Not cfx_conn_post(): its kick would come back here. */
        cfx_fifo_mark_posted(outer->fifo->info, outer->n_steps, tail);
        cfx_store_release_u64(&outer->fifo->tail, tail + 1);
        cfx_conn_release(&fc->inner);
    }
    fc->pumping = 0;
    return moved;
}

/* Send side: pass the kick on. Receive side: the user freed a slot, refill. */
static void faulty_kick(void *ctx_v, struct cfx_connector *conn)
{
    struct faulty_conn *fc = conn->priv;
    if (conn->dir == CFX_CONN_RECV) {
        pump(ctx_v, fc);
        return;
    }
    if (fc->inner_open && (fc->inner.transport->flags & CFX_TRANSPORT_FLAG_PROGRESS))
        fc->inner.transport->kick(fc->inner.transport_ctx, &fc->inner);
}

/* The executor waits here: let the inner transport move bytes, then pump. */
static int faulty_progress(void *ctx_v, struct cfx_connector *conn)
{
    struct faulty_conn *fc = conn->priv;
    if (fc == NULL || !fc->inner_open)
        return 0;
    int moved = 0;
    if (fc->inner.transport->progress)
        moved = fc->inner.transport->progress(fc->inner.transport_ctx, &fc->inner);
    if (conn->dir == CFX_CONN_RECV)
        moved |= pump(ctx_v, fc) > 0;
    return moved;
}

static void faulty_poison(void *ctx_v, struct cfx_connector *conn, cfxResult_t reason,
                          int blame_rank)
{
    (void)ctx_v;
    struct faulty_conn *fc = conn->priv;
    if (fc != NULL && fc->inner_open && fc->inner.transport->poison)
        fc->inner.transport->poison(fc->inner.transport_ctx, &fc->inner, reason, blame_rank);
}

/* Receive side: pump first, so slots that arrived (or a delay that ended)
 * count as progress; fail only when nothing is left to deliver. */
static cfxResult_t faulty_check(void *ctx_v, struct cfx_connector *conn)
{
    struct faulty_conn *fc = conn->priv;
    if (conn->dir == CFX_CONN_RECV) {
        if (pump(ctx_v, fc) > 0 || cfx_conn_can_take(conn))
            return cfxSuccess;
        if (fc->fault_closed) {
            conn->blame_rank = conn->peer_rank;
            return cfx_error_set(cfxRemoteError, CFX_LOG_NET, "%s", fc->error);
        }
        if (fc->head == HEAD_DECIDED)
            return cfxSuccess; /* A delayed slot is on its way. */
    }
    if (!fc->inner_open || fc->inner.transport->check == NULL)
        return cfxSuccess;
    cfxResult_t res = fc->inner.transport->check(fc->inner.transport_ctx, &fc->inner);
    if (res != cfxSuccess)
        conn->blame_rank = fc->inner.blame_rank;
    return res;
}

const struct cfx_transport cfx_faulty_transport = {
    .version = CFX_TRANSPORT_VERSION,
    .name = "faulty",
    .flags = CFX_TRANSPORT_FLAG_PROGRESS,
    /* lifecycle */
    .init = faulty_init,
    .fini = faulty_fini,
    /* connection */
    .can_connect = faulty_can_connect,
    .setup = faulty_setup,
    .connect = faulty_connect,
    .close = faulty_close,
    /* data path */
    .kick = faulty_kick,
    .poison = faulty_poison,
    .check = faulty_check,
    .progress = faulty_progress,
    /* memory: a wrapper that copies slots maps and registers nothing */
    .reg_mem = NULL,
    .dereg_mem = NULL,
    .flush = NULL,
    .map_peer = NULL,
};
