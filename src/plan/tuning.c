/*
 * Choosing per call, and the user's overrides.
 *
 * CFX_ALGO and CFX_PROTO take NCCL's syntax: a list of names (case does not
 * matter), "^" first to exclude them instead, and since NCCL 2.24 sections
 * for single collectives separated by ';':
 *
 *   CFX_ALGO=ring                         ring for everything
 *   CFX_ALGO=^tree                        anything but tree
 *   CFX_ALGO=allreduce:direct             the one-shot allreduce at every size
 *   CFX_ALGO=allreduce:twoshot            the two-shot (GPU ranks of one host)
 *   CFX_ALGO="allreduce:tree;broadcast:ring"
 *   CFX_PROTO="LL,Simple;allreduce:^LL"
 *
 * A section without a collective applies to all; later sections override
 * earlier ones for their collective. Names NCCL knows but Conflux does not
 * build (CollNet, NVLS, PAT) are ignored with a note; unknown names warn.
 * When a setting leaves a collective nothing that can run it (CFX_ALGO=tree
 * and an allgather), the model's best is used and a warning says so once.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "src/plan/internal.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"

static const char *const algo_names[CFX_ALGO_COUNT] = {"ring", "tree", "direct", "twoshot"};
static const char *const proto_names[CFX_PROTO_COUNT] = {"LL", "LL128", "Simple"};
static const char *const coll_keys[CFX_PLAN_COLLS] = {"allreduce", "broadcast", "reduce",
                                                      "allgather", "reducescatter"};
/* NCCL names Conflux accepts and has no implementation of. */
static const char *const nccl_only_names[] = {"collnetdirect", "collnetchain", "collnet",
                                              "nvls",          "nvlstree",     "pat"};

const char *cfx_plan_algo_name(enum cfx_plan_algo algo)
{
    return (unsigned)algo < CFX_ALGO_COUNT ? algo_names[algo] : "?";
}

const char *cfx_plan_proto_name(enum cfx_plan_proto proto)
{
    return (unsigned)proto < CFX_PROTO_COUNT ? proto_names[proto] : "?";
}

static char *trim(char *text)
{
    while (*text == ' ' || *text == '\t')
        text++;
    char *end = text + strlen(text);
    while (end > text && (end[-1] == ' ' || end[-1] == '\t'))
        *--end = '\0';
    return text;
}

static int nccl_only(const char *word)
{
    for (size_t i = 0; i < sizeof(nccl_only_names) / sizeof(nccl_only_names[0]); i++)
        if (strcasecmp(word, nccl_only_names[i]) == 0)
            return 1;
    return 0;
}

/* mask[coll][i]: 0 off, 1 on by default, 2 named explicitly. An unknown
 * collective or name: with @p why, -1 and what is wrong there; without, a
 * warning and the rest is parsed. */
