/* ctpu kernels: pure compute on raw pointers and sizes.
 *
 * This header is the whole interface between the runtime (src/device,
 * src/fuse, src/eager) and the kernels. Nothing here knows about handles,
 * traces or the device: only pointers, extents, dtypes and a thread pool.
 *
 * Every kernel family has a plain-C `_ref` variant that is the executable
 * specification; SIMD variants (AVX2, AVX-512) are stamped from one driver per
 * family (simd_elementwise.h, simd_reduce.h) by each ISA's file of primitives
 * (simd_avx2.c, simd_avx512.c), built with that ISA's compiler flags, and chosen
 * once at runtime from the table of variants in isa.c (see
 * ctpu_kernels_set_isa). Every variant equals `_ref` bit for bit (NaN compared
 * as a class: NaN exactly where `_ref` has NaN).
 *
 * Numerics (docs/CONTRACTS.md):
 *  - no FMA contraction (-ffp-contract=off), every op rounds to f32;
 *  - transcendentals from SLEEF's non-FMA 1.0-ulp family only
 *    (purec / avx / avx512fnofma), which give the same bits on every ISA;
 *  - reductions in one shape-determined order (CTPU_K_RED_* below).
 */
#ifndef CTPU_KERNELS_H
#define CTPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

/* ---- dtypes (same numbering as the public ctpu_dtype) ------------------ */
enum { CTPU_KDT_F32 = 0, CTPU_KDT_BF16 = 1, CTPU_KDT_I32 = 2, CTPU_KDT_COUNT };
static inline size_t ctpu_kdt_size(int dt) { return dt == CTPU_KDT_BF16 ? 2 : 4; }

/* ---- ISA selection ------------------------------------------------------ */
typedef enum {
    CTPU_ISA_SCALAR = 0, CTPU_ISA_AVX2 = 1, CTPU_ISA_AVX512 = 2, CTPU_ISA_COUNT
} ctpu_isa;

/* Best ISA this CPU supports (cpuid + OS xsave state). AVX2 needs
 * AVX2+FMA+F16C; AVX512 needs F+BW+DQ+VL+BF16. */
ctpu_isa ctpu_isa_detect(void);
/* Select the variant table. Returns false (and changes nothing) when the CPU
 * lacks `isa`. Not thread-safe: called by ctpu_init only. */
bool ctpu_kernels_set_isa(ctpu_isa isa);
ctpu_isa ctpu_kernels_isa(void);
const char *ctpu_isa_name(ctpu_isa isa);

/* ---- thread pool hook ---------------------------------------------------
 * The device owns the threads; a kernel that parallelises calls
 * pool->run(pool, fn, ctx), which calls fn(ctx, tid, nt) once for every
 * tid in [0, nt) (tid 0 on the calling thread) and returns when all are done.
 * pool == NULL or nthreads == 1 means: run on the calling thread only.
 * Work must be split so that the result bits do not depend on nt. */
typedef struct ctpu_k_pool ctpu_k_pool;
struct ctpu_k_pool {
    int nthreads;
    void (*run)(ctpu_k_pool *pool, void (*fn)(void *ctx, int tid, int nt), void *ctx);
    void *impl;
};

/* ---- bf16 ------------------------------------------------------------------
 * f32 -> bf16, the one rounding function of docs/CONTRACTS.md: round to nearest
 * even; a result in the bf16 subnormal range (|x| < 2^-126 after rounding)
 * becomes zero of the same sign; NaN -> quiet NaN (sign kept); overflow -> Inf. */
static inline uint16_t ctpu_f32_to_bf16(float f)
{
    union { float f; uint32_t u; } v = { f };
    uint32_t u = v.u;
    if ((u & 0x7fffffffu) > 0x7f800000u)           /* NaN */
        return (uint16_t)((u >> 16) | 0x0040u);
    uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);   /* RNE; carries into Inf */
    uint16_t h = (uint16_t)(r >> 16);
    if ((h & 0x7f80u) == 0) h &= 0x8000u;          /* subnormal/zero -> signed zero */
    return h;
}
static inline float ctpu_bf16_to_f32(uint16_t h)
{
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}
/* f32 -> i32: round toward zero, saturating; NaN -> 0. */
static inline int32_t ctpu_f32_to_i32(float f)
{
    if (f != f) return 0;
    if (f >= 2147483648.0f) return INT32_MAX;
    if (f <= -2147483648.0f) return INT32_MIN;
    return (int32_t)f;
}

