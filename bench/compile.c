/* Compiled steps (issue 17) against strict eager, debug eager and defer and
 * fuse (the four modes), side by side in one run, on the demo's MLP training step and on a small GPT step
 * (char_gpt's model: --layers 2 --dmodel 32 --heads 2 --ctx 16 --batch 2,
 * vocab 64, AdamW in two groups, capturable). Each mode's weights after the
 * warm-up steps are checked bit-identical to strict eager's before timing.
 *
 * host time per step: the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID)
 * over a run of step calls (no sync inside it) divided by the steps, not
 * waiting for the device; steps/s: wall time of a run
 * of steps, ended by a sync. Medians of 7 runs. Prints `name value unit`.
 * CTPU_NUM_THREADS picks the kernel threads (the targets are at 1).
 *
 * `compile <mlp|gpt>-<strict|debug|fused|compiled>` runs only that step in
 * that mode (its timing lines and the number of calls), for profiles; with
 * `compile gpt-compiled` it is the callgrind
 * harness for the replay path (valgrind is not a dependency; run it by hand):
 *   valgrind --tool=callgrind --separate-threads=yes --toggle-collect=ctpu_compiled_call ./compile gpt-compiled
 * and divide the calling thread's Ir by the calls it prints. */
#include <ctpu.h>
#include <ctpu_nn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "bench/compile: %s failed: %s\n", #x, ctpu_last_error()); exit(1); } } while (0)


/* ------------------------------------------------------------ models */
#define MAXP 256
typedef struct {
    ctpu_tensor p[MAXP], decay[MAXP], nodecay[MAXP];
    int np, nd, nn;
    ctpu_optim *opt;
    bool gpt;
    int64_t L, D, H, hd, T, V, B;
    ctpu_tensor mask;
} model;

static ctpu_tensor mk(model *m, int nd, const int64_t *s, double std, double fill)
{
    ctpu_tensor t = std > 0 ? ctpu_rand_normal(CTPU_F32, nd, s, 0, std) : ctpu_full(CTPU_F32, nd, s, fill);
    ctpu_keep(t);
    ctpu_set_requires_grad(t, true);
    m->p[m->np++] = t;
    if (nd >= 2) m->decay[m->nd++] = t;
    else m->nodecay[m->nn++] = t;
    return t;
}

static int g_layers = 2;   /* the GPT step's layers (the 6-layer line: host time by op count) */

static void model_init(model *m, bool gpt)
{
    memset(m, 0, sizeof *m);
    ctpu_manual_seed(1);
    m->gpt = gpt;
    if (!gpt) {
        int64_t s1[2] = { 784, 256 }, b1 = 256, s2[2] = { 256, 128 }, b2 = 128, s3[2] = { 128, 10 }, b3 = 10;
        mk(m, 2, s1, 0.05, 0); mk(m, 1, &b1, 0, 0);
        mk(m, 2, s2, 0.08, 0); mk(m, 1, &b2, 0, 0);
        mk(m, 2, s3, 0.1, 0);  mk(m, 1, &b3, 0, 0);
    } else {
        m->L = g_layers, m->D = 32, m->H = 2, m->hd = 16, m->T = 16, m->V = 64, m->B = 2;
        int64_t D = m->D, te[2] = { m->V, D }, pe[2] = { m->T, D }, dd[2] = { D, D }, d4[2] = { D, 4 * D },
                d4t[2] = { 4 * D, D }, f4 = 4 * D;
        double proj = 0.02 / sqrt(2.0 * (double)m->L);
        mk(m, 2, te, 0.02, 0);
        mk(m, 2, pe, 0.02, 0);
        for (int l = 0; l < m->L; l++) {
            mk(m, 1, &D, 0, 1); mk(m, 1, &D, 0, 0);                        /* ln1 */
            for (int k = 0; k < 3; k++) { mk(m, 2, dd, 0.02, 0); mk(m, 1, &D, 0, 0); }   /* q, k, v */
            mk(m, 2, dd, proj, 0); mk(m, 1, &D, 0, 0);                     /* o */
            mk(m, 1, &D, 0, 1); mk(m, 1, &D, 0, 0);                        /* ln2 */
            mk(m, 2, d4, 0.02, 0); mk(m, 1, &f4, 0, 0);
            mk(m, 2, d4t, proj, 0); mk(m, 1, &D, 0, 0);
        }
        mk(m, 1, &D, 0, 1); mk(m, 1, &D, 0, 0);                            /* lnf */
        m->mask = ctpu_keep(ctpu_causal_mask(m->T, m->T, CTPU_MASK_ADDITIVE));
    }
    ctpu_param_group g[2] = { { m->decay, m->nd, 1.0, 0.1 }, { m->nodecay, m->nn, 1.0, 0.0 } };
    ctpu_adamw_opts ao = ctpu_adamw_defaults();
    m->opt = ctpu_adamw_create_groups(2, g, &ao);
    CHECK(m->opt && ctpu_optim_set_capturable(m->opt, true) == CTPU_OK);
    CHECK(ctpu_sync() == CTPU_OK);
}

