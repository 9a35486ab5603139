/* The random kernels' SIMD driver (kernels.h "randomness"): Philox4x32-10
 * on RW counters at once, then the uniform / normal transforms, each the
 * scalar reference's arithmetic lane by lane (integer ops exact; f32 mul,
 * add, sqrt IEEE and not contracted; logf and cosf from SLEEF's non-FMA
 * vector functions, which give the purec bits on every input these
 * kernels make: checked exhaustively by tests/test_k_elementwise.c). A
 * block whose low counter word would wrap, and the tail, go through the
 * reference. Included once per ISA after its primitives:
 *   VI, VF, RW; vi1(u), vi_add, vi_xor, vi_xor3, vi_srl(a, s) (32-bit
 *   lanes), vi_iota(base); vi_iota64(base, k) (64-bit lanes base + k + i),
 *   vi_mul64 (low halves' 64-bit products), vi_hi64 (each 64-bit lane's high half
 *   in its low half; the high half may be anything), vi_pack_lo(a, b)
 *   (the low halves of a's then b's 64-bit lanes); vf1(f), vf_mul, vf_add, vf_sqrt, vf_cvt
 *   (u32 < 2^31 to f32), vf_st(p, v); VLOG, VCOS; RAND_NAME(x). */

/* normal: vectors a step (the independent SLEEF calls back to back) */
#define RAND_NB 4

#define PHX_M0 0xD2511F53u
#define PHX_M1 0xCD9E8D57u
#define PHX_W0 0x9E3779B9u
#define PHX_W1 0xBB67AE85u

/* Words 0 and 1 of Philox4x32-10 at counters {lo + lane, hi, 0, 0}; rs:
 * the round keys (round r's key words rs[2r], rs[2r + 1]). Each word lives in the low half of a 64-bit lane
 * (RW/2 counters a register, two registers: halves a and b), so one
 * unsigned 32x32 -> 64 multiply gives both halves of a product: the high
 * one by a shift, the low one in place. The high halves of the other lanes
 * carry garbage that the multiplies never read and the final pack drops.
 * Rounds 0 and 1 are the general round with what is known: words 2 and 3
 * start at 0 (round 0 multiplies only word 0) and word 1 the same in every
 * lane (round 1's word 0 is one scalar product). */
/* PHX_MAXNB vectors of counters at most in one philox2n: 2 * nb independent
 * chains of rounds, so the multiplies' latency overlaps. */
#define PHX_MAXNB 2

static inline __attribute__((always_inline)) void RAND_NAME(philox2n)(int nb, uint32_t lo, uint32_t hi,
                                                                       const uint32_t *rs, VI *w0, VI *w1)
{
    const VI m0 = vi1(PHX_M0), m1 = vi1(PHX_M1);
    VI c0[2 * PHX_MAXNB], c1[2 * PHX_MAXNB], c2[2 * PHX_MAXNB], c3[2 * PHX_MAXNB];
    uint32_t s0 = hi ^ rs[0];                                                 /* c0; c1 = 0 */
    uint64_t p = (uint64_t)PHX_M0 * s0;                                       /* round 1's word 0 */
    const VI t = vi1((uint32_t)(p >> 32) ^ rs[3]), plo = vi1((uint32_t)p);
#pragma GCC unroll 4
    for (int q = 0; q < 2 * nb; q++) {   /* q: vector q / 2, half q % 2 */
        VI p0 = vi_mul64(vi_iota64(lo + (uint32_t)(q / 2 * RW), q % 2 * (RW / 2)), m0);   /* round 0 */
        VI x2 = vi_xor(vi_hi64(p0), vi1(rs[1]));
        VI p1 = vi_mul64(x2, m1);                                               /* round 1 */
        c0[q] = vi_xor(vi_hi64(p1), vi1(rs[2]));
        c1[q] = p1;
        c2[q] = vi_xor(p0, t);
        c3[q] = plo;
    }
#pragma GCC unroll 8
    for (int r = 2; r < 10; r++) {
        const VI k0 = vi1(rs[2 * r]), k1 = vi1(rs[2 * r + 1]);
#pragma GCC unroll 4
        for (int q = 0; q < 2 * nb; q++) {
            VI p0 = vi_mul64(c0[q], m0), p1 = vi_mul64(c2[q], m1);
            c0[q] = vi_xor3(vi_hi64(p1), c1[q], k0);
            c1[q] = p1;
            c2[q] = vi_xor3(vi_hi64(p0), c3[q], k1);
            c3[q] = p0;
        }
    }
#pragma GCC unroll 2
    for (int k = 0; k < nb; k++) {
        w0[k] = vi_pack_lo(c0[2 * k], c0[2 * k + 1]);
        w1[k] = vi_pack_lo(c1[2 * k], c1[2 * k + 1]);
    }
}

/* Whole RW-blocks from j = 0 while the low counter word does not wrap
 * inside a block; returns how many elements were written. */
