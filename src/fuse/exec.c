/* Kernel entries: one per op kind, run by the executor on the device thread.
 * A step's data (ctpu_step_data) is validated when the program is built, so
 * these run unchecked (STYLE.md "Validate once, run unchecked"). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "dist/dist.h"

/* ------------------------------------------------------------ helpers */
static void contig_strides(const ctpu_vtype *t, int64_t *st)
{
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) { st[d] = s; s *= t->shape[d]; }
}

static inline double bits_to_double(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }
static inline uint64_t double_to_bits(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
uint64_t ctpu_scalar_bits(double d) { return double_to_bits(d); }
double ctpu_bits_scalar(uint64_t u) { return bits_to_double(u); }

static void to_f32(const void *src, int dt, float *dst, int64_t n)
{
    if (dt == CTPU_KDT_F32) memcpy(dst, src, (size_t)n * 4);
    else if (dt == CTPU_KDT_BF16) ctpu_k_bf16_to_f32(src, dst, n);
    else ctpu_k_i32_to_f32(src, dst, n);
}

void ctpu_from_f32(const float *src, int dt, void *dst, int64_t n)
{
    if (dt == CTPU_KDT_F32) { if ((const void *)src != dst) memmove(dst, src, (size_t)n * 4); }
    else if (dt == CTPU_KDT_BF16) ctpu_k_f32_to_bf16(src, dst, n);
    else ctpu_k_f32_to_i32(src, dst, n);
}

static inline float load_f32(const void *p, int dt, int64_t i)
{
    if (dt == CTPU_KDT_F32) return ((const float *)p)[i];
    if (dt == CTPU_KDT_BF16) return ctpu_bf16_to_f32(((const uint16_t *)p)[i]);
    return (float)((const int32_t *)p)[i];
}

/* --------------------------------------------------- elementwise engine
 * Broadcast strides of each operand against the output, adjacent dims
 * collapsed; then the output is walked in blocks of CTPU_K_BLOCK elements
 * (numexpr's design): operands are loaded into f32 blocks, the kernel runs
 * on the block, the result is stored with one rounding to the output dtype. */
void ctpu_bcast_plan_make(const ctpu_vtype *out, const ctpu_vtype *const *ins, int n_in, bcast_plan *p)
{
    int nd = out->ndim;
    int64_t st[CTPU_BCAST_MAX][8];
    p->n_in = n_in;
    for (int i = 0; i < n_in; i++) {
        const ctpu_vtype *in = ins[i];
        int64_t cs[8];
        contig_strides(in, cs);
        for (int d = 0; d < nd; d++) {
            int id = d - (nd - in->ndim);
            st[i][d] = (id < 0 || in->shape[id] == 1) ? 0 : cs[id];
        }
    }
    /* collapse dims d and d+1 when every operand is "continuous" across them */
    int64_t shape[8];
    int64_t cst[CTPU_BCAST_MAX][8];
    int k = 0;
    for (int d = 0; d < nd; d++) {
        if (out->shape[d] == 1) continue;   /* extent-1 dims carry nothing */
        if (k > 0) {
            bool ok = true;
            for (int i = 0; i < n_in; i++)
                if (cst[i][k - 1] != st[i][d] * out->shape[d]) { ok = false; break; }
            if (ok) {
                shape[k - 1] *= out->shape[d];
                for (int i = 0; i < n_in; i++) cst[i][k - 1] = st[i][d];
                continue;
            }
        }
        shape[k] = out->shape[d];
        for (int i = 0; i < n_in; i++) cst[i][k] = st[i][d];
        k++;
    }
    p->nd = k;
    memcpy(p->shape, shape, sizeof(int64_t) * (size_t)k);
    for (int i = 0; i < n_in; i++) {
        memcpy(p->stride[i], cst[i], sizeof(int64_t) * (size_t)k);
        bool zero = true, contig = true;
        int64_t s = 1;
        for (int d = k - 1; d >= 0; d--) {
            if (cst[i][d] != 0) zero = false;
            if (cst[i][d] != s) contig = false;
            s *= shape[d];
        }
        p->mode[i] = contig ? 0 : zero ? 1 : 2;
    }
}

static void plan_bcast(const ctpu_step_data *sd, bcast_plan *p)
{
    const ctpu_vtype *ins[CTPU_BCAST_MAX];
    for (int i = 0; i < sd->node.n_in; i++) ins[i] = &sd->in[i];
    ctpu_bcast_plan_make(&sd->node.out, ins, sd->node.n_in, p);
}

static void load_strided(const void *base, int dt, const bcast_plan *p, int opnd, int64_t start,
                         int64_t n, float *dst)
{
    int nd = p->nd;
    int64_t idx[8], off = 0, rem = start;
    const int64_t *st = p->stride[opnd];
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = rem % p->shape[d];
        rem /= p->shape[d];
        off += idx[d] * st[d];
    }
    int64_t last = p->shape[nd - 1], ls = st[nd - 1];
    for (int64_t k = 0; k < n;) {
        int64_t run = last - idx[nd - 1];
        if (run > n - k) run = n - k;
        if (ls == 0) {
            float v = load_f32(base, dt, off);
            for (int64_t j = 0; j < run; j++) dst[k + j] = v;
        } else if (ls == 1) {
            const char *b = (const char *)base + (size_t)off * ctpu_kdt_size(dt);
            to_f32(b, dt, dst + k, run);
        } else {
            for (int64_t j = 0; j < run; j++) dst[k + j] = load_f32(base, dt, off + j * ls);
        }
        k += run;
        off += run * ls;
        idx[nd - 1] += run;
        for (int d = nd - 1; d > 0 && idx[d] == p->shape[d]; d--) {
            off -= idx[d] * st[d];
            idx[d] = 0;
            idx[d - 1]++;
            off += st[d - 1];
        }
    }
}

/* Load operand `opnd` for output elements [start, start+n) as f32. Returns a
 * pointer to the data (dst, or the operand itself when it is contiguous f32). */
const float *ctpu_load_block(const void *base, int dt, const bcast_plan *p, int opnd,
                               int64_t start, int64_t n, float *dst)
{
    if (p->nd == 0 || p->mode[opnd] == 1) {
        float v = load_f32(base, dt, 0);
        for (int64_t j = 0; j < n; j++) dst[j] = v;
        return dst;
    }
    if (p->mode[opnd] == 0) {
        if (dt == CTPU_KDT_F32) return (const float *)base + start;
        to_f32((const char *)base + (size_t)start * ctpu_kdt_size(dt), dt, dst, n);
        return dst;
    }
    load_strided(base, dt, p, opnd, start, n, dst);
    return dst;
}

typedef struct {
    const ctpu_step_data *sd;
    ctpu_exec_ctx *ctx;
    bcast_plan plan;
    int64_t total;
} ew_job;

static void ew_compute_float(const ctpu_step_data *sd, const float *const *x, float *y, int64_t n,
                             const double *scal)
{
    const ctpu_node *nd = &sd->node;
    uint32_t kind = ctpu_op_infos[nd->op].kind;
    int kop = ctpu_op_infos[nd->op].kop;
    if (kind & CTPU_OPK_UNARY) ctpu_k_unary((ctpu_k_unary_op)kop, x[0], y, n);
    else if (kind & CTPU_OPK_BINARY) ctpu_k_binary((ctpu_k_binary_op)kop, x[0], x[1], y, n);
    else if (kind & CTPU_OPK_SCALAR)
        ctpu_k_binary_scalar((ctpu_k_binary_op)kop, x[0], (float)scal[sd->scalar_base],
                             (nd->attr.flags & CTPU_ATTR_SCALAR_FIRST) != 0, y, n);
    else if (kop == CTPU_K_E_WHERE) ctpu_k_where(x[0], x[1], x[2], y, n);
    else if (kop == CTPU_K_E_CLAMP)
        ctpu_k_clamp(x[0], (float)scal[sd->scalar_base], (float)scal[sd->scalar_base + 1], y, n);
    else /* CTPU_K_E_CAST */ memcpy(y, x[0], (size_t)n * 4);
}

/* i32 results (and i32-vs-i32 comparisons) are computed exactly in int64
 * (wrapping to int32 as PyTorch does); scalars in double. */
static inline int64_t load_i64(const void *p, int dt, int64_t i)
{
    if (dt == CTPU_KDT_I32) return ((const int32_t *)p)[i];
    return (int64_t)ctpu_f32_to_i32(load_f32(p, dt, i));
}

