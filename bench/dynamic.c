/* Dynamic dims (issue 15, docs/DESIGN.md "Dynamic dims"): one dynamic
 * program at several extents against static programs compiled for each
 * extent, side by side in one run, on two training steps in defer and fuse:
 *   mlp: 784-256-96-10, ReLU, log_softmax loss, AdamW; batch B dynamic in
 *        [2, 128], at B = 32, 64, 100, 128;
 *   gpt: a small char-GPT step (2 blocks, dmodel 32, 2 heads, vocab 96, ctx
 *        64, batch 3, causal SDPA, tied head, cross entropy, AdamW); T
 *        dynamic in [2, 64], at T = 8, 20, 40, 56.
 * The extents avoid the workloads' static extents (DESIGN.md: an extent
 * equal to another extent of the trace can compile its own program).
 *
 * A dynamic trace's exact static entry is looked up first, so at each
 * extent the dynamic runs come before the static program for that extent
 * exists. First a throwaway model runs every extent marked (the dynamic
 * program compiles once, its bound launches are kept). Then per extent: a
 * model marked (the batch tensors carry ctpu_mark_dynamic) runs warm-up steps
 * and 5 timed runs of `reps` steps, then a model from the same seed unmarked
 * does the same (its warm-up compiles the static program); their weights at
 * the end are checked bit-identical.
 *
 * Time per step: process CPU time (CLOCK_PROCESS_CPUTIME_ID: the calling
 * thread's host work plus the device thread's kernels, CTPU_NUM_THREADS=1),
 * which other engineers' load on the shared machine changes far less than
 * wall time; each run ends with a sync. Medians of the 5 runs.
 * ratio_dynamic_vs_static_<wl>_<extent> = static time / dynamic time
 * (target >= 0.9). Prints `name value unit`. `dynamic mlp` or `dynamic gpt`
 * runs one workload; `dynamic gpt 8 dynamic 200` (or static) one model at
 * one extent, the callgrind harness for comparing the two launch kinds:
 * valgrind --tool=callgrind ./dynamic gpt 8 dynamic 200, against 100 steps,
 * the difference per step). */
#include <ctpu.h>
#include <ctpu_nn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "bench/dynamic: %s failed: %s\n", #x, ctpu_last_error()); exit(1); } } while (0)


/* ------------------------------------------------------------ models */
#define MAXP 64
enum { GL = 2, GD = 32, GH = 2, GHD = 16, GV = 96, GCTX = 64, GB = 3, MLP_HI = 128 };

typedef struct {
    ctpu_tensor p[MAXP];
    int np;
    ctpu_optim *opt;
    bool gpt;
} model;

static ctpu_tensor mk(model *m, int nd, const int64_t *s, double std, double fill)
{
    ctpu_tensor t = std > 0 ? ctpu_rand_normal(CTPU_F32, nd, s, 0, std) : ctpu_full(CTPU_F32, nd, s, fill);
    ctpu_keep(t);
    ctpu_set_requires_grad(t, true);
    m->p[m->np++] = t;
    return t;
}

static void model_init(model *m, bool gpt)
{
    memset(m, 0, sizeof *m);
    ctpu_manual_seed(1);
    m->gpt = gpt;
    if (!gpt) {
        int64_t s1[2] = { 784, 256 }, b1 = 256, s2[2] = { 256, 96 }, b2 = 96, s3[2] = { 96, 10 }, b3 = 10;
        mk(m, 2, s1, 0.05, 0); mk(m, 1, &b1, 0, 0);
        mk(m, 2, s2, 0.08, 0); mk(m, 1, &b2, 0, 0);
        mk(m, 2, s3, 0.1, 0);  mk(m, 1, &b3, 0, 0);
    } else {
        int64_t D = GD, te[2] = { GV, D }, pe[2] = { GCTX, D }, dd[2] = { D, D }, d4[2] = { D, 4 * D },
                d4t[2] = { 4 * D, D }, f4 = 4 * D;
        mk(m, 2, te, 0.02, 0);
        mk(m, 2, pe, 0.02, 0);
        for (int l = 0; l < GL; l++) {
            mk(m, 1, &D, 0, 1); mk(m, 1, &D, 0, 0);                                     /* ln1 */
            for (int k = 0; k < 3; k++) { mk(m, 2, dd, 0.02, 0); mk(m, 1, &D, 0, 0); }   /* q, k, v */
            mk(m, 2, dd, 0.01, 0); mk(m, 1, &D, 0, 0);                                  /* o */
            mk(m, 1, &D, 0, 1); mk(m, 1, &D, 0, 0);                                     /* ln2 */
            mk(m, 2, d4, 0.02, 0); mk(m, 1, &f4, 0, 0);
            mk(m, 2, d4t, 0.01, 0); mk(m, 1, &D, 0, 0);
        }
        mk(m, 1, &D, 0, 1); mk(m, 1, &D, 0, 0);                                         /* lnf */
    }
    ctpu_adamw_opts ao = ctpu_adamw_defaults();
    ao.lr = 1e-3;
    m->opt = ctpu_adamw_create(m->np, m->p, &ao);
    CHECK(m->opt);
    CHECK(ctpu_sync() == CTPU_OK);
}

