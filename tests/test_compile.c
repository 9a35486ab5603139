/* Compiled steps (issue 17): capture once, replay with new inputs and
 * scalars; bit-identical to strict eager; guards and their reasons; graph
 * breaks; host state baked into the capture; TORCH_COMPILE_DISABLE. */
#include "t_core.h"
#include "ctpu_nn.h"

static int64_t C(const char *n) { return ctpu_metric_counter(n); }

/* ------------------------------------------------------------ an MLP step */
#define NB 8
#define NI 12
#define NH 16
#define NO 5

typedef struct {
    ctpu_tensor p[4], m[4], v[4];
    double baked;          /* host state fn reads (baked into a capture) */
    int fn_runs;
} mlp;

static ctpu_tensor param(int nd, const int64_t *s, double std)
{
    ctpu_tensor t = std > 0 ? ctpu_rand_normal(CTPU_F32, nd, s, 0, std) : ctpu_zeros(CTPU_F32, nd, s);
    ctpu_keep(t);
    ck_assert_int_eq(ctpu_set_requires_grad(t, true), CTPU_OK);
    return t;
}

static void mlp_init(mlp *md)
{
    memset(md, 0, sizeof *md);
    ctpu_manual_seed(7);
    int64_t s1[2] = { NI, NH }, b1[1] = { NH }, s2[2] = { NH, NO }, b2[1] = { NO };
    md->p[0] = param(2, s1, 0.3);
    md->p[1] = param(1, b1, 0);
    md->p[2] = param(2, s2, 0.3);
    md->p[3] = param(1, b2, 0);
    for (int i = 0; i < 4; i++) {
        int64_t s[8];
        int nd;
        ctpu_shape(md->p[i], s, &nd);
        md->m[i] = ctpu_keep(ctpu_zeros(CTPU_F32, nd, s));
        md->v[i] = ctpu_keep(ctpu_zeros(CTPU_F32, nd, s));
    }
    md->baked = 1.0;
    ctpu_sync();
}

static void mlp_free(mlp *md)
{
    for (int i = 0; i < 4; i++) {
        ctpu_zero_grad(md->p[i]);
        ctpu_release(md->p[i]);
        ctpu_release(md->m[i]);
        ctpu_release(md->v[i]);
    }
}

/* forward, cross entropy, backward, Adam with bias corrections c1, c2 and
 * lr as runtime scalars (scalars[0..2]), dropout on the hidden layer */
static ctpu_status mlp_step(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    mlp *md = ctx;
    md->fn_runs++;
    for (int i = 0; i < 4; i++) ctpu_zero_grad(md->p[i]);
    ctpu_tensor h = ctpu_relu(ctpu_add(ctpu_matmul(in[0], md->p[0]), md->p[1]));
    int64_t hs[2] = { ctpu_dim(in[0], 0), NH };
    ctpu_tensor keep = ctpu_ge_scalar(ctpu_rand_uniform(CTPU_F32, 2, hs, 0, 1), 0.25);
    h = ctpu_mul(h, ctpu_mul_scalar(keep, 1.0 / 0.75));
    ctpu_tensor logits = ctpu_add(ctpu_matmul(h, md->p[2]), md->p[3]);
    ctpu_tensor lp = ctpu_log_softmax(logits, 1);
    ctpu_tensor loss = ctpu_neg(ctpu_mean(ctpu_sum(ctpu_mul(lp, in[1]), 1, (int[]){ 1 }, false), 0, NULL, false));
    ctpu_status st = ctpu_backward(loss);
    if (st != CTPU_OK) return st;
    double c1 = sc[0], c2 = sc[1], lr = sc[2];
    ctpu_no_grad_begin();
    for (int i = 0; i < 4; i++) {
        ctpu_tensor g = ctpu_grad(md->p[i]);
        ctpu_assign(md->m[i], ctpu_add(ctpu_mul_scalar(md->m[i], 0.9), ctpu_mul_scalar(g, 1 - 0.9)));
        ctpu_assign(md->v[i], ctpu_add(ctpu_mul_scalar(md->v[i], 0.999), ctpu_mul_scalar(ctpu_mul(g, g), 1 - 0.999)));
        ctpu_tensor den = ctpu_add_scalar(ctpu_sqrt(ctpu_div_scalar(md->v[i], c2)), 1e-8);
        ctpu_tensor upd = ctpu_div(ctpu_div_scalar(md->m[i], c1), den);
        /* md->baked: host state, baked into the capture */
        ctpu_assign(md->p[i], ctpu_sub(ctpu_mul_scalar(md->p[i], md->baked), ctpu_mul_scalar(upd, lr)));
    }
    ctpu_no_grad_end();
    out[0] = loss;
    out[1] = ctpu_argmax(logits, 1, false);
    return CTPU_OK;
}

static void batch(int step, int nb, float *x, float *y)
{
    uint64_t s = 0x1234567ull + (uint64_t)step * 7919u;
    for (int i = 0; i < nb * NI; i++) x[i] = t_rand_f(&s, -1, 1);
    memset(y, 0, sizeof(float) * (size_t)nb * NO);
    for (int i = 0; i < nb; i++) y[i * NO + (i + step) % NO] = 1;
}

static void scalars_of(int step, double *sc)
{
    double t = step + 1;
    sc[0] = 1 - pow(0.9, t);
    sc[1] = 1 - pow(0.999, t);
    sc[2] = 1e-2 * (1.0 - 0.05 * step);   /* a schedule */
}

typedef struct { float w[NI * NH + NH + NH * NO + NO]; float loss[16]; int32_t am[16][NB]; } run_out;

static void read_params(mlp *md, float *w)
{
    size_t o = 0;
    for (int i = 0; i < 4; i++) {
        int64_t n;
        float *p = t_read(md->p[i], &n);
        memcpy(w + o, p, sizeof(float) * (size_t)n);
        o += (size_t)n;
        free(p);
    }
}

/* steps of the MLP: by calling fn in strict eager (compiled = NULL) or
 * through a compiled step, from mode m */
static void run_mlp(ctpu_mode m, bool compiled, int steps, run_out *r, ctpu_compiled_info *info)
{
    memset(r, 0, sizeof *r);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    mlp md;
    mlp_init(&md);
    ck_assert_int_eq(ctpu_set_mode(m), CTPU_OK);
    ctpu_compiled *c = compiled ? ctpu_compile(mlp_step, &md, NULL) : NULL;
    if (compiled) ck_assert_ptr_nonnull(c);
    for (int s = 0; s < steps; s++) {
        float x[NB * NI], y[NB * NO];
        batch(s, NB, x, y);
        ctpu_scope_begin();
        ctpu_tensor in[2] = { t_f32(x, 2, (int64_t[]){ NB, NI }), t_f32(y, 2, (int64_t[]){ NB, NO }) };
        double sc[3];
        scalars_of(s, sc);
        ctpu_tensor out[2];
        if (compiled) {
            ck_assert_msg(ctpu_compiled_call(c, 2, in, 3, sc, 2, out) == CTPU_OK, "call: %s", ctpu_last_error());
        } else {
            ctpu_scope_begin();
            out[0] = out[1] = CTPU_NULL;
            ck_assert_int_eq(mlp_step(&md, in, sc, out), CTPU_OK);
            ctpu_keep(out[0]);
            ctpu_keep(out[1]);
            ctpu_scope_end();
        }
        double l;
        ck_assert_int_eq(ctpu_item(out[0], &l), CTPU_OK);
        r->loss[s] = (float)l;
        ck_assert_int_eq(ctpu_to_host(out[1], r->am[s], sizeof r->am[s]), CTPU_OK);
        ctpu_scope_end();
    }
    read_params(&md, r->w);
    if (c) {
        ck_assert_int_eq(ctpu_compiled_get_info(c, info), CTPU_OK);
        ctpu_compiled_free(c);
    }
    mlp_free(&md);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
}

static void expect_same(const run_out *a, const run_out *b, int steps)
{
    for (size_t i = 0; i < sizeof a->w / sizeof a->w[0]; i++)
        ck_assert_msg(t_same(a->w[i], b->w[i]), "weight %zu: %.9g vs %.9g", i, a->w[i], b->w[i]);
    for (int s = 0; s < steps; s++) {
        ck_assert_msg(t_same(a->loss[s], b->loss[s]), "loss %d: %.9g vs %.9g", s, a->loss[s], b->loss[s]);
        ck_assert(memcmp(a->am[s], b->am[s], sizeof a->am[s]) == 0);
    }
}

START_TEST(mlp_step_bit_identical_to_strict)
{
    run_out ref, got;
    ctpu_compiled_info info;
    run_mlp(CTPU_MODE_STRICT, false, 6, &ref, NULL);
    ck_assert(ref.loss[5] == ref.loss[5]);
    ctpu_mode modes[3] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    for (int k = 0; k < 3; k++) {
        run_mlp(modes[k], true, 6, &got, &info);
        expect_same(&ref, &got, 6);
        ck_assert_msg(info.captures == 2, "mode %d: captures %d replays %d gf %d gb %d eager %d: %s", k, (int)info.captures, (int)info.replays, (int)info.guard_failures, (int)info.graph_breaks, (int)info.eager_calls, info.last_reason);
        ck_assert_int_eq(info.calls, 6);
        ck_assert_int_eq(info.captures, 2);      /* the second tells the scalar arguments from equal constants */
        ck_assert_int_eq(info.replays, 4);
        ck_assert_int_eq(info.guard_failures, 0);
        ck_assert_int_eq(info.graph_breaks, 0);
    }
}
END_TEST

/* replays do not run fn, record no op and build no key */
START_TEST(replay_runs_no_fn_and_records_nothing)
{
    mlp md;
    mlp_init(&md);
    ctpu_compiled *c = ctpu_compile(mlp_step, &md, &(ctpu_compile_opts){ .name = "mlp" });
    float x[NB * NI], y[NB * NO];
    for (int s = 0; s < 4; s++) {
        batch(s, NB, x, y);
        ctpu_scope_begin();
        ctpu_tensor in[2] = { t_f32(x, 2, (int64_t[]){ NB, NI }), t_f32(y, 2, (int64_t[]){ NB, NO }) };
        double sc[3];
        scalars_of(s, sc);
        ctpu_tensor out[2];
        int64_t rec0 = C("ops_recorded"), disp0 = C("ops_dispatched");
        ck_assert_msg(ctpu_compiled_call(c, 2, in, 3, sc, 2, out) == CTPU_OK, "%s", ctpu_last_error());
        if (s > 1) {
            ck_assert_int_eq(C("ops_recorded"), rec0);
            ck_assert_int_eq(C("ops_dispatched"), disp0);
        } else {
            ck_assert_int_gt(C("ops_recorded"), rec0 + 20);
        }
        ck_assert_int_eq(md.fn_runs, s == 0 ? 1 : 2);
        ck_assert(!ctpu_is_null(out[0]) && !ctpu_requires_grad(out[0]));
        ctpu_scope_end();
    }
    /* the .grads exist after a replay, as after fn */
    for (int i = 0; i < 4; i++) ck_assert(!ctpu_is_null(ctpu_grad(md.p[i])));
    ctpu_compiled_free(c);
    mlp_free(&md);
}
END_TEST

/* a new batch size fails the guard: recaptured, the reason in the cache
 * report's diff format, and still bit-identical */
START_TEST(guard_failure_recaptures_with_reason)
{
    mlp md;
    mlp_init(&md);
    ctpu_compiled *c = ctpu_compile(mlp_step, &md, NULL);
    int sizes[5] = { NB, NB, 4, 4, NB };
    for (int s = 0; s < 5; s++) {
        float x[NB * NI], y[NB * NO];
        batch(s, sizes[s], x, y);
        ctpu_scope_begin();
        ctpu_tensor in[2] = { t_f32(x, 2, (int64_t[]){ sizes[s], NI }), t_f32(y, 2, (int64_t[]){ sizes[s], NO }) };
        double sc[3];
        scalars_of(s, sc);
        ctpu_tensor out[2];
        ck_assert_msg(ctpu_compiled_call(c, 2, in, 3, sc, 2, out) == CTPU_OK, "%s", ctpu_last_error());
        ctpu_scope_end();
        ctpu_compiled_info info;
        ctpu_compiled_get_info(c, &info);
        if (s == 2) ck_assert_msg(t_contains(info.last_reason, "input 0 dim 0: 8 -> 4"), "%s", info.last_reason);
    }
    ctpu_compiled_info info;
    ctpu_compiled_get_info(c, &info);
    /* 8: captured, confirmed; 4: captured (a guard failure), confirmed; 8 again: replayed */
    ck_assert_int_eq(info.captures, 4);
    ck_assert_int_eq(info.guard_failures, 1);
    ck_assert_int_eq(info.replays, 1);
    ctpu_compiled_free(c);
    mlp_free(&md);
}
END_TEST

/* host state fn reads is baked into the capture: md->baked changes after
 * the capture, and the replay still multiplies by the captured value */
/* A guard failure's reason is a diff against the closest captured version
 * (fewest failing guards; ties: the newest), not the latest capture (as
 * TORCH_LOGS=recompiles names each cache entry's failing guard). */
static ctpu_status relu_sum(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    (void)sc;
    out[0] = ctpu_sum(ctpu_relu(in[0]), 0, NULL, false);
    return ctpu_is_null(out[0]) ? ctpu_last_status() : CTPU_OK;
}

START_TEST(guard_reason_names_the_closest_version)
{
    ctpu_compiled *c = ctpu_compile(relu_sum, NULL, NULL);
    ctpu_scope_begin();
    ctpu_tensor a = ctpu_ones(CTPU_F32, 2, (int64_t[]){ 8, 4 });
    ctpu_tensor xs[4] = { a, ctpu_ones(CTPU_F32, 2, (int64_t[]){ 5, 4 }), ctpu_cast(a, CTPU_BF16),
                          ctpu_ones(CTPU_F32, 2, (int64_t[]){ 8, 7 }) };
    int ns[5] = { 1, 2, 1, 1, 1 };
    int which[5] = { 0, 0, 1, 2, 3 };
    const char *want[5] = { "", "n_scalars: 1 -> 2", "input 0 dim 0: 8 -> 5", "input 0 dtype: f32 -> bf16",
                            "input 0 dim 1: 4 -> 7" };
    double sc[2] = { 1, 2 };
    for (int k = 0; k < 5; k++) {
        ctpu_tensor o = CTPU_NULL;
        ck_assert_msg(ctpu_compiled_call(c, 1, &xs[which[k]], ns[k], sc, 1, &o) == CTPU_OK, "%s", ctpu_last_error());
        ctpu_compiled_info info;
        ctpu_compiled_get_info(c, &info);
        ck_assert_msg(t_contains(info.last_reason, want[k]), "call %d: want '%s': '%s'", k, want[k], info.last_reason);
    }
    ctpu_scope_end();
    ctpu_compiled_free(c);
}
END_TEST

/* The storage-sharing guard's reason says which way it changed (it read
 * "input 1: shares storage with input 1, was 0" when two inputs stopped
 * sharing). */
static ctpu_status add2(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    (void)sc;
    out[0] = ctpu_add(in[0], in[1]);
    return ctpu_is_null(out[0]) ? ctpu_last_status() : CTPU_OK;
}

START_TEST(guard_reason_says_how_sharing_changed)
{
    ctpu_compiled *c = ctpu_compile(add2, NULL, NULL);
    ctpu_scope_begin();
    ctpu_tensor a = ctpu_ones(CTPU_F32, 1, (int64_t[]){ 4 }), b = ctpu_ones(CTPU_F32, 1, (int64_t[]){ 4 });
    ctpu_tensor same[2] = { a, a }, apart[2] = { a, b };
    const ctpu_tensor *seq[2] = { same, apart };
    const char *want[2] = { "", "input 1: no longer shares storage with input 0" };
    for (int k = 0; k < 2; k++) {
        ctpu_tensor o = CTPU_NULL;
        ck_assert_msg(ctpu_compiled_call(c, 2, seq[k], 0, NULL, 1, &o) == CTPU_OK, "%s", ctpu_last_error());
        ctpu_compiled_info info;
        ctpu_compiled_get_info(c, &info);
        ck_assert_msg(t_contains(info.last_reason, want[k]), "call %d: want '%s': '%s'", k, want[k], info.last_reason);
    }
    ctpu_compiled *d = ctpu_compile(add2, NULL, NULL);
    for (int k = 0; k < 2; k++) {
        ctpu_tensor o = CTPU_NULL;
        ck_assert_msg(ctpu_compiled_call(d, 2, seq[1 - k], 0, NULL, 1, &o) == CTPU_OK, "%s", ctpu_last_error());
    }
    ctpu_compiled_info info;
    ctpu_compiled_get_info(d, &info);
    ck_assert_msg(t_contains(info.last_reason, "input 1: now shares storage with input 0 (it did not at capture)"), "%s",
                  info.last_reason);
    ctpu_scope_end();
    ctpu_compiled_free(c);
    ctpu_compiled_free(d);
}
END_TEST

START_TEST(host_state_is_baked)
{
    mlp md;
    mlp_init(&md);
    ctpu_compiled *c = ctpu_compile(mlp_step, &md, NULL);
    float x[NB * NI], y[NB * NO];
    batch(0, NB, x, y);
    ctpu_tensor in[2] = { t_f32(x, 2, (int64_t[]){ NB, NI }), t_f32(y, 2, (int64_t[]){ NB, NO }) };
    double sc[3] = { 1, 1, 0 };                 /* lr 0: p = p * baked */
    ctpu_tensor out[2];
    md.baked = 0.75;
    ck_assert_int_eq(ctpu_compiled_call(c, 2, in, 3, sc, 2, out), CTPU_OK);
    int64_t n;
    float *w0 = t_read(md.p[0], &n);
    md.baked = 0.5;                             /* fn would now halve the weights */
    ck_assert_int_eq(ctpu_compiled_call(c, 2, in, 3, sc, 2, out), CTPU_OK);
    float *w1 = t_read(md.p[0], &n);
    for (int64_t i = 0; i < n; i++) ck_assert(t_same(w0[i] * 0.75f, w1[i]));   /* by 0.75, as captured */
    ck_assert_int_eq(md.fn_runs, 1);
    free(w0);
    free(w1);
    ctpu_compiled_free(c);
    mlp_free(&md);
}
END_TEST

/* eager ops between compiled calls act on the same tensors */
START_TEST(eager_and_compiled_mix)
{
    run_out ref, got;
    for (int pass = 0; pass < 2; pass++) {
        run_out *r = pass ? &got : &ref;
        mlp md;
        mlp_init(&md);
        ctpu_compiled *c = pass ? ctpu_compile(mlp_step, &md, NULL) : NULL;
        for (int s = 0; s < 4; s++) {
            float x[NB * NI], y[NB * NO];
            batch(s, NB, x, y);
            ctpu_scope_begin();
            ctpu_tensor in[2] = { t_f32(x, 2, (int64_t[]){ NB, NI }), t_f32(y, 2, (int64_t[]){ NB, NO }) };
            double sc[3];
            scalars_of(s, sc);
            ctpu_tensor out[2] = { CTPU_NULL, CTPU_NULL };
            if (c) ck_assert_int_eq(ctpu_compiled_call(c, 2, in, 3, sc, 2, out), CTPU_OK);
            else ck_assert_int_eq(mlp_step(&md, in, sc, out), CTPU_OK);
            /* an eager update of a parameter and of optimizer state */
            ctpu_no_grad_begin();   /* p[1] is a leaf that requires grad */
            ctpu_assign(md.p[1], ctpu_add_scalar(md.p[1], 0.125));
            ctpu_assign(md.m[0], ctpu_mul_scalar(md.m[0], 0.5));
            ctpu_no_grad_end();
            ctpu_scope_end();
        }
        read_params(&md, r->w);
        ctpu_compiled_free(c);
        mlp_free(&md);
    }
    for (size_t i = 0; i < sizeof ref.w / sizeof ref.w[0]; i++) ck_assert(t_same(ref.w[i], got.w[i]));
}
END_TEST

/* ------------------------------------------------------------ dynamic inputs */
/* x [T, 6] marked dynamic over T in [2, 256]: h = tanh(x @ w), loss =
 * mean(h), backward, w -= lr * grad. The first call compiles the dynamic
 * program; a call at a new extent in range captures fn once more and binds
 * that program (no compile: a dynamic capture, not a guard failure); a call
 * at an extent seen replays; T = 300 is a guard failure with the dynamic
 * key's reason. Bit-identical to strict eager at every extent. */
#define DYN_D 6
static ctpu_status step_dyn(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    ctpu_tensor *w = ctx;
    ctpu_zero_grad(*w);
    ctpu_tensor h = ctpu_tanh(ctpu_matmul(in[0], *w));
    ctpu_tensor loss = ctpu_mean(h, 0, NULL, false);
    ctpu_status st = ctpu_backward(loss);
    if (st != CTPU_OK) return st;
    ctpu_no_grad_begin();
    ctpu_assign(*w, ctpu_sub(*w, ctpu_mul_scalar(ctpu_grad(*w), sc[0])));
    ctpu_no_grad_end();
    out[0] = loss;
    out[1] = h;
    return CTPU_OK;
}

static bool dyn_mark = true;   /* run_dyn_lr marks dim 0 of its input (ctpu_mark_dynamic) */

static void run_dyn_lr(bool compiled, const int64_t *ts, int n, double lr_step, float *loss, float *w_out,
                       ctpu_compiled_info *info, char *reason, size_t rlen)
{
    ctpu_manual_seed(11);
    ctpu_tensor w = ctpu_keep(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ DYN_D, DYN_D }, 0, 0.5));
    ck_assert_int_eq(ctpu_set_requires_grad(w, true), CTPU_OK);
    ctpu_compiled *c = compiled ? ctpu_compile(step_dyn, &w, &(ctpu_compile_opts){ .name = "dyn" }) : NULL;
    float x[300 * DYN_D];
    for (int i = 0; i < 300 * DYN_D; i++) x[i] = (float)((i * 7) % 19) * 0.125f - 1.0f;
    for (int s = 0; s < n; s++) {
        ctpu_scope_begin();
        ctpu_tensor in[1] = { t_f32(x, 2, (int64_t[]){ ts[s], DYN_D }) };
        if (dyn_mark) ck_assert_int_eq(ctpu_mark_dynamic(in[0], 0, 2, 256), CTPU_OK);
        double sc[1] = { 0.25 - lr_step * s };   /* lr_step > 0: a schedule, a new value at every call */
        ctpu_tensor out[2] = { CTPU_NULL, CTPU_NULL };
        if (compiled) {
            ck_assert_msg(ctpu_compiled_call(c, 1, in, 1, sc, 2, out) == CTPU_OK, "call %d: %s", s, ctpu_last_error());
        } else {
            ctpu_scope_begin();
            ck_assert_int_eq(step_dyn(&w, in, sc, out), CTPU_OK);
            ctpu_keep(out[0]);
            ctpu_keep(out[1]);
            ctpu_scope_end();
        }
        ck_assert_int_eq(ctpu_dim(out[1], 0), ts[s]);
        double l;
        ck_assert_int_eq(ctpu_item(out[0], &l), CTPU_OK);
        loss[s] = (float)l;
        ctpu_scope_end();
    }
    float *wv = t_read(w, NULL);
    memcpy(w_out, wv, sizeof(float) * DYN_D * DYN_D);
    free(wv);
    if (c) {
        ck_assert_int_eq(ctpu_compiled_get_info(c, info), CTPU_OK);
        snprintf(reason, rlen, "%s", info->last_reason);
        ctpu_compiled_free(c);
    }
    ctpu_zero_grad(w);
    ctpu_release(w);
}

static void run_dyn(bool compiled, const int64_t *ts, int n, float *loss, float *w_out, ctpu_compiled_info *info,
                    char *reason, size_t rlen)
{
    run_dyn_lr(compiled, ts, n, 0, loss, w_out, info, reason, rlen);
}

/* A new user's report: with a schedule (a new lr at every call) every
 * extent of a dynamic input cost one capture more than its own, to tell
 * the lr argument from an equal constant again. What two captures of the
 * program tell is now shared by all its versions: the value changing
 * between the captures at two extents confirms the argument (no capture
 * for the value at all), and a change at the first extent confirms it
 * once for every extent; bit-identical to strict eager. */
