/* Bad input to every public function of include/ctpu.h (DESIGN.md "Errors"):
 * null, stale (released), out-of-scope and garbage handles, wrong dtypes,
 * incompatible shapes, negative and overflowing sizes, dims out of range,
 * NULL pointers, bad enums. Each gives an error status or a null handle, a
 * one-line ctpu_last_error() naming the op, and the runtime stays usable (a
 * good op runs after every bad one). An op given a null handle returns null
 * without overwriting the previous message. */
#include "t_core.h"
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */
static int64_t S23[2] = { 2, 3 }, S32[2] = { 3, 2 };

static ctpu_tensor mk(char kind)
{
    float f[6] = { 0.5f, 1, 2, 3, 4, 5 };
    int32_t i[6] = { 0, 1, 1, 0, 1, 1 };
    switch (kind) {
    case 'i': return t_i32(i, 2, S23);       /* indices, valid for [2,3] gather and [2,*] embedding */
    case 'm': return t_f32(f, 2, S32);       /* matmul right operand */
    default: return t_f32(f, 2, S23);
    }
}

/* After every bad call: the runtime still computes. */
static void good_op(void)
{
    ctpu_tensor a = T_VEC(1, 2, 3);
    ctpu_tensor s = ctpu_sum(ctpu_mul(a, a), 0, NULL, false);
    double v = 0;
    ck_assert_msg(ctpu_item(s, &v) == CTPU_OK, "runtime unusable after a bad call: %s", ctpu_last_error());
    ck_assert(v == 14);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
}

/* An error with a message naming `op`. */
#define EXPECT_ERR(st, want, op)                                                                      \
    do {                                                                                              \
        ctpu_status st_ = (st);                                                                       \
        ck_assert_msg(st_ == (want), "%s: status %s, want %s (%s)", op, ctpu_status_str(st_),        \
                      ctpu_status_str(want), ctpu_last_error());                                      \
        ck_assert_int_eq(ctpu_last_status(), (want));                                                 \
        ck_assert_msg(t_contains(ctpu_last_error(), op), "message does not name %s: \"%s\"", op,     \
                      ctpu_last_error());                                                             \
        ck_assert_msg(strchr(ctpu_last_error(), '\n') == NULL, "message is not one line");           \
        ctpu_clear_error();                                                                           \
        good_op();                                                                                    \
    } while (0)

#define EXPECT_NULL(expr, want, op)                                                                   \
    do {                                                                                              \
        ctpu_clear_error();                                                                           \
        ctpu_tensor r_ = (expr);                                                                      \
        ck_assert_msg(ctpu_is_null(r_), "%s: expected a null handle", op);                           \
        EXPECT_ERR(ctpu_last_status(), want, op);                                                     \
    } while (0)

/* ------------------------------------------------------------ the op table */
typedef struct {
    const char *name;       /* what the message must contain */
    const char *kinds;      /* tensor arguments: f = f32 [2,3], i = i32 [2,3] indices, m = f32 [3,2] */
    ctpu_tensor (*fn)(ctpu_tensor *t);
} op_entry;

#define U(nm, expr) static ctpu_tensor f_##nm(ctpu_tensor *t) { return expr; }
U(neg, ctpu_neg(t[0])) U(abs, ctpu_abs(t[0])) U(exp, ctpu_exp(t[0])) U(log, ctpu_log(t[0]))
U(sqrt, ctpu_sqrt(t[0])) U(rsqrt, ctpu_rsqrt(t[0])) U(tanh, ctpu_tanh(t[0])) U(sigmoid, ctpu_sigmoid(t[0]))
U(relu, ctpu_relu(t[0])) U(gelu_t, ctpu_gelu(t[0], true)) U(gelu_e, ctpu_gelu(t[0], false))
U(softplus, ctpu_softplus(t[0]))
U(add, ctpu_add(t[0], t[1])) U(sub, ctpu_sub(t[0], t[1])) U(mul, ctpu_mul(t[0], t[1]))
U(div, ctpu_div(t[0], t[1])) U(pow, ctpu_pow(t[0], t[1])) U(maximum, ctpu_maximum(t[0], t[1]))
U(minimum, ctpu_minimum(t[0], t[1])) U(eq, ctpu_eq(t[0], t[1])) U(ne, ctpu_ne(t[0], t[1]))
U(lt, ctpu_lt(t[0], t[1])) U(le, ctpu_le(t[0], t[1])) U(gt, ctpu_gt(t[0], t[1])) U(ge, ctpu_ge(t[0], t[1]))
U(adds, ctpu_add_scalar(t[0], 1)) U(subs, ctpu_sub_scalar(t[0], 1)) U(muls, ctpu_mul_scalar(t[0], 2))
U(divs, ctpu_div_scalar(t[0], 2)) U(pows, ctpu_pow_scalar(t[0], 2)) U(maxs, ctpu_maximum_scalar(t[0], 1))
U(mins, ctpu_minimum_scalar(t[0], 1)) U(rsubs, ctpu_rsub_scalar(t[0], 1)) U(rdivs, ctpu_rdiv_scalar(t[0], 1))
U(rpows, ctpu_rpow_scalar(t[0], 2)) U(eqs, ctpu_eq_scalar(t[0], 1)) U(nes, ctpu_ne_scalar(t[0], 1))
U(lts, ctpu_lt_scalar(t[0], 1)) U(les, ctpu_le_scalar(t[0], 1)) U(gts, ctpu_gt_scalar(t[0], 1))
U(ges, ctpu_ge_scalar(t[0], 1)) U(where, ctpu_where(t[0], t[1], t[2])) U(clamp, ctpu_clamp(t[0], 0, 1))
U(cast, ctpu_cast(t[0], CTPU_BF16)) U(sum, ctpu_sum(t[0], 1, (int[]){ 1 }, false))
U(mean, ctpu_mean(t[0], 0, NULL, true)) U(max, ctpu_max(t[0], 1, (int[]){ 0 }, false))
U(min, ctpu_min(t[0], 0, NULL, false)) U(var, ctpu_var(t[0], 1, (int[]){ -1 }, 1, false))
U(argmax, ctpu_argmax(t[0], 1, false)) U(softmax, ctpu_softmax(t[0], 1)) U(log_softmax, ctpu_log_softmax(t[0], 0))
U(reshape, ctpu_reshape(t[0], 1, (int64_t[]){ 6 })) U(permute, ctpu_permute(t[0], (int[]){ 1, 0 }))
U(transpose, ctpu_transpose(t[0], 0, 1)) U(contiguous, ctpu_contiguous(t[0]))
U(slice, ctpu_slice(t[0], 1, 0, 2, 1)) U(concat, ctpu_concat(2, t, 0))
U(expand, ctpu_expand(t[0], 3, (int64_t[]){ 4, 2, 3 })) U(embedding, ctpu_embedding(t[0], t[1]))
U(gather, ctpu_gather(t[0], 1, t[1])) U(matmul, ctpu_matmul(t[0], t[1]))
U(matmul_t, ctpu_matmul_t(t[0], t[1], false, true)) U(detach, ctpu_detach(t[0]))
#undef U

