/* Reductions, argmax and softmax (kernels.h "reductions").
 *
 * This file holds
 *   - the `_ref` kernels: the executable specification, written as directly
 *     from kernels.h's text as possible (one column at a time, the chunk tree
 *     by its recursive definition);
 *   - the plain-C (CTPU_ISA_SCALAR) column kernels (the SIMD ones are
 *     stamped from simd_reduce.h; isa.c holds the table of variants);
 *   - the threaded driver shared by every ISA.
 *
 * The order (kernels.h, CTPU_K_RED_*): column of length n -> chunks of 4096;
 * element j of a chunk goes to lane j % 16, lanes accumulate left to right
 * from the identity; lanes combine by l[i] op= l[i+8], +4, +2, +1; chunk
 * results combine pairwise level by level, an odd last one carried up.
 *
 * The pairwise chunk tree as a recursion: the node covering the aligned
 * chunk range [lo, lo + span) (span a power of two, clipped to m chunks) is
 * the chunk itself when span == 1, its left half when the right half is
 * empty, else left op right. The root is the node [0, 2^ceil(log2 m)).
 * SIMD kernels compute the same nodes with a binary-counter stack; the
 * driver hands each thread whole aligned nodes, so threads never change the
 * order.
 *
 * NaN: max/min propagate NaN (a column with a NaN reduces to NaN; the class
 * only, not the payload). Empty columns (n == 0) give the identity: sum 0,
 * max -Inf, min +Inf.
 */
#include <math.h>
#include <string.h>
#include <sleef.h>
#include "internal.h"

enum { RED_SQDEV = CTPU_K_RED_SQDEV, RED_EXPSUM = CTPU_K_RED_EXPSUM };   /* internal.h */

/* ---- scalar definitions ---------------------------------------------------- */
static inline bool is_nan(float v) { return v != v; }

static inline float red_identity(int op)
{
    return op == CTPU_K_RED_MAX ? -INFINITY : op == CTPU_K_RED_MIN ? INFINITY : op == CTPU_K_RED_PROD ? 1.0f : 0.0f;
}

/* kernels.h MAX/MIN: NaN if either is NaN, else a > b ? a : b / a < b ? a : b. */
static inline float red_combine(int op, float a, float b)
{
    switch (op) {
    case CTPU_K_RED_MAX: return is_nan(a) ? a : is_nan(b) ? b : (a > b ? a : b);
    case CTPU_K_RED_MIN: return is_nan(a) ? a : is_nan(b) ? b : (a < b ? a : b);
    case CTPU_K_RED_PROD: return a * b;
    default: return a + b;
    }
}

static inline float red_element(int op, float v, float c)
{
    if (op == RED_SQDEV) { v = v - c; return v * v; }
    if (op == RED_EXPSUM) return Sleef_expf1_u10purec(v - c);
    return v;
}

/* One chunk of `len` elements at stride `inner`: 16 lanes, then the lane tree. */
static float ref_chunk(int op, const float *x, int64_t inner, int64_t len, float c)
{
    float l[CTPU_K_RED_LANES];
    for (int i = 0; i < CTPU_K_RED_LANES; i++) l[i] = red_identity(op);
    for (int64_t j = 0; j < len; j++)
        l[j % CTPU_K_RED_LANES] = red_combine(op, l[j % CTPU_K_RED_LANES],
                                              red_element(op, x[j * inner], c));
    for (int s = CTPU_K_RED_LANES / 2; s > 0; s /= 2)
        for (int i = 0; i < s; i++) l[i] = red_combine(op, l[i], l[i + s]);
    return l[0];
}

/* The chunk-tree node over chunks [lo, lo + span) clipped to m. */
static float ref_node(int op, const float *x, int64_t inner, int64_t n, float c, int64_t lo,
                      int64_t span, int64_t m)
{
    if (span == 1) {
        int64_t j0 = lo * CTPU_K_RED_CHUNK;
        int64_t len = n - j0 < CTPU_K_RED_CHUNK ? n - j0 : CTPU_K_RED_CHUNK;
        return ref_chunk(op, x + j0 * inner, inner, len, c);
    }
    int64_t half = span / 2;
    float left = ref_node(op, x, inner, n, c, lo, half, m);
    if (lo + half >= m) return left;
    return red_combine(op, left, ref_node(op, x, inner, n, c, lo + half, half, m));
}

static float ref_column(int op, const float *x, int64_t inner, int64_t n, float c)
{
    int64_t m = (n + CTPU_K_RED_CHUNK - 1) / CTPU_K_RED_CHUNK;
    if (m == 0) return red_identity(op);
    int64_t span = 1;
    while (span < m) span *= 2;
    return ref_node(op, x, inner, n, c, 0, span, m);
}

