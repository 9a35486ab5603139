/* Regression classes from other systems' bug reports (PyTorch eager,
 * PyTorch/XLA, torch.compile, JAX, tinygrad): each case states PyTorch's
 * reference behaviour (values from torch 1.13, Debian's python3-torch, unless
 * a comment says otherwise), cites a report of the class, and runs in every
 * mode: strict eager, debug eager, defer and fuse, and a compiled step (its
 * capture and a replay with fresh inputs), all bit-identical to strict
 * (NaN compared as a class) and strict against the reference.
 * Where ctpu deliberately differs from torch, the case checks ctpu's
 * documented rule and names the doc that says so. */
#include "t_regress.h"

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


/* ================================================= 8. bf16 rounding: ties, overflow, NaN
 * torch: f32 -> bf16 rounds to nearest even (1 + 2^-8 -> 1, 1 + 3 2^-8 ->
 * 1 + 2^-6), FLT_MAX -> inf, a NaN whose payload is only in the low 16 bits
 * stays NaN (the "add 0x7fff and shift" trick makes it inf:
 * gorse-io/gorse#1240, dotnet/runtime#130583, tenstorrent/tt-metal#51557).
 * ctpu flushes bf16 subnormals to signed zero (docs/CONTRACTS.md "Dtypes",
 * as the MXU): torch keeps them; checked as ctpu's rule. */
static ctpu_tensor f_to_bf16(const ctpu_tensor *in) { return ctpu_cast(in[0], CTPU_BF16); }
static ctpu_tensor f_to_i32(const ctpu_tensor *in) { return ctpu_cast(in[0], CTPU_I32); }
static ctpu_tensor f_to_f32(const ctpu_tensor *in) { return ctpu_cast(in[0], CTPU_F32); }
static ctpu_tensor f_bf16_add(const ctpu_tensor *in) { return ctpu_add(ctpu_cast(in[0], CTPU_BF16), ctpu_cast(in[1], CTPU_BF16)); }
START_TEST(bf16_rounding_ties_overflow_nan)
{
    float x[12] = { 1 + 0x1p-8f, 1 + 3 * 0x1p-8f, -(1 + 0x1p-8f), 3.3895313892515355e38f, 3.4028234663852886e38f,
                    1.0009765625f, INFINITY, NEG_INF, 0, 0, 0, 0 };
    x[8] = t_u2f(0x7f800001u);   /* signalling NaNs with low payload only */
    x[9] = t_u2f(0xff800001u);
    x[10] = t_u2f(0x7f80ffffu);
    x[11] = 0x1p-130f;           /* an f32 subnormal-range value: bf16 subnormal -> +0 (ctpu's rule) */
    rg_in in = RG_IN(CTPU_F32, 1, x, 12);
    const double want[12] = { 1, 1.015625, -1, 3.3895313892515355e38, INFINITY, 1, INFINITY, NEG_INF,
                              NAN, NAN, NAN, 0 };
    rg_expect("f32 -> bf16", f_to_bf16, 1, &in, 12, want, 0);
    /* the same rule for a computed bf16 result: 1 + 2^-8 is a tie, kept even */
    const float a[2] = { 1, 1 }, b[2] = { 0x1p-8f, 3 * 0x1p-8f };
    rg_in ab[2] = { RG_IN(CTPU_F32, 1, a, 2), RG_IN(CTPU_F32, 1, b, 2) };
    const double wab[2] = { 1, 1.015625 };
    rg_expect("bf16 add rounds to even", f_bf16_add, 2, ab, 2, wab, 0);
    /* NaN read from bf16 bits stays NaN widened (0x7f81: a bf16 sNaN) */
    const uint16_t bits[4] = { 0x7f81, 0xffc0, 0x7f80, 0x0001 };
    rg_in ib = RG_IN(CTPU_BF16, 1, bits, 4);
    const double wb[4] = { NAN, NAN, INFINITY, 0x1p-133 };
    rg_expect("bf16 -> f32", f_to_f32, 1, &ib, 4, wb, 0);
}
END_TEST

/* ================================================= 9. f32 -> i32 casts of NaN / huge / fractions
 * torch truncates toward zero (2.9 -> 2, -2.9 -> -2); its NaN and
 * out-of-range results are x86's 0x80000000 (undefined in C++,
 * pytorch/pytorch#56790-class). ctpu saturates and maps NaN to 0
 * (docs/CONTRACTS.md "Dtypes", ctpu_cast): checked as ctpu's rule, in every mode. */
START_TEST(f32_to_i32_nan_huge)
{
    const float x[10] = { 2.9f, -2.9f, 3e9f, -3e9f, 0.5f, -0.5f, NAN, INFINITY, NEG_INF, 2147483520.0f };
    rg_in in = RG_IN(CTPU_F32, 1, x, 10);
    rg_res r;
    rg_run(0, f_to_i32, 1, &in, &r);
    const int32_t want[10] = { 2, -2, INT32_MAX, INT32_MIN, 0, 0, 0, INT32_MAX, INT32_MIN, 2147483520 };
    ck_assert_int_eq(r.st, CTPU_OK);
    int32_t got[10];
    for (int m = 0; m < RG_MODES; m++) {
        ctpu_scope_begin();
        ctpu_set_mode(m <= 2 ? (ctpu_mode)m : CTPU_MODE_STRICT);
        ctpu_tensor t = t_f32(x, 1, (const int64_t[]){ 10 });
        ctpu_tensor y = ctpu_cast(t, CTPU_I32);
        if (m >= 3) {   /* through a compiled step (capture, then a replay) */
            rg_fn f = f_to_i32;
            ctpu_compiled *c = ctpu_compile(rg_step, &f, NULL);
            ck_assert_int_eq(ctpu_compiled_call(c, 1, &t, 0, NULL, 1, &y), CTPU_OK);
            if (m == 4) ck_assert_int_eq(ctpu_compiled_call(c, 1, &t, 0, NULL, 1, &y), CTPU_OK);
            ctpu_compiled_free(c);
        }
        ck_assert_int_eq(ctpu_to_host(y, got, sizeof got), CTPU_OK);
        for (int i = 0; i < 10; i++)
            ck_assert_msg(got[i] == want[i], "cast i32 [%s]: element %d (%g) is %d, want %d", rg_mode_name[m], i,
                          x[i], got[i], want[i]);
        ctpu_scope_end();
        ctpu_set_mode(CTPU_MODE_STRICT);
    }
}
END_TEST

/* ================================================= 10. integer arithmetic
 * torch: i32 / i32 is true division (7 / -2 = -3.5, not trunc or floor,
 * pytorch/pytorch#43874 div rounding_mode history); i32 add wraps; abs of
 * INT32_MIN is INT32_MIN; 1/0 = inf, 0/0 = NaN in floats. */
static ctpu_tensor f_div(const ctpu_tensor *in) { return ctpu_div(in[0], in[1]); }
static ctpu_tensor f_add(const ctpu_tensor *in) { return ctpu_add(in[0], in[1]); }
static ctpu_tensor f_abs(const ctpu_tensor *in) { return ctpu_abs(in[0]); }
START_TEST(integer_division_and_overflow)
{
    const int32_t a[4] = { 7, -7, 7, -7 }, b[4] = { 2, 2, -2, -2 };
    rg_in ab[2] = { RG_IN(CTPU_I32, 1, a, 4), RG_IN(CTPU_I32, 1, b, 4) };
    const double wd[4] = { 3.5, -3.5, -3.5, 3.5 };
    rg_expect("i32 / i32", f_div, 2, ab, 4, wd, 0);
    int32_t big[2] = { INT32_MAX, INT32_MIN }, one[2] = { 1, -1 };
    rg_in bo[2] = { RG_IN(CTPU_I32, 1, big, 2), RG_IN(CTPU_I32, 1, one, 2) };
    rg_res r;
    rg_run(0, f_add, 2, bo, &r);
    ck_assert_int_eq(r.st, CTPU_OK);
    /* read as i32: wraps (INT32_MIN, INT32_MAX) */
    for (int m = 0; m < 3; m++) {
        ctpu_scope_begin();
        ctpu_set_mode((ctpu_mode)m);
        int64_t n = 2;
        ctpu_tensor s = ctpu_add(t_i32(big, 1, &n), t_i32(one, 1, &n));
        ctpu_tensor ng = ctpu_neg(t_i32(big, 1, &n));
        ctpu_tensor ab2 = ctpu_abs(t_i32(big, 1, &n));
        ctpu_tensor mu = ctpu_mul(t_i32(big, 1, &n), t_i32((const int32_t[]){ 2, 2 }, 1, &n));
        int32_t gs[2], gn[2], ga[2], gm[2];
        ck_assert_int_eq(ctpu_to_host(s, gs, sizeof gs), CTPU_OK);
        ck_assert_int_eq(ctpu_to_host(ng, gn, sizeof gn), CTPU_OK);
        ck_assert_int_eq(ctpu_to_host(ab2, ga, sizeof ga), CTPU_OK);
        ck_assert_int_eq(ctpu_to_host(mu, gm, sizeof gm), CTPU_OK);
        ck_assert_msg(gs[0] == INT32_MIN && gs[1] == INT32_MAX, "[%s] i32 add wraps: %d %d", rg_mode_name[m], gs[0], gs[1]);
        ck_assert_msg(gn[0] == -INT32_MAX && gn[1] == INT32_MIN, "[%s] i32 neg wraps: %d %d", rg_mode_name[m], gn[0], gn[1]);
        ck_assert_msg(ga[0] == INT32_MAX && ga[1] == INT32_MIN, "[%s] i32 abs: %d %d", rg_mode_name[m], ga[0], ga[1]);
        ck_assert_msg(gm[0] == -2 && gm[1] == 0, "[%s] i32 mul wraps: %d %d", rg_mode_name[m], gm[0], gm[1]);
        ctpu_scope_end();
    }
    ctpu_set_mode(CTPU_MODE_STRICT);
    const float fa[3] = { 1, -1, 0 }, fz[3] = { 0, 0, 0 };
    rg_in fab[2] = { RG_IN(CTPU_F32, 1, fa, 3), RG_IN(CTPU_F32, 1, fz, 3) };
    const double wz[3] = { INFINITY, NEG_INF, NAN };
    rg_no_debug_checks();
    rg_expect("float / 0", f_div, 2, fab, 3, wz, 0);
}
END_TEST

/* ================================================= 11. transcendental specials
 * torch values at the ends of the range: log(0) = -inf, log(-1) = NaN,
 * sigmoid(-inf) = 0 (not NaN from exp overflow: pytorch/pytorch#2061-class),
 * tanh(+-20) = +-1, softplus's threshold, rsqrt(0) = inf, rsqrt(-0) = -inf,
 * log1p(-1) = -inf, expm1(-inf) = -1, gelu(-inf) = NaN (torch's
 * x * Phi(x)), erf(+-inf) = +-1. */
static ctpu_tensor f_log(const ctpu_tensor *in) { return ctpu_log(in[0]); }
static ctpu_tensor f_sigmoid(const ctpu_tensor *in) { return ctpu_sigmoid(in[0]); }
static ctpu_tensor f_tanh(const ctpu_tensor *in) { return ctpu_tanh(in[0]); }
static ctpu_tensor f_softplus(const ctpu_tensor *in) { return ctpu_softplus(in[0]); }
static ctpu_tensor f_rsqrt(const ctpu_tensor *in) { return ctpu_rsqrt(in[0]); }
static ctpu_tensor f_sqrt(const ctpu_tensor *in) { return ctpu_sqrt(in[0]); }
static ctpu_tensor f_log1p(const ctpu_tensor *in) { return ctpu_log1p(in[0]); }
static ctpu_tensor f_expm1(const ctpu_tensor *in) { return ctpu_expm1(in[0]); }
static ctpu_tensor f_gelu(const ctpu_tensor *in) { return ctpu_gelu(in[0], false); }
static ctpu_tensor f_gelu_t(const ctpu_tensor *in) { return ctpu_gelu(in[0], true); }
static ctpu_tensor f_erf(const ctpu_tensor *in) { return ctpu_erf(in[0]); }
static ctpu_tensor f_elu(const ctpu_tensor *in) { return ctpu_elu(in[0], 1.0); }
static ctpu_tensor f_exp(const ctpu_tensor *in) { return ctpu_exp(in[0]); }
#define RG_UNARY(name, fn, tol, ...) do { \
        const float xs_[] = { __VA_ARGS__ }; \
        rg_in in_ = RG_IN(CTPU_F32, 1, xs_, RG_N(xs_)); \
        rg_expect(name, fn, 1, &in_, RG_N(xs_), want_, tol); \
    } while (0)
START_TEST(transcendental_specials)
{
    rg_no_debug_checks(); /* log(-1), sqrt(-1): NaN from finite inputs, as torch */
    { const double want_[4] = { NEG_INF, NAN, INFINITY, NEG_INF }; RG_UNARY("log", f_log, 0, 0, -1, INFINITY, -0.0f); }
    { const double want_[5] = { 0, 0, 0, 1, 1 };   /* torch 1.13: 1 / (1 + exp(100)) = 0 in f32 */
      RG_UNARY("sigmoid", f_sigmoid, 1, NEG_INF, -100, -200, 100, INFINITY); }
    { const double want_[5] = { -1, -1, 1, 1, NAN }; RG_UNARY("tanh", f_tanh, 0, NEG_INF, -20, 20, INFINITY, NAN); }
    { const double want_[6] = { 0, 3.783505853677006e-44, 0.6931471824645996, 20, 20.5, INFINITY };
      RG_UNARY("softplus", f_softplus, 1, NEG_INF, -100, 0, 20, 20.5f, INFINITY); }
    { const double want_[4] = { INFINITY, NEG_INF, NAN, 0 }; RG_UNARY("rsqrt", f_rsqrt, 0, 0, -0.0f, -1, INFINITY); }
    { const double want_[4] = { 0, -0.0, NAN, INFINITY }; RG_UNARY("sqrt", f_sqrt, 0, 0, -0.0f, -1, INFINITY); }
    { const double want_[4] = { NEG_INF, NAN, 1e-10, INFINITY }; RG_UNARY("log1p", f_log1p, 1, -1, -2, 1e-10f, INFINITY); }
    { const double want_[3] = { 1e-10, -1, INFINITY }; RG_UNARY("expm1", f_expm1, 1, 1e-10f, NEG_INF, 100); }
    /* gelu(-10): torch 1.13 gives 0 (1 + erf(-7.07) cancels in f32); ctpu's exact GELU is within
     * 0.5001 ulp of float64 0.5 x erfc(-x / sqrt 2) = -7.62e-23 (docs/CONTRACTS.md): deliberately more accurate */
    { const double want_[4] = { INFINITY, NAN, -7.619853024160593e-23, NAN }; RG_UNARY("gelu", f_gelu, 1, INFINITY, NEG_INF, -10, NAN); }
    { const double want_[3] = { INFINITY, NAN, 0 }; RG_UNARY("gelu tanh", f_gelu_t, 0, INFINITY, NEG_INF, -10); }
    { const double want_[3] = { -1, 1, NAN }; RG_UNARY("erf", f_erf, 0, NEG_INF, INFINITY, NAN); }
    { const double want_[3] = { -1, -1, 0 }; RG_UNARY("elu", f_elu, 0, NEG_INF, -100, 0); }
    { const double want_[4] = { 0, INFINITY, 1, INFINITY }; RG_UNARY("exp", f_exp, 0, NEG_INF, 89, 0, INFINITY); }
}
END_TEST

