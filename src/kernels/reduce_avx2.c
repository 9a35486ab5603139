/* Reductions and softmax, AVX2. Bit-identical to reduce_ref.c.
 *
 * The 16 virtual lanes of kernels.h's order are held in two ymm registers:
 *  - col1 (one contiguous column): lo = lanes 0..7, hi = lanes 8..15 of each
 *    16-element group; the lane tree's first level (l[i] op l[i+8]) is lo op hi;
 *  - colv (columns x[j*inner + c]): 8 columns per ymm, acc[j % 16] is
 *    virtual lane j % 16; up to 16 columns are done as two groups of 8.
 * Lane tree and chunk tree as in reduce_ref.c (binary-counter stack for the
 * chunk tree). max/min: vmaxps/vminps equal `a > b ? a : b` / `a < b ? a : b`
 * for non-NaN inputs; NaN is tracked in a mask and forced at the end.
 * Tail elements are padded with the identity, which leaves every lane
 * unchanged (a sum lane is never -0, since it starts at +0).
 * No FMA: sub, mul, add are separate roundings, as in _ref.
 */
#include <immintrin.h>
#include <math.h>
#include <sleef.h>
#include "internal.h"

enum { RED_SQDEV = CTPU_K_RED_COUNT, RED_EXPSUM };
#define AI static inline __attribute__((always_inline))

void ctpu_k_red_rows1_avx2(int op, const float *x, const float *c, int64_t n, int64_t rows,
                           float *y);
float ctpu_k_red_col1_avx2(int op, const float *x, float c, int64_t n, int64_t k0, int64_t k1);
void ctpu_k_red_colv_avx2(int op, const float *x, const float *cv, int64_t n, int64_t inner,
                          int ncols, int64_t k0, int64_t k1, float *out);
void ctpu_k_softmax_row_avx2(const float *x, int64_t n, float *y, bool log);

AI int comb_op(int op) { return op >= RED_SQDEV ? CTPU_K_RED_SUM : op; }
AI bool is_minmax(int op) { return op == CTPU_K_RED_MAX || op == CTPU_K_RED_MIN; }

AI float s_ident(int cop)
{
    return cop == CTPU_K_RED_MAX ? -INFINITY : cop == CTPU_K_RED_MIN ? INFINITY : 0.0f;
}
AI float s_comb(int cop, float a, float b)
{
    return cop == CTPU_K_RED_MAX ? (a > b ? a : b) : cop == CTPU_K_RED_MIN ? (a < b ? a : b) : a + b;
}
AI __m256 v_comb(int cop, __m256 a, __m256 b)
{
    return cop == CTPU_K_RED_MAX ? _mm256_max_ps(a, b)
         : cop == CTPU_K_RED_MIN ? _mm256_min_ps(a, b) : _mm256_add_ps(a, b);
}
AI __m128 q_comb(int cop, __m128 a, __m128 b)
{
    return cop == CTPU_K_RED_MAX ? _mm_max_ps(a, b)
         : cop == CTPU_K_RED_MIN ? _mm_min_ps(a, b) : _mm_add_ps(a, b);
}
AI __m256 v_elem(int op, __m256 v, __m256 vc)
{
    if (op == RED_SQDEV) { v = _mm256_sub_ps(v, vc); v = _mm256_mul_ps(v, v); }
    return v;
}
AI __m256 zero8(void) { return _mm256_setzero_ps(); }
AI __m256 v_unord(__m256 v) { return _mm256_cmp_ps(v, v, _CMP_UNORD_Q); }

