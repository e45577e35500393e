/*
 * Communicator handles. A cfxComm_t is the address of its struct cfxComm,
 * and a program may still hold it after cfxCommDestroy (a second destroy, a
 * call from a thread that did not hear of it, an operation queued in a
 * group). So that such a handle is refused rather than read from freed
 * memory, a destroyed communicator keeps its header: its magic says dead and
 * its state closed, and the header goes to a quarantine instead of back to
 * malloc. A new communicator reuses the oldest header only once the
 * quarantine holds CFX_CORE_QUARANTINE of them, so a stale handle cannot
 * name a newer communicator until that many communicators were destroyed
 * after it. The quarantine is reachable (no leak reports) and bounded
 * (CFX_CORE_QUARANTINE headers).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "src/core/comm.h"

#define CFX_CORE_QUARANTINE 1024

static pthread_mutex_t quarantine_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cfxComm *quarantine_head; /* Oldest first. */
static struct cfxComm *quarantine_tail;
static int quarantine_count;

struct cfxComm *cfx_core_handle_alloc(void)
{
    struct cfxComm *comm = NULL;
    pthread_mutex_lock(&quarantine_lock);
    if (quarantine_count >= CFX_CORE_QUARANTINE) {
        comm = quarantine_head;
        quarantine_head = comm->quarantine_next;
        if (quarantine_head == NULL)
            quarantine_tail = NULL;
        quarantine_count--;
    }
    pthread_mutex_unlock(&quarantine_lock);
    if (comm == NULL)
        return calloc(1, sizeof(*comm));
    memset(comm, 0, sizeof(*comm));
    return comm;
}

void cfx_core_handle_retire(struct cfxComm *comm)
{
    __atomic_store_n(&comm->magic, CFX_COMM_DEAD, __ATOMIC_RELEASE);
    __atomic_store_n(&comm->active_calls, CFX_COMM_CLOSED, __ATOMIC_RELEASE);
    comm->quarantine_next = NULL;
    pthread_mutex_lock(&quarantine_lock);
    if (quarantine_tail)
        quarantine_tail->quarantine_next = comm;
    else
        quarantine_head = comm;
    quarantine_tail = comm;
    quarantine_count++;
    pthread_mutex_unlock(&quarantine_lock);
}
