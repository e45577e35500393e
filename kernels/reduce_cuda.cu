/*
 * CUDA reduction kernels over reduce_ops.h, for all 12 types x 4 distinct ops
 * (Avg reduces as Sum) plus the Avg finish, and their host launchers.
 *
 * One grid-stride kernel template per functor. When the three pointers are
 * 16-byte aligned (cudaMalloc'd buffers at element offsets that are multiples
 * of 16 bytes) each thread moves 16-byte packs; otherwise, and for the tail,
 * it works element by element. The grid is capped, so huge counts loop.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/reduce_cuda.h"
#include "kernels/reduce_ops.h"

extern "C" {
#include "src/util/log.h"
}

namespace
{

constexpr unsigned kThreads = 256;
constexpr size_t kMaxBlocks = 4096;

/* One functor per (type, op): apply() is the reduce_ops.h element op. */
#define DEVICE_FUNCTORS(e, name, T)                                                                \
    struct sum_##name {                                                                            \
        typedef T type;                                                                            \
        __device__ static T apply(T a, T b)                                                        \
        {                                                                                          \
            return cfx_sum_##name(a, b);                                                           \
        }                                                                                          \
    };                                                                                             \
    struct prod_##name {                                                                           \
        typedef T type;                                                                            \
        __device__ static T apply(T a, T b)                                                        \
        {                                                                                          \
            return cfx_prod_##name(a, b);                                                          \
        }                                                                                          \
    };                                                                                             \
    struct max_##name {                                                                            \
        typedef T type;                                                                            \
        __device__ static T apply(T a, T b)                                                        \
        {                                                                                          \
            return cfx_max_##name(a, b);                                                           \
        }                                                                                          \
    };                                                                                             \
    struct min_##name {                                                                            \
        typedef T type;                                                                            \
        __device__ static T apply(T a, T b)                                                        \
        {                                                                                          \
            return cfx_min_##name(a, b);                                                           \
        }                                                                                          \
    };                                                                                             \
    struct finish_##name {                                                                         \
        typedef T type;                                                                            \
        __device__ static T apply(T x, int nranks)                                                 \
        {                                                                                          \
            return cfx_avg_finish_##name(x, nranks);                                               \
        }                                                                                          \
    };
CFX_REDUCE_FOR_EACH_TYPE(DEVICE_FUNCTORS)
#undef DEVICE_FUNCTORS

/* 16 bytes seen as elements. */
template <typename T> union Pack {
    static constexpr int kCount = 16 / sizeof(T);
    uint4 raw;
    T elt[kCount];
};

__device__ inline bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

template <typename Op>
__global__ void reduce_kernel(typename Op::type *dst, const typename Op::type *src_a,
                              const typename Op::type *src_b, size_t count)
{
    typedef typename Op::type T;
    const int kPack = Pack<T>::kCount;
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t n_packs = 0;

    if (aligned16(dst) && aligned16(src_a) && aligned16(src_b))
        n_packs = count / kPack;
    for (size_t p = tid; p < n_packs; p += stride) {
        Pack<T> a, b;
        a.raw = reinterpret_cast<const uint4 *>(src_a)[p];
        b.raw = reinterpret_cast<const uint4 *>(src_b)[p];
#pragma unroll
        for (int k = 0; k < kPack; k++)
            a.elt[k] = Op::apply(a.elt[k], b.elt[k]);
        reinterpret_cast<uint4 *>(dst)[p] = a.raw;
    }
    for (size_t i = n_packs * kPack + tid; i < count; i += stride)
        dst[i] = Op::apply(src_a[i], src_b[i]);
}

template <typename Op>
__global__ void finish_kernel(typename Op::type *dst, const typename Op::type *src, size_t count,
                              int nranks)
{
    typedef typename Op::type T;
    const int kPack = Pack<T>::kCount;
    size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t n_packs = 0;

    if (aligned16(dst) && aligned16(src))
        n_packs = count / kPack;
    for (size_t p = tid; p < n_packs; p += stride) {
        Pack<T> x;
        x.raw = reinterpret_cast<const uint4 *>(src)[p];
#pragma unroll
        for (int k = 0; k < kPack; k++)
            x.elt[k] = Op::apply(x.elt[k], nranks);
        reinterpret_cast<uint4 *>(dst)[p] = x.raw;
    }
    for (size_t i = n_packs * kPack + tid; i < count; i += stride)
        dst[i] = Op::apply(src[i], nranks);
}