static int parse_list(const char *var, const char *text, const char *const *names, int n_names,
                      unsigned char mask[CFX_PLAN_COLLS][CFX_ALGO_COUNT + CFX_PROTO_COUNT],
                      char *why, size_t why_len)
{
    for (int c = 0; c < CFX_PLAN_COLLS; c++)
        for (int i = 0; i < n_names; i++)
            mask[c][i] = 1;
    if (text == NULL || text[0] == '\0')
        return 0;
    char copy[512];
    snprintf(copy, sizeof(copy), "%s", text);
    char *save_section = NULL;
    for (char *section = strtok_r(copy, ";", &save_section); section;
         section = strtok_r(NULL, ";", &save_section)) {
        section = trim(section);
        int first = 0, last = CFX_PLAN_COLLS - 1;
        char *colon = strchr(section, ':');
        if (colon) {
            *colon = '\0';
            char *key = trim(section);
            int coll = -1;
            for (int c = 0; c < CFX_PLAN_COLLS; c++)
                if (strcasecmp(key, coll_keys[c]) == 0)
                    coll = c;
            if (coll < 0 && why) {
                snprintf(why, why_len,
                         "no collective \"%s\"; expected allreduce, broadcast, reduce, "
                         "allgather or reducescatter before ':'",
                         key);
                return -1;
            }
            if (coll < 0) {
                CFX_WARN(CFX_LOG_ENV | CFX_LOG_TUNING,
                         "%s=\"%s\": no collective \"%s\"; "
                         "section ignored",
                         var, text, key);
                continue;
            }
            first = last = coll;
            section = trim(colon + 1);
        }
        int exclude = section[0] == '^';
        unsigned char list[CFX_ALGO_COUNT + CFX_PROTO_COUNT];
        for (int i = 0; i < n_names; i++)
            list[i] = exclude ? 1 : 0;
        char *save_word = NULL;
        for (char *word = strtok_r(section + exclude, ",", &save_word); word;
             word = strtok_r(NULL, ",", &save_word)) {
            word = trim(word);
            int found = 0;
            for (int i = 0; i < n_names; i++)
                if (strcasecmp(word, names[i]) == 0) {
                    list[i] = exclude ? 0 : 2;
                    found = 1;
                }
            if (!found && !nccl_only(word) && word[0] && why) {
                snprintf(why, why_len, "unknown name \"%s\"; expected a list of %s", word,
                         names == algo_names ? "ring, tree, direct, twoshot (NCCL syntax, see "
                                               "docs/tuning.md)"
                                             : "LL, LL128, Simple (NCCL syntax, see "
                                               "docs/tuning.md)");
                return -1;
            }
            if (!found && nccl_only(word))
                CFX_INFO(CFX_LOG_ENV | CFX_LOG_TUNING, "%s: %s is not built in Conflux; ignored",
                         var, word);
            else if (!found && word[0])
                CFX_WARN(CFX_LOG_ENV | CFX_LOG_TUNING, "%s=\"%s\": unknown name \"%s\" ignored",
                         var, text, word);
        }
        for (int c = first; c <= last; c++)
            memcpy(mask[c], list, (size_t)n_names);
    }
    return 0;
}

static const char *check_algo(const char *text, char *buf, size_t len)
{
    unsigned char mask[CFX_PLAN_COLLS][CFX_ALGO_COUNT + CFX_PROTO_COUNT];
    return parse_list("CFX_ALGO", text, algo_names, CFX_ALGO_COUNT, mask, buf, len) ? buf : NULL;
}

static const char *check_proto(const char *text, char *buf, size_t len)
{
    unsigned char mask[CFX_PLAN_COLLS][CFX_ALGO_COUNT + CFX_PROTO_COUNT];
    return parse_list("CFX_PROTO", text, proto_names, CFX_PROTO_COUNT, mask, buf, len) ? buf : NULL;
}

CFX_PARAM_STR_CHECKED(
    algo, "ALGO", NULL, check_algo,
    "Algorithms the planner may use (NCCL syntax: ring, tree, direct, twoshot, ^tree, "
    "allreduce:tree;broadcast:ring)");
CFX_PARAM_STR_CHECKED(proto, "PROTO", NULL, check_proto,
                      "Protocols the planner may use (NCCL syntax: LL, LL128, Simple, ^LL128, "
                      "allreduce:^LL)");

void cfx_plan_tuning_init(struct cfx_plan *plan)
{
    struct cfx_plan_model *md = &plan->model;
    unsigned char algo_mask[CFX_PLAN_COLLS][CFX_ALGO_COUNT + CFX_PROTO_COUNT];
    unsigned char proto_mask[CFX_PLAN_COLLS][CFX_ALGO_COUNT + CFX_PROTO_COUNT];
    const char *algo_text = param_algo(), *proto_text = param_proto();
    parse_list("CFX_ALGO", algo_text, algo_names, CFX_ALGO_COUNT, algo_mask, NULL, 0);
    parse_list("CFX_PROTO", proto_text, proto_names, CFX_PROTO_COUNT, proto_mask, NULL, 0);
    int warned_host = 0;
    for (int c = 0; c < CFX_PLAN_COLLS; c++)
        for (int a = 0; a < CFX_ALGO_COUNT; a++)
            for (int p = 0; p < CFX_PROTO_COUNT; p++) {
                int on = algo_mask[c][a] && proto_mask[c][p];
                if (md->host_ranks && p != CFX_PROTO_SIMPLE) {
                    if (proto_mask[c][p] == 2 && !warned_host++)
                        CFX_WARN(CFX_LOG_ENV | CFX_LOG_TUNING,
                                 "CFX_PROTO=%s: host ranks have only the Simple protocol",
                                 proto_text);
                    on = 0;
                }
                /* LL128 by default only where every hop inside hosts is NVLink. */
                if (p == CFX_PROTO_LL128 && proto_mask[c][p] == 1 && md->intra_class > CFX_LINK_NVL)
                    on = 0;
                md->enabled[c][a][p] = (unsigned char)on;
            }
    if (algo_text && algo_text[0])
        CFX_INFO(CFX_LOG_ENV | CFX_LOG_TUNING, "CFX_ALGO set to %s", algo_text);
    if (proto_text && proto_text[0])
        CFX_INFO(CFX_LOG_ENV | CFX_LOG_TUNING, "CFX_PROTO set to %s", proto_text);
}

