/* Shape policies (issue 16; DESIGN.md "Observability"): per program
 * structure (the key without extents, ctpu_trace_struct_hash), the shapes
 * its traces took and the launches at each, and what a real TPU run would
 * have cost under three policies:
 *
 *   recompile    one program per shape: compiles = distinct shapes, each
 *                TORCH_TPU_COMPILE_SECONDS of chip time; every launch at
 *                its own extents
 *   pad_to_max   one program at the upper bound (a ctpu_mark_dynamic
 *                range's hi; for automatic and unmarked dims the largest
 *                extent seen); every launch padded to it
 *   bucket_pow2  every varying extent padded to the next power of two
 *                (the bound is the last bucket); one compile per bucket
 *
 * Device time per launch is the roofline estimate (src/cost) of the
 * program at the padded extents: the structure keeps its first trace as a
 * template, each extent of the template is fitted as a function of the
 * varying dims (constant, c * v, c * v^2, c * v * w, or a * v + b, checked
 * against every shape seen), and the template with the padded extents
 * substituted goes through the same cost function the compiler uses
 * (ctpu_cost_program_of). The records live under the report's lock. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "eager.h"
#include "policy.h"
#include "cost/costmodel.h"

#define MAX_STRUCTS 1024
#define MAX_SHAPES 4096
#define MAX_EXT 65536
#define MAX_SYMS 2

typedef struct {
    int64_t *ext;                      /* [n_ext] every extent: inputs' dims, then nodes' out dims */
    uint64_t launches, program, first_step, last;   /* last: the state's launch count at its latest launch */
    double est_s[CTPU_COST_MAX_CHIPS], flops, hbm_bytes;
    ctpu_policy_est *launch_est;       /* a dynamic launch's whole estimate, made at its first (or NULL) */
    bool static_prog;                  /* launched by a static program (not only bound from a dynamic one) */
} pshape;

typedef struct {
    uint64_t struct_hash, first_program;
    char ops[128];
    int n_in, n_nodes, n_out;
    ctpu_vtype *in_type;               /* the template: the first trace's types, nodes, outputs */
    ctpu_node *nodes;
    int32_t *outputs;
    size_t n_ext;
    int64_t *bound;                    /* [input positions] a mark's padded extent (coef x hi), 0: none */
    pshape *shapes;
    int n_shapes, cap;
    ctpu_policy_auto au;               /* automatic dynamic dims (TORCH_TPU_AUTO_DYNAMIC) */
    bool dynamic;                      /* launched through a dynamic program (ctpu_mark_dynamic or automatic) */
} pstruct;

struct ctpu_policy_state {
    pstruct *s;
    int n, cap;
    int32_t *by_prog;                  /* [n_prog] program id - 1 -> struct index * MAX_SHAPES + shape, or -1 */
    size_t n_prog;
    int n_chips, current;
    const ctpu_chip_info *chips[CTPU_COST_MAX_CHIPS];
    uint64_t seq;                      /* launches recorded */
    bool auto_dynamic;                 /* TORCH_TPU_AUTO_DYNAMIC: detect the first one-dim recompile */
};

ctpu_policy_state *ctpu__policy_create(const ctpu_chip_info *const *chips, int n_chips, int current, bool auto_dynamic)
{
    ctpu_policy_state *ps = calloc(1, sizeof *ps);
    if (!ps) return NULL;
    ps->auto_dynamic = auto_dynamic;
    ps->n_chips = n_chips < CTPU_COST_MAX_CHIPS ? n_chips : CTPU_COST_MAX_CHIPS;
    ps->current = current >= 0 && current < ps->n_chips ? current : 0;
    for (int c = 0; c < ps->n_chips; c++) ps->chips[c] = chips[c];
    return ps;
}

void ctpu__policy_free(ctpu_policy_state *ps)
{
    if (!ps) return;
    for (int i = 0; i < ps->n; i++) {
        pstruct *s = &ps->s[i];
        for (int j = 0; j < s->n_shapes; j++) {
            free(s->shapes[j].ext);
            if (s->shapes[j].launch_est) free(s->shapes[j].launch_est->ops);
            free(s->shapes[j].launch_est);
        }
        free(s->shapes);
        free(s->in_type);
        free(s->nodes);
        free(s->outputs);
        free(s->bound);
    }
    free(ps->s);
    free(ps->by_prog);
    free(ps);
}

void ctpu__policy_clear(ctpu_policy_state *ps)
{
    if (!ps) return;
    for (int i = 0; i < ps->n; i++)
        for (int j = 0; j < ps->s[i].n_shapes; j++) ps->s[i].shapes[j].launches = 0;
}

/* ------------------------------------------------------------ recording */
static size_t n_ext_of(const ctpu_trace *t)
{
    size_t n = 0;
    for (int i = 0; i < t->n_inputs; i++) n += t->in_type[i].ndim;
    for (int i = 0; i < t->n_nodes; i++) n += t->nodes[i].out.ndim;
    return n;
}

static void extents_of(const ctpu_trace *t, int64_t *x)
{
    size_t k = 0;
    for (int i = 0; i < t->n_inputs; i++)
        for (int d = 0; d < t->in_type[i].ndim; d++) x[k++] = t->in_type[i].shape[d];
    for (int i = 0; i < t->n_nodes; i++)
        for (int d = 0; d < t->nodes[i].out.ndim; d++) x[k++] = t->nodes[i].out.shape[d];
}

