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

#define CFX_BOOTSTRAP_MAGIC UINT64_C(0x43464c5842535031) /* "CFLXBSP1" */
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
};

enum cfx_bootstrap_status {
    CFX_BOOTSTRAP_OK = 0,
    CFX_BOOTSTRAP_MISSING = 1, /* Table lists who arrived (family 0 = missing). */
    CFX_BOOTSTRAP_CONFLICT = 2 /* nranks disagreed. */
};

/* Root -> rank, followed by nranks cfx_sockaddr_wire entries. */
struct cfx_bootstrap_reply {
    uint64_t magic;
    uint32_t status;
    int32_t nranks;
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

/* How long a connecting peer may take to send its greeting, in ns. */
int64_t cfx_bootstrap_frame_ns(void);

/* Root thread entry: serves one communicator's join on @p listen_fd, then
 * closes it and exits. Takes ownership of listen_fd. */
cfxResult_t cfx_bootstrap_root_start(int listen_fd, uint64_t secret);

#endif /* CFX_BOOTSTRAP_WIRE_H */
