/* MXU matmul driver: packing, cache blocking, threads, epilogue.
 * a: [batch][M,K], b: [batch][K,N] (any strides), c: [batch][M,N] (ldc, c_bs).
 *
 * 1. Pack (parallel over panels): both operands rounded to bf16 once, split
 *    into precision parts, laid out in K-pair-interleaved panels (mxu.h).
 *    An operand only one thread reads is instead packed by it chunk by chunk
 *    just before first use (one pass only), its source prefetched by the
 *    micro-kernel before (the row layout only: mm_prefetch_of).
 * 2. Compute (parallel over M x N only, never K): each thread owns a range of
 *    batch elements, N panels or M panels; within it, blocks of MC x NC are
 *    accumulated in an f32 scratch tile over KC-pair chunks (the accumulator
 *    is carried through memory exactly, so chunking keeps the one K order),
 *    then the epilogue runs on the finished, cache-hot tile and the result is
 *    rounded once to c's dtype. Same bits for any thread count or tiling. */
#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>
#include "mxu.h"

#ifndef MXU_KC           /* (overridable for tuning builds only) */
#define MXU_KC 128       /* pairs per chunk: a 32-column planar B micro-panel is 32 KiB */
#endif
#ifndef MXU_AR_MAX_N     /* the row layout up to this N (past it, packing A is amortised over many B panels and the transposed layout streams better) */
#define MXU_AR_MAX_N 512
#endif
#ifndef MXU_AR_MIN_K     /* the FMA row layout from this K on (below, the planar one was faster) */
#define MXU_AR_MIN_K 32
#endif
#ifndef MXU_SCR_PAD
#define MXU_SCR_PAD 16
#endif
#ifndef MXU_MC_PANELS
#define MXU_MC_PANELS 8  /* MR panels per block */
#endif
#ifndef MXU_NC_PANELS
#define MXU_NC_PANELS 16 /* NR panels per block */
#endif

typedef struct {
    const ctpu_mm_args *g;      /* the problem as computed (transposed when swap) */
    const ctpu_mm_args *go;     /* the caller's: epilogue and output */
    int swap;                   /* computing C^T = B^T A^T (skinny N) */
    int64_t tld;                /* swap: row stride of the transposed block */
    const ctpu_mxu_impl *im;
    int npass, mr, nr;
    int64_t kp;                 /* pairs per panel (all passes) */
    int64_t mp, np;             /* panels per batch element */
    int64_t nba, nbb;           /* batch elements packed (1 when broadcast) */
    uint32_t *ap, *bp;
    int64_t apd, bpd;           /* dwords per panel */
    ctpu_mxu_pack_args pka, pkb;
    float *scratch;             /* per thread: MC x NC floats */
    int64_t scr_ld, scr_n;
    int split;                  /* 0 batch, 1 N panels, 2 M panels */
    int lw;                     /* dwords per element pair per row: 1 or 2 (planar) */
    int direct;                 /* full tiles accumulate in c (f32, not read by the epilogue) */
    int64_t ars;                /* > 0: A in the row layout, this row stride (dwords) */
    int lazy_a, lazy_b;         /* packed by the computing thread just before first use */
    int bdirect;                /* B never packed: the micro-kernel reads it (kernel_bd) */
    int row_sm;                 /* softmax epilogue on each finished block (it holds whole rows) */
    int have_a, have_b;         /* operand already packed by an earlier call (go->pre) */
} mm_ctx;

/* Do bytes [p, p + n) and [q, q + m) overlap? */
static int mm_overlap(const void *p, int64_t n, const void *q, int64_t m)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return a < b + (uintptr_t)m && b < a + (uintptr_t)n;
}

static void mm_pack_task(void *vctx, int tid, int nt)
{
    mm_ctx *x = vctx;
    int64_t ua = x->lazy_a || x->have_a ? 0 : x->nba * x->mp,
            tot = ua + (x->lazy_b || x->have_b || x->bdirect ? 0 : x->nbb * x->np);
    int64_t u0 = tot * tid / nt, u1 = tot * (tid + 1) / nt;
    const ctpu_mm_args *g = x->g;
    while (u0 < u1) {
        ctpu_mxu_pack_args pa;
        int64_t q0, q1;
        int is_a = u0 < ua;
        if (is_a) {
            int64_t bi = u0 / x->mp;
            q0 = u0 % x->mp;
            q1 = (u1 < (bi + 1) * x->mp ? u1 : (bi + 1) * x->mp) - bi * x->mp;
            pa = x->pka;
            pa.src = (const char *)g->a + bi * g->a_bs * (int64_t)ctpu_kdt_size(g->a_dtype);
            pa.dst = x->ap + bi * x->mp * x->apd;
            u0 += q1 - q0;
        } else {
            int64_t v = u0 - ua, bi = v / x->np;
            q0 = v % x->np;
            int64_t vend = u1 - ua;
            q1 = (vend < (bi + 1) * x->np ? vend : (bi + 1) * x->np) - bi * x->np;
            pa = x->pkb;
            pa.src = (const char *)g->b + bi * g->b_bs * (int64_t)ctpu_kdt_size(g->b_dtype);
            pa.dst = x->bp + bi * x->np * x->bpd;
            u0 += q1 - q0;
        }
        if (is_a && x->ars) x->im->pack_ar(&pa, x->ars, q0, q1);
        else x->im->pack(&pa, q0, q1);
    }
}

