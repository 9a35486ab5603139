/* Errors that keep their cause (issue 11).
 *  - error handles: a failed call returns a null handle carrying the id of
 *    its failure record; every public entry point of include/ctpu.h and
 *    include/ctpu_nn.h that takes a tensor is called with one (the headers
 *    are parsed: a new entry point without a case here fails
 *    every_entry_point_keeps_the_cause): ops return it unchanged, every
 *    other call fails with its status and a message ending in the cause;
 *    CTPU_NULL itself still gives CTPU_ERR_NULL_HANDLE; the ring is bounded. */
#include <unistd.h>

#include "t_core.h"
#include "ctpu_nn.h"

#define CAUSE "matmul: a is f32[2,3], b is f32[2,3]: inner dims differ (3 vs 2)"
#define FROM "(from " CAUSE ")"

static ctpu_tensor make_error(void)
{
    ctpu_tensor a = t_f32((float[]){ 1, 2, 3, 4, 5, 6 }, 2, (int64_t[]){ 2, 3 });
    ctpu_tensor e = ctpu_matmul(a, a);
    ck_assert(ctpu_is_null(e));
    ck_assert_msg(e.id != 0, "a failed call returned CTPU_NULL, not an error handle");
    ck_assert_str_eq(ctpu_last_error(), CAUSE);
    ctpu_clear_error();
    return e;
}