START_TEST(changing_scalars_capture_once_per_program)
{
    static const int64_t a[8] = { 5, 9, 5, 12, 9, 12, 7, 5 }, b[8] = { 5, 5, 9, 5, 12, 9, 12, 7 };
    const int64_t *seqs[2] = { a, b };
    for (int q = 0; q < 2; q++) {
        float lr[8], lc[8], wr[DYN_D * DYN_D], wc[DYN_D * DYN_D];
        ctpu_compiled_info info;
        char reason[192];
        run_dyn_lr(false, seqs[q], 8, 0.01, lr, wr, NULL, NULL, 0);
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
        run_dyn_lr(true, seqs[q], 8, 0.01, lc, wc, &info, reason, sizeof reason);
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
        for (int s = 0; s < 8; s++) ck_assert_msg(t_same(lc[s], lr[s]), "seq %d step %d: %.9g vs %.9g", q, s, lc[s], lr[s]);
        for (int i = 0; i < DYN_D * DYN_D; i++) ck_assert_msg(t_same(wc[i], wr[i]), "seq %d weight %d", q, i);
        ck_assert_int_eq(info.calls, 8);
        ck_assert_int_eq(info.dynamic_captures, 3);   /* 9, 12, 7 */
        ck_assert_int_eq(info.guard_failures, 0);
        /* a: the first capture and the three extents' (lr changed between
         * the captures at 5 and 9: confirmed there); b: one capture more,
         * at the second call (5 again with a new lr), then never again */
        ck_assert_msg(info.captures == (q == 0 ? 4 : 5), "seq %d: %d captures, %d replays: %s", q, (int)info.captures,
                      (int)info.replays, reason);
        ck_assert_int_eq(info.replays, q == 0 ? 4 : 3);
    }
}
END_TEST

/* Two scalars equal at a capture (and equal to a constant of fn): the slot
 * may read either, so a new value of the later one captures again instead of
 * replaying the value the capture baked (a new user's wrong result: (2, 2)
 * then (2, 5) replayed 36 for 90; (7, 7), (8, 8), (8, 9) confirmed the
 * slot as argument 0). */
static ctpu_status amb_fn(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    ctpu_tensor t = ctpu_mul_scalar(in[0], 2.0);
    t = ctpu_add_scalar(t, sc[0]);
    t = ctpu_mul_scalar(t, sc[1]);
    out[0] = ctpu_sum(t, 0, NULL, false);
    return CTPU_OK;
}

START_TEST(equal_scalars_are_not_baked)
{
    static const double seqs[4][8] = {
        { 2, 2, 2, 2, 2, 5, 3, 5 },
        { 7, 7, 8, 8, 8, 9, 1, 9 },
        { 7, 7, 8, 7, 8, 9, 8, 2 },
        { 0, 0, 0, 0, 0, 1, 1, 0 },
    };
    float a[3] = { 1, 2, 3 };
    ctpu_tensor x = ctpu_from_host(a, CTPU_F32, 1, (int64_t[]){ 3 });
    for (int q = 0; q < 4; q++) {
        ctpu_compiled *c = ctpu_compile(amb_fn, NULL, NULL);
        ck_assert_ptr_nonnull(c);
        for (int k = 0; k < 4; k++) {
            double sc[2] = { seqs[q][2 * k], seqs[q][2 * k + 1] }, got, ref;
            ctpu_tensor o = CTPU_NULL, r = CTPU_NULL;
            ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 2, sc, 1, &o), CTPU_OK);
            ck_assert_int_eq(amb_fn(NULL, &x, sc, &r), CTPU_OK);   /* strict eager */
            ck_assert_int_eq(ctpu_item(o, &got), CTPU_OK);
            ck_assert_int_eq(ctpu_item(r, &ref), CTPU_OK);
            ck_assert_msg(got == ref, "seq %d call %d (%g, %g): %g, strict %g", q, k, sc[0], sc[1], got, ref);
            ctpu_release(o);
            ctpu_release(r);
        }
        ctpu_compiled_free(c);
    }
    ctpu_release(x);
}
END_TEST

/* fn calling its own step: an error, not a recursion 64 scopes deep */
static ctpu_status self_fn(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    ctpu_compiled *self = *(ctpu_compiled **)ctx;
    ctpu_tensor o2 = CTPU_NULL;
    ctpu_status st = ctpu_compiled_call(self, 1, in, 0, NULL, 1, &o2);
    if (st != CTPU_OK) return st;
    out[0] = ctpu_add(in[0], o2);
    return CTPU_OK;
}

START_TEST(self_call_is_an_error)
{
    ctpu_compiled *c = NULL;
    c = ctpu_compile(self_fn, &c, NULL);
    ck_assert_ptr_nonnull(c);
    float a[2] = { 1, 2 };
    ctpu_tensor x = ctpu_from_host(a, CTPU_F32, 1, (int64_t[]){ 2 }), o = CTPU_NULL;
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, &o), CTPU_ERR_STATE);
        ck_assert_msg(t_contains(ctpu_last_error(), "called from inside its own call"), "%s", ctpu_last_error());
        ck_assert(ctpu_is_null(o));
    }
    /* the runtime stays usable */
    ctpu_tensor y = ctpu_add(x, x);
    double v;
    ck_assert_int_eq(ctpu_item(ctpu_sum(y, 0, NULL, false), &v), CTPU_OK);
    ck_assert(v == 6.0);
    ctpu_compiled_free(c);
    ctpu_release(x);
}
END_TEST

/* A parameter assigned by the step while a view of it (a slice) is alive:
 * the step reads the parameter's storage through the parameter, not through
 * the view, so the next call (a new view) replays instead of failing the
 * guard "a tensor the step reads was released" every call (a new user's
 * report: an optimizer over a sliced parameter never replayed). */
static ctpu_status halve_fn(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)in, (void)sc, (void)out;
    ctpu_tensor p = *(ctpu_tensor *)ctx;
    return ctpu_assign(p, ctpu_add_scalar(ctpu_mul_scalar(p, 0.5), 1.0));
}

START_TEST(assigned_tensor_with_a_live_view_replays)
{
    float a[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, ref[8], got[8];
    for (int i = 0; i < 8; i++) ref[i] = a[i];
    ctpu_tensor p = ctpu_from_host(a, CTPU_F32, 1, (int64_t[]){ 8 });
    ctpu_compiled *c = ctpu_compile(halve_fn, &p, NULL);
    ck_assert_ptr_nonnull(c);
    for (int k = 0; k < 5; k++) {
        ctpu_tensor view = ctpu_slice(p, 0, 0, 3, 1);
        ck_assert(!ctpu_is_null(view));
        ck_assert_int_eq(ctpu_compiled_call(c, 0, NULL, 0, NULL, 0, NULL), CTPU_OK);
        ctpu_release(view);
        for (int i = 0; i < 8; i++) ref[i] = ref[i] * 0.5f + 1.0f;
    }
    ck_assert_int_eq(ctpu_to_host(p, got, sizeof got), CTPU_OK);
    for (int i = 0; i < 8; i++) ck_assert_msg(t_same(got[i], ref[i]), "%d: %.9g vs %.9g", i, got[i], ref[i]);
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_msg(info.captures == 1 && info.replays == 4 && info.guard_failures == 0,
                  "%d captures, %d replays, %d guard failures", (int)info.captures, (int)info.replays,
                  (int)info.guard_failures);
    ctpu_compiled_free(c);
    ctpu_release(p);
}
END_TEST

/* The frame of the dynamic-extent tests: fn in strict eager once (the
 * reference), then the compiled step in mode k (0: strict, 1: defer and
 * fuse), its losses and weights bit-identical to the reference's; the
 * caller checks r->info and the counters' deltas from compiles0 / binds0. */
typedef struct {
    const int64_t *ts;
    int n;
    float lr[16], wr[DYN_D * DYN_D];
    ctpu_compiled_info info;
    char reason[192];
    int64_t compiles0, binds0;
} dyn_modes_run;

static void dyn_modes_reference(dyn_modes_run *r, const int64_t *ts, int n)
{
    ck_assert_int_le(n, 16);
    r->ts = ts;
    r->n = n;
    run_dyn(false, ts, n, r->lr, r->wr, NULL, NULL, 0);
}

static void dyn_modes_compiled(dyn_modes_run *r, int k)
{
    static const ctpu_mode modes[2] = { CTPU_MODE_STRICT, CTPU_MODE_DEFER_FUSE };
    float lc[16], wc[DYN_D * DYN_D];
    ck_assert_int_eq(ctpu_set_mode(modes[k]), CTPU_OK);
    ctpu_sync();
    r->compiles0 = C("programs_compiled");
    r->binds0 = C("dynamic_binds");
    run_dyn(true, r->ts, r->n, lc, wc, &r->info, r->reason, sizeof r->reason);
    for (int s = 0; s < r->n; s++)
        ck_assert_msg(t_same(lc[s], r->lr[s]), "mode %d step %d: %.9g vs %.9g", k, s, lc[s], r->lr[s]);
    for (int i = 0; i < DYN_D * DYN_D; i++) ck_assert_msg(t_same(wc[i], r->wr[i]), "weight %d", i);
}

/* A new user's report: TORCH_TPU_AUTO_DYNAMIC=1 did nothing for compiled
 * steps (every new extent a guard failure and a capture until the
 * recompile limit). As torch.compile's automatic dynamic shapes: the first
 * guard failure that changes one dim's extent alone recaptures with that
 * dim dynamic (ctpu_mark_dynamic's path), later extents bind the dynamic
 * program without compiling; bit-identical to strict eager. */
START_TEST(auto_dynamic_applies_to_compiled_steps)
{
    ctpu_shutdown();
    setenv("TORCH_TPU_AUTO_DYNAMIC", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    unsetenv("TORCH_TPU_AUTO_DYNAMIC");
    dyn_mark = false;
    static const int64_t ts[8] = { 5, 9, 5, 12, 9, 300, 12, 5 };
    dyn_modes_run r;
    dyn_modes_reference(&r, ts, 8);
    for (int k = 0; k < 2; k++) {
        dyn_modes_compiled(&r, k);
        /* 5: capture; 9: guard failure, the capture with dim 0 dynamic;
         * 12, 300: dynamic captures (bind); 5, 9, 12, 5: replays */
        ck_assert_int_eq(r.info.calls, 8);
        ck_assert_int_eq(r.info.guard_failures, 1);
        ck_assert_int_eq(r.info.captures, 4);
        ck_assert_int_eq(r.info.dynamic_captures, 2);
        ck_assert_int_eq(r.info.replays, 4);
        if (k == 0) {   /* (the cache outlives the step: the second run finds these programs) */
            ck_assert_int_eq(C("programs_compiled") - r.compiles0, 2);   /* T = 5's, and the dynamic program */
            ck_assert_int_ge(C("dynamic_binds") - r.binds0, 2);          /* at 12 and at 300 */
        }
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    }
    dyn_mark = true;
    ctpu_shutdown();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
}
END_TEST

/* A step whose other extents follow the input's (issue 17, char_gpt
 * --compile --by-document): fn slices a position table (a parameter, not
 * an input) to [0, T) with T a host int from ctx, before it first reads
 * x [T, POS_D]; h = tanh((x + pos) @ w), loss = mean(h), backward, SGD on
 * both. At T = POS_CTX the slice is the whole table (a structure of its
 * own). */
#define POS_D 5
#define POS_CTX 16
typedef struct { ctpu_tensor tab, w; int64_t T; } pos_ctx;

static ctpu_status step_pos(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    pos_ctx *p = ctx;
    ctpu_zero_grad(p->tab);
    ctpu_zero_grad(p->w);
    ctpu_tensor pos = ctpu_slice(p->tab, 0, 0, p->T, 1);   /* before x is read */
    ctpu_tensor h = ctpu_tanh(ctpu_matmul(ctpu_add(in[0], pos), p->w));
    ctpu_tensor loss = ctpu_mean(h, 0, NULL, false);
    ctpu_status st = ctpu_backward(loss);
    if (st != CTPU_OK) return st;
    ctpu_no_grad_begin();
    ctpu_assign(p->tab, ctpu_sub(p->tab, ctpu_mul_scalar(ctpu_grad(p->tab), sc[0])));
    ctpu_assign(p->w, ctpu_sub(p->w, ctpu_mul_scalar(ctpu_grad(p->w), sc[0])));
    ctpu_no_grad_end();
    out[0] = loss;
    return CTPU_OK;
}

/* mark: ctpu_mark_dynamic(x, 0, 2, POS_CTX) at each call. w_out: the
 * table, then w. */
static void run_pos(bool compiled, bool mark, const int64_t *ts, int n, float *loss, float *w_out,
                    ctpu_compiled_info *info, int64_t *compiles)
{
    ctpu_manual_seed(13);
    pos_ctx p = { .tab = ctpu_keep(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ POS_CTX, POS_D }, 0, 0.5)),
                  .w = ctpu_keep(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ POS_D, POS_D }, 0, 0.5)) };
    ck_assert_int_eq(ctpu_set_requires_grad(p.tab, true), CTPU_OK);
    ck_assert_int_eq(ctpu_set_requires_grad(p.w, true), CTPU_OK);
    ctpu_compiled *c = compiled ? ctpu_compile(step_pos, &p, &(ctpu_compile_opts){ .name = "pos" }) : NULL;
    float x[POS_CTX * POS_D];
    for (int i = 0; i < POS_CTX * POS_D; i++) x[i] = (float)((i * 5) % 17) * 0.125f - 1.0f;
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);   /* (the tables' own trace in defer and fuse) */
    int64_t compiles0 = C("programs_compiled");
    for (int s = 0; s < n; s++) {
        ctpu_scope_begin();
        p.T = ts[s];
        ctpu_tensor in[1] = { t_f32(x, 2, (int64_t[]){ ts[s], POS_D }) };
        if (mark) ck_assert_int_eq(ctpu_mark_dynamic(in[0], 0, 2, POS_CTX), CTPU_OK);
        double sc[1] = { 0.25 };
        ctpu_tensor out[1] = { CTPU_NULL };
        if (compiled) {
            ck_assert_msg(ctpu_compiled_call(c, 1, in, 1, sc, 1, out) == CTPU_OK, "call %d: %s", s, ctpu_last_error());
        } else {
            ctpu_scope_begin();
            ck_assert_int_eq(step_pos(&p, in, sc, out), CTPU_OK);
            ctpu_keep(out[0]);
            ctpu_scope_end();
        }
        double l;
        ck_assert_int_eq(ctpu_item(out[0], &l), CTPU_OK);
        loss[s] = (float)l;
        ctpu_scope_end();
    }
    if (compiles) *compiles = C("programs_compiled") - compiles0;
    float *tv = t_read(p.tab, NULL), *wv = t_read(p.w, NULL);
    memcpy(w_out, tv, sizeof(float) * POS_CTX * POS_D);
    memcpy(w_out + POS_CTX * POS_D, wv, sizeof(float) * POS_D * POS_D);
    free(tv);
    free(wv);
    if (c) {
        ck_assert_int_eq(ctpu_compiled_get_info(c, info), CTPU_OK);
        ctpu_compiled_free(c);
    }
    ctpu_zero_grad(p.tab);
    ctpu_zero_grad(p.w);
    ctpu_release(p.tab);
    ctpu_release(p.w);
}

/* torch.compile's automatic dynamic shapes: after the guard failure on
 * T the recompiled graph treats T as symbolic and the sizes derived from
 * it follow, here a slice of a parameter by the host int T made before the
 * input is read (the symbol is live from the capture's start, the rule
 * ctpu_mark_dynamic follows): T = POS_CTX's program, the dynamic program
 * at the first shorter T, and every later T binds it (before: a capture
 * and a compile per T, the slice at a static extent). With
 * ctpu_mark_dynamic instead: one program for every T. Bit-identical to
 * strict eager. */
START_TEST(auto_dynamic_follows_a_slice_by_the_host_extent)
{
    static const int64_t ts[8] = { POS_CTX, 9, 12, 5, 9, 7, 12, 3 };
    float lr[8], lc[8], wr[POS_CTX * POS_D + POS_D * POS_D], wc[POS_CTX * POS_D + POS_D * POS_D];
    ctpu_compiled_info info;
    ctpu_shutdown();
    setenv("TORCH_TPU_AUTO_DYNAMIC", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    unsetenv("TORCH_TPU_AUTO_DYNAMIC");
    run_pos(false, false, ts, 8, lr, wr, NULL, NULL);
    ctpu_mode modes[2] = { CTPU_MODE_STRICT, CTPU_MODE_DEFER_FUSE };
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(ctpu_set_mode(modes[k]), CTPU_OK);
        int64_t compiles;
        run_pos(true, false, ts, 8, lc, wc, &info, &compiles);
        for (int s = 0; s < 8; s++) ck_assert_msg(t_same(lc[s], lr[s]), "mode %d step %d: %.9g vs %.9g", k, s, lc[s], lr[s]);
        for (size_t i = 0; i < sizeof wr / sizeof wr[0]; i++) ck_assert_msg(t_same(wc[i], wr[i]), "mode %d weight %zu", k, i);
        /* 16: capture; 9: guard failure, the capture with T dynamic; 12,
         * 5, 7, 3: dynamic captures (bind); 9, 12: replays */
        ck_assert_int_eq(info.guard_failures, 1);
        ck_assert_int_eq(info.dynamic_captures, 4);
        ck_assert_int_eq(info.replays, 2);
        ck_assert_int_eq(compiles, (k == 0 ? 2 : 0));   /* (the cache outlives the step: the second run finds them) */
        char *j = ctpu_metrics_json();   /* the step's row in the report names the dims */
        ck_assert_msg(j && t_contains(j, "input 0 dim 0 became dynamic over [2, 2147483647]"), "%s", j ? j : "");
        free(j);
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    }
    ctpu_shutdown();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    /* marked by the caller: every T in [2, POS_CTX) binds the program the
     * first call compiled */
    static const int64_t tm[6] = { 9, 12, 5, 9, 7, 3 };
    run_pos(false, true, tm, 6, lr, wr, NULL, NULL);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    int64_t compiles;
    run_pos(true, true, tm, 6, lc, wc, &info, &compiles);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    for (int s = 0; s < 6; s++) ck_assert_msg(t_same(lc[s], lr[s]), "marked step %d: %.9g vs %.9g", s, lc[s], lr[s]);
    for (size_t i = 0; i < sizeof wr / sizeof wr[0]; i++) ck_assert_msg(t_same(wc[i], wr[i]), "marked weight %zu", i);
    ck_assert_int_eq(info.guard_failures, 0);
    ck_assert_int_eq(info.dynamic_captures, 4);
    ck_assert_int_eq(compiles, 1);
}
END_TEST

/* torch.compile's automatic dynamic shapes make each size that changes
 * dynamic, keeping those before: x [B, T], T changes first, then B. */
static ctpu_status step_bt(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    ctpu_tensor h = ctpu_tanh(ctpu_mul_scalar(in[0], sc[0]));
    out[0] = ctpu_mean(ctpu_mul(h, h), 0, NULL, false);
    return ctpu_is_null(out[0]) ? ctpu_last_status() : CTPU_OK;
}

START_TEST(auto_dynamic_makes_each_changing_dim_dynamic)
{
    ctpu_shutdown();
    setenv("TORCH_TPU_AUTO_DYNAMIC", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    unsetenv("TORCH_TPU_AUTO_DYNAMIC");
    static const int64_t bt[8][2] = { { 4, 5 }, { 4, 9 }, { 4, 12 }, { 6, 12 }, { 3, 7 }, { 6, 5 }, { 4, 9 }, { 3, 7 } };
    float x[6 * 12];
    for (int i = 0; i < 6 * 12; i++) x[i] = (float)((i * 7) % 23) * 0.0625f - 0.5f;
    double ref[8];
    for (int k = 0; k < 8; k++) {   /* strict eager's values */
        ctpu_scope_begin();
        ctpu_tensor in[1] = { t_f32(x, 2, bt[k]) }, out[1];
        double sc[1] = { 0.75 };
        ck_assert_int_eq(step_bt(NULL, in, sc, out), CTPU_OK);
        ck_assert_int_eq(ctpu_item(out[0], &ref[k]), CTPU_OK);
        ctpu_scope_end();
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    ctpu_compiled *c = ctpu_compile(step_bt, NULL, &(ctpu_compile_opts){ .name = "bt" });
    int64_t compiles0 = C("programs_compiled");
    for (int k = 0; k < 8; k++) {
        ctpu_scope_begin();
        ctpu_tensor in[1] = { t_f32(x, 2, bt[k]) }, out[1];
        double sc[1] = { 0.75 }, a;
        ck_assert_msg(ctpu_compiled_call(c, 1, in, 1, sc, 1, out) == CTPU_OK, "call %d: %s", k, ctpu_last_error());
        ck_assert_int_eq(ctpu_item(out[0], &a), CTPU_OK);
        ck_assert_msg(t_same((float)a, (float)ref[k]), "call %d: %.9g vs %.9g", k, a, ref[k]);
        ctpu_scope_end();
    }
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    int64_t compiles = C("programs_compiled") - compiles0;
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    /* (4, 5): capture; (4, 9): T dynamic; (4, 12): bind; (6, 12): B dynamic
     * too; (3, 7), (6, 5): bind; (4, 9), (3, 7): replays */
    ck_assert_int_eq(info.guard_failures, 2);
    ck_assert_int_eq(info.dynamic_captures, 3);
    ck_assert_int_eq(info.replays, 2);
    ck_assert_int_eq(compiles, 3);
    char *j = ctpu_metrics_json();
    ck_assert_msg(j && t_contains(j, "input 0 dim 1 became dynamic") && t_contains(j, "input 0 dim 0 became dynamic"),
                  "%s", j ? j : "");
    free(j);
    ctpu_compiled_free(c);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    ctpu_shutdown();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
}
END_TEST

START_TEST(dynamic_input_binds_one_program)
{
    static const int64_t ts[8] = { 5, 9, 5, 12, 9, 300, 12, 5 };
    dyn_modes_run r;
    dyn_modes_reference(&r, ts, 8);
    for (int k = 0; k < 2; k++) {
        dyn_modes_compiled(&r, k);
        /* 5: capture, compile; 9, 12: dynamic captures (bind); 5, 9, 12, 5: replays; 300: guard failure */
        ck_assert_int_eq(r.info.calls, 8);
        ck_assert_int_eq(r.info.dynamic_captures, 2);
        ck_assert_int_eq(r.info.captures, 4);
        ck_assert_int_eq(r.info.replays, 4);
        ck_assert_int_eq(r.info.guard_failures, 1);
        ck_assert_msg(t_contains(r.reason, "guard failed: input 0 dim 0 = 300 outside dynamic range [2, 256]"), "%s", r.reason);
        if (k == 0) {   /* (the cache outlives the step: the second run finds these programs) */
            ck_assert_int_eq(C("programs_compiled") - r.compiles0, 2);   /* the dynamic program, and T = 300's */
            ck_assert_int_eq(C("dynamic_binds") - r.binds0, 2);          /* at 9 and at 12 */
        }
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    }
}
END_TEST

/* A new user's report: the cache report's shape-policy histogram counted a
 * dynamic compiled step's replays at the extent the program last launched
 * at (extents 3, 4, 9, 5, 9, 9, 4 read "3 (1), 4 (1), 5 (4), 9 (1)"), so
 * the pad/bucket prices and the advice came from the wrong mix; a replay
 * counts at its version's extents, as defer and fuse's launches do. And a
 * freed step that replayed kept its row's state ("replays", was "not
 * captured"). */
START_TEST(dynamic_replays_count_at_their_extents)
{
    static const int64_t ts[7] = { 5, 9, 5, 12, 9, 12, 5 };
    float l[7], w[DYN_D * DYN_D];
    ctpu_compiled_info info;
    char reason[192];
    run_dyn(true, ts, 7, l, w, &info, reason, sizeof reason);
    ck_assert_int_eq(info.replays, 4);
    char *txt = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&txt, &len);
    ck_assert_int_eq(ctpu_cache_report(f), CTPU_OK);
    fclose(f);
    ck_assert_msg(t_contains(txt, "extents (launches): 5 (3), 9 (2), 12 (2)"), "%s", txt);
    const char *row = strstr(txt, "dyn (freed)");
    ck_assert_msg(row, "%s", txt);
    const char *eol = strchr(row, '\n');
    ck_assert_msg(eol && eol - row > 8 && strncmp(eol - 7, "replays", 7) == 0, "%.*s", (int)(eol ? eol - row : 80), row);
    free(txt);
}
END_TEST

/* ------------------------------------------------------------ random draws at every replay */
/* A new user's report: SDPA's built-in dropout in a compiled step reused
 * the capture's mask at every replay and left the generator behind (offset
 * 16, 16, 16 where strict eager goes 16, 32, 48), while rand_like and
 * dropout were right: only rand_uniform / rand_normal nodes were noted as
 * draws. Every op that draws (SDPA's forward, randint, dropout, rand_like)
 * advances the generator at each replay as in strict eager, and SDPA's
 * backward reads its forward's new draw. */
#define RD_T 6
#define RD_D 4
static ctpu_status step_draws(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    ctpu_tensor *w = ctx;
    (void)sc;
    ctpu_zero_grad(*w);
    ctpu_tensor q = ctpu_reshape(ctpu_matmul(in[0], *w), 4, (int64_t[]){ 1, 1, RD_T, RD_D });
    ctpu_tensor a = ctpu_scaled_dot_product_attention(q, q, q, CTPU_NULL, CTPU_MASK_NONE, true, 0, 0.5);
    ctpu_tensor d = ctpu_dropout(in[0], 0.3, true);
    ctpu_tensor r = ctpu_add(ctpu_randint_like(in[0], 0, 7), ctpu_rand_like(in[0]));
    ctpu_tensor loss = ctpu_sum(ctpu_mul(a, a), 0, NULL, false);
    ctpu_status st = ctpu_backward(loss);
    if (st != CTPU_OK) return st;
    out[0] = a;
    out[1] = ctpu_add(d, r);
    out[2] = ctpu_contiguous(ctpu_grad(*w));
    return CTPU_OK;
}

static void run_draws(bool compiled, int n, float (*res)[3][RD_T * RD_D], uint64_t *offs)
{
    ctpu_manual_seed(21);
    ctpu_tensor w = ctpu_keep(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ RD_D, RD_D }, 0, 0.7));
    ck_assert_int_eq(ctpu_set_requires_grad(w, true), CTPU_OK);
    ctpu_compiled *c = compiled ? ctpu_compile(step_draws, &w, &(ctpu_compile_opts){ .name = "draws" }) : NULL;
    float x[RD_T * RD_D];
    for (int i = 0; i < RD_T * RD_D; i++) x[i] = (float)((i * 5) % 11) * 0.25f - 1.0f;
    for (int s = 0; s < n; s++) {
        ctpu_scope_begin();
        ctpu_tensor in[1] = { t_f32(x, 2, (int64_t[]){ RD_T, RD_D }) };
        ctpu_tensor out[3] = { CTPU_NULL, CTPU_NULL, CTPU_NULL };
        if (compiled)
            ck_assert_msg(ctpu_compiled_call(c, 1, in, 0, NULL, 3, out) == CTPU_OK, "call %d: %s", s, ctpu_last_error());
        else ck_assert_int_eq(step_draws(&w, in, NULL, out), CTPU_OK);
        memset(res[s], 0, sizeof res[s]);
        for (int j = 0; j < 3; j++)   /* (the gradient of w: [RD_D, RD_D]) */
            ck_assert_int_eq(ctpu_to_host(out[j], res[s][j], sizeof(float) * (j < 2 ? RD_T : RD_D) * RD_D), CTPU_OK);
        uint64_t seed;
        ck_assert_int_eq(ctpu_rng_get_state(&seed, &offs[s]), CTPU_OK);
        ctpu_scope_end();
    }
    if (c) {
        ctpu_compiled_info info;
        ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
        ck_assert_int_eq(info.captures, 1);
        ck_assert_int_eq(info.replays, n - 1);
        ctpu_compiled_free(c);
    }
    ctpu_zero_grad(w);
    ctpu_release(w);
}