/* Just-in-time packing (one pass only): pairs [k0, k0 + kc) of panel q of
 * batch element bi of A (is_a) or B, as a packing of the sub-operand that
 * starts at the panel's first row and the chunk's first element (K' = 2 kc,
 * or what is left of K: an odd K's zero partner is the chunk's), written at
 * the chunk's place in the panel. The same dwords as packing whole panels. */
static void mm_pack_chunk(const mm_ctx *x, int is_a, int64_t bi, int64_t q, int64_t k0, int64_t kc)
{
    const ctpu_mm_args *g = x->g;
    ctpu_mxu_pack_args pa = is_a ? x->pka : x->pkb;
    int64_t es = (int64_t)ctpu_kdt_size(pa.dt), bs = is_a ? g->a_bs : g->b_bs, e0 = 2 * k0;
    pa.src = (const char *)pa.src + (bi * bs + q * pa.w * pa.si + e0 * pa.sk) * es;
    pa.I -= q * pa.w;
    pa.K = pa.K - e0 < 2 * kc ? pa.K - e0 : 2 * kc;
    uint32_t *panel = is_a ? x->ap + ((x->nba > 1 ? bi : 0) * x->mp + q) * x->apd
                           : x->bp + ((x->nbb > 1 ? bi : 0) * x->np + q) * x->bpd;
    if (is_a && x->ars) {
        pa.dst = panel + k0 * x->lw;
        x->im->pack_ar(&pa, x->ars, 0, 1);
    } else {
        pa.dst = panel + k0 * pa.w * x->lw;
        x->im->pack(&pa, 0, 1);
    }
}

/* Epilogue and store of rows [m0, m1) x cols [n0, n1) of batch bi, from
 * s (row stride ld, s[0] = element (m0, n0)). In place on s. */
static void mm_finish(const ctpu_mm_args *g, int64_t bi, int64_t m0, int64_t m1, int64_t n0,
                      int64_t n1, float *s, int64_t ld)
{
    int64_t w = n1 - n0;
    if (m1 <= m0 || w <= 0) return;
    if (s == (float *)g->c + bi * g->c_bs + m0 * g->ldc + n0 && !g->scaled && !g->bias &&
        g->act == CTPU_K_ACT_NONE && !g->residual)
        return;                                     /* finished in place */
    static const ctpu_k_unary_op act_op[] = {
        [CTPU_K_ACT_RELU] = CTPU_K_U_RELU, [CTPU_K_ACT_GELU_TANH] = CTPU_K_U_GELU_TANH,
        [CTPU_K_ACT_GELU_ERF] = CTPU_K_U_GELU_ERF };
    for (int64_t m = m0; m < m1; m++) {
        float *v = s + (m - m0) * ld;
        if (g->scaled) ctpu_k_binary_scalar(CTPU_K_B_MUL, v, g->scale, false, v, w);
        if (g->bias) {
            if (g->bias_dtype == CTPU_KDT_BF16) {
                const uint16_t *bb = (const uint16_t *)g->bias + n0;
                for (int64_t j = 0; j < w; j++) v[j] = v[j] + ctpu_bf16_to_f32(bb[j]);
            } else {
                const float *bb = (const float *)g->bias + n0;
                for (int64_t j = 0; j < w; j++) v[j] = v[j] + bb[j];
            }
        }
        if (g->act != CTPU_K_ACT_NONE) ctpu_k_unary(act_op[g->act], v, v, w);
        if (g->residual) {
            int64_t off = bi * g->residual_bs + m * g->residual_ld + n0;
            if (g->residual_dtype == CTPU_KDT_BF16) {
                const uint16_t *rr = (const uint16_t *)g->residual + off;
                for (int64_t j = 0; j < w; j++) v[j] = v[j] + ctpu_bf16_to_f32(rr[j]);
            } else {
                const float *rr = (const float *)g->residual + off;
                for (int64_t j = 0; j < w; j++) v[j] = v[j] + rr[j];
            }
        }
        int64_t coff = bi * g->c_bs + m * g->ldc + n0;
        if (g->c_dtype == CTPU_KDT_BF16) {
            ctpu_k_f32_to_bf16(v, (uint16_t *)g->c + coff, w);   /* the ISA's, same bits */
        } else if ((float *)g->c + coff != v) {    /* else accumulated in c itself */
            memcpy((float *)g->c + coff, v, (size_t)w * sizeof(float));
        }
    }
}

