/* MXU matmul, AVX-512 + AVX512_BF16: vdpbf16ps is the reference step itself
 * (odd pair element first, exact products, RNE, DAZ/FTZ; see mxu.h), so the
 * micro-kernel is a register-blocked loop of it.
 * Micro-tile: 14 rows x 32 columns = 28 zmm accumulators; per K pair, two
 * B vectors (32 columns of bf16 pairs) and 14 A pair broadcasts. */
#include <immintrin.h>
#include "mxu.h"

#define MR 14
#define NR 32

static void mxu_kernel_avx512(int64_t kp, const uint32_t *a, const uint32_t *b, float *c,
                              int64_t ldc, int load)
{
    __m512 acc[MR][2];
    if (load) {
#pragma GCC unroll 14
        for (int r = 0; r < MR; r++) {
            acc[r][0] = _mm512_loadu_ps(c + r * ldc);
            acc[r][1] = _mm512_loadu_ps(c + r * ldc + 16);
        }
    } else {
#pragma GCC unroll 14
        for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < kp; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * NR);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * NR + 16);
        const uint32_t *ap = a + p * MR;
#pragma GCC unroll 14
        for (int r = 0; r < MR; r++) {
            __m512bh av = (__m512bh)_mm512_set1_epi32((int)ap[r]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
        }
    }
#pragma GCC unroll 14
    for (int r = 0; r < MR; r++) {
        _mm512_storeu_ps(c + r * ldc, acc[r][0]);
        _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
    }
}

static void mxu_pack_avx512(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1)
{
    ctpu_mxu_pack_generic(pa, q0, q1);
}

const ctpu_mxu_impl ctpu_mxu_impl_avx512 = {
    .name = "avx512", .mr = MR, .nr = NR, .kernel = mxu_kernel_avx512,
    .kernel_narrow = NULL, .nr_narrow = 0, .pack = mxu_pack_avx512,
};
