/* Kernel suite: elementwise block-VM ops, conversions, ISA selection,
 * randomness (Philox4x32-10) and data movement.
 *
 *  - parity: every op of every variant the CPU has equals _ref bit for bit
 *    (NaN as a class), on sizes 0..4099 (tails), random and edge data,
 *    unaligned pointers, in place, with guard elements checked after the end;
 *  - accuracy: _ref against a float64 (libm) reference, tolerances below;
 *  - known answers: bf16 rounding, f32 -> i32, Philox (Random123 kat_vectors);
 *  - random draws: split invariance, range, moments;
 *  - embedding bad-index reporting, strided copy against a naive loop. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

/* Check's ck_assert_* record a checkpoint (a write to its message file) on every
 * success: inside per-element loops use these, which only call Check on failure. */
#define CHECK(cond) do { if (!(cond)) ck_abort_msg("%s:%d: %s", __FILE__, __LINE__, #cond); } while (0)
#define CHECK_EQ(a, b) do { long long a_ = (long long)(a), b_ = (long long)(b); \
        if (a_ != b_) ck_abort_msg("%s:%d: %s == %s (0x%llx vs 0x%llx)", __FILE__, __LINE__, #a, #b, a_, b_); } while (0)
#define CHECK_MSG(cond, ...) do { if (!(cond)) ck_abort_msg(__VA_ARGS__); } while (0)

/* ---- helpers --------------------------------------------------------------------- */
static uint64_t rng_state;
static void rng_seed(uint64_t s) { rng_state = s * 0x9E3779B97F4A7C15ull + 1; }
static uint64_t rng_u64(void)
{
    uint64_t x = rng_state;             /* xorshift64* */
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    rng_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}
static uint32_t rng_u32(void) { return (uint32_t)(rng_u64() >> 32); }
static float rng_unif(float lo, float hi) { return lo + (hi - lo) * (float)((rng_u32() >> 8) * (1.0 / 16777216.0)); }

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
/* Bit-identical, NaN compared as a class. */
static bool same(float a, float b) { return (a != a && b != b) || fbits(a) == fbits(b); }

static const float edge_vals[] = {
    0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.5f, 2.0f, -2.0f, 3.0f, -3.0f, 0.1f, -0.1f,
    INFINITY, -INFINITY, NAN, -NAN, FLT_MIN, -FLT_MIN, FLT_MAX, -FLT_MAX,
    1e-40f, -1e-40f, 1.4e-45f, -1.4e-45f, 1.17549421e-38f /* largest subnormal */,
    88.0f, 88.72f, 89.0f, -87.0f, -88.0f, -103.0f, -104.0f, -150.0f, 1e10f, -1e10f,
    1e-10f, -1e-10f, 2147483648.0f, -2147483648.0f, 2147483520.0f, -2147483520.0f, 3e9f,
    -3e9f, 1.00390625f, -1.00390625f, 1.01171875f, 9.0f, 10.0f, -10.0f, 20.0f, -20.0f,
    0.70710678f, 1e30f, -1e30f, 1e38f, 4.0f, -4.0f, 0.25f, 16777216.0f, 16777217.0f,
};
#define N_EDGE ((int)(sizeof edge_vals / sizeof edge_vals[0]))

enum { PAT_BITS, PAT_SMALL, PAT_MID_EDGE, PAT_WIDE, PAT_INT, PAT_EDGE, PAT_COUNT };
static const char *pat_name[PAT_COUNT] = { "bits", "small", "mid+edge", "wide", "int", "edge" };

static void fill(float *x, int64_t n, int pat)
{
    for (int64_t i = 0; i < n; i++) {
        float v;
        switch (pat) {
        case PAT_BITS: v = bitsf(rng_u32()); break;
        case PAT_SMALL: v = rng_unif(-8.0f, 8.0f); break;
        case PAT_MID_EDGE: v = (i % 7 == 3) ? edge_vals[rng_u32() % N_EDGE] : rng_unif(-100.0f, 100.0f); break;
        case PAT_WIDE: { /* random sign, exponent across subnormal..huge */
            float m = rng_unif(1.0f, 2.0f);
            int e = (int)(rng_u32() % 280) - 150;
            v = ldexpf(m, e);
            if (rng_u32() & 1) v = -v;
            break;
        }
        case PAT_INT: v = (float)((int)(rng_u32() % 9) - 4); break;
        default: v = edge_vals[(i + rng_u32() % 3) % N_EDGE]; break;
        }
        x[i] = v;
    }
}

static const int64_t sizes[] = { 0, 1, 3, 15, 16, 17, 1023, 1024, 1025, 4099 };
#define N_SIZES ((int)(sizeof sizes / sizeof sizes[0]))
#define MAXN 4099
#define GUARD 40
#define GUARD_VAL 1234.5f

static const char *unary_name[] = {
#define X(n) #n,
    CTPU_K_UNARY_OPS(X)
#undef X
};
static const char *binary_name[] = {
#define X(n) #n,
    CTPU_K_BINARY_OPS(X)
#undef X
};

/* Buffers: one float past 64-byte alignment so vector loads are unaligned. */
static float *buf_alloc(size_t n)
{
    float *p = aligned_alloc(64, ((n + 1 + GUARD) * sizeof(float) + 63) / 64 * 64);
    ck_assert_ptr_nonnull(p);
    return p + 1;
}
static void buf_free(float *p) { free(p - 1); }
static void guard_set(float *y, int64_t n) { for (int i = 0; i < GUARD; i++) y[n + i] = GUARD_VAL; }
static void guard_check(const float *y, int64_t n, const char *what)
{
    for (int i = 0; i < GUARD; i++)
        CHECK_MSG(fbits(y[n + i]) == fbits(GUARD_VAL), "%s n=%lld: wrote past the end (+%d)",
                      what, (long long)n, i);
}

static void select_isa_or_skip(int isa, bool *ok)
{
    *ok = ctpu_k_cpu_has((ctpu_isa)isa);
    ck_assert(ctpu_kernels_set_isa((ctpu_isa)isa) == *ok);
    if (*ok) ck_assert_int_eq(ctpu_kernels_isa(), isa);
}

static void check_same(const float *ref, const float *got, const float *in_a, const float *in_b,
                       int64_t n, const char *op, int isa, int pat)
{
    for (int64_t i = 0; i < n; i++)
        if (!same(ref[i], got[i]))
            ck_abort_msg("%s isa=%s pat=%s n=%lld i=%lld a=%a (0x%08x) b=%a: ref %a (0x%08x) got %a (0x%08x)",
                         op, ctpu_isa_name((ctpu_isa)isa), pat_name[pat], (long long)n, (long long)i,
                         (double)in_a[i], fbits(in_a[i]), in_b ? (double)in_b[i] : 0.0,
                         (double)ref[i], fbits(ref[i]), (double)got[i], fbits(got[i]));
}

/* ---- ISA ------------------------------------------------------------------------- */
START_TEST(test_isa_basics)
{
    ck_assert_str_eq(ctpu_isa_name(CTPU_ISA_SCALAR), "scalar");
    ck_assert_str_eq(ctpu_isa_name(CTPU_ISA_AVX2), "avx2");
    ck_assert_str_eq(ctpu_isa_name(CTPU_ISA_AVX512), "avx512");
    ck_assert_int_eq(ctpu_kernels_isa(), CTPU_ISA_SCALAR);        /* default table */
    ctpu_isa best = ctpu_isa_detect();
    ck_assert(ctpu_k_cpu_has(CTPU_ISA_SCALAR));
    ck_assert(ctpu_k_cpu_has(best));
    for (int i = best + 1; i < CTPU_ISA_COUNT; i++) ck_assert(!ctpu_k_cpu_has((ctpu_isa)i));
    if (ctpu_k_cpu_has(CTPU_ISA_AVX512)) ck_assert(ctpu_k_cpu_has(CTPU_ISA_AVX2));
    ck_assert(!ctpu_kernels_set_isa(CTPU_ISA_COUNT));
    ck_assert(ctpu_kernels_set_isa(best));
    ck_assert_int_eq(ctpu_kernels_isa(), best);
    ck_assert(ctpu_kernels_set_isa(CTPU_ISA_SCALAR));
    ck_assert_int_eq(ctpu_kernels_isa(), CTPU_ISA_SCALAR);
    fprintf(stderr, "test_k_elementwise: best ISA %s\n", ctpu_isa_name(best));
}
END_TEST

/* The default table (no set_isa call) works and is the reference. */
START_TEST(test_default_table)
{
    float x[5] = { 1, -2, 0, 4, NAN }, y[5], r[5];
    ctpu_k_unary(CTPU_K_U_EXP, x, y, 5);
    ctpu_k_unary_ref(CTPU_K_U_EXP, x, r, 5);
    for (int i = 0; i < 5; i++) ck_assert(same(y[i], r[i]));
}
END_TEST

/* Every variant has a loop of its own for every kernel op: no entry is missing
 * and no SIMD entry is the scalar reference (an op without its SIMD primitive
 * does not build, since the tables are stamped from the X-macros; this
 * guards the tables against a hand-made fallback). Likewise the reductions. */
START_TEST(test_variant_tables_complete)
{
    const ctpu_k_ew_variant *sc = ctpu_k_ew_variant_of(CTPU_ISA_SCALAR);
    const ctpu_k_red_variant *rsc = ctpu_k_red_variant_of(CTPU_ISA_SCALAR);
    ck_assert_ptr_nonnull(sc);
    ck_assert_ptr_nonnull(rsc);
    ck_assert_ptr_null(ctpu_k_ew_variant_of(CTPU_ISA_COUNT));
    for (int isa = 0; isa < CTPU_ISA_COUNT; isa++) {
        const ctpu_k_ew_variant *v = ctpu_k_ew_variant_of((ctpu_isa)isa);
        const ctpu_k_red_variant *r = ctpu_k_red_variant_of((ctpu_isa)isa);
        ck_assert_msg(v && r, "isa %s has no variant", ctpu_isa_name((ctpu_isa)isa));
        bool simd = isa != CTPU_ISA_SCALAR;
        for (int op = 0; op < CTPU_K_U_COUNT; op++) {
            ck_assert_msg(v->unary[op], "%s: no unary %s", ctpu_isa_name((ctpu_isa)isa), unary_name[op]);
            ck_assert_msg(!simd || v->unary[op] != sc->unary[op], "%s: unary %s runs the reference",
                          ctpu_isa_name((ctpu_isa)isa), unary_name[op]);
        }
        for (int op = 0; op < CTPU_K_B_COUNT; op++) {
            ck_assert_msg(v->binary[op] && v->binary_as[op] && v->binary_sa[op], "%s: no binary %s",
                          ctpu_isa_name((ctpu_isa)isa), binary_name[op]);
            ck_assert_msg(!simd || (v->binary[op] != sc->binary[op] && v->binary_as[op] != sc->binary_as[op]
                                    && v->binary_sa[op] != sc->binary_sa[op]),
                          "%s: binary %s runs the reference", ctpu_isa_name((ctpu_isa)isa), binary_name[op]);
        }
        ck_assert(v->where && v->clamp && v->bf16_to_f32 && v->f32_to_bf16 && v->i32_to_f32 && v->f32_to_i32);
        ck_assert(r->rows1 && r->col1 && r->colv && r->softmax_row);
        if (simd) {
            ck_assert(v->where != sc->where && v->clamp != sc->clamp && v->bf16_to_f32 != sc->bf16_to_f32
                      && v->f32_to_bf16 != sc->f32_to_bf16 && v->i32_to_f32 != sc->i32_to_f32
                      && v->f32_to_i32 != sc->f32_to_i32);
            ck_assert(r->rows1 != rsc->rows1 && r->col1 != rsc->col1 && r->colv != rsc->colv
                      && r->softmax_row != rsc->softmax_row);
        }
    }
}
END_TEST

/* ---- parity: every variant vs _ref ------------------------------------------------- */
START_TEST(test_parity_unary)
{
    bool ok;
    select_isa_or_skip(_i, &ok);
    if (!ok) return;
    float *x = buf_alloc(MAXN), *yr = buf_alloc(MAXN), *yv = buf_alloc(MAXN);
    rng_seed(100 + (uint64_t)_i);
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s];
        for (int pat = 0; pat < PAT_COUNT; pat++) {
            fill(x, n, pat);
            for (int op = 0; op < CTPU_K_U_COUNT; op++) {
                ctpu_k_unary_ref((ctpu_k_unary_op)op, x, yr, n);
                guard_set(yv, n);
                ctpu_k_unary((ctpu_k_unary_op)op, x, yv, n);
                guard_check(yv, n, unary_name[op]);
                check_same(yr, yv, x, NULL, n, unary_name[op], _i, pat);
                /* in place */
                memcpy(yv, x, (size_t)n * sizeof(float));
                ctpu_k_unary((ctpu_k_unary_op)op, yv, yv, n);
                check_same(yr, yv, x, NULL, n, unary_name[op], _i, pat);
            }
        }
    }
    buf_free(x); buf_free(yr); buf_free(yv);
}
END_TEST

