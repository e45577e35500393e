/*
 * Where ranks sit, for the transports: each rank's GPU (its PCI bus id) and
 * nearest network port, which every rank learns through the peer table at
 * init, and the path class between two ranks. Transports see the answers in
 * struct cfx_transport_peer (connect.c fills it) and never the topology
 * itself, so that they stay below src/topo. Pure functions of a topology:
 * setup time only.
 */
#include <stdio.h>
#include <string.h>

#include "src/core/comm.h"
#include "src/topo/topo.h"

/* The NET node nearest @p gpu (-1: a host rank, or a GPU the topology does
 * not know): the best path class from the GPU, then the fastest port, then
 * the first in node order. -1 when the host has no network port. */
static int nearest_net(const struct cfx_topo_system *sys, int gpu)
{
    int best = -1;
    for (int n = 0; n < sys->n_nodes; n++) {
        const struct cfx_topo_node *node = &sys->nodes[n];
        if (node->type != CFX_TOPO_NET)
            continue;
        if (best < 0) {
            best = n;
            continue;
        }
        if (gpu >= 0) {
            enum cfx_topo_path_type have = cfx_topo_path(sys, gpu, best)->type;
            enum cfx_topo_path_type type = cfx_topo_path(sys, gpu, n)->type;
            if (type != have) {
                if (type < have)
                    best = n;
                continue;
            }
        }
        if (node->net.speed_mbps > sys->nodes[best].net.speed_mbps)
            best = n;
    }
    return best;
}

static enum cfx_path_class path_class(enum cfx_topo_path_type type);

void cfx_core_locate_near_nics(const struct cfx_topo_system *sys, int cuda_dev, char *out,
                               size_t size)
{
    out[0] = '\0';
    if (sys == NULL)
        return;
    int gpu = cuda_dev >= 0 ? cfx_topo_find_gpu(sys, cuda_dev) : -1;
    int best = nearest_net(sys, gpu);
    if (best < 0)
        return;
    size_t used = (size_t)snprintf(out, size, "%s", sys->nodes[best].net.name);
    for (int n = 0; n < sys->n_nodes && used < size; n++) {
        const struct cfx_topo_node *node = &sys->nodes[n];
        if (n == best || node->type != CFX_TOPO_NET)
            continue;
        int as_near = gpu >= 0
                          ? cfx_topo_path(sys, gpu, n)->type == cfx_topo_path(sys, gpu, best)->type
                          : node->net.speed_mbps == sys->nodes[best].net.speed_mbps;
        if (as_near && strlen(node->net.name) + 1 < size - used)
            used += (size_t)snprintf(out + used, size - used, ",%s", node->net.name);
    }
}

void cfx_core_locate_rank(const struct cfx_topo_system *sys, int cuda_dev,
                          struct cfx_peer_info *info)
{
    info->busid[0] = '\0';
    info->nic_name[0] = '\0';
    info->nic_index = -1;
    info->nic_path = -1;
    if (sys == NULL)
        return;
    int gpu = cuda_dev >= 0 ? cfx_topo_find_gpu(sys, cuda_dev) : -1;
    if (gpu >= 0)
        snprintf(info->busid, sizeof(info->busid), "%s", sys->nodes[gpu].busid);
    int net = nearest_net(sys, gpu);
    if (net >= 0) {
        snprintf(info->nic_name, sizeof(info->nic_name), "%s", sys->nodes[net].net.name);
        info->nic_index = sys->nodes[net].net.dev;
        if (gpu >= 0)
            info->nic_path = (int32_t)path_class(cfx_topo_path(sys, gpu, net)->type);
    }
}

static enum cfx_path_class path_class(enum cfx_topo_path_type type)
{
    switch (type) {
    case CFX_PATH_LOC: return CFX_PATH_CLASS_LOC;
    case CFX_PATH_NVL: return CFX_PATH_CLASS_NVL;
    case CFX_PATH_NVB: return CFX_PATH_CLASS_NVB;
    case CFX_PATH_PIX: return CFX_PATH_CLASS_PIX;
    case CFX_PATH_PXB: return CFX_PATH_CLASS_PXB;
    case CFX_PATH_PHB: return CFX_PATH_CLASS_PHB;
    case CFX_PATH_NET: return CFX_PATH_CLASS_NET;
    default: return CFX_PATH_CLASS_SYS; /* SYS, or not connected inside the host. */
    }
}

enum cfx_path_class cfx_core_locate_path(const struct cfx_topo_system *sys,
                                         const struct cfx_peer_info *from,
                                         const struct cfx_peer_info *to)
{
    if (from->rank == to->rank)
        return CFX_PATH_CLASS_LOC;
    if (from->host_hash != to->host_hash)
        return CFX_PATH_CLASS_NET;
    if (sys != NULL && from->cuda_dev >= 0 && to->cuda_dev >= 0) {
        int a = cfx_topo_find_gpu(sys, from->cuda_dev), b = cfx_topo_find_gpu(sys, to->cuda_dev);
        if (a >= 0 && b >= 0)
            return path_class(cfx_topo_path(sys, a, b)->type);
    }
    /* Host memory of one host: through one CPU, or across sockets when the
     * host has several (which one a rank's memory is on is not known). */
    if (sys != NULL && sys->count[CFX_TOPO_CPU] == 1)
        return CFX_PATH_CLASS_PHB;
    return CFX_PATH_CLASS_SYS;
}
