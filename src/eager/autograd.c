/* Autograd: reverse mode on a tape.
 *
 * Every op and view reaches ctpu__ag_record (dispatch.c). When grad mode is
 * on and an input requires grad, it makes a tape node: the op's node (op,
 * attrs, types), its runtime scalars, one edge per input (the producing node,
 * or the leaf's accumulator) and handles of its own on the values its rule
 * needs (made global, so no scope releases them). The output record's `ag`
 * points at the node. Nodes are reference counted by the records they
 * produced and by their consumers' edges, so the tape lives exactly as long
 * as a handle depends on it (a step scope's end releases it), or until
 * backward frees its saved values.
 *
 * Backward walks the nodes reachable from the root in decreasing creation
 * order (a node's inputs are always older than it, so this is a topological
 * order, and a deterministic one), applies each node's rule with the public
 * ops (so backward lands in the same trace as forward), reduces broadcast
 * gradients back to each input's shape and accumulates them per edge.
 *
 * ctpu_assign is torch's copy_: with grad mode on it refuses a leaf that
 * requires grad and rebases any other dst onto a copy node (bw_assign;
 * ctpu__ag_assign). Saved values need no version counter: a saved handle
 * shares the storage, so assign copies (tensor.c, defer.c).
 *
 * The rule table below has an entry for every op: a rule and the values it
 * saves, or an explicit "no gradient". tests/test_autograd.c fails when an op
 * has neither. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eager.h"
#include "testing.h"

/* ------------------------------------------------------------ tape types */
typedef struct ag_leaf {
    atomic_int refs;
    bool alive;                 /* the leaf's record still exists */
    uint64_t self;              /* the leaf's handle id (compiled steps name it) */
    ctpu_tensor grad;           /* .grad (global handle) or null */
    ctpu_tensor gacc;           /* backward: this pass's sum */
    uint64_t touched;           /* backward pass id */
    ctpu_grad_hook hook;        /* ctpu_register_post_accumulate_grad_hook, or NULL */
    void *hook_ctx;
    uint64_t hook_pass;         /* backward: the pass hook_k was computed for */
    size_t hook_k;              /* backward: the last node (sorted order) with an edge to the leaf */
    uint64_t hook_done;         /* backward: the pass that already wrote .grad and called the hook */
} ag_leaf;

typedef struct ag_node ag_node;
typedef struct { ag_node *fn; ag_leaf *leaf; } ag_edge;
/* A backward rule (the table below). */
typedef bool (*bw_fn)(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin);

struct ag_node {
    atomic_int refs;
    uint64_t seq;               /* creation order */
    uint64_t mark;              /* backward pass id */
    bool freed;                 /* saved values released by backward */
    ctpu_node node;             /* op, attrs, n_in, out type */
    bw_fn rule;                 /* the op's rule, or assign's (bw_assign, a node of no op row's) */
    double scalars[CTPU_NODE_MAX_SCALARS];
    ctpu_vtype *in_type;        /* [n_in] */
    ag_edge *edge;              /* [n_in] */
    ctpu_tensor *saved;         /* [n_in + 1]: inputs, then the output */
    ctpu_tensor gacc;           /* backward: gradient of the output */
    ctpu_dyndim *dyn;           /* [(n_in + 1) * CTPU_MAX_DIMS] the inputs' then the output's dynamic dims
                                   (defer and fuse, ctpu_mark_dynamic), or NULL: all static */
};

/* What rec->ag points at. */
typedef struct { ag_node *fn; ag_leaf *leaf; } ag_meta;

static atomic_uint_fast64_t ag_seq = 1, ag_pass = 1;

/* This thread's no-grad depth: a part of its state (eager.h); 0 for a
 * thread that has none yet (the epoch is checked only when it is not 0). */
static int no_grad_depth(void)
{
    const ctpu_thread_state *ts = ctpu__ts;
    return ts->no_grad > 0 && ctpu_ts_current() == ts ? ts->no_grad : 0;
}

/* ------------------------------------------------------------ handles */
static ctpu_trec *rec_of(ctpu_tensor t) { return ctpu_slot(ctpu_handle_slot(t)); }

static void release_quiet(ctpu_tensor t)
{
    if (ctpu_is_valid(t)) ctpu_handle_release_rec(rec_of(t), ctpu_handle_slot(t));
}

/* A handle of our own on rec's value, in no scope. */
static ctpu_tensor own_handle(ctpu_trec *rec)
{
    ctpu_tensor h = ctpu_handle_view(rec, &rec->type, rec->off, "autograd");
    if (ctpu_is_null(h)) return h;
    rec_of(h)->scope_id = 0;
    /* a saved input keeps its ctpu_mark_dynamic dims: the backward reading
     * it is keyed with the symbol, not the extent (else sum(x * x) of a
     * marked x compiled its backward once per extent) */
    if (rec->dyn && !ctpu__rec_set_dyn(rec_of(h), rec->dyn, rec->type.ndim)) {
        release_quiet(h);
        return CTPU_NULL;
    }
    return h;
}

/* A second handle on t's value (current scope): makes aliases distinct, so
 * each accumulator owns exactly one handle. */
static ctpu_tensor dup_handle(ctpu_tensor t)
{
    ctpu_trec *r = rec_of(t);
    return ctpu_handle_view(r, &r->type, r->off, "autograd");
}

/* ------------------------------------------------------------ refcounts */
static void leaf_unref(ag_leaf *l)
{
    if (atomic_fetch_sub(&l->refs, 1) != 1) return;
    release_quiet(l->grad);
    release_quiet(l->gacc);
    free(l);
}

static void node_unref(ag_node *n)
{
    /* iterative: a long chain must not recurse */
    ag_node *stack_inl[64];
    ag_node **stack = stack_inl;
    size_t sp = 0, cap = 64;
    stack[sp++] = n;
    while (sp) {
        ag_node *x = stack[--sp];
        if (atomic_fetch_sub(&x->refs, 1) != 1) continue;
        for (int i = 0; i <= x->node.n_in; i++) release_quiet(x->saved[i]);
        release_quiet(x->gacc);
        for (int i = 0; i < x->node.n_in; i++) {
            if (x->edge[i].leaf) leaf_unref(x->edge[i].leaf);
            if (!x->edge[i].fn) continue;
            if (sp == cap) {
                size_t nc = cap * 2;
                ag_node **ns = stack == stack_inl ? malloc(nc * sizeof *ns) : realloc(stack, nc * sizeof *ns);
                if (!ns) continue; /* out of host memory: leak rather than crash */
                if (stack == stack_inl) memcpy(ns, stack_inl, sizeof stack_inl);
                stack = ns;
                cap = nc;
            }
            stack[sp++] = x->edge[i].fn;
        }
        free(x);
    }
    if (stack != stack_inl) free(stack);
}

void ctpu__ag_release(ctpu_trec *rec)
{
    ag_meta *m = rec->ag;
    rec->ag = NULL;
    if (!m) return;
    if (m->leaf) {
        m->leaf->alive = false;
        ctpu_tensor g = m->leaf->grad;
        m->leaf->grad = CTPU_NULL;
        ctpu_bind_bump();
        release_quiet(g);
        leaf_unref(m->leaf);
    }
    if (m->fn) node_unref(m->fn);
    free(m);
}

static bool meta_requires(const ag_meta *m) { return m && (m->fn || m->leaf); }

/* ------------------------------------------------------------ small op helpers */
static ctpu_tensor zero0(ctpu_tensor like)
{
    return ctpu_zeros(ctpu_dtype_of(like), 0, NULL);
}

/* in's shape with the node's reduced dims kept as extent 1 */
static void keep_shape(const ag_node *n, int64_t *shape, int *nd)
{
    const ctpu_vtype *in = &n->in_type[0];
    *nd = in->ndim;
    memcpy(shape, in->shape, sizeof(int64_t) * in->ndim);
    for (int i = 0; i < n->node.attr.n_dims; i++) shape[n->node.attr.dims[i]] = 1;
}

static ctpu_tensor to_keepdim(const ag_node *n, ctpu_tensor g)
{
    int64_t s[8];
    int nd;
    keep_shape(n, s, &nd);
    return ctpu_reshape(g, nd, s);
}

static ctpu_tensor expand_to_in(const ag_node *n, ctpu_tensor gk)
{
    return ctpu_expand(gk, n->in_type[0].ndim, n->in_type[0].shape);
}