static const op_entry OPS[] = {
    { "neg", "f", f_neg }, { "abs", "f", f_abs }, { "exp", "f", f_exp }, { "log", "f", f_log },
    { "sqrt", "f", f_sqrt }, { "rsqrt", "f", f_rsqrt }, { "tanh", "f", f_tanh }, { "sigmoid", "f", f_sigmoid },
    { "relu", "f", f_relu }, { "gelu", "f", f_gelu_t }, { "gelu", "f", f_gelu_e }, { "softplus", "f", f_softplus },
    { "add", "ff", f_add }, { "sub", "ff", f_sub }, { "mul", "ff", f_mul }, { "div", "ff", f_div },
    { "pow", "ff", f_pow }, { "maximum", "ff", f_maximum }, { "minimum", "ff", f_minimum }, { "eq", "ff", f_eq },
    { "ne", "ff", f_ne }, { "lt", "ff", f_lt }, { "le", "ff", f_le }, { "gt", "ff", f_gt }, { "ge", "ff", f_ge },
    { "add", "f", f_adds }, { "sub", "f", f_subs }, { "mul", "f", f_muls }, { "div", "f", f_divs },
    { "pow", "f", f_pows }, { "maximum", "f", f_maxs }, { "minimum", "f", f_mins }, { "sub", "f", f_rsubs },
    { "div", "f", f_rdivs }, { "pow", "f", f_rpows }, { "eq", "f", f_eqs }, { "ne", "f", f_nes },
    { "lt", "f", f_lts }, { "le", "f", f_les }, { "gt", "f", f_gts }, { "ge", "f", f_ges },
    { "where", "fff", f_where }, { "clamp", "f", f_clamp }, { "cast", "f", f_cast }, { "sum", "f", f_sum },
    { "mean", "f", f_mean }, { "max", "f", f_max }, { "min", "f", f_min }, { "var", "f", f_var },
    { "argmax", "f", f_argmax }, { "softmax", "f", f_softmax }, { "log_softmax", "f", f_log_softmax },
    { "reshape", "f", f_reshape }, { "permute", "f", f_permute }, { "transpose", "f", f_transpose },
    { "contiguous", "f", f_contiguous }, { "slice", "f", f_slice }, { "concat", "ff", f_concat },
    { "expand", "f", f_expand }, { "embedding", "fi", f_embedding }, { "gather", "fi", f_gather },
    { "matmul", "fm", f_matmul }, { "matmul", "ff", f_matmul_t }, { "detach", "f", f_detach },
};
#define N_OPS ((int)(sizeof OPS / sizeof OPS[0]))

static void make_args(const op_entry *e, ctpu_tensor *t)
{
    for (int k = 0; e->kinds[k]; k++) t[k] = mk(e->kinds[k]);
}

START_TEST(op_good_inputs_work)
{
    const op_entry *e = &OPS[_i];
    ctpu_tensor t[3];
    make_args(e, t);
    ctpu_tensor r = e->fn(t);
    ck_assert_msg(!ctpu_is_null(r), "%s with good inputs: %s", e->name, ctpu_last_error());
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
}
END_TEST

/* CTPU_NULL for any tensor argument of any op: CTPU_ERR_NULL_HANDLE naming
 * the op (never the earlier, unrelated error left standing). */
START_TEST(op_null_handle_keeps_message)
{
    const op_entry *e = &OPS[_i];
    for (int p = 0; e->kinds[p]; p++) {
        ctpu_tensor t[3];
        make_args(e, t);
        t[p] = CTPU_NULL;
        ctpu_report_error(CTPU_ERR_IO, "sentinel: an earlier error");
        ctpu_tensor r = e->fn(t);
        ck_assert_msg(ctpu_is_null(r), "%s: null argument %d gave a handle", e->name, p);
        ck_assert_msg(ctpu_last_status() == CTPU_ERR_NULL_HANDLE && strstr(ctpu_last_error(), "is a null handle (CTPU_NULL)") &&
                      strncmp(ctpu_last_error(), e->name, strlen(e->name)) == 0,
                      "%s: null argument %d gave status %d \"%s\"", e->name, p, (int)ctpu_last_status(), ctpu_last_error());
        ctpu_clear_error();
        good_op();
    }
}
END_TEST

START_TEST(op_stale_handles)
{
    const op_entry *e = &OPS[_i];
    for (int p = 0; e->kinds[p]; p++) {
        for (int how = 0; how < 4; how++) {
            ctpu_tensor t[3];
            make_args(e, t);
            switch (how) {
            case 0: ck_assert_int_eq(ctpu_release(t[p]), CTPU_OK); break;             /* released */
            case 1:                                                                    /* scope ended */
                ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
                t[p] = mk(e->kinds[p]);
                ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
                break;
            case 2: t[p].id = ((uint64_t)0xdeadbeefu << 32) | 1; break;                /* wrong generation */
            default: t[p].id = ((uint64_t)1 << 32) | 0x7fffffffu; break;               /* no such slot */
            }
            ctpu_clear_error();
            ctpu_tensor r = e->fn(t);
            ck_assert_msg(ctpu_is_null(r), "%s: stale argument %d (%d) gave a handle", e->name, p, how);
            ck_assert_msg(ctpu_last_status() == CTPU_ERR_STALE_HANDLE, "%s: stale argument %d (%d): %s (%s)", e->name,
                          p, how, ctpu_status_str(ctpu_last_status()), ctpu_last_error());
            ck_assert_msg(t_contains(ctpu_last_error(), e->name), "%s: \"%s\"", e->name, ctpu_last_error());
            ctpu_clear_error();
            good_op();
        }
    }
}
END_TEST

