/* bench/matmul: the MXU matmul kernels against this machine's limits.
 *
 * Prints `name value unit` lines:
 *   peak_bf16_{1,2}t, peak_fp32_{1,2}t   register-only vdpbf16ps / vfmadd231ps
 *                                        loops (GFLOP/s, 2 flops per MAC)
 *   matmul_{f32in,bf16in}_<n>_{1,2}t     square n^3, n = 128 .. 2048
 *   matmul_mlp_<shape>_{1,2}t            the training demo's shapes, fp32 in
 *   matmul_gpt_<shape>_{1,2}t            char_gpt's default shapes, fp32 in
 *   sgemm_openblas_<...>_{1,2}t          OpenBLAS sgemm on the same shapes
 *   sgemm_onednn_<...>_{1,2}t            oneDNN's dnnl_sgemm (f32) on the same shapes
 *   mxu_probe_ms, mxu_probe_cpu_ms       the init probe that chose the AVX-512
 *                                        micro-kernel (stderr names the winner)
 *   ratio_*                              the targets: _vs_limit against
 *                                        max(peak_fp32_1t, peak_bf16_1t) (the
 *                                        exact-emulation limit), _vs_openblas /
 *                                        _vs_onednn per shape (1 thread),
 *                                        _2t_vs_1t at 1024^3
 * argv[1] keeps only the lines whose names contain it, or any of its
 * comma-separated parts (`peak,_1t`: the 1-thread lines and their limit).
 * Each anchor is optional: a `# skip` line on stderr when it is absent.
 * Every ctpu result is validated against ctpu_k_matmul_ref (bit for bit, on
 * sampled rows for the big shapes) before timing; times are medians (of
 * samples of at least 5e7 FLOP) of
 * thread CPU time (ctpu at 2 threads: the critical path, timed_call; the
 * anchors at 2 threads: wall time, as their threads are not ours).
 * OpenBLAS reads OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE when it loads, and this
 * machine pins them to old kernels: the program re-executes itself without
 * them before anything else. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <immintrin.h>
#include "kernels.h"
#include "mxu.h"
#ifdef CTPU_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef CTPU_HAVE_ONEDNN
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif
#include "bench.h"
#include "peak.h"

static double now(void) { return bench_clock(CLOCK_MONOTONIC); }

/* This thread's CPU time: the machine is shared, so a preempted thread's
 * waiting is not counted (wall-clock times here were noise at load 10-20). */
static double cpu_now(void) { return bench_clock(CLOCK_THREAD_CPUTIME_ID); }

/* ---- a small persistent pool: spin briefly, then wait on a condvar -------- */
typedef struct {
    ctpu_k_pool base;
    pthread_t th[8];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen, done;
    atomic_int quit;
    void (*fn)(void *, int, int);
    void *ctx;
    double cpu[8];         /* each participant's thread CPU time in the last run */
    double crit, own;      /* summed over runs: the slowest participant's, the caller's */
} bpool;
typedef struct { bpool *p; int tid; } bpool_arg;
static bpool_arg bpool_args[8];

static void *bpool_main(void *v)
{
    bpool_arg *a = v;
    bpool *p = a->p;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < 20000) { _mm_pause(); continue; }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        if (atomic_load(&p->quit)) return NULL;
        seen = g;
        double c0 = cpu_now();
        p->fn(p->ctx, a->tid, p->base.nthreads);
        p->cpu[a->tid] = cpu_now() - c0;
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

static void bpool_run(ctpu_k_pool *base, void (*fn)(void *, int, int), void *ctx)
{
    bpool *p = (bpool *)base;
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->done, 0);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    double c0 = cpu_now();
    fn(ctx, 0, base->nthreads);
    p->cpu[0] = cpu_now() - c0;
    int spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) != (unsigned)(base->nthreads - 1))
        if (++spins < 4000) _mm_pause();
        else sched_yield();     /* a worker waiting for a core: give it ours */
    double mx = 0;
    for (int t = 0; t < base->nthreads; t++) mx = p->cpu[t] > mx ? p->cpu[t] : mx;
    p->crit += mx;
    p->own += p->cpu[0];
}

static void bpool_start(bpool *p, int nt)
{
    memset(p, 0, sizeof *p);
    p->base = (ctpu_k_pool){ .nthreads = nt, .run = bpool_run, .impl = p };
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (int t = 1; t < nt; t++) {
        bpool_args[t] = (bpool_arg){ p, t };
        pthread_create(&p->th[t], NULL, bpool_main, &bpool_args[t]);
    }
}

