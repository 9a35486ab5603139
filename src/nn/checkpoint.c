/* Optimizer and whole-run checkpoints (ctpu_nn.h "checkpoints") on the
 * safetensors calls of ctpu.h: the state tensors go in as tensors, every
 * scalar (step count, lr, hyper-parameters, the generator's state, the batch
 * iterator's place) as a decimal metadata string. A load parses and checks
 * every key and every tensor before it writes anything. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctpu_nn.h"
#include "nn_internal.h"

static const char *const ADAMW_STATE[] = { "exp_avg", "exp_avg_sq" };
static const char *const SGD_STATE[] = { "momentum_buffer" };

/* ------------------------------------------------------------ lists */
/* Owned strings in pairs (metadata) or names beside tensors. */
typedef struct {
    int n, cap;
    char **s;            /* metadata: [2n] key, value; tensors: [n] names */
    ctpu_tensor *t;      /* tensors: [n] */
    bool oom;
} list;

static void list_free(list *l)
{
    int k = l->t ? l->n : 2 * l->n;
    for (int i = 0; i < k; i++) free(l->s[i]);
    free(l->s);
    free(l->t);
    *l = (list){ 0 };
}

static bool list_grow(list *l, int per, bool tensors)
{
    if (l->oom) return false;
    if (l->n < l->cap) return true;
    int cap = l->cap ? 2 * l->cap : 16;
    char **s = realloc(l->s, sizeof(char *) * (size_t)(cap * per));
    if (s) l->s = s;
    ctpu_tensor *t = tensors ? realloc(l->t, sizeof(ctpu_tensor) * (size_t)cap) : NULL;
    if (t) l->t = t;
    if (!s || (tensors && !t)) { l->oom = true; return false; }
    l->cap = cap;
    return true;
}