/* ------------------------------------------------------------ handle functions */
START_TEST(handle_functions)
{
    ctpu_tensor stale = T_VEC(1);
    ctpu_release(stale);
    ctpu_tensor ts[2] = { CTPU_NULL, stale };
    ctpu_status want[2] = { CTPU_ERR_NULL_HANDLE, CTPU_ERR_STALE_HANDLE };
    for (int k = 0; k < 2; k++) {
        ctpu_tensor t = ts[k];
        float buf[4];
        double v;
        int64_t sh[8];
        int nd;
        ctpu_tensor good = T_VEC(1);
        EXPECT_ERR(ctpu_to_host(t, buf, sizeof buf), want[k], "to_host");
        EXPECT_ERR(ctpu_item(t, &v), want[k], "item");
        EXPECT_ERR(ctpu_release(t), want[k], "release");
        EXPECT_ERR(ctpu_assign(t, good), want[k], "assign");
        EXPECT_ERR(ctpu_assign(good, t), want[k], "assign");
        EXPECT_ERR(ctpu_shape(t, sh, &nd), want[k], "shape");
        ck_assert_int_eq(ctpu_ndim(t), -1);
        EXPECT_ERR(ctpu_last_status(), want[k], "ndim");
        ck_assert_int_eq(ctpu_dim(t, 0), -1);
        EXPECT_ERR(ctpu_last_status(), want[k], "dim");
        ck_assert_int_eq(ctpu_numel(t), -1);
        EXPECT_ERR(ctpu_last_status(), want[k], "numel");
        ck_assert_int_eq(ctpu_dtype_of(t), CTPU_DTYPE_COUNT);
        EXPECT_ERR(ctpu_last_status(), want[k], "dtype");
        ck_assert(!ctpu_is_valid(t));
        ck_assert(!ctpu_requires_grad(t));
        EXPECT_ERR(ctpu_set_requires_grad(t, true), want[k], "requires_grad");
        EXPECT_ERR(ctpu_backward(t), want[k], "backward");
        EXPECT_ERR(ctpu_backward_ex(t, CTPU_NULL, false), want[k], "backward");
        EXPECT_ERR(ctpu_backward_with(t, good), want[k], "backward");
        EXPECT_ERR(ctpu_zero_grad(t), want[k], "zero_grad");
        ctpu_clear_error();
        ck_assert(ctpu_is_null(ctpu_grad(t)));
        if (k == 0) ck_assert(ctpu_is_null(ctpu_keep(t)));
        else EXPECT_NULL(ctpu_keep(t), CTPU_ERR_STALE_HANDLE, "keep");
    }
}
END_TEST

/* ------------------------------------------------------------ creation */
START_TEST(creation_bad_sizes)
{
    float d[4] = { 0 };
    int64_t huge[2] = { (int64_t)1 << 40, (int64_t)1 << 40 }, neg[2] = { 2, -1 }, ok[2] = { 2, 2 };
    int64_t big9[9] = { 1, 1, 1, 1, 1, 1, 1, 1, 1 };
    EXPECT_NULL(ctpu_from_host(d, CTPU_F32, 2, huge), CTPU_ERR_SHAPE, "from_host");
    EXPECT_NULL(ctpu_from_host(d, CTPU_F32, 2, neg), CTPU_ERR_SHAPE, "from_host");
    EXPECT_NULL(ctpu_from_host(d, CTPU_F32, 9, big9), CTPU_ERR_SHAPE, "from_host");
    EXPECT_NULL(ctpu_from_host(d, CTPU_F32, -1, ok), CTPU_ERR_SHAPE, "from_host");
    EXPECT_NULL(ctpu_from_host(d, (ctpu_dtype)9, 2, ok), CTPU_ERR_DTYPE, "from_host");
    EXPECT_NULL(ctpu_from_host(NULL, CTPU_F32, 2, ok), CTPU_ERR_INVALID_ARG, "from_host");
    EXPECT_NULL(ctpu_from_host(d, CTPU_F32, 2, NULL), CTPU_ERR_INVALID_ARG, "from_host");
    int64_t zero = 0;
    ck_assert(!ctpu_is_null(ctpu_from_host(NULL, CTPU_F32, 1, &zero)));   /* 0 bytes: NULL is fine */
    EXPECT_NULL(ctpu_zeros(CTPU_F32, 2, huge), CTPU_ERR_SHAPE, "zeros");
    EXPECT_NULL(ctpu_ones(CTPU_BF16, 2, neg), CTPU_ERR_SHAPE, "ones");
    EXPECT_NULL(ctpu_full(CTPU_I32, 9, big9, 1), CTPU_ERR_SHAPE, "full");
    EXPECT_NULL(ctpu_full((ctpu_dtype)-1, 2, ok, 1), CTPU_ERR_DTYPE, "full");
    EXPECT_NULL(ctpu_zeros(CTPU_F32, 2, NULL), CTPU_ERR_INVALID_ARG, "zeros");
    /* a shape that fits 2^56 elements but not the HBM */
    int64_t big[2] = { (int64_t)1 << 26, (int64_t)1 << 26 };
    EXPECT_NULL(ctpu_zeros(CTPU_F32, 2, big), CTPU_ERR_OOM, "zeros: output");   /* the user's call, not full */
    EXPECT_NULL(ctpu_ones(CTPU_F32, 2, big), CTPU_ERR_OOM, "ones: output");
    EXPECT_NULL(ctpu_arange(0, 1, 0, CTPU_F32), CTPU_ERR_INVALID_ARG, "arange");
    EXPECT_NULL(ctpu_arange(0, NAN, 1, CTPU_F32), CTPU_ERR_INVALID_ARG, "arange");
    EXPECT_NULL(ctpu_arange(0, INFINITY, 1, CTPU_F32), CTPU_ERR_INVALID_ARG, "arange");
    EXPECT_NULL(ctpu_arange(0, 1e30, 1e-30, CTPU_F32), CTPU_ERR_SHAPE, "arange");
    EXPECT_NULL(ctpu_arange(0, 4, 1, (ctpu_dtype)5), CTPU_ERR_DTYPE, "arange");
    EXPECT_NULL(ctpu_rand_uniform(CTPU_I32, 2, ok, 0, 1), CTPU_ERR_DTYPE, "rand_uniform");
    EXPECT_NULL(ctpu_rand_uniform(CTPU_F32, 2, huge, 0, 1), CTPU_ERR_SHAPE, "rand_uniform");
    EXPECT_NULL(ctpu_rand_uniform(CTPU_F32, 2, ok, NAN, 1), CTPU_ERR_INVALID_ARG, "rand_uniform");
    EXPECT_NULL(ctpu_rand_uniform(CTPU_F32, 2, ok, 1, 0), CTPU_ERR_INVALID_ARG, "lo=1 > hi=0");
    EXPECT_NULL(ctpu_rand_normal(CTPU_F32, 2, ok, 0, -1), CTPU_ERR_INVALID_ARG, "rand_normal");
    EXPECT_NULL(ctpu_rand_normal(CTPU_F32, 2, NULL, 0, 1), CTPU_ERR_INVALID_ARG, "rand_normal");
    EXPECT_NULL(ctpu_rand_normal((ctpu_dtype)3, 2, ok, 0, 1), CTPU_ERR_DTYPE, "rand_normal");
    /* a failed random draw does not advance the generator */
    uint64_t s0, o0, s1, o1;
    ck_assert_int_eq(ctpu_rng_get_state(&s0, &o0), CTPU_OK);
    ctpu_rand_uniform(CTPU_F32, 2, neg, 0, 1);
    ck_assert_int_eq(ctpu_rng_get_state(&s1, &o1), CTPU_OK);
    ck_assert_uint_eq(o0, o1);
}
END_TEST