/* Enough blocks for one pack per thread, capped. */
template <typename T> dim3 grid_for(size_t count)
{
    size_t units = count / Pack<T>::kCount + Pack<T>::kCount;
    size_t blocks = (units + kThreads - 1) / kThreads;
    return dim3((unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks));
}

cfxResult_t launch_result(cudaError_t err, const char *what, size_t count)
{
    if (err == cudaSuccess)
        return cfxSuccess;
    CFX_WARN(CFX_LOG_COLL, "CUDA %s kernel launch (%zu elements) failed: %s (%d)", what, count,
             cudaGetErrorString(err), (int)err);
    return cfxUnhandledCudaError;
}

template <typename Op>
cfxResult_t launch_reduce(void *dst, const void *src_a, const void *src_b, size_t count,
                          cudaStream_t stream, const char *what)
{
    typedef typename Op::type T;
    T *d = static_cast<T *>(dst);
    const T *a = static_cast<const T *>(src_a);
    const T *b = static_cast<const T *>(src_b);
    void *args[] = {&d, &a, &b, &count};

    if (count == 0)
        return cfxSuccess;
    return launch_result(cudaLaunchKernel((const void *)reduce_kernel<Op>, grid_for<T>(count),
                                          dim3(kThreads), args, 0, stream),
                         what, count);
}

template <typename Op>
cfxResult_t launch_finish(void *dst, const void *src, size_t count, int nranks, cudaStream_t stream,
                          const char *what)
{
    typedef typename Op::type T;
    T *d = static_cast<T *>(dst);
    const T *s = static_cast<const T *>(src);
    void *args[] = {&d, &s, &count, &nranks};

    if (count == 0)
        return cfxSuccess;
    return launch_result(cudaLaunchKernel((const void *)finish_kernel<Op>, grid_for<T>(count),
                                          dim3(kThreads), args, 0, stream),
                         what, count);
}

} // namespace

extern "C" int cfx_reduce_cuda_available(void)
{
    int n_devices = 0;

    if (cudaGetDeviceCount(&n_devices) != cudaSuccess) {
        (void)cudaGetLastError(); /* leave no error behind for later checks */
        return 0;
    }
    return n_devices > 0;
}

extern "C" cfxResult_t cfx_reduce_cuda(void *dst, const void *src_a, const void *src_b,
                                       size_t count, cfxDataType_t type, cfxRedOp_t op,
                                       cfxStream_t stream)
{
    switch (type) {
#define CASE_TYPE(e, name, T)                                                                      \
    case e:                                                                                        \
        switch (op) {                                                                              \
        case cfxSum:                                                                               \
        case cfxAvg:                                                                               \
            return launch_reduce<sum_##name>(dst, src_a, src_b, count, stream, "sum " #name);      \
        case cfxProd:                                                                              \
            return launch_reduce<prod_##name>(dst, src_a, src_b, count, stream, "prod " #name);    \
        case cfxMax:                                                                               \
            return launch_reduce<max_##name>(dst, src_a, src_b, count, stream, "max " #name);      \
        case cfxMin:                                                                               \
            return launch_reduce<min_##name>(dst, src_a, src_b, count, stream, "min " #name);      \
        default: return cfxInvalidArgument;                                                        \
        }
        CFX_REDUCE_FOR_EACH_TYPE(CASE_TYPE)
#undef CASE_TYPE
    default: return cfxInvalidArgument;
    }
}

extern "C" cfxResult_t cfx_reduce_cuda_avg_finish(void *dst, const void *src, size_t count,
                                                  cfxDataType_t type, int nranks,
                                                  cfxStream_t stream)
{
    if (nranks <= 0)
        return cfxInvalidArgument;
    switch (type) {
#define CASE_TYPE(e, name, T)                                                                      \
    case e:                                                                                        \
        return launch_finish<finish_##name>(dst, src, count, nranks, stream, "avg finish " #name);
        CFX_REDUCE_FOR_EACH_TYPE(CASE_TYPE)
#undef CASE_TYPE
    default: return cfxInvalidArgument;
    }
}
