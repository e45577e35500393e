/*
 * Topology: NCCL XML files load (the fixtures of tests/topo, written from
 * public spec sheets in the shape of real NCCL dumps), paths are classified
 * as NCCL names them, files round-trip through the writer, malformed files
 * fail with the line, and detection on this machine describes it.
 */
#include <criterion/criterion.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cfx_build_config.h"
#include "src/topo/topo.h"
#include "src/util/error.h"
#include "tests/harness.h"
#include "tests/topo_check.h"

static const char *fixture(const char *name)
{
    static char path[1024];
    char src[1024];
    snprintf(src, sizeof(src), "%s", __FILE__);
    snprintf(path, sizeof(path), "%s/topo/%s", dirname(src), name);
    return path;
}

static struct cfx_topo_system *load(const char *name)
{
    struct cfx_topo_system *sys = NULL;
    cfxResult_t res = cfx_topo_load_xml(fixture(name), &sys);
    cr_assert_eq(res, cfxSuccess, "%s: %s", name, cfx_error_thread_last());
    return sys;
}

static struct cfx_topo_system *load_text(const char *text, cfxResult_t expect)
{
    struct cfx_topo_system *sys = NULL;
    cfxResult_t res = cfx_topo_load_xml_buffer(text, strlen(text), "inline.xml", &sys);
    cr_assert_eq(res, expect, "result %d, expected %d: %s", res, expect, cfx_error_thread_last());
    return sys;
}

static enum cfx_topo_path_type path_type(const struct cfx_topo_system *sys,
                                         enum cfx_topo_node_type ta, int a,
                                         enum cfx_topo_node_type tb, int b)
{
    return cfx_topo_path(sys, cfx_topo_nth(sys, ta, a), cfx_topo_nth(sys, tb, b))->type;
}

/* ------------------------------------------------------------ fixtures */

struct expected {
    const char *file;
    int cpus, gpus, nvs, nets;
    double gpu_nvlink_gbs; /* Each GPU's NVLink bandwidth (0: none). */
};

static const struct expected fixtures[] = {
    {"dgx-a100.xml", 2, 8, 1, 8, 300.0},       {"dgx-h100.xml", 2, 8, 1, 8, 450.0},
    {"pcie-4gpu.xml", 2, 4, 0, 1, 0},          {"cpu-2socket.xml", 2, 0, 0, 1, 0},
    {"vm-h100-socket.xml", 1, 8, 1, 1, 450.0}, {"partial-4gpu.xml", 2, 4, 0, 4, 0},
};
#define N_FIXTURES (sizeof(fixtures) / sizeof(fixtures[0]))

Test(topo, every_fixture_loads_with_its_devices)
{
    for (size_t f = 0; f < N_FIXTURES; f++) {
        const struct expected *e = &fixtures[f];
        struct cfx_topo_system *sys = load(e->file);
        cr_expect_eq(sys->count[CFX_TOPO_CPU], e->cpus, "%s CPUs", e->file);
        cr_expect_eq(sys->count[CFX_TOPO_GPU], e->gpus, "%s GPUs", e->file);
        cr_expect_eq(sys->count[CFX_TOPO_NVS], e->nvs, "%s NVSwitch", e->file);
        cr_expect_eq(sys->count[CFX_TOPO_NET], e->nets, "%s NETs", e->file);
        for (int g = 0; g < e->gpus; g++) {
            const struct cfx_topo_node *gpu = &sys->nodes[cfx_topo_nth(sys, CFX_TOPO_GPU, g)];
            double nvl = 0;
            for (int l = 0; l < gpu->n_links; l++)
                if (gpu->links[l].type == CFX_LINK_NVL)
                    nvl += gpu->links[l].bw;
            cr_expect_float_eq(nvl, e->gpu_nvlink_gbs, 1e-6, "%s GPU %d NVLink %.1f GB/s", e->file,
                               g, nvl);
            cr_expect_neq(cfx_topo_find_gpu(sys, gpu->gpu.dev), -1);
        }
        /* Every device reaches the first CPU (the NVSwitch only carries GPU traffic). */
        for (int n = 0; n < sys->n_nodes; n++)
            if (sys->nodes[n].type != CFX_TOPO_NVS)
                cr_expect_neq(cfx_topo_path(sys, n, 0)->type, CFX_PATH_DIS, "%s node %d", e->file,
                              n);
        cfx_topo_free(sys);
    }
}

