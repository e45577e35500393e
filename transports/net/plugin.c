/*
 * Loading an NCCL net plugin (CFX_NET_PLUGIN), once per process, and its
 * calls behind one face for v8 to v11 tables (the newest the library
 * exports). A name without a slash,
 * "foo", tries libnccl-net-foo.so first, then "foo" as it is (NCCL's
 * convention); anything with a slash is a path. The library is dlopened
 * and never closed (a plugin may have started threads). "builtin:socket"
 * and "builtin:ib" load nothing: Conflux's own socket net
 * (builtin_socket.c) or verbs net (transports/ib/net.c), v9 tables, go
 * behind the same face.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/time.h"
#include "transports/net/builtin.h"
#include "transports/net/conn.h"

CFX_PARAM_STR(net_plugin, "NET_PLUGIN", "",
              "NCCL net plugin carrying traffic between hosts: a path, a name foo for "
              "libnccl-net-foo.so, or builtin:socket / builtin:ib for Conflux's own socket or "
              "verbs net behind the same interface (unset: none)");

static const char *const dist_names[] = {"LOC", "PORT", "PIX", "PXB", "PHB", "SYS"};

/* The distance CFX_NET_MERGE_LEVEL names, or -1. */
static int dist_of(const char *text)
{
    for (int d = 0; d < (int)(sizeof(dist_names) / sizeof(dist_names[0])); d++)
        if (strcasecmp(text, dist_names[d]) == 0)
            return d;
    return -1;
}

static const char *check_merge_level(const char *text, char *buf, size_t len)
{
    (void)buf;
    (void)len;
    return dist_of(text) < 0 ? "expected one of LOC, PORT, PIX, PXB, PHB, SYS" : NULL;
}

CFX_PARAM_STR_CHECKED(net_merge_level, "NET_MERGE_LEVEL", "PORT", check_merge_level,
                      "Devices of the net plugin at most this far apart are merged into "
                      "virtual devices when CFX_NET_FORCE_MERGE is unset (NCCL's names: LOC "
                      "never merges, PORT the ports of one device, then PIX, PXB, PHB, SYS)");

CFX_PARAM_STR(net_force_merge, "NET_FORCE_MERGE", "",
              "Devices of the net plugin merged into virtual devices (makeVDevice; NCCL's "
              "syntax: groups separated by ';', names in a group by ',', e.g. "
              "mlx5_0,mlx5_1;mlx5_2,mlx5_3); a rank whose device is in a group uses the group's");

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int load_done;
static cfxResult_t load_res;
static char load_error[CFX_ERROR_MAX];
static struct cfx_net_plugin plugin;
/* The devices' PCI paths from getProperties ("": none given). */
static char dev_pci[NET_MAX_DEVS][256];

/* The plugin's last warning and when it came (under warning_lock), for
 * the sentences of a failed load and of a failed call. */
static pthread_mutex_t warning_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_warning[256];
static int64_t last_warning_ns;

#define BUILTIN_PREFIX "builtin:"

/* The plugin's log lines, into Conflux's log under NET. */
__attribute__((format(printf, 5, 6))) static void plugin_logger(ncclDebugLogLevel level,
                                                                unsigned long flags,
                                                                const char *file, int line,
                                                                const char *fmt, ...)
{
    (void)flags;
    enum cfx_log_level ours = level == NCCL_LOG_WARN || level == NCCL_LOG_ABORT ? CFX_LOG_WARN
                              : level == NCCL_LOG_TRACE                         ? CFX_LOG_TRACE
                                                                                : CFX_LOG_INFO;
    if (level == NCCL_LOG_NONE || fmt == NULL)
        return;
    if (level == NCCL_LOG_WARN || level == NCCL_LOG_ABORT) { /* For a failed load's sentence. */
        va_list copy;
        va_start(copy, fmt);
        pthread_mutex_lock(&warning_lock);
        vsnprintf(last_warning, sizeof(last_warning), fmt, copy);
        last_warning_ns = cfx_time_now_ns();
        pthread_mutex_unlock(&warning_lock);
        va_end(copy);
    }
    if (cfx_log_level_value < 0)
        cfx_log_init();
    if (cfx_log_level_value < (int)ours)
        return;
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    cfx_log(ours, CFX_LOG_NET, file ? file : "net-plugin", line, "net-plugin %s: %s",
            plugin.name[0] ? plugin.name : plugin.path, text);
}