static void ew_compute_int(const ctpu_step_data *sd, const void *const *in, const bcast_plan *p,
                           int64_t start, int64_t n, void *out, const double *scal)
{
    const ctpu_node *nd = &sd->node;
    uint32_t kind = ctpu_op_infos[nd->op].kind;
    int kop = ctpu_op_infos[nd->op].kop;
    int64_t idx[8] = {0};
    int nin = nd->n_in;
    int64_t rem = start;
    for (int d = p->nd - 1; d >= 0; d--) { idx[d] = rem % p->shape[d]; rem /= p->shape[d]; }
    for (int64_t j = 0; j < n; j++) {
        int64_t off[4] = {0};
        for (int i = 0; i < nin; i++)
            for (int d = 0; d < p->nd; d++) off[i] += idx[d] * p->stride[i][d];
        int64_t a = nin > 0 ? load_i64(in[0], sd->in[0].dtype, off[0]) : 0;
        int64_t b = nin > 1 ? load_i64(in[1], sd->in[1].dtype, off[1]) : 0;
        double r = 0;
        bool is_int = true;
        int64_t ri = 0;
        if (kind & (CTPU_OPK_BINARY | CTPU_OPK_SCALAR)) {
            double bs = (kind & CTPU_OPK_SCALAR) ? scal[sd->scalar_base] : (double)b;
            double ad = (double)a;
            if ((kind & CTPU_OPK_SCALAR) && (nd->attr.flags & CTPU_ATTR_SCALAR_FIRST)) {
                double t = ad; ad = bs; bs = t;
            }
            bool scalar = (kind & CTPU_OPK_SCALAR) != 0;
            switch (kop) {
            case CTPU_K_B_ADD: if (scalar) { r = ad + bs; is_int = false; } else ri = (int64_t)((uint64_t)a + (uint64_t)b); break;
            case CTPU_K_B_SUB: if (scalar) { r = ad - bs; is_int = false; } else ri = (int64_t)((uint64_t)a - (uint64_t)b); break;
            case CTPU_K_B_MUL: if (scalar) { r = ad * bs; is_int = false; } else ri = (int64_t)((uint64_t)a * (uint64_t)b); break;
            case CTPU_K_B_MAX: r = ad > bs ? ad : bs; is_int = false; break;
            case CTPU_K_B_MIN: r = ad < bs ? ad : bs; is_int = false; break;
            case CTPU_K_B_EQ: r = ad == bs; is_int = false; break;
            case CTPU_K_B_NE: r = ad != bs; is_int = false; break;
            case CTPU_K_B_LT: r = ad < bs; is_int = false; break;
            case CTPU_K_B_LE: r = ad <= bs; is_int = false; break;
            case CTPU_K_B_GT: r = ad > bs; is_int = false; break;
            case CTPU_K_B_GE: r = ad >= bs; is_int = false; break;
            default: r = 0; is_int = false; break;
            }
        } else if ((kind & CTPU_OPK_UNARY) && kop == CTPU_K_U_NEG) {
            ri = (int64_t)(0 - (uint64_t)a);
        } else if ((kind & CTPU_OPK_UNARY) && kop == CTPU_K_U_ABS) {
            ri = a < 0 ? (int64_t)(0 - (uint64_t)a) : a;
        } else if ((kind & CTPU_OPK_UNARY) && kop == CTPU_K_U_RELU) {
            ri = a > 0 ? a : 0;
        } else if (kind & CTPU_OPK_TERNARY) {   /* where */
            float c = load_f32(in[0], sd->in[0].dtype, off[0]);
            int64_t bb = load_i64(in[2], sd->in[2].dtype, off[2]);
            int64_t aa = load_i64(in[1], sd->in[1].dtype, off[1]);
            ri = c != 0.0f || c != c ? aa : bb;
        } else if (!(kind & CTPU_OPK_UNARY) && kop == CTPU_K_E_CLAMP) {
            double lo = scal[sd->scalar_base], hi = scal[sd->scalar_base + 1];
            double v = (double)a;
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
            r = v;
            is_int = false;
        } else { /* CAST to i32 from i32 */
            ri = a;
        }
        if (nd->out.dtype == CTPU_KDT_I32) {
            int32_t v;
            if (is_int) v = (int32_t)(uint32_t)(uint64_t)ri;
            else v = r != r ? 0 : r >= 2147483647.0 ? INT32_MAX : r <= -2147483648.0 ? INT32_MIN : (int32_t)r;
            ((int32_t *)out)[start + j] = v;
        } else {
            float v = is_int ? (float)ri : (float)r;
            if (nd->out.dtype == CTPU_KDT_F32) ((float *)out)[start + j] = v;
            else ((uint16_t *)out)[start + j] = ctpu_f32_to_bf16(v);
        }
        for (int d = p->nd - 1; d >= 0; d--) {
            if (++idx[d] < p->shape[d]) break;
            idx[d] = 0;
        }
    }
}

static bool ew_int_path(const ctpu_step_data *sd)
{
    const ctpu_node *nd = &sd->node;
    if (nd->out.dtype == CTPU_KDT_I32) return true;
    if (ctpu_op_is(nd->op, CTPU_OPK_COMPARE)) {
        for (int i = 0; i < nd->n_in; i++)
            if (sd->in[i].dtype != CTPU_KDT_I32) return false;
        return true;
    }
    return false;
}

static void ew_range(ew_job *j, int64_t b0, int64_t b1)
{
    const ctpu_step_data *sd = j->sd;
    ctpu_exec_ctx *ctx = j->ctx;
    const void *in[4];
    for (int i = 0; i < sd->node.n_in; i++) in[i] = ctx->ptr[sd->in_slot[i]];
    void *out = ctx->ptr[sd->out_slot];
    int odt = sd->node.out.dtype;
    if (ew_int_path(sd)) {
        ew_compute_int(sd, in, &j->plan, b0, b1 - b0, out, ctx->scalars);
        return;
    }
    float tmp[4][CTPU_K_BLOCK];
    float ybuf[CTPU_K_BLOCK];
    for (int64_t s = b0; s < b1; s += CTPU_K_BLOCK) {
        int64_t n = b1 - s < CTPU_K_BLOCK ? b1 - s : CTPU_K_BLOCK;
        const float *x[4];
        for (int i = 0; i < sd->node.n_in; i++)
            x[i] = ctpu_load_block(in[i], sd->in[i].dtype, &j->plan, i, s, n, tmp[i]);
        float *y = odt == CTPU_KDT_F32 ? (float *)out + s : ybuf;
        ew_compute_float(sd, x, y, n, ctx->scalars);
        if (odt != CTPU_KDT_F32) ctpu_from_f32(y, odt, (char *)out + (size_t)s * ctpu_kdt_size(odt), n);
    }
}

static void ew_task(void *p, int tid, int nt)
{
    ew_job *j = p;
    int64_t nblocks = (j->total + CTPU_K_BLOCK - 1) / CTPU_K_BLOCK;
    int64_t b0 = nblocks * tid / nt, b1 = nblocks * (tid + 1) / nt;
    int64_t e0 = b0 * CTPU_K_BLOCK, e1 = b1 * CTPU_K_BLOCK;
    if (e1 > j->total) e1 = j->total;
    if (e0 < e1) ew_range(j, e0, e1);
}

static void exec_elementwise(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    ew_job j = { sd, ctx, {0}, ctpu_vtype_numel(&sd->node.out) };
    if (j.total == 0) return;
    plan_bcast(sd, &j.plan);
    if (j.total >= (1 << 16) && ctx->pool && ctx->pool->nthreads > 1 && !ew_int_path(sd))
        ctx->pool->run(ctx->pool, ew_task, &j);
    else
        ew_range(&j, 0, j.total);
}

/* ------------------------------------------------------------ reductions */
/* Bring x (type t) into f32 with the reduced dims (mask) gathered: returns
 * [outer, n, inner] views. Allocates *tmp when a copy is needed. */