static int64_t reduced_n(const ag_node *n)
{
    int64_t c = 1;
    for (int i = 0; i < n->node.attr.n_dims; i++) c *= n->in_type[0].shape[n->node.attr.dims[i]];
    return c;
}

static ctpu_tensor dispatch_node(ctpu_node *nd, int n_in, const ctpu_tensor *ts)
{
    ctpu_trec *in[CTPU_NODE_MAX_IN];
    for (int i = 0; i < n_in; i++) {
        in[i] = ctpu_rec_get(ts[i], ctpu_op_name(nd->op), "input", true);
        if (!in[i]) return ctpu_failed();
    }
    nd->n_in = (uint8_t)n_in;
    return ctpu_dispatch(nd, in, ts, NULL);
}

/* ------------------------------------------------------------ backward rules
 * A rule gets the node and the gradient of its output and fills gin[i] for
 * each input with need[i]; the caller reduces each to the input's shape and
 * dtype. Saved values: n->saved[i] (inputs), OUT(n) (the output). */

enum { AG_MISSING = 0, AG_RULE = 1, AG_NOGRAD = 2 };
enum { S_A = 1, S_B = 2, S_C = 4, S_D = 8, S_OUT = 0x80 };

typedef struct {
    uint8_t save;
    bw_fn fn;
} ag_rule;

#define IN(n, i) ((n)->saved[i])
#define OUT(n) ((n)->saved[(n)->node.n_in])
#define SC(n, i) ((n)->scalars[i])
#define SCALAR_FIRST(n) (((n)->node.attr.flags & CTPU_ATTR_SCALAR_FIRST) != 0)

static bool bw_neg(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)n; (void)need;
    gin[0] = ctpu_neg(g);
    return true;
}

static bool bw_abs(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_tensor x = IN(n, 0);
    gin[0] = ctpu_mul(g, ctpu_sub(ctpu_gt_scalar(x, 0), ctpu_lt_scalar(x, 0)));
    return true;
}

static bool bw_exp(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    gin[0] = ctpu_mul(g, OUT(n));
    return true;
}

static bool bw_log(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    gin[0] = ctpu_div(g, IN(n, 0));
    return true;
}

static bool bw_sqrt(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    gin[0] = ctpu_div(g, ctpu_mul_scalar(OUT(n), 2.0));
    return true;
}

static bool bw_rsqrt(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_tensor y = OUT(n);
    gin[0] = ctpu_mul(g, ctpu_mul_scalar(ctpu_mul(y, ctpu_mul(y, y)), -0.5));
    return true;
}

static bool bw_tanh(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_tensor y = OUT(n);
    gin[0] = ctpu_mul(g, ctpu_rsub_scalar(ctpu_mul(y, y), 1.0));
    return true;
}

static bool bw_sigmoid(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_tensor y = OUT(n);
    gin[0] = ctpu_mul(g, ctpu_mul(y, ctpu_rsub_scalar(y, 1.0)));
    return true;
}

/* torch's softplus_backward (beta 1, threshold 20): g where x > 20, else
 * g * sigmoid(x). */
static bool bw_softplus(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_tensor x = IN(n, 0);
    gin[0] = ctpu_where(ctpu_gt_scalar(x, 20.0), g, ctpu_mul(g, ctpu_sigmoid(x)));
    return true;
}

static bool bw_relu(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    gin[0] = ctpu_where(ctpu_gt_scalar(OUT(n), 0), g, zero0(g));
    return true;
}

static bool bw_gelu_tanh(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    const double k = 0.7978845608028654, c = 0.044715;
    ctpu_tensor x = IN(n, 0), x2 = ctpu_mul(x, x);
    ctpu_tensor t = ctpu_tanh(ctpu_mul_scalar(ctpu_mul(x, ctpu_add_scalar(ctpu_mul_scalar(x2, c), 1.0)), k));
    ctpu_tensor left = ctpu_mul_scalar(ctpu_add_scalar(t, 1.0), 0.5);
    ctpu_tensor du = ctpu_mul_scalar(ctpu_add_scalar(ctpu_mul_scalar(x2, 3.0 * c), 1.0), k);
    ctpu_tensor right = ctpu_mul(ctpu_mul_scalar(x, 0.5), ctpu_mul(ctpu_rsub_scalar(ctpu_mul(t, t), 1.0), du));
    gin[0] = ctpu_mul(g, ctpu_add(left, right));
    return true;
}

/* d/dx x Φ(x) = Φ(x) + x φ(x). In f32, Φ(x) = gelu(x) / x, the forward's
 * result (saved), where |x| >= 1e-30 (below, Φ(x) rounds to 0.5 in f32 and
 * gelu(x) / x would divide subnormals or 0/0: both sides of the quotient are
 * replaced there, so no NaN is made for debug checks to report): no erf
 * pass over the activations (SLEEF's erf was ~8% of a char_gpt training
 * step), and the forward's erfc keeps Φ accurate in the tail, where
 * (1 + erf(x / sqrt 2)) / 2 cancels (x = -5: ~10% off in f32). In bf16,
 * Φ(x) = (1 + erf(x / sqrt 2)) / 2, as before (a bf16 gelu(x) carries 8
 * bits; the quotient would divide a rounded gelu). */
static bool bw_gelu_erf(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_tensor x = IN(n, 0), cdf;
    if (ctpu_dtype_of(x) == CTPU_F32) {
        ctpu_tensor tiny = ctpu_lt_scalar(ctpu_abs(x), 1e-30);
        ctpu_tensor half = ctpu_full(CTPU_F32, 0, NULL, 0.5), one = ctpu_ones(CTPU_F32, 0, NULL);
        cdf = ctpu_div(ctpu_where(tiny, half, OUT(n)), ctpu_where(tiny, one, x));
    } else {
        cdf = ctpu_mul_scalar(ctpu_add_scalar(ctpu_erf(ctpu_mul_scalar(x, 0.7071067811865476)), 1.0), 0.5);
    }
    ctpu_tensor pdf = ctpu_mul_scalar(ctpu_exp(ctpu_mul_scalar(ctpu_mul(x, x), -0.5)), 0.3989422804014327);
    gin[0] = ctpu_mul(g, ctpu_add(cdf, ctpu_mul(x, pdf)));
    return true;
}

/* d/dx erf(x) = 2/sqrt(pi) exp(-x^2) */
static bool bw_erf(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_tensor x = IN(n, 0);
    gin[0] = ctpu_mul(g, ctpu_mul_scalar(ctpu_exp(ctpu_neg(ctpu_mul(x, x))), 1.1283791670955126));
    return true;
}

static bool bw_sin(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    gin[0] = ctpu_mul(g, ctpu_cos(IN(n, 0)));
    return true;
}

static bool bw_cos(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    gin[0] = ctpu_mul(g, ctpu_neg(ctpu_sin(IN(n, 0))));
    return true;
}

static bool bw_log1p(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    gin[0] = ctpu_div(g, ctpu_add_scalar(IN(n, 0), 1.0));
    return true;
}

/* d/dx expm1(x) = exp(x) = expm1(x) + 1 */
static bool bw_expm1(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    gin[0] = ctpu_mul(g, ctpu_add_scalar(OUT(n), 1.0));
    return true;
}

static bool bw_add(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)n;
    if (need[0]) gin[0] = g;
    if (need[1]) gin[1] = g;
    return true;
}

static bool bw_sub(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)n;
    if (need[0]) gin[0] = g;
    if (need[1]) gin[1] = ctpu_neg(g);
    return true;
}

static bool bw_mul(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    if (need[0]) gin[0] = ctpu_mul(g, IN(n, 1));
    if (need[1]) gin[1] = ctpu_mul(g, IN(n, 0));
    return true;
}

static bool bw_div(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    ctpu_tensor ga = ctpu_div(g, IN(n, 1));
    if (need[0]) gin[0] = ga;
    if (need[1]) gin[1] = ctpu_neg(ctpu_mul(ga, OUT(n)));
    return true;
}

/* as PyTorch: d/da is 0 where b == 0; d/db is 0 where a == 0 and b >= 0 */
static bool bw_pow(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    ctpu_tensor a = IN(n, 0), b = IN(n, 1);
    if (need[0])
        gin[0] = ctpu_where(ctpu_eq_scalar(b, 0), zero0(g),
                            ctpu_mul(g, ctpu_mul(b, ctpu_pow(a, ctpu_sub_scalar(b, 1.0)))));
    if (need[1])
        gin[1] = ctpu_where(ctpu_mul(ctpu_eq_scalar(a, 0), ctpu_ge_scalar(b, 0)), zero0(g),
                            ctpu_mul(g, ctpu_mul(OUT(n), ctpu_log(a))));
    return true;
}