/* ------------------------------------------------------------ host transfers */
START_TEST(transfer_bad_args)
{
    ctpu_tensor a = mk('f');
    float buf[6];
    double v;
    int64_t sh[8];
    int nd;
    EXPECT_ERR(ctpu_to_host(a, NULL, 24), CTPU_ERR_INVALID_ARG, "to_host");
    EXPECT_ERR(ctpu_to_host(a, buf, 23), CTPU_ERR_INVALID_ARG, "to_host");
    EXPECT_ERR(ctpu_item(a, &v), CTPU_ERR_SHAPE, "item");
    EXPECT_ERR(ctpu_item(ctpu_slice(a, 1, 0, 1, 1), NULL), CTPU_ERR_INVALID_ARG, "item");
    EXPECT_ERR(ctpu_shape(a, NULL, &nd), CTPU_ERR_INVALID_ARG, "shape");
    EXPECT_ERR(ctpu_shape(a, sh, NULL), CTPU_ERR_INVALID_ARG, "shape");
    ck_assert_int_eq(ctpu_dim(a, 2), -1);
    EXPECT_ERR(ctpu_last_status(), CTPU_ERR_SHAPE, "dim");
    ck_assert_int_eq(ctpu_dim(a, -3), -1);
    EXPECT_ERR(ctpu_last_status(), CTPU_ERR_SHAPE, "dim");
    ck_assert_int_eq(ctpu_dim(a, -1), 3);
    EXPECT_ERR(ctpu_assign(a, mk('m')), CTPU_ERR_SHAPE, "assign");
    EXPECT_ERR(ctpu_assign(a, mk('i')), CTPU_ERR_DTYPE, "assign");
    int64_t zero = 0;
    ck_assert_int_eq(ctpu_to_host(ctpu_zeros(CTPU_F32, 1, &zero), NULL, 0), CTPU_OK);
}
END_TEST

