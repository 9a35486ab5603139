/* Hostile input beyond tests/test_badinput.c (issue 7):
 *  - every public entry point of include/ctpu.h called before ctpu_init and
 *    after ctpu_shutdown (the header is parsed: a new function without a
 *    case here fails entry_points_all_covered);
 *  - extreme integers (INT_MIN / INT64_MIN dims, starts, corrections), NaN
 *    and Inf where a value must be finite, handles from an earlier runtime
 *    (init -> shutdown -> init), another thread's pending value, scopes and
 *    no-grad regions nested past their limits, autograd misuse;
 *  - metrics and report calls: unwritable paths, NULL streams, garbage
 *    JSON for ctpu_report_render / _compare / _plot_svg and the
 *    ctpu-report tool;
 *  - idx files with random corruption (plain and gzip), a directory;
 *  - environment values test_modes does not try (newlines, 10 KB values,
 *    overflowing counts, unwritable metrics files);
 *  - device faults in defer and fuse: an index out of range inside a fused
 *    program, OOM at a program launch, NaN with debug checks on. Each names
 *    the original op, poisons only dependents, and the runtime recovers.
 * Every error case asserts the status, key words of the message (the op),
 * one line, and that the runtime still computes afterwards. */
#include <limits.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "t_core.h"
#include "ctpu_nn.h"

/* ------------------------------------------------------------ helpers */
static void good_op(void)
{
    ctpu_tensor a = T_VEC(1, 2, 3);
    ctpu_tensor s = ctpu_sum(ctpu_mul(a, a), 0, NULL, false);
    double v = 0;
    ck_assert_msg(ctpu_item(s, &v) == CTPU_OK, "runtime unusable after a bad call: %s", ctpu_last_error());
    ck_assert(v == 14);
    ctpu_release(s);
    ctpu_release(a);
}

static void expect_msg(ctpu_status got, ctpu_status want, const char *key, const char *what)
{
    ck_assert_msg(got == want, "%s: status %s, want %s (%s)", what, ctpu_status_str(got), ctpu_status_str(want),
                  ctpu_last_error());
    ck_assert_msg(ctpu_last_status() == want, "%s: last status %s", what, ctpu_status_str(ctpu_last_status()));
    ck_assert_msg(t_contains(ctpu_last_error(), key), "%s: message does not name \"%s\": \"%s\"", what, key,
                  ctpu_last_error());
    ck_assert_msg(strchr(ctpu_last_error(), '\n') == NULL, "%s: message is not one line", what);
    ctpu_clear_error();
}