/* b: its own pattern, with some elements equal to a, -a (±0 pairs) or edge values. */
static void fill_b(const float *a, float *b, int64_t n, int pat)
{
    fill(b, n, pat);
    for (int64_t i = 0; i < n; i++) {
        if (i % 5 == 1) b[i] = a[i];
        else if (i % 11 == 2) b[i] = -a[i];
    }
}

START_TEST(test_parity_binary)
{
    bool ok;
    select_isa_or_skip(_i, &ok);
    if (!ok) return;
    float *a = buf_alloc(MAXN), *b = buf_alloc(MAXN), *yr = buf_alloc(MAXN), *yv = buf_alloc(MAXN);
    rng_seed(200 + (uint64_t)_i);
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s];
        for (int pat = 0; pat < PAT_COUNT; pat++) {
            fill(a, n, pat);
            fill_b(a, b, n, (pat + 1 + (int)(rng_u32() % (PAT_COUNT - 1))) % PAT_COUNT);
            if (pat == PAT_SMALL)   /* positive bases for POW's interesting range */
                for (int64_t i = 0; i < n; i++) a[i] = fabsf(a[i]) * 0.5f;
            for (int op = 0; op < CTPU_K_B_COUNT; op++) {
                ctpu_k_binary_ref((ctpu_k_binary_op)op, a, b, yr, n);
                guard_set(yv, n);
                ctpu_k_binary((ctpu_k_binary_op)op, a, b, yv, n);
                guard_check(yv, n, binary_name[op]);
                check_same(yr, yv, a, b, n, binary_name[op], _i, pat);
                memcpy(yv, b, (size_t)n * sizeof(float));   /* y aliases b */
                ctpu_k_binary((ctpu_k_binary_op)op, a, yv, yv, n);
                check_same(yr, yv, a, b, n, binary_name[op], _i, pat);
            }
        }
    }
    buf_free(a); buf_free(b); buf_free(yr); buf_free(yv);
}
END_TEST

START_TEST(test_parity_binary_scalar)
{
    bool ok;
    select_isa_or_skip(_i, &ok);
    if (!ok) return;
    float *a = buf_alloc(MAXN), *yr = buf_alloc(MAXN), *yv = buf_alloc(MAXN);
    float *sv = buf_alloc(MAXN);
    rng_seed(300 + (uint64_t)_i);
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s];
        for (int pat = 0; pat < PAT_COUNT; pat++) {
            fill(a, n, pat);
            for (int k = 0; k < 4; k++) {
                float sc = k < 2 ? edge_vals[rng_u32() % N_EDGE] : rng_unif(-5.0f, 5.0f);
                for (int64_t i = 0; i < n; i++) sv[i] = sc;
                for (int op = 0; op < CTPU_K_B_COUNT; op++)
                    for (int first = 0; first < 2; first++) {
                        ctpu_k_binary_scalar_ref((ctpu_k_binary_op)op, a, sc, first, yr, n);
                        guard_set(yv, n);
                        ctpu_k_binary_scalar((ctpu_k_binary_op)op, a, sc, first, yv, n);
                        guard_check(yv, n, binary_name[op]);
                        check_same(yr, yv, a, sv, n, binary_name[op], _i, pat);
                        /* the scalar form is the binary op with a broadcast operand */
                        if (first) ctpu_k_binary_ref((ctpu_k_binary_op)op, sv, a, yv, n);
                        else ctpu_k_binary_ref((ctpu_k_binary_op)op, a, sv, yv, n);
                        check_same(yr, yv, a, sv, n, binary_name[op], _i, pat);
                    }
            }
        }
    }
    buf_free(a); buf_free(yr); buf_free(yv); buf_free(sv);
}
END_TEST

