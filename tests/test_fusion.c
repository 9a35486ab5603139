/* Fusion coverage (issue 13): each pattern runs in strict eager and in
 * defer and fuse; the outputs must be bit-identical (NaN as a class) and the
 * fused program must have the pinned number of steps (kernels). In the core
 * suite, so tools/run-tests.sh runs it again with CTPU_ISA=avx2 and scalar
 * (and meson runs test_fusion_scalar). */
#include "t_core.h"
#include "ctpu_nn.h"
#include "kernels.h"
#include "mxu.h"

static int64_t C(const char *n) { return ctpu_metric_counter(n); }

/* inputs a pattern made (kept; released by the harness) */
static ctpu_tensor pins[16];
static int n_pins;
static int64_t steps_at_begin;

static ctpu_tensor pin(ctpu_tensor t)
{
    ck_assert_msg(!ctpu_is_null(t), "input: %s", ctpu_last_error());
    ck_assert_int_lt(n_pins, 16);
    pins[n_pins++] = ctpu_keep(t);
    return t;
}

static ctpu_tensor randn(int nd, const int64_t *s, double sd) { return pin(ctpu_rand_normal(CTPU_F32, nd, s, 0, sd)); }

/* the pattern's step: inputs made before it are flushed by the mark */
static void pat_begin(void)
{
    ctpu_mark_step();
    steps_at_begin = C("fused_program_steps");
    ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
}

static void pat_end(void) { ck_assert_int_eq(ctpu_step_end(), CTPU_OK); }

static ctpu_tensor out(ctpu_tensor t)
{
    ck_assert_msg(!ctpu_is_null(t), "pattern: %s", ctpu_last_error());
    return ctpu_keep(t);
}

typedef int (*pattern_fn)(ctpu_tensor *outs);

static float *host_f32(ctpu_tensor t, int64_t *n)
{
    int64_t k = ctpu_numel(t);
    ck_assert_int_ge(k, 0);
    *n = k;
    float *o = malloc(sizeof(float) * (size_t)(k + 1));
    ctpu_tensor f = ctpu_dtype_of(t) == CTPU_F32 ? t : ctpu_cast(t, CTPU_F32);
    ck_assert_msg(ctpu_to_host(f, o, (size_t)k * 4) == CTPU_OK, "to_host: %s", ctpu_last_error());
    if (f.id != t.id) ctpu_release(f);
    return o;
}

/* Run fn in strict eager and in defer and fuse: same bits, and the fused
 * step has `want` kernels (program steps). */
static void check_pattern(const char *name, pattern_fn fn, int64_t want)
{
    float *res[2][8];
    int64_t len[2][8];
    int nout[2];
    int64_t steps = -1;
    for (int m = 0; m < 2; m++) {
        ctpu_set_mode(m ? CTPU_MODE_DEFER_FUSE : CTPU_MODE_STRICT);
        ctpu_manual_seed(11);
        n_pins = 0;
        ctpu_tensor outs[8];
        nout[m] = fn(outs);
        if (m) steps = C("fused_program_steps") - steps_at_begin;
        for (int k = 0; k < nout[m]; k++) {
            res[m][k] = host_f32(outs[k], &len[m][k]);
            ctpu_release(outs[k]);
        }
        for (int k = 0; k < n_pins; k++) ctpu_release(pins[k]);
    }
    ck_assert_int_eq(nout[0], nout[1]);
    for (int k = 0; k < nout[0]; k++) {
        ck_assert_int_eq(len[0][k], len[1][k]);
        for (int64_t i = 0; i < len[0][k]; i++) {
            float a = res[0][k][i], b = res[1][k][i];
            if (a != a && b != b) continue;
            ck_assert_msg(memcmp(&a, &b, 4) == 0, "%s: output %d element %lld: strict %a, fused %a", name, k,
                          (long long)i, (double)a, (double)b);
        }
        free(res[0][k]);
        free(res[1][k]);
    }
    ck_assert_msg(steps == want, "%s: the fused step has %lld kernels, want %lld", name, (long long)steps,
                  (long long)want);
}

/* ------------------------------------------------------------ matmul epilogues */
/* batched [3,33,17] @ [17,29]: x 0.125, + bias [29], gelu, + residual */
static int p_bmm_epilogue(ctpu_tensor *o)
{
    ctpu_tensor a = randn(3, (int64_t[]){ 3, 33, 17 }, 1), w = randn(2, (int64_t[]){ 17, 29 }, 1);
    ctpu_tensor b = randn(1, (int64_t[]){ 29 }, 1), r = randn(3, (int64_t[]){ 3, 33, 29 }, 1);
    pat_begin();
    o[0] = out(ctpu_add(ctpu_gelu(ctpu_add(ctpu_mul_scalar(ctpu_matmul(a, w), 0.125), b), false), r));
    pat_end();
    return 1;
}

/* attention scores q @ k^T x scale, 4-D [2,3,20,16] (and + an additive mask
 * as the residual) */
static int p_scores_scale(ctpu_tensor *o)
{
    ctpu_tensor q = randn(4, (int64_t[]){ 2, 3, 20, 16 }, 1), k = randn(4, (int64_t[]){ 2, 3, 24, 16 }, 1);
    ctpu_tensor m = randn(4, (int64_t[]){ 2, 3, 20, 24 }, 1);
    pat_begin();
    o[0] = out(ctpu_add(ctpu_mul_scalar(ctpu_matmul_t(q, k, false, true), 0.25), m));
    pat_end();
    return 1;
}

/* a 2-D matmul, x scale, relu (tanh GELU), + residual, with the scale first */
static int p_mm_scale_act(ctpu_tensor *o)
{
    ctpu_tensor a = randn(2, (int64_t[]){ 40, 70 }, 1), w = randn(2, (int64_t[]){ 70, 50 }, 1);
    ctpu_tensor r = randn(2, (int64_t[]){ 40, 50 }, 1);
    pat_begin();
    o[0] = out(ctpu_add(ctpu_gelu(ctpu_mul_scalar(ctpu_matmul(a, w), 3.0), true), r));
    o[1] = out(ctpu_relu(ctpu_mul_scalar(ctpu_matmul(a, w), -0.5)));
    pat_end();
    return 2;
}

