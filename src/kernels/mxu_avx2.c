/* MXU matmul, AVX2 + FMA: the step of mxu.h is exactly one FMA (bf16 x bf16
 * products are exact in f32; one rounding) under MXCSR FTZ|DAZ (tininess
 * after rounding, as vdpbf16ps), set for the micro-kernel's duration and
 * restored. Operands are packed already widened to bf16-valued f32 (the
 * planar layout of mxu.h: per K pair the odd elements, then the even ones),
 * so a K pair is two plain sgemm steps, odd element first, and the inner
 * loop has no unpacking: 2 B loads, 6 broadcasts from memory and 12 FMAs per
 * element. Micro-tile 6 x 16: 12 ymm accumulators (the Haswell / Zen shape:
 * 16 ymm registers). An A with unit stride along k (K >= 32) may come in the
 * row layout instead (mxu.h: a rounded copy of the rows, no transpose). */
#include <immintrin.h>
#include "mxu.h"

#define MR 6
#define NR 16

/* Rows 0..R-1 of the 6 x 16 tile. A planar (AR = 0: pair p's odd elements
 * at a + p*2*MR, its even ones MR further) or in the row layout (AR = 1: row
 * r's element k at a + r*as + k, natural order, the odd partner past K a
 * stored +0; rows 3j..3j+2 from one pointer). Starts from cin (row stride
 * ldin; NULL: +0; may equal c), stores to c; with PF, each pair step also
 * prefetches the next two of pf's lines. */
static inline __attribute__((always_inline)) void mxu_fma8_tile(int R, int AR, int PF, int64_t kp, const float *a,
                                                                int64_t as, const float *b, const float *cin,
                                                                int64_t ldin, float *c, int64_t ldc,
                                                                const ctpu_mxu_pf *pf)
{
    ctpu_mxu_pf_cursor pfc = ctpu_mxu_pf_start(PF, pf);
    if (AR && c != cin) {   /* the output tile (c itself, not the scratch): its lines arrive while this computes */
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) __builtin_prefetch(c + r * ldc, 1, 3);
    }
    unsigned csr = _mm_getcsr();
    _mm_setcsr((csr & ~0x6000u) | 0x8040u);        /* FTZ | DAZ, round to nearest */
    __m256 acc[MR][2];
    if (cin) {
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            acc[r][0] = _mm256_loadu_ps(cin + r * ldin);
            acc[r][1] = _mm256_loadu_ps(cin + r * ldin + 8);
        }
    } else {
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    }
    /* GCC does not order FP arithmetic against ldmxcsr: pin the accumulators
     * between the two MXCSR writes. */
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) __asm__ volatile("" : "+x"(acc[r][0]), "+x"(acc[r][1]));
    const float *ar0 = a, *ar1 = a + (AR && R > 3 ? 3 * as : 0);
    for (int64_t p = 0; p < kp; p++) {
        if (PF) ctpu_mxu_pf_step2(&pfc, pf);
        const float *bp = b + p * 2 * NR, *ap = a + p * 2 * MR;
        __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256 ao = _mm256_broadcast_ss(AR ? (r < 3 ? ar0 : ar1) + (r % 3) * as + 1 : ap + r);
            acc[r][0] = _mm256_fmadd_ps(ao, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(ao, b1, acc[r][1]);
        }
        b0 = _mm256_loadu_ps(bp + NR);
        b1 = _mm256_loadu_ps(bp + NR + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256 ae = _mm256_broadcast_ss(AR ? (r < 3 ? ar0 : ar1) + (r % 3) * as : ap + MR + r);
            acc[r][0] = _mm256_fmadd_ps(ae, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(ae, b1, acc[r][1]);
        }
        if (AR) { ar0 += 2; ar1 += 2; }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) __asm__ volatile("" : "+x"(acc[r][0]), "+x"(acc[r][1]));
    _mm_setcsr(csr);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(c + r * ldc, acc[r][0]);
        _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
    }
}

/* Planar A: the ctpu_mxu_kernel_fn form (c loaded when load != 0). */
#define MXU_FMA8_PL(R)                                                                                    \
    static void mxu_fma8_pl_##R(int64_t kp, const uint32_t *a, const uint32_t *b, float *c, int64_t ldc,  \
                                int load)                                                                 \
    {                                                                                                     \
        mxu_fma8_tile(R, 0, 0, kp, (const float *)a, 0, (const float *)b, load ? c : NULL, ldc, c, ldc,   \
                      NULL);                                                                              \
    }