Test(topo, h100_fixture_paths_follow_the_pcie_switch_pairs)
{
    struct cfx_topo_system *sys = load("dgx-h100.xml");
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_GPU, 7), CFX_PATH_NVL);
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_NET, 0), CFX_PATH_PIX);
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_NET, 1), CFX_PATH_PXB);
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_NET, 2), CFX_PATH_PHB);
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_NET, 4), CFX_PATH_SYS);
    cr_expect_eq(path_type(sys, CFX_TOPO_NET, 3, CFX_TOPO_GPU, 3), CFX_PATH_PIX);
    const struct cfx_topo_path *p =
        cfx_topo_path(sys, cfx_topo_nth(sys, CFX_TOPO_GPU, 0), cfx_topo_nth(sys, CFX_TOPO_NET, 0));
    cr_expect_float_eq(p->bw, 50.0, 1e-6, "400 Gb/s NIC: %.2f GB/s", p->bw);
    cr_expect_eq(p->hops, 3, "GPU -> switch -> NIC -> port: %d hops", p->hops);
    cfx_topo_free(sys);
}

Test(topo, a100_fixture_nics_are_two_switches_from_their_gpus)
{
    struct cfx_topo_system *sys = load("dgx-a100.xml");
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_GPU, 1), CFX_PATH_NVL);
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_NET, 0), CFX_PATH_PXB);
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_NET, 1), CFX_PATH_PXB);
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_NET, 7), CFX_PATH_SYS);
    cfx_topo_free(sys);
}

Test(topo, pcie_box_paths_are_pix_inside_a_switch_and_sys_across_sockets)
{
    struct cfx_topo_system *sys = load("pcie-4gpu.xml");
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_GPU, 1), CFX_PATH_PIX);
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_GPU, 2), CFX_PATH_SYS);
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 3, CFX_TOPO_NET, 0), CFX_PATH_SYS);
    const struct cfx_topo_path *p =
        cfx_topo_path(sys, cfx_topo_nth(sys, CFX_TOPO_GPU, 0), cfx_topo_nth(sys, CFX_TOPO_GPU, 1));
    cr_expect_float_eq(p->bw, 1.969 * 16, 1e-6, "Gen4 x16: %.3f GB/s", p->bw);
    cfx_topo_free(sys);
}

Test(topo, nvlinks_between_gpus_and_through_a_gpu_are_nvl_and_nvb)
{
    /* A chain of three GPUs: 0 - 1 - 2 over NVLink, all on one PCI switch. */
    const char *text =
        "<system version=\"1\"><cpu numaid=\"0\">\n"
        "<pci busid=\"0000:10:00.0\" class=\"0x060400\" link_speed=\"16.0 GT/s PCIe\" "
        "link_width=\"16\">\n"
        "<pci busid=\"0000:11:00.0\"><gpu dev=\"0\" sm=\"70\">"
        "<nvlink target=\"0000:12:00.0\" count=\"2\" tclass=\"0x030200\"/></gpu></pci>\n"
        "<pci busid=\"0000:12:00.0\"><gpu dev=\"1\" sm=\"70\">"
        "<nvlink target=\"0000:11:00.0\" count=\"2\" tclass=\"0x030200\"/>"
        "<nvlink target=\"0000:13:00.0\" count=\"2\" tclass=\"0x030200\"/></gpu></pci>\n"
        "<pci busid=\"0000:13:00.0\"><gpu dev=\"2\" sm=\"70\">"
        "<nvlink target=\"0000:12:00.0\" count=\"2\" tclass=\"0x030200\"/></gpu></pci>\n"
        "</pci></cpu></system>\n";
    struct cfx_topo_system *sys = load_text(text, cfxSuccess);
    cr_expect_eq(sys->count[CFX_TOPO_NVS], 0);
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_GPU, 1), CFX_PATH_NVL);
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_GPU, 2), CFX_PATH_NVB);
    const struct cfx_topo_path *p =
        cfx_topo_path(sys, cfx_topo_nth(sys, CFX_TOPO_GPU, 0), cfx_topo_nth(sys, CFX_TOPO_GPU, 2));
    cr_expect_float_eq(p->bw, 50.0, 1e-6, "two V100 NVLinks: %.1f GB/s", p->bw);
    cfx_topo_free(sys);
}

