/*
 * The topology graph: nodes, links made from the containment tree and the
 * NVLink records, and the best path between every two nodes. See topo.h.
 */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/topo/build.h"
#include "src/util/error.h"
#include "src/util/log.h"

#define CLASS_BRIDGE_PCI 0x060400u /* PCI-to-PCI bridge (switch port). */
#define CLASS_NVSWITCH   0x068000u /* "Other bridge": how NVSwitches present. */
#define BW_EPSILON       1e-9

/* ------------------------------------------------------------ building */

struct cfx_topo_system *cfx_topo_new(const char *source)
{
    struct cfx_topo_system *sys = calloc(1, sizeof(*sys));
    if (sys == NULL) {
        cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for a topology");
        return NULL;
    }
    snprintf(sys->source, sizeof(sys->source), "%s", source ? source : "");
    return sys;
}

int cfx_topo_add_node(struct cfx_topo_system *sys, enum cfx_topo_node_type type, int parent)
{
    if (sys->n_nodes == sys->cap_nodes) {
        int cap = sys->cap_nodes ? 2 * sys->cap_nodes : 32;
        struct cfx_topo_node *nodes = realloc(sys->nodes, (size_t)cap * sizeof(*nodes));
        if (nodes == NULL) {
            cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for %d topology nodes",
                          cap);
            return -1;
        }
        sys->nodes = nodes;
        sys->cap_nodes = cap;
    }
    int index = sys->n_nodes++;
    struct cfx_topo_node *node = &sys->nodes[index];
    memset(node, 0, sizeof(*node));
    node->type = type;
    node->parent = parent;
    switch (type) {
    case CFX_TOPO_GPU:
        node->gpu.dev = -1;
        node->gpu.rank = -1;
        node->gpu.gdr = 1;
        break;
    case CFX_TOPO_CPU:
        node->cpu.numa_id = -1;
        node->cpu.family = -1;
        node->cpu.model = -1;
        break;
    case CFX_TOPO_NET:
        node->net.dev = -1;
        node->net.port = 1;
        node->net.maxconn = 0;
        break;
    default: break;
    }
    return index;
}

