/* Modes, errors and the environment (DESIGN.md's mode and variable tables,
 * CONTRACTS.md "Modes and parity", "Memory", "Randomness"):
 * - strict eager returns before the op has run (device hold test hook);
 * - an out-of-range embedding index: at the next sync in strict eager, at
 *   the call in debug eager, naming `embedding` and the index; poison reaches
 *   dependents, not unrelated tensors;
 * - OOM message (requested, in use, capacity), usable again after frees;
 * - every variable ctpu_init reads: good values applied, bad ones are
 *   CTPU_ERR_ENV naming the variable; LAUNCH_BLOCKING wins;
 * - debug checks name the first op that made a NaN; Inf is not an error;
 * - strict and debug give identical bits on a mixed program;
 * - the strict program table hits on the second identical op;
 * - results identical for every CTPU_ISA and CTPU_NUM_THREADS;
 * - random draws identical for any split of the offset range. */
#include <unistd.h>

#include "t_core.h"

/* ------------------------------------------------------------ strict async */
START_TEST(strict_returns_before_execution)
{
    ctpu_tensor x = T_VEC(1, 2, 3, 4);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_STRICT);
    ctpu__test_device_hold(true);
    int64_t before = ctpu_metric_counter("commands_executed");
    int64_t disp = ctpu_metric_counter("ops_dispatched");
    ctpu_tensor y = ctpu_add(x, x);
    ctpu_tensor z = ctpu_exp(y);
    ck_assert(!ctpu_is_null(y) && !ctpu_is_null(z));
    ck_assert_int_eq(ctpu_metric_counter("ops_dispatched"), disp + 2);
    usleep(20000);
    ck_assert_int_eq(ctpu_metric_counter("commands_executed"), before);
    ctpu__test_device_hold(false);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ck_assert_int_eq(ctpu_metric_counter("commands_executed"), before + 2);
    float *v = t_read(z, NULL);
    ck_assert(t_same(v[3], expf(8.0f)) || t_ulps(v[3], expf(8.0f)) <= 1);
    free(v);
}
END_TEST

/* Debug eager waits for every op: nothing is left in flight at return. */
START_TEST(debug_waits_each_op)
{
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEBUG), CTPU_OK);
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_DEBUG);
    ck_assert(ctpu_debug_checks());
    ctpu_tensor x = T_VEC(1, 2, 3, 4);
    int64_t before = ctpu_metric_counter("commands_executed");
    ctpu_tensor y = ctpu_mul(x, x);
    ck_assert(!ctpu_is_null(y));
    ck_assert_int_eq(ctpu_metric_counter("commands_executed"), before + 1);
    /* the per-thread override wins over the process mode */
    ck_assert_int_eq(ctpu_set_thread_mode(CTPU_MODE_STRICT), CTPU_OK);
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_STRICT);
    ctpu_clear_thread_mode();
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_DEBUG);
    ck_assert_int_eq(ctpu_set_mode((ctpu_mode)7), CTPU_ERR_INVALID_ARG);
    ck_assert(t_contains(ctpu_last_error(), "set_mode"));
    ck_assert_str_eq(ctpu_mode_name(CTPU_MODE_STRICT), "strict");
    ck_assert_str_eq(ctpu_mode_name(CTPU_MODE_DEBUG), "debug");
    ck_assert_str_eq(ctpu_mode_name(CTPU_MODE_DEFER_FUSE), "defer_fuse");
}
END_TEST

/* ------------------------------------------------------------ faults */
static ctpu_tensor bad_embedding(int32_t bad_index)
{
    float w[6] = { 1, 2, 3, 4, 5, 6 };
    int64_t ws[2] = { 3, 2 }, is = 3;
    int32_t idx[3] = { 0, bad_index, 2 };
    return ctpu_embedding(t_f32(w, 2, ws), t_i32(idx, 1, &is));
}

START_TEST(embedding_fault_strict_at_sync)
{
    ctpu_tensor e = bad_embedding(7);
    ck_assert_msg(!ctpu_is_null(e), "strict eager must not report a device fault at the call");
    ck_assert_int_eq(ctpu_last_status(), CTPU_OK);
    ck_assert_int_eq(ctpu_sync(), CTPU_ERR_DEVICE_FAULT);
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_DEVICE_FAULT);
    ck_assert_msg(t_contains(ctpu_last_error(), "embedding"), "%s", ctpu_last_error());
    ck_assert_msg(t_contains(ctpu_last_error(), "7"), "%s", ctpu_last_error());
    /* reported once */
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    /* a negative index too */
    ctpu_tensor e2 = bad_embedding(-4);
    ck_assert(!ctpu_is_null(e2));
    ck_assert_int_eq(ctpu_sync(), CTPU_ERR_DEVICE_FAULT);
    ck_assert_msg(t_contains(ctpu_last_error(), "-4"), "%s", ctpu_last_error());
    /* the runtime stays usable */
    ctpu_tensor ok = ctpu_add_scalar(T_VEC(1), 1);
    double v;
    ck_assert_int_eq(ctpu_item(ok, &v), CTPU_OK);
    ck_assert(v == 2);
}
END_TEST

START_TEST(embedding_fault_debug_at_call)
{
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEBUG), CTPU_OK);
    ctpu_tensor e = bad_embedding(7);
    ck_assert(ctpu_is_null(e));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_DEVICE_FAULT);
    ck_assert_msg(t_contains(ctpu_last_error(), "embedding"), "%s", ctpu_last_error());
    ck_assert_msg(t_contains(ctpu_last_error(), "index 7"), "%s", ctpu_last_error());
    /* already reported: the next sync is clean */
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    /* and the same call with good indices works */
    ctpu_tensor g = bad_embedding(1);
    ck_assert(!ctpu_is_null(g));
    float *v = t_read(g, NULL);
    ck_assert(v[2] == 3 && v[3] == 4);
    free(v);
}
END_TEST

