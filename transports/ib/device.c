/*
 * Which NICs, ports and GIDs a communicator's verbs connections use: the
 * active ports of the devices libibverbs lists that CFX_IB_HCA (NCCL's
 * syntax) lets through, the topology's nearest NIC for this rank first, at
 * most IB_MAX_NICS; for RoCE the GID of the wanted RoCE version and address
 * family (sysfs says a GID's type; without sysfs, the first IPv4-mapped
 * GID), CFX_IB_GID_INDEX overriding. Each port taken gets its own device
 * context and protection domain.
 */
#include "cfx_build_config.h"

#if CFX_HAVE_VERBS

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/util/log.h"
#include "src/util/param.h"
#include "transports/ib/conn.h"

CFX_PARAM_STR(ib_hca, "IB_HCA", NULL,
              "Verbs transport: which NICs and ports to use (NCCL syntax: mlx5_0:1,mlx5_1; a "
              "leading ^ excludes, = matches names exactly)");
CFX_PARAM_INT(ib_gid_index, "IB_GID_INDEX", -1, -1, 255,
              "Verbs transport: GID index (-1: pick one; RoCE: by CFX_IB_ROCE_VERSION_NUM and "
              "CFX_IB_ADDR_FAMILY)");
CFX_PARAM_INT(ib_roce_version, "IB_ROCE_VERSION_NUM", 2, 1, 2,
              "Verbs transport: RoCE version whose GID to use");
CFX_PARAM_STR(ib_addr_family, "IB_ADDR_FAMILY", "AF_INET",
              "Verbs transport: RoCE GID address family (AF_INET or AF_INET6)");

/* ------------------------------------------------------------ CFX_IB_HCA */

int cfx_ib_hca_match(const char *spec, const char *name, int port)
{
    if (spec == NULL)
        return 1;
    while (isspace((unsigned char)*spec))
        spec++;
    if (*spec == '\0')
        return 1;
    int exclude = 0, exact = 0;
    if (*spec == '^') {
        exclude = 1;
        spec++;
    }
    if (*spec == '=') {
        exact = 1;
        spec++;
    }
    int listed = 0;
    const char *p = spec;
    while (*p && !listed) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[IB_NAME_MAX];
        if (len >= sizeof(item))
            len = sizeof(item) - 1;
        memcpy(item, p, len);
        item[len] = '\0';
        int want_port = -1;
        char *colon = strchr(item, ':');
        if (colon) {
            *colon = '\0';
            want_port = atoi(colon + 1);
        }
        size_t n = strlen(item);
        int name_ok = exact ? strcmp(item, name) == 0 : strncmp(item, name, n) == 0;
        if (n > 0 && name_ok && (want_port < 0 || want_port == port))
            listed = 1;
        p = end ? end + 1 : p + len;
    }
    return exclude ? !listed : listed;
}

/* ------------------------------------------------------------ GID */

static int gid_is_zero(const union ibv_gid *gid)
{
    static const uint8_t zero[16];
    return memcmp(gid->raw, zero, sizeof(zero)) == 0;
}

static int gid_is_v4(const union ibv_gid *gid)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(gid->raw, prefix, sizeof(prefix)) == 0;
}

/* sysfs's word for GID @p index's type ("RoCE v2", "IB/RoCE v1"), or "". */
static void gid_type(const char *dev, int port, int index, char *out, size_t size)
{
    char path[256];
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev, port,
             index);
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    if (fgets(out, (int)size, f) == NULL)
        out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
}

/* RoCE: the GID index to use, or -1 when none fits. */
static int roce_gid_pick(struct cfx_ib_ctx *ctx, struct cfx_ib_nic *nic,
                         const struct ibv_port_attr *attr)
{
    int want_v4 = strcmp(param_ib_addr_family(), "AF_INET6") != 0;
    int want_v2 = param_ib_roce_version() == 2;
    int fallback = -1;
    for (int i = 0; i < attr->gid_tbl_len && i < 256; i++) {
        union ibv_gid gid;
        if (ctx->ibv->query_gid(nic->dev, (uint8_t)nic->port.port, i, &gid) != 0 ||
            gid_is_zero(&gid))
            continue;
        if (gid_is_v4(&gid) != want_v4)
            continue;
        char type[32];
        gid_type(nic->port.dev_name, nic->port.port, i, type, sizeof(type));
        if (type[0] == '\0') { /* No sysfs (a test library): the address family decides. */
            if (fallback < 0)
                fallback = i;
            continue;
        }
        if ((strstr(type, "v2") != NULL) == want_v2)
            return i;
    }
    return fallback;
}

