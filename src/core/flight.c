/*
 * The flight recorder: each communicator remembers its last
 * CFX_FLIGHT_RECORDER operations (what, when, how far, how they ended), and
 * writes them to the log when an operation times out or a peer fails, or on
 * SIGUSR1 when CFX_DUMP_ON_SIGNAL=1. The log line is printed whatever
 * CFX_DEBUG says: it is what one reads after a hang.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/coll/op.h"
#include "src/core/comm.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"

CFX_PARAM_INT(flight_recorder, "FLIGHT_RECORDER", 64, 0, 1 << 16,
              "Operations each communicator remembers for the flight recorder (0: off)");
CFX_PARAM_INT(dump_on_signal, "DUMP_ON_SIGNAL", 0, 0, 1,
              "1: SIGUSR1 writes every communicator's flight recorder to the log");

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cfxComm *registry;

static const char *state_names[] = {"queued", "running", "done", "failed"};

cfxResult_t cfx_core_flight_init(struct cfxComm *comm)
{
    int64_t size = param_flight_recorder();
    if (size <= 0)
        return cfxSuccess;
    if (size > 1 << 16)
        size = 1 << 16;
    /* Room for a power of two entries, so that an index finds its entry
     * with a mask on every call; the dump shows the last `size`. */
    uint64_t room = 1;
    while (room < (uint64_t)size)
        room *= 2;
    comm->flight = calloc((size_t)room, sizeof(*comm->flight));
    if (comm->flight == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_INIT, "out of memory for the flight recorder");
    comm->flight_size = (int)size;
    comm->flight_mask = room - 1;
    cfx_time_ticks_origin_init(&comm->flight_origin);
    return cfxSuccess;
}

void cfx_core_flight_fini(struct cfxComm *comm)
{
    free(comm->flight);
    comm->flight = NULL;
    comm->flight_size = 0;
    comm->flight_mask = 0;
}

uint64_t cfx_core_flight_record(struct cfxComm *comm, const struct cfx_fingerprint *print)
{
    uint64_t index = comm->flight_count++;
    if (comm->flight_size == 0)
        return index;
    struct cfx_flight_entry *e = &comm->flight[index & comm->flight_mask];
    *e = (struct cfx_flight_entry){.print = *print,
                                   .state = CFX_FLIGHT_QUEUED,
                                   .start_ticks = cfx_time_ticks(&comm->flight_origin)};
    return index;
}

void cfx_core_flight_update(struct cfxComm *comm, uint64_t index, enum cfx_flight_state state,
                            cfxResult_t result, uint64_t step, uint64_t n_steps)
{
    if (comm->flight_size == 0 || index + comm->flight_mask + 1 < comm->flight_count)
        return; /* Overwritten by newer operations. */
    struct cfx_flight_entry *e = &comm->flight[index & comm->flight_mask];
    e->state = state;
    e->result = result;
    e->step = step;
    e->n_steps = n_steps;
    if (state == CFX_FLIGHT_DONE || state == CFX_FLIGHT_FAILED)
        e->end_ticks = cfx_time_ticks(&comm->flight_origin);
}

static void dump_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void dump_line(const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (cfx_log_level_value < 0)
        cfx_log_init();
    cfx_log(CFX_LOG_WARN, CFX_LOG_COLL, __FILE__, __LINE__, "%s", text);
}

/* Writes the recorder of @p comm; its lines carry the communicator's rank
 * whichever thread writes them (the SIGUSR1 thread has none of its own). */
void cfx_core_flight_dump(struct cfxComm *comm, const char *why)
{
    int thread_rank = cfx_log_set_rank(comm->rank);
    uint64_t count = comm->flight_count;
    uint64_t shown = count < (uint64_t)comm->flight_size ? count : (uint64_t)comm->flight_size;
    dump_line("flight recorder of comm %p rank %d of %d (%s): last %llu of %llu operations",
              (void *)comm, comm->rank, comm->nranks, why, (unsigned long long)shown,
              (unsigned long long)count);
    double ms_per_tick = cfx_time_ns_per_tick(&comm->flight_origin) / 1e6;
    uint64_t now = cfx_time_ticks(&comm->flight_origin);
    for (uint64_t i = count - shown; i < count; i++) {
        const struct cfx_flight_entry *e = &comm->flight[i & comm->flight_mask];
        char what[160];
        cfx_coll_print_format(&e->print, what, sizeof(what));
        double age_ms = (double)(int64_t)(now - e->start_ticks) * ms_per_tick;
        /* Only an operation that ended has a duration. */
        char took[48] = "";
        if (e->end_ticks != 0)
            snprintf(took, sizeof(took), ", took %.3f ms",
                     (double)(int64_t)(e->end_ticks - e->start_ticks) * ms_per_tick);
        dump_line("  %s: %s, step %llu/%llu, started %.3f ms ago%s%s%s", what,
                  state_names[e->state], (unsigned long long)e->step,
                  (unsigned long long)e->n_steps, age_ms, took,
                  e->state == CFX_FLIGHT_FAILED ? ", " : "",
                  e->state == CFX_FLIGHT_FAILED ? cfxGetErrorString(e->result) : "");
    }
    cfx_log_set_rank(thread_rank);
}

/* ------------------------------------------------ SIGUSR1 and the registry */

static int signal_pipe[2] = {-1, -1};

static void on_signal(int signo)
{
    (void)signo;
    int saved = errno;
    char byte = 1;
    if (write(signal_pipe[1], &byte, 1) < 0) {
        /* Nothing to do in a handler; a dump is lost. */
    }
    errno = saved;
}

static void *dump_thread(void *arg)
{
    (void)arg;
    char byte;
    while (read(signal_pipe[0], &byte, 1) > 0 || errno == EINTR) {
        pthread_mutex_lock(&registry_lock);
        for (struct cfxComm *c = registry; c; c = c->registry_next)
            cfx_core_flight_dump(c, "SIGUSR1");
        pthread_mutex_unlock(&registry_lock);
    }
    return NULL;
}

static void install_signal_once(void)
{
    if (pipe(signal_pipe) != 0)
        return;
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&thread, &attr, dump_thread, NULL) == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_signal;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGUSR1, &sa, NULL);
    }
    pthread_attr_destroy(&attr);
}

void cfx_core_registry_add(struct cfxComm *comm)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    if (param_dump_on_signal())
        pthread_once(&once, install_signal_once);
    pthread_mutex_lock(&registry_lock);
    comm->registry_next = registry;
    registry = comm;
    pthread_mutex_unlock(&registry_lock);
}

void cfx_core_registry_remove(struct cfxComm *comm)
{
    pthread_mutex_lock(&registry_lock);
    for (struct cfxComm **link = &registry; *link; link = &(*link)->registry_next)
        if (*link == comm) {
            *link = comm->registry_next;
            break;
        }
    pthread_mutex_unlock(&registry_lock);
}