/* a compiled step's fn (never reached: the call fails on its input) */
static ctpu_status prov_step(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    (void)sc;
    out[0] = ctpu_add(in[0], in[1]);
    return CTPU_OK;
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

/* ------------------------------------------------------------ coverage */
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

/* A call returning a status: the cause's status, the message names the
 * call (key) and ends with the cause. */
/* The error handle the cases pass, made afresh before each (each failing
 * entry point records a failure of its own, and the ring is bounded). */
static ctpu_tensor E, pair[2], one[1];
static void fresh(void)
{
    E = make_error();
    pair[1] = one[0] = E;
}

static void expect_status(const char *fn, const char *key, ctpu_status st)
{
    cover(fn);
    ck_assert_msg(st == CTPU_ERR_SHAPE, "%s(error handle): %s (%s)", fn, ctpu_status_str(st), ctpu_last_error());
    ck_assert_msg(ctpu_last_status() == CTPU_ERR_SHAPE, "%s: last status %s", fn, ctpu_status_str(ctpu_last_status()));
    ck_assert_msg(t_contains(ctpu_last_error(), key), "%s: \"%s\" does not name %s", fn, ctpu_last_error(), key);
    ck_assert_msg(ends_with(ctpu_last_error(), FROM), "%s: \"%s\" does not end with the cause", fn, ctpu_last_error());
    ck_assert_msg(strchr(ctpu_last_error(), '\n') == NULL, "%s: not one line", fn);
    ctpu_clear_error();
}
#define EP_S(fn, key, ...) do { fresh(); expect_status(#fn, key, fn(__VA_ARGS__)); } while (0)
/* A call returning a value with a failure sentinel (ndim -1, NULL, ...). */
#define EP_V(fn, key, sentinel, ...)                                                                          \
    do {                                                                                                      \
        fresh();                                                                                              \
        ck_assert_msg((fn(__VA_ARGS__)) == (sentinel), "%s(error handle): no failure value", #fn);            \
        expect_status(#fn, key, ctpu_last_status());                                                          \
    } while (0)
/* An op: the error handle itself comes back, and no new message: ctpu's
 * ops and nn's (public API only) make its cause the last error again. */
#define EP_T(fn, ...)                                                                                         \
    do {                                                                                                      \
        fresh();                                                                                              \
        ctpu_tensor r_ = fn(__VA_ARGS__);                                                                     \
        cover(#fn);                                                                                           \
        ck_assert_msg(r_.id == E.id, "%s(error handle) returned %#llx, not the error handle %#llx (%s)", #fn,  \
                      (unsigned long long)r_.id, (unsigned long long)E.id, ctpu_last_error());                \
        ck_assert_msg(ctpu_last_status() == CTPU_ERR_SHAPE && strcmp(ctpu_last_error(), CAUSE) == 0,           \
                      "%s: the last error is \"%s\", not the cause", #fn, ctpu_last_error());                 \
        ctpu_clear_error();                                                                                   \
    } while (0)
/* A query that sets no error (documented so): its answer for a null handle. */
#define EP_Q(fn, cond)                                                                                        \
    do {                                                                                                      \
        cover(#fn);                                                                                           \
        ck_assert_msg((cond), "%s(error handle): %s", #fn, #cond);                                             \
    } while (0)

static void sweep(void)
{
    ctpu_tensor ok = t_f32((float[]){ 1, 2, 3, 4 }, 2, (int64_t[]){ 2, 2 });
    ctpu_tensor idx = t_i32((int32_t[]){ 0, 1 }, 1, (int64_t[]){ 2 });
    pair[0] = ok;
    float f[4];
    double v;
    int64_t sh[8] = { 2, 2 };
    int nd, dims[1] = { 0 }, perm[2] = { 1, 0 };
    const char *names[1] = { "w" };
    char tmpl[] = "/tmp/ctpu_prov_XXXXXX";
    int fd = mkstemp(tmpl);
    ck_assert(fd >= 0);
    close(fd);
    /* a file holding "w" f32[2,2] for the loads */
    ck_assert_int_eq(ctpu_save(tmpl, 1, names, &ok), CTPU_OK);
    /* handles */
    EP_V(ctpu_ndim, "ndim", -1, E);
    EP_V(ctpu_dim, "dim", -1, E, 0);
    EP_V(ctpu_numel, "numel", -1, E);
    EP_V(ctpu_dtype_of, "dtype_of", CTPU_DTYPE_COUNT, E);
    EP_S(ctpu_shape, "shape", E, sh, &nd);
    EP_Q(ctpu_is_valid, !ctpu_is_valid(E) && ctpu_last_status() == CTPU_OK);
    EP_Q(ctpu_name, strcmp(ctpu_name(E), "") == 0 && ctpu_last_status() == CTPU_OK);
    EP_Q(ctpu_requires_grad, !ctpu_requires_grad(E) && ctpu_last_status() == CTPU_OK);
    EP_S(ctpu_release, "release", E);
    EP_S(ctpu_set_name, "set_name", E, "x");
    EP_S(ctpu_mark_dynamic, "mark_dynamic", E, 0, 2, 8);
    EP_T(ctpu_keep, E);
    EP_S(ctpu_to_host, "to_host", E, f, sizeof f);
    EP_S(ctpu_to_host_as_f32, "to_host_as_f32", E, f, sizeof f);
    FILE *dn = fopen("/dev/null", "w");
    EP_S(ctpu_print, "print", E, dn);
    fclose(dn);
    EP_S(ctpu_item, "item", E, &v);
    EP_S(ctpu_assign, "assign", E, ok);
    EP_S(ctpu_assign, "assign", ok, E);
    ctpu_compiled *cs = ctpu_compile(prov_step, NULL, NULL);
    ctpu_tensor couts[1];
    EP_S(ctpu_compiled_call, "compiled_call: in[1]", cs, 2, pair, 0, NULL, 1, couts);
    ck_assert(ctpu_is_null(couts[0]));
    ctpu_compiled_free(cs);
    /* elementwise */
    EP_T(ctpu_neg, E); EP_T(ctpu_abs, E); EP_T(ctpu_exp, E); EP_T(ctpu_log, E); EP_T(ctpu_sqrt, E);
    EP_T(ctpu_rsqrt, E); EP_T(ctpu_tanh, E); EP_T(ctpu_sigmoid, E); EP_T(ctpu_relu, E); EP_T(ctpu_gelu, E, false);
    EP_T(ctpu_softplus, E); EP_T(ctpu_silu, E); EP_T(ctpu_erf, E); EP_T(ctpu_sin, E); EP_T(ctpu_cos, E);
    EP_T(ctpu_log1p, E); EP_T(ctpu_expm1, E); EP_T(ctpu_leaky_relu, E, 0.01); EP_T(ctpu_elu, E, 1.0);
    EP_T(ctpu_add, E, ok); EP_T(ctpu_add, ok, E); EP_T(ctpu_sub, ok, E); EP_T(ctpu_mul, ok, E); EP_T(ctpu_div, E, ok);
    EP_T(ctpu_pow, ok, E); EP_T(ctpu_maximum, E, ok); EP_T(ctpu_minimum, ok, E); EP_T(ctpu_eq, E, ok);
    EP_T(ctpu_ne, ok, E); EP_T(ctpu_lt, E, ok); EP_T(ctpu_le, ok, E); EP_T(ctpu_gt, E, ok); EP_T(ctpu_ge, ok, E);
    EP_T(ctpu_add_scalar, E, 1); EP_T(ctpu_sub_scalar, E, 1); EP_T(ctpu_mul_scalar, E, 1);
    EP_T(ctpu_div_scalar, E, 1); EP_T(ctpu_pow_scalar, E, 2); EP_T(ctpu_maximum_scalar, E, 1);
    EP_T(ctpu_minimum_scalar, E, 1); EP_T(ctpu_rsub_scalar, E, 1); EP_T(ctpu_rdiv_scalar, E, 1);
    EP_T(ctpu_rpow_scalar, E, 2); EP_T(ctpu_eq_scalar, E, 1); EP_T(ctpu_ne_scalar, E, 1); EP_T(ctpu_lt_scalar, E, 1);
    EP_T(ctpu_le_scalar, E, 1); EP_T(ctpu_gt_scalar, E, 1); EP_T(ctpu_ge_scalar, E, 1);
    EP_T(ctpu_where, E, ok, ok); EP_T(ctpu_where, ok, E, ok); EP_T(ctpu_where, ok, ok, E);
    EP_T(ctpu_clamp, E, 0, 1); EP_T(ctpu_cast, E, CTPU_BF16); EP_T(ctpu_clamp_int, E, 0, 1);
    EP_T(ctpu_add_scalar_int, E, 1); EP_T(ctpu_sub_scalar_int, E, 1); EP_T(ctpu_mul_scalar_int, E, 1);
    EP_T(ctpu_rsub_scalar_int, E, 1); EP_T(ctpu_maximum_scalar_int, E, 1); EP_T(ctpu_minimum_scalar_int, E, 1);
    /* reductions, norms, movement, matmul */
    EP_T(ctpu_sum, E, 1, dims, false); EP_T(ctpu_mean, E, 0, NULL, false); EP_T(ctpu_max, E, 1, dims, false);
    EP_T(ctpu_min, E, 1, dims, false); EP_T(ctpu_var, E, 1, dims, 1, false); EP_T(ctpu_argmax, E, 0, false);
    EP_T(ctpu_softmax, E, 0); EP_T(ctpu_log_softmax, E, 0);
    EP_T(ctpu_prod, E, 1, dims, false); EP_T(ctpu_argmin, E, 0, true); EP_T(ctpu_logsumexp, E, 1, dims, false);
    EP_T(ctpu_cumsum, E, 0);
    EP_T(ctpu_scatter_add, E, 0, idx, ok); EP_T(ctpu_scatter_add, ok, 0, E, ok); EP_T(ctpu_scatter_add, ok, 0, idx, E);
    EP_T(ctpu_index_add, E, 0, idx, ok, 1.0); EP_T(ctpu_index_add, ok, 0, E, ok, 1.0);
    EP_T(ctpu_index_add, ok, 0, idx, E, 2.0);
    EP_T(ctpu_zeros_like, E); EP_T(ctpu_ones_like, E); EP_T(ctpu_full_like, E, 3); EP_T(ctpu_rand_like, E);
    EP_T(ctpu_randn_like, E); EP_T(ctpu_randint_like, E, 0, 5);
    ctpu_tensor w2 = T_VEC(1, 1);
    EP_T(ctpu_layer_norm, E, CTPU_NULL, CTPU_NULL, 1e-5); EP_T(ctpu_layer_norm, ok, E, CTPU_NULL, 1e-5);
    EP_T(ctpu_layer_norm, ok, w2, E, 1e-5);
    EP_T(ctpu_rms_norm, E, CTPU_NULL, 1e-5); EP_T(ctpu_rms_norm, ok, E, 1e-5);
    EP_T(ctpu_reshape, E, 2, sh); EP_T(ctpu_permute, E, perm); EP_T(ctpu_transpose, E, 0, 1);
    EP_T(ctpu_contiguous, E); EP_T(ctpu_slice, E, 0, 0, 1, 1); EP_T(ctpu_concat, 2, pair, 0);
    EP_T(ctpu_expand, E, 2, sh); EP_T(ctpu_unsqueeze, E, 0); EP_T(ctpu_squeeze, E, 0); EP_T(ctpu_flatten, E, 0, -1);
    EP_T(ctpu_stack, 2, pair, 0); EP_T(ctpu_tril, E, 0); EP_T(ctpu_triu, E, 0);
    EP_T(ctpu_index_select, E, 0, idx); EP_T(ctpu_index_select, ok, 0, E);
    EP_T(ctpu_embedding, E, idx); EP_T(ctpu_embedding, ok, E); EP_T(ctpu_gather, E, 0, idx);
    EP_T(ctpu_gather, ok, 0, E); EP_T(ctpu_matmul, E, ok); EP_T(ctpu_matmul, ok, E);
    EP_T(ctpu_matmul_t, E, ok, false, true); EP_T(ctpu_matmul_t, ok, E, true, false);
    ctpu_tensor q4 = ctpu_reshape(ok, 4, (int64_t[]){ 1, 1, 2, 2 });
    EP_T(ctpu_scaled_dot_product_attention, E, q4, q4, CTPU_NULL, CTPU_MASK_NONE, false, 0, 0);
    EP_T(ctpu_scaled_dot_product_attention, q4, E, q4, CTPU_NULL, CTPU_MASK_NONE, true, 0, 0);
    EP_T(ctpu_scaled_dot_product_attention, q4, q4, E, CTPU_NULL, CTPU_MASK_NONE, false, 0, 0.5);
    EP_T(ctpu_scaled_dot_product_attention, q4, q4, q4, E, CTPU_MASK_ADDITIVE, false, 0, 0);
    EP_T(ctpu_scaled_dot_product_attention, q4, q4, q4, E, CTPU_MASK_NONE, false, 0, 0);
    EP_T(ctpu_scaled_dot_product_attention_bthd, E, q4, q4, CTPU_NULL, CTPU_MASK_NONE, false, 0, 0);
    EP_T(ctpu_scaled_dot_product_attention_bthd, q4, E, q4, CTPU_NULL, CTPU_MASK_NONE, true, 0, 0);
    EP_T(ctpu_scaled_dot_product_attention_bthd, q4, q4, E, CTPU_NULL, CTPU_MASK_NONE, false, 0, 0.5);
    EP_T(ctpu_scaled_dot_product_attention_bthd, q4, q4, q4, E, CTPU_MASK_ADDITIVE, false, 0, 0);
    /* autograd */
    EP_S(ctpu_set_requires_grad, "requires_grad", E, true);
    EP_S(ctpu_backward, "backward", E);
    EP_S(ctpu_backward_ex, "backward", E, CTPU_NULL, false);
    ctpu_tensor leaf = t_f32((float[]){ 3 }, 0, NULL);
    ck_assert_int_eq(ctpu_set_requires_grad(leaf, true), CTPU_OK);
    ctpu_tensor loss = ctpu_mul(leaf, leaf);
    EP_S(ctpu_backward_ex, "backward", loss, E, true);
    EP_S(ctpu_backward_with, "backward", E, ok);
    EP_S(ctpu_backward_with, "backward", loss, E);
    EP_T(ctpu_grad, E);
    EP_S(ctpu_zero_grad, "zero_grad", E);
    EP_T(ctpu_detach, E);
    /* checkpoints */
    EP_S(ctpu_save, "save", tmpl, 1, names, one);
    EP_S(ctpu_save_ex, "save", tmpl, 1, names, one, 0, NULL);
    EP_S(ctpu_load, "load", tmpl, 1, names, one);
    ctpu_safetensors *sf = ctpu_safetensors_open(tmpl);
    ck_assert_ptr_nonnull(sf);
    EP_S(ctpu_safetensors_load, "load", sf, 1, names, one);
    ctpu_safetensors_close(sf);
    /* collectives */
    EP_T(ctpu_all_reduce, E, CTPU_DIST_SUM); EP_T(ctpu_broadcast, E, 0); EP_T(ctpu_all_gather, E, 0);
    EP_T(ctpu_reduce_scatter, E, 0, CTPU_DIST_SUM);
    EP_T(ctpu_all_reduce_async, E, CTPU_DIST_SUM); EP_T(ctpu_all_reduce_wait, E);
    EP_S(ctpu_register_post_accumulate_grad_hook, "register_post_accumulate_grad_hook", E, NULL, NULL);
    /* nn: layers, losses */
    ctpu_linear lin;
    ck_assert_int_eq(ctpu_linear_init(&lin, 2, 3, true, CTPU_F32), CTPU_OK);
    EP_T(ctpu_linear_forward, &lin, E);
    ctpu_linear_free(&lin);
    ctpu_layer_norm_layer ln;
    ck_assert_int_eq(ctpu_layer_norm_layer_init(&ln, 2, 1e-5, true, CTPU_F32), CTPU_OK);
    EP_T(ctpu_layer_norm_layer_forward, &ln, E);
    ctpu_layer_norm_layer_free(&ln);
    ctpu_embedding_layer emb;
    ck_assert_int_eq(ctpu_embedding_layer_init(&emb, 4, 2, CTPU_F32), CTPU_OK);
    EP_T(ctpu_embedding_layer_forward, &emb, E);
    ctpu_embedding_layer_free(&emb);
    EP_T(ctpu_dropout, E, 0.5, true);
    EP_T(ctpu_cross_entropy, E, idx, NULL); EP_T(ctpu_cross_entropy, ok, E, NULL);
    EP_T(ctpu_mse_loss, E, ok, CTPU_REDUCE_MEAN); EP_T(ctpu_mse_loss, ok, E, CTPU_REDUCE_MEAN);
    EP_T(ctpu_nll_loss, E, idx, NULL); EP_T(ctpu_nll_loss, ok, E, NULL);
    EP_T(ctpu_bce_with_logits, E, ok, CTPU_REDUCE_MEAN); EP_T(ctpu_bce_with_logits, ok, E, CTPU_REDUCE_MEAN);
    EP_T(ctpu_l1_loss, E, ok, CTPU_REDUCE_MEAN); EP_T(ctpu_l1_loss, ok, E, CTPU_REDUCE_MEAN);
    EP_T(ctpu_smooth_l1_loss, E, ok, CTPU_REDUCE_MEAN, 1.0); EP_T(ctpu_smooth_l1_loss, ok, E, CTPU_REDUCE_MEAN, 1.0);
    /* nn: optimizers, data parallel, checkpoints */
    ctpu_sgd_opts so = { .lr = 0.1 };
    ctpu_adamw_opts ao = ctpu_adamw_defaults();
    EP_V(ctpu_sgd_create, "sgd", NULL, 1, one, &so);
    EP_V(ctpu_adamw_create, "adamw", NULL, 1, one, &ao);
    ao = ctpu_adam_defaults();
    EP_V(ctpu_adam_create, "adam", NULL, 1, one, &ao);
    EP_T(ctpu_clip_grad_norm, 1, one, 1.0, 2.0);
    ctpu_ddp_opts dopt = ctpu_ddp_defaults();
    EP_V(ctpu_ddp_create, "ddp_create", NULL, 1, one, &dopt);
    EP_S(ctpu_checkpoint_save, "save", tmpl, 1, names, one, NULL, NULL, 0, NULL);
    ck_assert_int_eq(ctpu_checkpoint_save(tmpl, 1, names, &ok, NULL, NULL, 0, NULL), CTPU_OK);
    EP_S(ctpu_checkpoint_load, "load", tmpl, 1, names, one, NULL, NULL);
    /* x and y are outputs only: given an error handle, they are overwritten */
    cover("ctpu_image_set_batch");
    unlink(tmpl);
}

/* Public declarations of header path taking a ctpu_tensor (by value or
 * array), joined across lines. */
static int tensor_functions(const char *path, char names[][64], int n, int cap)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char line[512], decl[2048] = "";
    bool in_decl = false;
    while (fgets(line, sizeof line, f)) {
        if (!in_decl && strncmp(line, "CTPU_API ", 9) != 0) continue;
        if (!in_decl) decl[0] = 0;
        in_decl = true;
        if (strlen(decl) + strlen(line) < sizeof decl) strcat(decl, line);
        if (!strchr(line, ';')) continue;
        in_decl = false;
        char *paren = strchr(decl, '(');
        if (!paren || !strstr(paren, "ctpu_tensor")) continue;
        char *s = paren;
        while (s > decl && (s[-1] == '_' || (s[-1] >= 'a' && s[-1] <= 'z') || (s[-1] >= '0' && s[-1] <= '9'))) s--;
        size_t len = (size_t)(paren - s);
        ck_assert_int_lt(n, cap);
        ck_assert_int_lt(len, 64);
        memcpy(names[n], s, len);
        names[n][len] = 0;
        n++;
    }
    fclose(f);
    return n;
}

START_TEST(every_entry_point_keeps_the_cause)
{
    n_covered = 0;
    for (int mode = 0; mode < CTPU_MODE_COUNT; mode++) {
        ck_assert_int_eq(ctpu_set_mode((ctpu_mode)mode), CTPU_OK);
        ctpu_scope_begin();
        sweep();
        ctpu_scope_end();
    }
    static char names[300][64];
    int n = tensor_functions(CTPU_SOURCE_ROOT "/include/ctpu.h", names, 0, 300);
    n = tensor_functions(CTPU_SOURCE_ROOT "/include/ctpu_nn.h", names, n, 300);
    ck_assert_int_ge(n, 100);
    int missing = 0;
    for (int i = 0; i < n; i++) {
        bool found = false;
        for (int k = 0; k < n_covered && !found; k++) found = !strcmp(names[i], covered[k]);
        if (!found) { fprintf(stderr, "provenance: no error-handle case for %s\n", names[i]); missing++; }
    }
    ck_assert_msg(missing == 0, "%d public functions taking a tensor have no error-handle case", missing);
}
END_TEST

/* torch.arange for i32: start and step truncated, the count from the doubles;
 * a step of the wrong sign is an error, end == start empty. A composite's
 * failure names the user's call (causal_mask, not its internal sub). */
START_TEST(arange_int_step_and_composite_names)
{
    int32_t v[5] = { 0 };
    ctpu_tensor a = ctpu_arange(0, 5, 1.5, CTPU_I32);
    ck_assert_int_eq(ctpu_numel(a), 4);
    ck_assert_int_eq(ctpu_to_host(a, v, sizeof v[0] * 4), CTPU_OK);
    ck_assert(v[0] == 0 && v[1] == 1 && v[2] == 2 && v[3] == 3);
    a = ctpu_arange(-2.7, 3, 1.3, CTPU_I32);   /* torch: [-2 -1 0 1 2] */
    ck_assert_int_eq(ctpu_numel(a), 5);
    ck_assert_int_eq(ctpu_to_host(a, v, sizeof v), CTPU_OK);
    ck_assert(v[0] == -2 && v[1] == -1 && v[2] == 0 && v[3] == 1 && v[4] == 2);
    a = ctpu_arange(5, 0, -1.5, CTPU_I32);     /* torch: [5 4 3 2] */
    ck_assert_int_eq(ctpu_numel(a), 4);
    ck_assert_int_eq(ctpu_to_host(a, v, sizeof v[0] * 4), CTPU_OK);
    ck_assert(v[0] == 5 && v[1] == 4 && v[2] == 3 && v[3] == 2);
    ck_assert(ctpu_is_null(ctpu_arange(0, 5, 0.5, CTPU_I32)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    const double bad[][3] = { { 10, 0, 1 }, { 0, 10, -1 }, { 0, -1, 0.5 } };
    for (int i = 0; i < 3; i++) {
        ck_assert(ctpu_is_null(ctpu_arange(bad[i][0], bad[i][1], bad[i][2], CTPU_F32)));
        ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
        ck_assert(strstr(ctpu_last_error(), "arange: ") == ctpu_last_error());
        ck_assert(strstr(ctpu_last_error(), "inconsistent with step sign") != NULL);
    }
    ck_assert_int_eq(ctpu_numel(ctpu_arange(3, 3, 1, CTPU_F32)), 0);
    ck_assert_int_eq(ctpu_numel(ctpu_arange(3, 3, -1, CTPU_I32)), 0);
    /* 2^48 elements never fit: refused up front */
    ck_assert(ctpu_is_null(ctpu_causal_mask((int64_t)1 << 24, (int64_t)1 << 24, CTPU_MASK_ADDITIVE)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_INVALID_ARG);
    ck_assert(strncmp(ctpu_last_error(), "causal_mask: ", 13) == 0);
    /* 2^36 f32 elements pass the check but not the HBM: named causal_mask */
    for (int k = 0; k < 2; k++) {
        ctpu_tensor m = ctpu_causal_mask((int64_t)1 << 18, (int64_t)1 << 18, k ? CTPU_MASK_BINARY : CTPU_MASK_ADDITIVE);
        ck_assert(ctpu_is_null(m));
        ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_OOM);
        ck_assert_msg(strncmp(ctpu_last_error(), "causal_mask: ", 13) == 0, "%s", ctpu_last_error());
        double d;
        ck_assert_int_eq(ctpu_item(m, &d), CTPU_ERR_OOM);
        ck_assert(strstr(ctpu_last_error(), "(from causal_mask: ") != NULL);
    }
    ctpu_clear_error();
}
END_TEST

/* CTPU_NULL itself: CTPU_ERR_NULL_HANDLE in every call, ops included: the
 * op fails naming itself and the argument and returns a new error handle, so
 * the call that reads it names the first cause. */
START_TEST(literal_null_unchanged)
{
    double v;
    ck_assert_int_eq(ctpu_item(CTPU_NULL, &v), CTPU_ERR_NULL_HANDLE);
    ck_assert_str_eq(ctpu_last_error(), "item: t is a null handle (CTPU_NULL)");
    ctpu_tensor e = make_error();
    ctpu_tensor r = ctpu_relu(CTPU_NULL);
    ck_assert(ctpu_is_null(r) && r.id != 0);
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_NULL_HANDLE);
    ck_assert_str_eq(ctpu_last_error(), "relu: a is a null handle (CTPU_NULL)");
    ck_assert(ctpu_error_handle().id == r.id);
    ck_assert_int_eq(ctpu_item(r, &v), CTPU_ERR_NULL_HANDLE);
    ck_assert_str_eq(ctpu_last_error(), "item: t is the result of a failed call (from relu: a is a null handle (CTPU_NULL))");
    ck_assert_int_eq(ctpu_item(ctpu_relu(e), &v), CTPU_ERR_SHAPE);
    ck_assert_str_eq(ctpu_last_error(), "item: t is the result of a failed call " FROM);
    ck_assert(ctpu_is_null(e) && ctpu_is_null(CTPU_NULL) && !ctpu_is_null(T_VEC(1)));
}
END_TEST

/* Every kind of op given CTPU_NULL for a tensor argument: the status is
 * CTPU_ERR_NULL_HANDLE (never CTPU_OK, never an earlier unrelated error) and
 * the message "<op>: <arg> is a null handle (CTPU_NULL)" names the user's
 * call, composites included. */
START_TEST(literal_null_every_kind_of_op)
{
    ctpu_tensor a = t_f32((float[]){ 1, 2, 3, 4, 5, 6 }, 2, (int64_t[]){ 2, 3 });
    ctpu_tensor lab = ctpu_from_host((int32_t[]){ 0, 1 }, CTPU_I32, 1, (int64_t[]){ 2 });
    ctpu_tensor q = ctpu_ones(CTPU_F32, 4, (int64_t[]){ 1, 1, 2, 4 });
    const ctpu_tensor N = CTPU_NULL;
    ctpu_linear lin;
    ck_assert_int_eq(ctpu_linear_init(&lin, 3, 2, true, CTPU_F32), CTPU_OK);
#define NCASE(expr, pre)                                                                                \
    do {                                                                                                \
        ctpu_matmul(a, a); /* an unrelated earlier error must not show through */                       \
        ck_assert_int_ne(ctpu_last_status(), CTPU_OK);                                                  \
        ctpu_tensor r_ = (expr);                                                                        \
        ck_assert_msg(ctpu_is_null(r_), "%s: not null", #expr);                                        \
        ck_assert_msg(ctpu_last_status() == CTPU_ERR_NULL_HANDLE, "%s: status %d (%s)", #expr,          \
                      (int)ctpu_last_status(), ctpu_last_error());                                      \
        ck_assert_msg(strncmp(ctpu_last_error(), pre, strlen(pre)) == 0, "%s: '%s' (want '%s...')",     \
                      #expr, ctpu_last_error(), pre);                                                   \
        ck_assert_msg(strstr(ctpu_last_error(), "null handle") != NULL, "%s: '%s'", #expr,              \
                      ctpu_last_error());                                                               \
    } while (0)
    NCASE(ctpu_relu(N), "relu: a ");
    NCASE(ctpu_exp(N), "exp: ");
    NCASE(ctpu_gelu(N, true), "gelu");
    NCASE(ctpu_cast(N, CTPU_BF16), "cast: ");
    NCASE(ctpu_add(a, N), "add: b is a null handle (CTPU_NULL)");
    NCASE(ctpu_add(N, a), "add: a is a null handle (CTPU_NULL)");
    NCASE(ctpu_mul(a, N), "mul: b ");
    NCASE(ctpu_mul_scalar(N, 2), "mul_scalar: ");
    NCASE(ctpu_where(N, a, a), "where: ");
    NCASE(ctpu_matmul(N, a), "matmul: a ");
    NCASE(ctpu_sum(N, 0, NULL, false), "sum: ");
    NCASE(ctpu_mean(N, 1, (int[]){ 0 }, false), "mean: ");
    NCASE(ctpu_max(N, 0, NULL, false), "max: ");
    NCASE(ctpu_softmax(N, 1), "softmax: ");
    NCASE(ctpu_reshape(N, 1, (int64_t[]){ 6 }), "reshape: ");
    NCASE(ctpu_permute(N, (int[]){ 1, 0 }), "permute: ");
    NCASE(ctpu_transpose(N, 0, 1), "transpose: ");
    NCASE(ctpu_slice(N, 0, 0, 1, 1), "slice: ");
    NCASE(ctpu_expand(N, 2, (int64_t[]){ 2, 3 }), "expand: ");
    NCASE(ctpu_concat(2, (ctpu_tensor[]){ a, N }, 0), "concat: ");
    NCASE(ctpu_stack(2, (ctpu_tensor[]){ N, a }, 0), "stack: ");
    NCASE(ctpu_index_select(a, 0, N), "index_select: ");
    NCASE(ctpu_embedding(N, lab), "embedding: ");
    NCASE(ctpu_layer_norm(N, CTPU_NULL, CTPU_NULL, 1e-5), "layer_norm: x ");
    NCASE(ctpu_rms_norm(N, CTPU_NULL, 1e-5), "rms_norm: x ");
    NCASE(ctpu_scaled_dot_product_attention(q, N, q, CTPU_NULL, CTPU_MASK_NONE, true, 0.5, 0),
          "scaled_dot_product_attention: k ");
    NCASE(ctpu_cross_entropy(N, lab, NULL), "cross_entropy: ");
    NCASE(ctpu_cross_entropy(a, N, NULL), "cross_entropy: ");
    NCASE(ctpu_mse_loss(N, a, CTPU_REDUCE_MEAN), "mse_loss: ");
    NCASE(ctpu_linear_forward(&lin, N), "linear");
    NCASE(ctpu_detach(N), "detach: ");
#undef NCASE
    ctpu_linear_free(&lin);
    ctpu_clear_error();
}
END_TEST

/* The README's pattern: chain, check once at the end, see the first cause.
 * A cause of a cause is the first one (no nesting). */
START_TEST(chain_reports_the_first_cause)
{
    ctpu_tensor a = t_f32((float[]){ 1, 2, 3, 4, 5, 6 }, 2, (int64_t[]){ 2, 3 });
    ctpu_tensor s = ctpu_sum(ctpu_relu(ctpu_add_scalar(ctpu_matmul(a, a), 1)), 0, NULL, false);
    ctpu_clear_error();
    double v;
    ck_assert_int_eq(ctpu_item(s, &v), CTPU_ERR_SHAPE);
    ck_assert_str_eq(ctpu_last_error(), "item: t is the result of a failed call " FROM);
    /* keep of a failed call of an entry point: still the first cause */
    ck_assert_int_eq(ctpu_backward(s), CTPU_ERR_SHAPE);
    ck_assert_str_eq(ctpu_last_error(), "backward: t is the result of a failed call " FROM);
    ctpu_tensor e2 = ctpu_error_handle();     /* the backward's failure record */
    ck_assert(ctpu_is_null(e2) && e2.id != s.id);
    ck_assert_int_eq(ctpu_release(e2), CTPU_ERR_SHAPE);
    ck_assert_str_eq(ctpu_last_error(), "release: t is the result of a failed call " FROM);
}
END_TEST

/* The ring is bounded: a record pushed out says so; other threads' records
 * are not this thread's. */
static void *other_thread(void *p)
{
    double v;
    ctpu_status st = ctpu_item(*(ctpu_tensor *)p, &v);
    ck_assert_int_eq(st, CTPU_ERR_NULL_HANDLE);
    ck_assert(t_contains(ctpu_last_error(), "no longer recorded"));
    return NULL;
}

START_TEST(ring_is_bounded)
{
    ctpu_tensor e = make_error();
    double v;
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, other_thread, &e), 0);
    pthread_join(th, NULL);
    for (int i = 0; i < 40; i++) ctpu_relu(CTPU_NULL), ctpu_item(CTPU_NULL, &v);
    ck_assert_int_eq(ctpu_item(e, &v), CTPU_ERR_NULL_HANDLE);
    ck_assert(t_contains(ctpu_last_error(), "item: t is the result of a failed call that is no longer recorded"));
    ck_assert(strchr(ctpu_last_error(), '\n') == NULL);
}
END_TEST


/* ------------------------------------------------------------ debug checks: the first NaN */
#include "ops.h"

/* the grid: 0, ±subnormal, ±huge, and a few ordinary values */
static const float GRID[] = { 0.0f, -0.0f, 1e-45f, -1e-45f, 1e-39f, -1e-39f, 3e38f, -3e38f, 1.0f, -2.5f, 0.5f };
#define N_GRID ((int)(sizeof GRID / sizeof GRID[0]))

typedef ctpu_tensor (*grid_fn)(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c);
#define U(f) static ctpu_tensor g_##f(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)b; (void)c; return ctpu_##f(a); }
#define B(f) static ctpu_tensor g_##f(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)c; return ctpu_##f(a, b); }
#define S(f, v) static ctpu_tensor g_##f(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)b; (void)c; return ctpu_##f(a, v); }
U(neg) U(abs) U(exp) U(log) U(sqrt) U(rsqrt) U(tanh) U(sigmoid) U(relu) U(softplus) U(erf) U(sin) U(cos) U(log1p)
U(expm1) U(silu) U(contiguous)
B(add) B(sub) B(mul) B(div) B(maximum) B(minimum) B(eq) B(ne) B(lt) B(le) B(gt) B(ge)
S(add_scalar, 2.5) S(sub_scalar, -3e38) S(mul_scalar, 3e38) S(div_scalar, 1e-39) S(pow_scalar, 2.5)
S(maximum_scalar, 0.0) S(minimum_scalar, 0.0) S(eq_scalar, 0.0) S(ne_scalar, 1.0) S(lt_scalar, 0.0)
S(le_scalar, 0.0) S(gt_scalar, 0.0) S(ge_scalar, 1.0) S(rsub_scalar, 3e38) S(rdiv_scalar, 1.0) S(rpow_scalar, 2.0)
S(leaky_relu, 0.01) S(elu, 1.0)
/* |a|: a negative base's exponent gradient is log(a) a^b, NaN (as torch's):
 * the debug check names it, "log (backward of pow)" */
static ctpu_tensor g_pow(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)c; return ctpu_pow(ctpu_abs(a), b); }
static ctpu_tensor g_gelu_tanh(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)b; (void)c; return ctpu_gelu(a, true); }
static ctpu_tensor g_gelu_erf(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)b; (void)c; return ctpu_gelu(a, false); }
static ctpu_tensor g_where(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { return ctpu_where(ctpu_gt_scalar(c, 0), a, b); }
static ctpu_tensor g_clamp(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)b; (void)c; return ctpu_clamp(a, -1, 1e-39); }
static ctpu_tensor g_cast(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)b; (void)c; return ctpu_cast(a, CTPU_BF16); }
/* reductions and the rest over [a, b, c] (a [3] or [1,3] row) */
static ctpu_tensor row(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { return ctpu_concat(3, (ctpu_tensor[]){ a, b, c }, 0); }
#define R(f, ...) static ctpu_tensor g_##f(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { return ctpu_##f(row(a, b, c), __VA_ARGS__); }
R(sum, 0, NULL, false) R(mean, 0, NULL, false) R(max, 0, NULL, false) R(min, 0, NULL, false)
R(var, 0, NULL, 1, false) R(argmax, 0, false) R(argmin, 0, false) R(prod, 0, NULL, false) R(cumsum, 0)
R(logsumexp, 0, NULL, false) R(softmax, 0) R(log_softmax, 0)
R(slice, 0, 1, 3, 1)
static ctpu_tensor g_tril(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { return ctpu_tril(ctpu_reshape(row(a, b, c), 2, (int64_t[]){ 1, 3 }), 0); }
static ctpu_tensor g_reshape(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { return ctpu_reshape(row(a, b, c), 2, (int64_t[]){ 1, 3 }); }
static ctpu_tensor g_permute(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { return ctpu_permute(ctpu_reshape(row(a, b, c), 2, (int64_t[]){ 1, 3 }), (int[]){ 1, 0 }); }
static ctpu_tensor g_concat(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { return row(a, b, c); }
static ctpu_tensor g_expand(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)b; (void)c; return ctpu_expand(a, 2, (int64_t[]){ 2, 1 }); }
static ctpu_tensor g_embedding(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c)
{
    ctpu_tensor w = ctpu_reshape(row(a, b, c), 2, (int64_t[]){ 3, 1 });
    return ctpu_embedding(w, t_i32((int32_t[]){ 2, 0, 2 }, 1, (int64_t[]){ 3 }));
}
static ctpu_tensor g_gather(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c)
{
    return ctpu_gather(row(a, b, c), 0, t_i32((int32_t[]){ 1, 1, 0 }, 1, (int64_t[]){ 3 }));
}
static ctpu_tensor g_scatter_add(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c)
{
    return ctpu_scatter_add(row(a, b, c), 0, t_i32((int32_t[]){ 2, 2, 0 }, 1, (int64_t[]){ 3 }), row(c, a, b));
}
static ctpu_tensor g_matmul(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c)
{
    ctpu_tensor x = ctpu_reshape(row(a, b, c), 2, (int64_t[]){ 1, 3 });
    return ctpu_matmul(x, ctpu_reshape(row(c, a, b), 2, (int64_t[]){ 3, 1 }));
}
/* attention, one query, one key, Dh 1 (a larger Dh lets dO.O overflow to inf and dP - Dr be inf - inf, as
 * the composition's softmax backward would) */
static ctpu_tensor g_sdpa(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c)
{
    int64_t s4[4] = { 1, 1, 1, 1 };
    return ctpu_scaled_dot_product_attention(ctpu_reshape(a, 4, s4), ctpu_reshape(b, 4, s4), ctpu_reshape(c, 4, s4),
                                             CTPU_NULL, CTPU_MASK_NONE, false, 0, 0);
}
/* losses and layers (library rules: never a NaN from finite inputs) */
static ctpu_tensor g_layer_norm(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { return ctpu_layer_norm(ctpu_reshape(row(a, b, c), 2, (int64_t[]){ 1, 3 }), CTPU_NULL, CTPU_NULL, 1e-5); }
static ctpu_tensor g_rms_norm(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { return ctpu_rms_norm(ctpu_reshape(row(a, b, c), 2, (int64_t[]){ 1, 3 }), CTPU_NULL, 1e-5); }
static ctpu_tensor g_cross_entropy(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c)
{
    return ctpu_cross_entropy(ctpu_reshape(row(a, b, c), 2, (int64_t[]){ 1, 3 }), t_i32((int32_t[]){ 1 }, 1, (int64_t[]){ 1 }), NULL);
}
static ctpu_tensor g_bce(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)c; return ctpu_bce_with_logits(a, ctpu_sigmoid(b), CTPU_REDUCE_MEAN); }
static ctpu_tensor g_mse(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)c; return ctpu_mse_loss(a, b, CTPU_REDUCE_MEAN); }
static ctpu_tensor g_l1(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)c; return ctpu_l1_loss(a, b, CTPU_REDUCE_MEAN); }
static ctpu_tensor g_smooth_l1(ctpu_tensor a, ctpu_tensor b, ctpu_tensor c) { (void)c; return ctpu_smooth_l1_loss(a, b, CTPU_REDUCE_MEAN, 1.0); }

/* A runner per op row (the rows not here are listed in NOT_HERE with why). */
static const grid_fn GRID_OPS[CTPU_OP_COUNT] = {
    [CTPU_OP_NEG] = g_neg, [CTPU_OP_ABS] = g_abs, [CTPU_OP_EXP] = g_exp, [CTPU_OP_LOG] = g_log,
    [CTPU_OP_SQRT] = g_sqrt, [CTPU_OP_RSQRT] = g_rsqrt, [CTPU_OP_TANH] = g_tanh, [CTPU_OP_SIGMOID] = g_sigmoid,
    [CTPU_OP_RELU] = g_relu, [CTPU_OP_GELU_TANH] = g_gelu_tanh, [CTPU_OP_GELU_ERF] = g_gelu_erf,
    [CTPU_OP_SOFTPLUS] = g_softplus, [CTPU_OP_ERF] = g_erf, [CTPU_OP_SIN] = g_sin, [CTPU_OP_COS] = g_cos,
    [CTPU_OP_LOG1P] = g_log1p, [CTPU_OP_EXPM1] = g_expm1, [CTPU_OP_ADD] = g_add, [CTPU_OP_SUB] = g_sub,
    [CTPU_OP_MUL] = g_mul, [CTPU_OP_DIV] = g_div, [CTPU_OP_POW] = g_pow, [CTPU_OP_MAXIMUM] = g_maximum,
    [CTPU_OP_MINIMUM] = g_minimum, [CTPU_OP_EQ] = g_eq, [CTPU_OP_NE] = g_ne, [CTPU_OP_LT] = g_lt, [CTPU_OP_LE] = g_le,
    [CTPU_OP_GT] = g_gt, [CTPU_OP_GE] = g_ge, [CTPU_OP_ADD_SCALAR] = g_add_scalar, [CTPU_OP_SUB_SCALAR] = g_sub_scalar,
    [CTPU_OP_MUL_SCALAR] = g_mul_scalar, [CTPU_OP_DIV_SCALAR] = g_div_scalar, [CTPU_OP_POW_SCALAR] = g_pow_scalar,
    [CTPU_OP_MAXIMUM_SCALAR] = g_maximum_scalar, [CTPU_OP_MINIMUM_SCALAR] = g_minimum_scalar,
    [CTPU_OP_EQ_SCALAR] = g_eq_scalar, [CTPU_OP_NE_SCALAR] = g_ne_scalar, [CTPU_OP_LT_SCALAR] = g_lt_scalar,
    [CTPU_OP_LE_SCALAR] = g_le_scalar, [CTPU_OP_GT_SCALAR] = g_gt_scalar, [CTPU_OP_GE_SCALAR] = g_ge_scalar,
    [CTPU_OP_WHERE] = g_where, [CTPU_OP_CLAMP] = g_clamp, [CTPU_OP_CAST] = g_cast, [CTPU_OP_SUM] = g_sum,
    [CTPU_OP_MEAN] = g_mean, [CTPU_OP_MAX] = g_max, [CTPU_OP_MIN] = g_min, [CTPU_OP_VAR] = g_var,
    [CTPU_OP_ARGMAX] = g_argmax, [CTPU_OP_SOFTMAX] = g_softmax, [CTPU_OP_LOG_SOFTMAX] = g_log_softmax,
    [CTPU_OP_RESHAPE] = g_reshape, [CTPU_OP_PERMUTE] = g_permute, [CTPU_OP_SLICE] = g_slice,
    [CTPU_OP_CONCAT] = g_concat, [CTPU_OP_EXPAND] = g_expand, [CTPU_OP_EMBEDDING] = g_embedding,
    [CTPU_OP_GATHER] = g_gather, [CTPU_OP_MATMUL] = g_matmul, [CTPU_OP_SDPA] = g_sdpa, [CTPU_OP_ARGMIN] = g_argmin, [CTPU_OP_PROD] = g_prod,
    [CTPU_OP_CUMSUM] = g_cumsum, [CTPU_OP_SCATTER_ADD] = g_scatter_add,
};
/* Rows without inputs to put a grid in (creation, random), backward helpers
 * (run by the backward of slice, embedding, gather above), copy (assign),
 * and collectives (the identity in a world of one rank). */
static bool not_here(int op)
{
    return ctpu_op_is(op, CTPU_OPK_CREATION | CTPU_OPK_BACKWARD | CTPU_OPK_COLLECTIVE) || op == CTPU_OP_COPY;
}
static const struct { const char *name; grid_fn fn; } GRID_EXTRA[] = {
    { "silu", g_silu }, { "leaky_relu", g_leaky_relu }, { "elu", g_elu }, { "contiguous", g_contiguous },
    { "rsub_scalar", g_rsub_scalar }, { "rdiv_scalar", g_rdiv_scalar }, { "rpow_scalar", g_rpow_scalar },
    { "tril", g_tril }, { "layer_norm", g_layer_norm }, { "rms_norm", g_rms_norm },
    { "cross_entropy", g_cross_entropy }, { "bce_with_logits", g_bce }, { "mse_loss", g_mse },
    { "l1_loss", g_l1 }, { "smooth_l1_loss", g_smooth_l1 }, { "logsumexp", g_logsumexp },
};

static int grid_forward_nan, grid_cases;

/* One case: forward with checks on; a NaN error must name the op the user
 * called (its first NaN); otherwise the backward must raise nothing. */
static void grid_case(const char *name, grid_fn fn, float va, float vb, float vc)
{
    ctpu_scope_begin();
    ctpu_tensor a = T_VEC(va), b = T_VEC(vb), c = T_VEC(vc);
    ctpu_set_requires_grad(a, true);
    ctpu_set_requires_grad(b, true);
    ctpu_set_requires_grad(c, true);
    ctpu_clear_error();
    ctpu_tensor y = fn(a, b, c);
    grid_cases++;
    if (ctpu_is_null(y)) {
        ck_assert_msg(ctpu_last_status() == CTPU_ERR_NAN, "%s(%g, %g, %g): %s", name, va, vb, vc, ctpu_last_error());
        ck_assert_msg(!t_contains(ctpu_last_error(), "backward of"), "%s: %s", name, ctpu_last_error());
        grid_forward_nan++;
    } else if (ctpu_requires_grad(y)) {
        ctpu_tensor g = ctpu_full(ctpu_dtype_of(y), 0, NULL, 1.0);
        int64_t sh[8];
        int nd;
        ctpu_shape(y, sh, &nd);
        g = ctpu_expand(ctpu_reshape(g, 0, NULL), nd, sh);
        ctpu_status st = ctpu_backward_with(y, g);
        if (st == CTPU_OK) st = ctpu_sync();   /* defer and fuse: the checks run at the launch */
        ck_assert_msg(st == CTPU_OK || (st == CTPU_ERR_NAN && !t_contains(ctpu_last_error(), "backward of")),
                      "backward of %s(%g, %g, %g) made a NaN from finite values: %s", name, va, vb, vc,
                      ctpu_last_error());
        if (st == CTPU_ERR_NAN) {   /* the forward's own NaN, found at the launch */
            ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_DEFER_FUSE);
            grid_forward_nan++;
        }
    } else {
        ctpu_status st = ctpu_sync();
        ck_assert_msg(st == CTPU_OK || st == CTPU_ERR_NAN, "%s: %s", name, ctpu_last_error());
        if (st == CTPU_ERR_NAN) grid_forward_nan++;
    }
    ctpu_scope_end();
}

static void grid_sweep(const char *name, grid_fn fn)
{
    for (int i = 0; i < N_GRID; i++)
        for (int j = 0; j < N_GRID; j++) grid_case(name, fn, GRID[i], GRID[j], GRID[(i + j) % N_GRID]);
}

START_TEST(grid_every_op_forward_and_backward)
{
    ck_assert_int_eq(ctpu_set_mode(_i == 0 ? CTPU_MODE_DEBUG : CTPU_MODE_DEFER_FUSE), CTPU_OK);
    if (_i) ck_assert_int_eq(ctpu_set_debug_checks(true), CTPU_OK);
    ck_assert(ctpu_debug_checks());
    for (int op = 0; op < CTPU_OP_COUNT; op++) {
        if (not_here(op)) continue;
        ck_assert_msg(GRID_OPS[op] != NULL, "op %s has no case in the NaN grid (test_provenance.c)", ctpu_op_name(op));
        grid_sweep(ctpu_op_name(op), GRID_OPS[op]);
    }
    for (size_t k = 0; k < sizeof GRID_EXTRA / sizeof GRID_EXTRA[0]; k++) grid_sweep(GRID_EXTRA[k].name, GRID_EXTRA[k].fn);
    fprintf(stderr, "provenance: NaN grid (%s): %d cases, %d forward NaN errors where the op made one\n",
            _i ? "defer_fuse" : "debug", grid_cases, grid_forward_nan);
    ck_assert_int_gt(grid_forward_nan, 0);   /* log(-2.5), div(0, 0), ... are the user's own NaNs */
}
END_TEST

/* The rule itself: made here is an error, passed along is not, Inf never. */
START_TEST(nan_made_passed_inf)
{
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEBUG), CTPU_OK);
    ctpu_tensor nan = T_VEC(1, NAN), neg = T_VEC(1, -1), inf = T_VEC(1, INFINITY);
    ck_assert(!ctpu_is_null(ctpu_relu(nan)));                  /* passes one along */
    ck_assert(!ctpu_is_null(ctpu_add(nan, neg)));
    ck_assert(!ctpu_is_null(ctpu_sub(inf, inf)));              /* inf - inf: from an Inf */
    ck_assert(!ctpu_is_null(ctpu_exp(T_VEC(1000))));           /* Inf is never an error */
    ctpu_clear_error();
    ctpu_tensor r = ctpu_log(neg);
    ck_assert(ctpu_is_null(r));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_NAN);
    ck_assert_str_eq(ctpu_last_error(), "log (op #5): debug check: NaN in the output, none in its inputs "
                                        "(TORCH_TPU_ENABLE_DEBUG_CHECKS)");
    /* a NaN (or an Inf) given as a host number is passed along too */
    ck_assert_msg(!ctpu_is_null(ctpu_add_scalar(neg, NAN)), "%s", ctpu_last_error());
    ck_assert_msg(!ctpu_is_null(ctpu_full(CTPU_F32, 1, (int64_t[]){ 3 }, NAN)), "%s", ctpu_last_error());
    ck_assert_msg(!ctpu_is_null(ctpu_clamp(neg, NAN, 1)), "%s", ctpu_last_error());
    ck_assert_msg(!ctpu_is_null(ctpu_mul_scalar(T_VEC(0), INFINITY)), "%s", ctpu_last_error());
    /* mean and var over an empty dim, var with n <= correction: NaN, no error */
    ctpu_tensor e = ctpu_zeros(CTPU_F32, 2, (int64_t[]){ 3, 0 });
    ck_assert(!ctpu_is_null(ctpu_mean(e, 1, (int[]){ 1 }, false)));
    ck_assert(!ctpu_is_null(ctpu_var(e, 1, (int[]){ 1 }, 1, false)));
    ck_assert(!ctpu_is_null(ctpu_var(T_VEC(2), 0, NULL, 1, false)));
    /* exact GELU's backward at 0 (its rule had a NaN intermediate, "div") */
    ctpu_tensor x = T_VEC(0, -0.0f, 1);
    ctpu_set_requires_grad(x, true);
    ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_gelu(x, false), 0, NULL, false)), CTPU_OK);
    float *g = t_read(ctpu_grad(x), NULL);
    ck_assert(g[0] == 0.5f && g[1] == 0.5f);
    free(g);
    /* a NaN made inside a library call is named after the call, as its faults
     * are: the mean cross entropy of a batch whose every label is ignored is
     * 0 / 0 (torch gives NaN too) */
    ctpu_clear_error();
    ctpu_tensor ce = ctpu_cross_entropy(ctpu_zeros(CTPU_F32, 2, (int64_t[]){ 2, 3 }),
                                        t_i32((int32_t[]){ -100, -100 }, 1, (int64_t[]){ 2 }), NULL);
    ck_assert(ctpu_is_null(ce));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_NAN);
    ck_assert_msg(t_contains(ctpu_last_error(), "cross_entropy (op #") &&
                      t_contains(ctpu_last_error(), "): div: debug check: NaN in the output"),
                  "%s", ctpu_last_error());
}
END_TEST