/* Row-layout A: the ctpu_mxu_kernel_ar_fn form. */
#define MXU_FMA8_AR(R)                                                                                    \
    static void mxu_fma8_ar_##R(int64_t kp, const uint32_t *a, int64_t as, const uint32_t *b,             \
                                const float *cin, int64_t ldin, float *c, int64_t ldc, const ctpu_mxu_pf *pf) \
    {                                                                                                     \
        if (pf && pf->n > 0)                                                                              \
            mxu_fma8_tile(R, 1, 1, kp, (const float *)a, as, (const float *)b, cin, ldin, c, ldc, pf);    \
        else                                                                                              \
            mxu_fma8_tile(R, 1, 0, kp, (const float *)a, as, (const float *)b, cin, ldin, c, ldc, pf);    \
    }
MXU_FMA8_PL(1) MXU_FMA8_PL(2) MXU_FMA8_PL(3) MXU_FMA8_PL(4) MXU_FMA8_PL(5) MXU_FMA8_PL(6)
MXU_FMA8_AR(1) MXU_FMA8_AR(2) MXU_FMA8_AR(3) MXU_FMA8_AR(4) MXU_FMA8_AR(5) MXU_FMA8_AR(6)
static const ctpu_mxu_kernel_fn mxu_fma8_pl[MR + 1] = {
    NULL, mxu_fma8_pl_1, mxu_fma8_pl_2, mxu_fma8_pl_3, mxu_fma8_pl_4, mxu_fma8_pl_5, mxu_fma8_pl_6,
};
static const ctpu_mxu_kernel_ar_fn mxu_fma8_ar[MR + 1] = {
    NULL, mxu_fma8_ar_1, mxu_fma8_ar_2, mxu_fma8_ar_3, mxu_fma8_ar_4, mxu_fma8_ar_5, mxu_fma8_ar_6,
};

/* 8 f32 (bits) -> bf16-valued f32 bits, exactly ctpu_mxu_round_bits: the
 * round-to-nearest-even add, NaNs quieted and truncated (only when a lane is
 * one), then results with a zero exponent (subnormal bf16) flushed to the
 * sign's zero. */
static inline __attribute__((always_inline)) __m256i mxu_round8(__m256i u)
{
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u), inf = _mm256_set1_epi32(0x7f800000);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i h = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), hi);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), inf);
    if (!_mm256_testz_si256(nan, nan)) {
        __m256i q = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), hi);
        h = _mm256_blendv_epi8(h, q, nan);
    }
    __m256i tiny = _mm256_cmpeq_epi32(_mm256_and_si256(h, inf), _mm256_setzero_si256());
    /* tiny lanes keep the sign bit only */
    return _mm256_and_si256(h, _mm256_or_si256(_mm256_xor_si256(tiny, _mm256_set1_epi32(-1)),
                                               _mm256_set1_epi32((int)0x80000000u)));
}

/* n (0..8) elements of an f32 or bf16 row at element offset off, rounded,
 * as f32 bits; lanes past n are +0 (nothing past them is read). */
static inline __attribute__((always_inline)) __m256i mxu_load8(const void *src, int dt, int64_t off, int n)
{
    __m256i u;
    if (dt == CTPU_KDT_F32) {
        if (n >= 8) {
            u = _mm256_loadu_si256((const __m256i *)((const uint32_t *)src + off));
        } else {
            const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
            u = _mm256_maskload_epi32((const int *)((const uint32_t *)src + off), m);
        }
    } else {
        __m128i h;
        if (n >= 8) {
            h = _mm_loadu_si128((const __m128i *)((const uint16_t *)src + off));
        } else {
            uint16_t t[8] = { 0 };
            for (int i = 0; i < n; i++) t[i] = ((const uint16_t *)src)[off + i];
            h = _mm_loadu_si128((const __m128i *)t);
        }
        u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    }
    return mxu_round8(u);
}