/* ================================================= 12. bf16 reductions accumulate in f32
 * torch sums bf16 in f32 and rounds once: 4096 ones sum to 4096 (a bf16
 * accumulator sticks at 256), 1000 x bf16(0.1) sums to 100.1 -> bf16 100;
 * the mean 1; cumsum's last 4096 (pytorch/pytorch#52144-class low-precision
 * accumulation). */
START_TEST(bf16_reductions_accumulate_in_f32)
{
    static uint16_t ones[4096], tenth[1000];
    for (int i = 0; i < 4096; i++) ones[i] = 0x3f80;
    for (int i = 0; i < 1000; i++) tenth[i] = 0x3dcd;   /* bf16(0.1) = 0.10009765625 */
    rg_in i1 = RG_IN(CTPU_BF16, 1, ones, 4096), it = RG_IN(CTPU_BF16, 1, tenth, 1000);
    const double w4096[1] = { 4096 }, w1[1] = { 1 }, w100[1] = { 100 };
    rg_expect("bf16 sum of 4096 ones", f_sum_all, 1, &i1, 1, w4096, 0);
    rg_expect("bf16 mean of 4096 ones", f_mean_all, 1, &i1, 1, w1, 0);
    rg_expect("bf16 sum of 1000 x 0.1", f_sum_all, 1, &it, 1, w100, 0);
    rg_in i1r = RG_IN(CTPU_BF16, 2, ones, 1, 4096);
    rg_res r;
    rg_run(0, f_cumsum1, 1, &i1r, &r);
    ck_assert_int_eq(r.st, CTPU_OK);
    ck_assert_msg(r.v[299] == 300, "bf16 cumsum: element 299 is %g (torch: 300)", r.v[299]);
    ck_assert_msg(r.v[4095] == 4096, "bf16 cumsum: element 4095 is %g (torch: 4096)", r.v[4095]);
}
END_TEST

/* ================================================= 13. arange / linspace lengths
 * torch: arange's length is ceil((end - start) / step) in double:
 * arange(1, 1.3, 0.1) has 4 elements (1.3 - 1 = 0.30000000000000004), (0, 1,
 * 0.1) 10, (10, 0, -3) 4 (pytorch/pytorch#47043, numpy's float-step
 * gotcha); linspace(0, 1, 1) = [0]. */
static double rg_a0, rg_a1, rg_a2;
START_TEST(arange_lengths)
{
    const double cases[][4] = { { 0, 1, 0.1, 10 }, { 1, 2.5, 0.5, 3 }, { -1, 1, 0.1, 20 }, { 0, 10, 3, 4 },
                                { 10, 0, -3, 4 }, { 0, 0.3, 0.1, 3 }, { 1, 1.3, 0.1, 4 }, { 0, 0, 1, 0 } };
    for (int m = 0; m < 3; m++) {
        ctpu_set_mode((ctpu_mode)m);
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            ctpu_tensor a = ctpu_arange(cases[i][0], cases[i][1], cases[i][2], CTPU_F32);
            ck_assert_msg(ctpu_numel(a) == (int64_t)cases[i][3], "[%s] arange(%g, %g, %g) has %lld elements, torch %g",
                          rg_mode_name[m], cases[i][0], cases[i][1], cases[i][2], (long long)ctpu_numel(a), cases[i][3]);
            ctpu_release(a);
        }
        ctpu_tensor l = ctpu_linspace(0, 1, 1, CTPU_F32);
        double v;
        ck_assert_int_eq(ctpu_item(l, &v), CTPU_OK);
        ck_assert(v == 0);
        ctpu_release(l);
    }
    ctpu_set_mode(CTPU_MODE_STRICT);
    (void)rg_a0; (void)rg_a1; (void)rg_a2;
}
END_TEST

/* ================================================= 14. 0-size and size-1 broadcasting, K = 0 matmul
 * torch: [0, 3] + [1, 3] is [0, 3]; [2, 1] + [1, 3] is [2, 3]; [0] + [1]
 * is [0]; [2, 0] @ [0, 3] is zeros [2, 3] (pytorch/pytorch#31421,
 * onnxruntime#21483, apache/tvm#19578: uninitialised output for K = 0);
 * [0, 4] @ [4, 2] is [0, 2]; [2, 3] + [0, 3] is not broadcastable (error). */