static void meta_add(list *l, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void meta_add(list *l, const char *key, const char *fmt, ...)
{
    if (!list_grow(l, 2, false)) return;
    char *v = NULL;
    va_list ap;
    va_start(ap, fmt);
    int r = vasprintf(&v, fmt, ap);
    va_end(ap);
    char *k = strdup(key);
    if (r < 0 || !k) { free(k); if (r >= 0) free(v); l->oom = true; return; }
    l->s[2 * l->n] = k;
    l->s[2 * l->n + 1] = v;
    l->n++;
}

static void tensor_add(list *l, ctpu_tensor t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void tensor_add(list *l, ctpu_tensor t, const char *fmt, ...)
{
    if (!list_grow(l, 1, true)) return;
    char *name = NULL;
    va_list ap;
    va_start(ap, fmt);
    int r = vasprintf(&name, fmt, ap);
    va_end(ap);
    if (r < 0) { l->oom = true; return; }
    l->s[l->n] = name;
    l->t[l->n] = t;
    l->n++;
}

/* "0,3,4": the parameters of group g, in order */
static char *index_list(const ctpu__optim_hp *hp, int g)
{
    size_t cap = (size_t)hp->n_params * 12 + 1, k = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    s[0] = 0;
    for (int i = 0; i < hp->n_params; i++)
        if (hp->group_of[i] == g) k += (size_t)snprintf(s + k, cap - k, k ? ",%d" : "%d", i);
    return s;
}

static const char *kind_name(const ctpu__optim_hp *hp)
{
    return !hp->adamw ? "sgd" : hp->l2 ? "adam" : "adamw";
}

static const char *const *state_names(const ctpu__optim_hp *hp)
{
    return hp->adamw ? ADAMW_STATE : SGD_STATE;
}

/* ------------------------------------------------------------ write */
static void optim_parts(const ctpu_optim *o, list *tl, list *ml)
{
    ctpu__optim_hp hp;
    ctpu__optim_get(o, &hp);
    const char *const *sn = state_names(&hp);
    for (int i = 0; i < hp.n_params; i++)
        for (int k = 0; k < hp.n_state; k++) tensor_add(tl, ctpu_optim_state(o, i, k), "optim.state.%d.%s", i, sn[k]);
    meta_add(ml, "ctpu.optim.kind", "%s", kind_name(&hp));
    meta_add(ml, "ctpu.optim.n_params", "%d", hp.n_params);
    meta_add(ml, "ctpu.optim.step", "%lld", (long long)hp.steps);
    meta_add(ml, "ctpu.optim.lr", "%.17g", hp.lr);
    meta_add(ml, "ctpu.optim.groups", "%d", hp.n_groups);
    for (int g = 0; g < hp.n_groups; g++) {
        char *idx = index_list(&hp, g);
        if (!idx) { ml->oom = true; return; }
        char k[64];
#define GK(name) (snprintf(k, sizeof k, "ctpu.optim.group.%d." name, g), k)
        meta_add(ml, GK("params"), "%s", idx);
        free(idx);
        meta_add(ml, GK("lr"), "%.17g", hp.lr * hp.lr_scale[g]);
        meta_add(ml, GK("lr_scale"), "%.17g", hp.lr_scale[g]);
        meta_add(ml, GK("weight_decay"), "%.17g", hp.group_wd[g]);
        if (hp.adamw) {
            meta_add(ml, GK("initial_lr"), "%.17g", hp.adam.lr * hp.lr_scale[g]);
            meta_add(ml, GK("beta1"), "%.17g", hp.adam.beta1);
            meta_add(ml, GK("beta2"), "%.17g", hp.adam.beta2);
            meta_add(ml, GK("eps"), "%.17g", hp.adam.eps);
        } else {
            meta_add(ml, GK("initial_lr"), "%.17g", hp.sgd.lr * hp.lr_scale[g]);
            meta_add(ml, GK("momentum"), "%.17g", hp.sgd.momentum);
            meta_add(ml, GK("dampening"), "%.17g", hp.sgd.dampening);
            meta_add(ml, GK("nesterov"), "%s", hp.sgd.nesterov ? "true" : "false");
        }
#undef GK
    }
}

static ctpu_status write_lists(const char *op, const char *path, list *tl, list *ml)
{
    ctpu_status st = tl->oom || ml->oom ? ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory", op, path)
                                         : ctpu_save_ex(path, tl->n, (const char *const *)tl->s, tl->t, ml->n,
                                                        (const char *const *)ml->s);
    list_free(tl);
    list_free(ml);
    return st;
}

ctpu_status ctpu_optim_save(const ctpu_optim *o, const char *path)
{
    if (!o) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "optim_save: o is NULL");
    list tl = { 0 }, ml = { 0 };
    optim_parts(o, &tl, &ml);
    return write_lists("optim_save", path ? path : "(null)", &tl, &ml);
}

ctpu_status ctpu_checkpoint_save(const char *path, int n, const char *const *names, const ctpu_tensor *params,
                                 const ctpu_optim *o, const ctpu_batch_iter *it, int n_meta, const char *const *meta)
{
    const char *op = "checkpoint_save";
    if (!path) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: path is NULL", op);
    if (n < 0 || (n > 0 && (!names || !params)) || n_meta < 0 || (n_meta > 0 && !meta))
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: n=%d (names %s, params %s), n_meta=%d (meta %s)", op,
                                 path, n, names ? "given" : "NULL", params ? "given" : "NULL", n_meta,
                                 meta ? "given" : "NULL");
    for (int i = 0; i < n; i++) {
        if (!names[i]) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: names[%d] is NULL", op, path, i);
        if (!strncmp(names[i], "optim.state.", 12))
            return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: tensor name '%.160s': names starting "
                                     "'optim.state.' are the optimizer's", op, path, names[i]);
    }
    for (int i = 0; i < n_meta; i++) {
        if (!meta[2 * i] || !meta[2 * i + 1])
            return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: metadata pair %d has a NULL %s", op, path, i,
                                     meta[2 * i] ? "value" : "key");
        if (!strncmp(meta[2 * i], "ctpu.", 5))
            return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: metadata key '%.160s': keys starting 'ctpu.' "
                                     "are reserved", op, path, meta[2 * i]);
    }
    uint64_t seed, offset;
    ctpu_status st = ctpu_rng_get_state(&seed, &offset);
    if (st != CTPU_OK) return st;
    list tl = { 0 }, ml = { 0 };
    for (int i = 0; i < n; i++) tensor_add(&tl, params[i], "%s", names[i]);
    meta_add(&ml, "ctpu.checkpoint", "1");
    meta_add(&ml, "ctpu.rng.seed", "%llu", (unsigned long long)seed);
    meta_add(&ml, "ctpu.rng.offset", "%llu", (unsigned long long)offset);
    if (it) {
        ctpu_batch_iter_state s;
        ctpu_batch_iter_get_state(it, &s);
        meta_add(&ml, "ctpu.data.n", "%lld", (long long)s.n);
        meta_add(&ml, "ctpu.data.batch", "%lld", (long long)s.batch);
        meta_add(&ml, "ctpu.data.shuffle", "%s", s.shuffle ? "true" : "false");
        meta_add(&ml, "ctpu.data.drop_last", "%s", s.drop_last ? "true" : "false");
        meta_add(&ml, "ctpu.data.seed", "%llu", (unsigned long long)s.seed);
        meta_add(&ml, "ctpu.data.epoch", "%lld", (long long)s.epoch);
        meta_add(&ml, "ctpu.data.position", "%lld", (long long)s.position);
    }
    if (o) optim_parts(o, &tl, &ml);
    for (int i = 0; i < n_meta; i++) meta_add(&ml, meta[2 * i], "%s", meta[2 * i + 1]);
    return write_lists(op, path, &tl, &ml);
}