static int64_t RAND_NAME(blocks_)(uint64_t seed, uint64_t first, int64_t n, bool normal, float a, float b, float *y)
{
    const VF scale = vf1(1.0f / 16777216.0f), two_pi = vf1(6.28318530717958647692f), m2 = vf1(-2.0f);
    const VF va = vf1(a), vb = vf1(b);
    uint32_t rs[20];
    for (int r = 0; r < 10; r++) {
        rs[2 * r] = (uint32_t)seed + (uint32_t)r * PHX_W0;
        rs[2 * r + 1] = (uint32_t)(seed >> 32) + (uint32_t)r * PHX_W1;
    }
    int64_t j = 0;
    if (normal) {   /* RAND_NB vectors at a time: their Philox words, then the log calls, then the cos calls */
        for (; j + RAND_NB * RW <= n; j += RAND_NB * RW) {
            uint64_t c = first + (uint64_t)j;
            if ((uint32_t)c > 0xFFFFFFFFu - (RAND_NB * RW - 1)) break;
            VF u1[RAND_NB], x2[RAND_NB], r[RAND_NB];
            for (int k0 = 0; k0 < RAND_NB; k0 += PHX_MAXNB) {
                VI w0[PHX_MAXNB], w1[PHX_MAXNB];
                RAND_NAME(philox2n)(PHX_MAXNB, (uint32_t)c + (uint32_t)(k0 * RW), (uint32_t)(c >> 32), rs, w0, w1);
                for (int k = 0; k < PHX_MAXNB; k++) {
                    u1[k0 + k] = vf_mul(vf_cvt(vi_add(vi_srl(w0[k], 8), vi1(1))), scale);
                    x2[k0 + k] = vf_mul(two_pi, vf_mul(vf_cvt(vi_srl(w1[k], 8)), scale));
                }
            }
            for (int k = 0; k < RAND_NB; k++) r[k] = vf_sqrt(vf_mul(m2, VLOG(u1[k])));
            for (int k = 0; k < RAND_NB; k++)
                vf_st(y + j + k * RW, vf_add(va, vf_mul(vb, vf_mul(r[k], VCOS(x2[k])))));   /* mean + std * z */
        }
    }
    for (; j + RW <= n; j += RW) {
        uint64_t c = first + (uint64_t)j;
        if ((uint32_t)c > 0xFFFFFFFFu - (RW - 1)) break;
        VI w0, w1;
        RAND_NAME(philox2n)(1, (uint32_t)c, (uint32_t)(c >> 32), rs, &w0, &w1);
        if (!normal) {
            VF u = vf_mul(vf_cvt(vi_srl(w0, 8)), scale);
            vf_st(y + j, vf_add(va, vf_mul(vb, u)));          /* lo + range * u */
            continue;
        }
        VF u1 = vf_mul(vf_cvt(vi_add(vi_srl(w0, 8), vi1(1))), scale);
        VF u2 = vf_mul(vf_cvt(vi_srl(w1, 8)), scale);
        VF r = vf_sqrt(vf_mul(m2, VLOG(u1)));
        VF z = vf_mul(r, VCOS(vf_mul(two_pi, u2)));
        vf_st(y + j, vf_add(va, vf_mul(vb, z)));              /* mean + std * z */
    }
    return j;
}

static void RAND_NAME(uniform)(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float lo, float hi, float *y)
{
    int64_t j = 0;
    while (j < n) {
        j += RAND_NAME(blocks_)(seed, offset + (uint64_t)start + (uint64_t)j, n - j, false, lo, hi - lo, y + j);
        int64_t m = n - j < RW ? n - j : RW;   /* a wrapping block or the tail */
        if (m > 0) ctpu_k_rand_uniform_ref(seed, offset, start + j, m, lo, hi, y + j);
        j += m;
    }
}

static void RAND_NAME(normal)(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float mean, float std, float *y)
{
    int64_t j = 0;
    while (j < n) {
        j += RAND_NAME(blocks_)(seed, offset + (uint64_t)start + (uint64_t)j, n - j, true, mean, std, y + j);
        int64_t m = n - j < RW ? n - j : RW;
        if (m > 0) ctpu_k_rand_normal_ref(seed, offset, start + j, m, mean, std, y + j);
        j += m;
    }
}

static int64_t RAND_NAME(domain_mismatches)(void)
{
    int64_t bad = 0;
    const VF scale = vf1(1.0f / 16777216.0f), two_pi = vf1(6.28318530717958647692f);
    float a[RW], b[RW];
    for (uint32_t k = 0; k < (1u << 24); k += RW) {
        VF u = vf_mul(vf_cvt(vi_iota(k)), scale), u1 = vf_mul(vf_cvt(vi_iota(k + 1)), scale);
        vf_st(a, VCOS(vf_mul(two_pi, u)));
        vf_st(b, VLOG(u1));
        for (int j = 0; j < RW; j++) {
            float x = (float)(k + (uint32_t)j) * (1.0f / 16777216.0f), x1 = (float)(k + (uint32_t)j + 1) * (1.0f / 16777216.0f);
            float c = Sleef_cosf1_u10purec(6.28318530717958647692f * x), l = Sleef_logf1_u10purec(x1);
            bad += memcmp(&c, &a[j], 4) != 0;
            bad += memcmp(&l, &b[j], 4) != 0;
        }
    }
    return bad;
}