static const float *reduce_layout(const void *x, const ctpu_vtype *t, uint32_t mask, int64_t *outer,
                                  int64_t *n, int64_t *inner, float **tmp)
{
    int nd = t->ndim;
    int first = -1, last = -1;
    for (int d = 0; d < nd; d++)
        if (mask & (1u << d)) { if (first < 0) first = d; last = d; }
    bool contiguous_group = true;
    for (int d = first; d >= 0 && d <= last; d++)
        if (!(mask & (1u << d)) && t->shape[d] != 1) contiguous_group = false;
    int64_t numel = ctpu_vtype_numel(t);
    *tmp = NULL;
    if (first < 0) { *outer = numel; *n = 1; *inner = 1; }
    else if (contiguous_group) {
        int64_t o = 1, r = 1, i = 1;
        for (int d = 0; d < first; d++) o *= t->shape[d];
        for (int d = first; d <= last; d++) r *= t->shape[d];
        for (int d = last + 1; d < nd; d++) i *= t->shape[d];
        *outer = o; *n = r; *inner = i;
    } else {
        /* move reduced dims last (kept order preserved) */
        int perm[8], k = 0;
        int64_t cs[8], shape[8], sst[8], dst_st[8];
        contig_strides(t, cs);
        int64_t o = 1, r = 1;
        for (int d = 0; d < nd; d++) if (!(mask & (1u << d))) { perm[k++] = d; o *= t->shape[d]; }
        for (int d = 0; d < nd; d++) if (mask & (1u << d)) { perm[k++] = d; r *= t->shape[d]; }
        for (int d = 0; d < nd; d++) { shape[d] = t->shape[perm[d]]; sst[d] = cs[perm[d]]; }
        int64_t s = 1;
        for (int d = nd - 1; d >= 0; d--) { dst_st[d] = s; s *= shape[d]; }
        *tmp = malloc((size_t)(numel ? numel : 1) * 4);
        if (!*tmp) return NULL;
        if (t->dtype == CTPU_KDT_F32) {
            ctpu_k_strided_copy(x, sst, *tmp, dst_st, shape, nd, 4);
        } else {
            float *conv = malloc((size_t)(numel ? numel : 1) * 4);
            if (!conv) { free(*tmp); *tmp = NULL; return NULL; }
            to_f32(x, t->dtype, conv, numel);
            ctpu_k_strided_copy(conv, sst, *tmp, dst_st, shape, nd, 4);
            free(conv);
        }
        *outer = o; *n = r; *inner = 1;
        return *tmp;
    }
    if (t->dtype == CTPU_KDT_F32) return x;
    *tmp = malloc((size_t)(numel ? numel : 1) * 4);
    if (!*tmp) return NULL;
    to_f32(x, t->dtype, *tmp, numel);
    return *tmp;
}

static uint32_t dims_mask(const ctpu_attrs *a)
{
    uint32_t m = 0;
    for (int i = 0; i < a->n_dims; i++) m |= 1u << a->dims[i];
    return m;
}

/* i32 max/min/argmax compare the integers themselves: through f32,
 * 16777217 and 16777216 would tie. Visits the input in order, so the first
 * maximal index wins. */
static void exec_reduction_i32(const ctpu_step_data *sd, ctpu_exec_ctx *ctx, bool is_arg, bool is_min)
{
    const ctpu_node *nd = &sd->node;
    const ctpu_vtype *t = &sd->in[0];
    const int32_t *x = ctx->ptr[sd->in_slot[0]];
    int32_t *out = ctx->ptr[sd->out_slot];
    uint32_t mask = dims_mask(&nd->attr);
    int64_t on = ctpu_vtype_numel(&nd->out), n = ctpu_vtype_numel(t);
    int32_t *best = is_arg ? malloc((size_t)(on ? on : 1) * 4) : out;
    bool *seen = calloc((size_t)(on ? on : 1), 1);
    int rd = is_arg && nd->attr.n_dims ? nd->attr.dims[0] : -1;
    int64_t coord[8] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t o = 0;
        for (int d = 0; d < t->ndim; d++)
            if (!(mask & (1u << d))) o = o * t->shape[d] + coord[d];
        int32_t v = x[i];
        if (!seen[o] || (is_min ? v < best[o] : v > best[o])) {
            seen[o] = true;
            best[o] = v;
            if (is_arg) out[o] = rd >= 0 ? (int32_t)coord[rd] : 0;
        }
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++coord[d] < t->shape[d]) break;
            coord[d] = 0;
        }
    }
    if (is_arg) free(best);
    free(seen);
}

/* A float reduction's operands: the input as [outer, n, inner] f32 (x; tmp
 * when a copy was made) and the f32 result y (the output itself when f32). */
typedef struct {
    void *out;
    const float *x;
    float *tmp, *y;
    int64_t outer, n, inner, on;
} red_io;

/* A host temporary of the reduction family that could not be allocated: the
 * step's fault (out of host memory), nothing computed. */
static bool red_oom(const ctpu_step_data *sd, ctpu_exec_ctx *ctx, int64_t elems)
{
    ctx->fault_status = CTPU_ERR_OOM;
    snprintf(ctx->fault_msg, sizeof ctx->fault_msg, "%s: out of host memory for a %lld-element temporary",
             ctpu_op_name(sd->node.op), (long long)elems);
    return false;
}

static bool red_begin(const ctpu_step_data *sd, ctpu_exec_ctx *ctx, red_io *r)
{
    const ctpu_node *nd = &sd->node;
    r->out = ctx->ptr[sd->out_slot];
    r->x = reduce_layout(ctx->ptr[sd->in_slot[0]], &sd->in[0], dims_mask(&nd->attr), &r->outer, &r->n,
                         &r->inner, &r->tmp);
    r->y = NULL;
    if (!r->x) return red_oom(sd, ctx, ctpu_vtype_numel(&sd->in[0]));
    r->on = r->outer * r->inner;
    r->y = nd->out.dtype == CTPU_KDT_F32 ? r->out : malloc((size_t)(r->on ? r->on : 1) * 4);
    if (!r->y) {
        free(r->tmp);
        return red_oom(sd, ctx, r->on);
    }
    return true;
}

/* y into the output's dtype (store false: the kernel wrote the output itself) */
static void red_end(const ctpu_step_data *sd, red_io *r, bool store)
{
    if (r->y != r->out) {
        if (store) ctpu_from_f32(r->y, sd->node.out.dtype, r->out, r->on);
        free(r->y);
    }
    free(r->tmp);
}

/* sum, max, min: the op's kernel reduction */
static void exec_reduce(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    int kop = ctpu_op_kop(sd->node.op);
    if (sd->in[0].dtype == CTPU_KDT_I32 && (kop == CTPU_K_RED_MAX || kop == CTPU_K_RED_MIN)) {
        exec_reduction_i32(sd, ctx, false, kop == CTPU_K_RED_MIN);
        return;
    }
    red_io r;
    if (!red_begin(sd, ctx, &r)) return;
    ctpu_k_reduce((ctpu_k_red_op)kop, r.x, r.outer, r.n, r.inner, r.y, ctx->pool);
    red_end(sd, &r, true);
}

static void exec_mean(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    red_io r;
    if (!red_begin(sd, ctx, &r)) return;
    ctpu_k_reduce(CTPU_K_RED_SUM, r.x, r.outer, r.n, r.inner, r.y, ctx->pool);
    ctpu_k_binary_scalar(CTPU_K_B_DIV, r.y, (float)r.n, false, r.y, r.on);
    red_end(sd, &r, true);
}

static void exec_var(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    red_io r;
    if (!red_begin(sd, ctx, &r)) return;
    float *mean = malloc((size_t)(r.on ? r.on : 1) * 4);
    if (!mean) {
        red_end(sd, &r, false);
        red_oom(sd, ctx, r.on);
        return;
    }
    ctpu_k_reduce(CTPU_K_RED_SUM, r.x, r.outer, r.n, r.inner, mean, ctx->pool);
    ctpu_k_binary_scalar(CTPU_K_B_DIV, mean, (float)r.n, false, mean, r.on);
    ctpu_k_sqdev(r.x, mean, r.outer, r.n, r.inner, r.y, ctx->pool);
    /* torch: divide by max(0, n - correction), so n <= correction gives NaN, not -0 */
    int64_t den = r.n - sd->node.attr.i64[0];
    ctpu_k_binary_scalar(CTPU_K_B_DIV, r.y, (float)(den > 0 ? den : 0), false, r.y, r.on);
    free(mean);
    red_end(sd, &r, true);
}

