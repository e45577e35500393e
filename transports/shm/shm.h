/* The shared-memory transport: ranks on the same host (host buffers). */
#ifndef CFX_TRANSPORTS_SHM_H
#define CFX_TRANSPORTS_SHM_H

#include "transports/transport.h"

extern const struct cfx_transport cfx_shm_transport;

#endif /* CFX_TRANSPORTS_SHM_H */
