/*
 * NCCL topology XML (src/topo/xml.c, CFX_TOPO_FILE): any bytes. What loads
 * must dump, the dump must load back (topo.h's promise) into the same number
 * of nodes of each type, and the second dump must be the same text as the
 * first: save -> load -> save is the identity.
 */
#include "fuzz/fuzz.h"
#include "src/topo/topo.h"

static char *dump_text(const struct cfx_topo_system *sys, size_t *size_p)
{
    char *text = NULL;
    FILE *out = open_memstream(&text, size_p);
    FUZZ_CHECK(out != NULL);
    cfxResult_t res = cfx_topo_dump_xml_file(sys, out);
    fclose(out);
    FUZZ_CHECK(res == cfxSuccess);
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cfx_topo_system *sys = NULL;
    if (cfx_topo_load_xml_buffer((const char *)data, size, "fuzz.xml", &sys) != cfxSuccess) {
        FUZZ_CHECK(sys == NULL);
        return 0;
    }
    FUZZ_CHECK(sys != NULL && sys->n_nodes >= 0);
    size_t text_size = 0;
    char *text = dump_text(sys, &text_size);
    struct cfx_topo_system *again = NULL;
    cfxResult_t res = cfx_topo_load_xml_buffer(text, text_size, "fuzz-dump.xml", &again);
    if (res != cfxSuccess)
        fprintf(stderr, "dump of a loaded system does not load back:\n%.*s\n", (int)text_size,
                text);
    FUZZ_CHECK(res == cfxSuccess);
    for (int t = 0; t < CFX_TOPO_NODE_TYPES; t++)
        FUZZ_CHECK(again->count[t] == sys->count[t]);
    size_t again_size = 0;
    char *again_text = dump_text(again, &again_size);
    if (again_size != text_size || memcmp(again_text, text, text_size) != 0)
        fprintf(stderr, "a dump read back dumps differently:\n%.*s\n-- then --\n%.*s\n",
                (int)text_size, text, (int)again_size, again_text);
    FUZZ_CHECK(again_size == text_size && memcmp(again_text, text, text_size) == 0);
    free(again_text);
    cfx_topo_free(again);
    cfx_topo_free(sys);
    free(text);
    return 0;
}
