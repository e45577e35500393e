/* Host executor: see host.h; the interface it implements is exec.h. */
#include "src/exec/host.h"

#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"

CFX_PARAM_INT(timeout, "TIMEOUT", 600, 0, CFX_PARAM_SECONDS_MAX,
              "Seconds a blocking call may go without progress before it fails with cfxTimeout; "
              "0 waits forever");

int64_t cfx_exec_host_timeout_s(void)
{
    return param_timeout();
}

#define YIELD_ROUNDS 200     /* sched_yield() rounds before sleeping. */
#define YIELD_NS     1000000 /* Yield this long (1 ms) in all before napping on memory. */
#define SLEEP_MAX_NS 200000  /* Longest nap while waiting (0.2 ms). */
#define HEALTH_EVERY 256     /* Idle rounds between transport health checks. */
#define WAIT_MAX_NS  1000000 /* Longest sleep in a transport wait (1 ms). */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* An op may run once it holds both its connectors; claims are taken in
 * issue order, so operations sharing a connector run in that order. */
static int claim(struct cfx_op *op)
{
    if (op->claimed)
        return 1;
    int held = 1;
    for (int i = 0; i < op->n_conns; i++) {
        struct cfx_connector *conn = op->conns[i];
        if (conn == NULL || conn->owner == op)
            continue;
        if (conn->owner == NULL)
            conn->owner = op;
        else
            held = 0;
    }
    op->claimed = held;
    return held;
}

static void unclaim(struct cfx_op *op)
{
    op->claimed = 0;
    for (int i = 0; i < op->n_conns; i++)
        if (op->conns[i] && op->conns[i]->owner == op)
            op->conns[i]->owner = NULL;
}

static cfxResult_t check_connector(struct cfx_op *op, struct cfx_connector *conn)
{
    if (conn == NULL || conn->transport->check == NULL)
        return cfxSuccess;
    cfxResult_t res = conn->transport->check(conn->transport_ctx, conn);
    /* The peer the failure came through: the next link of the blame chain
     * (src/core/blame.c), whatever rank the transport heard it was about;
     * this rank itself when the transport says the failure is its own (a
     * port or queue pair of this rank's broke): the chain ends here. */
    if (res != cfxSuccess)
        op->blame_rank = conn->blame_rank == op->rank ? op->rank : conn->peer_rank;
    return res;
}

/* While idle: an abort (of the communicator, or of the batch through the
 * interface), a failure of the connector the op waits on, or a failure of
 * a send connector whose posted slots have not all been released (a
 * transport that lost them: the peer waits for them in vain, and may learn
 * of it only late, as over verbs), ends the wait with an error. A connector
 * the op no longer needs may fail (a faster peer took everything, finished
 * and left) without failing the op. */
static cfxResult_t check_health(const struct cfx_exec_batch *batch, struct cfx_op *op)
{
    if ((op->abort_flag && __atomic_load_n(op->abort_flag, __ATOMIC_ACQUIRE)) ||
        __atomic_load_n(&batch->aborted, __ATOMIC_ACQUIRE))
        return cfx_error_set(cfxRemoteError, CFX_LOG_COLL, "%s on rank %d was aborted",
                             cfx_coll_name(op->kind), op->rank);
    const char *what;
    struct cfx_connector *waiting = cfx_coll_waiting_on(op, &what);
    cfxResult_t res = check_connector(op, waiting);
    for (int c = 0; res == cfxSuccess && c < op->n_conns; c++) {
        struct cfx_connector *conn = op->conns[c];
        if (conn == NULL || conn == waiting || conn->dir != CFX_CONN_SEND ||
            cfx_load_acquire_u64(conn->view.head) == cfx_load_relaxed_u64(conn->view.tail))
            continue;
        res = check_connector(op, conn);
    }
    return res;
}

/* No progress for CFX_TIMEOUT: name the operation and whom it waits for. */
static cfxResult_t timed_out(struct cfx_op *ops, int n_ops, int64_t seconds)
{
    for (int i = 0; i < n_ops; i++) {
        if (ops[i].done)
            continue;
        const char *what = "its turn on a connector held by an earlier operation";
        char op_text[160];
        cfx_coll_print_format(&ops[i].print, op_text, sizeof(op_text));
        struct cfx_connector *conn = cfx_coll_waiting_on(&ops[i], &what);
        if (conn) {
            int peer = conn->peer_rank;
            ops[i].blame_rank = peer;
            return cfx_error_set(
                cfxTimeout, CFX_LOG_COLL,
                "%s on rank %d made no progress for %lld s (CFX_TIMEOUT or config.timeout), at "
                "step %llu of %llu, waiting for %s rank %d; that rank did not "
                "answer: is it alive, and did it call the same operation?",
                op_text, ops[i].rank, (long long)seconds, (unsigned long long)ops[i].step,
                (unsigned long long)ops[i].n_steps, what, peer);
        }
        return cfx_error_set(
            cfxTimeout, CFX_LOG_COLL,
            "%s on rank %d made no progress for %lld s (CFX_TIMEOUT or config.timeout), waiting "
            "for %s",
            op_text, ops[i].rank, (long long)seconds, what);
    }
    return cfx_error_set(cfxTimeout, CFX_LOG_COLL, "operations made no progress for %lld s",
                         (long long)seconds);
}

