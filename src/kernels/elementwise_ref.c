/* Elementwise block-VM ops and dtype conversions: the plain-C reference
 * (the executable specification, one element at a time) and the dispatch
 * table that ctpu_kernels_set_isa() points at a SIMD variant.
 *
 * x, a, b, c, y: [n] f32, contiguous; y may be the same pointer as an input.
 * Transcendentals: SLEEF's non-FMA purec u10 functions (see kernels.h for the
 * family rule and for the op(s) whose SIMD variants call purec as well). */
#include <math.h>
#include <string.h>
#include <sleef.h>
#include "internal.h"

/* ---- one element ----------------------------------------------------------
 * Each line is the definition in kernels.h, written so that every operation
 * rounds to f32 (no contraction: -ffp-contract=off). */
static inline float ew_max(float a, float b)
{
    if (a != a || b != b) return a + b;   /* a NaN (payload not part of the contract) */
    return a > b ? a : b;
}
static inline float ew_min(float a, float b)
{
    if (a != a || b != b) return a + b;
    return a < b ? a : b;
}
static inline float ew_round_bf16(float x) { return ctpu_bf16_to_f32(ctpu_f32_to_bf16(x)); }

static inline float ew_unary1(ctpu_k_unary_op op, float x)
{
    switch (op) {
    case CTPU_K_U_NEG: return -x;
    case CTPU_K_U_ABS: return fabsf(x);
    case CTPU_K_U_EXP: return Sleef_expf1_u10purec(x);
    case CTPU_K_U_LOG: return Sleef_logf1_u10purec(x);
    case CTPU_K_U_SQRT: return sqrtf(x);
    case CTPU_K_U_RSQRT: return 1.0f / sqrtf(x);
    case CTPU_K_U_TANH: return Sleef_tanhf1_u10purec(x);
    case CTPU_K_U_SIGMOID: return 1.0f / (1.0f + Sleef_expf1_u10purec(-x));
    case CTPU_K_U_RELU: return x > 0.0f ? x : (x != x ? x : 0.0f);
    case CTPU_K_U_GELU_TANH: {
        float x3 = x * x * x;
        float inner = 0.7978845608f * (x + 0.044715f * x3);
        return 0.5f * x * (1.0f + Sleef_tanhf1_u10purec(inner));
    }
    case CTPU_K_U_GELU_ERF: return 0.5f * x * (1.0f + Sleef_erff1_u10purec(x * 0.70710678f));
    case CTPU_K_U_RECIP: return 1.0f / x;
    case CTPU_K_U_SQUARE: return x * x;
    case CTPU_K_U_ROUND_BF16: return ew_round_bf16(x);
    case CTPU_K_U_COUNT: break;
    }
    return x;
}

static inline float ew_binary1(ctpu_k_binary_op op, float a, float b)
{
    switch (op) {
    case CTPU_K_B_ADD: return a + b;
    case CTPU_K_B_SUB: return a - b;
    case CTPU_K_B_MUL: return a * b;
    case CTPU_K_B_DIV: return a / b;
    case CTPU_K_B_POW: return Sleef_powf1_u10purec(a, b);
    case CTPU_K_B_MAX: return ew_max(a, b);
    case CTPU_K_B_MIN: return ew_min(a, b);
    case CTPU_K_B_EQ: return a == b ? 1.0f : 0.0f;
    case CTPU_K_B_NE: return a != b ? 1.0f : 0.0f;
    case CTPU_K_B_LT: return a < b ? 1.0f : 0.0f;
    case CTPU_K_B_LE: return a <= b ? 1.0f : 0.0f;
    case CTPU_K_B_GT: return a > b ? 1.0f : 0.0f;
    case CTPU_K_B_GE: return a >= b ? 1.0f : 0.0f;
    case CTPU_K_B_COUNT: break;
    }
    return a;
}

