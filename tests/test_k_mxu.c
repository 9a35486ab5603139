/* MXU matmul kernels: the specification against float64, every ISA variant
 * against the specification bit for bit, threads, epilogues, and the CPU's
 * own vdpbf16ps against the specification (CONTRACTS.md "MXU numerics"). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>
#include "kernels.h"
#include "internal.h"
#include "mxu.h"
#include "k_pool.h"

/* ---- helpers ------------------------------------------------------------ */
static uint64_t rng_s = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void)
{
    rng_s ^= rng_s << 13; rng_s ^= rng_s >> 7; rng_s ^= rng_s << 17;
    return rng_s;
}
static float urand(void) { return (float)((rng() >> 40) * 0x1p-24) * 2.0f - 1.0f; }
static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* A value mix: mostly ordinary, some special (Inf, NaN, subnormal, tiny
 * normals whose products land near 2^-126, huge, zeros, bf16 ties). Level 2
 * has no NaN or subnormal (those take a packer's slow path) but more ties and
 * values that round to Inf, so whole vectors take the fast path. */
static float special_val(int level)
{
    uint64_t r = rng();
    float s = (r >> 60) & 1 ? -1.0f : 1.0f;
    int c = (int)(r % 100);
    if (level == 2 && c < 10)
        return c < 2 ? s * bitsf(0x7f7f8000u | ((uint32_t)(r >> 30) & 0x7fffu))   /* rounds to Inf or max */
                     : s * bitsf(0x3f800000u | 0x8000u | ((uint32_t)(r >> 30) & 0x7f0000u));
    if (level == 0 || c >= 40) return urand() * 4.0f;
    if (c < 3) return s * INFINITY;
    if (c < 5) return NAN;
    if (c < 10) return s * bitsf((uint32_t)(r >> 20) & 0x7fffffu);            /* f32 subnormal */
    if (c < 20) return s * ldexpf(1.0f + (float)((r >> 24) & 0x7f) / 128.0f, -60 - (int)((r >> 40) % 8));
    if (c < 24) return s * ldexpf(1.0f + (float)((r >> 24) & 0x7f) / 128.0f, 120 + (int)((r >> 40) % 8));
    if (c < 28) return s * 0.0f;
    if (c < 34) return s * bitsf(0x3f800000u | 0x8000u | ((uint32_t)(r >> 30) & 0x7f0000u)); /* bf16 tie */
    return urand() * 1e-3f;
}

static void fill(void *p, int dt, int64_t n, int level)
{
    for (int64_t i = 0; i < n; i++) {
        float v = special_val(level);
        if (dt == CTPU_KDT_BF16) ((uint16_t *)p)[i] = ctpu_f32_to_bf16(v);
        else ((float *)p)[i] = v;
        /* level 1, bf16: also raw bf16 subnormals and signalling NaNs, which
         * no f32 rounds to (the packers' bf16 fast paths must see them) */
        if (dt == CTPU_KDT_BF16 && level == 1 && i % 13 == 5)
            ((uint16_t *)p)[i] = (uint16_t)((i & 32 ? 0x8000u : 0) | (i & 64 ? 0x7f81u : 1u + (uint32_t)(i % 127)));
    }
}

static int same_bits(const void *x, const void *y, int dt, int64_t n, int64_t *where)
{
    for (int64_t i = 0; i < n; i++) {
        float a, b;
        if (dt == CTPU_KDT_BF16) {
            a = ctpu_bf16_to_f32(((const uint16_t *)x)[i]);
            b = ctpu_bf16_to_f32(((const uint16_t *)y)[i]);
        } else if (dt == CTPU_KDT_I32) {
            if (((const int32_t *)x)[i] != ((const int32_t *)y)[i]) { *where = i; return 0; }
            continue;
        } else {
            a = ((const float *)x)[i];
            b = ((const float *)y)[i];
        }
        if (isnan(a) && isnan(b)) continue;
        if (fbits(a) != fbits(b)) { *where = i; return 0; }
    }
    return 1;
}

/* A problem: operands with a layout, a bias, a residual, an output. */
typedef struct {
    int64_t batch, M, N, K;
    int adt, bdt, cdt, ta, tb;     /* ta: A stored as [K,M]; tb: B stored as [N,K] */
    int prec, act, bias_dt, res_dt; /* bias_dt/res_dt < 0: none */
    int level;
    int bcast_b;                    /* B shared by all batch elements (b_bs = 0) */
} prob;

typedef struct {
    ctpu_mm_args g;
    void *a, *b, *bias, *res, *c1, *c2;
    int64_t cn;
} inst;

static inst inst_make(const prob *p)
{
    inst s;
    memset(&s, 0, sizeof s);
    ctpu_mm_args *g = &s.g;
    g->batch = p->batch; g->M = p->M; g->N = p->N; g->K = p->K;
    int64_t an = p->batch * p->M * p->K, bn = (p->bcast_b ? 1 : p->batch) * p->K * p->N;
    s.a = malloc((size_t)(an + 1) * 4);
    s.b = malloc((size_t)(bn + 1) * 4);
    fill(s.a, p->adt, an, p->level);
    fill(s.b, p->bdt, bn, p->level);
    g->a = s.a; g->a_dtype = p->adt; g->a_bs = p->M * p->K;
    if (p->ta) { g->a_rs = 1; g->a_cs = p->M; } else { g->a_rs = p->K; g->a_cs = 1; }
    g->b = s.b; g->b_dtype = p->bdt; g->b_bs = p->bcast_b ? 0 : p->K * p->N;
    if (p->tb) { g->b_rs = 1; g->b_cs = p->K; } else { g->b_rs = p->N; g->b_cs = 1; }
    s.cn = p->batch * p->M * p->N;
    s.c1 = calloc((size_t)s.cn + 1, 4);
    s.c2 = calloc((size_t)s.cn + 1, 4);
    g->c = s.c1; g->c_dtype = p->cdt; g->c_bs = p->M * p->N; g->ldc = p->N;
    g->precision = (ctpu_k_precision)p->prec;
    g->act = (ctpu_k_act)p->act;
    if (p->bias_dt >= 0) {
        s.bias = malloc((size_t)p->N * 4 + 4);
        fill(s.bias, p->bias_dt, p->N, p->level ? 1 : 0);
        g->bias = s.bias; g->bias_dtype = p->bias_dt;
    }
    if (p->res_dt >= 0) {
        s.res = malloc((size_t)s.cn * 4 + 4);
        fill(s.res, p->res_dt, s.cn, 0);
        g->residual = s.res; g->residual_dtype = p->res_dt;
        g->residual_bs = p->M * p->N; g->residual_ld = p->N;
    }
    return s;
}

static void inst_free(inst *s)
{
    free(s->a); free(s->b); free(s->bias); free(s->res); free(s->c1); free(s->c2);
}

static const ctpu_isa all_isas[] = { CTPU_ISA_SCALAR, CTPU_ISA_AVX2, CTPU_ISA_AVX512, CTPU_ISA_AVX512 };
/* Loop indices 2 and 3: AVX-512 with the FMA and with the vdpbf16ps
 * micro-kernel (whichever the probe chose, both are checked). */
static const ctpu_mxu_impl *forced_impl(int i)
{
    return i == 2 ? &ctpu_mxu_impl_avx512 : i == 3 ? &ctpu_mxu_impl_avx512_dp : NULL;
}
static const ctpu_mxu_impl *cur_force = NULL;

/* Run p with the variant `isa` (nt threads) and with _ref; compare bits. */
static void check_prob(const prob *p, ctpu_isa isa, int nt)
{
    inst s = inst_make(p);
    ctpu_k_matmul_ref(&s.g);
    s.g.c = s.c2;
    ctpu_k_mxu_select(isa);
    ctpu_mxu_force_impl(cur_force);
    ctpu_k_pool pool = k_pool_make(nt);
    ctpu_k_matmul(&s.g, &pool);
    ctpu_mxu_force_impl(NULL);
    ctpu_k_mxu_select(CTPU_ISA_SCALAR);
    int64_t w = -1;
    int ok = same_bits(s.c1, s.c2, p->cdt, s.cn, &w);
    if (!ok) {
        float r = p->cdt == CTPU_KDT_BF16 ? ctpu_bf16_to_f32(((uint16_t *)s.c1)[w]) : ((float *)s.c1)[w];
        float v = p->cdt == CTPU_KDT_BF16 ? ctpu_bf16_to_f32(((uint16_t *)s.c2)[w]) : ((float *)s.c2)[w];
        ck_abort_msg("isa %s %s nt %d: batch %lld M %lld N %lld K %lld adt %d bdt %d cdt %d ta %d tb %d "
                     "prec %d act %d bias %d res %d level %d: element %lld ref %a got %a",
                     ctpu_isa_name(isa), cur_force ? cur_force->name : "", nt, (long long)p->batch, (long long)p->M, (long long)p->N,
                     (long long)p->K, p->adt, p->bdt, p->cdt, p->ta, p->tb, p->prec, p->act,
                     p->bias_dt, p->res_dt, p->level, (long long)w, r, v);
    }
    inst_free(&s);
}

static int have_isa(ctpu_isa isa) { return ctpu_k_cpu_has(isa); }

static prob P(int64_t batch, int64_t M, int64_t N, int64_t K)
{
    return (prob){ .batch = batch, .M = M, .N = N, .K = K, .adt = CTPU_KDT_F32, .bdt = CTPU_KDT_F32,
                   .cdt = CTPU_KDT_F32, .bias_dt = -1, .res_dt = -1 };
}

/* ---- known answer ---------------------------------------------------------- */
START_TEST(test_known_answer)
{
    float a[4] = { 0.3744f, 0.1656f, 0.4707f, 0.1663f }, b[4] = { 0.3946f, 0.1186f, 0.1569f, 0.3145f };
    const double want[4] = { 0.17405128, 0.09669876, 0.21180916, 0.10805416 };
    for (size_t i = 0; i < 3; i++) {
        if (!have_isa(all_isas[i])) continue;
        float c[4] = { 0 }, cr[4] = { 0 };
        ctpu_mm_args g = { .batch = 1, .M = 2, .N = 2, .K = 2, .a = a, .a_dtype = CTPU_KDT_F32,
            .a_rs = 2, .a_cs = 1, .b = b, .b_dtype = CTPU_KDT_F32, .b_rs = 2, .b_cs = 1,
            .c = cr, .c_dtype = CTPU_KDT_F32, .ldc = 2 };
        ctpu_k_matmul_ref(&g);
        g.c = c;
        ctpu_k_mxu_select(all_isas[i]);
        ctpu_k_matmul(&g, NULL);
        ctpu_k_mxu_select(CTPU_ISA_SCALAR);
        for (int j = 0; j < 4; j++) {
            ck_assert_msg(fabs(cr[j] - want[j]) <= 1e-8 + 3e-8 * want[j], "ref[%d] = %.9g, want %.8g",
                          j, cr[j], want[j]);
            ck_assert_msg(fbits(c[j]) == fbits(cr[j]), "%s[%d]", ctpu_isa_name(all_isas[i]), j);
        }
    }
}
END_TEST

/* ---- the step: exact model of vdpbf16ps, including the 2^-126 boundary --- */
static float ref_dot(const float *a, const float *b, int K)
{
    float c = 0;
    ctpu_mm_args g = { .batch = 1, .M = 1, .N = 1, .K = K, .a = a, .a_dtype = CTPU_KDT_F32,
        .a_rs = K, .a_cs = 1, .b = b, .b_dtype = CTPU_KDT_F32, .b_rs = 1, .b_cs = 1,
        .c = &c, .c_dtype = CTPU_KDT_F32, .ldc = 1 };
    ctpu_k_matmul_ref(&g);
    return c;
}

START_TEST(test_step_edges)
{
    /* pair 0: odd first: acc = 2^-63 * 2^-63 = 2^-126, then + even product. */
    struct { float a0, b0, want; } e[] = {
        { -1.5f * 0x1p-75f, 0x1p-76f, 0.0f },       /* 2^-126 - 0.75*2^-150: tiny after rounding */
        { -0x1p-76f, 0x1p-76f, 0x1p-126f },         /* 2^-126 - 0.25*2^-150: rounds to 2^-126 */
        { -0x1p-75f, 0x1p-75f, 0.0f },              /* 2^-126 - 2^-150: exact, tiny */
        { -0x1p-75f, 0x1p-76f, 0x1p-126f },         /* 2^-126 - 0.5*2^-150: tie to even = 2^-126 */
        { 0x1p-70f, 0x1p-70f, 0x1p-126f + 0x1p-140f }, /* a subnormal product is not flushed on its own */
        { -0x1p-64f, 0x1p-63f, 0.0f },              /* 2^-126 - 2^-127 = 2^-127: flushed */
    };
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
        float a[2] = { e[i].a0, 0x1p-63f }, b[2] = { e[i].b0, 0x1p-63f };
        float r = ref_dot(a, b, 2);
        ck_assert_msg(fbits(r) == fbits(e[i].want), "edge %zu: %a want %a", i, r, e[i].want);
    }
    /* A product that is subnormal on its own still counts: 1.5*2^-126 - 2^-127
     * (product of two normals) = 2^-126 exactly. */
    float a[2] = { -0x1p-64f, 0x1p-63f }, b[2] = { 0x1p-63f, 1.5f * 0x1p-63f };
    ck_assert(fbits(ref_dot(a, b, 2)) == fbits(0x1p-126f));
    /* Odd index first: (2^24 + 1) needs the 1 before the -2^24. */
    float a3[3] = { 1.0f, 0x1p24f, -0x1p24f }, b3[3] = { 1.0f, 1.0f, 1.0f };
    /* pair 0: + a1*b1 = 2^24, then + a0*b0 = 2^24+1 -> 2^24 (tie to even);
     * pair 1: + 0 (zero partner), then + a2*b2 = 0. */
    ck_assert(ref_dot(a3, b3, 3) == 0.0f);
    float a4[3] = { 0x1p24f, 1.0f, -0x1p24f };
    /* pair 0: 1, then 1 + 2^24 -> 2^24; pair 1: -2^24 -> 0. Same again. */
    ck_assert(ref_dot(a4, b3, 3) == 0.0f);
    float a5[4] = { 1.0f, 0x1p24f, 1.0f, -0x1p24f };
    /* pair 0: 2^24, +1 -> 2^24; pair 1: -2^24 -> 0, +1 -> 1. Even-first gives 0. */
    float b5[4] = { 1, 1, 1, 1 };
    ck_assert_msg(ref_dot(a5, b5, 4) == 1.0f, "%a", ref_dot(a5, b5, 4));
}
END_TEST