START_TEST(random_draws_advance_at_every_replay)
{
    enum { N = 4 };
    float er[N][3][RD_T * RD_D], cr[N][3][RD_T * RD_D];
    uint64_t eo[N], co[N];
    run_draws(false, N, er, eo);
    for (int s = 1; s < N; s++) ck_assert_msg(memcmp(er[s][0], er[0][0], sizeof er[0][0]) != 0, "eager call %d", s);
    ctpu_mode modes[2] = { CTPU_MODE_STRICT, CTPU_MODE_DEFER_FUSE };
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(ctpu_set_mode(modes[k]), CTPU_OK);
        run_draws(true, N, cr, co);
        for (int s = 0; s < N; s++) {
            ck_assert_msg(co[s] == eo[s], "mode %d call %d: rng offset %llu, strict eager %llu", k, s,
                          (unsigned long long)co[s], (unsigned long long)eo[s]);
            for (int j = 0; j < 3; j++)
                for (int i = 0; i < RD_T * RD_D; i++)
                    ck_assert_msg(t_same(cr[s][j][i], er[s][j][i]), "mode %d call %d out %d [%d]: %.9g vs %.9g", k,
                                  s, j, i, cr[s][j][i], er[s][j][i]);
        }
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    }
}
END_TEST

/* The same report: a dynamic input with a random op compiled at every new
 * extent (compiles 1, 2, 2, 3, 3, 4 for 5, 9, 5, 12, 9, 300), while the
 * counters called each a bind: dropout's rand_uniform was made at the
 * input's concrete shape, a static dim in the dynamic key. Its draws now
 * take the input's dynamic dims (as rand_like, zeros_like), so the one
 * dynamic program binds; bit-identical to strict eager. */
static ctpu_status step_dyn_drop(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    (void)sc;
    out[0] = ctpu_sum(ctpu_softmax(ctpu_mul_scalar(in[0], 2), 1), 1, (int[]){ 0 }, false);
    out[1] = ctpu_add(ctpu_dropout(in[0], 0.5, true), ctpu_add(ctpu_rand_like(in[0]), ctpu_zeros_like(in[0])));
    return CTPU_OK;
}

static void run_dyn_drop(bool compiled, const int64_t *ts, int n, float *got, uint64_t *offs, ctpu_compiled_info *info)
{
    ctpu_manual_seed(5);
    ctpu_compiled *c = compiled ? ctpu_compile(step_dyn_drop, NULL, &(ctpu_compile_opts){ .name = "dyn_drop" }) : NULL;
    float x[300 * DYN_D];
    for (int i = 0; i < 300 * DYN_D; i++) x[i] = (float)((i * 7) % 19) * 0.125f - 1.0f;
    for (int s = 0; s < n; s++) {
        ctpu_scope_begin();
        ctpu_tensor in[1] = { t_f32(x, 2, (int64_t[]){ ts[s], DYN_D }) };
        ck_assert_int_eq(ctpu_mark_dynamic(in[0], 0, 2, 256), CTPU_OK);
        ctpu_tensor out[2] = { CTPU_NULL, CTPU_NULL };
        if (compiled)
            ck_assert_msg(ctpu_compiled_call(c, 1, in, 0, NULL, 2, out) == CTPU_OK, "call %d: %s", s, ctpu_last_error());
        else ck_assert_int_eq(step_dyn_drop(NULL, in, NULL, out), CTPU_OK);
        ck_assert_int_eq(ctpu_to_host(out[0], got + s * 301 * DYN_D, sizeof(float) * DYN_D), CTPU_OK);
        ck_assert_int_eq(ctpu_to_host(out[1], got + s * 301 * DYN_D + DYN_D, sizeof(float) * (size_t)(ts[s] * DYN_D)),
                         CTPU_OK);
        uint64_t seed;
        ck_assert_int_eq(ctpu_rng_get_state(&seed, &offs[s]), CTPU_OK);
        ctpu_scope_end();
    }
    if (c) {
        ck_assert_int_eq(ctpu_compiled_get_info(c, info), CTPU_OK);
        ctpu_compiled_free(c);
    }
}

START_TEST(dynamic_input_with_a_random_op_binds_one_program)
{
    static const int64_t ts[8] = { 5, 9, 5, 12, 9, 300, 12, 5 };
    static float er[8 * 301 * DYN_D], cr[8 * 301 * DYN_D];
    uint64_t eo[8], co[8];
    ctpu_compiled_info info;
    run_dyn_drop(false, ts, 8, er, eo, NULL);
    ctpu_sync();
    int64_t compiles0 = C("programs_compiled"), binds0 = C("dynamic_binds");
    run_dyn_drop(true, ts, 8, cr, co, &info);
    for (int s = 0; s < 8; s++) {
        ck_assert_msg(co[s] == eo[s], "call %d: rng offset %llu, strict eager %llu", s, (unsigned long long)co[s],
                      (unsigned long long)eo[s]);
        for (int i = 0; i < (int)(ts[s] + 1) * DYN_D; i++)
            ck_assert_msg(t_same(cr[s * 301 * DYN_D + i], er[s * 301 * DYN_D + i]), "call %d [%d]", s, i);
    }
    ck_assert_int_eq(info.dynamic_captures, 2);
    ck_assert_int_eq(info.captures, 4);
    ck_assert_int_eq(info.replays, 4);
    ck_assert_int_eq(info.guard_failures, 1);
    ck_assert_int_eq(C("programs_compiled") - compiles0, 2);   /* the dynamic program, and T = 300's */
    ck_assert_int_eq(C("dynamic_binds") - binds0, 2);          /* at 9 and at 12 */
}
END_TEST

/* ------------------------------------------------------------ graph breaks */
typedef struct { ctpu_tensor w; double seen; int runs; } brk;

static ctpu_status step_with_item(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    brk *b = ctx;
    b->runs++;
    ctpu_tensor s = ctpu_sum(ctpu_mul(in[0], b->w), 0, NULL, false);
    ctpu_set_host_read_label("s.item");
    ctpu_status st = ctpu_item(s, &b->seen);    /* a graph break */
    ctpu_set_host_read_label(NULL);
    if (st != CTPU_OK) return st;
    ctpu_assign(b->w, ctpu_add_scalar(b->w, sc[0] * (b->seen > 0 ? 1 : -1)));
    out[0] = ctpu_mul_scalar(s, 2.0);
    return CTPU_OK;
}

START_TEST(graph_break_runs_as_defer_and_fuse)
{
    brk b = { .w = ctpu_keep(T_VEC(1, 2, 3)) };
    ctpu_compiled *c = ctpu_compile(step_with_item, &b, NULL);
    ctpu_tensor x = ctpu_keep(T_VEC(1, -1, 1));
    double sc[1] = { 0.5 };
    for (int s = 0; s < 3; s++) {
        ctpu_tensor out[1];
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 1, sc, 1, out), CTPU_OK);
        double v;
        ck_assert_int_eq(ctpu_item(out[0], &v), CTPU_OK);
        ck_assert(v == 2 * b.seen);
        ctpu_release(out[0]);
    }
    ck_assert_int_eq(b.runs, 3);                /* fn runs at every call */
    float *w = t_read(b.w, NULL);               /* 1,2,3: sum 2 -> +0.5; 2.5 -> +0.5; 3 -> +0.5 */
    ck_assert(w[0] == 2.5f && w[1] == 3.5f && w[2] == 4.5f);
    free(w);
    ctpu_compiled_info info;
    ctpu_compiled_get_info(c, &info);
    ck_assert_int_eq(info.graph_breaks, 1);
    ck_assert_int_eq(info.replays, 0);
    ck_assert_int_eq(info.eager_calls, 2);
    /* issue 11's numbering: mul #1, sum #2, the read #3 */
    ck_assert_msg(t_contains(info.last_reason, "graph break (at op #3): host read (item) of f32[] at s.item"), "%s",
                  info.last_reason);
    ctpu_compiled_free(c);
    ctpu_release(x);
    ctpu_release(b.w);
}
END_TEST

START_TEST(fullgraph_break_is_an_error_and_changes_nothing)
{
    brk b = { .w = ctpu_keep(T_VEC(1, 2, 3)) };
    ctpu_compiled *c = ctpu_compile(step_with_item, &b, &(ctpu_compile_opts){ .name = "strict_graph", .fullgraph = true });
    ctpu_tensor x = ctpu_keep(T_VEC(1, -1, 1));
    double sc[1] = { 0.5 };
    ctpu_tensor out[1] = { { 99 } };
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 1, sc, 1, out), CTPU_ERR_STATE);
    ck_assert_msg(t_contains(ctpu_last_error(), "compiled step strict_graph: fullgraph: graph break (at op #3): host read (item)"), "%s",
                  ctpu_last_error());
    ck_assert(ctpu_is_null(out[0]));
    float *w = t_read(b.w, NULL);
    ck_assert(w[0] == 1 && w[1] == 2 && w[2] == 3);
    free(w);
    ctpu_compiled_free(c);
    ctpu_release(x);
    ctpu_release(b.w);
}
END_TEST

/* ctpu_sync, ctpu_mark_step or ctpu_step_end inside fn: a graph break; under
 * fullgraph an error naming the op number and label, raised before anything
 * is cut or run (the assign before it is not applied, no step counted) */
typedef struct { brk b; int how; } cut_ctx;

static ctpu_status step_with_cut(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    cut_ctx *k = ctx;
    (void)sc;
    if (k->how == 2) ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
    ctpu_tensor y = ctpu_mul(in[0], k->b.w);                          /* #1 */
    ck_assert_int_eq(ctpu_assign(k->b.w, ctpu_add_scalar(y, 1)), CTPU_OK);   /* #2, #3 (assign) */
    ck_assert_int_eq(ctpu_label_push("opt"), CTPU_OK);
    ctpu_tensor z = ctpu_exp(y);                                       /* #4 */
    ctpu_status st = k->how == 0 ? ctpu_sync() : k->how == 1 ? ctpu_mark_step() : ctpu_step_end();
    ctpu_label_pop();
    out[0] = ctpu_add_scalar(z, 1);
    return st;
}

START_TEST(fullgraph_sync_and_mark_step_fail_before_the_cut)
{
    static const char *const names[3] = { "sync", "mark_step", "step_end" };
    for (int how = 0; how < 3; how++) {
        cut_ctx k = { .b = { .w = ctpu_keep(T_VEC(1, 2, 3)) }, .how = how };
        ctpu_tensor x = ctpu_keep(T_VEC(1, -1, 1));
        ctpu_sync();
        int64_t cuts0 = C("trace_cuts"), steps0 = C("marked_steps"), launched0 = C("programs_launched");
        ctpu_compiled *c = ctpu_compile(step_with_cut, &k, &(ctpu_compile_opts){ .name = "cut", .fullgraph = true });
        ctpu_tensor out[1] = { { 99 } };
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_ERR_STATE);
        char want[160];
        snprintf(want, sizeof want, "compiled step cut: fullgraph: graph break (after op #4, \"opt\"): a trace cut (%s)",
                 names[how]);
        ck_assert_msg(t_contains(ctpu_last_error(), want), "%s", ctpu_last_error());
        ck_assert(ctpu_is_null(out[0]));
        ck_assert_int_eq(C("trace_cuts"), cuts0);
        ck_assert_int_eq(C("marked_steps"), steps0);
        ck_assert_int_eq(C("programs_launched"), launched0);
        float *w = t_read(k.b.w, NULL);
        ck_assert(w[0] == 1 && w[1] == 2 && w[2] == 3);   /* the assign did not run */
        free(w);
        ctpu_compiled_free(c);
        /* without fullgraph: a graph break, the call runs as defer and fuse */
        c = ctpu_compile(step_with_cut, &k, &(ctpu_compile_opts){ .name = "cut2" });
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
        ctpu_compiled_info info;
        ctpu_compiled_get_info(c, &info);
        ck_assert_int_eq(info.graph_breaks, 1);
        snprintf(want, sizeof want, "graph break (after op #4, \"opt\"): a trace cut (%s)", names[how]);
        ck_assert_msg(t_contains(info.last_reason, want), "%s", info.last_reason);
        w = t_read(k.b.w, NULL);
        ck_assert(w[0] == 2 && w[1] == -1 && w[2] == 4);
        free(w);
        ctpu_release(out[0]);
        ctpu_compiled_free(c);
        ctpu_release(x);
        ctpu_release(k.b.w);
    }
}
END_TEST

/* A mode change inside fn (ctpu_set_thread_mode) is a graph break after
 * the last op, named with its label; fullgraph: an error, nothing ran. */
static ctpu_status step_mode_change(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    brk *b = ctx;
    (void)sc;
    ctpu_tensor y = ctpu_mul(in[0], b->w);                                       /* #1 */
    ck_assert_int_eq(ctpu_assign(b->w, ctpu_add_scalar(y, 1)), CTPU_OK);         /* #2, #3 */
    ck_assert_int_eq(ctpu_label_push("mode"), CTPU_OK);
    ctpu_status st = ctpu_set_thread_mode(CTPU_MODE_STRICT);
    ctpu_label_pop();
    if (st != CTPU_OK) return st;
    out[0] = ctpu_exp(y);
    ctpu_clear_thread_mode();
    return CTPU_OK;
}

START_TEST(mode_change_is_a_graph_break)
{
    for (int fg = 1; fg >= 0; fg--) {
        brk b = { .w = ctpu_keep(T_VEC(1, 2, 3)) };
        ctpu_tensor x = ctpu_keep(T_VEC(1, -1, 1));
        ctpu_compiled *c = ctpu_compile(step_mode_change, &b, &(ctpu_compile_opts){ .name = "mc", .fullgraph = fg });
        ctpu_tensor out[1];
        const char *want = "graph break (after op #3, \"mode\"): set_thread_mode";
        for (int call = 0; call < 2; call++) {
            ctpu_status st = ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out);
            float *w = t_read(b.w, NULL);
            if (fg) {
                ck_assert_int_eq(st, CTPU_ERR_STATE);
                ck_assert_msg(t_contains(ctpu_last_error(), want), "%s", ctpu_last_error());
                ck_assert(w[0] == 1 && w[1] == 2 && w[2] == 3);   /* nothing ran */
            } else {
                ck_assert_msg(st == CTPU_OK, "%s", ctpu_last_error());
                float *o = t_read(out[0], NULL);
                float y0 = call == 0 ? 1.0f : 2.0f;                /* w[0] is 1, then 2 */
                ck_assert(t_same(o[0], expf(y0)));
                free(o);
                ck_assert(w[0] == (call == 0 ? 2 : 3));            /* w = x * w + 1 each call */
                ctpu_release(out[0]);
            }
            free(w);
        }
        ctpu_compiled_info info;
        ctpu_compiled_get_info(c, &info);
        if (!fg) {
            ck_assert_int_eq(info.graph_breaks, 1);
            ck_assert_int_eq(info.replays, 0);
            ck_assert_msg(t_contains(info.last_reason, want), "%s", info.last_reason);
        }
        ctpu_compiled_free(c);
        ctpu_release(x);
        ctpu_release(b.w);
    }
}
END_TEST

/* A branch on a tensor's value inside fn needs a host read: a graph break,
 * so every call runs fn (as defer and fuse) and the branch follows the data
 * at each call, as torch.compile's graph break does (never a baked branch). */
static ctpu_status step_branch(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    brk *b = ctx;
    (void)sc;
    double s;
    ctpu_status st = ctpu_item(ctpu_sum(in[0], 0, NULL, false), &s);
    if (st != CTPU_OK) return st;
    b->runs++;
    out[0] = s > 0 ? ctpu_mul_scalar(in[0], 2) : ctpu_neg(in[0]);
    return CTPU_OK;
}

START_TEST(data_dependent_branch_follows_the_data)
{
    brk b = { .w = CTPU_NULL };
    ctpu_compiled *c = ctpu_compile(step_branch, &b, &(ctpu_compile_opts){ .name = "branch" });
    static const float xs[4][2] = { { 1, 2 }, { -3, 1 }, { 2, 2 }, { -1, -1 } };
    for (int call = 0; call < 4; call++) {
        ctpu_scope_begin();
        ctpu_tensor x = t_f32(xs[call], 1, (int64_t[]){ 2 });
        ctpu_tensor out[1];
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
        float *o = t_read(out[0], NULL);
        bool pos = xs[call][0] + xs[call][1] > 0;
        for (int i = 0; i < 2; i++) ck_assert(o[i] == (pos ? 2 * xs[call][i] : -xs[call][i]));
        free(o);
        ctpu_scope_end();
    }
    ck_assert_int_eq(b.runs, 4);
    ctpu_compiled_info info;
    ctpu_compiled_get_info(c, &info);
    ck_assert_int_eq(info.graph_breaks, 1);
    ck_assert_int_eq(info.replays, 0);
    ck_assert_msg(t_contains(info.last_reason, "graph break (at op #2): host read (item)"), "%s", info.last_reason);
    ctpu_compiled_free(c);
}
END_TEST

static ctpu_status step_nested(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    ctpu_compiled *inner = ctx;
    ctpu_tensor t[1];
    ctpu_status st = ctpu_compiled_call(inner, 1, in, 1, sc, 1, t);
    if (st != CTPU_OK) return st;
    out[0] = ctpu_add_scalar(t[0], 1);
    return CTPU_OK;
}

static ctpu_status step_scale(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    out[0] = ctpu_mul_scalar(in[0], sc[0]);
    return CTPU_OK;
}

/* graph breaks name the op by issue 11's numbering (from 1 in the call, in
 * dispatch order: ops made before the call do not count) and its label */
static ctpu_status step_labelled_item(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    brk *b = ctx;
    (void)sc;
    ck_assert_int_eq(ctpu_label_push("fwd"), CTPU_OK);
    ctpu_tensor s = ctpu_sum(ctpu_exp(ctpu_mul(in[0], b->w)), 0, NULL, false);   /* #1 #2 #3 */
    ck_assert_int_eq(ctpu_label_push("read"), CTPU_OK);
    ctpu_status st = ctpu_item(s, &b->seen);                                     /* #4 */
    ctpu_label_pop();
    ctpu_label_pop();
    out[0] = ctpu_add_scalar(s, 1);
    return st;
}

START_TEST(graph_break_uses_step_op_numbers_and_labels)
{
    brk b = { .w = ctpu_keep(T_VEC(1, 2, 3)) };
    ctpu_tensor x = ctpu_keep(T_VEC(1, -1, 1));
    for (int i = 0; i < 5; i++) ctpu_release(ctpu_add_scalar(x, 1));   /* numbered before the call */
    for (int fg = 0; fg < 2; fg++) {
        ctpu_compiled *c = ctpu_compile(step_labelled_item, &b, &(ctpu_compile_opts){ .name = "lab", .fullgraph = fg });
        ctpu_tensor out[1];
        ctpu_status st = ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out);
        const char *want = "graph break (at op #4, \"read\"): host read (item) of f32[]";
        if (fg) {
            ck_assert_int_eq(st, CTPU_ERR_STATE);
            ck_assert_msg(t_contains(ctpu_last_error(), want), "%s", ctpu_last_error());
        } else {
            ck_assert_int_eq(st, CTPU_OK);
            ctpu_compiled_info info;
            ctpu_compiled_get_info(c, &info);
            ck_assert_msg(t_contains(info.last_reason, want), "%s", info.last_reason);
            ctpu_release(out[0]);
        }
        ctpu_compiled_free(c);
    }
    ctpu_release(x);
    ctpu_release(b.w);
}
END_TEST

/* a collective inside fn (world size 1 here: all_reduce is the identity) is
 * a graph break with its op number and label; fullgraph: an error before
 * anything ran */
static ctpu_status step_all_reduce(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    brk *b = ctx;
    (void)sc;
    b->runs++;
    ctpu_tensor g = ctpu_mul_scalar(in[0], 2);                     /* #1 */
    ck_assert_int_eq(ctpu_label_push("grads"), CTPU_OK);
    ctpu_tensor r = ctpu_all_reduce(g, CTPU_DIST_SUM);            /* #2 */
    ctpu_label_pop();
    if (ctpu_is_null(r)) return ctpu_last_status();
    ctpu_status st = ctpu_assign(b->w, ctpu_add(b->w, r));
    out[0] = ctpu_sum(r, 0, NULL, false);
    return st;
}

