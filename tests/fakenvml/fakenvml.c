/*
 * fake-NVML: a libnvidia-ml.so.1 of Conflux's own, FOR TESTS ONLY. It
 * answers the NVML calls src/topo/detect_dev.c makes, and no others, from a
 * text file of answers (FAKENVML_ANSWERS names it; README.md beside this
 * file gives the format): which GPUs NVML knows by PCI bus id, and for each
 * of their NVLinks its state, whether it carries P2P, and the PCI bus id of
 * the device at its far end.
 *
 * The declarations below are NVML's, as nvml.h documents them (nvml.h
 * itself is not needed): the return codes and enums keep NVML's values, the
 * functions NVML's signatures under the ABI names nvml.h maps them to
 * (nvmlInit is nvmlInit_v2, nvmlDeviceGetHandleByPciBusId is ..._v2,
 * nvmlDeviceGetNvLinkRemotePciInfo is ..._v2). Only these are exported.
 *
 * Initialization is reference counted as NVML's is: every call but
 * nvmlInit_v2 and nvmlErrorString is NVML_ERROR_UNINITIALIZED until
 * nvmlInit_v2 succeeds and after the matching nvmlShutdown. One mutex
 * guards the state; the answers are read again at each first nvmlInit_v2.
 */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FN_EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------ nvml.h's subset */

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef enum nvmlEnableState_enum {
    NVML_FEATURE_DISABLED = 0,
    NVML_FEATURE_ENABLED = 1
} nvmlEnableState_t;

typedef enum nvmlNvLinkCapability_enum {
    NVML_NVLINK_CAP_P2P_SUPPORTED = 0,
    NVML_NVLINK_CAP_SYSMEM_ACCESS = 1,
    NVML_NVLINK_CAP_P2P_ATOMICS = 2,
    NVML_NVLINK_CAP_SYSMEM_ATOMICS = 3,
    NVML_NVLINK_CAP_SLI_BRIDGE = 4,
    NVML_NVLINK_CAP_VALID = 5,
    NVML_NVLINK_CAP_COUNT
} nvmlNvLinkCapability_t;

#define NVML_NVLINK_MAX_LINKS                 18
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE    32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT     "%04X:%02X:%02X.0"
#define NVML_DEVICE_PCI_BUS_ID_FMT            "%08X:%02X:%02X.0"

typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE]; /* "0000:18:00.0" */
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;                       /* Device id << 16 | vendor id. */
    unsigned int pciSubSystemId;                    /* Subsystem id << 16 | subsystem vendor id. */
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE]; /* "00000000:18:00.0" */
} nvmlPciInfo_t;

typedef struct nvmlDevice_st *nvmlDevice_t;

FN_EXPORT nvmlReturn_t nvmlInit_v2(void);
FN_EXPORT nvmlReturn_t nvmlShutdown(void);
FN_EXPORT const char *nvmlErrorString(nvmlReturn_t result);
FN_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device);
FN_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                                nvmlEnableState_t *isActive);
FN_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                           nvmlPciInfo_t *pci);
FN_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                                     nvmlNvLinkCapability_t capability,
                                                     unsigned int *capResult);

/* ------------------------------------------------------------ the answers */

#define FN_MAX_GPUS 64

struct fn_pci {
    unsigned domain, bus, dev, fn;
};

struct fn_link {
    int listed;
    int up;
    int p2p;
    int hidden; /* NVML does not show the peer: its bus id fields are empty. */
    struct fn_pci peer;
};

/* A device handle points at one of these. */
struct nvmlDevice_st {
    struct fn_pci pci;
    int n_links; /* Links listed. */
    struct fn_link links[NVML_NVLINK_MAX_LINKS];
};

static pthread_mutex_t fn_lock = PTHREAD_MUTEX_INITIALIZER;
static int fn_refs;
static int fn_n_gpus;
static struct nvmlDevice_st fn_gpus[FN_MAX_GPUS];

/* "dddd:bb:dd.f" or "dddddddd:bb:dd.f", either case; 0 on success. */
static int parse_busid(const char *text, struct fn_pci *pci)
{
    char tail;
    if (sscanf(text, "%x:%x:%x.%x%c", &pci->domain, &pci->bus, &pci->dev, &pci->fn, &tail) != 4)
        return -1;
    return pci->bus <= 0xff && pci->dev <= 0x1f && pci->fn <= 7 ? 0 : -1;
}