/* GELU_ERF's double steps (elementwise_ref.c ref_u_GELU_ERF): 1/sqrt 2;
 * erfcx(u) = exp(u^2) erfc(u) on [0, 10.5] as a degree-14 polynomial in
 * s = (t - TC) * INV_TH, t = (u - 3) / (u + 3) (a Chebyshev fit to mpmath's
 * erfcx, converted to powers of s; its relative error is below 6e-12 there);
 * the coefficients, s^0 first. */
#define CTPU_K_GELU_INV_SQRT2 0x1.6a09e667f3bcdp-1
#define CTPU_K_GELU_U_MAX 10.5
#define CTPU_K_GELU_TC (-0x1.c71c71c71c71cp-3)
#define CTPU_K_GELU_INV_TH 0x1.4924924924924p+0
#define CTPU_K_GELU_NC 15
/* e^w's Taylor coefficients 1/n!, n = 0 .. 11 (as double constant expressions) */
#define CTPU_K_GELU_EXP_COEFFS 1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040, \
    1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800
#define CTPU_K_GELU_ERFCX_COEFFS \
    0x1.0fd540053f4b2p-2, -0x1.6f3ad898740c0p-2, 0x1.ca12e4ded09b0p-3, \
    -0x1.b4f09ef962031p-4, 0x1.30735853ef22ep-5, -0x1.0e479f940a033p-7, \
    0x1.0f2031cf1ab32p-11, 0x1.3d8329efbf385p-12, -0x1.2b1ff031962b2p-14, \
    -0x1.816e3900485cfp-17, 0x1.6714030f13780p-18, 0x1.6684252e06669p-21, \
    -0x1.9d725b4672c21p-22, -0x1.8d8e63e511fe0p-25, 0x1.7a1f3d946b06ep-26
/* TANH's double steps (elementwise_ref.c ref_u_TANH): 1/ln 2, ln 2 in two
 * parts (the high one's low 21 bits zero: k * HI is exact), the rounding
 * shift 1.5 * 2^52 */
#define CTPU_K_TANH_INV_LN2 0x1.71547652b82fep+0
#define CTPU_K_TANH_LN2_HI 0x1.62e42fee00000p-1
#define CTPU_K_TANH_LN2_LO 0x1.a39ef35793c76p-33
#define CTPU_K_TANH_SHIFT 0x1.8p+52

