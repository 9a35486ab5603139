/* Optimizers (SGD, Adam, AdamW; parameter groups) and learning-rate schedules on the public API.
 * Every coefficient derived from the learning rate or the step count goes
 * into a *_scalar op as a runtime scalar, so a schedule never changes a
 * program's key; updates are written with ctpu_assign under no_grad. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctpu_nn.h"
#include "nn_internal.h"
#include "../testing.h"

enum { OPT_SGD, OPT_ADAMW, OPT_ADAM };

struct ctpu_optim {
    int kind;
    int n;
    int n_state;          /* state tensors per parameter */
    ctpu_tensor *params;  /* [n], not owned (the groups' in group order) */
    ctpu_tensor *state;   /* [n * n_state], owned */
    int n_groups;
    int *group_of;        /* [n]: parameter i's group */
    double *lr_scale;     /* [n_groups]: group lr = lr * lr_scale */
    double *group_wd;     /* [n_groups]: the group's weight decay */
    double lr;
    int64_t steps;
    /* [n]: the steps in which parameter i had a .grad (torch's per-parameter
     * state['step']: its bias corrections and SGD's first step); equal to
     * steps until a step skips a parameter. Not capturable (step_t is global). */
    int64_t *psteps;
    ctpu_sgd_opts sgd;
    ctpu_adamw_opts adam;
    bool capturable;      /* lr and steps live in lr_t and step_t (0-d f32, global) */
    ctpu_tensor lr_t, step_t;
    /* strict eager: Adam/AdamW's update of every parameter as one compiled
     * step of its own (fused_step), or NULL until its first use */
    ctpu_compiled *fused;
    bool fused_off;       /* it could not be made: the update runs op by op */
    int n_slots;          /* its scalar arguments (fused_layout) */
    int *slot_step, *slot_decay;   /* [n_groups], NULL until the layout is made */
};

static bool test_fused_off;   /* ctpu__test_optim_fused */
void ctpu__test_optim_fused(bool on) { test_fused_off = !on; }

ctpu_adamw_opts ctpu_adamw_defaults(void) { return (ctpu_adamw_opts){ 1e-3, 0.9, 0.999, 1e-8, 1e-2 }; }
ctpu_adamw_opts ctpu_adam_defaults(void) { return (ctpu_adamw_opts){ 1e-3, 0.9, 0.999, 1e-8, 0.0 }; }

static void free_host(ctpu_optim *o)
{
    ctpu_compiled_free(o->fused);
    free(o->slot_step);
    free(o->slot_decay);
    if (ctpu_is_valid(o->lr_t)) ctpu_release(o->lr_t);
    if (ctpu_is_valid(o->step_t)) ctpu_release(o->step_t);
    free(o->params);
    free(o->state);
    free(o->group_of);
    free(o->lr_scale);
    free(o->group_wd);
    free(o->psteps);
    free(o);
}

/* The groups' parameters, checked (each valid, float, in one group only),
 * flattened in group order. */
static ctpu_optim *create(const char *op, int kind, int n_groups, const ctpu_param_group *groups, int n_state)
{
    if (n_groups < 1 || !groups) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: n_groups=%d with groups %s: need n_groups >= 1", op, n_groups,
                          groups ? "given" : "NULL");
        return NULL;
    }
    int64_t total = 0;
    for (int g = 0; g < n_groups; g++) {
        const ctpu_param_group *G = &groups[g];
        if (G->n < 1 || !G->params || !(G->lr_scale >= 0) || !isfinite(G->lr_scale) || !(G->weight_decay >= 0) ||
            !isfinite(G->weight_decay)) {
            ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: groups[%d]: n=%d, params %s, lr_scale=%g, weight_decay=%g: need "
                              "n >= 1 parameters, lr_scale and weight_decay finite and >= 0", op, g, G->n,
                              G->params ? "given" : "NULL", G->lr_scale, G->weight_decay);
            return NULL;
        }
        for (int i = 0; i < G->n; i++) {
            ctpu_tensor p = G->params[i];
            if (!ctpu_is_valid(p)) {
                ctpu_status st;
                char why[512];
                ctpu__nn_why(p, &st, why, sizeof why);
                ctpu_report_error(st, n_groups > 1 ? "%s: groups[%d].params[%d] is %s" : "%s: params[%.0d%d] is %s",
                                  op, n_groups > 1 ? g : 0, i, why);
                return NULL;
            }
            if (ctpu_dtype_of(p) == CTPU_I32) {
                ctpu_report_error(CTPU_ERR_DTYPE, n_groups > 1 ? "%s: groups[%d].params[%d] is i32: parameters are f32 or bf16"
                                                             : "%s: params[%.0d%d] is i32: parameters are f32 or bf16",
                                  op, n_groups > 1 ? g : 0, i);
                return NULL;
            }
            for (int h = 0; h <= g; h++)
                for (int j = 0; j < (h == g ? i : groups[h].n); j++)
                    if (groups[h].params[j].id == p.id) {
                        ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: groups[%d].params[%d] is also groups[%d].params[%d]: "
                                          "a parameter belongs to one group (as torch.optim)", op, g, i, h, j);
                        return NULL;
                    }
        }
        total += G->n;
    }
    if (total > 1 << 24) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %lld parameters: at most 16777216", op, (long long)total);
        return NULL;
    }
    int n = (int)total;
    ctpu_optim *o = calloc(1, sizeof *o);
    if (o) o->params = malloc(sizeof(ctpu_tensor) * (size_t)n);
    if (o) o->state = calloc((size_t)(n * n_state > 0 ? n * n_state : 1), sizeof(ctpu_tensor));
    if (o) o->group_of = malloc(sizeof(int) * (size_t)n);
    if (o) o->lr_scale = malloc(sizeof(double) * (size_t)n_groups);
    if (o) o->group_wd = malloc(sizeof(double) * (size_t)n_groups);
    if (o) o->psteps = calloc((size_t)n, sizeof(int64_t));
    if (!o || !o->params || !o->state || !o->group_of || !o->lr_scale || !o->group_wd || !o->psteps) {
        if (o) free_host(o);
        ctpu_report_error(CTPU_ERR_OOM, "%s: out of host memory", op);
        return NULL;
    }
    o->kind = kind;
    o->n = n;
    o->n_state = n_state;
    o->n_groups = n_groups;
    for (int g = 0, k = 0; g < n_groups; g++) {
        o->lr_scale[g] = groups[g].lr_scale;
        o->group_wd[g] = groups[g].weight_decay;
        for (int i = 0; i < groups[g].n; i++, k++) {
            o->params[k] = groups[g].params[i];
            o->group_of[k] = g;
        }
    }
    const ctpu_tensor *params = o->params;
    /* state as zeros now, never lazily at step 1: step 1 and step N record the same ops */
    for (int i = 0; i < n; i++) {
        int64_t s[CTPU_MAX_DIMS];
        int nd;
        ctpu_shape(params[i], s, &nd);
        for (int k = 0; k < n_state; k++) {
            ctpu_tensor z = ctpu__nn_global(ctpu_zeros(ctpu_dtype_of(params[i]), nd, s));
            if (ctpu_is_null(z)) { ctpu_optim_free(o); return NULL; }
            o->state[i * n_state + k] = z;
        }
    }
    return o;
}

