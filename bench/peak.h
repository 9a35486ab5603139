/* Shared by the benchmarks: this core's register-only peaks, the
 * denominators of issue 18's ratios. peak_bf16_loop runs 24 independent
 * vdpbf16ps zmm chains, peak_fp32_loop 24 vfmadd231ps zmm chains (no
 * memory operands); each returns a value the caller must keep so the loop is
 * not removed. Where the CPU has no AVX-512 (AVX2 + FMA only: Zen 2, Haswell)
 * the FMA peak is peak_fp32_ymm_loop's, 12 vfmadd231ps ymm chains (16 ymm
 * registers; 12 chains cover 2 pipes x 5 cycles of latency). Header-only
 * (static), x86-64 only; callers check __builtin_cpu_supports("avx512bf16")
 * before peak_bf16_loop and peak_fp32_avail() before peak_fp32_run, which
 * picks the widest loop at run time (peak_fp32_flop_per_iter: its FLOP). */
#ifndef CTPU_BENCH_PEAK_H
#define CTPU_BENCH_PEAK_H
#include <immintrin.h>

/* FLOP of one iteration of either loop: 24 instructions x 16 lanes x
 * (2 MACs per lane for vdpbf16ps, 1 for the FMA) x 2 FLOP per MAC. */
static inline double peak_flop_per_iter(int bf16) { return 24.0 * 16 * (bf16 ? 4 : 2); }

/* The body both zmm loops share: 24 accumulator chains c[i] (from i), the
 * operands a and b (declared by the caller) kept opaque to the optimiser,
 * STEP(c) the one instruction per chain, the sum of the chains returned. */
#define PEAK_ZMM_BODY(STEP)                                                     \
    __m512 c[24];                                                              \
    for (int i = 0; i < 24; i++) c[i] = _mm512_set1_ps((float)i);              \
    for (long it = 0; it < iters; it++) {                                      \
        __asm__ volatile("" : "+v"(a), "+v"(b));                               \
        _Pragma("GCC unroll 24") for (int i = 0; i < 24; i++) c[i] = STEP(c[i]); \
    }                                                                          \
    __m512 s = c[0];                                                           \
    for (int i = 1; i < 24; i++) s = _mm512_add_ps(s, c[i]);                   \
    return (double)_mm512_reduce_add_ps(s)

__attribute__((target("avx512f,avx512bf16"), noinline, unused))
static double peak_bf16_loop(long iters)
{
    __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x0d800d80);
#define PEAK_DP(acc) _mm512_dpbf16_ps(acc, a, b)
    PEAK_ZMM_BODY(PEAK_DP);
#undef PEAK_DP
}

__attribute__((target("avx512f,fma"), noinline, unused))
static double peak_fp32_loop(long iters)
{
    __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-30f);
#define PEAK_FMA(acc) _mm512_fmadd_ps(a, b, acc)
    PEAK_ZMM_BODY(PEAK_FMA);
#undef PEAK_FMA
}

__attribute__((target("avx2,fma"), noinline, unused))
static double peak_fp32_ymm_loop(long iters)
{
    __m256 c[12];
    for (int i = 0; i < 12; i++) c[i] = _mm256_set1_ps((float)i);
    __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(1e-30f);
    for (long it = 0; it < iters; it++) {
        __asm__ volatile("" : "+x"(a), "+x"(b));
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) c[i] = _mm256_fmadd_ps(a, b, c[i]);
    }
    __m256 s = c[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, c[i]);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return (double)_mm_cvtss_f32(h);
}

/* The FMA peak loop of this CPU: 2 zmm (AVX-512), 1 ymm (AVX2 + FMA), 0 none. */
static inline int peak_fp32_kind(void)
{
    if (__builtin_cpu_supports("avx512f")) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
    return 0;
}
static inline int peak_fp32_avail(void) { return peak_fp32_kind() > 0; }
/* 24 zmm x 16 lanes or 12 ymm x 8 lanes, 2 FLOP per MAC */
static inline double peak_fp32_flop_per_iter(void) { return peak_fp32_kind() == 2 ? 24.0 * 16 * 2 : 12.0 * 8 * 2; }
static inline double peak_fp32_run(long iters)
{
    return peak_fp32_kind() == 2 ? peak_fp32_loop(iters) : peak_fp32_ymm_loop(iters);
}
#endif
