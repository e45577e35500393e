/*
 * Topology of one host: a graph of CPUs (one per NUMA domain), PCI switches,
 * GPUs, one NVSwitch fabric node, NICs and their network ports, joined by
 * typed links with bandwidths, and the best path between every two nodes,
 * classified in NCCL's vocabulary (NVL, NVB, PIX, PXB, PHB, SYS).
 *
 * A system comes from detection (cfx_topo_detect: hwloc, sysfs, libibverbs,
 * the CUDA driver and NVML, both loaded at run time) or from an NCCL
 * topology XML file (cfx_topo_load_xml; CFX_TOPO_FILE makes detection read
 * the file instead).
 * cfx_topo_dump_xml writes the same format (CFX_TOPO_DUMP_FILE).
 *
 * Rules:
 *  - A system is immutable once returned: every reader may share it, from
 *    any thread. Only cfx_topo_free releases it.
 *  - Nodes are numbered 0..n_nodes-1 in a deterministic order (the order of
 *    the file, or of detection sorted by bus id), so every rank that loads
 *    the same description sees the same numbers.
 *  - The network between hosts is not part of a system: the planner joins
 *    hosts through their NET nodes.
 */
#ifndef CFX_TOPO_TOPO_H
#define CFX_TOPO_TOPO_H

#include <stdint.h>
#include <stdio.h>

#include "conflux.h"

enum cfx_topo_node_type {
    CFX_TOPO_GPU = 0,
    CFX_TOPO_PCI = 1, /* A PCI switch (or bridge level kept from the file). */
    CFX_TOPO_NVS = 2, /* All NVSwitches of the host, merged into one node. */
    CFX_TOPO_CPU = 3, /* One NUMA domain: cores, memory, its PCI root ports. */
    CFX_TOPO_NIC = 4, /* A network adapter (PCI function). */
    CFX_TOPO_NET = 5, /* One port of a NIC: what a connection goes through. */
    CFX_TOPO_NODE_TYPES
};

/* Link types, from fastest to slowest. Append only. */
enum cfx_topo_link_type {
    CFX_LINK_LOC = 0, /* Inside one device. */
    CFX_LINK_NVL = 1, /* NVLink, to a GPU or to the NVSwitch fabric. */
    CFX_LINK_PCI = 2, /* PCIe, device to switch or switch to CPU root port. */
    CFX_LINK_SYS = 3, /* Between CPU sockets / NUMA domains (UPI, xGMI, ...). */
    CFX_LINK_NET = 4, /* A NIC to its port: the wire (a path class of LOC inside a host). */
    CFX_LINK_TYPES
};

/* Path classes between two nodes, nearest first (NCCL's names). */
enum cfx_topo_path_type {
    CFX_PATH_LOC = 0, /* Same node. */
    CFX_PATH_NVL = 1, /* NVLink only (directly or through NVSwitches). */
    CFX_PATH_NVB = 2, /* NVLink through an intermediate GPU. */
    CFX_PATH_PIX = 3, /* At most one PCI switch. */
    CFX_PATH_PXB = 4, /* Several PCI switches, not through a CPU. */
    CFX_PATH_PHB = 5, /* Through a CPU's PCI host bridge. */
    CFX_PATH_SYS = 6, /* Across the inter-socket link. */
    CFX_PATH_NET = 7, /* Across the network (between hosts). */
    CFX_PATH_DIS = 8, /* Not connected. */
    CFX_PATH_TYPES
};

/* Bandwidths are GB/s (10^9 bytes/s) per direction, nominal (spec sheet). */
struct cfx_topo_link {
    enum cfx_topo_link_type type;
    int remote; /* Node index. */
    double bw;
};

/* An <nvlink> record of a GPU, kept as read so a dump writes it back. */
struct cfx_topo_nvlink {
    char target[32]; /* Bus id of the peer GPU, NVSwitch or CPU. */
    int count;       /* Links to that target. */
    uint32_t target_class;
};

#define CFX_TOPO_BUSID_MAX 32
#define CFX_TOPO_NAME_MAX  64

struct cfx_topo_node {
    enum cfx_topo_node_type type;
    int type_index; /* Index among the nodes of its type. */
    int parent;     /* Containing node (PCI tree, NIC of a NET); -1 for CPUs and NVS. */
    uint64_t id;    /* Bus id as a number (PCI devices), NUMA id (CPU), port (NET). */
    int n_links;
    struct cfx_topo_link *links;
    /* PCI attributes of GPU, PCI and NIC nodes (as read; "" when unknown). */
    char busid[CFX_TOPO_BUSID_MAX];
    uint32_t pci_class;
    char vendor[8], device[8], subsys_vendor[8], subsys_device[8];
    char link_speed[24]; /* "32.0 GT/s PCIe" */
    int link_width;      /* 0: unknown */
    double up_bw;        /* Bandwidth of the link to the parent. */
    union {
        struct {
            int dev;      /* CUDA device index. */
            int sm;       /* Compute capability x10 (90: Hopper); 0: unknown. */
            int sm_count; /* Multiprocessors, from CUDA; 0: unknown (NCCL's XML has
                           * no attribute for it, so a file never gives it). */
            int rank;     /* Rank recorded by the file (-1: none). */
            int gdr;
            int n_nvlinks;
            struct cfx_topo_nvlink *nvlinks;
        } gpu;
        struct {
            int numa_id;
            char affinity[160]; /* NCCL's cpumask text: "0000ffff,ffffffff". */
            char arch[16];      /* "x86_64", "arm64", "ppc64" */
            char vendor[16];    /* "GenuineIntel", "AuthenticAMD" */
            int family, model;  /* -1: unknown */
            char host_hash[24];
        } cpu;
        struct {
            char name[CFX_TOPO_NAME_MAX]; /* "mlx5_0", "eth0" */
            int dev;                      /* Index among the host's NETs. */
            int port;
            int speed_mbps; /* Megabits/s, as NCCL writes it. */
            double latency_us;
            uint64_t guid;
            int maxconn;
            int gdr;
            int coll;
        } net;
    };
};

