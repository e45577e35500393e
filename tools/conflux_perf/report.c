/*
 * What rank 0 prints, and the JSON file. The text is nccl-tests' layout line
 * for line, so scripts that parse nccl-tests read it unchanged: '#' header
 * lines, one row per size with the out-of-place then the in-place columns
 * (time in us, algbw and busbw in GB/s, #wrong or N/A), then the footer
 * "# Out of bounds values : N OK|FAILED" and "# Avg bus bandwidth    : X".
 * We add '#' lines only: the launch, the memory the buffers are in, the CFX_
 * environment, how times are combined across ranks, and "# memcpy bandwidth:
 * X GB/s" (a host memcpy, or in device mode a device-to-device copy).
 *
 * The JSON goes to FILE.tmp and is renamed to FILE when the run ends, so a
 * reader never sees half a file.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perf.h"

extern char **environ;

struct perf_report {
    const struct perf_options *opt;
    int nranks;
    FILE *json;
    char *json_tmp;
    int json_results;   /* result objects written so far */
    int json_failed;    /* --json given but the file could not be opened */
    int row_open;       /* a row is printed up to its last column */
    const char *memory; /* perf_header.memory, for the JSON */
};

static const char *const average_names[] = {"rank 0's", "the mean of the ranks'",
                                            "the smallest of the ranks'",
                                            "the largest of the ranks'"};

/* nccl-tests' number style: as many decimals as fit in `width`. */
static void format_number(char *out, size_t out_bytes, double value, int width)
{
    int digits = 0;
    for (double p = 1.0; value >= p && digits < 40; p *= 10.0)
        digits++;
    if (digits < width - 2)
        snprintf(out, out_bytes, "%*.2f", width, value);
    else if (digits < width - 1)
        snprintf(out, out_bytes, "%*.1f", width, value);
    else if (digits < width + 1)
        snprintf(out, out_bytes, "%*.0f", width, value);
    else
        snprintf(out, out_bytes, "%*.1e", width, value);
}

static void json_string(FILE *out, const char *text)
{
    fputc('"', out);
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(out, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(out, "\\u%04x", *c);
        else
            fputc(*c, out);
    }
    fputc('"', out);
}

static void json_number(FILE *out, double value)
{
    if (isfinite(value))
        fprintf(out, "%.6g", value);
    else
        fputs("null", out);
}

struct perf_report *perf_report_open(const struct perf_options *opt, int nranks, const char *launch)
{
    struct perf_report *rep = calloc(1, sizeof(*rep));
    if (rep == NULL)
        return NULL;
    rep->opt = opt;
    rep->nranks = nranks;
    int version = 0;
    cfxGetVersion(&version);
    printf("# conflux-perf %s: Conflux %d.%d.%d, %d rank%s, %s\n", opt->coll->name, version / 10000,
           version / 100 % 100, version % 100, nranks, nranks == 1 ? "" : "s", launch);
    if (opt->json_path != NULL) {
        size_t len = strlen(opt->json_path) + 5;
        rep->json_tmp = malloc(len);
        if (rep->json_tmp != NULL) {
            snprintf(rep->json_tmp, len, "%s.tmp", opt->json_path);
            rep->json = fopen(rep->json_tmp, "w");
        }
        if (rep->json == NULL) {
            /* Run anyway, so the ranks stay in step; the exit code says it. */
            fprintf(stderr, "conflux-perf: cannot write %s; the run goes on without JSON\n",
                    rep->json_tmp ? rep->json_tmp : opt->json_path);
            rep->json_failed = 1;
            return rep;
        }
        FILE *j = rep->json;
        fprintf(j, "{\n  \"tool\": \"conflux-perf\",\n  \"conflux_version\": \"%d.%d.%d\",\n",
                version / 10000, version / 100 % 100, version % 100);
        fputs("  \"command\": ", j);
        json_string(j, opt->command);
        fprintf(j,
                ",\n  \"collective\": \"%s\",\n  \"nranks\": %d,\n  \"launch\": ", opt->coll->name,
                nranks);
        json_string(j, launch);
        fprintf(j,
                ",\n  \"config\": {\"min_bytes\": %zu, \"max_bytes\": %zu, \"step_factor\": %zu, "
                "\"step_bytes\": %zu, \"iters\": %d, \"warmup_iters\": %d, \"agg_iters\": %d, "
                "\"check\": %d, \"average\": %d, \"mem\": \"%s\"},\n  \"results\": [",
                opt->min_bytes, opt->max_bytes, opt->step_factor, opt->step_bytes, opt->iters,
                opt->warmup_iters, opt->agg_iters, opt->check_iters, opt->average,
                perf_mem_name(opt->mem));
    }
    return rep;
}

/* The buffers line: "host" keeps the words of the host-only tool. */
static const char *memory_text(const char *memory)
{
    if (strcmp(memory, "device") == 0)
        return "Device buffers (cuMemAlloc), a non-blocking stream per rank, synchronised at the "
               "end of each timed loop.";
    if (strcmp(memory, "mixed") == 0)
        return "Device buffers on the GPU ranks (a stream each), host buffers (stream NULL) on "
               "the others.";
    return "Host buffers, stream NULL.";
}

