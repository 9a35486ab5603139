/* Type promotion with host scalars (new-user report, items 2 and 8): a
 * double scalar is torch's Python float (an i32 tensor with it gives f32),
 * the *_int forms are its Python int (i32 stays i32); creation of i32 from
 * a host value that does not fit is an error naming the op, argument and
 * value. Expected values and dtypes from torch 1.13 (Debian python3-torch):
 *   i = torch.tensor([0, 1, 2], dtype=torch.int32)
 *   i + 0.5 -> f32 [0.5, 1.5, 2.5]; i * 2.0 -> f32; 1.5 - i -> f32 [1.5, 0.5, -0.5]
 *   i + 3e9 -> f32 3e9; i + nan -> f32 nan; clamp(i, 1.5, 2.5) -> f32 [1.5, 1.5, 2]
 *   clamp_min(i, 0.5) -> f32 [0.5, 1, 2]; i + 1, i - 1, 1 - i, clamp(i, 1, 2) -> i32
 *   bf16 [1, 2] + 0.5 -> bf16 [1.5, 2.5]
 *   torch.full((2,), nan / 1e20 / inf / 2**31, dtype=torch.int32) -> RuntimeError
 *   "value cannot be converted to type int without overflow"; 0.5 -> 0; -2**31 fits.
 * Every case runs in strict, debug, defer and fuse and a compiled step (its
 * capture and its replay), all bit-identical with the same dtype. */
#include "t_core.h"

#define PM_MODES 5
static const char *const pm_mode_name[PM_MODES] = { "strict", "debug", "defer_fuse", "compiled", "replay" };

typedef ctpu_tensor (*pm_fn)(ctpu_tensor i, ctpu_tensor b, double s);

typedef struct {
    ctpu_status st;
    ctpu_dtype dt;
    int64_t n;
    float v[8];
    char err[256];
} pm_res;

static pm_fn pm_cur;

static ctpu_status pm_step(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    out[0] = pm_cur(in[0], in[1], sc[0]);
    return ctpu_is_null(out[0]) ? (ctpu_last_status() ? ctpu_last_status() : CTPU_ERR_NULL_HANDLE) : CTPU_OK;
}

static void pm_inputs(ctpu_tensor *t)
{
    t[0] = t_i32((const int32_t[]){ 0, 1, 2 }, 1, (const int64_t[]){ 3 });
    t[1] = ctpu_cast(t_f32((const float[]){ 1, 2, -2.25f }, 1, (const int64_t[]){ 3 }), CTPU_BF16);
    ck_assert(!ctpu_is_null(t[0]) && !ctpu_is_null(t[1]));
}

static void pm_read(ctpu_tensor y, ctpu_status st, pm_res *r)
{
    r->st = st;
    if (st == CTPU_OK && ctpu_is_null(y)) r->st = ctpu_last_status() ? ctpu_last_status() : CTPU_ERR_NULL_HANDLE;
    if (r->st == CTPU_OK) {
        r->dt = ctpu_dtype_of(y);
        r->n = ctpu_numel(y);
        ck_assert(r->n >= 0 && r->n <= 8);
        r->st = ctpu_to_host_as_f32(y, r->v, sizeof r->v);
    }
    if (r->st != CTPU_OK) snprintf(r->err, sizeof r->err, "%s", ctpu_last_error());
}

/* f in mode m; the compiled modes pass s as the step's runtime scalar (the
 * replay with s2: the dtype must not depend on the value). */
