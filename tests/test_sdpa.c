/* scaled_dot_product_attention (issue 13): the blockwise kernel against a
 * float64 reference and against the unfused composition (matmul -> mask ->
 * softmax -> dropout -> matmul), its gradient, mode / ISA / thread parity,
 * the kernel against its scalar reference, fully masked rows, bad input.
 *
 * The bound (documented in docs/CONTRACTS.md "Attention"). The float64
 * reference takes q, k and v rounded to bf16, as the MXU reads them
 * (CONTRACTS.md "MXU numerics"); what remains is the kernel's own rounding:
 * P rounded to bf16 (2^-9 relative), f32 sums, and in the backward dO, P and
 * dS rounded to bf16 as MXU operands. Per tensor,
 *     max |x - x64| <= ATTN_BOUND * max |x64|       (ATTN_BOUND = 2^-7)
 * for o, dq, dk and dv, where for dq and dk max |x64| is at least an eighth of
 * the largest sum of the absolute values of its terms (dS = P (dP - Dr)
 * cancels: with one key dk is exactly 0 and its f32 value is rounding noise); the composition meets the same bound against the
 * kernel. The worst ratio measured over the cases below is printed. */
#include "t_core.h"
#include "mxu.h"
#include "k_pool.h"

#define ATTN_BOUND (1.0 / 128.0)

typedef struct {
    int64_t B, H, Tq, Tk, D;
    int mask;          /* CTPU_MASK_NONE, _ADDITIVE, _KEEP01 */
    int mask_nd;       /* 2: [Tq,Tk]; 4: [B,1,Tq,Tk] */
    bool causal;
    double p;          /* dropout */
    ctpu_dtype dt;
} cfg_t;

typedef struct {
    float *q, *k, *v, *m, *w;   /* inputs (w: the weights of the loss sum(o * w)) */
    int64_t nq, nk, nm;
} data_t;

static double worst_ratio;

static int64_t mask_numel(const cfg_t *c) { return c->mask_nd == 4 ? c->B * c->Tq * c->Tk : c->Tq * c->Tk; }

static void make_data(const cfg_t *c, uint64_t seed, data_t *d)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    d->nq = c->B * c->H * c->Tq * c->D;
    d->nk = c->B * c->H * c->Tk * c->D;
    d->nm = mask_numel(c);
    d->q = malloc(sizeof(float) * (size_t)d->nq);
    d->k = malloc(sizeof(float) * (size_t)d->nk);
    d->v = malloc(sizeof(float) * (size_t)d->nk);
    d->w = malloc(sizeof(float) * (size_t)d->nq);
    d->m = malloc(sizeof(float) * (size_t)(d->nm ? d->nm : 1));
    for (int64_t i = 0; i < d->nq; i++) d->q[i] = t_rand_f(&s, -1.5f, 1.5f);
    for (int64_t i = 0; i < d->nk; i++) d->k[i] = t_rand_f(&s, -1.5f, 1.5f);
    for (int64_t i = 0; i < d->nk; i++) d->v[i] = t_rand_f(&s, -1, 1);
    for (int64_t i = 0; i < d->nq; i++) d->w[i] = t_rand_f(&s, -1, 1);
    for (int64_t i = 0; i < d->nm; i++) {
        float r = t_rand_f(&s, 0, 1);
        if (c->mask == CTPU_MASK_ADDITIVE) d->m[i] = r < 0.2f ? -INFINITY : t_rand_f(&s, -2, 2);
        else d->m[i] = r < 0.25f ? 0.0f : 1.0f;
    }
    if (c->mask != CTPU_MASK_NONE) {
        /* keep key 0 of every row so that no row is fully masked here (that case has its own test) */
        for (int64_t r = 0; r < d->nm / c->Tk; r++) d->m[r * c->Tk] = c->mask == CTPU_MASK_ADDITIVE ? 0.5f : 1.0f;
    }
}

static void free_data(data_t *d)
{
    free(d->q); free(d->k); free(d->v); free(d->w); free(d->m);
}

/* ------------------------------------------------------------ float64 reference */
static double bf(float x) { return ctpu_bf16_to_f32(ctpu_f32_to_bf16(x)); }

/* x64 and, for the gradients, the sums of the absolute values of their terms
 * (a: the scale of what cancels, e.g. dk when Tk = 1 is exactly 0) */
typedef struct { double *o, *dq, *dk, *dv, *adq, *adk; } ref_t;

static double mask_at(const cfg_t *c, const data_t *d, int64_t b, int64_t i, int64_t j)
{
    int64_t idx = c->mask_nd == 4 ? (b * c->Tq + i) * c->Tk + j : i * c->Tk + j;
    return d->m[idx];
}

/* allowed, and the additive term */
static bool ref_keep(const cfg_t *c, const data_t *d, int64_t b, int64_t i, int64_t j, double *add)
{
    *add = 0;
    if (c->causal && j > i) return false;
    if (c->mask == CTPU_MASK_KEEP01) return mask_at(c, d, b, i, j) != 0;
    if (c->mask == CTPU_MASK_ADDITIVE) {
        double m = mask_at(c, d, b, i, j);
        if (m == -INFINITY) return false;
        *add = m;
    }
    return true;
}

/* The reference forward and backward (loss = sum(o * w)), without dropout. */
static void reference(const cfg_t *c, const data_t *d, ref_t *r)
{
    int64_t Tq = c->Tq, Tk = c->Tk, D = c->D;
    double scale = 1.0 / sqrt((double)D);
    r->o = calloc((size_t)d->nq, sizeof(double));
    r->dq = calloc((size_t)d->nq, sizeof(double));
    r->dk = calloc((size_t)d->nk, sizeof(double));
    r->dv = calloc((size_t)d->nk, sizeof(double));
    r->adq = calloc((size_t)d->nq, sizeof(double));
    r->adk = calloc((size_t)d->nk, sizeof(double));
    double *p = malloc(sizeof(double) * (size_t)Tk), *dp = malloc(sizeof(double) * (size_t)Tk);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++) {
            int64_t bh = b * c->H + h;
            const float *Q = d->q + bh * Tq * D, *K = d->k + bh * Tk * D, *V = d->v + bh * Tk * D;
            const float *W = d->w + bh * Tq * D;
            for (int64_t i = 0; i < Tq; i++) {
                double mx = -INFINITY;
                for (int64_t j = 0; j < Tk; j++) {
                    double add;
                    if (!ref_keep(c, d, b, i, j, &add)) { p[j] = -INFINITY; continue; }
                    double s = 0;
                    for (int64_t e = 0; e < D; e++) s += bf(Q[i * D + e]) * bf(K[j * D + e]);
                    p[j] = s * scale + add;
                    if (p[j] > mx) mx = p[j];
                }
                double l = 0;
                for (int64_t j = 0; j < Tk; j++) { p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - mx); l += p[j]; }
                if (l == 0) continue;   /* fully masked: o = 0, gradients 0 */
                for (int64_t j = 0; j < Tk; j++) p[j] /= l;
                double *O = r->o + (bh * Tq + i) * D;
                for (int64_t j = 0; j < Tk; j++)
                    for (int64_t e = 0; e < D; e++) O[e] += p[j] * bf(V[j * D + e]);
                /* backward: dO = w */
                double Dr = 0;
                for (int64_t e = 0; e < D; e++) Dr += (double)W[i * D + e] * O[e];
                for (int64_t j = 0; j < Tk; j++) {
                    double s = 0;
                    for (int64_t e = 0; e < D; e++) s += (double)W[i * D + e] * bf(V[j * D + e]);
                    dp[j] = p[j] * (s - Dr) * scale;
                    double adp = p[j] * (fabs(s) + fabs(Dr)) * scale;
                    for (int64_t e = 0; e < D; e++) {
                        r->dv[(bh * Tk + j) * D + e] += p[j] * W[i * D + e];
                        r->dq[(bh * Tq + i) * D + e] += dp[j] * bf(K[j * D + e]);
                        r->dk[(bh * Tk + j) * D + e] += dp[j] * bf(Q[i * D + e]);
                        r->adq[(bh * Tq + i) * D + e] += adp * fabs(bf(K[j * D + e]));
                        r->adk[(bh * Tk + j) * D + e] += adp * fabs(bf(Q[i * D + e]));
                    }
                }
            }
        }
    free(p);
    free(dp);
}

static void free_ref(ref_t *r) { free(r->o); free(r->dq); free(r->dk); free(r->dv); free(r->adq); free(r->adk); }

