/* One rank of the dist suite (issue 19), started by test_dist through
 * mpirun. argv[1] picks the scenario:
 *   suite     the Check suite below, on every rank (no fork: MPI forbids it)
 *   die       rank 1 exits while rank 0 waits in an all_reduce (bucket 0,
 *             step 3): mpirun must stop rank 0, whose SIGTERM line names it
 *   hang      rank 1 sleeps instead of calling the all_reduce: rank 0 must
 *             MPI_Abort after CTPU_DIST_TIMEOUT naming the collective
 * Every rank asserts; the launcher asserts on mpirun's status and output. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <unistd.h>

#include "ctpu.h"
#include "ctpu_nn.h"
#include "eager/eager.h"
#include "dist/dist.h"

static int R, N;

/* ------------------------------------------------------------ engine */
/* rank r's value for element i of a test buffer: small floats whose sums
 * round differently in different orders */
static float val(int r, int64_t i) { return (float)(1.0 + 0.1 * r) * (float)(i % 7 == 0 ? 1e7 : 1.0 / (1 + i % 13)); }

START_TEST(engine_world)
{
    ck_assert_int_eq(ctpu_dist_world_size(), N);
    ck_assert(ctpu_dist_rank() >= 0 && ctpu_dist_rank() < N);
    ck_assert_int_eq(ctpu_dist_local_size(), N);   /* one node */
    ck_assert(ctpu_dist_is_initialized());
    ck_assert(N == 1 || ctpu_dist_available());
}
END_TEST

START_TEST(engine_per_rank_share)
{
    /* each local rank gets cap / local ranks and cores / local ranks threads */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int want = (int)(ncpu > 64 ? 64 : ncpu) / N;
    ck_assert_int_eq(ctpu_rt->nthreads, want > 0 ? want : 1);
    ctpu_hbm_stats hs;
    ck_assert_int_eq(ctpu_hbm_get_stats(&hs), CTPU_OK);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t half = (uint64_t)pages * (uint64_t)psz / 2, hbm = ctpu_chip()->hbm_bytes;
    ck_assert_uint_eq(hs.capacity, (hbm < half ? hbm : half) / (uint64_t)N);
}
END_TEST

static void engine_all_reduce_dt(int dtype, int op, int64_t n)
{
    /* n: not a multiple of the world size */
    size_t es = dtype == CTPU_BF16 ? 2 : 4;
    char *in = malloc((size_t)n * es), *out = malloc((size_t)n * es), *want = malloc((size_t)n * es);
    char **all = malloc(sizeof(char *) * (size_t)N);
    for (int r = 0; r < N; r++) {
        all[r] = malloc((size_t)n * es);
        for (int64_t i = 0; i < n; i++) {
            float v = val(r, i);
            if (dtype == CTPU_F32) ((float *)all[r])[i] = v;
            else if (dtype == CTPU_BF16) ((uint16_t *)all[r])[i] = ctpu_f32_to_bf16(v);
            else ((int32_t *)all[r])[i] = (int32_t)((uint32_t)(i * 1000003 + r * 7919) * (uint32_t)(r + 1));  /* wraps */
        }
    }
    memcpy(in, all[R], (size_t)n * es);
    ctpu__dist_fold(dtype, op, N, (const void *const *)all, n, want);
    ctpu_coll_call c = { .kind = CTPU_COLL_ALL_REDUCE, .op = op, .dtype = dtype, .ndim = 1, .shape = { n },
                         .bucket = -1, .in = in, .out = out };
    char err[256] = "";
    ck_assert_msg(ctpu__dist_run(&c, err, sizeof err) == CTPU_OK, "%s", err);
    ck_assert_msg(memcmp(out, want, (size_t)n * es) == 0, "all_reduce differs from the rank-order left fold");
    /* and the left fold is the PyTorch-style accumulation: ((x0 + x1) + x2) */
    if (dtype == CTPU_F32) {
        for (int64_t i = 0; i < n; i++) {
            float acc = ((float *)all[0])[i];
            for (int r = 1; r < N; r++) acc += ((float *)all[r])[i];
            if (op == CTPU_DIST_MEAN) acc /= (float)N;
            ck_assert(memcmp(&acc, out + (size_t)i * 4, 4) == 0);
        }
    }
    for (int r = 0; r < N; r++) free(all[r]);
    free(all);
    free(in);
    free(out);
    free(want);
}

START_TEST(engine_all_reduce)
{
    /* both algorithms (one round: every buffer to every rank; two phases:
     * alltoallv, fold, allgatherv, taken at 3+ ranks for buffers over
     * 256 KB) give the rank-order fold's bits */
    for (int one = 0; one < 2; one++) {
        ctpu__dist_test_one_round(one == 1);
        engine_all_reduce_dt(CTPU_F32, CTPU_DIST_SUM, one ? 1003 : 100003);
        engine_all_reduce_dt(CTPU_F32, CTPU_DIST_MEAN, 1003);
        engine_all_reduce_dt(CTPU_BF16, CTPU_DIST_SUM, 1003);
        engine_all_reduce_dt(CTPU_BF16, CTPU_DIST_MEAN, 200003);
        engine_all_reduce_dt(CTPU_I32, CTPU_DIST_SUM, 100003);
    }
    ctpu__dist_test_one_round(false);
}
END_TEST