static pstruct *struct_get(ctpu_policy_state *ps, uint64_t sh, const ctpu_trace *t, uint64_t program)
{
    for (int i = 0; i < ps->n; i++)
        if (ps->s[i].struct_hash == sh) return &ps->s[i];
    if (ps->n == MAX_STRUCTS) return NULL;
    size_t ne = n_ext_of(t);
    if (ne == 0 || ne > MAX_EXT) return NULL;
    if (ps->n == ps->cap) {
        int nc = ps->cap ? ps->cap * 2 : 16;
        pstruct *ns = realloc(ps->s, (size_t)nc * sizeof *ns);
        if (!ns) return NULL;
        ps->s = ns;
        ps->cap = nc;
    }
    pstruct *s = &ps->s[ps->n];
    memset(s, 0, sizeof *s);
    s->in_type = malloc(sizeof(ctpu_vtype) * ((size_t)t->n_inputs + 1));
    s->nodes = malloc(sizeof(ctpu_node) * ((size_t)t->n_nodes + 1));
    s->outputs = malloc(sizeof(int32_t) * ((size_t)t->n_outputs + 1));
    size_t nin = 0;
    for (int i = 0; i < t->n_inputs; i++) nin += t->in_type[i].ndim;
    s->bound = calloc(nin + 1, sizeof *s->bound);
    if (!s->in_type || !s->nodes || !s->outputs || !s->bound) {
        free(s->in_type);
        free(s->nodes);
        free(s->outputs);
        free(s->bound);
        return NULL;
    }
    if (t->n_inputs) memcpy(s->in_type, t->in_type, sizeof(ctpu_vtype) * (size_t)t->n_inputs);
    if (t->n_nodes) memcpy(s->nodes, t->nodes, sizeof(ctpu_node) * (size_t)t->n_nodes);
    if (t->n_outputs) memcpy(s->outputs, t->outputs, sizeof(int32_t) * (size_t)t->n_outputs);
    s->n_in = t->n_inputs;
    s->n_nodes = t->n_nodes;
    s->n_out = t->n_outputs;
    s->n_ext = ne;
    s->struct_hash = sh;
    s->first_program = program;
    size_t k = 0;
    for (int i = 0; i < t->n_nodes && k < sizeof s->ops; i++) {
        if (i == 4) { snprintf(s->ops + k, sizeof s->ops - k, "→…"); break; }
        k += (size_t)snprintf(s->ops + k, sizeof s->ops - k, "%s%s", i ? "→" : "", ctpu_op_name(t->nodes[i].op));
    }
    ps->n++;
    return s;
}

/* The estimate of trace t (its own extents) on every profile. */
static void cost_of_arrays(const ctpu_policy_state *ps, const ctpu_node *nodes, int nn, const ctpu_vtype *in, int nin,
                           const int32_t *outs, int no, pshape *out)
{
    int nops = ctpu_cost_distinct_ops(nodes, nn);
    ctpu_cost_op *ops = malloc(sizeof *ops * (size_t)(nops + 1));
    ctpu_chip_info chips[CTPU_COST_MAX_CHIPS];
    for (int c = 0; c < ps->n_chips; c++) chips[c] = *ps->chips[c];
    memset(out->est_s, 0, sizeof out->est_s);
    out->flops = out->hbm_bytes = 0;
    if (!ops) return;
    ctpu_cost_program p;
    ctpu_cost_program_of(&p, chips, ps->n_chips, nodes, nn, in, nin, outs, no, ops);
    for (int c = 0; c < ps->n_chips; c++) out->est_s[c] = p.chip[c].total_s;
    out->flops = p.chip[0].flops;
    out->hbm_bytes = p.chip[0].hbm_bytes;
    free(ops);
}

/* A dynamic launch's whole estimate at t's own extents (the report adds it
 * per launch as it adds a static program's compile-time estimate). */
static ctpu_policy_est *launch_est_of(const ctpu_policy_state *ps, const ctpu_trace *t)
{
    int nops = ctpu_cost_distinct_ops(t->nodes, t->n_nodes);
    ctpu_cost_op *ops = malloc(sizeof *ops * (size_t)(nops + 1));
    ctpu_policy_est *e = calloc(1, sizeof *e);
    if (e) e->ops = calloc((size_t)nops + 1, sizeof *e->ops);
    if (!ops || !e || !e->ops) {
        free(ops);
        if (e) free(e->ops);
        free(e);
        return NULL;
    }
    ctpu_chip_info chips[CTPU_COST_MAX_CHIPS];
    for (int c = 0; c < ps->n_chips; c++) chips[c] = *ps->chips[c];
    ctpu_cost_program p;
    ctpu_cost_program_of(&p, chips, ps->n_chips, t->nodes, t->n_nodes, t->in_type, t->n_inputs, t->outputs,
                         t->n_outputs, ops);
    for (int c = 0; c < ps->n_chips && c < p.n_chips; c++) {
        e->est_s[c] = p.chip[c].total_s;
        e->macs_useful[c] = p.chip[c].macs_useful;
        e->macs_padded[c] = p.chip[c].macs_padded;
    }
    e->flops = p.chip[ps->current].flops;
    e->hbm_bytes = p.chip[ps->current].hbm_bytes;
    e->vector_ops = p.chip[ps->current].vector_ops;
    e->n_mm = p.n_mm;
    memcpy(e->mm, p.mm, sizeof e->mm);
    e->n_ops = p.n_ops;
    for (int i = 0; i < p.n_ops; i++)
        e->ops[i] = (struct ctpu_policy_op){ p.ops[i].op, p.ops[i].nodes, p.ops[i].s_f[ps->current] };
    free(ops);
    return e;
}

