/*
 * Detection of this host's topology.
 *
 *  CPUs     one node per NUMA domain (hwloc; sysfs when built without it):
 *           affinity, vendor, family and model, cores and L3 for the log.
 *  GPUs     the CUDA runtime's devices (only when this build has CUDA and a
 *           GPU is usable), with NVLinks from NVML, loaded at run time.
 *  NICs     libibverbs devices (active ports, speed from the port) and
 *           physical network interfaces (speed from sysfs).
 *  PCI      each device's chain of PCI switches (hwloc, else the sysfs path;
 *           a switch's upstream port stands for the switch, as NCCL does),
 *           with link speeds and widths from sysfs.
 *
 * CFX_TOPO_FILE replaces all of this with a file; CFX_TOPO_DUMP_FILE writes
 * the result.
 */
#include <ctype.h>
#include <dirent.h>
#include <endian.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "cfx_build_config.h"
#include "src/topo/build.h"
#include "src/util/check.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"

#if CFX_HAVE_HWLOC
#include <hwloc.h>
#endif
#if CFX_HAVE_VERBS
#include <infiniband/verbs.h>
#endif
#if CFX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

CFX_PARAM_STR(topo_file, "TOPO_FILE", NULL,
              "Read the topology from this NCCL topology XML file instead of detecting it");
CFX_PARAM_STR(topo_dump_file, "TOPO_DUMP_FILE", NULL,
              "Write the topology (detected or read) to this file as NCCL topology XML");

#define MAX_DEVICES    256
#define MAX_PORTS      8
#define MAX_CHAIN      16
#define DEFAULT_MBPS   10000 /* A network interface that does not report its speed. */
#define NVML_MAX_LINKS 18

struct found_net {
    char name[CFX_TOPO_NAME_MAX];
    int port;
    int speed_mbps;
    uint64_t guid;
    int maxconn;
    int gdr;
    int speed_known;
};

struct found_dev {
    enum cfx_topo_node_type type; /* GPU or NIC. */
    char busid[CFX_TOPO_BUSID_MAX]; /* "" for a NIC with no PCI function. */
    uint64_t id;
    int cuda_dev, sm;
    int n_nets;
    struct found_net nets[MAX_PORTS];
};

struct detection {
    struct cfx_topo_system *sys;
    int n_devs;
    struct found_dev devs[MAX_DEVICES];
    char no_gpu_reason[160];
    char nvml_note[160];
#if CFX_HAVE_HWLOC
    hwloc_topology_t hwloc;
    int hwloc_loaded;
#endif
};

/* ------------------------------------------------------------ sysfs */

/* Copy @p src into @p dst of @p size bytes, cut if needed. */
static void set_text(char *dst, size_t size, const char *src)
{
    size_t n = strlen(src);
    if (n >= size)
        n = size - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static int read_text(const char *path, char *out, size_t size)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    int ok = fgets(out, (int)size, f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    out[strcspn(out, "\n")] = '\0';
    return 0;
}

static int read_pci_attr(const char *busid, const char *attr, char *out, size_t size)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/%s", busid, attr);
    return read_text(path, out, size);
}

static int looks_like_busid(const char *text)
{
    unsigned d, b, s, f;
    char tail;
    return sscanf(text, "%x:%x:%x.%x%c", &d, &b, &s, &f, &tail) == 4;
}