/* d[j * ldd + i] = s[i * ld + j], i < rows, j < cols. */
static void mm_transpose(const ctpu_mxu_impl *im, const float *s, int64_t ld, int64_t rows, int64_t cols,
                         float *d, int64_t ldd)
{
    if (im->transpose) { im->transpose(s, ld, rows, cols, d, ldd); return; }
    for (int64_t j = 0; j < cols; j++)
        for (int64_t i = 0; i < rows; i++) d[j * ldd + i] = s[i * ld + j];
}

/* The source lines of part `part` of `parts` (split by its contiguous rows)
 * of pairs [k0, k0 + kc) of panel q of batch bi of A (is_a) or B: what
 * mm_pack_chunk will read. Operands with unit stride along i or k only
 * (else pf->n = 0). */
static void mm_src_lines(const mm_ctx *x, int is_a, int64_t bi, int64_t q, int64_t k0, int64_t kc, int64_t part,
                         int64_t parts, ctpu_mxu_pf *pf)
{
    const ctpu_mm_args *g = x->g;
    const ctpu_mxu_pack_args *pa = is_a ? &x->pka : &x->pkb;
    int64_t es = (int64_t)ctpu_kdt_size(pa->dt), e0 = 2 * k0;
    int64_t ni = pa->I - q * pa->w < pa->w ? pa->I - q * pa->w : pa->w;
    int64_t nk = pa->K - e0 < 2 * kc ? pa->K - e0 : 2 * kc;
    int64_t rows, len, stride;
    pf->n = 0;
    if (pa->sk == 1) { rows = ni; len = nk * es; stride = pa->si * es; }
    else if (pa->si == 1) { rows = nk; len = ni * es; stride = pa->sk * es; }
    else return;
    const char *src = (const char *)pa->src + (bi * (is_a ? g->a_bs : g->b_bs) + q * pa->w * pa->si +
                                               e0 * pa->sk) * es;
    int64_t r0 = rows * part / parts, r1 = rows * (part + 1) / parts;
    pf->base = src + r0 * stride;
    pf->stride = stride;
    pf->lpr = (int)((len + 63) / 64 + 1);   /* + 1: a row may start mid-line */
    pf->n = (int)((r1 - r0) * pf->lpr);
}

/* Where a region's loops are: the block (jn.., im0..) and the tile. */
typedef struct { int64_t bi, pm0, pm1, pn0, jn, jn1, im0, im1, k0, kc, j, i; int pack_a, pack_b; } mm_pos;

/* What tile p prefetches: while the tiles of a just-packed chunk compute,
 * the source of the next chunk to be packed — the next A panel's chunk, or
 * else this tile's share of the next B panel's (the block's row of tiles
 * shares it). Returns NULL when nothing is to be packed next. */
static __attribute__((noinline)) const ctpu_mxu_pf *mm_prefetch_of(const mm_ctx *x, const mm_pos *p, ctpu_mxu_pf *pf)
{
    pf->n = 0;
    if (p->pack_a && p->jn == p->pn0 && p->j == p->jn) {
        int64_t qi = p->i + 1, k0 = p->k0;
        if (qi >= p->im1) { qi = p->im0; k0 += MXU_KC; }
        if (k0 >= x->kp) { qi = p->im1; k0 = 0; }
        if (qi < p->pm1) mm_src_lines(x, 1, p->bi, qi, k0, MXU_KC, 0, 1, pf);
    }
    if (pf->n == 0 && p->pack_b && p->im0 == p->pm0) {
        int64_t qj = p->j + 1, k0 = p->k0;
        if (qj >= p->jn1) { qj = p->jn; k0 += MXU_KC; }
        if (k0 < x->kp) mm_src_lines(x, 0, p->bi, qj, k0, MXU_KC, p->i - p->im0, p->im1 - p->im0, pf);
    }
    return pf->n > 0 ? pf : NULL;
}

/* One MR x NR tile of chunk p->k0: full tiles of a direct c (x->direct)
 * accumulate in the scratch and the last chunk stores into c (with the row
 * layout; other micro-kernels only when K is one chunk); edge tiles (past
 * M or N) stay in the scratch. */