/* a softmax over the last dim as the matmul's last epilogue step: in each
 * MXU block (it holds whole rows) for the composition-written attention of
 * bench/fuse's block (scores x scale -> softmax; edge rows of M = 100 past
 * 12-row panels), N = 40 (edge columns from the scratch tile) and batched
 * 4-D with + mask before it; over c after the MXU finished for N = 600 (past
 * one block's 512 columns) and skinny N = 10 (C^T computed). With
 * CTPU_NUM_THREADS=2, rows or columns split over threads. */
static int p_mm_softmax(ctpu_tensor *o)
{
    ctpu_tensor h = randn(2, (int64_t[]){ 100, 64 }, 1), w = randn(2, (int64_t[]){ 64, 600 }, 0.3);
    ctpu_tensor w2 = randn(2, (int64_t[]){ 64, 40 }, 0.3), w3 = randn(2, (int64_t[]){ 64, 10 }, 0.3);
    ctpu_tensor q = randn(4, (int64_t[]){ 2, 3, 20, 16 }, 1), k = randn(4, (int64_t[]){ 2, 3, 24, 16 }, 1);
    ctpu_tensor m = randn(4, (int64_t[]){ 2, 3, 20, 24 }, 1);
    pat_begin();
    o[0] = out(ctpu_softmax(ctpu_mul_scalar(ctpu_matmul_t(h, h, false, true), 0.125), 1));
    o[1] = out(ctpu_softmax(ctpu_matmul(h, w), -1));
    o[2] = out(ctpu_softmax(ctpu_gelu(ctpu_matmul(h, w2), true), 1));
    o[3] = out(ctpu_softmax(ctpu_matmul(h, w3), 1));
    o[4] = out(ctpu_softmax(ctpu_add(ctpu_mul_scalar(ctpu_matmul_t(q, k, false, true), 0.25), m), 3));
    pat_end();
    return 5;
}

/* softmax over another dim, log_softmax, or a matmul output read twice:
 * not an epilogue (a step of its own) */
static int p_mm_softmax_not(ctpu_tensor *o)
{
    ctpu_tensor h = randn(2, (int64_t[]){ 30, 64 }, 1), w = randn(2, (int64_t[]){ 64, 50 }, 0.3);
    pat_begin();
    o[0] = out(ctpu_softmax(ctpu_matmul(h, w), 0));
    o[1] = out(ctpu_log_softmax(ctpu_matmul(h, w), 1));
    ctpu_tensor s = ctpu_matmul(h, w);
    o[2] = out(ctpu_add(ctpu_softmax(s, 1), s));
    pat_end();
    return 3;
}

START_TEST(matmul_epilogues)
{
    check_pattern("mm (scale, gelu, + mask) -> softmax over the last dim", p_mm_softmax, 5);
    check_pattern("softmax over dim 0, log_softmax, a twice-read scores", p_mm_softmax_not, 6);
    check_pattern("bmm scale+bias+gelu+residual", p_bmm_epilogue, 1);
    check_pattern("scores x scale + mask", p_scores_scale, 1);
    check_pattern("mm scale+gelu+residual, scale+relu", p_mm_scale_act, 2);
}
END_TEST

/* ------------------------------------------------------------ shared packed operands */
/* matmul steps reading one value as the same operand share its packed
 * panels (compile.c plan_packs; operands of 128 KiB of panels and more): the
 * q, k, v projections of one batched input (odd K, M past 12-row panels),
 * weight-gradient-like products of a 2-D transpose, B shared by two steps
 * (one reading x2 as A^T, the other as A: two layouts, nothing shared) */
static int p_shared_panels(ctpu_tensor *o)
{
    ctpu_tensor x = randn(3, (int64_t[]){ 4, 64, 129 }, 1), x2 = randn(2, (int64_t[]){ 256, 130 }, 1);
    ctpu_tensor wq = randn(2, (int64_t[]){ 129, 64 }, 0.3), wk = randn(2, (int64_t[]){ 129, 64 }, 0.3);
    ctpu_tensor wv = randn(2, (int64_t[]){ 129, 96 }, 0.3), g1 = randn(2, (int64_t[]){ 256, 40 }, 1);
    ctpu_tensor g2 = randn(2, (int64_t[]){ 256, 48 }, 1), b = randn(2, (int64_t[]){ 130, 256 }, 1);
    pat_begin();
    o[0] = out(ctpu_matmul(x, wq));
    o[1] = out(ctpu_gelu(ctpu_matmul(x, wk), true));
    o[2] = out(ctpu_matmul(x, wv));
    o[3] = out(ctpu_matmul_t(x2, g1, true, false));
    o[4] = out(ctpu_mul_scalar(ctpu_matmul_t(x2, g2, true, false), 0.5));
    o[5] = out(ctpu_matmul(x2, b));
    o[6] = out(ctpu_matmul(ctpu_matmul_t(g1, x2, true, false), b));
    pat_end();
    return 7;
}

START_TEST(shared_panels)
{
    check_pattern("shared packed operands: q/k/v, dW-like, shared B", p_shared_panels, 8);
}
END_TEST

/* The kernel's side: a call told the operand is already packed never reads
 * it (a is all NaN there) and gives the bits of packing it itself; A
 * batched, B shared, transposed A. Skipped where no plan holds. */