/* max |x - y| / max(max |y|, max |ya| / 8) (NaN: 1e30); ya: NULL or the
 * sums of the absolute values of y's terms */
static double rel_err_a(const float *x, const double *y, const double *ya, int64_t n)
{
    double e = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] != x[i]) return 1e30;
        double a = fabs((double)x[i] - y[i]);
        if (a > e) e = a;
        if (fabs(y[i]) > m) m = fabs(y[i]);
        if (ya && ya[i] / 8 > m) m = ya[i] / 8;
    }
    return m > 0 ? e / m : e;
}
static double rel_err(const float *x, const double *y, int64_t n) { return rel_err_a(x, y, NULL, n); }

/* ------------------------------------------------------------ running ctpu */
typedef struct { float *o, *dq, *dk, *dv; } res_t;

static void free_res(res_t *r) { free(r->o); free(r->dq); free(r->dk); free(r->dv); }

static ctpu_tensor up(const float *x, ctpu_dtype dt, int nd, const int64_t *shape)
{
    ctpu_tensor t = dt == CTPU_BF16 ? ctpu_from_host_f32_as_bf16(x, nd, shape) : ctpu_from_host(x, CTPU_F32, nd, shape);
    ck_assert_msg(!ctpu_is_null(t), "%s", ctpu_last_error());
    return t;
}

static float *grad_of(ctpu_tensor t)
{
    ctpu_tensor g = ctpu_grad(t);
    ck_assert_msg(!ctpu_is_null(g), "grad: %s", ctpu_last_error());
    return t_read(g, NULL);
}

/* o and the gradients of sum(o * w); composed: the unfused composition */
static void run(const cfg_t *c, const data_t *d, bool composed, res_t *r)
{
    int64_t sq[4] = { c->B, c->H, c->Tq, c->D }, sk[4] = { c->B, c->H, c->Tk, c->D };
    int64_t sm4[4] = { c->B, 1, c->Tq, c->Tk }, sm2[2] = { c->Tq, c->Tk };
    ck_assert_int_eq(ctpu_rng_set_state(1234, 99), CTPU_OK);
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    ctpu_tensor q = up(d->q, c->dt, 4, sq), k = up(d->k, c->dt, 4, sk), v = up(d->v, c->dt, 4, sk);
    ctpu_tensor w = up(d->w, CTPU_F32, 4, sq);
    ctpu_tensor m = c->mask == CTPU_MASK_NONE ? CTPU_NULL : up(d->m, CTPU_F32, c->mask_nd, c->mask_nd == 4 ? sm4 : sm2);
    ck_assert_int_eq(ctpu_set_requires_grad(q, true), CTPU_OK);
    ck_assert_int_eq(ctpu_set_requires_grad(k, true), CTPU_OK);
    ck_assert_int_eq(ctpu_set_requires_grad(v, true), CTPU_OK);
    ctpu_tensor o;
    if (!composed) {
        o = ctpu_scaled_dot_product_attention(q, k, v, m, (ctpu_mask_kind)c->mask, c->causal, 0, c->p);
    } else {
        ctpu_tensor s = ctpu_mul_scalar(ctpu_matmul_t(q, k, false, true), 1.0 / sqrt((double)c->D));
        if (c->mask == CTPU_MASK_ADDITIVE) s = ctpu_add(s, m);
        if (c->mask == CTPU_MASK_KEEP01)
            s = ctpu_where(m, s, ctpu_full(CTPU_F32, 0, NULL, -INFINITY));
        if (c->causal) s = ctpu_add(s, ctpu_causal_mask(c->Tq, c->Tk, CTPU_MASK_ADDITIVE));
        ctpu_tensor pr = ctpu_softmax(s, -1);
        if (c->p > 0) {
            int64_t sh[4] = { c->B, c->H, c->Tq, c->Tk };
            ctpu_tensor u = ctpu_rand_uniform(CTPU_F32, 4, sh, 0.0, 1.0);
            pr = ctpu_mul_scalar(ctpu_mul(pr, ctpu_ge_scalar(u, c->p)), 1.0 / (1.0 - c->p));
        }
        if (c->dt == CTPU_BF16) pr = ctpu_cast(pr, CTPU_BF16);
        o = ctpu_matmul(pr, v);
    }
    ck_assert_msg(!ctpu_is_null(o), "sdpa: %s", ctpu_last_error());
    t_expect_shape(o, 4, sq);
    ck_assert_int_eq(ctpu_dtype_of(o), c->dt);
    ctpu_tensor loss = ctpu_sum(ctpu_mul(o, w), 0, NULL, false);
    ck_assert_msg(ctpu_backward(loss) == CTPU_OK, "backward: %s", ctpu_last_error());
    r->o = t_read(o, NULL);
    r->dq = grad_of(q);
    r->dk = grad_of(k);
    r->dv = grad_of(v);
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    ck_assert_msg(ctpu_sync() == CTPU_OK, "%s", ctpu_last_error());
}

static void check_vs_ref(const cfg_t *c, const char *what, const res_t *r, const ref_t *ref, int64_t nq, int64_t nk)
{
    double e[4] = { rel_err(r->o, ref->o, nq), rel_err_a(r->dq, ref->dq, ref->adq, nq),
                    rel_err_a(r->dk, ref->dk, ref->adk, nk),
                    rel_err(r->dv, ref->dv, nk) };
    static const char *const nm[4] = { "o", "dq", "dk", "dv" };
    for (int i = 0; i < 4; i++) {
        if (e[i] > worst_ratio) worst_ratio = e[i];
        ck_assert_msg(e[i] <= ATTN_BOUND, "%s %s: B=%lld H=%lld Tq=%lld Tk=%lld D=%lld mask=%d causal=%d %s: "
                      "error %.3g of max|ref| > bound %.3g", what, nm[i], (long long)c->B, (long long)c->H,
                      (long long)c->Tq, (long long)c->Tk, (long long)c->D, c->mask, c->causal,
                      c->dt == CTPU_BF16 ? "bf16" : "f32", e[i], ATTN_BOUND);
    }
}

static const cfg_t CASES[] = {
    { 1, 2, 37, 37, 32, CTPU_MASK_NONE, 2, false, 0, CTPU_F32 },
    { 1, 1, 128, 128, 64, CTPU_MASK_NONE, 2, true, 0, CTPU_F32 },
    { 2, 1, 200, 130, 32, CTPU_MASK_ADDITIVE, 2, false, 0, CTPU_F32 },
    { 1, 2, 130, 300, 64, CTPU_MASK_KEEP01, 4, true, 0, CTPU_F32 },
    { 1, 1, 257, 257, 128, CTPU_MASK_ADDITIVE, 4, true, 0, CTPU_F32 },
    { 1, 1, 300, 1, 32, CTPU_MASK_NONE, 2, false, 0, CTPU_F32 },
    { 2, 2, 129, 200, 32, CTPU_MASK_KEEP01, 2, false, 0, CTPU_BF16 },
    { 1, 1, 150, 150, 128, CTPU_MASK_NONE, 2, true, 0, CTPU_BF16 },
};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))

START_TEST(vs_float64)
{
    const cfg_t *c = &CASES[_i];
    data_t d;
    make_data(c, (uint64_t)_i + 1, &d);
    ref_t ref;
    reference(c, &d, &ref);
    res_t r;
    run(c, &d, false, &r);
    check_vs_ref(c, "sdpa vs float64", &r, &ref, d.nq, d.nk);
    res_t rc;
    run(c, &d, true, &rc);
    check_vs_ref(c, "composition vs float64", &rc, &ref, d.nq, d.nk);
    /* the kernel against the composition, within the bound of the larger */
    double *co = malloc(sizeof(double) * (size_t)d.nq);
    for (int64_t i = 0; i < d.nq; i++) co[i] = rc.o[i];
    double e = rel_err(r.o, co, d.nq);
    ck_assert_msg(e <= ATTN_BOUND, "sdpa vs composition: o differs by %.3g of max|o|", e);
    free(co);
    printf("sdpa case %d: worst error / max|ref| so far %.3g (bound %.3g)\n", _i, worst_ratio, ATTN_BOUND);
    free_res(&r);
    free_res(&rc);
    free_ref(&ref);
    free_data(&d);
}
END_TEST

/* Dropout: the kernel's draws are the composition's (same generator
 * elements), so the two agree within the bound, forward and backward. */