cfxResult_t cfx_topo_gpu_add_nvlink(struct cfx_topo_system *sys, int gpu, const char *target,
                                    int count, uint32_t target_class)
{
    struct cfx_topo_node *node = &sys->nodes[gpu];
    struct cfx_topo_nvlink *links =
        realloc(node->gpu.nvlinks, (size_t)(node->gpu.n_nvlinks + 1) * sizeof(*links));
    if (links == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for NVLinks");
    node->gpu.nvlinks = links;
    struct cfx_topo_nvlink *rec = &links[node->gpu.n_nvlinks++];
    memset(rec, 0, sizeof(*rec));
    snprintf(rec->target, sizeof(rec->target), "%s", target);
    rec->count = count;
    rec->target_class = target_class;
    return cfxSuccess;
}

int cfx_topo_busid_parse(const char *text, uint64_t *id_p)
{
    uint64_t id = 0;
    int digits = 0;
    if (text == NULL)
        return -1;
    for (const char *c = text; *c; c++) {
        if (*c == ':' || *c == '.')
            continue;
        if (!isxdigit((unsigned char)*c) || digits >= 15)
            return -1;
        int v = isdigit((unsigned char)*c) ? *c - '0' : tolower((unsigned char)*c) - 'a' + 10;
        id = (id << 4) | (uint64_t)v;
        digits++;
    }
    if (digits == 0)
        return -1;
    *id_p = id;
    return 0;
}

void cfx_topo_busid_normalize(const char *text, char *out, size_t size)
{
    size_t i = 0;
    for (; text[i] && i + 1 < size; i++)
        out[i] = (char)tolower((unsigned char)text[i]);
    out[i] = '\0';
}

double cfx_topo_pci_bw(const char *speed, int width)
{
    if (speed == NULL || speed[0] == '\0')
        return 0;
    double gts = strtod(speed, NULL);
    double lane; /* GB/s per lane after line coding. */
    if (gts <= 0)
        return 0;
    if (gts < 3)
        lane = 0.25; /* Gen1, 8b/10b */
    else if (gts < 6)
        lane = 0.5; /* Gen2, 8b/10b */
    else if (gts < 12)
        lane = 0.985; /* Gen3, 128b/130b */
    else if (gts < 24)
        lane = 1.969; /* Gen4 */
    else if (gts < 48)
        lane = 3.938; /* Gen5 */
    else
        lane = 7.563; /* Gen6, PAM4 + FLIT */
    if (width <= 0)
        width = CFX_TOPO_PCI_DEFAULT_WIDTH;
    return lane * width;
}

double cfx_topo_nvlink_bw(int sm)
{
    if (sm <= 0)
        return 25.0;
    if (sm < 70)
        return 20.0; /* P100, NVLink 1 */
    if (sm == 86 || sm == 89)
        return 14.0625; /* GA10x/AD10x bridge: 112.5 GB/s over 4 links, both ways */
    if (sm < 100)
        return 25.0; /* V100 (NVLink 2), A100 (3), H100/H200 (4) */
    return 50.0;     /* B200 / GB200 (NVLink 5) */
}

/* Effective bandwidth between two CPU sockets, GB/s (one direction). */
static double cpu_sys_bw(const struct cfx_topo_node *cpu)
{
    if (strncmp(cpu->cpu.arch, "ppc", 3) == 0)
        return 32.0; /* POWER9 X-bus */
    if (strcmp(cpu->cpu.arch, "arm64") == 0 || strcmp(cpu->cpu.arch, "aarch64") == 0)
        return 6.0;
    if (strcmp(cpu->cpu.vendor, "AuthenticAMD") == 0)
        return 16.0; /* xGMI */
    if (strcmp(cpu->cpu.vendor, "GenuineIntel") == 0) {
        if (cpu->cpu.family == 6 && cpu->cpu.model >= 0x8f)
            return 22.0; /* Sapphire Rapids and later: UPI 2.0 */
        if (cpu->cpu.family == 6 && cpu->cpu.model >= 0x55)
            return 10.0; /* Skylake-SP, Cascade Lake, Ice Lake: UPI */
        return 6.0;      /* QPI */
    }
    return 10.0;
}

static cfxResult_t add_link(struct cfx_topo_system *sys, int from, int to,
                            enum cfx_topo_link_type type, double bw)
{
    struct cfx_topo_node *node = &sys->nodes[from];
    for (int l = 0; l < node->n_links; l++) {
        struct cfx_topo_link *link = &node->links[l];
        if (link->remote == to && link->type == type) {
            if (bw > link->bw)
                link->bw = bw;
            return cfxSuccess;
        }
    }
    struct cfx_topo_link *links =
        realloc(node->links, (size_t)(node->n_links + 1) * sizeof(*links));
    if (links == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for topology links");
    node->links = links;
    links[node->n_links++] = (struct cfx_topo_link){.type = type, .remote = to, .bw = bw};
    return cfxSuccess;
}

static cfxResult_t add_link_pair(struct cfx_topo_system *sys, int a, int b,
                                 enum cfx_topo_link_type type, double bw)
{
    cfxResult_t res = add_link(sys, a, b, type, bw);
    return res == cfxSuccess ? add_link(sys, b, a, type, bw) : res;
}

int cfx_topo_nth(const struct cfx_topo_system *sys, enum cfx_topo_node_type type, int i)
{
    for (int n = 0; n < sys->n_nodes; n++)
        if (sys->nodes[n].type == type && sys->nodes[n].type_index == i)
            return n;
    return -1;
}

int cfx_topo_find_gpu(const struct cfx_topo_system *sys, int dev)
{
    for (int n = 0; n < sys->n_nodes; n++)
        if (sys->nodes[n].type == CFX_TOPO_GPU && sys->nodes[n].gpu.dev == dev)
            return n;
    return -1;
}

int cfx_topo_local_cpu(const struct cfx_topo_system *sys, int node)
{
    while (node >= 0 && sys->nodes[node].type != CFX_TOPO_CPU)
        node = sys->nodes[node].parent;
    return node;
}

static int find_pci(const struct cfx_topo_system *sys, uint64_t id)
{
    for (int n = 0; n < sys->n_nodes; n++) {
        const struct cfx_topo_node *node = &sys->nodes[n];
        if ((node->type == CFX_TOPO_GPU || node->type == CFX_TOPO_PCI ||
             node->type == CFX_TOPO_NIC) &&
            node->busid[0] && node->id == id)
            return n;
    }
    return -1;
}

/* Bandwidth of each node's link to its parent. Switches that report a
 * uselessly slow uplink (virtual bridges in VMs say "2.5 GT/s x1") take the
 * fastest of their children instead. */
static void compute_up_bw(struct cfx_topo_system *sys)
{
    for (int n = sys->n_nodes - 1; n >= 0; n--) {
        struct cfx_topo_node *node = &sys->nodes[n];
        if (node->type != CFX_TOPO_GPU && node->type != CFX_TOPO_PCI && node->type != CFX_TOPO_NIC)
            continue;
        double bw = cfx_topo_pci_bw(node->link_speed, node->link_width);
        if (bw <= 0)
            bw = cfx_topo_pci_bw(CFX_TOPO_PCI_DEFAULT_SPEED, node->link_width);
        double child_max = 0;
        for (int c = n + 1; c < sys->n_nodes; c++)
            if (sys->nodes[c].parent == n && sys->nodes[c].up_bw > child_max)
                child_max = sys->nodes[c].up_bw;
        if (node->type == CFX_TOPO_PCI && bw * 4 < child_max)
            bw = child_max;
        if (node->type == CFX_TOPO_NIC && node->busid[0] == '\0')
            bw = CFX_TOPO_LOC_BW; /* A NIC with no PCI function (a socket NIC) */
        node->up_bw = bw;
    }
}

static int nvs_node(struct cfx_topo_system *sys)
{
    for (int n = 0; n < sys->n_nodes; n++)
        if (sys->nodes[n].type == CFX_TOPO_NVS)
            return n;
    return cfx_topo_add_node(sys, CFX_TOPO_NVS, -1);
}

static cfxResult_t make_nvlinks(struct cfx_topo_system *sys)
{
    cfxResult_t res = cfxSuccess;
    int n_nodes = sys->n_nodes; /* The NVS node, if added, has no records. */
    for (int g = 0; g < n_nodes && res == cfxSuccess; g++) {
        if (sys->nodes[g].type != CFX_TOPO_GPU)
            continue;
        double per_link = cfx_topo_nvlink_bw(sys->nodes[g].gpu.sm);
        for (int r = 0; r < sys->nodes[g].gpu.n_nvlinks && res == cfxSuccess; r++) {
            const struct cfx_topo_nvlink rec = sys->nodes[g].gpu.nvlinks[r];
            if (rec.count <= 0)
                continue;
            uint64_t id = 0;
            int peer = cfx_topo_busid_parse(rec.target, &id) == 0 ? find_pci(sys, id) : -1;
            double bw = per_link * rec.count;
            if (peer >= 0 && sys->nodes[peer].type == CFX_TOPO_GPU && peer != g) {
                res = add_link(sys, g, peer, CFX_LINK_NVL, bw);
                /* The peer's own record sets its direction; if it has none,
                 * the link is symmetric. */
                if (res == cfxSuccess)
                    res = add_link(sys, peer, g, CFX_LINK_NVL, 0);
            } else if ((rec.target_class >> 8) == (CLASS_BRIDGE_PCI >> 8)) {
                int cpu = cfx_topo_local_cpu(sys, g);
                if (cpu >= 0)
                    res = add_link_pair(sys, g, cpu, CFX_LINK_NVL, bw);
            } else {
                /* An NVSwitch, visible or not (VMs report ffffffff:ff:ff.0). */
                int nvs = nvs_node(sys);
                if (nvs < 0)
                    return cfxSystemError;
                struct cfx_topo_node *gpu = &sys->nodes[g];
                double total = 0;
                for (int l = 0; l < gpu->n_links; l++)
                    if (gpu->links[l].remote == nvs)
                        total = gpu->links[l].bw;
                /* Several records (one per switch) add up. */
                res = add_link(sys, g, nvs, CFX_LINK_NVL, total + bw);
                if (res == cfxSuccess)
                    res = add_link(sys, nvs, g, CFX_LINK_NVL, total + bw);
            }
        }
    }
    /* GPU pairs where only one side listed the link: copy its bandwidth. */
    for (int g = 0; g < sys->n_nodes; g++) {
        struct cfx_topo_node *node = &sys->nodes[g];
        for (int l = 0; l < node->n_links; l++) {
            struct cfx_topo_link *link = &node->links[l];
            if (link->type != CFX_LINK_NVL || link->bw > 0)
                continue;
            const struct cfx_topo_node *peer = &sys->nodes[link->remote];
            for (int k = 0; k < peer->n_links; k++)
                if (peer->links[k].remote == g && peer->links[k].type == CFX_LINK_NVL)
                    link->bw = peer->links[k].bw;
        }
    }
    return res;
}

static cfxResult_t make_links(struct cfx_topo_system *sys)
{
    cfxResult_t res = cfxSuccess;
    compute_up_bw(sys);
    for (int n = 0; n < sys->n_nodes && res == cfxSuccess; n++) {
        struct cfx_topo_node *node = &sys->nodes[n];
        if (node->parent < 0)
            continue;
        if (node->type == CFX_TOPO_NET) {
            double bw = node->net.speed_mbps > 0 ? node->net.speed_mbps / 8000.0 : 1.25;
            res = add_link_pair(sys, n, node->parent, CFX_LINK_NET, bw);
        } else {
            res = add_link_pair(sys, n, node->parent, CFX_LINK_PCI, node->up_bw);
        }
    }
    if (res == cfxSuccess)
        res = make_nvlinks(sys);
    for (int a = 0; a < sys->n_nodes && res == cfxSuccess; a++) {
        if (sys->nodes[a].type != CFX_TOPO_CPU)
            continue;
        for (int b = a + 1; b < sys->n_nodes && res == cfxSuccess; b++) {
            if (sys->nodes[b].type != CFX_TOPO_CPU)
                continue;
            double bw = fmin(cpu_sys_bw(&sys->nodes[a]), cpu_sys_bw(&sys->nodes[b]));
            res = add_link_pair(sys, a, b, CFX_LINK_SYS, bw);
        }
    }
    return res;
}

/* ------------------------------------------------------------ paths */

/* The class a hop adds to a path. The NIC-to-port link is inside a device. */
static enum cfx_topo_path_type hop_type(const struct cfx_topo_system *sys, int from,
                                        const struct cfx_topo_link *link)
{
    enum cfx_topo_node_type a = sys->nodes[from].type, b = sys->nodes[link->remote].type;
    switch (link->type) {
    case CFX_LINK_NVL: return CFX_PATH_NVL;
    case CFX_LINK_PCI:
        if (a == CFX_TOPO_CPU || b == CFX_TOPO_CPU)
            return CFX_PATH_PHB;
        if (a == CFX_TOPO_PCI && b == CFX_TOPO_PCI)
            return CFX_PATH_PXB;
        return CFX_PATH_PIX;
    case CFX_LINK_SYS: return CFX_PATH_SYS;
    default: return CFX_PATH_LOC;
    }
}

/* May a path that reached @p node over @p in_type continue over @p out? */
static int may_transit(const struct cfx_topo_system *sys, int node, enum cfx_topo_link_type in_type,
                       const struct cfx_topo_link *out)
{
    switch (sys->nodes[node].type) {
    case CFX_TOPO_GPU: return in_type == CFX_LINK_NVL && out->type == CFX_LINK_NVL;
    case CFX_TOPO_NIC: return in_type == CFX_LINK_NET || out->type == CFX_LINK_NET;
    case CFX_TOPO_NET: return 0;
    default: return 1;
    }
}

static int better(double bw, enum cfx_topo_path_type type, int hops, const struct cfx_topo_path *p)
{
    if (bw > p->bw + BW_EPSILON)
        return 1;
    if (bw < p->bw - BW_EPSILON)
        return 0;
    if (type != p->type)
        return type < p->type;
    return hops < p->hops;
}

/* Widest path first, then the nearest class, then the fewest hops: a
 * Dijkstra over that order (extending a path never improves any of them). */
static void compute_paths_from(struct cfx_topo_system *sys, int src, unsigned char *done,
                               enum cfx_topo_link_type *in_type)
{
    int n = sys->n_nodes;
    struct cfx_topo_path *row = &sys->paths[(size_t)src * (size_t)n];
    for (int i = 0; i < n; i++) {
        row[i] = (struct cfx_topo_path){
            .type = CFX_PATH_DIS, .bw = 0, .hops = 0, .prev = -1, .prev_link = -1};
        done[i] = 0;
    }
    row[src] = (struct cfx_topo_path){
        .type = CFX_PATH_LOC, .bw = CFX_TOPO_LOC_BW, .hops = 0, .prev = -1, .prev_link = -1};
    in_type[src] = CFX_LINK_LOC;
    for (;;) {
        int u = -1;
        for (int i = 0; i < n; i++)
            if (!done[i] && row[i].type != CFX_PATH_DIS &&
                (u < 0 || better(row[i].bw, row[i].type, row[i].hops, &row[u])))
                u = i;
        if (u < 0)
            break;
        done[u] = 1;
        const struct cfx_topo_node *node = &sys->nodes[u];
        for (int l = 0; l < node->n_links; l++) {
            const struct cfx_topo_link *link = &node->links[l];
            int v = link->remote;
            if (done[v] || link->bw <= 0)
                continue;
            if (u != src && !may_transit(sys, u, in_type[u], link))
                continue;
            enum cfx_topo_path_type type = hop_type(sys, u, link);
            if (row[u].type > type && u != src)
                type = row[u].type;
            if (u != src && node->type == CFX_TOPO_GPU && type < CFX_PATH_NVB)
                type = CFX_PATH_NVB;
            double bw = fmin(row[u].bw, link->bw);
            if (row[v].type == CFX_PATH_DIS || better(bw, type, row[u].hops + 1, &row[v])) {
                row[v] = (struct cfx_topo_path){
                    .type = type, .bw = bw, .hops = row[u].hops + 1, .prev = u, .prev_link = l};
                in_type[v] = link->type;
            }
        }
    }
}

static cfxResult_t compute_paths(struct cfx_topo_system *sys)
{
    size_t n = (size_t)sys->n_nodes;
    sys->paths = calloc(n > 0 ? n * n : 1, sizeof(*sys->paths));
    unsigned char *done = calloc(n ? n : 1, 1);
    enum cfx_topo_link_type *in_type = calloc(n ? n : 1, sizeof(*in_type));
    cfxResult_t res = cfxSuccess;
    if (sys->paths == NULL || done == NULL || in_type == NULL)
        res = cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for %zu topology paths",
                            n * n);
    for (int src = 0; src < sys->n_nodes && res == cfxSuccess; src++)
        compute_paths_from(sys, src, done, in_type);
    free(done);
    free(in_type);
    return res;
}

/* ------------------------------------------------------------ finishing */

static cfxResult_t check_unique(const struct cfx_topo_system *sys, const char *where)
{
    for (int a = 0; a < sys->n_nodes; a++) {
        const struct cfx_topo_node *na = &sys->nodes[a];
        for (int b = a + 1; b < sys->n_nodes; b++) {
            const struct cfx_topo_node *nb = &sys->nodes[b];
            if (na->busid[0] && nb->busid[0] && na->type != CFX_TOPO_NET &&
                nb->type != CFX_TOPO_NET && na->id == nb->id)
                return cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH,
                                     "%s: PCI bus id %s appears twice", where, na->busid);
            if (na->type == CFX_TOPO_GPU && nb->type == CFX_TOPO_GPU && na->gpu.dev == nb->gpu.dev)
                return cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH,
                                     "%s: two GPUs have device number %d (%s and %s)", where,
                                     na->gpu.dev, na->busid, nb->busid);
        }
    }
    return cfxSuccess;
}