START_TEST(gather_fault_names_gather)
{
    float a[4] = { 1, 2, 3, 4 };
    int64_t s = 4;
    int32_t idx[2] = { 1, 9 };
    int64_t is = 2;
    ctpu_tensor g = ctpu_gather(t_f32(a, 1, &s), 0, t_i32(idx, 1, &is));
    ck_assert(!ctpu_is_null(g));
    ck_assert_int_eq(ctpu_sync(), CTPU_ERR_DEVICE_FAULT);
    ck_assert_msg(t_contains(ctpu_last_error(), "gather") && t_contains(ctpu_last_error(), "9"), "%s",
                  ctpu_last_error());
}
END_TEST

/* scatter_add's out-of-range index: a fault naming scatter_add and the index,
 * at the next sync (strict), at the call (debug), at the flush (defer and fuse) */
START_TEST(scatter_add_fault_in_every_mode)
{
    static const ctpu_mode modes[] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    for (int m = 0; m < 3; m++) {
        ck_assert_int_eq(ctpu_set_mode(modes[m]), CTPU_OK);
        int32_t idx[3] = { 0, -3, 1 };
        int64_t is = 3;
        ctpu_tensor y = ctpu_scatter_add(T_VEC(1, 2), 0, t_i32(idx, 1, &is), T_VEC(1, 1, 1));
        ctpu_status st = ctpu_is_null(y) ? ctpu_last_status() : ctpu_sync();
        ck_assert_msg(modes[m] == CTPU_MODE_DEBUG ? ctpu_is_null(y) : !ctpu_is_null(y), "mode %d", m);
        ck_assert_int_eq(st, CTPU_ERR_DEVICE_FAULT);
        ck_assert_msg(t_contains(ctpu_last_error(), "scatter_add") && t_contains(ctpu_last_error(), "-3"), "%s",
                      ctpu_last_error());
        ctpu_clear_error();
        ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
}
END_TEST

START_TEST(poison_dependents_only)
{
    ctpu_tensor e = bad_embedding(5);
    ctpu_tensor d1 = ctpu_mul_scalar(e, 2);                      /* depends on e */
    ctpu_tensor d2 = ctpu_sum(ctpu_exp(d1), 0, NULL, false);      /* transitively */
    ctpu_tensor u = ctpu_add_scalar(T_VEC(1, 2), 10);            /* unrelated */
    ck_assert(!ctpu_is_null(d2) && !ctpu_is_null(u));
    float buf[6];
    ck_assert_int_eq(ctpu_to_host(d2, buf, sizeof buf), CTPU_ERR_DEVICE_FAULT);
    ck_assert_msg(t_contains(ctpu_last_error(), "embedding") && t_contains(ctpu_last_error(), "5"), "%s",
                  ctpu_last_error());
    double v;
    ck_assert_int_eq(ctpu_item(d2, &v), CTPU_ERR_DEVICE_FAULT);
    ck_assert(t_contains(ctpu_last_error(), "embedding"));
    ck_assert_int_eq(ctpu_to_host(d1, buf, sizeof buf), CTPU_ERR_DEVICE_FAULT);
    ck_assert_int_eq(ctpu_to_host(u, buf, sizeof buf), CTPU_OK);
    ck_assert(buf[0] == 11 && buf[1] == 12);
    /* debug eager: a dependent of an earlier strict fault reports at the call */
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEBUG), CTPU_OK);
    ctpu_tensor d3 = ctpu_neg(e);
    ck_assert(ctpu_is_null(d3));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_DEVICE_FAULT);
    ck_assert(t_contains(ctpu_last_error(), "embedding"));
}
END_TEST

/* ------------------------------------------------------------ debug checks */
START_TEST(debug_checks_name_first_nan_op)
{
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEBUG), CTPU_OK);
    ctpu_tensor x = T_VEC(1, -2, 4);
    ctpu_tensor l = ctpu_log(x);
    ck_assert(ctpu_is_null(l));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_NAN);
    ck_assert_msg(t_contains(ctpu_last_error(), "log"), "%s", ctpu_last_error());
    /* Inf is not an error: log(0) = -inf */
    ctpu_tensor z = ctpu_log(T_VEC(0, 1));
    ck_assert_msg(!ctpu_is_null(z), "%s", ctpu_last_error());
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);

    /* strict eager with checks on: the fault latches on the first NaN op
     * (sqrt), the dependent add is poisoned and reports sqrt, not add */
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    ck_assert(!ctpu_debug_checks());
    ck_assert_int_eq(ctpu_set_debug_checks(true), CTPU_OK);
    ck_assert(ctpu_debug_checks());
    ctpu_tensor s = ctpu_sqrt(T_VEC(4, -1));
    ctpu_tensor a = ctpu_add_scalar(s, 1);
    ck_assert(!ctpu_is_null(s) && !ctpu_is_null(a));
    ck_assert_int_eq(ctpu_sync(), CTPU_ERR_NAN);
    ck_assert_msg(t_contains(ctpu_last_error(), "sqrt"), "%s", ctpu_last_error());
    ck_assert_msg(!t_contains(ctpu_last_error(), "add"), "%s", ctpu_last_error());
    float buf[2];
    ck_assert_int_eq(ctpu_to_host(a, buf, sizeof buf), CTPU_ERR_NAN);
    ck_assert(t_contains(ctpu_last_error(), "sqrt"));
    /* checks off: NaN is a value */
    ck_assert_int_eq(ctpu_set_debug_checks(false), CTPU_OK);
    ctpu_tensor n = ctpu_sqrt(T_VEC(-1));
    ck_assert_int_eq(ctpu_to_host(n, buf, 4), CTPU_OK);
    ck_assert(buf[0] != buf[0]);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
}
END_TEST