static void pm_run(int m, pm_fn f, double s, double s2, pm_res *r)
{
    memset(r, 0, sizeof *r);
    ctpu_clear_error();
    ck_assert_int_eq(ctpu_set_mode(m <= 2 ? (ctpu_mode)m : CTPU_MODE_STRICT), CTPU_OK);
    ctpu_scope_begin();
    ctpu_tensor in[2];
    pm_inputs(in);
    pm_cur = f;
    if (m <= 2) {
        pm_read(f(in[0], in[1], s), CTPU_OK, r);
    } else {
        ctpu_compiled *c = ctpu_compile(pm_step, NULL, NULL);
        ck_assert_ptr_nonnull(c);
        ctpu_tensor out = CTPU_NULL;
        ctpu_status st = ctpu_compiled_call(c, 2, in, 1, &s, 1, &out);
        /* the replay: a new value of a scalar argument first captures once more to confirm it is the
         * argument (README "Compiled steps"); the third call replays */
        for (int call = 0; m == 4 && call < 2 && st == CTPU_OK; call++) {
            (void)ctpu_sync();
            pm_inputs(in);
            out = CTPU_NULL;
            double sv = call ? s2 : s2 + 1;
            st = ctpu_compiled_call(c, 2, in, 1, &sv, 1, &out);
        }
        if (m == 4 && st == CTPU_OK) {
            ctpu_compiled_info info;
            ctpu_compiled_get_info(c, &info);
            ck_assert_msg(info.replays >= 1, "replay: calls %llu captures %llu replays %llu: %s",
                          (unsigned long long)info.calls, (unsigned long long)info.captures,
                          (unsigned long long)info.replays, info.last_reason);
        }
        pm_read(out, st, r);
        ctpu_compiled_free(c);
    }
    ctpu_scope_end();
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    (void)ctpu_sync();
    ctpu_clear_error();
}

/* strict's result is want (dtype dt, n values; NaN as a class); every other
 * mode equals it bit for bit. The replay runs with s2 and is compared with
 * strict at s2. */
static void pm_expect(const char *name, pm_fn f, double s, double s2, ctpu_dtype dt, int n, const double *want)
{
    pm_res r[PM_MODES], ref2;
    for (int m = 0; m < PM_MODES; m++) {
        pm_run(m, f, s, s2, &r[m]);
        ck_assert_msg(r[m].st == CTPU_OK, "%s [%s]: status %d: %s", name, pm_mode_name[m], r[m].st, r[m].err);
        ck_assert_msg(r[m].dt == dt, "%s [%s]: dtype %s, torch gives %s", name, pm_mode_name[m],
                      ctpu_dtype_name(r[m].dt), ctpu_dtype_name(dt));
        ck_assert_int_eq(r[m].n, n);
    }
    for (int k = 0; k < n; k++)
        ck_assert_msg(t_same(r[0].v[k], (float)want[k]) || (isnan(want[k]) && isnan(r[0].v[k])),
                      "%s: element %d is %.9g, torch gives %.9g", name, k, r[0].v[k], want[k]);
    pm_run(0, f, s2, s2, &ref2);
    for (int m = 1; m < PM_MODES; m++) {
        const pm_res *ref = m == 4 ? &ref2 : &r[0];
        for (int k = 0; k < n; k++)
            ck_assert_msg(t_same(r[m].v[k], ref->v[k]), "%s [%s]: element %d is %.9g, strict gives %.9g", name,
                          pm_mode_name[m], k, r[m].v[k], ref->v[k]);
    }
}

static ctpu_tensor f_add(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; return ctpu_add_scalar(i, s); }
static ctpu_tensor f_sub(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; return ctpu_sub_scalar(i, s); }
static ctpu_tensor f_rsub(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; return ctpu_rsub_scalar(i, s); }
static ctpu_tensor f_mul(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; return ctpu_mul_scalar(i, s); }
static ctpu_tensor f_max(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; return ctpu_maximum_scalar(i, s); }
static ctpu_tensor f_min(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; return ctpu_minimum_scalar(i, s); }
static ctpu_tensor f_clamp(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; return ctpu_clamp(i, s, 2.5); }
static ctpu_tensor f_div(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; return ctpu_div_scalar(i, s); }
static ctpu_tensor f_gt(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; return ctpu_gt_scalar(i, s); }
static ctpu_tensor f_bf_add(ctpu_tensor i, ctpu_tensor b, double s) { (void)i; return ctpu_add_scalar(b, s); }
/* a chain: the promoted value feeds further ops (fused together in defer and fuse) */
static ctpu_tensor f_chain(ctpu_tensor i, ctpu_tensor b, double s)
{
    (void)b;
    return ctpu_mul_scalar(ctpu_add_scalar(ctpu_mul_scalar_int(i, 3), s), 0.5);
}
static ctpu_tensor f_add_int(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; (void)s; return ctpu_add_scalar_int(i, 1); }
static ctpu_tensor f_sub_int(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; (void)s; return ctpu_sub_scalar_int(i, 1); }
static ctpu_tensor f_rsub_int(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; (void)s; return ctpu_rsub_scalar_int(i, 1); }
static ctpu_tensor f_mul_int(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; (void)s; return ctpu_mul_scalar_int(i, -3); }
static ctpu_tensor f_max_int(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; (void)s; return ctpu_maximum_scalar_int(i, 1); }
static ctpu_tensor f_min_int(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; (void)s; return ctpu_minimum_scalar_int(i, 1); }
static ctpu_tensor f_clamp_int(ctpu_tensor i, ctpu_tensor b, double s) { (void)b; (void)s; return ctpu_clamp_int(i, 1, 2); }
static ctpu_tensor f_bf_add_int(ctpu_tensor i, ctpu_tensor b, double s) { (void)i; (void)s; return ctpu_add_scalar_int(b, 1); }