static void visit(const struct cfx_topo_system *sys, int node, int *order, int *n)
{
    order[(*n)++] = node;
    for (int c = node + 1; c < sys->n_nodes; c++)
        if (sys->nodes[c].parent == node)
            visit(sys, c, order, n);
}

/* Nodes in the order a file lists them (each CPU, then its tree depth
 * first), whoever built the system: so a dump loads back identical. */
static cfxResult_t canonical_order(struct cfx_topo_system *sys, const char *where)
{
    int n = sys->n_nodes, count = 0;
    int *order = malloc((size_t)n * sizeof(int));
    int *where_now = malloc((size_t)n * sizeof(int));
    struct cfx_topo_node *nodes = malloc((size_t)n * sizeof(*nodes));
    cfxResult_t res = cfxSuccess;
    if (order == NULL || where_now == NULL || nodes == NULL) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for a topology");
        goto out;
    }
    for (int i = 0; i < n; i++)
        if (sys->nodes[i].type == CFX_TOPO_CPU && sys->nodes[i].parent < 0)
            visit(sys, i, order, &count);
    if (count != n) {
        res = cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH, "%s: %d devices hang from no CPU",
                            where, n - count);
        goto out;
    }
    for (int i = 0; i < n; i++)
        where_now[order[i]] = i;
    for (int i = 0; i < n; i++) {
        nodes[i] = sys->nodes[order[i]];
        if (nodes[i].parent >= 0)
            nodes[i].parent = where_now[nodes[i].parent];
    }
    memcpy(sys->nodes, nodes, (size_t)n * sizeof(*nodes));
