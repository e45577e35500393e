/*
 * Detection of this host's topology.
 *
 *  CPUs     one node per NUMA domain (hwloc; sysfs when built without it):
 *           affinity, vendor, family and model, cores and L3 for the log.
 *  GPUs     the CUDA driver's devices (only when this build has CUDA and a
 *           GPU is usable): bus id, compute capability, SM count; their
 *           NVLinks from NVML, loaded at run time (CFX_NVML_LIB).
 *  NICs     libibverbs devices (active ports, speed from the port) and
 *           physical network interfaces (speed from sysfs).
 *  PCI      each device's chain of PCI switches (its sysfs path, as NCCL reads it;
 *           a switch's upstream port stands for the switch, as NCCL does),
 *           with link speeds and widths from sysfs.
 *
 * CFX_TOPO_FILE replaces all of this with a file; CFX_TOPO_DUMP_FILE writes
 * the result. This file places CPUs and the PCI tree; detect_dev.c finds the
 * GPUs and NICs.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "src/topo/detect.h"
#include "src/util/check.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"

/* CFX_TOPO_FILE must name a file that loads (a missing or malformed file is
 * a mistake to report, not a reason to detect instead). */
static const char *check_topo_file(const char *text, char *buf, size_t len)
{
    if (text[0] == '\0')
        return NULL;
    struct cfx_topo_system *sys = NULL;
    if (cfx_topo_load_xml(text, &sys) == cfxSuccess) {
        cfx_topo_free(sys);
        return NULL;
    }
    snprintf(buf, len, "expected a readable NCCL topology XML file (%s)", cfx_error_thread_last());
    cfx_error_thread_clear();
    return buf;
}

CFX_PARAM_STR_CHECKED(topo_file, "TOPO_FILE", NULL, check_topo_file,
                      "Read the topology from this NCCL topology XML file instead of detecting it");
CFX_PARAM_STR(topo_dump_file, "TOPO_DUMP_FILE", NULL,
              "Write the topology (detected or read) to this file as NCCL topology XML");

#define MAX_CHAIN 16

/* ------------------------------------------------------------ CPUs */

static void cpu_identity(struct cfx_topo_node *cpu)
{
    struct utsname name;
    if (uname(&name) == 0)
        cfx_topo_text_copy(cpu->cpu.arch, sizeof(cpu->cpu.arch),
                           strcmp(name.machine, "aarch64") == 0 ? "arm64" : name.machine);
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL)
        return;
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        char *colon = strchr(line, ':');
        if (colon == NULL)
            continue;
        const char *value = colon + 1 + strspn(colon + 1, " \t");
        if (strncmp(line, "vendor_id", 9) == 0 && cpu->cpu.vendor[0] == '\0')
            snprintf(cpu->cpu.vendor, sizeof(cpu->cpu.vendor), "%.*s", (int)strcspn(value, "\n"),
                     value);
        else if (strncmp(line, "cpu family", 10) == 0 && cpu->cpu.family < 0)
            cpu->cpu.family = atoi(value);
        else if (strncmp(line, "model", 5) == 0 && isspace((unsigned char)line[5]) &&
                 cpu->cpu.model < 0)
            cpu->cpu.model = atoi(value);
        if (line[0] == '\n' && cpu->cpu.vendor[0])
            break; /* First processor is enough. */
    }
    fclose(f);
}

static int numa_ids_from_sysfs(int *ids, int max)
{
    DIR *dir = opendir("/sys/devices/system/node");
    int n = 0;
    if (dir == NULL)
        return 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        char *end = NULL;
        if (strncmp(e->d_name, "node", 4) != 0 || !isdigit((unsigned char)e->d_name[4]))
            continue;
        long id = strtol(e->d_name + 4, &end, 10);
        if (*end == '\0' && n < max)
            ids[n++] = (int)id;
    }
    closedir(dir);
    for (int i = 1; i < n; i++) /* Sort: readdir order is arbitrary. */
        for (int j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
            int t = ids[j];
            ids[j] = ids[j - 1];
            ids[j - 1] = t;
        }
    return n;
}

