/* MXU matmul, AVX-512. Two micro-kernels give the reference's bits; which
 * one runs is chosen once per process by a timed probe (mxu_ref.c):
 *
 * - FMA (ctpu_mxu_impl_avx512): the step of mxu.h is exactly one FMA
 *   (bf16 x bf16 products are exact in f32; one rounding) under MXCSR
 *   FTZ|DAZ (tininess after rounding, as vdpbf16ps), so a K pair is two
 *   vfmadd231ps, odd element first, on operands packed as bf16-valued f32
 *   (planar layout). Micro-tile 12 x 32: 24 zmm accumulators, 4 B vectors
 *   per K pair, A broadcast from memory: from planar panels, or, for an A
 *   with unit stride along k (K >= 32), from the row layout (mxu.h: a
 *   rounded copy of the rows, no transpose), with a kernel for each row
 *   count of a last panel. The faster one where vfmadd231ps zmm
 *   issues 2 per cycle and vdpbf16ps 1 per 2 (Sapphire Rapids).
 * - vdpbf16ps (ctpu_mxu_impl_avx512_dp): the instruction is the step itself.
 *   Micro-tile 14 x 32 on pair-dword panels. The faster one where both issue
 *   at the same rate (Zen 4: 225 vs 114 GFLOP/s per core here). */
#include <immintrin.h>
#include "mxu.h"

#define DP_MR 14
#define NR 32
#define FMA_MR 12

/* Rows 0..R-1 of the DP_MR x 32 tile (A panels keep their DP_MR stride):
 * R = DP_MR is the micro-kernel, smaller R the last panel of an M that is
 * not a multiple of DP_MR (and the whole of a skinny one). */
static inline __attribute__((always_inline)) void mxu_dp_rows(int R, int64_t kp, const uint32_t *a,
                                                              const uint32_t *b, float *c, int64_t ldc,
                                                              int load)
{
    __m512 acc[DP_MR][2];
    if (load) {
#pragma GCC unroll 14
        for (int r = 0; r < R; r++) {
            acc[r][0] = _mm512_loadu_ps(c + r * ldc);
            acc[r][1] = _mm512_loadu_ps(c + r * ldc + 16);
        }
    } else {
#pragma GCC unroll 14
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < kp; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * NR + 16);
        const uint32_t *ap = a + p * DP_MR;
#pragma GCC unroll 14
        for (int r = 0; r < R; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        }
    }
#pragma GCC unroll 14
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(c + r * ldc, acc[r][0]);
        _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
    }
}

#define MXU_DP_ROWS(R)                                                                             \
    static void mxu_kernel_avx512_dp_##R(int64_t kp, const uint32_t *a, const uint32_t *b, float *c, \
                                         int64_t ldc, int load)                                    \
    {                                                                                              \
        mxu_dp_rows(R, kp, a, b, c, ldc, load);                                                    \
    }
MXU_DP_ROWS(1) MXU_DP_ROWS(2) MXU_DP_ROWS(3) MXU_DP_ROWS(4) MXU_DP_ROWS(5) MXU_DP_ROWS(6) MXU_DP_ROWS(7)
MXU_DP_ROWS(8) MXU_DP_ROWS(9) MXU_DP_ROWS(10) MXU_DP_ROWS(11) MXU_DP_ROWS(12) MXU_DP_ROWS(13)
MXU_DP_ROWS(14)
static const ctpu_mxu_kernel_fn mxu_dp_kernel_rows[DP_MR + 1] = {
    NULL, mxu_kernel_avx512_dp_1, mxu_kernel_avx512_dp_2, mxu_kernel_avx512_dp_3, mxu_kernel_avx512_dp_4,
    mxu_kernel_avx512_dp_5, mxu_kernel_avx512_dp_6, mxu_kernel_avx512_dp_7, mxu_kernel_avx512_dp_8,
    mxu_kernel_avx512_dp_9, mxu_kernel_avx512_dp_10, mxu_kernel_avx512_dp_11, mxu_kernel_avx512_dp_12,
    mxu_kernel_avx512_dp_13, mxu_kernel_avx512_dp_14,
};

/* The same tile on a row-layout A (mxu.h): row r's pair p at a[r * as + p].
 * Five row pointers (rows 3j, 3j+1, 3j+2 at + 0, as, 2 as) advance one dword
 * per pair. Starts from cin (NULL: +0), stores to c; with pf, each pair step
 * also prefetches the next two of pf's lines (the source of the next chunk
 * to pack: those loads wait on memory while this tile computes). */
static inline __attribute__((always_inline)) void mxu_dp_rows_ar(int R, int PF, int64_t kp, const uint32_t *a,
                                                                 int64_t as, const uint32_t *b, const float *cin,
                                                                 int64_t ldin, float *c, int64_t ldc,
                                                                 const ctpu_mxu_pf *pf)
{
    ctpu_mxu_pf_cursor pfc = ctpu_mxu_pf_start(PF, pf);
    if (c != cin) {   /* the output tile (c itself, not the scratch): its lines arrive while this computes */
#pragma GCC unroll 14
        for (int r = 0; r < R; r++) {
            __builtin_prefetch(c + r * ldc, 1, 3);
            __builtin_prefetch(c + r * ldc + 16, 1, 3);
        }
    }
    __m512 acc[DP_MR][2];
    if (cin) {
#pragma GCC unroll 14
        for (int r = 0; r < R; r++) {
            acc[r][0] = _mm512_loadu_ps(cin + r * ldin);
            acc[r][1] = _mm512_loadu_ps(cin + r * ldin + 16);
        }
    } else {
#pragma GCC unroll 14
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    }
    const uint32_t *ar[5];
#pragma GCC unroll 5
    for (int j = 0; j < 5; j++) ar[j] = a + (3 * j < R ? 3 * j : 0) * as;
    for (int64_t p = 0; p < kp; p++) {
        if (PF) ctpu_mxu_pf_step2(&pfc, pf);
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * NR + 16);
#pragma GCC unroll 14
        for (int r = 0; r < R; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)ar[r / 3][(r % 3) * as]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        }
