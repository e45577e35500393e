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

#if CFX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

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

int cfx_host_cuda_device(void)
{
#if CFX_HAVE_CUDA
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        CFX_INFO(CFX_LOG_INIT, "no usable GPU (%s); host buffers only",
                 err != cudaSuccess ? cudaGetErrorString(err) : "no device");
        (void)cudaGetLastError(); /* Clear the sticky-free error state. */
        return -1;
    }
    int device = -1;
    if (cudaGetDevice(&device) != cudaSuccess)
        return -1;
    return device;
#else
    return -1;
#endif
}

cfxResult_t cfx_host_cuda_select(int device)
{
#if CFX_HAVE_CUDA
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "CUDA device %d requested but no GPU is usable (%s); "
                             "pass devlist = NULL for host ranks",
                             device, cudaGetErrorString(err));
    }
    if (device < 0 || device >= count)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                             "CUDA device %d requested but this machine has %d", device, count);
    err = cudaSetDevice(device);
    if (err != cudaSuccess)
        return cfx_error_set(cfxUnhandledCudaError, CFX_LOG_INIT, "cudaSetDevice(%d) failed: %s",
                             device, cudaGetErrorString(err));
    return cfxSuccess;
#else
    return cfx_error_set(cfxInvalidArgument, CFX_LOG_INIT,
                         "CUDA device %d requested but this Conflux was built without CUDA; "
                         "pass devlist = NULL for host ranks",
                         device);
#endif
}

#if CFX_HAVE_CUDA
static int is_device_memory(const void *ptr)
{
    if (ptr == NULL)
        return 0;
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return attr.type == cudaMemoryTypeDevice;
}
#endif

cfxResult_t cfx_host_stream_prepare(cfxStream_t stream, const void *buf_a, const void *buf_b,
                                    const char *fn)
{
    if (stream == NULL)
        return cfxSuccess;
#if CFX_HAVE_CUDA
    if (cfx_host_cuda_device() < 0)
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                             "%s: a CUDA stream was given but no GPU is usable; pass NULL for "
                             "host buffers",
                             fn);
    if (is_device_memory(buf_a) || is_device_memory(buf_b))
        return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                             "%s: GPU buffers are not supported by this version (host buffers "
                             "only)",
                             fn);
    cudaError_t err = cudaStreamSynchronize((cudaStream_t)stream);
    if (err != cudaSuccess)
        return cfx_error_set(cfxUnhandledCudaError, CFX_LOG_COLL, "%s: cudaStreamSynchronize: %s",
                             fn, cudaGetErrorString(err));
    return cfxSuccess;
#else
    (void)buf_a;
    (void)buf_b;
    return cfx_error_set(cfxInvalidArgument, CFX_LOG_COLL,
                         "%s: a CUDA stream was given but this Conflux has no CUDA; pass NULL for "
                         "host buffers",
                         fn);
#endif
}
