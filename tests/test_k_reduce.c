/* Reductions, argmax, sqdev and softmax kernels (src/kernels/reduce*.c).
 *
 * - every ISA the CPU has equals `_ref` bit for bit (NaN as a class), over
 *   shapes [outer, n, inner] with n around the lane (16) and chunk (4096)
 *   boundaries, and data with NaN, +-Inf, +-0;
 * - thread counts 1, 2, 3, 7 give the same bits (both column and chunk splits);
 * - `_ref` itself: known-answer tests of the order (lane tree, chunk tree)
 *   that a naive left-to-right sum gets wrong, an independent literal
 *   implementation of kernels.h's level-by-level chunk tree, and the sum
 *   against float64 within the error bound of the tree's depth;
 * - softmax rows sum to 1, log_softmax is stable for 1e8 and -inf entries;
 * - n == 0 gives the identity (sum +0, max -Inf, min +Inf); argmax ties and NaN.
 *
 * ISAs are selected through ctpu_k_reduce_select (the family's own table),
 * so this suite does not depend on isa.c. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "k_pool.h"

/* ---- helpers ------------------------------------------------------------------ */
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static bool same(float a, float b) { return (a != a && b != b) || f2u(a) == f2u(b); }

static bool isa_ok(int isa)
{
    __builtin_cpu_init();
    switch (isa) {
    case CTPU_ISA_SCALAR: return true;
    case CTPU_ISA_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CTPU_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    default: return false;
    }
}
static const char *isa_str[] = { "scalar", "avx2", "avx512" };

static uint64_t rng_s = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_s ^= rng_s << 13; rng_s ^= rng_s >> 7; rng_s ^= rng_s << 17;
    return rng_s;
}
static float urand(void) { return (float)((rnd() >> 40) * 0x1p-24) * 2.0f - 1.0f; } /* [-1, 1) */

enum { D_PLAIN, D_ZEROS, D_INF, D_NAN, D_WIDE, D_COUNT };
static const char *dstr[] = { "plain", "zeros", "inf", "nan", "wide" };

/* Fill n values: plain random of mixed magnitude, or {+0,-0,-1} (max sign
 * tests), or with +-Inf sprinkled, or with a few NaN and Inf, or a wide
 * range [-120, 5] (exp underflow). */
static void fill(float *x, int64_t n, int mode)
{
    for (int64_t i = 0; i < n; i++) {
        static const float scale[9] = { 0x1p-4f, 0x1p-3f, 0x1p-2f, 0x1p-1f, 1.0f,
                                        2.0f, 4.0f, 8.0f, 16.0f };
        float v = urand() * scale[rnd() % 9];
        switch (mode) {
        case D_ZEROS: { int r = (int)(rnd() % 3); v = r == 0 ? 0.0f : r == 1 ? -0.0f : -1.0f; } break;
        case D_INF: if (rnd() % 997 == 0) v = (rnd() & 1) ? INFINITY : -INFINITY; break;
        case D_WIDE: v = urand() * 62.5f - 57.5f; break;
        default: break;
        }
        x[i] = v;
    }
    if (mode == D_NAN && n > 0)
        for (int k = 0; k < 3; k++) {
            x[rnd() % (uint64_t)n] = NAN;
            x[rnd() % (uint64_t)n] = (rnd() & 1) ? INFINITY : -INFINITY;
        }
}

static const int64_t Ns[] = { 0, 1, 15, 16, 17, 4095, 4096, 4097, 3 * 4096 + 5, 40000 };
static const int64_t INNERs[] = { 1, 3, 16, 17 };
static const int64_t OUTERs[] = { 0, 1, 5 };
static const int THREADS[] = { 1, 2, 3, 7 };
#define LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

static float *fbuf(int64_t n) { float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float)); ck_assert_ptr_nonnull(p); return p; }

/* Compare y against want; report the first mismatch. */
static void check_same(const float *want, const float *got, int64_t cnt, const char *what,
                       int isa, int op, int nt, int64_t outer, int64_t n, int64_t inner, int mode)
{
    for (int64_t i = 0; i < cnt; i++)
        if (!same(want[i], got[i]))
            ck_abort_msg("%s isa=%s op=%d threads=%d shape=[%lld,%lld,%lld] data=%s: y[%lld] = "
                         "%a (0x%08x), ref %a (0x%08x)", what, isa_str[isa], op, nt,
                         (long long)outer, (long long)n, (long long)inner, dstr[mode],
                         (long long)i, got[i], f2u(got[i]), want[i], f2u(want[i]));
}