START_TEST(debug_checks_env_off_in_debug)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("TORCH_TPU_LAUNCH_BLOCKING", "1", 1);
    setenv("TORCH_TPU_ENABLE_DEBUG_CHECKS", "0", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_DEBUG);
    ck_assert(!ctpu_debug_checks());
    ctpu_tensor l = ctpu_log(T_VEC(-1));
    ck_assert(!ctpu_is_null(l));
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ctpu_shutdown();
    setenv("TORCH_TPU_LAUNCH_BLOCKING", "0", 1);
    setenv("TORCH_TPU_ENABLE_DEBUG_CHECKS", "true", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_STRICT);
    ck_assert(ctpu_debug_checks());
    ck_assert(!ctpu_is_null(ctpu_log(T_VEC(-1))));
    ck_assert_int_eq(ctpu_sync(), CTPU_ERR_NAN);
    ck_assert(t_contains(ctpu_last_error(), "log"));
}
END_TEST

/* ------------------------------------------------------------ OOM */
START_TEST(oom_message_and_recovery)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("TORCH_TPU_HBM_LIMIT", "1M", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ctpu_hbm_stats hs;
    ck_assert_int_eq(ctpu_hbm_get_stats(&hs), CTPU_OK);
    ck_assert_uint_eq(hs.capacity, 1048576);
    int64_t big = 200000;                         /* 800,000 bytes */
    ctpu_tensor a = ctpu_zeros(CTPU_F32, 1, &big);
    ck_assert_msg(!ctpu_is_null(a), "%s", ctpu_last_error());
    ck_assert_int_eq(ctpu_hbm_get_stats(&hs), CTPU_OK);
    uint64_t in_use = hs.in_use;
    int64_t more = 100000;                        /* 400,000 more bytes */
    ctpu_tensor b = ctpu_ones(CTPU_F32, 1, &more);
    ck_assert(ctpu_is_null(b));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_OOM);
    const char *m = ctpu_last_error();
    char want[64];
    ck_assert_msg(t_contains(m, "400000"), "requested bytes missing: %s", m);
    snprintf(want, sizeof want, "%llu", (unsigned long long)in_use);
    ck_assert_msg(t_contains(m, want), "in-use bytes (%s) missing: %s", want, m);
    ck_assert_msg(t_contains(m, "1048576"), "capacity missing: %s", m);
    ck_assert_msg(t_contains(m, "in use") && t_contains(m, "capacity"), "%s", m);
    ck_assert_int_gt(ctpu_metric_counter("hbm_oom"), 0);
    /* from_host reports it too */
    float *host = calloc((size_t)more, 4);
    ck_assert(ctpu_is_null(ctpu_from_host(host, CTPU_F32, 1, &more)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_OOM);
    ck_assert(t_contains(ctpu_last_error(), "from_host"));
    /* the tensor already there is fine; after freeing, the request fits */
    float *v = t_read(ctpu_sum(a, 0, NULL, false), NULL);
    ck_assert(v[0] == 0);
    free(v);
    ck_assert_int_eq(ctpu_release(a), CTPU_OK);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    b = ctpu_ones(CTPU_F32, 1, &more);
    ck_assert_msg(!ctpu_is_null(b), "%s", ctpu_last_error());
    ctpu_tensor c = ctpu_from_host(host, CTPU_F32, 1, &more);
    ck_assert_msg(!ctpu_is_null(c), "%s", ctpu_last_error());
    double s;
    ck_assert_msg(ctpu_item(ctpu_sum(b, 0, NULL, false), &s) == CTPU_OK, "%s", ctpu_last_error());
    ck_assert(s == 100000);
    ck_assert_int_eq(ctpu_item(ctpu_sum(c, 0, NULL, false), &s), CTPU_OK);
    ck_assert(s == 0);
    free(host);
}
END_TEST

/* A request that cannot fit even once every queued command has given its
 * buffers back fails at once (it used to wait for the whole queue: 10.6 s
 * for one 64M-element add under a 600 MiB cap), naming requested, in-use,
 * held-by-queue and capacity bytes. The device is held, so a wait would
 * never end. */
START_TEST(oom_fails_at_once_naming_the_queue)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("TORCH_TPU_HBM_LIMIT", "1M", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ctpu__test_device_hold(true);
    int64_t big = 200000, mid = 25000, more = 100000;   /* 800,000, 100,000 and 400,000 bytes */
    ctpu_tensor a = ctpu_zeros(CTPU_F32, 1, &big);
    ctpu_tensor b = ctpu_ones(CTPU_F32, 1, &mid);
    ck_assert_msg(!ctpu_is_null(a) && !ctpu_is_null(b), "%s", ctpu_last_error());
    ck_assert_int_eq(ctpu_release(b), CTPU_OK);         /* held only by its queued command */
    ctpu_tensor c = ctpu_ones(CTPU_F32, 1, &more);
    ck_assert(ctpu_is_null(c));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_OOM);
    const char *m = ctpu_last_error();
    ck_assert_msg(t_contains(m, "ones: output f32[100000]: out of HBM: requested 400000 bytes, 900032 in use "
                                "(100032 of them held only by queued commands), capacity 1048576 bytes"),
                  "%s", m);
    ctpu__test_device_hold(false);
    /* what fits once the queue gives its buffers back waits for it */
    ctpu_tensor d = ctpu_ones(CTPU_F32, 1, &mid);
    ck_assert_msg(!ctpu_is_null(d), "%s", ctpu_last_error());
    ck_assert_int_eq(ctpu_release(d), CTPU_OK);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
}
END_TEST