START_TEST(engine_gather_scatter_broadcast)
{
    /* all_gather along dim 1 of [2,3]: [2, 3N] with rank r's columns at [3r, 3r+3) */
    float in[6], out[2 * 3 * 8];
    for (int i = 0; i < 6; i++) in[i] = (float)(100 * R + i);
    ctpu_coll_call c = { .kind = CTPU_COLL_ALL_GATHER, .dtype = CTPU_F32, .ndim = 2, .shape = { 2, 3 }, .dim = 1,
                         .bucket = -1, .in = in, .out = out };
    char err[256] = "";
    ck_assert_msg(ctpu__dist_run(&c, err, sizeof err) == CTPU_OK, "%s", err);
    for (int o = 0; o < 2; o++)
        for (int r = 0; r < N; r++)
            for (int j = 0; j < 3; j++) ck_assert(out[o * 3 * N + r * 3 + j] == (float)(100 * r + o * 3 + j));
    /* reduce_scatter along dim 0 of [2N, 2]: rank r keeps rows [2r, 2r+2) of the sum */
    float rs_in[2 * 8 * 2], rs_out[4];
    for (int i = 0; i < 4 * N; i++) rs_in[i] = (float)(i + R);
    ctpu_coll_call s = { .kind = CTPU_COLL_REDUCE_SCATTER, .op = CTPU_DIST_SUM, .dtype = CTPU_F32, .ndim = 2,
                         .shape = { 2 * N, 2 }, .dim = 0, .bucket = -1, .in = rs_in, .out = rs_out };
    ck_assert_msg(ctpu__dist_run(&s, err, sizeof err) == CTPU_OK, "%s", err);
    for (int i = 0; i < 4; i++) {
        float want = 0;
        for (int r = 0; r < N; r++) want += (float)(4 * R + i + r);
        ck_assert_msg(rs_out[i] == want, "reduce_scatter[%d] = %g, want %g", i, rs_out[i], want);
    }
    /* broadcast from the last rank */
    int32_t b[5], bo[5];
    for (int i = 0; i < 5; i++) b[i] = R * 10 + i;
    ctpu_coll_call bc = { .kind = CTPU_COLL_BROADCAST, .dtype = CTPU_I32, .ndim = 1, .shape = { 5 }, .root = N - 1,
                          .bucket = -1, .in = b, .out = bo };
    ck_assert_msg(ctpu__dist_run(&bc, err, sizeof err) == CTPU_OK, "%s", err);
    for (int i = 0; i < 5; i++) ck_assert_int_eq(bo[i], (N - 1) * 10 + i);
}
END_TEST

START_TEST(engine_shape_mismatch)
{
    /* rank 1 has one column fewer: every rank gets the same error, naming
     * the collective and both ranks' shapes; no data moves */
    float in[12] = { 0 }, out[12];
    int64_t cols = R == 1 ? 2 : 3;
    ctpu_coll_call c = { .kind = CTPU_COLL_ALL_REDUCE, .op = CTPU_DIST_SUM, .dtype = CTPU_F32, .ndim = 2,
                         .shape = { 4, cols }, .bucket = 2, .in = in, .out = out };
    char err[256] = "";
    ck_assert_int_eq(ctpu__dist_run(&c, err, sizeof err), CTPU_ERR_SHAPE);
    ck_assert_msg(strstr(err, "all_reduce: rank 0 has f32[4,3], rank 1 has f32[4,2]") != NULL, "%s", err);
    /* a dtype mismatch */
    ctpu_coll_call d = { .kind = CTPU_COLL_ALL_REDUCE, .op = CTPU_DIST_SUM, .dtype = R == 1 ? CTPU_I32 : CTPU_F32,
                         .ndim = 1, .shape = { 4 }, .bucket = -1, .in = in, .out = out };
    ck_assert_int_eq(ctpu__dist_run(&d, err, sizeof err), CTPU_ERR_DTYPE);
    ck_assert_msg(strstr(err, "rank 0 has f32[4], rank 1 has i32[4]") != NULL, "%s", err);
    /* the world still works afterwards */
    float x = 1, y = 0;
    ctpu_coll_call ok = { .kind = CTPU_COLL_ALL_REDUCE, .op = CTPU_DIST_SUM, .dtype = CTPU_F32, .ndim = 0,
                          .bucket = -1, .in = &x, .out = &y };
    ck_assert_int_eq(ctpu__dist_run(&ok, err, sizeof err), CTPU_OK);
    ck_assert(y == (float)N);
}
END_TEST