static ctpu_tensor f_matmul(const ctpu_tensor *in) { return ctpu_matmul(in[0], in[1]); }
static ctpu_tensor f_matmul_bf16(const ctpu_tensor *in)
{
    return ctpu_matmul(ctpu_cast(in[0], CTPU_BF16), ctpu_cast(in[1], CTPU_BF16));
}
static ctpu_tensor f_matmul_tb(const ctpu_tensor *in) { return ctpu_matmul_t(in[0], in[1], false, true); }
static ctpu_tensor f_add_sum(const ctpu_tensor *in) { return ctpu_sum(ctpu_add(in[0], in[1]), 0, NULL, false); }
START_TEST(zero_size_and_size_one_broadcast)
{
    const float d[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
    rg_in e03[2] = { RG_IN(CTPU_F32, 2, d, 0, 3), RG_IN(CTPU_F32, 2, d, 1, 3) };
    const int64_t s03[2] = { 0, 3 };
    rg_expect("[0,3] + [1,3]", f_add, 2, e03, 0, NULL, 0);
    rg_expect_shape(f_add, 2, e03, 2, s03);
    rg_in b[2] = { RG_IN(CTPU_F32, 2, d, 2, 1), RG_IN(CTPU_F32, 2, d, 1, 3) };
    const double wb[6] = { 2, 3, 4, 3, 4, 5 };
    rg_expect("[2,1] + [1,3]", f_add, 2, b, 6, wb, 0);
    rg_in bad[2] = { RG_IN(CTPU_F32, 2, d, 2, 3), RG_IN(CTPU_F32, 2, d, 0, 3) };
    rg_expect_error("[2,3] + [0,3]", f_add, 2, bad, CTPU_ERR_SHAPE, "add");
    const double z1[1] = { 0 };
    rg_expect("sum([0,3] + [1,3])", f_add_sum, 2, e03, 1, z1, 0);
    rg_in k0[2] = { RG_IN(CTPU_F32, 2, d, 2, 0), RG_IN(CTPU_F32, 2, d, 0, 3) };
    const double zeros6[6] = { 0 };
    rg_expect("[2,0] @ [0,3]", f_matmul, 2, k0, 6, zeros6, 0);
    rg_expect("[2,0] @ [0,3] bf16", f_matmul_bf16, 2, k0, 6, zeros6, 0);
    rg_in k0t[2] = { RG_IN(CTPU_F32, 2, d, 2, 0), RG_IN(CTPU_F32, 2, d, 3, 0) };
    rg_expect("[2,0] @ [3,0]^T", f_matmul_tb, 2, k0t, 6, zeros6, 0);
    const int32_t di[4] = { 1, 2, 3, 4 };
    rg_in k0i[2] = { RG_IN(CTPU_I32, 2, di, 2, 0), RG_IN(CTPU_I32, 2, di, 0, 3) };
    rg_expect("[2,0] @ [0,3] i32", f_matmul, 2, k0i, 6, zeros6, 0);
    rg_in m0[2] = { RG_IN(CTPU_F32, 2, d, 0, 4), RG_IN(CTPU_F32, 2, d, 4, 2) };
    const int64_t s02[2] = { 0, 2 };
    rg_expect("[0,4] @ [4,2]", f_matmul, 2, m0, 0, NULL, 0);
    rg_expect_shape(f_matmul, 2, m0, 2, s02);
    rg_in b0[2] = { RG_IN(CTPU_F32, 3, d, 0, 2, 2), RG_IN(CTPU_F32, 2, d, 2, 3) };
    const int64_t s023[3] = { 0, 2, 3 };
    rg_expect_shape(f_matmul, 2, b0, 3, s023);
    /* 1-D @ 1-D of length 0: a 0-d zero */
    rg_in v0[2] = { RG_IN(CTPU_F32, 1, d, 0), RG_IN(CTPU_F32, 1, d, 0) };
    rg_expect("[0] @ [0]", f_matmul, 2, v0, 1, z1, 0);
}
END_TEST


/* ================================================= 15. gradients at kinks, ties and 0
 * torch: abs'(0) = 0 and relu'(0) = 0 (pytorch/pytorch#7172-class); a full
 * max / min reduction and amax over a dim split ties evenly
 * (pytorch/pytorch#43519, tinygrad#229); maximum / minimum at a tie give 0.5
 * to each side; clamp passes the gradient at its bounds; d/dx x^2 at 0 is 0,
 * x^0 has gradient 0 everywhere, x^0.5 and sqrt at 0 are inf, x^1 is 1; the
 * exponent's gradient at base 0 is 0 (torch masks log(0) * 0,
 * tenstorrent/tt-metal#5082, tinygrad#9075, stan-dev/math#3031); prod with
 * one zero gives the product of the others, with two 0; a where() whose
 * untaken branch is sqrt of a negative gives NaN (0 * inf), as torch
 * (jax-ml/jax#1052: the double-where trick). */
static ctpu_tensor f_relu(const ctpu_tensor *in) { return ctpu_relu(in[0]); }
static ctpu_tensor f_minall(const ctpu_tensor *in) { return ctpu_min(in[0], 0, NULL, false); }
static ctpu_tensor f_pow_t(const ctpu_tensor *in) { return ctpu_pow(in[0], in[1]); }
static ctpu_tensor f_prod_all(const ctpu_tensor *in) { return ctpu_prod(in[0], 0, NULL, false); }
static ctpu_tensor f_where_sqrt(const ctpu_tensor *in)
{
    return ctpu_where(ctpu_gt_scalar(in[0], 0), ctpu_sqrt(in[0]), ctpu_zeros_like(in[0]));
}
static ctpu_tensor f_cumsum0(const ctpu_tensor *in) { return ctpu_cumsum(in[0], 0); }
START_TEST(gradients_at_kinks_ties_and_zero)
{
    const float k[4] = { 0, -0.0f, 1, -2 };
    rg_in ik = RG_IN(CTPU_F32, 1, k, 4);
    { const double w[4] = { 0, 0, 1, -1 }; rg_grad_expect("abs", f_abs, 1, &ik, 4, w, 0); }
    { const double w[4] = { 0, 0, 1, 0 }; rg_grad_expect("relu", f_relu, 1, &ik, 4, w, 0); }
    const float t[4] = { 1, 3, 3, 2 };
    rg_in it = RG_IN(CTPU_F32, 1, t, 4), it2 = RG_IN(CTPU_F32, 2, t, 1, 4);
    { const double w[4] = { 0, 0.5, 0.5, 0 }; rg_grad_expect("max ties", f_max_all, 1, &it, 4, w, 0); }
    { const double w[4] = { 0, 0.5, 0.5, 0 }; rg_grad_expect("amax dim ties", f_max1, 1, &it2, 4, w, 0); }
    const float t3[3] = { 1, 1, 3 };
    rg_in i3 = RG_IN(CTPU_F32, 1, t3, 3);
    { const double w[3] = { 0.5, 0.5, 0 }; rg_grad_expect("min ties", f_minall, 1, &i3, 3, w, 0); }
    const float ma[3] = { 1, 2, 3 }, mb[3] = { 1, 1, 3 };
    rg_in mab[2] = { RG_IN(CTPU_F32, 1, ma, 3), RG_IN(CTPU_F32, 1, mb, 3) };
    { const double w[6] = { 0.5, 1, 0.5, 0.5, 0, 0.5 }; rg_grad_expect("maximum ties", f_maximum, 2, mab, 6, w, 0); }
    { const double w[6] = { 0.5, 0, 0.5, 0.5, 1, 0.5 }; rg_grad_expect("minimum ties", f_minimum, 2, mab, 6, w, 0); }
    const float cb[5] = { -1, 1, 0, 2, -2 };
    rg_in icb = RG_IN(CTPU_F32, 1, cb, 5);
    rg_lo = -1; rg_hi = 1;
    { const double w[5] = { 1, 1, 1, 0, 0 }; rg_grad_expect("clamp at its bounds", f_clamp, 1, &icb, 5, w, 0); }
    const float p0[3] = { 0, -0.0f, 1 };
    rg_in ip0 = RG_IN(CTPU_F32, 1, p0, 3);
    rg_s = 2;
    { const double w[3] = { 0, 0, 2 }; rg_grad_expect("x^2 at 0", f_pow_s, 1, &ip0, 3, w, 0); }
    const float q0[3] = { 0, 1, -2 };
    rg_in iq0 = RG_IN(CTPU_F32, 1, q0, 3);
    rg_s = 0;
    { const double w[3] = { 0, 0, 0 }; rg_grad_expect("x^0", f_pow_s, 1, &iq0, 3, w, 0); }
    const float h0[2] = { 0, 4 };
    rg_in ih0 = RG_IN(CTPU_F32, 1, h0, 2);
    rg_s = 0.5;
    { const double w[2] = { INFINITY, 0.25 }; rg_grad_expect("x^0.5 at 0", f_pow_s, 1, &ih0, 2, w, 0); }
    rg_s = 1;
    { const double w[2] = { 1, 1 }; rg_grad_expect("x^1 at 0", f_pow_s, 1, &ih0, 2, w, 0); }
    { const double w[2] = { INFINITY, 0.25 }; rg_grad_expect("sqrt at 0", f_sqrt, 1, &ih0, 2, w, 0); }
    const float pb[3] = { 0, 0, 2 }, pe[3] = { 2, 0, 3 };
    rg_in ipp[2] = { RG_IN(CTPU_F32, 1, pb, 3), RG_IN(CTPU_F32, 1, pe, 3) };
    { const double w[6] = { 0, 0, 12, 0, 0, 5.545177459716797 }; rg_grad_expect("pow(0, e) both sides", f_pow_t, 2, ipp, 6, w, 1); }
    const float re[3] = { 2, 0, 0.5f };
    rg_in ire = RG_IN(CTPU_F32, 1, re, 3);
    rg_s = 0;
    { const double w[3] = { 0, 0, 0 }; rg_grad_expect("0^x", f_rpow_s, 1, &ire, 3, w, 0); }
    const float pz[3] = { 2, 0, 3 }, pzz[3] = { 2, 0, 0 };
    rg_in ipz = RG_IN(CTPU_F32, 1, pz, 3), ipzz = RG_IN(CTPU_F32, 1, pzz, 3);
    { const double w[3] = { 0, 6, 0 }; rg_grad_expect("prod, one zero", f_prod_all, 1, &ipz, 3, w, 0); }
    { const double w[3] = { 0, 0, 0 }; rg_grad_expect("prod, two zeros", f_prod_all, 1, &ipzz, 3, w, 0); }
    const float ws[2] = { 4, -1 };
    rg_in iws = RG_IN(CTPU_F32, 1, ws, 2);
    rg_no_debug_checks();
    { const double w[2] = { 0.25, NAN }; rg_grad_expect("where(x > 0, sqrt(x), 0)", f_where_sqrt, 1, &iws, 2, w, 0); }
    const float cs[3] = { 1, 2, 3 };
    rg_in ics = RG_IN(CTPU_F32, 1, cs, 3);
    { const double w[3] = { 3, 2, 1 }; rg_grad_expect("cumsum", f_cumsum0, 1, &ics, 3, w, 0); }
}
END_TEST

/* ================================================= 16. layer_norm / rms_norm at tiny and huge variance
 * torch: a constant row normalises to 0 (var 0 + eps; gradient 0); a row
 * whose squares overflow f32 gives 0 (rsqrt(inf)); D = 1 gives the bias; a
 * large offset with a small spread: torch's Welford in f32 gives
 * [-1.17, 0.0066, 1.26] for [1000, 1000.001, 1000.002] at eps 0; ctpu's
 * two-pass mean and var (docs/DESIGN.md) is checked against float64
 * (pytorch/pytorch#41527-class LayerNorm precision, jax-ml/jax#6188-class
 * var of a large mean). */
static double rg_eps;
static ctpu_tensor f_ln(const ctpu_tensor *in) { return ctpu_layer_norm(in[0], CTPU_NULL, CTPU_NULL, rg_eps); }
static ctpu_tensor f_ln_affine(const ctpu_tensor *in) { return ctpu_layer_norm(in[0], in[1], in[2], rg_eps); }
static ctpu_tensor f_rms(const ctpu_tensor *in) { return ctpu_rms_norm(in[0], CTPU_NULL, rg_eps); }
static ctpu_tensor f_ln_bf16(const ctpu_tensor *in)
{
    return ctpu_layer_norm(ctpu_cast(in[0], CTPU_BF16), CTPU_NULL, CTPU_NULL, rg_eps);
}
START_TEST(layer_norm_tiny_and_huge_variance)
{
    rg_eps = 1e-5;
    const float c[3] = { 2, 2, 2 };
    rg_in ic = RG_IN(CTPU_F32, 2, c, 1, 3);
    const double z3[3] = { 0, 0, 0 };
    rg_expect("layer_norm of a constant row", f_ln, 1, &ic, 3, z3, 0);
    rg_expect("layer_norm bf16 constant row", f_ln_bf16, 1, &ic, 3, z3, 0);
    rg_grad_expect("layer_norm of a constant row", f_ln, 1, &ic, 3, z3, 0);
    const float zf[3] = { 0, 0, 0 };
    rg_in iz = RG_IN(CTPU_F32, 2, zf, 1, 3);
    rg_expect("rms_norm of zeros", f_rms, 1, &iz, 3, z3, 0);
    const double r316[3] = { 316.2277660168379, 316.2277660168379, 316.2277660168379 };   /* rsqrt(eps), as torch */
    rg_grad_expect("rms_norm of zeros", f_rms, 1, &iz, 3, r316, 1);
    const float h[3] = { 1e20f, -1e20f, 0 };
    rg_in ih = RG_IN(CTPU_F32, 2, h, 1, 3);
    rg_expect("layer_norm with overflowing squares", f_ln, 1, &ih, 3, z3, 0);
    const float one[1] = { 5 }, w1[1] = { 2 }, b1[1] = { 0.5f };
    rg_in i1[3] = { RG_IN(CTPU_F32, 2, one, 1, 1), RG_IN(CTPU_F32, 1, w1, 1), RG_IN(CTPU_F32, 1, b1, 1) };
    const double wb[1] = { 0.5 };
    rg_expect("layer_norm D = 1", f_ln_affine, 3, i1, 1, wb, 0);
    /* offset + small spread: float64 of the f32 inputs [1000, 1000.0009765625, 1000.001953125] */
    const float o[3] = { 1000.0f, 1000.001f, 1000.002f };
    rg_in io = RG_IN(CTPU_F32, 2, o, 1, 3);
    double mean = 0, var = 0, wo[3];
    for (int i = 0; i < 3; i++) mean += o[i] / 3.0;
    for (int i = 0; i < 3; i++) var += (o[i] - mean) * (o[i] - mean) / 3.0;
    for (int i = 0; i < 3; i++) wo[i] = (o[i] - mean) / sqrt(var);
    rg_eps = 0;
    /* the f32 mean's rounding (6e-5 at 1000) is 3% of the spread: no f32 method is exact here; torch
     * (Welford in f32) gives [-1.171875, 0.0065937, 1.2587167], 0.04 off; ctpu's two-pass within 0.03, the
     * same bits in every mode */
    rg_res r[RG_MODES];
    for (int m = 0; m < RG_MODES; m++) {
        rg_run(m, f_ln, 1, &io, &r[m]);
        ck_assert_msg(r[m].st == CTPU_OK && r[m].n == 3, "%s", r[m].err);
        for (int i = 0; i < 3; i++) ck_assert(rg_eq(r[m].v[i], r[0].v[i]));
    }
    for (int i = 0; i < 3; i++)
        ck_assert_msg(fabs(r[0].v[i] - wo[i]) <= 0.03, "layer_norm offset row: element %d is %.9g, float64 %.9g", i,
                      r[0].v[i], wo[i]);
}
END_TEST


/* ================================================= 17. SDPA: causal with Tq != Tk, fully masked rows, dropout
 * torch's is_causal is top-left aligned (tril(ones(L, S))): with Tq < Tk query
 * i sees keys 0..i, with Tq > Tk the rows past Tk see every key
 * (pytorch/pytorch#108108: is_causal with L != S). A fully masked row is NaN
 * in torch 1.13 (pytorch/pytorch#41508, #103749) and 0 since torch 2.5's
 * _safe_softmax (#131863); ctpu gives 0 and a zero gradient (ctpu.h,
 * deliberately: padded rows poison neither loss nor debug checks).
 * Dropout: the same seed gives the same bits in every mode. Bound: ctpu.h's
 * MXU numerics (bf16 operands and probabilities), 2^-7 of max |ref|. */
static bool rg_causal;
static double rg_p;
static ctpu_tensor f_sdpa(const ctpu_tensor *in)
{
    return ctpu_scaled_dot_product_attention(in[0], in[1], in[2], CTPU_NULL, CTPU_MASK_NONE, rg_causal, 0, rg_p);
}
static ctpu_tensor f_sdpa_mask(const ctpu_tensor *in)
{
    return ctpu_scaled_dot_product_attention(in[0], in[1], in[2], in[3], CTPU_MASK_ADDITIVE, rg_causal, 0, rg_p);
}
static void rg_expect_abs(const char *name, rg_fn f, int nin, const rg_in *ins, int64_t n, const double *want, double bound)
{
    static rg_res r[RG_MODES];
    for (int m = 0; m < RG_MODES; m++) {
        rg_run(m, f, nin, ins, &r[m]);
        ck_assert_msg(r[m].st == CTPU_OK && r[m].n == n, "%s [%s]: %s", name, rg_mode_name[m], r[m].err);
        for (int64_t i = 0; i < n; i++)
            ck_assert_msg(rg_eq(r[m].v[i], r[0].v[i]), "%s [%s]: element %lld is %.9g, strict %.9g", name,
                          rg_mode_name[m], (long long)i, r[m].v[i], r[0].v[i]);
    }
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(fabs(r[0].v[i] - want[i]) <= bound, "%s: element %lld is %.9g, torch %.9g", name, (long long)i,
                      r[0].v[i], want[i]);
}
START_TEST(sdpa_causal_rectangular_masked_dropout)
{
    float q[12], k[12], v[12];
    for (int i = 0; i < 12; i++) { q[i] = (float)i / 10; k[i] = (float)i / 10; v[i] = (float)i; }
    rg_causal = true;
    rg_p = 0;
    rg_in a[3] = { RG_IN(CTPU_F32, 4, q, 1, 1, 2, 3), RG_IN(CTPU_F32, 4, k, 1, 1, 4, 3), RG_IN(CTPU_F32, 4, v, 1, 1, 4, 3) };
    const double wa[6] = { 0, 1, 2, 1.6553258895874023, 2.6553258895874023, 3.6553258895874023 };
    rg_expect_abs("sdpa causal Tq 2 < Tk 4", f_sdpa, 3, a, 6, wa, 3.66 / 128);
    rg_in b[3] = { RG_IN(CTPU_F32, 4, q, 1, 1, 4, 3), RG_IN(CTPU_F32, 4, k, 1, 1, 2, 3), RG_IN(CTPU_F32, 4, v, 1, 1, 2, 3) };
    const double wb[12] = { 0, 1, 2, 1.6553258895874023, 2.6553258895874023, 3.6553258895874023, 1.7698297500610352,
                            2.769829750061035, 3.769829750061035, 1.8811733722686768, 2.8811733722686768,
                            3.8811733722686768 };
    rg_expect_abs("sdpa causal Tq 4 > Tk 2", f_sdpa, 3, b, 12, wb, 3.89 / 128);
    /* a fully masked row (row 1 of an additive mask) */
    const float mk[8] = { 0, 0, 0, 0, NEG_INF, NEG_INF, NEG_INF, NEG_INF };
    rg_in c[4] = { RG_IN(CTPU_F32, 4, q, 1, 1, 2, 3), RG_IN(CTPU_F32, 4, k, 1, 1, 4, 3), RG_IN(CTPU_F32, 4, v, 1, 1, 4, 3),
                   RG_IN(CTPU_F32, 2, mk, 2, 4) };
    rg_causal = false;
    rg_res r;
    rg_run(0, f_sdpa_mask, 4, c, &r);
    ck_assert_msg(r.st == CTPU_OK, "%s", r.err);
    ck_assert_msg(r.v[3] == 0 && r.v[4] == 0 && r.v[5] == 0 && !isnan(r.v[0]), "fully masked row: %g %g %g (ctpu.h: 0)",
                  r.v[3], r.v[4], r.v[5]);
    const double wc[6] = { r.v[0], r.v[1], r.v[2], 0, 0, 0 };
    rg_expect_abs("sdpa fully masked row", f_sdpa_mask, 4, c, 6, wc, 0);
    /* is_causal with a mask that drops the only allowed key of query 0 (ctpu allows both; torch does not) */
    const float mk0[8] = { NEG_INF, 0, 0, 0, 0, 0, 0, 0 };
    rg_in d[4] = { RG_IN(CTPU_F32, 4, q, 1, 1, 2, 3), RG_IN(CTPU_F32, 4, k, 1, 1, 4, 3), RG_IN(CTPU_F32, 4, v, 1, 1, 4, 3),
                   RG_IN(CTPU_F32, 2, mk0, 2, 4) };
    rg_causal = true;
    rg_run(0, f_sdpa_mask, 4, d, &r);
    ck_assert_msg(r.st == CTPU_OK && r.v[0] == 0 && r.v[1] == 0 && r.v[2] == 0, "causal + mask empties row 0: %g %g %g",
                  r.v[0], r.v[1], r.v[2]);
    const double wd[6] = { 0, 0, 0, r.v[3], r.v[4], r.v[5] };
    rg_expect_abs("sdpa causal + mask, row 0 empty", f_sdpa_mask, 4, d, 6, wd, 0);
    rg_causal = false;
}
END_TEST

/* the gradient of a fully masked row is zero, in every mode (q, k, v only) */
static ctpu_tensor rg_mask_t;
static ctpu_tensor f_sdpa_fixed_mask(const ctpu_tensor *in)
{
    return ctpu_scaled_dot_product_attention(in[0], in[1], in[2], rg_mask_t, CTPU_MASK_ADDITIVE, false, 0, 0);
}
START_TEST(sdpa_fully_masked_row_gradient)
{
    float q[6], k[12], v[12];
    for (int i = 0; i < 6; i++) q[i] = (float)i / 10;
    for (int i = 0; i < 12; i++) { k[i] = (float)(12 - i) / 10; v[i] = (float)i - 3; }
    const float mk[8] = { NEG_INF, NEG_INF, NEG_INF, NEG_INF, 0, 0, NEG_INF, 0 };
    rg_mask_t = ctpu_keep(t_f32(mk, 2, (const int64_t[]){ 2, 4 }));
    rg_in c[3] = { RG_IN(CTPU_F32, 4, q, 1, 1, 2, 3), RG_IN(CTPU_F32, 4, k, 1, 1, 4, 3), RG_IN(CTPU_F32, 4, v, 1, 1, 4, 3) };
    static rg_res r[RG_MODES];
    for (int m = 0; m < RG_MODES; m++) {
        rg_grun(m, f_sdpa_fixed_mask, 3, c, &r[m]);
        ck_assert_msg(r[m].st == CTPU_OK, "[%s] %s", rg_mode_name[m], r[m].err);
        ck_assert_int_eq(r[m].n, 6 + 12 + 12);
        for (int i = 0; i < 3; i++)   /* dq of the masked query row 0 */
            ck_assert_msg(r[m].v[i] == 0, "[%s] dq[0][%d] = %g, want 0", rg_mode_name[m], i, r[m].v[i]);
        for (int i = 0; i < 30; i++) {
            ck_assert_msg(!isnan(r[m].v[i]), "[%s] gradient %d is NaN", rg_mode_name[m], i);
            ck_assert(rg_eq(r[m].v[i], r[0].v[i]));
        }
    }
    ctpu_release(rg_mask_t);
}
END_TEST

/* dropout: same seed, same bits in every mode and a compiled replay; a second draw differs (jax-ml/jax#4801-class
 * RNG reproducibility, pytorch/xla#2520-class different dropout masks between eager and lazy). */
static uint64_t rg_seed;
static ctpu_tensor f_seeded_dropout(const ctpu_tensor *in) { return ctpu_dropout(in[0], 0.5, true); }
static ctpu_tensor f_seeded_sdpa(const ctpu_tensor *in)
{
    return ctpu_scaled_dot_product_attention(in[0], in[1], in[2], CTPU_NULL, CTPU_MASK_NONE, false, 0, 0.3);
}
static void rg_seeded(const char *name, rg_fn f, int nin, const rg_in *ins)
{
    static rg_res r[RG_MODES], again;
    for (int m = 0; m < RG_MODES; m++) {
        /* the generator at (rg_seed, 0) before the call that is read (a replay: before the replay) */
        ctpu_manual_seed(rg_seed);
        if (m == 4) {   /* capture once at another offset, then seed and replay */
            ctpu_scope_begin();
            ctpu_compiled *c = ctpu_compile(rg_step, &f, NULL);
            ctpu_tensor in[RG_MAX_IN], out = CTPU_NULL;
            rg_make(nin, ins, in);
            ck_assert_int_eq(ctpu_compiled_call(c, nin, in, 0, NULL, 1, &out), CTPU_OK);
            ctpu_manual_seed(rg_seed);
            rg_make(nin, ins, in);
            ck_assert_int_eq(ctpu_compiled_call(c, nin, in, 0, NULL, 1, &out), CTPU_OK);
            rg_read(out, CTPU_OK, &r[m]);
            ctpu_compiled_free(c);
            ctpu_scope_end();
        } else {
            rg_run(m, f, nin, ins, &r[m]);
        }
        ck_assert_msg(r[m].st == CTPU_OK, "%s [%s]: %s", name, rg_mode_name[m], r[m].err);
        for (int64_t i = 0; i < r[0].n; i++)
            ck_assert_msg(rg_eq(r[m].v[i], r[0].v[i]), "%s [%s]: element %lld is %.9g, strict %.9g (same seed)", name,
                          rg_mode_name[m], (long long)i, r[m].v[i], r[0].v[i]);
    }
    rg_run(0, f, nin, ins, &again);   /* the generator moved on: another mask */
    bool differs = false;
    for (int64_t i = 0; i < again.n; i++) differs |= !rg_eq(again.v[i], r[0].v[i]);
    ck_assert_msg(differs, "%s: a second draw repeated the first", name);
}
START_TEST(dropout_same_seed_same_bits)
{
    static float x[256], q[64], k[64], v[64];
    for (int i = 0; i < 256; i++) x[i] = 1 + (float)i / 256;
    for (int i = 0; i < 64; i++) { q[i] = (float)(i % 7) / 7; k[i] = (float)(i % 5) / 5; v[i] = (float)i / 64; }
    rg_seed = 1234;
    rg_in ix = RG_IN(CTPU_F32, 2, x, 16, 16);
    rg_seeded("dropout", f_seeded_dropout, 1, &ix);
    rg_in a[3] = { RG_IN(CTPU_F32, 4, q, 1, 2, 8, 4), RG_IN(CTPU_F32, 4, k, 1, 2, 8, 4), RG_IN(CTPU_F32, 4, v, 1, 2, 8, 4) };
    rg_seeded("sdpa dropout", f_seeded_sdpa, 3, a);
    /* p = 1 gives zeros (not 0 * inf = NaN from the 1 / (1 - p) scale), as torch */
    rg_res r;
    static ctpu_tensor (*const p1)(const ctpu_tensor *) = NULL;
    (void)p1;
    ctpu_tensor t = t_f32(x, 2, (const int64_t[]){ 16, 16 });
    ctpu_tensor z = ctpu_dropout(t, 1.0, true);
    rg_read(z, CTPU_OK, &r);
    ck_assert_msg(r.st == CTPU_OK, "%s", r.err);
    for (int i = 0; i < 256; i++) ck_assert_msg(r.v[i] == 0, "dropout p=1: element %d is %g", i, r.v[i]);
}
END_TEST

/* ================================================= 18. autograd: accumulation, retain_graph, detach, set_to_none
 * torch: two backward passes accumulate (retain_graph on the first):
 * d/dx sum(x^2) twice = 4x; a second backward through a freed graph is an
 * error ("Trying to backward through the graph a second time"); detach stops
 * the gradient (d/dx sum(x * detach(x)) = x); zero_grad(set_to_none) drops
 * .grad and the next backward makes it afresh (pytorch/pytorch#61164-class
 * accumulation bugs, pytorch/xla#3043-class grads under lazy tensors). */
START_TEST(autograd_accumulate_retain_detach)
{
    for (int m = 0; m < 3; m++) {
        ctpu_set_mode((ctpu_mode)m);
        ctpu_scope_begin();
        ctpu_tensor x = T_VEC(1, 2);
        ck_assert_int_eq(ctpu_set_requires_grad(x, true), CTPU_OK);
        ctpu_tensor y = ctpu_sum(ctpu_mul(x, x), 0, NULL, false);
        ck_assert_int_eq(ctpu_backward_ex(y, CTPU_NULL, true), CTPU_OK);
        ck_assert_int_eq(ctpu_backward(y), CTPU_OK);
        float g[2];
        ck_assert_int_eq(ctpu_to_host(ctpu_grad(x), g, sizeof g), CTPU_OK);
        ck_assert_msg(g[0] == 4 && g[1] == 8, "[%s] accumulated grad %g %g, torch 4 8", rg_mode_name[m], g[0], g[1]);
        /* the tape is gone now */
        ck_assert_int_eq(ctpu_backward(y), CTPU_ERR_STATE);
        /* a third pass through a new graph accumulates too */
        ctpu_tensor y3 = ctpu_sum(ctpu_mul(x, ctpu_detach(x)), 0, NULL, false);
        ck_assert_int_eq(ctpu_backward(y3), CTPU_OK);
        ck_assert_int_eq(ctpu_to_host(ctpu_grad(x), g, sizeof g), CTPU_OK);
        ck_assert_msg(g[0] == 5 && g[1] == 10, "[%s] grad after detach pass %g %g, torch 5 10", rg_mode_name[m], g[0], g[1]);
        /* set-to-none: the next backward starts from nothing */
        ck_assert_int_eq(ctpu_zero_grad(x), CTPU_OK);
        ck_assert(ctpu_is_null(ctpu_grad(x)));
        ctpu_tensor y4 = ctpu_sum(ctpu_mul_scalar(x, 3), 0, NULL, false);
        ck_assert_int_eq(ctpu_backward(y4), CTPU_OK);
        ck_assert_int_eq(ctpu_to_host(ctpu_grad(x), g, sizeof g), CTPU_OK);
        ck_assert_msg(g[0] == 3 && g[1] == 3, "[%s] grad after set-to-none %g %g", rg_mode_name[m], g[0], g[1]);
        /* a detached value does not require grad; backward from it is an error */
        ctpu_tensor d = ctpu_sum(ctpu_detach(x), 0, NULL, false);
        ck_assert(!ctpu_requires_grad(d));
        ck_assert_int_eq(ctpu_backward(d), CTPU_ERR_STATE);
        /* backward with retain_graph twice then without: three accumulations, one tape */
        ctpu_zero_grad(x);
        ctpu_tensor y5 = ctpu_sum(ctpu_mul(x, x), 0, NULL, false);
        ck_assert_int_eq(ctpu_backward_ex(y5, CTPU_NULL, true), CTPU_OK);
        ck_assert_int_eq(ctpu_backward_ex(y5, CTPU_NULL, true), CTPU_OK);
        ck_assert_int_eq(ctpu_backward(y5), CTPU_OK);
        ck_assert_int_eq(ctpu_to_host(ctpu_grad(x), g, sizeof g), CTPU_OK);
        ck_assert_msg(g[0] == 6 && g[1] == 12, "[%s] three accumulations %g %g", rg_mode_name[m], g[0], g[1]);
        ctpu_zero_grad(x);
        ctpu_scope_end();
        ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    }
    ctpu_set_mode(CTPU_MODE_STRICT);
}
END_TEST

/* A value used twice in a graph gets both contributions (the diamond); a
 * leaf used through a view and directly too (pytorch/pytorch#18773-class). */
static ctpu_tensor f_diamond(const ctpu_tensor *in)
{
    ctpu_tensor h = ctpu_mul_scalar(in[0], 2);
    ctpu_tensor t = ctpu_transpose(in[0], 0, 1);
    return ctpu_add(ctpu_mul(h, h), ctpu_mul(ctpu_contiguous(t), ctpu_transpose(h, 0, 1)));
}
START_TEST(autograd_diamond_and_views)
{
    const float x[4] = { 1, 2, 3, 4 };
    rg_in ix = RG_IN(CTPU_F32, 2, x, 2, 2);
    /* y = (2x)^2 + x^T * (2x)^T summed: dy/dx = 8x + 4x = 12x */
    const double w[4] = { 12, 24, 36, 48 };
    rg_grad_expect("diamond + transposed use", f_diamond, 1, &ix, 4, w, 0);
}
END_TEST


/* ================================================= 19. optimizers against torch.optim, three steps
 * p = [1, -2, 0.5], loss = sum((p * [1, 2, 3])^2), lr 0.1 / 0.01: AdamW's
 * decoupled decay p *= 1 - lr wd before the update (pytorch/pytorch#3740-class
 * weight decay order), Adam's L2 added to the gradient, SGD nesterov with
 * weight decay, SGD dampening not applied at the first step
 * (pytorch/pytorch#6248), plain SGD. torch 1.13's values; ctpu's host
 * coefficients are double, torch's float tensors: within 8 ulps. */
typedef enum { OPT_ADAMW, OPT_ADAM, OPT_SGD_NESTEROV, OPT_SGD_DAMP, OPT_SGD } rg_opt_kind;
static ctpu_optim *rg_opt_make(rg_opt_kind k, ctpu_tensor p)
{
    if (k <= OPT_ADAM) {
        ctpu_adamw_opts o = ctpu_adamw_defaults();
        o.lr = 0.1;
        o.weight_decay = 0.5;
        return k == OPT_ADAMW ? ctpu_adamw_create(1, &p, &o) : ctpu_adam_create(1, &p, &o);
    }
    ctpu_sgd_opts o = { .lr = 0.01 };
    if (k == OPT_SGD_NESTEROV) { o.momentum = 0.9; o.nesterov = true; o.weight_decay = 0.1; }
    if (k == OPT_SGD_DAMP) { o.momentum = 0.9; o.dampening = 0.5; }
    return ctpu_sgd_create(1, &p, &o);
}
static void rg_opt_run(rg_opt_kind k, int mode, bool capturable, float out[3][3])
{
    ctpu_set_mode((ctpu_mode)mode);
    const float p0[3] = { 1, -2, 0.5f }, c[3] = { 1, 2, 3 };
    ctpu_tensor p = ctpu_keep(t_f32(p0, 1, (const int64_t[]){ 3 }));
    ctpu_tensor ct = ctpu_keep(t_f32(c, 1, (const int64_t[]){ 3 }));
    ck_assert_int_eq(ctpu_set_requires_grad(p, true), CTPU_OK);
    ctpu_optim *o = rg_opt_make(k, p);
    ck_assert_ptr_nonnull(o);
    if (capturable) ck_assert_int_eq(ctpu_optim_set_capturable(o, true), CTPU_OK);
    for (int s = 0; s < 3; s++) {
        ck_assert_int_eq(ctpu_optim_zero_grad(o), CTPU_OK);
        ctpu_step_begin();
        ctpu_tensor pc = ctpu_mul(p, ct);
        ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(pc, pc), 0, NULL, false)), CTPU_OK);
        ck_assert_int_eq(ctpu_optim_step(o), CTPU_OK);
        ctpu_step_end();
        ck_assert_int_eq(ctpu_to_host(p, out[s], sizeof out[s]), CTPU_OK);
    }
    ctpu_optim_free(o);
    ctpu_zero_grad(p);
    ctpu_release(p);
    ctpu_release(ct);
    ctpu_set_mode(CTPU_MODE_STRICT);
}
START_TEST(optimizers_match_torch)
{
    static const double want[5][3][3] = {
        { { 0.8500000238418579, -1.7999999523162842, 0.375 }, { 0.7082484364509583, -1.6104121208190918, 0.2579924762248993 },
          { 0.5749739408493042, -1.4310251474380493, 0.15050262212753296 } },
        { { 0.8999999761581421, -1.899999976158142, 0.4000000059604645 }, { 0.8004121780395508, -1.8001664876937866, 0.3011874258518219 },
          { 0.7015862464904785, -1.7006233930587769, 0.204871267080307 } },
        { { 0.960099995136261, -1.692199945449829, 0.32805001735687256 }, { 0.9047819972038269, -1.3005504608154297, 0.14192862808704376 },
          { 0.837040901184082, -0.8712725043296814, -0.02095051109790802 } },
        { { 0.9800000190734863, -1.840000033378601, 0.4099999964237213 }, { 0.9521999955177307, -1.6224000453948975, 0.2921000123023987 },
          { 0.9176579713821411, -1.361664056777954, 0.15970103442668915 } },
        { { 0.9800000190734863, -1.840000033378601, 0.4099999964237213 }, { 0.9604000449180603, -1.6928000450134277, 0.3361999988555908 },
          { 0.9411920309066772, -1.5573760271072388, 0.2756839990615845 } },
    };
    static const char *const names[5] = { "adamw", "adam (L2)", "sgd nesterov + wd", "sgd dampening", "sgd" };
    for (int k = 0; k < 5; k++) {
        float ref[3][3], got[3][3];
        rg_opt_run((rg_opt_kind)k, 0, false, ref);
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < 3; i++)
                ck_assert_msg(t_ulps(ref[s][i], (float)want[k][s][i]) <= 8, "%s step %d p[%d] = %.9g, torch %.9g",
                              names[k], s, i, ref[s][i], want[k][s][i]);
        for (int m = 1; m < 3; m++) {
            rg_opt_run((rg_opt_kind)k, m, false, got);
            ck_assert_msg(memcmp(got, ref, sizeof ref) == 0, "%s [%s] differs from strict", names[k], rg_mode_name[m]);
        }
        /* capturable: the coefficients are f32 device ops, as torch's capturable form (CUDA-only in torch
         * 1.13): 1 - 0.999^t in f32 cancels (3e-5 relative at t = 2), so within 1e-5 of torch's eager
         * values (ctpu_nn.h says so); equal in every mode */
        float cap0[3][3];
        for (int m = 0; m < 3; m++) {
            rg_opt_run((rg_opt_kind)k, m, true, got);
            if (m == 0) memcpy(cap0, got, sizeof got);
            ck_assert_msg(memcmp(got, cap0, sizeof got) == 0, "%s capturable [%s] differs from strict", names[k],
                          rg_mode_name[m]);
            for (int s = 0; s < 3; s++)
                for (int i = 0; i < 3; i++)
                    ck_assert_msg(fabs(got[s][i] - want[k][s][i]) <= 1e-5, "%s capturable [%s] step %d p[%d] = %.9g, torch %.9g",
                                  names[k], rg_mode_name[m], s, i, got[s][i], want[k][s][i]);
        }
    }
}
END_TEST