/* dlopen @p spec by NCCL's rule; the path that worked into plugin.path. */
static void *open_library(const char *spec, char *tried, size_t tried_len)
{
    void *lib = NULL;
    if (strchr(spec, '/') == NULL) {
        snprintf(plugin.path, sizeof(plugin.path), "libnccl-net-%s.so", spec);
        lib = dlopen(plugin.path, RTLD_NOW | RTLD_LOCAL);
        if (lib != NULL)
            return lib;
        snprintf(tried, tried_len, "%s: %s; ", plugin.path, dlerror());
    } else {
        tried[0] = '\0';
    }
    snprintf(plugin.path, sizeof(plugin.path), "%s", spec);
    lib = dlopen(plugin.path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        size_t used = strlen(tried);
        snprintf(tried + used, tried_len - used, "%s", dlerror());
    }
    return lib;
}

#define LOAD_FAIL(...)                                                                             \
    do {                                                                                           \
        snprintf(load_error, sizeof(load_error), __VA_ARGS__);                                     \
        return cfxSystemError;                                                                     \
    } while (0)

/* Device @p dev's name, speed and ptrSupport, from whichever table. */
static ncclResult_t dev_properties(int dev, char **name_p, int *speed_p, int *ptr_support_p,
                                   char **pci_p)
{
    ncclResult_t res;
    if (plugin.version == 11) {
        ncclNetProperties_v11_t props;
        memset(&props, 0, sizeof(props));
        res = plugin.v11->getProperties(dev, &props);
        *name_p = props.name, *speed_p = props.speed, *ptr_support_p = props.ptrSupport;
        *pci_p = props.pciPath;
    } else if (plugin.version >= 9) {
        ncclNetProperties_v9_t props; /* v10's record is v9's. */
        memset(&props, 0, sizeof(props));
        res = plugin.version == 10 ? plugin.v10->getProperties(dev, &props)
                                   : plugin.v9->getProperties(dev, &props);
        *name_p = props.name, *speed_p = props.speed, *ptr_support_p = props.ptrSupport;
        *pci_p = props.pciPath;
    } else {
        ncclNetProperties_v8_t props;
        memset(&props, 0, sizeof(props));
        res = plugin.v8->getProperties(dev, &props);
        *name_p = props.name, *speed_p = props.speed, *ptr_support_p = props.ptrSupport;
        *pci_p = props.pciPath;
    }
    return res;
}

/* The newest table @p lib exports, into plugin; 0 when none. NCCL's order:
 * a library exporting several tables is used through its newest. */
static int find_table(void *lib)
{
    if ((plugin.v11 = dlsym(lib, "ncclNetPlugin_v11")) != NULL)
        return plugin.version = 11;
    if ((plugin.v10 = dlsym(lib, "ncclNetPlugin_v10")) != NULL)
        return plugin.version = 10;
    if ((plugin.v9 = dlsym(lib, "ncclNetPlugin_v9")) != NULL)
        return plugin.version = 9;
    if ((plugin.v8 = dlsym(lib, "ncclNetPlugin_v8")) != NULL)
        return plugin.version = 8;
    return 0;
}

/* Calls a member of the loaded table that has the same arguments in every
 * version. */
#define NET_CALL(p, member, ...)                                                                   \
    ((p)->version == 11   ? (p)->v11->member(__VA_ARGS__)                                          \
     : (p)->version == 10 ? (p)->v10->member(__VA_ARGS__)                                          \
     : (p)->version == 9  ? (p)->v9->member(__VA_ARGS__)                                           \
                          : (p)->v8->member(__VA_ARGS__))
/* A member of the loaded table, as a value (NULL when the plugin has none). */
#define NET_MEMBER(p, member)                                                                      \
    ((p)->version == 11   ? (const void *)(p)->v11->member                                         \
     : (p)->version == 10 ? (const void *)(p)->v10->member                                         \
     : (p)->version == 9  ? (const void *)(p)->v9->member                                          \
                          : (const void *)(p)->v8->member)