/* ------------------------------------------------------------ ops */
static const struct { ctpu_mode mode; bool keep; const char *name; } MODES[] = {
    { CTPU_MODE_STRICT, false, "strict" }, { CTPU_MODE_DEBUG, false, "debug" },
    { CTPU_MODE_DEFER_FUSE, false, "defer_fuse" }, { CTPU_MODE_DEFER_FUSE, true, "defer_fuse kept in the step" },
};
#define N_MODES 4

static void set_mode(int m)
{
    ck_assert_int_eq(ctpu_set_mode(MODES[m].mode), CTPU_OK);
    ck_assert_int_eq(ctpu_dist_set_collective_cut(!MODES[m].keep), CTPU_OK);
}

static void read_f32(ctpu_tensor t, float *out, int64_t n, const char *what)
{
    ck_assert_msg(!ctpu_is_null(t), "%s: %s", what, ctpu_last_error());
    ck_assert_int_eq(ctpu_numel(t), n);
    ck_assert_msg(ctpu_to_host(t, out, (size_t)n * 4) == CTPU_OK, "%s: %s", what, ctpu_last_error());
}

/* Every collective in every mode: the values the rank-order fold gives,
 * computed here from every rank's (known) inputs. */
START_TEST(ops_every_mode)
{
    enum { M = 5, K = 7 };
    float mine[M * K], all[8][M * K], want[8 * M * K], got[8 * M * K];
    const void *blocks[8];
    for (int r = 0; r < N; r++) {
        for (int i = 0; i < M * K; i++) all[r][i] = val(r, i) * (i % 2 ? -1.0f : 1.0f);
        blocks[r] = all[r];
    }
    memcpy(mine, all[R], sizeof mine);
    int64_t shp[2] = { M, K };
    for (int m = 0; m < N_MODES; m++) {
        set_mode(m);
        const char *mn = MODES[m].name;
        ctpu_scope_begin();
        ctpu_tensor x = ctpu_from_host(mine, CTPU_F32, 2, shp);
        /* inside a computation: exp(x) * 0 + x keeps x's bits and puts ops around the collective */
        ctpu_tensor xin = ctpu_add(ctpu_mul_scalar(ctpu_exp(ctpu_mul_scalar(x, 0.0)), 0.0), x);
        ctpu__dist_fold(CTPU_F32, CTPU_DIST_SUM, N, blocks, M * K, want);
        read_f32(ctpu_add_scalar(ctpu_all_reduce(xin, CTPU_DIST_SUM), 0.0), got, M * K, mn);
        ck_assert_msg(memcmp(got, want, sizeof(float) * M * K) == 0, "%s: all_reduce sum", mn);
        /* started, then other work, then waited: the same bits */
        ctpu_tensor started = ctpu_all_reduce_async(xin, CTPU_DIST_SUM);
        ck_assert_msg(!ctpu_is_null(started), "%s: %s", mn, ctpu_last_error());
        ctpu_tensor busy = ctpu_sum(ctpu_exp(ctpu_mul_scalar(x, 0.5)), 0, NULL, false);
        ctpu_tensor fin = ctpu_all_reduce_wait(started);
        read_f32(fin, got, M * K, mn);
        ck_assert_msg(memcmp(got, want, sizeof(float) * M * K) == 0, "%s: all_reduce_async sum", mn);
        double bv;
        ck_assert_int_eq(ctpu_item(busy, &bv), CTPU_OK);
        ck_assert_msg(ctpu_is_null(ctpu_all_reduce_wait(started)) && ctpu_last_status() == CTPU_ERR_INVALID_ARG &&
                      strstr(ctpu_last_error(), "not an all_reduce this thread started"), "%s: waited twice: %s", mn,
                      ctpu_last_error());
        ck_assert(ctpu_is_null(ctpu_all_reduce_wait(x)) && ctpu_last_status() == CTPU_ERR_INVALID_ARG);
        ctpu_clear_error();
        ctpu__dist_fold(CTPU_F32, CTPU_DIST_MEAN, N, blocks, M * K, want);
        read_f32(ctpu_all_reduce(x, CTPU_DIST_MEAN), got, M * K, mn);
        ck_assert_msg(memcmp(got, want, sizeof(float) * M * K) == 0, "%s: all_reduce mean", mn);
        /* two started at once, waited in the other order */
        ctpu_tensor s1 = ctpu_all_reduce_async(x, CTPU_DIST_MEAN), s2 = ctpu_all_reduce_async(xin, CTPU_DIST_SUM);
        ctpu_tensor w2 = ctpu_all_reduce_wait(s2), w1 = ctpu_all_reduce_wait(s1);
        read_f32(w1, got, M * K, mn);
        ck_assert_msg(memcmp(got, want, sizeof(float) * M * K) == 0, "%s: all_reduce_async mean", mn);
        ctpu__dist_fold(CTPU_F32, CTPU_DIST_SUM, N, blocks, M * K, want);
        read_f32(w2, got, M * K, mn);
        ck_assert_msg(memcmp(got, want, sizeof(float) * M * K) == 0, "%s: all_reduce_async sum, second", mn);
        ctpu__dist_fold(CTPU_F32, CTPU_DIST_MEAN, N, blocks, M * K, want);
        /* bf16 mean: rounded after each addition and after the division */
        uint16_t bw[8][M * K], bwant[M * K], bgot[M * K];
        const void *bb[8];
        for (int r = 0; r < N; r++) {
            for (int i = 0; i < M * K; i++) bw[r][i] = ctpu_f32_to_bf16(all[r][i]);
            bb[r] = bw[r];
        }
        ctpu__dist_fold(CTPU_BF16, CTPU_DIST_MEAN, N, bb, M * K, bwant);
        ctpu_tensor xb = ctpu_all_reduce(ctpu_cast(x, CTPU_BF16), CTPU_DIST_MEAN);
        ck_assert_int_eq(ctpu_dtype_of(xb), CTPU_BF16);
        ck_assert_int_eq(ctpu_to_host(xb, bgot, sizeof bgot), CTPU_OK);
        ck_assert_msg(memcmp(bgot, bwant, sizeof bgot) == 0, "%s: bf16 all_reduce mean", mn);
        /* all_gather along dim 0: rank r's rows at [r M, (r+1) M) */
        read_f32(ctpu_all_gather(x, 0), got, (int64_t)N * M * K, mn);
        for (int r = 0; r < N; r++)
            ck_assert_msg(memcmp(got + r * M * K, all[r], sizeof(float) * M * K) == 0, "%s: all_gather", mn);
        /* along dim 1: row o holds every rank's row o in rank order */
        read_f32(ctpu_all_gather(x, 1), got, (int64_t)N * M * K, mn);
        for (int o = 0; o < M; o++)
            for (int r = 0; r < N; r++)
                ck_assert(memcmp(got + (o * N + r) * K, all[r] + o * K, sizeof(float) * K) == 0);
        /* reduce_scatter of [N*2, 3] along 0: this rank's two rows of the sum */
        float rs[8 * 6], rsw[8][8 * 6];
        const void *rb[8];
        for (int r = 0; r < N; r++) {
            for (int i = 0; i < N * 6; i++) rsw[r][i] = val(r, i + 3);
            rb[r] = rsw[r];
        }
        ctpu__dist_fold(CTPU_F32, CTPU_DIST_SUM, N, rb, N * 6, want);
        ctpu_tensor rt = ctpu_from_host(rsw[R], CTPU_F32, 2, (int64_t[]){ 2 * N, 3 });
        read_f32(ctpu_reduce_scatter(rt, 0, CTPU_DIST_SUM), rs, 6, mn);
        ck_assert_msg(memcmp(rs, want + R * 6, sizeof(float) * 6) == 0, "%s: reduce_scatter", mn);
        /* broadcast from the last rank */
        read_f32(ctpu_broadcast(x, N - 1), got, M * K, mn);
        ck_assert_msg(memcmp(got, all[N - 1], sizeof(float) * M * K) == 0, "%s: broadcast", mn);
        ctpu_scope_end();
        ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    }
    set_mode(0);
    ctpu_dist_stats ds;
    ck_assert_int_eq(ctpu_dist_get_stats(&ds), CTPU_OK);
    ck_assert(ds.collectives >= 7 * N_MODES);
    ck_assert(ds.by_kind[CTPU_COLL_ALL_REDUCE] >= 3 * N_MODES);
    ck_assert(N == 1 || ds.est_ici_s > 0);
    ck_assert(ds.est_ici_s_pod >= ds.est_ici_s_8);
    if (R == 0) ck_assert_int_eq(ctpu_dist_report(stdout), CTPU_OK);
    /* the metrics document's "dist" section, rendered (what ctpu-report shows) */
    char *js = ctpu_metrics_json(), *txt = NULL, wline[64];
    size_t len = 0;
    ck_assert(js != NULL && strstr(js, "\"est_ici_us_per_step\"") != NULL);
    FILE *f = open_memstream(&txt, &len);
    ck_assert_int_eq(ctpu_report_render(js, NULL, CTPU_REPORT_TEXT, f), CTPU_OK);
    fclose(f);
    snprintf(wline, sizeof wline, "2D torus; formulas in ctpu.h): world size %d, ", N);
    ck_assert_msg(strstr(txt, wline) != NULL && strstr(txt, "in collectives") != NULL, "%s", txt);
    free(txt);
    free(js);
}
END_TEST

