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

/* nn's functions (include/ctpu_nn.h), built on the public API */
static bool is_nn(const char *fn)
{
    static const char *const nn[] = { "ctpu_linear_forward", "ctpu_layer_norm_layer_forward",
                                      "ctpu_embedding_layer_forward", "ctpu_dropout", "ctpu_cross_entropy",
                                      "ctpu_mse_loss", "ctpu_nll_loss", "ctpu_bce_with_logits", "ctpu_l1_loss",
                                      "ctpu_smooth_l1_loss" };
    for (size_t i = 0; i < sizeof nn / sizeof nn[0]; i++)
        if (!strcmp(fn, nn[i])) return true;
    return false;
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
 * ops make its cause the last error again; nn's (public API only) leave
 * the last error as it was. */
#define EP_T(fn, ...)                                                                                         \
    do {                                                                                                      \
        fresh();                                                                                              \
        ctpu_tensor r_ = fn(__VA_ARGS__);                                                                     \
        cover(#fn);                                                                                           \
        ck_assert_msg(r_.id == E.id, "%s(error handle) returned %#llx, not the error handle %#llx (%s)", #fn,  \
                      (unsigned long long)r_.id, (unsigned long long)E.id, ctpu_last_error());                \
        ck_assert_msg((ctpu_last_status() == CTPU_ERR_SHAPE && strcmp(ctpu_last_error(), CAUSE) == 0) ||      \
                      (ctpu_last_status() == CTPU_OK && !strncmp(#fn, "ctpu_", 5) && is_nn(#fn)),             \
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
    EP_T(ctpu_clamp, E, 0, 1); EP_T(ctpu_cast, E, CTPU_BF16);
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

/* CTPU_NULL itself: CTPU_ERR_NULL_HANDLE as before; ops return CTPU_NULL. */
START_TEST(literal_null_unchanged)
{
    double v;
    ck_assert_int_eq(ctpu_item(CTPU_NULL, &v), CTPU_ERR_NULL_HANDLE);
    ck_assert_str_eq(ctpu_last_error(), "item: t is a null handle");
    ctpu_tensor e = make_error();
    ctpu_tensor r = ctpu_relu(CTPU_NULL);
    ck_assert(r.id == 0);
    ck_assert(ctpu_error_handle().id == 0);
    ck_assert_int_eq(ctpu_item(ctpu_relu(e), &v), CTPU_ERR_SHAPE);
    ck_assert_str_eq(ctpu_last_error(), "item: t is the result of a failed call " FROM);
    ck_assert(ctpu_is_null(e) && ctpu_is_null(CTPU_NULL) && !ctpu_is_null(T_VEC(1)));
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

int main(void)
{
    Suite *s = suite_create("provenance");
    TCase *tc = tcase_create("error_handles");
    tcase_add_checked_fixture(tc, t_setup, t_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, every_entry_point_keeps_the_cause);
    tcase_add_test(tc, literal_null_unchanged);
    tcase_add_test(tc, chain_reports_the_first_cause);
    tcase_add_test(tc, ring_is_bounded);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
