/* Blockwise attention (scaled_dot_product_attention), forward and backward.
 * q [B,H,Tq,D], k and v [B,H,Tk,D] contiguous (f32 or bf16); the order of
 * every operation is the contract written in kernels.h and CONTRACTS.md
 * "Attention": blocks of CTPU_K_ATTN_BLOCK queries x keys, key blocks in
 * ascending order, the MXU for both products, one division at the end.
 * Scores exist only as one block per thread ([128 x 128] f32), never as a
 * [B,H,Tq,Tk] buffer.
 *
 * The code is written once; the products and the transcendentals go through
 * a small table: the current ISA's (its MXU packer and micro-kernel driven
 * here, ctpu_k_unary) or the scalar references' (ctpu_k_matmul_ref,
 * ctpu_k_unary_ref). Everything else is one f32 operation at a time in plain
 * C (-ffp-contract=off), so the two give the same bits whenever their parts
 * do (tests/test_sdpa.c checks it).
 *
 * Per ISA: this file is built three times, as the baseline object (SSE2:
 * the dispatching entries and the references) and, through attention_avx2.c
 * and attention_avx512.c, with those ISAs' flags (CTPU_ATTN_SFX names the
 * variant), so the plain-C loops vectorise 4, 8 or 16 lanes wide; the
 * entries pick the variant of ctpu_kernels_isa() at each call. Each lane
 * does the scalar code's one f32 operation (no contraction, no reassociated
 * sums), so every variant has the reference's bits (tests/test_sdpa.c runs
 * them all).
 *
 * Speed (the order is untouched): a block is held transposed, [key][query],
 * so that the softmax's per-row running max and left-to-right sums run
 * across 16-byte vectors of query rows (each lane one row, keys in
 * ascending order, exactly the scalar order); K and V are packed once per
 * head and Q / dO once per query block, not once per product; causal blocks
 * wholly above the diagonal are skipped, and in a block on the diagonal the
 * scores' micro-tiles wholly above it, the masked scores' exps (P = +0) and,
 * in O += P V, each tile's keys past its last query (P = +0, V finite) are
 * not computed: terms that are exact zeros or overwritten, so the bits of
 * computing them (the reference computes every one). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "mxu.h"

#define BL CTPU_K_ATTN_BLOCK

/* ---------------------------------------------------------------- products
 * Every product is C[m][n] = sum_k XA[m,k] * XB[n,k], K consumed in the
 * MXU's one order (mxu.h), with XA and XB strided views
 * X[i,k] = src[i*si + k*sk]. `role` says which operand of the contract's
 * matmul each one is (0: A, 1: B): at HIGH / HIGHEST it picks the pass parts,
 * so a product computed transposed (C^T = B^T A^T, for a layout that suits
 * the softmax) keeps the contract's pass order and so its bits (as
 * ctpu_k_matmul's skinny-N transpose does). The ISA path packs each operand
 * with the current micro-kernel's packer (once per head for K and V, once
 * per query block for Q and dO) and runs its micro-kernel over the whole K;
 * the reference path is ctpu_k_matmul_ref on the contract's orientation. */
typedef struct { const void *src; int dt; int64_t si, sk, I, K; int role; } xop;

typedef struct {
    const ctpu_mxu_impl *im;   /* NULL: the scalar reference path */
    int npass, prec;
    void (*unary)(ctpu_k_unary_op op, const float *x, float *y, int64_t n);
} attn_ops;

static int64_t pk_dwords(const attn_ops *o, int w, int64_t I, int64_t K)
{
    int64_t d = (I + w - 1) / w * o->npass * ctpu_mxu_kh(K) * w * (o->im->planar ? 2 : 1);
    return (d + 15) / 16 * 16;     /* 64-byte aligned blocks */
}

static void pk(const attn_ops *o, const xop *x, int w, uint32_t *dst)
{
    ctpu_mxu_pack_args pa = {
        .src = x->src, .dt = x->dt, .si = x->si, .sk = x->sk, .I = x->I, .K = x->K, .w = w,
        .npass = o->npass, .parts = (x->role ? ctpu_mxu_pass_b : ctpu_mxu_pass_a)[o->prec], .dst = dst,
    };
    o->im->pack(&pa, 0, (x->I + w - 1) / w);
}

/* The row layout's row stride (dwords) for A operand x (mxu.h: A with
 * unit stride along k at default precision, no transpose in packing; the
 * rule of mxu.c's mm_row_layout), or 0: the ISA has none, or x does not
 * qualify. The row-layout micro-kernels run the same steps in the same
 * order as the planar ones (test_k_mxu), so the same bits. */
static int64_t ar_stride(const attn_ops *o, const xop *x)
{
    const ctpu_mxu_impl *im = o->im;
    if (!im->kernel_ar || !im->pack_ar || o->npass != 1 || o->prec != CTPU_PREC_DEFAULT || x->sk != 1 || x->si == 1 ||
        (x->dt != CTPU_KDT_F32 && x->dt != CTPU_KDT_BF16) || (im->planar && x->K < 32))
        return 0;
    int64_t rs = (ctpu_mxu_kh(x->K) * (im->planar ? 2 : 1) + 15) / 16 * 16;
    return rs % 256 == 0 ? rs + 16 : rs;
}

/* A operand x packed into dst as panels of mr: in the row layout when ars
 * (ar_stride's) is not 0, else as pk does. */
static void pk_a(const attn_ops *o, const xop *x, int64_t ars, uint32_t *dst)
{
    if (!ars) { pk(o, x, o->im->mr, dst); return; }
    ctpu_mxu_pack_args p = { .src = x->src, .dt = x->dt, .si = x->si, .sk = x->sk, .I = x->I, .K = x->K,
                             .w = o->im->mr, .npass = 1, .parts = ctpu_mxu_pass_a[CTPU_PREC_DEFAULT], .dst = dst };
    o->im->pack_ar(&p, ars, 0, (x->I + o->im->mr - 1) / o->im->mr);
}

/* Dwords of an A operand of I x K packed either way (the row layout's rows
 * padded by up to 32 dwords). */
static int64_t pk_a_dwords(const attn_ops *o, int64_t I, int64_t K)
{
    int mr = o->im->mr;
    int64_t ar = (I + mr - 1) / mr * mr * ((ctpu_mxu_kh(K) * (o->im->planar ? 2 : 1) + 15) / 16 * 16 + 16);
    int64_t pl = pk_dwords(o, mr, I, K);
    return ar > pl ? ar : pl;
}

/* ISA: c (row stride ldc) = packed A [M x K] (panels of mr; ars: the row
 * layout's row stride, 0: planar or pair panels) times packed B [N x K]
 * (panels of nr); tile: scratch for the edge tiles. */
