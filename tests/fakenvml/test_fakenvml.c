/*
 * fake-NVML's own tests: it exports exactly the NVML functions Conflux
 * resolves, unversioned, under NVML's SONAME; it answers the DGX-H100
 * answers file as NVML would (bus ids in NVML's two forms, link states,
 * P2P); and it fails as NVML does (uninitialized, unknown device, a link the
 * GPU does not have, a GPU without NVLink). Each test loads the library by
 * path (FAKENVML_LIB, set by ctest) in its own process.
 */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* NVML's values and layout, as nvml.h has them. */
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_UNKNOWN = 999
};
struct pci_info {
    char bus_id_legacy[16];
    unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
    char bus_id[32];
};
typedef struct nvml_device *nvml_device_t;

struct nvml {
    int (*init)(void);
    int (*shutdown)(void);
    const char *(*error_string)(int);
    int (*by_busid)(const char *, nvml_device_t *);
    int (*link_state)(nvml_device_t, unsigned int, int *);
    int (*remote_pci)(nvml_device_t, unsigned int, struct pci_info *);
    int (*link_cap)(nvml_device_t, unsigned int, int, unsigned int *);
};

static const char *lib_path(void)
{
    const char *path = getenv("FAKENVML_LIB");
    cr_assert_not_null(path, "ctest sets FAKENVML_LIB to the library's path");
    return path;
}