START_TEST(test_parity_where_clamp)
{
    bool ok;
    select_isa_or_skip(_i, &ok);
    if (!ok) return;
    float *c = buf_alloc(MAXN), *a = buf_alloc(MAXN), *b = buf_alloc(MAXN);
    float *yr = buf_alloc(MAXN), *yv = buf_alloc(MAXN);
    static const float cvals[] = { 0.0f, -0.0f, 1.0f, NAN, -1.0f, 1e-40f, INFINITY };
    static const float lohi[][2] = { { -1, 1 }, { 0, 0 }, { -0.0f, 0.0f }, { 0.0f, -0.0f },
                                     { 2, -2 }, { NAN, 1 }, { -1, NAN }, { -INFINITY, INFINITY },
                                     { 1e-40f, 1e30f }, { -5, 3 } };
    rng_seed(400 + (uint64_t)_i);
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s];
        for (int pat = 0; pat < PAT_COUNT; pat++) {
            fill(a, n, pat);
            fill(b, n, (pat + 2) % PAT_COUNT);
            for (int64_t i = 0; i < n; i++)
                c[i] = (i % 3 == 0) ? a[i] : cvals[rng_u32() % (sizeof cvals / sizeof cvals[0])];
            ctpu_k_where_ref(c, a, b, yr, n);
            guard_set(yv, n);
            ctpu_k_where(c, a, b, yv, n);
            guard_check(yv, n, "where");
            check_same(yr, yv, c, a, n, "where", _i, pat);
            for (int64_t i = 0; i < n; i++)   /* spec, including NaN c -> a */
                CHECK(same(yr[i], c[i] != 0.0f ? a[i] : b[i]));
            for (size_t k = 0; k < sizeof lohi / sizeof lohi[0]; k++) {
                float lo = lohi[k][0], hi = lohi[k][1];
                ctpu_k_clamp_ref(a, lo, hi, yr, n);
                guard_set(yv, n);
                ctpu_k_clamp(a, lo, hi, yv, n);
                guard_check(yv, n, "clamp");
                check_same(yr, yv, a, NULL, n, "clamp", _i, pat);
                for (int64_t i = 0; i < n; i++) {
                    bool nan = a[i] != a[i] || lo != lo || hi != hi;
                    CHECK(nan ? yr[i] != yr[i] : yr[i] == yr[i]);
                    if (!nan && lo <= hi) CHECK(yr[i] >= lo && yr[i] <= hi);
                }
                memcpy(yv, a, (size_t)n * sizeof(float));
                ctpu_k_clamp(yv, lo, hi, yv, n);
                check_same(yr, yv, a, NULL, n, "clamp in place", _i, pat);
            }
        }
    }
    buf_free(c); buf_free(a); buf_free(b); buf_free(yr); buf_free(yv);
}
END_TEST

START_TEST(test_parity_conversions)
{
    bool ok;
    select_isa_or_skip(_i, &ok);
    if (!ok) return;
    float *x = buf_alloc(MAXN), *yv = buf_alloc(MAXN);
    uint16_t *h = malloc((MAXN + GUARD + 1) * 2), *hv = malloc((MAXN + GUARD + 1) * 2);
    int32_t *iv = malloc((MAXN + GUARD + 1) * 4), *ii = malloc((MAXN + GUARD + 1) * 4);
    rng_seed(500 + (uint64_t)_i);
    /* odd offsets: unaligned 16-bit and 32-bit arrays */
    uint16_t *h1 = h + 1, *hv1 = hv + 1;
    int32_t *iv1 = iv + 1, *ii1 = ii + 1;
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = sizes[s];
        for (int pat = 0; pat < PAT_COUNT; pat++) {
            fill(x, n, pat);
            for (int64_t i = 0; i < n; i++)   /* also exact bf16 ties */
                if (i % 9 == 4) x[i] = bitsf((fbits(x[i]) & 0xffff0000u) | 0x8000u);
            /* f32 -> bf16 */
            for (int g = 0; g < GUARD; g++) hv1[n + g] = 0xabcd;
            ctpu_k_f32_to_bf16(x, hv1, n);
            for (int g = 0; g < GUARD; g++) CHECK_EQ(hv1[n + g], 0xabcd);
            ctpu_k_f32_to_bf16_ref(x, h1, n);
            for (int64_t i = 0; i < n; i++) {
                CHECK_EQ(h1[i], ctpu_f32_to_bf16(x[i]));
                CHECK_MSG(hv1[i] == h1[i], "f32_to_bf16 %s n=%lld i=%lld x=0x%08x ref 0x%04x got 0x%04x",
                              ctpu_isa_name((ctpu_isa)_i), (long long)n, (long long)i, fbits(x[i]),
                              h1[i], hv1[i]);
            }
            /* bf16 -> f32 (random 16-bit patterns) */
            for (int64_t i = 0; i < n; i++) h1[i] = (uint16_t)rng_u32();
            guard_set(yv, n);
            ctpu_k_bf16_to_f32(h1, yv, n);
            guard_check(yv, n, "bf16_to_f32");
            for (int64_t i = 0; i < n; i++)
                CHECK_EQ(fbits(yv[i]), fbits(ctpu_bf16_to_f32(h1[i])));
            /* f32 -> i32 */
            for (int g = 0; g < GUARD; g++) iv1[n + g] = 0x5a5a5a5a;
            ctpu_k_f32_to_i32(x, iv1, n);
            for (int g = 0; g < GUARD; g++) CHECK_EQ(iv1[n + g], 0x5a5a5a5a);
            for (int64_t i = 0; i < n; i++)
                CHECK_MSG(iv1[i] == ctpu_f32_to_i32(x[i]), "f32_to_i32 %s x=%a got %d",
                              ctpu_isa_name((ctpu_isa)_i), (double)x[i], iv1[i]);
            /* i32 -> f32 */
            for (int64_t i = 0; i < n; i++) {
                uint32_t r = rng_u32();
                ii1[i] = (i % 4 == 0) ? (int32_t)r : (i % 4 == 1) ? (int32_t)(r % 2001) - 1000
                       : (i % 4 == 2) ? INT32_MIN + (int32_t)(r % 300) : INT32_MAX - (int32_t)(r % 300);
            }
            guard_set(yv, n);
            ctpu_k_i32_to_f32(ii1, yv, n);
            guard_check(yv, n, "i32_to_f32");
            for (int64_t i = 0; i < n; i++)
                CHECK_EQ(fbits(yv[i]), fbits((float)ii1[i]));
        }
    }
    /* every bf16 value, both directions */
    static uint16_t all[65536];
    static float allf[65536];
    static uint16_t back[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    ctpu_k_bf16_to_f32(all, allf, 65536);
    ctpu_k_f32_to_bf16(allf, back, 65536);
    for (int i = 0; i < 65536; i++) {
        CHECK_EQ(fbits(allf[i]), (uint32_t)i << 16);
        if ((i & 0x7f80) == 0x7f80 && (i & 0x7f)) CHECK_EQ(back[i], i | 0x40);  /* NaN */
        else if ((i & 0x7f80) == 0) CHECK_EQ(back[i], i & 0x8000);  /* subnormal -> 0 */
        else CHECK_EQ(back[i], i);
    }
    buf_free(x); buf_free(yv); free(h); free(hv); free(iv); free(ii);
}
END_TEST

/* Every f32 bit pattern of a stride through the whole space: ROUND_BF16,
 * f32 -> bf16, f32 -> i32 and the cheap unary ops per variant. */
START_TEST(test_parity_sweep)
{
    bool ok;
    select_isa_or_skip(_i, &ok);
    if (!ok) return;
    enum { CH = 4096 };
    float *x = buf_alloc(CH), *yr = buf_alloc(CH), *yv = buf_alloc(CH);
    uint16_t hv[CH];
    int32_t iv[CH];
    static const ctpu_k_unary_op ops[] = { CTPU_K_U_ROUND_BF16, CTPU_K_U_RELU, CTPU_K_U_ABS,
                                           CTPU_K_U_NEG, CTPU_K_U_SQRT, CTPU_K_U_RSQRT, CTPU_K_U_RECIP,
                                           CTPU_K_U_SQUARE };
    for (uint64_t base = 0; base < (1ull << 32); base += (uint64_t)CH * 1021) {
        for (int i = 0; i < CH; i++) x[i] = bitsf((uint32_t)(base + (uint64_t)i * 1021 + 7));
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            ctpu_k_unary_ref(ops[k], x, yr, CH);
            ctpu_k_unary(ops[k], x, yv, CH);
            check_same(yr, yv, x, NULL, CH, unary_name[ops[k]], _i, PAT_BITS);
        }
        ctpu_k_f32_to_bf16(x, hv, CH);
        ctpu_k_f32_to_i32(x, iv, CH);
        for (int i = 0; i < CH; i++) {
            CHECK_EQ(hv[i], ctpu_f32_to_bf16(x[i]));
            CHECK_EQ(iv[i], ctpu_f32_to_i32(x[i]));
        }
    }
    buf_free(x); buf_free(yr); buf_free(yv);
}
END_TEST

/* SLEEF transcendentals: a dense sweep of the f32 space through each variant
 * (the exhaustive check of exp/log/tanh/erf over all 2^32 inputs was done once
 * offline; this keeps a 1-in-4093 sample in the suite). */