out:
    free(order);
    free(where_now);
    free(nodes);
    return res;
}

cfxResult_t cfx_topo_finish(struct cfx_topo_system *sys, const char *where)
{
    if (sys->n_nodes == 0 || sys->nodes[0].type != CFX_TOPO_CPU)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH,
                             "%s: the topology has no <cpu>; every device must hang from one",
                             where);
    cfxResult_t res = canonical_order(sys, where);
    if (res == cfxSuccess)
        res = check_unique(sys, where);
    if (res == cfxSuccess)
        res = make_links(sys);
    if (res != cfxSuccess)
        return res;
    memset(sys->count, 0, sizeof(sys->count));
    for (int n = 0; n < sys->n_nodes; n++) {
        struct cfx_topo_node *node = &sys->nodes[n];
        node->type_index = sys->count[node->type]++;
    }
    return compute_paths(sys);
}

void cfx_topo_free(struct cfx_topo_system *sys)
{
    if (sys == NULL)
        return;
    for (int n = 0; n < sys->n_nodes; n++) {
        free(sys->nodes[n].links);
        if (sys->nodes[n].type == CFX_TOPO_GPU)
            free(sys->nodes[n].gpu.nvlinks);
    }
    free(sys->nodes);
    free(sys->paths);
    free(sys);
}
