/* The compiler: a finalised trace (dead code already removed by
 * ctpu_trace_finalize) -> a program the device runs unchecked. It is checked
 * here once. The passes, in order, over one compile_ctx:
 *
 *   group nodes       fusion groups: an f32 matmul (batched too) with its
 *                     scale / bias / activation / residual / softmax epilogue; maximal runs of
 *                     consecutive VM-fusable nodes of one shape (one
 *                     block-VM step: their intermediates never exist in
 *                     memory), optionally ending in a reduction over trailing
 *                     dims; row groups (rows.c: reductions over trailing
 *                     dims and softmax with their producers and
 *                     consumers) when they take more nodes; every other
 *                     node alone
 *   plan buffers      bound slots (inputs, then outputs), the step order, and
 *                     scratch offsets for values used across steps but not
 *                     live-out (first fit, reused by liveness)
 *   emit steps        one step per group: the matmul with its epilogue, a
 *                     VM group with its reduction, a VM group, or one node's
 *                     kernel entry
 *   fault deps        per output, the inputs and steps it is computed from
 *                     (a fault poisons only those outputs)
 *   debug tables      per output and, with debug checks, per step: the value
 *                     to scan for NaN and the op to name
 *   estimate cost     the roofline estimate on every chip profile
 *                     (src/cost), which reports add up per launch
 *
 * A strict one-node trace goes through the same passes and becomes a single
 * step. */
#include <stdlib.h>
#include <string.h>

#include "vm.h"

/* per matmul: bias value, activation, residual value, scale node, softmax node */
#define EPI_N 5

typedef struct {
    void **p;
    int n, cap;
} alloc_list;

static void *al_alloc(alloc_list *a, size_t bytes)
{
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 16;
        void **q = realloc(a->p, sizeof(void *) * (size_t)nc);
        if (!q) return NULL;
        a->p = q;
        a->cap = nc;
    }
    void *m = calloc(1, bytes ? bytes : 1);
    if (m) a->p[a->n++] = m;
    return m;
}

/* Everything the passes share. Arrays are allocated in `al` (they live as
 * long as the program: steps point into some of them). */
typedef struct {
    const ctpu_trace *t;
    int nin, nn, no, nv;       /* inputs, nodes, outputs, values (nin + nn) */
    alloc_list al;
    char *err;
    size_t errlen;
    /* group nodes */
    int32_t *uses;             /* [nv] reads of each value (an output counts 2: never internal) */
    int32_t *epi;              /* [EPI_N nn] per matmul: bias value, activation, residual value, scale node,
                                  softmax node; -1 none */
    int32_t *group;            /* [nn] fusion group of each node */
    int n_groups;
    bool *row_group;           /* [nn] per group: a row group (rows.c) */
    bool *loss_group;          /* [nn] per group: a loss step (loss.c) */
    bool *used_outside;        /* [nn] the node's value is read outside its group (or is an output) */
    /* plan buffers */
    int32_t *slot_of;          /* [nv] bound or scratch slot of each value, -1 none */
    int32_t *scal_base;        /* [nn] first runtime scalar of each node */
    int32_t *group_step;       /* [n_groups] the step that runs each group */
    int32_t *def_step;         /* [nv] step defining each value (-1: an input) */
    int32_t *last_use;         /* [nv] last step reading it from memory, -1 none */
    int32_t *view_of;          /* [nv] the scratch value whose memory a view (reshape, contiguous slice) is, -1 none */
    size_t *view_off;          /* [nv] a view's byte offset into that value's memory */
    int n_steps;
    int n_virtual;             /* values given scratch offsets */
    size_t *virt_off;          /* [n_virtual] */
    size_t scratch;            /* scratch bytes */
    struct pack_link *links;   /* [n_links] packed operands shared by matmul steps (plan_packs) */
    int n_links;
    /* emit steps */
    ctpu_step *steps;          /* [n_steps] */
    /* fault deps */
    int wi, ws;                /* words per output: inputs, steps */
    uint64_t *odi, *ods;       /* or NULL: every output takes any fault */
    /* debug tables */
    uint8_t *out_dtype;
    int64_t *out_numel;
    const char **out_op;
    int32_t *so_slot;          /* per step (debug checks only), or NULL */
    uint8_t *so_dt;
    int64_t *so_n;
    const char **so_op;
    int32_t *si_off, *si_slot; /* per step, the values it reads (debug checks only) */
    uint8_t *si_dt, *so_nan_ok;
    int64_t *si_n;
    uint8_t *in_dtype, *out_nan_ok;
    int64_t *in_numel;
    int32_t *step_node;        /* [n_steps] the node naming each step */
} compile_ctx;

static bool oom(compile_ctx *cx)
{
    snprintf(cx->err, cx->errlen, "out of host memory compiling a program");
    return false;
}

static const ctpu_vtype *type_of(const ctpu_trace *t, int32_t v)
{
    return v < t->n_inputs ? &t->in_type[v] : &t->nodes[v - t->n_inputs].out;
}