/* ================================================= 20. clip_grad_norm edge totals
 * torch: grads [3, 4], max 1: total 5, grads scaled by 1 / (5 + 1e-6); zero
 * grads: total 0, unchanged (no 0/0); an inf gradient: total inf, grads
 * [nan, 0] (error_if_nonfinite=False; pytorch/pytorch#31474); norm_type inf:
 * max |g|. */
START_TEST(clip_grad_norm_edges)
{
    const struct { float g[2]; double norm_type, total, out[2]; } cs[4] = {
        { { 3, 4 }, 2, 5, { 0.5999999046325684, 0.7999998331069946 } },
        { { 0, 0 }, 2, 0, { 0, 0 } },
        { { INFINITY, 1 }, 2, INFINITY, { NAN, 0 } },
        { { 3, 4 }, INFINITY, 4, { 0.7499998211860657, 0.9999997615814209 } },
    };
    ctpu_set_debug_checks(false);
    for (int m = 0; m < 3; m++) {
        ctpu_set_mode((ctpu_mode)m);
        for (int c = 0; c < 4; c++) {
            ctpu_scope_begin();
            ctpu_tensor p = T_VEC(0, 0);
            ck_assert_int_eq(ctpu_set_requires_grad(p, true), CTPU_OK);
            ctpu_tensor gin = t_f32(cs[c].g, 1, (const int64_t[]){ 2 });
            ck_assert_int_eq(ctpu_backward_with(ctpu_mul(p, ctpu_ones_like(p)), gin), CTPU_OK);
            ctpu_tensor tot = ctpu_clip_grad_norm(1, &p, 1.0, cs[c].norm_type);
            double t;
            ck_assert_int_eq(ctpu_item(tot, &t), CTPU_OK);
            float g[2];
            ck_assert_int_eq(ctpu_to_host(ctpu_grad(p), g, sizeof g), CTPU_OK);
            ck_assert_msg(rg_close((float)t, cs[c].total, 1), "[%s] case %d total %g, torch %g", rg_mode_name[m], c, t,
                          cs[c].total);
            for (int i = 0; i < 2; i++)
                ck_assert_msg(rg_close(g[i], cs[c].out[i], 2), "[%s] case %d g[%d] = %.9g, torch %.9g", rg_mode_name[m], c,
                              i, g[i], cs[c].out[i]);
            ctpu_zero_grad(p);
            ctpu_scope_end();
        }
    }
    ctpu_set_mode(CTPU_MODE_STRICT);
}
END_TEST