/* A shape that differs across ranks: every rank's value carries the error
 * naming the collective and both ranks' shapes, in every mode (debug eager:
 * at the call). */
START_TEST(ops_shape_mismatch)
{
    float z[12] = { 0 };
    for (int m = 0; m < N_MODES; m++) {
        set_mode(m);
        ctpu_scope_begin();
        int64_t shp[2] = { 4, R == 1 ? 2 : 3 };
        ctpu_tensor x = ctpu_from_host(z, CTPU_F32, 2, shp);
        ctpu_clear_error();
        ctpu_tensor y = ctpu_all_reduce(x, CTPU_DIST_SUM);
        ctpu_status st;
        if (MODES[m].mode == CTPU_MODE_DEBUG) {
            ck_assert_msg(ctpu_is_null(y), "debug eager: the mismatch is reported at the call");
            st = ctpu_last_status();
        } else {
            ck_assert(!ctpu_is_null(y));
            float out[12];
            st = ctpu_to_host(y, out, sizeof out);
        }
        ck_assert_msg(st == CTPU_ERR_SHAPE, "%s: status %s (%s)", MODES[m].name, ctpu_status_str(st), ctpu_last_error());
        /* the op named with its number in the step (issue 11) */
        ck_assert_msg(strstr(ctpu_last_error(), "all_reduce (op #") == ctpu_last_error() &&
                      strstr(ctpu_last_error(), "): rank 0 has f32[4,3], rank 1 has f32[4,2]") != NULL,
                      "%s: %s", MODES[m].name, ctpu_last_error());
        ctpu_scope_end();
        ctpu_sync();
        ctpu_clear_error();
        /* started: the wait's value carries it (debug eager: the wait's call) */
        ctpu_scope_begin();
        x = ctpu_from_host(z, CTPU_F32, 2, shp);
        ctpu_tensor sa = ctpu_all_reduce_async(x, CTPU_DIST_SUM);
        ck_assert_msg(!ctpu_is_null(sa), "%s: %s", MODES[m].name, ctpu_last_error());
        y = ctpu_all_reduce_wait(sa);
        if (MODES[m].mode == CTPU_MODE_DEBUG) {
            ck_assert(ctpu_is_null(y));
            st = ctpu_last_status();
        } else {
            float out[12];
            st = ctpu_to_host(y, out, sizeof out);
        }
        ck_assert_msg(st == CTPU_ERR_SHAPE && strstr(ctpu_last_error(), "rank 0 has f32[4,3], rank 1 has f32[4,2]"),
                      "%s: started: status %s (%s)", MODES[m].name, ctpu_status_str(st), ctpu_last_error());
        ctpu_scope_end();
        ctpu_sync();
        ctpu_clear_error();
        /* and the ranks go on */
        ctpu_scope_begin();
        double v;
        ck_assert_int_eq(ctpu_item(ctpu_all_reduce(ctpu_full(CTPU_F32, 0, NULL, 1.0), CTPU_DIST_SUM), &v), CTPU_OK);
        ck_assert(v == N);
        ctpu_scope_end();
    }
    set_mode(0);
}
END_TEST