/* Records device @p dev's name and ptrSupport from getProperties; its
 * speed into *speed_p. */
static ncclResult_t note_device(int dev, int *speed_p)
{
    char *dev_name = NULL, *pci = NULL;
    ncclResult_t res = dev_properties(dev, &dev_name, speed_p, &plugin.ptr_support[dev], &pci);
    if (res == ncclSuccess) {
        snprintf(plugin.dev_name[dev], sizeof(plugin.dev_name[dev]), "%s",
                 dev_name ? dev_name : "?");
        snprintf(dev_pci[dev], sizeof(dev_pci[dev]), "%s", pci ? pci : "");
    }
    return res;
}

static cfxResult_t make_vdevice(ncclNetVDeviceProps_v9_t *props, const char *names, int n_phys,
                                const char *why);

/* Whether the loaded table has makeVDevice (v9 and later may). */
static int can_make_vdevices(void)
{
    return plugin.version == 11   ? plugin.v11->makeVDevice != NULL
           : plugin.version == 10 ? plugin.v10->makeVDevice != NULL
           : plugin.version == 9  ? plugin.v9->makeVDevice != NULL
                                  : 0;
}

/* One group of CFX_NET_FORCE_MERGE, @p len bytes at @p group ("a,b"): its
 * devices merged into a virtual device. */
static cfxResult_t merge_group(const char *spec, const char *group, size_t len, int n_phys)
{
    ncclNetVDeviceProps_v9_t props; /* v10's and v11's record is the same. */
    memset(&props, 0, sizeof(props));
    char names[256] = "";
    for (size_t at = 0; at < len;) {
        size_t name_len = strcspn(group + at, ",;");
        if (name_len > len - at)
            name_len = len - at;
        if (name_len > 0) {
            int dev = cfx_net_plugin_find_dev(&plugin, group + at, name_len);
            if (dev < 0 || dev >= n_phys)
                LOAD_FAIL("net-plugin: CFX_NET_FORCE_MERGE=%s names %.*s, which is not a device "
                          "of plugin %s that moves host memory",
                          spec, (int)name_len, group + at, plugin.name);
            if (plugin.merged_into[dev] >= 0)
                LOAD_FAIL("net-plugin: CFX_NET_FORCE_MERGE=%s puts device %s in two groups", spec,
                          plugin.dev_name[dev]);
            if (props.ndevs == NCCL_NET_MAX_DEVS_PER_NIC_V9)
                LOAD_FAIL("net-plugin: CFX_NET_FORCE_MERGE=%s: a group has more than %d devices, "
                          "the most a virtual device holds",
                          spec, NCCL_NET_MAX_DEVS_PER_NIC_V9);
            props.devs[props.ndevs++] = dev;
            size_t used = strlen(names);
            snprintf(names + used, sizeof(names) - used, "%s%d (%s)", used ? ", " : "", dev,
                     plugin.dev_name[dev]);
        }
        at += name_len + 1;
    }
    if (props.ndevs == 0)
        return cfxSuccess; /* An empty group (";;", a trailing ';'). */
    char why[300];
    snprintf(why, sizeof(why), "CFX_NET_FORCE_MERGE=%s", spec);
    return make_vdevice(&props, names, n_phys, why);
}

/* The devices @p props lists (named @p names in sentences) merged into a
 * virtual device, because of @p why. */