static pshape *shape_get(ctpu_policy_state *ps, pstruct *s, const ctpu_trace *t, uint64_t program, uint64_t step)
{
    if (n_ext_of(t) != s->n_ext) return NULL;
    int64_t *x = malloc(s->n_ext * sizeof *x);
    if (!x) return NULL;
    extents_of(t, x);
    for (int j = 0; j < s->n_shapes; j++)
        if (memcmp(s->shapes[j].ext, x, s->n_ext * sizeof *x) == 0) {
            free(x);
            if (program && !s->shapes[j].program) s->shapes[j].program = program;
            return &s->shapes[j];
        }
    if (s->n_shapes == MAX_SHAPES) { free(x); return NULL; }
    if (s->n_shapes == s->cap) {
        int nc = s->cap ? s->cap * 2 : 8;
        pshape *nsh = realloc(s->shapes, (size_t)nc * sizeof *nsh);
        if (!nsh) { free(x); return NULL; }
        s->shapes = nsh;
        s->cap = nc;
    }
    pshape *p = &s->shapes[s->n_shapes++];
    memset(p, 0, sizeof *p);
    p->ext = x;
    p->program = program;
    p->first_step = step;
    cost_of_arrays(ps, t->nodes, t->n_nodes, t->in_type, t->n_inputs, t->outputs, t->n_outputs, p);
    return p;
}

static void map_program(ctpu_policy_state *ps, uint64_t program, int si, int sj)
{
    if (!program || program > (1u << 22)) return;
    size_t idx = (size_t)program - 1;
    if (idx >= ps->n_prog) {
        size_t nn = idx + 1 > ps->n_prog * 2 ? idx + 1 : ps->n_prog * 2;
        int32_t *np = realloc(ps->by_prog, nn * sizeof *np);
        if (!np) return;
        for (size_t i = ps->n_prog; i < nn; i++) np[i] = -1;
        ps->by_prog = np;
        ps->n_prog = nn;
    }
    ps->by_prog[idx] = si * MAX_SHAPES + sj;
}

static void detect_auto(pstruct *s, const pshape *now, uint64_t program, uint64_t step);

const ctpu_policy_est *ctpu__policy_launch(ctpu_policy_state *ps, uint64_t struct_hash, const ctpu_trace *t,
                                           const int64_t *bound, uint64_t program, uint64_t step, bool recompile,
                                           bool dynamic)
{
    if (!ps || !struct_hash || !t) return NULL;
    pstruct *s = struct_get(ps, struct_hash, t, program);
    int before = s ? s->n_shapes : 0;
    pshape *p = s ? shape_get(ps, s, t, program, step) : NULL;
    if (!p) return NULL;   /* past the records' bounds: the report keeps the compile-time estimate */
    s->dynamic |= dynamic;
    size_t k = 0;
    for (int i = 0; bound && i < t->n_inputs && i < s->n_in; i++)
        for (int d = 0; d < t->in_type[i].ndim; d++, k++)
            if (bound[k] > s->bound[k]) s->bound[k] = bound[k];
    /* a new shape (ctpu__policy_auto_would may have added it, unlaunched),
     * or one only a dynamic program ran before (marks another loop over
     * the structure gave): new to its static programs */
    if (ps->auto_dynamic && recompile && !s->au.detected &&
        (s->n_shapes > before || p->launches == 0 || (!dynamic && !p->static_prog)))
        detect_auto(s, p, program, step);
    if (!dynamic) p->static_prog = true;
    p->launches++;
    p->last = ++ps->seq;
    map_program(ps, program, (int)(s - ps->s), (int)(p - s->shapes));
    if (dynamic && !p->launch_est) p->launch_est = launch_est_of(ps, t);
    return dynamic ? p->launch_est : NULL;
}

void ctpu__policy_hit(ctpu_policy_state *ps, uint64_t program)
{
    if (!ps || !program || program > ps->n_prog) return;
    int32_t v = ps->by_prog[program - 1];
    if (v < 0) return;
    pshape *p = &ps->s[v / MAX_SHAPES].shapes[v % MAX_SHAPES];
    p->launches++;
    p->last = ++ps->seq;
}

int ctpu__policy_auto_pairs(ctpu_policy_state *ps, uint64_t struct_hash, int *in, int *dim, int *coef, int max)
{
    ctpu_policy_auto *a = ctpu__policy_auto(ps, struct_hash);
    if (!a || !a->detected) return 0;
    int n = a->n_pairs < max ? a->n_pairs : max;
    for (int i = 0; i < n; i++) { in[i] = a->in[i]; dim[i] = a->dim[i]; coef[i] = a->coef[i]; }
    a->dynamic = true;
    return n;
}

ctpu_policy_auto *ctpu__policy_auto(ctpu_policy_state *ps, uint64_t struct_hash)
{
    if (!ps) return NULL;
    for (int i = 0; i < ps->n; i++)
        if (ps->s[i].struct_hash == struct_hash) return &ps->s[i].au;
    return NULL;
}

/* ------------------------------------------------------------ symbols and fits */
/* The varying dims of a structure: classes of extent positions whose
 * values are equal in every shape with launches (input dims first; node
 * dims only when no input dim varies). */
#define MAX_CLASSES 16
typedef struct {
    int n;                             /* symbols (the first classes, at most MAX_SYMS) */
    size_t pos[MAX_CLASSES];           /* each class's first position */
    int members[MAX_CLASSES];
    int total;                         /* classes found (MAX_CLASSES + 1: more) */
} symset;

typedef struct {
    uint8_t kind;                      /* 0 constant, 1 c * prod v^k, 2 a * v + b */
    uint8_t k[MAX_SYMS];
    uint8_t sym;
    double c, a, b;
} fit;

static size_t in_positions(const pstruct *s)
{
    size_t n = 0;
    for (int i = 0; i < s->n_in; i++) n += s->in_type[i].ndim;
    return n;
}

static bool varies(const pstruct *s, const int *live, int nl, size_t p)
{
    for (int j = 1; j < nl; j++)
        if (s->shapes[live[j]].ext[p] != s->shapes[live[0]].ext[p]) return true;
    return false;
}

