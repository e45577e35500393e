/* The verbs RDMA transport (InfiniBand, RoCE) between hosts; see ib.c. */
#ifndef CFX_TRANSPORTS_IB_IB_H
#define CFX_TRANSPORTS_IB_IB_H

#include "transports/transport.h"

extern const struct cfx_transport cfx_ib_transport;

#endif /* CFX_TRANSPORTS_IB_IB_H */
