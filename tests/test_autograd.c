/* Autograd (src/eager/autograd.c).
 *
 * - The rule table has an entry (a rule or an explicit "no gradient") for
 *   every op, and every op with a rule has a gradient check below.
 * - Gradient checks: for f(x...) and a fixed random R of f's output shape,
 *   L = sum(R * f(x)); backward(L) against central finite differences of L,
 *   (L(x+h) - L(x-h)) / (2h) with h = 1e-3, L summed on the host in float64
 *   from f's f32 outputs. The ops compute in f32, so the tolerance is
 *   |analytic - numeric| <= 1e-3 + 5e-3 |numeric| (the f32 rounding of an
 *   output, ~6e-8 relative, divided by 2h, is ~3e-5 of its scale). Inputs
 *   are drawn away from kinks (relu/abs at 0, ties of max/min, clamp's
 *   bounds). Shapes include broadcasting, 0-d and 0-size tensors. Matmul
 *   runs at HIGHEST precision (6 bf16 passes ~ f32).
 * - Semantics: accumulation across backward calls, zero_grad (set-to-none),
 *   retain_graph and the released-tape error, no_grad, detach, a tape that
 *   survives the release of every intermediate handle, errors, no leaks. */
#include <unistd.h>

#include "t_core.h"
#include "ctpu_nn.h"

/* ------------------------------------------------------------ rng */
static uint64_t rs = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return rs; }
static double urand(void) { return (double)(rnd() >> 11) * 0x1p-53; }   /* [0, 1) */

enum { D_ANY, D_POS, D_AWAY, D_Q1, D_Q2, D_DISTINCT, D_IDX };
typedef struct { int nd; int64_t s[8]; int dom; int irange; } spec;

static int64_t numel_of(const spec *p)
{
    int64_t n = 1;
    for (int d = 0; d < p->nd; d++) n *= p->s[d];
    return n;
}

static void fill(double *x, int64_t n, const spec *p)
{
    for (int64_t i = 0; i < n; i++) {
        double u = urand();
        switch (p->dom) {
        case D_ANY: x[i] = u * 4 - 2; break;
        case D_POS: x[i] = 0.5 + 1.5 * u; break;
        case D_AWAY: x[i] = (0.2 + 1.3 * u) * (rnd() & 1 ? 1 : -1); break;
        case D_Q1: x[i] = (double)(int)(u * 12 - 6) * 0.25 + 0.05; break;
        case D_Q2: x[i] = (double)(int)(u * 12 - 6) * 0.25 + 0.17; break;
        case D_DISTINCT: x[i] = (double)((i * 7919) % (3 * n + 1)) * 0.05 - 0.05 * (double)n; break;
        case D_IDX: x[i] = (double)(rnd() % (uint64_t)p->irange); break;
        }
    }
}

typedef ctpu_tensor (*fwd_fn)(ctpu_tensor *x);

static ctpu_tensor mk(const spec *p, const double *x)
{
    int64_t n = numel_of(p);
    if (p->dom == D_IDX) {
        int32_t *v = malloc((size_t)(n ? n : 1) * 4);
        for (int64_t i = 0; i < n; i++) v[i] = (int32_t)x[i];
        ctpu_tensor t = ctpu_from_host(v, CTPU_I32, p->nd, p->s);
        free(v);
        return t;
    }
    float *v = malloc((size_t)(n ? n : 1) * 4);
    for (int64_t i = 0; i < n; i++) v[i] = (float)x[i];
    ctpu_tensor t = ctpu_from_host(v, CTPU_F32, p->nd, p->s);
    free(v);
    return t;
}

/* L = sum(R * f(x)) on the host in float64; *ny gets f's numel. */
static double eval_loss(fwd_fn f, int n_in, const spec *sp, double **x, const double *R, int64_t *ny)
{
    ctpu_scope_begin();
    ctpu_tensor t[4];
    for (int i = 0; i < n_in; i++) t[i] = mk(&sp[i], x[i]);
    ctpu_tensor y = f(t);
    ck_assert_msg(!ctpu_is_null(y), "forward: %s", ctpu_last_error());
    int64_t n = ctpu_numel(y);
    float *yv = malloc((size_t)(n ? n : 1) * 4);
    ck_assert_int_eq(ctpu_to_host(y, yv, (size_t)n * 4), CTPU_OK);
    double L = 0;
    for (int64_t i = 0; i < n && R; i++) L += R[i] * (double)yv[i];
    free(yv);
    ctpu_scope_end();
    if (ny) *ny = n;
    return L;
}

static void gradcheck(const char *name, fwd_fn f, int n_in, const spec *sp)
{
    double *x[4];
    int64_t n[4];
    for (int i = 0; i < n_in; i++) {
        n[i] = numel_of(&sp[i]);
        x[i] = malloc((size_t)(n[i] ? n[i] : 1) * sizeof(double));
        fill(x[i], n[i], &sp[i]);
        if (sp[i].dom != D_IDX)   /* exactly representable in f32 */
            for (int64_t j = 0; j < n[i]; j++) x[i][j] = (double)(float)x[i][j];
    }
    int64_t ny;
    eval_loss(f, n_in, sp, x, NULL, &ny);
    double *R = malloc((size_t)(ny ? ny : 1) * sizeof(double));
    for (int64_t i = 0; i < ny; i++) R[i] = urand() * 2 - 1;

    /* analytic */
    double *ga[4] = {0};
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    ctpu_tensor t[4];
    for (int i = 0; i < n_in; i++) {
        t[i] = mk(&sp[i], x[i]);
        if (sp[i].dom != D_IDX) ck_assert_int_eq(ctpu_set_requires_grad(t[i], true), CTPU_OK);
    }
    ctpu_tensor y = f(t);
    ck_assert_msg(!ctpu_is_null(y), "%s: forward: %s", name, ctpu_last_error());
    float *Rf = malloc((size_t)(ny ? ny : 1) * 4);
    for (int64_t i = 0; i < ny; i++) Rf[i] = (float)R[i];
    int64_t ys[8];
    int ynd;
    ctpu_shape(y, ys, &ynd);
    ctpu_tensor Rt = ctpu_from_host(Rf, CTPU_F32, ynd, ys);
    for (int64_t i = 0; i < ny; i++) R[i] = (double)Rf[i];
    free(Rf);
    ctpu_tensor loss = ctpu_sum(ctpu_mul(y, Rt), 0, NULL, false);
    ck_assert_msg(ctpu_backward(loss) == CTPU_OK, "%s: backward: %s", name, ctpu_last_error());
    for (int i = 0; i < n_in; i++) {
        if (sp[i].dom == D_IDX) continue;
        ga[i] = calloc((size_t)(n[i] ? n[i] : 1), sizeof(double));
        ctpu_tensor g = ctpu_grad(t[i]);
        if (ctpu_is_null(g)) continue;   /* no path: zeros */
        ck_assert_int_eq(ctpu_numel(g), n[i]);
        ck_assert_int_eq(ctpu_dtype_of(g), CTPU_F32);
        float *gv = malloc((size_t)(n[i] ? n[i] : 1) * 4);
        ck_assert_int_eq(ctpu_to_host(g, gv, (size_t)n[i] * 4), CTPU_OK);
        for (int64_t j = 0; j < n[i]; j++) ga[i][j] = gv[j];
        free(gv);
    }
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);

    /* numeric */
    const double h = 1e-3;
    for (int i = 0; i < n_in; i++) {
        if (sp[i].dom == D_IDX) continue;
        for (int64_t j = 0; j < n[i]; j++) {
            double x0 = x[i][j];
            double xp = (double)(float)(x0 + h), xm = (double)(float)(x0 - h);
            x[i][j] = xp;
            double Lp = eval_loss(f, n_in, sp, x, R, NULL);
            x[i][j] = xm;
            double Lm = eval_loss(f, n_in, sp, x, R, NULL);
            x[i][j] = x0;
            double num = (Lp - Lm) / (xp - xm);
            double err = fabs(ga[i][j] - num);
            ck_assert_msg(err <= 1e-3 + 5e-3 * fabs(num),
                          "%s: input %d element %lld: analytic %.6g, numeric %.6g", name, i, (long long)j,
                          ga[i][j], num);
        }
        free(ga[i]);
    }
    for (int i = 0; i < n_in; i++) free(x[i]);
    free(R);
}

/* ------------------------------------------------------------ cases */
#define S(...) { .nd = (int)(sizeof((int64_t[]){__VA_ARGS__}) / 8), .s = {__VA_ARGS__}
#define SP(dom_, ...) S(__VA_ARGS__), .dom = (dom_) }
#define S0(dom_) { .nd = 0, .dom = (dom_) }

