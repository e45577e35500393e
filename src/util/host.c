/* Host facts: see host.h. */
#include "src/util/host.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "cfx_build_config.h"
#include "src/util/error.h"
#include "src/util/log.h"
#include "src/util/param.h"

CFX_PARAM_STR(hostid, "HOSTID", NULL, "Host identity override (ranks with equal ids share memory)");

void cfx_host_identity(char *text, size_t size)
{
    const char *forced = param_hostid();
    if (forced && forced[0]) {
        snprintf(text, size, "%s", forced);
        return;
    }
    char name[64] = "unknown";
    gethostname(name, sizeof(name) - 1);
    name[sizeof(name) - 1] = '\0';
    char boot_id[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(boot_id, sizeof(boot_id), f) == NULL)
            boot_id[0] = '\0';
        fclose(f);
        boot_id[strcspn(boot_id, "\n")] = '\0';
    }
    snprintf(text, size, "%s:%s", name, boot_id);
}

uint64_t cfx_host_hash(const char *text)
{
    uint64_t hash = 0xcbf29ce484222325ull;
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        hash ^= *c;
        hash *= 0x100000001b3ull;
    }
    return hash;
}

cfxResult_t cfx_host_random(void *buf, size_t size)
{
    size_t done = 0;
    while (done < size) {
        ssize_t n = getrandom((char *)buf + done, size - done, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return cfx_error_set_errno(errno, CFX_LOG_INIT, "getrandom() failed");
        }
        done += (size_t)n;
    }
    return cfxSuccess;
}