#pragma GCC unroll 5
        for (int j = 0; j < 5; j++) ar[j]++;
    }
#pragma GCC unroll 14
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(c + r * ldc, acc[r][0]);
        _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
    }
}

#define MXU_DP_AR(R)                                                                                  \
    static void mxu_kernel_avx512_dp_ar_##R(int64_t kp, const uint32_t *a, int64_t as, const uint32_t *b, \
                                            const float *cin, int64_t ldin, float *c, int64_t ldc,    \
                                            const ctpu_mxu_pf *pf)                                    \
    {                                                                                                 \
        if (pf && pf->n > 0) mxu_dp_rows_ar(R, 1, kp, a, as, b, cin, ldin, c, ldc, pf);                            \
        else mxu_dp_rows_ar(R, 0, kp, a, as, b, cin, ldin, c, ldc, pf);                               \
    }
MXU_DP_AR(1) MXU_DP_AR(2) MXU_DP_AR(3) MXU_DP_AR(4) MXU_DP_AR(5) MXU_DP_AR(6) MXU_DP_AR(7)
MXU_DP_AR(8) MXU_DP_AR(9) MXU_DP_AR(10) MXU_DP_AR(11) MXU_DP_AR(12) MXU_DP_AR(13) MXU_DP_AR(14)
static const ctpu_mxu_kernel_ar_fn mxu_dp_kernel_ar[DP_MR + 1] = {
    NULL, mxu_kernel_avx512_dp_ar_1, mxu_kernel_avx512_dp_ar_2, mxu_kernel_avx512_dp_ar_3,
    mxu_kernel_avx512_dp_ar_4, mxu_kernel_avx512_dp_ar_5, mxu_kernel_avx512_dp_ar_6,
    mxu_kernel_avx512_dp_ar_7, mxu_kernel_avx512_dp_ar_8, mxu_kernel_avx512_dp_ar_9,
    mxu_kernel_avx512_dp_ar_10, mxu_kernel_avx512_dp_ar_11, mxu_kernel_avx512_dp_ar_12,
    mxu_kernel_avx512_dp_ar_13, mxu_kernel_avx512_dp_ar_14,
};

/* The FMA micro-kernels: rows 0..R-1 of a tile NV x 16 columns wide (NR =
 * 16 NV), R <= FMA_MAXR. A planar (AR = 0: pair p's odd elements at
 * a + p*2W, its even ones W further; W the panel width) or in the row
 * layout (AR = 1: row r's element k at a + r*as + k, natural order, the odd
 * partner past K a stored +0; rows 3j..3j+2 from one pointer). Starts from
 * cin (row stride ldin; NULL: +0; may equal c), stores to c; with PF, each
 * pair step also prefetches the next two of pf's lines. */
#define FMA_MAXR 12
static inline __attribute__((always_inline)) void mxu_fma_tile(int R, int W, int NV, int AR, int PF, int64_t kp,
                                                               const float *a, int64_t as, const float *b,
                                                               const float *cin, int64_t ldin, float *c,
                                                               int64_t ldc, const ctpu_mxu_pf *pf)
{
    const int nr = 16 * NV;
    ctpu_mxu_pf_cursor pfc = ctpu_mxu_pf_start(PF, pf);
    if (AR && c != cin) {   /* the output tile (c itself, not the scratch): its lines arrive while this computes */
#pragma GCC unroll 12
        for (int r = 0; r < R; r++)
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) __builtin_prefetch(c + r * ldc + 16 * v, 1, 3);
    }
    unsigned csr = _mm_getcsr();
    _mm_setcsr((csr & ~0x6000u) | 0x8040u);        /* FTZ | DAZ, round to nearest */
    __m512 acc[FMA_MAXR][2];
    if (cin) {
#pragma GCC unroll 12
        for (int r = 0; r < R; r++)
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_loadu_ps(cin + r * ldin + 16 * v);
    } else {
#pragma GCC unroll 12
        for (int r = 0; r < R; r++)
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    }
    /* GCC does not order FP arithmetic against ldmxcsr: pin the accumulators
     * between the two MXCSR writes. */
#pragma GCC unroll 12
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) __asm__ volatile("" : "+v"(acc[r][v]));
    const float *ar[(FMA_MAXR + 2) / 3];