Test(topo, real_dump_features_load_unknown_parts_ignored)
{
    /* VM-style dump: numaid -1, NVSwitch hidden behind fffffff:ff:ff.0,
     * <c2c> and mlopart= (newer NCCL), a socket NIC straight under <cpu>. */
    struct cfx_topo_system *sys = load("vm-h100-socket.xml");
    cr_expect_eq(sys->nodes[cfx_topo_nth(sys, CFX_TOPO_CPU, 0)].cpu.numa_id, 0);
    const struct cfx_topo_node *net = &sys->nodes[cfx_topo_nth(sys, CFX_TOPO_NET, 0)];
    cr_expect_str_eq(net->net.name, "eth0");
    cr_expect_eq(net->net.speed_mbps, 10000);
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_GPU, 5), CFX_PATH_NVL);
    cfx_topo_free(sys);
}

Test(topo, partial_files_describe_devices_by_pci_class)
{
    struct cfx_topo_system *sys = load("partial-4gpu.xml");
    for (int g = 0; g < 4; g++)
        cr_expect_neq(cfx_topo_find_gpu(sys, g), -1, "GPU %d numbered in file order", g);
    /* The first bridge says 2.5 GT/s x1 (a VM's virtual bridge): its
     * children's 16 GT/s x16 is used instead. */
    const struct cfx_topo_path *p =
        cfx_topo_path(sys, cfx_topo_nth(sys, CFX_TOPO_GPU, 0), cfx_topo_nth(sys, CFX_TOPO_GPU, 1));
    cr_expect_float_eq(p->bw, 1.969 * 16, 1e-6, "%.3f GB/s", p->bw);
    cr_expect_eq(path_type(sys, CFX_TOPO_GPU, 0, CFX_TOPO_NET, 0), CFX_PATH_PIX);
    cfx_topo_free(sys);
}

/* ------------------------------------------------------------ round trip */

Test(topo, every_fixture_round_trips_through_the_writer)
{
    for (size_t f = 0; f < N_FIXTURES; f++) {
        struct cfx_topo_system *first = load(fixtures[f].file);
        char *text1 = topo_dump_to_text(first);
        struct cfx_topo_system *second = load_text(text1, cfxSuccess);
        topo_assert_same_system(first, second, fixtures[f].file);
        char *text2 = topo_dump_to_text(second);
        cr_expect_str_eq(text1, text2, "%s: a second dump differs", fixtures[f].file);
        free(text1);
        free(text2);
        cfx_topo_free(first);
        cfx_topo_free(second);
    }
}

/* <pci> nestings a fuzzer or a hand-edited file produces: what the first load
 * makes of each, and a dump of it that reads back as the same text. */
struct odd_pci {
    const char *what;
    const char *body; /* Inside <cpu numaid="0">. */
    int n_pci, n_gpu, n_nic;
};

static const struct odd_pci odd_pcis[] = {
    {"an empty bridge is a switch", "<pci busid=\"0000:10:00.0\" class=\"0x060400\"/>", 1, 0, 0},
    {"a classless <pci> holding only an unknown device is skipped",
     "<pci busid=\"0000:10:00.0\"><pci busid=\"0000:11:00.0\" class=\"0x010802\"/></pci>", 0, 0, 0},
    {"a display-class <pci> holding only an unknown device is a GPU",
     "<pci busid=\"0000:20:00.0\" class=\"0x030000\">"
     "<pci busid=\"0000:21:00.0\" class=\"0x010802\"/></pci>",
     0, 1, 0},
    {"a display-class <pci> holding an empty bridge is a switch",
     "<pci busid=\"0000:20:00.0\" class=\"0x030000\">"
     "<pci busid=\"0000:21:00.0\" class=\"0x060400\"/></pci>",
     2, 0, 0},
    {"a network-class <pci> holding a GPU by class is a switch",
     "<pci busid=\"0000:30:00.0\" class=\"0x020000\">"
     "<pci busid=\"0000:31:00.0\" class=\"0x030200\"/></pci>",
     1, 1, 0},
    {"a switch of unknown class holding a NIC keeps both",
     "<pci busid=\"0000:40:00.0\" class=\"0x0b4000\">"
     "<pci busid=\"0000:41:00.0\" class=\"0x020000\"/>"
     "<pci busid=\"0000:42:00.0\" class=\"0x010802\"/></pci>",
     1, 0, 1},
};