/* ---- elementwise on f32 blocks ------------------------------------------
 * The block VM's instruction set. Every op reads and writes f32 arrays of n
 * elements (n <= CTPU_K_BLOCK in the VM; any n is allowed). y may alias an
 * input. Definitions (exactly what _ref computes, in f32):
 *   NEG -x;  ABS |x|;  EXP/LOG/SQRT: SLEEF u10 (sqrt: IEEE sqrt);
 *   TANH in double, rounded once: y = min(|x|, 10), u = 2y, k = rint(u/ln 2)
 *     (the 1.5*2^52 shift), r = (u - k*LN2_HI) - k*LN2_LO, p = expm1(r) as
 *     r*(1 + r*(1/2! + r*(1/3! + ... + r*(1/9!)))) (Horner, each step one double
 *     operation), s = 2^k, tanh = ((s-1) + s*p) / ((s+1) + s*p), rounded to f32
 *     with x's sign; NaN x: x + x. Every ISA does these double operations
 *     (half a vector's lanes at a time), so the same bits; <= 1 ulp of
 *     float64 tanh (the double value is within 2^-33 relative of it: checked
 *     over all 2^32 inputs, as the ISAs' equality);
 *   RSQRT 1/sqrt(x);  SIGMOID 1/(1+exp(-x));  RELU x>0 ? x : (x!=x ? x : +0);
 *   GELU_TANH 0.5*x*(1+tanh(0.7978845608f*(x+0.044715f*(x*x*x))))  (products
 *     left to right, each rounded);  GELU_ERF in double, rounded once: u = |x| / sqrt 2
 *     (x widened, times f64(1/sqrt 2)), E = erfc(u) = P(s) * exp(-u^2) with P the
 *     erfcx polynomial above (Horner, s^14 first), exp(-v) for v = min(u, 10.5)^2
 *     as 2^-k * e^-r (k = rint(v/ln 2) by the 1.5*2^52 shift, r = (v - k*LN2_HI)
 *     - k*LN2_LO as TANH's, e^-r by its degree-11 Taylor Horner in -r),
 *     E = +0 unless u < 10.5; phi = x < 0 ? E/2 : 1 - E/2; result f32(x * phi)
 *     (NaN stays NaN; -inf gives NaN, as -inf * 0). Every ISA does these double
 *     operations (half a vector's lanes at a time), so the same bits (checked
 *     over all 2^32 inputs, scalar against AVX2 and AVX-512); within 0.5001 ulp
 *     of exact GELU (0.5 x erfc(-x/sqrt 2) in float64) over all 2^32 inputs;
 *   RECIP 1/x;  SQUARE x*x;
 *   SOFTPLUS x > 20 ? x : log1p(exp(x))  (torch.nn.functional.softplus with
 *     beta 1, threshold 20; exp and log1p SLEEF u10);
 *   ERF LOG1P EXPM1: SLEEF f32 u10 (LOG1P: log above
 *     1e38, where SLEEF's log1pf overflows);  SIN COS: SLEEF double u10 of the
 *     widened x, rounded once (SLEEF 3.5.1's f32 sin/cos differ across ISAs);
 *   ADD SUB MUL DIV: IEEE;  POW: SLEEF powf u10;
 *   MAX/MIN: NaN if either is NaN, else (a>b ? a : b) / (a<b ? a : b);
 *   EQ NE LT LE GT GE: 1.0f / 0.0f (IEEE compare, NaN compares false, NE true);
 *   WHERE(c,a,b): c != 0 ? a : b  (NaN c counts as true);
 *   CLAMP(x,lo,hi): MIN(MAX(x,lo),hi) with NaN propagation from any side.
 *   ROUND_BF16: x rounded to bf16 and back (ctpu_f32_to_bf16).
 *
 * SLEEF variants: _ref calls Sleef_{exp,log,erf,log1p}f1_u10purec and
 * Sleef_powf1_u10purec; AVX2 the same functions as Sleef_*f8_u10avx, AVX-512
 * as Sleef_*f16_u10avx512fnofma. Checked bit for bit (SLEEF 3.5.1): exp, log
 * and erf over all 2^32 inputs (tanh too, while it was SLEEF's), pow on 3.8e8 pairs (random bits, wide
 * and near-1 bases, negative bases with integer exponents), SOFTPLUS (exp
 * then log1p) on 2^28 inputs (every 16th bit pattern): no difference, so
 * every variant calls its own ISA's function. The FMA family does differ
 * (Sleef_expf8_u10, which dispatches to avx2 FMA code, fails the parity test):
 * never use it, nor the purecfma / plain scalar entry points.
 */
#define CTPU_K_BLOCK 1024

#define CTPU_K_UNARY_OPS(X) \
    X(NEG) X(ABS) X(EXP) X(LOG) X(SQRT) X(RSQRT) X(TANH) X(SIGMOID) X(RELU) \
    X(GELU_TANH) X(GELU_ERF) X(RECIP) X(SQUARE) X(ROUND_BF16) X(SOFTPLUS) \
    X(ERF) X(SIN) X(COS) X(LOG1P) X(EXPM1)
#define CTPU_K_BINARY_OPS(X) \
    X(ADD) X(SUB) X(MUL) X(DIV) X(POW) X(MAX) X(MIN) \
    X(EQ) X(NE) X(LT) X(LE) X(GT) X(GE)

typedef enum {
#define X(n) CTPU_K_U_##n,
    CTPU_K_UNARY_OPS(X)
#undef X
    CTPU_K_U_COUNT
} ctpu_k_unary_op;
typedef enum {
#define X(n) CTPU_K_B_##n,
    CTPU_K_BINARY_OPS(X)
#undef X
    CTPU_K_B_COUNT
} ctpu_k_binary_op;

void ctpu_k_unary(ctpu_k_unary_op op, const float *x, float *y, int64_t n);
void ctpu_k_binary(ctpu_k_binary_op op, const float *a, const float *b, float *y, int64_t n);
/* b is one scalar broadcast over a (a op s), or s op a when `scalar_first`. */
void ctpu_k_binary_scalar(ctpu_k_binary_op op, const float *a, float s, bool scalar_first,
                          float *y, int64_t n);
void ctpu_k_where(const float *c, const float *a, const float *b, float *y, int64_t n);
void ctpu_k_clamp(const float *x, float lo, float hi, float *y, int64_t n);

