/*
 * conflux-perf: nccl-tests for Conflux.
 *   conflux-perf allreduce --np 2 -b 8 -e 128M -f 2
 * See perf.h for the pieces and docs/performance.md for the manual.
 */
#include <stdio.h>

#include "perf.h"

int main(int argc, char **argv)
{
    /* Whole lines reach a pipe as they are made, as nccl-tests does. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct perf_options opt;
    int help = 0;
    int status = perf_options_parse(argc, argv, &opt, &help);
    if (status != PERF_EXIT_OK)
        return status;
    if (help) {
        perf_options_usage(stdout, "conflux-perf");
        return PERF_EXIT_OK;
    }
    return perf_launch(&opt);
}
