/* Shared by the benchmarks: this core's register-only peaks, the
 * denominators of issue 18's ratios. peak_bf16_loop runs 24 independent
 * vdpbf16ps zmm chains, peak_fp32_loop 24 vfmadd231ps zmm chains (no
 * memory operands); each returns a value the caller must keep so the loop is
 * not removed. Header-only (static), x86-64 only; callers check
 * __builtin_cpu_supports("avx512bf16") / ("avx512f") before calling. */
#ifndef CTPU_BENCH_PEAK_H
#define CTPU_BENCH_PEAK_H
#include <immintrin.h>

/* FLOP of one iteration of either loop: 24 instructions x 16 lanes x
 * (2 MACs per lane for vdpbf16ps, 1 for the FMA) x 2 FLOP per MAC. */
static inline double peak_flop_per_iter(int bf16) { return 24.0 * 16 * (bf16 ? 4 : 2); }

__attribute__((target("avx512f,avx512bf16"), noinline, unused))
static double peak_bf16_loop(long iters)
{
    __m512 c[24];
    for (int i = 0; i < 24; i++) c[i] = _mm512_set1_ps((float)i);
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x0d800d80);
    for (long it = 0; it < iters; it++) {
        __asm__ volatile("" : "+v"(a), "+v"(b));
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++) c[i] = _mm512_dpbf16_ps(c[i], a, b);
    }
    __m512 s = c[0];
    for (int i = 1; i < 24; i++) s = _mm512_add_ps(s, c[i]);
    return (double)_mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,fma"), noinline, unused))
static double peak_fp32_loop(long iters)
{
    __m512 c[24];
    for (int i = 0; i < 24; i++) c[i] = _mm512_set1_ps((float)i);
    __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-30f);
    for (long it = 0; it < iters; it++) {
        __asm__ volatile("" : "+v"(a), "+v"(b));
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++) c[i] = _mm512_fmadd_ps(a, b, c[i]);
    }
    __m512 s = c[0];
    for (int i = 1; i < 24; i++) s = _mm512_add_ps(s, c[i]);
    return (double)_mm512_reduce_add_ps(s);
}
#endif
