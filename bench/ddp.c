/* bench/ddp (issue 19): data-parallel training steps per second, run under
 * mpirun (bench/ddp.sh starts it at 1 and 2 processes). The Fashion-MNIST
 * MLP 784-256-128-10 with AdamW on synthetic data, global batch 128 split
 * over the ranks, one gradient bucket (DDP's 25 MiB default). Validates
 * first: after the timed steps every rank holds rank 0's parameters, bit
 * for bit. Rank 0 prints `name value unit` lines, the medians of 3 runs
 * (names ddp_np<N>[_fused][_kept]_...: _fused in defer and fuse, _kept with
 * argv[2] = "kept", the all_reduce kept inside the step's trace):
 *   ddp_np<N>_steps_per_s, ddp_np<N>_images_per_s, and the estimates for a
 *   TPU pod of N chips (the emulated chip, v5e by default):
 *   est_ici_us_per_step, est_compute_us_per_step, est_comm_fraction; and
 *   measured on this machine, comm_wall_us_per_step and comm_wall_fraction
 *   (the device thread's time inside collectives, waiting included).
 * argv[3] = bucket KiB (default 25 MiB: one bucket, which starts only when
 * the last gradient is final, so nothing overlaps) and argv[4] "blocking"
 * (ctpu_ddp_opts.overlap off) add _b<K>k[_blocking] to the names; with
 * overlap (the default) and several buckets, the measured overlap:
 *   overlap_share (the started all_reduces' time in flight that the
 *   device thread did not wait for: hidden under the backward's compute),
 *   comm_in_flight_us_per_step, comm_exposed_us_per_step, and
 *   buckets_overlapped / buckets_blocking per step. */
#include <ctpu.h>
#include <ctpu_nn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"

static double now_s(void) { return bench_clock(CLOCK_MONOTONIC); }

