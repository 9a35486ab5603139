/* MXU matmul: the specification (ctpu_k_matmul_ref), the scalar micro-kernel
 * and the variant table selection. Numerics and pass order: mxu.h. */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include "mxu.h"

static void mm_store(void *c, int dt, int64_t off, float v)
{
    if (dt == CTPU_KDT_BF16) ((uint16_t *)c)[off] = ctpu_f32_to_bf16(v);
    else ((float *)c)[off] = v;
}

static ctpu_k_unary_op mm_act_op(ctpu_k_act act)
{
    return act == CTPU_K_ACT_RELU ? CTPU_K_U_RELU
         : act == CTPU_K_ACT_GELU_TANH ? CTPU_K_U_GELU_TANH : CTPU_K_U_GELU_ERF;
}

/* i32 @ i32: exact sum in (wrapping) 64-bit integers, wrapped to 32 bits. */
static void mm_ref_i32(const ctpu_mm_args *g)
{
    const int32_t *a = g->a, *b = g->b;
    int32_t *c = g->c;
    for (int64_t bi = 0; bi < g->batch; bi++)
        for (int64_t m = 0; m < g->M; m++)
            for (int64_t n = 0; n < g->N; n++) {
                uint64_t s = 0;
                for (int64_t k = 0; k < g->K; k++)
                    s += (uint64_t)((int64_t)a[bi * g->a_bs + m * g->a_rs + k * g->a_cs] *
                                    (int64_t)b[bi * g->b_bs + k * g->b_rs + n * g->b_cs]);
                c[bi * g->c_bs + m * g->ldc + n] = (int32_t)(uint32_t)s;
            }
}

/* a: [batch][M,K] strided, b: [batch][K,N] strided, c: [batch][M,N] (ldc, c_bs).
 * Written as the definition: one element at a time, passes and pairs in the
 * order of mxu.h, then the epilogue as the separate ops would compute it. */
void ctpu_k_matmul_ref(const ctpu_mm_args *g)
{
    if (g->a_dtype == CTPU_KDT_I32) { mm_ref_i32(g); return; }
    int np = ctpu_mxu_npass[g->precision];
    int64_t kh = ctpu_mxu_kh(g->K);
    for (int64_t bi = 0; bi < g->batch; bi++)
        for (int64_t m = 0; m < g->M; m++)
            for (int64_t n = 0; n < g->N; n++) {
                float acc = 0.0f;
                for (int ps = 0; ps < np; ps++) {
                    int sa = ctpu_mxu_pass_a[g->precision][ps], sb = ctpu_mxu_pass_b[g->precision][ps];
                    for (int64_t p = 0; p < kh; p++) {
                        float a1 = 0.0f, b1 = 0.0f;
                        int64_t k0 = 2 * p, k1 = 2 * p + 1;
                        if (k1 < g->K) {
                            a1 = ctpu_bf16_to_f32(ctpu_mxu_part(ctpu_mxu_load(
                                g->a, g->a_dtype, bi * g->a_bs + m * g->a_rs + k1 * g->a_cs), sa));
                            b1 = ctpu_bf16_to_f32(ctpu_mxu_part(ctpu_mxu_load(
                                g->b, g->b_dtype, bi * g->b_bs + k1 * g->b_rs + n * g->b_cs), sb));
                        }
                        float a0 = ctpu_bf16_to_f32(ctpu_mxu_part(ctpu_mxu_load(
                            g->a, g->a_dtype, bi * g->a_bs + m * g->a_rs + k0 * g->a_cs), sa));
                        float b0 = ctpu_bf16_to_f32(ctpu_mxu_part(ctpu_mxu_load(
                            g->b, g->b_dtype, bi * g->b_bs + k0 * g->b_rs + n * g->b_cs), sb));
                        acc = ctpu_mxu_step_ref(acc, a1, b1);
                        acc = ctpu_mxu_step_ref(acc, a0, b0);
                    }
                }
                float v = acc;
                if (g->scaled) v = v * g->scale;
                if (g->bias) v = v + ctpu_mxu_load(g->bias, g->bias_dtype, n);
                if (g->act != CTPU_K_ACT_NONE) ctpu_k_unary_ref(mm_act_op(g->act), &v, &v, 1);
                if (g->residual)
                    v = v + ctpu_mxu_load(g->residual, g->residual_dtype,
                                          bi * g->residual_bs + m * g->residual_ld + n);
                mm_store(g->c, g->c_dtype, bi * g->c_bs + m * g->ldc + n, v);
            }
    if (g->softmax && g->c_dtype == CTPU_KDT_F32)   /* each finished row, in place */
        for (int64_t bi = 0; bi < g->batch; bi++)
            for (int64_t m = 0; m < g->M; m++) {
                float *row = (float *)g->c + bi * g->c_bs + m * g->ldc;
                ctpu_k_softmax_ref(row, 1, g->N, row, false);
            }
}

