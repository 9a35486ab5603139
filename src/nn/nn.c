/* nn: initialisers, layers and losses on the public API (include/ctpu.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ctpu_nn.h"
#include "nn_internal.h"

/* ------------------------------------------------------------ helpers */
ctpu_tensor ctpu__nn_global(ctpu_tensor t)
{
    /* ctpu_keep moves a handle one scope out (global from the outermost);
     * scopes nest at most 64 deep */
    for (int i = 0; i < 64 && !ctpu_is_null(t); i++) ctpu_keep(t);
    return t;
}

bool ctpu__nn_ready(const char *op)
{
    if (ctpu_is_initialized()) return true;
    ctpu_report_error(CTPU_ERR_NOT_INITIALIZED, "%s: the runtime is not initialised (call ctpu_init; after ctpu_shutdown, "
                      "again)", op);
    return false;
}

ctpu_status ctpu__nn_blame(const char *op, const char *what)
{
    ctpu_status st = ctpu_last_status();
    if (st == CTPU_OK) return st;
    const char *msg = ctpu_last_error();
    size_t n = strlen(op);
    if (strncmp(msg, op, n) == 0 && (msg[n] == ':' || msg[n] == ' ')) return st;   /* "op: ", "op (op #5): " */
    char inner[512];
    snprintf(inner, sizeof inner, "%s", msg);
    return ctpu_report_error(st, "%s: %s%s%s", op, what ? what : "", what ? ": " : "", inner);
}

const char *ctpu__nn_why(ctpu_tensor t, ctpu_status *st, char *buf, size_t len)
{
    /* ctpu_ndim's message is "ndim: t is <why>" */
    ctpu_ndim(t);
    *st = ctpu_last_status();
    const char *m = ctpu_last_error();
    snprintf(buf, len, "%s", strncmp(m, "ndim: t is ", 11) == 0 ? m + 11 : m);
    return buf;
}

bool ctpu__nn_arg(const char *op, const char *arg, ctpu_tensor t)
{
    if (ctpu_is_valid(t)) return true;
    char why[256];
    ctpu_status st;
    ctpu__nn_why(t, &st, why, sizeof why);
    ctpu_report_error(st == CTPU_OK ? CTPU_ERR_STALE_HANDLE : st, "%s: %s is %s", op, arg, why);
    return false;
}

const char *ctpu__nn_fmt(ctpu_tensor t, char *buf, size_t len)
{
    int64_t s[CTPU_MAX_DIMS];
    int nd;
    if (ctpu_shape(t, s, &nd) != CTPU_OK) { snprintf(buf, len, "(bad handle)"); return buf; }
    size_t k = (size_t)snprintf(buf, len, "%s[", ctpu_dtype_name(ctpu_dtype_of(t)));
    for (int d = 0; d < nd && k < len; d++) k += (size_t)snprintf(buf + k, len - k, d ? ",%lld" : "%lld", (long long)s[d]);
    if (k < len) snprintf(buf + k, len - k, "]");
    return buf;
}

static void release_all(int n, ctpu_tensor *ts)
{
    for (int i = 0; i < n; i++)
        if (ctpu_is_valid(ts[i])) ctpu_release(ts[i]);
}

/* ------------------------------------------------------------ initialisers */
static bool fans(const char *op, ctpu_dtype dt, int ndim, const int64_t *shape, double *fan_in, double *fan_out)
{
    if (dt != CTPU_F32 && dt != CTPU_BF16) {
        ctpu_report_error(CTPU_ERR_DTYPE, "%s: dtype %s: initialisers make f32 or bf16 tensors", op,
                          ctpu_dtype_name(dt));
        return false;
    }
    if (ndim < 2 || ndim > CTPU_MAX_DIMS || !shape) {
        ctpu_report_error(CTPU_ERR_SHAPE, "%s: ndim=%d: a fan needs a weight of at least 2 dims [out, in, ...]", op, ndim);
        return false;
    }
    double rf = 1;
    for (int d = 2; d < ndim; d++) rf *= (double)shape[d];
    *fan_in = (double)shape[1] * rf;
    *fan_out = (double)shape[0] * rf;
    if (*fan_in <= 0 || *fan_out <= 0) {
        ctpu_report_error(CTPU_ERR_SHAPE, "%s: shape [%lld, %lld, ...] has a zero fan", op, (long long)shape[0],
                          (long long)shape[1]);
        return false;
    }
    return true;
}

