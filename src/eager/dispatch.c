/* Dispatch: validate, infer the output type (the op table's shape rules),
 * compile the node as a one-node trace through the strict program table,
 * enqueue it on the device stream. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eager.h"
#include "fuse/exec.h"
#include "testing.h"

/* ------------------------------------------------------------ the path */
/* A per-thread front for the strict program table: a direct-mapped cache of
 * key -> program, so a repeated op takes no lock. Full key compare on hit.
 * Each slot holds a reference on its program: the table may evict it (a
 * bounded LRU, CTPU_STRICT_CACHE_SIZE) while this thread still runs it
 * from here; it is freed once no slot, caller or queued command uses it
 * (fuse.h). So at most TPC_SLOTS evicted programs per thread stay alive.
 * It is a part of the thread's state (eager.h), allocated at its first
 * strict op. */
#define TPC_SLOTS 256
typedef struct {
    uint64_t h;
    ctpu_program *p;
    uint8_t *key;
    size_t len;
} tpc_slot;
struct ctpu_strict_front {
    tpc_slot slot[TPC_SLOTS];
};

void ctpu__strict_front_free(struct ctpu_strict_front *f, ctpu_cache *c)
{
    if (!f) return;
    for (int i = 0; i < TPC_SLOTS; i++) {
        free(f->slot[i].key);
        if (c && f->slot[i].p) ctpu_cache_release(c, f->slot[i].p);
    }
    free(f);
}

/* The program of a strict key; *owned: the caller holds a reference to let
 * go of after its submit (false: this thread's front slot holds it). */
static ctpu_program *strict_program(const uint8_t *key, size_t klen, ctpu_trace *tr, const ctpu_vtype *const *in_type,
                                    ctpu_cache_result *res, bool *owned, char *err, size_t errlen)
{
    uint64_t h = ctpu_key_hash(key, klen);
    ctpu_thread_state *ts = ctpu_ts();
    struct ctpu_strict_front *f = ts ? ts->strict_front : NULL;
    if (ts && !f) f = ts->strict_front = calloc(1, sizeof *f);
    tpc_slot *s = f ? &f->slot[h & (TPC_SLOTS - 1)] : NULL;
    *owned = false;
    if (s && s->p && s->h == h && s->len == klen && memcmp(s->key, key, klen) == 0) {
        res->hit = true;
        res->collisions = res->evicted = 0;
        return s->p;
    }
    ctpu_cache *cache = ctpu_rt->strict_cache;
    ctpu_vtype types[CTPU_NODE_MAX_IN];   /* the trace's input types, for a compile */
    for (int i = 0; i < tr->n_inputs; i++) types[i] = *in_type[i];
    tr->in_type = types;
    ctpu_program *p = ctpu_cache_get(cache, key, klen, tr, res, err, errlen);
    tr->in_type = NULL;
    *owned = p != NULL;
    if (p && s) {
        uint8_t *k = realloc(s->key, klen);
        if (k) {
            memcpy(k, key, klen);
            ctpu_program *old = s->p;
            *s = (tpc_slot){ h, p, k, klen };   /* our reference is the slot's now */
            *owned = false;
            if (old) ctpu_cache_release(cache, old);
        }
    }
    return p;
}

/* The strict table's key of a one-node trace: input types, the node (op,
 * arity, attrs when set, output type), the precision. Straight-line copies:
 * this is on every strict op's path (shapes are copied whole, 64 bytes, and
 * p advances by the extents used: key has room for every dim). */
static size_t strict_key(const ctpu_trace *tr, const ctpu_vtype *const *in_type, uint8_t *key, size_t cap)
{
    const ctpu_node *n = tr->nodes;
    size_t need = 8 + (size_t)tr->n_inputs * (2 + 64) + 8 + 64 + sizeof(ctpu_attrs);
    if (need > cap) return 0;
    uint8_t *p = key;
    bool has_attr = !ctpu_attrs_zero(&n->attr);
    *p++ = (uint8_t)tr->n_inputs;
    *p++ = tr->precision;
    *p++ = (uint8_t)(n->op & 0xff);
    *p++ = (uint8_t)(n->op >> 8);
    *p++ = n->n_scalars;
    *p++ = has_attr;
    for (int i = 0; i < tr->n_inputs; i++) {
        const ctpu_vtype *t = in_type[i];
        *p++ = t->dtype;
        *p++ = t->ndim;
        memcpy(p, t->shape, sizeof t->shape);
        p += sizeof(int64_t) * t->ndim;
    }
    *p++ = n->out.dtype;
    *p++ = n->out.ndim;
    memcpy(p, n->out.shape, sizeof n->out.shape);
    p += sizeof(int64_t) * n->out.ndim;
    if (has_attr) {
        memcpy(p, &n->attr, sizeof n->attr);
        p += sizeof n->attr;
    }
    return (size_t)(p - key);
}

/* A one-op compile is a recompile (the strict_recompiles counter, torch's
 * meaning: the same operation compiled again for new shapes) when its op
 * signature (the strict key without the extents: op, attributes, scalar
 * count, precision, dtypes and ranks of the inputs and the output) was
 * first compiled in an earlier marked step. Within the step that first
 * compiles a signature, its other shapes are that step's compiles (a model's
 * adds of [B,T,D] and [D] are not recompiles of each other); a program
 * evicted from the table and compiled again counts too. Called on a miss. */
/* The report's record of a strict recompile: "cast f32[2,16] -> bf16[2,16]"
 * at step, its signature first compiled at first. Under strict_sig_mu. */
static void strict_recompile_note(ctpu_runtime *rt, const ctpu_trace *tr, const ctpu_vtype *const *in_type,
                                  uint64_t step, uint64_t first)
{
    size_t slot = (size_t)(rt->strict_rc_n++ % CTPU_STRICT_RC_LOG);
    char *w = rt->strict_rc[slot].what, tb[96];
    size_t len = sizeof rt->strict_rc[slot].what, k = 0;
    rt->strict_rc[slot].step = step;
    rt->strict_rc[slot].first_step = first;
    k += (size_t)snprintf(w, len, "%s", ctpu_op_name(tr->nodes->op));
    for (int i = 0; i < tr->n_inputs && k < len; i++)
        k += (size_t)snprintf(w + k, len - k, "%s%s", i ? ", " : " ", ctpu_fmt_type(in_type[i], tb, sizeof tb));
    if (k < len) snprintf(w + k, len - k, " -> %s", ctpu_fmt_type(&tr->nodes->out, tb, sizeof tb));
}

static bool strict_recompile(ctpu_runtime *rt, const ctpu_trace *tr, const ctpu_vtype *const *in_type)
{
    const ctpu_node *n = tr->nodes;
    uint8_t sig[16 + 2 * CTPU_NODE_MAX_IN + sizeof(ctpu_attrs)];
    size_t len = 0;
    sig[len++] = (uint8_t)tr->n_inputs;
    sig[len++] = tr->precision;
    sig[len++] = (uint8_t)(n->op & 0xff);
    sig[len++] = (uint8_t)(n->op >> 8);
    sig[len++] = n->n_scalars;
    for (int i = 0; i < tr->n_inputs; i++) { sig[len++] = in_type[i]->dtype; sig[len++] = in_type[i]->ndim; }
    sig[len++] = n->out.dtype;
    sig[len++] = n->out.ndim;
    memcpy(sig + len, &n->attr, sizeof n->attr);
    len += sizeof n->attr;
    uint64_t h = ctpu_key_hash(sig, len) | 1, step = atomic_load(&rt->marked_steps);
    bool re = false;
    pthread_mutex_lock(&rt->strict_sig_mu);
    if (rt->strict_sig_n * 2 >= rt->strict_sig_cap) {   /* grow (and rehash) */
        size_t cap = rt->strict_sig_cap ? rt->strict_sig_cap * 2 : 256;
        uint64_t *ns = calloc(cap, sizeof *ns), *nt = calloc(cap, sizeof *nt);
        if (ns && nt) {
            for (size_t i = 0; i < rt->strict_sig_cap; i++) {
                if (!rt->strict_sig[i]) continue;
                size_t j = rt->strict_sig[i] & (cap - 1);
                while (ns[j]) j = (j + 1) & (cap - 1);
                ns[j] = rt->strict_sig[i];
                nt[j] = rt->strict_sig_step[i];
            }
            free(rt->strict_sig);
            free(rt->strict_sig_step);
            rt->strict_sig = ns;
            rt->strict_sig_step = nt;
            rt->strict_sig_cap = cap;
        } else {
            free(ns);
            free(nt);
        }
    }
    if (rt->strict_sig_n * 2 < rt->strict_sig_cap) {
        size_t j = h & (rt->strict_sig_cap - 1);
        while (rt->strict_sig[j] && rt->strict_sig[j] != h) j = (j + 1) & (rt->strict_sig_cap - 1);
        if (rt->strict_sig[j]) {
            re = rt->strict_sig_step[j] < step;
            if (re) strict_recompile_note(rt, tr, in_type, step, rt->strict_sig_step[j]);
        } else {
            rt->strict_sig[j] = h;
            rt->strict_sig_step[j] = step;
            rt->strict_sig_n++;
        }
    }
    pthread_mutex_unlock(&rt->strict_sig_mu);
    return re;
}

/* " (a is emb.weight, index is tokens)": the named inputs of a node, for a
 * fault reported at its call ("" when none has a name). */
static const char *named_inputs(const ctpu_node *node, ctpu_trec *const *in, char *out, size_t len);

ctpu_status ctpu__strict_launch(ctpu_node *node, ctpu_trec *const *in, const ctpu_vtype *const *in_type,
                                ctpu_buffer *const *in_buf, const size_t *in_off, const double *scalars,
                                ctpu_buffer *out, size_t out_off, ctpu_op_prov prov)
{
    ctpu_runtime *rt = ctpu_rt;
    const char *opn = ctpu_op_name(node->op);
    int n_in = node->n_in;
    for (int i = 0; i < n_in; i++) node->in[i] = i;
    int32_t outv = n_in;
    bool dbg = ctpu_debug_checks_now();
    ctpu_trace tr = {
        .n_inputs = n_in, .n_nodes = 1, .n_outputs = 1, .nodes = node,
        .outputs = &outv, .n_scalars = node->n_scalars,
        .precision = (uint8_t)rt->precision, .debug_checks = 0,
    };
    uint8_t key[4096];
    size_t klen = strict_key(&tr, in_type, key, sizeof key);
    char err[256];
    ctpu_cache_result res;   /* (not zeroed whole: its reason is 160 bytes; a lookup clears it) */
    res.hit = false;
    res.collisions = res.evicted = 0;
    bool owned = false;
    ctpu_program *prog = klen ? strict_program(key, klen, &tr, in_type, &res, &owned, err, sizeof err) : NULL;
    bool hit = res.hit;
    ctpu_counter_add(&rt->metrics, CTPU_CTR_STRICT_CACHE_REQUESTS, 1);
    if (res.collisions) ctpu_counter_add(&rt->metrics, CTPU_CTR_CACHE_COLLISIONS, res.collisions);
    if (!prog) {
        ctpu_set_error(CTPU_ERR_STATE, "%s: %s", opn, klen ? err : "trace key too long");
        return CTPU_ERR_STATE;
    }
    if (hit) {
        ctpu_counter_add(&rt->metrics, CTPU_CTR_STRICT_CACHE_HITS, 1);
    } else {
        ctpu_counter_add(&rt->metrics, CTPU_CTR_STRICT_CACHE_MISSES, 1);
        ctpu_counter_add(&rt->metrics, CTPU_CTR_PROGRAMS_COMPILED, 1);
        if (strict_recompile(rt, &tr, in_type)) ctpu_counter_add(&rt->metrics, CTPU_CTR_STRICT_RECOMPILES, 1);
        ctpu_counter_add(&rt->metrics, CTPU_CTR_STRICT_CACHE_ENTRIES, 1 - res.evicted);
        if (res.evicted) ctpu_counter_add(&rt->metrics, CTPU_CTR_STRICT_CACHE_EVICTIONS, res.evicted);
        ctpu_timer_add(&rt->metrics, CTPU_TMR_COMPILE_TIME, prog->compile_ns);
    }
    ctpu__report_op(node, hit, prog, in, prov);   /* report.c: cost estimate, trace */
    ctpu_cmd cmd;
    cmd.prog = &prog->prog;
    cmd.n_bufs = n_in + 1;
    if (cmd.n_bufs <= CTPU_CMD_INLINE_BUFS) {
        cmd.buf = cmd.buf_inl;
        cmd.off = cmd.off_inl;
    } else {
        cmd.buf = malloc(sizeof(ctpu_buffer *) * (size_t)cmd.n_bufs);
        cmd.off = malloc(sizeof(size_t) * (size_t)cmd.n_bufs);
        if (!cmd.buf || !cmd.off) {
            free(cmd.buf);
            free(cmd.off);
            if (owned) ctpu_cache_release(rt->strict_cache, prog);
            ctpu_set_error(CTPU_ERR_OOM, "%s: out of host memory", opn);
            return CTPU_ERR_OOM;
        }
    }
    for (int i = 0; i < n_in; i++) {
        cmd.buf[i] = in_buf[i];
        cmd.off[i] = in_off[i];
    }
    cmd.buf[n_in] = out;
    cmd.off[n_in] = out_off;
    cmd.scalars = cmd.scal_inl;
    for (int i = 0; i < node->n_scalars; i++) cmd.scalars[i] = scalars[i];
    cmd.one_block = false;
    cmd.debug_checks = dbg;
    cmd.n_prov = 1;
    cmd.prov_span = false;
    cmd.prov_shared = false;
    cmd.prov_inl = prov;
    cmd.prov = &cmd.prov_inl;
    cmd.program_id = 0;
    uint64_t seq = ctpu_device_submit_n(rt->dev, &cmd, node->n_scalars);
    ctpu_program_note_submit(prog, seq);
    if (owned) ctpu_cache_release(rt->strict_cache, prog);
    ctpu_counter_add(&rt->metrics, CTPU_CTR_OPS_DISPATCHED, 1);
    if (ctpu_mode_now() == CTPU_MODE_DEBUG) {
        ctpu_device_wait(rt->dev, seq);
        unsigned f = atomic_load(&out->fault);
        if (f) {
            const ctpu_fault_rec *fr = ctpu_device_fault(rt->dev, f);
            char nb[256];
            ctpu_set_error(fr->status, "%s%s", fr->msg, named_inputs(node, in, nb, sizeof nb));
            ctpu_device_take_error(rt->dev, NULL, 0); /* reported at the call */
            return fr->status;
        }
    }
    return CTPU_OK;
}

static ctpu_status launch(ctpu_node *node, ctpu_trec *const *inputs, const double *scalars,
                          ctpu_buffer *out, size_t out_off, ctpu_op_prov prov)
{
    const ctpu_vtype *in_type[CTPU_NODE_MAX_IN];
    ctpu_buffer *in_buf[CTPU_NODE_MAX_IN];
    size_t in_off[CTPU_NODE_MAX_IN];
    for (int i = 0; i < node->n_in; i++) {
        ctpu_trec *r = inputs[i];
        /* a value still pending in this thread's trace (the mode changed) */
        if (ctpu_rec_pending(r) && !ctpu__materialize(r, ctpu_op_name(node->op), CTPU_CUT_MODE))
            return ctpu_last_status();
        in_type[i] = &r->type;
        in_buf[i] = r->buf;
        in_off[i] = r->off;
    }
    return ctpu__strict_launch(node, inputs, in_type, in_buf, in_off, scalars, out, out_off, prov);
}

ctpu_status ctpu_dispatch_into(ctpu_node *node, ctpu_trec *const *inputs, const double *scalars,
                               ctpu_buffer *out, size_t out_off, ctpu_op_prov prov)
{
    return launch(node, inputs, scalars, out, out_off, prov);
}

/* Strict and debug eager's half of ctpu_dispatch, out of line: the recorded
 * path stays small enough to be inlined into apply. call: as ctpu_dispatch_as. */
static __attribute__((noinline)) ctpu_tensor dispatch_eager(ctpu_node *node, const char *call, ctpu_trec *const *inputs,
                                                            const ctpu_tensor *in_h, const double *scalars)
{
    ctpu_op_prov prov = ctpu_prov_next();   /* (defer and fuse numbers its nodes as it records them) */
    size_t bytes = (size_t)ctpu_vtype_numel(&node->out) * ctpu_kdt_size(node->out.dtype);
    char err[256];
    ctpu_buffer *b = ctpu_buffer_alloc(ctpu_rt->dev, bytes, err, sizeof err);
    if (!b) {
        char tb[128];
        ctpu_set_error(CTPU_ERR_OOM, "%s: output %s: %s", call ? call : ctpu_op_name(node->op),
                       ctpu_fmt_type(&node->out, tb, sizeof tb), err);
        return ctpu_failed();
    }
    ctpu_status st = launch(node, inputs, scalars, b, 0, prov);
    if (st != CTPU_OK) {
        ctpu_buffer_release(ctpu_rt->dev, b);
        return ctpu_failed();
    }
    ctpu_tensor out = ctpu_handle_new(&node->out, b, 0, ctpu_op_name(node->op));
    if (!ctpu_is_null(out)) ctpu__ag_record(node, in_h, scalars, out);
    return out;
}

