/* Roofline estimates (formula in costmodel.h). */
#include <math.h>
#include <string.h>

#include "costmodel.h"

/* x rounded up to a multiple of q, in double (extents up to INT64_MAX must
 * not overflow: the estimate is a float anyway) */
static double pad_to(int64_t x, int64_t q) { return ceil((double)x / (double)q) * (double)q; }

bool ctpu_cost_matmul_dims(const ctpu_node *n, const ctpu_vtype *a, int64_t *batch, int64_t *m, int64_t *k,
                           int64_t *nn)
{
    if (ctpu_op_cost(n->op) != CTPU_CC_MXU || !a) return false;
    const ctpu_vtype *o = &n->out;
    bool ta = (n->attr.flags & CTPU_ATTR_TRANS_A) != 0;
    int on = o->ndim;
    *m = on >= 2 ? o->shape[on - 2] : 1;
    *nn = on >= 1 ? o->shape[on - 1] : 1;
    if (a->ndim >= 2) *k = a->shape[a->ndim - (ta ? 2 : 1)];
    else *k = a->ndim == 1 ? a->shape[0] : 1;
    int64_t b = 1;
    for (int d = 0; d < on - 2; d++) b *= o->shape[d];
    *batch = b;
    return true;
}

void ctpu_cost_add_matmul(const ctpu_chip_info *c, int64_t batch, int64_t m, int64_t k, int64_t n, int passes,
                          ctpu_cost_estimate *e)
{
    if (batch <= 0 || m <= 0 || k <= 0 || n <= 0) return;
    int64_t q = c->mxu_size > 0 ? c->mxu_size : 128;
    double useful = (double)batch * (double)m * (double)n * (double)k;
    double padded = (double)batch * (double)pad_to(m, q) * (double)pad_to(n, q) * (double)pad_to(k, q);
    e->macs_useful += useful;
    e->macs_padded += padded;
    e->flops += 2.0 * useful;
    e->mxu_s += 2.0 * padded * (passes > 0 ? passes : 1) / c->peak_bf16_flops;
}

/* Vector-unit operations per counted element (CTPU_CC_OUT: per output
 * element, CTPU_CC_IN: per input element), one entry per op whose cost class
 * counts elements (tests/test_report.c checks the table against the classes). */
#define W_T CTPU_COST_TRANSCENDENTAL
static const double op_weight[CTPU_OP_COUNT] = {
    [CTPU_OP_NEG] = 1, [CTPU_OP_ABS] = 1, [CTPU_OP_EXP] = W_T, [CTPU_OP_LOG] = W_T, [CTPU_OP_SQRT] = W_T,
    [CTPU_OP_RSQRT] = W_T, [CTPU_OP_TANH] = W_T, [CTPU_OP_SIGMOID] = W_T, [CTPU_OP_RELU] = 1,
    [CTPU_OP_GELU_TANH] = W_T, [CTPU_OP_GELU_ERF] = W_T, [CTPU_OP_SOFTPLUS] = W_T,
    [CTPU_OP_ERF] = W_T, [CTPU_OP_SIN] = W_T, [CTPU_OP_COS] = W_T, [CTPU_OP_LOG1P] = W_T, [CTPU_OP_EXPM1] = W_T,
    [CTPU_OP_ADD] = 1, [CTPU_OP_SUB] = 1, [CTPU_OP_MUL] = 1, [CTPU_OP_DIV] = W_T, [CTPU_OP_POW] = W_T,
    [CTPU_OP_MAXIMUM] = 1, [CTPU_OP_MINIMUM] = 1,
    [CTPU_OP_EQ] = 1, [CTPU_OP_NE] = 1, [CTPU_OP_LT] = 1, [CTPU_OP_LE] = 1, [CTPU_OP_GT] = 1, [CTPU_OP_GE] = 1,
    [CTPU_OP_ADD_SCALAR] = 1, [CTPU_OP_SUB_SCALAR] = 1, [CTPU_OP_MUL_SCALAR] = 1, [CTPU_OP_DIV_SCALAR] = W_T,
    [CTPU_OP_POW_SCALAR] = W_T, [CTPU_OP_MAXIMUM_SCALAR] = 1, [CTPU_OP_MINIMUM_SCALAR] = 1,
    [CTPU_OP_EQ_SCALAR] = 1, [CTPU_OP_NE_SCALAR] = 1, [CTPU_OP_LT_SCALAR] = 1, [CTPU_OP_LE_SCALAR] = 1,
    [CTPU_OP_GT_SCALAR] = 1, [CTPU_OP_GE_SCALAR] = 1,
    [CTPU_OP_WHERE] = 1, [CTPU_OP_CLAMP] = 1, [CTPU_OP_CAST] = 1,
    [CTPU_OP_SUM] = 1, [CTPU_OP_MEAN] = 1, [CTPU_OP_MAX] = 1, [CTPU_OP_MIN] = 1, [CTPU_OP_VAR] = 3.0,
    [CTPU_OP_ARGMAX] = 1, [CTPU_OP_ARGMIN] = 1, [CTPU_OP_PROD] = 1, [CTPU_OP_CUMSUM] = 1, [CTPU_OP_SCATTER_ADD] = 1,
    [CTPU_OP_SOFTMAX] = CTPU_COST_SOFTMAX, [CTPU_OP_LOG_SOFTMAX] = CTPU_COST_SOFTMAX,
    [CTPU_OP_RAND_UNIFORM] = 1, [CTPU_OP_RAND_NORMAL] = 1, [CTPU_OP_RAND_INT] = 1,
    [CTPU_OP_EMBEDDING_BACKWARD] = 1, [CTPU_OP_GATHER_BACKWARD] = 1,   /* scatter-add */
};
#undef W_T

