/* Dynamic dims (issue 15, DESIGN.md "Dynamic dims"): ctpu_mark_dynamic, the
 * dynamic key and lookup, a dynamic program bound at every extent in range
 * bit-identical to strict eager, exact compile counts, out-of-range
 * recompile reasons, reshape validity at the call, bad input. */
#include "t_core.h"
#include "ctpu_nn.h"

/* One step of a small MLP with a loss and its backward over a batch of B
 * rows: out[] gets y (B x 8) then dW (16 x 8) then the reduced loss. */
typedef struct { ctpu_tensor w, b; } mlp;

static float *batch_data(int64_t B, uint32_t seed)
{
    float *x = malloc(sizeof(float) * (size_t)(B * 16));
    uint32_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < B * 16; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((int32_t)(s >> 8) % 2001 - 1000) / 977.0f;
    }
    return x;
}

static mlp mlp_make(void)
{
    float w[16 * 8], b[8];
    for (int i = 0; i < 16 * 8; i++) w[i] = (float)((i * 37) % 23 - 11) / 13.0f;
    for (int i = 0; i < 8; i++) b[i] = (float)(i - 4) / 7.0f;
    int64_t ws[2] = { 16, 8 }, bs = 8;
    mlp m = { ctpu_from_host(w, CTPU_F32, 2, ws), ctpu_from_host(b, CTPU_F32, 1, &bs) };
    ctpu_set_requires_grad(m.w, true);
    ctpu_set_requires_grad(m.b, true);
    return m;
}

/* Runs the step at batch B (marked dynamic in [lo, hi] if lo > 0); out holds
 * B*8 + 16*8 + 1 floats. */
static void mlp_step(mlp *m, int64_t B, int64_t lo, int64_t hi, float *out)
{
    ctpu_scope_begin();
    float *xd = batch_data(B, (uint32_t)B);
    int64_t xs[2] = { B, 16 };
    ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 2, xs);
    free(xd);
    if (lo > 0) ck_assert_int_eq(ctpu_mark_dynamic(x, 0, lo, hi), CTPU_OK);
    ctpu_tensor h = ctpu_relu(ctpu_add(ctpu_matmul(x, m->w), m->b));
    int64_t fs[1] = { -1 };
    ctpu_tensor flat = ctpu_reshape(h, 1, fs);                 /* [B*8]: a multiple of the symbol */
    ctpu_tensor sm = ctpu_softmax(h, -1);
    ctpu_tensor loss = ctpu_add(ctpu_mean(ctpu_mul(flat, flat), 0, NULL, false), ctpu_sum(sm, 0, NULL, false));
    ck_assert_msg(!ctpu_is_null(loss), "%s", ctpu_last_error());
    ck_assert_msg(ctpu_backward(loss) == CTPU_OK, "backward: %s", ctpu_last_error());
    ck_assert_int_eq(ctpu_to_host(h, out, sizeof(float) * (size_t)(B * 8)), CTPU_OK);
    ck_assert_int_eq(ctpu_to_host(ctpu_grad(m->w), out + B * 8, sizeof(float) * 16 * 8), CTPU_OK);
    ck_assert_int_eq(ctpu_to_host(loss, out + B * 8 + 128, sizeof(float)), CTPU_OK);
    ctpu_zero_grad(m->w);
    ctpu_zero_grad(m->b);
    ctpu_scope_end();
    ctpu_mark_step();
}

static const int64_t EXTENTS[] = { 64, 37, 50, 2, 3, 64, 17, 63, 37 };
#define N_EXT ((int)(sizeof EXTENTS / sizeof EXTENTS[0]))

