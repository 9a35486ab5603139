/* Roofline estimates (formula in costmodel.h). */
#include <math.h>

#include "costmodel.h"

#include <string.h>

/* x rounded up to a multiple of q, in double (extents up to INT64_MAX must
 * not overflow: the estimate is a float anyway) */
static double pad_to(int64_t x, int64_t q) { return ceil((double)x / (double)q) * (double)q; }

bool ctpu_cost_matmul_dims(const ctpu_node *n, const ctpu_vtype *a, int64_t *batch, int64_t *m, int64_t *k,
                           int64_t *nn)
{
    if (n->op != CTPU_OP_MATMUL || !a) return false;
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

static double vector_weight(int op)
{
    switch (op) {
    case CTPU_OP_EXP: case CTPU_OP_LOG: case CTPU_OP_SQRT: case CTPU_OP_RSQRT: case CTPU_OP_TANH:
    case CTPU_OP_SIGMOID: case CTPU_OP_GELU_TANH: case CTPU_OP_GELU_ERF: case CTPU_OP_POW:
    case CTPU_OP_POW_SCALAR: case CTPU_OP_DIV: case CTPU_OP_DIV_SCALAR:
        return CTPU_COST_TRANSCENDENTAL;
    default:
        return 1.0;
    }
}

void ctpu_cost_add_node(const ctpu_chip_info *c, const ctpu_node *n, const ctpu_vtype *const *in,
                        ctpu_cost_estimate *e)
{
    int op = n->op;
    if (op == CTPU_OP_MATMUL) {
        int64_t b, m, k, nn;
        if (ctpu_cost_matmul_dims(n, n->n_in > 0 ? in[0] : NULL, &b, &m, &k, &nn)) {
            int passes = n->attr.extra == CTPU_PRECISION_HIGHEST ? 6 : n->attr.extra == CTPU_PRECISION_HIGH ? 3 : 1;
            ctpu_cost_add_matmul(c, b, m, k, nn, passes, e);
        }
        return;
    }
    double ops = 0;
    if (ctpu_op_is(op, CTPU_OPK_ELEMENTWISE) || ctpu_op_is(op, CTPU_OPK_RANDOM)) {
        ops = (double)ctpu_vtype_numel(&n->out) * vector_weight(op);
    } else if (ctpu_op_is(op, CTPU_OPK_REDUCTION)) {
        double w = op == CTPU_OP_SOFTMAX || op == CTPU_OP_LOG_SOFTMAX ? CTPU_COST_SOFTMAX
                   : op == CTPU_OP_VAR                                 ? 3.0
                                                                       : 1.0;
        ops = (n->n_in > 0 ? (double)ctpu_vtype_numel(in[0]) : 0) * w;
    } else if (op == CTPU_OP_EMBEDDING_BACKWARD || op == CTPU_OP_GATHER_BACKWARD) {
        ops = (double)ctpu_vtype_numel(&n->out);   /* scatter-add */
    }
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
