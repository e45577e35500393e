/*
 * Result propagation. One result type, cfxResult_t, from the bottom to the
 * top: CFX_CHECK returns the failure, CFX_CHECK_GOTO jumps to a cleanup
 * label, both leaving a file:line breadcrumb at TRACE level. errno is
 * translated once, where it occurs, by the callers of cfx_error_set().
 */
#ifndef CFX_UTIL_CHECK_H
#define CFX_UTIL_CHECK_H

#include "conflux.h"
#include "src/util/log.h"

#define CFX_CHECK(call)                                                                            \
    do {                                                                                           \
        cfxResult_t check_res_ = (call);                                                           \
        if (check_res_ != cfxSuccess) {                                                            \
            CFX_TRACE(CFX_LOG_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)check_res_);            \
            return check_res_;                                                                     \
        }                                                                                          \
    } while (0)

#define CFX_CHECK_GOTO(call, res, label)                                                           \
    do {                                                                                           \
        (res) = (call);                                                                            \
        if ((res) != cfxSuccess) {                                                                 \
            CFX_TRACE(CFX_LOG_ALL, "%s:%d -> %d", __FILE__, __LINE__, (int)(res));                 \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

#endif /* CFX_UTIL_CHECK_H */