START_TEST(parity_and_one_program)
{
    /* strict eager at each extent: the reference */
    float *ref[N_EXT], *got = malloc(sizeof(float) * (64 * 8 + 129));
    mlp m = mlp_make();
    for (int e = 0; e < N_EXT; e++) {
        ref[e] = malloc(sizeof(float) * (size_t)(EXTENTS[e] * 8 + 129));
        mlp_step(&m, EXTENTS[e], 0, 0, ref[e]);
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    int64_t c0 = -1;
    for (int e = 0; e < N_EXT; e++) {
        mlp_step(&m, EXTENTS[e], 2, 64, got);
        if (getenv("CTPU_TEST_DYN_DEBUG")) fprintf(stderr, "extent %lld: compiled %lld binds %lld\n", (long long)EXTENTS[e], (long long)ctpu_metric_counter("programs_compiled"), (long long)ctpu_metric_counter("dynamic_binds"));
        if (e == 0) c0 = ctpu_metric_counter("programs_compiled");
        size_t n = (size_t)(EXTENTS[e] * 8 + 129);
        ck_assert_msg(memcmp(got, ref[e], sizeof(float) * n) == 0, "extent %lld differs from strict eager",
                      (long long)EXTENTS[e]);
    }
    if (getenv("CTPU_TEST_DYN_DEBUG")) { char lg[8192]; ctpu_cache_recompile_log(lg, sizeof lg); fprintf(stderr, "%s\n", lg); }
    /* the first step compiled its programs; every later extent reused them */
    ck_assert_int_eq(ctpu_metric_counter("programs_compiled"), c0);
    ck_assert_int_eq(ctpu_metric_counter("recompiles"), 0);
    ck_assert_int_gt(ctpu_metric_counter("dynamic_binds"), 0);
    for (int e = 0; e < N_EXT; e++) free(ref[e]);
    free(got);
}
END_TEST

/* A dynamic program keeps the bound launches of its last CTPU_DYN_BOUND_CAP
 * (16) distinct extents: 20 extents, then the newest 4 again (reused), then
 * the oldest (bound again, replacing the least recently used); every launch
 * bit-identical to strict eager. */
START_TEST(bound_launches_kept_and_replaced)
{
    enum { N = 20 };
    float *ref[N + 2], *got = malloc(sizeof(float) * (64 * 8 + 129));
    mlp m = mlp_make();
    for (int e = 0; e < N; e++) {
        ref[e] = malloc(sizeof(float) * (size_t)((e + 2) * 8 + 129));
        mlp_step(&m, e + 2, 0, 0, ref[e]);
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    int64_t c0 = 0;
    int64_t per_step = 0;                            /* dynamic launches per step */
    for (int e = 0; e < N; e++) {
        int64_t b0 = ctpu_metric_counter("dynamic_binds");
        mlp_step(&m, e + 2, 2, 64, got);
        per_step = ctpu_metric_counter("dynamic_binds") - b0;
        if (e == 0) c0 = ctpu_metric_counter("programs_compiled");
        ck_assert_msg(memcmp(got, ref[e], sizeof(float) * (size_t)((e + 2) * 8 + 129)) == 0, "extent %d", e + 2);
    }
    ck_assert_int_eq(ctpu_metric_counter("dynamic_bind_reuses"), 0);
    int64_t binds = ctpu_metric_counter("dynamic_binds");
    ck_assert_int_gt(per_step, 0);
    for (int e = N - 4; e < N; e++) {
        int64_t r0 = ctpu_metric_counter("dynamic_bind_reuses");
        mlp_step(&m, e + 2, 2, 64, got);
        ck_assert_int_eq(ctpu_metric_counter("dynamic_bind_reuses") - r0, per_step);
        ck_assert_msg(memcmp(got, ref[e], sizeof(float) * (size_t)((e + 2) * 8 + 129)) == 0, "again %d", e + 2);
    }
    for (int e = 0; e < 2; e++) {                    /* replaced: bound again */
        int64_t r0 = ctpu_metric_counter("dynamic_bind_reuses");
        mlp_step(&m, e + 2, 2, 64, got);
        ck_assert_int_eq(ctpu_metric_counter("dynamic_bind_reuses"), r0);
        ck_assert_msg(memcmp(got, ref[e], sizeof(float) * (size_t)((e + 2) * 8 + 129)) == 0, "rebound %d", e + 2);
    }
    ck_assert_int_eq(ctpu_metric_counter("programs_compiled"), c0);
    ck_assert_int_eq(ctpu_metric_counter("dynamic_binds"), binds + 6 * per_step);
    for (int e = 0; e < N; e++) free(ref[e]);
    free(got);
}
END_TEST

/* ctpu_declare_dynamic_inputs: each batch made from host data comes
 * marked; the same program and bits as marking each batch. */
START_TEST(declared_inputs_mark_each_batch)
{
    float *ref[N_EXT], *got = malloc(sizeof(float) * (64 * 8 + 129));
    mlp m = mlp_make();                              /* the parameters first: [16, 8] would match */
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_F32, 2, 0, 2, 64), CTPU_OK);
    for (int e = 0; e < N_EXT; e++) {                /* strict ignores the marks */
        ref[e] = malloc(sizeof(float) * (size_t)(EXTENTS[e] * 8 + 129));
        mlp_step(&m, EXTENTS[e], 0, 0, ref[e]);
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    int64_t c0 = -1;
    for (int e = 0; e < N_EXT; e++) {
        mlp_step(&m, EXTENTS[e], 0, 0, got);
        if (e == 0) c0 = ctpu_metric_counter("programs_compiled");
        ck_assert_msg(memcmp(got, ref[e], sizeof(float) * (size_t)(EXTENTS[e] * 8 + 129)) == 0, "extent %lld",
                      (long long)EXTENTS[e]);
    }
    ck_assert_int_eq(ctpu_metric_counter("programs_compiled"), c0);
    ck_assert_int_eq(ctpu_metric_counter("recompiles"), 0);
    ck_assert_int_gt(ctpu_metric_counter("dynamic_binds"), 0);
    /* out of the declared range, another rank or dtype: not marked */
    float d[4 * 70] = { 0 };
    int64_t big[2] = { 70, 4 }, r3[3] = { 2, 2, 2 };
    ck_assert_int_eq(ctpu_mark_dynamic(ctpu_from_host(d, CTPU_F32, 2, big), 0, 2, 64), CTPU_OK);
    ck_assert(!ctpu_is_null(ctpu_from_host(d, CTPU_F32, 3, r3)));
    /* cleared: every extent is a new program again */
    ctpu_clear_dynamic_inputs();
    int64_t c1 = ctpu_metric_counter("programs_compiled");
    mlp_step(&m, 5, 0, 0, got);
    mlp_step(&m, 6, 0, 0, got);
    ck_assert_int_gt(ctpu_metric_counter("programs_compiled"), c1);
    ck_assert_int_gt(ctpu_metric_counter("recompiles"), 0);
    for (int e = 0; e < N_EXT; e++) free(ref[e]);
    free(got);
}
END_TEST

START_TEST(hostile_declare_dynamic_inputs)
{
    ck_assert_int_eq(ctpu_declare_dynamic_inputs((ctpu_dtype)7, 2, 0, 2, 8), CTPU_ERR_INVALID_ARG);
    ck_assert_msg(strstr(ctpu_last_error(), "declare_dynamic_inputs") && strstr(ctpu_last_error(), "dt=7"), "%s",
                  ctpu_last_error());
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_F32, 0, 0, 2, 8), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_F32, 9, 0, 2, 8), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_F32, 2, 2, 2, 8), CTPU_ERR_INVALID_ARG);
    ck_assert_msg(strstr(ctpu_last_error(), "dim=2"), "%s", ctpu_last_error());
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_F32, 2, -3, 2, 8), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_F32, 2, 0, 1, 8), CTPU_ERR_INVALID_ARG);
    ck_assert_msg(strstr(ctpu_last_error(), "[1, 8]"), "%s", ctpu_last_error());
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_F32, 2, 0, 9, 8), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_F32, 2, 0, 2, INT64_MAX), CTPU_ERR_INVALID_ARG);
    /* four stand; the same dt, ndim and dim replaces; a fifth is refused */
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_F32, 2, 0, 2, 8), CTPU_OK);
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_F32, 2, -2, 2, 9), CTPU_OK);   /* replaces (dim 0) */
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_F32, 2, 1, 2, 8), CTPU_OK);
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_I32, 1, 0, 2, 8), CTPU_OK);
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_BF16, 2, 0, 2, 8), CTPU_OK);
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_I32, 2, 1, 2, 8), CTPU_ERR_INVALID_ARG);
    ck_assert_msg(strstr(ctpu_last_error(), "4 declarations"), "%s", ctpu_last_error());
    /* a tensor made under them: marked, and marked again by hand */
    float d[6] = { 0 };
    int64_t s[2] = { 2, 3 };
    ctpu_tensor x = ctpu_from_host(d, CTPU_F32, 2, s);
    ck_assert(!ctpu_is_null(x));
    ck_assert_int_eq(ctpu_mark_dynamic(x, 0, 2, 9), CTPU_OK);
    ctpu_clear_dynamic_inputs();
    ck_assert_int_eq(ctpu_declare_dynamic_inputs(CTPU_I32, 2, 1, 2, 8), CTPU_OK);
    ctpu_clear_dynamic_inputs();
    ctpu_release(x);
}
END_TEST

