/*
 * Test-side checks of topologies shared by the topology tests: a system
 * written to text (NCCL XML, through the writer), and "the same system"
 * (nodes, links and every path) for round trips through the writer and
 * the reader.
 */
#ifndef CFX_TEST_TOPO_CHECK_H
#define CFX_TEST_TOPO_CHECK_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "src/topo/topo.h"

/* @p sys as NCCL XML text; the caller frees it. */
static inline char *topo_dump_to_text(const struct cfx_topo_system *sys)
{
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    cr_assert_not_null(f);
    cr_assert_eq(cfx_topo_dump_xml_file(sys, f), cfxSuccess);
    fclose(f);
    return text;
}

/* Everything a topology file carries is the same in @p a and @p b. */
static inline void topo_assert_same_system(const struct cfx_topo_system *a,
                                           const struct cfx_topo_system *b, const char *what)
{
    cr_assert_eq(a->n_nodes, b->n_nodes, "%s: node count", what);
    for (int n = 0; n < a->n_nodes; n++) {
        const struct cfx_topo_node *x = &a->nodes[n], *y = &b->nodes[n];
        cr_assert_eq(x->type, y->type, "%s node %d type", what, n);
        cr_assert_eq(x->id, y->id, "%s node %d id", what, n);
        cr_assert_eq(x->parent, y->parent, "%s node %d parent", what, n);
        cr_assert_str_eq(x->busid, y->busid, "%s node %d", what, n);
        cr_assert_eq(x->pci_class, y->pci_class, "%s node %d class", what, n);
        cr_assert_eq(x->n_links, y->n_links, "%s node %d links", what, n);
        for (int l = 0; l < x->n_links; l++) {
            cr_assert_eq(x->links[l].type, y->links[l].type);
            cr_assert_eq(x->links[l].remote, y->links[l].remote);
            cr_assert_float_eq(x->links[l].bw, y->links[l].bw, 1e-9);
        }
        if (x->type == CFX_TOPO_GPU) {
            cr_assert_eq(x->gpu.dev, y->gpu.dev);
            cr_assert_eq(x->gpu.sm, y->gpu.sm);
            cr_assert_eq(x->gpu.n_nvlinks, y->gpu.n_nvlinks, "%s GPU %d NVLink records", what,
                         x->gpu.dev);
            for (int r = 0; r < x->gpu.n_nvlinks; r++) {
                cr_assert_str_eq(x->gpu.nvlinks[r].target, y->gpu.nvlinks[r].target);
                cr_assert_eq(x->gpu.nvlinks[r].count, y->gpu.nvlinks[r].count);
                cr_assert_eq(x->gpu.nvlinks[r].target_class, y->gpu.nvlinks[r].target_class);
            }
        }
        if (x->type == CFX_TOPO_NET) {
            cr_assert_str_eq(x->net.name, y->net.name);
            cr_assert_eq(x->net.speed_mbps, y->net.speed_mbps);
            cr_assert_eq(x->net.guid, y->net.guid);
        }
    }
    for (size_t i = 0; i < (size_t)a->n_nodes * (size_t)a->n_nodes; i++) {
        cr_assert_eq(a->paths[i].type, b->paths[i].type, "%s path %zu", what, i);
        cr_assert_float_eq(a->paths[i].bw, b->paths[i].bw, 1e-9);
    }
}

#endif /* CFX_TEST_TOPO_CHECK_H */
