/*
 * libibverbs at run time (see verbs.h): dlopen, then dlvsym of every symbol
 * at the version whose signature struct cfx_verbs_api declares.
 */
#include "src/util/verbs.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "src/util/log.h"
#include "src/util/param.h"

CFX_PARAM_STR(ib_verbs_lib, "IB_VERBS_LIB", "libibverbs.so.1",
              "libibverbs to load at run time (a file name or a path)");

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int load_done;
static const struct cfx_verbs_api *loaded_api;
static char load_why[320];

#if CFX_HAVE_VERBS

static struct cfx_verbs_api api_table;
static void *api_lib;

/* Every symbol: where it goes, its name, its version, and whether it is
 * required (a missing optional one leaves its pointer NULL). */
#define VERBS_SYM(field, version, required)                                                        \
    {                                                                                              \
        offsetof(struct cfx_verbs_api, field), "ibv_" #field, version, required                    \
    }

static const struct verbs_sym {
    size_t offset;
    const char *name;
    const char *version;
    int required;
} verbs_syms[] = {
    VERBS_SYM(get_device_list, "IBVERBS_1.1", 1), VERBS_SYM(free_device_list, "IBVERBS_1.1", 1),
    VERBS_SYM(get_device_name, "IBVERBS_1.1", 1), VERBS_SYM(open_device, "IBVERBS_1.1", 1),
    VERBS_SYM(close_device, "IBVERBS_1.1", 1),    VERBS_SYM(query_device, "IBVERBS_1.1", 1),
    VERBS_SYM(query_port, "IBVERBS_1.1", 1),      VERBS_SYM(query_gid, "IBVERBS_1.1", 1),
    VERBS_SYM(alloc_pd, "IBVERBS_1.1", 1),        VERBS_SYM(dealloc_pd, "IBVERBS_1.1", 1),
    VERBS_SYM(reg_mr, "IBVERBS_1.1", 1),          VERBS_SYM(dereg_mr, "IBVERBS_1.1", 1),
    VERBS_SYM(create_cq, "IBVERBS_1.1", 1),       VERBS_SYM(destroy_cq, "IBVERBS_1.1", 1),
    VERBS_SYM(create_qp, "IBVERBS_1.1", 1),       VERBS_SYM(modify_qp, "IBVERBS_1.1", 1),
    VERBS_SYM(destroy_qp, "IBVERBS_1.1", 1),      VERBS_SYM(get_async_event, "IBVERBS_1.1", 1),
    VERBS_SYM(ack_async_event, "IBVERBS_1.1", 1), VERBS_SYM(wc_status_str, "IBVERBS_1.1", 1),
    VERBS_SYM(event_type_str, "IBVERBS_1.1", 1),  VERBS_SYM(reg_dmabuf_mr, "IBVERBS_1.12", 0),
};

/* Fill api_table from @p lib; 0, or -1 with load_why set. */
static int resolve_all(void *lib, const char *lib_name)
{
    for (size_t i = 0; i < sizeof(verbs_syms) / sizeof(verbs_syms[0]); i++) {
        const struct verbs_sym *sym = &verbs_syms[i];
        void *fn = dlvsym(lib, sym->name, sym->version);
        if (fn == NULL && sym->required) {
            snprintf(load_why, sizeof(load_why),
                     "%s has no %s@%s (rdma-core older than 2007, or not libibverbs)", lib_name,
                     sym->name, sym->version);
            return -1;
        }
        memcpy((char *)&api_table + sym->offset, &fn, sizeof(fn));
    }
    return 0;
}

static void load_locked(void)
{
    const char *lib_name = param_ib_verbs_lib();
    if (lib_name == NULL || lib_name[0] == '\0')
        lib_name = "libibverbs.so.1";
    void *lib = dlopen(lib_name, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *err = dlerror();
        snprintf(load_why, sizeof(load_why), "cannot load %s (%s): install rdma-core's libibverbs1",
                 lib_name, err != NULL ? err : "unknown error");
        return;
    }
    memset(&api_table, 0, sizeof(api_table));
    if (resolve_all(lib, lib_name) != 0) {
        dlclose(lib);
        return;
    }
    api_lib = lib;
    loaded_api = &api_table;
    CFX_INFO(CFX_LOG_NET, "verbs: loaded %s%s", lib_name,
             api_table.reg_dmabuf_mr != NULL ? " (with dma-buf registration)" : "");
}

#else /* !CFX_HAVE_VERBS */

static void load_locked(void)
{
    snprintf(load_why, sizeof(load_why),
             "this Conflux was built without the verbs headers (libibverbs-dev)");
}

#endif

const struct cfx_verbs_api *cfx_verbs_api(const char **why_p)
{
    pthread_mutex_lock(&load_lock);
    if (!load_done) {
        load_done = 1;
        load_locked();
        if (loaded_api == NULL)
            CFX_INFO(CFX_LOG_NET, "verbs: off: %s", load_why);
    }
    const struct cfx_verbs_api *api = loaded_api;
    pthread_mutex_unlock(&load_lock);
    if (api == NULL && why_p != NULL)
        *why_p = load_why;
    return api;
}

void cfx_verbs_api_reset(void)
{
    pthread_mutex_lock(&load_lock);
#if CFX_HAVE_VERBS
    if (api_lib != NULL)
        dlclose(api_lib);
    api_lib = NULL;
#endif
    loaded_api = NULL;
    load_done = 0;
    load_why[0] = '\0';
    pthread_mutex_unlock(&load_lock);
}

int cfx_verbs_peermem_loaded(void)
{
    static const char *const files[] = {
        "/sys/kernel/mm/memory_peers/nv_mem/version",    /* nv_peer_mem */
        "/sys/kernel/mm/memory_peers/nv_mem_nc/version", /* its non-contiguous variant */
        "/sys/module/nvidia_peermem/version",            /* nvidia-peermem (driver 465 and later) */
    };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
        if (access(files[i], F_OK) == 0)
            return 1;
    return 0;
}