static void mm_tile(const mm_ctx *x, const mm_pos *p, const uint32_t *ab, const uint32_t *bb, float *scr,
                    float *cb, int64_t pmf, int64_t pnf)
{
    const ctpu_mm_args *g = x->g;
    const ctpu_mxu_impl *im = x->im;
    int mr = x->mr, nr = x->nr;
    int64_t i = p->i, j = p->j, k0 = p->k0, kc = p->kc, ld = x->scr_ld;
    int packing_b = p->pack_b && p->im0 == p->pm0, packing_a = p->pack_a && p->jn == p->pn0 && j == p->jn;
    if (packing_b && i == p->im0 && kc > 0) mm_pack_chunk(x, 0, p->bi, j, k0, kc);
    if (packing_a && kc > 0) mm_pack_chunk(x, 1, p->bi, i, k0, kc);
    const uint32_t *bj = bb + j * x->bpd + k0 * nr * x->lw;
    int last = !(i < x->mp - 1 || g->M % mr == 0), full = i < pmf && j < pnf;
    float *st = scr + (i - p->im0) * mr * ld + (j - p->jn) * nr;
    float *ct = full ? cb + i * mr * g->ldc + j * nr : st;
    int64_t lc = full ? g->ldc : ld;
    if (x->ars) {
        ctpu_mxu_pf pfd;
        const ctpu_mxu_pf *pf = packing_a || packing_b ? mm_prefetch_of(x, p, &pfd) : NULL;
        int lastk = k0 + kc >= x->kp;
        im->kernel_ar[last ? g->M % mr : mr](kc, ab + i * x->apd + k0 * x->lw, x->ars, bj, k0 > 0 ? st : NULL, ld,
                                             lastk ? ct : st, lastk ? lc : ld, pf);
        return;
    }
    if (x->bdirect) {
        int64_t e0 = 2 * k0, ne = g->K - e0 < 2 * kc ? g->K - e0 : 2 * kc, nc = g->N - j * nr < nr ? g->N - j * nr : nr;
        const float *bs = (const float *)g->b + p->bi * g->b_bs + j * nr + e0 * g->b_rs;
        im->kernel_bd[last ? g->M % mr : mr](kc, ab + i * x->apd + k0 * mr * x->lw, bs, g->b_rs, (int)nc, (int)(ne & 1),
                                             ct, lc, k0 > 0);
        return;
    }
    ctpu_mxu_kernel_fn kf = !last || !im->kernel_rows ? im->kernel : im->kernel_rows[g->M % mr];
    kf(kc, ab + i * x->apd + k0 * mr * x->lw, bj, ct, lc, k0 > 0);
}

/* One batch element, M panels [pm0, pm1) x N panels [pn0, pn1). */
static void mm_region(mm_ctx *x, float *scr, int64_t bi, int first_bi, int64_t pm0, int64_t pm1, int64_t pn0,
                      int64_t pn1)
{
    const ctpu_mm_args *g = x->g;
    const ctpu_mxu_impl *im = x->im;
    int mr = x->mr, nr = x->nr;
    const uint32_t *ab = x->ap + (x->nba > 1 ? bi : 0) * x->mp * x->apd;
    const uint32_t *bb = x->bp + (x->nbb > 1 ? bi : 0) * x->np * x->bpd;
    int64_t ld = x->scr_ld;
    int64_t pmf = x->direct ? g->M / mr : 0, pnf = x->direct ? g->N / nr : 0;
    float *cb = (float *)g->c + bi * g->c_bs;
    /* this call is the first use of its A (B) panels: pack them as it goes */
    mm_pos p = { .bi = bi, .pm0 = pm0, .pm1 = pm1, .pn0 = pn0,
                 .pack_a = x->lazy_a && (first_bi || x->nba > 1), .pack_b = !x->bdirect && x->lazy_b && (first_bi || x->nbb > 1) };
    for (int64_t jn = pn0; jn < pn1; jn += MXU_NC_PANELS) {
        int64_t jn1 = jn + MXU_NC_PANELS < pn1 ? jn + MXU_NC_PANELS : pn1;
        for (int64_t im0 = pm0; im0 < pm1; im0 += MXU_MC_PANELS) {
            int64_t im1 = im0 + MXU_MC_PANELS < pm1 ? im0 + MXU_MC_PANELS : pm1;
            p.jn = jn; p.jn1 = jn1; p.im0 = im0; p.im1 = im1;
            for (int64_t k0 = 0; k0 == 0 || k0 < x->kp; k0 += MXU_KC) {
                p.k0 = k0;
                p.kc = x->kp - k0 < MXU_KC ? x->kp - k0 : MXU_KC;
                for (p.j = jn; p.j < jn1; p.j++)
                    for (p.i = im0; p.i < im1; p.i++) mm_tile(x, &p, ab, bb, scr, cb, pmf, pnf);
            }
            int64_t m0 = im0 * mr, m1 = im1 * mr < g->M ? im1 * mr : g->M;
            int64_t n0 = jn * nr, n1 = jn1 * nr < g->N ? jn1 * nr : g->N;
            int64_t mf = im1 < pmf ? m1 : pmf * mr > m0 ? pmf * mr : m0;
            int64_t nf = jn1 < pnf ? n1 : pnf * nr > n0 ? pnf * nr : n0;
            if (x->swap) {
                /* the block holds C^T rows m (the caller's columns) x columns
                 * n (its rows): transpose, then the caller's epilogue */
                const ctpu_mm_args *o = x->go;
                if (o->c_dtype == CTPU_KDT_F32 && !o->scaled && !o->bias && o->act == CTPU_K_ACT_NONE &&
                    !o->residual) {
                    float *c = (float *)o->c + bi * o->c_bs + n0 * o->ldc + m0;   /* no epilogue: straight to c */
                    mm_transpose(im, scr, ld, m1 - m0, n1 - n0, c, o->ldc);
                    continue;
                }
                float *t = scr + x->scr_n / 2;
                mm_transpose(im, scr, ld, m1 - m0, n1 - n0, t, x->tld);
                mm_finish(x->go, bi, n0, n1, m0, m1, t, x->tld);
                continue;
            }
            mm_finish(g, bi, m0, mf, n0, nf, cb + m0 * g->ldc + n0, g->ldc);
            mm_finish(g, bi, m0, mf, nf, n1, scr + (nf - n0), ld);
            mm_finish(g, bi, mf, m1, n0, n1, scr + (mf - m0) * ld, ld);
            /* the block's rows are whole and stored, still in cache */
            if (x->row_sm) ctpu_k_softmax(cb + m0 * g->ldc, m1 - m0, g->N, cb + m0 * g->ldc, false, NULL);
        }
    }
}