static bool same_class(const pstruct *s, const int *live, int nl, size_t p, size_t q)
{
    for (int j = 0; j < nl; j++)
        if (s->shapes[live[j]].ext[p] != s->shapes[live[j]].ext[q]) return false;
    return true;
}

static double mono(const fit *f, const double *v, int nsym)
{
    double m = 1;
    for (int k = 0; k < nsym; k++)
        for (int e = 0; e < f->k[k]; e++) m *= v[k];
    return m;
}

static double fit_eval(const fit *f, const double *v, int nsym)
{
    if (f->kind == 0) return f->c;
    if (f->kind == 1) return f->c * mono(f, v, nsym);
    return f->a * v[f->sym] + f->b;
}

static bool fit_holds(const fit *f, const pstruct *s, const int *live, int nl, const symset *y, size_t p)
{
    for (int j = 0; j < nl; j++) {
        double v[MAX_SYMS];
        for (int k = 0; k < y->n; k++) v[k] = (double)s->shapes[live[j]].ext[y->pos[k]];
        double x = fit_eval(f, v, y->n);
        if (!(fabs(x - (double)s->shapes[live[j]].ext[p]) < 1e-6)) return false;
    }
    return true;
}

/* Position p as a function of the symbols; false if no form fits. */
static bool fit_position(const pstruct *s, const int *live, int nl, const symset *y, size_t p, fit *f)
{
    memset(f, 0, sizeof *f);
    const pshape *s0 = &s->shapes[live[0]];
    if (!varies(s, live, nl, p)) { f->c = (double)s0->ext[p]; return true; }
    /* monomials by total degree: c v, c w, c v^2, c v w, c w^2, ... */
    int nk = 1;
    for (int k = 0; k < y->n; k++) nk *= 3;
    for (int deg = 1; deg <= 2 * y->n; deg++)
        for (int code = 1; code < nk; code++) {
            int c = code, tot = 0;
            uint8_t k[MAX_SYMS] = { 0 };
            for (int q = 0; q < y->n; q++) { k[q] = (uint8_t)(c % 3); tot += k[q]; c /= 3; }
            if (tot != deg) continue;
            fit g = { .kind = 1 };
            memcpy(g.k, k, sizeof k);
            double v[MAX_SYMS];
            for (int q = 0; q < y->n; q++) v[q] = (double)s0->ext[y->pos[q]];
            double m = mono(&g, v, y->n);
            if (m == 0) continue;
            g.c = (double)s0->ext[p] / m;
            if (fit_holds(&g, s, live, nl, y, p)) { *f = g; return true; }
        }
    /* a * v + b through two shapes with different v */
    for (int q = 0; q < y->n; q++)
        for (int j = 1; j < nl; j++) {
            const pshape *s1 = &s->shapes[live[j]];
            double v0 = (double)s0->ext[y->pos[q]], v1 = (double)s1->ext[y->pos[q]];
            if (v0 == v1) continue;
            fit g = { .kind = 2, .sym = (uint8_t)q };
            g.a = ((double)s1->ext[p] - (double)s0->ext[p]) / (v1 - v0);
            g.b = (double)s0->ext[p] - g.a * v0;
            if (fit_holds(&g, s, live, nl, y, p)) { *f = g; return true; }
            break;
        }
    return false;
}

static void sym_name(const pstruct *s, size_t pos, char *b, size_t n)
{
    size_t k = 0;
    for (int i = 0; i < s->n_in; i++) {
        if (pos < k + s->in_type[i].ndim) { snprintf(b, n, "input %d dim %d", i, (int)(pos - k)); return; }
        k += s->in_type[i].ndim;
    }
    for (int i = 0; i < s->n_nodes; i++) {
        if (pos < k + s->nodes[i].out.ndim) {
            snprintf(b, n, "node %d (%s) dim %d", i, ctpu_op_name(s->nodes[i].op), (int)(pos - k));
            return;
        }
        k += s->nodes[i].out.ndim;
    }
    snprintf(b, n, "?");
}

/* The varying dims: input positions whose values vary, one symbol per
 * class of positions equal in every shape, a position that is c * v, c *
 * v^2 or c * v * w of the symbols so far (a flattened [B*T] of a varying T)
 * derived, not a symbol of its own; node positions only when no input
 * position varies. */
static void find_symbols(const pstruct *s, const int *live, int nl, symset *y)
{
    memset(y, 0, sizeof *y);
    size_t nin = in_positions(s);
    for (int pass = 0; pass < 2 && y->total == 0; pass++) {
        size_t lo = pass == 0 ? 0 : nin, hi = pass == 0 ? nin : s->n_ext;
        for (size_t p = lo; p < hi && y->total <= MAX_CLASSES; p++) {
            if (!varies(s, live, nl, p)) continue;
            int f = -1;
            for (int k = 0; k < y->total && f < 0; k++)
                if (same_class(s, live, nl, p, y->pos[k])) f = k;
            if (f >= 0) { y->members[f]++; continue; }
            fit g;
            if (y->total > 0 && y->total <= MAX_SYMS && fit_position(s, live, nl, y, p, &g) && g.kind == 1) continue;
            if (y->total < MAX_CLASSES) { y->pos[y->total] = p; y->members[y->total] = 1; }
            y->total++;
            y->n = y->total < MAX_SYMS ? y->total : MAX_SYMS;
        }
    }
}

/* The extent pad_to_max pads symbol k to: the largest extent seen, or a
 * ctpu_mark_dynamic range's padded hi on any input position of its class
 * (TorchTPU's bounded dynamism pads to the declared bound) when larger. *marked
 * says which. */
