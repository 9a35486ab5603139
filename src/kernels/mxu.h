/* MXU matmul, kernel-internal: the precision passes, the accumulation order,
 * the packed operand layout and the per-ISA micro-kernel table.
 *
 * ---- The accumulation step (what vdpbf16ps does; docs/CONTRACTS.md "MXU numerics")
 * One step is acc = FTZ(RNE(DAZ(acc) + a*b)): the product of two bf16 values
 * is exact (never rounded on its own, never flushed on its own), the sum is
 * rounded once to f32 (round to nearest even, whatever MXCSR says), and a
 * result that is tiny after rounding (|r| < 2^-126 with unbounded exponent:
 * x86 detects tininess after rounding) becomes zero of the sign of the exact
 * sum. Operands are bf16, so subnormal inputs are already zero (the f32 ->
 * bf16 rounding flushes them, as the instruction's DAZ would).
 * This is the model measured on Sapphire Rapids' vdpbf16ps (the probe test
 * checks it): an "FMA with DAZ in, FTZ out" per product, as Intel's
 * pseudo-code says. Flushing each product separately does NOT match the
 * hardware (products near 2^-126 then change the sum), nor does rounding
 * after subnormal rounding (fmaf + flush differs just below 2^-126).
 *
 * ---- One pass over K
 * acc = +0; for p = 0 .. ceil(K/2)-1:
 *     acc = step(acc, a[2p+1], b[2p+1])      odd index first
 *     acc = step(acc, a[2p],   b[2p])
 * with a[K] = b[K] = +0 when K is odd (the zero partner is consumed first).
 * The order depends only on K; M, N, tiling, threads and ISA never change it.
 *
 * ---- Precision passes
 * Each f32 operand x is split into bf16 parts, computed in f32 (exact
 * subtractions, -ffp-contract=off):
 *     part0 = hi  = bf16(x)
 *     part1 = mid = bf16(x - hi)            (HIGH calls it lo)
 *     part2 = lo  = bf16((x - hi) - mid)
 * bf16() is ctpu_f32_to_bf16. When x is Inf/NaN, or hi overflows to Inf,
 * parts 1 and 2 are +0 (so an Inf meeting a zero part of the other operand
 * gives NaN in HIGH/HIGHEST, as any multi-pass bf16 scheme does).
 * The passes run through ONE accumulator, in this order, each pass a full
 * "one pass over K" as above (each pass padded to even K on its own), i.e.
 * the product of the concatenations [A_p1 | A_p2 | ...] . [B_q1 | B_q2 | ...]:
 *     DEFAULT (1 pass):  (hi,hi)
 *     HIGH    (3):       (mid,hi) (hi,mid) (hi,hi)
 *     HIGHEST (6):       (lo,hi) (hi,lo) (mid,mid) (mid,hi) (hi,mid) (hi,hi)
 * (pairs are (A part, B part)); small terms first, so they accumulate at
 * their own scale before the hi.hi terms arrive.
 *
 * ---- Packed layout (all ISAs; W = the micro-kernel's MR for A, NR for B)
 * An operand X[I,K] (A as [M,K]; B as its transpose [N,K]) is packed into
 * panels of W rows of i; panel q holds, for kp = 0 .. KP-1 (KP = passes *
 * ceil(K/2)), W dwords: dword (kp, r) = bf16 of X[q*W + r, 2p] in the low half
 * and of X[q*W + r, 2p+1] in the high half (the pass's part), p = kp mod
 * ceil(K/2). Rows past I and the odd partner past K are +0.
 * A second, planar layout (for FMA micro-kernels) holds the same values as
 * f32: for each kp, W odd elements X[.., 2p+1] then W even elements X[.., 2p].
 * A third, row layout (A only, default precision, A with unit stride along
 * k): each of the panel's W rows holds its kp pairs contiguously (row r at
 * r * rs dwords, padded so the rows do not share L1 sets), no transpose; the
 * micro-kernel broadcasts from W rows. For the vdpbf16ps micro-kernel the
 * same pair dwords (rs >= kp; one vcvtne2ps2bf16 per 32 elements); for the
 * FMA ones (planar impls) the row's elements as bf16-valued f32 in natural
 * order, 2 kp of them (rs >= 2 kp; the odd partner past K a +0).
 * A micro-kernel computes a full MR x NR tile of f32 into c (row stride ldc),
 * starting from c (load != 0) or from +0.
 */