static ctpu_tensor kaiming(const char *op, bool normal, ctpu_dtype dt, int ndim, const int64_t *shape, double a,
                           ctpu_fan_mode mode)
{
    double fi, fo;
    if (!ctpu__nn_ready(op)) return ctpu_error_handle();
    if (!isfinite(a) || (mode != CTPU_FAN_IN && mode != CTPU_FAN_OUT)) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: a=%g, mode=%d are invalid", op, a, (int)mode);
        return ctpu_error_handle();
    }
    if (!fans(op, dt, ndim, shape, &fi, &fo)) return ctpu_error_handle();
    double fan = mode == CTPU_FAN_IN ? fi : fo;
    double gain = sqrt(2.0 / (1.0 + a * a));
    double b = gain * sqrt(3.0 / fan);
    ctpu_tensor t = normal ? ctpu_rand_normal(dt, ndim, shape, 0.0, gain / sqrt(fan))
                           : ctpu_rand_uniform(dt, ndim, shape, -b, b);
    if (ctpu_is_null(t)) { ctpu__nn_blame(op, NULL); t = ctpu_error_handle(); }
    return t;
}

ctpu_tensor ctpu_init_kaiming_uniform(ctpu_dtype dt, int ndim, const int64_t *shape, double a, ctpu_fan_mode mode)
{
    return kaiming("init_kaiming_uniform", false, dt, ndim, shape, a, mode);
}

ctpu_tensor ctpu_init_kaiming_normal(ctpu_dtype dt, int ndim, const int64_t *shape, double a, ctpu_fan_mode mode)
{
    return kaiming("init_kaiming_normal", true, dt, ndim, shape, a, mode);
}

static ctpu_tensor xavier(const char *op, bool normal, ctpu_dtype dt, int ndim, const int64_t *shape, double gain)
{
    double fi, fo;
    if (!ctpu__nn_ready(op)) return ctpu_error_handle();
    if (!isfinite(gain) || gain < 0) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: gain=%g must be finite and >= 0", op, gain);
        return ctpu_error_handle();
    }
    if (!fans(op, dt, ndim, shape, &fi, &fo)) return ctpu_error_handle();
    double b = gain * sqrt(6.0 / (fi + fo));
    ctpu_tensor t = normal ? ctpu_rand_normal(dt, ndim, shape, 0.0, gain * sqrt(2.0 / (fi + fo)))
                           : ctpu_rand_uniform(dt, ndim, shape, -b, b);
    if (ctpu_is_null(t)) { ctpu__nn_blame(op, NULL); t = ctpu_error_handle(); }
    return t;
}

ctpu_tensor ctpu_init_xavier_uniform(ctpu_dtype dt, int ndim, const int64_t *shape, double gain)
{
    return xavier("init_xavier_uniform", false, dt, ndim, shape, gain);
}

ctpu_tensor ctpu_init_xavier_normal(ctpu_dtype dt, int ndim, const int64_t *shape, double gain)
{
    return xavier("init_xavier_normal", true, dt, ndim, shape, gain);
}

/* ------------------------------------------------------------ layers */
static ctpu_tensor param(ctpu_tensor t)
{
    if (ctpu_is_null(t)) return t;
    ctpu__nn_global(t);
    if (ctpu_set_requires_grad(t, true) != CTPU_OK) {
        ctpu_release(t);
        return ctpu_error_handle();
    }
    return t;
}

ctpu_status ctpu_linear_init(ctpu_linear *l, int64_t in, int64_t out, bool bias, ctpu_dtype dt)
{
    if (!ctpu__nn_ready("linear_init")) return CTPU_ERR_NOT_INITIALIZED;
    if (!l || in < 1 || out < 1)
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "linear_init: %s", !l ? "l is NULL" : "in_features and out_features must be >= 1");
    memset(l, 0, sizeof *l);
    int64_t ws[2] = { out, in };
    /* torch.nn.Linear.reset_parameters: kaiming_uniform_(a=sqrt(5)), bias U(±1/sqrt(fan_in)) */
    l->weight = param(ctpu_init_kaiming_uniform(dt, 2, ws, sqrt(5.0), CTPU_FAN_IN));
    if (ctpu_is_null(l->weight)) return ctpu__nn_blame("linear_init", "weight");
    if (bias) {
        double b = 1.0 / sqrt((double)in);
        l->bias = param(ctpu_rand_uniform(dt, 1, &out, -b, b));
        if (ctpu_is_null(l->bias)) {
            ctpu_status st = ctpu__nn_blame("linear_init", "bias");
            ctpu_release(l->weight);
            l->weight = CTPU_NULL;
            return st;
        }
    }
    l->in_features = in;
    l->out_features = out;
    return CTPU_OK;
}