START_TEST(test_parity_transcendental_sweep)
{
    bool ok;
    select_isa_or_skip(_i, &ok);
    if (!ok) return;
    enum { CH = 4096 };
    float *x = buf_alloc(CH), *b = buf_alloc(CH), *yr = buf_alloc(CH), *yv = buf_alloc(CH);
    static const ctpu_k_unary_op ops[] = { CTPU_K_U_EXP, CTPU_K_U_LOG, CTPU_K_U_TANH,
                                           CTPU_K_U_SIGMOID, CTPU_K_U_GELU_TANH, CTPU_K_U_GELU_ERF,
                                           CTPU_K_U_ERF, CTPU_K_U_SIN, CTPU_K_U_COS, CTPU_K_U_LOG1P,
                                           CTPU_K_U_EXPM1 };
    rng_seed(600 + (uint64_t)_i);
    for (uint64_t base = 0; base < (1ull << 32); base += (uint64_t)CH * 4093) {
        for (int i = 0; i < CH; i++) x[i] = bitsf((uint32_t)(base + (uint64_t)i * 4093 + 3));
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            ctpu_k_unary_ref(ops[k], x, yr, CH);
            ctpu_k_unary(ops[k], x, yv, CH);
            check_same(yr, yv, x, NULL, CH, unary_name[ops[k]], _i, PAT_BITS);
        }
        /* POW: this base sweep against random exponents of several kinds */
        for (int i = 0; i < CH; i++) {
            uint32_t r = rng_u32();
            b[i] = (r & 3) == 0 ? bitsf(rng_u32()) : (r & 3) == 1 ? (float)((int)(r >> 8) % 41 - 20)
                 : (r & 3) == 2 ? rng_unif(-3.0f, 3.0f) : edge_vals[(r >> 8) % N_EDGE];
        }
        ctpu_k_binary_ref(CTPU_K_B_POW, x, b, yr, CH);
        ctpu_k_binary(CTPU_K_B_POW, x, b, yv, CH);
        check_same(yr, yv, x, b, CH, "POW", _i, PAT_BITS);
        ctpu_k_binary_ref(CTPU_K_B_POW, b, x, yr, CH);
        ctpu_k_binary(CTPU_K_B_POW, b, x, yv, CH);
        check_same(yr, yv, b, x, CH, "POW", _i, PAT_BITS);
    }
    buf_free(x); buf_free(b); buf_free(yr); buf_free(yv);
}
END_TEST

/* ---- accuracy: _ref against float64 libm ---------------------------------------------
 * Distance in representable f32 values between _ref's result and the f32
 * nearest the float64 value (double rounding is innocuous for + - * / sqrt of
 * f32 operands, 53 >= 2*24+2). Tolerances:
 *   ADD SUB MUL DIV SQRT RECIP SQUARE: 0 (correctly rounded);
 *   RSQRT: 1 (two roundings);  EXP LOG POW: 1 (SLEEF u10: <= 1.0 ulp);  TANH: 1 (double
 *   steps rounded once: at most 1 over all 2^32 inputs, 1226 not correctly rounded);
 *   SIGMOID: 3 (exp, +, / each rounded);
 *   SOFTPLUS: 1 (measured over every f32 in [-120, 25]: at most 1);
 *   GELU_TANH: |err| <= 4 ulp(result) + |x| * 2^-23 (1 + tanh cancels near -1);
 *   GELU_ERF: 1 (double steps rounded once: within 1 over all 2^32 inputs);
 *   ERF SIN COS LOG1P EXPM1: 1 (SLEEF u10). */
static int64_t ford(float f)
{
    uint32_t u = fbits(f);
    return (u & 0x80000000u) ? -(int64_t)(u & 0x7fffffffu) : (int64_t)u;
}
static int64_t ulpdist(float a, double d)
{
    float f = (float)d;
    if (a != a || f != f) return (a != a && f != f) ? 0 : INT64_MAX;
    int64_t k = ford(a) - ford(f);
    return k < 0 ? -k : k;
}
static double ulp_at(double d)
{
    float f = fabsf((float)d);
    if (isinf(f)) return INFINITY;
    return (double)nextafterf(f, INFINITY) - (double)f;
}

static double ref_unary_d(int op, float xf)
{
    double x = xf;
    switch (op) {
    case CTPU_K_U_EXP: return exp(x);
    case CTPU_K_U_LOG: return log(x);
    case CTPU_K_U_TANH: return tanh(x);
    case CTPU_K_U_SQRT: return sqrt(x);
    case CTPU_K_U_RSQRT: return 1.0 / sqrt(x);
    case CTPU_K_U_RECIP: return 1.0 / x;
    case CTPU_K_U_SQUARE: return x * x;
    case CTPU_K_U_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case CTPU_K_U_SOFTPLUS: return x > 20 ? x : log1p(exp(x));
    case CTPU_K_U_GELU_TANH:
        return 0.5 * x * (1.0 + tanh((double)0.7978845608f * (x + (double)0.044715f * x * x * x)));
    case CTPU_K_U_GELU_ERF: return 0.5 * x * erfc(-x * 0.70710678118654752440);
    case CTPU_K_U_ERF: return erf(x);
    case CTPU_K_U_SIN: return sin(x);
    case CTPU_K_U_COS: return cos(x);
    case CTPU_K_U_LOG1P: return log1p(x);
    case CTPU_K_U_EXPM1: return expm1(x);
    default: return NAN;
    }
}

START_TEST(test_accuracy_unary)
{
    static const struct { int op; float lo, hi; int64_t tol; } cases[] = {
        { CTPU_K_U_EXP, -103.0f, 88.7f, 1 }, { CTPU_K_U_EXP, -2.0f, 2.0f, 1 },
        { CTPU_K_U_LOG, 0.0f, 1e30f, 1 }, { CTPU_K_U_LOG, 0.5f, 2.0f, 1 },
        { CTPU_K_U_TANH, -10.0f, 10.0f, 1 }, { CTPU_K_U_TANH, -0.01f, 0.01f, 1 },
        { CTPU_K_U_SQRT, 0.0f, 1e30f, 0 }, { CTPU_K_U_RSQRT, 1e-30f, 1e30f, 1 },
        { CTPU_K_U_RECIP, -1e30f, 1e30f, 0 }, { CTPU_K_U_SQUARE, -1e15f, 1e15f, 0 },
        { CTPU_K_U_SIGMOID, -80.0f, 80.0f, 3 }, { CTPU_K_U_SIGMOID, -5.0f, 5.0f, 3 },
        { CTPU_K_U_SOFTPLUS, -110.0f, 40.0f, 1 }, { CTPU_K_U_SOFTPLUS, -3.0f, 3.0f, 1 },
        { CTPU_K_U_SOFTPLUS, 19.0f, 21.0f, 1 },
        { CTPU_K_U_GELU_TANH, -12.0f, 12.0f, -1 }, { CTPU_K_U_GELU_TANH, -1.0f, 1.0f, -1 },
        { CTPU_K_U_GELU_ERF, -12.0f, 12.0f, 1 }, { CTPU_K_U_GELU_ERF, -1.0f, 1.0f, 1 },
        { CTPU_K_U_GELU_ERF, -12.0f, -3.0f, 1 }, { CTPU_K_U_GELU_ERF, -15.0f, -12.0f, 1 },
        { CTPU_K_U_ERF, -6.0f, 6.0f, 1 }, { CTPU_K_U_ERF, -0.01f, 0.01f, 1 },
        { CTPU_K_U_SIN, -10000.0f, 10000.0f, 1 }, { CTPU_K_U_SIN, -4.0f, 4.0f, 1 },
        { CTPU_K_U_COS, -10000.0f, 10000.0f, 1 }, { CTPU_K_U_COS, -4.0f, 4.0f, 1 },
        { CTPU_K_U_LOG1P, -0.999f, 1e30f, 1 }, { CTPU_K_U_LOG1P, -0.01f, 0.01f, 1 },
        { CTPU_K_U_EXPM1, -20.0f, 88.0f, 1 }, { CTPU_K_U_EXPM1, -0.01f, 0.01f, 1 },
    };
    enum { N = 20000 };
    static float x[N], y[N];
    rng_seed(700);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int op = cases[c].op;
        for (int i = 0; i < N; i++) {
            /* half uniform, half log-uniform in magnitude (for wide ranges) */
            float v = rng_unif(cases[c].lo, cases[c].hi);
            if ((i & 1) && cases[c].lo >= 0.0f && cases[c].hi > 4.0f)
                v = ldexpf(rng_unif(1.0f, 2.0f), (int)(rng_u32() % 200) - 100);
            if (v < cases[c].lo || v > cases[c].hi) v = cases[c].lo;
            x[i] = v;
        }
        ctpu_k_unary_ref((ctpu_k_unary_op)op, x, y, N);
        int64_t worst = 0;
        for (int i = 0; i < N; i++) {
            double d = ref_unary_d(op, x[i]);
            if (cases[c].tol >= 0) {
                int64_t u = ulpdist(y[i], d);
                if (u > worst) worst = u;
                CHECK_MSG(u <= cases[c].tol, "%s(%a): ref %a, float64 %a: %lld ulp > %lld",
                              unary_name[op], (double)x[i], (double)y[i], d, (long long)u,
                              (long long)cases[c].tol);
            } else {
                double tol = 4.0 * ulp_at(d) + fabs((double)x[i]) * 0x1p-23;
                CHECK_MSG(fabs((double)y[i] - d) <= tol, "%s(%a): ref %a, float64 %a",
                              unary_name[op], (double)x[i], (double)y[i], d);
            }
        }
        printf("accuracy %s [%g, %g]: max %lld ulp\n", unary_name[op], (double)cases[c].lo,
               (double)cases[c].hi, (long long)worst);
    }
    /* edge values against the float64 reference: exact classes */
    float e[N_EDGE], ye[N_EDGE];
    memcpy(e, edge_vals, sizeof e);
    static const int eops[] = { CTPU_K_U_EXP, CTPU_K_U_LOG, CTPU_K_U_TANH, CTPU_K_U_SQRT,
                                CTPU_K_U_RECIP, CTPU_K_U_SQUARE, CTPU_K_U_SIGMOID,
                                CTPU_K_U_SOFTPLUS };
    for (size_t k = 0; k < sizeof eops / sizeof eops[0]; k++) {
        ctpu_k_unary_ref((ctpu_k_unary_op)eops[k], e, ye, N_EDGE);
        for (int i = 0; i < N_EDGE; i++) {
            double d = ref_unary_d(eops[k], e[i]);
            int64_t u = ulpdist(ye[i], d);
            CHECK_MSG(u <= 3, "%s(%a): ref %a, float64 %a", unary_name[eops[k]], (double)e[i],
                          (double)ye[i], d);
        }
    }
}
END_TEST