/* ---- the CPU's vdpbf16ps against _ref ------------------------------------- */
__attribute__((target("avx512f,avx512bf16")))
static void probe_hw(const uint16_t *a, const uint16_t *b, int K, float out[16])
{
    /* lane j: sum_k a[k] * b[k*16 + j] */
    __m512 acc = _mm512_setzero_ps();
    for (int p = 0; p < (K + 1) / 2; p++) {
        uint32_t av = a[2 * p] | (2 * p + 1 < K ? (uint32_t)a[2 * p + 1] << 16 : 0);
        uint32_t bv[16];
        for (int j = 0; j < 16; j++)
            bv[j] = b[2 * p * 16 + j] | (2 * p + 1 < K ? (uint32_t)b[(2 * p + 1) * 16 + j] << 16 : 0);
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)av),
                               (__m512bh)_mm512_loadu_si512(bv));
    }
    _mm512_storeu_ps(out, acc);
}

static uint16_t probe_val(int kind)
{
    uint64_t r = rng();
    uint16_t s = (r >> 50) & 1 ? 0x8000 : 0;
    int c = (int)(r % 100);
    if (kind == 0) return s | (uint16_t)((120 + (r >> 20) % 14) << 7) | (uint16_t)((r >> 30) & 0x7f);
    if (c < 2) return s | 0x7f80;                               /* Inf */
    if (c < 3) return 0x7fc0 | (uint16_t)((r >> 30) & 0x3f);    /* NaN */
    if (c < 10) return s | (uint16_t)((r >> 30) & 0x7f);        /* bf16 subnormal (DAZ) */
    if (c < 45) return s | (uint16_t)((58 + (r >> 20) % 12) << 7) | (uint16_t)((r >> 30) & 0x7f);
    if (c < 50) return s;
    if (c < 55) return s | (uint16_t)((250 + (r >> 20) % 4) << 7) | (uint16_t)((r >> 30) & 0x7f);
    /* ties: few mantissa bits, similar exponents, so sums land on midpoints */
    return s | (uint16_t)((126 + (r >> 20) % 3) << 7) | (uint16_t)((r >> 30) & 0x70);
}