START_TEST(without_marks_recompiles)
{
    float *got = malloc(sizeof(float) * (64 * 8 + 129));
    mlp m = mlp_make();
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    for (int e = 0; e < 3; e++) mlp_step(&m, EXTENTS[e], 0, 0, got);
    ck_assert_int_gt(ctpu_metric_counter("recompiles"), 0);
    ck_assert_int_eq(ctpu_metric_counter("dynamic_binds"), 0);
    free(got);
}
END_TEST

START_TEST(out_of_range_reason)
{
    float *got = malloc(sizeof(float) * (300 * 8 + 129));
    mlp m = mlp_make();
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    mlp_step(&m, 40, 2, 256, got);
    int64_t c0 = ctpu_metric_counter("programs_compiled");
    mlp_step(&m, 200, 2, 256, got);
    ck_assert_int_eq(ctpu_metric_counter("programs_compiled"), c0);
    mlp_step(&m, 300, 2, 256, got);
    ck_assert_int_gt(ctpu_metric_counter("programs_compiled"), c0);
    char log[8192];
    ck_assert_int_ge(ctpu_cache_recompile_log(log, sizeof log), 0);
    ck_assert_msg(strstr(log, "dim 0 = 300 outside dynamic range [2, 256]"), "log: %s", log);
    free(got);
}
END_TEST

START_TEST(invalid_reshape_fails_at_the_call)
{
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    float d[48] = { 0 };
    int64_t s[2] = { 8, 6 };
    ctpu_tensor x = ctpu_from_host(d, CTPU_F32, 2, s);
    ck_assert_int_eq(ctpu_mark_dynamic(x, 0, 2, 64), CTPU_OK);
    int64_t bad[2] = { 12, 4 };
    ctpu_tensor r = ctpu_reshape(ctpu_neg(x), 2, bad);
    ck_assert(ctpu_is_null(r));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
    ck_assert_msg(strstr(ctpu_last_error(), "reshape") && strstr(ctpu_last_error(), "not valid for every extent"),
                  "%s", ctpu_last_error());
    /* a view of the marked tensor itself too */
    r = ctpu_reshape(x, 2, bad);
    ck_assert(ctpu_is_null(r));
    ck_assert_msg(strstr(ctpu_last_error(), "not valid for every extent"), "%s", ctpu_last_error());
    /* valid: -1, or a multiple of the extent */
    int64_t ok1[2] = { -1, 3 }, ok2[3] = { 16, 3, 1 };
    ck_assert(!ctpu_is_null(ctpu_reshape(ctpu_neg(x), 2, ok1)));
    ck_assert(!ctpu_is_null(ctpu_reshape(ctpu_neg(x), 3, ok2)));
    /* an operand whose dim only equals the extent now: allowed (that
     * value is static in the key) */
    float e[8] = { 0 };
    int64_t es[2] = { 8, 1 };
    ctpu_tensor y = ctpu_from_host(e, CTPU_F32, 2, es);
    ck_assert(!ctpu_is_null(ctpu_add(x, y)));
    ck_assert_int_eq(ctpu_mark_dynamic(y, 0, 2, 64), CTPU_OK);
    ck_assert(!ctpu_is_null(ctpu_add(x, y)));
    ctpu_sync();
}
END_TEST

