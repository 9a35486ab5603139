/* Checkpoint throughput: ctpu_save (device reads, a temporary file, fsync,
 * rename) and ctpu_load (header checks, reads, device copies, assigns) of
 * 64 MiB in 8 f32 tensors, median of 5, in /tmp (or $CTPU_BENCH_DIR). The
 * load is validated against the saved values before timing. Prints
 * `name value unit` lines. fsync makes the save depend on the disk. */
#include <ctpu.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "bench.h"

#define N_T 8
#define ELEMS (2 * 1024 * 1024)   /* 8 MiB of f32 each */
#define REPS 5

static double now_s(void) { return bench_clock(CLOCK_MONOTONIC); }

int main(void)
{
    if (ctpu_init() != CTPU_OK) { fprintf(stderr, "checkpoint: %s\n", ctpu_last_error()); return 1; }
    const char *dir = getenv("CTPU_BENCH_DIR") ? getenv("CTPU_BENCH_DIR") : "/tmp";
    char path[4096];
    snprintf(path, sizeof path, "%s/ctpu_bench_%ld.safetensors", dir, (long)getpid());
    int64_t shape[2] = { 2048, ELEMS / 2048 };
    ctpu_tensor src[N_T], dst[N_T];
    char names_buf[N_T][16];
    const char *names[N_T];
    for (int i = 0; i < N_T; i++) {
        snprintf(names_buf[i], sizeof names_buf[i], "layer%d.weight", i);
        names[i] = names_buf[i];
        src[i] = ctpu_rand_normal(CTPU_F32, 2, shape, 0.0, 1.0);
        dst[i] = ctpu_zeros(CTPU_F32, 2, shape);
    }
    double ts[REPS], tl[REPS];
    float *a = malloc(sizeof(float) * ELEMS), *b = malloc(sizeof(float) * ELEMS);
    for (int r = 0; r < REPS; r++) {
        ctpu_sync();
        double t0 = now_s();
        if (ctpu_save(path, N_T, names, src) != CTPU_OK) { fprintf(stderr, "checkpoint: %s\n", ctpu_last_error()); return 1; }
        double t1 = now_s();
        if (ctpu_load(path, N_T, names, dst) != CTPU_OK) { fprintf(stderr, "checkpoint: %s\n", ctpu_last_error()); return 1; }
        double t2 = now_s();
        ts[r] = t1 - t0;
        tl[r] = t2 - t1;
        if (r == 0)
            for (int i = 0; i < N_T; i++) {
                ctpu_to_host(src[i], a, sizeof(float) * ELEMS);
                ctpu_to_host(dst[i], b, sizeof(float) * ELEMS);
                if (memcmp(a, b, sizeof(float) * ELEMS)) { fprintf(stderr, "checkpoint: tensor %d differs\n", i); return 1; }
            }
    }
    unlink(path);
    qsort(ts, REPS, sizeof(double), cmp_d);
    qsort(tl, REPS, sizeof(double), cmp_d);
    double mib = (double)N_T * ELEMS * 4 / (1024.0 * 1024.0);
    printf("checkpoint_save_64MiB %.1f ms\n", ts[REPS / 2] * 1e3);
    printf("checkpoint_save_throughput %.0f MiB/s\n", mib / ts[REPS / 2]);
    printf("checkpoint_load_64MiB %.1f ms\n", tl[REPS / 2] * 1e3);
    printf("checkpoint_load_throughput %.0f MiB/s\n", mib / tl[REPS / 2]);
    free(a);
    free(b);
    ctpu_shutdown();
    return 0;
}