#ifndef CTPU_MXU_H
#define CTPU_MXU_H
#include <string.h>
#include "internal.h"

#define CTPU_MXU_MAX_PASSES 6

/* Pass tables: the (A part, B part) of each pass, in accumulation order. */
static const uint8_t ctpu_mxu_npass[CTPU_PREC_COUNT] = { 1, 3, 6 };
static const uint8_t ctpu_mxu_pass_a[CTPU_PREC_COUNT][CTPU_MXU_MAX_PASSES] = {
    { 0 }, { 1, 0, 0 }, { 2, 0, 1, 1, 0, 0 } };
static const uint8_t ctpu_mxu_pass_b[CTPU_PREC_COUNT][CTPU_MXU_MAX_PASSES] = {
    { 0 }, { 0, 1, 0 }, { 0, 2, 1, 0, 1, 0 } };

static inline uint32_t ctpu_mxu_fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float ctpu_mxu_bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* bf16 part `s` (0 hi, 1 mid, 2 lo) of x, as above. */
static inline uint16_t ctpu_mxu_part(float x, int s)
{
    uint16_t h = ctpu_f32_to_bf16(x);
    if (s == 0) return h;
    float hf = ctpu_bf16_to_f32(h);
    if ((ctpu_mxu_fbits(x) & 0x7f800000u) == 0x7f800000u ||
        (ctpu_mxu_fbits(hf) & 0x7f800000u) == 0x7f800000u)
        return 0;
    float r = x - hf;
    uint16_t m = ctpu_f32_to_bf16(r);
    if (s == 1) return m;
    return ctpu_f32_to_bf16(r - ctpu_bf16_to_f32(m));
}

/* Element (i, k) of a strided f32/bf16 operand, as f32. */
static inline float ctpu_mxu_load(const void *p, int dt, int64_t off)
{
    return dt == CTPU_KDT_BF16 ? ctpu_bf16_to_f32(((const uint16_t *)p)[off])
                               : ((const float *)p)[off];
}

/* What to pack: X[i,k] at src + i*si + k*sk (dtype dt), I x K, into panels of
 * width w, for the parts `parts[0..npass)`. Panels [q0, q1) are written to
 * dst + q*panel_dwords. */
typedef struct {
    const void *src; int dt; int64_t si, sk, I, K;
    int w, npass; const uint8_t *parts;
    uint32_t *dst;
    int pf;     /* a hint: the source is larger than the caches (the packer may prefetch ahead) */
} ctpu_mxu_pack_args;
static inline int64_t ctpu_mxu_kh(int64_t K) { return (K + 1) / 2; }
static inline int64_t ctpu_mxu_panel_dwords(const ctpu_mxu_pack_args *p)
{
    return (int64_t)p->npass * ctpu_mxu_kh(p->K) * p->w;
}

/* f32 bits -> the bits of ctpu_bf16_to_f32(ctpu_f32_to_bf16(f)), branch-free
 * so that packing loops vectorise. */
static inline uint32_t ctpu_mxu_round_bits(uint32_t u)
{
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    uint32_t q = (u | 0x00400000u) & 0xffff0000u;
    uint32_t h = (u & 0x7fffffffu) > 0x7f800000u ? q : r;
    return (h & 0x7f800000u) == 0 ? h & 0x80000000u : h;
}

/* Planar f32 packer (see layout above). Fast paths for f32/bf16 operands
 * with unit stride along i or k at default precision; the rest through
 * ctpu_mxu_part. */
