/* Blockwise attention (scaled_dot_product_attention), forward and backward.
 * q [B,H,Tq,D], k and v [B,H,Tk,D] contiguous (f32 or bf16); the order of
 * every operation is the contract written in kernels.h and CONTRACTS.md
 * "Attention": blocks of CTPU_K_ATTN_BLOCK queries x keys, key blocks in
 * ascending order, the MXU for both products, one division at the end.
 * Scores exist only as one block per thread ([128 x 128] f32), never as a
 * [B,H,Tq,Tk] buffer.
 *
 * The code is written once; the products and the transcendentals go through
 * a small table: the current ISA's (ctpu_k_matmul_ws, ctpu_k_unary) or the
 * scalar references' (ctpu_k_matmul_ref, ctpu_k_unary_ref). Everything else is
 * one f32 operation at a time in plain C (-ffp-contract=off), so the two give
 * the same bits whenever their parts do (tests/test_sdpa.c checks it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define BL CTPU_K_ATTN_BLOCK

typedef struct {
    void (*mm)(const ctpu_mm_args *a, ctpu_k_ws *ws);
    void (*unary)(ctpu_k_unary_op op, const float *x, float *y, int64_t n);
} attn_ops;

static void mm_isa(const ctpu_mm_args *a, ctpu_k_ws *ws) { ctpu_k_matmul_ws(a, ws); }
static void mm_ref(const ctpu_mm_args *a, ctpu_k_ws *ws) { (void)ws; ctpu_k_matmul_ref(a); }
static const attn_ops ops_isa = { mm_isa, ctpu_k_unary };
static const attn_ops ops_ref = { mm_ref, ctpu_k_unary_ref };

/* One thread's buffers. */
typedef struct {
    ctpu_k_ws ws;
    float *s;                   /* [BL*BL] scores, then exp (row stride BL) */
    float *ds;                  /* [BL*BL] backward: Pd, then dP, then dS */
    float *z;                   /* [BL*BL] backward with dropout: keep / (1 - p) */
    uint16_t *p;                /* [BL*BL] forward: P in bf16 */
    float *t;                   /* [BL*D] one product's block */
    float *acc;                 /* [BL*D] forward: O's accumulator */
    float *m, *l, *mu, *al, *u; /* [BL] each */
} attn_ws;

static bool ws_init(attn_ws *w, int64_t D)
{
    memset(w, 0, sizeof *w);
    w->s = malloc(sizeof(float) * BL * BL);
    w->ds = malloc(sizeof(float) * BL * BL);
    w->z = malloc(sizeof(float) * BL * BL);
    w->p = malloc(sizeof(uint16_t) * BL * BL);
    w->t = malloc(sizeof(float) * (size_t)(BL * D));
    w->acc = malloc(sizeof(float) * (size_t)(BL * D));
    w->m = malloc(sizeof(float) * BL * 5);
    if (!w->s || !w->ds || !w->z || !w->p || !w->t || !w->acc || !w->m) return false;
    w->l = w->m + BL;
    w->mu = w->l + BL;
    w->al = w->mu + BL;
    w->u = w->al + BL;
    return true;
}

static void ws_free(attn_ws *w)
{
    ctpu_k_ws_free(&w->ws);
    free(w->s);
    free(w->ds);
    free(w->z);
    free(w->p);
    free(w->t);
    free(w->acc);
    free(w->m);
}

static inline float nanmax(float a, float b) { return a != a || b != b ? a + b : a > b ? a : b; }

static inline const void *row_of(const void *base, int dt, int64_t row, int64_t D)
{
    return (const char *)base + (size_t)(row * D) * ctpu_kdt_size(dt);
}

/* s[i*BL + j], i < bq, j < bk: MXU(Q_I K_Jᵀ) * scale, then the mask and the
 * causal rule (kernels.h). */