struct cfx_topo_system {
    int n_nodes;
    struct cfx_topo_node *nodes;
    int count[CFX_TOPO_NODE_TYPES];
    /* Best path from every node to every other (n_nodes^2 entries). */
    struct cfx_topo_path *paths;
    char source[128]; /* "detected", or the file it came from. */
    /* Internal: allocation sizes while building. */
    int cap_nodes;
};

struct cfx_topo_path {
    enum cfx_topo_path_type type;
    double bw;     /* Bottleneck bandwidth, GB/s. */
    int hops;      /* Links crossed (0 for a node to itself). */
    int prev;      /* Node before the destination on the path (-1: none). */
    int prev_link; /* Index of the link prev -> destination in prev's links. */
};

/**
 * @brief Describe this host. CFX_TOPO_FILE, when set, is read instead of
 * detecting (NCCL's NCCL_TOPO_FILE); CFX_TOPO_DUMP_FILE, when set, receives
 * the result. Logs a summary under CFX_DEBUG_SUBSYS=GRAPH, including why
 * there are no GPUs when there are none.
 * @param [out] sys_p  The system; free with cfx_topo_free.
 * @return cfxSuccess; cfxSystemError (with a sentence) if nothing could be
 * read; the loader's result for a bad CFX_TOPO_FILE. Never partial.
 */
cfxResult_t cfx_topo_detect(struct cfx_topo_system **sys_p);

/**
 * @brief Read an NCCL topology XML file (<system version="1">). Unknown
 * elements and attributes are ignored. A file that is not well-formed, or an
 * element with a missing or malformed required attribute, fails with a
 * sentence naming the file and the line ("topo.xml:12: <gpu> has no dev").
 * @param [in]  path   File to read.
 * @param [out] sys_p  The system; set only on success.
 */
cfxResult_t cfx_topo_load_xml(const char *path, struct cfx_topo_system **sys_p);

/** @brief Same as cfx_topo_load_xml from a buffer (@p name appears in errors). */
cfxResult_t cfx_topo_load_xml_buffer(const char *text, size_t size, const char *name,
                                     struct cfx_topo_system **sys_p);

/**
 * @brief Write @p sys as NCCL topology XML. The output loads back into an
 * identical system (same nodes, links and paths).
 */
cfxResult_t cfx_topo_dump_xml(const struct cfx_topo_system *sys, const char *path);
/** @brief Same, to an open stream. */
cfxResult_t cfx_topo_dump_xml_file(const struct cfx_topo_system *sys, FILE *out);

/** @brief Release a system; accepts NULL and half-built systems. */
void cfx_topo_free(struct cfx_topo_system *sys);

/* ------------------------------------------------------------ queries */

/** The path from node @p from to node @p to (both valid indices). */
static inline const struct cfx_topo_path *cfx_topo_path(const struct cfx_topo_system *sys, int from,
                                                        int to)
{
    return &sys->paths[(size_t)from * (size_t)sys->n_nodes + (size_t)to];
}

/** Index of the @p i-th node of @p type (in node order), or -1. */
int cfx_topo_nth(const struct cfx_topo_system *sys, enum cfx_topo_node_type type, int i);

/** Index of the GPU with CUDA device number @p dev, or -1. */
int cfx_topo_find_gpu(const struct cfx_topo_system *sys, int dev);

/** The CPU node (NUMA domain) a node hangs from, or -1 (NVS). */
int cfx_topo_local_cpu(const struct cfx_topo_system *sys, int node);

/** Names for logs and tools: "GPU", "NVL", "PIX", ... */
const char *cfx_topo_node_type_name(enum cfx_topo_node_type type);
const char *cfx_topo_link_type_name(enum cfx_topo_link_type type);
const char *cfx_topo_path_type_name(enum cfx_topo_path_type type);

/** The link class a path type travels on: NVL/NVB -> NVL, PIX..PHB -> PCI, ... */
enum cfx_topo_link_type cfx_topo_path_link_class(enum cfx_topo_path_type type);

/** Print the graph for people: one line per node with its links. */
void cfx_topo_print(const struct cfx_topo_system *sys, FILE *out);

/** One line: "2 CPUs, 8 GPUs (sm90), NVSwitch, 8 NICs (400 Gb/s)". */
void cfx_topo_summary(const struct cfx_topo_system *sys, char *text, size_t size);

#endif /* CFX_TOPO_TOPO_H */