/* An error status with key words, then a good op. */
#define ERR(call, want, key)                                                                                  \
    do {                                                                                                      \
        ctpu_clear_error();                                                                                   \
        expect_msg((call), (want), (key), #call);                                                             \
        good_op();                                                                                            \
    } while (0)
/* A null handle with key words, then a good op. */
#define NUL(call, want, key)                                                                                  \
    do {                                                                                                      \
        ctpu_clear_error();                                                                                   \
        ctpu_tensor r_ = (call);                                                                              \
        ck_assert_msg(ctpu_is_null(r_), "%s gave a handle", #call);                                           \
        expect_msg(ctpu_last_status(), (want), (key), #call);                                                 \
        good_op();                                                                                            \
    } while (0)

/* ------------------------------------------------------------ every entry point, uninitialised */
#define MAX_COVER 256
static const char *covered[MAX_COVER];
static int n_covered;
static void cover(const char *fn)
{
    for (int i = 0; i < n_covered; i++)
        if (!strcmp(covered[i], fn)) return;
    ck_assert_int_lt(n_covered, MAX_COVER);
    covered[n_covered++] = fn;
}

/* Before init: NOT_INITIALIZED naming the call (key), nothing else. */
static void un_status(const char *fn, const char *key, ctpu_status st)
{
    cover(fn);
    ck_assert_msg(st == CTPU_ERR_NOT_INITIALIZED, "%s before init: %s (%s)", fn, ctpu_status_str(st), ctpu_last_error());
    ck_assert_msg(t_contains(ctpu_last_error(), key), "%s before init: message \"%s\" does not name %s", fn,
                  ctpu_last_error(), key);
    ctpu_clear_error();
}
#define UN_S(fn, key, ...) un_status(#fn, key, fn(__VA_ARGS__))
#define UN_T(fn, key, ...)                                                                                    \
    do {                                                                                                      \
        ctpu_clear_error();                                                                                   \
        ctpu_tensor r_ = fn(__VA_ARGS__);                                                                     \
        ck_assert_msg(ctpu_is_null(r_), "%s before init gave a handle", #fn);                                 \
        un_status(#fn, key, ctpu_last_status());                                                              \
    } while (0)
/* Before init, calls that need no runtime: a defined result, no crash. */
#define UN_OK(fn, cond)                                                                                       \
    do {                                                                                                      \
        cover(#fn);                                                                                           \
        ck_assert_msg((cond), "%s before init: %s", #fn, #cond);                                              \
    } while (0)

/* A handle that looks plausible (slot 0, generation 1). */
static const ctpu_tensor FAKE = { ((uint64_t)1 << 32) | 1 };

/* A step for the compiled-step cases: out[0] = in[0] * 2. */
static ctpu_status hostile_step(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    (void)sc;
    out[0] = ctpu_mul_scalar(in[0], 2);
    return ctpu_is_null(out[0]) ? ctpu_last_status() : CTPU_OK;
}

/* A step that fails, one that leaves garbage in out[], one reading out of range. */
static ctpu_status failing_step(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    (void)sc;
    out[0] = ctpu_reshape(in[0], 1, (int64_t[]){ 4 });   /* [3] as [4]: a shape error */
    return ctpu_is_null(out[0]) ? ctpu_last_status() : CTPU_OK;
}
static ctpu_status garbage_step(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    (void)in;
    (void)sc;
    out[0] = (ctpu_tensor){ 0xdeadbeefcafeull };
    return CTPU_OK;
}

static void uninitialised_sweep(void)
{
    ck_assert(!ctpu_is_initialized());
    ctpu_tensor t = FAKE, ts[2] = { FAKE, FAKE };
    float f[4];
    double v;
    int64_t sh[8] = { 2, 2 };
    int nd, dims[1] = { 0 }, perm[2] = { 1, 0 };
    uint64_t u1, u2;
    char buf[64];
    ctpu_hbm_stats hs;
    ctpu_cache_info ci;
    ctpu_cost_table tab;
    /* runtime */
    UN_OK(ctpu_is_initialized, !ctpu_is_initialized());
    UN_OK(ctpu_version, ctpu_version() && strcmp(ctpu_version(), CTPU_VERSION_EXPECTED) == 0);
    UN_OK(ctpu_shutdown, (ctpu_shutdown(), true));             /* safe when not initialised */
    UN_OK(ctpu_last_error, ctpu_last_error() != NULL);
    UN_OK(ctpu_last_status, ctpu_last_status() < CTPU_STATUS_COUNT);
    UN_OK(ctpu_clear_error, (ctpu_clear_error(), ctpu_last_status() == CTPU_OK));
    UN_OK(ctpu_status_str, strcmp(ctpu_status_str((ctpu_status)1234), "unknown status") == 0);
    UN_S(ctpu_set_mode, "set_mode", CTPU_MODE_DEFER_FUSE);
    UN_S(ctpu_set_thread_mode, "set_thread_mode", CTPU_MODE_DEBUG);
    UN_OK(ctpu_clear_thread_mode, (ctpu_clear_thread_mode(), true));
    UN_OK(ctpu_get_mode, ctpu_get_mode() == CTPU_MODE_STRICT);
    UN_OK(ctpu_mode_name, strcmp(ctpu_mode_name((ctpu_mode)-7), "?") == 0);
    UN_S(ctpu_set_debug_checks, "set_debug_checks", true);
    UN_OK(ctpu_debug_checks, !ctpu_debug_checks());
    UN_S(ctpu_set_matmul_precision, "set_matmul_precision", CTPU_PRECISION_HIGH);
    UN_OK(ctpu_get_matmul_precision, ctpu_get_matmul_precision() == CTPU_PRECISION_DEFAULT);
    UN_S(ctpu_sync, "sync");
    UN_OK(ctpu_chip, ctpu_chip() == NULL);
    UN_OK(ctpu_chip_lookup, ctpu_chip_lookup("v5e") != NULL && ctpu_chip_lookup("") == NULL);
    UN_S(ctpu_hbm_get_stats, "hbm_get_stats", &hs);
    UN_OK(ctpu_hbm_reset_peak, (ctpu_hbm_reset_peak(), true));
    /* handles */
    UN_OK(ctpu_ndim, ctpu_ndim(t) == -1);
    UN_OK(ctpu_dim, ctpu_dim(t, 0) == -1);
    UN_OK(ctpu_numel, ctpu_numel(t) == -1);
    UN_OK(ctpu_dtype_of, ctpu_dtype_of(t) == CTPU_DTYPE_COUNT);
    ctpu_clear_error();
    UN_S(ctpu_shape, "shape", t, sh, &nd);
    UN_OK(ctpu_is_valid, !ctpu_is_valid(t));
    UN_OK(ctpu_is_null, !ctpu_is_null(t) && ctpu_is_null(CTPU_NULL));
    UN_OK(ctpu_dtype_name, strcmp(ctpu_dtype_name(CTPU_BF16), "bf16") == 0);
    UN_S(ctpu_release, "release", t);
    /* scopes */
    UN_S(ctpu_scope_begin, "scope_begin");
    UN_S(ctpu_scope_end, "scope_end");
    UN_T(ctpu_keep, "keep", t);
    UN_S(ctpu_step_begin, "step_begin");
    UN_S(ctpu_step_end, "step_end");
    UN_S(ctpu_mark_step, "mark_step");
    /* creation */
    UN_T(ctpu_from_host, "from_host", f, CTPU_F32, 2, sh);
    UN_S(ctpu_to_host, "to_host", t, f, sizeof f);
    UN_S(ctpu_item, "item", t, &v);
    UN_T(ctpu_from_host_f32_as_bf16, "from_host_f32_as_bf16", f, 2, sh);
    UN_S(ctpu_set_name, "set_name", t, "x");
    UN_S(ctpu_mark_dynamic, "mark_dynamic", t, 0, 2, 8);
    /* a thread's declaration needs no runtime; bad arguments are refused before init too */
    UN_OK(ctpu_declare_dynamic_inputs, ctpu_declare_dynamic_inputs(CTPU_F32, 2, 7, 2, 8) == CTPU_ERR_INVALID_ARG);
    UN_OK(ctpu_clear_dynamic_inputs, (ctpu_clear_dynamic_inputs(), true));
    UN_OK(ctpu_name, strcmp(ctpu_name(t), "") == 0);
    UN_S(ctpu_to_host_as_f32, "to_host_as_f32", t, f, sizeof f);
    UN_S(ctpu_print, "print", t, NULL);
    UN_T(ctpu_zeros, "zeros", CTPU_F32, 2, sh);
    UN_T(ctpu_ones, "ones", CTPU_F32, 2, sh);
    UN_T(ctpu_full, "full", CTPU_F32, 2, sh, 1.0);
    UN_T(ctpu_arange, "arange", 0, 4, 1, CTPU_F32);
    UN_OK(ctpu_manual_seed, (ctpu_manual_seed(5), true));
    UN_S(ctpu_rng_get_state, "rng_get_state", &u1, &u2);
    UN_S(ctpu_rng_set_state, "rng_set_state", 1, 2);
    UN_T(ctpu_rand_uniform, "rand_uniform", CTPU_F32, 2, sh, 0, 1);
    UN_T(ctpu_rand_normal, "rand_normal", CTPU_F32, 2, sh, 0, 1);
    UN_T(ctpu_randint, "randint", CTPU_I32, 2, sh, 0, 10);
    UN_T(ctpu_zeros_like, "zeros_like", t); UN_T(ctpu_ones_like, "ones_like", t); UN_T(ctpu_full_like, "full_like", t, 2);
    UN_T(ctpu_rand_like, "rand_like", t); UN_T(ctpu_randn_like, "randn_like", t);
    UN_T(ctpu_randint_like, "randint_like", t, 0, 3);
    UN_T(ctpu_eye, "eye", 3, 3, CTPU_F32); UN_T(ctpu_linspace, "linspace", 0, 1, 5, CTPU_F32);
    UN_S(ctpu_assign, "assign", t, t);
    /* elementwise */
    UN_T(ctpu_neg, "neg", t); UN_T(ctpu_abs, "abs", t); UN_T(ctpu_exp, "exp", t); UN_T(ctpu_log, "log", t);
    UN_T(ctpu_sqrt, "sqrt", t); UN_T(ctpu_rsqrt, "rsqrt", t); UN_T(ctpu_tanh, "tanh", t);
    UN_T(ctpu_sigmoid, "sigmoid", t); UN_T(ctpu_relu, "relu", t); UN_T(ctpu_gelu, "gelu", t, true);
    UN_T(ctpu_silu, "silu", t); UN_T(ctpu_softplus, "softplus", t);
    UN_T(ctpu_layer_norm, "layer_norm", t, t, CTPU_NULL, 1e-5); UN_T(ctpu_rms_norm, "rms_norm", t, CTPU_NULL, 1e-5);
    UN_T(ctpu_unsqueeze, "unsqueeze", t, 0); UN_T(ctpu_squeeze, "squeeze", t, 0); UN_T(ctpu_flatten, "flatten", t, 0, -1);
    UN_T(ctpu_stack, "stack", 2, ts, 0); UN_T(ctpu_tril, "tril", t, 0); UN_T(ctpu_triu, "triu", t, 0);
    UN_T(ctpu_causal_mask, "causal_mask", 4, 4, CTPU_MASK_ADDITIVE); UN_T(ctpu_index_select, "index_select", t, 0, t);
    UN_T(ctpu_scaled_dot_product_attention, "scaled_dot_product_attention", t, t, t, t, CTPU_MASK_ADDITIVE, false, 0, 0);
    UN_T(ctpu_scaled_dot_product_attention_bthd, "scaled_dot_product_attention", t, t, t, t, CTPU_MASK_ADDITIVE, false, 0, 0);
    UN_T(ctpu_erf, "erf", t); UN_T(ctpu_sin, "sin", t); UN_T(ctpu_cos, "cos", t); UN_T(ctpu_log1p, "log1p", t); UN_T(ctpu_expm1, "expm1", t);
    UN_T(ctpu_leaky_relu, "leaky_relu", t, 0.01); UN_T(ctpu_elu, "elu", t, 1.0);
    UN_T(ctpu_add, "add", t, t); UN_T(ctpu_sub, "sub", t, t); UN_T(ctpu_mul, "mul", t, t);
    UN_T(ctpu_div, "div", t, t); UN_T(ctpu_pow, "pow", t, t); UN_T(ctpu_maximum, "maximum", t, t);
    UN_T(ctpu_minimum, "minimum", t, t); UN_T(ctpu_eq, "eq", t, t); UN_T(ctpu_ne, "ne", t, t);
    UN_T(ctpu_lt, "lt", t, t); UN_T(ctpu_le, "le", t, t); UN_T(ctpu_gt, "gt", t, t); UN_T(ctpu_ge, "ge", t, t);
    UN_T(ctpu_add_scalar, "add", t, 1); UN_T(ctpu_sub_scalar, "sub", t, 1); UN_T(ctpu_mul_scalar, "mul", t, 1);
    UN_T(ctpu_div_scalar, "div", t, 1); UN_T(ctpu_pow_scalar, "pow", t, 1);
    UN_T(ctpu_maximum_scalar, "maximum", t, 1); UN_T(ctpu_minimum_scalar, "minimum", t, 1);
    UN_T(ctpu_rsub_scalar, "sub", t, 1); UN_T(ctpu_rdiv_scalar, "div", t, 1); UN_T(ctpu_rpow_scalar, "pow", t, 1);
    UN_T(ctpu_eq_scalar, "eq", t, 1); UN_T(ctpu_ne_scalar, "ne", t, 1); UN_T(ctpu_lt_scalar, "lt", t, 1);
    UN_T(ctpu_le_scalar, "le", t, 1); UN_T(ctpu_gt_scalar, "gt", t, 1); UN_T(ctpu_ge_scalar, "ge", t, 1);
    UN_T(ctpu_where, "where", t, t, t); UN_T(ctpu_clamp, "clamp", t, 0, 1); UN_T(ctpu_cast, "cast", t, CTPU_BF16);
    UN_T(ctpu_add_scalar_int, "add", t, 1); UN_T(ctpu_sub_scalar_int, "sub", t, 1);
    UN_T(ctpu_mul_scalar_int, "mul", t, 1); UN_T(ctpu_rsub_scalar_int, "sub", t, 1);
    UN_T(ctpu_maximum_scalar_int, "maximum", t, 1); UN_T(ctpu_minimum_scalar_int, "minimum", t, 1);
    UN_T(ctpu_clamp_int, "clamp", t, 0, 1);
    /* reductions, movement, matmul */
    UN_T(ctpu_sum, "sum", t, 1, dims, false); UN_T(ctpu_mean, "mean", t, 0, NULL, true);
    UN_T(ctpu_max, "max", t, 1, dims, false); UN_T(ctpu_min, "min", t, 1, dims, false);
    UN_T(ctpu_var, "var", t, 1, dims, 1, false); UN_T(ctpu_argmax, "argmax", t, 0, false);
    UN_T(ctpu_prod, "prod", t, 1, dims, false); UN_T(ctpu_argmin, "argmin", t, 0, false);
    UN_T(ctpu_logsumexp, "logsumexp", t, 1, dims, false); UN_T(ctpu_cumsum, "cumsum", t, 0);
    UN_T(ctpu_scatter_add, "scatter_add", t, 0, t, t); UN_T(ctpu_index_add, "index_add", t, 0, t, t, 1.0);
    UN_T(ctpu_softmax, "softmax", t, 0); UN_T(ctpu_log_softmax, "log_softmax", t, 0);
    UN_T(ctpu_reshape, "reshape", t, 2, sh); UN_T(ctpu_permute, "permute", t, perm);
    UN_T(ctpu_transpose, "transpose", t, 0, 1); UN_T(ctpu_contiguous, "contiguous", t);
    UN_T(ctpu_slice, "slice", t, 0, 0, 1, 1); UN_T(ctpu_concat, "concat", 2, ts, 0);
    UN_T(ctpu_expand, "expand", t, 2, sh); UN_T(ctpu_embedding, "embedding", t, t);
    UN_T(ctpu_gather, "gather", t, 0, t); UN_T(ctpu_matmul, "matmul", t, t);
    UN_T(ctpu_matmul_t, "matmul", t, t, false, true);
    /* metrics */
    UN_OK(ctpu_metric_counter, ctpu_metric_counter("syncs") == 0);
    UN_OK(ctpu_metrics_report, (ctpu_metrics_report(fopen("/dev/null", "w")), true));
    UN_OK(ctpu_metrics_clear, (ctpu_metrics_clear(), true));
    /* autograd */
    UN_S(ctpu_set_requires_grad, "requires_grad", t, true);
    UN_OK(ctpu_requires_grad, !ctpu_requires_grad(t));
    UN_S(ctpu_backward, "backward", t);
    UN_S(ctpu_backward_ex, "backward", t, CTPU_NULL, true);
    UN_S(ctpu_backward_with, "backward", t, t);
    UN_OK(ctpu_grad, ctpu_is_null(ctpu_grad(t)));
    UN_S(ctpu_zero_grad, "zero_grad", t);
    UN_S(ctpu_no_grad_begin, "no_grad", );
    UN_S(ctpu_no_grad_end, "no_grad", );
    UN_OK(ctpu_grad_enabled, ctpu_grad_enabled());
    UN_T(ctpu_detach, "detach", t);
    UN_OK(ctpu_report_error, ctpu_report_error(CTPU_ERR_IO, "%s", "x") == CTPU_ERR_IO);
    UN_OK(ctpu_error_handle, ctpu_is_null(ctpu_error_handle()) && ctpu_error_handle().id != 0);
    ctpu_clear_error();
    /* cache */
    UN_S(ctpu_cache_get_info, "cache", &ci);
    UN_S(ctpu_cache_set_only, "cache", true);
    ctpu_clear_error();
    ck_assert_int_eq(ctpu_cache_recompile_log(buf, sizeof buf), -1);
    un_status("ctpu_cache_recompile_log", "cache_recompile_log", ctpu_last_status());
    /* compiled steps */
    ctpu_clear_error();
    ck_assert_ptr_null(ctpu_compile(hostile_step, NULL, NULL));
    un_status("ctpu_compile", "compile", ctpu_last_status());
    ctpu_tensor co[1];
    UN_S(ctpu_compiled_call, "compiled_call", NULL, 1, &t, 0, NULL, 1, co);
    ctpu_compiled_info cinfo;
    UN_OK(ctpu_compiled_get_info, ctpu_compiled_get_info(NULL, &cinfo) == CTPU_ERR_INVALID_ARG);
    UN_OK(ctpu_compiled_free, (ctpu_compiled_free(NULL), true));
    UN_OK(ctpu_is_compiling, !ctpu_is_compiling());
    ctpu_clear_error();
    /* reports */
    ctpu_clear_error();
    char *js = ctpu_metrics_json();
    ck_assert_ptr_null(js);
    un_status("ctpu_metrics_json", "metrics", ctpu_last_status());
    UN_S(ctpu_metrics_write, "metrics", "/tmp/never-written.json");
    UN_S(ctpu_cache_report, "cache_report", NULL);
    UN_S(ctpu_set_host_read_label, "host_read_label", "x");
    UN_S(ctpu_label_push, "label_push", "x");
    UN_S(ctpu_label_pop, "label_pop");
    UN_S(ctpu_call_push, "call_push", "nll_loss", "target");
    UN_S(ctpu_call_pop, "call_pop");
    UN_S(ctpu_set_steps_per_epoch, "steps_per_epoch", 10);
    UN_S(ctpu_cost_table_get, "cost_table", &tab);
    /* no init needed, bad arguments */
    ctpu_cost_estimate ce;
    cover("ctpu_cost_matmul");
    ck_assert_int_eq(ctpu_cost_matmul("v4", 1, 8, 8, 8, CTPU_BF16, CTPU_PRECISION_DEFAULT, &ce), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_cost_matmul("v5e", 1, 8, 8, 8, CTPU_BF16, CTPU_PRECISION_DEFAULT, &ce), CTPU_OK);
    UN_OK(ctpu_price_plan_name, strcmp(ctpu_price_plan_name((ctpu_price_plan)-7), "?") == 0 &&
                                    strcmp(ctpu_price_plan_name(CTPU_PRICE_3Y), "3y") == 0);
    cover("ctpu_cost_table_print");
    ck_assert_int_eq(ctpu_cost_table_print(NULL, NULL), CTPU_ERR_INVALID_ARG);
    cover("ctpu_report_render");
    ck_assert_int_eq(ctpu_report_render("{", NULL, CTPU_REPORT_TEXT, stdout), CTPU_ERR_IO);
    cover("ctpu_report_compare");
    ck_assert_int_eq(ctpu_report_compare(NULL, NULL, NULL, NULL, CTPU_REPORT_TEXT, stdout), CTPU_ERR_INVALID_ARG);
    cover("ctpu_report_plot_svg");
    ck_assert_int_eq(ctpu_report_plot_svg(0, NULL, NULL, stdout), CTPU_ERR_INVALID_ARG);
    /* checkpoints: save and load need the runtime; reading a file's header does not */
    const char *stn[2] = { "a", "b" };
    int sn;
    UN_S(ctpu_save, "save", "/tmp/never-written.safetensors", 2, stn, ts);
    UN_S(ctpu_save_ex, "save", "/tmp/never-written.safetensors", 2, stn, ts, 0, NULL);
    UN_S(ctpu_load, "load", "/tmp/never-read.safetensors", 2, stn, ts);
    UN_OK(ctpu_safetensors_open, ctpu_safetensors_open("/nonexistent-dir/x.safetensors") == NULL &&
                                 ctpu_last_status() == CTPU_ERR_IO);
    UN_OK(ctpu_safetensors_entries, ctpu_safetensors_entries(NULL, &sn) == NULL && sn == 0);
    UN_OK(ctpu_safetensors_find, ctpu_safetensors_find(NULL, "a") == -1);
    UN_OK(ctpu_safetensors_tensor, ctpu_is_null(ctpu_safetensors_tensor(NULL, "a")));
    UN_OK(ctpu_safetensors_load, ctpu_safetensors_load(NULL, 2, stn, ts) == CTPU_ERR_INVALID_ARG);
    UN_OK(ctpu_safetensors_metadata, ctpu_safetensors_metadata(NULL, "a") == NULL);
    UN_OK(ctpu_safetensors_metadata_count, ctpu_safetensors_metadata_count(NULL) == 0);
    const char *mk, *mv;
    UN_OK(ctpu_safetensors_metadata_at, ctpu_safetensors_metadata_at(NULL, 0, &mk, &mv) == CTPU_ERR_INVALID_ARG);
    UN_OK(ctpu_safetensors_close, (ctpu_safetensors_close(NULL), true));
    /* distributed (issue 19): a world of one rank until ctpu_dist_init */
    UN_OK(ctpu_dist_shutdown, (ctpu_dist_shutdown(), true));   /* safe when not initialised */
    UN_OK(ctpu_dist_rank, ctpu_dist_rank() == 0);
    UN_OK(ctpu_dist_world_size, ctpu_dist_world_size() == 1);
    UN_OK(ctpu_dist_local_rank, ctpu_dist_local_rank() == 0);
    UN_OK(ctpu_dist_local_size, ctpu_dist_local_size() == 1);
    UN_OK(ctpu_dist_available, (ctpu_dist_available(), true));
    UN_OK(ctpu_dist_is_initialized, !ctpu_dist_is_initialized());
    UN_OK(ctpu_ici_lookup, ctpu_ici_lookup("v4") == NULL && ctpu_ici_lookup(NULL) == NULL &&
                               ctpu_ici_lookup("7x") != NULL);
    ctpu_ici_estimate ie;
    cover("ctpu_ici_estimate_collective");
    ck_assert_int_eq(ctpu_ici_estimate_collective(NULL, 0, 8, 1, CTPU_ICI_TORUS, &ie), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 0, INT64_MIN, 1, CTPU_ICI_TORUS, &ie), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 0, 8, NAN, CTPU_ICI_TORUS, &ie), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 0, 8, INFINITY, CTPU_ICI_TORUS, &ie), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 0, 8, 1, (ctpu_ici_topology)9, &ie), CTPU_ERR_INVALID_ARG);
    ck_assert(t_contains(ctpu_last_error(), "ici_estimate_collective"));
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 0, INT64_MAX, 1, CTPU_ICI_TORUS, &ie), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5p", 0, 1 << 20, 1e30, CTPU_ICI_TORUS, &ie), CTPU_OK);
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 0, 1048573, 1, CTPU_ICI_TORUS, &ie), CTPU_OK); /* a prime */
    UN_T(ctpu_all_reduce, "all_reduce", t, CTPU_DIST_SUM);
    UN_T(ctpu_broadcast, "broadcast", t, 0);
    UN_T(ctpu_all_gather, "all_gather", t, 0);
    UN_T(ctpu_reduce_scatter, "reduce_scatter", t, 0, CTPU_DIST_MEAN);
    UN_T(ctpu_all_reduce_async, "all_reduce_async", t, CTPU_DIST_SUM);
    UN_T(ctpu_all_reduce_wait, "all_reduce_wait", t);
    UN_S(ctpu_register_post_accumulate_grad_hook, "register_post_accumulate_grad_hook", t, NULL, NULL);
    UN_S(ctpu_dist_set_bucket, "dist_set_bucket", 3);
    UN_S(ctpu_dist_set_collective_cut, "dist_set_collective_cut", false);
    ctpu_dist_stats ds;
    UN_S(ctpu_dist_get_stats, "dist_get_stats", &ds);
    UN_S(ctpu_dist_report, "dist_report", NULL);
    ctpu_clear_error();
    ck_assert(!ctpu_is_initialized());
}

