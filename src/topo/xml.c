/*
 * NCCL topology XML in and out (libxml2 reads; a small writer writes).
 *
 *   <system version="1">
 *     <cpu numaid affinity arch vendor familyid modelid>
 *       <pci busid class vendor device link_speed link_width>   a switch: holds <pci>
 *         <pci busid ...><gpu dev sm rank gdr>                    a GPU
 *             <nvlink target count tclass/></gpu></pci>
 *         <pci busid ...><nic><net name dev speed port .../></nic></pci>
 *       </pci>
 *       <nic><net .../></nic>                                     a NIC with no PCI function
 *     </cpu>
 *   </system>
 *
 * Partial files, as cloud vendors ship them for NCCL to complete, describe
 * devices by PCI class only: a leaf <pci> of class 0x03xxxx becomes a GPU
 * and one of class 0x02xxxx a NIC whose line rate is taken from its PCI link.
 *
 * What a <pci> is: a GPU when it holds <gpu>, a NIC when it holds <nic>, a
 * switch when its class is a PCI bridge (0x0604xx) or when it holds a <pci>
 * that loads; else a GPU or NIC by class, as above; else it is skipped. A
 * child that is skipped does not make its parent a switch, so everything
 * this file writes reads back as the same node: a dump loads into a system
 * whose own dump is the same text (fuzz/fuzz_topo_xml.c checks it).
 */
#include <errno.h>
#include <inttypes.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <libxml/xmlversion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "src/topo/build.h"
#include "src/util/check.h"
#include "src/util/error.h"
#include "src/util/log.h"

#define XML_MAX_BYTES (64u << 20)

struct xml_loader {
    struct cfx_topo_system *sys;
    const char *name; /* For messages. */
};

static pthread_once_t xml_once = PTHREAD_ONCE_INIT;

/* The first error libxml2 reports: later ones are usually consequences. */
struct first_error {
    int seen;
    int line;
    char message[256];
};

#if LIBXML_VERSION >= 21200
static void keep_first_error(void *user, const xmlError *err)
#else
static void keep_first_error(void *user, xmlError *err)
#endif
{
    xmlParserCtxt *ctxt = user;
    struct first_error *first = ctxt ? ctxt->_private : NULL;
    if (first == NULL || first->seen || err == NULL || err->level < XML_ERR_ERROR)
        return;
    first->seen = 1;
    first->line = err->line;
    snprintf(first->message, sizeof(first->message), "%s",
             err->message ? err->message : "not well-formed XML");
    first->message[strcspn(first->message, "\n")] = '\0';
}

static void xml_init(void)
{
    xmlInitParser();
}

static int is_element(const xmlNode *node, const char *name)
{
    return node->type == XML_ELEMENT_NODE && strcmp((const char *)node->name, name) == 0;
}

static int has_child(const xmlNode *el, const char *name)
{
    for (const xmlNode *c = el->children; c; c = c->next)
        if (is_element(c, name))
            return 1;
    return 0;
}

/* The attribute's value copied into @p out ("" when absent); returns 1 when present. */
static int attr_text(const xmlNode *el, const char *name, char *out, size_t size)
{
    xmlChar *value = xmlGetProp(el, (const xmlChar *)name);
    if (value == NULL) {
        if (size)
            out[0] = '\0';
        return 0;
    }
    snprintf(out, size, "%s", (const char *)value);
    xmlFree(value);
    return 1;
}

static cfxResult_t bad_attr(const struct xml_loader *ld, const xmlNode *el, const char *attr,
                            const char *value, const char *why)
{
    return cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH, "%s:%ld: <%s %s=\"%s\">: %s", ld->name,
                         xmlGetLineNo(el), (const char *)el->name, attr, value, why);
}