/* Lanes 0..n-1 (n <= 8) of v at d. */
static inline __attribute__((always_inline)) void mxu_store8(uint32_t *d, __m256i v, int n)
{
    if (n >= 8) { _mm256_storeu_si256((__m256i *)d, v); return; }
    __m128i lo = _mm256_castsi256_si128(v);
    if (n >= 4) {
        _mm_storeu_si128((__m128i *)d, lo);
        lo = _mm256_extracti128_si256(v, 1);
        d += 4;
        n -= 4;
    }
    if (n >= 2) {
        _mm_storel_epi64((__m128i *)d, lo);
        lo = _mm_srli_si128(lo, 8);
        d += 2;
        n -= 2;
    }
    if (n) *d = (uint32_t)_mm_cvtsi128_si32(lo);
}

/* t[j] = column j of the 8 x 8 dword matrix whose rows are r[0..7]. */
static inline __attribute__((always_inline)) void mxu_transpose8(const __m256i r[8], __m256i t[8])
{
    __m256 a[8], b[8];
    for (int i = 0; i < 4; i++) {
        a[2 * i] = _mm256_unpacklo_ps(_mm256_castsi256_ps(r[2 * i]), _mm256_castsi256_ps(r[2 * i + 1]));
        a[2 * i + 1] = _mm256_unpackhi_ps(_mm256_castsi256_ps(r[2 * i]), _mm256_castsi256_ps(r[2 * i + 1]));
    }
    for (int i = 0; i < 2; i++) {
        b[4 * i] = _mm256_shuffle_ps(a[4 * i], a[4 * i + 2], 0x44);
        b[4 * i + 1] = _mm256_shuffle_ps(a[4 * i], a[4 * i + 2], 0xee);
        b[4 * i + 2] = _mm256_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0x44);
        b[4 * i + 3] = _mm256_shuffle_ps(a[4 * i + 1], a[4 * i + 3], 0xee);
    }
    for (int c = 0; c < 4; c++) {
        t[c] = _mm256_castps_si256(_mm256_permute2f128_ps(b[c], b[4 + c], 0x20));
        t[4 + c] = _mm256_castps_si256(_mm256_permute2f128_ps(b[c], b[4 + c], 0x31));
    }
}

/* An 8 x 8 block of an f32 operand with unit stride along k, all in
 * bounds: NRW (6 or 8) rows at x (row stride si), 8 k, rounded, transposed
 * and stored as 4 pairs of a planar panel of width w at o (lanes past NRW
 * are zeros; WC of them stored). */
static inline __attribute__((always_inline)) void mxu_rows_block_f32(int NRW, int WC, const uint32_t *x, int64_t si,
                                                                     uint32_t *o, int w)
{
    __m256i v[8], t[8];
#pragma GCC unroll 8
    for (int rr = 0; rr < 8; rr++)
        v[rr] = rr < NRW ? mxu_round8(_mm256_loadu_si256((const __m256i *)(x + rr * si))) : _mm256_setzero_si256();
    mxu_transpose8(v, t);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) mxu_store8(o + (j / 2) * 2 * w + (j & 1 ? 0 : w), t[j], WC);
}

/* Planar packing of an operand with unit stride along k (default
 * precision, f32 or bf16): 8 rows x 8 k rounded, transposed, each column k
 * stored as the odd or even row of its pair; k past K and rows past I load
 * as zeros. Whole f32 blocks of 8 (or a 6-row panel's 6) rows take
 * mxu_rows_block_f32. */