static int same_pci(const struct fn_pci *a, const struct fn_pci *b)
{
    return a->domain == b->domain && a->bus == b->bus && a->dev == b->dev && a->fn == b->fn;
}

static int bad_line(const char *path, int line, const char *why)
{
    fprintf(stderr, "fakenvml: %s:%d: %s\n", path, line, why);
    return -1;
}

/* One "link" line's fields after the keyword; 0 on success. */
static int parse_link(char *save, struct nvmlDevice_st *gpu, const char *path, int line)
{
    char *index = strtok_r(NULL, " \t", &save);
    char *state = strtok_r(NULL, " \t", &save);
    char *peer = strtok_r(NULL, " \t", &save);
    char *flag = strtok_r(NULL, " \t", &save);
    char *end = NULL;
    long l = index ? strtol(index, &end, 10) : -1;
    if (index == NULL || *end != '\0' || l < 0 || l >= NVML_NVLINK_MAX_LINKS)
        return bad_line(path, line, "a link index 0..17 expected");
    struct fn_link *link = &gpu->links[l];
    if (link->listed)
        return bad_line(path, line, "this link is already listed");
    if (state == NULL || (strcmp(state, "up") != 0 && strcmp(state, "down") != 0))
        return bad_line(path, line, "\"up\" or \"down\" expected after the link index");
    if (peer == NULL)
        return bad_line(path, line, "the peer's PCI bus id (or \"hidden\") expected");
    link->hidden = strcmp(peer, "hidden") == 0;
    if (!link->hidden && parse_busid(peer, &link->peer) != 0)
        return bad_line(path, line, "the peer is not a PCI bus id (dddd:bb:dd.f)");
    if (flag != NULL && strcmp(flag, "no-p2p") != 0)
        return bad_line(path, line, "only \"no-p2p\" may follow the peer");
    if (strtok_r(NULL, " \t", &save) != NULL)
        return bad_line(path, line, "too many fields");
    link->listed = 1;
    link->up = strcmp(state, "up") == 0;
    link->p2p = flag == NULL;
    gpu->n_links++;
    return 0;
}

/* Read the answers file into fn_gpus; 0, or -1 with a line on stderr. */
static int load_answers(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "fakenvml: cannot open FAKENVML_ANSWERS=%s: %s\n", path, strerror(errno));
        return -1;
    }
    memset(fn_gpus, 0, sizeof(fn_gpus));
    fn_n_gpus = 0;
    char text[256];
    int line = 0, res = 0;
    while (res == 0 && fgets(text, sizeof(text), f) != NULL) {
        line++;
        text[strcspn(text, "#\r\n")] = '\0';
        char *save = NULL;
        char *word = strtok_r(text, " \t", &save);
        if (word == NULL)
            continue;
        if (strcmp(word, "gpu") == 0) {
            char *busid = strtok_r(NULL, " \t", &save);
            struct fn_pci pci;
            if (busid == NULL || parse_busid(busid, &pci) != 0 || strtok_r(NULL, " \t", &save))
                res = bad_line(path, line, "\"gpu <PCI bus id>\" expected");
            else if (fn_n_gpus == FN_MAX_GPUS)
                res = bad_line(path, line, "more than 64 GPUs");
            for (int g = 0; res == 0 && g < fn_n_gpus; g++)
                if (same_pci(&fn_gpus[g].pci, &pci))
                    res = bad_line(path, line, "this GPU is already listed");
            if (res == 0)
                fn_gpus[fn_n_gpus++].pci = pci;
        } else if (strcmp(word, "link") == 0) {
            if (fn_n_gpus == 0)
                res = bad_line(path, line, "a \"link\" line before any \"gpu\" line");
            else
                res = parse_link(save, &fn_gpus[fn_n_gpus - 1], path, line);
        } else {
            res = bad_line(path, line, "a line starts with \"gpu\" or \"link\"");
        }
    }
    fclose(f);
    return res;
}

/* ------------------------------------------------------------ NVML */

nvmlReturn_t nvmlInit_v2(void)
{
    nvmlReturn_t res = NVML_SUCCESS;
    pthread_mutex_lock(&fn_lock);
    if (fn_refs == 0) {
        const char *path = getenv("FAKENVML_ANSWERS");
        if (path == NULL || path[0] == '\0')
            res = NVML_ERROR_DRIVER_NOT_LOADED; /* As on a host without the NVIDIA driver. */
        else if (load_answers(path) != 0)
            res = NVML_ERROR_UNKNOWN;
    }
    if (res == NVML_SUCCESS)
        fn_refs++;
    pthread_mutex_unlock(&fn_lock);
    return res;
}

nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t res = NVML_SUCCESS;
    pthread_mutex_lock(&fn_lock);
    if (fn_refs == 0)
        res = NVML_ERROR_UNINITIALIZED;
    else
        fn_refs--;
    pthread_mutex_unlock(&fn_lock);
    return res;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    struct fn_pci pci;
    nvmlReturn_t res = NVML_ERROR_NOT_FOUND;
    pthread_mutex_lock(&fn_lock);
    if (fn_refs == 0)
        res = NVML_ERROR_UNINITIALIZED;
    else if (pciBusId == NULL || device == NULL || parse_busid(pciBusId, &pci) != 0)
        res = NVML_ERROR_INVALID_ARGUMENT;
    for (int g = 0; res == NVML_ERROR_NOT_FOUND && g < fn_n_gpus; g++)
        if (same_pci(&fn_gpus[g].pci, &pci)) {
            *device = &fn_gpus[g];
            res = NVML_SUCCESS;
        }
    pthread_mutex_unlock(&fn_lock);
    return res;
}

/* The link @p link of @p device, or NULL with *res_p: NVML's answers for a
 * bad handle or index (INVALID_ARGUMENT), a GPU without NVLink
 * (NOT_SUPPORTED), a link it does not have (INVALID_ARGUMENT). Under fn_lock. */
static const struct fn_link *link_of(nvmlDevice_t device, unsigned int link, nvmlReturn_t *res_p)
{
    if (fn_refs == 0) {
        *res_p = NVML_ERROR_UNINITIALIZED;
        return NULL;
    }
    if (device == NULL || device < fn_gpus || device >= fn_gpus + fn_n_gpus ||
        link >= NVML_NVLINK_MAX_LINKS) {
        *res_p = NVML_ERROR_INVALID_ARGUMENT;
        return NULL;
    }
    if (device->n_links == 0) {
        *res_p = NVML_ERROR_NOT_SUPPORTED;
        return NULL;
    }
    if (!device->links[link].listed) {
        *res_p = NVML_ERROR_INVALID_ARGUMENT;
        return NULL;
    }
    *res_p = NVML_SUCCESS;
    return &device->links[link];
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                      nvmlEnableState_t *isActive)
{
    nvmlReturn_t res;
    pthread_mutex_lock(&fn_lock);
    const struct fn_link *l = link_of(device, link, &res);
    if (l != NULL && isActive == NULL)
        res = NVML_ERROR_INVALID_ARGUMENT;
    else if (l != NULL)
        *isActive = l->up ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    pthread_mutex_unlock(&fn_lock);
    return res;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                 nvmlPciInfo_t *pci)
{
    nvmlReturn_t res;
    pthread_mutex_lock(&fn_lock);
    const struct fn_link *l = link_of(device, link, &res);
    if (l != NULL && pci == NULL) {
        res = NVML_ERROR_INVALID_ARGUMENT;
    } else if (l != NULL) {
        memset(pci, 0, sizeof(*pci));
        if (!l->hidden) {
            pci->domain = l->peer.domain;
            pci->bus = l->peer.bus;
            pci->device = l->peer.dev;
            snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT,
                     l->peer.domain & 0xffff, l->peer.bus, l->peer.dev);
            snprintf(pci->busId, sizeof(pci->busId), NVML_DEVICE_PCI_BUS_ID_FMT, l->peer.domain,
                     l->peer.bus, l->peer.dev);
        }
    }
    pthread_mutex_unlock(&fn_lock);
    return res;
}

nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                           nvmlNvLinkCapability_t capability,
                                           unsigned int *capResult)
{
    nvmlReturn_t res;
    pthread_mutex_lock(&fn_lock);
    const struct fn_link *l = link_of(device, link, &res);
    if (l != NULL && (capResult == NULL || (unsigned)capability >= NVML_NVLINK_CAP_COUNT))
        res = NVML_ERROR_INVALID_ARGUMENT;
    else if (l != NULL)
        /* P2P as listed; SLI only on bridges, which the answers do not describe. */
        *capResult = capability == NVML_NVLINK_CAP_P2P_SUPPORTED ? (unsigned)l->p2p
                     : capability == NVML_NVLINK_CAP_SLI_BRIDGE  ? 0u
                                                                 : 1u;
    pthread_mutex_unlock(&fn_lock);
    return res;
}