/* Integer attribute (decimal or 0x hex); @p def when absent. */
static cfxResult_t attr_int(const struct xml_loader *ld, const xmlNode *el, const char *name,
                            long long def, long long *out)
{
    char text[64];
    *out = def;
    if (!attr_text(el, name, text, sizeof(text)) || text[0] == '\0')
        return cfxSuccess;
    char *end = NULL;
    errno = 0;
    long long value = strtoll(text, &end, 0);
    while (end && (*end == ' ' || *end == '\t'))
        end++;
    if (errno || end == text || (end && *end))
        return bad_attr(ld, el, name, text, "not an integer");
    *out = value;
    return cfxSuccess;
}

/* Hex attribute with or without 0x ("0x060400", "030200"). */
static cfxResult_t attr_hex(const struct xml_loader *ld, const xmlNode *el, const char *name,
                            unsigned long long *out)
{
    char text[64];
    *out = 0;
    if (!attr_text(el, name, text, sizeof(text)) || text[0] == '\0')
        return cfxSuccess;
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 16);
    if (errno || end == text || (end && *end))
        return bad_attr(ld, el, name, text, "not a hexadecimal number");
    *out = value;
    return cfxSuccess;
}

static cfxResult_t attr_double(const struct xml_loader *ld, const xmlNode *el, const char *name,
                               double def, double *out)
{
    char text[64];
    *out = def;
    if (!attr_text(el, name, text, sizeof(text)) || text[0] == '\0')
        return cfxSuccess;
    char *end = NULL;
    double value = strtod(text, &end);
    if (end == text || (end && *end))
        return bad_attr(ld, el, name, text, "not a number");
    *out = value;
    return cfxSuccess;
}

static void ignore_unknown(const struct xml_loader *ld, const xmlNode *el)
{
    CFX_TRACE(CFX_LOG_GRAPH, "%s:%ld: <%s> ignored", ld->name, xmlGetLineNo(el),
              (const char *)el->name);
}

/* ------------------------------------------------------------ loading */

static cfxResult_t load_net(struct xml_loader *ld, const xmlNode *el, int nic)
{
    int n = cfx_topo_add_node(ld->sys, CFX_TOPO_NET, nic);
    if (n < 0)
        return cfxSystemError;
    long long dev, speed, port, maxconn, gdr, coll;
    unsigned long long guid = 0;
    double latency;
    char name[CFX_TOPO_NAME_MAX], guid_text[40];
    attr_text(el, "name", name, sizeof(name));
    CFX_CHECK(attr_int(ld, el, "dev", -1, &dev));
    CFX_CHECK(attr_int(ld, el, "speed", 0, &speed));
    CFX_CHECK(attr_int(ld, el, "port", 1, &port));
    CFX_CHECK(attr_int(ld, el, "maxconn", 0, &maxconn));
    CFX_CHECK(attr_int(ld, el, "gdr", 0, &gdr));
    CFX_CHECK(attr_int(ld, el, "coll", 0, &coll));
    CFX_CHECK(attr_double(ld, el, "latency", 0, &latency));
    if (attr_text(el, "guid", guid_text, sizeof(guid_text)) && guid_text[0]) {
        char *end = NULL;
        guid = strtoull(guid_text, &end, 0);
        if (end == guid_text || *end)
            return bad_attr(ld, el, "guid", guid_text, "not a number");
    }
    if (speed < 0 || speed > INT32_MAX)
        return bad_attr(ld, el, "speed", "out of range", "megabits per second expected");
    struct cfx_topo_node *node = &ld->sys->nodes[n];
    snprintf(node->net.name, sizeof(node->net.name), "%s", name);
    node->net.dev = (int)dev;
    node->net.speed_mbps = (int)speed;
    node->net.port = (int)port;
    node->net.maxconn = (int)maxconn;
    node->net.gdr = (int)gdr;
    node->net.coll = (int)coll;
    node->net.latency_us = latency;
    node->net.guid = guid;
    node->id = (uint64_t)port;
    return cfxSuccess;
}