START_TEST(dropout_vs_composition)
{
    cfg_t c = { 1, 2, 140, 133, 32, CTPU_MASK_ADDITIVE, 2, true, 0.25, CTPU_F32 };
    data_t d;
    make_data(&c, 77, &d);
    res_t r, rc;
    run(&c, &d, false, &r);
    run(&c, &d, true, &rc);
    double *y = malloc(sizeof(double) * (size_t)(d.nq > d.nk ? d.nq : d.nk));
    const float *a[4] = { r.o, r.dq, r.dk, r.dv }, *b[4] = { rc.o, rc.dq, rc.dk, rc.dv };
    int64_t n[4] = { d.nq, d.nq, d.nk, d.nk };
    for (int t = 0; t < 4; t++) {
        for (int64_t i = 0; i < n[t]; i++) y[i] = b[t][i];
        double e = rel_err(a[t], y, n[t]);
        ck_assert_msg(e <= ATTN_BOUND, "dropout: tensor %d differs from the composition by %.3g", t, e);
    }
    /* dropout did drop: o differs from the no-dropout o */
    c.p = 0;
    res_t r0;
    run(&c, &d, false, &r0);
    int64_t diff = 0;
    for (int64_t i = 0; i < d.nq; i++) diff += r0.o[i] != r.o[i];
    ck_assert_int_gt(diff, d.nq / 2);
    free(y);
    free_res(&r);
    free_res(&rc);
    free_res(&r0);
    free_data(&d);
}
END_TEST

/* The reference's analytic gradient against central differences of its
 * own forward (double), so the gradient checks above check something. */
START_TEST(reference_gradient_fd)
{
    cfg_t c = { 1, 1, 5, 7, 4, CTPU_MASK_ADDITIVE, 2, true, 0, CTPU_F32 };
    data_t d;
    make_data(&c, 5, &d);
    /* bf16-exact inputs, so that the reference's rounding is the identity */
    for (int64_t i = 0; i < d.nq; i++) d.q[i] = (float)bf(d.q[i]);
    for (int64_t i = 0; i < d.nk; i++) { d.k[i] = (float)bf(d.k[i]); d.v[i] = (float)bf(d.v[i]); }
    ref_t r;
    reference(&c, &d, &r);
    float *xs[3] = { d.q, d.k, d.v };
    double *gs[3] = { r.dq, r.dk, r.dv };
    int64_t ns[3] = { d.nq, d.nk, d.nk };
    for (int t = 0; t < 3; t++)
        for (int64_t i = 0; i < ns[t]; i++) {
            float x0 = xs[t][i];
            double f[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                xs[t][i] = (float)(x0 + (sgn ? -1 : 1) * 0.0078125);   /* bf16-exact steps */
                ref_t rr;
                reference(&c, &d, &rr);
                f[sgn] = 0;
                for (int64_t e = 0; e < d.nq; e++) f[sgn] += rr.o[e] * d.w[e];
                free_ref(&rr);
            }
            xs[t][i] = x0;
            double fd = (f[0] - f[1]) / (2 * 0.0078125);
            ck_assert_msg(fabs(fd - gs[t][i]) <= 1e-3 * (1 + fabs(fd)), "tensor %d elem %lld: fd %g vs %g", t,
                          (long long)i, fd, gs[t][i]);
        }
    free_ref(&r);
    free_data(&d);
}
END_TEST

/* ------------------------------------------------------------ parity */
static const cfg_t PAR = { 2, 2, 150, 140, 32, CTPU_MASK_ADDITIVE, 4, true, 0.1, CTPU_F32 };

static void bits_of(const cfg_t *c, const data_t *d, void **out)
{
    res_t r;
    run(c, d, false, &r);
    out[0] = r.o; out[1] = r.dq; out[2] = r.dk; out[3] = r.dv;
}

static void same_bits(void **a, void **b, const data_t *d, const char *what)
{
    int64_t n[4] = { d->nq, d->nq, d->nk, d->nk };
    for (int t = 0; t < 4; t++) {
        const float *x = a[t], *y = b[t];
        for (int64_t i = 0; i < n[t]; i++)
            T_CHECK(t_same(x[i], y[i]), "%s: tensor %d element %lld: %a vs %a", what, t, (long long)i, x[i], y[i]);
    }
}

START_TEST(mode_parity)
{
    for (int dt = 0; dt < 2; dt++) {
        cfg_t c = PAR;
        c.dt = dt ? CTPU_BF16 : CTPU_F32;
        data_t d;
        make_data(&c, 3, &d);
        void *ref[4], *o[4];
        static const ctpu_mode modes[] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
        for (int mi = 0; mi < 3; mi++) {
            ck_assert_int_eq(ctpu_set_mode(modes[mi]), CTPU_OK);
            bits_of(&c, &d, mi ? o : ref);
            if (mi) {
                same_bits(ref, o, &d, ctpu_mode_name(modes[mi]));
                for (int t = 0; t < 4; t++) free(o[t]);
            }
        }
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
        for (int t = 0; t < 4; t++) free(ref[t]);
        free_data(&d);
    }
}
END_TEST

START_TEST(isa_and_thread_parity)
{
    ctpu_shutdown();
    data_t d;
    make_data(&PAR, 4, &d);
    void *ref[4] = { 0 }, *o[4];
    int best = (int)ctpu_isa_detect(), runs = 0;
    static const char *const thr[] = { "1", "2", "3" };
    for (int isa = 0; isa <= best; isa++)
        for (int t = 0; t < 3; t++) {
            if (isa != best && t != 1) continue;
            t_clear_env();
            setenv("CTPU_ISA", ctpu_isa_name((ctpu_isa)isa), 1);
            setenv("CTPU_NUM_THREADS", thr[t], 1);
            ck_assert_int_eq(ctpu_init(), CTPU_OK);
            bool first = ref[0] == NULL;
            bits_of(&PAR, &d, first ? ref : o);
            if (!first) {
                char what[64];
                snprintf(what, sizeof what, "ISA %s, %s threads", ctpu_isa_name((ctpu_isa)isa), thr[t]);
                same_bits(ref, o, &d, what);
                for (int x = 0; x < 4; x++) free(o[x]);
            }
            ctpu_shutdown();
            runs++;
        }
    ck_assert_int_ge(runs, 3);
    for (int k = 0; k < 4; k++) free(ref[k]);
    free_data(&d);
    t_clear_env();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
}
END_TEST

/* The kernel (this ISA's MXU micro-kernels, every AVX-512 variant, the
 * elementwise table, every ISA's build of attention.c) against its scalar
 * reference, bit for bit. */
