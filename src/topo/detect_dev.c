/*
 * Devices for detection (see detect.h): GPUs from the CUDA runtime with
 * their NVLinks from NVML (dlopen'ed, no build dependency), NICs from
 * libibverbs and from /sys/class/net, and the sysfs helpers both use.
 */
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <endian.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/topo/detect.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"

#include "src/util/cuda.h"
#include "src/util/verbs.h"

#define DEFAULT_MBPS 10000 /* A network interface that does not report its speed. */

/* ------------------------------------------------------------ sysfs */

/* Copy @p src into @p dst of @p size bytes, cut if needed. */
void cfx_topo_text_copy(char *dst, size_t size, const char *src)
{
    size_t n = strlen(src);
    if (n >= size)
        n = size - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

int cfx_topo_sysfs_read(const char *path, char *out, size_t size)
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

int cfx_topo_sysfs_pci_attr(const char *busid, const char *attr, char *out, size_t size)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/%s", busid, attr);
    return cfx_topo_sysfs_read(path, out, size);
}

int cfx_topo_sysfs_is_busid(const char *text)
{
    unsigned d, b, s, f;
    char tail;
    return sscanf(text, "%x:%x:%x.%x%c", &d, &b, &s, &f, &tail) == 4;
}

/* The last PCI function in a sysfs path ("/sys/devices/pci0000:00/0000:00:03.0/virtio2"). */
int cfx_topo_sysfs_busid(const char *real, char *busid, size_t size)
{
    char copy[PATH_MAX];
    snprintf(copy, sizeof(copy), "%s", real);
    int found = 0;
    char *save = NULL;
    for (char *part = strtok_r(copy, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
        if (cfx_topo_sysfs_is_busid(part)) {
            cfx_topo_busid_normalize(part, busid, size);
            found = 1;
        }
    }
    return found ? 0 : -1;
}

void cfx_topo_sysfs_pci_fill(struct cfx_topo_node *node, const char *busid)
{
    char text[64];
    if (cfx_topo_sysfs_pci_attr(busid, "class", text, sizeof(text)) == 0)
        node->pci_class = (uint32_t)strtoul(text, NULL, 16);
    cfx_topo_sysfs_pci_attr(busid, "vendor", node->vendor, sizeof(node->vendor));
    cfx_topo_sysfs_pci_attr(busid, "device", node->device, sizeof(node->device));
    cfx_topo_sysfs_pci_attr(busid, "subsystem_vendor", node->subsys_vendor,
                            sizeof(node->subsys_vendor));
    cfx_topo_sysfs_pci_attr(busid, "subsystem_device", node->subsys_device,
                            sizeof(node->subsys_device));
    /* The maximum: GPUs train their links down when idle. */
    if (cfx_topo_sysfs_pci_attr(busid, "max_link_speed", text, sizeof(text)) == 0 &&
        strstr(text, "GT/s"))
        cfx_topo_text_copy(node->link_speed, sizeof(node->link_speed), text);
    if (cfx_topo_sysfs_pci_attr(busid, "max_link_width", text, sizeof(text)) == 0)
        node->link_width = atoi(text);
}

/* ------------------------------------------------------------ GPUs */

CFX_PARAM_STR(nvml_lib, "NVML_LIB", "libnvidia-ml.so.1",
              "NVML library to load at run time for the GPUs' NVLinks (a file name or a path)");

#if CFX_HAVE_CUDA
/* The part of NVML's interface used here, as nvml.h declares it (NVML's own
 * header is not needed): nvmlReturn_t and the enums are ints, a device is an
 * opaque handle, and nvmlPciInfo_t is the layout nvml.h has had since its
 * _v2 calls (busIdLegacy, then the 32-byte busId). Each call is resolved by
 * the ABI name nvml.h maps it to. */
#define NVML_SUCCESS          0
#define NVML_FEATURE_ENABLED  1
#define NVML_NVLINK_CAP_P2P   0 /* NVML_NVLINK_CAP_P2P_SUPPORTED */
#define NVML_NVLINK_MAX_LINKS 18
/* NCCL's name for a peer NVML does not show (empty or unprintable bus id). */
#define NVML_HIDDEN_TARGET "fffffff:ffff:ff"
typedef struct nvml_device *nvml_device_t;
struct nvml_pci_info {
    char bus_id_legacy[16];
    unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
};
struct nvml_api {
    /* nvmlInit_v2, nvmlShutdown, nvmlDeviceGetHandleByPciBusId_v2,
     * nvmlDeviceGetNvLinkState, nvmlDeviceGetNvLinkRemotePciInfo_v2. */
    int (*init)(void);
    int (*shutdown)(void);
    int (*by_busid)(const char *, nvml_device_t *);
    int (*link_state)(nvml_device_t, unsigned int, int *);
    int (*remote_pci)(nvml_device_t, unsigned int, struct nvml_pci_info *);
    /* Optional, NULL when this NVML lacks them: nvmlDeviceGetNvLinkCapability,
     * nvmlErrorString. */
    int (*link_cap)(nvml_device_t, unsigned int, int, unsigned int *);
    const char *(*error_string)(int);
};

static const char *nvml_lib_name(void)
{
    const char *name = param_nvml_lib();
    return name != NULL && name[0] != '\0' ? name : "libnvidia-ml.so.1";
}

static int nvml_open(struct nvml_api *api, char *note, size_t size)
{
    const char *name = nvml_lib_name();
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *err = dlerror();
        snprintf(note, size, "NVLinks unknown: NVML not loadable (CFX_NVML_LIB=%s: %s)", name,
                 err ? err : "dlopen failed");
        return -1;
    }
    *(void **)&api->init = dlsym(lib, "nvmlInit_v2");
    *(void **)&api->shutdown = dlsym(lib, "nvmlShutdown");
    *(void **)&api->by_busid = dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    *(void **)&api->link_state = dlsym(lib, "nvmlDeviceGetNvLinkState");
    *(void **)&api->remote_pci = dlsym(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    *(void **)&api->link_cap = dlsym(lib, "nvmlDeviceGetNvLinkCapability");
    *(void **)&api->error_string = dlsym(lib, "nvmlErrorString");
    const char *missing = !api->init         ? "nvmlInit_v2"
                          : !api->shutdown   ? "nvmlShutdown"
                          : !api->by_busid   ? "nvmlDeviceGetHandleByPciBusId_v2"
                          : !api->link_state ? "nvmlDeviceGetNvLinkState"
                          : !api->remote_pci ? "nvmlDeviceGetNvLinkRemotePciInfo_v2"
                                             : NULL;
    if (missing != NULL) {
        snprintf(note, size, "NVLinks unknown: %s has no %s (an old driver's NVML, or not NVML)",
                 name, missing);
        return -1;
    }
    int err = api->init();
    if (err != NVML_SUCCESS) {
        const char *text = api->error_string ? api->error_string(err) : NULL;
        snprintf(note, size, "NVLinks unknown: nvmlInit_v2 of %s failed (NVML error %d: %s)", name,
                 err, text ? text : "no description");
        return -1;
    }
    return 0; /* The library stays loaded, as NCCL keeps it. */
}

/* Links NVML may report for a GPU of compute capability @p sm (x10), as
 * NCCL bounds its queries: P100 4, V100 6, A100 12, H100 and later 18. */
static unsigned nvml_max_links(int sm)
{
    if (sm <= 0)
        return NVML_NVLINK_MAX_LINKS; /* Unknown: ask them all. */
    return sm < 60 ? 0 : sm < 70 ? 4 : sm < 80 ? 6 : sm < 90 ? 12 : NVML_NVLINK_MAX_LINKS;
}

/* The peer of link @p link of @p dev, normalized; -1 when the link is not
 * usable for P2P, down, or NVML does not say where it goes. */
static int nvml_link_peer(const struct nvml_api *api, nvml_device_t dev, unsigned link, char *busid,
                          size_t size)
{
    unsigned int p2p = 1;
    if (api->link_cap &&
        (api->link_cap(dev, link, NVML_NVLINK_CAP_P2P, &p2p) != NVML_SUCCESS || p2p == 0))
        return -1;
    int state = 0;
    if (api->link_state(dev, link, &state) != NVML_SUCCESS || state != NVML_FEATURE_ENABLED)
        return -1;
    struct nvml_pci_info pci;
    memset(&pci, 0, sizeof(pci));
    if (api->remote_pci(dev, link, &pci) != NVML_SUCCESS)
        return -1;
    pci.bus_id_legacy[sizeof(pci.bus_id_legacy) - 1] = '\0';
    pci.bus_id[sizeof(pci.bus_id) - 1] = '\0';
    const char *text = pci.bus_id_legacy[0] ? pci.bus_id_legacy : pci.bus_id;
    int printable = text[0] != '\0';
    for (const char *c = text; *c; c++)
        printable &= isprint((unsigned char)*c) != 0;
    /* A peer NVML does not show (a VM's NVSwitch): NCCL's sentinel. */
    cfx_topo_busid_normalize(printable ? text : NVML_HIDDEN_TARGET, busid, size);
    return 0;
}

/* The PCI class of an NVLink's far end: sysfs's; a GPU of this graph's;
 * else an NVSwitch, as NCCL assumes of a peer it cannot see. */
static uint32_t nvlink_target_class(const struct cfx_topo_system *sys, const char *busid)
{
    char text[32];
    uint64_t id;
    if (cfx_topo_sysfs_pci_attr(busid, "class", text, sizeof(text)) == 0)
        return (uint32_t)strtoul(text, NULL, 16);
    if (cfx_topo_busid_parse(busid, &id) == 0)
        for (int g = 0; g < sys->n_nodes; g++)
            if (sys->nodes[g].type == CFX_TOPO_GPU && sys->nodes[g].id == id)
                return sys->nodes[g].pci_class ? sys->nodes[g].pci_class : CFX_TOPO_CLASS_GPU;
    return CFX_TOPO_CLASS_NVSWITCH;
}

/* NVLinks of each GPU from NVML, grouped by remote device: one record per
 * peer GPU, NVSwitch or CPU, its count the links to it (NCCL's <nvlink>). */
cfxResult_t cfx_topo_detect_nvlinks(struct detection *det)
{
    struct nvml_api api;
    memset(&api, 0, sizeof(api));
    if (nvml_open(&api, det->nvml_note, sizeof(det->nvml_note)) != 0)
        return cfxSuccess;
    cfxResult_t res = cfxSuccess;
    int n_unknown = 0;
    for (int n = 0; n < det->sys->n_nodes && res == cfxSuccess; n++) {
        if (det->sys->nodes[n].type != CFX_TOPO_GPU)
            continue;
        nvml_device_t dev;
        if (api.by_busid(det->sys->nodes[n].busid, &dev) != NVML_SUCCESS) {
            n_unknown++;
            continue;
        }
        char targets[NVML_NVLINK_MAX_LINKS][CFX_TOPO_BUSID_MAX];
        int counts[NVML_NVLINK_MAX_LINKS], n_targets = 0;
        unsigned max_links = nvml_max_links(det->sys->nodes[n].gpu.sm);
        for (unsigned l = 0; l < max_links; l++) {
            char busid[CFX_TOPO_BUSID_MAX];
            if (nvml_link_peer(&api, dev, l, busid, sizeof(busid)) != 0)
                continue;
            int t = 0;
            while (t < n_targets && strcmp(targets[t], busid) != 0)
                t++;
            if (t == n_targets) {
                snprintf(targets[t], sizeof(targets[t]), "%s", busid);
                counts[n_targets++] = 0;
            }
            counts[t]++;
        }
        for (int t = 0; t < n_targets && res == cfxSuccess; t++)
            res = cfx_topo_gpu_add_nvlink(det->sys, n, targets[t], counts[t],
                                          nvlink_target_class(det->sys, targets[t]));
    }
    if (n_unknown > 0)
        snprintf(det->nvml_note, sizeof(det->nvml_note),
                 "NVML (%s) does not know %d of the CUDA GPUs' bus ids: their NVLinks unknown",
                 nvml_lib_name(), n_unknown);
    api.shutdown();
    return res;
}
#endif

void cfx_topo_detect_gpus(struct detection *det)
{
#if CFX_HAVE_CUDA
    const char *why = "this process does not use CUDA";
    const struct cfx_cuda_api *cu = cfx_cuda_in_process() ? cfx_cuda_api(&why) : NULL;
    int count = 0;
    if (cu == NULL || cu->device_get_count(&count) != CUDA_SUCCESS || count == 0) {
        snprintf(det->no_gpu_reason, sizeof(det->no_gpu_reason), "CUDA driver: %s",
                 cu == NULL ? why : "no device");
        return;
    }
    for (int d = 0; d < count && det->n_devs < CFX_TOPO_MAX_DEVICES; d++) {
        struct found_dev *dev = &det->devs[det->n_devs];
        memset(dev, 0, sizeof(*dev));
        char busid[64];
        int major = 0, minor = 0, sm_count = 0;
        CUdevice handle;
        if (cu->device_get(&handle, d) != CUDA_SUCCESS ||
            cu->device_get_pci_bus_id(busid, sizeof(busid), handle) != CUDA_SUCCESS)
            continue;
        /* An attribute the driver does not answer stays 0: unknown. */
        if (cu->device_get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                     handle) != CUDA_SUCCESS ||
            cu->device_get_attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                     handle) != CUDA_SUCCESS)
            major = minor = 0;
        if (cu->device_get_attribute(&sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, handle) !=
            CUDA_SUCCESS)
            sm_count = 0;
        dev->type = CFX_TOPO_GPU;
        cfx_topo_busid_normalize(busid, dev->busid, sizeof(dev->busid));
        cfx_topo_busid_parse(dev->busid, &dev->id);
        dev->cuda_dev = d;
        dev->sm = major * 10 + minor;
        dev->sm_count = sm_count;
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
        if (det->devs[i].type == CFX_TOPO_NIC && busid[0] && strcmp(det->devs[i].busid, busid) == 0)
            return &det->devs[i];
    if (det->n_devs == CFX_TOPO_MAX_DEVICES)
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
    case 4:
    case 8: lane = 10000; break;
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
    const struct cfx_verbs_api *ibv = cfx_verbs_api(NULL); /* Logs why, when it cannot. */
    if (ibv == NULL)
        return;
    int count = 0;
    struct ibv_device **list = ibv->get_device_list(&count);
    if (list == NULL)
        return;
    for (int i = 0; i < count; i++) {
        const char *name = ibv->get_device_name(list[i]);
        char path[PATH_MAX], real[PATH_MAX], busid[CFX_TOPO_BUSID_MAX] = "";
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device", name);
        if (realpath(path, real) == NULL || cfx_topo_sysfs_busid(real, busid, sizeof(busid)) != 0)
            busid[0] = '\0';
        struct ibv_context *ctx = ibv->open_device(list[i]);
        if (ctx == NULL)
            continue;
        struct ibv_device_attr attr;
        if (ibv->query_device(ctx, &attr) == 0) {
            for (int p = 1; p <= attr.phys_port_cnt; p++) {
                struct ibv_port_attr port;
                if (ibv->query_port(ctx, (uint8_t)p, &port) != 0 || port.state != IBV_PORT_ACTIVE)
                    continue;
                struct found_dev *nic = nic_for_busid(det, busid);
                if (nic == NULL || nic->n_nets == CFX_TOPO_MAX_PORTS)
                    continue;
                struct found_net *net = &nic->nets[nic->n_nets++];
                memset(net, 0, sizeof(*net));
                snprintf(net->name, sizeof(net->name), "%s", name);
                net->port = p;
                net->speed_mbps = ib_speed_mbps(port.active_speed, port.active_width);
                net->speed_known = 1;
                net->guid = be64toh(attr.node_guid);
                net->maxconn = attr.max_qp;
                net->gdr = cfx_verbs_peermem_loaded();
            }
        }
        ibv->close_device(ctx);
    }
    ibv->free_device_list(list);
}
#endif