ctpu_tensor ctpu_dispatch_as(ctpu_node *node, const char *call, ctpu_trec *const *inputs, const ctpu_tensor *in_h,
                             const double *scalars)
{
    if (!ctpu__type_ok(call ? call : ctpu_op_name(node->op), "the output", &node->out)) return ctpu_failed();
    if (ctpu_mode_now() == CTPU_MODE_DEFER_FUSE) return ctpu__defer_node(node, call, inputs, in_h, scalars);
    return dispatch_eager(node, call, inputs, in_h, scalars);
}

ctpu_tensor ctpu_dispatch(ctpu_node *node, ctpu_trec *const *inputs, const ctpu_tensor *in_h,
                          const double *scalars)
{
    return ctpu_dispatch_as(node, NULL, inputs, in_h, scalars);
}

/* A view: a new handle on rec's storage, recorded for autograd like any op. */
static ctpu_tensor make_view(ctpu_node *node, ctpu_trec *rec, ctpu_tensor in_h, size_t off)
{
    node->n_in = 1;
    if (!ctpu__type_ok(ctpu_op_name(node->op), "the view", &node->out)) return ctpu_failed();
    if (ctpu_rec_pending(rec)) {
        /* a view of a value not computed yet is a node of the trace */
        ctpu_trec *in[1] = { rec };
        return ctpu__defer_node(node, NULL, in, &in_h, NULL);
    }
    ctpu_prov_next();   /* numbered as an op in every mode */
    ctpu_counter_add(&ctpu_rt->metrics, CTPU_CTR_OPS_DISPATCHED, 1);
    ctpu_tensor out = ctpu_handle_view(rec, &node->out, off, ctpu_op_name(node->op));
    if (!ctpu_is_null(out) && ctpu__ts && ctpu__ts->dyn_out_set) {   /* a view of a marked tensor keeps its dims */
        ctpu__ts->dyn_out_set = false;
        ctpu__rec_set_dyn(ctpu_slot(ctpu_handle_slot(out)), ctpu__ts->dyn_out, node->out.ndim);
    }
    if (!ctpu_is_null(out)) ctpu__ag_record(node, &in_h, NULL, out);
    return out;
}

/* ------------------------------------------------------------ helpers */
/* Resolve n op inputs; a null handle gives NULL quietly (the error that made
 * it null is already set). */
static bool get_inputs(const char *op, int n, const ctpu_tensor *ts, const char *const *names, ctpu_trec **out)
{
    if (n <= 0 && !ctpu_check_init(op)) return false;   /* (ctpu_rec_get checks it for each input) */
    for (int i = 0; i < n; i++) {
        out[i] = ctpu_rec_get(ts[i], op, names[i], true);
        if (!out[i]) return false;
    }
    return true;
}

static ctpu_dtype promote(ctpu_dtype a, ctpu_dtype b)
{
    if (a == CTPU_F32 || b == CTPU_F32) return CTPU_F32;
    if (a == CTPU_BF16 || b == CTPU_BF16) return CTPU_BF16;
    return CTPU_I32;
}

static inline bool broadcast(const char *op, int n, ctpu_trec *const *in, const char *const *names, ctpu_vtype *out)
{
    int nd = 0;
    for (int i = 0; i < n; i++) if (in[i]->type.ndim > nd) nd = in[i]->type.ndim;
    out->ndim = (uint8_t)nd;
    memset(out->shape, 0, sizeof out->shape);
    for (int d = 0; d < nd; d++) {
        int64_t e = 1;
        for (int i = 0; i < n; i++) {
            int id = d - (nd - in[i]->type.ndim);
            if (id < 0) continue;
            int64_t x = in[i]->type.shape[id];
            if (x == e || x == 1) continue;
            if (e == 1) { e = x; continue; }
            char msg[512];
            size_t k = (size_t)snprintf(msg, sizeof msg, "%s: ", op);
            for (int j = 0; j < n && k < sizeof msg; j++) {
                char tb[128];
                k += (size_t)snprintf(msg + k, sizeof msg - k, "%s%s is %s", j ? ", " : "", names[j],
                                      ctpu_fmt_type(&in[j]->type, tb, sizeof tb));
            }
            ctpu_set_error(CTPU_ERR_SHAPE, "%s: shapes are not broadcastable (dim %d: %lld vs %lld)", msg,
                           d, (long long)e, (long long)x);
            return false;
        }
        out->shape[d] = e;
    }
    return true;
}

static int norm_dim(const char *op, int dim, const ctpu_trec *r, const char *arg)
{
    int nd = r->type.ndim;
    int lim = nd ? nd : 1;
    if (dim < -lim || dim >= lim) {
        char tb[128];
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: %s=%d is out of range for a %s (valid: [%d, %d])", op, arg,
                       dim, ctpu_fmt_type(&r->type, tb, sizeof tb), -lim, lim - 1);
        return -1;
    }
    return dim < 0 ? dim + lim : dim;
}


static bool reduce_dims(const char *op, ctpu_trec *r, int ndims, const int *dims, bool keepdim,
                        ctpu_node *n)
{
    int nd = r->type.ndim;
    char tb[128];
    uint32_t mask = 0;
    if (ndims < 0 || ndims > CTPU_MAX_DIMS || (ndims > 0 && !dims)) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: ndims=%d with dims %s", op, ndims, dims ? "given" : "NULL");
        return false;
    }
    if (ndims == 0) mask = nd ? (1u << nd) - 1 : 0;
    for (int i = 0; i < ndims; i++) {
        int d = dims[i];
        if (nd == 0 ? (d != 0 && d != -1) : (d < -nd || d >= nd)) {   /* a 0-d tensor takes dim 0 / -1 */
            ctpu_set_error(CTPU_ERR_SHAPE, "%s: dims[%d]=%d is out of range for a %s", op, i, d,
                           ctpu_fmt_type(&r->type, tb, sizeof tb));
            return false;
        }
        if (nd == 0) continue;
        d = d < 0 ? d + nd : d;
        if (mask & (1u << d)) {
            ctpu_set_error(CTPU_ERR_SHAPE, "%s: dim %d appears twice in dims", op, d);
            return false;
        }
        mask |= 1u << d;
    }
    n->attr.n_dims = 0;
    for (int d = 0; d < nd; d++)
        if (mask & (1u << d)) n->attr.dims[n->attr.n_dims++] = d;
    if (keepdim) n->attr.flags |= CTPU_ATTR_KEEPDIM;
    n->out.ndim = 0;
    memset(n->out.shape, 0, sizeof n->out.shape);
    for (int d = 0; d < nd; d++) {
        if (mask & (1u << d)) {
            if (keepdim) n->out.shape[n->out.ndim++] = 1;
        } else {
            n->out.shape[n->out.ndim++] = r->type.shape[d];
        }
    }
    return true;
}

static int64_t reduced_count(const ctpu_trec *r, const ctpu_node *n)
{
    int64_t c = 1;
    for (int i = 0; i < n->attr.n_dims; i++) c *= r->type.shape[n->attr.dims[i]];
    return c;
}

/* ------------------------------------------------------------ arguments
 * The non-tensor arguments of an op call, as the shape and dtype rules read
 * them (zero = unused). */
typedef struct {
    const char *opn;            /* the name errors use when not the op's (zeros, matmul_t); NULL: the op's */
    const char *const *names;   /* the inputs' names when not the shape rule's (where) */
    int ndim;                   /* reshape, expand, creation: the shape */
    const int64_t *shape;
    int n_dims;                 /* reductions: the dims (0: all); permute: the permutation */
    const int *dims;
    bool keepdim;
    bool matmul_t;              /* matmul: the transposed-operand form (operands of >= 2 dims) */
    int dim;                    /* argmax, softmax, slice, concat, gather */
    int64_t start, end, step;   /* slice */
    int64_t correction;         /* var */
    int dtype;                  /* cast, creation */
    uint32_t flags;             /* the node's attr flags: CTPU_ATTR_SCALAR_FIRST, CTPU_ATTR_TRANS_A/B */
    int precision;              /* matmul */
    int n_scalars;              /* runtime scalars the node takes */
    int call;                   /* CTPU_CALL_*: the composite a faulting node is made for */
    bool int_scalar;            /* *_scalar_int, clamp_int: the host scalars are ints (an i32 tensor stays i32) */
} op_args;

static const char *const NM_A[] = { "a" };
static const char *const NM_AB[] = { "a", "b" };
static const char *const NM_WHERE[] = { "cond", "a", "b" };
static const char *const NM_EMBEDDING[] = { "weight", "indices" };
static const char *const NM_GATHER[] = { "a", "index" };
static const char *const NM_SCATTER[] = { "self", "index", "src" };
static const char *const NM_TS[CTPU_NODE_MAX_IN] = {   /* concat's and stack's inputs, by index */
    "ts[0]", "ts[1]", "ts[2]",  "ts[3]",  "ts[4]",  "ts[5]",  "ts[6]",  "ts[7]",
    "ts[8]", "ts[9]", "ts[10]", "ts[11]", "ts[12]", "ts[13]", "ts[14]", "ts[15]",
};

/* ------------------------------------------------------------ shape rules
 * One function per CTPU_SH_* id: validate the arguments against the inputs
 * and fill the node's output shape and attributes (the error set names the
 * op, the argument and the shapes). */
typedef bool (*shape_rule_fn)(const char *opn, const char *const *names, ctpu_trec *const *in,
                              const op_args *a, ctpu_node *n);

static bool sh_same(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                    ctpu_node *n)
{
    (void)opn, (void)names, (void)a;
    n->out = in[0]->type;
    return true;
}

static bool sh_broadcast(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                         ctpu_node *n)
{
    (void)a;
    /* the two-input case on its own: constant operand count, unrolled (every binary op's path) */
    if (n->n_in == 2) return broadcast(opn, 2, in, names, &n->out);
    return broadcast(opn, n->n_in, in, names, &n->out);
}

static bool sh_reduce(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                      ctpu_node *n)
{
    (void)names;
    if (!reduce_dims(opn, in[0], a->n_dims, a->dims, a->keepdim, n)) return false;
    n->attr.i64[0] = a->correction;
    int kop = ctpu_op_kop(n->op);   /* max and min have no identity */
    if ((kop == CTPU_K_RED_MAX || kop == CTPU_K_RED_MIN) && reduced_count(in[0], n) == 0 &&
        ctpu_vtype_numel(&n->out) > 0) {
        char tb[128];
        int zd = 0;
        for (int i = 0; i < n->attr.n_dims; i++)
            if (in[0]->type.shape[n->attr.dims[i]] == 0) { zd = n->attr.dims[i]; break; }
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: a is %s: cannot reduce over dim %d, of size 0 (%s has no identity)",
                       opn, ctpu_fmt_type(&in[0]->type, tb, sizeof tb), zd, kop == CTPU_K_RED_MAX ? "max" : "min");
        return false;
    }
    return true;
}

static bool sh_argreduce(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                         ctpu_node *n)
{
    (void)names;
    int d = norm_dim(opn, a->dim, in[0], "dim");
    if (d < 0) return false;
    if (!reduce_dims(opn, in[0], in[0]->type.ndim ? 1 : 0, &d, a->keepdim, n)) return false;
    if (in[0]->type.ndim && in[0]->type.shape[d] == 0) {
        char tb[128];
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: a is %s: dim %d has extent 0", opn,
                       ctpu_fmt_type(&in[0]->type, tb, sizeof tb), d);
        return false;
    }
    return true;
}

static bool sh_along(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                     ctpu_node *n)
{
    (void)names;
    int d = norm_dim(opn, a->dim, in[0], "dim");
    if (d < 0) return false;
    n->out = in[0]->type;
    n->attr.dims[0] = d;
    n->attr.n_dims = 1;
    return true;
}

static bool sh_reshape(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                       ctpu_node *n)
{
    (void)names;
    char tb[128];
    int ndim = a->ndim;
    const int64_t *shape = a->shape;
    if (ndim < 0 || ndim > CTPU_MAX_DIMS || (ndim > 0 && !shape)) {
        ctpu_set_error(ndim > 0 && ndim <= CTPU_MAX_DIMS ? CTPU_ERR_INVALID_ARG : CTPU_ERR_SHAPE,
                       "%s: a is %s: ndim=%d%s", opn, ctpu_fmt_type(&in[0]->type, tb, sizeof tb),
                       ndim, ndim > 0 && ndim <= CTPU_MAX_DIMS ? " with shape NULL" : " is outside [0, 8]");
        return false;
    }
    ctpu_vtype t = { .dtype = in[0]->type.dtype, .ndim = (uint8_t)ndim };
    int infer = -1;
    int64_t known = 1, numel = ctpu_vtype_numel(&in[0]->type);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == -1 && infer < 0) { infer = d; continue; }
        if (shape[d] < 0) {
            ctpu_vtype asked = { .dtype = t.dtype, .ndim = (uint8_t)ndim };
            memcpy(asked.shape, shape, sizeof(int64_t) * (size_t)ndim);
            char ts[128];
            ctpu_fmt_type(&asked, ts, sizeof ts);
            if (shape[d] == -1)
                ctpu_set_error(CTPU_ERR_SHAPE, "%s: a is %s, shape %s: only one dimension can be -1 (dims %d and %d)",
                               opn, ctpu_fmt_type(&in[0]->type, tb, sizeof tb), ts + strcspn(ts, "["), infer, d);
            else
                ctpu_set_error(CTPU_ERR_SHAPE, "%s: a is %s, shape %s: shape[%d]=%lld is invalid", opn,
                               ctpu_fmt_type(&in[0]->type, tb, sizeof tb), ts + strcspn(ts, "["), d, (long long)shape[d]);
            return false;
        }
        t.shape[d] = shape[d];
        if (shape[d] && known > INT64_MAX / shape[d]) known = INT64_MAX;
        else known *= shape[d];
    }
    if (infer >= 0) {
        if (known == 0 || numel % known) {
            ctpu_set_error(CTPU_ERR_SHAPE, "%s: a is %s: cannot infer dim %d from %lld elements", opn,
                           ctpu_fmt_type(&in[0]->type, tb, sizeof tb), infer, (long long)numel);
            return false;
        }
        t.shape[infer] = numel / known;
        known = numel;
    }
    if (!ctpu__type_ok(opn, "the new shape", &t)) return false;
    if (known != numel) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: a is %s (%lld elements): the new shape has %lld", opn,
                       ctpu_fmt_type(&in[0]->type, tb, sizeof tb), (long long)numel, (long long)known);
        return false;
    }
    n->out = t;
    return true;
}

static bool sh_permute(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                       ctpu_node *n)
{
    (void)names;
    int nd = in[0]->type.ndim;
    const int *perm = a->dims;
    char tb[128];
    if (!perm && nd > 0) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: perm is NULL for a %s", opn,
                       ctpu_fmt_type(&in[0]->type, tb, sizeof tb));
        return false;
    }
    n->out = in[0]->type;
    uint32_t seen = 0;
    for (int d = 0; d < nd; d++) {
        int p = perm[d];
        if (p < 0) p += nd;
        if (p < 0 || p >= nd || (seen & (1u << p))) {
            ctpu_set_error(CTPU_ERR_SHAPE, "%s: a is %s: perm[%d]=%d is not a permutation of [0, %d)", opn,
                           ctpu_fmt_type(&in[0]->type, tb, sizeof tb), d, perm[d], nd);
            return false;
        }
        seen |= 1u << p;
        n->attr.dims[d] = p;
        n->out.shape[d] = in[0]->type.shape[p];
    }
    n->attr.n_dims = nd;
    return true;
}

static bool sh_slice(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                     ctpu_node *n)
{
    (void)names;
    char tb[128];
    if (in[0]->type.ndim == 0) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: a is %s: cannot slice a 0-d tensor", opn,
                       ctpu_fmt_type(&in[0]->type, tb, sizeof tb));
        return false;
    }
    int d = norm_dim(opn, a->dim, in[0], "dim");
    if (d < 0) return false;
    int64_t start = a->start, end = a->end, step = a->step;
    if (step < 1) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: step=%lld must be >= 1", opn, (long long)step);
        return false;
    }
    int64_t e = in[0]->type.shape[d];
    if (start < 0) start = start < -e ? 0 : start + e;
    if (end < 0) end = end < -e ? 0 : end + e;
    if (start > e) start = e;
    if (end > e) end = e;
    int64_t len = end > start ? (end - start - 1) / step + 1 : 0;   /* no overflow for a huge step */
    n->out = in[0]->type;
    n->out.shape[d] = len;
    n->attr.dims[0] = d;
    n->attr.n_dims = 1;
    n->attr.i64[0] = start;
    n->attr.i64[1] = end;
    n->attr.i64[2] = step;
    return true;
}

static bool sh_concat(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                      ctpu_node *n)
{
    (void)names;
    int d = norm_dim(opn, a->dim, in[0], "dim");
    if (d < 0) return false;
    char ta[128], tb[128];
    if (in[0]->type.ndim == 0) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: ts[0] is %s: cannot concatenate 0-d tensors", opn,
                       ctpu_fmt_type(&in[0]->type, ta, sizeof ta));
        return false;
    }
    n->out = in[0]->type;
    n->attr.extra = d;
    int64_t total = 0;
    for (int i = 0; i < n->n_in; i++) {
        const ctpu_vtype *t = &in[i]->type;
        bool ok = t->dtype == in[0]->type.dtype && t->ndim == in[0]->type.ndim;
        for (int k = 0; ok && k < t->ndim; k++) ok = k == d || t->shape[k] == in[0]->type.shape[k];
        if (!ok) {
            ctpu_set_error(t->dtype != in[0]->type.dtype ? CTPU_ERR_DTYPE : CTPU_ERR_SHAPE,
                           "%s: ts[0] is %s, ts[%d] is %s: must match in dtype and in every dim but %d", opn,
                           ctpu_fmt_type(&in[0]->type, ta, sizeof ta), i, ctpu_fmt_type(t, tb, sizeof tb), d);
            return false;
        }
        total += t->shape[d];
    }
    n->out.shape[d] = total;
    return true;
}