/* ------------------------------------------------------------ ops */
START_TEST(ops_bad_dtypes_and_shapes)
{
    ctpu_tensor a = mk('f'), m = mk('m'), i = mk('i');
    ctpu_tensor v3 = T_VEC(1, 2, 3), v2 = T_VEC(1, 2);
    EXPECT_NULL(ctpu_add(v3, v2), CTPU_ERR_SHAPE, "add");
    EXPECT_NULL(ctpu_mul(a, m), CTPU_ERR_SHAPE, "mul");
    EXPECT_NULL(ctpu_lt(a, v2), CTPU_ERR_SHAPE, "lt");
    EXPECT_NULL(ctpu_where(v2, a, a), CTPU_ERR_SHAPE, "where");
    EXPECT_NULL(ctpu_where(a, a, m), CTPU_ERR_SHAPE, "where");
    EXPECT_NULL(ctpu_cast(a, (ctpu_dtype)7), CTPU_ERR_DTYPE, "cast");
    EXPECT_NULL(ctpu_cast(a, (ctpu_dtype)-1), CTPU_ERR_DTYPE, "cast");
    /* matmul: the message names both shapes */
    ctpu_tensor b = ctpu_zeros(CTPU_F32, 2, (int64_t[]){ 99, 10 });
    ctpu_tensor x = ctpu_zeros(CTPU_F32, 2, (int64_t[]){ 64, 100 });
    ctpu_clear_error();
    ck_assert(ctpu_is_null(ctpu_matmul(x, b)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
    ck_assert_msg(t_contains(ctpu_last_error(), "f32[64,100]") && t_contains(ctpu_last_error(), "f32[99,10]") &&
                      t_contains(ctpu_last_error(), "inner dims differ"),
                  "%s", ctpu_last_error());
    EXPECT_NULL(ctpu_matmul(a, a), CTPU_ERR_SHAPE, "matmul");
    EXPECT_NULL(ctpu_matmul(a, i), CTPU_ERR_DTYPE, "matmul");
    float one = 1;
    ctpu_tensor sc = ctpu_from_host(&one, CTPU_F32, 0, NULL);
    EXPECT_NULL(ctpu_matmul(sc, a), CTPU_ERR_SHAPE, "matmul");
    EXPECT_NULL(ctpu_matmul(ctpu_zeros(CTPU_F32, 3, (int64_t[]){ 2, 2, 3 }), ctpu_zeros(CTPU_F32, 3, (int64_t[]){ 3, 3, 2 })),
                CTPU_ERR_SHAPE, "matmul");
    EXPECT_NULL(ctpu_matmul_t(v3, a, true, false), CTPU_ERR_SHAPE, "matmul");
    EXPECT_NULL(ctpu_matmul_t(a, a, false, false), CTPU_ERR_SHAPE, "matmul");
    /* embedding / gather */
    EXPECT_NULL(ctpu_embedding(a, a), CTPU_ERR_DTYPE, "embedding");
    EXPECT_NULL(ctpu_embedding(i, i), CTPU_ERR_DTYPE, "embedding");
    EXPECT_NULL(ctpu_embedding(v3, i), CTPU_ERR_SHAPE, "embedding");
    EXPECT_NULL(ctpu_gather(a, 1, a), CTPU_ERR_DTYPE, "gather");
    EXPECT_NULL(ctpu_gather(a, 1, ctpu_reshape(i, 1, (int64_t[]){ 6 })), CTPU_ERR_SHAPE, "gather");
    EXPECT_NULL(ctpu_gather(a, 2, i), CTPU_ERR_SHAPE, "gather");
    EXPECT_NULL(ctpu_gather(v2, 0, ctpu_zeros(CTPU_I32, 2, (int64_t[]){ 1, 1 })), CTPU_ERR_SHAPE, "gather");
    /* concat */
    EXPECT_NULL(ctpu_concat(2, (ctpu_tensor[]){ a, m }, 0), CTPU_ERR_SHAPE, "concat");
    EXPECT_NULL(ctpu_concat(2, (ctpu_tensor[]){ a, ctpu_cast(a, CTPU_BF16) }, 0), CTPU_ERR_DTYPE, "concat");
    EXPECT_NULL(ctpu_concat(2, (ctpu_tensor[]){ a, a }, 2), CTPU_ERR_SHAPE, "concat");
    EXPECT_NULL(ctpu_concat(0, (ctpu_tensor[]){ a }, 0), CTPU_ERR_INVALID_ARG, "concat");
    EXPECT_NULL(ctpu_concat(-3, (ctpu_tensor[]){ a }, 0), CTPU_ERR_INVALID_ARG, "concat");
    /* a null input is named by its index (the message said "ts[i]") */
    EXPECT_NULL(ctpu_concat(3, (ctpu_tensor[]){ a, a, CTPU_NULL }, 0), CTPU_ERR_NULL_HANDLE, "concat: ts[2] is a null handle");
    EXPECT_NULL(ctpu_concat(2, NULL, 0), CTPU_ERR_INVALID_ARG, "concat");
    EXPECT_NULL(ctpu_concat(1, &sc, 0), CTPU_ERR_SHAPE, "concat");
    ctpu_tensor many[20];
    for (int k = 0; k < 20; k++) many[k] = a;
    many[18] = m;
    EXPECT_NULL(ctpu_concat(20, many, 0), CTPU_ERR_SHAPE, "concat");
    /* autograd */
    EXPECT_ERR(ctpu_set_requires_grad(i, true), CTPU_ERR_DTYPE, "requires_grad");
    EXPECT_ERR(ctpu_backward(a), CTPU_ERR_STATE, "backward");
    EXPECT_ERR(ctpu_no_grad_end(), CTPU_ERR_STATE, "no_grad");
    ck_assert_int_eq(ctpu_set_requires_grad(a, true), CTPU_OK);
    ctpu_tensor l = ctpu_mul_scalar(a, 2);
    EXPECT_ERR(ctpu_backward(l), CTPU_ERR_SHAPE, "backward");
    EXPECT_ERR(ctpu_backward_with(l, v3), CTPU_ERR_SHAPE, "backward");
}
END_TEST

START_TEST(ops_bad_dims)
{
    ctpu_tensor a = mk('f');
    EXPECT_NULL(ctpu_sum(a, 1, (int[]){ 2 }, false), CTPU_ERR_SHAPE, "sum");
    EXPECT_NULL(ctpu_sum(a, 1, (int[]){ -3 }, false), CTPU_ERR_SHAPE, "sum");
    EXPECT_NULL(ctpu_mean(a, 2, (int[]){ 1, -1 }, false), CTPU_ERR_SHAPE, "mean");
    EXPECT_NULL(ctpu_max(a, 1, NULL, false), CTPU_ERR_INVALID_ARG, "max");
    EXPECT_NULL(ctpu_min(a, -1, (int[]){ 0 }, false), CTPU_ERR_INVALID_ARG, "min");
    EXPECT_NULL(ctpu_var(a, 9, (int[]){ 0, 1, 0, 1, 0, 1, 0, 1, 0 }, 1, false), CTPU_ERR_INVALID_ARG, "var");
    EXPECT_NULL(ctpu_var(a, 0, NULL, -1, false), CTPU_ERR_INVALID_ARG, "var");
    EXPECT_NULL(ctpu_max(ctpu_zeros(CTPU_F32, 2, (int64_t[]){ 2, 0 }), 1, (int[]){ 1 }, false), CTPU_ERR_SHAPE, "max");
    /* the error names the zero-size dim */
    ck_assert(ctpu_is_null(ctpu_max(ctpu_zeros(CTPU_F32, 2, (int64_t[]){ 2, 0 }), 1, (int[]){ 1 }, false)));
    ck_assert_msg(strstr(ctpu_last_error(), "cannot reduce over dim 1, of size 0"), "%s", ctpu_last_error());
    ck_assert(ctpu_is_null(ctpu_min(ctpu_zeros(CTPU_F32, 2, (int64_t[]){ 0, 3 }), 1, (int[]){ 0 }, false)));
    ck_assert_msg(strstr(ctpu_last_error(), "over dim 0, of size 0 (min has no identity)"), "%s", ctpu_last_error());
    ctpu_clear_error();
    EXPECT_NULL(ctpu_argmax(a, 2, false), CTPU_ERR_SHAPE, "argmax");
    EXPECT_NULL(ctpu_argmax(a, -3, false), CTPU_ERR_SHAPE, "argmax");
    EXPECT_NULL(ctpu_argmax(ctpu_zeros(CTPU_F32, 2, (int64_t[]){ 2, 0 }), 1, false), CTPU_ERR_SHAPE, "argmax");
    /* the 65th nested scope names the likely cause */
    for (int i = 0; i < 64; i++) ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_ERR_STATE);
    ck_assert_msg(strstr(ctpu_last_error(), "scopes nest at most 64 deep; likely cause: a missing ctpu_scope_end"), "%s",
                  ctpu_last_error());
    for (int i = 0; i < 64; i++) ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    EXPECT_NULL(ctpu_softmax(a, 2), CTPU_ERR_SHAPE, "softmax");
    EXPECT_NULL(ctpu_log_softmax(a, -4), CTPU_ERR_SHAPE, "log_softmax");
    EXPECT_NULL(ctpu_transpose(a, 0, 7), CTPU_ERR_SHAPE, "transpose");
    EXPECT_NULL(ctpu_permute(a, (int[]){ 0, 0 }), CTPU_ERR_SHAPE, "permute");
    EXPECT_NULL(ctpu_permute(a, (int[]){ 0, 2 }), CTPU_ERR_SHAPE, "permute");
    EXPECT_NULL(ctpu_permute(a, NULL), CTPU_ERR_INVALID_ARG, "permute");
    EXPECT_NULL(ctpu_slice(a, 2, 0, 1, 1), CTPU_ERR_SHAPE, "slice");
    EXPECT_NULL(ctpu_slice(a, 0, 0, 1, 0), CTPU_ERR_INVALID_ARG, "slice");
    EXPECT_NULL(ctpu_slice(a, 0, 0, 1, -1), CTPU_ERR_INVALID_ARG, "slice");
    float one = 1;
    EXPECT_NULL(ctpu_slice(ctpu_from_host(&one, CTPU_F32, 0, NULL), 0, 0, 1, 1), CTPU_ERR_SHAPE, "slice");
    /* reshape */
    EXPECT_NULL(ctpu_reshape(a, 1, (int64_t[]){ 7 }), CTPU_ERR_SHAPE, "reshape");
    EXPECT_NULL(ctpu_reshape(a, 2, (int64_t[]){ -1, -1 }), CTPU_ERR_SHAPE, "reshape");
    EXPECT_NULL(ctpu_reshape(a, 2, (int64_t[]){ -2, -3 }), CTPU_ERR_SHAPE, "reshape");
    EXPECT_NULL(ctpu_reshape(a, 2, (int64_t[]){ -1, 4 }), CTPU_ERR_SHAPE, "reshape");
    EXPECT_NULL(ctpu_reshape(a, 2, (int64_t[]){ (int64_t)1 << 40, (int64_t)1 << 40 }), CTPU_ERR_SHAPE, "reshape");
    EXPECT_NULL(ctpu_reshape(a, 9, (int64_t[]){ 6, 1, 1, 1, 1, 1, 1, 1, 1 }), CTPU_ERR_SHAPE, "reshape");
    EXPECT_NULL(ctpu_reshape(a, 2, NULL), CTPU_ERR_INVALID_ARG, "reshape");   /* a NULL pointer, as zeros(.., NULL) */
    EXPECT_NULL(ctpu_reshape(ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 0 }), 2, (int64_t[]){ -1, 0 }), CTPU_ERR_SHAPE, "reshape");
    /* expand: incompatible, negative, too many dims, overflowing */
    EXPECT_NULL(ctpu_expand(a, 2, (int64_t[]){ 4, 3 }), CTPU_ERR_SHAPE, "expand");
    EXPECT_NULL(ctpu_expand(a, 1, (int64_t[]){ 3 }), CTPU_ERR_SHAPE, "expand");
    EXPECT_NULL(ctpu_expand(a, 3, (int64_t[]){ -1, 2, 3 }), CTPU_ERR_SHAPE, "expand");
    EXPECT_NULL(ctpu_expand(a, 3, (int64_t[]){ -5, 2, 3 }), CTPU_ERR_SHAPE, "expand");
    EXPECT_NULL(ctpu_expand(a, 9, (int64_t[]){ 1, 1, 1, 1, 1, 1, 1, 2, 3 }), CTPU_ERR_SHAPE, "expand");
    EXPECT_NULL(ctpu_expand(a, 3, NULL), CTPU_ERR_INVALID_ARG, "expand");
    ctpu_tensor s1 = ctpu_reshape(T_VEC(1), 2, (int64_t[]){ 1, 1 });
    EXPECT_NULL(ctpu_expand(s1, 2, (int64_t[]){ (int64_t)1 << 40, (int64_t)1 << 40 }), CTPU_ERR_SHAPE, "expand");
    EXPECT_NULL(ctpu_expand(s1, 4, (int64_t[]){ (int64_t)1 << 62, (int64_t)1 << 62, 4, 4 }), CTPU_ERR_SHAPE, "expand");
    EXPECT_NULL(ctpu_expand(s1, 2, (int64_t[]){ (int64_t)1 << 28, (int64_t)1 << 28 }), CTPU_ERR_OOM, "expand");
}
END_TEST

