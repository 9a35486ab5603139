/* Elementwise block-VM ops and dtype conversions: the plain-C reference
 * (the executable specification, one element at a time), which is also the
 * CTPU_ISA_SCALAR variant (isa.c holds the table of variants; the SIMD ones
 * are stamped from simd_elementwise.h).
 *
 * x, a, b, c, y: [n] f32, contiguous; y may be the same pointer as an input.
 * Transcendentals: SLEEF's non-FMA purec u10 functions (see kernels.h for the
 * family rule and for the op(s) whose SIMD variants call purec as well). */
#include <math.h>
#include <stdlib.h>
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

/* The unary ops (one function per op of CTPU_K_UNARY_OPS: the tables below
 * are built from the X-macro, so an op without its ref_u_ does not build). */
static inline float ref_u_NEG(float x) { return -x; }
static inline float ref_u_ABS(float x) { return fabsf(x); }
static inline float ref_u_EXP(float x) { return Sleef_expf1_u10purec(x); }
static inline float ref_u_LOG(float x) { return Sleef_logf1_u10purec(x); }
static inline float ref_u_SQRT(float x) { return sqrtf(x); }
static inline float ref_u_RSQRT(float x) { return 1.0f / sqrtf(x); }
/* TANH in double (kernels.h): expm1 of the reduced 2|x| by Horner, 2^k by
 * its exponent bits, one division, one rounding; simd_avx2.c / simd_avx512.c
 * do the same double operations per lane. */
static inline float ref_u_TANH(float x)
{
    if (x != x) return x + x;
    double y = fabs((double)x);
    y = y < 10.0 ? y : 10.0;
    double u = y + y;
    double kd = (u * CTPU_K_TANH_INV_LN2 + CTPU_K_TANH_SHIFT) - CTPU_K_TANH_SHIFT;
    double r = (u - kd * CTPU_K_TANH_LN2_HI) - kd * CTPU_K_TANH_LN2_LO;
    double p = r * (1.0 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (1.0 / 720 +
               r * (1.0 / 5040 + r * (1.0 / 40320 + r * (1.0 / 362880)))))))));
    uint64_t sb = (uint64_t)((int64_t)kd + 1023) << 52;
    double s;
    memcpy(&s, &sb, sizeof s);
    double sp = s * p;
    return copysignf((float)(((s - 1.0) + sp) / ((s + 1.0) + sp)), x);
}
static inline float ref_u_SIGMOID(float x) { return 1.0f / (1.0f + Sleef_expf1_u10purec(-x)); }
static inline float ref_u_RELU(float x) { return x > 0.0f ? x : (x != x ? x : 0.0f); }
static inline float ref_u_GELU_TANH(float x)
{
    float x3 = x * x * x;
    float inner = 0.7978845608f * (x + 0.044715f * x3);
    return 0.5f * x * (1.0f + ref_u_TANH(inner));
}
/* exact GELU in double (kernels.h): erfc(|x| / sqrt 2) as the erfcx
 * polynomial times exp(-u^2), phi from it, one rounding; simd_avx2.c /
 * simd_avx512.c do the same double operations per lane. */
