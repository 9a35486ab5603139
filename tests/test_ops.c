#include <limits.h>
/* Op conformance, driven by the op table (STYLE.md "Tests and benchmarks",
 * ggml's test-backend-ops): every row of CTPU_OP_TABLE has a case here, and
 * `every_op_has_a_case` fails for a new row without one.
 *
 * Each case runs the op through the public API (backward helper rows through
 * ctpu_dispatch) on shapes with 0-size, 1, odd extents and broadcasts, and
 * compares against a float64 reference computed here. Tolerances:
 *   neg abs relu max min compare where clamp cast, movement, creation: exact;
 *   add sub mul div sqrt: exact vs the f32 rounding of the double result
 *     (double rounding is innocuous for these: 53 >= 2*24+2);
 *   exp log tanh pow: <= 2 ulp;  rsqrt: <= 2 ulp;  sigmoid: <= 4 ulp;
 *   softplus: <= 2 ulp (the kernel is within 1 ulp on every f32 in [-120, 25]);
 *   gelu_tanh: <= 8 ulp + 8 eps |x| (cancellation in 1 + tanh);
 *   gelu (exact, in double), erf sin cos log1p expm1: <= 2 ulp;
 *   results in the subnormal range may differ by up to 2^-126 (flush);
 *   sum: n eps sum|x|;  mean: (n + 2) eps sum|x| / n;  var: 4 (n + 2) eps
 *     sum (|x| + |mean|)^2 / (n - c);  max min argmax: exact;
 *   softmax: (n + 8 + |x - max|) eps relative;  log_softmax: (n + 8) eps
 *     (|x - max| + |log s| + 1) absolute;
 *   matmul (default precision): inputs rounded to bf16, vs double within
 *     K eps sum|a||b|; HIGH: (K eps + 2^-15) sum|a||b|; HIGHEST: (K + 8) eps;
 *   scaled_dot_product_attention and sdpa_backward: vs double with q, k, v
 *     rounded to bf16, max error <= 2^-7 max|reference| (tests/test_sdpa.c);
 *   bf16 outputs: the tolerance plus half a bf16 ulp of the reference.
 * Plus: NaN/Inf cases, bf16 cast known answers, f32 -> i32, and the dtype
 * promotion rules of CONTRACTS.md "Dtypes". Per transcendental op (exp log
 * tanh sigmoid sqrt rsqrt softplus gelu erf sin cos log1p expm1), the maximum
 * ulp error on a fixed grid, asserted against the bound above in every mode
 * (transcendental_ulp_bounds_every_mode; run-tests.sh repeats it per ISA). */
#include <float.h>

#include "t_core.h"

#define EPS (1.0 / 16777216.0)   /* 2^-24: unit roundoff of f32 */

/* ----------------------------------------------------------------- data */
static const float SPECIALS[] = {
    0.0f, -0.0f, 1.0f, -1.0f, 0.5f, -0.5f, 2.0f, 3.0f, -3.0f, 10.0f, -10.0f, 0.1f, 88.0f, -88.0f,
    -100.0f, 1e-30f, 1e-20f, 1e20f, -1e20f, 3.3e38f, 1e-3f, 7.25f, -0.3f, 20.0f,
    INFINITY, -INFINITY, NAN,
};
#define N_SPECIALS ((int)(sizeof SPECIALS / sizeof SPECIALS[0]))

static void fill(float *x, int64_t n, uint64_t seed, float lo, float hi, bool specials)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++)
        x[i] = specials && i < N_SPECIALS * 2 && (i % 2 == 0) ? SPECIALS[(i / 2) % N_SPECIALS]
                                                               : t_rand_f(&s, lo, hi);
}

typedef struct {
    int nd;
    int64_t s[4];
} shp;

static const shp UNARY_SHAPES[] = {
    { 1, { 0 } }, { 0, { 0 } }, { 1, { 1 } }, { 1, { 7 } }, { 2, { 3, 5 } }, { 3, { 2, 3, 9 } },
    { 1, { 2053 } }, { 2, { 1, 70001 } },
};
#define N_USHAPES ((int)(sizeof UNARY_SHAPES / sizeof UNARY_SHAPES[0]))

/* Compare one element; tol in absolute units. */
static void expect_close(const char *op, int64_t i, float got, double ref, double tol, float xa, float xb)
{
    if (ref != ref) {
        T_CHECK(got != got, "%s: element %lld (x=%g, %g): got %a, reference NaN", op, (long long)i, xa,
                      xb, got);
        return;
    }
    T_CHECK(got == got, "%s: element %lld (x=%g, %g): got NaN, reference %a", op, (long long)i, xa, xb,
                  ref);
    if (isinf(ref) || isinf(got)) {
        float rf = (float)ref;
        T_CHECK(got == rf || fabs((double)got - ref) <= tol, "%s: element %lld (x=%g, %g): got %a, reference %a",
                      op, (long long)i, xa, xb, got, ref);
        return;
    }
    double err = fabs((double)got - ref);
    T_CHECK(err <= tol, "%s: element %lld (x=%a, %a): got %a, reference %a, error %g > tol %g", op,
                  (long long)i, xa, xb, got, ref, err, tol);
}

/* ------------------------------------------------------------- unary */
static double ref_unary(int op, double x)
{
    switch (op) {
    case CTPU_OP_NEG: return -x;
    case CTPU_OP_ABS: return fabs(x);
    case CTPU_OP_EXP: return exp(x);
    case CTPU_OP_LOG: return log(x);
    case CTPU_OP_SQRT: return sqrt(x);
    case CTPU_OP_RSQRT: return 1.0 / sqrt(x);
    case CTPU_OP_TANH: return tanh(x);
    case CTPU_OP_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case CTPU_OP_RELU: return x > 0 ? x : (x != x ? x : 0.0);
    case CTPU_OP_GELU_TANH: return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case CTPU_OP_GELU_ERF: return 0.5 * x * erfc(-x * 0.7071067811865476);
    case CTPU_OP_ERF: return erf(x);
    case CTPU_OP_SIN: return sin(x);
    case CTPU_OP_COS: return cos(x);
    case CTPU_OP_LOG1P: return log1p(x);
    case CTPU_OP_EXPM1: return expm1(x);
    case CTPU_OP_SOFTPLUS: return x > 20 ? x : log1p(exp(x));
    default: ck_abort_msg("no unary reference for %s", ctpu_op_name(op)); return 0;
    }
}

static double tol_unary(int op, double x, double ref)
{
    double u = t_ulp_of(ref), floor_ = ldexp(1.0, -126);
    switch (op) {
    case CTPU_OP_NEG: case CTPU_OP_ABS: case CTPU_OP_RELU: case CTPU_OP_SQRT: return 0;
    case CTPU_OP_EXP: case CTPU_OP_LOG: case CTPU_OP_TANH: case CTPU_OP_RSQRT: return 2 * u + floor_;
    case CTPU_OP_SIGMOID: return 4 * u + floor_;
    case CTPU_OP_SOFTPLUS: return 2 * u + floor_;
    case CTPU_OP_GELU_TANH: return 8 * u + 8 * EPS * fabs(x) + floor_;
    case CTPU_OP_GELU_ERF: case CTPU_OP_ERF: case CTPU_OP_SIN: case CTPU_OP_COS: case CTPU_OP_LOG1P:
    case CTPU_OP_EXPM1: return 2 * u + floor_;
    default: return 0;
    }
}

static ctpu_tensor apply_unary(int op, ctpu_tensor a)
{
    switch (op) {
    case CTPU_OP_NEG: return ctpu_neg(a);
    case CTPU_OP_ABS: return ctpu_abs(a);
    case CTPU_OP_EXP: return ctpu_exp(a);
    case CTPU_OP_LOG: return ctpu_log(a);
    case CTPU_OP_SQRT: return ctpu_sqrt(a);
    case CTPU_OP_RSQRT: return ctpu_rsqrt(a);
    case CTPU_OP_TANH: return ctpu_tanh(a);
    case CTPU_OP_SIGMOID: return ctpu_sigmoid(a);
    case CTPU_OP_RELU: return ctpu_relu(a);
    case CTPU_OP_GELU_TANH: return ctpu_gelu(a, true);
    case CTPU_OP_GELU_ERF: return ctpu_gelu(a, false);
    case CTPU_OP_SOFTPLUS: return ctpu_softplus(a);
    case CTPU_OP_ERF: return ctpu_erf(a);
    case CTPU_OP_SIN: return ctpu_sin(a);
    case CTPU_OP_COS: return ctpu_cos(a);
    case CTPU_OP_LOG1P: return ctpu_log1p(a);
    case CTPU_OP_EXPM1: return ctpu_expm1(a);
    default: return CTPU_NULL;
    }
}

/* Round a double reference to bf16 and widen (for bf16 outputs). */
static double bf16_round(double r) { return ctpu_bf16_to_f32(ctpu_f32_to_bf16((float)r)); }
/* One bf16 ulp at r (2^16 f32 ulps). */
static double bf16_ulp(double r) { return t_ulp_of(r) * 65536.0; }

static void case_unary(int op)
{
    const char *name = ctpu_op_name(op);
    for (int si = 0; si < N_USHAPES; si++) {
        const shp *sh = &UNARY_SHAPES[si];
        int64_t n = t_numel(sh->nd, sh->s);
        float *x = malloc((size_t)(n ? n : 1) * 4);
        float lo = op == CTPU_OP_LOG || op == CTPU_OP_SQRT || op == CTPU_OP_RSQRT ? 0.0f : -12.0f;
        fill(x, n, (uint64_t)(op * 31 + si), lo, 12.0f, true);
        for (int dt = 0; dt < 2; dt++) {   /* f32, bf16 */
            ctpu_tensor a = t_f32(x, sh->nd, sh->s);
            if (dt) a = ctpu_cast(a, CTPU_BF16);
            ctpu_tensor y = apply_unary(op, a);
            ck_assert_msg(!ctpu_is_null(y), "%s: %s", name, ctpu_last_error());
            ck_assert_int_eq(ctpu_dtype_of(y), dt ? CTPU_BF16 : CTPU_F32);
            t_expect_shape(y, sh->nd, sh->s);
            float *g = t_read(y, NULL);
            for (int64_t i = 0; i < n; i++) {
                double xi = dt ? (double)ctpu_bf16_to_f32(ctpu_f32_to_bf16(x[i])) : (double)x[i];
                double r = ref_unary(op, xi);
                double tol = tol_unary(op, xi, r);
                r = (double)(float)r;
                if (dt) { tol += bf16_ulp(r); r = bf16_round(r); }
                expect_close(name, i, g[i], r, tol, (float)xi, 0);
            }
            free(g);
            ctpu_release(y);
        }
        free(x);
    }
    /* i32 input: float-valued ops give f32, neg/abs/relu keep i32 exactly */
    int32_t iv[5] = { -7, 0, 3, INT32_MAX, INT32_MIN + 1 };
    int64_t s5 = 5;
    ctpu_tensor y = apply_unary(op, t_i32(iv, 1, &s5));
    ck_assert_msg(!ctpu_is_null(y), "%s: %s", name, ctpu_last_error());
    bool keeps = op == CTPU_OP_NEG || op == CTPU_OP_ABS || op == CTPU_OP_RELU;
    ck_assert_int_eq(ctpu_dtype_of(y), keeps ? CTPU_I32 : CTPU_F32);
    if (keeps) {
        int32_t *g = t_read_raw(y, NULL);
        for (int i = 0; i < 5; i++) {
            int64_t r = op == CTPU_OP_NEG ? -(int64_t)iv[i] : op == CTPU_OP_ABS ? llabs(iv[i]) : (iv[i] > 0 ? iv[i] : 0);
            ck_assert_int_eq(g[i], (int32_t)r);
        }
        free(g);
    } else {
        float *g = t_read(y, NULL);
        for (int i = 0; i < 5; i++) {
            double xi = (float)iv[i];
            double r = ref_unary(op, xi);
            expect_close(name, i, g[i], (double)(float)r, tol_unary(op, xi, r), (float)xi, 0);
        }
        free(g);
    }
}

/* ------------------------------------------------------------ binary */
static double ref_binary(int kop, double a, double b)
{
    switch (kop) {
    case CTPU_K_B_ADD: return a + b;
    case CTPU_K_B_SUB: return a - b;
    case CTPU_K_B_MUL: return a * b;
    case CTPU_K_B_DIV: return a / b;
    case CTPU_K_B_POW: return pow(a, b);
    case CTPU_K_B_MAX: return (a != a || b != b) ? NAN : (a > b ? a : b);
    case CTPU_K_B_MIN: return (a != a || b != b) ? NAN : (a < b ? a : b);
    case CTPU_K_B_EQ: return a == b;
    case CTPU_K_B_NE: return a != b;
    case CTPU_K_B_LT: return a < b;
    case CTPU_K_B_LE: return a <= b;
    case CTPU_K_B_GT: return a > b;
    case CTPU_K_B_GE: return a >= b;
    default: ck_abort_msg("no binary reference"); return 0;
    }
}

static double tol_binary(int kop, double ref)
{
    if (kop == CTPU_K_B_POW) return 2 * t_ulp_of(ref) + ldexp(1.0, -126);
    return 0;
}

static ctpu_tensor apply_binary(int op, ctpu_tensor a, ctpu_tensor b)
{
    switch (op) {
    case CTPU_OP_ADD: return ctpu_add(a, b);
    case CTPU_OP_SUB: return ctpu_sub(a, b);
    case CTPU_OP_MUL: return ctpu_mul(a, b);
    case CTPU_OP_DIV: return ctpu_div(a, b);
    case CTPU_OP_POW: return ctpu_pow(a, b);
    case CTPU_OP_MAXIMUM: return ctpu_maximum(a, b);
    case CTPU_OP_MINIMUM: return ctpu_minimum(a, b);
    case CTPU_OP_EQ: return ctpu_eq(a, b);
    case CTPU_OP_NE: return ctpu_ne(a, b);
    case CTPU_OP_LT: return ctpu_lt(a, b);
    case CTPU_OP_LE: return ctpu_le(a, b);
    case CTPU_OP_GT: return ctpu_gt(a, b);
    case CTPU_OP_GE: return ctpu_ge(a, b);
    default: return CTPU_NULL;
    }
}

/* Broadcast index: element i of out (shape os, nd) -> element of operand (shape s, n). */
static int64_t bidx(int64_t i, int nd, const int64_t *os, int n, const int64_t *s)
{
    int64_t off = 0, stride = 1;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t c = i % os[d];
        i /= os[d];
        int id = d - (nd - n);
        if (id >= 0) {
            if (s[id] != 1) off += c * stride;
            stride *= s[id];
        }
    }
    return off;
}

typedef struct { shp a, b, o; } bshape;
static const bshape BIN_SHAPES[] = {
    { { 1, { 0 } }, { 1, { 0 } }, { 1, { 0 } } },
    { { 1, { 1 } }, { 1, { 7 } }, { 1, { 7 } } },
    { { 1, { 37 } }, { 1, { 37 } }, { 1, { 37 } } },
    { { 2, { 3, 1 } }, { 2, { 1, 5 } }, { 2, { 3, 5 } } },
    { { 3, { 2, 3, 4 } }, { 1, { 4 } }, { 3, { 2, 3, 4 } } },
    { { 2, { 0, 3 } }, { 1, { 3 } }, { 2, { 0, 3 } } },
    { { 0, { 0 } }, { 2, { 2, 2 } }, { 2, { 2, 2 } } },
    { { 3, { 5, 1, 3 } }, { 2, { 4, 1 } }, { 3, { 5, 4, 3 } } },
    { { 2, { 2, 1 } }, { 3, { 3, 1, 1 } }, { 3, { 3, 2, 1 } } },
    { { 2, { 33, 1 } }, { 2, { 1, 3000 } }, { 2, { 33, 3000 } } },
};
#define N_BSHAPES ((int)(sizeof BIN_SHAPES / sizeof BIN_SHAPES[0]))

static void case_binary(int op)
{
    const char *name = ctpu_op_name(op);
    int kop = ctpu_op_infos[op].kop;
    bool cmp = ctpu_op_is(op, CTPU_OPK_COMPARE);
    for (int si = 0; si < N_BSHAPES; si++) {
        const bshape *bs = &BIN_SHAPES[si];
        int64_t na = t_numel(bs->a.nd, bs->a.s), nb = t_numel(bs->b.nd, bs->b.s), no = t_numel(bs->o.nd, bs->o.s);
        float *xa = malloc((size_t)(na + 1) * 4), *xb = malloc((size_t)(nb + 1) * 4);
        fill(xa, na, (uint64_t)(op * 7 + si), op == CTPU_OP_POW ? 0.0f : -8.0f, 8.0f, true);
        fill(xb, nb, (uint64_t)(op * 7 + si + 1000), op == CTPU_OP_POW ? -4.0f : -8.0f, 4.0f, si != 1);
        if (cmp || kop == CTPU_K_B_MAX || kop == CTPU_K_B_MIN)   /* make equal pairs likely */
            for (int64_t i = 0; i < nb && i < na; i += 3) xb[i] = xa[i];
        for (int dt = 0; dt < 3; dt++) {   /* f32 @ f32, bf16 @ bf16, f32 @ bf16 */
            ctpu_tensor a = t_f32(xa, bs->a.nd, bs->a.s), b = t_f32(xb, bs->b.nd, bs->b.s);
            if (dt >= 1) b = ctpu_cast(b, CTPU_BF16);
            if (dt == 1) a = ctpu_cast(a, CTPU_BF16);
            ctpu_tensor y = apply_binary(op, a, b);
            ck_assert_msg(!ctpu_is_null(y), "%s: %s", name, ctpu_last_error());
            /* f32[] @ bf16[...]: torch's 0-d rule, a bf16 op (a rounded to bf16 first) */
            bool bf16_op = dt == 1 || (dt == 2 && bs->a.nd == 0 && bs->b.nd > 0);
            ctpu_dtype want = cmp || !bf16_op ? CTPU_F32 : CTPU_BF16;
            ck_assert_int_eq(ctpu_dtype_of(y), want);
            t_expect_shape(y, bs->o.nd, bs->o.s);
            float *g = t_read(y, NULL);
            for (int64_t i = 0; i < no; i++) {
                double va = xa[bidx(i, bs->o.nd, bs->o.s, bs->a.nd, bs->a.s)];
                double vb = xb[bidx(i, bs->o.nd, bs->o.s, bs->b.nd, bs->b.s)];
                if (bf16_op) va = bf16_round(va);
                if (dt >= 1) vb = bf16_round(vb);
                double r = ref_binary(kop, va, vb);
                double tol = tol_binary(kop, r);
                if (!cmp) r = (double)(float)r;   /* f32 rounding of the exact result */
                if (want == CTPU_BF16) { tol += 2 * t_ulp_of(r); r = bf16_round(r); }
                expect_close(name, i, g[i], r, tol, (float)va, (float)vb);
            }
            free(g);
            ctpu_release(y);
        }
        free(xa);
        free(xb);
    }
    /* i32 with i32: exact integer arithmetic (wrapping), division and pow
     * give f32, comparisons f32 masks */
    int32_t ia[6] = { 7, -7, 2147483647, -2147483647 - 1, 0, 5 };
    int32_t ib[6] = { 2, 2, 1, 1, 3, 5 };
    int64_t s6 = 6;
    ctpu_tensor y = apply_binary(op, t_i32(ia, 1, &s6), t_i32(ib, 1, &s6));
    ck_assert_msg(!ctpu_is_null(y), "%s: %s", name, ctpu_last_error());
    bool float_out = cmp || ctpu_op_is(op, CTPU_OPK_FLOAT_OUT);
    ck_assert_int_eq(ctpu_dtype_of(y), float_out ? CTPU_F32 : CTPU_I32);
    if (!float_out) {
        int32_t *g = t_read_raw(y, NULL);
        for (int i = 0; i < 6; i++) {
            int64_t a = ia[i], b = ib[i], r;
            switch (kop) {
            case CTPU_K_B_ADD: r = a + b; break;
            case CTPU_K_B_SUB: r = a - b; break;
            case CTPU_K_B_MUL: r = a * b; break;
            case CTPU_K_B_MAX: r = a > b ? a : b; break;
            default: r = a < b ? a : b; break;
            }
            ck_assert_msg(g[i] == (int32_t)(uint32_t)(uint64_t)r, "%s i32 element %d: %d vs %lld", name, i, g[i],
                          (long long)r);
        }
        free(g);
    } else {
        float *g = t_read(y, NULL);
        for (int i = 0; i < 6; i++) {
            double r = cmp ? ref_binary(kop, ia[i], ib[i]) : (double)(float)ref_binary(kop, (float)ia[i], (float)ib[i]);
            expect_close(name, i, g[i], r, tol_binary(kop, r), (float)ia[i], (float)ib[i]);
        }
        free(g);
    }
}