static bool sgd_opts_valid(const ctpu_sgd_opts *s)
{
    return s->lr > 0 && isfinite(s->lr) && s->momentum >= 0 && isfinite(s->momentum) && isfinite(s->dampening) &&
           s->weight_decay >= 0 && isfinite(s->weight_decay) && (!s->nesterov || (s->momentum > 0 && s->dampening == 0));
}

static bool adamw_opts_valid(const ctpu_adamw_opts *a)
{
    return a->lr > 0 && isfinite(a->lr) && a->beta1 >= 0 && a->beta1 < 1 && a->beta2 >= 0 && a->beta2 < 1 &&
           a->eps > 0 && isfinite(a->eps) && a->weight_decay >= 0 && isfinite(a->weight_decay);
}

static ctpu_param_group one_group(int n, const ctpu_tensor *params, double wd)
{
    return (ctpu_param_group){ .params = params, .n = n, .lr_scale = 1.0, .weight_decay = wd };
}

ctpu_optim *ctpu_sgd_create_groups(int n_groups, const ctpu_param_group *groups, const ctpu_sgd_opts *opts)
{
    const char *op = n_groups == -1 ? "sgd_create" : "sgd_create_groups";
    if (n_groups == -1) n_groups = 1;
    if (!ctpu__nn_ready(op)) return NULL;
    if (!opts) { ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: opts is NULL", op); return NULL; }
    ctpu_sgd_opts s = *opts;
    if (!sgd_opts_valid(&s)) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG,
                          "%s: lr=%g momentum=%g dampening=%g weight_decay=%g nesterov=%d: need lr > 0, momentum >= 0, "
                          "weight_decay >= 0, and nesterov only with momentum > 0 and dampening 0",
                          op, s.lr, s.momentum, s.dampening, s.weight_decay, (int)s.nesterov);
        return NULL;
    }
    ctpu_optim *o = create(op, OPT_SGD, n_groups, groups, s.momentum > 0 ? 1 : 0);
    if (!o) return NULL;
    o->sgd = s;
    o->sgd.weight_decay = o->group_wd[0];
    o->lr = s.lr;
    return o;
}

ctpu_optim *ctpu_sgd_create(int n, const ctpu_tensor *params, const ctpu_sgd_opts *opts)
{
    if (n < 1 || !params) {
        if (!ctpu__nn_ready("sgd_create")) return NULL;
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "sgd_create: n=%d with params %s: need n >= 1 parameters", n,
                          params ? "given" : "NULL");
        return NULL;
    }
    ctpu_param_group g = one_group(n, params, opts ? opts->weight_decay : 0);
    return ctpu_sgd_create_groups(-1, &g, opts);
}

static ctpu_optim *adam_create(const char *op, int kind, int n_groups, const ctpu_param_group *groups,
                               const ctpu_adamw_opts *opts)
{
    if (!ctpu__nn_ready(op)) return NULL;
    if (!opts) { ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: opts is NULL", op); return NULL; }
    ctpu_adamw_opts a = *opts;
    if (!adamw_opts_valid(&a)) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG,
                          "%s: lr=%g betas=(%g, %g) eps=%g weight_decay=%g: need lr > 0, betas in [0, 1), eps > 0, "
                          "weight_decay >= 0", op, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay);
        return NULL;
    }
    ctpu_optim *o = create(op, kind, n_groups, groups, 2);
    if (!o) return NULL;
    o->adam = a;
    o->adam.weight_decay = o->group_wd[0];
    o->lr = a.lr;
    return o;
}

static ctpu_optim *adam_create_flat(const char *op, int kind, int n, const ctpu_tensor *params, const ctpu_adamw_opts *opts)
{
    if (n < 1 || !params) {
        if (!ctpu__nn_ready(op)) return NULL;
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: n=%d with params %s: need n >= 1 parameters", op, n,
                          params ? "given" : "NULL");
        return NULL;
    }
    ctpu_param_group g = one_group(n, params, opts ? opts->weight_decay : 0);
    return adam_create(op, kind, 1, &g, opts);
}

ctpu_optim *ctpu_adamw_create(int n, const ctpu_tensor *params, const ctpu_adamw_opts *opts)
{
    return adam_create_flat("adamw_create", OPT_ADAMW, n, params, opts);
}

ctpu_optim *ctpu_adam_create(int n, const ctpu_tensor *params, const ctpu_adamw_opts *opts)
{
    return adam_create_flat("adam_create", OPT_ADAM, n, params, opts);
}

ctpu_optim *ctpu_adamw_create_groups(int n_groups, const ctpu_param_group *groups, const ctpu_adamw_opts *opts)
{
    return adam_create("adamw_create_groups", OPT_ADAMW, n_groups, groups, opts);
}

ctpu_optim *ctpu_adam_create_groups(int n_groups, const ctpu_param_group *groups, const ctpu_adamw_opts *opts)
{
    return adam_create("adam_create_groups", OPT_ADAM, n_groups, groups, opts);
}

