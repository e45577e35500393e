/* conflux-topo reports: text for people, JSON for programs (see main.c). */
#include <math.h>
#include <string.h>

#include "topo_tool.h"

#define SHOW_RANKS 64 /* Longer rings and trees are cut in the text report. */

static const enum cfx_coll_kind table_colls[] = {CFX_COLL_ALLREDUCE, CFX_COLL_BROADCAST,
                                                 CFX_COLL_ALLGATHER};
#define N_TABLE_COLLS (sizeof(table_colls) / sizeof(table_colls[0]))

static void size_text(size_t bytes, char *text, size_t size)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    while (u < 3 && bytes >= 1024 && bytes % 1024 == 0) {
        bytes /= 1024;
        u++;
    }
    snprintf(text, size, "%zu %s", bytes, units[u]);
}

/* ------------------------------------------------------------ text */

static void print_tree_of(const struct cfx_topo_system *sys, int parent, int depth, FILE *out)
{
    for (int n = 0; n < sys->n_nodes; n++) {
        const struct cfx_topo_node *node = &sys->nodes[n];
        if (node->parent != parent || node->type == CFX_TOPO_NET)
            continue;
        fprintf(out, "%*s", 2 * depth + 2, "");
        switch (node->type) {
        case CFX_TOPO_PCI:
            fprintf(out, "PCI switch %s (%s x%d, %.1f GB/s up)\n", node->busid,
                    node->link_speed[0] ? node->link_speed : "?", node->link_width, node->up_bw);
            print_tree_of(sys, n, depth + 1, out);
            break;
        case CFX_TOPO_GPU: {
            double nvl = 0;
            for (int l = 0; l < node->n_links; l++)
                if (node->links[l].type == CFX_LINK_NVL)
                    nvl += node->links[l].bw;
            fprintf(out, "GPU %d  %s sm%d, PCI %.1f GB/s, ", node->gpu.dev,
                    node->busid[0] ? node->busid : "-", node->gpu.sm, node->up_bw);
            if (nvl > 0)
                fprintf(out, "NVLink %.1f GB/s\n", nvl);
            else
                fprintf(out, "no NVLink\n");
            break;
        }
        case CFX_TOPO_NIC:
            fprintf(out, "NIC %s:", node->busid[0] ? node->busid : "(no PCI function)");
            for (int p = 0; p < sys->n_nodes; p++)
                if (sys->nodes[p].type == CFX_TOPO_NET && sys->nodes[p].parent == n)
                    fprintf(out, " NET %d %s %d Gb/s%s", sys->nodes[p].net.dev,
                            sys->nodes[p].net.name, sys->nodes[p].net.speed_mbps / 1000,
                            sys->nodes[p].net.guid ? " (RDMA)" : "");
            fprintf(out, "\n");
            break;
        default: break;
        }
    }
}

static void print_topology(const struct cfx_topo_system *sys, FILE *out)
{
    char summary[256];
    cfx_topo_summary(sys, summary, sizeof(summary));
    fprintf(out, "Topology (%s): %s\n", sys->source, summary);
    for (int n = 0; n < sys->n_nodes; n++) {
        const struct cfx_topo_node *cpu = &sys->nodes[n];
        if (cpu->type != CFX_TOPO_CPU)
            continue;
        fprintf(out, "  CPU %d (NUMA %d) %s %s family %d model %d\n", cpu->type_index,
                cpu->cpu.numa_id, cpu->cpu.arch[0] ? cpu->cpu.arch : "?",
                cpu->cpu.vendor[0] ? cpu->cpu.vendor : "?", cpu->cpu.family, cpu->cpu.model);
        print_tree_of(sys, n, 1, out);
    }
    if (sys->count[CFX_TOPO_NVS])
        fprintf(out, "  NVSwitch fabric: every GPU's NVLinks end on it\n");
    /* Path classes between the devices ranks and NICs use. */
    int ids[24], n_ids = 0;
    enum cfx_topo_node_type kinds[2] = {sys->count[CFX_TOPO_GPU] ? CFX_TOPO_GPU : CFX_TOPO_CPU,
                                        CFX_TOPO_NET};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < sys->count[kinds[k]] && n_ids < 24; i++)
            ids[n_ids++] = cfx_topo_nth(sys, kinds[k], i);
    fprintf(out, "  Paths (class, bottleneck GB/s):\n  %8s", "");
    for (int j = 0; j < n_ids; j++)
        fprintf(out, " %3s%-5d", cfx_topo_node_type_name(sys->nodes[ids[j]].type),
                sys->nodes[ids[j]].type_index);
    fprintf(out, "\n");
    for (int i = 0; i < n_ids; i++) {
        fprintf(out, "  %3s%-5d", cfx_topo_node_type_name(sys->nodes[ids[i]].type),
                sys->nodes[ids[i]].type_index);
        for (int j = 0; j < n_ids; j++) {
            const struct cfx_topo_path *p = cfx_topo_path(sys, ids[i], ids[j]);
            if (i == j)
                fprintf(out, " %-8s", "  X");
            else
                fprintf(out, " %s/%-4.0f", cfx_topo_path_type_name(p->type), p->bw);
        }
        fprintf(out, "\n");
    }
}