/* ================================================= 21. in-place on aliases: a = a + a^T, a = a^T; reshape of views
 * torch: a += a.T reads a's old values everywhere (torch errors on the
 * overlapping in-place form, pytorch/pytorch#8212; out-of-place it is
 * a + a^T); a fused in-place write must not clobber what a transposed read
 * still needs (pytorch/xla#2267-class aliasing in lazy traces). Reshape of a
 * transposed / permuted / strided view reads the view's order
 * (pytorch/pytorch#2530-class view-vs-reshape bugs). 64 x 48 so that fused
 * blocks and threads split the matrix. */
#define AR 48
static void rg_inplace_alias(int m, float *out_sum, float *out_t)
{
    static float a0[AR * AR];
    for (int i = 0; i < AR * AR; i++) a0[i] = (float)(i % 97) - 40;
    ctpu_set_mode((ctpu_mode)m);
    ctpu_scope_begin();
    ctpu_tensor a = t_f32(a0, 2, (const int64_t[]){ AR, AR });
    ctpu_tensor b = t_f32(a0, 2, (const int64_t[]){ AR, AR });
    ctpu_tensor c = t_f32(a0, 2, (const int64_t[]){ AR, AR });
    ck_assert_int_eq(ctpu_assign(a, ctpu_add(a, ctpu_transpose(a, 0, 1))), CTPU_OK);
    ck_assert_int_eq(ctpu_assign(b, ctpu_transpose(b, 0, 1)), CTPU_OK);
    /* c = 2 c^T - c, then c = c^T again in the same trace */
    ck_assert_int_eq(ctpu_assign(c, ctpu_sub(ctpu_mul_scalar(ctpu_transpose(c, 0, 1), 2), c)), CTPU_OK);
    ck_assert_int_eq(ctpu_assign(c, ctpu_contiguous(ctpu_transpose(c, 0, 1))), CTPU_OK);
    ck_assert_int_eq(ctpu_to_host(a, out_sum, sizeof(float) * AR * AR), CTPU_OK);
    ck_assert_int_eq(ctpu_to_host(b, out_t, sizeof(float) * AR * AR), CTPU_OK);
    static float gc[AR * AR];
    ck_assert_int_eq(ctpu_to_host(c, gc, sizeof gc), CTPU_OK);
    for (int i = 0; i < AR; i++)
        for (int j = 0; j < AR; j++) {
            float x = a0[i * AR + j], xt = a0[j * AR + i];
            ck_assert_msg(out_sum[i * AR + j] == x + xt, "[%s] a = a + a^T at (%d,%d): %g, want %g", rg_mode_name[m], i,
                          j, out_sum[i * AR + j], x + xt);
            ck_assert_msg(out_t[i * AR + j] == xt, "[%s] a = a^T at (%d,%d): %g, want %g", rg_mode_name[m], i, j,
                          out_t[i * AR + j], xt);
            /* c1 = 2 c0^T - c0; c2 = c1^T = 2 c0 - c0^T */
            ck_assert_msg(gc[i * AR + j] == 2 * x - xt, "[%s] c at (%d,%d): %g, want %g", rg_mode_name[m], i, j,
                          gc[i * AR + j], 2 * x - xt);
        }
    ctpu_scope_end();
    ctpu_set_mode(CTPU_MODE_STRICT);
}
START_TEST(inplace_assign_through_transposed_alias)
{
    static float s[AR * AR], t[AR * AR];
    for (int m = 0; m < 3; m++) rg_inplace_alias(m, s, t);
}
END_TEST

static ctpu_tensor f_reshape_t(const ctpu_tensor *in)
{
    return ctpu_reshape(ctpu_transpose(in[0], 0, 1), 1, (const int64_t[]){ -1 });
}
static ctpu_tensor f_flatten_perm(const ctpu_tensor *in)
{
    return ctpu_flatten(ctpu_permute(in[0], (const int[]){ 2, 0, 1 }), 0, 2);
}
static ctpu_tensor f_reshape_slice(const ctpu_tensor *in)
{
    return ctpu_reshape(ctpu_slice(in[0], 1, 1, 4, 2), 1, (const int64_t[]){ -1 });
}
static ctpu_tensor f_expand_reshape(const ctpu_tensor *in)
{
    return ctpu_reshape(ctpu_expand(in[0], 2, (const int64_t[]){ 3, 2 }), 1, (const int64_t[]){ 6 });
}
START_TEST(reshape_of_noncontiguous_views)
{
    const float x[6] = { 0, 1, 2, 3, 4, 5 };
    rg_in i23 = RG_IN(CTPU_F32, 2, x, 2, 3);
    const double wt[6] = { 0, 3, 1, 4, 2, 5 };
    rg_expect("reshape(transpose)", f_reshape_t, 1, &i23, 6, wt, 0);
    float y[24];
    for (int i = 0; i < 24; i++) y[i] = (float)i;
    rg_in i234 = RG_IN(CTPU_F32, 3, y, 2, 3, 4);
    double wp[24];
    for (int k = 0, n = 0; k < 4; k++)   /* permute(2, 0, 1): [4, 2, 3] */
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) wp[n++] = i * 12 + j * 4 + k;
    rg_expect("flatten(permute)", f_flatten_perm, 1, &i234, 24, wp, 0);
    rg_in i24 = RG_IN(CTPU_F32, 2, y, 2, 4);
    const double ws[4] = { 1, 3, 5, 7 };
    rg_expect("reshape(slice step 2)", f_reshape_slice, 1, &i24, 4, ws, 0);
    rg_in i12 = RG_IN(CTPU_F32, 2, x, 1, 2);
    const double we[6] = { 0, 1, 0, 1, 0, 1 };
    rg_expect("reshape(expand)", f_expand_reshape, 1, &i12, 6, we, 0);
    rg_grad_expect("reshape(transpose)", f_reshape_t, 1, &i23, 6, (const double[]){ 1, 1, 1, 1, 1, 1 }, 0);
}
END_TEST

/* A trace reading a tensor that is assigned later in the same trace reads
 * the old value (defer and fuse; pytorch/xla#1991-class mutation ordering). */
START_TEST(read_before_assign_in_one_trace)
{
    for (int m = 0; m < 3; m++) {
        ctpu_set_mode((ctpu_mode)m);
        ctpu_scope_begin();
        ctpu_tensor w = T_VEC(1, 2, 3);
        ctpu_tensor y = ctpu_mul_scalar(w, 2);
        ck_assert_int_eq(ctpu_assign(w, ctpu_full(CTPU_F32, 1, (const int64_t[]){ 3 }, 10)), CTPU_OK);
        ctpu_tensor z = ctpu_add(w, y);
        float gy[3], gz[3];
        ck_assert_int_eq(ctpu_to_host(y, gy, sizeof gy), CTPU_OK);
        ck_assert_int_eq(ctpu_to_host(z, gz, sizeof gz), CTPU_OK);
        for (int i = 0; i < 3; i++) {
            ck_assert_msg(gy[i] == 2 * (i + 1), "[%s] y[%d] = %g: read after the assign", rg_mode_name[m], i, gy[i]);
            ck_assert_msg(gz[i] == 10 + 2 * (i + 1), "[%s] z[%d] = %g", rg_mode_name[m], i, gz[i]);
        }
        ctpu_scope_end();
    }
    ctpu_set_mode(CTPU_MODE_STRICT);
}
END_TEST


/* ================================================= 22. compiled steps: guards, mutation, aliasing, freed captures
 * torch.compile-class bugs: a changed scalar argument must not replay the
 * old value (pytorch/pytorch#100455-class missing guards on Python
 * scalars); a changed dtype must recompile (pytorch/pytorch#93749-class);
 * a tensor mutated between calls must be read anew (pytorch/pytorch#91555:
 * stale captured tensor in CUDA graphs / cudagraph trees); two inputs that
 * alias at the capture but not later (pytorch/pytorch#96219-class aliasing
 * guards); an input returned as an output; a captured tensor released
 * between calls (pytorch/pytorch#102302-class freed weakref in guards). */