static void model_free(model *m)
{
    ctpu_optim_zero_grad(m->opt);
    ctpu_optim_free(m->opt);
    for (int i = 0; i < m->np; i++) ctpu_release(m->p[i]);
    if (m->gpt) ctpu_release(m->mask);
}

static ctpu_tensor heads(const model *m, ctpu_tensor t)
{
    int64_t s[4] = { m->B, m->T, m->H, m->hd };
    static const int perm[4] = { 0, 2, 1, 3 };
    return ctpu_permute(ctpu_reshape(t, 4, s), perm);
}

static ctpu_tensor lin(ctpu_tensor x, ctpu_tensor w, ctpu_tensor b) { return ctpu_add(ctpu_matmul(x, w), b); }

static ctpu_tensor gpt_loss(const model *m, ctpu_tensor x, ctpu_tensor y)
{
    const ctpu_tensor *p = m->p;
    ctpu_tensor h = ctpu_add(ctpu_embedding(p[0], x), p[1]);
    static const int perm[4] = { 0, 2, 1, 3 };
    int k = 2;
    for (int l = 0; l < m->L; l++) {
        ctpu_tensor a = ctpu_layer_norm(h, p[k], p[k + 1], 1e-5);
        ctpu_tensor q = heads(m, lin(a, p[k + 2], p[k + 3])), kk = heads(m, lin(a, p[k + 4], p[k + 5]));
        ctpu_tensor v = heads(m, lin(a, p[k + 6], p[k + 7]));
        ctpu_tensor att = ctpu_add(ctpu_mul_scalar(ctpu_matmul_t(q, kk, false, true), 1.0 / sqrt((double)m->hd)), m->mask);
        ctpu_tensor o = ctpu_contiguous(ctpu_permute(ctpu_matmul(ctpu_softmax(att, -1), v), perm));
        int64_t s3[3] = { m->B, m->T, m->D };
        h = ctpu_add(h, lin(ctpu_reshape(o, 3, s3), p[k + 8], p[k + 9]));
        ctpu_tensor f = ctpu_layer_norm(h, p[k + 10], p[k + 11], 1e-5);
        h = ctpu_add(h, lin(ctpu_gelu(lin(f, p[k + 12], p[k + 13]), false), p[k + 14], p[k + 15]));
        k += 16;
    }
    h = ctpu_layer_norm(h, p[k], p[k + 1], 1e-5);
    ctpu_tensor logits = ctpu_matmul_t(h, p[0], false, true);
    int64_t s2[2] = { m->B * m->T, m->V }, s1 = m->B * m->T;
    ctpu_ce_opts ce = ctpu_ce_defaults();
    return ctpu_cross_entropy(ctpu_reshape(logits, 2, s2), ctpu_reshape(y, 1, &s1), &ce);
}

static ctpu_tensor mlp_loss(const model *m, ctpu_tensor x, ctpu_tensor y1h)
{
    const ctpu_tensor *p = m->p;
    ctpu_tensor h = ctpu_relu(lin(x, p[0], p[1]));
    h = ctpu_relu(lin(h, p[2], p[3]));
    ctpu_tensor lp = ctpu_log_softmax(lin(h, p[4], p[5]), 1);
    return ctpu_neg(ctpu_mean(ctpu_sum(ctpu_mul(lp, y1h), 1, (int[]){ 1 }, false), 0, NULL, false));
}

/* The step: zero_grad, forward, backward, the schedule's lr, AdamW. */
static ctpu_status step_fn(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    model *m = ctx;
    ctpu_optim_zero_grad(m->opt);
    ctpu_tensor loss = m->gpt ? gpt_loss(m, in[0], in[1]) : mlp_loss(m, in[0], in[1]);
    ctpu_status st = ctpu_backward(loss);
    if (st == CTPU_OK) st = ctpu_optim_set_lr(m->opt, sc[0]);
    if (st == CTPU_OK) st = ctpu_optim_step(m->opt);
    out[0] = loss;
    return st;
}

