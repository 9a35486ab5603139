/* The negative log-likelihood step (vm.h ctpu_nll_prog): nll_loss's and
 * cross_entropy's label path and mean, as ctpu_nll_loss / ctpu_cross_entropy
 * record it (src/nn/nn.c), in one kernel:
 *
 *   valid = ne_scalar(labels, ignore_index)        f32 [N], labels i32 [N]
 *   safe  = where(valid, labels, full_i32)          i32 [N]
 *   picked = reshape(gather(x, 1, reshape(safe, [N, 1])), [N])
 *   loss  = where(valid, neg / cast f32 of picked, full_f32)
 *   out   = sum(loss) / sum(valid)
 *
 * Bits: each value as its node's kernel gives it (the exact i32 compare and
 * select of exec.c's int path; the gather's copy, out-of-range indices
 * faulting with its message; neg, bf16 rounding and where through the
 * elementwise kernels; both sums ctpu_k_reduce over [1, N, 1] as exec_reduce
 * calls it; one f32 division). The match is exact: any other node, use or
 * shape leaves the nodes to the other groups. */
#include <stdlib.h>
#include <string.h>

#include "vm.h"

static const ctpu_vtype *vt(const ctpu_trace *t, int32_t v)
{
    return v < t->n_inputs ? &t->in_type[v] : &t->nodes[v - t->n_inputs].out;
}

static bool is_vec(const ctpu_vtype *a, int dt, int64_t N) { return a->ndim == 1 && a->shape[0] == N && a->dtype == dt; }

/* the node of [i, end) defining value v, or -1 */
static int def_in(const ctpu_trace *t, int i, int end, int32_t v)
{
    int k = v - t->n_inputs;
    return k >= i && k < end ? k : -1;
}

/* a sum of v over all its dims to a 0-d f32 value */
static bool is_total_sum(const ctpu_node *m, int32_t v)
{
    return m->op == CTPU_OP_SUM && m->in[0] == v && m->out.ndim == 0 && m->out.dtype == CTPU_KDT_F32;
}

/* Roles found from the final division back; false when [i, i + count) is
 * not exactly the pattern. */
static bool match_roles(const ctpu_trace *t, int i, int count, ctpu_nll_prog *p, int32_t *roles)
{
    int end = i + count, nin = t->n_inputs;
    const ctpu_node *D = &t->nodes[end - 1];
    if (D->op != CTPU_OP_DIV || D->out.ndim != 0 || D->out.dtype != CTPU_KDT_F32) return false;
    int sl = def_in(t, i, end, D->in[0]), sv = def_in(t, i, end, D->in[1]);
    if (sl < 0 || sv < 0 || sl == sv) return false;
    int w = def_in(t, i, end, t->nodes[sl].in[0]), v = def_in(t, i, end, t->nodes[sv].in[0]);
    if (w < 0 || v < 0 || !is_total_sum(&t->nodes[sl], nin + w) || !is_total_sum(&t->nodes[sv], nin + v)) return false;
    const ctpu_node *V = &t->nodes[v], *W = &t->nodes[w];
    if (V->op != CTPU_OP_NE_SCALAR || (V->attr.flags & CTPU_ATTR_SCALAR_FIRST) || V->out.dtype != CTPU_KDT_F32) return false;
    int32_t L = V->in[0];
    const ctpu_vtype *lt = vt(t, L);
    if (lt->ndim != 1 || lt->dtype != CTPU_KDT_I32 || def_in(t, i, end, L) >= 0) return false;
    int64_t N = lt->shape[0];
    if (W->op != CTPU_OP_WHERE || W->in[0] != nin + v || !is_vec(&W->out, CTPU_KDT_F32, N)) return false;
    int zf = def_in(t, i, end, W->in[2]);
    if (zf < 0 || t->nodes[zf].op != CTPU_OP_FULL || t->nodes[zf].out.ndim != 0 || t->nodes[zf].out.dtype != CTPU_KDT_F32)
        return false;
    /* loss <- neg and at most one cast to f32, in either order, <- reshape <- gather */
    int k = def_in(t, i, end, W->in[1]), n_neg = 0, n_cast = 0;
    bool neg_before_cast = false;   /* walking upstream: the neg found after the cast ran first */
    while (k >= 0 && (t->nodes[k].op == CTPU_OP_NEG || t->nodes[k].op == CTPU_OP_CAST)) {
        if (t->nodes[k].op == CTPU_OP_NEG) { n_neg++; neg_before_cast = n_cast > 0; }
        else if (t->nodes[k].out.dtype == CTPU_KDT_F32) n_cast++;
        else return false;
        roles[k - i] = 1;
        k = def_in(t, i, end, t->nodes[k].in[0]);
    }
    if (n_neg != 1 || n_cast > 1 || k < 0 || t->nodes[k].op != CTPU_OP_RESHAPE) return false;
    int g = def_in(t, i, end, t->nodes[k].in[0]);
    roles[k - i] = 1;
    if (g < 0 || t->nodes[g].op != CTPU_OP_GATHER || t->nodes[g].attr.extra != 1) return false;
    const ctpu_node *G = &t->nodes[g];
    const ctpu_vtype *xt = vt(t, G->in[0]);
    if (def_in(t, i, end, G->in[0]) >= 0 || xt->ndim != 2 || xt->shape[0] != N || xt->dtype == CTPU_KDT_I32) return false;
    if (G->out.ndim != 2 || G->out.shape[0] != N || G->out.shape[1] != 1 || !is_vec(&t->nodes[k].out, xt->dtype, N))
        return false;
    int r1 = def_in(t, i, end, G->in[1]);
    if (r1 < 0 || t->nodes[r1].op != CTPU_OP_RESHAPE) return false;
    int s = def_in(t, i, end, t->nodes[r1].in[0]);
    if (s < 0) return false;
    const ctpu_node *S = &t->nodes[s];
    if (S->op != CTPU_OP_WHERE || S->in[0] != nin + v || S->in[1] != L || !is_vec(&S->out, CTPU_KDT_I32, N)) return false;
    int zi = def_in(t, i, end, S->in[2]);
    if (zi < 0 || t->nodes[zi].op != CTPU_OP_FULL || t->nodes[zi].out.ndim != 0 || t->nodes[zi].out.dtype != CTPU_KDT_I32)
        return false;
    int named[] = { end - 1, sl, sv, w, v, zf, g, r1, s, zi };
    for (int q = 0; q < 10; q++) roles[named[q] - i] = 1;
    p->N = N;
    p->C = xt->shape[1];
    p->x_dtype = xt->dtype;
    p->neg_in_x_dtype = n_cast == 0 || neg_before_cast;
    p->x_val = G->in[0];
    p->label_val = L;
    p->node_ne = v;
    p->node_full_i = zi;
    p->node_full_f = zf;
    return true;
}