static bool same_shape(const ctpu_vtype *a, const ctpu_vtype *b)
{
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

/* ------------------------------------------------------------ group nodes */
/* A reduction r of x over one contiguous group of dims (dims between them
 * of extent 1): x as [outer, n, inner], as exec.c's reduce_layout sees it.
 * False when the reduced dims are not one group. */
static bool red_layout(const ctpu_node *r, const ctpu_vtype *x, int64_t *n, int64_t *inner)
{
    uint32_t mask = 0;
    for (int i = 0; i < r->attr.n_dims; i++) mask |= 1u << r->attr.dims[i];
    if (!mask) return false;
    int first = __builtin_ctz(mask), last = 31 - __builtin_clz(mask);
    *n = 1;
    *inner = 1;
    for (int d = first; d <= last; d++) {
        if (!(mask & (1u << d)) && x->shape[d] != 1) return false;
        *n *= x->shape[d];
    }
    for (int d = last + 1; d < x->ndim; d++) *inner *= x->shape[d];
    return true;
}

/* Can reduction node r take value v (its input) straight from a VM group?
 * sum/mean/max/min of v's only use over one group of dims: trailing ones
 * (chunk by chunk), or leading / middle ones (inner > 1: each outer slice
 * made into a buffer of at most 4M elements, then reduced by the kernel
 * the node alone runs). */
static bool reduce_fusable(const ctpu_trace *t, const ctpu_node *r, int32_t v, const int32_t *uses)
{
    if (ctpu_op_fusion(r->op) != CTPU_FUSE_REDUCE && ctpu_op_fusion(r->op) != CTPU_FUSE_REDUCE_MEAN) return false;
    if (r->in[0] != v || uses[v] != 1 || r->attr.n_dims == 0) return false;
    int64_t n, inner;
    if (!red_layout(r, type_of(t, v), &n, &inner)) return false;
    return n > 0 && inner > 0 && (inner == 1 || n * inner <= ((int64_t)1 << 22)) && r->out.dtype != CTPU_KDT_I32;
}

/* Is value v of type ot a bias for a matmul output o: a row vector [N]
 * (any leading extents 1) against o's last dim, o having more than one row? */
static bool is_bias(const ctpu_vtype *ot, const ctpu_vtype *o)
{
    if (ot->ndim < 1 || ot->ndim > o->ndim || ot->shape[ot->ndim - 1] != o->shape[o->ndim - 1]) return false;
    for (int d = 0; d < ot->ndim - 1; d++)
        if (ot->shape[d] != 1) return false;
    return ctpu_vtype_numel(o) != o->shape[o->ndim - 1];
}

/* The matmul at node i and the epilogue nodes after it that the MXU kernel
 * applies to its accumulator (bit-identical to the separate ops), in the
 * kernel's order: x a scalar (mul_scalar), + bias, an activation, +
 * residual, then a softmax over the last dim, each the only use of the value before. Batched matmuls too:
 * the bias is a row vector, the residual has the output's shape. Returns
 * the end of the group. */
static int group_matmul(compile_ctx *cx, int i)
{
    const ctpu_trace *t = cx->t;
    const ctpu_node *n = &t->nodes[i];
    int32_t *epi = cx->epi + EPI_N * i;
    int32_t cur = cx->nin + i;              /* the value the chain has produced so far */
    int stage = 0;                          /* 0: anything next, 1: bias, act or residual, 2: act or residual, 3: residual, 4: softmax (each stage: and softmax) */
    int j = i + 1;
    while (j < cx->nn && cx->uses[cur] == 1) {
        const ctpu_node *m = &t->nodes[j];
        if (!same_shape(&m->out, &n->out) || m->out.dtype != CTPU_KDT_F32) break;
        if (ctpu_op_fusion(m->op) == CTPU_FUSE_ADD && (m->in[0] == cur || m->in[1] == cur)) {
            int32_t other = m->in[0] == cur ? m->in[1] : m->in[0];
            const ctpu_vtype *ot = type_of(t, other);
            if (other == cur || ot->dtype != CTPU_KDT_F32) break;
            if (stage <= 1 && is_bias(ot, &n->out)) { epi[0] = other; stage = 2; }
            else if (same_shape(ot, &n->out) && epi[2] < 0) { epi[2] = other; stage = 4; }
            else break;
        } else if (stage <= 2 && m->in[0] == cur && ctpu_op_fusion(m->op) == CTPU_FUSE_ACT) {
            epi[1] = ctpu_vm_epi_act(m->op);
            stage = 3;
        } else if (stage == 0 && m->op == CTPU_OP_MUL_SCALAR && m->in[0] == cur) {
            epi[3] = j;
            stage = 1;
        } else if (m->op == CTPU_OP_SOFTMAX && m->in[0] == cur && m->attr.dims[0] == n->out.ndim - 1) {
            epi[4] = j;   /* over each finished row (ctpu_k_softmax's bits: they depend on the row alone) */
            stage = 4;
        } else {
            break;
        }
        cur = cx->nin + j;
        j++;
        if (epi[4] >= 0) break;   /* (after + residual, only a softmax may follow) */
    }
    return j;
}

/* Does a broadcast into b (NumPy rules, right-aligned) with fewer elements? */
static bool bcasts_into(const ctpu_vtype *a, const ctpu_vtype *b)
{
    if (a->ndim > b->ndim) return false;
    for (int d = 0; d < a->ndim; d++) {
        int64_t x = a->shape[d], y = b->shape[b->ndim - a->ndim + d];
        if (x != y && x != 1) return false;
    }
    return ctpu_vtype_numel(a) < ctpu_vtype_numel(b);
}

/* A small producer in a VM group of another shape: at most a block of
 * elements, recomputed at every element of the group. */
static bool small_producer(const ctpu_vtype *a, const ctpu_vtype *group)
{
    return ctpu_vtype_numel(a) <= CTPU_K_BLOCK && bcasts_into(a, group);
}

/* The maximal run of VM-fusable nodes starting at i (at most
 * CTPU_VM_GROUP_NODES, at most CTPU_BCAST_MAX distinct values read from
 * outside) of one shape, the group's; a small producer of a shape that
 * broadcasts into it (the (1,) weight of a*(1-w)+b*w) joins when every use
 * of its value is in the group. Then a reduction over trailing dims of its
 * last value when that is the value's only use. Returns the end. */
static int group_vm_run(compile_ctx *cx, int i, bool allow_small)
{
    const ctpu_trace *t = cx->t;
    int nin = cx->nin, nn = cx->nn;
    const ctpu_vtype *S = &t->nodes[i].out;
    bool any_small = false;
    int32_t ext[CTPU_BCAST_MAX];
    int n_ext = 0, j;
    for (j = i; j < nn && j - i < CTPU_VM_GROUP_NODES; j++) {
        const ctpu_node *m = &t->nodes[j];
        const ctpu_vtype *it[CTPU_NODE_MAX_IN];
        for (int k = 0; k < m->n_in; k++) it[k] = type_of(t, m->in[k]);
        if (j > i && !ctpu_vm_fusable(m, it)) break;
        if (j > i && !same_shape(&m->out, S)) {
            bool grow = true;   /* every node so far is a small producer of m's shape */
            for (int k = i; k < j && grow; k++) grow = small_producer(&t->nodes[k].out, &m->out);
            if (!allow_small) break;
            if (small_producer(&m->out, S)) any_small = true;
            else if (grow) { S = &m->out; any_small = true; }
            else break;
        }
        int32_t add[3];
        int n_add = 0;
        for (int k = 0; k < m->n_in; k++) {
            int32_t v = m->in[k];
            if (v >= nin + i) continue;                 /* made in the group */
            bool seen = false;
            for (int q = 0; q < n_ext; q++) seen |= ext[q] == v;
            for (int q = 0; q < n_add; q++) seen |= add[q] == v;
            if (!seen) add[n_add++] = v;
        }
        if (n_ext + n_add > CTPU_BCAST_MAX) break;
        for (int q = 0; q < n_add; q++) ext[n_ext++] = add[q];
    }
    while (any_small && j > i + 1 && !same_shape(&t->nodes[j - 1].out, S)) j--;   /* end on the group's shape */
    if (any_small) {
        /* each small producer's value is read only inside [i, j) */
        for (int k = i; k < j; k++) {
            if (same_shape(&t->nodes[k].out, S)) continue;
            int in_group = 0;
            for (int q = k + 1; q < j; q++)
                for (int r = 0; r < t->nodes[q].n_in; r++) in_group += t->nodes[q].in[r] == nin + k;
            if (in_group != cx->uses[nin + k]) return -1;
        }
    }
    if (j < nn && reduce_fusable(t, &t->nodes[j], nin + j - 1, cx->uses)) j++;
    return j;
}

static int group_vm(compile_ctx *cx, int i)
{
    int j = group_vm_run(cx, i, true);
    return j > i ? j : group_vm_run(cx, i, false);
}

static bool pass_group_nodes(compile_ctx *cx)
{
    const ctpu_trace *t = cx->t;
    int nin = cx->nin, nn = cx->nn;
    cx->uses = al_alloc(&cx->al, sizeof(int32_t) * (size_t)(cx->nv + 1));
    cx->epi = al_alloc(&cx->al, sizeof(int32_t) * EPI_N * (size_t)(nn + 1));
    cx->group = al_alloc(&cx->al, sizeof(int32_t) * (size_t)(nn + 1));
    cx->used_outside = al_alloc(&cx->al, (size_t)(nn + 1));
    cx->row_group = al_alloc(&cx->al, (size_t)(nn + 1));
    cx->loss_group = al_alloc(&cx->al, (size_t)(nn + 1));
    if (!cx->uses || !cx->epi || !cx->group || !cx->used_outside || !cx->row_group || !cx->loss_group)
        return oom(cx);
    for (int i = 0; i < nn; i++)
        for (int k = 0; k < t->nodes[i].n_in; k++) cx->uses[t->nodes[i].in[k]]++;
    for (int j = 0; j < cx->no; j++) cx->uses[t->outputs[j]] += 2;   /* an output is never internal */

    for (int i = 0; i < nn;) {
        const ctpu_node *n = &t->nodes[i];
        const ctpu_vtype *it[CTPU_NODE_MAX_IN];
        for (int k = 0; k < n->n_in; k++) it[k] = type_of(t, n->in[k]);
        int j = i + 1;
        for (int q = 0; q < EPI_N; q++) cx->epi[EPI_N * i + q] = -1;
        int jl = t->debug_checks ? -1 : ctpu_loss_match(t, i, cx->uses);
        if (jl > 0) {
            j = jl;
            cx->loss_group[cx->n_groups] = true;
        } else if (ctpu_op_fusion(n->op) == CTPU_FUSE_MXU && n->out.ndim >= 2 && n->out.dtype == CTPU_KDT_F32 && !t->debug_checks)
            j = group_matmul(cx, i);
        else if (!t->debug_checks) {
            /* a row group when it takes more nodes than the VM group (or the node alone) would */
            int jv = ctpu_vm_fusable(n, it) ? group_vm(cx, i) : i + 1;
            ctpu_row_scan_info rs;
            ctpu_row_scan(t, i, cx->uses, &rs);
            if (rs.n_rowops > 0 && rs.end > jv) {
                j = rs.end;
                cx->row_group[cx->n_groups] = true;
            } else {
                j = jv;
            }
        }
        for (int k = i; k < j; k++) cx->group[k] = cx->n_groups;
        cx->n_groups++;
        i = j;
    }
    /* values used outside their group (or by a later step) need memory */
    for (int i = 0; i < nn; i++) {
        const ctpu_node *n = &t->nodes[i];
        for (int k = 0; k < n->n_in; k++) {
            int32_t v = n->in[k];
            if (v >= nin && cx->group[v - nin] != cx->group[i]) cx->used_outside[v - nin] = true;
        }
    }
    for (int j = 0; j < cx->no; j++)
        if (t->outputs[j] >= nin) cx->used_outside[t->outputs[j] - nin] = true;
    return true;
}

/* ------------------------------------------------------------ plan buffers */
/* Bound slots: inputs, then outputs; each node's first runtime scalar. */
static bool bind_slots(compile_ctx *cx)
{
    const ctpu_trace *t = cx->t;
    cx->slot_of = al_alloc(&cx->al, sizeof(int32_t) * (size_t)(cx->nv + 1));
    cx->scal_base = al_alloc(&cx->al, sizeof(int32_t) * (size_t)(cx->nn + 1));
    if (!cx->slot_of || !cx->scal_base) return oom(cx);
    for (int v = 0; v < cx->nv; v++) cx->slot_of[v] = v < cx->nin ? v : -1;
    for (int j = 0; j < cx->no; j++) cx->slot_of[t->outputs[j]] = cx->nin + j;
    for (int i = 0, s = 0; i < cx->nn; i++) { cx->scal_base[i] = s; s += t->nodes[i].n_scalars; }
    return true;
}

/* One step per group, in node order: the step defining each value and the
 * last step reading it from memory. */
static bool order_steps(compile_ctx *cx)
{
    const ctpu_trace *t = cx->t;
    int nin = cx->nin, nn = cx->nn;
    cx->last_use = al_alloc(&cx->al, sizeof(int32_t) * (size_t)(cx->nv + 1));
    cx->def_step = al_alloc(&cx->al, sizeof(int32_t) * (size_t)(cx->nv + 1));
    cx->group_step = al_alloc(&cx->al, sizeof(int32_t) * (size_t)(cx->n_groups + 1));
    if (!cx->last_use || !cx->def_step || !cx->group_step) return oom(cx);
    for (int v = 0; v < cx->nv; v++) { cx->last_use[v] = -1; cx->def_step[v] = -1; }
    for (int i = 0; i < nn;) {
        int j = i;
        while (j < nn && cx->group[j] == cx->group[i]) j++;
        cx->group_step[cx->group[i]] = cx->n_steps;
        for (int k = i; k < j; k++) {
            cx->def_step[nin + k] = cx->n_steps;
            for (int q = 0; q < t->nodes[k].n_in; q++) {
                int32_t v = t->nodes[k].in[q];
                if (v < nin || cx->group[v - nin] != cx->group[k]) cx->last_use[v] = cx->n_steps;
            }
        }
        cx->n_steps++;
        i = j;
    }
    return true;
}

/* The byte offset at which node value v (a reshape, or a slice of
 * contiguous elements: step 1 along a dim with only 1s before it) reads its
 * input's memory; -1 when it is neither. */
static int64_t view_offset(const compile_ctx *cx, int v)
{
    const ctpu_node *n = &cx->t->nodes[v - cx->nin];
    if (n->op == CTPU_OP_RESHAPE) return 0;
    if (n->op != CTPU_OP_SLICE) return -1;
    const ctpu_vtype *x = type_of(cx->t, n->in[0]);
    int dim = n->attr.dims[0];
    if (n->attr.i64[2] != 1 && n->out.shape[dim] > 1) return -1;
    int64_t inner = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (d < dim && x->shape[d] != 1) return -1;
        if (d > dim) inner *= x->shape[d];
    }
    return n->attr.i64[0] * inner * (int64_t)ctpu_kdt_size(x->dtype);
}