/* Add interface @p name (sysfs device path @p real, or "" for a virtual one)
 * as a port of its NIC, unless an RDMA NIC already stands for it. */
static void add_netdev(struct detection *det, const char *name, const char *real)
{
    char path[PATH_MAX], text[64], busid[CFX_TOPO_BUSID_MAX];
    if (real[0] == '\0' || cfx_topo_sysfs_busid(real, busid, sizeof(busid)) != 0)
        busid[0] = '\0';
    for (int d = 0; d < det->n_devs; d++)
        if (det->devs[d].type == CFX_TOPO_NIC && busid[0] &&
            strcmp(det->devs[d].busid, busid) == 0 && det->devs[d].n_nets > 0)
            return;
    struct found_dev *nic = nic_for_busid(det, busid);
    if (nic == NULL || nic->n_nets == CFX_TOPO_MAX_PORTS)
        return;
    struct found_net *net = &nic->nets[nic->n_nets++];
    memset(net, 0, sizeof(*net));
    cfx_topo_text_copy(net->name, sizeof(net->name), name);
    net->port = 1;
    net->maxconn = 65536;
    snprintf(path, sizeof(path), "/sys/class/net/%.64s/speed", name);
    int speed = cfx_topo_sysfs_read(path, text, sizeof(text)) == 0 ? atoi(text) : -1;
    net->speed_known = speed > 0;
    net->speed_mbps = speed > 0 ? speed : DEFAULT_MBPS;
}