ctpu_tensor ctpu_linear_forward(const ctpu_linear *l, ctpu_tensor x)
{
    if (!ctpu__nn_ready("linear")) return ctpu_error_handle();
    if (!l) { ctpu_report_error(CTPU_ERR_INVALID_ARG, "linear: l is NULL"); return ctpu_error_handle(); }
    if (ctpu__nn_is_error(x)) return ctpu__nn_pass(x);
    if (ctpu_is_null(x)) {
        ctpu_report_error(CTPU_ERR_NULL_HANDLE, "linear: x is a null handle (CTPU_NULL)");
        return ctpu_error_handle();
    }
    int nd = ctpu_ndim(x);
    if (nd < 0) return ctpu_error_handle();
    if (nd < 1 || ctpu_dim(x, -1) != l->in_features) {
        char b[128];
        ctpu_report_error(CTPU_ERR_SHAPE, "linear: x is %s: its last dim must be in_features=%lld (layer [%lld -> %lld])",
                          ctpu__nn_fmt(x, b, sizeof b), (long long)l->in_features, (long long)l->in_features,
                          (long long)l->out_features);
        return ctpu_error_handle();
    }
    ctpu_tensor y;
    if (nd == 1) {
        y = ctpu_matmul_t(l->weight, x, false, false);   /* W [out,in] @ x [in] */
    } else {
        y = ctpu_matmul_t(x, l->weight, false, true);
    }
    if (ctpu_is_null(y) || ctpu_is_null(l->bias)) return y;
    ctpu_tensor z = ctpu_add(y, l->bias);
    ctpu_release(y);
    return z;
}

void ctpu_linear_free(ctpu_linear *l)
{
    if (!l) return;
    release_all(2, (ctpu_tensor[]){ l->weight, l->bias });
    memset(l, 0, sizeof *l);
}

ctpu_status ctpu_layer_norm_layer_init(ctpu_layer_norm_layer *ln, int64_t dim, double eps, bool affine, ctpu_dtype dt)
{
    if (!ctpu__nn_ready("layer_norm_layer_init")) return CTPU_ERR_NOT_INITIALIZED;
    if (!ln || dim < 1 || !(eps >= 0) || !isfinite(eps))
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "layer_norm_layer_init: %s",
                                 !ln ? "ln is NULL" : "dim must be >= 1 and eps finite >= 0");
    memset(ln, 0, sizeof *ln);
    ln->dim = dim;
    ln->eps = eps;
    if (affine) {
        ln->weight = param(ctpu_ones(dt, 1, &dim));
        ln->bias = param(ctpu_zeros(dt, 1, &dim));
        if (ctpu_is_null(ln->weight) || ctpu_is_null(ln->bias)) {
            ctpu_status st = ctpu__nn_blame("layer_norm_layer_init", ctpu_is_null(ln->weight) ? "weight" : "bias");
            ctpu_layer_norm_layer_free(ln);
            return st;
        }
    }
    return CTPU_OK;
}

ctpu_tensor ctpu_layer_norm_layer_forward(const ctpu_layer_norm_layer *ln, ctpu_tensor x)
{
    if (!ctpu__nn_ready("layer_norm_layer")) return ctpu_error_handle();
    if (!ln) { ctpu_report_error(CTPU_ERR_INVALID_ARG, "layer_norm_layer: ln is NULL"); return ctpu_error_handle(); }
    if (ctpu__nn_is_error(x)) return ctpu__nn_pass(x);
    if (ctpu_is_null(x)) {
        ctpu_report_error(CTPU_ERR_NULL_HANDLE, "layer_norm_layer: x is a null handle (CTPU_NULL)");
        return ctpu_error_handle();
    }
    int nd = ctpu_ndim(x);
    if (nd < 0) return ctpu_error_handle();
    if (nd < 1 || ctpu_dim(x, -1) != ln->dim) {
        char b[128];
        ctpu_report_error(CTPU_ERR_SHAPE, "layer_norm_layer: x is %s: its last dim must be %lld", ctpu__nn_fmt(x, b, sizeof b),
                          (long long)ln->dim);
        return ctpu_error_handle();
    }
    return ctpu_layer_norm(x, ln->weight, ln->bias, ln->eps);
}

