/*
 * The interface's own helpers, over any transport's table: the network
 * choice (CFX_NET), peer mappings and placement checks. Transports and the
 * core both call them; they know no transport by name (the list is in
 * registry.c, above the transports).
 */
#include "transports/transport.h"

#include <stdlib.h>
#include <strings.h>

#include "src/util/cuda.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"

const char cfx_reg_any_host = 0;

/* Any name: "IB" and "Socket" (any case) are Conflux's own networks, any
 * other is checked against the loaded net plugin's when a communicator
 * spans hosts (transports/net/net.c). */
CFX_PARAM_STR(net, "NET", "",
              "Network between hosts, by name as NCCL_NET: IB (verbs only), Socket (TCP only), "
              "or the name of the net plugin CFX_NET_PLUGIN loads; unset: a plugin if one is "
              "loaded, else verbs where usable, else sockets");

/* CFX_NET_GDR_LEVEL's value as a path class (-1: LOC, never), or -2 when
 * it is none of NCCL's names. */
static int gdr_level_of(const char *text)
{
    static const struct {
        const char *name;
        int level;
    } levels[] = {{"LOC", -1},
                  {"PIX", CFX_PATH_CLASS_PIX},
                  {"PXB", CFX_PATH_CLASS_PXB},
                  {"PHB", CFX_PATH_CLASS_PHB},
                  {"SYS", CFX_PATH_CLASS_SYS}};
    for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
        if (strcasecmp(text, levels[i].name) == 0)
            return levels[i].level;
    return -2;
}

static const char *check_gdr_level(const char *text, char *buf, size_t len)
{
    (void)buf;
    (void)len;
    return gdr_level_of(text) == -2 ? "expected one of LOC, PIX, PXB, PHB, SYS" : NULL;
}

CFX_PARAM_STR_CHECKED(net_gdr_level, "NET_GDR_LEVEL", "PXB", check_gdr_level,
                      "GPUDirect RDMA: used when the path from a GPU rank's GPU to its NIC is at "
                      "most this (LOC: never, PIX, PXB, PHB, SYS: always; NCCL's names)");

int cfx_transport_gdr_level(void)
{
    return gdr_level_of(param_net_gdr_level()); /* Checked when read (params): never -2. */
}

CFX_PARAM_INT(dmabuf_enable, "DMABUF_ENABLE", 1, 0, 1,
              "GPUDirect RDMA: 0 never registers device memory as a dma-buf (nvidia-peermem, "
              "when loaded, still can; a net plugin gets regMr of CUDA memory instead)");

int cfx_transport_dmabuf_enable(void)
{
    return (int)param_dmabuf_enable();
}

enum cfx_net_choice cfx_transport_net_choice(void)
{
    const char *text = param_net();
    if (text == NULL || text[0] == '\0')
        return CFX_NET_ANY;
    return strcasecmp(text, "IB") == 0       ? CFX_NET_IB
           : strcasecmp(text, "Socket") == 0 ? CFX_NET_SOCKET
                                             : CFX_NET_NAMED;
}

const char *cfx_transport_net_name(void)
{
    const char *text = param_net();
    return text ? text : "";
}

cfxResult_t cfx_conn_map_peer(struct cfx_connector *conn, uint64_t remote, size_t bytes,
                              void **ptr_p)
{
    const struct cfx_transport *tr = conn->transport;
    if (!(tr->flags & CFX_TRANSPORT_FLAG_PEER_MAP) || tr->map_peer == NULL)
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_INIT,
                             "%s: cannot map rank %d's memory into this rank (the transport does "
                             "not offer peer mappings)",
                             tr->name, conn->peer_rank);
    return tr->map_peer(conn->transport_ctx, conn, remote, bytes, ptr_p);
}

cfxResult_t cfx_transport_place_check(const struct cfx_transport *tr,
                                      const struct cfx_conn_place *place)
{
    if (place->mem == CFX_MEM_DEVICE && !(tr->flags & CFX_TRANSPORT_FLAG_PLACE_DEVICE))
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_INIT,
                             "%s: cannot place a FIFO in device memory (device %d)", tr->name,
                             place->device);
    if (place->reader == CFX_READER_KERNEL && !(tr->flags & CFX_TRANSPORT_FLAG_READER_KERNEL))
        return cfx_error_set(cfxInvalidUsage, CFX_LOG_INIT,
                             "%s: cannot have a FIFO read by a kernel on device %d", tr->name,
                             place->device);
    return cfxSuccess;
}

cfxResult_t cfx_connector_stage_init(struct cfx_connector *conn, int device)
{
    /* A payload slot, or an LL slot's words (src/conn/fifo.h), whichever is larger. */
    size_t bytes = conn->slot_bytes > CFX_LL_SLOT_BYTES ? conn->slot_bytes : CFX_LL_SLOT_BYTES;
    void *stage = NULL;
    if (posix_memalign(&stage, 4096, bytes) != 0)
        return cfx_error_set(cfxSystemError, CFX_LOG_ALLOC,
                             "out of memory for a %zu-byte staging slot (connection with rank %d)",
                             bytes, conn->peer_rank);
    memset(stage, 0, bytes); /* Touch every page now, never on the data path. */
    cfxResult_t res = cfx_cuda_host_register(stage, bytes, device);
    if (res != cfxSuccess) {
        free(stage);
        return res;
    }
    void *stream = NULL;
    res = cfx_cuda_copy_stream_create(device, &stream);
    if (res != cfxSuccess) {
        cfx_cuda_host_unregister(stage, device);
        free(stage);
        return res;
    }
    conn->stage = stage;
    conn->stage_stream = stream;
    conn->slots_device = device + 1;
    return cfxSuccess;
}

cfxResult_t cfx_connector_ll_stage_init(struct cfx_connector *conn)
{
    void *stage = NULL;
    if (posix_memalign(&stage, 4096, CFX_LL_SLOT_BYTES) != 0)
        return cfx_error_set(cfxSystemError, CFX_LOG_ALLOC,
                             "out of memory for an LL staging slot (connection with rank %d)",
                             conn->peer_rank);
    memset(stage, 0, CFX_LL_SLOT_BYTES); /* Touch every page now, never on the data path. */
    conn->stage = stage;
    return cfxSuccess;
}

void cfx_connector_stage_fini(struct cfx_connector *conn)
{
    if (conn->stage == NULL)
        return;
    if (conn->slots_device != 0) {
        int device = conn->slots_device - 1;
        cfx_cuda_copy_stream_destroy(conn->stage_stream, device);
        cfx_cuda_host_unregister(conn->stage, device);
    }
    free(conn->stage);
    conn->stage = NULL;
    conn->stage_stream = NULL;
    conn->slots_device = 0;
}
