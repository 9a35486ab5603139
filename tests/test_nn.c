/* nn (src/nn): optimizers against hand-computed steps, losses (stability,
 * ignore index, smoothing, bad labels), layers and initialisers, schedules,
 * the idx reader (good, gzip, truncated, wrong magic, count mismatch) and
 * the batch iterator. */
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "t_core.h"
#include "ctpu_nn.h"

static void setup(void)
{
    t_setup();
    ctpu_set_matmul_precision(CTPU_PRECISION_HIGHEST);
}

static ctpu_tensor vec(const float *v, int64_t n) { return ctpu_from_host(v, CTPU_F32, 1, &n); }

static void readt(ctpu_tensor t, float *out, int64_t n)
{
    ck_assert_msg(!ctpu_is_null(t), "null tensor: %s", ctpu_last_error());
    ck_assert_int_eq(ctpu_numel(t), n);
    ck_assert_int_eq(ctpu_to_host(t, out, (size_t)n * 4), CTPU_OK);
}

static double item(ctpu_tensor t)
{
    double v = 0;
    ck_assert_msg(!ctpu_is_null(t), "null: %s", ctpu_last_error());
    ck_assert_msg(ctpu_item(t, &v) == CTPU_OK, "item: %s", ctpu_last_error());
    return v;
}

/* Give p the gradient g (as a leaf's .grad) through backward of sum(p * g). */
static void set_grad(ctpu_tensor p, const float *g, int64_t n)
{
    ctpu_zero_grad(p);
    ctpu_scope_begin();
    ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(p, vec(g, n)), 0, NULL, false)), CTPU_OK);
    ctpu_scope_end();
}

/* ------------------------------------------------------------ optimizers */
START_TEST(t_sgd_momentum)
{
    float p0[3] = { 1.0f, -2.0f, 0.5f };
    float g1[3] = { 0.1f, 0.2f, -0.3f }, g2[3] = { -0.4f, 0.05f, 0.3f };
    for (int variant = 0; variant < 3; variant++) {
        /* 0: momentum 0.9; 1: + nesterov + weight decay; 2: momentum + dampening 0.5 */
        ctpu_sgd_opts so = { .lr = 0.1, .momentum = 0.9 };
        if (variant == 1) { so.nesterov = true; so.weight_decay = 0.01; }
        if (variant == 2) so.dampening = 0.5;
        ctpu_tensor p = vec(p0, 3);
        ctpu_set_requires_grad(p, true);
        ctpu_optim *o = ctpu_sgd_create(1, &p, &so);
        ck_assert_ptr_nonnull(o);
        double pe[3], buf[3] = { 0, 0, 0 };
        for (int i = 0; i < 3; i++) pe[i] = p0[i];
        for (int step = 0; step < 2; step++) {
            const float *g = step ? g2 : g1;
            set_grad(p, g, 3);
            ck_assert_int_eq(ctpu_optim_step(o), CTPU_OK);
            for (int i = 0; i < 3; i++) {   /* torch.optim.SGD, in double */
                double d = g[i] + so.weight_decay * pe[i];
                buf[i] = step == 0 ? d : so.momentum * buf[i] + (1 - so.dampening) * d;
                double u = so.nesterov ? d + so.momentum * buf[i] : buf[i];
                pe[i] -= so.lr * u;
            }
            float pv[3], bv[3];
            readt(p, pv, 3);
            readt(ctpu_optim_state(o, 0, 0), bv, 3);
            for (int i = 0; i < 3; i++) {
                ck_assert_msg(fabs(pv[i] - pe[i]) < 1e-6, "variant %d step %d p[%d]: %g vs %g", variant, step, i, pv[i], pe[i]);
                ck_assert_msg(fabs(bv[i] - buf[i]) < 1e-6, "variant %d step %d buf[%d]", variant, step, i);
            }
        }
        ck_assert_int_eq(ctpu_optim_steps(o), 2);
        ctpu_optim_free(o);
    }
}
END_TEST


/* Adam (L2 decay, torch.optim.Adam) and AdamW over two parameter groups
 * (lr scale, weight decay per group), against the update in double. */
START_TEST(t_adam_groups)
{
    float a0[3] = { 1.0f, -2.0f, 0.5f }, b0[2] = { 0.25f, -0.75f };
    float ga[2][3] = { { 0.1f, 0.2f, -0.3f }, { -0.4f, 0.05f, 0.3f } }, gb[2][2] = { { 0.5f, -0.1f }, { 0.2f, 0.2f } };
    for (int kind = 0; kind < 2; kind++) {   /* 0: Adam, 1: AdamW */
        ctpu_tensor pa = vec(a0, 3), pb = vec(b0, 2);
        ctpu_set_requires_grad(pa, true);
        ctpu_set_requires_grad(pb, true);
        ctpu_param_group gs[2] = { { &pa, 1, 1.0, 0.05 }, { &pb, 1, 0.5, 0.0 } };
        ctpu_adamw_opts ao = kind ? ctpu_adamw_defaults() : ctpu_adam_defaults();
        ck_assert(ao.weight_decay == (kind ? 1e-2 : 0.0));
        ao.lr = 0.01;
        ao.beta2 = 0.99;
        ctpu_optim *o = kind ? ctpu_adamw_create_groups(2, gs, &ao) : ctpu_adam_create_groups(2, gs, &ao);
        ck_assert_msg(o != NULL, "%s", ctpu_last_error());
        double pe[5], m[5] = { 0 }, v[5] = { 0 };
        for (int i = 0; i < 3; i++) pe[i] = a0[i];
        for (int i = 0; i < 2; i++) pe[3 + i] = b0[i];
        for (int step = 0; step < 2; step++) {
            set_grad(pa, ga[step], 3);
            set_grad(pb, gb[step], 2);
            ck_assert_int_eq(ctpu_optim_step(o), CTPU_OK);
            double t = step + 1;
            for (int i = 0; i < 5; i++) {   /* torch.optim.Adam / AdamW, in double */
                int g = i >= 3;
                double lr = ao.lr * gs[g].lr_scale, wd = gs[g].weight_decay;
                double gr = g ? gb[step][i - 3] : ga[step][i];
                if (kind == 0) gr += wd * pe[i];
                else pe[i] *= 1 - lr * wd;
                m[i] = ao.beta1 * m[i] + (1 - ao.beta1) * gr;
                v[i] = ao.beta2 * v[i] + (1 - ao.beta2) * gr * gr;
                double mh = m[i] / (1 - pow(ao.beta1, t)), vh = v[i] / (1 - pow(ao.beta2, t));
                pe[i] -= lr * mh / (sqrt(vh) + ao.eps);
            }
            float pv[5];
            readt(pa, pv, 3);
            readt(pb, pv + 3, 2);
            for (int i = 0; i < 5; i++)
                ck_assert_msg(fabs(pv[i] - pe[i]) < 2e-6, "kind %d step %d p[%d]: %.9g vs %.9g", kind, step, i, pv[i], pe[i]);
        }
        ctpu_optim_free(o);
        /* hostile groups: a parameter twice, a negative scale, n 0 */
        ctpu_param_group dup[2] = { { &pa, 1, 1.0, 0.1 }, { &pa, 1, 1.0, 0.0 } };
        ck_assert_ptr_null(ctpu_adamw_create_groups(2, dup, &ao));
        ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
        ck_assert(strstr(ctpu_last_error(), "groups[1].params[0]") != NULL);
        ctpu_param_group neg = { &pa, 1, -1.0, 0.0 }, none = { &pa, 0, 1.0, 0.0 };
        ck_assert_ptr_null(ctpu_adam_create_groups(1, &neg, &ao));
        ck_assert(strstr(ctpu_last_error(), "adam_create_groups") != NULL);
        ck_assert_ptr_null(ctpu_sgd_create_groups(1, &none, &(ctpu_sgd_opts){ .lr = 0.1 }));
        ck_assert_ptr_null(ctpu_adamw_create_groups(0, gs, &ao));
        ck_assert_ptr_null(ctpu_adamw_create_groups(1, NULL, &ao));
        ck_assert_ptr_null(ctpu_adam_create(1, &pa, NULL));
        ctpu_release(pa);
        ctpu_release(pb);
    }
}
END_TEST

/* nanoGPT's get_lr, step by step. */
START_TEST(t_lr_warmup_cosine)
{
    double base = 6e-4, mn = 6e-5;
    int64_t warm = 10, total = 110;
    for (int64_t it = -2; it < 130; it++) {
        double want;
        int64_t i = it < 0 ? 0 : it;
        if (i < warm) want = base * (double)(i + 1) / (double)(warm + 1);
        else if (i > total) want = mn;
        else want = mn + 0.5 * (1.0 + cos(M_PI * (double)(i - warm) / (double)(total - warm))) * (base - mn);
        ck_assert_msg(fabs(ctpu_lr_warmup_cosine(base, it, warm, total, mn) - want) <= 1e-18, "step %lld", (long long)it);
    }
    ck_assert(ctpu_lr_warmup_cosine(base, 10, 10, 110, mn) == base);
    ck_assert(ctpu_lr_warmup_cosine(base, 5, 0, 0, mn) == mn);
    ck_assert(ctpu_lr_warmup_cosine(base, 0, 0, 100, mn) == base);
    ck_assert(ctpu_lr_warmup_cosine(base, 20, 30, 10, mn) == base * 21 / 31);
}
END_TEST

/* nll_loss against float64: every reduction, ignore_index, bf16 input, its
 * gradient (-1/count at the picked entries), a bad target as a fault. */