static void scores(const ctpu_attn_args *a, const attn_ops *ops, attn_ws *w, int64_t bh, int64_t i0,
                   int64_t bq, int64_t j0, int64_t bk)
{
    int64_t D = a->D;
    ctpu_mm_args mm = {
        .batch = 1, .M = bq, .N = bk, .K = D,
        .a = row_of(a->q, a->dtype, bh * a->Tq + i0, D), .a_dtype = a->dtype, .a_rs = D, .a_cs = 1,
        .b = row_of(a->k, a->dtype, bh * a->Tk + j0, D), .b_dtype = a->dtype, .b_rs = 1, .b_cs = D,
        .c = w->s, .c_dtype = CTPU_KDT_F32, .ldc = BL, .precision = a->precision,
    };
    ops->mm(&mm, &w->ws);
    int64_t b = bh / a->H, h = bh % a->H;
    for (int64_t i = 0; i < bq; i++) {
        float *r = w->s + i * BL;
        for (int64_t j = 0; j < bk; j++) r[j] = r[j] * a->scale;
        if (a->mask_kind != CTPU_K_MASK_NONE) {
            const float *mr = a->mask + b * a->ms[0] + h * a->ms[1] + (i0 + i) * a->ms[2] + j0 * a->ms[3];
            int64_t st = a->ms[3];
            if (a->mask_kind == CTPU_K_MASK_ADD)
                for (int64_t j = 0; j < bk; j++) r[j] = r[j] + mr[j * st];
            else
                for (int64_t j = 0; j < bk; j++) if (mr[j * st] == 0.0f) r[j] = -INFINITY;
        }
        if (a->causal)
            for (int64_t j = i0 + i + 1 - j0 < 0 ? 0 : i0 + i + 1 - j0; j < bk; j++) r[j] = -INFINITY;
    }
}

/* Key blocks of query block [i0, i0 + bq): all of them, or (causal) those
 * starting at or before its last query. */
static int64_t key_blocks(const ctpu_attn_args *a, int64_t i0, int64_t bq)
{
    int64_t n = (a->Tk + BL - 1) / BL;
    if (a->causal) {
        int64_t last = (i0 + bq - 1) / BL + 1;
        if (last < n) n = last;
    }
    return n;
}

/* The dropout draws of row i, keys [j0, j0 + bk): u in [0, 1). */
static void draws(const ctpu_attn_args *a, int64_t bh, int64_t i, int64_t j0, int64_t bk, float *u)
{
    int64_t start = (bh * a->Tq + i) * a->Tk + j0;
    ctpu_k_rand_uniform(a->seed, a->offset, start, bk, 0.0f, 1.0f, u);
}

