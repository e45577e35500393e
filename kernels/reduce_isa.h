/*
 * Kernel tables of the host reduction paths, one per instruction set. Internal
 * to kernels/: reduce_host.c dispatches through them; the vector paths are
 * compiled with their own ISA flags and must only be called on a CPU that
 * cfx_reduce_isa_supported() accepts.
 *
 * A table has one row per cfxDataType_t and one column per distinct op (Avg
 * reduces as Sum, so it has no column). A NULL entry means "no vector version":
 * the caller uses the portable kernel, which is never NULL.
 */
#ifndef CFX_KERNELS_REDUCE_ISA_H
#define CFX_KERNELS_REDUCE_ISA_H

#include <stddef.h>

#include "conflux.h"

/** dst[i] = a[i] op b[i]; any alignment; dst may equal a and/or b exactly. */
typedef void (*cfx_reduce_kernel_fn)(void *dst, const void *src_a, const void *src_b, size_t count);

/** Columns of a kernel table. */
enum cfx_reduce_op_col {
    CFX_REDUCE_COL_SUM = 0,
    CFX_REDUCE_COL_PROD = 1,
    CFX_REDUCE_COL_MAX = 2,
    CFX_REDUCE_COL_MIN = 3,
    CFX_REDUCE_COL_COUNT
};

typedef cfx_reduce_kernel_fn cfx_reduce_kernel_table[cfxNumTypes][CFX_REDUCE_COL_COUNT];

#if defined(__x86_64__)
/* AVX2 + F16C + FMA kernels (reduce_avx2.c). */
extern const cfx_reduce_kernel_table cfx_reduce_avx2_kernels;
/* AVX-512 F/BW/VL kernels (reduce_avx512.c). */
extern const cfx_reduce_kernel_table cfx_reduce_avx512_kernels;
#endif

#endif /* CFX_KERNELS_REDUCE_ISA_H */