static bool sh_expand(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                      ctpu_node *n)
{
    (void)names;
    const ctpu_vtype *t = &in[0]->type;
    int ndim = a->ndim;
    const int64_t *shape = a->shape;
    char tb[128];
    if (ndim < t->ndim || ndim > CTPU_MAX_DIMS || (ndim && !shape)) {
        ctpu_set_error(ndim >= t->ndim && ndim <= CTPU_MAX_DIMS ? CTPU_ERR_INVALID_ARG : CTPU_ERR_SHAPE,
                       "%s: a is %s: ndim=%d must be in [%d, 8] with a shape%s", opn,
                       ctpu_fmt_type(t, tb, sizeof tb), ndim, t->ndim, shape ? "" : " (shape is NULL)");
        return false;
    }
    n->out = (ctpu_vtype){ .dtype = t->dtype, .ndim = (uint8_t)ndim };
    for (int d = 0; d < ndim; d++) {
        int id = d - (ndim - t->ndim);
        int64_t want = shape[d];
        int64_t have = id >= 0 ? t->shape[id] : 1;
        if (want == -1 && id >= 0) want = have;
        if (want < 0 || (have != 1 && have != want)) {
            ctpu_set_error(CTPU_ERR_SHAPE, "%s: a is %s: cannot expand dim %d (extent %lld) to %lld", opn,
                           ctpu_fmt_type(t, tb, sizeof tb), d, (long long)have, (long long)shape[d]);
            return false;
        }
        n->out.shape[d] = want;
    }
    ctpu_vtype chk;   /* the element count must not overflow (2^40 x 2^40 wrapped to 0) */
    return ctpu__validate_shape(opn, ndim, n->out.shape, (ctpu_dtype)t->dtype, &chk);
}

static bool sh_embedding(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                         ctpu_node *n)
{
    (void)names, (void)a;
    char ta[128], tb[128];
    const ctpu_vtype *w = &in[0]->type, *ix = &in[1]->type;
    if (w->ndim != 2 || w->dtype == CTPU_I32 || ix->dtype != CTPU_I32 || ix->ndim >= CTPU_MAX_DIMS) {
        ctpu_set_error(w->ndim != 2 || ix->ndim >= CTPU_MAX_DIMS ? CTPU_ERR_SHAPE : CTPU_ERR_DTYPE,
                       "%s: weight is %s, indices is %s: need weight f32/bf16 [V,D] and i32 indices of < 8 dims",
                       opn, ctpu_fmt_type(w, ta, sizeof ta), ctpu_fmt_type(ix, tb, sizeof tb));
        return false;
    }
    n->out = *ix;
    n->out.shape[n->out.ndim++] = w->shape[1];
    return true;
}

static bool sh_gather(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                      ctpu_node *n)
{
    (void)names;
    char ta[128], tb[128];
    const ctpu_vtype *t = &in[0]->type, *ix = &in[1]->type;
    int d = norm_dim(opn, a->dim, in[0], "dim");
    if (d < 0) return false;
    bool ok = ix->dtype == CTPU_I32 && ix->ndim == t->ndim;
    for (int k = 0; ok && k < t->ndim; k++) ok = k == d || ix->shape[k] <= t->shape[k];
    if (!ok || t->ndim == 0) {
        ctpu_set_error(ix->dtype != CTPU_I32 ? CTPU_ERR_DTYPE : CTPU_ERR_SHAPE,
                       "%s: a is %s, index is %s: index must be i32 with a's ndim and extents <= a's (but dim %d)",
                       opn, ctpu_fmt_type(t, ta, sizeof ta), ctpu_fmt_type(ix, tb, sizeof tb), d);
        return false;
    }
    n->out = *ix;
    n->attr.extra = d;
    return true;
}

/* torch.scatter_add: self, index (i32) and src of one ndim >= 1; src's dtype
 * is self's; index.shape[d] <= src.shape[d] for every d and <= self.shape[d]
 * for d != dim. The result has self's type. */
static bool sh_scatter(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                       ctpu_node *n)
{
    (void)names;
    char ts[96], ti[96], tr[96];
    const ctpu_vtype *t = &in[0]->type, *ix = &in[1]->type, *src = &in[2]->type;
    int d = norm_dim(opn, a->dim, in[0], "dim");
    if (d < 0) return false;
    bool ok = t->ndim >= 1 && ix->ndim == t->ndim && src->ndim == t->ndim;
    for (int k = 0; ok && k < t->ndim; k++)
        ok = ix->shape[k] <= src->shape[k] && (k == d || ix->shape[k] <= t->shape[k]);
    int st = ix->dtype != CTPU_I32 || src->dtype != t->dtype ? CTPU_ERR_DTYPE : CTPU_ERR_SHAPE;
    if (!ok || st == CTPU_ERR_DTYPE) {
        ctpu_set_error(st, "%s: self is %s, index is %s, src is %s: need an i32 index and src of self's dtype, all of "
                       "one ndim >= 1, index's extents <= src's and (but dim %d) <= self's", opn,
                       ctpu_fmt_type(t, ts, sizeof ts), ctpu_fmt_type(ix, ti, sizeof ti),
                       ctpu_fmt_type(src, tr, sizeof tr), d);
        return false;
    }
    n->out = *t;
    n->attr.extra = d;
    return true;
}

/* torch.matmul: batch dims broadcast; a 1-D a is [1,K] and a 1-D b is [K,1]
 * (ctpu_matmul squeezes them after). The transposed-operand form (matmul_t:
 * autograd's rules, ctpu_matmul_t) takes operands of >= 2 dims, a stored
 * [.., K, M] with CTPU_ATTR_TRANS_A, b stored [.., N, K] with CTPU_ATTR_TRANS_B. */
static bool sh_matmul(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                      ctpu_node *n)
{
    (void)names;
    const ctpu_vtype *ta = &in[0]->type, *tb = &in[1]->type;
    bool tra = (a->flags & CTPU_ATTR_TRANS_A) != 0, trb = (a->flags & CTPU_ATTR_TRANS_B) != 0;
    char sa[128], sb[128];
    if (a->matmul_t ? ta->ndim < 2 || tb->ndim < 2 : ta->ndim == 0 || tb->ndim == 0) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: a is %s, b is %s: %s", opn, ctpu_fmt_type(ta, sa, sizeof sa),
                       ctpu_fmt_type(tb, sb, sizeof sb),
                       a->matmul_t ? "a transposed operand needs at least 2 dims" : "both operands need at least 1 dim");
        return false;
    }
    if ((ta->dtype == CTPU_I32) != (tb->dtype == CTPU_I32)) {
        ctpu_set_error(CTPU_ERR_DTYPE, "%s: a is %s, b is %s: i32 matmul needs both operands i32", opn,
                       ctpu_fmt_type(ta, sa, sizeof sa), ctpu_fmt_type(tb, sb, sizeof sb));
        return false;
    }
    ctpu_vtype va = *ta, vb = *tb;
    if (ta->ndim == 1) { va.ndim = 2; va.shape[0] = 1; va.shape[1] = ta->shape[0]; }
    if (tb->ndim == 1) { vb.ndim = 2; vb.shape[0] = tb->shape[0]; vb.shape[1] = 1; }
    int ra = va.ndim, rb = vb.ndim;
    int64_t M = tra ? va.shape[ra - 1] : va.shape[ra - 2], K = tra ? va.shape[ra - 2] : va.shape[ra - 1];
    int64_t Kb = trb ? vb.shape[rb - 1] : vb.shape[rb - 2], N = trb ? vb.shape[rb - 2] : vb.shape[rb - 1];
    if (K != Kb) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: a is %s%s, b is %s%s: inner dims differ (%lld vs %lld)", opn,
                       ctpu_fmt_type(ta, sa, sizeof sa), tra ? " (transposed)" : "",
                       ctpu_fmt_type(tb, sb, sizeof sb), trb ? " (transposed)" : "", (long long)K, (long long)Kb);
        return false;
    }
    int ba = ra - 2, bb = rb - 2, nb = ba > bb ? ba : bb;
    n->out.ndim = (uint8_t)(nb + 2);
    for (int d = 0; d < nb; d++) {
        int da = d - (nb - ba), db = d - (nb - bb);
        int64_t xa = da >= 0 ? va.shape[da] : 1, xb = db >= 0 ? vb.shape[db] : 1;
        if (xa != xb && xa != 1 && xb != 1) {
            ctpu_set_error(CTPU_ERR_SHAPE, "%s: a is %s, b is %s: batch dims are not broadcastable (%lld vs %lld)",
                           opn, ctpu_fmt_type(ta, sa, sizeof sa), ctpu_fmt_type(tb, sb, sizeof sb), (long long)xa,
                           (long long)xb);
            return false;
        }
        n->out.shape[d] = xa == 1 ? xb : xa;
    }
    n->out.shape[nb] = M;
    n->out.shape[nb + 1] = N;
    n->attr.extra = a->precision;
    return true;
}

static bool sh_create(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                      ctpu_node *n)
{
    (void)names, (void)in;
    return ctpu__validate_shape(opn, a->ndim, a->shape, (ctpu_dtype)a->dtype, &n->out);
}

/* copy and the backward helpers: their builders set the output type */
static bool sh_given(const char *opn, const char *const *names, ctpu_trec *const *in, const op_args *a,
                     ctpu_node *n)
{
    (void)names, (void)in, (void)a, (void)n;
    ctpu_set_error(CTPU_ERR_STATE, "%s: is built with its output type, not dispatched from arguments", opn);
    return false;
}

static const struct {
    shape_rule_fn fn;
    const char *const *names;   /* the inputs' names in errors */
} shape_rules[CTPU_SH_RULE_COUNT] = {
    [CTPU_SH_SAME] = { sh_same, NM_A },
    [CTPU_SH_BROADCAST] = { sh_broadcast, NM_AB },
    [CTPU_SH_REDUCE] = { sh_reduce, NM_A },
    [CTPU_SH_ARGREDUCE] = { sh_argreduce, NM_A },
    [CTPU_SH_ALONG] = { sh_along, NM_A },
    [CTPU_SH_RESHAPE] = { sh_reshape, NM_A },
    [CTPU_SH_PERMUTE] = { sh_permute, NM_A },
    [CTPU_SH_SLICE] = { sh_slice, NM_A },
    [CTPU_SH_CONCAT] = { sh_concat, NM_TS },
    [CTPU_SH_EXPAND] = { sh_expand, NM_A },
    [CTPU_SH_EMBEDDING] = { sh_embedding, NM_EMBEDDING },
    [CTPU_SH_GATHER] = { sh_gather, NM_GATHER },
    [CTPU_SH_SCATTER] = { sh_scatter, NM_SCATTER },
    [CTPU_SH_MATMUL] = { sh_matmul, NM_AB },
    [CTPU_SH_CREATE] = { sh_create, NULL },
    [CTPU_SH_GIVEN] = { sh_given, NULL },
};

/* ------------------------------------------------------------ dtype rules
 * One function per CTPU_DT_* id: the output dtype (PyTorch promotion). */
typedef bool (*dtype_rule_fn)(const char *opn, ctpu_trec *const *in, const op_args *a, ctpu_node *n);

static ctpu_dtype in_dt(ctpu_trec *const *in, int i) { return (ctpu_dtype)in[i]->type.dtype; }
static ctpu_dtype floated(ctpu_dtype d) { return d == CTPU_I32 ? CTPU_F32 : d; }

#define DT_RULE(name, expr)                                                                       \
    static bool name(const char *opn, ctpu_trec *const *in, const op_args *a, ctpu_node *n)      \
    {                                                                                             \
        (void)opn, (void)in, (void)a;                                                             \
        n->out.dtype = (uint8_t)(expr);                                                           \
        return true;                                                                              \
    }
DT_RULE(dt_same, in_dt(in, 0))
DT_RULE(dt_float, floated(in_dt(in, 0)))
DT_RULE(dt_promote, promote(in_dt(in, 0), in_dt(in, 1)))
DT_RULE(dt_promote_float, floated(promote(in_dt(in, 0), in_dt(in, 1))))
DT_RULE(dt_mask, CTPU_F32)
DT_RULE(dt_where, promote(in_dt(in, 1), in_dt(in, 2)))
DT_RULE(dt_index, CTPU_I32)
DT_RULE(dt_matmul, in_dt(in, 0) == CTPU_I32 ? CTPU_I32
                   : in_dt(in, 0) == CTPU_BF16 && in_dt(in, 1) == CTPU_BF16 ? CTPU_BF16 : CTPU_F32)
DT_RULE(dt_arg, a->dtype)
DT_RULE(dt_given, n->out.dtype)
#undef DT_RULE

static bool dt_cast(const char *opn, ctpu_trec *const *in, const op_args *a, ctpu_node *n)
{
    (void)in;
    if ((unsigned)a->dtype >= CTPU_DTYPE_COUNT) {
        ctpu_set_error(CTPU_ERR_DTYPE, "%s: dt=%d is not a ctpu_dtype", opn, a->dtype);
        return false;
    }
    n->out.dtype = (uint8_t)a->dtype;
    n->attr.extra = a->dtype;
    return true;
}

static const dtype_rule_fn dtype_rules[CTPU_DT_RULE_COUNT] = {
    [CTPU_DT_SAME] = dt_same,
    [CTPU_DT_FLOAT] = dt_float,
    [CTPU_DT_PROMOTE] = dt_promote,
    [CTPU_DT_PROMOTE_FLOAT] = dt_promote_float,
    [CTPU_DT_MASK] = dt_mask,
    [CTPU_DT_WHERE] = dt_where,
    [CTPU_DT_INDEX] = dt_index,
    [CTPU_DT_MATMUL] = dt_matmul,
    [CTPU_DT_CAST] = dt_cast,
    [CTPU_DT_ARG] = dt_arg,
    [CTPU_DT_GIVEN] = dt_given,
};

static const char *named_inputs(const ctpu_node *node, ctpu_trec *const *in, char *out, size_t len)
{
    out[0] = 0;
    const char *const *names = shape_rules[ctpu_op_infos[node->op].shape_rule].names;
    size_t k = 0;
    for (int i = 0; in && names && i < node->n_in && k < len; i++) {
        const char *nm = ctpu_rec_name(in[i]);
        if (!nm[0]) continue;
        int w = snprintf(out + k, len - k, "%s%s is %s", k ? ", " : " (", names[i], nm);
        if (w < 0) break;
        k += (size_t)w;
    }
    if (k && k + 2 <= len) { out[k] = ')'; out[k + 1] = 0; }
    else if (k) out[0] = 0;   /* (cut short: none rather than half) */
    return out;
}

bool ctpu__test_op_rules_defined(int op)
{
    if (op < 0 || op >= CTPU_OP_COUNT) return false;
    const ctpu_op_info *o = &ctpu_op_infos[op];
    return o->shape_rule < CTPU_SH_RULE_COUNT && shape_rules[o->shape_rule].fn &&
           o->dtype_rule < CTPU_DT_RULE_COUNT && dtype_rules[o->dtype_rule];
}

/* ------------------------------------------------------------ the op's node */
/* The node of op applied to n_in resolved inputs (in holds CTPU_NODE_MAX_IN):
 * its shape rule, then its dtype rule (both from the op's row). */
static inline const char *const *input_names(const ctpu_op_info *o, const op_args *a)
{
    return a->names ? a->names : shape_rules[o->shape_rule].names;
}

static inline bool infer_rules(int op, const char *opn, const char *const *names, int n_in, ctpu_trec *const *in,
                               const op_args *a, ctpu_node *n)
{
    const ctpu_op_info *o = &ctpu_op_infos[op];
    memset(n, 0, sizeof *n);   /* (not a compound literal: no temporary to copy on every op) */
    n->op = (uint16_t)op;
    n->n_in = (uint8_t)n_in;
    n->n_scalars = (uint8_t)a->n_scalars;
    n->attr.flags = a->flags | (a->int_scalar ? CTPU_ATTR_INT_SCALAR : 0u);
    n->attr.call = a->call;
    /* the elementwise rules called directly (every strict op's path; the same functions the tables hold) */
    bool ok = o->shape_rule == CTPU_SH_SAME        ? sh_same(opn, names, in, a, n)
              : o->shape_rule == CTPU_SH_BROADCAST ? sh_broadcast(opn, names, in, a, n)
                                                   : shape_rules[o->shape_rule].fn(opn, names, in, a, n);
    if (!ok) return false;
    switch (o->dtype_rule) {
    case CTPU_DT_SAME: return dt_same(opn, in, a, n);
    case CTPU_DT_FLOAT: return dt_float(opn, in, a, n);
    case CTPU_DT_PROMOTE: return dt_promote(opn, in, a, n);
    default: return dtype_rules[o->dtype_rule](opn, in, a, n);
    }
}

static bool dyn_probe(int op, const char *opn, const char *const *names, int n_in, ctpu_trec *const *in,
                      const op_args *a, const ctpu_node *n);