void ctpu_layer_norm_layer_free(ctpu_layer_norm_layer *ln)
{
    if (!ln) return;
    release_all(2, (ctpu_tensor[]){ ln->weight, ln->bias });
    memset(ln, 0, sizeof *ln);
}

ctpu_status ctpu_embedding_layer_init(ctpu_embedding_layer *e, int64_t num, int64_t dim, ctpu_dtype dt)
{
    if (!ctpu__nn_ready("embedding_layer_init")) return CTPU_ERR_NOT_INITIALIZED;
    if (!e || num < 1 || dim < 1)
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "embedding_layer_init: %s", !e ? "e is NULL" : "num and dim must be >= 1");
    memset(e, 0, sizeof *e);
    int64_t s[2] = { num, dim };
    e->weight = param(ctpu_rand_normal(dt, 2, s, 0.0, 1.0));
    if (ctpu_is_null(e->weight)) return ctpu__nn_blame("embedding_layer_init", "weight");
    e->num = num;
    e->dim = dim;
    return CTPU_OK;
}

ctpu_tensor ctpu_embedding_layer_forward(const ctpu_embedding_layer *e, ctpu_tensor indices)
{
    if (!ctpu__nn_ready("embedding_layer")) return ctpu_error_handle();
    if (!e) { ctpu_report_error(CTPU_ERR_INVALID_ARG, "embedding_layer: e is NULL"); return ctpu_error_handle(); }
    if (ctpu__nn_is_error(indices)) return ctpu__nn_pass(indices);
    return ctpu_embedding(e->weight, indices);
}

void ctpu_embedding_layer_free(ctpu_embedding_layer *e)
{
    if (!e) return;
    release_all(1, &e->weight);
    memset(e, 0, sizeof *e);
}

ctpu_tensor ctpu_dropout(ctpu_tensor x, double p, bool training)
{
    if (!ctpu__nn_ready("dropout")) return ctpu_error_handle();
    if (!(p >= 0 && p <= 1)) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "dropout: p=%g must be in [0, 1]", p);
        return ctpu_error_handle();
    }
    if (ctpu__nn_is_error(x)) return ctpu__nn_pass(x);
    if (ctpu_is_null(x)) {
        ctpu_report_error(CTPU_ERR_NULL_HANDLE, "dropout: x is a null handle (CTPU_NULL)");
        return ctpu_error_handle();
    }
    if (!ctpu__nn_arg("dropout", "x", x)) return ctpu_error_handle();
    if (!training || p == 0) return ctpu_contiguous(x);
    if (p == 1) return ctpu_mul_scalar(x, 0.0);
    ctpu_scope_begin();
    ctpu_tensor u = ctpu__rand_uniform_f32_like(x);
    /* the 0/1 mask in x's dtype, so the result keeps it (torch's dropout
     * of a bf16 tensor is bf16: x * mask exact, then one rounding of the
     * scaled value); the draws stay f32 (the same masks in every dtype) */
    ctpu_tensor keep = ctpu_ge_scalar(u, p);
    if (ctpu_dtype_of(x) != ctpu_dtype_of(keep)) keep = ctpu_cast(keep, ctpu_dtype_of(x));
    ctpu_tensor y = ctpu_mul_scalar(ctpu_mul(x, keep), 1.0 / (1.0 - p));
    ctpu_keep(y);
    ctpu_scope_end();
    return y;
}

/* ------------------------------------------------------------ losses */
ctpu_ce_opts ctpu_ce_defaults(void) { return (ctpu_ce_opts){ CTPU_REDUCE_MEAN, -100, 0.0 }; }

ctpu_status ctpu_labels_check(const int32_t *labels, int64_t n, int64_t num_classes, int32_t ignore_index)
{
    if ((!labels && n > 0) || n < 0 || num_classes < 1)
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "labels_check: labels %s, n=%lld, num_classes=%lld",
                                 labels ? "given" : "NULL", (long long)n, (long long)num_classes);
    for (int64_t i = 0; i < n; i++)
        if (labels[i] != ignore_index && (labels[i] < 0 || labels[i] >= num_classes))
            return ctpu_report_error(CTPU_ERR_INVALID_ARG,
                                     "labels_check: label %d at position %lld is out of range [0, %lld)",
                                     labels[i], (long long)i, (long long)num_classes);
    return CTPU_OK;
}