/* ------------------------------------------------------------ read */
typedef struct {
    const char *op;
    const ctpu_safetensors *f;
    const char *path;
} reader;

static bool get_str(const reader *r, const char *key, const char **out)
{
    *out = ctpu_safetensors_metadata(r->f, key);
    if (!*out) ctpu_report_error(CTPU_ERR_IO, "%s: %s: metadata '%s' is missing", r->op, r->path, key);
    return *out != NULL;
}

static bool bad_value(const reader *r, const char *key, const char *v, const char *want)
{
    ctpu_report_error(CTPU_ERR_IO, "%s: %s: metadata '%s' is '%.64s': want %s", r->op, r->path, key, v, want);
    return false;
}

static bool get_i64(const reader *r, const char *key, int64_t lo, int64_t *out)
{
    const char *v;
    if (!get_str(r, key, &v)) return false;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo) return bad_value(r, key, v, lo ? "an integer >= 1" : "an integer >= 0");
    *out = x;
    return true;
}

static bool get_u64(const reader *r, const char *key, uint64_t *out)
{
    const char *v;
    if (!get_str(r, key, &v)) return false;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || *end || v[0] < '0' || v[0] > '9') return bad_value(r, key, v, "an unsigned integer");
    *out = x;
    return true;
}

static bool get_f64(const reader *r, const char *key, double *out)
{
    const char *v;
    if (!get_str(r, key, &v)) return false;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    /* ERANGE on underflow comes with the nearest double (a subnormal that
     * %.17g wrote reads back bit for bit): only an overflow is refused */
    if ((errno == ERANGE && isinf(x)) || end == v || *end) return bad_value(r, key, v, "a number");
    *out = x;
    return true;
}

static bool get_bool(const reader *r, const char *key, bool *out)
{
    const char *v;
    if (!get_str(r, key, &v)) return false;
    if (strcmp(v, "true") && strcmp(v, "false")) return bad_value(r, key, v, "'true' or 'false'");
    *out = !strcmp(v, "true");
    return true;
}

/* key's value x (just read) is finite and >= 0. */
static bool get_nonneg(const reader *r, const char *key, double x)
{
    return (x >= 0 && isfinite(x)) || bad_value(r, key, ctpu_safetensors_metadata(r->f, key), "a finite number >= 0");
}

