/* Shared by the demos (public API only): the wall clock, the error line,
 * and the `compiled step:` line a demo prints after its training loop when
 * it ran its step with --compile. */
#ifndef CTPU_DEMO_UTIL_H
#define CTPU_DEMO_UTIL_H

#include <ctpu.h>
#include <stdio.h>
#include <time.h>

/* Seconds of CLOCK_MONOTONIC. */
static inline double demo_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Prints "PROG: WHAT: <ctpu_last_error()>" on stderr; returns 1 (the exit status). */
static inline int demo_fail(const char *prog, const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", prog, what, ctpu_last_error());
    return 1;
}

/* Prints "compiled step: calls=.. captures=.. replays=.. guard_failures=..
 * graph_breaks=.. host_us_per_call=.. [last: REASON]" for cstep on stdout;
 * nothing for NULL (no --compile). host_us_per_call is the calling thread's
 * CPU time per ctpu_compiled_call, in microseconds. */
static inline void demo_print_compiled(ctpu_compiled *cstep)
{
    ctpu_compiled_info ci;
    if (!cstep || ctpu_compiled_get_info(cstep, &ci) != CTPU_OK) return;
    printf("compiled step: calls=%llu captures=%llu replays=%llu guard_failures=%llu graph_breaks=%llu "
           "host_us_per_call=%.1f%s%s\n", (unsigned long long)ci.calls, (unsigned long long)ci.captures,
           (unsigned long long)ci.replays, (unsigned long long)ci.guard_failures,
           (unsigned long long)ci.graph_breaks, ci.calls ? (double)ci.host_ns / 1e3 / (double)ci.calls : 0.0,
           ci.last_reason[0] ? " last: " : "", ci.last_reason);
}

#endif
