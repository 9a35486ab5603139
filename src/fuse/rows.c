/* Row groups (vm.h): reductions over trailing dims and softmax fused with
 * their elementwise producers and consumers, run row by row.
 *
 * Bits: an elementwise node computes the same f32 kernel over the same
 * operands as alone (rounded to its dtype after each op, as the block VM
 * does); a reduction or softmax calls, on one row, the kernel the node alone
 * calls on all rows (ctpu_k_reduce, ctpu_k_sqdev, ctpu_k_softmax): their
 * order depends only on the row length (CONTRACTS.md "Reductions"), never on
 * how many rows a call covers or on threads, so a row alone gives the row's
 * bits. mean and var divide as exec.c's exec_mean and exec_var do. */
#include <stdlib.h>
#include <string.h>

#include "vm.h"

static const ctpu_vtype *vtype(const ctpu_trace *t, int32_t v)
{
    return v < t->n_inputs ? &t->in_type[v] : &t->nodes[v - t->n_inputs].out;
}

static bool same(const ctpu_vtype *a, const ctpu_vtype *b)
{
    if (a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

static bool is_softmax(int op) { return op == CTPU_OP_SOFTMAX || op == CTPU_OP_LOG_SOFTMAX; }

/* A reduction over exactly the trailing dims [first, ndim) of x, or a
 * softmax over its last dim, with a float result: first; else -1. */
static int rowop_first(const ctpu_node *m, const ctpu_vtype *x)
{
    if (m->n_in != 1 || m->out.dtype == CTPU_KDT_I32 || x->ndim < 1) return -1;
    if (is_softmax(m->op)) return m->attr.dims[0] == x->ndim - 1 ? x->ndim - 1 : -1;
    int fc = ctpu_op_fusion(m->op);
    if (fc != CTPU_FUSE_REDUCE && fc != CTPU_FUSE_REDUCE_MEAN && m->op != CTPU_OP_VAR) return -1;
    if (m->attr.n_dims < 1) return -1;
    uint32_t mask = 0;
    for (int k = 0; k < m->attr.n_dims; k++) mask |= 1u << m->attr.dims[k];
    int first = __builtin_ctz(mask);
    uint32_t want = ((1u << x->ndim) - 1) & ~((1u << first) - 1);
    return mask == want ? first : -1;
}

/* R's rows and row length for reductions from dim `first`; false when the
 * row is empty or longer than a row group takes. */
static bool set_rows(ctpu_row_scan_info *f, int first)
{
    int64_t rows = 1, n = 1;
    for (int d = 0; d < first; d++) rows *= f->R.shape[d];
    for (int d = first; d < f->R.ndim; d++) n *= f->R.shape[d];
    if (n < 1 || n > CTPU_ROW_MAX_N) return false;
    f->first = first;
    f->rows = rows;
    f->n = n;
    f->P = f->R;
    for (int d = first; d < f->R.ndim; d++) f->P.shape[d] = 1;
    return true;
}

/* Can a node of class `reader` read in-group value v (class of node v - base)? */
static bool reads_ok(const ctpu_row_scan_info *f, const ctpu_node *m, int base, int i, int reader)
{
    for (int q = 0; q < m->n_in; q++) {
        int32_t v = m->in[q];
        if (v < base + i) continue;                       /* from outside: broadcasts into m */
        int c = f->cls[v - base - i];
        if (c == CTPU_ROW_COL) return false;                 /* read only by its reshapes (col_node) */
        if (c == CTPU_ROW_ROWOUT || (reader == CTPU_ROW_ROW && c != CTPU_ROW_ROW)) return false;
        if (reader == CTPU_ROW_BCAST && c != CTPU_ROW_BCAST) return false;   /* computed from outside values only */
        if (reader == -1 && c != CTPU_ROW_FULL) return false;   /* a reduction's or softmax's input */
    }
    return true;
}

/* a broadcasts into b (right-aligned) with fewer elements */
static bool bcasts_into(const ctpu_vtype *a, const ctpu_vtype *b)
{
    if (a->ndim > b->ndim) return false;
    for (int d = 0; d < a->ndim; d++) {
        int64_t x = a->shape[d], y = b->shape[b->ndim - a->ndim + d];
        if (x != y && x != 1) return false;
    }
    return ctpu_vtype_numel(a) < ctpu_vtype_numel(b);
}

static void scan_nodes(const ctpu_trace *t, int i, int max_end, ctpu_row_scan_info *f);

/* An expand of a bf16 value. The block VM does not take it (vm.c
 * ctpu_vm_fusable: its f32 register would be rounded to bf16 again, which
 * flushes a bf16 subnormal the copy keeps); a row group copies the exact f32
 * widening unrounded (row_fields), so it takes one whose value it does not
 * store (a store rounds: such a node ends the group, ctpu_row_scan). Label
 * smoothing's expand in a bf16 loss step's gradient is one. */
static bool bf16_expand(const ctpu_node *m) { return m->op == CTPU_OP_EXPAND && m->out.dtype == CTPU_KDT_BF16; }

/* Is m a COL node: a sum / mean / max / min of an in-group FULL value over
 * exactly the row dims [0, first), or a reshape of a COL value keeping its
 * element count? */
static bool col_node(const ctpu_row_scan_info *f, const ctpu_node *m, int base, int i)
{
    if (f->first <= 0 || f->rows < 1 || m->n_in != 1 || m->in[0] < base + i || m->out.dtype == CTPU_KDT_I32)
        return false;
    int c = f->cls[m->in[0] - base - i];
    if (c == CTPU_ROW_COL) return m->op == CTPU_OP_RESHAPE && ctpu_vtype_numel(&m->out) == f->n;
    int fc = ctpu_op_fusion(m->op);
    if (c != CTPU_ROW_FULL || (fc != CTPU_FUSE_REDUCE && fc != CTPU_FUSE_REDUCE_MEAN)) return false;
    uint32_t mask = 0;
    for (int k = 0; k < m->attr.n_dims; k++) mask |= 1u << m->attr.dims[k];
    return mask == (1u << f->first) - 1;
}

void ctpu_row_scan(const ctpu_trace *t, int i, const int32_t *uses, ctpu_row_scan_info *f)
{
    int nin = t->n_inputs;
    scan_nodes(t, i, t->n_nodes, f);
    /* a BCAST value or a bf16 expand read outside the group ends the group before it */
    for (int k = i; k < f->end; k++) {
        if (f->cls[k - i] != CTPU_ROW_BCAST && !bf16_expand(&t->nodes[k])) continue;
        int reads = 0;
        for (int q = k + 1; q < f->end; q++)
            for (int r = 0; r < t->nodes[q].n_in; r++) reads += t->nodes[q].in[r] == nin + k;
        if (reads != uses[nin + k]) {
            scan_nodes(t, i, k, f);
            k = i - 1;
        }
    }
}

static void scan_nodes(const ctpu_trace *t, int i, int max_end, ctpu_row_scan_info *f)
{
    int nin = t->n_inputs, j;
    bool has_R = false;
    memset(f, 0, sizeof *f);
    f->first = -1;
    for (j = i; j < max_end && j - i < CTPU_ROW_GROUP_NODES; j++) {
        const ctpu_node *m = &t->nodes[j];
        const ctpu_vtype *it[CTPU_NODE_MAX_IN];
        for (int k = 0; k < m->n_in; k++) it[k] = vtype(t, m->in[k]);
        int rf = rowop_first(m, m->n_in ? it[0] : NULL), cls;
        if (col_node(f, m, nin, i)) {
            cls = CTPU_ROW_COL;
        } else if (rf >= 0) {
            if (!has_R) { f->R = *it[0]; has_R = true; }
            if (!same(it[0], &f->R)) break;
            if (f->first < 0 && !set_rows(f, rf)) break;
            if (rf != f->first || !reads_ok(f, m, nin, i, -1)) break;
            cls = is_softmax(m->op) ? CTPU_ROW_FULL : (m->attr.flags & CTPU_ATTR_KEEPDIM) ? CTPU_ROW_ROW : CTPU_ROW_ROWOUT;
            f->n_rowops++;
        } else if (m->op == CTPU_OP_GATHER_BACKWARD) {
            /* along the last dim, from a value per row and its i32 index per row
             * (both [rows..., 1], from outside): each row zeros but one place */
            if (!has_R) { f->R = m->out; has_R = true; }
            if (!same(&m->out, &f->R) || m->attr.extra != f->R.ndim - 1 || m->out.dtype == CTPU_KDT_I32) break;
            if (f->first < 0 && !set_rows(f, f->R.ndim - 1)) break;
            if (f->first != f->R.ndim - 1 || it[0]->dtype == CTPU_KDT_I32 || it[1]->dtype != CTPU_KDT_I32) break;
            if (m->in[0] >= nin + i || m->in[1] >= nin + i || !same(it[0], &f->P) || !same(it[1], &f->P)) break;
            cls = CTPU_ROW_FULL;
        } else if (ctpu_vm_fusable(m, it) || bf16_expand(m)) {
            if (!has_R) { f->R = m->out; has_R = true; }
            if (same(&m->out, &f->R)) cls = CTPU_ROW_FULL;
            else if (f->first >= 0 && same(&m->out, &f->P)) cls = CTPU_ROW_ROW;
            else if (has_R && bcasts_into(&m->out, &f->R)) cls = CTPU_ROW_BCAST;
            else break;
            if (!reads_ok(f, m, nin, i, cls)) break;
        } else {
            break;
        }
        f->cls[j - i] = (uint8_t)cls;
    }
    f->end = j;
}

/* ------------------------------------------------------------ building */
typedef struct {
    int n;
    int32_t val[CTPU_BCAST_MAX];
    const ctpu_vtype *type[CTPU_BCAST_MAX];
} ext_list;

/* the operand index of external v in list e (added if new), -1 when full */
static int ext_index(ext_list *e, const ctpu_trace *t, int32_t v)
{
    for (int q = 0; q < e->n; q++)
        if (e->val[q] == v) return q;
    if (e->n == CTPU_BCAST_MAX) return -1;
    e->val[e->n] = v;
    e->type[e->n] = vtype(t, v);
    return e->n++;
}

/* an elementwise node's VM instruction kind and kernel */
static void ew_fields(const ctpu_node *n, ctpu_row_ins *I)
{
    uint32_t kind = ctpu_op_infos[n->op].kind;
    I->kop = (uint8_t)ctpu_op_kop(n->op);
    if (kind & CTPU_OPK_UNARY) I->vkind = CTPU_VM_UNARY;
    else if (kind & CTPU_OPK_BINARY) I->vkind = CTPU_VM_BINARY;
    else if (kind & CTPU_OPK_SCALAR) {
        I->vkind = CTPU_VM_SCALAR;
        if (n->attr.flags & CTPU_ATTR_SCALAR_FIRST) I->flags |= CTPU_VM_SCALAR_FIRST;
    } else if (kind & CTPU_OPK_TERNARY) I->vkind = CTPU_VM_WHERE;
    else if (ctpu_op_kop(n->op) == CTPU_K_E_CLAMP) I->vkind = CTPU_VM_CLAMP;
    else if (n->op == CTPU_OP_FULL) I->vkind = CTPU_VM_FILL;
    else I->vkind = CTPU_VM_COPY;   /* a cast between float dtypes, expand, reshape */
}

/* node k's instruction fields but its operands */
static void row_fields(const ctpu_node *m, int cls, int64_t n, ctpu_row_ins *I)
{
    if (cls == CTPU_ROW_COL) {
        I->kind = ctpu_op_is(m->op, CTPU_OPK_REDUCTION) ? CTPU_ROWI_COLRED : CTPU_ROWI_COLCOPY;
        I->kop = (uint8_t)ctpu_op_kop(m->op);
        if (ctpu_op_fusion(m->op) == CTPU_FUSE_REDUCE_MEAN) I->flags |= CTPU_ROWF_MEAN;
    } else if (is_softmax(m->op)) {
        I->kind = CTPU_ROWI_SOFTMAX;
        if (m->op == CTPU_OP_LOG_SOFTMAX) I->flags |= CTPU_ROWF_LOG;
    } else if (m->op == CTPU_OP_GATHER_BACKWARD) {
        I->kind = CTPU_ROWI_SCATTER;
    } else if (ctpu_op_is(m->op, CTPU_OPK_REDUCTION)) {
        I->kind = CTPU_ROWI_REDUCE;
        I->kop = (uint8_t)ctpu_op_kop(m->op);
        if (ctpu_op_fusion(m->op) == CTPU_FUSE_REDUCE_MEAN) I->flags |= CTPU_ROWF_MEAN;
        if (m->op == CTPU_OP_VAR) {
            I->flags |= CTPU_ROWF_VAR;
            I->den = n - m->attr.i64[0] > 0 ? n - m->attr.i64[0] : 0;
        }
    } else {
        I->kind = cls == CTPU_ROW_ROW ? CTPU_ROWI_EW_ROW : CTPU_ROWI_EW_FULL;
        ew_fields(m, I);
    }
    if (m->out.dtype == CTPU_KDT_BF16 && !bf16_expand(m)) I->flags |= CTPU_VM_ROUND_BF16;
}

int ctpu_row_build(ctpu_row_prog *p, const ctpu_trace *t, int i, const ctpu_row_scan_info *f,
                   const int32_t *slot_of, const bool *store, const int32_t *scalar_base)
{
    int nin = t->n_inputs, count = f->end - i;
    ext_list ef = { 0 }, er = { 0 };
    int last[CTPU_ROW_GROUP_NODES];
    bool busy[CTPU_ROW_GROUP_NODES] = { false };
    memset(p, 0, sizeof *p);
    p->rows = f->rows;
    p->n = f->n;
    for (int k = 0; k < count; k++) last[k] = -1;
    for (int k = 0; k < count; k++)
        for (int q = 0; q < t->nodes[i + k].n_in; q++) {
            int32_t v = t->nodes[i + k].in[q];
            if (v >= nin + i) last[v - nin - i] = k;
        }
    for (int k = 0; k < count; k++) {
        const ctpu_node *m = &t->nodes[i + k];
        ctpu_row_ins *I = &p->ins[k];
        int cls = f->cls[k];
        bool full_reader = cls != CTPU_ROW_ROW && cls != CTPU_ROW_ROWOUT;   /* elementwise FULL / BCAST, softmax, reductions */
        if (ctpu_op_is(m->op, CTPU_OPK_REDUCTION)) full_reader = true;
        if (m->op == CTPU_OP_GATHER_BACKWARD) full_reader = false;   /* a value and an index per row */
        row_fields(m, cls, f->n, I);
        I->n_src = m->n_in;
        I->src[1] = I->src[2] = -1;
        for (int q = 0; q < m->n_in && q < 3; q++) {
            int32_t v = m->in[q];
            if (v >= nin + i) { I->src[q] = (int16_t)(v - nin - i); continue; }
            int e = ext_index(full_reader ? &ef : &er, t, v);
            if (e < 0) return -1;
            int vi = count + (full_reader ? e : CTPU_BCAST_MAX + e);
            p->val[vi] = (ctpu_row_val){ (uint8_t)(full_reader ? CTPU_ROWV_EXT_FULL : CTPU_ROWV_EXT_ROW), (int16_t)e };
            I->src[q] = (int16_t)vi;
        }
        /* buffers whose last read is here are free for the result (kernels may run in place) */
        for (int g = 0; g < k; g++)
            if (last[g] == k && p->val[g].kind == CTPU_ROWV_BUF) busy[p->val[g].idx] = false;
        if (cls == CTPU_ROW_COL) {
            p->val[k] = (ctpu_row_val){ CTPU_ROWV_COL, (int16_t)p->n_col++ };
        } else if (cls == CTPU_ROW_FULL && store[k] && m->out.dtype == CTPU_KDT_F32) {
            p->val[k] = (ctpu_row_val){ CTPU_ROWV_OUT, (int16_t)k };
        } else if (cls == CTPU_ROW_FULL || cls == CTPU_ROW_BCAST) {
            int b = 0;
            while (busy[b]) b++;
            busy[b] = true;
            if (b + 1 > p->n_buf) p->n_buf = b + 1;
            p->val[k] = (ctpu_row_val){ CTPU_ROWV_BUF, (int16_t)b };
            if (last[k] < 0) busy[b] = false;
        } else {
            p->val[k] = (ctpu_row_val){ CTPU_ROWV_REG, (int16_t)p->n_reg++ };
        }
        I->dst = (int16_t)k;
        I->scalar = scalar_base[i + k];
        I->store_slot = store[k] ? slot_of[nin + i + k] : -1;
        I->store_dtype = m->out.dtype;
        if (store[k] && I->store_slot < 0) return -1;
    }
    p->n_ins = count;
    p->n_vals = count + 2 * CTPU_BCAST_MAX;
    p->n_ef = ef.n;
    p->n_er = er.n;
    for (int e = 0; e < ef.n; e++) { p->ef_slot[e] = slot_of[ef.val[e]]; p->ef_dtype[e] = ef.type[e]->dtype; }
    for (int e = 0; e < er.n; e++) { p->er_slot[e] = slot_of[er.val[e]]; p->er_dtype[e] = er.type[e]->dtype; }
    for (int e = 0; e < ef.n; e++) if (p->ef_slot[e] < 0) return -1;
    for (int e = 0; e < er.n; e++) if (p->er_slot[e] < 0) return -1;
    ctpu_bcast_plan_make(&f->R, ef.type, ef.n, &p->plan_full);
    ctpu_bcast_plan_make(&f->P, er.type, er.n, &p->plan_row);
    return 0;
}

/* ------------------------------------------------------------ running
 * Rows go in tiles of T rows (T x n about 2K elements): a FULL value's tile
 * is T x n contiguous floats, a ROW value's T floats, so each kernel call
 * covers a tile (reductions and softmax take T rows at once: the same order
 * per row). 8 KiB per tile buffer: a layer norm's source tile, its two
 * buffers and its output tile stay in L1 (48 KiB) from one instruction to
 * the next (8K-element tiles, 32 KiB each, went through L2). */
enum { ROW_TILE_ELEMS = 2048 };

typedef struct {
    const ctpu_row_prog *p;
    ctpu_exec_ctx *ctx;
    int64_t T;                         /* rows per tile */
    float *buf[CTPU_ROW_GROUP_NODES];  /* [T * n] each */
    float *reg[CTPU_ROW_GROUP_NODES];  /* [T] each */
    float *tmp[3], *rowtmp;            /* [max(BLOCK, T)] each; [T * n] */
    float *const *col;                 /* per COL value: its FULL source's buffer [rows * n] (reductions) */
} row_state;

/* value v for tile elements [o, o + len) of the tile at row r (FULL
 * readers: o counts T x n elements; ROW readers: o = 0, len = the tile's
 * rows). A register read by a FULL reader is broadcast along its row. */
static const float *operand(row_state *s, int v, bool full, int64_t r, int64_t o, int64_t len, float *tmp)
{
    const ctpu_row_prog *p = s->p;
    const ctpu_row_val *x = &p->val[v];
    int64_t n = p->n;
    switch (x->kind) {
    case CTPU_ROWV_BUF: return s->buf[x->idx] + o;
    case CTPU_ROWV_OUT: return (const float *)s->ctx->ptr[p->ins[x->idx].store_slot] + r * n + o;
    case CTPU_ROWV_REG: {
        const float *g = s->reg[x->idx];
        if (!full) return g;
        for (int64_t j = 0; j < len;) {
            int64_t row = (o + j) / n, run = (row + 1) * n - (o + j);
            if (run > len - j) run = len - j;
            for (int64_t q = 0; q < run; q++) tmp[j + q] = g[row];
            j += run;
        }
        return tmp;
    }
    case CTPU_ROWV_EXT_FULL:
        return ctpu_load_block(s->ctx->ptr[p->ef_slot[x->idx]], p->ef_dtype[x->idx], &p->plan_full, x->idx,
                               r * n + o, len, tmp);
    default:
        return ctpu_load_block(s->ctx->ptr[p->er_slot[x->idx]], p->er_dtype[x->idx], &p->plan_row, x->idx, r, len,
                               tmp);
    }
}

static void ew_apply(const ctpu_row_ins *I, const float *const *x, float *d, int64_t n, const double *sc)
{
    switch (I->vkind) {
    case CTPU_VM_UNARY: ctpu_k_unary((ctpu_k_unary_op)I->kop, x[0], d, n); break;
    case CTPU_VM_BINARY: ctpu_k_binary((ctpu_k_binary_op)I->kop, x[0], x[1], d, n); break;
    case CTPU_VM_SCALAR:
        ctpu_k_binary_scalar((ctpu_k_binary_op)I->kop, x[0], (float)sc[I->scalar], (I->flags & CTPU_VM_SCALAR_FIRST) != 0,
                             d, n);
        break;
    case CTPU_VM_WHERE: ctpu_k_where(x[0], x[1], x[2], d, n); break;
    case CTPU_VM_CLAMP: ctpu_k_clamp(x[0], (float)sc[I->scalar], (float)sc[I->scalar + 1], d, n); break;
    case CTPU_VM_FILL:
        for (int64_t q = 0; q < n; q++) d[q] = (float)sc[I->scalar];
        break;
    default:
        if (x[0] != d) memcpy(d, x[0], sizeof(float) * (size_t)n);
        break;
    }
    if (I->flags & CTPU_VM_ROUND_BF16) ctpu_k_unary(CTPU_K_U_ROUND_BF16, d, d, n);
}

/* where FULL value v's elements [o, o + len) of the tile at row r go */
static float *full_dst(row_state *s, const ctpu_row_val *v, int64_t r, int64_t o)
{
    if (v->kind == CTPU_ROWV_OUT) return (float *)s->ctx->ptr[s->p->ins[v->idx].store_slot] + r * s->p->n + o;
    return s->buf[v->idx] + o;
}

static void store(const ctpu_row_ins *I, ctpu_exec_ctx *ctx, const float *v, int64_t at, int64_t len)
{
    if (I->store_slot < 0) return;   /* (ctpu_from_f32 of f32 in place is a no-op) */
    int dt = I->store_dtype;
    ctpu_from_f32(v, dt, (char *)ctx->ptr[I->store_slot] + (size_t)at * ctpu_kdt_size(dt), len);
}

/* the reductions of rows [r, r + t) into y: as exec_reduce / exec_mean / exec_var */
static void reduce_tile(row_state *s, const ctpu_row_ins *I, int64_t r, int64_t t, float *y)
{
    int64_t n = s->p->n;
    const float *x = operand(s, I->src[0], true, r, 0, t * n, s->rowtmp);
    if (I->flags & CTPU_ROWF_VAR) {
        float *mean = s->tmp[0];
        ctpu_k_reduce(CTPU_K_RED_SUM, x, t, n, 1, mean, NULL);
        ctpu_k_binary_scalar(CTPU_K_B_DIV, mean, (float)n, false, mean, t);
        ctpu_k_sqdev(x, mean, t, n, 1, y, NULL);
        ctpu_k_binary_scalar(CTPU_K_B_DIV, y, (float)I->den, false, y, t);
    } else {
        ctpu_k_reduce((ctpu_k_red_op)I->kop, x, t, n, 1, y, NULL);
        if (I->flags & CTPU_ROWF_MEAN) ctpu_k_binary_scalar(CTPU_K_B_DIV, y, (float)n, false, y, t);
    }
    if (I->flags & CTPU_VM_ROUND_BF16) ctpu_k_unary(CTPU_K_U_ROUND_BF16, y, y, t);
}

/* external FULL operand e is an f32 vector along the row ([n] broadcast
 * over the rows: a norm's weight or bias), read in place row by row */
static bool row_vector(const ctpu_row_prog *p, int e)
{
    const bcast_plan *b = &p->plan_full;
    return p->ef_dtype[e] == CTPU_KDT_F32 && b->nd == 2 && b->shape[1] == p->n && b->stride[e][0] == 0 &&
           b->stride[e][1] == 1;
}

/* A FULL binary instruction over rows [r, r + t) one kernel call per row,
 * when a source is a per-row register (the row's one value: binary_scalar,
 * the same f32 operation in the same operand order) or a row vector from
 * outside (read in place): no broadcast copies. False when it does not
 * apply (then the block path runs). */
static bool ew_rows(row_state *s, const ctpu_row_ins *I, int64_t r, int64_t t)
{
    const ctpu_row_prog *p = s->p;
    int64_t n = p->n;
    if (I->vkind != CTPU_VM_BINARY || n < 64 || n > CTPU_K_BLOCK) return false;   /* (tmp holds a block) */
    int kind[2];   /* 0: a FULL array, 1: a register, 2: a row vector */
    for (int a = 0; a < 2; a++) {
        const ctpu_row_val *v = &p->val[I->src[a]];
        if (v->kind == CTPU_ROWV_REG) kind[a] = 1;
        else if (v->kind == CTPU_ROWV_EXT_FULL && row_vector(p, v->idx)) kind[a] = 2;
        else if (v->kind == CTPU_ROWV_BUF || v->kind == CTPU_ROWV_OUT || v->kind == CTPU_ROWV_EXT_FULL) kind[a] = 0;
        else return false;
    }
    if ((kind[0] == 0 && kind[1] == 0) || (kind[0] == 1 && kind[1] == 1)) return false;
    ctpu_k_binary_op op = (ctpu_k_binary_op)I->kop;
    const float *base[2] = { NULL, NULL }, *regv = NULL;   /* base: row q at base + q * n */
    for (int a = 0; a < 2; a++) {
        const ctpu_row_val *v = &p->val[I->src[a]];
        if (kind[a] == 1) regv = s->reg[v->idx];
        else if (kind[a] == 2) base[a] = s->ctx->ptr[p->ef_slot[v->idx]];
        else if (v->kind != CTPU_ROWV_EXT_FULL || (p->plan_full.mode[v->idx] == 0 && p->ef_dtype[v->idx] == CTPU_KDT_F32))
            base[a] = operand(s, I->src[a], true, r, 0, n, s->tmp[a]);   /* in place: every row follows */
    }
    float *d0 = full_dst(s, &p->val[I->dst], r, 0);
    for (int64_t q = 0; q < t; q++) {
        const float *x[2];
        float sv = regv ? regv[q] : 0;
        for (int a = 0; a < 2; a++)
            x[a] = kind[a] == 1 ? NULL
                   : kind[a] == 2 ? base[a]
                   : base[a] ? base[a] + q * n
                             : operand(s, I->src[a], true, r, q * n, n, s->tmp[a]);
        float *d = d0 + q * n;
        if (kind[0] == 1) ctpu_k_binary_scalar(op, x[1], sv, true, d, n);
        else if (kind[1] == 1) ctpu_k_binary_scalar(op, x[0], sv, false, d, n);
        else ctpu_k_binary(op, x[0], x[1], d, n);
        if (I->flags & CTPU_VM_ROUND_BF16) ctpu_k_unary(CTPU_K_U_ROUND_BF16, d, d, n);
        store(I, s->ctx, d, (r + q) * n, n);
    }
    return true;
}

/* gather_backward along the last dim of rows [r, r + t), as
 * exec_gather_backward: zeros, then out[q, idx[q]] += g[q] in f32 (an index
 * outside [0, n) adds nothing), rounded once to the output's dtype */
static void scatter_tile(row_state *s, const ctpu_row_ins *I, int64_t r, int64_t t)
{
    const ctpu_row_prog *p = s->p;
    int64_t n = p->n;
    const float *g = operand(s, I->src[0], false, r, 0, t, s->tmp[0]);
    const ctpu_row_val *iv = &p->val[I->src[1]];
    const int32_t *idx = (const int32_t *)s->ctx->ptr[p->er_slot[iv->idx]] + r;   /* i32 [rows, 1], contiguous */
    float *d = full_dst(s, &p->val[I->dst], r, 0);
    memset(d, 0, sizeof(float) * (size_t)(t * n));
    for (int64_t q = 0; q < t; q++)
        if (idx[q] >= 0 && idx[q] < n) d[q * n + idx[q]] += g[q];
    if (I->flags & CTPU_VM_ROUND_BF16) ctpu_k_unary(CTPU_K_U_ROUND_BF16, d, d, t * n);
    store(I, s->ctx, d, r * n, t * n);
}

/* rows [r, r + t) through every instruction */
static void run_tile(row_state *s, int64_t r, int64_t t)
{
    const ctpu_row_prog *p = s->p;
    ctpu_exec_ctx *ctx = s->ctx;
    int64_t n = p->n, tn = t * n;
    for (int k = 0; k < p->n_ins; k++) {
        const ctpu_row_ins *I = &p->ins[k];
        const ctpu_row_val *dv = &p->val[I->dst];
        const float *x[3] = { NULL, NULL, NULL };
        switch (I->kind) {
        case CTPU_ROWI_EW_FULL:
            if (ew_rows(s, I, r, t)) break;
            for (int64_t o = 0; o < tn; o += CTPU_K_BLOCK) {
                int64_t len = tn - o < CTPU_K_BLOCK ? tn - o : CTPU_K_BLOCK;
                for (int q = 0; q < I->n_src; q++) x[q] = operand(s, I->src[q], true, r, o, len, s->tmp[q]);
                float *d = full_dst(s, dv, r, o);
                ew_apply(I, x, d, len, ctx->scalars);
                store(I, ctx, d, r * n + o, len);
            }
            break;
        case CTPU_ROWI_EW_ROW: {
            for (int q = 0; q < I->n_src; q++) x[q] = operand(s, I->src[q], false, r, 0, t, s->tmp[q]);
            float *d = s->reg[dv->idx];
            ew_apply(I, x, d, t, ctx->scalars);
            store(I, ctx, d, r, t);
            break;
        }
        case CTPU_ROWI_REDUCE:
            reduce_tile(s, I, r, t, s->reg[dv->idx]);
            store(I, ctx, s->reg[dv->idx], r, t);
            break;
        case CTPU_ROWI_COLRED:   /* the tile's rows of the source, reduced after every row (col_finish) */
            memcpy(s->col[dv->idx] + r * n, operand(s, I->src[0], true, r, 0, tn, s->rowtmp), sizeof(float) * (size_t)tn);
            break;
        case CTPU_ROWI_COLCOPY: break;
        case CTPU_ROWI_SCATTER: scatter_tile(s, I, r, t); break;
        default: {   /* softmax / log_softmax of the rows */
            float *d = full_dst(s, dv, r, 0);
            ctpu_k_softmax(operand(s, I->src[0], true, r, 0, tn, s->rowtmp), t, n, d, (I->flags & CTPU_ROWF_LOG) != 0,
                           NULL);
            if (I->flags & CTPU_VM_ROUND_BF16) ctpu_k_unary(CTPU_K_U_ROUND_BF16, d, d, tn);
            store(I, ctx, d, r * n, tn);
            break;
        }
        }
    }
}

static void row_range(const ctpu_row_prog *p, ctpu_exec_ctx *ctx, float *const *col, int64_t r0, int64_t r1)
{
    int64_t T = p->n >= ROW_TILE_ELEMS ? 1 : ROW_TILE_ELEMS / p->n;
    if (T > r1 - r0) T = r1 - r0;
    size_t tn = (size_t)(T * p->n), tw = (size_t)(T > CTPU_K_BLOCK ? T : CTPU_K_BLOCK);
    size_t nf = (size_t)p->n_buf * tn + (size_t)p->n_reg * (size_t)T + 3 * tw + tn;
    float *mem = malloc(sizeof(float) * nf);
    if (!mem) {
        ctx->fault_status = CTPU_ERR_OOM;
        snprintf(ctx->fault_msg, sizeof ctx->fault_msg, "fused program: out of host memory for row buffers");
        return;
    }
    row_state s = { .p = p, .ctx = ctx, .T = T, .col = col };
    float *at = mem;
    for (int b = 0; b < p->n_buf; b++, at += tn) s.buf[b] = at;
    for (int g = 0; g < p->n_reg; g++, at += T) s.reg[g] = at;
    for (int q = 0; q < 3; q++, at += tw) s.tmp[q] = at;
    s.rowtmp = at;
    for (int64_t r = r0; r < r1; r += T) run_tile(&s, r, r1 - r < T ? r1 - r : T);
    free(mem);
}

typedef struct {
    const ctpu_row_prog *p;
    ctpu_exec_ctx *ctx;
    float *const *col;
} row_job;

static void row_task(void *arg, int tid, int nt)
{
    row_job *j = arg;
    int64_t rows = j->p->rows;
    int64_t r0 = rows * tid / nt, r1 = rows * (tid + 1) / nt;
    if (r0 < r1) row_range(j->p, j->ctx, j->col, r0, r1);
}

/* Every row done: each COL reduction over its buffer [rows, n] as
 * exec_reduce / exec_mean (ctpu_k_reduce with outer 1, n = rows, inner = n:
 * the same order), a reshape of one its bits; stored. */
static void col_finish(const ctpu_row_prog *p, ctpu_exec_ctx *ctx, float *const *col, float *res)
{
    int64_t n = p->n;
    for (int k = 0; k < p->n_ins; k++) {
        const ctpu_row_ins *I = &p->ins[k];
        if (I->kind != CTPU_ROWI_COLRED && I->kind != CTPU_ROWI_COLCOPY) continue;
        float *y = res + (size_t)p->val[I->dst].idx * (size_t)n;
        if (I->kind == CTPU_ROWI_COLCOPY) {
            memcpy(y, res + (size_t)p->val[I->src[0]].idx * (size_t)n, sizeof(float) * (size_t)n);
        } else {
            ctpu_k_reduce((ctpu_k_red_op)I->kop, col[p->val[I->dst].idx], 1, p->rows, n, y, ctx->pool);
            if (I->flags & CTPU_ROWF_MEAN) ctpu_k_binary_scalar(CTPU_K_B_DIV, y, (float)p->rows, false, y, n);
            if (I->flags & CTPU_VM_ROUND_BF16) ctpu_k_unary(CTPU_K_U_ROUND_BF16, y, y, n);
        }
        store(I, ctx, y, 0, n);
    }
}

void ctpu_row_exec(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_row_prog *p = data;
    if (p->rows == 0) return;   /* (a group with COL values has rows: col_node) */
    float *col[CTPU_ROW_GROUP_NODES] = { NULL }, *res = NULL;
    float *mem = NULL;
    if (p->n_col) {
        size_t full = (size_t)(p->rows * p->n), n_red = 0;
        for (int k = 0; k < p->n_ins; k++) n_red += p->ins[k].kind == CTPU_ROWI_COLRED;
        mem = malloc(sizeof(float) * (n_red * full + (size_t)p->n_col * (size_t)p->n));
        if (!mem) {
            ctx->fault_status = CTPU_ERR_OOM;
            snprintf(ctx->fault_msg, sizeof ctx->fault_msg, "fused program: out of host memory for column buffers");
            return;
        }
        float *at = mem;
        for (int k = 0; k < p->n_ins; k++)
            if (p->ins[k].kind == CTPU_ROWI_COLRED) { col[p->val[p->ins[k].dst].idx] = at; at += full; }
        res = at;
    }
    if (p->rows > 1 && p->rows * p->n >= (1 << 16) && ctx->pool && ctx->pool->nthreads > 1) {
        row_job j = { p, ctx, col };
        ctx->pool->run(ctx->pool, row_task, &j);
    } else {
        row_range(p, ctx, col, 0, p->rows);
    }
    if (p->n_col) col_finish(p, ctx, col, res);
    free(mem);
}