static void mm_compute_task(void *vctx, int tid, int nt)
{
    mm_ctx *x = vctx;
    float *scr = x->scratch + (int64_t)tid * x->scr_n;
    int64_t b0 = 0, b1 = x->g->batch, m0 = 0, m1 = x->mp, n0 = 0, n1 = x->np;
    if (x->split == 0) { b0 = x->g->batch * tid / nt; b1 = x->g->batch * (tid + 1) / nt; }
    else if (x->split == 1) { n0 = x->np * tid / nt; n1 = x->np * (tid + 1) / nt; }
    else { m0 = x->mp * tid / nt; m1 = x->mp * (tid + 1) / nt; }
    if (m0 >= m1 || n0 >= n1) return;
    for (int64_t bi = b0; bi < b1; bi++) mm_region(x, scr, bi, bi == b0, m0, m1, n0, n1);
}

static void mm_run(ctpu_k_pool *pool, int nt, void (*fn)(void *, int, int), void *ctx)
{
    if (nt > 1) pool->run(pool, fn, ctx);
    else fn(ctx, 0, 1);
}

/* Work imbalance of splitting n units over nt threads (1 = perfect). */
static double mm_imbalance(int64_t n, int nt)
{
    if (n <= 0) return 1e30;
    int64_t per = (n + nt - 1) / nt;
    return (double)per * nt / (double)n;
}

#ifdef MXU_PROF   /* development only: time split between the phases */
#include <time.h>
double mxu_prof_pack, mxu_prof_compute;
static double mxu_prof_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
#endif

/* Workspace reuse. Packed operands are large (8 MiB each at 1024^2 f32)
 * and fresh pages cost a fault and a zeroing each: ~20% of a 1024^3 call.
 * One cached block, taken and returned by atomic exchange (so concurrent
 * calls never share it; a loser just allocates). The one piece of static
 * state in the kernels: a cache, not configuration, so STYLE's rule 4 is
 * kept in spirit (nothing observable depends on it). */
typedef struct { size_t size; } mm_ws_hdr;
static _Atomic(char *) mm_ws_cached;

static char *mm_ws_take(size_t need)
{
    char *m = atomic_exchange(&mm_ws_cached, NULL);
    if (m && ((mm_ws_hdr *)m)->size >= need) return m + 64;
    free(m);
    size_t sz = need < ((size_t)1 << 20) ? (size_t)1 << 20 : need + need / 4;
    sz = (sz + 63) / 64 * 64;
    m = aligned_alloc(64, sz + 64);
    assert(m);
    ((mm_ws_hdr *)m)->size = sz;
    return m + 64;
}

static void mm_ws_give(char *p, size_t need)
{
    (void)need;
    char *old = atomic_exchange(&mm_ws_cached, p - 64);
    free(old);
}

static double mm_min_flop = 2e6;
void ctpu_mxu_set_thread_min_flop(double flop) { mm_min_flop = flop; }

static int64_t mm_pad(int64_t n, int w) { return (n + w - 1) / w * w; }

/* The scratch sizes, and the packed panels' and scratch's memory for nt
 * threads: from ws (grown here) or, ws NULL, the shared cached workspace
 * (*need bytes, given back by the caller). */
