/* Defer and fuse: parity with strict eager (every op, chains, random
 * programs, a training step), cache behaviour with exact counts, loop
 * detection, memory. */
#include "t_core.h"
#include "fuse/vm.h"
#include "ctpu_nn.h"

#include <unistd.h>

static int64_t C(const char *n) { return ctpu_metric_counter(n); }

/* host copy of any tensor as f32 values (i32 and bf16 converted) */
static float *host_f32(ctpu_tensor t, int64_t *n)
{
    int64_t k = ctpu_numel(t);
    ck_assert_msg(k >= 0, "numel: %s", ctpu_last_error());
    *n = k;
    float *out = malloc(sizeof(float) * (size_t)(k + 1));
    ctpu_dtype dt = ctpu_dtype_of(t);
    void *raw = malloc((size_t)(k + 1) * 4);
    ck_assert_msg(ctpu_to_host(t, raw, (size_t)(k + 1) * 4) == CTPU_OK, "to_host: %s", ctpu_last_error());
    for (int64_t i = 0; i < k; i++) {
        if (dt == CTPU_F32) out[i] = ((float *)raw)[i];
        else if (dt == CTPU_I32) out[i] = (float)((int32_t *)raw)[i];
        else { uint32_t u = (uint32_t)((uint16_t *)raw)[i] << 16; memcpy(&out[i], &u, 4); }
    }
    free(raw);
    return out;
}

static bool same_bits(const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (a[i] != a[i] && b[i] != b[i]) continue;   /* NaN as a class */
        if (memcmp(&a[i], &b[i], 4) != 0) return false;
    }
    return true;
}

/* ------------------------------------------------------------ every op */
/* The gradient of sum(f(t)) with respect to t (reaches the backward ops). */
static ctpu_tensor grad_of(ctpu_tensor t, ctpu_tensor (*f)(ctpu_tensor, ctpu_tensor), ctpu_tensor arg)
{
    ctpu_tensor leaf = ctpu_detach(t);
    ctpu_set_requires_grad(leaf, true);
    ctpu_tensor y = f(leaf, arg);
    ck_assert_int_eq(ctpu_backward(ctpu_sum(y, 0, NULL, false)), CTPU_OK);
    return ctpu_grad(leaf);
}
static ctpu_tensor f_slice(ctpu_tensor x, ctpu_tensor u) { (void)u; return ctpu_slice(x, 1, 1, 6, 2); }
static ctpu_tensor f_embed(ctpu_tensor w, ctpu_tensor idx) { return ctpu_embedding(w, idx); }
static ctpu_tensor f_gather(ctpu_tensor x, ctpu_tensor idx) { return ctpu_gather(x, 1, idx); }
static ctpu_tensor f_sdpa(ctpu_tensor x, ctpu_tensor m)
{
    int64_t s4[4] = { 1, 1, 5, 7 };
    ctpu_tensor q = ctpu_reshape(x, 4, s4);
    return ctpu_scaled_dot_product_attention(q, ctpu_mul_scalar(q, -0.7), q, ctpu_gt_scalar(ctpu_slice(m, 0, 0, 5, 1), 0), CTPU_MASK_KEEP01,
                                             false, 0.3, 0.1);
}

/* Apply op to fixed inputs: x [5,7] f32 (with NaN/Inf/-0), y [7] f32, w
 * [7,3], idx i32. Every row of the op table must have a case. */
static ctpu_tensor apply_op(int op, ctpu_tensor x, ctpu_tensor y, ctpu_tensor w, ctpu_tensor idx)
{
    int d1[1] = { 1 }, d0[1] = { 0 };
    int perm[2] = { 1, 0 };
    int64_t shp[2] = { 7, 5 }, ex[3] = { 2, 5, 7 };
    ctpu_tensor cat[3] = { x, x, x };
    switch (op) {
    case CTPU_OP_NEG: return ctpu_neg(x);
    case CTPU_OP_ABS: return ctpu_abs(x);
    case CTPU_OP_EXP: return ctpu_exp(x);
    case CTPU_OP_LOG: return ctpu_log(x);
    case CTPU_OP_SQRT: return ctpu_sqrt(x);
    case CTPU_OP_RSQRT: return ctpu_rsqrt(x);
    case CTPU_OP_TANH: return ctpu_tanh(x);
    case CTPU_OP_SIGMOID: return ctpu_sigmoid(x);
    case CTPU_OP_RELU: return ctpu_relu(x);
    case CTPU_OP_GELU_TANH: return ctpu_gelu(x, true);
    case CTPU_OP_GELU_ERF: return ctpu_gelu(x, false);
    case CTPU_OP_SOFTPLUS: return ctpu_softplus(x);
    case CTPU_OP_ERF: return ctpu_erf(x);
    case CTPU_OP_SIN: return ctpu_sin(x);
    case CTPU_OP_COS: return ctpu_cos(x);
    case CTPU_OP_LOG1P: return ctpu_log1p(x);
    case CTPU_OP_EXPM1: return ctpu_expm1(x);
    case CTPU_OP_ADD: return ctpu_add(x, y);
    case CTPU_OP_SUB: return ctpu_sub(x, y);
    case CTPU_OP_MUL: return ctpu_mul(x, y);
    case CTPU_OP_DIV: return ctpu_div(x, y);
    case CTPU_OP_POW: return ctpu_pow(ctpu_abs(x), y);
    case CTPU_OP_MAXIMUM: return ctpu_maximum(x, y);
    case CTPU_OP_MINIMUM: return ctpu_minimum(x, y);
    case CTPU_OP_EQ: return ctpu_eq(x, y);
    case CTPU_OP_NE: return ctpu_ne(x, y);
    case CTPU_OP_LT: return ctpu_lt(x, y);
    case CTPU_OP_LE: return ctpu_le(x, y);
    case CTPU_OP_GT: return ctpu_gt(x, y);
    case CTPU_OP_GE: return ctpu_ge(x, y);
    case CTPU_OP_ADD_SCALAR: return ctpu_add_scalar(x, 0.3);
    case CTPU_OP_SUB_SCALAR: return ctpu_rsub_scalar(x, 0.3);
    case CTPU_OP_MUL_SCALAR: return ctpu_mul_scalar(x, -1.7);
    case CTPU_OP_DIV_SCALAR: return ctpu_rdiv_scalar(x, 3.0);
    case CTPU_OP_POW_SCALAR: return ctpu_pow_scalar(x, 2.5);
    case CTPU_OP_MAXIMUM_SCALAR: return ctpu_maximum_scalar(x, 0.1);
    case CTPU_OP_MINIMUM_SCALAR: return ctpu_minimum_scalar(x, 0.1);
    case CTPU_OP_EQ_SCALAR: return ctpu_eq_scalar(x, 0.0);
    case CTPU_OP_NE_SCALAR: return ctpu_ne_scalar(x, 0.0);
    case CTPU_OP_LT_SCALAR: return ctpu_lt_scalar(x, 0.5);
    case CTPU_OP_LE_SCALAR: return ctpu_le_scalar(x, 0.5);
    case CTPU_OP_GT_SCALAR: return ctpu_gt_scalar(x, 0.5);
    case CTPU_OP_GE_SCALAR: return ctpu_ge_scalar(x, 0.5);
    case CTPU_OP_WHERE: return ctpu_where(ctpu_gt_scalar(x, 0), x, y);
    case CTPU_OP_CLAMP: return ctpu_clamp(x, -0.5, 0.75);
    case CTPU_OP_CAST: return ctpu_cast(ctpu_cast(x, CTPU_BF16), CTPU_F32);
    case CTPU_OP_SUM: return ctpu_sum(x, 1, d1, false);
    case CTPU_OP_MEAN: return ctpu_mean(x, 1, d0, true);
    case CTPU_OP_MAX: return ctpu_max(x, 1, d1, false);
    case CTPU_OP_MIN: return ctpu_min(x, 0, NULL, false);
    case CTPU_OP_VAR: return ctpu_var(x, 1, d1, 1, false);
    case CTPU_OP_ARGMAX: return ctpu_argmax(x, 1, false);
    case CTPU_OP_ARGMIN: return ctpu_argmin(x, 0, true);
    case CTPU_OP_PROD: return ctpu_prod(ctpu_add_scalar(ctpu_tanh(x), 1.0), 1, d1, false);
    case CTPU_OP_CUMSUM: return ctpu_cumsum(ctpu_exp(x), 1);
    case CTPU_OP_SOFTMAX: return ctpu_softmax(x, 1);
    case CTPU_OP_LOG_SOFTMAX: return ctpu_log_softmax(x, 0);
    case CTPU_OP_RESHAPE: return ctpu_reshape(ctpu_exp(x), 2, shp);
    case CTPU_OP_PERMUTE: return ctpu_permute(x, perm);
    case CTPU_OP_SLICE: return ctpu_slice(x, 1, 1, 6, 2);
    case CTPU_OP_CONCAT: return ctpu_concat(3, cat, 1);
    case CTPU_OP_EXPAND: return ctpu_expand(y, 3, ex);
    case CTPU_OP_EMBEDDING: return ctpu_embedding(w, idx);
    case CTPU_OP_GATHER: return ctpu_gather(x, 1, ctpu_reshape(ctpu_slice(ctpu_concat(3, (ctpu_tensor[]){ idx, idx, idx }, 0), 0, 0, 5, 1), 2, (int64_t[]){ 5, 1 }));
    case CTPU_OP_SCATTER_ADD: {
        int32_t si[14] = { 0, 4, 1, 1, 2, 3, 0, 4, 4, 4, 0, 2, 1, 3 };
        ctpu_tensor ix = ctpu_from_host(si, CTPU_I32, 2, (int64_t[]){ 2, 7 });
        return ctpu_scatter_add(ctpu_tanh(x), 0, ix, ctpu_exp(ctpu_slice(x, 0, 1, 3, 1)));
    }
    case CTPU_OP_MATMUL: return ctpu_matmul(x, w);
    case CTPU_OP_SDPA: {
        /* q = x (NaN/Inf rows), k = tanh(x), v = x * 0.5; an additive mask y broadcast over rows; causal; dropout */
        int64_t s4[4] = { 1, 1, 5, 7 };
        ctpu_tensor q = ctpu_reshape(x, 4, s4), k = ctpu_reshape(ctpu_tanh(x), 4, s4);
        return ctpu_scaled_dot_product_attention(q, k, ctpu_mul_scalar(q, 0.5), ctpu_slice(y, 0, 2, 7, 1),
                                                 CTPU_MASK_ADDITIVE, true, 0, 0.2);
    }
    case CTPU_OP_SDPA_BACKWARD: return grad_of(ctpu_tanh(x), f_sdpa, y);
    case CTPU_OP_COPY: { ctpu_tensor z = ctpu_zeros(CTPU_F32, 2, (int64_t[]){ 5, 7 }); ctpu_assign(z, ctpu_tanh(x)); return z; }
    case CTPU_OP_FULL: return ctpu_full(CTPU_BF16, 2, (int64_t[]){ 3, 3 }, 1.3);
    case CTPU_OP_ARANGE: return ctpu_arange(-2, 5, 0.7, CTPU_F32);
    case CTPU_OP_RAND_UNIFORM: return ctpu_rand_uniform(CTPU_F32, 1, (int64_t[]){ 100 }, -1, 2);
    case CTPU_OP_RAND_NORMAL: return ctpu_rand_normal(CTPU_BF16, 1, (int64_t[]){ 100 }, 1, 2);
    case CTPU_OP_RAND_INT: return ctpu_add(ctpu_randint(CTPU_I32, 1, (int64_t[]){ 100 }, -5, 1000), ctpu_randint(CTPU_F32, 1, (int64_t[]){ 100 }, 0, 7));
    case CTPU_OP_SLICE_BACKWARD: return grad_of(ctpu_exp(x), f_slice, x);
    case CTPU_OP_EMBEDDING_BACKWARD: return grad_of(w, f_embed, ctpu_concat(2, (ctpu_tensor[]){ idx, idx }, 0));
    case CTPU_OP_GATHER_BACKWARD: {
        int32_t gi[10] = { 0, 6, 1, 1, 2, 5, 3, 3, 4, 0 };
        ctpu_tensor g = ctpu_from_host(gi, CTPU_I32, 2, (int64_t[]){ 5, 2 });
        return grad_of(ctpu_tanh(x), f_gather, g);
    }
    /* a world of one rank: the collectives inside a computation (and, in
     * defer and fuse, the cut after each) */
    case CTPU_OP_ALL_REDUCE: return ctpu_add_scalar(ctpu_all_reduce(ctpu_exp(x), CTPU_DIST_MEAN), 1);
    case CTPU_OP_BROADCAST: return ctpu_mul(ctpu_broadcast(ctpu_tanh(x), 0), x);
    case CTPU_OP_ALL_GATHER: return ctpu_all_gather(ctpu_relu(x), 1);
    case CTPU_OP_REDUCE_SCATTER: return ctpu_reduce_scatter(ctpu_mul(x, x), 0, CTPU_DIST_SUM);
    default: return CTPU_NULL;
    }
}

