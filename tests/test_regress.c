/* Regression classes from other systems' bug reports (PyTorch eager,
 * PyTorch/XLA, torch.compile, JAX, tinygrad): each case states PyTorch's
 * reference behaviour (values from torch 1.13, Debian's python3-torch, unless
 * a comment says otherwise), cites a report of the class, and runs in every
 * mode: strict eager, debug eager, defer and fuse, and a compiled step (its
 * capture and a replay with fresh inputs), all bit-identical to strict
 * (NaN compared as a class) and strict against the reference.
 * Where ctpu deliberately differs from torch, the case checks ctpu's
 * documented rule and names the doc that says so. */
#include "t_core.h"
#include "ctpu_nn.h"

/* ------------------------------------------------------------ harness */
#define RG_MODES 5
static const char *const rg_mode_name[RG_MODES] = { "strict", "debug", "defer_fuse", "compiled", "replay" };
#define RG_MAX_IN 4
#define RG_MAX_OUT 4096

typedef ctpu_tensor (*rg_fn)(const ctpu_tensor *in);
typedef struct {
    ctpu_dtype dt;
    int nd;
    int64_t s[4];
    const void *d;
} rg_in;
typedef struct {
    ctpu_status st;
    int nd;
    int64_t s[CTPU_MAX_DIMS], n;
    float v[RG_MAX_OUT];
    char err[512];
} rg_res;

static ctpu_status rg_step(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    rg_fn f = *(rg_fn *)ctx;
    out[0] = f(in);
    return ctpu_is_null(out[0]) ? (ctpu_last_status() ? ctpu_last_status() : CTPU_ERR_NULL_HANDLE) : CTPU_OK;
}

static void rg_make(int nin, const rg_in *ins, ctpu_tensor *t)
{
    for (int i = 0; i < nin; i++) {
        t[i] = ctpu_from_host(ins[i].d, ins[i].dt, ins[i].nd, ins[i].s);
        ck_assert_msg(!ctpu_is_null(t[i]), "from_host: %s", ctpu_last_error());
    }
}

static void rg_read(ctpu_tensor y, ctpu_status st, rg_res *r)
{
    r->st = st;
    if (st == CTPU_OK && ctpu_is_null(y)) r->st = ctpu_last_status() ? ctpu_last_status() : CTPU_ERR_NULL_HANDLE;
    if (r->st == CTPU_OK) {
        r->n = ctpu_numel(y);
        ck_assert(r->n >= 0 && r->n <= RG_MAX_OUT);
        ctpu_shape(y, r->s, &r->nd);
        r->st = ctpu_to_host_as_f32(y, r->v, sizeof r->v);
    }
    if (r->st != CTPU_OK) snprintf(r->err, sizeof r->err, "%s", ctpu_last_error());
    (void)ctpu_sync();
}

/* Run f once in mode m (0..4) on fresh tensors made from ins. */
static void rg_run(int m, rg_fn f, int nin, const rg_in *ins, rg_res *r)
{
    memset(r, 0, sizeof *r);
    ctpu_clear_error();
    ck_assert_int_eq(ctpu_set_mode(m <= 2 ? (ctpu_mode)m : CTPU_MODE_STRICT), CTPU_OK);
    ctpu_scope_begin();
    ctpu_tensor in[RG_MAX_IN];
    if (m <= 2) {
        rg_make(nin, ins, in);
        rg_read(f(in), CTPU_OK, r);
    } else {
        ctpu_compiled *c = ctpu_compile(rg_step, &f, NULL);
        ck_assert_ptr_nonnull(c);
        ctpu_tensor out = CTPU_NULL;
        rg_make(nin, ins, in);
        ctpu_status st = ctpu_compiled_call(c, nin, in, 0, NULL, 1, &out);
        if (m == 4 && st == CTPU_OK) {
            (void)ctpu_sync();
            rg_make(nin, ins, in);
            out = CTPU_NULL;
            st = ctpu_compiled_call(c, nin, in, 0, NULL, 1, &out);
            ctpu_compiled_info info;
            ctpu_compiled_get_info(c, &info);
            if (st == CTPU_OK && info.graph_breaks == 0)
                ck_assert_msg(info.replays == 1, "replay: the second call did not replay (%s)", info.last_reason);
        }
        rg_read(out, st, r);
        ctpu_compiled_free(c);
    }
    ctpu_scope_end();
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    (void)ctpu_sync();
    ctpu_clear_error();
}