START_TEST(kernel_vs_ref)
{
    static const int64_t dims[][5] = { { 1, 2, 130, 129, 32 }, { 1, 1, 70, 200, 64 } };
    for (int ci = 0; ci < 2; ci++) {
        int64_t B = dims[ci][0], H = dims[ci][1], Tq = dims[ci][2], Tk = dims[ci][3], D = dims[ci][4];
        int64_t nq = B * H * Tq * D, nk = B * H * Tk * D;
        float *q = malloc(4 * (size_t)nq), *k = malloc(4 * (size_t)nk), *v = malloc(4 * (size_t)nk),
              *m = malloc(4 * (size_t)(Tq * Tk)), *g = malloc(4 * (size_t)nq);
        uint64_t s = 99 + (uint64_t)ci;
        for (int64_t i = 0; i < nq; i++) { q[i] = t_rand_f(&s, -2, 2); g[i] = t_rand_f(&s, -1, 1); }
        for (int64_t i = 0; i < nk; i++) { k[i] = t_rand_f(&s, -2, 2); v[i] = t_rand_f(&s, -1, 1); }
        for (int64_t i = 0; i < Tq * Tk; i++) m[i] = t_rand_f(&s, 0, 1) < 0.1f ? -INFINITY : t_rand_f(&s, -1, 1);
        float *out[2][2], *grads[2];
        for (int which = 0; which < 2; which++) {
            out[which][0] = malloc(4 * (size_t)(nq + B * H * Tq));
            grads[which] = malloc(4 * (size_t)(nq + 2 * nk));
        }
        ctpu_attn_args a = { .B = B, .H = H, .Tq = Tq, .Tk = Tk, .D = D, .q = q, .k = k, .v = v,
                             .dtype = CTPU_KDT_F32, .mask = m, .mask_kind = CTPU_K_MASK_ADD, .ms = { 0, 0, Tk, 1 },
                             .causal = ci == 0, .scale = 0.17f, .p = 0.2, .seed = 5, .offset = 1000,
                             .precision = CTPU_PREC_DEFAULT };
        for (int which = 0; which < 2; which++) {
            a.o = out[which][0];
            a.lse = a.o + nq;
            if (which) ctpu_k_attn_fwd(&a, NULL); else ctpu_k_attn_fwd_ref(&a);
            a.o_in = out[0][0];
            a.lse_in = out[0][0] + nq;
            a.dout = g;
            a.dq = grads[which];
            a.dk = a.dq + nq;
            a.dv = a.dk + nk;
            if (which) ctpu_k_attn_bwd(&a, NULL); else ctpu_k_attn_bwd_ref(&a);
        }
        for (int64_t i = 0; i < nq + B * H * Tq; i++)
            T_CHECK(t_same(out[0][0][i], out[1][0][i]), "case %d forward element %lld", ci, (long long)i);
        for (int64_t i = 0; i < nq + 2 * nk; i++)
            T_CHECK(t_same(grads[0][i], grads[1][i]), "case %d backward element %lld", ci, (long long)i);
        /* every AVX-512 micro-kernel variant on this CPU */
        const ctpu_mxu_impl *variants[] = { &ctpu_mxu_impl_avx2, &ctpu_mxu_impl_avx512, &ctpu_mxu_impl_avx512_dp };
        int lim = ctpu_isa_detect() == CTPU_ISA_AVX512 ? 3 : ctpu_isa_detect() == CTPU_ISA_AVX2 ? 1 : 0;
        for (int vi = 0; vi < lim; vi++) {
            ctpu_mxu_force_impl(variants[vi]);
            a.o = out[1][0];
            a.lse = a.o + nq;
            ctpu_k_attn_fwd(&a, NULL);
            a.dq = grads[1];
            a.dk = a.dq + nq;
            a.dv = a.dk + nk;
            ctpu_k_attn_bwd(&a, NULL);
            ctpu_mxu_force_impl(NULL);
            for (int64_t i = 0; i < nq + B * H * Tq; i++)
                T_CHECK(t_same(out[0][0][i], out[1][0][i]), "case %d %s forward element %lld", ci,
                        variants[vi]->name, (long long)i);
            for (int64_t i = 0; i < nq + 2 * nk; i++)
                T_CHECK(t_same(grads[0][i], grads[1][i]), "case %d %s backward element %lld", ci,
                        variants[vi]->name, (long long)i);
        }
        /* every ISA's build of the kernel (attention.c's SSE2, AVX2 and
         * AVX-512 objects, each with that ISA's elementwise table and MXU) */
        ctpu_isa was = ctpu_kernels_isa();
        for (int isa = 0; isa <= (int)ctpu_isa_detect(); isa++) {
            ck_assert(ctpu_kernels_set_isa((ctpu_isa)isa));
            a.o = out[1][0];
            a.lse = a.o + nq;
            ctpu_k_attn_fwd(&a, NULL);
            a.dq = grads[1];
            a.dk = a.dq + nq;
            a.dv = a.dk + nk;
            ctpu_k_attn_bwd(&a, NULL);
            for (int64_t i = 0; i < nq + B * H * Tq; i++)
                T_CHECK(t_same(out[0][0][i], out[1][0][i]), "case %d ISA %s forward element %lld", ci,
                        ctpu_isa_name((ctpu_isa)isa), (long long)i);
            for (int64_t i = 0; i < nq + 2 * nk; i++)
                T_CHECK(t_same(grads[0][i], grads[1][i]), "case %d ISA %s backward element %lld", ci,
                        ctpu_isa_name((ctpu_isa)isa), (long long)i);
        }
        ck_assert(ctpu_kernels_set_isa(was));
        /* kernel threads: case 1 (one head, two key blocks) at 2 threads
         * splits the backward's sums (dQ per query block, dK and dV per key
         * block), not the heads */
        for (int nt = 2; nt <= 3; nt++) {
            ctpu_k_pool pool = k_pool_make(nt);
            a.o = out[1][0];
            a.lse = a.o + nq;
            ctpu_k_attn_fwd(&a, &pool);
            a.dq = grads[1];
            a.dk = a.dq + nq;
            a.dv = a.dk + nk;
            ctpu_k_attn_bwd(&a, &pool);
            for (int64_t i = 0; i < nq + B * H * Tq; i++)
                T_CHECK(t_same(out[0][0][i], out[1][0][i]), "case %d %d threads forward element %lld", ci, nt,
                        (long long)i);
            for (int64_t i = 0; i < nq + 2 * nk; i++)
                T_CHECK(t_same(grads[0][i], grads[1][i]), "case %d %d threads backward element %lld", ci, nt,
                        (long long)i);
        }
        for (int which = 0; which < 2; which++) { free(out[which][0]); free(grads[which]); }
        free(q); free(k); free(v); free(m); free(g);
    }
}
END_TEST

/* Causal blocks on the diagonal skip what is exactly zero or overwritten
 * (attention.c mm_packed's TRI_ABOVE / TRI_KEYS, fwd_softmax's masked
 * exps): bit for bit the reference, which computes every term, at Tq = Tk,
 * Tq < Tk, Tq > Tk and edge-tile sizes, f32 and bf16 inputs, default and
 * HIGH precision, with and without dropout, and with a NaN score row (q
 * NaN), an infinite V row past every query of a tile and a NaN V row, where
 * a skipped 0 * V would have been NaN (then nothing is skipped). */
START_TEST(kernel_vs_ref_causal_skips)
{
    static const int64_t dims[][3] = { { 128, 128, 32 }, { 130, 129, 16 }, { 70, 200, 32 }, { 200, 70, 16 }, { 5, 37, 8 } };
    for (int ci = 0; ci < 5; ci++)
        for (int var = 0; var < 6; var++) {
            int64_t B = 1, H = 2, Tq = dims[ci][0], Tk = dims[ci][1], D = dims[ci][2];
            int64_t nq = B * H * Tq * D, nk = B * H * Tk * D;
            bool bf16 = var == 1, high = var == 2, drop = var == 3;
            float *q = malloc(4 * (size_t)nq), *k = malloc(4 * (size_t)nk), *v = malloc(4 * (size_t)nk),
                  *g = malloc(4 * (size_t)nq);
            uint64_t s = 777 + (uint64_t)(ci * 8 + var);
            for (int64_t i = 0; i < nq; i++) { q[i] = t_rand_f(&s, -2, 2); g[i] = t_rand_f(&s, -1, 1); }
            for (int64_t i = 0; i < nk; i++) { k[i] = t_rand_f(&s, -2, 2); v[i] = t_rand_f(&s, -1, 1); }
            if (var == 4) {   /* head 0: V row Tk-1 infinite, V row Tk/2 NaN; q row 1 of head 1 NaN */
                for (int64_t d = 0; d < D; d++) { v[(Tk - 1) * D + d] = INFINITY; v[(Tk / 2) * D + d] = NAN; }
                q[(Tq + 1) * D] = NAN;
            }
            if (var == 5)     /* head 1: one infinite V element past the first queries */
                v[(Tk + Tk - 2) * D + D / 2] = -INFINITY;
            uint16_t *qb = NULL, *kb = NULL, *vb = NULL;
            if (bf16) {
                qb = malloc(2 * (size_t)nq); kb = malloc(2 * (size_t)nk); vb = malloc(2 * (size_t)nk);
                for (int64_t i = 0; i < nq; i++) qb[i] = ctpu_f32_to_bf16(q[i]);
                for (int64_t i = 0; i < nk; i++) { kb[i] = ctpu_f32_to_bf16(k[i]); vb[i] = ctpu_f32_to_bf16(v[i]); }
            }
            float *out[2], *grads[2];
            for (int w = 0; w < 2; w++) {
                out[w] = malloc(4 * (size_t)(nq + B * H * Tq));
                grads[w] = malloc(4 * (size_t)(nq + 2 * nk));
            }
            ctpu_attn_args a = { .B = B, .H = H, .Tq = Tq, .Tk = Tk, .D = D,
                                 .q = bf16 ? (const void *)qb : q, .k = bf16 ? (const void *)kb : k,
                                 .v = bf16 ? (const void *)vb : v, .dtype = bf16 ? CTPU_KDT_BF16 : CTPU_KDT_F32,
                                 .mask_kind = CTPU_K_MASK_NONE, .causal = true, .scale = 0.25f,
                                 .p = drop ? 0.3 : 0.0, .seed = 11, .offset = 3,
                                 .precision = high ? CTPU_PREC_HIGH : CTPU_PREC_DEFAULT };
            for (int w = 0; w < 2; w++) {
                a.o = out[w];
                a.lse = a.o + nq;
                if (w) ctpu_k_attn_fwd(&a, NULL); else ctpu_k_attn_fwd_ref(&a);
            }
            for (int64_t i = 0; i < nq + B * H * Tq; i++)
                T_CHECK(t_same(out[0][i], out[1][i]), "Tq=%lld Tk=%lld D=%lld variant %d: forward element %lld",
                        (long long)Tq, (long long)Tk, (long long)D, var, (long long)i);
            a.o_in = out[0];
            a.lse_in = out[0] + nq;
            a.dout = g;
            for (int w = 0; w < 2; w++) {
                a.dq = grads[w];
                a.dk = a.dq + nq;
                a.dv = a.dk + nk;
                if (w) ctpu_k_attn_bwd(&a, NULL); else ctpu_k_attn_bwd_ref(&a);
            }
            for (int64_t i = 0; i < nq + 2 * nk; i++)
                T_CHECK(t_same(grads[0][i], grads[1][i]), "Tq=%lld Tk=%lld D=%lld variant %d: backward element %lld",
                        (long long)Tq, (long long)Tk, (long long)D, var, (long long)i);
            for (int w = 0; w < 2; w++) { free(out[w]); free(grads[w]); }
            free(q); free(k); free(v); free(g); free(qb); free(kb); free(vb);
        }
}
END_TEST

