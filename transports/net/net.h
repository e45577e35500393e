/* NCCL net plugins (CFX_NET_PLUGIN) as a transport between hosts; see net.c. */
#ifndef CFX_TRANSPORTS_NET_NET_H
#define CFX_TRANSPORTS_NET_NET_H

#include "transports/transport.h"

extern const struct cfx_transport cfx_net_plugin_transport;

#endif /* CFX_TRANSPORTS_NET_NET_H */
