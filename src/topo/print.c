/* Names and printing of topologies (see topo.h). */
#include <stdio.h>

#include "src/topo/topo.h"

static const char *const node_names[CFX_TOPO_NODE_TYPES] = {"GPU", "PCI", "NVS",
                                                            "CPU", "NIC", "NET"};
static const char *const link_names[CFX_LINK_TYPES] = {"LOC", "NVL", "PCI", "SYS", "NET"};
static const char *const path_names[CFX_PATH_TYPES] = {"LOC", "NVL", "NVB", "PIX", "PXB",
                                                       "PHB", "SYS", "NET", "DIS"};

const char *cfx_topo_node_type_name(enum cfx_topo_node_type type)
{
    return (unsigned)type < CFX_TOPO_NODE_TYPES ? node_names[type] : "?";
}

const char *cfx_topo_link_type_name(enum cfx_topo_link_type type)
{
    return (unsigned)type < CFX_LINK_TYPES ? link_names[type] : "?";
}

const char *cfx_topo_path_type_name(enum cfx_topo_path_type type)
{
    return (unsigned)type < CFX_PATH_TYPES ? path_names[type] : "?";
}

enum cfx_topo_link_type cfx_topo_path_link_class(enum cfx_topo_path_type type)
{
    switch (type) {
    case CFX_PATH_LOC: return CFX_LINK_LOC;
    case CFX_PATH_NVL:
    case CFX_PATH_NVB: return CFX_LINK_NVL;
    case CFX_PATH_PIX:
    case CFX_PATH_PXB:
    case CFX_PATH_PHB: return CFX_LINK_PCI;
    case CFX_PATH_SYS: return CFX_LINK_SYS;
    default: return CFX_LINK_NET;
    }
}

/* ------------------------------------------------------------ printing */

static void node_label(const struct cfx_topo_system *sys, int n, char *text, size_t size)
{
    const struct cfx_topo_node *node = &sys->nodes[n];
    switch (node->type) {
    case CFX_TOPO_GPU: snprintf(text, size, "GPU/%d", node->gpu.dev); break;
    case CFX_TOPO_CPU: snprintf(text, size, "CPU/%d", node->cpu.numa_id); break;
    case CFX_TOPO_NET: snprintf(text, size, "NET/%d", node->net.dev); break;
    case CFX_TOPO_NVS: snprintf(text, size, "NVS/0"); break;
    default:
        snprintf(text, size, "%s/%s", node_names[node->type], node->busid[0] ? node->busid : "-");
        break;
    }
}

void cfx_topo_print(const struct cfx_topo_system *sys, FILE *out)
{
    char summary[256];
    cfx_topo_summary(sys, summary, sizeof(summary));
    fprintf(out, "topology (%s): %s\n", sys->source, summary);
    for (int n = 0; n < sys->n_nodes; n++) {
        const struct cfx_topo_node *node = &sys->nodes[n];
        char label[64];
        node_label(sys, n, label, sizeof(label));
        fprintf(out, "  %-22s", label);
        if (node->type == CFX_TOPO_GPU)
            fprintf(out, " sm%d %s", node->gpu.sm, node->busid);
        else if (node->type == CFX_TOPO_NET)
            fprintf(out, " %s port %d %d Gb/s", node->net.name, node->net.port,
                    node->net.speed_mbps / 1000);
        else if (node->type == CFX_TOPO_CPU)
            fprintf(out, " %s %s", node->cpu.arch[0] ? node->cpu.arch : "?",
                    node->cpu.vendor[0] ? node->cpu.vendor : "?");
        fprintf(out, "\n");
        for (int l = 0; l < node->n_links; l++) {
            char peer[64];
            node_label(sys, node->links[l].remote, peer, sizeof(peer));
            fprintf(out, "      -> %-20s %s %.1f GB/s\n", peer, link_names[node->links[l].type],
                    node->links[l].bw);
        }
    }
}

void cfx_topo_summary(const struct cfx_topo_system *sys, char *text, size_t size)
{
    int sm = 0, net_gbps = 0;
    for (int n = 0; n < sys->n_nodes; n++) {
        if (sys->nodes[n].type == CFX_TOPO_GPU && sys->nodes[n].gpu.sm > sm)
            sm = sys->nodes[n].gpu.sm;
        if (sys->nodes[n].type == CFX_TOPO_NET && sys->nodes[n].net.speed_mbps / 1000 > net_gbps)
            net_gbps = sys->nodes[n].net.speed_mbps / 1000;
    }
    int used = snprintf(text, size, "%d CPU%s, %d GPU%s", sys->count[CFX_TOPO_CPU],
                        sys->count[CFX_TOPO_CPU] == 1 ? "" : "s", sys->count[CFX_TOPO_GPU],
                        sys->count[CFX_TOPO_GPU] == 1 ? "" : "s");
    if (sys->count[CFX_TOPO_GPU] && sm && used > 0 && (size_t)used < size)
        used += snprintf(text + used, size - (size_t)used, " (sm%d)", sm);
    if (sys->count[CFX_TOPO_NVS] && used > 0 && (size_t)used < size)
        used += snprintf(text + used, size - (size_t)used, ", NVSwitch");
    if (used > 0 && (size_t)used < size)
        snprintf(text + used, size - (size_t)used, ", %d NIC port%s (up to %d Gb/s)",
                 sys->count[CFX_TOPO_NET], sys->count[CFX_TOPO_NET] == 1 ? "" : "s", net_gbps);
}