/* In defer and fuse the message names the op whose value did not fit. */
START_TEST(oom_defer_names_the_op)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("TORCH_TPU_HBM_LIMIT", "1M", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    int64_t big = 200000;
    ctpu_tensor a = ctpu_zeros(CTPU_F32, 1, &big);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    ctpu_tensor t = ctpu_add_scalar(a, 1.0);                 /* op #2 (the zeros were #1) */
    ck_assert_int_eq(ctpu_label_push("act"), CTPU_OK);
    ctpu_tensor x = ctpu_exp(t);                             /* op #3, "act" */
    ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
    ck_assert(!ctpu_is_null(x));
    ck_assert_int_eq(ctpu_release(t), CTPU_OK);
    ck_assert_int_eq(ctpu_set_name(x, "x"), CTPU_OK);
    ck_assert_int_eq(ctpu_mark_step(), CTPU_ERR_OOM);
    const char *m = ctpu_last_error();
    ck_assert_msg(t_contains(m, "fused program 1: the value of exp (op #3, \"act\"; x), f32[200000]: out of HBM: "
                                "requested 800000 bytes"), "%s", m);
    ck_assert_msg(t_contains(m, "capacity 1048576 bytes"), "%s", m);
    ctpu_release(x);
    ctpu_clear_error();
    /* a value that lives only inside the program (its scratch): the ops it spans */
    float wd[500] = { 0 };
    ctpu_tensor w = ctpu_from_host(wd, CTPU_F32, 2, (int64_t[]){ 500, 1 });
    ctpu_tensor e = ctpu_exp(a);                                        /* op #1 of this step */
    ctpu_tensor e2 = ctpu_reshape(e, 2, (int64_t[]){ 400, 500 });      /* #2 */
    ctpu_tensor mm = ctpu_matmul(e2, w);                                /* #3 */
    ck_assert(!ctpu_is_null(mm));
    ck_assert_int_eq(ctpu_release(e), CTPU_OK);
    ck_assert_int_eq(ctpu_release(e2), CTPU_OK);
    ck_assert_int_eq(ctpu_mark_step(), CTPU_ERR_OOM);
    m = ctpu_last_error();
    ck_assert_msg(t_contains(m, ": its scratch (the values that live only inside it, ops #1 to #3): out of HBM: "),
                  "%s", m);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
}
END_TEST

/* ------------------------------------------------------------ environment */
typedef struct {
    const char *var, *value;
} env_case;

/* Init with one variable set; returns the status (runtime left up on OK). */
static ctpu_status init_with(const char *var, const char *value)
{
    ctpu_shutdown();
    t_clear_env();
    if (var) setenv(var, value, 1);
    ctpu_clear_error();
    return ctpu_init();
}

START_TEST(env_bad_values)
{
    static const env_case bad[] = {
        { "TORCH_TPU_LAUNCH_BLOCKING", "yes" },     { "TORCH_TPU_LAUNCH_BLOCKING", "2" },
        { "TORCH_TPU_LAUNCH_BLOCKING", "" },        { "TORCH_TPU_DEFER_AND_FUSE", "on" },
        { "TORCH_TPU_DEFER_AND_FUSE", "-1" },       { "TORCH_TPU_ENABLE_DEBUG_CHECKS", "truee" },
        { "TORCH_TPU_ENABLE_DEBUG_CHECKS", " 1" },  { "TORCH_TPU_DETECT_LOOPS", "maybe" },
        { "TORCH_TPU_DETECT_LOOPS", "" },           { "TORCH_TPU_CHIP", "v4" },
        { "TORCH_TPU_CHIP", "" },                   { "TORCH_TPU_HBM_LIMIT", "abc" },
        { "TORCH_TPU_HBM_LIMIT", "0" },             { "TORCH_TPU_HBM_LIMIT", "-5" },
        { "TORCH_TPU_HBM_LIMIT", "10X" },           { "TORCH_TPU_HBM_LIMIT", "99999999999999999999999" },
        { "TORCH_TPU_HBM_LIMIT", "99999999999G" },  { "TORCH_TPU_HBM_LIMIT", "" },
        { "TORCH_TPU_MATMUL_PRECISION", "medium" }, { "TORCH_TPU_MATMUL_PRECISION", "" },
        { "TORCH_TPU_CACHE_SIZE", "0" },            { "TORCH_TPU_CACHE_SIZE", "many" },
        { "TORCH_TPU_CACHE_SIZE", "-3" },           { "TORCH_TPU_CACHE_SIZE", "12k" },
        { "TORCH_TPU_CACHE_ONLY", "abc" },          { "TORCH_TPU_CACHE_ONLY", "-1" },
        { "CTPU_ISA", "sse2" },                     { "CTPU_ISA", "" },
        { "CTPU_NUM_THREADS", "0" },                { "CTPU_NUM_THREADS", "65" },
        { "CTPU_NUM_THREADS", "two" },              { "CTPU_NUM_THREADS", "-1" },
        { "CTPU_NUM_THREADS", "" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ctpu_status st = init_with(bad[i].var, bad[i].value);
        ck_assert_msg(st == CTPU_ERR_ENV, "%s=\"%s\": init gave %s", bad[i].var, bad[i].value,
                      ctpu_status_str(st));
        ck_assert(!ctpu_is_initialized());
        ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_ENV);
        ck_assert_msg(t_contains(ctpu_last_error(), bad[i].var), "%s=\"%s\": %s", bad[i].var,
                      bad[i].value, ctpu_last_error());
        if (bad[i].value[0])
            ck_assert_msg(t_contains(ctpu_last_error(), bad[i].value), "value missing: %s", ctpu_last_error());
    }
    /* a failed init leaves nothing behind: a clean one works */
    ck_assert_int_eq(init_with(NULL, NULL), CTPU_OK);
    ck_assert(!ctpu_is_null(ctpu_exp(T_VEC(1))));
}
END_TEST