START_TEST(test_vdpbf16ps_probe)
{
    if (!__builtin_cpu_supports("avx512bf16")) return;
    long mism = 0, total = 0;
    for (int it = 0; it < 4000; it++) {
        int K = 3 + (int)(rng() % 30), kind = it & 1;
        uint16_t a[40], b[40 * 16];
        for (int k = 0; k < K; k++) a[k] = probe_val(kind);
        for (int k = 0; k < K * 16; k++) b[k] = probe_val(kind);
        float hw[16], rf[16];
        probe_hw(a, b, K, hw);
        ctpu_mm_args g = { .batch = 1, .M = 1, .N = 16, .K = K, .a = a, .a_dtype = CTPU_KDT_BF16,
            .a_rs = K, .a_cs = 1, .b = b, .b_dtype = CTPU_KDT_BF16, .b_rs = 16, .b_cs = 1,
            .c = rf, .c_dtype = CTPU_KDT_F32, .ldc = 16 };
        ctpu_k_matmul_ref(&g);
        for (int j = 0; j < 16; j++, total++)
            if (!(isnan(hw[j]) && isnan(rf[j])) && fbits(hw[j]) != fbits(rf[j])) {
                if (mism < 3) fprintf(stderr, "probe K %d lane %d: hw %a ref %a\n", K, j, hw[j], rf[j]);
                mism++;
            }
    }
    ck_assert_msg(mism == 0, "vdpbf16ps differs from _ref in %ld of %ld", mism, total);
    /* the 2^-126 boundary cases of test_step_edges, on the hardware */
    const float ea[][2] = { { -1.5f * 0x1p-75f, 0x1p-76f }, { -0x1p-76f, 0x1p-76f }, { -0x1p-75f, 0x1p-75f },
                            { -0x1p-75f, 0x1p-76f }, { 0x1p-70f, 0x1p-70f }, { -0x1p-64f, 0x1p-63f } };
    for (size_t i = 0; i < sizeof ea / sizeof ea[0]; i++) {
        uint16_t a[2] = { ctpu_f32_to_bf16(ea[i][0]), ctpu_f32_to_bf16(0x1p-63f) }, b[32];
        for (int j = 0; j < 16; j++) { b[j] = ctpu_f32_to_bf16(ea[i][1]); b[16 + j] = a[1]; }
        float hw[16], af[2] = { ea[i][0], 0x1p-63f }, bf[2] = { ea[i][1], 0x1p-63f };
        probe_hw(a, b, 2, hw);
        ck_assert_msg(fbits(hw[0]) == fbits(ref_dot(af, bf, 2)), "edge %zu: hw %a", i, hw[0]);
    }
}
END_TEST