START_TEST(test_accuracy_binary)
{
    enum { N = 20000 };
    static float a[N], b[N], y[N];
    rng_seed(800);
    for (int i = 0; i < N; i++) {
        a[i] = ldexpf(rng_unif(1.0f, 2.0f), (int)(rng_u32() % 120) - 60) * ((rng_u32() & 1) ? 1 : -1);
        b[i] = ldexpf(rng_unif(1.0f, 2.0f), (int)(rng_u32() % 120) - 60) * ((rng_u32() & 1) ? 1 : -1);
    }
    static const int exact[] = { CTPU_K_B_ADD, CTPU_K_B_SUB, CTPU_K_B_MUL, CTPU_K_B_DIV };
    for (size_t k = 0; k < 4; k++) {
        ctpu_k_binary_ref((ctpu_k_binary_op)exact[k], a, b, y, N);
        for (int i = 0; i < N; i++) {
            double A = a[i], B = b[i];
            double d = k == 0 ? A + B : k == 1 ? A - B : k == 2 ? A * B : A / B;
            CHECK_EQ(ulpdist(y[i], d), 0);
        }
    }
    /* POW: positive bases over a wide range, any exponent with a finite normal result;
     * negative bases with integer exponents. */
    for (int i = 0; i < N; i++) {
        if (i % 3 == 2) {
            a[i] = rng_unif(-10.0f, 10.0f);
            b[i] = (float)((int)(rng_u32() % 21) - 10);
        } else {
            a[i] = ldexpf(rng_unif(1.0f, 2.0f), (int)(rng_u32() % 40) - 20);
            b[i] = rng_unif(-6.0f, 6.0f);
        }
    }
    ctpu_k_binary_ref(CTPU_K_B_POW, a, b, y, N);
    for (int i = 0; i < N; i++) {
        double d = pow((double)a[i], (double)b[i]);
        if (fabs(d) > FLT_MAX || (d != 0 && fabs(d) < FLT_MIN)) continue;
        int64_t u = ulpdist(y[i], d);
        CHECK_MSG(u <= 1, "POW(%a, %a): ref %a, float64 %a: %lld ulp", (double)a[i],
                      (double)b[i], (double)y[i], d, (long long)u);
    }
    /* comparisons and min/max on their definitions */
    float p[] = { 1, 1, -0.0f, 0.0f, NAN, 2, 1, NAN }, q[] = { 1, 2, 0.0f, -0.0f, 1, NAN, -INFINITY, NAN };
    float r[8];
    static const float want[][8] = {
        /* EQ */ { 1, 0, 1, 1, 0, 0, 0, 0 },
        /* NE */ { 0, 1, 0, 0, 1, 1, 1, 1 },
        /* LT */ { 0, 1, 0, 0, 0, 0, 0, 0 },
        /* LE */ { 1, 1, 1, 1, 0, 0, 0, 0 },
        /* GT */ { 0, 0, 0, 0, 0, 0, 1, 0 },
        /* GE */ { 1, 0, 1, 1, 0, 0, 1, 0 },
    };
    for (int k = 0; k < 6; k++) {
        ctpu_k_binary_ref((ctpu_k_binary_op)(CTPU_K_B_EQ + k), p, q, r, 8);
        for (int i = 0; i < 8; i++) ck_assert(same(r[i], want[k][i]));
    }
    ctpu_k_binary_ref(CTPU_K_B_MAX, p, q, r, 8);
    const float wmax[8] = { 1, 2, 0.0f, -0.0f, NAN, NAN, 1, NAN };   /* ±0: the second */
    for (int i = 0; i < 8; i++) ck_assert(same(r[i], wmax[i]));
    ctpu_k_binary_ref(CTPU_K_B_MIN, p, q, r, 8);
    const float wmin[8] = { 1, 1, 0.0f, -0.0f, NAN, NAN, -INFINITY, NAN };
    for (int i = 0; i < 8; i++) ck_assert(same(r[i], wmin[i]));
    /* RELU of ±0, NaN */
    float rx[4] = { -0.0f, 0.0f, NAN, -1e-40f }, ry[4];
    ctpu_k_unary_ref(CTPU_K_U_RELU, rx, ry, 4);
    ck_assert_uint_eq(fbits(ry[0]), 0);
    ck_assert_uint_eq(fbits(ry[1]), 0);
    ck_assert(ry[2] != ry[2]);
    ck_assert_uint_eq(fbits(ry[3]), 0);
}
END_TEST

/* ---- known answers: bf16, f32 -> i32 --------------------------------------------- */
START_TEST(test_bf16_known_answers)
{
    static const struct { uint32_t in; uint16_t out; } kat[] = {
        { 0x3f800000, 0x3f80 },   /* 1.0 */
        { 0x3f808000, 0x3f80 },   /* 1.00390625: tie, even is down */
        { 0x3f818000, 0x3f82 },   /* 1.01171875: tie, even is up */
        { 0xbf808000, 0xbf80 },   /* -1.00390625 */
        { 0xbf818000, 0xbf82 },   /* -1.01171875 */
        { 0x3f808001, 0x3f81 },   /* just above a tie */
        { 0x3f817fff, 0x3f81 },   /* just below a tie */
        { 0x7f7fffff, 0x7f80 },   /* FLT_MAX -> +Inf */
        { 0xff7fffff, 0xff80 },   /* -FLT_MAX -> -Inf */
        { 0x7f7f8000, 0x7f80 },   /* tie at the top, even is Inf */
        { 0x7f7f7fff, 0x7f7f },   /* largest finite bf16 stays */
        { 0x7f800000, 0x7f80 },   /* +Inf */
        { 0xff800000, 0xff80 },   /* -Inf */
        { 0x00000000, 0x0000 },   /* +0 */
        { 0x80000000, 0x8000 },   /* -0 stays -0 */
        { 0x000116c2, 0x0000 },   /* 1e-40 (subnormal) -> +0 */
        { 0x800116c2, 0x8000 },   /* -1e-40 -> -0 */
        { 0x00000001, 0x0000 },   /* smallest subnormal */
        { 0x007f0000, 0x0000 },   /* bf16-subnormal result -> +0 */
        { 0x807f0000, 0x8000 },
        { 0x007fffff, 0x0080 },   /* rounds up to FLT_MIN: normal, kept */
        { 0x807f8000, 0x8080 },   /* tie between -0x007f (odd) and -FLT_MIN */
        { 0x00800000, 0x0080 },   /* FLT_MIN */
        { 0x40490fdb, 0x4049 },   /* pi */
        { 0xc0490fdb, 0xc049 },
        { 0x3eaaaaab, 0x3eab },   /* 1/3 */
    };
    float x[64];
    uint16_t y[64];
    int n = (int)(sizeof kat / sizeof kat[0]);
    for (int i = 0; i < n; i++) x[i] = bitsf(kat[i].in);
    for (int isa = 0; isa < CTPU_ISA_COUNT; isa++) {
        if (!ctpu_kernels_set_isa((ctpu_isa)isa)) continue;
        ctpu_k_f32_to_bf16(x, y, n);
        float r[64];
        ctpu_k_unary(CTPU_K_U_ROUND_BF16, x, r, n);
        for (int i = 0; i < n; i++) {
            ck_assert_msg(ctpu_f32_to_bf16(x[i]) == kat[i].out, "0x%08x -> 0x%04x, want 0x%04x",
                          kat[i].in, ctpu_f32_to_bf16(x[i]), kat[i].out);
            ck_assert_msg(y[i] == kat[i].out, "%s: 0x%08x -> 0x%04x, want 0x%04x",
                          ctpu_isa_name((ctpu_isa)isa), kat[i].in, y[i], kat[i].out);
            ck_assert_uint_eq(fbits(r[i]), (uint32_t)kat[i].out << 16);
        }
    }
    /* NaN stays a quiet NaN, sign kept (signalling and quiet, both signs) */
    static const uint32_t nans[] = { 0x7fc00000, 0x7f800001, 0xff800001, 0x7fbfffff, 0xffc00001, 0x7f80ffff, 0x7f800100 };
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = ctpu_f32_to_bf16(bitsf(nans[i]));
        ck_assert_uint_eq(h & 0x7f80, 0x7f80);
        ck_assert_uint_ne(h & 0x0040, 0);                    /* quiet bit */
        ck_assert_uint_eq(h & 0x8000, (nans[i] >> 16) & 0x8000);
        float f = ctpu_bf16_to_f32(h);
        ck_assert(f != f);
    }
    /* bf16 -> f32 */
    ck_assert_uint_eq(fbits(ctpu_bf16_to_f32(0x3f80)), 0x3f800000);
    ck_assert_uint_eq(fbits(ctpu_bf16_to_f32(0x8000)), 0x80000000);
    ck_assert(isinf(ctpu_bf16_to_f32(0xff80)) && ctpu_bf16_to_f32(0xff80) < 0);
}
END_TEST