/* The public functions of include/ctpu.h (parsed). */
static int header_functions(char names[][64], int cap)
{
    FILE *f = fopen(CTPU_SOURCE_ROOT "/include/ctpu.h", "r");
    ck_assert_msg(f != NULL, "cannot open %s", CTPU_SOURCE_ROOT "/include/ctpu.h");
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (!((line[0] >= 'a' && line[0] <= 'z') || (line[0] >= 'A' && line[0] <= 'Z') || line[0] == '_')) continue;
        if (!strncmp(line, "typedef", 7)) continue;
        char *paren = strchr(line, '(');
        if (!paren) continue;
        char *s = paren;
        while (s > line && (s[-1] == '_' || (s[-1] >= 'a' && s[-1] <= 'z') || (s[-1] >= '0' && s[-1] <= '9'))) s--;
        if (strncmp(s, "ctpu_", 5) != 0 || (s > line && s[-1] != ' ' && s[-1] != '*')) continue;
        if (memchr(line, '=', (size_t)(s - line))) continue;
        ck_assert_int_lt(n, cap);
        size_t len = (size_t)(paren - s);
        if (len >= 64) continue;
        memcpy(names[n], s, len);
        names[n][len] = 0;
        n++;
    }
    fclose(f);
    return n;
}

START_TEST(entry_points_all_covered)
{
    t_clear_env();
    n_covered = 0;
    uninitialised_sweep();
    /* and the same after a shutdown */
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    good_op();
    ctpu_shutdown();
    uninitialised_sweep();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    cover("ctpu_init");
    ck_assert_int_eq(ctpu_init(), CTPU_ERR_STATE);   /* twice */
    ck_assert(t_contains(ctpu_last_error(), "init"));
    cover("ctpu_dist_init");
    ck_assert_int_eq(ctpu_dist_init(), CTPU_ERR_STATE); /* after ctpu_init: MPI is not touched */
    ck_assert(t_contains(ctpu_last_error(), "ctpu_dist_init"));
    ck_assert(!ctpu_dist_is_initialized());
    good_op();
    ctpu_shutdown();
    static char names[400][64];
    int n = header_functions(names, 400);
    ck_assert_int_ge(n, 100);
    int missing = 0;
    for (int i = 0; i < n; i++) {
        bool found = false;
        for (int k = 0; k < n_covered && !found; k++) found = !strcmp(names[i], covered[k]);
        if (!found) { fprintf(stderr, "hostile: no case for %s\n", names[i]); missing++; }
    }
    fprintf(stderr, "hostile: %d public entry points in ctpu.h, %d reached with bad state or arguments\n", n,
            n - missing);
    ck_assert_msg(missing == 0, "%d public functions of ctpu.h have no hostile case", missing);
    ctpu_shutdown();                                 /* again: harmless */
}
END_TEST

/* ------------------------------------------------------------ extreme arguments */
/* Collectives with extreme arguments, in a world of one rank (issue 19). */
START_TEST(collectives_extreme_arguments)
{
    ctpu_tensor a = t_f32((float[]){ 1, 2, 3, 4, 5, 6 }, 2, (int64_t[]){ 2, 3 });
    NUL(ctpu_broadcast(a, INT_MIN), CTPU_ERR_INVALID_ARG, "broadcast");
    NUL(ctpu_broadcast(a, INT_MAX), CTPU_ERR_INVALID_ARG, "broadcast");
    NUL(ctpu_all_gather(a, INT_MIN), CTPU_ERR_SHAPE, "all_gather");
    NUL(ctpu_all_gather(a, INT_MAX), CTPU_ERR_SHAPE, "all_gather");
    NUL(ctpu_reduce_scatter(a, INT_MIN, CTPU_DIST_SUM), CTPU_ERR_SHAPE, "reduce_scatter");
    NUL(ctpu_reduce_scatter(a, 0, (ctpu_dist_op)-1), CTPU_ERR_INVALID_ARG, "reduce_scatter");
    NUL(ctpu_all_reduce(a, (ctpu_dist_op)INT_MAX), CTPU_ERR_INVALID_ARG, "all_reduce");
    NUL(ctpu_all_reduce(FAKE, CTPU_DIST_SUM), CTPU_ERR_STALE_HANDLE, "all_reduce");
    /* overlap: a wait on what was not started (or twice), more than 64 in flight, hooks on non-leaves */
    NUL(ctpu_all_reduce_async(a, (ctpu_dist_op)-7), CTPU_ERR_INVALID_ARG, "all_reduce_async");
    NUL(ctpu_all_reduce_async(FAKE, CTPU_DIST_SUM), CTPU_ERR_STALE_HANDLE, "all_reduce_async");
    NUL(ctpu_all_reduce_wait(a), CTPU_ERR_INVALID_ARG, "all_reduce_wait");
    NUL(ctpu_all_reduce_wait(FAKE), CTPU_ERR_STALE_HANDLE, "all_reduce_wait");
    ck_assert_int_eq(ctpu_dist_set_bucket(INT64_MIN), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_dist_set_bucket(INT64_MAX), CTPU_ERR_INVALID_ARG);
    ck_assert(t_contains(ctpu_last_error(), "dist_set_bucket"));
    ck_assert_int_eq(ctpu_dist_set_bucket(INT64_MAX - 1), CTPU_OK);
    ck_assert_int_eq(ctpu_dist_set_collective_cut(false), CTPU_OK);
    ctpu_tensor y = ctpu_all_reduce(a, CTPU_DIST_SUM);
    ck_assert(!ctpu_is_null(y));
    ck_assert_int_eq(ctpu_dist_set_bucket(-1), CTPU_OK);
    ck_assert_int_eq(ctpu_dist_set_collective_cut(true), CTPU_OK);
    ctpu_dist_stats ds;
    ck_assert_int_eq(ctpu_dist_get_stats(NULL), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_dist_get_stats(&ds), CTPU_OK);
    ck_assert_uint_eq(ds.collectives, 1);   /* failed calls are not counted */
    FILE *dn = fopen("/dev/null", "w");
    ck_assert_int_eq(ctpu_dist_report(dn), CTPU_OK);
    fclose(dn);
    {
        ctpu_tensor st[65];
        for (int i = 0; i < 64; i++) {
            st[i] = ctpu_all_reduce_async(a, CTPU_DIST_SUM);
            ck_assert(!ctpu_is_null(st[i]));
        }
        NUL(ctpu_all_reduce_async(a, CTPU_DIST_SUM), CTPU_ERR_STATE, "all_reduce_async");
        for (int i = 0; i < 64; i++) {
            ctpu_tensor w = ctpu_all_reduce_wait(st[i]);
            ck_assert(!ctpu_is_null(w));
            NUL(ctpu_all_reduce_wait(st[i]), CTPU_ERR_INVALID_ARG, "all_reduce_wait");
            ck_assert_int_eq(ctpu_release(w), CTPU_OK);
            ck_assert_int_eq(ctpu_release(st[i]), CTPU_OK);
        }
        ctpu_tensor nl = ctpu_add_scalar(a, 1.0);
        ck_assert_int_eq(ctpu_register_post_accumulate_grad_hook(nl, NULL, NULL), CTPU_ERR_STATE);
        ck_assert(t_contains(ctpu_last_error(), "register_post_accumulate_grad_hook: t f32"));
        ck_assert_int_eq(ctpu_register_post_accumulate_grad_hook(FAKE, NULL, NULL), CTPU_ERR_STALE_HANDLE);
        ck_assert_int_eq(ctpu_release(nl), CTPU_OK);
    }
}
END_TEST