static void print_rings(const struct cfx_plan *plan, FILE *out)
{
    int n = plan->n_ranks;
    for (int c = 0; c < plan->n_channels; c++) {
        int counts[CFX_LINK_TYPES] = {0};
        for (int i = 0; i < n; i++)
            counts[cfx_topo_path_link_class(plan->ring_hops[(size_t)c * n + i])]++;
        fprintf(out, "  ring %2d  %5.1f GB/s  NET %2d:", c, plan->channel_bw[c],
                plan->ring_nets[(size_t)c * plan->n_nodes + plan->node_order[0]]);
        int prev_node_break = 0;
        for (int i = 0; i < n && i < SHOW_RANKS; i++) {
            fprintf(out, "%s%d", prev_node_break ? " | " : " ", plan->rings[(size_t)c * n + i]);
            prev_node_break = plan->ring_hops[(size_t)c * n + i] == CFX_PATH_NET;
        }
        fprintf(out, "%s   (hops:", n > SHOW_RANKS ? " ..." : "");
        for (int t = 0; t < CFX_LINK_TYPES; t++)
            if (counts[t])
                fprintf(out, " %d %s", counts[t], cfx_topo_link_type_name(t));
        fprintf(out, ")\n");
    }
}

static void print_trees(const struct cfx_plan *plan, FILE *out)
{
    for (int t = 0; t < 2; t++) {
        const struct cfx_plan_tree *tree = &plan->trees[t];
        fprintf(out, "  tree %d: root %d, depth %d (%d between hosts); parent of each rank:", t,
                tree->root, tree->depth, tree->net_depth);
        for (int r = 0; r < plan->n_ranks && r < SHOW_RANKS; r++)
            fprintf(out, " %d", tree->parent[r]);
        fprintf(out, "%s\n", plan->n_ranks > SHOW_RANKS ? " ..." : "");
    }
}

static void print_choices(struct cfx_plan *plan, FILE *out)
{
    fprintf(out, "  %9s", "size");
    for (size_t k = 0; k < N_TABLE_COLLS; k++)
        fprintf(out, " | %-37s", cfx_coll_name(table_colls[k]));
    fprintf(out, "\n");
    for (size_t bytes = TOPO_MIN_BYTES; bytes <= TOPO_MAX_BYTES; bytes *= 8) {
        char size[32];
        size_text(bytes, size, sizeof(size));
        fprintf(out, "  %9s", size);
        for (size_t k = 0; k < N_TABLE_COLLS; k++) {
            struct cfx_plan_choice ch;
            if (cfx_plan_choose(plan, table_colls[k], bytes, &ch) != cfxSuccess)
                continue;
            char what[24];
            snprintf(what, sizeof(what), "%s/%s", cfx_plan_algo_name(ch.algo),
                     cfx_plan_proto_name(ch.proto));
            fprintf(out, " | %-13s %8.1f us %6.1f GB/s", what, ch.predicted_us, ch.busbw_gbs);
        }
        fprintf(out, "\n");
    }
}

void topo_report_text(const struct topo_report *rep, FILE *out)
{
    struct cfx_plan *plan = rep->plan;
    const struct cfx_plan_model *md = &plan->model;
    print_topology(rep->sys, out);
    fprintf(out, "\nPlan: %d ranks on %d host%s (%d per host), %s ranks, %d channel%s\n",
            plan->n_ranks, plan->n_nodes, plan->n_nodes == 1 ? "" : "s", rep->ranks_per_node,
            md->host_ranks ? "host (CPU)" : "GPU", plan->n_channels,
            plan->n_channels == 1 ? "" : "s");
    print_rings(plan, out);
    print_trees(plan, out);
    fprintf(out,
            "\nModel: ring %.1f GB/s (inside hosts %.1f, NICs %.1f); slowest class inside hosts "
            "%s (%.1f us/hop Simple); network %s (%.1f us/hop Simple)\n",
            md->ring_bw, md->intra_bw, md->net_bw, cfx_topo_link_type_name(md->intra_class),
            md->intra_hop_us[CFX_PROTO_SIMPLE],
            plan->n_nodes > 1 ? (md->rdma ? "RDMA" : "sockets") : "none",
            md->net_hop_us[CFX_PROTO_SIMPLE]);
    fprintf(out, "\nChoices (predicted time and bus bandwidth):\n");
    print_choices(plan, out);
}

