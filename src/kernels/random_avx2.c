/* The random kernels for AVX2 (8 lanes): simd_random.h over these
 * primitives; the same bits as random.c's references. */
#include <immintrin.h>
#include <sleef.h>
#include <string.h>
#include "internal.h"

typedef __m256i VI;
typedef __m256 VF;
#define RW 8
#define RAND_NAME(x) ctpu_k_rand_avx2_##x

static inline VI vi1(uint32_t u) { return _mm256_set1_epi32((int)u); }
static inline VI vi_add(VI a, VI b) { return _mm256_add_epi32(a, b); }
static inline VI vi_xor(VI a, VI b) { return _mm256_xor_si256(a, b); }
static inline VI vi_xor3(VI a, VI b, VI c) { return _mm256_xor_si256(_mm256_xor_si256(a, b), c); }
#define vi_srl(a, s) _mm256_srli_epi32((a), (s))
static inline VI vi_iota(uint32_t base) { return _mm256_add_epi32(vi1(base), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
static inline VI vi_iota64(uint32_t base, int k)
{
    return _mm256_add_epi64(_mm256_set1_epi64x((long long)base), _mm256_setr_epi64x(k, k + 1, k + 2, k + 3));
}
static inline VI vi_mul64(VI a, VI m) { return _mm256_mul_epu32(a, m); }
static inline VI vi_hi64(VI a) { return _mm256_shuffle_epi32(a, 0xB1); }
static inline VI vi_pack_lo(VI a, VI b)
{
    const VI idx = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    return _mm256_permute2x128_si256(_mm256_permutevar8x32_epi32(a, idx), _mm256_permutevar8x32_epi32(b, idx), 0x20);
}
static inline VF vf1(float f) { return _mm256_set1_ps(f); }
static inline VF vf_mul(VF a, VF b) { return _mm256_mul_ps(a, b); }
static inline VF vf_add(VF a, VF b) { return _mm256_add_ps(a, b); }
static inline VF vf_sqrt(VF a) { return _mm256_sqrt_ps(a); }
static inline VF vf_cvt(VI a) { return _mm256_cvtepi32_ps(a); }
static inline void vf_st(float *p, VF v) { _mm256_storeu_ps(p, v); }
#define VLOG Sleef_logf8_u10avx
#define VCOS Sleef_cosf8_u10avx

#include "simd_random.h"

const ctpu_k_rand_variant ctpu_k_rand_avx2 = { ctpu_k_rand_avx2_uniform, ctpu_k_rand_avx2_normal,
                                              ctpu_k_rand_avx2_domain_mismatches };