START_TEST(test_f32_to_i32_known_answers)
{
    static const struct { float in; int32_t out; } kat[] = {
        { 0.0f, 0 }, { -0.0f, 0 }, { 1.9f, 1 }, { -1.9f, -1 }, { 0.5f, 0 }, { -0.5f, 0 },
        { 1e-40f, 0 }, { 2147483520.0f, 2147483520 }, { -2147483520.0f, -2147483520 },
        { 2147483648.0f, INT32_MAX }, { -2147483648.0f, INT32_MIN }, { 3e9f, INT32_MAX },
        { -3e9f, INT32_MIN }, { INFINITY, INT32_MAX }, { -INFINITY, INT32_MIN },
        { NAN, 0 }, { -NAN, 0 }, { FLT_MAX, INT32_MAX }, { -FLT_MAX, INT32_MIN },
        { 16777217.0f, 16777216 }, { -123456.75f, -123456 },
    };
    int n = (int)(sizeof kat / sizeof kat[0]);
    float x[32];
    int32_t y[32];
    for (int i = 0; i < n; i++) x[i] = kat[i].in;
    x[n] = bitsf(0x7f800001); /* signalling NaN */
    for (int isa = 0; isa < CTPU_ISA_COUNT; isa++) {
        if (!ctpu_kernels_set_isa((ctpu_isa)isa)) continue;
        ctpu_k_f32_to_i32(x, y, n + 1);
        for (int i = 0; i < n; i++) {
            ck_assert_int_eq(ctpu_f32_to_i32(x[i]), kat[i].out);
            ck_assert_msg(y[i] == kat[i].out, "%s: %a -> %d, want %d", ctpu_isa_name((ctpu_isa)isa),
                          (double)x[i], y[i], kat[i].out);
        }
        ck_assert_int_eq(y[n], 0);
    }
    int32_t iv[6] = { 0, 1, -1, INT32_MAX, INT32_MIN, 16777217 };
    float f[6];
    ctpu_k_i32_to_f32(iv, f, 6);
    ck_assert(f[3] == 2147483648.0f && f[4] == -2147483648.0f && f[5] == 16777216.0f);
}
END_TEST

/* ---- Philox and draws -------------------------------------------------------------- */
START_TEST(test_philox_kat)
{
    /* Random123 kat_vectors: philox4x32 10 ctr[4] key[2] -> out[4] */
    static const uint32_t kat[3][10] = {
        { 0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 },
        { 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
          0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd },
        { 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
          0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 },
    };
    for (int k = 0; k < 3; k++) {
        uint32_t out[4];
        ctpu_k_philox4x32_raw(&kat[k][0], &kat[k][4], out);
        for (int j = 0; j < 4; j++) ck_assert_uint_eq(out[j], kat[k][6 + j]);
    }
    uint32_t a[4], b[4];
    ctpu_k_philox4x32(0, 0, a);
    for (int j = 0; j < 4; j++) ck_assert_uint_eq(a[j], kat[0][6 + j]);
    /* the 64-bit counter and seed map to words {lo, hi} */
    ctpu_k_philox4x32(0xa4093822299f31d0ull, 0x85a308d3243f6a88ull, a);
    const uint32_t ctr[4] = { 0x243f6a88, 0x85a308d3, 0, 0 }, key[2] = { 0x299f31d0, 0xa4093822 };
    ctpu_k_philox4x32_raw(ctr, key, b);
    for (int j = 0; j < 4; j++) ck_assert_uint_eq(a[j], b[j]);
}
END_TEST

/* Every SIMD variant of the random kernels equals the reference bit for bit:
 * counters across the low word's wrap, every tail length, odd starts; and the
 * SLEEF functions they use give purec's bits on their whole input domain. */
START_TEST(test_random_parity)
{
    int isa = _i;
    const ctpu_k_rand_variant *v = ctpu_k_rand_variant_of((ctpu_isa)isa);
    ck_assert_ptr_nonnull(v);
    if (!ctpu_k_cpu_has((ctpu_isa)isa) || isa == CTPU_ISA_SCALAR) return;
    enum { N = 1100 };
    static float ref[N + GUARD], got[N + GUARD];
    const uint64_t seeds[] = { 0, 0x1234567890abcdefull, 0xffffffffffffffffull };
    const uint64_t offs[] = { 0, 987654321ull, 0xfffffff0ull, 0x1fffffffbull, 0xfffffffffffffff0ull };
    for (size_t si = 0; si < 3; si++)
        for (size_t oi = 0; oi < 5; oi++)
            for (int64_t n = 0; n <= N; n += n < 40 ? 1 : 151) {
                int64_t start = (int64_t)(n % 7);
                for (int normal = 0; normal < 2; normal++) {
                    guard_set(got, n);
                    if (normal) {
                        ctpu_k_rand_normal_ref(seeds[si], offs[oi], start, n, 0.25f, 3.0f, ref);
                        v->normal(seeds[si], offs[oi], start, n, 0.25f, 3.0f, got);
                    } else {
                        ctpu_k_rand_uniform_ref(seeds[si], offs[oi], start, n, -1.5f, 2.5f, ref);
                        v->uniform(seeds[si], offs[oi], start, n, -1.5f, 2.5f, got);
                    }
                    for (int64_t i = 0; i < n; i++)
                        CHECK_MSG(fbits(ref[i]) == fbits(got[i]), "%s isa=%s seed=%llx off=%llx n=%lld i=%lld: "
                                  "ref %a got %a", normal ? "normal" : "uniform", ctpu_isa_name((ctpu_isa)isa),
                                  (unsigned long long)seeds[si], (unsigned long long)offs[oi], (long long)n,
                                  (long long)i, (double)ref[i], (double)got[i]);
                    guard_check(got, n, normal ? "rand_normal" : "rand_uniform");
                }
            }
    ck_assert_int_eq(v->domain_mismatches(), 0);
    /* the dispatched entry points follow the selected ISA */
    bool ok;
    select_isa_or_skip(isa, &ok);
    ctpu_k_rand_normal(seeds[1], offs[1], 3, N, 0.0f, 1.0f, got);
    ctpu_k_rand_normal_ref(seeds[1], offs[1], 3, N, 0.0f, 1.0f, ref);
    for (int64_t i = 0; i < N; i++) CHECK_EQ(fbits(ref[i]), fbits(got[i]));
    ctpu_kernels_set_isa(CTPU_ISA_SCALAR);
}
END_TEST

START_TEST(test_random_split_invariance)
{
    enum { N = 3001 };
    static float whole[N], parts[N], wn[N], pn[N];
    const uint64_t seed = 0x1234567890abcdefull, off = 987654321ull;
    ctpu_k_rand_uniform(seed, off, 0, N, -1.5f, 2.5f, whole);
    ctpu_k_rand_normal(seed, off, 0, N, 0.25f, 3.0f, wn);
    rng_seed(900);
    for (int64_t s = 0; s < N;) {
        int64_t k = 1 + (int64_t)(rng_u32() % 700);
        if (s + k > N) k = N - s;
        ctpu_k_rand_uniform(seed, off, s, k, -1.5f, 2.5f, parts + s);
        ctpu_k_rand_normal(seed, off, s, k, 0.25f, 3.0f, pn + s);
        s += k;
    }
    /* pieces in reverse order too */
    for (int64_t s = N; s > 0;) {
        int64_t k = s >= 97 ? 97 : s;
        s -= k;
        float tmp[97];
        ctpu_k_rand_uniform(seed, off, s, k, -1.5f, 2.5f, tmp);
        for (int64_t j = 0; j < k; j++) CHECK_EQ(fbits(tmp[j]), fbits(whole[s + j]));
    }
    for (int i = 0; i < N; i++) {
        CHECK_EQ(fbits(whole[i]), fbits(parts[i]));
        CHECK_EQ(fbits(wn[i]), fbits(pn[i]));
    }
    /* (offset, start) only matter through offset + start */
    float sh[100];
    ctpu_k_rand_uniform(seed, off + 500, 0, 100, -1.5f, 2.5f, sh);
    for (int i = 0; i < 100; i++) ck_assert_uint_eq(fbits(sh[i]), fbits(whole[500 + i]));
    /* element i is the documented formula */
    for (int i = 0; i < N; i += 37) {
        uint32_t w[4];
        ctpu_k_philox4x32(seed, off + (uint64_t)i, w);
        float u = (float)(w[0] >> 8) * 0x1p-24f;
        CHECK_EQ(fbits(whole[i]), fbits(-1.5f + (2.5f - -1.5f) * u));
    }
    /* another seed or offset gives other numbers */
    ctpu_k_rand_uniform(seed + 1, off, 0, 100, -1.5f, 2.5f, sh);
    int diff = 0;
    for (int i = 0; i < 100; i++) diff += fbits(sh[i]) != fbits(whole[i]);
    ck_assert_int_gt(diff, 95);
}
END_TEST

