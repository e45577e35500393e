/* The shared-memory transport: ranks on the same host (host buffers). */
#ifndef CFX_TRANSPORTS_SHM_H
#define CFX_TRANSPORTS_SHM_H

#include <stddef.h>

#include "transports/transport.h"

extern const struct cfx_transport cfx_shm_transport;

/*
 * The FIFO control block shared between two ranks of one host, for the
 * p2p transport, which keeps its control block (tail, head, info lines,
 * closed word) exactly as shm does and only its slots elsewhere. Its
 * per-connector state starts with shm's (conn->priv, CFX_SHM_CONN_BYTES),
 * and the context is one cfx_shm_transport.init made.
 */

/* Bytes of shm's per-connector state at the start of conn->priv. */
#define CFX_SHM_CONN_BYTES 64

/* shm's setup with a per-connector state of @p priv_bytes (at least
 * CFX_SHM_CONN_BYTES; the rest zeroed, the caller's) and, when
 * @p host_slots is 0, a control block without slots: the view's slots are
 * NULL until the caller points them somewhere. The connect info is a
 * struct cfx_shm_info (transports/shm/wire.h). */
cfxResult_t cfx_shm_fifo_setup(void *ctx, const struct cfx_transport_peer *peer, size_t slot_bytes,
                               int n_steps, struct cfx_connector *conn, void *info_out,
                               size_t priv_bytes, int host_slots);
/* shm's connect, close (frees conn->priv), poison and check. */
cfxResult_t cfx_shm_fifo_connect(void *ctx, struct cfx_connector *conn, const void *peer_info);
void cfx_shm_fifo_close(void *ctx, struct cfx_connector *conn);
void cfx_shm_fifo_poison(void *ctx, struct cfx_connector *conn, cfxResult_t reason, int blame_rank);
cfxResult_t cfx_shm_fifo_check(void *ctx, struct cfx_connector *conn);

#endif /* CFX_TRANSPORTS_SHM_H */