/* ---- ISA and thread parity ---------------------------------------------------- */
/* One shape: every op (sqdev too) at every thread count against _ref. */
static void parity_case(int isa, int mode, int64_t outer, int64_t n, int64_t inner)
{
    int64_t cols = outer * inner;
    float *x = fbuf(outer * n * inner), *mean = fbuf(cols);
    float *want = fbuf(cols), *got = fbuf(cols);
    fill(x, outer * n * inner, mode);
    for (int op = 0; op <= CTPU_K_RED_COUNT; op++) {   /* COUNT = sqdev */
        if (op == CTPU_K_RED_COUNT) {
            ctpu_k_reduce_ref(CTPU_K_RED_SUM, x, outer, n, inner, mean);
            for (int64_t i = 0; i < cols; i++) mean[i] = n ? mean[i] / (float)n : 0.0f;
            ctpu_k_sqdev_ref(x, mean, outer, n, inner, want);
        } else {
            ctpu_k_reduce_ref((ctpu_k_red_op)op, x, outer, n, inner, want);
        }
        for (int t = 0; t < LEN(THREADS); t++) {
            ctpu_k_pool p = k_pool_make(THREADS[t]);
            for (int64_t i = 0; i < cols; i++) got[i] = 12345.0f;
            if (op == CTPU_K_RED_COUNT)
                ctpu_k_sqdev(x, mean, outer, n, inner, got, t ? &p : NULL);
            else
                ctpu_k_reduce((ctpu_k_red_op)op, x, outer, n, inner, got, t ? &p : NULL);
            check_same(want, got, cols, op == CTPU_K_RED_COUNT ? "sqdev" : "reduce",
                       isa, op, THREADS[t], outer, n, inner, mode);
        }
    }
    free(x); free(mean); free(want); free(got);
}

/* _i = isa * D_COUNT + data mode */
START_TEST(reduce_parity)
{
    int isa = _i / D_COUNT, mode = _i % D_COUNT;
    if (!isa_ok(isa)) { fprintf(stderr, "skip: CPU lacks %s\n", isa_str[isa]); return; }
    ctpu_k_reduce_select((ctpu_isa)isa);
    for (int a = 0; a < LEN(Ns); a++)
        for (int b = 0; b < LEN(INNERs); b++)
            for (int c = 0; c < LEN(OUTERs); c++) parity_case(isa, mode, OUTERs[c], Ns[a], INNERs[b]);
}
END_TEST

/* Wide rows (bias gradients: [B*T, C] summed over rows): the SIMD colv
 * sweeps up to 128 columns at once; widths around its groups (W = 8 / 16
 * lanes) and sweeps (128), several chunks, the last group partial. */
START_TEST(reduce_wide_parity)
{
    int isa = _i / D_COUNT, mode = _i % D_COUNT;
    if (!isa_ok(isa)) return;
    ctpu_k_reduce_select((ctpu_isa)isa);
    static const int64_t wn[] = { 1, 17, 4097, 2 * 4096 + 5 };
    static const int64_t wi[] = { 24, 33, 128, 130, 300 };
    for (int a = 0; a < LEN(wn); a++)
        for (int b = 0; b < LEN(wi); b++) parity_case(isa, mode, a == 1 ? 3 : 1, wn[a], wi[b]);
}
END_TEST

/* Short columns, many of them (a weight gradient's sum over a batch of 2:
 * [2, 32, 128] -> [1, 32, 128]): whole columns go to the kernel thousands at
 * a time and a column shorter than the 16 lanes skips the lane loops; every
 * data mode (signed zeros, Inf, NaN) against the reference. */