static char *mm_workspace(mm_ctx *x, int nt, ctpu_k_ws *ws, size_t *need_out)
{
    x->scr_ld = (int64_t)MXU_NC_PANELS * x->nr + MXU_SCR_PAD;   /* rows not 2^k floats apart */
    x->scr_n = (int64_t)MXU_MC_PANELS * x->mr * x->scr_ld;
    if (x->swap) {                               /* + the transposed block */
        x->tld = (int64_t)MXU_MC_PANELS * x->mr + MXU_SCR_PAD;
        x->scr_n = 2 * (x->scr_n > (int64_t)MXU_NC_PANELS * x->nr * x->tld ? x->scr_n
                                                                        : (int64_t)MXU_NC_PANELS * x->nr * x->tld);
    }
    size_t abytes = (size_t)(x->nba * x->mp * x->apd) * 4, bbytes = (size_t)(x->nbb * x->np * x->bpd) * 4;
    size_t sbytes = (size_t)(nt * x->scr_n) * sizeof(float);
    size_t need = ((abytes + 63) / 64 + (bbytes + 63) / 64 + (sbytes + 63) / 64) * 64 + 64;
    char *mem;
    if (ws) {
        if (ws->size < need) {
            free(ws->p);
            ws->size = (need + need / 4 + 63) / 64 * 64;
            ws->p = aligned_alloc(64, ws->size);
            assert(ws->p);
        }
        mem = ws->p;
    } else {
        mem = mm_ws_take(need);
    }
    x->ap = (uint32_t *)mem;
    x->bp = (uint32_t *)(mem + (abytes + 63) / 64 * 64);
    x->scratch = (float *)(mem + (abytes + 63) / 64 * 64 + (bbytes + 63) / 64 * 64);
    *need_out = need;
    return mem;
}

/* A with unit stride along k at default precision: the row layout (no
 * transpose in packing) where the ISA has it. Rows 64-byte aligned and
 * not a multiple of 1 KiB apart (the W rows would share L1 sets). */
static void mm_row_layout(mm_ctx *x, const ctpu_mm_args *g)
{
    x->lw = x->im->planar ? 2 : 1;
    if (x->im->kernel_ar && x->npass == 1 && x->pka.parts[0] == 0 && x->pka.sk == 1 && x->pka.si != 1 &&
        (g->a_dtype == CTPU_KDT_F32 || g->a_dtype == CTPU_KDT_BF16) && (!x->im->planar || g->K >= MXU_AR_MIN_K) &&
        g->N <= MXU_AR_MAX_N) {
        x->ars = (x->kp * x->lw + 15) / 16 * 16;
        if (x->ars % 256 == 0) x->ars += 16;
        x->apd = x->ars * x->mr;
    }
}

/* A call's layout decisions, before any memory: C^T or not (into gs), the
 * passes, panels, packing arguments and A's row layout. */
static void mm_setup(mm_ctx *x, const ctpu_mm_args *go, ctpu_mm_args *gs)
{
    x->mr = x->im->mr;
    x->nr = x->im->nr;
    /* Skinny N (e.g. [128,128] x [128,10] with 32-wide B panels): compute
     * C^T = B^T A^T when that pads to fewer MACs by 3/4 or more. Each output
     * element is the same sum in the same K order (products are exact and
     * commute), so the bits do not change. */
    if ((double)mm_pad(go->N, x->mr) * (double)mm_pad(go->M, x->nr) <
        0.75 * (double)mm_pad(go->M, x->mr) * (double)mm_pad(go->N, x->nr)) {
        *gs = *go;
        gs->M = go->N; gs->N = go->M;
        gs->a = go->b; gs->a_dtype = go->b_dtype; gs->a_bs = go->b_bs; gs->a_rs = go->b_cs; gs->a_cs = go->b_rs;
        gs->b = go->a; gs->b_dtype = go->a_dtype; gs->b_bs = go->a_bs; gs->b_rs = go->a_cs; gs->b_cs = go->a_rs;
        x->g = gs;
        x->swap = 1;
    }
    const ctpu_mm_args *g = x->g;
    x->npass = ctpu_mxu_npass[g->precision];
    x->kp = x->npass * ctpu_mxu_kh(g->K);
    x->mp = (g->M + x->mr - 1) / x->mr;
    x->np = (g->N + x->nr - 1) / x->nr;
    x->nba = g->a_bs == 0 ? 1 : g->batch;
    x->nbb = g->b_bs == 0 ? 1 : g->batch;
    x->pka = (ctpu_mxu_pack_args){ .src = g->a, .dt = g->a_dtype, .si = g->a_rs, .sk = g->a_cs,
        .I = g->M, .K = g->K, .w = x->mr, .npass = x->npass,
        .parts = (x->swap ? ctpu_mxu_pass_b : ctpu_mxu_pass_a)[g->precision] };
    x->pkb = (ctpu_mxu_pack_args){ .src = g->b, .dt = g->b_dtype, .si = g->b_cs, .sk = g->b_rs,
        .I = g->N, .K = g->K, .w = x->nr, .npass = x->npass,
        .parts = (x->swap ? ctpu_mxu_pass_a : ctpu_mxu_pass_b)[g->precision] };
    /* sources past L2 (2 MiB on the CPUs seen): the packers may prefetch */
    x->pka.pf = (double)x->nba * (double)g->M * (double)g->K * (double)ctpu_kdt_size(g->a_dtype) > 1048576.0;
    x->pkb.pf = (double)x->nbb * (double)g->N * (double)g->K * (double)ctpu_kdt_size(g->b_dtype) > 1048576.0;
    x->apd = ctpu_mxu_panel_dwords(&x->pka) * (x->im->planar ? 2 : 1);
    mm_row_layout(x, g);
    x->bpd = ctpu_mxu_panel_dwords(&x->pkb) * (x->im->planar ? 2 : 1);
    /* One M panel (e.g. the C^T of a skinny N): each B element is read by
     * one tile only, so an f32 B with unit stride along n is not packed at
     * all: the micro-kernel reads and rounds it in place (kernel_bd). */
    x->bdirect = x->im->kernel_bd && x->mp == 1 && !x->ars && x->npass == 1 && x->pkb.si == 1 &&
                 g->b_dtype == CTPU_KDT_F32;
}