/* ------------------------------------------------------------ the BTHD layout */
/* x [B,H,T,D] <-> [B,T,H,D] (to_bthd true: BHTD -> BTHD) */
static void perm_bh(const float *x, float *y, int64_t B, int64_t H, int64_t T, int64_t D, bool to_bthd)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                const float *src = to_bthd ? x + ((b * H + h) * T + t) * D : x + ((b * T + t) * H + h) * D;
                float *dst = to_bthd ? y + ((b * T + t) * H + h) * D : y + ((b * H + h) * T + t) * D;
                memcpy(dst, src, sizeof(float) * (size_t)D);
            }
}

/* The kernel in the BTHD layout (ctpu_attn_args.layout) equals the BHTD
 * scalar reference on the permuted tensors, bit for bit: reference and ISA
 * kernels, every ISA's build, 1 to 3 threads (both backward splits). */
START_TEST(kernel_bthd_layout)
{
    /* causal; causal with a key block no query sees; not causal */
    static const int64_t dims[][5] = { { 2, 3, 130, 129, 32 }, { 1, 2, 70, 200, 24 }, { 1, 2, 130, 150, 16 } };
    for (int ci = 0; ci < 3; ci++) {
        int64_t B = dims[ci][0], H = dims[ci][1], Tq = dims[ci][2], Tk = dims[ci][3], D = dims[ci][4];
        int64_t nq = B * H * Tq * D, nk = B * H * Tk * D, nl = B * H * Tq;
        float *x = malloc(4 * (size_t)(2 * nq + 2 * nk)), *xt = malloc(4 * (size_t)(2 * nq + 2 * nk));
        float *m = malloc(4 * (size_t)(Tq * Tk));
        float *ref = malloc(4 * (size_t)(2 * nq + nl + 2 * nk)), *got = malloc(4 * (size_t)(2 * nq + nl + 2 * nk));
        float *un = malloc(4 * (size_t)(nq + nk));
        uint64_t s = 7 + (uint64_t)ci;
        for (int64_t i = 0; i < 2 * nq + 2 * nk; i++) x[i] = t_rand_f(&s, -2, 2);
        for (int64_t i = 0; i < Tq * Tk; i++) m[i] = t_rand_f(&s, 0, 1) < 0.1f ? -INFINITY : t_rand_f(&s, -1, 1);
        /* x: q [nq], k [nk], v [nk], dout [nq], each BHTD; xt: the same BTHD */
        int64_t off[4] = { 0, nq, nq + nk, nq + 2 * nk }, tl[4] = { Tq, Tk, Tk, Tq };
        for (int t = 0; t < 4; t++) perm_bh(x + off[t], xt + off[t], B, H, tl[t], D, true);
        for (int pass = 0; pass < 6 + (int)ctpu_isa_detect(); pass++) {
            bool bthd = pass > 0;
            const float *src = bthd ? xt : x;
            float *o = bthd ? got : ref;
            ctpu_attn_args a = { .B = B, .H = H, .Tq = Tq, .Tk = Tk, .D = D,
                                 .layout = bthd ? CTPU_K_ATTN_BTHD : CTPU_K_ATTN_BHTD,
                                 .q = src, .k = src + off[1], .v = src + off[2], .dtype = CTPU_KDT_F32, .mask = m,
                                 .mask_kind = CTPU_K_MASK_ADD, .ms = { 0, 0, Tk, 1 }, .causal = ci < 2,
                                 .scale = 0.2f, .p = 0.15, .seed = 3, .offset = 77, .precision = CTPU_PREC_DEFAULT };
            a.o = o;
            a.lse = o + nq;
            a.o_in = o;
            a.lse_in = o + nq;
            a.dout = src + off[3];
            a.dq = o + nq + nl;
            a.dk = a.dq + nq;
            a.dv = a.dk + nk;
            /* pass 0: BHTD ref; 1: BTHD ref; 2-4: ISA kernel at 1-3 threads; then each ISA's build */
            ctpu_isa was = ctpu_kernels_isa();
            ctpu_k_pool pool = k_pool_make(pass >= 2 && pass <= 4 ? pass - 1 : 1);
            if (pass >= 5) ck_assert(ctpu_kernels_set_isa((ctpu_isa)(pass - 5)));
            if (pass <= 1) { ctpu_k_attn_fwd_ref(&a); ctpu_k_attn_bwd_ref(&a); }
            else { ctpu_k_attn_fwd(&a, &pool); ctpu_k_attn_bwd(&a, &pool); }
            ck_assert(ctpu_kernels_set_isa(was));
            if (!bthd) continue;
            /* o, dq back to BHTD; dk, dv too; lse is BHT in both */
            perm_bh(got, un, B, H, Tq, D, false);
            for (int64_t i = 0; i < nq; i++) T_CHECK(t_same(ref[i], un[i]), "case %d pass %d o %lld", ci, pass, (long long)i);
            for (int64_t i = 0; i < nl; i++)
                T_CHECK(t_same(ref[nq + i], got[nq + i]), "case %d pass %d lse %lld", ci, pass, (long long)i);
            const float *g0 = ref + nq + nl, *g1 = got + nq + nl;
            int64_t go[3] = { 0, nq, nq + nk }, gt[3] = { Tq, Tk, Tk };
            for (int t = 0; t < 3; t++) {
                perm_bh(g1 + go[t], un, B, H, gt[t], D, false);
                for (int64_t i = 0; i < gt[t] * B * H * D; i++)
                    T_CHECK(t_same(g0[go[t] + i], un[i]), "case %d pass %d grad %d element %lld", ci, pass, t,
                            (long long)i);
            }
        }
        free(x); free(xt); free(m); free(ref); free(got); free(un);
    }
}
END_TEST

/* ctpu_scaled_dot_product_attention_bthd in every mode (f32 and bf16) equals
 * ctpu_scaled_dot_product_attention on the permuted tensors, result and
 * gradients, bit for bit; its shape errors read the BTHD layout. */