static float *run_op(ctpu_mode m, int op, int64_t *n)
{
    ctpu_set_mode(m);
    ctpu_manual_seed(11);
    ctpu_scope_begin();
    float xs[35];
    for (int i = 0; i < 35; i++) xs[i] = sinf((float)i * 1.3f) * (float)(i % 5 + 1);
    xs[3] = NAN; xs[9] = INFINITY; xs[10] = -0.0f; xs[20] = -INFINITY;
    float ys[7] = { 0.5f, -1.25f, 2.0f, 0.0f, 3.5f, -0.75f, 1.0f };
    float ws[21];
    for (int i = 0; i < 21; i++) ws[i] = cosf((float)i) * 0.5f;
    int32_t is[4] = { 0, 2, 6, 1 };
    ctpu_tensor x = ctpu_from_host(xs, CTPU_F32, 2, (int64_t[]){ 5, 7 });
    ctpu_tensor y = ctpu_from_host(ys, CTPU_F32, 1, (int64_t[]){ 7 });
    ctpu_tensor w = ctpu_from_host(ws, CTPU_F32, 2, (int64_t[]){ 7, 3 });
    ctpu_tensor idx = ctpu_from_host(is, CTPU_I32, 1, (int64_t[]){ 4 });
    ctpu_tensor r = apply_op(op, x, y, w, idx);
    ck_assert_msg(!ctpu_is_null(r), "op %s: %s", ctpu_op_name(op), ctpu_last_error());
    float *h = host_f32(r, n);
    ctpu_scope_end();
    ctpu_set_mode(CTPU_MODE_STRICT);
    return h;
}

START_TEST(every_op_parity)
{
    ctpu_set_debug_checks(false);   /* the inputs hold NaN on purpose */
    for (int op = 0; op < CTPU_OP_COUNT; op++) {
        int64_t n1, n2, n3;
        float *a = run_op(CTPU_MODE_STRICT, op, &n1);
        float *b = run_op(CTPU_MODE_DEFER_FUSE, op, &n2);
        float *c = run_op(CTPU_MODE_DEBUG, op, &n3);
        ck_assert_int_eq(n1, n2);
        ck_assert_int_eq(n1, n3);
        ck_assert_msg(same_bits(a, b, n1), "op %s: defer-and-fuse differs from strict", ctpu_op_name(op));
        ck_assert_msg(same_bits(a, c, n1), "op %s: debug differs from strict", ctpu_op_name(op));
        free(a);
        free(b);
        free(c);
    }
}
END_TEST

/* ------------------------------------------------------------ chains and random programs */
static uint64_t rng_state;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* A random elementwise/reduction program over a few shapes with broadcasts,
 * bf16 values, 0-size dims and reductions, with random host reads. */
static void random_program(uint64_t seed, ctpu_mode m, float **out, int64_t *n)
{
    ctpu_set_mode(m);
    rng_state = seed;
    ctpu_scope_begin();
    int64_t R = 1 + rnd() % 9, Ccols = (rnd() % 4 == 0) ? 0 : 1 + rnd() % 40;
    int64_t sh[2] = { R, Ccols };
    float *buf = malloc(sizeof(float) * (size_t)(R * Ccols + 1));
    for (int64_t i = 0; i < R * Ccols; i++) buf[i] = (float)((int)(rnd() % 2001) - 1000) / 250.0f;
    ctpu_tensor pool[16];
    int np = 0;
    pool[np++] = ctpu_from_host(buf, CTPU_F32, 2, sh);
    pool[np++] = ctpu_from_host(buf, CTPU_F32, 1, &sh[1]);      /* row vector: broadcasts */
    free(buf);
    pool[np++] = ctpu_cast(pool[0], CTPU_BF16);
    int steps = 6 + (int)(rnd() % 12);
    for (int s = 0; s < steps; s++) {
        ctpu_tensor a = pool[rnd() % (unsigned)np], b = pool[rnd() % (unsigned)np], r;
        switch (rnd() % 14) {
        case 0: r = ctpu_add(a, b); break;
        case 1: r = ctpu_mul(a, b); break;
        case 2: r = ctpu_sub(a, b); break;
        case 3: r = ctpu_tanh(a); break;
        case 4: r = ctpu_exp(ctpu_mul_scalar(a, 0.1)); break;
        case 5: r = ctpu_maximum(a, b); break;
        case 6: r = ctpu_where(ctpu_gt(a, b), a, b); break;
        case 7: r = ctpu_sigmoid(a); break;
        case 8: r = ctpu_div(a, ctpu_add_scalar(ctpu_abs(b), 1.0)); break;
        case 9: r = ctpu_gelu(a, rnd() % 2); break;
        case 10: { int d = (int)(rnd() % 2); r = ctpu_ndim(a) == 2 ? ctpu_sum(a, 1, &d, true) : ctpu_sum(a, 0, NULL, false); break; }
        case 11: r = ctpu_clamp(a, -1.0, 2.0); break;
        case 12: r = ctpu_sqrt(ctpu_abs(a)); break;
        default: {
            /* a host read mid-program cuts the trace */
            double v;
            ctpu_tensor s1 = ctpu_sum(a, 0, NULL, false);
            ck_assert_int_eq(ctpu_item(s1, &v), CTPU_OK);
            r = ctpu_add_scalar(a, v * 1e-3);
        }
        }
        ck_assert_msg(!ctpu_is_null(r), "random program %llu: %s", (unsigned long long)seed, ctpu_last_error());
        if (np < 16) pool[np++] = r; else pool[rnd() % 16] = r;
    }
    /* everything still referenced is compared */
    int64_t total = 0;
    float *all = NULL;
    for (int i = 0; i < np; i++) {
        int64_t k;
        float *h = host_f32(pool[i], &k);
        all = realloc(all, sizeof(float) * (size_t)(total + k + 1));
        memcpy(all + total, h, sizeof(float) * (size_t)k);
        total += k;
        free(h);
    }
    ctpu_scope_end();
    ctpu_set_mode(CTPU_MODE_STRICT);
    *out = all;
    *n = total;
}