Test(topo, odd_pci_nestings_load_once_and_dump_stably)
{
    for (size_t i = 0; i < sizeof(odd_pcis) / sizeof(odd_pcis[0]); i++) {
        const struct odd_pci *c = &odd_pcis[i];
        char text[1024];
        snprintf(text, sizeof(text), "<system version=\"1\"><cpu numaid=\"0\">%s</cpu></system>",
                 c->body);
        struct cfx_topo_system *first = load_text(text, cfxSuccess);
        cr_expect_eq(first->count[CFX_TOPO_PCI], c->n_pci, "%s: switches", c->what);
        cr_expect_eq(first->count[CFX_TOPO_GPU], c->n_gpu, "%s: GPUs", c->what);
        cr_expect_eq(first->count[CFX_TOPO_NIC], c->n_nic, "%s: NICs", c->what);
        char *text1 = topo_dump_to_text(first);
        struct cfx_topo_system *second = load_text(text1, cfxSuccess);
        for (int t = 0; t < CFX_TOPO_NODE_TYPES; t++)
            cr_expect_eq(second->count[t], first->count[t], "%s: type %d after a reload\n%s",
                         c->what, t, text1);
        char *text2 = topo_dump_to_text(second);
        cr_expect_str_eq(text1, text2, "%s: a second dump differs", c->what);
        free(text1);
        free(text2);
        cfx_topo_free(first);
        cfx_topo_free(second);
    }
}

Test(topo, topo_file_replaces_detection_and_dump_file_receives_it)
{
    char dump[64];
    snprintf(dump, sizeof(dump), "/tmp/cfx-topo-dump-%d.xml", (int)getpid());
    cfx_test_setenv("CFX_TOPO_FILE", fixture("dgx-h100.xml"));
    cfx_test_setenv("CFX_TOPO_DUMP_FILE", dump);
    struct cfx_topo_system *sys = NULL;
    cr_assert_eq(cfx_topo_detect(&sys), cfxSuccess, "%s", cfx_error_thread_last());
    cr_expect_eq(sys->count[CFX_TOPO_GPU], 8);
    struct cfx_topo_system *again = NULL;
    cr_assert_eq(cfx_topo_load_xml(dump, &again), cfxSuccess, "%s", cfx_error_thread_last());
    topo_assert_same_system(sys, again, "CFX_TOPO_DUMP_FILE");
    unlink(dump);
    cfx_topo_free(sys);
    cfx_topo_free(again);
}

/* ------------------------------------------------------------ malformed */

static void expect_error_mentions(const char *text, const char *first, const char *second)
{
    load_text(text, cfxInvalidArgument);
    const char *msg = cfx_error_thread_last();
    cr_expect(strstr(msg, first) != NULL, "'%s' not in: %s", first, msg);
    if (second)
        cr_expect(strstr(msg, second) != NULL, "'%s' not in: %s", second, msg);
}

Test(topo, a_file_that_is_not_well_formed_names_the_line)
{
    expect_error_mentions("<system version=\"1\">\n"
                          "  <cpu numaid=\"0\">\n"
                          "    <pci busid=\"0000:01:00.0\">\n"
                          "  </cpu>\n"
                          "</system>\n",
                          "inline.xml:4:", "not a valid topology file");
}

Test(topo, a_malformed_attribute_names_the_line_and_the_attribute)
{
    expect_error_mentions("<system version=\"1\">\n"
                          "  <cpu numaid=\"0\">\n"
                          "    <pci busid=\"0000:01:00.0\">\n"
                          "      <gpu dev=\"one\" sm=\"80\"/>\n"
                          "    </pci>\n"
                          "  </cpu>\n"
                          "</system>\n",
                          "inline.xml:4:", "dev=\"one\"");
    expect_error_mentions("<system>\n<cpu>\n<pci class=\"0x030200\">\n<gpu dev=\"0\"/></pci>\n"
                          "</cpu></system>\n",
                          "inline.xml:3:", "no busid");
    expect_error_mentions("<system>\n<cpu>\n<pci busid=\"zz:00.0\"><gpu dev=\"0\"/></pci>\n"
                          "</cpu></system>\n",
                          "inline.xml:3:", "busid");
    expect_error_mentions("<system>\n<cpu>\n<pci busid=\"0000:01:00.0\"><gpu dev=\"0\">\n"
                          "<nvlink count=\"2\"/></gpu></pci>\n</cpu></system>\n",
                          "inline.xml:4:", "no target");
}