/* ------------------------------------------------------------ DDP */
enum { B = 6, IN = 12, HID = 16, OUT = 4, STEPS = 3 };

typedef struct { ctpu_linear fc1, fc2; } net;

static void net_init(net *m, uint64_t seed)
{
    ctpu_manual_seed(seed);
    ck_assert_int_eq(ctpu_linear_init(&m->fc1, IN, HID, true, CTPU_F32), CTPU_OK);
    ck_assert_int_eq(ctpu_linear_init(&m->fc2, HID, OUT, true, CTPU_F32), CTPU_OK);
}

static void batch(int step, int micro, ctpu_tensor *x, ctpu_tensor *y)
{
    float xs[B * IN];
    int32_t ys[B];
    for (int i = 0; i < B; i++) {
        int row = (step * 97 + micro * B + i);
        for (int j = 0; j < IN; j++) xs[i * IN + j] = sinf((float)(row * IN + j) * 0.37f) * 2.0f;
        ys[i] = (row * 7) % OUT;
    }
    *x = ctpu_from_host(xs, CTPU_F32, 2, (int64_t[]){ B, IN });
    *y = ctpu_from_host(ys, CTPU_I32, 1, (int64_t[]){ B });
}

static ctpu_tensor loss_of(const net *m, ctpu_tensor x, ctpu_tensor y)
{
    ctpu_tensor h = ctpu_dropout(ctpu_relu(ctpu_linear_forward(&m->fc1, x)), 0.25, true);
    return ctpu_cross_entropy(ctpu_linear_forward(&m->fc2, h), y, NULL);
}

static void params_of(net *m, ctpu_tensor *p)
{
    p[0] = m->fc1.weight;
    p[1] = m->fc1.bias;
    p[2] = m->fc2.weight;
    p[3] = m->fc2.bias;
}