/* Views: a reshape or contiguous slice that is a step of its own, of a
 * scratch value, itself in scratch (not a program input or output), at a
 * 64-byte aligned offset, is that value's memory (the step does nothing);
 * the viewed value (the root of a chain of views) then lives until the
 * last read of any of its views. The same bytes either way: a copy of
 * them is what the step did before. */
static bool plan_views(compile_ctx *cx)
{
    int nin = cx->nin, nn = cx->nn;
    cx->view_of = al_alloc(&cx->al, sizeof(int32_t) * (size_t)(cx->nv + 1));
    cx->view_off = al_alloc(&cx->al, sizeof(size_t) * (size_t)(cx->nv + 1));
    if (!cx->view_of || !cx->view_off) return oom(cx);
    for (int v = 0; v < cx->nv; v++) { cx->view_of[v] = -1; cx->view_off[v] = 0; }
    for (int i = 0; i < nn; i++) {
        int v = nin + i;
        bool alone = (i == 0 || cx->group[i - 1] != cx->group[i]) && (i + 1 == nn || cx->group[i + 1] != cx->group[i]);
        if (!alone || cx->slot_of[v] >= 0 || !cx->used_outside[i] || cx->t->debug_checks) continue;
        int32_t u = cx->t->nodes[i].in[0];
        if (u < nin || cx->slot_of[u] >= 0 || !cx->used_outside[u - nin]) continue;
        int64_t off = view_offset(cx, v);
        if (off < 0 || off % 64) continue;
        int32_t root = cx->view_of[u] >= 0 ? cx->view_of[u] : u;
        cx->view_of[v] = root;
        cx->view_off[v] = cx->view_off[u] + (size_t)off;
        if (cx->last_use[v] > cx->last_use[root]) cx->last_use[root] = cx->last_use[v];
    }
    return true;
}

/* Values needing memory that are not bound get scratch offsets; an offset
 * is reused once the value there is dead (first fit). A view takes its
 * root's offset plus its own (roots are placed first). */
static bool plan_scratch(compile_ctx *cx)
{
    int nin = cx->nin, nv = cx->nv;
    for (int v = nin; v < nv; v++)
        if (cx->slot_of[v] < 0 && cx->used_outside[v - nin]) cx->n_virtual++;
    cx->virt_off = al_alloc(&cx->al, sizeof(size_t) * ((size_t)cx->n_virtual + 1));
    int32_t *vv = al_alloc(&cx->al, sizeof(int32_t) * ((size_t)cx->n_virtual + 1));
    size_t *vsize = al_alloc(&cx->al, sizeof(size_t) * ((size_t)cx->n_virtual + 1));
    if (!cx->virt_off || !vv || !vsize) return oom(cx);
    int k = 0;
    for (int v = nin; v < nv; v++) {
        if (cx->slot_of[v] >= 0 || !cx->used_outside[v - nin] || cx->view_of[v] >= 0) continue;
        const ctpu_vtype *ty = type_of(cx->t, v);
        size_t sz = ((size_t)ctpu_vtype_numel(ty) * ctpu_kdt_size(ty->dtype) + 63) & ~(size_t)63;
        /* first fit among offsets of values dead before this one is defined */
        size_t off = 0;
        bool moved = true;
        while (moved) {
            moved = false;
            for (int q = 0; q < k; q++) {
                /* a value read at or after v's defining step is still alive */
                if (cx->last_use[vv[q]] < cx->def_step[v]) continue;
                if (off < cx->virt_off[q] + vsize[q] && cx->virt_off[q] < off + sz) {
                    off = cx->virt_off[q] + vsize[q];
                    moved = true;
                }
            }
        }
        vv[k] = v;
        vsize[k] = sz;
        cx->virt_off[k] = off;
        cx->slot_of[v] = cx->nin + cx->no + 1 + k;    /* after the scratch buffer's own slot */
        if (off + sz > cx->scratch) cx->scratch = off + sz;
        k++;
    }
    for (int v = nin; v < nv; v++) {
        if (cx->view_of[v] < 0) continue;
        int32_t rk = cx->slot_of[cx->view_of[v]] - (cx->nin + cx->no + 1);
        cx->virt_off[k] = cx->virt_off[rk] + cx->view_off[v];
        cx->slot_of[v] = cx->nin + cx->no + 1 + k;
        k++;
    }
    return true;
}

