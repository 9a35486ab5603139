/* The AVX-512 variant (16 lanes; F+BW+DQ+VL+BF16 CPUs): the primitive layer
 * of simd_x86.h, then the drivers stamped with it. No FMA (-ffp-contract=off);
 * transcendentals are SLEEF's non-FMA AVX-512 functions
 * (Sleef_*f16_u10avx512fnofma), which give the bits of the purec ones used by
 * the references (kernels.h; checked by tests/test_k_elementwise.c). */
#include "simd_x86.h"

#define CTPU_K_ISA avx512
typedef __m512 V;
typedef __mmask16 M;
#define W 16

CTPU_K_SIMD_COMMON(_mm512, f16_u10avx512fnofma)
AI M tail_mask(int64_t r) { return r <= 0 ? (M)0 : r >= W ? (M)0xffff : (M)((1u << r) - 1u); }
/* Masked-off lanes are never read or written. */
AI V ld_m(const float *p, M m) { return _mm512_maskz_loadu_ps(m, p); }
AI void st_m(float *p, M m, V v) { _mm512_mask_storeu_ps(p, m, v); }
AI M m_zero(void) { return 0; }
AI M m_or(M a, M b) { return (M)(a | b); }
AI bool m_any(M m) { return m != 0; }

AI V vsel(M m, V a, V b) { return _mm512_mask_mov_ps(b, m, a); }
AI V vmaskz(M m, V a) { return _mm512_maskz_mov_ps(m, a); }
#define VCMP(a, b, pred) _mm512_cmp_ps_mask((a), (b), (pred))

AI __m512i iset(uint32_t u) { return _mm512_set1_epi32((int)u); }
/* f32 -> bf16 (ctpu_f32_to_bf16), the result in the high half of each lane. */
AI __m512i bf16_hi(V x)
{
    __m512i u = _mm512_castps_si512(x);
    M isnan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, iset(0x7fffffffu)), iset(0x7f800000u));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), iset(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, iset(0x7fffu)), lsb);
    r = _mm512_and_si512(r, iset(0xffff0000u));
    M expzero = _mm512_testn_epi32_mask(r, iset(0x7f800000u));
    r = _mm512_mask_and_epi32(r, expzero, r, iset(0x80000000u));
    __m512i q = _mm512_and_si512(_mm512_or_si512(u, iset(0x00400000u)), iset(0xffff0000u));
    return _mm512_mask_mov_epi32(r, isnan, q);
}
AI V vround_bf16(V x) { return _mm512_castsi512_ps(bf16_hi(x)); }
AI V ld_bf16(const uint16_t *p)
{
    __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
}
AI void st_bf16(uint16_t *p, V x)
{
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_hi(x), 16)));
}
AI V ld_i32(const int32_t *p) { return _mm512_cvtepi32_ps(_mm512_loadu_si512(p)); }
/* cvttps2dq gives 0x80000000 for NaN and out of range: fix up +overflow and NaN. */
AI void st_i32(int32_t *p, V x)
{
    __m512i r = _mm512_cvttps_epi32(x);
    r = _mm512_mask_mov_epi32(r, VCMP(x, vset(2147483648.0f), _CMP_GE_OQ), iset(0x7fffffffu));
    _mm512_storeu_si512(p, _mm512_maskz_mov_epi32((M)~VCMP(x, x, _CMP_UNORD_Q), r));
}
/* The lane tree's first step on 16 lanes: l[i] op= l[i+8]. */
AI __m256 vfold8(int cop, V v)
{
    return h_comb(cop, _mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
}

/* In double per lane, then rounded once (the f32 results of _ref). */
#define CTPU_K_AVX512_DBL(name, fn)                                                          \
    AI V name(V x)                                                                           \
    {                                                                                        \
        __m256 lo = _mm512_cvtpd_ps(fn(_mm512_cvtps_pd(_mm512_castps512_ps256(x))));         \
        __m256 hi = _mm512_cvtpd_ps(fn(_mm512_cvtps_pd(                                      \
            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)))));             \
        return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);                       \
    }
