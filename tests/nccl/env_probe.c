/*
 * Probe for tests/nccl/env_test.sh, linked to the drop-in (through its own
 * ABI header: it needs no NVIDIA header). By the time main runs, the
 * drop-in's constructor has mapped NCCL_* to CFX_*.
 *
 *   env_probe getenv NAME...   print NAME=value (or NAME unset) for each
 *   env_probe uniqueid         ncclGetUniqueId: print "ok", or the error (exit 3)
 *   env_probe comm             a one-rank communicator: init, all-reduce, destroy
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bindings/nccl/nccl_abi.h"

static int comm_round_trip(void)
{
    ncclComm_t comm;
    int x = 7;
    if (ncclCommInitAll(&comm, 1, NULL) != ncclSuccess ||
        ncclAllReduce(&x, &x, 1, ncclInt32, ncclSum, comm, NULL) != ncclSuccess ||
        ncclCommDestroy(comm) != ncclSuccess) {
        printf("failed: %s\n", ncclGetLastError(NULL));
        return 3;
    }
    printf("ok %d\n", x);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "getenv") == 0) {
        for (int i = 2; i < argc; i++) {
            const char *value = getenv(argv[i]);
            if (value)
                printf("%s=%s\n", argv[i], value);
            else
                printf("%s unset\n", argv[i]);
        }
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "uniqueid") == 0) {
        ncclUniqueId id;
        if (ncclGetUniqueId(&id) != ncclSuccess) {
            printf("failed: %s\n", ncclGetLastError(NULL));
            return 3;
        }
        printf("ok\n");
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "comm") == 0)
        return comm_round_trip();
    fprintf(stderr, "usage: %s getenv NAME... | uniqueid | comm\n", argv[0]);
    return 2;
}
