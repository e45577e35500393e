/*
 * Parameters and logging: environment over configuration file over default,
 * values are decimal (sizes may take K, M, G) and within their range, a
 * refused value fails communicator creation with a sentence naming it, every
 * parameter is listed, and log lines go where CFX_DEBUG_FILE says with host,
 * pid, rank and subsystem.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cfx_build_config.h"
#include "src/util/log.h"
#include "src/util/param.h"
#include "src/util/socket.h"
#include "tests/harness.h"

CFX_PARAM_INT(test_number, "TEST_NUMBER", 42, -1000, 1000, "A parameter defined by the test");
CFX_PARAM_STR(test_word, "TEST_WORD", "plain", "A string parameter defined by the test");
CFX_PARAM_SIZE(test_bytes, "TEST_BYTES", 4 << 20, 64, INT64_MAX, "A size defined by the test");

static char conf_path[64];

static void write_conf(const char *text)
{
    snprintf(conf_path, sizeof(conf_path), "/tmp/cfx-test-conf-%d", (int)getpid());
    FILE *f = fopen(conf_path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    cfx_test_setenv("CFX_CONF_FILE", conf_path);
}

static void remove_conf(void)
{
    unlink(conf_path);
}

Test(params, default_applies_when_nothing_is_set)
{
    cfx_test_setenv("CFX_TEST_NUMBER", NULL);
    cfx_test_setenv("CFX_CONF_FILE", "/nonexistent");
    cr_assert_eq(param_test_number(), 42);
    cr_assert_str_eq(param_test_word(), "plain");
}

Test(params, environment_sets_a_value)
{
    cfx_test_setenv("CFX_TEST_NUMBER", "16");
    cr_assert_eq(param_test_number(), 16);
    cfx_test_setenv("CFX_TEST_WORD", "loud");
    cr_assert_str_eq(param_test_word(), "loud");
}

Test(params, configuration_file_applies_below_the_environment, .fini = remove_conf)
{
    write_conf("# comment\n\n  CFX_TEST_NUMBER = 7  \nCFX_TEST_WORD=from-file\n");
    cfx_test_setenv("CFX_TEST_NUMBER", NULL);
    cfx_test_setenv("CFX_TEST_WORD", NULL);
    cr_assert_eq(param_test_number(), 7);
    cr_assert_str_eq(param_test_word(), "from-file");
    cfx_test_setenv("CFX_TEST_NUMBER", "9");
    cr_assert_eq(param_test_number(), 9, "the environment wins over the file");
}

Test(params, a_value_that_is_not_a_number_keeps_the_default_and_warns, .fini = remove_conf)
{
    char log_path[64];
    snprintf(log_path, sizeof(log_path), "/tmp/cfx-test-log-%d", (int)getpid());
    cfx_test_setenv("CFX_DEBUG_FILE", log_path);
    cfx_test_setenv("CFX_DEBUG", "WARN");
    cfx_test_setenv("CFX_TEST_NUMBER", "12abc");
    cr_assert_eq(param_test_number(), 42);
    FILE *f = fopen(log_path, "r");
    cr_assert_not_null(f, "no log file at %s", log_path);
    char line[1024] = "";
    cr_assert_not_null(fgets(line, sizeof(line), f));
    fclose(f);
    unlink(log_path);
    cr_assert(strstr(line, "CFX_TEST_NUMBER=\"12abc\"") != NULL, "log line: %s", line);
    cr_assert(strstr(line, "is not accepted: expected a decimal integer from -1000 to 1000") !=
                  NULL,
              "log line: %s", line);
}

Test(params, malformed_configuration_lines_are_reported, .fini = remove_conf)
{
    char log_path[64];
    snprintf(log_path, sizeof(log_path), "/tmp/cfx-test-log2-%d", (int)getpid());
    write_conf("CFX_TEST_NUMBER=5\nthis line has no equals sign\n");
    cfx_test_setenv("CFX_DEBUG_FILE", log_path);
    cfx_test_setenv("CFX_DEBUG", "WARN");
    cfx_test_setenv("CFX_TEST_NUMBER", NULL);
    cr_assert_eq(param_test_number(), 5);
    FILE *f = fopen(log_path, "r");
    cr_assert_not_null(f);
    char line[1024] = "";
    cr_assert_not_null(fgets(line, sizeof(line), f));
    fclose(f);
    unlink(log_path);
    cr_assert(strstr(line, "line 2 is not NAME=value") != NULL, "log line: %s", line);
}

Test(params, every_parameter_is_listed_with_its_description)
{
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    cfx_param_print_all(out);
    fclose(out);
    const char *expected[] = {"CFX_TEST_NUMBER",       "A parameter defined by the test",
                              "CFX_BOOTSTRAP_TIMEOUT", "CFX_SOCKET_IFNAME",
                              "CFX_COMM_ID",           "CFX_HOSTID"};
    for (size_t i = 0; i < sizeof(expected) / sizeof(expected[0]); i++)
        cr_assert(strstr(text, expected[i]) != NULL, "%s missing from:\n%s", expected[i], text);
    free(text);
}

/* ---------------------------------------------------- accepted values */