/* ------------------------------------------------------------ runtime API */
START_TEST(runtime_bad_args)
{
    EXPECT_ERR(ctpu_set_mode((ctpu_mode)5), CTPU_ERR_INVALID_ARG, "set_mode");
    EXPECT_ERR(ctpu_set_mode((ctpu_mode)-2), CTPU_ERR_INVALID_ARG, "set_mode");
    EXPECT_ERR(ctpu_set_thread_mode((ctpu_mode)9), CTPU_ERR_INVALID_ARG, "set_thread_mode");
    EXPECT_ERR(ctpu_set_matmul_precision((ctpu_precision)3), CTPU_ERR_INVALID_ARG, "set_matmul_precision");
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_STRICT);
    ck_assert_int_eq(ctpu_get_matmul_precision(), CTPU_PRECISION_DEFAULT);
    EXPECT_ERR(ctpu_hbm_get_stats(NULL), CTPU_ERR_INVALID_ARG, "hbm_get_stats");
    uint64_t x;
    EXPECT_ERR(ctpu_rng_get_state(NULL, &x), CTPU_ERR_INVALID_ARG, "rng_get_state");
    EXPECT_ERR(ctpu_rng_get_state(&x, NULL), CTPU_ERR_INVALID_ARG, "rng_get_state");
    EXPECT_ERR(ctpu_cache_get_info(NULL), CTPU_ERR_INVALID_ARG, "cache");
    EXPECT_ERR(ctpu_scope_end(), CTPU_ERR_STATE, "scope_end");
    EXPECT_ERR(ctpu_step_end(), CTPU_ERR_STATE, "step_end");
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    EXPECT_ERR(ctpu_step_end(), CTPU_ERR_STATE, "step_end");
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    ck_assert_ptr_null(ctpu_chip_lookup(NULL));
    ck_assert_ptr_null(ctpu_chip_lookup("v9"));
    ck_assert_str_eq(ctpu_status_str((ctpu_status)99), "unknown status");
    ck_assert_str_eq(ctpu_status_str((ctpu_status)-1), "unknown status");
    for (int s = 0; s < CTPU_STATUS_COUNT; s++) ck_assert(strlen(ctpu_status_str((ctpu_status)s)) > 0);
    ck_assert_str_eq(ctpu_mode_name((ctpu_mode)9), "?");
    ck_assert_str_eq(ctpu_dtype_name((ctpu_dtype)9), "?");
    ck_assert_int_eq(ctpu_metric_counter(NULL), 0);
    ck_assert_int_eq(ctpu_metric_counter("no_such_counter"), 0);
    char buf[8];
    ck_assert_int_ge(ctpu_cache_recompile_log(buf, sizeof buf), 0);
    ck_assert_int_ge(ctpu_cache_recompile_log(NULL, 0), 0);
    ck_assert_int_eq(ctpu_report_error(CTPU_ERR_IO, "x: %d", 5), CTPU_ERR_IO);
    ck_assert_str_eq(ctpu_last_error(), "x: 5");
    ctpu_clear_error();
    ck_assert_str_eq(ctpu_last_error(), "");
    ck_assert_int_eq(ctpu_last_status(), CTPU_OK);
    /* a long message is truncated to one line, never overflows */
    char big[2000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    ctpu_report_error(CTPU_ERR_IO, "%s", big);
    ck_assert_uint_lt(strlen(ctpu_last_error()), sizeof big);
    good_op();
}
END_TEST

