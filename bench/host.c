/* Host work per op, as the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID:
 * the device's worker threads and other programs on a shared machine do not
 * count), medians of runs. Prints `name value unit` lines:
 *   record_cpu_ns_per_op   recording ctpu_add_scalar in defer and fuse (20 steps
 *                          of 400 ops in step scopes; the first step runs the
 *                          loop detector, as a program that has not marked a step)
 *   strict_cpu_ns_per_op   one strict-eager ctpu_add of two f32[16] (launch included)
 *   cache_hit_cpu_us_500   ctpu_step_end of a 500-op step whose program is cached
 * The same workloads are the instruction-count harness (valgrind is not a
 * dependency; run it by hand), one section per run:
 *   TORCH_TPU_DEFER_AND_FUSE=1 valgrind --tool=callgrind --toggle-collect=ctpu_add_scalar ./host record
 *   valgrind --tool=callgrind --separate-threads=yes --toggle-collect=ctpu_add ./host strict
 *   valgrind --tool=callgrind --separate-threads=yes --toggle-collect=ctpu_step_end ./host hit
 * and divide the calling thread's Ir by the count the section prints (its
 * ops, or its cache hits). */
#include <ctpu.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"

#define RUNS 9

static double cpu_ns(void) { return 1e9 * bench_clock(CLOCK_THREAD_CPUTIME_ID); }

#define CHECK(x)                                                                  \
    do {                                                                          \
        if (!(x)) {                                                               \
            fprintf(stderr, "bench/host: %s failed: %s\n", #x, ctpu_last_error()); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

/* 20 steps x 400 recorded add_scalar on f32[1024]; checks the result. */
static double record_once(ctpu_tensor x)
{
    double ns = 0;
    ctpu_tensor t = x;
    for (int k = 0; k < 20; k++) {
        CHECK(ctpu_step_begin() == CTPU_OK);
        t = x;
        double t0 = cpu_ns();
        for (int i = 0; i < 400; i++) t = ctpu_add_scalar(t, 1.0);
        ns += cpu_ns() - t0;
        CHECK(!ctpu_is_null(ctpu_keep(t)));
        CHECK(ctpu_step_end() == CTPU_OK);
        if (k < 19) ctpu_release(t);
    }
    float v[4];
    CHECK(ctpu_to_host(ctpu_slice(t, 0, 0, 4, 1), v, sizeof v) == CTPU_OK);
    CHECK(v[0] == 400.0f && v[3] == 400.0f);
    ctpu_release(t);
    return ns / 8000;
}

static void bench_record(void)
{
    double r[RUNS];
    int64_t n = 1024;
    for (int k = 0; k < RUNS; k++) {
        /* a fresh runtime each run: the first step runs the loop detector */
        CHECK(ctpu_init() == CTPU_OK);
        CHECK(ctpu_set_mode(CTPU_MODE_DEFER_FUSE) == CTPU_OK);
        ctpu_tensor x = ctpu_zeros(CTPU_F32, 1, &n);
        CHECK(ctpu_sync() == CTPU_OK);
        r[k] = record_once(x);
        ctpu_shutdown();
    }
    printf("record_ops %d ops\n", 8000 * RUNS);
    printf("record_cpu_ns_per_op %.1f ns\n", median(r, RUNS));
}

static void bench_strict(void)
{
    enum { OPS = 2000 };
    static ctpu_tensor out[OPS];
    CHECK(ctpu_init() == CTPU_OK);
    CHECK(ctpu_set_mode(CTPU_MODE_STRICT) == CTPU_OK);
    int64_t n = 16;
    float data[16], got[16];
    for (int i = 0; i < 16; i++) data[i] = (float)i;
    ctpu_tensor x = ctpu_from_host(data, CTPU_F32, 1, &n);
    ctpu_tensor y = ctpu_add(x, x);
    CHECK(ctpu_to_host(y, got, sizeof got) == CTPU_OK);
    for (int i = 0; i < 16; i++) CHECK(got[i] == 2.0f * data[i]);
    ctpu_release(y);
    double s[RUNS];
    for (int k = -1; k < RUNS; k++) {   /* k = -1 warms the program table */
        double t0 = cpu_ns();
        for (int i = 0; i < OPS; i++) out[i] = ctpu_add(x, x);
        double dt = cpu_ns() - t0;
        if (k >= 0) s[k] = dt / OPS;
        CHECK(ctpu_sync() == CTPU_OK);
        for (int i = 0; i < OPS; i++) ctpu_release(out[i]);
    }
    ctpu_shutdown();
    printf("strict_ops %d ops\n", OPS * (RUNS + 1));
    printf("strict_cpu_ns_per_op %.1f ns\n", median(s, RUNS));
}

static void bench_hit(void)
{
    CHECK(ctpu_init() == CTPU_OK);
    CHECK(ctpu_set_mode(CTPU_MODE_DEFER_FUSE) == CTPU_OK);
    int64_t n = 16;
    ctpu_tensor x = ctpu_keep(ctpu_ones(CTPU_F32, 1, &n));
    CHECK(ctpu_mark_step() == CTPU_OK);
    double hit[15 * RUNS / 3];
    int nh = 0;
    for (int k = -1; k < 15 * RUNS / 3; k++) {
        /* k = -1 compiles, in a plain scope cut by mark_step (the same
         * trace), so that every ctpu_step_end is a cache hit */
        CHECK((k < 0 ? ctpu_scope_begin() : ctpu_step_begin()) == CTPU_OK);
        ctpu_tensor t = x;
        for (int i = 0; i < 500; i++) {
            ctpu_tensor u = (i % 2) ? ctpu_mul_scalar(t, 0.5) : ctpu_add_scalar(t, 1.0);
            if (i) ctpu_release(t);   /* only the result stays alive: one live-out */
            t = u;
        }
        ctpu_keep(t);
        if (k < 0) {
            CHECK(ctpu_scope_end() == CTPU_OK && ctpu_mark_step() == CTPU_OK);
        } else {
            double t0 = cpu_ns();
            CHECK(ctpu_step_end() == CTPU_OK);
            hit[nh++] = cpu_ns() - t0;
        }
        CHECK(ctpu_sync() == CTPU_OK);
        ctpu_release(t);
    }
    ctpu_cache_info ci;
    CHECK(ctpu_cache_get_info(&ci) == CTPU_OK);
    CHECK(ci.hits == (uint64_t)nh && ci.compiles == 2);   /* ones, and the 500-op step */
    ctpu_release(x);
    ctpu_shutdown();
    printf("cache_hits %d cuts\n", nh);
    printf("cache_hit_cpu_us_500 %.2f us\n", median(hit, nh) / 1e3);
}

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    setenv("CTPU_NUM_THREADS", "1", 0);
    setenv("CTPU_QUIET", "1", 0);   /* no cache summary line at each shutdown */
    if (!only || strcmp(only, "record") == 0) bench_record();
    if (!only || strcmp(only, "strict") == 0) bench_strict();
    if (!only || strcmp(only, "hit") == 0) bench_hit();
    return 0;
}
