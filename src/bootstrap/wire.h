/*
 * Bootstrap wire formats. Everything that crosses a bootstrap socket is one
 * of these fixed-size frames (plus, for messages, a payload whose length the
 * header gives and the receiver checks against what it expects). Fields are
 * in host order: the bootstrap connects processes of one build, and the magic
 * catches anything else.
 */
#ifndef CFX_BOOTSTRAP_WIRE_H
#define CFX_BOOTSTRAP_WIRE_H

#include <stdint.h>

#include "src/bootstrap/bootstrap.h"
#include "src/util/socket.h"

#define CFX_BOOTSTRAP_MAGIC     UINT64_C(0x43464c5842535031) /* "CFLXBSP1" */
#define CFX_BOOTSTRAP_MAX_RANKS (1 << 20)

/* The unique id's contents (fits in CFX_UNIQUE_ID_BYTES). */
struct cfx_bootstrap_id {
    uint64_t magic;
    uint64_t secret;
    uint32_t flags;
    uint32_t reserved;
    struct cfx_sockaddr_wire root;
};

/* Rank -> root: who I am and where I listen. */
struct cfx_bootstrap_hello {
    uint64_t magic;
    uint64_t secret;
    int32_t rank;
    int32_t nranks;
    struct cfx_sockaddr_wire listen_addr;
    /* With CFX_COMM_ID: the nonce the root got from the rank 0 that started
     * it, sent only by that rank 0; 0 from everyone else. A rank 0 without
     * it is the rank 0 of another job that uses the same CFX_COMM_ID. */
    uint64_t owner_nonce;
};

enum cfx_bootstrap_status {
    CFX_BOOTSTRAP_OK = 0,
    CFX_BOOTSTRAP_MISSING = 1,  /* Table lists who arrived (family 0 = missing). */
    CFX_BOOTSTRAP_CONFLICT = 2, /* A rank claimed twice, or nranks disagreed: no table. */
    CFX_BOOTSTRAP_COMPLETE = 3, /* Every seat was already taken: no table. */
    CFX_BOOTSTRAP_NO_FDS = 4,   /* The root ran out of file descriptors: no table. */
};

/* Root -> rank; a table of nranks cfx_sockaddr_wire entries follows for
 * CFX_BOOTSTRAP_OK and CFX_BOOTSTRAP_MISSING only. nranks echoes the
 * rank's own count, so a refusal always reaches its reader. */
struct cfx_bootstrap_reply {
    uint64_t magic;
    uint32_t status;
    int32_t nranks;
    int32_t conflict_rank;   /* CONFLICT: the rank claimed twice, -1 when nranks disagreed. */
    int32_t conflict_nranks; /* CONFLICT: the other claim's nranks; COMPLETE: the job's. */
};

enum cfx_bootstrap_kind {
    CFX_BOOTSTRAP_KIND_RING = 1,    /* A ring connection from the previous rank. */
    CFX_BOOTSTRAP_KIND_MESSAGE = 2, /* One message, then the connection closes. */
};

/* Rank -> rank, on connecting to a listener. */
struct cfx_bootstrap_peer_hdr {
    uint64_t magic;
    uint64_t secret;
    uint32_t kind;
    int32_t src_rank;
    uint32_t tag;
    uint32_t reserved;
    uint64_t size;
};

/*
 * Checks of frames that arrive from outside the process. Each is pure (the
 * fuzzer in fuzz/fuzz_bootstrap.c calls them with any bytes) and returns why
 * the frame is refused, or NULL to accept it.
 */

/* The root, given a complete hello; @p nranks_known is the count earlier
 * ranks gave (0 before the first). A duplicate rank is the caller's check. */