#pragma GCC unroll 4
    for (int j = 0; j < (FMA_MAXR + 2) / 3; j++) ar[j] = a + (AR && 3 * j < R ? 3 * j : 0) * as;
    for (int64_t p = 0; p < kp; p++) {
        if (PF) ctpu_mxu_pf_step2(&pfc, pf);
        const float *bp = b + p * 2 * nr, *ap = a + p * 2 * W;
        __m512 bo[2], be[2];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            bo[v] = _mm512_loadu_ps(bp + 16 * v);
            be[v] = _mm512_loadu_ps(bp + nr + 16 * v);
        }
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            __m512 ao = _mm512_set1_ps(AR ? ar[r / 3][(r % 3) * as + 1] : ap[r]);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(ao, bo[v], acc[r][v]);
        }
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            __m512 ae = _mm512_set1_ps(AR ? ar[r / 3][(r % 3) * as] : ap[W + r]);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(ae, be[v], acc[r][v]);
        }
        if (AR) {
#pragma GCC unroll 4
            for (int j = 0; j < (FMA_MAXR + 2) / 3; j++) ar[j] += 2;
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) __asm__ volatile("" : "+v"(acc[r][v]));
    _mm_setcsr(csr);
#pragma GCC unroll 12
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
}

/* Planar A: the ctpu_mxu_kernel_fn form (c loaded when load != 0). */
#define MXU_FMA_PL(NAME, R, W, NV)                                                                       \
    static void NAME(int64_t kp, const uint32_t *a, const uint32_t *b, float *c, int64_t ldc, int load) \
    {                                                                                                    \
        mxu_fma_tile(R, W, NV, 0, 0, kp, (const float *)a, 0, (const float *)b, load ? c : NULL, ldc, c, \
                     ldc, NULL);                                                                         \
    }
/* Row-layout A: the ctpu_mxu_kernel_ar_fn form. */
#define MXU_FMA_AR(NAME, R, NV)                                                                           \
    static void NAME(int64_t kp, const uint32_t *a, int64_t as, const uint32_t *b, const float *cin,      \
                     int64_t ldin, float *c, int64_t ldc, const ctpu_mxu_pf *pf)                          \
    {                                                                                                     \
        if (pf && pf->n > 0)                                                                              \
            mxu_fma_tile(R, 0, NV, 1, 1, kp, (const float *)a, as, (const float *)b, cin, ldin, c, ldc, pf); \
        else                                                                                              \
            mxu_fma_tile(R, 0, NV, 1, 0, kp, (const float *)a, as, (const float *)b, cin, ldin, c, ldc, pf); \
    }
#define MXU_FMA_SET(T, R)                                                                                 \
    MXU_FMA_PL(mxu_fma_##T##_pl_##R, R, T##_MR, T##_NV) MXU_FMA_AR(mxu_fma_##T##_ar_##R, R, T##_NV)
#define MXU_FMA_LISTS(T)                                                                                  \
    static const ctpu_mxu_kernel_fn mxu_fma_##T##_pl[] = {                                                \
        NULL, mxu_fma_##T##_pl_1, mxu_fma_##T##_pl_2, mxu_fma_##T##_pl_3, mxu_fma_##T##_pl_4,             \
        mxu_fma_##T##_pl_5, mxu_fma_##T##_pl_6, mxu_fma_##T##_pl_7, mxu_fma_##T##_pl_8,                   \
        mxu_fma_##T##_pl_9, mxu_fma_##T##_pl_10, mxu_fma_##T##_pl_11, mxu_fma_##T##_pl_12 };   \
    static const ctpu_mxu_kernel_ar_fn mxu_fma_##T##_ar[] = {                                             \
        NULL, mxu_fma_##T##_ar_1, mxu_fma_##T##_ar_2, mxu_fma_##T##_ar_3, mxu_fma_##T##_ar_4,             \
        mxu_fma_##T##_ar_5, mxu_fma_##T##_ar_6, mxu_fma_##T##_ar_7, mxu_fma_##T##_ar_8,                   \
        mxu_fma_##T##_ar_9, mxu_fma_##T##_ar_10, mxu_fma_##T##_ar_11, mxu_fma_##T##_ar_12 };

/* W32: the 12 x 32 tile (24 accumulators, 4 B vectors per pair). */
#define W32_MR FMA_MR
#define W32_NV 2
MXU_FMA_SET(W32, 1) MXU_FMA_SET(W32, 2) MXU_FMA_SET(W32, 3) MXU_FMA_SET(W32, 4) MXU_FMA_SET(W32, 5)
MXU_FMA_SET(W32, 6) MXU_FMA_SET(W32, 7) MXU_FMA_SET(W32, 8) MXU_FMA_SET(W32, 9) MXU_FMA_SET(W32, 10)
MXU_FMA_SET(W32, 11) MXU_FMA_SET(W32, 12)
MXU_FMA_LISTS(W32)

/* 16 f32 (bits) -> bf16-valued f32 bits, exactly ctpu_mxu_round_bits. */
static inline __m512i mxu_round16(__m512i u)
{
    const __m512i one = _mm512_set1_epi32(1), c7fff = _mm512_set1_epi32(0x7fff),
                  hi = _mm512_set1_epi32((int)0xffff0000u), qb = _mm512_set1_epi32(0x00400000),
                  abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000),
                  sign = _mm512_set1_epi32((int)0x80000000u);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(lsb, c7fff)), hi);
    __m512i q = _mm512_and_si512(_mm512_or_si512(u, qb), hi);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
    __m512i h = _mm512_mask_mov_epi32(r, nan, q);
    __mmask16 tiny = _mm512_testn_epi32_mask(h, inf);
    return _mm512_mask_and_epi32(h, tiny, h, sign);
}