static void read_params(net *m, float *out)
{
    ctpu_tensor p[4];
    params_of(m, p);
    size_t at = 0;
    for (int i = 0; i < 4; i++) {
        int64_t n = ctpu_numel(p[i]);
        ck_assert_int_eq(ctpu_to_host(p[i], out + at, (size_t)n * 4), CTPU_OK);
        at += (size_t)n;
    }
}

#define NPARAM (HID * IN + HID + OUT * HID + OUT)

/* One process accumulating the N micro-batches in rank order, gradients
 * divided by N: the reference (strict eager). */
static void reference_run(float *params)
{
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    net m;
    net_init(&m, 7);
    ctpu_tensor p[4];
    params_of(&m, p);
    ctpu_adamw_opts ao = ctpu_adamw_defaults();
    ao.lr = 0.05;
    ctpu_optim *opt = ctpu_adamw_create(4, p, &ao);
    for (int s = 0; s < STEPS; s++) {
        ctpu_optim_zero_grad(opt);
        ctpu_step_begin();
        for (int k = 0; k < N; k++) {
            ctpu_tensor x, y;
            batch(s, k, &x, &y);
            ck_assert_int_eq(ctpu_backward(loss_of(&m, x, y)), CTPU_OK);
        }
        ctpu_no_grad_begin();
        for (int i = 0; i < 4; i++) ck_assert_int_eq(ctpu_assign(ctpu_grad(p[i]), ctpu_div_scalar(ctpu_grad(p[i]), N)), CTPU_OK);
        ctpu_no_grad_end();
        ck_assert_int_eq(ctpu_optim_step(opt), CTPU_OK);
        ctpu_step_end();
    }
    read_params(&m, params);
    ctpu_optim_free(opt);
    ctpu_linear_free(&m.fc1);
    ctpu_linear_free(&m.fc2);
}

static void ddp_run(int m_i, int64_t bucket_bytes, bool overlap, float *params)
{
    set_mode(m_i);
    net m;
    net_init(&m, 7);
    ctpu_tensor p[4];
    params_of(&m, p);
    if (R != 0) {   /* rank 0's parameters must win: spoil the others' */
        ctpu_no_grad_begin();
        ctpu_assign(p[0], ctpu_add_scalar(p[0], 1.0));
        ctpu_no_grad_end();
    }
    ctpu_adamw_opts ao = ctpu_adamw_defaults();
    ao.lr = 0.05;
    ctpu_optim *opt = ctpu_adamw_create(4, p, &ao);
    ctpu_ddp_opts dop = ctpu_ddp_defaults();
    dop.bucket_bytes = bucket_bytes;
    dop.rng_per_microbatch = B * HID;   /* one dropout of [B, HID] per micro-batch */
    dop.overlap = overlap;
    ctpu_ddp *ddp = ctpu_ddp_create(4, p, &dop);
    ck_assert_msg(ddp != NULL, "%s", ctpu_last_error());
    for (int s = 0; s < STEPS; s++) {
        ctpu_optim_zero_grad(opt);
        ctpu_step_begin();
        ck_assert_int_eq(ctpu_ddp_step_begin(ddp), CTPU_OK);
        ctpu_tensor x, y;
        batch(s, R, &x, &y);
        ck_assert_int_eq(ctpu_backward(loss_of(&m, x, y)), CTPU_OK);
        ck_assert_int_eq(ctpu_ddp_sync_grads(ddp), CTPU_OK);
        ck_assert_int_eq(ctpu_optim_step(opt), CTPU_OK);
        ctpu_step_end();
    }
    read_params(&m, params);
    if (bucket_bytes < 1000) ck_assert_int_ge(ctpu_ddp_buckets(ddp), 3);
    else ck_assert_int_eq(ctpu_ddp_buckets(ddp), 1);
    /* overlap: every bucket started from the backward's hooks, none reduced at sync_grads */
    int64_t ov, bl;
    ctpu_ddp_overlap_counts(ddp, &ov, &bl);
    ck_assert_int_eq(ov, overlap ? (int64_t)ctpu_ddp_buckets(ddp) * STEPS : 0);
    ck_assert_int_eq(bl, overlap ? 0 : (int64_t)ctpu_ddp_buckets(ddp) * STEPS);
    ctpu_ddp_free(ddp);
    ctpu_optim_free(opt);
    ctpu_linear_free(&m.fc1);
    ctpu_linear_free(&m.fc2);
}

/* The world-size-N run equals, bit for bit, the one-process run that
 * accumulates the same N micro-batches in the same order, dropout included,
 * in every mode and with one or several buckets. */
START_TEST(ddp_equals_gradient_accumulation)
{
    static float ref[NPARAM], got[NPARAM];
    reference_run(ref);
    for (int m = 0; m < N_MODES; m++) {
        for (int b = 0; b < 4; b++) {
            ddp_run(m, b & 1 ? 256 : 25 << 20, b < 2, got);
            for (int i = 0; i < NPARAM; i++)
                ck_assert_msg(memcmp(&got[i], &ref[i], 4) == 0,
                              "%s, %s, %s: parameter element %d: DDP %.9g, accumulation %.9g", MODES[m].name,
                              b & 1 ? "small buckets" : "one bucket", b < 2 ? "overlap" : "no overlap", i, got[i],
                              ref[i]);
        }
    }
    set_mode(0);
}
END_TEST

