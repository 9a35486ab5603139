/* Trace recording and finalisation (DESIGN.md "Defer and fuse"). */
#include <stdlib.h>
#include <string.h>

#include "trace.h"

struct ctpu_trace_rec {
    int n_in, cap_in;
    ctpu_vtype *in_type;
    ctpu_buffer **in_buf;
    size_t *in_off;
    int n_nodes, cap_nodes;
    ctpu_node *nodes;
    int32_t *scal_start;
    int n_scal, cap_scal;
    double *scal;
    /* the raw key: inputs and nodes encoded as they are recorded */
    uint8_t *kb;
    size_t klen, kcap;
    bool key_oom;
};

static void key_put(ctpu_trace_rec *r, const void *p, size_t n)
{
    if (r->klen + n > r->kcap) {
        size_t nc = r->kcap ? r->kcap * 2 : 4096;
        while (nc < r->klen + n) nc *= 2;
        uint8_t *q = realloc(r->kb, nc);
        if (!q) { r->key_oom = true; return; }
        r->kb = q;
        r->kcap = nc;
    }
    memcpy(r->kb + r->klen, p, n);
    r->klen += n;
}

static void key_vtype(ctpu_trace_rec *r, char tag, const ctpu_vtype *t)
{
    uint8_t h[3] = { (uint8_t)tag, t->dtype, t->ndim };
    key_put(r, h, 3);
    key_put(r, t->shape, sizeof(int64_t) * t->ndim);
}

static bool grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap) return true;
    int nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

ctpu_trace_rec *ctpu_trace_rec_create(void) { return calloc(1, sizeof(ctpu_trace_rec)); }

void ctpu_trace_rec_reset(ctpu_trace_rec *r, ctpu_device *dev)
{
    /* dev NULL: the runtime is gone, and the buffers with it */
    if (dev)
        for (int i = 0; i < r->n_in; i++) ctpu_buffer_release(dev, r->in_buf[i]);
    r->n_in = 0;
    r->n_nodes = 0;
    r->n_scal = 0;
    r->klen = 0;
    r->key_oom = false;
}

void ctpu_trace_rec_destroy(ctpu_trace_rec *r, ctpu_device *dev)
{
    if (!r) return;
    ctpu_trace_rec_reset(r, dev);
    free(r->in_type);
    free(r->in_buf);
    free(r->in_off);
    free(r->nodes);
    free(r->scal_start);
    free(r->scal);
    free(r->kb);
    free(r);
}

int ctpu_trace_rec_nodes(const ctpu_trace_rec *r) { return r->n_nodes; }