/* The last PCI function in a sysfs path ("/sys/devices/pci0000:00/0000:00:03.0/virtio2"). */
static int busid_of_sysfs_path(const char *real, char *busid, size_t size)
{
    char copy[PATH_MAX];
    snprintf(copy, sizeof(copy), "%s", real);
    int found = 0;
    char *save = NULL;
    for (char *part = strtok_r(copy, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
        if (looks_like_busid(part)) {
            cfx_topo_busid_normalize(part, busid, size);
            found = 1;
        }
    }
    return found ? 0 : -1;
}

static void fill_pci_attrs(struct cfx_topo_node *node, const char *busid)
{
    char text[64];
    if (read_pci_attr(busid, "class", text, sizeof(text)) == 0)
        node->pci_class = (uint32_t)strtoul(text, NULL, 16);
    read_pci_attr(busid, "vendor", node->vendor, sizeof(node->vendor));
    read_pci_attr(busid, "device", node->device, sizeof(node->device));
    read_pci_attr(busid, "subsystem_vendor", node->subsys_vendor, sizeof(node->subsys_vendor));
    read_pci_attr(busid, "subsystem_device", node->subsys_device, sizeof(node->subsys_device));
    /* The maximum: GPUs train their links down when idle. */
    if (read_pci_attr(busid, "max_link_speed", text, sizeof(text)) == 0 && strstr(text, "GT/s"))
        set_text(node->link_speed, sizeof(node->link_speed), text);
    if (read_pci_attr(busid, "max_link_width", text, sizeof(text)) == 0)
        node->link_width = atoi(text);
}

/* ------------------------------------------------------------ CPUs */

static void cpu_identity(struct cfx_topo_node *cpu)
{
    struct utsname name;
    if (uname(&name) == 0)
        set_text(cpu->cpu.arch, sizeof(cpu->cpu.arch),
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
            snprintf(cpu->cpu.vendor, sizeof(cpu->cpu.vendor), "%.*s",
                     (int)strcspn(value, "\n"), value);
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
            cores = hwloc_get_nbobjs_inside_cpuset_by_type(det->hwloc, numa->cpuset,
                                                           HWLOC_OBJ_CORE);
            hwloc_obj_t cache = hwloc_get_next_obj_covering_cpuset_by_type(
                det->hwloc, numa->cpuset, HWLOC_OBJ_L3CACHE, NULL);
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
    CFX_INFO(CFX_LOG_GRAPH, "CPU/%d: NUMA %d, %d cores, %s family %d model %d, L3 %llu KiB, cpus %s",
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
        read_text(path, cpu->cpu.affinity, sizeof(cpu->cpu.affinity));
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

/* ------------------------------------------------------------ GPUs */

#if CFX_HAVE_CUDA
/* The part of NVML's interface used here (NVML's own header is not needed). */
typedef struct nvml_device *nvml_device_t;
struct nvml_pci_info {
    char bus_id_legacy[16];
    unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
};
struct nvml_api {
    int (*init)(void);
    int (*shutdown)(void);
    int (*by_busid)(const char *, nvml_device_t *);
    int (*link_state)(nvml_device_t, unsigned int, int *);
    int (*remote_pci)(nvml_device_t, unsigned int, struct nvml_pci_info *);
};

static int nvml_open(struct nvml_api *api, char *note, size_t size)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        snprintf(note, size, "NVML not loadable (libnvidia-ml.so.1): NVLinks unknown");
        return -1;
    }
    *(void **)&api->init = dlsym(lib, "nvmlInit_v2");
    *(void **)&api->shutdown = dlsym(lib, "nvmlShutdown");
    *(void **)&api->by_busid = dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    *(void **)&api->link_state = dlsym(lib, "nvmlDeviceGetNvLinkState");
    *(void **)&api->remote_pci = dlsym(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    if (!api->init || !api->shutdown || !api->by_busid || !api->link_state || !api->remote_pci) {
        snprintf(note, size, "NVML lacks NVLink queries: NVLinks unknown");
        return -1;
    }
    if (api->init() != 0) {
        snprintf(note, size, "nvmlInit failed: NVLinks unknown");
        return -1;
    }
    return 0; /* The library stays loaded, as NCCL keeps it. */
}

/* NVLinks of each GPU, grouped by remote device. */
static cfxResult_t detect_nvlinks(struct detection *det)
{
    struct nvml_api api;
    if (nvml_open(&api, det->nvml_note, sizeof(det->nvml_note)) != 0)
        return cfxSuccess;
    cfxResult_t res = cfxSuccess;
    for (int n = 0; n < det->sys->n_nodes && res == cfxSuccess; n++) {
        if (det->sys->nodes[n].type != CFX_TOPO_GPU)
            continue;
        nvml_device_t dev;
        if (api.by_busid(det->sys->nodes[n].busid, &dev) != 0)
            continue;
        char targets[NVML_MAX_LINKS][CFX_TOPO_BUSID_MAX];
        int counts[NVML_MAX_LINKS], n_targets = 0;
        for (unsigned l = 0; l < NVML_MAX_LINKS; l++) {
            int active = 0;
            struct nvml_pci_info pci;
            if (api.link_state(dev, l, &active) != 0 || !active)
                continue;
            if (api.remote_pci(dev, l, &pci) != 0)
                continue;
            char busid[CFX_TOPO_BUSID_MAX];
            cfx_topo_busid_normalize(pci.bus_id_legacy[0] ? pci.bus_id_legacy : pci.bus_id, busid,
                                     sizeof(busid));
            int t = 0;
            while (t < n_targets && strcmp(targets[t], busid) != 0)
                t++;
            if (t == n_targets) {
                snprintf(targets[t], sizeof(targets[t]), "%s", busid);
                counts[n_targets++] = 0;
            }
            counts[t]++;
        }
        for (int t = 0; t < n_targets && res == cfxSuccess; t++) {
            char text[32];
            uint32_t tclass = 0x068000; /* Not visible: an NVSwitch (as NCCL assumes). */
            uint64_t id;
            if (read_pci_attr(targets[t], "class", text, sizeof(text)) == 0)
                tclass = (uint32_t)strtoul(text, NULL, 16);
            else if (cfx_topo_busid_parse(targets[t], &id) == 0)
                for (int g = 0; g < det->sys->n_nodes; g++)
                    if (det->sys->nodes[g].type == CFX_TOPO_GPU && det->sys->nodes[g].id == id)
                        tclass = 0x030200;
            res = cfx_topo_gpu_add_nvlink(det->sys, n, targets[t], counts[t], tclass);
        }
    }
    api.shutdown();
    return res;
}
#endif

static void detect_gpus(struct detection *det)
{
#if CFX_HAVE_CUDA
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        snprintf(det->no_gpu_reason, sizeof(det->no_gpu_reason), "CUDA runtime: %s",
                 err != cudaSuccess ? cudaGetErrorString(err) : "no device");
        (void)cudaGetLastError();
        return;
    }
    for (int d = 0; d < count && det->n_devs < MAX_DEVICES; d++) {
        struct found_dev *dev = &det->devs[det->n_devs];
        memset(dev, 0, sizeof(*dev));
        char busid[64];
        int major = 0, minor = 0;
        if (cudaDeviceGetPCIBusId(busid, sizeof(busid), d) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d);
        dev->type = CFX_TOPO_GPU;
        cfx_topo_busid_normalize(busid, dev->busid, sizeof(dev->busid));
        cfx_topo_busid_parse(dev->busid, &dev->id);
        dev->cuda_dev = d;
        dev->sm = major * 10 + minor;
        det->n_devs++;
    }
#else
    snprintf(det->no_gpu_reason, sizeof(det->no_gpu_reason), "this build has no CUDA");
#endif
}

/* ------------------------------------------------------------ NICs */

static struct found_dev *nic_for_busid(struct detection *det, const char *busid)
{
    for (int i = 0; i < det->n_devs; i++)
        if (det->devs[i].type == CFX_TOPO_NIC && busid[0] &&
            strcmp(det->devs[i].busid, busid) == 0)
            return &det->devs[i];
    if (det->n_devs == MAX_DEVICES)
        return NULL;
    struct found_dev *dev = &det->devs[det->n_devs++];
    memset(dev, 0, sizeof(*dev));
    dev->type = CFX_TOPO_NIC;
    snprintf(dev->busid, sizeof(dev->busid), "%s", busid);
    if (busid[0])
        cfx_topo_busid_parse(busid, &dev->id);
    return dev;
}

#if CFX_HAVE_VERBS
static int ib_speed_mbps(int active_speed, int active_width)
{
    int lane;
    switch (active_speed) {
    case 1: lane = 2500; break;
    case 2: lane = 5000; break;
    case 4: case 8: lane = 10000; break;
    case 16: lane = 14000; break;
    case 32: lane = 25000; break;
    case 64: lane = 50000; break;
    case 128: lane = 100000; break;
    case 256: lane = 200000; break;
    default: lane = 10000; break;
    }
    int width;
    switch (active_width) {
    case 1: width = 1; break;
    case 2: width = 4; break;
    case 4: width = 8; break;
    case 8: width = 12; break;
    case 16: width = 2; break;
    default: width = 1; break;
    }
    return lane * width;
}

static void detect_verbs(struct detection *det)
{
    if (access("/sys/class/infiniband", F_OK) != 0)
        return; /* No RDMA devices; also keeps libibverbs from warning. */
    int count = 0;
    struct ibv_device **list = ibv_get_device_list(&count);
    if (list == NULL)
        return;
    for (int i = 0; i < count; i++) {
        const char *name = ibv_get_device_name(list[i]);
        char path[PATH_MAX], real[PATH_MAX], busid[CFX_TOPO_BUSID_MAX] = "";
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device", name);
        if (realpath(path, real) == NULL || busid_of_sysfs_path(real, busid, sizeof(busid)) != 0)
            busid[0] = '\0';
        struct ibv_context *ctx = ibv_open_device(list[i]);
        if (ctx == NULL)
            continue;
        struct ibv_device_attr attr;
        if (ibv_query_device(ctx, &attr) == 0) {
            for (int p = 1; p <= attr.phys_port_cnt; p++) {
                struct ibv_port_attr port;
                if (ibv_query_port(ctx, (uint8_t)p, &port) != 0 || port.state != IBV_PORT_ACTIVE)
                    continue;
                struct found_dev *nic = nic_for_busid(det, busid);
                if (nic == NULL || nic->n_nets == MAX_PORTS)
                    continue;
                struct found_net *net = &nic->nets[nic->n_nets++];
                memset(net, 0, sizeof(*net));
                snprintf(net->name, sizeof(net->name), "%s", name);
                net->port = p;
                net->speed_mbps = ib_speed_mbps(port.active_speed, port.active_width);
                net->speed_known = 1;
                net->guid = be64toh(attr.node_guid);
                net->maxconn = attr.max_qp;
                net->gdr = access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0 ||
                           access("/sys/module/nvidia_peermem/version", F_OK) == 0;
            }
        }
        ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
}
#endif

/* Physical network interfaces that are up, other than those of RDMA NICs. */
static void detect_netdevs(struct detection *det)
{
    DIR *dir = opendir("/sys/class/net");
    if (dir == NULL)
        return;
    char names[64][CFX_TOPO_NAME_MAX];
    int n = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL && n < 64;)
        if (e->d_name[0] != '.' && strcmp(e->d_name, "lo") != 0)
            set_text(names[n++], CFX_TOPO_NAME_MAX, e->d_name);
    closedir(dir);
    for (int i = 1; i < n; i++) /* Sorted, for a stable order. */
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char t[CFX_TOPO_NAME_MAX];
            memcpy(t, names[j], sizeof(t));
            memcpy(names[j], names[j - 1], sizeof(t));
            memcpy(names[j - 1], t, sizeof(t));
        }
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX], real[PATH_MAX], text[64], busid[CFX_TOPO_BUSID_MAX];
        snprintf(path, sizeof(path), "/sys/class/net/%.64s/device", names[i]);
        if (realpath(path, real) == NULL || strstr(real, "/virtual/"))
            continue; /* Virtual: bridges, veth, ifb, docker. */
        snprintf(path, sizeof(path), "/sys/class/net/%.64s/operstate", names[i]);
        if (read_text(path, text, sizeof(text)) != 0 || strcmp(text, "up") != 0)
            continue;
        if (busid_of_sysfs_path(real, busid, sizeof(busid)) != 0)
            busid[0] = '\0';
        int taken = 0; /* An RDMA NIC already stands for this function. */
        for (int d = 0; d < det->n_devs; d++)
            if (det->devs[d].type == CFX_TOPO_NIC && busid[0] &&
                strcmp(det->devs[d].busid, busid) == 0 && det->devs[d].n_nets > 0)
                taken = 1;
        if (taken)
            continue;
        struct found_dev *nic = nic_for_busid(det, busid);
        if (nic == NULL || nic->n_nets == MAX_PORTS)
            continue;
        struct found_net *net = &nic->nets[nic->n_nets++];
        memset(net, 0, sizeof(*net));
        set_text(net->name, sizeof(net->name), names[i]);
        net->port = 1;
        net->maxconn = 65536;
        snprintf(path, sizeof(path), "/sys/class/net/%.64s/speed", names[i]);
        int speed = read_text(path, text, sizeof(text)) == 0 ? atoi(text) : -1;
        net->speed_known = speed > 0;
        net->speed_mbps = speed > 0 ? speed : DEFAULT_MBPS;
    }
}