/* A causal block's shape for mm_packed (the diagonal block's terms that
 * are exact zeros or are overwritten, never computed): kind TRI_ABOVE
 * (scores, C[m][n] = key m x query n): a tile whose every m > n + off is
 * masked (the causal rule sets it to -inf afterwards): filled with -inf,
 * not computed; kind TRI_KEYS (O += P V, C[m][.] = query m over keys k):
 * row m's keys past m + off have P = +0 and a finite V (the caller checks),
 * so a tile's K stops at its last row's last key, in whole pairs (default
 * precision only): the MXU accumulator is never -0 (it starts at +0, and x
 * + -x rounds to +0), so the skipped +-0 terms would not change it. */
enum { TRI_NONE, TRI_ABOVE, TRI_KEYS };
typedef struct { int kind; int64_t off; } attn_tri;

static void mm_packed(const attn_ops *o, const uint32_t *ap, int64_t ars, const uint32_t *bp, int64_t M, int64_t N,
                      int64_t K, float *c, int64_t ldc, float *tile, const attn_tri *tri)
{
    const ctpu_mxu_impl *im = o->im;
    int mr = im->mr, nr = im->nr, lw = im->planar ? 2 : 1;
    int64_t kp = o->npass * ctpu_mxu_kh(K), apd = ars ? ars * mr : kp * mr * lw, bpd = kp * nr * lw;
    int64_t mp = (M + mr - 1) / mr, np = (N + nr - 1) / nr;
    int tk = tri ? tri->kind : TRI_NONE;
    for (int64_t j = 0; j < np; j++) {
        int64_t n0 = j * nr, nn = N - n0 < nr ? N - n0 : nr;
        for (int64_t i = 0; i < mp; i++) {
            int64_t m0 = i * mr, mm = M - m0 < mr ? M - m0 : mr;
            const uint32_t *a = ap + i * apd, *b = bp + j * bpd;
            if (tk == TRI_ABOVE && m0 > n0 + nn - 1 + tri->off) {
                for (int64_t r = 0; r < mm; r++)
                    for (int64_t q = 0; q < nn; q++) c[(m0 + r) * ldc + n0 + q] = -INFINITY;
                continue;
            }
            int64_t kpt = kp;
            if (tk == TRI_KEYS && o->npass == 1) {
                int64_t keys = m0 + mm + tri->off;   /* the tile's last row reads keys [0, keys) */
                if (keys <= 0) {
                    for (int64_t r = 0; r < mm; r++) memset(c + (m0 + r) * ldc + n0, 0, sizeof(float) * (size_t)nn);
                    continue;
                }
                if (keys < K) kpt = ctpu_mxu_kh(keys);
            }
            if (ars) {   /* kernel_ar[mm] stores rows 0..mm-1 only */
                bool full = nn == nr;
                im->kernel_ar[mm](kpt, a, ars, b, NULL, 0, full ? c + m0 * ldc + n0 : tile, full ? ldc : nr, NULL);
                if (!full)
                    for (int64_t r = 0; r < mm; r++)
                        memcpy(c + (m0 + r) * ldc + n0, tile + r * nr, sizeof(float) * (size_t)nn);
                continue;
            }
            if (mm == mr && nn == nr) {
                im->kernel(kpt, a, b, c + m0 * ldc + n0, ldc, 0);
                continue;
            }
            ctpu_mxu_kernel_fn kf = mm < mr && im->kernel_rows ? im->kernel_rows[mm] : im->kernel;
            kf(kpt, a, b, tile, nr, 0);
            for (int64_t r = 0; r < mm; r++) memcpy(c + (m0 + r) * ldc + n0, tile + r * nr, sizeof(float) * (size_t)nn);
        }
    }
}

/* Prefetch queue: the head slices the thread's next item reads (and
 * writes), issued a few lines at a time from the current item's loops. A
 * head's rows are D values every H*D (BTHD) and come from L3: read cold,
 * they made the first pass over them (the packing of K, V, Q, dO; Dr's
 * products; the first writes of dQ, dK, dV) wait on each line. Hints
 * only: never read, no effect on any value. */
#define PFQ_MAX 8
typedef struct {
    const char *base;           /* row 0 */
    int64_t rows, stride;       /* rows, bytes between rows */
    int lpr, write;             /* 64-byte lines per row; prefetch for writing */
} attn_pfs;
typedef struct {
    attn_pfs s[PFQ_MAX];
    int n, t;                   /* slices; the current one */
    int64_t row;                /* the current row of slice t */
    int line;                   /* the next line of that row */
} attn_pfq;

static void pfq_step(attn_pfq *q, int k)
{
    while (k > 0 && q->t < q->n) {
        const attn_pfs *s = &q->s[q->t];
        if (q->row >= s->rows) { q->t++; q->row = 0; continue; }
        const char *line = s->base + q->row * s->stride + q->line * 64;
        if (s->write) __builtin_prefetch(line, 1, 2);
        else __builtin_prefetch(line, 0, 2);
        if (++q->line == s->lpr) { q->line = 0; q->row++; }
        k--;
    }
}

/* One thread's buffers. */
typedef struct {
    float *s;                   /* [BL*BL] scores, then P (transposed: [key][query]) */
    float *ds;                  /* [BL*BL] backward: Pd, then dP, then dS (transposed) */
    float *z;                   /* [BL*BL] backward with dropout: keep / (1 - p) (transposed) */
    uint16_t *p;                /* [BL*BL] forward: P in bf16 (transposed) */
    float *t;                   /* [BL*max(BL,D)] one product's block; the reference's transposes */
    float *acc;                 /* [BL*D] forward: O's accumulator */
    float *m, *l, *mu, *al, *u, *sum; /* [BL] each */
    int32_t *key;               /* [BL] row_max's */
    uint32_t *nan, *mb;         /* [BL] row_max's */
    float *tile;                /* an edge micro-tile */
    uint32_t *pa;               /* a per-block A operand, packed */
    uint32_t *pq[5];            /* [0] scratch; per query block: Q (scores), dO (dP), dOᵀ (dV), Qᵀ (dK) */
    uint32_t *hk, *hv, *hk2;    /* per head, every key block: K (scores), V (fwd: Vᵀ, bwd: V), bwd: Kᵀ */
    int64_t hbh;                /* the head hk/hv/hk2 hold, -1: none */
    int64_t blk_a, blk_b;       /* dwords per key block in hk/hk2 (A panels), hv */
    uint8_t *vfin;              /* forward, per key block of the head in hv: its V rows are all finite */
    attn_pfq pf;                /* the next item's rows, prefetched while this one computes */
} attn_ws;