/* ---- reference kernels ------------------------------------------------------ */
/* One loop per op (the switch on a constant op folds away), so the scalar
 * variant is not paying for a switch per element. */
void ctpu_k_unary_ref(ctpu_k_unary_op op, const float *x, float *y, int64_t n)
{
    switch (op) {
#define X(name)                                                                  \
    case CTPU_K_U_##name:                                                        \
        for (int64_t i = 0; i < n; i++) y[i] = ew_unary1(CTPU_K_U_##name, x[i]); \
        return;
        CTPU_K_UNARY_OPS(X)
#undef X
    case CTPU_K_U_COUNT: break;
    }
}

void ctpu_k_binary_ref(ctpu_k_binary_op op, const float *a, const float *b, float *y, int64_t n)
{
    switch (op) {
#define X(name)                                                                          \
    case CTPU_K_B_##name:                                                                \
        for (int64_t i = 0; i < n; i++) y[i] = ew_binary1(CTPU_K_B_##name, a[i], b[i]); \
        return;
        CTPU_K_BINARY_OPS(X)
#undef X
    case CTPU_K_B_COUNT: break;
    }
}

void ctpu_k_binary_scalar_ref(ctpu_k_binary_op op, const float *a, float s, bool scalar_first,
                              float *y, int64_t n)
{
    switch (op) {
#define X(name)                                                                            \
    case CTPU_K_B_##name:                                                                  \
        if (scalar_first)                                                                  \
            for (int64_t i = 0; i < n; i++) y[i] = ew_binary1(CTPU_K_B_##name, s, a[i]);  \
        else                                                                               \
            for (int64_t i = 0; i < n; i++) y[i] = ew_binary1(CTPU_K_B_##name, a[i], s);  \
        return;
        CTPU_K_BINARY_OPS(X)
#undef X
    case CTPU_K_B_COUNT: break;
    }
}

void ctpu_k_where_ref(const float *c, const float *a, const float *b, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = c[i] != 0.0f ? a[i] : b[i];   /* NaN c: true */
}

void ctpu_k_clamp_ref(const float *x, float lo, float hi, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = ew_min(ew_max(x[i], lo), hi);
}

void ctpu_k_f32_to_bf16_ref(const float *x, uint16_t *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = ctpu_f32_to_bf16(x[i]);
}

static void ew_bf16_to_f32_ref(const uint16_t *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = ctpu_bf16_to_f32(x[i]);
}
static void ew_i32_to_f32_ref(const int32_t *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = (float)x[i];   /* RNE, as cvtdq2ps */
}
static void ew_f32_to_i32_ref(const float *x, int32_t *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] = ctpu_f32_to_i32(x[i]);
}

/* ---- SIMD variants (elementwise_avx2.c, elementwise_avx512.c) ---------------- */
#define EW_VARIANT_DECLS(sfx)                                                                   \
    void ctpu_k_unary_##sfx(ctpu_k_unary_op op, const float *x, float *y, int64_t n);            \
    void ctpu_k_binary_##sfx(ctpu_k_binary_op op, const float *a, const float *b, float *y,      \
                             int64_t n);                                                        \
    void ctpu_k_binary_scalar_##sfx(ctpu_k_binary_op op, const float *a, float s,               \
                                    bool scalar_first, float *y, int64_t n);                    \
    void ctpu_k_where_##sfx(const float *c, const float *a, const float *b, float *y, int64_t n);\
    void ctpu_k_clamp_##sfx(const float *x, float lo, float hi, float *y, int64_t n);            \
    void ctpu_k_bf16_to_f32_##sfx(const uint16_t *x, float *y, int64_t n);                      \
    void ctpu_k_f32_to_bf16_##sfx(const float *x, uint16_t *y, int64_t n);                      \
    void ctpu_k_i32_to_f32_##sfx(const int32_t *x, float *y, int64_t n);                        \
    void ctpu_k_f32_to_i32_##sfx(const float *x, int32_t *y, int64_t n);
EW_VARIANT_DECLS(avx2)
EW_VARIANT_DECLS(avx512)

typedef struct {
    void (*unary)(ctpu_k_unary_op, const float *, float *, int64_t);
    void (*binary)(ctpu_k_binary_op, const float *, const float *, float *, int64_t);
    void (*binary_scalar)(ctpu_k_binary_op, const float *, float, bool, float *, int64_t);
    void (*where)(const float *, const float *, const float *, float *, int64_t);
    void (*clamp)(const float *, float, float, float *, int64_t);
    void (*bf16_to_f32)(const uint16_t *, float *, int64_t);
    void (*f32_to_bf16)(const float *, uint16_t *, int64_t);
    void (*i32_to_f32)(const int32_t *, float *, int64_t);
    void (*f32_to_i32)(const float *, int32_t *, int64_t);
} ew_table;

#define EW_TABLE(sfx)                                                                        \
    { ctpu_k_unary_##sfx, ctpu_k_binary_##sfx, ctpu_k_binary_scalar_##sfx, ctpu_k_where_##sfx, \
      ctpu_k_clamp_##sfx, ctpu_k_bf16_to_f32_##sfx, ctpu_k_f32_to_bf16_##sfx,                  \
      ctpu_k_i32_to_f32_##sfx, ctpu_k_f32_to_i32_##sfx }

static const ew_table ew_tables[CTPU_ISA_COUNT] = {
    [CTPU_ISA_SCALAR] = { ctpu_k_unary_ref, ctpu_k_binary_ref, ctpu_k_binary_scalar_ref,
                          ctpu_k_where_ref, ctpu_k_clamp_ref, ew_bf16_to_f32_ref,
                          ctpu_k_f32_to_bf16_ref, ew_i32_to_f32_ref, ew_f32_to_i32_ref },
    [CTPU_ISA_AVX2] = EW_TABLE(avx2),
    [CTPU_ISA_AVX512] = EW_TABLE(avx512),
};

/* The variant in use: the reference until ctpu_kernels_set_isa() says otherwise. */
static const ew_table *ew_cur = &ew_tables[CTPU_ISA_SCALAR];

void ctpu_k_elementwise_select(ctpu_isa isa)
{
    if ((unsigned)isa < CTPU_ISA_COUNT) ew_cur = &ew_tables[isa];
}

/* ---- dispatched entry points ---------------------------------------------------- */
void ctpu_k_unary(ctpu_k_unary_op op, const float *x, float *y, int64_t n)
{
    ew_cur->unary(op, x, y, n);
}
void ctpu_k_binary(ctpu_k_binary_op op, const float *a, const float *b, float *y, int64_t n)
{
    ew_cur->binary(op, a, b, y, n);
}
void ctpu_k_binary_scalar(ctpu_k_binary_op op, const float *a, float s, bool scalar_first,
                          float *y, int64_t n)
{
    ew_cur->binary_scalar(op, a, s, scalar_first, y, n);
}
void ctpu_k_where(const float *c, const float *a, const float *b, float *y, int64_t n)
{
    ew_cur->where(c, a, b, y, n);
}
void ctpu_k_clamp(const float *x, float lo, float hi, float *y, int64_t n)
{
    ew_cur->clamp(x, lo, hi, y, n);
}
void ctpu_k_bf16_to_f32(const uint16_t *x, float *y, int64_t n) { ew_cur->bf16_to_f32(x, y, n); }
void ctpu_k_f32_to_bf16(const float *x, uint16_t *y, int64_t n) { ew_cur->f32_to_bf16(x, y, n); }
void ctpu_k_i32_to_f32(const int32_t *x, float *y, int64_t n) { ew_cur->i32_to_f32(x, y, n); }
void ctpu_k_f32_to_i32(const float *x, int32_t *y, int64_t n) { ew_cur->f32_to_i32(x, y, n); }