int ctpu_nll_match(const ctpu_trace *t, int i, const int32_t *uses, ctpu_nll_prog *p)
{
    int nin = t->n_inputs;
    for (int count = 12; count <= 13 && i + count <= t->n_nodes; count++) {   /* 13: with the cast */
        int32_t roles[13] = { 0 };
        if (!match_roles(t, i, count, p, roles)) continue;
        bool ok = true;
        for (int q = 0; q < count; q++) ok &= roles[q] == 1;
        /* every value but the last read only inside the group (an output counts 2: never) */
        for (int q = i; q < i + count - 1 && ok; q++) {
            int reads = 0;
            for (int r = i; r < i + count; r++)
                for (int a = 0; a < t->nodes[r].n_in; a++) reads += t->nodes[r].in[a] == nin + q;
            ok = reads == uses[nin + q];
        }
        if (ok) return i + count;
    }
    return -1;
}

/* the gather's fault, as exec_gather words it */
static void nll_fault(ctpu_exec_ctx *ctx, const ctpu_nll_prog *p, int64_t nbad, int64_t pos, int64_t val)
{
    ctx->fault_status = CTPU_ERR_DEVICE_FAULT;
    snprintf(ctx->fault_msg, sizeof ctx->fault_msg,
             "gather: index %lld at position %lld is out of range [0, %lld) along dim 1 (%lld bad %s)", (long long)val,
             (long long)pos, (long long)p->C, (long long)nbad, nbad == 1 ? "index" : "indices");
}

void ctpu_nll_exec(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_nll_prog *p = data;
    const double *sc = ctx->scalars;
    int64_t N = p->N, nbad = 0, bad_pos = 0, bad_val = 0;
    float *mem = malloc(sizeof(float) * (size_t)(3 * N + 1));
    if (!mem) {
        ctx->fault_status = CTPU_ERR_OOM;
        snprintf(ctx->fault_msg, sizeof ctx->fault_msg, "fused program: out of host memory for nll_loss");
        return;
    }
    float *valid = mem, *loss = mem + N, *zero = mem + 2 * N;
    const int32_t *lab = ctx->ptr[p->label_slot];
    const char *x = ctx->ptr[p->x_slot];
    double ign = sc[p->sc_ne], fi = sc[p->sc_full_i];
    int32_t zi = fi != fi ? 0 : fi >= 2147483647.0 ? INT32_MAX : fi <= -2147483648.0 ? INT32_MIN : (int32_t)fi;
    float zf = (float)sc[p->sc_full_f];
    for (int64_t r = 0; r < N; r++) {
        valid[r] = (float)((double)lab[r] != ign);                   /* ne_scalar, the int path */
        int64_t s = valid[r] != 0.0f ? lab[r] : zi;                  /* where (i32) */
        if (s < 0 || s >= p->C) {
            if (nbad++ == 0) { bad_pos = r; bad_val = s; }
            loss[r] = 0.0f;
        } else if (p->x_dtype == CTPU_KDT_BF16) {
            loss[r] = ctpu_bf16_to_f32(((const uint16_t *)x)[r * p->C + s]);
        } else {
            loss[r] = ((const float *)x)[r * p->C + s];
        }
        zero[r] = zf;
    }
    ctpu_k_unary(CTPU_K_U_NEG, loss, loss, N);
    if (p->x_dtype == CTPU_KDT_BF16 && p->neg_in_x_dtype) ctpu_k_unary(CTPU_K_U_ROUND_BF16, loss, loss, N);
    ctpu_k_where(valid, loss, zero, loss, N);
    float sl, sv, y;
    ctpu_k_reduce(CTPU_K_RED_SUM, loss, 1, N, 1, &sl, ctx->pool);
    ctpu_k_reduce(CTPU_K_RED_SUM, valid, 1, N, 1, &sv, ctx->pool);
    ctpu_k_binary(CTPU_K_B_DIV, &sl, &sv, &y, 1);
    *(float *)ctx->ptr[p->out_slot] = y;
    free(mem);
    if (nbad) nll_fault(ctx, p, nbad, bad_pos, bad_val);
}