/* argmax and argmin */
static void exec_argmax(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    bool is_min = sd->node.op == CTPU_OP_ARGMIN;
    if (sd->in[0].dtype == CTPU_KDT_I32) {
        exec_reduction_i32(sd, ctx, true, is_min);
        return;
    }
    red_io r;
    if (!red_begin(sd, ctx, &r)) return;
    ctpu_k_argmax(r.x, r.outer, r.n, r.inner, (int32_t *)r.out, is_min);
    red_end(sd, &r, false);
}

/* cumsum along attr.dims[0] (from the end with CTPU_ATTR_REVERSE): per
 * [outer, len, inner] column an f32 accumulator from +0, one rounding per
 * addition, each partial sum stored (rounded to the output dtype). */
static void exec_cumsum(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const ctpu_node *nd = &sd->node;
    const ctpu_vtype *t = &sd->in[0];
    int64_t numel = ctpu_vtype_numel(t);
    if (numel == 0) return;
    int d = t->ndim ? nd->attr.dims[0] : 0;
    int64_t len = t->ndim ? t->shape[d] : 1, inner = 1;
    for (int k = d + 1; k < t->ndim; k++) inner *= t->shape[k];
    int64_t outer = numel / (len * inner);
    bool rev = (nd->attr.flags & CTPU_ATTR_REVERSE) != 0;
    const void *x = ctx->ptr[sd->in_slot[0]];
    void *out = ctx->ptr[sd->out_slot];
    float *y = nd->out.dtype == CTPU_KDT_F32 ? out : malloc((size_t)numel * 4);
    if (!y) return;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < len; k++) {
                int64_t j = rev ? len - 1 - k : k;
                int64_t at = (o * len + j) * inner + i;
                acc += load_f32(x, t->dtype, at);
                y[at] = acc;
            }
        }
    if (y != out) {
        ctpu_from_f32(y, nd->out.dtype, out, numel);
        free(y);
    }
}

/* softmax's input as f32 rows [outer*inner, n] (the softmax dim last):
 * the input itself when it already is, else a new buffer (NULL: no memory). */
static float *softmax_input(const void *xin, int dtype, int64_t numel, int64_t n, int64_t inner)
{
    if (dtype == CTPU_KDT_F32 && inner == 1) return (float *)xin;
    float *xf = malloc((size_t)numel * 4);
    if (!xf) return NULL;
    if (inner == 1) {
        to_f32(xin, dtype, xf, numel);
        return xf;
    }
    /* [outer, n, inner] -> [outer, inner, n] */
    float *conv = NULL;
    const float *src = xin;
    if (dtype != CTPU_KDT_F32) {
        conv = malloc((size_t)numel * 4);
        if (!conv) { free(xf); return NULL; }
        to_f32(xin, dtype, conv, numel);
        src = conv;
    }
    int64_t outer = numel / (n * inner);
    int64_t shape[3] = { outer, inner, n }, sst[3] = { n * inner, 1, inner }, dst[3] = { n * inner, n, 1 };
    ctpu_k_strided_copy(src, sst, xf, dst, shape, 3, 4);
    free(conv);
    return xf;
}

static void softmax_rows(const ctpu_step_data *sd, ctpu_exec_ctx *ctx, bool log)
{
    const ctpu_node *nd = &sd->node;
    const ctpu_vtype *t = &sd->in[0];
    int dim = nd->attr.dims[0];
    int64_t numel = ctpu_vtype_numel(t);
    if (numel == 0) return;
    void *out = ctx->ptr[sd->out_slot];
    const void *xin = ctx->ptr[sd->in_slot[0]];
    int64_t n = t->shape[dim], inner = 1;
    for (int d = dim + 1; d < t->ndim; d++) inner *= t->shape[d];
    int64_t rows = numel / n;
    float *xf = softmax_input(xin, t->dtype, numel, n, inner);
    if (!xf) goto oom;
    /* f32 rows: straight into the output (the kernel may run in place) */
    bool direct = inner == 1 && nd->out.dtype == CTPU_KDT_F32;
    float *y = direct ? out : malloc((size_t)numel * 4);
    if (!y) {
        if (xf != xin) free(xf);
        goto oom;
    }
    ctpu_k_softmax(xf, rows, n, y, log, ctx->pool);
    if (direct) {
        /* written */
    } else if (inner == 1) {
        ctpu_from_f32(y, nd->out.dtype, out, numel);
    } else {
        int64_t outer = numel / (n * inner);
        int64_t shape[3] = { outer, n, inner }, sst[3] = { n * inner, 1, n }, dst[3] = { n * inner, inner, 1 };
        ctpu_k_strided_copy(y, sst, xf, dst, shape, 3, 4);
        ctpu_from_f32(xf, nd->out.dtype, out, numel);
    }
    if (!direct) free(y);
    if (xf != xin) free(xf);
    return;
oom:
    red_oom(sd, ctx, numel);
}

static void exec_softmax(const void *data, ctpu_exec_ctx *ctx) { softmax_rows(data, ctx, false); }
static void exec_log_softmax(const void *data, ctpu_exec_ctx *ctx) { softmax_rows(data, ctx, true); }

/* ------------------------------------------------------------ movement */
static void exec_copy(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    size_t bytes = (size_t)ctpu_vtype_numel(&sd->node.out) * ctpu_kdt_size(sd->node.out.dtype);
    void *dst = ctx->ptr[sd->out_slot];
    const void *src = ctx->ptr[sd->in_slot[0]];
    if (dst != src && bytes) memmove(dst, src, bytes);
}

static void exec_permute(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const ctpu_node *nd = &sd->node;
    int64_t cs[8], sst[8], dst[8];
    contig_strides(&sd->in[0], cs);
    for (int d = 0; d < nd->out.ndim; d++) sst[d] = cs[nd->attr.dims[d]];
    contig_strides(&nd->out, dst);
    if (ctpu_vtype_numel(&nd->out) == 0) return;
    ctpu_k_strided_copy(ctx->ptr[sd->in_slot[0]], sst, ctx->ptr[sd->out_slot], dst, nd->out.shape,
                        nd->out.ndim, ctpu_kdt_size(nd->out.dtype));
}

static void exec_slice(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const ctpu_node *nd = &sd->node;
    int dim = nd->attr.dims[0];
    int64_t start = nd->attr.i64[0], step = nd->attr.i64[2];
    int64_t cs[8], dst[8];
    contig_strides(&sd->in[0], cs);
    contig_strides(&nd->out, dst);
    if (ctpu_vtype_numel(&nd->out) == 0) return;
    size_t es = ctpu_kdt_size(nd->out.dtype);
    const char *src = (const char *)ctx->ptr[sd->in_slot[0]] + (size_t)(start * cs[dim]) * es;
    cs[dim] *= step;
    ctpu_k_strided_copy(src, cs, ctx->ptr[sd->out_slot], dst, nd->out.shape, nd->out.ndim, es);
}

static void exec_concat(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const ctpu_node *nd = &sd->node;
    int dim = nd->attr.extra;
    int64_t dst[8];
    contig_strides(&nd->out, dst);
    size_t es = ctpu_kdt_size(nd->out.dtype);
    int64_t at = 0;
    for (int i = 0; i < nd->n_in; i++) {
        const ctpu_vtype *t = &sd->in[i];
        int64_t cs[8];
        contig_strides(t, cs);
        if (ctpu_vtype_numel(t) > 0)
            ctpu_k_strided_copy(ctx->ptr[sd->in_slot[i]], cs,
                                (char *)ctx->ptr[sd->out_slot] + (size_t)(at * dst[dim]) * es, dst,
                                t->shape, t->ndim, es);
        at += t->shape[dim];
    }
}

static void exec_expand(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const ctpu_node *nd = &sd->node;
    const ctpu_vtype *t = &sd->in[0];
    int64_t cs[8], sst[8], dst[8];
    contig_strides(t, cs);
    int nd_out = nd->out.ndim;
    for (int d = 0; d < nd_out; d++) {
        int id = d - (nd_out - t->ndim);
        sst[d] = (id < 0 || t->shape[id] == 1) ? 0 : cs[id];
    }
    contig_strides(&nd->out, dst);
    if (ctpu_vtype_numel(&nd->out) == 0) return;
    ctpu_k_strided_copy(ctx->ptr[sd->in_slot[0]], sst, ctx->ptr[sd->out_slot], dst, nd->out.shape,
                        nd_out, ctpu_kdt_size(nd->out.dtype));
}

