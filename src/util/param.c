/* Parameters: see param.h. */
#include "src/util/param.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "src/util/error.h"
#include "src/util/log.h"

#define CONF_MAX_ENTRIES 256
#define JUDGE_MAX        320 /* Room for the accepted form or a check's phrase. */

extern struct cfx_param *const __start_cfx_params[] __attribute__((weak, visibility("hidden")));
extern struct cfx_param *const __stop_cfx_params[] __attribute__((weak, visibility("hidden")));

static pthread_mutex_t param_lock = PTHREAD_MUTEX_INITIALIZER;
static int conf_loaded;
static int conf_count;
static char *conf_names[CONF_MAX_ENTRIES];
static char *conf_values[CONF_MAX_ENTRIES];
static char conf_path[512];
static int conf_bad_line; /* First malformed line, reported once at the first typed read. */

static char *trim(char *text)
{
    while (isspace((unsigned char)*text))
        text++;
    char *end = text + strlen(text);
    while (end > text && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return text;
}

int cfx_param_conf_read(FILE *f, char **names, char **values, int max, int *bad_line_p)
{
    char line[CFX_CONF_LINE_MAX];
    int line_no = 0, count = 0;
    *bad_line_p = 0;
    while (count < max && fgets(line, sizeof(line), f)) {
        line_no++;
        size_t len = strlen(line);
        if (len == sizeof(line) - 1 && line[len - 1] != '\n' && !feof(f)) {
            /* Too long: skip the rest, rather than read it as lines of its own. */
            int c;
            while ((c = fgetc(f)) != EOF && c != '\n')
                ;
            if (*bad_line_p == 0)
                *bad_line_p = line_no;
            continue;
        }
        char *text = trim(line);
        if (text[0] == '\0' || text[0] == '#')
            continue;
        char *eq = strchr(text, '=');
        if (eq == NULL) {
            if (*bad_line_p == 0)
                *bad_line_p = line_no;
            continue;
        }
        *eq = '\0';
        char *name = trim(text);
        char *value = trim(eq + 1);
        if (name[0] == '\0') {
            if (*bad_line_p == 0)
                *bad_line_p = line_no;
            continue;
        }
        names[count] = strdup(name);
        values[count] = strdup(value);
        if (names[count] && values[count]) {
            count++;
        } else {
            free(names[count]);
            free(values[count]);
        }
    }
    return count;
}

/* Called with param_lock held. Silent: malformed lines are reported later. */
static void conf_load_locked(void)
{
    if (conf_loaded)
        return;
    conf_loaded = 1;
    const char *path = getenv("CFX_CONF_FILE");
    if (path == NULL || path[0] == '\0')
        path = "/etc/conflux.conf";
    snprintf(conf_path, sizeof(conf_path), "%s", path);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    conf_count = cfx_param_conf_read(f, conf_names, conf_values, CONF_MAX_ENTRIES, &conf_bad_line);
    fclose(f);
}

static const char *lookup(const char *name, const char **source_p)
{
    const char *env = getenv(name);
    if (env != NULL) {
        *source_p = "environment";
        return env;
    }
    pthread_mutex_lock(&param_lock);
    conf_load_locked();
    const char *value = NULL;
    for (int i = conf_count - 1; i >= 0 && value == NULL; i--)
        if (strcmp(conf_names[i], name) == 0)
            value = conf_values[i];
    pthread_mutex_unlock(&param_lock);
    *source_p = value ? conf_path : "default";
    return value;
}

const char *cfx_param_raw(const char *name)
{
    const char *source;
    return lookup(name, &source);
}

static void report_conf_once(void)
{
    static int reported;
    int line = 0;
    pthread_mutex_lock(&param_lock);
    if (!reported && conf_bad_line) {
        reported = 1;
        line = conf_bad_line;
    }
    pthread_mutex_unlock(&param_lock);
    if (line)
        CFX_WARN(CFX_LOG_ENV, "%s line %d is not NAME=value; ignored", conf_path, line);
}

int cfx_param_parse_int(const char *text, int size, int64_t *value_p)
{
    const char *c = text;
    while (isspace((unsigned char)*c))
        c++;
    int negative = 0;
    if (*c == '+' || *c == '-')
        negative = *c++ == '-';
    if (!isdigit((unsigned char)*c))
        return -1;
    uint64_t magnitude = 0;
    for (; isdigit((unsigned char)*c); c++) {
        magnitude = magnitude * 10 + (uint64_t)(*c - '0');
        if (magnitude > (uint64_t)INT64_MAX)
            return -1;
    }
    unsigned shift = 0;
    if (size) {
        switch (*c) {
        case 'k':
        case 'K': shift = 10; break;
        case 'm':
        case 'M': shift = 20; break;
        case 'g':
        case 'G': shift = 30; break;
        default: break;
        }
        if (shift)
            c++;
        if (*c == 'b' || *c == 'B')
            c++;
    }
    while (isspace((unsigned char)*c))
        c++;
    if (*c != '\0' || magnitude > ((uint64_t)INT64_MAX >> shift))
        return -1;
    int64_t value = (int64_t)(magnitude << shift);
    *value_p = negative ? -value : value;
    return 0;
}

/* NULL if @p text is an accepted value of @p param (*value_p: the number, for
 * INT and SIZE); else what is accepted, in @p buf or static. */
static const char *judge(const struct cfx_param *param, const char *text, int64_t *value_p,
                         char *buf, size_t len)
{
    char trimmed[CFX_CONF_LINE_MAX];
    snprintf(trimmed, sizeof(trimmed), "%s", text);
    char *word = trim(trimmed);
    if (param->type != CFX_PARAM_TYPE_STR) {
        int64_t value = 0;
        int size = param->type == CFX_PARAM_TYPE_SIZE;
        if (cfx_param_parse_int(word, size, &value) != 0 || value < param->min_int ||
            value > param->max_int) {
            snprintf(buf, len, "expected a decimal integer from %lld to %lld%s",
                     (long long)param->min_int, (long long)param->max_int,
                     size ? " (bytes; K, M or G may follow: powers of 1024)" : "");
            return buf;
        }
        *value_p = value;
    }
    return param->check ? param->check(word, buf, len) : NULL;
}

static void refused_sentence(const struct cfx_param *param, const char *text, const char *source,
                             const char *why, char *out, size_t len)
{
    snprintf(out, len, "%s=\"%.64s\" (%s) is not accepted: %s", param->name, text, source, why);
}

/* Fill @p param's cache (threads may do it at once, with the same value). */
static void load(struct cfx_param *param)
{
    const char *source;
    const char *text = lookup(param->name, &source);
    report_conf_once();
    int64_t value_int = param->default_int;
    const char *value_str = param->default_str;
    int valid = 1;
    if (text != NULL) {
        char why[JUDGE_MAX];
        int64_t parsed = 0;
        const char *refused = judge(param, text, &parsed, why, sizeof(why));
        if (refused != NULL) {
            char sentence[CFX_ERROR_MAX];
            refused_sentence(param, text, source, refused, sentence, sizeof(sentence));
            CFX_WARN(CFX_LOG_ENV, "%s; communicators refuse to start until it is fixed", sentence);
            valid = 0;
        } else if (param->type == CFX_PARAM_TYPE_STR) {
            /* Environment strings live as long as the process (unless the
             * program changes them); configuration values live until
             * cfx_param_reset_all. */
            value_str = text;
            CFX_INFO(CFX_LOG_ENV, "%s set by %s to \"%s\"", param->name, source, text);
        } else {
            value_int = parsed;
            CFX_INFO(CFX_LOG_ENV, "%s set by %s to %lld", param->name, source, (long long)parsed);
        }
    }
    __atomic_store_n(&param->value_int, value_int, __ATOMIC_RELAXED);
    __atomic_store_n(&param->value_str, value_str, __ATOMIC_RELAXED);
    __atomic_store_n(&param->valid, valid, __ATOMIC_RELAXED);
    __atomic_store_n(&param->loaded, 1, __ATOMIC_RELEASE);
}

int64_t cfx_param_get_int(struct cfx_param *param)
{
    if (!__atomic_load_n(&param->loaded, __ATOMIC_ACQUIRE))
        load(param);
    return __atomic_load_n(&param->value_int, __ATOMIC_RELAXED);
}

const char *cfx_param_get_str(struct cfx_param *param)
{
    if (!__atomic_load_n(&param->loaded, __ATOMIC_ACQUIRE))
        load(param);
    return __atomic_load_n(&param->value_str, __ATOMIC_RELAXED);
}

/* Loads @p param; 0 if its value is accepted, else -1 with the sentence in @p out. */
static int check_one(struct cfx_param *param, char *out, size_t len)
{
    if (!__atomic_load_n(&param->loaded, __ATOMIC_ACQUIRE))
        load(param);
    if (__atomic_load_n(&param->valid, __ATOMIC_RELAXED))
        return 0;
    /* Refused: judge again for the sentence (rare; not worth a cache). */
    const char *source;
    const char *text = lookup(param->name, &source);
    char why[JUDGE_MAX];
    int64_t parsed;
    const char *refused = text ? judge(param, text, &parsed, why, sizeof(why)) : NULL;
    if (refused == NULL) /* Changed since it was read (tests). */
        refused = "the value changed after it was read; restart the process";
    refused_sentence(param, text ? text : "", source, refused, out, len);
    return -1;
}

cfxResult_t cfx_param_check_all(void)
{
    if (__start_cfx_params == NULL)
        return cfxSuccess;
    for (struct cfx_param *const *p = __start_cfx_params; p < __stop_cfx_params; p++) {
        char sentence[CFX_ERROR_MAX];
        if (check_one(*p, sentence, sizeof(sentence)) != 0)
            return cfx_error_set(cfxInvalidArgument, CFX_LOG_ENV, "%s", sentence);
    }
    return cfxSuccess;
}

int cfx_param_print_all(FILE *out)
{
    if (__start_cfx_params == NULL)
        return 0;
    int n_refused = 0;
    fprintf(out, "%-28s %-14s %-14s %s\n", "# name", "value", "default", "description");
    for (struct cfx_param *const *p = __start_cfx_params; p < __stop_cfx_params; p++) {
        struct cfx_param *param = *p;
        char value[64], def[64], sentence[CFX_ERROR_MAX];
        if (check_one(param, sentence, sizeof(sentence)) != 0) {
            snprintf(value, sizeof(value), "REFUSED");
            n_refused++;
        } else if (param->type != CFX_PARAM_TYPE_STR) {
            snprintf(value, sizeof(value), "%lld", (long long)cfx_param_get_int(param));
        } else {
            const char *v = cfx_param_get_str(param);
            snprintf(value, sizeof(value), "%s", v ? v : "(unset)");
        }
        if (param->type != CFX_PARAM_TYPE_STR)
            snprintf(def, sizeof(def), "%lld", (long long)param->default_int);
        else
            snprintf(def, sizeof(def), "%s", param->default_str ? param->default_str : "(unset)");
        fprintf(out, "%-28s %-14s %-14s %s\n", param->name, value, def, param->description);
    }
    for (struct cfx_param *const *p = __start_cfx_params; p < __stop_cfx_params; p++) {
        char sentence[CFX_ERROR_MAX];
        if (check_one(*p, sentence, sizeof(sentence)) != 0)
            fprintf(out, "# REFUSED: %s\n", sentence);
    }
    return n_refused;
}

void cfx_param_reset_all(void)
{
    pthread_mutex_lock(&param_lock);
    if (__start_cfx_params != NULL)
        for (struct cfx_param *const *p = __start_cfx_params; p < __stop_cfx_params; p++)
            __atomic_store_n(&(*p)->loaded, 0, __ATOMIC_RELEASE);
    for (int i = 0; i < conf_count; i++) {
        free(conf_names[i]);
        free(conf_values[i]);
    }
    conf_count = 0;
    conf_loaded = 0;
    conf_bad_line = 0;
    pthread_mutex_unlock(&param_lock);
}