/* A hyper-parameter ctpu keeps once per optimizer: group g's value x must
 * be group 0's x0, bit for bit (a file whose groups differ, or one whose
 * later group was corrupted, is refused rather than read as one of them). */
static bool same_as_group0(const reader *r, const char *key, double x, double x0)
{
    if (memcmp(&x, &x0, sizeof x) == 0) return true;
    ctpu_report_error(CTPU_ERR_IO, "%s: %s: metadata '%s' is '%.64s' but group 0's is %.17g: ctpu keeps one value per "
                      "optimizer, which every group shares", r->op, r->path, key,
                      ctpu_safetensors_metadata(r->f, key), x0);
    return false;
}

/* The optimizer part of r's file, checked against o: its scalar state into
 * hp (hp->lr_scale and hp->group_wd are allocated: free them with
 * hp_free), its tensors (with o's state tensors as destinations) added to
 * tl. Files written before "ctpu.optim.lr" and ".lr_scale" existed (one
 * group) read with the group's lr and scale 1. */
static void hp_free(ctpu__optim_hp *hp)
{
    free(hp->lr_scale);
    free(hp->group_wd);
    hp->lr_scale = hp->group_wd = NULL;
}

static bool optim_read(const reader *r, const ctpu_optim *o, ctpu__optim_hp *hp, list *tl)
{
    ctpu__optim_hp cur;
    ctpu__optim_get(o, &cur);
    *hp = cur;
    hp->lr_scale = hp->group_wd = NULL;
    const char *kind, *params;
    int64_t np, groups;
    if (!get_str(r, "ctpu.optim.kind", &kind)) return false;
    if (strcmp(kind, kind_name(&cur))) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: the file holds a '%.32s' optimizer (metadata 'ctpu.optim.kind'), this one is %s",
                          r->op, r->path, kind, kind_name(&cur));
        return false;
    }
    if (!get_i64(r, "ctpu.optim.n_params", 1, &np) || !get_i64(r, "ctpu.optim.step", 0, &hp->steps) ||
        !get_i64(r, "ctpu.optim.groups", 1, &groups))
        return false;
    if (hp->steps > CTPU_OPTIM_MAX_STEPS)
        return bad_value(r, "ctpu.optim.step", ctpu_safetensors_metadata(r->f, "ctpu.optim.step"),
                         "an integer in [0, 2^62]");
    if (np != cur.n_params) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: the file's optimizer has %lld parameters (metadata 'ctpu.optim.n_params'), this "
                          "one %d", r->op, r->path,
                          (long long)np, cur.n_params);
        return false;
    }
    if (groups != cur.n_groups) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: the file's optimizer has %lld parameter groups (metadata 'ctpu.optim.groups'), "
                          "this one %d", r->op,
                          r->path, (long long)groups, cur.n_groups);
        return false;
    }
    hp->lr_scale = malloc(sizeof(double) * (size_t)cur.n_groups);
    hp->group_wd = malloc(sizeof(double) * (size_t)cur.n_groups);
    if (!hp->lr_scale || !hp->group_wd) {
        hp_free(hp);
        ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory", r->op, r->path);
        return false;
    }
    bool ok = true;
    double lr0 = 0;
    for (int g = 0; g < cur.n_groups && ok; g++) {
        char k[64];
#define GK(name) (snprintf(k, sizeof k, "ctpu.optim.group.%d." name, g), k)
        char *idx = index_list(&cur, g);
        if (!idx) { hp_free(hp); ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory", r->op, r->path); return false; }
        ok = get_str(r, GK("params"), &params);
        if (ok && strcmp(params, idx)) ok = bad_value(r, k, params, "this optimizer's group layout");
        free(idx);
        hp->lr_scale[g] = 1.0;
        if (ok && ctpu_safetensors_metadata(r->f, GK("lr_scale"))) ok = get_f64(r, k, &hp->lr_scale[g]);
        if (ok) ok = get_f64(r, GK("weight_decay"), &hp->group_wd[g]);
        /* every group's lr and initial lr is read and checked (group 0's lr is the optimizer's in files
         * without "ctpu.optim.lr"; the others follow from lr_scale) */
        double lr_g = 0, ilr = 0;
        if (ok) ok = get_f64(r, GK("lr"), &lr_g) && get_nonneg(r, k, lr_g);
        if (ok && g == 0) lr0 = lr_g;
        if (ok) ok = get_f64(r, GK("initial_lr"), &ilr) && get_nonneg(r, k, ilr);
        /* the rest is one value per optimizer: group 0's, which every other group must repeat */
        if (cur.adamw) {
            ctpu_adamw_opts a = hp->adam;
            ok = ok && get_f64(r, GK("beta1"), &a.beta1) && (g == 0 || same_as_group0(r, k, a.beta1, hp->adam.beta1)) &&
                 get_f64(r, GK("beta2"), &a.beta2) && (g == 0 || same_as_group0(r, k, a.beta2, hp->adam.beta2)) &&
                 get_f64(r, GK("eps"), &a.eps) && (g == 0 || same_as_group0(r, k, a.eps, hp->adam.eps));
            if (ok && g == 0) {
                hp->adam = a;
                if (hp->lr_scale[0] > 0) hp->adam.lr = ilr / hp->lr_scale[0];
            }
        } else {
            ctpu_sgd_opts sg = hp->sgd;
            ok = ok && get_f64(r, GK("momentum"), &sg.momentum) &&
                 (g == 0 || same_as_group0(r, k, sg.momentum, hp->sgd.momentum)) &&
                 get_f64(r, GK("dampening"), &sg.dampening) &&
                 (g == 0 || same_as_group0(r, k, sg.dampening, hp->sgd.dampening)) &&
                 get_bool(r, GK("nesterov"), &sg.nesterov) &&
                 (g == 0 || same_as_group0(r, k, sg.nesterov, hp->sgd.nesterov));
            if (ok && g == 0) {
                hp->sgd = sg;
                if (hp->lr_scale[0] > 0) hp->sgd.lr = ilr / hp->lr_scale[0];
            }
        }
#undef GK
    }
    if (ok && ctpu_safetensors_metadata(r->f, "ctpu.optim.lr")) ok = get_f64(r, "ctpu.optim.lr", &hp->lr);
    else if (ok) hp->lr = lr0;
    if (!ok) { hp_free(hp); return false; }
    if (cur.adamw) hp->adam.weight_decay = hp->group_wd[0];
    else hp->sgd.weight_decay = hp->group_wd[0];
    char why[160];
    if (!ctpu__optim_hp_valid(hp, why, sizeof why)) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: the file's optimizer hyper-parameter %s", r->op, r->path, why);
        hp_free(hp);
        return false;
    }
    if (!cur.adamw && (hp->sgd.momentum > 0) != (cur.n_state == 1)) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: the file's SGD has momentum %g; this one was made %s momentum "
                          "buffers", r->op, r->path, hp->sgd.momentum, cur.n_state ? "with" : "without");
        hp_free(hp);
        return false;
    }
    const char *const *sn = state_names(&cur);
    for (int i = 0; i < cur.n_params; i++)
        for (int k = 0; k < cur.n_state; k++) tensor_add(tl, ctpu_optim_state(o, i, k), "optim.state.%d.%s", i, sn[k]);
    if (tl->oom) { hp_free(hp); ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory", r->op, r->path); return false; }
    return true;
}