/* The checks follow the current mode unless forced. */
START_TEST(checks_follow_the_mode)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("TORCH_TPU_LAUNCH_BLOCKING", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    unsetenv("TORCH_TPU_LAUNCH_BLOCKING");
    ck_assert(ctpu_debug_checks());
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    ck_assert(!ctpu_debug_checks());
    ctpu_tensor r = ctpu_log(T_VEC(-1));
    ck_assert(!ctpu_is_null(r));
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ck_assert_int_eq(ctpu_set_thread_mode(CTPU_MODE_DEBUG), CTPU_OK);
    ck_assert(ctpu_debug_checks());
    ck_assert(ctpu_is_null(ctpu_log(T_VEC(-1))));
    ctpu_clear_thread_mode();
    ck_assert(!ctpu_debug_checks());
    ctpu_shutdown();
    setenv("TORCH_TPU_ENABLE_DEBUG_CHECKS", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    unsetenv("TORCH_TPU_ENABLE_DEBUG_CHECKS");
    ck_assert(ctpu_debug_checks());             /* forced: on in strict eager too */
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    ck_assert(ctpu_debug_checks());
}
END_TEST


/* ------------------------------------------------------------ op provenance */
#define EMBED_FAULT "embedding (op #1, \"embed\"): index 57 at position 1 is out of range [0, 50) for weight f32[50,8] (1 bad index)"

/* One step: op #1 embedding (labelled), #2 relu, #3 sum, #4 the item. */
static ctpu_status faulting_step(const char *label, int32_t bad, double *v)
{
    static float w[400];
    ctpu_tensor W = t_f32(w, 2, (int64_t[]){ 50, 8 });
    ctpu_tensor idx = t_i32((int32_t[]){ 3, bad }, 1, (int64_t[]){ 2 });
    ck_assert_int_eq(ctpu_label_push(label), CTPU_OK);
    ctpu_tensor e = ctpu_embedding(W, idx);
    ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
    ctpu_tensor s = ctpu_sum(ctpu_relu(e), 0, NULL, false);
    if (ctpu_is_null(s)) return ctpu_last_status();       /* debug eager: at the op */
    return ctpu_item(ctpu_sum(s, 0, NULL, false), v);
}

START_TEST(fault_names_op_number_label_and_read)
{
    static const ctpu_mode modes[3] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    ctpu_mode m = modes[_i];
    ck_assert_int_eq(ctpu_set_mode(m), CTPU_OK);
    double v;
    for (int step = 0; step < 3; step++) {
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        /* a good step first, with another label: on the cache hit that
         * follows, the label and numbers are the faulting step's */
        ctpu_status st = faulting_step(step == 0 ? "other" : "embed", step == 0 ? 7 : 57, &v);
        if (step == 0) {
            ck_assert_int_eq(st, CTPU_OK);
        } else {
            ck_assert_int_eq(st, CTPU_ERR_DEVICE_FAULT);
            if (m == CTPU_MODE_DEBUG)
                ck_assert_str_eq(ctpu_last_error(), EMBED_FAULT);
            else
                ck_assert_str_eq(ctpu_last_error(), EMBED_FAULT ", raised at item (op #5)");
        }
        ctpu_step_end();
        ctpu_sync();
        ctpu_clear_error();
    }
}
END_TEST

/* nll_loss and cross_entropy (src/nn, public API only) make a gather: a bad
 * target faults as the user's call and argument (ctpu_call_push), in every
 * mode, with its op number and label. */
START_TEST(loss_faults_name_the_call)
{
    static const ctpu_mode modes[3] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    ctpu_mode m = modes[_i];
    ck_assert_int_eq(ctpu_set_mode(m), CTPU_OK);
    static const char *const want[2] = {
        "nll_loss (op #5, \"loss\"): target 7 at position 1 is out of range [0, 5) (1 bad index)",
        "cross_entropy (op #6, \"loss\"): labels 7 at position 1 is out of range [0, 5) (1 bad index)",
    };
    for (int which = 0; which < 2; which++)
        for (int step = 0; step < 2; step++) {       /* step 1: a cache hit in defer and fuse */
            ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
            float z[10] = { 0 };
            ctpu_tensor x = t_f32(z, 2, (int64_t[]){ 2, 5 });
            ctpu_tensor y = t_i32((int32_t[]){ 3, 7 }, 1, (int64_t[]){ 2 });
            ck_assert_int_eq(ctpu_label_push("loss"), CTPU_OK);
            ctpu_tensor l = which == 0 ? ctpu_nll_loss(x, y, NULL) : ctpu_cross_entropy(x, y, NULL);
            ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
            double v;
            if (m == CTPU_MODE_DEBUG) {
                ck_assert(ctpu_is_null(l));
                ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_DEVICE_FAULT);
                ck_assert_str_eq(ctpu_last_error(), want[which]);
            } else {
                ck_assert_int_eq(ctpu_item(l, &v), CTPU_ERR_DEVICE_FAULT);
                char full[256];
                snprintf(full, sizeof full, "%s, raised at item (op #%d)", want[which], which == 0 ? 13 : 14);
                ck_assert_str_eq(ctpu_last_error(), full);
            }
            ctpu_step_end();
            ctpu_sync();
            ctpu_clear_error();
        }
}
END_TEST