static void exec_embedding(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const ctpu_vtype *w = &sd->in[0];
    int64_t n = ctpu_vtype_numel(&sd->in[1]);
    int64_t bad_pos = 0, bad_val = 0;
    int64_t bad = ctpu_k_embedding(ctx->ptr[sd->in_slot[0]], w->shape[0], w->shape[1],
                                   ctpu_kdt_size(w->dtype), ctx->ptr[sd->in_slot[1]], n,
                                   ctx->ptr[sd->out_slot], &bad_pos, &bad_val);
    if (bad) {
        ctx->fault_status = CTPU_ERR_DEVICE_FAULT;
        snprintf(ctx->fault_msg, sizeof ctx->fault_msg,
                 "embedding: index %lld at position %lld is out of range [0, %lld) for weight "
                 "%s[%lld,%lld] (%lld bad %s)",
                 (long long)bad_val, (long long)bad_pos, (long long)w->shape[0],
                 w->dtype == CTPU_KDT_BF16 ? "bf16" : "f32", (long long)w->shape[0],
                 (long long)w->shape[1], (long long)bad, bad == 1 ? "index" : "indices");
    }
}

static void exec_gather(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const ctpu_node *nd = &sd->node;
    const ctpu_vtype *a = &sd->in[0], *it = &sd->in[1];
    int dim = nd->attr.extra, ndim = a->ndim;
    int64_t as[8];
    contig_strides(a, as);
    size_t es = ctpu_kdt_size(a->dtype);
    const char *src = ctx->ptr[sd->in_slot[0]];
    const int32_t *idx = ctx->ptr[sd->in_slot[1]];
    char *out = ctx->ptr[sd->out_slot];
    int64_t n = ctpu_vtype_numel(it), pos[8] = {0}, nbad = 0, bad_pos = 0, bad_val = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = idx[i], off = 0;
        if (v < 0 || v >= a->shape[dim]) {
            if (nbad++ == 0) { bad_pos = i; bad_val = v; }
            memset(out + (size_t)i * es, 0, es);
        } else {
            for (int d = 0; d < ndim; d++) off += (d == dim ? v : pos[d]) * as[d];
            memcpy(out + (size_t)i * es, src + (size_t)off * es, es);
        }
        for (int d = ndim - 1; d >= 0; d--) {
            if (++pos[d] < it->shape[d]) break;
            pos[d] = 0;
        }
    }
    if (nbad) {
        ctx->fault_status = CTPU_ERR_DEVICE_FAULT;
        const char *call = "gather";
        if (nd->attr.call == CTPU_CALL_INDEX_SELECT && n > 0) {
            /* index_select's index [k] was expanded along dim: its position
             * and count in the user's index (each entry repeats n / k times) */
            int64_t inner = 1, k = it->shape[dim];
            for (int d = dim + 1; d < ndim; d++) inner *= it->shape[d];
            bad_pos = (bad_pos / inner) % k;
            nbad /= n / k;
            call = "index_select";
        }
        snprintf(ctx->fault_msg, sizeof ctx->fault_msg,
                 "%s: index %lld at position %lld is out of range [0, %lld) along dim %d (%lld bad %s)", call,
                 (long long)bad_val, (long long)bad_pos, (long long)a->shape[dim], dim, (long long)nbad,
                 nbad == 1 ? "index" : "indices");
    }
}

/* scatter_add: out = self, then out[.., index[p], ..] += src[p] (dim extra)
 * for every position p of index in row-major order (src read at p's
 * coordinates). Floats add into an f32 copy of self, rounded once to the
 * output dtype at the end; i32 adds wrap (two's complement). An index outside
 * [0, self.shape[dim]) is skipped and faults naming scatter_add. */
static void exec_scatter_add(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const ctpu_node *nd = &sd->node;
    const ctpu_vtype *it = &sd->in[1], *st = &sd->in[2];
    int dim = nd->attr.extra, ndim = nd->out.ndim, dt = nd->out.dtype;
    int64_t total = ctpu_vtype_numel(&nd->out);
    int64_t os[8], ss[8];
    contig_strides(&nd->out, os);
    contig_strides(st, ss);
    const void *self = ctx->ptr[sd->in_slot[0]], *src = ctx->ptr[sd->in_slot[2]];
    const int32_t *idx = ctx->ptr[sd->in_slot[1]];
    void *out = ctx->ptr[sd->out_slot];
    float *acc = NULL;
    if (dt == CTPU_KDT_I32) {
        if (out != self && total) memcpy(out, self, (size_t)total * 4);
    } else {
        acc = dt == CTPU_KDT_F32 ? out : malloc((size_t)(total ? total : 1) * 4);
        if (!acc) return;
        if ((const void *)acc != self) to_f32(self, dt, acc, total);
    }
    int64_t n = ctpu_vtype_numel(it), pos[8] = {0}, nbad = 0, bad_pos = 0, bad_val = 0;
    for (int64_t p = 0; p < n; p++) {
        int64_t v = idx[p];
        if (v < 0 || v >= nd->out.shape[dim]) {
            if (nbad++ == 0) { bad_pos = p; bad_val = v; }
        } else {
            int64_t o = 0, s = 0;
            for (int d = 0; d < ndim; d++) {
                o += (d == dim ? v : pos[d]) * os[d];
                s += pos[d] * ss[d];
            }
            if (acc) acc[o] += load_f32(src, dt, s);
            else ((int32_t *)out)[o] = (int32_t)((uint32_t)((int32_t *)out)[o] + (uint32_t)((const int32_t *)src)[s]);
        }
        for (int d = ndim - 1; d >= 0; d--) {
            if (++pos[d] < it->shape[d]) break;
            pos[d] = 0;
        }
    }
    if (acc && (void *)acc != out) {
        ctpu_from_f32(acc, dt, out, total);
        free(acc);
    }
    if (nbad) {
        ctx->fault_status = CTPU_ERR_DEVICE_FAULT;
        snprintf(ctx->fault_msg, sizeof ctx->fault_msg,
                 "scatter_add: index %lld at position %lld is out of range [0, %lld) along dim %d (%lld bad %s)",
                 (long long)bad_val, (long long)bad_pos, (long long)nd->out.shape[dim], dim, (long long)nbad,
                 nbad == 1 ? "index" : "indices");
    }
}

/* ------------------------------------------------------------ matmul */
/* The shape part of matmul node nd's kernel arguments (a of type a, b of
 * type b; no pointers, no epilogue) and the operands' batch strides against
 * the output's batch dims. Returns 0 when the batch needs a call per element
 * (strides not uniform), 1 when one call covers it (batch, a_bs, b_bs and
 * c_bs are that call's), 2 when that call is one product of batch * M rows
 * (b shared by every batch element and a's rows contiguous across the
 * batch, [.., M, K] @ [K, N], a linear layer: each output element is the
 * same sum in the same K order, CONTRACTS: the order depends only on K, so
 * the same bits; fewer edge tiles and one call's fixed cost). */
int ctpu_exec_matmul_args(const ctpu_node *nd, const ctpu_vtype *a, const ctpu_vtype *b, ctpu_mm_args *args,
                          int64_t ast[8], int64_t bst[8])
{
    const ctpu_vtype *o = &nd->out;
    int on = o->ndim;
    /* CTPU_ATTR_TRANS_A/B (autograd's transposed operands): a stored [K,M], b [N,K] */
    bool ta = (nd->attr.flags & CTPU_ATTR_TRANS_A) != 0, tb = (nd->attr.flags & CTPU_ATTR_TRANS_B) != 0;
    int64_t M = o->shape[on - 2], N = o->shape[on - 1], K = a->shape[a->ndim - (ta ? 2 : 1)];
    int nb = on - 2;
    int64_t batch = 1;
    for (int d = 0; d < nb; d++) batch *= o->shape[d];
    *args = (ctpu_mm_args){
        .batch = 1, .M = M, .N = N, .K = K,
        .a_dtype = a->dtype, .a_rs = ta ? 1 : K, .a_cs = ta ? M : 1,
        .b_dtype = b->dtype, .b_rs = tb ? 1 : N, .b_cs = tb ? K : 1,
        .c_dtype = o->dtype, .ldc = N,
        .precision = (ctpu_k_precision)nd->attr.extra,
    };
    /* batch strides of a and b against the broadcast output batch dims */
    for (int d = 0; d < 8; d++) ast[d] = bst[d] = 0;
    int64_t sa = M * K, sb = K * N;
    for (int d = a->ndim - 3; d >= 0; d--) {
        int od = d + (nb - (a->ndim - 2));
        ast[od] = a->shape[d] == 1 ? 0 : sa;
        sa *= a->shape[d];
    }
    for (int d = b->ndim - 3; d >= 0; d--) {
        int od = d + (nb - (b->ndim - 2));
        bst[od] = b->shape[d] == 1 ? 0 : sb;
        sb *= b->shape[d];
    }
    /* uniform batch strides -> one call */
    int64_t ua = nb ? ast[nb - 1] : 0, ub = nb ? bst[nb - 1] : 0;
    int64_t ea_exp = ua, eb_exp = ub;
    for (int d = nb - 1; d >= 0; d--) {
        if (ast[d] != ea_exp || bst[d] != eb_exp) return 0;
        ea_exp *= o->shape[d];
        eb_exp *= o->shape[d];
    }
    if (ub == 0 && !ta && ua == M * K) {
        args->M = batch * M;
        return 2;
    }
    args->batch = batch;
    args->a_bs = ua;
    args->b_bs = ub;
    args->c_bs = M * N;
    return 1;
}