static void describe_cpu_for_log(struct detection *det, const struct cfx_topo_node *cpu)
{
    int cores = 0;
    unsigned long long l3 = 0;
#if CFX_HAVE_HWLOC
    if (det->hwloc_loaded) {
        hwloc_obj_t numa =
            hwloc_get_numanode_obj_by_os_index(det->hwloc, (unsigned)cpu->cpu.numa_id);
        if (numa && numa->cpuset) {
            cores =
                hwloc_get_nbobjs_inside_cpuset_by_type(det->hwloc, numa->cpuset, HWLOC_OBJ_CORE);
            hwloc_obj_t cache = hwloc_get_next_obj_covering_cpuset_by_type(det->hwloc, numa->cpuset,
                                                                           HWLOC_OBJ_L3CACHE, NULL);
            if (cache == NULL)
                cache = hwloc_get_obj_inside_cpuset_by_type(det->hwloc, numa->cpuset,
                                                            HWLOC_OBJ_L3CACHE, 0);
            if (cache && cache->attr)
                l3 = cache->attr->cache.size;
        }
    }
#else
    (void)det;
#endif
    CFX_INFO(CFX_LOG_GRAPH,
             "CPU/%d: NUMA %d, %d cores, %s family %d model %d, L3 %llu KiB, cpus %s",
             cpu->type_index, cpu->cpu.numa_id, cores, cpu->cpu.vendor, cpu->cpu.family,
             cpu->cpu.model, l3 >> 10, cpu->cpu.affinity);
}

static cfxResult_t detect_cpus(struct detection *det)
{
    int ids[256];
    int n = 0;
#if CFX_HAVE_HWLOC
    if (det->hwloc_loaded) {
        int total = hwloc_get_nbobjs_by_type(det->hwloc, HWLOC_OBJ_NUMANODE);
        for (int i = 0; i < total && n < 256; i++) {
            hwloc_obj_t numa = hwloc_get_obj_by_type(det->hwloc, HWLOC_OBJ_NUMANODE, (unsigned)i);
            ids[n++] = (int)numa->os_index;
        }
    }
#endif
    if (n == 0)
        n = numa_ids_from_sysfs(ids, 256);
    if (n == 0)
        ids[n++] = 0; /* No NUMA information at all: one domain. */
    for (int i = 0; i < n; i++) {
        int c = cfx_topo_add_node(det->sys, CFX_TOPO_CPU, -1);
        if (c < 0)
            return cfxSystemError;
        struct cfx_topo_node *cpu = &det->sys->nodes[c];
        cpu->cpu.numa_id = ids[i];
        cpu->id = (uint64_t)ids[i];
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpumap", ids[i]);
        cfx_topo_sysfs_read(path, cpu->cpu.affinity, sizeof(cpu->cpu.affinity));
        cpu_identity(cpu);
#if CFX_HAVE_HWLOC
        if (det->hwloc_loaded) {
            hwloc_obj_t pkg = hwloc_get_obj_by_type(det->hwloc, HWLOC_OBJ_PACKAGE, 0);
            const char *vendor = pkg ? hwloc_obj_get_info_by_name(pkg, "CPUVendor") : NULL;
            if (vendor)
                snprintf(cpu->cpu.vendor, sizeof(cpu->cpu.vendor), "%s", vendor);
        }
#endif
    }
    return cfxSuccess;
}

static int cpu_node_for_numa(const struct cfx_topo_system *sys, int numa)
{
    for (int n = 0; n < sys->n_nodes; n++)
        if (sys->nodes[n].type == CFX_TOPO_CPU && sys->nodes[n].cpu.numa_id == numa)
            return n;
    return 0; /* Unknown (-1 in VMs): the first domain. */
}

/* ------------------------------------------------------------ PCI tree */

/* Bridges above @p busid, top down (from its sysfs path), and the device's
 * NUMA domain. */
static int pci_chain(const char *busid, char chain[][CFX_TOPO_BUSID_MAX], int *numa_p)
{
    int n = 0;
    char text[32];
    *numa_p =
        cfx_topo_sysfs_pci_attr(busid, "numa_node", text, sizeof(text)) == 0 ? atoi(text) : -1;
    char path[PATH_MAX], real[PATH_MAX];
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s", busid);
    if (realpath(path, real) == NULL)
        return 0;
    char *save = NULL;
    for (char *part = strtok_r(real, "/", &save); part; part = strtok_r(NULL, "/", &save))
        if (cfx_topo_sysfs_is_busid(part) && n < MAX_CHAIN)
            cfx_topo_busid_normalize(part, chain[n++], CFX_TOPO_BUSID_MAX);
    if (n > 0)
        n--; /* The last one is the device itself. */
    return n;
}

static int find_pci_node(const struct cfx_topo_system *sys, const char *busid)
{
    for (int n = 0; n < sys->n_nodes; n++)
        if (strcmp(sys->nodes[n].busid, busid) == 0)
            return n;
    return -1;
}

/* The parent a device hangs from: a switch is a (downstream port, upstream
 * port) pair of bridges, stood for by its upstream port; a lone root port
 * above them is the CPU's. */
