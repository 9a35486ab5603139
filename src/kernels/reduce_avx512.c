/* Reductions and softmax, AVX-512 (F/BW/DQ/VL). Bit-identical to reduce_ref.c.
 *
 * The 16 virtual lanes of kernels.h's order are the 16 lanes of one zmm:
 *  - col1 (one contiguous column, x[0..n)): element j of a chunk is lane
 *    j % 16 of the zmm loaded from x + 16*floor(j/16); one accumulator;
 *  - colv (16 columns x[j*inner + c]): the column index is the zmm lane and
 *    the virtual lane is the register: acc[j % 16] holds 16 columns' lane.
 * Lane tree and chunk tree as in reduce_ref.c (chunks combined by a
 * binary-counter stack, which builds the same nodes as the pairwise levels).
 * max/min use vmaxps/vminps, which equal `a > b ? a : b` / `a < b ? a : b`
 * for non-NaN inputs (including the +-0 choice); NaN is tracked in a mask and
 * forced at the end, since a NaN anywhere in a column makes it NaN.
 * No FMA: sub, mul, add are separate roundings, as in _ref.
 */
#include <immintrin.h>
#include <math.h>
#include <sleef.h>
#include "internal.h"

enum { RED_SQDEV = CTPU_K_RED_COUNT, RED_EXPSUM };
#define AI static inline __attribute__((always_inline))

void ctpu_k_red_rows1_avx512(int op, const float *x, const float *c, int64_t n, int64_t rows,
                             float *y);
float ctpu_k_red_col1_avx512(int op, const float *x, float c, int64_t n, int64_t k0, int64_t k1);
void ctpu_k_red_colv_avx512(int op, const float *x, const float *cv, int64_t n, int64_t inner,
                            int ncols, int64_t k0, int64_t k1, float *out);
void ctpu_k_softmax_row_avx512(const float *x, int64_t n, float *y, bool log);

AI int comb_op(int op) { return op >= RED_SQDEV ? CTPU_K_RED_SUM : op; }
AI bool is_minmax(int op) { return op == CTPU_K_RED_MAX || op == CTPU_K_RED_MIN; }

AI float s_ident(int cop)
{
    return cop == CTPU_K_RED_MAX ? -INFINITY : cop == CTPU_K_RED_MIN ? INFINITY : 0.0f;
}
/* NaN-blind combine (NaN is tracked separately). */
AI float s_comb(int cop, float a, float b)
{
    return cop == CTPU_K_RED_MAX ? (a > b ? a : b) : cop == CTPU_K_RED_MIN ? (a < b ? a : b) : a + b;
}
AI __m512 v_comb(int cop, __m512 a, __m512 b)
{
    return cop == CTPU_K_RED_MAX ? _mm512_max_ps(a, b)
         : cop == CTPU_K_RED_MIN ? _mm512_min_ps(a, b) : _mm512_add_ps(a, b);
}
AI __m512 v_mask_comb(int cop, __m512 a, __mmask16 k, __m512 b)
{
    return cop == CTPU_K_RED_MAX ? _mm512_mask_max_ps(a, k, a, b)
         : cop == CTPU_K_RED_MIN ? _mm512_mask_min_ps(a, k, a, b) : _mm512_mask_add_ps(a, k, a, b);
}
AI __m256 h_comb(int cop, __m256 a, __m256 b)
{
    return cop == CTPU_K_RED_MAX ? _mm256_max_ps(a, b)
         : cop == CTPU_K_RED_MIN ? _mm256_min_ps(a, b) : _mm256_add_ps(a, b);
}
AI __m128 q_comb(int cop, __m128 a, __m128 b)
{
    return cop == CTPU_K_RED_MAX ? _mm_max_ps(a, b)
         : cop == CTPU_K_RED_MIN ? _mm_min_ps(a, b) : _mm_add_ps(a, b);
}

/* The element transform of `op` (x -> (x-c)^2 for SQDEV). */
AI __m512 v_elem(int op, __m512 v, __m512 vc)
{
    if (op == RED_SQDEV) { v = _mm512_sub_ps(v, vc); v = _mm512_mul_ps(v, v); }
    return v;
}