START_TEST(random_programs_parity)
{
    for (uint64_t seed = 1; seed <= 120; seed++) {
        float *a, *b;
        int64_t na, nb;
        random_program(seed, CTPU_MODE_STRICT, &a, &na);
        random_program(seed, CTPU_MODE_DEFER_FUSE, &b, &nb);
        ck_assert_int_eq(na, nb);
        ck_assert_msg(same_bits(a, b, na), "random program %llu differs", (unsigned long long)seed);
        free(a);
        free(b);
    }
    /* fusion actually happened: fewer steps than recorded ops */
    ck_assert_int_lt(C("fused_program_steps"), C("ops_recorded"));
}
END_TEST

/* ------------------------------------------------------------ a training step */
typedef struct { ctpu_tensor w1, b1, w2, b2, m[4], v[4]; } mlp;

static void mlp_init(mlp *p, int in, int hid, int out)
{
    ctpu_manual_seed(3);
    p->w1 = ctpu_keep(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ in, hid }, 0, 0.1));
    p->b1 = ctpu_keep(ctpu_zeros(CTPU_F32, 1, (int64_t[]){ hid }));
    p->w2 = ctpu_keep(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ hid, out }, 0, 0.1));
    p->b2 = ctpu_keep(ctpu_zeros(CTPU_F32, 1, (int64_t[]){ out }));
    ctpu_tensor ps[4] = { p->w1, p->b1, p->w2, p->b2 };
    for (int i = 0; i < 4; i++) {
        ctpu_set_requires_grad(ps[i], true);
        int64_t s[8];
        int nd;
        ctpu_shape(ps[i], s, &nd);
        p->m[i] = ctpu_keep(ctpu_zeros(CTPU_F32, nd, s));
        p->v[i] = ctpu_keep(ctpu_zeros(CTPU_F32, nd, s));
    }
}

/* one AdamW-like step with a cosine learning rate (a runtime scalar);
 * returns the loss handle (kept) when want_loss */
static ctpu_tensor mlp_step(mlp *p, ctpu_tensor x, ctpu_tensor y, int step, int total, bool want_loss)
{
    ctpu_step_begin();
    ctpu_tensor h = ctpu_relu(ctpu_add(ctpu_matmul(x, p->w1), p->b1));
    ctpu_tensor o = ctpu_add(ctpu_matmul(h, p->w2), p->b2);
    ctpu_tensor d = ctpu_sub(o, y);
    ctpu_tensor loss = ctpu_mean(ctpu_mul(d, d), 0, NULL, false);
    ck_assert_msg(ctpu_backward(loss) == CTPU_OK, "backward: %s", ctpu_last_error());
    double lr = 1e-2 * 0.5 * (1 + cos(M_PI * step / total));
    ctpu_tensor ps[4] = { p->w1, p->b1, p->w2, p->b2 };
    ctpu_no_grad_begin();   /* the update: the parameters are leaves that require grad */
    for (int i = 0; i < 4; i++) {
        ctpu_tensor g = ctpu_grad(ps[i]);
        ck_assert(!ctpu_is_null(g));
        ctpu_assign(p->m[i], ctpu_add(ctpu_mul_scalar(p->m[i], 0.9), ctpu_mul_scalar(g, 0.1)));
        ctpu_assign(p->v[i], ctpu_add(ctpu_mul_scalar(p->v[i], 0.999), ctpu_mul_scalar(ctpu_mul(g, g), 0.001)));
        ctpu_tensor upd = ctpu_div(p->m[i], ctpu_add_scalar(ctpu_sqrt(p->v[i]), 1e-8));
        ctpu_assign(ps[i], ctpu_sub(ps[i], ctpu_mul_scalar(upd, lr)));
        ctpu_zero_grad(ps[i]);
    }
    ctpu_no_grad_end();
    ctpu_tensor kept = want_loss ? ctpu_keep(loss) : CTPU_NULL;
    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    return kept;
}

static void mlp_free(mlp *p)
{
    ctpu_tensor ps[4] = { p->w1, p->b1, p->w2, p->b2 };
    for (int i = 0; i < 4; i++) { ctpu_release(ps[i]); ctpu_release(p->m[i]); ctpu_release(p->v[i]); }
}

static void make_batch(int rows, int in, int out, int seed, ctpu_tensor *x, ctpu_tensor *y)
{
    float *xs = malloc(sizeof(float) * (size_t)(rows * in)), *ys = malloc(sizeof(float) * (size_t)(rows * out));
    for (int i = 0; i < rows * in; i++) xs[i] = sinf((float)(i * 7 + seed));
    for (int i = 0; i < rows * out; i++) ys[i] = cosf((float)(i * 3 + seed));
    *x = ctpu_from_host(xs, CTPU_F32, 2, (int64_t[]){ rows, in });
    *y = ctpu_from_host(ys, CTPU_F32, 2, (int64_t[]){ rows, out });
    free(xs);
    free(ys);
}

static void train(ctpu_mode m, int steps, float *losses, float *w_out)
{
    ctpu_set_mode(m);
    mlp p;
    mlp_init(&p, 20, 32, 4);
    ctpu_tensor x, y;
    make_batch(16, 20, 4, 1, &x, &y);
    for (int s = 0; s < steps; s++) {
        ctpu_tensor l = mlp_step(&p, x, y, s, steps, true);
        int64_t k;
        float *h = host_f32(l, &k);
        losses[s] = h[0];
        free(h);
        ctpu_release(l);
    }
    ck_assert_int_eq(ctpu_to_host(p.w1, w_out, 20 * 32 * 4), CTPU_OK);
    ctpu_release(x);
    ctpu_release(y);
    mlp_free(&p);
    ctpu_set_mode(CTPU_MODE_STRICT);
}

START_TEST(training_step_parity)
{
    float la[20], lb[20], lc[20], wa[640], wb[640], wc[640];
    train(CTPU_MODE_STRICT, 20, la, wa);
    train(CTPU_MODE_DEFER_FUSE, 20, lb, wb);
    train(CTPU_MODE_DEBUG, 20, lc, wc);
    ck_assert_msg(same_bits(la, lb, 20), "loss sequence differs in defer and fuse");
    ck_assert_msg(same_bits(wa, wb, 640), "weights differ in defer and fuse");
    ck_assert_msg(same_bits(la, lc, 20), "loss sequence differs in debug eager");
    ck_assert(lb[19] < lb[0]);
}
END_TEST

/* ------------------------------------------------------------ cache behaviour */
START_TEST(adamw_loop_compiles_once)
{
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    mlp p;
    mlp_init(&p, 12, 16, 3);
    ctpu_tensor x, y;
    make_batch(8, 12, 3, 2, &x, &y);
    ctpu_mark_step();                 /* parameters and batch materialised */
    mlp_step(&p, x, y, 0, 100, false);
    int64_t compiled = C("programs_compiled");
    for (int s = 1; s < 100; s++) mlp_step(&p, x, y, s, 100, false);
    ck_assert_int_eq(C("programs_compiled"), compiled);   /* the cosine lr is a runtime scalar */
    ck_assert_int_eq(C("recompiles"), 0);
    ctpu_cache_info ci;
    ck_assert_int_eq(ctpu_cache_get_info(&ci), CTPU_OK);
    ck_assert_uint_ge(ci.hits, 99);
    ctpu_release(x);
    ctpu_release(y);
    mlp_free(&p);
}
END_TEST

START_TEST(epoch_with_partial_batch)
{
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    mlp p;
    mlp_init(&p, 6, 8, 2);
    ctpu_tensor xb, yb, xs, ys;
    make_batch(128, 6, 2, 3, &xb, &yb);
    make_batch(96, 6, 2, 4, &xs, &ys);
    ctpu_mark_step();
    int64_t c0 = C("programs_compiled");
    for (int epoch = 0; epoch < 2; epoch++) {
        for (int b = 0; b < 468; b++) mlp_step(&p, xb, yb, b, 469, false);
        mlp_step(&p, xs, ys, 468, 469, false);
    }
    /* the step compiles twice per run (128 and 96), not per epoch */
    ck_assert_int_eq(C("programs_compiled") - c0, 2);
    ck_assert_int_eq(C("recompiles"), 1);
    char log[1024];
    ck_assert_int_eq(ctpu_cache_recompile_log(log, sizeof log), 1);
    ck_assert_msg(strstr(log, "dim 0: 128 -> 96") != NULL, "recompile reason: %s", log);
    ctpu_release(xb); ctpu_release(yb); ctpu_release(xs); ctpu_release(ys);
    mlp_free(&p);
}
END_TEST