START_TEST(reduce_short_wide)
{
    int isa = _i;
    if (!isa_ok(isa)) return;
    ctpu_k_reduce_select((ctpu_isa)isa);
    const int64_t shapes[][3] = { { 1, 2, 4096 }, { 3, 2, 300 }, { 2, 5, 4099 }, { 1, 15, 9000 }, { 1, 16, 33 },
                                  { 4, 1, 70 } };
    for (int s = 0; s < LEN(shapes); s++)
        for (int mode = 0; mode < D_COUNT; mode++) {
            int64_t outer = shapes[s][0], n = shapes[s][1], inner = shapes[s][2], cols = outer * inner;
            float *x = fbuf(outer * n * inner), *mean = fbuf(cols), *want = fbuf(cols), *got = fbuf(cols);
            fill(x, outer * n * inner, mode);
            ctpu_k_reduce_ref(CTPU_K_RED_SUM, x, outer, n, inner, mean);
            for (int op = 0; op <= CTPU_K_RED_COUNT; op++) {   /* CTPU_K_RED_COUNT: sqdev */
                if (op == CTPU_K_RED_COUNT) ctpu_k_sqdev_ref(x, mean, outer, n, inner, want);
                else ctpu_k_reduce_ref((ctpu_k_red_op)op, x, outer, n, inner, want);
                for (int t = 0; t < LEN(THREADS); t++) {
                    ctpu_k_pool p = k_pool_make(THREADS[t]);
                    for (int64_t i = 0; i < cols; i++) got[i] = 12345.0f;
                    if (op == CTPU_K_RED_COUNT) ctpu_k_sqdev(x, mean, outer, n, inner, got, &p);
                    else ctpu_k_reduce((ctpu_k_red_op)op, x, outer, n, inner, got, &p);
                    check_same(want, got, cols, "reduce", isa, op, THREADS[t], outer, n, inner, mode);
                }
            }
            free(x); free(mean); free(want); free(got);
        }
}
END_TEST

/* Few columns, many chunks: the driver splits columns into chunk blocks. */
START_TEST(reduce_chunk_split)
{
    int isa = _i;
    if (!isa_ok(isa)) return;
    ctpu_k_reduce_select((ctpu_isa)isa);
    const int64_t shapes[][3] = { { 1, (1 << 20) + 123, 1 }, { 1, 37 * 4096 + 1, 3 },
                                  { 2, 64 * 4096, 1 }, { 1, 9 * 4096, 17 }, { 3, 5 * 4096 + 7, 2 },
                                  { 1, 9 * 4096 + 3, 150 } };
    for (int s = 0; s < LEN(shapes); s++) {
        int64_t outer = shapes[s][0], n = shapes[s][1], inner = shapes[s][2], cols = outer * inner;
        float *x = fbuf(outer * n * inner), *want = fbuf(cols), *got = fbuf(cols);
        fill(x, outer * n * inner, D_PLAIN);
        for (int op = 0; op < CTPU_K_RED_COUNT; op++) {
            ctpu_k_reduce_ref((ctpu_k_red_op)op, x, outer, n, inner, want);
            for (int nt = 1; nt <= 9; nt++) {
                ctpu_k_pool p = k_pool_make(nt);
                ctpu_k_reduce((ctpu_k_red_op)op, x, outer, n, inner, got, &p);
                check_same(want, got, cols, "reduce", isa, op, nt, outer, n, inner, D_PLAIN);
            }
        }
        free(x); free(want); free(got);
    }
}
END_TEST

START_TEST(softmax_parity)
{
    int isa = _i / D_COUNT, mode = _i % D_COUNT;
    if (!isa_ok(isa)) return;
    ctpu_k_reduce_select((ctpu_isa)isa);
    const int64_t rows_l[] = { 0, 1, 5, 128 };
    const int64_t n_l[] = { 0, 1, 10, 15, 16, 17, 4095, 4096, 4097, 3 * 4096 + 5 };
    for (int a = 0; a < LEN(rows_l); a++)
        for (int b = 0; b < LEN(n_l); b++) {
            int64_t rows = rows_l[a], n = n_l[b], cnt = rows * n;
            if (rows == 128 && n > 4097) continue;   /* keep the suite quick */
            float *x = fbuf(cnt), *want = fbuf(cnt), *got = fbuf(cnt);
            fill(x, cnt, mode);
            for (int lg = 0; lg < 2; lg++) {
                ctpu_k_softmax_ref(x, rows, n, want, lg);
                for (int t = 0; t < LEN(THREADS); t++) {
                    ctpu_k_pool p = k_pool_make(THREADS[t]);
                    ctpu_k_softmax(x, rows, n, got, lg, t ? &p : NULL);
                    check_same(want, got, cnt, lg ? "log_softmax" : "softmax", isa, 0,
                               THREADS[t], rows, n, 1, mode);
                }
                /* in place: y == x */
                memcpy(got, x, (size_t)cnt * sizeof(float));
                ctpu_k_softmax(got, rows, n, got, lg, NULL);
                check_same(want, got, cnt, lg ? "log_softmax in place" : "softmax in place", isa,
                           0, 1, rows, n, 1, mode);
            }
            free(x); free(want); free(got);
        }
}
END_TEST