/* ---- _ref against float64 ---------------------------------------------------
 * Each of the <= K+1 additions rounds once (relative u = 2^-24) and the
 * products are exact, so |ref - exact| <= (K+1) u / (1 - (K+1) u) * sum|a b|
 * (the standard bound for recursive summation), with a, b the bf16-rounded
 * operands. */
START_TEST(test_ref_vs_f64)
{
    const int shapes[][3] = { { 3, 5, 7 }, { 8, 16, 64 }, { 5, 9, 257 }, { 2, 3, 1000 } };
    for (size_t si = 0; si < 4; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N),
              *c = malloc(sizeof(float) * M * N);
        for (int i = 0; i < M * K; i++) a[i] = urand() * ldexpf(1, (int)(rng() % 9) - 4);
        for (int i = 0; i < K * N; i++) b[i] = urand();
        ctpu_mm_args g = { .batch = 1, .M = M, .N = N, .K = K, .a = a, .a_dtype = CTPU_KDT_F32,
            .a_rs = K, .a_cs = 1, .b = b, .b_dtype = CTPU_KDT_F32, .b_rs = N, .b_cs = 1,
            .c = c, .c_dtype = CTPU_KDT_F32, .ldc = N };
        ctpu_k_matmul_ref(&g);
        double u = 0x1p-24, gam = (K + 1) * u / (1 - (K + 1) * u);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double s = 0, sa = 0;
                for (int k = 0; k < K; k++) {
                    double p = (double)ctpu_bf16_to_f32(ctpu_f32_to_bf16(a[m * K + k])) *
                               (double)ctpu_bf16_to_f32(ctpu_f32_to_bf16(b[k * N + n]));
                    s += p;
                    sa += fabs(p);
                }
                ck_assert_msg(fabs(c[m * N + n] - s) <= gam * sa, "K %d: %.9g vs %.17g (bound %g)",
                              K, c[m * N + n], s, gam * sa);
            }
        free(a); free(b); free(c);
    }
}
END_TEST