/* Is pp this call's own layout of its operand `role`? */
static int mm_pre_ok(const mm_ctx *x, const ctpu_k_prepack *pp, int role)
{
    const ctpu_mxu_pack_args *pa = role ? &x->pkb : &x->pka;
    int64_t nb = role ? x->nbb : x->nba, bs = role ? x->g->b_bs : x->g->a_bs;
    return pp && pp->impl == (const void *)x->im && pp->role == role && !x->swap && x->npass == 1 &&
           !(role && x->bdirect) &&
           pa->dt == pp->dt && pa->si == pp->si && pa->sk == pp->sk && pa->I == pp->I && pa->K == pp->K &&
           nb == pp->nb && (nb == 1 || bs == pp->bs) && pa->w == pp->w && pp->lw == x->lw &&
           pp->rs == (role ? 0 : x->ars) && pp->panels == (role ? x->np : x->mp) &&
           pp->pd == (role ? x->bpd : x->apd);
}

int ctpu_k_mm_prepack_plan(const ctpu_mm_args *call, ctpu_k_prepack *pp)
{
    if (call->batch <= 0 || call->M <= 0 || call->N <= 0 || call->K <= 0 || call->a_dtype == CTPU_KDT_I32 ||
        (pp->role != 0 && pp->role != 1) || call->precision < 0 || call->precision >= CTPU_PREC_COUNT)
        return 0;
    mm_ctx x = { .g = call, .go = call, .im = ctpu_mxu_current() };
    ctpu_mm_args gs;
    mm_setup(&x, call, &gs);
    pp->impl = x.im;
    pp->w = pp->role ? x.nr : x.mr;
    pp->lw = x.lw;
    pp->rs = pp->role ? 0 : x.ars;
    pp->panels = pp->role ? x.np : x.mp;
    pp->pd = pp->role ? x.bpd : x.apd;
    pp->bytes = (size_t)(pp->nb * pp->panels * pp->pd) * 4;
    return mm_pre_ok(&x, pp, pp->role);
}

/* Operands shared with other calls (go->pre): packed by this call into the
 * shared panels, or already there (then not packed again). */
static void mm_shared_panels(mm_ctx *x)
{
    const ctpu_mm_args *go = x->go;
    for (int r = 0; r < 2; r++) {
        if (!go->pre_buf[r] || !mm_pre_ok(x, go->pre[r], r)) continue;
        if (r == 0) x->ap = (uint32_t *)go->pre_buf[0];
        else x->bp = (uint32_t *)go->pre_buf[1];
        if (go->pre_keep[r]) continue;
        if (r == 0) { x->have_a = 1; x->lazy_a = 0; }
        else { x->have_b = 1; x->lazy_b = 0; }
    }
}