static int shared_case(int role, int64_t batch, int64_t M, int64_t N, int64_t K, int trans)
{
    int ran = 0;
    int64_t na = batch * M * K, nb = K * N, nc = batch * M * N;
    float *a = malloc(sizeof(float) * (size_t)na), *b = malloc(sizeof(float) * (size_t)nb);
    float *junk = malloc(sizeof(float) * (size_t)(na > nb ? na : nb));
    float *c0 = malloc(sizeof(float) * (size_t)nc), *c1 = malloc(sizeof(float) * (size_t)nc);
    uint32_t st = 7;
    for (int64_t i = 0; i < na; i++) { st = st * 1664525u + 1013904223u; a[i] = (float)(st >> 8) / 16777216.0f - 0.5f; }
    for (int64_t i = 0; i < nb; i++) { st = st * 1664525u + 1013904223u; b[i] = (float)(st >> 8) / 16777216.0f - 0.5f; }
    for (int64_t i = 0; i < (na > nb ? na : nb); i++) junk[i] = NAN;
    ctpu_mm_args g = { .batch = batch, .M = M, .N = N, .K = K, .a = a, .a_dtype = CTPU_KDT_F32,
                       .a_bs = role ? M * K : (batch > 1 ? M * K : 0), .a_rs = trans ? 1 : K, .a_cs = trans ? M : 1,
                       .b = b, .b_dtype = CTPU_KDT_F32, .b_rs = N, .b_cs = 1,
                       .c = c0, .c_dtype = CTPU_KDT_F32, .c_bs = M * N, .ldc = N };
    ctpu_k_prepack pp = { .role = role, .dt = CTPU_KDT_F32, .si = role ? g.b_cs : g.a_rs, .sk = role ? g.b_rs : g.a_cs,
                          .I = role ? N : M, .K = K, .nb = role ? 1 : batch, .bs = role ? 0 : (batch > 1 ? M * K : 0) };
    if (!ctpu_k_mm_prepack_plan(&g, &pp)) goto done;
    void *buf = aligned_alloc(64, (pp.bytes + 63) / 64 * 64);
    ctpu_k_matmul(&g, NULL);                    /* c0: on its own */
    ctpu_mm_args k1 = g;
    k1.c = c1;
    k1.pre[role] = &pp;
    k1.pre_buf[role] = buf;
    k1.pre_keep[role] = 1;
    ctpu_k_matmul(&k1, NULL);                   /* packs into buf */
    ck_assert_msg(memcmp(c0, c1, sizeof(float) * (size_t)nc) == 0, "shared panels (keep): bits differ");
    memset(c1, 0, sizeof(float) * (size_t)nc);
    k1.pre_keep[role] = 0;
    if (role) k1.b = junk; else k1.a = junk;
    ctpu_k_matmul(&k1, NULL);                   /* reads buf only */
    ck_assert_msg(memcmp(c0, c1, sizeof(float) * (size_t)nc) == 0,
                  "shared panels: role %d batch %lld %lldx%lldx%lld: bits differ", role, (long long)batch,
                  (long long)M, (long long)N, (long long)K);
    free(buf);
    ran = 1;
done:
    free(a); free(b); free(junk); free(c0); free(c1);
    return ran;
}

START_TEST(shared_panels_kernel)
{
    /* the ISA's micro-kernel, and on AVX-512 both (vdpbf16ps: A in the row layout) */
    const ctpu_mxu_impl *cur = ctpu_mxu_current();
    int both = (cur == &ctpu_mxu_impl_avx512 || cur == &ctpu_mxu_impl_avx512_dp) &&
               __builtin_cpu_supports("avx512bf16");
    for (int v = 0; v < (both ? 2 : 1); v++) {
        if (both) ctpu_mxu_force_impl(v ? &ctpu_mxu_impl_avx512_dp : &ctpu_mxu_impl_avx512);
        int ran = shared_case(0, 1, 37, 45, 70, 0) + shared_case(0, 1, 256, 256, 256, 0) +
                  shared_case(0, 3, 30, 40, 47, 0) + shared_case(0, 1, 47, 40, 120, 1) +
                  shared_case(1, 1, 45, 37, 33, 0) + shared_case(1, 2, 50, 64, 200, 0);
        ck_assert_msg(ran >= 4, "shared panels (%s): only %d of 6 cases have a plan", ctpu_mxu_current()->name, ran);
    }
    ctpu_mxu_force_impl(NULL);
}
END_TEST

/* ------------------------------------------------------------ small broadcast producers */
/* a*(1-w)+b*w with a (1,) weight: one kernel (1 - w is computed at every
 * element); a [1,7] producer of a [5,7] chain too */
static int p_lerp(ctpu_tensor *o)
{
    ctpu_tensor a = randn(2, (int64_t[]){ 50, 70 }, 1), b = randn(2, (int64_t[]){ 50, 70 }, 1);
    ctpu_tensor w = pin(ctpu_rand_uniform(CTPU_F32, 1, (int64_t[]){ 1 }, 0, 1));
    ctpu_tensor v = randn(2, (int64_t[]){ 1, 70 }, 1);
    pat_begin();
    o[0] = out(ctpu_add(ctpu_mul(a, ctpu_rsub_scalar(w, 1.0)), ctpu_mul(b, w)));
    o[1] = out(ctpu_mul(ctpu_exp(ctpu_mul_scalar(v, 0.5)), ctpu_sub(a, b)));
    pat_end();
    return 2;
}

/* the small producer is also a live-out: it cannot be recomputed inside the
 * chain's kernel (it keeps its own) */
static int p_lerp_live(ctpu_tensor *o)
{
    ctpu_tensor a = randn(1, (int64_t[]){ 3000 }, 1), b = randn(1, (int64_t[]){ 3000 }, 1);
    ctpu_tensor w = pin(ctpu_rand_uniform(CTPU_F32, 1, (int64_t[]){ 1 }, 0, 1));
    pat_begin();
    ctpu_tensor om = ctpu_rsub_scalar(w, 1.0);
    o[0] = out(ctpu_add(ctpu_mul(a, om), ctpu_mul(b, w)));
    o[1] = out(om);
    pat_end();
    return 2;
}

/* an output past CTPU_VM_STREAM_BYTES that no later step reads: stored with
 * non-temporal stores (an odd length: an unaligned tail), and a value both
 * stored and read by the group */
static int p_stream_store(ctpu_tensor *o)
{
    int64_t n = ((int64_t)1 << 21) + 37;
    ctpu_tensor x = randn(1, &n, 1);
    pat_begin();
    ctpu_tensor t = ctpu_add_scalar(ctpu_mul_scalar(x, 1.5), 0.25);
    o[0] = out(t);
    o[1] = out(ctpu_maximum_scalar(ctpu_abs(ctpu_sub_scalar(ctpu_mul(ctpu_relu(t), x), 0.125)), 0.01));
    pat_end();
    return 2;
}