static int64_t number_for(const char *text)
{
    cfx_test_setenv("CFX_TEST_NUMBER", text);
    return param_test_number();
}

static int64_t bytes_for(const char *text)
{
    cfx_test_setenv("CFX_TEST_BYTES", text);
    return param_test_bytes();
}

Test(params, integers_are_decimal_only)
{
    cfx_test_setenv("CFX_CONF_FILE", "/nonexistent");
    cr_assert_eq(number_for("030"), 30, "a leading zero is not octal");
    cr_assert_eq(number_for(" -7 "), -7);
    cr_assert_eq(number_for("+5"), 5);
    const char *refused[] = {"0x10", "1e3", "5s", "abc", "", "-", "3.0", "99999999999999999999"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        cr_assert_eq(number_for(refused[i]), 42, "\"%s\" was not refused", refused[i]);
    cr_assert_eq(number_for("1001"), 42, "above the range");
    cr_assert_eq(number_for("-1001"), 42, "below the range");
}

Test(params, sizes_take_k_m_g_as_powers_of_1024)
{
    cfx_test_setenv("CFX_CONF_FILE", "/nonexistent");
    cr_assert_eq(bytes_for("4096"), 4096);
    cr_assert_eq(bytes_for("4k"), 4096);
    cr_assert_eq(bytes_for("4M"), 4 << 20);
    cr_assert_eq(bytes_for("4MB"), 4 << 20);
    cr_assert_eq(bytes_for("2G"), (int64_t)2 << 30);
    const char *refused[] = {"abc", "1e20", "4T", "4MM", "0x100", "32"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        cr_assert_eq(bytes_for(refused[i]), 4 << 20, "\"%s\" was not refused", refused[i]);
    cr_assert_eq(bytes_for("99999999999G"), 4 << 20, "a size that does not fit in 64 bits");
}

static char topo_path[64];

static const char *write_bad_topo(void)
{
    snprintf(topo_path, sizeof(topo_path), "/tmp/cfx-test-topo-%d.xml", (int)getpid());
    FILE *f = fopen(topo_path, "w");
    cr_assert_not_null(f);
    fputs("<system version=\"1\"><cpu numaid=\"0\"><pci busid=\n", f);
    fclose(f);
    return topo_path;
}

/* cfxCommInitRank checks every parameter before it looks at the id (so a
 * zero id reaches the check) and starts nothing. */
static void expect_init_refuses(const char *name, const char *value, const char *form)
{
    cfx_test_setenv(name, value);
    cfxComm_t comm = NULL;
    cfxUniqueId id;
    memset(&id, 0, sizeof(id));
    cfxResult_t res = cfxCommInitRank(&comm, 1, id, 0);
    const char *sentence = cfxGetLastError(NULL);
    char quoted[128];
    snprintf(quoted, sizeof(quoted), "%s=\"%s\"", name, value);
    cr_expect_eq(res, cfxInvalidArgument, "%s: %s", quoted, sentence);
    cr_expect(strstr(sentence, quoted) != NULL, "%s is not named in: %s", quoted, sentence);
    cr_expect(strstr(sentence, form) != NULL, "\"%s\" is not in: %s", form, sentence);
    cfx_test_setenv(name, NULL);
}

Test(params, timeouts_beyond_the_nanosecond_clock_fail_init)
{
    cfx_test_setenv("CFX_CONF_FILE", "/nonexistent");
    expect_init_refuses("CFX_TIMEOUT", "10000000000", "from 0 to 1000000000");
    expect_init_refuses("CFX_BOOTSTRAP_TIMEOUT", "10000000000", "from 0 to 1000000000");
}

Test(params, every_kind_of_refused_value_fails_init_naming_variable_value_and_form,
     .fini = remove_conf)
{
    cfx_test_setenv("CFX_CONF_FILE", "/nonexistent");
    expect_init_refuses("CFX_BUFFSIZE", "abc", "K, M or G");
    expect_init_refuses("CFX_BUFFSIZE", "1e20", "from 64 to 4294967295");
    expect_init_refuses("CFX_TIMEOUT", "5s", "decimal integer");
    expect_init_refuses("CFX_TIMEOUT", "1e3", "decimal integer");
    expect_init_refuses("CFX_SOCKET_FAMILY", "5", "4 (IPv4), 6 (IPv6), or 0");
    expect_init_refuses("CFX_ALGO", "garbage", "unknown name \"garbage\"");
    expect_init_refuses("CFX_PROTO", "allreduce:LL,bogus", "unknown name \"bogus\"");
    expect_init_refuses("CFX_ALGO", "allgathr:ring", "no collective \"allgathr\"");
    expect_init_refuses("CFX_TOPO_FILE", "/nonexistent/topo.xml", "No such file");
    expect_init_refuses("CFX_TOPO_FILE", "/dev/zero", "too large");
    expect_init_refuses("CFX_TOPO_FILE", write_bad_topo(), "NCCL topology XML");
    unlink(topo_path);
#if CFX_HAVE_VERBS /* The verbs transport's parameter. */
    expect_init_refuses("CFX_NET_GDR_LEVEL", "FAR", "one of LOC, PIX, PXB, PHB, SYS");
#endif
    expect_init_refuses("CFX_BOOTSTRAP_FRAME_TIMEOUT_MS", "0", "from 1 to");
    expect_init_refuses("CFX_COMM_ID", "127.0.0.1:0", "port from 1 to 65535");
    expect_init_refuses("CFX_SHM_DISABLE", "yes", "from 0 to 1");
}

Test(params, a_refused_value_from_the_configuration_file_names_the_file, .fini = remove_conf)
{
    write_conf("CFX_NSOCKS_PERTHREAD=0\n");
    cfx_test_setenv("CFX_NSOCKS_PERTHREAD", NULL);
    cfxComm_t comm = NULL;
    cfxUniqueId id;
    memset(&id, 0, sizeof(id));
    cr_assert_eq(cfxCommInitRank(&comm, 1, id, 0), cfxInvalidArgument);
    char expected[160];
    snprintf(expected, sizeof(expected), "CFX_NSOCKS_PERTHREAD=\"0\" (%s) is not accepted",
             conf_path);
    cr_assert(strstr(cfxGetLastError(NULL), expected) != NULL, "%s", cfxGetLastError(NULL));
}

Test(params, the_largest_timeout_lets_calls_complete)
{
    cfx_test_setenv("CFX_CONF_FILE", "/nonexistent");
    cfx_test_setenv("CFX_TIMEOUT", "1000000000");
    cfxComm_t comm;
    cr_assert_eq(cfxCommInitAll(&comm, 1, NULL), cfxSuccess, "%s", cfxGetLastError(NULL));
    float value = 1.0f;
    cr_expect_eq(cfxAllReduce(&value, &value, 1, cfxFloat32, cfxSum, comm, NULL), cfxSuccess, "%s",
                 cfxGetLastError(NULL));
    cfxCommDestroy(comm);
    cfx_test_setenv("CFX_TIMEOUT", NULL);
}

Test(params, accepted_settings_pass_the_check)
{
    cfx_test_setenv("CFX_CONF_FILE", "/nonexistent");
    const char *settings[][2] = {
        {"CFX_BUFFSIZE", "4M"},     {"CFX_TIMEOUT", "030"},
        {"CFX_SOCKET_FAMILY", "6"}, {"CFX_ALGO", "ring,nvls;allreduce:^tree"},
        {"CFX_PROTO", "^LL128"},    {"CFX_COMM_ID", "127.0.0.1:29500"},
        {"CFX_SPIN_COUNT", "-1"},   {"CFX_TIMEOUT", "1000000000"},
    };
    for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++) {
        cfx_test_setenv(settings[i][0], settings[i][1]);
        cr_expect_eq(cfx_param_check_all(), cfxSuccess, "%s=%s: %s", settings[i][0], settings[i][1],
                     cfxGetLastError(NULL));
        cfx_test_setenv(settings[i][0], NULL);
    }
}

Test(params, the_parameter_list_shows_a_refused_value_and_its_sentence)
{
    cfx_test_setenv("CFX_CONF_FILE", "/nonexistent");
    cfx_test_setenv("CFX_SOCKET_FAMILY", "5");
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    int n_refused = cfx_param_print_all(out);
    fclose(out);
    cr_expect_eq(n_refused, 1, "%s", text);
    cr_expect(strstr(text, "REFUSED: CFX_SOCKET_FAMILY=\"5\" (environment) is not accepted") !=
                  NULL,
              "%s", text);
    free(text);
}

/* ------------------------------------------------------------ logging */

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no log file at %s", path);
    static char text[16384];
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    text[n] = '\0';
    fclose(f);
    return text;
}

