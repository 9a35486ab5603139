/* Trace recording and finalisation (DESIGN.md "Defer and fuse"). */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "trace.h"

/* Key bytes are folded into the running hash once this many are waiting
 * (one XXH3 update per few dozen nodes; the hash is XXH3-64 of the bytes in
 * order, whatever the chunking). */
#define KEY_FOLD_BYTES 1024

struct ctpu_trace_rec {
    int n_in, cap_in;
    ctpu_vtype *in_type;
    ctpu_buffer **in_buf;
    size_t *in_off;
    int n_nodes, cap_nodes;
    ctpu_node *nodes;
    int32_t *scal_start;
    ctpu_op_prov *prov;        /* [n_nodes] op number and label of each dispatch (not in the key) */
    uint8_t *read;             /* [n_nodes] 1: a later node reads the value */
    int32_t *in_at;            /* [n_in] the node count when the input was recorded (its key bytes' place) */
    int prov_lo, prov_hi;      /* the nodes of the lowest nonzero and the highest op number (first of equals) */
    int n_scal, cap_scal;
    double *scal;
    /* the raw key: inputs and nodes encoded as they are recorded */
    uint8_t *kb;
    size_t klen, kcap;
    bool key_oom;
    /* its XXH3-64 so far: kb[0, khashed) folded in (NULL: out of memory at create) */
    XXH3_state_t *hs, *hs_fin;  /* hs_fin: a copy the final suffix goes into */
    size_t khashed;
};

/* Room for n more key bytes (NULL and key_oom set when out of memory). */
static inline uint8_t *key_room(ctpu_trace_rec *r, size_t n)
{
    if (r->klen + n > r->kcap) {
        size_t nc = r->kcap ? r->kcap * 2 : 4096;
        while (nc < r->klen + n) nc *= 2;
        uint8_t *q = realloc(r->kb, nc);
        if (!q) { r->key_oom = true; return NULL; }
        r->kb = q;
        r->kcap = nc;
    }
    return r->kb + r->klen;
}

static void key_put(ctpu_trace_rec *r, const void *p, size_t n)
{
    uint8_t *q = key_room(r, n);
    if (!q) return;
    memcpy(q, p, n);
    r->klen += n;
}

/* Fold the key bytes recorded since the last fold into the running hash. */
static void key_fold(ctpu_trace_rec *r)
{
    if (r->klen > r->khashed && XXH3_64bits_update(r->hs, r->kb + r->khashed, r->klen - r->khashed) != XXH_OK)
        r->key_oom = true;   /* (XXH3's update fails only on a NULL input) */
    r->khashed = r->klen;
}