/* Shared packed operands: matmul steps that read the same value as the
 * same operand in the same packed layout (the q, k and v projections of one
 * normed input; their weight gradients' transposed input) share its packed
 * panels: the first packs them into a scratch slot of their own as it would
 * into its workspace, the others skip packing (kernels.h ctpu_k_prepack; the
 * plan, made here for the micro-kernel in use, is checked again by each call
 * at run time). Operands whose panels take 128 KiB to 8 MiB: below, packing
 * is cheap and stays in cache while the panels would still add memory. */
#define PACK_LINK_USERS 8
typedef struct pack_link {
    int32_t value, slot;
    int n, user[PACK_LINK_USERS];   /* matmul nodes, in step order: user[0] packs */
    ctpu_k_prepack pp;
} pack_link;

/* Matmul node k's plan for its operand `role`, or false. */
static bool pack_plan_of(const compile_ctx *cx, int k, int role, ctpu_k_prepack *pp)
{
    const ctpu_node *c = &cx->t->nodes[k];
    if (c->op != CTPU_OP_MATMUL || (k > 0 && cx->group[k - 1] == cx->group[k]) || cx->row_group[cx->group[k]] ||
        cx->loss_group[cx->group[k]])
        return false;
    ctpu_mm_args g;
    int64_t ast[8], bst[8];
    if (!ctpu_exec_matmul_args(c, type_of(cx->t, c->in[0]), type_of(cx->t, c->in[1]), &g, ast, bst)) return false;
    memset(pp, 0, sizeof *pp);
    *pp = (ctpu_k_prepack){ .role = role, .dt = role ? g.b_dtype : g.a_dtype, .si = role ? g.b_cs : g.a_rs,
                            .sk = role ? g.b_rs : g.a_cs, .I = role ? g.N : g.M, .K = g.K,
                            .bs = role ? g.b_bs : g.a_bs };
    pp->nb = pp->bs == 0 ? 1 : g.batch;
    if (pp->nb == 1) pp->bs = 0;
    return ctpu_k_mm_prepack_plan(&g, pp) && pp->bytes >= ((size_t)128 << 10) && pp->bytes <= ((size_t)8 << 20);
}

static bool plan_packs(compile_ctx *cx)
{
    int nn = cx->nn, n = 0;
    if (cx->t->debug_checks) return true;
    pack_link *l = al_alloc(&cx->al, sizeof(pack_link) * 2 * ((size_t)nn + 1));
    if (!l) return oom(cx);
    for (int k = 0; k < nn; k++)
        for (int role = 0; role < 2; role++) {
            ctpu_k_prepack pp;
            if (!pack_plan_of(cx, k, role, &pp)) continue;
            int32_t v = cx->t->nodes[k].in[role];
            int q = 0;
            while (q < n && !(l[q].value == v && memcmp(&l[q].pp, &pp, sizeof pp) == 0)) q++;
            if (q == n) l[n++] = (pack_link){ .value = v, .pp = pp };
            if (l[q].n < PACK_LINK_USERS) l[q].user[l[q].n++] = k;
        }
    int m = 0;
    for (int q = 0; q < n; q++)
        if (l[q].n >= 2) l[m++] = l[q];
    if (m == 0) return true;
    /* each link's panels: a scratch slot of its own, first fit among the
     * values' and earlier links' memory not alive from its first user's
     * step to its last's */
    size_t *off = al_alloc(&cx->al, sizeof(size_t) * ((size_t)(cx->n_virtual + m) + 1));
    int32_t *it = al_alloc(&cx->al, sizeof(int32_t) * 3 * ((size_t)(cx->nv + m) + 1));   /* first, last step, slot */
    if (!off || !it) return oom(cx);
    if (cx->n_virtual) memcpy(off, cx->virt_off, sizeof(size_t) * (size_t)cx->n_virtual);
    int base = cx->nin + cx->no + 1, ni = 0;
    size_t *isz = al_alloc(&cx->al, sizeof(size_t) * ((size_t)(cx->nv + m) + 1));
    if (!isz) return oom(cx);
    for (int v = cx->nin; v < cx->nv; v++) {
        if (cx->slot_of[v] < base || cx->view_of[v] >= 0) continue;
        const ctpu_vtype *ty = type_of(cx->t, v);
        it[3 * ni] = cx->def_step[v];
        it[3 * ni + 1] = cx->last_use[v] > cx->def_step[v] ? cx->last_use[v] : cx->def_step[v];
        it[3 * ni + 2] = cx->slot_of[v] - base;
        isz[ni++] = ((size_t)ctpu_vtype_numel(ty) * ctpu_kdt_size(ty->dtype) + 63) & ~(size_t)63;
    }
    for (int q = 0; q < m; q++) {
        int32_t d = cx->group_step[cx->group[l[q].user[0]]], e = cx->group_step[cx->group[l[q].user[l[q].n - 1]]];
        size_t sz = (l[q].pp.bytes + 63) & ~(size_t)63, o = 0;
        for (bool moved = true; moved;) {
            moved = false;
            for (int k = 0; k < ni; k++) {
                size_t ko = off[it[3 * k + 2]];
                if (it[3 * k + 1] < d || e < it[3 * k] || o >= ko + isz[k] || ko >= o + sz) continue;
                o = ko + isz[k];
                moved = true;
            }
        }
        off[cx->n_virtual] = o;
        l[q].slot = base + cx->n_virtual;
        it[3 * ni] = d;
        it[3 * ni + 1] = e;
        it[3 * ni + 2] = cx->n_virtual++;
        isz[ni++] = sz;
        if (o + sz > cx->scratch) cx->scratch = o + sz;
    }
    cx->virt_off = off;
    cx->links = l;
    cx->n_links = m;
    return true;
}

/* Matmul node i's shared panels into its step data. */
static void attach_packs(const compile_ctx *cx, int i, ctpu_step_data *sd)
{
    for (int q = 0; q < cx->n_links; q++) {
        const pack_link *l = &cx->links[q];
        for (int u = 0; u < l->n; u++)
            if (l->user[u] == i) {
                sd->pre[l->pp.role] = &l->pp;
                sd->pre_slot[l->pp.role] = l->slot;
                sd->pre_keep[l->pp.role] = u == 0;
            }
    }
}

static bool pass_plan_buffers(compile_ctx *cx)
{
    return order_steps(cx) && plan_views(cx) && plan_scratch(cx) && plan_packs(cx);
}

/* ------------------------------------------------------------ emit steps */
/* Step data of one node: its input types and slots. */
static ctpu_step_data *node_data(compile_ctx *cx, int i)
{
    const ctpu_node *nd = &cx->t->nodes[i];
    ctpu_step_data *sd = al_alloc(&cx->al, sizeof *sd);
    if (!sd) return NULL;
    sd->node = *nd;
    for (int q = 0; q < nd->n_in; q++) {
        sd->in[q] = *type_of(cx->t, nd->in[q]);
        sd->in_slot[q] = cx->slot_of[nd->in[q]];
    }
    sd->scalar_base = cx->scal_base[i];
    sd->epi_bias_slot = sd->epi_res_slot = sd->epi_scale = -1;
    return sd;
}