static inline void ctpu_mxu_pack_planar(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1)
{
    int64_t kh = ctpu_mxu_kh(pa->K), K = pa->K, si = pa->si, sk = pa->sk;
    int w = pa->w;
    int64_t pd = 2 * (int64_t)pa->npass * kh * w;
    int fast = pa->npass == 1 && pa->parts[0] == 0;
    for (int64_t q = q0; q < q1; q++) {
        uint32_t *d = pa->dst + q * pd;
        int64_t i0 = q * w, n = pa->I - i0 < w ? pa->I - i0 : w;
        if (fast && si == 1 && n == w) {
            /* rows of k contiguous over i: vector loads along i */
            for (int64_t p = 0; p < kh; p++) {
                uint32_t *od = d + p * 2 * w, *ev = od + w;
                int has1 = 2 * p + 1 < K;
                if (pa->dt == CTPU_KDT_F32) {
                    const uint32_t *x0 = (const uint32_t *)pa->src + 2 * p * sk + i0;
                    const uint32_t *x1 = x0 + sk;
                    for (int r = 0; r < w; r++) ev[r] = ctpu_mxu_round_bits(x0[r]);
                    if (has1) for (int r = 0; r < w; r++) od[r] = ctpu_mxu_round_bits(x1[r]);
                    else for (int r = 0; r < w; r++) od[r] = 0;
                } else {
                    const uint16_t *x0 = (const uint16_t *)pa->src + 2 * p * sk + i0;
                    const uint16_t *x1 = x0 + sk;
                    for (int r = 0; r < w; r++) ev[r] = ctpu_mxu_round_bits((uint32_t)x0[r] << 16);
                    if (has1) for (int r = 0; r < w; r++) od[r] = ctpu_mxu_round_bits((uint32_t)x1[r] << 16);
                    else for (int r = 0; r < w; r++) od[r] = 0;
                }
            }
            continue;
        }
        if (fast && sk == 1) {
            /* each i's k contiguous: convert a row, then spread it */
            for (int64_t r = 0; r < w; r++) {
                if (r >= n) {
                    for (int64_t p = 0; p < kh; p++) d[p * 2 * w + r] = d[p * 2 * w + w + r] = 0;
                    continue;
                }
                int64_t kp2 = K / 2;
                if (pa->dt == CTPU_KDT_F32) {
                    const uint32_t *x = (const uint32_t *)pa->src + (i0 + r) * si;
                    for (int64_t p = 0; p < kp2; p++) {
                        d[p * 2 * w + r] = ctpu_mxu_round_bits(x[2 * p + 1]);
                        d[p * 2 * w + w + r] = ctpu_mxu_round_bits(x[2 * p]);
                    }
                    if (K & 1) {
                        d[kp2 * 2 * w + r] = 0;
                        d[kp2 * 2 * w + w + r] = ctpu_mxu_round_bits(x[K - 1]);
                    }
                } else {
                    const uint16_t *x = (const uint16_t *)pa->src + (i0 + r) * si;
                    for (int64_t p = 0; p < kp2; p++) {
                        d[p * 2 * w + r] = ctpu_mxu_round_bits((uint32_t)x[2 * p + 1] << 16);
                        d[p * 2 * w + w + r] = ctpu_mxu_round_bits((uint32_t)x[2 * p] << 16);
                    }
                    if (K & 1) {
                        d[kp2 * 2 * w + r] = 0;
                        d[kp2 * 2 * w + w + r] = ctpu_mxu_round_bits((uint32_t)x[K - 1] << 16);
                    }
                }
            }
            continue;
        }
        for (int ps = 0; ps < pa->npass; ps++) {
            int s = pa->parts[ps];
            for (int64_t p = 0; p < kh; p++) {
                uint32_t *od = d + (ps * kh + p) * 2 * w, *ev = od + w;
                for (int64_t r = 0; r < w; r++) {
                    if (r >= n) { od[r] = ev[r] = 0; continue; }
                    int64_t base = (i0 + r) * si;
                    ev[r] = (uint32_t)ctpu_mxu_part(ctpu_mxu_load(pa->src, pa->dt, base + 2 * p * sk), s) << 16;
                    od[r] = 2 * p + 1 < K
                        ? (uint32_t)ctpu_mxu_part(ctpu_mxu_load(pa->src, pa->dt, base + (2 * p + 1) * sk), s) << 16
                        : 0;
                }
            }
        }
    }
}

