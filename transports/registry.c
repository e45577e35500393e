/* The transports, in priority order: the first whose can_connect accepts a
 * pair of ranks carries their connection. */
#include "transports/faulty/faulty.h"
#include "transports/shm/shm.h"
#include "transports/socket/socket.h"
#include "transports/transport.h"

const struct cfx_transport *const cfx_transports[] = {
    &cfx_faulty_transport, /* Must be first: accepts nothing unless CFX_FAULT is set. */
    &cfx_shm_transport,
    &cfx_socket_transport,
    NULL,
};
