/*
 * Host reduction kernels: dst = a (op) b, elementwise, for every data type and
 * op of conflux.h. The per-element arithmetic lives in reduce_ops.h, shared
 * with the CUDA kernels; this header is the host entry point that the
 * executors call.
 */
#ifndef CFX_KERNELS_REDUCE_H
#define CFX_KERNELS_REDUCE_H

#include <stddef.h>

#include "conflux.h"

/** Instruction-set paths of the host reductions, slowest first. */
enum cfx_reduce_isa {
    CFX_REDUCE_ISA_PORTABLE = 0,
    CFX_REDUCE_ISA_AVX2 = 1,
    CFX_REDUCE_ISA_AVX512 = 2,
    CFX_REDUCE_ISA_COUNT
};

/** Bytes per element of @p type; 0 for a value outside cfxDataType_t. */
size_t cfx_type_size(cfxDataType_t type);

/**
 * dst[i] = src_a[i] op src_b[i] for i < count, on the best path this CPU
 * supports. cfxAvg reduces as cfxSum (finish with cfx_reduce_avg_finish).
 * dst may equal src_a or src_b (exact aliasing); no other overlap. Any
 * alignment. Never fails for valid type/op (checked by the caller).
 */
void cfx_reduce_host(void *dst, const void *src_a, const void *src_b, size_t count,
                     cfxDataType_t type, cfxRedOp_t op);

/** dst[i] = src[i] / nranks (integers truncate toward zero); dst may equal src. */
void cfx_reduce_avg_finish(void *dst, const void *src, size_t count, cfxDataType_t type,
                           int nranks);

/** Whether this CPU (and this build) can run @p isa. */
int cfx_reduce_isa_supported(enum cfx_reduce_isa isa);

/** The path cfx_reduce_host uses: "avx512", "avx2" or "portable". */
const char *cfx_reduce_isa_name(enum cfx_reduce_isa isa);
enum cfx_reduce_isa cfx_reduce_isa_selected(void);

/**
 * Whether @p isa has a kernel of its own for (type, op); where it has not,
 * cfx_reduce_host_isa runs the portable kernel. Always 1 for the portable path.
 */
int cfx_reduce_isa_has_kernel(enum cfx_reduce_isa isa, cfxDataType_t type, cfxRedOp_t op);

/** cfx_reduce_host on a chosen path (for tests and benchmarks); the path must be supported. */
void cfx_reduce_host_isa(enum cfx_reduce_isa isa, void *dst, const void *src_a, const void *src_b,
                         size_t count, cfxDataType_t type, cfxRedOp_t op);

#endif /* CFX_KERNELS_REDUCE_H */
