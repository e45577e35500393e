/*
 * The configuration file (CFX_CONF_FILE, src/util/param.c): any bytes, read
 * through a memory stream exactly as the library reads the file.
 */
#include <ctype.h>

#include "fuzz/fuzz.h"
#include "src/util/param.h"

#define MAX_ENTRIES 256

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    FILE *f = fmemopen((void *)data, size, "r");
    if (f == NULL)
        return 0;
    char *names[MAX_ENTRIES], *values[MAX_ENTRIES];
    int bad_line = -1;
    int n = cfx_param_conf_read(f, names, values, MAX_ENTRIES, &bad_line);
    fclose(f);
    FUZZ_CHECK(n >= 0 && n <= MAX_ENTRIES && bad_line >= 0);
    for (int i = 0; i < n; i++) {
        size_t name_len = strlen(names[i]), value_len = strlen(values[i]);
        FUZZ_CHECK(name_len > 0 && name_len < CFX_CONF_LINE_MAX);
        FUZZ_CHECK(value_len < CFX_CONF_LINE_MAX);
        FUZZ_CHECK(strchr(names[i], '=') == NULL && names[i][0] != '#');
        FUZZ_CHECK(!isspace((unsigned char)names[i][0]) &&
                   !isspace((unsigned char)names[i][name_len - 1]));
        FUZZ_CHECK(value_len == 0 || (!isspace((unsigned char)values[i][0]) &&
                                      !isspace((unsigned char)values[i][value_len - 1])));
        free(names[i]);
        free(values[i]);
    }
    return 0;
}
