/* Shared by the benchmarks: the median of a run's samples. Header-only
 * (static inline), so each bench stays one translation unit. */
#ifndef CTPU_BENCH_H
#define CTPU_BENCH_H
#include <stdlib.h>

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
