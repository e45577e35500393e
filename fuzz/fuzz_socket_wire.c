/*
 * The socket transport's wire (transports/socket/wire.h): connect info,
 * hellos on freshly accepted sockets, and a stream of slot headers with
 * poison headers among them. The first byte picks which.
 */
#include "fuzz/fuzz.h"
#include "transports/socket/wire.h"

static void connect_info(struct fuzz_input *in)
{
    enum cfx_conn_dir dir = (fuzz_u8(in) & 1) ? CFX_CONN_RECV : CFX_CONN_SEND;
    int peer_rank = (int)(fuzz_u32(in) & 0x7fffffff);
    struct cfx_sock_info info;
    fuzz_take(in, &info, sizeof(info));
    if (cfx_sock_info_refusal(&info, dir, peer_rank) != NULL)
        return;
    FUZZ_CHECK(info.rank == peer_rank);
    if (dir == CFX_CONN_SEND) {
        union cfx_sockaddr addr;
        FUZZ_CHECK(info.magic == CFX_SOCK_INFO_MAGIC_RECV);
        FUZZ_CHECK(info.nsocks >= 1 && info.nsocks <= CFX_SOCK_MAX_SOCKS);
        FUZZ_CHECK(cfx_socket_addr_from_wire(&info.addr, &addr) == cfxSuccess);
    } else {
        FUZZ_CHECK(info.magic == CFX_SOCK_INFO_MAGIC_SEND);
    }
}

/* Hellos for one awaiting connector, attached by index as socket.c does. */
static void hellos(struct fuzz_input *in)
{
    int peer_rank = (int)(fuzz_u32(in) & 0x7fffffff);
    int nsocks = (int)(fuzz_u8(in) % CFX_SOCK_MAX_SOCKS) + 1;
    int fds[CFX_SOCK_MAX_SOCKS];
    for (int s = 0; s < CFX_SOCK_MAX_SOCKS; s++)
        fds[s] = -1;
    int arrived = 0;
    while (in->size > 0 && arrived < nsocks) {
        struct cfx_sock_hello hello;
        fuzz_take(in, &hello, sizeof(hello));
        if (cfx_sock_hello_refusal(&hello, peer_rank, nsocks) != NULL)
            continue;
        FUZZ_CHECK(hello.index < (uint32_t)nsocks);
        if (fds[hello.index] >= 0)
            continue; /* A second socket with that index: a stranger. */
        fds[hello.index] = arrived++;
    }
}

/* Slot headers in order, as the receiver's socket 0 reads them. */
static void headers(struct fuzz_input *in)
{
    size_t slot_bytes = (size_t)(fuzz_u32(in) % (64u << 20)) + 1;
    uint64_t step = fuzz_u32(in);
    while (in->size > 0) {
        struct cfx_sock_header header;
        fuzz_take(in, &header, sizeof(header));
        if (cfx_sock_header_refusal(&header, step, slot_bytes) != NULL)
            return; /* The connector fails. */
        if (header.magic == CFX_SOCK_POISON_MAGIC) {
            int blame;
            cfxResult_t reason = cfx_sock_poison_decode(&header, &blame);
            FUZZ_CHECK(reason == cfxInvalidUsage || reason == cfxTimeout ||
                       reason == cfxRemoteError);
            FUZZ_CHECK(blame >= -1);
            return; /* Nothing follows a poison header. */
        }
        FUZZ_CHECK(header.size <= slot_bytes && header.step == (uint32_t)step);
        step++;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_input in = {data, size};
    switch (fuzz_u8(&in) % 3) {
    case 0: connect_info(&in); break;
    case 1: hellos(&in); break;
    default: headers(&in); break;
    }
    return 0;
}