/* Generic packer (any strides); ISA files may specialise the common cases. */
static inline void ctpu_mxu_pack_generic(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1)
{
    int64_t kh = ctpu_mxu_kh(pa->K), pd = ctpu_mxu_panel_dwords(pa);
    int w = pa->w;
    for (int64_t q = q0; q < q1; q++) {
        uint32_t *d = pa->dst + q * pd;
        int64_t i0 = q * w, n = pa->I - i0 < w ? pa->I - i0 : w;
        for (int ps = 0; ps < pa->npass; ps++) {
            int s = pa->parts[ps];
            for (int64_t p = 0; p < kh; p++) {
                uint32_t *o = d + (ps * kh + p) * w;
                for (int64_t r = 0; r < n; r++) {
                    int64_t base = (i0 + r) * pa->si;
                    uint32_t lo = ctpu_mxu_part(ctpu_mxu_load(pa->src, pa->dt, base + 2 * p * pa->sk), s);
                    uint32_t hi = 2 * p + 1 < pa->K
                        ? ctpu_mxu_part(ctpu_mxu_load(pa->src, pa->dt, base + (2 * p + 1) * pa->sk), s)
                        : 0;
                    o[r] = lo | hi << 16;
                }
                for (int64_t r = n; r < w; r++) o[r] = 0;
            }
        }
    }
}

/* Micro-kernel: c[MR x NR] (row stride ldc) = (load ? c : +0) + kp steps of
 * packed pairs (a: kp x MR dwords, b: kp x NR dwords), pair order as above. */
typedef void (*ctpu_mxu_kernel_fn)(int64_t kp, const uint32_t *a, const uint32_t *b, float *c,
                                   int64_t ldc, int load);
typedef void (*ctpu_mxu_pack_fn)(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1);
/* Cache lines for a micro-kernel to prefetch while it computes (hints, never
 * read): n lines, lpr per row, the rows at base + r * stride (each from its
 * 64-byte line down). */
typedef struct { const char *base; int64_t stride; int lpr, n; } ctpu_mxu_pf;
/* A micro-kernel's walk over a ctpu_mxu_pf's lines: the current row and
 * line, the line's column in its row, the lines still to prefetch. */
typedef struct { uintptr_t row, line; int col, left; } ctpu_mxu_pf_cursor;
static inline __attribute__((always_inline)) ctpu_mxu_pf_cursor ctpu_mxu_pf_start(int PF, const ctpu_mxu_pf *pf)
{
    ctpu_mxu_pf_cursor k = {PF ? (uintptr_t)pf->base : 0, 0, 0, PF ? pf->n : 0};
    k.line = k.row & ~(uintptr_t)63;
    return k;
}
/* Prefetches the next two lines (none once all n are issued). */
static inline __attribute__((always_inline)) void ctpu_mxu_pf_step2(ctpu_mxu_pf_cursor *k, const ctpu_mxu_pf *pf)
{
    if (k->left <= 0) return;
#pragma GCC unroll 2
    for (int u = 0; u < 2; u++) {
        __builtin_prefetch((const void *)k->line, 0, 3);   /* prefetcht0 */
        k->line += 64;
        if (++k->col == pf->lpr) {
            k->col = 0;
            k->row += (uintptr_t)pf->stride;
            k->line = k->row & ~(uintptr_t)63;
        }
    }
    k->left -= 2;
}
/* The same on a row-layout A (row r of the panel at a + r * as dwords),
 * starting from cin (row stride ldin; NULL: from +0; may equal c) and
 * storing into c; pf: NULL, or lines to prefetch, two per pair step. */
typedef void (*ctpu_mxu_kernel_ar_fn)(int64_t kp, const uint32_t *a, int64_t as, const uint32_t *b,
                                      const float *cin, int64_t ldin, float *c, int64_t ldc,
                                      const ctpu_mxu_pf *pf);
/* The same on planar A (kp pairs) and B read in place: f32 B[k][n] at
 * b + k * bsk + n for the tile's k rows and its first ncols (<= nr) columns
 * (the rest +0), each element rounded as packing would (ctpu_mxu_round_bits);
 * kodd: the last pair's odd row is past K (+0). c loaded when load != 0. */
typedef void (*ctpu_mxu_kernel_bd_fn)(int64_t kp, const uint32_t *a, const float *b, int64_t bsk, int ncols,
                                      int kodd, float *c, int64_t ldc, int load);
/* Row-layout packing: panel q at dst + q * w * rs, row r of it at + r * rs. */
typedef void (*ctpu_mxu_pack_ar_fn)(const ctpu_mxu_pack_args *pa, int64_t rs, int64_t q0, int64_t q1);