/* ------------------------------------------------------------ forward */
static void fwd_block(const ctpu_attn_args *a, const attn_ops *ops, attn_ws *w, int64_t bh, int64_t qb)
{
    int64_t D = a->D, i0 = qb * BL, bq = a->Tq - i0 < BL ? a->Tq - i0 : BL;
    float pf = (float)a->p;
    /* P is rounded to bf16 at default precision (the MXU operand it is, and
     * the l summed is of those values); HIGH / HIGHEST keep it f32 and the
     * MXU splits it into passes like any f32 operand */
    bool bf16p = a->precision == CTPU_PREC_DEFAULT;
    for (int64_t i = 0; i < bq; i++) { w->m[i] = -INFINITY; w->l[i] = 0.0f; w->mu[i] = 0.0f; }
    memset(w->acc, 0, sizeof(float) * (size_t)(bq * D));
    int64_t nkb = key_blocks(a, i0, bq);
    for (int64_t kb = 0; kb < nkb; kb++) {
        int64_t j0 = kb * BL, bk = a->Tk - j0 < BL ? a->Tk - j0 : BL;
        scores(a, ops, w, bh, i0, bq, j0, bk);
        for (int64_t i = 0; i < bq; i++) {
            float *r = w->s + i * BL, mx = w->m[i];
            for (int64_t j = 0; j < bk; j++) mx = nanmax(mx, r[j]);
            float mu = mx == -INFINITY ? 0.0f : mx;
            w->al[i] = w->m[i] - mu;
            for (int64_t j = 0; j < bk; j++) r[j] = r[j] - mu;
            w->m[i] = mx;
            w->mu[i] = mu;
            ops->unary(CTPU_K_U_EXP, r, r, bk);
        }
        ops->unary(CTPU_K_U_EXP, w->al, w->al, bq);
        for (int64_t i = 0; i < bq; i++) {
            float *r = w->s + i * BL;
            uint16_t *pr = w->p + i * BL;
            float sum = 0.0f;
            if (bf16p) {
                for (int64_t j = 0; j < bk; j++) {
                    pr[j] = ctpu_f32_to_bf16(r[j]);
                    sum = sum + ctpu_bf16_to_f32(pr[j]);
                }
            } else {
                for (int64_t j = 0; j < bk; j++) sum = sum + r[j];
            }
            w->l[i] = w->l[i] * w->al[i] + sum;
            if (a->p > 0) {
                draws(a, bh, i0 + i, j0, bk, w->u);
                if (bf16p) for (int64_t j = 0; j < bk; j++) { if (!(w->u[j] >= pf)) pr[j] = 0; }
                else for (int64_t j = 0; j < bk; j++) if (!(w->u[j] >= pf)) r[j] = 0.0f;
            }
            float *o = w->acc + i * D;
            for (int64_t d = 0; d < D; d++) o[d] = o[d] * w->al[i];
        }
        ctpu_mm_args mm = {
            .batch = 1, .M = bq, .N = D, .K = bk,
            .a = bf16p ? (const void *)w->p : (const void *)w->s, .a_dtype = bf16p ? CTPU_KDT_BF16 : CTPU_KDT_F32,
            .a_rs = BL, .a_cs = 1,
            .b = row_of(a->v, a->dtype, bh * a->Tk + j0, D), .b_dtype = a->dtype, .b_rs = D, .b_cs = 1,
            .c = w->t, .c_dtype = CTPU_KDT_F32, .ldc = D, .precision = a->precision,
        };
        ops->mm(&mm, &w->ws);
        for (int64_t x = 0; x < bq * D; x++) w->acc[x] = w->acc[x] + w->t[x];
    }
    float keep = (float)(1.0 - a->p);
    float *o = a->o + (bh * a->Tq + i0) * D, *lse = a->lse + bh * a->Tq + i0;
    for (int64_t i = 0; i < bq; i++) {
        float den = w->l[i] * keep;
        for (int64_t d = 0; d < D; d++) o[i * D + d] = w->l[i] == 0.0f ? 0.0f : w->acc[i * D + d] / den;
    }
    ops->unary(CTPU_K_U_LOG, w->l, lse, bq);
    for (int64_t i = 0; i < bq; i++) lse[i] = w->mu[i] + lse[i];
}

typedef struct {
    const ctpu_attn_args *a;
    const attn_ops *ops;
} attn_job;

static void fwd_task(void *ctx, int tid, int nt)
{
    const attn_job *jb = ctx;
    const ctpu_attn_args *a = jb->a;
    int64_t nqb = (a->Tq + BL - 1) / BL, n = a->B * a->H * nqb;
    int64_t u0 = n * tid / nt, u1 = n * (tid + 1) / nt;
    if (u0 >= u1) return;
    attn_ws w;
    if (!ws_init(&w, a->D)) abort();   /* out of host memory, as the MXU driver's workspace */
    for (int64_t u = u0; u < u1; u++) fwd_block(a, jb->ops, &w, u / nqb, u % nqb);
    ws_free(&w);
}

/* ------------------------------------------------------------ backward */
/* dst[r*D + d] += t[r*D + d] for r < rows */
static void add_into(float *dst, const float *t, int64_t n)
{
    for (int64_t x = 0; x < n; x++) dst[x] = dst[x] + t[x];
}