START_TEST(t_nll_loss)
{
    float lp[4 * 3] = { -0.1f, -2.5f, -3.0f, -1.2f, -0.4f, -2.2f, -0.9f, -0.9f, -1.6f, -5.0f, -0.01f, -7.5f };
    int32_t y[4] = { 0, 2, -100, 1 };
    int64_t s2[2] = { 4, 3 }, n4 = 4;
    double want_none[4] = { 0.1, 2.2, 0, 0.01 };
    ctpu_tensor X = ctpu_from_host(lp, CTPU_F32, 2, s2), Y = ctpu_from_host(y, CTPU_I32, 1, &n4);
    for (int r = 0; r < 3; r++) {
        ctpu_nll_opts o = ctpu_nll_defaults();
        ck_assert_int_eq(o.ignore_index, -100);
        o.reduction = (ctpu_reduction)r;
        ctpu_tensor l = ctpu_nll_loss(X, Y, &o);
        ck_assert_msg(!ctpu_is_null(l), "%s", ctpu_last_error());
        ck_assert_int_eq(ctpu_dtype_of(l), CTPU_F32);
        if (r == CTPU_REDUCE_NONE) {
            float v[4];
            readt(l, v, 4);
            for (int i = 0; i < 4; i++) ck_assert_msg(fabs(v[i] - want_none[i]) <= 1e-7 * (1 + want_none[i]), "row %d", i);
        } else {
            double sum = 0.1 + 2.2 + 0.01, want = r == CTPU_REDUCE_SUM ? sum : sum / 3;
            ck_assert_msg(fabs(item(l) - want) <= 2.4e-7 * want, "reduction %d: %.9g vs %.9g", r, item(l), want);
        }
    }
    /* equals cross entropy of the logits whose log_softmax it is */
    ctpu_tensor Z = ctpu_from_host(lp, CTPU_F32, 2, s2);
    ck_assert(item(ctpu_nll_loss(ctpu_log_softmax(Z, 1), Y, NULL)) == item(ctpu_cross_entropy(Z, Y, NULL)));
    /* bf16 input: exact in f32 */
    ctpu_tensor Xb = ctpu_cast(X, CTPU_BF16);
    ck_assert(item(ctpu_nll_loss(Xb, Y, NULL)) == item(ctpu_nll_loss(ctpu_cast(Xb, CTPU_F32), Y, NULL)));
    /* gradient */
    ctpu_tensor P = ctpu_from_host(lp, CTPU_F32, 2, s2);
    ctpu_set_requires_grad(P, true);
    ck_assert_int_eq(ctpu_backward(ctpu_nll_loss(P, Y, NULL)), CTPU_OK);
    float g[12];
    readt(ctpu_grad(P), g, 12);
    for (int i = 0; i < 4; i++)
        for (int c = 0; c < 3; c++) {
            float want = (y[i] == c) ? -1.0f / 3.0f : 0.0f;
            ck_assert_msg(g[i * 3 + c] == want, "grad[%d][%d] %g", i, c, g[i * 3 + c]);
        }
    /* all ignored: NaN (0/0, as torch) */
    int32_t yi[4] = { 7, 7, 7, 7 };
    ctpu_tensor Yi = ctpu_from_host(yi, CTPU_I32, 1, &n4);
    ck_assert(isnan(item(ctpu_nll_loss(X, Yi, &(ctpu_nll_opts){ CTPU_REDUCE_MEAN, 7 }))));
    /* errors */
    ck_assert(ctpu_is_null(ctpu_nll_loss(X, vec(lp, 4), NULL)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_DTYPE);
    ck_assert(strstr(ctpu_last_error(), "nll_loss") != NULL);
    ck_assert(ctpu_is_null(ctpu_nll_loss(Y, Y, NULL)));
    ck_assert(ctpu_is_null(ctpu_nll_loss(X, ctpu_from_host(y, CTPU_I32, 1, (int64_t[]){ 3 }), NULL)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
    ck_assert(ctpu_is_null(ctpu_nll_loss(X, Y, &(ctpu_nll_opts){ (ctpu_reduction)9, 0 })));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    ck_assert(ctpu_is_null(ctpu_nll_loss(CTPU_NULL, Y, NULL)));
    int32_t yb[4] = { 0, 3, 0, 0 };
    double v;
    ck_assert_int_ne(ctpu_item(ctpu_nll_loss(X, ctpu_from_host(yb, CTPU_I32, 1, &n4), NULL), &v), CTPU_OK);
    /* the user's call and argument, not the gather nll_loss makes (issue 20) */
    ck_assert_msg(strstr(ctpu_last_error(), "nll_loss (op #") == ctpu_last_error() &&
                  strstr(ctpu_last_error(), "): target 3 at position 1 is out of range [0, 3) (1 bad index)"),
                  "%s", ctpu_last_error());
    ctpu_clear_error();
}
END_TEST

/* bce_with_logits, l1 and smooth_l1 against float64 (PyTorch's formulas). */
START_TEST(t_pointwise_losses)
{
    float x[8] = { -30.0f, -3.5f, -0.7f, 0.0f, 0.2f, 1.9f, 17.0f, 90.0f };
    float t[8] = { 0.0f, 1.0f, 0.3f, 1.0f, 0.0f, 0.5f, 1.0f, 0.0f };
    ctpu_tensor X = vec(x, 8), T = vec(t, 8);
    float got[8];
    readt(ctpu_bce_with_logits(X, T, CTPU_REDUCE_NONE), got, 8);
    double sum = 0, worst = 0;
    for (int i = 0; i < 8; i++) {
        double xi = x[i], ti = t[i];
        double want = fmax(xi, 0) - xi * ti + log1p(exp(-fabs(xi)));
        sum += want;
        worst = fmax(worst, fabs(got[i] - want) / fmax(1.0, fabs(want)));
    }
    ck_assert_msg(worst <= 1.2e-7, "bce: worst %g", worst);   /* documented: <= 6e-8 abs + f32 rounding */
    ck_assert(fabs(item(ctpu_bce_with_logits(X, T, CTPU_REDUCE_SUM)) - sum) <= 1e-6 * sum);
    ck_assert(fabs(item(ctpu_bce_with_logits(X, T, CTPU_REDUCE_MEAN)) - sum / 8) <= 1e-6 * sum);
    /* its gradient: (sigmoid(x) - y) / n */
    ctpu_tensor P = vec(x, 8);
    ctpu_set_requires_grad(P, true);
    ck_assert_int_eq(ctpu_backward(ctpu_bce_with_logits(P, T, CTPU_REDUCE_MEAN)), CTPU_OK);
    readt(ctpu_grad(P), got, 8);
    for (int i = 0; i < 8; i++) {
        double want = (1 / (1 + exp(-(double)x[i])) - t[i]) / 8;
        ck_assert_msg(fabs(got[i] - want) <= 3e-8, "bce grad[%d] %.9g vs %.9g", i, got[i], want);
    }
    /* l1, smooth_l1 (beta 1 and 0.25, and 0 = l1) */
    double betas[3] = { 1.0, 0.25, 0.0 };
    for (int b = 0; b < 4; b++) {
        double s = 0;
        float v[8];
        readt(b == 3 ? ctpu_l1_loss(X, T, CTPU_REDUCE_NONE) : ctpu_smooth_l1_loss(X, T, CTPU_REDUCE_NONE, betas[b]), v, 8);
        for (int i = 0; i < 8; i++) {
            double d = (double)x[i] - t[i], ad = fabs(d), beta = b == 3 ? 0 : betas[b];
            double want = (beta > 0 && ad < beta) ? 0.5 * d * d / beta : ad - 0.5 * beta;
            s += want;
            ck_assert_msg(fabs(v[i] - want) <= 1.2e-7 * fmax(1, fabs(want)), "variant %d elem %d: %.9g vs %.9g", b, i, v[i], want);
        }
        double m = item(b == 3 ? ctpu_l1_loss(X, T, CTPU_REDUCE_MEAN) : ctpu_smooth_l1_loss(X, T, CTPU_REDUCE_MEAN, betas[b]));
        ck_assert_msg(fabs(m - s / 8) <= 1e-6 * (s / 8), "variant %d mean", b);
    }
    /* errors */
    ctpu_tensor S = vec(x, 3);
    ck_assert(ctpu_is_null(ctpu_l1_loss(X, S, CTPU_REDUCE_MEAN)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
    ck_assert(strstr(ctpu_last_error(), "l1_loss") != NULL);
    ck_assert(ctpu_is_null(ctpu_smooth_l1_loss(X, T, CTPU_REDUCE_MEAN, -1)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    ck_assert(ctpu_is_null(ctpu_smooth_l1_loss(X, T, CTPU_REDUCE_MEAN, NAN)));
    ck_assert(ctpu_is_null(ctpu_bce_with_logits(X, T, (ctpu_reduction)5)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    int32_t iv[8] = { 0 };
    int64_t n8 = 8;
    ck_assert(ctpu_is_null(ctpu_bce_with_logits(ctpu_from_host(iv, CTPU_I32, 1, &n8), T, CTPU_REDUCE_MEAN)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_DTYPE);
    ck_assert(ctpu_is_null(ctpu_bce_with_logits(CTPU_NULL, T, CTPU_REDUCE_MEAN)));
    ctpu_clear_error();
}
END_TEST

START_TEST(t_adamw)
{
    float p0[3] = { 1.0f, -2.0f, 0.5f };
    float gs[3][3] = { { 0.1f, 0.2f, -0.3f }, { -0.4f, 0.05f, 0.3f }, { 0.0f, -1.0f, 2.0f } };
    ctpu_adamw_opts ao = { .lr = 0.01, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .weight_decay = 0.1 };
    ctpu_tensor p = vec(p0, 3);
    ctpu_set_requires_grad(p, true);
    ctpu_optim *o = ctpu_adamw_create(1, &p, &ao);
    ck_assert_ptr_nonnull(o);
    /* state exists (zeros) before the first step */
    float z[3];
    readt(ctpu_optim_state(o, 0, 1), z, 3);
    for (int i = 0; i < 3; i++) ck_assert_float_eq(z[i], 0);
    double pe[3], m[3] = { 0 }, v[3] = { 0 };
    for (int i = 0; i < 3; i++) pe[i] = p0[i];
    for (int t = 1; t <= 3; t++) {
        double lr = t == 3 ? 0.005 : 0.01;   /* a schedule: the lr is a runtime scalar */
        ctpu_optim_set_lr(o, lr);
        set_grad(p, gs[t - 1], 3);
        ck_assert_int_eq(ctpu_optim_step(o), CTPU_OK);
        for (int i = 0; i < 3; i++) {   /* torch.optim.AdamW, in double */
            double g = gs[t - 1][i];
            pe[i] *= 1 - lr * ao.weight_decay;
            m[i] = ao.beta1 * m[i] + (1 - ao.beta1) * g;
            v[i] = ao.beta2 * v[i] + (1 - ao.beta2) * g * g;
            double bc1 = 1 - pow(ao.beta1, t), bc2 = 1 - pow(ao.beta2, t);
            pe[i] -= lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + ao.eps);
        }
        float pv[3];
        readt(p, pv, 3);
        for (int i = 0; i < 3; i++)
            ck_assert_msg(fabs(pv[i] - pe[i]) < 2e-6, "step %d p[%d]: %.8g vs %.8g", t, i, pv[i], pe[i]);
    }
    /* a parameter without a .grad is skipped */
    ctpu_optim_zero_grad(o);
    ck_assert(ctpu_is_null(ctpu_grad(p)));
    float before[3], after[3];
    readt(p, before, 3);
    ck_assert_int_eq(ctpu_optim_step(o), CTPU_OK);
    readt(p, after, 3);
    for (int i = 0; i < 3; i++) ck_assert_float_eq(before[i], after[i]);
    ctpu_optim_free(o);
}
END_TEST

START_TEST(t_optim_errors)
{
    float v[2] = { 1, 2 };
    ctpu_tensor p = vec(v, 2);
    ctpu_adamw_opts bad = ctpu_adamw_defaults();
    bad.beta1 = 1.0;
    ck_assert_ptr_null(ctpu_adamw_create(1, &p, &bad));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "betas"));
    ck_assert_ptr_null(ctpu_sgd_create(0, &p, &(ctpu_sgd_opts){ .lr = 0.1 }));
    ck_assert_ptr_null(ctpu_sgd_create(1, &p, &(ctpu_sgd_opts){ .lr = 0.1, .nesterov = true }));
    ctpu_tensor nul = CTPU_NULL;
    ck_assert_ptr_null(ctpu_sgd_create(1, &nul, &(ctpu_sgd_opts){ .lr = 0.1 }));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_NULL_HANDLE);
    ctpu_optim *o = ctpu_sgd_create(1, &p, &(ctpu_sgd_opts){ .lr = 0.1 });
    ck_assert_ptr_nonnull(o);
    ctpu_release(p);
    ck_assert_int_eq(ctpu_optim_step(o), CTPU_ERR_STALE_HANDLE);
    ctpu_optim_free(o);
    ck_assert_int_eq(ctpu_optim_step(NULL), CTPU_ERR_INVALID_ARG);
}
END_TEST

START_TEST(t_schedules)
{
    ck_assert_double_eq_tol(ctpu_lr_cosine(1e-3, 0, 100, 0), 1e-3, 1e-15);
    ck_assert_double_eq_tol(ctpu_lr_cosine(1e-3, 50, 100, 0), 5e-4, 1e-15);
    ck_assert_double_eq_tol(ctpu_lr_cosine(1e-3, 100, 100, 0), 0, 1e-15);
    ck_assert_double_eq_tol(ctpu_lr_cosine(1.0, 25, 100, 0.1), 0.1 + 0.9 * (1 + cos(M_PI / 4)) / 2, 1e-12);
    ck_assert_double_eq_tol(ctpu_lr_step(0.1, 0, 30, 0.1), 0.1, 1e-15);
    ck_assert_double_eq_tol(ctpu_lr_step(0.1, 29, 30, 0.1), 0.1, 1e-15);
    ck_assert_double_eq_tol(ctpu_lr_step(0.1, 60, 30, 0.1), 0.001, 1e-15);
}
END_TEST

/* ------------------------------------------------------------ losses */
START_TEST(t_ce_stability)
{
    int32_t one = 1, zero = 0;
    int64_t s12[2] = { 1, 2 }, s1 = 1;
    float big[2] = { 1e8f, 1e8f };
    ctpu_tensor y1 = ctpu_from_host(&one, CTPU_I32, 1, &s1);
    ctpu_tensor l = ctpu_cross_entropy(ctpu_from_host(big, CTPU_F32, 2, s12), y1, NULL);
    ck_assert_double_eq_tol(item(l), log(2.0), 1e-6);
    /* huge and -inf logits of other classes: finite loss and gradient */
    float mixed[2] = { -INFINITY, 3e38f };
    ctpu_tensor x = ctpu_from_host(mixed, CTPU_F32, 2, s12);
    ctpu_set_requires_grad(x, true);
    l = ctpu_cross_entropy(x, y1, NULL);
    ck_assert_double_eq_tol(item(l), 0.0, 1e-6);
    ck_assert_int_eq(ctpu_backward(l), CTPU_OK);
    float g[2];
    readt(ctpu_grad(x), g, 2);
    ck_assert(isfinite(g[0]) && isfinite(g[1]));
    ck_assert_float_eq_tol(g[0], 0, 1e-6);
    ck_assert_float_eq_tol(g[1], 0, 1e-6);
    /* the -inf class as the label: an infinite loss, as PyTorch */
    ctpu_tensor y0 = ctpu_from_host(&zero, CTPU_I32, 1, &s1);
    ck_assert(isinf(item(ctpu_cross_entropy(ctpu_from_host(mixed, CTPU_F32, 2, s12), y0, NULL))));
}
END_TEST

START_TEST(t_ce_values)
{
    /* logits [3, 4], labels [2, -100, 0]: against log-softmax in double */
    float lg[12] = { 1, 2, 3, 4, -1, 0, 5, 2, 0.5f, -0.5f, 0, 1 };
    int32_t lb[3] = { 2, -100, 0 };
    int64_t s34[2] = { 3, 4 }, s3 = 3;
    double lsm[3][4];
    for (int r = 0; r < 3; r++) {
        double mx = -1e300, se = 0;
        for (int c = 0; c < 4; c++) mx = fmax(mx, lg[r * 4 + c]);
        for (int c = 0; c < 4; c++) se += exp(lg[r * 4 + c] - mx);
        for (int c = 0; c < 4; c++) lsm[r][c] = lg[r * 4 + c] - mx - log(se);
    }
    ctpu_tensor L = ctpu_from_host(lg, CTPU_F32, 2, s34), Y = ctpu_from_host(lb, CTPU_I32, 1, &s3);
    double nll0 = -lsm[0][2], nll2 = -lsm[2][0];
    ck_assert_double_eq_tol(item(ctpu_cross_entropy(L, Y, NULL)), (nll0 + nll2) / 2, 1e-5);
    ctpu_ce_opts o = ctpu_ce_defaults();
    o.reduction = CTPU_REDUCE_SUM;
    ck_assert_double_eq_tol(item(ctpu_cross_entropy(L, Y, &o)), nll0 + nll2, 1e-5);
    o.reduction = CTPU_REDUCE_NONE;
    float none[3];
    readt(ctpu_cross_entropy(L, Y, &o), none, 3);
    ck_assert_float_eq_tol(none[0], nll0, 1e-5);
    ck_assert_float_eq(none[1], 0);
    ck_assert_float_eq_tol(none[2], nll2, 1e-5);
    /* label smoothing 0.1: (1-eps) nll + eps * mean(-lsm) */
    o = ctpu_ce_defaults();
    o.label_smoothing = 0.1;
    double sm0 = 0, sm2 = 0;
    for (int c = 0; c < 4; c++) { sm0 -= lsm[0][c] / 4; sm2 -= lsm[2][c] / 4; }
    double want = (0.9 * nll0 + 0.1 * sm0 + 0.9 * nll2 + 0.1 * sm2) / 2;
    ck_assert_double_eq_tol(item(ctpu_cross_entropy(L, Y, &o)), want, 1e-5);
    /* torch's label smoothing with sum / none: the ignored row adds 0
     * (torch 1.13 gives 2.8025 and [1.4902, 0, 1.3123] here) */
    o.reduction = CTPU_REDUCE_SUM;
    ck_assert_double_eq_tol(item(ctpu_cross_entropy(L, Y, &o)), 2 * want, 1e-5);
    ck_assert_double_eq_tol(2 * want, 2.8025, 1e-4);
    o.reduction = CTPU_REDUCE_NONE;
    readt(ctpu_cross_entropy(L, Y, &o), none, 3);
    ck_assert_float_eq_tol(none[0], 0.9 * nll0 + 0.1 * sm0, 1e-5);
    ck_assert_float_eq(none[1], 0);
    ck_assert_float_eq_tol(none[2], 0.9 * nll2 + 0.1 * sm2, 1e-5);
    ck_assert_float_eq_tol(none[0], 1.4902, 1e-4);
    /* its gradient (sum): softmax - ((1 - eps) onehot + eps / C) on the kept rows */
    ctpu_tensor Ls = ctpu_from_host(lg, CTPU_F32, 2, s34);
    ctpu_set_requires_grad(Ls, true);
    o.reduction = CTPU_REDUCE_SUM;
    ck_assert_int_eq(ctpu_backward(ctpu_cross_entropy(Ls, Y, &o)), CTPU_OK);
    float gs[12];
    readt(ctpu_grad(Ls), gs, 12);
    for (int c = 0; c < 4; c++) {
        ck_assert_float_eq_tol(gs[c], exp(lsm[0][c]) - 0.9 * (c == 2) - 0.1 / 4, 1e-6);
        ck_assert_float_eq(gs[4 + c], 0);
        ck_assert_float_eq_tol(gs[8 + c], exp(lsm[2][c]) - 0.9 * (c == 0) - 0.1 / 4, 1e-6);
    }
    /* gradient of the mean loss: (softmax - onehot) / n_valid, zero on the ignored row */
    ctpu_set_requires_grad(L, true);
    ck_assert_int_eq(ctpu_backward(ctpu_cross_entropy(L, Y, NULL)), CTPU_OK);
    float g[12];
    readt(ctpu_grad(L), g, 12);
    for (int c = 0; c < 4; c++) {
        ck_assert_float_eq_tol(g[c], (exp(lsm[0][c]) - (c == 2)) / 2, 1e-6);
        ck_assert_float_eq(g[4 + c], 0);
        ck_assert_float_eq_tol(g[8 + c], (exp(lsm[2][c]) - (c == 0)) / 2, 1e-6);
    }
}
END_TEST

START_TEST(t_ce_bad_labels)
{
    float lg[6] = { 0 };
    int32_t lb[2] = { 1, 7 };
    int64_t s23[2] = { 2, 3 }, s2 = 2;
    /* host check: at once, naming the position and value */
    ck_assert_int_eq(ctpu_labels_check(lb, 2, 3, -100), CTPU_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "label 7 at position 1"));
    int32_t ok[2] = { 2, -100 };
    ck_assert_int_eq(ctpu_labels_check(ok, 2, 3, -100), CTPU_OK);
    /* device labels: gather's bounds fault, at the next sync (strict) */
    ctpu_tensor l = ctpu_cross_entropy(ctpu_from_host(lg, CTPU_F32, 2, s23), ctpu_from_host(lb, CTPU_I32, 1, &s2), NULL);
    ck_assert(!ctpu_is_null(l));
    double v;
    ck_assert_int_eq(ctpu_item(l, &v), CTPU_ERR_DEVICE_FAULT);
    ck_assert_msg(strstr(ctpu_last_error(), "cross_entropy (op #") == ctpu_last_error() &&
                  strstr(ctpu_last_error(), "): labels 7 at position 1 is out of range [0, 3) (1 bad index)"),
                  "%s", ctpu_last_error());
    ctpu_sync();
    /* debug eager: at the call */
    ctpu_set_mode(CTPU_MODE_DEBUG);
    l = ctpu_cross_entropy(ctpu_from_host(lg, CTPU_F32, 2, s23), ctpu_from_host(lb, CTPU_I32, 1, &s2), NULL);
    ck_assert(ctpu_is_null(l));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_DEVICE_FAULT);
    ctpu_set_mode(CTPU_MODE_STRICT);
    /* shapes and dtypes */
    ctpu_tensor L = ctpu_from_host(lg, CTPU_F32, 2, s23);
    ck_assert(ctpu_is_null(ctpu_cross_entropy(L, L, NULL)));
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "cross_entropy: logits is f32[2,3]"));
    int64_t s3 = 3;
    ck_assert(ctpu_is_null(ctpu_cross_entropy(L, ctpu_zeros(CTPU_I32, 1, &s3), NULL)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
}
END_TEST

START_TEST(t_mse)
{
    float a[4] = { 1, 2, 3, 4 }, b[4] = { 0, 2, 5, 4 };
    ctpu_tensor A = vec(a, 4), B = vec(b, 4);
    ck_assert_double_eq_tol(item(ctpu_mse_loss(A, B, CTPU_REDUCE_MEAN)), 5.0 / 4, 1e-6);
    ck_assert_double_eq_tol(item(ctpu_mse_loss(A, B, CTPU_REDUCE_SUM)), 5.0, 1e-6);
    ctpu_set_requires_grad(A, true);
    ck_assert_int_eq(ctpu_backward(ctpu_mse_loss(A, B, CTPU_REDUCE_MEAN)), CTPU_OK);
    float g[4];
    readt(ctpu_grad(A), g, 4);
    for (int i = 0; i < 4; i++) ck_assert_float_eq_tol(g[i], 2 * (a[i] - b[i]) / 4, 1e-6);
    int64_t s3 = 3;
    ck_assert(ctpu_is_null(ctpu_mse_loss(A, ctpu_zeros(CTPU_F32, 1, &s3), CTPU_REDUCE_MEAN)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
}
END_TEST

/* ------------------------------------------------------------ layers, init */
START_TEST(t_linear)
{
    ctpu_manual_seed(7);
    ctpu_linear l;
    ck_assert_int_eq(ctpu_linear_init(&l, 400, 30, true, CTPU_F32), CTPU_OK);
    ck_assert(ctpu_requires_grad(l.weight) && ctpu_requires_grad(l.bias));
    ck_assert_int_eq(ctpu_dim(l.weight, 0), 30);
    ck_assert_int_eq(ctpu_dim(l.weight, 1), 400);
    /* PyTorch's default: U(+-1/sqrt(in)) for both */
    float *w = malloc(400 * 30 * 4);
    readt(l.weight, w, 400 * 30);
    double bound = 1 / sqrt(400.0), mx = 0, sq = 0;
    for (int i = 0; i < 12000; i++) { mx = fmax(mx, fabs(w[i])); sq += (double)w[i] * w[i]; }
    ck_assert(mx <= bound);
    ck_assert(mx > 0.95 * bound);
    ck_assert_double_eq_tol(sqrt(sq / 12000), bound / sqrt(3.0), 0.03 * bound);
    /* forward = x Wᵀ + b */
    float x[2 * 400], b[30], y[2 * 30];
    for (int i = 0; i < 800; i++) x[i] = (float)((i % 13) - 6) / 7.0f;
    readt(l.bias, b, 30);
    ctpu_tensor X = ctpu_from_host(x, CTPU_F32, 2, (int64_t[]){ 2, 400 });
    readt(ctpu_linear_forward(&l, X), y, 60);
    for (int r = 0; r < 2; r++)
        for (int o = 0; o < 30; o++) {
            double s = b[o];
            for (int i = 0; i < 400; i++) s += (double)x[r * 400 + i] * w[o * 400 + i];
            ck_assert_float_eq_tol(y[r * 30 + o], s, 1e-4);
        }
    /* a wrong input width names the layer */
    ck_assert(ctpu_is_null(ctpu_linear_forward(&l, ctpu_zeros(CTPU_F32, 2, (int64_t[]){ 2, 399 }))));
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "linear: x is f32[2,399]"));
    ctpu_linear nb;
    ck_assert_int_eq(ctpu_linear_init(&nb, 4, 3, false, CTPU_F32), CTPU_OK);
    ck_assert(ctpu_is_null(nb.bias));
    ck_assert_int_eq(ctpu_linear_init(&nb, 0, 3, false, CTPU_F32), CTPU_ERR_INVALID_ARG);
    /* parameters live in no scope: a scope end leaves them */
    ctpu_scope_begin();
    ctpu_linear in_scope;
    ck_assert_int_eq(ctpu_linear_init(&in_scope, 4, 3, true, CTPU_F32), CTPU_OK);
    ctpu_scope_end();
    ck_assert(ctpu_is_valid(in_scope.weight) && ctpu_is_valid(in_scope.bias));
    ctpu_linear_free(&in_scope);
    ctpu_linear_free(&l);
    free(w);
}
END_TEST

START_TEST(t_initialisers)
{
    int64_t s[2] = { 200, 300 };
    struct { ctpu_tensor t; double want_std; bool uniform; double bound; } c[4];
    ctpu_manual_seed(3);
    double fi = 300, fo = 200;
    c[0].t = ctpu_init_kaiming_uniform(CTPU_F32, 2, s, 0, CTPU_FAN_IN);
    c[0].bound = sqrt(2.0) * sqrt(3 / fi);
    c[1].t = ctpu_init_kaiming_normal(CTPU_F32, 2, s, 0, CTPU_FAN_OUT);
    c[1].bound = 0;
    c[1].want_std = sqrt(2.0) / sqrt(fo);
    c[2].t = ctpu_init_xavier_uniform(CTPU_F32, 2, s, 1.0);
    c[2].bound = sqrt(6 / (fi + fo));
    c[3].t = ctpu_init_xavier_normal(CTPU_F32, 2, s, 2.0);
    c[3].bound = 0;
    c[3].want_std = 2.0 * sqrt(2 / (fi + fo));
    float *v = malloc(60000 * 4);
    for (int k = 0; k < 4; k++) {
        readt(c[k].t, v, 60000);
        double sq = 0, mx = 0;
        for (int i = 0; i < 60000; i++) { sq += (double)v[i] * v[i]; mx = fmax(mx, fabs(v[i])); }
        double sd = sqrt(sq / 60000), want = c[k].bound ? c[k].bound / sqrt(3.0) : c[k].want_std;
        ck_assert_msg(fabs(sd - want) < 0.02 * want, "init %d: std %g vs %g", k, sd, want);
        if (c[k].bound) ck_assert(mx <= c[k].bound);
    }
    /* seeded: the same seed gives the same values */
    float a[4], b[4];
    ctpu_manual_seed(11);
    readt(ctpu_init_xavier_normal(CTPU_F32, 2, (int64_t[]){ 2, 2 }, 1), a, 4);
    ctpu_manual_seed(11);
    readt(ctpu_init_xavier_normal(CTPU_F32, 2, (int64_t[]){ 2, 2 }, 1), b, 4);
    ck_assert(memcmp(a, b, sizeof a) == 0);
    ck_assert(ctpu_is_null(ctpu_init_kaiming_uniform(CTPU_F32, 1, s, 0, CTPU_FAN_IN)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
    ck_assert(ctpu_is_null(ctpu_init_xavier_uniform(CTPU_I32, 2, s, 1)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_DTYPE);
    free(v);
}
END_TEST

START_TEST(t_layer_norm_dropout_embedding)
{
    ctpu_layer_norm_layer ln;
    ck_assert_int_eq(ctpu_layer_norm_layer_init(&ln, 4, 1e-5, true, CTPU_F32), CTPU_OK);
    float x[8] = { 1, 2, 3, 4, -2, 0, 2, 8 }, y[8];
    ctpu_tensor X = ctpu_from_host(x, CTPU_F32, 2, (int64_t[]){ 2, 4 });
    readt(ctpu_layer_norm_layer_forward(&ln, X), y, 8);
    for (int r = 0; r < 2; r++) {
        double m = 0, v = 0;
        for (int c = 0; c < 4; c++) m += x[r * 4 + c] / 4.0;
        for (int c = 0; c < 4; c++) v += (x[r * 4 + c] - m) * (x[r * 4 + c] - m) / 4.0;
        for (int c = 0; c < 4; c++) ck_assert_float_eq_tol(y[r * 4 + c], (x[r * 4 + c] - m) / sqrt(v + 1e-5), 1e-5);
    }
    ck_assert(ctpu_is_null(ctpu_layer_norm_layer_forward(&ln, ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 3 }))));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
    ctpu_layer_norm_layer_free(&ln);

    /* dropout: same seed -> same mask; kept entries scaled by 1/(1-p) */
    float ones[1000], a[1000], b[1000];
    for (int i = 0; i < 1000; i++) ones[i] = 1;
    ctpu_tensor O = vec(ones, 1000);
    ctpu_manual_seed(5);
    readt(ctpu_dropout(O, 0.25, true), a, 1000);
    ctpu_manual_seed(5);
    readt(ctpu_dropout(O, 0.25, true), b, 1000);
    ck_assert(memcmp(a, b, sizeof a) == 0);
    int kept = 0;
    for (int i = 0; i < 1000; i++) {
        ck_assert(a[i] == 0 || fabsf(a[i] - 1 / 0.75f) < 1e-6);
        kept += a[i] != 0;
    }
    ck_assert(kept > 700 && kept < 800);
    readt(ctpu_dropout(O, 0.25, false), b, 1000);
    for (int i = 0; i < 1000; i++) ck_assert_float_eq(b[i], 1);
    ck_assert(ctpu_is_null(ctpu_dropout(O, 1.5, true)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    /* dropout passes the gradient through the mask */
    ctpu_set_requires_grad(O, true);
    ctpu_manual_seed(5);
    ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_dropout(O, 0.25, true), 0, NULL, false)), CTPU_OK);
    readt(ctpu_grad(O), b, 1000);
    ck_assert(memcmp(a, b, sizeof a) == 0);

    /* bf16 in, bf16 out (torch's dtype), in every mode: the same mask as
     * f32's (the same draws), the kept entries bf16(x * 1/(1-p)), rounded
     * once; the gradient bf16 too */
    {
        float xv[64], want[64], got[64], g0[64];
        for (int i = 0; i < 64; i++) xv[i] = (float)(i % 9) * 0.37f - 1.1f;
        for (int m = 0; m < 3; m++) {
            ctpu_set_mode(m == 0 ? CTPU_MODE_STRICT : m == 1 ? CTPU_MODE_DEBUG : CTPU_MODE_DEFER_FUSE);
            ctpu_tensor xb = ctpu_cast(ctpu_from_host(xv, CTPU_F32, 1, (int64_t[]){ 64 }), CTPU_BF16);
            ctpu_set_requires_grad(xb, true);
            ctpu_manual_seed(9);
            ctpu_tensor yb = ctpu_dropout(xb, 0.3, true);
            ck_assert_int_eq(ctpu_dtype_of(yb), CTPU_BF16);
            ctpu_manual_seed(9);
            ctpu_tensor yf = ctpu_dropout(ctpu_cast(xb, CTPU_F32), 0.3, true);
            readt(ctpu_cast(yb, CTPU_F32), got, 64);
            readt(ctpu_cast(ctpu_cast(yf, CTPU_BF16), CTPU_F32), want, 64);
            ck_assert_msg(memcmp(got, want, sizeof got) == 0, "mode %d: bf16 dropout is not bf16(f32 dropout)", m);
            ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_cast(yb, CTPU_F32), 0, NULL, false)), CTPU_OK);
            ck_assert_int_eq(ctpu_dtype_of(ctpu_grad(xb)), CTPU_BF16);
            readt(ctpu_cast(ctpu_grad(xb), CTPU_F32), got, 64);
            if (m == 0) memcpy(g0, got, sizeof g0);
            else ck_assert_msg(memcmp(got, g0, sizeof got) == 0, "mode %d: bf16 dropout gradient differs", m);
            ctpu_release(xb);
        }
        ctpu_set_mode(CTPU_MODE_STRICT);
    }

    ctpu_embedding_layer e;
    ck_assert_int_eq(ctpu_embedding_layer_init(&e, 5, 3, CTPU_F32), CTPU_OK);
    int32_t ix[2] = { 4, 0 };
    ctpu_tensor E = ctpu_embedding_layer_forward(&e, ctpu_from_host(ix, CTPU_I32, 1, (int64_t[]){ 2 }));
    ck_assert_int_eq(ctpu_dim(E, 0), 2);
    ck_assert_int_eq(ctpu_dim(E, 1), 3);
    ctpu_embedding_layer_free(&e);
}
END_TEST

/* ------------------------------------------------------------ idx reader */
static char tmpdir[256];

static void idx_setup(void)
{
    setup();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ctpu_test_nn_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void idx_teardown(void)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
    t_teardown();
}

/* An idx u8 file: magic, extents, data; `cut` bytes dropped from the end,
 * `extra` bytes appended. */
static void write_idx(const char *name, bool gz, const uint8_t magic[4], int nd, const uint32_t *dims, int cut, int extra)
{
    uint8_t buf[4096];
    size_t k = 0;
    memcpy(buf, magic, 4);
    k = 4;
    size_t n = 1;
    for (int d = 0; d < nd; d++) {
        buf[k++] = (uint8_t)(dims[d] >> 24); buf[k++] = (uint8_t)(dims[d] >> 16);
        buf[k++] = (uint8_t)(dims[d] >> 8); buf[k++] = (uint8_t)dims[d];
        n *= dims[d];
    }
    if (n > 2048) n = 2048;   /* a header may claim more than is written */
    for (size_t i = 0; i < n; i++) buf[k++] = (uint8_t)(i % 10);
    for (int i = 0; i < extra; i++) buf[k++] = 1;
    k -= (size_t)cut;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    if (gz) {
        gzFile f = gzopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(gzwrite(f, buf, (unsigned)k), (int)k);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(fwrite(buf, 1, k, f), k);
        fclose(f);
    }
}

static const char *pth(const char *name)
{
    static char p[2][512];
    static int w;
    w ^= 1;
    snprintf(p[w], sizeof p[w], "%s/%s", tmpdir, name);
    return p[w];
}

START_TEST(t_idx_reader)
{
    const uint8_t m3[4] = { 0, 0, 8, 3 }, m1[4] = { 0, 0, 8, 1 };
    uint32_t d3[3] = { 6, 4, 5 }, d1[1] = { 6 }, d1b[1] = { 5 };
    write_idx("img", false, m3, 3, d3, 0, 0);
    write_idx("img.gz", true, m3, 3, d3, 0, 0);
    write_idx("lab", false, m1, 1, d1, 0, 0);
    write_idx("lab5", false, m1, 1, d1b, 0, 0);
    ctpu_idx x;
    for (int gz = 0; gz < 2; gz++) {
        ck_assert_msg(ctpu_idx_read(pth(gz ? "img.gz" : "img"), &x) == CTPU_OK, "%s", ctpu_last_error());
        ck_assert_int_eq(x.ndim, 3);
        ck_assert_int_eq(x.shape[0], 6);
        ck_assert_int_eq(x.shape[2], 5);
        for (int i = 0; i < 120; i++) ck_assert_int_eq(x.data[i], i % 10);
        ctpu_idx_free(&x);
    }
    /* truncated data, plain and gzip */
    write_idx("trunc", false, m3, 3, d3, 7, 0);
    ck_assert_int_eq(ctpu_idx_read(pth("trunc"), &x), CTPU_ERR_IO);
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "truncated"));
    ck_assert_ptr_null(x.data);
    write_idx("trunc.gz", true, m3, 3, d3, 7, 0);
    ck_assert_int_eq(ctpu_idx_read(pth("trunc.gz"), &x), CTPU_ERR_IO);
    /* a gzip stream cut short */
    {
        char src[512], dst[512];
        snprintf(src, sizeof src, "%s/img.gz", tmpdir);
        snprintf(dst, sizeof dst, "%s/cut.gz", tmpdir);
        FILE *f = fopen(src, "rb");
        uint8_t b[4096];
        size_t n = fread(b, 1, sizeof b, f);
        fclose(f);
        f = fopen(dst, "wb");
        fwrite(b, 1, n / 2, f);
        fclose(f);
        ck_assert_int_eq(ctpu_idx_read(dst, &x), CTPU_ERR_IO);
    }
    /* truncated header, empty file */
    write_idx("hdr", false, m3, 3, d3, 120 + 6, 0);
    ck_assert_int_eq(ctpu_idx_read(pth("hdr"), &x), CTPU_ERR_IO);
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "header"));
    write_idx("empty", false, m3, 3, d3, 120 + 16, 0);
    ck_assert_int_eq(ctpu_idx_read(pth("empty"), &x), CTPU_ERR_IO);
    /* wrong magic, unsupported type, bad ndim */
    const uint8_t bad[4] = { 0x1f, 0x00, 8, 3 }, f32t[4] = { 0, 0, 0x0d, 3 }, nd9[4] = { 0, 0, 8, 9 };
    write_idx("magic", false, bad, 3, d3, 0, 0);
    ck_assert_int_eq(ctpu_idx_read(pth("magic"), &x), CTPU_ERR_IO);
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "wrong magic"));
    write_idx("f32", false, f32t, 3, d3, 0, 0);
    ck_assert_int_eq(ctpu_idx_read(pth("f32"), &x), CTPU_ERR_IO);
    write_idx("nd9", false, nd9, 3, d3, 0, 0);
    ck_assert_int_eq(ctpu_idx_read(pth("nd9"), &x), CTPU_ERR_IO);
    /* trailing bytes: the count in the header does not match the data */
    write_idx("long", false, m3, 3, d3, 0, 3);
    ck_assert_int_eq(ctpu_idx_read(pth("long"), &x), CTPU_ERR_IO);
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "count mismatch"));
    /* a header claiming far more data than any file */
    uint32_t huge[3] = { 0xffffffffu, 0xffffffffu, 2 };
    write_idx("huge", false, m3, 3, huge, 0, 0);
    ck_assert_int_eq(ctpu_idx_read(pth("huge"), &x), CTPU_ERR_IO);
    /* a header claiming the largest size read (2^34 bytes) over 2048 bytes of data: truncated, found
     * without allocating what the header claims (the buffer grows as bytes arrive; it was one malloc of
     * the claimed size, 16 GiB for a 2 KiB file, an OOM error where memory is not overcommitted).
     * Checked in a child under an address-space limit 256 MiB above its current size (not under
     * AddressSanitizer, which reserves its shadow memory up front). */
    uint32_t big[3] = { 65536, 512, 512 };
    write_idx("big", false, m3, 3, big, 0, 0);
    write_idx("big.gz", true, m3, 3, big, 0, 0);
    for (int gz = 0; gz < 2; gz++) {
        const char *bp = pth(gz ? "big.gz" : "big");
#ifndef __SANITIZE_ADDRESS__
        /* (the child first: an allocator that keeps freed address space, as jemalloc does, would hand the
         * child the 16 GiB a read in this process had allocated, whatever the limit) */
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            long pages = 0;
            FILE *sm = fopen("/proc/self/statm", "r");
            if (!sm || fscanf(sm, "%ld", &pages) != 1) _exit(3);
            fclose(sm);
            struct rlimit rl = { (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (256u << 20), RLIM_INFINITY };
            rl.rlim_max = rl.rlim_cur;
            if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(4);
            ctpu_idx y;
            ctpu_status st = ctpu_idx_read(bp, &y);
            _exit(st == CTPU_ERR_IO && t_contains(ctpu_last_error(), "truncated") ? 0 : st == CTPU_ERR_OOM ? 1 : 2);
        }
        int status = 0;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "gz %d: under a 256 MiB limit the read gave %s", gz,
                      WIFEXITED(status) && WEXITSTATUS(status) == 1 ? "CTPU_ERR_OOM (the claimed size was allocated)"
                                                                     : "another outcome");