/* ------------------------------------------------------------ scalar forms */
static ctpu_tensor apply_scalar(int op, ctpu_tensor a, double s, bool rev)
{
    switch (op) {
    case CTPU_OP_ADD_SCALAR: return ctpu_add_scalar(a, s);
    case CTPU_OP_SUB_SCALAR: return rev ? ctpu_rsub_scalar(a, s) : ctpu_sub_scalar(a, s);
    case CTPU_OP_MUL_SCALAR: return ctpu_mul_scalar(a, s);
    case CTPU_OP_DIV_SCALAR: return rev ? ctpu_rdiv_scalar(a, s) : ctpu_div_scalar(a, s);
    case CTPU_OP_POW_SCALAR: return rev ? ctpu_rpow_scalar(a, s) : ctpu_pow_scalar(a, s);
    case CTPU_OP_MAXIMUM_SCALAR: return ctpu_maximum_scalar(a, s);
    case CTPU_OP_MINIMUM_SCALAR: return ctpu_minimum_scalar(a, s);
    case CTPU_OP_EQ_SCALAR: return ctpu_eq_scalar(a, s);
    case CTPU_OP_NE_SCALAR: return ctpu_ne_scalar(a, s);
    case CTPU_OP_LT_SCALAR: return ctpu_lt_scalar(a, s);
    case CTPU_OP_LE_SCALAR: return ctpu_le_scalar(a, s);
    case CTPU_OP_GT_SCALAR: return ctpu_gt_scalar(a, s);
    case CTPU_OP_GE_SCALAR: return ctpu_ge_scalar(a, s);
    default: return CTPU_NULL;
    }
}

/* The int-scalar form of op (CTPU_NULL, no error: none) */
static ctpu_tensor apply_scalar_int(int op, ctpu_tensor a, int64_t s)
{
    ctpu_clear_error();
    switch (op) {
    case CTPU_OP_ADD_SCALAR: return ctpu_add_scalar_int(a, s);
    case CTPU_OP_SUB_SCALAR: return ctpu_sub_scalar_int(a, s);
    case CTPU_OP_MUL_SCALAR: return ctpu_mul_scalar_int(a, s);
    case CTPU_OP_MAXIMUM_SCALAR: return ctpu_maximum_scalar_int(a, s);
    case CTPU_OP_MINIMUM_SCALAR: return ctpu_minimum_scalar_int(a, s);
    default: return CTPU_NULL;
    }
}

static void case_scalar(int op)
{
    const char *name = ctpu_op_name(op);
    int kop = ctpu_op_infos[op].kop;
    bool cmp = ctpu_op_is(op, CTPU_OPK_COMPARE);
    bool has_rev = op == CTPU_OP_SUB_SCALAR || op == CTPU_OP_DIV_SCALAR || op == CTPU_OP_POW_SCALAR;
    static const double scal[] = { 2.5, -0.75, 0.0, 3.0, 0.1, 1e-3, -2.0, INFINITY, NAN };
    static const shp shapes[] = { { 1, { 0 } }, { 0, { 0 } }, { 1, { 1 } }, { 2, { 3, 7 } }, { 1, { 4099 } } };
    for (int si = 0; si < 5; si++) {
        int64_t n = t_numel(shapes[si].nd, shapes[si].s);
        float *x = malloc((size_t)(n + 1) * 4);
        fill(x, n, (uint64_t)(op + si * 5), op == CTPU_OP_POW_SCALAR ? 0.0f : -6.0f, 6.0f, true);
        for (int k = 0; k < 9; k++) {
            for (int rev = 0; rev <= (int)has_rev; rev++) {
                for (int dt = 0; dt < 2; dt++) {
                    ctpu_tensor a = t_f32(x, shapes[si].nd, shapes[si].s);
                    if (dt) a = ctpu_cast(a, CTPU_BF16);
                    ctpu_tensor y = apply_scalar(op, a, scal[k], rev);
                    ck_assert_msg(!ctpu_is_null(y), "%s: %s", name, ctpu_last_error());
                    /* a host scalar never changes the tensor's dtype */
                    ctpu_dtype want = cmp ? CTPU_F32 : dt ? CTPU_BF16 : CTPU_F32;
                    ck_assert_int_eq(ctpu_dtype_of(y), want);
                    float *g = t_read(y, NULL);
                    double s = (float)scal[k];
                    for (int64_t i = 0; i < n; i++) {
                        double xi = dt ? bf16_round(x[i]) : x[i];
                        double sv = cmp && dt ? bf16_round((float)s) : s;   /* bf16 compares in bf16 (torch) */
                        double r = rev ? ref_binary(kop, sv, xi) : ref_binary(kop, xi, sv);
                        double tol = tol_binary(kop, r);
                        if (!cmp) r = (double)(float)r;
                        if (want == CTPU_BF16) { tol += 2 * t_ulp_of(r); r = bf16_round(r); }
                        expect_close(name, i, g[i], r, tol, (float)xi, (float)s);
                    }
                    free(g);
                    ctpu_release(y);
                }
            }
        }
        free(x);
    }
    /* i32 tensor with a double (torch's Python float): f32 for every op
     * (comparisons: f32 masks); with the *_int forms (Python's int) the
     * arithmetic ones stay i32 (README "Where ctpu differs") */
    int32_t iv[4] = { -5, 0, 7, 100 };
    int64_t s4 = 4;
    for (int form = 0; form < 2; form++) {
        ctpu_tensor y = form ? apply_scalar_int(op, t_i32(iv, 1, &s4), 3) : apply_scalar(op, t_i32(iv, 1, &s4), 3, false);
        if (form && ctpu_is_null(y) && !ctpu_last_status()) continue;   /* (no int form) */
        ck_assert_msg(!ctpu_is_null(y), "%s: %s", name, ctpu_last_error());
        ck_assert_int_eq(ctpu_dtype_of(y), form ? CTPU_I32 : CTPU_F32);
        float *g = t_read(y, NULL);
        for (int i = 0; i < 4; i++) {
            double r = ref_binary(kop, iv[i], 3.0);
            if (!cmp) r = (double)(float)r;
            expect_close(name, i, g[i], r, tol_binary(kop, r), (float)iv[i], 3);
        }
        free(g);
    }
    int32_t half[4] = { -5, 0, 7, 100 };
    ctpu_tensor h = apply_scalar(op, t_i32(half, 1, &s4), 2.5, false);
    float *g = t_read(h, NULL);
    for (int i = 0; i < 4; i++) {
        double r = ref_binary(kop, half[i], 2.5);
        if (!cmp) r = (double)(float)r;
        expect_close(name, i, g[i], r, tol_binary(kop, r), (float)half[i], 2.5f);
    }
    free(g);
}

/* ------------------------------------------------------------ where, clamp */
static void case_where(int op)
{
    (void)op;
    float c[6] = { 1, 0, -0.0f, NAN, 0.5f, -2 };
    float a[3] = { 10, 20, 30 }, b[2] = { -1, -2 };
    int64_t sc[2] = { 2, 3 }, sa[1] = { 3 }, sb[2] = { 2, 1 };
    ctpu_tensor y = ctpu_where(t_f32(c, 2, sc), t_f32(a, 1, sa), t_f32(b, 2, sb));
    ck_assert_msg(!ctpu_is_null(y), "where: %s", ctpu_last_error());
    t_expect_shape(y, 2, sc);
    ck_assert_int_eq(ctpu_dtype_of(y), CTPU_F32);
    float *g = t_read(y, NULL);
    float want[6] = { 10, -1, -1, 10, 20, 30 };   /* NaN condition counts as true */
    for (int i = 0; i < 6; i++) ck_assert_msg(t_same(g[i], want[i]), "where %d: %g", i, g[i]);
    free(g);
    /* cond i32, a bf16, b f32 -> f32; NaN/Inf values pass through */
    int32_t ci[4] = { 0, 1, 0, 5 };
    int64_t s4 = 4;
    ctpu_tensor y2 = ctpu_where(t_i32(ci, 1, &s4), ctpu_cast(T_VEC(1.5f, INFINITY, 3, NAN), CTPU_BF16),
                                T_VEC(NAN, 2, -INFINITY, 4));
    ck_assert_int_eq(ctpu_dtype_of(y2), CTPU_F32);
    g = t_read(y2, NULL);
    ck_assert(g[0] != g[0] && g[1] == INFINITY && g[2] == -INFINITY && g[3] != g[3]);
    free(g);
    /* bf16 with bf16 stays bf16; i32 with i32 stays i32 exactly; 0-size */
    ctpu_tensor y3 = ctpu_where(T_VEC(1, 0), ctpu_cast(T_VEC(1, 2), CTPU_BF16), ctpu_cast(T_VEC(3, 4), CTPU_BF16));
    ck_assert_int_eq(ctpu_dtype_of(y3), CTPU_BF16);
    int32_t big[2] = { 16777217, -16777219 }, small[2] = { 1, 2 };
    int64_t s2 = 2;
    ctpu_tensor y4 = ctpu_where(T_VEC(1, 1), t_i32(big, 1, &s2), t_i32(small, 1, &s2));
    ck_assert_int_eq(ctpu_dtype_of(y4), CTPU_I32);
    int32_t *gi = t_read_raw(y4, NULL);
    ck_assert_int_eq(gi[0], 16777217);
    ck_assert_int_eq(gi[1], -16777219);
    free(gi);
    int64_t z = 0;
    ctpu_tensor y5 = ctpu_where(ctpu_zeros(CTPU_F32, 1, &z), T_VEC(1), T_VEC(2));
    ck_assert(!ctpu_is_null(y5));
    ck_assert_int_eq(ctpu_numel(y5), 0);
}

static void case_clamp(int op)
{
    (void)op;
    float x[8] = { -5, -1, 0, 0.5f, 1, 7, NAN, -INFINITY };
    int64_t s8 = 8;
    static const double lims[][2] = { { -1, 1 }, { 0, 0 }, { 2, -2 }, { -INFINITY, 0.25 }, { NAN, 1 } };
    for (int k = 0; k < 5; k++) {
        for (int dt = 0; dt < 2; dt++) {
            ctpu_tensor a = t_f32(x, 1, &s8);
            if (dt) a = ctpu_cast(a, CTPU_BF16);
            ctpu_tensor y = ctpu_clamp(a, lims[k][0], lims[k][1]);
            ck_assert_msg(!ctpu_is_null(y), "clamp: %s", ctpu_last_error());
            ck_assert_int_eq(ctpu_dtype_of(y), dt ? CTPU_BF16 : CTPU_F32);
            float *g = t_read(y, NULL);
            for (int i = 0; i < 8; i++) {
                double lo = (float)lims[k][0], hi = (float)lims[k][1], v = x[i];
                v = ref_binary(CTPU_K_B_MAX, v, lo);
                v = ref_binary(CTPU_K_B_MIN, v, hi);
                if (dt) v = bf16_round(v);
                expect_close("clamp", i, g[i], v, 0, x[i], (float)lims[k][0]);
            }
            free(g);
        }
    }
    /* int bounds: i32 stays i32; float bounds: f32 (torch.clamp(i32, 1.5, 2.5) is f32) */
    int32_t iv[4] = { -100, 0, 5, 1000 };
    int64_t s4 = 4;
    ctpu_tensor y = ctpu_clamp_int(t_i32(iv, 1, &s4), -10, 10);
    ck_assert_int_eq(ctpu_dtype_of(y), CTPU_I32);
    int32_t *g = t_read_raw(y, NULL);
    ck_assert(g[0] == -10 && g[1] == 0 && g[2] == 5 && g[3] == 10);
    free(g);
    y = ctpu_clamp(t_i32(iv, 1, &s4), -10, 10.5);
    ck_assert_int_eq(ctpu_dtype_of(y), CTPU_F32);
    float *gf = t_read(y, NULL);
    ck_assert(gf[0] == -10 && gf[1] == 0 && gf[2] == 5 && gf[3] == 10.5f);
    free(gf);
}

/* ------------------------------------------------------------ cast */
static uint16_t cast_bf16_bits(uint32_t f32bits)
{
    float f = t_u2f(f32bits);
    int64_t one = 1;
    ctpu_tensor y = ctpu_cast(t_f32(&f, 1, &one), CTPU_BF16);
    ck_assert_msg(!ctpu_is_null(y), "cast: %s", ctpu_last_error());
    uint16_t h;
    ck_assert_int_eq(ctpu_to_host(y, &h, 2), CTPU_OK);
    ctpu_release(y);
    return h;
}

static void case_cast(int op)
{
    (void)op;
    /* f32 -> bf16 known answers: RNE, ties to even, overflow -> Inf, NaN
     * stays NaN, -0, subnormal results -> signed zero */
    static const struct { uint32_t f; uint16_t h; } kat[] = {
        { 0x3f800000u, 0x3f80 },  /* 1.0 */
        { 0x3f808000u, 0x3f80 },  /* 1 + 2^-8: tie, to even (down) */
        { 0x3f818000u, 0x3f82 },  /* 1 + 3*2^-8: tie, to even (up) */
        { 0x3f808001u, 0x3f81 },  /* just above the tie */
        { 0x3f807fffu, 0x3f80 },  /* just below the tie */
        { 0xbf818000u, 0xbf82 },  /* negative tie */
        { 0x80000000u, 0x8000 },  /* -0.0 */
        { 0x00000000u, 0x0000 },  /* +0.0 */
        { 0x7f7fffffu, 0x7f80 },  /* FLT_MAX -> +Inf */
        { 0xff7fffffu, 0xff80 },  /* -FLT_MAX -> -Inf */
        { 0x7f7f7fffu, 0x7f7f },  /* largest value rounding to the max bf16 */
        { 0x7f7f8000u, 0x7f80 },  /* tie above the max bf16 (odd) -> Inf */
        { 0x7f800000u, 0x7f80 },  /* +Inf */
        { 0xff800000u, 0xff80 },  /* -Inf */
        { 0x000116c2u, 0x0000 },  /* 1e-40 (subnormal) -> +0 */
        { 0x800116c2u, 0x8000 },  /* -1e-40 -> -0 */
        { 0x00800000u, 0x0080 },  /* FLT_MIN stays */
        { 0x007fffffu, 0x0080 },  /* largest subnormal rounds up to FLT_MIN */
        { 0x007f0000u, 0x0000 },  /* subnormal bf16 pattern -> 0 */
        { 0x80400000u, 0x8000 },
        { 0x40490fdbu, 0x4049 },  /* pi */
        { 0x3dcccccdu, 0x3dcd },  /* 0.1 */
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint16_t h = cast_bf16_bits(kat[i].f);
        ck_assert_msg(h == kat[i].h, "bf16(%#010x) = %#06x, want %#06x", kat[i].f, h, kat[i].h);
    }
    static const uint32_t nans[] = { 0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffc00000u };
    for (int i = 0; i < 5; i++) {
        uint16_t h = cast_bf16_bits(nans[i]);
        ck_assert_msg((h & 0x7fff) > 0x7f80, "bf16(NaN %#010x) = %#06x is not a NaN", nans[i], h);
        ck_assert_msg((h & 0x8000) == ((nans[i] >> 16) & 0x8000), "NaN sign lost");
    }
    /* bf16 -> f32 is exact for all 65536 patterns; bf16 -> bf16 is the identity */
    int64_t n = 65536;
    uint16_t *all = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) all[i] = (uint16_t)i;
    ctpu_tensor b = ctpu_from_host(all, CTPU_BF16, 1, &n);
    T_CHECK(!ctpu_is_null(b), "!ctpu_is_null(b)");
    uint32_t *w = t_read_raw(ctpu_cast(b, CTPU_F32), NULL);
    uint16_t *same = t_read_raw(ctpu_cast(b, CTPU_BF16), NULL);
    for (int64_t i = 0; i < n; i++) {
        float f = t_u2f((uint32_t)i << 16);
        T_CHECK(t_same(t_u2f(w[i]), f), "bf16 %#06llx -> f32 %#010x", (long long)i, w[i]);
        bool isnan_ = (i & 0x7fff) > 0x7f80, sub = (i & 0x7f80) == 0;
        if (isnan_) T_CHECK((same[i] & 0x7fff) > 0x7f80, "(same[i] & 0x7fff) > 0x7f80");
        else if (sub) T_CHECK(same[i] == (uint16_t)i || same[i] == (uint16_t)(i & 0x8000),
                                    "bf16 -> bf16 of %#06llx = %#06x", (long long)i, same[i]);
        else T_CHECK(same[i] == (uint16_t)i, "bf16 -> bf16 of %#06llx = %#06x", (long long)i, same[i]);
    }
    /* f32 -> bf16 of a widened bf16 value is exact (round trip), except
     * subnormal patterns which flush to zero */
    uint16_t *rt = t_read_raw(ctpu_cast(ctpu_cast(b, CTPU_F32), CTPU_BF16), NULL);
    for (int64_t i = 0; i < n; i++) {
        bool isnan_ = (i & 0x7fff) > 0x7f80, sub = (i & 0x7f80) == 0;
        if (isnan_) T_CHECK((rt[i] & 0x7fff) > 0x7f80, "(rt[i] & 0x7fff) > 0x7f80");
        else if (sub) T_CHECK((rt[i]) == ((uint16_t)(i & 0x8000)), "rt[i] == (uint16_t)(i & 0x8000)");
        else T_CHECK((rt[i]) == ((uint16_t)i), "rt[i] == (uint16_t)i");
    }
    free(all); free(w); free(same); free(rt);

    /* f32 -> i32: toward zero, saturating, NaN -> 0 */
    static const struct { float f; int32_t i; } ti[] = {
        { 2.9f, 2 }, { -2.9f, -2 }, { 0.5f, 0 }, { -0.5f, 0 }, { -0.0f, 0 }, { 2147483520.0f, 2147483520 },
        { 2147483648.0f, INT32_MAX }, { 1e10f, INT32_MAX }, { -1e10f, INT32_MIN }, { -2147483648.0f, INT32_MIN },
        { INFINITY, INT32_MAX }, { -INFINITY, INT32_MIN }, { NAN, 0 }, { -NAN, 0 }, { 16777216.0f, 16777216 },
    };
    int64_t nt = (int64_t)(sizeof ti / sizeof ti[0]);
    float tf[32];
    for (int64_t i = 0; i < nt; i++) tf[i] = ti[i].f;
    for (int dt = 0; dt < 2; dt++) {
        ctpu_tensor src = t_f32(tf, 1, &nt);
        if (dt) src = ctpu_cast(src, CTPU_BF16);
        ctpu_tensor y = ctpu_cast(src, CTPU_I32);
        ck_assert_int_eq(ctpu_dtype_of(y), CTPU_I32);
        int32_t *g = t_read_raw(y, NULL);
        for (int64_t i = 0; i < nt; i++) {
            float v = dt ? ctpu_bf16_to_f32(ctpu_f32_to_bf16(ti[i].f)) : ti[i].f;
            int32_t want = v != v ? 0 : v >= 2147483648.0f ? INT32_MAX : v <= -2147483648.0f ? INT32_MIN : (int32_t)v;
            if (!dt) ck_assert_int_eq(want, ti[i].i);
            ck_assert_msg(g[i] == want, "i32(%a) = %d, want %d", v, g[i], want);
        }
        free(g);
    }
    /* i32 -> f32 (RNE), i32 -> bf16, i32 -> i32 */
    int32_t iv[6] = { 16777217, 16777219, INT32_MAX, -7, 257, 259 };
    int64_t s6 = 6;
    ctpu_tensor it = t_i32(iv, 1, &s6);
    float *f = t_read(ctpu_cast(it, CTPU_F32), NULL);
    ck_assert(f[0] == 16777216.0f && f[1] == 16777220.0f && f[2] == 2147483648.0f && f[3] == -7.0f);
    free(f);
    f = t_read(ctpu_cast(it, CTPU_BF16), NULL);
    ck_assert(f[4] == 256.0f && f[5] == 260.0f && f[3] == -7.0f);
    free(f);
    int32_t *ii = t_read_raw(ctpu_cast(it, CTPU_I32), NULL);
    ck_assert(memcmp(ii, iv, sizeof iv) == 0);
    free(ii);
    /* 0-size and 0-d */
    int64_t z = 0;
    ctpu_tensor e = ctpu_cast(ctpu_zeros(CTPU_F32, 1, &z), CTPU_BF16);
    ck_assert(!ctpu_is_null(e) && ctpu_numel(e) == 0);
    float one = -3.75f;
    double v;
    ck_assert_int_eq(ctpu_item(ctpu_cast(ctpu_from_host(&one, CTPU_F32, 0, NULL), CTPU_I32), &v), CTPU_OK);
    ck_assert(v == -3);
}

/* ------------------------------------------------------------ reductions */
typedef struct {
    shp s;
    int ndims;
    int dims[3];
} rcase;
static const rcase RED_CASES[] = {
    { { 1, { 0 } }, 0, { 0 } },          { { 0, { 0 } }, 0, { 0 } },           { { 0, { 0 } }, 1, { 0 } },
    { { 1, { 1 } }, 1, { 0 } },          { { 1, { 7 } }, 1, { -1 } },          { { 2, { 3, 5 } }, 1, { 0 } },
    { { 2, { 3, 5 } }, 1, { 1 } },       { { 2, { 3, 5 } }, 2, { 1, 0 } },     { { 2, { 3, 5 } }, 0, { 0 } },
    { { 3, { 2, 3, 9 } }, 2, { 0, 2 } }, { { 3, { 2, 3, 9 } }, 1, { 1 } },     { { 3, { 2, 3, 9 } }, 1, { -1 } },
    { { 1, { 4097 } }, 1, { 0 } },       { { 2, { 3, 0 } }, 1, { 1 } },        { { 2, { 0, 3 } }, 1, { 0 } },
    { { 2, { 2, 9001 } }, 1, { 1 } },    { { 2, { 20000, 3 } }, 1, { 0 } },   { { 4, { 2, 1, 3, 5 } }, 2, { 1, 3 } },
};
#define N_RED ((int)(sizeof RED_CASES / sizeof RED_CASES[0]))