static void *al64(size_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

static bool ws_init(attn_ws *w, const ctpu_attn_args *a, const attn_ops *o)
{
    memset(w, 0, sizeof *w);
    int64_t D = a->D, TD = D > BL ? D : BL;
    w->hbh = -1;
    w->s = al64(sizeof(float) * BL * BL);
    w->ds = al64(sizeof(float) * BL * BL);
    w->z = al64(sizeof(float) * BL * BL);
    w->p = al64(sizeof(uint16_t) * BL * BL);
    w->t = al64(sizeof(float) * (size_t)(BL * TD));
    w->acc = al64(sizeof(float) * (size_t)(BL * D));
    w->m = al64(sizeof(float) * BL * 9);
    if (!w->s || !w->ds || !w->z || !w->p || !w->t || !w->acc || !w->m) return false;
    w->l = w->m + BL;
    w->mu = w->l + BL;
    w->al = w->mu + BL;
    w->u = w->al + BL;
    w->sum = w->u + BL;
    w->key = (int32_t *)(void *)(w->sum + BL);
    w->nan = (uint32_t *)(void *)(w->sum + 2 * BL);
    w->mb = (uint32_t *)(void *)(w->sum + 3 * BL);
    if (!o->im) return true;
    int mr = o->im->mr, nr = o->im->nr;
    int64_t nkb = (a->Tk + BL - 1) / BL;
    w->tile = al64(sizeof(float) * (size_t)(mr * nr));
    w->pa = al64(4 * (size_t)pk_a_dwords(o, BL, BL));
    for (int i = 0; i < 5; i++) w->pq[i] = al64(4 * (size_t)pk_dwords(o, nr, TD, TD));
    /* K_J as A panels [bk x D]; V_J as A panels (backward) or Vᵀ as B
     * panels [D x bk] (forward); Kᵀ as B panels [D x bk] */
    int64_t ka = pk_a_dwords(o, BL, D), kb = pk_dwords(o, nr, D, BL);
    w->blk_a = ka;
    w->blk_b = ka > kb ? ka : kb;
    w->hk = al64(4 * (size_t)(nkb * ka));
    w->hv = al64(4 * (size_t)(nkb * w->blk_b));
    w->hk2 = al64(4 * (size_t)(nkb * w->blk_b));
    w->vfin = al64((size_t)nkb);
    if (!w->vfin || !w->tile || !w->pa || !w->pq[0] || !w->pq[1] || !w->pq[2] || !w->pq[3] || !w->pq[4] || !w->hk || !w->hv || !w->hk2)
        return false;
    return true;
}

static void ws_free(attn_ws *w)
{
    free(w->s);
    free(w->ds);
    free(w->z);
    free(w->p);
    free(w->t);
    free(w->acc);
    free(w->m);
    free(w->tile);
    free(w->pa);
    for (int i = 0; i < 5; i++) free(w->pq[i]);
    free(w->hk);
    free(w->hv);
    free(w->vfin);
    free(w->hk2);
}

/* c (row stride ldc) = XA · XBᵀ (M = A->I, N = B->I, K shared); pa / pb:
 * the operands already packed (ISA path) or NULL (packed here). */
static void product_tri(const attn_ops *o, attn_ws *w, const xop *A, const uint32_t *pa, const xop *B,
                        const uint32_t *pb, float *c, int64_t ldc, const attn_tri *tri)
{
    int64_t M = A->I, N = B->I, K = A->K;
    if (o->im) {
        int64_t ars = ar_stride(o, A);   /* pack_head's A operands follow the same rule */
        if (!pa) { pk_a(o, A, ars, w->pa); pa = w->pa; }
        if (!pb) { pk(o, B, o->im->nr, w->pq[0]); pb = w->pq[0]; }
        mm_packed(o, pa, ars, pb, M, N, K, c, ldc, w->tile, tri);
        return;
    }
    /* the reference, in the contract's orientation: A role 0 is C = A Bᵀ's
     * matmul A; role 1 means C is the transpose of the contract's product */
    const xop *ma = A->role == 0 ? A : B, *mb = A->role == 0 ? B : A;
    bool tr = A->role != 0;
    ctpu_mm_args mm = {
        .batch = 1, .M = ma->I, .N = mb->I, .K = K,
        .a = ma->src, .a_dtype = ma->dt, .a_rs = ma->si, .a_cs = ma->sk,
        .b = mb->src, .b_dtype = mb->dt, .b_rs = mb->sk, .b_cs = mb->si,
        .c = tr ? w->t : c, .c_dtype = CTPU_KDT_F32, .ldc = tr ? M : ldc, .precision = (ctpu_k_precision)o->prec,
    };
    ctpu_k_matmul_ref(&mm);
    if (tr)
        for (int64_t n = 0; n < N; n++)
            for (int64_t m = 0; m < M; m++) c[m * ldc + n] = w->t[n * M + m];
}

static void product(const attn_ops *o, attn_ws *w, const xop *A, const uint32_t *pa, const xop *B,
                    const uint32_t *pb, float *c, int64_t ldc)
{
    product_tri(o, w, A, pa, B, pb, c, ldc, NULL);
}

/* The running max of the softmax, per query row: m = max(m, s_j) for j
 * ascending, a NaN anywhere giving NaN. Computed on the bits so that the
 * loop over a block's rows vectorises (a float compare may trap, so the
 * compiler keeps it scalar): floats ordered as sign-magnitude integers, +0
 * and -0 one key (a tie keeps the newer value, as `m > s ? m : s` does),
 * NaN flagged on the side. */
static inline uint32_t fbits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline int32_t fkey(uint32_t u)
{
    uint32_t k = u ^ ((uint32_t)((int32_t)u >> 31) & 0x7fffffffu);
    return (int32_t)(k & (0u - (uint32_t)((u & 0x7fffffffu) != 0)));
}

/* mx[i] = the running max of m[i] and s[j*BL + i], j < bk (i < bq); mb,
 * key, nan: [BL] scratch */
static void row_max(const float *restrict m, const float *restrict s, int64_t bq, int64_t bk, float *restrict mx,
                    uint32_t *restrict mb, int32_t *restrict key, uint32_t *restrict nan)
{
    for (int64_t i = 0; i < bq; i++) {
        uint32_t u = fbits(m[i]);
        mb[i] = u;
        key[i] = fkey(u);
        nan[i] = (u & 0x7fffffffu) > 0x7f800000u;
    }
    for (int64_t j = 0; j < bk; j++) {
        const float *r = s + j * BL;
        for (int64_t i = 0; i < bq; i++) {
            uint32_t u = fbits(r[i]);
            int32_t k = fkey(u), kk = key[i];
            uint32_t keep = 0u - (uint32_t)(kk > k);
            mb[i] = (mb[i] & keep) | (u & ~keep);
            key[i] = (int32_t)(((uint32_t)kk & keep) | ((uint32_t)k & ~keep));
            nan[i] |= (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
        }
    }
    for (int64_t i = 0; i < bq; i++) {
        uint32_t u = nan[i] ? 0x7fc00000u : mb[i];
        memcpy(&mx[i], &u, 4);
    }
}

/* Row t of head bh of a [B,H,T,D] (or, BTHD, [B,T,H,D]) tensor: its
 * element offset, and the stride between a head's rows. */
static inline int64_t roff(const ctpu_attn_args *a, int64_t bh, int64_t T, int64_t t)
{
    if (a->layout == CTPU_K_ATTN_BTHD) return ((bh / a->H * T + t) * a->H + bh % a->H) * a->D;
    return (bh * T + t) * a->D;
}
static inline int64_t rstr(const ctpu_attn_args *a) { return a->layout == CTPU_K_ATTN_BTHD ? a->H * a->D : a->D; }

static inline const void *row_of(const ctpu_attn_args *a, const void *base, int64_t bh, int64_t T, int64_t t)
{
    return (const char *)base + (size_t)roff(a, bh, T, t) * ctpu_kdt_size(a->dtype);
}
static inline float *frow(const ctpu_attn_args *a, float *base, int64_t bh, int64_t T, int64_t t)
{
    return base + roff(a, bh, T, t);
}
static inline const float *crow(const ctpu_attn_args *a, const float *base, int64_t bh, int64_t T, int64_t t)
{
    return base + roff(a, bh, T, t);
}

static inline int64_t blen(int64_t T, int64_t x0) { return T - x0 < BL ? T - x0 : BL; }

/* Queue rows [t0, t0 + rows) of head bh of base (elements of esz bytes). */
static void pfq_add(attn_pfq *q, const ctpu_attn_args *a, const void *base, size_t esz, int64_t bh, int64_t T,
                    int64_t t0, int64_t rows, int write)
{
    if (!base || rows <= 0 || q->n >= PFQ_MAX) return;
    attn_pfs *s = &q->s[q->n++];
    uintptr_t st = (uintptr_t)base + (uintptr_t)(roff(a, bh, T, t0) * (int64_t)esz);
    s->base = (const char *)(st & ~(uintptr_t)63);
    s->stride = rstr(a) * (int64_t)esz;
    s->lpr = (int)(((st & 63) + (uintptr_t)a->D * esz + 63) / 64);
    s->rows = rows;
    s->write = write;
}

/* The next forward item (head bh, query block qb; cur: the current head,
 * whose packed K and V the next item reuses when it is the same head). */
static void pfq_fwd(attn_pfq *q, const ctpu_attn_args *a, int64_t bh, int64_t qb, int64_t cur)
{
    size_t e = ctpu_kdt_size(a->dtype);
    int64_t i0 = qb * BL, bq = blen(a->Tq, i0);
    memset(q, 0, sizeof *q);
    if (bh != cur) {
        pfq_add(q, a, a->k, e, bh, a->Tk, 0, a->Tk, 0);
        pfq_add(q, a, a->v, e, bh, a->Tk, 0, a->Tk, 0);
    }
    pfq_add(q, a, a->q, e, bh, a->Tq, i0, bq, 0);
    pfq_add(q, a, a->o, 4, bh, a->Tq, i0, bq, 1);
}

/* The next backward head (bh): its inputs read, its gradients written. */
static void pfq_bwd(attn_pfq *q, const ctpu_attn_args *a, int64_t bh)
{
    size_t e = ctpu_kdt_size(a->dtype);
    memset(q, 0, sizeof *q);
    pfq_add(q, a, a->k, e, bh, a->Tk, 0, a->Tk, 0);
    pfq_add(q, a, a->v, e, bh, a->Tk, 0, a->Tk, 0);
    pfq_add(q, a, a->q, e, bh, a->Tq, 0, a->Tq, 0);
    pfq_add(q, a, a->dout, 4, bh, a->Tq, 0, a->Tq, 0);
    pfq_add(q, a, a->o_in, 4, bh, a->Tq, 0, a->Tq, 0);
    pfq_add(q, a, a->dq, 4, bh, a->Tq, 0, a->Tq, 1);
    pfq_add(q, a, a->dk, 4, bh, a->Tk, 0, a->Tk, 1);
    pfq_add(q, a, a->dv, 4, bh, a->Tk, 0, a->Tk, 1);
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

/* Are rows [0, n) of d values (stride rs elements, f32 or bf16) all finite?
 * (The exponent fields' maximum: a loop that vectorises.) */
static bool rows_finite(const void *base, int dt, int64_t rs, int64_t n, int64_t d)
{
    if (dt == CTPU_KDT_BF16) {
        uint16_t mx = 0;
        for (int64_t r = 0; r < n; r++) {
            const uint16_t *x = (const uint16_t *)base + r * rs;
            for (int64_t k = 0; k < d; k++) { uint16_t e = x[k] & 0x7f80u; mx = e > mx ? e : mx; }
        }
        return mx != 0x7f80u;
    }
    uint32_t mx = 0;
    for (int64_t r = 0; r < n; r++) {
        const uint32_t *x = (const uint32_t *)base + r * rs;
        for (int64_t k = 0; k < d; k++) { uint32_t e = x[k] & 0x7f800000u; mx = e > mx ? e : mx; }
    }
    return mx != 0x7f800000u;
}

/* The head's K_J (and V_J) packed once, for every key block (ISA path). bwd:
 * V as A panels and Kᵀ as B panels (else Vᵀ as B panels). */
static void pack_head(const ctpu_attn_args *a, const attn_ops *o, attn_ws *w, int64_t bh, bool bwd)
{
    if (!o->im || w->hbh == bh * 2 + bwd) return;
    int64_t D = a->D, rs = rstr(a), nkb = (a->Tk + BL - 1) / BL;
    for (int64_t kb = 0; kb < nkb; kb++) {
        int64_t j0 = kb * BL, bk = blen(a->Tk, j0);
        const void *kr = row_of(a, a->k, bh, a->Tk, j0), *vr = row_of(a, a->v, bh, a->Tk, j0);
        xop K = { kr, a->dtype, rs, 1, bk, D, 1 };
        pk_a(o, &K, ar_stride(o, &K), w->hk + kb * w->blk_a);
        if (bwd) {
            xop V = { vr, a->dtype, rs, 1, bk, D, 1 }, Kt = { kr, a->dtype, 1, rs, D, bk, 1 };
            pk_a(o, &V, ar_stride(o, &V), w->hv + kb * w->blk_b);
            pk(o, &Kt, o->im->nr, w->hk2 + kb * w->blk_b);
        } else {
            xop Vt = { vr, a->dtype, 1, rs, D, bk, 1 };
            pk(o, &Vt, o->im->nr, w->hv + kb * w->blk_b);
            w->vfin[kb] = rows_finite(vr, a->dtype, rs, bk, D);
        }
    }
    w->hbh = bh * 2 + bwd;
}

/* s[j*BL + i], j < bk, i < bq (transposed): MXU(Q_I K_Jᵀ) * scale, then the
 * mask and the causal rule (kernels.h). qx: Q_I as the B operand; pq: it
 * packed (ISA) or NULL. */
static void scores(const ctpu_attn_args *a, const attn_ops *o, attn_ws *w, int64_t bh, int64_t i0, int64_t bq,
                   int64_t kb, const xop *qx, const uint32_t *pq)
{
    int64_t D = a->D, j0 = kb * BL, bk = blen(a->Tk, j0);
    xop K = { row_of(a, a->k, bh, a->Tk, j0), a->dtype, rstr(a), 1, bk, D, 1 };
    /* causal: tiles wholly above the diagonal are not computed (the rule
     * below sets them to -inf whatever they held) */
    attn_tri tri = { a->causal ? TRI_ABOVE : TRI_NONE, i0 - j0 };
    product_tri(o, w, &K, o->im ? w->hk + kb * w->blk_a : NULL, qx, pq, w->s, BL, &tri);
    int64_t b = bh / a->H, h = bh % a->H;
    float sc = a->scale;
    for (int64_t j = 0; j < bk; j++) {
        float *r = w->s + j * BL;
        pfq_step(&w->pf, 4);
        for (int64_t i = 0; i < bq; i++) r[i] = r[i] * sc;
        if (a->mask_kind != CTPU_K_MASK_NONE) {
            const float *mr = a->mask + b * a->ms[0] + h * a->ms[1] + i0 * a->ms[2] + (j0 + j) * a->ms[3];
            int64_t st = a->ms[2];
            if (a->mask_kind == CTPU_K_MASK_ADD)
                for (int64_t i = 0; i < bq; i++) r[i] = r[i] + mr[i * st];
            else
                for (int64_t i = 0; i < bq; i++) if (mr[i * st] == 0.0f) r[i] = -INFINITY;
        }
        /* causal: j0 + j > i0 + i, i.e. i < j0 + j - i0 */
        if (a->causal)
            for (int64_t i = 0, e = j0 + j - i0 < bq ? j0 + j - i0 : bq; i < e; i++) r[i] = -INFINITY;
    }
}

/* The dropout draws of row i, keys [j0, j0 + bk): u in [0, 1). */
static void draws(const ctpu_attn_args *a, int64_t bh, int64_t i, int64_t j0, int64_t bk, float *u)
{
    int64_t start = (bh * a->Tq + i) * a->Tk + j0;
    ctpu_k_rand_uniform(a->seed, a->offset, start, bk, 0.0f, 1.0f, u);
}

/* ------------------------------------------------------------ forward */
/* P (transposed, bf16 at default precision) and the row sums into l, per
 * key block; the order per query row is the contract's (j ascending). */
/* +0, read at run time: a loop storing it is not turned into a memset (an
 * inline `rep stos`, ~30 cycles to start, for each of a block's 128 rows) */
static volatile float attn_zero = 0.0f;

/* causal (off = i0 - j0 >= -bk): the queries i < j - off of key row j are
 * masked, s = -inf, so their P is exp(-inf - mu) = +0 when no mu is NaN: set,
 * not computed (and their +0 left out of the sums, which it would not
 * change). Returns whether that held (no NaN mu). */
static bool fwd_softmax(const attn_ops *o, attn_ws *w, int64_t bq, int64_t bk, bool bf16p, bool causal, int64_t off)
{
    float *mx = w->u;   /* the new running max */
    row_max(w->m, w->s, bq, bk, mx, w->mb, w->key, w->nan);
    uint32_t nan = 0;
    for (int64_t i = 0; i < bq; i++) {
        float mu = mx[i] == -INFINITY ? 0.0f : mx[i];
        w->al[i] = w->m[i] - mu;
        w->m[i] = mx[i];
        w->mu[i] = mu;
        w->sum[i] = 0.0f;
        nan |= (uint32_t)(mu != mu);
    }
    bool skip = causal && !nan;
    const float z = attn_zero;
    const uint16_t z16 = (uint16_t)attn_zero;
    for (int64_t j = 0; j < bk; j++) {
        float *r = w->s + j * BL;
        pfq_step(&w->pf, 4);
        int64_t e = skip ? (j - off < 0 ? 0 : j - off > bq ? bq : j - off) / 16 * 16 : 0;   /* (whole vectors) */
        if (bf16p) { uint16_t *pr = w->p + j * BL; for (int64_t i = 0; i < e; i++) pr[i] = z16; }
        else for (int64_t i = 0; i < e; i++) r[i] = z;
        for (int64_t i = e; i < bq; i++) r[i] = r[i] - w->mu[i];
        o->unary(CTPU_K_U_EXP, r + e, r + e, bq - e);
        if (bf16p) {
            uint16_t *pr = w->p + j * BL;
            float *sm = w->sum;
            for (int64_t i = e; i < bq; i++) {
                /* ctpu_f32_to_bf16's bits, branch-free (vectorises) */
                uint32_t hb = ctpu_mxu_round_bits(fbits(r[i]));
                float pv;
                memcpy(&pv, &hb, 4);
                pr[i] = (uint16_t)(hb >> 16);
                sm[i] = sm[i] + pv;
            }
        } else {
            for (int64_t i = e; i < bq; i++) w->sum[i] = w->sum[i] + r[i];
        }
    }
    o->unary(CTPU_K_U_EXP, w->al, w->al, bq);
    for (int64_t i = 0; i < bq; i++) w->l[i] = w->l[i] * w->al[i] + w->sum[i];
    return skip;
}

static void fwd_block(const ctpu_attn_args *a, const attn_ops *o, attn_ws *w, int64_t bh, int64_t qb)
{
    int64_t D = a->D, i0 = qb * BL, bq = blen(a->Tq, i0);
    float pf = (float)a->p;
    /* P is rounded to bf16 at default precision (the MXU operand it is, and
     * the l summed is of those values); HIGH / HIGHEST keep it f32 and the
     * MXU splits it into passes like any f32 operand */
    bool bf16p = a->precision == CTPU_PREC_DEFAULT;
    for (int64_t i = 0; i < bq; i++) { w->m[i] = -INFINITY; w->l[i] = 0.0f; w->mu[i] = 0.0f; }
    memset(w->acc, 0, sizeof(float) * (size_t)(bq * D));
    pack_head(a, o, w, bh, false);
    int64_t rs = rstr(a);
    xop Q = { row_of(a, a->q, bh, a->Tq, i0), a->dtype, rs, 1, bq, D, 0 };
    const uint32_t *pq = NULL;
    if (o->im) { pk(o, &Q, o->im->nr, w->pq[1]); pq = w->pq[1]; }
    int64_t nkb = key_blocks(a, i0, bq);
    for (int64_t kb = 0; kb < nkb; kb++) {
        int64_t j0 = kb * BL, bk = blen(a->Tk, j0);
        scores(a, o, w, bh, i0, bq, kb, &Q, pq);
        bool zeros = fwd_softmax(o, w, bq, bk, bf16p, a->causal, i0 - j0);
        if (a->p > 0) {
            for (int64_t i = 0; i < bq; i++) {
                draws(a, bh, i0 + i, j0, bk, w->u);
                if (bf16p) { for (int64_t j = 0; j < bk; j++) if (!(w->u[j] >= pf)) w->p[j * BL + i] = 0; }
                else for (int64_t j = 0; j < bk; j++) if (!(w->u[j] >= pf)) w->s[j * BL + i] = 0.0f;
            }
        }
        for (int64_t i = 0; i < bq; i++) {
            float *or = w->acc + i * D, al = w->al[i];
            for (int64_t d = 0; d < D; d++) or[d] = or[d] * al;
        }
        /* O_I += P V_J: A = P [bq x bk] (stored transposed), B = V_Jᵀ */
        xop P = { bf16p ? (const void *)w->p : (const void *)w->s, bf16p ? CTPU_KDT_BF16 : CTPU_KDT_F32, 1, BL, bq, bk, 0 };
        xop Vt = { row_of(a, a->v, bh, a->Tk, j0), a->dtype, 1, rs, D, bk, 1 };
        /* causal: query i's keys past i are +0 in P; with V finite there
         * (0 * V = +-0) each tile's K stops at its last query (mm_packed) */
        attn_tri tri = { zeros && o->im && w->vfin[kb] ? TRI_KEYS : TRI_NONE, i0 - j0 };
        product_tri(o, w, &P, NULL, &Vt, o->im ? w->hv + kb * w->blk_b : NULL, w->t, D, &tri);
        for (int64_t x = 0; x < bq * D; x++) w->acc[x] = w->acc[x] + w->t[x];
    }
    float keep = (float)(1.0 - a->p);
    float *out = frow(a, a->o, bh, a->Tq, i0), *lse = a->lse + bh * a->Tq + i0;
    for (int64_t i = 0; i < bq; i++) {
        float den = w->l[i] * keep;
        const float *ar = w->acc + i * D;
        float *orow = out + i * rs;
        if (w->l[i] == 0.0f) memset(orow, 0, sizeof(float) * (size_t)D);
        else for (int64_t d = 0; d < D; d++) orow[d] = ar[d] / den;
    }
    o->unary(CTPU_K_U_LOG, w->l, lse, bq);
    for (int64_t i = 0; i < bq; i++) lse[i] = w->mu[i] + lse[i];
}

typedef struct {
    const ctpu_attn_args *a;
    const attn_ops *ops;
    int mode;                   /* backward: 0 per head; 1 dQ per query block; 2 dK, dV per key block */
} attn_job;

static void fwd_task(void *ctx, int tid, int nt)
{
    const attn_job *jb = ctx;
    const ctpu_attn_args *a = jb->a;
    int64_t nqb = (a->Tq + BL - 1) / BL, n = a->B * a->H * nqb;
    int64_t u0 = n * tid / nt, u1 = n * (tid + 1) / nt;
    if (u0 >= u1) return;
    attn_ws w;
    if (!ws_init(&w, a, jb->ops)) abort();   /* out of host memory, as the MXU driver's workspace */
    for (int64_t u = u0; u < u1; u++) {
        if (u + 1 < u1) pfq_fwd(&w.pf, a, (u + 1) / nqb, (u + 1) % nqb, u / nqb);
        else memset(&w.pf, 0, sizeof w.pf);
        fwd_block(a, jb->ops, &w, u / nqb, u % nqb);
    }
    ws_free(&w);
}

/* ------------------------------------------------------------ backward */
/* dst[x] += t[x] for x < n */
static void add_into(float *dst, const float *t, int64_t n)
{
    for (int64_t x = 0; x < n; x++) dst[x] = dst[x] + t[x];
}

/* dst[x] = +0 + t[x]: the first term of a sum that starts at +0, its bits
 * without zeroing and reading dst first */
static void first_into(float *dst, const float *t, int64_t n)
{
    for (int64_t x = 0; x < n; x++) dst[x] = t[x] + 0.0f;
}

/* rows r < nr of D floats: dst[r*rs + d] += t[r*D + d] (first: the sum's
 * first term, dst = +0 + t) */
static void add_rows(float *dst, int64_t rs, const float *t, int64_t nr, int64_t D, bool first)
{
    void (*f)(float *, const float *, int64_t) = first ? first_into : add_into;
    if (rs == D) { f(dst, t, nr * D); return; }
    for (int64_t r = 0; r < nr; r++) f(dst + r * rs, t + r * D, D);
}

/* rows [t0, t0 + nr) of head bh set to +0 */
static void zero_rows(const ctpu_attn_args *a, float *base, int64_t bh, int64_t T, int64_t t0, int64_t nr)
{
    int64_t rs = rstr(a);
    float *p = frow(a, base, bh, T, t0);
    if (rs == a->D) { memset(p, 0, sizeof(float) * (size_t)(nr * a->D)); return; }
    for (int64_t r = 0; r < nr; r++) memset(p + r * rs, 0, sizeof(float) * (size_t)a->D);
}

/* Query block I's per-row values (mu: the lse to subtract, +inf for a fully
 * masked row: P = 0; l: Dr_i = sum_d dO_id * O_id, left to right) and its
 * operands packed (ISA): Q and dO as B panels [bq x D]; with dkv, dOᵀ and
 * Qᵀ as B panels [D x bq]. */
static void bwd_prep(const ctpu_attn_args *a, const attn_ops *o, attn_ws *w, int64_t bh, int64_t i0, int64_t bq,
                     bool dkv)
{
    int64_t D = a->D, rs = rstr(a);
    for (int64_t i = 0; i < bq; i++) {
        float lse = a->lse_in[bh * a->Tq + i0 + i];
        w->mu[i] = lse == -INFINITY ? INFINITY : lse;
        w->l[i] = 0.0f;
    }
    /* Dr_i: each row's sum left to right, the rows side by side (a row's
     * chain of D dependent additions alone would wait on each one). The
     * products first, row by row (contiguous loads), stored transposed into
     * t ([d][i]; t is free until the first pair), then the sums across the
     * rows: the same products and the same order as summing in place, but
     * no strided gathers (they took ~13 us of a 128 x 32 block) */
    const float *o0 = crow(a, a->o_in, bh, a->Tq, i0), *g0 = crow(a, a->dout, bh, a->Tq, i0);
    float *pt = w->t;
    for (int64_t i = 0; i < bq; i++) {
        const float *gr = g0 + i * rs, *orr = o0 + i * rs;
        float pr[16];
        for (int64_t d0 = 0; d0 < D; d0 += 16) {
            int64_t n = D - d0 < 16 ? D - d0 : 16;
            for (int64_t d = 0; d < n; d++) pr[d] = gr[d0 + d] * orr[d0 + d];
            for (int64_t d = 0; d < n; d++) pt[(d0 + d) * BL + i] = pr[d];
        }
    }
    for (int64_t d = 0; d < D; d++)
        for (int64_t i = 0; i < bq; i++) w->l[i] = w->l[i] + pt[d * BL + i];
    if (!o->im) return;
    const void *qr = row_of(a, a->q, bh, a->Tq, i0);
    const float *dO = crow(a, a->dout, bh, a->Tq, i0);
    xop Q = { qr, a->dtype, rs, 1, bq, D, 0 }, G = { dO, CTPU_KDT_F32, rs, 1, bq, D, 0 };
    pk(o, &Q, o->im->nr, w->pq[1]);
    pk(o, &G, o->im->nr, w->pq[2]);
    if (!dkv) return;
    xop Gt = { dO, CTPU_KDT_F32, 1, rs, D, bq, 1 }, Qt = { qr, a->dtype, 1, rs, D, bq, 1 };
    pk(o, &Gt, o->im->nr, w->pq[3]);
    pk(o, &Qt, o->im->nr, w->pq[4]);
}

#define WANT_DQ 1
#define WANT_DKV 2
#define FIRST_DQ 4    /* this pair's term is the first of dQ_I's sum (else added) */
#define FIRST_DKV 8   /* ... of dK_J's and dV_J's */

/* One (query block I, key block J) of the backward (kernels.h's order),
 * blocks transposed ([key][query]); `want`: the sums it adds to. */
static void bwd_pair(const ctpu_attn_args *a, const attn_ops *o, attn_ws *w, int64_t bh, int64_t i0, int64_t bq,
                     int64_t kb, int want)
{
    int64_t D = a->D, rs = rstr(a), j0 = kb * BL, bk = blen(a->Tk, j0);
    float pf = (float)a->p, inv = a->p > 0 ? (float)(1.0 / (1.0 - a->p)) : 1.0f, sc = a->scale;
    const float *dO = crow(a, a->dout, bh, a->Tq, i0);
    const void *qr = row_of(a, a->q, bh, a->Tq, i0);
    const void *kr = row_of(a, a->k, bh, a->Tk, j0), *vr = row_of(a, a->v, bh, a->Tk, j0);
    bool isa = o->im != NULL;
    xop Q = { qr, a->dtype, rs, 1, bq, D, 0 };
    scores(a, o, w, bh, i0, bq, kb, &Q, isa ? w->pq[1] : NULL);
    /* causal: a masked score's P = exp(-inf - mu) = +0 unless mu is NaN
     * (mu: the lse, +inf for a fully masked row): set, not computed */
    uint32_t nan = 0;
    for (int64_t i = 0; i < bq; i++) nan |= (uint32_t)(w->mu[i] != w->mu[i]);
    int64_t off = a->causal && !nan ? i0 - j0 : INT64_MAX / 2;
    const float z = attn_zero;
    for (int64_t j = 0; j < bk; j++) {
        float *r = w->s + j * BL;
        pfq_step(&w->pf, 4);
        int64_t e = (j - off < 0 ? 0 : j - off > bq ? bq : j - off) / 16 * 16;   /* (whole vectors) */
        for (int64_t i = 0; i < e; i++) r[i] = z;
        for (int64_t i = e; i < bq; i++) r[i] = r[i] - w->mu[i];
        o->unary(CTPU_K_U_EXP, r + e, r + e, bq - e);
    }
    /* Pd = P * z (z = keep / (1 - p)), into ds */
    const float *pd = w->s;
    if (a->p > 0) {
        for (int64_t i = 0; i < bq; i++) {
            draws(a, bh, i0 + i, j0, bk, w->u);
            for (int64_t j = 0; j < bk; j++) w->z[j * BL + i] = w->u[j] >= pf ? inv : 0.0f;
        }
        for (int64_t j = 0; j < bk; j++) {
            float *dr = w->ds + j * BL;
            const float *r = w->s + j * BL, *z = w->z + j * BL;
            for (int64_t i = 0; i < bq; i++) dr[i] = r[i] * z[i];
        }
        pd = w->ds;
    }
    if (want & WANT_DKV) {   /* dV_J += Pdᵀ dO_I */
        xop A = { pd, CTPU_KDT_F32, BL, 1, bk, bq, 0 }, B = { dO, CTPU_KDT_F32, 1, rs, D, bq, 1 };
        product(o, w, &A, NULL, &B, isa ? w->pq[3] : NULL, w->t, D);
        add_rows(frow(a, a->dv, bh, a->Tk, j0), rs, w->t, bk, D, want & FIRST_DKV);
    }
    /* dP = dO_I V_Jᵀ (transposed: V_J dO_Iᵀ) into ds, then dS = P * (dP * z - Dr) * scale */
    xop V = { vr, a->dtype, rs, 1, bk, D, 1 }, G = { dO, CTPU_KDT_F32, rs, 1, bq, D, 0 };
    product(o, w, &V, isa ? w->hv + kb * w->blk_b : NULL, &G, isa ? w->pq[2] : NULL, w->ds, BL);
    for (int64_t j = 0; j < bk; j++) {
        float *dr = w->ds + j * BL;
        const float *r = w->s + j * BL;
        pfq_step(&w->pf, 8);
        if (a->p > 0) {
            const float *z = w->z + j * BL;
            for (int64_t i = 0; i < bq; i++) dr[i] = dr[i] * z[i];
        }
        for (int64_t i = 0; i < bq; i++) dr[i] = r[i] * (dr[i] - w->l[i]) * sc;
    }
    if (want & WANT_DQ) {    /* dQ_I += dS K_J */
        xop A = { w->ds, CTPU_KDT_F32, 1, BL, bq, bk, 0 }, B = { kr, a->dtype, 1, rs, D, bk, 1 };
        product(o, w, &A, NULL, &B, isa ? w->hk2 + kb * w->blk_b : NULL, w->t, D);
        add_rows(frow(a, a->dq, bh, a->Tq, i0), rs, w->t, bq, D, want & FIRST_DQ);
    }
    if (want & WANT_DKV) {   /* dK_J += dSᵀ Q_I */
        xop A = { w->ds, CTPU_KDT_F32, BL, 1, bk, bq, 0 }, B = { qr, a->dtype, 1, rs, D, bq, 1 };
        product(o, w, &A, NULL, &B, isa ? w->pq[4] : NULL, w->t, D);
        add_rows(frow(a, a->dk, bh, a->Tk, j0), rs, w->t, bk, D, want & FIRST_DKV);
    }
}

/* The whole head: query blocks ascending, in each the key blocks ascending. */
static void bwd_head(const ctpu_attn_args *a, const attn_ops *o, attn_ws *w, int64_t bh)
{
    pack_head(a, o, w, bh, true);
    int64_t seen = 0;   /* key blocks [0, seen) have their first dK, dV terms */
    for (int64_t i0 = 0; i0 < a->Tq; i0 += BL) {
        int64_t bq = blen(a->Tq, i0);
        bwd_prep(a, o, w, bh, i0, bq, true);
        int64_t nkb = key_blocks(a, i0, bq);
        for (int64_t kb = 0; kb < nkb; kb++)
            bwd_pair(a, o, w, bh, i0, bq, kb, WANT_DQ | WANT_DKV | (kb == 0 ? FIRST_DQ : 0) | (kb >= seen ? FIRST_DKV : 0));
        if (nkb > seen) seen = nkb;
        if (nkb == 0) zero_rows(a, a->dq, bh, a->Tq, i0, bq);
    }
    /* key blocks no query sees (causal, Tk > Tq): their sums are +0 */
    if (seen * BL < a->Tk) {
        zero_rows(a, a->dk, bh, a->Tk, seen * BL, a->Tk - seen * BL);
        zero_rows(a, a->dv, bh, a->Tk, seen * BL, a->Tk - seen * BL);
    }
}

/* dQ_I alone: key blocks ascending (the same sum as bwd_head's). */
static void bwd_dq(const ctpu_attn_args *a, const attn_ops *o, attn_ws *w, int64_t bh, int64_t qb)
{
    int64_t i0 = qb * BL, bq = blen(a->Tq, i0);
    pack_head(a, o, w, bh, true);
    bwd_prep(a, o, w, bh, i0, bq, false);
    int64_t nkb = key_blocks(a, i0, bq);
    if (nkb == 0) zero_rows(a, a->dq, bh, a->Tq, i0, bq);
    for (int64_t kb = 0; kb < nkb; kb++) bwd_pair(a, o, w, bh, i0, bq, kb, WANT_DQ | (kb == 0 ? FIRST_DQ : 0));
}

/* dK_J and dV_J alone: the query blocks that see key block J, ascending
 * (the same sums as bwd_head's). */
static void bwd_dkv(const ctpu_attn_args *a, const attn_ops *o, attn_ws *w, int64_t bh, int64_t kb)
{
    int64_t j0 = kb * BL, bk = blen(a->Tk, j0);
    pack_head(a, o, w, bh, true);
    bool first = true;
    for (int64_t i0 = 0; i0 < a->Tq; i0 += BL) {
        int64_t bq = blen(a->Tq, i0);
        if (key_blocks(a, i0, bq) <= kb) continue;
        bwd_prep(a, o, w, bh, i0, bq, true);
        bwd_pair(a, o, w, bh, i0, bq, kb, WANT_DKV | (first ? FIRST_DKV : 0));
        first = false;
    }
    if (first) {   /* no query sees this key block: its sums are +0 */
        zero_rows(a, a->dk, bh, a->Tk, j0, bk);
        zero_rows(a, a->dv, bh, a->Tk, j0, bk);
    }
}

static void bwd_task(void *ctx, int tid, int nt)
{
    const attn_job *jb = ctx;
    const ctpu_attn_args *a = jb->a;
    int64_t per = jb->mode == 0 ? 1 : jb->mode == 1 ? (a->Tq + BL - 1) / BL : (a->Tk + BL - 1) / BL;
    int64_t n = a->B * a->H * per;
    int64_t u0 = n * tid / nt, u1 = n * (tid + 1) / nt;
    if (u0 >= u1) return;
    attn_ws w;
    if (!ws_init(&w, a, jb->ops)) abort();
    for (int64_t u = u0; u < u1; u++) {
        memset(&w.pf, 0, sizeof w.pf);
        if (jb->mode == 0 && u + 1 < u1) pfq_bwd(&w.pf, a, u + 1);
        if (jb->mode == 0) bwd_head(a, jb->ops, &w, u);
        else if (jb->mode == 1) bwd_dq(a, jb->ops, &w, u / per, u % per);
        else bwd_dkv(a, jb->ops, &w, u / per, u % per);
    }
    ws_free(&w);
}

/* ------------------------------------------------------------ entries */
static void run(ctpu_k_pool *pool, void (*fn)(void *, int, int), void *ctx, int64_t items)
{
    if (items <= 0) return;
    if (pool && pool->nthreads > 1 && items > 1) pool->run(pool, fn, ctx);
    else fn(ctx, 0, 1);
}

static attn_ops ops_of(const ctpu_attn_args *a, bool ref)
{
    attn_ops o = { ref ? NULL : ctpu_mxu_current(), ctpu_mxu_npass[a->precision], (int)a->precision,
                   ref ? ctpu_k_unary_ref : ctpu_k_unary };
    return o;
}

/* This variant's entries (the ISA's products and transcendentals). */
static void attn_fwd_isa(const ctpu_attn_args *a, ctpu_k_pool *pool)
{
    attn_ops o = ops_of(a, false);
    attn_job jb = { a, &o, 0 };
    run(pool, fwd_task, &jb, a->B * a->H * ((a->Tq + BL - 1) / BL));
}

static void attn_bwd_isa(const ctpu_attn_args *a, ctpu_k_pool *pool)
{
    attn_ops o = ops_of(a, false);
    int nt = pool && pool->nthreads > 1 ? pool->nthreads : 1;
    int64_t bh = a->B * a->H, nqb = (a->Tq + BL - 1) / BL, nkb = (a->Tk + BL - 1) / BL;
    /* Threads split heads; when there are too few heads for the threads,
     * the sums are split instead: dQ per query block, then dK and dV per key
     * block (each sum still in its one order), recomputing P and dP (7
     * products per block pair instead of 5). */
    double whole = (double)((bh + nt - 1) / nt), split = 1.4 * (double)bh / nt;
    if (nt > 1 && (nqb > 1 || nkb > 1) && split < 0.9 * whole) {
        attn_job j1 = { a, &o, 1 }, j2 = { a, &o, 2 };
        run(pool, bwd_task, &j1, bh * nqb);
        run(pool, bwd_task, &j2, bh * nkb);
        return;
    }
    attn_job jb = { a, &o, 0 };
    run(pool, bwd_task, &jb, bh);
}

#ifdef CTPU_ATTN_SFX
#define ATTN_CAT(n, s) n##_##s
#define ATTN_NAME(n, s) ATTN_CAT(n, s)
void ATTN_NAME(ctpu_k_attn_fwd, CTPU_ATTN_SFX)(const ctpu_attn_args *a, ctpu_k_pool *pool) { attn_fwd_isa(a, pool); }
void ATTN_NAME(ctpu_k_attn_bwd, CTPU_ATTN_SFX)(const ctpu_attn_args *a, ctpu_k_pool *pool) { attn_bwd_isa(a, pool); }
#else
/* The baseline object: the entries dispatch on the current ISA. */
void ctpu_k_attn_fwd(const ctpu_attn_args *a, ctpu_k_pool *pool)
{
    switch (ctpu_kernels_isa()) {
#define X(E, s) case CTPU_ISA_##E: ctpu_k_attn_fwd_##s(a, pool); return;
    CTPU_K_SIMD_ISAS(X)
#undef X
    default: attn_fwd_isa(a, pool); return;
    }
}

void ctpu_k_attn_bwd(const ctpu_attn_args *a, ctpu_k_pool *pool)
{
    switch (ctpu_kernels_isa()) {
#define X(E, s) case CTPU_ISA_##E: ctpu_k_attn_bwd_##s(a, pool); return;
    CTPU_K_SIMD_ISAS(X)
#undef X
    default: attn_bwd_isa(a, pool); return;
    }
}

void ctpu_k_attn_fwd_ref(const ctpu_attn_args *a)
{
    attn_ops o = ops_of(a, true);
    attn_job jb = { a, &o, 0 };
    run(NULL, fwd_task, &jb, a->B * a->H * ((a->Tq + BL - 1) / BL));
}

void ctpu_k_attn_bwd_ref(const ctpu_attn_args *a)
{
    attn_ops o = ops_of(a, true);
    attn_job jb = { a, &o, 0 };
    run(NULL, bwd_task, &jb, a->B * a->H);
}
#endif