/* Equal as values: same bits, or both NaN. */
static bool rg_eq(float a, float b) { return t_same(a, b); }

/* expected within tol ulps (0: exact bits but ±0 equal; NaN as a class; inf exact) */
static bool rg_close(float got, double want, double tol)
{
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == (float)want;
    if (isnan(got) || isinf(got)) return false;
    if (tol == 0) return got == (float)want;
    return t_ulps(got, (float)want) <= tol || fabs(got - want) <= tol * t_ulp_of(want);
}

/* Run f in every mode; every mode equals strict bit for bit, and strict's
 * n values equal want within tol ulps. */
static void rg_expect(const char *name, rg_fn f, int nin, const rg_in *ins, int64_t n, const double *want, double tol)
{
    static rg_res r[RG_MODES];
    for (int m = 0; m < RG_MODES; m++) {
        rg_run(m, f, nin, ins, &r[m]);
        ck_assert_msg(r[m].st == CTPU_OK, "%s [%s]: status %d: %s", name, rg_mode_name[m], r[m].st, r[m].err);
        ck_assert_msg(r[m].n == n, "%s [%s]: %lld elements, want %lld", name, rg_mode_name[m], (long long)r[m].n,
                      (long long)n);
    }
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(rg_close(r[0].v[i], want[i], tol), "%s [strict]: element %lld is %.9g, torch gives %.9g", name,
                      (long long)i, r[0].v[i], want[i]);
    for (int m = 1; m < RG_MODES; m++) {
        ck_assert_int_eq(r[m].nd, r[0].nd);
        for (int d = 0; d < r[0].nd; d++) ck_assert_int_eq(r[m].s[d], r[0].s[d]);
        for (int64_t i = 0; i < n; i++)
            ck_assert_msg(rg_eq(r[m].v[i], r[0].v[i]), "%s [%s]: element %lld is %.9g, strict gives %.9g", name,
                          rg_mode_name[m], (long long)i, r[m].v[i], r[0].v[i]);
    }
}

/* Every mode fails with status st and a message containing what. */
static void rg_expect_error(const char *name, rg_fn f, int nin, const rg_in *ins, ctpu_status st, const char *what)
{
    static rg_res r;
    for (int m = 0; m < RG_MODES; m++) {
        rg_run(m, f, nin, ins, &r);
        ck_assert_msg(r.st == st, "%s [%s]: status %d (%s), want %d", name, rg_mode_name[m], r.st, r.err, st);
        ck_assert_msg(!what || t_contains(r.err, what), "%s [%s]: message '%s' lacks '%s'", name, rg_mode_name[m],
                      r.err, what);
    }
}

/* The expected shape of the strict result. */
static void rg_expect_shape(rg_fn f, int nin, const rg_in *ins, int nd, const int64_t *s)
{
    static rg_res r;
    rg_run(0, f, nin, ins, &r);
    ck_assert_msg(r.st == CTPU_OK, "%s", r.err);
    ck_assert_int_eq(r.nd, nd);
    for (int d = 0; d < nd; d++) ck_assert_int_eq(r.s[d], s[d]);
}

/* Debug checks forced off for a case whose reference makes a NaN from
 * finite inputs by an op the debug check would name (torch gives NaN too). */
static void rg_no_debug_checks(void) { ck_assert_int_eq(ctpu_set_debug_checks(false), CTPU_OK); }

#define NEG_INF (-INFINITY)
#define RG_IN(dt_, nd_, data_, ...) ((rg_in){ (dt_), (nd_), { __VA_ARGS__ }, (data_) })
#define RG_N(a) ((int64_t)(sizeof(a) / sizeof((a)[0])))