ctpu_tensor ctpu_cross_entropy(ctpu_tensor logits, ctpu_tensor labels, const ctpu_ce_opts *opts)
{
    if (!ctpu__nn_ready("cross_entropy")) return ctpu_error_handle();
    ctpu_ce_opts o = opts ? *opts : ctpu_ce_defaults();
    if (ctpu__nn_is_error(logits) || ctpu__nn_is_error(labels))
        return ctpu__nn_pass(ctpu__nn_is_error(logits) ? logits : labels);
    if (ctpu_is_null(logits) || ctpu_is_null(labels)) {
        ctpu_report_error(CTPU_ERR_NULL_HANDLE, "cross_entropy: %s is a null handle (CTPU_NULL)", ctpu_is_null(logits) ? "logits" : "labels");
        return ctpu_error_handle();
    }
    if ((unsigned)o.reduction > CTPU_REDUCE_NONE || !(o.label_smoothing >= 0 && o.label_smoothing <= 1)) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "cross_entropy: reduction=%d, label_smoothing=%g: need a ctpu_reduction and smoothing in [0, 1]",
                          (int)o.reduction, o.label_smoothing);
        return ctpu_error_handle();
    }
    if (!ctpu__nn_arg("cross_entropy", "logits", logits) || !ctpu__nn_arg("cross_entropy", "labels", labels))
        return ctpu_error_handle();
    char a[128], b[128];
    int nl = ctpu_ndim(logits), ny = ctpu_ndim(labels);
    if (nl < 0 || ny < 0) return ctpu_error_handle();
    ctpu_dtype dl = ctpu_dtype_of(logits), dy = ctpu_dtype_of(labels);
    if (nl != 2 || ny != 1 || ctpu_dim(logits, 0) != ctpu_dim(labels, 0) || dl == CTPU_I32 || dy != CTPU_I32) {
        ctpu_report_error(nl != 2 || ny != 1 || ctpu_dim(logits, 0) != ctpu_dim(labels, 0) ? CTPU_ERR_SHAPE : CTPU_ERR_DTYPE,
                          "cross_entropy: logits is %s, labels is %s: need f32/bf16 logits [N, C] and i32 labels [N]",
                          ctpu__nn_fmt(logits, a, sizeof a), ctpu__nn_fmt(labels, b, sizeof b));
        return ctpu_error_handle();
    }
    if (ctpu_dim(logits, 1) == 0) {   /* an ignored row's gather would read class 0: a fault naming a label not passed */
        ctpu_report_error(CTPU_ERR_SHAPE, "cross_entropy: logits is %s, labels is %s: need C >= 1 classes",
                          ctpu__nn_fmt(logits, a, sizeof a), ctpu__nn_fmt(labels, b, sizeof b));
        return ctpu_error_handle();
    }
    int64_t N = ctpu_dim(logits, 0);
    int one = 1;
    ctpu_scope_begin();
    /* the whole loss in the user's call: a bad label faults as cross_entropy's, not
     * the gather's, and the handles it makes (its result too) are named after it */
    bool called = ctpu_call_push("cross_entropy", "labels") == CTPU_OK;
    ctpu_tensor lsm = ctpu_log_softmax(logits, 1);
    ctpu_tensor valid = ctpu_ne_scalar(labels, (double)o.ignore_index);
    ctpu_tensor safe = ctpu_where(valid, labels, ctpu_zeros(CTPU_I32, 0, NULL));
    int64_t col[2] = { N, 1 };
    ctpu_tensor g = ctpu_gather(lsm, 1, ctpu_reshape(safe, 2, col));
    ctpu_tensor picked = ctpu_reshape(g, 1, &N);
    ctpu_tensor loss = ctpu_neg(picked);
    if (o.label_smoothing > 0) {
        ctpu_tensor smooth = ctpu_neg(ctpu_mean(lsm, 1, &one, false));
        loss = ctpu_add(ctpu_mul_scalar(loss, 1.0 - o.label_smoothing), ctpu_mul_scalar(smooth, o.label_smoothing));
    }
    if (!ctpu_is_null(loss) && ctpu_dtype_of(loss) != CTPU_F32) loss = ctpu_cast(loss, CTPU_F32);
    loss = ctpu_where(valid, loss, ctpu_zeros(CTPU_F32, 0, NULL));
    ctpu_tensor r;
    if (o.reduction == CTPU_REDUCE_NONE) r = loss;
    else if (o.reduction == CTPU_REDUCE_SUM) r = ctpu_sum(loss, 0, NULL, false);
    else r = ctpu_div(ctpu_sum(loss, 0, NULL, false), ctpu_sum(valid, 0, NULL, false));
    if (called) ctpu_call_pop();
    ctpu_keep(r);
    ctpu_scope_end();
    return r;
}