static ctpu_tensor apply_red(int op, ctpu_tensor a, int nd, const int *d, bool keep, int corr)
{
    switch (op) {
    case CTPU_OP_SUM: return ctpu_sum(a, nd, d, keep);
    case CTPU_OP_MEAN: return ctpu_mean(a, nd, d, keep);
    case CTPU_OP_MAX: return ctpu_max(a, nd, d, keep);
    case CTPU_OP_MIN: return ctpu_min(a, nd, d, keep);
    case CTPU_OP_VAR: return ctpu_var(a, nd, d, corr, keep);
    case CTPU_OP_PROD: return ctpu_prod(a, nd, d, keep);
    default: return CTPU_NULL;
    }
}

/* Output shape and, per output element, the list of input elements reduced. */
static void red_geometry(const shp *s, int ndims, const int *dims, bool keep, uint32_t *mask, shp *out)
{
    *mask = 0;
    if (ndims == 0) *mask = s->nd ? (1u << s->nd) - 1 : 0;
    for (int i = 0; i < ndims; i++)
        if (s->nd) *mask |= 1u << (dims[i] < 0 ? dims[i] + s->nd : dims[i]);
    out->nd = 0;
    for (int d = 0; d < s->nd; d++) {
        if (*mask & (1u << d)) { if (keep) out->s[out->nd++] = 1; }
        else out->s[out->nd++] = s->s[d];
    }
}

/* Input element index -> output element index. */
static int64_t red_out_index(int64_t i, const shp *s, uint32_t mask)
{
    int64_t o = 0;
    int64_t coord[4];
    for (int d = s->nd - 1; d >= 0; d--) { coord[d] = i % s->s[d]; i /= s->s[d]; }
    for (int d = 0; d < s->nd; d++)
        if (!(mask & (1u << d))) o = o * s->s[d] + coord[d];
    return o;
}

static void case_reduction(int op)
{
    const char *name = ctpu_op_name(op);
    for (int ci = 0; ci < N_RED; ci++) {
        const rcase *rc = &RED_CASES[ci];
        int64_t n = t_numel(rc->s.nd, rc->s.s);
        float *x = malloc((size_t)(n + 1) * 4);
        fill(x, n, (uint64_t)(ci * 3 + op), -3.0f, 5.0f, false);
        if (op == CTPU_OP_PROD) {   /* factors of magnitude [0.9, 1.1], either sign: no overflow at 20000 */
            fill(x, n, (uint64_t)(ci * 3 + op), 0.9f, 1.1f, false);
            for (int64_t i = 0; i < n; i += 3) x[i] = -x[i];
        }
        for (int keep = 0; keep < 2; keep++) {
            for (int dt = 0; dt < 2; dt++) {
                uint32_t mask;
                shp os;
                red_geometry(&rc->s, rc->ndims, rc->dims, keep, &mask, &os);
                int64_t no = t_numel(os.nd, os.s), cnt = no ? n / no : 0;
                if (no == 0) cnt = 0;
                else if (n == 0) cnt = 0;
                if ((op == CTPU_OP_MAX || op == CTPU_OP_MIN) && cnt == 0 && no > 0) continue; /* no identity */
                ctpu_tensor a = t_f32(x, rc->s.nd, rc->s.s);
                if (dt) a = ctpu_cast(a, CTPU_BF16);
                int corr = ci % 2;
                ctpu_tensor y = apply_red(op, a, rc->ndims, rc->dims, keep, corr);
                ck_assert_msg(!ctpu_is_null(y), "%s case %d: %s", name, ci, ctpu_last_error());
                ck_assert_int_eq(ctpu_dtype_of(y), dt ? CTPU_BF16 : CTPU_F32);
                t_expect_shape(y, os.nd, os.s);
                double *sum = calloc((size_t)(no + 1), sizeof(double)), *sabs = calloc((size_t)(no + 1), sizeof(double));
                double *mx = malloc((size_t)(no + 1) * sizeof(double)), *sq = calloc((size_t)(no + 1), sizeof(double));
                double *pr = malloc((size_t)(no + 1) * sizeof(double));
                for (int64_t o = 0; o < no; o++) mx[o] = op == CTPU_OP_MAX ? -INFINITY : INFINITY;
                for (int64_t o = 0; o < no; o++) pr[o] = 1.0;
                for (int64_t i = 0; i < n; i++) {
                    double v = dt ? bf16_round(x[i]) : x[i];
                    int64_t o = red_out_index(i, &rc->s, mask);
                    sum[o] += v;
                    sabs[o] += fabs(v);
                    pr[o] *= v;
                    mx[o] = ref_binary(op == CTPU_OP_MAX ? CTPU_K_B_MAX : CTPU_K_B_MIN, mx[o], v);
                }
                if (op == CTPU_OP_VAR) {
                    for (int64_t i = 0; i < n; i++) {
                        double v = dt ? bf16_round(x[i]) : x[i];
                        int64_t o = red_out_index(i, &rc->s, mask);
                        double m = sum[o] / (double)cnt;
                        sq[o] += (v - m) * (v - m);
                    }
                }
                float *g = t_read(y, NULL);
                for (int64_t o = 0; o < no; o++) {
                    double r, tol;
                    switch (op) {
                    case CTPU_OP_SUM: r = sum[o]; tol = (double)cnt * EPS * sabs[o]; break;
                    case CTPU_OP_MEAN:
                        r = sum[o] / (double)cnt;
                        tol = cnt ? (double)(cnt + 2) * EPS * sabs[o] / (double)cnt : 0;
                        break;
                    case CTPU_OP_VAR: {
                        double den = (double)cnt - corr;
                        if (den < 0) den = 0;
                        r = sq[o] / den;
                        double m = fabs(sum[o] / (double)cnt);
                        tol = cnt ? 4.0 * (double)(cnt + 2) * EPS * (sabs[o] + (double)cnt * m) * (sabs[o] / (double)cnt + m) / den : 0;
                        break;
                    }
                    case CTPU_OP_PROD: r = pr[o]; tol = (double)(cnt + 1) * EPS * fabs(r); break;
                    default: r = mx[o]; tol = 0; break;
                    }
                    tol += t_ulp_of(r);
                    if (dt) { tol += bf16_ulp(r); r = bf16_round(r); }
                    if (op == CTPU_OP_MAX || op == CTPU_OP_MIN) tol = 0;
                    char what[128];
                    snprintf(what, sizeof what, "%s case %d keep %d dt %d", name, ci, keep, dt);
                    expect_close(what, o, g[o], r, tol, 0, 0);
                }
                free(g); free(sum); free(sabs); free(mx); free(sq); free(pr);
                ctpu_release(y);
            }
        }
        free(x);
    }
    /* NaN and Inf */
    float v[4] = { 1, NAN, 3, INFINITY };
    int64_t s4 = 4;
    double r;
    ck_assert_int_eq(ctpu_item(apply_red(op, t_f32(v, 1, &s4), 0, NULL, false, 0), &r), CTPU_OK);
    ck_assert_msg(r != r, "%s with a NaN must be NaN", name);
    float w[3] = { 1, INFINITY, 2 };
    int64_t s3 = 3;
    ck_assert_int_eq(ctpu_item(apply_red(op, t_f32(w, 1, &s3), 0, NULL, false, 0), &r), CTPU_OK);
    if (op == CTPU_OP_MIN) ck_assert(r == 1);
    else if (op == CTPU_OP_VAR) ck_assert(r != r);
    else ck_assert(r == INFINITY);
    /* i32: sum/mean/var give f32; max/min stay i32 and are exact */
    int32_t iv[3] = { 16777217, -5, 16777216 };
    ctpu_tensor y = apply_red(op, t_i32(iv, 1, &s3), 0, NULL, false, 1);
    ck_assert_msg(!ctpu_is_null(y), "%s: %s", name, ctpu_last_error());
    bool keeps = op == CTPU_OP_MAX || op == CTPU_OP_MIN;
    ck_assert_int_eq(ctpu_dtype_of(y), keeps ? CTPU_I32 : CTPU_F32);
    if (keeps) {
        int32_t got;
        ck_assert_int_eq(ctpu_to_host(y, &got, 4), CTPU_OK);
        ck_assert_msg(got == (op == CTPU_OP_MAX ? 16777217 : -5), "%s of i32 = %d (not exact)", name, got);
    }
    /* sum of an empty tensor is 0; mean and var of an empty tensor are NaN
     * (as torch) */
    int64_t z = 0;
    ctpu_tensor e = ctpu_zeros(CTPU_F32, 1, &z);
    if (op == CTPU_OP_SUM || op == CTPU_OP_MEAN || op == CTPU_OP_VAR || op == CTPU_OP_PROD) {
        ck_assert_int_eq(ctpu_item(apply_red(op, e, 0, NULL, false, 1), &r), CTPU_OK);
        if (op == CTPU_OP_SUM) ck_assert(r == 0 && !signbit(r));
        else if (op == CTPU_OP_PROD) ck_assert_msg(r == 1, "prod of an empty tensor = %g, want 1", r);
        else ck_assert_msg(r != r, "%s of an empty tensor = %g, want NaN", name, r);
    }
    if (op == CTPU_OP_VAR) {
        ck_assert_int_eq(ctpu_item(ctpu_var(T_VEC(3), 0, NULL, 1, false), &r), CTPU_OK);
        ck_assert(r != r);
        /* torch divides by max(0, n - correction): 2 / 0 = inf, never negative */
        ck_assert_int_eq(ctpu_item(ctpu_var(T_VEC(3, 5), 0, NULL, 2, false), &r), CTPU_OK);
        ck_assert_msg(r == INFINITY, "var with n - correction = 0: %g", r);
        ck_assert_int_eq(ctpu_item(ctpu_var(T_VEC(3, 5), 0, NULL, 3, false), &r), CTPU_OK);
        ck_assert_msg(r == INFINITY, "var with n - correction < 0: %g, want inf", r);
        ck_assert_int_eq(ctpu_item(ctpu_var(T_VEC(3, 5), 0, NULL, 0, false), &r), CTPU_OK);
        ck_assert(r == 1);
    }
    /* a 0-d tensor reduces over dim 0 / -1 (as torch) */
    float one = 2.5f;
    ctpu_tensor sc = ctpu_from_host(&one, CTPU_F32, 0, NULL);
    for (int d = -1; d <= 0; d++) {
        ctpu_tensor y0 = apply_red(op, sc, 1, &d, d == 0, 0);
        ck_assert_msg(!ctpu_is_null(y0), "%s of a 0-d tensor over dim %d: %s", name, d, ctpu_last_error());
        ck_assert_int_eq(ctpu_ndim(y0), 0);
        ck_assert_int_eq(ctpu_item(y0, &r), CTPU_OK);
        if (op == CTPU_OP_VAR) ck_assert(r == 0);
        else ck_assert(r == 2.5);
    }
}

static ctpu_tensor argx(bool mn, ctpu_tensor a, int dim, bool keep)
{
    return mn ? ctpu_argmin(a, dim, keep) : ctpu_argmax(a, dim, keep);
}

/* argmax and argmin */
static void case_argmax(int op)
{
    bool mn = op == CTPU_OP_ARGMIN;
    /* first maximal (minimal) index; NaN counts as maximal (minimal): first NaN wins */
    static const struct { float v[6]; int n; int want, want_min; } c1[] = {
        { { 1, 3, 3, 2, 0, 0 }, 5, 1, 4 },
        { { 1, NAN, 3, NAN, 0, 0 }, 4, 1, 1 },
        { { -INFINITY, -INFINITY, 0, 0, 0, 0 }, 2, 0, 0 },
        { { 5, 1, 2, 9, INFINITY, 9 }, 6, 4, 1 },
        { { -0.0f, 0.0f, 0, 0, 0, 0 }, 2, 0, 0 },
        { { 7, 0, 0, 0, 0, 0 }, 1, 0, 0 },
        { { 2, -INFINITY, 1, -INFINITY, NAN, 0 }, 6, 4, 4 },
    };
    for (int i = 0; i < 7; i++) {
        int64_t n = c1[i].n;
        ctpu_tensor y = argx(mn, t_f32(c1[i].v, 1, &n), 0, false);
        ck_assert_msg(!ctpu_is_null(y), "argmax: %s", ctpu_last_error());
        ck_assert_int_eq(ctpu_dtype_of(y), CTPU_I32);
        ck_assert_int_eq(ctpu_ndim(y), 0);
        int32_t g;
        ck_assert_int_eq(ctpu_to_host(y, &g, 4), CTPU_OK);
        int want = mn ? c1[i].want_min : c1[i].want;
        ck_assert_msg(g == want, "%s case %d: %d want %d", ctpu_op_name(op), i, g, want);
    }
    /* along each dim of a [2,3,4], keepdim, bf16, vs a reference */
    int64_t s[3] = { 2, 3, 4 };
    float x[24];
    fill(x, 24, 5, -2, 2, false);
    x[5] = x[9] = mn ? -100 : 100;   /* a tie */
    for (int d = -3; d < 3; d++) {
        for (int keep = 0; keep < 2; keep++) {
            for (int dt = 0; dt < 2; dt++) {
                ctpu_tensor a = t_f32(x, 3, s);
                if (dt) a = ctpu_cast(a, CTPU_BF16);
                ctpu_tensor y = argx(mn, a, d, keep);
                ck_assert_msg(!ctpu_is_null(y), "argmax: %s", ctpu_last_error());
                int dd = d < 0 ? d + 3 : d;
                ck_assert_int_eq(ctpu_ndim(y), keep ? 3 : 2);
                int32_t *g = t_read_raw(y, NULL);
                int64_t inner = 1;
                for (int k = dd + 1; k < 3; k++) inner *= s[k];
                int64_t outer = 24 / (inner * s[dd]);
                for (int64_t o = 0; o < outer; o++)
                    for (int64_t in = 0; in < inner; in++) {
                        int best = 0;
                        double bv = mn ? INFINITY : -INFINITY;
                        for (int j = 0; j < s[dd]; j++) {
                            double v = x[(o * s[dd] + j) * inner + in];
                            if (dt) v = bf16_round(v);
                            if (mn ? v < bv : v > bv) { bv = v; best = j; }
                        }
                        ck_assert_int_eq(g[o * inner + in], best);
                    }
                free(g);
            }
        }
    }
    /* i32 input: exact comparison (16777217 > 16777216 though equal in f32) */
    int32_t iv[3] = { 16777216, 16777217, -1 }, ivm[3] = { 16777217, 16777216, 16777218 };
    int64_t s3 = 3;
    int32_t g;
    ck_assert_int_eq(ctpu_to_host(argx(mn, t_i32(mn ? ivm : iv, 1, &s3), 0, false), &g, 4), CTPU_OK);
    ck_assert_msg(g == 1, "%s of i32 = %d, want 1", ctpu_op_name(op), g);
    /* a 0-d tensor -> 0 */
    float one = 3;
    ck_assert_int_eq(ctpu_to_host(argx(mn, ctpu_from_host(&one, CTPU_F32, 0, NULL), 0, false), &g, 4), CTPU_OK);
    ck_assert_int_eq(g, 0);
    /* [4, 0] along dim 0 is an empty result, fine; along dim 1 an error */
    int64_t s40[2] = { 4, 0 };
    ck_assert(ctpu_is_null(argx(mn, ctpu_zeros(CTPU_F32, 2, s40), 1, false)));
    ck_assert(t_contains(ctpu_last_error(), ctpu_op_name(op)));
    ctpu_tensor e = argx(mn, ctpu_zeros(CTPU_F32, 2, s40), 0, false);
    ck_assert(!ctpu_is_null(e));
    ck_assert_int_eq(ctpu_numel(e), 0);
}

static void case_softmax(int op)
{
    bool lg = op == CTPU_OP_LOG_SOFTMAX;
    const char *name = ctpu_op_name(op);
    static const struct { shp s; int dim; } cs[] = {
        { { 1, { 1 } }, 0 },       { { 1, { 7 } }, -1 },       { { 2, { 3, 5 } }, 0 },  { { 2, { 3, 5 } }, 1 },
        { { 3, { 2, 3, 4 } }, 1 }, { { 3, { 2, 3, 4 } }, 0 },  { { 1, { 5000 } }, 0 }, { { 2, { 0, 4 } }, 1 },
        { { 0, { 0 } }, 0 },
    };
    for (int ci = 0; ci < 9; ci++) {
        int64_t n = t_numel(cs[ci].s.nd, cs[ci].s.s);
        float *x = malloc((size_t)(n + 1) * 4);
        fill(x, n, (uint64_t)ci, -10, 10, false);
        if (n > 3) { x[0] = -INFINITY; x[2] = 1e4f; }
        for (int dt = 0; dt < 2; dt++) {
            ctpu_tensor a = t_f32(x, cs[ci].s.nd, cs[ci].s.s);
            if (dt) a = ctpu_cast(a, CTPU_BF16);
            ctpu_tensor y = lg ? ctpu_log_softmax(a, cs[ci].dim) : ctpu_softmax(a, cs[ci].dim);
            ck_assert_msg(!ctpu_is_null(y), "%s: %s", name, ctpu_last_error());
            ck_assert_int_eq(ctpu_dtype_of(y), dt ? CTPU_BF16 : CTPU_F32);
            t_expect_shape(y, cs[ci].s.nd, cs[ci].s.s);
            float *g = t_read(y, NULL);
            int nd = cs[ci].s.nd, d = cs[ci].dim < 0 ? cs[ci].dim + nd : cs[ci].dim;
            int64_t len = nd ? cs[ci].s.s[d] : 1, inner = 1;
            for (int k = d + 1; k < nd; k++) inner *= cs[ci].s.s[k];
            int64_t outer = len && inner ? n / (len * inner) : 0;
            for (int64_t o = 0; o < outer; o++)
                for (int64_t in = 0; in < inner; in++) {
                    double m = -INFINITY, s = 0;
                    for (int64_t j = 0; j < len; j++) {
                        double v = x[(o * len + j) * inner + in];
                        if (dt) v = bf16_round(v);
                        if (v > m) m = v;
                    }
                    for (int64_t j = 0; j < len; j++) {
                        double v = x[(o * len + j) * inner + in];
                        if (dt) v = bf16_round(v);
                        s += exp(v - m);
                    }
                    for (int64_t j = 0; j < len; j++) {
                        int64_t i = (o * len + j) * inner + in;
                        double v = dt ? bf16_round(x[i]) : x[i];
                        double r, tol;
                        if (lg) {
                            r = (v - m) - log(s);
                            tol = (double)(len + 8) * EPS * (fabs(v - m) + fabs(log(s)) + 1);
                        } else {
                            r = exp(v - m) / s;
                            tol = isinf(v) ? 0 : ((double)len + 8 + fabs(v - m)) * EPS * r + ldexp(1.0, -126);
                        }
                        if (dt) { tol += bf16_ulp(r); r = bf16_round(r); }
                        expect_close(name, i, g[i], r, tol, (float)v, 0);
                    }
                }
            free(g);
        }
        free(x);
    }
    /* i32 input gives f32 */
    int32_t iv[3] = { 1, 2, 3 };
    int64_t s3 = 3;
    ctpu_tensor y = lg ? ctpu_log_softmax(t_i32(iv, 1, &s3), 0) : ctpu_softmax(t_i32(iv, 1, &s3), 0);
    ck_assert_int_eq(ctpu_dtype_of(y), CTPU_F32);
    /* a row of -inf is NaN (as torch), a row of equal values is uniform */
    float e[4] = { 2, 2, 2, 2 };
    int64_t s4 = 4;
    float *g = t_read(lg ? ctpu_log_softmax(t_f32(e, 1, &s4), 0) : ctpu_softmax(t_f32(e, 1, &s4), 0), NULL);
    for (int i = 0; i < 4; i++) ck_assert(g[i] == (lg ? logf(0.25f) : 0.25f) || t_ulps(g[i], lg ? -1.3862944f : 0.25f) <= 1);
    free(g);
}

/* ------------------------------------------------------------ movement */
static void expect_f32_vals(ctpu_tensor t, const float *want, int64_t n, const char *what)
{
    int64_t gn;
    float *g = t_read(t, &gn);
    T_CHECK(gn == n, "%s: numel %lld want %lld", what, (long long)gn, (long long)n);
    for (int64_t i = 0; i < n; i++)
        T_CHECK(t_same(g[i], want[i]), "%s: element %lld: %g want %g", what, (long long)i, g[i], want[i]);
    free(g);
}

static void case_reshape(int op)
{
    (void)op;
    float x[12];
    for (int i = 0; i < 12; i++) x[i] = (float)i;
    int64_t s12 = 12;
    ctpu_tensor a = t_f32(x, 1, &s12);
    static const shp shapes[] = { { 2, { 3, 4 } }, { 3, { 2, -1, 3 } }, { 4, { 1, 12, 1, 1 } }, { 2, { -1, 1 } } };
    for (int i = 0; i < 4; i++) {
        ctpu_tensor r = ctpu_reshape(a, shapes[i].nd, shapes[i].s);
        ck_assert_msg(!ctpu_is_null(r), "reshape: %s", ctpu_last_error());
        ck_assert_int_eq(ctpu_ndim(r), shapes[i].nd);
        ck_assert_int_eq(ctpu_numel(r), 12);
        expect_f32_vals(r, x, 12, "reshape");
    }
    ck_assert_int_eq(ctpu_dim(ctpu_reshape(a, 3, (int64_t[]){ 2, -1, 3 }), 1), 2);
    /* 0-d <-> [1]; 0-size */
    ctpu_tensor one = ctpu_reshape(T_VEC(5), 0, NULL);
    ck_assert_int_eq(ctpu_ndim(one), 0);
    double v;
    ck_assert_int_eq(ctpu_item(one, &v), CTPU_OK);
    ck_assert(v == 5);
    int64_t z[2] = { 0, 3 };
    ctpu_tensor e = ctpu_reshape(ctpu_zeros(CTPU_F32, 2, z), 3, (int64_t[]){ 3, 0, 5 });
    ck_assert(!ctpu_is_null(e));
    ck_assert_int_eq(ctpu_numel(e), 0);
    /* contiguous: a handle to the same value; bf16 and i32 reshape keep bits */
    expect_f32_vals(ctpu_contiguous(a), x, 12, "contiguous");
    int32_t iv[4] = { INT32_MAX, -1, 16777217, 0 };
    int64_t s4 = 4;
    int32_t *gi = t_read_raw(ctpu_reshape(t_i32(iv, 1, &s4), 2, (int64_t[]){ 2, 2 }), NULL);
    ck_assert(memcmp(gi, iv, sizeof iv) == 0);
    free(gi);
}

