/* Elementwise block-VM ops and conversions, AVX2 variant (8 lanes).
 *
 * Every function equals its _ref in elementwise_ref.c bit for bit (NaN as a
 * class): the same operations in the same order, each rounded to f32, no FMA
 * (the file is built with -mfma for the other families, but nothing here uses
 * an FMA intrinsic and -ffp-contract=off forbids contraction); transcendentals
 * from SLEEF's non-FMA AVX functions (Sleef_*f8_u10avx), which give the bits of
 * the purec ones used by _ref (checked by tests/test_k_elementwise.c).
 * Any n: 4-vector unrolled main loop, then one vector at a time, then a masked
 * tail (vmaskmov never touches the masked-off lanes' memory). */
#include <immintrin.h>
#include <sleef.h>
#include "internal.h"

typedef __m256 V;
typedef __m256i VI;
#define W 8

static inline V ld(const float *p) { return _mm256_loadu_ps(p); }
static inline void st(float *p, V v) { _mm256_storeu_ps(p, v); }
static inline VI tail_mask(int64_t r)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline V ld_m(const float *p, VI m) { return _mm256_maskload_ps(p, m); }
static inline void st_m(float *p, VI m, V v) { _mm256_maskstore_ps(p, m, v); }

static inline V vset(float f) { return _mm256_set1_ps(f); }
static inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
static inline V vsub(V a, V b) { return _mm256_sub_ps(a, b); }
static inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
static inline V vdiv(V a, V b) { return _mm256_div_ps(a, b); }
static inline V vneg(V a) { return _mm256_xor_ps(a, vset(-0.0f)); }
static inline V visnan(V a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
/* maxps(a,b) is exactly a > b ? a : b (b when either is NaN or both are zero);
 * a NaN a is then put back, so the result is NaN iff either input is. */
static inline V vmax(V a, V b) { return _mm256_blendv_ps(_mm256_max_ps(a, b), a, visnan(a)); }
static inline V vmin(V a, V b) { return _mm256_blendv_ps(_mm256_min_ps(a, b), a, visnan(a)); }
static inline V vsel01(V m) { return _mm256_and_ps(m, vset(1.0f)); }

/* f32 -> bf16 (ctpu_f32_to_bf16), result in the high half of each 32-bit lane. */
static inline VI bf16_hi(V x)
{
    VI u = _mm256_castps_si256(x);
    VI isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                  _mm256_set1_epi32(0x7f800000));
    VI lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    VI r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    r = _mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u));
    VI expzero = _mm256_cmpeq_epi32(_mm256_and_si256(r, _mm256_set1_epi32(0x7f800000)),
                                    _mm256_setzero_si256());
    r = _mm256_andnot_si256(_mm256_and_si256(expzero, _mm256_set1_epi32(0x7fff0000)), r);
    VI q = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)),
                            _mm256_set1_epi32((int)0xffff0000u));
    return _mm256_blendv_epi8(r, q, isnan);
}

/* ---- unary ------------------------------------------------------------------- */
static inline V u_neg(V x) { return vneg(x); }
static inline V u_abs(V x) { return _mm256_andnot_ps(vset(-0.0f), x); }
static inline V u_exp(V x) { return Sleef_expf8_u10avx(x); }
static inline V u_log(V x) { return Sleef_logf8_u10avx(x); }
static inline V u_sqrt(V x) { return _mm256_sqrt_ps(x); }
static inline V u_rsqrt(V x) { return vdiv(vset(1.0f), _mm256_sqrt_ps(x)); }
static inline V u_tanh(V x) { return Sleef_tanhf8_u10avx(x); }
static inline V u_sigmoid(V x) { return vdiv(vset(1.0f), vadd(vset(1.0f), Sleef_expf8_u10avx(vneg(x)))); }
static inline V u_relu(V x)
{
    V keep = _mm256_or_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ), visnan(x));
    return _mm256_and_ps(keep, x);
}
static inline V u_gelu_tanh(V x)
{
    V x3 = vmul(vmul(x, x), x);
    V inner = vmul(vset(0.7978845608f), vadd(x, vmul(vset(0.044715f), x3)));
    return vmul(vmul(vset(0.5f), x), vadd(vset(1.0f), Sleef_tanhf8_u10avx(inner)));
}
static inline V u_gelu_erf(V x)
{
    V e = Sleef_erff8_u10avx(vmul(x, vset(0.70710678f)));
    return vmul(vmul(vset(0.5f), x), vadd(vset(1.0f), e));
}
static inline V u_recip(V x) { return vdiv(vset(1.0f), x); }
static inline V u_square(V x) { return vmul(x, x); }
static inline V u_round_bf16(V x) { return _mm256_castsi256_ps(bf16_hi(x)); }

