/*
 * Error sentences. The layer that detects a failure records what failed,
 * which peer, and what to try, with cfx_error_set(); it lands in a
 * thread-local slot and in the process-wide "last error". The core copies the
 * thread's sentence into the communicator when an API call fails, so
 * cfxGetLastError(comm) and cfxGetLastError(NULL) both answer.
 */
#ifndef CFX_UTIL_ERROR_H
#define CFX_UTIL_ERROR_H

#include <stddef.h>

#include "conflux.h"

#define CFX_ERROR_MAX 512

/* Record a failure sentence (printf format), log it at WARN under @p subsys,
 * and return @p res so callers can write `return cfx_error_set(...)`. */
cfxResult_t cfx_error_set(cfxResult_t res, unsigned subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Record a sentence ending with strerror(errno_value); returns cfxSystemError. */
cfxResult_t cfx_error_set_errno(int errno_value, unsigned subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* This thread's last sentence ("" when none). */
const char *cfx_error_thread_last(void);
/* Forget this thread's sentence (at the start of an API call). */
void cfx_error_thread_clear(void);
/* The process's last sentence. */
const char *cfx_error_process_last(void);

/* The name of a result code, as cfxGetErrorString gives it (every layer may
 * ask; the API function is this). */
const char *cfx_error_result_string(cfxResult_t result);

#endif /* CFX_UTIL_ERROR_H */