static void case_permute(int op)
{
    (void)op;
    int64_t s[3] = { 2, 3, 4 };
    float x[24];
    for (int i = 0; i < 24; i++) x[i] = (float)i;
    static const int perms[][3] = { { 0, 1, 2 }, { 2, 0, 1 }, { 1, 0, 2 }, { 2, 1, 0 }, { -1, 0, 1 } };
    for (int p = 0; p < 5; p++) {
        for (int dt = 0; dt < 3; dt++) {
            ctpu_tensor a = t_f32(x, 3, s);
            if (dt) a = ctpu_cast(a, dt == 1 ? CTPU_BF16 : CTPU_I32);
            ctpu_tensor y = ctpu_permute(a, perms[p]);
            ck_assert_msg(!ctpu_is_null(y), "permute: %s", ctpu_last_error());
            ck_assert_int_eq(ctpu_dtype_of(y), dt == 0 ? CTPU_F32 : dt == 1 ? CTPU_BF16 : CTPU_I32);
            int pp[3];
            int64_t os[3];
            for (int d = 0; d < 3; d++) { pp[d] = perms[p][d] < 0 ? perms[p][d] + 3 : perms[p][d]; os[d] = s[pp[d]]; }
            t_expect_shape(y, 3, os);
            float *g = t_read(y, NULL);
            int64_t i = 0;
            for (int64_t a0 = 0; a0 < os[0]; a0++)
                for (int64_t a1 = 0; a1 < os[1]; a1++)
                    for (int64_t a2 = 0; a2 < os[2]; a2++, i++) {
                        int64_t c[3];
                        c[pp[0]] = a0; c[pp[1]] = a1; c[pp[2]] = a2;
                        ck_assert(g[i] == x[(c[0] * 3 + c[1]) * 4 + c[2]]);
                    }
            free(g);
        }
    }
    /* transpose, 0-size, 0-d */
    int64_t s23[2] = { 2, 3 };
    float y23[6] = { 1, 2, 3, 4, 5, 6 }, t32[6] = { 1, 4, 2, 5, 3, 6 };
    expect_f32_vals(ctpu_transpose(t_f32(y23, 2, s23), 0, -1), t32, 6, "transpose");
    int64_t z[3] = { 2, 0, 3 };
    ctpu_tensor e = ctpu_permute(ctpu_zeros(CTPU_F32, 3, z), (int[]){ 2, 1, 0 });
    ck_assert(!ctpu_is_null(e));
    t_expect_shape(e, 3, (int64_t[]){ 3, 0, 2 });
    float one = 4;
    ctpu_tensor sc = ctpu_permute(ctpu_from_host(&one, CTPU_F32, 0, NULL), NULL);
    ck_assert_msg(!ctpu_is_null(sc), "permute of 0-d: %s", ctpu_last_error());
}

static void case_slice(int op)
{
    (void)op;
    float x[10];
    for (int i = 0; i < 10; i++) x[i] = (float)i;
    int64_t s10 = 10;
    ctpu_tensor a = t_f32(x, 1, &s10);
    static const struct { int64_t st, en, step; } cs[] = {
        { 0, 10, 1 }, { 2, 7, 1 }, { 1, 10, 3 }, { -3, 100, 1 }, { -100, -8, 1 }, { 5, 2, 1 },
        { 9, 10, 4 }, { 0, INT64_MAX, 7 }, { 3, 4, 2 }, { INT64_MIN, INT64_MAX, 1 }, { 12, 20, 1 },
        { 0, 10, INT64_MAX },
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        int64_t st = cs[c].st, en = cs[c].en;
        if (st < 0) st = st < -10 ? 0 : st + 10;
        if (en < 0) en = en < -10 ? 0 : en + 10;
        if (st > 10) st = 10;
        if (en > 10) en = 10;
        float want[10];
        int64_t n = 0;
        for (int64_t i = st; i < en; i += cs[c].step) {
            want[n++] = (float)i;
            if (cs[c].step > 10) break;
        }
        ctpu_tensor y = ctpu_slice(a, 0, cs[c].st, cs[c].en, cs[c].step);
        ck_assert_msg(!ctpu_is_null(y), "slice case %zu: %s", c, ctpu_last_error());
        char what[32];
        snprintf(what, sizeof what, "slice case %zu", c);
        expect_f32_vals(y, want, n, what);
    }
    /* along an inner dim (a copy, not a view) and with step on 2-D */
    int64_t s34[2] = { 3, 4 };
    float m[12];
    for (int i = 0; i < 12; i++) m[i] = (float)i;
    ctpu_tensor b = t_f32(m, 2, s34);
    expect_f32_vals(ctpu_slice(b, 1, 1, 3, 1), (float[]){ 1, 2, 5, 6, 9, 10 }, 6, "slice dim 1");
    expect_f32_vals(ctpu_slice(b, -1, 0, 4, 3), (float[]){ 0, 3, 4, 7, 8, 11 }, 6, "slice step 3");
    expect_f32_vals(ctpu_slice(b, -2, 0, 4, 3), (float[]){ 0, 1, 2, 3 }, 4, "slice dim -2 step 3");
    expect_f32_vals(ctpu_slice(b, 0, 1, 3, 1), (float[]){ 4, 5, 6, 7, 8, 9, 10, 11 }, 8, "slice dim 0");
    expect_f32_vals(ctpu_slice(b, 0, 0, 3, 2), (float[]){ 0, 1, 2, 3, 8, 9, 10, 11 }, 8, "slice dim 0 step 2");
    /* bf16 view at an offset */
    expect_f32_vals(ctpu_slice(ctpu_cast(a, CTPU_BF16), 0, 7, 10, 1), (float[]){ 7, 8, 9 }, 3, "slice bf16");
}

static void case_concat(int op)
{
    (void)op;
    int64_t s23[2] = { 2, 3 }, s13[2] = { 1, 3 }, s03[2] = { 0, 3 }, s21[2] = { 2, 1 };
    float a[6] = { 1, 2, 3, 4, 5, 6 }, b[3] = { 7, 8, 9 }, c[2] = { -1, -2 };
    ctpu_tensor ta = t_f32(a, 2, s23), tb = t_f32(b, 2, s13), tz = ctpu_zeros(CTPU_F32, 2, s03), tc = t_f32(c, 2, s21);
    ctpu_tensor y = ctpu_concat(3, (ctpu_tensor[]){ ta, tz, tb }, 0);
    ck_assert_msg(!ctpu_is_null(y), "concat: %s", ctpu_last_error());
    t_expect_shape(y, 2, (int64_t[]){ 3, 3 });
    expect_f32_vals(y, (float[]){ 1, 2, 3, 4, 5, 6, 7, 8, 9 }, 9, "concat dim 0");
    y = ctpu_concat(2, (ctpu_tensor[]){ tc, ta }, -1);
    t_expect_shape(y, 2, (int64_t[]){ 2, 4 });
    expect_f32_vals(y, (float[]){ -1, 1, 2, 3, -2, 4, 5, 6 }, 8, "concat dim 1");
    expect_f32_vals(ctpu_concat(1, &ta, 1), a, 6, "concat of one");
    /* more than 16 inputs */
    ctpu_tensor many[40];
    float want[40];
    for (int i = 0; i < 40; i++) { many[i] = T_VEC((float)i); want[i] = (float)i; }
    expect_f32_vals(ctpu_concat(40, many, 0), want, 40, "concat of 40");
    /* bf16 and i32 keep their bits */
    int32_t iv[2] = { 16777217, -3 };
    int64_t s2 = 2;
    ctpu_tensor ti = t_i32(iv, 1, &s2);
    ctpu_tensor yi = ctpu_concat(2, (ctpu_tensor[]){ ti, ti }, 0);
    ck_assert_int_eq(ctpu_dtype_of(yi), CTPU_I32);
    int32_t *gi = t_read_raw(yi, NULL);
    ck_assert(gi[0] == 16777217 && gi[3] == -3);
    free(gi);
    /* 3-D along the middle */
    int64_t s212[3] = { 2, 1, 2 }, s222[3] = { 2, 2, 2 };
    float p[4] = { 1, 2, 3, 4 }, q[8] = { 5, 6, 7, 8, 9, 10, 11, 12 };
    expect_f32_vals(ctpu_concat(2, (ctpu_tensor[]){ t_f32(p, 3, s212), t_f32(q, 3, s222) }, 1),
                    (float[]){ 1, 2, 5, 6, 7, 8, 3, 4, 9, 10, 11, 12 }, 12, "concat 3-D");
}

static void case_expand(int op)
{
    (void)op;
    int64_t s31[2] = { 3, 1 };
    float a[3] = { 1, 2, 3 };
    ctpu_tensor t = t_f32(a, 2, s31);
    ctpu_tensor y = ctpu_expand(t, 3, (int64_t[]){ 2, 3, 4 });
    ck_assert_msg(!ctpu_is_null(y), "expand: %s", ctpu_last_error());
    t_expect_shape(y, 3, (int64_t[]){ 2, 3, 4 });
    float want[24];
    for (int i = 0; i < 24; i++) want[i] = a[(i / 4) % 3];
    expect_f32_vals(y, want, 24, "expand");
    y = ctpu_expand(t, 2, (int64_t[]){ -1, 2 });
    expect_f32_vals(y, (float[]){ 1, 1, 2, 2, 3, 3 }, 6, "expand -1");
    y = ctpu_expand(t, 2, (int64_t[]){ 3, 0 });
    ck_assert(!ctpu_is_null(y));
    ck_assert_int_eq(ctpu_numel(y), 0);
    float one = 7;
    y = ctpu_expand(ctpu_from_host(&one, CTPU_F32, 0, NULL), 1, (int64_t[]){ 5 });
    expect_f32_vals(y, (float[]){ 7, 7, 7, 7, 7 }, 5, "expand 0-d");
    int32_t iv = 16777217;
    int64_t s1 = 1;
    int32_t *gi = t_read_raw(ctpu_expand(t_i32(&iv, 1, &s1), 2, (int64_t[]){ 2, 2 }), NULL);
    ck_assert(gi[0] == 16777217 && gi[3] == 16777217);
    free(gi);
}

static void case_embedding(int op)
{
    (void)op;
    int64_t ws[2] = { 4, 3 };
    float w[12];
    for (int i = 0; i < 12; i++) w[i] = (float)i + 0.5f;
    int32_t idx[6] = { 3, 0, 0, 2, 1, 3 };
    int64_t is[2] = { 2, 3 };
    for (int dt = 0; dt < 2; dt++) {
        ctpu_tensor wt = t_f32(w, 2, ws);
        if (dt) wt = ctpu_cast(wt, CTPU_BF16);
        ctpu_tensor y = ctpu_embedding(wt, t_i32(idx, 2, is));
        ck_assert_msg(!ctpu_is_null(y), "embedding: %s", ctpu_last_error());
        ck_assert_int_eq(ctpu_dtype_of(y), dt ? CTPU_BF16 : CTPU_F32);
        t_expect_shape(y, 3, (int64_t[]){ 2, 3, 3 });
        float want[18];
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 3; j++) want[i * 3 + j] = w[idx[i] * 3 + j];
        expect_f32_vals(y, want, 18, "embedding");
    }
    int64_t z = 0;
    ctpu_tensor e = ctpu_embedding(t_f32(w, 2, ws), ctpu_zeros(CTPU_I32, 1, &z));
    ck_assert(!ctpu_is_null(e));
    t_expect_shape(e, 2, (int64_t[]){ 0, 3 });
    int32_t i0 = 2;
    ctpu_tensor e0 = ctpu_embedding(t_f32(w, 2, ws), t_i32(&i0, 0, NULL));
    expect_f32_vals(e0, (float[]){ 6.5f, 7.5f, 8.5f }, 3, "embedding 0-d index");
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
}

static void case_gather(int op)
{
    (void)op;
    int64_t s23[2] = { 2, 3 };
    float a[6] = { 1, 2, 3, 4, 5, 6 };
    int32_t i1[4] = { 2, 0, 1, 1 };
    int64_t is1[2] = { 2, 2 };
    ctpu_tensor y = ctpu_gather(t_f32(a, 2, s23), 1, t_i32(i1, 2, is1));
    ck_assert_msg(!ctpu_is_null(y), "gather: %s", ctpu_last_error());
    expect_f32_vals(y, (float[]){ 3, 1, 5, 5 }, 4, "gather dim 1");
    int32_t i0[3] = { 1, 0, 1 };
    int64_t is0[2] = { 1, 3 };
    y = ctpu_gather(t_f32(a, 2, s23), 0, t_i32(i0, 2, is0));
    expect_f32_vals(y, (float[]){ 4, 2, 6 }, 3, "gather dim 0");
    y = ctpu_gather(ctpu_cast(t_f32(a, 2, s23), CTPU_BF16), -1, t_i32(i1, 2, is1));
    ck_assert_int_eq(ctpu_dtype_of(y), CTPU_BF16);
    expect_f32_vals(y, (float[]){ 3, 1, 5, 5 }, 4, "gather bf16");
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
}

/* ------------------------------------------------------------ matmul */
static void mm_check(int nda, const int64_t *sa, int ndb, const int64_t *sb, int dta, int dtb, ctpu_precision prec)
{
    int64_t na = t_numel(nda, sa), nb = t_numel(ndb, sb);
    float *xa = malloc((size_t)(na + 1) * 4), *xb = malloc((size_t)(nb + 1) * 4);
    fill(xa, na, (uint64_t)(na * 3 + nda), -2, 2, false);
    fill(xb, nb, (uint64_t)(nb * 5 + ndb), -2, 2, false);
    ctpu_tensor a = t_f32(xa, nda, sa), b = t_f32(xb, ndb, sb);
    if (dta == CTPU_BF16) a = ctpu_cast(a, CTPU_BF16);
    if (dtb == CTPU_BF16) b = ctpu_cast(b, CTPU_BF16);
    ck_assert_int_eq(ctpu_set_matmul_precision(prec), CTPU_OK);
    ctpu_tensor y = ctpu_matmul(a, b);
    ck_assert_int_eq(ctpu_set_matmul_precision(CTPU_PRECISION_DEFAULT), CTPU_OK);
    ck_assert_msg(!ctpu_is_null(y), "matmul: %s", ctpu_last_error());
    ctpu_dtype want = dta == CTPU_BF16 && dtb == CTPU_BF16 ? CTPU_BF16 : CTPU_F32;
    ck_assert_int_eq(ctpu_dtype_of(y), want);
    /* torch.matmul shapes: promote 1-D, broadcast batch */
    int64_t A[8], B[8];
    int ma = nda, mb = ndb;
    memcpy(A, sa, sizeof(int64_t) * (size_t)nda);
    memcpy(B, sb, sizeof(int64_t) * (size_t)ndb);
    if (nda == 1) { A[0] = 1; A[1] = sa[0]; ma = 2; }
    if (ndb == 1) { B[0] = sb[0]; B[1] = 1; mb = 2; }
    int64_t M = A[ma - 2], K = A[ma - 1], N = B[mb - 1];
    int nbd = (ma > mb ? ma : mb) - 2;
    int64_t bat[8], batch = 1;
    for (int d = 0; d < nbd; d++) {
        int da = d - (nbd - (ma - 2)), db = d - (nbd - (mb - 2));
        int64_t xa_ = da >= 0 ? A[da] : 1, xb_ = db >= 0 ? B[db] : 1;
        bat[d] = xa_ == 1 ? xb_ : xa_;
        batch *= bat[d];
    }
    int64_t os[8];
    int ond = 0;
    for (int d = 0; d < nbd; d++) os[ond++] = bat[d];
    if (nda != 1) os[ond++] = M;
    if (ndb != 1) os[ond++] = N;
    t_expect_shape(y, ond, os);
    float *g = t_read(y, NULL);
    for (int64_t bi = 0; bi < batch; bi++) {
        /* batch coordinate -> offsets in a and b */
        int64_t rem = bi, oa = 0, ob = 0, sta = M * K, stb = K * N;
        int64_t coord[8];
        for (int d = nbd - 1; d >= 0; d--) { coord[d] = rem % bat[d]; rem /= bat[d]; }
        for (int d = nbd - 1; d >= 0; d--) {
            int da = d - (nbd - (ma - 2)), db = d - (nbd - (mb - 2));
            if (da >= 0) { if (A[da] != 1) oa += coord[d] * sta; sta *= A[da]; }
            if (db >= 0) { if (B[db] != 1) ob += coord[d] * stb; stb *= B[db]; }
        }
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0, mag = 0;
                for (int64_t k = 0; k < K; k++) {
                    double va = xa[oa + i * K + k], vb = xb[ob + k * N + j];
                    if (dta == CTPU_BF16 || prec == CTPU_PRECISION_DEFAULT) va = bf16_round(va);
                    if (dtb == CTPU_BF16 || prec == CTPU_PRECISION_DEFAULT) vb = bf16_round(vb);
                    acc += va * vb;
                    mag += fabs(va * vb);
                }
                double tol = prec == CTPU_PRECISION_DEFAULT ? (double)K * EPS * mag
                           : prec == CTPU_PRECISION_HIGH ? ((double)K * EPS + ldexp(1.0, -15)) * mag
                                                          : ((double)K + 8) * EPS * mag;
                tol += t_ulp_of(acc);
                if (want == CTPU_BF16) { tol += bf16_ulp(acc); acc = bf16_round(acc); }
                char what[192];
                snprintf(what, sizeof what, "matmul M%lld N%lld K%lld batch %lld prec %d", (long long)M,
                         (long long)N, (long long)K, (long long)bi, (int)prec);
                expect_close(what, (bi * M + i) * N + j, g[(bi * M + i) * N + j], acc, tol, 0, 0);
                if (K == 0) ck_assert(t_f2u(g[(bi * M + i) * N + j]) == 0);   /* +0 */
            }
    }
    free(g); free(xa); free(xb);
}

/* scaled_dot_product_attention (and, through its gradient, sdpa_backward):
 * q [1,2,3,4], k and v [1,2,5,4], an additive mask [3,5] with a -inf,
 * causal on the second call; against float64 with q, k, v rounded to bf16
 * (the MXU's operands), within 2^-7 of the largest reference value (the
 * bound of tests/test_sdpa.c, which has the wider cases). */
static void case_sdpa(int op)
{
    (void)op;
    const int64_t Tq = 3, Tk = 5, D = 4, H = 2;
    int64_t sq[4] = { 1, H, Tq, D }, sk[4] = { 1, H, Tk, D }, sm[2] = { Tq, Tk };
    float q[24], k[40], v[40], m[15], w[24];
    fill(q, 24, 41, -2, 2, false);
    fill(k, 40, 42, -2, 2, false);
    fill(v, 40, 43, -1, 1, false);
    fill(w, 24, 44, -1, 1, false);
    fill(m, 15, 45, -1, 1, false);
    m[6] = -INFINITY;
    for (int causal = 0; causal < 2; causal++) {
        ctpu_tensor Q = t_f32(q, 4, sq), K = t_f32(k, 4, sk), V = t_f32(v, 4, sk), M = t_f32(m, 2, sm);
        ck_assert_int_eq(ctpu_set_requires_grad(Q, true), CTPU_OK);
        ck_assert_int_eq(ctpu_set_requires_grad(V, true), CTPU_OK);
        ctpu_tensor O = ctpu_scaled_dot_product_attention(Q, K, V, M, CTPU_MASK_ADDITIVE, causal, 0, 0);
        ck_assert_msg(!ctpu_is_null(O), "sdpa: %s", ctpu_last_error());
        ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(O, t_f32(w, 4, sq)), 0, NULL, false)), CTPU_OK);
        float *o = t_read(O, NULL), *gv = t_read(ctpu_grad(V), NULL);
        double ro[24] = { 0 }, rgv[40] = { 0 }, mo = 0, mg = 0;
        for (int h = 0; h < H; h++)
            for (int i = 0; i < Tq; i++) {
                double p[5], mx = -INFINITY, l = 0;
                for (int j = 0; j < Tk; j++) {
                    double sdot = 0;
                    for (int e = 0; e < D; e++)
                        sdot += (double)ctpu_bf16_to_f32(ctpu_f32_to_bf16(q[(h * Tq + i) * D + e])) *
                                ctpu_bf16_to_f32(ctpu_f32_to_bf16(k[(h * Tk + j) * D + e]));
                    p[j] = (causal && j > i) ? -INFINITY : sdot * 0.5 + m[i * Tk + j];
                    if (p[j] > mx) mx = p[j];
                }
                for (int j = 0; j < Tk; j++) { p[j] = exp(p[j] - mx); l += p[j]; }
                for (int j = 0; j < Tk; j++)
                    for (int e = 0; e < D; e++) {
                        ro[(h * Tq + i) * D + e] += p[j] / l * ctpu_bf16_to_f32(ctpu_f32_to_bf16(v[(h * Tk + j) * D + e]));
                        rgv[(h * Tk + j) * D + e] += p[j] / l * w[(h * Tq + i) * D + e];
                    }
            }
        for (int i = 0; i < 24; i++) mo = fmax(mo, fabs(ro[i]));
        for (int i = 0; i < 40; i++) mg = fmax(mg, fabs(rgv[i]));
        for (int i = 0; i < 24; i++)
            ck_assert_msg(fabs(o[i] - ro[i]) <= mo / 128, "sdpa causal=%d o[%d] = %g vs %g", causal, i, o[i], ro[i]);
        for (int i = 0; i < 40; i++)
            ck_assert_msg(fabs(gv[i] - rgv[i]) <= mg / 128, "sdpa_backward causal=%d dv[%d] = %g vs %g", causal, i,
                          gv[i], rgv[i]);
        free(o);
        free(gv);
    }
}