/* ties split the gradient evenly, as PyTorch */
static bool bw_maxmin(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    ctpu_tensor a = IN(n, 0), b = IN(n, 1);
    bool mx = n->node.op == CTPU_OP_MAXIMUM;
    ctpu_tensor half = ctpu_mul_scalar(ctpu_eq(a, b), 0.5);
    if (need[0]) gin[0] = ctpu_mul(g, ctpu_add(mx ? ctpu_gt(a, b) : ctpu_lt(a, b), half));
    if (need[1]) gin[1] = ctpu_mul(g, ctpu_add(mx ? ctpu_lt(a, b) : ctpu_gt(a, b), half));
    return true;
}

static bool bw_add_scalar(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    gin[0] = n->node.op == CTPU_OP_SUB_SCALAR && SCALAR_FIRST(n) ? ctpu_neg(g) : g;
    return true;
}

static bool bw_mul_scalar(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    gin[0] = ctpu_mul_scalar(g, SC(n, 0));
    return true;
}

static bool bw_div_scalar(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    if (!SCALAR_FIRST(n)) gin[0] = ctpu_div_scalar(g, SC(n, 0));
    else gin[0] = ctpu_neg(ctpu_mul(ctpu_div(g, IN(n, 0)), OUT(n)));   /* s/a: -g s/a^2 = -(g/a) y */
    return true;
}

static bool bw_pow_scalar(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    double s = SC(n, 0);
    ctpu_tensor a = IN(n, 0);
    if (!SCALAR_FIRST(n)) {    /* a^s */
        gin[0] = s == 0 ? ctpu_mul_scalar(g, 0.0) : ctpu_mul(g, ctpu_mul_scalar(ctpu_pow_scalar(a, s - 1.0), s));
    } else {                   /* s^a */
        if (s == 0) gin[0] = ctpu_where(ctpu_ge_scalar(a, 0), zero0(g), ctpu_mul_scalar(ctpu_mul(g, OUT(n)), -INFINITY));
        else gin[0] = ctpu_mul(g, ctpu_mul_scalar(OUT(n), log(s)));
    }
    return true;
}

static bool bw_maxmin_scalar(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_tensor a = IN(n, 0);
    double s = SC(n, 0);
    ctpu_tensor m = n->node.op == CTPU_OP_MAXIMUM_SCALAR ? ctpu_gt_scalar(a, s) : ctpu_lt_scalar(a, s);
    gin[0] = ctpu_mul(g, ctpu_add(m, ctpu_mul_scalar(ctpu_eq_scalar(a, s), 0.5)));
    return true;
}

static bool bw_where(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    ctpu_tensor c = IN(n, 0);
    /* a float condition that requires grad (a mask computed from parameters) gets 0: where() is a step
     * in it, flat almost everywhere (torch takes only bool conditions, which have no gradient) */
    if (need[0]) gin[0] = ctpu_zeros(ctpu_dtype_of(g), n->in_type[0].ndim, n->in_type[0].shape);
    if (need[1]) gin[1] = ctpu_where(c, g, zero0(g));
    if (need[2]) gin[2] = ctpu_where(c, zero0(g), g);
    return true;
}

static bool bw_clamp(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_tensor x = IN(n, 0);
    ctpu_tensor in = ctpu_mul(ctpu_ge_scalar(x, SC(n, 0)), ctpu_le_scalar(x, SC(n, 1)));
    gin[0] = ctpu_where(in, g, zero0(g));
    return true;
}

static bool bw_identity(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)n; (void)need;
    gin[0] = g;   /* cast, copy, expand: the caller casts / sums back */
    return true;
}

/* ctpu_assign(dst, src) with grad mode on (torch's CopyBackwards): input 0
 * is dst's old history, which gets zeros (its value was overwritten), input
 * 1 is src, which gets the gradient. */
static bool bw_assign(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)n;
    if (need[0]) gin[0] = ctpu_zeros_like(g);
    if (need[1]) gin[1] = g;
    return true;
}

static bool bw_sum(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    gin[0] = expand_to_in(n, to_keepdim(n, g));
    return true;
}

static bool bw_mean(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    gin[0] = expand_to_in(n, to_keepdim(n, ctpu_div_scalar(g, (double)reduced_n(n))));
    return true;
}

/* amax/amin: the gradient is shared evenly among the tied extrema */
static bool bw_max_red(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_tensor mask = ctpu_eq(IN(n, 0), to_keepdim(n, OUT(n)));
    ctpu_tensor cnt = ctpu_sum(mask, n->node.attr.n_dims, n->node.attr.dims, true);
    gin[0] = ctpu_mul(mask, ctpu_div(to_keepdim(n, g), cnt));
    return true;
}

/* d prod / dx_i = prod of the others: y / x_i without zeros in the slice; with
 * one zero, the product of the nonzeros at the zero and 0 elsewhere; with
 * more, 0 (torch's prod_backward cases, as masks). */
static bool bw_prod(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_tensor x = IN(n, 0);
    int nd = n->node.attr.n_dims;
    const int *dims = n->node.attr.dims;
    ctpu_tensor zero = ctpu_eq_scalar(x, 0.0);
    ctpu_tensor one = ctpu_ones(ctpu_dtype_of(x), 0, NULL);
    ctpu_tensor x_nz = ctpu_where(zero, one, x);
    ctpu_tensor nz = ctpu_sum(zero, nd, dims, true);
    ctpu_tensor p_nz = ctpu_prod(x_nz, nd, dims, true);
    ctpu_tensor at_zero = ctpu_mul(p_nz, ctpu_eq_scalar(nz, 1.0));
    ctpu_tensor others = ctpu_where(zero, at_zero, ctpu_div(to_keepdim(n, OUT(n)), x_nz));
    gin[0] = ctpu_mul(others, to_keepdim(n, g));
    return true;
}

/* cumsum's gradient: the cumsum of g from the end of the dim */
static bool bw_cumsum(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_node nd = { .op = CTPU_OP_CUMSUM, .out = n->in_type[0], .attr = n->node.attr };
    nd.attr.flags ^= CTPU_ATTR_REVERSE;
    nd.out.dtype = (uint8_t)ctpu_dtype_of(g);
    gin[0] = dispatch_node(&nd, 1, &g);
    return true;
}

static bool bw_var(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_tensor x = IN(n, 0);
    double den = (double)(reduced_n(n) - n->node.attr.i64[0]);
    ctpu_tensor m = ctpu_mean(x, n->node.attr.n_dims, n->node.attr.dims, true);
    gin[0] = ctpu_mul(ctpu_sub(x, m), ctpu_mul_scalar(to_keepdim(n, g), 2.0 / den));
    return true;
}

static bool bw_softmax(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_tensor y = OUT(n);
    int d = n->node.attr.dims[0];
    ctpu_tensor s = ctpu_sum(ctpu_mul(g, y), 1, &d, true);
    gin[0] = ctpu_mul(y, ctpu_sub(g, s));
    return true;
}

static bool bw_log_softmax(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    int d = n->node.attr.dims[0];
    ctpu_tensor s = ctpu_sum(g, 1, &d, true);
    gin[0] = ctpu_sub(g, ctpu_mul(ctpu_exp(OUT(n)), s));
    return true;
}

static bool bw_reshape(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    gin[0] = ctpu_reshape(g, n->in_type[0].ndim, n->in_type[0].shape);
    return true;
}

static bool bw_permute(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    int inv[8];
    for (int d = 0; d < n->node.attr.n_dims; d++) inv[n->node.attr.dims[d]] = d;
    gin[0] = ctpu_permute(g, inv);
    return true;
}

static bool bw_slice(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    (void)need;
    ctpu_node nd = { .op = CTPU_OP_SLICE_BACKWARD, .out = n->in_type[0], .attr = n->node.attr };
    nd.out.dtype = (uint8_t)ctpu_dtype_of(g);
    gin[0] = dispatch_node(&nd, 1, &g);
    return true;
}

static bool bw_concat(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    int d = n->node.attr.extra;
    int64_t at = 0;
    for (int i = 0; i < n->node.n_in; i++) {
        int64_t len = n->in_type[i].shape[d];
        if (need[i]) gin[i] = ctpu_slice(g, d, at, at + len, 1);
        at += len;
    }
    return true;
}