/* ================================================= 1. softmax family at -inf / huge
 * torch: softmax / log_softmax of an all -inf row is NaN (exp(-inf - -inf));
 * logsumexp of it is -inf; a row of +-1e38 stays finite (max-subtracted);
 * a +inf entry gives NaN for the whole row.
 * pytorch/pytorch#31829 (softmax of all -inf rows gives nan),
 * jax-ml/jax#1052-style logsumexp at -inf (handled: max set to 0 where infinite). */
static const float sm_x[12] = { NEG_INF, NEG_INF, NEG_INF, 1, 2, 3, 1e38f, 1e38f, -1e38f, INFINITY, 1, 2 };
static ctpu_tensor f_softmax(const ctpu_tensor *in) { return ctpu_softmax(in[0], 1); }
static ctpu_tensor f_log_softmax(const ctpu_tensor *in) { return ctpu_log_softmax(in[0], 1); }
static ctpu_tensor f_logsumexp(const ctpu_tensor *in)
{
    int d = 1;
    return ctpu_logsumexp(in[0], 1, &d, false);
}
START_TEST(softmax_family_at_inf_and_huge)
{
    rg_in in = RG_IN(CTPU_F32, 2, sm_x, 4, 3);
    const double sm[12] = { NAN, NAN, NAN, 0.09003057330846786, 0.2447284758090973, 0.6652409434318542,
                            0.5, 0.5, 0, NAN, NAN, NAN };
    const double lsm[12] = { NAN, NAN, NAN, -2.4076058864593506, -1.4076058864593506, -0.40760594606399536,
                             -0.6931471824645996, -0.6931471824645996, -1.9999999360571385e+38, NAN, NAN, NAN };
    const double lse[4] = { NEG_INF, 3.4076058864593506, 9.999999680285692e+37, INFINITY };
    rg_expect("softmax", f_softmax, 1, &in, 12, sm, 1);
    rg_expect("log_softmax", f_log_softmax, 1, &in, 12, lsm, 4);
    rg_expect("logsumexp", f_logsumexp, 1, &in, 4, lse, 2);
}
END_TEST


/* ================================================= 2. cross entropy / nll edge rows
 * torch: the mean over no non-ignored row is NaN (0/0; pytorch/pytorch#70348,
 * #116349: intended since #64572), the sum 0; label smoothing skips ignored
 * rows and the mean divides by the non-ignored count
 * (pytorch/pytorch#63004-class ignore_index mistakes); a -inf logit of another
 * class is fine without smoothing (0) and gives +inf with smoothing (the
 * smoothing term takes the mean of -log_softmax over every class). */
