/*
 * The resources a program makes on a communicator besides calls: reductions
 * of cfxRedOpCreatePreMulSum, buffer registrations of cfxCommRegister; and
 * cfxMemAlloc, the memory those buffers come from. Each entry point checks
 * its arguments and holds the communicator (cfx_core_claim) while it edits
 * the tables, as a collective would.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/reduce.h"
#include "src/core/argcheck.h"
#include "src/core/comm.h"
#include "src/core/redop.h"
#include "src/util/check.h"
#include "src/util/cuda.h"
#include "src/util/log.h"

/* ------------------------------------------------------------- memory */

CFX_API cfxResult_t cfxMemAlloc(void **ptr, size_t size)
{
    const char *fn = "cfxMemAlloc";
    cfx_core_api_enter(NULL);
    cfxResult_t res = cfx_argcheck_ptr(ptr, fn, "ptr");
    if (res == cfxSuccess && size == 0)
        res = cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT, "%s: size is 0", fn);
    if (res == cfxSuccess && size > PTRDIFF_MAX)
        res = cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                            "%s: size %zu is larger than any allocation can be", fn, size);
    int device = res == cfxSuccess ? cfx_cuda_rank_device() : -1;
    if (device >= 0) {
        /* A thread with a CUDA context current: device memory, as NCCL. */
        res = cfx_cuda_mem_alloc(ptr, size);
    } else if (res == cfxSuccess) {
        long page = sysconf(_SC_PAGESIZE);
        void *mem = NULL;
        int err = posix_memalign(&mem, page > 0 ? (size_t)page : 4096, size);
        if (err != 0)
            res = cfx_error_set(cfxSystemError, CFX_LOG_INIT, "%s: cannot allocate %zu bytes: %s",
                                fn, size, strerror(err));
        else {
            memset(mem, 0, size); /* Touch every page now, not in the first collective. */
            *ptr = mem;
        }
    }
    return cfx_core_api_exit(NULL, res);
}

CFX_API cfxResult_t cfxMemFree(void *ptr)
{
    cfx_core_api_enter(NULL);
    cfxResult_t res = cfxSuccess;
    if (cfx_cuda_is_device_ptr(ptr, NULL))
        res = cfx_cuda_mem_free(ptr);
    else
        free(ptr);
    return cfx_core_api_exit(NULL, res);
}

/* Shared start of the communicator's entry points: a live, claimed
 * communicator (*held_p says whether to release it). */
static cfxResult_t enter(struct cfxComm *comm, const char *fn, int *held_p)
{
    *held_p = 0;
    CFX_CHECK(cfx_argcheck_comm(comm, fn));
    CFX_CHECK(cfx_core_claim(comm, fn));
    *held_p = 1;
    return cfxSuccess;
}

static cfxResult_t leave(struct cfxComm *comm, cfxResult_t res, int held)
{
    res = cfx_core_api_exit(held ? comm : NULL, res);
    if (held)
        cfx_core_release(comm);
    return res;
}

/* -------------------------------------------------------- registration */

CFX_API cfxResult_t cfxCommRegister(const cfxComm_t comm, void *buff, size_t size, void **handle)
{
    const char *fn = "cfxCommRegister";
    int held;
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(enter(comm, fn, &held), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_ptr(buff, fn, "buff"), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_ptr(handle, fn, "handle"), res, out);
    if (size == 0) {
        res = cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT, "%s: size is 0", fn);
        goto out;
    }
    struct cfx_core_reg *reg = malloc(sizeof(*reg));
    if (reg == NULL) {
        res = cfx_error_set(cfxSystemError, CFX_LOG_INIT, "%s: out of memory", fn);
        goto out;
    }
    memset(reg, 0, sizeof(*reg));
    reg->buff = buff;
    reg->size = size;
    reg->mem = cfx_cuda_is_device_ptr(buff, &reg->device) ? CFX_MEM_DEVICE : CFX_MEM_HOST;
    /* With every transport the communicator uses that can use it (a NIC's
     * memory region); one made later registers it when it starts. */
    for (int t = 0; res == cfxSuccess && t < CFX_MAX_TRANSPORTS && cfx_transports[t]; t++)
        res = cfx_core_reg_with(comm, reg, t);
    if (res != cfxSuccess) {
        for (int t = 0; t < CFX_MAX_TRANSPORTS && cfx_transports[t]; t++)
            if (reg->on[t])
                cfx_transports[t]->dereg_mem(comm->transport_ctx[t], reg->handles[t]);
        free(reg);
        goto out;
    }
    reg->next = comm->regs;
    comm->regs = reg;
    *handle = reg;