static cfxResult_t make_vdevice(ncclNetVDeviceProps_v9_t *props, const char *names, int n_phys,
                                const char *why)
{
    int vdev = -1;
    ncclResult_t res = plugin.version == 11   ? plugin.v11->makeVDevice(&vdev, props)
                       : plugin.version == 10 ? plugin.v10->makeVDevice(&vdev, props)
                                              : plugin.v9->makeVDevice(&vdev, props);
    if (res != ncclSuccess)
        LOAD_FAIL("net-plugin: plugin %s failed makeVDevice of %s (%s): %s", plugin.name, names,
                  why, cfx_net_result_name(res));
    if (vdev < n_phys || vdev >= NET_MAX_DEVS)
        LOAD_FAIL("net-plugin: plugin %s made virtual device %d of %s, not a new device below %d",
                  plugin.name, vdev, names, NET_MAX_DEVS);
    int speed = 0;
    res = note_device(vdev, &speed);
    if (res != ncclSuccess)
        LOAD_FAIL("net-plugin: plugin %s failed getProperties(%d) of its virtual device: %s",
                  plugin.name, vdev, cfx_net_result_name(res));
    plugin.merged_into[vdev] = -1;
    for (int i = 0; i < props->ndevs; i++)
        plugin.merged_into[props->devs[i]] = vdev;
    if (vdev >= plugin.n_devs)
        plugin.n_devs = vdev + 1;
    CFX_INFO(CFX_LOG_NET | CFX_LOG_INIT,
             "net-plugin: merged devices %s into virtual device %d (%s, %d Mbps; %s)", names, vdev,
             plugin.dev_name[vdev], speed, why);
    return cfxSuccess;
}

/* The components of a sysfs PCI path after /sys/devices/ (the root
 * "pci0000:00", then a bus id per bridge, then the device's) into
 * @p comp; their number, or -1 for anything else. Pure. */
static int pci_components(const char *path, char comp[][32], int max)
{
    static const char prefix[] = "/sys/devices/pci";
    if (path == NULL || strncmp(path, prefix, sizeof(prefix) - 1) != 0)
        return -1;
    const char *at = path + sizeof(prefix) - 1 - 3; /* At "pci". */
    int n = 0;
    while (*at != '\0') {
        size_t len = strcspn(at, "/");
        if (len == 0 || len >= 32 || n == max)
            return -1;
        memcpy(comp[n], at, len);
        comp[n++][len] = '\0';
        at += len + (at[len] == '/');
    }
    return n;
}

enum cfx_net_dist cfx_net_pci_distance(const char *a, const char *b)
{
    char ca[16][32], cb[16][32];
    int na = pci_components(a, ca, 16), nb = pci_components(b, cb, 16);
    if (na < 2 || nb < 2)
        return CFX_NET_DIST_UNKNOWN;
    if (strcmp(a, b) == 0)
        return CFX_NET_DIST_PORT; /* Two ports of one PCI function. */
    if (strcmp(ca[0], cb[0]) != 0)
        return CFX_NET_DIST_SYS; /* Different root complexes. */
    int common = 0;              /* Bridges both paths go through, after the root. */
    while (1 + common < na - 1 && 1 + common < nb - 1 &&
           strcmp(ca[1 + common], cb[1 + common]) == 0)
        common++;
    if (na == nb && common == na - 2) { /* Same parent: functions of one device? */
        size_t fa = strcspn(ca[na - 1], "."), fb = strcspn(cb[nb - 1], ".");
        if (fa == fb && strncmp(ca[na - 1], cb[nb - 1], fa) == 0)
            return CFX_NET_DIST_PORT;
    }
    if (common == 0)
        return CFX_NET_DIST_PHB; /* Under different root ports: through the host bridge. */
    /* Switch ports each crosses below the common bridge: one switch (an
     * upstream port in common, a downstream port each) is PIX. */
    int crossed = (na - 2 - common) + (nb - 2 - common);
    return crossed <= 2 ? CFX_NET_DIST_PIX : CFX_NET_DIST_PXB;
}

/* CFX_NET_MERGE_LEVEL (CFX_NET_FORCE_MERGE unset): from the first device
 * not merged yet, every later one at most that far from it joins its
 * virtual device, up to the most one holds (NCCL's rule). Devices without
 * a PCI path, or that cannot move host memory, stay alone; so do devices
 * the plugin fails to merge (unlike a forced merge, which must happen). */