/* The matmul at node i with its epilogue nodes (i, j). */
static bool emit_matmul(compile_ctx *cx, int i, int j, ctpu_step *step)
{
    const int32_t *epi = cx->epi + EPI_N * i, *slot_of = cx->slot_of;
    ctpu_step_data *sd = node_data(cx, i);
    if (!sd) return oom(cx);
    sd->out_slot = slot_of[cx->nin + j - 1];          /* the chain's last value */
    sd->epi_bias_slot = epi[0] >= 0 ? slot_of[epi[0]] : -1;
    sd->epi_act = (uint8_t)(epi[1] >= 0 ? epi[1] : CTPU_K_ACT_NONE);
    sd->epi_res_slot = epi[2] >= 0 ? slot_of[epi[2]] : -1;
    sd->epi_scale = epi[3] >= 0 ? cx->scal_base[epi[3]] : -1;
    sd->epi_softmax = epi[4] >= 0;
    attach_packs(cx, i, sd);
    if (sd->out_slot < 0 || sd->in_slot[0] < 0 || sd->in_slot[1] < 0 || (epi[0] >= 0 && sd->epi_bias_slot < 0) ||
        (epi[2] >= 0 && sd->epi_res_slot < 0)) {
        snprintf(cx->err, cx->errlen, "compile: matmul epilogue at node %d cannot be bound", i);
        return false;
    }
    *step = (ctpu_step){ ctpu_exec_fn_for(sd->node.op), sd };
    return true;
}

/* Producers [i, j-1) fused into the reduction at node j-1. */
static bool emit_reduce_group(compile_ctx *cx, int i, int j, ctpu_step *step)
{
    int nin = cx->nin;
    int32_t *slot_of = cx->slot_of;
    const ctpu_node *rn = &cx->t->nodes[j - 1];
    ctpu_vm_red_prog *rp = al_alloc(&cx->al, sizeof *rp);
    int idx[CTPU_VM_MAX_NODES];
    bool store[CTPU_VM_MAX_NODES];
    if (!rp) return oom(cx);
    int32_t red_slot = nin + cx->no + 1 + cx->n_virtual;   /* no buffer has it */
    int32_t keep = slot_of[nin + j - 2];
    slot_of[nin + j - 2] = red_slot;
    for (int k = i; k < j - 1; k++) { idx[k - i] = k; store[k - i] = cx->used_outside[k] || k == j - 2; }
    int bad = ctpu_vm_build(&rp->vm, cx->t, idx, j - 1 - i, slot_of, store, cx->scal_base);
    slot_of[nin + j - 2] = keep;
    const ctpu_vtype *xt = &cx->t->nodes[j - 2].out;
    int64_t n = 1, inner = 1;
    red_layout(rn, xt, &n, &inner);
    rp->op = (ctpu_k_red_op)ctpu_op_infos[rn->op].kop;
    rp->mean = ctpu_op_fusion(rn->op) == CTPU_FUSE_REDUCE_MEAN;
    rp->n = n;
    rp->inner = inner;
    rp->outer = ctpu_vtype_numel(xt) / (n * inner);
    rp->red_slot = red_slot;
    rp->out_slot = slot_of[nin + j - 1];
    rp->out_dtype = rn->out.dtype;
    if (bad || rp->out_slot < 0) {
        snprintf(cx->err, cx->errlen, "compile: reduction fusion at node %d cannot be built", j - 1);
        return false;
    }
    *step = (ctpu_step){ ctpu_vm_red_exec, rp };
    return true;
}

/* Nodes [i, j) as one row-group step (rows.c). */
static bool emit_row_group(compile_ctx *cx, int i, int j, ctpu_step *step)
{
    ctpu_row_prog *rp = al_alloc(&cx->al, sizeof *rp);
    ctpu_row_scan_info rs;
    if (!rp) return oom(cx);
    ctpu_row_scan(cx->t, i, cx->uses, &rs);
    if (rs.end != j || ctpu_row_build(rp, cx->t, i, &rs, cx->slot_of, cx->used_outside + i, cx->scal_base) != 0) {
        snprintf(cx->err, cx->errlen, "compile: row group at node %d cannot be built", i);
        return false;
    }
    *step = (ctpu_step){ ctpu_row_exec, rp };
    return true;
}

/* Large outputs of the program that no later step reads: non-temporal
 * stores (vm.h CTPU_VM_STREAM). */
static void mark_streams(const compile_ctx *cx, ctpu_vm_prog *vp)
{
    if (vp->numel * 4 < CTPU_VM_STREAM_BYTES) return;
    for (int q = 0; q < vp->n_ins; q++) {
        ctpu_vm_ins *in = &vp->ins[q];
        if (!(in->flags & CTPU_VM_DIRECT) || in->scalar2 < cx->nin || in->scalar2 >= cx->nin + cx->no) continue;
        int32_t v = cx->t->outputs[in->scalar2 - cx->nin];
        if (v >= cx->nin && cx->last_use[v] < 0) in->flags |= CTPU_VM_STREAM;
    }
}

/* Nodes [i, j) as one loss step (loss.c). */
static bool emit_loss(compile_ctx *cx, int i, int j, ctpu_step *step)
{
    ctpu_loss_prog *lp = al_alloc(&cx->al, sizeof *lp);
    if (!lp) return oom(cx);
    if (ctpu_loss_build(lp, cx->t, i, j, cx->uses, cx->slot_of, cx->used_outside, cx->scal_base) != 0) {
        snprintf(cx->err, cx->errlen, "compile: loss step at node %d cannot be built", i);
        return false;
    }
    *step = (ctpu_step){ ctpu_loss_exec, lp };
    return true;
}

/* Nodes [i, j) as one block-VM step. */
static bool emit_vm_group(compile_ctx *cx, int i, int j, ctpu_step *step)
{
    ctpu_vm_prog *vp = al_alloc(&cx->al, sizeof *vp);
    int idx[CTPU_VM_MAX_NODES];
    bool store[CTPU_VM_MAX_NODES];
    if (!vp) return oom(cx);
    for (int k = i; k < j; k++) { idx[k - i] = k; store[k - i] = cx->used_outside[k]; }
    if (ctpu_vm_build(vp, cx->t, idx, j - i, cx->slot_of, store, cx->scal_base) != 0) {
        snprintf(cx->err, cx->errlen, "compile: fusion group at node %d does not fit the VM", i);
        return false;
    }
    mark_streams(cx, vp);
    *step = (ctpu_step){ ctpu_vm_exec, vp };
    return true;
}

/* Node i alone: its op's kernel entry. */
/* A view's step: its value is already there (plan_views). */
static void exec_view(const void *data, ctpu_exec_ctx *ctx)
{
    (void)data;
    (void)ctx;
}

static bool emit_node(compile_ctx *cx, int i, ctpu_step *step)
{
    const ctpu_node *nd = &cx->t->nodes[i];
    ctpu_step_data *sd = node_data(cx, i);
    if (!sd) return oom(cx);
    sd->out_slot = cx->slot_of[cx->nin + i];
    ctpu_dev_step_fn fn = cx->view_of[cx->nin + i] >= 0 ? exec_view : ctpu_exec_fn_for(nd->op);
    if (nd->op == CTPU_OP_MATMUL) attach_packs(cx, i, sd);
    bool bad = fn == NULL || sd->out_slot < 0;
    for (int q = 0; q < nd->n_in; q++) bad |= sd->in_slot[q] < 0;
    if (bad) {
        snprintf(cx->err, cx->errlen, "compile: node %d (%s) cannot be bound to a program", i, ctpu_op_name(nd->op));
        return false;
    }
    *step = (ctpu_step){ fn, sd };
    return true;
}

static bool pass_emit_steps(compile_ctx *cx)
{
    const ctpu_trace *t = cx->t;
    int nn = cx->nn;
    cx->steps = al_alloc(&cx->al, sizeof(ctpu_step) * (size_t)(nn + 1));
    if (!cx->steps) return oom(cx);
    for (int i = 0, s = 0; i < nn; s++) {
        int j = i;
        while (j < nn && cx->group[j] == cx->group[i]) j++;
        bool ok;
        if (cx->row_group[cx->group[i]]) ok = emit_row_group(cx, i, j, &cx->steps[s]);
        else if (cx->loss_group[cx->group[i]]) ok = emit_loss(cx, i, j, &cx->steps[s]);
        else if (j - i >= 2 && ctpu_op_fusion(t->nodes[i].op) == CTPU_FUSE_MXU) ok = emit_matmul(cx, i, j, &cx->steps[s]);
        else if (j - i >= 2 && ctpu_op_is(t->nodes[j - 1].op, CTPU_OPK_REDUCTION))
            ok = emit_reduce_group(cx, i, j, &cx->steps[s]);
        else if (j - i >= 2) ok = emit_vm_group(cx, i, j, &cx->steps[s]);
        else ok = emit_node(cx, i, &cx->steps[s]);
        if (!ok) return false;
        i = j;
    }
    return true;
}