/* The call scope's own errors; the outermost scope names the fault. */
START_TEST(call_scope_rules)
{
    ck_assert_int_eq(ctpu_call_pop(), CTPU_ERR_STATE);
    ck_assert_str_eq(ctpu_last_error(), "call_pop: no call scope is open (ctpu_call_push)");
    ck_assert_int_eq(ctpu_call_push(NULL, "x"), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_call_push("f", ""), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_call_push("f\n", "x"), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_call_push("a_call_name_longer_than_31_bytes", "x"), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEBUG), CTPU_OK);
    ck_assert_int_eq(ctpu_call_push("my_loss", "classes"), CTPU_OK);
    for (int i = 1; i < 8; i++) ck_assert_int_eq(ctpu_call_push("inner", "idx"), CTPU_OK);
    ck_assert_int_eq(ctpu_call_push("ninth", "idx"), CTPU_ERR_STATE);
    ck_assert(t_contains(ctpu_last_error(), "call scopes nest at most 8 deep"));
    ctpu_tensor w = t_f32((float[]){ 1, 2, 3, 4 }, 2, (int64_t[]){ 2, 2 });
    ctpu_tensor e = ctpu_embedding(w, t_i32((int32_t[]){ 9 }, 1, (int64_t[]){ 1 }));
    ck_assert(ctpu_is_null(e));
    ck_assert_str_eq(ctpu_last_error(), "my_loss (op #1): classes 9 at position 0 is out of range [0, 2) for weight "
                                        "f32[2,2] (1 bad index)");
    for (int i = 0; i < 8; i++) ck_assert_int_eq(ctpu_call_pop(), CTPU_OK);
    e = ctpu_embedding(w, t_i32((int32_t[]){ 9 }, 1, (int64_t[]){ 1 }));
    ck_assert_str_eq(ctpu_last_error(), "embedding (op #2): index 9 at position 0 is out of range [0, 2) for weight "
                                        "f32[2,2] (1 bad index)");
}
END_TEST

