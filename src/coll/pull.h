/*
 * Single-copy schedules between ranks that read each other's memory (shm
 * connectors with peer_readable; see transports/shm/shm.c). Each is a
 * schedule of the FIFO path step for step, but a slot carries the address of
 * a chunk instead of the chunk: the receiver copies it straight from its
 * predecessor's buffer into its own output, and announces that copy to its
 * successor in turn. Each byte is copied once per receiving rank, instead of
 * into a slot and out again.
 *
 * The ring allgather and point to point use it. A read of another
 * process's memory (process_vm_readv) runs at 0.4-0.8 x memcpy on the
 * machines measured (the kernel pins every page it copies), so it wins only
 * where it saves a copy on the busiest rank: allgather saves one on every
 * rank (3 copies per byte to 2), a send/receive pair one of two (which is
 * what an all-to-all is made of), but broadcast's receivers copy once either
 * way, and the FIFO's two copies run at memcpy speed on two cores at once
 * (docs/performance.md).
 *
 * A rank's buffers are read by its successor after the rank returned from
 * its last data step, so the schedule ends with a ring of empty slots: each
 * rank sends one once its own reads are done and passes on what it
 * receives; after n-1 of them it knows every rank is done with its buffers,
 * its successor included, and may return.
 *   data steps (the base schedule's, flags turned):
 *     send -> send|addr, recv -> recv|pull
 *   then n steps: send, (recv|send) n-2 times, recv (all empty).
 */
#ifndef CFX_COLL_PULL_H
#define CFX_COLL_PULL_H

#include "src/coll/ring.h"

static inline CFX_HOST_DEVICE uint64_t cfx_pull_allgather_steps(const struct cfx_work *w)
{
    return cfx_ring_allgather_steps(w) + (uint64_t)w->nranks;
}

static inline CFX_HOST_DEVICE void
cfx_pull_allgather_describe(const struct cfx_work *w, uint64_t index, struct cfx_step *step)
{
    uint64_t data = cfx_ring_allgather_steps(w);
    if (index < data) {
        cfx_ring_allgather_describe(w, index, step);
        if (step->flags & CFX_PRIM_RECV)
            step->flags |= CFX_PRIM_PULL;
        if (step->flags & CFX_PRIM_SEND)
            step->flags |= CFX_PRIM_ADDR;
        return;
    }
    uint64_t k = index - data;
    step->flags =
        k == 0 ? CFX_PRIM_SEND
               : (k == (uint64_t)w->nranks - 1 ? CFX_PRIM_RECV : CFX_PRIM_RECV | CFX_PRIM_SEND);
    step->input = NULL;
    step->output = NULL;
    step->n_elems = 0;
}

/*
 * Point to point: the sender posts the address of each chunk of its buffer,
 * the receiver reads the chunk into its output and only then releases the
 * slot, and the sender's last step waits until every slot it posted is
 * released (CFX_PRIM_DRAIN): then its buffer is no longer read and the send
 * may complete. Chunks are CFX_PULL_P2P_CHUNK_BYTES (16 MiB): there is
 * nothing to forward, so one read per message is fastest up to there.
 * Both sides take this path together or not at all: the receiver publishes
 * its verdict and threshold in the FIFO both map (src/core/group.c).
 *   send: send|addr per chunk, then drain
 *   recv: recv|pull|out per chunk
 */
static inline CFX_HOST_DEVICE uint64_t cfx_pull_send_steps(const struct cfx_work *w)
{
    uint64_t chunks = cfx_work_chunks(w);
    return chunks > 0 ? chunks + 1 : 0; /* An empty send: nothing to drain. */
}

static inline CFX_HOST_DEVICE void cfx_pull_send_describe(const struct cfx_work *w, uint64_t index,
                                                          struct cfx_step *step)
{
    if (index == cfx_work_chunks(w)) {
        step->flags = CFX_PRIM_DRAIN;
        return;
    }
    uint64_t offset, len;
    cfx_work_chunk_of(w, index, &offset, &len);
    step->flags = CFX_PRIM_SEND | CFX_PRIM_ADDR;
    step->input = cfx_coll_at(w->sendbuff, offset, w->elem_bytes);
    step->n_elems = len;
}

static inline CFX_HOST_DEVICE void cfx_pull_recv_describe(const struct cfx_work *w, uint64_t index,
                                                          struct cfx_step *step)
{
    uint64_t offset, len;
    cfx_work_chunk_of(w, index, &offset, &len);
    step->flags = CFX_PRIM_RECV | CFX_PRIM_PULL | CFX_PRIM_OUT;
    step->output = cfx_coll_at(w->recvbuff, offset, w->elem_bytes);
    step->n_elems = len;
}

#define cfx_pull_recv_steps cfx_work_chunks

#endif /* CFX_COLL_PULL_H */