static ctpu_safetensors *open_as(const char *op, const char *path)
{
    if (!ctpu_is_initialized()) {
        ctpu_report_error(CTPU_ERR_NOT_INITIALIZED, "%s: the runtime is not initialised (call ctpu_init)", op);
        return NULL;
    }
    if (!path) { ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: path is NULL", op); return NULL; }
    ctpu_safetensors *f = ctpu_safetensors_open(path);
    if (!f) {
        /* "safetensors_open: <path>: ..." -> "<op>: <path>: ..." */
        const char *m = ctpu_last_error();
        const char *rest = strncmp(m, "safetensors_open: ", 18) ? m : m + 18;
        ctpu_report_error(ctpu_last_status(), "%s: %s", op, rest);
    }
    return f;
}

/* Loads tl's tensors (every one checked first), then the scalar parts. */
static ctpu_status load_tensors(const reader *r, list *tl)
{
    ctpu_status st = ctpu_safetensors_load(r->f, tl->n, (const char *const *)tl->s, tl->t);
    if (st != CTPU_OK) {
        const char *m = ctpu_last_error();
        const char *rest = strncmp(m, "safetensors_load: ", 18) ? m : m + 18;
        ctpu_report_error(st, "%s: %s", r->op, rest);
    }
    return st;
}

ctpu_status ctpu_optim_load(ctpu_optim *o, const char *path)
{
    const char *op = "optim_load";
    if (!o) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: o is NULL", op);
    ctpu_safetensors *f = open_as(op, path);
    if (!f) return ctpu_last_status();
    reader r = { op, f, path };
    list tl = { 0 };
    ctpu__optim_hp hp = { 0 };
    ctpu_status st = optim_read(&r, o, &hp, &tl) ? load_tensors(&r, &tl) : ctpu_last_status();
    if (st == CTPU_OK) ctpu__optim_put(o, &hp);
    hp_free(&hp);
    list_free(&tl);
    ctpu_safetensors_close(f);
    return st;
}

ctpu_status ctpu_checkpoint_load(const char *path, int n, const char *const *names, const ctpu_tensor *params,
                                 ctpu_optim *o, ctpu_batch_iter *it)
{
    const char *op = "checkpoint_load";
    if (n < 0 || (n > 0 && (!names || !params)))
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: n=%d with names %s, params %s", op, n,
                                 names ? "given" : "NULL", params ? "given" : "NULL");
    for (int i = 0; i < n; i++)
        if (!names[i]) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: names[%d] is NULL", op, i);
    ctpu_safetensors *f = open_as(op, path);
    if (!f) return ctpu_last_status();
    reader r = { op, f, path };
    list tl = { 0 };
    ctpu__optim_hp hp = { 0 };
    ctpu_batch_iter_state ds = { 0 };
    uint64_t seed = 0, offset = 0;
    int64_t version = 0;
    bool ok = get_i64(&r, "ctpu.checkpoint", 1, &version);
    if (ok && version != 1) ok = bad_value(&r, "ctpu.checkpoint", ctpu_safetensors_metadata(f, "ctpu.checkpoint"), "1");
    ok = ok && get_u64(&r, "ctpu.rng.seed", &seed) && get_u64(&r, "ctpu.rng.offset", &offset);
    if (ok && it) {
        ok = get_i64(&r, "ctpu.data.n", 0, &ds.n) && get_i64(&r, "ctpu.data.batch", 1, &ds.batch) &&
             get_bool(&r, "ctpu.data.shuffle", &ds.shuffle) && get_bool(&r, "ctpu.data.drop_last", &ds.drop_last) &&
             get_u64(&r, "ctpu.data.seed", &ds.seed) && get_i64(&r, "ctpu.data.epoch", 0, &ds.epoch) &&
             get_i64(&r, "ctpu.data.position", 0, &ds.position);
        char pre[4200];
        snprintf(pre, sizeof pre, "%s: %.4096s", op, path);
        if (ok && ctpu__batch_iter_check(pre, it, &ds) != CTPU_OK) ok = false;
    }
    for (int i = 0; ok && i < n; i++) tensor_add(&tl, params[i], "%s", names[i]);
    if (ok && tl.oom) {
        ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory", op, path);
        ok = false;
    }
    if (ok && o) ok = optim_read(&r, o, &hp, &tl);
    ctpu_status st = ok ? load_tensors(&r, &tl) : ctpu_last_status();
    if (st == CTPU_OK) {
        if (o) ctpu__optim_put(o, &hp);
        if (it) ctpu_batch_iter_set_state(it, &ds);
        st = ctpu_rng_set_state(seed, offset);
    }
    hp_free(&hp);
    list_free(&tl);
    ctpu_safetensors_close(f);
    return st;
}