#endif
        ck_assert_int_eq(ctpu_idx_read(bp, &x), CTPU_ERR_IO);
        ck_assert_msg(t_contains(ctpu_last_error(), "truncated: the header says 65536x512x512 (17179869184 bytes of "
                                                    "data), the file has 2048"), "%s", ctpu_last_error());
        ck_assert_ptr_null(x.data);
    }
    ck_assert_int_eq(ctpu_idx_read(pth("missing"), &x), CTPU_ERR_IO);
    ck_assert_int_eq(ctpu_idx_read(NULL, &x), CTPU_ERR_INVALID_ARG);

    /* image sets: counts must match, labels in range */
    ctpu_image_set s;
    ck_assert_msg(ctpu_image_set_load(pth("img.gz"), pth("lab"), 10, &s) == CTPU_OK, "%s", ctpu_last_error());
    ck_assert_int_eq(s.n, 6);
    ck_assert_int_eq(s.rows * s.cols, 20);
    ck_assert_float_eq_tol(s.images[21], 1.0f / 255.0f, 1e-9);
    ctpu_tensor X, Y;
    const int64_t pick[2] = { 5, 1 };
    ck_assert_int_eq(ctpu_image_set_batch(&s, pick, 2, &X, &Y), CTPU_OK);
    ck_assert_int_eq(ctpu_dim(X, 1), 20);
    int32_t yv[2];
    ck_assert_int_eq(ctpu_to_host(Y, yv, sizeof yv), CTPU_OK);
    ck_assert_int_eq(yv[0], 5);
    ck_assert_int_eq(yv[1], 1);
    ctpu_image_set_free(&s);
    ck_assert_int_eq(ctpu_image_set_load(pth("img"), pth("lab5"), 10, &s), CTPU_ERR_IO);
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "count mismatch"));
    ck_assert_int_eq(ctpu_image_set_load(pth("img"), pth("lab"), 4, &s), CTPU_ERR_IO);
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "out of range"));
}
END_TEST