static int place_device(struct detection *det, const char *busid)
{
    char chain[MAX_CHAIN][CFX_TOPO_BUSID_MAX];
    int numa;
    int n = pci_chain(busid, chain, &numa);
    int parent = cpu_node_for_numa(det->sys, numa);
    /* Keep chain[n-2], chain[n-4], ...: walk top down over those. */
    for (int i = n % 2; i < n; i += 2) {
        const char *upstream = chain[i];
        int node = find_pci_node(det->sys, upstream);
        if (node < 0) {
            node = cfx_topo_add_node(det->sys, CFX_TOPO_PCI, parent);
            if (node < 0)
                return -1;
            struct cfx_topo_node *sw = &det->sys->nodes[node];
            snprintf(sw->busid, sizeof(sw->busid), "%s", upstream);
            cfx_topo_busid_parse(upstream, &sw->id);
            cfx_topo_sysfs_pci_fill(sw, upstream);
        }
        parent = node;
    }
    return parent;
}

static int compare_devs(const void *a, const void *b)
{
    const struct found_dev *x = a, *y = b;
    int xa = x->busid[0] == '\0', ya = y->busid[0] == '\0';
    if (xa != ya)
        return xa - ya; /* Devices with no PCI function last. */
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return (int)x->type - (int)y->type;
}

static cfxResult_t build_devices(struct detection *det)
{
    qsort(det->devs, (size_t)det->n_devs, sizeof(det->devs[0]), compare_devs);
    int next_net = 0;
    for (int i = 0; i < det->n_devs; i++) {
        const struct found_dev *dev = &det->devs[i];
        if (dev->type == CFX_TOPO_NIC && dev->n_nets == 0)
            continue;
        int parent = dev->busid[0] ? place_device(det, dev->busid) : 0;
        if (parent < 0)
            return cfxSystemError;
        int n = cfx_topo_add_node(det->sys, dev->type, parent);
        if (n < 0)
            return cfxSystemError;
        struct cfx_topo_node *node = &det->sys->nodes[n];
        if (dev->busid[0]) {
            snprintf(node->busid, sizeof(node->busid), "%s", dev->busid);
            node->id = dev->id;
            cfx_topo_sysfs_pci_fill(node, dev->busid);
        }
        if (dev->type == CFX_TOPO_GPU) {
            node->gpu.dev = dev->cuda_dev;
            node->gpu.sm = dev->sm;
            node->gpu.sm_count = dev->sm_count;
            if (node->pci_class == 0)
                node->pci_class = CFX_TOPO_CLASS_GPU; /* Not in sysfs (build.h). */
            continue;
        }
        for (int p = 0; p < dev->n_nets; p++) {
            int net_index = cfx_topo_add_node(det->sys, CFX_TOPO_NET, n);
            if (net_index < 0)
                return cfxSystemError;
            struct cfx_topo_node *net = &det->sys->nodes[net_index];
            const struct found_net *found = &dev->nets[p];
            snprintf(net->net.name, sizeof(net->net.name), "%s", found->name);
            net->net.dev = next_net++;
            net->net.port = found->port;
            net->net.speed_mbps = found->speed_mbps;
            net->net.guid = found->guid;
            net->net.maxconn = found->maxconn;
            net->net.gdr = found->gdr;
            net->id = (uint64_t)found->port;
            if (!found->speed_known)
                CFX_INFO(CFX_LOG_GRAPH, "%s does not report its speed; %d Gb/s assumed",
                         found->name, found->speed_mbps / 1000);
        }
    }
    return cfxSuccess;
}

/* ------------------------------------------------------------ entry */

static void log_gpu(const struct cfx_topo_node *gpu)
{
    int links = 0;
    double nvl_bw = 0;
    for (int r = 0; r < gpu->gpu.n_nvlinks; r++)
        links += gpu->gpu.nvlinks[r].count;
    for (int l = 0; l < gpu->n_links; l++)
        if (gpu->links[l].type == CFX_LINK_NVL)
            nvl_bw += gpu->links[l].bw;
    char sms[24] = "SM count unknown"; /* A file does not carry it. */
    if (gpu->gpu.sm_count > 0)
        snprintf(sms, sizeof(sms), "%d SMs", gpu->gpu.sm_count);
    CFX_INFO(CFX_LOG_GRAPH, "GPU/%d: %s sm%d, %s, %d NVLinks to %d target(s), %.1f GB/s",
             gpu->gpu.dev, gpu->busid, gpu->gpu.sm, sms, links, gpu->gpu.n_nvlinks, nvl_bw);
}