/* Lane tree l[i] op= l[i+8], +4, +2, +1 on a zmm of 16 lanes. */
AI float lane_tree(int cop, __m512 a)
{
    __m256 b = h_comb(cop, _mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    __m128 c = q_comb(cop, _mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    c = q_comb(cop, c, _mm_movehl_ps(c, c));
    c = q_comb(cop, c, _mm_shuffle_ps(c, c, 1));
    return _mm_cvtss_f32(c);
}

/* One chunk of a contiguous column. */
AI __m512 chunk1(int op, const float *x, int64_t len, __m512 vc, __mmask16 *nan)
{
    const int cop = comb_op(op);
    __m512 acc = _mm512_set1_ps(s_ident(cop));
    int64_t j = 0;
    for (; j + 16 <= len; j += 16) {
        __m512 v = v_elem(op, _mm512_loadu_ps(x + j), vc);
        if (is_minmax(op)) *nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        acc = v_comb(cop, acc, v);
    }
    if (j < len) {
        __mmask16 k = (__mmask16)((1u << (len - j)) - 1u);
        __m512 v = v_elem(op, _mm512_maskz_loadu_ps(k, x + j), vc);
        if (is_minmax(op)) *nan |= _mm512_mask_cmp_ps_mask(k, v, v, _CMP_UNORD_Q);
        acc = v_mask_comb(cop, acc, k, v);
    }
    return acc;
}

/* Four consecutive full chunks at once (independent chains, for ILP). */
AI void chunk4(int op, const float *x, __m512 vc, __mmask16 *nan, __m512 acc[4])
{
    const int cop = comb_op(op);
    for (int i = 0; i < 4; i++) acc[i] = _mm512_set1_ps(s_ident(cop));
    for (int64_t j = 0; j < CTPU_K_RED_CHUNK; j += 16) {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m512 v = v_elem(op, _mm512_loadu_ps(x + i * CTPU_K_RED_CHUNK + j), vc);
            if (is_minmax(op)) *nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            acc[i] = v_comb(cop, acc[i], v);
        }
    }
}

AI int64_t chunk_len(int64_t n, int64_t k)
{
    int64_t j0 = k * CTPU_K_RED_CHUNK;
    return n - j0 < CTPU_K_RED_CHUNK ? n - j0 : CTPU_K_RED_CHUNK;
}

/* Push chunk value number t (0-based in the range) and merge full pairs. */
#define TREE_PUSH(stk, sp, t, val, comb)                                   \
    do {                                                                   \
        (stk)[(sp)++] = (val);                                             \
        for (int64_t t_ = (t) + 1; (t_ & 1) == 0; t_ >>= 1, (sp)--)        \
            (stk)[(sp) - 2] = comb((stk)[(sp) - 2], (stk)[(sp) - 1]);      \
    } while (0)
#define TREE_FINISH(stk, sp, comb)                                         \
    for (; (sp) > 1; (sp)--) (stk)[(sp) - 2] = comb((stk)[(sp) - 2], (stk)[(sp) - 1])

AI float col1_impl(int op, const float *x, float c, int64_t n, int64_t k0, int64_t k1)
{
    const int cop = comb_op(op);
    if (k1 <= k0) return s_ident(cop);
    float stk[64];
    int sp = 0;
    __mmask16 nan = 0;
    __m512 vc = _mm512_set1_ps(c);
#define COMB(a, b) s_comb(cop, a, b)
    int64_t k = k0;
    for (; k + 4 <= k1 && (k + 4) * CTPU_K_RED_CHUNK <= n; k += 4) {
        __m512 acc[4];
        chunk4(op, x + k * CTPU_K_RED_CHUNK, vc, &nan, acc);
        for (int i = 0; i < 4; i++) TREE_PUSH(stk, sp, k + i - k0, lane_tree(cop, acc[i]), COMB);
    }
    for (; k < k1; k++) {
        float v = lane_tree(cop, chunk1(op, x + k * CTPU_K_RED_CHUNK, chunk_len(n, k), vc, &nan));
        TREE_PUSH(stk, sp, k - k0, v, COMB);
    }
    TREE_FINISH(stk, sp, COMB);
#undef COMB
    return nan ? NAN : stk[0];
}

float ctpu_k_red_col1_avx512(int op, const float *x, float c, int64_t n, int64_t k0, int64_t k1)
{
    switch (op) {
    case CTPU_K_RED_SUM: return col1_impl(CTPU_K_RED_SUM, x, c, n, k0, k1);
    case CTPU_K_RED_MAX: return col1_impl(CTPU_K_RED_MAX, x, c, n, k0, k1);
    case CTPU_K_RED_MIN: return col1_impl(CTPU_K_RED_MIN, x, c, n, k0, k1);
    default: return col1_impl(RED_SQDEV, x, c, n, k0, k1);
    }
}

/* Whole contiguous columns; a column of one chunk skips the chunk tree. */
AI void rows1_impl(int op, const float *x, const float *c, int64_t n, int64_t rows, float *y)
{
    const int cop = comb_op(op);
    int64_t m = (n + CTPU_K_RED_CHUNK - 1) / CTPU_K_RED_CHUNK;
    for (int64_t r = 0; r < rows; r++) {
        float cr = c ? c[r] : 0.0f;
        if (m == 1) {
            __mmask16 nan = 0;
            float v = lane_tree(cop, chunk1(op, x + r * n, n, _mm512_set1_ps(cr), &nan));
            y[r] = nan ? NAN : v;
        } else {
            y[r] = col1_impl(op, x + r * n, cr, n, 0, m);
        }
    }
}

void ctpu_k_red_rows1_avx512(int op, const float *x, const float *c, int64_t n, int64_t rows,
                             float *y)
{
    switch (op) {
    case CTPU_K_RED_SUM: rows1_impl(CTPU_K_RED_SUM, x, c, n, rows, y); break;
    case CTPU_K_RED_MAX: rows1_impl(CTPU_K_RED_MAX, x, c, n, rows, y); break;
    case CTPU_K_RED_MIN: rows1_impl(CTPU_K_RED_MIN, x, c, n, rows, y); break;
    default: rows1_impl(RED_SQDEV, x, c, n, rows, y); break;
    }
}

/* Up to 16 columns at stride `inner`: acc[l] is virtual lane l of 16 columns. */
AI void colv_impl(int op, const float *x, const float *cv, int64_t n, int64_t inner, int ncols,
                  int64_t k0, int64_t k1, float *out)
{
    const int cop = comb_op(op);
    __mmask16 km = ncols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << ncols) - 1u);
    __m512 vc = cv ? _mm512_maskz_loadu_ps(km, cv) : _mm512_setzero_ps();
    __m512 stk[64];
    int sp = 0;
    __mmask16 nan = 0;
    __m512 r = _mm512_set1_ps(s_ident(cop));
