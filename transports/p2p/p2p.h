/* The peer-memory transport: GPU ranks of one host, slots in the
 * receiver's device memory (transports/p2p/p2p.c). */
#ifndef CFX_TRANSPORTS_P2P_H
#define CFX_TRANSPORTS_P2P_H

#include "transports/transport.h"

extern const struct cfx_transport cfx_p2p_transport;

#endif /* CFX_TRANSPORTS_P2P_H */
