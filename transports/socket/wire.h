/*
 * The socket transport's wire formats (docs/transports.md, "Wire format")
 * and the checks of everything that arrives from a peer: connect info,
 * hellos and slot headers. The checks are pure, so the fuzzer
 * (fuzz/fuzz_socket_wire.c) calls them with any bytes; each returns why a
 * frame is refused, or NULL. Fields are in host order: the magics catch a
 * peer of another build or byte order.
 */
#ifndef CFX_TRANSPORTS_SOCKET_WIRE_H
#define CFX_TRANSPORTS_SOCKET_WIRE_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "src/util/socket.h"
#include "transports/transport.h"

#define CFX_SOCK_MAX_SOCKS 16 /* Sockets per connection, at most. */

#define CFX_SOCK_INFO_MAGIC_RECV 0x52584643u /* "CFXR" */
#define CFX_SOCK_INFO_MAGIC_SEND 0x53584643u /* "CFXS" */
#define CFX_SOCK_HELLO_MAGIC     0x48584643u /* "CFXH" */
#define CFX_SOCK_HEADER_MAGIC    0x44584643u /* "CFXD" */
#define CFX_SOCK_POISON_MAGIC    0x50584643u /* "CFXP" */

/* Connect info (both directions; the sender's carries only magic and rank). */
struct cfx_sock_info {
    uint32_t magic;
    uint32_t nsocks;
    uint64_t conn_id;
    int32_t rank;
    uint32_t reserved;
    struct cfx_sockaddr_wire addr;
};
_Static_assert(sizeof(struct cfx_sock_info) == 48, "cfx_sock_info layout");
_Static_assert(sizeof(struct cfx_sock_info) <= CFX_CONNECT_INFO_BYTES, "info too large");

/* First bytes on every socket of a connection, sender -> receiver. */
struct cfx_sock_hello {
    uint32_t magic;
    int32_t rank; /* The sender's rank. */
    uint64_t conn_id;
    uint32_t index;
    uint32_t count;
};
_Static_assert(sizeof(struct cfx_sock_hello) == 24, "cfx_sock_hello layout");

/* Before each slot's part on socket 0. A header with the poison magic
 * instead ends the stream: the sender failed; size holds its cfxResult_t in
 * the low 32 bits and blame rank + 1 in the high 32. */
struct cfx_sock_header {
    uint32_t magic;
    uint32_t step; /* Low 32 bits of the slot's sequence number. */
    uint64_t size;
    struct cfx_fingerprint print;
    /* Point to point: the slot carries the bytes at `offset` of the
     * connector's message msg - 1 (0: not a message's slot), so a receive
     * that offered its buffer for that message takes them in place. */
    uint64_t msg;
    uint64_t offset;
};
_Static_assert(sizeof(struct cfx_sock_header) == 64, "cfx_sock_header layout");

/* The connect info a side of direction @p dir got from rank @p peer_rank:
 * a sender needs a receiver's (with a socket count it can open and an
 * address), a receiver a sender's. */
static inline const char *cfx_sock_info_refusal(const struct cfx_sock_info *info,
                                                enum cfx_conn_dir dir, int peer_rank)
{
    if (info->magic != (dir == CFX_CONN_SEND ? CFX_SOCK_INFO_MAGIC_RECV : CFX_SOCK_INFO_MAGIC_SEND))
        return "wrong magic";
    if (info->rank != peer_rank)
        return "wrong rank";
    if (dir == CFX_CONN_RECV)
        return NULL;
    if (info->nsocks < 1 || info->nsocks > CFX_SOCK_MAX_SOCKS)
        return "socket count out of range";
    if (info->addr.family != AF_INET && info->addr.family != AF_INET6)
        return "address of an unknown family";
    return NULL;
}

/* A complete hello, for the connector its conn_id names: from @p peer_rank,
 * which expects @p nsocks sockets. (Whether that index already arrived is
 * the caller's check.) */
static inline const char *cfx_sock_hello_refusal(const struct cfx_sock_hello *hello, int peer_rank,
                                                 int nsocks)
{
    if (hello->magic != CFX_SOCK_HELLO_MAGIC)
        return "not a Conflux socket-transport hello";
    if (hello->rank != peer_rank)
        return "hello from the wrong rank";
    if (hello->count != (uint32_t)nsocks)
        return "hello with the wrong socket count";
    if (hello->index >= hello->count)
        return "hello with a socket index out of range";
    return NULL;
}

/* The poison code and blame rank a poison header carries; a reason other
 * than the three a sender poisons with reads as cfxRemoteError, a blame
 * rank out of int's range as -1 (none). */
static inline cfxResult_t cfx_sock_poison_decode(const struct cfx_sock_header *header, int *blame_p)
{
    uint32_t code = (uint32_t)(header->size & 0xffffffffu);
    uint64_t blame = header->size >> 32; /* blame_rank + 1 */
    *blame_p = blame == 0 || blame > (uint64_t)INT_MAX ? -1 : (int)blame - 1;
    return code == cfxInvalidUsage ? cfxInvalidUsage
           : code == cfxTimeout    ? cfxTimeout
                                   : cfxRemoteError;
}

/* A slot header on socket 0, for slot @p step of a connector of
 * @p slot_bytes-byte slots. A poison header is not a refusal. */
static inline const char *cfx_sock_header_refusal(const struct cfx_sock_header *header,
                                                  uint64_t step, size_t slot_bytes)
{
    if (header->magic == CFX_SOCK_POISON_MAGIC)
        return NULL;
    if (header->magic != CFX_SOCK_HEADER_MAGIC)
        return "wrong magic";
    if (header->step != (uint32_t)step)
        return "out of order";
    if (header->size > slot_bytes)
        return "larger than a slot";
    return NULL;
}

#endif /* CFX_TRANSPORTS_SOCKET_WIRE_H */