/* Idle: let the transports that move bytes with a thread of their own move
 * the running operations' bytes from this thread instead (one hand-off less
 * per slot each way, and no wake-up of that thread). Whether anything moved. */
static int drive(struct cfx_op *ops, int n_ops)
{
    int moved = 0;
    for (int i = 0; i < n_ops; i++) {
        if (ops[i].done)
            continue;
        for (int c = 0; c < ops[i].n_conns; c++) {
            struct cfx_connector *conn = ops[i].conns[c];
            if (conn && conn->transport->progress)
                moved |= conn->transport->progress(conn->transport_ctx, conn);
        }
    }
    return moved;
}

/* Idle, and every pending operation waits on a connector whose transport
 * can sleep in the kernel (sockets): sleep there, on the pending operations'
 * connectors of the first one's transport and context, at most
 * @p timeout_ns. Returns -1 when some operation waits on memory instead
 * (spin for it), else whether anything moved. */
#define BLOCK_MAX_CONNS 64

static int block(struct cfx_op *ops, int n_ops, int64_t timeout_ns)
{
    struct cfx_connector *first = NULL;
    for (int i = 0; i < n_ops; i++) {
        if (ops[i].done)
            continue;
        const char *what;
        struct cfx_connector *conn = cfx_coll_waiting_on(&ops[i], &what);
        if (conn == NULL || conn->transport->wait == NULL)
            return -1;
        if (first == NULL)
            first = conn;
    }
    if (first == NULL)
        return -1;
    struct cfx_connector *same[BLOCK_MAX_CONNS];
    int n = 0;
    for (int i = 0; i < n_ops; i++) {
        for (int c = 0; !ops[i].done && c < ops[i].n_conns && n < BLOCK_MAX_CONNS; c++) {
            struct cfx_connector *conn = ops[i].conns[c];
            if (conn && conn->transport == first->transport &&
                conn->transport_ctx == first->transport_ctx)
                same[n++] = conn;
        }
    }
    return first->transport->wait(first->transport_ctx, same, n, timeout_ns);
}

static void fail_all(struct cfx_op *ops, int n_ops, cfxResult_t res)
{
    for (int i = 0; i < n_ops; i++) {
        if (!ops[i].done || ops[i].result == cfxSuccess) {
            ops[i].result = res;
            ops[i].done = 1;
        }
        unclaim(&ops[i]);
    }
}

/* One round over the batch: claim, run the ready steps, retire. Returns
 * how many ops progressed or finished; *pending_p counts those still
 * running. On a failure every op is failed and *failed_p holds the result. */
static inline int pass(struct cfx_op *ops, int n_ops, int *pending_p, cfxResult_t *failed_p)
{
    int pending = 0, progressed = 0;
    for (int i = 0; i < n_ops; i++) {
        struct cfx_op *op = &ops[i];
        if (op->done)
            continue;
        if (claim(op))
            progressed += cfx_coll_progress(op);
        if (op->done) {
            unclaim(op);
            if (op->result != cfxSuccess) {
                fail_all(ops, n_ops, op->result);
                *failed_p = op->result;
                return progressed;
            }
            progressed++;
        } else {
            pending++;
        }
    }
    *pending_p = pending;
    return progressed;
}

/* The shortest timeout of the batch's ops (each its communicator's, or
 * CFX_TIMEOUT); 0 when every op waits forever. */
static int64_t batch_timeout(const struct cfx_op *ops, int n_ops)
{
    int64_t shortest = 0;
    for (int i = 0; i < n_ops; i++) {
        int64_t s = ops[i].timeout_s < 0 ? param_timeout() : ops[i].timeout_s;
        if (s > 0 && (shortest == 0 || s < shortest))
            shortest = s;
    }
    return shortest;
}

/* Every HEALTH_EVERY idle rounds: CFX_TIMEOUT, aborts, failed peers, and the
 * ops' own stall hooks (the mismatch probe). A failure fails the batch. */
static cfxResult_t check_idle(struct cfx_exec_batch *batch)
{
    struct cfx_op *ops = batch->ops;
    int n_ops = batch->n_ops;
    int64_t now = cfx_time_now_ns();
    if (batch->last_progress_ns == 0)
        batch->last_progress_ns = now;
    if (batch->timeout_s < 0)
        batch->timeout_s = batch_timeout(ops, n_ops);
    if (batch->timeout_s > 0 && now - batch->last_progress_ns > batch->timeout_s * CFX_NS_PER_SEC) {
        cfxResult_t res = timed_out(ops, n_ops, batch->timeout_s);
        fail_all(ops, n_ops, res);
        return res;
    }
    for (int i = 0; i < n_ops; i++) {
        if (ops[i].done)
            continue;
        cfxResult_t res = check_health(batch, &ops[i]);
        if (res == cfxSuccess && ops[i].on_stall)
            res = ops[i].on_stall(&ops[i], now - batch->last_progress_ns);
        if (res != cfxSuccess) {
            ops[i].result = res;
            fail_all(ops, n_ops, res);
            return res;
        }
    }
    return cfxSuccess;
}