/* ws == NULL: the shared cached workspace; else the caller's (grown here). */
static void mm_do(const ctpu_mm_args *go, ctpu_k_pool *pool, ctpu_k_ws *ws)
{
    assert(go->precision >= 0 && go->precision < CTPU_PREC_COUNT);
    if (go->batch <= 0 || go->M <= 0 || go->N <= 0) return;
    if (go->a_dtype == CTPU_KDT_I32) { ctpu_k_matmul_ref(go); return; }
    mm_ctx x = { .g = go, .go = go, .im = ctpu_mxu_current() };
    ctpu_mm_args gs;
    mm_setup(&x, go, &gs);
    const ctpu_mm_args *g = x.g;
    /* c as the output of full tiles: when K is one chunk (each tile is
     * written once: no scratch, no copy) or, with the row layout, the last
     * chunk's micro-kernel stores there (the chunks before accumulate in the
     * scratch: c's rows, often 4 KiB apart, would share L1 sets); f32,
     * rows at least N apart, and neither epilogue input in c's bytes (they
     * are read after c is written) */
    int64_t cext = ((g->batch - 1) * g->c_bs + (g->M - 1) * g->ldc + g->N) * 4;
    x.direct = !x.swap && (x.kp <= MXU_KC || x.ars) && g->c_dtype == CTPU_KDT_F32 && g->ldc >= g->N && g->c_bs >= 0 &&
               (!g->bias || !mm_overlap(g->c, cext, g->bias, g->N * (int64_t)ctpu_kdt_size(g->bias_dtype))) &&
               (!g->residual ||
                !mm_overlap(g->c, cext, g->residual,
                            ((g->batch - 1) * g->residual_bs + (g->M - 1) * g->residual_ld + g->N) *
                                (int64_t)ctpu_kdt_size(g->residual_dtype)));
    int nt = pool && pool->nthreads > 1 ? pool->nthreads : 1;
    /* A waking worker costs ~1-20 us: below ~2 MFLOP per thread one thread
     * is faster. (Bits do not depend on the thread count.) */
    double flop = 2.0 * (double)g->batch * (double)g->M * (double)g->N * (double)(g->K > 0 ? g->K : 1) *
                  x.npass;
    double mf = mm_min_flop;
    if (nt > 1 && flop < mf * nt) nt = flop < 2 * mf ? 1 : (int)(flop / mf);

    double ib = mm_imbalance(g->batch, nt), in = mm_imbalance(x.np, nt),
           imm = mm_imbalance(x.mp, nt);
    x.split = ib <= in && ib <= imm ? 0 : in <= imm ? 1 : 2;
    /* One pass (any micro-kernel): an
     * operand whose panels one thread alone reads (all of them at one
     * thread; the split one's; a batched one's under a batch split) is
     * packed by that thread chunk by chunk just before its first use (with
     * the row layout, the micro-kernel computing the chunk before also
     * prefetches its source: mm_prefetch_of): the packed chunk is still in
     * cache when it is read, and a batch's packed panels never go to
     * memory and back. The shared ones are packed first, in
     * parallel (so are all operands at HIGH and HIGHEST). */
    if (x.npass == 1) {
        x.lazy_a = nt == 1 || x.split == 2 || (x.split == 0 && x.nba > 1);
        x.lazy_b = nt == 1 || x.split == 1 || (x.split == 0 && x.nbb > 1);
    }

    /* a softmax epilogue (f32 c): in each block when a block holds whole
     * contiguous rows and one thread computes them, else over c at the end */
    x.row_sm = go->softmax && go->c_dtype == CTPU_KDT_F32 && !x.swap && x.np <= MXU_NC_PANELS && x.split != 1 && g->ldc == g->N;

    size_t need;
    char *mem = mm_workspace(&x, nt, ws, &need);
    mm_shared_panels(&x);

#ifdef MXU_PROF
    double t0 = mxu_prof_now();
#endif
    if (x.kp > 0 && !((x.lazy_a || x.have_a) && (x.lazy_b || x.have_b || x.bdirect))) mm_run(pool, nt, mm_pack_task, &x);
#ifdef MXU_PROF
    double t1 = mxu_prof_now();
#endif
    mm_run(pool, nt, mm_compute_task, &x);
#ifdef MXU_PROF
    mxu_prof_pack += t1 - t0;
    mxu_prof_compute += mxu_prof_now() - t1;
#endif
    if (!ws) mm_ws_give(mem, need);
    if (go->softmax && go->c_dtype == CTPU_KDT_F32 && !x.row_sm)
        for (int64_t bi = 0; bi < go->batch; bi++)
            for (int64_t m = 0; m < go->M; m++) {
                float *row = (float *)go->c + bi * go->c_bs + m * go->ldc;
                ctpu_k_softmax(row, 1, go->N, row, false, NULL);
            }
}

void ctpu_k_matmul(const ctpu_mm_args *go, ctpu_k_pool *pool) { mm_do(go, pool, NULL); }

void ctpu_k_matmul_ws(const ctpu_mm_args *args, ctpu_k_ws *ws) { mm_do(args, NULL, ws); }

void ctpu_k_ws_free(ctpu_k_ws *ws)
{
    free(ws->p);
    ws->p = NULL;
    ws->size = 0;
}
