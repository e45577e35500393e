/*
 * conflux-topo --dot: the first host's topology as a Graphviz graph (render
 * with `dot -Tsvg`), its ranks, and the first rings drawn over them; with
 * several hosts, the ring hops that leave the host go to a "network" node
 * through the NET each ring uses.
 */
#include <stdio.h>

#include "topo_tool.h"

#define DOT_RINGS 2

static const char *const ring_colors[DOT_RINGS] = {"#d62728", "#1f77b4"};

static const char *fill_of(enum cfx_topo_node_type type)
{
    switch (type) {
    case CFX_TOPO_GPU: return "#a6d96a";
    case CFX_TOPO_CPU: return "#abd9e9";
    case CFX_TOPO_NVS: return "#fdae61";
    case CFX_TOPO_NIC:
    case CFX_TOPO_NET: return "#fee090";
    default: return "#e0e0e0";
    }
}

static const char *link_color(enum cfx_topo_link_type type)
{
    switch (type) {
    case CFX_LINK_NVL: return "#33a02c";
    case CFX_LINK_PCI: return "#555555";
    case CFX_LINK_SYS: return "#1f78b4";
    default: return "#b15928";
    }
}

/* The topology node rank @p r of the first host runs on (the tool's block layout). */
static int unit_of(const struct topo_report *rep, int r)
{
    const struct cfx_topo_system *sys = rep->sys;
    int local = r % rep->ranks_per_node;
    if (sys->count[CFX_TOPO_GPU])
        return cfx_topo_find_gpu(sys, local);
    return cfx_topo_nth(sys, CFX_TOPO_CPU, cfx_plan_default_cpu(sys, local, rep->ranks_per_node));
}

int topo_report_dot(const struct topo_report *rep, const char *path)
{
    FILE *out = fopen(path, "w");
    if (out == NULL)
        return -1;
    const struct cfx_topo_system *sys = rep->sys;
    const struct cfx_plan *plan = rep->plan;
    int n = plan->n_ranks;
    int host0 = plan->node_order[0];
    fprintf(out,
            "digraph conflux {\n  graph [fontname=\"Helvetica\", rankdir=TB, label=\"%s: "
            "host %d of %d, %d ranks per host, rings 0-%d of %d\"];\n",
            sys->source, host0, plan->n_nodes, rep->ranks_per_node,
            (plan->n_channels < DOT_RINGS ? plan->n_channels : DOT_RINGS) - 1, plan->n_channels);
    fprintf(out, "  node [shape=box, style=filled, fontname=\"Helvetica\", fontsize=10];\n");
    for (int i = 0; i < sys->n_nodes; i++) {
        const struct cfx_topo_node *node = &sys->nodes[i];
        char label[96];
        switch (node->type) {
        case CFX_TOPO_GPU:
            snprintf(label, sizeof(label), "GPU %d\\n%s", node->gpu.dev, node->busid);
            break;
        case CFX_TOPO_CPU:
            snprintf(label, sizeof(label), "CPU %d (NUMA %d)", node->type_index, node->cpu.numa_id);
            break;
        case CFX_TOPO_NET:
            snprintf(label, sizeof(label), "NET %d %s\\n%d Gb/s", node->net.dev, node->net.name,
                     node->net.speed_mbps / 1000);
            break;
        case CFX_TOPO_NVS: snprintf(label, sizeof(label), "NVSwitch"); break;
        default:
            snprintf(label, sizeof(label), "%s %s", cfx_topo_node_type_name(node->type),
                     node->busid);
            break;
        }
        fprintf(out, "  n%d [label=\"%s\", fillcolor=\"%s\"];\n", i, label, fill_of(node->type));
    }
    for (int i = 0; i < sys->n_nodes; i++)
        for (int l = 0; l < sys->nodes[i].n_links; l++) {
            const struct cfx_topo_link *link = &sys->nodes[i].links[l];
            if (link->remote < i)
                continue; /* One edge per pair. */
            fprintf(out, "  n%d -> n%d [dir=none, color=\"%s\", fontsize=8, label=\"%s %.0f\"];\n",
                    i, link->remote, link_color(link->type), cfx_topo_link_type_name(link->type),
                    link->bw);
        }
    /* Ranks of the first host, on the device they run on. */
    for (int r = host0 * rep->ranks_per_node; r < (host0 + 1) * rep->ranks_per_node && r < n; r++) {
        fprintf(out, "  r%d [shape=ellipse, fillcolor=white, label=\"rank %d\"];\n", r, r);
        fprintf(out, "  r%d -> n%d [style=dotted, dir=none];\n", r, unit_of(rep, r));
    }
    if (plan->n_nodes > 1)
        fprintf(out, "  network [shape=ellipse, fillcolor=\"#f0f0f0\", label=\"network (other "
                     "hosts)\"];\n");
    for (int c = 0; c < plan->n_channels && c < DOT_RINGS; c++) {
        const int *ring = &plan->rings[(size_t)c * n];
        for (int i = 0; i < n; i++) {
            int a = ring[i], b = ring[(i + 1) % n];
            int a_here = a / rep->ranks_per_node == host0,
                b_here = b / rep->ranks_per_node == host0;
            int net = plan->ring_nets[(size_t)c * plan->n_nodes + host0];
            int net_node = net >= 0 ? cfx_topo_nth(sys, CFX_TOPO_NET, net) : -1;
            const char *attrs = "penwidth=2, constraint=false, fontsize=8";
            if (a_here && b_here)
                fprintf(out, "  r%d -> r%d [color=\"%s\", %s, label=\"ring %d\"];\n", a, b,
                        ring_colors[c], attrs, c);
            else if (a_here && net_node >= 0)
                fprintf(out, "  r%d -> n%d -> network [color=\"%s\", %s];\n", a, net_node,
                        ring_colors[c], attrs);
            else if (b_here && net_node >= 0)
                fprintf(out, "  network -> n%d -> r%d [color=\"%s\", %s];\n", net_node, b,
                        ring_colors[c], attrs);
        }
    }
    fprintf(out, "}\n");
    return fclose(out) == 0 ? 0 : -1;
}
