/* Shared prelude of the x86 SIMD variants (simd_avx2.c, simd_avx512.c).
 *
 * The SIMD kernels are written once, in the drivers simd_elementwise.h and
 * simd_reduce.h, over a small per-ISA primitive layer (ggml's vector macro
 * layer); each ISA file defines that layer and then includes the drivers, which
 * stamp the ISA's functions and its variant tables (xxHash's dispatch
 * stamping: the same source compiled once per target with its own flags).
 *
 * What an ISA file defines before including the drivers (all static inline,
 * every operation rounded to f32, no FMA; -ffp-contract=off):
 *   CTPU_K_ISA                the suffix of its symbols (avx2, avx512);
 *   V, M, W                   f32 vector of W lanes, its lane mask;
 *   ld st                     unaligned load/store of W floats;
 *   tail_mask(r)              lanes i < r (any r: clipped to [0, W]);
 *   ld_m st_m                 masked load/store (masked-off lanes read as +0,
 *                             their memory never touched);
 *   m_zero m_or m_any         masks: empty, union, "any lane set";
 *   vset vzero vadd vsub vmul vdiv vsqrt vneg vabs;
 *   vmax_raw vmin_raw         vmaxps/vminps: a > b ? a : b (b when either is NaN);
 *   vsel(m, a, b)             m ? a : b;   vmaskz(m, a)  m ? a : +0;
 *   VCMP(a, b, pred)          IEEE compare with an _CMP_* predicate -> M;
 *   vexp vlog verf vlog1p vexpm1 vpow  SLEEF's non-FMA u10 functions of the ISA;
 *   vtanh                     kernels.h's double steps per lane (ref_u_TANH's);
 *   vgelu_erf                 kernels.h's GELU_ERF double steps per lane (ref_u_GELU_ERF's);
 *   vsin vcos                 in double per lane (widen, SLEEF double non-FMA
 *                             sin / cos u10, round once), as _ref;
 *   vround_bf16(x)            ctpu_f32_to_bf16 as f32 bits (low half zero);
 *   ld_bf16 st_bf16           W bf16 <-> W f32 (ctpu_bf16_to_f32 / ctpu_f32_to_bf16);
 *   ld_i32 st_i32             W i32 -> f32 (RNE), W f32 -> i32 (ctpu_f32_to_i32);
 *   vfold8(cop, v)            the lane tree's steps above 8 lanes (+8 for 16
 *                             lanes), leaving 8 lanes in a __m256. */
#ifndef CTPU_KERNELS_SIMD_X86_H
#define CTPU_KERNELS_SIMD_X86_H
#include <immintrin.h>
#include <math.h>
#include <sleef.h>
#include "internal.h"

#define AI static inline __attribute__((always_inline))
#define CTPU_K_PASTE2(a, b) a##b
#define CTPU_K_PASTE(a, b) CTPU_K_PASTE2(a, b)

/* The primitives whose intrinsics differ only in their prefix (P: _mm256,
 * _mm512) and SLEEF functions only in their suffix (S: f8_u10avx,
 * f16_u10avx512fnofma), stamped by each ISA file after V is defined. */
#define CTPU_K_SIMD_COMMON(P, S)                                                            \
    AI V ld(const float *p) { return P##_loadu_ps(p); }                                     \
    AI void st(float *p, V v) { P##_storeu_ps(p, v); }                                      \
    AI V vset(float f) { return P##_set1_ps(f); }                                           \
    AI V vzero(void) { return P##_setzero_ps(); }                                           \
    AI V vadd(V a, V b) { return P##_add_ps(a, b); }                                        \
    AI V vsub(V a, V b) { return P##_sub_ps(a, b); }                                        \
    AI V vmul(V a, V b) { return P##_mul_ps(a, b); }                                        \
    AI V vdiv(V a, V b) { return P##_div_ps(a, b); }                                        \
    AI V vsqrt(V a) { return P##_sqrt_ps(a); }                                              \
    AI V vneg(V a) { return P##_xor_ps(a, vset(-0.0f)); }                                   \
    AI V vabs(V a) { return P##_andnot_ps(vset(-0.0f), a); }                                \
    AI V vmax_raw(V a, V b) { return P##_max_ps(a, b); }                                    \
    AI V vmin_raw(V a, V b) { return P##_min_ps(a, b); }                                    \
    AI V vexp(V x) { return Sleef_exp##S(x); }                                              \
    AI V vlog(V x) { return Sleef_log##S(x); }                                              \
    AI V verf(V x) { return Sleef_erf##S(x); }                                              \
    AI V vlog1p(V x) { return Sleef_log1p##S(x); }                                          \
    AI V vexpm1(V x) { return Sleef_expm1##S(x); }                                          \
    AI V vpow(V a, V b) { return Sleef_pow##S(a, b); }

/* The reduction combine of kernels.h without NaN handling (NaN is tracked
 * apart): vmaxps/vminps equal `a > b ? a : b` / `a < b ? a : b` otherwise. */
AI __m256 h_comb(int cop, __m256 a, __m256 b)
{
    return cop == CTPU_K_RED_MAX ? _mm256_max_ps(a, b)
         : cop == CTPU_K_RED_MIN ? _mm256_min_ps(a, b)
         : cop == CTPU_K_RED_PROD ? _mm256_mul_ps(a, b) : _mm256_add_ps(a, b);
}
AI __m128 q_comb(int cop, __m128 a, __m128 b)
{
    return cop == CTPU_K_RED_MAX ? _mm_max_ps(a, b)
         : cop == CTPU_K_RED_MIN ? _mm_min_ps(a, b)
         : cop == CTPU_K_RED_PROD ? _mm_mul_ps(a, b) : _mm_add_ps(a, b);
}
/* The lane tree's last steps on 8 lanes: l[i] op= l[i+4], +2, +1. */
AI float tree8(int cop, __m256 b)
{
    __m128 c = q_comb(cop, _mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    c = q_comb(cop, c, _mm_movehl_ps(c, c));
    c = q_comb(cop, c, _mm_shuffle_ps(c, c, 1));
    return _mm_cvtss_f32(c);
}

#endif