/* ---- _ref kernels ------------------------------------------------------------ */
static void ref_reduce(int op, const float *x, const float *mean, int64_t outer, int64_t n,
                       int64_t inner, float *y)
{
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++)
            y[o * inner + i] = ref_column(op, x + o * n * inner + i, inner, n,
                                          mean ? mean[o * inner + i] : 0.0f);
}

void ctpu_k_reduce_ref(ctpu_k_red_op op, const float *x, int64_t outer, int64_t n, int64_t inner,
                       float *y)
{
    ref_reduce((int)op, x, NULL, outer, n, inner, y);
}

void ctpu_k_sqdev_ref(const float *x, const float *mean, int64_t outer, int64_t n, int64_t inner,
                      float *y)
{
    ref_reduce(RED_SQDEV, x, mean, outer, n, inner, y);
}

/* x [rows, n]: m = max, s = sum exp(x - m) (both in the reduction order);
 * softmax = exp(x - m) / s, log_softmax = (x - m) - log(s). y may alias x. */
void ctpu_k_softmax_ref(const float *x, int64_t rows, int64_t n, float *y, bool log)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float m = ref_column(CTPU_K_RED_MAX, xr, 1, n, 0.0f);
        float s = ref_column(RED_EXPSUM, xr, 1, n, m);
        float ls = Sleef_logf1_u10purec(s);
        for (int64_t j = 0; j < n; j++) {
            float d = xr[j] - m;
            yr[j] = log ? d - ls : Sleef_expf1_u10purec(d) / s;
        }
    }
}

/* argmax/argmin: first maximal (minimal) index; the first NaN wins.
 * Columns are walked row by row so strided (inner > 1) input streams. */
void ctpu_k_argmax(const float *x, int64_t outer, int64_t n, int64_t inner, int32_t *y, bool is_min)
{
    for (int64_t o = 0; o < outer; o++) {
        const float *xo = x + o * n * inner;
        int32_t *yo = y + o * inner;
        for (int64_t i = 0; i < inner; i++) yo[i] = 0;
        if (n == 0) continue;
        enum { TILE = 256 };
        float best[TILE];
        for (int64_t i0 = 0; i0 < inner; i0 += TILE) {
            int64_t w = inner - i0 < TILE ? inner - i0 : TILE;
            for (int64_t i = 0; i < w; i++) best[i] = xo[i0 + i];
            for (int64_t j = 1; j < n; j++) {
                const float *row = xo + j * inner + i0;
                for (int64_t i = 0; i < w; i++) {
                    float v = row[i], b = best[i];
                    bool take = !is_nan(b) && (is_nan(v) || (is_min ? v < b : v > b));
                    if (take) { best[i] = v; yo[i0 + i] = (int32_t)j; }
                }
            }
        }
    }
}

/* ---- CTPU_ISA_SCALAR column kernels: per chunk ref_chunk, chunks combined
 * with the binary-counter stack (the same nodes as ref_node). ------------- */
static float scalar_col(int op, const float *x, int64_t inner, float c, int64_t n, int64_t k0,
                        int64_t k1)
{
    float stk[64];
    int sp = 0;
    int cop = op >= RED_SQDEV ? CTPU_K_RED_SUM : op;
    if (k1 <= k0) return red_identity(cop);
    for (int64_t k = k0; k < k1; k++) {
        int64_t j0 = k * CTPU_K_RED_CHUNK;
        int64_t len = n - j0 < CTPU_K_RED_CHUNK ? n - j0 : CTPU_K_RED_CHUNK;
        stk[sp++] = ref_chunk(op, x + j0 * inner, inner, len, c);
        for (int64_t t = k - k0 + 1; (t & 1) == 0; t >>= 1, sp--)
            stk[sp - 2] = red_combine(cop, stk[sp - 2], stk[sp - 1]);
    }
    for (; sp > 1; sp--) stk[sp - 2] = red_combine(cop, stk[sp - 2], stk[sp - 1]);
    return stk[0];
}

static float scalar_col1(int op, const float *x, float c, int64_t n, int64_t k0, int64_t k1)
{
    return scalar_col(op, x, 1, c, n, k0, k1);
}

static void scalar_rows1(int op, const float *x, const float *c, int64_t n, int64_t rows,
                         float *y)
{
    int64_t m = (n + CTPU_K_RED_CHUNK - 1) / CTPU_K_RED_CHUNK;
    for (int64_t r = 0; r < rows; r++) y[r] = scalar_col(op, x + r * n, 1, c ? c[r] : 0.0f, n, 0, m);
}

static void scalar_colv(int op, const float *x, const float *cv, int64_t n, int64_t inner,
                        int ncols, int64_t k0, int64_t k1, float *out)
{
    for (int i = 0; i < ncols; i++)
        out[i] = scalar_col(op, x + i, inner, cv ? cv[i] : 0.0f, n, k0, k1);
}

