/* An outside program: includes the installed header, links the installed library. */
#include <conflux.h>
#include <stdio.h>

int main(void)
{
    int version = 0;
    cfxComm_t comm;
    if (cfxGetVersion(&version) != cfxSuccess || version != CFX_VERSION_CODE)
        return 1;
    if (cfxCommInitAll(&comm, 1, NULL) != cfxSuccess) {
        fprintf(stderr, "init: %s\n", cfxGetLastError(NULL));
        return 1;
    }
    int count = 0;
    cfxCommCount(comm, &count);
    cfxCommDestroy(comm);
    printf("consumer: Conflux %d, %d rank\n", version, count);
    return count == 1 ? 0 : 1;
}