static void case_matmul(int op)
{
    (void)op;
    static const struct { int na; int64_t a[4]; int nb; int64_t b[4]; } cs[] = {
        { 2, { 3, 5 }, 2, { 5, 4 } },       { 2, { 1, 1 }, 2, { 1, 1 } },        { 2, { 7, 9 }, 2, { 9, 1 } },
        { 2, { 0, 4 }, 2, { 4, 3 } },       { 2, { 3, 0 }, 2, { 0, 2 } },        { 1, { 6 }, 2, { 6, 3 } },
        { 2, { 4, 6 }, 1, { 6 } },          { 1, { 7 }, 1, { 7 } },              { 3, { 2, 3, 4 }, 2, { 4, 5 } },
        { 4, { 2, 1, 3, 4 }, 3, { 5, 4, 2 } }, { 2, { 3, 4 }, 3, { 2, 4, 5 } }, { 2, { 33, 131 }, 2, { 131, 17 } },
        { 3, { 3, 1, 5 }, 3, { 1, 5, 2 } },
    };
    int ncs = (int)(sizeof cs / sizeof cs[0]);
    for (int c = 0; c < ncs; c++) {
        mm_check(cs[c].na, cs[c].a, cs[c].nb, cs[c].b, CTPU_F32, CTPU_F32, CTPU_PRECISION_DEFAULT);
        mm_check(cs[c].na, cs[c].a, cs[c].nb, cs[c].b, CTPU_BF16, CTPU_BF16, CTPU_PRECISION_DEFAULT);
        mm_check(cs[c].na, cs[c].a, cs[c].nb, cs[c].b, CTPU_F32, CTPU_BF16, CTPU_PRECISION_DEFAULT);
    }
    for (int c = 0; c < ncs; c += 3) {
        mm_check(cs[c].na, cs[c].a, cs[c].nb, cs[c].b, CTPU_F32, CTPU_F32, CTPU_PRECISION_HIGH);
        mm_check(cs[c].na, cs[c].a, cs[c].nb, cs[c].b, CTPU_F32, CTPU_F32, CTPU_PRECISION_HIGHEST);
    }
    /* i32 @ i32 is exact (wrapping) */
    int32_t ia[4] = { 100000, 3, -7, 1 }, ib[4] = { 30000, 2, 1, -5 };
    int64_t s22[2] = { 2, 2 };
    ctpu_tensor y = ctpu_matmul(t_i32(ia, 2, s22), t_i32(ib, 2, s22));
    ck_assert_msg(!ctpu_is_null(y), "matmul i32: %s", ctpu_last_error());
    ck_assert_int_eq(ctpu_dtype_of(y), CTPU_I32);
    int32_t *g = t_read_raw(y, NULL);
    ck_assert_int_eq(g[0], (int32_t)(uint32_t)(100000LL * 30000 + 3 * 1));
    ck_assert_int_eq(g[1], 100000 * 2 + 3 * -5);
    ck_assert_int_eq(g[2], -7 * 30000 + 1);
    ck_assert_int_eq(g[3], -7 * 2 + -5);
    free(g);
    /* NaN and Inf propagate */
    int64_t s12[2] = { 1, 2 }, s21[2] = { 2, 1 };
    float an[2] = { NAN, 1 }, ai[2] = { INFINITY, 1 }, bb[2] = { 1, 1 };
    double r;
    ck_assert_int_eq(ctpu_item(ctpu_matmul(t_f32(an, 2, s12), t_f32(bb, 2, s21)), &r), CTPU_OK);
    ck_assert(r != r);
    ck_assert_int_eq(ctpu_item(ctpu_matmul(t_f32(ai, 2, s12), t_f32(bb, 2, s21)), &r), CTPU_OK);
    ck_assert(r == INFINITY);
}

/* ------------------------------------------------------------ assign (COPY) */
static void case_copy(int op)
{
    (void)op;
    int64_t dispatched = ctpu_metric_counter("ops_dispatched");
    ctpu_tensor d = T_VEC(1, 2, 3);
    ck_assert_int_eq(ctpu_assign(d, T_VEC(NAN, -0.0f, INFINITY)), CTPU_OK);
    ck_assert_int_gt(ctpu_metric_counter("ops_dispatched"), dispatched);
    float *g = t_read(d, NULL);
    ck_assert(g[0] != g[0] && t_f2u(g[1]) == 0x80000000u && g[2] == INFINITY);
    free(g);
    for (int dt = 1; dt < 3; dt++) {
        int64_t n = 5;
        ctpu_tensor a = ctpu_zeros((ctpu_dtype)dt, 1, &n), b = ctpu_arange(-2, 3, 1, (ctpu_dtype)dt);
        ck_assert_int_eq(ctpu_assign(a, b), CTPU_OK);
        expect_f32_vals(a, (float[]){ -2, -1, 0, 1, 2 }, 5, "assign");
    }
    int64_t z = 0;
    ck_assert_int_eq(ctpu_assign(ctpu_zeros(CTPU_F32, 1, &z), ctpu_ones(CTPU_F32, 1, &z)), CTPU_OK);
}

/* ------------------------------------------------------------ creation */
static void case_full(int op)
{
    (void)op;
    static const struct { ctpu_dtype dt; double v; float want; } cs[] = {
        { CTPU_F32, 0.1, 0.1f }, { CTPU_F32, -0.0, -0.0f }, { CTPU_F32, 1e300, INFINITY }, { CTPU_F32, NAN, NAN },
        { CTPU_BF16, 1.00390625, 1.0f }, { CTPU_BF16, 3.4e38, INFINITY }, { CTPU_BF16, 3.3e38, 0x1.fp+127f }, { CTPU_BF16, -2.5, -2.5f },
        { CTPU_I32, 2.7, 2 }, { CTPU_I32, -2.7, -2 }, { CTPU_I32, -2147483648.0, -2147483648.0f },
        { CTPU_I32, 2147483647.9, 2147483647.0f },
    };
    /* i32 from a value that does not fit: an error, as torch's "value cannot be converted to type int without
     * overflow" (NaN, +-Inf, |trunc(v)| past the range) */
    static const double bad[] = { NAN, INFINITY, -INFINITY, -1e10, 1e10, 2147483648.0, -2147483649.0 };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        int64_t one = 1;
        ck_assert(ctpu_is_null(ctpu_full(CTPU_I32, 1, &one, bad[c])));
        ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
        ck_assert(t_contains(ctpu_last_error(), "full: value=") && t_contains(ctpu_last_error(), "cannot be converted"));
        ctpu_clear_error();
    }
    static const shp shapes[] = { { 1, { 0 } }, { 0, { 0 } }, { 2, { 3, 7 } }, { 3, { 2, 0, 4 } } };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        for (int s = 0; s < 4; s++) {
            ctpu_tensor y = ctpu_full(cs[c].dt, shapes[s].nd, shapes[s].s, cs[c].v);
            ck_assert_msg(!ctpu_is_null(y), "full: %s", ctpu_last_error());
            ck_assert_int_eq(ctpu_dtype_of(y), cs[c].dt);
            t_expect_shape(y, shapes[s].nd, shapes[s].s);
            int64_t n;
            void *raw = t_read_raw(y, &n);
            for (int64_t i = 0; i < n; i++) {
                if (cs[c].dt == CTPU_I32)
                    ck_assert_int_eq(((int32_t *)raw)[i], cs[c].want >= 2147483648.0f ? INT32_MAX : (int32_t)cs[c].want);
                else {
                    float g = cs[c].dt == CTPU_F32 ? ((float *)raw)[i] : ctpu_bf16_to_f32(((uint16_t *)raw)[i]);
                    ck_assert_msg(t_same(g, cs[c].want), "full case %zu: %a want %a", c, g, cs[c].want);
                }
            }
            free(raw);
        }
    }
    int64_t s[2] = { 2, 2 };
    expect_f32_vals(ctpu_zeros(CTPU_BF16, 2, s), (float[]){ 0, 0, 0, 0 }, 4, "zeros");
    expect_f32_vals(ctpu_ones(CTPU_I32, 2, s), (float[]){ 1, 1, 1, 1 }, 4, "ones");
}

static void case_arange(int op)
{
    (void)op;
    expect_f32_vals(ctpu_arange(0, 5, 1, CTPU_F32), (float[]){ 0, 1, 2, 3, 4 }, 5, "arange");
    expect_f32_vals(ctpu_arange(5, 0, -1.5, CTPU_F32), (float[]){ 5, 3.5f, 2, 0.5f }, 4, "arange down");
    expect_f32_vals(ctpu_arange(0.5, 3, 1, CTPU_I32), (float[]){ 0, 1, 2 }, 3, "arange i32");
    expect_f32_vals(ctpu_arange(-3, -1, 0.5, CTPU_BF16), (float[]){ -3, -2.5f, -2, -1.5f }, 4, "arange bf16");
    ctpu_tensor e = ctpu_arange(0, 0, 1, CTPU_F32);
    ck_assert(!ctpu_is_null(e));
    ck_assert_int_eq(ctpu_numel(e), 0);
    e = ctpu_arange(3, 0, 1, CTPU_F32);   /* torch: "inconsistent with step sign" */
    ck_assert(ctpu_is_null(e));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    ctpu_clear_error();
    ctpu_tensor t = ctpu_arange(0, 1, 0.1, CTPU_F32);
    ck_assert_int_eq(ctpu_numel(t), 10);
    float *g = t_read(t, NULL);
    for (int i = 0; i < 10; i++) ck_assert(g[i] == (float)(0 + i * 0.1));
    free(g);
    /* an i32 arange past the i32 range is an error (torch wraps; ctpu used to saturate) */
    ck_assert(ctpu_is_null(ctpu_arange(0, 1e10, 4e9, CTPU_I32)));
    ck_assert(t_contains(ctpu_last_error(), "arange: last value=8e+09 cannot be converted to i32"));
    ctpu_clear_error();
    int32_t *gi = t_read_raw(ctpu_arange(2147483646.0, 2147483648.0, 1, CTPU_I32), NULL);
    ck_assert_int_eq(gi[0], INT32_MAX - 1);
    ck_assert_int_eq(gi[1], INT32_MAX);
    free(gi);
}

static void case_random(int op)
{
    bool normal = op == CTPU_OP_RAND_NORMAL;
    int64_t n = 100000;
    for (int dt = 0; dt < 2; dt++) {
        ck_assert_int_eq(ctpu_rng_set_state(2024, 17), CTPU_OK);
        ctpu_tensor y = normal ? ctpu_rand_normal((ctpu_dtype)dt, 1, &n, 1.5, 0.5)
                               : ctpu_rand_uniform((ctpu_dtype)dt, 1, &n, -2, 6);
        ck_assert_msg(!ctpu_is_null(y), "%s: %s", ctpu_op_name(op), ctpu_last_error());
        ck_assert_int_eq(ctpu_dtype_of(y), dt);
        float *g = t_read(y, NULL);
        float *k = malloc((size_t)n * 4);
        if (normal) ctpu_k_rand_normal(2024, 17, 0, n, 1.5f, 0.5f, k);
        else ctpu_k_rand_uniform(2024, 17, 0, n, -2.0f, 6.0f, k);
        double s = 0, s2 = 0;
        for (int64_t i = 0; i < n; i++) {
            float want = dt ? ctpu_bf16_to_f32(ctpu_f32_to_bf16(k[i])) : k[i];
            T_CHECK(t_same(g[i], want), "%s element %lld", ctpu_op_name(op), (long long)i);
            T_CHECK(isfinite(g[i]), "isfinite(g[i])");
            if (!normal) T_CHECK(g[i] >= -2 && g[i] <= 6, "g[i] >= -2 && g[i] <= 6");
            s += g[i];
            s2 += (double)g[i] * g[i];
        }
        double mean = s / (double)n, var = s2 / (double)n - mean * mean;
        double want_mean = normal ? 1.5 : 2, want_var = normal ? 0.25 : 64.0 / 12;
        ck_assert_msg(fabs(mean - want_mean) < 6 * sqrt(want_var / (double)n), "mean %g", mean);
        ck_assert_msg(fabs(var / want_var - 1) < 0.03, "var %g", var);
        free(g);
        free(k);
    }
    int64_t z[2] = { 3, 0 };
    ctpu_tensor e = normal ? ctpu_rand_normal(CTPU_F32, 2, z, 0, 1) : ctpu_rand_uniform(CTPU_F32, 2, z, 0, 1);
    ck_assert(!ctpu_is_null(e));
    ck_assert_int_eq(ctpu_numel(e), 0);
}

/* ------------------------------------------------------------ backward helpers */
static ctpu_tensor dispatch2(ctpu_node *nd, int n, const ctpu_tensor *ts)
{
    ctpu_trec *in[2];
    for (int i = 0; i < n; i++) {
        in[i] = ctpu_rec_get(ts[i], "test", "in", false);
        ck_assert_ptr_nonnull(in[i]);
    }
    nd->n_in = (uint8_t)n;
    return ctpu_dispatch(nd, in, ts, NULL);
}

static void case_slice_backward(int op)
{
    /* g [2, 2] placed at rows 1, 3 (start 1, step 2) of zeros [5, 2] */
    int64_t gs[2] = { 2, 2 };
    float g[4] = { 1, 2, 3, 4 };
    ctpu_node nd = { .op = (uint16_t)op, .out = { .dtype = CTPU_F32, .ndim = 2, .shape = { 5, 2 } } };
    nd.attr.dims[0] = 0;
    nd.attr.n_dims = 1;
    nd.attr.i64[0] = 1;
    nd.attr.i64[1] = 4;
    nd.attr.i64[2] = 2;
    ctpu_tensor gt = t_f32(g, 2, gs);
    ctpu_tensor y = dispatch2(&nd, 1, &gt);
    ck_assert_msg(!ctpu_is_null(y), "slice_backward: %s", ctpu_last_error());
    expect_f32_vals(y, (float[]){ 0, 0, 1, 2, 0, 0, 3, 4, 0, 0 }, 10, "slice_backward");
    /* along dim 1, bf16 */
    ctpu_node n2 = { .op = (uint16_t)op, .out = { .dtype = CTPU_BF16, .ndim = 2, .shape = { 2, 3 } } };
    n2.attr.dims[0] = 1;
    n2.attr.n_dims = 1;
    n2.attr.i64[0] = 2;
    n2.attr.i64[1] = 3;
    n2.attr.i64[2] = 1;
    ctpu_tensor g2 = ctpu_cast(t_f32(g, 2, (int64_t[]){ 2, 1 }), CTPU_BF16);
    y = dispatch2(&n2, 1, &g2);
    ck_assert_msg(!ctpu_is_null(y), "slice_backward: %s", ctpu_last_error());
    expect_f32_vals(y, (float[]){ 0, 0, 1, 0, 0, 2 }, 6, "slice_backward dim 1");
}