/* A new state value: the handle is replaced (no copy; the state is the
 * optimizer's own), the old one released. */
static void replace_state(ctpu_tensor *slot, ctpu_tensor v)
{
    ctpu_tensor old = *slot;
    *slot = ctpu__nn_global(v);
    ctpu_release(old);
}

/* torch: the first step sets buf = d (no dampening); buf starts as zeros
 * here, so the first step's coefficient of d is 1, later ones 1 - dampening. */
static double sgd_first_at(const ctpu_optim *o, int64_t steps) { return steps == 0 ? 1.0 : 1.0 - o->sgd.dampening; }
static double sgd_first(const ctpu_optim *o) { return sgd_first_at(o, o->steps); }

/* c: sgd_first's coefficient. in_place: buf is assigned (the fused step's
 * handle stays), else replaced by the new value's handle. */
static ctpu_status sgd_apply(ctpu_optim *o, ctpu_tensor p, ctpu_tensor g, ctpu_tensor *buf, double lr, double wd,
                             double c, bool in_place)
{
    const ctpu_sgd_opts *s = &o->sgd;
    ctpu_tensor d = g;
    if (wd != 0) d = ctpu_add(d, ctpu_mul_scalar(p, wd));
    if (s->momentum != 0) {
        ctpu_tensor nb = ctpu_add(ctpu_mul_scalar(*buf, s->momentum), ctpu_mul_scalar(d, c));
        if (ctpu_is_null(nb)) return ctpu_last_status();
        d = s->nesterov ? ctpu_add(d, ctpu_mul_scalar(nb, s->momentum)) : nb;
        ctpu_tensor np = ctpu_sub(p, ctpu_mul_scalar(d, lr));
        ctpu_status st = ctpu_is_null(np) ? ctpu_last_status() : ctpu_assign(p, np);
        if (st == CTPU_OK && in_place) st = ctpu_assign(*buf, nb);
        else if (st == CTPU_OK) replace_state(buf, nb);
        return st;
    }
    ctpu_tensor np = ctpu_sub(p, ctpu_mul_scalar(d, lr));
    return ctpu_is_null(np) ? ctpu_last_status() : ctpu_assign(p, np);
}

/* Adam/AdamW's host coefficients of a group at this step: the decay
 * factor 1 - lr wd, eps sqrt(bc2) and the step lr sqrt(bc2) / bc1. */
typedef struct { double decay, eps_s, step_s; } adam_coef;

static adam_coef adam_coefs_at(const ctpu_optim *o, double lr, double wd, int64_t steps)
{
    const ctpu_adamw_opts *a = &o->adam;
    double t = (double)(steps + 1);
    double bc1 = 1.0 - pow(a->beta1, t), bc2s = sqrt(1.0 - pow(a->beta2, t));
    return (adam_coef){ 1.0 - lr * wd, a->eps * bc2s, lr * bc2s / bc1 };
}
static adam_coef adam_coefs(const ctpu_optim *o, double lr, double wd) { return adam_coefs_at(o, lr, wd, o->steps); }

/* AdamW (decoupled decay: p *= 1 - lr wd) or Adam (L2: g += wd p, as
 * torch.optim.Adam); wd is the parameter's group's, c its coefficients.
 * in_place: m and v are assigned (the fused step's handles stay), else
 * replaced by the new values' handles (the same values). */
static ctpu_status adamw_apply(ctpu_optim *o, ctpu_tensor p, ctpu_tensor g, ctpu_tensor *m, ctpu_tensor *v,
                               const adam_coef *c, double wd, bool in_place)
{
    const ctpu_adamw_opts *a = &o->adam;
    /* m / (sqrt(v) / sqrt(bc2) + eps) = sqrt(bc2) m / (sqrt(v) + eps sqrt(bc2)): one pass fewer */
    ctpu_tensor p1 = p;
    if (o->kind == OPT_ADAM) {
        if (wd != 0) g = ctpu_add(g, ctpu_mul_scalar(p, wd));
    } else if (wd != 0) {
        p1 = ctpu_mul_scalar(p, c->decay);
    }
    ctpu_tensor nm = ctpu_add(ctpu_mul_scalar(*m, a->beta1), ctpu_mul_scalar(g, 1.0 - a->beta1));
    ctpu_tensor nv = ctpu_add(ctpu_mul_scalar(*v, a->beta2), ctpu_mul_scalar(ctpu_mul(g, g), 1.0 - a->beta2));
    ctpu_tensor denom = ctpu_add_scalar(ctpu_sqrt(nv), c->eps_s);
    ctpu_tensor np = ctpu_sub(p1, ctpu_mul_scalar(ctpu_div(nm, denom), c->step_s));
    if (ctpu_is_null(np)) return ctpu_last_status();
    ctpu_status st = ctpu_assign(p, np);
    if (st == CTPU_OK && in_place) {
        st = ctpu_assign(*m, nm);
        if (st == CTPU_OK) st = ctpu_assign(*v, nv);
    } else if (st == CTPU_OK) {
        replace_state(m, nm);
        replace_state(v, nv);
    }
    return st;
}

static ctpu_status adamw_one(ctpu_optim *o, ctpu_tensor p, ctpu_tensor g, ctpu_tensor *m, ctpu_tensor *v, double lr,
                             double wd, int64_t steps, bool in_place)
{
    adam_coef c = adam_coefs_at(o, lr, wd, steps);
    return adamw_apply(o, p, g, m, v, &c, wd, in_place);
}

/* ---------------------------------------------------- strict eager: one program
 * In strict eager every op is a launch and a pass over its operands, so
 * Adam/AdamW's thirteen elementwise ops per parameter (SGD's two to seven)
 * are that many launches. As torch.optim.AdamW(fused=True) is one kernel in
 * eager mode, the update of every parameter runs as one program instead: a
 * compiled step of the optimizer's own (ctpu_compile), whose inputs are the
 * gradients and whose scalars are the step's host coefficients, with the
 * parameters and the state read and assigned in place through their
 * handles. The same ops on the same values as op by op, so the same bits
 * (compiled steps are bit-identical to strict eager); one call of
 * ctpu_optim_step is one launch, all or nothing.
 *
 * A compiled step binds a recorded scalar to argument i when their values
 * are equal bit for bit, so the arguments are laid out without duplicates
 * by construction (one step slot per distinct lr_scale, one decay slot per
 * distinct (lr_scale, weight decay)), and a step whose arguments still
 * collide (lr 0 over groups of different lr_scale, an argument equal to a
 * constant such as beta1) runs op by op: a capture from it would bind an
 * op to another's slot. */