/* ------------------------------------------------------------ choosing */

static int size_bucket(size_t bytes)
{
    return bytes ? 63 - __builtin_clzll((unsigned long long)bytes) : 0;
}

static void explain(struct cfx_plan *plan, enum cfx_coll_kind coll, size_t bytes,
                    const struct cfx_plan_choice *choice, int fallback)
{
    int bucket = size_bucket(bytes);
    uint64_t bit = UINT64_C(1) << bucket;
    if (atomic_fetch_or(&plan->explained[coll], bit) & bit)
        return;
    char others[1024];
    size_t used = 0;
    others[0] = '\0';
    for (int a = 0; a < CFX_ALGO_COUNT; a++)
        for (int p = 0; p < CFX_PROTO_COUNT; p++) {
            if ((a == (int)choice->algo && p == (int)choice->proto) ||
                (plan->model.host_ranks && p != CFX_PROTO_SIMPLE))
                continue;
            double t = cfx_plan_model_time(plan, coll, a, p, bytes, NULL);
            int n;
            if (!isfinite(t))
                n = snprintf(others + used, sizeof(others) - used, "%s %s/%s cannot run %s",
                             used ? ";" : "", algo_names[a], proto_names[p], cfx_coll_name(coll));
            else if (!plan->model.enabled[coll][a][p])
                n = snprintf(others + used, sizeof(others) - used,
                             "%s %s/%s %.1f us but disabled (CFX_ALGO/CFX_PROTO, or LL128 "
                             "without NVLink)",
                             used ? ";" : "", algo_names[a], proto_names[p], t);
            else
                n = snprintf(others + used, sizeof(others) - used, "%s %s/%s %.1f us",
                             used ? ";" : "", algo_names[a], proto_names[p], t);
            if (n > 0 && (size_t)n < sizeof(others) - used)
                used += (size_t)n;
        }
    double lat = 0;
    cfx_plan_model_time(plan, coll, choice->algo, choice->proto, bytes, &lat);
    const char *bound = lat >= 0.5 * choice->predicted_us ? "latency-bound" : "bandwidth-bound";
    CFX_INFO(CFX_LOG_TUNING,
             "%s %zu B (2^%d bucket) on %d ranks, %d hosts: %s/%s %.1f us (latency %.1f us, %s, "
             "busbw %.1f GB/s, %d channels)%s; others:%s%s",
             cfx_coll_name(coll), bytes, bucket, plan->n_ranks, plan->n_nodes,
             algo_names[choice->algo], proto_names[choice->proto], choice->predicted_us, lat, bound,
             choice->busbw_gbs, choice->n_channels,
             fallback ? " [CFX_ALGO/CFX_PROTO left nothing that runs this collective]" : "", others,
             plan->model.host_ranks ? " (host ranks: Simple only)" : "");
}

/* The fastest (algorithm, protocol) the settings allow; *fallback_p when they
 * allow none that runs @p coll, and the fastest of all was taken. Pure. */