static cfxResult_t load_nic(struct xml_loader *ld, const xmlNode *el, int nic)
{
    int n_nets = 0;
    for (const xmlNode *c = el->children; c; c = c->next) {
        if (is_element(c, "net")) {
            CFX_CHECK(load_net(ld, c, nic));
            n_nets++;
        } else if (c->type == XML_ELEMENT_NODE) {
            ignore_unknown(ld, c);
        }
    }
    if (n_nets == 0)
        CFX_INFO(CFX_LOG_GRAPH, "%s:%ld: <nic> without <net>: a NIC with no usable port", ld->name,
                 xmlGetLineNo(el));
    return cfxSuccess;
}

static cfxResult_t load_gpu(struct xml_loader *ld, const xmlNode *el, int gpu)
{
    long long dev, sm, rank, gdr;
    CFX_CHECK(attr_int(ld, el, "dev", -1, &dev));
    CFX_CHECK(attr_int(ld, el, "sm", 0, &sm));
    CFX_CHECK(attr_int(ld, el, "rank", -1, &rank));
    CFX_CHECK(attr_int(ld, el, "gdr", 1, &gdr));
    if (dev < -1 || dev > 65535)
        return bad_attr(ld, el, "dev", "out of range", "a CUDA device number expected");
    struct cfx_topo_node *node = &ld->sys->nodes[gpu];
    node->gpu.dev = (int)dev;
    node->gpu.sm = (int)sm;
    node->gpu.rank = (int)rank;
    node->gpu.gdr = (int)gdr;
    for (const xmlNode *c = el->children; c; c = c->next) {
        if (!is_element(c, "nvlink")) {
            if (c->type == XML_ELEMENT_NODE)
                ignore_unknown(ld, c);
            continue;
        }
        char target[64];
        long long count;
        unsigned long long tclass;
        if (!attr_text(c, "target", target, sizeof(target)) || target[0] == '\0')
            return cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH,
                                 "%s:%ld: <nvlink> has no target", ld->name, xmlGetLineNo(c));
        uint64_t id;
        /* As <pci busid>: longer than a bus id is none (the stored, cut
         * form would not read back). */
        if (cfx_topo_busid_parse(target, &id) != 0 || strlen(target) >= CFX_TOPO_BUSID_MAX)
            return bad_attr(ld, c, "target", target, "not a PCI bus id");
        CFX_CHECK(attr_int(ld, c, "count", 1, &count));
        CFX_CHECK(attr_hex(ld, c, "tclass", &tclass));
        if (count < 0 || count > 64)
            return bad_attr(ld, c, "count", "out of range", "0..64 links expected");
        char norm[CFX_TOPO_BUSID_MAX];
        cfx_topo_busid_normalize(target, norm, sizeof(norm));
        CFX_CHECK(cfx_topo_gpu_add_nvlink(ld->sys, gpu, norm, (int)count, (uint32_t)tclass));
    }
    return cfxSuccess;
}

static cfxResult_t load_pci(struct xml_loader *ld, const xmlNode *el, int parent);

static cfxResult_t load_children(struct xml_loader *ld, const xmlNode *el, int parent)
{
    for (const xmlNode *c = el->children; c; c = c->next) {
        if (is_element(c, "pci")) {
            CFX_CHECK(load_pci(ld, c, parent));
        } else if (is_element(c, "nic")) {
            /* A NIC with no PCI function (NCCL lists socket NICs this way). */
            int nic = cfx_topo_add_node(ld->sys, CFX_TOPO_NIC, parent);
            if (nic < 0)
                return cfxSystemError;
            CFX_CHECK(load_nic(ld, c, nic));
        } else if (is_element(c, "gpu")) {
            int gpu = cfx_topo_add_node(ld->sys, CFX_TOPO_GPU, parent);
            if (gpu < 0)
                return cfxSystemError;
            CFX_CHECK(load_gpu(ld, c, gpu));
        } else if (c->type == XML_ELEMENT_NODE) {
            ignore_unknown(ld, c);
        }
    }
    return cfxSuccess;
}