START_TEST(t_batch_iter)
{
    ctpu_batch_iter *it = ctpu_batch_iter_create(10, 4, true, false, 42);
    ck_assert_ptr_nonnull(it);
    ck_assert_int_eq(ctpu_batch_iter_batches_per_epoch(it), 3);
    int seen[10] = { 0 };
    int64_t sizes[3];
    const int64_t *ix;
    int64_t first[10];
    int nf = 0;
    for (int b = 0; b < 3; b++) {
        sizes[b] = ctpu_batch_iter_next(it, &ix);
        for (int64_t i = 0; i < sizes[b]; i++) { seen[ix[i]]++; first[nf++] = ix[i]; }
    }
    ck_assert_int_eq(sizes[0], 4);
    ck_assert_int_eq(sizes[2], 2);   /* the partial batch is kept */
    for (int i = 0; i < 10; i++) ck_assert_int_eq(seen[i], 1);
    ck_assert_int_eq(ctpu_batch_iter_next(it, &ix), 0);
    /* the next epoch is reshuffled, and the same seed gives the same order */
    int64_t second[10];
    int ns = 0;
    int64_t k;
    while ((k = ctpu_batch_iter_next(it, &ix)) > 0)
        for (int64_t i = 0; i < k; i++) second[ns++] = ix[i];
    ck_assert_int_eq(ns, 10);
    ck_assert_int_eq(ctpu_batch_iter_epoch(it), 1);
    ck_assert(memcmp(first, second, sizeof first) != 0);
    ctpu_batch_iter *it2 = ctpu_batch_iter_create(10, 4, true, false, 42);
    for (int b = 0, at = 0; b < 3; b++) {
        k = ctpu_batch_iter_next(it2, &ix);
        for (int64_t i = 0; i < k; i++) ck_assert_int_eq(ix[i], first[at++]);
    }
    ctpu_batch_iter_free(it2);
    ctpu_batch_iter_free(it);
    /* drop_last, no shuffle */
    it = ctpu_batch_iter_create(10, 4, false, true, 0);
    ck_assert_int_eq(ctpu_batch_iter_batches_per_epoch(it), 2);
    ck_assert_int_eq(ctpu_batch_iter_next(it, &ix), 4);
    ck_assert_int_eq(ix[0], 0);
    ck_assert_int_eq(ctpu_batch_iter_next(it, &ix), 4);
    ck_assert_int_eq(ix[3], 7);
    ck_assert_int_eq(ctpu_batch_iter_next(it, &ix), 0);
    ctpu_batch_iter_free(it);
    ck_assert_ptr_null(ctpu_batch_iter_create(10, 0, false, false, 0));
}
END_TEST