START_TEST(stream_stores)
{
    check_pattern("8 MiB chain, two live-outs", p_stream_store, 1);
}
END_TEST

/* the same chain on 2 and 3 kernel threads: the blocks are claimed in
 * chunks from a shared counter (vm.c vm_task), an odd tail in the last */
START_TEST(stream_stores_threads)
{
    static const char *const thr[] = { "2", "3" };
    for (int t = 0; t < 2; t++) {
        ctpu_shutdown();
        t_clear_env();
        setenv("CTPU_NUM_THREADS", thr[t], 1);
        ck_assert_int_eq(ctpu_init(), CTPU_OK);
        check_pattern(thr[t][0] == '2' ? "8 MiB chain, 2 threads" : "8 MiB chain, 3 threads", p_stream_store, 1);
    }
}
END_TEST

START_TEST(small_broadcast_producers)
{
    check_pattern("a*(1-w)+b*w, w (1,); exp(v [1,70]) * [50,70]", p_lerp, 1);
    check_pattern("1-w also live-out", p_lerp_live, 2);
}
END_TEST

/* ------------------------------------------------------------ column reductions */
/* producers fused into reductions over leading or middle dims (the
 * weight gradients of a norm: sums over rows) */
static int p_column_reductions(ctpu_tensor *o)
{
    ctpu_tensor a = randn(2, (int64_t[]){ 40, 96 }, 1), b = randn(2, (int64_t[]){ 40, 96 }, 1);
    ctpu_tensor c = randn(3, (int64_t[]){ 4, 30, 20 }, 1), d = randn(3, (int64_t[]){ 3, 5, 7 }, 1);
    ctpu_tensor e = pin(ctpu_rand_normal(CTPU_BF16, 2, (int64_t[]){ 5000, 3 }, 0, 1));
    pat_begin();
    o[0] = out(ctpu_sum(ctpu_mul(a, b), 1, (int[]){ 0 }, true));
    o[1] = out(ctpu_mean(ctpu_exp(ctpu_mul_scalar(c, 0.5)), 1, (int[]){ 1 }, false));
    o[2] = out(ctpu_max(ctpu_sub(d, ctpu_abs(d)), 2, (int[]){ 0, 1 }, false));
    o[3] = out(ctpu_sum(ctpu_tanh(e), 1, (int[]){ 0 }, false));   /* bf16, a column longer than a chunk */
    pat_end();
    return 4;
}

START_TEST(column_reductions)
{
    check_pattern("sum/mean/max over leading and middle dims", p_column_reductions, 4);
}
END_TEST

/* ------------------------------------------------------------ row groups */
static ctpu_tensor lastdim_mean(ctpu_tensor x, bool keep) { return ctpu_mean(x, 1, (int[]){ -1 }, keep); }

/* layer norm (weight, bias) over rows of 200 and of 5000 (past a 4096
 * reduction chunk), rms norm, each one kernel */
static int p_layer_norm(ctpu_tensor *o)
{
    ctpu_tensor x = randn(3, (int64_t[]){ 4, 30, 200 }, 2), y = randn(2, (int64_t[]){ 6, 5000 }, 1);
    ctpu_tensor w = randn(1, (int64_t[]){ 200 }, 1), b = randn(1, (int64_t[]){ 200 }, 1);
    ctpu_tensor w2 = randn(1, (int64_t[]){ 5000 }, 1);
    pat_begin();
    o[0] = out(ctpu_layer_norm(x, w, b, 1e-5));
    o[1] = out(ctpu_layer_norm(y, w2, CTPU_NULL, 1e-6));
    pat_end();
    return 2;
}

static int p_rms_norm(ctpu_tensor *o)
{
    ctpu_tensor x = randn(2, (int64_t[]){ 64, 96 }, 3), w = randn(1, (int64_t[]){ 96 }, 1);
    pat_begin();
    o[0] = out(ctpu_rms_norm(x, w, 1e-6));
    pat_end();
    return 1;
}

/* residual + norm: h = x + a is live (the residual stream) and normalised */
static int p_residual_norm(ctpu_tensor *o)
{
    ctpu_tensor x = randn(2, (int64_t[]){ 48, 128 }, 1), a = randn(2, (int64_t[]){ 48, 128 }, 1);
    ctpu_tensor w = randn(1, (int64_t[]){ 128 }, 1), b = randn(1, (int64_t[]){ 128 }, 1);
    pat_begin();
    ctpu_tensor h = ctpu_add(x, a);
    o[0] = out(h);
    o[1] = out(ctpu_layer_norm(h, w, b, 1e-5));
    o[2] = out(ctpu_rms_norm(h, w, 1e-5));
    pat_end();
    return 3;
}

/* bf16 input: the norms' casts are in the kernel too */
static int p_norm_bf16(ctpu_tensor *o)
{
    ctpu_tensor x = pin(ctpu_rand_normal(CTPU_BF16, 2, (int64_t[]){ 40, 64 }, 0, 2));
    ctpu_tensor w = pin(ctpu_rand_normal(CTPU_BF16, 1, (int64_t[]){ 64 }, 1, 0.2));
    pat_begin();
    o[0] = out(ctpu_layer_norm(x, w, CTPU_NULL, 1e-5));
    pat_end();
    return 1;
}

/* a bf16 expand in a row group: bf16 subnormals (raw bits from the host)
 * are copied as the strict expand copies them, not flushed by a rounding */
static int p_bf16_expand(ctpu_tensor *o)
{
    static const uint16_t rb[6] = { 0x0001, 0x807f, 0x0040, 0x3f80, 0x0000, 0x8001 };
    ctpu_tensor r = pin(ctpu_from_host(rb, CTPU_BF16, 2, (int64_t[]){ 6, 1 }));
    ctpu_tensor x = pin(ctpu_rand_normal(CTPU_BF16, 2, (int64_t[]){ 6, 40 }, 0, 2));
    pat_begin();
    ctpu_tensor e = ctpu_mul_scalar(ctpu_expand(r, 2, (int64_t[]){ 6, 40 }), 0x1p100);
    o[0] = out(ctpu_sum(ctpu_mul(e, x), 1, (int[]){ 1 }, true));
    /* live-out, so stored: the row group leaves it to a kernel of its own */
    ctpu_tensor e2 = ctpu_expand(r, 2, (int64_t[]){ 6, 40 });
    o[1] = out(e2);
    o[2] = out(ctpu_sum(ctpu_mul_scalar(e2, 0x1p100), 1, (int[]){ 1 }, true));
    pat_end();
    return 3;
}