static void case_embedding_backward(int op)
{
    /* out[idx[i], :] += g[i, :] in input order */
    int64_t gs[2] = { 4, 2 }, is = 4;
    float g[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    int32_t idx[4] = { 2, 0, 2, 9 };   /* 9 out of range: skipped */
    ctpu_node nd = { .op = (uint16_t)op, .out = { .dtype = CTPU_F32, .ndim = 2, .shape = { 3, 2 } } };
    ctpu_tensor ts[2] = { t_f32(g, 2, gs), t_i32(idx, 1, &is) };
    ctpu_tensor y = dispatch2(&nd, 2, ts);
    ck_assert_msg(!ctpu_is_null(y), "embedding_backward: %s", ctpu_last_error());
    expect_f32_vals(y, (float[]){ 3, 4, 0, 0, 6, 8 }, 6, "embedding_backward");
    /* addition in input order in f32: 1e8 + 1 - 1e8 */
    float h[3] = { 1e8f, 1, -1e8f };
    int32_t z[3] = { 0, 0, 0 };
    int64_t hs[2] = { 3, 1 }, zs = 3;
    ctpu_node n2 = { .op = (uint16_t)op, .out = { .dtype = CTPU_F32, .ndim = 2, .shape = { 1, 1 } } };
    ctpu_tensor t2[2] = { t_f32(h, 2, hs), t_i32(z, 1, &zs) };
    double r;
    ck_assert_int_eq(ctpu_item(dispatch2(&n2, 2, t2), &r), CTPU_OK);
    ck_assert(r == (double)((1e8f + 1.0f) - 1e8f));
}

static void case_gather_backward(int op)
{
    int64_t gs[2] = { 2, 2 };
    float g[4] = { 1, 2, 3, 4 };
    int32_t idx[4] = { 2, 2, 0, 1 };
    ctpu_node nd = { .op = (uint16_t)op, .out = { .dtype = CTPU_F32, .ndim = 2, .shape = { 2, 3 } } };
    nd.attr.extra = 1;
    ctpu_tensor ts[2] = { t_f32(g, 2, gs), t_i32(idx, 2, gs) };
    ctpu_tensor y = dispatch2(&nd, 2, ts);
    ck_assert_msg(!ctpu_is_null(y), "gather_backward: %s", ctpu_last_error());
    expect_f32_vals(y, (float[]){ 0, 0, 3, 3, 4, 0 }, 6, "gather_backward");
}

/* Collectives in a world of one rank (no ctpu_dist_init): each is the
 * identity of its meaning for N = 1, in every dtype it takes; the argument
 * checks; and the multi-rank semantics are the dist suite's (tests/dist/). */
static void case_collective(int op)
{
    float x[6] = { 1.5f, -2, 3.25f, NAN, -0.0f, 1e30f };
    int64_t s23[2] = { 2, 3 };
    ctpu_tensor a = t_f32(x, 2, s23), b = ctpu_cast(a, CTPU_BF16);
    int32_t iv[6] = { 1, -2, INT32_MAX, 4, 5, INT32_MIN };
    ctpu_tensor i = t_i32(iv, 2, s23);
    ctpu_tensor y[3];
    const char *nm = ctpu_op_name(op);
    switch (op) {
    case CTPU_OP_ALL_REDUCE:
        y[0] = ctpu_all_reduce(a, CTPU_DIST_SUM);
        y[1] = ctpu_all_reduce(b, CTPU_DIST_MEAN);
        y[2] = ctpu_all_reduce(i, CTPU_DIST_SUM);
        ck_assert(ctpu_is_null(ctpu_all_reduce(i, CTPU_DIST_MEAN)) && ctpu_last_status() == CTPU_ERR_DTYPE);
        ck_assert(ctpu_is_null(ctpu_all_reduce(a, (ctpu_dist_op)7)) && ctpu_last_status() == CTPU_ERR_INVALID_ARG);
        break;
    case CTPU_OP_BROADCAST:
        y[0] = ctpu_broadcast(a, 0);
        y[1] = ctpu_broadcast(b, 0);
        y[2] = ctpu_broadcast(i, 0);
        ck_assert(ctpu_is_null(ctpu_broadcast(a, 1)) && ctpu_last_status() == CTPU_ERR_INVALID_ARG);
        ck_assert(t_contains(ctpu_last_error(), "broadcast: root=1"));
        break;
    case CTPU_OP_ALL_GATHER:
        y[0] = ctpu_all_gather(a, 1);
        y[1] = ctpu_all_gather(b, -2);
        y[2] = ctpu_all_gather(i, 0);
        ck_assert(ctpu_is_null(ctpu_all_gather(a, 2)) && ctpu_last_status() == CTPU_ERR_SHAPE);
        ck_assert(ctpu_is_null(ctpu_all_gather(ctpu_sum(a, 0, NULL, false), 0)) && ctpu_last_status() == CTPU_ERR_SHAPE);
        break;
    default:
        y[0] = ctpu_reduce_scatter(a, 1, CTPU_DIST_SUM);
        y[1] = ctpu_reduce_scatter(b, 0, CTPU_DIST_MEAN);
        y[2] = ctpu_reduce_scatter(i, -1, CTPU_DIST_SUM);
        ck_assert(ctpu_is_null(ctpu_reduce_scatter(a, -3, CTPU_DIST_SUM)) && ctpu_last_status() == CTPU_ERR_SHAPE);
        break;
    }
    ctpu_tensor src[3] = { a, b, i };
    for (int k = 0; k < 3; k++) {
        ck_assert_msg(!ctpu_is_null(y[k]), "%s: %s", nm, ctpu_last_error());
        ck_assert_int_eq(ctpu_dtype_of(y[k]), ctpu_dtype_of(src[k]));
        int64_t sh[8];
        int nd;
        ck_assert_int_eq(ctpu_shape(y[k], sh, &nd), CTPU_OK);
        ck_assert(nd == 2 && sh[0] == 2 && sh[1] == 3);
        char gb[24], wb[24];
        size_t bytes = k == 1 ? 12 : 24;
        ck_assert_int_eq(ctpu_to_host(y[k], gb, sizeof gb), CTPU_OK);
        ck_assert_int_eq(ctpu_to_host(src[k], wb, sizeof wb), CTPU_OK);
        ck_assert_msg(memcmp(gb, wb, bytes) == 0, "%s: a world of one rank changed the %s values", nm,
                      ctpu_dtype_name(ctpu_dtype_of(src[k])));
    }
    ck_assert(ctpu_is_null(ctpu_all_reduce(CTPU_NULL, CTPU_DIST_SUM)));
}

/* ------------------------------------------------------------ the table */
typedef void (*op_case)(int op);
/* ------------------------------------------------------------ scans, scatter, randint */
/* cumsum: the bits of a left-to-right f32 accumulation from +0 (exact), and
 * within (j + 1) eps sum|x| of float64; bf16 in, bf16 out; i32 gives f32. */
static void case_cumsum(int op)
{
    (void)op;
    static const struct { shp s; int dim; } cs[] = {
        { { 1, { 7 } }, 0 },  { { 2, { 3, 5 } }, 0 },  { { 2, { 3, 5 } }, -1 }, { { 3, { 2, 3, 9 } }, 1 },
        { { 1, { 5000 } }, 0 }, { { 2, { 2, 0 } }, 1 }, { { 0, { 0 } }, 0 },  { { 1, { 1 } }, -1 },
    };
    for (int ci = 0; ci < 8; ci++) {
        int nd = cs[ci].s.nd, d = nd ? (cs[ci].dim < 0 ? cs[ci].dim + nd : cs[ci].dim) : 0;
        int64_t n = t_numel(nd, cs[ci].s.s);
        float *x = malloc((size_t)(n + 1) * 4);
        fill(x, n, (uint64_t)ci + 40, -3, 5, false);
        if (n > 2) x[1] = -0.0f;
        for (int dt = 0; dt < 2; dt++) {
            ctpu_tensor a = t_f32(x, nd, cs[ci].s.s);
            if (dt) a = ctpu_cast(a, CTPU_BF16);
            ctpu_tensor y = ctpu_cumsum(a, cs[ci].dim);
            ck_assert_msg(!ctpu_is_null(y), "cumsum: %s", ctpu_last_error());
            ck_assert_int_eq(ctpu_dtype_of(y), dt ? CTPU_BF16 : CTPU_F32);
            t_expect_shape(y, nd, cs[ci].s.s);
            float *g = t_read(y, NULL);
            int64_t len = nd ? cs[ci].s.s[d] : 1, inner = 1;
            for (int k = d + 1; k < nd; k++) inner *= cs[ci].s.s[k];
            int64_t outer = len && inner ? n / (len * inner) : 0;
            for (int64_t o = 0; o < outer; o++)
                for (int64_t in = 0; in < inner; in++) {
                    float acc = 0.0f;
                    double ref = 0, sabs = 0;
                    for (int64_t j = 0; j < len; j++) {
                        int64_t i = (o * len + j) * inner + in;
                        float v = dt ? (float)bf16_round(x[i]) : x[i];
                        acc += v;
                        ref += v;
                        sabs += fabs(v);
                        float want = dt ? (float)bf16_round(acc) : acc;
                        ck_assert_msg(t_same(g[i], want), "cumsum case %d dt %d [%lld]: %a, want %a", ci, dt,
                                      (long long)i, g[i], want);
                        double tol = (double)(j + 1) * EPS * sabs + t_ulp_of(ref) + (dt ? bf16_ulp(ref) : 0);
                        expect_close("cumsum", i, g[i], ref, tol, v, 0);
                    }
                }
            free(g);
        }
        free(x);
    }
    int32_t iv[3] = { 16777216, 1, 2 };
    int64_t s3 = 3;
    ctpu_tensor y = ctpu_cumsum(t_i32(iv, 1, &s3), 0);
    ck_assert_int_eq(ctpu_dtype_of(y), CTPU_F32);
    float *g = t_read(y, NULL);
    ck_assert(g[0] == 16777216.0f && g[2] == 16777218.0f);
    free(g);
    float nv[4] = { 1, NAN, 2, INFINITY };
    int64_t s4 = 4;
    g = t_read(ctpu_cumsum(t_f32(nv, 1, &s4), 0), NULL);
    ck_assert(g[0] == 1 && g[1] != g[1] && g[3] != g[3]);
    free(g);
    ck_assert(ctpu_is_null(ctpu_cumsum(t_f32(nv, 1, &s4), 1)));
    ck_assert(t_contains(ctpu_last_error(), "cumsum"));
}

/* scatter_add against a host loop in the documented order (f32 adds in index
 * order into a copy of self, one rounding at the end for bf16), along each
 * dim, src larger than index; i32 wraps; a bad index faults. */
static void case_scatter_add(int op)
{
    (void)op;
    int64_t ss[2] = { 3, 4 }, is[2] = { 2, 4 }, rs[2] = { 3, 5 };
    float self[12], src[15];
    fill(self, 12, 71, -2, 2, false);
    fill(src, 15, 72, -2, 2, false);
    int32_t idx[8] = { 0, 2, 1, 3, 2, 2, 0, 1 };
    for (int dim = 0; dim < 2; dim++) {
        for (int dt = 0; dt < 2; dt++) {
            int32_t ix[8];
            for (int i = 0; i < 8; i++) ix[i] = dim == 0 ? idx[i] % 3 : idx[i];
            ctpu_tensor a = t_f32(self, 2, ss), b = t_f32(src, 2, rs);
            if (dt) { a = ctpu_cast(a, CTPU_BF16); b = ctpu_cast(b, CTPU_BF16); }
            ctpu_tensor y = ctpu_scatter_add(a, dim - 2, t_i32(ix, 2, is), b);
            ck_assert_msg(!ctpu_is_null(y), "scatter_add: %s", ctpu_last_error());
            ck_assert_int_eq(ctpu_dtype_of(y), dt ? CTPU_BF16 : CTPU_F32);
            t_expect_shape(y, 2, ss);
            float want[12];
            for (int i = 0; i < 12; i++) want[i] = dt ? (float)bf16_round(self[i]) : self[i];
            for (int r = 0; r < 2; r++)
                for (int c = 0; c < 4; c++) {
                    int v = ix[r * 4 + c];
                    int o = dim == 0 ? v * 4 + c : r * 4 + v;
                    want[o] += dt ? (float)bf16_round(src[r * 5 + c]) : src[r * 5 + c];
                }
            float *g = t_read(y, NULL);
            for (int i = 0; i < 12; i++) {
                float w = dt ? (float)bf16_round(want[i]) : want[i];
                ck_assert_msg(t_same(g[i], w), "scatter_add dim %d dt %d [%d]: %a want %a", dim, dt, i, g[i], w);
            }
            free(g);
        }
    }
    /* i32: integer adds that wrap */
    int32_t si[2] = { INT32_MAX, 5 }, sv[3] = { 1, 2, 3 }, sx[3] = { 0, 1, 1 };
    int64_t s2 = 2, s3 = 3;
    int32_t *gi = t_read_raw(ctpu_scatter_add(t_i32(si, 1, &s2), 0, t_i32(sx, 1, &s3), t_i32(sv, 1, &s3)), NULL);
    ck_assert(gi[0] == INT32_MIN && gi[1] == 10);
    free(gi);
    /* a bad index: a device fault naming scatter_add, at the next sync */
    int32_t bad[3] = { 0, 9, 1 };
    ctpu_tensor f = ctpu_scatter_add(T_VEC(1, 2), 0, t_i32(bad, 1, &s3), T_VEC(1, 1, 1));
    ck_assert(!ctpu_is_null(f));
    ck_assert_int_eq(ctpu_sync(), CTPU_ERR_DEVICE_FAULT);
    ck_assert_msg(t_contains(ctpu_last_error(), "scatter_add") && t_contains(ctpu_last_error(), "9"), "%s",
                  ctpu_last_error());
    ctpu_clear_error();
    /* errors */
    ck_assert(ctpu_is_null(ctpu_scatter_add(T_VEC(1, 2), 0, T_VEC(0, 1), T_VEC(1, 1))));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_DTYPE);
    ck_assert(t_contains(ctpu_last_error(), "scatter_add"));
    ck_assert(ctpu_is_null(ctpu_scatter_add(T_VEC(1, 2), 0, t_i32(sx, 1, &s3), T_VEC(1, 1))));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
    ck_assert(ctpu_is_null(ctpu_scatter_add(T_VEC(1, 2), 3, t_i32(sx, 1, &s3), T_VEC(1, 1, 1))));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
}

/* randint: element i is low + (w0 | w1 << 32) mod range of Philox (seed,
 * offset + i), in every dtype; about uniform. */
static void case_randint(int op)
{
    (void)op;
    ctpu_manual_seed(1234);
    uint64_t seed, off;
    ck_assert_int_eq(ctpu_rng_get_state(&seed, &off), CTPU_OK);
    int64_t n = 7000;
    ctpu_tensor y = ctpu_randint(CTPU_I32, 1, &n, -3, 4);
    ck_assert_msg(!ctpu_is_null(y), "randint: %s", ctpu_last_error());
    ck_assert_int_eq(ctpu_dtype_of(y), CTPU_I32);
    int32_t *g = t_read_raw(y, NULL);
    int cnt[7] = { 0 };
    for (int64_t i = 0; i < n; i++) {
        uint32_t w[4];
        ctpu_k_philox4x32(seed, off + (uint64_t)i, w);
        int64_t want = -3 + (int64_t)(((uint64_t)w[0] | (uint64_t)w[1] << 32) % 7);
        ck_assert_msg(g[i] == want, "randint [%lld] = %d, want %lld", (long long)i, g[i], (long long)want);
        cnt[g[i] + 3]++;
    }
    for (int k = 0; k < 7; k++) ck_assert_msg(cnt[k] > 850 && cnt[k] < 1150, "randint: value %d drawn %d times", k - 3, cnt[k]);
    free(g);
    /* the full i32 range; f32 and bf16 outputs */
    ctpu_tensor wide = ctpu_randint(CTPU_I32, 1, &n, INT32_MIN, (int64_t)INT32_MAX + 1);
    ck_assert(!ctpu_is_null(wide));
    float *f = t_read(ctpu_randint(CTPU_F32, 1, &n, 0, 3), NULL);
    for (int64_t i = 0; i < n; i++) ck_assert(f[i] == 0 || f[i] == 1 || f[i] == 2);
    free(f);
    f = t_read(ctpu_randint(CTPU_BF16, 1, &n, 100, 102), NULL);
    for (int64_t i = 0; i < n; i++) ck_assert(f[i] == 100 || f[i] == 101);
    free(f);
    /* the generator advanced by the draws */
    uint64_t s2, o2;
    ck_assert_int_eq(ctpu_rng_get_state(&s2, &o2), CTPU_OK);
    ck_assert(s2 == seed && o2 == off + 4 * (uint64_t)n);
    ck_assert(ctpu_is_null(ctpu_randint(CTPU_I32, 1, &n, 5, 5)));
    ck_assert(t_contains(ctpu_last_error(), "randint"));
    ck_assert(ctpu_is_null(ctpu_randint(CTPU_I32, 1, &n, 0, (int64_t)INT32_MAX + 2)));
    ck_assert(ctpu_is_null(ctpu_randint((ctpu_dtype)9, 1, &n, 0, 2)));
}

static const op_case CASES[CTPU_OP_COUNT] = {
    [CTPU_OP_NEG] = case_unary, [CTPU_OP_ABS] = case_unary, [CTPU_OP_EXP] = case_unary,
    [CTPU_OP_LOG] = case_unary, [CTPU_OP_SQRT] = case_unary, [CTPU_OP_RSQRT] = case_unary,
    [CTPU_OP_TANH] = case_unary, [CTPU_OP_SIGMOID] = case_unary, [CTPU_OP_RELU] = case_unary,
    [CTPU_OP_GELU_TANH] = case_unary, [CTPU_OP_GELU_ERF] = case_unary, [CTPU_OP_SOFTPLUS] = case_unary,
    [CTPU_OP_ERF] = case_unary, [CTPU_OP_SIN] = case_unary, [CTPU_OP_COS] = case_unary, [CTPU_OP_LOG1P] = case_unary, [CTPU_OP_EXPM1] = case_unary,
    [CTPU_OP_ADD] = case_binary, [CTPU_OP_SUB] = case_binary, [CTPU_OP_MUL] = case_binary,
    [CTPU_OP_DIV] = case_binary, [CTPU_OP_POW] = case_binary, [CTPU_OP_MAXIMUM] = case_binary,
    [CTPU_OP_MINIMUM] = case_binary, [CTPU_OP_EQ] = case_binary, [CTPU_OP_NE] = case_binary,
    [CTPU_OP_LT] = case_binary, [CTPU_OP_LE] = case_binary, [CTPU_OP_GT] = case_binary,
    [CTPU_OP_GE] = case_binary,
    [CTPU_OP_ADD_SCALAR] = case_scalar, [CTPU_OP_SUB_SCALAR] = case_scalar, [CTPU_OP_MUL_SCALAR] = case_scalar,
    [CTPU_OP_DIV_SCALAR] = case_scalar, [CTPU_OP_POW_SCALAR] = case_scalar,
    [CTPU_OP_MAXIMUM_SCALAR] = case_scalar, [CTPU_OP_MINIMUM_SCALAR] = case_scalar,
    [CTPU_OP_EQ_SCALAR] = case_scalar, [CTPU_OP_NE_SCALAR] = case_scalar, [CTPU_OP_LT_SCALAR] = case_scalar,
    [CTPU_OP_LE_SCALAR] = case_scalar, [CTPU_OP_GT_SCALAR] = case_scalar, [CTPU_OP_GE_SCALAR] = case_scalar,
    [CTPU_OP_WHERE] = case_where, [CTPU_OP_CLAMP] = case_clamp, [CTPU_OP_CAST] = case_cast,
    [CTPU_OP_SUM] = case_reduction, [CTPU_OP_MEAN] = case_reduction, [CTPU_OP_MAX] = case_reduction,
    [CTPU_OP_MIN] = case_reduction, [CTPU_OP_VAR] = case_reduction, [CTPU_OP_ARGMAX] = case_argmax,
    [CTPU_OP_ARGMIN] = case_argmax, [CTPU_OP_PROD] = case_reduction, [CTPU_OP_CUMSUM] = case_cumsum,
    [CTPU_OP_SCATTER_ADD] = case_scatter_add, [CTPU_OP_RAND_INT] = case_randint,
    [CTPU_OP_SOFTMAX] = case_softmax, [CTPU_OP_LOG_SOFTMAX] = case_softmax,
    [CTPU_OP_RESHAPE] = case_reshape, [CTPU_OP_PERMUTE] = case_permute, [CTPU_OP_SLICE] = case_slice,
    [CTPU_OP_CONCAT] = case_concat, [CTPU_OP_EXPAND] = case_expand, [CTPU_OP_EMBEDDING] = case_embedding,
    [CTPU_OP_GATHER] = case_gather, [CTPU_OP_MATMUL] = case_matmul,
    [CTPU_OP_SDPA] = case_sdpa, [CTPU_OP_SDPA_BACKWARD] = case_sdpa, [CTPU_OP_COPY] = case_copy,
    [CTPU_OP_FULL] = case_full, [CTPU_OP_ARANGE] = case_arange, [CTPU_OP_RAND_UNIFORM] = case_random,
    [CTPU_OP_RAND_NORMAL] = case_random,
    [CTPU_OP_SLICE_BACKWARD] = case_slice_backward, [CTPU_OP_EMBEDDING_BACKWARD] = case_embedding_backward,
    [CTPU_OP_GATHER_BACKWARD] = case_gather_backward,
    [CTPU_OP_ALL_REDUCE] = case_collective, [CTPU_OP_BROADCAST] = case_collective,
    [CTPU_OP_ALL_GATHER] = case_collective, [CTPU_OP_REDUCE_SCATTER] = case_collective,
};

START_TEST(every_op_has_a_case)
{
    for (int op = 0; op < CTPU_OP_COUNT; op++)
        ck_assert_msg(CASES[op] != NULL, "op %s (row %d of CTPU_OP_TABLE) has no conformance case in test_ops.c",
                      ctpu_op_name(op), op);
}
END_TEST

START_TEST(op_conformance)
{
    ck_assert_msg(CASES[_i] != NULL, "op %s has no conformance case", ctpu_op_name(_i));
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    CASES[_i](_i);
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    ck_assert_msg(ctpu_sync() == CTPU_OK, "%s: %s", ctpu_op_name(_i), ctpu_last_error());
}
END_TEST

/* ------------------------------------------------------------ promotion */
/* torch's 0-d rule: a 0-d f32 tensor does not raise a dimensioned bf16
 * operand (bf16[N] * f32[] is bf16, the 0-d value rounded to bf16 first:
 * torch.tensor([1.0], dtype=torch.bfloat16) < torch.tensor(1.001) is
 * False); a dimensioned f32 still wins, two 0-d tensors promote as usual;
 * the 0-d operand's gradient stays f32. */
START_TEST(zero_dim_tensor_promotion)
{
    ctpu_tensor b = ctpu_cast(T_VEC(1, 3), CTPU_BF16);
    ctpu_tensor z = ctpu_full(CTPU_F32, 0, NULL, 1.001);   /* bf16(1.001) = 1 */
    ctpu_tensor zb = ctpu_cast(ctpu_full(CTPU_F32, 0, NULL, 2), CTPU_BF16);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_mul(b, z)), CTPU_BF16);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_add(z, b)), CTPU_BF16);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_div(b, z)), CTPU_BF16);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_where(ctpu_gt_scalar(b, 2), b, z)), CTPU_BF16);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_mul(zb, z)), CTPU_F32);                 /* both 0-d */
    ck_assert_int_eq(ctpu_dtype_of(ctpu_mul(T_VEC(1, 2), zb)), CTPU_F32);       /* f32[N] wins */
    ck_assert_int_eq(ctpu_dtype_of(ctpu_mul(ctpu_cast(z, CTPU_BF16), T_VEC(1, 2))), CTPU_F32);
    float *g = t_read(ctpu_lt(b, z), NULL);   /* compared in bf16: 1 < 1 is false (in f32, true) */
    ck_assert(g[0] == 0 && g[1] == 0);
    free(g);
    g = t_read(ctpu_sub(b, z), NULL);
    ck_assert(g[0] == 0 && g[1] == 2);
    free(g);
    /* a bf16 tensor compared with a host number: in bf16 too (torch) */
    g = t_read(ctpu_eq_scalar(b, 1.001), NULL);
    ck_assert(g[0] == 1 && g[1] == 0);
    free(g);
    g = t_read(ctpu_lt_scalar(b, 1.001), NULL);
    ck_assert(g[0] == 0 && g[1] == 0);
    free(g);
    g = t_read(ctpu_lt_scalar(T_VEC(1, 3), 1.001), NULL);   /* f32: unchanged */
    ck_assert(g[0] == 1 && g[1] == 0);
    free(g);
    ctpu_tensor w = ctpu_full(CTPU_F32, 0, NULL, 0.5);
    ck_assert_int_eq(ctpu_set_requires_grad(w, true), CTPU_OK);
    ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(b, w), 0, NULL, false)), CTPU_OK);
    ctpu_tensor gw = ctpu_grad(w);
    ck_assert_int_eq(ctpu_dtype_of(gw), CTPU_F32);
    double v;
    ck_assert_int_eq(ctpu_item(gw, &v), CTPU_OK);
    ck_assert(v == 4);
}
END_TEST