/* Before ctpu_init every nn call names itself, not the ctpu op it reaches
 * first (linear_init used to say rand_uniform); OOM inside a layer's init
 * names the layer's call and the parameter. */
static void names_call(ctpu_status st, const char *call)
{
    ck_assert_msg(st == CTPU_ERR_NOT_INITIALIZED, "%s: %s", call, ctpu_status_str(st));
    char want[96];
    snprintf(want, sizeof want, "%s: ", call);
    ck_assert_msg(strncmp(ctpu_last_error(), want, strlen(want)) == 0, "%s: \"%s\"", call, ctpu_last_error());
    ck_assert_msg(!strstr(ctpu_last_error(), "rand_") && !strstr(ctpu_last_error(), "full"), "%s", ctpu_last_error());
    ctpu_clear_error();
}

/* A released handle given to a loss or dropout: the message names the nn
 * call and the argument (a new user saw "ndim: t is a released ..."). */
START_TEST(t_stale_arguments_name_the_call_and_argument)
{
    float lg[6] = { 1, 2, 3, 4, 5, 6 };
    int32_t lab[2] = { 0, 2 };
    int64_t s2[2] = { 2, 3 }, s1[1] = { 2 };
    ctpu_tensor x = t_f32(lg, 2, s2), y = t_i32(lab, 1, s1);
    ctpu_tensor gone = ctpu_add_scalar(x, 1);
    ctpu_release(gone);
#define STALE_CASE(call, msg)                                                              \
    do {                                                                                   \
        ctpu_tensor r_ = (call);                                                           \
        ck_assert(ctpu_is_null(r_));                                                       \
        ck_assert_msg(t_contains(ctpu_last_error(), msg), "%s", ctpu_last_error());        \
    } while (0)
    STALE_CASE(ctpu_cross_entropy(gone, y, NULL), "cross_entropy: logits is a released (stale) handle");
    STALE_CASE(ctpu_cross_entropy(x, gone, NULL), "cross_entropy: labels is a released (stale) handle");
    STALE_CASE(ctpu_nll_loss(gone, y, NULL), "nll_loss: input is a released (stale) handle");
    STALE_CASE(ctpu_nll_loss(x, gone, NULL), "nll_loss: target is a released (stale) handle");
    STALE_CASE(ctpu_mse_loss(gone, x, CTPU_REDUCE_MEAN), "mse_loss: pred is a released (stale) handle");
    STALE_CASE(ctpu_mse_loss(x, gone, CTPU_REDUCE_MEAN), "mse_loss: target is a released (stale) handle");
    STALE_CASE(ctpu_bce_with_logits(gone, x, CTPU_REDUCE_MEAN), "bce_with_logits: logits is a released (stale) handle");
    STALE_CASE(ctpu_bce_with_logits(x, gone, CTPU_REDUCE_MEAN), "bce_with_logits: target is a released (stale) handle");
    STALE_CASE(ctpu_dropout(gone, 0.5, true), "dropout: x is a released (stale) handle");
#undef STALE_CASE
    ctpu_tensor ok = ctpu_cross_entropy(x, y, NULL);   /* the runtime stays usable */
    ck_assert(!ctpu_is_null(ok));
}
END_TEST