START_TEST(env_good_values)
{
    /* booleans, any case */
    static const char *const yes[] = { "1", "true", "TRUE", "True" };
    static const char *const no[] = { "0", "false", "FALSE" };
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(init_with("TORCH_TPU_LAUNCH_BLOCKING", yes[i]), CTPU_OK);
        ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_DEBUG);
        ck_assert(ctpu_debug_checks());
        ck_assert_int_eq(init_with("TORCH_TPU_ENABLE_DEBUG_CHECKS", yes[i]), CTPU_OK);
        ck_assert(ctpu_debug_checks());
        ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_STRICT);
    }
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(init_with("TORCH_TPU_LAUNCH_BLOCKING", no[i]), CTPU_OK);
        ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_STRICT);
        ck_assert_int_eq(init_with("TORCH_TPU_DEFER_AND_FUSE", no[i]), CTPU_OK);
        ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_STRICT);
        ck_assert_int_eq(init_with("TORCH_TPU_ENABLE_DEBUG_CHECKS", no[i]), CTPU_OK);
        ck_assert(!ctpu_debug_checks());
    }
    ck_assert_int_eq(init_with("TORCH_TPU_DEFER_AND_FUSE", "1"), CTPU_OK);
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_DEFER_FUSE);

    /* defaults */
    ck_assert_int_eq(init_with(NULL, NULL), CTPU_OK);
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_STRICT);
    ck_assert(!ctpu_debug_checks());
    ck_assert_str_eq(ctpu_chip()->name, "v5e");
    ck_assert_int_eq(ctpu_get_matmul_precision(), CTPU_PRECISION_DEFAULT);
    ck_assert_int_eq(ctpu_rt->detect_loops, CTPU_LOOPS_AUTO);
    ck_assert_uint_eq(ctpu_rt->cache_size, 1024);
    ck_assert_int_eq(ctpu_rt->cache_only_after, -1);
    if (!t_forced_isa()) ck_assert_int_eq(ctpu_kernels_isa(), ctpu_isa_detect());   /* else the forced one */
    ctpu_hbm_stats hs;
    ctpu_hbm_get_stats(&hs);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t half = (uint64_t)pages * (uint64_t)psz / 2;
    uint64_t want = ctpu_chip()->hbm_bytes < half ? ctpu_chip()->hbm_bytes : half;
    ck_assert_uint_eq(hs.capacity, want);

    static const char *const loops[][2] = { { "auto", "0" }, { "on", "1" }, { "off", "2" }, { "ON", "1" } };
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(init_with("TORCH_TPU_DETECT_LOOPS", loops[i][0]), CTPU_OK);
        ck_assert_int_eq((int)ctpu_rt->detect_loops, atoi(loops[i][1]));
    }
    static const char *const chips[] = { "v5e", "v5p", "v6e", "7x" };
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(init_with("TORCH_TPU_CHIP", chips[i]), CTPU_OK);
        ck_assert_str_eq(ctpu_chip()->name, chips[i]);
        ck_assert_ptr_eq(ctpu_chip(), ctpu_chip_lookup(chips[i]));
    }
    static const struct { const char *v; uint64_t b; } lim[] = {
        { "4096", 4096 }, { "64K", 65536 }, { "3M", 3u << 20 }, { "2G", 2ull << 30 }, { "5m", 5u << 20 },
    };
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(init_with("TORCH_TPU_HBM_LIMIT", lim[i].v), CTPU_OK);
        ctpu_hbm_get_stats(&hs);
        ck_assert_uint_eq(hs.capacity, lim[i].b);
    }
    static const char *const prec[] = { "default", "high", "highest", "HIGH" };
    static const ctpu_precision pv[] = { CTPU_PRECISION_DEFAULT, CTPU_PRECISION_HIGH,
                                         CTPU_PRECISION_HIGHEST, CTPU_PRECISION_HIGH };
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(init_with("TORCH_TPU_MATMUL_PRECISION", prec[i]), CTPU_OK);
        ck_assert_int_eq(ctpu_get_matmul_precision(), pv[i]);
    }
    ck_assert_int_eq(init_with("TORCH_TPU_CACHE_SIZE", "7"), CTPU_OK);
    ck_assert_uint_eq(ctpu_rt->cache_size, 7);
    ck_assert_int_eq(init_with("TORCH_TPU_CACHE_ONLY", "3"), CTPU_OK);
    ck_assert_int_eq(ctpu_rt->cache_only_after, 3);
    ck_assert_int_eq(init_with("TORCH_TPU_CACHE_ONLY", "0"), CTPU_OK);
    ck_assert_int_eq(ctpu_rt->cache_only_after, 0);
    for (int isa = 0; isa <= (int)ctpu_isa_detect(); isa++) {
        ck_assert_int_eq(init_with("CTPU_ISA", ctpu_isa_name((ctpu_isa)isa)), CTPU_OK);
        ck_assert_int_eq(ctpu_kernels_isa(), isa);
    }
    for (int n = 1; n <= 4; n++) {
        char v[8];
        snprintf(v, sizeof v, "%d", n);
        ck_assert_int_eq(init_with("CTPU_NUM_THREADS", v), CTPU_OK);
        ck_assert_int_eq(ctpu_rt->nthreads, n);
        ck_assert_int_eq(ctpu_device_pool(ctpu_rt->dev)->nthreads, n);
    }
}
END_TEST

START_TEST(env_launch_blocking_wins)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("TORCH_TPU_DEFER_AND_FUSE", "1", 1);
    setenv("TORCH_TPU_LAUNCH_BLOCKING", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_DEBUG);
    ctpu_shutdown();
    /* the order of checks: a bad LAUNCH_BLOCKING is reported even with a good DEFER_AND_FUSE */
    setenv("TORCH_TPU_LAUNCH_BLOCKING", "x", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_ERR_ENV);
    ck_assert(t_contains(ctpu_last_error(), "TORCH_TPU_LAUNCH_BLOCKING"));
    setenv("TORCH_TPU_LAUNCH_BLOCKING", "0", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_DEFER_FUSE);
}
END_TEST