typedef struct {
    const char *name;
    int mr, nr;                 /* micro-tile */
    int planar;                 /* packed layout: 0 pair dwords, 1 planar f32 */
    ctpu_mxu_kernel_fn kernel;
    /* [r], 1 <= r < mr: the same tile's rows 0..r-1 only (the last panel
     * of an M that mr does not divide), or NULL */
    const ctpu_mxu_kernel_fn *kernel_rows;
    ctpu_mxu_pack_fn pack;
    /* d[j * ldd + i] = s[i * ld + j] for i < rows, j < cols (a finished block
     * of C^T into c: bit copies), or NULL (the driver's scalar loop) */
    void (*transpose)(const float *s, int64_t ld, int64_t rows, int64_t cols, float *d, int64_t ldd);
    /* row-layout A (see above), or NULL: [r] as kernel_rows, [mr] the full tile */
    const ctpu_mxu_kernel_ar_fn *kernel_ar;
    ctpu_mxu_pack_ar_fn pack_ar;
    /* B read in place, or NULL: [r] rows 0..r-1 (1 <= r <= mr) of a tile on a
     * packed A panel and an unpacked f32 B with unit stride along n */
    const ctpu_mxu_kernel_bd_fn *kernel_bd;
} ctpu_mxu_impl;

extern const ctpu_mxu_impl ctpu_mxu_impl_ref, ctpu_mxu_impl_avx2, ctpu_mxu_impl_avx512,
    ctpu_mxu_impl_avx512_dp;
const ctpu_mxu_impl *ctpu_mxu_current(void);
/* The AVX-512 micro-kernel probe (mxu_ref.c): each candidate's best rate in
 * FLOP/s (0: FMA, 1: vdpbf16ps), the probe's wall and CPU time (ms) and the
 * winner. NULL until the AVX-512 variant was first selected. */
typedef struct { double rate[2], ms, cpu_ms; const ctpu_mxu_impl *chosen; } ctpu_mxu_probe_info;
const ctpu_mxu_probe_info *ctpu_mxu_probe_result(void);
/* Tests and benchmarks only: use this table (NULL: back to the ISA's). */
void ctpu_mxu_force_impl(const ctpu_mxu_impl *im);
/* Tests only: the work (FLOP) below which a call uses fewer threads
 * (default 2e6 per thread); 0 makes every call use the whole pool. */
void ctpu_mxu_set_thread_min_flop(double flop);

/* The exact step of the reference (plain C; double holds a bf16 x bf16
 * product exactly, and a TwoSum error term resolves the one double-rounding
 * case, a sum that lands exactly on an f32 midpoint). */
static inline float ctpu_mxu_step_ref(float acc, float a, float b)
{
    if ((ctpu_mxu_fbits(acc) & 0x7f800000u) == 0)            /* DAZ */
        acc = ctpu_mxu_bitsf(ctpu_mxu_fbits(acc) & 0x80000000u);
    double p = (double)a * (double)b, A = acc, s = A + p;
    if (s != s) return ctpu_mxu_bitsf(0x7fc00000u);
    if (s - s != 0) return (float)s;                          /* +-Inf */
    if (s == 0) return (float)s;                              /* exact zero, IEEE sign */
    double bb = s - A, err = (A - (s - bb)) + (p - bb);
    uint64_t u; memcpy(&u, &s, 8);
    uint64_t sg = u & (1ull << 63);
    u &= ~sg;
    uint64_t low = u & ((1ull << 29) - 1), half = 1ull << 28;
    u &= ~((1ull << 29) - 1);
    int up;
    if (low > half) up = 1;
    else if (low < half) up = 0;
    else if (err == 0) up = (int)((u >> 29) & 1);            /* tie: to even */
    else up = (err > 0) == (sg == 0);                         /* not a tie after all */
    if (up) u += 1ull << 29;
    double r; memcpy(&r, &u, 8);
    float f;
    if (r < 0x1p-126) f = 0.0f;                               /* FTZ, after rounding */
    else if (r > 3.4028234663852886e38) f = __builtin_inff();
    else f = (float)r;
    return sg ? -f : f;
}

#endif /* CTPU_MXU_H */