static double sym_bound(const pstruct *s, const int *live, int nl, const symset *y, int k, bool *marked)
{
    double mx = 0, hi = 0;
    for (int j = 0; j < nl; j++)
        if ((double)s->shapes[live[j]].ext[y->pos[k]] > mx) mx = (double)s->shapes[live[j]].ext[y->pos[k]];
    size_t nin = in_positions(s);
    for (size_t p = 0; p < nin; p++)
        if (s->bound[p] > 0 && (double)s->bound[p] > hi && same_class(s, live, nl, p, y->pos[k])) hi = (double)s->bound[p];
    *marked = hi > 0;
    return hi > mx ? hi : mx;
}

/* ------------------------------------------------------------ automatic dynamic dims */
/* A recompile of s into the new shape `now`: against the shape launched
 * last, did only one dim's extent change (every changed input extent of one
 * class, equal before and after, or derived from it as c * v)? The first
 * such recompile is recorded: the dims, the step, the extents. */
static const pshape *one_dim_change(const pstruct *s, const pshape *now, symset *y)
{
    const pshape *prev = NULL;
    for (int j = 0; j < s->n_shapes; j++)
        if (&s->shapes[j] != now && s->shapes[j].launches && (!prev || s->shapes[j].last > prev->last))
            prev = &s->shapes[j];
    if (!prev) return NULL;
    int live[2] = { (int)(prev - s->shapes), (int)(now - s->shapes) };
    find_symbols(s, live, 2, y);
    return y->total == 1 && y->pos[0] < in_positions(s) ? prev : NULL;
}

/* Input position p as (canonical input, dim). */
static void in_dim_of(const pstruct *s, size_t p, int *in, int *dim)
{
    int i = 0;
    while (i < s->n_in && p >= s->in_type[i].ndim) p -= s->in_type[i++].ndim;
    *in = i;
    *dim = (int)p;
}

/* The (canonical input, dim, coef) triples of the changed dim: its class
 * (coef 1), then the input extents derived from it as c x v (c an integer
 * >= 2; a flattened [B*T] of T), at most max. */
static int class_pairs(const pstruct *s, const pshape *prev, const pshape *now, const symset *y, int *in, int *dim,
                       int *coef, int max)
{
    int live[2] = { (int)(prev - s->shapes), (int)(now - s->shapes) };
    size_t nin = in_positions(s);
    int n = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t p = 0; p < nin && n < max; p++) {
            int64_t c = 1;
            if (pass == 0 && !same_class(s, live, 2, p, y->pos[0])) continue;
            if (pass == 1) {
                if (!varies(s, live, 2, p) || same_class(s, live, 2, p, y->pos[0])) continue;
                int64_t v0 = prev->ext[y->pos[0]], v1 = now->ext[y->pos[0]];
                if (v0 <= 0 || v1 <= 0 || prev->ext[p] % v0 || now->ext[p] % v1) continue;
                c = prev->ext[p] / v0;
                if (c < 2 || c != now->ext[p] / v1 || c > 2147483647) continue;
            }
            in_dim_of(s, p, &in[n], &dim[n]);
            if (coef) coef[n] = (int)c;
            n++;
        }
    return n;
}

int ctpu__policy_auto_would(ctpu_policy_state *ps, uint64_t struct_hash, const ctpu_trace *t, uint64_t step, int *in,
                            int *dim, int *coef, int max)
{
    if (!ps || !ps->auto_dynamic || !struct_hash || !t) return 0;
    pstruct *s = NULL;
    for (int i = 0; i < ps->n && !s; i++)
        if (ps->s[i].struct_hash == struct_hash) s = &ps->s[i];
    if (!s || s->au.detected) return 0;
    int before = s->n_shapes;
    pshape *now = shape_get(ps, s, t, 0, step);
    /* a shape seen before: not a new extent, unless only a dynamic program
     * ran it (a loop with ctpu_mark_dynamic's marks, then one without) */
    if (!now || (s->n_shapes == before && now->static_prog)) return 0;
    symset y;
    const pshape *prev = one_dim_change(s, now, &y);
    return prev ? class_pairs(s, prev, now, &y, in, dim, coef, max) : 0;
}

static void detect_auto(pstruct *s, const pshape *now, uint64_t program, uint64_t step)
{
    symset y;
    const pshape *prev = one_dim_change(s, now, &y);
    if (!prev) return;
    int live[2] = { (int)(prev - s->shapes), (int)(now - s->shapes) };
    ctpu_policy_auto *a = &s->au;
    a->detected = true;
    a->step = step;
    a->program = program;
    a->old_program = prev->program;
    a->from = prev->ext[y.pos[0]];
    a->to = now->ext[y.pos[0]];
    a->n_pairs = class_pairs(s, prev, now, &y, a->in, a->dim, a->coef, 16);
    size_t k = 0, nin = in_positions(s);
    a->dims[0] = 0;
    a->n_dims = 0;
    for (size_t p = 0; p < nin && k < sizeof a->dims; p++) {
        if (!same_class(s, live, 2, p, y.pos[0])) continue;
        char nm[64];
        sym_name(s, p, nm, sizeof nm);
        k += (size_t)snprintf(a->dims + k, sizeof a->dims - k, "%s%s", a->n_dims ? ", " : "", nm);
        a->n_dims++;
    }
    for (int q = 0; q < a->n_pairs && k < sizeof a->dims; q++)
        if (a->coef[q] > 1)
            k += (size_t)snprintf(a->dims + k, sizeof a->dims - k, ", input %d dim %d (%d x it)", a->in[q], a->dim[q],
                                  a->coef[q]);
}

/* ------------------------------------------------------------ policies */
typedef struct {
    double v[MAX_SYMS];
    pshape cost;
} padded;

typedef struct {
    const char *name;
    double compiles, compile_s, device_s[CTPU_COST_MAX_CHIPS], wasted_flops, wasted_hbm;
} policy_row;

