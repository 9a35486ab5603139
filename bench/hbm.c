/* Steady-state cost of an HBM buffer alloc + free (1 MiB and 64 MiB), and
 * of touching every page of it, against touching fresh pages from mmap: a
 * step loop must get its buffers from memory the allocator keeps (a fresh
 * 4 KiB page costs ~11 us to touch here). Prints `name value unit` lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "ctpu.h"
#include "eager/eager.h"
#include "bench.h"

static double now_ns(void) { return 1e9 * bench_clock(CLOCK_MONOTONIC); }

static void touch(char *p, size_t bytes)
{
    for (size_t i = 0; i < bytes; i += 4096) p[i] = (char)i;
}

static void bench_size(size_t bytes, const char *tag)
{
    ctpu_device *dev = ctpu_rt->dev;
    char err[256];
    double af[31], at[31], fresh[7];
    for (int r = 0; r < 31; r++) {
        double t0 = now_ns();
        ctpu_buffer *b = ctpu_buffer_alloc(dev, bytes, err, sizeof err);
        double t1 = now_ns();
        if (!b) { fprintf(stderr, "bench/hbm: %s\n", err); exit(1); }
        touch(b->data, bytes);
        double t2 = now_ns();
        ctpu_buffer_release(dev, b);
        double t3 = now_ns();
        af[r] = (t1 - t0) + (t3 - t2);
        at[r] = t2 - t1;
    }
    for (int r = 0; r < 7; r++) {
        char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) { perror("mmap"); exit(1); }
        double t0 = now_ns();
        touch(p, bytes);
        fresh[r] = now_ns() - t0;
        munmap(p, bytes);
    }
    double a = median(af, 31), t = median(at, 31), f = median(fresh, 7);
    printf("hbm_alloc_free_%s_ns %.1f ns\n", tag, a);
    printf("hbm_touch_reused_%s_us %.1f us\n", tag, t / 1e3);
    printf("touch_fresh_pages_%s_us %.1f us\n", tag, f / 1e3);
    printf("ratio_fresh_vs_reused_touch_%s %.2f x\n", tag, f / t);
}

int main(void)
{
    setenv("CTPU_QUIET", "1", 0);
    if (ctpu_init() != CTPU_OK) { fprintf(stderr, "%s\n", ctpu_last_error()); return 1; }
    bench_size((size_t)1 << 20, "1mib");
    bench_size((size_t)64 << 20, "64mib");
    ctpu_shutdown();
    return 0;
}
