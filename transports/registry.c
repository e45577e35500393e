/* The transports, in priority order: the first whose can_connect accepts a
 * pair of ranks carries their connection. */
#include "transports/faulty/faulty.h"
#include "transports/ib/ib.h"
#include "transports/net/net.h"
#include "transports/p2p/p2p.h"
#include "transports/shm/shm.h"
#include "transports/socket/socket.h"
#include "transports/transport.h"

const struct cfx_transport *const cfx_transports[] = {
    &cfx_faulty_transport, /* Must be first: accepts nothing unless CFX_FAULT is set. */
    &cfx_p2p_transport,    /* GPU ranks of one host whose GPUs reach each other. */
    &cfx_shm_transport,
    &cfx_net_plugin_transport, /* Between hosts, only when CFX_NET_PLUGIN names a plugin. */
    &cfx_ib_transport,         /* Between hosts, when a verbs device is usable. */
    &cfx_socket_transport,
    NULL,
};