static void bpool_stop(bpool *p)
{
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int t = 1; t < p->base.nthreads; t++) pthread_join(p->th[t], NULL);
}

/* ---- peak rates: register-only loops ---------------------------------------- */
#define PEAK_ITERS 20000000L
typedef struct { int bf16; double sink; } peak_ctx;

static void peak_task(void *v, int tid, int nt)
{
    (void)tid; (void)nt;
    peak_ctx *p = v;
    double s = p->bf16 ? peak_bf16_loop(PEAK_ITERS) : peak_fp32_run(PEAK_ITERS);
    if (s == 12345.678) p->sink = s;
}

/* Seconds of one call of fn on pool (NULL: this thread): thread CPU time on
 * the critical path, i.e. the caller's own time outside pool runs plus, per
 * run, the slowest participant's CPU time (what the call takes when each
 * thread has a core of its own). */
static double timed_call(bpool *pool, void (*fn)(void *), void *arg)
{
    double c0 = cpu_now();
    if (!pool) { fn(arg); return cpu_now() - c0; }
    double crit0 = pool->crit, own0 = pool->own;
    fn(arg);
    double total = cpu_now() - c0;
    return total - (pool->own - own0) + (pool->crit - crit0);
}

typedef struct { ctpu_k_pool *pool; peak_ctx *c; } peak_call;
static void peak_fn(void *v)
{
    peak_call *pc = v;
    if (pc->pool) pc->pool->run(pc->pool, peak_task, pc->c);
    else peak_task(pc->c, 0, 1);
}

/* GFLOP/s of the register loop on nt threads (median of 5). */
static double peak_rate(ctpu_k_pool *pool, int bf16)
{
    double t[5];
    peak_ctx c = { bf16, 0 };
    peak_call pc = { pool, &c };
    for (int r = 0; r < 5; r++) t[r] = timed_call(pool ? pool->impl : NULL, peak_fn, &pc);
    qsort(t, 5, sizeof t[0], cmp_d);
    int nt = pool ? pool->nthreads : 1;
    /* per instruction: 16 lanes x 2 MACs (bf16 pairs) or 16 (8: ymm) lanes x 1 MAC */
    double flops = (double)PEAK_ITERS * (bf16 ? peak_flop_per_iter(1) : peak_fp32_flop_per_iter()) * nt;
    return flops / t[2] * 1e-9;
}

/* ---- matmul problems ---------------------------------------------------------- */
typedef struct {
    const char *name;
    int64_t M, N, K;
    int ta, tb;          /* A given as [K,M] / B given as [N,K] (backward) */
    int dt;              /* input dtype; output: same (bf16 @ bf16 -> bf16) */
    int64_t batch;       /* 0 or 1: one product; else a batch of them (attention) */
} shape;
static int64_t nbatch(const shape *s) { return s->batch > 1 ? s->batch : 1; }

static uint64_t rs = 0x2545f4914f6cdd1dull;
static float frand(void)
{
    rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17;
    return (float)((rs >> 40) * 0x1p-24) * 2.0f - 1.0f;
}

static ctpu_mm_args make_args(const shape *s, void **bufs)
{
    size_t es = ctpu_kdt_size(s->dt);
    int64_t nb = nbatch(s);
    void *a = malloc((size_t)(nb * s->M * s->K) * es), *b = malloc((size_t)(nb * s->K * s->N) * es),
         *c = malloc((size_t)(nb * s->M * s->N) * es);
    for (int64_t i = 0; i < nb * s->M * s->K; i++) {
        if (s->dt == CTPU_KDT_BF16) ((uint16_t *)a)[i] = ctpu_f32_to_bf16(frand());
        else ((float *)a)[i] = frand();
    }
    for (int64_t i = 0; i < nb * s->K * s->N; i++) {
        if (s->dt == CTPU_KDT_BF16) ((uint16_t *)b)[i] = ctpu_f32_to_bf16(frand());
        else ((float *)b)[i] = frand();
    }
    bufs[0] = a; bufs[1] = b; bufs[2] = c;
    ctpu_mm_args g = { .batch = nb, .M = s->M, .N = s->N, .K = s->K,
        .a = a, .a_dtype = s->dt, .a_rs = s->ta ? 1 : s->K, .a_cs = s->ta ? s->M : 1, .a_bs = s->M * s->K,
        .b = b, .b_dtype = s->dt, .b_rs = s->tb ? 1 : s->N, .b_cs = s->tb ? s->K : 1, .b_bs = s->K * s->N,
        .c = c, .c_dtype = s->dt, .ldc = s->N, .c_bs = s->M * s->N };
    return g;
}

