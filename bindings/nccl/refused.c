/*
 * The functions of NCCL 2.28's host API that Conflux has no equivalent of.
 * Each is exported, so that a program built against nccl.h loads, and
 * fails with ncclInvalidUsage and a sentence in ncclGetLastError saying
 * why and what to use instead. docs/api.md lists them with the same reasons
 * and bindings/nccl/absent_symbols.txt the few that are not exported.
 */
#include "bindings/nccl/shim.h"

#define DEVICE_API_REASON                                                                          \
    "the NCCL device API (nccl_device.h) runs NCCL's own kernels over symmetric memory "           \
    "windows; Conflux has no device API"

CFX_NCCL_API ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size,
                                                  ncclWindow_t *win, int winFlags)
{
    (void)buff, (void)size, (void)win, (void)winFlags;
    return cfx_nccl_refuse(ncclInvalidUsage, comm,
                           "ncclCommWindowRegister is not supported by Conflux: it has no "
                           "symmetric memory windows; use ncclCommRegister");
}
CFX_NCCL_ALIAS(ncclCommWindowRegister);

CFX_NCCL_API ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    (void)win;
    return cfx_nccl_refuse(ncclInvalidUsage, comm,
                           "ncclCommWindowDeregister is not supported by Conflux: it has no "
                           "symmetric memory windows (ncclCommWindowRegister never made one)");
}
CFX_NCCL_ALIAS(ncclCommWindowDeregister);

CFX_NCCL_API ncclResult_t pncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const *reqs,
                                             ncclDevComm_t *outDevComm)
{
    (void)reqs, (void)outDevComm;
    return cfx_nccl_refuse(ncclInvalidUsage, comm,
                           "ncclDevCommCreate is not supported: " DEVICE_API_REASON);
}
CFX_NCCL_ALIAS(ncclDevCommCreate);

CFX_NCCL_API ncclResult_t pncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const *devComm)
{
    (void)devComm;
    return cfx_nccl_refuse(ncclInvalidUsage, comm,
                           "ncclDevCommDestroy is not supported: " DEVICE_API_REASON);
}
CFX_NCCL_ALIAS(ncclDevCommDestroy);

CFX_NCCL_API ncclResult_t pncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team,
                                                           int nBarriers,
                                                           ncclGinBarrierHandle_t *outHandle,
                                                           ncclDevResourceRequirements_t *outReq)
{
    (void)team, (void)nBarriers, (void)outHandle, (void)outReq;
    return cfx_nccl_refuse(ncclInvalidUsage, comm,
                           "ncclGinBarrierCreateRequirement is not supported: " DEVICE_API_REASON);
}
CFX_NCCL_ALIAS(ncclGinBarrierCreateRequirement);

CFX_NCCL_API ncclResult_t pncclLsaBarrierCreateRequirement(ncclTeam_t team, int nBarriers,
                                                           ncclLsaBarrierHandle_t *outHandle,
                                                           ncclDevResourceRequirements_t *outReq)
{
    (void)team, (void)nBarriers, (void)outHandle, (void)outReq;
    return cfx_nccl_refuse(ncclInvalidUsage, NULL,
                           "ncclLsaBarrierCreateRequirement is not supported: " DEVICE_API_REASON);
}
CFX_NCCL_ALIAS(ncclLsaBarrierCreateRequirement);

CFX_NCCL_API ncclResult_t pncclLLA2ACreateRequirement(int nBlocks, int nSlots,
                                                      ncclLLA2AHandle_t *outHandle,
                                                      ncclDevResourceRequirements_t *outReq)
{
    (void)nBlocks, (void)nSlots, (void)outHandle, (void)outReq;
    return cfx_nccl_refuse(ncclInvalidUsage, NULL,
                           "ncclLLA2ACreateRequirement is not supported: " DEVICE_API_REASON);
}
CFX_NCCL_ALIAS(ncclLLA2ACreateRequirement);