void ctpu_k_unary_ref(ctpu_k_unary_op op, const float *x, float *y, int64_t n);
void ctpu_k_binary_ref(ctpu_k_binary_op op, const float *a, const float *b, float *y, int64_t n);
void ctpu_k_binary_scalar_ref(ctpu_k_binary_op op, const float *a, float s, bool scalar_first,
                              float *y, int64_t n);
void ctpu_k_where_ref(const float *c, const float *a, const float *b, float *y, int64_t n);
void ctpu_k_clamp_ref(const float *x, float lo, float hi, float *y, int64_t n);

/* ---- fused elementwise tapes (the VM's register-resident path) ------------
 * A tape is a fused chain run strip by strip (a few SIMD vectors at a time)
 * with every instruction of the chain applied to the strip in registers
 * before the next strip is touched: the previous instruction's result stays
 * in registers (source -1), other values are read from `val` arrays (the
 * group's operands in f32, or register arrays the tape itself stores to).
 * Each instruction is one op of the block instruction set above (kind: UNARY
 * kop, BINARY kop a b, AS a op s0, SA s0 op a, WHERE a ? b : c with a the
 * condition, CLAMP a to [s0, s1], FILL s0, COPY a), then, with round_bf16,
 * ROUND_BF16; its result is stored to val[dst] (dst >= 0) and to output
 * `out` (out >= 0: f32, f32 with non-temporal stores, or bf16 as
 * ctpu_k_f32_to_bf16). Every op is the SIMD body of the block kernel of the
 * same ISA (the bits of _ref; transcendental ops run that kernel on the
 * strip), so a tape gives, element by element, the bits of running its
 * instructions one after another as block kernels (ctpu_k_tape_ref). All
 * arrays hold n elements; an instruction's val[dst] and output may alias its
 * sources only at the same element. Non-temporal outputs need a 64-byte
 * aligned pointer (else plain stores); the caller fences them
 * (ctpu_k_stream_fence). Returns false, running nothing, when the selected
 * variant has no tape (scalar): run the instructions as block kernels. */
enum { CTPU_K_T_UNARY, CTPU_K_T_BINARY, CTPU_K_T_AS, CTPU_K_T_SA, CTPU_K_T_WHERE, CTPU_K_T_CLAMP,
       CTPU_K_T_FILL, CTPU_K_T_COPY, CTPU_K_T_COUNT };
enum { CTPU_K_TO_F32, CTPU_K_TO_F32_STREAM, CTPU_K_TO_BF16 };
typedef struct {
    uint8_t kind, kop;
    bool round_bf16;
    int8_t a, b, c;      /* sources: -1 the previous instruction's result, else an index into val */
    int8_t dst;          /* -1, or the val array its f32 result is stored to */
    int8_t out;          /* -1, or the output it is stored to */
    float s0, s1;
} ctpu_k_tape_ins;
typedef struct {
    void *p;             /* n elements of f32 or bf16 */
    uint8_t kind;        /* CTPU_K_TO_* */
} ctpu_k_tape_out;
bool ctpu_k_tape(const ctpu_k_tape_ins *ins, int n_ins, float *const *val, const ctpu_k_tape_out *out, int64_t n);
/* The definition: each instruction over all n elements with the scalar
 * block kernels, in order (instruction i's result kept in an n-element
 * array; n_ins <= 256). False when out of memory. */
bool ctpu_k_tape_ref(const ctpu_k_tape_ins *ins, int n_ins, float *const *val, const ctpu_k_tape_out *out,
                     int64_t n);

/* Conversions (all n elements; any alignment). */
void ctpu_k_bf16_to_f32(const uint16_t *x, float *y, int64_t n);
void ctpu_k_f32_to_bf16(const float *x, uint16_t *y, int64_t n);
void ctpu_k_i32_to_f32(const int32_t *x, float *y, int64_t n);
void ctpu_k_f32_to_i32(const float *x, int32_t *y, int64_t n);
void ctpu_k_f32_to_bf16_ref(const float *x, uint16_t *y, int64_t n);