static cfxResult_t read_pci_attrs(struct xml_loader *ld, const xmlNode *el, int n)
{
    char busid[64];
    unsigned long long pci_class;
    long long width;
    if (!attr_text(el, "busid", busid, sizeof(busid)) || busid[0] == '\0')
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH, "%s:%ld: <pci> has no busid",
                             ld->name, xmlGetLineNo(el));
    uint64_t id;
    if (cfx_topo_busid_parse(busid, &id) != 0 || strlen(busid) >= CFX_TOPO_BUSID_MAX)
        return bad_attr(ld, el, "busid", busid, "not a PCI bus id (dddd:bb:dd.f)");
    CFX_CHECK(attr_hex(ld, el, "class", &pci_class));
    CFX_CHECK(attr_int(ld, el, "link_width", 0, &width));
    if (width < 0 || width > 64)
        return bad_attr(ld, el, "link_width", "out of range", "0..64 lanes expected");
    struct cfx_topo_node *node = &ld->sys->nodes[n];
    cfx_topo_busid_normalize(busid, node->busid, sizeof(node->busid));
    node->id = id;
    node->pci_class = (uint32_t)pci_class;
    node->link_width = (int)width;
    attr_text(el, "link_speed", node->link_speed, sizeof(node->link_speed));
    attr_text(el, "vendor", node->vendor, sizeof(node->vendor));
    attr_text(el, "device", node->device, sizeof(node->device));
    attr_text(el, "subsystem_vendor", node->subsys_vendor, sizeof(node->subsys_vendor));
    attr_text(el, "subsystem_device", node->subsys_device, sizeof(node->subsys_device));
    return cfxSuccess;
}

/* The node type a <pci> element loads as; CFX_TOPO_NODE_TYPES when it is
 * skipped. A class that is not hexadecimal is left for read_pci_attrs to
 * report (the element counts as having no class here). */
static enum cfx_topo_node_type pci_type(const xmlNode *el)
{
    if (has_child(el, "gpu"))
        return CFX_TOPO_GPU;
    if (has_child(el, "nic"))
        return CFX_TOPO_NIC;
    unsigned long long pci_class = 0;
    char text[64];
    if (attr_text(el, "class", text, sizeof(text)) && text[0] != '\0') {
        char *end = NULL;
        errno = 0;
        pci_class = strtoull(text, &end, 16);
        if (errno || end == text || *end)
            pci_class = 0;
    }
    if ((pci_class >> 8) == 0x0604)
        return CFX_TOPO_PCI;
    for (const xmlNode *c = el->children; c; c = c->next)
        if (is_element(c, "pci") && pci_type(c) != CFX_TOPO_NODE_TYPES)
            return CFX_TOPO_PCI;
    if ((pci_class >> 16) == 0x03)
        return CFX_TOPO_GPU; /* Partial file: a display/3D controller. */
    if ((pci_class >> 16) == 0x02)
        return CFX_TOPO_NIC; /* Partial file: a network controller. */
    return CFX_TOPO_NODE_TYPES;
}

