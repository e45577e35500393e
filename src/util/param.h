/*
 * Parameters. Each parameter is defined once, in the file that uses it, with
 * CFX_PARAM_INT or CFX_PARAM_STR (name, default, one-line description). Its
 * value comes from the environment, else from the configuration file
 * (CFX_CONF_FILE, else /etc/conflux.conf, "NAME=value" lines), else the
 * default; it is read once and cached. The definitions are collected in the
 * "cfx_params" section, so cfx_param_print_all() lists every parameter the
 * binary contains.
 */
#ifndef CFX_UTIL_PARAM_H
#define CFX_UTIL_PARAM_H

#include <stdint.h>
#include <stdio.h>

enum cfx_param_type { CFX_PARAM_TYPE_INT, CFX_PARAM_TYPE_STR };

struct cfx_param {
    const char *name; /* Full variable name, "CFX_TIMEOUT". */
    enum cfx_param_type type;
    int64_t default_int;
    const char *default_str;
    const char *description;
    /* Cache, filled on first read. */
    int loaded;
    int64_t value_int;
    const char *value_str;
};

int64_t cfx_param_get_int(struct cfx_param *param);
const char *cfx_param_get_str(struct cfx_param *param);

/* The raw value of @p name from the environment or the configuration file,
 * or NULL. Never logs (the logger itself uses it). */
const char *cfx_param_raw(const char *name);

/* Longest configuration-file line, newline included; longer lines are malformed. */
#define CFX_CONF_LINE_MAX 1024

/* Read "NAME=value" lines from @p f into @p names / @p values (at most @p max;
 * trimmed copies the caller frees). Blank lines and lines starting with '#'
 * are skipped; a line without '=', with an empty name, or longer than
 * CFX_CONF_LINE_MAX is malformed and skipped, and *bad_line_p gets the first
 * such line's number (0: none). Returns the number of entries. Touches
 * nothing else (the fuzzer, fuzz/fuzz_conf.c, calls it on any bytes). */
int cfx_param_conf_read(FILE *f, char **names, char **values, int max, int *bad_line_p);

/* Print every parameter: name, value, source, default, description. */
void cfx_param_print_all(FILE *out);

/* Forget cached values and the configuration file (tests). */
void cfx_param_reset_all(void);

#define CFX_PARAM_DEFINE_(fn, var_name, kind, def_int, def_str, desc)                       \
    static struct cfx_param param_def_##fn = {.name = var_name,                            \
                                              .type = kind,                                \
                                              .default_int = def_int,                      \
                                              .default_str = def_str,                      \
                                              .description = desc};                        \
    static struct cfx_param *const param_ptr_##fn                                          \
        __attribute__((used, section("cfx_params"), aligned(sizeof(void *)))) =            \
            &param_def_##fn

/* Defines `static int64_t param_<fn>(void)` reading CFX_<SUFFIX>. */
#define CFX_PARAM_INT(fn, suffix, def, desc)                                               \
    CFX_PARAM_DEFINE_(fn, "CFX_" suffix, CFX_PARAM_TYPE_INT, def, NULL, desc);             \
    static inline int64_t param_##fn(void) { return cfx_param_get_int(&param_def_##fn); } \
    struct cfx_param_semicolon_##fn

/* Defines `static const char *param_<fn>(void)` reading CFX_<SUFFIX>; NULL default allowed. */
#define CFX_PARAM_STR(fn, suffix, def, desc)                                               \
    CFX_PARAM_DEFINE_(fn, "CFX_" suffix, CFX_PARAM_TYPE_STR, 0, def, desc);                \
    static inline const char *param_##fn(void) { return cfx_param_get_str(&param_def_##fn); } \
    struct cfx_param_semicolon_##fn

#endif /* CFX_UTIL_PARAM_H */