static int64_t pow2_ceil(int64_t v, int64_t cap)
{
    if (v <= 1) return v;
    int64_t p = 1;
    while (p < v && p < ((int64_t)1 << 62)) p <<= 1;
    return p > cap ? cap : p;
}

/* The template's estimate with every position refitted at symbol values v. */
static bool cost_at(const ctpu_policy_state *ps, const pstruct *s, const fit *fits, const symset *y, const double *v,
                    pshape *out)
{
    ctpu_vtype *in = malloc(sizeof *in * ((size_t)s->n_in + 1));
    ctpu_node *nodes = malloc(sizeof *nodes * ((size_t)s->n_nodes + 1));
    bool ok = in && nodes;
    if (ok) {
        memcpy(in, s->in_type, sizeof *in * (size_t)s->n_in);
        memcpy(nodes, s->nodes, sizeof *nodes * (size_t)s->n_nodes);
        size_t k = 0;
        for (int i = 0; i < s->n_in && ok; i++)
            for (int d = 0; d < in[i].ndim && ok; d++, k++) {
                double x = nearbyint(fit_eval(&fits[k], v, y->n));
                ok = x >= 0 && x < 9e15;
                in[i].shape[d] = (int64_t)x;
            }
        for (int i = 0; i < s->n_nodes && ok; i++)
            for (int d = 0; d < nodes[i].out.ndim && ok; d++, k++) {
                double x = nearbyint(fit_eval(&fits[k], v, y->n));
                ok = x >= 0 && x < 9e15;
                nodes[i].out.shape[d] = (int64_t)x;
            }
        if (ok) cost_of_arrays(ps, nodes, s->n_nodes, in, s->n_in, s->outputs, s->n_out, out);
    }
    free(in);
    free(nodes);
    return ok;
}

/* The cost at v, from a small memo of the padded points evaluated so far. */
static const pshape *memo_cost(const ctpu_policy_state *ps, const pstruct *s, const fit *fits, const symset *y,
                               const double *v, padded *memo, int *n_memo, int cap)
{
    for (int i = 0; i < *n_memo; i++)
        if (memcmp(memo[i].v, v, sizeof(double) * (size_t)y->n) == 0) return &memo[i].cost;
    if (*n_memo == cap) return NULL;
    padded *m = &memo[*n_memo];
    memset(m, 0, sizeof *m);
    memcpy(m->v, v, sizeof(double) * (size_t)y->n);
    if (!cost_at(ps, s, fits, y, v, &m->cost)) return NULL;
    (*n_memo)++;
    return &m->cost;
}

static const char *policy_names[CTPU_POLICY_COUNT] = { "recompile", "pad_to_max", "bucket_pow2" };

const char *ctpu__policy_name(int i) { return i >= 0 && i < CTPU_POLICY_COUNT ? policy_names[i] : "?"; }

/* Rows for one structure: false (with a note) when the padded policies
 * cannot be estimated. */
static bool structure_rows(const ctpu_policy_state *ps, const pstruct *s, const int *live, int nl, const symset *y,
                           double compile_s, policy_row *rows, char *note, size_t nlen)
{
    memset(rows, 0, sizeof(policy_row) * CTPU_POLICY_COUNT);
    for (int i = 0; i < CTPU_POLICY_COUNT; i++) rows[i].name = policy_names[i];
    /* recompile: the shapes' own estimates */
    rows[0].compiles = nl;
    for (int j = 0; j < nl; j++)
        for (int c = 0; c < ps->n_chips; c++)
            rows[0].device_s[c] += (double)s->shapes[live[j]].launches * s->shapes[live[j]].est_s[c];
    rows[0].compile_s = rows[0].compiles * compile_s;
    note[0] = 0;
    if (y->total > MAX_SYMS) {
        snprintf(note, nlen, "%d dims vary independently: the padded policies are estimated for at most %d",
                 y->total, MAX_SYMS);
        return false;
    }
    fit *fits = malloc(sizeof *fits * s->n_ext);
    if (!fits) { snprintf(note, nlen, "out of host memory"); return false; }
    for (size_t p = 0; p < s->n_ext; p++)
        if (!fit_position(s, live, nl, y, p, &fits[p])) {
            char nm[96];
            sym_name(s, p, nm, sizeof nm);
            snprintf(note, nlen, "the extent of %s does not follow the varying dims (c*v, c*v^2, c*v*w or a*v+b): "
                     "the padded policies are not estimated", nm);
            free(fits);
            return false;
        }
    double vmax[MAX_SYMS];
    for (int k = 0; k < y->n; k++) {
        bool marked;
        vmax[k] = sym_bound(s, live, nl, y, k, &marked);
    }
    int cap = nl + 2;
    padded *memo = calloc((size_t)cap, sizeof *memo);
    double (*bk)[MAX_SYMS] = calloc((size_t)nl + 1, sizeof *bk);
    int n_memo = 0, n_bk = 0;
    bool ok = memo && bk;
    for (int j = 0; j < nl && ok; j++) {
        const pshape *sh = &s->shapes[live[j]];
        double L = (double)sh->launches, vb[MAX_SYMS];
        for (int k = 0; k < y->n; k++)
            vb[k] = (double)pow2_ceil(sh->ext[y->pos[k]], (int64_t)vmax[k]);
        const pshape *cm = memo_cost(ps, s, fits, y, vmax, memo, &n_memo, cap);
        const pshape *cb = cm ? memo_cost(ps, s, fits, y, vb, memo, &n_memo, cap) : NULL;
        if (!cm || !cb) { ok = false; break; }
        for (int c = 0; c < ps->n_chips; c++) {
            rows[1].device_s[c] += L * cm->est_s[c];
            rows[2].device_s[c] += L * cb->est_s[c];
        }
        rows[1].wasted_flops += L * (cm->flops - sh->flops);
        rows[1].wasted_hbm += L * (cm->hbm_bytes - sh->hbm_bytes);
        rows[2].wasted_flops += L * (cb->flops - sh->flops);
        rows[2].wasted_hbm += L * (cb->hbm_bytes - sh->hbm_bytes);
        bool seen = false;
        for (int q = 0; q < n_bk && !seen; q++) seen = memcmp(bk[q], vb, sizeof(double) * (size_t)y->n) == 0;
        if (!seen) memcpy(bk[n_bk++], vb, sizeof vb);
    }
    if (!ok && !note[0]) snprintf(note, nlen, "an extent at the padded size is out of range: the padded policies are not estimated");
    rows[1].compiles = 1;
    rows[2].compiles = n_bk;
    rows[1].compile_s = compile_s;
    rows[2].compile_s = n_bk * compile_s;
    free(memo);
    free(bk);
    free(fits);
    return ok;
}