static int64_t compiles_of(ctpu_tensor (*f)(ctpu_tensor, ctpu_tensor, ctpu_tensor), ctpu_tensor a,
                           ctpu_tensor b, ctpu_tensor c)
{
    int64_t c0 = C("programs_compiled");
    ctpu_step_begin();
    ctpu_tensor r = ctpu_keep(f(a, b, c));
    ctpu_step_end();
    ctpu_release(r);
    return C("programs_compiled") - c0;
}
static ctpu_tensor abc(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { return ctpu_add(ctpu_mul(a, b), c); }
static ctpu_tensor acb(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { return ctpu_add(ctpu_mul(a, c), b); }
static ctpu_tensor sum0(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)b; (void)c; int d = 0; return ctpu_sum(a, 1, &d, false); }
static ctpu_tensor sum1(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)b; (void)c; int d = 1; return ctpu_sum(a, 1, &d, false); }
static ctpu_tensor fxx(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)b; (void)c; return ctpu_mul(a, a); }
static ctpu_tensor fxy(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)c; return ctpu_mul(a, b); }

START_TEST(distinct_programs_get_distinct_entries)
{
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    /* Inputs are numbered by first use, so a*b+c and a*c+b over three
     * same-shaped tensors are one program bound two ways (a correct hit).
     * With c a row vector the wiring differs, and so must the entries. */
    int64_t s[2] = { 4, 4 }, row[2] = { 1, 4 };
    ctpu_tensor a = ctpu_keep(ctpu_full(CTPU_F32, 2, s, 2)), b = ctpu_keep(ctpu_full(CTPU_F32, 2, s, 3)),
                c = ctpu_keep(ctpu_full(CTPU_F32, 2, row, 5));
    ctpu_mark_step();
    ck_assert_int_eq(compiles_of(abc, a, b, c), 1);
    ck_assert_int_eq(compiles_of(acb, a, b, c), 1);   /* a*c+b is not a*b+c */
    ck_assert_int_eq(compiles_of(abc, a, b, c), 0);   /* hit */
    ck_assert_int_eq(compiles_of(sum0, a, b, c), 1);
    ck_assert_int_eq(compiles_of(sum1, a, b, c), 1);
    ck_assert_int_eq(compiles_of(fxx, a, b, c), 1);
    ck_assert_int_eq(compiles_of(fxy, a, b, c), 1);   /* f(x,x) is not f(x,y) */
    ck_assert_int_eq(compiles_of(fxy, b, a, c), 0);  /* same wiring, other buffers */
    ctpu_release(a); ctpu_release(b); ctpu_release(c);
}
END_TEST

START_TEST(host_read_every_step_bounded)
{
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    mlp p;
    mlp_init(&p, 12, 16, 3);
    ctpu_tensor x, y;
    make_batch(8, 12, 3, 5, &x, &y);
    ctpu_mark_step();
    for (int s = 0; s < 50; s++) {
        ctpu_tensor l = mlp_step(&p, x, y, s, 50, true);
        double v;
        ck_assert_int_eq(ctpu_item(l, &v), CTPU_OK);
        ctpu_release(l);
    }
    ck_assert_int_le(C("programs_compiled"), 6);
    ck_assert_int_ge(C("trace_cuts_mark_step"), 50);
    ctpu_release(x); ctpu_release(y);
    mlp_free(&p);
}
END_TEST

START_TEST(host_read_mid_step_cuts_trace)
{
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    ctpu_tensor a = ctpu_keep(ctpu_full(CTPU_F32, 1, (int64_t[]){ 8 }, 2));
    ctpu_mark_step();
    for (int s = 0; s < 10; s++) {
        ctpu_step_begin();
        ctpu_tensor t = ctpu_mul(a, a);
        double v;
        ck_assert_int_eq(ctpu_item(ctpu_sum(t, 0, NULL, false), &v), CTPU_OK);   /* read mid-step */
        ck_assert(v == 32.0);
        ctpu_assign(a, ctpu_sub(ctpu_mul_scalar(t, 0.5), ctpu_add_scalar(a, -2.0)));
        ctpu_step_end();
    }
    ck_assert_int_eq(C("trace_cuts_host_read"), 10);
    ck_assert_int_le(C("programs_compiled"), 3);
    ctpu_release(a);
}
END_TEST

START_TEST(cache_only_errors_on_new_shape)
{
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    ctpu_tensor a = ctpu_keep(ctpu_full(CTPU_F32, 1, (int64_t[]){ 8 }, 2));
    ctpu_tensor b = ctpu_keep(ctpu_full(CTPU_F32, 1, (int64_t[]){ 9 }, 2));
    ctpu_mark_step();
    ctpu_step_begin();
    ctpu_tensor r = ctpu_keep(ctpu_exp(a));
    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    ctpu_release(r);
    ck_assert_int_eq(ctpu_cache_set_only(true), CTPU_OK);
    ctpu_step_begin();
    r = ctpu_keep(ctpu_exp(a));                      /* same shape: a hit */
    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    ctpu_release(r);
    ctpu_step_begin();
    r = ctpu_keep(ctpu_exp(b));                      /* new shape: refused */
    ck_assert_int_eq(ctpu_step_end(), CTPU_ERR_CACHE_MISS);
    ck_assert_msg(strstr(ctpu_last_error(), "cache-only") != NULL, "%s", ctpu_last_error());
    float h[9];
    ck_assert_int_eq(ctpu_to_host(r, h, sizeof h), CTPU_ERR_CACHE_MISS);  /* the value carries it */
    ctpu_release(r);
    ctpu_cache_set_only(false);
    ctpu_step_begin();
    r = ctpu_keep(ctpu_exp(b));
    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);       /* usable again */
    ck_assert_int_eq(ctpu_to_host(r, h, sizeof h), CTPU_OK);
    ctpu_release(r);
    ctpu_release(a);
    ctpu_release(b);
}
END_TEST

START_TEST(lru_evictions_and_thrash)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("TORCH_TPU_CACHE_SIZE", "2", 1);
    setenv("TORCH_TPU_DEFER_AND_FUSE", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ctpu_tensor a = ctpu_keep(ctpu_full(CTPU_F32, 1, (int64_t[]){ 8 }, 2));
    ctpu_mark_step();
    int64_t c0 = C("programs_compiled");
    for (int round = 0; round < 2; round++) {
        for (int k = 1; k <= 3; k++) {             /* three programs through two entries */
            ctpu_step_begin();
            ctpu_tensor r = ctpu_keep(ctpu_mul_scalar(ctpu_slice(ctpu_exp(a), 0, 0, k, 1), 2));
            ctpu_step_end();
            ctpu_release(r);
        }
    }
    ctpu_cache_info ci;
    ctpu_cache_get_info(&ci);
    ck_assert_uint_eq(ci.entries, 2);
    ck_assert_int_eq(C("programs_compiled") - c0, 6);
    /* 5 evictions: the program that created `a` goes first, then 4 in the
     * cycle; the second round compiles 3 evicted keys again (thrash) */
    ck_assert_uint_eq(ci.evictions, 5);
    ck_assert_uint_eq(ci.thrash, 3);
    ck_assert_int_eq(C("cache_evictions"), 5);
    ctpu_release(a);
    unsetenv("TORCH_TPU_CACHE_SIZE");
    unsetenv("TORCH_TPU_DEFER_AND_FUSE");
}
END_TEST

static void unmarked_loop(ctpu_mode m, float *out)
{
    ctpu_set_mode(m);
    ctpu_tensor a = ctpu_keep(ctpu_full(CTPU_F32, 1, (int64_t[]){ 64 }, 0.5));
    ctpu_tensor b = ctpu_keep(ctpu_full(CTPU_F32, 1, (int64_t[]){ 64 }, 0.25));
    ctpu_sync();
    ctpu_metrics_clear();
    /* no mark_step, no scopes: the detector cuts once per iteration */
    for (int i = 0; i < 200; i++) {
        ctpu_tensor t = ctpu_tanh(ctpu_add(a, b));
        ctpu_tensor u = ctpu_mul_scalar(t, 0.5);
        ctpu_assign(a, ctpu_add(u, b));
        ctpu_release(t);
        ctpu_release(u);
    }
    ck_assert_int_eq(ctpu_to_host(a, out, 64 * 4), CTPU_OK);
    ctpu_release(a);
    ctpu_release(b);
}

START_TEST(unmarked_loop_cut_by_detector)
{
    float ref[64], got[64];
    unmarked_loop(CTPU_MODE_STRICT, ref);
    unmarked_loop(CTPU_MODE_DEFER_FUSE, got);
    ck_assert_int_ge(C("trace_cuts_loop_detector"), 150);
    ck_assert_int_le(C("programs_compiled"), 4);
    ck_assert(same_bits(ref, got, 64));
}
END_TEST