/* Scalar micro-kernel on the packed layout (the SCALAR variant). */
#define REF_MR 4
#define REF_NR 8
static void mxu_kernel_ref(int64_t kp, const uint32_t *a, const uint32_t *b, float *c,
                           int64_t ldc, int load)
{
    float acc[REF_MR][REF_NR];
    for (int r = 0; r < REF_MR; r++)
        for (int j = 0; j < REF_NR; j++) acc[r][j] = load ? c[r * ldc + j] : 0.0f;
    for (int64_t p = 0; p < kp; p++)
        for (int r = 0; r < REF_MR; r++) {
            uint32_t ad = a[p * REF_MR + r];
            float a0 = ctpu_bf16_to_f32((uint16_t)ad), a1 = ctpu_bf16_to_f32((uint16_t)(ad >> 16));
            for (int j = 0; j < REF_NR; j++) {
                uint32_t bd = b[p * REF_NR + j];
                float b0 = ctpu_bf16_to_f32((uint16_t)bd), b1 = ctpu_bf16_to_f32((uint16_t)(bd >> 16));
                acc[r][j] = ctpu_mxu_step_ref(acc[r][j], a1, b1);
                acc[r][j] = ctpu_mxu_step_ref(acc[r][j], a0, b0);
            }
        }
    for (int r = 0; r < REF_MR; r++)
        for (int j = 0; j < REF_NR; j++) c[r * ldc + j] = acc[r][j];
}

static void mxu_pack_ref(const ctpu_mxu_pack_args *pa, int64_t q0, int64_t q1)
{
    ctpu_mxu_pack_generic(pa, q0, q1);
}

const ctpu_mxu_impl ctpu_mxu_impl_ref = {
    .name = "scalar", .mr = REF_MR, .nr = REF_NR, .kernel = mxu_kernel_ref,
    .kernel_rows = NULL, .pack = mxu_pack_ref,
};

/* The variant table in use: the reference until ctpu_k_mxu_select. */
static const ctpu_mxu_impl *mxu_cur = &ctpu_mxu_impl_ref;

static const ctpu_mxu_impl *mxu_forced = NULL;

const ctpu_mxu_impl *ctpu_mxu_current(void) { return mxu_forced ? mxu_forced : mxu_cur; }
void ctpu_mxu_force_impl(const ctpu_mxu_impl *im) { mxu_forced = im; }

/* ---- the AVX-512 micro-kernel: chosen by a calibrated probe ----------------
 * Which of vfmadd231ps (2 per K pair) and vdpbf16ps (1 per K pair) is faster
 * depends on the CPU (Sapphire Rapids: FMA 2x; Zen 4: vdpbf16ps 2x), and the
 * CPU of a machine class can change: time both micro-kernels, on the same
 * L1-resident tile, alternately for MXU_PROBE_ROUNDS rounds of
 * MXU_PROBE_SLICE seconds of this thread's CPU time each (so a preemption
 * neither decides nor stretches the work; the best round of each counts),
 * once per process: 2.4 ms of CPU in all, fewer rounds if the wall clock
 * passes MXU_PROBE_WALL. Both give the same bits (tests/test_k_mxu.c), so the
 * choice changes only speed. */