START_TEST(strict_ignores_marks)
{
    float d[48] = { 0 };
    int64_t s[2] = { 8, 6 }, bad[2] = { 12, 4 };
    ctpu_tensor x = ctpu_from_host(d, CTPU_F32, 2, s);
    ck_assert_int_eq(ctpu_mark_dynamic(x, 0, 2, 64), CTPU_OK);
    ck_assert(!ctpu_is_null(ctpu_reshape(ctpu_neg(x), 2, bad)));   /* concrete extents only */
}
END_TEST

START_TEST(hostile_mark_dynamic)
{
    float d[6] = { 0 };
    int64_t s[2] = { 2, 3 };
    ctpu_tensor x = ctpu_from_host(d, CTPU_F32, 2, s);
    ck_assert_int_eq(ctpu_mark_dynamic(CTPU_NULL, 0, 2, 8), CTPU_ERR_NULL_HANDLE);
    ck_assert_int_eq(ctpu_mark_dynamic(x, 2, 2, 8), CTPU_ERR_INVALID_ARG);
    ck_assert_msg(strstr(ctpu_last_error(), "mark_dynamic") && strstr(ctpu_last_error(), "dim=2"), "%s",
                  ctpu_last_error());
    ck_assert_int_eq(ctpu_mark_dynamic(x, -3, 2, 8), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_mark_dynamic(x, 0, 1, 8), CTPU_ERR_INVALID_ARG);
    ck_assert_msg(strstr(ctpu_last_error(), "[1, 8]"), "%s", ctpu_last_error());
    ck_assert_int_eq(ctpu_mark_dynamic(x, 0, 9, 8), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_mark_dynamic(x, 0, 2, INT64_MAX), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_mark_dynamic(x, 0, INT64_MIN, -5), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_mark_dynamic(x, -1, 2, 8), CTPU_OK);
    ck_assert_int_eq(ctpu_mark_dynamic(x, -1, 3, 9), CTPU_OK);     /* replaces the range */
    ctpu_release(x);
    ck_assert_int_ne(ctpu_mark_dynamic(x, 0, 2, 8), CTPU_OK);   /* stale */
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    ctpu_tensor y = ctpu_neg(ctpu_from_host(d, CTPU_F32, 2, s));
    ck_assert_int_eq(ctpu_mark_dynamic(y, 0, 2, 8), CTPU_ERR_STATE);   /* pending */
    ctpu_sync();
}
END_TEST

/* ---------------------------------------------------------------- found by a user */
/* One step of x [B, 16] -> matmul w [16, 8] (w requires grad) -> [gelu,
 * layer_norm] -> loss (mean, or cross entropy with labels y [B] and label
 * smoothing 0.1) -> backward; marked (lo > 0): x and y dim 0 in [lo, 64].
 * out gets the loss then dW (1 + 128 floats). */
enum { USR_LN = 1, USR_CE = 2, USR_BACKWARD = 4 };

static void user_step(ctpu_tensor w, int64_t B, int var, int64_t lo, float *out)
{
    float *xd = batch_data(B, (uint32_t)(B * 3 + 1));
    int32_t *yd = malloc(sizeof(int32_t) * (size_t)B);
    for (int64_t i = 0; i < B; i++) yd[i] = (int32_t)((i * 3 + B) % 8);
    ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
    int64_t xs[2] = { B, 16 };
    ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 2, xs);
    ctpu_tensor y = ctpu_from_host(yd, CTPU_I32, 1, &B);
    free(xd);
    free(yd);
    if (lo > 0) {
        ck_assert_int_eq(ctpu_mark_dynamic(x, 0, lo, 64), CTPU_OK);
        ck_assert_int_eq(ctpu_mark_dynamic(y, 0, lo, 64), CTPU_OK);
    }
    ctpu_tensor h = ctpu_matmul(x, w);
    if (var & USR_LN) h = ctpu_layer_norm(ctpu_gelu(h, false), CTPU_NULL, CTPU_NULL, 1e-5);
    ctpu_ce_opts o = ctpu_ce_defaults();
    o.label_smoothing = 0.1;
    ctpu_tensor loss = (var & USR_CE) ? ctpu_cross_entropy(h, y, &o) : ctpu_mean(h, 0, NULL, false);
    ck_assert_msg(!ctpu_is_null(loss), "%s", ctpu_last_error());
    if (var & USR_BACKWARD) ck_assert_msg(ctpu_backward(loss) == CTPU_OK, "backward: %s", ctpu_last_error());
    ck_assert_int_eq(ctpu_to_host(loss, out, sizeof(float)), CTPU_OK);
    memset(out + 1, 0, sizeof(float) * 128);
    if (var & USR_BACKWARD) ck_assert_int_eq(ctpu_to_host(ctpu_grad(w), out + 1, sizeof(float) * 128), CTPU_OK);
    ctpu_zero_grad(w);
    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
}

static ctpu_tensor user_w(void)
{
    float wd[16 * 8];
    for (int i = 0; i < 16 * 8; i++) wd[i] = sinf((float)i * 0.37f) * 0.3f;
    int64_t ws[2] = { 16, 8 };
    ctpu_tensor w = ctpu_from_host(wd, CTPU_F32, 2, ws);
    ctpu_set_requires_grad(w, true);
    return w;
}