START_TEST(float_scalar_with_i32_gives_f32)
{
    pm_expect("i + 0.5", f_add, 0.5, 1.25, CTPU_F32, 3, (const double[]){ 0.5, 1.5, 2.5 });
    pm_expect("i - 0.5", f_sub, 0.5, 1.25, CTPU_F32, 3, (const double[]){ -0.5, 0.5, 1.5 });
    pm_expect("1.5 - i", f_rsub, 1.5, 0.25, CTPU_F32, 3, (const double[]){ 1.5, 0.5, -0.5 });
    pm_expect("i * 2.5", f_mul, 2.5, -1.5, CTPU_F32, 3, (const double[]){ 0, 2.5, 5 });
    /* an integral value in a double is still a float scalar (torch: i * 2.0 is f32) */
    pm_expect("i * 2.0", f_mul, 2.0, 0.5, CTPU_F32, 3, (const double[]){ 0, 2, 4 });
    pm_expect("i + 3e9", f_add, 3e9, 0.5, CTPU_F32, 3, (const double[]){ 3e9, 3e9, 3e9 });
    pm_expect("maximum(i, 0.5)", f_max, 0.5, 1.5, CTPU_F32, 3, (const double[]){ 0.5, 1, 2 });
    pm_expect("minimum(i, 0.5)", f_min, 0.5, 1.5, CTPU_F32, 3, (const double[]){ 0, 0.5, 0.5 });
    pm_expect("clamp(i, 1.5, 2.5)", f_clamp, 1.5, 0.5, CTPU_F32, 3, (const double[]){ 1.5, 1.5, 2 });
    pm_expect("i / 2", f_div, 2, 4, CTPU_F32, 3, (const double[]){ 0, 0.5, 1 });
    pm_expect("i > 0.5", f_gt, 0.5, 1.5, CTPU_F32, 3, (const double[]){ 0, 1, 1 });
    pm_expect("(3 i + 0.25) * 0.5", f_chain, 0.25, 1.0, CTPU_F32, 3, (const double[]){ 0.125, 1.625, 3.125 });
    pm_expect("bf16 + 0.5", f_bf_add, 0.5, 0.25, CTPU_BF16, 3, (const double[]){ 1.5, 2.5, -1.75 });
    ck_assert_int_eq(ctpu_set_debug_checks(false), CTPU_OK);
    pm_expect("i + nan", f_add, NAN, 0.5, CTPU_F32, 3, (const double[]){ NAN, NAN, NAN });
}
END_TEST

START_TEST(int_scalar_keeps_i32)
{
    pm_expect("i + 1", f_add_int, 0, 0, CTPU_I32, 3, (const double[]){ 1, 2, 3 });
    pm_expect("i - 1", f_sub_int, 0, 0, CTPU_I32, 3, (const double[]){ -1, 0, 1 });
    pm_expect("1 - i", f_rsub_int, 0, 0, CTPU_I32, 3, (const double[]){ 1, 0, -1 });
    pm_expect("i * -3", f_mul_int, 0, 0, CTPU_I32, 3, (const double[]){ 0, -3, -6 });
    pm_expect("maximum(i, 1)", f_max_int, 0, 0, CTPU_I32, 3, (const double[]){ 1, 1, 2 });
    pm_expect("minimum(i, 1)", f_min_int, 0, 0, CTPU_I32, 3, (const double[]){ 0, 1, 1 });
    pm_expect("clamp(i, 1, 2)", f_clamp_int, 0, 0, CTPU_I32, 3, (const double[]){ 1, 1, 2 });
    pm_expect("bf16 + 1", f_bf_add_int, 0, 0, CTPU_BF16, 3, (const double[]){ 2, 3, -1.25 });
}
END_TEST