static cfxResult_t load_pci(struct xml_loader *ld, const xmlNode *el, int parent)
{
    unsigned long long pci_class = 0;
    CFX_CHECK(attr_hex(ld, el, "class", &pci_class));
    enum cfx_topo_node_type type = pci_type(el);
    if (type == CFX_TOPO_NODE_TYPES) {
        ignore_unknown(ld, el);
        return cfxSuccess;
    }
    int n = cfx_topo_add_node(ld->sys, type, parent);
    if (n < 0)
        return cfxSystemError;
    CFX_CHECK(read_pci_attrs(ld, el, n));
    const xmlNode *sub = NULL;
    for (const xmlNode *c = el->children; c && sub == NULL; c = c->next)
        if (is_element(c, type == CFX_TOPO_GPU ? "gpu" : "nic"))
            sub = c;
    if (type == CFX_TOPO_PCI)
        return load_children(ld, el, n);
    if (type == CFX_TOPO_GPU && sub)
        return load_gpu(ld, sub, n);
    if (type == CFX_TOPO_NIC && sub)
        return load_nic(ld, sub, n);
    /* Described by its class only: one port at the speed of its PCI link. */
    CFX_INFO(CFX_LOG_GRAPH, "%s:%ld: %s %s described by PCI class only", ld->name, xmlGetLineNo(el),
             type == CFX_TOPO_GPU ? "GPU" : "NIC", ld->sys->nodes[n].busid);
    if (type == CFX_TOPO_NIC) {
        int net = cfx_topo_add_node(ld->sys, CFX_TOPO_NET, n);
        if (net < 0)
            return cfxSystemError;
        struct cfx_topo_node *nic = &ld->sys->nodes[n];
        double bw = cfx_topo_pci_bw(nic->link_speed, nic->link_width);
        struct cfx_topo_node *port = &ld->sys->nodes[net];
        snprintf(port->net.name, sizeof(port->net.name), "%s", nic->busid);
        port->net.speed_mbps = (int)((bw > 0 ? bw : 12.5) * 8000);
        port->id = 1;
    }
    return cfxSuccess;
}

static cfxResult_t load_cpu(struct xml_loader *ld, const xmlNode *el)
{
    int n = cfx_topo_add_node(ld->sys, CFX_TOPO_CPU, -1);
    if (n < 0)
        return cfxSystemError;
    long long numa, family, model;
    CFX_CHECK(attr_int(ld, el, "numaid", -1, &numa));
    CFX_CHECK(attr_int(ld, el, "familyid", -1, &family));
    CFX_CHECK(attr_int(ld, el, "modelid", -1, &model));
    struct cfx_topo_node *node = &ld->sys->nodes[n];
    node->cpu.numa_id = (int)numa;
    node->cpu.family = (int)family;
    node->cpu.model = (int)model;
    node->id = (uint64_t)(numa < 0 ? 0 : numa);
    attr_text(el, "affinity", node->cpu.affinity, sizeof(node->cpu.affinity));
    attr_text(el, "arch", node->cpu.arch, sizeof(node->cpu.arch));
    attr_text(el, "vendor", node->cpu.vendor, sizeof(node->cpu.vendor));
    attr_text(el, "host_hash", node->cpu.host_hash, sizeof(node->cpu.host_hash));
    return load_children(ld, el, n);
}

/* Devices the file did not number get the next free numbers, in file order;
 * CPUs with no (or a negative) NUMA id get the next free id. */
static void number_unnumbered(struct cfx_topo_system *sys)
{
    int next_gpu = 0, next_net = 0, next_numa = 0;
    for (int n = 0; n < sys->n_nodes; n++) {
        const struct cfx_topo_node *node = &sys->nodes[n];
        if (node->type == CFX_TOPO_GPU && node->gpu.dev >= next_gpu)
            next_gpu = node->gpu.dev + 1;
        if (node->type == CFX_TOPO_NET && node->net.dev >= next_net)
            next_net = node->net.dev + 1;
        if (node->type == CFX_TOPO_CPU && node->cpu.numa_id >= next_numa)
            next_numa = node->cpu.numa_id + 1;
    }
    for (int n = 0; n < sys->n_nodes; n++) {
        struct cfx_topo_node *node = &sys->nodes[n];
        if (node->type == CFX_TOPO_GPU && node->gpu.dev < 0)
            node->gpu.dev = next_gpu++;
        if (node->type == CFX_TOPO_NET && node->net.dev < 0)
            node->net.dev = next_net++;
        if (node->type == CFX_TOPO_NET && node->net.name[0] == '\0')
            snprintf(node->net.name, sizeof(node->net.name), "net%d", node->net.dev);
        if (node->type == CFX_TOPO_CPU && node->cpu.numa_id < 0) {
            node->cpu.numa_id = next_numa++;
            node->id = (uint64_t)node->cpu.numa_id;
        }
    }
}

