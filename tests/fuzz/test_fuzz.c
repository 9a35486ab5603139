/* The short differential fuzz run of the default suite (issue 7), plus the
 * minimised cases it has found (regressions). Each program is generated and
 * run in strict eager, debug eager and defer and fuse in a forked child; a
 * failure is minimised and printed as a C test (see fz.h).
 * CTPU_TEST_FUZZ_SEED / CTPU_TEST_FUZZ_COUNT override the seed and the count. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "fz.h"

/* A minimised case must give the same transcript in every mode. */
static void fz_expect_parity(const fz_prog *p)
{
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    char why[512] = "";
    bool skipped = false;
    bool ok = fz_check(p, why, sizeof why, &skipped);
    ctpu_shutdown();
    ck_assert_msg(ok, "modes differ: %s", why);
    ck_assert_msg(!skipped, "the case hit a resource error");
}

#include "regressions.inc"

/* A hand-written program through every path of the harness: data with NaN,
 * an elementwise chain, a matmul, a reduction, an assign, a host read, a
 * mark_step, autograd. */
static const fz_prog selftest_prog = { .seed = 7, .n = 10, .ins = {
    { .kind = FZ_FROM_HOST, .dt = CTPU_F32, .nd = 2, .a = -1, .b = -1, .c = -1, .data = 1, .shape = { 5, 7 } },
    { .kind = FZ_REQ_GRAD, .a = 0, .b = -1, .c = -1, .flag = 1 },
    { .kind = FZ_UNARY, .sub = 6, .a = 0, .b = -1, .c = -1 },                       /* tanh */
    { .kind = FZ_FROM_HOST, .dt = CTPU_BF16, .nd = 2, .a = -1, .b = -1, .c = -1, .data = 2, .shape = { 7, 3 } },
    { .kind = FZ_MATMUL, .a = 2, .b = 3, .c = -1 },
    { .kind = FZ_REDUCE, .sub = 0, .nd = 1, .p = { 1 }, .a = 4, .b = -1, .c = -1 },  /* sum over dim 1 */
    { .kind = FZ_READ, .a = 5, .b = -1, .c = -1 },
    { .kind = FZ_MARK_STEP, .a = -1, .b = -1, .c = -1 },
    { .kind = FZ_BACKWARD, .a = 4, .b = -1, .c = -1 },
    { .kind = FZ_ASSIGN, .a = 2, .b = 2, .c = -1 },
} };

START_TEST(harness_selftest)
{
    fz_expect_parity(&selftest_prog);
    /* a difference in one mode is seen, and minimisation keeps it */
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    char why[512] = "";
    bool skipped;
    fz_test_corrupt_mode = CTPU_MODE_DEFER_FUSE;
    ck_assert(!fz_check(&selftest_prog, why, sizeof why, &skipped));
    ck_assert_msg(strstr(why, "defer_fuse") != NULL, "%s", why);
    fz_test_corrupt_mode = -1;
    ck_assert(fz_check(&selftest_prog, why, sizeof why, &skipped));
    ctpu_shutdown();
    /* the same program, generated from a seed, twice: the same calls */
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    fz_opts o = { .max_ins = 30, .autograd = true, .invalid = true };
    fz_rng r1, r2;
    fz_rng_seed(&r1, 42);
    fz_rng_seed(&r2, 42);
    static fz_prog a, b;
    fz_generate(&r1, &o, &a, NULL);
    fz_generate(&r2, &o, &b, NULL);
    ck_assert_int_eq(a.n, 30);
    ck_assert(memcmp(&a, &b, sizeof a) == 0);
    ctpu_shutdown();
}
END_TEST

static bool fails_in_process(const fz_prog *p, void *ctx)
{
    (void)ctx;
    char why[512];
    bool skipped;
    return !fz_check(p, why, sizeof why, &skipped);
}