static ctpu_tensor rg_W;     /* a parameter the step reads (made before the call) */
static int rg_fn_runs;
static ctpu_status st_scale(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    rg_fn_runs++;
    out[0] = ctpu_add_scalar(ctpu_mul(in[0], rg_W), sc[0]);
    return ctpu_is_null(out[0]) ? ctpu_last_status() : CTPU_OK;
}
static ctpu_status st_two(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx; (void)sc;
    rg_fn_runs++;
    out[0] = ctpu_sub(ctpu_mul_scalar(in[0], 3), in[1]);
    return ctpu_is_null(out[0]) ? ctpu_last_status() : CTPU_OK;
}
static ctpu_status st_ident(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx; (void)sc;
    rg_fn_runs++;
    out[0] = in[0];
    out[1] = ctpu_add_scalar(in[0], 1);
    out[2] = ctpu_detach(in[0]);
    out[3] = ctpu_reshape(in[0], 2, (const int64_t[]){ 1, 3 });
    out[4] = ctpu_contiguous(in[0]);
    out[5] = ctpu_transpose(ctpu_reshape(in[0], 2, (const int64_t[]){ 3, 1 }), 0, 1);
    out[6] = ctpu_reshape(rg_W, 2, (const int64_t[]){ 3, 1 });   /* a view of a tensor the step reads */
    out[7] = ctpu_add(rg_W, in[0]);
    return CTPU_OK;
}
static void rg_vals(ctpu_tensor t, float *v, int n)
{
    ck_assert_msg(ctpu_to_host_as_f32(t, v, sizeof(float) * (size_t)n) == CTPU_OK, "%s", ctpu_last_error());
}
START_TEST(compiled_guards_mutation_aliasing)
{
    int64_t n3 = 3;
    rg_W = ctpu_keep(T_VEC(1, 2, 3));
    ctpu_compiled *c = ctpu_compile(st_scale, NULL, NULL);
    float v[3];
    rg_fn_runs = 0;
    for (int call = 0; call < 6; call++) {
        ctpu_scope_begin();
        ctpu_tensor x = T_VEC(1, 1, 1), out = CTPU_NULL;
        double sc = call < 3 ? 0.5 : 0.25 * call;   /* a new value from call 3 on */
        if (call == 4) ck_assert_int_eq(ctpu_assign(rg_W, T_VEC(10, 20, 30)), CTPU_OK);   /* mutated eagerly */
        ck_assert_msg(ctpu_compiled_call(c, 1, &x, 1, &sc, 1, &out) == CTPU_OK, "%s", ctpu_last_error());
        rg_vals(out, v, 3);
        const float w = call >= 4 ? 10 : 1;
        for (int i = 0; i < 3; i++)
            ck_assert_msg(v[i] == (float)(w * (i + 1) + sc), "call %d: element %d is %g, want %g", call, i, v[i],
                          w * (i + 1) + sc);
        ctpu_scope_end();
    }
    /* an f32 input replaced by bf16: a guard failure, recaptured, computed in bf16 */
    ctpu_scope_begin();
    const float xb[3] = { 1, 1, 1 };
    ctpu_tensor xh = ctpu_from_host_f32_as_bf16(xb, 1, &n3), out = CTPU_NULL;
    double sc = 0.5;
    int runs = rg_fn_runs;
    ck_assert_msg(ctpu_compiled_call(c, 1, &xh, 1, &sc, 1, &out) == CTPU_OK, "%s", ctpu_last_error());
    ck_assert_int_eq(rg_fn_runs, runs + 1);
    ctpu_compiled_info info;
    ctpu_compiled_get_info(c, &info);
    ck_assert_msg(t_contains(info.last_reason, "input 0"), "guard reason: %s", info.last_reason);
    rg_vals(out, v, 3);
    ck_assert_msg(v[0] == 10.5f && v[1] == 20.5f && v[2] == 30.5f, "bf16 call: %g %g %g", v[0], v[1], v[2]);
    ctpu_scope_end();
    /* the captured W released: the next call must not read its old storage */
    ck_assert_int_eq(ctpu_release(rg_W), CTPU_OK);
    ctpu_scope_begin();
    ctpu_tensor x = T_VEC(1, 1, 1);
    ctpu_status st = ctpu_compiled_call(c, 1, &x, 1, &sc, 1, &out);
    ck_assert_msg(st != CTPU_OK, "a call after its captured tensor was released succeeded (read freed storage)");
    ck_assert_msg(t_contains(ctpu_last_error(), "released") || t_contains(ctpu_last_error(), "stale"), "%s",
                  ctpu_last_error());
    ctpu_scope_end();
    ctpu_compiled_free(c);
    ctpu_clear_error();

    /* inputs aliasing: the same tensor twice at the capture, two tensors later, and back */
    c = ctpu_compile(st_two, NULL, NULL);
    for (int call = 0; call < 5; call++) {
        ctpu_scope_begin();
        ctpu_tensor a = T_VEC(1, 2, 3), b = T_VEC(5, 5, 5);
        ctpu_tensor in[2] = { a, (call == 0 || call == 1 || call == 4) ? a : b };
        ck_assert_msg(ctpu_compiled_call(c, 2, in, 0, NULL, 1, &out) == CTPU_OK, "%s", ctpu_last_error());
        rg_vals(out, v, 3);
        for (int i = 0; i < 3; i++) {
            float want = 3.0f * (float)(i + 1) - (in[1].id == a.id ? (float)(i + 1) : 5.0f);
            ck_assert_msg(v[i] == want, "aliasing call %d: element %d is %g, want %g", call, i, v[i], want);
        }
        ctpu_scope_end();
    }
    ctpu_compiled_free(c);

    /* an input returned as an output, and views of it and of a parameter (torch.compile regenerates
     * output views of inputs: pytorch/pytorch#93472-class "output aliases input" bugs): each call
     * returns views of that call's storage */
    rg_W = ctpu_keep(T_VEC(100, 100, 100));
    c = ctpu_compile(st_ident, NULL, NULL);
    for (int call = 0; call < 4; call++) {
        ctpu_scope_begin();
        ck_assert_int_eq(ctpu_assign(rg_W, ctpu_full(CTPU_F32, 1, &n3, 100.0 * call)), CTPU_OK);
        ctpu_tensor a = ctpu_full(CTPU_F32, 1, &n3, (double)call), o2[8];
        ck_assert_msg(ctpu_compiled_call(c, 1, &a, 0, NULL, 8, o2) == CTPU_OK, "%s", ctpu_last_error());
        rg_vals(o2[6], v, 3);
        ck_assert_msg(v[0] == 100.0f * call, "call %d: reshape(W) holds %g, W is %g", call, v[0], 100.0 * call);
        rg_vals(o2[7], v, 3);
        ck_assert_msg(v[0] == 101.0f * call, "call %d: W + in holds %g", call, v[0]);
        static const char *const what[6] = { "the input", "input + 1", "detach(input)", "reshape(input)",
                                             "contiguous(input)", "transpose(reshape(input))" };
        for (int j = 0; j < 6; j++) {
            rg_vals(o2[j], v, 3);
            ck_assert_msg(v[0] == (float)call + (j == 1), "call %d: out[%d] = %s holds %g (a stale capture value?)",
                          call, j, what[j], v[0]);
        }
        ctpu_scope_end();
    }
    ctpu_compiled_get_info(c, &info);
    ck_assert_msg(info.replays >= 2, "views of inputs: %d replays of 4 calls (%s)", (int)info.replays, info.last_reason);
    ctpu_compiled_free(c);
    ctpu_release(rg_W);
}
END_TEST


/* ================================================= 23. dynamic dims at 0 and 1, empty mark_step
 * torch.compile specialises sizes 0 and 1 (a dynamic dim of extent 1
 * broadcasts differently: pytorch/pytorch#105634, #104853 "0/1
 * specialization"); ctpu's dynamic range starts at 2 and extents 0 and 1
 * compile their own programs (ctpu.h ctpu_mark_dynamic). Check the values
 * at 5, 1, 0, 3 in defer and fuse and a compiled step against strict; and
 * a mark_step with nothing recorded compiles nothing (pytorch/xla#4404-class
 * empty graph execution). */
static ctpu_status st_dyn(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx; (void)sc;
    ctpu_tensor b = ctpu_add(in[0], in[1]);                       /* [n, 3] + [1, 3] */
    int d0 = 0;
    out[0] = ctpu_concat(2, (ctpu_tensor[]){ ctpu_sum(b, 1, &d0, false), ctpu_max(in[1], 1, &d0, false) }, 0);
    out[1] = ctpu_softmax(b, 1);
    return ctpu_is_null(out[0]) || ctpu_is_null(out[1]) ? ctpu_last_status() : CTPU_OK;
}
START_TEST(dynamic_dims_at_zero_and_one)
{
    const int64_t ns[5] = { 5, 1, 0, 3, 1 };
    const float row[3] = { 0.5f, -1, 2 };
    ctpu_compiled *c = ctpu_compile(st_dyn, NULL, NULL);
    for (int k = 0; k < 5; k++) {
        int64_t n = ns[k];
        float x[15], ref0[6], ref1[15], got[15];
        for (int i = 0; i < n * 3; i++) x[i] = (float)i * 0.25f;
        for (int m = 0; m < 3; m++) {
            ctpu_scope_begin();
            ctpu_tensor in[2] = { t_f32(x, 2, (const int64_t[]){ n, 3 }), t_f32(row, 2, (const int64_t[]){ 1, 3 }) };
            ctpu_tensor out[2] = { CTPU_NULL, CTPU_NULL };
            if (m == 2) {
                ck_assert_int_eq(ctpu_mark_dynamic(in[0], 0, 2, 64), CTPU_OK);
                ck_assert_msg(ctpu_compiled_call(c, 2, in, 0, NULL, 2, out) == CTPU_OK, "n=%lld: %s", (long long)n,
                              ctpu_last_error());
            } else {
                ctpu_set_mode(m == 0 ? CTPU_MODE_STRICT : CTPU_MODE_DEFER_FUSE);
                if (m == 1) ck_assert_int_eq(ctpu_mark_dynamic(in[0], 0, 2, 64), CTPU_OK);
                ck_assert_int_eq(st_dyn(NULL, in, NULL, out), CTPU_OK);
            }
            ck_assert_int_eq(ctpu_numel(out[0]), 6);
            ck_assert_int_eq(ctpu_numel(out[1]), n * 3);
            float *a = m == 0 ? ref0 : got;
            ck_assert_int_eq(ctpu_to_host(out[0], a, sizeof(float) * 6), CTPU_OK);
            if (m) for (int i = 0; i < 6; i++) ck_assert_msg(rg_eq(got[i], ref0[i]), "n=%lld mode %d: sum/max %d: %g vs %g", (long long)n, m, i, got[i], ref0[i]);
            a = m == 0 ? ref1 : got;
            if (n) ck_assert_int_eq(ctpu_to_host(out[1], a, sizeof(float) * (size_t)(n * 3)), CTPU_OK);
            if (m) for (int i = 0; i < n * 3; i++) ck_assert_msg(rg_eq(got[i], ref1[i]), "n=%lld mode %d: softmax %d", (long long)n, m, i);
            ctpu_set_mode(CTPU_MODE_STRICT);
            ctpu_scope_end();
        }
        /* the sums: column sums of x + row over n rows (n = 0: zeros) */
        for (int j = 0; j < 3; j++) {
            double w = 0;
            for (int i = 0; i < n; i++) w += x[i * 3 + j] + row[j];
            ck_assert_msg(ref0[j] == (float)w, "n=%lld: sum %d is %g, want %g", (long long)n, j, ref0[j], w);
        }
    }
    ctpu_compiled_free(c);
    /* an empty mark_step, twice, in defer and fuse: no program */
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    ck_assert_int_eq(ctpu_mark_step(), CTPU_OK);
    int64_t before = ctpu_metric_counter("programs_compiled");
    ck_assert_int_eq(ctpu_mark_step(), CTPU_OK);
    ck_assert_int_eq(ctpu_mark_step(), CTPU_OK);
    ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    ck_assert_int_eq(ctpu_metric_counter("programs_compiled"), before);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ctpu_set_mode(CTPU_MODE_STRICT);
}
END_TEST

/* ================================================= 24. two traces sharing a tensor
 * Thread A records y = 2 w in defer and fuse (pending); thread B assigns w
 * in strict eager before A's trace runs; A must see w's value at its op
 * (pytorch/xla#3314-class: an in-place update reaching a lazy trace that
 * captured the tensor). And two threads' traces reading one tensor at once. */
typedef struct {
    ctpu_tensor w;
    int phase;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} rg_share;
static void rg_wait_phase(rg_share *s, int p)
{
    pthread_mutex_lock(&s->mu);
    while (s->phase < p) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}
static void rg_set_phase(rg_share *s, int p)
{
    pthread_mutex_lock(&s->mu);
    s->phase = p;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}
static void *rg_writer(void *arg)
{
    rg_share *s = arg;
    ctpu_set_thread_mode(CTPU_MODE_STRICT);
    rg_wait_phase(s, 1);
    ctpu_scope_begin();
    ctpu_status st = ctpu_assign(s->w, ctpu_full(CTPU_F32, 1, (const int64_t[]){ 4 }, 7));
    ctpu_scope_end();
    ctpu_sync();
    rg_set_phase(s, 2);
    return (void *)(intptr_t)st;
}
START_TEST(two_traces_share_a_tensor)
{
    rg_share s = { .phase = 0 };
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    s.w = ctpu_keep(T_VEC(1, 2, 3, 4));
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    pthread_t th;
    pthread_create(&th, NULL, rg_writer, &s);
    ctpu_set_thread_mode(CTPU_MODE_DEFER_FUSE);
    ctpu_scope_begin();
    ctpu_tensor y = ctpu_mul_scalar(s.w, 2);     /* recorded, not run */
    rg_set_phase(&s, 1);
    rg_wait_phase(&s, 2);
    ctpu_tensor z = ctpu_mul_scalar(s.w, 3);     /* after the write */
    float gy[4], gz[4];
    ck_assert_int_eq(ctpu_to_host(y, gy, sizeof gy), CTPU_OK);
    ck_assert_int_eq(ctpu_to_host(z, gz, sizeof gz), CTPU_OK);
    void *rv;
    pthread_join(th, &rv);
    ck_assert_int_eq((int)(intptr_t)rv, CTPU_OK);
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(gy[i] == 2.0f * (float)(i + 1), "y[%d] = %g: the trace read w after another thread's assign", i,
                      gy[i]);
        ck_assert_msg(gz[i] == 21, "z[%d] = %g: the trace did not see the assign made before its op", i, gz[i]);
    }
    ctpu_scope_end();
    ctpu_clear_thread_mode();
    /* with no trace pending, an assign writes in place again (the readers' count went back to 0) */
    ctpu_mark_step();
    int64_t inplace = ctpu_metric_counter("assign_in_place");
    ctpu_scope_begin();
    ck_assert_int_eq(ctpu_assign(s.w, ctpu_full(CTPU_F32, 1, (const int64_t[]){ 4 }, 8)), CTPU_OK);
    ctpu_scope_end();
    ck_assert_int_eq(ctpu_metric_counter("assign_in_place"), inplace + 1);
    /* the same in defer and fuse: a training step that reads w and assigns it writes in place */
    ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
    for (int k = 0; k < 2; k++) {
        ctpu_step_begin();
        ck_assert_int_eq(ctpu_assign(s.w, ctpu_mul_scalar(s.w, 0.5)), CTPU_OK);
        ctpu_step_end();
    }
    ctpu_set_mode(CTPU_MODE_STRICT);
    float gw[4];
    ck_assert_int_eq(ctpu_to_host(s.w, gw, sizeof gw), CTPU_OK);
    ck_assert(gw[0] == 2);
    ctpu_release(s.w);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cv);
}
END_TEST