static void bwd_pair(const ctpu_attn_args *a, const attn_ops *ops, attn_ws *w, int64_t bh, int64_t i0,
                     int64_t bq, int64_t j0, int64_t bk)
{
    int64_t D = a->D;
    float pf = (float)a->p, inv = a->p > 0 ? (float)(1.0 / (1.0 - a->p)) : 1.0f;
    const float *dO = a->dout + (bh * a->Tq + i0) * D;
    scores(a, ops, w, bh, i0, bq, j0, bk);
    for (int64_t i = 0; i < bq; i++) {
        float *r = w->s + i * BL;
        for (int64_t j = 0; j < bk; j++) r[j] = r[j] - w->mu[i];
        ops->unary(CTPU_K_U_EXP, r, r, bk);
    }
    /* Pd = P * z (z = keep / (1 - p)), into ds */
    const float *pd = w->s;
    if (a->p > 0) {
        for (int64_t i = 0; i < bq; i++) {
            float *z = w->z + i * BL, *dr = w->ds + i * BL;
            const float *r = w->s + i * BL;
            draws(a, bh, i0 + i, j0, bk, z);
            for (int64_t j = 0; j < bk; j++) z[j] = z[j] >= pf ? inv : 0.0f;
            for (int64_t j = 0; j < bk; j++) dr[j] = r[j] * z[j];
        }
        pd = w->ds;
    }
    ctpu_mm_args mm = {
        .batch = 1, .M = bk, .N = D, .K = bq,
        .a = pd, .a_dtype = CTPU_KDT_F32, .a_rs = 1, .a_cs = BL,
        .b = dO, .b_dtype = CTPU_KDT_F32, .b_rs = D, .b_cs = 1,
        .c = w->t, .c_dtype = CTPU_KDT_F32, .ldc = D, .precision = a->precision,
    };
    ops->mm(&mm, &w->ws);
    add_into(a->dv + (bh * a->Tk + j0) * D, w->t, bk * D);
    /* dP = dO Vᵀ into ds, then dS = P * (dP * z - Dr) * scale */
    mm = (ctpu_mm_args){
        .batch = 1, .M = bq, .N = bk, .K = D,
        .a = dO, .a_dtype = CTPU_KDT_F32, .a_rs = D, .a_cs = 1,
        .b = row_of(a->v, a->dtype, bh * a->Tk + j0, D), .b_dtype = a->dtype, .b_rs = 1, .b_cs = D,
        .c = w->ds, .c_dtype = CTPU_KDT_F32, .ldc = BL, .precision = a->precision,
    };
    ops->mm(&mm, &w->ws);
    for (int64_t i = 0; i < bq; i++) {
        float *dr = w->ds + i * BL;
        const float *r = w->s + i * BL;
        if (a->p > 0) {
            const float *z = w->z + i * BL;
            for (int64_t j = 0; j < bk; j++) dr[j] = dr[j] * z[j];
        }
        for (int64_t j = 0; j < bk; j++) dr[j] = r[j] * (dr[j] - w->l[i]) * a->scale;
    }
    /* dQ_I += dS K_J;  dK_J += dSᵀ Q_I */
    mm = (ctpu_mm_args){
        .batch = 1, .M = bq, .N = D, .K = bk,
        .a = w->ds, .a_dtype = CTPU_KDT_F32, .a_rs = BL, .a_cs = 1,
        .b = row_of(a->k, a->dtype, bh * a->Tk + j0, D), .b_dtype = a->dtype, .b_rs = D, .b_cs = 1,
        .c = w->t, .c_dtype = CTPU_KDT_F32, .ldc = D, .precision = a->precision,
    };
    ops->mm(&mm, &w->ws);
    add_into(a->dq + (bh * a->Tq + i0) * D, w->t, bq * D);
    mm = (ctpu_mm_args){
        .batch = 1, .M = bk, .N = D, .K = bq,
        .a = w->ds, .a_dtype = CTPU_KDT_F32, .a_rs = 1, .a_cs = BL,
        .b = row_of(a->q, a->dtype, bh * a->Tq + i0, D), .b_dtype = a->dtype, .b_rs = D, .b_cs = 1,
        .c = w->t, .c_dtype = CTPU_KDT_F32, .ldc = D, .precision = a->precision,
    };
    ops->mm(&mm, &w->ws);
    add_into(a->dk + (bh * a->Tk + j0) * D, w->t, bk * D);
}