static ctpu_tensor f_neg(ctpu_tensor *x) { return ctpu_neg(x[0]); }
static ctpu_tensor f_abs(ctpu_tensor *x) { return ctpu_abs(x[0]); }
static ctpu_tensor f_exp(ctpu_tensor *x) { return ctpu_exp(x[0]); }
static ctpu_tensor f_log(ctpu_tensor *x) { return ctpu_log(x[0]); }
static ctpu_tensor f_sqrt(ctpu_tensor *x) { return ctpu_sqrt(x[0]); }
static ctpu_tensor f_rsqrt(ctpu_tensor *x) { return ctpu_rsqrt(x[0]); }
static ctpu_tensor f_tanh(ctpu_tensor *x) { return ctpu_tanh(x[0]); }
static ctpu_tensor f_sigmoid(ctpu_tensor *x) { return ctpu_sigmoid(x[0]); }
static ctpu_tensor f_relu(ctpu_tensor *x) { return ctpu_relu(x[0]); }
static ctpu_tensor f_erf(ctpu_tensor *x) { return ctpu_erf(x[0]); }
static ctpu_tensor f_sin(ctpu_tensor *x) { return ctpu_sin(x[0]); }
static ctpu_tensor f_cos(ctpu_tensor *x) { return ctpu_cos(x[0]); }
static ctpu_tensor f_log1p(ctpu_tensor *x) { return ctpu_log1p(x[0]); }
static ctpu_tensor f_expm1(ctpu_tensor *x) { return ctpu_expm1(x[0]); }
static ctpu_tensor f_leaky_relu(ctpu_tensor *x) { return ctpu_leaky_relu(x[0], 0.1); }
static ctpu_tensor f_elu(ctpu_tensor *x) { return ctpu_elu(x[0], 1.5); }
static ctpu_tensor f_gelu_t(ctpu_tensor *x) { return ctpu_gelu(x[0], true); }
static ctpu_tensor f_gelu_e(ctpu_tensor *x) { return ctpu_gelu(x[0], false); }
static ctpu_tensor f_softplus(ctpu_tensor *x) { return ctpu_softplus(x[0]); }
/* around the threshold: softplus(x + 20) for x in the domain */
static ctpu_tensor f_softplus_20(ctpu_tensor *x) { return ctpu_softplus(ctpu_add_scalar(x[0], 20.0)); }
static ctpu_tensor f_add(ctpu_tensor *x) { return ctpu_add(x[0], x[1]); }
static ctpu_tensor f_sub(ctpu_tensor *x) { return ctpu_sub(x[0], x[1]); }
static ctpu_tensor f_mul(ctpu_tensor *x) { return ctpu_mul(x[0], x[1]); }
static ctpu_tensor f_div(ctpu_tensor *x) { return ctpu_div(x[0], x[1]); }
static ctpu_tensor f_pow(ctpu_tensor *x) { return ctpu_pow(x[0], x[1]); }
static ctpu_tensor f_maximum(ctpu_tensor *x) { return ctpu_maximum(x[0], x[1]); }
static ctpu_tensor f_minimum(ctpu_tensor *x) { return ctpu_minimum(x[0], x[1]); }
static ctpu_tensor f_mul_self(ctpu_tensor *x) { return ctpu_mul(x[0], x[0]); }
static ctpu_tensor f_add_s(ctpu_tensor *x) { return ctpu_add_scalar(x[0], 0.75); }
static ctpu_tensor f_sub_s(ctpu_tensor *x) { return ctpu_sub_scalar(x[0], 0.75); }
static ctpu_tensor f_rsub_s(ctpu_tensor *x) { return ctpu_rsub_scalar(x[0], 0.75); }
static ctpu_tensor f_mul_s(ctpu_tensor *x) { return ctpu_mul_scalar(x[0], -1.5); }
static ctpu_tensor f_div_s(ctpu_tensor *x) { return ctpu_div_scalar(x[0], 0.4); }
static ctpu_tensor f_rdiv_s(ctpu_tensor *x) { return ctpu_rdiv_scalar(x[0], 0.4); }
static ctpu_tensor f_pow_s(ctpu_tensor *x) { return ctpu_pow_scalar(x[0], 2.5); }
static ctpu_tensor f_rpow_s(ctpu_tensor *x) { return ctpu_rpow_scalar(x[0], 1.7); }
static ctpu_tensor f_max_s(ctpu_tensor *x) { return ctpu_maximum_scalar(x[0], 0.3); }
static ctpu_tensor f_min_s(ctpu_tensor *x) { return ctpu_minimum_scalar(x[0], 0.3); }
static ctpu_tensor f_where(ctpu_tensor *x) { return ctpu_where(ctpu_gt_scalar(x[0], 0), x[1], x[2]); }
static ctpu_tensor f_clamp(ctpu_tensor *x) { return ctpu_clamp(x[0], -0.5, 0.5); }
static ctpu_tensor f_cast(ctpu_tensor *x) { return ctpu_cast(ctpu_mul_scalar(x[0], 2.0), CTPU_F32); }
static ctpu_tensor f_sum_all(ctpu_tensor *x) { return ctpu_sum(x[0], 0, NULL, false); }
static ctpu_tensor f_sum_d(ctpu_tensor *x) { int d[2] = { 0, 2 }; return ctpu_sum(x[0], 2, d, false); }
static ctpu_tensor f_sum_k(ctpu_tensor *x) { int d = -1; return ctpu_sum(x[0], 1, &d, true); }
static ctpu_tensor f_mean_d(ctpu_tensor *x) { int d = 1; return ctpu_mean(x[0], 1, &d, false); }
static ctpu_tensor f_mean_all(ctpu_tensor *x) { return ctpu_mean(x[0], 0, NULL, true); }
static ctpu_tensor f_max_d(ctpu_tensor *x) { int d = 1; return ctpu_max(x[0], 1, &d, false); }
static ctpu_tensor f_min_d(ctpu_tensor *x) { int d[2] = { 0, 2 }; return ctpu_min(x[0], 2, d, true); }
static ctpu_tensor f_var1(ctpu_tensor *x) { int d = 1; return ctpu_var(x[0], 1, &d, 1, false); }
static ctpu_tensor f_var0(ctpu_tensor *x) { return ctpu_var(x[0], 0, NULL, 0, false); }
static ctpu_tensor f_softmax(ctpu_tensor *x) { return ctpu_softmax(x[0], -1); }
static ctpu_tensor f_softmax0(ctpu_tensor *x) { return ctpu_softmax(x[0], 0); }
static ctpu_tensor f_lsm(ctpu_tensor *x) { return ctpu_log_softmax(x[0], 1); }
static ctpu_tensor f_reshape(ctpu_tensor *x) { int64_t s[2] = { 4, -1 }; return ctpu_mul(ctpu_reshape(x[0], 2, s), ctpu_reshape(x[0], 2, s)); }
static ctpu_tensor f_contig(ctpu_tensor *x) { return ctpu_exp(ctpu_contiguous(x[0])); }
static ctpu_tensor f_permute(ctpu_tensor *x) { int p[3] = { 2, 0, 1 }; return ctpu_permute(x[0], p); }
static ctpu_tensor f_transpose(ctpu_tensor *x) { return ctpu_tanh(ctpu_transpose(x[0], 0, 1)); }
static ctpu_tensor f_slice1(ctpu_tensor *x) { return ctpu_slice(x[0], 0, 1, 3, 1); }
static ctpu_tensor f_slice2(ctpu_tensor *x) { return ctpu_slice(x[0], 1, -4, 100, 2); }
static ctpu_tensor f_slice3(ctpu_tensor *x) { return ctpu_slice(x[0], 2, 0, 5, 3); }
static ctpu_tensor f_concat(ctpu_tensor *x) { return ctpu_concat(3, (ctpu_tensor[]){ x[0], x[1], x[0] }, 1); }
static ctpu_tensor f_expand(ctpu_tensor *x) { int64_t s[3] = { 2, 3, 4 }; return ctpu_expand(x[0], 3, s); }
static ctpu_tensor f_embedding(ctpu_tensor *x) { return ctpu_embedding(x[0], x[1]); }
static ctpu_tensor f_gather(ctpu_tensor *x) { return ctpu_gather(x[0], 1, x[1]); }
static ctpu_tensor f_gather0(ctpu_tensor *x) { return ctpu_gather(x[0], 0, x[1]); }
static ctpu_tensor f_matmul(ctpu_tensor *x) { return ctpu_matmul(x[0], x[1]); }
static ctpu_tensor f_mm_tn(ctpu_tensor *x) { return ctpu_matmul_t(x[0], x[1], true, false); }
static ctpu_tensor f_mm_nt(ctpu_tensor *x) { return ctpu_matmul_t(x[0], x[1], false, true); }
static ctpu_tensor f_mm_tt(ctpu_tensor *x) { return ctpu_matmul_t(x[0], x[1], true, true); }
/* issue 12: primitives */
static ctpu_tensor f_prod_d(ctpu_tensor *x) { int d = 1; return ctpu_prod(x[0], 1, &d, false); }
static ctpu_tensor f_prod_all(ctpu_tensor *x) { return ctpu_prod(x[0], 0, NULL, true); }
/* one exact zero per row of x * (0, 1, 1), two in the last: every case of the rule */
static ctpu_tensor f_prod_zeros(ctpu_tensor *x)
{
    int d = 1;
    ctpu_tensor m = ctpu_from_host((const float[]){ 0, 1, 1, 1, 1, 1, 0, 0, 1 }, CTPU_F32, 2, (const int64_t[]){ 3, 3 });
    return ctpu_prod(ctpu_mul(x[0], m), 1, &d, false);
}
static ctpu_tensor f_cumsum0(ctpu_tensor *x) { return ctpu_cumsum(x[0], 0); }
static ctpu_tensor f_cumsum1(ctpu_tensor *x) { return ctpu_cumsum(x[0], -1); }
static ctpu_tensor f_scatter(ctpu_tensor *x) { return ctpu_scatter_add(x[0], 0, x[2], x[1]); }
/* composites */
static ctpu_tensor f_lse(ctpu_tensor *x) { int d = 1; return ctpu_logsumexp(x[0], 1, &d, false); }
static ctpu_tensor f_lse_all(ctpu_tensor *x) { return ctpu_logsumexp(x[0], 0, NULL, true); }
static ctpu_tensor f_index_add(ctpu_tensor *x) { return ctpu_index_add(x[0], 1, x[2], x[1], 0.5); }
static ctpu_tensor f_silu(ctpu_tensor *x) { return ctpu_silu(x[0]); }
static ctpu_tensor f_layer_norm(ctpu_tensor *x) { return ctpu_layer_norm(x[0], x[1], x[2], 1e-5); }
static ctpu_tensor f_rms_norm(ctpu_tensor *x) { return ctpu_rms_norm(x[0], x[1], 1e-6); }
static ctpu_tensor f_stack(ctpu_tensor *x) { return ctpu_stack(2, (ctpu_tensor[]){ x[0], x[1] }, 1); }
static ctpu_tensor f_squeeze(ctpu_tensor *x) { return ctpu_flatten(ctpu_squeeze(ctpu_unsqueeze(x[0], 0), 0), 0, -1); }
static ctpu_tensor f_tril(ctpu_tensor *x) { return ctpu_tril(x[0], 0); }
static ctpu_tensor f_triu(ctpu_tensor *x) { return ctpu_triu(x[0], 1); }
static ctpu_tensor f_index_select(ctpu_tensor *x) { return ctpu_index_select(x[0], 0, x[1]); }
/* losses (ctpu_nn.h composites) */
static ctpu_tensor f_nll(ctpu_tensor *x) { return ctpu_nll_loss(ctpu_log_softmax(x[0], 1), x[1], NULL); }
static ctpu_tensor f_nll_sum(ctpu_tensor *x)
{
    ctpu_nll_opts o = { CTPU_REDUCE_SUM, 2 };   /* label 2 is ignored */
    return ctpu_nll_loss(x[0], x[1], &o);
}
static ctpu_tensor f_bce(ctpu_tensor *x) { return ctpu_bce_with_logits(x[0], x[1], CTPU_REDUCE_MEAN); }
static ctpu_tensor f_l1(ctpu_tensor *x) { return ctpu_l1_loss(x[0], x[1], CTPU_REDUCE_SUM); }
static ctpu_tensor f_smooth_l1(ctpu_tensor *x) { return ctpu_smooth_l1_loss(x[0], x[1], CTPU_REDUCE_NONE, 0.5); }
static ctpu_tensor f_mse(ctpu_tensor *x) { return ctpu_mse_loss(x[0], x[1], CTPU_REDUCE_MEAN); }
static ctpu_tensor f_ce(ctpu_tensor *x) { return ctpu_cross_entropy(x[0], x[1], NULL); }