/* ------------------------------------------------------------ fault deps */
/* Per output, the inputs and steps it depends on: a fault poisons only the
 * outputs computed from it (multi-node programs; skipped past ~8 MiB of
 * dependency words: then every output takes any fault). A step depends on
 * its own fault through every node of its group, but a loss step (loss.c)
 * only through its gathers, which are what can fault in it. */
static bool pass_fault_deps(compile_ctx *cx)
{
    const ctpu_trace *t = cx->t;
    int nin = cx->nin, nn = cx->nn, no = cx->no;
    int wi = (nin + 63) / 64 + 1, ws = (cx->n_steps + 63) / 64 + 1;
    size_t w = (size_t)(wi + ws);
    cx->wi = wi;
    cx->ws = ws;
    if (nn <= 1 || (size_t)cx->nv * w > ((size_t)1 << 20)) return true;
    uint64_t *dep = calloc((size_t)cx->nv * w, sizeof(uint64_t));
    cx->odi = al_alloc(&cx->al, sizeof(uint64_t) * (size_t)wi * ((size_t)no + 1));
    cx->ods = al_alloc(&cx->al, sizeof(uint64_t) * (size_t)ws * ((size_t)no + 1));
    if (!dep || !cx->odi || !cx->ods) {
        free(dep);
        return oom(cx);
    }
    for (int v = 0; v < nin; v++) dep[(size_t)v * w + (size_t)(v >> 6)] |= 1ull << (v & 63);
    for (int k = 0; k < nn; k++) {
        uint64_t *d = dep + (size_t)(nin + k) * w;
        for (int q = 0; q < t->nodes[k].n_in; q++) {
            const uint64_t *e = dep + (size_t)t->nodes[k].in[q] * w;
            for (size_t x = 0; x < w; x++) d[x] |= e[x];
        }
        /* a loss step's faults are its gathers' (a label out of range): only
         * what is computed from one takes it, as in strict eager (its out of
         * memory poisons every output: device.c) */
        int st = cx->group_step[cx->group[k]];
        if (!cx->loss_group[cx->group[k]] || ctpu_op_can_fault(t->nodes[k].op)) d[wi + (st >> 6)] |= 1ull << (st & 63);
    }
    for (int j = 0; j < no; j++) {
        const uint64_t *d = dep + (size_t)t->outputs[j] * w;
        memcpy(cx->odi + (size_t)j * (size_t)wi, d, sizeof(uint64_t) * (size_t)wi);
        memcpy(cx->ods + (size_t)j * (size_t)ws, d + wi, sizeof(uint64_t) * (size_t)ws);
    }
    free(dep);
    return true;
}

/* ------------------------------------------------------------ debug tables */
/* Does node n define NaN from inputs without NaN or Inf? An empty input
 * (mean over an empty dim is 0/0), var with n <= correction (torch). */
static bool nan_defined(const ctpu_trace *t, const ctpu_node *n)
{
    for (int j = 0; j < n->n_in; j++)
        if (ctpu_vtype_numel(type_of(t, n->in[j])) == 0) return true;
    if (n->op == CTPU_OP_VAR) {
        int64_t on = ctpu_vtype_numel(&n->out), in = ctpu_vtype_numel(type_of(t, n->in[0]));
        return on > 0 && in / on <= n->attr.i64[0];
    }
    return false;
}

/* Per output: dtype, element count and the op that made it (the NaN scan of
 * debug checks); per step, with debug checks on (one node per step), the
 * value to scan right after it runs. */
static bool pass_debug_tables(compile_ctx *cx)
{
    const ctpu_trace *t = cx->t;
    int nin = cx->nin, nn = cx->nn, no = cx->no, ns = cx->n_steps;
    cx->out_dtype = al_alloc(&cx->al, (size_t)no + 1);
    cx->out_numel = al_alloc(&cx->al, sizeof(int64_t) * ((size_t)no + 1));
    cx->out_op = al_alloc(&cx->al, sizeof(char *) * ((size_t)no + 1));
    if (!cx->out_dtype || !cx->out_numel || !cx->out_op) return oom(cx);
    for (int j = 0; j < no; j++) {
        const ctpu_vtype *vt = type_of(t, t->outputs[j]);
        cx->out_dtype[j] = vt->dtype;
        cx->out_numel[j] = ctpu_vtype_numel(vt);
        cx->out_op[j] = t->outputs[j] >= nin ? ctpu_op_name(t->nodes[t->outputs[j] - nin].op) : "input";
    }
    cx->in_dtype = al_alloc(&cx->al, (size_t)nin + 1);
    cx->in_numel = al_alloc(&cx->al, sizeof(int64_t) * ((size_t)nin + 1));
    cx->out_nan_ok = al_alloc(&cx->al, (size_t)no + 1);
    cx->step_node = al_alloc(&cx->al, sizeof(int32_t) * ((size_t)ns + 1));
    if (!cx->in_dtype || !cx->in_numel || !cx->out_nan_ok || !cx->step_node) return oom(cx);
    for (int i = 0; i < nin; i++) {
        cx->in_dtype[i] = t->in_type[i].dtype;
        cx->in_numel[i] = ctpu_vtype_numel(&t->in_type[i]);
    }
    for (int j = 0; j < no; j++)
        cx->out_nan_ok[j] = t->outputs[j] >= nin && nan_defined(t, &t->nodes[t->outputs[j] - nin]);
    for (int st = 0; st < ns; st++) cx->step_node[st] = 0;
    /* the group's last node names its step, unless the group holds a node
     * that can fault (a loss step's gather): a fault is that node's, with its op
     * number and label */
    for (int k = 0; k < nn; k++) {
        int32_t *sn = &cx->step_node[cx->group_step[cx->group[k]]];
        if (!ctpu_op_can_fault(t->nodes[*sn].op) || cx->group[*sn] != cx->group[k]) *sn = k;
    }
    if (!t->debug_checks || nn <= 1) return true;
    int n_reads = 0;
    for (int k = 0; k < nn; k++) n_reads += t->nodes[k].n_in;
    cx->so_slot = al_alloc(&cx->al, sizeof(int32_t) * ((size_t)ns + 1));
    cx->so_dt = al_alloc(&cx->al, (size_t)ns + 1);
    cx->so_n = al_alloc(&cx->al, sizeof(int64_t) * ((size_t)ns + 1));
    cx->so_op = al_alloc(&cx->al, sizeof(char *) * ((size_t)ns + 1));
    cx->so_nan_ok = al_alloc(&cx->al, (size_t)ns + 1);
    cx->si_off = al_alloc(&cx->al, sizeof(int32_t) * ((size_t)ns + 2));
    cx->si_slot = al_alloc(&cx->al, sizeof(int32_t) * ((size_t)n_reads + 1));
    cx->si_dt = al_alloc(&cx->al, (size_t)n_reads + 1);
    cx->si_n = al_alloc(&cx->al, sizeof(int64_t) * ((size_t)n_reads + 1));
    if (!cx->so_slot || !cx->so_dt || !cx->so_n || !cx->so_op || !cx->so_nan_ok || !cx->si_off || !cx->si_slot ||
        !cx->si_dt || !cx->si_n)
        return oom(cx);
    for (int st = 0; st < ns; st++) { cx->so_slot[st] = -1; cx->so_nan_ok[st] = 0; }
    for (int k = 0; k < nn; k++) {
        int st = cx->group_step[cx->group[k]];   /* the group's last node names the step */
        cx->so_slot[st] = cx->slot_of[nin + k];
        cx->so_dt[st] = t->nodes[k].out.dtype;
        cx->so_n[st] = ctpu_vtype_numel(&t->nodes[k].out);
        cx->so_op[st] = ctpu_op_name(t->nodes[k].op);
        cx->so_nan_ok[st] = nan_defined(t, &t->nodes[k]);
    }
    /* each step's reads (with debug checks a node is a step of its own):
     * counted, then placed */
    memset(cx->si_off, 0, sizeof(int32_t) * ((size_t)ns + 2));
    for (int k = 0; k < nn; k++)
        for (int j = 0; j < t->nodes[k].n_in; j++)
            if (cx->slot_of[t->nodes[k].in[j]] >= 0) cx->si_off[cx->group_step[cx->group[k]] + 1]++;
    for (int st = 0; st < ns; st++) cx->si_off[st + 1] += cx->si_off[st];
    int32_t *fill = al_alloc(&cx->al, sizeof(int32_t) * ((size_t)ns + 1));
    if (!fill) return oom(cx);
    memcpy(fill, cx->si_off, sizeof(int32_t) * (size_t)ns);
    for (int k = 0; k < nn; k++)
        for (int j = 0; j < t->nodes[k].n_in; j++) {
            int32_t v = t->nodes[k].in[j];
            if (cx->slot_of[v] < 0) continue;
            int q = fill[cx->group_step[cx->group[k]]]++;
            cx->si_slot[q] = cx->slot_of[v];
            cx->si_dt[q] = type_of(t, v)->dtype;
            cx->si_n[q] = ctpu_vtype_numel(type_of(t, v));
        }
    return true;
}