enum { FUSED_MAX_SLOTS = 256 };

static uint64_t bits_of(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

/* Slot layout: Adam/AdamW [0] eps sqrt(bc2); SGD [0] the momentum's first
 * coefficient; then per distinct lr_scale its step (Adam lr_g sqrt(bc2) /
 * bc1, SGD lr_g); then AdamW's decays 1 - lr_g wd. slot_step/slot_decay
 * [n_groups]: each group's slots (-1: none). */
static bool fused_layout(ctpu_optim *o)
{
    o->slot_step = malloc(sizeof(int) * (size_t)o->n_groups);
    o->slot_decay = malloc(sizeof(int) * (size_t)o->n_groups);
    if (!o->slot_step || !o->slot_decay) return false;
    int n = 1;
    for (int g = 0; g < o->n_groups; g++) {
        o->slot_step[g] = -1;
        for (int h = 0; h < g && o->slot_step[g] < 0; h++)
            if (o->lr_scale[h] == o->lr_scale[g]) o->slot_step[g] = o->slot_step[h];
        if (o->slot_step[g] < 0) o->slot_step[g] = n++;
    }
    for (int g = 0; g < o->n_groups; g++) {
        o->slot_decay[g] = -1;
        if (o->kind != OPT_ADAMW || o->group_wd[g] == 0) continue;
        for (int h = 0; h < g && o->slot_decay[g] < 0; h++)
            if (o->slot_decay[h] >= 0 && o->lr_scale[h] == o->lr_scale[g] && o->group_wd[h] == o->group_wd[g])
                o->slot_decay[g] = o->slot_decay[h];
        if (o->slot_decay[g] < 0) o->slot_decay[g] = n++;
    }
    o->n_slots = n;
    return n <= FUSED_MAX_SLOTS;
}

/* This step's arguments into sc[n_slots]; false when two are equal or one
 * equals a constant the update records (a capture would confuse them). */
static bool fused_scalars(const ctpu_optim *o, double *sc)
{
    double k[8 + 2 * FUSED_MAX_SLOTS];
    int nk = 0;
    if (o->kind == OPT_SGD) {
        const ctpu_sgd_opts *s = &o->sgd;
        sc[0] = sgd_first(o);
        if (s->momentum != 0) k[nk++] = s->momentum;
    } else {
        const ctpu_adamw_opts *a = &o->adam;
        double t = (double)(o->steps + 1);
        sc[0] = a->eps * sqrt(1.0 - pow(a->beta2, t));
        k[nk++] = a->beta1;
        k[nk++] = 1.0 - a->beta1;
        k[nk++] = a->beta2;
        k[nk++] = 1.0 - a->beta2;
    }
    for (int g = 0; g < o->n_groups; g++) {
        double lr = o->lr * o->lr_scale[g], wd = o->group_wd[g];
        if (o->kind == OPT_SGD) {
            sc[o->slot_step[g]] = lr;
        } else {
            adam_coef c = adam_coefs(o, lr, wd);
            sc[o->slot_step[g]] = c.step_s;
            if (o->slot_decay[g] >= 0) sc[o->slot_decay[g]] = c.decay;
        }
        if (wd != 0 && o->kind != OPT_ADAMW && nk < (int)(sizeof k / sizeof k[0])) k[nk++] = wd;
    }
    /* SGD without momentum records no first coefficient: its slot is unread */
    int first = o->kind == OPT_SGD && o->sgd.momentum == 0 ? 1 : 0;
    for (int i = first; i < o->n_slots; i++) {
        uint64_t b = bits_of(sc[i]);
        for (int j = first; j < i; j++)
            if (bits_of(sc[j]) == b) return false;
        for (int j = 0; j < nk; j++)
            if (bits_of(k[j]) == b) return false;
    }
    return true;
}

static ctpu_status fused_fn(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)out;
    ctpu_optim *o = ctx;
    ctpu_status st = CTPU_OK;
    for (int i = 0; i < o->n && st == CTPU_OK; i++) {
        int gi = o->group_of[i];
        ctpu_tensor *sv = o->state + i * o->n_state;
        if (o->kind == OPT_SGD) {
            st = sgd_apply(o, o->params[i], in[i], sv, sc[o->slot_step[gi]], o->group_wd[gi], sc[0], true);
        } else {
            adam_coef c = { o->slot_decay[gi] >= 0 ? sc[o->slot_decay[gi]] : 1.0, sc[0], sc[o->slot_step[gi]] };
            st = adamw_apply(o, o->params[i], in[i], sv, sv + 1, &c, o->group_wd[gi], true);
        }
    }
    return st;
}

/* False: not taken (a parameter without a gradient, colliding arguments,
 * too many parameters, no compiled step): the caller updates op by op.
 * True: *st is the update's status. */
static bool fused_step(ctpu_optim *o, ctpu_status *st)
{
    if (o->fused_off || o->n > 4096 || test_fused_off) return false;
    /* a parameter skipped before has its own coefficients: Adam's bias corrections from its count, SGD's
     * first-step rule when its count is 0 and the optimizer's is not */
    for (int i = 0; i < o->n; i++)
        if (o->kind == OPT_SGD ? (o->psteps[i] == 0) != (o->steps == 0) : o->psteps[i] != o->steps) return false;
    if (!o->slot_step && !fused_layout(o)) {
        o->fused_off = true;
        return false;
    }
    double sc[FUSED_MAX_SLOTS];
    if (!fused_scalars(o, sc)) return false;
    ctpu_tensor gs[64], *g = o->n <= 64 ? gs : malloc(sizeof *g * (size_t)o->n);
    if (!g) return false;
    bool ok = true;
    for (int i = 0; i < o->n && ok; i++) {
        g[i] = ctpu_grad(o->params[i]);
        ok = !ctpu_is_null(g[i]);
    }
    if (ok && !o->fused) {
        static const char *const names[] = { "sgd_step", "adamw_step", "adam_step" };
        ctpu_compile_opts co = { .name = names[o->kind] };
        o->fused = ctpu_compile(fused_fn, o, &co);
        if (!o->fused) {
            o->fused_off = true;
            ok = false;
        }
    }
    if (ok) *st = ctpu_compiled_call(o->fused, o->n, g, o->n_slots, sc, 0, NULL);
    if (g != gs) free(g);
    return ok;
}