static inline const char *cfx_bootstrap_hello_refusal(const struct cfx_bootstrap_hello *hello,
                                                      uint64_t secret, int nranks_known)
{
    if (hello->magic != CFX_BOOTSTRAP_MAGIC)
        return "bad magic (not a Conflux rank)";
    if (hello->secret != secret)
        return "wrong secret (not a rank of this communicator)";
    if (hello->nranks < 1 || hello->nranks > CFX_BOOTSTRAP_MAX_RANKS)
        return "rank count out of range";
    if (hello->rank < 0 || hello->rank >= hello->nranks)
        return "rank out of range";
    if (hello->listen_addr.family != AF_INET && hello->listen_addr.family != AF_INET6)
        return "listener address of an unknown family";
    if (nranks_known != 0 && hello->nranks != nranks_known)
        return "nranks disagrees with the other ranks";
    return NULL;
}

/* A rank, given the header of a connection to its listener. @p ring_connected:
 * the ring link from the previous rank already exists. */
static inline const char *cfx_bootstrap_peer_hdr_refusal(const struct cfx_bootstrap_peer_hdr *hdr,
                                                         uint64_t secret, int rank, int nranks,
                                                         int ring_connected)
{
    if (hdr->magic != CFX_BOOTSTRAP_MAGIC)
        return "bad magic";
    if (hdr->secret != secret)
        return "wrong secret";
    if (hdr->src_rank < 0 || hdr->src_rank >= nranks)
        return "source rank out of range";
    if (hdr->kind == CFX_BOOTSTRAP_KIND_RING &&
        (hdr->src_rank != (rank + nranks - 1) % nranks || ring_connected))
        return "ring connection from an unexpected rank";
    if (hdr->kind == CFX_BOOTSTRAP_KIND_MESSAGE && hdr->size > CFX_BOOTSTRAP_MAX_MESSAGE_BYTES)
        return "message larger than the bootstrap accepts";
    if (hdr->kind != CFX_BOOTSTRAP_KIND_RING && hdr->kind != CFX_BOOTSTRAP_KIND_MESSAGE)
        return "unknown kind";
    return NULL;
}

/* A rank, given the root's answer to its hello (the table of @p nranks
 * addresses follows it). */
static inline const char *cfx_bootstrap_reply_refusal(const struct cfx_bootstrap_reply *reply,
                                                      int nranks)
{
    if (reply->magic != CFX_BOOTSTRAP_MAGIC)
        return "bad magic";
    if (reply->status > CFX_BOOTSTRAP_NO_FDS)
        return "unknown status";
    if (reply->nranks != nranks)
        return "a table for another rank count";
    return NULL;
}

/* How long a connecting peer may take to send its greeting, in ns. */
int64_t cfx_bootstrap_frame_ns(void);

/* Start a CFX_COMM_ID root: a thread that serves one communicator's join
 * on @p listen_fd, then closes it and exits. Takes ownership of listen_fd.
 * @p owner_nonce: the nonzero value only the rank 0 that starts it sends
 * (see struct cfx_bootstrap_hello). @p settle_ns: how long a full job waits
 * before the root answers, so that a second job on the same CFX_COMM_ID
 * shows itself by a duplicate claim. */
cfxResult_t cfx_bootstrap_root_start(int listen_fd, uint64_t secret, uint64_t owner_nonce,
                                     int64_t settle_ns);

/* Register an id of cfxGetUniqueId with secret @p secret at this process's
 * shared root listening on @p addr (port 0), started on first use; *root_p
 * gets the root's address. The id is forgotten once its communicator is
 * answered, or CFX_BOOTSTRAP_TIMEOUT after its creation if no rank comes;
 * the root closes its listener and ends its thread once no id is left. */
cfxResult_t cfx_bootstrap_root_add_id(const union cfx_sockaddr *addr, uint64_t secret,
                                      struct cfx_sockaddr_wire *root_p);

/* How long a CFX_COMM_ID root waits, once full, for duplicate claims, in ns. */
int64_t cfx_bootstrap_settle_ns(void);

#endif /* CFX_BOOTSTRAP_WIRE_H */