/* Lanes (lo = 0..7, hi = 8..15): l[i] op= l[i+8], +4, +2, +1. */
AI float lane_tree(int cop, __m256 lo, __m256 hi)
{
    __m256 b = v_comb(cop, lo, hi);
    __m128 c = q_comb(cop, _mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    c = q_comb(cop, c, _mm_movehl_ps(c, c));
    c = q_comb(cop, c, _mm_shuffle_ps(c, c, 1));
    return _mm_cvtss_f32(c);
}

/* Lane mask: lanes i < cnt (cnt may be <= 0 or >= 8). */
AI __m256i lane_mask(int64_t cnt)
{
    int c = cnt < 0 ? 0 : cnt > 8 ? 8 : (int)cnt;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

AI int64_t chunk_len(int64_t n, int64_t k)
{
    int64_t j0 = k * CTPU_K_RED_CHUNK;
    return n - j0 < CTPU_K_RED_CHUNK ? n - j0 : CTPU_K_RED_CHUNK;
}

#define TREE_PUSH(stk, sp, t, val, comb)                                   \
    do {                                                                   \
        (stk)[(sp)++] = (val);                                             \
        for (int64_t t_ = (t) + 1; (t_ & 1) == 0; t_ >>= 1, (sp)--)        \
            (stk)[(sp) - 2] = comb((stk)[(sp) - 2], (stk)[(sp) - 1]);      \
    } while (0)
#define TREE_FINISH(stk, sp, comb)                                         \
    for (; (sp) > 1; (sp)--) (stk)[(sp) - 2] = comb((stk)[(sp) - 2], (stk)[(sp) - 1])

/* One chunk of a contiguous column; returns the lane-tree value. */
AI float chunk1(int op, const float *x, int64_t len, __m256 vc, __m256 *nan)
{
    const int cop = comb_op(op);
    __m256 id = _mm256_set1_ps(s_ident(cop));
    __m256 lo = id, hi = id;
    int64_t j = 0;
    for (; j + 16 <= len; j += 16) {
        __m256 a = v_elem(op, _mm256_loadu_ps(x + j), vc);
        __m256 b = v_elem(op, _mm256_loadu_ps(x + j + 8), vc);
        if (is_minmax(op)) *nan = _mm256_or_ps(*nan, _mm256_or_ps(v_unord(a), v_unord(b)));
        lo = v_comb(cop, lo, a);
        hi = v_comb(cop, hi, b);
    }
    if (j < len) {
        __m256i ma = lane_mask(len - j), mb = lane_mask(len - j - 8);
        __m256 a = v_elem(op, _mm256_maskload_ps(x + j, ma), vc);
        __m256 b = v_elem(op, _mm256_maskload_ps(x + j + 8, mb), vc);
        a = _mm256_blendv_ps(id, a, _mm256_castsi256_ps(ma));
        b = _mm256_blendv_ps(id, b, _mm256_castsi256_ps(mb));
        if (is_minmax(op)) *nan = _mm256_or_ps(*nan, _mm256_or_ps(v_unord(a), v_unord(b)));
        lo = v_comb(cop, lo, a);
        hi = v_comb(cop, hi, b);
    }
    return lane_tree(cop, lo, hi);
}

/* Four consecutive full chunks at once (independent chains, for ILP). */
AI void chunk4(int op, const float *x, __m256 vc, __m256 *nan, float out[4])
{
    const int cop = comb_op(op);
    __m256 lo[4], hi[4];
    for (int i = 0; i < 4; i++) lo[i] = hi[i] = _mm256_set1_ps(s_ident(cop));
    for (int64_t j = 0; j < CTPU_K_RED_CHUNK; j += 16) {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            __m256 a = v_elem(op, _mm256_loadu_ps(x + i * CTPU_K_RED_CHUNK + j), vc);
            __m256 b = v_elem(op, _mm256_loadu_ps(x + i * CTPU_K_RED_CHUNK + j + 8), vc);
            if (is_minmax(op)) *nan = _mm256_or_ps(*nan, _mm256_or_ps(v_unord(a), v_unord(b)));
            lo[i] = v_comb(cop, lo[i], a);
            hi[i] = v_comb(cop, hi[i], b);
        }
    }
    for (int i = 0; i < 4; i++) out[i] = lane_tree(cop, lo[i], hi[i]);
}

AI float col1_impl(int op, const float *x, float c, int64_t n, int64_t k0, int64_t k1)
{
    const int cop = comb_op(op);
    if (k1 <= k0) return s_ident(cop);
    float stk[64];
    int sp = 0;
    __m256 nan = _mm256_setzero_ps(), vc = _mm256_set1_ps(c);
#define COMB(a, b) s_comb(cop, a, b)
    int64_t k = k0;
    for (; k + 4 <= k1 && (k + 4) * CTPU_K_RED_CHUNK <= n; k += 4) {
        float v4[4];
        chunk4(op, x + k * CTPU_K_RED_CHUNK, vc, &nan, v4);
        for (int i = 0; i < 4; i++) TREE_PUSH(stk, sp, k + i - k0, v4[i], COMB);
    }
    for (; k < k1; k++) {
        float v = chunk1(op, x + k * CTPU_K_RED_CHUNK, chunk_len(n, k), vc, &nan);
        TREE_PUSH(stk, sp, k - k0, v, COMB);
    }
    TREE_FINISH(stk, sp, COMB);
#undef COMB
    return _mm256_movemask_ps(nan) ? NAN : stk[0];
}

float ctpu_k_red_col1_avx2(int op, const float *x, float c, int64_t n, int64_t k0, int64_t k1)
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
    int64_t m = (n + CTPU_K_RED_CHUNK - 1) / CTPU_K_RED_CHUNK;
    for (int64_t r = 0; r < rows; r++) {
        float cr = c ? c[r] : 0.0f;
        if (m == 1) {
            __m256 nan = _mm256_setzero_ps();
            float v = chunk1(op, x + r * n, n, _mm256_set1_ps(cr), &nan);
            y[r] = _mm256_movemask_ps(nan) ? NAN : v;
        } else {
            y[r] = col1_impl(op, x + r * n, cr, n, 0, m);
        }
    }
}

