/*
 * Logging. CFX_DEBUG picks the level (VERSION, WARN, INFO, TRACE),
 * CFX_DEBUG_SUBSYS the subsystems (comma list, ^ to exclude), CFX_DEBUG_FILE
 * the destination (%h host, %p pid). Every line carries host, pid, rank and
 * subsystem. Logging is cheap when off: the macros test the level first.
 */
#ifndef CFX_UTIL_LOG_H
#define CFX_UTIL_LOG_H

#include <stdint.h>

enum cfx_log_level {
    CFX_LOG_NONE = 0,
    CFX_LOG_VERSION = 1,
    CFX_LOG_WARN = 2,
    CFX_LOG_INFO = 3,
    CFX_LOG_TRACE = 4
};

/* Subsystems, one bit each. Keep in step with the names in log.c. */
enum cfx_log_subsys {
    CFX_LOG_INIT = 1u << 0,
    CFX_LOG_BOOTSTRAP = 1u << 1,
    CFX_LOG_ENV = 1u << 2,
    CFX_LOG_ALLOC = 1u << 3,
    CFX_LOG_COLL = 1u << 4,
    CFX_LOG_P2P = 1u << 5,
    CFX_LOG_NET = 1u << 6,
    CFX_LOG_SHM = 1u << 7,
    CFX_LOG_GRAPH = 1u << 8,
    CFX_LOG_TUNING = 1u << 9,
    CFX_LOG_ALL = ~0u
};

/* Effective level, read from the environment on first use. */
extern int cfx_log_level_value;
void cfx_log_init(void);

/* Write one line if @p level and @p subsys are enabled. */
void cfx_log(enum cfx_log_level level, unsigned subsys, const char *file, int line, const char *fmt,
             ...) __attribute__((format(printf, 5, 6)));

/* Rank shown in this thread's log lines (-1: none); returns the one before. */
int cfx_log_set_rank(int rank);

/* Reset the cached configuration so the next line re-reads the environment (tests). */
void cfx_log_reset(void);

#define CFX_LOG_(level, subsys, ...)                                                               \
    do {                                                                                           \
        if (cfx_log_level_value < 0)                                                               \
            cfx_log_init();                                                                        \
        if (cfx_log_level_value >= (level))                                                        \
            cfx_log((level), (subsys), __FILE__, __LINE__, __VA_ARGS__);                           \
    } while (0)

#define CFX_WARN(subsys, ...)  CFX_LOG_(CFX_LOG_WARN, subsys, __VA_ARGS__)
#define CFX_INFO(subsys, ...)  CFX_LOG_(CFX_LOG_INFO, subsys, __VA_ARGS__)
#define CFX_TRACE(subsys, ...) CFX_LOG_(CFX_LOG_TRACE, subsys, __VA_ARGS__)

#endif /* CFX_UTIL_LOG_H */