/* ------------------------------------------------------------ JSON */

static void json_int_array(FILE *out, const int *values, int n)
{
    fputc('[', out);
    for (int i = 0; i < n; i++)
        fprintf(out, "%s%d", i ? "," : "", values[i]);
    fputc(']', out);
}

static double finite_or_zero(double v)
{
    return isfinite(v) ? v : 0.0;
}

void topo_report_json(const struct topo_report *rep, FILE *out)
{
    struct cfx_plan *plan = rep->plan;
    int n = plan->n_ranks;
    char summary[256];
    cfx_topo_summary(rep->sys, summary, sizeof(summary));
    fprintf(out, "{\"topology\":\"");
    for (const char *c = summary; *c; c++)
        if (*c != '"' && *c != '\\')
            fputc(*c, out);
    fprintf(out,
            "\",\"nodes\":%d,\"ranks\":%d,\"ranks_per_node\":%d,\"host_ranks\":%s,"
            "\"channels\":%d,\n",
            plan->n_nodes, n, rep->ranks_per_node, plan->model.host_ranks ? "true" : "false",
            plan->n_channels);
    fprintf(out, "\"rings\":[");
    for (int c = 0; c < plan->n_channels; c++) {
        fprintf(out, "%s\n", c ? "," : "");
        json_int_array(out, &plan->rings[(size_t)c * n], n);
    }
    fprintf(out, "],\n\"ring_links\":[");
    for (int c = 0; c < plan->n_channels; c++) {
        fprintf(out, "%s\n[", c ? "," : "");
        for (int i = 0; i < n; i++)
            fprintf(out, "%s\"%s\"", i ? "," : "",
                    cfx_topo_link_type_name(
                        cfx_topo_path_link_class(plan->ring_hops[(size_t)c * n + i])));
        fprintf(out, "]");
    }
    fprintf(out, "],\n\"ring_paths\":[");
    for (int c = 0; c < plan->n_channels; c++) {
        fprintf(out, "%s\n[", c ? "," : "");
        for (int i = 0; i < n; i++)
            fprintf(out, "%s\"%s\"", i ? "," : "",
                    cfx_topo_path_type_name(plan->ring_hops[(size_t)c * n + i]));
        fprintf(out, "]");
    }
    fprintf(out, "],\n\"ring_bw_gbs\":[");
    for (int c = 0; c < plan->n_channels; c++)
        fprintf(out, "%s%.3f", c ? "," : "", plan->channel_bw[c]);
    fprintf(out, "],\n\"trees\":[");
    for (int t = 0; t < 2; t++) {
        fprintf(out, "%s\n{\"root\":%d,\"depth\":%d,\"parent\":", t ? "," : "", plan->trees[t].root,
                plan->trees[t].depth);
        json_int_array(out, plan->trees[t].parent, n);
        fprintf(out, "}");
    }
    fprintf(out, "],\n\"model\":{\"ring_bw_gbs\":%.3f,\"intra_bw_gbs\":%.3f,\"net_bw_gbs\":%.3f},",
            finite_or_zero(plan->model.ring_bw), finite_or_zero(plan->model.intra_bw),
            finite_or_zero(plan->model.net_bw));
    fprintf(out, "\n\"choices\":[");
    int first = 1;
    for (size_t k = 0; k < N_TABLE_COLLS; k++)
        for (size_t bytes = TOPO_MIN_BYTES; bytes <= TOPO_MAX_BYTES; bytes *= 2) {
            struct cfx_plan_choice ch;
            if (cfx_plan_choose(plan, table_colls[k], bytes, &ch) != cfxSuccess)
                continue;
            fprintf(out,
                    "%s\n{\"collective\":\"%s\",\"bytes\":%zu,\"algorithm\":\"%s\","
                    "\"protocol\":\"%s\",\"predicted_us\":%.3f,\"predicted_busbw_gbs\":%.3f}",
                    first ? "" : ",", cfx_coll_name(table_colls[k]), bytes,
                    cfx_plan_algo_name(ch.algo), cfx_plan_proto_name(ch.proto), ch.predicted_us,
                    ch.busbw_gbs);
            first = 0;
        }
    fprintf(out, "]}\n");
}