/* pred and target of one shape, a valid reduction (mse, l1, smooth_l1, bce) */
/* An error handle among a loss's two arguments is passed along unchanged. */
#define PASS_ERROR(a, b)                                                                                      \
    do {                                                                                                      \
        if (ctpu__nn_is_error(a)) return ctpu__nn_pass(a);                                                    \
        if (ctpu__nn_is_error(b)) return ctpu__nn_pass(b);                                                    \
    } while (0)

/* first: the first argument's name in the header ("pred", or "logits") */
static bool pair_check(const char *op, const char *first, ctpu_tensor pred, ctpu_tensor target, ctpu_reduction reduction,
                       bool need_float)
{
    if (ctpu_is_null(pred) || ctpu_is_null(target)) {
        ctpu_report_error(CTPU_ERR_NULL_HANDLE, "%s: %s is a null handle (CTPU_NULL)", op, ctpu_is_null(pred) ? "pred" : "target");
        return false;
    }
    if (!ctpu__nn_arg(op, first, pred) ||
        !ctpu__nn_arg(op, "target", target))
        return false;
    int64_t s1[CTPU_MAX_DIMS], s2[CTPU_MAX_DIMS];
    int n1, n2;
    if (ctpu_shape(pred, s1, &n1) != CTPU_OK || ctpu_shape(target, s2, &n2) != CTPU_OK) {
        ctpu__nn_blame(op, NULL);
        return false;
    }
    bool same = n1 == n2 && memcmp(s1, s2, sizeof(int64_t) * (size_t)n1) == 0;
    bool fl = !need_float || (ctpu_dtype_of(pred) != CTPU_I32 && ctpu_dtype_of(target) != CTPU_I32);
    if (!same || !fl || (unsigned)reduction > CTPU_REDUCE_NONE) {
        char a[128], b[128];
        ctpu_report_error(!same ? CTPU_ERR_SHAPE : !fl ? CTPU_ERR_DTYPE : CTPU_ERR_INVALID_ARG,
                          "%s: pred is %s, target is %s: %s", op, ctpu__nn_fmt(pred, a, sizeof a),
                          ctpu__nn_fmt(target, b, sizeof b),
                          !same ? "shapes must match" : !fl ? "need f32 or bf16" : "bad reduction");
        return false;
    }
    return true;
}

static ctpu_tensor reduce_as(ctpu_tensor l, ctpu_reduction reduction)
{
    return reduction == CTPU_REDUCE_NONE ? l
           : reduction == CTPU_REDUCE_SUM ? ctpu_sum(l, 0, NULL, false) : ctpu_mean(l, 0, NULL, false);
}

ctpu_nll_opts ctpu_nll_defaults(void) { return (ctpu_nll_opts){ CTPU_REDUCE_MEAN, -100 }; }

