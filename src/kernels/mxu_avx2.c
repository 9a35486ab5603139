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
    uintptr_t prow = PF ? (uintptr_t)pf->base : 0, pline = prow & ~(uintptr_t)63;
    int pcol = 0, pleft = PF ? pf->n : 0;
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
        if (PF && pleft > 0) {
#pragma GCC unroll 2
            for (int u = 0; u < 2; u++) {
                _mm_prefetch((const char *)pline, _MM_HINT_T0);
                pline += 64;
                if (++pcol == pf->lpr) {
                    pcol = 0;
                    prow += (uintptr_t)pf->stride;
                    pline = prow & ~(uintptr_t)63;
                }
            }
            pleft -= 2;
        }
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

/* Planar packing (mxu.h): the shared packer (its default-precision fast
 * paths vectorise here). */
static void mxu_pack_avx2_planar(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1)
{
    ctpu_mxu_pack_planar(pa, q0, q1);
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