#define UNARY_LOOP(fn)                                                                       \
    static void loop_##fn(const float *x, float *y, int64_t n)                               \
    {                                                                                        \
        int64_t i = 0;                                                                       \
        for (; i + 4 * W <= n; i += 4 * W) {                                                 \
            V v0 = ld(x + i), v1 = ld(x + i + W), v2 = ld(x + i + 2 * W), v3 = ld(x + i + 3 * W); \
            v0 = fn(v0); v1 = fn(v1); v2 = fn(v2); v3 = fn(v3);                              \
            st(y + i, v0); st(y + i + W, v1); st(y + i + 2 * W, v2); st(y + i + 3 * W, v3);  \
        }                                                                                    \
        for (; i + W <= n; i += W) st(y + i, fn(ld(x + i)));                                 \
        if (i < n) {                                                                         \
            VI m = tail_mask(n - i);                                                         \
            st_m(y + i, m, fn(ld_m(x + i, m)));                                              \
        }                                                                                    \
    }
UNARY_LOOP(u_neg) UNARY_LOOP(u_abs) UNARY_LOOP(u_exp) UNARY_LOOP(u_log) UNARY_LOOP(u_sqrt)
UNARY_LOOP(u_rsqrt) UNARY_LOOP(u_tanh) UNARY_LOOP(u_sigmoid) UNARY_LOOP(u_relu)
UNARY_LOOP(u_gelu_tanh) UNARY_LOOP(u_gelu_erf) UNARY_LOOP(u_recip) UNARY_LOOP(u_square)
UNARY_LOOP(u_round_bf16)

void ctpu_k_unary_avx2(ctpu_k_unary_op op, const float *x, float *y, int64_t n)
{
    switch (op) {
    case CTPU_K_U_NEG: loop_u_neg(x, y, n); return;
    case CTPU_K_U_ABS: loop_u_abs(x, y, n); return;
    case CTPU_K_U_EXP: loop_u_exp(x, y, n); return;
    case CTPU_K_U_LOG: loop_u_log(x, y, n); return;
    case CTPU_K_U_SQRT: loop_u_sqrt(x, y, n); return;
    case CTPU_K_U_RSQRT: loop_u_rsqrt(x, y, n); return;
    case CTPU_K_U_TANH: loop_u_tanh(x, y, n); return;
    case CTPU_K_U_SIGMOID: loop_u_sigmoid(x, y, n); return;
    case CTPU_K_U_RELU: loop_u_relu(x, y, n); return;
    case CTPU_K_U_GELU_TANH: loop_u_gelu_tanh(x, y, n); return;
    case CTPU_K_U_GELU_ERF: loop_u_gelu_erf(x, y, n); return;
    case CTPU_K_U_RECIP: loop_u_recip(x, y, n); return;
    case CTPU_K_U_SQUARE: loop_u_square(x, y, n); return;
    case CTPU_K_U_ROUND_BF16: loop_u_round_bf16(x, y, n); return;
    case CTPU_K_U_COUNT: break;
    }
    ctpu_k_unary_ref(op, x, y, n);
}

