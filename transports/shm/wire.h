/*
 * The shm transport's connect info: the receiver tells the sender where its
 * FIFO is; the sender tells the receiver where to find a known word in its
 * memory, which the receiver reads once to learn whether it may read the
 * sender's memory directly (the single-copy path). The check is pure, so the fuzzer
 * (fuzz/fuzz_shm_info.c) calls it with any bytes: a sender opens only a descriptor of the peer's
 * own process (never a path the peer chose), and takes a process-local address only from a peer in
 * its own process.
 */
#ifndef CFX_TRANSPORTS_SHM_WIRE_H
#define CFX_TRANSPORTS_SHM_WIRE_H

#include <stdint.h>
#include <string.h>

#include "transports/transport.h"

enum cfx_shm_kind { CFX_SHM_KIND_NONE = 0, CFX_SHM_KIND_MEMFD = 1, CFX_SHM_KIND_LOCAL = 2 };

struct cfx_shm_info {
    uint32_t kind;        /* enum cfx_shm_kind */
    uint32_t flags;       /* CFX_SHM_FLAG_*. */
    uint64_t bytes;       /* Size of the FIFO block. */
    uint64_t local_addr;  /* CFX_SHM_KIND_LOCAL: the FIFO's address in this process. */
    int32_t pid;          /* CFX_SHM_KIND_MEMFD: the receiver's process ... */
    int32_t fd;           /* ... and its descriptor of the FIFO (open until the sender maps it). */
    uint64_t probe_addr;  /* Sender: the address of a word in its memory ... */
    uint64_t probe_value; /* ... and the word, for the receiver's trial read. */
};
_Static_assert(sizeof(struct cfx_shm_info) <= CFX_CONNECT_INFO_BYTES, "info too large");

/* The FIFO has LL slots after its payload slots (transports/shm/shm.c). */
#define CFX_SHM_FLAG_LL 1u

/* Why a sender refuses the receiver's info, or NULL. @p expect_bytes: the
 * FIFO size this sender's geometry gives; @p expect_pid: the receiver's
 * process id as the bootstrap gave it; @p same_process: the receiver is a
 * thread of this process. */
static inline const char *cfx_shm_info_refusal(const struct cfx_shm_info *info,
                                               uint64_t expect_bytes, int expect_pid,
                                               int same_process)
{
    if (info->kind == CFX_SHM_KIND_LOCAL) {
        if (!same_process)
            return "a process-local FIFO from another process";
        if (info->local_addr == 0 || info->local_addr % 4096 != 0)
            return "a FIFO address that is not page aligned";
    } else if (info->kind == CFX_SHM_KIND_MEMFD) {
        if (same_process)
            return "a shared FIFO from a thread of this process";
        if (info->pid <= 0 || info->pid != expect_pid)
            return "a FIFO held by another process than the peer's";
        if (info->fd < 0)
            return "a negative file descriptor";
    } else {
        return "no FIFO description";
    }
    if (info->flags & ~CFX_SHM_FLAG_LL)
        return "unknown flags";
    if (info->bytes != expect_bytes)
        return "a FIFO of another size (CFX_BUFFSIZE or CFX_STEPS differ between ranks?)";
    return NULL;
}

#endif /* CFX_TRANSPORTS_SHM_WIRE_H */
