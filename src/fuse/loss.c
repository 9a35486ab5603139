/* The loss step (vm.h ctpu_loss_prog): a classification loss's label path,
 * reduction and gradient over logits' rows, in one step. It takes a run of
 * consecutive nodes over one batch of N rows of C classes (N, C from a
 * gather or gather_backward along dim 1 with an i32 [N, 1] index): values
 * of one element ([] or [1]), one per row ([N] or [N, 1]) and [N, C]. That
 * is what ctpu_cross_entropy and ctpu_nll_loss record (src/nn/nn.c) for
 * every reduction (mean, sum, none) and label smoothing, and what autograd
 * records for their backward (to log_softmax's input gradient), so a
 * training step's loss forward and backward after log_softmax is one step.
 *
 * Two phases:
 *  1. the per-row and one-element values (the label compare and select, the
 *     gather, neg, casts, the masked losses, sums, the division, the
 *     gradient's seed and its spreading over the rows), in node order, each
 *     by its own node's kernel entry (exec.c) on step-private buffers: the
 *     bits are the node's by construction, faults too (a label out of range
 *     is exec_gather's fault, named by the gather's op number);
 *  2. the [N, C] values and what reads them (gather_backward, label
 *     smoothing's expand, the log_softmax gradient's row sum, exp, product
 *     and difference) as one row program (rows.c) over the phase-1 values:
 *     row tile by row tile, each node the kernel it runs alone, so the bits
 *     of the separate ops (rows.c).
 * Phase 2 never feeds phase 1 (such a run is cut before). Values read
 * outside the step are written to their program slots. */
#include <stdlib.h>
#include <string.h>

#include "vm.h"

static const ctpu_vtype *vt(const ctpu_trace *t, int32_t v)
{
    return v < t->n_inputs ? &t->in_type[v] : &t->nodes[v - t->n_inputs].out;
}

enum { CLS_NONE, CLS_ONE, CLS_ROW, CLS_FULL };

/* one element, one per row, [N, C], or none of these */
static int cls_of(const ctpu_vtype *a, int64_t N, int64_t C)
{
    if (a->ndim <= 1 && ctpu_vtype_numel(a) == 1) return CLS_ONE;
    if (a->ndim == 1 && a->shape[0] == N) return CLS_ROW;
    if (a->ndim == 2 && a->shape[0] == N && a->shape[1] == 1) return CLS_ROW;
    if (a->ndim == 2 && a->shape[0] == N && a->shape[1] == C) return CLS_FULL;
    return CLS_NONE;
}

/* a gather / gather_backward along dim 1 with an i32 [N, 1] index over [N, C] */
static bool batch_of(const ctpu_trace *t, const ctpu_node *m, int64_t *N, int64_t *C)
{
    if ((m->op != CTPU_OP_GATHER && m->op != CTPU_OP_GATHER_BACKWARD) || m->attr.extra != 1) return false;
    const ctpu_vtype *x = m->op == CTPU_OP_GATHER ? vt(t, m->in[0]) : &m->out, *ix = vt(t, m->in[1]);
    if (x->ndim != 2 || ix->ndim != 2 || ix->dtype != CTPU_KDT_I32 || ix->shape[0] != x->shape[0] || ix->shape[1] != 1)
        return false;
    *N = x->shape[0];
    *C = x->shape[1];
    return *N > 1 && *C > 1;
}

/* ops phase 1 runs by their kernel entries */
static bool phase1_op(const ctpu_node *m)
{
    int fc = ctpu_op_fusion(m->op);
    if (fc == CTPU_FUSE_VM || fc == CTPU_FUSE_ADD || fc == CTPU_FUSE_ACT) return ctpu_exec_fn_for(m->op) != NULL;
    return m->op == CTPU_OP_FULL || m->op == CTPU_OP_RESHAPE || m->op == CTPU_OP_EXPAND || m->op == CTPU_OP_SUM ||
           m->op == CTPU_OP_MEAN || (m->op == CTPU_OP_GATHER && m->attr.extra == 1);
}

typedef struct {
    int64_t N, C;
    uint8_t phase[CTPU_LOSS_NODES];     /* 1 or 2 */
    /* phase 2 as a trace of its own (rows.c's scan and build read it) */
    ctpu_trace mini;
    ctpu_vtype m_in[CTPU_LOSS_NODES * 3];
    ctpu_node m_nodes[CTPU_LOSS_NODES];
    int32_t m_src[CTPU_LOSS_NODES * 3];  /* per mini input: its value id in t */
    int32_t m_node[CTPU_LOSS_NODES];     /* per mini node: its node index in t */
    int32_t m_uses[CTPU_LOSS_NODES * 4];
    ctpu_row_scan_info rs;
} loss_plan;

/* reads of value v by nodes [i, end) */
static int reads_in(const ctpu_trace *t, int i, int end, int32_t v)
{
    int r = 0;
    for (int q = i; q < end; q++)
        for (int a = 0; a < t->nodes[q].n_in; a++) r += t->nodes[q].in[a] == v;
    return r;
}