Test(logging, debug_file_expands_host_and_pid_and_lines_carry_rank_and_subsystem)
{
    char host[64];
    gethostname(host, sizeof(host));
    host[strcspn(host, ".")] = '\0';
    cfx_test_setenv("CFX_DEBUG_FILE", "/tmp/cfx-log-%h-%p");
    cfx_test_setenv("CFX_DEBUG", "INFO");
    cfx_test_setenv("CFX_DEBUG_SUBSYS", "INIT,BOOTSTRAP");
    cfxComm_t comm;
    cr_assert_eq(cfxCommInitAll(&comm, 1, NULL), cfxSuccess);
    cfxCommDestroy(comm);
    char path[128];
    snprintf(path, sizeof(path), "/tmp/cfx-log-%s-%d", host, (int)getpid());
    char *text = read_file(path);
    unlink(path);
    char prefix[96];
    snprintf(prefix, sizeof(prefix), "%s:%d:", host, (int)getpid());
    cr_assert(strstr(text, prefix) != NULL, "no line starts with %s:\n%s", prefix, text);
    cr_assert(strstr(text, "[0] CFX INFO INIT comm") != NULL, "no INIT line for rank 0:\n%s", text);
    cr_assert(strstr(text, "Init COMPLETE") != NULL, "%s", text);
    cr_assert(strstr(text, "CFX INFO BOOTSTRAP") != NULL, "%s", text);
}