/* ------------------------------------------------------------ batches */
#define NBATCH 4
static void make_batches(bool gpt, ctpu_tensor (*b)[2])
{
    uint64_t s = 12345;
    for (int k = 0; k < NBATCH; k++) {
        if (gpt) {
            int32_t x[32], y[32];
            for (int i = 0; i < 32; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                x[i] = (int32_t)((s >> 33) % 64);
                y[i] = (int32_t)((s >> 17) % 64);
            }
            int64_t sh[2] = { 2, 16 };
            b[k][0] = ctpu_keep(ctpu_from_host(x, CTPU_I32, 2, sh));
            b[k][1] = ctpu_keep(ctpu_from_host(y, CTPU_I32, 2, sh));
        } else {
            int64_t xs[2] = { 128, 784 }, ys[2] = { 128, 10 };
            float *xh = malloc(128 * 784 * 4), *yh = calloc(128 * 10, 4);
            for (int i = 0; i < 128 * 784; i++) xh[i] = (float)(((unsigned)(i + k * 7) * 2654435761u) % 1000) / 1000.0f - 0.3f;
            for (int i = 0; i < 128; i++) yh[i * 10 + (i * 7 + k) % 10] = 1;
            b[k][0] = ctpu_keep(ctpu_from_host(xh, CTPU_F32, 2, xs));
            b[k][1] = ctpu_keep(ctpu_from_host(yh, CTPU_F32, 2, ys));
            free(xh);
            free(yh);
        }
    }
}

/* ------------------------------------------------------------ runs */
enum { M_STRICT, M_DEBUG, M_FUSED, M_COMPILED, M_COUNT };
static const char *const mode_names[M_COUNT] = { "strict", "debug", "fused", "compiled" };

typedef struct { double host_us, steps_per_s; float *w; int64_t nw; } result;

static void one_step(int mode, model *m, ctpu_compiled *c, ctpu_tensor *in, int step)
{
    double sc[1] = { ctpu_lr_warmup_cosine(1e-3, step, 10, 1000, 1e-4) };
    ctpu_tensor out[1];
    if (mode == M_COMPILED) {
        CHECK(ctpu_compiled_call(c, 2, in, 1, sc, 1, out) == CTPU_OK);
        ctpu_release(out[0]);
        return;
    }
    ctpu_step_begin();
    CHECK(step_fn(m, in, sc, out) == CTPU_OK);
    CHECK(ctpu_step_end() == CTPU_OK);
}

static result run(int mode, bool gpt, ctpu_tensor (*b)[2], int reps)
{
    CHECK(ctpu_set_mode(mode == M_FUSED ? CTPU_MODE_DEFER_FUSE : mode == M_DEBUG ? CTPU_MODE_DEBUG : CTPU_MODE_STRICT) ==
          CTPU_OK);
    model m;
    model_init(&m, gpt);
    ctpu_compiled *c = mode == M_COMPILED ? ctpu_compile(step_fn, &m, &(ctpu_compile_opts){ .name = "bench" }) : NULL;
    int step = 0;
    for (; step < 6; step++) one_step(mode, &m, c, b[step % NBATCH], step);   /* warm: compile, capture */
    CHECK(ctpu_sync() == CTPU_OK);
    result r = { 0 };
    /* the weights after the warm-up steps, for the bit-identity check */
    for (int i = 0; i < m.np; i++) r.nw += ctpu_numel(m.p[i]);
    r.w = malloc(sizeof(float) * (size_t)r.nw);
    for (int i = 0, o = 0; i < m.np; o += (int)ctpu_numel(m.p[i]), i++)
        CHECK(ctpu_to_host(m.p[i], r.w + o, sizeof(float) * (size_t)ctpu_numel(m.p[i])) == CTPU_OK);
    double host[7], wall[7];
    for (int k = 0; k < 7; k++) {
        /* one thread-CPU-clock pair around the run's steps: that clock is a
         * system call here (about 0.55 us of CPU time a read, measured on
         * this machine), so a pair per step added about 0.5 us to each */
        double t0 = bench_clock(CLOCK_MONOTONIC), c0 = bench_clock(CLOCK_THREAD_CPUTIME_ID);
        for (int i = 0; i < reps; i++, step++) one_step(mode, &m, c, b[step % NBATCH], step);
        double h = bench_clock(CLOCK_THREAD_CPUTIME_ID) - c0;
        CHECK(ctpu_sync() == CTPU_OK);
        wall[k] = (bench_clock(CLOCK_MONOTONIC) - t0) / reps;
        host[k] = h / reps;
    }
    r.host_us = median(host, 7) * 1e6;
    r.steps_per_s = 1.0 / median(wall, 7);
    if (c) {
        ctpu_compiled_info info;
        CHECK(ctpu_compiled_get_info(c, &info) == CTPU_OK);
        if (info.graph_breaks || info.guard_failures) { fprintf(stderr, "bench/compile: %s\n", info.last_reason); exit(1); }
        ctpu_compiled_free(c);
    }
    model_free(&m);
    CHECK(ctpu_set_mode(CTPU_MODE_STRICT) == CTPU_OK);
    return r;
}