START_TEST(test_random_distributions)
{
    enum { N = 100000 };
    static float y[N];
    ctpu_k_rand_uniform(7, 0, 0, N, 0.0f, 1.0f, y);
    double s = 0, s2 = 0;
    for (int i = 0; i < N; i++) {
        CHECK(y[i] >= 0.0f && y[i] < 1.0f);
        s += y[i];
    }
    ck_assert(fabs(s / N - 0.5) < 0.005);
    ctpu_k_rand_uniform(7, 123, 0, N, -3.0f, 5.0f, y);
    for (int i = 0; i < N; i++) CHECK(y[i] >= -3.0f && y[i] <= 5.0f);
    ctpu_k_rand_normal(11, 0, 0, N, 0.0f, 1.0f, y);
    s = 0;
    int beyond3 = 0;
    for (int i = 0; i < N; i++) {
        CHECK(isfinite(y[i]));
        s += y[i];
        s2 += (double)y[i] * y[i];
        beyond3 += fabsf(y[i]) > 3.0f;
    }
    double mean = s / N, sd = sqrt(s2 / N - mean * mean);
    ck_assert_msg(fabs(mean) < 0.015, "normal mean %g", mean);
    ck_assert_msg(fabs(sd - 1.0) < 0.015, "normal std %g", sd);
    ck_assert_msg(beyond3 > 200 && beyond3 < 350, "|z|>3: %d (expect ~270)", beyond3);
    ctpu_k_rand_normal(11, 5, 0, N, 3.0f, 2.0f, y);
    s = s2 = 0;
    for (int i = 0; i < N; i++) { s += y[i]; s2 += (double)y[i] * y[i]; }
    mean = s / N; sd = sqrt(s2 / N - mean * mean);
    ck_assert(fabs(mean - 3.0) < 0.03 && fabs(sd - 2.0) < 0.03);
}
END_TEST

/* ---- movement ------------------------------------------------------------------------- */
START_TEST(test_embedding)
{
    enum { V = 10, D = 7 };
    float w[V * D];
    uint16_t wh[V * D];
    for (int i = 0; i < V * D; i++) { w[i] = (float)i + 0.5f; wh[i] = (uint16_t)(i * 3 + 1); }
    int32_t idx[] = { 3, 0, 9, -1, 10, 5, INT32_MIN, INT32_MAX, 9 };
    int n = (int)(sizeof idx / sizeof idx[0]);
    float out[16 * D];
    uint16_t outh[16 * D];
    for (int i = 0; i < 16 * D; i++) { out[i] = -7.0f; outh[i] = 0xeeee; }
    int64_t pos = 99, val = 99;
    ck_assert_int_eq(ctpu_k_embedding(w, V, D, 4, idx, n, out, &pos, &val), 4);
    ck_assert_int_eq(pos, 3);
    ck_assert_int_eq(val, -1);
    for (int i = 0; i < n; i++)
        for (int d = 0; d < D; d++) {
            bool bad = idx[i] < 0 || idx[i] >= V;
            float want = bad ? 0.0f : w[idx[i] * D + d];
            ck_assert_uint_eq(fbits(out[i * D + d]), fbits(want));
        }
    ck_assert(out[n * D] == -7.0f);   /* nothing past the end */
    ck_assert_int_eq(ctpu_k_embedding(wh, V, D, 2, idx + 4, 3, outh, &pos, &val), 2);
    ck_assert_int_eq(pos, 0);
    ck_assert_int_eq(val, 10);
    for (int d = 0; d < D; d++) {
        ck_assert_uint_eq(outh[d], 0);
        ck_assert_uint_eq(outh[D + d], wh[5 * D + d]);
        ck_assert_uint_eq(outh[2 * D + d], 0);
    }
    ck_assert_uint_eq(outh[3 * D], 0xeeee);
    /* all good; empty; first bad value INT32_MAX */
    ck_assert_int_eq(ctpu_k_embedding(w, V, D, 4, idx, 3, out, &pos, &val), 0);
    ck_assert_int_eq(pos, -1);
    ck_assert_int_eq(ctpu_k_embedding(w, V, D, 4, idx, 0, out, &pos, &val), 0);
    ck_assert_int_eq(ctpu_k_embedding(w, V, D, 4, idx + 7, 1, out, &pos, &val), 1);
    ck_assert_int_eq(val, INT32_MAX);
    ck_assert_int_eq(ctpu_k_embedding(w, V, D, 4, idx + 6, 1, out, NULL, NULL), 1);
    ck_assert_int_eq(val, INT32_MAX);
    ck_assert(out[0] == 0.0f);
    /* V == 0: every index is bad */
    ck_assert_int_eq(ctpu_k_embedding(NULL, 0, D, 4, idx, 2, out, &pos, &val), 2);
    ck_assert_int_eq(val, 3);
}
END_TEST

static void naive_copy(const char *src, const int64_t *ss, char *dst, const int64_t *ds,
                       const int64_t *shape, int ndim, size_t esize)
{
    int64_t total = 1;
    for (int k = 0; k < ndim; k++) total *= shape[k];
    for (int64_t lin = 0; lin < total; lin++) {
        int64_t r = lin, so = 0, dof = 0;
        for (int k = ndim - 1; k >= 0; k--) {
            int64_t i = r % shape[k];
            r /= shape[k];
            so += i * ss[k];
            dof += i * ds[k];
        }
        memcpy(dst + dof * (int64_t)esize, src + so * (int64_t)esize, esize);
    }
}

START_TEST(test_strided_copy)
{
    rng_seed(1000);
    static const size_t esizes[] = { 1, 2, 3, 4, 8 };
    for (int iter = 0; iter < 3000; iter++) {
        int ndim = iter % 50 == 0 ? 8 : (int)(rng_u32() % 6);
        size_t es = esizes[rng_u32() % 5];
        int64_t shape[8], ss[8], ds[8];
        int perm[8];
        for (int k = 0; k < ndim; k++) {
            uint32_t r = rng_u32() % 16;
            shape[k] = ndim == 8 ? 1 + (int64_t)(r % 3) : r == 0 && iter % 7 == 0 ? 0 : 1 + (int64_t)(r % 9);
            perm[k] = k;
        }
        for (int k = ndim - 1; k > 0; k--) {        /* source dims in a random order */
            if (rng_u32() & 1) continue;
            int j = (int)(rng_u32() % (uint32_t)(k + 1));
            int t = perm[k]; perm[k] = perm[j]; perm[j] = t;
        }
        int64_t st = 1;                              /* src: permuted, padded, broadcast */
        for (int q = ndim - 1; q >= 0; q--) {
            int k = perm[q];
            ss[k] = (rng_u32() % 5 == 0) ? 0 : st;
            st *= shape[k] + (int64_t)(rng_u32() % 3 == 0);
        }
        int64_t src_n = st + 1;
        st = 1;                                      /* dst: row-major, maybe padded */
        for (int k = ndim - 1; k >= 0; k--) {
            ds[k] = st;
            st *= shape[k] + (int64_t)(rng_u32() % 4 == 0);
        }
        int64_t dst_n = st + 1;
        char *src = malloc((size_t)src_n * es), *d1 = malloc((size_t)dst_n * es), *d2 = malloc((size_t)dst_n * es);
        for (int64_t i = 0; i < src_n * (int64_t)es; i++) src[i] = (char)rng_u32();
        memset(d1, 0x77, (size_t)dst_n * es);
        memset(d2, 0x77, (size_t)dst_n * es);
        naive_copy(src, ss, d1, ds, shape, ndim, es);
        ctpu_k_strided_copy(src, ss, d2, ds, shape, ndim, es);
        CHECK_MSG(memcmp(d1, d2, (size_t)dst_n * es) == 0, "strided copy iter %d ndim %d esize %zu",
                      iter, ndim, es);
        free(src); free(d1); free(d2);
    }
    /* a transpose and a contiguous slice of rows, f32 */
    float a[6 * 5], t[5 * 6];
    for (int i = 0; i < 30; i++) a[i] = (float)i;
    int64_t sh[2] = { 5, 6 }, sst[2] = { 1, 5 }, dst_st[2] = { 6, 1 };
    ctpu_k_strided_copy(a, sst, t, dst_st, sh, 2, 4);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 6; j++) ck_assert(t[i * 6 + j] == a[j * 5 + i]);
}
END_TEST

