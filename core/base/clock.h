/* clock: the wall clock in unix milliseconds, for what is a date (expiry, records, periods).
 * Durations and deadlines use the loop's monotonic clock (uv_now) instead. */
#ifndef MG_CLOCK_H
#define MG_CLOCK_H

#include <stdint.h>
#include <uv.h>

static inline uint64_t mg_unix_ms(void)
{
    uv_timeval64_t tv;
    uv_gettimeofday(&tv);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

#endif