static const float ce_lg[6] = { 1, 2, 3, 1, 0, -1 };
static const int32_t ce_all_ign[2] = { -100, -100 }, ce_one_ign[2] = { 2, -100 };
static ctpu_tensor ce_with(const ctpu_tensor *in, ctpu_reduction red, double ls)
{
    ctpu_ce_opts o = ctpu_ce_defaults();
    o.reduction = red;
    o.label_smoothing = ls;
    return ctpu_cross_entropy(in[0], in[1], &o);
}
static ctpu_tensor f_ce_mean(const ctpu_tensor *in) { return ce_with(in, CTPU_REDUCE_MEAN, 0); }
static ctpu_tensor f_ce_sum(const ctpu_tensor *in) { return ce_with(in, CTPU_REDUCE_SUM, 0); }
static ctpu_tensor f_ce_ls_mean(const ctpu_tensor *in) { return ce_with(in, CTPU_REDUCE_MEAN, 0.1); }
static ctpu_tensor f_ce_ls_sum(const ctpu_tensor *in) { return ce_with(in, CTPU_REDUCE_SUM, 0.1); }
static ctpu_tensor f_ce_ls_none(const ctpu_tensor *in) { return ce_with(in, CTPU_REDUCE_NONE, 0.1); }
static ctpu_tensor f_ce_ls_full(const ctpu_tensor *in) { return ce_with(in, CTPU_REDUCE_MEAN, 1.0); }
static ctpu_tensor f_nll_mean(const ctpu_tensor *in) { return ctpu_nll_loss(in[0], in[1], NULL); }
START_TEST(cross_entropy_ignore_and_smoothing)
{
    rg_in all[2] = { RG_IN(CTPU_F32, 2, ce_lg, 2, 3), RG_IN(CTPU_I32, 1, ce_all_ign, 2) };
    rg_in one[2] = { RG_IN(CTPU_F32, 2, ce_lg, 2, 3), RG_IN(CTPU_I32, 1, ce_one_ign, 2) };
    const double nan1[1] = { NAN }, zero1[1] = { 0 }, ls1[1] = { 0.5076059103012085 };
    const double lsn[2] = { 0.5076059103012085, 0 }, full[1] = { 1.4076058864593506 };
    rg_no_debug_checks(); /* 0/0 of the mean is torch's NaN: debug checks name it (ctpu_nn.h) */
    rg_expect("ce mean, all ignored", f_ce_mean, 2, all, 1, nan1, 0);
    rg_expect("ce sum, all ignored", f_ce_sum, 2, all, 1, zero1, 0);
    rg_expect("nll mean, all ignored", f_nll_mean, 2, all, 1, nan1, 0);
    rg_expect("ce ls mean, all ignored", f_ce_ls_mean, 2, all, 1, nan1, 0);
    rg_expect("ce ls mean, one ignored", f_ce_ls_mean, 2, one, 1, ls1, 4);
    rg_expect("ce ls sum, one ignored", f_ce_ls_sum, 2, one, 1, ls1, 4);
    rg_expect("ce ls none, one ignored", f_ce_ls_none, 2, one, 2, lsn, 4);
    const int32_t lab[2] = { 2, 0 };
    rg_in two[2] = { RG_IN(CTPU_F32, 2, ce_lg, 2, 3), RG_IN(CTPU_I32, 1, lab, 2) };
    rg_expect("ce label_smoothing 1.0", f_ce_ls_full, 2, two, 1, full, 4);
    const float ninf[2] = { 0, NEG_INF };
    const int32_t l0[1] = { 0 };
    rg_in ni[2] = { RG_IN(CTPU_F32, 2, ninf, 1, 2), RG_IN(CTPU_I32, 1, l0, 1) };
    const double inf1[1] = { INFINITY };
    rg_expect("ce, -inf logit of another class", f_ce_mean, 2, ni, 1, zero1, 0);
    rg_expect("ce ls, -inf logit of another class", f_ce_ls_mean, 2, ni, 1, inf1, 0);
}
END_TEST

/* An out-of-range label (not ignore_index) is an error, never a silent read
 * (pytorch/pytorch#15508, #12670: torch raises "Target -4 is out of bounds"). */
START_TEST(cross_entropy_label_out_of_range)
{
    const int32_t bad[2] = { 1, 3 }, neg[2] = { -4, 0 };
    rg_in b[2] = { RG_IN(CTPU_F32, 2, ce_lg, 2, 3), RG_IN(CTPU_I32, 1, bad, 2) };
    rg_in n[2] = { RG_IN(CTPU_F32, 2, ce_lg, 2, 3), RG_IN(CTPU_I32, 1, neg, 2) };
    rg_expect_error("ce label 3 of 3 classes", f_ce_mean, 2, b, CTPU_ERR_DEVICE_FAULT, "cross_entropy");
    rg_expect_error("ce label -4", f_ce_mean, 2, n, CTPU_ERR_DEVICE_FAULT, "cross_entropy");
    rg_expect_error("ce ls label 3", f_ce_ls_mean, 2, b, CTPU_ERR_DEVICE_FAULT, "cross_entropy");
    rg_expect_error("nll label 3", f_nll_mean, 2, b, CTPU_ERR_DEVICE_FAULT, "nll_loss");
}
END_TEST

/* ================================================= 3. var with correction, N <= correction
 * torch: divisor max(0, N - correction): var([3]) (unbiased) is NaN (0/0),
 * var([1, 2], correction 2 or 3) is inf, of a constant pair NaN; correction 0
 * of one element 0; over an empty dim NaN (pytorch/pytorch#29372-class, and
 * pandas-dev/pandas#6136: inf vs nan for ddof >= N). */