/* attention: causal without a mask; a KEEP01 mask (a constant) with a scale */
static ctpu_tensor f_sdpa(ctpu_tensor *x)
{
    return ctpu_scaled_dot_product_attention(x[0], x[1], x[2], CTPU_NULL, CTPU_MASK_NONE, true, 0, 0);
}
static ctpu_tensor f_sdpa_mask(ctpu_tensor *x)
{
    static const float m[5 * 6] = { 1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0,
                                    1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1 };
    ctpu_tensor mt = ctpu_from_host(m, CTPU_F32, 2, (int64_t[]){ 5, 6 });
    return ctpu_scaled_dot_product_attention(x[0], x[1], x[2], mt, CTPU_MASK_KEEP01, false, 0.7, 0);
}
/* a small MLP-like chain: several ops, shared inputs, broadcasting */
static ctpu_tensor f_chain(ctpu_tensor *x)
{
    ctpu_tensor h = ctpu_relu(ctpu_add(ctpu_matmul_t(x[0], x[1], false, true), x[2]));
    return ctpu_log_softmax(ctpu_mul(h, ctpu_sigmoid(h)), 1);
}

typedef struct {
    const char *name;
    fwd_fn f;
    int n_in;
    spec in[3];
    int ops[4];   /* ops this case covers (0-terminated after the first) */
} gc_case;

#define OPS(...) { __VA_ARGS__ }

static const gc_case cases[] = {
    { "neg", f_neg, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_NEG) },
    { "neg 0-d", f_neg, 1, { S0(D_ANY) }, OPS(CTPU_OP_NEG) },
    { "neg 0-size", f_neg, 1, { SP(D_ANY, 0, 4) }, OPS(CTPU_OP_NEG) },
    { "abs", f_abs, 1, { SP(D_AWAY, 2, 3) }, OPS(CTPU_OP_ABS) },
    { "exp", f_exp, 1, { SP(D_ANY, 3, 2) }, OPS(CTPU_OP_EXP) },
    { "log", f_log, 1, { SP(D_POS, 5) }, OPS(CTPU_OP_LOG) },
    { "sqrt", f_sqrt, 1, { SP(D_POS, 5) }, OPS(CTPU_OP_SQRT) },
    { "rsqrt", f_rsqrt, 1, { SP(D_POS, 5) }, OPS(CTPU_OP_RSQRT) },
    { "tanh", f_tanh, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_TANH) },
    { "sigmoid", f_sigmoid, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_SIGMOID) },
    { "relu", f_relu, 1, { SP(D_AWAY, 2, 4) }, OPS(CTPU_OP_RELU) },
    { "erf", f_erf, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_ERF) },
    { "sin", f_sin, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_SIN) },
    { "cos", f_cos, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_COS) },
    { "log1p", f_log1p, 1, { SP(D_POS, 2, 3) }, OPS(CTPU_OP_LOG1P) },
    { "expm1", f_expm1, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_EXPM1) },
    { "leaky_relu", f_leaky_relu, 1, { SP(D_AWAY, 2, 4) }, OPS(CTPU_OP_WHERE) },
    { "elu", f_elu, 1, { SP(D_AWAY, 2, 4) }, OPS(CTPU_OP_EXPM1) },
    { "gelu tanh", f_gelu_t, 1, { SP(D_ANY, 2, 4) }, OPS(CTPU_OP_GELU_TANH) },
    { "gelu erf", f_gelu_e, 1, { SP(D_ANY, 2, 4) }, OPS(CTPU_OP_GELU_ERF) },
    { "softplus", f_softplus, 1, { SP(D_ANY, 2, 4) }, OPS(CTPU_OP_SOFTPLUS) },
    { "softplus near 20", f_softplus_20, 1, { SP(D_AWAY, 2, 4) }, OPS(CTPU_OP_SOFTPLUS) },
    { "add", f_add, 2, { SP(D_ANY, 2, 3), SP(D_ANY, 2, 3) }, OPS(CTPU_OP_ADD) },
    { "add bcast", f_add, 2, { SP(D_ANY, 3, 1, 4), SP(D_ANY, 2, 1) }, OPS(CTPU_OP_ADD) },
    { "add 0-size", f_add, 2, { SP(D_ANY, 0, 3), SP(D_ANY, 1, 3) }, OPS(CTPU_OP_ADD) },
    { "add 0-d", f_add, 2, { SP(D_ANY, 2, 3), S0(D_ANY) }, OPS(CTPU_OP_ADD) },
    { "sub bcast", f_sub, 2, { SP(D_ANY, 4), SP(D_ANY, 3, 1) }, OPS(CTPU_OP_SUB) },
    { "mul bcast", f_mul, 2, { SP(D_ANY, 2, 1, 3), SP(D_ANY, 2, 3) }, OPS(CTPU_OP_MUL) },
    { "mul self", f_mul_self, 1, { SP(D_ANY, 5) }, OPS(CTPU_OP_MUL) },
    { "div bcast", f_div, 2, { SP(D_ANY, 2, 3), SP(D_AWAY, 3) }, OPS(CTPU_OP_DIV) },
    { "pow", f_pow, 2, { SP(D_POS, 2, 3), SP(D_ANY, 2, 3) }, OPS(CTPU_OP_POW) },
    { "maximum bcast", f_maximum, 2, { SP(D_Q1, 3, 4), SP(D_Q2, 4) }, OPS(CTPU_OP_MAXIMUM) },
    { "minimum", f_minimum, 2, { SP(D_Q1, 3, 4), SP(D_Q2, 3, 4) }, OPS(CTPU_OP_MINIMUM) },
    { "add_scalar", f_add_s, 1, { SP(D_ANY, 3) }, OPS(CTPU_OP_ADD_SCALAR) },
    { "sub_scalar", f_sub_s, 1, { SP(D_ANY, 3) }, OPS(CTPU_OP_SUB_SCALAR) },
    { "rsub_scalar", f_rsub_s, 1, { SP(D_ANY, 3) }, OPS(CTPU_OP_SUB_SCALAR) },
    { "mul_scalar", f_mul_s, 1, { SP(D_ANY, 3) }, OPS(CTPU_OP_MUL_SCALAR) },
    { "div_scalar", f_div_s, 1, { SP(D_ANY, 3) }, OPS(CTPU_OP_DIV_SCALAR) },
    { "rdiv_scalar", f_rdiv_s, 1, { SP(D_AWAY, 4) }, OPS(CTPU_OP_DIV_SCALAR) },
    { "pow_scalar", f_pow_s, 1, { SP(D_POS, 4) }, OPS(CTPU_OP_POW_SCALAR) },
    { "rpow_scalar", f_rpow_s, 1, { SP(D_ANY, 4) }, OPS(CTPU_OP_POW_SCALAR) },
    { "maximum_scalar", f_max_s, 1, { SP(D_Q1, 6) }, OPS(CTPU_OP_MAXIMUM_SCALAR) },
    { "minimum_scalar", f_min_s, 1, { SP(D_Q1, 6) }, OPS(CTPU_OP_MINIMUM_SCALAR) },
    { "where bcast", f_where, 3, { SP(D_AWAY, 2, 3), SP(D_ANY, 3), SP(D_ANY, 2, 1) }, OPS(CTPU_OP_WHERE) },
    { "clamp", f_clamp, 1, { SP(D_Q1, 8) }, OPS(CTPU_OP_CLAMP) },
    { "cast", f_cast, 1, { SP(D_ANY, 4) }, OPS(CTPU_OP_CAST) },
    { "sum all", f_sum_all, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_SUM) },
    { "sum dims", f_sum_d, 1, { SP(D_ANY, 2, 3, 2) }, OPS(CTPU_OP_SUM) },
    { "sum keepdim", f_sum_k, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_SUM) },
    { "sum 0-size", f_sum_k, 1, { SP(D_ANY, 2, 0) }, OPS(CTPU_OP_SUM) },
    { "sum 0-d", f_sum_all, 1, { S0(D_ANY) }, OPS(CTPU_OP_SUM) },
    { "mean dim", f_mean_d, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_MEAN) },
    { "mean all", f_mean_all, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_MEAN) },
    { "max dim", f_max_d, 1, { SP(D_DISTINCT, 3, 4) }, OPS(CTPU_OP_MAX) },
    { "min dims", f_min_d, 1, { SP(D_DISTINCT, 2, 3, 2) }, OPS(CTPU_OP_MIN) },
    { "var", f_var1, 1, { SP(D_ANY, 2, 4) }, OPS(CTPU_OP_VAR) },
    { "var all", f_var0, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_VAR) },
    { "softmax", f_softmax, 1, { SP(D_ANY, 2, 4) }, OPS(CTPU_OP_SOFTMAX) },
    { "softmax dim0", f_softmax0, 1, { SP(D_ANY, 3, 2) }, OPS(CTPU_OP_SOFTMAX) },
    { "log_softmax", f_lsm, 1, { SP(D_ANY, 2, 5) }, OPS(CTPU_OP_LOG_SOFTMAX) },
    { "reshape", f_reshape, 1, { SP(D_ANY, 2, 2, 2) }, OPS(CTPU_OP_RESHAPE) },
    { "contiguous", f_contig, 1, { SP(D_ANY, 2, 2) }, OPS(CTPU_OP_RESHAPE) },
    { "permute", f_permute, 1, { SP(D_ANY, 2, 3, 2) }, OPS(CTPU_OP_PERMUTE) },
    { "transpose", f_transpose, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_PERMUTE) },
    { "slice view", f_slice1, 1, { SP(D_ANY, 4, 2) }, OPS(CTPU_OP_SLICE) },
    { "slice step", f_slice2, 1, { SP(D_ANY, 2, 7) }, OPS(CTPU_OP_SLICE) },
    { "slice inner", f_slice3, 1, { SP(D_ANY, 2, 2, 6) }, OPS(CTPU_OP_SLICE) },
    { "concat", f_concat, 2, { SP(D_ANY, 2, 2), SP(D_ANY, 2, 3) }, OPS(CTPU_OP_CONCAT) },
    { "concat 0-size", f_concat, 2, { SP(D_ANY, 2, 0), SP(D_ANY, 2, 3) }, OPS(CTPU_OP_CONCAT) },
    { "expand", f_expand, 1, { SP(D_ANY, 3, 1) }, OPS(CTPU_OP_EXPAND) },
    { "embedding", f_embedding, 2, { SP(D_ANY, 4, 3), { .nd = 2, .s = { 2, 3 }, .dom = D_IDX, .irange = 4 } },
      OPS(CTPU_OP_EMBEDDING) },
    { "gather", f_gather, 2, { SP(D_ANY, 3, 4), { .nd = 2, .s = { 3, 5 }, .dom = D_IDX, .irange = 4 } },
      OPS(CTPU_OP_GATHER) },
    { "gather dim0", f_gather0, 2, { SP(D_ANY, 3, 2), { .nd = 2, .s = { 4, 2 }, .dom = D_IDX, .irange = 3 } },
      OPS(CTPU_OP_GATHER) },
    { "matmul", f_matmul, 2, { SP(D_ANY, 2, 3), SP(D_ANY, 3, 4) }, OPS(CTPU_OP_MATMUL) },
    { "matmul batched bcast", f_matmul, 2, { SP(D_ANY, 2, 1, 3, 4), SP(D_ANY, 3, 4, 2) }, OPS(CTPU_OP_MATMUL) },
    { "matmul vec-mat", f_matmul, 2, { SP(D_ANY, 4), SP(D_ANY, 4, 3) }, OPS(CTPU_OP_MATMUL) },
    { "matmul mat-vec", f_matmul, 2, { SP(D_ANY, 2, 4), SP(D_ANY, 4) }, OPS(CTPU_OP_MATMUL) },
    { "matmul 0-size K", f_matmul, 2, { SP(D_ANY, 2, 0), SP(D_ANY, 0, 3) }, OPS(CTPU_OP_MATMUL) },
    { "matmul_t a", f_mm_tn, 2, { SP(D_ANY, 2, 3, 2), SP(D_ANY, 3, 4) }, OPS(CTPU_OP_MATMUL) },
    { "matmul_t b", f_mm_nt, 2, { SP(D_ANY, 2, 3), SP(D_ANY, 2, 4, 3) }, OPS(CTPU_OP_MATMUL) },
    { "matmul_t ab", f_mm_tt, 2, { SP(D_ANY, 3, 2), SP(D_ANY, 4, 3) }, OPS(CTPU_OP_MATMUL) },
    { "prod dim", f_prod_d, 1, { SP(D_AWAY, 3, 4) }, OPS(CTPU_OP_PROD) },
    { "prod all", f_prod_all, 1, { SP(D_AWAY, 2, 3) }, OPS(CTPU_OP_PROD) },
    { "prod zeros", f_prod_zeros, 1, { SP(D_AWAY, 3, 3) }, OPS(CTPU_OP_PROD) },
    { "cumsum dim0", f_cumsum0, 1, { SP(D_ANY, 4, 3) }, OPS(CTPU_OP_CUMSUM) },
    { "cumsum last", f_cumsum1, 1, { SP(D_ANY, 2, 3, 5) }, OPS(CTPU_OP_CUMSUM) },
    { "cumsum 0-d", f_cumsum0, 1, { S0(D_ANY) }, OPS(CTPU_OP_CUMSUM) },
    { "scatter_add", f_scatter, 3, { SP(D_ANY, 3, 4), SP(D_ANY, 3, 5), { .nd = 2, .s = { 2, 4 }, .dom = D_IDX, .irange = 3 } },
      OPS(CTPU_OP_SCATTER_ADD) },
    { "logsumexp", f_lse, 1, { SP(D_ANY, 3, 5) }, OPS(CTPU_OP_EXP) },
    { "logsumexp all", f_lse_all, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_EXP) },
    { "index_add", f_index_add, 3, { SP(D_ANY, 2, 4), SP(D_ANY, 2, 5), { .nd = 1, .s = { 5 }, .dom = D_IDX, .irange = 4 } },
      OPS(CTPU_OP_SCATTER_ADD) },
    { "silu", f_silu, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_SIGMOID) },
    { "layer_norm", f_layer_norm, 3, { SP(D_ANY, 3, 5), SP(D_ANY, 5), SP(D_ANY, 5) }, OPS(CTPU_OP_VAR) },
    { "rms_norm", f_rms_norm, 2, { SP(D_AWAY, 2, 6), SP(D_ANY, 6) }, OPS(CTPU_OP_RSQRT) },
    { "stack", f_stack, 2, { SP(D_ANY, 2, 3), SP(D_ANY, 2, 3) }, OPS(CTPU_OP_CONCAT) },
    { "squeeze unsqueeze flatten", f_squeeze, 1, { SP(D_ANY, 2, 3) }, OPS(CTPU_OP_RESHAPE) },
    { "tril", f_tril, 1, { SP(D_ANY, 2, 3, 4) }, OPS(CTPU_OP_WHERE) },
    { "triu", f_triu, 1, { SP(D_ANY, 4, 3) }, OPS(CTPU_OP_WHERE) },
    { "index_select", f_index_select, 2, { SP(D_ANY, 4, 3), { .nd = 1, .s = { 5 }, .dom = D_IDX, .irange = 4 } },
      OPS(CTPU_OP_GATHER) },
    { "nll_loss", f_nll, 2, { SP(D_ANY, 4, 3), { .nd = 1, .s = { 4 }, .dom = D_IDX, .irange = 3 } }, OPS(CTPU_OP_GATHER) },
    { "nll_loss sum ignore", f_nll_sum, 2, { SP(D_ANY, 5, 4), { .nd = 1, .s = { 5 }, .dom = D_IDX, .irange = 4 } },
      OPS(CTPU_OP_GATHER) },
    { "bce_with_logits", f_bce, 2, { SP(D_ANY, 3, 4), SP(D_POS, 3, 4) }, OPS(CTPU_OP_SOFTPLUS) },
    { "l1_loss", f_l1, 2, { SP(D_Q1, 3, 4), SP(D_Q2, 3, 4) }, OPS(CTPU_OP_ABS) },
    { "smooth_l1_loss", f_smooth_l1, 2, { SP(D_Q1, 3, 4), SP(D_Q2, 3, 4) }, OPS(CTPU_OP_ABS) },
    { "mse_loss", f_mse, 2, { SP(D_ANY, 3, 4), SP(D_ANY, 3, 4) }, OPS(CTPU_OP_MUL) },
    { "cross_entropy", f_ce, 2, { SP(D_ANY, 4, 5), { .nd = 1, .s = { 4 }, .dom = D_IDX, .irange = 5 } },
      OPS(CTPU_OP_LOG_SOFTMAX) },
    { "sdpa causal", f_sdpa, 3, { SP(D_ANY, 1, 2, 5, 4), SP(D_ANY, 1, 2, 6, 4), SP(D_ANY, 1, 2, 6, 4) },
      OPS(CTPU_OP_SDPA) },
    { "sdpa keep01", f_sdpa_mask, 3, { SP(D_ANY, 2, 1, 5, 3), SP(D_ANY, 2, 1, 6, 3), SP(D_ANY, 2, 1, 6, 3) },
      OPS(CTPU_OP_SDPA) },
    { "chain", f_chain, 3, { SP(D_ANY, 3, 4), SP(D_ANY, 5, 4), SP(D_ANY, 5) }, OPS(CTPU_OP_MATMUL) },
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