/* ---------------------------------------------------- capturable updates
 * torch.optim's capturable=True: every coefficient from the lr and step
 * tensors, on the device; state assigned in place (a compiled step keeps the
 * same handles). Per group: lr_g = lr * lr_scale. */
typedef struct {
    ctpu_tensor lr;            /* lr_g */
    ctpu_tensor den_scale;     /* Adam: sqrt(1 - b2^t) * -lr_g / (1 - b1^t) */
    ctpu_tensor eps_scaled;    /* Adam: eps / (-lr_g / (1 - b1^t)) */
    ctpu_tensor decay;         /* 1 - lr_g * wd (AdamW) */
    ctpu_tensor first;         /* SGD: 1 at the first step, else 1 - dampening */
} cap_coef;

static cap_coef cap_coefs(const ctpu_optim *o, int g)
{
    cap_coef c = { ctpu_mul_scalar(o->lr_t, o->lr_scale[g]), CTPU_NULL, CTPU_NULL, CTPU_NULL, CTPU_NULL };
    if (o->kind == OPT_SGD) {
        /* cap_step has counted this step already: step_t is 1 at the first */
        if (o->sgd.momentum != 0 && o->sgd.dampening != 0)
            c.first = ctpu_where(ctpu_eq_scalar(o->step_t, 1), ctpu_full(CTPU_F32, 0, NULL, 1.0),
                                 ctpu_full(CTPU_F32, 0, NULL, 1.0 - o->sgd.dampening));
        return c;
    }
    const ctpu_adamw_opts *a = &o->adam;
    ctpu_tensor bc1 = ctpu_rsub_scalar(ctpu_rpow_scalar(o->step_t, a->beta1), 1.0);
    ctpu_tensor bc2s = ctpu_sqrt(ctpu_rsub_scalar(ctpu_rpow_scalar(o->step_t, a->beta2), 1.0));
    ctpu_tensor ssn = ctpu_neg(ctpu_div(c.lr, bc1));
    c.den_scale = ctpu_mul(bc2s, ssn);
    c.eps_scaled = ctpu_rdiv_scalar(ssn, a->eps);
    if (o->kind == OPT_ADAMW && o->group_wd[g] != 0) c.decay = ctpu_rsub_scalar(ctpu_mul_scalar(c.lr, o->group_wd[g]), 1.0);
    return c;
}

static ctpu_status cap_sgd_one(ctpu_optim *o, ctpu_tensor p, ctpu_tensor g, ctpu_tensor buf, const cap_coef *c, double wd)
{
    const ctpu_sgd_opts *s = &o->sgd;
    ctpu_tensor d = g;
    if (wd != 0) d = ctpu_add(d, ctpu_mul_scalar(p, wd));
    if (s->momentum != 0) {
        ctpu_tensor dd = s->dampening != 0 ? ctpu_mul(d, c->first) : d;
        ctpu_tensor nb = ctpu_add(ctpu_mul_scalar(buf, s->momentum), dd);
        d = s->nesterov ? ctpu_add(d, ctpu_mul_scalar(nb, s->momentum)) : nb;
        ctpu_status st = ctpu_assign(buf, nb);
        if (st != CTPU_OK) return st;
    }
    ctpu_tensor np = ctpu_sub(p, ctpu_mul(d, c->lr));
    return ctpu_assign(p, np);
}

static ctpu_status cap_adam_one(ctpu_optim *o, ctpu_tensor p, ctpu_tensor g, ctpu_tensor m, ctpu_tensor v, const cap_coef *c,
                                double wd)
{
    const ctpu_adamw_opts *a = &o->adam;
    ctpu_tensor p1 = p;
    if (o->kind == OPT_ADAM) {
        if (wd != 0) g = ctpu_add(g, ctpu_mul_scalar(p, wd));
    } else if (!ctpu_is_null(c->decay)) {
        p1 = ctpu_mul(p, c->decay);
    }
    ctpu_tensor nm = ctpu_add(ctpu_mul_scalar(m, a->beta1), ctpu_mul_scalar(g, 1.0 - a->beta1));
    ctpu_tensor nv = ctpu_add(ctpu_mul_scalar(v, a->beta2), ctpu_mul_scalar(ctpu_mul(g, g), 1.0 - a->beta2));
    ctpu_tensor denom = ctpu_add(ctpu_div(ctpu_sqrt(nv), c->den_scale), c->eps_scaled);
    ctpu_tensor np = ctpu_add(p1, ctpu_div(nm, denom));
    ctpu_status st = ctpu_assign(p, np);
    if (st == CTPU_OK) st = ctpu_assign(m, nm);
    if (st == CTPU_OK) st = ctpu_assign(v, nv);
    return st;
}

static ctpu_status cap_step(ctpu_optim *o)
{
    ctpu_status st = ctpu_assign(o->step_t, ctpu_add_scalar(o->step_t, 1.0));
    for (int gi = 0; gi < o->n_groups && st == CTPU_OK; gi++) {
        if ((st = ctpu_scope_begin()) != CTPU_OK) break;
        cap_coef c = cap_coefs(o, gi);
        for (int i = 0; i < o->n && st == CTPU_OK; i++) {
            if (o->group_of[i] != gi) continue;
            ctpu_tensor g = ctpu_grad(o->params[i]);
            if (ctpu_is_null(g)) continue;
            ctpu_tensor *sv = o->state + i * o->n_state;
            st = o->kind == OPT_SGD ? cap_sgd_one(o, o->params[i], g, o->n_state ? sv[0] : CTPU_NULL, &c, o->group_wd[gi])
                                    : cap_adam_one(o, o->params[i], g, sv[0], sv[1], &c, o->group_wd[gi]);
        }
        ctpu_status se = ctpu_scope_end();
        if (st == CTPU_OK) st = se;
    }
    return st;
}