static struct nvml open_nvml(void)
{
    void *lib = dlopen(lib_path(), RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(lib, "dlopen: %s", dlerror());
    struct nvml api;
    *(void **)&api.init = dlsym(lib, "nvmlInit_v2");
    *(void **)&api.shutdown = dlsym(lib, "nvmlShutdown");
    *(void **)&api.error_string = dlsym(lib, "nvmlErrorString");
    *(void **)&api.by_busid = dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    *(void **)&api.link_state = dlsym(lib, "nvmlDeviceGetNvLinkState");
    *(void **)&api.remote_pci = dlsym(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    *(void **)&api.link_cap = dlsym(lib, "nvmlDeviceGetNvLinkCapability");
    cr_assert(api.init && api.shutdown && api.error_string && api.by_busid && api.link_state &&
              api.remote_pci && api.link_cap);
    return api;
}

static void use_answers(const char *name)
{
    char path[1024];
    const char *dir = getenv("FAKENVML_DIR");
    cr_assert_not_null(dir, "ctest sets FAKENVML_DIR to tests/fakenvml");
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    setenv("FAKENVML_ANSWERS", path, 1);
}

/* Write @p text to a file of its own and point FAKENVML_ANSWERS at it. */
static void use_answers_text(const char *text, char *path, size_t size)
{
    snprintf(path, size, "/tmp/fakenvml-test-%d.answers", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    setenv("FAKENVML_ANSWERS", path, 1);
}

/* ------------------------------------------------------------ exports */

static const char *const conflux_names[] = {
#define FAKENVML_SYM(name) #name,
#include "fakenvml_syms.h"
#undef FAKENVML_SYM
};
#define N_CONFLUX_NAMES (sizeof(conflux_names) / sizeof(conflux_names[0]))

static const Elf64_Shdr *elf_section(const unsigned char *bytes, Elf64_Word type)
{
    const Elf64_Ehdr *header = (const Elf64_Ehdr *)bytes;
    const Elf64_Shdr *sections = (const Elf64_Shdr *)(bytes + header->e_shoff);
    for (unsigned i = 0; i < header->e_shnum; i++)
        if (sections[i].sh_type == type)
            return &sections[i];
    return NULL;
}

Test(fakenvml, the_library_exports_exactly_the_functions_conflux_resolves)
{
    cr_assert_geq(N_CONFLUX_NAMES, 5, "the list from src/topo/detect_dev.c");
    int fd = open(lib_path(), O_RDONLY);
    cr_assert_geq(fd, 0);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    const unsigned char *bytes = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    cr_assert_neq(bytes, MAP_FAILED);
    cr_assert_eq(memcmp(bytes, ELFMAG, SELFMAG), 0);
    cr_assert_eq(bytes[EI_CLASS], ELFCLASS64);
    const Elf64_Shdr *sections = (const Elf64_Shdr *)(bytes + ((const Elf64_Ehdr *)bytes)->e_shoff);
    cr_assert_null(elf_section(bytes, SHT_GNU_verdef), "NVML's names are unversioned");
    const Elf64_Shdr *dynsym = elf_section(bytes, SHT_DYNSYM);
    cr_assert_not_null(dynsym);
    const char *dynstr = (const char *)bytes + sections[dynsym->sh_link].sh_offset;
    const Elf64_Sym *syms = (const Elf64_Sym *)(bytes + dynsym->sh_offset);
    unsigned char seen[N_CONFLUX_NAMES] = {0};
    for (size_t i = 0; i < dynsym->sh_size / sizeof(Elf64_Sym); i++) {
        int bind = ELF64_ST_BIND(syms[i].st_info);
        if (syms[i].st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK))
            continue;
        const char *name = dynstr + syms[i].st_name;
        size_t k = 0;
        while (k < N_CONFLUX_NAMES && strcmp(conflux_names[k], name) != 0)
            k++;
        cr_assert_lt(k, N_CONFLUX_NAMES, "exports %s, which Conflux does not resolve", name);
        seen[k] = 1;
    }
    for (size_t k = 0; k < N_CONFLUX_NAMES; k++)
        cr_assert(seen[k], "%s is not exported", conflux_names[k]);
    const Elf64_Shdr *dynamic = elf_section(bytes, SHT_DYNAMIC);
    cr_assert_not_null(dynamic);
    const char *dynamic_str = (const char *)bytes + sections[dynamic->sh_link].sh_offset;
    const char *soname = NULL;
    for (const Elf64_Dyn *d = (const Elf64_Dyn *)(bytes + dynamic->sh_offset); d->d_tag != DT_NULL;
         d++)
        if (d->d_tag == DT_SONAME)
            soname = dynamic_str + d->d_un.d_val;
    cr_assert_str_eq(soname ? soname : "(none)", "libnvidia-ml.so.1");
    munmap((void *)bytes, (size_t)st.st_size);
}

/* ------------------------------------------------------------ answers */

Test(fakenvml, without_answers_init_is_driver_not_loaded_and_calls_uninitialized)
{
    unsetenv("FAKENVML_ANSWERS");
    struct nvml api = open_nvml();
    cr_expect_eq(api.init(), NVML_ERROR_DRIVER_NOT_LOADED);
    cr_expect_str_eq(api.error_string(NVML_ERROR_DRIVER_NOT_LOADED), "Driver Not Loaded");
    nvml_device_t dev;
    cr_expect_eq(api.by_busid("0000:10:00.0", &dev), NVML_ERROR_UNINITIALIZED);
    cr_expect_eq(api.shutdown(), NVML_ERROR_UNINITIALIZED);
}

Test(fakenvml, dgx_h100_gpus_have_18_links_up_to_four_nvswitches)
{
    use_answers("dgx-h100.answers");
    struct nvml api = open_nvml();
    cr_assert_eq(api.init(), NVML_SUCCESS);
    for (int g = 0; g < 8; g++) {
        char busid[32];
        nvml_device_t dev, again;
        snprintf(busid, sizeof(busid), "0000:%02x:00.0", 0x10 + g);
        cr_assert_eq(api.by_busid(busid, &dev), NVML_SUCCESS, "%s", busid);
        /* NVML's own form: 8-digit domain, upper case. */
        snprintf(busid, sizeof(busid), "00000000:%02X:00.0", 0x10 + g);
        cr_assert_eq(api.by_busid(busid, &again), NVML_SUCCESS, "%s", busid);
        cr_expect_eq(dev, again);
        int per_switch[4] = {0};
        for (unsigned l = 0; l < 18; l++) {
            int state = -1;
            unsigned int p2p = 7;
            struct pci_info pci;
            cr_assert_eq(api.link_state(dev, l, &state), NVML_SUCCESS);
            cr_expect_eq(state, 1, "GPU %d link %u up", g, l);
            cr_assert_eq(api.link_cap(dev, l, 0, &p2p), NVML_SUCCESS);
            cr_expect_eq(p2p, 1u);
            cr_assert_eq(api.remote_pci(dev, l, &pci), NVML_SUCCESS);
            cr_assert(pci.bus >= 0xd0 && pci.bus <= 0xd3, "bus %x", pci.bus);
            char legacy[16], full[32];
            snprintf(legacy, sizeof(legacy), "0000:%02X:00.0", pci.bus);
            snprintf(full, sizeof(full), "00000000:%02X:00.0", pci.bus);
            cr_expect_str_eq(pci.bus_id_legacy, legacy);
            cr_expect_str_eq(pci.bus_id, full);
            per_switch[pci.bus - 0xd0]++;
        }
        cr_expect(per_switch[0] == 5 && per_switch[1] == 4 && per_switch[2] == 4 &&
                      per_switch[3] == 5,
                  "GPU %d: %d+%d+%d+%d links", g, per_switch[0], per_switch[1], per_switch[2],
                  per_switch[3]);
        int state;
        cr_expect_eq(api.link_state(dev, 18, &state), NVML_ERROR_INVALID_ARGUMENT);
    }
    nvml_device_t dev;
    cr_expect_eq(api.by_busid("0000:18:00.0", &dev), NVML_ERROR_NOT_FOUND);
    cr_expect_eq(api.by_busid("not a bus id", &dev), NVML_ERROR_INVALID_ARGUMENT);
    cr_expect_eq(api.shutdown(), NVML_SUCCESS);
    cr_expect_eq(api.by_busid("0000:10:00.0", &dev), NVML_ERROR_UNINITIALIZED);
}

Test(fakenvml, links_down_not_p2p_hidden_unlisted_and_gpus_without_nvlink)
{
    char path[64];
    use_answers_text("gpu 0000:10:00.0\n"
                     "link 0 up 0000:11:00.0\n"
                     "link 1 down 0000:11:00.0\n"
                     "link 2 up 0000:11:00.0 no-p2p\n"
                     "link 3 up hidden  # a VM's NVSwitch\n"
                     "gpu 0000:11:00.0\n"
                     "link 0 up 0000:10:00.0\n"
                     "gpu 0000:12:00.0\n",
                     path, sizeof(path));
    struct nvml api = open_nvml();
    cr_assert_eq(api.init(), NVML_SUCCESS);
    cr_assert_eq(api.init(), NVML_SUCCESS, "initialization is reference counted");
    nvml_device_t dev, lone;
    cr_assert_eq(api.by_busid("0000:10:00.0", &dev), NVML_SUCCESS);
    int state;
    unsigned int p2p;
    struct pci_info pci;
    cr_expect_eq(api.link_state(dev, 1, &state), NVML_SUCCESS);
    cr_expect_eq(state, 0, "down");
    cr_expect_eq(api.link_cap(dev, 2, 0, &p2p), NVML_SUCCESS);
    cr_expect_eq(p2p, 0u, "no-p2p");
    cr_expect_eq(api.link_cap(dev, 2, 99, &p2p), NVML_ERROR_INVALID_ARGUMENT);
    cr_expect_eq(api.remote_pci(dev, 3, &pci), NVML_SUCCESS);
    cr_expect_str_eq(pci.bus_id_legacy, "", "a hidden peer has no bus id");
    cr_expect_str_eq(pci.bus_id, "");
    cr_expect_eq(api.link_state(dev, 4, &state), NVML_ERROR_INVALID_ARGUMENT, "not listed");
    cr_assert_eq(api.by_busid("0000:12:00.0", &lone), NVML_SUCCESS);
    cr_expect_eq(api.link_state(lone, 0, &state), NVML_ERROR_NOT_SUPPORTED, "no NVLink");
    cr_expect_eq(api.shutdown(), NVML_SUCCESS);
    cr_expect_eq(api.link_state(dev, 0, &state), NVML_SUCCESS, "one reference left");
    cr_expect_eq(api.shutdown(), NVML_SUCCESS);
    cr_expect_eq(api.link_state(dev, 0, &state), NVML_ERROR_UNINITIALIZED);
    unlink(path);
}

Test(fakenvml, a_malformed_answers_file_fails_init_with_its_line, .init = cr_redirect_stderr)
{
    char path[64];
    use_answers_text("gpu 0000:10:00.0\nlink 0 sideways 0000:d0:00.0\n", path, sizeof(path));
    struct nvml api = open_nvml();
    cr_expect_eq(api.init(), NVML_ERROR_UNKNOWN);
    fflush(stderr);
    char expected[128];
    snprintf(expected, sizeof(expected),
             "fakenvml: %s:2: \"up\" or \"down\" expected after the link index\n", path);
    cr_expect_stderr_eq_str(expected);
    unlink(path);
}
