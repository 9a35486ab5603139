/* The random kernels for AVX-512 (16 lanes): simd_random.h over these
 * primitives; the same bits as random.c's references. */
#include <immintrin.h>
#include <sleef.h>
#include <string.h>
#include "internal.h"

typedef __m512i VI;
typedef __m512 VF;
#define RW 16
#define RAND_NAME(x) ctpu_k_rand_avx512_##x

static inline VI vi1(uint32_t u) { return _mm512_set1_epi32((int)u); }
static inline VI vi_add(VI a, VI b) { return _mm512_add_epi32(a, b); }
static inline VI vi_xor(VI a, VI b) { return _mm512_xor_si512(a, b); }
static inline VI vi_xor3(VI a, VI b, VI c) { return _mm512_ternarylogic_epi32(a, b, c, 0x96); }
#define vi_srl(a, s) _mm512_srli_epi32((a), (s))
static inline VI vi_iota(uint32_t base)
{
    return _mm512_add_epi32(vi1(base), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}
static inline VI vi_iota64(uint32_t base, int k)
{
    return _mm512_add_epi64(_mm512_set1_epi64((long long)base), _mm512_setr_epi64(k, k + 1, k + 2, k + 3, k + 4,
                                                                                   k + 5, k + 6, k + 7));
}
static inline VI vi_mul64(VI a, VI m) { return _mm512_mul_epu32(a, m); }
static inline VI vi_hi64(VI a) { return _mm512_shuffle_epi32(a, _MM_PERM_CDAB); }
static inline VI vi_pack_lo(VI a, VI b)
{
    return _mm512_permutex2var_epi32(a, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), b);
}
static inline VF vf1(float f) { return _mm512_set1_ps(f); }
static inline VF vf_mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
static inline VF vf_add(VF a, VF b) { return _mm512_add_ps(a, b); }
static inline VF vf_sqrt(VF a) { return _mm512_sqrt_ps(a); }
static inline VF vf_cvt(VI a) { return _mm512_cvtepi32_ps(a); }
static inline void vf_st(float *p, VF v) { _mm512_storeu_ps(p, v); }
#define VLOG Sleef_logf16_u10avx512fnofma
#define VCOS Sleef_cosf16_u10avx512fnofma

#include "simd_random.h"

const ctpu_k_rand_variant ctpu_k_rand_avx512 = { ctpu_k_rand_avx512_uniform, ctpu_k_rand_avx512_normal,
                                              ctpu_k_rand_avx512_domain_mismatches };