/* ---- reductions ----------------------------------------------------------
 * x viewed as [outer, n, inner] (row-major, contiguous); reduce the middle
 * dim; y is [outer, inner] f32.
 *
 * The one order (CTPU_K_RED_*), for each (outer, inner) column of length n:
 *   the column is cut into chunks of CTPU_K_RED_CHUNK elements (the last one
 *   shorter); within a chunk, element j goes to virtual lane j % 16 and each
 *   lane accumulates left to right from its identity; the 16 lanes are then
 *   combined by the fixed tree l[i] = l[i] op l[i+8], then +4, +2, +1;
 *   chunk results c[0..m) are combined pairwise: while m > 1,
 *   c[i] = c[2i] op c[2i+1] (an odd last one carried up unchanged).
 * sum: identity +0.0f, op +.  prod: identity 1.0f, op * (each product rounded).  max/min: identity -Inf/+Inf, op as MAX/MIN above
 * (NaN propagates). The pool may split outer*inner columns or chunks, never
 * the order.  */
#define CTPU_K_RED_CHUNK 4096
#define CTPU_K_RED_LANES 16
typedef enum { CTPU_K_RED_SUM, CTPU_K_RED_MAX, CTPU_K_RED_MIN, CTPU_K_RED_PROD, CTPU_K_RED_COUNT } ctpu_k_red_op;

void ctpu_k_reduce(ctpu_k_red_op op, const float *x, int64_t outer, int64_t n, int64_t inner,
                   float *y, ctpu_k_pool *pool);
void ctpu_k_reduce_ref(ctpu_k_red_op op, const float *x, int64_t outer, int64_t n, int64_t inner,
                       float *y);
/* The pairwise chunk tree over m chunk results c[0..m) (in place); returns
 * the root. Reducing a column chunk by chunk (ctpu_k_reduce on each chunk of
 * <= CTPU_K_RED_CHUNK elements, then this) gives the bits of one
 * ctpu_k_reduce over the column. m == 0 -> the identity. */
float ctpu_k_reduce_chunks(ctpu_k_red_op op, float *c, int64_t m);
/* argmax/argmin over the middle dim: the first index of the maximal (minimal)
 * value; a NaN counts as maximal (minimal) and the first NaN wins. n == 0 -> 0. */
void ctpu_k_argmax(const float *x, int64_t outer, int64_t n, int64_t inner, int32_t *y, bool is_min);

/* Sum of squared deviations from mean[o,i] over the middle dim, in the
 * reduction order above: y[o,i] = sum_j (x[o,j,i]-mean[o,i])^2. */
void ctpu_k_sqdev(const float *x, const float *mean, int64_t outer, int64_t n, int64_t inner,
                  float *y, ctpu_k_pool *pool);
void ctpu_k_sqdev_ref(const float *x, const float *mean, int64_t outer, int64_t n, int64_t inner,
                      float *y);

/* softmax / log_softmax over the last dim of x [rows, n]:
 *   m = max (reduction order), e_j = exp(x_j - m), s = sum e (reduction order);
 *   softmax_j = e_j / s;  log_softmax_j = (x_j - m) - log(s). */
void ctpu_k_softmax(const float *x, int64_t rows, int64_t n, float *y, bool log, ctpu_k_pool *pool);
void ctpu_k_softmax_ref(const float *x, int64_t rows, int64_t n, float *y, bool log);

/* ---- data movement --------------------------------------------------------
 * Generic strided copy of elements of `esize` bytes: for every index of
 * `shape` (ndim <= 8), dst[sum i*dst_stride] = src[sum i*src_stride]
 * (strides in elements; src strides may be 0 for broadcast). */
void ctpu_k_strided_copy(const void *src, const int64_t *src_strides, void *dst,
                         const int64_t *dst_strides, const int64_t *shape, int ndim, size_t esize);

/* dst[0, n) = src[0, n) with non-temporal stores (past the caches: for a
 * large output the program does not read again); the same bytes as memcpy.
 * ctpu_k_stream_fence orders them (call it before dst is read elsewhere). */
void ctpu_k_stream_f32(float *dst, const float *src, int64_t n);
void ctpu_k_stream_fence(void);

/* Embedding: out[i,:] = w[idx[i],:] for i < n, w [V, D] of esize-byte
 * elements. An index outside [0, V) writes zeros in its row, and the first
 * such (position, value) is returned through *bad_pos / *bad_val; returns the
 * number of bad indices (0 = all good). Never reads out of bounds. */
int64_t ctpu_k_embedding(const void *w, int64_t V, int64_t D, size_t esize, const int32_t *idx,
                         int64_t n, void *out, int64_t *bad_pos, int64_t *bad_val);

