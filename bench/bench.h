/* Shared by the benchmarks: the clocks and the median of a run's samples. Header-only
 * (static inline), so each bench stays one translation unit. */
#ifndef CTPU_BENCH_H
#define CTPU_BENCH_H
#include <stdlib.h>
#include <time.h>

/* Seconds on clock id: CLOCK_MONOTONIC (wall), CLOCK_PROCESS_CPUTIME_ID
 * (every thread of the process) or CLOCK_THREAD_CPUTIME_ID (the caller's). */
static inline double bench_clock(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* qsort's comparison for doubles, ascending. */
static inline int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (the upper one for even n); sorts v in place. */
static inline double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}
#endif