ctpu_status ctpu_optim_step(ctpu_optim *o)
{
    if (!ctpu__nn_ready("optim_step")) return CTPU_ERR_NOT_INITIALIZED;
    if (!o) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "optim_step: o is NULL");
    if (!o->capturable && ctpu_is_compiling())
        return ctpu_report_error(CTPU_ERR_STATE, "optim_step: inside a compiled step the optimizer needs capturable = true "
                                 "in its opts (its host-side lr and step count would be baked into the capture)");
    for (int i = 0; i < o->n; i++)
        if (!ctpu_is_valid(o->params[i]))
            return ctpu_report_error(CTPU_ERR_STALE_HANDLE, "optim_step: params[%d] was released", i);
    ctpu_status st = ctpu_no_grad_begin();
    if (st != CTPU_OK) return st;
    if (o->capturable) {
        st = cap_step(o);
        ctpu_no_grad_end();
        if (st != CTPU_OK) ctpu__nn_blame("optim_step", NULL);
        return st;
    }
    if (ctpu_get_mode() == CTPU_MODE_STRICT && !ctpu_is_compiling()) {
        if (fused_step(o, &st)) {
            ctpu_no_grad_end();
            if (st == CTPU_OK) {
                o->steps++;
                for (int i = 0; i < o->n; i++) o->psteps[i]++;
            } else {
                ctpu__nn_blame("optim_step", NULL);
            }
            return st;
        }
    }
    /* once the fused step exists, its handles of the state stay */
    bool in_place = o->fused != NULL;
    for (int i = 0; i < o->n && st == CTPU_OK; i++) {
        ctpu_tensor g = ctpu_grad(o->params[i]);
        if (ctpu_is_null(g)) continue;
        if ((st = ctpu_scope_begin()) != CTPU_OK) break;
        ctpu_tensor *sv = o->state + i * o->n_state;
        int gi = o->group_of[i];
        double lr = o->lr * o->lr_scale[gi], wd = o->group_wd[gi];
        st = o->kind == OPT_SGD ? sgd_apply(o, o->params[i], g, sv, lr, wd, sgd_first_at(o, o->psteps[i]), in_place)
                                : adamw_one(o, o->params[i], g, sv, sv + 1, lr, wd, o->psteps[i], in_place);
        ctpu_status se = ctpu_scope_end();
        if (st == CTPU_OK) st = se;
    }
    ctpu_no_grad_end();
    if (st == CTPU_OK) {
        o->steps++;
        for (int i = 0; i < o->n; i++)
            if (!ctpu_is_null(ctpu_grad(o->params[i]))) o->psteps[i]++;
    } else {
        ctpu__nn_blame("optim_step", NULL);
    }
    return st;
}

ctpu_status ctpu_optim_zero_grad(ctpu_optim *o)
{
    if (!o) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "optim_zero_grad: o is NULL");
    for (int i = 0; i < o->n; i++)
        if (ctpu_is_valid(o->params[i])) ctpu_zero_grad(o->params[i]);
    return CTPU_OK;
}

ctpu_status ctpu_optim_set_lr(ctpu_optim *o, double lr)
{
    if (!o || !(lr >= 0) || !isfinite(lr))
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "optim_set_lr: %s", o ? "lr must be finite and >= 0" : "o is NULL");
    o->lr = lr;
    if (o->capturable) return ctpu_assign(o->lr_t, ctpu_full(CTPU_F32, 0, NULL, lr));
    return CTPU_OK;
}

ctpu_status ctpu_optim_set_capturable(ctpu_optim *o, bool on)
{
    if (!ctpu__nn_ready("optim_set_capturable")) return CTPU_ERR_NOT_INITIALIZED;
    if (!o) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "optim_set_capturable: o is NULL");
    if (on == o->capturable) return CTPU_OK;
    if (!on) {
        o->lr = ctpu_optim_lr(o);
        o->steps = ctpu_optim_steps(o);
        for (int i = 0; i < o->n; i++) o->psteps[i] = o->steps;
        ctpu_release(o->lr_t);
        ctpu_release(o->step_t);
        o->lr_t = o->step_t = CTPU_NULL;
        o->capturable = false;
        return CTPU_OK;
    }
    /* 0-d f32 tensors of no scope */
    ctpu_tensor lr = ctpu__nn_global(ctpu_full(CTPU_F32, 0, NULL, o->lr));
    ctpu_tensor st = ctpu__nn_global(ctpu_full(CTPU_F32, 0, NULL, (double)o->steps));
    if (ctpu_is_null(lr) || ctpu_is_null(st)) {
        ctpu_status e = ctpu_last_status();
        if (!ctpu_is_null(lr)) ctpu_release(lr);
        if (!ctpu_is_null(st)) ctpu_release(st);
        return e;
    }
    o->lr_t = lr;
    o->step_t = st;
    o->capturable = true;
    return CTPU_OK;
}

/* A capturable optimizer's lr / step tensor on the host. */
static double cap_read(ctpu_tensor t, double dflt)
{
    double v;
    return ctpu_item(t, &v) == CTPU_OK ? v : dflt;
}

double ctpu_optim_lr(const ctpu_optim *o) { return !o ? 0.0 : o->capturable ? cap_read(o->lr_t, o->lr) : o->lr; }
int64_t ctpu_optim_steps(const ctpu_optim *o)
{
    return !o ? 0 : o->capturable ? (int64_t)cap_read(o->step_t, (double)o->steps) : o->steps;
}

ctpu_status ctpu_optim_set_steps(ctpu_optim *o, int64_t steps)
{
    if (!o || steps < 0 || steps > CTPU_OPTIM_MAX_STEPS)
        return o ? ctpu_report_error(CTPU_ERR_INVALID_ARG, "optim_set_steps: steps=%lld: need 0 <= steps <= 2^62",
                                     (long long)steps)
                 : ctpu_report_error(CTPU_ERR_INVALID_ARG, "optim_set_steps: o is NULL");
    o->steps = steps;
    for (int i = 0; i < o->n; i++) o->psteps[i] = steps;
    if (o->capturable) return ctpu_assign(o->step_t, ctpu_full(CTPU_F32, 0, NULL, (double)steps));
    return CTPU_OK;
}