/* A fault in the middle of a fused chain names the op that faulted (its
 * number and label), not the last op of the program or of a group: ops #1
 * and #2 fuse before the embedding, #4 to #6 after it. */
START_TEST(fault_inside_a_fused_chain)
{
    static const ctpu_mode modes[3] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    ctpu_mode m = modes[_i];
    ck_assert_int_eq(ctpu_set_mode(m), CTPU_OK);
    static float w[400];
    for (int step = 0; step < 3; step++) {
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor W = t_f32(w, 2, (int64_t[]){ 50, 8 });
        ctpu_tensor idx = t_i32((int32_t[]){ 3, step == 0 ? 5 : 57 }, 1, (int64_t[]){ 2 });
        ck_assert_int_eq(ctpu_label_push("prep"), CTPU_OK);
        ctpu_tensor x = ctpu_add_scalar(ctpu_mul_scalar(W, 2.0), 1.0);           /* #1, #2 */
        ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
        ck_assert_int_eq(ctpu_label_push(step == 2 ? "embed.hit" : "embed"), CTPU_OK);
        ctpu_tensor e = ctpu_embedding(x, idx);                                  /* #3 */
        ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
        ck_assert_int_eq(ctpu_label_push("head"), CTPU_OK);
        ctpu_tensor s = ctpu_sum(ctpu_mul_scalar(ctpu_relu(e), 3.0), 0, NULL, false);   /* #4 to #6 */
        ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
        double v;
        ctpu_status st = ctpu_is_null(s) ? ctpu_last_status() : ctpu_item(s, &v);   /* #7 */
        if (step == 0) {
            ck_assert_int_eq(st, CTPU_OK);
        } else {
            char want[256];
            snprintf(want, sizeof want, "embedding (op #3, \"%s\"): index 57 at position 1 is out of range [0, 50) "
                     "for weight f32[50,8] (1 bad index)%s", step == 2 ? "embed.hit" : "embed",
                     m == CTPU_MODE_DEBUG ? "" : ", raised at item (op #7)");
            ck_assert_int_eq(st, CTPU_ERR_DEVICE_FAULT);
            ck_assert_str_eq(ctpu_last_error(), want);
        }
        ctpu_step_end();
        ctpu_sync();
        ctpu_clear_error();
    }
}
END_TEST