int ctpu_cost_attn_mms(const ctpu_node *n, const ctpu_vtype *const *in, ctpu_cost_mm *mm)
{
    if (ctpu_op_cost(n->op) != CTPU_CC_ATTN || n->n_in < 2 || in[0]->ndim != 4 || in[1]->ndim != 4) return 0;
    int th = n->attr.i64[2] == 1 ? 1 : 2;   /* T's dim: [B,T,H,Dh] (attr.i64[2] 1, attention.c) or [B,H,T,Dh] */
    int64_t bh = in[0]->shape[0] * in[0]->shape[3 - th], tq = in[0]->shape[th], d = in[0]->shape[3],
            tk = in[1]->shape[th];
    mm[0] = (ctpu_cost_mm){ bh, tq, d, tk };            /* S = Q Kᵀ */
    if (n->op == CTPU_OP_SDPA) {
        mm[1] = (ctpu_cost_mm){ bh, tq, tk, d };        /* O = P V */
        return 2;
    }
    mm[1] = (ctpu_cost_mm){ bh, tq, d, tk };            /* dP = dO Vᵀ */
    mm[2] = (ctpu_cost_mm){ bh, tk, tq, d };            /* dV = Pᵀ dO */
    mm[3] = (ctpu_cost_mm){ bh, tq, tk, d };            /* dQ = dS K */
    mm[4] = (ctpu_cost_mm){ bh, tk, tq, d };            /* dK = dSᵀ Q */
    return 5;
}

double ctpu_cost_op_weight(int op) { return op >= 0 && op < CTPU_OP_COUNT ? op_weight[op] : 0; }

void ctpu_cost_add_node(const ctpu_chip_info *c, const ctpu_node *n, const ctpu_vtype *const *in,
                        ctpu_cost_estimate *e)
{
    int op = n->op, cc = ctpu_op_cost(op);
    if (cc == CTPU_CC_MXU) {
        int64_t b, m, k, nn;
        if (ctpu_cost_matmul_dims(n, n->n_in > 0 ? in[0] : NULL, &b, &m, &k, &nn)) {
            int passes = n->attr.extra == CTPU_PRECISION_HIGHEST ? 6 : n->attr.extra == CTPU_PRECISION_HIGH ? 3 : 1;
            ctpu_cost_add_matmul(c, b, m, k, nn, passes, e);
        }
        return;
    }
    if (cc == CTPU_CC_ATTN) {
        ctpu_cost_mm mm[CTPU_COST_ATTN_MMS];
        int nm = ctpu_cost_attn_mms(n, in, mm);
        int passes = n->attr.extra == CTPU_PRECISION_HIGHEST ? 6 : n->attr.extra == CTPU_PRECISION_HIGH ? 3 : 1;
        for (int i = 0; i < nm; i++) ctpu_cost_add_matmul(c, mm[i].batch, mm[i].m, mm[i].k, mm[i].n, passes, e);
        if (nm) {
            double scores = (double)mm[0].batch * (double)mm[0].m * (double)mm[0].n;
            double ops = scores * (n->op == CTPU_OP_SDPA ? CTPU_COST_ATTN_FWD : CTPU_COST_ATTN_BWD);
            e->vector_ops += ops;
            e->vector_s += ops / (c->peak_bf16_flops / CTPU_COST_VPU_RATIO);
        }
        return;
    }
    double ops = 0;
    if (cc == CTPU_CC_OUT) ops = (double)ctpu_vtype_numel(&n->out) * op_weight[op];
    else if (cc == CTPU_CC_IN) ops = (n->n_in > 0 ? (double)ctpu_vtype_numel(in[0]) : 0) * op_weight[op];
    e->vector_ops += ops;
    e->vector_s += ops / (c->peak_bf16_flops / CTPU_COST_VPU_RATIO);
}

double ctpu_cost_bytes(const ctpu_vtype *t)
{
    return (double)ctpu_vtype_numel(t) * (double)ctpu_kdt_size(t->dtype);
}