START_TEST(collective_is_a_graph_break)
{
    ck_assert_int_eq(ctpu_dist_world_size(), 1);
    for (int keep = 0; keep < 2; keep++) {   /* cut after the collective (the default) or kept in the step */
        ck_assert_int_eq(ctpu_dist_set_collective_cut(!keep), CTPU_OK);
        brk b = { .w = ctpu_keep(T_VEC(1, 2, 3)) };
        ctpu_tensor x = ctpu_keep(T_VEC(1, -1, 1));
        ctpu_compiled *c = ctpu_compile(step_all_reduce, &b, &(ctpu_compile_opts){ .name = "ddp" });
        for (int s = 0; s < 3; s++) {
            ctpu_tensor out[1];
            ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
            double v;
            ck_assert_int_eq(ctpu_item(out[0], &v), CTPU_OK);
            ck_assert(v == 2);
            ctpu_release(out[0]);
        }
        ck_assert_int_eq(b.runs, 3);   /* fn runs at every call: defer and fuse around the collective */
        float *w = t_read(b.w, NULL);
        ck_assert(w[0] == 7 && w[1] == -4 && w[2] == 9);
        free(w);
        ctpu_compiled_info info;
        ctpu_compiled_get_info(c, &info);
        ck_assert_int_eq(info.graph_breaks, 1);
        ck_assert_int_eq(info.replays, 0);
        ck_assert_msg(t_contains(info.last_reason, "graph break (at op #2, \"grads\"): a collective (all_reduce)"), "%s",
                      info.last_reason);
        ctpu_compiled_free(c);

        /* fullgraph: the error, and b.w unchanged */
        c = ctpu_compile(step_all_reduce, &b, &(ctpu_compile_opts){ .name = "ddp_full", .fullgraph = true });
        ctpu_tensor out[1];
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_ERR_STATE);
        ck_assert_msg(t_contains(ctpu_last_error(),
                                 "compiled step ddp_full: fullgraph: graph break (at op #2, \"grads\"): a collective (all_reduce)"),
                      "%s", ctpu_last_error());
        ck_assert(ctpu_is_null(out[0]));
        w = t_read(b.w, NULL);
        ck_assert(w[0] == 7 && w[1] == -4 && w[2] == 9);
        free(w);
        ctpu_compiled_free(c);
        ctpu_release(x);
        ctpu_release(b.w);
    }
    ck_assert_int_eq(ctpu_dist_set_collective_cut(true), CTPU_OK);
}
END_TEST

/* a step of n add_scalar ops on in[0] */
static ctpu_status step_long(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    int n = *(int *)ctx;
    (void)sc;
    ctpu_tensor t = in[0];
    for (int i = 0; i < n; i++) t = ctpu_add_scalar(t, 1);
    out[0] = t;
    return ctpu_is_null(t) ? ctpu_last_status() : CTPU_OK;
}

/* longer than defer and fuse's trace-length cut (20,000 ops): still one
 * program, replayed */
START_TEST(capture_longer_than_the_trace_limit_is_one_program)
{
    int n = 20050;
    ctpu_compiled *c = ctpu_compile(step_long, &n, NULL);
    ctpu_tensor x = ctpu_keep(T_VEC(1, 2));
    int64_t cuts0 = C("trace_cuts_length_limit");
    for (int s = 0; s < 2; s++) {
        ctpu_tensor out[1];
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
        float *v = t_read(out[0], NULL);
        ck_assert(v[0] == 20051.0f && v[1] == 20052.0f);
        free(v);
        ctpu_release(out[0]);
    }
    ctpu_compiled_info info;
    ctpu_compiled_get_info(c, &info);
    ck_assert_int_eq(info.captures, 1);
    ck_assert_int_eq(info.replays, 1);
    ck_assert_int_eq(info.graph_breaks, 0);
    ck_assert_int_eq(C("trace_cuts_length_limit"), cuts0);
    ctpu_compiled_free(c);
    ctpu_release(x);
}
END_TEST

/* past the capture's own length limit (lowered to 50 here): a reported graph
 * break at the op past it; fullgraph: an error, nothing ran */
START_TEST(capture_past_its_length_limit_is_a_graph_break)
{
    ctpu__test_capture_limit(50);
    int n = 120;
    ctpu_tensor x = ctpu_keep(T_VEC(1, 2));
    ctpu_compiled *c = ctpu_compile(step_long, &n, NULL);
    ctpu_tensor out[1];
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
    float *v = t_read(out[0], NULL);
    ck_assert(v[0] == 121.0f && v[1] == 122.0f);
    free(v);
    ctpu_release(out[0]);
    ctpu_compiled_info info;
    ctpu_compiled_get_info(c, &info);
    ck_assert_int_eq(info.graph_breaks, 1);
    ck_assert_msg(t_contains(info.last_reason, "graph break (at op #51): add_scalar: the capture reached its length limit of 50 ops"),
                  "%s", info.last_reason);
    ctpu_compiled_free(c);
    c = ctpu_compile(step_long, &n, &(ctpu_compile_opts){ .name = "long", .fullgraph = true });
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_ERR_STATE);
    ck_assert_msg(t_contains(ctpu_last_error(), "compiled step long: fullgraph: graph break (at op #51): add_scalar"), "%s",
                  ctpu_last_error());
    ctpu_compiled_free(c);
    ctpu__test_capture_limit(0);
    ctpu_release(x);
}
END_TEST

START_TEST(nested_compiled_call_is_a_graph_break)
{
    ctpu_compiled *inner = ctpu_compile(step_scale, NULL, NULL);
    ctpu_compiled *outer = ctpu_compile(step_nested, inner, NULL);
    ctpu_tensor x = ctpu_keep(T_VEC(1, 2));
    for (int s = 0; s < 2; s++) {
        double sc[1] = { 3.0 + s };
        ctpu_tensor out[1];
        ck_assert_int_eq(ctpu_compiled_call(outer, 1, &x, 1, sc, 1, out), CTPU_OK);
        float *v = t_read(out[0], NULL);
        ck_assert(v[0] == (float)(sc[0] + 1) && v[1] == (float)(2 * sc[0] + 1));
        free(v);
        ctpu_release(out[0]);
    }
    ctpu_compiled_info info;
    ctpu_compiled_get_info(outer, &info);
    ck_assert_int_eq(info.graph_breaks, 1);
    ck_assert_msg(t_contains(info.last_reason, "a nested compiled_call"), "%s", info.last_reason);
    ctpu_compiled_free(outer);
    ctpu_compiled_free(inner);
    ctpu_release(x);
}
END_TEST

/* scalars are program arguments: one capture serves every value */
START_TEST(scalars_are_runtime_arguments)
{
    ctpu_compiled *c = ctpu_compile(step_scale, NULL, NULL);
    ctpu_tensor x = ctpu_keep(T_VEC(1, 2, 4));
    for (int s = 0; s < 5; s++) {
        double sc[1] = { 0.5 * s - 1 };
        ctpu_tensor out[1];
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 1, sc, 1, out), CTPU_OK);
        float *v = t_read(out[0], NULL);
        for (int i = 0; i < 3; i++) ck_assert(v[i] == (float)((double)(1 << i) * sc[0]));
        free(v);
        ctpu_release(out[0]);
    }
    ctpu_compiled_info info;
    ctpu_compiled_get_info(c, &info);
    ck_assert_int_eq(info.captures, 2);
    ck_assert_int_eq(info.replays, 3);
    /* a different number of scalars fails the guard */
    double two[2] = { 1, 2 };
    ctpu_tensor out[1];
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 2, two, 1, out), CTPU_OK);
    ctpu_compiled_get_info(c, &info);
    ck_assert_msg(t_contains(info.last_reason, "n_scalars: 1 -> 2"), "%s", info.last_reason);
    ctpu_compiled_free(c);
    ctpu_release(x);
}
END_TEST

/* fn returning an error makes no version: as torch.compile's limit counts
 * the frame's cache entries and only a compile that succeeded adds one
 * (torch/_dynamo/cache_size.py), such a capture does not count against
 * TORCH_TPU_RECOMPILE_LIMIT (8). Before: 11 failing calls at new shapes
 * used the limit up and every later call ran fn in the current mode. */
static ctpu_status step_scale_or_fail(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    if (*(const bool *)ctx) {   /* an op inside fn fails: fn returns its status */
        ctpu_tensor bad = ctpu_reshape(in[0], 1, (int64_t[]){ 1000 });
        (void)bad;
        return ctpu_last_status();
    }
    out[0] = ctpu_mul_scalar(in[0], sc[0]);
    return CTPU_OK;
}

START_TEST(failed_capture_does_not_count_against_the_limit)
{
    bool fail = false;
    ctpu_compiled *c = ctpu_compile(step_scale_or_fail, &fail, &(ctpu_compile_opts){ .name = "flaky" });
    double sc[1] = { 2 };
    /* 1: capture; 2..12 fail inside fn; then 2..8 (the structure's 8 shapes
     * of the cache's own limit) capture and 1..8 replay */
    int ns[26] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 6, 7, 8 };
    for (int k = 0; k < 26; k++) {
        int n = ns[k];
        fail = k >= 1 && k <= 11;
        ctpu_scope_begin();
        float d[12];
        for (int i = 0; i < n; i++) d[i] = (float)(i + k);
        ctpu_tensor x = t_f32(d, 1, (int64_t[]){ n });
        ctpu_tensor out[1];
        ctpu_status st = ctpu_compiled_call(c, 1, &x, 1, sc, 1, out);
        if (fail) {
            ck_assert_int_eq(st, CTPU_ERR_SHAPE);
            /* the guard that sent the call to fn first, then fn's error */
            ck_assert_msg(t_contains(ctpu_last_error(), "compiled step flaky: guard failed: input 0 dim 0") &&
                          t_contains(ctpu_last_error(), "recapturing: reshape"), "%s", ctpu_last_error());
        } else {
            ck_assert_msg(st == CTPU_OK, "call %d: %s", k, ctpu_last_error());
            float *v = t_read(out[0], NULL);
            for (int i = 0; i < n; i++) ck_assert(v[i] == 2 * d[i]);
            free(v);
        }
        ctpu_scope_end();
    }
    ctpu_compiled_info info;
    ctpu_compiled_get_info(c, &info);
    ck_assert_int_eq(info.guard_failures, 11 + 7);
    ck_assert_int_eq(info.captures, 1 + 11 + 7);
    ck_assert_int_eq(info.eager_calls, 0);
    ck_assert_int_eq(info.replays, 7);
    ctpu_compiled_free(c);
}
END_TEST

/* A parameter released after the capture (fn still holds its stale
 * handle): the call names the guard, which captured tensor and where the
 * program reads it, before the error of the op inside fn that found it. */
static ctpu_status step_bias(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    const ctpu_tensor *p = ctx;
    out[0] = ctpu_add(ctpu_matmul(in[0], p[0]), p[1]);
    return ctpu_is_null(out[0]) ? ctpu_last_status() : CTPU_OK;
}

START_TEST(released_parameter_names_the_guard)
{
    ctpu_tensor p[2] = { ctpu_keep(ctpu_ones(CTPU_F32, 2, (int64_t[]){ 3, 4 })),
                         ctpu_keep(ctpu_ones(CTPU_F32, 1, (int64_t[]){ 4 })) };
    ck_assert_int_eq(ctpu_set_name(p[1], "bias"), CTPU_OK);
    ctpu_compiled *c = ctpu_compile(step_bias, p, &(ctpu_compile_opts){ .name = "lin" });
    ctpu_tensor x = ctpu_keep(ctpu_ones(CTPU_F32, 2, (int64_t[]){ 2, 3 }));
    ctpu_tensor out[1];
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
        ctpu_release(out[0]);
    }
    ctpu_release(p[1]);
    ck_assert_int_ne(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
    const char *e = ctpu_last_error();
    ck_assert_msg(t_contains(e, "compiled step lin: guard failed: captured tensor released: program input ") &&
                  t_contains(e, "(f32[4] bias), which the step reads; recapturing: add"), "%s", e);
    ck_assert(ctpu_is_null(out[0]));
    ctpu_compiled_info info;
    ctpu_compiled_get_info(c, &info);
    ck_assert_msg(t_contains(info.last_reason, "captured tensor released"), "%s", info.last_reason);
    ck_assert_int_eq(info.guard_failures, 1);
    ctpu_compiled_free(c);
    ctpu_release(p[0]);
    ctpu_release(x);
}
END_TEST

START_TEST(recompile_limit_then_eager)
{
    ctpu_compiled *c = ctpu_compile(step_scale, NULL, NULL);
    double sc[1] = { 2 };
    for (int n = 1; n <= 12; n++) {
        ctpu_scope_begin();
        float d[12] = { 0 };
        ctpu_tensor x = t_f32(d, 1, (int64_t[]){ n });
        ctpu_tensor out[1];
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 1, sc, 1, out), CTPU_OK);
        ck_assert_int_eq(ctpu_numel(out[0]), n);
        ctpu_scope_end();
    }
    ctpu_compiled_info info;
    ctpu_compiled_get_info(c, &info);
    /* 1..8: a capture each (8 versions: TORCH_TPU_RECOMPILE_LIMIT=8, as
     * torch.compile's cache_size_limit counts a frame's entries); 9: a guard
     * failure past the limit, fn in the current mode without a capture (a
     * 9th capture would make a program the fused cache refuses: it was one
     * shape off); 10..12: fn in the current mode */
    ck_assert_int_eq(info.guard_failures, 8);
    ck_assert_int_eq(info.captures, 8);
    ck_assert_int_eq(info.eager_calls, 4);
    ck_assert_int_eq(info.graph_breaks, 0);
    ck_assert_msg(t_contains(info.last_reason, "TORCH_TPU_RECOMPILE_LIMIT"), "%s", info.last_reason);
    ck_assert_int_eq(info.replays, 0);
    /* past the limit the shapes captured keep replaying (torch.compile keeps
     * serving its cache entries); only unseen ones run fn */
    int shapes[6] = { 3, 1, 8, 13, 5, 10 };
    for (int k = 0; k < 6; k++) {
        int n = shapes[k];
        ctpu_scope_begin();
        float d[16];
        for (int i = 0; i < n; i++) d[i] = (float)(i + k);
        ctpu_tensor x = t_f32(d, 1, (int64_t[]){ n });
        ctpu_tensor out[1];
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 1, sc, 1, out), CTPU_OK);
        float *v = t_read(out[0], NULL);
        for (int i = 0; i < n; i++) ck_assert(v[i] == 2 * d[i]);
        free(v);
        ctpu_scope_end();
    }
    ctpu_compiled_get_info(c, &info);
    ck_assert_int_eq(info.replays, 4);        /* 3, 1, 8, 5 */
    ck_assert_int_eq(info.eager_calls, 6);    /* 9..12 before, 13 and 10 (past the limit: never captured) */
    ck_assert_int_eq(info.captures, 8);
    ck_assert_int_eq(info.guard_failures, 8);
    ctpu_compiled_free(c);
}
END_TEST

START_TEST(compile_disable_runs_fn)
{
    ctpu_shutdown();
    setenv("TORCH_COMPILE_DISABLE", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    unsetenv("TORCH_COMPILE_DISABLE");
    ctpu_compiled *c = ctpu_compile(step_scale, NULL, NULL);
    ctpu_tensor x = ctpu_keep(T_VEC(1, 2));
    double sc[1] = { 3 };
    for (int s = 0; s < 3; s++) {
        ctpu_tensor out[1];
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 1, sc, 1, out), CTPU_OK);
        ctpu_release(out[0]);
    }
    ctpu_compiled_info info;
    ctpu_compiled_get_info(c, &info);
    ck_assert_int_eq(info.captures, 0);
    ck_assert_int_eq(info.eager_calls, 3);
    ctpu_compiled_free(c);
    ctpu_release(x);
}
END_TEST

START_TEST(bad_calls_are_errors)
{
    ck_assert_ptr_null(ctpu_compile(NULL, NULL, NULL));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    ctpu_compiled *c = ctpu_compile(step_scale, NULL, NULL);
    ctpu_tensor x = ctpu_keep(T_VEC(1, 2)), out[1];
    double sc[1] = { 1 };
    ck_assert_int_eq(ctpu_compiled_call(NULL, 1, &x, 1, sc, 1, out), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_compiled_call(c, -1, &x, 1, sc, 1, out), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, NULL, 1, sc, 1, out), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 1, NULL, 1, out), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 1, sc, 1, NULL), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 1, sc, 5000, out), CTPU_ERR_INVALID_ARG);
    ctpu_tensor stale = ctpu_add_scalar(x, 1);
    ctpu_release(stale);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &stale, 1, sc, 1, out), CTPU_ERR_STALE_HANDLE);
    ck_assert_msg(t_contains(ctpu_last_error(), "compiled_call: in[0]"), "%s", ctpu_last_error());
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(NULL, &info), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_compiled_get_info(c, NULL), CTPU_ERR_INVALID_ARG);
    ctpu_compiled_free(NULL);
    /* a step kept past shutdown */
    ctpu_shutdown();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ctpu_tensor y = T_VEC(1);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &y, 1, sc, 1, out), CTPU_ERR_STATE);
    ctpu_compiled_free(c);
}
END_TEST

/* A freed step is refused without reading freed memory (ASan checks it): a
 * call on a step freed after its runtime's shutdown, and on one whose report
 * row was dropped past the freed-row limit (64), is CTPU_ERR_INVALID_ARG, as
 * is a second free (a no-op). A new user found the first read freed memory. */
START_TEST(freed_steps_are_refused_without_reading_them)
{
    ctpu_tensor x = ctpu_keep(T_VEC(1, 2)), out[1];
    double sc[1] = { 1 };
    ctpu_compiled *first = ctpu_compile(step_scale, NULL, NULL);
    ck_assert_int_eq(ctpu_compiled_call(first, 1, &x, 1, sc, 1, out), CTPU_OK);
    ctpu_release(out[0]);
    ctpu_compiled_free(first);
    ck_assert_int_eq(ctpu_compiled_call(first, 1, &x, 1, sc, 1, out), CTPU_ERR_INVALID_ARG);
    ck_assert_msg(t_contains(ctpu_last_error(), "compiled_call: c is not a compiled step (freed?)"), "%s", ctpu_last_error());
    for (int i = 0; i < 70; i++) ctpu_compiled_free(ctpu_compile(step_scale, NULL, NULL));   /* first's row is dropped */
    ck_assert_int_eq(ctpu_compiled_call(first, 1, &x, 1, sc, 1, out), CTPU_ERR_INVALID_ARG);
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(first, &info), CTPU_ERR_INVALID_ARG);
    ctpu_compiled_free(first);   /* a no-op */
    ctpu_compiled *kept = ctpu_compile(step_scale, NULL, NULL);
    ctpu_release(x);
    ctpu_shutdown();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ctpu_compiled_free(kept);    /* its runtime is gone: freed at once */
    ctpu_tensor y = T_VEC(1);
    ck_assert_int_eq(ctpu_compiled_call(kept, 1, &y, 1, sc, 1, out), CTPU_ERR_INVALID_ARG);
    ctpu_compiled_free(kept);
}
END_TEST

/* ------------------------------------------------------------ capturable optimizers */
typedef struct { mlp md; ctpu_optim *opt; } opt_ctx;

static ctpu_status opt_step(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    opt_ctx *x = ctx;
    ctpu_optim_zero_grad(x->opt);
    ctpu_tensor h = ctpu_relu(ctpu_add(ctpu_matmul(in[0], x->md.p[0]), x->md.p[1]));
    ctpu_tensor logits = ctpu_add(ctpu_matmul(h, x->md.p[2]), x->md.p[3]);
    ctpu_tensor loss = ctpu_neg(ctpu_mean(ctpu_sum(ctpu_mul(ctpu_log_softmax(logits, 1), in[1]), 1, (int[]){ 1 }, false),
                                          0, NULL, false));
    ctpu_status st = ctpu_backward(loss);
    if (st == CTPU_OK) st = ctpu_optim_set_lr(x->opt, sc[0]);   /* the schedule's value: a program argument */
    if (st == CTPU_OK) st = ctpu_optim_step(x->opt);
    out[0] = loss;
    return st;
}

/* kind 0: AdamW in two groups (decay / none), 1: SGD with momentum and dampening */
static void run_opt(int kind, bool compiled, int steps, float *w, float *losses, int64_t *nsteps)
{
    opt_ctx x;
    mlp_init(&x.md);
    ctpu_tensor dec[2] = { x.md.p[0], x.md.p[2] }, nodec[2] = { x.md.p[1], x.md.p[3] };
    ctpu_param_group g[2] = { { dec, 2, 1.0, 0.1 }, { nodec, 2, 0.5, 0 } };
    ctpu_sgd_opts so = { 0.05, 0.9, 0.25, 1e-3, false };
    ctpu_adamw_opts ao = ctpu_adamw_defaults();
    x.opt = kind == 0 ? ctpu_adamw_create_groups(2, g, &ao) : ctpu_sgd_create_groups(2, g, &so);
    ck_assert_ptr_nonnull(x.opt);
    ck_assert_int_eq(ctpu_optim_set_capturable(x.opt, true), CTPU_OK);
    ctpu_compiled *c = compiled ? ctpu_compile(opt_step, &x, NULL) : NULL;
    for (int s = 0; s < steps; s++) {
        float xb[NB * NI], yb[NB * NO];
        batch(s, NB, xb, yb);
        ctpu_scope_begin();
        ctpu_tensor in[2] = { t_f32(xb, 2, (int64_t[]){ NB, NI }), t_f32(yb, 2, (int64_t[]){ NB, NO }) }, out[1];
        double sc[1] = { ctpu_lr_warmup_cosine(kind ? 0.05 : 1e-2, s, 2, steps, 1e-3) };
        if (c) {
            ck_assert_msg(ctpu_compiled_call(c, 2, in, 1, sc, 1, out) == CTPU_OK, "%s", ctpu_last_error());
        } else {
            ctpu_scope_begin();
            ck_assert_int_eq(opt_step(&x, in, sc, out), CTPU_OK);
            ctpu_keep(out[0]);
            ctpu_scope_end();
        }
        double l;
        ck_assert_int_eq(ctpu_item(out[0], &l), CTPU_OK);
        losses[s] = (float)l;
        ctpu_scope_end();
    }
    read_params(&x.md, w);
    *nsteps = ctpu_optim_steps(x.opt);
    if (c) {
        ctpu_compiled_info info;
        ctpu_compiled_get_info(c, &info);
        ck_assert_msg(info.replays >= (uint64_t)steps - 2 && info.graph_breaks == 0, "replays %d: %s", (int)info.replays,
                      info.last_reason);
        ctpu_compiled_free(c);
    }
    ctpu_optim_free(x.opt);
    mlp_free(&x.md);
}

START_TEST(capturable_optimizers_bit_identical)
{
    enum { N = 7, NW = NI * NH + NH + NH * NO + NO };
    for (int kind = 0; kind < 2; kind++) {
        float wa[NW], wb[NW], la[N], lb[N];
        int64_t sa, sb;
        run_opt(kind, false, N, wa, la, &sa);
        run_opt(kind, true, N, wb, lb, &sb);
        for (int i = 0; i < NW; i++) ck_assert_msg(t_same(wa[i], wb[i]), "kind %d weight %d: %.9g vs %.9g", kind, i, wa[i], wb[i]);
        for (int s = 0; s < N; s++) ck_assert(t_same(la[s], lb[s]));
        ck_assert(la[N - 1] < la[0]);
        ck_assert_int_eq(sa, N);   /* the step count advanced on the device at every replay */
        ck_assert_int_eq(sb, N);
    }
}
END_TEST

/* A capturable AdamW over a bf16 parameter (its lr and step 0-d f32
 * tensors meet bf16 operands: torch's 0-d rule keeps the update bf16), in a
 * compiled step and not: the same bits, the parameter stays bf16. */
typedef struct { ctpu_tensor p; ctpu_optim *opt; } bf16_opt_ctx;

static ctpu_status bf16_opt_step(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    bf16_opt_ctx *x = ctx;
    ctpu_optim_zero_grad(x->opt);
    ctpu_tensor loss = ctpu_sum(ctpu_mul(ctpu_mul(x->p, x->p), in[0]), 0, NULL, false);
    ctpu_status st = ctpu_backward(loss);
    if (st == CTPU_OK) st = ctpu_optim_set_lr(x->opt, sc[0]);
    if (st == CTPU_OK) st = ctpu_optim_step(x->opt);
    out[0] = loss;
    return st;
}