void ctpu_k_red_rows1_avx2(int op, const float *x, const float *c, int64_t n, int64_t rows,
                           float *y)
{
    switch (op) {
    case CTPU_K_RED_SUM: rows1_impl(CTPU_K_RED_SUM, x, c, n, rows, y); break;
    case CTPU_K_RED_MAX: rows1_impl(CTPU_K_RED_MAX, x, c, n, rows, y); break;
    case CTPU_K_RED_MIN: rows1_impl(CTPU_K_RED_MIN, x, c, n, rows, y); break;
    default: rows1_impl(RED_SQDEV, x, c, n, rows, y); break;
    }
}

/* Up to 8 columns at stride `inner` (masked-off columns are computed on zeros
 * and never stored). */
AI void colv8(int op, const float *x, const float *cv, int64_t n, int64_t inner, int ncols,
              int64_t k0, int64_t k1, float *out)
{
    const int cop = comb_op(op);
    __m256i km = lane_mask(ncols);
    __m256 vc = cv ? _mm256_maskload_ps(cv, km) : _mm256_setzero_ps();
    __m256 id = _mm256_set1_ps(s_ident(cop));
    __m256 stk[64];
    int sp = 0;
    __m256 nan = _mm256_setzero_ps(), r = id;
#define COMB(a, b) v_comb(cop, a, b)
    for (int64_t k = k0; k < k1; k++) {
        const float *xc = x + k * CTPU_K_RED_CHUNK * inner;
        int64_t len = chunk_len(n, k);
        __m256 acc[16];
#pragma GCC unroll 16
        for (int l = 0; l < 16; l++) acc[l] = id;
        int64_t j = 0;
        for (; j + 16 <= len; j += 16) {
#pragma GCC unroll 16
            for (int l = 0; l < 16; l++) {
                __m256 v = v_elem(op, _mm256_maskload_ps(xc + (j + l) * inner, km), vc);
                if (is_minmax(op)) nan = _mm256_or_ps(nan, v_unord(v));
                acc[l] = v_comb(cop, acc[l], v);
            }
        }
        int rem = (int)(len - j);
#pragma GCC unroll 16
        for (int l = 0; l < 16; l++) {
            if (l < rem) {
                __m256 v = v_elem(op, _mm256_maskload_ps(xc + (j + l) * inner, km), vc);
                if (is_minmax(op)) nan = _mm256_or_ps(nan, v_unord(v));
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
    r = _mm256_blendv_ps(r, _mm256_set1_ps(NAN), nan);
    _mm256_maskstore_ps(out, km, r);
}

AI void colv_impl(int op, const float *x, const float *cv, int64_t n, int64_t inner, int ncols,
                  int64_t k0, int64_t k1, float *out)
{
    for (int g = 0; g < ncols; g += 8)
        colv8(op, x + g, cv ? cv + g : NULL, n, inner, ncols - g < 8 ? ncols - g : 8, k0, k1,
              out + g);
}

void ctpu_k_red_colv_avx2(int op, const float *x, const float *cv, int64_t n, int64_t inner,
                          int ncols, int64_t k0, int64_t k1, float *out)
{
    switch (op) {
    case CTPU_K_RED_SUM: colv_impl(CTPU_K_RED_SUM, x, cv, n, inner, ncols, k0, k1, out); break;
    case CTPU_K_RED_MAX: colv_impl(CTPU_K_RED_MAX, x, cv, n, inner, ncols, k0, k1, out); break;
    case CTPU_K_RED_MIN: colv_impl(CTPU_K_RED_MIN, x, cv, n, inner, ncols, k0, k1, out); break;
    default: colv_impl(RED_SQDEV, x, cv, n, inner, ncols, k0, k1, out); break;
    }
}

/* softmax / log_softmax of one row (n > 0), as reduce_avx512.c; exp and log
 * are SLEEF's non-FMA AVX variants (same bits as purec). */
void ctpu_k_softmax_row_avx2(const float *x, int64_t n, float *y, bool log)
{
    int64_t m = (n + CTPU_K_RED_CHUNK - 1) / CTPU_K_RED_CHUNK;
    float mx;
    if (m == 1) {
        __m256 nan = _mm256_setzero_ps();
        mx = chunk1(CTPU_K_RED_MAX, x, n, zero8(), &nan);
        if (_mm256_movemask_ps(nan)) mx = NAN;
    } else {
        mx = col1_impl(CTPU_K_RED_MAX, x, 0.0f, n, 0, m);
    }
    __m256 vm = _mm256_set1_ps(mx), zero = _mm256_setzero_ps();
    float stk[64] = { 0.0f };
    int sp = 0;
#define COMB(a, b) ((a) + (b))
    for (int64_t k = 0; k < m; k++) {
        const float *xc = x + k * CTPU_K_RED_CHUNK;
        float *yc = y + k * CTPU_K_RED_CHUNK;
        int64_t len = chunk_len(n, k), j = 0;
        __m256 lo = zero, hi = zero;
        for (; j + 16 <= len; j += 16) {
            __m256 a = Sleef_expf8_u10avx(_mm256_sub_ps(_mm256_loadu_ps(xc + j), vm));
            __m256 b = Sleef_expf8_u10avx(_mm256_sub_ps(_mm256_loadu_ps(xc + j + 8), vm));
            if (!log) { _mm256_storeu_ps(yc + j, a); _mm256_storeu_ps(yc + j + 8, b); }
            lo = _mm256_add_ps(lo, a);
            hi = _mm256_add_ps(hi, b);
        }
        if (j < len) {
            __m256i ma = lane_mask(len - j), mb = lane_mask(len - j - 8);
            __m256 a = Sleef_expf8_u10avx(_mm256_sub_ps(_mm256_maskload_ps(xc + j, ma), vm));
            __m256 b = Sleef_expf8_u10avx(_mm256_sub_ps(_mm256_maskload_ps(xc + j + 8, mb), vm));
            if (!log) { _mm256_maskstore_ps(yc + j, ma, a); _mm256_maskstore_ps(yc + j + 8, mb, b); }
            lo = _mm256_add_ps(lo, _mm256_blendv_ps(zero, a, _mm256_castsi256_ps(ma)));
            hi = _mm256_add_ps(hi, _mm256_blendv_ps(zero, b, _mm256_castsi256_ps(mb)));
        }
        TREE_PUSH(stk, sp, k, lane_tree(CTPU_K_RED_SUM, lo, hi), COMB);
    }
    TREE_FINISH(stk, sp, COMB);
#undef COMB
    float s = stk[0];
    int64_t j = 0;
    if (!log) {
        __m256 vs = _mm256_set1_ps(s);
        for (; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, _mm256_div_ps(_mm256_loadu_ps(y + j), vs));
        if (j < n) {
            __m256i km = lane_mask(n - j);
            _mm256_maskstore_ps(y + j, km, _mm256_div_ps(_mm256_maskload_ps(y + j, km), vs));
        }
    } else {
        __m256 vl = Sleef_logf8_u10avx(_mm256_set1_ps(s));
        for (; j + 8 <= n; j += 8)
            _mm256_storeu_ps(y + j, _mm256_sub_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm), vl));
        if (j < n) {
            __m256i km = lane_mask(n - j);
            _mm256_maskstore_ps(
                y + j, km, _mm256_sub_ps(_mm256_sub_ps(_mm256_maskload_ps(x + j, km), vm), vl));
        }
    }
}