static cfxResult_t host_test(const struct cfx_executor *exec, struct cfx_exec_batch *batch)
{
    (void)exec;
    int pending = 0;
    cfxResult_t failed = cfxSuccess;
    int progressed = pass(batch->ops, batch->n_ops, &pending, &failed);
    if (failed != cfxSuccess)
        return failed;
    if (pending == 0)
        return cfxSuccess;
    if (progressed || drive(batch->ops, batch->n_ops)) {
        batch->idle = 0;
        batch->last_progress_ns = 0;
        return cfxInProgress;
    }
    /* A caller that tests rarely still sees an abort at its next test. */
    if (++batch->idle % HEALTH_EVERY == 0 || __atomic_load_n(&batch->aborted, __ATOMIC_ACQUIRE)) {
        cfxResult_t res = check_idle(batch);
        if (res != cfxSuccess)
            return res;
    }
    return cfxInProgress;
}

static cfxResult_t host_wait(const struct cfx_executor *exec, struct cfx_exec_batch *batch)
{
    (void)exec;
    struct cfx_op *ops = batch->ops;
    int n_ops = batch->n_ops;
    /* Spin budget adapts per thread: waits that spinning did not end (the
     * peer was not running: more ranks than free cores) halve it, waits it
     * ended double it back up to the owner's limit. */
    static _Thread_local int64_t adaptive = -1;
    int64_t limit = n_ops > 0 ? ops[0].spin_limit : 0;
    if (adaptive < 0 || adaptive > limit)
        adaptive = limit;
    int64_t spins = adaptive;
    uint64_t idle = 0;
    int64_t yield_until = 0; /* When the yielding ends: set as spinning does. */
    long nap_ns = 1000;
    for (;;) {
        int pending = 0;
        cfxResult_t failed = cfxSuccess;
        int progressed = pass(ops, n_ops, &pending, &failed);
        if (failed != cfxSuccess)
            return failed;
        if (pending == 0)
            return cfxSuccess;
        if (progressed) {
            if (idle > 0) {
                if ((int64_t)idle >= spins && spins > 16)
                    spins /= 2;
                else if ((int64_t)idle < spins / 2 && spins < limit)
                    spins = spins * 2 < limit ? spins * 2 : limit;
                adaptive = spins;
            }
            batch->last_progress_ns = 0; /* Read the clock only once idle. */
            idle = 0;
            yield_until = 0;
            nap_ns = 1000;
            continue;
        }
        if (drive(ops, n_ops)) {
            idle = 0;
            continue;
        }
        idle++;
        if (idle % HEALTH_EVERY == 0) {
            cfxResult_t res = check_idle(batch);
            if (res != cfxSuccess)
                return res;
        }
        if ((int64_t)idle < spins) {
            cpu_relax();
        } else if ((int64_t)idle < spins + YIELD_ROUNDS) {
            sched_yield();
        } else if (block(ops, n_ops, WAIT_MAX_NS) >= 0) {
            /* Slept in the kernel until the peer's bytes came (sockets). */
        } else if (yield_until == 0 || cfx_time_now_ns() < yield_until) {
            /* Waiting on memory: yield for a time, not a count, before
             * napping. A peer busy with a long step (a 512 KiB slot takes
             * 50-200 us to fill here) must not send this thread to sleep:
             * a nap overshoots by the timer slack (50 us) and may let the
             * virtual CPU halt. With nothing else to run a yield is one
             * system call. */
            if (yield_until == 0)
                yield_until = cfx_time_now_ns() + YIELD_NS;
            sched_yield();
        } else {
            struct timespec nap = {0, nap_ns};
            nanosleep(&nap, NULL);
            if (nap_ns < SLEEP_MAX_NS)
                nap_ns *= 2;
        }
    }
}

/* With a NULL stream the call completes before it returns: straight into
 * the wait loop (one pass less than test + wait). Host buffers on a stream
 * will start here and finish in test/wait in stream order. */
static cfxResult_t host_launch(const struct cfx_executor *exec, struct cfx_exec_batch *batch)
{
    if (batch->stream == NULL)
        return host_wait(exec, batch);
    return host_test(exec, batch);
}

static void host_abort(const struct cfx_executor *exec, struct cfx_exec_batch *batch)
{
    (void)exec;
    __atomic_store_n(&batch->aborted, 1, __ATOMIC_RELEASE);
}

const struct cfx_executor cfx_exec_host = {
    .version = CFX_EXEC_VERSION,
    .name = "host",
    .launch = host_launch,
    .test = host_test,
    .wait = host_wait,
    .abort = host_abort,
};