/* HIGHEST against float64 on the f32 operands: within fp32 tolerance,
 * 2 (K+1) u sum|a b| (the split loses at most ~2^-24 relative per operand;
 * the sum rounds as above). HIGH: within 2^-16 sum|ab| + the same; and both
 * must be far better than DEFAULT on average. */
START_TEST(test_highest_vs_f64)
{
    const int shapes[][3] = { { 4, 6, 33 }, { 3, 5, 500 } };
    for (size_t si = 0; si < 2; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N),
              *c[3];
        for (int i = 0; i < M * K; i++) a[i] = urand() * ldexpf(1, (int)(rng() % 9) - 4);
        for (int i = 0; i < K * N; i++) b[i] = urand();
        double err[3] = { 0 };
        for (int pr = 0; pr < 3; pr++) {
            c[pr] = malloc(sizeof(float) * M * N);
            ctpu_mm_args g = { .batch = 1, .M = M, .N = N, .K = K, .a = a, .a_dtype = CTPU_KDT_F32,
                .a_rs = K, .a_cs = 1, .b = b, .b_dtype = CTPU_KDT_F32, .b_rs = N, .b_cs = 1,
                .c = c[pr], .c_dtype = CTPU_KDT_F32, .ldc = N, .precision = (ctpu_k_precision)pr };
            ctpu_k_matmul_ref(&g);
        }
        double u = 0x1p-24;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double s = 0, sa = 0;
                for (int k = 0; k < K; k++) {
                    double p = (double)a[m * K + k] * (double)b[k * N + n];
                    s += p;
                    sa += fabs(p);
                }
                for (int pr = 0; pr < 3; pr++) err[pr] += fabs(c[pr][m * N + n] - s) / sa;
                double e2 = fabs(c[2][m * N + n] - s), e1 = fabs(c[1][m * N + n] - s);
                ck_assert_msg(e2 <= 2 * (K + 1) * u * sa, "HIGHEST K %d: %.9g vs %.17g", K,
                              c[2][m * N + n], s);
                ck_assert_msg(e1 <= (0x1p-16 + 2 * (K + 1) * u) * sa, "HIGH K %d", K);
            }
        ck_assert_msg(err[2] < err[0] / 50 && err[1] < err[0] / 50, "errors %g %g %g", err[0], err[1], err[2]);
        free(a); free(b);
        for (int pr = 0; pr < 3; pr++) free(c[pr]);
    }
}
END_TEST

