/* The AVX2 variant (8 lanes; AVX2+FMA+F16C CPUs): the primitive layer of
 * simd_x86.h, then the drivers stamped with it. Nothing here uses an FMA
 * intrinsic (the object is built with -mfma for the MXU family) and
 * -ffp-contract=off forbids contraction; transcendentals are SLEEF's non-FMA
 * AVX functions (Sleef_*f8_u10avx), which give the bits of the purec ones used
 * by the references (kernels.h; checked by tests/test_k_elementwise.c). */
#include "simd_x86.h"

#define CTPU_K_ISA avx2
typedef __m256 V;
typedef __m256i M;
#define W 8

CTPU_K_SIMD_COMMON(_mm256, f8_u10avx)
AI M tail_mask(int64_t r)
{
    int c = r < 0 ? 0 : r > W ? W : (int)r;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
/* vmaskmov never touches the masked-off lanes' memory. */
AI V ld_m(const float *p, M m) { return _mm256_maskload_ps(p, m); }
AI void st_m(float *p, M m, V v) { _mm256_maskstore_ps(p, m, v); }
AI M m_zero(void) { return _mm256_setzero_si256(); }
AI M m_or(M a, M b) { return _mm256_or_si256(a, b); }
AI bool m_any(M m) { return !_mm256_testz_si256(m, m); }

AI V vsel(M m, V a, V b) { return _mm256_blendv_ps(b, a, _mm256_castsi256_ps(m)); }
AI V vmaskz(M m, V a) { return _mm256_and_ps(_mm256_castsi256_ps(m), a); }
#define VCMP(a, b, pred) _mm256_castps_si256(_mm256_cmp_ps((a), (b), (pred)))

/* f32 -> bf16 (ctpu_f32_to_bf16), the result in the high half of each lane. */
AI M bf16_hi(V x)
{
    M u = _mm256_castps_si256(x);
    M isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                 _mm256_set1_epi32(0x7f800000));
    M lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    M r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u));
    M expzero = _mm256_cmpeq_epi32(_mm256_and_si256(r, _mm256_set1_epi32(0x7f800000)),
                                   _mm256_setzero_si256());
    r = _mm256_andnot_si256(_mm256_and_si256(expzero, _mm256_set1_epi32(0x7fff0000)), r);
    M q = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)),
                           _mm256_set1_epi32((int)0xffff0000u));
    return _mm256_blendv_epi8(r, q, isnan);
}
AI V vround_bf16(V x) { return _mm256_castsi256_ps(bf16_hi(x)); }
AI V ld_bf16(const uint16_t *p)
{
    M h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}
AI void st_bf16(uint16_t *p, V x)
{
    M r = _mm256_srli_epi32(bf16_hi(x), 16);   /* <= 0xffff: packus keeps it */
    _mm_storeu_si128((__m128i *)p,
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}
AI V ld_i32(const int32_t *p) { return _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)p)); }
/* cvttps2dq gives 0x80000000 for NaN and out of range: fix up +overflow and NaN. */
AI void st_i32(int32_t *p, V x)
{
    M r = _mm256_cvttps_epi32(x);
    r = _mm256_xor_si256(r, VCMP(x, vset(2147483648.0f), _CMP_GE_OQ));   /* -> 0x7fffffff */
    _mm256_storeu_si256((__m256i *)p, _mm256_andnot_si256(VCMP(x, x, _CMP_UNORD_Q), r));
}
AI __m256 vfold8(int cop, V v) { (void)cop; return v; }

/* In double per lane, then rounded once (the f32 results of _ref). */
#define CTPU_K_AVX2_DBL(name, fn)                                                            \
    AI V name(V x)                                                                           \
    {                                                                                        \
        __m128 lo = _mm256_cvtpd_ps(fn(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));         \
        __m128 hi = _mm256_cvtpd_ps(fn(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));       \
        return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);                     \
    }
CTPU_K_AVX2_DBL(vsin, Sleef_sind4_u10avx)
CTPU_K_AVX2_DBL(vcos, Sleef_cosd4_u10avx)

/* TANH's double steps (elementwise_ref.c ref_u_TANH) on 4 lanes: |tanh| */
AI __m256d tanh_abs_pd(__m256d x)
{
#define D(c) _mm256_set1_pd(c)
    __m256d y = _mm256_min_pd(_mm256_andnot_pd(D(-0.0), x), D(10.0));   /* y < 10 ? y : 10 */
    __m256d u = _mm256_add_pd(y, y);
    __m256d t = _mm256_add_pd(_mm256_mul_pd(u, D(CTPU_K_TANH_INV_LN2)), D(CTPU_K_TANH_SHIFT));
    __m256d kd = _mm256_sub_pd(t, D(CTPU_K_TANH_SHIFT));
    __m256d r = _mm256_sub_pd(_mm256_sub_pd(u, _mm256_mul_pd(kd, D(CTPU_K_TANH_LN2_HI))),
                              _mm256_mul_pd(kd, D(CTPU_K_TANH_LN2_LO)));
    __m256d p = D(1.0 / 362880);
    static const double c[8] = { 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 1.0 / 2, 1.0 };
    for (int i = 0; i < 8; i++) p = _mm256_add_pd(D(c[i]), _mm256_mul_pd(r, p));
    p = _mm256_mul_pd(r, p);
    /* 2^k: t's low bits hold k (t = 1.5 * 2^52 + k exactly) */
    __m256i kb = _mm256_sub_epi64(_mm256_castpd_si256(t), _mm256_castpd_si256(D(CTPU_K_TANH_SHIFT)));
    __m256d s = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(kb, _mm256_set1_epi64x(1023)), 52));
    __m256d sp = _mm256_mul_pd(s, p);
    return _mm256_div_pd(_mm256_add_pd(_mm256_sub_pd(s, D(1.0)), sp), _mm256_add_pd(_mm256_add_pd(s, D(1.0)), sp));