START_TEST(dropout_masks_differ_without_recompiling)
{
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    ctpu_tensor x = ctpu_keep(ctpu_ones(CTPU_F32, 1, (int64_t[]){ 256 }));
    ctpu_mark_step();
    float prev[256], cur[256];
    int64_t c1 = 0;
    for (int s = 0; s < 10; s++) {
        ctpu_step_begin();
        ctpu_tensor mask = ctpu_ge_scalar(ctpu_rand_uniform(CTPU_F32, 1, (int64_t[]){ 256 }, 0, 1), 0.5);
        ctpu_tensor y = ctpu_keep(ctpu_mul_scalar(ctpu_mul(x, mask), 2.0));
        ctpu_step_end();
        ck_assert_int_eq(ctpu_to_host(y, cur, sizeof cur), CTPU_OK);
        if (s == 1) c1 = C("programs_compiled");
        if (s > 0) ck_assert_msg(memcmp(prev, cur, sizeof cur) != 0, "the mask repeated at step %d", s);
        memcpy(prev, cur, sizeof cur);
        ctpu_release(y);
    }
    ck_assert_int_eq(C("programs_compiled"), c1);
    ctpu_release(x);
}
END_TEST

START_TEST(forced_hash_collisions_still_correct)
{
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    ctpu_cache_force_hash(ctpu__test_fused_cache(), true, 42);
    ctpu_tensor a = ctpu_keep(ctpu_full(CTPU_F32, 1, (int64_t[]){ 4 }, 3));
    ctpu_mark_step();
    float h[4];
    for (int k = 0; k < 3; k++) {
        ctpu_step_begin();
        ctpu_tensor r = ctpu_keep(k == 0 ? ctpu_exp(a) : k == 1 ? ctpu_neg(a) : ctpu_abs(ctpu_neg(a)));
        ctpu_step_end();
        ck_assert_int_eq(ctpu_to_host(r, h, sizeof h), CTPU_OK);
        float want = k == 0 ? expf(3) : k == 1 ? -3.0f : 3.0f;
        ck_assert_msg(fabsf(h[0] - want) <= 1e-5f * fabsf(want), "program %d gave %g", k, h[0]);
        ctpu_release(r);
    }
    uint64_t coll = ctpu_cache_collisions(ctpu__test_fused_cache());
    ck_assert_uint_gt(coll, 0);
    ctpu_cache_force_hash(ctpu__test_fused_cache(), false, 0);
    /* visible: the metrics counter, the "cache" object and the cache report */
    ck_assert_int_eq(ctpu_metric_counter("cache_collisions"), (int64_t)coll);
    char *doc = ctpu_metrics_json();
    ck_assert_ptr_nonnull(doc);
    ck_assert_ptr_nonnull(strstr(doc, "\"collisions\""));
    free(doc);
    char *rep = NULL;
    size_t rlen = 0;
    FILE *f = open_memstream(&rep, &rlen);
    ck_assert_int_eq(ctpu_cache_report(f), CTPU_OK);
    fclose(f);
    ck_assert_msg(strstr(rep, "hash collisions: ") && strstr(rep, "the full-key compare told them apart"), "%s", rep);
    free(rep);
    ctpu_release(a);
}
END_TEST

/* matmul -> +bias -> relu -> +residual is one step (the MXU epilogue), with
 * the same bits as strict eager */
static void epilogue_prog(ctpu_mode m, float *out)
{
    ctpu_set_mode(m);
    ctpu_manual_seed(9);
    ctpu_tensor x = ctpu_keep(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ 33, 17 }, 0, 1));
    ctpu_tensor w = ctpu_keep(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ 17, 29 }, 0, 1));
    ctpu_tensor b = ctpu_keep(ctpu_rand_normal(CTPU_F32, 1, (int64_t[]){ 29 }, 0, 1));
    ctpu_tensor r = ctpu_keep(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ 33, 29 }, 0, 1));
    ctpu_mark_step();
    int64_t s0 = C("fused_program_steps");
    ctpu_step_begin();
    ctpu_tensor y = ctpu_keep(ctpu_add(ctpu_gelu(ctpu_add(ctpu_matmul(x, w), b), true), r));
    ctpu_step_end();
    if (m == CTPU_MODE_DEFER_FUSE) ck_assert_int_eq(C("fused_program_steps") - s0, 1);
    ck_assert_int_eq(ctpu_to_host(y, out, 33 * 29 * 4), CTPU_OK);
    ctpu_release(x); ctpu_release(w); ctpu_release(b); ctpu_release(r); ctpu_release(y);
}

START_TEST(matmul_epilogue_fused_and_identical)
{
    float a[33 * 29], c[33 * 29];
    epilogue_prog(CTPU_MODE_STRICT, a);
    epilogue_prog(CTPU_MODE_DEFER_FUSE, c);
    ck_assert(same_bits(a, c, 33 * 29));
}
END_TEST

/* elementwise producers fused into a reduction over trailing dims: sum of
 * squares over rows longer than a chunk (4096), mean of a difference, max of
 * a bf16 chain; one step each, the same bits as strict eager */
static void reduce_prog(ctpu_mode m, float *out, int64_t *steps)
{
    ctpu_set_mode(m);
    ctpu_manual_seed(4);
    ctpu_tensor x = ctpu_keep(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ 3, 9000 }, 0, 1));
    ctpu_tensor y = ctpu_keep(ctpu_rand_normal(CTPU_F32, 3, (int64_t[]){ 4, 5, 7 }, 0, 1));
    ctpu_tensor z = ctpu_keep(ctpu_rand_normal(CTPU_BF16, 2, (int64_t[]){ 6, 50 }, 0, 1));
    ctpu_mark_step();
    int64_t s0 = C("fused_program_steps");
    int d1[1] = { 1 }, d12[2] = { 1, 2 };
    ctpu_step_begin();
    ctpu_tensor a = ctpu_keep(ctpu_sum(ctpu_mul(x, x), 1, d1, false));
    ctpu_tensor b = ctpu_keep(ctpu_mean(ctpu_sub(ctpu_exp(y), y), 2, d12, true));
    ctpu_tensor c = ctpu_keep(ctpu_max(ctpu_tanh(ctpu_add_scalar(z, 0.5)), 1, d1, false));
    ctpu_step_end();
    *steps = C("fused_program_steps") - s0;
    ck_assert_int_eq(ctpu_to_host(a, out, 3 * 4), CTPU_OK);
    ck_assert_int_eq(ctpu_to_host(b, out + 3, 4 * 4), CTPU_OK);
    ctpu_tensor cf = ctpu_cast(c, CTPU_F32);
    ck_assert_int_eq(ctpu_to_host(cf, out + 7, 6 * 4), CTPU_OK);
    ctpu_release(x); ctpu_release(y); ctpu_release(z); ctpu_release(a); ctpu_release(b); ctpu_release(c);
    ctpu_release(cf);
}

START_TEST(producers_fused_into_reductions)
{
    float a[13], c[13];
    int64_t sa, sc;
    reduce_prog(CTPU_MODE_STRICT, a, &sa);
    reduce_prog(CTPU_MODE_DEFER_FUSE, c, &sc);
    ck_assert(same_bits(a, c, 13));
    ck_assert_int_eq(sc, 3);   /* three reductions, each with its producers */
}
END_TEST

/* a value larger than the whole HBM is refused when it is recorded, naming
 * the op (as strict eager does at the call), and spoils nothing else */
START_TEST(too_big_value_refused_at_record)
{
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    ctpu_tensor z = ctpu_zeros(CTPU_F32, 2, (int64_t[]){ 1 << 20, 1 << 20 });
    ck_assert(ctpu_is_null(z));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_OOM);
    ck_assert_msg(strstr(ctpu_last_error(), "zeros: output f32[1048576,1048576]"), "%s",
                  ctpu_last_error());
    ctpu_tensor y = ctpu_add_scalar(ctpu_ones(CTPU_F32, 1, (int64_t[]){ 4 }), 1);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    float h[4];
    ck_assert_int_eq(ctpu_to_host(y, h, sizeof h), CTPU_OK);
    ck_assert(h[0] == 2.0f);
}
END_TEST

/* a cap that fits the work only if queued work gives its memory back: the
 * allocation waits for the device instead of failing */
START_TEST(allocation_waits_for_queued_work)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("TORCH_TPU_HBM_LIMIT", "1M", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    unsetenv("TORCH_TPU_HBM_LIMIT");
    ctpu_tensor x = ctpu_keep(ctpu_ones(CTPU_F32, 1, (int64_t[]){ 100000 }));   /* 400 KB */
    for (int i = 0; i < 200; i++) {
        ctpu_scope_begin();
        ctpu_tensor t = ctpu_exp(x);   /* 400 KB more; last step's may still be queued */
        ck_assert_msg(!ctpu_is_null(t), "step %d: %s", i, ctpu_last_error());
        ctpu_scope_end();
    }
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ctpu_release(x);
}
END_TEST