CTPU_K_AVX512_DBL(vsin, Sleef_sind8_u10avx512fnofma)
CTPU_K_AVX512_DBL(vcos, Sleef_cosd8_u10avx512fnofma)

/* TANH's double steps (elementwise_ref.c ref_u_TANH) on 8 lanes: |tanh| */
AI __m512d tanh_abs_pd(__m512d x)
{
#define D(c) _mm512_set1_pd(c)
    __m512d y = _mm512_min_pd(_mm512_andnot_pd(D(-0.0), x), D(10.0));   /* y < 10 ? y : 10 */
    __m512d u = _mm512_add_pd(y, y);
    __m512d t = _mm512_add_pd(_mm512_mul_pd(u, D(CTPU_K_TANH_INV_LN2)), D(CTPU_K_TANH_SHIFT));
    __m512d kd = _mm512_sub_pd(t, D(CTPU_K_TANH_SHIFT));
    __m512d r = _mm512_sub_pd(_mm512_sub_pd(u, _mm512_mul_pd(kd, D(CTPU_K_TANH_LN2_HI))),
                              _mm512_mul_pd(kd, D(CTPU_K_TANH_LN2_LO)));
    __m512d p = D(1.0 / 362880);
    static const double c[8] = { 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 1.0 / 2, 1.0 };
    for (int i = 0; i < 8; i++) p = _mm512_add_pd(D(c[i]), _mm512_mul_pd(r, p));
    p = _mm512_mul_pd(r, p);
    /* 2^k: t's low bits hold k (t = 1.5 * 2^52 + k exactly) */
    __m512i kb = _mm512_sub_epi64(_mm512_castpd_si512(t), _mm512_castpd_si512(D(CTPU_K_TANH_SHIFT)));
    __m512d s = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(kb, _mm512_set1_epi64(1023)), 52));
    __m512d sp = _mm512_mul_pd(s, p);
    return _mm512_div_pd(_mm512_add_pd(_mm512_sub_pd(s, D(1.0)), sp), _mm512_add_pd(_mm512_add_pd(s, D(1.0)), sp));
#undef D
}
AI V vtanh(V x)
{
    __m256 lo = _mm512_cvtpd_ps(tanh_abs_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x))));
    __m256 hi = _mm512_cvtpd_ps(tanh_abs_pd(_mm512_cvtps_pd(
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)))));
    V a = _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
    a = _mm512_or_ps(a, _mm512_and_ps(x, vset(-0.0f)));   /* x's sign */
    return vsel(VCMP(x, x, _CMP_UNORD_Q), vadd(x, x), a);
}

/* GELU_ERF's double steps (elementwise_ref.c ref_u_GELU_ERF) on N vectors
 * of 8 lanes at once (N a constant after inlining: 1, or 4), step by step:
 * each lane's operations and their order are the reference's, so the same
 * bits for any N. One vector's steps are a chain of ~30 dependent
 * operations; with four chains one after another in program order the
 * out-of-order window held about two (issue 18: gelu was 2.6-3.6 ns an
 * element, 9% of char_gpt's step; interleaved 1.8). */