static inline void key_maybe_fold(ctpu_trace_rec *r)
{
    if (r->klen - r->khashed >= KEY_FOLD_BYTES) key_fold(r);
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

ctpu_trace_rec *ctpu_trace_rec_create(void)
{
    ctpu_trace_rec *r = calloc(1, sizeof(ctpu_trace_rec));
    if (!r) return NULL;
    r->hs = XXH3_createState();
    r->hs_fin = XXH3_createState();
    if (!r->hs || !r->hs_fin || XXH3_64bits_reset(r->hs) != XXH_OK) {
        XXH3_freeState(r->hs);
        XXH3_freeState(r->hs_fin);
        free(r);
        return NULL;
    }
    return r;
}

void ctpu_trace_rec_reset(ctpu_trace_rec *r, ctpu_device *dev)
{
    /* dev NULL: the runtime is gone, and the buffers with it */
    if (dev)
        for (int i = 0; i < r->n_in; i++) {
            atomic_fetch_sub_explicit(&r->in_buf[i]->trace_readers, 1, memory_order_release);
            ctpu_buffer_release(dev, r->in_buf[i]);
        }
    r->n_in = 0;
    r->n_nodes = 0;
    r->n_scal = 0;
    r->klen = 0;
    r->key_oom = false;
    r->khashed = 0;
    XXH3_64bits_reset(r->hs);
    r->prov_lo = r->prov_hi = 0;
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
    free(r->prov);
    free(r->read);
    free(r->in_at);
    free(r->scal);
    free(r->kb);
    XXH3_freeState(r->hs);
    XXH3_freeState(r->hs_fin);
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
    cap = r->cap_in;
    if (!grow((void **)&r->in_at, &cap, r->n_in + 1, sizeof *r->in_at)) return CTPU_VREF_OOM;
    r->cap_in = cap;
    r->in_at[r->n_in] = r->n_nodes;
    r->in_type[r->n_in] = *t;
    r->in_buf[r->n_in] = buf;
    r->in_off[r->n_in] = off;
    ctpu_buffer_retain(buf);
    ctpu_buffer_bind_touch(buf);
    atomic_fetch_add_explicit(&buf->trace_readers, 1, memory_order_acq_rel);   /* an assign elsewhere copies now */
    r->n_in++;
    key_vtype(r, 'I', t);
    key_maybe_fold(r);
    return -r->n_in;
}

int ctpu_trace_rec_reads_buf(const ctpu_trace_rec *r, const ctpu_buffer *buf)
{
    int n = 0;
    for (int i = 0; i < r->n_in; i++) n += r->in_buf[i] == buf;
    return n;
}

ctpu_vref ctpu_trace_rec_node(ctpu_trace_rec *r, const ctpu_node *node, const double *scalars, ctpu_op_prov prov)
{
    int id = r->n_nodes, ns = node->n_scalars, s0 = r->n_scal;
    if (id == r->cap_nodes) {
        int cap = r->cap_nodes;
        if (!grow((void **)&r->nodes, &cap, id + 1, sizeof *r->nodes)) return -CTPU_VREF_OOM;
        cap = r->cap_nodes;
        if (!grow((void **)&r->scal_start, &cap, id + 1, sizeof *r->scal_start)) return -CTPU_VREF_OOM;
        cap = r->cap_nodes;
        if (!grow((void **)&r->prov, &cap, id + 1, sizeof *r->prov)) return -CTPU_VREF_OOM;
        cap = r->cap_nodes;
        if (!grow((void **)&r->read, &cap, id + 1, sizeof *r->read)) return -CTPU_VREF_OOM;
        r->cap_nodes = cap;
    }
    r->prov[id] = prov;
    r->read[id] = 0;
    if (id == 0) {
        r->prov_lo = r->prov_hi = 0;
    } else {
        uint32_t lo = r->prov[r->prov_lo].op_no;
        if (prov.op_no && (prov.op_no < lo || !lo)) r->prov_lo = id;
        if (prov.op_no > r->prov[r->prov_hi].op_no) r->prov_hi = id;
    }
    if (s0 + ns > r->cap_scal && !grow((void **)&r->scal, &r->cap_scal, s0 + ns, sizeof *r->scal))
        return -CTPU_VREF_OOM;
    r->nodes[id] = *node;
    r->scal_start[id] = s0;
    double *sc = r->scal + s0;
    _Static_assert(CTPU_NODE_MAX_SCALARS == 4, "the copy below takes at most 4 scalars");
    switch (ns) {   /* (a loop here is a vectorised loop's set-up for one scalar) */
    case 4: sc[3] = scalars[3]; /* fall through */
    case 3: sc[2] = scalars[2]; /* fall through */
    case 2: sc[1] = scalars[1]; /* fall through */
    case 1: sc[0] = scalars[0]; /* fall through */
    default: break;
    }
    r->n_scal = s0 + ns;
    r->n_nodes = id + 1;
    /* key: op, arity, wiring, type, attrs when set (never scalar values);
     * the bytes key_vtype would write for the output, in one reservation.
     * The wiring and the shape are copied whole (fixed-size copies, no libc
     * call): the room has slack for them, and klen counts only the bytes used. */
    bool has_attr = !ctpu_attrs_zero(&node->attr);
    int n_in = node->n_in, nd = node->out.ndim;
    for (int k = 0; k < n_in; k++)
        if (node->in[k] >= 0) r->read[node->in[k]] = 1;
    size_t win = sizeof(int32_t) * (size_t)n_in, wsh = sizeof(int64_t) * (size_t)nd;
    size_t need = 4 + win + 3 + wsh + (has_attr ? sizeof node->attr : 0);
    uint8_t *p = key_room(r, need + sizeof node->in + sizeof node->out.shape);
    if (!p) return id;
    p[0] = (uint8_t)(node->op & 0xff);
    p[1] = (uint8_t)(node->op >> 8);
    p[2] = (uint8_t)(n_in | (has_attr << 7));
    p[3] = node->n_scalars;
    p += 4;
    memcpy(p, node->in, sizeof node->in);
    p += win;
    p[0] = 'N';
    p[1] = node->out.dtype;
    p[2] = (uint8_t)nd;
    p += 3;
    memcpy(p, node->out.shape, sizeof node->out.shape);
    p += wsh;
    if (has_attr) memcpy(p, &node->attr, sizeof node->attr);
    r->klen += need;
    key_maybe_fold(r);
    return id;
}

bool ctpu_trace_rec_key(const ctpu_trace_rec *r, const uint8_t **key, size_t *len)
{
    *key = r->kb;
    *len = r->klen;
    return !r->key_oom;
}

bool ctpu_trace_rec_key_final(ctpu_trace_rec *r, const void *suffix, size_t slen, const uint8_t **key, size_t *len,
                              uint64_t *hash)
{
    if (r->key_oom) return false;
    key_fold(r);
    uint8_t *p = key_room(r, slen);
    if (!p) return false;
    if (slen) memcpy(p, suffix, slen);   /* past klen: recording on would write over it */
    XXH3_state_t *h = r->hs_fin;
    XXH3_copyState(h, r->hs);
    bool ok = !slen || XXH3_64bits_update(h, p, slen) == XXH_OK;
    *hash = XXH3_64bits_digest(h);
    *key = r->kb;
    *len = r->klen + slen;
    return ok;
}

size_t ctpu_trace_rec_key_scratch(const ctpu_trace_rec *r, uint8_t *buf, size_t cap)
{
    size_t len = 0;
    bool ok = true;
#define PUT(src, n)                                                  \
    do {                                                             \
        size_t n_ = (n);                                             \
        if (len + n_ > cap) ok = false;                              \
        else { memcpy(buf + len, (src), n_); len += n_; }            \
    } while (0)
    int j = 0;
    for (int i = 0; i <= r->n_nodes && ok; i++) {
        for (; j < r->n_in && r->in_at[j] == i; j++) {
            const ctpu_vtype *t = &r->in_type[j];
            uint8_t h[3] = { 'I', t->dtype, t->ndim };
            PUT(h, 3);
            PUT(t->shape, sizeof(int64_t) * t->ndim);
        }
        if (i == r->n_nodes) break;
        const ctpu_node *n = &r->nodes[i];
        bool has_attr = !ctpu_attrs_zero(&n->attr);
        uint8_t h[4] = { (uint8_t)(n->op & 0xff), (uint8_t)(n->op >> 8), (uint8_t)(n->n_in | (has_attr << 7)),
                         n->n_scalars };
        PUT(h, 4);
        PUT(n->in, sizeof(int32_t) * (size_t)n->n_in);
        uint8_t t[3] = { 'N', n->out.dtype, n->out.ndim };
        PUT(t, 3);
        PUT(n->out.shape, sizeof(int64_t) * n->out.ndim);
        if (has_attr) PUT(&n->attr, sizeof n->attr);
    }
#undef PUT
    return ok ? len : 0;
}

const uint8_t *ctpu_trace_rec_read(const ctpu_trace_rec *r) { return r->read; }

bool ctpu_trace_rec_prov_span(const ctpu_trace_rec *r, ctpu_op_prov *lo, ctpu_op_prov *hi)
{
    if (r->n_nodes == 0) return false;
    *lo = r->prov[r->prov_lo];
    *hi = r->prov[r->prov_hi];
    return true;
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
int ctpu_trace_rec_n_scalars(const ctpu_trace_rec *r) { return r->n_scal; }
const ctpu_op_prov *ctpu_trace_rec_prov(const ctpu_trace_rec *r) { return r->prov; }

const ctpu_node *ctpu_trace_rec_node_at(const ctpu_trace_rec *r, int i, const double **scalars)
{
    *scalars = r->scal + r->scal_start[i];
    return &r->nodes[i];
}

void ctpu_trace_final_free(ctpu_trace_final *f)
{
    free(f->t.in_type);
    free(f->t.nodes);
    free(f->t.outputs);
    free(f->t.out_alias);
    free(f->plan);
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

/* The steps of ctpu_trace_finalize share this. */
typedef struct {
    const ctpu_trace_rec *r;
    const ctpu_liveout_req *reqs;
    int nreq, nn, ni;
    bool *live;                /* [nn] reachable from a requested value */
    int32_t *node_id;          /* [nn] canonical value id of each live node, -1 dead */
    int32_t *in_id;            /* [ni] canonical input index, -1 unused */
    int32_t *out_of;           /* [nn] output index of each requested node, -1 none */
    int n_inputs, n_live, n_scal, n_out;
} final_ctx;

/* Dead-code elimination: live = reachable from a requested value. */
static void mark_live(final_ctx *f)
{
    const ctpu_trace_rec *r = f->r;
    for (int i = 0; i < f->nreq; i++)
        if (f->reqs[i].v >= 0) f->live[f->reqs[i].v] = true;
    for (int i = f->nn - 1; i >= 0; i--) {
        if (!f->live[i]) continue;
        for (int k = 0; k < r->nodes[i].n_in; k++)
            if (r->nodes[i].in[k] >= 0) f->live[r->nodes[i].in[k]] = true;
    }
}

/* Canonical numbering: inputs by first use, then live nodes in order; the
 * outputs: each requested value once, in node order. */
static void number_values(final_ctx *f)
{
    const ctpu_trace_rec *r = f->r;
    for (int i = 0; i < f->ni; i++) f->in_id[i] = -1;
    for (int i = 0; i < f->nn; i++) {
        if (!f->live[i]) continue;
        f->n_live++;
        f->n_scal += r->nodes[i].n_scalars;
        for (int k = 0; k < r->nodes[i].n_in; k++) {
            ctpu_vref v = r->nodes[i].in[k];
            if (v < 0 && f->in_id[-v - 1] < 0) f->in_id[-v - 1] = f->n_inputs++;
        }
    }
    for (int i = 0, k = 0; i < f->nn; i++) f->node_id[i] = f->live[i] ? f->n_inputs + k++ : -1;
    for (int i = 0; i < f->nn; i++) f->out_of[i] = -1;
    for (int q = 0; q < f->nreq; q++)
        if (f->reqs[q].v >= 0) f->out_of[f->reqs[q].v] = 0;          /* wanted */
    for (int i = 0; i < f->nn; i++)
        if (f->out_of[i] >= 0) f->out_of[i] = f->n_out++;
}

/* The canonical trace's arrays and the launch plan (one block). */
static bool final_alloc(const final_ctx *f, ctpu_trace_final *out)
{
    ctpu_trace *t = &out->t;
    t->in_type = malloc(sizeof(ctpu_vtype) * ((size_t)f->n_inputs + 1));
    t->nodes = malloc(sizeof(ctpu_node) * ((size_t)f->n_live + 1));
    t->outputs = malloc(sizeof(int32_t) * ((size_t)f->n_out + 1));
    t->out_alias = malloc(sizeof(int32_t) * ((size_t)f->n_out + 1));
    size_t n32 = (size_t)f->n_inputs + (size_t)f->nreq + (size_t)f->n_out + (size_t)f->n_scal + (size_t)f->n_live + 5;
    ctpu_launch_plan *p = malloc(sizeof *p + sizeof(size_t) * ((size_t)f->n_out + 1) + sizeof(int32_t) * n32);
    out->plan = p;
    if (!t->in_type || !t->nodes || !t->outputs || !t->out_alias || !p) return false;
    *p = (ctpu_launch_plan){ .n_in = f->n_inputs, .n_out = f->n_out, .n_scal = f->n_scal, .n_req = f->nreq };
    p->out_bytes = (size_t *)(p + 1);
    p->in_src = (int32_t *)(p->out_bytes + f->n_out + 1);
    p->req_out = p->in_src + f->n_inputs + 1;
    p->alias_req = p->req_out + f->nreq + 1;
    p->scal_src = p->alias_req + f->n_out + 1;
    p->node_src = p->scal_src + f->n_scal + 1;
    p->n_nodes = f->n_live;
    return true;
}

/* Inputs and live nodes in canonical numbering, and where each input and
 * runtime scalar comes from in the recording. */
static void copy_nodes(const final_ctx *f, ctpu_trace_final *out)
{
    const ctpu_trace_rec *r = f->r;
    ctpu_trace *t = &out->t;
    for (int i = 0; i < f->ni; i++) {
        if (f->in_id[i] < 0) continue;
        t->in_type[f->in_id[i]] = r->in_type[i];
        out->plan->in_src[f->in_id[i]] = i;
    }
    for (int i = 0, k = 0, s = 0; i < f->nn; i++) {
        if (!f->live[i]) continue;
        ctpu_node n = r->nodes[i];
        for (int j = 0; j < n.n_in; j++)
            n.in[j] = n.in[j] < 0 ? f->in_id[-n.in[j] - 1] : f->node_id[n.in[j]];
        out->plan->node_src[k] = i;
        t->nodes[k++] = n;
        for (int j = 0; j < n.n_scalars; j++) out->plan->scal_src[s++] = r->scal_start[i] + j;
    }
    bool ident = true;
    for (int i = 0; i < f->n_scal && ident; i++) ident = out->plan->scal_src[i] == i;
    out->plan->scal_ident = ident;
}

/* Request q's output, written into its parameter's own buffer when that is
 * safe: the buffer is read by the program under this view only, and every
 * read of it comes before the write (alias_safe), or not read at all
 * (donated). */
static void alias_output(const final_ctx *f, ctpu_trace_final *out, int q)
{
    const ctpu_trace_rec *r = f->r;
    const ctpu_liveout_req *rq = &f->reqs[q];
    int i = rq->v, o = f->out_of[i];
    if (!rq->alias_buf || out->t.out_alias[o] != -1) return;
    int in_idx = -1;
    bool other_view = false;
    for (int j = 0; j < f->ni; j++) {
        if (f->in_id[j] < 0 || r->in_buf[j] != rq->alias_buf) continue;
        if (r->in_off[j] == rq->alias_off && in_idx < 0) in_idx = j;
        else other_view = true;
    }
    if (other_view) return;
    if (in_idx < 0) out->t.out_alias[o] = CTPU_ALIAS_DONATED;
    else if (alias_safe(r, f->live, i, in_idx)) out->t.out_alias[o] = f->in_id[in_idx];
    else return;
    out->plan->alias_req[o] = q;
}

static void bind_outputs(const final_ctx *f, ctpu_trace_final *out)
{
    ctpu_trace *t = &out->t;
    ctpu_launch_plan *p = out->plan;
    for (int i = 0; i < f->nn; i++) {
        int o = f->out_of[i];
        if (o < 0) continue;
        t->outputs[o] = f->node_id[i];
        t->out_alias[o] = -1;
        p->alias_req[o] = -1;
    }
    for (int q = 0; q < f->nreq; q++) {
        if (f->reqs[q].v < 0) continue;
        p->req_out[q] = f->out_of[f->reqs[q].v];
        alias_output(f, out, q);
    }
    for (int q = 0; q < f->nreq; q++)
        if (f->reqs[q].v < 0) p->req_out[q] = -1;   /* an input value: no output needed */
    t->n_outputs = f->n_out;
    for (int j = 0; j < f->n_out; j++) {
        const ctpu_vtype *vt = &t->nodes[t->outputs[j] - t->n_inputs].out;
        p->out_bytes[j] = (size_t)ctpu_vtype_numel(vt) * ctpu_kdt_size(vt->dtype);
    }
}

bool ctpu_trace_finalize(const ctpu_trace_rec *r, const ctpu_liveout_req *reqs, int nreq,
                         uint8_t precision, uint8_t debug_checks, ctpu_trace_final *out)
{
    memset(out, 0, sizeof *out);
    final_ctx f = { .r = r, .reqs = reqs, .nreq = nreq, .nn = r->n_nodes, .ni = r->n_in };
    f.live = calloc((size_t)f.nn + 1, 1);
    f.node_id = malloc(sizeof(int32_t) * ((size_t)f.nn + 1));
    f.in_id = malloc(sizeof(int32_t) * ((size_t)f.ni + 1));
    f.out_of = malloc(sizeof(int32_t) * ((size_t)f.nn + 1));
    bool ok = f.live && f.node_id && f.in_id && f.out_of;
    if (ok) {
        mark_live(&f);
        number_values(&f);
        out->t = (ctpu_trace){ .n_inputs = f.n_inputs, .n_nodes = f.n_live, .n_scalars = f.n_scal,
                               .precision = precision, .debug_checks = debug_checks };
        ok = final_alloc(&f, out);
    }
    if (ok) {
        copy_nodes(&f, out);
        bind_outputs(&f, out);
    }
    free(f.live);
    free(f.node_id);
    free(f.in_id);
    free(f.out_of);
    if (!ok) ctpu_trace_final_free(out);
    return ok;
}