START_TEST(minimiser_shrinks)
{
    /* with a corrupted transcript every program fails: minimisation must
     * get a 40-call program down to one call that records a value */
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    fz_opts o = { .max_ins = 40, .autograd = true, .invalid = true };
    fz_rng r;
    fz_rng_seed(&r, 9);
    static fz_prog p;
    fz_generate(&r, &o, &p, NULL);
    fz_test_corrupt_mode = CTPU_MODE_DEBUG;
    ck_assert(fails_in_process(&p, NULL));
    fz_minimise(&p, fails_in_process, NULL);
    ck_assert_int_eq(p.n, 1);
    fz_test_corrupt_mode = -1;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    fz_print_c(&p, "fuzz_case", f);
    fclose(f);
    ck_assert_msg(strstr(buf, "START_TEST(fuzz_case_parity)") && strstr(buf, "r0 = ctpu_"), "%s", buf);
    free(buf);
    ctpu_shutdown();
}
END_TEST

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 10) : dflt;
}

static void campaign(bool autograd, uint64_t seed, int count)
{
    fz_opts o = { .max_ins = 40, .autograd = autograd, .invalid = true };
    int ran = 0, skipped = 0;
    int failures = fz_campaign(seed, count, &o, stderr, &ran, &skipped);
    fprintf(stderr, "fuzz: %d programs from seed %llu (autograd %s): %d failing, %d skipped (resource errors)\n",
            ran, (unsigned long long)seed, autograd ? "on" : "off", failures, skipped);
    ck_assert_int_eq(failures, 0);
    ck_assert_int_eq(ran, count);
    if (!autograd || count < 100) return;
    /* the programs pushed and popped region labels (issue 11): generated
     * here again, in this process, and counted */
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    fz_rng r;
    fz_rng_seed(&r, seed);
    static fz_prog p;
    int push = 0, pop = 0;
    for (int k = 0; k < 100; k++) {
        fz_generate(&r, &o, &p, NULL);
        for (int i = 0; i < p.n; i++) {
            push += p.ins[i].kind == FZ_LABEL_PUSH;
            pop += p.ins[i].kind == FZ_LABEL_POP;
        }
    }
    ctpu_shutdown();
    fprintf(stderr, "fuzz: 100 of those programs hold %d label_push and %d label_pop\n", push, pop);
    ck_assert(push > 0 && pop > 0);
    ck_assert_int_le(skipped, count / 10);
    /* and loops of steps over one structure whose shapes vary past the
     * recompile limit (issue 11): the campaign's limit, here in this
     * process, where the fallbacks can be counted */
    setenv("TORCH_TPU_RECOMPILE_LIMIT", FZ_RECOMPILE_LIMIT, 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    fz_rng_seed(&r, seed);
    int varlen = 0, checked = 0;
    for (int k = 0; k < 100; k++) {
        fz_generate(&r, &o, &p, NULL);
        int v = 0;
        for (int i = 0; i < p.n; i++) v += p.ins[i].kind == FZ_VARLEN;
        varlen += v;
        if (!v || checked == 5) continue;
        char why[512] = "";
        bool skip = false;
        ck_assert_msg(fz_check(&p, why, sizeof why, &skip), "modes differ: %s", why);
        checked++;
    }
    int64_t fallbacks = ctpu_metric_counter("recompile_limit_fallbacks");
    ctpu_shutdown();
    unsetenv("TORCH_TPU_RECOMPILE_LIMIT");
    fprintf(stderr, "fuzz: 100 of those programs hold %d varlen loops; %d of them checked here ran %lld traces op by "
            "op past TORCH_TPU_RECOMPILE_LIMIT=%s\n", varlen, checked, (long long)fallbacks, FZ_RECOMPILE_LIMIT);
    ck_assert_int_gt(varlen, 0);
    ck_assert_int_gt(fallbacks, 0);
}

/* Dynamic dims (issue 15): the FZ_DYNAMIC loop at every softmax kind and
 * reduction, f32 and bf16, parity with strict eager at every extent; one
 * dynamic program bound at the extents after the first. */
START_TEST(dynamic_dims_parity)
{
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    for (int dt = 0; dt < 2; dt++)
        for (int sm = 0; sm < 3; sm++)
            for (int red = 0; red < 5; red++) {
                if (dt == 1 && red != sm) continue;            /* bf16: a few */
                fz_prog p = { .seed = 11, .n = 1, .ins = {
                    { .kind = FZ_DYNAMIC, .sub = (uint8_t)((sm * 5 + red) % 11), .a = -1, .b = -1, .c = -1,
                      .dt = (uint8_t)(dt ? CTPU_BF16 : CTPU_F32), .p = { 3 * red + sm, 5, 4, sm, 3, red },
                      .s0 = 0.75, .data = (uint32_t)(100 + red) } } };
                char why[512] = "";
                bool skipped = false;
                int64_t b0 = ctpu_metric_counter("dynamic_binds");
                ck_assert_msg(fz_check(&p, why, sizeof why, &skipped), "softmax %d reduce %d dt %d: %s", sm, red, dt, why);
                ck_assert(!skipped);
                ck_assert_int_gt(ctpu_metric_counter("dynamic_binds"), b0);
            }
    ctpu_shutdown();
}
END_TEST

/* Every op the fuzzer knows with a dynamic dim (issue 15): the FZ_DYNAMIC
 * loop with each tail op (fz.c dyn_tail: binary, scalar, where, clamp,
 * cast, argmax, softmax over the rows, reshape, permute, transpose,
 * slice, concat, expand, embedding, gather, creations, detach, assign,
 * reductions over the columns, matmul_t over the rows) and each of its
 * choices, f32 (and bf16 for some), parity with strict eager at every
 * extent; the launches bind the dynamic program. */
START_TEST(dynamic_dims_every_op)
{
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    static const int choices[] = { 0, 26, 16, 1, 1, 3, 4, 2, 3, 3, 2, 4, 2, 1, 1, 1, 6, 1, 1, 10, 1 };
    _Static_assert(sizeof choices / sizeof choices[0] == 21, "one entry per tail kind");
    int runs = 0;
    for (int tail = 1; tail < 21; tail++)
        for (int q = 0; q < choices[tail]; q++) {
            int dt = (tail + q) % 7 == 0 ? CTPU_BF16 : CTPU_F32;
            fz_prog p = { .seed = 13, .n = 1, .ins = {
                { .kind = FZ_DYNAMIC, .sub = (uint8_t)((tail + q) % 11), .a = -1, .b = -1, .c = -1, .dt = (uint8_t)dt,
                  .p = { 5 * tail + q, 3 + q % 4, 4, q % 3, 3 + tail % 3, (tail + q) % 5, tail, q },
                  .s0 = 0.75, .s1 = q % 2 ? -0.5 : 0.25, .data = (uint32_t)(300 + 7 * tail + q) } } };
            char why[512] = "";
            bool skipped = false;
            int64_t b0 = ctpu_metric_counter("dynamic_binds");
            ck_assert_msg(fz_check(&p, why, sizeof why, &skipped), "tail %d choice %d dt %d: %s", tail, q, dt, why);
            ck_assert(!skipped);
            ck_assert_int_gt(ctpu_metric_counter("dynamic_binds"), b0);
            runs++;
        }
    ck_assert_int_gt(runs, 80);
    ctpu_shutdown();
}
END_TEST

START_TEST(short_fuzz_no_grad)
{
    campaign(false, env_u64("CTPU_TEST_FUZZ_SEED", 1), (int)env_u64("CTPU_TEST_FUZZ_COUNT", 400));
}
END_TEST

START_TEST(short_fuzz_autograd)
{
    campaign(true, env_u64("CTPU_TEST_FUZZ_SEED", 1) + 100000, (int)env_u64("CTPU_TEST_FUZZ_COUNT", 400));
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fuzz");
    TCase *t = tcase_create("short");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, short_fuzz_no_grad);
    tcase_add_test(t, short_fuzz_autograd);
    suite_add_tcase(s, t);
    TCase *h = tcase_create("harness");
    tcase_set_timeout(h, 120);
    tcase_add_test(h, harness_selftest);
    tcase_add_test(h, minimiser_shrinks);
    tcase_add_test(h, dynamic_dims_parity);
    tcase_add_test(h, dynamic_dims_every_op);
    suite_add_tcase(s, h);
    TCase *r = tcase_create("regressions");
    tcase_set_timeout(r, 120);
    FZ_REGRESSIONS(r);
    suite_add_tcase(s, r);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