/* ---- randomness ------------------------------------------------------------
 * Philox4x32-10 (Salmon et al., SC'11). Element i of a draw with (seed,
 * offset) uses the block counter (offset + i) with key seed and takes words
 * 0 (and 1 for normal). uniform: lo + (hi-lo) * u, u = (w0 >> 8) * 2^-24 in
 * [0,1). normal: Box-Muller, u1 = ((w0>>8)+1) * 2^-24 in (0,1], u2 from w1,
 * z = sqrt(-2 log u1) * cos(2 pi u2), logs and cos from SLEEF purec u10.
 * Depends only on (seed, offset, i): any block or thread split gives the same bits. */
void ctpu_k_philox4x32(uint64_t seed, uint64_t counter, uint32_t out[4]);
/* The bare generator: 4-word counter, 2-word key (ctpu_k_philox4x32 uses
 * counter {lo, hi, 0, 0}, key {seed lo, seed hi}); for known-answer tests. */
void ctpu_k_philox4x32_raw(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* Exactly, in f32 (2^-24 scaling is exact): uniform y = lo + (hi - lo) * u
 * (when lo != 0 the rounded sum can be hi itself);
 * normal y = mean + std * (sqrtf(-2 * logf(u1)) * cosf(6.2831855f * u2)),
 * u2 = (w1 >> 8) * 2^-24. y[j] is element start + j, counter offset+start+j. */
void ctpu_k_rand_uniform(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float lo,
                         float hi, float *y);
void ctpu_k_rand_normal(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float mean,
                        float std, float *y);
/* The references (the scalar variant); the dispatched ones above run the
 * selected ISA's (AVX2 8 lanes, AVX-512 16: Philox vectorised, logf and
 * cosf from SLEEF's non-FMA vector functions), the same bits. */
void ctpu_k_rand_uniform_ref(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float lo,
                             float hi, float *y);
void ctpu_k_rand_normal_ref(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float mean,
                            float std, float *y);
/* Integers: y[j] = low + ((w1 << 32 | w0) mod range), range >= 1 (randint). */
void ctpu_k_rand_int(uint64_t seed, uint64_t offset, int64_t start, int64_t n, int64_t low,
                     uint64_t range, int64_t *y);

/* ---- MXU matmul -------------------------------------------------------------
 * C[b] = A[b] @ B[b] for b < batch; A [M,K], B [K,N], C [M,N].
 * Element (m,k) of A[b] is at a + b*a_bs + m*a_rs + k*a_cs (elements of
 * a_dtype, f32 or bf16); likewise B. So Aᵀ or Bᵀ operands are just other
 * strides (backward needs them without materialised transposes).
 * C is written contiguous with row stride ldc and batch stride c_bs, in
 * c_dtype (f32 or bf16: rounded once from the fp32 accumulator).
 *
 * Numerics (docs/CONTRACTS.md "MXU numerics"), default precision (1 pass):
 *   operands rounded to bf16 (ctpu_f32_to_bf16); products exact in f32;
 *   acc = +0; for p = 0, 1, ...: acc = acc + a[2p+1]*b[2p+1] then
 *   acc = acc + a[2p]*b[2p] (as vdpbf16ps: odd index first), each addition
 *   rounded to f32 (RNE); subnormal inputs are read as zero and a sum whose
 *   rounded value is below 2^-126 is flushed to zero (sign kept). A product
 *   is never rounded or flushed on its own: each step is
 *   acc = FTZ(RNE(acc + a*b)), as measured on this CPU's vdpbf16ps
 *   (mxu.h; tests/test_k_mxu.c probes the instruction). Odd K: the last pair's odd partner is 0.
 *   The order depends only on K. No split-K.
 * HIGH (3 passes) and HIGHEST (6 passes): defined in mxu.h.
 * i32 matmul (a_dtype == b_dtype == I32) is exact in int64 then wrapped.
 *
 * Epilogue (applied to the f32 accumulator before the output rounding, in
 * this order, each step rounded to f32 exactly as the separate op would be):
 *   x scale (if scaled: a mul_scalar), + bias[n] (f32 or bf16 vector, if
 *   bias != NULL), activation, + residual (contiguous [M,N] per batch,
 *   residual_dtype, if residual != NULL), then (softmax != 0) softmax over
 *   each row of the f32 result as ctpu_k_softmax (c f32 only), rounded to
 *   c's dtype: the bits of the separate softmax over the matmul's output. */
typedef enum { CTPU_PREC_DEFAULT = 0, CTPU_PREC_HIGH = 1, CTPU_PREC_HIGHEST = 2, CTPU_PREC_COUNT } ctpu_k_precision;
typedef enum { CTPU_K_ACT_NONE = 0, CTPU_K_ACT_RELU, CTPU_K_ACT_GELU_TANH, CTPU_K_ACT_GELU_ERF } ctpu_k_act;

typedef struct {
    int64_t batch, M, N, K;
    const void *a; int a_dtype; int64_t a_bs, a_rs, a_cs;
    const void *b; int b_dtype; int64_t b_bs, b_rs, b_cs;
    void *c; int c_dtype; int64_t c_bs, ldc;
    ctpu_k_precision precision;
    /* epilogue */
    int scaled; float scale;
    const void *bias; int bias_dtype;
    ctpu_k_act act;
    const void *residual; int residual_dtype; int64_t residual_bs, residual_ld;
    int softmax;
    /* Packed panels shared between calls (defer and fuse; NULL otherwise,
     * and never needed for the bits): operand r (0 A, 1 B) in the layout
     * pre[r] plans, at pre_buf[r], packed there by this call (pre_keep[r])
     * or already by an earlier call that read the same operand, when the
     * plan holds for this call (else packed as always). */
    const struct ctpu_k_prepack *pre[2];
    void *pre_buf[2];
    int pre_keep[2];
} ctpu_mm_args;

/* An operand as the MXU packs it, for calls that read the same one (role 0:
 * their A, 1: their B; X[i,k] = x[bi*bs + i*si + k*sk], I x K, nb batch
 * elements packed (1: broadcast), dtype dt). ctpu_k_mm_prepack_plan fills
 * the layout of a call's shape-only arguments (a, b, c unused) and the
 * micro-kernel in use, or returns 0 when that call would not read such
 * panels (C^T path, more than one pass). Packing is a pure function of the
 * operand's values (bf16 rounding and layout, docs/CONTRACTS.md), so a call's
 * bits are the same whoever packed them; each call checks the plan against
 * itself at run time and packs for itself when it does not hold. Two calls
 * share panels only when their plans are equal (memcmp). */
typedef struct ctpu_k_prepack {
    int role, dt; int64_t si, sk, I, K, nb, bs;    /* the caller's */
    const void *impl; int w, lw;                    /* the plan's: micro-kernel table, panel width, dwords per pair */
    int64_t rs, panels, pd;                         /* A's row layout stride (0 none), panels per batch element, dwords each */
    size_t bytes;                                   /* what pre_buf must hold */
} ctpu_k_prepack;
int ctpu_k_mm_prepack_plan(const ctpu_mm_args *call, ctpu_k_prepack *pp);

void ctpu_k_matmul(const ctpu_mm_args *args, ctpu_k_pool *pool);
void ctpu_k_matmul_ref(const ctpu_mm_args *args);

/* Single-threaded matmul with a caller-owned workspace (grown as needed;
 * free it with ctpu_k_ws_free): the same bits as ctpu_k_matmul. For kernels
 * that call the MXU many times from their own threads (attention), where the
 * one shared cached workspace would be fought over. */
typedef struct { char *p; size_t size; } ctpu_k_ws;
void ctpu_k_matmul_ws(const ctpu_mm_args *args, ctpu_k_ws *ws);
void ctpu_k_ws_free(ctpu_k_ws *ws);

/* ---- blockwise attention (scaled_dot_product_attention) -------------------
 * q [B,H,Tq,D], k and v [B,H,Tk,D], contiguous, all f32 or all bf16; mask
 * element (b,h,i,j) at mask[b*ms[0] + h*ms[1] + i*ms[2] + j*ms[3]] (f32,
 * strides 0 where it broadcasts). The order is the contract (CONTRACTS.md
 * "Attention"): blocks of CTPU_K_ATTN_BLOCK queries x CTPU_K_ATTN_BLOCK keys
 * whatever the ISA, thread count or T; for each (b, h, query block), key
 * blocks in ascending order (a causal key block wholly above the diagonal
 * is skipped), per key block:
 *   S = MXU(Q Kᵀ) (K = D, the precision setting), s = S * scale, then
 *   s += mask (ADD) or s = -inf where mask == 0 (KEEP01), s = -inf where
 *   j > i (causal, top-left aligned as torch's is_causal);
 *   m_new = max(m, max_j s) (NaN propagates); mu = m_new, or 0 if it is -inf;
 *   P = bf16(exp(s - mu)) at default precision (HIGH / HIGHEST: P stays f32,
 *   split into passes by the MXU like any f32 operand); alpha = exp(m - mu);
 *   l = l * alpha + (P's row summed left to right);
 *   with dropout, P_ij is replaced by 0 where u_ij < p (u: the counter RNG's
 *   uniform element ((b*H + h)*Tq + i)*Tk + j of (seed, offset), as
 *   ctpu_rand_uniform over [B,H,Tq,Tk] draws it);
 *   O = O * alpha + MXU(P V) (K = the block's keys);
 * then O = O / (l * (1 - p)) (one division; l == 0, a fully masked row, gives
 * O = 0) and lse = mu + log(l) (-inf when l == 0). exp and log are the ISA's
 * SLEEF u10 (kernels' EXP, LOG); every other step is one f32 operation.
 * Outputs o [B,H,Tq,D] and lse [B,H,Tq], f32. */
#define CTPU_K_ATTN_BLOCK 128
enum { CTPU_K_MASK_NONE = 0, CTPU_K_MASK_ADD = 1, CTPU_K_MASK_KEEP01 = 2 };
/* layout CTPU_K_ATTN_BTHD: q, o, dout, dq and o_in are [B,Tq,H,D], k, v, dk,
 * dv [B,Tk,H,D] (row (b,h,t) at ((b*T + t)*H + h)*D: the projections' own
 * layout, no permute copies); lse stays [B,H,Tq]. The same operations in the
 * same order as on the permuted [B,H,T,D] tensors, so the same bits. */
enum { CTPU_K_ATTN_BHTD = 0, CTPU_K_ATTN_BTHD = 1 };
typedef struct {
    int64_t B, H, Tq, Tk, D;
    int layout;                            /* CTPU_K_ATTN_BHTD or _BTHD */
    const void *q, *k, *v; int dtype;
    const float *mask; int mask_kind; int64_t ms[4];
    bool causal;
    float scale;
    double p; uint64_t seed, offset;      /* dropout; p == 0: none */
    ctpu_k_precision precision;
    float *o, *lse;                        /* forward outputs */
    /* backward: the forward's o and lse, dout [B,H,Tq,D] f32; outputs */
    const float *o_in, *lse_in, *dout;
    float *dq, *dk, *dv;                   /* [B,H,Tq,D], [B,H,Tk,D] x2, f32 */
} ctpu_attn_args;
/* Backward, from the saved lse (P recomputed as exp(s - lse), 0 where lse is
 * -inf), per (b, h): query blocks ascending, within each the key blocks
 * ascending; Dr_i = sum_d dout_id * o_id (left to right); per block:
 *   dV_J += MXU(Pdᵀ dO_I) with Pd = P * z, z = keep/(1-p) in f32 (1: no dropout);
 *   dP = MXU(dO_I V_Jᵀ) * z;  dS = P * (dP - Dr) * scale;
 *   dQ_I += MXU(dS K_J);  dK_J += MXU(dSᵀ Q_I)
 * each += one f32 addition into the f32 accumulator: dK and dV are summed over
 * query blocks in ascending order, never with atomics; threads split (b, h),
 * or, with fewer heads than threads, dQ by (b, h, query block) then dK and dV
 * by (b, h, key block): each sum in one thread, in its one order. */
void ctpu_k_attn_fwd(const ctpu_attn_args *a, ctpu_k_pool *pool);
void ctpu_k_attn_bwd(const ctpu_attn_args *a, ctpu_k_pool *pool);
/* The same with the scalar reference kernels (ctpu_k_matmul_ref,
 * ctpu_k_unary_ref, one thread): the specification the above must equal. */
void ctpu_k_attn_fwd_ref(const ctpu_attn_args *a);
void ctpu_k_attn_bwd_ref(const ctpu_attn_args *a);

/* MAC accounting: useful MACs and MACs after padding M, N, K up to a
 * multiple of the MXU size (per batch element, times batch). */
static inline void ctpu_k_mxu_macs(int64_t batch, int64_t M, int64_t N, int64_t K, int mxu,
                                   uint64_t *useful, uint64_t *padded)
{
    int64_t pm = (M + mxu - 1) / mxu * mxu, pn = (N + mxu - 1) / mxu * mxu,
            pk = (K + mxu - 1) / mxu * mxu;
    *useful = (uint64_t)(batch * M * N * K);
    *padded = (uint64_t)(batch * pm * pn * pk);
}

#endif /* CTPU_KERNELS_H */
