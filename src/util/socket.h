/*
 * TCP sockets for the bootstrap and the socket transport: addresses,
 * interface choice (CFX_SOCKET_IFNAME, NCCL syntax), listen/connect/accept,
 * and whole-buffer send/recv bounded by a deadline and an abort flag.
 * Every wait polls in short slices so an abort is seen within ~100 ms.
 */
#ifndef CFX_UTIL_SOCKET_H
#define CFX_UTIL_SOCKET_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "conflux.h"

union cfx_sockaddr {
    struct sockaddr sa;
    struct sockaddr_in sin;
    struct sockaddr_in6 sin6;
};

/* Compact, fixed-size wire form of an address (for ids and frames). */
struct cfx_sockaddr_wire {
    uint16_t family; /* AF_INET or AF_INET6, host order. */
    uint16_t port;   /* Network order. */
    uint32_t scope_id;
    uint8_t addr[16];
};

void cfx_socket_addr_to_wire(const union cfx_sockaddr *addr, struct cfx_sockaddr_wire *wire_p);
/* cfxInvalidArgument for a family other than AF_INET/AF_INET6. */
cfxResult_t cfx_socket_addr_from_wire(const struct cfx_sockaddr_wire *wire,
                                      union cfx_sockaddr *addr_p);

/* "host:port", "[v6addr]:port" or "v6addr:port" -> address; resolves names. */
cfxResult_t cfx_socket_addr_parse(const char *text, union cfx_sockaddr *addr_p);
/* CFX_COMM_ID's check (a cfx_param_check_fn): an address that parses, with a
 * port other than 0 (every rank must know where the root listens). */
const char *cfx_socket_addr_param_check(const char *text, char *buf, size_t len);
/* "1.2.3.4:5678" or "[::1]:5678". */
void cfx_socket_addr_format(const union cfx_sockaddr *addr, char *text, size_t size);
socklen_t cfx_socket_addr_len(const union cfx_sockaddr *addr);

/* Whether @p ifname passes a CFX_SOCKET_IFNAME-style filter ("eth,ib",
 * "^docker", "=eth0", "^=eth1"). */
int cfx_socket_ifname_matches(const char *filter, const char *ifname);

/* The address to listen on, chosen by CFX_SOCKET_IFNAME; default: the first
 * up interface that is not loopback, else loopback. Port 0. */
cfxResult_t cfx_socket_pick_address(union cfx_sockaddr *addr_p, char *ifname, size_t ifname_size);

/* Listen on @p addr (port 0: any); *bound_p gets the actual address. On a
 * failed bind, errno is left as bind set it (EADDRINUSE: the port is taken). */
cfxResult_t cfx_socket_listen(const union cfx_sockaddr *addr, int *fd_p,
                              union cfx_sockaddr *bound_p);

/* Connect, retrying refused connections until the deadline. */
cfxResult_t cfx_socket_connect(const union cfx_sockaddr *addr, int64_t deadline_ns,
                               const int *abort_flag, int *fd_p);

/* Accept one connection before the deadline (cfxTimeout otherwise). */
cfxResult_t cfx_socket_accept(int listen_fd, int64_t deadline_ns, const int *abort_flag, int *fd_p);

/* Send/receive exactly @p size bytes. cfxRemoteError when the peer closes or
 * resets, cfxTimeout past the deadline, cfxSystemError for other failures;
 * the sentence names @p peer. abort_flag may be NULL. */
cfxResult_t cfx_socket_send_all(int fd, const void *buf, size_t size, int64_t deadline_ns,
                                const int *abort_flag, const char *peer);
cfxResult_t cfx_socket_recv_all(int fd, void *buf, size_t size, int64_t deadline_ns,
                                const int *abort_flag, const char *peer);

void cfx_socket_close(int *fd);

#endif /* CFX_UTIL_SOCKET_H */