static cfxResult_t gid_pick(struct cfx_ib_ctx *ctx, struct cfx_ib_nic *nic,
                            const struct ibv_port_attr *attr)
{
    struct cfx_ib_port *port = &nic->port;
    int index = (int)param_ib_gid_index();
    if (index < 0 && port->link_layer == IBV_LINK_LAYER_ETHERNET) {
        index = roce_gid_pick(ctx, nic, attr);
        if (index < 0) {
            snprintf(ctx->why_not, sizeof(ctx->why_not),
                     "%s port %d (RoCE) has no GID of RoCE v%d and %s; set CFX_IB_GID_INDEX",
                     port->dev_name, port->port, (int)param_ib_roce_version(),
                     param_ib_addr_family());
            return cfxSystemError;
        }
    }
    port->gid_index = index;
    memset(&port->gid, 0, sizeof(port->gid));
    if (index >= 0 && ctx->ibv->query_gid(nic->dev, (uint8_t)port->port, index, &port->gid) != 0) {
        snprintf(ctx->why_not, sizeof(ctx->why_not), "%s port %d: cannot read GID %d: %s",
                 port->dev_name, port->port, index, strerror(errno));
        return cfxSystemError;
    }
    return cfxSuccess;
}

/* ------------------------------------------------------------ open */

/* Whether device @p name is the topology's NIC @p nearest ("mlx5_0", or
 * with a port, "mlx5_0:1"). */
static int is_nearest(const char *nearest, const char *name, int port)
{
    if (nearest == NULL || nearest[0] == '\0')
        return 0;
    size_t n = strlen(name);
    if (strncmp(nearest, name, n) != 0)
        return 0;
    return nearest[n] == '\0' || (nearest[n] == ':' && atoi(nearest + n + 1) == port);
}

/* Take port @p p of @p device as the next NIC (its own context and
 * protection domain), the nearest one first. 1 when taken. */
static int take_port(struct cfx_ib_ctx *ctx, struct ibv_device *device, const char *name, int p,
                     const struct ibv_port_attr *attr)
{
    const struct cfx_verbs_api *ibv = ctx->ibv;
    int first = is_nearest(ctx->nearest, name, p);
    if (ctx->n_nics == IB_MAX_NICS && !first)
        return 0;
    struct cfx_ib_nic nic;
    memset(&nic, 0, sizeof(nic));
    nic.ctx = ctx;
    nic.dev = ibv->open_device(device);
    if (nic.dev == NULL)
        return 0;
    struct cfx_ib_port *port = &nic.port;
    snprintf(port->dev_name, sizeof(port->dev_name), "%s", name);
    port->port = p;
    snprintf(port->label, sizeof(port->label), "%.16s:%d", name, p);
    port->link_layer = attr->link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET
                                                                   : IBV_LINK_LAYER_INFINIBAND;
    port->lid = attr->lid;
    port->mtu = attr->active_mtu;
    if (gid_pick(ctx, &nic, attr) != cfxSuccess)
        goto err_close;
    nic.pd = ibv->alloc_pd(nic.dev);
    if (nic.pd == NULL) {
        snprintf(ctx->why_not, sizeof(ctx->why_not), "%s: cannot allocate a protection domain: %s",
                 port->label, strerror(errno));
        goto err_close;
    }
    if (ctx->n_nics == IB_MAX_NICS) { /* The nearest comes late: the last gives way. */
        struct cfx_ib_nic *last = &ctx->nic[IB_MAX_NICS - 1];
        ibv->dealloc_pd(last->pd);
        ibv->close_device(last->dev);
        ctx->n_nics--;
    }
    int at = first ? 0 : ctx->n_nics;
    memmove(&ctx->nic[at + 1], &ctx->nic[at], (size_t)(ctx->n_nics - at) * sizeof(nic));
    ctx->nic[at] = nic;
    ctx->n_nics++;
    return 1;

err_close:
    ibv->close_device(nic.dev);
    return 0;
}