/* A node whose extents come from its arguments (a creation, expand,
 * reshape or slice of static tensors) in a trace that has symbols: an
 * output extent equal to a symbol's value is taken to be that symbol
 * (ctpu_full at a batch's size, a slice of a position table to the
 * sequence's length); in a backward rule, a tensor at the shape of the tape
 * entry's input or output takes its dynamic dims. Only the key depends on it: a
 * coincidence costs a recompile, never a wrong program (a bind derives
 * every step from the launch's own extents). */
static void dyn_guess_args(const ctpu_node *n, const op_args *a)
{
    ctpu_thread_state *ts = ctpu__ts;
    ctpu_dyndim out[CTPU_MAX_DIMS];
    memset(out, 0, sizeof out);
    int hint = ctpu__ag_hint_dyn(&n->out, out);
    if (hint) {   /* a backward rule's tensor at its forward value's shape */
        if (hint < 0) return;
        memcpy(ts->dyn_out, out, sizeof out);
        ts->dyn_out_set = true;
        return;
    }
    bool any = false;
    /* a slice's other dims are its input's (static): x[0:T] of a [ctx, dmodel]
     * table at T = dmodel is [T, dmodel] */
    bool slice = ctpu_op_infos[n->op].shape_rule == CTPU_SH_SLICE;
    int only = slice && a->dim < 0 ? a->dim + n->out.ndim : a->dim;
    for (int d = 0; d < n->out.ndim; d++) {
        int64_t x = n->out.shape[d];
        if (slice && d != only) continue;
        for (int q = 0; q < ts->df.n_sym && !out[d].coef; q++)
            if (x == ts->df.sym[q].v) out[d] = (ctpu_dyndim){ ts->df.sym[q].lo, ts->df.sym[q].hi, 1 };
        any |= out[d].coef > 0;
    }
    if (!any) return;
    memcpy(ts->dyn_out, out, sizeof out);
    ts->dyn_out_set = true;
}

/* A value dispatch reshapes to another value's type (attention's packed
 * output parts, attention.c): that value's dims, when its shape is this
 * node's (the probe may have moved a dim of equal extent instead). */
static void dyn_take_like(const ctpu_node *n)
{
    ctpu_thread_state *ts = ctpu__ts;
    const ctpu_trec *l = ts->dyn_like;
    if (ctpu_op_infos[n->op].shape_rule != CTPU_SH_RESHAPE || l->type.ndim != n->out.ndim ||
        memcmp(l->type.shape, n->out.shape, sizeof(int64_t) * (size_t)n->out.ndim) != 0)
        return;
    memcpy(ts->dyn_out, l->dyn, sizeof ts->dyn_out);
    ts->dyn_out_set = true;
}

static inline bool infer_named(int op, const char *opn, const char *const *names, int n_in, ctpu_trec *const *in,
                               const op_args *a, ctpu_node *n)
{
    if (!infer_rules(op, opn, names, n_in, in, a, n)) return false;
    ctpu_thread_state *ts = ctpu__ts;   /* (a thread without state reads a constant one: written only when set) */
    if (ts->dyn_out_set) ts->dyn_out_set = false;
    /* (not for a view, which records no node and so no input; a slice may be one) */
    if (__builtin_expect(ctpu_rt->auto_dynamic, 0) && !ctpu_op_is(op, CTPU_OPK_VIEW) && op != CTPU_OP_SLICE &&
        ctpu_mode_now() == CTPU_MODE_DEFER_FUSE && ctpu__ts_get())
        ctpu__defer_auto_inputs(in, n_in);
    bool any = false;
    for (int i = 0; i < n_in; i++) any |= in[i]->dyn != NULL;
    if (__builtin_expect(any, 0) && ctpu_mode_now() == CTPU_MODE_DEFER_FUSE && ctpu__ts_get()) {
        if (!dyn_probe(op, opn, names, n_in, in, a, n)) return false;
        if (ts->dyn_like) dyn_take_like(n);
        if (ts->ag_hint && ts->dyn_out_set) {
            /* a backward rule's tensor at a static input's shape is static;
             * a reshape back to its forward input's shape takes that
             * input's dims (the gradient of [B, T, V] -> [B*T, V] at T = B:
             * the flat dim's split is ambiguous to the probe) */
            ctpu_dyndim h[CTPU_MAX_DIMS];
            int hint = ctpu__ag_hint_dyn(&n->out, h);
            if (hint < 0) memset(ts->dyn_out, 0, sizeof ts->dyn_out);
            else if (hint > 0 && ctpu_op_infos[op].shape_rule == CTPU_SH_RESHAPE) memcpy(ts->dyn_out, h, sizeof h);
        }
        return true;
    }
    if (__builtin_expect(n_in == 0 && ts->dyn_like != NULL, 0) && ctpu_mode_now() == CTPU_MODE_DEFER_FUSE) {
        /* a *_like creator of a value with dynamic dims: the value's dims */
        const ctpu_trec *l = ts->dyn_like;
        if (l->type.ndim == n->out.ndim &&
            memcmp(l->type.shape, n->out.shape, sizeof(int64_t) * (size_t)n->out.ndim) == 0) {
            memcpy(ts->dyn_out, l->dyn, sizeof ts->dyn_out);
            ts->dyn_out_set = true;
            return true;
        }
    }
    if (__builtin_expect(ts->df.n_sym > 0, 0) && ((a->shape && ts->ag_hint) || ctpu_op_infos[op].shape_rule == CTPU_SH_SLICE) &&
        ctpu_mode_now() == CTPU_MODE_DEFER_FUSE)
        dyn_guess_args(n, a);
    return true;
}

/* ------------------------------------------------------------ dynamic dims
 * In defer and fuse, a node whose inputs have dynamic dims (ctpu_mark_dynamic)
 * gets its own by probing its shape rule: each symbol's extents (and the
 * shape, slice or range arguments equal to a multiple of them) are moved
 * from s to s + 1 and the rule run again, quietly; an output dim that moves
 * by c with extent c * s is c times the symbol. A rule that fails at s + 1
 * is not valid for every extent of the range: the op fails here. */
bool ctpu__rec_set_dyn(ctpu_trec *r, const ctpu_dyndim *d, int ndim)
{
    bool any = false;
    for (int i = 0; d && i < ndim; i++) any |= d[i].coef > 0;
    if (!any) {
        free(r->dyn);
        r->dyn = NULL;
        return true;
    }
    if (!r->dyn && !(r->dyn = malloc(sizeof(ctpu_dyndim) * CTPU_MAX_DIMS))) return false;
    memset(r->dyn, 0, sizeof(ctpu_dyndim) * CTPU_MAX_DIMS);
    memcpy(r->dyn, d, sizeof(ctpu_dyndim) * (size_t)ndim);
    return true;
}

typedef struct { int64_t lo, hi, v; } dyn_sym;

/* The in-range symbols of the inputs (at most 8). */
static int dyn_syms(int n_in, ctpu_trec *const *in, dyn_sym *sy)
{
    int n = 0;
    for (int i = 0; i < n_in; i++) {
        if (!in[i]->dyn) continue;
        for (int d = 0; d < in[i]->type.ndim; d++) {
            const ctpu_dyndim *y = &in[i]->dyn[d];
            if (y->coef <= 0 || in[i]->type.shape[d] % y->coef) continue;
            int64_t v = in[i]->type.shape[d] / y->coef;
            if (v < y->lo || v > y->hi) continue;
            bool seen = false;
            for (int k = 0; k < n && !seen; k++) seen = sy[k].lo == y->lo && sy[k].hi == y->hi && sy[k].v == v;
            if (!seen && n < 8) sy[n++] = (dyn_sym){ y->lo, y->hi, v };
        }
    }
    return n;
}

static bool dyn_of_sym(const ctpu_trec *r, int d, const dyn_sym *y)
{
    const ctpu_dyndim *x = r->dyn ? &r->dyn[d] : NULL;
    return x && x->coef > 0 && x->lo == y->lo && x->hi == y->hi && r->type.shape[d] == x->coef * y->v;
}

/* An argument extent that is a multiple of the symbol: moved with it. */
static int64_t dyn_move(int64_t x, const dyn_sym *y) { return x > 0 && x % y->v == 0 ? x / y->v * (y->v + 1) : x; }

#define DYN_MV_ALL 0xffffffffu   /* every multiple-of-s target extent moves */

/* Probe the rule for symbol y; false: not valid at s + 1. mv: which
 * target dims move, of those whose extent is a multiple of s (bit d). */
static bool dyn_probe_one(int op, const char *opn, const char *const *names, int n_in, ctpu_trec *const *in,
                          const op_args *a, const dyn_sym *y, uint32_t mv, ctpu_node *pn)
{
    ctpu_trec pr[CTPU_NODE_MAX_IN];
    ctpu_trec *pin[CTPU_NODE_MAX_IN];
    for (int i = 0; i < n_in; i++) {
        pr[i] = *in[i];
        for (int d = 0; d < pr[i].type.ndim; d++)
            if (dyn_of_sym(in[i], d, y)) pr[i].type.shape[d] = in[i]->dyn[d].coef * (y->v + 1);
        pin[i] = &pr[i];
    }
    op_args pa = *a;
    int64_t shp[CTPU_MAX_DIMS];
    int sh = ctpu_op_infos[op].shape_rule;
    if (a->shape && a->ndim > 0 && a->ndim <= CTPU_MAX_DIMS) {
        for (int d = 0; d < a->ndim; d++) shp[d] = mv >> d & 1u ? dyn_move(a->shape[d], y) : a->shape[d];
        pa.shape = shp;
    }
    /* (a packed value's parts; bounds of a dim that is not of the symbol,
     * such as x[:, 0:8] of x[s, 16], stay put) */
    if (sh == CTPU_SH_SLICE && a->dim >= 0 && a->dim < in[0]->type.ndim && dyn_of_sym(in[0], a->dim, y)) {
        pa.end = dyn_move(a->end, y);
        pa.start = dyn_move(a->start, y);
    }
    ctpu__ts->quiet_errors++;
    bool ok = infer_rules(op, opn, names, n_in, pin, &pa, pn);
    ctpu__ts->quiet_errors--;
    return ok;
}

/* The target dim that is the k-th multiple of s (0 when there is none). */
static uint32_t dyn_kth_mult(const op_args *a, const dyn_sym *y, int k)
{
    for (int d = 0; a->shape && d < a->ndim && d < CTPU_MAX_DIMS; d++)
        if (a->shape[d] > 0 && a->shape[d] % y->v == 0 && k-- == 0) return 1u << d;
    return 0;
}

/* A reshape's target dims that hold the input's dims of the symbol (a
 * split [B, T, dmodel] -> [B, -1, heads, head_dim] at T = head_dim, T = B
 * or T = heads; a merge [B*H, T, T] -> [B, H, T, T] at T = H): for each
 * input dim of the symbol, the target dim whose element-count prefix
 * before it divides the one before the input dim and whose prefix through
 * it is a multiple of the one through the input dim. Those dims move (a
 * -1 among them moves by itself), whichever other extents equal a
 * multiple of s; -1 (as a mask: every bit): no such set (a dim of the
 * symbol split, or two merged into one given extent). */
static uint32_t reshape_holders(const ctpu_trec *x, const op_args *a, const ctpu_node *n, const dyn_sym *y)
{
    if (a->ndim != n->out.ndim || a->ndim > CTPU_MAX_DIMS) return DYN_MV_ALL;
    uint32_t mv = 0;
    bool any = false;
    for (int e = 0; e < x->type.ndim; e++) {
        if (!dyn_of_sym(x, e, y)) continue;
        any = true;
        int64_t p_in = 1, p = 1;
        for (int d = 0; d < e; d++) p_in *= x->type.shape[d];
        int64_t p_through = p_in * x->type.shape[e];
        int h = -1;
        for (int d = 0; d < n->out.ndim && h < 0; d++) {
            int64_t q = p * n->out.shape[d];
            if (p > 0 && p_in % p == 0 && p_through > 0 && q % p_through == 0) h = d;
            p = q;
        }
        if (h < 0) return DYN_MV_ALL;
        if (a->shape[h] < 0) continue;
        if (a->shape[h] == 0 || a->shape[h] % y->v || mv >> h & 1u) return DYN_MV_ALL;
        mv |= 1u << h;
    }
    return any ? mv : DYN_MV_ALL;
}

static bool dyn_probe(int op, const char *opn, const char *const *names, int n_in, ctpu_trec *const *in,
                      const op_args *a, const ctpu_node *n)
{
    dyn_sym sy[8];
    int ns = dyn_syms(n_in, in, sy);
    ctpu_dyndim out[CTPU_MAX_DIMS];
    memset(out, 0, sizeof out);
    bool reshape = ctpu_op_infos[op].shape_rule == CTPU_SH_RESHAPE;
    bool args = a->shape && a->ndim > 0;
    for (int k = 0; k < ns; k++) {
        ctpu_node pn;
        /* which shape-argument extents are of the symbol: a reshape's target
         * dims that hold the input's dims of the symbol first
         * (reshape_holders: the element-count prefixes, which do not depend
         * on which other extents equal a multiple of s, so a split [B, T,
         * dmodel] -> [B, -1, heads, head_dim] at T = head_dim keeps head_dim
         * static, the -1 taking the move), then every multiple of s (the
         * element count pins them), then each one; other ops (expand) move
         * the fewest that keep the rule valid, so an extent equal to a
         * multiple of s by coincidence (expand of [s, 1] to [s, 8] at s = 2,
         * 4 or 8) stays static */
        uint32_t pref = reshape && args ? reshape_holders(in[0], a, n, &sy[k]) : DYN_MV_ALL;
        bool ok = pref != DYN_MV_ALL && dyn_probe_one(op, opn, names, n_in, in, a, &sy[k], pref, &pn);
        if (!ok)
            ok = dyn_probe_one(op, opn, names, n_in, in, a, &sy[k], reshape || !args ? DYN_MV_ALL : 0u, &pn);
        for (int pick = 0; !ok && args && pick < CTPU_MAX_DIMS; pick++) {
            uint32_t m = dyn_kth_mult(a, &sy[k], pick);
            ok = m && m != pref && dyn_probe_one(op, opn, names, n_in, in, a, &sy[k], m, &pn);
        }
        if (!ok && args && !reshape) ok = dyn_probe_one(op, opn, names, n_in, in, a, &sy[k], DYN_MV_ALL, &pn);
        if ((!ok || pn.out.ndim != n->out.ndim) && !reshape) {
            /* (an operand whose extent equals the symbol's now, such as a
             * tensor made at this extent: the value is static in the key,
             * and a trace at another extent compiles its own program) */
            memset(out, 0, sizeof out);
            break;
        }
        if (!ok || pn.out.ndim != n->out.ndim) {
            char tb[128];
            ctpu_set_error(CTPU_ERR_SHAPE,
                           "%s: a is %s with a dynamic dim in [%lld, %lld] (now %lld): the result is not valid for "
                           "every extent of the range (give the extent that varies as -1 or a multiple of it, or "
                           "mark the other operand's dim dynamic too)",
                           opn, ctpu_fmt_type(&in[0]->type, tb, sizeof tb), (long long)sy[k].lo, (long long)sy[k].hi,
                           (long long)sy[k].v);
            return false;
        }
        for (int d = 0; d < n->out.ndim; d++) {
            int64_t x = n->out.shape[d], dx = pn.out.shape[d] - x;
            if (dx == 0) continue;
            if (dx > 0 && x == dx * sy[k].v && out[d].coef == 0) out[d] = (ctpu_dyndim){ sy[k].lo, sy[k].hi, dx };
            else out[d].coef = -1;   /* not c * s of one symbol: static in the key */
        }
    }
    for (int d = 0; d < n->out.ndim; d++)
        if (out[d].coef < 0) out[d] = (ctpu_dyndim){ 0, 0, 0 };
    memcpy(ctpu__ts->dyn_out, out, sizeof out);
    ctpu__ts->dyn_out_set = true;
    return true;
}

ctpu_status ctpu_mark_dynamic(ctpu_tensor t, int dim, int64_t lo, int64_t hi)
{
    ctpu_trec *r = ctpu_rec_get(t, "mark_dynamic", "t", false);
    if (!r) return ctpu_last_status();
    char tb[128];
    int nd = r->type.ndim;
    if (dim < -nd || dim >= nd) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "mark_dynamic: t is %s: dim=%d is outside [%d, %d]",
                       ctpu_fmt_type(&r->type, tb, sizeof tb), dim, -nd, nd - 1);
        return CTPU_ERR_INVALID_ARG;
    }
    if (lo < 2 || hi < lo || hi > ((int64_t)1 << 40)) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG,
                       "mark_dynamic: t is %s: range [%lld, %lld] for dim %d: need 2 <= lo <= hi <= 2^40 (extent 1 "
                       "changes broadcasting)",
                       ctpu_fmt_type(&r->type, tb, sizeof tb), (long long)lo, (long long)hi, dim);
        return CTPU_ERR_INVALID_ARG;
    }
    if (ctpu_rec_pending(r)) {
        ctpu_set_error(CTPU_ERR_STATE,
                       "mark_dynamic: t is %s, a pending value of the trace: mark the tensors a step reads (its "
                       "inputs), before their first use",
                       ctpu_fmt_type(&r->type, tb, sizeof tb));
        return CTPU_ERR_STATE;
    }
    if (dim < 0) dim += nd;
    ctpu_dyndim d[CTPU_MAX_DIMS];
    memset(d, 0, sizeof d);
    if (r->dyn) memcpy(d, r->dyn, sizeof d);
    d[dim] = (ctpu_dyndim){ lo, hi, 1 };
    if (!ctpu__rec_set_dyn(r, d, nd)) {
        ctpu_set_error(CTPU_ERR_OOM, "mark_dynamic: out of host memory");
        return CTPU_ERR_OOM;
    }
    /* the symbol is live in this thread's trace from now (a slice of a
     * position table to its extent, made before the batch is first read) */
    ctpu_thread_state *ts = ctpu__ts_get();
    int64_t v = r->type.shape[dim];
    if (ts && v >= lo && v <= hi) {
        bool seen = false;
        for (int q = 0; q < ts->df.n_sym && !seen; q++)
            seen = ts->df.sym[q].lo == lo && ts->df.sym[q].hi == hi && ts->df.sym[q].v == v;
        if (!seen && ts->df.n_sym < 8) {
            ts->df.sym[ts->df.n_sym].lo = lo;
            ts->df.sym[ts->df.n_sym].hi = hi;
            ts->df.sym[ts->df.n_sym++].v = v;
        }
    }
    return CTPU_OK;
}