/* The promoted value in a differentiated expression: d/dx sum(x * (i + 0.5)) = i + 0.5. */
START_TEST(promoted_value_in_backward)
{
    for (int m = 0; m <= 2; m++) {
        ck_assert_int_eq(ctpu_set_mode((ctpu_mode)m), CTPU_OK);
        ctpu_scope_begin();
        ctpu_tensor x = T_VEC(1, 2, 3);
        ck_assert_int_eq(ctpu_set_requires_grad(x, true), CTPU_OK);
        ctpu_tensor i = t_i32((const int32_t[]){ 0, 1, 2 }, 1, (const int64_t[]){ 3 });
        ctpu_tensor y = ctpu_sum(ctpu_mul(x, ctpu_add_scalar(i, 0.5)), 0, NULL, false);
        ck_assert_msg(!ctpu_is_null(y), "%s", ctpu_last_error());
        ck_assert_int_eq(ctpu_backward(y), CTPU_OK);
        int64_t n;
        float *g = t_read(ctpu_grad(x), &n);
        ck_assert_int_eq(n, 3);
        ck_assert(g[0] == 0.5f && g[1] == 1.5f && g[2] == 2.5f);
        free(g);
        ctpu_scope_end();
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
}
END_TEST

static void pm_refused(ctpu_tensor t, const char *what)
{
    ck_assert_msg(ctpu_is_null(t), "%s: accepted", what);
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    ck_assert_msg(t_contains(ctpu_last_error(), what), "message '%s' lacks '%s'", ctpu_last_error(), what);
    ctpu_clear_error();
}

START_TEST(i32_creation_refuses_values_that_do_not_fit)
{
    int64_t s[1] = { 2 };
    for (int m = 0; m <= 2; m++) {
        ck_assert_int_eq(ctpu_set_mode((ctpu_mode)m), CTPU_OK);
        ctpu_scope_begin();
        pm_refused(ctpu_full(CTPU_I32, 1, s, NAN), "full: value=nan cannot be converted to i32");
        pm_refused(ctpu_full(CTPU_I32, 1, s, 1e20), "full: value=1e+20 cannot be converted to i32");
        pm_refused(ctpu_full(CTPU_I32, 1, s, INFINITY), "full: value=inf");
        pm_refused(ctpu_full(CTPU_I32, 1, s, 2147483648.0), "full: value=2.14748e+09");
        ctpu_tensor i = t_i32((const int32_t[]){ 0, 1 }, 1, s);
        pm_refused(ctpu_full_like(i, NAN), "full_like: value=nan");
        pm_refused(ctpu_arange(0, 4e9, 1e9, CTPU_I32), "arange: last value=3e+09");
        pm_refused(ctpu_arange(-3e9, 0, 1e9, CTPU_I32), "arange: start=-3e+09");
        /* what fits: truncated toward zero as torch, -2^31 included; f32 unchanged */
        int64_t n;
        int32_t *v = t_read_raw(ctpu_full(CTPU_I32, 1, s, 0.5), &n);
        ck_assert(n == 2 && v[0] == 0 && v[1] == 0);
        free(v);
        v = t_read_raw(ctpu_full(CTPU_I32, 1, s, -2147483648.0), &n);
        ck_assert(n == 2 && v[0] == INT32_MIN);
        free(v);
        v = t_read_raw(ctpu_arange(2147483645.0, 2147483648.0, 1, CTPU_I32), &n);
        ck_assert(n == 3 && v[2] == INT32_MAX);
        free(v);
        float *f = t_read(ctpu_full(CTPU_F32, 1, s, 1e20), &n);
        ck_assert(n == 2 && f[0] == 1e20f);
        free(f);
        ctpu_scope_end();
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("promote");
    TCase *tc = tcase_create("promote");
    tcase_add_checked_fixture(tc, t_setup, t_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, float_scalar_with_i32_gives_f32);
    tcase_add_test(tc, int_scalar_keeps_i32);
    tcase_add_test(tc, promoted_value_in_backward);
    tcase_add_test(tc, i32_creation_refuses_values_that_do_not_fit);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