static void run_bf16_opt(bool compiled, float *w)
{
    enum { N = 24, STEPS = 6 };
    float v[N];
    for (int k = 0; k < N; k++) v[k] = sinf((float)k * 0.61f);
    bf16_opt_ctx x = { ctpu_cast(t_f32(v, 1, (int64_t[]){ N }), CTPU_BF16), NULL };
    ck_assert_int_eq(ctpu_set_requires_grad(x.p, true), CTPU_OK);
    ctpu_adamw_opts ao = ctpu_adamw_defaults();
    x.opt = ctpu_adamw_create(1, &x.p, &ao);
    ck_assert_ptr_nonnull(x.opt);
    ck_assert_int_eq(ctpu_optim_set_capturable(x.opt, true), CTPU_OK);
    ctpu_compiled *c = compiled ? ctpu_compile(bf16_opt_step, &x, NULL) : NULL;
    for (int s = 0; s < STEPS; s++) {
        float g[N];
        for (int k = 0; k < N; k++) g[k] = cosf((float)(k * (s + 1)) * 0.37f);
        ctpu_scope_begin();
        ctpu_tensor in[1] = { ctpu_cast(t_f32(g, 1, (int64_t[]){ N }), CTPU_BF16) }, out[1];
        double sc[1] = { 0.02 / (s + 1) };
        if (c) ck_assert_msg(ctpu_compiled_call(c, 1, in, 1, sc, 1, out) == CTPU_OK, "%s", ctpu_last_error());
        else ck_assert_msg(bf16_opt_step(&x, in, sc, out) == CTPU_OK, "%s", ctpu_last_error());
        ctpu_scope_end();
        ck_assert_int_eq(ctpu_dtype_of(x.p), CTPU_BF16);
    }
    ck_assert_int_eq(ctpu_optim_steps(x.opt), STEPS);
    if (c) {
        ctpu_compiled_info info;
        ctpu_compiled_get_info(c, &info);
        ck_assert_msg(info.replays >= STEPS - 2, "replays %d: %s", (int)info.replays, info.last_reason);
        ctpu_compiled_free(c);
    }
    ctpu_tensor p32 = ctpu_cast(x.p, CTPU_F32);
    ck_assert_int_eq(ctpu_to_host(p32, w, sizeof(float) * N), CTPU_OK);
    ctpu_release(p32);
    ctpu_optim_free(x.opt);
    ctpu_release(x.p);
}

START_TEST(capturable_optimizer_over_bf16_params)
{
    float a[24], b[24];
    run_bf16_opt(false, a);
    run_bf16_opt(true, b);
    for (int i = 0; i < 24; i++) ck_assert_msg(t_same(a[i], b[i]), "weight %d: %.9g vs %.9g", i, a[i], b[i]);
    ck_assert(a[1] != sinf(0.61f));   /* it moved */
}
END_TEST

START_TEST(non_capturable_optimizer_refused_in_capture)
{
    opt_ctx x;
    mlp_init(&x.md);
    ctpu_adamw_opts ao = ctpu_adamw_defaults();
    x.opt = ctpu_adamw_create(4, x.md.p, &ao);
    ctpu_compiled *c = ctpu_compile(opt_step, &x, NULL);
    float xb[NB * NI], yb[NB * NO];
    batch(0, NB, xb, yb);
    ctpu_tensor in[2] = { t_f32(xb, 2, (int64_t[]){ NB, NI }), t_f32(yb, 2, (int64_t[]){ NB, NO }) }, out[1];
    double sc[1] = { 1e-3 };
    ck_assert_int_eq(ctpu_compiled_call(c, 2, in, 1, sc, 1, out), CTPU_ERR_STATE);
    ck_assert_msg(t_contains(ctpu_last_error(), "capturable"), "%s", ctpu_last_error());
    ctpu_compiled_free(c);
    ctpu_optim_free(x.opt);
    mlp_free(&x.md);
}
END_TEST

/* The binding cache (compiled.c: a replay skips the per-handle guards while
 * the binding epoch is unchanged): every kind of thing a guard or the
 * replay's binding checks, mutated one at a time between replays (each
 * after two plain replays, so the cache is warm), and the step's values
 * after each bit-identical to fn's in strict eager given the same
 * mutations; the mutations that fail a guard count as guard failures,
 * the released tensor is the guard's error. */
typedef struct { ctpu_tensor w, m, c; } bind_st;

static ctpu_status bind_fn(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    bind_st *b = ctx;
    ctpu_zero_grad(b->w);
    ctpu_tensor y = ctpu_add(ctpu_matmul(in[0], b->w), b->c);
    ctpu_tensor loss = ctpu_sum(ctpu_mul(y, y), 0, NULL, false);
    ctpu_status st = ctpu_backward(loss);
    if (st != CTPU_OK) return st;
    ctpu_no_grad_begin();
    ctpu_assign(b->m, ctpu_add(ctpu_mul_scalar(b->m, 0.9), ctpu_grad(b->w)));
    ctpu_assign(b->w, ctpu_sub(b->w, ctpu_mul_scalar(b->m, 0.01)));
    ctpu_no_grad_end();
    out[0] = loss;
    return ctpu_last_status();
}

enum { BM_NONE, BM_VIEW_W, BM_VIEW_M, BM_DROP_VIEWS, BM_ASSIGN_M, BM_ZERO_GRAD, BM_VIEW_GRAD, BM_DEFER_ASSIGN,
       BM_SET_GRAD_OFF, BM_SET_GRAD_ON, BM_COUNT };

typedef struct { float w[12], m[12], loss[BM_COUNT * 3], gview[12]; int64_t failures; } bind_out;

static void bind_mutate(bind_st *b, int k, ctpu_tensor *views, int *nv)
{
    switch (k) {
    case BM_VIEW_W: views[(*nv)++] = ctpu_keep(ctpu_slice(b->w, 0, 0, 2, 1)); break;
    case BM_VIEW_M: views[(*nv)++] = ctpu_keep(ctpu_reshape(b->m, 1, (int64_t[]){ 12 })); break;
    case BM_DROP_VIEWS:
        while (*nv) ctpu_release(views[--*nv]);
        break;
    case BM_ASSIGN_M: ctpu_assign(b->m, ctpu_mul_scalar(b->m, 0.5)); break;
    case BM_ZERO_GRAD: ctpu_zero_grad(b->w); break;
    case BM_VIEW_GRAD: views[(*nv)++] = ctpu_keep(ctpu_reshape(ctpu_grad(b->w), 1, (int64_t[]){ 12 })); break;
    case BM_DEFER_ASSIGN:
        ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
        ctpu_assign(b->m, ctpu_add_scalar(b->m, 1.0));
        ctpu_set_mode(CTPU_MODE_STRICT);
        break;
    case BM_SET_GRAD_OFF: ctpu_zero_grad(b->w); ctpu_set_requires_grad(b->c, true); break;
    case BM_SET_GRAD_ON: ctpu_set_requires_grad(b->c, false); break;
    default: break;
    }
}

static void bind_run(bool compiled, bind_out *r)
{
    memset(r, 0, sizeof *r);
    bind_st b;
    float w0[12], x0[6];
    for (int i = 0; i < 12; i++) w0[i] = 0.1f * (float)(i % 5) - 0.2f;
    for (int i = 0; i < 6; i++) x0[i] = 0.3f * (float)i - 0.7f;
    b.w = ctpu_keep(t_f32(w0, 2, (int64_t[]){ 3, 4 }));
    ck_assert_int_eq(ctpu_set_requires_grad(b.w, true), CTPU_OK);
    b.m = ctpu_keep(ctpu_zeros(CTPU_F32, 2, (int64_t[]){ 3, 4 }));
    b.c = ctpu_keep(ctpu_full(CTPU_F32, 1, (int64_t[]){ 4 }, 0.25));
    ctpu_tensor x = ctpu_keep(t_f32(x0, 2, (int64_t[]){ 2, 3 }));
    ctpu_compiled *c = compiled ? ctpu_compile(bind_fn, &b, &(ctpu_compile_opts){ .name = "bind" }) : NULL;
    ctpu_tensor views[8];
    int nv = 0, n = 0;
    for (int k = 0; k < BM_COUNT; k++) {
        bind_mutate(&b, k, views, &nv);
        for (int rep = 0; rep < 3; rep++) {
            ctpu_tensor out[1];
            if (compiled) {
                ck_assert_msg(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out) == CTPU_OK, "mutation %d: %s", k,
                              ctpu_last_error());
            } else {
                ctpu_scope_begin();
                ck_assert_int_eq(bind_fn(&b, &x, NULL, out), CTPU_OK);
                ctpu_keep(out[0]);
                ctpu_scope_end();
            }
            ck_assert_int_eq(ctpu_to_host(out[0], &r->loss[n++], sizeof(float)), CTPU_OK);
            ctpu_release(out[0]);
        }
        if (k == BM_VIEW_GRAD) ck_assert_int_eq(ctpu_to_host(views[nv - 1], r->gview, sizeof r->gview), CTPU_OK);
    }
    while (nv) ctpu_release(views[--nv]);
    ck_assert_int_eq(ctpu_to_host(b.w, r->w, sizeof r->w), CTPU_OK);
    ck_assert_int_eq(ctpu_to_host(b.m, r->m, sizeof r->m), CTPU_OK);
    if (compiled) {
        /* last: a released tensor the step reads is the guard's error */
        ctpu_release(b.c);
        ctpu_tensor out[1];
        ck_assert_int_ne(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
        ck_assert_msg(t_contains(ctpu_last_error(), "guard failed: captured tensor released"), "%s", ctpu_last_error());
        ctpu_compiled_info info;
        ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
        r->failures = info.guard_failures;
        ctpu_compiled_free(c);
    } else {
        ctpu_release(b.c);
    }
    ctpu_zero_grad(b.w);
    ctpu_release(b.w);
    ctpu_release(b.m);
    ctpu_release(x);
}

START_TEST(binding_cache_notices_every_change)
{
    bind_out ref, got;
    bind_run(false, &ref);
    bind_run(true, &got);
    for (int i = 0; i < BM_COUNT * 3; i++)
        ck_assert_msg(t_same(got.loss[i], ref.loss[i]), "call %d (mutation %d): loss %.9g vs %.9g", i, i / 3,
                      got.loss[i], ref.loss[i]);
    for (int i = 0; i < 12; i++) {
        ck_assert_msg(t_same(got.w[i], ref.w[i]), "w[%d] %.9g vs %.9g", i, got.w[i], ref.w[i]);
        ck_assert_msg(t_same(got.m[i], ref.m[i]), "m[%d] %.9g vs %.9g", i, got.m[i], ref.m[i]);
    }
    for (int i = 0; i < 12; i++)   /* a view of the old .grad keeps its values (the replay wrote a fresh one) */
        ck_assert_msg(t_same(got.gview[i], ref.gview[i]), "grad view[%d] %.9g vs %.9g", i, got.gview[i], ref.gview[i]);
    /* guard failures: a live view of the in-place targets w and m, the
     * read tensor released */
    ck_assert_msg(got.failures >= 3, "%lld guard failures", (long long)got.failures);
}
END_TEST

/* ---------------------------------- fn returns the tensor it assigns (alias) */
/* A step that assigns a tensor made before the call and also returns it
 * (out[0] = P after assign(P, ...), the parameter it updates): every replay
 * writes P (never the tensor it only reads) and hands back P itself, as
 * eager. Each variant is a combination: an assigned captured global, the
 * same handle returned twice, an assigned input, an input returned
 * unchanged, an unassigned global, an output next to a new tensor. */
enum { RA_P, RA_EMA, RA_TWICE, RA_IN, RA_IN_UNCHANGED, RA_READ_TOO, RA_NEW_TOO,
       /* a view of P taken before the assign (reshape, detach, unsqueeze),
        * returned: it keeps P's value at the call's start, a new handle per
        * call; a view taken after it sees the new value */
       RA_VIEW_BEFORE, RA_DETACH_BEFORE, RA_VIEW_BEFORE_EMA, RA_VIEW_AFTER, RA_VIEW_IN_BEFORE, RA_COUNT };
typedef struct { int variant; ctpu_tensor P, Q; } ra_ctx;

static ctpu_status ra_view_fn(int variant, ctpu_tensor P, ctpu_tensor Q, const ctpu_tensor *in, ctpu_tensor *out)
{
    int64_t sq[2] = { 2, 2 };
    switch (variant) {
    case RA_VIEW_BEFORE: out[0] = ctpu_reshape(P, 2, sq); out[1] = P; return ctpu_assign(P, ctpu_add(Q, in[0]));
    case RA_DETACH_BEFORE: out[0] = ctpu_detach(P); out[1] = P; return ctpu_assign(P, ctpu_add(Q, in[0]));
    case RA_VIEW_BEFORE_EMA:
        out[1] = ctpu_unsqueeze(P, 0);
        out[0] = P;
        return ctpu_assign(P, ctpu_add(ctpu_mul_scalar(P, 0.5), in[0]));
    case RA_VIEW_AFTER: {
        ctpu_status st = ctpu_assign(P, ctpu_add(Q, in[0]));
        out[0] = ctpu_reshape(P, 2, sq);
        out[1] = P;
        return st;
    }
    default: out[0] = ctpu_reshape(in[1], 2, sq); out[1] = in[1]; return ctpu_assign(in[1], ctpu_add(in[1], in[0]));
    }
}

static ctpu_status ra_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    ra_ctx *c = vc;
    ctpu_tensor P = c->P, Q = c->Q;
    switch (c->variant) {
    case RA_P: out[0] = P; return ctpu_assign(P, ctpu_add(Q, in[0]));
    case RA_EMA: out[0] = P; return ctpu_assign(P, ctpu_add(ctpu_mul_scalar(P, 0.5), ctpu_add(Q, in[0])));
    case RA_TWICE: out[0] = out[1] = P; return ctpu_assign(P, ctpu_add(Q, in[0]));
    case RA_IN: out[0] = in[1]; return ctpu_assign(in[1], ctpu_add(in[1], in[0]));
    case RA_IN_UNCHANGED: out[0] = in[0]; out[1] = P; return ctpu_assign(P, ctpu_add(Q, in[0]));
    case RA_READ_TOO: out[0] = P; out[1] = Q; return ctpu_assign(P, ctpu_add(P, ctpu_add(Q, in[0])));
    case RA_NEW_TOO: {
        ctpu_status st = ctpu_assign(P, ctpu_add(Q, in[0]));
        out[0] = ctpu_add_scalar(P, 0);
        out[1] = P;
        return st;
    }
    default: return ra_view_fn(c->variant, P, Q, in, out);
    }
}

#define RA_CALLS 4
typedef struct { float p[RA_CALLS], q[RA_CALLS], s[RA_CALLS], o[RA_CALLS][2]; int same[RA_CALLS][2]; } ra_log;

/* out[j]'s identity: 1 P, 2 Q, 3 in[0], 4 in[1], 0 another (released). */
static int ra_who(ctpu_tensor o, const ra_ctx *c, const ctpu_tensor *in)
{
    return o.id == c->P.id ? 1 : o.id == c->Q.id ? 2 : o.id == in[0].id ? 3 : o.id == in[1].id ? 4 : 0;
}

static void ra_run(int variant, bool compiled, ra_log *lg)
{
    int64_t sh[1] = { 4 };
    ra_ctx c = { .variant = variant };
    c.P = ctpu_keep(ctpu_zeros(CTPU_F32, 1, sh));
    c.Q = ctpu_keep(ctpu_from_host((float[]){ 1, 2, 3, 4 }, CTPU_F32, 1, sh));
    ctpu_tensor S = ctpu_keep(ctpu_full(CTPU_F32, 1, sh, 3));
    ctpu_compiled *cs = compiled ? ctpu_compile(ra_fn, &c, NULL) : NULL;
    for (int it = 0; it < RA_CALLS; it++) {
        ctpu_tensor in[2] = { ctpu_keep(ctpu_full(CTPU_F32, 1, sh, 10 * (it + 1))), S }, out[2] = { CTPU_NULL, CTPU_NULL };
        if (compiled) {
            ck_assert_int_eq(ctpu_compiled_call(cs, 2, in, 0, NULL, 2, out), CTPU_OK);
        } else {
            ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
            ck_assert_int_eq(ra_fn(&c, in, NULL, out), CTPU_OK);
            for (int j = 0; j < 2; j++)
                if (!ctpu_is_null(out[j]) && (j == 0 || out[1].id != out[0].id)) ctpu_keep(out[j]);
            ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        }
        float v[4];
        ck_assert_int_eq(ctpu_to_host(c.P, v, sizeof v), CTPU_OK); lg->p[it] = v[1];
        ck_assert_int_eq(ctpu_to_host(c.Q, v, sizeof v), CTPU_OK); lg->q[it] = v[1];
        ck_assert_int_eq(ctpu_to_host(S, v, sizeof v), CTPU_OK); lg->s[it] = v[1];
        for (int j = 0; j < 2; j++) {
            lg->o[it][j] = -1;
            lg->same[it][j] = -1;
            if (ctpu_is_null(out[j])) continue;
            ck_assert_msg(ctpu_to_host(out[j], v, sizeof v) == CTPU_OK, "variant %d %s call %d out[%d]: %s", variant,
                          compiled ? "compiled" : "eager", it, j, ctpu_last_error());
            lg->o[it][j] = v[1];
            lg->same[it][j] = ra_who(out[j], &c, in);
        }
        for (int j = 0; j < 2; j++)
            if (lg->same[it][j] == 0 && (j == 0 || out[1].id != out[0].id)) ctpu_release(out[j]);
        ctpu_release(in[0]);
    }
    ctpu_compiled_free(cs);
    ctpu_release(c.P);
    ctpu_release(c.Q);
    ctpu_release(S);
}

START_TEST(returned_assigned_tensor_is_written_and_returned)
{
    for (int var = 0; var < RA_COUNT; var++) {
        ra_log ref, got;
        memset(&ref, 0, sizeof ref);
        memset(&got, 0, sizeof got);
        ra_run(var, false, &ref);
        ra_run(var, true, &got);
        for (int it = 0; it < RA_CALLS; it++) {
            ck_assert_msg(t_same(got.p[it], ref.p[it]), "variant %d call %d: P %g vs eager %g", var, it, got.p[it], ref.p[it]);
            ck_assert_msg(t_same(got.q[it], ref.q[it]), "variant %d call %d: Q %g vs eager %g", var, it, got.q[it], ref.q[it]);
            ck_assert_msg(t_same(got.s[it], ref.s[it]), "variant %d call %d: in[1] %g vs eager %g", var, it, got.s[it], ref.s[it]);
            for (int j = 0; j < 2; j++) {
                ck_assert_msg(t_same(got.o[it][j], ref.o[it][j]), "variant %d call %d: out[%d] %g vs eager %g", var, it, j,
                              got.o[it][j], ref.o[it][j]);
                ck_assert_msg(got.same[it][j] == ref.same[it][j], "variant %d call %d: out[%d] is %d, eager %d", var, it, j,
                              got.same[it][j], ref.same[it][j]);
            }
        }
    }
}
END_TEST


/* ---------------------------------- host effects inside fn are graph breaks */
/* fn seeding the generator, setting or reading its state, or releasing a
 * tensor made before the call changes host state that a replay (fn not run)
 * would leave alone: a graph break, so every call does what eager does.
 * Under fullgraph: an error, the generator and the tensor unchanged. A
 * release of a tensor fn made itself is no break. */
enum { HE_SEED, HE_SET_STATE, HE_GET_STATE, HE_RELEASE_IN, HE_RELEASE_OWN, HE_COUNT };
typedef struct { int how; uint64_t got_off; } he_ctx;

static ctpu_status he_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    he_ctx *k = vc;
    int64_t sh[1] = { 4 };
    ctpu_status st = CTPU_OK;
    uint64_t seed;
    switch (k->how) {
    case HE_SEED: ctpu_manual_seed(7); st = ctpu_last_status(); break;
    case HE_SET_STATE: st = ctpu_rng_set_state(7, 100); break;
    case HE_GET_STATE: st = ctpu_rng_get_state(&seed, &k->got_off); break;
    case HE_RELEASE_IN: st = ctpu_release(in[1]); break;
    default: st = ctpu_release(ctpu_add_scalar(in[0], 1)); break;
    }
    if (st != CTPU_OK) return st;
    out[0] = ctpu_add(in[0], ctpu_rand_uniform(CTPU_F32, 1, sh, 0, 1));
    return CTPU_OK;
}

#define HE_CALLS 3
typedef struct { float o[HE_CALLS][4]; uint64_t off[HE_CALLS]; bool in1_live[HE_CALLS]; } he_log;

static void he_run(int how, bool compiled, he_log *lg, ctpu_compiled_info *info)
{
    int64_t sh[1] = { 4 };
    he_ctx k = { .how = how };
    ctpu_manual_seed(1);
    ctpu_compiled *c = compiled ? ctpu_compile(he_fn, &k, NULL) : NULL;
    for (int it = 0; it < HE_CALLS; it++) {
        ctpu_tensor in[2] = { ctpu_keep(ctpu_full(CTPU_F32, 1, sh, it)), ctpu_keep(ctpu_zeros(CTPU_F32, 1, sh)) };
        ctpu_tensor out[1] = { CTPU_NULL };
        if (compiled) {
            ck_assert_msg(ctpu_compiled_call(c, 2, in, 0, NULL, 1, out) == CTPU_OK, "%s", ctpu_last_error());
        } else {
            ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
            ck_assert_int_eq(he_fn(&k, in, NULL, out), CTPU_OK);
            ctpu_keep(out[0]);
            ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        }
        ck_assert_int_eq(ctpu_to_host(out[0], lg->o[it], sizeof lg->o[it]), CTPU_OK);
        lg->off[it] = k.got_off;
        lg->in1_live[it] = ctpu_is_valid(in[1]);
        ctpu_release(out[0]);
        ctpu_release(in[0]);
        if (lg->in1_live[it]) ctpu_release(in[1]);
    }
    if (c) ck_assert_int_eq(ctpu_compiled_get_info(c, info), CTPU_OK);
    ctpu_compiled_free(c);
}

START_TEST(host_effects_in_fn_are_graph_breaks)
{
    static const char *const what[HE_COUNT] = { "manual_seed", "rng_set_state", "rng_get_state",
                                                "release of a tensor made before the call", "" };
    for (int how = 0; how < HE_COUNT; how++) {
        he_log ref, got;
        ctpu_compiled_info info;
        memset(&ref, 0, sizeof ref);
        memset(&got, 0, sizeof got);
        he_run(how, false, &ref, NULL);
        he_run(how, true, &got, &info);
        for (int it = 0; it < HE_CALLS; it++) {
            for (int i = 0; i < 4; i++)
                ck_assert_msg(t_same(got.o[it][i], ref.o[it][i]), "effect %d call %d: out[%d] %.9g vs eager %.9g", how, it,
                              i, got.o[it][i], ref.o[it][i]);
            ck_assert_msg(got.off[it] == ref.off[it], "effect %d call %d: offset read %llu vs eager %llu", how, it,
                          (unsigned long long)got.off[it], (unsigned long long)ref.off[it]);
            ck_assert_msg(got.in1_live[it] == ref.in1_live[it], "effect %d call %d: in[1] live %d vs eager %d", how, it,
                          got.in1_live[it], ref.in1_live[it]);
        }
        if (how == HE_RELEASE_OWN) {
            ck_assert_int_eq(info.graph_breaks, 0);
            ck_assert_int_eq(info.replays, HE_CALLS - 1);
        } else {
            ck_assert_int_eq(info.graph_breaks, 1);
            ck_assert_int_eq(info.replays, 0);
            ck_assert_msg(t_contains(info.last_reason, what[how]), "effect %d: %s", how, info.last_reason);
        }
    }
}
END_TEST

START_TEST(host_effects_under_fullgraph_are_errors_and_change_nothing)
{
    int64_t sh[1] = { 4 };
    for (int how = 0; how < HE_RELEASE_OWN; how++) {
        he_ctx k = { .how = how };
        ck_assert_int_eq(ctpu_rng_set_state(3, 40), CTPU_OK);
        ctpu_compiled *c = ctpu_compile(he_fn, &k, &(ctpu_compile_opts){ .fullgraph = true });
        ctpu_tensor in[2] = { ctpu_keep(ctpu_zeros(CTPU_F32, 1, sh)), ctpu_keep(ctpu_zeros(CTPU_F32, 1, sh)) };
        ctpu_tensor out[1];
        ck_assert_int_eq(ctpu_compiled_call(c, 2, in, 0, NULL, 1, out), CTPU_ERR_STATE);
        ck_assert_msg(t_contains(ctpu_last_error(), "fullgraph: graph break"), "%s", ctpu_last_error());
        ck_assert(ctpu_is_null(out[0]));
        uint64_t seed, off;
        ck_assert_int_eq(ctpu_rng_get_state(&seed, &off), CTPU_OK);
        ck_assert_msg(seed == 3 && off == 40, "effect %d: generator at (%llu, %llu)", how, (unsigned long long)seed,
                      (unsigned long long)off);
        ck_assert(ctpu_is_valid(in[1]));
        ctpu_compiled_free(c);
        ctpu_release(in[0]);
        ctpu_release(in[1]);
    }
}
END_TEST

