/* Monotonic time and deadlines, in nanoseconds. */
#ifndef CFX_UTIL_TIME_H
#define CFX_UTIL_TIME_H

#include <stdint.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#define CFX_NS_PER_SEC INT64_C(1000000000)
#define CFX_NS_PER_MS  INT64_C(1000000)

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

/*
 * Ticks: a cheaper timestamp than cfx_time_now_ns for bookkeeping written on
 * every call (the flight recorder). With an invariant TSC (x86: constant
 * rate in every power state, the same on every core; what the kernel's
 * "tsc" clock source relies on) a tick is one TSC count, read in about a
 * third of a clock_gettime; elsewhere it is a nanosecond of CLOCK_MONOTONIC.
 * An origin, taken once, converts: the rate is measured between the origin
 * and the conversion, so it needs no frequency from the kernel.
 */
struct cfx_time_ticks_origin {
    int tsc;        /* 1: ticks are TSC counts; 0: CLOCK_MONOTONIC nanoseconds. */
    int64_t ns;     /* CLOCK_MONOTONIC at the origin. */
    uint64_t ticks; /* Ticks at the origin. */
};

static inline uint64_t cfx_time_ticks(const struct cfx_time_ticks_origin *origin)
{
#if defined(__x86_64__) || defined(__i386__)
    if (origin->tsc)
        return __builtin_ia32_rdtsc();
#endif
    (void)origin;
    return (uint64_t)cfx_time_now_ns();
}

/* Setup-time only (cpuid may trap to a hypervisor). */
static inline void cfx_time_ticks_origin_init(struct cfx_time_ticks_origin *origin)
{
    origin->tsc = 0;
#if defined(__x86_64__) || defined(__i386__)
    unsigned eax, ebx, ecx, edx;
    if (__get_cpuid(0x80000000u, &eax, &ebx, &ecx, &edx) && eax >= 0x80000007u &&
        __get_cpuid(0x80000007u, &eax, &ebx, &ecx, &edx))
        origin->tsc = (edx >> 8) & 1; /* Invariant TSC. */
#endif
    origin->ns = cfx_time_now_ns();
    origin->ticks = cfx_time_ticks(origin);
}

/* Nanoseconds per tick, measured from the origin to now (1 without a TSC;
 * 0 when no tick has passed since the origin). */
static inline double cfx_time_ns_per_tick(const struct cfx_time_ticks_origin *origin)
{
    if (!origin->tsc)
        return 1.0;
    int64_t ns = cfx_time_now_ns();
    uint64_t ticks = cfx_time_ticks(origin);
    if (ticks <= origin->ticks)
        return 0.0;
    return (double)(ns - origin->ns) / (double)(ticks - origin->ticks);
}

#endif /* CFX_UTIL_TIME_H */