static cfxResult_t load_doc(struct xml_loader *ld, xmlDoc *doc)
{
    const xmlNode *root = xmlDocGetRootElement(doc);
    if (root == NULL || !is_element(root, "system"))
        return cfx_error_set(
            cfxInvalidArgument, CFX_LOG_GRAPH, "%s:%ld: the root element is <%s>, not <system>",
            ld->name, root ? xmlGetLineNo(root) : 1L, root ? (const char *)root->name : "nothing");
    char version[16];
    if (attr_text(root, "version", version, sizeof(version)) && strcmp(version, "1") != 0)
        CFX_WARN(CFX_LOG_GRAPH, "%s: topology version %s; reading it as version 1", ld->name,
                 version);
    for (const xmlNode *c = root->children; c; c = c->next) {
        if (is_element(c, "cpu"))
            CFX_CHECK(load_cpu(ld, c));
        else if (c->type == XML_ELEMENT_NODE)
            ignore_unknown(ld, c);
    }
    number_unnumbered(ld->sys);
    return cfx_topo_finish(ld->sys, ld->name);
}

cfxResult_t cfx_topo_load_xml_buffer(const char *text, size_t size, const char *name,
                                     struct cfx_topo_system **sys_p)
{
    pthread_once(&xml_once, xml_init);
    if (size > XML_MAX_BYTES)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH,
                             "%s: %zu bytes is too large for a topology file", name, size);
    cfxResult_t res = cfxSuccess;
    struct xml_loader ld = {.sys = NULL, .name = name};
    xmlDoc *doc = NULL;
    xmlParserCtxt *ctxt = xmlNewParserCtxt();
    if (ctxt == NULL)
        return cfx_error_set(cfxSystemError, CFX_LOG_GRAPH, "%s: out of memory for the parser",
                             name);
    struct first_error first = {.seen = 0};
    ctxt->_private = &first;
    ctxt->sax->serror = keep_first_error; /* Also keeps libxml2 from printing. */
    doc = xmlCtxtReadMemory(ctxt, text, (int)size, name, NULL,
                            XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING |
                                XML_PARSE_BIG_LINES);
    if (doc == NULL || first.seen) {
        if (!first.seen) {
            const xmlError *err = xmlCtxtGetLastError(ctxt);
            first.line = err ? err->line : 0;
            snprintf(first.message, sizeof(first.message), "%s",
                     err && err->message ? err->message : "not well-formed XML");
            first.message[strcspn(first.message, "\n")] = '\0';
        }
        res =
            cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH, "%s:%d: not a valid topology file: %s",
                          name, first.line, first.message);
        goto out_doc;
    }
    ld.sys = cfx_topo_new(name);
    if (ld.sys == NULL) {
        res = cfxSystemError;
        goto out_doc;
    }
    res = load_doc(&ld, doc);
    if (res == cfxSuccess) {
        *sys_p = ld.sys;
        ld.sys = NULL;
    }
    cfx_topo_free(ld.sys);
out_doc:
    if (doc)
        xmlFreeDoc(doc);
    xmlFreeParserCtxt(ctxt);
    return res;
}

