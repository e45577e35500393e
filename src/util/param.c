/* Parameters: see param.h. */
#include "src/util/param.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "src/util/log.h"

#define CONF_MAX_ENTRIES 256

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

int64_t cfx_param_get_int(struct cfx_param *param)
{
    if (__atomic_load_n(&param->loaded, __ATOMIC_ACQUIRE))
        return __atomic_load_n(&param->value_int, __ATOMIC_RELAXED);
    const char *source;
    const char *text = lookup(param->name, &source);
    int64_t value = param->default_int;
    report_conf_once();
    if (text != NULL) {
        char *end = NULL;
        errno = 0;
        long long parsed = strtoll(text, &end, 0);
        if (errno != 0 || end == text || *trim(end) != '\0')
            CFX_WARN(CFX_LOG_ENV, "%s=\"%s\" (%s) is not an integer; using the default %lld",
                     param->name, text, source, (long long)param->default_int);
        else {
            value = parsed;
            CFX_INFO(CFX_LOG_ENV, "%s set by %s to %lld", param->name, source, parsed);
        }
    }
    /* Threads may fill the cache at once (with the same value): atomics. */
    __atomic_store_n(&param->value_int, value, __ATOMIC_RELAXED);
    __atomic_store_n(&param->loaded, 1, __ATOMIC_RELEASE);
    return value;
}

const char *cfx_param_get_str(struct cfx_param *param)
{
    if (__atomic_load_n(&param->loaded, __ATOMIC_ACQUIRE))
        return __atomic_load_n(&param->value_str, __ATOMIC_RELAXED);
    const char *source;
    const char *text = lookup(param->name, &source);
    report_conf_once();
    if (text != NULL)
        CFX_INFO(CFX_LOG_ENV, "%s set by %s to \"%s\"", param->name, source, text);
    /* Environment strings live as long as the process (unless the program
     * changes them); configuration values live until cfx_param_reset_all. */
    const char *value = text ? text : param->default_str;
    __atomic_store_n(&param->value_str, value, __ATOMIC_RELAXED);
    __atomic_store_n(&param->loaded, 1, __ATOMIC_RELEASE);
    return value;
}

void cfx_param_print_all(FILE *out)
{
    if (__start_cfx_params == NULL)
        return;
    fprintf(out, "%-28s %-14s %-14s %s\n", "# name", "value", "default", "description");
    for (struct cfx_param *const *p = __start_cfx_params; p < __stop_cfx_params; p++) {
        struct cfx_param *param = *p;
        char value[64], def[64];
        if (param->type == CFX_PARAM_TYPE_INT) {
            snprintf(value, sizeof(value), "%lld", (long long)cfx_param_get_int(param));
            snprintf(def, sizeof(def), "%lld", (long long)param->default_int);
        } else {
            const char *v = cfx_param_get_str(param);
            snprintf(value, sizeof(value), "%s", v ? v : "(unset)");
            snprintf(def, sizeof(def), "%s", param->default_str ? param->default_str : "(unset)");
        }
        fprintf(out, "%-28s %-14s %-14s %s\n", param->name, value, def, param->description);
    }
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