void ctpu_cost_finish(const ctpu_chip_info *c, ctpu_cost_estimate *e)
{
    e->hbm_s = e->hbm_bytes / (c->hbm_gbps * 1e9);
    double t = e->mxu_s;
    if (e->vector_s > t) t = e->vector_s;
    if (e->hbm_s > t) t = e->hbm_s;
    e->total_s = t;
    e->mxu_utilization = e->macs_padded > 0 ? e->macs_useful / e->macs_padded : 0;
}

/* ------------------------------------------------------------ programs */
void ctpu_cost_program_begin(ctpu_cost_program *p, int n_chips, ctpu_cost_op *ops)
{
    memset(p, 0, sizeof *p);
    p->n_chips = n_chips < CTPU_COST_MAX_CHIPS ? n_chips : CTPU_COST_MAX_CHIPS;
    p->ops = ops;
}

ctpu_cost_op *ctpu_cost_program_node(ctpu_cost_program *p, const ctpu_chip_info *chips, const ctpu_node *n,
                                     const ctpu_vtype *const *in, ctpu_cost_op *op)
{
    if (!op) {
        op = &p->ops[p->n_ops++];
        memset(op, 0, sizeof *op);
        op->op = (uint16_t)n->op;
    }
    op->nodes++;
    for (int c = 0; c < p->n_chips; c++) {
        ctpu_cost_estimate one, *e = &p->chip[c];
        memset(&one, 0, sizeof one);
        ctpu_cost_add_node(&chips[c], n, in, &one);
        e->mxu_s += one.mxu_s;
        e->vector_s += one.vector_s;
        e->flops += one.flops;
        e->vector_ops += one.vector_ops;
        e->macs_useful += one.macs_useful;
        e->macs_padded += one.macs_padded;
        double s = one.mxu_s > one.vector_s ? one.mxu_s : one.vector_s;
        op->s[c] += s;
        op->s_f[c] += (float)s;
    }
    int64_t b, m, k, nn;
    ctpu_cost_mm am[CTPU_COST_ATTN_MMS];
    int na = ctpu_cost_attn_mms(n, in, am);
    for (int i = 0; i < na && p->n_mm < CTPU_COST_PROGRAM_MMS; i++) p->mm[p->n_mm++] = am[i];
    if (p->n_mm < CTPU_COST_PROGRAM_MMS && ctpu_cost_matmul_dims(n, n->n_in > 0 ? in[0] : NULL, &b, &m, &k, &nn))
        p->mm[p->n_mm++] = (ctpu_cost_mm){ b, m, k, nn };
    return op;
}

void ctpu_cost_program_finish(ctpu_cost_program *p, const ctpu_chip_info *chips, double hbm_bytes)
{
    for (int c = 0; c < p->n_chips; c++) {
        p->chip[c].hbm_bytes = hbm_bytes;
        ctpu_cost_finish(&chips[c], &p->chip[c]);
    }
}

int ctpu_cost_distinct_ops(const ctpu_node *nodes, int n)
{
    bool seen[CTPU_OP_COUNT];
    memset(seen, 0, sizeof seen);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (nodes[i].op < CTPU_OP_COUNT && !seen[nodes[i].op]) { seen[nodes[i].op] = true; k++; }
    return k;
}

static const ctpu_vtype *value_type(const ctpu_node *nodes, const ctpu_vtype *in_type, int n_in, int32_t v)
{
    return v < n_in ? &in_type[v] : &nodes[v - n_in].out;
}

void ctpu_cost_program_of(ctpu_cost_program *p, const ctpu_chip_info *chips, int n_chips, const ctpu_node *nodes,
                          int n_nodes, const ctpu_vtype *in_type, int n_in, const int32_t *outputs, int n_out,
                          ctpu_cost_op *ops)
{
    int16_t entry[CTPU_OP_COUNT];
    memset(entry, 0xff, sizeof entry);
    ctpu_cost_program_begin(p, n_chips, ops);
    for (int i = 0; i < n_nodes; i++) {
        const ctpu_node *n = &nodes[i];
        const ctpu_vtype *in[CTPU_NODE_MAX_IN];
        for (int k = 0; k < n->n_in; k++) in[k] = value_type(nodes, in_type, n_in, n->in[k]);
        int e = entry[n->op];
        ctpu_cost_op *op = ctpu_cost_program_node(p, chips, n, in, e >= 0 ? &ops[e] : NULL);
        if (e < 0) entry[n->op] = (int16_t)(op - ops);
    }
    double bytes = 0;
    for (int i = 0; i < n_in; i++) bytes += ctpu_cost_bytes(&in_type[i]);
    for (int j = 0; j < n_out; j++) bytes += ctpu_cost_bytes(value_type(nodes, in_type, n_in, outputs[j]));
    ctpu_cost_program_finish(p, chips, bytes);
}