/* ------------------------------------------------------------ estimate cost */
/* The program's estimate on every chip profile: each node's compute, the
 * traffic of the program's boundary (inputs read, outputs written; the
 * values inside stay on chip). */
static bool pass_estimate_cost(compile_ctx *cx, ctpu_cost_program *cost)
{
    const ctpu_trace *t = cx->t;
    int n_chips;
    const ctpu_chip_info *chips = ctpu_chip_profiles(&n_chips);
    int n_ops = ctpu_cost_distinct_ops(t->nodes, cx->nn);
    ctpu_cost_op *ops = al_alloc(&cx->al, sizeof(ctpu_cost_op) * (size_t)(n_ops + 1));
    if (!ops) return oom(cx);
    ctpu_cost_program_of(cost, chips, n_chips, t->nodes, cx->nn, t->in_type, cx->nin, t->outputs, cx->no, ops);
    return true;
}

/* ------------------------------------------------------------ the compiler */
static void program_fill(const compile_ctx *cx, ctpu_program *c)
{
    const ctpu_trace *t = cx->t;
    c->mem = cx->al.p;
    c->n_mem = cx->al.n;
    c->prog = (ctpu_dev_program){
        .n_steps = cx->n_steps, .steps = cx->steps, .n_in = cx->nin, .n_out = cx->no,
        .name = cx->nn ? ctpu_op_name(t->nodes[0].op) : "empty",
        .out_dtype = cx->out_dtype, .out_numel = cx->out_numel, .out_op = cx->out_op,
        .n_virtual = cx->n_virtual, .virt_off = cx->virt_off,
        .scratch_slot = cx->nin + cx->no, .scratch_bytes = cx->n_virtual ? cx->scratch : 0,
        .dep_words_in = cx->wi, .dep_words_step = cx->ws, .out_dep_in = cx->odi, .out_dep_step = cx->ods,
        .step_out_slot = cx->so_slot, .step_out_dtype = cx->so_dt, .step_out_numel = cx->so_n,
        .step_op = cx->so_op,
        .step_in_off = cx->si_off, .step_in_slot = cx->si_slot, .step_in_dtype = cx->si_dt,
        .step_in_numel = cx->si_n, .step_nan_ok = cx->so_nan_ok,
        .in_dtype = cx->in_dtype, .in_numel = cx->in_numel, .out_nan_ok = cx->out_nan_ok,
        .n_scal_check = cx->nn == 1 && !ctpu_op_is(t->nodes[0].op, CTPU_OPK_RANDOM) ? t->nodes[0].n_scalars : 0,
    };
    c->step_node = cx->step_node;
}

/* A dynamic program's compile-time facts a bind reuses (fuse.h): the
 * fusion groups (with the arrays they point at, in the program's memory) and
 * the canonical trace's structure. */
typedef struct {
    uint64_t hash, tick;       /* tick: last use (0: the slot is empty) */
    uint8_t *key;              /* the launch's extents (dyn_extent_key) */
    size_t len;
    ctpu_program *bound;       /* one reference: the slot's */
} dyn_bound;

struct ctpu_dyn_info {
    compile_ctx cx;            /* the passes' results; cx.t and cx.al are not used */
    ctpu_trace t;              /* the canonical trace it was compiled from (its arrays in the program's memory) */
    pthread_mutex_t mu;        /* guards the bound launches */
    uint64_t tick;
    dyn_bound b[CTPU_DYN_BOUND_CAP];   /* bound launches kept for their extents, least recently used replaced */
};

static bool keep_dyn(compile_ctx *cx, ctpu_program *c)
{
    const ctpu_trace *t = cx->t;
    struct ctpu_dyn_info *d = al_alloc(&cx->al, sizeof *d);
    ctpu_vtype *in = al_alloc(&cx->al, sizeof(ctpu_vtype) * ((size_t)t->n_inputs + 1));
    ctpu_node *nodes = al_alloc(&cx->al, sizeof(ctpu_node) * ((size_t)t->n_nodes + 1));
    int32_t *outs = al_alloc(&cx->al, sizeof(int32_t) * ((size_t)t->n_outputs + 1));
    int32_t *alias = t->out_alias ? al_alloc(&cx->al, sizeof(int32_t) * ((size_t)t->n_outputs + 1)) : NULL;
    if (!d || !in || !nodes || !outs || (t->out_alias && !alias)) return oom(cx);
    memcpy(in, t->in_type, sizeof(ctpu_vtype) * (size_t)t->n_inputs);
    memcpy(nodes, t->nodes, sizeof(ctpu_node) * (size_t)t->n_nodes);
    memcpy(outs, t->outputs, sizeof(int32_t) * (size_t)t->n_outputs);
    if (alias) memcpy(alias, t->out_alias, sizeof(int32_t) * (size_t)t->n_outputs);
    d->t = *t;
    d->t.in_type = in;
    d->t.nodes = nodes;
    d->t.outputs = outs;
    d->t.out_alias = alias;
    d->cx = *cx;
    if (pthread_mutex_init(&d->mu, NULL) != 0) return oom(cx);
    c->dyn = d;
    return true;
}

const ctpu_trace *ctpu_program_dyn_trace(const ctpu_program *p) { return p->dyn ? &p->dyn->t : NULL; }

/* The last step of a compile: on failure free what the passes allocated,
 * else fill the program from the context and start its reference count. */
static ctpu_program *finish_program(compile_ctx *cx, ctpu_program *c, bool ok, uint64_t t0)
{
    if (!ok) {
        for (int i = 0; i < cx->al.n; i++) free(cx->al.p[i]);
        free(cx->al.p);
        return NULL;
    }
    program_fill(cx, c);
    atomic_init(&c->refs, 1);
    atomic_init(&c->last_seq, 0);
    c->compile_ns = ctpu_now_ns() - t0;
    return c;
}

static ctpu_program *compile_ex(const ctpu_trace *t, bool dynamic, char *err, size_t errlen)
{
    uint64_t t0 = ctpu_now_ns();
    compile_ctx cx = {
        .t = t, .nin = t->n_inputs, .nn = t->n_nodes, .no = t->n_outputs, .nv = t->n_inputs + t->n_nodes,
        .err = err, .errlen = errlen,
    };
    ctpu_program *c = al_alloc(&cx.al, sizeof *c);   /* mem[0]: freed last */
    bool ok = c ? true : oom(&cx);
    ok = ok && bind_slots(&cx);
    ok = ok && pass_group_nodes(&cx);
    ok = ok && pass_plan_buffers(&cx);
    ok = ok && pass_emit_steps(&cx);
    ok = ok && pass_fault_deps(&cx);
    ok = ok && pass_debug_tables(&cx);
    ok = ok && pass_estimate_cost(&cx, &c->cost);
    ok = ok && (!dynamic || keep_dyn(&cx, c));
    return finish_program(&cx, c, ok, t0);
}