/* Every active port of @p device that CFX_IB_HCA lets through. */
static void try_device(struct cfx_ib_ctx *ctx, struct ibv_device *device, char *seen,
                       size_t seen_size)
{
    const struct cfx_verbs_api *ibv = ctx->ibv;
    const char *name = ibv->get_device_name(device);
    struct ibv_context *dev = ibv->open_device(device);
    if (dev == NULL)
        return;
    struct ibv_device_attr attr;
    if (ibv->query_device(dev, &attr) != 0) {
        ibv->close_device(dev);
        return;
    }
    for (int p = 1; p <= attr.phys_port_cnt; p++) {
        struct ibv_port_attr port;
        if (ibv->query_port(dev, (uint8_t)p, &port) != 0)
            continue;
        size_t used = strlen(seen);
        snprintf(seen + used, seen_size - used, "%s%s:%d (%s)", used ? ", " : "", name, p,
                 port.state == IBV_PORT_ACTIVE ? "active" : "not active");
        if (port.state != IBV_PORT_ACTIVE || !cfx_ib_hca_match(param_ib_hca(), name, p))
            continue;
        take_port(ctx, device, name, p, &port);
    }
    ibv->close_device(dev);
}

cfxResult_t cfx_ib_device_open(struct cfx_ib_ctx *ctx)
{
    const struct cfx_verbs_api *ibv = ctx->ibv;
    int count = 0;
    errno = 0;
    struct ibv_device **list = ibv->get_device_list(&count);
    if (list == NULL || count == 0) {
        snprintf(ctx->why_not, sizeof(ctx->why_not), "no verbs device (%s)",
                 list == NULL ? strerror(errno ? errno : ENODEV) : "the device list is empty");
        if (list)
            ibv->free_device_list(list);
        return cfxSystemError;
    }
    char seen[512] = "";
    ctx->why_not[0] = '\0';
    for (int i = 0; i < count; i++)
        try_device(ctx, list[i], seen, sizeof(seen));
    ibv->free_device_list(list);
    if (ctx->n_nics == 0) {
        if (ctx->why_not[0] == '\0')
            snprintf(ctx->why_not, sizeof(ctx->why_not),
                     "no active verbs port that CFX_IB_HCA=%s lets through (ports: %s)",
                     param_ib_hca() ? param_ib_hca() : "", seen[0] ? seen : "none");
        return cfxSystemError;
    }
    ctx->why_not[0] = '\0'; /* A port that failed is not why: others run. */
    for (int n = 0; n < ctx->n_nics; n++) {
        const struct cfx_ib_port *port = &ctx->nic[n].port;
        char gid_text[INET6_ADDRSTRLEN] = "none";
        if (port->gid_index >= 0)
            inet_ntop(AF_INET6, port->gid.raw, gid_text, sizeof(gid_text));
        char which[64] = "";
        if (ctx->n_nics > 1)
            snprintf(which, sizeof(which), "; port %d of %d%s", n + 1, ctx->n_nics,
                     is_nearest(ctx->nearest, port->dev_name, port->port)
                         ? ", the topology's nearest"
                         : "");
        char who[32] = "the verbs net"; /* No rank: the process-wide ports of net.c. */
        if (ctx->rank >= 0)
            snprintf(who, sizeof(who), "rank %d", ctx->rank);
        CFX_INFO(CFX_LOG_NET, "ib: %s uses %s port %d (%s, lid %u, GID index %d %s, mtu %d%s)", who,
                 port->dev_name, port->port,
                 port->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", port->lid,
                 port->gid_index, gid_text, 128 << port->mtu, which);
    }
    return cfxSuccess;
}

void cfx_ib_device_close(struct cfx_ib_ctx *ctx)
{
    for (int n = 0; n < ctx->n_nics; n++) {
        struct cfx_ib_nic *nic = &ctx->nic[n];
        if (nic->pd)
            ctx->ibv->dealloc_pd(nic->pd);
        nic->pd = NULL;
        if (nic->dev)
            ctx->ibv->close_device(nic->dev);
        nic->dev = NULL;
    }
    ctx->n_nics = 0;
}

/* ------------------------------------------------------------ async events */

enum cfx_ib_event_scope cfx_ib_event_scope(enum ibv_event_type type)
{
    switch (type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR: return CFX_IB_EVENT_QP;
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_DEVICE_FATAL:
    case IBV_EVENT_CQ_ERR: return CFX_IB_EVENT_PORT;
    default: return CFX_IB_EVENT_OTHER;
    }
}

int cfx_ib_nic_mark_fatal(struct cfx_ib_nic *nic, const char *prefix, const char *suffix,
                          const char *what)
{
    if (atomic_load_explicit(&nic->fatal, memory_order_relaxed))
        return 0;
    snprintf(nic->fatal_error, sizeof(nic->fatal_error), "%s%s port %d%s: %s", prefix,
             nic->port.dev_name, nic->port.port, suffix, what);
    atomic_store_explicit(&nic->fatal, 1, memory_order_release);
    return 1;
}

#endif /* CFX_HAVE_VERBS */