void perf_report_header(struct perf_report *rep, const struct perf_header *header)
{
    if (rep == NULL)
        return;
    rep->memory = header->memory;
    const struct perf_options *opt = rep->opt;
    int by_factor = opt->step_factor > 1;
    printf("# nThread %d nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d "
           "iters: %d agg iters: %d validation: %d graph: 0\n",
           opt->threads > 1 ? opt->threads : 1, opt->min_bytes, opt->max_bytes,
           by_factor ? opt->step_factor : opt->step_bytes, by_factor ? "factor" : "bytes",
           opt->warmup_iters, opt->iters, opt->agg_iters, opt->check_iters);
    printf("#\n# Using devices\n%s#\n", header->rank_lines);
    printf("%s", header->notes);
    printf("# %s Time: %s mean per call, no barrier between calls.\n", memory_text(header->memory),
           average_names[opt->average]);
    printf("# Environment:");
    int any = 0;
    for (char **e = environ; *e != NULL; e++)
        if (strncmp(*e, "CFX_", 4) == 0) {
            printf(" %s", *e);
            any = 1;
        }
    printf("%s\n#\n", any ? "" : " (no CFX_ variables)");
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place\n",
           "", "", "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count",
           "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
           "#wrong");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
           "");
    fflush(stdout);
}

void perf_report_row_start(struct perf_report *rep, size_t bytes, size_t count, cfxDataType_t type,
                           const char *op_name, int root)
{
    if (rep == NULL)
        return;
    printf("%12zu  %12zu  %8s  %6s  %6d", bytes, count, perf_type_name(type), op_name, root);
    rep->row_open = 1;
}

void perf_report_result(struct perf_report *rep, cfxDataType_t type, const char *op_name, int root,
                        const struct perf_result *res)
{
    if (rep == NULL)
        return;
    char time_text[32], alg_text[32], bus_text[32];
    format_number(time_text, sizeof(time_text), res->time_us, 7);
    format_number(alg_text, sizeof(alg_text), res->algbw, 6);
    format_number(bus_text, sizeof(bus_text), res->busbw, 6);
    if (res->wrong >= 0)
        printf("  %7s  %6s  %6s  %6lld", time_text, alg_text, bus_text, res->wrong);
    else
        printf("  %7s  %6s  %6s     N/A", time_text, alg_text, bus_text);
    if (rep->json == NULL)
        return;
    FILE *j = rep->json;
    fprintf(j,
            "%s\n    {\"collective\": \"%s\", \"type\": \"%s\", \"op\": \"%s\", \"root\": %d, "
            "\"nranks\": %d, \"bytes\": %zu, \"count\": %zu, \"inplace\": %s, \"time_us\": ",
            rep->json_results ? "," : "", rep->opt->coll->name, perf_type_name(type), op_name, root,
            rep->nranks, res->bytes, res->count, res->inplace ? "true" : "false");
    json_number(j, res->time_us);
    fputs(", \"algbw\": ", j);
    json_number(j, res->algbw);
    fputs(", \"busbw\": ", j);
    json_number(j, res->busbw);
    if (res->wrong >= 0)
        fprintf(j, ", \"wrong\": %lld}", res->wrong);
    else
        fputs(", \"wrong\": null}", j);
    rep->json_results++;
}

void perf_report_row_end(struct perf_report *rep)
{
    if (rep == NULL)
        return;
    printf("\n");
    fflush(stdout);
    rep->row_open = 0;
}

int perf_report_close(struct perf_report *rep, const struct perf_copy *copy,
                      const struct perf_enqueue *enq, long long errors, double avg_busbw)
{
    if (rep == NULL)
        return 0;
    int status = rep->json_failed ? -1 : 0;
    if (copy->bytes > 0 && copy->device)
        printf("# memcpy: %zu bytes device to device on rank 0's GPU (cuMemcpyAsync, %s); GB/s "
               "counts bytes read + written (2 x size / time, as CUDA's bandwidthTest)\n",
               copy->bytes,
               copy->events ? "timed with CUDA events" : "wall time to cuEventSynchronize");
    else if (copy->bytes > 0)
        printf("# memcpy: %zu bytes between two touched buffers, one thread, rank 0\n",
               copy->bytes);
    if (copy->bytes > 0)
        printf("# memcpy bandwidth: %.2f GB/s\n", copy->gbps);
    if (enq != NULL && enq->calls > 0)
        printf("# enqueue: %.2f us per call from call to return on rank 0 (%ld timed calls; "
               "%.2f us at %zu bytes)\n",
               enq->mean_us, enq->calls, enq->first_mean_us, enq->first_bytes);
    printf("# Out of bounds values : %lld %s\n", errors, errors ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n", avg_busbw);
    printf("#\n");
    fflush(stdout);
    if (rep->json != NULL) {
        FILE *j = rep->json;
        fprintf(j,
                "\n  ],\n  \"memory\": \"%s\",\n  \"memcpy_kind\": \"%s\",\n  "
                "\"memcpy_bytes\": %zu,\n  \"memcpy_gbps\": ",
                rep->memory != NULL ? rep->memory : "host",
                copy->device ? "device_to_device_read_plus_written" : "host_memcpy_bytes_copied",
                copy->bytes);
        json_number(j, copy->bytes > 0 ? copy->gbps : NAN);
        fputs(",\n  \"enqueue_us\": ", j);
        json_number(j, enq != NULL && enq->calls > 0 ? enq->mean_us : NAN);
        fprintf(j, ",\n  \"out_of_bounds\": %lld,\n  \"avg_busbw\": ", errors);
        json_number(j, avg_busbw);
        fputs("\n}\n", j);
        int write_failed = ferror(j);
        if (fclose(j) != 0 || write_failed || rename(rep->json_tmp, rep->opt->json_path) != 0) {
            fprintf(stderr, "conflux-perf: writing %s failed\n", rep->opt->json_path);
            status = -1;
        }
    }
    free(rep->json_tmp);
    free(rep);
    return status;
}

void perf_report_abandon(struct perf_report *rep)
{
    if (rep == NULL)
        return;
    if (rep->row_open)
        printf("\n");
    fflush(stdout);
    if (rep->json != NULL) {
        fclose(rep->json);
        unlink(rep->json_tmp);
    }
    free(rep->json_tmp);
    free(rep);
}