/* ---- every variant == _ref, bit for bit -------------------------------------- */
static const int64_t shapes[][4] = {
    /* batch, M, N, K */
    { 1, 1, 1, 1 }, { 1, 0, 5, 3 }, { 1, 4, 0, 3 }, { 1, 3, 4, 0 }, { 0, 3, 3, 3 },
    { 1, 1, 37, 19 }, { 1, 37, 1, 19 }, { 1, 13, 17, 3 }, { 1, 15, 33, 2 }, { 1, 29, 65, 31 },
    { 3, 7, 9, 11 }, { 2, 30, 70, 600 }, { 1, 17, 40, 513 },
    { 1, 30, 50, 37 },   /* a partial 32-wide panel with 16 whole lanes (the plain-load pack path) */
    /* skinny N, computed as C^T (the transposed store: 16 x 16 tiles, partial ones) */
    { 1, 128, 10, 128 }, { 1, 200, 9, 33 }, { 2, 45, 3, 20 },
    /* K >= 32 with A row-major: the FMA row layout (each row count of the
     * last panel, K odd and even, chunks of 128 pairs crossed) */
    { 1, 11, 33, 32 }, { 1, 13, 17, 33 }, { 1, 25, 31, 64 }, { 2, 12, 16, 257 }, { 1, 23, 15, 300 },
    { 1, 1, 40, 45 }, { 1, 16, 64, 513 }, { 1, 14, 1, 99 }, { 1, 22, 47, 35 }, { 1, 21, 32, 40 },
    { 1, 20, 33, 41 }, { 1, 19, 2, 34 }, { 1, 18, 65, 36 },
    /* one M panel (M <= 12, or the C^T of a skinny N): an f32 B with unit
     * stride along n read in place (partial 32-column tiles of 1..31
     * columns, odd K, chunks of 128 pairs crossed) */
    { 1, 12, 70, 301 }, { 1, 5, 17, 260 }, { 3, 7, 40, 33 }, { 1, 200, 9, 300 }, { 1, 11, 48, 1 },
    { 2, 10, 31, 128 },
    /* the AVX2 6 x 16 tile: whole tiles, one row / column past, the row
     * layout's two row pointers (rows 0..2, 3..5) with 4 and 5 rows */
    { 1, 6, 16, 64 }, { 1, 7, 17, 65 }, { 1, 12, 48, 257 }, { 1, 5, 15, 31 }, { 1, 4, 16, 40 },
    { 2, 18, 32, 33 },
};

START_TEST(test_isa_bitexact)
{
    ctpu_isa isa = all_isas[_i];
    if (!have_isa(isa)) return;
    cur_force = forced_impl(_i);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int v = 0; v < 8; v++) {
            prob p = P(shapes[si][0], shapes[si][1], shapes[si][2], shapes[si][3]);
            p.adt = v & 1 ? CTPU_KDT_BF16 : CTPU_KDT_F32;
            p.bdt = v & 2 ? CTPU_KDT_BF16 : CTPU_KDT_F32;
            p.cdt = v & 4 ? CTPU_KDT_BF16 : CTPU_KDT_F32;
            p.ta = (int)(si + v) & 1;
            p.tb = (int)(si + v / 2) & 1;
            p.level = 1;
            check_prob(&p, isa, 1);
            p.level = 2;
            check_prob(&p, isa, 1);
            p.level = 0;
            p.prec = (int)((si + v) % 3);
            check_prob(&p, isa, 1);
        }
    /* batch with B broadcast, all precisions with special values */
    for (int pr = 0; pr < 3; pr++) {
        prob p = P(3, 9, 35, 21);
        p.bcast_b = 1; p.prec = pr; p.level = 1;
        check_prob(&p, isa, 1);
        p.bcast_b = 0; p.ta = 1; p.tb = 1;
        check_prob(&p, isa, 2);
    }
    cur_force = NULL;
}
END_TEST

START_TEST(test_epilogue_bitexact)
{
    ctpu_isa isa = all_isas[_i];
    if (!have_isa(isa)) return;
    cur_force = forced_impl(_i);
    for (int act = 0; act < 4; act++)
        for (int v = 0; v < 8; v++) {
            prob p = act & 1 ? P(2, 19, 45, 37) : P(2, 70, 9, 37);   /* the second as C^T */
            p.act = act;
            p.bias_dt = v & 1 ? CTPU_KDT_BF16 : (v & 4 ? -1 : CTPU_KDT_F32);
            p.res_dt = v & 2 ? (v & 1 ? CTPU_KDT_F32 : CTPU_KDT_BF16) : -1;
            p.cdt = v & 4 ? CTPU_KDT_BF16 : CTPU_KDT_F32;
            p.level = v == 3 ? 1 : 0;
            check_prob(&p, isa, 1 + (v & 1));
        }
    cur_force = NULL;
}
END_TEST

/* Epilogue == the separate ops: matmul (act NONE, f32 out), then bias add,
 * activation (ctpu_k_unary_ref), residual add, output rounding. */