/* For checkpoints (checkpoint.c): the scalar state, read and written whole. */
void ctpu__optim_get(const ctpu_optim *o, ctpu__optim_hp *hp)
{
    *hp = (ctpu__optim_hp){ .adamw = o->kind != OPT_SGD, .l2 = o->kind == OPT_ADAM, .n_params = o->n,
                            .n_state = o->n_state, .lr = ctpu_optim_lr(o), .steps = ctpu_optim_steps(o),
                            .sgd = o->sgd, .adam = o->adam,
                            .n_groups = o->n_groups, .group_of = o->group_of, .lr_scale = o->lr_scale,
                            .group_wd = o->group_wd };
}

/* Writes "KEY = VALUE (need RULE)" for the first bad field into why. */
static bool hp_bad(char *why, size_t n, const char *key, double v, const char *rule)
{
    snprintf(why, n, "%s = %g (need %s)", key, v, rule);
    return false;
}

static bool hp_group_valid(const ctpu__optim_hp *hp, int g, char *why, size_t n)
{
    char k[64];
    if (!(hp->lr_scale[g] >= 0) || !isfinite(hp->lr_scale[g]))
        return snprintf(k, sizeof k, "ctpu.optim.group.%d.lr_scale", g), hp_bad(why, n, k, hp->lr_scale[g], "finite, >= 0");
    if (!(hp->group_wd[g] >= 0) || !isfinite(hp->group_wd[g]))
        return snprintf(k, sizeof k, "ctpu.optim.group.%d.weight_decay", g), hp_bad(why, n, k, hp->group_wd[g], "finite, >= 0");
    return true;
}

bool ctpu__optim_hp_valid(const ctpu__optim_hp *hp, char *why, size_t n)
{
    for (int g = 0; g < hp->n_groups; g++)
        if (!hp_group_valid(hp, g, why, n)) return false;
    if (!(hp->lr >= 0) || !isfinite(hp->lr)) return hp_bad(why, n, "ctpu.optim.lr", hp->lr, "finite, >= 0");
    if (hp->steps < 0 || hp->steps > CTPU_OPTIM_MAX_STEPS)
        return hp_bad(why, n, "ctpu.optim.step", (double)hp->steps, "in [0, 2^62]");
    if (hp->adamw) {
        const ctpu_adamw_opts *a = &hp->adam;
        if (!(a->lr > 0) || !isfinite(a->lr)) return hp_bad(why, n, "ctpu.optim.group.0.initial_lr / lr_scale", a->lr, "finite, > 0");
        if (!(a->beta1 >= 0 && a->beta1 < 1)) return hp_bad(why, n, "ctpu.optim.group.0.beta1", a->beta1, "[0, 1)");
        if (!(a->beta2 >= 0 && a->beta2 < 1)) return hp_bad(why, n, "ctpu.optim.group.0.beta2", a->beta2, "[0, 1)");
        if (!(a->eps > 0) || !isfinite(a->eps)) return hp_bad(why, n, "ctpu.optim.group.0.eps", a->eps, "finite, > 0");
        return adamw_opts_valid(a) || hp_bad(why, n, "ctpu.optim.group.0.weight_decay", a->weight_decay, "finite, >= 0");
    }
    const ctpu_sgd_opts *s = &hp->sgd;
    if (!(s->lr > 0) || !isfinite(s->lr)) return hp_bad(why, n, "ctpu.optim.group.0.initial_lr / lr_scale", s->lr, "finite, > 0");
    if (!(s->momentum >= 0) || !isfinite(s->momentum)) return hp_bad(why, n, "ctpu.optim.group.0.momentum", s->momentum, "finite, >= 0");
    if (!isfinite(s->dampening)) return hp_bad(why, n, "ctpu.optim.group.0.dampening", s->dampening, "finite");
    if (s->nesterov && !(s->momentum > 0 && s->dampening == 0))
        return hp_bad(why, n, "ctpu.optim.group.0.nesterov", 1, "momentum > 0 and dampening 0");
    return sgd_opts_valid(s) || hp_bad(why, n, "ctpu.optim.group.0.weight_decay", s->weight_decay, "finite, >= 0");
}

void ctpu__optim_put(ctpu_optim *o, const ctpu__optim_hp *hp)
{
    /* the fused step baked the betas, weight decays and slot layout in */
    ctpu_compiled_free(o->fused);
    o->fused = NULL;
    o->fused_off = false;
    free(o->slot_step);
    free(o->slot_decay);
    o->slot_step = o->slot_decay = NULL;
    ctpu_optim_set_lr(o, hp->lr);
    ctpu_optim_set_steps(o, hp->steps);
    if (o->kind != OPT_SGD) o->adam = hp->adam;
    else o->sgd = hp->sgd;
    for (int g = 0; g < o->n_groups; g++) {
        o->lr_scale[g] = hp->lr_scale[g];
        o->group_wd[g] = hp->group_wd[g];
    }
}

ctpu_tensor ctpu_optim_state(const ctpu_optim *o, int i, int k)
{
    if (!o || i < 0 || i >= o->n || k < 0 || k >= o->n_state) {
        if (!o) ctpu_report_error(CTPU_ERR_INVALID_ARG, "optim_state: o is NULL");
        else
            ctpu_report_error(CTPU_ERR_INVALID_ARG, "optim_state: i=%d, k=%d: need 0 <= i < %d (parameters) and 0 <= k < %d (state tensors)",
                              i, k, o->n, o->n_state);
        return CTPU_NULL;
    }
    return o->state[i * o->n_state + k];
}

void ctpu_optim_free(ctpu_optim *o)
{
    if (!o) return;
    for (int i = 0; i < o->n * o->n_state; i++)
        if (ctpu_is_valid(o->state[i])) ctpu_release(o->state[i]);
    free_host(o);
}

