/* Runtime ISA detection, the table of kernel variants and their selection
 * (xxHash-style dispatch: one function-pointer table per ISA and family, the
 * scalar reference until ctpu_kernels_set_isa() repoints them all at once),
 * and the dispatched elementwise entry points of kernels.h.
 *
 * The elementwise and reduction variants are listed here, in one place: the
 * scalar ones (elementwise_ref.c, reduce_ref.c) and those stamped per ISA
 * from simd_elementwise.h / simd_reduce.h (simd_avx2.c, simd_avx512.c). The
 * MXU family keeps its own table (mxu_ref.c). */
#include <cpuid.h>
#include "internal.h"

/* XCR0 via xgetbv (encoded directly so this file needs no -mxsave). */
static uint64_t isa_xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* What the CPU and the OS (saved register state) support, bit by bit. */
typedef struct { bool avx2, avx512; } isa_caps;

static isa_caps isa_probe(void)
{
    isa_caps c = { false, false };
    unsigned a, b, cx, d;
    if (!__get_cpuid(1, &a, &b, &cx, &d)) return c;
    bool osxsave = cx & (1u << 27), avx = cx & (1u << 28), fma = cx & (1u << 12),
         f16c = cx & (1u << 29);
    if (!osxsave || !avx) return c;
    uint64_t xcr0 = isa_xgetbv0();
    bool os_ymm = (xcr0 & 0x6) == 0x6;              /* XMM + YMM state */
    bool os_zmm = (xcr0 & 0xe6) == 0xe6;            /* + opmask, ZMM_Hi256, Hi16_ZMM */
    if (__get_cpuid_max(0, NULL) < 7) return c;
    __cpuid_count(7, 0, a, b, cx, d);
    bool avx2 = b & (1u << 5), f = b & (1u << 16), dq = b & (1u << 17), bw = b & (1u << 30),
         vl = b & (1u << 31);
    unsigned max7 = a;
    bool bf16 = false;
    if (max7 >= 1) {
        __cpuid_count(7, 1, a, b, cx, d);
        bf16 = a & (1u << 5);                       /* AVX512_BF16 */
    }
    c.avx2 = os_ymm && avx2 && fma && f16c;
    c.avx512 = c.avx2 && os_zmm && f && bw && dq && vl && bf16;
    return c;
}

bool ctpu_k_cpu_has(ctpu_isa isa)
{
    switch (isa) {
    case CTPU_ISA_SCALAR: return true;
    case CTPU_ISA_AVX2: return isa_probe().avx2;
    case CTPU_ISA_AVX512: return isa_probe().avx512;
    case CTPU_ISA_COUNT: break;
    }
    return false;
}

ctpu_isa ctpu_isa_detect(void)
{
    isa_caps c = isa_probe();
    return c.avx512 ? CTPU_ISA_AVX512 : c.avx2 ? CTPU_ISA_AVX2 : CTPU_ISA_SCALAR;
}

/* ---- the variants ---------------------------------------------------------------- */
static const ctpu_k_ew_variant *const ew_variants[CTPU_ISA_COUNT] = {
    [CTPU_ISA_SCALAR] = &ctpu_k_ew_scalar,
#define X(E, s) [CTPU_ISA_##E] = &ctpu_k_ew_##s,
    CTPU_K_SIMD_ISAS(X)
#undef X
};
static const ctpu_k_red_variant *const red_variants[CTPU_ISA_COUNT] = {
    [CTPU_ISA_SCALAR] = &ctpu_k_red_scalar,
#define X(E, s) [CTPU_ISA_##E] = &ctpu_k_red_##s,
    CTPU_K_SIMD_ISAS(X)
#undef X
};

const ctpu_k_ew_variant *ctpu_k_ew_variant_of(ctpu_isa isa)
{
    return (unsigned)isa < CTPU_ISA_COUNT ? ew_variants[isa] : NULL;
}
const ctpu_k_red_variant *ctpu_k_red_variant_of(ctpu_isa isa)
{
    return (unsigned)isa < CTPU_ISA_COUNT ? red_variants[isa] : NULL;
}

/* The variants in use: the scalar ones until a select says otherwise. */
static ctpu_isa isa_current = CTPU_ISA_SCALAR;
static const ctpu_k_ew_variant *ew_cur = &ctpu_k_ew_scalar;
static const ctpu_k_red_variant *red_cur = &ctpu_k_red_scalar;

void ctpu_k_elementwise_select(ctpu_isa isa)
{
    if ((unsigned)isa < CTPU_ISA_COUNT) ew_cur = ew_variants[isa];
}
void ctpu_k_reduce_select(ctpu_isa isa)
{
    if ((unsigned)isa < CTPU_ISA_COUNT) red_cur = red_variants[isa];
}
const ctpu_k_red_variant *ctpu_k_red_current(void) { return red_cur; }

bool ctpu_kernels_set_isa(ctpu_isa isa)
{
    if ((unsigned)isa >= CTPU_ISA_COUNT || !ctpu_k_cpu_has(isa)) return false;
    ctpu_k_elementwise_select(isa);
    ctpu_k_reduce_select(isa);
    ctpu_k_mxu_select(isa);
    ctpu_k_rand_select(isa);
    isa_current = isa;
    return true;
}

ctpu_isa ctpu_kernels_isa(void) { return isa_current; }

const char *ctpu_isa_name(ctpu_isa isa)
{
    switch (isa) {
    case CTPU_ISA_SCALAR: return "scalar";
    case CTPU_ISA_AVX2: return "avx2";
    case CTPU_ISA_AVX512: return "avx512";
    case CTPU_ISA_COUNT: break;
    }
    return "unknown";
}

/* ---- dispatched elementwise entry points (kernels.h) ------------------------------ */
void ctpu_k_unary(ctpu_k_unary_op op, const float *x, float *y, int64_t n)
{
    if ((unsigned)op < CTPU_K_U_COUNT) ew_cur->unary[op](x, y, n);
}
void ctpu_k_binary(ctpu_k_binary_op op, const float *a, const float *b, float *y, int64_t n)
{
    if ((unsigned)op < CTPU_K_B_COUNT) ew_cur->binary[op](a, b, y, n);
}
void ctpu_k_binary_scalar(ctpu_k_binary_op op, const float *a, float s, bool scalar_first,
                          float *y, int64_t n)
{
    if ((unsigned)op >= CTPU_K_B_COUNT) return;
    (scalar_first ? ew_cur->binary_sa : ew_cur->binary_as)[op](a, s, y, n);
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
bool ctpu_k_tape(const ctpu_k_tape_ins *ins, int n_ins, float *const *val, const ctpu_k_tape_out *out, int64_t n)
{
    if (!ew_cur->tape) return false;
    ew_cur->tape(ins, n_ins, val, out, n);
    return true;
}