START_TEST(compiled_steps_hostile)
{
    ctpu_tensor x = ctpu_keep(ctpu_from_host((float[]){ 1, 2, 3 }, CTPU_F32, 1, (int64_t[]){ 3 })), out[2];
    ctpu_compiled *c = ctpu_compile(hostile_step, NULL, NULL);
    ck_assert_ptr_nonnull(c);
    int bad_n[4] = { -1, INT_MIN, 4097, INT_MAX };
    for (int k = 0; k < 4; k++) {
        ck_assert_int_eq(ctpu_compiled_call(c, bad_n[k], &x, 0, NULL, 1, out), CTPU_ERR_INVALID_ARG);
        ck_assert(t_contains(ctpu_last_error(), "n_in"));
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, bad_n[k], NULL, 1, out), CTPU_ERR_INVALID_ARG);
        ck_assert(t_contains(ctpu_last_error(), "n_scalars"));
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, bad_n[k], out), CTPU_ERR_INVALID_ARG);
        ck_assert(t_contains(ctpu_last_error(), "n_out"));
        good_op();
    }
    ctpu_tensor junk[2] = { FAKE, CTPU_NULL };
    ck_assert_int_eq(ctpu_compiled_call(c, 1, junk, 0, NULL, 1, out), CTPU_ERR_STALE_HANDLE);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, junk + 1, 0, NULL, 1, out), CTPU_ERR_NULL_HANDLE);
    ck_assert(ctpu_is_null(out[0]));
    /* a call with fewer outputs than fn writes would be fn's bug; 1 is what it writes */
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);   /* replayed */
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(c, &info), CTPU_OK);
    ck_assert_int_eq(info.replays, 1);
    ctpu_compiled_free(c);
    /* fn's own error comes back, and nothing is kept */
    c = ctpu_compile(failing_step, NULL, NULL);
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_ERR_SHAPE);
        ck_assert_msg(t_contains(ctpu_last_error(), "reshape"), "%s", ctpu_last_error());
        ck_assert(ctpu_is_null(out[0]));
    }
    ctpu_compiled_free(c);
    /* a garbage handle in out[] is dropped */
    c = ctpu_compile(garbage_step, NULL, NULL);
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
    ck_assert(ctpu_is_null(out[0]));
    ck_assert_int_eq(ctpu_compiled_call(c, 1, &x, 0, NULL, 1, out), CTPU_OK);
    ck_assert(ctpu_is_null(out[0]));
    ctpu_compiled_free(c);
    ck_assert_ptr_null(ctpu_compile(NULL, NULL, &(ctpu_compile_opts){ .name = "x", .fullgraph = true }));
    ck_assert(t_contains(ctpu_last_error(), "compile: fn is NULL"));
    good_op();
    ctpu_release(x);
}
END_TEST