Test(logging, excluded_subsystems_stay_silent)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/cfx-log3-%d", (int)getpid());
    cfx_test_setenv("CFX_DEBUG_FILE", path);
    cfx_test_setenv("CFX_DEBUG", "INFO");
    cfx_test_setenv("CFX_DEBUG_SUBSYS", "^BOOTSTRAP");
    cfxComm_t comm;
    cr_assert_eq(cfxCommInitAll(&comm, 1, NULL), cfxSuccess);
    cfxCommDestroy(comm);
    char *text = read_file(path);
    unlink(path);
    cr_assert(strstr(text, "Init COMPLETE") != NULL, "INIT lines expected:\n%s", text);
    cr_assert(strstr(text, "BOOTSTRAP") == NULL, "BOOTSTRAP lines despite ^BOOTSTRAP:\n%s", text);
}

Test(logging, version_level_prints_the_version_line)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/cfx-log4-%d", (int)getpid());
    cfx_test_setenv("CFX_DEBUG_FILE", path);
    cfx_test_setenv("CFX_DEBUG", "VERSION");
    cfxUniqueId id;
    cr_assert_eq(cfxGetUniqueId(&id), cfxSuccess);
    char *text = read_file(path);
    unlink(path);
    char expected[64];
    snprintf(expected, sizeof(expected), "Conflux version %d.%d.%d", CFX_MAJOR, CFX_MINOR,
             CFX_PATCH);
    cr_assert(strstr(text, expected) != NULL, "%s", text);
}