/* In a fresh runtime (TORCH_TPU_AUTO_DYNAMIC=1 if auto_dyn): runs the
 * extents in strict eager, then in defer and fuse (marked when lo > 0);
 * every step bit-identical; returns the programs defer and fuse compiled. */
static int64_t user_run(const int64_t *ext, int n, int var, int64_t lo, bool auto_dyn)
{
    ctpu_shutdown();
    t_clear_env();
    if (auto_dyn) setenv("TORCH_TPU_AUTO_DYNAMIC", "1", 1);
    ck_assert_msg(ctpu_init() == CTPU_OK, "%s", ctpu_last_error());
    unsetenv("TORCH_TPU_AUTO_DYNAMIC");
    ctpu_tensor w = user_w();
    float *ref = malloc(sizeof(float) * 129 * (size_t)n), got[129];
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    for (int e = 0; e < n; e++) user_step(w, ext[e], var, lo, ref + 129 * e);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    int64_t c0 = ctpu_metric_counter("programs_compiled");
    for (int e = 0; e < n; e++) {
        user_step(w, ext[e], var, lo, got);
        ck_assert_msg(memcmp(got, ref + 129 * e, sizeof got) == 0, "var %d B=%lld differs from strict eager", var,
                      (long long)ext[e]);
    }
    int64_t c = ctpu_metric_counter("programs_compiled") - c0;
    if (getenv("CTPU_TEST_DYN_DEBUG")) {
        char lg[8192];
        ctpu_cache_recompile_log(lg, sizeof lg);
        fprintf(stderr, "var %d: %lld compiles\n%s\n", var, (long long)c, lg);
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    ctpu_release(w);
    free(ref);
    return c;
}

/* TORCH_TPU_AUTO_DYNAMIC holds once the step has a backward: the backward
 * reads x again through the copy autograd saved of it, a second handle of
 * the same input, speculatively marked too; the first one-dim recompile
 * (4 -> 7) compiles the dynamic program and 9, 4, 12 reuse it (2 programs,
 * as forward-only; it was 3: the two marks of one input did not count as
 * the one changed dim, and the recompile compiled a static program). */
START_TEST(auto_dynamic_with_backward)
{
    static const int64_t ext[] = { 4, 7, 9, 4, 12 };
    ck_assert_int_eq(user_run(ext, 5, 0, 0, true), 2);                 /* forward only */
    ck_assert_int_eq(user_run(ext, 5, USR_BACKWARD, 0, true), 2);
    ck_assert_int_eq(user_run(ext, 5, USR_BACKWARD | USR_LN, 0, true), 2);
    ck_assert_int_eq(user_run(ext, 5, USR_BACKWARD | USR_CE, 0, true), 2);
}
END_TEST

/* A marked batch compiles one program over extents that equal a multiple
 * of another extent of the trace (2, 4, 8, 16 against the 8 classes and 16
 * features): layer_norm's and label-smoothed cross entropy's backward
 * expand a [B, 1] to [B, 8], and the probe moved the 8 with the symbol at
 * B = 2, 4, 8 (8 = 4s, 2s, s), so the expand and everything after it were
 * keyed static there (3 programs for 2 4 7 9 2 5 3). */
START_TEST(marked_batch_expand_backward_one_program)
{
    static const int64_t ext[] = { 2, 4, 7, 9, 8, 16, 2, 5, 3 };
    ck_assert_int_eq(user_run(ext, 9, USR_BACKWARD | USR_LN, 2, false), 1);
    ck_assert_int_eq(user_run(ext, 9, USR_BACKWARD | USR_CE, 2, false), 1);
    ck_assert_int_eq(user_run(ext, 9, USR_BACKWARD | USR_LN | USR_CE, 2, false), 1);
}
END_TEST

/* A char-GPT-like step (embedding + position slice, layer norm, q/k/v split
 * into heads by reshape and permute, causal SDPA, heads merged back, a tied
 * head, cross entropy, backward) with T marked dynamic in [2, 12], at every
 * T including T = head_dim (4) and T = dmodel (8), extents the trace also
 * has as static dims: one program, no recompile, each T bit-identical to
 * strict eager (at T = dmodel a node dim equal to T was taken for the
 * symbol or for dmodel and that extent compiled its own program). */
enum { GD = 8, GH = 2, GHD = 4, GV = 11, GCTX = 12, GB = 2 };
typedef struct { ctpu_tensor te, pe, g, bt, wq, wk, wv, wo; } tgpt;

static ctpu_tensor tg_param(int nd, const int64_t *s, uint32_t seed, float scale)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= s[i];
    float *d = malloc(sizeof(float) * (size_t)n);
    uint32_t z = seed * 2654435761u + 7;
    for (int64_t i = 0; i < n; i++) {
        z = z * 1664525u + 1013904223u;
        d[i] = scale * (float)((int32_t)(z >> 8) % 2001 - 1000) / 1000.0f;
    }
    ctpu_tensor t = ctpu_from_host(d, CTPU_F32, nd, s);
    free(d);
    ctpu_set_requires_grad(t, true);
    return t;
}

static tgpt tgpt_make(void)
{
    int64_t te[2] = { GV, GD }, pe[2] = { GCTX, GD }, dd[2] = { GD, GD }, d1 = GD;
    tgpt m = { tg_param(2, te, 1, 0.5f), tg_param(2, pe, 2, 0.5f), tg_param(1, &d1, 3, 1.0f), tg_param(1, &d1, 4, 0.1f),
               tg_param(2, dd, 5, 0.4f), tg_param(2, dd, 6, 0.4f), tg_param(2, dd, 7, 0.4f), tg_param(2, dd, 8, 0.4f) };
    return m;
}