static void setup(void)
{
    t_setup();
    ctpu_set_matmul_precision(CTPU_PRECISION_HIGHEST);
}

START_TEST(t_gradcheck)
{
    const gc_case *c = &cases[_i];
    gradcheck(c->name, c->f, c->n_in, c->in);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
}
END_TEST

/* Gradients are bit-identical in strict eager, debug eager and defer and
 * fuse (CONTRACTS.md "Modes and parity"), for every case above. */
/* tanh(3 y) + 0.5: a non-uniform upstream gradient that needs no host data */
static ctpu_tensor upstream_of(ctpu_tensor y)
{
    return ctpu_add_scalar(ctpu_tanh(ctpu_mul_scalar(ctpu_detach(y), 3.0)), 0.5);
}

static void grads_in_mode(const gc_case *c, ctpu_mode m, float **out, int64_t *n)
{
    ck_assert_int_eq(ctpu_set_mode(m), CTPU_OK);
    rs = 0x243f6a8885a308d3ull ^ (uint64_t)(c - cases);
    double *x[4];
    for (int i = 0; i < c->n_in; i++) {
        n[i] = numel_of(&c->in[i]);
        x[i] = malloc((size_t)(n[i] ? n[i] : 1) * sizeof(double));
        fill(x[i], n[i], &c->in[i]);
    }
    ctpu_step_begin();
    ctpu_tensor t[4];
    for (int i = 0; i < c->n_in; i++) {
        t[i] = mk(&c->in[i], x[i]);
        if (c->in[i].dom != D_IDX) ctpu_set_requires_grad(t[i], true);
    }
    ctpu_tensor y = c->f(t);
    ctpu_tensor loss = ctpu_sum(ctpu_mul(y, upstream_of(y)), 0, NULL, false);
    ck_assert_msg(ctpu_backward(loss) == CTPU_OK, "%s: %s", c->name, ctpu_last_error());
    for (int i = 0; i < c->n_in; i++) {
        out[i] = calloc((size_t)(n[i] ? n[i] : 1), 4);
        ctpu_tensor g = ctpu_grad(t[i]);
        if (c->in[i].dom != D_IDX && !ctpu_is_null(g))
            ck_assert_int_eq(ctpu_to_host(g, out[i], (size_t)n[i] * 4), CTPU_OK);
        free(x[i]);
    }
    ctpu_step_end();
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
}

START_TEST(t_modes_parity)
{
    const gc_case *c = &cases[_i];
    float *gs[4], *gd[4], *gf[4];
    int64_t n[4];
    grads_in_mode(c, CTPU_MODE_STRICT, gs, n);
    grads_in_mode(c, CTPU_MODE_DEBUG, gd, n);
    grads_in_mode(c, CTPU_MODE_DEFER_FUSE, gf, n);
    for (int i = 0; i < c->n_in; i++) {
        for (int64_t j = 0; j < n[i]; j++) {
            ck_assert_msg(t_same(gs[i][j], gd[i][j]), "%s: input %d [%lld]: strict %a, debug %a", c->name, i,
                          (long long)j, gs[i][j], gd[i][j]);
            ck_assert_msg(t_same(gs[i][j], gf[i][j]), "%s: input %d [%lld]: strict %a, defer and fuse %a", c->name,
                          i, (long long)j, gs[i][j], gf[i][j]);
        }
        free(gs[i]); free(gd[i]); free(gf[i]);
    }
}
END_TEST

