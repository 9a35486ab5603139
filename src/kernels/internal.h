/* Internal to src/kernels: the variant tables of the elementwise and
 * reduction families and their selection.
 *
 * One variant per ISA (ctpu_isa). The scalar one is written in elementwise_ref.c
 * and reduce_ref.c; the SIMD ones are stamped from the drivers
 * simd_elementwise.h and simd_reduce.h by each ISA file (simd_avx2.c,
 * simd_avx512.c: the per-ISA primitives only). A variant's elementwise table
 * holds one loop per kernel op (CTPU_K_UNARY_OPS / CTPU_K_BINARY_OPS), built
 * from that X-macro, so an op without its primitive does not build, and
 * nothing falls back to the reference. isa.c holds the table of variants and
 * points every family at one of them (xxHash-style dispatch); the MXU family
 * keeps its own selection (mxu.c). */
#ifndef CTPU_KERNELS_INTERNAL_H
#define CTPU_KERNELS_INTERNAL_H
#include "kernels.h"

/* ISAs with a stamped SIMD variant: X(ENUM suffix of ctpu_isa, symbol suffix). */
#define CTPU_K_SIMD_ISAS(X) X(AVX2, avx2) X(AVX512, avx512)

typedef void (*ctpu_k_unary_loop)(const float *x, float *y, int64_t n);
typedef void (*ctpu_k_binary_loop)(const float *a, const float *b, float *y, int64_t n);
/* a op s (binary_as) or s op a (binary_sa), s broadcast. */
typedef void (*ctpu_k_binary_s_loop)(const float *a, float s, float *y, int64_t n);

typedef struct {
    ctpu_k_unary_loop unary[CTPU_K_U_COUNT];
    ctpu_k_binary_loop binary[CTPU_K_B_COUNT];
    ctpu_k_binary_s_loop binary_as[CTPU_K_B_COUNT], binary_sa[CTPU_K_B_COUNT];
    void (*where)(const float *c, const float *a, const float *b, float *y, int64_t n);
    void (*clamp)(const float *x, float lo, float hi, float *y, int64_t n);
    void (*bf16_to_f32)(const uint16_t *x, float *y, int64_t n);
    void (*f32_to_bf16)(const float *x, uint16_t *y, int64_t n);
    void (*i32_to_f32)(const int32_t *x, float *y, int64_t n);
    void (*f32_to_i32)(const float *x, int32_t *y, int64_t n);
    /* ctpu_k_tape (NULL: the variant has none) */
    void (*tape)(const ctpu_k_tape_ins *ins, int n_ins, float *const *val, const ctpu_k_tape_out *out, int64_t n);
} ctpu_k_ew_variant;

/* Reduction element kinds beyond ctpu_k_red_op: SQDEV sums (x - c)^2, EXPSUM
 * sums exp(x - c) (softmax's denominator; scalar only). Both combine with +. */
enum { CTPU_K_RED_SQDEV = CTPU_K_RED_COUNT, CTPU_K_RED_EXPSUM };

/* Column kernels of a reduction variant (the threaded driver in reduce_ref.c
 * calls them). op: ctpu_k_red_op or CTPU_K_RED_SQDEV (c / cv: the mean).
 * rows1: `rows` whole contiguous columns (inner == 1, n > 0) of length n,
 * y[r] = reduction of x[r*n ..]; col1: one contiguous column x[0..n); colv:
 * ncols columns x[j*inner + c], c < ncols (any number, each computed alone,
 * out[c] its value; the driver passes up to 16 when a column is split into
 * blocks, up to 4096 when whole; the SIMD variants sweep up to 128 of
 * them down the rows at once, each row read contiguously). col1 and colv give the tree node
 * over the aligned chunk range [k0, k1) (k0 a multiple of a power of two
 * B >= k1 - k0), NaN propagated for max/min. softmax_row: one row of n > 0
 * elements (y == x allowed). */
typedef struct {
    void (*rows1)(int op, const float *x, const float *c, int64_t n, int64_t rows, float *y);
    float (*col1)(int op, const float *x, float c, int64_t n, int64_t k0, int64_t k1);
    void (*colv)(int op, const float *x, const float *cv, int64_t n, int64_t inner, int ncols,
                 int64_t k0, int64_t k1, float *out);
    void (*softmax_row)(const float *x, int64_t n, float *y, bool log);
} ctpu_k_red_variant;

extern const ctpu_k_ew_variant ctpu_k_ew_scalar;
extern const ctpu_k_red_variant ctpu_k_red_scalar;
#define X(E, s)                                                 \
    extern const ctpu_k_ew_variant ctpu_k_ew_##s;               \
    extern const ctpu_k_red_variant ctpu_k_red_##s;
CTPU_K_SIMD_ISAS(X)
#undef X

/* The random kernels (kernels.h "randomness"): the reference (random.c) and
 * one per SIMD ISA (random_avx2.c, random_avx512.c, from simd_random.h). */
typedef struct {
    void (*uniform)(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float lo, float hi, float *y);
    void (*normal)(uint64_t seed, uint64_t offset, int64_t start, int64_t n, float mean, float std, float *y);
    /* For the tests: over every input the normal kernel gives them (u = k *
     * 2^-24: log at k in [1, 2^24], cos of 6.2831855f * u at k in [0, 2^24)),
     * how many of this ISA's SLEEF logf / cosf results differ from purec's
     * (NULL for the reference). */
    int64_t (*domain_mismatches)(void);
} ctpu_k_rand_variant;
extern const ctpu_k_rand_variant ctpu_k_rand_scalar;
#define X(E, s) extern const ctpu_k_rand_variant ctpu_k_rand_##s;
CTPU_K_SIMD_ISAS(X)
#undef X
const ctpu_k_rand_variant *ctpu_k_rand_variant_of(ctpu_isa isa);   /* random.c */

/* The attention kernels built with each SIMD ISA's flags (attention.c,
 * through attention_avx2.c / attention_avx512.c); ctpu_k_attn_fwd / _bwd
 * call the current ISA's. */
#define X(E, s)                                                                 \
    void ctpu_k_attn_fwd_##s(const ctpu_attn_args *a, ctpu_k_pool *pool);     \
    void ctpu_k_attn_bwd_##s(const ctpu_attn_args *a, ctpu_k_pool *pool);
CTPU_K_SIMD_ISAS(X)
#undef X
void ctpu_k_rand_select(ctpu_isa isa);                              /* random.c */

/* isa.c: the variants by ISA (NULL for none), and the ones in use. */
const ctpu_k_ew_variant *ctpu_k_ew_variant_of(ctpu_isa isa);
const ctpu_k_red_variant *ctpu_k_red_variant_of(ctpu_isa isa);
const ctpu_k_red_variant *ctpu_k_red_current(void);

/* Per-family selection (ctpu_kernels_set_isa calls all of them; tests may
 * select one family alone). A variant the CPU lacks must not be selected. */
void ctpu_k_elementwise_select(ctpu_isa isa);   /* isa.c */
void ctpu_k_reduce_select(ctpu_isa isa);        /* isa.c */
void ctpu_k_mxu_select(ctpu_isa isa);           /* mxu_ref.c */
bool ctpu_k_cpu_has(ctpu_isa isa);              /* isa.c */

#endif
