/*
 * GPU detection over recorded answers: the fake CUDA driver (tests/fakecuda,
 * FAKECUDA_DEVICES=8, bus ids 0000:10:00.0 .. 0000:17:00.0, sm90, 132 SMs)
 * and the fake NVML (tests/fakenvml) answering tests/fakenvml/dgx-h100.answers
 * (18 NVLinks a GPU to four NVSwitches, 5+4+4+5), both through the run-time
 * loading seams (CFX_CUDA_DRIVER_LIB, CFX_NVML_LIB). Detection finds the
 * GPUs and NVSwitch fabric; the dump is NCCL's XML and loads back the same;
 * the planner's rings and trees run on NVLink. Without the libraries,
 * detection says why and the graph is what it is without them. Each test
 * runs in a process of its own (CUDA loads once per process).
 */
#include <criterion/criterion.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cfx_build_config.h"
#include "src/plan/plan.h"
#include "src/topo/topo.h"
#include "src/util/error.h"
#include "tests/harness.h"
#include "tests/topo_check.h"

#define N_GPUS       8
#define H100_SMS     132
#define NVLINK4_GBS  25.0 /* Per link and direction, nominal (docs/tuning.md). */
#define H100_LINKS   18
#define NO_SUCH_FILE "/nonexistent/conflux-test/lib.so.1"

static const char *tests_dir(void)
{
    static char dir[1024];
    char src[1024];
    snprintf(src, sizeof(src), "%s", __FILE__);
    snprintf(dir, sizeof(dir), "%s", dirname(src));
    return dir;
}

static const char *answers_file(const char *name)
{
    static char path[1100];
    snprintf(path, sizeof(path), "%s/fakenvml/%s", tests_dir(), name);
    return path;
}

static const char *fixture(const char *name)
{
    static char path[1100];
    snprintf(path, sizeof(path), "%s/topo/%s", tests_dir(), name);
    return path;
}

/* The fake library ctest names in @p var, or skip (printed) without it. */
static const char *fake_lib(const char *var)
{
#if !CFX_HAVE_CUDA
    (void)var;
    cr_skip_test("built without the CUDA toolkit: no GPU detection to test");
    return NULL;
#else
    const char *lib = getenv(var);
    if (lib == NULL || lib[0] == '\0' || access(lib, R_OK) != 0)
        cr_skip_test("%s unset or unreadable (run through ctest)", var);
    return lib;
#endif
}

static char log_path[64];

/* Detection logs GRAPH at INFO to a file of this process; read by log_text. */
static void log_graph(void)
{
    snprintf(log_path, sizeof(log_path), "/tmp/cfx-topo-detect-log-%d", (int)getpid());
    unlink(log_path);
    cfx_test_setenv("CFX_DEBUG", "INFO");
    cfx_test_setenv("CFX_DEBUG_SUBSYS", "GRAPH");
    cfx_test_setenv("CFX_DEBUG_FILE", log_path);
}

static const char *log_text(void)
{
    static char text[65536];
    text[0] = '\0';
    FILE *f = fopen(log_path, "r");
    if (f == NULL)
        return text;
    size_t got = fread(text, 1, sizeof(text) - 1, f);
    text[got] = '\0';
    fclose(f);
    return text;
}

/* Point detection at the fakes: @p n_gpus fake-cuda devices, and NVML
 * answering @p answers (a path; NULL: FAKENVML_ANSWERS unset). */
static void use_fakes(int n_gpus, const char *answers)
{
    char count[16];
    snprintf(count, sizeof(count), "%d", n_gpus);
    cfx_test_setenv("CFX_TOPO_FILE", NULL);
    cfx_test_setenv("CFX_CUDA_DRIVER_LIB", fake_lib("CFX_TEST_FAKECUDA"));
    cfx_test_setenv("FAKECUDA_DEVICES", count);
    cfx_test_setenv("CFX_NVML_LIB", fake_lib("CFX_TEST_FAKENVML"));
    cfx_test_setenv("FAKENVML_ANSWERS", answers);
    log_graph();
}