static ctpu_tensor tg_heads(ctpu_tensor t, int64_t T)
{
    int64_t s[4] = { GB, T, GH, GHD };
    static const int perm[4] = { 0, 2, 1, 3 };
    return ctpu_permute(ctpu_reshape(t, 4, s), perm);
}

/* out: loss, then grad te [GV*GD], grad wq [GD*GD] */
static void tgpt_step(tgpt *m, int64_t T, bool marked, float *out)
{
    ctpu_scope_begin();
    int32_t x[GB * GCTX], y[GB * GCTX];
    for (int64_t i = 0; i < GB * T; i++) { x[i] = (int32_t)((i * 7 + T) % GV); y[i] = (int32_t)((i * 5 + 3 * T) % GV); }
    int64_t sh[2] = { GB, T };
    ctpu_tensor xt = ctpu_from_host(x, CTPU_I32, 2, sh), yt = ctpu_from_host(y, CTPU_I32, 2, sh);
    if (marked) {
        ck_assert_int_eq(ctpu_mark_dynamic(xt, 1, 2, GCTX), CTPU_OK);
        ck_assert_int_eq(ctpu_mark_dynamic(yt, 1, 2, GCTX), CTPU_OK);
    }
    ctpu_tensor h = ctpu_add(ctpu_embedding(m->te, xt), ctpu_slice(m->pe, 0, 0, T, 1));
    ctpu_tensor a = ctpu_layer_norm(h, m->g, m->bt, 1e-5);
    ctpu_tensor q = tg_heads(ctpu_matmul(a, m->wq), T), k = tg_heads(ctpu_matmul(a, m->wk), T);
    ctpu_tensor v = tg_heads(ctpu_matmul(a, m->wv), T);
    ctpu_tensor o = ctpu_scaled_dot_product_attention(q, k, v, CTPU_NULL, CTPU_MASK_NONE, true, 0.0, 0.0);
    static const int perm[4] = { 0, 2, 1, 3 };
    int64_t s3[3] = { GB, T, GD };
    o = ctpu_reshape(ctpu_contiguous(ctpu_permute(o, perm)), 3, s3);
    h = ctpu_add(h, ctpu_matmul(o, m->wo));
    ctpu_tensor logits = ctpu_matmul_t(h, m->te, false, true);
    int64_t s2[2] = { GB * T, GV }, s1 = GB * T;
    ctpu_ce_opts ce = ctpu_ce_defaults();
    ctpu_tensor loss = ctpu_cross_entropy(ctpu_reshape(logits, 2, s2), ctpu_reshape(yt, 1, &s1), &ce);
    ck_assert_msg(!ctpu_is_null(loss), "%s", ctpu_last_error());
    ck_assert_msg(ctpu_backward(loss) == CTPU_OK, "backward: %s", ctpu_last_error());
    ck_assert_int_eq(ctpu_to_host(loss, out, sizeof(float)), CTPU_OK);
    ck_assert_int_eq(ctpu_to_host(ctpu_grad(m->te), out + 1, sizeof(float) * GV * GD), CTPU_OK);
    ck_assert_int_eq(ctpu_to_host(ctpu_grad(m->wq), out + 1 + GV * GD, sizeof(float) * GD * GD), CTPU_OK);
    ctpu_tensor *ps = &m->te;
    for (int i = 0; i < 8; i++) ctpu_zero_grad(ps[i]);
    ctpu_scope_end();
    ctpu_mark_step();
}

/* A marked input that autograd saves for the backward (mul's operands:
 * sum(x * x), sum(x * w)): the saved handle keeps the marks, so the
 * backward reading it binds one program for every extent (it was keyed
 * with the extent: one compile per extent; a new user's report). Values and
 * .grads bit-identical to strict eager. */
START_TEST(saved_marked_input_keeps_its_symbol)
{
    for (int variant = 0; variant < 2; variant++) {
        static const int64_t bs[4] = { 5, 6, 7, 8 };
        int64_t c0 = 0, r0 = 0;
        float wv[2] = { 1.5f, -0.25f };
        ctpu_tensor w = ctpu_keep(t_f32(wv, 1, (int64_t[]){ 2 }));
        ck_assert_int_eq(ctpu_set_requires_grad(w, true), CTPU_OK);
        for (int e = 0; e < 4; e++) {
            float got[16], want[16];
            for (int m = 0; m < 2; m++) {
                ck_assert_int_eq(ctpu_set_mode(m ? CTPU_MODE_DEFER_FUSE : CTPU_MODE_STRICT), CTPU_OK);
                ctpu_scope_begin();
                float d[16];
                for (int i = 0; i < bs[e] * 2; i++) d[i] = 0.1f * (float)i - 0.3f * (float)e;
                ctpu_tensor x = t_f32(d, 2, (int64_t[]){ bs[e], 2 });
                ck_assert_int_eq(ctpu_mark_dynamic(x, 0, 2, 8), CTPU_OK);
                if (variant == 0) ck_assert_int_eq(ctpu_set_requires_grad(x, true), CTPU_OK);
                ctpu_tensor l = ctpu_sum(ctpu_mul(x, variant == 0 ? x : w), 0, NULL, false);
                ck_assert_int_eq(ctpu_backward(l), CTPU_OK);
                ctpu_tensor g = ctpu_grad(variant == 0 ? x : w);
                int64_t n = 0;
                float *v = t_read(g, &n);
                ck_assert_int_eq(n, variant == 0 ? bs[e] * 2 : 2);
                memcpy(m ? got : want, v, sizeof(float) * (size_t)n);
                free(v);
                if (variant == 0) ctpu_zero_grad(x);
                else ctpu_zero_grad(w);
                ctpu_scope_end();
                if (m && e == 0) {
                    ctpu_cache_info ci;
                    ck_assert_int_eq(ctpu_cache_get_info(&ci), CTPU_OK);
                    c0 = (int64_t)ci.compiles;
                    r0 = (int64_t)ci.recompiles;
                }
                if (m == 0) continue;
                ck_assert_int_eq(memcmp(got, want, sizeof(float) * (size_t)n), 0);
            }
        }
        ctpu_cache_info ci;
        ck_assert_int_eq(ctpu_cache_get_info(&ci), CTPU_OK);
        ck_assert_int_eq((int64_t)ci.recompiles, r0);
        /* variant 1: w's .grad present from the second step on (one more structure) */
        ck_assert_int_le((int64_t)ci.compiles - c0, variant == 0 ? 0 : 1);
        ctpu_release(w);
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    }
}
END_TEST