/* ================================================= 25. cache eviction while a program is in use
 * TORCH_TPU_CACHE_SIZE=1: two compiled steps and two defer-and-fuse traces
 * alternate, each evicting the other's program while its launches may still
 * be queued (pytorch/xla#5048-class cache eviction of an executing
 * computation); every result right. */
static ctpu_status st_a(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx; (void)sc;
    out[0] = ctpu_exp(ctpu_mul_scalar(in[0], 0.5));
    return CTPU_OK;
}
static ctpu_status st_b(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx; (void)sc;
    out[0] = ctpu_tanh(ctpu_add_scalar(in[0], 1));
    return CTPU_OK;
}
START_TEST(cache_eviction_while_in_use)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("TORCH_TPU_CACHE_SIZE", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    static float x[4096], ra[4096], rb[4096], g[4096];
    for (int i = 0; i < 4096; i++) x[i] = (float)(i % 61) / 30 - 1;
    ctpu_tensor t = ctpu_keep(t_f32(x, 1, (const int64_t[]){ 4096 }));
    ctpu_to_host(ctpu_exp(ctpu_mul_scalar(t, 0.5)), ra, sizeof ra);
    ctpu_to_host(ctpu_tanh(ctpu_add_scalar(t, 1)), rb, sizeof rb);
    ctpu_compiled *ca = ctpu_compile(st_a, NULL, NULL), *cb = ctpu_compile(st_b, NULL, NULL);
    ctpu_tensor outs[40];
    ctpu_scope_begin();
    for (int k = 0; k < 40; k++) {   /* queued without reading: programs evicted while their launches wait */
        ck_assert_int_eq(ctpu_compiled_call(k % 2 ? cb : ca, 1, &t, 0, NULL, 1, &outs[k]), CTPU_OK);
        if (k % 5 == 4) {
            ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
            ctpu_tensor y = k % 2 ? ctpu_tanh(ctpu_add_scalar(t, 1)) : ctpu_exp(ctpu_mul_scalar(t, 0.5));
            ctpu_mark_step();
            ctpu_to_host(y, g, sizeof g);
            for (int i = 0; i < 4096; i++) ck_assert(g[i] == (k % 2 ? rb[i] : ra[i]));
            ctpu_set_mode(CTPU_MODE_STRICT);
        }
    }
    for (int k = 0; k < 40; k++) {
        ck_assert_int_eq(ctpu_to_host(outs[k], g, sizeof g), CTPU_OK);
        for (int i = 0; i < 4096; i++)
            ck_assert_msg(g[i] == (k % 2 ? rb[i] : ra[i]), "call %d element %d: %g", k, i, g[i]);
    }
    ctpu_scope_end();
    ctpu_cache_info info;
    ctpu_cache_get_info(&info);
    ck_assert_msg(info.evictions > 0, "no eviction happened (capacity %llu)", (unsigned long long)info.capacity);
    ctpu_compiled_free(ca);
    ctpu_compiled_free(cb);
    ctpu_release(t);
}
END_TEST

/* ================================================= 26. RNG: same seed, same bits across threads and ISAs
 * jax-ml/jax#9159-class (different random bits across devices / sharding),
 * pytorch/pytorch#61227-class (CPU RNG depends on the thread count):
 * rand_normal, rand_uniform, randint and dropout after manual_seed are the
 * same at 1, 2 and 3 kernel threads and in every mode. */
static void rg_draws(float *out, int n)
{
    ctpu_manual_seed(42);
    int64_t s = n / 4;
    ctpu_scope_begin();
    ctpu_tensor a = ctpu_rand_normal(CTPU_F32, 1, &s, 0, 1);
    ctpu_tensor b = ctpu_rand_uniform(CTPU_F32, 1, &s, -2, 3);
    ctpu_tensor c = ctpu_randint(CTPU_F32, 1, &s, -1000, 1000);
    ctpu_tensor d = ctpu_dropout(ctpu_ones(CTPU_F32, 1, &s), 0.3, true);
    ctpu_to_host(a, out, sizeof(float) * (size_t)s);
    ctpu_to_host(b, out + s, sizeof(float) * (size_t)s);
    ctpu_to_host(c, out + 2 * s, sizeof(float) * (size_t)s);
    ctpu_to_host(d, out + 3 * s, sizeof(float) * (size_t)s);
    ctpu_scope_end();
}
START_TEST(rng_same_bits_across_threads_and_modes)
{
    enum { N = 4 * 50001 };
    static float ref[N], got[N];
    rg_draws(ref, N);
    for (int m = 1; m < 3; m++) {
        ctpu_set_mode((ctpu_mode)m);
        rg_draws(got, N);
        ck_assert_msg(memcmp(got, ref, sizeof ref) == 0, "draws differ in mode %s", rg_mode_name[m]);
    }
    ctpu_set_mode(CTPU_MODE_STRICT);
    for (int nt = 1; nt <= 3; nt++) {
        ctpu_shutdown();
        t_clear_env();
        char b[4];
        snprintf(b, sizeof b, "%d", nt);
        setenv("CTPU_NUM_THREADS", b, 1);
        ck_assert_int_eq(ctpu_init(), CTPU_OK);
        rg_draws(got, N);
        ck_assert_msg(memcmp(got, ref, sizeof ref) == 0, "draws differ at %d threads", nt);
        ctpu_set_mode(CTPU_MODE_DEFER_FUSE);
        rg_draws(got, N);
        ck_assert_msg(memcmp(got, ref, sizeof ref) == 0, "draws differ at %d threads, defer and fuse", nt);
        ctpu_set_mode(CTPU_MODE_STRICT);
    }
}
END_TEST


/* ================================================= 27. loss and activation gradients at their edges
 * torch: an ignored row's cross-entropy gradient is 0, with label smoothing
 * too (pytorch/pytorch#63004); bce_with_logits stays finite at +-100
 * (log-sum-exp form, pytorch/pytorch#751-class); embedding's gradient adds
 * repeated indices (pytorch/pytorch#26445-class scatter without
 * accumulation); expand's gradient sums the broadcast rows; log_softmax /
 * softmax gradients at a -inf logit are 0 (not NaN); leaky_relu'(0) = slope,
 * elu'(0) = 1, l1'(0) = 0, var' of a constant row 0, var' of one element
 * (correction 1) NaN. */
static ctpu_tensor f_ce_logits(const ctpu_tensor *in) { return ce_with(in, CTPU_REDUCE_MEAN, 0); }
static ctpu_tensor f_ce_ls02(const ctpu_tensor *in) { return ce_with(in, CTPU_REDUCE_MEAN, 0.2); }
static ctpu_tensor rg_labels;
static ctpu_tensor f_ce_fixed(const ctpu_tensor *in)
{
    ctpu_tensor t[2] = { in[0], rg_labels };
    return f_ce_logits(t);
}
static ctpu_tensor f_ce_ls_fixed(const ctpu_tensor *in)
{
    ctpu_tensor t[2] = { in[0], rg_labels };
    return f_ce_ls02(t);
}
static ctpu_tensor f_bce(const ctpu_tensor *in) { return ctpu_bce_with_logits(in[0], in[1], CTPU_REDUCE_NONE); }
static ctpu_tensor rg_idx;
static ctpu_tensor f_emb(const ctpu_tensor *in) { return ctpu_embedding(in[0], rg_idx); }
static ctpu_tensor f_expand_w(const ctpu_tensor *in)
{
    ctpu_tensor w = ctpu_reshape(ctpu_arange(0, 12, 1, CTPU_F32), 2, (const int64_t[]){ 4, 3 });
    return ctpu_mul(ctpu_expand(in[0], 2, (const int64_t[]){ 4, 3 }), w);
}
static ctpu_tensor f_lsm0(const ctpu_tensor *in) { return ctpu_slice(ctpu_log_softmax(in[0], 1), 1, 0, 1, 1); }
static ctpu_tensor f_leaky(const ctpu_tensor *in) { return ctpu_leaky_relu(in[0], 0.1); }
static ctpu_tensor rg_zero2;
static ctpu_tensor f_l1(const ctpu_tensor *in) { return ctpu_l1_loss(in[0], rg_zero2, CTPU_REDUCE_MEAN); }
static ctpu_tensor f_var_row(const ctpu_tensor *in) { int d = 1; return ctpu_var(in[0], 1, &d, 1, false); }
START_TEST(loss_and_activation_gradient_edges)
{
    const float lg[6] = { 1, 2, 3, 1, 0, -1 };
    rg_in il = RG_IN(CTPU_F32, 2, lg, 2, 3);
    rg_labels = ctpu_keep(t_i32(ce_one_ign, 1, (const int64_t[]){ 2 }));
    const double wce[6] = { 0.09003058075904846, 0.24472849071025848, -0.334758996963501, 0, 0, 0 };
    rg_grad_expect("cross_entropy, one row ignored", f_ce_fixed, 1, &il, 6, wce, 4);
    const double wls[6] = { 0.023363910615444183, 0.1780618131160736, -0.2014256715774536, 0, 0, 0 };
    rg_grad_expect("cross_entropy ls 0.2, one row ignored", f_ce_ls_fixed, 1, &il, 6, wls, 16);
    ctpu_release(rg_labels);
    const float bx[4] = { 100, -100, 0, 30 }, by[4] = { 1, 0, 0.5f, 1 };
    rg_in ib[2] = { RG_IN(CTPU_F32, 2, bx, 1, 4), RG_IN(CTPU_F32, 2, by, 1, 4) };
    const double wb[4] = { 0, 0, 0.6931471824645996, 0 };
    rg_expect("bce_with_logits at +-100", f_bce, 2, ib, 4, wb, 2);
    const float w[6] = { 1, 2, 3, 4, 5, 6 };
    rg_in iw = RG_IN(CTPU_F32, 2, w, 3, 2);
    rg_idx = ctpu_keep(t_i32((const int32_t[]){ 0, 2, 0, 0 }, 1, (const int64_t[]){ 4 }));
    const double we[6] = { 3, 3, 0, 0, 1, 1 };
    rg_grad_expect("embedding, repeated indices", f_emb, 1, &iw, 6, we, 0);
    ctpu_release(rg_idx);
    const float a[3] = { 1, 2, 3 };
    rg_in ia = RG_IN(CTPU_F32, 2, a, 1, 3);
    const double wx[3] = { 18, 22, 26 };
    rg_grad_expect("expand", f_expand_w, 1, &ia, 3, wx, 0);
    const float ni[2] = { 0, NEG_INF };
    rg_in ini = RG_IN(CTPU_F32, 2, ni, 1, 2);
    const double z2[2] = { 0, 0 };
    rg_grad_expect("log_softmax at -inf", f_lsm0, 1, &ini, 2, z2, 0);
    rg_grad_expect("softmax at -inf", f_softmax, 1, &ini, 2, z2, 0);
    const float k[3] = { 0, 1, -1 };
    rg_in ik = RG_IN(CTPU_F32, 1, k, 3);
    { const double wl[3] = { 0.1, 1, 0.1 }; rg_grad_expect("leaky_relu at 0", f_leaky, 1, &ik, 3, wl, 0); }
    { const double wl[3] = { 1, 1, 0.3678794503211975 }; rg_grad_expect("elu at 0", f_elu, 1, &ik, 3, wl, 1); }
    rg_zero2 = ctpu_keep(ctpu_zeros(CTPU_F32, 1, (const int64_t[]){ 2 }));
    const float l0[2] = { 0, 1 };
    rg_in il0 = RG_IN(CTPU_F32, 1, l0, 2);
    { const double wl[2] = { 0, 0.5 }; rg_grad_expect("l1 at 0", f_l1, 1, &il0, 2, wl, 0); }
    ctpu_release(rg_zero2);
    const float cst[2] = { 1, 1 };
    rg_in ic = RG_IN(CTPU_F32, 2, cst, 1, 2);
    rg_grad_expect("var of a constant row", f_var_row, 1, &ic, 2, z2, 0);
    const float one[1] = { 3 };
    rg_in i1 = RG_IN(CTPU_F32, 2, one, 1, 1);
    rg_no_debug_checks();
    { const double wn[1] = { NAN }; rg_grad_expect("var of one element (correction 1)", f_var_row, 1, &i1, 1, wn, 0); }
}
END_TEST

/* ================================================= 28. shapes: matmul broadcasting, slices, concat, squeeze, scatter
 * torch: [2,1,3,4] @ [5,4,2] is [2,5,3,2]; [3] @ [3,2] is [2]; [2,3] @ [3]
 * is [2]; [4,2,3] @ [3] is [4,2] (pytorch/pytorch#4795-class 1-D
 * promotion); x[3:1] is empty, x[-100:100:2] clamps, a concat with an empty
 * tensor keeps the other; squeeze of a non-1 dim keeps the shape;
 * scatter_add accumulates duplicate indices. */