/* Every op has an autograd entry, and every op with a rule is checked. */
START_TEST(t_table_complete)
{
    for (int op = 0; op < CTPU_OP_COUNT; op++) {
        int k = ctpu__ag_rule_kind(op);
        ck_assert_msg(k != 0, "op %s has no autograd entry (a rule or NOGRAD in autograd.c)", ctpu_op_name(op));
        if (k != 1) continue;
        bool covered = false;
        for (int i = 0; i < N_CASES && !covered; i++)
            for (int j = 0; j < 4 && !covered; j++) covered = cases[i].ops[j] == op && (j == 0 || op != 0);
        ck_assert_msg(covered, "op %s has a backward rule but no gradient check in test_autograd.c",
                      ctpu_op_name(op));
    }
}
END_TEST

/* ------------------------------------------------------------ semantics */
static ctpu_tensor vec(const float *v, int64_t n)
{
    return ctpu_from_host(v, CTPU_F32, 1, &n);
}

static void readt(ctpu_tensor t, float *out, int64_t n)
{
    ck_assert_msg(!ctpu_is_null(t), "null tensor: %s", ctpu_last_error());
    ck_assert_int_eq(ctpu_numel(t), n);
    ck_assert_int_eq(ctpu_to_host(t, out, (size_t)n * 4), CTPU_OK);
}

START_TEST(t_accumulate_zero_grad)
{
    float wv[3] = { 1, 2, 3 }, g[3];
    ctpu_tensor w = vec(wv, 3);
    ck_assert_int_eq(ctpu_set_requires_grad(w, true), CTPU_OK);
    ck_assert(ctpu_requires_grad(w));
    ck_assert(ctpu_is_null(ctpu_grad(w)));
    for (int it = 0; it < 2; it++) {
        ctpu_step_begin();
        ctpu_tensor l = ctpu_sum(ctpu_mul(w, w), 0, NULL, false);   /* dl/dw = 2w */
        ck_assert(ctpu_requires_grad(l));
        ck_assert_int_eq(ctpu_backward(l), CTPU_OK);
        ctpu_step_end();
    }
    ctpu_tensor gh = ctpu_grad(w);
    readt(gh, g, 3);
    for (int i = 0; i < 3; i++) ck_assert_float_eq(g[i], 4 * wv[i]);
    /* the .grad handle stays the same across accumulation */
    ctpu_step_begin();
    ck_assert_int_eq(ctpu_backward(ctpu_sum(w, 0, NULL, false)), CTPU_OK);
    ctpu_step_end();
    ck_assert_uint_eq(ctpu_grad(w).id, gh.id);
    readt(gh, g, 3);
    for (int i = 0; i < 3; i++) ck_assert_float_eq(g[i], 4 * wv[i] + 1);
    ck_assert_int_eq(ctpu_zero_grad(w), CTPU_OK);
    ck_assert(ctpu_is_null(ctpu_grad(w)));
    ck_assert(!ctpu_is_valid(gh));
    ctpu_step_begin();
    ck_assert_int_eq(ctpu_backward(ctpu_sum(w, 0, NULL, false)), CTPU_OK);
    ctpu_step_end();
    readt(ctpu_grad(w), g, 3);
    for (int i = 0; i < 3; i++) ck_assert_float_eq(g[i], 1);
    /* turning requires_grad off drops the grad */
    ck_assert_int_eq(ctpu_set_requires_grad(w, false), CTPU_OK);
    ck_assert(!ctpu_requires_grad(w));
    ck_assert(ctpu_is_null(ctpu_grad(w)));
}
END_TEST

START_TEST(t_retain_and_released_tape)
{
    float wv[2] = { 3, -1 }, g[2];
    ctpu_tensor w = vec(wv, 2);
    ctpu_set_requires_grad(w, true);
    ctpu_scope_begin();
    ctpu_tensor l = ctpu_sum(ctpu_exp(w), 0, NULL, false);
    ck_assert_int_eq(ctpu_backward_ex(l, CTPU_NULL, true), CTPU_OK);
    ck_assert_int_eq(ctpu_backward(l), CTPU_OK);
    readt(ctpu_grad(w), g, 2);
    for (int i = 0; i < 2; i++) ck_assert_float_eq_tol(g[i], 2 * expf(wv[i]), 1e-5 * expf(wv[i]));
    ck_assert_int_eq(ctpu_backward(l), CTPU_ERR_STATE);
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "retain"));
    ctpu_scope_end();
}
END_TEST

START_TEST(t_tape_survives_released_intermediates)
{
    float xv[4] = { 0.5f, -1, 2, 0.25f }, g[4];
    ctpu_tensor x = vec(xv, 4);
    ctpu_set_requires_grad(x, true);
    ctpu_tensor loss;
    ctpu_scope_begin();
    ctpu_scope_begin();
    ctpu_tensor a = ctpu_tanh(x);
    ctpu_tensor b = ctpu_mul(a, x);
    loss = ctpu_keep(ctpu_sum(b, 0, NULL, false));
    ctpu_scope_end();   /* a and b are released */
    ck_assert(!ctpu_is_valid(a));
    ck_assert_int_eq(ctpu_backward(loss), CTPU_OK);
    readt(ctpu_grad(x), g, 4);
    for (int i = 0; i < 4; i++) {
        double t = tanh(xv[i]), want = t + xv[i] * (1 - t * t);
        ck_assert_float_eq_tol(g[i], want, 1e-5);
    }
    ctpu_scope_end();
}
END_TEST

START_TEST(t_no_grad_detach)
{
    float xv[2] = { 1, 2 };
    ctpu_tensor x = vec(xv, 2);
    ctpu_set_requires_grad(x, true);
    ck_assert(ctpu_grad_enabled());
    ck_assert_int_eq(ctpu_no_grad_begin(), CTPU_OK);
    ck_assert(!ctpu_grad_enabled());
    ctpu_tensor y = ctpu_mul(x, x);
    ck_assert_int_eq(ctpu_no_grad_end(), CTPU_OK);
    ck_assert(!ctpu_requires_grad(y));
    ck_assert_int_eq(ctpu_backward(ctpu_sum(y, 0, NULL, false)), CTPU_ERR_STATE);
    ck_assert_int_eq(ctpu_no_grad_end(), CTPU_ERR_STATE);
    ctpu_tensor d = ctpu_detach(x);
    ck_assert(!ctpu_requires_grad(d));
    /* d * x: only the x path carries gradient: dl/dx = d = x */
    ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(d, x), 0, NULL, false)), CTPU_OK);
    float g[2];
    readt(ctpu_grad(x), g, 2);
    ck_assert_float_eq(g[0], 1);
    ck_assert_float_eq(g[1], 2);
    /* a non-leaf cannot drop requires_grad */
    ctpu_tensor z = ctpu_exp(x);
    ck_assert_int_eq(ctpu_set_requires_grad(z, false), CTPU_ERR_STATE);
}
END_TEST

START_TEST(t_errors)
{
    float v[3] = { 1, 2, 3 };
    int32_t iv[2] = { 0, 1 };
    int64_t two = 2;
    ctpu_tensor x = vec(v, 3);
    ctpu_tensor ix = ctpu_from_host(iv, CTPU_I32, 1, &two);
    ck_assert_int_eq(ctpu_set_requires_grad(ix, true), CTPU_ERR_DTYPE);
    ck_assert_int_eq(ctpu_set_requires_grad(CTPU_NULL, true), CTPU_ERR_NULL_HANDLE);
    ck_assert_int_eq(ctpu_backward(x), CTPU_ERR_STATE);   /* does not require grad */
    ctpu_set_requires_grad(x, true);
    ctpu_tensor y = ctpu_exp(x);
    ck_assert_int_eq(ctpu_backward(y), CTPU_ERR_SHAPE);   /* not a scalar */
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "f32[3]"));
    ck_assert_int_eq(ctpu_backward_ex(y, ix, false), CTPU_ERR_SHAPE);
    ctpu_tensor g3 = ctpu_ones(CTPU_F32, 1, (int64_t[]){ 3 });
    ck_assert_int_eq(ctpu_backward_ex(y, g3, false), CTPU_OK);
    float g[3];
    readt(ctpu_grad(x), g, 3);
    for (int i = 0; i < 3; i++) ck_assert_float_eq_tol(g[i], expf(v[i]), 1e-5 * expf(v[i]));
    ck_assert(ctpu_is_null(ctpu_grad(CTPU_NULL)));
    ck_assert(!ctpu_requires_grad(CTPU_NULL));
    ck_assert(ctpu_is_null(ctpu_matmul_t(x, x, true, false)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
    ctpu_tensor m23 = ctpu_ones(CTPU_F32, 2, (int64_t[]){ 2, 3 });
    ck_assert(ctpu_is_null(ctpu_matmul_t(m23, m23, false, false)));
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "inner dims"));
    ctpu_tensor r = ctpu_matmul_t(m23, m23, false, true);
    ck_assert_int_eq(ctpu_dim(r, 0), 2);
    ck_assert_int_eq(ctpu_dim(r, 1), 2);
}
END_TEST

/* A leaf in bf16 gets a bf16 grad; a cast between dtypes passes the gradient. */
START_TEST(t_bf16_cast)
{
    float v[4] = { 1, 2, 3, 4 };
    ctpu_tensor x = ctpu_cast(vec(v, 4), CTPU_BF16);
    ctpu_set_requires_grad(x, true);
    ctpu_tensor y = ctpu_cast(x, CTPU_F32);
    ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul_scalar(y, 3.0), 0, NULL, false)), CTPU_OK);
    ctpu_tensor g = ctpu_grad(x);
    ck_assert_int_eq(ctpu_dtype_of(g), CTPU_BF16);
    float gf[4];
    readt(ctpu_cast(g, CTPU_F32), gf, 4);
    for (int i = 0; i < 4; i++) ck_assert_float_eq(gf[i], 3);
}
END_TEST

/* max ties share the gradient, as PyTorch's amax */
START_TEST(t_max_ties)
{
    float v[4] = { 2, 5, 5, 1 }, g[4];
    ctpu_tensor x = vec(v, 4);
    ctpu_set_requires_grad(x, true);
    ck_assert_int_eq(ctpu_backward(ctpu_max(x, 0, NULL, false)), CTPU_OK);
    readt(ctpu_grad(x), g, 4);
    ck_assert_float_eq(g[0], 0);
    ck_assert_float_eq(g[1], 0.5f);
    ck_assert_float_eq(g[2], 0.5f);
    ck_assert_float_eq(g[3], 0);
}
END_TEST