static cfxResult_t auto_merge(int n_phys)
{
    int level = dist_of(param_net_merge_level());
    if (level <= CFX_NET_DIST_LOC || !can_make_vdevices())
        return cfxSuccess; /* Without makeVDevice (v8), devices stay apart. */
    int placed[NET_MAX_DEVS] = {0};
    for (int first = 0; first < n_phys && first < NET_MAX_DEVS; first++) {
        if (placed[first] || !(plugin.ptr_support[first] & NCCL_PTR_HOST))
            continue;
        ncclNetVDeviceProps_v9_t props;
        memset(&props, 0, sizeof(props));
        props.devs[props.ndevs++] = first;
        char names[256];
        snprintf(names, sizeof(names), "%d (%s)", first, plugin.dev_name[first]);
        enum cfx_net_dist farthest = CFX_NET_DIST_PORT;
        for (int dev = first + 1;
             dev < n_phys && dev < NET_MAX_DEVS && props.ndevs < NCCL_NET_MAX_DEVS_PER_NIC_V9;
             dev++) {
            enum cfx_net_dist dist = cfx_net_pci_distance(dev_pci[first], dev_pci[dev]);
            if (placed[dev] || !(plugin.ptr_support[dev] & NCCL_PTR_HOST) || (int)dist > level)
                continue;
            placed[dev] = 1;
            props.devs[props.ndevs++] = dev;
            farthest = dist > farthest ? dist : farthest;
            size_t used = strlen(names);
            snprintf(names + used, sizeof(names) - used, ", %d (%s)", dev, plugin.dev_name[dev]);
        }
        if (props.ndevs < 2)
            continue;
        char why[96];
        snprintf(why, sizeof(why), "CFX_NET_MERGE_LEVEL=%s, %s apart", dist_names[level],
                 dist_names[farthest]);
        /* Merging by distance is an offer: a plugin that cannot make this
         * virtual device keeps the devices apart, and the job runs. */
        if (make_vdevice(&props, names, n_phys, why) != cfxSuccess) {
            CFX_INFO(CFX_LOG_NET | CFX_LOG_INIT, "%s; the devices stay apart", load_error);
            load_error[0] = '\0';
        }
    }
    return cfxSuccess;
}

/* CFX_NET_FORCE_MERGE: each group into a virtual device. */
static cfxResult_t merge_devices(int n_phys)
{
    for (int dev = 0; dev < NET_MAX_DEVS; dev++)
        plugin.merged_into[dev] = -1;
    const char *spec = param_net_force_merge();
    if (spec == NULL || spec[0] == '\0')
        return auto_merge(n_phys);
    if (!can_make_vdevices())
        LOAD_FAIL("net-plugin: CFX_NET_FORCE_MERGE=%s asks for virtual devices, which plugin %s "
                  "(ncclNetPlugin_v%d) cannot make (no makeVDevice)",
                  spec, plugin.name, plugin.version);
    for (const char *at = spec; *at;) {
        size_t len = strcspn(at, ";");
        cfxResult_t res = merge_group(spec, at, len, n_phys);
        if (res != cfxSuccess)
            return res;
        at += len + (at[len] == ';');
    }
    return cfxSuccess;
}

/* CFX_NET_PLUGIN=builtin:<name>: one of Conflux's own nets (builtin.h)
 * instead of a library; 0 when @p spec names none. */
static int find_builtin(const char *spec)
{
    if (strncmp(spec, BUILTIN_PREFIX, strlen(BUILTIN_PREFIX)) != 0)
        return 0;
    const char *name = spec + strlen(BUILTIN_PREFIX);
    if (strcasecmp(name, "socket") == 0)
        plugin.v9 = &cfx_net_builtin_socket;
    if (strcasecmp(name, "ib") == 0)
        plugin.v9 = cfx_net_builtin_ib; /* NULL without the verbs headers. */
    plugin.version = plugin.v9 != NULL ? 9 : 0;
    snprintf(plugin.path, sizeof(plugin.path), "%s", "Conflux's built-in net");
    plugin.builtin = 1;
    return 1;
}