#undef D
}
AI V vtanh(V x)
{
    __m128 lo = _mm256_cvtpd_ps(tanh_abs_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));
    __m128 hi = _mm256_cvtpd_ps(tanh_abs_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
    V a = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
    a = _mm256_or_ps(a, _mm256_and_ps(x, vset(-0.0f)));   /* x's sign */
    return vsel(VCMP(x, x, _CMP_UNORD_Q), vadd(x, x), a);
}

/* GELU_ERF's double steps (elementwise_ref.c ref_u_GELU_ERF) on 4 lanes */
AI __m256d gelu_erf_pd(__m256d xd)
{
#define D(c) _mm256_set1_pd(c)
    static const double c[CTPU_K_GELU_NC] = { CTPU_K_GELU_ERFCX_COEFFS }, e[12] = { CTPU_K_GELU_EXP_COEFFS };
    __m256d u = _mm256_mul_pd(_mm256_andnot_pd(D(-0.0), xd), D(CTPU_K_GELU_INV_SQRT2));
    __m256d s = _mm256_mul_pd(_mm256_sub_pd(_mm256_div_pd(_mm256_sub_pd(u, D(3.0)), _mm256_add_pd(u, D(3.0))),
                                            D(CTPU_K_GELU_TC)), D(CTPU_K_GELU_INV_TH));
    __m256d p = D(c[CTPU_K_GELU_NC - 1]);
    for (int i = CTPU_K_GELU_NC - 2; i >= 0; i--) p = _mm256_add_pd(D(c[i]), _mm256_mul_pd(s, p));
    __m256d uc = _mm256_min_pd(u, D(CTPU_K_GELU_U_MAX));   /* u < 10.5 ? u : 10.5 (NaN: 10.5) */
    __m256d v = _mm256_mul_pd(uc, uc);
    __m256d t = _mm256_add_pd(_mm256_mul_pd(v, D(CTPU_K_TANH_INV_LN2)), D(CTPU_K_TANH_SHIFT));
    __m256d kd = _mm256_sub_pd(t, D(CTPU_K_TANH_SHIFT));
    __m256d w = _mm256_sub_pd(D(0.0), _mm256_sub_pd(_mm256_sub_pd(v, _mm256_mul_pd(kd, D(CTPU_K_TANH_LN2_HI))),
                                                  _mm256_mul_pd(kd, D(CTPU_K_TANH_LN2_LO))));
    __m256d q = D(e[11]);
    for (int i = 10; i >= 0; i--) q = _mm256_add_pd(D(e[i]), _mm256_mul_pd(w, q));
    __m256i kb = _mm256_sub_epi64(_mm256_castpd_si256(t), _mm256_castpd_si256(D(CTPU_K_TANH_SHIFT)));
    __m256d s2 = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_sub_epi64(_mm256_set1_epi64x(1023), kb), 52));
    __m256d er = _mm256_and_pd(_mm256_cmp_pd(u, D(CTPU_K_GELU_U_MAX), _CMP_LT_OQ),
                               _mm256_mul_pd(_mm256_mul_pd(p, q), s2));
    __m256d h = _mm256_mul_pd(D(0.5), er);
    __m256d phi = _mm256_blendv_pd(_mm256_sub_pd(D(1.0), h), h, _mm256_cmp_pd(xd, D(0.0), _CMP_LT_OQ));
    return _mm256_mul_pd(xd, phi);
#undef D
}
AI V vgelu_erf(V x)
{
    __m128 lo = _mm256_cvtpd_ps(gelu_erf_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));
    __m128 hi = _mm256_cvtpd_ps(gelu_erf_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}
/* Non-temporal store of one vector (p aligned to the vector); a tape strip is
 * TK vectors: 8 (64 floats). Each tape instruction costs a dispatch per strip
 * (its operand pointers, its opcode's jump), which at 4 vectors was most of a
 * fused chain's time here; 8 acc vectors leave half of the 16 ymm registers
 * for operands and constants (GCC spills a few acc around the switch, to L1).
 * Issue 18, AMD Zen 2, bench/fuse process-CPU ratios, medians of 3 A/B runs:
 * 4 -> 8 took chain16m vs memcpy 0.35 -> 0.59, vs hand-fused NT 0.57 -> 0.83
 * (2 threads 0.50 -> 0.79), the 1M chain vs hand-fused NT 0.51 -> 0.77; 16
 * was no better than 8 (more spills). */
AI void st_nt(float *p, V v) { _mm256_stream_ps(p, v); }
#define TK 8
#include "simd_elementwise.h"
#include "simd_reduce.h"
