/* MXU matmul, AVX2 + FMA: emulates vdpbf16ps with two FMAs per K pair (odd
 * element first). bf16 x bf16 products are exact, so one FMA is exactly the
 * reference step's single rounding; the flushing is MXCSR's FTZ (tininess
 * after rounding, as the instruction) with DAZ, set for the micro-kernel's
 * duration and restored. Micro-tile 4 x 16: 8 ymm accumulators. */
#include <immintrin.h>
#include "mxu.h"

#define MR 4
#define NR 16

static void mxu_kernel_avx2(int64_t kp, const uint32_t *a, const uint32_t *b, float *c,
                            int64_t ldc, int load)
{
    unsigned csr = _mm_getcsr();
    _mm_setcsr((csr & ~0x6000u) | 0x8040u);        /* FTZ | DAZ, round to nearest */
    __m256 acc[MR][2];
    if (load) {
        for (int r = 0; r < MR; r++) {
            acc[r][0] = _mm256_loadu_ps(c + r * ldc);
            acc[r][1] = _mm256_loadu_ps(c + r * ldc + 8);
        }
    } else {
        for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    }
    /* GCC does not order FP arithmetic against ldmxcsr: pin the accumulators
     * between the two MXCSR writes. */
    for (int r = 0; r < MR; r++) __asm__ volatile("" : "+x"(acc[r][0]), "+x"(acc[r][1]));
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    for (int64_t p = 0; p < kp; p++) {
        __m256i bv0 = _mm256_loadu_si256((const __m256i *)(b + p * NR));
        __m256i bv1 = _mm256_loadu_si256((const __m256i *)(b + p * NR + 8));
        __m256 b0o = _mm256_castsi256_ps(_mm256_and_si256(bv0, hi));
        __m256 b0e = _mm256_castsi256_ps(_mm256_slli_epi32(bv0, 16));
        __m256 b1o = _mm256_castsi256_ps(_mm256_and_si256(bv1, hi));
        __m256 b1e = _mm256_castsi256_ps(_mm256_slli_epi32(bv1, 16));
        const uint32_t *ap = a + p * MR;
        for (int r = 0; r < MR; r++) {
            __m256i av = _mm256_set1_epi32((int)ap[r]);
            __m256 ao = _mm256_castsi256_ps(_mm256_and_si256(av, hi));
            __m256 ae = _mm256_castsi256_ps(_mm256_slli_epi32(av, 16));
            acc[r][0] = _mm256_fmadd_ps(ao, b0o, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(ao, b1o, acc[r][1]);
            acc[r][0] = _mm256_fmadd_ps(ae, b0e, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(ae, b1e, acc[r][1]);
        }
    }
    for (int r = 0; r < MR; r++) __asm__ volatile("" : "+x"(acc[r][0]), "+x"(acc[r][1]));
    for (int r = 0; r < MR; r++) {
        _mm256_storeu_ps(c + r * ldc, acc[r][0]);
        _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
    }
    _mm_setcsr(csr);
}

static void mxu_pack_avx2(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1)
{
    ctpu_mxu_pack_generic(pa, q0, q1);
}

const ctpu_mxu_impl ctpu_mxu_impl_avx2 = {
    .name = "avx2", .mr = MR, .nr = NR, .kernel = mxu_kernel_avx2,
    .kernel_rows = NULL, .pack = mxu_pack_avx2,
};