/* ---- the fused tape: ctpu_k_tape equals ctpu_k_tape_ref ---------------------------
 * Random tapes over 3 operand arrays and 3 register arrays: every kind and
 * op, sources from the previous result or any array, register stores read
 * back later, outputs f32, non-temporal (aligned and not) and bf16, round to
 * bf16, at every size of `sizes` (full strips, vector tails, masked tails). */
#define TAPE_VALS 6
static void tape_random(ctpu_k_tape_ins *ins, int n_ins, int n_out)
{
    for (int q = 0; q < n_ins; q++) {
        ctpu_k_tape_ins *in = &ins[q];
        memset(in, 0, sizeof *in);
        in->kind = (uint8_t)(rng_u32() % CTPU_K_T_COUNT);
        in->kop = (uint8_t)(rng_u32() % (in->kind == CTPU_K_T_UNARY ? CTPU_K_U_COUNT : CTPU_K_B_COUNT));
        int8_t *src[3] = { &in->a, &in->b, &in->c };
        for (int k = 0; k < 3; k++) *src[k] = (int8_t)(q > 0 && rng_u32() % 2 ? -1 : (int)(rng_u32() % TAPE_VALS));
        in->round_bf16 = rng_u32() % 4 == 0;
        in->dst = (int8_t)(rng_u32() % 3 == 0 ? 3 + (int)(rng_u32() % 3) : -1);
        in->out = (int8_t)(rng_u32() % 3 == 0 ? (int)(rng_u32() % (uint32_t)n_out) : -1);
        in->s0 = edge_vals[rng_u32() % N_EDGE];
        in->s1 = rng_u32() % 2 ? edge_vals[rng_u32() % N_EDGE] : in->s0 + 1.0f;
        if (rng_u32() % 2) in->s0 = rng_unif(-4.0f, 4.0f);
    }
}

START_TEST(test_parity_tape)
{
    bool ok;
    select_isa_or_skip(_i, &ok);
    if (!ok) return;
    ctpu_k_tape_ins probe = { .kind = CTPU_K_T_FILL, .a = -1, .b = -1, .c = -1, .dst = 0, .out = -1, .s0 = 1.0f };
    float *v0 = buf_alloc(MAXN);
    bool has = ctpu_k_tape(&probe, 1, &v0, NULL, 3);
    ck_assert(has == (_i != CTPU_ISA_SCALAR));   /* every SIMD variant has one */
    if (!has) { buf_free(v0); return; }
    ck_assert(v0[0] == 1.0f && v0[2] == 1.0f);
    buf_free(v0);
    float *init[TAPE_VALS], *vr[TAPE_VALS], *vv[TAPE_VALS];
    for (int k = 0; k < TAPE_VALS; k++) { init[k] = buf_alloc(MAXN); vr[k] = buf_alloc(MAXN); vv[k] = buf_alloc(MAXN); }
    /* outputs: f32, streamed unaligned (+1 float), streamed aligned, bf16 */
    enum { NO = 4 };
    float *of_r = buf_alloc(MAXN), *of_v = buf_alloc(MAXN), *os_r = buf_alloc(MAXN), *os_v = buf_alloc(MAXN);
    float *oa_r = aligned_alloc(64, (MAXN + GUARD + 15) / 16 * 64 + 64), *oa_v = aligned_alloc(64, (MAXN + GUARD + 15) / 16 * 64 + 64);
    uint16_t *ob_r = malloc((MAXN + GUARD) * 2), *ob_v = malloc((MAXN + GUARD) * 2);
    ck_assert(oa_r && oa_v && ob_r && ob_v);
    rng_seed(900 + (uint64_t)_i);
    for (int iter = 0; iter < 300; iter++) {
        int64_t n = sizes[iter % N_SIZES];
        int n_ins = 1 + (int)(rng_u32() % 24);
        ctpu_k_tape_ins ins[24];
        tape_random(ins, n_ins, NO);
        for (int k = 0; k < TAPE_VALS; k++) fill(init[k], n, (int)(rng_u32() % PAT_COUNT));
        for (int k = 0; k < TAPE_VALS; k++) {
            memcpy(vr[k], init[k], (size_t)n * 4);
            memcpy(vv[k], init[k], (size_t)n * 4);
            guard_set(vv[k], n);
        }
        memset(of_r, 0, (size_t)n * 4); memset(of_v, 0, (size_t)n * 4); memset(os_r, 0, (size_t)n * 4);
        memset(os_v, 0, (size_t)n * 4); memset(oa_r, 0, (size_t)n * 4); memset(oa_v, 0, (size_t)n * 4);
        memset(ob_r, 0, (size_t)n * 2); memset(ob_v, 0, (size_t)n * 2);
        guard_set(of_v, n); guard_set(os_v, n); guard_set(oa_v, n);
        for (int g = 0; g < GUARD; g++) ob_v[n + g] = 0x5a5a;
        ctpu_k_tape_out outr[NO] = { { of_r, CTPU_K_TO_F32 }, { os_r, CTPU_K_TO_F32_STREAM },
                                     { oa_r, CTPU_K_TO_F32_STREAM }, { ob_r, CTPU_K_TO_BF16 } };
        ctpu_k_tape_out outv[NO] = { { of_v, CTPU_K_TO_F32 }, { os_v, CTPU_K_TO_F32_STREAM },
                                     { oa_v, CTPU_K_TO_F32_STREAM }, { ob_v, CTPU_K_TO_BF16 } };
        ck_assert(ctpu_k_tape_ref(ins, n_ins, vr, outr, n));
        ck_assert(ctpu_k_tape(ins, n_ins, vv, outv, n));
        ctpu_k_stream_fence();
        char what[64];
        snprintf(what, sizeof what, "tape iter %d (%d ins)", iter, n_ins);
        for (int k = 0; k < TAPE_VALS; k++) {
            guard_check(vv[k], n, what);
            check_same(vr[k], vv[k], init[0], NULL, n, what, _i, 0);
        }
        guard_check(of_v, n, what); guard_check(os_v, n, what); guard_check(oa_v, n, what);
        check_same(of_r, of_v, init[0], NULL, n, what, _i, 0);
        check_same(os_r, os_v, init[0], NULL, n, what, _i, 0);
        check_same(oa_r, oa_v, init[0], NULL, n, what, _i, 0);
        for (int64_t j = 0; j < n; j++)
            CHECK_MSG(ob_r[j] == ob_v[j] || (same(bitsf((uint32_t)ob_r[j] << 16), bitsf((uint32_t)ob_v[j] << 16))),
                      "%s: bf16 output %lld: 0x%04x vs 0x%04x", what, (long long)j, ob_r[j], ob_v[j]);
        for (int g = 0; g < GUARD; g++) CHECK_MSG(ob_v[n + g] == 0x5a5a, "%s: bf16 output past the end", what);
    }
    for (int k = 0; k < TAPE_VALS; k++) { buf_free(init[k]); buf_free(vr[k]); buf_free(vv[k]); }
    buf_free(of_r); buf_free(of_v); buf_free(os_r); buf_free(os_v);
    free(oa_r); free(oa_v); free(ob_r); free(ob_v);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("k_elementwise");
    TCase *tc = tcase_create("isa");
    tcase_add_test(tc, test_isa_basics);
    tcase_add_test(tc, test_default_table);
    tcase_add_test(tc, test_variant_tables_complete);
    suite_add_tcase(s, tc);

    tc = tcase_create("parity");
    tcase_set_timeout(tc, 240);
    tcase_add_loop_test(tc, test_parity_unary, 0, CTPU_ISA_COUNT);
    tcase_add_loop_test(tc, test_parity_binary, 0, CTPU_ISA_COUNT);
    tcase_add_loop_test(tc, test_parity_binary_scalar, 0, CTPU_ISA_COUNT);
    tcase_add_loop_test(tc, test_parity_where_clamp, 0, CTPU_ISA_COUNT);
    tcase_add_loop_test(tc, test_parity_conversions, 0, CTPU_ISA_COUNT);
    tcase_add_loop_test(tc, test_parity_sweep, 0, CTPU_ISA_COUNT);
    tcase_add_loop_test(tc, test_parity_transcendental_sweep, 0, CTPU_ISA_COUNT);
    tcase_add_loop_test(tc, test_random_parity, 0, CTPU_ISA_COUNT);
    tcase_add_loop_test(tc, test_parity_tape, 0, CTPU_ISA_COUNT);
    suite_add_tcase(s, tc);

    tc = tcase_create("numerics");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_accuracy_unary);
    tcase_add_test(tc, test_accuracy_binary);
    tcase_add_test(tc, test_bf16_known_answers);
    tcase_add_test(tc, test_f32_to_i32_known_answers);
    suite_add_tcase(s, tc);

    tc = tcase_create("random");
    tcase_add_test(tc, test_philox_kat);
    tcase_add_test(tc, test_random_split_invariance);
    tcase_add_test(tc, test_random_distributions);
    suite_add_tcase(s, tc);

    tc = tcase_create("movement");
    tcase_add_test(tc, test_embedding);
    tcase_add_test(tc, test_strided_copy);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
