/* Logging: see log.h. */
#include "src/util/log.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <unistd.h>

#include "src/util/param.h"

int cfx_log_level_value = -1;

static unsigned subsys_mask = CFX_LOG_INIT | CFX_LOG_BOOTSTRAP | CFX_LOG_ENV;
static FILE *log_file;
static char host_name[64];
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int log_rank = -1;

static const struct {
    const char *name;
    unsigned bit;
} subsys_names[] = {
    {"INIT", CFX_LOG_INIT},   {"BOOTSTRAP", CFX_LOG_BOOTSTRAP},
    {"ENV", CFX_LOG_ENV},     {"ALLOC", CFX_LOG_ALLOC},
    {"COLL", CFX_LOG_COLL},   {"P2P", CFX_LOG_P2P},
    {"NET", CFX_LOG_NET},     {"SHM", CFX_LOG_SHM},
    {"GRAPH", CFX_LOG_GRAPH}, {"TUNING", CFX_LOG_TUNING},
    {"ALL", CFX_LOG_ALL},
};

static const char *level_names[] = {"NONE", "VERSION", "WARN", "INFO", "TRACE"};

static int parse_level(const char *text)
{
    if (text == NULL)
        return CFX_LOG_NONE;
    for (int level = CFX_LOG_NONE; level <= CFX_LOG_TRACE; level++)
        if (strcasecmp(text, level_names[level]) == 0)
            return level;
    return CFX_LOG_WARN; /* Unknown words still mean "tell me something". */
}

/* "INIT,NET" enables those; "^NET" enables all but NET. */
static unsigned parse_subsys(const char *text)
{
    if (text == NULL || text[0] == '\0')
        return subsys_mask;
    int invert = text[0] == '^';
    unsigned mask = 0;
    char list[256];
    snprintf(list, sizeof(list), "%s", text + invert);
    char *save = NULL;
    for (char *word = strtok_r(list, ",", &save); word; word = strtok_r(NULL, ",", &save))
        for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
            if (strcasecmp(word, subsys_names[i].name) == 0)
                mask |= subsys_names[i].bit;
    return invert ? ~mask : mask;
}

static const char *subsys_name(unsigned subsys)
{
    for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
        if (subsys & subsys_names[i].bit)
            return subsys_names[i].name;
    return "ALL";
}

/* Expand %h (host) and %p (pid) in a CFX_DEBUG_FILE pattern. */
static void expand_path(const char *pattern, char *path, size_t size)
{
    size_t used = 0;
    for (const char *c = pattern; *c && used + 1 < size; c++) {
        int n = 0;
        if (c[0] == '%' && c[1] == 'h') {
            n = snprintf(path + used, size - used, "%s", host_name);
            c++;
        } else if (c[0] == '%' && c[1] == 'p') {
            n = snprintf(path + used, size - used, "%d", (int)getpid());
            c++;
        } else {
            path[used] = *c;
            n = 1;
        }
        used += (size_t)n < size - used ? (size_t)n : size - used - 1;
    }
    path[used] = '\0';
}

void cfx_log_init(void)
{
    pthread_mutex_lock(&log_lock);
    if (cfx_log_level_value < 0) {
        gethostname(host_name, sizeof(host_name) - 1);
        char *dot = strchr(host_name, '.');
        if (dot)
            *dot = '\0';
        subsys_mask = parse_subsys(cfx_param_raw("CFX_DEBUG_SUBSYS"));
        log_file = stderr;
        const char *pattern = cfx_param_raw("CFX_DEBUG_FILE");
        if (pattern && pattern[0]) {
            char path[PATH_MAX];
            expand_path(pattern, path, sizeof(path));
            FILE *f = fopen(path, "a");
            if (f) {
                setvbuf(f, NULL, _IOLBF, 0);
                log_file = f;
            }
        }
        /* Published last: other threads test it without the lock. */
        __atomic_store_n(&cfx_log_level_value, parse_level(cfx_param_raw("CFX_DEBUG")),
                         __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&log_lock);
}

void cfx_log_reset(void)
{
    pthread_mutex_lock(&log_lock);
    if (log_file && log_file != stderr)
        fclose(log_file);
    log_file = NULL;
    subsys_mask = CFX_LOG_INIT | CFX_LOG_BOOTSTRAP | CFX_LOG_ENV;
    __atomic_store_n(&cfx_log_level_value, -1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&log_lock);
}

int cfx_log_set_rank(int rank)
{
    int before = log_rank;
    log_rank = rank;
    return before;
}

void cfx_log(enum cfx_log_level level, unsigned subsys, const char *file, int line, const char *fmt,
             ...)
{
    /* WARN and VERSION always show; INFO and TRACE obey CFX_DEBUG_SUBSYS. */
    if (level > CFX_LOG_WARN && (subsys & subsys_mask) == 0)
        return;
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    struct timeval now;
    gettimeofday(&now, NULL);
    pthread_mutex_lock(&log_lock);
    FILE *out = log_file ? log_file : stderr;
    if (level == CFX_LOG_TRACE)
        fprintf(out, "%s:%d:%d [%d] %ld.%06ld CFX TRACE %s %s:%d %s\n", host_name, (int)getpid(),
                (int)gettid(), log_rank, (long)now.tv_sec, (long)now.tv_usec, subsys_name(subsys),
                file, line, text);
    else
        fprintf(out, "%s:%d:%d [%d] CFX %s %s %s\n", host_name, (int)getpid(), (int)gettid(),
                log_rank, level_names[level], subsys_name(subsys), text);
    fflush(out);
    pthread_mutex_unlock(&log_lock);
}