/* Network interfaces that are up, other than loopback and those of RDMA
 * NICs: the physical ones; or, when there is none, the virtual ones (a
 * container or network namespace sees only a veth, and its ranks still talk
 * over it: without a port the planner could not plan across hosts). */
static void detect_netdevs(struct detection *det)
{
    DIR *dir = opendir("/sys/class/net");
    if (dir == NULL)
        return;
    char names[64][CFX_TOPO_NAME_MAX];
    int n = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL && n < 64;)
        if (e->d_name[0] != '.' && strcmp(e->d_name, "lo") != 0)
            cfx_topo_text_copy(names[n++], CFX_TOPO_NAME_MAX, e->d_name);
    closedir(dir);
    for (int i = 1; i < n; i++) /* Sorted, for a stable order. */
        for (int j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char t[CFX_TOPO_NAME_MAX];
            memcpy(t, names[j], sizeof(t));
            memcpy(names[j], names[j - 1], sizeof(t));
            memcpy(names[j - 1], t, sizeof(t));
        }
    int is_virtual[64] = {0}, n_physical = 0;
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX], real[PATH_MAX], text[64];
        /* The carrier, not operstate: the kernel updates operstate up to a
         * second after a link comes up (linkwatch), and a job started right
         * after its interfaces would see some hosts' ports and not others'.
         * Reading carrier fails while the interface is administratively down. */
        snprintf(path, sizeof(path), "/sys/class/net/%.64s/carrier", names[i]);
        if (cfx_topo_sysfs_read(path, text, sizeof(text)) != 0 || strcmp(text, "1") != 0) {
            is_virtual[i] = -1; /* Down: neither. */
            continue;
        }
        snprintf(path, sizeof(path), "/sys/class/net/%.64s/device", names[i]);
        if (realpath(path, real) == NULL || strstr(real, "/virtual/")) {
            is_virtual[i] = 1; /* Bridges, veth, ifb, docker. */
            continue;
        }
        add_netdev(det, names[i], real);
        n_physical++;
    }
    for (int i = 0; n_physical == 0 && i < n; i++)
        if (is_virtual[i] == 1)
            add_netdev(det, names[i], "");
}

void cfx_topo_detect_nics(struct detection *det)
{
#if CFX_HAVE_VERBS
    detect_verbs(det);
#endif
    detect_netdevs(det);
}