START_TEST(dtype_promotion)
{
    ctpu_tensor f = T_VEC(1.5f, -2), b = ctpu_cast(T_VEC(0.5f, 4), CTPU_BF16);
    int32_t iv[2] = { 7, -3 }, jv[2] = { 2, 2 };
    int64_t s2 = 2;
    ctpu_tensor i = t_i32(iv, 1, &s2), j = t_i32(jv, 1, &s2);
    /* f32 (+) bf16 -> f32, either order */
    ck_assert_int_eq(ctpu_dtype_of(ctpu_add(f, b)), CTPU_F32);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_mul(b, f)), CTPU_F32);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_add(b, b)), CTPU_BF16);
    /* host scalar keeps the dtype */
    ck_assert_int_eq(ctpu_dtype_of(ctpu_mul_scalar(b, 1e10)), CTPU_BF16);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_add_scalar_int(i, 2)), CTPU_I32);
    /* except a float scalar with an i32 tensor: f32, as torch (a double is a Python float) */
    ck_assert_int_eq(ctpu_dtype_of(ctpu_add_scalar(i, 2.5)), CTPU_F32);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_add_scalar(i, 2)), CTPU_F32);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_add_scalar(f, 2)), CTPU_F32);
    /* i32 (+) f32 -> f32, i32 (+) bf16 -> bf16 */
    ck_assert_int_eq(ctpu_dtype_of(ctpu_add(i, f)), CTPU_F32);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_sub(f, i)), CTPU_F32);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_add(i, b)), CTPU_BF16);
    float *g = t_read(ctpu_add(i, f), NULL);
    ck_assert(g[0] == 8.5f && g[1] == -5);
    free(g);
    /* i32 / i32 -> f32 true division */
    ctpu_tensor q = ctpu_div(i, j);
    ck_assert_int_eq(ctpu_dtype_of(q), CTPU_F32);
    g = t_read(q, NULL);
    ck_assert(g[0] == 3.5f && g[1] == -1.5f);
    free(g);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_div_scalar(i, 2)), CTPU_F32);
    /* comparisons -> f32 masks for every dtype */
    ck_assert_int_eq(ctpu_dtype_of(ctpu_eq(i, j)), CTPU_F32);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_lt(b, b)), CTPU_F32);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_ge_scalar(b, 0)), CTPU_F32);
    g = t_read(ctpu_gt(i, f), NULL);
    ck_assert(g[0] == 1 && g[1] == 0);
    free(g);
    /* argmax -> i32; exp(i32) -> f32; reductions of bf16 -> bf16 */
    ck_assert_int_eq(ctpu_dtype_of(ctpu_argmax(f, 0, false)), CTPU_I32);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_exp(i)), CTPU_F32);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_sum(b, 0, NULL, false)), CTPU_BF16);
    /* result rounded to its dtype: bf16 + bf16 rounds once to bf16 */
    ctpu_tensor x = ctpu_cast(T_VEC(1), CTPU_BF16), e = ctpu_cast(T_VEC(0.00390625f), CTPU_BF16);
    double v;
    ck_assert_int_eq(ctpu_item(ctpu_add(x, e), &v), CTPU_OK);
    ck_assert(v == 1.0);                  /* 1 + 2^-8 ties to even -> 1 */
    ck_assert_int_eq(ctpu_item(ctpu_add(ctpu_cast(x, CTPU_F32), e), &v), CTPU_OK);
    ck_assert(v == 1.00390625);           /* in f32 it is exact */
    /* i32 arithmetic wraps, as torch */
    int32_t mx = INT32_MAX, one = 1;
    int64_t s1 = 1;
    int32_t w;
    ck_assert_int_eq(ctpu_to_host(ctpu_add(t_i32(&mx, 1, &s1), t_i32(&one, 1, &s1)), &w, 4), CTPU_OK);
    ck_assert_int_eq(w, INT32_MIN);
}
END_TEST

/* Dispatch has a shape rule and a dtype rule for every op, and each row's
 * kind flags agree with its dtype rule. */
START_TEST(every_op_has_its_rules)
{
    for (int op = 0; op < CTPU_OP_COUNT; op++) {
        const ctpu_op_info *o = &ctpu_op_infos[op];
        ck_assert_msg(ctpu__test_op_rules_defined(op),
                      "op %s: its shape rule %d or dtype rule %d has no function in dispatch.c's tables",
                      ctpu_op_name(op), o->shape_rule, o->dtype_rule);
        bool fl = o->dtype_rule == CTPU_DT_FLOAT || o->dtype_rule == CTPU_DT_PROMOTE_FLOAT;
        if (ctpu_op_is(op, CTPU_OPK_ELEMENTWISE))
            ck_assert_msg(fl == ctpu_op_is(op, CTPU_OPK_FLOAT_OUT), "op %s: FLOAT_OUT kind vs dtype rule %d",
                          ctpu_op_name(op), o->dtype_rule);
        ck_assert_msg((o->dtype_rule == CTPU_DT_MASK) == ctpu_op_is(op, CTPU_OPK_COMPARE),
                      "op %s: COMPARE kind vs dtype rule %d", ctpu_op_name(op), o->dtype_rule);
        ck_assert_msg((o->shape_rule == CTPU_SH_CREATE) == ctpu_op_is(op, CTPU_OPK_CREATION),
                      "op %s: CREATION kind vs shape rule %d", ctpu_op_name(op), o->shape_rule);
    }
}
END_TEST

/* silu (a composite) is x * sigmoid(x) bit for bit in every mode and dtype,
 * with that composition's gradient; its errors name silu. */
START_TEST(silu_is_its_composition)
{
    static const float xs[] = { -90.0f, -8.0f, -2.5f, -1.0f, -0.3f, -0.0f, 0.0f, 1e-8f, 0.5f, 1.0f, 3.25f, 20.0f, 88.5f };
    static const ctpu_mode modes[] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    int64_t n = (int64_t)(sizeof xs / sizeof xs[0]);
    for (int m = 0; m < 3; m++) {
        ck_assert_int_eq(ctpu_set_mode(modes[m]), CTPU_OK);
        for (int bf = 0; bf < 2; bf++) {
            ctpu_tensor x = t_f32(xs, 1, &n);
            if (bf) x = ctpu_cast(x, CTPU_BF16);
            ctpu_tensor y = ctpu_silu(x), want = ctpu_mul(x, ctpu_sigmoid(x));
            ck_assert_msg(!ctpu_is_null(y), "silu: %s", ctpu_last_error());
            ck_assert_int_eq(ctpu_dtype_of(y), bf ? CTPU_BF16 : CTPU_F32);
            float *got = t_read(y, NULL), *exp = t_read(want, NULL);
            for (int64_t i = 0; i < n; i++)
                ck_assert_msg(t_same(got[i], exp[i]), "silu(%g) mode %d bf16 %d: %a, x*sigmoid(x) %a", xs[i], m, bf,
                              got[i], exp[i]);
            free(got);
            free(exp);
        }
        /* the gradient: sigmoid(x) + x sigmoid(x) (1 - sigmoid(x)), through the composition */
        ctpu_tensor x1 = t_f32(xs, 1, &n), x2 = t_f32(xs, 1, &n);
        ck_assert_int_eq(ctpu_set_requires_grad(x1, true), CTPU_OK);
        ck_assert_int_eq(ctpu_set_requires_grad(x2, true), CTPU_OK);
        ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_silu(x1), 0, NULL, false)), CTPU_OK);
        ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(x2, ctpu_sigmoid(x2)), 0, NULL, false)), CTPU_OK);
        float *g1 = t_read(ctpu_grad(x1), NULL), *g2 = t_read(ctpu_grad(x2), NULL);
        for (int64_t i = 0; i < n; i++)
            ck_assert_msg(t_same(g1[i], g2[i]), "silu'(%g) mode %d: %a vs %a", xs[i], m, g1[i], g2[i]);
        free(g1);
        free(g2);
    }
    ctpu_tensor x = T_VEC(1, 2);
    ctpu_release(x);
    ck_assert(ctpu_is_null(ctpu_silu(x)));
    ck_assert_msg(t_contains(ctpu_last_error(), "silu"), "error: %s", ctpu_last_error());
}
END_TEST


/* layer_norm / rms_norm (composites) against float64: forward in f32 and
 * bf16 (the bound in ctpu.h), every mode bit for bit, the gradients of x,
 * weight and bias against the analytic float64 backward, and their errors. */
static void norm_ref(bool rms, const float *x, const float *w, const float *b, int64_t R, int64_t D, double eps,
                     const float *gy, double *y, double *gx, double *gw, double *gb)
{
    for (int64_t k = 0; k < D; k++) { gw[k] = 0; gb[k] = 0; }
    for (int64_t r = 0; r < R; r++) {
        const float *xr = x + r * D;
        double mean = 0, var = 0;
        for (int64_t k = 0; k < D; k++) mean += xr[k];
        mean = rms ? 0 : mean / (double)D;
        for (int64_t k = 0; k < D; k++) var += (xr[k] - mean) * (xr[k] - mean);
        var /= (double)D;
        double inv = 1 / sqrt(var + eps), s1 = 0, s2 = 0;
        for (int64_t k = 0; k < D; k++) {
            double xh = (xr[k] - mean) * inv, wk = w ? w[k] : 1;
            y[r * D + k] = xh * wk + (b ? b[k] : 0);
            double g = gy[r * D + k];
            gw[k] += g * xh;
            gb[k] += g;
            s1 += g * wk;
            s2 += g * wk * xh;
        }
        for (int64_t k = 0; k < D; k++) {
            double xh = (xr[k] - mean) * inv, gk = gy[r * D + k] * (w ? w[k] : 1);
            gx[r * D + k] = rms ? inv * (gk - xh * s2 / (double)D) : inv * (gk - s1 / (double)D - xh * s2 / (double)D);
        }
    }
}