AI void gelu_erf_pdn(__m512d *xd, const int N)
{
#define D(c) _mm512_set1_pd(c)
#define JN(stmt) _Pragma("GCC unroll 4") for (int j = 0; j < N; j++) { stmt; }
    static const double c[CTPU_K_GELU_NC] = { CTPU_K_GELU_ERFCX_COEFFS }, e[12] = { CTPU_K_GELU_EXP_COEFFS };
    __m512d u[4], s[4], p[4], t[4], kd[4], w[4], q[4], s2[4];
    JN(u[j] = _mm512_mul_pd(_mm512_andnot_pd(D(-0.0), xd[j]), D(CTPU_K_GELU_INV_SQRT2)))
    JN(s[j] = _mm512_mul_pd(_mm512_sub_pd(_mm512_div_pd(_mm512_sub_pd(u[j], D(3.0)), _mm512_add_pd(u[j], D(3.0))),
                                          D(CTPU_K_GELU_TC)), D(CTPU_K_GELU_INV_TH)))
    JN(p[j] = D(c[CTPU_K_GELU_NC - 1]))
    for (int i = CTPU_K_GELU_NC - 2; i >= 0; i--) { JN(p[j] = _mm512_add_pd(D(c[i]), _mm512_mul_pd(s[j], p[j]))) }
    /* uc = u < 10.5 ? u : 10.5 (NaN: 10.5) */
    JN(__m512d uc = _mm512_min_pd(u[j], D(CTPU_K_GELU_U_MAX)); __m512d v = _mm512_mul_pd(uc, uc);
       t[j] = _mm512_add_pd(_mm512_mul_pd(v, D(CTPU_K_TANH_INV_LN2)), D(CTPU_K_TANH_SHIFT));
       kd[j] = _mm512_sub_pd(t[j], D(CTPU_K_TANH_SHIFT));
       w[j] = _mm512_sub_pd(D(0.0), _mm512_sub_pd(_mm512_sub_pd(v, _mm512_mul_pd(kd[j], D(CTPU_K_TANH_LN2_HI))),
                                                 _mm512_mul_pd(kd[j], D(CTPU_K_TANH_LN2_LO)))))
    JN(q[j] = D(e[11]))
    for (int i = 10; i >= 0; i--) { JN(q[j] = _mm512_add_pd(D(e[i]), _mm512_mul_pd(w[j], q[j]))) }
    JN(__m512i kb = _mm512_sub_epi64(_mm512_castpd_si512(t[j]), _mm512_castpd_si512(D(CTPU_K_TANH_SHIFT)));
       s2[j] = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_sub_epi64(_mm512_set1_epi64(1023), kb), 52)))
    JN(__m512d er = _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(u[j], D(CTPU_K_GELU_U_MAX), _CMP_LT_OQ),
                                        _mm512_mul_pd(_mm512_mul_pd(p[j], q[j]), s2[j]));
       __m512d h = _mm512_mul_pd(D(0.5), er);
       __m512d phi = _mm512_mask_mov_pd(_mm512_sub_pd(D(1.0), h), _mm512_cmp_pd_mask(xd[j], D(0.0), _CMP_LT_OQ), h);
       xd[j] = _mm512_mul_pd(xd[j], phi))
#undef JN
#undef D
}
/* vgelu_erf of two vectors (a, b in place), interleaved (gelu_erf_pdn) */
#define VGELU_ERF_X2 1
AI void vgelu_erf_x2(V *a, V *b)
{
    __m512d d[4] = { _mm512_cvtps_pd(_mm512_castps512_ps256(*a)),
                     _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(*a), 1))),
                     _mm512_cvtps_pd(_mm512_castps512_ps256(*b)),
                     _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(*b), 1))) };
    gelu_erf_pdn(d, 4);
    *a = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(d[0])), _mm512_cvtpd_ps(d[1]), 1);
    *b = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(d[2])), _mm512_cvtpd_ps(d[3]), 1);
}
AI V vgelu_erf(V x)
{
    __m512d d[2] = { _mm512_cvtps_pd(_mm512_castps512_ps256(x)),
                     _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))) };
    gelu_erf_pdn(d, 2);
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(d[0])), _mm512_cvtpd_ps(d[1]), 1);
}
/* Non-temporal store of one vector (p aligned to the vector); a tape strip is
 * TK vectors: 16 (256 floats). Only the strip's results stay in registers
 * from one instruction to the next (simd_elementwise.h tape_strip), so 16
 * fit the 32 zmm registers with the operands and constants; with operand
 * arrays live across the strip 8 was the most before spilling (issue 18,
 * the Intel machine: 4 -> 8 took the 1M chain from 0.77-0.85 to 0.48-0.53 ms
 * of process CPU time; 8 -> 16 with the scoped operands: the 16M chain
 * 13.2 -> 12.1 ms, the 1M chain 0.62 -> 0.52 ms, medians of A/B runs). */
AI void st_nt(float *p, V v) { _mm512_stream_ps(p, v); }
#define TK 16
#include "simd_elementwise.h"
#include "simd_reduce.h"