static cfxResult_t load(const char *spec)
{
    char tried[600];
    if (find_builtin(spec)) {
        if (plugin.version == 0 && strcasecmp(spec, BUILTIN_PREFIX "ib") == 0)
            LOAD_FAIL("net-plugin: CFX_NET_PLUGIN=%s, but this Conflux was built without the "
                      "verbs headers (rdma-core's libibverbs-dev)",
                      spec);
        if (plugin.version == 0)
            LOAD_FAIL("net-plugin: CFX_NET_PLUGIN=%s names no built-in net (there are "
                      "builtin:socket and builtin:ib)",
                      spec);
    } else {
        void *lib = open_library(spec, tried, sizeof(tried));
        if (lib == NULL)
            LOAD_FAIL("net-plugin: CFX_NET_PLUGIN=%s cannot be loaded (%s)", spec, tried);
        if (!find_table(lib))
            LOAD_FAIL("net-plugin: CFX_NET_PLUGIN=%s (%s) exports none of ncclNetPlugin_v11, "
                      "_v10, _v9, _v8 (older plugins are not supported)",
                      spec, plugin.path);
    }
    plugin.has_iflush = NET_MEMBER(&plugin, iflush) != NULL;
    plugin.has_dmabuf = NET_MEMBER(&plugin, regMrDmaBuf) != NULL;
    const char *name = plugin.version == 11   ? plugin.v11->name
                       : plugin.version == 10 ? plugin.v10->name
                       : plugin.version == 9  ? plugin.v9->name
                                              : plugin.v8->name;
    snprintf(plugin.name, sizeof(plugin.name), "%s", name ? name : "?");
    ncclResult_t res;
    if (plugin.version == 11) {
        /* Communicator id 0: this context serves every communicator. */
        ncclNetCommConfig_v11_t config = {.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF};
        res = plugin.v11->init(&plugin.ctx, 0, &config, plugin_logger, NULL);
    } else if (plugin.version == 10) {
        res = plugin.v10->init(plugin_logger, NULL);
    } else {
        res = plugin.version == 9 ? plugin.v9->init(plugin_logger) : plugin.v8->init(plugin_logger);
    }
    if (res != ncclSuccess) {
        char warning[sizeof(last_warning)], said[sizeof(last_warning) + 16] = "";
        if (cfx_net_plugin_last_warning(warning, sizeof(warning), 0))
            snprintf(said, sizeof(said), "; it said: %s", warning);
        LOAD_FAIL("net-plugin: plugin %s (v%d, CFX_NET_PLUGIN=%.64s) failed init: %s%.200s",
                  plugin.name, plugin.version, spec, cfx_net_result_name(res), said);
    }
    res = NET_CALL(&plugin, devices, &plugin.n_devs);
    if (res != ncclSuccess)
        LOAD_FAIL("net-plugin: plugin %s (%s) failed devices(): %s", plugin.name, plugin.path,
                  cfx_net_result_name(res));
    if (plugin.n_devs < 1)
        LOAD_FAIL("net-plugin: plugin %s (%s) reports no device", plugin.name, plugin.path);
    int n_seen = plugin.n_devs < NET_MAX_DEVS ? plugin.n_devs : NET_MAX_DEVS;
    char list[512] = "";
    for (int dev = 0; dev < n_seen; dev++) {
        int speed = 0;
        res = note_device(dev, &speed);
        if (res != ncclSuccess)
            LOAD_FAIL("net-plugin: plugin %s (%s) failed getProperties(%d): %s", plugin.name,
                      plugin.path, dev, cfx_net_result_name(res));
        size_t used = strlen(list);
        snprintf(list + used, sizeof(list) - used, "%s%d: %s, %d Mbps%s", dev ? "; " : "", dev,
                 plugin.dev_name[dev], speed,
                 plugin.ptr_support[dev] & NCCL_PTR_HOST ? "" : " (no host memory: unused)");
    }
    if (!(plugin.ptr_support[0] & NCCL_PTR_HOST))
        LOAD_FAIL("net-plugin: plugin %s (%s): device 0 (%s) cannot move host memory "
                  "(ptrSupport 0x%x), which is all Conflux gives it so far",
                  plugin.name, plugin.path, plugin.dev_name[0], plugin.ptr_support[0]);
    CFX_INFO(CFX_LOG_NET | CFX_LOG_INIT,
             "net-plugin: %s %s (ncclNetPlugin_v%d, name \"%s\"), %d device(s): %s",
             plugin.builtin ? "using" : "loaded", plugin.path, plugin.version, plugin.name,
             plugin.n_devs, list);
    return merge_devices(n_seen);
}