static const double ew_gelu_c[CTPU_K_GELU_NC] = { CTPU_K_GELU_ERFCX_COEFFS };
static const double ew_exp_c[12] = { CTPU_K_GELU_EXP_COEFFS };
static inline float ref_u_GELU_ERF(float x)
{
    double xd = (double)x, u = fabs(xd) * CTPU_K_GELU_INV_SQRT2;
    double s = ((u - 3.0) / (u + 3.0) - CTPU_K_GELU_TC) * CTPU_K_GELU_INV_TH;
    double p = ew_gelu_c[CTPU_K_GELU_NC - 1];
    for (int i = CTPU_K_GELU_NC - 2; i >= 0; i--) p = ew_gelu_c[i] + s * p;
    double uc = u < CTPU_K_GELU_U_MAX ? u : CTPU_K_GELU_U_MAX, v = uc * uc;
    double kd = (v * CTPU_K_TANH_INV_LN2 + CTPU_K_TANH_SHIFT) - CTPU_K_TANH_SHIFT;
    double w = -((v - kd * CTPU_K_TANH_LN2_HI) - kd * CTPU_K_TANH_LN2_LO);
    double q = ew_exp_c[11];
    for (int i = 10; i >= 0; i--) q = ew_exp_c[i] + w * q;
    uint64_t sb = (uint64_t)(1023 - (int64_t)kd) << 52;
    double s2;
    memcpy(&s2, &sb, sizeof s2);
    double e = u < CTPU_K_GELU_U_MAX ? (p * q) * s2 : 0.0, h = 0.5 * e;
    return (float)(xd * (xd < 0.0 ? h : 1.0 - h));
}
static inline float ref_u_RECIP(float x) { return 1.0f / x; }
static inline float ref_u_SQUARE(float x) { return x * x; }
static inline float ref_u_ROUND_BF16(float x) { return ew_round_bf16(x); }
static inline float ref_u_ERF(float x) { return Sleef_erff1_u10purec(x); }
static inline float ref_u_SIN(float x) { return (float)Sleef_sind1_u10purec((double)x); }
static inline float ref_u_COS(float x) { return (float)Sleef_cosd1_u10purec((double)x); }
/* SLEEF's log1pf overflows above 1e38; log(x) equals log1p(x) in f32 there */
static inline float ref_u_LOG1P(float x) { return x > 1e38f ? Sleef_logf1_u10purec(x) : Sleef_log1pf1_u10purec(x); }
static inline float ref_u_EXPM1(float x) { return Sleef_expm1f1_u10purec(x); }
static inline float ref_u_SOFTPLUS(float x)
{
    return x > 20.0f ? x : Sleef_log1pf1_u10purec(Sleef_expf1_u10purec(x));
}

/* The binary ops (one function per op of CTPU_K_BINARY_OPS). */
static inline float ref_b_ADD(float a, float b) { return a + b; }
static inline float ref_b_SUB(float a, float b) { return a - b; }
static inline float ref_b_MUL(float a, float b) { return a * b; }
static inline float ref_b_DIV(float a, float b) { return a / b; }
static inline float ref_b_POW(float a, float b) { return Sleef_powf1_u10purec(a, b); }
static inline float ref_b_MAX(float a, float b) { return ew_max(a, b); }
static inline float ref_b_MIN(float a, float b) { return ew_min(a, b); }
static inline float ref_b_EQ(float a, float b) { return a == b ? 1.0f : 0.0f; }
static inline float ref_b_NE(float a, float b) { return a != b ? 1.0f : 0.0f; }
static inline float ref_b_LT(float a, float b) { return a < b ? 1.0f : 0.0f; }
static inline float ref_b_LE(float a, float b) { return a <= b ? 1.0f : 0.0f; }
static inline float ref_b_GT(float a, float b) { return a > b ? 1.0f : 0.0f; }
static inline float ref_b_GE(float a, float b) { return a >= b ? 1.0f : 0.0f; }

/* One loop per op, so the scalar variant pays for no switch per element. */
#define REF_UNARY_LOOP(NAME)                                                                \
    static void ref_loop_u_##NAME(const float *x, float *y, int64_t n)                      \
    {                                                                                       \
        for (int64_t i = 0; i < n; i++) y[i] = ref_u_##NAME(x[i]);                          \
    }
#define REF_BINARY_LOOPS(NAME)                                                              \
    static void ref_loop_b_##NAME(const float *a, const float *b, float *y, int64_t n)      \
    {                                                                                       \
        for (int64_t i = 0; i < n; i++) y[i] = ref_b_##NAME(a[i], b[i]);                    \
    }                                                                                       \
    static void ref_loop_as_##NAME(const float *a, float s, float *y, int64_t n)            \
    {                                                                                       \
        for (int64_t i = 0; i < n; i++) y[i] = ref_b_##NAME(a[i], s);                       \
    }                                                                                       \
    static void ref_loop_sa_##NAME(const float *a, float s, float *y, int64_t n)            \
    {                                                                                       \
        for (int64_t i = 0; i < n; i++) y[i] = ref_b_##NAME(s, a[i]);                       \
    }
CTPU_K_UNARY_OPS(REF_UNARY_LOOP)
CTPU_K_BINARY_OPS(REF_BINARY_LOOPS)

/* ---- reference kernels ------------------------------------------------------ */
void ctpu_k_unary_ref(ctpu_k_unary_op op, const float *x, float *y, int64_t n)
{
    if ((unsigned)op < CTPU_K_U_COUNT) ctpu_k_ew_scalar.unary[op](x, y, n);
}

