/*
 * Building a system, shared by the XML loader and detection (internal to
 * src/topo). Add nodes parent first, then call cfx_topo_finish, which makes
 * the links from the containment tree and the NVLink records, checks the
 * result and computes every path. Until then, node indices are stable but
 * node pointers are not (the array grows).
 */
#ifndef CFX_TOPO_BUILD_H
#define CFX_TOPO_BUILD_H

#include "src/topo/topo.h"

/* An empty system; NULL when out of memory (with a sentence set). */
struct cfx_topo_system *cfx_topo_new(const char *source);

/* Append a node of @p type under @p parent (-1: none); its fields are zero
 * except type, parent and "unknown" markers. Returns the index, or -1 when
 * out of memory (sentence set). */
int cfx_topo_add_node(struct cfx_topo_system *sys, enum cfx_topo_node_type type, int parent);

/* Record @p count NVLinks from GPU node @p gpu to the device at @p target. */
cfxResult_t cfx_topo_gpu_add_nvlink(struct cfx_topo_system *sys, int gpu, const char *target,
                                    int count, uint32_t target_class);

/* Make links and paths. Fails with a sentence naming @p where (a file name
 * or "detection") when the description is inconsistent (duplicate bus ids
 * or GPU numbers, no CPU). */
cfxResult_t cfx_topo_finish(struct cfx_topo_system *sys, const char *where);

/* NCCL-style bus id to number: hex digits, ':' and '.' skipped
 * ("0000:18:00.0" -> 0x18000). Returns 0 on success, -1 when the text is
 * empty or holds anything else. */
int cfx_topo_busid_parse(const char *text, uint64_t *id_p);

/* Write a canonical lower-case bus id "dddd:bb:dd.f" for @p text. */
void cfx_topo_busid_normalize(const char *text, char *out, size_t size);

/* PCIe bandwidth in GB/s for a link speed text ("16 GT/s", "32.0 GT/s
 * PCIe", "8.0 GT/s PCIe") and width; 0 when the speed is unknown. */
double cfx_topo_pci_bw(const char *speed, int width);

/* Nominal bandwidth of one NVLink (GB/s, one direction) for a compute
 * capability x10 (0: unknown, taken as 25). */
double cfx_topo_nvlink_bw(int sm);

/* PCI classes of devices detection finds without sysfs telling their class:
 * a CUDA device sysfs does not show (a container without /sys/bus/pci, a
 * test's fake driver) is a 3D controller, the class of NVIDIA's data-centre
 * GPUs (NCCL's reader needs a class on every <pci>, and takes any 0x03xxxx
 * for a GPU); an NVLink peer that is neither visible nor one of the GPUs is
 * an NVSwitch, as NCCL assumes. */
#define CFX_TOPO_CLASS_GPU      0x030200u
#define CFX_TOPO_CLASS_NVSWITCH 0x068000u

/* Defaults for missing PCI attributes: Gen3 x16. */
#define CFX_TOPO_PCI_DEFAULT_SPEED "8.0 GT/s PCIe"
#define CFX_TOPO_PCI_DEFAULT_WIDTH 16
/* Bandwidth used inside a device and for a socket NIC's attachment. */
#define CFX_TOPO_LOC_BW 5000.0

#endif /* CFX_TOPO_BUILD_H */