/* ------------------------------------------------------------ parity */
#define N_OUT 12
/* A mixed program; writes its outputs' bytes into out[] (malloc'd). */
static void mixed_program(void *out[N_OUT], size_t len[N_OUT])
{
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    ctpu_manual_seed(1234);
    int64_t s1[2] = { 37, 65 }, s2[2] = { 65, 19 };
    ctpu_tensor a = ctpu_rand_normal(CTPU_F32, 2, s1, 0, 1);
    ctpu_tensor b = ctpu_rand_uniform(CTPU_F32, 2, s2, -2, 2);
    ctpu_tensor bb = ctpu_cast(b, CTPU_BF16);
    ctpu_tensor m = ctpu_matmul(a, b);
    ctpu_tensor mb = ctpu_matmul(ctpu_cast(a, CTPU_BF16), bb);
    ctpu_tensor g = ctpu_gelu(ctpu_add(m, ctpu_sum(m, 1, (int[]){ 0 }, true)), true);
    ctpu_tensor sm = ctpu_log_softmax(g, -1);
    ctpu_tensor v = ctpu_var(a, 1, (int[]){ 1 }, 1, false);
    ctpu_tensor am = ctpu_argmax(m, 1, false);
    int32_t idx[5] = { 3, 0, 18, 17, 3 };
    int64_t is = 5;
    ctpu_tensor e = ctpu_embedding(ctpu_transpose(b, 0, 1), t_i32(idx, 1, &is));
    ctpu_tensor t = ctpu_tanh(ctpu_div(e, ctpu_add_scalar(ctpu_abs(e), 1)));
    ctpu_tensor w = ctpu_where(ctpu_gt_scalar(a, 0), ctpu_exp(a), ctpu_sigmoid(a));
    ctpu_tensor sl = ctpu_slice(ctpu_concat(2, (ctpu_tensor[]){ a, w }, 1), 1, 3, 120, 7);
    ctpu_tensor mx = ctpu_max(ctpu_mul(mb, mb), 0, NULL, false);
    ctpu_tensor r = ctpu_rsqrt(ctpu_add_scalar(ctpu_pow_scalar(a, 2), 1e-3));
    ctpu_tensor pr = ctpu_permute(ctpu_reshape(r, 3, (int64_t[]){ 37, 5, 13 }), (int[]){ 2, 0, 1 });
    ctpu_tensor outs[N_OUT] = { m, mb, g, sm, v, am, e, t, sl, mx, pr, ctpu_mean(w, 0, NULL, false) };
    for (int i = 0; i < N_OUT; i++) {
        ck_assert_msg(!ctpu_is_null(outs[i]), "output %d: %s", i, ctpu_last_error());
        int64_t n;
        out[i] = t_read_raw(outs[i], &n);
        len[i] = (size_t)n * (ctpu_dtype_of(outs[i]) == CTPU_BF16 ? 2 : 4);
    }
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
}

START_TEST(strict_debug_identical_bits)
{
    void *s[N_OUT], *d[N_OUT];
    size_t ls[N_OUT], ld[N_OUT];
    mixed_program(s, ls);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEBUG), CTPU_OK);
    mixed_program(d, ld);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    for (int i = 0; i < N_OUT; i++) {
        ck_assert_uint_eq(ls[i], ld[i]);
        ck_assert_msg(memcmp(s[i], d[i], ls[i]) == 0, "output %d differs between strict and debug", i);
        free(s[i]);
        free(d[i]);
    }
}
END_TEST

/* ------------------------------------------------------------ strict cache */
START_TEST(strict_cache_hits)
{
    ctpu_tensor a = T_VEC(1, 2, 3), b = T_VEC(4, 5, 6);
    ctpu_tensor x = ctpu_mul(a, b);
    ck_assert(!ctpu_is_null(x));
    int64_t h = ctpu_metric_counter("strict_cache_hits"), m = ctpu_metric_counter("strict_cache_misses");
    int64_t pc = ctpu_metric_counter("programs_compiled");
    size_t entries = ctpu_cache_entries(ctpu__test_strict_cache());
    ctpu_tensor y = ctpu_mul(b, a);                      /* same op, types, shapes */
    ck_assert(!ctpu_is_null(y));
    ck_assert_int_eq(ctpu_metric_counter("strict_cache_hits"), h + 1);
    ck_assert_int_eq(ctpu_metric_counter("strict_cache_misses"), m);
    ck_assert_int_eq(ctpu_metric_counter("programs_compiled"), pc);
    ck_assert_uint_eq(ctpu_cache_entries(ctpu__test_strict_cache()), entries);
    /* a scalar is a runtime argument: a new value is a hit */
    ctpu_tensor s1 = ctpu_add_scalar(a, 1.5);
    int64_t h2 = ctpu_metric_counter("strict_cache_hits");
    ctpu_tensor s2 = ctpu_add_scalar(a, -7.25);
    ck_assert_int_eq(ctpu_metric_counter("strict_cache_hits"), h2 + 1);
    float *v1 = t_read(s1, NULL), *v2 = t_read(s2, NULL);
    ck_assert(v1[0] == 2.5f && v2[0] == -6.25f);
    free(v1);
    free(v2);
    /* a new shape is a miss */
    int64_t m2 = ctpu_metric_counter("strict_cache_misses");
    ck_assert(!ctpu_is_null(ctpu_mul(T_VEC(1, 2), T_VEC(3, 4))));
    ck_assert_int_eq(ctpu_metric_counter("strict_cache_misses"), m2 + 1);
    ck_assert_int_eq(ctpu_metric_counter("programs_compiled"), pc + 2);
    /* a new dtype is a miss; a new matmul precision is a miss */
    ck_assert(!ctpu_is_null(ctpu_mul(ctpu_cast(a, CTPU_BF16), ctpu_cast(b, CTPU_BF16))));
    int64_t mm = ctpu_metric_counter("strict_cache_misses");
    ctpu_tensor A = ctpu_reshape(a, 2, (int64_t[]){ 1, 3 }), B = ctpu_reshape(b, 2, (int64_t[]){ 3, 1 });
    ck_assert(!ctpu_is_null(ctpu_matmul(A, B)));
    ck_assert(!ctpu_is_null(ctpu_matmul(A, B)));
    ck_assert_int_eq(ctpu_metric_counter("strict_cache_misses"), mm + 1);
    ck_assert_int_eq(ctpu_set_matmul_precision(CTPU_PRECISION_HIGHEST), CTPU_OK);
    ck_assert(!ctpu_is_null(ctpu_matmul(A, B)));
    ck_assert_int_eq(ctpu_metric_counter("strict_cache_misses"), mm + 2);
    ck_assert_int_eq(ctpu_metric_counter("strict_cache_requests"),
                     ctpu_metric_counter("strict_cache_hits") + ctpu_metric_counter("strict_cache_misses"));
    /* a forced hash collision still gives the right program */
    int64_t coll = ctpu_metric_counter("cache_collisions");
    ctpu_cache_force_hash(ctpu__test_strict_cache(), true, 42);
    ctpu_tensor p = ctpu_add(a, b), q = ctpu_sub(a, b), r = ctpu_add(a, b);
    ctpu_cache_force_hash(ctpu__test_strict_cache(), false, 0);
    ck_assert_int_gt(ctpu_metric_counter("cache_collisions"), coll);   /* counted, and harmless: */
    float *vp = t_read(p, NULL), *vq = t_read(q, NULL), *vr = t_read(r, NULL);
    ck_assert(vp[2] == 9 && vq[2] == -3 && vr[2] == 9);
    free(vp); free(vq); free(vr);
}
END_TEST