Test(topo, inconsistent_files_are_refused_with_a_sentence)
{
    expect_error_mentions("<topology/>\n", "inline.xml:1:", "<system>");
    expect_error_mentions("<system version=\"1\"></system>\n", "no <cpu>", NULL);
    expect_error_mentions("<system><cpu>\n"
                          "<pci busid=\"0000:01:00.0\"><gpu dev=\"0\"/></pci>\n"
                          "<pci busid=\"0000:01:00.0\"><gpu dev=\"1\"/></pci>\n"
                          "</cpu></system>\n",
                          "0000:01:00.0", "twice");
    expect_error_mentions("<system><cpu>\n"
                          "<pci busid=\"0000:01:00.0\"><gpu dev=\"3\"/></pci>\n"
                          "<pci busid=\"0000:02:00.0\"><gpu dev=\"3\"/></pci>\n"
                          "</cpu></system>\n",
                          "device number 3", NULL);
    /* An NVLink target longer than a bus id (the fuzzer's: it once loaded,
     * cut short, and its dump did not load back). */
    expect_error_mentions("<system><cpu>\n"
                          "<pci busid=\"0000:01:00.0\"><gpu dev=\"0\">"
                          "<nvlink target=\"..................................2..0000:d2:00.0\" "
                          "count=\"4\" tclass=\"0x068000\"/></gpu></pci>\n"
                          "</cpu></system>\n",
                          "target", "not a PCI bus id");
}

Test(topo, a_missing_file_fails_with_the_system_error)
{
    struct cfx_topo_system *sys = NULL;
    cr_expect_eq(cfx_topo_load_xml("/nonexistent/topo.xml", &sys), cfxSystemError);
    cr_expect_null(sys);
    cr_expect(strstr(cfx_error_thread_last(), "/nonexistent/topo.xml") != NULL);
}

/* ------------------------------------------------------------ detection */

Test(topo, detection_describes_this_host_and_says_why_there_is_no_gpu)
{
    char log_path[64];
    snprintf(log_path, sizeof(log_path), "/tmp/cfx-topo-log-%d", (int)getpid());
    cfx_test_setenv("CFX_TOPO_FILE", NULL);
    cfx_test_setenv("CFX_DEBUG", "INFO");
    cfx_test_setenv("CFX_DEBUG_SUBSYS", "GRAPH");
    cfx_test_setenv("CFX_DEBUG_FILE", log_path);
    struct cfx_topo_system *sys = NULL;
    cr_assert_eq(cfx_topo_detect(&sys), cfxSuccess, "%s", cfx_error_thread_last());
    cr_expect_geq(sys->count[CFX_TOPO_CPU], 1);
    cr_expect_str_eq(sys->source, "detected");
    FILE *f = fopen(log_path, "r");
    cr_assert_not_null(f);
    char text[16384] = "";
    size_t got = fread(text, 1, sizeof(text) - 1, f);
    text[got] = '\0';
    fclose(f);
    unlink(log_path);
    cr_expect(strstr(text, "topology (detected)") != NULL, "log: %s", text);
    if (sys->count[CFX_TOPO_GPU] == 0) {
        cr_expect(strstr(text, "no GPU (") != NULL, "log: %s", text);
        cr_expect(strstr(text, "CPU/NUMA only") != NULL, "log: %s", text);
    } else {
        cr_log_info("detection found %d GPUs", sys->count[CFX_TOPO_GPU]);
    }
    /* What detection found round-trips like any file. */
    char *dumped = topo_dump_to_text(sys);
    struct cfx_topo_system *again = load_text(dumped, cfxSuccess);
    topo_assert_same_system(sys, again, "detected");
    free(dumped);
    cfx_topo_free(again);
    cfx_topo_free(sys);
}