ctpu_status ctpu_declare_dynamic_inputs(ctpu_dtype dt, int ndim, int dim, int64_t lo, int64_t hi)
{
    const char *why = NULL;
    if ((int)dt < 0 || dt >= CTPU_DTYPE_COUNT) why = "dt is not a dtype";
    else if (ndim < 1 || ndim > CTPU_MAX_DIMS) why = "ndim is outside [1, 8]";
    else if (dim < -ndim || dim >= ndim) why = "dim is outside [-ndim, ndim)";
    else if (lo < 2 || hi < lo || hi > ((int64_t)1 << 40)) why = "need 2 <= lo <= hi <= 2^40 (extent 1 changes broadcasting)";
    if (why) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "declare_dynamic_inputs: dt=%d ndim=%d dim=%d range [%lld, %lld]: %s",
                       (int)dt, ndim, dim, (long long)lo, (long long)hi, why);
        return CTPU_ERR_INVALID_ARG;
    }
    ctpu_thread_state *ts = ctpu__ts_get();
    if (!ts) {
        ctpu_set_error(CTPU_ERR_OOM, "declare_dynamic_inputs: out of host memory");
        return CTPU_ERR_OOM;
    }
    if (dim < 0) dim += ndim;
    int k = 0;
    while (k < ts->n_dyn_decl && !(ts->dyn_decl[k].dt == (int)dt && ts->dyn_decl[k].ndim == ndim &&
                                    ts->dyn_decl[k].dim == dim))
        k++;
    if (k == CTPU_DYN_DECLS) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG,
                       "declare_dynamic_inputs: dt=%s ndim=%d dim=%d: %d declarations stand already "
                       "(ctpu_clear_dynamic_inputs ends them)",
                       ctpu_dtype_name(dt), ndim, dim, CTPU_DYN_DECLS);
        return CTPU_ERR_INVALID_ARG;
    }
    ts->dyn_decl[k].dt = (int)dt;
    ts->dyn_decl[k].ndim = ndim;
    ts->dyn_decl[k].dim = dim;
    ts->dyn_decl[k].lo = lo;
    ts->dyn_decl[k].hi = hi;
    if (k == ts->n_dyn_decl) ts->n_dyn_decl++;
    return CTPU_OK;
}

void ctpu_clear_dynamic_inputs(void)
{
    ctpu_thread_state *ts = ctpu__ts_get();
    if (ts) ts->n_dyn_decl = 0;
}

ctpu_tensor ctpu__declared_dynamic(ctpu_tensor t, int dt, int ndim, const int64_t *shape)
{
    const ctpu_thread_state *ts = ctpu__ts;
    if (!ts->n_dyn_decl || ctpu_is_null(t)) return t;
    for (int k = 0; k < ts->n_dyn_decl; k++) {
        const int d = ts->dyn_decl[k].dim;
        if (ts->dyn_decl[k].dt != dt || ts->dyn_decl[k].ndim != ndim || shape[d] < ts->dyn_decl[k].lo ||
            shape[d] > ts->dyn_decl[k].hi)
            continue;
        if (ctpu_mark_dynamic(t, d, ts->dyn_decl[k].lo, ts->dyn_decl[k].hi) != CTPU_OK) {
            ctpu_release(t);
            return ctpu_failed();
        }
    }
    return t;
}

static inline bool infer(int op, const char *opn, int n_in, ctpu_trec *const *in, const op_args *a, ctpu_node *n)
{
    return infer_named(op, opn, input_names(&ctpu_op_infos[op], a), n_in, in, a, n);
}

/* PyTorch's promotion of a 0-d tensor: it does not raise the dtype of a
 * dimensioned operand of its category, so bf16[N] op f32[] (add, mul, div,
 * a comparison, where's branches, ...) is a bf16 op, the 0-d value rounded
 * to bf16 first (torch casts the operands to the common dtype). Returns the
 * index of the 0-d f32 operand to cast, or -1 (the common case: one compare
 * of the op's dtype rule). */
static int zero_dim_to_bf16(int op, int n_in, ctpu_trec *const *in)
{
    const int r = ctpu_op_infos[op].dtype_rule;
    int i = r == CTPU_DT_WHERE ? 1 : 0;
    if (!(r == CTPU_DT_PROMOTE || r == CTPU_DT_PROMOTE_FLOAT || r == CTPU_DT_WHERE || r == CTPU_DT_MASK) || n_in != i + 2)
        return -1;
    const ctpu_vtype *x = &in[i]->type, *y = &in[i + 1]->type;
    if (x->dtype == CTPU_BF16 && x->ndim > 0 && y->dtype == CTPU_F32 && y->ndim == 0) return i + 1;
    if (y->dtype == CTPU_BF16 && y->ndim > 0 && x->dtype == CTPU_F32 && x->ndim == 0) return i;
    return -1;
}

static ctpu_tensor apply(int op, int n_in, const ctpu_tensor *ts, const op_args *a, const double *scalars);

/* apply with operand z (a 0-d f32 tensor) cast to bf16 first: the cast is
 * an op of its own (recorded, differentiated), released once used. */
static ctpu_tensor apply_zero_dim_cast(int op, int n_in, const ctpu_tensor *ts, const op_args *a, const double *scalars,
                                       int z)
{
    ctpu_tensor t[CTPU_NODE_MAX_IN];
    memcpy(t, ts, sizeof *t * (size_t)n_in);
    t[z] = ctpu_cast(ts[z], CTPU_BF16);
    if (ctpu_is_null(t[z])) return ctpu_failed();
    ctpu_tensor r = apply(op, n_in, t, a, scalars);
    ctpu_release(t[z]);
    return r;
}

/* A float host scalar (a double: Python's float) with an i32 tensor in an
 * op whose dtype rule is SAME: torch gives the default float dtype
 * (torch.tensor([0, 1]) + 0.5 is f32 [0.5, 1.5]), so the tensor is cast to
 * f32 first, a recorded op of its own (fused, captured and keyed as any
 * cast; the result's dtype follows from the call, never from the scalar's
 * value, which stays a runtime argument). The *_int forms keep i32. */
static bool float_scalar_promotes(int op, const op_args *a, const ctpu_trec *x)
{
    if (x->type.dtype != CTPU_I32 || a->int_scalar) return false;
    switch (op) {
    case CTPU_OP_ADD_SCALAR: case CTPU_OP_SUB_SCALAR: case CTPU_OP_MUL_SCALAR:
    case CTPU_OP_MAXIMUM_SCALAR: case CTPU_OP_MINIMUM_SCALAR: case CTPU_OP_CLAMP:
        return true;
    default:
        return false;
    }
}

static ctpu_tensor apply_float_scalar(int op, const ctpu_tensor *ts, const op_args *a, const double *scalars)
{
    ctpu_tensor x = ctpu_cast(ts[0], CTPU_F32);
    if (ctpu_is_null(x)) return ctpu_failed();
    ctpu_tensor r = apply(op, 1, &x, a, scalars);
    ctpu_release(x);
    return r;
}

/* Resolve the inputs, build the node, dispatch it (a view for view ops). */
static ctpu_tensor apply(int op, int n_in, const ctpu_tensor *ts, const op_args *a, const double *scalars)
{
    const ctpu_op_info *o = &ctpu_op_infos[op];
    const char *opn = a->opn ? a->opn : o->name;
    const char *const *names = input_names(o, a);
    ctpu_trec *in[CTPU_NODE_MAX_IN];
    if (!get_inputs(opn, n_in, ts, names, in)) return ctpu_failed();
    if (n_in >= 2) {
        int z = zero_dim_to_bf16(op, n_in, in);
        if (z >= 0) return apply_zero_dim_cast(op, n_in, ts, a, scalars, z);
    }
    if (n_in == 1 && float_scalar_promotes(op, a, in[0])) return apply_float_scalar(op, ts, a, scalars);
    double bf16_s;
    if (n_in == 1 && in[0]->type.dtype == CTPU_BF16 && ctpu_op_is(op, CTPU_OPK_COMPARE) && ctpu_op_is(op, CTPU_OPK_SCALAR)) {
        /* torch compares a bf16 tensor with a number in bf16: the number rounded to bf16 first
         * (eq_scalar(bf16 1, 1.001) is true; a host scalar in arithmetic stays f32 math) */
        bf16_s = (double)ctpu_bf16_to_f32(ctpu_f32_to_bf16((float)scalars[0]));
        scalars = &bf16_s;
    }
    ctpu_node n;
    if (!infer_named(op, opn, names, n_in, in, a, &n)) return ctpu_failed();
    if (ctpu_op_is(op, CTPU_OPK_VIEW)) return make_view(&n, in[0], ts[0], in[0]->off);
    return n_in ? ctpu_dispatch_as(&n, a->opn, in, ts, scalars) : ctpu_dispatch_as(&n, a->opn, NULL, NULL, scalars);
}

/* ------------------------------------------------------------ elementwise */
static const op_args no_args;

static ctpu_tensor unary(int op, ctpu_tensor a) { return apply(op, 1, &a, &no_args, NULL); }

ctpu_tensor ctpu_neg(ctpu_tensor a) { return unary(CTPU_OP_NEG, a); }
ctpu_tensor ctpu_abs(ctpu_tensor a) { return unary(CTPU_OP_ABS, a); }
ctpu_tensor ctpu_exp(ctpu_tensor a) { return unary(CTPU_OP_EXP, a); }
ctpu_tensor ctpu_log(ctpu_tensor a) { return unary(CTPU_OP_LOG, a); }
ctpu_tensor ctpu_sqrt(ctpu_tensor a) { return unary(CTPU_OP_SQRT, a); }
ctpu_tensor ctpu_rsqrt(ctpu_tensor a) { return unary(CTPU_OP_RSQRT, a); }
ctpu_tensor ctpu_tanh(ctpu_tensor a) { return unary(CTPU_OP_TANH, a); }
ctpu_tensor ctpu_erf(ctpu_tensor a) { return unary(CTPU_OP_ERF, a); }
ctpu_tensor ctpu_sin(ctpu_tensor a) { return unary(CTPU_OP_SIN, a); }
ctpu_tensor ctpu_cos(ctpu_tensor a) { return unary(CTPU_OP_COS, a); }
ctpu_tensor ctpu_log1p(ctpu_tensor a) { return unary(CTPU_OP_LOG1P, a); }
ctpu_tensor ctpu_expm1(ctpu_tensor a) { return unary(CTPU_OP_EXPM1, a); }
ctpu_tensor ctpu_sigmoid(ctpu_tensor a) { return unary(CTPU_OP_SIGMOID, a); }
ctpu_tensor ctpu_relu(ctpu_tensor a) { return unary(CTPU_OP_RELU, a); }
ctpu_tensor ctpu_gelu(ctpu_tensor a, bool tanh_approx)
{
    return unary(tanh_approx ? CTPU_OP_GELU_TANH : CTPU_OP_GELU_ERF, a);
}
ctpu_tensor ctpu_softplus(ctpu_tensor a) { return unary(CTPU_OP_SOFTPLUS, a); }

static ctpu_tensor binary(int op, ctpu_tensor a, ctpu_tensor b)
{
    ctpu_tensor ts[2] = { a, b };
    return apply(op, 2, ts, &no_args, NULL);
}

ctpu_tensor ctpu_add(ctpu_tensor a, ctpu_tensor b) { return binary(CTPU_OP_ADD, a, b); }
ctpu_tensor ctpu_sub(ctpu_tensor a, ctpu_tensor b) { return binary(CTPU_OP_SUB, a, b); }
ctpu_tensor ctpu_mul(ctpu_tensor a, ctpu_tensor b) { return binary(CTPU_OP_MUL, a, b); }
ctpu_tensor ctpu_div(ctpu_tensor a, ctpu_tensor b) { return binary(CTPU_OP_DIV, a, b); }
ctpu_tensor ctpu_pow(ctpu_tensor a, ctpu_tensor b) { return binary(CTPU_OP_POW, a, b); }
ctpu_tensor ctpu_maximum(ctpu_tensor a, ctpu_tensor b) { return binary(CTPU_OP_MAXIMUM, a, b); }
ctpu_tensor ctpu_minimum(ctpu_tensor a, ctpu_tensor b) { return binary(CTPU_OP_MINIMUM, a, b); }
ctpu_tensor ctpu_eq(ctpu_tensor a, ctpu_tensor b) { return binary(CTPU_OP_EQ, a, b); }
ctpu_tensor ctpu_ne(ctpu_tensor a, ctpu_tensor b) { return binary(CTPU_OP_NE, a, b); }
ctpu_tensor ctpu_lt(ctpu_tensor a, ctpu_tensor b) { return binary(CTPU_OP_LT, a, b); }
ctpu_tensor ctpu_le(ctpu_tensor a, ctpu_tensor b) { return binary(CTPU_OP_LE, a, b); }
ctpu_tensor ctpu_gt(ctpu_tensor a, ctpu_tensor b) { return binary(CTPU_OP_GT, a, b); }
ctpu_tensor ctpu_ge(ctpu_tensor a, ctpu_tensor b) { return binary(CTPU_OP_GE, a, b); }

/* The two argument sets of a scalar op, built once (an op_args made on the
 * stack cost every recorded scalar op ~25 instructions of zeroing). */
static const op_args scalar_args = { .n_scalars = 1 };
static const op_args rscalar_args = { .n_scalars = 1, .flags = CTPU_ATTR_SCALAR_FIRST };

static ctpu_tensor scalar_op(int op, ctpu_tensor a, double s, bool scalar_first)
{
    return apply(op, 1, &a, scalar_first ? &rscalar_args : &scalar_args, &s);
}

ctpu_tensor ctpu_add_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_ADD_SCALAR, a, s, false); }
ctpu_tensor ctpu_sub_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_SUB_SCALAR, a, s, false); }
ctpu_tensor ctpu_mul_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_MUL_SCALAR, a, s, false); }
ctpu_tensor ctpu_div_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_DIV_SCALAR, a, s, false); }
ctpu_tensor ctpu_pow_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_POW_SCALAR, a, s, false); }
ctpu_tensor ctpu_maximum_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_MAXIMUM_SCALAR, a, s, false); }
ctpu_tensor ctpu_minimum_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_MINIMUM_SCALAR, a, s, false); }
ctpu_tensor ctpu_rsub_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_SUB_SCALAR, a, s, true); }
ctpu_tensor ctpu_rdiv_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_DIV_SCALAR, a, s, true); }
ctpu_tensor ctpu_rpow_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_POW_SCALAR, a, s, true); }
ctpu_tensor ctpu_eq_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_EQ_SCALAR, a, s, false); }
ctpu_tensor ctpu_ne_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_NE_SCALAR, a, s, false); }
ctpu_tensor ctpu_lt_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_LT_SCALAR, a, s, false); }
ctpu_tensor ctpu_le_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_LE_SCALAR, a, s, false); }
ctpu_tensor ctpu_gt_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_GT_SCALAR, a, s, false); }
ctpu_tensor ctpu_ge_scalar(ctpu_tensor a, double s) { return scalar_op(CTPU_OP_GE_SCALAR, a, s, false); }

/* Int host scalars (Python's int): an i32 tensor stays i32 (saturating, as
 * add_scalar's i32 arithmetic); f32 / bf16 as the double forms. */
static const op_args iscalar_args = { .n_scalars = 1, .int_scalar = true };
static const op_args irscalar_args = { .n_scalars = 1, .flags = CTPU_ATTR_SCALAR_FIRST, .int_scalar = true };

static ctpu_tensor iscalar_op(int op, ctpu_tensor a, int64_t s, bool scalar_first)
{
    double d = (double)s;
    return apply(op, 1, &a, scalar_first ? &irscalar_args : &iscalar_args, &d);
}

ctpu_tensor ctpu_add_scalar_int(ctpu_tensor a, int64_t s) { return iscalar_op(CTPU_OP_ADD_SCALAR, a, s, false); }
ctpu_tensor ctpu_sub_scalar_int(ctpu_tensor a, int64_t s) { return iscalar_op(CTPU_OP_SUB_SCALAR, a, s, false); }
ctpu_tensor ctpu_mul_scalar_int(ctpu_tensor a, int64_t s) { return iscalar_op(CTPU_OP_MUL_SCALAR, a, s, false); }
ctpu_tensor ctpu_rsub_scalar_int(ctpu_tensor a, int64_t s) { return iscalar_op(CTPU_OP_SUB_SCALAR, a, s, true); }
ctpu_tensor ctpu_maximum_scalar_int(ctpu_tensor a, int64_t s) { return iscalar_op(CTPU_OP_MAXIMUM_SCALAR, a, s, false); }
ctpu_tensor ctpu_minimum_scalar_int(ctpu_tensor a, int64_t s) { return iscalar_op(CTPU_OP_MINIMUM_SCALAR, a, s, false); }


