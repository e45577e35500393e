/*
 * Parameters. Each parameter is defined once, in the file that uses it, with
 * CFX_PARAM_INT, CFX_PARAM_SIZE, CFX_PARAM_STR or their _CHECKED forms (name,
 * default, accepted values, one-line description). Its value comes from the
 * environment, else from the configuration file (CFX_CONF_FILE, else
 * /etc/conflux.conf, "NAME=value" lines), else the default; it is read once
 * and cached. The definitions are collected in the "cfx_params" section, so
 * cfx_param_print_all() lists every parameter the binary contains and
 * cfx_param_check_all() checks them all.
 *
 * Accepted values: an INT is a decimal integer (an optional sign, digits;
 * no 0x, no octal, no exponent) within [min, max]; a SIZE is the same with an
 * optional K, M or G (powers of 1024, either case) and an optional B, as
 * conflux-perf reads sizes; a STR is any text. A definition may add a check
 * function for what a range cannot say. A value that is not accepted is never
 * used: the getter returns the default (and warns once), and
 * cfx_param_check_all(), called at the API entries that start communicators,
 * fails with cfxInvalidArgument and a sentence naming the variable, the value
 * and the accepted form.
 */
#ifndef CFX_UTIL_PARAM_H
#define CFX_UTIL_PARAM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "conflux.h"

/* Most seconds a timeout parameter may say (about 31 years): times 1e9
 * (nanoseconds), plus a clock reading, it still fits in int64_t. */
#define CFX_PARAM_SECONDS_MAX 1000000000

enum cfx_param_type { CFX_PARAM_TYPE_INT, CFX_PARAM_TYPE_SIZE, CFX_PARAM_TYPE_STR };

/* What a range cannot say about a value (a set of choices, a syntax, a file
 * that must parse). Returns NULL when @p text (already trimmed, and for INT
 * and SIZE already within range) is accepted; else a phrase that says what is
 * accepted or what is wrong, "4, 6, or 0 for either", written into @p buf
 * (@p len bytes) or a static string. Must not keep @p text; may be called
 * from any thread, more than once. */
typedef const char *(*cfx_param_check_fn)(const char *text, char *buf, size_t len);

struct cfx_param {
    const char *name; /* Full variable name, "CFX_TIMEOUT". */
    enum cfx_param_type type;
    int64_t default_int;
    int64_t min_int, max_int; /* INT and SIZE: accepted range, both ends included. */
    const char *default_str;
    cfx_param_check_fn check; /* NULL: the range (or any text) is enough. */
    const char *description;
    /* Cache, filled on first read. */
    int loaded;
    int valid; /* 0: the value set is not accepted and the default is used. */
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

/* Print every parameter: name, value, default, description; a value that is
 * not accepted shows as REFUSED, with its sentence below the table. Returns
 * the number of refused values. */
int cfx_param_print_all(FILE *out);

/* Check every parameter's value. cfxSuccess when all are accepted; else
 * cfxInvalidArgument with, in cfxGetLastError, a sentence naming the first
 * refused variable, its value, where it came from, and the accepted form. */
cfxResult_t cfx_param_check_all(void);

/* Parse @p text as an INT (@p size 0) or a SIZE (@p size 1) into *value_p:
 * 0 on success, -1 if it is not one or does not fit in int64_t (no range
 * check). Spaces around the number are allowed. */
int cfx_param_parse_int(const char *text, int size, int64_t *value_p);

/* Forget cached values and the configuration file (tests). */
void cfx_param_reset_all(void);

#define CFX_PARAM_DEFINE_(fn, var_name, kind, def_int, lo, hi, def_str, check_fn, desc)            \
    static struct cfx_param param_def_##fn = {.name = var_name,                                    \
                                              .type = kind,                                        \
                                              .default_int = def_int,                              \
                                              .min_int = lo,                                       \
                                              .max_int = hi,                                       \
                                              .default_str = def_str,                              \
                                              .check = check_fn,                                   \
                                              .description = desc};                                \
    static struct cfx_param *const param_ptr_##fn                                                  \
        __attribute__((used, section("cfx_params"), aligned(sizeof(void *)))) = &param_def_##fn

/* Defines `static int64_t param_<fn>(void)` reading CFX_<SUFFIX>, a decimal
 * integer in [lo, hi]. */
#define CFX_PARAM_INT(fn, suffix, def, lo, hi, desc)                                               \
    CFX_PARAM_INT_CHECKED(fn, suffix, def, lo, hi, NULL, desc)

/* Same, and @p check (a cfx_param_check_fn) must accept the value too. */
#define CFX_PARAM_INT_CHECKED(fn, suffix, def, lo, hi, check, desc)                                \
    CFX_PARAM_DEFINE_(fn, "CFX_" suffix, CFX_PARAM_TYPE_INT, def, lo, hi, NULL, check, desc);      \
    static inline __attribute__((unused)) int64_t param_##fn(void)                                 \
    {                                                                                              \
        return cfx_param_get_int(&param_def_##fn);                                                 \
    }                                                                                              \
    struct cfx_param_semicolon_##fn

/* Defines `static int64_t param_<fn>(void)` reading CFX_<SUFFIX>, bytes in
 * [lo, hi] written as a decimal integer with an optional K, M or G. */
#define CFX_PARAM_SIZE(fn, suffix, def, lo, hi, desc)                                              \
    CFX_PARAM_DEFINE_(fn, "CFX_" suffix, CFX_PARAM_TYPE_SIZE, def, lo, hi, NULL, NULL, desc);      \
    static inline __attribute__((unused)) int64_t param_##fn(void)                                 \
    {                                                                                              \
        return cfx_param_get_int(&param_def_##fn);                                                 \
    }                                                                                              \
    struct cfx_param_semicolon_##fn

/* Defines `static const char *param_<fn>(void)` reading CFX_<SUFFIX>; NULL default allowed. */
#define CFX_PARAM_STR(fn, suffix, def, desc) CFX_PARAM_STR_CHECKED(fn, suffix, def, NULL, desc)

/* Same, and @p check (a cfx_param_check_fn) must accept the value. */
#define CFX_PARAM_STR_CHECKED(fn, suffix, def, check, desc)                                        \
    CFX_PARAM_DEFINE_(fn, "CFX_" suffix, CFX_PARAM_TYPE_STR, 0, 0, 0, def, check, desc);           \
    static inline __attribute__((unused)) const char *param_##fn(void)                             \
    {                                                                                              \
        return cfx_param_get_str(&param_def_##fn);                                                 \
    }                                                                                              \
    struct cfx_param_semicolon_##fn

#endif /* CFX_UTIL_PARAM_H */