static void bench(bool gpt)
{
    const char *tag = gpt ? "gpt" : "mlp";
    ctpu_tensor b[NBATCH][2];
    make_batches(gpt, b);
    int reps = gpt ? 40 : 10;
    result r[M_COUNT];
    for (int mode = 0; mode < M_COUNT; mode++) r[mode] = run(mode, gpt, b, reps);
    for (int mode = 1; mode < M_COUNT; mode++)
        if (memcmp(r[0].w, r[mode].w, sizeof(float) * (size_t)r[0].nw) != 0) {
            fprintf(stderr, "bench/compile: %s weights differ between strict and %s\n", tag, mode_names[mode]);
            exit(1);
        }
    for (int mode = 0; mode < M_COUNT; mode++) {
        printf("%s_host_us_per_step_%s %.2f us\n", mode_names[mode], tag, r[mode].host_us);
        printf("%s_steps_per_s_%s %.1f steps/s\n", mode_names[mode], tag, r[mode].steps_per_s);
    }
    if (gpt) {
        printf("fused_host_share_gpt %.3f fraction\n", r[M_FUSED].host_us * 1e-6 * r[M_FUSED].steps_per_s);
        printf("ratio_compiled_vs_fused_gpt_step %.3f x\n", r[M_COMPILED].steps_per_s / r[M_FUSED].steps_per_s);
    } else {
        printf("ratio_compiled_vs_fused_mlp_step %.3f x\n", r[M_COMPILED].steps_per_s / r[M_FUSED].steps_per_s);
    }
    for (int mode = 0; mode < M_COUNT; mode++) free(r[mode].w);
    for (int k = 0; k < NBATCH; k++) { ctpu_release(b[k][0]); ctpu_release(b[k][1]); }
}

int main(int argc, char **argv)
{
    if (ctpu_init() != CTPU_OK) { fprintf(stderr, "bench/compile: %s\n", ctpu_last_error()); return 1; }
    if (argc > 1) {
        /* `<mlp|gpt>-<mode>`: that one step and mode alone (for profiles) */
        bool gpt = strncmp(argv[1], "gpt-", 4) == 0;
        int mode = -1;
        for (int k = 0; k < M_COUNT; k++)
            if ((gpt || strncmp(argv[1], "mlp-", 4) == 0) && strcmp(argv[1] + 4, mode_names[k]) == 0) mode = k;
        if (mode < 0) {
            fprintf(stderr, "usage: compile [<mlp|gpt>-<strict|debug|fused|compiled>] [calls per timed run] [GPT layers, 1-15]\n");
            return 2;
        }
        ctpu_tensor b[NBATCH][2];
        make_batches(gpt, b);
        int reps = argc > 2 ? atoi(argv[2]) : gpt ? 40 : 10;
        if (argc > 3) g_layers = atoi(argv[3]);
        if (reps < 1 || g_layers < 1 || g_layers > 15) {
            fprintf(stderr, "usage: compile [<mlp|gpt>-<strict|debug|fused|compiled>] [calls per timed run] [GPT layers, 1-15]\n");
            return 2;
        }
        result r = run(mode, gpt, b, reps);
        printf("%s_host_us_per_step_%s %.2f us\n", mode_names[mode], gpt ? "gpt" : "mlp", r.host_us);
        printf("%s_steps_per_s_%s %.1f steps/s\n", mode_names[mode], gpt ? "gpt" : "mlp", r.steps_per_s);
        printf("%s_calls %d calls (the first 6 warm up: %d in the timed runs)\n", mode_names[mode], 6 + 7 * reps, 7 * reps);
        free(r.w);
        for (int k = 0; k < NBATCH; k++) { ctpu_release(b[k][0]); ctpu_release(b[k][1]); }
        ctpu_shutdown();
        return 0;
    }
    bench(false);
    bench(true);
    {
        /* the compiled step's host time is to be the same whatever its op
         * count: the GPT step with 6 layers (about 3x the ops and handles) */
        ctpu_tensor b[NBATCH][2];
        make_batches(true, b);
        g_layers = 6;
        result r = run(M_COMPILED, true, b, 40);
        printf("compiled_host_us_per_step_gpt_6layers %.2f us\n", r.host_us);
        free(r.w);
        for (int k = 0; k < NBATCH; k++) { ctpu_release(b[k][0]); ctpu_release(b[k][1]); }
    }
    ctpu_shutdown();
    return 0;
}
