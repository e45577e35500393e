/*
 * NCCL_* settings for Conflux. A program written for NCCL is configured
 * with NCCL_* variables; each one that has a CFX_* twin sets it, once, in
 * this library's constructor: after libconflux is loaded (it reads no
 * setting while loading) and before any call. A CFX_* variable already in
 * the environment wins, so a user can still override the mapping. A value
 * whose syntax differs (NCCL_DEBUG=ABORT, NCCL_SOCKET_FAMILY=AF_INET6) is
 * translated; the others are NCCL's syntax already (docs/api.md has the
 * table).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "bindings/nccl/shim.h"

/* The CFX form of an NCCL value. */
typedef const char *(*value_map_fn)(const char *value);

/* NCCL's levels are NONE VERSION WARN INFO ABORT TRACE; Conflux has no
 * ABORT (NCCL's "print only when aborting"), WARN is the nearest. */
static const char *map_debug(const char *value)
{
    return strcasecmp(value, "ABORT") == 0 ? "WARN" : value;
}

/* NCCL: AF_INET / AF_INET6; Conflux: 4 / 6. */
static const char *map_family(const char *value)
{
    if (strcasecmp(value, "AF_INET") == 0)
        return "4";
    if (strcasecmp(value, "AF_INET6") == 0)
        return "6";
    return value;
}

/* NCCL: "none" loads no net plugin; Conflux: unset (or empty). A name
 * ("aws-ofi": libnccl-net-aws-ofi.so) or a path reads the same in both. */
static const char *map_net_plugin(const char *value)
{
    return strcasecmp(value, "none") == 0 ? "" : value;
}

struct env_twin {
    const char *nccl;
    const char *cfx;
    value_map_fn map; /* NULL: the same syntax. */
    int logging;      /* Re-read by ncclResetDebugInit. */
};

/* Keep in the order of docs/api.md's table. */
static const struct env_twin twins[] = {
    {"NCCL_DEBUG", "CFX_DEBUG", map_debug, 1},
    {"NCCL_DEBUG_SUBSYS", "CFX_DEBUG_SUBSYS", NULL, 1},
    {"NCCL_DEBUG_FILE", "CFX_DEBUG_FILE", NULL, 1},
    {"NCCL_COMM_ID", "CFX_COMM_ID", NULL, 0},
    {"NCCL_SOCKET_IFNAME", "CFX_SOCKET_IFNAME", NULL, 0},
    {"NCCL_SOCKET_FAMILY", "CFX_SOCKET_FAMILY", map_family, 0},
    {"NCCL_SOCKET_NTHREADS", "CFX_SOCKET_NTHREADS", NULL, 0},
    {"NCCL_NSOCKS_PERTHREAD", "CFX_NSOCKS_PERTHREAD", NULL, 0},
    {"NCCL_ALGO", "CFX_ALGO", NULL, 0},
    {"NCCL_PROTO", "CFX_PROTO", NULL, 0},
    {"NCCL_BUFFSIZE", "CFX_BUFFSIZE", NULL, 0},
    {"NCCL_MAX_NCHANNELS", "CFX_MAX_NCHANNELS", NULL, 0},
    {"NCCL_MIN_NCHANNELS", "CFX_MIN_NCHANNELS", NULL, 0},
    {"NCCL_SHM_DISABLE", "CFX_SHM_DISABLE", NULL, 0},
    {"NCCL_TOPO_FILE", "CFX_TOPO_FILE", NULL, 0},
    {"NCCL_TOPO_DUMP_FILE", "CFX_TOPO_DUMP_FILE", NULL, 0},
    {"NCCL_HOSTID", "CFX_HOSTID", NULL, 0},
    {"NCCL_MULTI_RANK_GPU_ENABLE", "CFX_MULTI_RANK_GPU_ENABLE", NULL, 0},
    {"NCCL_IB_HCA", "CFX_IB_HCA", NULL, 0},
    {"NCCL_IB_DISABLE", "CFX_IB_DISABLE", NULL, 0},
    {"NCCL_NET", "CFX_NET", NULL, 0},
    {"NCCL_NET_GDR_LEVEL", "CFX_NET_GDR_LEVEL", NULL, 0},
    {"NCCL_NET_PLUGIN", "CFX_NET_PLUGIN", map_net_plugin, 0},
    {"NCCL_NET_FORCE_MERGE", "CFX_NET_FORCE_MERGE", NULL, 0},
    {"NCCL_P2P_DISABLE", "CFX_P2P_DISABLE", NULL, 0},
    {"NCCL_P2P_LEVEL", "CFX_P2P_LEVEL", NULL, 0},
    {"NCCL_P2P_READ_ENABLE", "CFX_P2P_READ_ENABLE", NULL, 0},
    {"NCCL_CUMEM_ENABLE", "CFX_CUMEM_ENABLE", NULL, 0},
    {"NCCL_DMABUF_ENABLE", "CFX_DMABUF_ENABLE", NULL, 0},
};
#define N_TWINS (sizeof(twins) / sizeof(twins[0]))

/* Common NCCL settings with no Conflux twin: said so at CFX_DEBUG=INFO. */
static const char *const orphans[] = {
    "NCCL_NVLS_ENABLE",
    "NCCL_CONF_FILE",
};

/* Twins whose CFX variable this file set (so that it may set it again). */
static unsigned char set_here[N_TWINS];

int cfx_nccl_log_level(void)
{
    static const char *const levels[] = {"NONE", "VERSION", "WARN", "INFO", "TRACE"};
    const char *value = getenv("CFX_DEBUG");
    if (value == NULL)
        return 0;
    for (int level = 0; level < 5; level++)
        if (strcasecmp(value, levels[level]) == 0)
            return level;
    return 2; /* As Conflux: an unknown word still means "tell me something". */
}

void cfx_nccl_env_apply(int logging_only)
{
    char notes[N_TWINS][200];
    int n_notes = 0;
    for (size_t i = 0; i < N_TWINS; i++) {
        const struct env_twin *twin = &twins[i];
        if (logging_only && !twin->logging)
            continue;
        const char *value = getenv(twin->nccl);
        const char *current = getenv(twin->cfx);
        if (current != NULL && !set_here[i]) {
            if (value != NULL && strcmp(value, current) != 0)
                snprintf(notes[n_notes++], sizeof(notes[0]), "%s=%s ignored: %s=%s is set",
                         twin->nccl, value, twin->cfx, current);
            continue;
        }
        if (value == NULL) {
            if (set_here[i]) /* NCCL_X is gone since: so is what it set. */
                unsetenv(twin->cfx);
            set_here[i] = 0;
            continue;
        }
        const char *mapped = twin->map ? twin->map(value) : value;
        if (setenv(twin->cfx, mapped, 1) == 0) {
            set_here[i] = 1;
            snprintf(notes[n_notes++], sizeof(notes[0]), "%s=%s -> %s=%s", twin->nccl, value,
                     twin->cfx, mapped);
        }
    }
    /* Printed once the mapping is done, so NCCL_DEBUG=INFO shows them all. */
    if (cfx_nccl_log_level() < 3)
        return;
    for (int i = 0; i < n_notes; i++)
        fprintf(stderr, "conflux-nccl INFO %s\n", notes[i]);
    if (logging_only)
        return;
    for (size_t i = 0; i < sizeof(orphans) / sizeof(orphans[0]); i++)
        if (getenv(orphans[i]))
            fprintf(stderr, "conflux-nccl INFO %s has no Conflux twin: ignored (docs/api.md)\n",
                    orphans[i]);
}

__attribute__((constructor)) static void map_nccl_environment(void)
{
    cfx_nccl_env_apply(0);
}