START_TEST(numbers_restart_each_step)
{
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEBUG), CTPU_OK);
    ctpu_tensor a = T_VEC(1, -1);
    ctpu_relu(a);                                   /* op #1 */
    ck_assert_int_eq(ctpu_mark_step(), CTPU_OK);
    ctpu_relu(a);                                   /* op #1 again */
    ck_assert_int_eq(ctpu_label_push("blk"), CTPU_OK);
    ck_assert_int_eq(ctpu_label_push("blk.inner"), CTPU_OK);
    ctpu_clear_error();
    ck_assert(ctpu_is_null(ctpu_log(a)));           /* op #2 */
    ck_assert_str_eq(ctpu_last_error(), "log (op #2, \"blk.inner\"): debug check: NaN in the output, none in its "
                                        "inputs (TORCH_TPU_ENABLE_DEBUG_CHECKS)");
    ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
    ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
    ctpu_step_end();                                /* restarts too */
    ck_assert(ctpu_is_null(ctpu_log(a)));
    ck_assert_str_eq(ctpu_last_error(), "log (op #1, \"blk\"): debug check: NaN in the output, none in its "
                                        "inputs (TORCH_TPU_ENABLE_DEBUG_CHECKS)");
    ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
}
END_TEST

START_TEST(label_errors)
{
    ck_assert_int_eq(ctpu_label_pop(), CTPU_ERR_STATE);
    ck_assert_str_eq(ctpu_last_error(), "label_pop: no label is open (ctpu_label_push)");
    ck_assert_int_eq(ctpu_label_push(NULL), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_label_push(""), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_label_push("a\nb"), CTPU_ERR_INVALID_ARG);
    char big[80];
    memset(big, 'x', sizeof big - 1);
    big[79] = 0;
    ck_assert_int_eq(ctpu_label_push(big), CTPU_ERR_INVALID_ARG);
    for (int i = 0; i < 32; i++) ck_assert_int_eq(ctpu_label_push("deep"), CTPU_OK);
    ck_assert_int_eq(ctpu_label_push("deeper"), CTPU_ERR_STATE);
    ck_assert_str_eq(ctpu_last_error(), "label_push: labels nest at most 32 deep (\"deeper\" would be number 33); "
                                        "likely cause: a missing ctpu_label_pop (every push needs one, on error "
                                        "paths too)");
    for (int i = 0; i < 32; i++) ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
    /* the table of distinct labels is bounded */
    char nm[32];
    ctpu_status st = CTPU_OK;
    int i;
    for (i = 0; i < 5000 && st == CTPU_OK; i++) {
        snprintf(nm, sizeof nm, "l%d", i);
        st = ctpu_label_push(nm);
        if (st == CTPU_OK) ctpu_label_pop();
    }
    ck_assert_int_eq(st, CTPU_ERR_INVALID_ARG);
    ck_assert(t_contains(ctpu_last_error(), "at most 4096 distinct labels"));
    ck_assert_int_eq(ctpu_label_push("l7"), CTPU_OK);   /* a known one still works */
    ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
    /* the library's names have slots of their own: a full label table keeps
     * a loss's fault named as the user's call (it said "gather" before) */
    ck_assert_int_eq(ctpu_call_push("mycall", "idx"), CTPU_OK);
    ck_assert_int_eq(ctpu_call_pop(), CTPU_OK);
    float lg[6] = { 1, 2, 3, 4, 5, 6 };
    int32_t lb[2] = { 1, 7 };
    int64_t ls[2] = { 2, 3 }, bs[1] = { 2 };
    ctpu_tensor L = ctpu_from_host(lg, CTPU_F32, 2, ls), T = ctpu_from_host(lb, CTPU_I32, 1, bs);
    ctpu_tensor ce = ctpu_cross_entropy(L, T, NULL);
    double v = 0;
    ck_assert_int_ne(ctpu_item(ce, &v), CTPU_OK);
    ck_assert_msg(t_contains(ctpu_last_error(), "cross_entropy (op #"), "%s", ctpu_last_error());
    ck_assert(!t_contains(ctpu_last_error(), "gather"));
    ctpu_release(ce);
    ctpu_release(L);
    ctpu_release(T);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("provenance");
    TCase *tc = tcase_create("error_handles");
    tcase_add_checked_fixture(tc, t_setup, t_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, every_entry_point_keeps_the_cause);
    tcase_add_test(tc, literal_null_unchanged);
    tcase_add_test(tc, literal_null_every_kind_of_op);
    tcase_add_test(tc, arange_int_step_and_composite_names);
    tcase_add_test(tc, chain_reports_the_first_cause);
    tcase_add_test(tc, ring_is_bounded);
    suite_add_tcase(s, tc);
    TCase *dc = tcase_create("debug_checks");
    tcase_add_checked_fixture(dc, t_setup, t_teardown);
    tcase_set_timeout(dc, 300);
    tcase_add_loop_test(dc, grid_every_op_forward_and_backward, 0, 2);
    tcase_add_test(dc, nan_made_passed_inf);
    tcase_add_test(dc, checks_follow_the_mode);
    suite_add_tcase(s, dc);
    TCase *pc = tcase_create("op_provenance");
    tcase_add_checked_fixture(pc, t_setup, t_teardown);
    tcase_set_timeout(pc, 120);
    tcase_add_loop_test(pc, fault_names_op_number_label_and_read, 0, 3);
    tcase_add_test(pc, numbers_restart_each_step);
    tcase_add_loop_test(pc, loss_faults_name_the_call, 0, 3);
    tcase_add_test(pc, call_scope_rules);
    tcase_add_loop_test(pc, fault_inside_a_fused_chain, 0, 3);
    tcase_add_test(pc, label_errors);
    suite_add_tcase(s, pc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