void ctpu_k_binary_ref(ctpu_k_binary_op op, const float *a, const float *b, float *y, int64_t n)
{
    if ((unsigned)op < CTPU_K_B_COUNT) ctpu_k_ew_scalar.binary[op](a, b, y, n);
}

void ctpu_k_binary_scalar_ref(ctpu_k_binary_op op, const float *a, float s, bool scalar_first,
                              float *y, int64_t n)
{
    if ((unsigned)op >= CTPU_K_B_COUNT) return;
    (scalar_first ? ctpu_k_ew_scalar.binary_sa : ctpu_k_ew_scalar.binary_as)[op](a, s, y, n);
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

/* ---- the scalar variant (isa.c's CTPU_ISA_SCALAR) ----------------------------- */
const ctpu_k_ew_variant ctpu_k_ew_scalar = {
#define X(NAME) [CTPU_K_U_##NAME] = ref_loop_u_##NAME,
    .unary = { CTPU_K_UNARY_OPS(X) },
#undef X
#define X(NAME) [CTPU_K_B_##NAME] = ref_loop_b_##NAME,
    .binary = { CTPU_K_BINARY_OPS(X) },
#undef X
#define X(NAME) [CTPU_K_B_##NAME] = ref_loop_as_##NAME,
    .binary_as = { CTPU_K_BINARY_OPS(X) },
#undef X
#define X(NAME) [CTPU_K_B_##NAME] = ref_loop_sa_##NAME,
    .binary_sa = { CTPU_K_BINARY_OPS(X) },
#undef X
    .where = ctpu_k_where_ref,
    .clamp = ctpu_k_clamp_ref,
    .bf16_to_f32 = ew_bf16_to_f32_ref,
    .f32_to_bf16 = ctpu_k_f32_to_bf16_ref,
    .i32_to_f32 = ew_i32_to_f32_ref,
    .f32_to_i32 = ew_f32_to_i32_ref,
};

/* ---- the tape's definition (kernels.h ctpu_k_tape_ref) ------------------------- */
bool ctpu_k_tape_ref(const ctpu_k_tape_ins *ins, int n_ins, float *const *val, const ctpu_k_tape_out *out,
                     int64_t n)
{
    size_t bytes = sizeof(float) * (size_t)(n > 0 ? n : 1);
    float *prev = malloc(bytes), *cur = malloc(bytes);
    if (!prev || !cur) {
        free(prev);
        free(cur);
        return false;
    }
    for (int q = 0; q < n_ins && q < 256; q++) {
        const ctpu_k_tape_ins *in = &ins[q];
        const float *a = in->a < 0 ? prev : val[in->a];
        const float *b = in->b < 0 ? prev : val[in->b];
        const float *c = in->c < 0 ? prev : val[in->c];
        switch (in->kind) {
        case CTPU_K_T_UNARY: ctpu_k_unary_ref((ctpu_k_unary_op)in->kop, a, cur, n); break;
        case CTPU_K_T_BINARY: ctpu_k_binary_ref((ctpu_k_binary_op)in->kop, a, b, cur, n); break;
        case CTPU_K_T_AS:
        case CTPU_K_T_SA:
            ctpu_k_binary_scalar_ref((ctpu_k_binary_op)in->kop, a, in->s0, in->kind == CTPU_K_T_SA, cur, n);
            break;
        case CTPU_K_T_WHERE: ctpu_k_where_ref(a, b, c, cur, n); break;
        case CTPU_K_T_CLAMP: ctpu_k_clamp_ref(a, in->s0, in->s1, cur, n); break;
        case CTPU_K_T_FILL: for (int64_t i = 0; i < n; i++) cur[i] = in->s0; break;
        default: memcpy(cur, a, sizeof(float) * (size_t)n); break;
        }
        if (in->round_bf16) ctpu_k_unary_ref(CTPU_K_U_ROUND_BF16, cur, cur, n);
        if (in->dst >= 0) memcpy(val[in->dst], cur, sizeof(float) * (size_t)n);
        if (in->out >= 0) {
            const ctpu_k_tape_out *o = &out[in->out];
            if (o->kind == CTPU_K_TO_BF16) ctpu_k_f32_to_bf16_ref(cur, o->p, n);
            else memcpy(o->p, cur, sizeof(float) * (size_t)n);
        }
        float *t = prev;
        prev = cur;
        cur = t;
    }
    free(prev);
    free(cur);
    return true;
}