/* ---- binary ------------------------------------------------------------------ */
static inline V b_add(V a, V b) { return vadd(a, b); }
static inline V b_sub(V a, V b) { return vsub(a, b); }
static inline V b_mul(V a, V b) { return vmul(a, b); }
static inline V b_div(V a, V b) { return vdiv(a, b); }
static inline V b_pow(V a, V b) { return Sleef_powf8_u10avx(a, b); }
static inline V b_max(V a, V b) { return vmax(a, b); }
static inline V b_min(V a, V b) { return vmin(a, b); }
static inline V b_eq(V a, V b) { return vsel01(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)); }
static inline V b_ne(V a, V b) { return vsel01(_mm256_cmp_ps(a, b, _CMP_NEQ_UQ)); }
static inline V b_lt(V a, V b) { return vsel01(_mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
static inline V b_le(V a, V b) { return vsel01(_mm256_cmp_ps(a, b, _CMP_LE_OQ)); }
static inline V b_gt(V a, V b) { return vsel01(_mm256_cmp_ps(a, b, _CMP_GT_OQ)); }
static inline V b_ge(V a, V b) { return vsel01(_mm256_cmp_ps(a, b, _CMP_GE_OQ)); }

/* LOADA/LOADB give operand vectors at offset i (a full vector or, with m, a tail). */
#define BINARY_LOOP_GEN(name, fn, LA, LB, LAM, LBM, PARAMS)                                  \
    static void name PARAMS                                                                  \
    {                                                                                        \
        int64_t i = 0;                                                                       \
        for (; i + 4 * W <= n; i += 4 * W) {                                                 \
            V r0 = fn(LA(i), LB(i)), r1 = fn(LA(i + W), LB(i + W));                          \
            V r2 = fn(LA(i + 2 * W), LB(i + 2 * W)), r3 = fn(LA(i + 3 * W), LB(i + 3 * W));  \
            st(y + i, r0); st(y + i + W, r1); st(y + i + 2 * W, r2); st(y + i + 3 * W, r3);  \
        }                                                                                    \
        for (; i + W <= n; i += W) st(y + i, fn(LA(i), LB(i)));                              \
        if (i < n) {                                                                         \
            VI m = tail_mask(n - i);                                                         \
            st_m(y + i, m, fn(LAM(i), LBM(i)));                                              \
        }                                                                                    \
    }
#define LA_(i) ld(a + (i))
#define LB_(i) ld(b + (i))
#define LAM_(i) ld_m(a + (i), m)
#define LBM_(i) ld_m(b + (i), m)
#define LS_(i) vs
#define BINARY_LOOPS(fn)                                                                     \
    BINARY_LOOP_GEN(loop_##fn, fn, LA_, LB_, LAM_, LBM_,                                     \
                    (const float *a, const float *b, float *y, int64_t n))                   \
    BINARY_LOOP_GEN(loop_as_##fn, fn, LA_, LS_, LAM_, LS_, (const float *a, V vs, float *y, int64_t n)) \
    BINARY_LOOP_GEN(loop_sa_##fn, fn, LS_, LA_, LS_, LAM_, (const float *a, V vs, float *y, int64_t n))
BINARY_LOOPS(b_add) BINARY_LOOPS(b_sub) BINARY_LOOPS(b_mul) BINARY_LOOPS(b_div)
BINARY_LOOPS(b_pow) BINARY_LOOPS(b_max) BINARY_LOOPS(b_min) BINARY_LOOPS(b_eq)
BINARY_LOOPS(b_ne) BINARY_LOOPS(b_lt) BINARY_LOOPS(b_le) BINARY_LOOPS(b_gt) BINARY_LOOPS(b_ge)

#define BINARY_SWITCH(PFX, ...)                                                              \
    switch (op) {                                                                            \
    case CTPU_K_B_ADD: PFX##b_add(__VA_ARGS__); return;                                      \
    case CTPU_K_B_SUB: PFX##b_sub(__VA_ARGS__); return;                                      \
    case CTPU_K_B_MUL: PFX##b_mul(__VA_ARGS__); return;                                      \
    case CTPU_K_B_DIV: PFX##b_div(__VA_ARGS__); return;                                      \
    case CTPU_K_B_POW: PFX##b_pow(__VA_ARGS__); return;                                      \
    case CTPU_K_B_MAX: PFX##b_max(__VA_ARGS__); return;                                      \
    case CTPU_K_B_MIN: PFX##b_min(__VA_ARGS__); return;                                      \
    case CTPU_K_B_EQ: PFX##b_eq(__VA_ARGS__); return;                                        \
    case CTPU_K_B_NE: PFX##b_ne(__VA_ARGS__); return;                                        \
    case CTPU_K_B_LT: PFX##b_lt(__VA_ARGS__); return;                                        \
    case CTPU_K_B_LE: PFX##b_le(__VA_ARGS__); return;                                        \
    case CTPU_K_B_GT: PFX##b_gt(__VA_ARGS__); return;                                        \
    case CTPU_K_B_GE: PFX##b_ge(__VA_ARGS__); return;                                        \
    case CTPU_K_B_COUNT: break;                                                              \
    }

void ctpu_k_binary_avx2(ctpu_k_binary_op op, const float *a, const float *b, float *y, int64_t n)
{
    BINARY_SWITCH(loop_, a, b, y, n)
    ctpu_k_binary_ref(op, a, b, y, n);
}

void ctpu_k_binary_scalar_avx2(ctpu_k_binary_op op, const float *a, float s, bool scalar_first,
                               float *y, int64_t n)
{
    V vs = vset(s);
    if (scalar_first) {
        BINARY_SWITCH(loop_sa_, a, vs, y, n)
    } else {
        BINARY_SWITCH(loop_as_, a, vs, y, n)
    }
    ctpu_k_binary_scalar_ref(op, a, s, scalar_first, y, n);
}

/* ---- where, clamp ---------------------------------------------------------------- */
static inline V where1(V c, V a, V b)
{
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(c, _mm256_setzero_ps(), _CMP_NEQ_UQ));
}

void ctpu_k_where_avx2(const float *c, const float *a, const float *b, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        V r0 = where1(ld(c + i), ld(a + i), ld(b + i));
        V r1 = where1(ld(c + i + W), ld(a + i + W), ld(b + i + W));
        st(y + i, r0); st(y + i + W, r1);
    }
    for (; i + W <= n; i += W) st(y + i, where1(ld(c + i), ld(a + i), ld(b + i)));
    if (i < n) {
        VI m = tail_mask(n - i);
        st_m(y + i, m, where1(ld_m(c + i, m), ld_m(a + i, m), ld_m(b + i, m)));
    }
}

void ctpu_k_clamp_avx2(const float *x, float lo, float hi, float *y, int64_t n)
{
    V vl = vset(lo), vh = vset(hi);
    int64_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        V r0 = vmin(vmax(ld(x + i), vl), vh), r1 = vmin(vmax(ld(x + i + W), vl), vh);
        V r2 = vmin(vmax(ld(x + i + 2 * W), vl), vh), r3 = vmin(vmax(ld(x + i + 3 * W), vl), vh);
        st(y + i, r0); st(y + i + W, r1); st(y + i + 2 * W, r2); st(y + i + 3 * W, r3);
    }
    for (; i + W <= n; i += W) st(y + i, vmin(vmax(ld(x + i), vl), vh));
    if (i < n) {
        VI m = tail_mask(n - i);
        st_m(y + i, m, vmin(vmax(ld_m(x + i, m), vl), vh));
    }
}

/* ---- conversions (scalar tails use the inline definitions in kernels.h) ------------- */
void ctpu_k_bf16_to_f32_avx2(const uint16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        VI h = _mm256_loadu_si256((const __m256i *)(x + i));
        VI lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16);
        VI hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16);
        st(y + i, _mm256_castsi256_ps(lo));
        st(y + i + W, _mm256_castsi256_ps(hi));
    }
    for (; i < n; i++) y[i] = ctpu_bf16_to_f32(x[i]);
}