START_TEST(extreme_integers_and_values)
{
    ctpu_tensor a = t_f32((float[]){ 1, 2, 3, 4, 5, 6 }, 2, (int64_t[]){ 2, 3 });
    ctpu_tensor i = t_i32((int32_t[]){ 0, 1, 0, 1, 0, 1 }, 2, (int64_t[]){ 2, 3 });
    ck_assert_int_eq(ctpu_dim(a, INT_MIN), -1);
    expect_msg(ctpu_last_status(), CTPU_ERR_SHAPE, "dim", "dim INT_MIN");
    ck_assert_int_eq(ctpu_dim(a, INT_MAX), -1);
    expect_msg(ctpu_last_status(), CTPU_ERR_SHAPE, "dim", "dim INT_MAX");
    NUL(ctpu_sum(a, 1, (int[]){ INT_MIN }, false), CTPU_ERR_SHAPE, "sum");
    NUL(ctpu_var(a, 1, (int[]){ 0 }, INT_MIN, false), CTPU_ERR_INVALID_ARG, "var");
    NUL(ctpu_sum(a, INT_MAX, (int[]){ 0 }, false), CTPU_ERR_INVALID_ARG, "sum");
    NUL(ctpu_argmax(a, INT_MIN, false), CTPU_ERR_SHAPE, "argmax");
    /* issue 12's reductions, scans, scatters and creators */
    NUL(ctpu_argmin(a, INT_MAX, false), CTPU_ERR_SHAPE, "argmin");
    NUL(ctpu_prod(a, 1, (int[]){ INT_MIN }, false), CTPU_ERR_SHAPE, "prod");
    NUL(ctpu_prod(a, INT_MIN, (int[]){ 0 }, false), CTPU_ERR_INVALID_ARG, "prod");
    NUL(ctpu_logsumexp(a, 1, (int[]){ INT_MAX }, true), CTPU_ERR_SHAPE, "logsumexp");
    NUL(ctpu_logsumexp(a, 3, NULL, true), CTPU_ERR_INVALID_ARG, "logsumexp");
    NUL(ctpu_cumsum(a, INT_MIN), CTPU_ERR_SHAPE, "cumsum");
    NUL(ctpu_scatter_add(a, INT_MIN, i, a), CTPU_ERR_SHAPE, "scatter_add");
    NUL(ctpu_scatter_add(a, 0, a, a), CTPU_ERR_DTYPE, "scatter_add");
    NUL(ctpu_scatter_add(a, 0, i, i), CTPU_ERR_DTYPE, "scatter_add");
    NUL(ctpu_scatter_add(a, 0, t_i32((int32_t[]){ 0 }, 1, (int64_t[]){ 1 }), a), CTPU_ERR_SHAPE, "scatter_add");
    NUL(ctpu_index_add(a, INT_MIN, t_i32((int32_t[]){ 0 }, 1, (int64_t[]){ 1 }), a, 1), CTPU_ERR_SHAPE, "index_add");
    NUL(ctpu_index_add(a, 0, t_i32((int32_t[]){ 0, 1 }, 1, (int64_t[]){ 2 }), a, INFINITY), CTPU_ERR_INVALID_ARG,
        "index_add");
    NUL(ctpu_index_add(a, 0, i, a, 1), CTPU_ERR_SHAPE, "index_add");
    NUL(ctpu_randint(CTPU_I32, 1, (int64_t[]){ 4 }, INT64_MIN, INT64_MAX), CTPU_ERR_INVALID_ARG, "randint");
    NUL(ctpu_randint(CTPU_I32, 1, (int64_t[]){ 4 }, INT64_MAX, INT64_MIN), CTPU_ERR_INVALID_ARG, "randint");
    NUL(ctpu_randint(CTPU_I32, 1, (int64_t[]){ INT64_MIN }, 0, 2), CTPU_ERR_SHAPE, "randint");
    NUL(ctpu_randint((ctpu_dtype)INT_MIN, 1, (int64_t[]){ 4 }, 0, 2), CTPU_ERR_DTYPE, "randint");
    NUL(ctpu_randint_like(a, 3, 3), CTPU_ERR_INVALID_ARG, "randint");
    NUL(ctpu_randn_like(i), CTPU_ERR_DTYPE, "randn_like");
    NUL(ctpu_full_like(FAKE, 1), CTPU_ERR_STALE_HANDLE, "full_like");
    NUL(ctpu_eye(INT64_MIN, 2, CTPU_F32), CTPU_ERR_INVALID_ARG, "eye");
    NUL(ctpu_eye(INT64_MAX, INT64_MAX, CTPU_F32), CTPU_ERR_INVALID_ARG, "eye");
    NUL(ctpu_eye(2147483647, 2147483647, CTPU_F32), CTPU_ERR_SHAPE, "eye");
    NUL(ctpu_eye(2, 2, (ctpu_dtype)77), CTPU_ERR_DTYPE, "eye");
    NUL(ctpu_linspace(0, 1, INT64_MIN, CTPU_F32), CTPU_ERR_INVALID_ARG, "linspace");
    NUL(ctpu_linspace(0, 1, INT64_MAX, CTPU_F32), CTPU_ERR_INVALID_ARG, "linspace");
    NUL(ctpu_linspace(-INFINITY, 1, 3, CTPU_F32), CTPU_ERR_INVALID_ARG, "linspace");
    NUL(ctpu_linspace(0, 1, 3, (ctpu_dtype)-1), CTPU_ERR_DTYPE, "linspace");
    NUL(ctpu_clip_grad_norm(INT_MIN, &a, 1, 2), CTPU_ERR_INVALID_ARG, "clip_grad_norm");
    NUL(ctpu_clip_grad_norm(INT_MAX, NULL, 1, 2), CTPU_ERR_INVALID_ARG, "clip_grad_norm");
    NUL(ctpu_clip_grad_norm(1, &a, -INFINITY, 2), CTPU_ERR_INVALID_ARG, "clip_grad_norm");
    NUL(ctpu_clip_grad_norm(1, &a, 1, -INFINITY), CTPU_ERR_INVALID_ARG, "clip_grad_norm");
    NUL(ctpu_clip_grad_norm(1, &a, 1, -0.0), CTPU_ERR_INVALID_ARG, "clip_grad_norm");
    NUL(ctpu_clip_grad_norm(1, &FAKE, 1, 2), CTPU_ERR_STALE_HANDLE, "clip_grad_norm");
    NUL(ctpu_clip_grad_norm(2, (ctpu_tensor[]){ a, CTPU_NULL }, 1, 2), CTPU_ERR_NULL_HANDLE, "clip_grad_norm");
    NUL(ctpu_softmax(a, INT_MAX), CTPU_ERR_SHAPE, "softmax");
    NUL(ctpu_scaled_dot_product_attention(a, a, a, CTPU_NULL, (ctpu_mask_kind)INT_MIN, false, 0, 0), CTPU_ERR_INVALID_ARG,
        "scaled_dot_product_attention");
    NUL(ctpu_scaled_dot_product_attention(a, a, a, CTPU_NULL, CTPU_MASK_NONE, true, -INFINITY, 0), CTPU_ERR_INVALID_ARG,
        "scaled_dot_product_attention");
    NUL(ctpu_scaled_dot_product_attention(a, a, a, CTPU_NULL, CTPU_MASK_NONE, true, 0, INFINITY), CTPU_ERR_INVALID_ARG,
        "scaled_dot_product_attention");
    NUL(ctpu_scaled_dot_product_attention(a, a, a, a, CTPU_MASK_KEEP01, true, 0, 0), CTPU_ERR_SHAPE,
        "scaled_dot_product_attention");
    NUL(ctpu_scaled_dot_product_attention_bthd(a, a, a, CTPU_NULL, CTPU_MASK_NONE, true, 0, INFINITY),
        CTPU_ERR_INVALID_ARG, "scaled_dot_product_attention");
    NUL(ctpu_scaled_dot_product_attention_bthd(a, a, a, a, CTPU_MASK_KEEP01, true, 0, 0), CTPU_ERR_SHAPE,
        "scaled_dot_product_attention");
    NUL(ctpu_transpose(a, INT_MIN, 0), CTPU_ERR_SHAPE, "transpose");
    NUL(ctpu_transpose(a, 0, INT_MAX), CTPU_ERR_SHAPE, "transpose");
    NUL(ctpu_permute(a, (int[]){ INT_MIN, 0 }), CTPU_ERR_SHAPE, "permute");
    NUL(ctpu_concat(2, (ctpu_tensor[]){ a, a }, INT_MIN), CTPU_ERR_SHAPE, "concat");
    NUL(ctpu_concat(INT_MIN, (ctpu_tensor[]){ a, a }, 0), CTPU_ERR_INVALID_ARG, "concat");
    NUL(ctpu_gather(a, INT_MIN, i), CTPU_ERR_SHAPE, "gather");
    NUL(ctpu_slice(a, INT_MIN, 0, 1, 1), CTPU_ERR_SHAPE, "slice");
    NUL(ctpu_slice(a, 0, 0, 1, INT64_MIN), CTPU_ERR_INVALID_ARG, "slice");
    NUL(ctpu_reshape(a, 2, (int64_t[]){ INT64_MIN, -1 }), CTPU_ERR_SHAPE, "reshape");
    NUL(ctpu_reshape(a, 3, (int64_t[]){ INT64_MAX, INT64_MAX, 0 }), CTPU_ERR_SHAPE, "reshape");
    NUL(ctpu_expand(a, 2, (int64_t[]){ INT64_MIN, 3 }), CTPU_ERR_SHAPE, "expand");
    NUL(ctpu_zeros(CTPU_F32, 3, (int64_t[]){ INT64_MAX, INT64_MAX, 0 }), CTPU_ERR_SHAPE, "zeros");
    NUL(ctpu_full(CTPU_F32, 1, (int64_t[]){ INT64_MIN }, 1), CTPU_ERR_SHAPE, "full");
    NUL(ctpu_from_host((float[]){ 0 }, CTPU_F32, INT_MAX, (int64_t[]){ 1 }), CTPU_ERR_SHAPE, "from_host");
    NUL(ctpu_from_host((float[]){ 0 }, CTPU_F32, INT_MIN, (int64_t[]){ 1 }), CTPU_ERR_SHAPE, "from_host");
    NUL(ctpu_arange(-INFINITY, 0, 1, CTPU_F32), CTPU_ERR_INVALID_ARG, "arange");
    NUL(ctpu_arange(0, 1, NAN, CTPU_F32), CTPU_ERR_INVALID_ARG, "arange");
    NUL(ctpu_arange(0, 1, INFINITY, CTPU_F32), CTPU_ERR_INVALID_ARG, "arange");
    NUL(ctpu_rand_uniform(CTPU_F32, 1, (int64_t[]){ 4 }, 0, INFINITY), CTPU_ERR_INVALID_ARG, "rand_uniform");
    NUL(ctpu_rand_normal(CTPU_F32, 1, (int64_t[]){ 4 }, NAN, 1), CTPU_ERR_INVALID_ARG, "rand_normal");
    NUL(ctpu_rand_normal(CTPU_F32, 1, (int64_t[]){ 4 }, 0, INFINITY), CTPU_ERR_INVALID_ARG, "rand_normal");
    ERR(ctpu_set_mode((ctpu_mode)INT_MIN), CTPU_ERR_INVALID_ARG, "set_mode");
    ERR(ctpu_set_thread_mode((ctpu_mode)INT_MAX), CTPU_ERR_INVALID_ARG, "set_thread_mode");
    ERR(ctpu_set_matmul_precision((ctpu_precision)-1), CTPU_ERR_INVALID_ARG, "set_matmul_precision");
    ERR(ctpu_set_steps_per_epoch(-1), CTPU_ERR_INVALID_ARG, "steps_per_epoch");
    ERR(ctpu_set_steps_per_epoch(INT64_MIN), CTPU_ERR_INVALID_ARG, "steps_per_epoch");
    ERR(ctpu_item(a, NULL), CTPU_ERR_INVALID_ARG, "item");
    /* host helpers and print: bad shapes, NULL data, short buffers, bad handles */
    NUL(ctpu_from_host_f32_as_bf16(NULL, 1, (int64_t[]){ 4 }), CTPU_ERR_INVALID_ARG, "from_host_f32_as_bf16");
    NUL(ctpu_from_host_f32_as_bf16((float[]){ 0 }, INT_MAX, (int64_t[]){ 1 }), CTPU_ERR_SHAPE, "from_host_f32_as_bf16");
    NUL(ctpu_from_host_f32_as_bf16((float[]){ 0 }, 1, (int64_t[]){ INT64_MIN }), CTPU_ERR_SHAPE, "from_host_f32_as_bf16");
    NUL(ctpu_from_host_f32_as_bf16((float[]){ 0 }, 2, NULL), CTPU_ERR_INVALID_ARG, "from_host_f32_as_bf16");
    ERR(ctpu_to_host_as_f32(a, NULL, 24), CTPU_ERR_INVALID_ARG, "to_host_as_f32");
    ERR(ctpu_to_host_as_f32(a, (float[5]){ 0 }, 20), CTPU_ERR_INVALID_ARG, "to_host_as_f32");
    ERR(ctpu_to_host_as_f32(FAKE, (float[5]){ 0 }, 20), CTPU_ERR_STALE_HANDLE, "to_host_as_f32");
    ERR(ctpu_to_host_as_f32(CTPU_NULL, (float[5]){ 0 }, 20), CTPU_ERR_NULL_HANDLE, "to_host_as_f32");
    ERR(ctpu_print(CTPU_NULL, NULL), CTPU_ERR_NULL_HANDLE, "print");
    ERR(ctpu_mark_dynamic(FAKE, 0, 2, 8), CTPU_ERR_STALE_HANDLE, "mark_dynamic");
    ERR(ctpu_mark_dynamic(CTPU_NULL, 0, 2, 8), CTPU_ERR_NULL_HANDLE, "mark_dynamic");
    ERR(ctpu_mark_dynamic(a, 9, 2, 8), CTPU_ERR_INVALID_ARG, "mark_dynamic");
    ERR(ctpu_mark_dynamic(a, INT_MIN, 2, 8), CTPU_ERR_INVALID_ARG, "mark_dynamic");
    ERR(ctpu_mark_dynamic(a, 0, 1, 8), CTPU_ERR_INVALID_ARG, "mark_dynamic");
    ERR(ctpu_mark_dynamic(a, 0, INT64_MIN, INT64_MAX), CTPU_ERR_INVALID_ARG, "mark_dynamic");
    ERR(ctpu_mark_dynamic(a, 0, 8, 2), CTPU_ERR_INVALID_ARG, "mark_dynamic");
    ERR(ctpu_declare_dynamic_inputs((ctpu_dtype)-1, 2, 0, 2, 8), CTPU_ERR_INVALID_ARG, "declare_dynamic_inputs");
    ERR(ctpu_declare_dynamic_inputs(CTPU_F32, INT_MIN, 0, 2, 8), CTPU_ERR_INVALID_ARG, "declare_dynamic_inputs");
    ERR(ctpu_declare_dynamic_inputs(CTPU_F32, 2, INT_MAX, 2, 8), CTPU_ERR_INVALID_ARG, "declare_dynamic_inputs");
    ERR(ctpu_declare_dynamic_inputs(CTPU_F32, 2, 0, INT64_MIN, INT64_MAX), CTPU_ERR_INVALID_ARG, "declare_dynamic_inputs");
    ERR(ctpu_set_name(FAKE, "x"), CTPU_ERR_STALE_HANDLE, "set_name");
    ERR(ctpu_set_name(CTPU_NULL, "x"), CTPU_ERR_NULL_HANDLE, "set_name");
    ERR(ctpu_set_name(a, "\x1b[31mred"), CTPU_ERR_INVALID_ARG, "set_name");
    {
        char longname[5000];
        memset(longname, 'q', sizeof longname - 1);
        longname[sizeof longname - 1] = 0;
        ERR(ctpu_set_name(a, longname), CTPU_ERR_INVALID_ARG, "set_name");
        ck_assert_str_eq(ctpu_name(FAKE), "");
        ck_assert_int_eq(ctpu_set_name(a, "a"), CTPU_OK);
        ck_assert_int_eq(ctpu_set_name(a, ""), CTPU_OK);
        ck_assert_str_eq(ctpu_name(a), "");
    }
    ERR(ctpu_print(FAKE, NULL), CTPU_ERR_STALE_HANDLE, "print");
    {
        FILE *ro = fopen("/dev/null", "r");   /* a stream that cannot be written */
        ck_assert_ptr_nonnull(ro);
        ERR(ctpu_print(a, ro), CTPU_ERR_IO, "print");
        fclose(ro);
    }
    float six[6];
    ck_assert_int_eq(ctpu_to_host(a, six, SIZE_MAX), CTPU_OK);         /* a huge dst_bytes is fine */
    /* a NaN fill of i32 is an error (torch: "value cannot be converted to type int without overflow");
     * values that are legal however odd: -0.5 fills i32 with 0, Inf clamps */
    NUL(ctpu_full(CTPU_I32, 1, (int64_t[]){ 2 }, NAN), CTPU_ERR_INVALID_ARG, "full: value=nan");
    ctpu_tensor z = ctpu_full(CTPU_I32, 1, (int64_t[]){ 2 }, -0.5);
    int32_t zi[2];
    ck_assert_int_eq(ctpu_to_host(z, zi, sizeof zi), CTPU_OK);
    ck_assert_int_eq(zi[0], 0);
    ctpu_tensor c = ctpu_clamp(a, -INFINITY, INFINITY);
    float cf[6];
    ck_assert_int_eq(ctpu_to_host(c, cf, sizeof cf), CTPU_OK);
    ck_assert(cf[5] == 6);
    /* the generator's offset near its end: draws still work, and differ */
    ck_assert_int_eq(ctpu_rng_set_state(1, UINT64_MAX - 2), CTPU_OK);
    ctpu_tensor r = ctpu_rand_uniform(CTPU_F32, 1, (int64_t[]){ 8 }, 0, 1);
    float rf[8];
    ck_assert_int_eq(ctpu_to_host(r, rf, sizeof rf), CTPU_OK);
    for (int k = 0; k < 8; k++) ck_assert(rf[k] >= 0 && rf[k] < 1);
    /* long strings are cut, never overflow */
    char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    ck_assert_int_eq(ctpu_set_host_read_label(big), CTPU_OK);
    ck_assert_int_eq(ctpu_set_host_read_label(NULL), CTPU_OK);
    ck_assert_ptr_null(ctpu_chip_lookup(big));
    ck_assert_int_eq(ctpu_report_error((ctpu_status)999, "odd status"), (ctpu_status)999);
    ck_assert_str_eq(ctpu_status_str(ctpu_last_status()), "unknown status");
    ctpu_clear_error();
    good_op();
}
END_TEST