static void exec_matmul(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const ctpu_node *nd = &sd->node;
    const ctpu_vtype *a = &sd->in[0], *b = &sd->in[1], *o = &nd->out;
    int on = o->ndim, nb = on - 2;
    int64_t M = o->shape[on - 2], N = o->shape[on - 1], batch = 1;
    for (int d = 0; d < nb; d++) batch *= o->shape[d];
    if (batch * M * N == 0) return;
    ctpu_mm_args args;
    int64_t ast[8], bst[8];
    int calls = ctpu_exec_matmul_args(nd, a, b, &args, ast, bst);
    int64_t K = args.K;
    args.scaled = sd->epi_scale >= 0;
    args.scale = sd->epi_scale >= 0 ? (float)ctx->scalars[sd->epi_scale] : 0.0f;
    args.act = (ctpu_k_act)sd->epi_act;
    args.bias = sd->epi_bias_slot >= 0 ? ctx->ptr[sd->epi_bias_slot] : NULL;
    args.bias_dtype = CTPU_KDT_F32;
    args.residual = sd->epi_res_slot >= 0 ? ctx->ptr[sd->epi_res_slot] : NULL;
    args.residual_dtype = CTPU_KDT_F32;
    args.residual_bs = calls == 2 ? 0 : M * N;
    args.residual_ld = N;
    args.softmax = sd->epi_softmax;
    size_t ea = ctpu_kdt_size(a->dtype), eb = ctpu_kdt_size(b->dtype), ec = ctpu_kdt_size(o->dtype);
    if (calls) {
        args.a = ctx->ptr[sd->in_slot[0]];
        args.b = ctx->ptr[sd->in_slot[1]];
        args.c = ctx->ptr[sd->out_slot];
        for (int r = 0; r < 2; r++)   /* panels shared with other matmul steps (compile.c plan_packs) */
            if (sd->pre[r]) {
                args.pre[r] = sd->pre[r];
                args.pre_buf[r] = ctx->ptr[sd->pre_slot[r]];
                args.pre_keep[r] = sd->pre_keep[r];
            }
        ctpu_k_matmul(&args, ctx->pool);
    } else {
        int64_t pos[8] = {0};
        for (int64_t i = 0; i < batch; i++) {
            int64_t oa = 0, ob = 0;
            for (int d = 0; d < nb; d++) { oa += pos[d] * ast[d]; ob += pos[d] * bst[d]; }
            args.a = (const char *)ctx->ptr[sd->in_slot[0]] + (size_t)oa * ea;
            args.b = (const char *)ctx->ptr[sd->in_slot[1]] + (size_t)ob * eb;
            args.c = (char *)ctx->ptr[sd->out_slot] + (size_t)(i * M * N) * ec;
            if (sd->epi_res_slot >= 0) args.residual = (const float *)ctx->ptr[sd->epi_res_slot] + i * M * N;
            ctpu_k_matmul(&args, ctx->pool);
            for (int d = nb - 1; d >= 0; d--) {
                if (++pos[d] < o->shape[d]) break;
                pos[d] = 0;
            }
        }
    }
    if (ctx->metrics && ctx->mxu_size > 0) {
        uint64_t useful, padded;
        ctpu_k_mxu_macs(batch, M, N, K, ctx->mxu_size, &useful, &padded);
        ctpu_counter_add(ctx->metrics, CTPU_CTR_MXU_MACS_USEFUL, (long long)useful);
        ctpu_counter_add(ctx->metrics, CTPU_CTR_MXU_MACS_PADDED, (long long)padded);
    }
}

/* ------------------------------------------------------------ creation */
static void exec_full(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const double *sc = ctx->scalars + sd->scalar_base;
    int64_t n = ctpu_vtype_numel(&sd->node.out);
    void *out = ctx->ptr[sd->out_slot];
    int dt = sd->node.out.dtype;
    if (dt == CTPU_KDT_I32) {
        double v = sc[0];
        int32_t iv = v != v ? 0 : v >= 2147483647.0 ? INT32_MAX : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
        for (int64_t i = 0; i < n; i++) ((int32_t *)out)[i] = iv;
    } else if (dt == CTPU_KDT_BF16) {
        uint16_t h = ctpu_f32_to_bf16((float)sc[0]);
        for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = h;
    } else {
        float f = (float)sc[0];
        for (int64_t i = 0; i < n; i++) ((float *)out)[i] = f;
    }
}

static void exec_arange(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const double *sc = ctx->scalars + sd->scalar_base;
    int64_t n = ctpu_vtype_numel(&sd->node.out);
    void *out = ctx->ptr[sd->out_slot];
    int dt = sd->node.out.dtype;
    for (int64_t i = 0; i < n; i++) {
        double v = sc[0] + (double)i * sc[1];
        if (dt == CTPU_KDT_I32)   /* toward zero, saturating, as every f32 -> i32 (no UB cast) */
            ((int32_t *)out)[i] = v >= 2147483647.0 ? INT32_MAX : v <= -2147483648.0 ? INT32_MIN : (int32_t)v;
        else if (dt == CTPU_KDT_BF16) ((uint16_t *)out)[i] = ctpu_f32_to_bf16((float)v);
        else ((float *)out)[i] = (float)v;
    }
}

/* scalars: seed and offset (as bits), then the distribution's two parameters */
static void rand_fill(const ctpu_step_data *sd, ctpu_exec_ctx *ctx, bool normal)
{
    const double *sc = ctx->scalars + sd->scalar_base;
    int64_t n = ctpu_vtype_numel(&sd->node.out);
    void *out = ctx->ptr[sd->out_slot];
    int dt = sd->node.out.dtype;
    if (n == 0) return;
    uint64_t seed = double_to_bits(sc[0]), offset = double_to_bits(sc[1]);
    float *y = dt == CTPU_KDT_F32 ? out : malloc((size_t)n * 4);
    if (normal)
        ctpu_k_rand_normal(seed, offset, 0, n, (float)sc[2], (float)sc[3], y);
    else
        ctpu_k_rand_uniform(seed, offset, 0, n, (float)sc[2], (float)sc[3], y);
    if (y != out) { ctpu_from_f32(y, dt, out, n); free(y); }
}

static void exec_rand_uniform(const void *data, ctpu_exec_ctx *ctx) { rand_fill(data, ctx, false); }

/* scalars: seed, offset (bits), low, high (integers as doubles) */
static void exec_rand_int(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const double *sc = ctx->scalars + sd->scalar_base;
    int64_t n = ctpu_vtype_numel(&sd->node.out);
    void *out = ctx->ptr[sd->out_slot];
    int dt = sd->node.out.dtype;
    int64_t low = (int64_t)sc[2], range = (int64_t)sc[3] - low;
    int64_t blk[CTPU_K_BLOCK];
    for (int64_t b = 0; b < n; b += CTPU_K_BLOCK) {
        int64_t m = n - b < CTPU_K_BLOCK ? n - b : CTPU_K_BLOCK;
        ctpu_k_rand_int(double_to_bits(sc[0]), double_to_bits(sc[1]), b, m, low, (uint64_t)range, blk);
        for (int64_t j = 0; j < m; j++) {
            if (dt == CTPU_KDT_I32) ((int32_t *)out)[b + j] = (int32_t)blk[j];
            else if (dt == CTPU_KDT_BF16) ((uint16_t *)out)[b + j] = ctpu_f32_to_bf16((float)blk[j]);
            else ((float *)out)[b + j] = (float)blk[j];
        }
    }
}
static void exec_rand_normal(const void *data, ctpu_exec_ctx *ctx) { rand_fill(data, ctx, true); }