/* ------------------------------------------------------------ ISA, threads */
#define N_DET 14
static void det_program(void *out[N_DET], size_t len[N_DET])
{
    int64_t s1[2] = { 3, 10007 }, s2 = 50001, s3[3] = { 6, 300, 5 };
    ctpu_manual_seed(99);
    ctpu_tensor a = ctpu_rand_normal(CTPU_F32, 2, s1, 1, 3);
    ctpu_tensor b = ctpu_rand_uniform(CTPU_F32, 1, &s2, -1e4, 1e4);
    ctpu_tensor c = ctpu_rand_normal(CTPU_BF16, 3, s3, 0, 1);
    ctpu_tensor mm_a = ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ 67, 129 }, 0, 1);
    ctpu_tensor mm_b = ctpu_rand_normal(CTPU_F32, 2, (int64_t[]){ 129, 45 }, 0, 1);
    ctpu_tensor outs[N_DET] = {
        ctpu_sum(a, 0, NULL, false),
        ctpu_sum(a, 1, (int[]){ 1 }, false),
        ctpu_mean(b, 0, NULL, false),
        ctpu_var(a, 1, (int[]){ -1 }, 1, true),
        ctpu_sum(c, 2, (int[]){ 0, 2 }, false),
        ctpu_softmax(a, 1),
        ctpu_max(ctpu_exp(ctpu_mul_scalar(b, 1e-3)), 0, NULL, false),
        ctpu_matmul(mm_a, mm_b),
        ctpu_sum(ctpu_tanh(b), 0, NULL, false),
        /* issue 12 */
        ctpu_prod(ctpu_add_scalar(ctpu_mul_scalar(a, 1e-3), 1.0), 1, (int[]){ 1 }, false),
        ctpu_cumsum(b, 0),
        ctpu_logsumexp(a, 1, (int[]){ 1 }, false),
        ctpu_randint(CTPU_I32, 1, &s2, -7, 1000003),
        ctpu_scatter_add(ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 97 }), 0,
                         ctpu_randint(CTPU_I32, 1, &s2, 0, 97), b),
    };
    for (int i = 0; i < N_DET; i++) {
        ck_assert_msg(!ctpu_is_null(outs[i]), "output %d: %s", i, ctpu_last_error());
        int64_t n;
        out[i] = t_read_raw(outs[i], &n);
        len[i] = (size_t)n * (ctpu_dtype_of(outs[i]) == CTPU_BF16 ? 2 : 4);
    }
}

START_TEST(identical_across_isa_and_threads)
{
    ctpu_shutdown();
    void *ref[N_DET] = { 0 };
    size_t rl[N_DET];
    int best = (int)ctpu_isa_detect();
    static const char *const thr[] = { "1", "2", "3" };
    int runs = 0;
    for (int isa = 0; isa <= best; isa++) {
        for (int t = 0; t < 3; t++) {
            if (isa != best && t != 1) continue;     /* every ISA at 2 threads; every count at the best ISA */
            t_clear_env();
            setenv("CTPU_ISA", ctpu_isa_name((ctpu_isa)isa), 1);
            setenv("CTPU_NUM_THREADS", thr[t], 1);
            ck_assert_int_eq(ctpu_init(), CTPU_OK);
            ck_assert_int_eq(ctpu_kernels_isa(), isa);
            void *o[N_DET];
            size_t l[N_DET];
            det_program(o, l);
            for (int i = 0; i < N_DET; i++) {
                if (!ref[i]) { ref[i] = o[i]; rl[i] = l[i]; continue; }
                ck_assert_uint_eq(l[i], rl[i]);
                ck_assert_msg(memcmp(o[i], ref[i], l[i]) == 0, "output %d differs at ISA %s, %s threads", i,
                              ctpu_isa_name((ctpu_isa)isa), thr[t]);
                free(o[i]);
            }
            ctpu_shutdown();
            runs++;
        }
    }
    ck_assert_int_ge(runs, 3);
    for (int i = 0; i < N_DET; i++) free(ref[i]);
    t_clear_env();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
}
END_TEST

/* ------------------------------------------------------------ randomness */
static float *draw(ctpu_dtype dt, int normal, int64_t n)
{
    ctpu_tensor t = normal ? ctpu_rand_normal(dt, 1, &n, 0.5, 2) : ctpu_rand_uniform(dt, 1, &n, -3, 5);
    ck_assert_msg(!ctpu_is_null(t), "%s", ctpu_last_error());
    float *v = t_read(t, NULL);
    ctpu_release(t);
    return v;
}

