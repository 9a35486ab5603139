/* Runtime ISA detection and selection of the kernel variant tables
 * (xxHash-style dispatch: each family keeps its own function-pointer table,
 * which starts at the scalar reference; ctpu_kernels_set_isa() repoints all of
 * them at once). */
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

/* The variant in use; the families' tables start at their references, which
 * is what SCALAR selects. */
static ctpu_isa isa_current = CTPU_ISA_SCALAR;

bool ctpu_kernels_set_isa(ctpu_isa isa)
{
    if ((unsigned)isa >= CTPU_ISA_COUNT || !ctpu_k_cpu_has(isa)) return false;
    ctpu_k_elementwise_select(isa);
    ctpu_k_reduce_select(isa);
    ctpu_k_mxu_select(isa);
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