START_TEST(t_messages_name_the_call)
{
    ctpu_shutdown();
    int64_t ws[2] = { 4, 3 };
    ctpu_linear l;
    ctpu_layer_norm_layer ln;
    ctpu_embedding_layer e;
    names_call(ctpu_linear_init(&l, 3, 4, true, CTPU_F32), "linear_init");
    names_call(ctpu_layer_norm_layer_init(&ln, 4, 1e-5, true, CTPU_F32), "layer_norm_layer_init");
    names_call(ctpu_embedding_layer_init(&e, 4, 4, CTPU_F32), "embedding_layer_init");
    ctpu_clear_error();
    ck_assert(ctpu_is_null(ctpu_init_kaiming_uniform(CTPU_F32, 2, ws, 0, CTPU_FAN_IN)));
    names_call(ctpu_last_status(), "init_kaiming_uniform");
    ck_assert(ctpu_is_null(ctpu_init_xavier_normal(CTPU_F32, 2, ws, 1)));
    names_call(ctpu_last_status(), "init_xavier_normal");
    ck_assert(ctpu_is_null(ctpu_dropout(CTPU_NULL, 0.5, true)));
    names_call(ctpu_last_status(), "dropout");
    ck_assert(ctpu_is_null(ctpu_cross_entropy(CTPU_NULL, CTPU_NULL, NULL)));
    names_call(ctpu_last_status(), "cross_entropy");
    ck_assert(ctpu_is_null(ctpu_mse_loss(CTPU_NULL, CTPU_NULL, CTPU_REDUCE_MEAN)));
    names_call(ctpu_last_status(), "mse_loss");
    ctpu_adamw_opts ao = ctpu_adamw_defaults();
    ck_assert_ptr_null(ctpu_adamw_create(0, NULL, &ao));
    names_call(ctpu_last_status(), "adamw_create");
    names_call(ctpu_optim_step(NULL), "optim_step");
    /* a failure inside: OOM making the weight names linear_init and weight */
    setenv("TORCH_TPU_HBM_LIMIT", "1K", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert_int_eq(ctpu_linear_init(&l, 300, 400, true, CTPU_F32), CTPU_ERR_OOM);
    ck_assert_msg(strncmp(ctpu_last_error(), "linear_init: weight: ", 21) == 0, "%s", ctpu_last_error());
    ctpu_shutdown();
    unsetenv("TORCH_TPU_HBM_LIMIT");
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
}
END_TEST

/* ------------------------------------------------------------ clip_grad_norm */
/* Against torch.nn.utils.clip_grad_norm_ in double: the total norm (2, 1,
 * inf, 3), the gradients scaled by min(max_norm / (total + 1e-6), 1), a
 * parameter without a gradient skipped, a bf16 gradient, none at all. */
START_TEST(t_clip_grad_norm)
{
    float ga[4] = { 3, -4, 0.5f, 2 }, gb[3] = { -1, 0.25f, 6 };
    const double types[4] = { 2, 1, INFINITY, 3 };
    for (int t = 0; t < 4; t++)
        for (int clip = 0; clip < 2; clip++) {
            double p = types[t];
            ctpu_tensor A = vec(ga, 4), B = vec(gb, 3), C = vec(gb, 3);
            ctpu_tensor ps[3] = { A, C, B };   /* C gets no gradient */
            for (int i = 0; i < 3; i++) ctpu_set_requires_grad(ps[i], true);
            set_grad(A, ga, 4);
            set_grad(B, gb, 3);
            double na = 0, nb = 0;
            for (int i = 0; i < 4; i++) na = isinf(p) ? fmax(na, fabs(ga[i])) : na + pow(fabs(ga[i]), p);
            for (int i = 0; i < 3; i++) nb = isinf(p) ? fmax(nb, fabs(gb[i])) : nb + pow(fabs(gb[i]), p);
            if (!isinf(p)) { na = pow(na, 1 / p); nb = pow(nb, 1 / p); }
            double total = isinf(p) ? fmax(na, nb) : pow(pow(na, p) + pow(nb, p), 1 / p);
            double max_norm = clip ? total / 4 : total * 2;
            double coef = fmin(max_norm / (total + 1e-6), 1.0);
            ctpu_tensor tn = ctpu_clip_grad_norm(3, ps, max_norm, p);
            ck_assert_msg(!ctpu_is_null(tn), "clip_grad_norm: %s", ctpu_last_error());
            ck_assert_int_eq(ctpu_ndim(tn), 0);
            double got = item(tn);
            ck_assert_msg(fabs(got - total) <= 4e-7 * total, "norm %g: total %.9g, want %.9g", p, got, total);
            float a2[4], b2[3];
            readt(ctpu_grad(A), a2, 4);
            readt(ctpu_grad(B), b2, 3);
            for (int i = 0; i < 4; i++)
                ck_assert_msg(clip ? fabs(a2[i] - ga[i] * coef) <= 1e-6 * fabs(ga[i]) : a2[i] == ga[i],
                              "norm %g clip %d: grad a[%d] = %.9g, want %.9g", p, clip, i, a2[i], ga[i] * coef);
            for (int i = 0; i < 3; i++)
                ck_assert(clip ? fabs(b2[i] - gb[i] * coef) <= 1e-6 * fabs(gb[i]) : b2[i] == gb[i]);
            ck_assert(ctpu_is_null(ctpu_grad(C)));
        }
    /* bf16: the norm in f32, the product rounded to bf16 */
    ctpu_tensor H = ctpu_cast(vec(ga, 4), CTPU_BF16);
    ctpu_set_requires_grad(H, true);
    ctpu_scope_begin();
    ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(H, ctpu_cast(vec(ga, 4), CTPU_BF16)), 0, NULL, false)), CTPU_OK);
    ctpu_scope_end();
    double nh = sqrt(9 + 16 + 0.25 + 4);
    ck_assert(fabs(item(ctpu_clip_grad_norm(1, &H, 1.0, 2)) - nh) < 1e-5);
    ck_assert_int_eq(ctpu_dtype_of(ctpu_grad(H)), CTPU_BF16);
    float hv[4];
    ck_assert_int_eq(ctpu_to_host_as_f32(ctpu_grad(H), hv, sizeof hv), CTPU_OK);
    ck_assert(fabs(hv[0] - 3 / nh) < 1e-2 && fabs(hv[1] + 4 / nh) < 1e-2);
    /* no gradients: 0; n == 0: 0 */
    ctpu_tensor N = vec(ga, 4);
    ck_assert(item(ctpu_clip_grad_norm(1, &N, 1.0, 2)) == 0);
    ck_assert(item(ctpu_clip_grad_norm(0, NULL, 1.0, 2)) == 0);
    /* errors name the call */
    ck_assert(ctpu_is_null(ctpu_clip_grad_norm(-1, &N, 1.0, 2)));
    ck_assert(strstr(ctpu_last_error(), "clip_grad_norm") != NULL);
    ck_assert(ctpu_is_null(ctpu_clip_grad_norm(1, NULL, 1.0, 2)));
    ck_assert(ctpu_is_null(ctpu_clip_grad_norm(1, &N, NAN, 2)));
    ck_assert(ctpu_is_null(ctpu_clip_grad_norm(1, &N, -1, 2)));
    ck_assert(ctpu_is_null(ctpu_clip_grad_norm(1, &N, 1, 0)));
    ck_assert(ctpu_is_null(ctpu_clip_grad_norm(1, &N, 1, -INFINITY)));
    ck_assert(ctpu_is_null(ctpu_clip_grad_norm(1, &N, 1, NAN)));
    ctpu_tensor dead = vec(ga, 4);
    ctpu_release(dead);
    ck_assert(ctpu_is_null(ctpu_clip_grad_norm(1, &dead, 1, 2)));
    ck_assert(strstr(ctpu_last_error(), "clip_grad_norm: params[0]") != NULL);
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_STALE_HANDLE);
    ck_assert(!ctpu_is_null(ctpu_clip_grad_norm(1, &N, INFINITY, INFINITY)));
}
END_TEST