START_TEST(random_split_invariant)
{
    const int64_t N = 70001;
    for (int normal = 0; normal < 2; normal++) {
        ck_assert_int_eq(ctpu_rng_set_state(0xabcdef12345ull, 1000), CTPU_OK);
        float *all = draw(CTPU_F32, normal, N);
        uint64_t seed, off;
        ck_assert_int_eq(ctpu_rng_get_state(&seed, &off), CTPU_OK);
        ck_assert_uint_eq(seed, 0xabcdef12345ull);
        ck_assert_uint_eq(off, 1000 + (uint64_t)N);
        /* consecutive draws continue the offset */
        static const int64_t cuts[][3] = { { 1, 2, 69998 }, { 4096, 30000, 35905 }, { 70000, 1, 0 } };
        for (int c = 0; c < 3; c++) {
            ck_assert_int_eq(ctpu_rng_set_state(0xabcdef12345ull, 1000), CTPU_OK);
            int64_t at = 0;
            for (int k = 0; k < 3 && cuts[c][k]; k++) {
                float *part = draw(CTPU_F32, normal, cuts[c][k]);
                for (int64_t i = 0; i < cuts[c][k]; i++)
                    T_CHECK(t_same(part[i], all[at + i]), "split %d element %lld", c, (long long)(at + i));
                at += cuts[c][k];
                free(part);
            }
            ck_assert_int_eq(at, N);
        }
        /* explicit offsets, out of order */
        ck_assert_int_eq(ctpu_rng_set_state(0xabcdef12345ull, 1000 + 50000), CTPU_OK);
        float *tail = draw(CTPU_F32, normal, N - 50000);
        ck_assert_int_eq(ctpu_rng_set_state(0xabcdef12345ull, 1000), CTPU_OK);
        float *head = draw(CTPU_F32, normal, 50000);
        for (int64_t i = 0; i < 50000; i++) T_CHECK(t_same(head[i], all[i]), "head %lld", (long long)i);
        for (int64_t i = 0; i < N - 50000; i++) T_CHECK(t_same(tail[i], all[50000 + i]), "tail %lld", (long long)i);
        /* bf16 draws are the f32 draws rounded once */
        ck_assert_int_eq(ctpu_rng_set_state(0xabcdef12345ull, 1000), CTPU_OK);
        float *bf = draw(CTPU_BF16, normal, N);
        for (int64_t i = 0; i < N; i++)
            T_CHECK(t_same(bf[i], ctpu_bf16_to_f32(ctpu_f32_to_bf16(all[i]))), "bf16 element %lld",
                          (long long)i);
        /* the kernel's definition (element i = f(seed, offset + i)) */
        float *k = malloc((size_t)N * 4);
        if (normal) ctpu_k_rand_normal(0xabcdef12345ull, 1000, 0, N, 0.5f, 2.0f, k);
        else ctpu_k_rand_uniform(0xabcdef12345ull, 1000, 0, N, -3.0f, 5.0f, k);
        for (int64_t i = 0; i < N; i++) T_CHECK(t_same(k[i], all[i]), "kernel %lld", (long long)i);
        /* two draws in a row differ; manual_seed restarts */
        ctpu_manual_seed(5);
        float *d1 = draw(CTPU_F32, normal, 16), *d2 = draw(CTPU_F32, normal, 16);
        ck_assert(memcmp(d1, d2, 64) != 0);
        ctpu_manual_seed(5);
        float *d3 = draw(CTPU_F32, normal, 16);
        ck_assert(memcmp(d1, d3, 64) == 0);
        free(d1); free(d2); free(d3); free(k); free(bf); free(head); free(tail); free(all);
    }
}
END_TEST

START_TEST(random_thread_invariant)
{
    const int64_t N = 300007;
    float *ref = NULL;
    for (int t = 1; t <= 3; t++) {
        ctpu_shutdown();
        t_clear_env();
        char v[4];
        snprintf(v, sizeof v, "%d", t);
        setenv("CTPU_NUM_THREADS", v, 1);
        ck_assert_int_eq(ctpu_init(), CTPU_OK);
        ck_assert_int_eq(ctpu_rng_set_state(77, 3), CTPU_OK);
        float *d = draw(CTPU_F32, 1, N);
        if (!ref) { ref = d; continue; }
        ck_assert(memcmp(d, ref, (size_t)N * 4) == 0);
        free(d);
    }
    free(ref);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("modes");
    TCase *t = tcase_create("modes");
    tcase_add_checked_fixture(t, t_setup, t_teardown);
    tcase_set_timeout(t, 120);
    tcase_add_test(t, strict_returns_before_execution);
    tcase_add_test(t, debug_waits_each_op);
    tcase_add_test(t, embedding_fault_strict_at_sync);
    tcase_add_test(t, embedding_fault_debug_at_call);
    tcase_add_test(t, gather_fault_names_gather);
    tcase_add_test(t, poison_dependents_only);
    tcase_add_test(t, scatter_add_fault_in_every_mode);
    tcase_add_test(t, debug_checks_name_first_nan_op);
    tcase_add_test(t, debug_checks_env_off_in_debug);
    tcase_add_test(t, oom_message_and_recovery);
    tcase_add_test(t, oom_fails_at_once_naming_the_queue);
    tcase_add_test(t, oom_defer_names_the_op);
    tcase_add_test(t, env_bad_values);
    tcase_add_test(t, env_good_values);
    tcase_add_test(t, env_launch_blocking_wins);
    tcase_add_test(t, strict_debug_identical_bits);
    tcase_add_test(t, strict_cache_hits);
    tcase_add_test(t, identical_across_isa_and_threads);
    tcase_add_test(t, random_split_invariant);
    tcase_add_test(t, random_thread_invariant);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