void ctpu_k_f32_to_bf16_avx2(const float *x, uint16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        VI r0 = _mm256_srli_epi32(bf16_hi(ld(x + i)), 16);
        VI r1 = _mm256_srli_epi32(bf16_hi(ld(x + i + W)), 16);
        /* packus interleaves 128-bit halves: [r0 lo, r1 lo, r0 hi, r1 hi] -> reorder */
        VI p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r0, r1), 0xd8);
        _mm256_storeu_si256((__m256i *)(y + i), p);
    }
    for (; i < n; i++) y[i] = ctpu_f32_to_bf16(x[i]);
}

void ctpu_k_i32_to_f32_avx2(const int32_t *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        V r0 = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(x + i)));
        V r1 = _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(x + i + W)));
        st(y + i, r0); st(y + i + W, r1);
    }
    for (; i < n; i++) y[i] = (float)x[i];
}

/* cvttps2dq gives 0x80000000 for NaN and out of range: fix up +overflow and NaN. */
static inline VI f32_i32(V x)
{
    VI r = _mm256_cvttps_epi32(x);
    VI big = _mm256_castps_si256(_mm256_cmp_ps(x, vset(2147483648.0f), _CMP_GE_OQ));
    r = _mm256_xor_si256(r, big);                    /* 0x80000000 -> 0x7fffffff */
    return _mm256_andnot_si256(_mm256_castps_si256(visnan(x)), r);
}

void ctpu_k_f32_to_i32_avx2(const float *x, int32_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        VI r0 = f32_i32(ld(x + i)), r1 = f32_i32(ld(x + i + W));
        _mm256_storeu_si256((__m256i *)(y + i), r0);
        _mm256_storeu_si256((__m256i *)(y + i + W), r1);
    }
    for (; i < n; i++) y[i] = ctpu_f32_to_i32(x[i]);
}