/* ------------------------------------------------------------ memory */
START_TEST(live_bytes_flat_and_fused_peak_lower)
{
    ctpu_hbm_stats st;
    int64_t peak[2];
    for (int mode = 0; mode < 2; mode++) {
        ctpu_set_mode(mode ? CTPU_MODE_DEFER_FUSE : CTPU_MODE_STRICT);
        mlp p;
        mlp_init(&p, 64, 128, 10);
        ctpu_tensor x, y;
        make_batch(64, 64, 10, 6, &x, &y);
        ctpu_sync();
        uint64_t at5 = 0;
        ctpu_hbm_reset_peak();
        for (int s = 0; s < 300; s++) {
            mlp_step(&p, x, y, s, 300, false);
            /* a sync per step: the peak is one step's, not how far the host ran ahead */
            ctpu_sync();
            if (s == 4) { ctpu_hbm_get_stats(&st); at5 = st.in_use; }
        }
        ctpu_sync();
        ctpu_hbm_get_stats(&st);
        ck_assert_uint_eq(st.in_use, at5);
        peak[mode] = (int64_t)st.peak;
        ctpu_release(x);
        ctpu_release(y);
        mlp_free(&p);
    }
    ck_assert_msg(peak[1] < peak[0], "fused peak %lld is not below strict %lld", (long long)peak[1],
                  (long long)peak[0]);
}
END_TEST

/* A reshape or a contiguous slice that is a step of its own is a view of its
 * input's scratch memory in a fused program (compile.c plan_views): exp(x)
 * [64,64] -> reshape [4096] -> slice [1024, 3072) -> reshape [32,64] ->
 * matmul, beside an unaligned slice (offset 4 bytes: a copy) of the same
 * reshape, and a read of exp(x) after them. The same bits as strict eager,
 * and less device memory: the launch (its output and scratch) grew the HBM
 * peak by 48 KiB with the views, 56 KiB when each of them was a copy. */
static void view_chain(ctpu_mode mode, float *out, int64_t *grow)
{
    ctpu_set_mode(mode);
    float xv[64 * 64], wv[64 * 64];
    for (int i = 0; i < 64 * 64; i++) { xv[i] = (float)((i * 37) % 101) / 50.0f - 1.0f; wv[i] = (float)((i * 11) % 13) / 7.0f - 0.9f; }
    int64_t s2[2] = { 64, 64 }, s1 = 4096, sq[2] = { 32, 64 };
    ctpu_tensor x = ctpu_from_host(xv, CTPU_F32, 2, s2), w = ctpu_from_host(wv, CTPU_F32, 2, s2);
    ctpu_sync();
    ctpu_hbm_stats st;
    ctpu_hbm_get_stats(&st);
    uint64_t before = st.in_use;
    ctpu_hbm_reset_peak();
    ctpu_step_begin();
    ctpu_tensor a = ctpu_exp(x);
    ctpu_tensor q = ctpu_reshape(ctpu_slice(ctpu_reshape(a, 1, &s1), 0, 1024, 3072, 1), 2, sq);
    ctpu_tensor u = ctpu_reshape(ctpu_slice(ctpu_reshape(a, 1, &s1), 0, 1, 2049, 1), 2, sq);
    ctpu_tensor m = ctpu_add(ctpu_matmul(q, w), ctpu_matmul(u, w));
    ctpu_tensor o = ctpu_keep(ctpu_add(m, ctpu_slice(ctpu_mul_scalar(a, 0.5), 0, 0, 32, 1)));
    ctpu_step_end();
    ck_assert_int_eq(ctpu_to_host(o, out, 32 * 64 * 4), CTPU_OK);
    ctpu_hbm_get_stats(&st);
    *grow = (int64_t)(st.peak - before);
    ctpu_release(o);
    ctpu_release(x);
    ctpu_release(w);
    ctpu_set_mode(CTPU_MODE_STRICT);
}

START_TEST(reshape_and_slice_are_views_in_programs)
{
    float ref[32 * 64], got[32 * 64];
    int64_t g0, g1;
    view_chain(CTPU_MODE_STRICT, ref, &g0);
    view_chain(CTPU_MODE_DEFER_FUSE, got, &g1);
    ck_assert_msg(same_bits(ref, got, 32 * 64), "a program with views differs from strict eager");
    ck_assert_msg(g1 <= 48 * 1024, "the fused launch grew the HBM peak by %lld bytes (48 KiB with views)",
                  (long long)g1);
}
END_TEST

/* Every op has a kernel entry in exec.c's handler table, every op the VM may
 * fuse is elementwise (and back), and exactly the CTPU_FUSE_ACT ops have an
 * epilogue activation in vm.c's table. */
START_TEST(op_tables_complete)
{
    for (int op = 0; op < CTPU_OP_COUNT; op++) {
        const char *nm = ctpu_op_name(op);
        ck_assert_msg(ctpu_exec_fn_for(op) != NULL, "op %s has no entry in exec.c's handler table", nm);
        int fc = ctpu_op_fusion(op);
        ck_assert_msg(fc >= 0 && fc < CTPU_FUSE_CLASS_COUNT, "op %s: fusion class %d is not a CTPU_FUSE_*", nm, fc);
        bool vm = fc == CTPU_FUSE_VM || fc == CTPU_FUSE_ADD || fc == CTPU_FUSE_ACT;
        ck_assert_msg(vm == ctpu_op_is(op, CTPU_OPK_ELEMENTWISE),
                      "op %s: fusion class %d does not match its elementwise kind (the VM runs elementwise ops)", nm, fc);
        ck_assert_msg((fc == CTPU_FUSE_REDUCE || fc == CTPU_FUSE_REDUCE_MEAN) <= ctpu_op_is(op, CTPU_OPK_REDUCTION),
                      "op %s: a reduction fusion class on an op that is not a reduction", nm);
        ck_assert_msg((fc == CTPU_FUSE_MXU) == ctpu_op_is(op, CTPU_OPK_MATMUL), "op %s: MXU class iff matmul", nm);
        ck_assert_msg((fc == CTPU_FUSE_ACT) == (ctpu_vm_epi_act(op) != CTPU_K_ACT_NONE),
                      "op %s: fusion class ACT and vm.c's epilogue activation table disagree", nm);
    }
}
END_TEST

/* ------------------------------------------------------------ recompile limit */
/* stderr of fn() (captured in a file). */
static char *stderr_of(void (*fn)(void *), void *arg)
{
    char path[] = "/tmp/ctpu_limit_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fdopen(fd, "r");
    fseek(f, 0, SEEK_SET);
    static char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    remove(path);
    return buf;
}

/* A number of the metrics document's "cache" object. */
static long json_cache_number(const char *name)
{
    char *doc = ctpu_metrics_json();
    ck_assert_ptr_nonnull(doc);
    char want[96];
    snprintf(want, sizeof want, "\"%s\":", name);
    const char *c = strstr(doc, "\"cache\":");
    const char *p = c ? strstr(c, want) : NULL;
    ck_assert_msg(p != NULL, "no cache.%s in the metrics document", name);
    long v = strtol(p + strlen(want), NULL, 10);
    free(doc);
    return v;
}

/* rand_normal -> relu -> sum for n = first .. last rows; sums[n] the results. */
typedef struct { int first, last; double sums[40]; const char *label; } shapes_job;

static void shapes_run(void *p)
{
    shapes_job *j = p;
    ctpu_manual_seed(7);
    for (int n = j->first; n <= j->last; n++) {
        ctpu_step_begin();
        if (j->label) ck_assert_int_eq(ctpu_label_push(j->label), CTPU_OK);
        ctpu_tensor s = ctpu_keep(ctpu_sum(ctpu_relu(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ n, 3 }, 0, 1)), 0,
                                           NULL, false));
        if (j->label) ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
        ck_assert_int_eq(ctpu_item(s, &j->sums[n]), CTPU_OK);
        ctpu_release(s);
    }
}

START_TEST(recompile_limit_runs_op_by_op)
{
    shapes_job ref = { .first = 1, .last = 12 }, got = { .first = 1, .last = 12 };
    ctpu_set_mode(CTPU_MODE_STRICT);
    shapes_run(&ref);
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    int64_t c0 = C("programs_compiled");
    const char *err = stderr_of(shapes_run, &got);
    /* 8 shapes compiled, the 9th to 12th op by op, one warning */
    ck_assert_msg(strcmp(err, "ctpu: warning: program 1 (rand_normal\u2192relu\u2192sum) passed "
                              "TORCH_TPU_RECOMPILE_LIMIT=8: dim 0 varies: 7 -> 8 -> 9; running it op by op in "
                              "strict eager\n") == 0, "stderr: %s", err);
    ck_assert_int_eq(C("recompile_limit_fallbacks"), 4);
    /* the strict run above compiled the one-op programs the fallback uses */
    ck_assert_int_eq(C("programs_compiled") - c0, 8);
    for (int n = 1; n <= 12; n++) ck_assert_msg(ref.sums[n] == got.sums[n], "n %d: %.9g vs %.9g", n, ref.sums[n], got.sums[n]);
    ck_assert_int_eq(json_cache_number("recompile_limit_fallbacks"), 4);
    /* a cached shape still hits; another new one falls back without a second warning */
    shapes_job again = { .first = 3, .last = 3 }, more = { .first = 20, .last = 20 };
    ck_assert_str_eq(stderr_of(shapes_run, &again), "");
    ck_assert_str_eq(stderr_of(shapes_run, &more), "");
    ck_assert_int_eq(C("recompile_limit_fallbacks"), 5);
    /* cache-only: a miss stays an error, no fallback */
    ck_assert_int_eq(ctpu_cache_set_only(true), CTPU_OK);
    ctpu_step_begin();
    ctpu_tensor s = ctpu_keep(ctpu_sum(ctpu_relu(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ 21, 3 }, 0, 1)), 0, NULL,
                                       false));
    ck_assert_int_eq(ctpu_step_end(), CTPU_ERR_CACHE_MISS);
    ctpu_release(s);
    ck_assert_int_eq(C("recompile_limit_fallbacks"), 5);
    ctpu_cache_set_only(false);
}
END_TEST