static int rg_corr;
static ctpu_tensor f_var(const ctpu_tensor *in)
{
    int d = 0;
    return ctpu_var(in[0], 1, &d, rg_corr, false);
}
START_TEST(var_correction_at_small_n)
{
    const float one[1] = { 3 }, two[2] = { 1, 2 }, cst[2] = { 1, 1 };
    rg_in i1 = RG_IN(CTPU_F32, 1, one, 1), i2 = RG_IN(CTPU_F32, 1, two, 2), ic = RG_IN(CTPU_F32, 1, cst, 2);
    rg_in ie = RG_IN(CTPU_F32, 1, one, 0);
    const double nan1[1] = { NAN }, zero1[1] = { 0 }, inf1[1] = { INFINITY }, half[1] = { 0.5 }, quarter[1] = { 0.25 };
    rg_corr = 1;
    rg_expect("var([3]) unbiased", f_var, 1, &i1, 1, nan1, 0);
    rg_expect("var([1,2]) unbiased", f_var, 1, &i2, 1, half, 0);
    rg_expect("var(empty) unbiased", f_var, 1, &ie, 1, nan1, 0);
    rg_corr = 0;
    rg_expect("var([3]) biased", f_var, 1, &i1, 1, zero1, 0);
    rg_expect("var([1,2]) biased", f_var, 1, &i2, 1, quarter, 0);
    rg_expect("var(empty) biased", f_var, 1, &ie, 1, nan1, 0);
    rg_corr = 2;
    rg_expect("var([1,2]) correction 2", f_var, 1, &i2, 1, inf1, 0);
    rg_corr = 3;
    rg_expect("var([1,2]) correction 3", f_var, 1, &i2, 1, inf1, 0);
    rg_expect("var([1,1]) correction 3", f_var, 1, &ic, 1, nan1, 0);
}
END_TEST

/* ================================================= 4. reductions over empty dims
 * torch: sum 0, mean NaN, prod 1, logsumexp -inf; max / min / argmax / argmin
 * over an extent-0 dim raise ("Expected reduction dim 1 to have non-zero
 * size"); a reduction over a non-empty dim of a tensor with another empty dim
 * is an empty result (apache/tvm#19578, pytorch/pytorch#31421: uninitialised
 * results for empty reductions). */