ctpu_tensor ctpu_where(ctpu_tensor cond, ctpu_tensor a, ctpu_tensor b)
{
    ctpu_tensor ts[3] = { cond, a, b };
    return apply(CTPU_OP_WHERE, 3, ts, &(op_args){ .names = NM_WHERE }, NULL);
}

ctpu_tensor ctpu_clamp(ctpu_tensor a, double lo, double hi)
{
    double s[2] = { lo, hi };
    return apply(CTPU_OP_CLAMP, 1, &a, &(op_args){ .n_scalars = 2 }, s);
}

ctpu_tensor ctpu_clamp_int(ctpu_tensor a, int64_t lo, int64_t hi)
{
    double s[2] = { (double)lo, (double)hi };
    return apply(CTPU_OP_CLAMP, 1, &a, &(op_args){ .n_scalars = 2, .int_scalar = true }, s);
}

ctpu_tensor ctpu_cast(ctpu_tensor a, ctpu_dtype dt)
{
    return apply(CTPU_OP_CAST, 1, &a, &(op_args){ .dtype = (int)dt }, NULL);
}

/* ------------------------------------------------------------ composites
 * Compositions of existing ops (docs/DESIGN.md "Composite ops"): their
 * gradient and their fusion come from the ops they are made of. */
ctpu_tensor ctpu_silu(ctpu_tensor a)
{
    ctpu_trec *in[1];
    if (!get_inputs("silu", 1, &a, NM_A, in)) return ctpu_failed();
    ctpu_tensor s = ctpu_sigmoid(a);
    if (ctpu_is_null(s)) return s;
    ctpu_tensor r = ctpu_mul(a, s);
    ctpu_release(s);
    return r;
}

/* The checks of layer_norm / rms_norm: x [..., D] float, weight / bias [D]
 * float or null, eps finite >= 0. */
static bool norm_check(const char *op, ctpu_tensor x, ctpu_tensor w, ctpu_tensor b, double eps, int64_t *D)
{
    ctpu_trec *in[1];
    if (!get_inputs(op, 1, &x, (const char *const[]){ "x" }, in)) return false;
    char tb[96], tw[96];
    const ctpu_vtype *xt = &in[0]->type;
    if (xt->dtype == CTPU_I32) {
        ctpu_set_error(CTPU_ERR_DTYPE, "%s: x is %s: need f32 or bf16", op, ctpu_fmt_type(xt, tb, sizeof tb));
        return false;
    }
    if (xt->ndim < 1 || xt->shape[xt->ndim - 1] == 0) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: x is %s: need a last dim of extent >= 1", op, ctpu_fmt_type(xt, tb, sizeof tb));
        return false;
    }
    *D = xt->shape[xt->ndim - 1];
    const ctpu_tensor pw[2] = { w, b };
    static const char *const pn[2] = { "weight", "bias" };
    for (int i = 0; i < 2; i++) {
        if (ctpu_absent(pw[i])) continue;
        ctpu_trec *r = ctpu_rec_get(pw[i], op, pn[i], true);
        if (!r) return false;
        if (r->type.dtype == CTPU_I32 || r->type.ndim != 1 || r->type.shape[0] != *D) {
            ctpu_set_error(r->type.dtype == CTPU_I32 ? CTPU_ERR_DTYPE : CTPU_ERR_SHAPE,
                           "%s: x is %s, %s is %s: need an f32 or bf16 %s of shape [%lld]", op,
                           ctpu_fmt_type(xt, tb, sizeof tb), pn[i], ctpu_fmt_type(&r->type, tw, sizeof tw), pn[i],
                           (long long)*D);
            return false;
        }
    }
    if (!(eps >= 0) || !isfinite(eps)) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: eps=%g must be finite and >= 0", op, eps);
        return false;
    }
    return true;
}

static ctpu_tensor as_f32(ctpu_tensor t)
{
    return ctpu_dtype_of(t) == CTPU_F32 ? t : ctpu_cast(t, CTPU_F32);
}

/* y (made in a scope of its own) kept into the caller's scope, in x's dtype */
static ctpu_tensor norm_finish(ctpu_tensor y, ctpu_dtype dt)
{
    if (!ctpu_is_null(y) && dt != CTPU_F32) y = ctpu_cast(y, dt);
    if (!ctpu_is_null(y)) y = ctpu_keep(y);
    ctpu_scope_end();
    return y;
}

ctpu_tensor ctpu_layer_norm(ctpu_tensor x, ctpu_tensor weight, ctpu_tensor bias, double eps)
{
    int64_t D;
    if (!norm_check("layer_norm", x, weight, bias, eps, &D)) return ctpu_failed();
    ctpu_dtype dt = ctpu_dtype_of(x);
    int d = -1;
    if (ctpu_scope_begin() != CTPU_OK) return ctpu_failed();
    ctpu_tensor xf = as_f32(x);
    ctpu_tensor mean = ctpu_mean(xf, 1, &d, true);
    ctpu_tensor var = ctpu_var(xf, 1, &d, 0, true);
    ctpu_tensor y = ctpu_mul(ctpu_sub(xf, mean), ctpu_rsqrt(ctpu_add_scalar(var, eps)));
    if (!ctpu_is_null(weight)) y = ctpu_mul(y, as_f32(weight));
    if (!ctpu_is_null(bias)) y = ctpu_add(y, as_f32(bias));
    return norm_finish(y, dt);
}

ctpu_tensor ctpu_rms_norm(ctpu_tensor x, ctpu_tensor weight, double eps)
{
    int64_t D;
    if (!norm_check("rms_norm", x, weight, CTPU_NULL, eps, &D)) return ctpu_failed();
    ctpu_dtype dt = ctpu_dtype_of(x);
    int d = -1;
    if (ctpu_scope_begin() != CTPU_OK) return ctpu_failed();
    ctpu_tensor xf = as_f32(x);
    ctpu_tensor ms = ctpu_mean(ctpu_mul(xf, xf), 1, &d, true);
    ctpu_tensor y = ctpu_mul(xf, ctpu_rsqrt(ctpu_add_scalar(ms, eps)));
    if (!ctpu_is_null(weight)) y = ctpu_mul(y, as_f32(weight));
    return norm_finish(y, dt);
}

/* ------------------------------------------------------------ movement composites */
static bool dim_in(const char *op, const char *arg, int d, int lo, int hi)
{
    if (d >= lo && d <= hi) return true;
    ctpu_set_error(CTPU_ERR_SHAPE, "%s: %s=%d is out of range (valid: [%d, %d])", op, arg, d, lo, hi);
    return false;
}

static ctpu_tensor unsqueeze_as(const char *op, ctpu_tensor a, int dim)
{
    ctpu_trec *in[1];
    if (!get_inputs(op, 1, &a, NM_A, in)) return ctpu_failed();
    int nd = in[0]->type.ndim;
    if (nd >= CTPU_MAX_DIMS) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: a has %d dims: at most %d", op, nd, CTPU_MAX_DIMS);
        return ctpu_failed();
    }
    if (!dim_in(op, "dim", dim, -nd - 1, nd)) return ctpu_failed();
    if (dim < 0) dim += nd + 1;
    int64_t sh[CTPU_MAX_DIMS];
    for (int i = 0, j = 0; i <= nd; i++) sh[i] = i == dim ? 1 : in[0]->type.shape[j++];
    return ctpu_reshape(a, nd + 1, sh);
}

ctpu_tensor ctpu_unsqueeze(ctpu_tensor a, int dim) { return unsqueeze_as("unsqueeze", a, dim); }

ctpu_tensor ctpu_squeeze(ctpu_tensor a, int dim)
{
    ctpu_trec *in[1];
    if (!get_inputs("squeeze", 1, &a, NM_A, in)) return ctpu_failed();
    int nd = in[0]->type.ndim;
    if (nd == 0 && (dim == 0 || dim == -1)) return ctpu_reshape(a, 0, NULL);
    if (!dim_in("squeeze", "dim", dim, -nd, nd - 1)) return ctpu_failed();
    if (dim < 0) dim += nd;
    int64_t sh[CTPU_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < nd; i++)
        if (i != dim || in[0]->type.shape[i] != 1) sh[k++] = in[0]->type.shape[i];
    return ctpu_reshape(a, k, sh);
}

ctpu_tensor ctpu_flatten(ctpu_tensor a, int start, int end)
{
    ctpu_trec *in[1];
    if (!get_inputs("flatten", 1, &a, NM_A, in)) return ctpu_failed();
    int nd = in[0]->type.ndim;
    if (nd == 0) {
        int64_t one = 1;
        if (!dim_in("flatten", "start", start, -1, 0) || !dim_in("flatten", "end", end, -1, 0)) return ctpu_failed();
        return ctpu_reshape(a, 1, &one);
    }
    if (!dim_in("flatten", "start", start, -nd, nd - 1) || !dim_in("flatten", "end", end, -nd, nd - 1)) return ctpu_failed();
    if (start < 0) start += nd;
    if (end < 0) end += nd;
    if (start > end) {
        ctpu_set_error(CTPU_ERR_SHAPE, "flatten: start dim %d comes after end dim %d", start, end);
        return ctpu_failed();
    }
    int64_t sh[CTPU_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < nd; i++) {
        if (i > start && i <= end) sh[k - 1] *= in[0]->type.shape[i];
        else sh[k++] = in[0]->type.shape[i];
    }
    return ctpu_reshape(a, k, sh);
}

ctpu_tensor ctpu_stack(int n, const ctpu_tensor *ts, int dim)
{
    if (!ctpu_check_init("stack")) return ctpu_failed();
    if (n < 1 || n > CTPU_NODE_MAX_IN || !ts) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "stack: n=%d with ts %s: need 1 <= n <= %d tensors", n, ts ? "given" : "NULL",
                       CTPU_NODE_MAX_IN);
        return ctpu_failed();
    }
    ctpu_trec *in[CTPU_NODE_MAX_IN];
    if (!get_inputs("stack", n, ts, NM_TS, in)) return ctpu_failed();
    for (int i = 1; i < n; i++)
        if (in[i]->type.ndim != in[0]->type.ndim ||
            memcmp(in[i]->type.shape, in[0]->type.shape, sizeof(int64_t) * in[0]->type.ndim) != 0) {
            char t0[96], ti[96];
            ctpu_set_error(CTPU_ERR_SHAPE, "stack: ts[0] is %s, ts[%d] is %s: need one shape",
                           ctpu_fmt_type(&in[0]->type, t0, sizeof t0), i, ctpu_fmt_type(&in[i]->type, ti, sizeof ti));
            return ctpu_failed();
        }
    int nd = in[0]->type.ndim;
    if (nd >= CTPU_MAX_DIMS) {
        ctpu_set_error(CTPU_ERR_SHAPE, "stack: the tensors have %d dims: at most %d", nd, CTPU_MAX_DIMS - 1);
        return ctpu_failed();
    }
    if (!dim_in("stack", "dim", dim, -nd - 1, nd)) return ctpu_failed();
    if (dim < 0) dim += nd + 1;
    ctpu_tensor u[CTPU_NODE_MAX_IN];
    for (int i = 0; i < n; i++) {
        u[i] = unsqueeze_as("stack", ts[i], dim);
        if (ctpu_is_null(u[i])) {
            for (int j = 0; j < i; j++) ctpu_release(u[j]);
            return ctpu_failed();
        }
    }
    ctpu_tensor r = ctpu_concat(n, u, dim);
    for (int i = 0; i < n; i++) ctpu_release(u[i]);
    return r;
}

ctpu_tensor ctpu_index_select(ctpu_tensor a, int dim, ctpu_tensor index)
{
    ctpu_trec *in[2];
    if (!get_inputs("index_select", 2, (ctpu_tensor[]){ a, index }, NM_GATHER, in)) return ctpu_failed();
    int nd = in[0]->type.ndim;
    char ta[96], ti[96];
    if (in[1]->type.dtype != CTPU_I32 || in[1]->type.ndim != 1 || nd < 1) {
        ctpu_set_error(in[1]->type.dtype != CTPU_I32 ? CTPU_ERR_DTYPE : CTPU_ERR_SHAPE,
                       "index_select: a is %s, index is %s: need a of ndim >= 1 and an i32 index [n]",
                       ctpu_fmt_type(&in[0]->type, ta, sizeof ta), ctpu_fmt_type(&in[1]->type, ti, sizeof ti));
        return ctpu_failed();
    }
    if (!dim_in("index_select", "dim", dim, -nd, nd - 1)) return ctpu_failed();
    if (dim < 0) dim += nd;
    int64_t col[CTPU_MAX_DIMS], out[CTPU_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        col[i] = i == dim ? in[1]->type.shape[0] : 1;
        out[i] = i == dim ? in[1]->type.shape[0] : in[0]->type.shape[i];
    }
    if (ctpu_scope_begin() != CTPU_OK) return ctpu_failed();
    ctpu_tensor ts[2] = { a, ctpu_expand(ctpu_reshape(index, nd, col), nd, out) };
    ctpu_tensor r = ctpu_is_null(ts[1]) ? ctpu_failed()
                    : apply(CTPU_OP_GATHER, 2, ts, &(op_args){ .opn = "index_select", .dim = dim,
                                                             .call = CTPU_CALL_INDEX_SELECT }, NULL);
    if (!ctpu_is_null(r)) r = ctpu_keep(r);
    ctpu_scope_end();
    return r;
}

ctpu_tensor ctpu_scatter_add(ctpu_tensor self, int dim, ctpu_tensor index, ctpu_tensor src)
{
    ctpu_tensor ts[3] = { self, index, src };
    return apply(CTPU_OP_SCATTER_ADD, 3, ts, &(op_args){ .dim = dim }, NULL);
}

/* scatter_add with the index [n] reshaped to [1, .., n, .., 1] (n at dim)
 * and expanded to source's shape: source's elements in row-major order are
 * index_add's order, i ascending for each destination. */
ctpu_tensor ctpu_index_add(ctpu_tensor self, int dim, ctpu_tensor index, ctpu_tensor source, double alpha)
{
    ctpu_trec *in[3];
    static const char *const nm[3] = { "self", "index", "source" };
    if (!get_inputs("index_add", 3, (ctpu_tensor[]){ self, index, source }, nm, in)) return ctpu_failed();
    const ctpu_vtype *t = &in[0]->type, *ix = &in[1]->type, *sr = &in[2]->type;
    int nd = t->ndim;
    char ta[96], ti[96], tr[96];
    if (!isfinite(alpha)) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "index_add: alpha=%g must be finite", alpha);
        return ctpu_failed();
    }
    bool ok = nd >= 1 && ix->ndim == 1 && sr->ndim == nd && dim >= -nd && dim < nd;
    int d = dim < 0 ? dim + nd : dim;
    for (int k = 0; ok && k < nd; k++) ok = sr->shape[k] == (k == d ? ix->shape[0] : t->shape[k]);
    if (ix->dtype != CTPU_I32 || sr->dtype != t->dtype || !ok) {
        ctpu_set_error(ix->dtype != CTPU_I32 || sr->dtype != t->dtype ? CTPU_ERR_DTYPE : CTPU_ERR_SHAPE,
                       "index_add: self is %s, index is %s, source is %s, dim=%d: need an i32 index [n], source of "
                       "self's dtype and shape with extent n at dim (in [%d, %d])",
                       ctpu_fmt_type(t, ta, sizeof ta), ctpu_fmt_type(ix, ti, sizeof ti),
                       ctpu_fmt_type(sr, tr, sizeof tr), dim, -nd, nd - 1);
        return ctpu_failed();
    }
    int64_t col[CTPU_MAX_DIMS];
    for (int k = 0; k < nd; k++) col[k] = k == d ? ix->shape[0] : 1;
    if (ctpu_scope_begin() != CTPU_OK) return ctpu_failed();
    ctpu_tensor src = alpha == 1.0 ? source : ctpu_mul_scalar(source, alpha);
    ctpu_tensor r = ctpu_scatter_add(self, d, ctpu_expand(ctpu_reshape(index, nd, col), nd, sr->shape), src);
    if (!ctpu_is_null(r)) r = ctpu_keep(r);
    ctpu_scope_end();
    return r;
}

/* f32 [R, C]: (j - i) op k as 1 / 0 (op: le for tril, ge for triu) */
/* A composite's failure names the user's call, not the op inside it that
 * failed: "sub: output f32[..]: out of HBM" becomes "causal_mask: output
 * f32[..]: out of HBM" (a new failure record; r itself when it is fine). */
static ctpu_tensor relabel(const char *op, ctpu_tensor r)
{
    if (!ctpu_is_null(r)) return r;
    ctpu_status st = ctpu_last_status();
    const char *m = ctpu_last_error();
    size_t n = strlen(op);
    if (st == CTPU_OK || (strncmp(m, op, n) == 0 && m[n] == ':')) return r;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", m);
    const char *rest = strstr(buf, ": ");
    ctpu_set_error(st, "%s: %s", op, rest ? rest + 2 : buf);
    return ctpu_failed();
}