/* ------------------------------------------------------------ mode parity */
/* A two-layer model, a loss, backward, clip_grad_norm and an optimizer step,
 * 3 steps, in one mode: the losses, totals and parameters (bits). */
typedef struct { float loss[3], total[3], w[24], b[4], st[24]; } run_out;

static void train_in_mode(ctpu_mode m, int kind, int loss_kind, run_out *o)
{
    ck_assert_int_eq(ctpu_set_mode(m), CTPU_OK);
    float w0[24], x0[24];
    for (int i = 0; i < 24; i++) { w0[i] = sinf((float)i * 0.7f) * 0.5f; x0[i] = cosf((float)i * 1.3f); }
    ctpu_tensor W = ctpu_from_host(w0, CTPU_F32, 2, (int64_t[]){ 4, 6 });
    ctpu_tensor Bv = ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 4 });
    ctpu_set_requires_grad(W, true);
    ctpu_set_requires_grad(Bv, true);
    ctpu_tensor ps[2] = { W, Bv };
    ctpu_param_group gs[2] = { { .n = 1, .params = &ps[0], .lr_scale = 1.0, .weight_decay = 0.1 },
                               { .n = 1, .params = &ps[1], .lr_scale = 0.5, .weight_decay = 0.0 } };
    ctpu_adamw_opts ao = ctpu_adamw_defaults();
    ao.lr = 0.05;
    ctpu_sgd_opts so = { .lr = 0.1, .momentum = 0.9, .nesterov = true, .weight_decay = 0.01 };
    ctpu_optim *opt = kind == 0 ? ctpu_adam_create_groups(2, gs, &ao)
                    : kind == 1 ? ctpu_adamw_create_groups(2, gs, &ao) : ctpu_sgd_create_groups(2, gs, &so);
    ck_assert_ptr_nonnull(opt);
    int32_t yl[4] = { 0, 3, 1, 3 };
    for (int step = 0; step < 3; step++) {
        ctpu_optim_zero_grad(opt);
        ctpu_step_begin();
        ctpu_tensor X = ctpu_from_host(x0, CTPU_F32, 2, (int64_t[]){ 4, 6 });
        ctpu_tensor z = ctpu_add(ctpu_matmul_t(X, W, false, true), Bv);   /* [4, 4] */
        ctpu_tensor Y = ctpu_from_host(yl, CTPU_I32, 1, (int64_t[]){ 4 });
        ctpu_tensor T = ctpu_sigmoid(ctpu_mul_scalar(X, 0.5));
        ctpu_tensor T4 = ctpu_slice(T, 1, 0, 4, 1);
        ctpu_tensor loss;
        switch (loss_kind) {
        case 0: loss = ctpu_nll_loss(ctpu_log_softmax(z, 1), Y, NULL); break;
        case 1: loss = ctpu_bce_with_logits(z, T4, CTPU_REDUCE_MEAN); break;
        case 2: loss = ctpu_l1_loss(z, T4, CTPU_REDUCE_SUM); break;
        case 3: loss = ctpu_smooth_l1_loss(z, T4, CTPU_REDUCE_MEAN, 0.5); break;
        default: loss = ctpu_cross_entropy(z, Y, NULL); break;
        }
        ck_assert_msg(ctpu_backward(loss) == CTPU_OK, "%s", ctpu_last_error());
        ctpu_tensor total = ctpu_clip_grad_norm(2, ps, 0.5, 2.0);
        ck_assert_msg(!ctpu_is_null(total), "%s", ctpu_last_error());
        ck_assert_int_eq(ctpu_optim_set_lr(opt, ctpu_lr_warmup_cosine(0.05, step, 1, 3, 0.005)), CTPU_OK);
        ck_assert_int_eq(ctpu_optim_step(opt), CTPU_OK);
        ck_assert_int_eq(ctpu_to_host(loss, &o->loss[step], 4), CTPU_OK);
        ck_assert_int_eq(ctpu_to_host(total, &o->total[step], 4), CTPU_OK);
        ctpu_step_end();
    }
    readt(W, o->w, 24);
    readt(Bv, o->b, 4);
    readt(ctpu_optim_state(opt, 0, 0), o->st, 24);
    ctpu_optim_free(opt);
    ctpu_release(W);
    ctpu_release(Bv);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
}

/* Losses, clip_grad_norm and the optimizers (Adam, AdamW, SGD over groups,
 * warmup-cosine): strict, debug and defer and fuse give the same bits. */
START_TEST(t_losses_optimizers_mode_parity)
{
    int kind = _i / 5, loss_kind = _i % 5;
    run_out r[3];
    static const ctpu_mode modes[3] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    for (int m = 0; m < 3; m++) train_in_mode(modes[m], kind, loss_kind, &r[m]);
    for (int m = 1; m < 3; m++) {
        for (int i = 0; i < 3; i++) {
            ck_assert_msg(t_same(r[0].loss[i], r[m].loss[i]), "optim %d loss %d mode %d step %d: %a vs %a", kind,
                          loss_kind, m, i, r[0].loss[i], r[m].loss[i]);
            ck_assert_msg(t_same(r[0].total[i], r[m].total[i]), "optim %d loss %d mode %d step %d: total", kind,
                          loss_kind, m, i);
        }
        for (int i = 0; i < 24; i++)
            ck_assert_msg(t_same(r[0].w[i], r[m].w[i]) && t_same(r[0].st[i], r[m].st[i]),
                          "optim %d loss %d mode %d: w[%d] %a vs %a", kind, loss_kind, m, i, r[0].w[i], r[m].w[i]);
        for (int i = 0; i < 4; i++) ck_assert(t_same(r[0].b[i], r[m].b[i]));
    }
    ck_assert(r[0].loss[2] < r[0].loss[0] || loss_kind == 2);   /* it trains */
}
END_TEST