ctpu_tensor ctpu_nll_loss(ctpu_tensor input, ctpu_tensor target, const ctpu_nll_opts *opts)
{
    if (!ctpu__nn_ready("nll_loss")) return ctpu_error_handle();
    ctpu_nll_opts o = opts ? *opts : ctpu_nll_defaults();
    if (ctpu__nn_is_error(input)) return ctpu__nn_pass(input);      /* an error handle: passed along */
    if (ctpu__nn_is_error(target)) return ctpu__nn_pass(target);
    if (ctpu_is_null(input) || ctpu_is_null(target)) {
        ctpu_report_error(CTPU_ERR_NULL_HANDLE, "nll_loss: %s is a null handle (CTPU_NULL)", ctpu_is_null(input) ? "input" : "target");
        return ctpu_error_handle();
    }
    if ((unsigned)o.reduction > CTPU_REDUCE_NONE) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "nll_loss: reduction=%d: need a ctpu_reduction", (int)o.reduction);
        return ctpu_error_handle();
    }
    if (!ctpu__nn_arg("nll_loss", "input", input) || !ctpu__nn_arg("nll_loss", "target", target))
        return ctpu_error_handle();
    char a[128], b[128];
    int nl = ctpu_ndim(input), ny = ctpu_ndim(target);
    if (nl < 0 || ny < 0) { ctpu__nn_blame("nll_loss", nl < 0 ? "input" : "target"); return ctpu_error_handle(); }
    ctpu_dtype dl = ctpu_dtype_of(input), dy = ctpu_dtype_of(target);
    bool shape_ok = nl == 2 && ny == 1 && ctpu_dim(input, 0) == ctpu_dim(target, 0);
    if (!shape_ok || dl == CTPU_I32 || dy != CTPU_I32) {
        ctpu_report_error(!shape_ok ? CTPU_ERR_SHAPE : CTPU_ERR_DTYPE,
                          "nll_loss: input is %s, target is %s: need f32/bf16 input [N, C] and i32 target [N]",
                          ctpu__nn_fmt(input, a, sizeof a), ctpu__nn_fmt(target, b, sizeof b));
        return ctpu_error_handle();
    }
    if (ctpu_dim(input, 1) == 0) {   /* as cross_entropy's */
        ctpu_report_error(CTPU_ERR_SHAPE, "nll_loss: input is %s, target is %s: need C >= 1 classes",
                          ctpu__nn_fmt(input, a, sizeof a), ctpu__nn_fmt(target, b, sizeof b));
        return ctpu_error_handle();
    }
    int64_t N = ctpu_dim(input, 0);
    ctpu_scope_begin();
    bool called = ctpu_call_push("nll_loss", "target") == CTPU_OK;   /* as in cross_entropy: faults and handles name the user's call */
    ctpu_tensor valid = ctpu_ne_scalar(target, (double)o.ignore_index);
    ctpu_tensor safe = ctpu_where(valid, target, ctpu_zeros(CTPU_I32, 0, NULL));
    int64_t col[2] = { N, 1 };
    ctpu_tensor g = ctpu_gather(input, 1, ctpu_reshape(safe, 2, col));
    ctpu_tensor picked = ctpu_reshape(g, 1, &N);
    if (!ctpu_is_null(picked) && dl != CTPU_F32) picked = ctpu_cast(picked, CTPU_F32);
    ctpu_tensor loss = ctpu_where(valid, ctpu_neg(picked), ctpu_zeros(CTPU_F32, 0, NULL));
    ctpu_tensor r;
    if (o.reduction == CTPU_REDUCE_NONE) r = loss;
    else if (o.reduction == CTPU_REDUCE_SUM) r = ctpu_sum(loss, 0, NULL, false);
    else r = ctpu_div(ctpu_sum(loss, 0, NULL, false), ctpu_sum(valid, 0, NULL, false));
    if (called) ctpu_call_pop();
    if (ctpu_is_null(r)) { ctpu__nn_blame("nll_loss", NULL); r = ctpu_error_handle(); }
    else r = ctpu_keep(r);
    ctpu_scope_end();
    return r;
}

ctpu_tensor ctpu_bce_with_logits(ctpu_tensor logits, ctpu_tensor target, ctpu_reduction reduction)
{
    if (!ctpu__nn_ready("bce_with_logits")) return ctpu_error_handle();
    PASS_ERROR(logits, target);
    if (!pair_check("bce_with_logits", "logits", logits, target, reduction, true)) return ctpu_error_handle();
    ctpu_scope_begin();
    ctpu_tensor x = ctpu_dtype_of(logits) == CTPU_F32 ? logits : ctpu_cast(logits, CTPU_F32);
    ctpu_tensor y = ctpu_dtype_of(target) == CTPU_F32 ? target : ctpu_cast(target, CTPU_F32);
    /* torch's form: (1 - y) x + m + log(exp(-m) + exp(-x - m)), m = max(-x, 0):
     * never exp of a positive number, and the gradient through m cancels
     * (d/dm = 1 - 1), so the kink at x = 0 leaves sigmoid(x) - y exact */
    ctpu_tensor m = ctpu_relu(ctpu_neg(x));
    ctpu_tensor lse = ctpu_log(ctpu_add(ctpu_exp(ctpu_neg(m)), ctpu_exp(ctpu_sub(ctpu_neg(x), m))));
    ctpu_tensor l = ctpu_add(ctpu_add(ctpu_mul(ctpu_rsub_scalar(y, 1.0), x), m), lse);
    ctpu_tensor r = reduce_as(l, reduction);
    if (ctpu_is_null(r)) { ctpu__nn_blame("bce_with_logits", NULL); r = ctpu_error_handle(); }
    else r = ctpu_keep(r);
    ctpu_scope_end();
    return r;
}

