/*
 * The shm transport's connect info: the receiver tells the sender where its
 * FIFO is. The check is pure, so the fuzzer (fuzz/fuzz_shm_info.c) calls it
 * with any bytes: a sender opens only a Conflux segment name, and takes a
 * process-local address only from a peer in its own process.
 */
#ifndef CFX_TRANSPORTS_SHM_WIRE_H
#define CFX_TRANSPORTS_SHM_WIRE_H

#include <stdint.h>
#include <string.h>

#include "transports/transport.h"

#define CFX_SHM_NAME_PREFIX "/cfx-"

enum cfx_shm_kind { CFX_SHM_KIND_NONE = 0, CFX_SHM_KIND_SEGMENT = 1, CFX_SHM_KIND_LOCAL = 2 };

struct cfx_shm_info {
    uint32_t kind; /* enum cfx_shm_kind */
    uint32_t reserved;
    uint64_t bytes;      /* Size of the FIFO block. */
    uint64_t local_addr; /* CFX_SHM_KIND_LOCAL: the FIFO's address in this process. */
    char name[64];       /* CFX_SHM_KIND_SEGMENT: the segment's name. */
};
_Static_assert(sizeof(struct cfx_shm_info) <= CFX_CONNECT_INFO_BYTES, "info too large");

/* Why a sender refuses the receiver's info, or NULL. @p expect_bytes: the
 * FIFO size this sender's geometry gives; @p same_process: the receiver is
 * a thread of this process. */
static inline const char *cfx_shm_info_refusal(const struct cfx_shm_info *info,
                                               uint64_t expect_bytes, int same_process)
{
    if (info->kind == CFX_SHM_KIND_LOCAL) {
        if (!same_process)
            return "a process-local FIFO from another process";
        if (info->local_addr == 0 || info->local_addr % 4096 != 0)
            return "a FIFO address that is not page aligned";
    } else if (info->kind == CFX_SHM_KIND_SEGMENT) {
        const char *end = memchr(info->name, '\0', sizeof(info->name));
        size_t prefix = sizeof(CFX_SHM_NAME_PREFIX) - 1;
        if (end == NULL)
            return "a segment name without an end";
        if ((size_t)(end - info->name) <= prefix ||
            memcmp(info->name, CFX_SHM_NAME_PREFIX, prefix) != 0)
            return "a segment name that is not Conflux's";
        if (memchr(info->name + 1, '/', (size_t)(end - info->name) - 1) != NULL)
            return "a segment name with a path in it";
    } else {
        return "no FIFO description";
    }
    if (info->bytes != expect_bytes)
        return "a FIFO of another size (CFX_BUFFSIZE or CFX_STEPS differ between ranks?)";
    return NULL;
}

#endif /* CFX_TRANSPORTS_SHM_WIRE_H */