/* The warning names the label the structure starts in. */
START_TEST(recompile_limit_names_the_label)
{
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    shapes_job got = { .first = 1, .last = 10, .label = "varlen" };
    const char *err = stderr_of(shapes_run, &got);
    ck_assert_msg(strcmp(err, "ctpu: warning: program 1 (rand_normal\u2192relu\u2192sum, from \"varlen\") passed "
                              "TORCH_TPU_RECOMPILE_LIMIT=8: dim 0 varies: 7 -> 8 -> 9; running it op by op in "
                              "strict eager\n") == 0, "stderr: %s", err);
}
END_TEST

/* TORCH_TPU_RECOMPILE_LIMIT=0: no limit. */
START_TEST(recompile_limit_off)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("TORCH_TPU_RECOMPILE_LIMIT", "0", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    shapes_job got = { .first = 1, .last = 12 };
    ck_assert_str_eq(stderr_of(shapes_run, &got), "");
    ck_assert_int_eq(C("recompile_limit_fallbacks"), 0);
    unsetenv("TORCH_TPU_RECOMPILE_LIMIT");
}
END_TEST

/* strict_recompiles: a one-op compile of an op signature first compiled in
 * an earlier marked step; other shapes within that first step are not. */
START_TEST(strict_recompiles_counted)
{
    ctpu_shutdown();
    t_clear_env();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    int64_t r0 = C("strict_recompiles");
    ctpu_step_begin();
    for (int n = 3; n <= 5; n++) {   /* one step: three shapes of one signature */
        ctpu_tensor x = ctpu_full(CTPU_F32, 1, (int64_t[]){ n }, 0.5);
        ctpu_keep(ctpu_add(x, x));
    }
    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    ck_assert_int_eq(C("strict_recompiles") - r0, 0);
    for (int step = 0; step < 2; step++) {
        ctpu_step_begin();
        ctpu_tensor x = ctpu_full(CTPU_F32, 1, (int64_t[]){ 7 }, 0.5);   /* full [7]: new extents too */
        ctpu_keep(ctpu_add(x, x));
        ctpu_tensor y = ctpu_full(CTPU_F32, 1, (int64_t[]){ 4 }, 0.5);   /* seen: a hit */
        ctpu_keep(ctpu_add(y, y));
        ctpu_tensor z = ctpu_full(CTPU_F32, 2, (int64_t[]){ 2, 3 }, 0.5);   /* a new signature (2-D) */
        ctpu_keep(ctpu_add(z, z));
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
        /* step 2: full and add of [7] (2); step 3: all hits */
        ck_assert_int_eq(C("strict_recompiles") - r0, 2);
    }
    ck_assert_int_eq(json_cache_number("strict_recompiles"), C("strict_recompiles"));
}
END_TEST

/* Strict eager's one-op table is a bounded LRU (CTPU_STRICT_CACHE_SIZE). */
START_TEST(strict_table_bounded)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("CTPU_STRICT_CACHE_SIZE", "4", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    for (int round = 0; round < 3; round++)
        for (int n = 1; n <= 300; n++) {   /* past the 256 front slots: some programs reach the table again */
            ctpu_tensor x = ctpu_full(CTPU_F32, 1, (int64_t[]){ n }, 0.5);
            double v;
            ck_assert_int_eq(ctpu_item(ctpu_sum(ctpu_exp(x), 0, NULL, false), &v), CTPU_OK);
            ck_assert_msg(fabs(v - n * exp(0.5)) < 1e-3 * n, "n %d: %g", n, v);
            ctpu_release(x);
        }
    ctpu_cache_stats st;
    ctpu_cache_get_stats(ctpu__test_strict_cache(), &st);
    ck_assert_uint_eq(st.entries, 4);
    ck_assert_uint_eq(st.capacity, 4);
    ck_assert_int_eq(C("strict_cache_entries"), 4);
    ck_assert_int_ge(C("strict_cache_evictions"), 900 - 4);
    ck_assert_int_eq(C("strict_cache_evictions"), (int64_t)st.evictions);
    ck_assert_uint_le(st.orphans, 256 + 1);   /* this thread's front slots hold the rest */
    ck_assert_int_eq(json_cache_number("strict_cache_entries"), 4);
    unsetenv("CTPU_STRICT_CACHE_SIZE");
}
END_TEST

/* ------------------------------------------------------------ loop detector and marked steps */
/* A 4-identical-layer MLP trained with SGD in auto loop detection (a fresh
 * runtime: the program has not marked a step yet when step 1 runs). The
 * layers repeat inside a step; the detector must not cut there: step 1 is
 * one program, later steps hit it, and the report counts the marked steps.
 * scopes: step scopes; else plain scopes and ctpu_mark_step at the end. */
static void mlp_marked_steps(bool scopes)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("TORCH_TPU_DEFER_AND_FUSE", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ctpu_manual_seed(3);
    ctpu_linear l[4];
    ctpu_tensor ps[8];
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(ctpu_linear_init(&l[i], 32, 32, true, CTPU_F32), CTPU_OK);
        ps[2 * i] = l[i].weight;
        ps[2 * i + 1] = l[i].bias;
    }
    ctpu_sgd_opts so = { .lr = 0.01, .momentum = 0.9 };
    ctpu_optim *opt = ctpu_sgd_create(8, ps, &so);
    ck_assert_ptr_nonnull(opt);
    ctpu_tensor x = ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ 128, 32 }, 0, 1);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);          /* the parameters and batch exist before step 1 */
    int64_t m0 = C("fused_cache_misses");
    for (int s = 0; s < 5; s++) {
        ck_assert_int_eq(scopes ? ctpu_step_begin() : ctpu_scope_begin(), CTPU_OK);
        ctpu_tensor h = x;
        for (int i = 0; i < 4; i++) h = ctpu_relu(ctpu_linear_forward(&l[i], h));
        ctpu_tensor loss = ctpu_mean(ctpu_mul(h, h), 0, NULL, false);
        ck_assert_int_eq(ctpu_backward(loss), CTPU_OK);
        ck_assert_int_eq(ctpu_optim_step(opt), CTPU_OK);
        ck_assert_int_eq(ctpu_optim_zero_grad(opt), CTPU_OK);
        if (scopes) {
            ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
        } else {
            ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
            ck_assert_int_eq(ctpu_mark_step(), CTPU_OK);
        }
        if (s == 0) ck_assert_msg(C("fused_cache_misses") - m0 == 1, "step 1 compiled %lld programs (%lld loop cuts)",
                                  (long long)(C("fused_cache_misses") - m0), (long long)C("trace_cuts_loop_detector"));
    }
    ck_assert_int_eq(C("fused_cache_misses") - m0, 1);   /* steps 2-5 hit it */
    ck_assert_int_eq(C("trace_cuts_loop_detector"), 0);
    ck_assert_int_eq(C("recompiles"), 0);
    ck_assert_int_eq(json_cache_number("steps"), 5);
    ctpu_optim_free(opt);
    for (int i = 0; i < 4; i++) ctpu_linear_free(&l[i]);
    ctpu_release(x);
    unsetenv("TORCH_TPU_DEFER_AND_FUSE");
}

START_TEST(marked_mlp_step_one_program_mark_step) { mlp_marked_steps(false); }
END_TEST
START_TEST(marked_mlp_step_one_program_step_scope) { mlp_marked_steps(true); }
END_TEST


/* The key a cut looks up is built and hashed while the trace is recorded
 * (ctpu_trace_rec_key_final): over fuzzed recordings (inputs repeated and
 * new, every arity, scalars, attrs set or not, traces long enough to fold
 * the running hash many times), its bytes equal the key written from
 * scratch by walking the recording, its hash XXH3-64 of those bytes and the
 * suffix, and the other facts the recorder keeps for the cut (which values
 * a node reads, the op-number span) equal a walk's. Recording on after a
 * cut's key and a reset both keep it so. */
static uint64_t kf_rng;
static uint32_t kf_next(void)
{
    kf_rng = kf_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(kf_rng >> 33);
}