static bool vtype_eq(const ctpu_vtype *a, const ctpu_vtype *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

ctpu_vref ctpu_trace_rec_input(ctpu_trace_rec *r, ctpu_buffer *buf, size_t off, const ctpu_vtype *t)
{
    /* traces hold tens of inputs: a linear scan from the newest is cheap */
    for (int i = r->n_in - 1; i >= 0; i--)
        if (r->in_buf[i] == buf && r->in_off[i] == off && vtype_eq(&r->in_type[i], t)) return -(i + 1);
    int cap = r->cap_in;
    if (!grow((void **)&r->in_type, &cap, r->n_in + 1, sizeof *r->in_type)) return CTPU_VREF_OOM;
    cap = r->cap_in;
    if (!grow((void **)&r->in_buf, &cap, r->n_in + 1, sizeof *r->in_buf)) return CTPU_VREF_OOM;
    cap = r->cap_in;
    if (!grow((void **)&r->in_off, &cap, r->n_in + 1, sizeof *r->in_off)) return CTPU_VREF_OOM;
    r->cap_in = cap;
    r->in_type[r->n_in] = *t;
    r->in_buf[r->n_in] = buf;
    r->in_off[r->n_in] = off;
    ctpu_buffer_retain(buf);
    r->n_in++;
    key_vtype(r, 'I', t);
    return -r->n_in;
}

ctpu_vref ctpu_trace_rec_node(ctpu_trace_rec *r, const ctpu_node *node, const double *scalars)
{
    int cap = r->cap_nodes;
    if (!grow((void **)&r->nodes, &cap, r->n_nodes + 1, sizeof *r->nodes)) return -CTPU_VREF_OOM;
    cap = r->cap_nodes;
    if (!grow((void **)&r->scal_start, &cap, r->n_nodes + 1, sizeof *r->scal_start)) return -CTPU_VREF_OOM;
    r->cap_nodes = cap;
    if (!grow((void **)&r->scal, &r->cap_scal, r->n_scal + node->n_scalars, sizeof *r->scal)) return -CTPU_VREF_OOM;
    r->nodes[r->n_nodes] = *node;
    r->scal_start[r->n_nodes] = r->n_scal;
    for (int i = 0; i < node->n_scalars; i++) r->scal[r->n_scal++] = scalars[i];
    /* key: op, arity, wiring, type, attrs when set (never scalar values) */
    static const ctpu_attrs zero_attrs;
    bool has_attr = memcmp(&node->attr, &zero_attrs, sizeof zero_attrs) != 0;
    uint8_t h[4] = { (uint8_t)(node->op & 0xff), (uint8_t)(node->op >> 8),
                     (uint8_t)(node->n_in | (has_attr << 7)), node->n_scalars };
    key_put(r, h, 4);
    key_put(r, node->in, sizeof(int32_t) * node->n_in);
    key_vtype(r, 'N', &node->out);
    if (has_attr) key_put(r, &node->attr, sizeof node->attr);
    return r->n_nodes++;
}

bool ctpu_trace_rec_key(const ctpu_trace_rec *r, const uint8_t **key, size_t *len)
{
    *key = r->kb;
    *len = r->klen;
    return !r->key_oom;
}

int ctpu_trace_rec_inputs(const ctpu_trace_rec *r, ctpu_buffer *const **bufs, const size_t **offs,
                          const ctpu_vtype **types)
{
    *bufs = r->in_buf;
    *offs = r->in_off;
    if (types) *types = r->in_type;
    return r->n_in;
}

const double *ctpu_trace_rec_scalars(const ctpu_trace_rec *r) { return r->scal; }

const ctpu_vtype *ctpu_trace_rec_type(const ctpu_trace_rec *r, ctpu_vref v)
{
    return v >= 0 ? &r->nodes[v].out : &r->in_type[-v - 1];
}

void ctpu_trace_final_free(ctpu_trace_final *f)
{
    free(f->t.in_type);
    free(f->t.nodes);
    free(f->t.outputs);
    free(f->t.out_alias);
    free(f->in_buf);
    free(f->in_off);
    free(f->alias_buf);
    free(f->alias_off);
    free(f->scalars);
    free(f->req_out);
    free(f->in_src);
    free(f->scal_src);
    free(f->alias_req);
    memset(f, 0, sizeof *f);
}

/* May output value v (node p) be written into input i's buffer? Only when no
 * node after p reads input i, and p itself (if it reads i) is elementwise and
 * reads it at the output's own positions (same shape), so each block is read
 * before it is written. */
static bool alias_safe(const ctpu_trace_rec *r, const bool *live, int p, int in_idx)
{
    ctpu_vref iv = -(in_idx + 1);
    for (int q = p; q < r->n_nodes; q++) {
        if (!live[q]) continue;
        const ctpu_node *n = &r->nodes[q];
        for (int k = 0; k < n->n_in; k++) {
            if (n->in[k] != iv) continue;
            if (q > p) return false;
            if (!ctpu_op_is(n->op, CTPU_OPK_ELEMENTWISE) || !vtype_eq(&r->in_type[in_idx], &n->out))
                return false;
        }
    }
    return true;
}

bool ctpu_trace_finalize(const ctpu_trace_rec *r, const ctpu_liveout_req *reqs, int nreq,
                         uint8_t precision, uint8_t debug_checks, ctpu_trace_final *out)
{
    memset(out, 0, sizeof *out);
    int nn = r->n_nodes, ni = r->n_in;
    bool *live = calloc((size_t)nn + 1, 1);
    int32_t *node_id = malloc(sizeof(int32_t) * ((size_t)nn + 1));
    int32_t *in_id = malloc(sizeof(int32_t) * ((size_t)ni + 1));
    int32_t *first_req = malloc(sizeof(int32_t) * ((size_t)nn + 1));
    if (!live || !node_id || !in_id || !first_req) goto oom;

    /* dead-code elimination: live = reachable from a requested value */
    for (int i = 0; i < nreq; i++)
        if (reqs[i].v >= 0) live[reqs[i].v] = true;
    for (int i = nn - 1; i >= 0; i--) {
        if (!live[i]) continue;
        for (int k = 0; k < r->nodes[i].n_in; k++)
            if (r->nodes[i].in[k] >= 0) live[r->nodes[i].in[k]] = true;
    }
    /* canonical numbering: inputs by first use, then live nodes in order */
    for (int i = 0; i < ni; i++) in_id[i] = -1;
    int n_inputs = 0, n_live = 0, n_scal = 0;
    for (int i = 0; i < nn; i++) {
        if (!live[i]) continue;
        n_live++;
        n_scal += r->nodes[i].n_scalars;
        for (int k = 0; k < r->nodes[i].n_in; k++) {
            ctpu_vref v = r->nodes[i].in[k];
            if (v < 0 && in_id[-v - 1] < 0) in_id[-v - 1] = n_inputs++;
        }
    }
    for (int i = 0, k = 0; i < nn; i++) node_id[i] = live[i] ? n_inputs + k++ : -1;

    ctpu_trace *t = &out->t;
    t->n_inputs = n_inputs;
    t->n_nodes = n_live;
    t->n_scalars = n_scal;
    t->precision = precision;
    t->debug_checks = debug_checks;
    t->in_type = malloc(sizeof(ctpu_vtype) * ((size_t)n_inputs + 1));
    t->nodes = malloc(sizeof(ctpu_node) * ((size_t)n_live + 1));
    out->in_buf = malloc(sizeof(ctpu_buffer *) * ((size_t)n_inputs + 1));
    out->in_off = malloc(sizeof(size_t) * ((size_t)n_inputs + 1));
    out->scalars = malloc(sizeof(double) * ((size_t)n_scal + 1));
    out->req_out = malloc(sizeof(int32_t) * ((size_t)nreq + 1));
    t->outputs = malloc(sizeof(int32_t) * ((size_t)nreq + 1));
    t->out_alias = malloc(sizeof(int32_t) * ((size_t)nreq + 1));
    out->in_src = malloc(sizeof(int32_t) * ((size_t)n_inputs + 1));
    out->scal_src = malloc(sizeof(int32_t) * ((size_t)n_scal + 1));
    out->alias_req = malloc(sizeof(int32_t) * ((size_t)nreq + 1));
    out->alias_buf = calloc((size_t)nreq + 1, sizeof(ctpu_buffer *));
    out->alias_off = calloc((size_t)nreq + 1, sizeof(size_t));
    if (!t->in_type || !t->nodes || !out->in_buf || !out->in_off || !out->scalars || !out->req_out ||
        !t->outputs || !t->out_alias || !out->alias_buf || !out->alias_off || !out->in_src ||
        !out->scal_src || !out->alias_req)
        goto oom;
    for (int i = 0; i < ni; i++) {
        if (in_id[i] < 0) continue;
        t->in_type[in_id[i]] = r->in_type[i];
        out->in_src[in_id[i]] = i;
        out->in_buf[in_id[i]] = r->in_buf[i];
        out->in_off[in_id[i]] = r->in_off[i];
    }
    for (int i = 0, k = 0, s = 0; i < nn; i++) {
        if (!live[i]) continue;
        ctpu_node n = r->nodes[i];
        for (int j = 0; j < n.n_in; j++)
            n.in[j] = n.in[j] < 0 ? in_id[-n.in[j] - 1] : node_id[n.in[j]];
        t->nodes[k++] = n;
        for (int j = 0; j < n.n_scalars; j++) {
            out->scal_src[s] = r->scal_start[i] + j;
            out->scalars[s++] = r->scal[r->scal_start[i] + j];
        }
    }

    /* outputs: each requested value once, in canonical (node) order */
    for (int i = 0; i < nn; i++) first_req[i] = -1;
    for (int q = 0; q < nreq; q++)
        if (reqs[q].v >= 0) first_req[reqs[q].v] = 0;          /* wanted */
    int n_out = 0;
    for (int i = 0; i < nn; i++) {
        if (first_req[i] < 0) continue;
        first_req[i] = n_out;
        t->outputs[n_out] = node_id[i];
        t->out_alias[n_out] = -1;
        out->alias_req[n_out] = -1;
        n_out++;
    }
    for (int q = 0; q < nreq; q++) {
        int i = reqs[q].v;
        if (i < 0) continue;
        int o = first_req[i];
        out->req_out[q] = o;
        if (!reqs[q].alias_buf || t->out_alias[o] != -1) continue;
        /* is the parameter's buffer read by this program (under this view only)? */
        int in_idx = -1;
        bool other_view = false;
        for (int j = 0; j < ni; j++) {
            if (in_id[j] < 0 || r->in_buf[j] != reqs[q].alias_buf) continue;
            if (r->in_off[j] == reqs[q].alias_off && in_idx < 0) in_idx = j;
            else other_view = true;
        }
        if (other_view) continue;
        if (in_idx < 0) t->out_alias[o] = CTPU_ALIAS_DONATED;
        else if (alias_safe(r, live, i, in_idx)) t->out_alias[o] = in_id[in_idx];
        else continue;
        out->alias_buf[o] = reqs[q].alias_buf;
        out->alias_off[o] = reqs[q].alias_off;
        out->alias_req[o] = q;
    }
    for (int q = 0; q < nreq; q++)
        if (reqs[q].v < 0) out->req_out[q] = -1;   /* an input value: no output needed */
    t->n_outputs = n_out;
    free(live);
    free(node_id);
    free(in_id);
    free(first_req);
    return true;
oom:
    free(live);
    free(node_id);
    free(in_id);
    free(first_req);
    ctpu_trace_final_free(out);
    return false;
}