ctpu_tensor ctpu_l1_loss(ctpu_tensor pred, ctpu_tensor target, ctpu_reduction reduction)
{
    if (!ctpu__nn_ready("l1_loss")) return ctpu_error_handle();
    PASS_ERROR(pred, target);
    if (!pair_check("l1_loss", "pred", pred, target, reduction, false)) return ctpu_error_handle();
    ctpu_scope_begin();
    ctpu_tensor r = reduce_as(ctpu_abs(ctpu_sub(pred, target)), reduction);
    if (ctpu_is_null(r)) { ctpu__nn_blame("l1_loss", NULL); r = ctpu_error_handle(); }
    else r = ctpu_keep(r);
    ctpu_scope_end();
    return r;
}

ctpu_tensor ctpu_smooth_l1_loss(ctpu_tensor pred, ctpu_tensor target, ctpu_reduction reduction, double beta)
{
    if (!ctpu__nn_ready("smooth_l1_loss")) return ctpu_error_handle();
    PASS_ERROR(pred, target);
    if (!pair_check("smooth_l1_loss", "pred", pred, target, reduction, false)) return ctpu_error_handle();
    if (!(beta >= 0) || !isfinite(beta)) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "smooth_l1_loss: beta=%g must be finite and >= 0", beta);
        return ctpu_error_handle();
    }
    if (beta == 0) return ctpu_l1_loss(pred, target, reduction);
    ctpu_scope_begin();
    ctpu_tensor d = ctpu_sub(pred, target);
    ctpu_tensor ad = ctpu_abs(d);
    ctpu_tensor l = ctpu_where(ctpu_lt_scalar(ad, beta), ctpu_mul_scalar(ctpu_mul(d, d), 0.5 / beta),
                               ctpu_sub_scalar(ad, 0.5 * beta));
    ctpu_tensor r = reduce_as(l, reduction);
    if (ctpu_is_null(r)) { ctpu__nn_blame("smooth_l1_loss", NULL); r = ctpu_error_handle(); }
    else r = ctpu_keep(r);
    ctpu_scope_end();
    return r;
}

ctpu_tensor ctpu_mse_loss(ctpu_tensor pred, ctpu_tensor target, ctpu_reduction reduction)
{
    if (!ctpu__nn_ready("mse_loss")) return ctpu_error_handle();
    PASS_ERROR(pred, target);
    if (ctpu_is_null(pred) || ctpu_is_null(target)) {
        ctpu_report_error(CTPU_ERR_NULL_HANDLE, "mse_loss: %s is a null handle (CTPU_NULL)", ctpu_is_null(pred) ? "pred" : "target");
        return ctpu_error_handle();
    }
    if (!ctpu__nn_arg("mse_loss", "pred", pred) || !ctpu__nn_arg("mse_loss", "target", target))
        return ctpu_error_handle();
    int64_t s1[CTPU_MAX_DIMS], s2[CTPU_MAX_DIMS];
    int n1, n2;
    if (ctpu_shape(pred, s1, &n1) != CTPU_OK || ctpu_shape(target, s2, &n2) != CTPU_OK) return ctpu_error_handle();
    bool same = n1 == n2 && memcmp(s1, s2, sizeof(int64_t) * (size_t)n1) == 0;
    if (!same || (unsigned)reduction > CTPU_REDUCE_NONE) {
        char a[128], b[128];
        ctpu_report_error(same ? CTPU_ERR_INVALID_ARG : CTPU_ERR_SHAPE,
                          "mse_loss: pred is %s, target is %s: %s", ctpu__nn_fmt(pred, a, sizeof a),
                          ctpu__nn_fmt(target, b, sizeof b), same ? "bad reduction" : "shapes must match");
        return ctpu_error_handle();
    }
    ctpu_scope_begin();
    ctpu_tensor d = ctpu_sub(pred, target);
    ctpu_tensor sq = ctpu_mul(d, d);
    ctpu_tensor r = reduction == CTPU_REDUCE_NONE ? sq
                    : reduction == CTPU_REDUCE_SUM ? ctpu_sum(sq, 0, NULL, false) : ctpu_mean(sq, 0, NULL, false);
    ctpu_keep(r);
    ctpu_scope_end();
    return r;
}