/* The phase of each node from i on; returns the end of the longest run
 * whose nodes all fit a phase. */
static int classify(const ctpu_trace *t, int i, int lim, loss_plan *lp)
{
    int nin = t->n_inputs, k;
    for (k = i; k < lim; k++) {
        const ctpu_node *m = &t->nodes[k];
        bool reads2 = false;
        for (int a = 0; a < m->n_in; a++) {
            int32_t v = m->in[a];
            reads2 |= v >= nin + i && lp->phase[v - nin - i] == 2;
        }
        int oc = cls_of(&m->out, lp->N, lp->C);
        if (oc == CLS_NONE || m->op == CTPU_OP_SOFTMAX || m->op == CTPU_OP_LOG_SOFTMAX) break;
        lp->phase[k - i] = reads2 || oc == CLS_FULL ? 2 : 1;
        if (lp->phase[k - i] == 1 && !phase1_op(m)) break;
    }
    return k;
}

/* phase 2 of [i, end) as a trace of its own, and its row scan; false when
 * the row group does not take it whole */
static bool plan_rows(const ctpu_trace *t, int i, int end, const int32_t *uses, loss_plan *lp)
{
    int nin = t->n_inputs, n2 = 0, ne = 0;
    for (int k = i; k < end; k++) {
        const ctpu_node *m = &t->nodes[k];
        if (lp->phase[k - i] != 2) continue;
        ctpu_node mn = *m;
        for (int a = 0; a < m->n_in; a++) {
            int32_t v = m->in[a];
            if (v >= nin + i && lp->phase[v - nin - i] == 2) {
                int q = 0;
                while (lp->m_node[q] != v - nin) q++;
                mn.in[a] = -1 - q;            /* numbered below, once the inputs are counted */
                continue;
            }
            int e = 0;
            while (e < ne && lp->m_src[e] != v) e++;
            if (e == ne) { lp->m_src[ne] = v; lp->m_in[ne++] = *vt(t, v); }
            mn.in[a] = e;
        }
        lp->m_node[n2] = k;
        lp->m_nodes[n2++] = mn;
    }
    for (int q = 0; q < n2; q++)
        for (int a = 0; a < lp->m_nodes[q].n_in; a++)
            if (lp->m_nodes[q].in[a] < 0) lp->m_nodes[q].in[a] = ne + (-1 - lp->m_nodes[q].in[a]);
    lp->mini = (ctpu_trace){ .n_inputs = ne, .n_nodes = n2, .in_type = lp->m_in, .nodes = lp->m_nodes,
                             .precision = t->precision };
    if (n2 == 0) return true;
    for (int v = 0; v < ne + n2; v++) lp->m_uses[v] = 0;
    for (int q = 0; q < n2; q++)
        for (int a = 0; a < lp->m_nodes[q].n_in; a++) lp->m_uses[lp->m_nodes[q].in[a]]++;
    for (int q = 0; q < n2; q++) {
        int32_t v = nin + lp->m_node[q];
        if (uses[v] > reads_in(t, i, end, v)) lp->m_uses[ne + q] += 2;   /* read outside the step */
    }
    ctpu_row_scan(&lp->mini, 0, lp->m_uses, &lp->rs);
    return lp->rs.end == n2;
}

/* [i, end) (classified) as one loss step? */
static bool valid_run(const ctpu_trace *t, int i, int end, const int32_t *uses, loss_plan *lp)
{
    int nin = t->n_inputs;
    bool has_gather = false;
    for (int k = i; k < end; k++) {
        int64_t n, c;
        has_gather |= batch_of(t, &t->nodes[k], &n, &c) && n == lp->N && c == lp->C;
    }
    if (!has_gather) return false;
    /* an output written in place over an input: keep the program's ordering rules simple */
    for (int j = 0; j < t->n_outputs; j++)
        if (t->outputs[j] >= nin + i && t->outputs[j] < nin + end && t->out_alias && t->out_alias[j] != -1)
            return false;
    return plan_rows(t, i, end, uses, lp);
}

/* N and C from the first gather / gather_backward of [i, lim), then the
 * longest valid run from i (its end, or -1) */
static int longest_run(const ctpu_trace *t, int i, int lim, const int32_t *uses, loss_plan *lp)
{
    bool found = false;
    for (int k = i; k < lim && !found; k++) found = batch_of(t, &t->nodes[k], &lp->N, &lp->C);
    if (!found) return -1;
    int jmax = classify(t, i, lim, lp);
    for (int j = jmax; j >= i + 3; j--)
        if (valid_run(t, i, j, uses, lp)) return j;
    return -1;
}

int ctpu_loss_match(const ctpu_trace *t, int i, const int32_t *uses)
{
    if (!phase1_op(&t->nodes[i])) return -1;
    loss_plan *lp = malloc(sizeof *lp);
    if (!lp) return -1;
    int lim = t->n_nodes - i < CTPU_LOSS_NODES ? t->n_nodes : i + CTPU_LOSS_NODES;
    int end = longest_run(t, i, lim, uses, lp);
    free(lp);
    return end;
}

