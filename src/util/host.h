/*
 * Facts about this process's host: its identity (which ranks share a host,
 * and so memory), random bytes, and the CUDA device in use, if any.
 */
#ifndef CFX_UTIL_HOST_H
#define CFX_UTIL_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "conflux.h"

#define CFX_HOST_ID_MAX 128

/* "hostname:boot_id", or CFX_HOSTID when set (tests use it to make network
 * namespaces look like different hosts). */
void cfx_host_identity(char *text, size_t size);

/* 64-bit FNV-1a hash of a string. */
uint64_t cfx_host_hash(const char *text);

/* Fill @p buf with random bytes from the kernel. */
cfxResult_t cfx_host_random(void *buf, size_t size);

/* The current CUDA device, or -1 when this build has no CUDA or the machine
 * has no usable GPU (no driver, "driver insufficient", no device). */
int cfx_host_cuda_device(void);

/* Make @p device current for this thread. cfxInvalidArgument with a
 * sentence when there is no such usable device. */
cfxResult_t cfx_host_cuda_select(int device);

/* Make host buffers safe to use for a call given @p stream: NULL needs
 * nothing; a CUDA stream is synchronised first. cfxInvalidArgument when a
 * stream is given without a usable GPU, or a buffer is device memory (the
 * GPU data path is not built yet). */
cfxResult_t cfx_host_stream_prepare(cfxStream_t stream, const void *buf_a, const void *buf_b,
                                    const char *fn);

#endif /* CFX_UTIL_HOST_H */