static bool bw_embedding(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    if (!need[0]) return true;
    ctpu_node nd = { .op = CTPU_OP_EMBEDDING_BACKWARD, .out = n->in_type[0] };
    nd.out.dtype = (uint8_t)ctpu_dtype_of(g);
    ctpu_tensor ts[2] = { g, IN(n, 1) };
    gin[0] = dispatch_node(&nd, 2, ts);
    return true;
}

static bool bw_gather(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    if (!need[0]) return true;
    ctpu_node nd = { .op = CTPU_OP_GATHER_BACKWARD, .out = n->in_type[0] };
    nd.out.dtype = (uint8_t)ctpu_dtype_of(g);
    nd.attr.extra = n->node.attr.extra;
    ctpu_tensor ts[2] = { g, IN(n, 1) };
    gin[0] = dispatch_node(&nd, 2, ts);
    return true;
}

/* scatter_add: d self = g; d src = g gathered at the index (zeros where src
 * is larger than the index, as those elements are not added). */
static bool bw_scatter_add(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    if (need[0]) gin[0] = g;
    if (!need[2]) return true;
    int dim = n->node.attr.extra;
    ctpu_tensor gs = ctpu_gather(g, dim, IN(n, 1));
    const ctpu_vtype *st = &n->in_type[2], *it = &n->in_type[1];
    for (int d = 0; d < st->ndim && !ctpu_is_null(gs); d++) {
        if (it->shape[d] == st->shape[d]) continue;
        int64_t zs[CTPU_MAX_DIMS];
        int znd;
        ctpu_shape(gs, zs, &znd);
        zs[d] = st->shape[d] - it->shape[d];
        ctpu_tensor parts[2] = { gs, ctpu_zeros(ctpu_dtype_of(gs), znd, zs) };
        gs = ctpu_concat(2, parts, d);
    }
    gin[2] = gs;
    return true;
}

/* C = op(A) op(B): d op(A) = g op(B)ᵀ, d op(B) = op(A)ᵀ g, through the
 * transposed-operand kernels; broadcast batch dims are summed by the caller. */
static bool bw_matmul(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    bool ta = (n->node.attr.flags & CTPU_ATTR_TRANS_A) != 0, tb = (n->node.attr.flags & CTPU_ATTR_TRANS_B) != 0;
    int p = n->node.attr.extra;
    ctpu_tensor a = IN(n, 0), b = IN(n, 1);
    if (need[0]) gin[0] = ta ? ctpu__matmul_t(b, g, tb, true, p) : ctpu__matmul_t(g, b, false, !tb, p);
    if (need[1] && !ta && ctpu_ndim(a) >= 3 && ctpu_ndim(b) == 2) {
        /* [..., M, K] @ [K, N] (or [N, K] transposed): torch's matmul folds
         * a's batch dims into its rows, so b's gradient is one product that
         * contracts over every row of the batch (K = batch x M, the MXU's one
         * K order), not a batched product and a sum over the batch (issue
         * 14: char_gpt's weight gradients were 32 products of K = T each and
         * a reduction over 32 copies of the weight) */
        int64_t s[CTPU_MAX_DIMS];
        int nd = 0;
        if (ctpu_shape(a, s, &nd) != CTPU_OK) return false;
        int64_t ka = s[nd - 1];
        if (ctpu_shape(g, s, &nd) != CTPU_OK) return false;
        int64_t n = s[nd - 1], rows = ka > 0 ? ctpu_numel(a) / ka : 0, fa[2] = { rows, ka }, fg[2] = { rows, n };
        if (rows > 0 && ka > 0 && n > 0) {
            /* the flattening takes the reshape probe's dims, not the tape
             * entry's hint: at T = K / B the flat [B*T, K] is b's static
             * shape, and the hint would make it static (a program per T) */
            ctpu_thread_state *ts = ctpu__ts;
            const void *hint = ts->ag_hint;
            if (hint) ts->ag_hint = NULL;
            ctpu_tensor af = ctpu_reshape(a, 2, fa), gf = ctpu_reshape(g, 2, fg);
            if (hint) ts->ag_hint = hint;
            gin[1] = tb ? ctpu__matmul_t(gf, af, true, false, p) : ctpu__matmul_t(af, gf, true, false, p);
            return true;
        }
    }
    if (need[1]) gin[1] = tb ? ctpu__matmul_t(g, a, true, ta, p) : ctpu__matmul_t(a, g, !ta, false, p);
    return true;
}

/* scaled_dot_product_attention: one sdpa_backward node (attention.c) from
 * the saved q, k, v, mask and packed o|lse; an additive mask's gradient is
 * not computed (an error when the mask requires grad). */
static bool bw_sdpa(const ag_node *n, ctpu_tensor g, const bool *need, ctpu_tensor *gin)
{
    if (n->node.n_in > 3 && need[3]) {
        char tb[128];
        ctpu_set_error(CTPU_ERR_STATE, "scaled_dot_product_attention: the mask (%s) requires grad: its gradient is "
                       "not computed (only q's, k's and v's; detach it or set requires_grad false)",
                       ctpu_fmt_type(&n->in_type[3], tb, sizeof tb));
        return false;
    }
    ctpu_tensor ins[4] = { IN(n, 0), IN(n, 1), IN(n, 2), n->node.n_in > 3 ? IN(n, 3) : CTPU_NULL };
    return ctpu__sdpa_backward(&n->node, n->scalars, ins, OUT(n), g, &gin[0], &gin[1], &gin[2]);
}

/* One rule per op whose row says CTPU_GRAD_RULE (ops.h); ops without a
 * gradient (CTPU_GRAD_NONE) have no entry. tests/test_autograd.c checks both. */
#define R(f, s) { (s), (f) }

static const ag_rule ag_rules[CTPU_OP_COUNT] = {
    [CTPU_OP_NEG] = R(bw_neg, 0),
    [CTPU_OP_ABS] = R(bw_abs, S_A),
    [CTPU_OP_EXP] = R(bw_exp, S_OUT),
    [CTPU_OP_LOG] = R(bw_log, S_A),
    [CTPU_OP_SQRT] = R(bw_sqrt, S_OUT),
    [CTPU_OP_RSQRT] = R(bw_rsqrt, S_OUT),
    [CTPU_OP_TANH] = R(bw_tanh, S_OUT),
    [CTPU_OP_SIGMOID] = R(bw_sigmoid, S_OUT),
    [CTPU_OP_SOFTPLUS] = R(bw_softplus, S_A),
    [CTPU_OP_RELU] = R(bw_relu, S_OUT),
    [CTPU_OP_GELU_TANH] = R(bw_gelu_tanh, S_A),
    [CTPU_OP_GELU_ERF] = R(bw_gelu_erf, S_A | S_OUT),
    [CTPU_OP_ERF] = R(bw_erf, S_A),
    [CTPU_OP_SIN] = R(bw_sin, S_A),
    [CTPU_OP_COS] = R(bw_cos, S_A),
    [CTPU_OP_LOG1P] = R(bw_log1p, S_A),
    [CTPU_OP_EXPM1] = R(bw_expm1, S_OUT),
    [CTPU_OP_ADD] = R(bw_add, 0),
    [CTPU_OP_SUB] = R(bw_sub, 0),
    [CTPU_OP_MUL] = R(bw_mul, S_A | S_B),
    [CTPU_OP_DIV] = R(bw_div, S_B | S_OUT),
    [CTPU_OP_POW] = R(bw_pow, S_A | S_B | S_OUT),
    [CTPU_OP_MAXIMUM] = R(bw_maxmin, S_A | S_B),
    [CTPU_OP_MINIMUM] = R(bw_maxmin, S_A | S_B),
    [CTPU_OP_ADD_SCALAR] = R(bw_add_scalar, 0),
    [CTPU_OP_SUB_SCALAR] = R(bw_add_scalar, 0),
    [CTPU_OP_MUL_SCALAR] = R(bw_mul_scalar, 0),
    [CTPU_OP_DIV_SCALAR] = R(bw_div_scalar, S_A | S_OUT),
    [CTPU_OP_POW_SCALAR] = R(bw_pow_scalar, S_A | S_OUT),
    [CTPU_OP_MAXIMUM_SCALAR] = R(bw_maxmin_scalar, S_A),
    [CTPU_OP_MINIMUM_SCALAR] = R(bw_maxmin_scalar, S_A),
    [CTPU_OP_WHERE] = R(bw_where, S_A),
    [CTPU_OP_CLAMP] = R(bw_clamp, S_A),
    [CTPU_OP_CAST] = R(bw_identity, 0),
    [CTPU_OP_SUM] = R(bw_sum, 0),
    [CTPU_OP_MEAN] = R(bw_mean, 0),
    [CTPU_OP_MAX] = R(bw_max_red, S_A | S_OUT),
    [CTPU_OP_MIN] = R(bw_max_red, S_A | S_OUT),
    [CTPU_OP_VAR] = R(bw_var, S_A),
    [CTPU_OP_PROD] = R(bw_prod, S_A | S_OUT),
    [CTPU_OP_CUMSUM] = R(bw_cumsum, 0),
    [CTPU_OP_SOFTMAX] = R(bw_softmax, S_OUT),
    [CTPU_OP_LOG_SOFTMAX] = R(bw_log_softmax, S_OUT),
    [CTPU_OP_RESHAPE] = R(bw_reshape, 0),
    [CTPU_OP_PERMUTE] = R(bw_permute, 0),
    [CTPU_OP_SLICE] = R(bw_slice, 0),
    [CTPU_OP_CONCAT] = R(bw_concat, 0),
    [CTPU_OP_EXPAND] = R(bw_identity, 0),
    [CTPU_OP_EMBEDDING] = R(bw_embedding, S_B),
    [CTPU_OP_GATHER] = R(bw_gather, S_B),
    [CTPU_OP_SCATTER_ADD] = R(bw_scatter_add, S_B),
    [CTPU_OP_MATMUL] = R(bw_matmul, S_A | S_B),
    [CTPU_OP_SDPA] = R(bw_sdpa, S_A | S_B | S_C | S_D | S_OUT),
};