/* n (<= 16) elements of an f32 or bf16 row, as f32 bits, not rounded. */
static inline __m512i mxu_load16_raw(const void *src, int dt, int64_t off, int n)
{
    __mmask16 m = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
    if (dt == CTPU_KDT_F32) return _mm512_maskz_loadu_epi32(m, (const uint32_t *)src + off);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)src + off);
    return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}

/* Lanes where vcvtne2ps2bf16 and ctpu_f32_to_bf16 may differ: NaN (payload
 * kept vs truncated) and nonzero subnormals (DAZ vs rounding, which can
 * reach 2^-126). Elsewhere both round to nearest even, overflow to Inf. */
static inline __mmask16 mxu_special16(__m512i u)
{
    return _mm512_fpclass_ps_mask(_mm512_castsi512_ps(u), 0xa1);   /* QNaN | denormal | SNaN */
}

/* Any of 32 bf16 (words) a NaN or a nonzero subnormal (mxu_special16 of
 * their f32 widening)? Elsewhere a bf16 is its own rounding, so its raw bits
 * are the packed ones. */
static inline int mxu_special32_bf16(__m512i w)
{
    __m512i t = _mm512_and_si512(w, _mm512_set1_epi16(0x7fff));
    return (_mm512_cmpgt_epu16_mask(t, _mm512_set1_epi16(0x7f80)) |
            (_mm512_cmplt_epu16_mask(t, _mm512_set1_epi16(0x0080)) & _mm512_test_epi16_mask(t, t))) != 0;
}

/* Raw x0 = X[2j], x1 = X[2j+1] (lanes j) -> 16 pair dwords (low half x0). */
static inline __m512i mxu_pairs_lanes(__m512i x0, __m512i x1)
{
    if (mxu_special16(x0) | mxu_special16(x1))
        return _mm512_or_si512(_mm512_srli_epi32(mxu_round16(x0), 16), mxu_round16(x1));
    const __m512i il = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                        23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512i h = (__m512i)_mm512_cvtne2ps_pbh(_mm512_castsi512_ps(x1), _mm512_castsi512_ps(x0));
    return _mm512_permutexvar_epi16(il, h);
}

/* Raw 32 consecutive elements (x0: 0..15, x1: 16..31) -> 16 pair dwords. */
static inline __m512i mxu_pairs_row(__m512i x0, __m512i x1)
{
    if (mxu_special16(x0) | mxu_special16(x1)) {
        const __m512i hiw = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
                                             31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
        return _mm512_permutex2var_epi16(mxu_round16(x0), hiw, mxu_round16(x1));
    }
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_castsi512_ps(x1), _mm512_castsi512_ps(x0));
}

/* n (<= 16) elements of an f32 or bf16 row, rounded, as f32 bits. */
static inline __m512i mxu_load16(const void *src, int dt, int64_t off, int n)
{
    __mmask16 m = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
    __m512i u;
    if (dt == CTPU_KDT_F32) {
        u = _mm512_maskz_loadu_epi32(m, (const uint32_t *)src + off);
    } else {
        __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)src + off);
        u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
    }
    return mxu_round16(u);
}

/* mxu_load16, cheaper where no lane is special (NaN, nonzero subnormal:
 * mxu_special16): there round16 is the plain round-to-nearest-even add
 * (a normal, zero or Inf input never rounds into the tiny range, and an
 * overflow carries into Inf by itself). Same bits as mxu_load16. */
static inline __m512i mxu_round16_fast(__m512i u)
{
    if (mxu_special16(u)) return mxu_round16(u);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb),
                            _mm512_set1_epi32((int)0xffff0000u));
}
static inline __m512i mxu_load16_fast(const void *src, int dt, int64_t off, int n)
{
    return mxu_round16_fast(mxu_load16_raw(src, dt, off, n));
}

/* Rows 0..R-1 of the 12 x 32 FMA tile with B read where it is (an f32
 * [K,N] operand with unit stride along n, row stride bsk; `b` at the
 * tile's first column and the chunk's first k row) and rounded in
 * registers: no packed copy, for a B that one M panel alone reads. ncols
 * (1..32) columns are loaded, the others are zeros; kodd: the chunk's last
 * pair has no odd row (K odd), its odd B element is +0. A planar (W =
 * FMA_MR). Same steps, same order as mxu_fma_tile. */