static void kf_check(ctpu_trace_rec *r, uint8_t *scratch, size_t cap)
{
    const uint8_t *rk;
    size_t rlen;
    T_CHECK(ctpu_trace_rec_key(r, &rk, &rlen), "the raw key ran out of memory");
    size_t slen = ctpu_trace_rec_key_scratch(r, scratch, cap - 256);
    T_CHECK(slen == rlen && (rlen == 0 || memcmp(rk, scratch, rlen) == 0), "incremental key (%zu bytes) != key from scratch (%zu bytes)", rlen, slen);
    uint8_t suffix[200];
    size_t sl = kf_next() % sizeof suffix;
    for (size_t i = 0; i < sl; i++) suffix[i] = (uint8_t)kf_next();
    memcpy(scratch + slen, suffix, sl);
    const uint8_t *key;
    size_t len;
    uint64_t h;
    T_CHECK(ctpu_trace_rec_key_final(r, suffix, sl, &key, &len, &h), "key_final failed");
    T_CHECK(len == slen + sl && memcmp(key, scratch, len) == 0, "final key bytes differ from the scratch key and suffix");
    T_CHECK(h == ctpu_key_hash(scratch, len), "running hash != XXH3 of the scratch key (%zu bytes)", len);
    /* the record-time facts of the cut against a walk */
    int n = ctpu_trace_rec_nodes(r);
    const uint8_t *read = ctpu_trace_rec_read(r);
    uint8_t *walk = calloc((size_t)n + 1, 1);
    ck_assert_ptr_nonnull(walk);
    const ctpu_op_prov *rp = ctpu_trace_rec_prov(r);
    ctpu_op_prov lo = n ? rp[0] : (ctpu_op_prov){ 0, 0, 0 }, hi = lo;
    for (int i = 0; i < n; i++) {
        const double *sc;
        const ctpu_node *nd = ctpu_trace_rec_node_at(r, i, &sc);
        for (int k = 0; k < nd->n_in; k++)
            if (nd->in[k] >= 0) walk[nd->in[k]] = 1;
        if (rp[i].op_no && (rp[i].op_no < lo.op_no || !lo.op_no)) lo = rp[i];
        if (rp[i].op_no > hi.op_no) hi = rp[i];
    }
    for (int i = 0; i < n; i++) T_CHECK(read[i] == walk[i], "read[%d] = %d, a walk says %d", i, read[i], walk[i]);
    free(walk);
    ctpu_op_prov l2, h2;
    T_CHECK(ctpu_trace_rec_prov_span(r, &l2, &h2) == (n > 0), "prov_span with %d nodes", n);
    if (n) T_CHECK(memcmp(&l2, &lo, sizeof lo) == 0 && memcmp(&h2, &hi, sizeof hi) == 0, "op-number span (%u, %u) != a walk's (%u, %u)", l2.op_no, h2.op_no, lo.op_no, hi.op_no);
}

START_TEST(incremental_key_equals_scratch_key)
{
    ctpu_device *dev = ctpu_rt->dev;
    char err[256];
    ctpu_buffer *bufs[6];
    for (int b = 0; b < 6; b++) {
        bufs[b] = ctpu_buffer_alloc(dev, 4096, err, sizeof err);
        ck_assert_msg(bufs[b] != NULL, "%s", err);
    }
    ctpu_trace_rec *r = ctpu_trace_rec_create();
    ck_assert_ptr_nonnull(r);
    size_t cap = 4u << 20;
    uint8_t *scratch = malloc(cap);
    ck_assert_ptr_nonnull(scratch);
    kf_rng = 18;
    for (int trial = 0; trial < 120; trial++) {
        int nn = trial % 10 == 0 ? 2000 + (int)(kf_next() % 1000) : (int)(kf_next() % 300);
        int ni = 0, no = 0;
        uint32_t op_no = kf_next() % 3;
        for (int i = 0; i < nn; i++) {
            if (kf_next() % 4 == 0 || ni == 0) {     /* an input: a buffer, an offset, a type (repeats dedupe) */
                ctpu_vtype t = { .dtype = (uint8_t)(kf_next() % 3), .ndim = (uint8_t)(kf_next() % 4) };
                for (int d = 0; d < t.ndim; d++) t.shape[d] = 1 + kf_next() % 5;
                ctpu_vref v = ctpu_trace_rec_input(r, bufs[kf_next() % 6], 64 * (kf_next() % 3), &t);
                ck_assert_int_lt(v, 0);
                if (-v > ni) ni = -v;
            }
            ctpu_node n;
            memset(&n, 0, sizeof n);
            n.op = (uint16_t)(kf_next() % CTPU_OP_COUNT);
            n.n_in = (uint8_t)(kf_next() % 5);
            if (kf_next() % 50 == 0) n.n_in = CTPU_NODE_MAX_IN;
            n.n_scalars = (uint8_t)(kf_next() % (CTPU_NODE_MAX_SCALARS + 1));
            for (int k = 0; k < n.n_in; k++)
                n.in[k] = (kf_next() % 2 && no > 0) ? (int32_t)(kf_next() % (uint32_t)no)
                                                    : -1 - (int32_t)(kf_next() % (uint32_t)ni);
            n.out.dtype = (uint8_t)(kf_next() % 3);
            n.out.ndim = (uint8_t)(kf_next() % 9);
            for (int d = 0; d < n.out.ndim; d++) n.out.shape[d] = kf_next() % 7 == 0 ? 0 : 1 + kf_next() % 300;
            if (kf_next() % 3 == 0) {
                n.attr.dims[kf_next() % 8] = (int32_t)kf_next();
                n.attr.i64[kf_next() % 4] = (int64_t)kf_next() - (1 << 30);
                n.attr.flags = kf_next() % 32;
            }
            double sc[CTPU_NODE_MAX_SCALARS] = { 0.5, -1, 3, 1e-8 };
            op_no += kf_next() % 4 == 0 ? 0 : kf_next() % 3;        /* some unnumbered, some equal, some lower */
            ctpu_op_prov pv = { kf_next() % 5 == 0 ? 0 : op_no - (kf_next() % 7 == 0 ? kf_next() % (op_no + 1) : 0),
                                kf_next() % 4, 0 };
            ctpu_vref v = ctpu_trace_rec_node(r, &n, sc, pv);
            ck_assert_int_eq(v, no);
            no++;
            if (kf_next() % 97 == 0) kf_check(r, scratch, cap);   /* a key mid-recording, then more nodes */
        }
        kf_check(r, scratch, cap);
        ctpu_trace_rec_reset(r, dev);
    }
    kf_check(r, scratch, cap);   /* empty */
    ctpu_trace_rec_destroy(r, dev);
    for (int b = 0; b < 6; b++) ctpu_buffer_release(dev, bufs[b]);
    free(scratch);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fuse");
    TCase *p = tcase_create("parity");
    tcase_add_checked_fixture(p, t_setup, t_teardown);
    tcase_set_timeout(p, 240);
    tcase_add_test(p, op_tables_complete);
    tcase_add_test(p, every_op_parity);
    tcase_add_test(p, random_programs_parity);
    tcase_add_test(p, training_step_parity);
    tcase_add_test(p, matmul_epilogue_fused_and_identical);
    tcase_add_test(p, producers_fused_into_reductions);
    suite_add_tcase(s, p);
    TCase *c = tcase_create("cache");
    tcase_add_checked_fixture(c, t_setup, t_teardown);
    tcase_set_timeout(c, 240);
    tcase_add_test(c, adamw_loop_compiles_once);
    tcase_add_test(c, epoch_with_partial_batch);
    tcase_add_test(c, distinct_programs_get_distinct_entries);
    tcase_add_test(c, host_read_every_step_bounded);
    tcase_add_test(c, host_read_mid_step_cuts_trace);
    tcase_add_test(c, cache_only_errors_on_new_shape);
    tcase_add_test(c, lru_evictions_and_thrash);
    tcase_add_test(c, unmarked_loop_cut_by_detector);
    tcase_add_test(c, dropout_masks_differ_without_recompiling);
    tcase_add_test(c, forced_hash_collisions_still_correct);
    tcase_add_test(c, incremental_key_equals_scratch_key);
    tcase_add_test(c, too_big_value_refused_at_record);
    tcase_add_test(c, allocation_waits_for_queued_work);
    tcase_add_test(c, recompile_limit_runs_op_by_op);
    tcase_add_test(c, recompile_limit_names_the_label);
    tcase_add_test(c, recompile_limit_off);
    tcase_add_test(c, strict_table_bounded);
    tcase_add_test(c, strict_recompiles_counted);
    tcase_add_test(c, marked_mlp_step_one_program_mark_step);
    tcase_add_test(c, marked_mlp_step_one_program_step_scope);
    suite_add_tcase(s, c);
    TCase *m = tcase_create("memory");
    tcase_add_checked_fixture(m, t_setup, t_teardown);
    tcase_set_timeout(m, 240);
    tcase_add_test(m, live_bytes_flat_and_fused_peak_lower);
    tcase_add_test(m, reshape_and_slice_are_views_in_programs);
    suite_add_tcase(s, m);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