/* mean and var (correction 1, not kept: stored beside) feeding consumers;
 * the layer norm of bench/fuse's block written with ops */
static int p_mean_var_consumers(ctpu_tensor *o)
{
    ctpu_tensor x = randn(2, (int64_t[]){ 33, 300 }, 1), g = randn(1, (int64_t[]){ 300 }, 1);
    ctpu_tensor b = randn(1, (int64_t[]){ 300 }, 1);
    pat_begin();
    ctpu_tensor mu = lastdim_mean(x, true);
    ctpu_tensor xc = ctpu_sub(x, mu);
    ctpu_tensor var = lastdim_mean(ctpu_mul(xc, xc), true);
    o[0] = out(ctpu_add(ctpu_mul(ctpu_mul(xc, ctpu_rsqrt(ctpu_add_scalar(var, 1e-5))), g), b));
    ctpu_tensor v1 = ctpu_var(x, 1, (int[]){ 1 }, 1, true);
    o[1] = out(ctpu_div(ctpu_sub(x, lastdim_mean(x, true)), ctpu_sqrt(v1)));
    o[2] = out(ctpu_var(x, 1, (int[]){ 1 }, 1, false));
    o[3] = out(ctpu_sum(ctpu_exp(ctpu_sub(x, ctpu_max(x, 1, (int[]){ 1 }, true))), 1, (int[]){ 1 }, false));
    pat_end();
    return 4;
}

/* softmax with its producers (scale, additive mask) and a consumer; a
 * large block (threads: rows x n >= 65536) */
static int p_softmax_chain(ctpu_tensor *o)
{
    ctpu_tensor s = randn(3, (int64_t[]){ 4, 64, 300 }, 3), m = randn(2, (int64_t[]){ 64, 300 }, 1);
    pat_begin();
    ctpu_tensor p = ctpu_softmax(ctpu_add(ctpu_mul_scalar(s, 0.125), m), -1);
    o[0] = out(ctpu_mul_scalar(p, 0.9));
    o[1] = out(ctpu_log_softmax(ctpu_neg(s), 2));
    pat_end();
    return 2;
}

/* cross entropy's forward: log_softmax and the loss */
static int p_cross_entropy(ctpu_tensor *o)
{
    ctpu_tensor x = randn(2, (int64_t[]){ 32, 50 }, 2);
    int32_t lab[32];
    for (int i = 0; i < 32; i++) lab[i] = (i * 7) % 50;
    lab[3] = -100;
    ctpu_tensor y = pin(ctpu_from_host(lab, CTPU_I32, 1, (int64_t[]){ 32 }));
    pat_begin();
    o[0] = out(ctpu_cross_entropy(x, y, NULL));
    pat_end();
    return 1;
}

/* bf16 logits (the neg in bf16, then the cast), a longer batch; nll_loss
 * on log_softmax's output (the cast before the neg), every label ignored
 * in one of them (0 / 0: NaN as in torch) */
static int p_cross_entropy_more(ctpu_tensor *o)
{
    enum { N = 3000, C = 7 };
    ctpu_tensor x = pin(ctpu_rand_normal(CTPU_BF16, 2, (int64_t[]){ N, C }, 0, 3));
    ctpu_tensor z = randn(2, (int64_t[]){ 20, C }, 1);
    static int32_t lab[N], ign[20];
    for (int i = 0; i < N; i++) lab[i] = i % 11 == 3 ? (i % 2 ? -100 : 5) : (i * 5) % C;
    for (int i = 0; i < 20; i++) ign[i] = -1;
    ctpu_tensor y = pin(ctpu_from_host(lab, CTPU_I32, 1, (int64_t[]){ N }));
    ctpu_tensor yi = pin(ctpu_from_host(ign, CTPU_I32, 1, (int64_t[]){ 20 }));
    ctpu_tensor xb = pin(ctpu_cast(x, CTPU_BF16));
    pat_begin();
    o[0] = out(ctpu_cross_entropy(x, y, NULL));
    ctpu_nll_opts no = ctpu_nll_defaults();
    no.ignore_index = -1;
    o[1] = out(ctpu_nll_loss(ctpu_log_softmax(z, 1), yi, &no));
    o[2] = out(ctpu_nll_loss(ctpu_log_softmax(xb, 1), y, NULL));
    pat_end();
    return 3;
}

/* layer norm / rms norm backward: the gradients of x, weight, bias */
static ctpu_tensor leaf(ctpu_tensor t)
{
    ctpu_set_requires_grad(t, true);
    return t;
}

/* ------------------------------------------------------------ the loss step */
/* labels over C classes, every 11th ignored (-100) */
static ctpu_tensor labels(int n, int c)
{
    int32_t *lab = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) lab[i] = i % 11 == 3 ? -100 : (i * 7 + 2) % c;
    ctpu_tensor y = pin(ctpu_from_host(lab, CTPU_I32, 1, (int64_t[]){ n }));
    free(lab);
    return y;
}

/* cross_entropy forward and backward (the logits' gradient) with the given
 * options; reduction NONE is weighted by r and summed; bf16 logits on request */