/* AG_RULE / AG_NOGRAD as the op's row says, AG_MISSING when this table
 * disagrees with the row (a rule missing, or one for an op without gradient). */
int ctpu__ag_rule_kind(int op)
{
    if (op < 0 || op >= CTPU_OP_COUNT) return AG_MISSING;
    bool has = ag_rules[op].fn != NULL;
    if (ctpu_op_has_grad(op)) return has ? AG_RULE : AG_MISSING;
    return has ? AG_MISSING : AG_NOGRAD;
}

/* ------------------------------------------------------------ recording */
void ctpu__test_op_trace(uint64_t *buf, size_t cap)
{
    ctpu_thread_state *ts = ctpu__ts_get();
    if (!ts) return;
    ts->op_trace.buf = buf;
    ts->op_trace.cap = buf ? cap : 0;
    ts->op_trace.n = 0;
}

size_t ctpu__test_op_trace_len(void) { return ctpu__ts->op_trace.n; }

/* Dynamic dims in backward: while node x's rule runs, a tensor it makes at
 * the shape of one of x's inputs (or of its output) takes that value's
 * dynamic dims (dispatch.c asks, for nodes whose extents come from their
 * arguments or their builder). */
static void ts_hint_set(ag_node *x)
{
    ctpu_thread_state *ts = ctpu__ts;
    const void *h = x && x->dyn ? x : NULL;
    if (ts->ag_hint != h) ts->ag_hint = h;   /* (written only when it changes: a thread without state has a constant one) */
}

int ctpu__ag_hint_dyn(const ctpu_vtype *t, ctpu_dyndim *out)
{
    const ag_node *x = ctpu__ts->ag_hint;
    if (!x) return 0;
    /* the inputs first, a static one included (slice_backward of a position
     * table sliced whole, at T = ctx: the table's shape, not the slice's
     * dims), then the output */
    for (int i = 0; i <= x->node.n_in; i++) {
        const ctpu_vtype *v = i < x->node.n_in ? &x->in_type[i] : &x->node.out;
        const ctpu_dyndim *d = x->dyn + i * CTPU_MAX_DIMS;
        if (v->ndim != t->ndim) continue;
        bool same = true, any = false;
        for (int k = 0; k < t->ndim && same; k++) { same = v->shape[k] == t->shape[k]; any |= d[k].coef > 0; }
        if (!same) continue;
        if (!any) {
            if (i < x->node.n_in) return -1;
            continue;
        }
        memcpy(out, d, sizeof(ctpu_dyndim) * CTPU_MAX_DIMS);
        return 1;
    }
    return 0;
}

/* A tape node for `node` (rule fn, saving the values `save` names) from
 * inputs, made out's history (its old metadata dropped after the edges
 * took their references). Out of host memory: out does not require grad. */
static void tape_node(const ctpu_node *node, bw_fn fn, unsigned save, const ctpu_tensor *inputs,
                      const double *scalars, ctpu_tensor out)
{
    int n_in = node->n_in;
    bool has_dyn = rec_of(out)->dyn != NULL;
    for (int i = 0; i < n_in; i++) has_dyn |= rec_of(inputs[i])->dyn != NULL;
    size_t bytes = sizeof(ag_node) + (size_t)n_in * (sizeof(ctpu_vtype) + sizeof(ag_edge)) +
                   (size_t)(n_in + 1) * sizeof(ctpu_tensor) +
                   (has_dyn ? (size_t)(n_in + 1) * CTPU_MAX_DIMS * sizeof(ctpu_dyndim) : 0);
    ag_node *n = calloc(1, bytes);
    ag_meta *m = malloc(sizeof *m);
    ctpu_trec *orec = rec_of(out);
    if (!n || !m) {
        free(n);
        free(m);
        if (orec->ag) ctpu__ag_release(orec);
        return;
    }
    n->in_type = (ctpu_vtype *)(n + 1);
    n->edge = (ag_edge *)(n->in_type + n_in);
    n->saved = (ctpu_tensor *)(n->edge + n_in);
    if (has_dyn) {
        n->dyn = (ctpu_dyndim *)(n->saved + n_in + 1);
        for (int i = 0; i <= n_in; i++) {
            const ctpu_trec *r = rec_of(i < n_in ? inputs[i] : out);
            if (r->dyn) memcpy(n->dyn + i * CTPU_MAX_DIMS, r->dyn, sizeof(ctpu_dyndim) * CTPU_MAX_DIMS);
        }
    }
    atomic_init(&n->refs, 1);
    n->seq = atomic_fetch_add(&ag_seq, 1);
    n->node = *node;
    n->rule = fn;
    for (int i = 0; i < node->n_scalars && scalars; i++) n->scalars[i] = scalars[i];
    for (int i = 0; i < n_in; i++) {
        ctpu_trec *r = rec_of(inputs[i]);
        n->in_type[i] = r->type;
        ag_meta *im = r->ag;
        if (meta_requires(im)) {
            if (im->fn) { n->edge[i].fn = im->fn; atomic_fetch_add(&im->fn->refs, 1); }
            else { n->edge[i].leaf = im->leaf; atomic_fetch_add(&im->leaf->refs, 1); }
        }
        if (save & (1u << i)) n->saved[i] = own_handle(r);
    }
    if (save & S_OUT) n->saved[n_in] = own_handle(orec);
    if (orec->ag) ctpu__ag_release(orec);
    m->fn = n;
    m->leaf = NULL;
    orec->ag = m;
}

void ctpu__ag_record(const ctpu_node *node, const ctpu_tensor *inputs, const double *scalars, ctpu_tensor out)
{
    ctpu_thread_state *ts = ctpu__ts;
    if (ts->op_trace.buf && ts->op_trace.n < ts->op_trace.cap) {
        uint64_t h = 1469598103934665603ull;
        for (int d = 0; d < node->out.ndim; d++) h = (h ^ (uint64_t)node->out.shape[d]) * 1099511628211ull;
        ts->op_trace.buf[ts->op_trace.n++] = node->op | (uint64_t)node->out.dtype << 16 |
                                             (uint64_t)node->n_in << 24 | (h << 32);
    }
    if (node->n_in == 0 || no_grad_depth() > 0) return;
    const ag_rule *rule = &ag_rules[node->op];
    if (!ctpu_op_has_grad(node->op) || !rule->fn || node->out.dtype == CTPU_I32) return;
    bool any = false;
    for (int i = 0; i < node->n_in && !any; i++) any = meta_requires(rec_of(inputs[i])->ag);
    if (any) tape_node(node, rule->fn, rule->save, inputs, scalars, out);
}

