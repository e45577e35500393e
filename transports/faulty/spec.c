/*
 * CFX_FAULT's syntax: a comma-separated list of rules, each a kind and
 * ":key=value" options. Numbers are decimal, with an optional K, M or G
 * (powers of 1024). Pure: the fuzzer (fuzz/fuzz_fault_spec.c) calls it with
 * any bytes.
 */
#include <stdio.h>
#include <string.h>

#include "transports/faulty/faulty.h"

#define MAX_TEXT     1024
#define MAX_NUMBER   (UINT64_C(1) << 62)
#define MAX_DELAY_MS (UINT64_C(24) * 3600 * 1000)

static const char *kind_names[] = {NULL, "drop", "delay", "truncate", "corrupt", "close", "kill"};

const char *cfx_fault_kind_name(enum cfx_fault_kind kind)
{
    return kind >= CFX_FAULT_DROP && kind <= CFX_FAULT_KILL ? kind_names[kind] : "?";
}

/* A token of the text: [start, start + len). */
struct token {
    const char *start;
    size_t len;
};

static int token_is(struct token tok, const char *word)
{
    return tok.len == strlen(word) && memcmp(tok.start, word, tok.len) == 0;
}

/* Decimal with an optional K/M/G suffix, at most MAX_NUMBER. */
static int parse_number(struct token tok, uint64_t *value_p)
{
    uint64_t value = 0;
    size_t i = 0;
    if (tok.len == 0)
        return 0;
    for (; i < tok.len && tok.start[i] >= '0' && tok.start[i] <= '9'; i++) {
        value = value * 10 + (uint64_t)(tok.start[i] - '0');
        if (value > MAX_NUMBER)
            return 0;
    }
    if (i == 0)
        return 0;
    if (i + 1 == tok.len) {
        int shift = 0;
        switch (tok.start[i]) {
        case 'k':
        case 'K': shift = 10; break;
        case 'm':
        case 'M': shift = 20; break;
        case 'g':
        case 'G': shift = 30; break;
        default: return 0;
        }
        if (value > MAX_NUMBER >> shift)
            return 0;
        value <<= shift;
        i++;
    }
    if (i != tok.len)
        return 0;
    *value_p = value;
    return 1;
}

static cfxResult_t fail(char *why, size_t why_size, int rule, struct token tok, const char *what)
{
    if (why_size > 0)
        snprintf(why, why_size, "rule %d: %s \"%.*s\"", rule + 1, what,
                 (int)(tok.len > 64 ? 64 : tok.len), tok.start);
    return cfxInvalidArgument;
}

/* One "key=value" option of @p rule. */
static cfxResult_t parse_option(struct cfx_fault_rule *rule, int index, struct token opt, char *why,
                                size_t why_size)
{
    const char *eq = memchr(opt.start, '=', opt.len);
    if (eq == NULL)
        return fail(why, why_size, index, opt, "expected key=value, got");
    struct token key = {opt.start, (size_t)(eq - opt.start)};
    struct token val = {eq + 1, opt.len - key.len - 1};
    if (token_is(key, "what")) {
        if (rule->kind != CFX_FAULT_CORRUPT)
            return fail(why, why_size, index, key, "only corrupt takes");
        if (token_is(val, "data"))
            rule->what = CFX_FAULT_DATA;
        else if (token_is(val, "print"))
            rule->what = CFX_FAULT_PRINT;
        else
            return fail(why, why_size, index, val, "what= is data or print, not");
        return cfxSuccess;
    }
    if (token_is(key, "at")) {
        if (rule->kind != CFX_FAULT_KILL)
            return fail(why, why_size, index, key, "only kill takes");
        if (token_is(val, "data"))
            rule->at = CFX_FAULT_AT_DATA;
        else if (token_is(val, "setup"))
            rule->at = CFX_FAULT_AT_SETUP;
        else if (token_is(val, "connect"))
            rule->at = CFX_FAULT_AT_CONNECT;
        else
            return fail(why, why_size, index, val, "at= is data, setup or connect, not");
        return cfxSuccess;
    }
    uint64_t number;
    if (!parse_number(val, &number))
        return fail(why, why_size, index, val, "not a number (digits, then K, M or G):");
    if (token_is(key, "rank") || token_is(key, "peer")) {
        if (number > INT32_MAX)
            return fail(why, why_size, index, val, "rank out of range:");
        *(token_is(key, "rank") ? &rule->rank : &rule->peer) = (int)number;
    } else if (token_is(key, "after")) {
        rule->after = number;
    } else if (token_is(key, "after_bytes")) {
        rule->after_bytes = number;
    } else if (token_is(key, "count")) {
        rule->count = number;
    } else if (token_is(key, "ms")) {
        if (rule->kind != CFX_FAULT_DELAY)
            return fail(why, why_size, index, key, "only delay takes");
        if (number > MAX_DELAY_MS)
            return fail(why, why_size, index, val, "a delay longer than a day:");
        rule->ms = (int64_t)number;
    } else if (token_is(key, "keep")) {
        if (rule->kind != CFX_FAULT_TRUNCATE)
            return fail(why, why_size, index, key, "only truncate takes");
        rule->keep = (int64_t)number;
    } else if (token_is(key, "offset")) {
        if (rule->kind != CFX_FAULT_CORRUPT)
            return fail(why, why_size, index, key, "only corrupt takes");
        rule->offset = number;
    } else {
        return fail(why, why_size, index, key,
                    "unknown key (rank, peer, after, after_bytes, count, ms, keep, what, "
                    "offset, at):");
    }
    return cfxSuccess;
}