/* ---------------------------------- a step with no device op */
/* fn that records nothing (returns an input and a view of it): as
 * torch.compile skips such a frame, every call runs fn, with no
 * misleading recompile-limit report; results and identities are eager's. */
typedef struct { int runs; } empty_ctx;

static ctpu_status empty_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    ((empty_ctx *)vc)->runs++;
    int64_t sq[2] = { 2, 2 };
    out[0] = in[0];
    out[1] = ctpu_reshape(in[0], 2, sq);
    return CTPU_OK;
}

START_TEST(step_with_no_device_op_is_skipped)
{
    empty_ctx k = { 0 };
    ctpu_compiled *c = ctpu_compile(empty_fn, &k, &(ctpu_compile_opts){ .name = "noop" });
    for (int it = 0; it < 4; it++) {
        ctpu_tensor x = ctpu_keep(T_VEC(it, 1, 2, 3)), out[2];
        ck_assert_msg(ctpu_compiled_call(c, 1, &x, 0, NULL, 2, out) == CTPU_OK, "%s", ctpu_last_error());
        ck_assert(out[0].id == x.id);
        float *v = t_read(out[1], NULL);
        ck_assert(v[0] == (float)it && v[3] == 3);
        free(v);
        ctpu_release(out[1]);
        ctpu_release(x);
    }
    ck_assert_int_eq(k.runs, 4);
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_int_eq(info.replays, 0);
    ck_assert_int_eq(info.eager_calls, 3);
    ck_assert_msg(t_contains(info.last_reason, "no device op") && !t_contains(info.last_reason, "recompile"), "%s",
                  info.last_reason);
    ctpu_compiled_free(c);
}
END_TEST

/* ---------------------------------- out is the in array */
/* ctpu_compiled_call(c, 2, arr, 0, NULL, 2, arr): the call reads the
 * inputs as given, then writes the outputs over them (a capture and the
 * replays alike). */
static ctpu_status inout_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)vc;
    (void)sc;
    out[0] = ctpu_add(in[0], in[1]);
    out[1] = ctpu_mul(in[0], in[1]);
    out[2] = in[0];
    return CTPU_OK;
}

START_TEST(out_array_may_be_the_in_array)
{
    ctpu_compiled *c = ctpu_compile(inout_fn, NULL, NULL);
    for (int it = 0; it < 3; it++) {
        ctpu_tensor x = ctpu_keep(T_VEC(it + 1, 2)), y = ctpu_keep(T_VEC(3, 4));
        ctpu_tensor arr[3] = { x, y, CTPU_NULL };
        ck_assert_msg(ctpu_compiled_call(c, 2, arr, 0, NULL, 3, arr) == CTPU_OK, "%s", ctpu_last_error());
        float *s = t_read(arr[0], NULL), *p = t_read(arr[1], NULL);
        ck_assert_msg(s[0] == it + 4 && s[1] == 6, "call %d: sum %g %g", it, s[0], s[1]);
        ck_assert_msg(p[0] == 3 * (it + 1) && p[1] == 8, "call %d: product %g %g", it, p[0], p[1]);
        ck_assert(arr[2].id == x.id);
        free(s);
        free(p);
        ctpu_release(arr[0]);
        ctpu_release(arr[1]);
        ctpu_release(x);
        ctpu_release(y);
    }
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_int_eq(info.replays, 2);
    ctpu_compiled_free(c);
}
END_TEST

/* ---------------------------------- automatic dynamic falls back to static */
/* TORCH_TPU_AUTO_DYNAMIC with fn reshaping x [2T, 4] to [2, -1, 4]: dim 0
 * made dynamic over [2, 2^31-1] fails the reshape's rule (odd extents), so
 * that trial capture is abandoned (the assign and the random draw before
 * the reshape did not happen) and the call captures static, as
 * torch.compile specialises; later extents recapture static. Every call
 * equals eager: P, the values, the generator. */
typedef struct { ctpu_tensor P; } adf_ctx;

static ctpu_status adf_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    adf_ctx *k = vc;
    int64_t s3[3] = { 2, -1, 4 }, s1[1] = { 4 };
    ctpu_status st = ctpu_assign(k->P, ctpu_add(k->P, ctpu_rand_uniform(CTPU_F32, 1, s1, 0, 1)));
    if (st != CTPU_OK) return st;
    ctpu_tensor r = ctpu_reshape(in[0], 3, s3);
    out[0] = ctpu_add(ctpu_sum(r, 1, (int[]){ 1 }, false), k->P);
    return ctpu_is_null(out[0]) ? ctpu_last_status() : CTPU_OK;
}

static void adf_run(bool compiled, float o[6][8], float p[6], uint64_t off[6], ctpu_compiled_info *info)
{
    static const int ts[6] = { 3, 5, 7, 5, 9, 3 };
    int64_t s1[1] = { 4 };
    adf_ctx k = { ctpu_keep(ctpu_zeros(CTPU_F32, 1, s1)) };
    ctpu_manual_seed(11);
    ctpu_compiled *c = compiled ? ctpu_compile(adf_fn, &k, NULL) : NULL;
    for (int it = 0; it < 6; it++) {
        int64_t sh[2] = { 2 * ts[it], 4 };
        ctpu_tensor x = ctpu_keep(ctpu_reshape(ctpu_arange(0, 8 * ts[it], 1, CTPU_F32), 2, sh)), out[1] = { CTPU_NULL };
        if (compiled) {
            ck_assert_msg(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out) == CTPU_OK, "call %d: %s", it, ctpu_last_error());
        } else {
            ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
            ck_assert_int_eq(adf_fn(&k, &x, NULL, out), CTPU_OK);
            ctpu_keep(out[0]);
            ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        }
        ck_assert_int_eq(ctpu_to_host(out[0], o[it], sizeof o[it]), CTPU_OK);
        float pv[4];
        ck_assert_int_eq(ctpu_to_host(k.P, pv, sizeof pv), CTPU_OK);
        p[it] = pv[2];
        uint64_t seed;
        ck_assert_int_eq(ctpu_rng_get_state(&seed, &off[it]), CTPU_OK);
        ctpu_release(out[0]);
        ctpu_release(x);
    }
    if (c) ck_assert_int_eq(ctpu_compiled_get_info(c, info), CTPU_OK);
    ctpu_compiled_free(c);
    ctpu_release(k.P);
}

START_TEST(auto_dynamic_falls_back_to_static_when_fn_fails_dynamic)
{
    ctpu_shutdown();
    setenv("TORCH_TPU_AUTO_DYNAMIC", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    unsetenv("TORCH_TPU_AUTO_DYNAMIC");
    float ro[6][8], go[6][8], rp[6], gp[6];
    uint64_t roff[6], goff[6];
    ctpu_compiled_info info;
    adf_run(false, ro, rp, roff, NULL);
    adf_run(true, go, gp, goff, &info);
    for (int it = 0; it < 6; it++) {
        for (int i = 0; i < 8; i++)
            ck_assert_msg(t_same(go[it][i], ro[it][i]), "call %d: out[%d] %.9g vs eager %.9g", it, i, go[it][i], ro[it][i]);
        ck_assert_msg(t_same(gp[it], rp[it]), "call %d: P %.9g vs eager %.9g", it, gp[it], rp[it]);
        ck_assert_msg(goff[it] == roff[it], "call %d: generator offset %llu vs eager %llu", it,
                      (unsigned long long)goff[it], (unsigned long long)roff[it]);
    }
    /* 3, 5, 7, 9 captured static; 5 and 3 again replay */
    ck_assert_int_eq(info.replays, 2);
    ck_assert_int_eq(info.guard_failures, 3);
    ck_assert_int_eq(info.dynamic_captures, 0);
    ctpu_shutdown();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
}
END_TEST

/* ---------------------------------- scalars fed to integer operands */
/* fn converting scalars to ints (add_scalar_int(x, (int64_t)sc[0]),
 * mul_scalar_int on f32, clamp_int's bound): a replay reads
 * trunc(scalars[i]) there, as the cast does, never the fraction (a
 * capture at 3.0, then 2.5 multiplied f32 by 2.5). Every call vs eager. */
static ctpu_status int_sc_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)vc;
    out[0] = ctpu_add_scalar_int(in[0], (int64_t)sc[0]);
    out[1] = ctpu_mul_scalar_int(in[1], (int64_t)sc[1]);
    out[2] = ctpu_clamp_int(in[0], (int64_t)sc[2], 100);
    out[3] = ctpu_mul_scalar(in[1], sc[1]);   /* the same argument as a double: itself */
    return CTPU_OK;
}

START_TEST(scalars_fed_to_integer_operands_truncate)
{
    static const double scs[6][3] = { { 3, 2, 1 }, { 4, 3, 2 }, { 4.5, 2.5, 1.5 }, { -1.5, 7.75, 7.9 }, { 5, 5, 5 },
                                      { 100.5, -2.5, -0.5 } };
    int64_t sh[2] = { 2 };
    ctpu_compiled *c = ctpu_compile(int_sc_fn, NULL, NULL);
    for (int it = 0; it < 6; it++) {
        ctpu_tensor in[2] = { ctpu_keep(ctpu_from_host((int32_t[]){ 1, 2 }, CTPU_I32, 1, sh)),
                              ctpu_keep(ctpu_from_host((float[]){ 1.5f, 2 }, CTPU_F32, 1, sh)) };
        ctpu_tensor got[4], ref[4];
        ck_assert_msg(ctpu_compiled_call(c, 2, in, 3, scs[it], 4, got) == CTPU_OK, "%s", ctpu_last_error());
        ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
        ck_assert_int_eq(int_sc_fn(NULL, in, scs[it], ref), CTPU_OK);
        for (int j = 0; j < 4; j++) ctpu_keep(ref[j]);
        ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        for (int j = 0; j < 4; j++) {
            float g[2], r[2];
            ck_assert_int_eq(ctpu_to_host_as_f32(got[j], g, sizeof g), CTPU_OK);
            ck_assert_int_eq(ctpu_to_host_as_f32(ref[j], r, sizeof r), CTPU_OK);
            for (int i = 0; i < 2; i++)
                ck_assert_msg(t_same(g[i], r[i]), "call %d out[%d][%d]: %g vs eager %g", it, j, i, g[i], r[i]);
            ctpu_release(got[j]);
            ctpu_release(ref[j]);
        }
        ctpu_release(in[0]);
        ctpu_release(in[1]);
    }
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_int_ge(info.replays, 3);
    ctpu_compiled_free(c);
}
END_TEST

/* ---------------------------------- an assign that makes history */
/* fn assigning a value that requires grad into a tensor made before the
 * call with grad mode on gives that tensor a history (torch's copy_): a
 * replay cannot, so it is a graph break and every call keeps eager's
 * history (backward through H after the call reaches W). Under no_grad the
 * step replays. */
typedef struct { ctpu_tensor W, H; bool no_grad; } hist_ctx;

static ctpu_status hist_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    hist_ctx *k = vc;
    ctpu_tensor y = ctpu_mul(in[0], k->W);
    if (k->no_grad) ck_assert_int_eq(ctpu_no_grad_begin(), CTPU_OK);
    ctpu_status st = ctpu_assign(k->H, y);
    if (k->no_grad) ck_assert_int_eq(ctpu_no_grad_end(), CTPU_OK);
    out[0] = ctpu_add_scalar(y, 1);
    return st;
}

static void hist_run(bool no_grad, bool compiled, float g[3][3], ctpu_compiled_info *info)
{
    hist_ctx k = { ctpu_keep(T_VEC(1, 2, 3)), ctpu_keep(T_VEC(0, 0, 0)), no_grad };
    ck_assert_int_eq(ctpu_set_requires_grad(k.W, true), CTPU_OK);
    ctpu_compiled *c = compiled ? ctpu_compile(hist_fn, &k, NULL) : NULL;
    for (int it = 0; it < 3; it++) {
        ctpu_tensor x = ctpu_keep(T_VEC(it + 1, 2 * it, 5)), out[1];
        if (compiled) {
            ck_assert_msg(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out) == CTPU_OK, "%s", ctpu_last_error());
        } else {
            ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
            ck_assert_int_eq(hist_fn(&k, &x, NULL, out), CTPU_OK);
            ctpu_keep(out[0]);
            ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        }
        for (int i = 0; i < 3; i++) g[it][i] = -1;
        if (ctpu_requires_grad(k.H)) {
            ck_assert_msg(ctpu_backward_ex(ctpu_sum(k.H, 0, NULL, false), CTPU_NULL, true) == CTPU_OK, "%s call %d: %s", compiled ? "compiled" : "eager", it, ctpu_last_error());
            ck_assert_int_eq(ctpu_to_host(ctpu_grad(k.W), g[it], sizeof g[it]), CTPU_OK);
            ck_assert_int_eq(ctpu_zero_grad(k.W), CTPU_OK);
        }
        ctpu_release(out[0]);
        ctpu_release(x);
    }
    if (c) ck_assert_int_eq(ctpu_compiled_get_info(c, info), CTPU_OK);
    ctpu_compiled_free(c);
    ctpu_release(k.W);
    ctpu_release(k.H);
}

START_TEST(assign_that_makes_history_is_a_graph_break)
{
    for (int ng = 0; ng < 2; ng++) {
        float ref[3][3], got[3][3];
        ctpu_compiled_info info;
        hist_run(ng, false, ref, NULL);
        hist_run(ng, true, got, &info);
        for (int it = 0; it < 3; it++)
            for (int i = 0; i < 3; i++)
                ck_assert_msg(t_same(got[it][i], ref[it][i]), "no_grad %d call %d: W.grad[%d] %g vs eager %g", ng, it, i,
                              got[it][i], ref[it][i]);
        if (ng) {
            ck_assert_int_eq(info.graph_breaks, 0);
            ck_assert_int_eq(info.replays, 2);
        } else {
            ck_assert_int_eq(info.graph_breaks, 1);
            ck_assert_msg(t_contains(info.last_reason, "autograd history"), "%s", info.last_reason);
        }
    }
}
END_TEST

/* ---------------------------------- requires_grad and grad mode are guards */
/* As torch.compile guards each input's requires_grad and the grad mode: an
 * input that starts requiring grad gets its .grad as eager gives it (was:
 * the replay skipped it), and a call under no_grad of a step that calls
 * backward fails as eager does (was: the replay ran the backward). */
typedef struct { ctpu_tensor W; } rgg_ctx;

static ctpu_status rgg_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    rgg_ctx *k = vc;
    ctpu_tensor loss = ctpu_sum(ctpu_mul(in[0], k->W), 0, NULL, false);
    ctpu_status st = ctpu_backward(loss);
    out[0] = loss;
    return st;
}

START_TEST(requires_grad_and_grad_mode_are_guards)
{
    rgg_ctx k = { ctpu_keep(T_VEC(1, 2, 3)) };
    ck_assert_int_eq(ctpu_set_requires_grad(k.W, true), CTPU_OK);
    ctpu_compiled *c = ctpu_compile(rgg_fn, &k, NULL);
    for (int it = 0; it < 4; it++) {
        ctpu_tensor x = ctpu_keep(T_VEC(1, 1, 1)), out[1];
        if (it >= 2) ck_assert_int_eq(ctpu_set_requires_grad(x, true), CTPU_OK);
        ck_assert_msg(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out) == CTPU_OK, "%s", ctpu_last_error());
        ctpu_tensor g = ctpu_grad(x);
        ck_assert_msg(ctpu_is_null(g) == (it < 2), "call %d: x.grad %s", it, ctpu_is_null(g) ? "missing" : "made");
        if (!ctpu_is_null(g)) {
            float *v = t_read(g, NULL);
            ck_assert_msg(v[0] == 1 && v[1] == 2 && v[2] == 3, "call %d: x.grad %g %g %g", it, v[0], v[1], v[2]);
            free(v);
        }
        ck_assert_int_eq(ctpu_zero_grad(k.W), CTPU_OK);
        ctpu_release(out[0]);
        ctpu_release(x);
    }
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_int_ge(info.guard_failures, 1);
    /* under no_grad: backward has nothing to differentiate, as in eager */
    ctpu_tensor x = ctpu_keep(T_VEC(1, 1, 1)), out[1];
    ck_assert_int_eq(ctpu_no_grad_begin(), CTPU_OK);
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    ctpu_status want = rgg_fn(&k, &x, NULL, out);
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    ck_assert_int_ne(want, CTPU_OK);
    ctpu_status got = ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out);
    ck_assert_int_eq(ctpu_no_grad_end(), CTPU_OK);
    ck_assert_msg(got == want, "compiled %d vs eager %d: %s", got, want, ctpu_last_error());
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_msg(t_contains(info.last_reason, "grad mode off"), "%s", info.last_reason);
    ctpu_release(x);
    ctpu_compiled_free(c);
    ctpu_zero_grad(k.W);
    ctpu_release(k.W);
}
END_TEST

/* ---------------------------------- an input leaf's .grad binds by position */
/* As torch.compile binds inputs by position: a leaf that requires grad
 * passed as in[i] gets its .grad at each call, whichever tensor it is (a
 * new batch leaf each step), bit-identical to fn in strict eager; was: the
 * replay wrote the .grad of the leaf the capture saw, so a new leaf each
 * call failed a guard and recaptured to the recompile limit, and a leaf
 * the caller kept (or one with a .grad) got another leaf's gradient. W is
 * a parameter zero_grad'ed and updated each call, V one whose .grad
 * accumulates (its .grad appears at call 1: one recapture). */
enum { LG_NEW, LG_NEW_RELEASED, LG_REUSED, LG_PAIRS, LG_PREGRAD, LG_TWICE, LG_TWICE_THEN_TWO, LG_SHARED_LEAVES,
       LG_NO_GRAD, LG_NON_LEAF, LG_ALT_GRADS, LG_ALT_ZEROED, LG_RETURN_GRAD, LG_COUNT };
/* captures each variant makes (V's .grad: 2; the .grad presence of in[0]
 * alternating: 3; the same leaf twice, then two: a guard each; a non-leaf
 * in[0] with a new history each call, which the step's backward runs
 * through: a capture each call to the recompile limit, 8, then fn runs in
 * the current mode, non_leaf_input_history_is_a_guard) */
static const int lg_captures[LG_COUNT] = { 2, 2, 2, 3, 3, 2, 3, 3, 2, 8, 2, 2, 2 };
#define LG_CALLS 12
#define LG_LOG (LG_CALLS * 7 * 4)
typedef struct { ctpu_tensor W, V, a, b, cur; int variant; } lg_ctx;

static ctpu_status lg_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    lg_ctx *k = vc;
    bool two = k->variant == LG_TWICE || k->variant == LG_TWICE_THEN_TWO || k->variant == LG_SHARED_LEAVES;
    ctpu_zero_grad(k->W);
    if (k->variant == LG_ALT_ZEROED) ctpu_zero_grad(in[0]);
    ctpu_tensor t = ctpu_mul(ctpu_mul(in[0], in[0]), k->W);
    t = ctpu_add(t, ctpu_mul(ctpu_tanh(two ? in[1] : in[0]), k->V));
    ctpu_tensor loss = ctpu_sum(t, 0, NULL, false);
    ctpu_status st = ctpu_backward(loss);
    if (st != CTPU_OK) return st;
    ctpu_no_grad_begin();
    ctpu_assign(k->W, ctpu_sub(k->W, ctpu_mul_scalar(ctpu_grad(k->W), 0.125)));
    ctpu_no_grad_end();
    out[0] = loss;
    if (k->variant == LG_RETURN_GRAD) out[1] = ctpu_grad(in[0]);
    return ctpu_last_status();
}

static ctpu_tensor lg_vec(float a, float b, float c, float d, bool rg)
{
    ctpu_tensor t = ctpu_keep(T_VEC(a, b, c, d));
    if (rg) ck_assert_int_eq(ctpu_set_requires_grad(t, true), CTPU_OK);
    return t;
}

static void lg_pregrad(ctpu_tensor x)   /* a .grad made in eager before the call */
{
    ctpu_scope_begin();
    ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul_scalar(x, 3.0), 0, NULL, false)), CTPU_OK);
    ctpu_scope_end();
}

typedef struct { float v[LG_LOG]; int n; } lg_log;

static void lg_put(lg_log *L, ctpu_tensor t)
{
    float *d = L->v + L->n;
    L->n += 4;
    if (ctpu_is_null(t)) { d[0] = d[1] = d[2] = d[3] = -999; return; }
    ck_assert_msg(ctpu_to_host(t, d, 4 * sizeof *d) == CTPU_OK, "%s", ctpu_last_error());
}

/* in[0] (and in[1]) of call it of a variant; *n_in */
static void lg_inputs(lg_ctx *k, int it, ctpu_tensor *in, int *n_in)
{
    float f = 0.1f * (float)(it + 1);
    *n_in = 1;
    switch (k->variant) {
    case LG_REUSED: in[0] = k->a; break;
    case LG_PAIRS:   /* a new leaf, then the same one again */
        if (it % 2 == 0) k->cur = lg_vec(f, 0.7f, -f, 1, true);
        in[0] = k->cur;
        break;
    case LG_ALT_GRADS: case LG_ALT_ZEROED: in[0] = (it / 3) % 2 ? k->b : k->a; break;
    case LG_NO_GRAD: in[0] = lg_vec(f, -f, 2 * f, 1, false); break;
    case LG_NON_LEAF: in[0] = ctpu_keep(ctpu_mul_scalar(k->a, 0.5)); break;
    default: in[0] = lg_vec(f, -f, 2 * f, 1, true); break;
    }
    if ((k->variant == LG_PREGRAD && it % 3) || k->variant == LG_RETURN_GRAD) lg_pregrad(in[0]);
    if (k->variant == LG_TWICE || k->variant == LG_TWICE_THEN_TWO || k->variant == LG_SHARED_LEAVES) {
        *n_in = 2;
        in[1] = in[0];
        if (k->variant == LG_TWICE_THEN_TWO && it % 4 == 2) in[1] = lg_vec(1, f, 1, -f, true);
        if (k->variant == LG_SHARED_LEAVES && it % 3 == 1) {   /* another leaf on in[0]'s storage */
            in[1] = ctpu_keep(ctpu_detach(in[0]));
            ck_assert_int_eq(ctpu_set_requires_grad(in[1], true), CTPU_OK);
        }
    }
}