/* ------------------------------------------------------------ assign */
ctpu_status ctpu__ag_assign_check(const ctpu_trec *dst)
{
    const ag_meta *m = dst->ag;
    if (no_grad_depth() > 0 || !m || !m->leaf) return CTPU_OK;
    char tb[128];
    const char *nm = ctpu_rec_name(dst);
    ctpu_set_error(CTPU_ERR_STATE,
                   "assign: dst %s%s%s%s is a leaf that requires grad: an in-place write to it with grad mode on is "
                   "refused, as torch refuses it (assign under ctpu_no_grad_begin/end, as optimizers do)",
                   ctpu_fmt_type(&dst->type, tb, sizeof tb), nm[0] ? " (\"" : "", nm, nm[0] ? "\")" : "");
    return CTPU_ERR_STATE;
}

/* dst's history rebased (torch's dst.copy_(src)): dst requires grad when it
 * or src did, its node's edges are its old history (zeros) and src (the
 * gradient); nothing saved. Without grad mode dst keeps its history, as
 * torch's in-place write under no_grad keeps grad_fn (the values that
 * history saved are its own: CONTRACTS.md "Scopes, autograd, optimizers"). */
int ctpu__ag_kind(const ctpu_trec *r)
{
    const ag_meta *m = r->ag;
    return !meta_requires(m) ? 0 : m->leaf ? 1 : 2;
}

/* Compiled steps guard autograd history made before a call (a non-leaf
 * input's: its node and what it reaches), which a capture whose backward
 * runs through it bakes. Backward passes from here on have ids >= this;
 * nodes made from here on, creation numbers >= the next. */
uint64_t ctpu__ag_pass_next(void) { return atomic_load(&ag_pass); }
uint64_t ctpu__ag_seq_next(void) { return atomic_load(&ag_seq); }

/* r's history: its node's creation number (unique: a node made later has
 * another), 0 for a leaf or no grad. */
uint64_t ctpu__ag_history_id(const ctpu_trec *r)
{
    const ag_meta *m = r->ag;
    return m && m->fn ? m->fn->seq : 0;
}

/* Whether a backward pass numbered pass0 or later walked r's node. */
bool ctpu__ag_history_reached(const ctpu_trec *r, uint64_t pass0)
{
    const ag_meta *m = r->ag;
    return m && m->fn && m->fn->mark >= pass0;
}

bool ctpu__ag_assign_records(const ctpu_trec *d, const ctpu_trec *s)
{
    const ag_meta *dm = d->ag;
    if (no_grad_depth() > 0 || (dm && dm->leaf)) return false;
    return meta_requires(dm) || meta_requires(s->ag);
}

void ctpu__ag_assign(ctpu_tensor dst, ctpu_tensor src)
{
    ctpu_trec *d = rec_of(dst), *s = rec_of(src);
    const ag_meta *dm = d->ag;
    if (no_grad_depth() > 0 || (dm && dm->leaf)) return;
    if (!meta_requires(dm) && !meta_requires(s->ag)) return;
    ctpu_node node = { .op = CTPU_OP_COPY, .n_in = 2, .out = d->type };
    ctpu_tensor in[2] = { dst, src };
    tape_node(&node, bw_assign, 0, in, NULL, dst);
}

/* ------------------------------------------------------------ public: flags */
ctpu_status ctpu_set_requires_grad(ctpu_tensor t, bool requires_grad)
{
    ctpu_trec *r = ctpu_rec_get(t, "set_requires_grad", "t", false);
    if (!r) return ctpu_last_status();
    ctpu_bind_bump();   /* a leaf made or dropped: what a compiled step's .grads bind to */
    char tb[128];
    ag_meta *m = r->ag;
    if (requires_grad) {
        if (r->type.dtype == CTPU_I32) {
            ctpu_set_error(CTPU_ERR_DTYPE, "set_requires_grad: t is %s: only f32/bf16 tensors can require grad",
                           ctpu_fmt_type(&r->type, tb, sizeof tb));
            return CTPU_ERR_DTYPE;
        }
        if (meta_requires(m)) return CTPU_OK;
        /* inside a capture, a tensor made before the call: a host effect no replay repeats */
        if (ctpu__capturing() && !ctpu__capture_note_requires_grad(r)) return ctpu_last_status();
        ag_leaf *l = calloc(1, sizeof *l);
        if (!m) m = calloc(1, sizeof *m);
        if (!l || !m) {
            free(l);
            if (m != r->ag) free(m);
            ctpu_set_error(CTPU_ERR_OOM, "set_requires_grad: out of host memory");
            return CTPU_ERR_OOM;
        }
        atomic_init(&l->refs, 1);
        l->alive = true;
        l->self = t.id;
        m->leaf = l;
        r->ag = m;
        return CTPU_OK;
    }
    if (!m) return CTPU_OK;
    if (m->fn) {
        ctpu_set_error(CTPU_ERR_STATE,
                       "set_requires_grad: t %s is not a leaf (it was computed from tensors that require grad); "
                       "use ctpu_detach", ctpu_fmt_type(&r->type, tb, sizeof tb));
        return CTPU_ERR_STATE;
    }
    if (meta_requires(m) && ctpu__capturing() && !ctpu__capture_note_requires_grad(r)) return ctpu_last_status();
    ctpu__ag_release(r);
    return CTPU_OK;
}

bool ctpu_requires_grad(ctpu_tensor t)
{
    if (!ctpu_is_valid(t)) return false;
    const ctpu_trec *r = rec_of(t);
    if (ctpu__capturing()) ctpu__capture_note_kind_read(t.id, ctpu__ag_kind(r));   /* a host decision fn may branch on */
    return meta_requires(r->ag);
}

ctpu_tensor ctpu_grad(ctpu_tensor t)
{
    ctpu_trec *r = ctpu_rec_get(t, "grad", "t", true);
    if (!r) return ctpu_failed();
    ag_meta *m = r->ag;
    bool has = m && m->leaf && ctpu_is_valid(m->leaf->grad);
    if (m && m->leaf && ctpu__capturing()) ctpu__capture_note_grad_read(t.id, has);   /* a host decision fn may branch on */
    if (!has) return CTPU_NULL;   /* no gradient: not an error */
    return m->leaf->grad;
}

ctpu_status ctpu_zero_grad(ctpu_tensor t)
{
    ctpu_trec *r = ctpu_rec_get(t, "zero_grad", "t", false);
    if (!r) return ctpu_last_status();
    ag_meta *m = r->ag;
    if (m && m->leaf) {
        ctpu_tensor g = m->leaf->grad;
        m->leaf->grad = CTPU_NULL;
        ctpu_bind_bump();
        release_quiet(g);
        if (ctpu__capturing()) ctpu__capture_note_zero_grad(t.id);
    }
    return CTPU_OK;
}

uint64_t ctpu__ag_grad_id(const ctpu_trec *r)
{
    const ag_meta *m = r->ag;
    return m && m->leaf ? m->leaf->grad.id : 0;
}

bool ctpu__ag_set_grad(ctpu_tensor leaf, ctpu_tensor g)
{
    if (!ctpu_is_valid(leaf) || !ctpu_is_valid(g)) return false;
    ag_meta *m = rec_of(leaf)->ag;
    if (!m || !m->leaf) return false;
    ctpu_tensor old = m->leaf->grad;
    m->leaf->grad = CTPU_NULL;
    ctpu_bind_bump();
    release_quiet(old);
    rec_of(g)->scope_id = 0;
    rec_of(g)->leaf_grad = true;
    m->leaf->grad = g;
    return true;
}

ctpu_status ctpu_no_grad_begin(void)
{
    if (!ctpu_check_init("no_grad_begin")) return CTPU_ERR_NOT_INITIALIZED;
    ctpu_thread_state *ts = ctpu_ts();
    if (!ts) {
        ctpu_set_error(CTPU_ERR_OOM, "no_grad_begin: out of host memory");
        return CTPU_ERR_OOM;
    }
    ts->no_grad++;
    return CTPU_OK;
}

ctpu_status ctpu_no_grad_end(void)
{
    if (!ctpu_check_init("no_grad_end")) return CTPU_ERR_NOT_INITIALIZED;
    ctpu_thread_state *ts = ctpu_ts_current();
    if (ts && ctpu__user_underflow(ts, ts->no_grad, ts->user.no_grad, "no_grad_end", "no-grad region",
                                   "ctpu_no_grad_begin"))
        return CTPU_ERR_STATE;
    if (!ts || ts->no_grad == 0) {
        ctpu_set_error(CTPU_ERR_STATE, "no_grad_end: no no-grad region is open");
        return CTPU_ERR_STATE;
    }
    ts->no_grad--;
    return CTPU_OK;
}