/* ctpu's result == _ref on sampled rows (all rows for small shapes) of the
 * first and last batch elements. */
static int validate(const ctpu_mm_args *g)
{
    size_t es = ctpu_kdt_size(g->c_dtype), ea = ctpu_kdt_size(g->a_dtype), eb = ctpu_kdt_size(g->b_dtype);
    int64_t step = g->M * g->N * g->K <= (1 << 24) ? 1 : g->M / 3;
    if (step < 1) step = 1;
    void *row = malloc((size_t)g->N * es);
    int ok = 1;
    for (int64_t bi = 0; bi < g->batch && ok; bi += g->batch > 1 ? g->batch - 1 : 1)
        for (int64_t m = 0; m < g->M && ok; m += step) {
            ctpu_mm_args r = *g;
            r.M = 1;
            r.batch = 1;
            r.a = (const char *)g->a + (size_t)(bi * g->a_bs + m * g->a_rs) * ea;
            r.b = (const char *)g->b + (size_t)(bi * g->b_bs) * eb;
            r.c = row;
            ctpu_k_matmul_ref(&r);
            const char *cr = (const char *)g->c + (size_t)(bi * g->c_bs + m * g->ldc) * es;
            if (memcmp(cr, row, (size_t)g->N * es) != 0) ok = 0;
            if (m != g->M - 1 && m + step >= g->M) m = g->M - 1 - step;   /* last row too */
        }
    free(row);
    return ok;
}

/* A sample is `inner` calls of at least 5e7 FLOP in all (the thread CPU
 * clock is a system call, ~0.5 us here: not to be paid per 5 us call);
 * reps samples, their median. */
static int inner_for(double flop) { int n = (int)(5e7 / flop); return n < 1 ? 1 : n; }
static int reps_for(double flop) { int r = (int)(4e10 / flop); return r < 5 ? 5 : r > 40 ? 40 : r; }
static double shape_flop(const shape *s) { return 2.0 * (double)nbatch(s) * (double)s->M * (double)s->N * (double)s->K; }

typedef struct { ctpu_mm_args *g; ctpu_k_pool *pool; int inner; } mm_call;
static void mm_fn(void *v)
{
    mm_call *c = v;
    for (int i = 0; i < c->inner; i++) ctpu_k_matmul(c->g, c->pool);
}

/* Median GFLOP/s of ctpu_k_matmul on nt threads (critical-path thread CPU
 * time, timed_call); validated first. */
static double bench_ctpu(const shape *s, ctpu_k_pool *pool)
{
    void *bufs[3];
    ctpu_mm_args g = make_args(s, bufs);
    ctpu_k_matmul(&g, pool);
    if (!validate(&g)) {
        fprintf(stderr, "matmul: %s differs from _ref\n", s->name);
        exit(1);
    }
    double flop = shape_flop(s);
    int inner = inner_for(flop), reps = reps_for(flop * inner);
    double *t = malloc(sizeof(double) * (size_t)reps);
    mm_call mc = { &g, pool, inner };
    for (int r = 0; r < reps; r++) t[r] = timed_call(pool ? pool->impl : NULL, mm_fn, &mc);
    double gf = flop * inner / median(t, reps) * 1e-9;
    free(t);
    free(bufs[0]); free(bufs[1]); free(bufs[2]);
    return gf;
}

#if defined(CTPU_HAVE_OPENBLAS) || defined(CTPU_HAVE_ONEDNN)
/* Row-major f32 C = A B (A, B transposed as the shape says) by library `lib`;
 * a batch as one call per element. */
static void sgemm_call(int lib, const shape *s, const float *a, const float *b, float *c)
{
    int lda = s->ta ? (int)s->M : (int)s->K, ldb = s->tb ? (int)s->K : (int)s->N;
    for (int64_t bi = 0; bi < nbatch(s); bi++) {
        const float *ab = a + bi * s->M * s->K, *bb = b + bi * s->K * s->N;
        float *cb = c + bi * s->M * s->N;
#ifdef CTPU_HAVE_OPENBLAS
        if (lib == 0)
            cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
                        (int)s->M, (int)s->N, (int)s->K, 1.0f, ab, lda, bb, ldb, 0.0f, cb, (int)s->N);
#endif
#ifdef CTPU_HAVE_ONEDNN
        if (lib == 1)
            dnnl_sgemm(s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->M, s->N, s->K, 1.0f, ab, lda, bb, ldb, 0.0f, cb,
                       s->N);
#endif
        (void)lib; (void)lda; (void)ldb; (void)ab; (void)bb; (void)cb;
    }
}