/* ----------------------------------------------------- interface filter */

Test(socket, ifname_filter_follows_nccl_syntax)
{
    cr_assert(cfx_socket_ifname_matches("eth,ib", "eth0"));
    cr_assert(cfx_socket_ifname_matches("eth,ib", "ib1"));
    cr_assert_not(cfx_socket_ifname_matches("eth,ib", "lo"));
    cr_assert_not(cfx_socket_ifname_matches("^docker,lo", "docker0"));
    cr_assert(cfx_socket_ifname_matches("^docker,lo", "eth0"));
    cr_assert(cfx_socket_ifname_matches("=eth0", "eth0"));
    cr_assert_not(cfx_socket_ifname_matches("=eth0", "eth01"));
    cr_assert_not(cfx_socket_ifname_matches("^=eth0", "eth0"));
    cr_assert(cfx_socket_ifname_matches("^=eth0", "eth01"));
}

Test(socket, ifname_lo_picks_loopback_and_a_missing_interface_is_a_clear_error)
{
    union cfx_sockaddr addr;
    char name[64];
    cfx_test_setenv("CFX_SOCKET_IFNAME", "=lo");
    cr_assert_eq(cfx_socket_pick_address(&addr, name, sizeof(name)), cfxSuccess);
    cr_assert_str_eq(name, "lo");
    cfx_test_setenv("CFX_SOCKET_IFNAME", "=nosuchif9");
    cr_assert_eq(cfx_socket_pick_address(&addr, name, sizeof(name)), cfxSystemError);
    cr_assert(strstr(cfxGetLastError(NULL), "nosuchif9") != NULL, "%s", cfxGetLastError(NULL));
}

Test(socket, addresses_parse_in_both_families)
{
    union cfx_sockaddr addr;
    char text[80];
    cr_assert_eq(cfx_socket_addr_parse("127.0.0.1:1234", &addr), cfxSuccess);
    cfx_socket_addr_format(&addr, text, sizeof(text));
    cr_assert_str_eq(text, "127.0.0.1:1234");
    cr_assert_eq(cfx_socket_addr_parse("[::1]:99", &addr), cfxSuccess);
    cfx_socket_addr_format(&addr, text, sizeof(text));
    cr_assert_str_eq(text, "[::1]:99");
    cr_assert_eq(cfx_socket_addr_parse("127.0.0.1:99999", &addr), cfxInvalidArgument);
    cr_assert_eq(cfx_socket_addr_parse("127.0.0.1", &addr), cfxInvalidArgument);
}