/* ------------------------------------------------------------ backward helpers
 * Ops that only autograd (src/eager/autograd.c) builds. */

/* slice_backward: g (the slice's shape) placed into zeros of the sliced
 * input's shape (node out) at start, start+step, ... along dims[0]. */
static void exec_slice_backward(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const ctpu_node *nd = &sd->node;
    int dim = nd->attr.dims[0];
    int64_t start = nd->attr.i64[0], step = nd->attr.i64[2];
    size_t es = ctpu_kdt_size(nd->out.dtype);
    size_t bytes = (size_t)ctpu_vtype_numel(&nd->out) * es;
    char *out = ctx->ptr[sd->out_slot];
    if (bytes) memset(out, 0, bytes);
    if (ctpu_vtype_numel(&sd->in[0]) == 0) return;
    int64_t cs[8], os[8];
    contig_strides(&sd->in[0], cs);
    contig_strides(&nd->out, os);
    char *dst = out + (size_t)(start * os[dim]) * es;
    os[dim] *= step;
    ctpu_k_strided_copy(ctx->ptr[sd->in_slot[0]], cs, dst, os, sd->in[0].shape, sd->in[0].ndim, es);
}

/* Scatter-add rows in input order into an f32 accumulator, then round once
 * to the output dtype. */
static float *bw_acc_begin(const ctpu_step_data *sd, ctpu_exec_ctx *ctx, int64_t n)
{
    if (sd->node.out.dtype == CTPU_KDT_F32) {
        float *o = ctx->ptr[sd->out_slot];
        memset(o, 0, (size_t)n * 4);
        return o;
    }
    return calloc((size_t)(n ? n : 1), 4);
}

static void bw_acc_end(const ctpu_step_data *sd, ctpu_exec_ctx *ctx, float *acc, int64_t n)
{
    if (acc != ctx->ptr[sd->out_slot]) {
        ctpu_from_f32(acc, sd->node.out.dtype, ctx->ptr[sd->out_slot], n);
        free(acc);
    }
}

/* embedding_backward: g [..., D], indices i32 [...] -> [V, D]:
 * out[idx[i], :] += g[i, :] for i in input order; out-of-range indices (a
 * fault already raised by the forward embedding) are skipped. */
static void exec_embedding_backward(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const ctpu_node *nd = &sd->node;
    int64_t V = nd->out.shape[0], D = nd->out.shape[1];
    int64_t n = ctpu_vtype_numel(&sd->in[1]);
    float *acc = bw_acc_begin(sd, ctx, V * D);
    if (!acc) return;
    const void *g = ctx->ptr[sd->in_slot[0]];
    const int32_t *idx = ctx->ptr[sd->in_slot[1]];
    int gdt = sd->in[0].dtype;
    float row[CTPU_K_BLOCK];
    for (int64_t i = 0; i < n; i++) {
        int64_t v = idx[i];
        if (v < 0 || v >= V) continue;
        float *dst = acc + v * D;
        for (int64_t c = 0; c < D; c += CTPU_K_BLOCK) {
            int64_t m = D - c < CTPU_K_BLOCK ? D - c : CTPU_K_BLOCK;
            const float *src = row;
            if (gdt == CTPU_KDT_F32) src = (const float *)g + i * D + c;
            else to_f32((const char *)g + (size_t)(i * D + c) * ctpu_kdt_size(gdt), gdt, row, m);
            for (int64_t j = 0; j < m; j++) dst[c + j] += src[j];
        }
    }
    bw_acc_end(sd, ctx, acc, V * D);
}

/* gather_backward: g and index share a shape; out (the gathered input's
 * shape) is zeros with out[.., index[i], ..] += g[i] along dim extra, in
 * input order; out-of-range indices are skipped. */
static void exec_gather_backward(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    const ctpu_node *nd = &sd->node;
    const ctpu_vtype *it = &sd->in[1];
    int dim = nd->attr.extra, ndim = nd->out.ndim;
    int64_t total = ctpu_vtype_numel(&nd->out);
    float *acc = bw_acc_begin(sd, ctx, total);
    if (!acc) return;
    int64_t os[8];
    contig_strides(&nd->out, os);
    const void *g = ctx->ptr[sd->in_slot[0]];
    const int32_t *idx = ctx->ptr[sd->in_slot[1]];
    int gdt = sd->in[0].dtype;
    int64_t n = ctpu_vtype_numel(it), pos[8] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t v = idx[i];
        if (v >= 0 && v < nd->out.shape[dim]) {
            int64_t off = 0;
            for (int d = 0; d < ndim; d++) off += (d == dim ? v : pos[d]) * os[d];
            acc[off] += load_f32(g, gdt, i);
        }
        for (int d = ndim - 1; d >= 0; d--) {
            if (++pos[d] < it->shape[d]) break;
            pos[d] = 0;
        }
    }
    bw_acc_end(sd, ctx, acc, total);
}

/* ------------------------------------------------------------ collectives
 * Issue 19: a collective is a step like any other; src/dist/ moves the bytes
 * (MPI, on this, the device thread) and folds sums in rank order. A failure
 * (shapes or dtypes that differ across ranks) is a fault on the outputs,
 * named by the collective; the output is zeros then. */
static void exec_collective(const ctpu_step_data *sd, ctpu_exec_ctx *ctx, int kind)
{
    const ctpu_node *nd = &sd->node;
    ctpu_coll_call c = {
        .kind = kind, .op = nd->attr.extra, .dtype = sd->in[0].dtype, .ndim = sd->in[0].ndim,
        .root = kind == CTPU_COLL_BROADCAST ? (int)nd->attr.i64[0] : 0,
        .dim = kind == CTPU_COLL_ALL_GATHER || kind == CTPU_COLL_REDUCE_SCATTER ? (int)nd->attr.i64[0] : 0,
        .bucket = nd->attr.i64[1], .step = nd->n_scalars ? (int64_t)ctx->scalars[sd->scalar_base] : 0,
        .in = ctx->ptr[sd->in_slot[0]], .out = ctx->ptr[sd->out_slot],
    };
    for (int d = 0; d < c.ndim; d++) c.shape[d] = sd->in[0].shape[d];
    /* all_reduce's attr.i64[0]: 0 runs it here; 1 starts it (the comm thread
     * moves the bytes while the next steps run; the output, this rank's own
     * value, keys the request); 2 waits for the one its input started */
    int64_t phase = kind == CTPU_COLL_ALL_REDUCE ? nd->attr.i64[0] : 0;
    size_t bytes = (size_t)ctpu_vtype_numel(&nd->out) * ctpu_kdt_size(nd->out.dtype);
    ctpu_status st = phase == 1 ? ctpu__dist_start_async(&c, c.out, ctx->fault_msg, sizeof ctx->fault_msg)
                   : phase == 2 ? ctpu__dist_wait_async(c.in, c.in, c.out, bytes, "all_reduce", ctx->fault_msg,
                                                        sizeof ctx->fault_msg)
                   : ctpu__dist_run(&c, ctx->fault_msg, sizeof ctx->fault_msg);
    if (st != CTPU_OK) {
        memset(c.out, 0, (size_t)ctpu_vtype_numel(&nd->out) * ctpu_kdt_size(nd->out.dtype));
        ctx->fault_status = st;
    }
}
static void exec_all_reduce(const void *d, ctpu_exec_ctx *ctx) { exec_collective(d, ctx, CTPU_COLL_ALL_REDUCE); }
static void exec_broadcast(const void *d, ctpu_exec_ctx *ctx) { exec_collective(d, ctx, CTPU_COLL_BROADCAST); }
static void exec_all_gather(const void *d, ctpu_exec_ctx *ctx) { exec_collective(d, ctx, CTPU_COLL_ALL_GATHER); }
static void exec_reduce_scatter(const void *d, ctpu_exec_ctx *ctx) { exec_collective(d, ctx, CTPU_COLL_REDUCE_SCATTER); }