static ctpu_tensor f_emb2(const ctpu_tensor *in) { return ctpu_embedding(in[0], in[1]); }
static ctpu_tensor f_slice_empty(const ctpu_tensor *in) { return ctpu_slice(in[0], 0, 3, 1, 1); }
static ctpu_tensor f_slice_clamp(const ctpu_tensor *in) { return ctpu_slice(in[0], 0, -100, 100, 2); }
static ctpu_tensor f_cat_empty(const ctpu_tensor *in) { return ctpu_concat(2, in, 0); }
static ctpu_tensor f_squeeze0(const ctpu_tensor *in) { return ctpu_squeeze(in[0], 0); }
static ctpu_tensor f_scatter(const ctpu_tensor *in) { return ctpu_scatter_add(in[0], 0, in[1], in[2]); }
START_TEST(shape_rules_matmul_slice_concat_scatter)
{
    static float ones[64];
    for (int i = 0; i < 64; i++) ones[i] = 1;
    struct { int na, nb; int64_t sa[4], sb[4]; int nd; int64_t want[4]; } mm[4] = {
        { 4, 3, { 2, 1, 3, 4 }, { 5, 4, 2 }, 4, { 2, 5, 3, 2 } },
        { 1, 2, { 3 }, { 3, 2 }, 1, { 2 } },
        { 2, 1, { 2, 3 }, { 3 }, 1, { 2 } },
        { 3, 1, { 4, 2, 3 }, { 3 }, 2, { 4, 2 } },
    };
    for (int c = 0; c < 4; c++) {
        rg_in in[2] = { { CTPU_F32, mm[c].na, { mm[c].sa[0], mm[c].sa[1], mm[c].sa[2], mm[c].sa[3] }, ones },
                        { CTPU_F32, mm[c].nb, { mm[c].sb[0], mm[c].sb[1], mm[c].sb[2], mm[c].sb[3] }, ones } };
        rg_expect_shape(f_matmul, 2, in, mm[c].nd, mm[c].want);
        int64_t n = t_numel(mm[c].nd, mm[c].want);
        double want[64];
        for (int64_t i = 0; i < n; i++) want[i] = (double)(mm[c].na == 1 ? mm[c].sa[0] : mm[c].sa[mm[c].na - 1]);
        rg_expect("matmul broadcast / 1-D", f_matmul, 2, in, n, want, 0);
    }
    const float x[5] = { 0, 1, 2, 3, 4 };
    rg_in ix = RG_IN(CTPU_F32, 1, x, 5);
    rg_expect("x[3:1]", f_slice_empty, 1, &ix, 0, NULL, 0);
    const double wc[3] = { 0, 2, 4 };
    rg_expect("x[-100:100:2]", f_slice_clamp, 1, &ix, 3, wc, 0);
    rg_in ce[2] = { RG_IN(CTPU_F32, 2, x, 0, 2), RG_IN(CTPU_F32, 2, ones, 1, 2) };
    const double w1[2] = { 1, 1 };
    rg_expect("concat with an empty tensor", f_cat_empty, 2, ce, 2, w1, 0);
    rg_in isq = RG_IN(CTPU_F32, 2, ones, 2, 3);
    rg_expect_shape(f_squeeze0, 1, &isq, 2, (const int64_t[]){ 2, 3 });
    const float sf[4] = { 1, 2, 3, 4 }, src[4] = { 10, 20, 30, 40 };
    const int32_t si[4] = { 1, 1, 1, 0 };
    rg_in sc[3] = { RG_IN(CTPU_F32, 2, sf, 2, 2), RG_IN(CTPU_I32, 2, si, 2, 2), RG_IN(CTPU_F32, 2, src, 2, 2) };
    const double ws[4] = { 1, 42, 43, 24 };
    rg_expect("scatter_add duplicates", f_scatter, 3, sc, 4, ws, 0);
    /* an index out of range: a device fault naming scatter_add, in every mode */
    const int32_t bad[4] = { 1, 2, 0, 0 };
    rg_in sb[3] = { RG_IN(CTPU_F32, 2, sf, 2, 2), RG_IN(CTPU_I32, 2, bad, 2, 2), RG_IN(CTPU_F32, 2, src, 2, 2) };
    rg_expect_error("scatter_add index 2 of 2", f_scatter, 3, sb, CTPU_ERR_DEVICE_FAULT, "scatter_add");
    /* embedding with a negative index: a fault, not a read before the table */
    const float w[6] = { 1, 2, 3, 4, 5, 6 };
    const int32_t ng[2] = { 0, -1 };
    rg_in ie[2] = { RG_IN(CTPU_F32, 2, w, 3, 2), RG_IN(CTPU_I32, 1, ng, 2) };
    rg_expect_error("embedding index -1", f_emb2, 2, ie, CTPU_ERR_DEVICE_FAULT, "embedding");
}
END_TEST


/* ================================================= 29. parameter groups, NaN gradients, schedules
 * torch: AdamW's decoupled decay uses the group's lr (lr * scale * wd,
 * pytorch/pytorch#50271-class per-group decay), a group with decay 0 does
 * not decay; a NaN gradient makes its own element NaN only (SGD momentum);
 * a zero-grad'ed (set-to-none) parameter is skipped by the step, as torch;
 * cosine at step >= total is min_lr. */
START_TEST(optimizer_groups_nan_and_schedules)
{
    for (int m = 0; m < 3; m++) {
        ctpu_set_mode((ctpu_mode)m);
        ctpu_tensor p1 = ctpu_keep(T_VEC(1, -2)), p2 = ctpu_keep(T_VEC(0.5f));
        ctpu_set_requires_grad(p1, true);
        ctpu_set_requires_grad(p2, true);
        ctpu_adamw_opts o = ctpu_adamw_defaults();
        o.lr = 0.1;
        ctpu_param_group g[2] = { { &p1, 1, 0.5, 0.5 }, { &p2, 1, 1.0, 0.0 } };
        ctpu_optim *opt = ctpu_adamw_create_groups(2, g, &o);
        ck_assert_ptr_nonnull(opt);
        for (int s = 0; s < 2; s++) {
            ctpu_optim_zero_grad(opt);
            ctpu_step_begin();
            ctpu_tensor l = ctpu_add(ctpu_sum(ctpu_mul(p1, p1), 0, NULL, false), ctpu_sum(ctpu_mul_scalar(p2, 3), 0, NULL, false));
            ck_assert_int_eq(ctpu_backward(l), CTPU_OK);
            ck_assert_int_eq(ctpu_optim_step(opt), CTPU_OK);
            ctpu_step_end();
        }
        float a[2], b[1];
        ctpu_to_host(p1, a, sizeof a);
        ctpu_to_host(p2, b, sizeof b);
        ck_assert_msg(t_ulps(a[0], 0.852014422416687f) <= 8 && t_ulps(a[1], -1.8025833368301392f) <= 8 &&
                      t_ulps(b[0], 0.30000001192092896f) <= 8, "[%s] groups: %.9g %.9g %.9g (torch 0.852014422 "
                      "-1.80258334 0.300000012)", rg_mode_name[m], a[0], a[1], b[0]);
        /* a parameter without a .grad is skipped, its state untouched */
        ctpu_optim_zero_grad(opt);
        ctpu_step_begin();
        ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(p1, p1), 0, NULL, false)), CTPU_OK);
        ck_assert_int_eq(ctpu_optim_step(opt), CTPU_OK);
        ctpu_step_end();
        float b2[1];
        ctpu_to_host(p2, b2, sizeof b2);
        ck_assert_msg(b2[0] == b[0], "[%s] a parameter without .grad moved: %g -> %g", rg_mode_name[m], b[0], b2[0]);
        ctpu_optim_free(opt);
        ctpu_zero_grad(p1);
        ctpu_zero_grad(p2);
        ctpu_release(p1);
        ctpu_release(p2);
        /* a NaN gradient stays in its element */
        ctpu_tensor x = ctpu_keep(T_VEC(0, 1));
        ctpu_set_requires_grad(x, true);
        ctpu_sgd_opts so = { .lr = 0.1, .momentum = 0.9 };
        opt = ctpu_sgd_create(1, &x, &so);
        ctpu_step_begin();
        ck_assert_int_eq(ctpu_backward_with(ctpu_mul(x, ctpu_ones_like(x)), T_VEC(NAN, 1)), CTPU_OK);
        ck_assert_int_eq(ctpu_optim_step(opt), CTPU_OK);
        ctpu_step_end();
        float xv[2];
        ctpu_to_host(x, xv, sizeof xv);
        ck_assert_msg(isnan(xv[0]) && xv[1] == 0.9f, "[%s] NaN grad: %g %g (torch nan 0.9)", rg_mode_name[m], xv[0], xv[1]);
        ctpu_optim_free(opt);
        ctpu_zero_grad(x);
        ctpu_release(x);
        ctpu_set_mode(CTPU_MODE_STRICT);
        ctpu_sync();
    }
    ck_assert(ctpu_lr_cosine(1.0, 10, 10, 0.1) == 0.1 && ctpu_lr_cosine(1.0, 11, 10, 0.1) == 0.1);
    ck_assert(ctpu_lr_cosine(1.0, 0, 10, 0.1) == 1.0);
    ck_assert(fabs(ctpu_lr_cosine(1.0, 5, 10, 0.0) - 0.5) < 1e-15);
    ck_assert(ctpu_lr_warmup_cosine(1.0, 0, 4, 10, 0.1) == 0.2 && ctpu_lr_warmup_cosine(1.0, 99, 4, 10, 0.1) == 0.1);
    ck_assert(ctpu_lr_step(1.0, 5, 2, 0.5) == 0.25);
}
END_TEST

/* ================================================= 30. comparisons and small-row softmax
 * torch: NaN == NaN is false and NaN != NaN true (jax-ml/jax#2831-class NaN
 * comparisons in fused code); softmax over dim 0; log_softmax of one
 * element is 0; i32 pow is exact (2^3 = 8, (-2)^3 = -8, 3^0 = 1). */
static ctpu_tensor f_eq(const ctpu_tensor *in) { return ctpu_eq(in[0], in[1]); }
static ctpu_tensor f_ne(const ctpu_tensor *in) { return ctpu_ne(in[0], in[1]); }
static ctpu_tensor f_lt(const ctpu_tensor *in) { return ctpu_lt(in[0], in[1]); }
static ctpu_tensor f_ge(const ctpu_tensor *in) { return ctpu_ge(in[0], in[1]); }
static ctpu_tensor f_sm_dim0(const ctpu_tensor *in) { return ctpu_softmax(in[0], 0); }
static ctpu_tensor f_lsm_neg1(const ctpu_tensor *in) { return ctpu_log_softmax(in[0], -1); }
START_TEST(comparisons_nan_and_small_softmax)
{
    const float a[4] = { NAN, 1, NAN, INFINITY }, b[4] = { NAN, NAN, 1, INFINITY };
    rg_in ab[2] = { RG_IN(CTPU_F32, 1, a, 4), RG_IN(CTPU_F32, 1, b, 4) };
    { const double w[4] = { 0, 0, 0, 1 }; rg_expect("eq NaN", f_eq, 2, ab, 4, w, 0); }
    { const double w[4] = { 1, 1, 1, 0 }; rg_expect("ne NaN", f_ne, 2, ab, 4, w, 0); }
    { const double w[4] = { 0, 0, 0, 0 }; rg_expect("lt NaN", f_lt, 2, ab, 4, w, 0); }
    { const double w[4] = { 0, 0, 0, 1 }; rg_expect("ge NaN", f_ge, 2, ab, 4, w, 0); }
    const float x[4] = { 1, 2, 3, 5 };
    rg_in ix = RG_IN(CTPU_F32, 2, x, 2, 2);
    { const double w[4] = { 0.11920291930437088, 0.04742587357759476, 0.8807970285415649, 0.9525741338729858 };
      rg_expect("softmax over dim 0", f_sm_dim0, 1, &ix, 4, w, 2); }
    const float one[1] = { 5 };
    rg_in i1 = RG_IN(CTPU_F32, 2, one, 1, 1);
    { const double w[1] = { 0 }; rg_expect("log_softmax of one element", f_lsm_neg1, 1, &i1, 1, w, 0); }
    const int32_t pb[3] = { 2, -2, 3 }, pe[3] = { 3, 3, 0 };
    rg_in ip[2] = { RG_IN(CTPU_I32, 1, pb, 3), RG_IN(CTPU_I32, 1, pe, 3) };
    { const double w[3] = { 8, -8, 1 }; rg_expect("i32 pow", f_pow, 2, ip, 3, w, 0); }
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
    tcase_add_test(tc, bf16_rounding_ties_overflow_nan);
    tcase_add_test(tc, f32_to_i32_nan_huge);
    tcase_add_test(tc, integer_division_and_overflow);
    tcase_add_test(tc, transcendental_specials);
    tcase_add_test(tc, bf16_reductions_accumulate_in_f32);
    tcase_add_test(tc, arange_lengths);
    tcase_add_test(tc, zero_size_and_size_one_broadcast);
    tcase_add_test(tc, gradients_at_kinks_ties_and_zero);
    tcase_add_test(tc, layer_norm_tiny_and_huge_variance);
    tcase_add_test(tc, sdpa_causal_rectangular_masked_dropout);
    tcase_add_test(tc, sdpa_fully_masked_row_gradient);
    tcase_add_test(tc, dropout_same_seed_same_bits);
    tcase_add_test(tc, autograd_accumulate_retain_detach);
    tcase_add_test(tc, autograd_diamond_and_views);
    tcase_add_test(tc, optimizers_match_torch);
    tcase_add_test(tc, clip_grad_norm_edges);
    tcase_add_test(tc, inplace_assign_through_transposed_alias);
    tcase_add_test(tc, reshape_of_noncontiguous_views);
    tcase_add_test(tc, read_before_assign_in_one_trace);
    tcase_add_test(tc, compiled_guards_mutation_aliasing);
    tcase_add_test(tc, dynamic_dims_at_zero_and_one);
    tcase_add_test(tc, two_traces_share_a_tensor);
    tcase_add_test(tc, cache_eviction_while_in_use);
    tcase_add_test(tc, rng_same_bits_across_threads_and_modes);
    tcase_add_test(tc, loss_and_activation_gradient_edges);
    tcase_add_test(tc, shape_rules_matmul_slice_concat_scatter);
    tcase_add_test(tc, optimizer_groups_nan_and_schedules);
    tcase_add_test(tc, comparisons_nan_and_small_softmax);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
