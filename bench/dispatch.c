/* Host cost of one strict-eager op and the round trip of one debug-eager op,
 * on a 16-element tensor. Prints `name value unit` lines (medians of runs). */
#include <ctpu.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "bench.h"

static double now_ns(void) { return 1e9 * bench_clock(CLOCK_MONOTONIC); }

#define RUNS 15
#define OPS 2000

/* ns per op for OPS dispatches of y = x + x (each result released). */
static double time_ops(ctpu_tensor x, int ops)
{
    ctpu_tensor out[OPS];
    double t0 = now_ns();
    for (int i = 0; i < ops; i++) out[i] = ctpu_add(x, x);
    double t1 = now_ns();
    ctpu_sync();
    for (int i = 0; i < ops; i++) ctpu_release(out[i]);
    return (t1 - t0) / ops;
}

int main(void)
{
    if (ctpu_init() != CTPU_OK) { fprintf(stderr, "%s\n", ctpu_last_error()); return 1; }
    float data[16];
    for (int i = 0; i < 16; i++) data[i] = (float)i;
    int64_t shape[1] = { 16 };
    ctpu_tensor x = ctpu_from_host(data, CTPU_F32, 1, shape);

    /* validate: x + x == 2x */
    ctpu_tensor y = ctpu_add(x, x);
    float got[16];
    if (ctpu_to_host(y, got, sizeof got) != CTPU_OK) { fprintf(stderr, "%s\n", ctpu_last_error()); return 1; }
    for (int i = 0; i < 16; i++)
        if (got[i] != 2.0f * data[i]) { fprintf(stderr, "dispatch bench: wrong result\n"); return 1; }
    ctpu_release(y);

    double s[RUNS], d[RUNS];
    ctpu_set_mode(CTPU_MODE_STRICT);
    time_ops(x, OPS); /* warm: program table, allocator */
    for (int r = 0; r < RUNS; r++) s[r] = time_ops(x, OPS);
    ctpu_set_mode(CTPU_MODE_DEBUG);
    ctpu_set_debug_checks(false);
    time_ops(x, 200);
    for (int r = 0; r < RUNS; r++) d[r] = time_ops(x, 500);
    ctpu_set_debug_checks(true);
    double dc[RUNS];
    for (int r = 0; r < RUNS; r++) dc[r] = time_ops(x, 500);

    printf("strict_op_host_ns %.1f ns\n", median(s, RUNS));
    printf("debug_op_roundtrip_ns %.1f ns\n", median(d, RUNS));
    printf("debug_op_roundtrip_checks_ns %.1f ns\n", median(dc, RUNS));
    printf("ratio_strict_vs_goal_250ns %.3f x\n", 250.0 / median(s, RUNS));
    printf("ratio_debug_vs_goal_2us %.3f x\n", 2000.0 / median(d, RUNS));
    ctpu_release(x);   /* (left to ctpu_shutdown, it was reported as a leak) */
    ctpu_shutdown();
    return 0;
}