static void scalar_softmax_row(const float *x, int64_t n, float *y, bool log)
{
    int64_t m = (n + CTPU_K_RED_CHUNK - 1) / CTPU_K_RED_CHUNK;
    float mx = scalar_col(CTPU_K_RED_MAX, x, 1, 0.0f, n, 0, m);
    float s = scalar_col(RED_EXPSUM, x, 1, mx, n, 0, m);
    float ls = Sleef_logf1_u10purec(s);
    for (int64_t j = 0; j < n; j++) {
        float d = x[j] - mx;
        y[j] = log ? d - ls : Sleef_expf1_u10purec(d) / s;
    }
}

/* ---- the scalar variant (isa.c's CTPU_ISA_SCALAR) ------------------------------ */
const ctpu_k_red_variant ctpu_k_red_scalar = { scalar_rows1, scalar_col1, scalar_colv,
                                               scalar_softmax_row };

/* ---- threaded driver -------------------------------------------------------------
 * Work unit = (column unit, aligned block of chunks). A column unit is one
 * row when inner == 1, else up to 16 adjacent columns of one outer slice.
 * With enough column units every unit is a whole column (nblk == 1, written
 * straight to y); otherwise columns are cut into blocks of B = 2^L chunks
 * (tree nodes), computed in parallel and combined on the calling thread by
 * the levels of the tree above L. Pool use only pays above ~32K elements. */
enum { RED_PAR_MIN = 1 << 15, RED_MAX_UNITS = 256, RED_VW = 16 };

typedef struct {
    const ctpu_k_red_variant *t;
    int op;
    const float *x, *cv;
    int64_t outer, n, inner, m;
    int64_t ngroups;      /* column units per outer slice */
    int64_t nblk, B;      /* blocks per column unit, chunks per block */
    int64_t nunits;
    float *y, *part;      /* part: [unit][RED_VW] when nblk > 1 */
} red_job;

static void red_unit(const red_job *J, int64_t u)
{
    int64_t cu = u / J->nblk, b = u % J->nblk;
    int64_t o = cu / J->ngroups, g = cu % J->ngroups;
    int64_t k0 = b * J->B, k1 = k0 + J->B < J->m ? k0 + J->B : J->m;
    if (J->inner == 1) {
        float v = J->t->col1(J->op, J->x + o * J->n, J->cv ? J->cv[o] : 0.0f, J->n, k0, k1);
        if (J->part) J->part[u * RED_VW] = v;
        else J->y[o] = v;
    } else {
        int64_t i0 = g * RED_VW;
        int nc = (int)(J->inner - i0 < RED_VW ? J->inner - i0 : RED_VW);
        float *out = J->part ? J->part + u * RED_VW : J->y + o * J->inner + i0;
        J->t->colv(J->op, J->x + o * J->n * J->inner + i0, J->cv ? J->cv + o * J->inner + i0 : NULL,
                   J->n, J->inner, nc, k0, k1, out);
    }
}

static void red_thread(void *ctx, int tid, int nt)
{
    const red_job *J = ctx;
    int64_t u0 = J->nunits * tid / nt, u1 = J->nunits * (tid + 1) / nt;
    if (J->inner == 1 && J->nblk == 1) {   /* whole rows: one call per range */
        if (u1 > u0)
            J->t->rows1(J->op, J->x + u0 * J->n, J->cv ? J->cv + u0 : NULL, J->n, u1 - u0, J->y + u0);
        return;
    }
    if (J->nblk == 1) {
        /* whole strided columns: one call per run of adjacent column units
         * of one outer slice (up to 4096 columns), not one per 16 columns:
         * a call's fixed cost (its frame, the chunk stack's 4 KiB probed)
         * was most of a [2, 32, 128] -> [1, 32, 128] sum. Each column is the
         * same computation whatever the call it is in: the same bits. */
        while (u0 < u1) {
            int64_t o = u0 / J->ngroups, g = u0 % J->ngroups;
            int64_t ue = (o + 1) * J->ngroups < u1 ? (o + 1) * J->ngroups : u1;
            if (ue - u0 > 4096 / RED_VW) ue = u0 + 4096 / RED_VW;
            int64_t i0 = g * RED_VW, i1 = (ue - o * J->ngroups) * RED_VW;
            if (i1 > J->inner) i1 = J->inner;
            J->t->colv(J->op, J->x + o * J->n * J->inner + i0, J->cv ? J->cv + o * J->inner + i0 : NULL, J->n,
                       J->inner, (int)(i1 - i0), 0, J->m, J->y + o * J->inner + i0);
            u0 = ue;
        }
        return;
    }
    for (int64_t u = u0; u < u1; u++) red_unit(J, u);
}