START_TEST(norms_against_float64)
{
    enum { R = 6, D = 37 };
    static const ctpu_mode modes[] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    float x[R * D], w[D], b[D], gy[R * D];
    uint64_t seed = 12;
    for (int i = 0; i < R * D; i++) { x[i] = t_rand_f(&seed, -3, 5); gy[i] = t_rand_f(&seed, -1, 1); }
    for (int k = 0; k < D; k++) { w[k] = t_rand_f(&seed, 0.5f, 1.5f); b[k] = t_rand_f(&seed, -0.5f, 0.5f); }
    int64_t sx[2] = { R, D }, sd = D;
    double y[R * D], gx[R * D], gw[D], gb[D];
    double worst_f = 0, worst_b = 0, worst_g = 0;
    for (int rms = 0; rms < 2; rms++)
        for (int aff = 0; aff < 2; aff++) {
            norm_ref(rms, x, aff ? w : NULL, aff && !rms ? b : NULL, R, D, 1e-5, gy, y, gx, gw, gb);
            float *first = NULL, *firstg = NULL;
            for (int m = 0; m < 3; m++) {
                ck_assert_int_eq(ctpu_set_mode(modes[m]), CTPU_OK);
                for (int bf = 0; bf < 2; bf++) {
                    ctpu_tensor X = t_f32(x, 2, sx), W = aff ? t_f32(w, 1, &sd) : CTPU_NULL;
                    ctpu_tensor B = aff && !rms ? t_f32(b, 1, &sd) : CTPU_NULL;
                    if (!bf) {
                        ck_assert_int_eq(ctpu_set_requires_grad(X, true), CTPU_OK);
                        if (aff) ck_assert_int_eq(ctpu_set_requires_grad(W, true), CTPU_OK);
                        if (aff && !rms) ck_assert_int_eq(ctpu_set_requires_grad(B, true), CTPU_OK);
                    }
                    ctpu_tensor Xi = bf ? ctpu_cast(X, CTPU_BF16) : X;
                    ctpu_tensor Y = rms ? ctpu_rms_norm(Xi, W, 1e-5) : ctpu_layer_norm(Xi, W, B, 1e-5);
                    ck_assert_msg(!ctpu_is_null(Y), "norm: %s", ctpu_last_error());
                    ck_assert_int_eq(ctpu_dtype_of(Y), bf ? CTPU_BF16 : CTPU_F32);
                    t_expect_shape(Y, 2, sx);
                    float *got = t_read(Y, NULL);
                    for (int i = 0; i < R * D; i++) {
                        double e = fabs(got[i] - y[i]) / (1 + fabs(y[i]));
                        if (bf) {
                            if (e > worst_b) worst_b = e;
                        } else if (e > worst_f) worst_f = e;
                    }
                    if (!bf) {
                        if (!first) first = got;
                        else {
                            for (int i = 0; i < R * D; i++)
                                ck_assert_msg(t_same(got[i], first[i]), "norm rms %d mode %d [%d]: %a vs strict %a", rms, m, i,
                                              got[i], first[i]);
                            free(got);
                        }
                        ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(Y, t_f32(gy, 2, sx)), 0, NULL, false)), CTPU_OK);
                        float *g = t_read(ctpu_grad(X), NULL);
                        for (int i = 0; i < R * D; i++) {
                            double e = fabs(g[i] - gx[i]) / (1 + fabs(gx[i]));
                            if (e > worst_g) worst_g = e;
                        }
                        if (!firstg) firstg = g;
                        else {
                            for (int i = 0; i < R * D; i++) ck_assert_msg(t_same(g[i], firstg[i]), "norm grad mode %d", m);
                            free(g);
                        }
                        if (aff) {
                            float *g2 = t_read(ctpu_grad(W), NULL);
                            for (int k = 0; k < D; k++) ck_assert_msg(fabs(g2[k] - gw[k]) <= 2e-5 * (1 + fabs(gw[k])), "gw[%d]", k);
                            free(g2);
                        }
                        if (aff && !rms) {
                            float *g3 = t_read(ctpu_grad(B), NULL);
                            for (int k = 0; k < D; k++) ck_assert_msg(fabs(g3[k] - gb[k]) <= 2e-5 * (1 + fabs(gb[k])), "gb[%d]", k);
                            free(g3);
                        }
                    } else free(got);
                }
            }
            free(first);
            free(firstg);
        }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    /* the bounds documented in ctpu.h */
    ck_assert_msg(worst_f <= 4e-7, "f32 norm error %g", worst_f);
    ck_assert_msg(worst_b <= 1.0 / 128, "bf16 norm error %g", worst_b);
    ck_assert_msg(worst_g <= 2e-7, "norm gradient error %g", worst_g);
    /* errors */
    ctpu_tensor X = t_f32(x, 2, sx), W3 = T_VEC(1, 2, 3);
    ck_assert(ctpu_is_null(ctpu_layer_norm(X, W3, CTPU_NULL, 1e-5)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
    ck_assert_msg(t_contains(ctpu_last_error(), "layer_norm") && t_contains(ctpu_last_error(), "weight"), "%s", ctpu_last_error());
    ck_assert(ctpu_is_null(ctpu_rms_norm(X, CTPU_NULL, -1)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    ck_assert(ctpu_is_null(ctpu_rms_norm(X, CTPU_NULL, NAN)));
    ck_assert(ctpu_is_null(ctpu_layer_norm(ctpu_cast(X, CTPU_I32), CTPU_NULL, CTPU_NULL, 1e-5)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_DTYPE);
    ck_assert(ctpu_is_null(ctpu_layer_norm(ctpu_full(CTPU_F32, 0, NULL, 1.0), CTPU_NULL, CTPU_NULL, 1e-5)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
    ctpu_release(W3);
    ck_assert(ctpu_is_null(ctpu_layer_norm(X, CTPU_NULL, W3, 1e-5)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_STALE_HANDLE);
    ck_assert(t_contains(ctpu_last_error(), "bias"));
    fprintf(stderr, "norms: f32 error %.3g, bf16 %.3g, gradient %.3g (relative to 1 + |ref|)\n", worst_f, worst_b, worst_g);
    ctpu_clear_error();
}
END_TEST


/* Movement composites: squeeze / unsqueeze / flatten shapes, stack, tril /
 * triu and the causal mask against host loops, in every mode bit for bit,
 * gradients (stack's and tril's pass the kept entries), errors. */
START_TEST(movement_composites)
{
    static const ctpu_mode modes[] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    float x[2 * 3 * 4];
    for (int i = 0; i < 24; i++) x[i] = (float)i - 7.5f;
    int64_t s3[3] = { 2, 3, 4 };
    for (int m = 0; m < 3; m++) {
        ck_assert_int_eq(ctpu_set_mode(modes[m]), CTPU_OK);
        ctpu_tensor X = t_f32(x, 3, s3);
        t_expect_shape(ctpu_unsqueeze(X, 1), 4, (int64_t[]){ 2, 1, 3, 4 });
        t_expect_shape(ctpu_unsqueeze(X, -1), 4, (int64_t[]){ 2, 3, 4, 1 });
        t_expect_shape(ctpu_squeeze(ctpu_unsqueeze(X, 0), 0), 3, s3);
        t_expect_shape(ctpu_squeeze(X, 1), 3, s3);
        t_expect_shape(ctpu_flatten(X, 0, -1), 1, (int64_t[]){ 24 });
        t_expect_shape(ctpu_flatten(X, 1, 2), 2, (int64_t[]){ 2, 12 });
        t_expect_shape(ctpu_flatten(ctpu_full(CTPU_F32, 0, NULL, 2.0), 0, -1), 1, (int64_t[]){ 1 });
        /* stack along 1: out[i][s][j][k] = ts[s][i][j][k] */
        ctpu_tensor A = t_f32(x, 3, s3), B = ctpu_neg(A);
        ctpu_set_requires_grad(A, true);
        ctpu_tensor St = ctpu_stack(2, (ctpu_tensor[]){ A, B }, 1);
        t_expect_shape(St, 4, (int64_t[]){ 2, 2, 3, 4 });
        float *g = t_read(St, NULL);
        for (int i = 0; i < 2; i++)
            for (int sidx = 0; sidx < 2; sidx++)
                for (int j = 0; j < 12; j++) {
                    float want = x[i * 12 + j] * (sidx ? -1.0f : 1.0f);
                    ck_assert_msg(t_same(g[(i * 2 + sidx) * 12 + j], want), "stack mode %d", m);
                }
        free(g);
        /* tril / triu with k in -1, 0, 2 against the rule, and the gradient mask */
        for (int up = 0; up < 2; up++)
            for (int kk = -1; kk <= 2; kk += 3) {
                ctpu_tensor P = t_f32(x, 3, s3);
                ck_assert_int_eq(ctpu_set_requires_grad(P, true), CTPU_OK);
                ctpu_tensor T = up ? ctpu_triu(P, kk) : ctpu_tril(P, kk);
                ck_assert_msg(!ctpu_is_null(T), "%s", ctpu_last_error());
                float *t = t_read(T, NULL);
                ck_assert_int_eq(ctpu_backward(ctpu_sum(T, 0, NULL, false)), CTPU_OK);
                float *gt = t_read(ctpu_grad(P), NULL);
                for (int b = 0; b < 2; b++)
                    for (int i = 0; i < 3; i++)
                        for (int j = 0; j < 4; j++) {
                            bool keep = up ? j - i >= kk : j - i <= kk;
                            int o = b * 12 + i * 4 + j;
                            ck_assert_msg(t_same(t[o], keep ? x[o] : 0.0f), "tri up %d k %d mode %d [%d]", up, kk, m, o);
                            ck_assert_msg(gt[o] == (keep ? 1.0f : 0.0f), "tri grad up %d k %d [%d]", up, kk, o);
                        }
                free(t);
                free(gt);
            }
        ck_assert_int_eq(ctpu_backward(ctpu_sum(St, 0, NULL, false)), CTPU_OK);
        g = t_read(ctpu_grad(A), NULL);
        for (int i = 0; i < 24; i++) ck_assert(g[i] == 1.0f);
        free(g);
        /* the causal mask, both kinds */
        for (int kind = 0; kind < 2; kind++) {
            ctpu_tensor M = ctpu_causal_mask(3, 5, (ctpu_mask_kind)kind);
            t_expect_shape(M, 2, (int64_t[]){ 3, 5 });
            float *mv = t_read(M, NULL);
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 5; j++) {
                    float want = j <= i ? (kind ? 1.0f : 0.0f) : (kind ? 0.0f : -INFINITY);
                    ck_assert_msg(t_same(mv[i * 5 + j], want), "mask kind %d (%d,%d)", kind, i, j);
                }
            free(mv);
        }
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    /* index_select along each dim against a host loop, its gradient (index_add of ones), a bad index */
    for (int m = 0; m < 3; m++) {
        ck_assert_int_eq(ctpu_set_mode(modes[m]), CTPU_OK);
        int32_t idx[3] = { 1, 0, 1 };
        int64_t n3 = 3;
        for (int d = 0; d < 3; d++) {
            ctpu_tensor P = t_f32(x, 3, s3);
            ck_assert_int_eq(ctpu_set_requires_grad(P, true), CTPU_OK);
            ctpu_tensor I = ctpu_from_host(idx, CTPU_I32, 1, &n3);
            ctpu_tensor R = ctpu_index_select(P, d, I);
            ck_assert_msg(!ctpu_is_null(R), "index_select: %s", ctpu_last_error());
            int64_t os[3] = { 2, 3, 4 };
            os[d] = 3;
            t_expect_shape(R, 3, os);
            float *r = t_read(R, NULL);
            for (int i = 0; i < os[0]; i++)
                for (int j = 0; j < os[1]; j++)
                    for (int k = 0; k < os[2]; k++) {
                        int si = d == 0 ? idx[i] : i, sj = d == 1 ? idx[j] : j, sk = d == 2 ? idx[k] : k;
                        ck_assert_msg(t_same(r[(i * os[1] + j) * os[2] + k], x[(si * 3 + sj) * 4 + sk]), "index_select dim %d", d);
                    }
            free(r);
            ck_assert_int_eq(ctpu_backward(ctpu_sum(R, 0, NULL, false)), CTPU_OK);
            float *g = t_read(ctpu_grad(P), NULL);
            for (int i = 0; i < 24; i++) {
                int c = d == 0 ? i / 12 : d == 1 ? (i / 4) % 3 : i % 4;
                float want = (float)((c == 1 ? 2 : 0) + (c == 0 ? 1 : 0));
                ck_assert_msg(g[i] == want, "index_select grad dim %d [%d]: %g", d, i, g[i]);
            }
            free(g);
        }
        int32_t bad[2] = { 0, 5 };
        int64_t n2 = 2;
        double v;
        ctpu_tensor Rb = ctpu_index_select(t_f32(x, 3, s3), 1, ctpu_from_host(bad, CTPU_I32, 1, &n2));
        /* debug eager faults at the call, the others at the read */
        if (!ctpu_is_null(Rb)) ck_assert_int_ne(ctpu_item(ctpu_sum(Rb, 0, NULL, false), &v), CTPU_OK);
        /* named by the user's call, at the position in the user's index */
        ck_assert_msg(strncmp(ctpu_last_error(), "index_select", 12) == 0 &&
                      t_contains(ctpu_last_error(), "index 5 at position 1 is out of range [0, 3) along dim 1 (1 bad index)"),
                      "%s", ctpu_last_error());
        ctpu_clear_error();
        ctpu_sync();
        ctpu_clear_error();
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    /* errors name the op */
    ctpu_tensor X = t_f32(x, 3, s3), V = T_VEC(1, 2);
    ck_assert(ctpu_is_null(ctpu_unsqueeze(X, 4)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
    ck_assert(t_contains(ctpu_last_error(), "unsqueeze"));
    ck_assert(ctpu_is_null(ctpu_squeeze(X, INT_MIN)));
    ck_assert(ctpu_is_null(ctpu_flatten(X, 2, 1)));
    ck_assert(t_contains(ctpu_last_error(), "flatten"));
    ck_assert(ctpu_is_null(ctpu_stack(2, (ctpu_tensor[]){ X, V }, 0)));
    ck_assert(t_contains(ctpu_last_error(), "stack") && t_contains(ctpu_last_error(), "ts[1]"));
    ck_assert(ctpu_is_null(ctpu_stack(0, NULL, 0)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    ck_assert(ctpu_is_null(ctpu_index_select(X, 0, V)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_DTYPE);
    ck_assert(t_contains(ctpu_last_error(), "index_select"));
    ck_assert(ctpu_is_null(ctpu_index_select(X, 3, ctpu_cast(V, CTPU_I32))));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
    ck_assert(ctpu_is_null(ctpu_tril(V, 0)));
    ck_assert(t_contains(ctpu_last_error(), "tril"));
    ck_assert(ctpu_is_null(ctpu_causal_mask(0, 3, CTPU_MASK_BINARY)));
    ck_assert(ctpu_is_null(ctpu_causal_mask(2, 3, (ctpu_mask_kind)7)));
    ck_assert(t_contains(ctpu_last_error(), "causal_mask"));
    /* a huge k keeps all or nothing */
    float *all = t_read(ctpu_tril(X, INT64_MAX), NULL), *none = t_read(ctpu_tril(X, INT64_MIN), NULL);
    for (int i = 0; i < 24; i++) ck_assert(t_same(all[i], x[i]) && none[i] == 0.0f);
    free(all);
    free(none);
    ctpu_clear_error();
}
END_TEST

/* logsumexp against float64 in every mode (bits equal across modes), its
 * special slices and gradient; index_add against a host loop; the *_like
 * creators, eye and linspace (float64 bound and the kernel formula's bits). */
static double lse_ref(const float *x, int64_t n, int64_t stride, bool bf)
{
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; j++) {
        double v = bf ? bf16_round(x[j * stride]) : x[j * stride];
        if (v != v) return NAN;
        if (v > m) m = v;
    }
    if (isinf(m)) m = 0;
    for (int64_t j = 0; j < n; j++) s += exp((bf ? bf16_round(x[j * stride]) : x[j * stride]) - m);
    return log(s) + m;
}

START_TEST(reduction_and_creator_composites)
{
    static const ctpu_mode modes[] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    static const struct { int64_t r, n; } ls[] = { { 3, 5 }, { 2, 9001 }, { 4, 1 } };
    double worst = 0;
    for (int c = 0; c < 3; c++) {
        int64_t R = ls[c].r, N = ls[c].n, shp2[2] = { R, N };
        float *x = malloc((size_t)(R * N) * 4);
        fill(x, R * N, (uint64_t)c + 90, -30, 30, false);
        float *prev = NULL;
        for (int m = 0; m < 3; m++)
            for (int dt = 0; dt < 2; dt++) {
                ck_assert_int_eq(ctpu_set_mode(modes[m]), CTPU_OK);
                ctpu_tensor a = t_f32(x, 2, shp2);
                if (dt) a = ctpu_cast(a, CTPU_BF16);
                int d = 1;
                ctpu_tensor y = ctpu_logsumexp(a, 1, &d, dt == 1);
                ck_assert_msg(!ctpu_is_null(y), "logsumexp: %s", ctpu_last_error());
                ck_assert_int_eq(ctpu_dtype_of(y), dt ? CTPU_BF16 : CTPU_F32);
                if (dt) t_expect_shape(y, 2, (int64_t[]){ R, 1 });
                else t_expect_shape(y, 1, &R);
                float *g = t_read(y, NULL);
                for (int64_t r = 0; r < R; r++) {
                    double ref = lse_ref(x + r * N, N, 1, dt);
                    double tol = (double)(N + 8) * EPS + 2 * t_ulp_of(ref);
                    if (dt) { tol += bf16_ulp(ref); ref = bf16_round(ref); }
                    else if (fabs(g[r] - ref) > worst) worst = fabs(g[r] - ref);
                    expect_close("logsumexp", r, g[r], ref, tol, 0, 0);
                }
                if (dt == 0) {
                    if (prev) for (int64_t r = 0; r < R; r++) ck_assert_msg(t_same(prev[r], g[r]), "logsumexp: mode %d differs", m);
                    free(prev);
                    prev = g;
                } else {
                    free(g);
                }
            }
        free(prev);
        free(x);
    }
    fprintf(stderr, "logsumexp: f32 max abs error %.3g vs float64\n", worst);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    /* special slices (torch): all -inf -> -inf, a +inf -> +inf, a NaN -> NaN; dims over all; empty -> -inf */
    float sp[12] = { -INFINITY, -INFINITY, -INFINITY, 1, INFINITY, 2, 3, NAN, 4, 1000, 1000, -1000 };
    ctpu_tensor S = t_f32(sp, 2, (int64_t[]){ 4, 3 });
    int d1 = 1;
    float *g = t_read(ctpu_logsumexp(S, 1, &d1, false), NULL);
    ck_assert(g[0] == -INFINITY && g[1] == INFINITY && g[2] != g[2]);
    ck_assert_msg(fabsf(g[3] - (1000.0f + logf(2.0f))) <= 1e-4f, "logsumexp of large values: %g", g[3]);
    free(g);
    double v;
    ck_assert_int_eq(ctpu_item(ctpu_logsumexp(T_VEC(0, 0, 0, 0), 0, NULL, false), &v), CTPU_OK);
    ck_assert(fabs(v - log(4.0)) < 1e-6);
    int64_t z[2] = { 2, 0 };
    g = t_read(ctpu_logsumexp(ctpu_zeros(CTPU_F32, 2, z), 1, &d1, false), NULL);
    ck_assert(g[0] == -INFINITY && g[1] == -INFINITY);
    free(g);
    ck_assert(ctpu_is_null(ctpu_logsumexp(S, 1, (int[]){ 2 }, false)));
    ck_assert(t_contains(ctpu_last_error(), "logsumexp"));
    /* gradient: softmax */
    ctpu_tensor P = T_VEC(1, 2, -1, 0.5f);
    ctpu_set_requires_grad(P, true);
    ck_assert_int_eq(ctpu_backward(ctpu_logsumexp(P, 0, NULL, false)), CTPU_OK);
    g = t_read(ctpu_grad(P), NULL);
    double den = exp(1) + exp(2) + exp(-1) + exp(0.5);
    const double px[4] = { 1, 2, -1, 0.5 };
    for (int i = 0; i < 4; i++) ck_assert_msg(fabs(g[i] - exp(px[i]) / den) < 1e-6, "logsumexp grad %d: %g", i, g[i]);
    free(g);

    /* index_add: out[:, index[i]] += alpha * source[:, i], in every mode */
    float self[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, src[6] = { 0.5f, 0.25f, 2, -1, 3, 0.125f };
    int32_t ix[3] = { 3, 0, 3 };
    for (int m = 0; m < 3; m++) {
        ck_assert_int_eq(ctpu_set_mode(modes[m]), CTPU_OK);
        ctpu_tensor Y = ctpu_index_add(t_f32(self, 2, (int64_t[]){ 2, 4 }), 1, t_i32(ix, 1, (int64_t[]){ 3 }),
                                       t_f32(src, 2, (int64_t[]){ 2, 3 }), 2.0);
        ck_assert_msg(!ctpu_is_null(Y), "index_add: %s", ctpu_last_error());
        float want[8];
        memcpy(want, self, sizeof want);
        for (int r = 0; r < 2; r++)
            for (int i = 0; i < 3; i++) want[r * 4 + ix[i]] += 2.0f * src[r * 3 + i];
        expect_f32_vals(Y, want, 8, "index_add");
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    ck_assert(ctpu_is_null(ctpu_index_add(T_VEC(1, 2), 0, t_i32(ix, 1, (int64_t[]){ 3 }), T_VEC(1, 2), 1)));
    ck_assert(t_contains(ctpu_last_error(), "index_add"));
    ck_assert(ctpu_is_null(ctpu_index_add(T_VEC(1, 2), 0, t_i32(ix, 1, (int64_t[]){ 2 }), T_VEC(1, 2), NAN)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    ck_assert(ctpu_is_null(ctpu_index_add(T_VEC(1, 2), 0, T_VEC(0, 1), T_VEC(1, 2), 1)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_DTYPE);

    /* *_like: a's shape and dtype */
    ctpu_tensor B = ctpu_cast(t_f32(self, 2, (int64_t[]){ 2, 4 }), CTPU_BF16);
    ctpu_tensor likes[6] = { ctpu_zeros_like(B), ctpu_ones_like(B), ctpu_full_like(B, 2.5), ctpu_rand_like(B),
                             ctpu_randn_like(B), ctpu_randint_like(B, 3, 6) };
    const double lv[3] = { 0, 1, 2.5 };
    for (int k = 0; k < 6; k++) {
        ck_assert_msg(!ctpu_is_null(likes[k]), "like %d: %s", k, ctpu_last_error());
        ck_assert_int_eq(ctpu_dtype_of(likes[k]), CTPU_BF16);
        t_expect_shape(likes[k], 2, (int64_t[]){ 2, 4 });
        g = t_read(likes[k], NULL);
        for (int i = 0; i < 8; i++) {
            if (k < 3) ck_assert(g[i] == lv[k]);
            if (k == 3) ck_assert(g[i] >= 0 && g[i] <= 1);
            if (k == 5) ck_assert(g[i] == 3 || g[i] == 4 || g[i] == 5);
        }
        free(g);
    }
    ck_assert(ctpu_is_null(ctpu_rand_like(t_i32(ix, 1, (int64_t[]){ 3 }))));
    ck_assert(t_contains(ctpu_last_error(), "rand_like"));
    ctpu_tensor dead = T_VEC(1);
    ctpu_release(dead);
    ck_assert(ctpu_is_null(ctpu_zeros_like(dead)));
    ck_assert(t_contains(ctpu_last_error(), "zeros_like"));

    /* eye */
    for (int dt = 0; dt < 3; dt++) {
        ctpu_tensor E = ctpu_eye(3, 5, (ctpu_dtype)dt);
        ck_assert_msg(!ctpu_is_null(E), "eye: %s", ctpu_last_error());
        ck_assert_int_eq(ctpu_dtype_of(E), dt);
        t_expect_shape(E, 2, (int64_t[]){ 3, 5 });
        g = t_read(E, NULL);
        for (int i = 0; i < 15; i++) ck_assert(g[i] == (i / 5 == i % 5 ? 1.0f : 0.0f));
        free(g);
    }
    ck_assert_int_eq(ctpu_numel(ctpu_eye(0, 4, CTPU_F32)), 0);
    ck_assert(ctpu_is_null(ctpu_eye(-1, 4, CTPU_F32)));
    ck_assert(t_contains(ctpu_last_error(), "eye"));

    /* linspace: the kernel formula's bits (f32 arithmetic), float64 within 2 ulp of max(|start|, |end|) */
    static const struct { double a, b; int64_t n; } lc[] = {
        { 0, 1, 5 }, { -3, 7.5, 1000 }, { 1e6, -2, 33 }, { 0.1, 0.7, 7 }, { 5, 5, 4 }, { -1, 1, 2 },
    };
    double lworst = 0;
    for (int c = 0; c < 6; c++) {
        int64_t n = lc[c].n;
        float fs = (float)lc[c].a, fe = (float)lc[c].b, st = (fe - fs) / (float)(n - 1);
        for (int m = 0; m < 3; m++) {
            ck_assert_int_eq(ctpu_set_mode(modes[m]), CTPU_OK);
            ctpu_tensor L = ctpu_linspace(lc[c].a, lc[c].b, n, CTPU_F32);
            ck_assert_msg(!ctpu_is_null(L), "linspace: %s", ctpu_last_error());
            t_expect_shape(L, 1, &n);
            g = t_read(L, NULL);
            double big = fmax(fabs(lc[c].a), fabs(lc[c].b));
            for (int64_t i = 0; i < n; i++) {
                float want = i < n / 2 ? fs + st * (float)i : fe - st * (float)(n - 1 - i);
                ck_assert_msg(t_same(g[i], want), "linspace case %d [%lld]: %a want %a", c, (long long)i, g[i], want);
                double ref = lc[c].a + (double)i * (lc[c].b - lc[c].a) / (double)(n - 1);
                double err = fabs(g[i] - ref) / t_ulp_of(big);
                if (err > lworst) lworst = err;
                ck_assert_msg(err <= 2, "linspace case %d [%lld]: %.9g vs %.9g (%.2f ulp)", c, (long long)i, g[i], ref, err);
            }
            ck_assert(g[0] == fs && g[n - 1] == fe);
            free(g);
        }
    }
    fprintf(stderr, "linspace: f32 max error %.2f ulp of max(|start|, |end|)\n", lworst);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    g = t_read(ctpu_linspace(-1, 1, 5, CTPU_BF16), NULL);
    ck_assert(g[0] == -1 && g[1] == -0.5f && g[2] == 0 && g[3] == 0.5f && g[4] == 1);
    free(g);
    ck_assert_int_eq(ctpu_item(ctpu_linspace(3, 9, 1, CTPU_F32), &v), CTPU_OK);
    ck_assert(v == 3);
    ck_assert_int_eq(ctpu_numel(ctpu_linspace(3, 9, 0, CTPU_F32)), 0);
    ck_assert(ctpu_is_null(ctpu_linspace(0, NAN, 3, CTPU_F32)));
    ck_assert(t_contains(ctpu_last_error(), "linspace"));
    ck_assert(ctpu_is_null(ctpu_linspace(0, 1, 3, CTPU_I32)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_DTYPE);
}
END_TEST

/* leaky_relu and elu (composites) against float64, bits identical in every mode:
 * leaky_relu exact vs the f32 rounding of x * slope; elu <= 2 ulp. */
START_TEST(activation_composites_against_float64)
{
    static const ctpu_mode modes[] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    int64_t n = 4099;
    float *x = malloc((size_t)n * 4);
    fill(x, n, 77, -12, 12, true);
    ctpu_set_debug_checks(false);
    double worst_elu = 0;
    for (int f = 0; f < 2; f++) {
        float *prev = NULL;
        for (int m = 0; m < 3; m++) {
            ck_assert_int_eq(ctpu_set_mode(modes[m]), CTPU_OK);
            ctpu_set_debug_checks(false);   /* the specials hold NaN */
            ctpu_tensor a = t_f32(x, 1, &n);
            ctpu_tensor y = f ? ctpu_elu(a, 1.5) : ctpu_leaky_relu(a, 0.01);
            ck_assert_msg(!ctpu_is_null(y), "%s", ctpu_last_error());
            float *g = t_read(y, NULL);
            for (int64_t i = 0; i < n; i++) {
                double v = x[i];
                if (f == 0) {
                    float want = v > 0 ? x[i] : (float)(v * (double)(float)0.01);
                    if (v != v) want = x[i];
                    ck_assert_msg(t_same(g[i], want), "leaky_relu(%a) = %a, want %a", x[i], g[i], want);
                } else {
                    double r = v > 0 ? v : 1.5 * expm1(v);
                    if (v != v) { ck_assert(g[i] != g[i]); continue; }
                    if (isinf(r)) { ck_assert(g[i] == r); continue; }
                    double e = r == 0 ? fabs((double)g[i]) : fabs(g[i] - r) / t_ulp_of(r);
                    if (e > worst_elu) worst_elu = e;
                    ck_assert_msg(e <= 2 || fabs(g[i] - r) <= 0x1p-126, "elu(%a) = %a, want %.17g (%.2f ulp)", x[i], g[i], r, e);
                }
            }
            if (prev) for (int64_t i = 0; i < n; i++) ck_assert_msg(t_same(prev[i], g[i]), "mode %d [%lld]", m, (long long)i);
            free(prev);
            prev = g;
        }
        free(prev);
    }
    fprintf(stderr, "elu: max %.2f ulp vs float64 (leaky_relu exact)\n", worst_elu);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    free(x);
}
END_TEST


/* ------------------------------------------------------------ ulp bounds per mode */
/* Each transcendental op through the public API, on a fixed grid (4096
 * points evenly spaced over its range), in strict eager, debug eager and
 * defer and fuse (there chained with an exact mul by 1, so it runs inside a
 * fused VM group): the maximum ulp error against float64 libm must be within
 * the documented bound (the header comment of this file; the kernels' own
 * in test_k_elementwise.c). The ISA is the process's: tools/run-tests.sh
 * runs this suite with CTPU_ISA=avx2 and scalar too. */
typedef struct { const char *name; ctpu_tensor (*fn)(ctpu_tensor); double (*ref)(double); float lo, hi; double tol; } ulp_case;
static double r_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double r_rsqrt(double x) { return 1.0 / sqrt(x); }
static double r_softplus(double x) { return x > 20 ? x : log1p(exp(x)); }
static double r_gelu(double x) { return 0.5 * x * erfc(-x * 0.70710678118654752440); }
static ctpu_tensor u_gelu(ctpu_tensor a) { return ctpu_gelu(a, false); }
static const ulp_case ULP_CASES[] = {
    { "exp", ctpu_exp, exp, -87.0f, 88.0f, 2 },          { "log", ctpu_log, log, 1e-30f, 1e30f, 2 },
    { "tanh", ctpu_tanh, tanh, -10.0f, 10.0f, 2 },       { "sigmoid", ctpu_sigmoid, r_sigmoid, -80.0f, 80.0f, 4 },
    { "sqrt", ctpu_sqrt, sqrt, 0.0f, 1e30f, 0 },         { "rsqrt", ctpu_rsqrt, r_rsqrt, 1e-30f, 1e30f, 2 },
    { "softplus", ctpu_softplus, r_softplus, -80.0f, 40.0f, 2 },
    { "gelu", u_gelu, r_gelu, -12.0f, 12.0f, 2 },        { "erf", ctpu_erf, erf, -6.0f, 6.0f, 2 },
    { "sin", ctpu_sin, sin, -10000.0f, 10000.0f, 2 },    { "cos", ctpu_cos, cos, -10000.0f, 10000.0f, 2 },
    { "log1p", ctpu_log1p, log1p, -0.999f, 1e30f, 2 },   { "expm1", ctpu_expm1, expm1, -20.0f, 88.0f, 2 },
};

START_TEST(transcendental_ulp_bounds_every_mode)
{
    enum { N = 4096 };
    static float x[N];
    const ulp_case *c = &ULP_CASES[_i];
    for (int i = 0; i < N; i++) x[i] = c->lo + (float)((double)(c->hi - c->lo) * i / (N - 1));
    static const ctpu_mode modes[3] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    for (int m = 0; m < 3; m++) {
        ck_assert_int_eq(ctpu_set_mode(modes[m]), CTPU_OK);
        int64_t n = N;
        ctpu_tensor xt = t_f32(x, 1, &n);
        ctpu_tensor y = c->fn(xt);
        if (modes[m] == CTPU_MODE_DEFER_FUSE) y = ctpu_mul_scalar(y, 1.0);
        float *v = t_read(y, NULL);
        double worst = 0;
        for (int i = 0; i < N; i++) {
            double d = c->ref((double)x[i]);
            float want = (float)d;
            double u = t_ulps(v[i], want);
            /* a result in the subnormal range may be flushed (CONTRACTS.md) */
            if (u > c->tol && fabs(d) < 1.1754943508222875e-38 && fabs((double)v[i] - d) <= 0x1p-126) u = 0;
            ck_assert_msg(u <= c->tol, "%s(%a) in %s: %a, float64 %a: %.0f ulp > %.0f", c->name, (double)x[i],
                          ctpu_mode_name(modes[m]), (double)v[i], d, u, c->tol);
            if (u > worst) worst = u;
        }
        free(v);
        printf("ulp %s [%g, %g] %s: max %.0f ulp (bound %.0f)\n", c->name, (double)c->lo, (double)c->hi,
               ctpu_mode_name(modes[m]), worst, c->tol);
        ctpu_release(y);
        ctpu_release(xt);
    }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("ops");
    TCase *t = tcase_create("table");
    tcase_add_test(t, every_op_has_a_case);
    tcase_add_test(t, every_op_has_its_rules);
    suite_add_tcase(s, t);
    TCase *c = tcase_create("conformance");
    tcase_add_checked_fixture(c, t_setup, t_teardown);
    tcase_set_timeout(c, 120);
    tcase_add_loop_test(c, op_conformance, 0, CTPU_OP_COUNT);
    tcase_add_test(c, dtype_promotion);
    tcase_add_test(c, zero_dim_tensor_promotion);
    tcase_add_test(c, silu_is_its_composition);
    tcase_add_test(c, norms_against_float64);
    tcase_add_test(c, movement_composites);
    tcase_add_loop_test(c, transcendental_ulp_bounds_every_mode, 0, (int)(sizeof ULP_CASES / sizeof ULP_CASES[0]));
    tcase_add_test(c, reduction_and_creator_composites);
    tcase_add_test(c, activation_composites_against_float64);
    suite_add_tcase(s, c);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
