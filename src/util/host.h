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

#endif /* CFX_UTIL_HOST_H */