ctpu_program *ctpu_fuse_compile(const ctpu_trace *t, char *err, size_t errlen)
{
    return compile_ex(t, false, err, errlen);
}

ctpu_program *ctpu_fuse_compile_dynamic(const ctpu_trace *t, char *err, size_t errlen)
{
    return compile_ex(t, true, err, errlen);
}

/* Do the fusion groups of bound trace cx->t (grouped afresh in cx) equal
 * the dynamic program's? */
static bool same_groups(const compile_ctx *cx, const compile_ctx *d)
{
    if (cx->n_groups != d->n_groups) return false;
    size_t nn = (size_t)cx->nn;
    return memcmp(cx->group, d->group, sizeof(int32_t) * nn) == 0 &&
           memcmp(cx->epi, d->epi, sizeof(int32_t) * EPI_N * nn) == 0 &&
           memcmp(cx->row_group, d->row_group, (size_t)cx->n_groups) == 0 &&
           memcmp(cx->loss_group, d->loss_group, (size_t)cx->n_groups) == 0 &&
           memcmp(cx->used_outside, d->used_outside, nn) == 0;
}

/* A bound launch's copy of its trace (fuse.h bound_trace): the inputs' and
 * nodes' types and attrs are the launch's; outputs and aliases are the
 * dynamic program's (it outlives its launches). */
static bool keep_bound_trace(compile_ctx *cx, ctpu_program *c)
{
    const ctpu_trace *t = cx->t;
    ctpu_trace *bt = al_alloc(&cx->al, sizeof *bt);
    ctpu_vtype *in = al_alloc(&cx->al, sizeof(ctpu_vtype) * ((size_t)t->n_inputs + 1));
    ctpu_node *nodes = al_alloc(&cx->al, sizeof(ctpu_node) * ((size_t)t->n_nodes + 1));
    if (!bt || !in || !nodes) return oom(cx);
    *bt = *t;
    if (t->n_inputs) memcpy(in, t->in_type, sizeof(ctpu_vtype) * (size_t)t->n_inputs);
    if (t->n_nodes) memcpy(nodes, t->nodes, sizeof(ctpu_node) * (size_t)t->n_nodes);
    bt->in_type = in;
    bt->nodes = nodes;
    c->bound_trace = bt;
    return true;
}

ctpu_program *ctpu_fuse_bind(const ctpu_program *p, const ctpu_trace *t, char *err, size_t errlen)
{
    uint64_t t0 = ctpu_now_ns();
    const compile_ctx *d = &p->dyn->cx;
    if (t->n_inputs != d->nin || t->n_nodes != d->nn || t->n_outputs != d->no) {
        snprintf(err, errlen, "bind: the trace does not have the dynamic program's structure");
        return NULL;
    }
    compile_ctx cx = {
        .t = t, .nin = t->n_inputs, .nn = t->n_nodes, .no = t->n_outputs, .nv = t->n_inputs + t->n_nodes,
        .err = err, .errlen = errlen,
    };
    ctpu_program *c = al_alloc(&cx.al, sizeof *c);   /* mem[0]: freed last */
    bool ok = c ? true : oom(&cx);
    ok = ok && bind_slots(&cx);
    ok = ok && pass_group_nodes(&cx);
    if (ok && !same_groups(&cx, d)) {
        snprintf(err, errlen, "the dynamic program's fusion groups do not hold at these extents");
        ok = false;
    }
    ok = ok && pass_plan_buffers(&cx);
    ok = ok && pass_emit_steps(&cx);
    if (ok) {   /* the fault dependencies are the program's (they do not depend on extents) */
        cx.wi = d->wi;
        cx.ws = d->ws;
        cx.odi = d->odi;
        cx.ods = d->ods;
    }
    ok = ok && pass_debug_tables(&cx);
    ok = ok && pass_estimate_cost(&cx, &c->cost);
    ok = ok && keep_bound_trace(&cx, c);
    return finish_program(&cx, c, ok, t0);
}

void ctpu_program_free(ctpu_program *c)
{
    if (!c) return;
    if (c->dyn) {   /* nobody holds its bound launches once nobody holds it (fuse.h) */
        for (int i = 0; i < CTPU_DYN_BOUND_CAP; i++) {
            free(c->dyn->b[i].key);
            ctpu_program_free(c->dyn->b[i].bound);
        }
        pthread_mutex_destroy(&c->dyn->mu);
    }
    void **m = c->mem;
    int n = c->n_mem;
    for (int i = n - 1; i >= 0; i--) free(m[i]);   /* c itself is m[0] */
    free(m);
}

/* What a bind depends on besides the program: every input's and node's
 * extents and every node's attrs (slice bounds), as one byte string (dtypes,
 * ranks and wiring are the program's). NULL on out of memory. */
static uint8_t *dyn_extent_key(const ctpu_trace *t, size_t *len)
{
    size_t n = 0;
    for (int k = 0; k < t->n_inputs; k++) n += sizeof(int64_t) * t->in_type[k].ndim;
    for (int k = 0; k < t->n_nodes; k++) n += sizeof(int64_t) * t->nodes[k].out.ndim + sizeof(ctpu_attrs);
    uint8_t *key = malloc(n + 1), *w = key;
    if (!key) return NULL;
    for (int k = 0; k < t->n_inputs; k++) {
        memcpy(w, t->in_type[k].shape, sizeof(int64_t) * t->in_type[k].ndim);
        w += sizeof(int64_t) * t->in_type[k].ndim;
    }
    for (int k = 0; k < t->n_nodes; k++) {
        memcpy(w, t->nodes[k].out.shape, sizeof(int64_t) * t->nodes[k].out.ndim);
        w += sizeof(int64_t) * t->nodes[k].out.ndim;
        memcpy(w, &t->nodes[k].attr, sizeof(ctpu_attrs));
        w += sizeof(ctpu_attrs);
    }
    *len = n;
    return key;
}

bool ctpu_fuse_bound_touch(ctpu_program *p, const ctpu_program *b)
{
    struct ctpu_dyn_info *d = p->dyn;
    if (!d) return false;
    bool kept = false;
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < CTPU_DYN_BOUND_CAP && !kept; i++)
        if (d->b[i].tick && d->b[i].bound == b) {
            d->b[i].tick = ++d->tick;
            kept = true;
        }
    pthread_mutex_unlock(&d->mu);
    return kept;
}

ctpu_program *ctpu_fuse_bind_cached(ctpu_program *p, const ctpu_trace *t, bool *reused, ctpu_program **evicted,
                                    char *err, size_t errlen)
{
    struct ctpu_dyn_info *d = p->dyn;
    *reused = false;
    *evicted = NULL;
    size_t len;
    uint8_t *key = dyn_extent_key(t, &len);
    if (!key) {
        snprintf(err, errlen, "out of host memory binding a dynamic program");
        return NULL;
    }
    uint64_t h = ctpu_key_hash(key, len);
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < CTPU_DYN_BOUND_CAP; i++) {
        dyn_bound *e = &d->b[i];
        if (!e->tick || e->hash != h || e->len != len || memcmp(e->key, key, len) != 0) continue;
        e->tick = ++d->tick;
        ctpu_program_retain(e->bound);
        ctpu_program *b = e->bound;
        pthread_mutex_unlock(&d->mu);
        free(key);
        *reused = true;
        return b;
    }
    pthread_mutex_unlock(&d->mu);
    ctpu_program *b = ctpu_fuse_bind(p, t, err, errlen);   /* outside the lock: another thread may bind too */
    if (!b) {
        free(key);
        return NULL;
    }
    ctpu_program_retain(b);                                 /* the slot's; the bind's is the caller's */
    pthread_mutex_lock(&d->mu);
    int v = 0;
    for (int i = 1; i < CTPU_DYN_BOUND_CAP; i++)
        if (d->b[i].tick < d->b[v].tick) v = i;
    dyn_bound old = d->b[v];
    d->b[v] = (dyn_bound){ .hash = h, .tick = ++d->tick, .key = key, .len = len, .bound = b };
    pthread_mutex_unlock(&d->mu);
    free(old.key);
    *evicted = old.bound;
    return b;
}