static inline __attribute__((always_inline)) void mxu_fma_tile_bd(int R, int64_t kp, const float *a, const float *b,
                                                                  int64_t bsk, int ncols, int kodd, float *c,
                                                                  int64_t ldc, int load)
{
    __mmask16 m0 = (__mmask16)(ncols >= 16 ? 0xffff : (1u << ncols) - 1);
    __mmask16 m1 = (__mmask16)(ncols >= 32 ? 0xffff : ncols <= 16 ? 0 : (1u << (ncols - 16)) - 1);
    unsigned csr = _mm_getcsr();
    _mm_setcsr((csr & ~0x6000u) | 0x8040u);        /* FTZ | DAZ, round to nearest */
    __m512 acc[FMA_MR][2];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        acc[r][0] = load ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
        acc[r][1] = load ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) __asm__ volatile("" : "+v"(acc[r][0]), "+v"(acc[r][1]));
    int64_t kfull = kp - (kodd ? 1 : 0);
    for (int64_t p = 0; p < kp; p++) {
        const float *b0 = b + 2 * p * bsk, *b1 = b0 + bsk, *ap = a + p * 2 * FMA_MR;
        __m512 be0 = _mm512_castsi512_ps(mxu_round16_fast(_mm512_maskz_loadu_epi32(m0, b0)));
        __m512 be1 = _mm512_castsi512_ps(mxu_round16_fast(_mm512_maskz_loadu_epi32(m1, b0 + 16)));
        __m512 bo0 = _mm512_setzero_ps(), bo1 = _mm512_setzero_ps();
        if (p < kfull) {
            bo0 = _mm512_castsi512_ps(mxu_round16_fast(_mm512_maskz_loadu_epi32(m0, b1)));
            bo1 = _mm512_castsi512_ps(mxu_round16_fast(_mm512_maskz_loadu_epi32(m1, b1 + 16)));
        }
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            __m512 ao = _mm512_set1_ps(ap[r]);
            acc[r][0] = _mm512_fmadd_ps(ao, bo0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(ao, bo1, acc[r][1]);
        }
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            __m512 ae = _mm512_set1_ps(ap[FMA_MR + r]);
            acc[r][0] = _mm512_fmadd_ps(ae, be0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(ae, be1, acc[r][1]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) __asm__ volatile("" : "+v"(acc[r][0]), "+v"(acc[r][1]));
    _mm_setcsr(csr);
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(c + r * ldc, acc[r][0]);
        _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
    }
}
#define MXU_FMA_BD(R)                                                                                     \
    static void mxu_fma_bd_##R(int64_t kp, const uint32_t *a, const float *b, int64_t bsk, int ncols,      \
                               int kodd, float *c, int64_t ldc, int load)                                 \
    {                                                                                                     \
        mxu_fma_tile_bd(R, kp, (const float *)a, b, bsk, ncols, kodd, c, ldc, load);                      \
    }
MXU_FMA_BD(1) MXU_FMA_BD(2) MXU_FMA_BD(3) MXU_FMA_BD(4) MXU_FMA_BD(5) MXU_FMA_BD(6) MXU_FMA_BD(7)
MXU_FMA_BD(8) MXU_FMA_BD(9) MXU_FMA_BD(10) MXU_FMA_BD(11) MXU_FMA_BD(12)
static const ctpu_mxu_kernel_bd_fn mxu_fma_bd[FMA_MR + 1] = {
    NULL, mxu_fma_bd_1, mxu_fma_bd_2, mxu_fma_bd_3, mxu_fma_bd_4, mxu_fma_bd_5, mxu_fma_bd_6,
    mxu_fma_bd_7, mxu_fma_bd_8, mxu_fma_bd_9, mxu_fma_bd_10, mxu_fma_bd_11, mxu_fma_bd_12,
};

static inline void mxu_transpose16(const __m512i r[16], __m512i t[16]);

/* Planar packing (mxu.h). Default precision with unit stride along k (A
 * row-major, B transposed) or along i (B row-major, A transposed) take
 * vector paths; the rest, the generic one. */