static ctpu_tensor band(int64_t R, int64_t C, int64_t k, bool lower)
{
    int64_t r1[2] = { R, 1 }, c1[2] = { 1, C };
    ctpu_tensor rows = ctpu_reshape(ctpu_arange(0, (double)R, 1, CTPU_F32), 2, r1);
    ctpu_tensor cols = ctpu_reshape(ctpu_arange(0, (double)C, 1, CTPU_F32), 2, c1);
    ctpu_tensor d = ctpu_sub(cols, rows);
    return lower ? ctpu_le_scalar(d, (double)k) : ctpu_ge_scalar(d, (double)k);
}

static ctpu_tensor tri(const char *op, ctpu_tensor a, int64_t k, bool lower)
{
    ctpu_trec *in[1];
    if (!get_inputs(op, 1, &a, NM_A, in)) return ctpu_failed();
    int nd = in[0]->type.ndim;
    if (nd < 2) {
        char tb[96];
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: a is %s: need ndim >= 2", op, ctpu_fmt_type(&in[0]->type, tb, sizeof tb));
        return ctpu_failed();
    }
    int64_t R = in[0]->type.shape[nd - 2], C = in[0]->type.shape[nd - 1];
    /* |k| past the matrix means all or nothing: clamp so the f32 compare is exact */
    int64_t lim = (R > C ? R : C) + 1;
    if (k > lim) k = lim;
    if (k < -lim) k = -lim;
    if (ctpu_scope_begin() != CTPU_OK) return ctpu_failed();
    ctpu_tensor r = ctpu_where(band(R, C, k, lower), a, ctpu_zeros(in[0]->type.dtype, 0, NULL));
    if (!ctpu_is_null(r)) r = ctpu_keep(r);
    r = relabel(op, r);
    ctpu_scope_end();
    return r;
}

ctpu_tensor ctpu_tril(ctpu_tensor a, int64_t k) { return tri("tril", a, k, true); }
ctpu_tensor ctpu_triu(ctpu_tensor a, int64_t k) { return tri("triu", a, k, false); }

ctpu_tensor ctpu_causal_mask(int64_t T, int64_t S, ctpu_mask_kind kind)
{
    if (!ctpu_check_init("causal_mask")) return ctpu_failed();
    if (T < 1 || S < 1 || (unsigned)kind > CTPU_MASK_BINARY || T > (1 << 24) || S > (1 << 24) ||
        T * S > ((int64_t)1 << 36)) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG,
                       "causal_mask: T=%lld S=%lld kind=%d: need 1 <= T, S <= 2^24, T*S <= 2^36 elements and a ctpu_mask_kind",
                       (long long)T, (long long)S, (int)kind);
        return ctpu_failed();
    }
    if (ctpu_scope_begin() != CTPU_OK) return ctpu_failed();
    ctpu_tensor m = band(T, S, 0, true);
    if (kind == CTPU_MASK_ADDITIVE) m = ctpu_where(m, ctpu_zeros(CTPU_F32, 0, NULL), ctpu_full(CTPU_F32, 0, NULL, -INFINITY));
    if (!ctpu_is_null(m)) m = ctpu_keep(m);
    m = relabel("causal_mask", m);
    ctpu_scope_end();
    return m;
}

/* where(x > 0, x, x * slope) */
ctpu_tensor ctpu_leaky_relu(ctpu_tensor a, double negative_slope)
{
    ctpu_trec *in[1];
    if (!get_inputs("leaky_relu", 1, &a, NM_A, in)) return ctpu_failed();
    if (!isfinite(negative_slope))
        {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "leaky_relu: negative_slope is %g (must be finite)", negative_slope);
        return ctpu_failed();
    }
    ctpu_tensor pos = ctpu_gt_scalar(a, 0.0);
    ctpu_tensor neg = ctpu_mul_scalar(a, negative_slope);
    ctpu_tensor r = ctpu_is_null(pos) || ctpu_is_null(neg) ? ctpu_failed() : ctpu_where(pos, a, neg);
    if (!ctpu_is_null(pos)) ctpu_release(pos);
    if (!ctpu_is_null(neg)) ctpu_release(neg);
    return r;
}

/* where(x > 0, x, alpha * expm1(min(x, 0))): the min keeps expm1 finite where
 * the branch is not taken, so the gradient there is an exact 0, never 0 * inf.
 * The min is clamp(x, -inf, 0), whose gradient is 1 at x == 0 (minimum_scalar's
 * tie rule would give 0.5: elu'(0) would be alpha / 2, torch's is alpha). */
ctpu_tensor ctpu_elu(ctpu_tensor a, double alpha)
{
    ctpu_trec *in[1];
    if (!get_inputs("elu", 1, &a, NM_A, in)) return ctpu_failed();
    if (!isfinite(alpha)) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "elu: alpha is %g (must be finite)", alpha);
        return ctpu_failed();
    }
    ctpu_tensor pos = ctpu_gt_scalar(a, 0.0);
    ctpu_tensor m = ctpu_clamp(a, -INFINITY, 0.0);
    ctpu_tensor e = ctpu_expm1(m);
    ctpu_tensor neg = ctpu_mul_scalar(e, alpha);
    ctpu_tensor r = ctpu_is_null(pos) || ctpu_is_null(neg) ? ctpu_failed() : ctpu_where(pos, a, neg);
    ctpu_tensor tmp[4] = { pos, m, e, neg };
    for (int i = 0; i < 4; i++) if (!ctpu_is_null(tmp[i])) ctpu_release(tmp[i]);
    return r;
}

/* ------------------------------------------------------------ reductions */
static ctpu_tensor reduction(int op, ctpu_tensor a, int ndims, const int *dims, bool keepdim, int64_t corr)
{
    op_args args = { .n_dims = ndims, .dims = dims, .keepdim = keepdim, .correction = corr };
    return apply(op, 1, &a, &args, NULL);
}

ctpu_tensor ctpu_sum(ctpu_tensor a, int nd, const int *d, bool k) { return reduction(CTPU_OP_SUM, a, nd, d, k, 0); }
ctpu_tensor ctpu_mean(ctpu_tensor a, int nd, const int *d, bool k) { return reduction(CTPU_OP_MEAN, a, nd, d, k, 0); }
ctpu_tensor ctpu_max(ctpu_tensor a, int nd, const int *d, bool k) { return reduction(CTPU_OP_MAX, a, nd, d, k, 0); }
ctpu_tensor ctpu_min(ctpu_tensor a, int nd, const int *d, bool k) { return reduction(CTPU_OP_MIN, a, nd, d, k, 0); }
ctpu_tensor ctpu_var(ctpu_tensor a, int nd, const int *d, int correction, bool k)
{
    if (correction < 0) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "var: correction=%d is negative", correction);
        return ctpu_failed();
    }
    return reduction(CTPU_OP_VAR, a, nd, d, k, correction);
}

ctpu_tensor ctpu_prod(ctpu_tensor a, int nd, const int *d, bool k) { return reduction(CTPU_OP_PROD, a, nd, d, k, 0); }

ctpu_tensor ctpu_argmax(ctpu_tensor a, int dim, bool keepdim)
{
    return apply(CTPU_OP_ARGMAX, 1, &a, &(op_args){ .dim = dim, .keepdim = keepdim }, NULL);
}

ctpu_tensor ctpu_argmin(ctpu_tensor a, int dim, bool keepdim)
{
    return apply(CTPU_OP_ARGMIN, 1, &a, &(op_args){ .dim = dim, .keepdim = keepdim }, NULL);
}

ctpu_tensor ctpu_cumsum(ctpu_tensor a, int dim)
{
    return apply(CTPU_OP_CUMSUM, 1, &a, &(op_args){ .dim = dim }, NULL);
}

/* m = max over dims of detach(a) (its gradient is not needed: d/da of
 * m + log(sum(exp(a - m))) does not depend on m), set to 0 where infinite
 * (torch's rule: an all -inf or a +inf slice stays -inf / +inf, not NaN);
 * log(sum(exp(a - m))) + m, in f32. */
ctpu_tensor ctpu_logsumexp(ctpu_tensor a, int ndims, const int *dims, bool keepdim)
{
    ctpu_trec *in[CTPU_NODE_MAX_IN];
    if (!get_inputs("logsumexp", 1, &a, NM_A, in)) return ctpu_failed();
    ctpu_node probe;   /* the dims checked, the reduced count and the result's shape */
    if (!infer(CTPU_OP_SUM, "logsumexp", 1, in, &(op_args){ .n_dims = ndims, .dims = dims, .keepdim = keepdim }, &probe))
        return ctpu_failed();
    ctpu_dtype dt = ctpu_dtype_of(a);
    if (ctpu_scope_begin() != CTPU_OK) return ctpu_failed();
    ctpu_tensor x = as_f32(a), mk;
    if (reduced_count(in[0], &probe) > 0) {
        ctpu_tensor m = ctpu_max(ctpu_detach(x), ndims, dims, true);
        mk = ctpu_where(ctpu_eq_scalar(ctpu_abs(m), INFINITY), ctpu_zeros(CTPU_F32, 0, NULL), m);
    } else {
        mk = ctpu_zeros(CTPU_F32, 0, NULL);   /* an empty slice: log(0) = -inf */
    }
    ctpu_tensor s = ctpu_sum(ctpu_exp(ctpu_sub(x, mk)), ndims, dims, keepdim);
    /* (an empty slice's mk is 0-d: it broadcasts, and reshaping it to the result's shape would fail) */
    ctpu_tensor m_out = reduced_count(in[0], &probe) > 0 ? ctpu_reshape(mk, probe.out.ndim, probe.out.shape) : mk;
    ctpu_tensor y = ctpu_add(ctpu_log(s), m_out);
    if (!ctpu_is_null(y) && dt == CTPU_BF16) y = ctpu_cast(y, CTPU_BF16);
    if (!ctpu_is_null(y)) y = ctpu_keep(y);
    ctpu_scope_end();
    return y;
}

static ctpu_tensor softmax_op(int op, ctpu_tensor a, int dim)
{
    const char *opn = ctpu_op_name(op);
    ctpu_trec *in[CTPU_NODE_MAX_IN];   /* infer's inputs array: CTPU_NODE_MAX_IN */
    if (!get_inputs(opn, 1, &a, NM_A, in)) return ctpu_failed();
    if (in[0]->type.ndim == 0) {
        /* a 0-d tensor: softmax over its single element, as a [1] */
        if (norm_dim(opn, dim, in[0], "dim") < 0) return ctpu_failed();
        int64_t one = 1;
        ctpu_tensor v = ctpu_reshape(a, 1, &one);
        ctpu_tensor r = ctpu_is_null(v) ? v : softmax_op(op, v, 0);
        ctpu_tensor o = ctpu_is_null(r) ? r : ctpu_reshape(r, 0, NULL);
        if (!ctpu_is_null(v)) ctpu_release(v);
        if (!ctpu_is_null(r)) ctpu_release(r);
        return o;
    }
    ctpu_node n;
    if (!infer(op, opn, 1, in, &(op_args){ .dim = dim }, &n)) return ctpu_failed();
    return ctpu_dispatch(&n, in, &a, NULL);
}

ctpu_tensor ctpu_softmax(ctpu_tensor a, int dim) { return softmax_op(CTPU_OP_SOFTMAX, a, dim); }
ctpu_tensor ctpu_log_softmax(ctpu_tensor a, int dim) { return softmax_op(CTPU_OP_LOG_SOFTMAX, a, dim); }

/* ------------------------------------------------------------ data movement */
ctpu_tensor ctpu_reshape(ctpu_tensor a, int ndim, const int64_t *shape)
{
    return apply(CTPU_OP_RESHAPE, 1, &a, &(op_args){ .ndim = ndim, .shape = shape }, NULL);
}

ctpu_tensor ctpu_contiguous(ctpu_tensor a)
{
    ctpu_trec *in[1];
    if (!get_inputs("contiguous", 1, &a, NM_A, in)) return ctpu_failed();
    /* every ctpu tensor is stored contiguous: a new handle to the same value */
    ctpu_node n = { .op = CTPU_OP_RESHAPE, .out = in[0]->type };
    return make_view(&n, in[0], a, in[0]->off);
}

ctpu_tensor ctpu_permute(ctpu_tensor a, const int *perm)
{
    return apply(CTPU_OP_PERMUTE, 1, &a, &(op_args){ .dims = perm }, NULL);
}

ctpu_tensor ctpu_transpose(ctpu_tensor a, int d0, int d1)
{
    ctpu_trec *r = ctpu_rec_get(a, "transpose", "a", true);
    if (!r) return ctpu_failed();
    int x = norm_dim("transpose", d0, r, "d0"), y = x < 0 ? -1 : norm_dim("transpose", d1, r, "d1");
    if (x < 0 || y < 0) return ctpu_failed();
    int perm[8];
    for (int d = 0; d < r->type.ndim; d++) perm[d] = d;
    if (r->type.ndim) { perm[x] = y; perm[y] = x; }
    return ctpu_permute(a, perm);
}

ctpu_tensor ctpu_slice(ctpu_tensor a, int dim, int64_t start, int64_t end, int64_t step)
{
    ctpu_trec *in[CTPU_NODE_MAX_IN];   /* infer's inputs array: CTPU_NODE_MAX_IN */
    if (!get_inputs("slice", 1, &a, NM_A, in)) return ctpu_failed();
    ctpu_node n;
    op_args args = { .dim = dim, .start = start, .end = end, .step = step };
    if (!infer(CTPU_OP_SLICE, "slice", 1, in, &args, &n)) return ctpu_failed();
    /* a contiguous slice is a view: all dims before d have extent 1 */
    int d = n.attr.dims[0];
    int64_t len = n.out.shape[d];
    bool view = n.attr.i64[2] == 1 || len <= 1;
    for (int k = 0; k < d; k++) if (in[0]->type.shape[k] != 1) view = false;
    if (view) {
        int64_t inner = 1;
        for (int k = d + 1; k < in[0]->type.ndim; k++) inner *= in[0]->type.shape[k];
        size_t off = in[0]->off + (size_t)(n.attr.i64[0] * inner) * ctpu_kdt_size(in[0]->type.dtype);
        if (len == 0) off = in[0]->off;
        return make_view(&n, in[0], a, off);
    }
    return ctpu_dispatch(&n, in, &a, NULL);
}

ctpu_tensor ctpu_concat(int count, const ctpu_tensor *ts, int dim)
{
    if (!ctpu_check_init("concat")) return ctpu_failed();
    if (count < 1 || !ts) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "concat: n=%d with ts %s: need n >= 1 tensors", count, ts ? "given" : "NULL");
        return ctpu_failed();
    }
    if (count > CTPU_NODE_MAX_IN) {
        /* chain: concat the first 16, then the rest onto it */
        int first = CTPU_NODE_MAX_IN;
        ctpu_tensor head = ctpu_concat(first, ts, dim);
        if (ctpu_is_null(head)) return head;
        ctpu_tensor rest[CTPU_NODE_MAX_IN];
        ctpu_tensor acc = head;
        for (int i = first; i < count; i += CTPU_NODE_MAX_IN - 1) {
            int k = count - i < CTPU_NODE_MAX_IN - 1 ? count - i : CTPU_NODE_MAX_IN - 1;
            rest[0] = acc;
            memcpy(rest + 1, ts + i, sizeof(ctpu_tensor) * (size_t)k);
            ctpu_tensor next = ctpu_concat(k + 1, rest, dim);
            ctpu_release(acc);
            if (ctpu_is_null(next)) return next;
            acc = next;
        }
        return acc;
    }
    return apply(CTPU_OP_CONCAT, count, ts, &(op_args){ .dim = dim }, NULL);
}

ctpu_tensor ctpu_expand(ctpu_tensor a, int ndim, const int64_t *shape)
{
    return apply(CTPU_OP_EXPAND, 1, &a, &(op_args){ .ndim = ndim, .shape = shape }, NULL);
}

ctpu_tensor ctpu_embedding(ctpu_tensor weight, ctpu_tensor indices)
{
    ctpu_tensor ts[2] = { weight, indices };
    return apply(CTPU_OP_EMBEDDING, 2, ts, &(op_args){ 0 }, NULL);
}

ctpu_tensor ctpu_gather(ctpu_tensor a, int dim, ctpu_tensor index)
{
    ctpu_tensor ts[2] = { a, index };
    return apply(CTPU_OP_GATHER, 2, ts, &(op_args){ .dim = dim }, NULL);
}

/* ------------------------------------------------------------ matmul */
ctpu_tensor ctpu_matmul(ctpu_tensor a, ctpu_tensor b)
{
    ctpu_tensor ts[2] = { a, b };
    ctpu_trec *in[2];
    if (!get_inputs("matmul", 2, ts, NM_AB, in)) return ctpu_failed();
    ctpu_node n;
    if (!infer(CTPU_OP_MATMUL, "matmul", 2, in, &(op_args){ .precision = (int)ctpu_rt->precision }, &n))
        return ctpu_failed();
    /* torch.matmul: 1-D a is [1,K] (squeezed after), 1-D b is [K,1] */
    bool sq_a = in[0]->type.ndim == 1, sq_b = in[1]->type.ndim == 1;
    if (!sq_a && !sq_b) return ctpu_dispatch(&n, in, ts, NULL);
    int64_t va[2] = { 1, in[0]->type.shape[0] }, vb[2] = { in[1]->type.shape[0], 1 };
    ctpu_tensor vat = a, vbt = b;
    if (sq_a) vat = ctpu_reshape(a, 2, va);
    if (sq_b) vbt = ctpu_reshape(b, 2, vb);
    ctpu_tensor vt[2] = { vat, vbt };
    ctpu_trec *use[2] = { ctpu_rec_get(vat, "matmul", "a", true), ctpu_rec_get(vbt, "matmul", "b", true) };
    ctpu_tensor r = use[0] && use[1] ? ctpu_dispatch(&n, use, vt, NULL) : ctpu_failed();
    if (sq_a && !ctpu_is_null(vat)) ctpu_release(vat);
    if (sq_b && !ctpu_is_null(vbt)) ctpu_release(vbt);
    if (ctpu_is_null(r)) return r;
    /* squeeze the promoted dims */
    const ctpu_vtype *o = &n.out;
    int nb = o->ndim - 2;
    int64_t shp[8];
    int k = 0;
    for (int d = 0; d < nb; d++) shp[k++] = o->shape[d];
    if (!sq_a) shp[k++] = o->shape[nb];
    if (!sq_b) shp[k++] = o->shape[nb + 1];
    ctpu_tensor s = ctpu_reshape(r, k, shp);
    ctpu_release(r);
    return s;
}