static double pick(const struct cfx_plan *plan, enum cfx_coll_kind coll, size_t bytes, int *algo_p,
                   int *proto_p, int *fallback_p)
{
    int best_a = -1, best_p = -1;
    double best = INFINITY;
    *fallback_p = 0;
    for (int pass = 0; pass < 2 && best_a < 0; pass++) {
        for (int a = 0; a < CFX_ALGO_COUNT; a++)
            for (int p = 0; p < CFX_PROTO_COUNT; p++) {
                if (pass == 0 && !plan->model.enabled[coll][a][p])
                    continue;
                double t = cfx_plan_model_time(plan, coll, a, p, bytes, NULL);
                if (t < best) {
                    best = t;
                    best_a = a;
                    best_p = p;
                }
            }
        if (best_a < 0)
            *fallback_p = 1;
    }
    *algo_p = best_a;
    *proto_p = best_p;
    return best;
}

int cfx_plan_may_pick(const struct cfx_plan *plan, enum cfx_coll_kind coll, enum cfx_plan_algo algo)
{
    if ((unsigned)coll >= CFX_PLAN_COLLS)
        return 0;
    for (int k = 0; k <= 40; k++) {
        int a, p, fallback;
        pick(plan, coll, (size_t)1 << k, &a, &p, &fallback);
        if (a == (int)algo)
            return 1;
    }
    return 0;
}

uint64_t cfx_plan_signature(const struct cfx_plan *plan)
{
    uint64_t h = UINT64_C(14695981039346656037); /* FNV-1a over the decisions. */
#define MIX(v)                                                                                     \
    do {                                                                                           \
        h ^= (uint64_t)(v);                                                                        \
        h *= UINT64_C(1099511628211);                                                              \
    } while (0)
    MIX(plan->n_ranks);
    MIX(plan->n_nodes);
    MIX(plan->n_channels);
    for (int c = 0; c < CFX_PLAN_COLLS; c++)
        for (int k = 0; k <= 40; k++) {
            int a, p, fallback;
            pick(plan, (enum cfx_coll_kind)c, (size_t)1 << k, &a, &p, &fallback);
            MIX(a);
            MIX(p);
        }
    for (int t = 0; t < 2; t++)
        for (int r = 0; r < plan->n_ranks; r++) {
            MIX(plan->trees[t].parent[r]);
            for (int i = 0; i < CFX_PLAN_TREE_MAX_CHILDREN; i++)
                MIX(plan->trees[t].children[r][i]);
        }
    for (int i = 0; i < plan->n_channels * plan->n_ranks; i++)
        MIX(plan->rings[i]);
#undef MIX
    return h;
}

cfxResult_t cfx_plan_choose(struct cfx_plan *plan, enum cfx_coll_kind coll, size_t bytes,
                            struct cfx_plan_choice *out)
{
    if ((unsigned)coll >= CFX_PLAN_COLLS)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_TUNING,
                             "the planner chooses only for collectives, not %s",
                             cfx_coll_name(coll));
    int fallback = 0;
    int best_a, best_p;
    double best = pick(plan, coll, bytes, &best_a, &best_p, &fallback);
    if (best_a < 0) { /* Cannot happen: the ring always runs. */
        best_a = CFX_ALGO_RING;
        best_p = CFX_PROTO_SIMPLE;
        best = 0;
    }
    if (fallback) {
        unsigned bit = 1u << coll;
        if (!(atomic_fetch_or(&plan->fallback_warned, bit) & bit))
            CFX_WARN(CFX_LOG_TUNING,
                     "CFX_ALGO/CFX_PROTO leave nothing that can run %s; using %s/%s",
                     cfx_coll_name(coll), algo_names[best_a], proto_names[best_p]);
    }
    out->algo = (enum cfx_plan_algo)best_a;
    out->proto = (enum cfx_plan_proto)best_p;
    out->n_channels = plan->n_channels;
    out->predicted_us = best;
    out->busbw_gbs = cfx_plan_busbw(coll, plan->n_ranks, bytes, best);
    if (cfx_log_level_value < 0)
        cfx_log_init();
    if (cfx_log_level_value >= CFX_LOG_INFO)
        explain(plan, coll, bytes, out, fallback);
    return cfxSuccess;
}
