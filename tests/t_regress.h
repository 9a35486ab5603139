/* The regression-case harness of tests/test_regress.c and test_regress2.c:
 * run a function of fresh input tensors in every mode (strict eager, debug
 * eager, defer and fuse, a compiled step's capture and its replay), compare
 * every mode to strict bit for bit and strict to a reference. */
#ifndef T_REGRESS_H
#define T_REGRESS_H
#include <pthread.h>

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
            /* (a structure past TORCH_TPU_RECOMPILE_LIMIT shapes runs fn instead, and a step recording no
             * device op, a view only, is skipped: documented, still compared) */
            if (st == CTPU_OK && info.graph_breaks == 0 && !t_contains(info.last_reason, "RECOMPILE_LIMIT") &&
                !t_contains(info.last_reason, "no device op"))
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

/* Gradients: f's result summed, backward; the gradients of every f32 input,
 * concatenated. In a compiled step fn runs the backward and returns each
 * .grad (times 1: exact) as an output. */
typedef struct {
    rg_fn f;
    int nin;
} rg_gctx;
static ctpu_tensor rg_loss(ctpu_tensor y) { return ctpu_numel(y) == 1 ? y : ctpu_sum(y, 0, NULL, false); }
static ctpu_status rg_gstep(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)sc;
    const rg_gctx *g = ctx;
    ctpu_status st = ctpu_backward(rg_loss(g->f(in)));
    if (st != CTPU_OK) return st;
    for (int i = 0; i < g->nin; i++) out[i] = ctpu_mul_scalar(ctpu_grad(in[i]), 1.0);
    return CTPU_OK;
}
static void rg_grun(int m, rg_fn f, int nin, const rg_in *ins, rg_res *r)
{
    memset(r, 0, sizeof *r);
    ctpu_clear_error();
    ck_assert_int_eq(ctpu_set_mode(m <= 2 ? (ctpu_mode)m : CTPU_MODE_STRICT), CTPU_OK);
    ctpu_scope_begin();
    ctpu_tensor in[RG_MAX_IN], out[RG_MAX_IN] = { CTPU_NULL };
    rg_gctx g = { f, nin };
    ctpu_compiled *c = m >= 3 ? ctpu_compile(rg_gstep, &g, NULL) : NULL;
    ctpu_status st = CTPU_OK;
    for (int call = 0; call < (m == 4 ? 2 : 1) && st == CTPU_OK; call++) {
        rg_make(nin, ins, in);
        for (int i = 0; i < nin; i++) ck_assert_int_eq(ctpu_set_requires_grad(in[i], true), CTPU_OK);
        if (c) {
            st = ctpu_compiled_call(c, nin, in, 0, NULL, nin, out);
        } else {
            st = ctpu_backward(rg_loss(f(in)));
            for (int i = 0; i < nin && st == CTPU_OK; i++) out[i] = ctpu_grad(in[i]);
        }
    }
    r->st = st;
    for (int i = 0; i < nin && r->st == CTPU_OK; i++) {
        int64_t n = ctpu_numel(out[i]);
        ck_assert_msg(n >= 0 && r->n + n <= RG_MAX_OUT, "gradient %d: %s", i, ctpu_last_error());
        r->st = ctpu_to_host_as_f32(out[i], r->v + r->n, sizeof(float) * (size_t)n);
        r->n += n;
    }
    if (r->st != CTPU_OK) snprintf(r->err, sizeof r->err, "%s", ctpu_last_error());
    (void)ctpu_sync();
    if (c) ctpu_compiled_free(c);
    ctpu_scope_end();
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    (void)ctpu_sync();
    ctpu_clear_error();
}
static void rg_grad_expect(const char *name, rg_fn f, int nin, const rg_in *ins, int64_t n, const double *want, double tol)
{
    static rg_res r[RG_MODES];
    for (int m = 0; m < RG_MODES; m++) {
        rg_grun(m, f, nin, ins, &r[m]);
        ck_assert_msg(r[m].st == CTPU_OK, "grad %s [%s]: status %d: %s", name, rg_mode_name[m], r[m].st, r[m].err);
        ck_assert_int_eq(r[m].n, n);
    }
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(rg_close(r[0].v[i], want[i], tol), "grad %s [strict]: element %lld is %.9g, torch gives %.9g",
                      name, (long long)i, r[0].v[i], want[i]);
    for (int m = 1; m < RG_MODES; m++)
        for (int64_t i = 0; i < n; i++)
            ck_assert_msg(rg_eq(r[m].v[i], r[0].v[i]), "grad %s [%s]: element %lld is %.9g, strict gives %.9g", name,
                          rg_mode_name[m], (long long)i, r[m].v[i], r[0].v[i]);
}

#define NEG_INF (-INFINITY)
#define RG_IN(dt_, nd_, data_, ...) ((rg_in){ (dt_), (nd_), { __VA_ARGS__ }, (data_) })
#define RG_N(a) ((int64_t)(sizeof(a) / sizeof((a)[0])))

#endif /* T_REGRESS_H */
