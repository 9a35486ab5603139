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
#include <unistd.h>

#include "ctpu.h"
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

static void engine_all_reduce_dt(int dtype, int op)
{
    int64_t n = 1003;   /* not a multiple of the world size */
    size_t es = dtype == CTPU_BF16 ? 2 : 4;
    char *in = malloc((size_t)n * es), *out = malloc((size_t)n * es), *want = malloc((size_t)n * es);
    char **all = malloc(sizeof(char *) * (size_t)N);
    for (int r = 0; r < N; r++) {
        all[r] = malloc((size_t)n * es);
        for (int64_t i = 0; i < n; i++) {
            float v = val(r, i);
            if (dtype == CTPU_F32) ((float *)all[r])[i] = v;
            else if (dtype == CTPU_BF16) ((uint16_t *)all[r])[i] = ctpu_f32_to_bf16(v);
            else ((int32_t *)all[r])[i] = (int32_t)(i * 1000003 + r * 7919) * (r + 1);
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
    engine_all_reduce_dt(CTPU_F32, CTPU_DIST_SUM);
    engine_all_reduce_dt(CTPU_F32, CTPU_DIST_MEAN);
    engine_all_reduce_dt(CTPU_BF16, CTPU_DIST_SUM);
    engine_all_reduce_dt(CTPU_BF16, CTPU_DIST_MEAN);
    engine_all_reduce_dt(CTPU_I32, CTPU_DIST_SUM);
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
    if (!strcmp(mode, "die") || !strcmp(mode, "hang")) {
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