/* Median GFLOP/s of library `lib` (0 OpenBLAS, 1 oneDNN) on nt threads:
 * 1 thread in this thread's CPU time (the library runs on the caller), 2
 * threads in wall time (its own threads, which we cannot clock). */
static double bench_sgemm(const shape *s, int nt, int lib)
{
#ifdef CTPU_HAVE_OPENBLAS
    if (lib == 0) openblas_set_num_threads(nt);
#endif
#ifdef CTPU_HAVE_ONEDNN
    if (lib == 1) omp_set_num_threads(nt);
#endif
    shape f = *s;
    f.dt = CTPU_KDT_F32;
    void *bufs[3];
    ctpu_mm_args g = make_args(&f, bufs);
    double flop = shape_flop(s);
    int inner = inner_for(flop), reps = reps_for(flop * inner);
    double *t = malloc(sizeof(double) * (size_t)reps);
    double (*clk)(void) = nt > 1 ? now : cpu_now;
    for (int r = -1; r < reps; r++) {
        double t0 = clk();
        for (int i = 0; i < inner; i++) sgemm_call(lib, s, bufs[0], bufs[1], bufs[2]);
        if (r >= 0) t[r] = clk() - t0;
    }
    (void)g;
    double gf = flop * inner / median(t, reps) * 1e-9;
    free(t);
    free(bufs[0]); free(bufs[1]); free(bufs[2]);
    return gf;
}
#endif

static const char *filter;   /* argv[1]: run only the lines whose name contains it (or, comma-separated, any of them) */
static int want(const char *name)
{
    if (!filter) return 1;
    for (const char *f = filter; *f;) {
        const char *e = strchr(f, ',');
        size_t n = e ? (size_t)(e - f) : strlen(f);
        for (const char *q = name; n && *q; q++)
            if (!strncmp(q, f, n)) return 1;
        if (!e) break;
        f = e + 1;
    }
    return 0;
}
static void line(const char *name, double v, const char *unit) { printf("%s %.4g %s\n", name, v, unit); fflush(stdout); }

/* OpenBLAS picks its kernels when it loads. Drop the machine's pins; and
 * where its own detection does not know this CPU (on this VM it falls
 * back to Prescott, SSE3), ask for its AVX-512 kernels by name: the
 * anchor is OpenBLAS at its best here. Re-executed once (marker). */
static void openblas_reexec(char **argv)
{
#ifdef CTPU_HAVE_OPENBLAS
    if (!getenv("CTPU_BENCH_REEXEC")) {
        const char *core = openblas_get_corename();
        int avx512_core = core && (strcasestr(core, "skylakex") || strcasestr(core, "cooperlake") ||
                                   strcasestr(core, "sapphire"));
        int pinned = getenv("OPENBLAS_CORETYPE") || getenv("OPENBLAS_L2_SIZE");
        if (pinned || (!avx512_core && __builtin_cpu_supports("avx512f"))) {
            unsetenv("OPENBLAS_L2_SIZE");
            if (!avx512_core && __builtin_cpu_supports("avx512f")) setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
            else unsetenv("OPENBLAS_CORETYPE");
            setenv("CTPU_BENCH_REEXEC", "1", 1);
            execv("/proc/self/exe", argv);
        }
    }
    fprintf(stderr, "# openblas core %s\n", openblas_get_corename());
#endif
    (void)argv;
}

/* CTPU_ISA or the detected ISA for the kernels; prints the MXU kernel the
 * probe chose (and the probe's own lines); 1 when the ISA is unavailable. */