/* One rule: "kind[:key=value]...". */
static cfxResult_t parse_rule(struct token text, int index, struct cfx_fault_rule *rule, char *why,
                              size_t why_size)
{
    const char *end = text.start + text.len;
    const char *colon = memchr(text.start, ':', text.len);
    struct token kind = {text.start, (size_t)((colon ? colon : end) - text.start)};
    *rule = (struct cfx_fault_rule){.rank = -1, .peer = -1, .count = 1, .ms = 100, .keep = -1};
    for (int k = CFX_FAULT_DROP; k <= CFX_FAULT_KILL; k++)
        if (token_is(kind, kind_names[k]))
            rule->kind = (enum cfx_fault_kind)k;
    if (rule->kind == 0)
        return fail(why, why_size, index, kind,
                    "unknown fault (drop, delay, truncate, corrupt, close, kill):");
    if (rule->kind == CFX_FAULT_DELAY)
        rule->count = 0; /* A delay holds every slot unless count says otherwise. */
    for (const char *p = colon; p != NULL && p < end;) {
        const char *start = p + 1;
        const char *next = memchr(start, ':', (size_t)(end - start));
        struct token opt = {start, (size_t)((next ? next : end) - start)};
        cfxResult_t res = parse_option(rule, index, opt, why, why_size);
        if (res != cfxSuccess)
            return res;
        p = next;
    }
    return cfxSuccess;
}

cfxResult_t cfx_fault_spec_parse(const char *text, struct cfx_fault_spec *spec_p, char *why,
                                 size_t why_size)
{
    struct cfx_fault_spec spec = {.n_rules = 0};
    if (why_size > 0)
        why[0] = '\0';
    if (text == NULL || text[0] == '\0') {
        *spec_p = spec;
        return cfxSuccess;
    }
    size_t len = strnlen(text, MAX_TEXT + 1);
    if (len > MAX_TEXT) {
        if (why_size > 0)
            snprintf(why, why_size, "longer than %d characters", MAX_TEXT);
        return cfxInvalidArgument;
    }
    const char *end = text + len;
    for (const char *p = text; p <= end;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        struct token rule = {p, (size_t)((comma ? comma : end) - p)};
        if (spec.n_rules == CFX_FAULT_MAX_RULES) {
            if (why_size > 0)
                snprintf(why, why_size, "more than %d rules", CFX_FAULT_MAX_RULES);
            return cfxInvalidArgument;
        }
        cfxResult_t res = parse_rule(rule, spec.n_rules, &spec.rules[spec.n_rules], why, why_size);
        if (res != cfxSuccess)
            return res;
        spec.n_rules++;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    *spec_p = spec;
    return cfxSuccess;
}
