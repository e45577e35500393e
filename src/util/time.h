/* Monotonic time and deadlines, in nanoseconds. */
#ifndef CFX_UTIL_TIME_H
#define CFX_UTIL_TIME_H

#include <stdint.h>
#include <time.h>

#define CFX_NS_PER_SEC INT64_C(1000000000)
#define CFX_NS_PER_MS INT64_C(1000000)

static inline int64_t cfx_time_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * CFX_NS_PER_SEC + ts.tv_nsec;
}

/* Deadline @p seconds from now; seconds <= 0 means "never" (INT64_MAX). */
static inline int64_t cfx_time_deadline_s(int64_t seconds)
{
    if (seconds <= 0)
        return INT64_MAX;
    return cfx_time_now_ns() + seconds * CFX_NS_PER_SEC;
}

/* Milliseconds left until @p deadline_ns, clamped to [0, cap_ms]. */
static inline int cfx_time_left_ms(int64_t deadline_ns, int cap_ms)
{
    if (deadline_ns == INT64_MAX)
        return cap_ms;
    int64_t left = (deadline_ns - cfx_time_now_ns()) / CFX_NS_PER_MS;
    if (left < 0)
        return 0;
    return left > cap_ms ? cap_ms : (int)left;
}

#endif /* CFX_UTIL_TIME_H */