/* ------------------------------------------------------------ PCI tree */

/* Bridges above @p busid, top down, and the device's NUMA domain. */
static int pci_chain(struct detection *det, const char *busid, char chain[][CFX_TOPO_BUSID_MAX],
                     int *numa_p)
{
    int n = 0;
    char text[32];
    *numa_p = read_pci_attr(busid, "numa_node", text, sizeof(text)) == 0 ? atoi(text) : -1;
#if CFX_HAVE_HWLOC
    unsigned d, b, s, f;
    hwloc_obj_t obj = NULL;
    if (det->hwloc_loaded && sscanf(busid, "%x:%x:%x.%x", &d, &b, &s, &f) == 4)
        obj = hwloc_get_pcidev_by_busid(det->hwloc, d, b, s, f);
    if (obj) {
        char rev[MAX_CHAIN][CFX_TOPO_BUSID_MAX];
        int depth = 0;
        for (hwloc_obj_t up = obj->parent; up && up->type == HWLOC_OBJ_BRIDGE; up = up->parent) {
            if (up->attr->bridge.upstream_type != HWLOC_OBJ_BRIDGE_PCI || depth == MAX_CHAIN)
                break; /* The host bridge. */
            snprintf(rev[depth++], CFX_TOPO_BUSID_MAX, "%04x:%02x:%02x.%x",
                     up->attr->bridge.upstream.pci.domain, up->attr->bridge.upstream.pci.bus,
                     up->attr->bridge.upstream.pci.dev, up->attr->bridge.upstream.pci.func);
        }
        for (int i = depth - 1; i >= 0; i--)
            memcpy(chain[n++], rev[i], CFX_TOPO_BUSID_MAX);
        if (*numa_p < 0) {
            hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(det->hwloc, obj);
            hwloc_obj_t numa = anc ? hwloc_get_next_obj_covering_cpuset_by_type(
                                         det->hwloc, anc->cpuset, HWLOC_OBJ_NUMANODE, NULL)
                                   : NULL;
            if (numa)
                *numa_p = (int)numa->os_index;
        }
        return n;
    }
#else
    (void)det;
#endif
    char path[PATH_MAX], real[PATH_MAX];
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s", busid);
    if (realpath(path, real) == NULL)
        return 0;
    char *save = NULL;
    for (char *part = strtok_r(real, "/", &save); part; part = strtok_r(NULL, "/", &save))
        if (looks_like_busid(part) && n < MAX_CHAIN)
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
    int n = pci_chain(det, busid, chain, &numa);
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
            fill_pci_attrs(sw, upstream);
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
            fill_pci_attrs(node, dev->busid);
        }
        if (dev->type == CFX_TOPO_GPU) {
            node->gpu.dev = dev->cuda_dev;
            node->gpu.sm = dev->sm;
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
            CFX_INFO(CFX_LOG_GRAPH, "GPU/%d: %s sm%d, %d NVLink target(s)", node->gpu.dev,
                     node->busid, node->gpu.sm, node->gpu.n_nvlinks);
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
        hwloc_topology_set_io_types_filter(det->hwloc, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
        det->hwloc_loaded = hwloc_topology_load(det->hwloc) == 0;
        if (!det->hwloc_loaded)
            hwloc_topology_destroy(det->hwloc);
    }
#endif
    CFX_CHECK_GOTO(detect_cpus(det), res, out_hwloc);
    detect_gpus(det);
#if CFX_HAVE_VERBS
    detect_verbs(det);
#endif
    detect_netdevs(det);
    CFX_CHECK_GOTO(build_devices(det), res, out_hwloc);
#if CFX_HAVE_CUDA
    CFX_CHECK_GOTO(detect_nvlinks(det), res, out_hwloc);
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