static __attribute__((noinline)) void mxu_pack_avx2_rows(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1)
{
    int64_t kh = ctpu_mxu_kh(pa->K), K = pa->K, si = pa->si;
    int w = pa->w;
    int64_t pd = 2 * kh * w;
    for (int64_t q = q0; q < q1; q++) {
        uint32_t *d = pa->dst + q * pd;
        int64_t i0 = q * w, n = pa->I - i0 < w ? pa->I - i0 : w;
        for (int r0 = 0; r0 < w; r0 += 8) {
            int wc = w - r0 < 8 ? w - r0 : 8;
            int64_t k0 = 0;
            if (pa->dt == CTPU_KDT_F32 && (wc == 8 || wc == 6) && n - r0 >= wc) {
                const uint32_t *x = (const uint32_t *)pa->src + (i0 + r0) * si;
                uint32_t *o = d + r0;
                if (wc == 8)
                    for (; k0 + 8 <= K; k0 += 8) mxu_rows_block_f32(8, 8, x + k0, si, o + (k0 / 2) * 2 * w, w);
                else
                    for (; k0 + 8 <= K; k0 += 8) mxu_rows_block_f32(6, 6, x + k0, si, o + (k0 / 2) * 2 * w, w);
            }
            for (; k0 < K; k0 += 8) {
                int cnt = K - k0 < 8 ? (int)(K - k0) : 8;
                __m256i v[8], t[8];
                for (int rr = 0; rr < 8; rr++)
                    v[rr] = r0 + rr < n ? mxu_load8(pa->src, pa->dt, (i0 + r0 + rr) * si + k0, cnt)
                                        : _mm256_setzero_si256();
                mxu_transpose8(v, t);
                uint32_t *o = d + (k0 / 2) * 2 * w + r0;
                int nj = 2 * ((cnt + 1) / 2);
                for (int j = 0; j < nj; j++) mxu_store8(o + (j / 2) * 2 * w + (j & 1 ? 0 : w), t[j], wc);
            }
        }
    }
}

/* Rows 2p and 2p+1 (p in [p0, p1)) of an f32 operand with unit stride along
 * i, W (16 or 6) lanes of each from x (row stride sk), rounded, as the
 * even and odd rows of planar panel d; the source rows 16 rows ahead
 * prefetched (not past K). 8-lane loads: the caller checks they are in bounds. */
static inline __attribute__((always_inline)) void mxu_cols_f32(int W, const uint32_t *x, int64_t sk, uint32_t *d,
                                                               int64_t p0, int64_t p1, int64_t K)
{
    for (int64_t p = p0; p < p1; p++) {
        const uint32_t *x0 = x + 2 * p * sk, *x1 = x0 + sk;
        uint32_t *od = d + p * 2 * W, *ev = od + W;
        if (2 * p + 17 < K) {
            _mm_prefetch((const char *)(x0 + 16 * sk), _MM_HINT_T0);
            _mm_prefetch((const char *)(x0 + 16 * sk + W - 1), _MM_HINT_T0);
            _mm_prefetch((const char *)(x1 + 16 * sk), _MM_HINT_T0);
            _mm_prefetch((const char *)(x1 + 16 * sk + W - 1), _MM_HINT_T0);
        }
#pragma GCC unroll 2
        for (int r = 0; r < W; r += 8) {
            int wc = W - r < 8 ? W - r : 8;
            mxu_store8(ev + r, mxu_round8(_mm256_loadu_si256((const __m256i *)(x0 + r))), wc);
            mxu_store8(od + r, mxu_round8(_mm256_loadu_si256((const __m256i *)(x1 + r))), wc);
        }
    }
}

/* Planar packing of an operand with unit stride along i (default
 * precision, f32 or bf16): vectors along i, in blocks of 16 pairs across
 * the panels so that each source row is read left to right; partial
 * panels' lanes past I load as zeros. */