/* Before any select the table is the plain-C one (this test runs in its own
 * forked process, so no earlier select is visible). */
START_TEST(default_is_scalar)
{
    float x[100], want[1], got[1];
    fill(x, 100, D_PLAIN);
    ctpu_k_reduce_ref(CTPU_K_RED_SUM, x, 1, 100, 1, want);
    ctpu_k_reduce(CTPU_K_RED_SUM, x, 1, 100, 1, got, NULL);
    ck_assert(same(want[0], got[0]));
}
END_TEST

/* ---- _ref: the order ------------------------------------------------------------ */
static float naive_sum(const float *x, int64_t n)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s;
}

/* kernels.h's text, literally: chunks, 16 lanes, lane tree, then the chunk
 * results combined level by level in an array. */
static float literal_sum(const float *x, int64_t n)
{
    int64_t m = (n + 4095) / 4096;
    float *c = fbuf(m);
    for (int64_t k = 0; k < m; k++) {
        float l[16] = { 0 };
        for (int64_t j = 0; j < 4096 && k * 4096 + j < n; j++) l[j % 16] += x[k * 4096 + j];
        for (int s = 8; s > 0; s /= 2)
            for (int i = 0; i < s; i++) l[i] = l[i] + l[i + s];
        c[k] = l[0];
    }
    while (m > 1) {
        for (int64_t i = 0; i < m / 2; i++) c[i] = c[2 * i] + c[2 * i + 1];
        if (m & 1) c[m / 2] = c[m - 1];
        m = (m + 1) / 2;
    }
    float r = n ? c[0] : 0.0f;
    free(c);
    return r;
}

static void all_isas_sum(const float *x, int64_t n, float want)
{
    for (int isa = 0; isa < CTPU_ISA_COUNT; isa++) {
        if (!isa_ok(isa)) continue;
        ctpu_k_reduce_select((ctpu_isa)isa);
        for (int t = 0; t < LEN(THREADS); t++) {
            ctpu_k_pool p = k_pool_make(THREADS[t]);
            float got;
            ctpu_k_reduce(CTPU_K_RED_SUM, x, 1, n, 1, &got, &p);
            ck_assert_msg(f2u(got) == f2u(want), "isa %s threads %d: %a, want %a", isa_str[isa],
                          THREADS[t], got, want);
        }
    }
}

START_TEST(order_lanes)
{
    /* Lanes: element j -> lane j % 16. Lane 0 = 2^24 + (-2^24) = 0, lanes
     * 1..15 = 1: lane order gives 15; left to right, 2^24 + 1 rounds back to
     * 2^24 (ties to even), so the naive sum is 0. */
    float x[32] = { 0 };
    x[0] = 0x1p24f; x[16] = -0x1p24f;
    for (int i = 1; i < 16; i++) x[i] = 1.0f;
    float r;
    ctpu_k_reduce_ref(CTPU_K_RED_SUM, x, 1, 32, 1, &r);
    ck_assert_float_eq(r, 15.0f);
    ck_assert_float_eq(naive_sum(x, 32), 0.0f);
    all_isas_sum(x, 32, 15.0f);
}
END_TEST