static int select_isa(void)
{
    ctpu_isa isa = ctpu_isa_detect();
    const char *force = getenv("CTPU_ISA");
    if (force)
        for (int i = 0; i < CTPU_ISA_COUNT; i++)
            if (!strcmp(force, ctpu_isa_name((ctpu_isa)i))) isa = (ctpu_isa)i;
    if (!ctpu_kernels_set_isa(isa)) { fprintf(stderr, "matmul: ISA %s unavailable\n", ctpu_isa_name(isa)); return 1; }
    fprintf(stderr, "# isa %s\n", ctpu_isa_name(isa));
    const ctpu_mxu_impl *mi = ctpu_mxu_current();
    const ctpu_mxu_probe_info *pi = ctpu_mxu_probe_result();
    if (pi)
        fprintf(stderr, "# mxu kernel %s (%s) %dx%d; probe: FMA %.1f, vdpbf16ps %.1f GFLOP/s in %.2f ms (%.2f ms CPU)\n",
                mi->name, mi == &ctpu_mxu_impl_avx512_dp ? "vdpbf16ps" : "FMA", mi->mr, mi->nr,
                pi->rate[0] * 1e-9, pi->rate[1] * 1e-9, pi->ms, pi->cpu_ms);
    else
        fprintf(stderr, "# mxu kernel %s %dx%d (no probe on this ISA)\n", mi->name, mi->mr, mi->nr);
    if (pi && want("mxu_probe")) {
        line("mxu_probe_ms", pi->ms, "ms");
        line("mxu_probe_cpu_ms", pi->cpu_ms, "ms");
    }
#ifndef CTPU_HAVE_OPENBLAS
    fprintf(stderr, "# skip sgemm_openblas: OpenBLAS not found at build time (tools/install-deps.sh --bench)\n");
#endif
#ifndef CTPU_HAVE_ONEDNN
    fprintf(stderr, "# skip sgemm_onednn: oneDNN not found at build time (tools/install-deps.sh --bench)\n");
#endif
    return 0;
}

/* The ratio lines: against the exact-emulation limit, the anchors, 2 threads. */
static void print_ratios(const shape *sh, int nsh, int nsq, double ct[][2][3], double an[][2][3], double limit)
{
    static const char *lib_name[2] = { "openblas", "onednn" };
    char name[128];
    if (limit > 0)
        for (int i = 2; i < nsq; i++)
            for (int dt = 0; dt < 2; dt++)
                if (ct[i][dt][1] > 0) {
                    snprintf(name, sizeof name, "ratio_%s_%s_vs_limit_1t", dt ? "bf16in" : "f32in", sh[i].name);
                    line(name, ct[i][dt][1] / limit, "x");
                }
    if (limit > 0 && ct[nsq][0][1] > 0) line("ratio_mlp_fwd1_vs_limit_1t", ct[nsq][0][1] / limit, "x");
    for (int lib = 0; lib < 2; lib++)
        for (int i = 0; i < nsh; i++)
            if (ct[i][0][1] > 0 && an[i][lib][1] > 0) {
                snprintf(name, sizeof name, "ratio_%s_vs_%s_1t", sh[i].name, lib_name[lib]);
                line(name, ct[i][0][1] / an[i][lib][1], "x");
            }
    if (ct[3][0][1] > 0 && ct[3][0][2] > 0) line("ratio_2t_vs_1t", ct[3][0][2] / ct[3][0][1], "x");
    if (ct[3][1][1] > 0 && ct[3][1][2] > 0) line("ratio_bf16in_2t_vs_1t", ct[3][1][2] / ct[3][1][1], "x");
}

