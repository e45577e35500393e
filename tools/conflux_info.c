/*
 * conflux-info: what this Conflux is and how it is configured.
 *   conflux-info            version and build contents
 *   conflux-info --params   every parameter: value, default, description; exits 1
 *                           when a value is refused (the sentence follows the table)
 */
#include <stdio.h>
#include <string.h>

#include "cfx_build_config.h"
#include "conflux.h"
#include "kernels/reduce.h"
#include "src/util/param.h"

int main(int argc, char **argv)
{
    int version = 0;
    cfxGetVersion(&version);
    if (argc > 1 && strcmp(argv[1], "--params") == 0) {
        return cfx_param_print_all(stdout) == 0 ? 0 : 1;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: %s [--params]\n", argv[0]);
        return 2;
    }
    printf("Conflux %d.%d.%d (version code %d)\n", version / 10000, version / 100 % 100,
           version % 100, version);
    printf("cuda kernels: %s\nverbs: %s\nhwloc: %s\nhost reductions: %s\n",
           CFX_HAVE_CUDA ? "built" : "not built", CFX_HAVE_VERBS ? "found" : "not found",
           CFX_HAVE_HWLOC ? "found" : "not found", cfx_reduce_isa_name(cfx_reduce_isa_selected()));
    return 0;
}