#define COMB(a, b) v_comb(cop, a, b)
    for (int64_t k = k0; k < k1; k++) {
        const float *xc = x + k * CTPU_K_RED_CHUNK * inner;
        int64_t len = chunk_len(n, k);
        __m512 acc[16];
#pragma GCC unroll 16
        for (int l = 0; l < 16; l++) acc[l] = _mm512_set1_ps(s_ident(cop));
        int64_t j = 0;
        for (; j + 16 <= len; j += 16) {
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++) {
                __m512 v = v_elem(op, _mm512_maskz_loadu_ps(km, xc + (j + l) * inner), vc);
                if (is_minmax(op)) nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
                acc[l] = v_comb(cop, acc[l], v);
            }
        }
        int rem = (int)(len - j);
#pragma GCC unroll 16
        for (int l = 0; l < 16; l++) {
            if (l < rem) {
                __m512 v = v_elem(op, _mm512_maskz_loadu_ps(km, xc + (j + l) * inner), vc);
                if (is_minmax(op)) nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
                acc[l] = v_comb(cop, acc[l], v);
            }
        }
#pragma GCC unroll 8
        for (int s = 8; s > 0; s /= 2)
#pragma GCC unroll 8
            for (int i = 0; i < s; i++) acc[i] = v_comb(cop, acc[i], acc[i + s]);
        TREE_PUSH(stk, sp, k - k0, acc[0], COMB);
    }
    if (sp) {
        TREE_FINISH(stk, sp, COMB);
        r = stk[0];
    }
