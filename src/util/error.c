/* Error sentences: see error.h. */
#include "src/util/error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "src/util/log.h"

static _Thread_local char thread_last[CFX_ERROR_MAX];
static char process_last[CFX_ERROR_MAX];
static pthread_mutex_t process_lock = PTHREAD_MUTEX_INITIALIZER;

static void record(unsigned subsys, const char *text)
{
    if (text != thread_last)
        snprintf(thread_last, sizeof(thread_last), "%s", text);
    pthread_mutex_lock(&process_lock);
    snprintf(process_last, sizeof(process_last), "%s", text);
    pthread_mutex_unlock(&process_lock);
    CFX_WARN(subsys, "%s", text);
}

cfxResult_t cfx_error_set(cfxResult_t res, unsigned subsys, const char *fmt, ...)
{
    /* Formatted aside first: a caller may pass cfx_error_thread_last() as an argument. */
    char text[sizeof(thread_last)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    memcpy(thread_last, text, sizeof(text));
    record(subsys, thread_last);
    return res;
}

cfxResult_t cfx_error_set_errno(int errno_value, unsigned subsys, const char *fmt, ...)
{
    char what[CFX_ERROR_MAX - 160];
    char reason[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    /* GNU strerror_r returns the message (maybe not in reason). */
    const char *msg = strerror_r(errno_value, reason, sizeof(reason));
    snprintf(thread_last, sizeof(thread_last), "%s: %s", what, msg);
    record(subsys, thread_last);
    return cfxSystemError;
}

const char *cfx_error_thread_last(void)
{
    return thread_last;
}

void cfx_error_thread_clear(void)
{
    thread_last[0] = '\0';
}

const char *cfx_error_process_last(void)
{
    /* A copy per thread, so a reader never sees a sentence being replaced. */
    static _Thread_local char copy[CFX_ERROR_MAX];
    pthread_mutex_lock(&process_lock);
    memcpy(copy, process_last, sizeof(copy));
    pthread_mutex_unlock(&process_lock);
    return copy;
}

const char *cfx_error_result_string(cfxResult_t result)
{
    switch (result) {
    case cfxSuccess: return "no error";
    case cfxUnhandledCudaError: return "unhandled cuda error (run with CFX_DEBUG=INFO for details)";
    case cfxSystemError: return "unhandled system error (run with CFX_DEBUG=INFO for details)";
    case cfxInternalError:
        return "internal error - please report this issue to the Conflux developers";
    case cfxInvalidArgument: return "invalid argument (run with CFX_DEBUG=WARN for details)";
    case cfxInvalidUsage: return "invalid usage (run with CFX_DEBUG=WARN for details)";
    case cfxRemoteError: return "remote process exited or there was a network error";
    case cfxInProgress: return "Conflux operation in progress";
    case cfxTimeout: return "operation timed out (see cfxGetLastError)";
    case cfxNumResults: break;
    }
    return "unknown result code";
}