START_TEST(order_lane_tree)
{
    /* Lane tree +8, +4, +2, +1: l0 = 2^24, l1 = l3 = 1. At +2, l1 = l1 + l3 = 2;
     * at +1, l0 = 2^24 + 2 (exact). Lanes summed in index order give 2^24. */
    float x[16] = { 0 };
    x[0] = 0x1p24f; x[1] = 1.0f; x[3] = 1.0f;
    float r;
    ctpu_k_reduce_ref(CTPU_K_RED_SUM, x, 1, 16, 1, &r);
    ck_assert_float_eq(r, 0x1p24f + 2.0f);
    ck_assert_float_eq(naive_sum(x, 16), 0x1p24f);
    all_isas_sum(x, 16, 0x1p24f + 2.0f);
}
END_TEST

START_TEST(order_chunk_tree)
{
    /* Chunk results c = {2^24, 1, 1, 1}: pairwise (c0+c1) + (c2+c3) =
     * 2^24 + 2 (c0 + c1 rounds to 2^24, ties to even); chunks summed in
     * sequence give 2^24. */
    int64_t n = 4 * 4096;
    float *x = fbuf(n);
    memset(x, 0, (size_t)n * sizeof(float));
    x[0] = 0x1p24f; x[4096] = 1.0f; x[8192] = 1.0f; x[12288] = 1.0f;
    float r;
    ctpu_k_reduce_ref(CTPU_K_RED_SUM, x, 1, n, 1, &r);
    ck_assert_float_eq(r, 0x1p24f + 2.0f);
    ck_assert_float_eq(naive_sum(x, n), 0x1p24f);
    all_isas_sum(x, n, 0x1p24f + 2.0f);
    /* Odd carry: c = {2^24, 1, 1}: (c0 + c1) + c2 = 2^24 (c2 carried up);
     * pairing from the right, c0 + (c1 + c2), would give 2^24 + 2. */
    float r3;
    ctpu_k_reduce_ref(CTPU_K_RED_SUM, x, 1, 3 * 4096, 1, &r3);
    ck_assert_float_eq(r3, 0x1p24f);
    all_isas_sum(x, 3 * 4096, 0x1p24f);
    free(x);
}
END_TEST

/* _ref's recursive chunk tree equals the literal level-by-level one for
 * every chunk count 1..40 (data chosen so that the order shows). */
START_TEST(ref_matches_literal)
{
    int64_t nmax = 40 * 4096;
    float *x = fbuf(nmax);
    for (int64_t i = 0; i < nmax; i++) x[i] = urand() * ldexpf(1.0f, (int)(rnd() % 30) - 5);
    for (int64_t m = 1; m <= 40; m++) {
        int64_t n = (m - 1) * 4096 + 1 + (int64_t)(rnd() % 4096);
        float r;
        ctpu_k_reduce_ref(CTPU_K_RED_SUM, x, 1, n, 1, &r);
        float lit = literal_sum(x, n);
        ck_assert_msg(f2u(r) == f2u(lit), "n=%lld: ref %a, literal %a", (long long)n, r, lit);
        for (int isa = 0; isa < CTPU_ISA_COUNT; isa++) {
            if (!isa_ok(isa)) continue;
            ctpu_k_reduce_select((ctpu_isa)isa);
            ctpu_k_pool p = k_pool_make(3);
            float g;
            ctpu_k_reduce(CTPU_K_RED_SUM, x, 1, n, 1, &g, &p);
            ck_assert_msg(f2u(g) == f2u(lit), "isa %s n=%lld", isa_str[isa], (long long)n);
        }
    }
    free(x);
}
END_TEST

/* Error bound: every element passes through at most
 * d = ceil(min(n,4096)/16) + 4 + ceil(log2 m) roundings, each with relative
 * error <= u = 2^-24, so |sum - exact| <= d * u * (1 + u)^d * sum|x|
 * (Higham, "Accuracy and Stability", 4.2). Assert d * u * 1.001 * sum|x|. */