/* ------------------------------------------------------------ schedules */
double ctpu_lr_cosine(double base_lr, int64_t step, int64_t total, double min_lr)
{
    if (total <= 0 || step >= total) return min_lr;
    if (step < 0) step = 0;
    return min_lr + (base_lr - min_lr) * (1.0 + cos(M_PI * (double)step / (double)total)) / 2.0;
}

double ctpu_lr_warmup_cosine(double base_lr, int64_t step, int64_t warmup, int64_t total, double min_lr)
{
    if (step < 0) step = 0;
    if (warmup > 0 && step < warmup) return base_lr * (double)(step + 1) / (double)(warmup + 1);
    if (step >= total) return min_lr;
    int64_t span = total - (warmup > 0 ? warmup : 0);
    if (span <= 0) return min_lr;
    double ratio = (double)(step - (warmup > 0 ? warmup : 0)) / (double)span;
    return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + cos(M_PI * ratio));
}

double ctpu_lr_step(double base_lr, int64_t step, int64_t step_size, double gamma)
{
    if (step_size <= 0 || step < 0) return base_lr;
    return base_lr * pow(gamma, (double)(step / step_size));
}

/* ------------------------------------------------------------ gradient clipping */
/* One gradient's norm, f32 0-d: max |g| (inf), sum |g| (1), sqrt(sum g*g)
 * (2), (sum |g|^p)^(1/p) otherwise (torch.linalg.vector_norm). */
static ctpu_tensor grad_norm(ctpu_tensor g, double p)
{
    if (ctpu_numel(g) == 0) return ctpu_zeros(CTPU_F32, 0, NULL);
    ctpu_tensor x = ctpu_dtype_of(g) == CTPU_F32 ? g : ctpu_cast(g, CTPU_F32);
    if (isinf(p)) return ctpu_max(ctpu_abs(x), 0, NULL, false);
    if (p == 1) return ctpu_sum(ctpu_abs(x), 0, NULL, false);
    if (p == 2) return ctpu_sqrt(ctpu_sum(ctpu_mul(x, x), 0, NULL, false));
    return ctpu_pow_scalar(ctpu_sum(ctpu_pow_scalar(ctpu_abs(x), p), 0, NULL, false), 1.0 / p);
}

/* torch.nn.utils.clip_grad_norm_: the norm of the gradients' norms; every
 * gradient times min(max_norm / (total + 1e-6), 1), written back with
 * ctpu_assign under no_grad. Every step is an op (no host read). */
ctpu_tensor ctpu_clip_grad_norm(int n, const ctpu_tensor *params, double max_norm, double norm_type)
{
    const char *op = "clip_grad_norm";
    if (!ctpu__nn_ready(op)) return ctpu_error_handle();
    if (n < 0 || (n > 0 && !params) || !(max_norm >= 0) || !(norm_type > 0) || isnan(norm_type) ||
        (isinf(norm_type) && norm_type < 0)) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: n=%d, params %s, max_norm=%g, norm_type=%g: need n >= 0 "
                          "parameters, max_norm >= 0 (inf allowed) and norm_type > 0 (inf allowed)", op, n,
                          params ? "given" : "NULL", max_norm, norm_type);
        return ctpu_error_handle();
    }
    for (int i = 0; i < n; i++) {
        if (ctpu_is_valid(params[i])) continue;
        ctpu_status st;
        char why[512];
        ctpu__nn_why(params[i], &st, why, sizeof why);
        /* the result of a failed call is passed along, as ops do (ctpu_keep
         * returns it and makes its cause the last error again) */
        if (params[i].id != 0 && st != CTPU_ERR_STALE_HANDLE) return ctpu_keep(params[i]);
        ctpu_report_error(st, "%s: params[%d] is %s", op, i, why);
        return ctpu_error_handle();
    }
    if (ctpu_scope_begin() != CTPU_OK) return ctpu_error_handle();
    ctpu_no_grad_begin();
    int k = 0;
    ctpu_tensor *norms = malloc(sizeof(ctpu_tensor) * (size_t)(n ? n : 1));
    ctpu_tensor total = norms ? CTPU_NULL : ctpu_error_handle();
    if (!norms) ctpu_report_error(CTPU_ERR_OOM, "%s: out of host memory", op);
    for (int i = 0; norms && i < n; i++) {
        ctpu_tensor g = ctpu_grad(params[i]);
        if (!ctpu_is_valid(g)) continue;   /* no gradient: skipped, as torch */
        norms[k++] = ctpu_reshape(grad_norm(g, norm_type), 1, (const int64_t[]){ 1 });
    }
    if (norms && k == 0) {
        total = ctpu_zeros(CTPU_F32, 0, NULL);
    } else if (norms) {
        ctpu_tensor all = ctpu_concat(k, norms, 0);
        total = grad_norm(all, norm_type);
        /* torch: max_norm / (total + 1e-6) is (total + 1e-6).reciprocal() * max_norm, then clamp(max=1) */
        ctpu_tensor rec = ctpu_rdiv_scalar(ctpu_add_scalar(total, 1e-6), 1.0);
        ctpu_tensor coef = ctpu_minimum_scalar(ctpu_mul_scalar(rec, max_norm), 1.0);
        ctpu_status st = ctpu_is_valid(coef) ? CTPU_OK : ctpu_last_status();
        for (int i = 0; st == CTPU_OK && i < n; i++) {
            ctpu_tensor g = ctpu_grad(params[i]);
            if (!ctpu_is_valid(g)) continue;
            ctpu_tensor s = ctpu_mul(g, coef);
            if (ctpu_dtype_of(g) != CTPU_F32) s = ctpu_cast(s, ctpu_dtype_of(g));
            st = ctpu_is_valid(s) ? ctpu_assign(g, s) : ctpu_last_status();
        }
        if (st != CTPU_OK) total = CTPU_NULL;
    }
    free(norms);
    ctpu_no_grad_end();
    if (ctpu_is_valid(total)) {
        total = ctpu_keep(total);
    } else {
        ctpu__nn_blame(op, NULL);
        total = ctpu_error_handle();
    }
    ctpu_scope_end();
    return total;
}
