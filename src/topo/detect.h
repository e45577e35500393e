/*
 * Detection's shared state (internal to src/topo): what detect_dev.c finds
 * (GPUs, NICs; sysfs helpers) and detect.c places in the graph (CPUs, the
 * PCI tree). One detection runs on one thread and is freed at its end.
 */
#ifndef CFX_TOPO_DETECT_H
#define CFX_TOPO_DETECT_H

#include <stddef.h>
#include <stdint.h>

#include "cfx_build_config.h"
#include "src/topo/build.h"

#if CFX_HAVE_HWLOC
#include <hwloc.h>
#endif

#define CFX_TOPO_MAX_DEVICES 256
#define CFX_TOPO_MAX_PORTS   8

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
    enum cfx_topo_node_type type;   /* GPU or NIC. */
    char busid[CFX_TOPO_BUSID_MAX]; /* "" for a NIC with no PCI function. */
    uint64_t id;
    int cuda_dev, sm, sm_count; /* GPUs: CUDA device, compute capability x10, SMs. */
    int n_nets;
    struct found_net nets[CFX_TOPO_MAX_PORTS];
};

struct detection {
    struct cfx_topo_system *sys;
    int n_devs;
    struct found_dev devs[CFX_TOPO_MAX_DEVICES];
    char no_gpu_reason[160];
    char nvml_note[160];
#if CFX_HAVE_HWLOC
    hwloc_topology_t hwloc;
    int hwloc_loaded;
#endif
};

/* Copy @p src into @p dst of @p size bytes, cut if needed. */
void cfx_topo_text_copy(char *dst, size_t size, const char *src);
/* First line of a (sysfs) file, without its newline; -1 when unreadable. */
int cfx_topo_sysfs_read(const char *path, char *out, size_t size);
/* /sys/bus/pci/devices/<busid>/<attr>. */
int cfx_topo_sysfs_pci_attr(const char *busid, const char *attr, char *out, size_t size);
/* Whether @p text is a whole PCI bus id ("0000:18:00.0"). */
int cfx_topo_sysfs_is_busid(const char *text);
/* The last PCI function of a resolved sysfs path; -1 when there is none. */
int cfx_topo_sysfs_busid(const char *real, char *busid, size_t size);
/* Class, ids, and maximum link speed and width of a PCI node from sysfs. */
void cfx_topo_sysfs_pci_fill(struct cfx_topo_node *node, const char *busid);

/* GPUs from the CUDA driver (bus id, compute capability, SM count) into
 * det->devs, or det->no_gpu_reason. */
void cfx_topo_detect_gpus(struct detection *det);
/* NVLink records of the GPUs of det->sys, from NVML loaded at run time
 * (CFX_NVML_LIB); when it cannot, det->nvml_note says why. */
cfxResult_t cfx_topo_detect_nvlinks(struct detection *det);
/* NICs: libibverbs devices (verbs builds) and physical network interfaces. */
void cfx_topo_detect_nics(struct detection *det);

#endif /* CFX_TOPO_DETECT_H */