bool ctpu_grad_enabled(void) { return no_grad_depth() == 0; }

ctpu_tensor ctpu_detach(ctpu_tensor t)
{
    ctpu_trec *r = ctpu_rec_get(t, "detach", "t", true);
    if (!r) return ctpu_failed();
    return ctpu_handle_view(r, &r->type, r->off, "detach");
}

/* ------------------------------------------------------------ backward */
/* Reduce g (broadcast against `to`) back to to's shape and dtype. */
static ctpu_tensor fit(ctpu_tensor g, const ctpu_vtype *to)
{
    ctpu_trec *r = ctpu_rec_get(g, "backward", "grad", true);
    if (!r) return ctpu_failed();
    ctpu_vtype gt = r->type;
    bool same = gt.ndim == to->ndim;
    for (int d = 0; same && d < to->ndim; d++) same = gt.shape[d] == to->shape[d];
    ctpu_tensor x = g;
    if (!same) {
        int dims[8], k = 0, lead = gt.ndim - to->ndim;
        if (lead < 0) {
            char a[128], b[128];
            ctpu_set_error(CTPU_ERR_STATE, "backward: a gradient %s has fewer dims than its input %s",
                           ctpu_fmt_type(&gt, a, sizeof a), ctpu_fmt_type(to, b, sizeof b));
            return ctpu_failed();
        }
        for (int d = 0; d < gt.ndim; d++)
            if (d < lead || (to->shape[d - lead] == 1 && gt.shape[d] != 1)) dims[k++] = d;
        if (k) x = ctpu_sum(x, k, dims, true);
        x = ctpu_reshape(x, to->ndim, to->shape);
    }
    if (!ctpu_is_null(x) && ctpu_dtype_of(x) != to->dtype) x = ctpu_cast(x, (ctpu_dtype)to->dtype);
    return x;
}

/* Add g into *acc (both owned handles; g is consumed). */
static bool accumulate(ctpu_tensor *acc, ctpu_tensor g)
{
    if (ctpu_is_null(*acc)) { *acc = g; return true; }
    ctpu_tensor s = ctpu_add(*acc, g);
    if (ctpu_is_null(s)) return false;
    release_quiet(*acc);
    release_quiet(g);
    *acc = s;
    return true;
}

static int cmp_seq_desc(const void *x, const void *y)
{
    const ag_node *a = *(ag_node *const *)x, *b = *(ag_node *const *)y;
    return a->seq < b->seq ? 1 : a->seq > b->seq ? -1 : 0;
}

typedef struct { void *p; size_t n, cap; } vec;
static bool vec_push(vec *v, void *x)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 64;
        void **p = realloc(v->p, nc * sizeof(void *));
        if (!p) return false;
        v->p = p;
        v->cap = nc;
    }
    ((void **)v->p)[v->n++] = x;
    return true;
}

/* The tape reachable from root (its nodes marked with this pass) into nodes. */
static ctpu_status collect_tape(ag_meta *root, uint64_t pass, vec *nodes, const char *opn)
{
    vec stack = {0};
    ctpu_status st = CTPU_OK;
    if (root->fn) {
        root->fn->mark = pass;
        if (!vec_push(&stack, root->fn)) st = CTPU_ERR_OOM;
        while (st == CTPU_OK && stack.n) {
            ag_node *x = ((ag_node **)stack.p)[--stack.n];
            if (!vec_push(nodes, x)) { st = CTPU_ERR_OOM; break; }
            if (x->freed) {
                ctpu_set_error(CTPU_ERR_STATE,
                               "%s: the tape through `%s` was released by an earlier backward "
                               "(pass retain_graph to backward twice)", opn, ctpu_op_name(x->node.op));
                st = CTPU_ERR_STATE;
                break;
            }
            for (int i = 0; i < x->node.n_in; i++) {
                ag_node *y = x->edge[i].fn;
                if (y && y->mark != pass) {
                    y->mark = pass;
                    if (!vec_push(&stack, y)) { st = CTPU_ERR_OOM; break; }
                }
            }
        }
        if (st == CTPU_ERR_OOM) ctpu_set_error(st, "%s: out of host memory", opn);
    }
    free(stack.p);
    return st;
}

/* Whether a backward through r would find a node of its history released
 * (an earlier backward without retain_graph walked it): collect_tape's
 * walk, marked with a pass of its own; out of host memory: true. */
bool ctpu__ag_history_released(const ctpu_trec *r)
{
    const ag_meta *m = r->ag;
    if (!m || !m->fn) return false;
    uint64_t pass = atomic_fetch_add(&ag_pass, 1);
    vec stack = {0};
    bool released = !vec_push(&stack, m->fn);
    m->fn->mark = pass;
    while (!released && stack.n) {
        ag_node *x = ((ag_node **)stack.p)[--stack.n];
        released = x->freed;
        for (int i = 0; i < x->node.n_in && !released; i++) {
            ag_node *y = x->edge[i].fn;
            if (!y || y->mark == pass) continue;
            y->mark = pass;
            released = !vec_push(&stack, y);
        }
    }
    free(stack.p);
    return released;
}

/* A leaf's .grad += this pass's sum (g consumed); st passes through. */
static ctpu_status leaf_apply(ag_leaf *l, ctpu_status st)
{
    ctpu_tensor g = l->gacc;
    l->gacc = CTPU_NULL;
    if (st != CTPU_OK || !l->alive || ctpu_is_null(g)) { release_quiet(g); return st; }
    if (ctpu_is_valid(l->grad)) {
        ctpu_tensor s = ctpu_add(l->grad, g);
        ctpu_status a = ctpu_is_null(s) ? ctpu_last_status() : ctpu_assign(l->grad, s);
        release_quiet(s);
        release_quiet(g);
        if (a != CTPU_OK) st = a;
    } else {
        rec_of(g)->scope_id = 0;   /* .grad lives in no scope */
        rec_of(g)->leaf_grad = true;
        l->grad = g;
        ctpu_bind_bump();
        if (ctpu__capturing()) ctpu__capture_note_grad(l->self, g.id);
    }
    return st;
}

/* Grad-ready hooks: for each hooked leaf of this pass, the last node (in
 * processing order) with an edge to it. False: no hooked leaf. */
static bool hooks_plan(ag_node **ns, size_t n, uint64_t pass)
{
    bool any = false;
    for (size_t k = 0; k < n; k++)
        for (int i = 0; i < ns[k]->node.n_in; i++) {
            ag_leaf *l = ns[k]->edge[i].leaf;
            if (l && l->hook) {
                l->hook_pass = pass;
                l->hook_k = k;
                any = true;
            }
        }
    return any;
}

/* Call l's hook as a user frame: ctpu_shutdown is refused inside it, and
 * the scopes, no-grad regions, labels and call scopes it leaves open (or
 * pops below their depth on entry) are closed and make the backward fail
 * with CTPU_ERR_STATE. */
static ctpu_status hook_call(ag_leaf *l)
{
    ctpu_user_frame f;
    ctpu__user_enter(&f, "backward", "a grad hook");
    l->hook((ctpu_tensor){ l->self }, l->hook_ctx);
    return ctpu__user_exit(&f, CTPU_OK);
}

/* After node k: the hooked leaves it was the last contribution to get their
 * .grad now and their hook called. */
static ctpu_status hooks_fire(ag_node *x, size_t k, uint64_t pass, ctpu_status st)
{
    for (int i = 0; i < x->node.n_in && st == CTPU_OK; i++) {
        ag_leaf *l = x->edge[i].leaf;
        if (!l || !l->hook || l->hook_pass != pass || l->hook_k != k || l->hook_done == pass ||
            l->touched != pass)
            continue;
        st = leaf_apply(l, st);
        l->hook_done = pass;
        if (st == CTPU_OK && l->alive) st = hook_call(l);
    }
    return st;
}

ctpu_status ctpu_register_post_accumulate_grad_hook(ctpu_tensor t, ctpu_grad_hook fn, void *ctx)
{
    const char *opn = "register_post_accumulate_grad_hook";
    ctpu_trec *r = ctpu_rec_get(t, opn, "t", false);
    if (!r) return ctpu_last_status();
    ag_meta *m = r->ag;
    if (!m || !m->leaf) {
        char tb[128];
        ctpu_set_error(CTPU_ERR_STATE, "%s: t %s is not a leaf that requires grad (ctpu_set_requires_grad)", opn,
                       ctpu_fmt_type(&r->type, tb, sizeof tb));
        return CTPU_ERR_STATE;
    }
    m->leaf->hook = fn;
    m->leaf->hook_ctx = fn ? ctx : NULL;
    return CTPU_OK;
}