static int ce_train(ctpu_tensor *o, int64_t n, int64_t c, ctpu_reduction red, double smooth, bool bf16)
{
    ctpu_tensor x = leaf(pin(ctpu_rand_normal(bf16 ? CTPU_BF16 : CTPU_F32, 2, (int64_t[]){ n, c }, 0, 2)));
    ctpu_tensor y = labels((int)n, (int)c), r = randn(1, (int64_t[]){ n }, 1);
    pat_begin();
    ctpu_ce_opts co = ctpu_ce_defaults();
    co.reduction = red;
    co.label_smoothing = smooth;
    ctpu_tensor l = ctpu_cross_entropy(x, y, &co);
    if (red == CTPU_REDUCE_NONE) {
        o[1] = out(l);
        l = ctpu_sum(ctpu_mul(l, r), 0, NULL, false);
    }
    ck_assert_int_eq(ctpu_backward(l), CTPU_OK);
    o[0] = out(ctpu_grad(x));
    if (red != CTPU_REDUCE_NONE) o[1] = out(l);
    pat_end();
    return 2;
}
static int p_ce_train(ctpu_tensor *o) { return ce_train(o, 40, 50, CTPU_REDUCE_MEAN, 0, false); }
static int p_ce_train_bf16(ctpu_tensor *o) { return ce_train(o, 37, 65, CTPU_REDUCE_MEAN, 0, true); }
static int p_ce_train_sum(ctpu_tensor *o) { return ce_train(o, 3000, 7, CTPU_REDUCE_SUM, 0, false); }
static int p_ce_train_none(ctpu_tensor *o) { return ce_train(o, 40, 50, CTPU_REDUCE_NONE, 0, false); }
static int p_ce_train_smooth(ctpu_tensor *o) { return ce_train(o, 300, 260, CTPU_REDUCE_MEAN, 0.1, false); }
static int p_ce_train_smooth_sum(ctpu_tensor *o) { return ce_train(o, 40, 50, CTPU_REDUCE_SUM, 0.25, false); }
/* bf16 logits with label smoothing: mean, sum and none */
static int p_ce_train_bf16_smooth(ctpu_tensor *o) { return ce_train(o, 37, 65, CTPU_REDUCE_MEAN, 0.1, true); }
static int p_ce_train_bf16_smooth_sum(ctpu_tensor *o) { return ce_train(o, 300, 260, CTPU_REDUCE_SUM, 0.2, true); }
static int p_ce_train_bf16_smooth_none(ctpu_tensor *o) { return ce_train(o, 40, 50, CTPU_REDUCE_NONE, 0.1, true); }

/* forward only: sum, none and label smoothing (mean: p_cross_entropy, above) */
static int p_ce_forward_variants(ctpu_tensor *o)
{
    ctpu_tensor x = randn(2, (int64_t[]){ 40, 50 }, 2), y = labels(40, 50);
    pat_begin();
    ctpu_ce_opts co = ctpu_ce_defaults();
    co.reduction = CTPU_REDUCE_SUM;
    o[0] = out(ctpu_cross_entropy(x, y, &co));
    co.reduction = CTPU_REDUCE_NONE;
    o[1] = out(ctpu_cross_entropy(x, y, &co));
    co.reduction = CTPU_REDUCE_MEAN;
    co.label_smoothing = 0.2;
    o[2] = out(ctpu_cross_entropy(x, y, &co));
    pat_end();
    return 3;
}

/* nll_loss (sum) on log_softmax's output, forward and backward; and a
 * backward recorded after another op (the forward's per-row values are
 * stored for it: the forward and the backward are a loss step each) */
static int p_nll_train(ctpu_tensor *o)
{
    ctpu_tensor x = leaf(randn(2, (int64_t[]){ 40, 50 }, 2)), y = labels(40, 50);
    ctpu_tensor a = randn(2, (int64_t[]){ 16, 16 }, 1);
    pat_begin();
    ctpu_nll_opts no = ctpu_nll_defaults();
    no.reduction = CTPU_REDUCE_SUM;
    ctpu_tensor l = ctpu_nll_loss(ctpu_log_softmax(x, 1), y, &no);
    o[1] = out(l);
    o[2] = out(ctpu_matmul(a, a));
    ck_assert_int_eq(ctpu_backward(l), CTPU_OK);
    o[0] = out(ctpu_grad(x));
    pat_end();
    return 3;
}

static int norm_backward(ctpu_tensor *o, bool rms)
{
    ctpu_tensor x = leaf(randn(2, (int64_t[]){ 40, 96 }, 2)), w = leaf(randn(1, (int64_t[]){ 96 }, 1));
    ctpu_tensor b = leaf(randn(1, (int64_t[]){ 96 }, 1)), r = randn(2, (int64_t[]){ 40, 96 }, 1);
    pat_begin();
    ctpu_tensor y = rms ? ctpu_rms_norm(x, w, 1e-6) : ctpu_layer_norm(x, w, b, 1e-5);
    ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(y, r), 0, NULL, false)), CTPU_OK);
    o[0] = out(ctpu_grad(x));
    o[1] = out(ctpu_grad(w));
    if (!rms) o[2] = out(ctpu_grad(b));
    pat_end();
    return rms ? 2 : 3;
}
static int p_ln_backward(ctpu_tensor *o) { return norm_backward(o, false); }

/* 3-D, past the threading threshold (rows x n >= 65536: the rows split over
 * the kernel threads, the column buffers filled by both), the sums over
 * dims {0, 1} */
static int p_ln_backward_3d(ctpu_tensor *o)
{
    ctpu_tensor x = leaf(randn(3, (int64_t[]){ 4, 70, 300 }, 2)), w = leaf(randn(1, (int64_t[]){ 300 }, 1));
    ctpu_tensor b = leaf(randn(1, (int64_t[]){ 300 }, 1)), r = randn(3, (int64_t[]){ 4, 70, 300 }, 1);
    pat_begin();
    ctpu_tensor y = ctpu_layer_norm(x, w, b, 1e-5);
    ck_assert_int_eq(ctpu_backward(ctpu_sum(ctpu_mul(y, r), 0, NULL, false)), CTPU_OK);
    o[0] = out(ctpu_grad(x));
    o[1] = out(ctpu_grad(w));
    o[2] = out(ctpu_grad(b));
    o[3] = out(y);
    pat_end();
    return 4;
}

/* column reductions of a row group's values: mean and max over the rows of
 * a softmax (bf16 input), a reshape of one */