static ctpu_tensor f_sum1(const ctpu_tensor *in) { int d = 1; return ctpu_sum(in[0], 1, &d, false); }
static ctpu_tensor f_mean1(const ctpu_tensor *in) { int d = 1; return ctpu_mean(in[0], 1, &d, false); }
static ctpu_tensor f_prod1(const ctpu_tensor *in) { int d = 1; return ctpu_prod(in[0], 1, &d, false); }
static ctpu_tensor f_max1(const ctpu_tensor *in) { int d = 1; return ctpu_max(in[0], 1, &d, false); }
static ctpu_tensor f_min1(const ctpu_tensor *in) { int d = 1; return ctpu_min(in[0], 1, &d, false); }
static ctpu_tensor f_max0(const ctpu_tensor *in) { int d = 0; return ctpu_max(in[0], 1, &d, false); }
static ctpu_tensor f_argmax1(const ctpu_tensor *in) { return ctpu_argmax(in[0], 1, false); }
static ctpu_tensor f_argmin1(const ctpu_tensor *in) { return ctpu_argmin(in[0], 1, false); }
static ctpu_tensor f_sum_all(const ctpu_tensor *in) { return ctpu_sum(in[0], 0, NULL, false); }
static ctpu_tensor f_mean_all(const ctpu_tensor *in) { return ctpu_mean(in[0], 0, NULL, false); }
static ctpu_tensor f_max_all(const ctpu_tensor *in) { return ctpu_max(in[0], 0, NULL, false); }
static ctpu_tensor f_sum0(const ctpu_tensor *in) { int d = 0; return ctpu_sum(in[0], 1, &d, false); }
static ctpu_tensor f_cumsum1(const ctpu_tensor *in) { return ctpu_cumsum(in[0], 1); }
static ctpu_tensor f_softmax0(const ctpu_tensor *in) { return ctpu_softmax(in[0], 1); }
START_TEST(reductions_over_empty_dims)
{
    const float dummy[1] = { 0 };
    rg_in e = RG_IN(CTPU_F32, 2, dummy, 2, 0);
    const double z2[2] = { 0, 0 }, n2[2] = { NAN, NAN }, o2[2] = { 1, 1 }, ni2[2] = { NEG_INF, NEG_INF };
    rg_no_debug_checks();
    rg_expect("sum over empty dim", f_sum1, 1, &e, 2, z2, 0);
    rg_expect("mean over empty dim", f_mean1, 1, &e, 2, n2, 0);
    rg_expect("prod over empty dim", f_prod1, 1, &e, 2, o2, 0);
    rg_expect("logsumexp over empty dim", f_logsumexp, 1, &e, 2, ni2, 0);
    rg_expect_error("max over empty dim", f_max1, 1, &e, CTPU_ERR_SHAPE, "max");
    rg_expect_error("min over empty dim", f_min1, 1, &e, CTPU_ERR_SHAPE, "min");
    rg_expect_error("argmax over empty dim", f_argmax1, 1, &e, CTPU_ERR_SHAPE, "argmax");
    rg_expect_error("argmin over empty dim", f_argmin1, 1, &e, CTPU_ERR_SHAPE, "argmin");
    rg_expect_error("max of an empty tensor", f_max_all, 1, &e, CTPU_ERR_SHAPE, "max");
    rg_in e0 = RG_IN(CTPU_F32, 1, dummy, 0);
    const double z1[1] = { 0 }, n1[1] = { NAN };
    rg_expect("sum of empty", f_sum_all, 1, &e0, 1, z1, 0);
    rg_expect("mean of empty", f_mean_all, 1, &e0, 1, n1, 0);
    /* [2, 0] over the non-empty dim 0: an empty [0] result; max too */
    rg_expect("sum over dim 0 of [2, 0]", f_sum0, 1, &e, 0, NULL, 0);
    rg_expect("max over dim 0 of [2, 0]", f_max0, 1, &e, 0, NULL, 0);
    rg_expect("cumsum of [2, 0]", f_cumsum1, 1, &e, 0, NULL, 0);
    rg_expect("softmax of [2, 0]", f_softmax0, 1, &e, 0, NULL, 0);
    const int64_t s1[1] = { 0 };
    rg_expect_shape(f_sum0, 1, &e, 1, s1);
}
END_TEST

/* ================================================= 5. argmax / argmin ties and NaN
 * torch: the first index of the extreme; a NaN is the extreme (the first
 * NaN); a row of -inf gives 0 (pytorch/pytorch#35263-class "argmax returns
 * last index on ties" on some backends; jax-ml/jax#9146-class NaN handling). */
START_TEST(argmax_ties_and_nan)
{
    const float x[12] = { 1, 3, 3, 2, NAN, 1, NAN, 5, NEG_INF, NEG_INF, NEG_INF, NEG_INF };
    const float y[8] = { 1, 0, 0, 2, 2, NAN, 1, NAN };
    rg_in ix = RG_IN(CTPU_F32, 2, x, 3, 4), iy = RG_IN(CTPU_F32, 2, y, 2, 4);
    const double amax[3] = { 1, 0, 0 }, amin[2] = { 1, 1 };
    rg_expect("argmax ties / NaN / -inf", f_argmax1, 1, &ix, 3, amax, 0);
    rg_expect("argmin ties / NaN", f_argmin1, 1, &iy, 2, amin, 0);
    /* the same past one SIMD register / chunk: ties at 5 and 40 of 70 */
    float big[70];
    for (int i = 0; i < 70; i++) big[i] = (float)(i % 7);
    big[5] = 100; big[40] = 100;
    rg_in ib = RG_IN(CTPU_F32, 2, big, 1, 70);
    const double a5[1] = { 5 };
    rg_expect("argmax tie over 70", f_argmax1, 1, &ib, 1, a5, 0);
    const int32_t ii[6] = { 4, 9, 9, -3, -3, 0 };
    rg_in iint = RG_IN(CTPU_I32, 2, ii, 2, 3);
    const double ai[2] = { 1, 2 }, ami[2] = { 0, 0 };
    rg_expect("argmax i32 ties", f_argmax1, 1, &iint, 2, ai, 0);
    rg_expect("argmin i32 ties", f_argmin1, 1, &iint, 2, ami, 0);
}
END_TEST