static void mxu_pack_avx512_planar(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1)
{
    int64_t kh = ctpu_mxu_kh(pa->K), K = pa->K, si = pa->si, sk = pa->sk;
    int w = pa->w;
    int64_t pd = 2 * kh * w;
    int fast = pa->npass == 1 && pa->parts[0] == 0 && (pa->dt == CTPU_KDT_F32 || pa->dt == CTPU_KDT_BF16);
    if (!fast || (si != 1 && sk != 1)) { ctpu_mxu_pack_planar(pa, q0, q1); return; }
    if (si == 1 && !(sk == 1 && w < 16)) {
        /* k-rows contiguous over i: vectors along i, in blocks of 16 pairs
         * (32 source rows) across the panels, so that each source row is
         * read left to right (a panel's column of the rows, taken down all
         * K at once, would touch 2 lines per row: no stream to prefetch) */
        for (int64_t pb = 0; pb < kh; pb += 16) {
            int64_t pe = kh - pb < 16 ? kh : pb + 16;
            for (int64_t q = q0; q < q1; q++) {
                uint32_t *d = pa->dst + q * pd;
                int64_t i0 = q * w, n = pa->I - i0 < w ? pa->I - i0 : w;
                int64_t p = pb;
                if (n == w && w % 16 == 0 && pa->dt == CTPU_KDT_F32) {   /* whole vectors */
                    int nxt = pa->pf && i0 + 2 * w <= pa->I;
                    const uint32_t *x = (const uint32_t *)pa->src + i0;
                    int64_t pf = pe < K / 2 ? pe : K / 2;
                    for (; p < pf; p++) {
                        uint32_t *od = d + p * 2 * w, *ev = od + w;
                        const uint32_t *x0 = x + 2 * p * sk, *x1 = x0 + sk;
                        for (int r = 0; r < w; r += 16) {
                            if (nxt) {   /* the next panel's same rows: what this packs next */
                                _mm_prefetch((const char *)(x0 + w + r), _MM_HINT_T0);
                                _mm_prefetch((const char *)(x1 + w + r), _MM_HINT_T0);
                            }
                            _mm512_storeu_si512(ev + r, mxu_round16_fast(_mm512_loadu_si512(x0 + r)));
                            _mm512_storeu_si512(od + r, mxu_round16_fast(_mm512_loadu_si512(x1 + r)));
                        }
                    }
                }
                for (; p < pe; p++) {
                    uint32_t *od = d + p * 2 * w, *ev = od + w;
                    int has1 = 2 * p + 1 < K;
                    for (int r = 0; r < w; r += 16) {
                        int cnt = n - r < 0 ? 0 : n - r > 16 ? 16 : (int)(n - r);
                        int wc = w - r < 16 ? w - r : 16;
                        __mmask16 ms = (__mmask16)(wc >= 16 ? 0xffff : (1u << wc) - 1);
                        __m512i e = mxu_load16_fast(pa->src, pa->dt, 2 * p * sk + i0 + r, cnt);
                        __m512i o = has1 ? mxu_load16_fast(pa->src, pa->dt, (2 * p + 1) * sk + i0 + r, cnt)
                                         : _mm512_setzero_si512();
                        _mm512_mask_storeu_epi32(ev + r, ms, e);
                        _mm512_mask_storeu_epi32(od + r, ms, o);
                    }
                }
            }
        }
        return;
    }
    for (int64_t q = q0; q < q1; q++) {
        uint32_t *d = pa->dst + q * pd;
        int64_t i0 = q * w, n = pa->I - i0 < w ? pa->I - i0 : w;
        /* each i's k contiguous: 16 rows x 16 k rounded, transposed by
         * 16 x 16 dword blocks, each column k stored as the odd (k odd) or
         * even row of its pair; rows past I load as zeros, and so do k past
         * K (an odd K's zero partner) */
        for (int r0 = 0; r0 < w; r0 += 16) {
            int wc = w - r0 < 16 ? w - r0 : 16;
            __mmask16 ms = (__mmask16)(wc >= 16 ? 0xffff : (1u << wc) - 1);
            for (int64_t k0 = 0; k0 < K; k0 += 16) {
                int cnt = K - k0 < 16 ? (int)(K - k0) : 16;
                __m512i v[16], t[16];
                for (int rr = 0; rr < 16; rr++) {
                    /* the next panel's row, same k: what this packs next (in
                     * a batch, rows of memory the hardware does not stream) */
                    if (pa->pf && i0 + w + r0 + rr < pa->I && r0 + rr < w)
                        _mm_prefetch((const char *)pa->src + ((i0 + w + r0 + rr) * si + k0) * (int64_t)ctpu_kdt_size(pa->dt),
                                     _MM_HINT_T0);
                    v[rr] = r0 + rr < n ? mxu_load16_fast(pa->src, pa->dt, (i0 + r0 + rr) * si + k0, cnt)
                                        : _mm512_setzero_si512();
                }
                mxu_transpose16(v, t);
                uint32_t *o = d + (k0 / 2) * 2 * w + r0;
                int nj = 2 * ((cnt + 1) / 2);
                for (int j = 0; j < nj; j++)
                    _mm512_mask_storeu_epi32(o + (j / 2) * 2 * w + (j & 1 ? 0 : w), ms, t[j]);
            }
        }
    }
}