static int p_row_columns(ctpu_tensor *o)
{
    ctpu_tensor x = pin(ctpu_rand_normal(CTPU_BF16, 2, (int64_t[]){ 37, 130 }, 0, 2));
    pat_begin();
    ctpu_tensor p = ctpu_softmax(ctpu_mul_scalar(x, 0.5), -1);
    o[0] = out(ctpu_reshape(ctpu_mean(p, 1, (int[]){ 0 }, true), 1, (int64_t[]){ 130 }));
    o[1] = out(ctpu_max(ctpu_add(p, x), 1, (int[]){ 0 }, false));
    o[2] = out(p);
    pat_end();
    return 3;
}
static int p_rms_backward(ctpu_tensor *o) { return norm_backward(o, true); }

/* a parameter normalised in place (assign: the row group writes the
 * input's buffer, each tile after its own reads) */
static int p_inplace_norm(ctpu_tensor *o)
{
    ctpu_tensor x = ctpu_keep(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ 70, 300 }, 0, 2));
    ctpu_tensor r = randn(2, (int64_t[]){ 70, 300 }, 1), w = randn(1, (int64_t[]){ 300 }, 1);
    pat_begin();
    ck_assert_int_eq(ctpu_assign(x, ctpu_rms_norm(ctpu_add(x, r), w, 1e-6)), CTPU_OK);
    pat_end();
    o[0] = x;
    return 1;
}

START_TEST(row_groups)
{
    check_pattern("layer_norm (rows of 200 and 5000)", p_layer_norm, 2);
    check_pattern("rms_norm", p_rms_norm, 1);
    check_pattern("residual + layer_norm + rms_norm", p_residual_norm, 1);
    check_pattern("bf16 layer_norm", p_norm_bf16, 1);
    check_pattern("bf16 expand (subnormals) -> scale -> product -> sum; a stored one alone", p_bf16_expand, 3);
    check_pattern("mean/var producers and consumers", p_mean_var_consumers, 1);
    check_pattern("scale + mask -> softmax -> scale; log_softmax", p_softmax_chain, 1);
    check_pattern("rms_norm assigned in place", p_inplace_norm, 1);
    /* the weight and bias gradients (sums over rows) are COL values of the row group */
    check_pattern("layer_norm forward + backward", p_ln_backward, 1);
    check_pattern("rms_norm forward + backward", p_rms_backward, 1);
    check_pattern("layer_norm forward + backward, 3-D, threaded", p_ln_backward_3d, 1);
    check_pattern("mean / max over a softmax's rows", p_row_columns, 1);
    /* log_softmax, then the loss step (the label path, the gather, the mean) */
    check_pattern("cross_entropy forward", p_cross_entropy, 2);
    check_pattern("cross_entropy bf16, nll_loss, all ignored", p_cross_entropy_more, 6);
}
END_TEST

/* cross entropy's forward after log_softmax and its backward to the
 * logits' gradient: one loss step (log_softmax's kernel + 1) */
START_TEST(loss_steps)
{
    check_pattern("cross_entropy forward + backward", p_ce_train, 2);
    check_pattern("cross_entropy bf16 forward + backward", p_ce_train_bf16, 2);
    check_pattern("cross_entropy sum forward + backward", p_ce_train_sum, 2);
    check_pattern("cross_entropy none (weighted sum) forward + backward", p_ce_train_none, 2);
    check_pattern("cross_entropy label smoothing forward + backward", p_ce_train_smooth, 2);
    check_pattern("cross_entropy label smoothing, sum, forward + backward", p_ce_train_smooth_sum, 2);
    check_pattern("cross_entropy bf16 label smoothing forward + backward", p_ce_train_bf16_smooth, 2);
    check_pattern("cross_entropy bf16 label smoothing, sum, forward + backward", p_ce_train_bf16_smooth_sum, 2);
    check_pattern("cross_entropy bf16 label smoothing, none, forward + backward", p_ce_train_bf16_smooth_none, 2);
    check_pattern("cross_entropy sum / none / label smoothing forward (3 x log_softmax + loss)",
                  p_ce_forward_variants, 6);
    check_pattern("nll_loss sum forward, a matmul, backward", p_nll_train, 4);
}
END_TEST

/* a label out of range: the loss step faults as the gather does, named by
 * the gather's op number and cross_entropy's call scope, in both modes the
 * same message */
START_TEST(nll_fault_parity)
{
    char msg[2][512];
    for (int m = 0; m < 2; m++) {
        ctpu_set_mode(m ? CTPU_MODE_DEFER_FUSE : CTPU_MODE_STRICT);
        ctpu_manual_seed(3);
        ctpu_tensor x = ctpu_keep(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ 4, 5 }, 0, 2));
        int32_t lab[4] = { 1, 7, -100, -3 };
        ctpu_tensor y = ctpu_keep(ctpu_from_host(lab, CTPU_I32, 1, (int64_t[]){ 4 }));
        ctpu_mark_step();
        ctpu_tensor l = ctpu_keep(ctpu_cross_entropy(x, y, NULL));
        float v;
        ck_assert_int_eq(ctpu_to_host(l, &v, 4), CTPU_ERR_DEVICE_FAULT);
        snprintf(msg[m], sizeof msg[m], "%s", ctpu_last_error());
        ctpu_release(l);
        ctpu_release(x);
        ctpu_release(y);
    }
    /* named as the user's call and argument (issue 20), not the gather */
    ck_assert_msg(strcmp(msg[0], "cross_entropy (op #6): labels 7 at position 1 is out of range [0, 5) (2 bad "
                                 "indices), raised at to_host (op #14)") == 0, "strict: %s", msg[0]);
    ck_assert_str_eq(msg[0], msg[1]);
}
END_TEST

/* the same with label smoothing, sum, and the backward in the step (the
 * loss step, which holds the gather): the same message in both modes, and
 * only what is computed from the gather takes the fault, as in strict
 * eager: the logits' gradient (gather_backward skips the bad index) and a
 * count of the labels recorded after the loss (the loss step takes it in)
 * are good in both modes, with the same bits */