static double usd(const ctpu_chip_info *c, ctpu_price_plan plan, double s)
{
    double p = c->usd_per_chip_hour[plan];
    return p > 0 ? s / 3600.0 * p : -1;
}

static cJSON *policy_json(const ctpu_policy_state *ps, const policy_row *r, ctpu_price_plan plan, int current)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "policy", r->name);
    cJSON_AddNumberToObject(o, "compiles", r->compiles);
    cJSON_AddNumberToObject(o, "compile_s", r->compile_s);
    cJSON_AddNumberToObject(o, "device_s", r->device_s[current]);
    cJSON_AddNumberToObject(o, "total_s", r->compile_s + r->device_s[current]);
    cJSON_AddNumberToObject(o, "usd", usd(ps->chips[current], plan, r->compile_s + r->device_s[current]));
    cJSON_AddNumberToObject(o, "wasted_flops", r->wasted_flops);
    cJSON_AddNumberToObject(o, "wasted_hbm_bytes", r->wasted_hbm);
    cJSON *cs = cJSON_AddArrayToObject(o, "chips");
    for (int c = 0; c < ps->n_chips; c++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "chip", ps->chips[c]->name);
        cJSON_AddNumberToObject(x, "device_s", r->device_s[c]);
        cJSON_AddNumberToObject(x, "total_s", r->compile_s + r->device_s[c]);
        cJSON_AddNumberToObject(x, "usd", usd(ps->chips[c], plan, r->compile_s + r->device_s[c]));
        cJSON_AddItemToArray(cs, x);
    }
    return o;
}

/* The advice line: the cheapest policy on the current chip (dollars when
 * the plan has a price, else seconds) and by how much. */
static int advise(const ctpu_policy_state *ps, const policy_row *rows, int n_rows, ctpu_price_plan plan, int current,
                  char *out, size_t len)
{
    const ctpu_chip_info *c = ps->chips[current];
    bool priced = c->usd_per_chip_hour[plan] > 0;
    double cost[CTPU_POLICY_COUNT];
    int best = 0;
    for (int i = 0; i < n_rows; i++) {
        double t = rows[i].compile_s + rows[i].device_s[current];
        cost[i] = priced ? usd(c, plan, t) : t;
        if (cost[i] < cost[best]) best = i;
    }
    size_t k = 0;
    char b[32];
    const policy_row *w = &rows[best];
    if (priced) snprintf(b, sizeof b, "$%.4g", cost[best]);
    else snprintf(b, sizeof b, "%.4g s", cost[best]);
    k += (size_t)snprintf(out + k, len - k, "cheapest on %s: %s (%s for this run, %.0f compile%s)", c->name, w->name, b,
                          w->compiles, w->compiles == 1 ? "" : "s");
    for (int i = 0; i < n_rows && k < len; i++) {
        if (i == best) continue;
        if (priced) snprintf(b, sizeof b, "$%.4g", cost[i]);
        else snprintf(b, sizeof b, "%.4g s", cost[i]);
        if (cost[i] == cost[best])
            k += (size_t)snprintf(out + k, len - k, "; %s costs the same (%s)", rows[i].name, b);
        else if (cost[best] > 0)
            k += (size_t)snprintf(out + k, len - k, "; %.3gx less than %s (%s)", cost[i] / cost[best], rows[i].name, b);
        else
            k += (size_t)snprintf(out + k, len - k, "; %s costs %s", rows[i].name, b);
    }
    /* compiles are paid once, device time per launch: the policy with the
     * least device time wins once the run is long enough */
    int fast = best;
    for (int i = 0; i < n_rows; i++) {
        double di = rows[i].device_s[current], df = rows[fast].device_s[current];
        bool tie = fabs(di - df) <= 1e-9 * df;
        if ((!tie && di < df) || (tie && rows[i].compiles < rows[fast].compiles)) fast = i;
    }
    double dd = rows[best].device_s[current] - rows[fast].device_s[current];
    if (fast != best && dd > 1e-9 * rows[best].device_s[current] && k < len) {
        double m = (rows[fast].compile_s - rows[best].compile_s) / dd;
        k += (size_t)snprintf(out + k, len - k, "; at this mix of extents %s (least device time) would be the "
                              "cheapest after %.3gx this run's launches", rows[fast].name, m);
    }
    return best;
}