/* ------------------------------------------------- strict eager: the fused optimizer step */
/* Strict eager runs an optimizer's update of every parameter as one
 * compiled step of its own (optim.c fused_step): the same bits as op by op
 * (ctpu__test_optim_fused(false)) for every optimizer and option, over
 * three groups (two share an lr_scale), an f32 and a bf16 parameter, a
 * changing lr; lr 0 at the first step (colliding arguments: op by op), a
 * step where one parameter has no gradient (op by op), capturable. Later
 * steps replay: the update dispatches fewer ops than op by op; except
 * Adam's / AdamW's after that step, whose skipped parameter keeps its own
 * step count (torch's per-parameter state['step']): op by op from there. */
typedef struct {
    int kind;                 /* 0 Adam, 1 AdamW, 2 SGD */
    double momentum, dampening;
    bool nesterov, capturable, lr0, skip;
} fused_cfg;

static const fused_cfg fused_cfgs[] = {
    { 0, 0, 0, false, false, false, false }, { 1, 0, 0, false, false, false, false },
    { 2, 0, 0, false, false, false, false }, { 2, 0.9, 0, false, false, false, false },
    { 2, 0.9, 0.25, false, false, false, false }, { 2, 0.8, 0, true, false, false, false },
    { 1, 0, 0, false, false, true, false }, { 0, 0, 0, false, false, true, true },
    { 2, 0.9, 0.25, false, false, true, true }, { 1, 0, 0, false, false, false, true },
    { 1, 0, 0, false, true, false, false }, { 2, 0.9, 0, true, true, false, false },
};
enum { FUSED_NCFG = sizeof fused_cfgs / sizeof fused_cfgs[0], FUSED_STEPS = 6, FUSED_VALS = 35 + 7 + 12 };

/* The parameters and every state tensor after FUSED_STEPS steps, as f32
 * bits; ops[step]: ops dispatched by that step's ctpu_optim_step. */
static void fused_run(const fused_cfg *c, bool fused, float *out, int64_t *ops)
{
    ctpu__test_optim_fused(fused);
    static const int64_t n[3] = { 35, 7, 12 };
    ctpu_tensor ps[3];
    for (int i = 0; i < 3; i++) {
        float v[35];
        for (int k = 0; k < n[i]; k++) v[k] = sinf((float)(k + 11 * i) * 0.61f);
        ps[i] = vec(v, n[i]);
        if (i == 1) ps[i] = ctpu_cast(ps[i], CTPU_BF16);
        ck_assert_int_eq(ctpu_set_requires_grad(ps[i], true), CTPU_OK);
    }
    ctpu_param_group gs[3] = { { .n = 1, .params = &ps[0], .lr_scale = 1.0, .weight_decay = 0.1 },
                               { .n = 1, .params = &ps[1], .lr_scale = 0.5, .weight_decay = 0.0 },
                               { .n = 1, .params = &ps[2], .lr_scale = 1.0, .weight_decay = 0.0 } };
    ctpu_adamw_opts ao = ctpu_adamw_defaults();
    ctpu_sgd_opts so = { .lr = 0.1, .momentum = c->momentum, .dampening = c->dampening, .nesterov = c->nesterov };
    ctpu_optim *o = c->kind == 0 ? ctpu_adam_create_groups(3, gs, &ao)
                  : c->kind == 1 ? ctpu_adamw_create_groups(3, gs, &ao) : ctpu_sgd_create_groups(3, gs, &so);
    ck_assert_ptr_nonnull(o);
    if (c->capturable) ck_assert_int_eq(ctpu_optim_set_capturable(o, true), CTPU_OK);
    ctpu_clear_error();
    ck_assert(ctpu_is_null(ctpu_optim_state(o, 3, 0)));   /* out of range: a null handle with its message */
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    ck_assert_msg(t_contains(ctpu_last_error(), "optim_state: i=3, k=0"), "%s", ctpu_last_error());
    ctpu_clear_error();
    for (int step = 0; step < FUSED_STEPS; step++) {
        ctpu_optim_zero_grad(o);
        for (int i = 0; i < 3; i++) {
            if (c->skip && step == 2 && i == 2) continue;
            float g[35];
            for (int k = 0; k < n[i]; k++) g[k] = cosf((float)(k * (step + 1)) * 0.37f) + 0.25f * (float)i;
            ctpu_scope_begin();
            ctpu_tensor x = vec(g, n[i]);
            if (i == 1) x = ctpu_cast(x, CTPU_BF16);
            ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(ctpu_mul(ps[i], ps[i]), x), 0, NULL, false)), CTPU_OK);
            ctpu_scope_end();
        }
        double lr = c->lr0 && step == 0 ? 0.0 : ctpu_lr_cosine(0.05, step, FUSED_STEPS + 1, 0.001);
        ck_assert_int_eq(ctpu_optim_set_lr(o, lr), CTPU_OK);
        int64_t d0 = ctpu_metric_counter("ops_dispatched");
        ck_assert_msg(ctpu_optim_step(o) == CTPU_OK, "%s", ctpu_last_error());
        ops[step] = ctpu_metric_counter("ops_dispatched") - d0;
    }
    int at = 0;
    for (int i = 0; i < 3; i++) {
        int ns = c->kind == 2 ? (c->momentum > 0) : 2;
        for (int k = -1; k < ns; k++) {
            ctpu_tensor t = k < 0 ? ps[i] : ctpu_optim_state(o, i, k);
            readt(ctpu_cast(t, CTPU_F32), out + at, n[i]);
            at += (int)n[i];
        }
    }
    ctpu_optim_free(o);
    for (int i = 0; i < 3; i++) ctpu_release(ps[i]);
    ctpu__test_optim_fused(true);
}

START_TEST(t_optim_fused_strict_bits)
{
    const fused_cfg *c = &fused_cfgs[_i];
    float a[3 * FUSED_VALS], b[3 * FUSED_VALS];
    int64_t oa[FUSED_STEPS], ob[FUSED_STEPS];
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    fused_run(c, true, a, oa);
    fused_run(c, false, b, ob);
    for (int i = 0; i < 3 * FUSED_VALS; i++)
        ck_assert_msg(t_same(a[i], b[i]), "config %d value %d: fused %a, op by op %a", _i, i, a[i], b[i]);
    ck_assert(a[0] != sinf(0.0f) || a[1] != sinf(0.61f));   /* it moved */
    /* the last steps replay the one program, op by op dispatches every op */
    bool own_counts = c->skip && c->kind != 2;   /* Adam / AdamW after a skipped parameter */
    if (!c->capturable)
        for (int s = FUSED_STEPS - 2; s < FUSED_STEPS; s++)
            ck_assert_msg(own_counts ? oa[s] >= ob[s] : oa[s] * 4 < ob[s],   /* (in place: its assigns too) */
                          "config %d step %d: %lld ops fused, %lld op by op", _i, s, (long long)oa[s], (long long)ob[s]);
}
END_TEST

/* In defer and fuse, clip_grad_norm over all gradients is one program. */
START_TEST(t_clip_grad_norm_one_program)
{
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    enum { NP = 12 };
    ctpu_tensor ps[NP];
    for (int i = 0; i < NP; i++) {
        int64_t sh[2] = { 3 + i % 4, 5 };
        ps[i] = ctpu_rand_normal(CTPU_F32, 2, sh, 0, 1);
        ctpu_set_requires_grad(ps[i], true);
    }
    ctpu_step_begin();
    ctpu_tensor l = ctpu_zeros(CTPU_F32, 0, NULL);
    for (int i = 0; i < NP; i++) l = ctpu_add(l, ctpu_sum(ctpu_mul(ps[i], ps[i]), 0, NULL, false));
    ck_assert_int_eq(ctpu_backward(l), CTPU_OK);
    ctpu_step_end();
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    int64_t p0 = ctpu_metric_counter("programs_launched");
    ctpu_step_begin();
    ctpu_tensor total = ctpu_clip_grad_norm(NP, ps, 1.0, 2.0);
    ck_assert(!ctpu_is_null(total));
    ctpu_keep(total);
    ctpu_step_end();
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    int64_t p1 = ctpu_metric_counter("programs_launched");
    ck_assert_msg(p1 - p0 == 1, "clip_grad_norm over %d gradients launched %lld programs", NP, (long long)(p1 - p0));
    double v = item(total);
    ck_assert(v > 1);
    /* the gradients now have norm max_norm (within the 1e-6 and roundings) */
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    double ss = 0;
    for (int i = 0; i < NP; i++) {
        double s2 = item(ctpu_sum(ctpu_mul(ctpu_grad(ps[i]), ctpu_grad(ps[i])), 0, NULL, false));
        ss += s2;
    }
    ck_assert_msg(fabs(sqrt(ss) - 1.0) < 1e-5, "clipped norm %g", sqrt(ss));
    for (int i = 0; i < NP; i++) ctpu_release(ps[i]);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("nn");
    TCase *tc = tcase_create("nn");
    tcase_add_checked_fixture(tc, setup, t_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, t_sgd_momentum);
    tcase_add_test(tc, t_adamw);
    tcase_add_test(tc, t_adam_groups);
    tcase_add_test(tc, t_clip_grad_norm);
    tcase_add_test(tc, t_clip_grad_norm_one_program);
    tcase_add_loop_test(tc, t_losses_optimizers_mode_parity, 0, 15);
    tcase_add_loop_test(tc, t_optim_fused_strict_bits, 0, FUSED_NCFG);
    tcase_add_test(tc, t_lr_warmup_cosine);
    tcase_add_test(tc, t_nll_loss);
    tcase_add_test(tc, t_pointwise_losses);
    tcase_add_test(tc, t_optim_errors);
    tcase_add_test(tc, t_schedules);
    tcase_add_test(tc, t_ce_stability);
    tcase_add_test(tc, t_ce_values);
    tcase_add_test(tc, t_ce_bad_labels);
    tcase_add_test(tc, t_mse);
    tcase_add_test(tc, t_linear);
    tcase_add_test(tc, t_initialisers);
    tcase_add_test(tc, t_layer_norm_dropout_embedding);
    tcase_add_test(tc, t_batch_iter);
    tcase_add_test(tc, t_messages_name_the_call);
    tcase_add_test(tc, t_stale_arguments_name_the_call_and_argument);
    suite_add_tcase(s, tc);
    TCase *ti = tcase_create("idx");
    tcase_add_checked_fixture(ti, idx_setup, idx_teardown);
    tcase_add_test(ti, t_idx_reader);
    suite_add_tcase(s, ti);
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