static struct cfx_topo_system *detect(void)
{
    struct cfx_topo_system *sys = NULL;
    cr_assert_eq(cfx_topo_detect(&sys), cfxSuccess, "%s", cfx_error_thread_last());
    cr_assert_str_eq(sys->source, "detected");
    return sys;
}

static const struct cfx_topo_node *gpu_node(const struct cfx_topo_system *sys, int dev)
{
    int n = cfx_topo_find_gpu(sys, dev);
    cr_assert_neq(n, -1, "GPU %d", dev);
    return &sys->nodes[n];
}

static double nvlink_gbs(const struct cfx_topo_node *gpu)
{
    double bw = 0;
    for (int l = 0; l < gpu->n_links; l++)
        if (gpu->links[l].type == CFX_LINK_NVL)
            bw += gpu->links[l].bw;
    return bw;
}

/* Write @p text to a file of this process (answers for the fake NVML). */
static const char *answers_text(const char *text)
{
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/cfx-topo-detect-%d.answers", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* ------------------------------------------------------------ the graph */

Test(topo_detect, dgx_h100_answers_give_8_sm90_gpus_with_18_nvlinks_each_to_the_nvswitches)
{
    use_fakes(N_GPUS, answers_file("dgx-h100.answers"));
    struct cfx_topo_system *sys = detect();
    cr_assert_eq(sys->count[CFX_TOPO_GPU], N_GPUS);
    cr_expect_eq(sys->count[CFX_TOPO_NVS], 1, "the four NVSwitches are one NVS node");
    static const char *const switches[4] = {"0000:d0:00.0", "0000:d1:00.0", "0000:d2:00.0",
                                            "0000:d3:00.0"};
    static const int per_switch[4] = {5, 4, 4, 5};
    for (int g = 0; g < N_GPUS; g++) {
        const struct cfx_topo_node *gpu = gpu_node(sys, g);
        char busid[16];
        snprintf(busid, sizeof(busid), "0000:%02x:00.0", 0x10 + g);
        cr_expect_str_eq(gpu->busid, busid, "GPU %d", g);
        cr_expect_eq(gpu->gpu.sm, 90, "GPU %d compute capability", g);
        cr_expect_eq(gpu->gpu.sm_count, H100_SMS, "GPU %d SMs", g);
        cr_expect_eq(gpu->pci_class, 0x030200u, "GPU %d: a 3D controller (no sysfs entry)", g);
        cr_assert_eq(gpu->gpu.n_nvlinks, 4, "GPU %d: one record per NVSwitch", g);
        for (int r = 0; r < 4; r++) {
            const struct cfx_topo_nvlink *rec = &gpu->gpu.nvlinks[r];
            cr_expect_str_eq(rec->target, switches[r], "GPU %d record %d", g, r);
            cr_expect_eq(rec->count, per_switch[r], "GPU %d to %s", g, rec->target);
            cr_expect_eq(rec->target_class, 0x068000u, "an NVSwitch (not visible in sysfs)");
        }
        cr_expect_float_eq(nvlink_gbs(gpu), H100_LINKS * NVLINK4_GBS, 1e-9,
                           "GPU %d NVLink %.1f GB/s: 18 links x 25 GB/s", g, nvlink_gbs(gpu));
        for (int h = 0; h < N_GPUS; h++) {
            if (h == g)
                continue;
            const struct cfx_topo_path *p =
                cfx_topo_path(sys, cfx_topo_find_gpu(sys, g), cfx_topo_find_gpu(sys, h));
            cr_expect_eq(p->type, CFX_PATH_NVL, "GPU %d -> %d is %s", g, h,
                         cfx_topo_path_type_name(p->type));
            cr_expect_float_eq(p->bw, H100_LINKS * NVLINK4_GBS, 1e-9);
            cr_expect_eq(p->hops, 2, "GPU -> NVSwitch -> GPU");
        }
    }
    const char *log = log_text();
    cr_expect(strstr(log, "GPU/0: 0000:10:00.0 sm90, 132 SMs, 18 NVLinks to 4 target(s), 450.0 "
                          "GB/s") != NULL,
              "log: %s", log);
    cr_expect(strstr(log, "NVLinks unknown") == NULL, "log: %s", log);
    cfx_topo_free(sys);
    unlink(log_path);
}

/* ------------------------------------------------------------ the dump */

/* How many <@p element ...> @p text holds, with in @p names the attribute
 * names of the first in order ("dev,sm,gdr,"); -1 when another one has
 * different attributes. */
static int element_attrs(const char *text, const char *element, char *names, size_t size)
{
    char open[32], these[256];
    snprintf(open, sizeof(open), "<%s ", element);
    int count = 0;
    names[0] = '\0';
    for (const char *at = strstr(text, open); at; at = strstr(at + 1, open)) {
        size_t used = 0;
        these[0] = '\0';
        const char *end = strchr(at, '>');
        for (const char *c = at + strlen(open); c != NULL && end != NULL && c < end;) {
            const char *eq = strchr(c, '=');
            if (eq == NULL || eq > end)
                break;
            while (*c == ' ')
                c++;
            used += (size_t)snprintf(these + used, sizeof(these) - used, "%.*s,", (int)(eq - c), c);
            const char *close = strchr(eq + 2, '"'); /* The end of ="value". */
            c = close ? close + 1 : NULL;
        }
        if (count++ == 0)
            snprintf(names, size, "%s", these);
        else if (strcmp(names, these) != 0)
            return -1;
    }
    return count;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    static char text[1 << 20];
    size_t got = fread(text, 1, sizeof(text) - 1, f);
    text[got] = '\0';
    fclose(f);
    return strdup(text);
}

Test(topo_detect, the_dump_has_nccl_gpu_and_nvlink_elements_and_loads_back_the_same)
{
    char dump[64];
    snprintf(dump, sizeof(dump), "/tmp/cfx-topo-detect-dump-%d.xml", (int)getpid());
    use_fakes(N_GPUS, answers_file("dgx-h100.answers"));
    cfx_test_setenv("CFX_TOPO_DUMP_FILE", dump);
    struct cfx_topo_system *sys = detect();
    char *ours = read_file(dump);
    char *nccl = read_file(fixture("dgx-h100.xml")); /* An NCCL-format file. */

    /* <gpu>: NCCL's attributes (dev, sm, gdr; rank is NCCL's to set for
     * the GPUs of a communicator), no others. */
    char ours_attrs[256], nccl_attrs[256];
    cr_expect_eq(element_attrs(ours, "gpu", ours_attrs, sizeof(ours_attrs)), N_GPUS);
    cr_expect_eq(element_attrs(nccl, "gpu", nccl_attrs, sizeof(nccl_attrs)), N_GPUS);
    cr_expect_str_eq(ours_attrs, "dev,sm,gdr,", "%s", ours);
    cr_expect_str_eq(nccl_attrs, "dev,sm,rank,gdr,");
    cr_expect(strstr(ours, "<gpu dev=\"0\" sm=\"90\" gdr=\"1\">") != NULL, "%s", ours);
    /* <nvlink>: the same elements as the NCCL file, word for word. */
    cr_expect_eq(element_attrs(ours, "nvlink", ours_attrs, sizeof(ours_attrs)), 4 * N_GPUS);
    cr_expect_eq(element_attrs(nccl, "nvlink", nccl_attrs, sizeof(nccl_attrs)), 4 * N_GPUS);
    cr_expect_str_eq(ours_attrs, nccl_attrs);
    static const char *const records[] = {
        "<nvlink target=\"0000:d0:00.0\" count=\"5\" tclass=\"0x068000\"/>",
        "<nvlink target=\"0000:d1:00.0\" count=\"4\" tclass=\"0x068000\"/>",
        "<nvlink target=\"0000:d2:00.0\" count=\"4\" tclass=\"0x068000\"/>",
        "<nvlink target=\"0000:d3:00.0\" count=\"5\" tclass=\"0x068000\"/>"};
    for (int r = 0; r < 4; r++) {
        cr_expect(strstr(nccl, records[r]) != NULL, "fixture lacks %s", records[r]);
        cr_expect(strstr(ours, records[r]) != NULL, "dump lacks %s", records[r]);
    }
    /* The GPU's <pci> has the attributes NCCL's reader requires (class,
     * link_speed, link_width), empty where sysfs does not say, as NCCL writes. */
    cr_expect(strstr(ours, "<pci busid=\"0000:10:00.0\" class=\"0x030200\" link_speed=\"\" "
                           "link_width=\"\">") != NULL,
              "%s", ours);

    struct cfx_topo_system *again = NULL;
    cr_assert_eq(cfx_topo_load_xml(dump, &again), cfxSuccess, "%s", cfx_error_thread_last());
    topo_assert_same_system(sys, again, "detected over the fakes");
    char *text1 = topo_dump_to_text(sys), *text2 = topo_dump_to_text(again);
    cr_expect_str_eq(text1, ours, "CFX_TOPO_DUMP_FILE is the writer's text");
    cr_expect_str_eq(text2, text1, "a second dump differs");
    free(text1);
    free(text2);
    free(ours);
    free(nccl);
    unlink(dump);
    unlink(log_path);
    cfx_topo_free(again);
    cfx_topo_free(sys);
}

/* ------------------------------------------------------------ the planner */

static struct cfx_plan *plan_one_host(const struct cfx_topo_system *sys)
{
    struct cfx_plan_input in = {
        .n_ranks = N_GPUS, .n_nodes = 1, .system = sys, .ranks_per_node = N_GPUS};
    struct cfx_plan *plan = NULL;
    cr_assert_eq(cfx_plan_build(&in, &plan), cfxSuccess, "%s", cfx_error_thread_last());
    return plan;
}

Test(topo_detect, the_planner_rings_and_trees_on_the_detected_gpus_run_over_nvlink)
{
    use_fakes(N_GPUS, answers_file("dgx-h100.answers"));
    struct cfx_topo_system *sys = detect();
    struct cfx_topo_system *file = NULL;
    cr_assert_eq(cfx_topo_load_xml(fixture("dgx-h100.xml"), &file), cfxSuccess);
    struct cfx_plan *plan = plan_one_host(sys), *file_plan = plan_one_host(file);
    cr_assert_geq(plan->n_channels, 1);
    for (int c = 0; c < plan->n_channels; c++)
        for (int i = 0; i < N_GPUS; i++) {
            cr_expect_eq(plan->rings[(size_t)c * N_GPUS + i], i, "ring %d in GPU order", c);
            cr_expect_eq(plan->ring_hops[(size_t)c * N_GPUS + i], CFX_PATH_NVL,
                         "ring %d hop %d is %s", c, i,
                         cfx_topo_path_type_name(plan->ring_hops[(size_t)c * N_GPUS + i]));
        }
    /* The search gives each ring what an NVLink path gives: the same as on
     * the NCCL file of the same NVSwitch fabric, far above what the PCIe
     * tree could carry (the fake GPUs have no sysfs PCI entries). */
    cr_expect_eq(plan->n_channels, file_plan->n_channels);
    for (int c = 0; c < plan->n_channels && c < file_plan->n_channels; c++)
        cr_expect_float_eq(plan->channel_bw[c], file_plan->channel_bw[c], 1e-9, "ring %d", c);
    cr_expect_float_eq(plan->model.intra_bw, file_plan->model.intra_bw, 1e-9);
    cr_expect_eq(plan->model.intra_class, CFX_LINK_NVL);
    /* All of it: 18 x 25 GB/s of NVLink at the 80% a transfer gets of it
     * (docs/tuning.md), spread over the rings. */
    cr_expect_float_eq(plan->model.ring_bw, 0.80 * H100_LINKS * NVLINK4_GBS, 1e-6,
                       "%.1f GB/s over %d rings", plan->model.ring_bw, plan->n_channels);
    for (int t = 0; t < 2; t++)
        for (int r = 0; r < N_GPUS; r++) {
            int parent = plan->trees[t].parent[r];
            if (parent < 0)
                continue;
            enum cfx_topo_path_type type =
                cfx_topo_path(sys, cfx_topo_find_gpu(sys, r), cfx_topo_find_gpu(sys, parent))->type;
            cr_expect_eq(type, CFX_PATH_NVL, "tree %d edge %d -> %d is %s", t, r, parent,
                         cfx_topo_path_type_name(type));
        }
    struct cfx_plan_choice ch;
    cr_assert_eq(cfx_plan_choose(plan, CFX_COLL_ALLREDUCE, (size_t)1 << 30, &ch), cfxSuccess);
    struct cfx_plan_choice file_ch;
    cr_assert_eq(cfx_plan_choose(file_plan, CFX_COLL_ALLREDUCE, (size_t)1 << 30, &file_ch),
                 cfxSuccess);
    cr_expect_float_eq(ch.busbw_gbs, file_ch.busbw_gbs, 1e-9, "1 GiB allreduce %.1f GB/s",
                       ch.busbw_gbs);
    cfx_plan_free(plan);
    cfx_plan_free(file_plan);
    cfx_topo_free(file);
    cfx_topo_free(sys);
    unlink(log_path);
}

/* ------------------------------------------------------------ other answers */

Test(topo_detect, links_down_or_without_p2p_are_left_out_and_gpu_to_gpu_links_make_nvl_pairs)
{
    /* Four GPUs in a chain, 0 = 1 = 2, GPU 2 also on a switch NVML hides,
     * GPU 3 unknown to NVML. */
    fake_lib("CFX_TEST_FAKECUDA"); /* Skips before writing anything. */
    fake_lib("CFX_TEST_FAKENVML");
    const char *answers = answers_text("gpu 0000:10:00.0\n"
                                       "link 0 up 0000:11:00.0\n"
                                       "link 1 up 0000:11:00.0\n"
                                       "link 2 down 0000:11:00.0\n"
                                       "link 3 up 0000:11:00.0 no-p2p\n"
                                       "gpu 0000:11:00.0\n"
                                       "link 0 up 0000:10:00.0\n"
                                       "link 1 up 0000:10:00.0\n"
                                       "link 2 up 0000:12:00.0\n"
                                       "link 3 up 0000:12:00.0\n"
                                       "gpu 0000:12:00.0\n"
                                       "link 0 up 0000:11:00.0\n"
                                       "link 1 up 0000:11:00.0\n"
                                       "link 2 up hidden\n");
    use_fakes(4, answers);
    struct cfx_topo_system *sys = detect();
    cr_assert_eq(sys->count[CFX_TOPO_GPU], 4);
    const struct cfx_topo_node *g0 = gpu_node(sys, 0), *g2 = gpu_node(sys, 2);
    cr_assert_eq(g0->gpu.n_nvlinks, 1);
    cr_expect_str_eq(g0->gpu.nvlinks[0].target, "0000:11:00.0");
    cr_expect_eq(g0->gpu.nvlinks[0].count, 2, "the link that is down and the one without P2P");
    cr_expect_eq(g0->gpu.nvlinks[0].target_class, 0x030200u, "a GPU of the graph");
    cr_assert_eq(g2->gpu.n_nvlinks, 2);
    cr_expect_str_eq(g2->gpu.nvlinks[1].target, "fffffff:ffff:ff", "NCCL's hidden peer");
    cr_expect_eq(g2->gpu.nvlinks[1].target_class, 0x068000u, "taken for an NVSwitch");
    cr_expect_eq(gpu_node(sys, 3)->gpu.n_nvlinks, 0);
    cr_expect_eq(sys->count[CFX_TOPO_NVS], 1);
    int n0 = cfx_topo_find_gpu(sys, 0), n1 = cfx_topo_find_gpu(sys, 1);
    int n2 = cfx_topo_find_gpu(sys, 2), n3 = cfx_topo_find_gpu(sys, 3);
    cr_expect_eq(cfx_topo_path(sys, n0, n1)->type, CFX_PATH_NVL);
    cr_expect_float_eq(cfx_topo_path(sys, n0, n1)->bw, 2 * NVLINK4_GBS, 1e-9);
    cr_expect_eq(cfx_topo_path(sys, n0, n2)->type, CFX_PATH_NVB, "through GPU 1");
    cr_expect_eq(cfx_topo_path(sys, n0, n3)->type, CFX_PATH_PHB, "no NVLink: PCIe via the CPU");
    const char *log = log_text();
    cr_expect(strstr(log, "does not know 1 of the CUDA GPUs") != NULL, "log: %s", log);
    /* The hidden target reads back too. */
    char *text = topo_dump_to_text(sys);
    struct cfx_topo_system *again = NULL;
    cr_assert_eq(cfx_topo_load_xml_buffer(text, strlen(text), "dump.xml", &again), cfxSuccess, "%s",
                 cfx_error_thread_last());
    topo_assert_same_system(sys, again, "chain");
    free(text);
    cfx_topo_free(again);
    cfx_topo_free(sys);
    unlink(answers);
    unlink(log_path);
}

/* ------------------------------------------------------------ without the libraries */

Test(topo_detect, without_a_cuda_driver_detection_says_why_and_the_graph_is_the_host_one)
{
    cfx_test_setenv("CFX_TOPO_FILE", NULL);
    cfx_test_setenv("CFX_CUDA_DRIVER_LIB", NULL);
    log_graph();
    struct cfx_topo_system *host = detect(); /* No CUDA in this process. */
    cfx_test_setenv("CFX_CUDA_DRIVER_LIB", NO_SUCH_FILE);
    cfx_test_setenv("CFX_NVML_LIB", NO_SUCH_FILE);
    struct cfx_topo_system *sys = detect(); /* A driver named that does not load. */
    cr_expect_eq(sys->count[CFX_TOPO_GPU], 0);
    topo_assert_same_system(host, sys, "without a CUDA driver");
    const char *log = log_text();
#if CFX_HAVE_CUDA
    cr_expect(strstr(log, "no GPU (CUDA driver: this process does not use CUDA)") != NULL,
              "log: %s", log);
    cr_expect(strstr(log, "no GPU (CUDA driver: no CUDA driver (" NO_SUCH_FILE) != NULL, "log: %s",
              log);
#else
    cr_expect(strstr(log, "no GPU (this build has no CUDA)") != NULL, "log: %s", log);
#endif
    cfx_topo_free(host);
    cfx_topo_free(sys);
    unlink(log_path);
}

Test(topo_detect, without_nvml_or_its_answers_the_gpus_have_no_nvlinks_and_the_log_says_why)
{
    use_fakes(N_GPUS, NULL);
    cfx_test_setenv("CFX_NVML_LIB", NO_SUCH_FILE);
    struct cfx_topo_system *no_lib = detect();
    cfx_test_setenv("CFX_NVML_LIB", fake_lib("CFX_TEST_FAKENVML")); /* No answers: no driver. */
    struct cfx_topo_system *no_driver = detect();
    for (int s = 0; s < 2; s++) {
        const struct cfx_topo_system *sys = s ? no_driver : no_lib;
        cr_expect_eq(sys->count[CFX_TOPO_GPU], N_GPUS);
        cr_expect_eq(sys->count[CFX_TOPO_NVS], 0);
        for (int g = 0; g < N_GPUS; g++) {
            cr_expect_eq(gpu_node(sys, g)->gpu.n_nvlinks, 0);
            cr_expect_eq(gpu_node(sys, g)->gpu.sm_count, H100_SMS, "CUDA still says");
            cr_expect_float_eq(nvlink_gbs(gpu_node(sys, g)), 0, 1e-9);
        }
        cr_expect_eq(cfx_topo_path(sys, cfx_topo_find_gpu(sys, 0), cfx_topo_find_gpu(sys, 1))->type,
                     CFX_PATH_PHB, "PCIe through the CPU");
    }
    topo_assert_same_system(no_lib, no_driver, "without NVML");
    const char *log = log_text();
    cr_expect(strstr(log, "NVLinks unknown: NVML not loadable (CFX_NVML_LIB=" NO_SUCH_FILE) != NULL,
              "log: %s", log);
    cr_expect(strstr(log, "NVLinks unknown: nvmlInit_v2 of ") != NULL, "log: %s", log);
    cr_expect(strstr(log, "(NVML error 9: Driver Not Loaded)") != NULL, "log: %s", log);
    cfx_topo_free(no_lib);
    cfx_topo_free(no_driver);
    unlink(log_path);
}
