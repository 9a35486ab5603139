/* MXU matmul, AVX-512. Two micro-kernels give the reference's bits:
 *
 * - FMA (the default): the step of mxu.h is exactly one FMA (bf16 x bf16
 *   products are exact in f32; one rounding) under MXCSR FTZ|DAZ (tininess
 *   after rounding, as vdpbf16ps), so a K pair is two vfmadd231ps, odd
 *   element first, on operands packed as bf16-valued f32 (planar layout).
 *   On this machine (Sapphire Rapids) vfmadd231ps zmm issues 2 per cycle and
 *   vdpbf16ps zmm 1 per 2 cycles, so this does the same MACs 2x faster.
 *   Micro-tile 12 x 32: 24 zmm accumulators, 4 B vectors per K pair, A
 *   broadcast from memory.
 * - vdpbf16ps (ctpu_mxu_impl_avx512_dp): the instruction is the step itself.
 *   Micro-tile 14 x 32 on pair-dword panels. Kept for machines where it is
 *   the faster one, and as the probe's production twin. */
#include <immintrin.h>
#include "mxu.h"

#define DP_MR 14
#define NR 32
#define FMA_MR 12

static void mxu_kernel_avx512_dp(int64_t kp, const uint32_t *a, const uint32_t *b, float *c,
                                 int64_t ldc, int load)
{
    __m512 acc[DP_MR][2];
    if (load) {
#pragma GCC unroll 14
        for (int r = 0; r < DP_MR; r++) {
            acc[r][0] = _mm512_loadu_ps(c + r * ldc);
            acc[r][1] = _mm512_loadu_ps(c + r * ldc + 16);
        }
    } else {
#pragma GCC unroll 14
        for (int r = 0; r < DP_MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < kp; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * NR + 16);
        const uint32_t *ap = a + p * DP_MR;
#pragma GCC unroll 14
        for (int r = 0; r < DP_MR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        }
    }
#pragma GCC unroll 14
    for (int r = 0; r < DP_MR; r++) {
        _mm512_storeu_ps(c + r * ldc, acc[r][0]);
        _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
    }
}

static void mxu_kernel_avx512_fma(int64_t kp, const uint32_t *a, const uint32_t *b, float *c,
                                  int64_t ldc, int load)
{
    unsigned csr = _mm_getcsr();
    _mm_setcsr((csr & ~0x6000u) | 0x8040u);        /* FTZ | DAZ, round to nearest */
    const float *af = (const float *)a, *bf = (const float *)b;
    __m512 acc[FMA_MR][2];
    if (load) {
#pragma GCC unroll 12
        for (int r = 0; r < FMA_MR; r++) {
            acc[r][0] = _mm512_loadu_ps(c + r * ldc);
            acc[r][1] = _mm512_loadu_ps(c + r * ldc + 16);
        }
    } else {
#pragma GCC unroll 12
        for (int r = 0; r < FMA_MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    }
    /* GCC does not order FP arithmetic against ldmxcsr: pin the accumulators
     * between the two MXCSR writes. */
#pragma GCC unroll 12
    for (int r = 0; r < FMA_MR; r++) __asm__ volatile("" : "+v"(acc[r][0]), "+v"(acc[r][1]));
    for (int64_t p = 0; p < kp; p++) {
        const float *bp = bf + p * 2 * NR, *ap = af + p * 2 * FMA_MR;
        __m512 bo0 = _mm512_loadu_ps(bp), bo1 = _mm512_loadu_ps(bp + 16);
        __m512 be0 = _mm512_loadu_ps(bp + NR), be1 = _mm512_loadu_ps(bp + NR + 16);
#pragma GCC unroll 12
        for (int r = 0; r < FMA_MR; r++) {
            __m512 ao = _mm512_set1_ps(ap[r]);
            acc[r][0] = _mm512_fmadd_ps(ao, bo0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(ao, bo1, acc[r][1]);
        }
#pragma GCC unroll 12
        for (int r = 0; r < FMA_MR; r++) {
            __m512 ae = _mm512_set1_ps(ap[FMA_MR + r]);
            acc[r][0] = _mm512_fmadd_ps(ae, be0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(ae, be1, acc[r][1]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < FMA_MR; r++) __asm__ volatile("" : "+v"(acc[r][0]), "+v"(acc[r][1]));
    _mm_setcsr(csr);
#pragma GCC unroll 12
    for (int r = 0; r < FMA_MR; r++) {
        _mm512_storeu_ps(c + r * ldc, acc[r][0]);
        _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
    }
}

static void mxu_pack_avx512_dp(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1)
{
    ctpu_mxu_pack_generic(pa, q0, q1);
}

static void mxu_pack_avx512_planar(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1)
{
    ctpu_mxu_pack_planar(pa, q0, q1);
}

const ctpu_mxu_impl ctpu_mxu_impl_avx512 = {
    .name = "avx512", .mr = FMA_MR, .nr = NR, .planar = 1, .kernel = mxu_kernel_avx512_fma,
    .kernel_narrow = NULL, .nr_narrow = 0, .pack = mxu_pack_avx512_planar,
};
const ctpu_mxu_impl ctpu_mxu_impl_avx512_dp = {
    .name = "avx512_dp", .mr = DP_MR, .nr = NR, .planar = 0, .kernel = mxu_kernel_avx512_dp,
    .kernel_narrow = NULL, .nr_narrow = 0, .pack = mxu_pack_avx512_dp,
};