/* Scopes and no-grad regions nested past their limits; autograd misuse. */
START_TEST(nesting_and_autograd_misuse)
{
    int opened = 0;
    ctpu_status st = CTPU_OK;
    for (int k = 0; k < 200 && st == CTPU_OK; k++)
        if ((st = ctpu_scope_begin()) == CTPU_OK) opened++;
    ck_assert_msg(st == CTPU_ERR_STATE && t_contains(ctpu_last_error(), "scope"), "%s", ctpu_last_error());
    ck_assert_int_ge(opened, 64);
    good_op();
    for (int k = 0; k < opened; k++) ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    ERR(ctpu_scope_end(), CTPU_ERR_STATE, "scope_end");
    for (int k = 0; k < 1000; k++) ck_assert_int_eq(ctpu_no_grad_begin(), CTPU_OK);
    ck_assert(!ctpu_grad_enabled());
    for (int k = 0; k < 1000; k++) ck_assert_int_eq(ctpu_no_grad_end(), CTPU_OK);
    ck_assert(ctpu_grad_enabled());
    ERR(ctpu_no_grad_end(), CTPU_ERR_STATE, "no_grad");
    /* keep with no scope open: the handle becomes global and stays usable */
    ctpu_tensor g = ctpu_keep(T_VEC(1, 2));
    ck_assert(ctpu_is_valid(g));
    ck_assert_int_eq(ctpu_release(g), CTPU_OK);
    ERR(ctpu_release(g), CTPU_ERR_STALE_HANDLE, "release");
    /* autograd */
    ctpu_tensor w = T_VEC(1, 2, 3);
    ck_assert_int_eq(ctpu_set_requires_grad(w, true), CTPU_OK);
    ctpu_tensor y = ctpu_mul(w, w);
    ERR(ctpu_set_requires_grad(y, false), CTPU_ERR_STATE, "requires_grad");
    ERR(ctpu_backward_ex(y, ctpu_zeros(CTPU_I32, 1, (int64_t[]){ 3 }), false), CTPU_ERR_DTYPE, "backward");
    ctpu_tensor l = ctpu_sum(y, 0, NULL, false);
    ck_assert_int_eq(ctpu_backward(l), CTPU_OK);
    ERR(ctpu_backward(l), CTPU_ERR_STATE, "backward");            /* the tape was released */
    ck_assert(ctpu_is_null(ctpu_grad(y)));                           /* not a leaf: no .grad, no error */
    ctpu_tensor gw = ctpu_grad(w);
    float gf[3];
    ck_assert_int_eq(ctpu_to_host(gw, gf, sizeof gf), CTPU_OK);
    ck_assert(gf[0] == 2 && gf[2] == 6);
    /* the .grad is the leaf's: releasing it is an error, and it stays */
    ERR(ctpu_release(gw), CTPU_ERR_STATE, "ctpu_zero_grad");
    ck_assert(ctpu_is_valid(gw));
    ck_assert(ctpu_grad(w).id == gw.id);
    ck_assert_int_eq(ctpu_to_host(gw, gf, sizeof gf), CTPU_OK);
    ck_assert(gf[0] == 2 && gf[2] == 6);
    ck_assert_int_eq(ctpu_zero_grad(w), CTPU_OK);
    ck_assert_int_eq(ctpu_zero_grad(w), CTPU_OK);                     /* twice: still none */
    ck_assert(ctpu_is_null(ctpu_grad(w)));
    ck_assert_int_eq(ctpu_is_valid(gw), false);                      /* the old .grad handle is gone */
    ctpu_tensor d = ctpu_detach(y);
    ck_assert(!ctpu_requires_grad(d));
    ERR(ctpu_backward(ctpu_sum(d, 0, NULL, false)), CTPU_ERR_STATE, "backward");
    good_op();
}
END_TEST

/* (A thread's trace recorder and scope lists used to leak when the thread
 * exited; they are freed by thread-exit destructors now, and LeakSanitizer
 * checks it.) */

/* A handle from an earlier runtime, another thread's pending value. */
static ctpu_tensor other_pending, other_input;
static pthread_barrier_t bar;
static void *make_pending(void *arg)
{
    (void)arg;
    ctpu_set_thread_mode(CTPU_MODE_DEFER_FUSE);
    other_input = ctpu_keep(T_VEC(1, 2));
    other_pending = ctpu_keep(ctpu_exp(other_input));              /* recorded, not cut */
    pthread_barrier_wait(&bar);                                     /* the main thread tries it */
    pthread_barrier_wait(&bar);
    ctpu_mark_step();                                               /* then the owner cuts */
    ctpu_release(other_pending);
    ctpu_release(other_input);
    return NULL;
}

START_TEST(handles_across_runtimes_and_threads)
{
    ctpu_tensor old = ctpu_keep(T_VEC(1, 2, 3));
    ctpu_shutdown();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert(!ctpu_is_valid(old));
    NUL(ctpu_exp(old), CTPU_ERR_STALE_HANDLE, "exp");
    NUL(ctpu_add(T_VEC(1, 2, 3), old), CTPU_ERR_STALE_HANDLE, "add");
    ERR(ctpu_to_host(old, (float[3]){ 0 }, 12), CTPU_ERR_STALE_HANDLE, "to_host");
    ERR(ctpu_release(old), CTPU_ERR_STALE_HANDLE, "release");
    /* a value pending in another thread's trace */
    pthread_t th;
    pthread_barrier_init(&bar, NULL, 2);
    pthread_create(&th, NULL, make_pending, NULL);
    pthread_barrier_wait(&bar);
    ck_assert(!ctpu_is_null(other_pending));
    ctpu_set_thread_mode(CTPU_MODE_DEFER_FUSE);
    ctpu_clear_error();
    ctpu_tensor mine = ctpu_exp(other_pending);
    ck_assert(ctpu_is_null(mine));
    expect_msg(ctpu_last_status(), CTPU_ERR_STATE, "another thread", "pending elsewhere");
    ctpu_clear_thread_mode();
    float two[2];
    ERR(ctpu_to_host(other_pending, two, sizeof two), CTPU_ERR_STATE, "another thread");
    pthread_barrier_wait(&bar);
    pthread_join(th, NULL);
    pthread_barrier_destroy(&bar);
    ctpu_clear_error();
    good_op();
}
END_TEST

/* ------------------------------------------------------------ metrics and reports */
START_TEST(reports_hostile)
{
    good_op();
    ERR(ctpu_metrics_write(NULL), CTPU_ERR_INVALID_ARG, "metrics");
    ERR(ctpu_metrics_write("/nonexistent-dir/m.json"), CTPU_ERR_IO, "/nonexistent-dir/m.json");
    ERR(ctpu_metrics_write("/"), CTPU_ERR_IO, "/");
    ERR(ctpu_cache_get_info(NULL), CTPU_ERR_INVALID_ARG, "cache");
    ERR(ctpu_cost_table_get(NULL), CTPU_ERR_INVALID_ARG, "cost_table");
    ctpu_cost_table tab;
    ck_assert_int_eq(ctpu_cost_table_get(&tab), CTPU_OK);
    tab.n_rows = 99;
    ERR(ctpu_cost_table_print(&tab, NULL), CTPU_ERR_INVALID_ARG, "cost_table");
    tab.n_rows = -1;
    ERR(ctpu_cost_table_print(&tab, NULL), CTPU_ERR_INVALID_ARG, "cost_table");
    ctpu_cost_estimate ce;
    ERR(ctpu_cost_matmul(NULL, 1, 8, 8, 8, CTPU_F32, CTPU_PRECISION_DEFAULT, &ce), CTPU_ERR_INVALID_ARG, "cost");
    ERR(ctpu_cost_matmul("v5e", -1, 8, 8, 8, CTPU_F32, CTPU_PRECISION_DEFAULT, &ce), CTPU_ERR_INVALID_ARG, "cost");
    ERR(ctpu_cost_matmul("v5e", 1, 8, INT64_MIN, 8, CTPU_F32, CTPU_PRECISION_DEFAULT, &ce), CTPU_ERR_INVALID_ARG, "cost");
    ERR(ctpu_cost_matmul("v5e", 1, 8, 8, 8, (ctpu_dtype)9, CTPU_PRECISION_DEFAULT, &ce), CTPU_ERR_INVALID_ARG, "cost");
    ERR(ctpu_cost_matmul("v5e", 1, 8, 8, 8, CTPU_F32, (ctpu_precision)9, &ce), CTPU_ERR_INVALID_ARG, "cost");
    ERR(ctpu_cost_matmul("v5e", 1, 8, 8, 8, CTPU_F32, CTPU_PRECISION_DEFAULT, NULL), CTPU_ERR_INVALID_ARG, "cost");
    /* huge extents do not overflow into nonsense (INT64_MAX once overflowed
     * costmodel.c's pad_to: signed overflow under UBSan) */
    int64_t huge = INT64_MAX;
    ck_assert_int_eq(ctpu_cost_matmul("v5e", huge, huge, huge, huge, CTPU_F32,
                                      CTPU_PRECISION_HIGHEST, &ce) == CTPU_OK ? (ce.total_s >= 0) : 1, 1);
    ctpu_clear_error();
    /* garbage JSON: every one a clean CTPU_ERR_IO / INVALID_ARG, never a crash */
    FILE *devnull = fopen("/dev/null", "w");
    ck_assert_ptr_nonnull(devnull);
    static char deep[200001];
    for (int k = 0; k < 100000; k++) { deep[k] = '['; deep[100000 + k] = ']'; }
    deep[200000] = 0;
    char *good = ctpu_metrics_json();
    ck_assert_ptr_nonnull(good);
    size_t glen = strlen(good);
    char *cut = strndup(good, glen / 2);
    char *bin = malloc(300);
    for (int k = 0; k < 299; k++) bin[k] = (char)(1 + (k * 37) % 255);
    bin[299] = 0;
    const char *garbage[] = { "", " ", "{", "}", "null", "[]", "0", "\"x\"", "{\"counters\": 5}",
                              "{\"counters\": {\"syncs\": \"many\"}}", "{\"cache\": [1,2,3], \"timers\": null}",
                              "{\"a\":1e999999}", "{\"a\":-1e999999, \"steps\": [{}, {}, null]}", deep, cut, bin };
    for (size_t k = 0; k < sizeof garbage / sizeof garbage[0]; k++) {
        ctpu_clear_error();
        ctpu_status st = ctpu_report_render(garbage[k], "run", CTPU_REPORT_TEXT, devnull);
        ck_assert_msg(st == CTPU_ERR_IO || st == CTPU_ERR_INVALID_ARG, "garbage %zu rendered: %s", k, ctpu_status_str(st));
        ck_assert_msg(ctpu_last_error()[0] && !strchr(ctpu_last_error(), '\n'), "garbage %zu: message \"%s\"", k,
                      ctpu_last_error());
        st = ctpu_report_compare(good, "a", garbage[k], "b", CTPU_REPORT_MARKDOWN, devnull);
        ck_assert_msg(st == CTPU_ERR_IO || st == CTPU_ERR_INVALID_ARG, "garbage %zu compared: %s", k, ctpu_status_str(st));
        const char *js[2] = { good, garbage[k] }, *nm[2] = { "a", "b" };
        st = ctpu_report_plot_svg(2, js, nm, devnull);
        ck_assert_msg(st == CTPU_ERR_IO || st == CTPU_ERR_INVALID_ARG, "garbage %zu plotted: %s", k, ctpu_status_str(st));
    }
    ctpu_clear_error();
    ERR(ctpu_report_render(NULL, "x", CTPU_REPORT_TEXT, devnull), CTPU_ERR_INVALID_ARG, "");
    ERR(ctpu_report_render(good, "x", (ctpu_report_format)7, devnull), CTPU_ERR_INVALID_ARG, "");
    ERR(ctpu_report_plot_svg(-1, NULL, NULL, devnull), CTPU_ERR_INVALID_ARG, "");
    ck_assert_int_eq(ctpu_report_render(good, NULL, CTPU_REPORT_JSON, devnull), CTPU_OK);
    /* the ctpu-report tool on garbage files: exit status 2, no crash */
    const char *tool = getenv("CTPU_TEST_REPORT_TOOL");
    if (tool && access(tool, X_OK) == 0) {
        char path[] = "/tmp/ctpu-hostile-XXXXXX";
        int fd = mkstemp(path);
        ck_assert_int_ge(fd, 0);
        for (size_t k = 0; k < sizeof garbage / sizeof garbage[0]; k++) {
            ck_assert_int_eq(ftruncate(fd, 0), 0);
            ck_assert_int_eq(lseek(fd, 0, SEEK_SET), 0);
            ck_assert(write(fd, garbage[k], strlen(garbage[k])) == (ssize_t)strlen(garbage[k]));
            char cmd[1024];
            snprintf(cmd, sizeof cmd, "'%s' '%s' >/dev/null 2>&1", tool, path);
            int rc = system(cmd);
            ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "ctpu-report on garbage %zu: status %d", k, rc);
        }
        close(fd);
        unlink(path);
    } else {
        fprintf(stderr, "hostile: CTPU_TEST_REPORT_TOOL not set: the ctpu-report tool part is skipped\n");
    }
    free(good);
    free(cut);
    free(bin);
    fclose(devnull);
    good_op();
}
END_TEST