static void lg_run(int variant, bool compiled, lg_log *L, ctpu_compiled_info *info)
{
    memset(L, 0, sizeof *L);
    lg_ctx k = { .variant = variant };
    k.W = lg_vec(0.5f, -1, 2, 0.25f, true);
    k.V = lg_vec(1, 2, 3, 4, true);
    k.a = lg_vec(0.3f, 0.7f, -0.2f, 1, true);
    k.b = lg_vec(-0.5f, 0.1f, 0.9f, 2, true);
    if (variant == LG_ALT_GRADS || variant == LG_ALT_ZEROED) { lg_pregrad(k.a); lg_pregrad(k.b); }
    ctpu_compiled *c = compiled ? ctpu_compile(lg_fn, &k, &(ctpu_compile_opts){ .name = "leafgrad" }) : NULL;
    ctpu_tensor keep[2 * LG_CALLS];
    int nk = 0, n_out = variant == LG_RETURN_GRAD ? 2 : 1;
    for (int it = 0; it < LG_CALLS; it++) {
        ctpu_tensor in[2], out[2] = { CTPU_NULL, CTPU_NULL };
        int n_in;
        lg_inputs(&k, it, in, &n_in);
        if (compiled) {
            ck_assert_msg(ctpu_compiled_call(c, n_in, in, 0, NULL, n_out, out) == CTPU_OK, "variant %d call %d: %s",
                          variant, it, ctpu_last_error());
        } else {
            ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
            ck_assert_int_eq(lg_fn(&k, in, NULL, out), CTPU_OK);
            ctpu_keep(out[0]);
            ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        }
        lg_put(L, ctpu_grad(in[0]));
        lg_put(L, n_in == 2 ? ctpu_grad(in[1]) : CTPU_NULL);
        lg_put(L, ctpu_grad(k.a));
        lg_put(L, ctpu_grad(k.b));
        lg_put(L, out[0]);
        lg_put(L, k.W);
        lg_put(L, ctpu_grad(k.V));
        if (variant == LG_RETURN_GRAD)   /* out[1] is in[0]'s .grad itself, as eager returns it */
            ck_assert_msg(out[1].id == ctpu_grad(in[0]).id, "call %d: out[1] is not in[0]'s .grad", it);
        ctpu_release(out[0]);
        bool kept = variant == LG_REUSED || variant == LG_ALT_GRADS || variant == LG_ALT_ZEROED ||
                    (variant == LG_PAIRS && it % 2 == 0);
        if (variant == LG_NEW_RELEASED || variant == LG_NO_GRAD || variant == LG_NON_LEAF) {
            ctpu_zero_grad(in[0]);
            ctpu_release(in[0]);
        } else if (!kept) {
            keep[nk++] = in[0];
        }
        if (n_in == 2 && in[1].id != in[0].id) keep[nk++] = in[1];
    }
    if (compiled) {
        ck_assert_int_eq(ctpu_compiled_get_info(c, info), CTPU_OK);
        ctpu_compiled_free(c);
    }
    for (int i = 0; i < nk; i++) { ctpu_zero_grad(keep[i]); ctpu_release(keep[i]); }
    ctpu_tensor own[4] = { k.W, k.V, k.a, k.b };
    for (int i = 0; i < 4; i++) { ctpu_zero_grad(own[i]); ctpu_release(own[i]); }
}

START_TEST(input_leaf_grad_binds_by_position)
{
    for (int var = 0; var < LG_COUNT; var++) {
        lg_log ref, got;
        ctpu_compiled_info info;
        lg_run(var, false, &ref, NULL);
        lg_run(var, true, &got, &info);
        ck_assert_int_eq(got.n, ref.n);
        for (int i = 0; i < ref.n; i++)
            ck_assert_msg(t_same(got.v[i], ref.v[i]), "variant %d call %d value %d: %.9g vs eager %.9g", var,
                          i / 28, i % 28, got.v[i], ref.v[i]);
        uint64_t eager = var == LG_NON_LEAF ? LG_CALLS - 8 : 0;
        ck_assert_msg(info.captures == (uint64_t)lg_captures[var] && info.eager_calls == eager &&
                      info.replays == LG_CALLS - info.captures - eager,
                      "variant %d: %llu captures (want %d), %llu replays, %llu eager calls: %s", var,
                      (unsigned long long)info.captures, lg_captures[var], (unsigned long long)info.replays,
                      (unsigned long long)info.eager_calls, info.last_reason);
    }
}
END_TEST

/* The guards that bind per position name the input: a .grad present now
 * and not at the capture (or the reverse), and the same leaf passed twice
 * where the capture had two (or the reverse, two leaves on one storage). */
START_TEST(input_leaf_grad_guards_name_the_input)
{
    lg_ctx k = { .variant = LG_NEW };
    k.W = lg_vec(0.5f, -1, 2, 0.25f, true);
    k.V = lg_vec(1, 2, 3, 4, true);
    ctpu_compiled *c = ctpu_compile(lg_fn, &k, NULL);
    ctpu_tensor x = lg_vec(1, 2, 3, 4, true), y = lg_vec(5, 6, 7, 8, true), out[1];
    ck_assert_int_eq(ctpu_zero_grad(k.V), CTPU_OK);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);   /* x: no .grad */
    ctpu_release(out[0]);
    ck_assert_int_eq(ctpu_zero_grad(k.V), CTPU_OK);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);   /* x has one */
    ctpu_release(out[0]);
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_msg(t_contains(info.last_reason, "leaf input 0 has a .grad now, none at the capture"), "%s",
                  info.last_reason);
    ck_assert_int_eq(ctpu_zero_grad(k.V), CTPU_OK);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &y, 0, NULL, 1, out), CTPU_OK);   /* y: none, replays the first */
    ctpu_release(out[0]);
    ck_assert_int_eq(ctpu_zero_grad(k.V), CTPU_OK);
    ck_assert_int_eq(ctpu_zero_grad(x), CTPU_OK);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &y, 0, NULL, 1, out), CTPU_OK);   /* y has one: the second */
    ctpu_release(out[0]);
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_msg(info.captures == 2 && info.replays == 2, "%llu captures, %llu replays: %s",
                  (unsigned long long)info.captures, (unsigned long long)info.replays, info.last_reason);
    ck_assert_int_eq(ctpu_zero_grad(k.V), CTPU_OK);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);   /* x: none again: the first */
    ctpu_release(out[0]);
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_int_eq(info.captures, 2);
    ck_assert_int_eq(info.replays, 3);
    ctpu_compiled_free(c);
    /* captured with a .grad, called with a leaf that has none */
    c = ctpu_compile(lg_fn, &k, NULL);
    ck_assert_int_eq(ctpu_zero_grad(k.V), CTPU_OK);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &y, 0, NULL, 1, out), CTPU_OK);
    ctpu_release(out[0]);
    ck_assert_int_eq(ctpu_zero_grad(k.V), CTPU_OK);
    ck_assert_int_eq(ctpu_zero_grad(x), CTPU_OK);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
    ctpu_release(out[0]);
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_msg(t_contains(info.last_reason, "input 0 has no .grad now, one at the capture (which the step "
                             "accumulates into)"), "%s", info.last_reason);
    ctpu_compiled_free(c);
    /* the same leaf twice, then two leaves sharing its storage */
    k.variant = LG_TWICE;
    c = ctpu_compile(lg_fn, &k, NULL);
    ctpu_tensor in[2] = { x, x };
    ck_assert_int_eq(ctpu_zero_grad(x), CTPU_OK);
    ck_assert_int_eq(ctpu_compiled_call(c, 2, in, 0, NULL, 1, out), CTPU_OK);
    ctpu_release(out[0]);
    ck_assert_int_eq(ctpu_zero_grad(x), CTPU_OK);
    ck_assert_int_eq(ctpu_zero_grad(k.V), CTPU_OK);
    in[1] = ctpu_keep(ctpu_detach(x));
    ck_assert_int_eq(ctpu_set_requires_grad(in[1], true), CTPU_OK);
    ck_assert_int_eq(ctpu_compiled_call(c, 2, in, 0, NULL, 1, out), CTPU_OK);
    ctpu_release(out[0]);
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_msg(t_contains(info.last_reason, "input 1: no longer the same leaf as input 0"), "%s", info.last_reason);
    ck_assert_msg(!ctpu_is_null(ctpu_grad(in[1])), "in[1]'s .grad is its own");
    ctpu_compiled_free(c);
    ctpu_tensor all[5] = { k.W, k.V, x, y, in[1] };
    for (int i = 0; i < 5; i++) { ctpu_zero_grad(all[i]); ctpu_release(all[i]); }
}
END_TEST

/* A 4-element value into a log of calls (-999 for none). */
static void put4(float *v, int *n, ctpu_tensor t)
{
    float *d = v + *n;
    *n += 4;
    if (ctpu_is_null(t)) { d[0] = d[1] = d[2] = d[3] = -999; return; }
    ck_assert_msg(ctpu_to_host(t, d, 4 * sizeof *d) == CTPU_OK, "%s", ctpu_last_error());
}
#define LPUT(L, t) put4((L)->v, &(L)->n, (t))

/* ---------------------------------- fn returns a .grad backward made */
/* out[j] = ctpu_grad(W) for a parameter W, or ctpu_grad(in[0]) for an
 * input leaf, when the leaf had no .grad before backward: each replay sets
 * the leaf's .grad and out[j] is that .grad itself, as eager returns it;
 * was: an ordinary output, so replays set no .grad (W's update read the
 * capture's, V.grad never accumulated, in[0] got none). V: the caller
 * drops its .grad after each call (but in RG_NEW_PARAM, where it
 * accumulates from call 1: one recapture); W: zero_grad'ed in fn. */
enum { RG_ZEROED, RG_NEW_PARAM, RG_DROPPED_PARAM, RG_INPUT_LEAF, RG_INPUT_ALT, RG_FOUR_OUTS, RG_FULLGRAPH, RG_COUNT };
#define RG_CALLS 8
#define RG_LOG (RG_CALLS * 9 * 4)
typedef struct { ctpu_tensor W, V, a, b; int variant; } rgo_ctx;
typedef struct { float v[RG_LOG]; int n; } rgo_log;

static ctpu_status rgo_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    rgo_ctx *k = vc;
    ctpu_zero_grad(k->W);
    ctpu_tensor t = ctpu_add(ctpu_mul(ctpu_mul(in[0], in[0]), k->W), ctpu_mul(ctpu_tanh(in[0]), k->V));
    ctpu_tensor loss = ctpu_sum(t, 0, NULL, false);
    ctpu_status st = ctpu_backward(loss);
    if (st != CTPU_OK) return st;
    ctpu_no_grad_begin();
    ctpu_assign(k->W, ctpu_sub(k->W, ctpu_mul_scalar(ctpu_grad(k->W), 0.125)));
    ctpu_no_grad_end();
    out[0] = loss;
    switch (k->variant) {
    case RG_ZEROED: out[1] = ctpu_grad(k->W); break;
    case RG_NEW_PARAM: case RG_DROPPED_PARAM: out[1] = ctpu_grad(k->V); break;
    case RG_INPUT_LEAF: case RG_INPUT_ALT: out[1] = ctpu_grad(in[0]); break;
    default:   /* the same .grad twice, and another leaf's */
        out[1] = ctpu_grad(in[0]);
        out[2] = ctpu_grad(k->W);
        out[3] = ctpu_grad(in[0]);
        break;
    }
    return ctpu_last_status();
}

static void rgo_run(int variant, bool compiled, rgo_log *L, ctpu_compiled_info *info)
{
    memset(L, 0, sizeof *L);
    rgo_ctx k = { .variant = variant };
    k.W = lg_vec(0.5f, -1, 2, 0.25f, true);
    k.V = lg_vec(1, 2, 3, 4, true);
    k.a = lg_vec(0.3f, 0.7f, -0.2f, 1, true);
    k.b = lg_vec(-0.5f, 0.1f, 0.9f, 2, true);
    ctpu_compile_opts o = { .name = "returned_grad", .fullgraph = variant == RG_FULLGRAPH };
    ctpu_compiled *c = compiled ? ctpu_compile(rgo_fn, &k, &o) : NULL;
    int n_out = variant >= RG_FOUR_OUTS ? 4 : 2;
    ctpu_tensor keep[RG_CALLS];
    int nk = 0;
    for (int it = 0; it < RG_CALLS; it++) {
        float f = 0.1f * (float)(it + 1);
        bool alt = variant == RG_INPUT_ALT;
        ctpu_tensor x = alt ? ((it / 2) % 2 ? k.b : k.a) : lg_vec(f, -f, 2 * f, 1, true);
        ctpu_tensor out[4] = { CTPU_NULL, CTPU_NULL, CTPU_NULL, CTPU_NULL };
        if (compiled) {
            ck_assert_msg(ctpu_compiled_call(c, 1, &x, 0, NULL, n_out, out) == CTPU_OK, "variant %d call %d: %s",
                          variant, it, ctpu_last_error());
        } else {
            ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
            ck_assert_int_eq(rgo_fn(&k, &x, NULL, out), CTPU_OK);
            ctpu_keep(out[0]);
            ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        }
        for (int j = 0; j < n_out; j++) LPUT(L, out[j]);
        for (int j = n_out; j < 4; j++) LPUT(L, CTPU_NULL);
        LPUT(L, ctpu_grad(x));
        LPUT(L, ctpu_grad(k.W));
        LPUT(L, ctpu_grad(k.V));
        LPUT(L, ctpu_grad(k.a));
        LPUT(L, k.W);
        /* out[j] is the leaf's .grad itself, as eager returns it */
        ctpu_tensor want[4] = { CTPU_NULL, variant == RG_ZEROED ? ctpu_grad(k.W)
                                           : variant <= RG_DROPPED_PARAM ? ctpu_grad(k.V) : ctpu_grad(x),
                                ctpu_grad(k.W), ctpu_grad(x) };
        for (int j = 1; j < n_out; j++)
            ck_assert_msg(!ctpu_is_null(want[j]) && out[j].id == want[j].id,
                          "variant %d call %d: out[%d] is not the leaf's .grad", variant, it, j);
        ctpu_release(out[0]);
        if (variant != RG_NEW_PARAM) ctpu_zero_grad(k.V);
        if (alt) ctpu_zero_grad(x);
        else keep[nk++] = x;
    }
    if (compiled) {
        ck_assert_int_eq(ctpu_compiled_get_info(c, info), CTPU_OK);
        ctpu_compiled_free(c);
    }
    for (int i = 0; i < nk; i++) { ctpu_zero_grad(keep[i]); ctpu_release(keep[i]); }
    ctpu_tensor own[4] = { k.W, k.V, k.a, k.b };
    for (int i = 0; i < 4; i++) { ctpu_zero_grad(own[i]); ctpu_release(own[i]); }
}

START_TEST(returned_new_grad_is_the_leafs_grad)
{
    for (int var = 0; var < RG_COUNT; var++) {
        rgo_log ref, got;
        ctpu_compiled_info info;
        rgo_run(var, false, &ref, NULL);
        rgo_run(var, true, &got, &info);
        ck_assert_int_eq(got.n, ref.n);
        for (int i = 0; i < ref.n; i++)
            ck_assert_msg(t_same(got.v[i], ref.v[i]), "variant %d call %d value %d: %.9g vs eager %.9g", var,
                          i / 36, i % 36, got.v[i], ref.v[i]);
        uint64_t want = var == RG_NEW_PARAM ? 2 : 1;
        ck_assert_msg(info.captures == want && info.eager_calls == 0 && info.replays == RG_CALLS - want,
                      "variant %d: %llu captures (want %llu), %llu replays, %llu eager calls: %s", var,
                      (unsigned long long)info.captures, (unsigned long long)want, (unsigned long long)info.replays,
                      (unsigned long long)info.eager_calls, info.last_reason);
    }
}
END_TEST

/* ---------------------------------- an assigned input binds by position */
/* fn assigns in[i] while a view of it is alive (a rebind): each replay
 * rebinds the call's in[i], as torch.compile's input mutation applies to
 * the tensor passed this call; was: the capture's tensor, so the call's
 * in[i] stayed unchanged and the first call's got every update. The view
 * keeps the value in[i] had (copy on write). RB_ALIASED: in[1] is in[0]
 * at even calls and another handle on its storage at odd ones (fn reads
 * in[0] after assigning in[1]: the new value, or the old): a guard.
 * RB_OVERWRITE: fn writes in[0] without reading it and no view is alive
 * (in place, into the call's in[0]; was: the capture's). */
enum { RB_NEW, RB_ALT, RB_SECOND, RB_VIEW_SOMETIMES, RB_ALIASED, RB_LEAF, RB_OVERWRITE, RB_FULLGRAPH, RB_COUNT };
#define RB_CALLS 8
#define RB_LOG (RB_CALLS * 7 * 4)
typedef struct { ctpu_tensor P, a, b; int variant; } rb_ctx;
typedef struct { float v[RB_LOG]; int n; } rb_log;

static ctpu_status rb_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    rb_ctx *k = vc;
    int t = k->variant == RB_SECOND || k->variant == RB_ALIASED;   /* the input fn assigns */
    out[0] = ctpu_sum(ctpu_mul(k->variant == RB_OVERWRITE ? k->P : in[0], k->P), 0, NULL, false);
    if (k->variant == RB_OVERWRITE) {
        ctpu_assign(in[0], ctpu_mul_scalar(k->P, 0.5));
    } else if (k->variant == RB_LEAF) {   /* SGD on the input leaf itself */
        ctpu_status st = ctpu_backward(ctpu_sum(ctpu_mul(ctpu_mul(in[0], in[0]), k->P), 0, NULL, false));
        if (st != CTPU_OK) return st;
        ctpu_no_grad_begin();
        ctpu_assign(in[0], ctpu_sub(in[0], ctpu_mul_scalar(ctpu_grad(in[0]), 0.25)));
        ctpu_no_grad_end();
    } else {
        ctpu_assign(in[t], ctpu_add_scalar(ctpu_mul_scalar(in[t], 0.5), 1.0));
    }
    out[1] = ctpu_sum(ctpu_mul(in[0], k->P), 0, NULL, false);   /* in[0] after the assign */
    out[2] = k->variant == RB_LEAF ? CTPU_NULL : in[t];   /* (a leaf returned is detached) */
    return ctpu_last_status();
}

static void rb_run(int variant, bool compiled, rb_log *L, ctpu_compiled_info *info)
{
    memset(L, 0, sizeof *L);
    rb_ctx k = { .variant = variant };
    k.P = lg_vec(1, -2, 0.5f, 3, false);
    k.a = lg_vec(0.3f, 0.7f, -0.2f, 1, false);
    k.b = lg_vec(-0.5f, 0.1f, 0.9f, 2, false);
    ctpu_compile_opts o = { .name = "rebind", .fullgraph = variant == RB_FULLGRAPH };
    ctpu_compiled *c = compiled ? ctpu_compile(rb_fn, &k, &o) : NULL;
    ctpu_tensor first = CTPU_NULL, keep[2 * RB_CALLS];
    int nk = 0;
    for (int it = 0; it < RB_CALLS; it++) {
        float f = 0.1f * (float)(it + 1);
        ctpu_tensor in[2];
        int n_in = 1;
        in[0] = variant == RB_ALT ? ((it / 2) % 2 ? k.b : k.a) : lg_vec(f, -f, 2 * f, 1, variant == RB_LEAF);
        if (variant == RB_SECOND || variant == RB_ALIASED) {
            n_in = 2;
            in[1] = variant == RB_SECOND ? lg_vec(1, f, 3, -f, false) : it % 2 ? ctpu_keep(ctpu_detach(in[0])) : in[0];
        }
        int t = n_in - 1;
        bool view = variant != RB_OVERWRITE && (variant != RB_VIEW_SOMETIMES || it % 2 == 0);
        ctpu_tensor v = view ? ctpu_keep(ctpu_reshape(in[t], 2, (int64_t[]){ 2, 2 })) : CTPU_NULL;
        ctpu_tensor out[3] = { CTPU_NULL, CTPU_NULL, CTPU_NULL };
        if (compiled) {
            ck_assert_msg(ctpu_compiled_call(c, n_in, in, 0, NULL, 3, out) == CTPU_OK, "variant %d call %d: %s",
                          variant, it, ctpu_last_error());
        } else {
            ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
            ck_assert_int_eq(rb_fn(&k, in, NULL, out), CTPU_OK);
            ctpu_keep(out[0]);
            ctpu_keep(out[1]);
            ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        }
        if (it == 0) first = in[t];
        LPUT(L, in[0]);
        LPUT(L, in[t]);
        LPUT(L, first);   /* its own call's value: later calls leave it */
        LPUT(L, v);       /* in[t] before the call */
        LPUT(L, out[0]);
        LPUT(L, out[1]);
        LPUT(L, out[2]);
        ck_assert_msg(variant == RB_LEAF || out[2].id == in[t].id, "variant %d call %d: out[2] is not in[%d]", variant,
                      it, t);
        ctpu_release(out[0]);
        ctpu_release(out[1]);
        if (view) ctpu_release(v);
        if (variant == RB_LEAF) ctpu_zero_grad(in[0]);
        if (variant != RB_ALT) keep[nk++] = in[0];
        if (n_in == 2 && in[1].id != in[0].id) keep[nk++] = in[1];
    }
    if (compiled) {
        ck_assert_int_eq(ctpu_compiled_get_info(c, info), CTPU_OK);
        ctpu_compiled_free(c);
    }
    for (int i = 0; i < nk; i++) ctpu_release(keep[i]);
    ctpu_tensor own[3] = { k.P, k.a, k.b };
    for (int i = 0; i < 3; i++) ctpu_release(own[i]);
}

START_TEST(assigned_input_binds_by_position)
{
    for (int var = 0; var < RB_COUNT; var++) {
        rb_log ref, got;
        ctpu_compiled_info info;
        rb_run(var, false, &ref, NULL);
        rb_run(var, true, &got, &info);
        ck_assert_int_eq(got.n, ref.n);
        for (int i = 0; i < ref.n; i++)
            ck_assert_msg(t_same(got.v[i], ref.v[i]), "variant %d call %d value %d: %.9g vs eager %.9g", var,
                          i / 28, i % 28, got.v[i], ref.v[i]);
        uint64_t want = var == RB_ALIASED ? 2 : 1;
        ck_assert_msg(info.captures == want && info.eager_calls == 0 && info.replays == RB_CALLS - want,
                      "variant %d: %llu captures (want %llu), %llu replays, %llu eager calls: %s", var,
                      (unsigned long long)info.captures, (unsigned long long)want, (unsigned long long)info.replays,
                      (unsigned long long)info.eager_calls, info.last_reason);
        if (var == RB_ALIASED)
            ck_assert_msg(t_contains(info.last_reason, "input 1: no longer the same tensor as input 0"), "%s",
                          info.last_reason);
    }
}
END_TEST

/* ---------------------------------- a non-leaf input's history outside the call */
/* in[0] = a * f (a requires grad) made before each call: fn's backward
 * runs through that history, which the capture bakes (f, a, the values its
 * rules save). A call whose in[0] has another history (another f, another
 * a, another saved tensor) is a guard failure naming the input, and
 * recaptures (to the recompile limit, then fn runs in the current mode);
 * was: replays used the capture's f and wrote the capture's a.grad. The
 * same history each call (fn's backward retains it) replays, two of them
 * alternating replay two versions; so does a step whose backward does not
 * reach in[0]'s history. a.grad and the
 * fresh leaves' .grad are read and dropped after each call. */
enum { NL_SCALE, NL_NEW_LEAF, NL_SAVED, NL_SAME_OPS, NL_RETAINED, NL_RETAINED_ALT, NL_NO_BACKWARD, NL_TWO, NL_FULLGRAPH,
       NL_COUNT };
#define NL_CALLS 12
#define NL_LOG (NL_CALLS * 5 * 4)
typedef struct { ctpu_tensor W, a, kept, kept2; int variant; } nl_ctx;
typedef struct { float v[NL_LOG]; int n; } nl_log;

static ctpu_status nl_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    nl_ctx *k = vc;
    ctpu_zero_grad(k->W);
    ctpu_tensor x = k->variant == NL_TWO ? ctpu_add(in[0], ctpu_tanh(in[1])) : in[0];
    ctpu_tensor loss = ctpu_sum(ctpu_mul(ctpu_mul(x, x), k->W), 0, NULL, false);
    out[0] = loss;
    if (k->variant == NL_NO_BACKWARD) return ctpu_last_status();
    ctpu_status st = ctpu_backward_ex(loss, CTPU_NULL, k->variant == NL_RETAINED || k->variant == NL_RETAINED_ALT);
    if (st != CTPU_OK) return st;
    ctpu_no_grad_begin();
    ctpu_assign(k->W, ctpu_sub(k->W, ctpu_mul_scalar(ctpu_grad(k->W), 0.125)));
    ctpu_no_grad_end();
    return ctpu_last_status();
}