#define MXU_PROBE_KP 64
#define MXU_PROBE_ROUNDS 3
#define MXU_PROBE_SLICE 4e-4
#define MXU_PROBE_WALL 4e-3

static double mxu_clock(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* FLOP/s of im's micro-kernel for about `slice` seconds of CPU time. */
static double mxu_probe_rate(const ctpu_mxu_impl *im, const uint32_t *a, const uint32_t *b, float *c,
                             double slice)
{
    double flop = 4.0 * MXU_PROBE_KP * im->mr * im->nr;    /* 2 MACs per pair */
    long n = 0;
    double t0 = mxu_clock(CLOCK_THREAD_CPUTIME_ID), t;
    do {
        for (int i = 0; i < 32; i++) im->kernel(MXU_PROBE_KP, a, b, c, im->nr, 1);
        n += 32;
        t = mxu_clock(CLOCK_THREAD_CPUTIME_ID) - t0;
    } while (t < slice);
    return (double)n * flop / t;
}

static ctpu_mxu_probe_info mxu_probe;
static _Atomic int mxu_probed;

static const ctpu_mxu_impl *mxu_choose_avx512(void)
{
    if (atomic_load(&mxu_probed)) return mxu_probe.chosen;
    const ctpu_mxu_impl *cand[2] = { &ctpu_mxu_impl_avx512, &ctpu_mxu_impl_avx512_dp };
    ctpu_mxu_probe_info info = { 0 };
    /* planar is the larger layout: 2 f32 per pair and row */
    size_t an = 2 * MXU_PROBE_KP * 16, bn = 2 * MXU_PROBE_KP * 64;
    uint32_t *a = aligned_alloc(64, (an + bn) * 4 + 64 * 64 * 4);
    if (!a) return &ctpu_mxu_impl_avx512;
    uint32_t *b = a + an;
    float *c = (float *)(b + bn);
    /* bf16-valued pairs: 1.0 (A) and 2^-20 (B); sums stay normal and finite */
    for (size_t i = 0; i < an; i++) a[i] = 0x3f803f80u;
    for (size_t i = 0; i < bn; i++) b[i] = 0x35803580u;
    memset(c, 0, 64 * 64 * 4);
    double w0 = mxu_clock(CLOCK_MONOTONIC), c0 = mxu_clock(CLOCK_THREAD_CPUTIME_ID);
    for (int k = 0; k < 2; k++) cand[k]->kernel(MXU_PROBE_KP, a, b, c, cand[k]->nr, 0);   /* warm */
    for (int r = 0; r < MXU_PROBE_ROUNDS; r++) {
        for (int k = 0; k < 2; k++) {
            double g = mxu_probe_rate(cand[k], a, b, c, MXU_PROBE_SLICE);
            if (g > info.rate[k]) info.rate[k] = g;
        }
        if (mxu_clock(CLOCK_MONOTONIC) - w0 > MXU_PROBE_WALL) break;
    }
    info.ms = (mxu_clock(CLOCK_MONOTONIC) - w0) * 1e3;
    info.cpu_ms = (mxu_clock(CLOCK_THREAD_CPUTIME_ID) - c0) * 1e3;
    free(a);
    info.chosen = info.rate[1] > info.rate[0] ? cand[1] : cand[0];
    mxu_probe = info;
    atomic_store(&mxu_probed, 1);
    return info.chosen;
}

const ctpu_mxu_probe_info *ctpu_mxu_probe_result(void)
{
    return atomic_load(&mxu_probed) ? &mxu_probe : NULL;
}

void ctpu_k_mxu_select(ctpu_isa isa)
{
    switch (isa) {
    case CTPU_ISA_AVX512: mxu_cur = mxu_choose_avx512(); break;
    case CTPU_ISA_AVX2: mxu_cur = &ctpu_mxu_impl_avx2; break;
    default: mxu_cur = &ctpu_mxu_impl_ref; break;
    }
}