static ctpu_status run_backward(ag_meta *root, ctpu_tensor g0, bool retain, const char *opn)
{
    uint64_t pass = atomic_fetch_add(&ag_pass, 1);
    vec nodes = {0}, leaves = {0};
    bool hooked = false;
    ctpu_status st = collect_tape(root, pass, &nodes, opn);
    ag_node **ns = nodes.p;
    if (st == CTPU_OK) {
        if (nodes.n > 1) qsort(ns, nodes.n, sizeof *ns, cmp_seq_desc);   /* a leaf root has none */
        hooked = hooks_plan(ns, nodes.n, pass);
        if (root->fn) root->fn->gacc = g0;
        else { root->leaf->gacc = g0; root->leaf->touched = pass; vec_push(&leaves, root->leaf); }
    } else {
        release_quiet(g0);
    }
    for (size_t k = 0; st == CTPU_OK && k < nodes.n; k++) {
        ag_node *x = ns[k];
        if (ctpu_is_null(x->gacc)) continue;
        int n_in = x->node.n_in;
        bool need[CTPU_NODE_MAX_IN];
        ctpu_tensor gin[CTPU_NODE_MAX_IN];
        bool anyneed = false;
        for (int i = 0; i < n_in; i++) {
            need[i] = x->edge[i].fn || x->edge[i].leaf;
            anyneed |= need[i];
            gin[i] = CTPU_NULL;
        }
        if (anyneed) {
            if ((st = ctpu_scope_begin()) != CTPU_OK) break;
            bool labelled = ctpu__label_push_id(ctpu__backward_label(x->node.op));
            ts_hint_set(x);
            x->rule(x, x->gacc, need, gin);
            ts_hint_set(NULL);
            if (labelled) ctpu__label_pop();
            for (int i = 0; i < n_in; i++) {
                if (!need[i]) continue;
                if (ctpu_is_null(gin[i])) { st = ctpu_last_status() ? ctpu_last_status() : CTPU_ERR_STATE; break; }
                gin[i] = fit(gin[i], &x->in_type[i]);
                if (ctpu_is_null(gin[i])) { st = ctpu_last_status() ? ctpu_last_status() : CTPU_ERR_STATE; break; }
                /* each accumulator must own a distinct handle */
                bool alias = gin[i].id == x->gacc.id;
                for (int j = 0; j < i; j++) alias |= need[j] && gin[j].id == gin[i].id;
                if (alias) gin[i] = dup_handle(gin[i]);
                ctpu_keep(gin[i]);
            }
            ctpu_status se = ctpu_scope_end();
            if (st == CTPU_OK) st = se;
            if (st != CTPU_OK) {
                if (ctpu_last_status() == CTPU_OK) ctpu_set_error(st, "%s: backward of %s failed", opn, ctpu_op_name(x->node.op));
                break;
            }
        }
        release_quiet(x->gacc);
        x->gacc = CTPU_NULL;
        for (int i = 0; i < n_in && st == CTPU_OK; i++) {
            if (!need[i]) continue;
            ag_edge *e = &x->edge[i];
            if (e->fn) {
                if (!accumulate(&e->fn->gacc, gin[i])) st = ctpu_last_status();
            } else {
                if (e->leaf->touched != pass) {
                    e->leaf->touched = pass;
                    e->leaf->gacc = CTPU_NULL;
                    if (!vec_push(&leaves, e->leaf)) { release_quiet(gin[i]); st = CTPU_ERR_OOM; ctpu_set_error(st, "%s: out of host memory", opn); continue; }
                }
                if (!accumulate(&e->leaf->gacc, gin[i])) st = ctpu_last_status();
            }
        }
        if (hooked) st = hooks_fire(x, k, pass, st);
    }
    /* leaves: .grad += this pass's sum (hooked leaves already done are skipped) */
    ag_leaf **ls = leaves.p;
    for (size_t k = 0; k < leaves.n; k++) {
        if (ls[k]->hook_done == pass) continue;
        st = leaf_apply(ls[k], st);
        if (st == CTPU_OK && ls[k]->hook && ls[k]->alive) {
            ls[k]->hook_done = pass;
            st = hook_call(ls[k]);
        }
    }
    /* drop what is left of the pass, free the tape unless retained */
    for (size_t k = 0; k < nodes.n; k++) {
        ag_node *x = ns[k];
        release_quiet(x->gacc);
        x->gacc = CTPU_NULL;
        if (!retain && st == CTPU_OK) {
            for (int i = 0; i <= x->node.n_in; i++) {
                release_quiet(x->saved[i]);
                x->saved[i] = CTPU_NULL;
            }
            x->freed = true;
            if (ctpu__capturing()) ctpu__capture_note_released(x->seq);
        }
    }
    free(nodes.p);
    free(leaves.p);
    return st;
}

static ctpu_status backward_ex(ctpu_tensor t, ctpu_tensor grad, bool retain_graph);

ctpu_status ctpu_backward_ex(ctpu_tensor t, ctpu_tensor grad, bool retain_graph)
{
    if (!ctpu__call_enter("backward")) return CTPU_ERR_NOT_INITIALIZED;
    ctpu_status st = backward_ex(t, grad, retain_graph);
    ctpu__call_exit();
    return st;
}

static ctpu_status backward_ex(ctpu_tensor t, ctpu_tensor grad, bool retain_graph)
{
    const char *opn = "backward";
    ctpu_trec *r = ctpu_rec_get(t, opn, "t", false);
    if (!r) return ctpu_last_status();
    char tb[128], gb[128];
    ag_meta *m = r->ag;
    if (!meta_requires(m)) {
        ctpu_set_error(CTPU_ERR_STATE,
                       "%s: t %s does not require grad (no leaf marked with set_requires_grad reaches it, "
                       "or it was computed under no_grad)", opn, ctpu_fmt_type(&r->type, tb, sizeof tb));
        return CTPU_ERR_STATE;
    }
    ctpu_trec *gr = NULL;
    if (!ctpu_absent(grad)) {
        gr = ctpu_rec_get(grad, opn, "grad", false);
        if (!gr) return ctpu_last_status();
        bool same = gr->type.ndim == r->type.ndim;
        for (int d = 0; same && d < r->type.ndim; d++) same = gr->type.shape[d] == r->type.shape[d];
        if (!same || gr->type.dtype == CTPU_I32) {
            ctpu_set_error(same ? CTPU_ERR_DTYPE : CTPU_ERR_SHAPE,
                           "%s: t is %s, grad is %s: grad must be f32/bf16 of t's shape", opn,
                           ctpu_fmt_type(&r->type, tb, sizeof tb), ctpu_fmt_type(&gr->type, gb, sizeof gb));
            return same ? CTPU_ERR_DTYPE : CTPU_ERR_SHAPE;
        }
    } else if (ctpu_vtype_numel(&r->type) != 1) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: t is %s: backward without grad needs a one-element t (a loss)", opn,
                       ctpu_fmt_type(&r->type, tb, sizeof tb));
        return CTPU_ERR_SHAPE;
    }
    ctpu_status st = ctpu_scope_begin();
    if (st != CTPU_OK) return st;
    ctpu_thread_state *ts = ctpu_ts_current();   /* bound: scope_begin succeeded */
    CTPU_ASSERT(ts);
    ts->no_grad++;
    ctpu_tensor g0 = gr ? ctpu_handle_view(gr, &gr->type, gr->off, opn)
                        : ctpu_ones((ctpu_dtype)r->type.dtype, r->type.ndim, r->type.shape);
    if (!ctpu_is_null(g0) && ctpu_dtype_of(g0) != r->type.dtype) g0 = ctpu_cast(g0, (ctpu_dtype)r->type.dtype);
    if (ctpu_is_null(g0)) st = ctpu_last_status();
    else st = run_backward(m, g0, retain_graph, opn);
    ts->no_grad--;
    ctpu_status se = ctpu_scope_end();
    return st != CTPU_OK ? st : se;
}

ctpu_status ctpu_backward(ctpu_tensor loss) { return ctpu_backward_ex(loss, CTPU_NULL, false); }
ctpu_status ctpu_backward_with(ctpu_tensor t, ctpu_tensor grad) { return ctpu_backward_ex(t, grad, false); }
