/*
 * CFX_FAULT's syntax (transports/faulty/spec.c): any text; what parses is
 * within the documented ranges.
 */
#include "fuzz/fuzz.h"
#include "transports/faulty/faulty.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char text[2048];
    size_t n = size < sizeof(text) - 1 ? size : sizeof(text) - 1;
    memcpy(text, data, n);
    text[n] = '\0';
    struct cfx_fault_spec spec;
    char why[256];
    memset(why, 'x', sizeof(why));
    cfxResult_t res = cfx_fault_spec_parse(text, &spec, why, sizeof(why));
    FUZZ_CHECK(memchr(why, '\0', sizeof(why)) != NULL);
    if (res != cfxSuccess) {
        FUZZ_CHECK(res == cfxInvalidArgument && why[0] != '\0');
        return 0;
    }
    FUZZ_CHECK(spec.n_rules >= 0 && spec.n_rules <= CFX_FAULT_MAX_RULES);
    for (int i = 0; i < spec.n_rules; i++) {
        const struct cfx_fault_rule *r = &spec.rules[i];
        FUZZ_CHECK(r->kind >= CFX_FAULT_DROP && r->kind <= CFX_FAULT_KILL);
        FUZZ_CHECK(r->rank >= -1 && r->peer >= -1);
        FUZZ_CHECK(r->ms >= 0 && r->ms <= 24 * 3600 * 1000 && r->keep >= -1);
        FUZZ_CHECK(r->what == CFX_FAULT_DATA || r->what == CFX_FAULT_PRINT);
        FUZZ_CHECK(r->at == CFX_FAULT_AT_DATA || r->kind == CFX_FAULT_KILL);
    }
    return 0;
}