static cJSON *structure_json(const ctpu_policy_state *ps, const pstruct *s, const int *live, int nl, double compile_s,
                             ctpu_price_plan plan, int current)
{
    symset y;
    find_symbols(s, live, nl, &y);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "program", (double)s->first_program);
    cJSON_AddStringToObject(o, "ops", s->ops);
    cJSON_AddNumberToObject(o, "n_ops", s->n_nodes);
    cJSON_AddBoolToObject(o, "dynamic", s->dynamic);
    cJSON *dims = cJSON_AddArrayToObject(o, "dims");
    double launches = 0;
    for (int j = 0; j < nl; j++) launches += (double)s->shapes[live[j]].launches;
    for (int k = 0; k < y.n; k++) {
        cJSON *d = cJSON_CreateObject();
        char nm[96];
        sym_name(s, y.pos[k], nm, sizeof nm);
        cJSON_AddStringToObject(d, "name", nm);
        cJSON_AddNumberToObject(d, "positions", y.members[k]);
        bool marked;
        double mx = sym_bound(s, live, nl, &y, k, &marked);
        cJSON_AddNumberToObject(d, "upper_bound", mx);
        cJSON_AddStringToObject(d, "bound", marked ? "ctpu_mark_dynamic hi" : "largest extent seen");
        cJSON_AddItemToArray(dims, d);
    }
    cJSON_AddNumberToObject(o, "shapes", nl);
    cJSON_AddNumberToObject(o, "launches", launches);
    /* the histogram, by the first dim's extent then the second's */
    int *ord = malloc(sizeof *ord * (size_t)nl);
    cJSON *h = cJSON_AddArrayToObject(o, "histogram");
    if (ord) {
        for (int j = 0; j < nl; j++) ord[j] = live[j];
        for (int i = 1; i < nl; i++)
            for (int j = i; j > 0; j--) {
                const pshape *a = &s->shapes[ord[j - 1]], *b = &s->shapes[ord[j]];
                int cmp = 0;
                for (int k = 0; k < y.n && !cmp; k++)
                    cmp = a->ext[y.pos[k]] < b->ext[y.pos[k]] ? -1 : a->ext[y.pos[k]] > b->ext[y.pos[k]];
                if (cmp <= 0) break;
                int t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t;
            }
        for (int j = 0; j < nl; j++) {
            const pshape *p = &s->shapes[ord[j]];
            cJSON *e = cJSON_CreateObject();
            cJSON *ex = cJSON_AddArrayToObject(e, "extent");
            for (int k = 0; k < y.n; k++) cJSON_AddItemToArray(ex, cJSON_CreateNumber((double)p->ext[y.pos[k]]));
            cJSON_AddNumberToObject(e, "launches", (double)p->launches);
            cJSON_AddNumberToObject(e, "program", (double)p->program);
            cJSON_AddNumberToObject(e, "est_s", p->est_s[current]);
            cJSON_AddItemToArray(h, e);
        }
        free(ord);
    }
    policy_row rows[CTPU_POLICY_COUNT];
    char note[256];
    bool all = structure_rows(ps, s, live, nl, &y, compile_s, rows, note, sizeof note);
    cJSON_AddBoolToObject(o, "estimated", all);
    cJSON_AddStringToObject(o, "note", note);
    cJSON *pj = cJSON_AddArrayToObject(o, "policies");
    int n_rows = all ? CTPU_POLICY_COUNT : 1;
    for (int i = 0; i < n_rows; i++) cJSON_AddItemToArray(pj, policy_json(ps, &rows[i], plan, current));
    char adv[512];
    int best = advise(ps, rows, n_rows, plan, current, adv, sizeof adv);
    cJSON_AddStringToObject(o, "cheapest", policy_names[best]);
    cJSON_AddStringToObject(o, "advice", adv);
    return o;
}

void ctpu__policy_json(cJSON *doc, const ctpu_policy_state *ps, double compile_s, ctpu_price_plan plan, int current)
{
    cJSON *sp = cJSON_AddObjectToObject(doc, "shape_policies");
    cJSON_AddNumberToObject(sp, "compile_seconds", compile_s);
    cJSON_AddStringToObject(sp, "compile_seconds_source", CTPU_COMPILE_SECONDS_SOURCE);
    cJSON_AddStringToObject(sp, "chip", ps && current < ps->n_chips ? ps->chips[current]->name : "");
    cJSON_AddStringToObject(sp, "price_plan", ctpu_price_plan_name(plan));
    cJSON *ad = cJSON_AddArrayToObject(sp, "auto_dynamic");
    for (int i = 0; ps && i < ps->n; i++) {
        const pstruct *s = &ps->s[i];
        if (!s->au.detected) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "program", (double)s->au.program);
        cJSON_AddNumberToObject(o, "old_program", (double)s->au.old_program);
        cJSON_AddStringToObject(o, "ops", s->ops);
        cJSON_AddStringToObject(o, "dims", s->au.dims);
        cJSON_AddNumberToObject(o, "n_dims", s->au.n_dims);
        cJSON_AddNumberToObject(o, "step", (double)s->au.step);
        cJSON_AddNumberToObject(o, "from", (double)s->au.from);
        cJSON_AddNumberToObject(o, "to", (double)s->au.to);
        cJSON_AddNumberToObject(o, "lo", 2);
        cJSON_AddNumberToObject(o, "hi", 2147483647.0);
        /* true once defer.c marks them in the later traces (ctpu_mark_dynamic's mechanism) */
        cJSON_AddBoolToObject(o, "dynamic", s->au.dynamic);
        cJSON_AddItemToArray(ad, o);
    }
    cJSON *arr = cJSON_AddArrayToObject(sp, "structures");
    if (!ps) return;
    for (int i = 0; i < ps->n; i++) {
        const pstruct *s = &ps->s[i];
        int *live = malloc(sizeof *live * ((size_t)s->n_shapes + 1));
        if (!live) continue;
        int nl = 0;
        for (int j = 0; j < s->n_shapes; j++)
            if (s->shapes[j].launches) live[nl++] = j;
        if (nl >= 2 || (nl == 1 && s->dynamic))
            cJSON_AddItemToArray(arr, structure_json(ps, s, live, nl, compile_s, plan, current));
        free(live);
    }
}