/* ------------------------------------------------------------ idx files */
static char tmpdir[256];

static size_t make_idx(uint8_t *out, int nd, const uint32_t *dims)
{
    size_t o = 0;
    out[o++] = 0; out[o++] = 0; out[o++] = 8; out[o++] = (uint8_t)nd;
    size_t n = 1;
    for (int d = 0; d < nd; d++) {
        out[o++] = (uint8_t)(dims[d] >> 24); out[o++] = (uint8_t)(dims[d] >> 16);
        out[o++] = (uint8_t)(dims[d] >> 8); out[o++] = (uint8_t)dims[d];
        n *= dims[d];
    }
    for (size_t k = 0; k < n; k++) out[o++] = (uint8_t)(k * 7);
    return o;
}

static void write_file(const char *path, const uint8_t *b, size_t n, bool gz)
{
    if (gz) {
        gzFile g = gzopen(path, "wb");
        ck_assert_ptr_nonnull(g);
        if (n) ck_assert_int_eq(gzwrite(g, b, (unsigned)n), (int)n);
        gzclose(g);
    } else {
        FILE *f = fopen(path, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(fwrite(b, 1, n, f), n);
        fclose(f);
    }
}

START_TEST(idx_corruption)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ctpu-hostile-idx-%d", (int)getpid());
    mkdir(tmpdir, 0700);
    char path[512];
    snprintf(path, sizeof path, "%s/x", tmpdir);
    uint8_t good[4 + 12 + 60], bad[sizeof good + 8];
    uint32_t dims[3] = { 3, 4, 5 };
    size_t n = make_idx(good, 3, dims);
    ctpu_idx x;
    uint64_t s = 12345;
    int ok = 0, io = 0;
    for (int gz = 0; gz < 2; gz++) {
        for (int k = 0; k < 300; k++) {
            memcpy(bad, good, n);
            size_t m = n;
            int kind = (int)(t_rng_next(&s) % 4);
            if (kind == 0) bad[t_rng_next(&s) % 16] = (uint8_t)t_rng_next(&s);          /* header byte */
            else if (kind == 1) bad[t_rng_next(&s) % n] ^= (uint8_t)(1u << (t_rng_next(&s) % 8));
            else if (kind == 2) m = t_rng_next(&s) % n;                                    /* truncated */
            else { m = n + 1 + t_rng_next(&s) % 8; for (size_t q = n; q < m; q++) bad[q] = (uint8_t)q; } /* trailing */
            write_file(path, bad, m, gz);
            memset(&x, 0x5a, sizeof x);
            ctpu_clear_error();
            ctpu_status st = ctpu_idx_read(path, &x);
            if (st == CTPU_OK) {
                int64_t total = 1;
                for (int d = 0; d < x.ndim; d++) total *= x.shape[d];
                ck_assert(x.ndim >= 1 && x.ndim <= 4);
                ck_assert_int_eq(total, 60);          /* only a data byte changed */
                ck_assert_ptr_nonnull(x.data);
                ctpu_idx_free(&x);
                ok++;
            } else {
                ck_assert_msg(st == CTPU_ERR_IO, "corrupt idx %d/%d: %s", gz, k, ctpu_status_str(st));
                ck_assert_msg(t_contains(ctpu_last_error(), path), "message does not name the file: %s", ctpu_last_error());
                ck_assert(!strchr(ctpu_last_error(), '\n'));
                io++;
            }
        }
    }
    ck_assert_int_gt(io, 100);
    ck_assert_int_gt(ok, 10);
    /* a gzip header followed by garbage, a directory, an empty gzip */
    uint8_t gzbad[64] = { 0x1f, 0x8b, 8, 0 };
    for (int k = 4; k < 64; k++) gzbad[k] = (uint8_t)(k * 13);
    write_file(path, gzbad, sizeof gzbad, false);
    ck_assert_int_eq(ctpu_idx_read(path, &x), CTPU_ERR_IO);
    ck_assert_int_eq(ctpu_idx_read(tmpdir, &x), CTPU_ERR_IO);
    ck_assert(t_contains(ctpu_last_error(), tmpdir));
    write_file(path, good, 0, true);
    ck_assert_int_eq(ctpu_idx_read(path, &x), CTPU_ERR_IO);
    ck_assert_int_eq(ctpu_idx_read(path, NULL), CTPU_ERR_INVALID_ARG);
    /* a zero extent is a valid empty file */
    uint32_t zd[2] = { 0, 5 };
    n = make_idx(good, 2, zd);
    write_file(path, good, n, false);
    if (ctpu_idx_read(path, &x) == CTPU_OK) { ck_assert_int_eq(x.shape[0], 0); ctpu_idx_free(&x); }
    else ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_IO);
    unlink(path);
    rmdir(tmpdir);
    ctpu_clear_error();
    good_op();
}
END_TEST

/* ------------------------------------------------------------ environment */
static ctpu_status init_with(const char *var, const char *value)
{
    ctpu_shutdown();
    t_clear_env();
    setenv(var, value, 1);
    ctpu_clear_error();
    ctpu_status st = ctpu_init();
    unsetenv(var);
    return st;
}