cfxResult_t cfx_net_plugin_get(const struct cfx_net_plugin **plugin_p)
{
    const char *spec = param_net_plugin();
    if (spec == NULL || spec[0] == '\0') {
        *plugin_p = NULL;
        return cfxSuccess;
    }
    pthread_mutex_lock(&load_lock);
    if (!load_done) {
        load_res = load(spec);
        load_done = 1;
    }
    cfxResult_t res = load_res;
    pthread_mutex_unlock(&load_lock);
    if (res != cfxSuccess)
        return cfx_error_set(res, CFX_LOG_NET, "%s", load_error);
    *plugin_p = &plugin;
    return cfxSuccess;
}

/* Length of @p name up to a ":port" suffix. Pure. */
static size_t base_len(const char *name)
{
    const char *colon = strchr(name, ':');
    return colon ? (size_t)(colon - name) : strlen(name);
}

int cfx_net_plugin_find_dev(const struct cfx_net_plugin *p, const char *nic_name, size_t len)
{
    int n_seen = p->n_devs < NET_MAX_DEVS ? p->n_devs : NET_MAX_DEVS;
    const char *colon = memchr(nic_name, ':', len);
    if (colon != NULL)
        len = (size_t)(colon - nic_name);
    for (int dev = 0; len > 0 && dev < n_seen; dev++)
        if ((p->ptr_support[dev] & NCCL_PTR_HOST) && base_len(p->dev_name[dev]) == len &&
            strncmp(p->dev_name[dev], nic_name, len) == 0)
            return dev;
    return -1;
}

int cfx_net_plugin_use_dev(const struct cfx_net_plugin *p, int dev)
{
    return dev >= 0 && dev < NET_MAX_DEVS && p->merged_into[dev] >= 0 ? p->merged_into[dev] : dev;
}

const char *cfx_net_result_name(ncclResult_t res)
{
    switch (res) {
    case ncclSuccess: return "ncclSuccess (0)";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError (1)";
    case ncclSystemError: return "ncclSystemError (2)";
    case ncclInternalError: return "ncclInternalError (3)";
    case ncclInvalidArgument: return "ncclInvalidArgument (4)";
    case ncclInvalidUsage: return "ncclInvalidUsage (5)";
    case ncclRemoteError: return "ncclRemoteError (6)";
    default: return "an unknown result";
    }
}

/* ============================================================ calls */

ncclResult_t cfx_net_plugin_listen(const struct cfx_net_plugin *p, int dev, void *handle,
                                   void **listen_comm_p)
{
    if (p->version == 11)
        return p->v11->listen(p->ctx, dev, handle, listen_comm_p);
    if (p->version == 10)
        return p->v10->listen(dev, handle, listen_comm_p);
    return p->version == 9 ? p->v9->listen(dev, handle, listen_comm_p)
                           : p->v8->listen(dev, handle, listen_comm_p);
}

ncclResult_t cfx_net_plugin_connect(const struct cfx_net_plugin *p, int dev, void *handle,
                                    void **send_comm_p)
{
    ncclNetDeviceHandle_v8_t *dev_handle = NULL; /* No offload asked. */
    if (p->version == 11)
        return p->v11->connect(p->ctx, dev, handle, send_comm_p, &dev_handle);
    if (p->version == 10) {
        ncclNetCommConfig_v10_t config = {.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF};
        return p->v10->connect(dev, &config, handle, send_comm_p, &dev_handle);
    }
    return p->version == 9 ? p->v9->connect(dev, handle, send_comm_p, &dev_handle)
                           : p->v8->connect(dev, handle, send_comm_p, &dev_handle);
}

ncclResult_t cfx_net_plugin_accept(const struct cfx_net_plugin *p, void *listen_comm,
                                   void **recv_comm_p)
{
    ncclNetDeviceHandle_v8_t *dev_handle = NULL;
    return NET_CALL(p, accept, listen_comm, recv_comm_p, &dev_handle);
}