static void bwd_head(const ctpu_attn_args *a, const attn_ops *ops, attn_ws *w, int64_t bh)
{
    int64_t D = a->D;
    memset(a->dq + bh * a->Tq * D, 0, sizeof(float) * (size_t)(a->Tq * D));
    memset(a->dk + bh * a->Tk * D, 0, sizeof(float) * (size_t)(a->Tk * D));
    memset(a->dv + bh * a->Tk * D, 0, sizeof(float) * (size_t)(a->Tk * D));
    for (int64_t i0 = 0; i0 < a->Tq; i0 += BL) {
        int64_t bq = a->Tq - i0 < BL ? a->Tq - i0 : BL;
        /* mu: the lse to subtract (+inf for a fully masked row: P = 0);
         * l: Dr_i = sum_d dO_id * O_id */
        for (int64_t i = 0; i < bq; i++) {
            int64_t row = bh * a->Tq + i0 + i;
            float lse = a->lse_in[row];
            w->mu[i] = lse == -INFINITY ? INFINITY : lse;
            const float *o = a->o_in + row * D, *g = a->dout + row * D;
            float s = 0.0f;
            for (int64_t d = 0; d < D; d++) s = s + g[d] * o[d];
            w->l[i] = s;
        }
        int64_t nkb = key_blocks(a, i0, bq);
        for (int64_t kb = 0; kb < nkb; kb++) {
            int64_t j0 = kb * BL, bk = a->Tk - j0 < BL ? a->Tk - j0 : BL;
            bwd_pair(a, ops, w, bh, i0, bq, j0, bk);
        }
    }
}

static void bwd_task(void *ctx, int tid, int nt)
{
    const attn_job *jb = ctx;
    const ctpu_attn_args *a = jb->a;
    int64_t n = a->B * a->H;
    int64_t u0 = n * tid / nt, u1 = n * (tid + 1) / nt;
    if (u0 >= u1) return;
    attn_ws w;
    if (!ws_init(&w, a->D)) abort();
    for (int64_t u = u0; u < u1; u++) bwd_head(a, jb->ops, &w, u);
    ws_free(&w);
}

/* ------------------------------------------------------------ entries */
static void run(ctpu_k_pool *pool, void (*fn)(void *, int, int), void *ctx, int64_t items)
{
    if (items <= 0) return;
    if (pool && pool->nthreads > 1 && items > 1) pool->run(pool, fn, ctx);
    else fn(ctx, 0, 1);
}

void ctpu_k_attn_fwd(const ctpu_attn_args *a, ctpu_k_pool *pool)
{
    attn_job jb = { a, &ops_isa };
    run(pool, fwd_task, &jb, a->B * a->H * ((a->Tq + BL - 1) / BL));
}

void ctpu_k_attn_bwd(const ctpu_attn_args *a, ctpu_k_pool *pool)
{
    attn_job jb = { a, &ops_isa };
    run(pool, bwd_task, &jb, a->B * a->H);
}

void ctpu_k_attn_fwd_ref(const ctpu_attn_args *a)
{
    attn_job jb = { a, &ops_ref };
    run(NULL, fwd_task, &jb, a->B * a->H * ((a->Tq + BL - 1) / BL));
}

void ctpu_k_attn_bwd_ref(const ctpu_attn_args *a)
{
    attn_job jb = { a, &ops_ref };
    run(NULL, bwd_task, &jb, a->B * a->H);
}