START_TEST(ddp_shard_rows)
{
    int64_t lo, hi, at = 0;
    for (int r = 0; r < 3; r++) {   /* 96 rows of the last partial batch, 3 ranks: 32 each */
        ctpu_ddp_shard(96, r, 3, &lo, &hi);
        ck_assert(lo == at && hi - lo == 32);
        at = hi;
    }
    ctpu_ddp_shard(7, 1, 2, &lo, &hi);
    ck_assert(lo == 3 && hi == 7);
    ctpu_ddp_shard(INT64_MAX, 1, 2, &lo, &hi);
    ck_assert(hi == INT64_MAX && lo == INT64_MAX / 2);
    ck_assert(ctpu_ddp_create(0, NULL, NULL) == NULL && ctpu_last_status() == CTPU_ERR_INVALID_ARG);
    ctpu_ddp_opts o = ctpu_ddp_defaults();
    o.bucket_bytes = 0;
    ctpu_tensor t = ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 3 });
    ck_assert(ctpu_ddp_create(1, &t, &o) == NULL && ctpu_last_status() == CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_ddp_step_begin(NULL), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_ddp_sync_grads(NULL), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_ddp_buckets(NULL), 0);
    ctpu_release(t);
}
END_TEST

/* ------------------------------------------------------------ cost model */
START_TEST(ici_estimates)
{
    ctpu_ici_estimate e;
    /* v5e ring of 2 chips, 1 MB: 2*(1/2)*1e6 / (400e9/2) = 5 us + 2 hops */
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 0, 2, 1e6, CTPU_ICI_RING, &e), CTPU_OK);
    ck_assert(fabs(e.bw_s - 5e-6) < 1e-12);
    ck_assert(fabs(e.latency_s - 2e-6) < 1e-12);
    /* v5e 256 chips: a 16x16 torus; 1 MB: dim 1: 2*15/16*1e6/200e9, dim 2: 2*15/16*(1e6/16)/200e9 */
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 0, 256, 1e6, CTPU_ICI_TORUS, &e), CTPU_OK);
    ck_assert(e.dims == 2 && e.shape[0] == 16 && e.shape[1] == 16);
    double want = 2.0 * 15 / 16 * 1e6 / 200e9 + 2.0 * 15 / 16 * (1e6 / 16) / 200e9;
    ck_assert(fabs(e.bw_s - want) < 1e-12);
    ck_assert(fabs(e.latency_s - 60e-6) < 1e-12);
    /* 7x pod: 9216 = 16x24x24; v5p's largest slice 16x16x24 */
    ck_assert_int_eq(ctpu_ici_estimate_collective("7x", 0, ctpu_ici_lookup("7x")->pod_chips, 1e6, CTPU_ICI_TORUS, &e),
                     CTPU_OK);
    ck_assert(e.shape[0] == 16 && e.shape[1] == 24 && e.shape[2] == 24);
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5p", 0, 6144, 1e6, CTPU_ICI_TORUS, &e), CTPU_OK);
    ck_assert(e.shape[0] == 16 && e.shape[1] == 16 && e.shape[2] == 24);
    /* per-chip figures */
    ck_assert(ctpu_ici_lookup("v5e")->ici_gbytes_s == 400 && ctpu_ici_lookup("v6e")->ici_gbytes_s == 800);
    ck_assert(ctpu_ici_lookup("v5p")->ici_gbytes_s == 1200 && ctpu_ici_lookup("7x")->ici_gbytes_s == 1200);
    /* all_gather is one pass: half the all_reduce's bandwidth term */
    ctpu_ici_estimate g;
    ck_assert_int_eq(ctpu_ici_estimate_collective("v6e", 2, 8, 4e6, CTPU_ICI_TORUS, &g), CTPU_OK);
    ck_assert_int_eq(ctpu_ici_estimate_collective("v6e", 0, 8, 4e6, CTPU_ICI_TORUS, &e), CTPU_OK);
    ck_assert(fabs(2 * g.bw_s - e.bw_s) < 1e-15);
    /* bad arguments */
    ck_assert_int_eq(ctpu_ici_estimate_collective("v4", 0, 8, 1, CTPU_ICI_TORUS, &e), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 0, 0, 1, CTPU_ICI_TORUS, &e), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 0, 8, -1, CTPU_ICI_TORUS, &e), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 9, 8, 1, CTPU_ICI_TORUS, &e), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 0, 8, 1, CTPU_ICI_TORUS, NULL), CTPU_ERR_INVALID_ARG);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("dist");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, engine_world);
    tcase_add_test(tc, engine_per_rank_share);
    tcase_add_test(tc, engine_all_reduce);
    tcase_add_test(tc, engine_gather_scatter_broadcast);
    if (N >= 2) tcase_add_test(tc, engine_shape_mismatch);
    tcase_add_test(tc, ops_every_mode);
    if (N >= 2) tcase_add_test(tc, ops_shape_mismatch);
    tcase_add_test(tc, ddp_equals_gradient_accumulation);
    tcase_add_test(tc, ddp_shard_rows);
    tcase_add_test(tc, ici_estimates);
    suite_add_tcase(s, tc);
    return s;
}