START_TEST(loss_step_fault_parity)
{
    char msg[2][512];
    float gr[2][20], cnt[2];
    for (int m = 0; m < 2; m++) {
        ctpu_set_mode(m ? CTPU_MODE_DEFER_FUSE : CTPU_MODE_STRICT);
        ctpu_manual_seed(3);
        ctpu_tensor x = ctpu_keep(ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ 4, 5 }, 0, 2));
        ctpu_set_requires_grad(x, true);
        int32_t lab[4] = { 1, 7, -100, -3 };
        ctpu_tensor y = ctpu_keep(ctpu_from_host(lab, CTPU_I32, 1, (int64_t[]){ 4 }));
        ctpu_mark_step();
        ctpu_ce_opts co = ctpu_ce_defaults();
        co.reduction = CTPU_REDUCE_SUM;
        co.label_smoothing = 0.1;
        ctpu_tensor l = ctpu_keep(ctpu_cross_entropy(x, y, &co));
        ck_assert_int_eq(ctpu_backward(l), CTPU_OK);
        ctpu_tensor g = ctpu_keep(ctpu_grad(x));
        ctpu_tensor c = ctpu_keep(ctpu_sum(ctpu_ne_scalar(y, -100), 0, NULL, false));
        float v;
        ck_assert_int_eq(ctpu_to_host(l, &v, 4), CTPU_ERR_DEVICE_FAULT);
        snprintf(msg[m], sizeof msg[m], "%s", ctpu_last_error());
        ck_assert_msg(strstr(msg[m], "cross_entropy (op #6): labels 7 at position 1 is out of range [0, 5) (2 bad "
                                     "indices)") == msg[m], "mode %d: %s", m, msg[m]);
        ck_assert_msg(ctpu_to_host(g, gr[m], sizeof gr[m]) == CTPU_OK, "mode %d: grad: %s", m, ctpu_last_error());
        ck_assert_msg(ctpu_to_host_as_f32(c, &cnt[m], 4) == CTPU_OK, "mode %d: count: %s", m, ctpu_last_error());
        ctpu_release(g);
        ctpu_release(c);
        ctpu_zero_grad(x);
        ctpu_release(l);
        ctpu_release(x);
        ctpu_release(y);
    }
    ck_assert_str_eq(msg[0], msg[1]);
    ck_assert(memcmp(gr[0], gr[1], sizeof gr[0]) == 0);
    ck_assert(cnt[0] == 3.0f && cnt[1] == 3.0f);
}
END_TEST

/* ------------------------------------------------------------ the VM's tape
 * The register-resident tape (kernels.h ctpu_k_tape) and the block kernels
 * one instruction at a time (ctpu__test_vm_tape(false)) against strict:
 * broadcast operands, a value read again after other ops (a register
 * store), where / clamp / full / pow / exp, bf16 inputs, ops and outputs
 * beside f32 ones, sizes with masked tails, a producer fused into a sum. */
static int p_tape_bcast(ctpu_tensor *o)
{
    ctpu_tensor a = randn(3, (int64_t[]){ 6, 1, 77 }, 1), b = randn(3, (int64_t[]){ 1, 9, 77 }, 1);
    ctpu_tensor c = randn(1, (int64_t[]){ 77 }, 1);
    pat_begin();
    ctpu_tensor t = ctpu_add(a, b);                        /* [6, 9, 77]: 4158 elements, a masked tail */
    ctpu_tensor u = ctpu_mul(ctpu_exp(ctpu_mul_scalar(t, 0.5)), c);
    ctpu_tensor w = ctpu_where(ctpu_gt(t, c), u, ctpu_clamp(t, -0.5, 0.75));   /* t read again */
    ctpu_tensor f = ctpu_full(CTPU_F32, 3, (int64_t[]){ 6, 9, 77 }, 0.375);
    o[0] = out(ctpu_add(ctpu_pow(ctpu_abs(w), f), ctpu_rsub_scalar(t, 2.0)));
    o[1] = out(u);
    pat_end();
    return 2;
}

static int p_tape_bf16(ctpu_tensor *o)
{
    ctpu_tensor x = randn(1, (int64_t[]){ 1003 }, 2), y = randn(1, (int64_t[]){ 1003 }, 1);
    pat_begin();
    ctpu_tensor xb = ctpu_cast(x, CTPU_BF16);
    ctpu_tensor e = ctpu_sigmoid(ctpu_mul_scalar(xb, 1.5));   /* bf16 ops: each rounded */
    ctpu_tensor z = ctpu_add(ctpu_cast(e, CTPU_F32), y);      /* mixed: back to f32 */
    o[0] = out(ctpu_mul_scalar(e, 3.0));                      /* a bf16 output */
    o[1] = out(ctpu_maximum(z, ctpu_sub_scalar(y, 0.25)));
    o[2] = out(e);
    pat_end();
    return 3;
}

static int p_tape_reduce(ctpu_tensor *o)
{
    ctpu_tensor x = randn(2, (int64_t[]){ 7, 5003 }, 1), w = randn(2, (int64_t[]){ 1, 5003 }, 1);
    pat_begin();
    o[0] = out(ctpu_sum(ctpu_mul(ctpu_tanh(x), w), 1, (int[]){ 1 }, false));
    pat_end();
    return 1;
}

START_TEST(vm_tape)
{
    for (int on = 1; on >= 0; on--) {
        ctpu__test_vm_tape(on);
        check_pattern("tape: broadcast, where, clamp, full, pow", p_tape_bcast, 1);
        check_pattern("tape: bf16 ops and outputs beside f32", p_tape_bf16, 1);
        check_pattern("tape: a producer into a sum", p_tape_reduce, 1);
        check_pattern("tape: 8 MiB chain, two live-outs", p_stream_store, 1);
    }
    ctpu__test_vm_tape(true);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fusion");
    TCase *p = tcase_create("patterns");
    tcase_add_checked_fixture(p, t_setup, t_teardown);
    tcase_set_timeout(p, 240);
    tcase_add_test(p, matmul_epilogues);
    tcase_add_test(p, small_broadcast_producers);
    tcase_add_test(p, stream_stores);
    tcase_add_test(p, stream_stores_threads);
    tcase_add_test(p, vm_tape);
    tcase_add_test(p, nll_fault_parity);
    tcase_add_test(p, loss_step_fault_parity);
    tcase_add_test(p, row_groups);
    tcase_add_test(p, loss_steps);
    tcase_add_test(p, column_reductions);
    tcase_add_test(p, shared_panels);
    tcase_add_test(p, shared_panels_kernel);
    suite_add_tcase(s, p);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