/* ------------------------------------------------------------ no leaks */
START_TEST(bad_calls_leak_nothing)
{
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ctpu_hbm_stats base, now;
    ck_assert_int_eq(ctpu_hbm_get_stats(&base), CTPU_OK);
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    ctpu_tensor a = mk('f'), m = mk('m');
    for (int k = 0; k < 50; k++) {
        ctpu_add(a, m);
        ctpu_matmul(a, a);
        ctpu_concat(2, (ctpu_tensor[]){ a, m }, 0);
        ctpu_zeros(CTPU_F32, 2, (int64_t[]){ (int64_t)1 << 26, (int64_t)1 << 26 });
        ctpu_reshape(a, 1, (int64_t[]){ 5 });
    }
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ck_assert_int_eq(ctpu_hbm_get_stats(&now), CTPU_OK);
    ck_assert_uint_eq(now.in_use, base.in_use);
}
END_TEST

/* Device faults (issue 20): a composite's fault names the user's call and
 * the user's positions, counts read "1 bad index" / "2 bad indices", and
 * the tensors' names (ctpu_set_name) are in the message: the inputs' when
 * debug eager reports it at the call, the one read when it is read. */
START_TEST(fault_messages_name_the_call_and_tensors)
{
    for (int mode = 0; mode < CTPU_MODE_COUNT; mode++) {
        ck_assert_int_eq(ctpu_set_mode((ctpu_mode)mode), CTPU_OK);
        float w[12] = { 0 };
        int64_t ws[2] = { 4, 3 }, n3 = 3, n2 = 2;
        ctpu_tensor a = ctpu_from_host(w, CTPU_F32, 2, ws);
        int32_t ix[3] = { 0, 5, 7 };
        ctpu_tensor idx = ctpu_from_host(ix, CTPU_I32, 1, &n3);
        /* index_select along dim 1 of [4,3]: positions 1 and 2 of the user's index [3] */
        ctpu_tensor r = ctpu_index_select(a, 1, idx);
        float out[12];
        if (!ctpu_is_null(r)) {
            ck_assert_int_eq(ctpu_set_name(r, "picked"), CTPU_OK);
            ck_assert_int_eq(ctpu_to_host(r, out, sizeof out), CTPU_ERR_DEVICE_FAULT);
        }
        const char *m = ctpu_last_error();
        ck_assert_msg(strncmp(m, "index_select", 12) == 0 &&
                      t_contains(m, "index 5 at position 1 is out of range [0, 3) along dim 1 (2 bad indices)"),
                      "mode %d: %s", mode, m);
        if (mode != CTPU_MODE_DEBUG) ck_assert_msg(t_contains(m, "(t is picked)"), "mode %d: %s", mode, m);
        ctpu_clear_error();
        ctpu_sync();
        ctpu_clear_error();
        /* one bad index: singular; the inputs' names where the call reports it */
        ck_assert_int_eq(ctpu_set_name(a, "wte"), CTPU_OK);
        int32_t tk[2] = { 1, 9 };
        ctpu_tensor tok = ctpu_from_host(tk, CTPU_I32, 1, &n2);
        ck_assert_int_eq(ctpu_set_name(tok, "tokens"), CTPU_OK);
        ctpu_tensor e = ctpu_embedding(a, tok);
        float eo[6];
        if (!ctpu_is_null(e)) ck_assert_int_eq(ctpu_to_host(e, eo, sizeof eo), CTPU_ERR_DEVICE_FAULT);
        m = ctpu_last_error();
        ck_assert_msg(strncmp(m, "embedding", 9) == 0 &&
                      t_contains(m, "index 9 at position 1 is out of range [0, 4) for weight f32[4,3] (1 bad index)"),
                      "mode %d: %s", mode, m);
        if (mode == CTPU_MODE_DEBUG)
            ck_assert_msg(t_contains(m, "(weight is wte, indices is tokens)"), "mode %d: %s", mode, m);
        ctpu_clear_error();
        ctpu_sync();
        ctpu_clear_error();
        ctpu_release(a);
        ctpu_release(idx);
        ctpu_release(tok);
        ctpu_release(r);
        ctpu_release(e);
    }
}
END_TEST

