/*
 * NCCL topology XML (src/topo/xml.c, CFX_TOPO_FILE): any bytes. What loads
 * must dump, and the dump must load back (topo.h's promise) into the same
 * number of nodes of each type. CFX_FUZZ_TOPO_LOOSE=1 skips that last check
 * (a known difference: an empty <pci> switch is kept on load but dropped
 * when its own dump is read back), so the memory checks still run.
 */
#include "fuzz/fuzz.h"
#include "src/topo/topo.h"

static int loose(void)
{
    static int value = -1;
    if (value < 0) {
        const char *text = getenv("CFX_FUZZ_TOPO_LOOSE");
        value = text != NULL && text[0] == '1';
    }
    return value;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cfx_topo_system *sys = NULL;
    if (cfx_topo_load_xml_buffer((const char *)data, size, "fuzz.xml", &sys) != cfxSuccess) {
        FUZZ_CHECK(sys == NULL);
        return 0;
    }
    FUZZ_CHECK(sys != NULL && sys->n_nodes >= 0);
    char *text = NULL;
    size_t text_size = 0;
    FILE *out = open_memstream(&text, &text_size);
    FUZZ_CHECK(out != NULL);
    cfxResult_t res = cfx_topo_dump_xml_file(sys, out);
    fclose(out);
    FUZZ_CHECK(res == cfxSuccess);
    struct cfx_topo_system *again = NULL;
    res = cfx_topo_load_xml_buffer(text, text_size, "fuzz-dump.xml", &again);
    if (res != cfxSuccess)
        fprintf(stderr, "dump of a loaded system does not load back:\n%.*s\n", (int)text_size,
                text);
    FUZZ_CHECK(res == cfxSuccess);
    for (int t = 0; t < CFX_TOPO_NODE_TYPES && !loose(); t++)
        FUZZ_CHECK(again->count[t] == sys->count[t]);
    cfx_topo_free(again);
    cfx_topo_free(sys);
    free(text);
    return 0;
}