int main(int argc, char **argv)
{
    if (argc > 1) filter = argv[1];
    openblas_reexec(argv);
    if (select_isa()) return 1;
    bpool p2;
    bpool_start(&p2, 2);
    ctpu_k_pool *pools[3] = { NULL, NULL, &p2.base };

    double pk_bf16_1 = 0, pk_bf16_2 = 0, pk_fp32_1 = 0, pk_fp32_2 = 0;
    if (__builtin_cpu_supports("avx512bf16") && want("peak")) {
        pk_bf16_1 = peak_rate(NULL, 1);
        pk_bf16_2 = peak_rate(&p2.base, 1);
        line("peak_bf16_1t", pk_bf16_1, "GFLOP/s");
        line("peak_bf16_2t", pk_bf16_2, "GFLOP/s");
    }
    if (peak_fp32_avail() && want("peak")) {   /* zmm, or ymm where there is no AVX-512 */
        pk_fp32_1 = peak_rate(NULL, 0);
        pk_fp32_2 = peak_rate(&p2.base, 0);
        line("peak_fp32_1t", pk_fp32_1, "GFLOP/s");
        line("peak_fp32_2t", pk_fp32_2, "GFLOP/s");
    }
    double limit = pk_fp32_1 > pk_bf16_1 ? pk_fp32_1 : pk_bf16_1;

    /* every shape: name, ctpu f32/bf16 results [1t, 2t], anchors [lib][1t, 2t] */
    enum { NSQ = 5, NDEMO = 8, NGPT = 7, NSH = NSQ + NDEMO + NGPT };
    /* The demo MLP 784 -> 256 -> 128 -> 10, batch 128: forward Y = X W,
     * backward dX = dY W^T (B transposed), dW = X^T dY (A transposed). */
    shape sh[NSH] = {
        { "512", 0, 0, 0, 0, 0, 0, 0 },
        [NSQ] = { "mlp_fwd1", 128, 256, 784, 0, 0, 0, 1 }, { "mlp_fwd2", 128, 128, 256, 0, 0, 0, 1 },
        { "mlp_fwd3", 128, 10, 128, 0, 0, 0, 1 },
        { "mlp_bwd1_dw", 784, 256, 128, 1, 0, 0, 1 },
        { "mlp_bwd2_dx", 128, 256, 128, 0, 1, 0, 1 }, { "mlp_bwd2_dw", 256, 128, 128, 1, 0, 0, 1 },
        { "mlp_bwd3_dx", 128, 128, 10, 0, 1, 0, 1 }, { "mlp_bwd3_dw", 128, 10, 128, 1, 0, 0, 1 },
        /* char_gpt's default (batch 32, ctx 128, dmodel 128, 4 heads of 32):
         * rows B*T = 4096; q/k/v/out projections, the MLP (4 x dmodel), the
         * tied head (vocab 96) as x wte^T, a projection's weight gradient
         * (K = 4096), and attention's two products per (batch, head) */
        { "gpt_proj", 4096, 128, 128, 0, 0, 0, 1 }, { "gpt_mlp_up", 4096, 512, 128, 0, 0, 0, 1 },
        { "gpt_mlp_down", 4096, 128, 512, 0, 0, 0, 1 }, { "gpt_head", 4096, 96, 128, 0, 1, 0, 1 },
        { "gpt_proj_dw", 128, 128, 4096, 1, 0, 0, 1 },
        { "gpt_att_qk", 128, 128, 32, 0, 1, 0, 128 }, { "gpt_att_pv", 128, 32, 128, 0, 0, 0, 128 },
    };
    static const char *sq_names[NSQ] = { "128", "256", "512", "1024", "2048" };
    for (int i = 0; i < NSQ; i++) {
        int64_t n = 128 << i;
        sh[i] = (shape){ sq_names[i], n, n, n, 0, 0, CTPU_KDT_F32, 1 };
    }
    double ct[NSH][2][3] = { { { 0 } } }, an[NSH][2][3] = { { { 0 } } };
    char name[128];
    for (int i = 0; i < NSQ; i++)
        for (int dt = 0; dt < 2; dt++)
            for (int nt = 1; nt <= 2; nt++) {
                shape s = sh[i];
                s.dt = dt ? CTPU_KDT_BF16 : CTPU_KDT_F32;
                snprintf(name, sizeof name, "matmul_%s_%s_%dt", dt ? "bf16in" : "f32in", sh[i].name, nt);
                if (!want(name)) continue;
                ct[i][dt][nt] = bench_ctpu(&s, pools[nt]);
                line(name, ct[i][dt][nt], "GFLOP/s");
            }
    for (int i = NSQ; i < NSH; i++)
        for (int nt = 1; nt <= 2; nt++) {
            snprintf(name, sizeof name, "matmul_%s_%dt", sh[i].name, nt);
            if (!want(name)) continue;
            ct[i][0][nt] = bench_ctpu(&sh[i], pools[nt]);
            line(name, ct[i][0][nt], "GFLOP/s");
        }
    static const char *lib_name[2] = { "openblas", "onednn" };
    for (int lib = 0; lib < 2; lib++) {
#ifndef CTPU_HAVE_OPENBLAS
        if (lib == 0) continue;
#endif
#ifndef CTPU_HAVE_ONEDNN
        if (lib == 1) continue;
#endif
        for (int i = 0; i < NSH; i++)
            for (int nt = 1; nt <= 2; nt++) {
                snprintf(name, sizeof name, "sgemm_%s_%s_%dt", lib_name[lib], sh[i].name, nt);
                if (!want(name)) continue;
#if defined(CTPU_HAVE_OPENBLAS) || defined(CTPU_HAVE_ONEDNN)
                an[i][lib][nt] = bench_sgemm(&sh[i], nt, lib);
#endif
                line(name, an[i][lib][nt], "GFLOP/s");
            }
    }
    print_ratios(sh, NSH, NSQ, ct, an, limit);
    (void)pk_fp32_2; (void)pk_bf16_2;
    bpool_stop(&p2);
    return 0;
}