/* ------------------------------------------------------------ fault scenarios */
static int scenario_fault(bool die)
{
    /* three quick steps so the SIGTERM line has a step to name */
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = (float)i;
    char err[256];
    for (int64_t step = 1; step <= 3; step++) {
        if (step == 3 && R == 1) {
            if (die) {
                fprintf(stderr, "dist_worker: rank 1 exits before step 3's all_reduce\n");
                fflush(stderr);
                _exit(3);
            }
            fprintf(stderr, "dist_worker: rank 1 stops calling collectives\n");
            fflush(stderr);
            sleep(60);
            _exit(0);
        }
        ctpu_coll_call c = { .kind = CTPU_COLL_ALL_REDUCE, .op = CTPU_DIST_SUM, .dtype = CTPU_F32, .ndim = 1,
                             .shape = { 64 }, .bucket = 0, .step = step, .in = x, .out = y };
        if (ctpu__dist_run(&c, err, sizeof err) != CTPU_OK) {
            fprintf(stderr, "dist_worker: %s\n", err);
            return 1;
        }
    }
    return 0;
}

/* A rank killed inside a real DDP step (the ops path: strict eager, the
 * collective on the device thread): rank 1 SIGKILLs itself after step 2's
 * forward, before the backward whose gradient hooks start its bucket's
 * all_reduce (overlap); rank 0's device thread is then in that all_reduce
 * (bucket 0, step 2: two steps marked before it), started from its backward
 * and waited for in ctpu_ddp_sync_grads. */
static int scenario_die_ddp(bool hang)
{
    net m;   /* net_init without its Check assertions (no test is running here) */
    ctpu_manual_seed(7);
    if (ctpu_linear_init(&m.fc1, IN, HID, true, CTPU_F32) != CTPU_OK ||
        ctpu_linear_init(&m.fc2, HID, OUT, true, CTPU_F32) != CTPU_OK)
        return 1;
    ctpu_tensor p[4];
    params_of(&m, p);
    ctpu_ddp *ddp = ctpu_ddp_create(4, p, NULL);
    if (!ddp) return 1;
    for (int s = 0; s < 5; s++) {
        ctpu_step_begin();
        ctpu_tensor x, y;
        batch(s, R, &x, &y);
        ctpu_tensor loss = loss_of(&m, x, y);
        if (s == 2 && R == 1) {
            /* before the backward, whose gradient hooks start bucket 0's all_reduce (overlap) */
            if (hang) {
                fprintf(stderr, "dist_worker: rank 1 stops calling collectives\n");
                fflush(stderr);
                sleep(60);
                _exit(0);
            }
            fprintf(stderr, "dist_worker: rank 1 kills itself before step 2's all_reduce\n");
            fflush(stderr);
            raise(SIGKILL);
        }
        if (ctpu_backward(loss) != CTPU_OK) return 1;
        if (ctpu_ddp_sync_grads(ddp) != CTPU_OK) return 1;
        ctpu_step_end();
        if (ctpu_sync() != CTPU_OK) return 1;
    }
    ctpu_ddp_free(ddp);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "suite";
    setenv("CTPU_QUIET", "1", 1);
    if (ctpu_dist_init() != CTPU_OK) {
        fprintf(stderr, "dist_worker: ctpu_dist_init: %s\n", ctpu_last_error());
        return 1;
    }
    R = ctpu_dist_rank();
    N = ctpu_dist_world_size();
    int rc;
    if (!strcmp(mode, "die_ddp") || !strcmp(mode, "hang_ddp")) {
        rc = scenario_die_ddp(!strcmp(mode, "hang_ddp"));
    } else if (!strcmp(mode, "die") || !strcmp(mode, "hang")) {
        rc = scenario_fault(!strcmp(mode, "die"));
    } else {
        SRunner *sr = srunner_create(suite());
        srunner_set_fork_status(sr, CK_NOFORK);
        srunner_run_all(sr, R == 0 ? CK_NORMAL : CK_SILENT);
        int nf = srunner_ntests_failed(sr);
        srunner_free(sr);
        if (nf) fprintf(stderr, "dist_worker: rank %d: %d failed\n", R, nf);
        rc = nf ? 1 : 0;
    }
    ctpu_dist_shutdown();
    return rc;
}