static void nl_run(int variant, bool compiled, nl_log *L, ctpu_compiled_info *info)
{
    memset(L, 0, sizeof *L);
    nl_ctx k = { .variant = variant };
    k.W = lg_vec(0.5f, -1, 2, 0.25f, true);
    k.a = lg_vec(0.3f, 0.7f, -0.2f, 1, true);
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    k.kept = ctpu_keep(ctpu_mul_scalar(k.a, 0.5));
    k.kept2 = ctpu_keep(ctpu_mul_scalar(k.a, -1.5));
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    ctpu_compile_opts o = { .name = "non_leaf", .fullgraph = variant == NL_FULLGRAPH };
    ctpu_compiled *c = compiled ? ctpu_compile(nl_fn, &k, &o) : NULL;
    for (int it = 0; it < NL_CALLS; it++) {
        float f = 0.25f * (float)(it + 1);
        ctpu_tensor leaf = variant == NL_NEW_LEAF ? lg_vec(f, -f, 1, 2 * f, true) : k.a;
        ctpu_tensor c2 = lg_vec(1, f, -1, 2, false), in[2];
        ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
        switch (variant) {
        case NL_NEW_LEAF: case NL_SAME_OPS: in[0] = ctpu_mul_scalar(leaf, 0.5); break;
        case NL_SAVED: in[0] = ctpu_mul(k.a, c2); break;   /* mul's backward reads c2 */
        case NL_RETAINED: in[0] = k.kept; break;
        case NL_RETAINED_ALT: in[0] = (it / 2) % 2 ? k.kept2 : k.kept; break;
        default: in[0] = ctpu_mul_scalar(k.a, f); break;
        }
        in[1] = ctpu_add_scalar(k.a, f);
        int n_in = variant == NL_TWO ? 2 : 1;
        ctpu_tensor out[1] = { CTPU_NULL };
        if (compiled) {
            ck_assert_msg(ctpu_compiled_call(c, n_in, in, 0, NULL, 1, out) == CTPU_OK, "variant %d call %d: %s",
                          variant, it, ctpu_last_error());
            ctpu_keep(out[0]);
        } else {
            ck_assert_int_eq(nl_fn(&k, in, NULL, out), CTPU_OK);
            ctpu_keep(out[0]);
        }
        ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        LPUT(L, out[0]);
        LPUT(L, ctpu_grad(k.a));
        LPUT(L, ctpu_grad(leaf));
        LPUT(L, ctpu_grad(k.W));
        LPUT(L, k.W);
        ctpu_release(out[0]);
        ctpu_zero_grad(k.a);
        ctpu_zero_grad(leaf);
        if (variant == NL_NEW_LEAF) ctpu_release(leaf);
        ctpu_release(c2);
    }
    if (compiled) {
        ck_assert_int_eq(ctpu_compiled_get_info(c, info), CTPU_OK);
        ctpu_compiled_free(c);
    }
    ctpu_tensor own[4] = { k.W, k.a, k.kept, k.kept2 };
    for (int i = 0; i < 4; i++) { ctpu_zero_grad(own[i]); ctpu_release(own[i]); }
}

START_TEST(non_leaf_input_history_is_a_guard)
{
    for (int var = 0; var < NL_COUNT; var++) {
        nl_log ref, got;
        ctpu_compiled_info info;
        nl_run(var, false, &ref, NULL);
        nl_run(var, true, &got, &info);
        ck_assert_int_eq(got.n, ref.n);
        for (int i = 0; i < ref.n; i++)
            ck_assert_msg(t_same(got.v[i], ref.v[i]), "variant %d call %d value %d: %.9g vs eager %.9g", var,
                          i / 20, i % 20, got.v[i], ref.v[i]);
        bool replays = var == NL_RETAINED || var == NL_RETAINED_ALT || var == NL_NO_BACKWARD;
        /* a new history each call: a capture each call to the limit (8), then fn in the current mode */
        uint64_t want = var == NL_RETAINED_ALT ? 2 : replays ? 1 : 8;
        ck_assert_msg(info.captures == want && info.eager_calls == (replays ? 0 : NL_CALLS - 8) &&
                      info.replays == (replays ? NL_CALLS - want : 0),
                      "variant %d: %llu captures (want %llu), %llu replays, %llu eager calls: %s", var,
                      (unsigned long long)info.captures, (unsigned long long)want, (unsigned long long)info.replays,
                      (unsigned long long)info.eager_calls, info.last_reason);
        if (!replays)
            ck_assert_msg(t_contains(info.last_reason, "input 0: a non-leaf whose autograd history is not the "
                                     "capture's"), "variant %d: %s", var, info.last_reason);
    }
}
END_TEST

/* History made before the call that the capture's backward released (no
 * retain_graph): a backward through it fails in eager from the next call
 * on, so no call replays such a capture. A non-leaf fn reads from ctx
 * (ctx->h = a * 0.5), or the same non-leaf input each call (fn retains
 * its graph) released by a backward between calls: each call's status,
 * and a.grad, as eager's; was: replays ran where eager fails. */
typedef struct { ctpu_tensor a, h; bool retain; } rh_ctx;

static ctpu_status rh_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    rh_ctx *k = vc;
    ctpu_tensor l = ctpu_sum(ctpu_mul(ctpu_is_null(k->h) ? in[0] : k->h, in[0]), 0, NULL, false);
    out[0] = l;
    return ctpu_backward_ex(l, CTPU_NULL, k->retain);
}

static void rh_run(bool ctx_h, bool compiled, ctpu_status *st, rgo_log *L)
{
    memset(L, 0, sizeof *L);
    rh_ctx k = { .a = lg_vec(0.3f, 0.7f, -0.2f, 1, true), .h = CTPU_NULL, .retain = !ctx_h };
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    ctpu_tensor kept = ctpu_keep(ctpu_mul_scalar(k.a, 0.5));
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    if (ctx_h) k.h = kept;
    ctpu_compiled *c = compiled ? ctpu_compile(rh_fn, &k, NULL) : NULL;
    for (int it = 0; it < 6; it++) {
        float f = 0.25f * (float)(it + 1);
        ctpu_tensor x = ctx_h ? lg_vec(f, -f, 1, 2, false) : kept, out[1] = { CTPU_NULL };
        if (!ctx_h && it == 3) {   /* a backward outside releases in[0]'s history */
            ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
            ck_assert_int_eq(ctpu_backward(ctpu_sum(kept, 0, NULL, false)), CTPU_OK);
            ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
            LPUT(L, ctpu_grad(k.a));
            ctpu_zero_grad(k.a);
        }
        ctpu_clear_error();
        if (compiled) {
            st[it] = ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out);
        } else {
            ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
            st[it] = rh_fn(&k, &x, NULL, out);
            ctpu_keep(out[0]);
            ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        }
        if (st[it] != CTPU_OK)
            ck_assert_msg(t_contains(ctpu_last_error(), "released by an earlier backward"), "call %d: %s", it,
                          ctpu_last_error());
        LPUT(L, st[it] == CTPU_OK ? out[0] : CTPU_NULL);
        LPUT(L, ctpu_grad(k.a));
        if (st[it] == CTPU_OK) ctpu_release(out[0]);
        ctpu_zero_grad(k.a);
        if (ctx_h) ctpu_release(x);
    }
    ctpu_clear_error();
    ctpu_compiled_free(c);
    ctpu_release(kept);
    ctpu_release(k.a);
}

START_TEST(released_history_made_before_the_call_is_a_guard)
{
    for (int ctx_h = 0; ctx_h < 2; ctx_h++) {
        ctpu_status want[6], got[6];
        rgo_log ref, log;
        rh_run(ctx_h, false, want, &ref);
        rh_run(ctx_h, true, got, &log);
        for (int it = 0; it < 6; it++)
            ck_assert_msg(got[it] == want[it], "%s: call %d: status %d vs eager %d", ctx_h ? "ctx" : "input", it,
                          got[it], want[it]);
        ck_assert_msg(want[ctx_h ? 1 : 3] != CTPU_OK, "eager's backward fails after the release");
        ck_assert_int_eq(log.n, ref.n);
        for (int i = 0; i < ref.n; i++)
            ck_assert_msg(t_same(log.v[i], ref.v[i]), "%s: value %d: %.9g vs eager %.9g", ctx_h ? "ctx" : "input", i,
                          log.v[i], ref.v[i]);
    }
}
END_TEST

/* ---------------------------------- more of a new user's cases */
/* trunc(-0.5) is -0 but the cast gives 0: a capture at -0.5 still reads
 * the argument (was baked as 0 for every later call). */
static ctpu_status rsub_int_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)vc;
    out[0] = ctpu_rsub_scalar_int(in[0], (int64_t)sc[0]);
    return CTPU_OK;
}

START_TEST(integer_operand_captured_at_minus_half)
{
    static const double scs[4] = { -0.5, 3, 4, 5.5 };
    static const float want[4] = { -1, 2, 3, 4 };
    int64_t sh[1] = { 1 };
    ctpu_compiled *c = ctpu_compile(rsub_int_fn, NULL, NULL);
    for (int it = 0; it < 4; it++) {
        ctpu_tensor x = ctpu_keep(ctpu_from_host((float[]){ 1 }, CTPU_F32, 1, sh)), out[1];
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 1, &scs[it], 1, out), CTPU_OK);
        float v;
        ck_assert_int_eq(ctpu_to_host(out[0], &v, sizeof v), CTPU_OK);
        ck_assert_msg(v == want[it], "sc %g: %g, eager %g", scs[it], v, want[it]);
        ctpu_release(out[0]);
        ctpu_release(x);
    }
    ctpu_compiled_free(c);
}
END_TEST

/* fullgraph: a random draw recorded before the break does not move the
 * generator (nothing of the call ran). */
static ctpu_status draw_then_read_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)vc;
    (void)sc;
    int64_t sh[1] = { 4 };
    double v;
    ctpu_tensor r = ctpu_add(in[0], ctpu_rand_normal(CTPU_F32, 1, sh, 0, 1));
    ctpu_status st = ctpu_item(ctpu_sum(r, 0, NULL, false), &v);
    out[0] = r;
    return st;
}

START_TEST(fullgraph_refusal_leaves_the_generator)
{
    int64_t sh[1] = { 4 };
    ck_assert_int_eq(ctpu_rng_set_state(42, 0), CTPU_OK);
    ctpu_compiled *c = ctpu_compile(draw_then_read_fn, NULL, &(ctpu_compile_opts){ .fullgraph = true });
    ctpu_tensor x = ctpu_keep(ctpu_zeros(CTPU_F32, 1, sh)), out[1];
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_ERR_STATE);
    uint64_t seed, off;
    ck_assert_int_eq(ctpu_rng_get_state(&seed, &off), CTPU_OK);
    ck_assert_msg(seed == 42 && off == 0, "generator at (%llu, %llu)", (unsigned long long)seed, (unsigned long long)off);
    ctpu_compiled_free(c);
    ctpu_release(x);
}
END_TEST

/* fn that ignores a failed op and returns CTPU_OK: out[0] is the error
 * handle naming the op, as eager's; that call is not captured, and later
 * good calls capture and replay. out[j] = in[i] leaves in[i] in its own
 * scope (it was kept into the caller's, past its scope_end). */
typedef struct { bool bad; } errout_ctx;

static ctpu_status errout_fn(void *vc, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    errout_ctx *k = vc;
    out[0] = ctpu_add(in[0], k->bad ? in[1] : in[0]);
    out[1] = in[0];
    return CTPU_OK;
}

/* A dynamic input whose fn derives a static extent from it (slices to
 * B - 1 and B / 2: ctpu's symbols are c x s, so those extents are static in
 * the trace): each capture at a new in-range extent compiles its own
 * program instead of binding the dynamic one. That is a recompile, as
 * torch.compile's guard on a specialised symbol: a guard failure naming the
 * extent and the cache's reason, counted toward the recompile limit (which
 * the step itself used up: the report must not blame other steps); past it
 * fn runs in the current mode; every call bit-identical to strict eager.
 * Both with TORCH_TPU_AUTO_DYNAMIC and with the caller's ctpu_mark_dynamic. */
static ctpu_status step_halves(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx; (void)sc;
    int64_t b = ctpu_dim(in[0], 0);
    ctpu_tensor a = ctpu_sum(ctpu_slice(in[0], 0, 0, b - 1, 1), 1, (int[]){ 0 }, false);
    ctpu_tensor h = ctpu_sum(ctpu_slice(in[0], 0, 0, b / 2, 1), 1, (int[]){ 0 }, false);
    out[0] = ctpu_add(a, ctpu_mul_scalar(h, 0.5));
    return CTPU_OK;
}

static void halves_run(bool mark)
{
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    ctpu_compiled *c = ctpu_compile(step_halves, NULL, &(ctpu_compile_opts){ .name = "halves" });
    ck_assert_ptr_nonnull(c);
    for (int64_t b = 4; b < 20; b++) {
        ctpu_scope_begin();
        float d[20 * 3];
        for (int i = 0; i < b * 3; i++) d[i] = (float)((i * 7 + (int)b) % 11) * 0.37f - 1.5f;
        ctpu_tensor x = t_f32(d, 2, (int64_t[]){ b, 3 });
        if (mark) ck_assert_int_eq(ctpu_mark_dynamic(x, 0, 2, 64), CTPU_OK);
        ctpu_tensor out[1];
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
        int64_t nv = 0;
        float *v = t_read(out[0], &nv);
        ck_assert_int_eq(nv, 3);
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
        ctpu_tensor want[1];
        ck_assert_int_eq(step_halves(NULL, &x, NULL, want), CTPU_OK);
        float *w = t_read(want[0], NULL);
        ck_assert_msg(memcmp(v, w, 3 * sizeof(float)) == 0, "b=%lld mark=%d: %.9g %.9g %.9g vs strict %.9g %.9g %.9g", (long long)b, mark, v[0], v[1], v[2], w[0], w[1], w[2]);
        free(v);
        free(w);
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
        ctpu_scope_end();
    }
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_int_eq(info.calls, 16);
    ck_assert_int_eq(info.captures, 8);          /* the limit: 8 versions, each its own program */
    ck_assert_int_eq(info.eager_calls, 8);       /* 12..19: fn in the current mode */
    ck_assert_int_eq(info.replays, 0);
    ck_assert_int_eq(info.guard_failures, 8);
    ck_assert_msg(t_contains(info.last_reason, "TORCH_TPU_RECOMPILE_LIMIT=8 (8 versions captured)"), "%s",
                  info.last_reason);
    char *rep = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&rep, &n);
    ck_assert_int_eq(ctpu_cache_report(f), CTPU_OK);
    fclose(f);
    ck_assert_msg(t_contains(rep, "fn's trace specialises it"), "%s", rep);
    ck_assert_msg(!t_contains(rep, "by other compiled steps"), "%s", rep);
    ck_assert_msg(!t_contains(rep, "other compiled steps or traces of the same structure"), "%s", rep);
    free(rep);
    ctpu_compiled_free(c);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
}

START_TEST(dynamic_extent_fn_specialises_is_a_recompile)
{
    halves_run(true);
    ctpu_shutdown();
    setenv("TORCH_TPU_AUTO_DYNAMIC", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    unsetenv("TORCH_TPU_AUTO_DYNAMIC");
    halves_run(false);
    ctpu_shutdown();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
}
END_TEST

/* After a call out of the dynamic range (a static version of its own, the
 * newest), a new in-range extent binds the dynamic program: a dynamic
 * capture, not a guard failure (a new user's report: it read "fn's trace
 * specialises it" with the programs backwards) */
static ctpu_status step_sq(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx; (void)sc;
    out[0] = ctpu_sum(ctpu_mul(in[0], in[0]), 1, (int[]){ 0 }, false);
    return CTPU_OK;
}

START_TEST(in_range_extent_after_an_out_of_range_call_binds)
{
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    ctpu_compiled *c = ctpu_compile(step_sq, NULL, NULL);
    static const int64_t bs[5] = { 5, 6, 100, 3, 7 };
    for (int k = 0; k < 5; k++) {
        ctpu_scope_begin();
        float d[400];
        for (int i = 0; i < bs[k] * 4; i++) d[i] = 0.01f * (float)i - 0.5f;
        ctpu_tensor x = t_f32(d, 2, (int64_t[]){ bs[k], 4 });
        ck_assert_int_eq(ctpu_mark_dynamic(x, 0, 2, 64), CTPU_OK);
        ctpu_tensor out[1], want[1];
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
        float *v = t_read(out[0], NULL);
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
        ck_assert_int_eq(step_sq(NULL, &x, NULL, want), CTPU_OK);
        float *w = t_read(want[0], NULL);
        ck_assert_int_eq(memcmp(v, w, 4 * sizeof(float)), 0);
        free(v);
        free(w);
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
        ctpu_scope_end();
    }
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_int_eq(info.captures, 5);
    ck_assert_int_eq(info.guard_failures, 1);      /* 100 only */
    ck_assert_int_eq(info.dynamic_captures, 3);    /* 6, 3, 7 */
    ck_assert_msg(t_contains(info.last_reason, "outside dynamic range"), "%s", info.last_reason);
    ctpu_compiled_free(c);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
}
END_TEST

START_TEST(ignored_op_error_and_returned_input)
{
    int64_t s4[1] = { 4 }, s3[1] = { 3 };
    errout_ctx k = { true };
    ctpu_compiled *c = ctpu_compile(errout_fn, &k, NULL);
    for (int it = 0; it < 4; it++) {
        k.bad = it == 0;
        ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
        ctpu_tensor in[2] = { ctpu_ones(CTPU_F32, 1, s4), ctpu_ones(CTPU_F32, 1, s3) }, out[2];
        ck_assert_int_eq(ctpu_compiled_call(c, 2, in, 0, NULL, 2, out), CTPU_OK);
        float v[4];
        ctpu_status st = ctpu_to_host(out[0], v, sizeof v);
        if (it == 0) {
            ck_assert_int_ne(st, CTPU_OK);
            ck_assert_msg(t_contains(ctpu_last_error(), "add: a is f32[4], b is f32[3]"), "%s", ctpu_last_error());
        } else {
            ck_assert_int_eq(st, CTPU_OK);
            ck_assert(v[0] == 2 && v[3] == 2);
        }
        ck_assert(out[1].id == in[0].id);
        ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        ck_assert_msg(!ctpu_is_valid(in[0]), "call %d: in[0] outlived its scope", it);
    }
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_int_eq(info.replays, 2);
    ctpu_compiled_free(c);
}
END_TEST

/* fn has no n_out: one that writes out[0] of a call with n_out = 0 (or past
 * n_out) writes into the library's guard slots, not NULL or the caller's
 * memory, and the call fails naming it (the handle goes with fn's scope);
 * one that returns an error status without an error recorded gets a
 * message naming fn's status (a new user's report). The step still works
 * after both. */
typedef struct { int write_at; ctpu_status ret; } wild_ctx;
static ctpu_status wild_fn(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    const wild_ctx *k = ctx;
    if (k->ret != CTPU_OK) { ctpu_clear_error(); return k->ret; }
    out[k->write_at] = ctpu_add_scalar(in[0], 1.0);
    return CTPU_OK;
}
START_TEST(fn_writing_past_n_out_or_failing_silently)
{
    int64_t s4[1] = { 4 };
    wild_ctx k = { 0, CTPU_OK };
    ctpu_compiled *c = ctpu_compile(wild_fn, &k, NULL);
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    ctpu_tensor x = ctpu_ones(CTPU_F32, 1, s4), out[2];
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ctpu_hbm_stats h0, h1;
    ck_assert_int_eq(ctpu_hbm_get_stats(&h0), CTPU_OK);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 0, NULL), CTPU_ERR_INVALID_ARG);
    ck_assert_msg(t_contains(ctpu_last_error(), "fn wrote out[0], but the call has n_out = 0"), "%s", ctpu_last_error());
    k.write_at = 1;
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_ERR_INVALID_ARG);
    ck_assert_msg(t_contains(ctpu_last_error(), "fn wrote out[1], but the call has n_out = 1"), "%s", ctpu_last_error());
    ck_assert(ctpu_is_null(out[0]));
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ck_assert_int_eq(ctpu_hbm_get_stats(&h1), CTPU_OK);
    ck_assert_msg(h1.in_use == h0.in_use, "HBM in use %llu -> %llu: fn's stray output leaked",
                  (unsigned long long)h0.in_use, (unsigned long long)h1.in_use);
    k.ret = CTPU_ERR_INVALID_ARG;
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    ck_assert_msg(t_contains(ctpu_last_error(), "fn returned"), "%s", ctpu_last_error());
    k.ret = CTPU_OK;
    k.write_at = 0;
    for (int it = 0; it < 3; it++) {
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
        float v[4];
        ck_assert_int_eq(ctpu_to_host(out[0], v, sizeof v), CTPU_OK);
        ck_assert(v[0] == 2 && v[3] == 2);
    }
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    ctpu_compiled_free(c);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("compile");
    TCase *t = tcase_create("compile");
    tcase_add_checked_fixture(t, t_setup, t_teardown);
    tcase_set_timeout(t, 120);
    tcase_add_test(t, mlp_step_bit_identical_to_strict);
    tcase_add_test(t, replay_runs_no_fn_and_records_nothing);
    tcase_add_test(t, guard_failure_recaptures_with_reason);
    tcase_add_test(t, host_state_is_baked);
    tcase_add_test(t, eager_and_compiled_mix);
    tcase_add_test(t, graph_break_runs_as_defer_and_fuse);
    tcase_add_test(t, fullgraph_break_is_an_error_and_changes_nothing);
    tcase_add_test(t, fullgraph_sync_and_mark_step_fail_before_the_cut);
    tcase_add_test(t, dynamic_input_binds_one_program);
    tcase_add_test(t, dynamic_replays_count_at_their_extents);
    tcase_add_test(t, auto_dynamic_applies_to_compiled_steps);
    tcase_add_test(t, auto_dynamic_follows_a_slice_by_the_host_extent);
    tcase_add_test(t, auto_dynamic_makes_each_changing_dim_dynamic);
    tcase_add_test(t, random_draws_advance_at_every_replay);
    tcase_add_test(t, dynamic_input_with_a_random_op_binds_one_program);
    tcase_add_test(t, mode_change_is_a_graph_break);
    tcase_add_test(t, data_dependent_branch_follows_the_data);
    tcase_add_test(t, nested_compiled_call_is_a_graph_break);
    tcase_add_test(t, graph_break_uses_step_op_numbers_and_labels);
    tcase_add_test(t, collective_is_a_graph_break);
    tcase_add_test(t, capture_longer_than_the_trace_limit_is_one_program);
    tcase_add_test(t, capture_past_its_length_limit_is_a_graph_break);
    tcase_add_test(t, scalars_are_runtime_arguments);
    tcase_add_test(t, changing_scalars_capture_once_per_program);
    tcase_add_test(t, equal_scalars_are_not_baked);
    tcase_add_test(t, self_call_is_an_error);
    tcase_add_test(t, assigned_tensor_with_a_live_view_replays);
    tcase_add_test(t, recompile_limit_then_eager);
    tcase_add_test(t, failed_capture_does_not_count_against_the_limit);
    tcase_add_test(t, released_parameter_names_the_guard);
    tcase_add_test(t, compile_disable_runs_fn);
    tcase_add_test(t, bad_calls_are_errors);
    tcase_add_test(t, freed_steps_are_refused_without_reading_them);
    tcase_add_test(t, capturable_optimizers_bit_identical);
    tcase_add_test(t, non_capturable_optimizer_refused_in_capture);
    tcase_add_test(t, capturable_optimizer_over_bf16_params);
    tcase_add_test(t, guard_reason_names_the_closest_version);
    tcase_add_test(t, guard_reason_says_how_sharing_changed);
    tcase_add_test(t, binding_cache_notices_every_change);
    tcase_add_test(t, returned_assigned_tensor_is_written_and_returned);
    tcase_add_test(t, host_effects_in_fn_are_graph_breaks);
    tcase_add_test(t, host_effects_under_fullgraph_are_errors_and_change_nothing);
    tcase_add_test(t, step_with_no_device_op_is_skipped);
    tcase_add_test(t, out_array_may_be_the_in_array);
    tcase_add_test(t, auto_dynamic_falls_back_to_static_when_fn_fails_dynamic);
    tcase_add_test(t, scalars_fed_to_integer_operands_truncate);
    tcase_add_test(t, assign_that_makes_history_is_a_graph_break);
    tcase_add_test(t, requires_grad_and_grad_mode_are_guards);
    tcase_add_test(t, input_leaf_grad_binds_by_position);
    tcase_add_test(t, input_leaf_grad_guards_name_the_input);
    tcase_add_test(t, returned_new_grad_is_the_leafs_grad);
    tcase_add_test(t, assigned_input_binds_by_position);
    tcase_add_test(t, non_leaf_input_history_is_a_guard);
    tcase_add_test(t, released_history_made_before_the_call_is_a_guard);
    tcase_add_test(t, integer_operand_captured_at_minus_half);
    tcase_add_test(t, fullgraph_refusal_leaves_the_generator);
    tcase_add_test(t, ignored_op_error_and_returned_input);
    tcase_add_test(t, dynamic_extent_fn_specialises_is_a_recompile);
    tcase_add_test(t, in_range_extent_after_an_out_of_range_call_binds);
    tcase_add_test(t, fn_writing_past_n_out_or_failing_silently);
    suite_add_tcase(s, t);
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