static __attribute__((noinline)) void mxu_pack_avx2_cols(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1)
{
    int64_t kh = ctpu_mxu_kh(pa->K), K = pa->K, sk = pa->sk;
    int w = pa->w;
    int64_t pd = 2 * kh * w;
    for (int64_t pb = 0; pb < kh; pb += 16) {
        int64_t pe = kh - pb < 16 ? kh : pb + 16;
        for (int64_t q = q0; q < q1; q++) {
            uint32_t *d = pa->dst + q * pd;
            int64_t i0 = q * w, n = pa->I - i0 < w ? pa->I - i0 : w;
            int64_t es = (int64_t)ctpu_kdt_size(pa->dt);
            int64_t p = pb;
            if (pa->dt == CTPU_KDT_F32 && (w == 16 || w == 6) && i0 + (w + 7) / 8 * 8 <= pa->I) {
                /* whole vectors in bounds, both rows of each pair */
                int64_t pf = pe < K / 2 ? pe : K / 2;
                const uint32_t *x = (const uint32_t *)pa->src + i0;
                if (w == 16) mxu_cols_f32(16, x, sk, d, p, pf, K);
                else mxu_cols_f32(6, x, sk, d, p, pf, K);
                p = pf > p ? pf : p;
            }
            for (; p < pe; p++) {
                uint32_t *od = d + p * 2 * w, *ev = od + w;
                int has1 = 2 * p + 1 < K;
                if (2 * p + 17 < K) {   /* 8 pairs ahead: the rows arrive while this packs */
                    const char *x = (const char *)pa->src + ((2 * p + 16) * sk + i0) * es;
                    _mm_prefetch(x, _MM_HINT_T0);
                    _mm_prefetch(x + w * es - 1, _MM_HINT_T0);
                    _mm_prefetch(x + sk * es, _MM_HINT_T0);
                    _mm_prefetch(x + sk * es + w * es - 1, _MM_HINT_T0);
                }
                for (int r = 0; r < w; r += 8) {
                    /* 8 lanes in bounds: a plain load (lanes past the panel are not stored) */
                    int cnt = i0 + r + 8 <= pa->I ? 8 : n - r < 0 ? 0 : n - r > 8 ? 8 : (int)(n - r);
                    int wc = w - r < 8 ? w - r : 8;
                    mxu_store8(ev + r, mxu_load8(pa->src, pa->dt, 2 * p * sk + i0 + r, cnt), wc);
                    mxu_store8(od + r, has1 ? mxu_load8(pa->src, pa->dt, (2 * p + 1) * sk + i0 + r, cnt)
                                            : _mm256_setzero_si256(), wc);
                }
            }
        }
    }
}

/* Planar packing (mxu.h). Default precision, f32 or bf16, with unit stride
 * along i (B row-major, A transposed: vectors along i, in blocks of 16
 * pairs across the panels so that each source row is read left to right)
 * or along k (A row-major, B transposed: 8 rows x 8 k rounded, transposed,
 * each column k stored as the odd or even row of its pair; k past K and
 * rows past I load as zeros); the rest, the shared packer. */
static void mxu_pack_avx2_planar(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1)
{
    int64_t si = pa->si, sk = pa->sk;
    int fast = pa->npass == 1 && pa->parts[0] == 0 && (pa->dt == CTPU_KDT_F32 || pa->dt == CTPU_KDT_BF16);
    if (!fast || (si != 1 && sk != 1)) { ctpu_mxu_pack_planar(pa, q0, q1); return; }
    if (si == 1 && !(sk == 1 && pa->w < 8)) mxu_pack_avx2_cols(pa, q0, q1);
    else mxu_pack_avx2_rows(pa, q0, q1);
}

/* Row-layout packing for the FMA kernel: row r of a panel is the row's K
 * elements rounded (bf16-valued f32), in order, then a +0 when K is odd
 * (the odd partner); rows past I are zeros. No transpose. */
static void mxu_pack_avx2_ar(const ctpu_mxu_pack_args *pa, int64_t rs, int64_t q0, int64_t q1)
{
    int64_t K = pa->K, k2 = 2 * ctpu_mxu_kh(K), si = pa->si;
    int w = pa->w;
    for (int64_t q = q0; q < q1; q++) {
        uint32_t *d = pa->dst + q * w * rs;
        for (int r = 0; r < w; r++) {
            uint32_t *o = d + r * rs;
            int64_t i = q * w + r;
            if (i >= pa->I) {
                memset(o, 0, (size_t)k2 * 4);
                continue;
            }
            if (pa->dt == CTPU_KDT_F32) {
                const uint32_t *x = (const uint32_t *)pa->src + i * si;
                for (int64_t k = 0; k < K; k++) o[k] = ctpu_mxu_round_bits(x[k]);
            } else {
                const uint16_t *x = (const uint16_t *)pa->src + i * si;
                for (int64_t k = 0; k < K; k++) o[k] = ctpu_mxu_round_bits((uint32_t)x[k] << 16);
            }
            if (k2 > K) o[K] = 0;
        }
    }
}

const ctpu_mxu_impl ctpu_mxu_impl_avx2 = {
    .name = "avx2", .mr = MR, .nr = NR, .planar = 1, .kernel = mxu_fma8_pl_6,
    .kernel_rows = mxu_fma8_pl, .pack = mxu_pack_avx2_planar,
    .kernel_ar = mxu_fma8_ar, .pack_ar = mxu_pack_avx2_ar,
};
