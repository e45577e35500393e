/*
 * fake-cuda modules, functions and kernel launches. A module image is
 * checked for a fatbin or ELF header and otherwise ignored; its functions
 * are the kernels of the registry (kernels.h), found by name. See
 * fakecuda.h.
 */
#include "fakecuda.h"

#include <stdlib.h>
#include <string.h>

#define FATBIN_MAGIC 0xBA55ED50u /* little-endian, at offset 0 */
#define MAX_GRID_X   2147483647u
#define PARAMS_MISSING(kernel, params)                                                             \
    ((kernel)->param_bytes != 0 && ((params) == NULL || (params)[0] == NULL))

static int image_valid(const unsigned char *image)
{
    uint32_t magic = (uint32_t)image[0] | (uint32_t)image[1] << 8 | (uint32_t)image[2] << 16 |
                     (uint32_t)image[3] << 24;
    return magic == FATBIN_MAGIC || memcmp(image, "\177ELF", 4) == 0;
}

static void module_free(struct CUmod_st *module)
{
    struct CUfunc_st *fn = module->functions;
    while (fn != NULL) {
        struct CUfunc_st *next = fn->module_next;
        fc_handle_remove(&fn->handle);
        free(fn);
        fn = next;
    }
    fc_handle_remove(&module->handle);
    free(module);
}

void fc_ctx_destroy_modules(struct CUctx_st *ctx)
{
    struct fc_handle *it = fc.handles[FC_HANDLE_MODULE];
    while (it != NULL) {
        struct fc_handle *next = it->next;
        struct CUmod_st *module = (struct CUmod_st *)it;
        if (module->ctx == ctx)
            module_free(module);
        it = next;
    }
}

static const struct fakecuda_kernel *kernel_named(const char *name)
{
    for (const struct fakecuda_kernel *const *k = fakecuda_kernels; *k != NULL; k++)
        if (strcmp((*k)->name, name) == 0)
            return *k;
    return NULL;
}

FC_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    err = module == NULL || image == NULL ? CUDA_ERROR_INVALID_VALUE : fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS && !image_valid(image))
        err = CUDA_ERROR_INVALID_IMAGE;
    if (err == CUDA_SUCCESS) {
        struct CUmod_st *mod = calloc(1, sizeof(*mod));
        if (mod == NULL) {
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            mod->ctx = ctx;
            fc_handle_add(&mod->handle, FC_HANDLE_MODULE);
            *module = mod;
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    const struct fakecuda_kernel *kernel = NULL;
    if (hfunc == NULL || name == NULL)
        err = CUDA_ERROR_INVALID_VALUE;
    else if (!fc_handle_live(hmod, FC_HANDLE_MODULE))
        err = CUDA_ERROR_INVALID_HANDLE;
    else if ((kernel = kernel_named(name)) == NULL)
        err = CUDA_ERROR_NOT_FOUND;
    if (err == CUDA_SUCCESS) {
        struct CUfunc_st *fn = hmod->functions;
        while (fn != NULL && fn->kernel != kernel)
            fn = fn->module_next;
        if (fn == NULL && (fn = calloc(1, sizeof(*fn))) != NULL) {
            fn->module = hmod;
            fn->kernel = kernel;
            fn->module_next = hmod->functions;
            hmod->functions = fn;
            fc_handle_add(&fn->handle, FC_HANDLE_FUNCTION);
        }
        if (fn == NULL)
            err = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *hfunc = fn;
    }
    if (err == CUDA_ERROR_NOT_FOUND)
        fc_log("cuModuleGetFunction: no kernel \"%s\" in the registry (kernels.c)", name);
    fc_unlock();
    return fc_ret(__func__, err);
}

FC_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    if (!fc_handle_live(hmod, FC_HANDLE_MODULE))
        err = CUDA_ERROR_INVALID_HANDLE;
    else
        module_free(hmod);
    fc_unlock();
    return fc_ret(__func__, err);
}

/* The launch configuration registered kernels accept: 1-D grid and block. */
static CUresult launch_dims_check(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shared_bytes)
{
    if (gx == 0 || gx > MAX_GRID_X || gy != 1 || gz != 1)
        return CUDA_ERROR_INVALID_VALUE;
    if (bx == 0 || bx > FC_MAX_BLOCK_THREADS || by != 1 || bz != 1)
        return CUDA_ERROR_INVALID_VALUE;
    if (shared_bytes > FC_MAX_DYNAMIC_SMEM)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                  unsigned int gridDimZ, unsigned int blockDimX,
                                  unsigned int blockDimY, unsigned int blockDimZ,
                                  unsigned int sharedMemBytes, CUstream hStream,
                                  void **kernelParams, void **extra)
{
    CUresult err = fc_lock_enter();
    if (err != CUDA_SUCCESS)
        return fc_ret(__func__, err);
    struct CUctx_st *ctx = NULL;
    struct CUstream_st *stream = NULL;
    err = fc_ctx_current(&ctx);
    if (err == CUDA_SUCCESS && !fc_handle_live(f, FC_HANDLE_FUNCTION))
        err = CUDA_ERROR_INVALID_HANDLE;
    if (err == CUDA_SUCCESS)
        err = fc_stream_resolve(hStream, ctx, &stream);
    if (err == CUDA_SUCCESS && (f->module->ctx != ctx || stream->ctx != ctx))
        err = CUDA_ERROR_INVALID_HANDLE; /* a function or stream of another context */
    if (err == CUDA_SUCCESS)
        err = launch_dims_check(gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                sharedMemBytes);
    if (err == CUDA_SUCCESS && (extra != NULL || PARAMS_MISSING(f->kernel, kernelParams)))
        err = CUDA_ERROR_INVALID_VALUE;
    if (err == CUDA_SUCCESS && fc.knobs.launch_fail_after >= 0 &&
        fc.launches++ >= fc.knobs.launch_fail_after) {
        err = CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
        if (stream->capture != NULL)
            fc_capture_invalidate(stream->capture);
    }
    if (err == CUDA_SUCCESS) {
        const struct fakecuda_kernel *kernel = f->kernel;
        void *params = malloc(kernel->param_bytes != 0 ? kernel->param_bytes : 1);
        if (params == NULL) {
            err = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            if (kernel->param_bytes != 0)
                memcpy(params, kernelParams[0], kernel->param_bytes);
            struct fc_work work = {.kind = FC_WORK_KERNEL,
                                   .kernel = {kernel, gridDimX, blockDimX, params}};
            fc_log("launch %s <<<%u, %u>>> on stream %p%s", kernel->name, gridDimX, blockDimX,
                   (void *)stream, stream->capture != NULL ? " (captured)" : "");
            err = fc_stream_do(stream, &work);
        }
    }
    fc_unlock();
    return fc_ret(__func__, err);
}