out:
    return leave(comm, res, held);
}

CFX_API cfxResult_t cfxCommDeregister(const cfxComm_t comm, void *handle)
{
    const char *fn = "cfxCommDeregister";
    int held;
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(enter(comm, fn, &held), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_ptr(handle, fn, "handle"), res, out);
    struct cfx_core_reg **link = &comm->regs;
    while (*link != NULL && *link != handle)
        link = &(*link)->next;
    if (*link == NULL) {
        res = cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                            "%s: handle %p is not a registration of this communicator (made on "
                            "another one, or already deregistered)",
                            fn, handle);
        goto out;
    }
    struct cfx_core_reg *reg = *link;
    *link = reg->next;
    for (int t = 0; t < CFX_MAX_TRANSPORTS && cfx_transports[t]; t++)
        if (reg->on[t])
            cfx_transports[t]->dereg_mem(comm->transport_ctx[t], reg->handles[t]);
    free(reg);
out:
    return leave(comm, res, held);
}

cfxResult_t cfx_core_reg_with(struct cfxComm *comm, struct cfx_core_reg *reg, int t)
{
    const struct cfx_transport *tr = cfx_transports[t];
    if (tr->reg_mem == NULL || comm->transport_ctx[t] == NULL || reg->on[t])
        return cfxSuccess;
    void *handle = NULL;
    cfxResult_t res =
        tr->reg_mem(comm->transport_ctx[t], reg->buff, reg->size, reg->mem, reg->device, &handle);
    if (res == cfxInvalidUsage) {
        CFX_INFO(CFX_LOG_INIT, "cfxCommRegister: %s; this buffer goes through the FIFO there",
                 cfx_error_thread_last());
        return cfxSuccess;
    }
    if (res != cfxSuccess)
        return res;
    reg->handles[t] = handle;
    reg->on[t] = 1;
    return cfxSuccess;
}

void cfx_core_reg_release(struct cfxComm *comm, int t)
{
    for (struct cfx_core_reg *reg = comm->regs; reg != NULL; reg = reg->next)
        if (reg->on[t]) {
            cfx_transports[t]->dereg_mem(comm->transport_ctx[t], reg->handles[t]);
            reg->on[t] = 0;
            reg->handles[t] = NULL;
        }
}

void *cfx_core_reg_find(const struct cfxComm *comm, int t, const void *buf, size_t bytes)
{
    const char *p = buf;
    for (const struct cfx_core_reg *reg = comm->regs; reg != NULL; reg = reg->next) {
        const char *start = reg->buff;
        if (reg->on[t] && reg->handles[t] != NULL && p >= start && bytes <= reg->size &&
            (size_t)(p - start) <= reg->size - bytes)
            return reg->handles[t];
    }
    return NULL;
}

void cfx_core_reg_free_all(struct cfxComm *comm)
{
    while (comm->regs != NULL) {
        struct cfx_core_reg *next = comm->regs->next;
        free(comm->regs);
        comm->regs = next;
    }
}

/* ---------------------------------------------------------- reductions */