static void red_drive(int op, const float *x, const float *cv, int64_t outer, int64_t n,
                      int64_t inner, float *y, ctpu_k_pool *pool)
{
    if (outer <= 0 || inner <= 0) return;
    int cop = op >= RED_SQDEV ? CTPU_K_RED_SUM : op;
    if (n <= 0) {
        for (int64_t i = 0; i < outer * inner; i++) y[i] = red_identity(cop);
        return;
    }
    red_job J = { .t = ctpu_k_red_current(), .op = op, .x = x, .cv = cv, .outer = outer, .n = n,
                  .inner = inner, .y = y };
    J.m = (n + CTPU_K_RED_CHUNK - 1) / CTPU_K_RED_CHUNK;
    J.ngroups = inner == 1 ? 1 : (inner + RED_VW - 1) / RED_VW;
    int64_t ncu = outer * J.ngroups;
    int nt = pool && pool->run ? pool->nthreads : 1;
    if (nt > 64) nt = 64;
    bool par = nt > 1 && outer * n * inner >= RED_PAR_MIN;
    J.B = 1;
    while (J.B < J.m) J.B *= 2;   /* default: one block = the whole column */
    J.nblk = 1;
    float part[RED_MAX_UNITS * RED_VW];
    if (par && ncu < 2 * nt && J.m > 1) {
        int64_t B = 1;
        while (ncu * ((J.m + B - 1) / B) > 4 * nt) B *= 2;
        J.B = B;
        J.nblk = (J.m + B - 1) / B;
        if (J.nblk > 1) J.part = part;
    }
    J.nunits = ncu * J.nblk;
    if (par && J.nunits > 1) pool->run(pool, red_thread, &J);
    else red_thread(&J, 0, 1);
    if (!J.part) return;
    /* The tree levels above the blocks: pairwise, odd last one carried. */
    for (int64_t cu = 0; cu < ncu; cu++) {
        int64_t o = cu / J.ngroups, i0 = (cu % J.ngroups) * RED_VW;
        int nc = (int)(inner - i0 < RED_VW ? inner - i0 : RED_VW);
        for (int c = 0; c < nc; c++) {
            float v[RED_MAX_UNITS];
            int64_t mm = J.nblk;
            for (int64_t b = 0; b < mm; b++) v[b] = part[(cu * J.nblk + b) * RED_VW + c];
            for (; mm > 1; mm = (mm + 1) / 2) {
                for (int64_t i = 0; i < mm / 2; i++) v[i] = red_combine(cop, v[2 * i], v[2 * i + 1]);
                if (mm & 1) v[mm / 2] = v[mm - 1];
            }
            y[o * inner + i0 + c] = v[0];
        }
    }
}

void ctpu_k_reduce(ctpu_k_red_op op, const float *x, int64_t outer, int64_t n, int64_t inner,
                   float *y, ctpu_k_pool *pool)
{
    red_drive((int)op, x, NULL, outer, n, inner, y, pool);
}

void ctpu_k_sqdev(const float *x, const float *mean, int64_t outer, int64_t n, int64_t inner,
                  float *y, ctpu_k_pool *pool)
{
    red_drive(RED_SQDEV, x, mean, outer, n, inner, y, pool);
}

typedef struct {
    const ctpu_k_red_variant *t;
    const float *x;
    float *y;
    int64_t rows, n;
    bool log;
} softmax_job;

static void softmax_thread(void *ctx, int tid, int nt)
{
    const softmax_job *J = ctx;
    int64_t r0 = J->rows * tid / nt, r1 = J->rows * (tid + 1) / nt;
    for (int64_t r = r0; r < r1; r++) J->t->softmax_row(J->x + r * J->n, J->n, J->y + r * J->n, J->log);
}

void ctpu_k_softmax(const float *x, int64_t rows, int64_t n, float *y, bool log, ctpu_k_pool *pool)
{
    if (rows <= 0 || n <= 0) return;
    softmax_job J = { ctpu_k_red_current(), x, y, rows, n, log };
    int nt = pool && pool->run ? pool->nthreads : 1;
    if (nt > 1 && rows > 1 && rows * n >= RED_PAR_MIN) pool->run(pool, softmax_thread, &J);
    else softmax_thread(&J, 0, 1);
}

/* The pairwise chunk tree over m chunk results (kernels.h): level by level,
 * c[i] = c[2i] op c[2i+1], an odd last one carried up. In place; returns the
 * root (the identity when m == 0). For producers fused into a reduction
 * (src/fuse/vm.c), which reduce one chunk at a time. */
float ctpu_k_reduce_chunks(ctpu_k_red_op op, float *c, int64_t m)
{
    if (m <= 0) return red_identity((int)op);
    while (m > 1) {
        int64_t k = 0;
        for (int64_t i = 0; i + 1 < m; i += 2) c[k++] = red_combine((int)op, c[i], c[i + 1]);
        if (m & 1) c[k++] = c[m - 1];
        m = k;
    }
    return c[0];
}