START_TEST(bthd_equals_permuted)
{
    for (int dt = 0; dt < 2; dt++) {
        cfg_t c = PAR;
        c.dt = dt ? CTPU_BF16 : CTPU_F32;
        data_t d;
        make_data(&c, 5, &d);
        void *ref[4];
        bits_of(&c, &d, ref);
        int64_t B = c.B, H = c.H, Tq = c.Tq, Tk = c.Tk, D = c.D;
        float *qt = malloc(4 * (size_t)d.nq), *kt = malloc(4 * (size_t)d.nk), *vt = malloc(4 * (size_t)d.nk),
              *wt = malloc(4 * (size_t)d.nq), *un = malloc(4 * (size_t)(d.nq > d.nk ? d.nq : d.nk));
        perm_bh(d.q, qt, B, H, Tq, D, true);
        perm_bh(d.k, kt, B, H, Tk, D, true);
        perm_bh(d.v, vt, B, H, Tk, D, true);
        perm_bh(d.w, wt, B, H, Tq, D, true);
        static const ctpu_mode modes[] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
        for (int mi = 0; mi < 3; mi++) {
            ck_assert_int_eq(ctpu_set_mode(modes[mi]), CTPU_OK);
            int64_t sq[4] = { B, Tq, H, D }, sk[4] = { B, Tk, H, D }, sm4[4] = { B, 1, Tq, Tk };
            ck_assert_int_eq(ctpu_rng_set_state(1234, 99), CTPU_OK);   /* as run() */
            ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
            ctpu_tensor q = up(qt, c.dt, 4, sq), k = up(kt, c.dt, 4, sk), v = up(vt, c.dt, 4, sk);
            ctpu_tensor w = up(wt, CTPU_F32, 4, sq), m = up(d.m, CTPU_F32, 4, sm4);
            ck_assert_int_eq(ctpu_set_requires_grad(q, true), CTPU_OK);
            ck_assert_int_eq(ctpu_set_requires_grad(k, true), CTPU_OK);
            ck_assert_int_eq(ctpu_set_requires_grad(v, true), CTPU_OK);
            ctpu_tensor o = ctpu_scaled_dot_product_attention_bthd(q, k, v, m, (ctpu_mask_kind)c.mask, c.causal, 0, c.p);
            ck_assert_msg(!ctpu_is_null(o), "sdpa_bthd: %s", ctpu_last_error());
            t_expect_shape(o, 4, sq);
            ck_assert_int_eq(ctpu_dtype_of(o), c.dt);
            ck_assert(ctpu_backward(ctpu_sum(ctpu_mul(o, w), 0, NULL, false)) == CTPU_OK);
            float *got[4] = { t_read(o, NULL), grad_of(q), grad_of(k), grad_of(v) };
            ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
            ck_assert_msg(ctpu_sync() == CTPU_OK, "%s", ctpu_last_error());
            int64_t T4[4] = { Tq, Tq, Tk, Tk };
            for (int t = 0; t < 4; t++) {
                perm_bh(got[t], un, B, H, T4[t], D, false);
                const float *r = ref[t];
                for (int64_t i = 0; i < B * H * T4[t] * D; i++)
                    T_CHECK(t_same(r[i], un[i]), "%s %s tensor %d element %lld: %a vs %a", ctpu_mode_name(modes[mi]),
                            dt ? "bf16" : "f32", t, (long long)i, un[i], r[i]);
                free(got[t]);
            }
        }
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
        for (int t = 0; t < 4; t++) free(ref[t]);
        free(qt); free(kt); free(vt); free(wt); free(un);
        free_data(&d);
    }
    /* the shapes as BTHD: k's H (dim 2) must be q's */
    int64_t sq[4] = { 1, 5, 2, 8 }, sk[4] = { 1, 6, 3, 8 };
    ctpu_tensor q = ctpu_zeros(CTPU_F32, 4, sq), k = ctpu_zeros(CTPU_F32, 4, sk);
    ctpu_tensor o = ctpu_scaled_dot_product_attention_bthd(q, k, k, CTPU_NULL, CTPU_MASK_NONE, false, 0, 0);
    ck_assert(ctpu_is_null(o));
    ck_assert_msg(t_contains(ctpu_last_error(), "[B,Tk,H,Dh]"), "%s", ctpu_last_error());
    ctpu_release(q);
    ctpu_release(k);
}
END_TEST

/* ------------------------------------------------------------ fully masked rows */
START_TEST(fully_masked_row_is_zero)
{
    static const ctpu_mode modes[] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    for (int kind = 0; kind < 2; kind++)
        for (int mi = 0; mi < 3; mi++) {
            ck_assert_int_eq(ctpu_set_mode(modes[mi]), CTPU_OK);
            cfg_t c = { 1, 1, 6, 5, 4, kind ? CTPU_MASK_KEEP01 : CTPU_MASK_ADDITIVE, 2, false, 0, CTPU_F32 };
            data_t d;
            make_data(&c, 11, &d);
            for (int64_t j = 0; j < c.Tk; j++) d.m[2 * c.Tk + j] = kind ? 0.0f : -INFINITY;   /* row 2: every key dropped */
            ref_t ref;
            reference(&c, &d, &ref);
            res_t r;
            run(&c, &d, false, &r);   /* debug eager's NaN checks pass: nothing is NaN */
            for (int64_t e = 0; e < c.D; e++) {
                ck_assert(r.o[2 * c.D + e] == 0.0f);
                ck_assert(r.dq[2 * c.D + e] == 0.0f);
            }
            check_vs_ref(&c, "fully masked row", &r, &ref, d.nq, d.nk);
            free_res(&r);
            free_ref(&ref);
            free_data(&d);
        }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    /* no keys at all (Tk = 0): every row fully masked */
    int64_t sq[4] = { 1, 1, 3, 8 }, sk[4] = { 1, 1, 0, 8 };
    float qd[24] = { 1, 2, 3 };
    ctpu_tensor q = t_f32(qd, 4, sq), k = ctpu_zeros(CTPU_F32, 4, sk), v = ctpu_zeros(CTPU_F32, 4, sk);
    float *o = t_read(ctpu_scaled_dot_product_attention(q, k, v, CTPU_NULL, CTPU_MASK_NONE, false, 0, 0), NULL);
    for (int i = 0; i < 24; i++) ck_assert(o[i] == 0.0f);
    free(o);
}
END_TEST

/* ------------------------------------------------------------ program shape */
/* In defer and fuse the attention is one kernel of its own (forward and
 * backward each), and no [T, T] buffer exists: at T = 1024 the peak HBM in
 * use stays below one [B,H,T,T] f32 score tensor. */
START_TEST(no_score_buffer)
{
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    int64_t T = 1024, sq[4] = { 1, 2, T, 32 };
    float *x = malloc(sizeof(float) * (size_t)(2 * T * 32));
    uint64_t s = 5;
    for (int64_t i = 0; i < 2 * T * 32; i++) x[i] = t_rand_f(&s, -1, 1);
    ctpu_hbm_reset_peak();
    ctpu_hbm_stats st0;
    ck_assert_int_eq(ctpu_hbm_get_stats(&st0), CTPU_OK);
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    ctpu_tensor q = t_f32(x, 4, sq), k = t_f32(x, 4, sq), v = t_f32(x, 4, sq);
    ck_assert_int_eq(ctpu_set_requires_grad(q, true), CTPU_OK);
    ck_assert_int_eq(ctpu_set_requires_grad(k, true), CTPU_OK);
    ck_assert_int_eq(ctpu_set_requires_grad(v, true), CTPU_OK);
    ctpu_tensor o = ctpu_scaled_dot_product_attention(q, k, v, CTPU_NULL, CTPU_MASK_NONE, true, 0, 0);
    ck_assert_int_eq(ctpu_backward(ctpu_sum(o, 0, NULL, false)), CTPU_OK);
    float *g = t_read(ctpu_grad(k), NULL);
    free(g);
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    ctpu_hbm_stats st;
    ck_assert_int_eq(ctpu_hbm_get_stats(&st), CTPU_OK);
    double tt = 2.0 * (double)T * (double)T * 4;
    ck_assert_msg((double)(st.peak - st0.in_use) < tt, "peak %llu bytes >= a [1,2,T,T] f32 buffer (%.0f)",
                  (unsigned long long)(st.peak - st0.in_use), tt);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    free(x);
}
END_TEST