/* t[j] = column j of the 16 x 16 dword matrix whose rows are r[0..15]. */
static inline void mxu_transpose16(const __m512i r[16], __m512i t[16])
{
    __m512i a[16], u[16];
    for (int i = 0; i < 8; i++) {                 /* per 128-bit lane: 2x2 of dwords */
        a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {                 /* u[4i+c] lane L: rows 4i..4i+3 of column 4L+c */
        u[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    for (int c = 0; c < 4; c++) {                /* 4 x 4 of 128-bit lanes */
        __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
        __m512i y0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44),
                y1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
        t[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
        t[4 + c] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
        t[8 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
    }
}

/* Pair-dword packing (mxu.h) for the vdpbf16ps kernel. Default precision
 * with unit stride along i (B row-major, A transposed: the two k rows of a
 * pair are interleaved lane by lane) or along k (A row-major, B transposed:
 * 32 k of one row become 16 pair dwords by one word permute, then spread
 * over the panel); the rest, the generic one. */
static void mxu_pack_avx512_dp(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1)
{
    int64_t kh = ctpu_mxu_kh(pa->K), K = pa->K, si = pa->si, sk = pa->sk;
    int w = pa->w;
    int64_t pd = kh * w;
    int fast = pa->npass == 1 && pa->parts[0] == 0 && (pa->dt == CTPU_KDT_F32 || pa->dt == CTPU_KDT_BF16);
    if (!fast || (si != 1 && sk != 1)) { ctpu_mxu_pack_generic(pa, q0, q1); return; }
    if (si == 1 && !(sk == 1 && w < 16)) {
        /* blocks of 16 pairs (32 source rows, read left to right) across the
         * panels: a panel's column of 64 bytes per row, taken down all K at
         * once, would miss the cache on every row */
        for (int64_t pb = 0; pb < kh; pb += 16) {
            int64_t pe = kh - pb < 16 ? kh : pb + 16;
            int64_t pf = pe < K / 2 ? pe : K / 2;          /* pairs [pb, pf) have both rows */
            for (int64_t q = q0; q < q1; q++) {
                uint32_t *d = pa->dst + q * pd;
                int64_t i0 = q * w, n = pa->I - i0 < w ? pa->I - i0 : w;
                for (int r = 0; r < w; r += 16) {
                    int cnt = n - r < 0 ? 0 : n - r > 16 ? 16 : (int)(n - r);
                    int wc = w - r < 16 ? w - r : 16;
                    __mmask16 ms = (__mmask16)(wc >= 16 ? 0xffff : (1u << wc) - 1);
                    /* 16 lanes in bounds: plain loads (lanes past the panel,
                     * if any, are not stored); a full panel row: plain stores */
                    int64_t p = pb;
                    if (i0 + r + 16 <= pa->I) {
                        const char *x = (const char *)pa->src + (2 * pb * sk + i0 + r) * (int64_t)ctpu_kdt_size(pa->dt);
                        int64_t step = 2 * sk * (int64_t)ctpu_kdt_size(pa->dt), rs = step / 2;
                        for (; p < pf; p++, x += step) {
                            __m512i e, od;
                            __m512i v;
                            if (pa->dt == CTPU_KDT_F32) {
                                e = _mm512_loadu_si512(x);
                                od = _mm512_loadu_si512(x + rs);
                                v = mxu_pairs_lanes(e, od);
                            } else {
                                __m256i he = _mm256_loadu_si256((const __m256i *)x),
                                        ho = _mm256_loadu_si256((const __m256i *)(x + rs));
                                e = _mm512_cvtepu16_epi32(he);
                                od = _mm512_cvtepu16_epi32(ho);
                                if (!mxu_special32_bf16(_mm512_inserti64x4(_mm512_castsi256_si512(he), ho, 1)))
                                    v = _mm512_or_si512(e, _mm512_slli_epi32(od, 16));   /* raw bits, interleaved */
                                else
                                    v = mxu_pairs_lanes(_mm512_slli_epi32(e, 16), _mm512_slli_epi32(od, 16));
                            }
                            if (wc == 16) _mm512_storeu_si512(d + p * w + r, v);
                            else _mm512_mask_storeu_epi32(d + p * w + r, ms, v);
                        }
                    }
                    for (; p < pe; p++) {
                        __m512i e = mxu_load16_raw(pa->src, pa->dt, 2 * p * sk + i0 + r, cnt);
                        __m512i od = 2 * p + 1 < K
                            ? mxu_load16_raw(pa->src, pa->dt, (2 * p + 1) * sk + i0 + r, cnt)
                            : _mm512_setzero_si512();
                        _mm512_mask_storeu_epi32(d + p * w + r, ms, mxu_pairs_lanes(e, od));
                    }
                }
            }
        }
        return;
    }
    for (int64_t q = q0; q < q1; q++) {
        uint32_t *d = pa->dst + q * pd;
        int64_t i0 = q * w, n = pa->I - i0 < w ? pa->I - i0 : w;
        /* 16 rows x 32 k -> 16 rows of 16 pair dwords -> transposed to 16
         * pairs of 16 rows, stored as the panel's consecutive W-dword rows */
        for (int64_t k0 = 0; k0 < K; k0 += 32) {
            int cnt = K - k0 < 32 ? (int)(K - k0) : 32;
            int np = (cnt + 1) / 2;
            uint32_t *o = d + (k0 / 2) * w;
            for (int r0 = 0; r0 < w; r0 += 16) {
                __m512i v[16], t[16];
                for (int rr = 0; rr < 16; rr++) {
                    int64_t r = r0 + rr;
                    if (r >= n || r >= w) { v[rr] = _mm512_setzero_si512(); continue; }
                    int64_t off = (i0 + r) * si + k0;
                    __m512i x0 = mxu_load16_raw(pa->src, pa->dt, off, cnt < 16 ? cnt : 16);
                    __m512i x1 = cnt > 16 ? mxu_load16_raw(pa->src, pa->dt, off + 16, cnt - 16)
                                          : _mm512_setzero_si512();
                    v[rr] = mxu_pairs_row(x0, x1);            /* odd partner past K: 0 */
                }
                mxu_transpose16(v, t);
                int wc = w - r0 < 16 ? w - r0 : 16;
                __mmask16 ms = (__mmask16)(wc >= 16 ? 0xffff : (1u << wc) - 1);
                for (int j = 0; j < np; j++) _mm512_mask_storeu_epi32(o + j * w + r0, ms, t[j]);
            }
        }
    }
}

/* d[j * ldd + i] = s[i * ld + j] (i < rows, j < cols) by 16 x 16 dword
 * transposes: rows past `rows` load as zeros and are not stored. */
static void mxu_transpose_avx512(const float *s, int64_t ld, int64_t rows, int64_t cols, float *d, int64_t ldd)
{
    for (int64_t i0 = 0; i0 < rows; i0 += 16) {
        int ni = rows - i0 < 16 ? (int)(rows - i0) : 16;
        __mmask16 mi = (__mmask16)(ni >= 16 ? 0xffff : (1u << ni) - 1);
        for (int64_t j0 = 0; j0 < cols; j0 += 16) {
            int nj = cols - j0 < 16 ? (int)(cols - j0) : 16;
            __mmask16 mj = (__mmask16)(nj >= 16 ? 0xffff : (1u << nj) - 1);
            __m512i v[16], t[16];
            for (int r = 0; r < 16; r++)
                v[r] = r < ni ? _mm512_maskz_loadu_epi32(mj, s + (i0 + r) * ld + j0) : _mm512_setzero_si512();
            mxu_transpose16(v, t);
            for (int c = 0; c < nj; c++) _mm512_mask_storeu_epi32(d + (j0 + c) * ldd + i0, mi, t[c]);
        }
    }
}

/* Row-layout packing (mxu.h) of an A with unit stride along k at default
 * precision: 32 k of a row are 16 pair dwords by one conversion (the odd
 * partner past K loads as 0); rows past I are zeros. */
static void mxu_pack_avx512_dp_ar(const ctpu_mxu_pack_args *pa, int64_t rs, int64_t q0, int64_t q1)
{
    int64_t K = pa->K, kh = ctpu_mxu_kh(K), si = pa->si;
    int w = pa->w;
    for (int64_t q = q0; q < q1; q++) {
        uint32_t *d = pa->dst + q * w * rs;
        for (int r = 0; r < w; r++) {
            uint32_t *o = d + r * rs;
            int64_t i = q * w + r;
            if (i >= pa->I) {
                for (int64_t p = 0; p < kh; p += 16) {
                    int np = kh - p < 16 ? (int)(kh - p) : 16;
                    _mm512_mask_storeu_epi32(o + p, (__mmask16)((1u << np) - 1), _mm512_setzero_si512());
                }
                continue;
            }
            int64_t off = i * si, k0 = 0;
            if (pa->dt == CTPU_KDT_F32) {
                const float *x = (const float *)pa->src + off;
                for (; k0 + 32 <= K; k0 += 32) {
                    __m512i x0 = _mm512_loadu_si512(x + k0), x1 = _mm512_loadu_si512(x + k0 + 16);
                    _mm512_storeu_si512(o + k0 / 2, mxu_pairs_row(x0, x1));
                }
            } else {   /* 32 bf16 are 16 pair dwords as they are, unless one is special */
                const uint16_t *x = (const uint16_t *)pa->src + off;
                for (; k0 + 32 <= K; k0 += 32) {
                    __m512i w = _mm512_loadu_si512(x + k0);
                    if (!mxu_special32_bf16(w)) {
                        _mm512_storeu_si512(o + k0 / 2, w);
                        continue;
                    }
                    __m512i x0 = mxu_load16_raw(pa->src, pa->dt, off + k0, 16),
                            x1 = mxu_load16_raw(pa->src, pa->dt, off + k0 + 16, 16);
                    _mm512_storeu_si512(o + k0 / 2, mxu_pairs_row(x0, x1));
                }
            }
            for (; k0 < K; k0 += 32) {
                int cnt = K - k0 < 32 ? (int)(K - k0) : 32, np = (cnt + 1) / 2;
                __m512i x0 = mxu_load16_raw(pa->src, pa->dt, off + k0, cnt < 16 ? cnt : 16);
                __m512i x1 = cnt > 16 ? mxu_load16_raw(pa->src, pa->dt, off + k0 + 16, cnt - 16)
                                      : _mm512_setzero_si512();
                _mm512_mask_storeu_epi32(o + k0 / 2, (__mmask16)(np >= 16 ? 0xffff : (1u << np) - 1),
                                         mxu_pairs_row(x0, x1));
            }
        }
    }
}

/* Row-layout packing for the FMA kernels (planar impls): row r of a panel is
 * the row's K elements rounded (bf16-valued f32), in order, then a +0 when
 * K is odd (the odd partner); rows past I are zeros. No transpose. */
static void mxu_pack_avx512_fma_ar(const ctpu_mxu_pack_args *pa, int64_t rs, int64_t q0, int64_t q1)
{
    int64_t K = pa->K, k2 = 2 * ctpu_mxu_kh(K), si = pa->si;
    int w = pa->w;
    for (int64_t q = q0; q < q1; q++) {
        uint32_t *d = pa->dst + q * w * rs;
        for (int r = 0; r < w; r++) {
            uint32_t *o = d + r * rs;
            int64_t i = q * w + r, k0 = 0;
            if (i >= pa->I) {
                for (; k0 < k2; k0 += 16) {
                    int n = k2 - k0 < 16 ? (int)(k2 - k0) : 16;
                    _mm512_mask_storeu_epi32(o + k0, (__mmask16)((1u << n) - 1), _mm512_setzero_si512());
                }
                continue;
            }
            int64_t off = i * si;
            for (; k0 + 16 <= K; k0 += 16) _mm512_storeu_si512(o + k0, mxu_load16_fast(pa->src, pa->dt, off + k0, 16));
            if (k0 < k2) {   /* the tail, its zero partner included */
                int n = (int)(k2 - k0), cnt = (int)(K - k0);
                _mm512_mask_storeu_epi32(o + k0, (__mmask16)((1u << n) - 1),
                                         mxu_load16_fast(pa->src, pa->dt, off + k0, cnt));
            }
        }
    }
}

const ctpu_mxu_impl ctpu_mxu_impl_avx512 = {
    .name = "avx512", .mr = FMA_MR, .nr = NR, .planar = 1, .kernel = mxu_fma_W32_pl_12,
    .kernel_rows = mxu_fma_W32_pl, .pack = mxu_pack_avx512_planar, .transpose = mxu_transpose_avx512,
    .kernel_ar = mxu_fma_W32_ar, .pack_ar = mxu_pack_avx512_fma_ar, .kernel_bd = mxu_fma_bd,
};
const ctpu_mxu_impl ctpu_mxu_impl_avx512_dp = {
    .name = "avx512_dp", .mr = DP_MR, .nr = NR, .planar = 0, .kernel = mxu_kernel_avx512_dp_14,
    .kernel_rows = mxu_dp_kernel_rows, .pack = mxu_pack_avx512_dp, .transpose = mxu_transpose_avx512,
    .kernel_ar = mxu_dp_kernel_ar, .pack_ar = mxu_pack_avx512_dp_ar,
};
