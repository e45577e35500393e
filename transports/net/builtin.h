/* The nets built into Conflux behind the net driver's interface (the
 * face in conn.h), chosen by CFX_NET_PLUGIN=builtin:<name> instead of a
 * library. Each is an ncclNet table of the version it names. */
#ifndef CFX_TRANSPORTS_NET_BUILTIN_H
#define CFX_TRANSPORTS_NET_BUILTIN_H

#include "transports/net/nccl_net.h"

/* TCP over the interface CFX_SOCKET_IFNAME picks (builtin_socket.c). */
extern const ncclNet_v9_t cfx_net_builtin_socket;
/* Verbs RDMA over the verbs transport's ports (transports/ib/net.c); NULL
 * in a build without the verbs headers. */
extern const ncclNet_v9_t *const cfx_net_builtin_ib;

#endif /* CFX_TRANSPORTS_NET_BUILTIN_H */