/* A composite's failures name it, and dtypes by name (a new user's
 * report): eye out of HBM named its inner eq, eye and linspace printed dt
 * as a number, the [B,T,H,Dh] attention's errors named the [B,H,T,Dh] op. */
START_TEST(composites_name_themselves)
{
    ctpu_tensor t = ctpu_eye(1 << 17, 1 << 17, CTPU_F32);   /* 64 GiB: past the chip's HBM */
    ck_assert(ctpu_is_null(t));
    ck_assert_msg(strncmp(ctpu_last_error(), "eye: ", 5) == 0, "%s", ctpu_last_error());
    t = ctpu_eye(2, 2, (ctpu_dtype)7);
    ck_assert(ctpu_is_null(t));
    ck_assert_msg(t_contains(ctpu_last_error(), "dt=7 (not a ctpu_dtype)"), "%s", ctpu_last_error());
    t = ctpu_linspace(0, 1, 5, CTPU_I32);
    ck_assert(ctpu_is_null(t));
    ck_assert_msg(t_contains(ctpu_last_error(), "linspace: dt=i32: f32 or bf16"), "%s", ctpu_last_error());
    int64_t s4[4] = { 1, 4, 2, 8 }, s3[3] = { 1, 4, 16 };
    ctpu_tensor q = ctpu_zeros(CTPU_F32, 4, s4), k = ctpu_zeros(CTPU_F32, 3, s3);
    t = ctpu_scaled_dot_product_attention_bthd(q, k, q, CTPU_NULL, CTPU_MASK_NONE, false, 0, 0);
    ck_assert(ctpu_is_null(t));
    ck_assert_msg(strncmp(ctpu_last_error(), "scaled_dot_product_attention_bthd: ", 35) == 0, "%s", ctpu_last_error());
    t = ctpu_scaled_dot_product_attention(q, k, q, CTPU_NULL, CTPU_MASK_NONE, false, 0, 0);
    ck_assert_msg(strncmp(ctpu_last_error(), "scaled_dot_product_attention: ", 30) == 0, "%s", ctpu_last_error());
    ctpu_tensor ok = ctpu_eye(3, 2, CTPU_BF16);   /* the runtime is still usable */
    ck_assert(!ctpu_is_null(ok));
    ck_assert_int_eq(ctpu_dtype_of(ok), CTPU_BF16);
    ctpu_release(q);
    ctpu_release(k);
    ctpu_release(ok);
}
END_TEST

/* The reductions' host temporaries (a bf16 input's f32 copy, a
 * non-contiguous reduced dim's gather, var's mean) out of host memory: the
 * step's fault CTPU_ERR_OOM naming the op, not a NULL write (they were not
 * checked). This binary run again as a child (CTPU_TEST_RED_OOM=case: a
 * fresh runtime; a fork would have no device thread) under an address-space
 * limit 64 MiB above its size once the 128 MiB input exists (not under
 * AddressSanitizer, whose malloc aborts). Exit 0: the fault; 5: enough memory
 * after all (nothing to check); else a failure. */
static int red_oom_child(int which)
{
    if (ctpu_init() != CTPU_OK) return 3;
    int64_t sh[2] = { 8192, 8192 };   /* 64M elements: bf16 128 MiB, an f32 temporary 256 MiB */
    ctpu_tensor x = ctpu_full(CTPU_BF16, 2, sh, 1.0);
    if (ctpu_sync() != CTPU_OK) return 3;
    long pages = 0;
    FILE *sm = fopen("/proc/self/statm", "r");
    if (!sm || fscanf(sm, "%ld", &pages) != 1) return 3;
    fclose(sm);
    struct rlimit rl = { (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (64u << 20), RLIM_INFINITY };
    rl.rlim_max = rl.rlim_cur;
    if (setrlimit(RLIMIT_AS, &rl) != 0) return 4;
    int dims[1] = { which == 1 ? 0 : 1 };
    ctpu_tensor y = which == 2 ? ctpu_var(x, 1, dims, 1, false) : ctpu_sum(x, 1, dims, false);
    float v = 0;
    ctpu_status st = ctpu_is_null(y) ? ctpu_last_status() : ctpu_to_host(ctpu_slice(y, 0, 0, 1, 1), &v, 4);
    int rc = st == CTPU_ERR_OOM && t_contains(ctpu_last_error(), "out of host memory") ? 0 : st == CTPU_OK ? 5 : 6;
    if (rc == 6) fprintf(stderr, "red_oom_child %d: status %d: %s\n", which, (int)st, ctpu_last_error());
    _exit(rc);   /* (no shutdown: the limit stays) */
}

START_TEST(reduction_temporaries_out_of_host_memory)
{
#ifndef __SANITIZE_ADDRESS__
    for (int which = 0; which < 3; which++) {
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            char w[2] = { (char)('0' + which), 0 };
            setenv("CTPU_TEST_RED_OOM", w, 1);
            execl("/proc/self/exe", "test_badinput", (char *)NULL);
            _exit(7);
        }
        int status = 0;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 5), "case %d: %s %d",
                      which, WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    }
#endif
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("badinput");
    TCase *t = tcase_create("badinput");
    tcase_add_checked_fixture(t, t_setup, t_teardown);
    tcase_set_timeout(t, 120);
    tcase_add_loop_test(t, op_good_inputs_work, 0, N_OPS);
    tcase_add_loop_test(t, op_null_handle_keeps_message, 0, N_OPS);
    tcase_add_loop_test(t, op_stale_handles, 0, N_OPS);
    tcase_add_test(t, handle_functions);
    tcase_add_test(t, creation_bad_sizes);
    tcase_add_test(t, transfer_bad_args);
    tcase_add_test(t, ops_bad_dtypes_and_shapes);
    tcase_add_test(t, ops_bad_dims);
    tcase_add_test(t, runtime_bad_args);
    tcase_add_test(t, bad_calls_leak_nothing);
    tcase_add_test(t, fault_messages_name_the_call_and_tensors);
    tcase_add_test(t, composites_name_themselves);
    tcase_add_test(t, reduction_temporaries_out_of_host_memory);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    if (getenv("CTPU_TEST_RED_OOM")) return red_oom_child(atoi(getenv("CTPU_TEST_RED_OOM")));
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