START_TEST(test_epilogue_unfused)
{
    static const ctpu_k_unary_op op[] = { 0, CTPU_K_U_RELU, CTPU_K_U_GELU_TANH, CTPU_K_U_GELU_ERF };
    for (int act = 0; act < 4; act++)
        for (int v = 0; v < 4; v++) {
            prob p = P(2, 11, 21, 17);
            p.act = act;
            p.bias_dt = v & 1 ? CTPU_KDT_BF16 : CTPU_KDT_F32;
            p.res_dt = v & 2 ? CTPU_KDT_F32 : -1;
            p.cdt = v & 2 ? CTPU_KDT_BF16 : CTPU_KDT_F32;
            inst s = inst_make(&p);
            ctpu_k_pool pool = k_pool_make(2);
            ctpu_k_mxu_select(ctpu_isa_detect());
            ctpu_k_matmul(&s.g, &pool);                 /* fused, into c1 */
            ctpu_mm_args u = s.g;
            float *raw = malloc(sizeof(float) * (size_t)s.cn);
            u.c = raw; u.c_dtype = CTPU_KDT_F32; u.bias = NULL; u.residual = NULL;
            u.act = CTPU_K_ACT_NONE;
            ctpu_k_matmul(&u, &pool);
            ctpu_k_mxu_select(CTPU_ISA_SCALAR);
            for (int64_t bi = 0; bi < p.batch; bi++)
                for (int64_t m = 0; m < p.M; m++) {
                    float *row = raw + (bi * p.M + m) * p.N;
                    float bias[64];
                    for (int64_t n = 0; n < p.N; n++)
                        bias[n] = p.bias_dt == CTPU_KDT_BF16 ? ctpu_bf16_to_f32(((uint16_t *)s.bias)[n])
                                                            : ((float *)s.bias)[n];
                    ctpu_k_binary_ref(CTPU_K_B_ADD, row, bias, row, p.N);
                    if (act) ctpu_k_unary_ref(op[act], row, row, p.N);
                    if (p.res_dt >= 0)
                        ctpu_k_binary_ref(CTPU_K_B_ADD, row, (float *)s.res + (bi * p.M + m) * p.N, row, p.N);
                }
            if (p.cdt == CTPU_KDT_BF16) {
                for (int64_t i = 0; i < s.cn; i++) ((uint16_t *)s.c2)[i] = ctpu_f32_to_bf16(raw[i]);
            } else {
                memcpy(s.c2, raw, sizeof(float) * (size_t)s.cn);
            }
            int64_t w;
            ck_assert_msg(same_bits(s.c1, s.c2, p.cdt, s.cn, &w), "act %d v %d element %lld", act, v,
                          (long long)w);
            free(raw);
            inst_free(&s);
        }
}
END_TEST

/* The residual in c's own buffer (y = x w + y in place): each variant reads
 * it before writing c, as _ref does element by element. */
START_TEST(test_residual_in_place)
{
    ctpu_isa isa = all_isas[_i];
    if (!have_isa(isa)) return;
    const ctpu_mxu_impl *force = forced_impl(_i);
    prob p = P(2, 45, 70, 33);
    p.res_dt = CTPU_KDT_F32;
    p.bias_dt = CTPU_KDT_F32;
    p.act = CTPU_K_ACT_RELU;
    inst s = inst_make(&p);
    ctpu_k_matmul_ref(&s.g);                      /* c1 = a b + bias, relu, + res */
    memcpy(s.c2, s.res, sizeof(float) * (size_t)s.cn);
    s.g.c = s.c2;
    s.g.residual = s.c2;
    ctpu_k_mxu_select(isa);
    ctpu_mxu_force_impl(force);
    ctpu_k_pool pool = k_pool_make(2);
    ctpu_k_matmul(&s.g, &pool);
    ctpu_mxu_force_impl(NULL);
    ctpu_k_mxu_select(CTPU_ISA_SCALAR);
    int64_t w;
    ck_assert_msg(same_bits(s.c1, s.c2, CTPU_KDT_F32, s.cn, &w), "isa %s: element %lld", ctpu_isa_name(isa),
                  (long long)w);
    inst_free(&s);
}
END_TEST

/* Same bits for 1, 2 and 3 threads, shapes that split over batch, N and M. */
START_TEST(test_threads)
{
    const int64_t sh[][4] = { { 1, 100, 300, 130 }, { 1, 200, 20, 77 }, { 5, 30, 40, 50 }, { 1, 3, 1000, 9 } };
    for (size_t isa_i = 0; isa_i < 3; isa_i++) {
        if (!have_isa(all_isas[isa_i])) continue;
        for (size_t si = 0; si < 4; si++) {
            if (all_isas[isa_i] == CTPU_ISA_SCALAR && si == 0) continue;   /* slow, covered below */
            for (int nt = 1; nt <= 3; nt++) {
                prob p = P(sh[si][0], sh[si][1], sh[si][2], sh[si][3]);
                p.level = 1;
                p.cdt = nt == 2 ? CTPU_KDT_BF16 : CTPU_KDT_F32;
                p.act = nt == 3 ? CTPU_K_ACT_GELU_TANH : CTPU_K_ACT_NONE;
                check_prob(&p, all_isas[isa_i], nt);
            }
        }
    }
}
END_TEST

/* Just-in-time packing: at one thread every operand, at 2 and 3 the split
 * one (M, N or a batched operand) is packed chunk by chunk at first use, the
 * shared one first. K over several 128-pair chunks (odd: the last chunk's
 * zero partner), every split, B broadcast over a batch, A and B transposed
 * or not (every pack path), every micro-kernel, at two precisions. */