/* softplus' gradient follows torch's threshold: exactly g above 20 (and the
 * output is x there), g * sigmoid(x) at and below it. */
START_TEST(t_softplus_threshold)
{
    float v[5] = { 25, 20, 0, -30, 1e30f }, g[5], y[5];
    ctpu_tensor x = vec(v, 5);
    ctpu_set_requires_grad(x, true);
    ctpu_tensor s = ctpu_softplus(x);
    readt(s, y, 5);
    ck_assert_float_eq(y[0], 25.0f);
    ck_assert_float_eq(y[4], 1e30f);
    ck_assert_int_eq(ctpu_backward(ctpu_sum(s, 0, NULL, false)), CTPU_OK);
    readt(ctpu_grad(x), g, 5);
    float sg[5];
    readt(ctpu_sigmoid(x), sg, 5);
    ck_assert_float_eq(g[0], 1.0f);
    ck_assert_float_eq(g[4], 1.0f);
    ck_assert_float_eq(g[1], sg[1]);   /* 20 is not above the threshold */
    ck_assert_float_eq(g[2], 0.5f);
    ck_assert_float_eq(g[3], sg[3]);
}
END_TEST

/* exact GELU's gradient Φ(x) + x φ(x), Φ taken from the forward's result
 * (gelu(x) / x, 0.5 where |x| < 1e-30): within 2e-6 of the float64 value
 * from x = -5 to 7, the tail included (Φ as (1 + erf(x / sqrt 2)) / 2 was
 * 4e-3 off at -5: 1 + erf cancels), exactly 0.5 at 0, at a subnormal and
 * at 1e-31, and in debug eager too (no NaN made at 0: debug checks would
 * report it). */
START_TEST(t_gelu_erf_grad)
{
    float v[12] = { -5, -4, -3, -1.5f, -0.25f, -1e-31f, 0, 1e-40f, 1e-30f, 0.75f, 2.5f, 7 }, g[12];
    for (int mode = 0; mode < 3; mode++) {
        ctpu_set_mode(mode == 0 ? CTPU_MODE_STRICT : mode == 1 ? CTPU_MODE_DEBUG : CTPU_MODE_DEFER_FUSE);
        ctpu_tensor x = vec(v, 12);
        ctpu_set_requires_grad(x, true);
        ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_gelu(x, false), 0, NULL, false)), CTPU_OK);
        readt(ctpu_grad(x), g, 12);
        for (int i = 0; i < 12; i++) {
            double xd = v[i], ref = 0.5 * erfc(-xd / sqrt(2.0)) + xd * exp(-0.5 * xd * xd) / sqrt(2.0 * M_PI);
            if (fabs(xd) < 1e-30) ck_assert_msg(g[i] == 0.5f, "gelu'(%g) = %.9g, not 0.5 (mode %d)", xd, g[i], mode);
            else ck_assert_msg(fabs(g[i] - ref) <= 2e-6 * fabs(ref), "gelu'(%g) = %.9g, float64 %.9g (mode %d)", xd, g[i], ref, mode);
        }
        ctpu_release(x);
    }
    ctpu_set_mode(CTPU_MODE_STRICT);
}
END_TEST

/* embedding backward adds repeated indices (in input order) */
START_TEST(t_embedding_repeats)
{
    float w[6] = { 0 }, g[6];
    int32_t ix[5] = { 1, 0, 1, 1, 2 };
    ctpu_tensor W = ctpu_from_host(w, CTPU_F32, 2, (int64_t[]){ 3, 2 });
    ctpu_tensor I = ctpu_from_host(ix, CTPU_I32, 1, (int64_t[]){ 5 });
    ctpu_set_requires_grad(W, true);
    ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_embedding(W, I), 0, NULL, false)), CTPU_OK);
    readt(ctpu_grad(W), g, 6);
    float want[6] = { 1, 1, 3, 3, 1, 1 };
    for (int i = 0; i < 6; i++) ck_assert_float_eq(g[i], want[i]);
}
END_TEST

/* An N-d @ 2-d product's weight gradient folds the batch into the rows, as
 * torch's matmul: W.grad is the one product x_flat^T @ g_flat (contraction
 * over batch x M, the MXU's one K order), bit for bit, in every mode; for b
 * given transposed (x @ W^T, nn.Linear's layout) g_flat^T @ x_flat; for a
 * non-contiguous x (a transposed view) and a 4-d x too. Before, it was a
 * batched product and a sum over the batch (other bits, and 32 products
 * plus a reduction in char_gpt's step). */
START_TEST(t_batched_weight_grad_folds)
{
    enum { NC = 4 };
    static const int64_t xs[NC][4] = { { 3, 5, 7 }, { 3, 5, 7 }, { 3, 7, 5 }, { 2, 3, 5, 7 } };
    static const int xnd[NC] = { 3, 3, 3, 4 };
    float got[3][28], want[28], xv[210], rv[120];
    for (int c = 0; c < NC; c++) {
        bool tb = c == 1, tview = c == 2;
        int64_t xn = 1, rows;
        for (int d = 0; d < xnd[c]; d++) xn *= xs[c][d];
        rows = xn / 7;
        for (int64_t i = 0; i < xn; i++) xv[i] = (float)(urand() * 2 - 1);
        for (int64_t i = 0; i < rows * 4; i++) rv[i] = (float)(urand() * 2 - 1);
        float wv[28];
        for (int i = 0; i < 28; i++) wv[i] = (float)(urand() * 2 - 1);
        for (int mode = 0; mode < 3; mode++) {
            ctpu_set_mode(mode == 0 ? CTPU_MODE_STRICT : mode == 1 ? CTPU_MODE_DEBUG : CTPU_MODE_DEFER_FUSE);
            ctpu_tensor x = ctpu_from_host(xv, CTPU_F32, xnd[c], xs[c]);
            if (tview) x = ctpu_transpose(x, 1, 2);   /* [3, 5, 7], not contiguous */
            int64_t ws[2] = { tb ? 4 : 7, tb ? 7 : 4 }, rs[CTPU_MAX_DIMS];
            int nd = 0;
            ck_assert_int_eq(ctpu_shape(x, rs, &nd), CTPU_OK);
            rs[nd - 1] = 4;
            ctpu_tensor w = ctpu_from_host(wv, CTPU_F32, 2, ws), r = ctpu_from_host(rv, CTPU_F32, nd, rs);
            ctpu_set_requires_grad(w, true);
            ctpu_tensor y = ctpu_matmul_t(x, w, false, tb);
            ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(y, r), 0, NULL, false)), CTPU_OK);
            readt(ctpu_grad(w), got[mode], 28);
            if (mode == 0) {
                int64_t fx[2] = { rows, 7 }, fr[2] = { rows, 4 };
                ctpu_tensor xf = ctpu_reshape(x, 2, fx), rf = ctpu_reshape(r, 2, fr);
                readt(tb ? ctpu_matmul_t(rf, xf, true, false) : ctpu_matmul_t(xf, rf, true, false), want, 28);
                ck_assert_msg(memcmp(got[0], want, sizeof want) == 0, "case %d: W.grad is not the folded product", c);
            } else {
                ck_assert_msg(memcmp(got[mode], got[0], sizeof want) == 0, "case %d mode %d differs from strict", c, mode);
            }
            ctpu_release(x);
            ctpu_release(w);
            ctpu_release(r);
        }
    }
    ctpu_set_mode(CTPU_MODE_STRICT);
}
END_TEST

/* A training-like loop leaves no HBM behind: the tape goes with the step. */
START_TEST(t_no_leak)
{
    float wv[6] = { 1, 2, 3, 4, 5, 6 };
    ctpu_tensor w = ctpu_from_host(wv, CTPU_F32, 2, (int64_t[]){ 2, 3 });
    ctpu_set_requires_grad(w, true);
    ctpu_hbm_stats s0, s1;
    ctpu_sync();
    for (int it = 0; it < 3; it++) {
        ctpu_zero_grad(w);
        ctpu_step_begin();
        ctpu_tensor x = ctpu_ones(CTPU_F32, 2, (int64_t[]){ 4, 3 });
        ctpu_tensor l = ctpu_mean(ctpu_relu(ctpu_matmul_t(x, w, false, true)), 0, NULL, false);
        ctpu_tensor kept = ctpu_exp(l);   /* an unused value depending on the tape */
        (void)kept;
        ck_assert_int_eq(ctpu_backward(l), CTPU_OK);
        ctpu_step_end();
        ctpu_sync();
        ctpu_hbm_get_stats(it == 0 ? &s0 : &s1);
    }
    ck_assert_uint_eq(s0.in_use, s1.in_use);
    ctpu_zero_grad(w);
    ctpu_release(w);
    ctpu_sync();
    ctpu_hbm_get_stats(&s1);
    ck_assert_uint_eq(s1.in_use, 0);
}
END_TEST

/* Grad-ready hooks (ctpu_register_post_accumulate_grad_hook, issue 19's
 * overlap): each hooked leaf's hook runs once per backward, in the order
 * its last contribution arrives (reverse of the forward), seeing the final
 * .grad (a leaf used twice: after both contributions), and the gradients
 * are the bits of a backward without hooks, in strict and defer and fuse;
 * a second backward accumulates and calls the hooks again. */
enum { HK_N = 3, HK_D = 8 };
typedef struct { int order[16], n; float seen[HK_N][HK_D * HK_D]; ctpu_tensor leaf[HK_N]; } hook_log;

static void hk(ctpu_tensor leaf, void *ctx)
{
    hook_log *lg = ctx;
    int i = 0;
    while (i < HK_N && lg->leaf[i].id != leaf.id) i++;
    ck_assert(i < HK_N && lg->n < 16);
    lg->order[lg->n++] = i;
    ck_assert(!ctpu_grad_enabled());
    int64_t n = ctpu_numel(ctpu_grad(leaf));
    ck_assert_int_eq(ctpu_to_host(ctpu_grad(leaf), lg->seen[i], (size_t)n * 4), CTPU_OK);
}