CFX_API cfxResult_t cfxRedOpCreatePreMulSum(cfxRedOp_t *op, void *scalar, cfxDataType_t datatype,
                                            cfxScalarResidence_t residence, cfxComm_t comm)
{
    const char *fn = "cfxRedOpCreatePreMulSum";
    int held;
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(enter(comm, fn, &held), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_ptr(op, fn, "op"), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_ptr(scalar, fn, "scalar"), res, out);
    CFX_CHECK_GOTO(cfx_argcheck_type(datatype, fn), res, out);
    int device = -1;
    if (residence == cfxScalarDevice &&
        (comm->cuda == NULL || !cfx_cuda_is_device_ptr(scalar, &device) ||
         device != comm->cuda_dev)) {
        res = cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                            "%s: residence cfxScalarDevice needs a scalar in the device memory of "
                            "a GPU rank's own device (rank %d is %s)",
                            fn, comm->rank, comm->cuda == NULL ? "a host rank" : "on another GPU");
        goto out;
    }
    if (residence != cfxScalarHostImmediate && residence != cfxScalarDevice) {
        res = cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                            "%s: residence %d is not a cfxScalarResidence_t", fn, (int)residence);
        goto out;
    }
    int slot = 0;
    while (slot < CFX_MAX_PREMULSUM_OPS && comm->premul[slot].in_use)
        slot++;
    if (slot == CFX_MAX_PREMULSUM_OPS) {
        res = cfx_error_set(cfxInvalidUsage, CFX_LOG_INIT,
                            "%s: the communicator already holds %d PreMulSum ops; destroy some "
                            "with cfxRedOpDestroy",
                            fn, CFX_MAX_PREMULSUM_OPS);
        goto out;
    }
    struct cfx_core_premul *entry = &comm->premul[slot];
    entry->scalar_bits = 0;
    entry->premul = residence == cfxScalarDevice ? CFX_PREMUL_DEVICE : CFX_PREMUL_HOST;
    if (entry->premul == CFX_PREMUL_DEVICE)
        entry->scalar_bits = (uint64_t)(uintptr_t)scalar; /* Read when each call runs. */
    else
        memcpy(&entry->scalar_bits, scalar, cfx_type_size(datatype));
    entry->type = datatype;
    entry->in_use = 1;
    *op = (cfxRedOp_t)(cfxNumOps + slot);
out:
    return leave(comm, res, held);
}

/* The table entry of a created op, or NULL. */
static struct cfx_core_premul *premul_of(struct cfxComm *comm, cfxRedOp_t op)
{
    long slot = (long)op - cfxNumOps;
    if (slot < 0 || slot >= CFX_MAX_PREMULSUM_OPS || !comm->premul[slot].in_use)
        return NULL;
    return &comm->premul[slot];
}

CFX_API cfxResult_t cfxRedOpDestroy(cfxRedOp_t op, cfxComm_t comm)
{
    const char *fn = "cfxRedOpDestroy";
    int held;
    cfx_core_api_enter(comm);
    cfxResult_t res;
    CFX_CHECK_GOTO(enter(comm, fn, &held), res, out);
    if ((int)op >= 0 && op < cfxNumOps) {
        res = cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                            "%s: op %d is a built-in reduction; only ops of "
                            "cfxRedOpCreatePreMulSum can be destroyed",
                            fn, (int)op);
        goto out;
    }
    struct cfx_core_premul *entry = premul_of(comm, op);
    if (entry == NULL) {
        res = cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                            "%s: op %d was not made by cfxRedOpCreatePreMulSum on this "
                            "communicator (or was destroyed already)",
                            fn, (int)op);
        goto out;
    }
    entry->in_use = 0;
out:
    return leave(comm, res, held);
}

cfxResult_t cfx_core_redop_resolve(struct cfxComm *comm, cfxRedOp_t op, cfxDataType_t type,
                                   const char *fn, struct cfx_core_redop *red_p)
{
    if ((int)op >= 0 && op < cfxNumOps) {
        *red_p = (struct cfx_core_redop){.op = op};
        return cfxSuccess;
    }
    struct cfx_core_premul *entry = premul_of(comm, op);
    if (entry == NULL)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                             "%s: op %d is neither a built-in cfxRedOp_t (0..%d) nor an op of "
                             "cfxRedOpCreatePreMulSum alive on this communicator",
                             fn, (int)op, cfxNumOps - 1);
    if (entry->type != type)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                             "%s: op %d was made for datatype %d, not %d; make one "
                             "cfxRedOpCreatePreMulSum op per datatype",
                             fn, (int)op, (int)entry->type, (int)type);
    /* cfxAvg reduces as a sum; with premul set its finish multiplies. */
    *red_p = (struct cfx_core_redop){
        .op = cfxAvg, .premul = entry->premul, .premul_bits = entry->scalar_bits};
    return cfxSuccess;
}