/* ------------------------------------------------------------ transposed matmul
 * Also the matmul backward rule's matmul (autograd.c), at the precision of
 * the forward op: the matmul rule's transposed-operand form. */
ctpu_tensor ctpu__matmul_t(ctpu_tensor a, ctpu_tensor b, bool ta, bool tb, int precision)
{
    ctpu_tensor ts[2] = { a, b };
    op_args args = { .opn = "matmul_t", .matmul_t = true, .precision = precision,
                     .flags = (ta ? CTPU_ATTR_TRANS_A : 0) | (tb ? CTPU_ATTR_TRANS_B : 0) };
    return apply(CTPU_OP_MATMUL, 2, ts, &args, NULL);
}

ctpu_tensor ctpu_matmul_t(ctpu_tensor a, ctpu_tensor b, bool transpose_a, bool transpose_b)
{
    if (!transpose_a && !transpose_b) return ctpu_matmul(a, b);
    if (!ctpu_check_init("matmul_t")) return ctpu_failed();
    return ctpu__matmul_t(a, b, transpose_a, transpose_b, (int)ctpu_rt->precision);
}

/* ------------------------------------------------------------ creation */
static ctpu_tensor create(const char *opn, int op, ctpu_dtype dt, int ndim, const int64_t *shape,
                          const double *sc, int nsc)
{
    op_args args = { .opn = opn, .ndim = ndim, .shape = shape, .dtype = (int)dt, .n_scalars = nsc };
    return apply(op, 0, NULL, &args, sc);
}

/* torch.full(..., dtype=torch.int32) refuses a value that does not fit
 * ("value cannot be converted to type int without overflow"): NaN, +-Inf,
 * or one whose truncation is outside [-2^31, 2^31) (0.5 gives 0, as torch). */
static bool int_value_ok(const char *opn, const char *arg, ctpu_dtype dt, double v)
{
    if (dt != CTPU_I32 || (v > -2147483649.0 && v < 2147483648.0)) return true;
    ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: %s=%g cannot be converted to i32 without overflow", opn, arg, v);
    return false;
}

ctpu_tensor ctpu_full(ctpu_dtype dt, int ndim, const int64_t *shape, double value)
{
    if (!ctpu_check_init("full")) return ctpu_failed();
    if (!int_value_ok("full", "value", dt, value)) return ctpu_failed();
    return create("full", CTPU_OP_FULL, dt, ndim, shape, &value, 1);
}
ctpu_tensor ctpu_zeros(ctpu_dtype dt, int ndim, const int64_t *shape)
{
    double v = 0;
    return create("zeros", CTPU_OP_FULL, dt, ndim, shape, &v, 1);
}
ctpu_tensor ctpu_ones(ctpu_dtype dt, int ndim, const int64_t *shape)
{
    double v = 1;
    return create("ones", CTPU_OP_FULL, dt, ndim, shape, &v, 1);
}

ctpu_tensor ctpu_arange(double start, double end, double step, ctpu_dtype dt)
{
    if (!ctpu_check_init("arange")) return ctpu_failed();
    if (step == 0 || !isfinite(start) || !isfinite(end) || !isfinite(step)) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "arange: start=%g end=%g step=%g: need finite values and step != 0",
                       start, end, step);
        return ctpu_failed();
    }
    /* torch.arange: an integer dtype steps by the truncated start and step
     * (arange(0, 5, 1.5, i32) = [0 1 2 3]), its count from the given doubles;
     * the bounds' order must agree with the step's sign (end == start: empty) */
    double x0 = start, xs = step, x1 = end;
    if (dt == CTPU_I32) { x0 = trunc(start); xs = trunc(step); x1 = trunc(end); }
    if (xs == 0) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "arange: step=%g is 0 as an integer (dtype i32): step must be nonzero", step);
        return ctpu_failed();
    }
    if ((xs > 0 && x1 < x0) || (xs < 0 && x1 > x0)) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG,
                       "arange: start=%g end=%g step=%g: upper bound and larger bound inconsistent with step sign",
                       start, end, step);
        return ctpu_failed();
    }
    double cnt = ceil((end - start) / step);
    if (cnt < 0) cnt = 0;
    if (cnt > 72057594037927936.0) {
        ctpu_set_error(CTPU_ERR_SHAPE, "arange: start=%g end=%g step=%g gives too many elements", start, end, step);
        return ctpu_failed();
    }
    if (dt == CTPU_I32 && cnt > 0 && (!int_value_ok("arange", "start", dt, x0) ||
                                      !int_value_ok("arange", "last value", dt, x0 + (cnt - 1) * xs))) return ctpu_failed();
    int64_t shape[1] = { (int64_t)cnt };
    double sc[2] = { x0, xs };
    return create("arange", CTPU_OP_ARANGE, dt, 1, shape, sc, 2);
}

static ctpu_tensor rand_op(const char *opn, int op, ctpu_dtype dt, int ndim, const int64_t *shape, double p0, double p1)
{
    if (!ctpu_check_init(opn)) return ctpu_failed();
    if (dt == CTPU_I32) {
        ctpu_set_error(CTPU_ERR_DTYPE, "%s: dtype i32 is not supported (f32 or bf16)", opn);
        return ctpu_failed();
    }
    if (!isfinite(p0) || !isfinite(p1) || (op == CTPU_OP_RAND_NORMAL && p1 < 0)) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: parameters %g, %g are invalid", opn, p0, p1);
        return ctpu_failed();
    }
    if (op == CTPU_OP_RAND_UNIFORM && p0 > p1) {   /* torch's uniform_(from, to) refuses from > to too */
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: lo=%g > hi=%g: the range [lo, hi) needs lo <= hi", opn, p0, p1);
        return ctpu_failed();
    }
    ctpu_node n;
    op_args args = { .opn = opn, .ndim = ndim, .shape = shape, .dtype = (int)dt, .n_scalars = 4 };
    if (!infer(op, opn, 0, NULL, &args, &n)) return ctpu_failed();
    uint64_t seed, offset;
    ctpu__rng_take((uint64_t)ctpu_vtype_numel(&n.out), &seed, &offset);
    double sc[4] = { ctpu_bits_scalar(seed), ctpu_bits_scalar(offset), p0, p1 };
    return ctpu_dispatch_as(&n, opn, NULL, NULL, sc);
}

/* torch.randint: low + (64 random bits mod (high - low)), the bits words 0
 * and 1 of element i's Philox block (seed, offset + i). */
ctpu_tensor ctpu_randint(ctpu_dtype dt, int ndim, const int64_t *shape, int64_t low, int64_t high)
{
    const char *opn = "randint";
    if (!ctpu_check_init(opn)) return ctpu_failed();
    if ((unsigned)dt >= CTPU_DTYPE_COUNT) {
        ctpu_set_error(CTPU_ERR_DTYPE, "%s: dt=%d is not a ctpu_dtype", opn, (int)dt);
        return ctpu_failed();
    }
    if (low >= high || low < INT32_MIN || high > (int64_t)INT32_MAX + 1) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: low=%lld high=%lld: need low < high, both in [-2^31, 2^31]", opn,
                       (long long)low, (long long)high);
        return ctpu_failed();
    }
    ctpu_node n;
    op_args args = { .opn = opn, .ndim = ndim, .shape = shape, .dtype = (int)dt, .n_scalars = 4 };
    if (!infer(CTPU_OP_RAND_INT, opn, 0, NULL, &args, &n)) return ctpu_failed();
    uint64_t seed, offset;
    ctpu__rng_take((uint64_t)ctpu_vtype_numel(&n.out), &seed, &offset);
    double sc[4] = { ctpu_bits_scalar(seed), ctpu_bits_scalar(offset), (double)low, (double)high };
    return ctpu_dispatch_as(&n, opn, NULL, NULL, sc);
}

/* ------------------------------------------------------------ creator composites */
/* a's dtype and shape (a resolved, its error named by op). In defer and
 * fuse, a with dynamic dims (ctpu_mark_dynamic) lends them to the creator
 * node that follows (infer_named), until like_done: the node has a's
 * symbols, so a compiled step binds its one dynamic program at another
 * extent instead of compiling one per extent (dropout's rand_like). */
static bool like_of(const char *op, ctpu_tensor a, ctpu_vtype *t)
{
    ctpu_trec *in[1];
    if (!get_inputs(op, 1, &a, NM_A, in)) return false;
    *t = in[0]->type;
    ctpu_thread_state *ts = in[0]->dyn ? ctpu__ts_get() : NULL;
    if (ts) ts->dyn_like = in[0];
    return true;
}

static ctpu_tensor like_done(ctpu_tensor r)
{
    ctpu_thread_state *ts = ctpu__ts_get();
    if (ts) ts->dyn_like = NULL;
    return r;
}

ctpu_tensor ctpu_full_like(ctpu_tensor a, double value)
{
    ctpu_vtype t;
    if (!like_of("full_like", a, &t)) return ctpu_failed();
    if (!int_value_ok("full_like", "value", (ctpu_dtype)t.dtype, value)) return like_done(ctpu_failed());
    return like_done(create("full_like", CTPU_OP_FULL, (ctpu_dtype)t.dtype, t.ndim, t.shape, &value, 1));
}

ctpu_tensor ctpu_zeros_like(ctpu_tensor a)
{
    ctpu_vtype t;
    if (!like_of("zeros_like", a, &t)) return ctpu_failed();
    return like_done(
        create("zeros_like", CTPU_OP_FULL, (ctpu_dtype)t.dtype, t.ndim, t.shape, (const double[]){ 0 }, 1));
}

ctpu_tensor ctpu_ones_like(ctpu_tensor a)
{
    ctpu_vtype t;
    if (!like_of("ones_like", a, &t)) return ctpu_failed();
    return like_done(
        create("ones_like", CTPU_OP_FULL, (ctpu_dtype)t.dtype, t.ndim, t.shape, (const double[]){ 1 }, 1));
}

ctpu_tensor ctpu_rand_like(ctpu_tensor a)
{
    ctpu_vtype t;
    if (!like_of("rand_like", a, &t)) return ctpu_failed();
    return like_done(rand_op("rand_like", CTPU_OP_RAND_UNIFORM, (ctpu_dtype)t.dtype, t.ndim, t.shape, 0, 1));
}

/* nn_internal.h: ctpu_dropout's f32 uniform draws at a's shape (any
 * dtype), with a's dynamic dims, as ctpu_rand_like's are */
ctpu_tensor ctpu__rand_uniform_f32_like(ctpu_tensor a)
{
    ctpu_vtype t;
    if (!like_of("dropout", a, &t)) return ctpu_failed();
    return like_done(rand_op("dropout", CTPU_OP_RAND_UNIFORM, CTPU_F32, t.ndim, t.shape, 0, 1));
}

ctpu_tensor ctpu_randn_like(ctpu_tensor a)
{
    ctpu_vtype t;
    if (!like_of("randn_like", a, &t)) return ctpu_failed();
    return like_done(rand_op("randn_like", CTPU_OP_RAND_NORMAL, (ctpu_dtype)t.dtype, t.ndim, t.shape, 0, 1));
}

ctpu_tensor ctpu_randint_like(ctpu_tensor a, int64_t low, int64_t high)
{
    ctpu_vtype t;
    if (!like_of("randint_like", a, &t)) return ctpu_failed();
    return like_done(ctpu_randint((ctpu_dtype)t.dtype, t.ndim, t.shape, low, high));
}

/* eq(arange(m) as [1, m], arange(n) as [n, 1]) in i32 (exact at any size), cast to dt */
ctpu_tensor ctpu_eye(int64_t n, int64_t m, ctpu_dtype dt)
{
    if (!ctpu_check_init("eye")) return ctpu_failed();
    if (n < 0 || m < 0 || n > INT32_MAX || m > INT32_MAX || (unsigned)dt >= CTPU_DTYPE_COUNT) {
        char dn[24];
        if ((unsigned)dt < CTPU_DTYPE_COUNT) snprintf(dn, sizeof dn, "%s", ctpu_dtype_name(dt));
        else snprintf(dn, sizeof dn, "%d (not a ctpu_dtype)", (int)dt);
        ctpu_set_error(n < 0 || m < 0 || n > INT32_MAX || m > INT32_MAX ? CTPU_ERR_INVALID_ARG : CTPU_ERR_DTYPE,
                       "eye: n=%lld m=%lld dt=%s: need 0 <= n, m < 2^31 and a ctpu_dtype", (long long)n, (long long)m, dn);
        return ctpu_failed();
    }
    ctpu_vtype chk;
    if (!ctpu__validate_shape("eye", 2, (int64_t[]){ n, m }, dt, &chk)) return ctpu_failed();
    if (ctpu_scope_begin() != CTPU_OK) return ctpu_failed();
    ctpu_tensor r = ctpu_reshape(ctpu_arange(0, (double)n, 1, CTPU_I32), 2, (int64_t[]){ n, 1 });
    ctpu_tensor c = ctpu_reshape(ctpu_arange(0, (double)m, 1, CTPU_I32), 2, (int64_t[]){ 1, m });
    ctpu_tensor y = ctpu_eq(r, c);
    if (!ctpu_is_null(y) && dt != CTPU_F32) y = ctpu_cast(y, dt);
    if (!ctpu_is_null(y)) y = ctpu_keep(y);
    ctpu_scope_end();
    return relabel("eye", y);   /* (out of HBM in its eq names eye) */
}

/* torch's CPU linspace, in dt's arithmetic: step = (end - start) / (steps - 1);
 * element i < steps / 2 is start + step * i, the others end - step * (steps - 1 - i)
 * (start, end and step rounded to dt first, as torch holds them in scalar_t). */
ctpu_tensor ctpu_linspace(double start, double end, int64_t steps, ctpu_dtype dt)
{
    if (!ctpu_check_init("linspace")) return ctpu_failed();
    if (!isfinite(start) || !isfinite(end) || steps < 0 || steps > (1 << 24)) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "linspace: start=%g end=%g steps=%lld: need finite ends and 0 <= steps <= 2^24",
                       start, end, (long long)steps);
        return ctpu_failed();
    }
    if (dt != CTPU_F32 && dt != CTPU_BF16) {
        if ((unsigned)dt < CTPU_DTYPE_COUNT) ctpu_set_error(CTPU_ERR_DTYPE, "linspace: dt=%s: f32 or bf16", ctpu_dtype_name(dt));
        else ctpu_set_error(CTPU_ERR_DTYPE, "linspace: dt=%d is not a ctpu_dtype (f32 or bf16)", (int)dt);
        return ctpu_failed();
    }
    float fs = (float)start, fe = (float)end;
    if (dt == CTPU_BF16) { fs = ctpu_bf16_to_f32(ctpu_f32_to_bf16(fs)); fe = ctpu_bf16_to_f32(ctpu_f32_to_bf16(fe)); }
    if (steps <= 1) return ctpu_full(dt, 1, &steps, fs);
    float st = (fe - fs) / (float)(steps - 1);
    if (dt == CTPU_BF16) st = ctpu_bf16_to_f32(ctpu_f32_to_bf16(st));
    if (ctpu_scope_begin() != CTPU_OK) return ctpu_failed();
    ctpu_tensor i = ctpu_arange(0, (double)steps, 1, dt == CTPU_BF16 ? CTPU_F32 : dt);
    ctpu_tensor lo = ctpu_add_scalar(ctpu_mul_scalar(dt == CTPU_BF16 ? ctpu_cast(i, CTPU_BF16) : i, st), fs);
    ctpu_tensor back = ctpu_rsub_scalar(i, (double)(steps - 1));   /* steps - 1 - i, exact below 2^24 */
    if (dt == CTPU_BF16) back = ctpu_cast(back, CTPU_BF16);
    ctpu_tensor hi = ctpu_rsub_scalar(ctpu_mul_scalar(back, st), fe);
    ctpu_tensor y = ctpu_where(ctpu_lt_scalar(i, (double)(steps / 2)), lo, hi);
    if (!ctpu_is_null(y)) y = ctpu_keep(y);
    ctpu_scope_end();
    return y;
}

ctpu_tensor ctpu_rand_uniform(ctpu_dtype dt, int ndim, const int64_t *shape, double lo, double hi)
{
    return rand_op("rand_uniform", CTPU_OP_RAND_UNIFORM, dt, ndim, shape, lo, hi);
}
ctpu_tensor ctpu_rand_normal(ctpu_dtype dt, int ndim, const int64_t *shape, double mean, double std)
{
    return rand_op("rand_normal", CTPU_OP_RAND_NORMAL, dt, ndim, shape, mean, std);
}