static void hk_run(ctpu_mode mode, bool hooks, int backwards, float out[HK_N][HK_D * HK_D], hook_log *lg)
{
    ck_assert_int_eq(ctpu_set_mode(mode), CTPU_OK);
    float x0[HK_D * HK_D], v[HK_N][HK_D * HK_D];
    for (int i = 0; i < HK_D * HK_D; i++) {
        x0[i] = sinf((float)i * 0.7f);
        for (int k = 0; k < HK_N; k++) v[k][i] = cosf((float)(i * (k + 2)) * 0.31f) * 0.5f;
    }
    int64_t sq[2] = { HK_D, HK_D };
    ctpu_tensor w[HK_N];
    for (int k = 0; k < HK_N; k++) {
        w[k] = ctpu_from_host(v[k], CTPU_F32, 2, sq);
        ck_assert_int_eq(ctpu_set_requires_grad(w[k], true), CTPU_OK);
        lg->leaf[k] = w[k];
        if (hooks) ck_assert_int_eq(ctpu_register_post_accumulate_grad_hook(w[k], hk, lg), CTPU_OK);
    }
    for (int b = 0; b < backwards; b++) {
        ctpu_step_begin();
        /* w[2] scales the input and the output: two contributions, the last near the input */
        ctpu_tensor x = ctpu_mul(ctpu_from_host(x0, CTPU_F32, 2, sq), w[2]);
        ctpu_tensor h = ctpu_tanh(ctpu_matmul(ctpu_relu(ctpu_matmul(x, w[0])), w[1]));
        ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(h, w[2]), 0, NULL, false)), CTPU_OK);
        ctpu_step_end();
    }
    for (int k = 0; k < HK_N; k++) {
        ck_assert_int_eq(ctpu_to_host(ctpu_grad(w[k]), out[k], sizeof out[k]), CTPU_OK);
        ck_assert_int_eq(ctpu_register_post_accumulate_grad_hook(w[k], NULL, NULL), CTPU_OK);
        ctpu_release(w[k]);
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
}

START_TEST(t_grad_ready_hook)
{
    static float ref[HK_N][HK_D * HK_D], got[HK_N][HK_D * HK_D];
    const ctpu_mode modes[2] = { CTPU_MODE_STRICT, CTPU_MODE_DEFER_FUSE };
    for (int backwards = 1; backwards <= 2; backwards++) {
        hook_log none = { .n = 0 };
        hk_run(CTPU_MODE_STRICT, false, backwards, ref, &none);
        ck_assert_int_eq(none.n, 0);
        for (int m = 0; m < 2; m++) {
            hook_log lg = { .n = 0 };
            hk_run(modes[m], true, backwards, got, &lg);
            ck_assert_int_eq(lg.n, HK_N * backwards);
            for (int b = 0; b < backwards; b++) {   /* reverse of the forward: w1, w0, then w2 (used first) */
                ck_assert_int_eq(lg.order[b * HK_N + 0], 1);
                ck_assert_int_eq(lg.order[b * HK_N + 1], 0);
                ck_assert_int_eq(lg.order[b * HK_N + 2], 2);
            }
            ck_assert(memcmp(got, ref, sizeof got) == 0);            /* the bits of a backward without hooks */
            ck_assert(memcmp(lg.seen, got, sizeof got) == 0);        /* the hook saw the final .grad */
        }
    }
    /* not a leaf */
    float one = 1;
    ctpu_tensor a = vec(&one, 1);
    ck_assert_int_eq(ctpu_register_post_accumulate_grad_hook(a, hk, NULL), CTPU_ERR_STATE);
    ctpu_release(a);
}
END_TEST

/* ------------------------------------------------------------ assign and autograd
 * ctpu_assign(dst, src) against torch's dst.copy_(src) (CONTRACTS.md
 * "Scopes, autograd, optimizers"), in strict, debug and defer and fuse,
 * with bit-identical values and gradients in the three:
 * a) a non-leaf dst with grad mode on is rebased: the gradient goes to src,
 *    dst's old history gets zeros through it (torch's CopyBackwards; it
 *    used to keep its old grad_fn and send the gradient there);
 * b) a dst that did not require grad takes src's history;
 * c) a leaf that requires grad is refused with grad mode on (CTPU_ERR_STATE,
 *    nothing changed), allowed under no_grad (it stays a leaf; a non-leaf
 *    keeps its history, as torch's in-place write under no_grad);
 * d) a value a tape node saved (an input, an output, a view of dst) keeps
 *    the value it had: backward reads the old value, never the assigned
 *    one (copy-on-write: the saved handle shares the storage, so assign
 *    gives dst a new buffer), and a view of dst keeps its value. */
#define AS_N 4
typedef struct { float v[64][AS_N]; int n; } as_log;

static const float as_x[AS_N] = { 0.5f, -1.25f, 2.0f, 0.75f };
static const float as_w[AS_N] = { 0.3f, -0.7f, 1.1f, 0.2f };
static const float as_c[AS_N] = { 1.0f, -2.0f, 0.5f, 3.0f };
static const float as_k[AS_N] = { 4.0f, 5.5f, -6.0f, 7.25f };

static float *as_put(as_log *lg, ctpu_tensor t)
{
    ck_assert_int_lt(lg->n, 64);
    float *o = lg->v[lg->n++];
    readt(t, o, AS_N);
    return o;
}

static ctpu_tensor as_leaf(const float *v)
{
    ctpu_tensor t = vec(v, AS_N);
    ck_assert_int_eq(ctpu_set_requires_grad(t, true), CTPU_OK);
    return t;
}

static ctpu_tensor as_dot_c(ctpu_tensor y)   /* sum(y * c) */
{
    return ctpu_sum(ctpu_mul(ctpu_reshape(y, 1, (int64_t[]){ AS_N }), vec(as_c, AS_N)), 0, NULL, false);
}

static void as_want(const float *got, const float *want, const char *what, int mode)
{
    for (int i = 0; i < AS_N; i++)
        ck_assert_msg(t_same(got[i], want[i]), "%s[%d] = %.9g, want %.9g (mode %d)", what, i, got[i], want[i], mode);
}

/* a) and b) */
static void as_rebase(as_log *lg, int mode)
{
    float z[AS_N] = { 0 }, want[AS_N], *ev, *g;
    ctpu_tensor x = as_leaf(as_x), w = as_leaf(as_w);
    ctpu_tensor y = ctpu_mul_scalar(x, 3.0);               /* a non-leaf, history -> x */
    ctpu_tensor s = ctpu_exp(w);
    ck_assert_int_eq(ctpu_assign(y, s), CTPU_OK);
    ck_assert(ctpu_requires_grad(y));
    ck_assert_int_eq(ctpu_backward(as_dot_c(y)), CTPU_OK);
    ev = as_put(lg, y);
    as_want(ev, as_put(lg, s), "a: y", mode);
    as_want(as_put(lg, ctpu_grad(x)), z, "a: x.grad (old history: zeros)", mode);
    for (int i = 0; i < AS_N; i++) want[i] = as_c[i] * ev[i];
    as_want(as_put(lg, ctpu_grad(w)), want, "a: w.grad", mode);
    /* a) src a leaf */
    ctpu_tensor x2 = as_leaf(as_x), w2 = as_leaf(as_w), y2 = ctpu_mul_scalar(x2, 2.0);
    ck_assert_int_eq(ctpu_assign(y2, w2), CTPU_OK);
    ck_assert_int_eq(ctpu_backward(as_dot_c(y2)), CTPU_OK);
    as_want(as_put(lg, ctpu_grad(w2)), as_c, "a: leaf src grad", mode);
    as_want(as_put(lg, ctpu_grad(x2)), z, "a: x2.grad", mode);
    /* b) dst did not require grad: it takes src's history (no longer a leaf) */
    ctpu_tensor w3 = as_leaf(as_w), d = ctpu_zeros(CTPU_F32, 1, (int64_t[]){ AS_N });
    ck_assert(!ctpu_requires_grad(d));
    ck_assert_int_eq(ctpu_assign(d, ctpu_exp(w3)), CTPU_OK);
    ck_assert(ctpu_requires_grad(d));
    ck_assert_int_eq(ctpu_set_requires_grad(d, false), CTPU_ERR_STATE);
    ck_assert_int_eq(ctpu_backward(as_dot_c(d)), CTPU_OK);
    g = as_put(lg, ctpu_grad(w3));
    as_want(g, want, "b: w3.grad", mode);
    /* b) under no_grad nothing is recorded */
    ctpu_tensor d2 = ctpu_zeros(CTPU_F32, 1, (int64_t[]){ AS_N });
    ck_assert_int_eq(ctpu_no_grad_begin(), CTPU_OK);
    ck_assert_int_eq(ctpu_assign(d2, ctpu_exp(w3)), CTPU_OK);
    ck_assert_int_eq(ctpu_no_grad_end(), CTPU_OK);
    ck_assert(!ctpu_requires_grad(d2));
    /* a non-leaf dst, src without grad: still requires grad, zeros to its history */
    ctpu_tensor x4 = as_leaf(as_x), y4 = ctpu_mul_scalar(x4, 3.0);
    ck_assert_int_eq(ctpu_assign(y4, vec(as_k, AS_N)), CTPU_OK);
    ck_assert(ctpu_requires_grad(y4));
    ck_assert_int_eq(ctpu_backward(as_dot_c(y4)), CTPU_OK);
    as_want(as_put(lg, ctpu_grad(x4)), z, "a: x4.grad", mode);
    as_want(as_put(lg, y4), as_k, "a: y4", mode);
}