#undef COMB
    r = _mm512_mask_mov_ps(r, nan, _mm512_set1_ps(NAN));
    _mm512_mask_storeu_ps(out, km, r);
}

void ctpu_k_red_colv_avx512(int op, const float *x, const float *cv, int64_t n, int64_t inner,
                            int ncols, int64_t k0, int64_t k1, float *out)
{
    switch (op) {
    case CTPU_K_RED_SUM: colv_impl(CTPU_K_RED_SUM, x, cv, n, inner, ncols, k0, k1, out); break;
    case CTPU_K_RED_MAX: colv_impl(CTPU_K_RED_MAX, x, cv, n, inner, ncols, k0, k1, out); break;
    case CTPU_K_RED_MIN: colv_impl(CTPU_K_RED_MIN, x, cv, n, inner, ncols, k0, k1, out); break;
    default: colv_impl(RED_SQDEV, x, cv, n, inner, ncols, k0, k1, out); break;
    }
}

/* softmax / log_softmax of one row (n > 0): m = max, e = exp(x - m) summed
 * in the order (stored to y for softmax), then y = e / s or (x - m) - log s.
 * exp and log: SLEEF's non-FMA AVX-512 variants (same bits as purec). */
void ctpu_k_softmax_row_avx512(const float *x, int64_t n, float *y, bool log)
{
    int64_t m = (n + CTPU_K_RED_CHUNK - 1) / CTPU_K_RED_CHUNK;
    float mx;
    if (m == 1) {
        __mmask16 nan = 0;
        mx = lane_tree(CTPU_K_RED_MAX, chunk1(CTPU_K_RED_MAX, x, n, _mm512_setzero_ps(), &nan));
        if (nan) mx = NAN;
    } else {
        mx = col1_impl(CTPU_K_RED_MAX, x, 0.0f, n, 0, m);
    }
    __m512 vm = _mm512_set1_ps(mx);
    float stk[64] = { 0.0f };
    int sp = 0;
#define COMB(a, b) ((a) + (b))
    for (int64_t k = 0; k < m; k++) {
        const float *xc = x + k * CTPU_K_RED_CHUNK;
        float *yc = y + k * CTPU_K_RED_CHUNK;
        int64_t len = chunk_len(n, k), j = 0;
        __m512 acc = _mm512_setzero_ps();
        for (; j + 16 <= len; j += 16) {
            __m512 e = Sleef_expf16_u10avx512fnofma(_mm512_sub_ps(_mm512_loadu_ps(xc + j), vm));
            if (!log) _mm512_storeu_ps(yc + j, e);
            acc = _mm512_add_ps(acc, e);
        }
        if (j < len) {
            __mmask16 km = (__mmask16)((1u << (len - j)) - 1u);
            __m512 e = Sleef_expf16_u10avx512fnofma(
                _mm512_sub_ps(_mm512_maskz_loadu_ps(km, xc + j), vm));
            if (!log) _mm512_mask_storeu_ps(yc + j, km, e);
            acc = _mm512_mask_add_ps(acc, km, acc, e);
        }
        TREE_PUSH(stk, sp, k, lane_tree(CTPU_K_RED_SUM, acc), COMB);
    }
    TREE_FINISH(stk, sp, COMB);
#undef COMB
    float s = stk[0];
    int64_t j = 0;
    if (!log) {
        __m512 vs = _mm512_set1_ps(s);
        for (; j + 16 <= n; j += 16) _mm512_storeu_ps(y + j, _mm512_div_ps(_mm512_loadu_ps(y + j), vs));
        if (j < n) {
            __mmask16 km = (__mmask16)((1u << (n - j)) - 1u);
            _mm512_mask_storeu_ps(y + j, km, _mm512_div_ps(_mm512_maskz_loadu_ps(km, y + j), vs));
        }
    } else {
        __m512 vl = Sleef_logf16_u10avx512fnofma(_mm512_set1_ps(s));
        for (; j + 16 <= n; j += 16)
            _mm512_storeu_ps(y + j, _mm512_sub_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm), vl));
        if (j < n) {
            __mmask16 km = (__mmask16)((1u << (n - j)) - 1u);
            _mm512_mask_storeu_ps(
                y + j, km, _mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(km, x + j), vm), vl));
        }
    }
}