cfxResult_t cfx_topo_load_xml(const char *path, struct cfx_topo_system **sys_p)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return cfx_error_set_errno(errno, CFX_LOG_GRAPH, "cannot open topology file %s", path);
    cfxResult_t res = cfxSuccess;
    char *text = NULL;
    size_t size = 0, cap = 0;
    for (;;) {
        if (size == cap) {
            cap = cap ? 2 * cap : 65536;
            char *grown = cap <= XML_MAX_BYTES + 1 ? realloc(text, cap) : NULL;
            if (grown == NULL) {
                res = cfx_error_set(cfxInvalidArgument, CFX_LOG_GRAPH,
                                    "%s: too large for a topology file (or out of memory)", path);
                goto out;
            }
            text = grown;
        }
        size_t got = fread(text + size, 1, cap - size, f);
        size += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        res = cfx_error_set_errno(errno, CFX_LOG_GRAPH, "cannot read topology file %s", path);
        goto out;
    }
    res = cfx_topo_load_xml_buffer(text, size, path, sys_p);
out:
    free(text);
    fclose(f);
    return res;
}

/* ------------------------------------------------------------ writing */

static void put_attr(FILE *out, const char *name, const char *value)
{
    fprintf(out, " %s=\"", name);
    for (const char *c = value; *c; c++) {
        switch (*c) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        default: fputc(*c, out); break;
        }
    }
    fputc('"', out);
}

static void put_attr_int(FILE *out, const char *name, long long value)
{
    fprintf(out, " %s=\"%lld\"", name, value);
}

static void put_pci_open(FILE *out, const struct cfx_topo_node *node, int depth)
{
    fprintf(out, "%*s<pci", 2 * depth, "");
    put_attr(out, "busid", node->busid);
    if (node->pci_class) {
        char text[16];
        snprintf(text, sizeof(text), "0x%06x", node->pci_class);
        put_attr(out, "class", text);
    }
    if (node->vendor[0])
        put_attr(out, "vendor", node->vendor);
    if (node->device[0])
        put_attr(out, "device", node->device);
    if (node->subsys_vendor[0])
        put_attr(out, "subsystem_vendor", node->subsys_vendor);
    if (node->subsys_device[0])
        put_attr(out, "subsystem_device", node->subsys_device);
    /* Always both: NCCL's reader requires them, and writes "" itself for a
     * device whose sysfs entry does not say. */
    put_attr(out, "link_speed", node->link_speed);
    if (node->link_width > 0)
        put_attr_int(out, "link_width", node->link_width);
    else
        put_attr(out, "link_width", "");
}

static void put_nic_body(FILE *out, const struct cfx_topo_system *sys, int nic, int depth)
{
    fprintf(out, "%*s<nic>\n", 2 * depth, "");
    for (int n = nic + 1; n < sys->n_nodes; n++) {
        const struct cfx_topo_node *net = &sys->nodes[n];
        if (net->type != CFX_TOPO_NET || net->parent != nic)
            continue;
        char text[64];
        fprintf(out, "%*s<net", 2 * depth + 2, "");
        put_attr(out, "name", net->net.name);
        put_attr_int(out, "dev", net->net.dev);
        put_attr_int(out, "speed", net->net.speed_mbps);
        put_attr_int(out, "port", net->net.port);
        snprintf(text, sizeof(text), "%f", net->net.latency_us);
        put_attr(out, "latency", text);
        snprintf(text, sizeof(text), "0x%" PRIx64, net->net.guid);
        put_attr(out, "guid", text);
        put_attr_int(out, "maxconn", net->net.maxconn);
        put_attr_int(out, "gdr", net->net.gdr);
        if (net->net.coll)
            put_attr_int(out, "coll", net->net.coll);
        fprintf(out, "/>\n");
    }
    fprintf(out, "%*s</nic>\n", 2 * depth, "");
}