/* c) */
static void as_leaf_refused(as_log *lg, int mode)
{
    float want[AS_N];
    ctpu_tensor p = as_leaf(as_x);
    ck_assert_int_eq(ctpu_assign(p, vec(as_k, AS_N)), CTPU_ERR_STATE);
    ck_assert_msg(strstr(ctpu_last_error(), "assign: dst f32[4] is a leaf that requires grad") != NULL, "%s",
                  ctpu_last_error());
    ck_assert_ptr_null(strchr(ctpu_last_error(), '\n'));
    ck_assert_int_eq(ctpu_set_name(p, "fc1.weight"), CTPU_OK);
    ck_assert_int_eq(ctpu_assign(p, vec(as_k, AS_N)), CTPU_ERR_STATE);
    ck_assert_msg(strstr(ctpu_last_error(), "assign: dst f32[4] (\"fc1.weight\") is a leaf") != NULL, "%s",
                  ctpu_last_error());
    as_want(as_put(lg, p), as_x, "c: p unchanged", mode);
    ck_assert(ctpu_requires_grad(p));
    ck_assert_int_eq(ctpu_no_grad_begin(), CTPU_OK);
    ck_assert_int_eq(ctpu_assign(p, vec(as_k, AS_N)), CTPU_OK);
    ck_assert_int_eq(ctpu_no_grad_end(), CTPU_OK);
    as_want(as_put(lg, p), as_k, "c: p assigned under no_grad", mode);
    ck_assert_int_eq(ctpu_backward(as_dot_c(p)), CTPU_OK);   /* still a leaf: it gets .grad */
    as_want(as_put(lg, ctpu_grad(p)), as_c, "c: p.grad", mode);
    /* a non-leaf under no_grad keeps its history (torch keeps grad_fn) */
    ctpu_tensor x = as_leaf(as_x), y = ctpu_mul_scalar(x, 3.0);
    ck_assert_int_eq(ctpu_no_grad_begin(), CTPU_OK);
    ck_assert_int_eq(ctpu_assign(y, vec(as_k, AS_N)), CTPU_OK);
    ck_assert_int_eq(ctpu_no_grad_end(), CTPU_OK);
    ck_assert_int_eq(ctpu_backward(as_dot_c(y)), CTPU_OK);
    for (int i = 0; i < AS_N; i++) want[i] = as_c[i] * 3.0f;
    as_want(as_put(lg, ctpu_grad(x)), want, "c: history kept under no_grad", mode);
}

/* d) saved values keep the value they had */
static void as_saved(as_log *lg, int mode)
{
    float want[AS_N], *ev;
    /* an input saved (mul saves both), dst rebased with grad mode on */
    ctpu_tensor x = as_leaf(as_x), w = as_leaf(as_w), y = ctpu_mul_scalar(x, 2.0);
    ctpu_tensor zz = ctpu_mul(y, y);
    ck_assert_int_eq(ctpu_assign(y, ctpu_exp(w)), CTPU_OK);
    ck_assert_int_eq(ctpu_backward(ctpu_add(ctpu_sum(zz, 0, NULL, false), as_dot_c(y))), CTPU_OK);
    for (int i = 0; i < AS_N; i++) want[i] = 8.0f * as_x[i];   /* d(2x)^2/dx with the old y, + 0 through y */
    as_want(as_put(lg, ctpu_grad(x)), want, "d: x.grad (saved y)", mode);
    ev = as_put(lg, y);
    for (int i = 0; i < AS_N; i++) want[i] = as_c[i] * ev[i];
    as_want(as_put(lg, ctpu_grad(w)), want, "d: w.grad", mode);
    /* a leaf saved, then assigned under no_grad (an optimizer step before backward) */
    ctpu_tensor p = as_leaf(as_x), pp = ctpu_mul(p, p);
    ctpu_no_grad_begin();
    ck_assert_int_eq(ctpu_assign(p, vec(as_k, AS_N)), CTPU_OK);
    ctpu_no_grad_end();
    ck_assert_int_eq(ctpu_backward(ctpu_sum(pp, 0, NULL, false)), CTPU_OK);
    for (int i = 0; i < AS_N; i++) want[i] = 2.0f * as_x[i];
    as_want(as_put(lg, ctpu_grad(p)), want, "d: p.grad (saved p)", mode);
    as_want(as_put(lg, p), as_k, "d: p", mode);
    /* an output saved (exp saves its result), dst = that output */
    ctpu_tensor x3 = as_leaf(as_x), u = ctpu_exp(x3), t = ctpu_mul_scalar(u, 2.0);
    ck_assert_int_eq(ctpu_assign(u, vec(as_k, AS_N)), CTPU_OK);
    ck_assert_int_eq(ctpu_backward(ctpu_sum(t, 0, NULL, false)), CTPU_OK);
    ctpu_no_grad_begin();
    ev = as_put(lg, ctpu_exp(x3));
    ctpu_no_grad_end();
    for (int i = 0; i < AS_N; i++) want[i] = 2.0f * ev[i];
    as_want(as_put(lg, ctpu_grad(x3)), want, "d: x3.grad (saved exp output)", mode);
    /* a view of dst saved: the view keeps its value, backward reads it */
    ctpu_tensor q = as_leaf(as_x), v = ctpu_reshape(q, 2, (int64_t[]){ 2, 2 }), vv = ctpu_mul(v, v);
    ctpu_no_grad_begin();
    ck_assert_int_eq(ctpu_assign(q, vec(as_k, AS_N)), CTPU_OK);
    ctpu_no_grad_end();
    ck_assert_int_eq(ctpu_backward(ctpu_sum(vv, 0, NULL, false)), CTPU_OK);
    for (int i = 0; i < AS_N; i++) want[i] = 2.0f * as_x[i];
    as_want(as_put(lg, ctpu_grad(q)), want, "d: q.grad (saved view)", mode);
    as_want(as_put(lg, v), as_x, "d: view of q", mode);
    /* assign into a view: only the view is rebased; its base keeps value and history */
    ctpu_tensor x5 = as_leaf(as_x), w5 = as_leaf(as_w), y5 = ctpu_mul_scalar(x5, 3.0);
    ctpu_tensor v5 = ctpu_reshape(y5, 2, (int64_t[]){ 2, 2 });
    ck_assert_int_eq(ctpu_assign(v5, ctpu_reshape(ctpu_exp(w5), 2, (int64_t[]){ 2, 2 })), CTPU_OK);
    ck_assert_int_eq(ctpu_backward(ctpu_add(as_dot_c(y5), as_dot_c(v5))), CTPU_OK);
    for (int i = 0; i < AS_N; i++) want[i] = as_c[i] * 3.0f;
    as_want(as_put(lg, ctpu_grad(x5)), want, "d: base's history", mode);
    for (int i = 0; i < AS_N; i++) want[i] = as_x[i] * 3.0f;
    as_want(as_put(lg, y5), want, "d: base's value", mode);
    ev = as_put(lg, v5);
    for (int i = 0; i < AS_N; i++) want[i] = as_c[i] * ev[i];
    as_want(as_put(lg, ctpu_grad(w5)), want, "d: w5.grad", mode);
    /* nothing saved: written in place, backward unaffected */
    ctpu_tensor r = as_leaf(as_x), r1 = ctpu_add_scalar(r, 1.0);
    ctpu_no_grad_begin();
    ck_assert_int_eq(ctpu_assign(r, vec(as_k, AS_N)), CTPU_OK);
    ctpu_no_grad_end();
    ck_assert_int_eq(ctpu_backward(as_dot_c(r1)), CTPU_OK);
    as_want(as_put(lg, ctpu_grad(r)), as_c, "d: r.grad", mode);
}

/* c) the library's own writes to parameters run under no_grad: an
 * optimizer step and a load into a leaf that requires grad, grad mode on */
static void as_library(as_log *lg, int mode)
{
    ctpu_tensor p = as_leaf(as_x);
    ck_assert_int_eq(ctpu_backward(as_dot_c(p)), CTPU_OK);
    ctpu_sgd_opts so = { 0.5, 0.0, 0.0, 0.0, false };
    ctpu_optim *o = ctpu_sgd_create(1, &p, &so);
    ck_assert_ptr_nonnull(o);
    ctpu_tensor pp = ctpu_mul(p, p);   /* saves p: the step writes p, pp's backward reads the old p */
    ck_assert_msg(ctpu_optim_step(o) == CTPU_OK, "%s", ctpu_last_error());
    ctpu_optim_free(o);
    float want[AS_N];
    for (int i = 0; i < AS_N; i++) want[i] = as_x[i] - 0.5f * as_c[i];
    as_want(as_put(lg, p), want, "c: sgd step", mode);
    ck_assert_int_eq(ctpu_backward(ctpu_sum(pp, 0, NULL, false)), CTPU_OK);
    for (int i = 0; i < AS_N; i++) want[i] = as_c[i] + 2.0f * as_x[i];
    as_want(as_put(lg, ctpu_grad(p)), want, "d: p.grad after a step between forward and backward", mode);
    char path[64];
    snprintf(path, sizeof path, "/tmp/ctpu_assign_%d_%d.safetensors", (int)getpid(), mode);
    const char *nm[1] = { "p" };
    ctpu_tensor k = vec(as_k, AS_N);
    ck_assert_int_eq(ctpu_save(path, 1, nm, &k), CTPU_OK);
    ck_assert_msg(ctpu_load(path, 1, nm, &p) == CTPU_OK, "%s", ctpu_last_error());
    remove(path);
    ck_assert(ctpu_grad_enabled());
    ck_assert(ctpu_requires_grad(p));
    as_want(as_put(lg, p), as_k, "c: load", mode);
}

START_TEST(t_assign_autograd)
{
    static as_log lg[3];
    const ctpu_mode modes[3] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    for (int m = 0; m < 3; m++) {
        ck_assert_int_eq(ctpu_set_mode(modes[m]), CTPU_OK);
        lg[m].n = 0;
        ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
        as_rebase(&lg[m], m);
        as_leaf_refused(&lg[m], m);
        as_saved(&lg[m], m);
        as_library(&lg[m], m);
        ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    for (int m = 1; m < 3; m++) {
        ck_assert_int_eq(lg[m].n, lg[0].n);
        ck_assert_msg(memcmp(lg[m].v, lg[0].v, sizeof(float) * AS_N * (size_t)lg[0].n) == 0,
                      "mode %d differs from strict eager", m);
    }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("autograd");
    TCase *tc = tcase_create("gradcheck");
    tcase_add_checked_fixture(tc, setup, t_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, t_gradcheck, 0, N_CASES);
    tcase_add_test(tc, t_table_complete);
    tcase_add_loop_test(tc, t_modes_parity, 0, N_CASES);
    suite_add_tcase(s, tc);
    TCase *ts = tcase_create("semantics");
    tcase_add_checked_fixture(ts, setup, t_teardown);
    tcase_add_test(ts, t_accumulate_zero_grad);
    tcase_add_test(ts, t_grad_ready_hook);
    tcase_add_test(ts, t_retain_and_released_tape);
    tcase_add_test(ts, t_tape_survives_released_intermediates);
    tcase_add_test(ts, t_no_grad_detach);
    tcase_add_test(ts, t_errors);
    tcase_add_test(ts, t_bf16_cast);
    tcase_add_test(ts, t_max_ties);
    tcase_add_test(ts, t_softplus_threshold);
    tcase_add_test(ts, t_gelu_erf_grad);
    tcase_add_test(ts, t_embedding_repeats);
    tcase_add_test(ts, t_batched_weight_grad_folds);
    tcase_add_test(ts, t_no_leak);
    tcase_add_test(ts, t_assign_autograd);
    suite_add_tcase(s, ts);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
