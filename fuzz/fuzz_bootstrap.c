/*
 * Bootstrap frames (src/bootstrap/wire.h): the root's checks of hellos, a
 * rank's checks of peer headers and of the root's answer, and the unique id
 * a program hands to cfxCommInitRank. The first byte picks the frame.
 */
#include "fuzz/fuzz.h"
#include "src/bootstrap/bootstrap.h"
#include "src/bootstrap/wire.h"

/* A stream of hellos at a root, which admits or refuses each as root.c
 * does (the rank table is a bitmap here). */
static void hellos(struct fuzz_input *in)
{
    uint64_t secret;
    fuzz_take(in, &secret, sizeof(secret));
    int nranks = 0;
    uint8_t *joined = NULL;
    while (in->size > 0) {
        struct cfx_bootstrap_hello hello;
        fuzz_take(in, &hello, sizeof(hello));
        if (cfx_bootstrap_hello_refusal(&hello, secret, nranks) != NULL)
            continue;
        FUZZ_CHECK(hello.magic == CFX_BOOTSTRAP_MAGIC && hello.secret == secret);
        FUZZ_CHECK(hello.nranks >= 1 && hello.nranks <= CFX_BOOTSTRAP_MAX_RANKS);
        FUZZ_CHECK(hello.rank >= 0 && hello.rank < hello.nranks);
        FUZZ_CHECK(nranks == 0 || hello.nranks == nranks);
        if (nranks == 0) {
            nranks = hello.nranks;
            joined = calloc(((size_t)nranks + 7) / 8, 1);
            FUZZ_CHECK(joined != NULL);
        }
        joined[hello.rank / 8] |= (uint8_t)(1u << (hello.rank % 8));
    }
    free(joined);
}

static void peer_header(struct fuzz_input *in)
{
    uint64_t secret;
    fuzz_take(in, &secret, sizeof(secret));
    int nranks = (int)(fuzz_u32(in) % CFX_BOOTSTRAP_MAX_RANKS) + 1;
    int rank = (int)(fuzz_u32(in) % (uint32_t)nranks);
    int ring_connected = fuzz_u8(in) & 1;
    struct cfx_bootstrap_peer_hdr hdr;
    fuzz_take(in, &hdr, sizeof(hdr));
    if (cfx_bootstrap_peer_hdr_refusal(&hdr, secret, rank, nranks, ring_connected) != NULL)
        return;
    FUZZ_CHECK(hdr.src_rank >= 0 && hdr.src_rank < nranks);
    FUZZ_CHECK(hdr.kind == CFX_BOOTSTRAP_KIND_RING || hdr.kind == CFX_BOOTSTRAP_KIND_MESSAGE);
    if (hdr.kind == CFX_BOOTSTRAP_KIND_MESSAGE)
        FUZZ_CHECK(hdr.size <= CFX_BOOTSTRAP_MAX_MESSAGE_BYTES);
    else
        FUZZ_CHECK(!ring_connected && hdr.src_rank == (rank + nranks - 1) % nranks);
}

/* The root's answer and the address table after it. */
static void reply(struct fuzz_input *in)
{
    int nranks = (int)(fuzz_u32(in) % 64) + 1;
    struct cfx_bootstrap_reply r;
    fuzz_take(in, &r, sizeof(r));
    if (cfx_bootstrap_reply_refusal(&r, nranks) != NULL)
        return;
    FUZZ_CHECK(r.nranks == nranks);
    for (int i = 0; i < nranks; i++) {
        struct cfx_sockaddr_wire wire;
        union cfx_sockaddr addr;
        char text[80];
        fuzz_take(in, &wire, sizeof(wire));
        if (cfx_socket_addr_from_wire(&wire, &addr) != cfxSuccess)
            continue;
        cfx_socket_addr_format(&addr, text, sizeof(text));
        FUZZ_CHECK(memchr(text, '\0', sizeof(text)) != NULL);
    }
}

/* A unique id as a program passes it in. */
static void unique_id(struct fuzz_input *in)
{
    cfxUniqueId id;
    fuzz_take(in, id.internal, sizeof(id.internal));
    if (!cfx_bootstrap_id_valid(&id))
        return;
    struct cfx_bootstrap_id bid;
    memcpy(&bid, id.internal, sizeof(bid));
    union cfx_sockaddr addr;
    char text[80];
    if (cfx_socket_addr_from_wire(&bid.root, &addr) == cfxSuccess)
        cfx_socket_addr_format(&addr, text, sizeof(text));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_input in = {data, size};
    switch (fuzz_u8(&in) % 4) {
    case 0: hellos(&in); break;
    case 1: peer_header(&in); break;
    case 2: reply(&in); break;
    default: unique_id(&in); break;
    }
    return 0;
}