START_TEST(env_hostile_values)
{
    static char huge[10001];
    memset(huge, '7', sizeof huge - 1);
    const struct { const char *var, *value; } bad[] = {
        { "TORCH_TPU_DEFER_AND_FUSE", "1\n" },     { "TORCH_TPU_LAUNCH_BLOCKING", "0\nTORCH" },
        { "TORCH_TPU_CHIP", "v5e\n" },              { "TORCH_TPU_CACHE_SIZE", "99999999999999999999999" },
        { "TORCH_TPU_CACHE_SIZE", "18446744073709551616" }, { "TORCH_TPU_HBM_LIMIT", "1E" },
        { "TORCH_TPU_HBM_LIMIT", "16M " },          { "TORCH_TPU_MATMUL_PRECISION", "high\t" },
        { "CTPU_NUM_THREADS", "4294967297" },        { "CTPU_NUM_THREADS", huge },
        { "TORCH_TPU_CACHE_ONLY", "99999999999999999999999" }, { "TORCH_TPU_DETECT_LOOPS", huge },
        { "TORCH_TPU_PRICE_PLAN", "spot" },          { "TORCH_TPU_PRICE_PLAN", "1y\n" },
        { "TORCH_TPU_PRICE_PLAN", huge },
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ctpu_status st = init_with(bad[k].var, bad[k].value);
        ck_assert_msg(st == CTPU_ERR_ENV, "%s=\"%.20s\": %s", bad[k].var, bad[k].value, ctpu_status_str(st));
        ck_assert(!ctpu_is_initialized());
        ck_assert_msg(t_contains(ctpu_last_error(), bad[k].var), "%s", ctpu_last_error());
        ck_assert_msg(!strchr(ctpu_last_error(), '\n'), "%s: the message is not one line", bad[k].var);
        ck_assert_uint_lt(strlen(ctpu_last_error()), 1024);
    }
    /* a tiny HBM cap is valid: ops fail with OOM, the runtime still runs */
    ck_assert_int_eq(init_with("TORCH_TPU_HBM_LIMIT", "1K"), CTPU_OK);
    NUL(ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 1024 }), CTPU_ERR_OOM, "capacity 1024 bytes");   /* op "full" */
    ctpu_tensor small = ctpu_ones(CTPU_F32, 1, (int64_t[]){ 4 });
    ck_assert(!ctpu_is_null(small));
    /* metrics and trace files that cannot be written: init says which and why */
    ck_assert_int_eq(init_with("TORCH_TPU_METRICS_FILE", "/nonexistent-dir/m.json"), CTPU_ERR_ENV);
    ck_assert(t_contains(ctpu_last_error(), "TORCH_TPU_METRICS_FILE") &&
              t_contains(ctpu_last_error(), "No such file or directory"));
    ck_assert_int_eq(init_with("TORCH_TPU_TRACE_FILE", "/nonexistent-dir/t.json"), CTPU_ERR_ENV);
    ck_assert(t_contains(ctpu_last_error(), "TORCH_TPU_TRACE_FILE"));
    /* ... and when the directory goes away during the run: shutdown reports, no crash */
    char dir[] = "/tmp/ctpu_gone_XXXXXX", mf[64], tf[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(mf, sizeof mf, "%s/m.json", dir);
    snprintf(tf, sizeof tf, "%s/t.json", dir);
    ctpu_shutdown();
    t_clear_env();
    setenv("TORCH_TPU_METRICS_FILE", mf, 1);
    setenv("TORCH_TPU_TRACE_FILE", tf, 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert_int_eq(rmdir(dir), 0);
    good_op();
    ctpu_shutdown();
    t_clear_env();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    good_op();
}
END_TEST

/* ------------------------------------------------------------ device faults in defer and fuse */
/* A program with a faulting gather, a value that depends on it and one
 * that does not; returns the handles (kept). */
static void faulting_program(ctpu_tensor *x, ctpu_tensor *dep, ctpu_tensor *indep)
{
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    *x = ctpu_keep(t_f32((float[]){ 1, 2, 3, 4, 5, 6 }, 2, (int64_t[]){ 2, 3 }));
    ctpu_tensor bad = ctpu_keep(t_i32((int32_t[]){ 0, 7, 1, 2, 0, 1 }, 2, (int64_t[]){ 2, 3 }));   /* 7 >= 3 */
    ck_assert_int_eq(ctpu_mark_step(), CTPU_OK);
    ctpu_step_begin();
    ctpu_tensor e = ctpu_exp(*x);
    ctpu_tensor g = ctpu_gather(e, 1, bad);                      /* the faulting op, inside a fused program */
    *dep = ctpu_keep(ctpu_mul_scalar(ctpu_add(g, e), 2));
    *indep = ctpu_keep(ctpu_sum(ctpu_tanh(*x), 0, NULL, false));
    ck_assert(!ctpu_is_null(g) && !ctpu_is_null(*dep));
    ctpu_status st = ctpu_step_end();
    ck_assert_msg(st == CTPU_OK || st == CTPU_ERR_DEVICE_FAULT, "%s", ctpu_status_str(st));
    ctpu_clear_error();
}

START_TEST(fused_index_fault_names_op_and_recovers)
{
    ctpu_tensor x, dep, indep;
    faulting_program(&x, &dep, &indep);
    float h[6];
    ck_assert_int_eq(ctpu_to_host(dep, h, sizeof h), CTPU_ERR_DEVICE_FAULT);
    ck_assert_msg(t_contains(ctpu_last_error(), "gather"), "the fault does not name gather: %s", ctpu_last_error());
    ck_assert_msg(t_contains(ctpu_last_error(), "7"), "the fault does not give the index: %s", ctpu_last_error());
    ctpu_clear_error();
    ctpu_status st = ctpu_sync();                                 /* reported once: here or at the read */
    ck_assert(st == CTPU_OK || (st == CTPU_ERR_DEVICE_FAULT && t_contains(ctpu_last_error(), "gather")));
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);                       /* cleared */
    ctpu_clear_error();
    ck_assert_int_eq(ctpu_release(dep), CTPU_OK);
    ck_assert_int_eq(ctpu_release(indep), CTPU_OK);
    /* recovered: the same program with good indices, in the same mode */
    ctpu_tensor okidx = ctpu_keep(t_i32((int32_t[]){ 0, 2, 1, 2, 0, 1 }, 2, (int64_t[]){ 2, 3 }));
    ctpu_step_begin();
    ctpu_tensor r = ctpu_keep(ctpu_gather(ctpu_exp(x), 1, okidx));
    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    ck_assert_int_eq(ctpu_to_host(r, h, sizeof h), CTPU_OK);
    ck_assert_float_eq_tol(h[1], expf(3), 1e-4);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    good_op();
}
END_TEST

/* Only the values computed from the faulting op are poisoned, in a fused
 * program too (found by this suite; fixed in 51b90e8 with per-output
 * dependency sets from the compiler). */
START_TEST(fused_fault_spares_independent_values)
{
    ctpu_tensor x, dep, indep;
    faulting_program(&x, &dep, &indep);
    double v;
    ck_assert_msg(ctpu_item(indep, &v) == CTPU_OK, "an independent value was poisoned: %s", ctpu_last_error());
    ck_assert_double_eq_tol(v, tanh(1) + tanh(2) + tanh(3) + tanh(4) + tanh(5) + tanh(6), 1e-5);
    ctpu_sync();
    /* a faulted input poisons only the outputs computed from it */
    ctpu_step_begin();
    ctpu_tensor d2 = ctpu_keep(ctpu_mul_scalar(dep, 2));
    ctpu_tensor i2 = ctpu_keep(ctpu_mul_scalar(x, 2));
    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    float h[6];
    ck_assert_int_eq(ctpu_to_host(d2, h, sizeof h), CTPU_ERR_DEVICE_FAULT);
    ctpu_clear_error();
    ck_assert_msg(ctpu_to_host(i2, h, sizeof h) == CTPU_OK, "x * 2 was poisoned by dep in the same program: %s",
                  ctpu_last_error());
    ctpu_sync();
}
END_TEST

START_TEST(fused_oom_at_launch_recovers)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("TORCH_TPU_HBM_LIMIT", "64K", 1);
    setenv("TORCH_TPU_DEFER_AND_FUSE", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    t_clear_env();
    ctpu_tensor a = ctpu_keep(ctpu_full(CTPU_F32, 1, (int64_t[]){ 1024 }, 1.5));   /* 4 KB */
    ck_assert_int_eq(ctpu_mark_step(), CTPU_OK);
    ctpu_step_begin();
    /* two 40 KB live-outs: each fits (a value larger than the whole cap is
     * refused when it is recorded), together they cannot: the launch fails */
    ctpu_tensor big = ctpu_keep(ctpu_expand(ctpu_reshape(ctpu_exp(a), 2, (int64_t[]){ 1, 1024 }), 2, (int64_t[]){ 10, 1024 }));
    ctpu_tensor big2 = ctpu_keep(ctpu_add_scalar(big, 1));
    ctpu_tensor small = ctpu_keep(ctpu_sum(a, 0, NULL, false));
    ck_assert(!ctpu_is_null(big) && !ctpu_is_null(big2));
    ctpu_status st = ctpu_step_end();
    ck_assert_msg(st == CTPU_ERR_OOM, "launch of a program past the cap: %s (%s)", ctpu_status_str(st), ctpu_last_error());
    ck_assert_msg(t_contains(ctpu_last_error(), "capacity") || t_contains(ctpu_last_error(), "HBM"),
                  "OOM message: %s", ctpu_last_error());
    ctpu_clear_error();
    float *hb = malloc(10 * 1024 * 4);
    ck_assert_int_eq(ctpu_to_host(big2, hb, 10 * 1024 * 4), CTPU_ERR_OOM);   /* the values carry the error */
    free(hb);
    ctpu_clear_error();
    ck_assert_int_eq(ctpu_release(big), CTPU_OK);
    ck_assert_int_eq(ctpu_release(big2), CTPU_OK);
    ck_assert_int_eq(ctpu_release(small), CTPU_OK);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    /* recovered after the frees: a program that fits runs */
    ctpu_step_begin();
    ctpu_tensor s = ctpu_keep(ctpu_sum(ctpu_mul(a, a), 0, NULL, false));
    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    double v;
    ck_assert_int_eq(ctpu_item(s, &v), CTPU_OK);
    ck_assert(v == 1024 * 2.25);
    ctpu_hbm_stats hs;
    ck_assert_int_eq(ctpu_hbm_get_stats(&hs), CTPU_OK);
    ck_assert_uint_le(hs.in_use, 65536);
}
END_TEST

static void nan_program(ctpu_tensor *dep, ctpu_tensor *indep)
{
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    ck_assert_int_eq(ctpu_set_debug_checks(true), CTPU_OK);
    ctpu_tensor x = ctpu_keep(T_VEC(1, -2, 3));
    ck_assert_int_eq(ctpu_mark_step(), CTPU_OK);
    ctpu_step_begin();
    ctpu_tensor y = ctpu_mul_scalar(x, 2);
    ctpu_tensor l = ctpu_log(y);                               /* NaN at -4: the first NaN op */
    *dep = ctpu_keep(ctpu_exp(ctpu_add_scalar(l, 1)));
    *indep = ctpu_keep(ctpu_abs(y));
    ctpu_status st = ctpu_step_end();
    ck_assert_msg(st == CTPU_ERR_NAN || st == CTPU_OK, "%s", ctpu_status_str(st));
    ctpu_clear_error();
}

START_TEST(fused_nan_check_reports_and_recovers)
{
    ctpu_tensor dep, indep;
    nan_program(&dep, &indep);
    float h[3];
    ctpu_status st = ctpu_to_host(dep, h, sizeof h);
    if (st == CTPU_OK) st = ctpu_sync();
    ck_assert_msg(st == CTPU_ERR_NAN, "NaN with debug checks on in defer and fuse: %s", ctpu_status_str(st));
    ck_assert_msg(t_contains(ctpu_last_error(), "NaN"), "%s", ctpu_last_error());
    ctpu_clear_error();
    ctpu_sync();
    ctpu_clear_error();
    ck_assert_int_eq(ctpu_release(dep), CTPU_OK);
    ck_assert_int_eq(ctpu_release(indep), CTPU_OK);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ck_assert_int_eq(ctpu_set_debug_checks(false), CTPU_OK);
    good_op();
    ctpu_set_mode(CTPU_MODE_STRICT);
    good_op();
}
END_TEST

/* With debug checks on in defer and fuse, the error names the op that made
 * the NaN (log, a fused intermediate), not the output's op, and the NaN
 * poisons only its dependents (found by this suite; fixed in 51b90e8). */
START_TEST(fused_nan_check_names_original_op)
{
    ctpu_tensor dep, indep;
    nan_program(&dep, &indep);
    float h[3];
    ctpu_status st = ctpu_to_host(dep, h, sizeof h);
    ck_assert_int_eq(st, CTPU_ERR_NAN);
    ck_assert_msg(t_contains(ctpu_last_error(), "log"), "the NaN error does not name log: %s", ctpu_last_error());
    ctpu_clear_error();
    ck_assert_msg(ctpu_to_host(indep, h, sizeof h) == CTPU_OK, "an independent value was poisoned: %s", ctpu_last_error());
    ck_assert(h[1] == 4);
    ctpu_sync();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("hostile");
    TCase *u = tcase_create("uninitialised");
    tcase_set_timeout(u, 120);
    tcase_add_test(u, entry_points_all_covered);
    suite_add_tcase(s, u);
    TCase *t = tcase_create("hostile");
    tcase_add_checked_fixture(t, t_setup, t_teardown);
    tcase_set_timeout(t, 120);
    tcase_add_test(t, extreme_integers_and_values);
    tcase_add_test(t, compiled_steps_hostile);
    tcase_add_test(t, collectives_extreme_arguments);
    tcase_add_test(t, nesting_and_autograd_misuse);
    tcase_add_test(t, handles_across_runtimes_and_threads);
    tcase_add_test(t, reports_hostile);
    tcase_add_test(t, idx_corruption);
    tcase_add_test(t, env_hostile_values);
    tcase_add_test(t, fused_index_fault_names_op_and_recovers);
    tcase_add_test(t, fused_oom_at_launch_recovers);
    tcase_add_test(t, fused_nan_check_reports_and_recovers);
    tcase_add_test(t, fused_fault_spares_independent_values);
    tcase_add_test(t, fused_nan_check_names_original_op);
    suite_add_tcase(s, t);
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