static int fail(const char *what)
{
    fprintf(stderr, "bench/ddp: rank %d: %s: %s\n", ctpu_dist_rank(), what, ctpu_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 100;
    if (steps < 1) steps = 1;
    setenv("CTPU_QUIET", "1", 0);
    if (ctpu_dist_init() != CTPU_OK) return fail("ctpu_dist_init");
    int R = ctpu_dist_rank(), N = ctpu_dist_world_size();
    /* argv[2] "kept": in defer and fuse, the gradient all_reduce stays in
     * the step's trace (ctpu_dist_set_collective_cut(false)); the names
     * then carry a _kept suffix */
    bool kept = argc > 2 && strcmp(argv[2], "kept") == 0;
    if (kept) ctpu_dist_set_collective_cut(false);
    long bucket_kib = argc > 3 ? atol(argv[3]) : 0;
    bool blocking = argc > 4 && strcmp(argv[4], "blocking") == 0;
    char tag[64], btag[32] = "";
    if (bucket_kib > 0) snprintf(btag, sizeof btag, "_b%ldk%s", bucket_kib, blocking ? "_blocking" : "");
    snprintf(tag, sizeof tag, "np%d%s%s%s", N, ctpu_get_mode() == CTPU_MODE_DEFER_FUSE ? "_fused" : "",
             kept ? "_kept" : "", btag);
    enum { GB = 128, IN = 784, OUT = 10 };
    ctpu_manual_seed(1);
    ctpu_linear l1, l2, l3;
    if (ctpu_linear_init(&l1, IN, 256, true, CTPU_F32) || ctpu_linear_init(&l2, 256, 128, true, CTPU_F32) ||
        ctpu_linear_init(&l3, 128, OUT, true, CTPU_F32))
        return fail("model");
    ctpu_tensor p[6] = { l1.weight, l1.bias, l2.weight, l2.bias, l3.weight, l3.bias };
    ctpu_adamw_opts ao = ctpu_adamw_defaults();
    ctpu_optim *opt = ctpu_adamw_create(6, p, &ao);
    ctpu_ddp_opts dop = ctpu_ddp_defaults();
    if (bucket_kib > 0) dop.bucket_bytes = (int64_t)bucket_kib << 10;
    dop.overlap = !blocking;
    ctpu_ddp *ddp = ctpu_ddp_create(6, p, &dop);
    if (!opt || !ddp) return fail("optimizer / DDP");
    int64_t lo, hi;
    ctpu_ddp_shard(GB, R, N, &lo, &hi);
    int64_t rows = hi - lo;
    float *xs = malloc(sizeof(float) * (size_t)(rows * IN));
    int32_t *ys = malloc(sizeof(int32_t) * (size_t)rows);
    for (int64_t i = 0; i < rows; i++) {
        ys[i] = (int32_t)((lo + i) % OUT);
        for (int j = 0; j < IN; j++) xs[i * IN + j] = sinf((float)((lo + i) * IN + j) * 0.01f);
    }
    double sps[3], timed_s = 0;
    for (int run = 0; run < 4; run++) {   /* run 0 warms up (compiles, page faults) */
        ctpu_sync();
        double t0 = now_s();
        for (int s = 0; s < (run ? steps : 10); s++) {
            ctpu_optim_zero_grad(opt);
            ctpu_step_begin();
            ctpu_ddp_step_begin(ddp);
            ctpu_tensor x = ctpu_from_host(xs, CTPU_F32, 2, (int64_t[]){ rows, IN });
            ctpu_tensor y = ctpu_from_host(ys, CTPU_I32, 1, &rows);
            ctpu_tensor h = ctpu_relu(ctpu_linear_forward(&l2, ctpu_relu(ctpu_linear_forward(&l1, x))));
            if (ctpu_backward(ctpu_cross_entropy(ctpu_linear_forward(&l3, h), y, NULL)) != CTPU_OK) return fail("backward");
            if (ctpu_ddp_sync_grads(ddp) != CTPU_OK) return fail("sync_grads");
            if (ctpu_optim_step(opt) != CTPU_OK) return fail("optimizer step");
            ctpu_step_end();
        }
        if (ctpu_sync() != CTPU_OK) return fail("sync");
        if (run) sps[run - 1] = steps / (now_s() - t0), timed_s += now_s() - t0;
        if (run == 0) ctpu_metrics_clear();   /* the estimates count the timed steps */
    }
    /* validate: every rank holds rank 0's parameters */
    int same = 1;
    for (int i = 0; i < 6; i++) {
        int64_t n = ctpu_numel(p[i]);
        float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
        ctpu_scope_begin();
        if (ctpu_to_host(p[i], a, (size_t)n * 4) || ctpu_to_host(ctpu_broadcast(p[i], 0), b, (size_t)n * 4))
            return fail("validation");
        ctpu_scope_end();
        same &= memcmp(a, b, (size_t)n * 4) == 0;
        free(a);
        free(b);
    }
    ctpu_scope_begin();
    double all_same = 0;
    ctpu_item(ctpu_all_reduce(ctpu_full(CTPU_F32, 0, NULL, same), CTPU_DIST_SUM), &all_same);
    ctpu_scope_end();
    qsort(sps, 3, sizeof sps[0], cmp_d);
    ctpu_dist_stats ds;
    ctpu_dist_get_stats(&ds);
    double st = ds.steps ? (double)ds.steps : 1;
    double comm = ds.est_ici_s / st * 1e6, comp = ds.est_compute_s / st * 1e6;
    if (R == 0) {
        printf("ddp_%s_params_identical %d bool\n", tag, all_same == N);
        printf("ddp_%s_steps_per_s %.1f steps/s\n", tag, sps[1]);
        printf("ddp_%s_images_per_s %.0f images/s\n", tag, sps[1] * GB);
        printf("ddp_%s_est_ici_us_per_step %.2f us\n", tag, comm);
        printf("ddp_%s_est_compute_us_per_step %.2f us\n", tag, comp);
        printf("ddp_%s_est_comm_fraction %.1f %%\n", tag, comp + comm > 0 ? 100 * comm / (comp + comm) : 0.0);
        printf("ddp_%s_est_ici_us_per_step_at_256 %.2f us\n", tag, ds.est_ici_s_256 / st * 1e6);
        /* measured here: the device thread's time in collectives (waiting for the other rank included) */
        printf("ddp_%s_comm_wall_us_per_step %.1f us\n", tag, ds.comm_wall_s / (3.0 * steps) * 1e6);
        printf("ddp_%s_comm_wall_fraction %.1f %%\n", tag, timed_s > 0 ? 100 * ds.comm_wall_s / timed_s : 0.0);
        int64_t ov, bl;
        ctpu_ddp_overlap_counts(ddp, &ov, &bl);
        printf("ddp_%s_buckets %d buckets\n", tag, ctpu_ddp_buckets(ddp));
        printf("ddp_%s_buckets_overlapped_per_step %.2f buckets\n", tag, (double)ov / (10.0 + 3.0 * steps));
        if (ds.started) {
            double hidden = ds.started_in_flight_s - ds.started_exposed_s;
            printf("ddp_%s_comm_in_flight_us_per_step %.1f us\n", tag, ds.started_in_flight_s / (3.0 * steps) * 1e6);
            printf("ddp_%s_comm_exposed_us_per_step %.1f us\n", tag, ds.started_exposed_s / (3.0 * steps) * 1e6);
            printf("ddp_%s_overlap_share %.1f %%\n", tag,
                   ds.started_in_flight_s > 0 ? 100 * (hidden > 0 ? hidden : 0) / ds.started_in_flight_s : 0.0);
        }
        fflush(stdout);
        ctpu_dist_report(stderr);
    }
    int rc = all_same == N ? 0 : 1;
    free(xs);
    free(ys);
    ctpu_ddp_free(ddp);
    ctpu_optim_free(opt);
    ctpu_linear_free(&l1);
    ctpu_linear_free(&l2);
    ctpu_linear_free(&l3);
    ctpu_dist_shutdown();
    return rc;
}