ncclResult_t cfx_net_plugin_reg_mr(const struct cfx_net_plugin *p, void *comm, void *data,
                                   size_t bytes, int type, void **mhandle_p)
{
    return NET_CALL(p, regMr, comm, data, bytes, type, mhandle_p);
}

ncclResult_t cfx_net_plugin_reg_mr_dmabuf(const struct cfx_net_plugin *p, void *comm, void *data,
                                          size_t bytes, int fd, void **mhandle_p)
{
    return NET_CALL(p, regMrDmaBuf, comm, data, bytes, NCCL_PTR_CUDA, 0, fd, mhandle_p);
}

ncclResult_t cfx_net_plugin_dereg_mr(const struct cfx_net_plugin *p, void *comm, void *mhandle)
{
    return NET_CALL(p, deregMr, comm, mhandle);
}

ncclResult_t cfx_net_plugin_isend(const struct cfx_net_plugin *p, void *send_comm, void *data,
                                  size_t bytes, void *mhandle, void **request_p)
{
    if (p->version == 11) /* No profiler: a NULL profiler handle. */
        return p->v11->isend(send_comm, data, bytes, 0, mhandle, NULL, request_p);
    if (p->version == 10)
        return p->v10->isend(send_comm, data, bytes, 0, mhandle, NULL, request_p);
    if (p->version == 9)
        return p->v9->isend(send_comm, data, bytes, 0, mhandle, request_p);
    return p->v8->isend(send_comm, data, (int)bytes, 0, mhandle, request_p);
}

ncclResult_t cfx_net_plugin_irecv(const struct cfx_net_plugin *p, void *recv_comm, void *data,
                                  size_t bytes, void *mhandle, void **request_p)
{
    int tag = 0;
    void *datas[1] = {data}, *mhandles[1] = {mhandle};
    if (p->version >= 9) {
        size_t sizes[1] = {bytes};
        void *phandles[1] = {NULL};
        if (p->version == 11)
            return p->v11->irecv(recv_comm, 1, datas, sizes, &tag, mhandles, phandles, request_p);
        if (p->version == 10)
            return p->v10->irecv(recv_comm, 1, datas, sizes, &tag, mhandles, phandles, request_p);
        return p->v9->irecv(recv_comm, 1, datas, sizes, &tag, mhandles, request_p);
    }
    int sizes[1] = {(int)bytes};
    return p->v8->irecv(recv_comm, 1, datas, sizes, &tag, mhandles, request_p);
}

int cfx_net_plugin_last_warning(char *buf, size_t len, int64_t within_ns)
{
    pthread_mutex_lock(&warning_lock);
    int fresh = last_warning[0] != '\0' &&
                (within_ns <= 0 || cfx_time_now_ns() - last_warning_ns <= within_ns);
    if (fresh)
        snprintf(buf, len, "%s", last_warning);
    pthread_mutex_unlock(&warning_lock);
    return fresh;
}

ncclResult_t cfx_net_plugin_test(const struct cfx_net_plugin *p, void *request, int *done_p,
                                 int *bytes_p)
{
    return NET_CALL(p, test, request, done_p, bytes_p);
}

ncclResult_t cfx_net_plugin_iflush(const struct cfx_net_plugin *p, void *recv_comm, void *data,
                                   size_t bytes, void *mhandle, void **request_p)
{
    void *datas[1] = {data}, *mhandles[1] = {mhandle};
    int sizes[1] = {(int)bytes};
    return NET_CALL(p, iflush, recv_comm, 1, datas, sizes, mhandles, request_p);
}

ncclResult_t cfx_net_plugin_close_send(const struct cfx_net_plugin *p, void *send_comm)
{
    return NET_CALL(p, closeSend, send_comm);
}

ncclResult_t cfx_net_plugin_close_recv(const struct cfx_net_plugin *p, void *recv_comm)
{
    return NET_CALL(p, closeRecv, recv_comm);
}

ncclResult_t cfx_net_plugin_close_listen(const struct cfx_net_plugin *p, void *listen_comm)
{
    return NET_CALL(p, closeListen, listen_comm);
}