START_TEST(sum_vs_f64)
{
    const int64_t ns[] = { 1, 17, 4096, 4097, 40000, 300000 };
    for (int a = 0; a < LEN(ns); a++) {
        int64_t n = ns[a];
        float *x = fbuf(n);
        fill(x, n, D_PLAIN);
        for (int64_t i = 0; i < n; i++) x[i] += 0.25f;  /* a nonzero mean */
        double exact = 0, abs_sum = 0;
        for (int64_t i = 0; i < n; i++) { exact += x[i]; abs_sum += fabs((double)x[i]); }
        float r;
        ctpu_k_reduce_ref(CTPU_K_RED_SUM, x, 1, n, 1, &r);
        int64_t m = (n + 4095) / 4096, lvl = 0;
        while ((1LL << lvl) < m) lvl++;
        int64_t d = ((n < 4096 ? n : 4096) + 15) / 16 + 4 + lvl;
        double bound = (double)d * 0x1p-24 * 1.001 * abs_sum;
        ck_assert_msg(fabs((double)r - exact) <= bound, "n=%lld: |%.9g - %.9g| > %.3g",
                      (long long)n, r, exact, bound);
        /* mean = sum / n, var = sqdev / n: var of data with known spread */
        float mean = r / (float)n, sq;
        ctpu_k_sqdev_ref(x, &mean, 1, n, 1, &sq);
        double v64 = 0;
        for (int64_t i = 0; i < n; i++) v64 += ((double)x[i] - exact / n) * ((double)x[i] - exact / n);
        ck_assert_msg(fabs(sq - v64) <= 1e-4 * v64 + 1e-30, "sqdev n=%lld: %.9g vs %.9g",
                      (long long)n, sq, v64);
        free(x);
    }
}
END_TEST

/* ---- edge values ------------------------------------------------------------------ */
START_TEST(empty_and_identity)
{
    for (int isa = 0; isa < CTPU_ISA_COUNT; isa++) {
        if (!isa_ok(isa)) continue;
        ctpu_k_reduce_select((ctpu_isa)isa);
        float x[1] = { 7.0f }, y[6], m[6] = { 0 };
        int32_t iy[6];
        /* n == 0: the identity (documented in reduce_ref.c / kernels.h). */
        ctpu_k_reduce(CTPU_K_RED_SUM, x, 2, 0, 3, y, NULL);
        for (int i = 0; i < 6; i++) ck_assert(f2u(y[i]) == f2u(0.0f));
        ctpu_k_reduce(CTPU_K_RED_MAX, x, 2, 0, 3, y, NULL);
        for (int i = 0; i < 6; i++) ck_assert(y[i] == -INFINITY);
        ctpu_k_reduce(CTPU_K_RED_MIN, x, 2, 0, 3, y, NULL);
        for (int i = 0; i < 6; i++) ck_assert(y[i] == INFINITY);
        ctpu_k_sqdev(x, m, 2, 0, 3, y, NULL);
        for (int i = 0; i < 6; i++) ck_assert(f2u(y[i]) == f2u(0.0f));
        ctpu_k_argmax(x, 2, 0, 3, iy, false);
        for (int i = 0; i < 6; i++) ck_assert_int_eq(iy[i], 0);
        /* outer == 0: nothing written */
        y[0] = 5.0f;
        ctpu_k_reduce(CTPU_K_RED_SUM, x, 0, 10, 3, y, NULL);
        ctpu_k_softmax(x, 0, 10, y, false, NULL);
        ck_assert_float_eq(y[0], 5.0f);
        /* sum of -0 alone is +0: the lane starts at +0 */
        float z = -0.0f;
        ctpu_k_reduce(CTPU_K_RED_SUM, &z, 1, 1, 1, y, NULL);
        ck_assert_uint_eq(f2u(y[0]), f2u(0.0f));
    }
}
END_TEST

