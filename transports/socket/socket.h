/* The TCP socket transport: any two ranks that can reach each other. */
#ifndef CFX_TRANSPORTS_SOCKET_H
#define CFX_TRANSPORTS_SOCKET_H

#include "transports/transport.h"

extern const struct cfx_transport cfx_socket_transport;

#endif /* CFX_TRANSPORTS_SOCKET_H */