/* ================================================= 6. pow special values
 * torch (C pow): (-2)^3 = -8, (-2)^0.5 = NaN, 0^0 = 1, 0^-1 = inf, -8^(1/3) =
 * NaN, 2^-inf = 0, (-0)^-1 = -inf; x^0 = 1 for NaN and inf; 0^x; (-2)^x
 * (pytorch/pytorch#22757-class, tinygrad#8912: pow of a negative base). */
static ctpu_tensor f_pow(const ctpu_tensor *in) { return ctpu_pow(in[0], in[1]); }
static double rg_s;
static ctpu_tensor f_pow_s(const ctpu_tensor *in) { return ctpu_pow_scalar(in[0], rg_s); }
static ctpu_tensor f_rpow_s(const ctpu_tensor *in) { return ctpu_rpow_scalar(in[0], rg_s); }
START_TEST(pow_special_values)
{
    const float b[8] = { -2, -2, 0, 0, 0, -8, 2, -0.0f };
    const float e[8] = { 3, 0.5f, 0, -1, 2, 1.0f / 3, NEG_INF, -1 };
    rg_in in[2] = { RG_IN(CTPU_F32, 1, b, 8), RG_IN(CTPU_F32, 1, e, 8) };
    const double want[8] = { -8, NAN, 1, INFINITY, 0, NAN, 0, NEG_INF };
    rg_no_debug_checks(); /* (-2)^0.5 is NaN from finite inputs in torch too */
    rg_expect("pow", f_pow, 2, in, 8, want, 0);
    const float x2[3] = { -3, 0, -0.5f };
    rg_in i2 = RG_IN(CTPU_F32, 1, x2, 3);
    const double w2[3] = { 9, 0, 0.25 };
    rg_s = 2;
    rg_expect("pow_scalar 2", f_pow_s, 1, &i2, 3, w2, 0);
    const float x0[3] = { NAN, 0, NEG_INF };
    rg_in i0 = RG_IN(CTPU_F32, 1, x0, 3);
    const double w0[3] = { 1, 1, 1 };
    rg_s = 0;
    rg_expect("pow_scalar 0", f_pow_s, 1, &i0, 3, w0, 0);
    const float xz[2] = { 0, -0.0f };
    rg_in iz = RG_IN(CTPU_F32, 1, xz, 2);
    const double wz[2] = { INFINITY, NEG_INF };
    rg_s = -1;
    rg_expect("pow_scalar -1 at +-0", f_pow_s, 1, &iz, 2, wz, 0);
    const float ex[3] = { 0, 1, -1 };
    rg_in ie = RG_IN(CTPU_F32, 1, ex, 3);
    const double wr0[3] = { 1, 0, INFINITY };
    rg_s = 0;
    rg_expect("rpow 0^x", f_rpow_s, 1, &ie, 3, wr0, 0);
    const float ex2[3] = { 2, 0.5f, 3 };
    rg_in ie2 = RG_IN(CTPU_F32, 1, ex2, 3);
    const double wr2[3] = { 4, NAN, -8 };
    rg_s = -2;
    rg_expect("rpow (-2)^x", f_rpow_s, 1, &ie2, 3, wr2, 0);
}
END_TEST

/* ================================================= 7. clamp / min / max / where with NaN
 * torch: clamp keeps a NaN input NaN; lo > hi gives hi everywhere; maximum /
 * minimum propagate NaN from either side; max reduction NaN wins; a NaN in
 * the branch where() does not take is not in the result
 * (pytorch/pytorch#36207 clamp NaN, jax-ml/jax#1052-class where NaN). */