START_TEST(max_zero_sign_and_nan)
{
    for (int isa = 0; isa < CTPU_ISA_COUNT; isa++) {
        if (!isa_ok(isa)) continue;
        ctpu_k_reduce_select((ctpu_isa)isa);
        float x[17] = { 0 }, y;
        for (int i = 0; i < 17; i++) x[i] = -1.0f;
        /* lane 0 = MAX(MAX(-inf, +0), -0) = -0 (a > b is false): -0 wins */
        x[0] = 0.0f; x[16] = -0.0f;
        ctpu_k_reduce(CTPU_K_RED_MAX, x, 1, 17, 1, &y, NULL);
        ck_assert_uint_eq(f2u(y), 0x80000000u);
        /* lanes 0 (-0) and 1 (+0) meet at the +1 level: MAX(-0, +0) = +0 */
        float w[2] = { -0.0f, 0.0f };
        ctpu_k_reduce(CTPU_K_RED_MAX, w, 1, 2, 1, &y, NULL);
        ck_assert_uint_eq(f2u(y), 0u);
        /* NaN propagates through max and min, wherever it is */
        int64_t n = 3 * 4096 + 5;
        float *v = fbuf(n);
        fill(v, n, D_PLAIN);
        v[n - 1] = NAN;
        ctpu_k_reduce(CTPU_K_RED_MAX, v, 1, n, 1, &y, NULL);
        ck_assert(isnan(y));
        ctpu_k_reduce(CTPU_K_RED_MIN, v, 1, n, 1, &y, NULL);
        ck_assert(isnan(y));
        v[n - 1] = INFINITY;
        ctpu_k_reduce(CTPU_K_RED_MAX, v, 1, n, 1, &y, NULL);
        ck_assert(y == INFINITY);
        free(v);
    }
}
END_TEST

/* ---- argmax --------------------------------------------------------------------- */
static int32_t naive_arg(const float *x, int64_t n, int64_t inner, bool is_min)
{
    int32_t best = 0;
    for (int64_t j = 0; j < n; j++) {
        float v = x[j * inner];
        if (isnan(v)) return (int32_t)j;
        if (is_min ? v < x[best * inner] : v > x[best * inner]) best = (int32_t)j;
    }
    return best;
}

START_TEST(argmax_cases)
{
    float t[6] = { 1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 3.0f };
    int32_t r;
    ctpu_k_argmax(t, 1, 6, 1, &r, false);
    ck_assert_int_eq(r, 1);                          /* first of the ties */
    ctpu_k_argmax(t, 1, 6, 1, &r, true);
    ck_assert_int_eq(r, 4);
    float u[5] = { 1.0f, NAN, INFINITY, NAN, 2.0f };
    ctpu_k_argmax(u, 1, 5, 1, &r, false);
    ck_assert_int_eq(r, 1);                          /* first NaN */
    ctpu_k_argmax(u, 1, 5, 1, &r, true);
    ck_assert_int_eq(r, 1);                          /* NaN counts as minimal too */
    float z[3] = { -0.0f, 0.0f, -0.0f };
    ctpu_k_argmax(z, 1, 3, 1, &r, false);
    ck_assert_int_eq(r, 0);                          /* -0 == +0: a tie */
    float ni[3] = { -INFINITY, -INFINITY, -INFINITY };
    ctpu_k_argmax(ni, 1, 3, 1, &r, false);
    ck_assert_int_eq(r, 0);
    /* random shapes against a per-column naive scan */
    for (int a = 0; a < LEN(Ns); a++)
        for (int b = 0; b < LEN(INNERs); b++) {
            int64_t n = Ns[a] > 5000 ? 5000 : Ns[a], inner = INNERs[b], outer = 5;
            float *x = fbuf(outer * n * inner);
            int32_t *y = malloc((size_t)(outer * inner) * sizeof(int32_t));
            for (int mode = 0; mode < D_COUNT; mode++) {
                fill(x, outer * n * inner, mode);
                for (int mn = 0; mn < 2; mn++) {
                    ctpu_k_argmax(x, outer, n, inner, y, mn);
                    for (int64_t o = 0; o < outer; o++)
                        for (int64_t i = 0; i < inner; i++)
                            ck_assert_int_eq(y[o * inner + i],
                                             naive_arg(x + o * n * inner + i, n, inner, mn));
                }
            }
            free(x); free(y);
        }
}
END_TEST