START_TEST(seq_len_through_static_extents_one_program)
{
    enum { NO = 1 + GV * GD + GD * GD };
    static const int64_t order[] = { 7, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 4, 8, 7 };
    enum { NT = (int)(sizeof order / sizeof order[0]) };
    float ref[NT][NO], got[NO];
    tgpt m = tgpt_make();
    for (int e = 0; e < NT; e++) tgpt_step(&m, order[e], false, ref[e]);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    int64_t c0 = -1, r0 = ctpu_metric_counter("recompiles");
    for (int e = 0; e < NT; e++) {
        tgpt_step(&m, order[e], true, got);
        if (getenv("CTPU_TEST_DYN_DEBUG"))
            fprintf(stderr, "T %lld: compiled %lld binds %lld\n", (long long)order[e],
                    (long long)ctpu_metric_counter("programs_compiled"), (long long)ctpu_metric_counter("dynamic_binds"));
        if (e == 0) c0 = ctpu_metric_counter("programs_compiled");
        ck_assert_msg(memcmp(got, ref[e], sizeof got) == 0, "T = %lld differs from strict eager", (long long)order[e]);
    }
    if (getenv("CTPU_TEST_DYN_DEBUG")) { char lg[8192]; ctpu_cache_recompile_log(lg, sizeof lg); fprintf(stderr, "%s\n", lg); }
    ck_assert_int_eq(ctpu_metric_counter("programs_compiled"), c0);
    ck_assert_int_eq(ctpu_metric_counter("recompiles"), r0);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    ctpu_tensor *ps = &m.te;
    for (int i = 0; i < 8; i++) ctpu_release(ps[i]);
}
END_TEST

/* A reshape whose target has a static extent equal to the symbol's value
 * (a new user's report): q = x W of x [2, T, 32] split to [2, -1, 4, 8],
 * and scores [2, 4, T, T] merged to [8, T, T] (or [-1, T, T]) and, in the
 * backward, split back. The probe moved every multiple of s first, so at T
 * = 8 (head_dim; and T = 2, 4 for the scores) the -1 stayed put and
 * head_dim was taken for the symbol: a program per coinciding extent with
 * the weight update in the step, and for [8, T, T] an error at the reshape
 * call (the backward's split at T = 4). The target dims that hold the
 * input's dims of the symbol move first: one dynamic program over every
 * extent, bit-identical to strict eager, in defer and fuse and in a
 * compiled step. */
typedef struct { int variant; ctpu_tensor w; } coin_model;

static ctpu_tensor coin_loss(int variant, ctpu_tensor x, ctpu_tensor w)
{
    int64_t T = ctpu_dim(x, variant == 0 ? 1 : 2);
    ctpu_tensor q = ctpu_matmul(x, w), r;
    if (variant == 0) {
        r = ctpu_reshape(q, 4, (int64_t[]){ 2, -1, 4, 8 });                 /* [2, T, 4, 8] */
    } else {
        ctpu_tensor sc = ctpu_matmul_t(q, x, false, true);                     /* [2, 4, T, T] */
        r = ctpu_reshape(sc, 3, variant == 1 ? (int64_t[]){ 8, T, T } : (int64_t[]){ -1, T, T });
    }
    return ctpu_sum(ctpu_mul(r, r), 0, NULL, false);
}

static ctpu_status coin_fn(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    coin_model *m = ctx;
    ctpu_tensor loss = coin_loss(m->variant, in[0], m->w);
    ctpu_status st = ctpu_backward(loss);
    if (st) return st;
    ctpu_no_grad_begin();
    st = ctpu_assign(m->w, ctpu_sub(m->w, ctpu_mul_scalar(ctpu_grad(m->w), sc[0])));
    ctpu_no_grad_end();
    if (st == CTPU_OK) st = ctpu_zero_grad(m->w);
    out[0] = loss;
    return st;
}