/* the local value index of t's value v (added if new) */
static int local_of(ctpu_loss_prog *p, int32_t *val, int32_t v, const ctpu_trace *t, const int32_t *slot_of)
{
    for (int q = 0; q < p->n_local; q++)
        if (val[q] == v) return q;
    if (p->n_local == CTPU_LOSS_VALS) return -1;
    const ctpu_vtype *ty = vt(t, v);
    val[p->n_local] = v;
    p->prog_slot[p->n_local] = slot_of[v];
    p->priv_bytes[p->n_local] = slot_of[v] >= 0 ? 0 : ctpu_vtype_numel(ty) * (int64_t)ctpu_kdt_size(ty->dtype);
    return p->n_local++;
}

int ctpu_loss_build(ctpu_loss_prog *p, const ctpu_trace *t, int i, int end, const int32_t *uses,
                    const int32_t *slot_of, const bool *used_outside, const int32_t *scalar_base)
{
    int nin = t->n_inputs;
    loss_plan *lp = malloc(sizeof *lp);
    int32_t val[CTPU_LOSS_VALS];
    if (!lp) return -1;
    memset(p, 0, sizeof *p);
    int rc = longest_run(t, i, end, uses, lp) == end ? 0 : -1;
    for (int k = i; k < end && rc == 0; k++) {
        const ctpu_node *m = &t->nodes[k];
        if (lp->phase[k - i] != 1) continue;
        ctpu_step_data *sd = &p->vec[p->n_vec++];
        sd->node = *m;
        for (int a = 0; a < m->n_in; a++) {
            sd->in[a] = *vt(t, m->in[a]);
            sd->in_slot[a] = local_of(p, val, m->in[a], t, slot_of);
            if (sd->in_slot[a] < 0) rc = -1;
        }
        sd->out_slot = local_of(p, val, nin + k, t, slot_of);
        sd->scalar_base = scalar_base[k];
        sd->epi_bias_slot = sd->epi_res_slot = sd->epi_scale = -1;
        p->vec_fn[p->n_vec - 1] = ctpu_exec_fn_for(m->op);
        if (sd->out_slot < 0 || (used_outside[k] && slot_of[nin + k] < 0)) rc = -1;
    }
    if (rc == 0 && lp->mini.n_nodes > 0) {
        int32_t ms[CTPU_LOSS_NODES * 4], mb[CTPU_LOSS_NODES];
        bool st[CTPU_LOSS_NODES];
        int ne = lp->mini.n_inputs;
        for (int e = 0; e < ne && rc == 0; e++) rc = (ms[e] = local_of(p, val, lp->m_src[e], t, slot_of)) < 0 ? -1 : 0;
        for (int q = 0; q < lp->mini.n_nodes && rc == 0; q++) {
            int k = lp->m_node[q];
            st[q] = used_outside[k];
            mb[q] = scalar_base[k];
            ms[ne + q] = st[q] ? local_of(p, val, nin + k, t, slot_of) : -1;
            if (st[q] && (ms[ne + q] < 0 || slot_of[nin + k] < 0)) rc = -1;
        }
        if (rc == 0) rc = ctpu_row_build(&p->rows, &lp->mini, 0, &lp->rs, ms, st, mb);
        p->has_rows = rc == 0;
    }
    free(lp);
    return rc;
}

void ctpu_loss_exec(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_loss_prog *p = data;
    void *local[CTPU_LOSS_VALS];
    size_t priv = 0;
    for (int q = 0; q < p->n_local; q++) priv += ((size_t)p->priv_bytes[q] + 63) & ~(size_t)63;
    char *mem = priv ? malloc(priv) : NULL;
    if (priv && !mem) {
        ctx->fault_status = CTPU_ERR_OOM;
        snprintf(ctx->fault_msg, sizeof ctx->fault_msg, "fused program: out of host memory for a loss step");
        return;
    }
    size_t off = 0;
    for (int q = 0; q < p->n_local; q++) {
        if (p->prog_slot[q] >= 0) { local[q] = ctx->ptr[p->prog_slot[q]]; continue; }
        local[q] = mem + off;
        off += ((size_t)p->priv_bytes[q] + 63) & ~(size_t)63;
    }
    ctpu_exec_ctx sub = *ctx;
    sub.ptr = local;
    sub.fault_status = CTPU_OK;
    for (int k = 0; k < p->n_vec; k++) p->vec_fn[k](&p->vec[k], &sub);
    if (p->has_rows && sub.fault_status != CTPU_ERR_OOM) ctpu_row_exec(&p->rows, &sub);
    if (sub.fault_status != CTPU_OK && ctx->fault_status == CTPU_OK) {
        ctx->fault_status = sub.fault_status;
        memcpy(ctx->fault_msg, sub.fault_msg, sizeof ctx->fault_msg);
    }
    free(mem);
}