static double rg_lo, rg_hi;
static ctpu_tensor f_clamp(const ctpu_tensor *in) { return ctpu_clamp(in[0], rg_lo, rg_hi); }
static ctpu_tensor f_maximum(const ctpu_tensor *in) { return ctpu_maximum(in[0], in[1]); }
static ctpu_tensor f_minimum(const ctpu_tensor *in) { return ctpu_minimum(in[0], in[1]); }
static ctpu_tensor f_where(const ctpu_tensor *in) { return ctpu_where(in[0], in[1], in[2]); }
static ctpu_tensor f_max_s(const ctpu_tensor *in) { return ctpu_maximum_scalar(in[0], rg_s); }
START_TEST(nan_through_clamp_min_max_where)
{
    const float x[4] = { NAN, 1, -5, 5 };
    rg_in ix = RG_IN(CTPU_F32, 1, x, 4);
    const double wc[4] = { NAN, 1, -1, 2 };
    rg_lo = -1; rg_hi = 2;
    rg_expect("clamp NaN", f_clamp, 1, &ix, 4, wc, 0);
    const float y[3] = { 0, 3, -3 };
    rg_in iy = RG_IN(CTPU_F32, 1, y, 3);
    const double wl[3] = { 1, 1, 1 };
    rg_lo = 2; rg_hi = 1;
    rg_expect("clamp lo > hi", f_clamp, 1, &iy, 3, wl, 0);
    const float a[3] = { NAN, 1, 2 }, b[3] = { 1, NAN, -1 };
    rg_in ab[2] = { RG_IN(CTPU_F32, 1, a, 3), RG_IN(CTPU_F32, 1, b, 3) };
    const double wmax[3] = { NAN, NAN, 2 }, wmin[3] = { NAN, NAN, -1 };
    rg_expect("maximum NaN", f_maximum, 2, ab, 3, wmax, 0);
    rg_expect("minimum NaN", f_minimum, 2, ab, 3, wmin, 0);
    rg_s = 0;
    const double wms[3] = { NAN, 1, 2 };
    rg_in ia = RG_IN(CTPU_F32, 1, a, 3);
    rg_expect("maximum_scalar NaN", f_max_s, 1, &ia, 3, wms, 0);
    const float r[6] = { 1, NAN, 3, NEG_INF, NEG_INF, NEG_INF };
    rg_in ir = RG_IN(CTPU_F32, 2, r, 2, 3);
    const double wr[2] = { NAN, NEG_INF };
    rg_expect("max reduction NaN", f_max1, 1, &ir, 2, wr, 0);
    const double wrn[2] = { NAN, NEG_INF };
    rg_expect("min reduction NaN", f_min1, 1, &ir, 2, wrn, 0);
    const float c[3] = { 1, 0, NAN }, t[3] = { NAN, 1, 2 }, f[3] = { 5, NAN, 7 };
    rg_in iw[3] = { RG_IN(CTPU_F32, 1, c, 3), RG_IN(CTPU_F32, 1, t, 3), RG_IN(CTPU_F32, 1, f, 3) };
    /* cond NaN != 0: true (torch's bool(nan) is True) */
    const double ww[3] = { NAN, NAN, 2 };
    rg_expect("where NaN", f_where, 3, iw, 3, ww, 0);
    const float c2[3] = { 0, 1, 0 };
    rg_in iw2[3] = { RG_IN(CTPU_F32, 1, c2, 3), RG_IN(CTPU_F32, 1, t, 3), RG_IN(CTPU_F32, 1, f, 3) };
    const double ww2[3] = { 5, 1, 7 };
    rg_expect("where NaN not taken", f_where, 3, iw2, 3, ww2, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("regress");
    TCase *tc = tcase_create("regress");
    tcase_add_checked_fixture(tc, t_setup, t_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, softmax_family_at_inf_and_huge);
    tcase_add_test(tc, cross_entropy_ignore_and_smoothing);
    tcase_add_test(tc, cross_entropy_label_out_of_range);
    tcase_add_test(tc, var_correction_at_small_n);
    tcase_add_test(tc, reductions_over_empty_dims);
    tcase_add_test(tc, argmax_ties_and_nan);
    tcase_add_test(tc, pow_special_values);
    tcase_add_test(tc, nan_through_clamp_min_max_where);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