START_TEST(reshape_extent_equal_to_a_static_one_program)
{
    static const int64_t order[] = { 16, 16, 8, 12, 5, 8, 4, 2, 32, 3, 8 };
    enum { NT = (int)(sizeof order / sizeof order[0]) };
    static float xd[2 * 32 * 32];
    for (int i = 0; i < 2 * 32 * 32; i++) xd[i] = (float)(i % 13) * 0.1f - 0.6f;
    for (int variant = 0; variant < 3; variant++) {
        int64_t wd = variant == 0 ? 32 : 8;
        float w0[32 * 32], wgot[32 * 32], wref[NT][32 * 32], lref[NT];
        for (int i = 0; i < wd * wd; i++) w0[i] = (float)((i * 37) % 23 - 11) / 53.0f;
        for (int mode = 0; mode < 3; mode++) {   /* strict (the reference), defer and fuse, a compiled step */
            ck_assert_int_eq(ctpu_set_mode(mode == 1 ? CTPU_MODE_DEFER_FUSE : CTPU_MODE_STRICT), CTPU_OK);
            coin_model m = { variant, ctpu_keep(t_f32(w0, 2, (int64_t[]){ wd, wd })) };
            ck_assert_int_eq(ctpu_set_requires_grad(m.w, true), CTPU_OK);
            ctpu_compiled *c = mode == 2 ? ctpu_compile(coin_fn, &m, &(ctpu_compile_opts){ .name = "coin" }) : NULL;
            ck_assert(mode != 2 || c);
            int64_t c0 = -1, r0 = -1;
            for (int e = 0; e < NT; e++) {
                int64_t T = order[e];
                ctpu_scope_begin();
                ctpu_tensor x = variant == 0 ? t_f32(xd, 3, (int64_t[]){ 2, T, 32 }) : t_f32(xd, 4, (int64_t[]){ 2, 4, T, 8 });
                if (mode > 0) ck_assert_int_eq(ctpu_mark_dynamic(x, variant == 0 ? 1 : 2, 2, 32), CTPU_OK);
                ctpu_tensor loss = CTPU_NULL;
                double lr = 1e-3;
                if (mode == 2) {
                    ck_assert_msg(ctpu_compiled_call(c, 1, &x, 1, &lr, 1, &loss) == CTPU_OK, "variant %d T %lld: %s",
                                  variant, (long long)T, ctpu_last_error());
                } else {
                    ctpu_step_begin();
                    ck_assert_msg(coin_fn(&m, &x, &lr, &loss) == CTPU_OK, "variant %d T %lld: %s", variant,
                                  (long long)T, ctpu_last_error());
                    loss = ctpu_keep(loss);
                    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
                }
                float l;
                ck_assert_msg(ctpu_to_host(loss, &l, sizeof l) == CTPU_OK, "%s", ctpu_last_error());
                if (mode < 2) ctpu_release(loss);
                ck_assert_int_eq(ctpu_to_host(m.w, mode ? wgot : wref[e], sizeof(float) * (size_t)(wd * wd)), CTPU_OK);
                ctpu_scope_end();
                if (e == 0) {   /* (the first step's compile: a recompile of the other mode's program) */
                    c0 = ctpu_metric_counter("programs_compiled");
                    r0 = ctpu_metric_counter("recompiles");
                }
                if (mode == 0) { lref[e] = l; continue; }
                ck_assert_msg(memcmp(&l, &lref[e], sizeof l) == 0 && memcmp(wgot, wref[e], sizeof(float) * (size_t)(wd * wd)) == 0,
                              "variant %d mode %d T %lld differs from strict eager", variant, mode, (long long)T);
            }
            if (mode > 0) {
                char lg[2048];
                ctpu_cache_recompile_log(lg, sizeof lg);
                ck_assert_msg(ctpu_metric_counter("programs_compiled") == c0, "variant %d mode %d: %lld programs after the first step's %lld: %s",
                              variant, mode, (long long)ctpu_metric_counter("programs_compiled"), (long long)c0, lg);
                ck_assert_msg(ctpu_metric_counter("recompiles") == r0, "variant %d mode %d: %lld recompiles: %s", variant,
                              mode, (long long)(ctpu_metric_counter("recompiles") - r0), lg);
            }
            if (c) {
                ctpu_compiled_info ci;
                ck_assert_int_eq(ctpu_compiled_get_info(c, &ci), CTPU_OK);
                ck_assert_msg(ci.guard_failures == 0, "variant %d: %s", variant, ci.last_reason);
                ctpu_compiled_free(c);
            }
            ctpu_release(m.w);
        }
        ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("dynamic");
    TCase *tc = tcase_create("dynamic");
    tcase_add_checked_fixture(tc, t_setup, t_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, parity_and_one_program);
    tcase_add_test(tc, bound_launches_kept_and_replaced);
    tcase_add_test(tc, declared_inputs_mark_each_batch);
    tcase_add_test(tc, hostile_declare_dynamic_inputs);
    tcase_add_test(tc, without_marks_recompiles);
    tcase_add_test(tc, out_of_range_reason);
    tcase_add_test(tc, invalid_reshape_fails_at_the_call);
    tcase_add_test(tc, strict_ignores_marks);
    tcase_add_test(tc, hostile_mark_dynamic);
    tcase_add_test(tc, auto_dynamic_with_backward);
    tcase_add_test(tc, marked_batch_expand_backward_one_program);
    tcase_add_test(tc, seq_len_through_static_extents_one_program);
    tcase_add_test(tc, saved_marked_input_keeps_its_symbol);
    tcase_add_test(tc, reshape_extent_equal_to_a_static_one_program);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
