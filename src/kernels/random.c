/* Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw,
 * "Parallel random numbers: as easy as 1, 2, 3", SC'11; constants and round
 * structure as in Random123's philox.h). Element i of a draw depends only on
 * (seed, offset, i), so any block, thread or fusion split gives the same bits. */
#include <math.h>
#include <sleef.h>
#include "internal.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u   /* golden ratio */
#define PHILOX_W1 0xBB67AE85u   /* sqrt(3) - 1 */

void ctpu_k_philox4x32_raw(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) { k0 += PHILOX_W0; k1 += PHILOX_W1; }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

void ctpu_k_philox4x32(uint64_t seed, uint64_t counter, uint32_t out[4])
{
    const uint32_t ctr[4] = { (uint32_t)counter, (uint32_t)(counter >> 32), 0, 0 };
    const uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
    ctpu_k_philox4x32_raw(ctr, key, out);
}

#define TWO_M24 (1.0f / 16777216.0f)

/* y[j] = element start + j, j < n. */
void ctpu_k_rand_uniform_ref(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float lo,
                             float hi, float *y)
{
    float range = hi - lo;
    for (int64_t j = 0; j < n; j++) {
        uint32_t w[4];
        ctpu_k_philox4x32(seed, offset + (uint64_t)start + (uint64_t)j, w);
        float u = (float)(w[0] >> 8) * TWO_M24;              /* exact, in [0,1) */
        y[j] = lo + range * u;
    }
}

void ctpu_k_rand_normal_ref(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float mean,
                            float std, float *y)
{
    const float two_pi = 6.28318530717958647692f;
    for (int64_t j = 0; j < n; j++) {
        uint32_t w[4];
        ctpu_k_philox4x32(seed, offset + (uint64_t)start + (uint64_t)j, w);
        float u1 = (float)((w[0] >> 8) + 1u) * TWO_M24;      /* exact, in (0,1] */
        float u2 = (float)(w[1] >> 8) * TWO_M24;             /* exact, in [0,1) */
        float r = sqrtf(-2.0f * Sleef_logf1_u10purec(u1));
        float z = r * Sleef_cosf1_u10purec(two_pi * u2);
        y[j] = mean + std * z;
    }
}

/* ---- variants: the reference, AVX2 and AVX-512 (random_avx2.c, random_avx512.c) */
const ctpu_k_rand_variant ctpu_k_rand_scalar = { ctpu_k_rand_uniform_ref, ctpu_k_rand_normal_ref, NULL };

static const ctpu_k_rand_variant *const rand_variants[CTPU_ISA_COUNT] = {
    [CTPU_ISA_SCALAR] = &ctpu_k_rand_scalar,
#define X(E, s) [CTPU_ISA_##E] = &ctpu_k_rand_##s,
    CTPU_K_SIMD_ISAS(X)
#undef X
};
static const ctpu_k_rand_variant *rand_cur = &ctpu_k_rand_scalar;

const ctpu_k_rand_variant *ctpu_k_rand_variant_of(ctpu_isa isa)
{
    return (unsigned)isa < CTPU_ISA_COUNT ? rand_variants[isa] : NULL;
}
void ctpu_k_rand_select(ctpu_isa isa)
{
    if ((unsigned)isa < CTPU_ISA_COUNT) rand_cur = rand_variants[isa];
}

void ctpu_k_rand_uniform(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float lo, float hi, float *y)
{
    rand_cur->uniform(seed, offset, start, n, lo, hi, y);
}
void ctpu_k_rand_normal(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float mean, float std, float *y)
{
    rand_cur->normal(seed, offset, start, n, mean, std, y);
}

/* y[j] = low + (w0 | w1 << 32) mod range for element start + j (torch's
 * random_from_to takes 64 random bits for a range of 2^32 or more, 32 below:
 * here always 64, so the modulo bias is below range / 2^64). */
void ctpu_k_rand_int(uint64_t seed, uint64_t offset, int64_t start, int64_t n, int64_t low,
                     uint64_t range, int64_t *y)
{
    for (int64_t j = 0; j < n; j++) {
        uint32_t w[4];
        ctpu_k_philox4x32(seed, offset + (uint64_t)start + (uint64_t)j, w);
        uint64_t bits = (uint64_t)w[0] | (uint64_t)w[1] << 32;
        y[j] = low + (int64_t)(bits % range);
    }
}
