/*
 * The kernel registry (kernels.h): every kernel cuModuleGetFunction can
 * find. Append new kernels before the NULL.
 */
#include "kernels.h"

const struct fakecuda_kernel *const fakecuda_kernels[] = {
    &fakecuda_conflux_kernel,
    &fakecuda_conflux_kernel_wide,
    &fakecuda_conflux_kernel_far,
    &fakecuda_test_fill,
    &fakecuda_test_wait_flag,
    &fakecuda_test_relay,
    NULL,
};
