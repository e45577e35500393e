/*
 * CUDA reduction kernels: dst = a (op) b elementwise on device memory, for
 * every data type and op of conflux.h, with the same per-element semantics as
 * the host kernels (both use reduce_ops.h). Built only when CFX_HAVE_CUDA; the
 * header itself needs no CUDA header and can be included from C.
 */
#ifndef CFX_KERNELS_REDUCE_CUDA_H
#define CFX_KERNELS_REDUCE_CUDA_H

#include <stddef.h>

#include "conflux.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Whether a CUDA device can run the kernels. 0 when cudaGetDeviceCount fails
 * (no driver, or a driver too old for this runtime: that means no GPU, not an
 * error) or reports no device. Does not block.
 */
int cfx_reduce_cuda_available(void);

/**
 * Enqueue dst[i] = src_a[i] op src_b[i] for i < count on @p stream (NULL: the
 * legacy default stream). Device pointers (or managed/mapped memory the
 * device can reach); dst may equal src_a or src_b exactly, no other overlap;
 * any alignment of the element type. cfxAvg reduces as cfxSum (finish with
 * cfx_reduce_cuda_avg_finish). Returns when the kernel is enqueued, not
 * finished; count 0 enqueues nothing.
 * @return cfxSuccess; cfxInvalidArgument for a type/op outside conflux.h;
 *         cfxUnhandledCudaError when the launch fails (logged).
 */
cfxResult_t cfx_reduce_cuda(void *dst, const void *src_a, const void *src_b, size_t count,
                            cfxDataType_t type, cfxRedOp_t op, cfxStream_t stream);

/**
 * Enqueue dst[i] = src[i] / nranks (integers truncate toward zero) on
 * @p stream; dst may equal src. Same rules and results as cfx_reduce_cuda.
 */
cfxResult_t cfx_reduce_cuda_avg_finish(void *dst, const void *src, size_t count, cfxDataType_t type,
                                       int nranks, cfxStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* CFX_KERNELS_REDUCE_CUDA_H */