static void log_system(const struct cfx_topo_system *sys, struct detection *det)
{
    char summary[256];
    cfx_topo_summary(sys, summary, sizeof(summary));
    CFX_INFO(CFX_LOG_GRAPH, "topology (%s): %s", sys->source, summary);
    for (int n = 0; n < sys->n_nodes; n++) {
        const struct cfx_topo_node *node = &sys->nodes[n];
        if (node->type == CFX_TOPO_CPU && det)
            describe_cpu_for_log(det, node);
        else if (node->type == CFX_TOPO_GPU)
            log_gpu(node);
        else if (node->type == CFX_TOPO_NET)
            CFX_INFO(CFX_LOG_GRAPH, "NET/%d: %s port %d, %d Gb/s, on %s", node->net.dev,
                     node->net.name, node->net.port, node->net.speed_mbps / 1000,
                     node->parent >= 0 && sys->nodes[node->parent].busid[0]
                         ? sys->nodes[node->parent].busid
                         : "no PCI function");
    }
    if (sys->count[CFX_TOPO_GPU] == 0)
        CFX_INFO(CFX_LOG_GRAPH, "no GPU (%s): the graph is CPU/NUMA only; ranks are host ranks",
                 det && det->no_gpu_reason[0] ? det->no_gpu_reason : "none in the description");
    if (det && det->nvml_note[0])
        CFX_INFO(CFX_LOG_GRAPH, "%s", det->nvml_note);
}

static cfxResult_t detect_host(struct cfx_topo_system **sys_p)
{
    cfxResult_t res = cfxSuccess;
    struct detection *det = calloc(1, sizeof(*det));
    if (det == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "out of memory for detection");
    det->sys = cfx_topo_new("detected");
    if (det->sys == NULL) {
        res = cfxSystemError;
        goto out;
    }
#if CFX_HAVE_HWLOC
    if (hwloc_topology_init(&det->hwloc) == 0) {
        /* CPUs and NUMA only: the PCI chain of each GPU and NIC comes from its
         * sysfs path (pci_chain), as NCCL reads it. hwloc's own PCI discovery
         * reads every function's config space, which costs ~2 ms a device in
         * a VM, in every rank process (a third of a 64-rank init here). */
        hwloc_topology_set_io_types_filter(det->hwloc, HWLOC_TYPE_FILTER_KEEP_NONE);
        det->hwloc_loaded = hwloc_topology_load(det->hwloc) == 0;
        if (!det->hwloc_loaded)
            hwloc_topology_destroy(det->hwloc);
    }
#endif
    CFX_CHECK_GOTO(detect_cpus(det), res, out_hwloc);
    cfx_topo_detect_gpus(det);
    cfx_topo_detect_nics(det);
    CFX_CHECK_GOTO(build_devices(det), res, out_hwloc);
#if CFX_HAVE_CUDA
    for (int i = 0; i < det->n_devs; i++)
        if (det->devs[i].type == CFX_TOPO_GPU) {
            CFX_CHECK_GOTO(cfx_topo_detect_nvlinks(det), res, out_hwloc);
            break;
        }
#endif
    CFX_CHECK_GOTO(cfx_topo_finish(det->sys, "detection"), res, out_hwloc);
    log_system(det->sys, det);
    *sys_p = det->sys;
    det->sys = NULL;
out_hwloc:
#if CFX_HAVE_HWLOC
    if (det->hwloc_loaded)
        hwloc_topology_destroy(det->hwloc);
#endif
out:
    cfx_topo_free(det->sys);
    free(det);
    return res;
}

cfxResult_t cfx_topo_detect(struct cfx_topo_system **sys_p)
{
    struct cfx_topo_system *sys = NULL;
    const char *file = param_topo_file();
    if (file && file[0]) {
        CFX_CHECK(cfx_topo_load_xml(file, &sys));
        CFX_INFO(CFX_LOG_GRAPH, "topology read from CFX_TOPO_FILE=%s", file);
        log_system(sys, NULL);
    } else {
        CFX_CHECK(detect_host(&sys));
    }
    const char *dump = param_topo_dump_file();
    if (dump && dump[0]) {
        if (cfx_topo_dump_xml(sys, dump) == cfxSuccess)
            CFX_INFO(CFX_LOG_GRAPH, "topology written to CFX_TOPO_DUMP_FILE=%s", dump);
        else
            CFX_WARN(CFX_LOG_GRAPH, "could not write CFX_TOPO_DUMP_FILE=%s: %s", dump,
                     cfx_error_thread_last());
    }
    *sys_p = sys;
    return cfxSuccess;
}