/* ---- softmax properties -------------------------------------------------------- */
START_TEST(softmax_properties)
{
    for (int isa = 0; isa < CTPU_ISA_COUNT; isa++) {
        if (!isa_ok(isa)) continue;
        ctpu_k_reduce_select((ctpu_isa)isa);
        const int64_t ns[] = { 1, 10, 4096, 10000 };
        for (int a = 0; a < LEN(ns); a++) {
            int64_t n = ns[a], rows = 4;
            float *x = fbuf(rows * n), *y = fbuf(rows * n), *ly = fbuf(rows * n);
            for (int64_t i = 0; i < rows * n; i++) x[i] = urand() * 20.0f;
            ctpu_k_softmax(x, rows, n, y, false, NULL);
            ctpu_k_softmax(x, rows, n, ly, true, NULL);
            for (int64_t r = 0; r < rows; r++) {
                double s = 0, mx = -INFINITY, ls = 0;
                for (int64_t j = 0; j < n; j++) mx = fmax(mx, x[r * n + j]);
                for (int64_t j = 0; j < n; j++) { s += y[r * n + j]; ls += exp(x[r * n + j] - mx); }
                ck_assert_msg(fabs(s - 1.0) <= 1e-5, "softmax row sum %.9g", s);
                for (int64_t j = 0; j < n; j++) {
                    double want = (x[r * n + j] - mx) - log(ls);
                    ck_assert_msg(fabs(ly[r * n + j] - want) <= 1e-5 * (1 + fabs(want)),
                                  "log_softmax %.9g vs %.9g", ly[r * n + j], want);
                    ck_assert(y[r * n + j] >= 0.0f && y[r * n + j] <= 1.0f);
                }
            }
            free(x); free(y); free(ly);
        }
        /* huge values: no overflow (the max is subtracted first) */
        float h[4] = { 1e8f, 1e8f, 0.0f, -INFINITY }, hy[4], hs[4];
        ctpu_k_softmax(h, 1, 4, hy, true, NULL);
        ctpu_k_softmax(h, 1, 4, hs, false, NULL);
        ck_assert(fabsf(hy[0] - -0.69314718f) <= 1e-6f && hy[0] == hy[1]);
        ck_assert(fabsf(hy[2] - (-1e8f - 0.69314718f)) <= 8.0f);
        ck_assert(hy[3] == -INFINITY);
        ck_assert(hs[0] == 0.5f && hs[1] == 0.5f && hs[2] == 0.0f && hs[3] == 0.0f);
        /* -inf entries get probability 0 and log-probability -inf */
        float g[5] = { -INFINITY, 1.0f, -INFINITY, 1.0f, -INFINITY }, gy[5];
        ctpu_k_softmax(g, 1, 5, gy, true, NULL);
        ck_assert(gy[0] == -INFINITY && gy[2] == -INFINITY && gy[4] == -INFINITY);
        ck_assert(fabsf(gy[1] - -0.69314718f) <= 1e-6f);
        /* an all -inf row: m = -inf, x - m = NaN (as PyTorch) */
        float ai[3] = { -INFINITY, -INFINITY, -INFINITY }, ay[3];
        ctpu_k_softmax(ai, 1, 3, ay, false, NULL);
        ck_assert(isnan(ay[0]) && isnan(ay[2]));
    }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("k_reduce");
    TCase *p = tcase_create("parity");
    tcase_set_timeout(p, 600);
    tcase_add_loop_test(p, reduce_parity, 0, CTPU_ISA_COUNT * D_COUNT);
    tcase_add_loop_test(p, reduce_wide_parity, 0, CTPU_ISA_COUNT * D_COUNT);
    tcase_add_loop_test(p, reduce_chunk_split, 0, CTPU_ISA_COUNT);
    tcase_add_loop_test(p, reduce_short_wide, 0, CTPU_ISA_COUNT);
    tcase_add_loop_test(p, softmax_parity, 0, CTPU_ISA_COUNT * D_COUNT);
    tcase_add_test(p, default_is_scalar);
    suite_add_tcase(s, p);
    TCase *o = tcase_create("order");
    tcase_set_timeout(o, 120);
    tcase_add_test(o, order_lanes);
    tcase_add_test(o, order_lane_tree);
    tcase_add_test(o, order_chunk_tree);
    tcase_add_test(o, ref_matches_literal);
    tcase_add_test(o, sum_vs_f64);
    suite_add_tcase(s, o);
    TCase *e = tcase_create("edges");
    tcase_set_timeout(e, 120);
    tcase_add_test(e, empty_and_identity);
    tcase_add_test(e, max_zero_sign_and_nan);
    tcase_add_test(e, argmax_cases);
    tcase_add_test(e, softmax_properties);
    suite_add_tcase(s, e);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