static void model_free(model *m)
{
    ctpu_optim_zero_grad(m->opt);
    ctpu_optim_free(m->opt);
    for (int i = 0; i < m->np; i++) ctpu_release(m->p[i]);
}

static ctpu_tensor lin(ctpu_tensor x, ctpu_tensor w, ctpu_tensor b) { return ctpu_add(ctpu_matmul(x, w), b); }

static ctpu_tensor heads(ctpu_tensor t, int64_t T)
{
    int64_t s[4] = { GB, T, GH, GHD };
    static const int perm[4] = { 0, 2, 1, 3 };
    return ctpu_permute(ctpu_reshape(t, 4, s), perm);
}

static ctpu_tensor gpt_loss(const model *m, ctpu_tensor x, ctpu_tensor y, int64_t T)
{
    const ctpu_tensor *p = m->p;
    ctpu_tensor h = ctpu_add(ctpu_embedding(p[0], x), ctpu_slice(p[1], 0, 0, T, 1));
    static const int perm[4] = { 0, 2, 1, 3 };
    int k = 2;
    for (int l = 0; l < GL; l++) {
        ctpu_tensor a = ctpu_layer_norm(h, p[k], p[k + 1], 1e-5);
        ctpu_tensor q = heads(lin(a, p[k + 2], p[k + 3]), T), kk = heads(lin(a, p[k + 4], p[k + 5]), T);
        ctpu_tensor v = heads(lin(a, p[k + 6], p[k + 7]), T);
        ctpu_tensor o = ctpu_scaled_dot_product_attention(q, kk, v, CTPU_NULL, CTPU_MASK_NONE, true, 0.0, 0.0);
        o = ctpu_contiguous(ctpu_permute(o, perm));
        int64_t s3[3] = { GB, T, GD };
        h = ctpu_add(h, lin(ctpu_reshape(o, 3, s3), p[k + 8], p[k + 9]));
        ctpu_tensor f = ctpu_layer_norm(h, p[k + 10], p[k + 11], 1e-5);
        h = ctpu_add(h, lin(ctpu_gelu(lin(f, p[k + 12], p[k + 13]), false), p[k + 14], p[k + 15]));
        k += 16;
    }
    h = ctpu_layer_norm(h, p[k], p[k + 1], 1e-5);
    ctpu_tensor logits = ctpu_matmul_t(h, p[0], false, true);
    int64_t s2[2] = { GB * T, GV }, s1 = GB * T;
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

/* ------------------------------------------------------------ batches */
#define NBATCH 2
typedef struct { ctpu_tensor b[NBATCH][2]; int64_t E; } batches;

/* NBATCH batches at extent E, marked dynamic (the varying dim in its
 * range) or not. */
static void make_batches(bool gpt, int64_t E, bool marked, batches *out)
{
    uint64_t s = 12345 + (uint64_t)E;
    out->E = E;
    for (int k = 0; k < NBATCH; k++) {
        ctpu_tensor *b = out->b[k];
        if (gpt) {
            int32_t *x = malloc(sizeof(int32_t) * (size_t)(GB * E)), *y = malloc(sizeof(int32_t) * (size_t)(GB * E));
            for (int64_t i = 0; i < GB * E; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                x[i] = (int32_t)((s >> 33) % GV);
                y[i] = (int32_t)((s >> 17) % GV);
            }
            int64_t sh[2] = { GB, E };
            b[0] = ctpu_keep(ctpu_from_host(x, CTPU_I32, 2, sh));
            b[1] = ctpu_keep(ctpu_from_host(y, CTPU_I32, 2, sh));
            free(x);
            free(y);
            if (marked) CHECK(ctpu_mark_dynamic(b[0], 1, 2, GCTX) == CTPU_OK && ctpu_mark_dynamic(b[1], 1, 2, GCTX) == CTPU_OK);
        } else {
            int64_t xs[2] = { E, 784 }, ys[2] = { E, 10 };
            float *xh = malloc(sizeof(float) * (size_t)(E * 784)), *yh = calloc((size_t)(E * 10), sizeof(float));
            for (int64_t i = 0; i < E * 784; i++)
                xh[i] = (float)(((unsigned)(i + k * 7) * 2654435761u) % 1000) / 1000.0f - 0.3f;
            for (int64_t i = 0; i < E; i++) yh[i * 10 + (i * 7 + k) % 10] = 1;
            b[0] = ctpu_keep(ctpu_from_host(xh, CTPU_F32, 2, xs));
            b[1] = ctpu_keep(ctpu_from_host(yh, CTPU_F32, 2, ys));
            free(xh);
            free(yh);
            if (marked) CHECK(ctpu_mark_dynamic(b[0], 0, 2, MLP_HI) == CTPU_OK && ctpu_mark_dynamic(b[1], 0, 2, MLP_HI) == CTPU_OK);
        }
    }
}

static void free_batches(batches *bs)
{
    for (int k = 0; k < NBATCH; k++) { ctpu_release(bs->b[k][0]); ctpu_release(bs->b[k][1]); }
}

/* ------------------------------------------------------------ runs */
static void one_step(model *m, const batches *bs, int step)
{
    const ctpu_tensor *b = bs->b[step % NBATCH];
    ctpu_step_begin();
    ctpu_optim_zero_grad(m->opt);
    ctpu_tensor loss = m->gpt ? gpt_loss(m, b[0], b[1], bs->E) : mlp_loss(m, b[0], b[1]);
    CHECK(!ctpu_is_null(loss));
    CHECK(ctpu_backward(loss) == CTPU_OK);
    CHECK(ctpu_optim_step(m->opt) == CTPU_OK);
    CHECK(ctpu_step_end() == CTPU_OK);
}

#define RUNS 5
#define WARM 4

typedef struct { double cpu_ms, wall_ms; float *w; int64_t nw; } result;

/* A model from seed 1 at one extent: WARM steps, then RUNS timed runs of
 * reps steps; its weights at the end. */
static result run(bool gpt, const batches *bs, int reps)
{
    model m;
    model_init(&m, gpt);
    int step = 0;
    for (; step < WARM; step++) one_step(&m, bs, step);
    CHECK(ctpu_sync() == CTPU_OK);
    double cpu[RUNS], wall[RUNS];
    for (int k = 0; k < RUNS; k++) {
        double t0 = bench_clock(CLOCK_MONOTONIC), c0 = bench_clock(CLOCK_PROCESS_CPUTIME_ID);
        for (int i = 0; i < reps; i++, step++) one_step(&m, bs, step);
        CHECK(ctpu_sync() == CTPU_OK);
        cpu[k] = (bench_clock(CLOCK_PROCESS_CPUTIME_ID) - c0) / reps;
        wall[k] = (bench_clock(CLOCK_MONOTONIC) - t0) / reps;
    }
    result r = { median(cpu, RUNS) * 1e3, median(wall, RUNS) * 1e3, NULL, 0 };
    for (int i = 0; i < m.np; i++) r.nw += ctpu_numel(m.p[i]);
    r.w = malloc(sizeof(float) * (size_t)r.nw);
    for (int i = 0, o = 0; i < m.np; o += (int)ctpu_numel(m.p[i]), i++)
        CHECK(ctpu_to_host(m.p[i], r.w + o, sizeof(float) * (size_t)ctpu_numel(m.p[i])) == CTPU_OK);
    model_free(&m);
    return r;
}

static void bench(bool gpt)
{
    const char *tag = gpt ? "gpt" : "mlp";
    static const int64_t mlp_ext[] = { 32, 64, 100, 128 }, gpt_ext[] = { 8, 20, 40, 56 };
    const int64_t *ext = gpt ? gpt_ext : mlp_ext;
    enum { NE = 4 };
    int reps = gpt ? 10 : 6;
    batches dyn[NE], stat[NE];
    for (int e = 0; e < NE; e++) {
        make_batches(gpt, ext[e], true, &dyn[e]);
        make_batches(gpt, ext[e], false, &stat[e]);
    }
    /* the dynamic program: compiled at the first extent, bound at the others */
    int64_t c0 = ctpu_metric_counter("programs_compiled");
    model w;
    model_init(&w, gpt);
    for (int e = 0; e < NE; e++)
        for (int s = 0; s < WARM; s++) one_step(&w, &dyn[e], s);
    CHECK(ctpu_sync() == CTPU_OK);
    model_free(&w);
    printf("dynamic_programs_compiled_%s %lld programs (every extent, the model's warm-up included)\n", tag,
           (long long)(ctpu_metric_counter("programs_compiled") - c0));
    for (int e = 0; e < NE; e++) {
        int64_t binds0 = ctpu_metric_counter("dynamic_binds"), reuse0 = ctpu_metric_counter("dynamic_bind_reuses");
        int64_t before = ctpu_metric_counter("programs_compiled");
        result d = run(gpt, &dyn[e], reps);
        int64_t dyn_compiles = ctpu_metric_counter("programs_compiled") - before;
        int64_t binds = ctpu_metric_counter("dynamic_binds") - binds0;
        int64_t reuses = ctpu_metric_counter("dynamic_bind_reuses") - reuse0;
        result s = run(gpt, &stat[e], reps);
        if (d.nw != s.nw || memcmp(d.w, s.w, sizeof(float) * (size_t)d.nw) != 0) {
            fprintf(stderr, "bench/dynamic: %s at %lld: weights differ between the dynamic and the static program\n",
                    tag, (long long)ext[e]);
            exit(1);
        }
        long long E = (long long)ext[e];
        printf("dynamic_ms_per_step_%s_%lld %.3f ms (process CPU; wall %.3f)\n", tag, E, d.cpu_ms, d.wall_ms);
        printf("static_ms_per_step_%s_%lld %.3f ms (process CPU; wall %.3f)\n", tag, E, s.cpu_ms, s.wall_ms);
        printf("dynamic_launches_%s_%lld %lld launches (%lld reused a kept bound launch; %lld programs compiled)\n", tag, E,
               (long long)binds, (long long)reuses, (long long)dyn_compiles);
        printf("ratio_dynamic_vs_static_%s_%lld %.3f x\n", tag, E, s.cpu_ms / d.cpu_ms);
        free(d.w);
        free(s.w);
    }
    for (int e = 0; e < NE; e++) { free_batches(&dyn[e]); free_batches(&stat[e]); }
}

/* `dynamic <mlp|gpt> <extent> <dynamic|static> <steps>`: one model at one
 * extent (the callgrind harness for one launch kind: a dynamic run first
 * compiles the dynamic program at another extent, as the bench does). */
static int profile_one(bool gpt, int64_t E, bool marked, int steps)
{
    if (marked) {
        batches other;
        make_batches(gpt, E == 20 ? 40 : 20, true, &other);
        model w;
        model_init(&w, gpt);
        for (int s = 0; s < WARM; s++) one_step(&w, &other, s);
        CHECK(ctpu_sync() == CTPU_OK);
        model_free(&w);
        free_batches(&other);
    }
    batches bs;
    make_batches(gpt, E, marked, &bs);
    model m;
    model_init(&m, gpt);
    for (int s = 0; s < steps; s++) one_step(&m, &bs, s);
    CHECK(ctpu_sync() == CTPU_OK);
    model_free(&m);
    free_batches(&bs);
    printf("profile_%s_%lld_%s %d steps, %lld programs compiled, %lld dynamic binds\n", gpt ? "gpt" : "mlp",
           (long long)E, marked ? "dynamic" : "static", steps, (long long)ctpu_metric_counter("programs_compiled"),
           (long long)ctpu_metric_counter("dynamic_binds"));
    return 0;
}

int main(int argc, char **argv)
{
    bool mlp = argc < 2 || strcmp(argv[1], "mlp") == 0, gpt = argc < 2 || strcmp(argv[1], "gpt") == 0;
    bool one = argc == 5 && (strcmp(argv[3], "dynamic") == 0 || strcmp(argv[3], "static") == 0);
    if ((argc > 2 && !one) || (!mlp && !gpt) || (one && (atoi(argv[2]) < 2 || atoi(argv[4]) < 1))) {
        fprintf(stderr, "usage: dynamic [mlp | gpt [extent dynamic|static steps]]\n");
        return 2;
    }
    if (ctpu_init() != CTPU_OK) { fprintf(stderr, "bench/dynamic: %s\n", ctpu_last_error()); return 1; }
    CHECK(ctpu_set_mode(CTPU_MODE_DEFER_FUSE) == CTPU_OK);
    if (one) {
        int rc = profile_one(gpt, atoi(argv[2]), strcmp(argv[3], "dynamic") == 0, atoi(argv[4]));
        ctpu_shutdown();
        return rc;
    }
    if (mlp) bench(false);
    if (gpt) bench(true);
    ctpu_shutdown();
    return 0;
}