START_TEST(test_threads_jit_pack)
{
    const int64_t sh[][5] = { /* batch, M, N, K, B broadcast */
        { 1, 30, 70, 301, 0 }, { 1, 90, 20, 277, 0 }, { 1, 16, 130, 263, 0 }, { 3, 9, 40, 259, 1 },
        { 4, 10, 33, 270, 0 } };
    ctpu_isa isa = all_isas[_i];
    if (!have_isa(isa)) return;
    cur_force = forced_impl(_i);
    for (size_t si = 0; si < sizeof sh / sizeof sh[0]; si++)
        for (int nt = 1; nt <= 3; nt++)
            for (int v = 0; v < 4; v++) {
                if (isa == CTPU_ISA_SCALAR && (nt == 2 || v > 1)) continue;   /* slow */
                prob p = P(sh[si][0], sh[si][1], sh[si][2], sh[si][3]);
                p.bcast_b = (int)sh[si][4];
                p.ta = v & 1; p.tb = (v >> 1) & 1;
                p.adt = (si + (size_t)v) & 1 ? CTPU_KDT_BF16 : CTPU_KDT_F32;
                p.cdt = nt == 2 ? CTPU_KDT_BF16 : CTPU_KDT_F32;
                p.prec = v == 3 ? 1 : 0;
                p.level = 1;
                check_prob(&p, isa, nt);
            }
    cur_force = NULL;
}
END_TEST

/* A 1-row product equals that row of a larger product (and a 1-column one
 * that column), with the detected ISA: tiling never changes a result. */
START_TEST(test_row_of_larger)
{
    int M = 45, N = 70, K = 333;
    prob p = P(1, M, N, K);
    p.level = 1;
    inst s = inst_make(&p);
    ctpu_k_mxu_select(ctpu_isa_detect());
    ctpu_k_pool pool = k_pool_make(2);
    ctpu_k_matmul(&s.g, &pool);
    float *full = s.c1;
    for (int m = 0; m < M; m += 11) {
        float row[70];
        ctpu_mm_args g = s.g;
        g.M = 1;
        g.a = (const float *)s.a + m * K;
        g.c = row;
        ctpu_k_matmul(&g, NULL);
        int64_t w;
        ck_assert_msg(same_bits(row, full + m * N, CTPU_KDT_F32, N, &w), "row %d col %lld", m, (long long)w);
    }
    for (int n = 0; n < N; n += 13) {
        float col[45];
        ctpu_mm_args g = s.g;
        g.N = 1;
        g.b = (const float *)s.b + n;
        g.ldc = 1;
        g.c = col;
        ctpu_k_matmul(&g, NULL);
        for (int m = 0; m < M; m++)
            ck_assert_msg((isnan(col[m]) && isnan(full[m * N + n])) || fbits(col[m]) == fbits(full[m * N + n]),
                          "col %d row %d", n, m);
    }
    ctpu_k_mxu_select(CTPU_ISA_SCALAR);
    inst_free(&s);
}
END_TEST

START_TEST(test_i32_exact)
{
    int M = 5, N = 6, K = 7;
    int32_t a[35], b[42], c[30];
    for (int i = 0; i < 35; i++) a[i] = (int32_t)(rng() % 2001) - 1000;
    for (int i = 0; i < 42; i++) b[i] = (int32_t)(rng() % 2001) - 1000;
    a[0] = INT32_MAX; b[0] = 3;    /* wraps */
    ctpu_mm_args g = { .batch = 1, .M = M, .N = N, .K = K, .a = a, .a_dtype = CTPU_KDT_I32,
        .a_rs = K, .a_cs = 1, .b = b, .b_dtype = CTPU_KDT_I32, .b_rs = N, .b_cs = 1,
        .c = c, .c_dtype = CTPU_KDT_I32, .ldc = N };
    ctpu_k_pool pool = k_pool_make(2);
    ctpu_k_matmul(&g, &pool);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            int64_t s = 0;
            for (int k = 0; k < K; k++) s += (int64_t)a[m * K + k] * b[k * N + n];
            ck_assert_int_eq(c[m * N + n], (int32_t)(uint32_t)(uint64_t)s);
        }
}
END_TEST

static Suite *mxu_suite(void)
{
    Suite *s = suite_create("k_mxu");
    TCase *tc = tcase_create("mxu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_known_answer);
    tcase_add_test(tc, test_step_edges);
    tcase_add_test(tc, test_vdpbf16ps_probe);
    tcase_add_test(tc, test_ref_vs_f64);
    tcase_add_test(tc, test_highest_vs_f64);
    tcase_add_loop_test(tc, test_isa_bitexact, 0, 4);
    tcase_add_loop_test(tc, test_epilogue_bitexact, 0, 4);
    tcase_add_test(tc, test_epilogue_unfused);
    tcase_add_loop_test(tc, test_residual_in_place, 0, 4);
    tcase_add_test(tc, test_threads);
    tcase_add_loop_test(tc, test_threads_jit_pack, 0, 4);
    tcase_add_test(tc, test_row_of_larger);
    tcase_add_test(tc, test_i32_exact);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    ctpu_mxu_set_thread_min_flop(0);   /* small shapes must still split over threads */
    SRunner *sr = srunner_create(mxu_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
