/*
 * conflux-topo's pieces: main.c parses options and builds the plan,
 * report.c prints it for people (text) or programs (--json), dot.c draws it
 * (--dot).
 */
#ifndef CFX_TOOLS_TOPO_TOOL_H
#define CFX_TOOLS_TOPO_TOOL_H

#include <stdio.h>

#include "src/plan/plan.h"
#include "src/topo/topo.h"

struct topo_report {
    const struct cfx_topo_system *sys; /* Every host's topology. */
    struct cfx_plan *plan;
    int n_nodes;
    int ranks_per_node;
};

/* Sizes of the choice tables: powers of two (json) or of eight (text), 8 B .. 8 GiB. */
#define TOPO_MIN_BYTES ((size_t)8)
#define TOPO_MAX_BYTES ((size_t)8 << 30)

void topo_report_text(const struct topo_report *rep, FILE *out);
void topo_report_json(const struct topo_report *rep, FILE *out);
int topo_report_dot(const struct topo_report *rep, const char *path);

#endif /* CFX_TOOLS_TOPO_TOOL_H */