static void put_gpu_body(FILE *out, const struct cfx_topo_node *gpu, int depth)
{
    fprintf(out, "%*s<gpu", 2 * depth, "");
    put_attr_int(out, "dev", gpu->gpu.dev);
    put_attr_int(out, "sm", gpu->gpu.sm);
    if (gpu->gpu.rank >= 0)
        put_attr_int(out, "rank", gpu->gpu.rank);
    put_attr_int(out, "gdr", gpu->gpu.gdr);
    if (gpu->gpu.n_nvlinks == 0) {
        fprintf(out, "/>\n");
        return;
    }
    fprintf(out, ">\n");
    for (int r = 0; r < gpu->gpu.n_nvlinks; r++) {
        const struct cfx_topo_nvlink *rec = &gpu->gpu.nvlinks[r];
        char text[16];
        fprintf(out, "%*s<nvlink", 2 * depth + 2, "");
        put_attr(out, "target", rec->target);
        put_attr_int(out, "count", rec->count);
        if (rec->target_class) {
            snprintf(text, sizeof(text), "0x%06x", rec->target_class);
            put_attr(out, "tclass", text);
        }
        fprintf(out, "/>\n");
    }
    fprintf(out, "%*s</gpu>\n", 2 * depth, "");
}

static void put_children(FILE *out, const struct cfx_topo_system *sys, int parent, int depth)
{
    for (int n = parent + 1; n < sys->n_nodes; n++) {
        const struct cfx_topo_node *node = &sys->nodes[n];
        if (node->parent != parent || node->type == CFX_TOPO_NET)
            continue;
        if (node->busid[0] == '\0') {
            /* No PCI function: written straight under its parent. */
            if (node->type == CFX_TOPO_NIC)
                put_nic_body(out, sys, n, depth);
            else if (node->type == CFX_TOPO_GPU)
                put_gpu_body(out, node, depth);
            continue;
        }
        put_pci_open(out, node, depth);
        fprintf(out, ">\n");
        if (node->type == CFX_TOPO_GPU)
            put_gpu_body(out, node, depth + 1);
        else if (node->type == CFX_TOPO_NIC)
            put_nic_body(out, sys, n, depth + 1);
        else
            put_children(out, sys, n, depth + 1);
        fprintf(out, "%*s</pci>\n", 2 * depth, "");
    }
}

cfxResult_t cfx_topo_dump_xml_file(const struct cfx_topo_system *sys, FILE *out)
{
    fprintf(out, "<system version=\"1\">\n");
    for (int n = 0; n < sys->n_nodes; n++) {
        const struct cfx_topo_node *cpu = &sys->nodes[n];
        if (cpu->type != CFX_TOPO_CPU)
            continue;
        fprintf(out, "  <cpu");
        put_attr_int(out, "numaid", cpu->cpu.numa_id);
        if (cpu->cpu.host_hash[0])
            put_attr(out, "host_hash", cpu->cpu.host_hash);
        if (cpu->cpu.affinity[0])
            put_attr(out, "affinity", cpu->cpu.affinity);
        if (cpu->cpu.arch[0])
            put_attr(out, "arch", cpu->cpu.arch);
        if (cpu->cpu.vendor[0])
            put_attr(out, "vendor", cpu->cpu.vendor);
        if (cpu->cpu.family >= 0)
            put_attr_int(out, "familyid", cpu->cpu.family);
        if (cpu->cpu.model >= 0)
            put_attr_int(out, "modelid", cpu->cpu.model);
        fprintf(out, ">\n");
        put_children(out, sys, n, 2);
        fprintf(out, "  </cpu>\n");
    }
    fprintf(out, "</system>\n");
    if (ferror(out))
        return cfx_error_set_errno(errno ? errno : EIO, CFX_LOG_GRAPH, "cannot write the topology");
    return cfxSuccess;
}

cfxResult_t cfx_topo_dump_xml(const struct cfx_topo_system *sys, const char *path)
{
    FILE *out = fopen(path, "w");
    if (out == NULL)
        return cfx_error_set_errno(errno, CFX_LOG_GRAPH, "cannot create topology file %s", path);
    cfxResult_t res = cfx_topo_dump_xml_file(sys, out);
    if (fclose(out) != 0 && res == cfxSuccess)
        res = cfx_error_set_errno(errno, CFX_LOG_GRAPH, "cannot write topology file %s", path);
    return res;
}