/* ------------------------------------------------------------ bad input */
START_TEST(bad_input)
{
    int64_t s4[4] = { 1, 2, 3, 4 }, s4b[4] = { 1, 2, 5, 4 }, s4d[4] = { 1, 2, 5, 8 }, s3[3] = { 2, 3, 4 };
    int64_t sm[2] = { 3, 5 }, smbad[2] = { 4, 5 };
    ctpu_tensor q = ctpu_zeros(CTPU_F32, 4, s4), k = ctpu_zeros(CTPU_F32, 4, s4b), v = ctpu_zeros(CTPU_F32, 4, s4b);
    ctpu_tensor q3 = ctpu_zeros(CTPU_F32, 3, s3), kd = ctpu_zeros(CTPU_F32, 4, s4d);
    ctpu_tensor kb = ctpu_zeros(CTPU_BF16, 4, s4b), qi = ctpu_zeros(CTPU_I32, 4, s4);
    ctpu_tensor m = ctpu_zeros(CTPU_F32, 2, sm), mbad = ctpu_zeros(CTPU_F32, 2, smbad), mb = ctpu_zeros(CTPU_BF16, 2, sm);
    /* good */
    ctpu_tensor o = ctpu_scaled_dot_product_attention(q, k, v, m, CTPU_MASK_ADDITIVE, false, 0, 0);
    ck_assert_msg(!ctpu_is_null(o), "%s", ctpu_last_error());
    struct { ctpu_tensor q, k, v, m; int kind; double scale, p; ctpu_status st; const char *msg; } bad[] = {
        { q3, k, v, CTPU_NULL, CTPU_MASK_NONE, 0, 0, CTPU_ERR_SHAPE, "need 4-D" },
        { q, kd, kd, CTPU_NULL, CTPU_MASK_NONE, 0, 0, CTPU_ERR_SHAPE, "k is f32[1,2,5,8]" },
        { q, k, kd, CTPU_NULL, CTPU_MASK_NONE, 0, 0, CTPU_ERR_SHAPE, "v is f32[1,2,5,8]" },
        { q, kb, v, CTPU_NULL, CTPU_MASK_NONE, 0, 0, CTPU_ERR_DTYPE, "one dtype" },
        { qi, k, v, CTPU_NULL, CTPU_MASK_NONE, 0, 0, CTPU_ERR_DTYPE, "one dtype" },
        { q, k, v, mbad, CTPU_MASK_ADDITIVE, 0, 0, CTPU_ERR_SHAPE, "must broadcast to [1,2,3,5]" },
        { q, k, v, mb, CTPU_MASK_KEEP01, 0, 0, CTPU_ERR_DTYPE, "mask is bf16[3,5]" },
        { q, k, v, m, CTPU_MASK_NONE, 0, 0, CTPU_ERR_INVALID_ARG, "with mask_kind CTPU_MASK_NONE" },
        { q, k, v, m, 7, 0, 0, CTPU_ERR_INVALID_ARG, "mask_kind=7" },
        { q, k, v, CTPU_NULL, CTPU_MASK_ADDITIVE, 0, 0, CTPU_ERR_INVALID_ARG, "needs a mask (CTPU_NULL was given)" },
        { q, k, v, m, -1, 0, 0, CTPU_ERR_INVALID_ARG, "mask_kind=-1" },
        { q, k, v, CTPU_NULL, CTPU_MASK_NONE, 0, 1.0, CTPU_ERR_INVALID_ARG, "dropout_p=1 must be in [0, 1)" },
        { q, k, v, CTPU_NULL, CTPU_MASK_NONE, 0, -0.1, CTPU_ERR_INVALID_ARG, "dropout_p=-0.1" },
        { q, k, v, CTPU_NULL, CTPU_MASK_NONE, 0, NAN, CTPU_ERR_INVALID_ARG, "dropout_p=nan" },
        { q, k, v, CTPU_NULL, CTPU_MASK_NONE, INFINITY, 0, CTPU_ERR_INVALID_ARG, "scale=inf" },
        { q, k, v, CTPU_NULL, CTPU_MASK_NONE, -INFINITY, 0, CTPU_ERR_INVALID_ARG, "scale=-inf" },
        { q, k, v, CTPU_NULL, CTPU_MASK_NONE, NAN, 0, CTPU_ERR_INVALID_ARG, "scale=nan" },
        /* finite as a double, inf as the kernel's f32 (every score was inf or NaN) */
        { q, k, v, CTPU_NULL, CTPU_MASK_NONE, -1e39, 0, CTPU_ERR_INVALID_ARG, "scale=-1e+39 must be finite as an f32" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ctpu_clear_error();
        ctpu_tensor r = ctpu_scaled_dot_product_attention(bad[i].q, bad[i].k, bad[i].v, bad[i].m,
                                                          (ctpu_mask_kind)bad[i].kind, false, bad[i].scale, bad[i].p);
        ck_assert_msg(ctpu_is_null(r), "case %zu: no error", i);
        ck_assert_msg(ctpu_last_status() == bad[i].st, "case %zu: status %d: %s", i, ctpu_last_status(), ctpu_last_error());
        ck_assert_msg(t_contains(ctpu_last_error(), bad[i].msg), "case %zu: '%s' lacks '%s'", i, ctpu_last_error(),
                      bad[i].msg);
        ck_assert_msg(t_contains(ctpu_last_error(), "scaled_dot_product_attention: "), "case %zu: %s", i,
                      ctpu_last_error());
        ck_assert_msg(!strchr(ctpu_last_error(), '\n'), "case %zu: not one line", i);
    }
    /* CTPU_NULL for q: CTPU_NULL back, as every op (an error handle: tests/test_provenance.c) */
    ctpu_clear_error();
    ck_assert(ctpu_is_null(ctpu_scaled_dot_product_attention(CTPU_NULL, k, v, CTPU_NULL, CTPU_MASK_NONE, false, 0, 0)));
    /* the mask's gradient is not computed: an error, not a silent zero */
    ctpu_tensor mg = ctpu_zeros(CTPU_F32, 2, sm);
    ck_assert_int_eq(ctpu_set_requires_grad(mg, true), CTPU_OK);
    ck_assert_int_eq(ctpu_set_requires_grad(q, true), CTPU_OK);
    ctpu_tensor y = ctpu_scaled_dot_product_attention(q, k, v, mg, CTPU_MASK_ADDITIVE, false, 0, 0);
    ck_assert(ctpu_backward(ctpu_sum(y, 0, NULL, false)) != CTPU_OK);
    ck_assert_msg(t_contains(ctpu_last_error(), "the mask (f32[3,5]) requires grad"), "%s", ctpu_last_error());
    /* a negative scale is allowed (torch too): softmax(-q k^T / 2) v */
    ck_assert(!ctpu_is_null(ctpu_scaled_dot_product_attention(q, k, v, CTPU_NULL, CTPU_MASK_NONE, false, -0.5, 0)));
}
END_TEST

/* ------------------------------------------------------------ bad input, every mode
 * Each refusal in strict eager, debug eager, defer and fuse and inside a
 * compiled step's fn (the call fails with fn's error): the same status and
 * one-line message naming the op, the argument and the shapes; the
 * generator does not move; nothing is left allocated; the next good call
 * works. The shapes too large to make on the host are pending values of a
 * trace (defer and fuse, a capture): dropout over more than the element
 * cap's probabilities was an int64 overflow (the generator advanced by the
 * wrapped count) and is an error at the call. */
typedef struct { int q, k, v, m, kind; bool causal; double scale, p; ctpu_status st; const char *msg; } bad_case;
static const bad_case *bad_now;
static ctpu_tensor bad_ts[8];
static ctpu_tensor bad_call(void)
{
    const bad_case *b = bad_now;
    return ctpu_scaled_dot_product_attention(bad_ts[b->q], bad_ts[b->k], bad_ts[b->v], b->m < 0 ? CTPU_NULL : bad_ts[b->m],
                                             (ctpu_mask_kind)b->kind, b->causal, b->scale, b->p);
}
static void bad_inputs(bool huge);
static ctpu_status bad_step(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx, (void)in, (void)sc;
    bad_inputs(true);   /* recorded into the capture: the [1,1,3*2^30,1] is pending */
    out[0] = bad_call();
    return ctpu_is_null(out[0]) ? ctpu_last_status() : CTPU_OK;
}
static void bad_inputs(bool huge)
{
    const int64_t s4[4] = { 1, 2, 3, 4 }, sk[4] = { 1, 2, 5, 4 }, s5[5] = { 1, 1, 2, 3, 5 }, sm[2] = { 3, 5 };
    const int64_t one[4] = { 1, 1, 1, 1 }, sh[4] = { 1, 1, INT64_C(3) << 30, 1 };   /* 6 GiB of bf16, never made */
    bad_ts[0] = ctpu_zeros(CTPU_F32, 4, s4);
    bad_ts[1] = ctpu_zeros(CTPU_F32, 4, sk);
    bad_ts[2] = ctpu_zeros(CTPU_F32, 5, s5);
    bad_ts[3] = ctpu_zeros(CTPU_I32, 2, sm);
    bad_ts[4] = ctpu_zeros(CTPU_F32, 2, sm);
    bad_ts[5] = huge ? ctpu_expand(ctpu_zeros(CTPU_BF16, 4, one), 4, sh) : bad_ts[0];
}
START_TEST(bad_input_every_mode)
{
    static const bad_case cases[] = {
        { 0, 1, 1, 2, CTPU_MASK_ADDITIVE, false, 0, 0, CTPU_ERR_SHAPE, "mask is f32[1,1,2,3,5], q is f32[1,2,3,4], k is f32[1,2,5,4]: the mask must broadcast to [1,2,3,5]" },
        { 0, 1, 1, 3, CTPU_MASK_KEEP01, false, 0, 0, CTPU_ERR_DTYPE, "mask is i32[3,5]: need f32" },
        { 0, 1, 1, 4, CTPU_MASK_ADDITIVE, true, 1e39, 0, CTPU_ERR_INVALID_ARG, "scale=1e+39 must be finite as an f32" },
        { 0, 1, 1, -1, CTPU_MASK_NONE, false, 0, 1.5, CTPU_ERR_INVALID_ARG, "dropout_p=1.5 must be in [0, 1)" },
        { 0, 0, 1, -1, CTPU_MASK_NONE, false, 0, 0, CTPU_ERR_SHAPE, "q is f32[1,2,3,4], k is f32[1,2,3,4], v is f32[1,2,5,4]" },
        { 5, 5, 5, -1, CTPU_MASK_NONE, false, 0, 0.1, CTPU_ERR_SHAPE,
          "q is bf16[1,1,3221225472,1], k is bf16[1,1,3221225472,1]: dropout_p=0.1 draws B*H*Tq*Tk = 3221225472 * 3221225472 numbers, past the 2^56 element cap" },
    };
    static const ctpu_mode modes[] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    for (int m = 0; m < 4; m++) {
        bool huge = m >= 2;   /* a pending [1,1,3*2^30,1]: only a trace holds one (its product 2^63.2 overflowed) */
        ck_assert_int_eq(ctpu_set_mode(m < 3 ? modes[m] : CTPU_MODE_STRICT), CTPU_OK);
        ck_assert_int_eq(ctpu_sync(), CTPU_OK);
        ctpu_hbm_stats h0, h1;
        ck_assert_int_eq(ctpu_hbm_get_stats(&h0), CTPU_OK);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            if (cases[i].q == 5 && !huge) continue;
            uint64_t s0, o0, s1, o1;
            ck_assert_int_eq(ctpu_rng_get_state(&s0, &o0), CTPU_OK);
            ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
            bad_now = &cases[i];
            ctpu_status st;
            if (m < 3) {
                bad_inputs(huge);
                ctpu_clear_error();
                st = ctpu_is_null(bad_call()) ? ctpu_last_status() : CTPU_OK;
            } else {   /* fn makes the inputs */
                ctpu_compiled *c = ctpu_compile(bad_step, NULL, NULL);
                ck_assert_ptr_nonnull(c);
                ctpu_tensor out = CTPU_NULL;
                st = ctpu_compiled_call(c, 0, NULL, 0, NULL, 1, &out);
                ctpu_compiled_free(c);
            }
            const char *e = ctpu_last_error();
            ck_assert_msg(st == cases[i].st, "mode %d case %zu: status %d: %s", m, i, st, e);
            ck_assert_msg(t_contains(e, cases[i].msg), "mode %d case %zu: '%s' lacks '%s'", m, i, e, cases[i].msg);
            ck_assert_msg(t_contains(e, "scaled_dot_product_attention: ") && !strchr(e, '\n'), "mode %d case %zu: %s", m,
                          i, e);
            ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
            ck_assert_int_eq(ctpu_rng_get_state(&s1, &o1), CTPU_OK);
            ck_assert_msg(s1 == s0 && o1 == o0, "mode %d case %zu: the generator moved (offset %llu -> %llu)", m, i,
                          (unsigned long long)o0, (unsigned long long)o1);
        }
        ck_assert_int_eq(ctpu_sync(), CTPU_OK);
        ck_assert_int_eq(ctpu_hbm_get_stats(&h1), CTPU_OK);
        ck_assert_msg(h1.in_use == h0.in_use, "mode %d: %llu bytes left in use", m,
                      (unsigned long long)(h1.in_use - h0.in_use));
        /* still usable: a good call */
        ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
        bad_inputs(false);
        float *o = t_read(ctpu_scaled_dot_product_attention(bad_ts[0], bad_ts[1], bad_ts[1], bad_ts[4], CTPU_MASK_ADDITIVE,
                                                            true, -2.0, 0.25), NULL);
        free(o);
        ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    }
    /* the mask's gradient is refused at the backward in every mode, naming the mask's shape */
    for (int m = 0; m < 3; m++) {
        ck_assert_int_eq(ctpu_set_mode(modes[m]), CTPU_OK);
        ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
        bad_inputs(false);
        ck_assert_int_eq(ctpu_set_requires_grad(bad_ts[4], true), CTPU_OK);
        ck_assert_int_eq(ctpu_set_requires_grad(bad_ts[0], true), CTPU_OK);
        ctpu_tensor y = ctpu_scaled_dot_product_attention(bad_ts[0], bad_ts[1], bad_ts[1], bad_ts[4], CTPU_MASK_ADDITIVE,
                                                          false, 0, 0);
        ck_assert(ctpu_backward(ctpu_sum(y, 0, NULL, false)) == CTPU_ERR_STATE);
        ck_assert_msg(t_contains(ctpu_last_error(), "scaled_dot_product_attention: the mask (f32[3,5]) requires grad"),
                      "mode %d: %s", m, ctpu_last_error());
        ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
}
END_TEST

/* ------------------------------------------------------------ NaN at a dropped key
 * docs/CONTRACTS.md "Attention": a NaN in a dropped key's v row reaches
 * every query of a block pair that computes it (P = 0 times NaN on the
 * MXU), one in its k row not where KEEP01 or is_causal set the score to
 * -inf; under is_causal the key blocks wholly above the diagonal are
 * skipped (pytorch/pytorch#101967: torch's math path gives NaN for every
 * query). T = 300, the last key NaN; the same bits in every mode. */
static int nan_rows(ctpu_mode mode, bool in_v, bool keep01, float *first_row)
{
    enum { T = 300 };
    static float q[T * 2], k[T * 2], v[T * 2], m[T * T];
    for (int i = 0; i < T * 2; i++) { q[i] = (float)(i % 5) / 5; k[i] = (float)(i % 3) / 3; v[i] = (float)i / T; }
    for (int i = 0; i < T * T; i++) m[i] = i % T == T - 1 ? 0.0f : 1.0f;   /* KEEP01: every query drops key T-1 */
    (in_v ? v : k)[(T - 1) * 2] = NAN;
    ck_assert_int_eq(ctpu_set_mode(mode), CTPU_OK);
    const int64_t s4[4] = { 1, 1, T, 2 }, sm[2] = { T, T };
    ctpu_tensor o = ctpu_scaled_dot_product_attention(t_f32(q, 4, s4), t_f32(k, 4, s4), t_f32(v, 4, s4),
                                                      keep01 ? t_f32(m, 2, sm) : CTPU_NULL,
                                                      keep01 ? CTPU_MASK_KEEP01 : CTPU_MASK_NONE, !keep01, 0, 0);
    float *r = t_read(o, NULL);
    int n = 0;
    for (int i = 0; i < T; i++) n += r[i * 2] != r[i * 2];
    memcpy(first_row, r, sizeof(float) * 2 * T);
    free(r);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    return n;
}
START_TEST(nan_at_a_dropped_key)
{
    static const ctpu_mode modes[] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    static const struct { bool in_v, keep01; int want; } cases[] = {
        { true, true, 300 },    /* v, dropped by KEEP01: every query */
        { false, true, 0 },     /* k, dropped by KEEP01: its score is -inf */
        { true, false, 44 },    /* v, causal: the queries of the diagonal block (256..299) */
        { false, false, 1 },    /* k, causal: only the one query that sees it */
    };
    static float o[3][600];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int m = 0; m < 3; m++) {
            int n = nan_rows(modes[m], cases[c].in_v, cases[c].keep01, o[m]);
            ck_assert_msg(n == cases[c].want, "case %zu mode %d: %d NaN rows, want %d", c, m, n, cases[c].want);
            for (int i = 0; i < 600 && m > 0; i++) ck_assert(t_same(o[m][i], o[0][i]));
        }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("sdpa");
    TCase *tc = tcase_create("sdpa");
    tcase_add_checked_fixture(tc, t_setup, t_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, vs_float64, 0, N_CASES);
    tcase_add_test(tc, dropout_vs_composition);
    tcase_add_test(tc, reference_gradient_fd);
    tcase_add_test(tc, mode_parity);
    tcase_add_test(tc, isa_and_thread_parity);
    tcase_add_test(tc, kernel_vs_ref);
    tcase_add_test(tc, kernel_vs_ref_causal_skips);
    tcase_add_test(tc, kernel_bthd_layout);
    tcase_add_test(tc, bthd_equals_permuted);
    tcase_add_test(tc, fully_masked_row_is_zero);
    tcase_add_test(tc, no_score_buffer);
    tcase_add_test(tc, bad_input);
    tcase_add_test(tc, bad_input_every_mode);
    tcase_add_test(tc, nan_at_a_dropped_key);
    suite_add_tcase(s, tc);
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