/* ------------------------------------------------------------ the handler table
 * One kernel entry per op (tests/test_fuse.c checks that every op has one). */
/* ------------------------------------------------------------ attention
 * scaled_dot_product_attention and its backward (src/kernels/attention.c):
 * inputs q, k, v (then, backward: the forward's packed o|lse and its
 * gradient), the mask last when the node has one. */
static void sdpa_args(const ctpu_step_data *sd, ctpu_exec_ctx *ctx, int mask_in, ctpu_attn_args *a)
{
    const ctpu_node *nd = &sd->node;
    const ctpu_vtype *q = &sd->in[0], *k = &sd->in[1];
    const double *sc = ctx->scalars + sd->scalar_base;
    bool bthd = nd->attr.i64[2] == CTPU_K_ATTN_BTHD;   /* q [B,Tq,H,D] (else [B,H,Tq,D]) */
    *a = (ctpu_attn_args){
        .B = q->shape[0], .H = q->shape[bthd ? 2 : 1], .Tq = q->shape[bthd ? 1 : 2], .Tk = k->shape[bthd ? 1 : 2],
        .D = q->shape[3], .layout = bthd ? CTPU_K_ATTN_BTHD : CTPU_K_ATTN_BHTD,
        .q = ctx->ptr[sd->in_slot[0]], .k = ctx->ptr[sd->in_slot[1]], .v = ctx->ptr[sd->in_slot[2]],
        .dtype = q->dtype, .mask_kind = (int)nd->attr.i64[0], .causal = nd->attr.i64[1] != 0,
        .seed = double_to_bits(sc[0]), .offset = double_to_bits(sc[1]), .p = sc[2], .scale = (float)sc[3],
        .precision = (ctpu_k_precision)nd->attr.extra,
    };
    if (a->mask_kind == CTPU_K_MASK_NONE) return;
    /* the mask's strides against [B, H, Tq, Tk] (0 where it broadcasts) */
    const ctpu_vtype *m = &sd->in[mask_in];
    int64_t cs[8];
    contig_strides(m, cs);
    for (int d = 0; d < 4; d++) {
        int md = d - (4 - m->ndim);
        a->ms[d] = md < 0 || m->shape[md] == 1 ? 0 : cs[md];
    }
    a->mask = ctx->ptr[sd->in_slot[mask_in]];
}

static void sdpa_macs(ctpu_exec_ctx *ctx, const ctpu_attn_args *a, int products)
{
    if (!ctx->metrics || ctx->mxu_size <= 0) return;
    uint64_t u1, p1, u2, p2;
    ctpu_k_mxu_macs(a->B * a->H, a->Tq, a->Tk, a->D, ctx->mxu_size, &u1, &p1);   /* Q Kᵀ-shaped */
    ctpu_k_mxu_macs(a->B * a->H, a->Tq, a->D, a->Tk, ctx->mxu_size, &u2, &p2);   /* P V-shaped */
    int n1 = products == 2 ? 1 : 2, n2 = products == 2 ? 1 : 3;
    ctpu_counter_add(ctx->metrics, CTPU_CTR_MXU_MACS_USEFUL, (long long)(n1 * u1 + n2 * u2));
    ctpu_counter_add(ctx->metrics, CTPU_CTR_MXU_MACS_PADDED, (long long)(n1 * p1 + n2 * p2));
}

static void exec_sdpa(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    ctpu_attn_args a;
    sdpa_args(sd, ctx, 3, &a);
    a.o = ctx->ptr[sd->out_slot];
    a.lse = a.o + a.B * a.H * a.Tq * a.D;
    ctpu_k_attn_fwd(&a, ctx->pool);
    sdpa_macs(ctx, &a, 2);
}

static void exec_sdpa_backward(const void *data, ctpu_exec_ctx *ctx)
{
    const ctpu_step_data *sd = data;
    ctpu_attn_args a;
    sdpa_args(sd, ctx, 5, &a);
    int64_t no = a.B * a.H * a.Tq * a.D;
    a.o_in = ctx->ptr[sd->in_slot[3]];
    a.lse_in = a.o_in + no;
    a.dout = ctx->ptr[sd->in_slot[4]];
    a.dq = ctx->ptr[sd->out_slot];
    a.dk = a.dq + no;
    a.dv = a.dk + a.B * a.H * a.Tk * a.D;
    ctpu_k_attn_bwd(&a, ctx->pool);
    sdpa_macs(ctx, &a, 5);
}

#define EW(e) [CTPU_OP_##e] = exec_elementwise
static const ctpu_dev_step_fn exec_fns[CTPU_OP_COUNT] = {
    EW(NEG), EW(ABS), EW(EXP), EW(LOG), EW(SQRT), EW(RSQRT), EW(TANH), EW(SIGMOID), EW(RELU),
    EW(GELU_TANH), EW(GELU_ERF), EW(SOFTPLUS),
    EW(ERF), EW(SIN), EW(COS), EW(LOG1P), EW(EXPM1),
    EW(ADD), EW(SUB), EW(MUL), EW(DIV), EW(POW), EW(MAXIMUM), EW(MINIMUM),
    EW(EQ), EW(NE), EW(LT), EW(LE), EW(GT), EW(GE),
    EW(ADD_SCALAR), EW(SUB_SCALAR), EW(MUL_SCALAR), EW(DIV_SCALAR), EW(POW_SCALAR),
    EW(MAXIMUM_SCALAR), EW(MINIMUM_SCALAR),
    EW(EQ_SCALAR), EW(NE_SCALAR), EW(LT_SCALAR), EW(LE_SCALAR), EW(GT_SCALAR), EW(GE_SCALAR),
    EW(WHERE), EW(CLAMP), EW(CAST),
    [CTPU_OP_SUM] = exec_reduce,
    [CTPU_OP_MEAN] = exec_mean,
    [CTPU_OP_MAX] = exec_reduce,
    [CTPU_OP_MIN] = exec_reduce,
    [CTPU_OP_VAR] = exec_var,
    [CTPU_OP_ARGMAX] = exec_argmax,
    [CTPU_OP_ARGMIN] = exec_argmax,
    [CTPU_OP_PROD] = exec_reduce,
    [CTPU_OP_CUMSUM] = exec_cumsum,
    [CTPU_OP_SOFTMAX] = exec_softmax,
    [CTPU_OP_LOG_SOFTMAX] = exec_log_softmax,
    [CTPU_OP_RESHAPE] = exec_copy,       /* a view in eager; a copy when a program materialises it */
    [CTPU_OP_PERMUTE] = exec_permute,
    [CTPU_OP_SLICE] = exec_slice,
    [CTPU_OP_CONCAT] = exec_concat,
    [CTPU_OP_EXPAND] = exec_expand,
    [CTPU_OP_EMBEDDING] = exec_embedding,
    [CTPU_OP_GATHER] = exec_gather,
    [CTPU_OP_SCATTER_ADD] = exec_scatter_add,
    [CTPU_OP_MATMUL] = exec_matmul,
    [CTPU_OP_SDPA] = exec_sdpa,
    [CTPU_OP_COPY] = exec_copy,
    [CTPU_OP_FULL] = exec_full,
    [CTPU_OP_ARANGE] = exec_arange,
    [CTPU_OP_RAND_UNIFORM] = exec_rand_uniform,
    [CTPU_OP_RAND_NORMAL] = exec_rand_normal,
    [CTPU_OP_RAND_INT] = exec_rand_int,
    [CTPU_OP_SLICE_BACKWARD] = exec_slice_backward,
    [CTPU_OP_EMBEDDING_BACKWARD] = exec_embedding_backward,
    [CTPU_OP_GATHER_BACKWARD] = exec_gather_backward,
    [CTPU_OP_SDPA_BACKWARD] = exec_sdpa_backward,
    [CTPU_OP_ALL_REDUCE] = exec_all_reduce,
    [CTPU_OP_BROADCAST] = exec_broadcast,
    [CTPU_OP_ALL_GATHER] = exec_all_gather,
    [CTPU_OP_REDUCE_SCATTER] = exec_reduce_scatter,
};
#undef EW

ctpu_dev_step_fn ctpu_exec_fn_for(int op) { return op >= 0 && op < CTPU_OP_COUNT ? exec_fns[op] : NULL; }
