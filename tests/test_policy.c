/* Shape policies (issue 16): the recompile / pad_to_max / bucket_pow2
 * estimates of the metrics JSON against a hand computation from the cost
 * formula (costmodel.h) for a small histogram, the advice line's choice as
 * TORCH_TPU_COMPILE_SECONDS moves, launches past the recompile limit,
 * ctpu-report reading the fields (text, json, --compare), and automatic
 * dynamic dims' detection (TORCH_TPU_AUTO_DYNAMIC).
 *
 * Environment from meson: CTPU_TEST_REPORT_TOOL (the built ctpu-report). */
#include <cJSON.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t_core.h"
#include "device/device.h"
#include "cost/costmodel.h"

#define N 65536                         /* elements per row */

/* The histogram: rows b per step. Upper bound 12; pow2 buckets 4, 8, 12 (16 capped at the bound). */
static const int64_t steps_b[] = { 3, 3, 5, 8, 8, 8, 12 };
#define N_STEPS ((int)(sizeof steps_b / sizeof steps_b[0]))

static void init_df(const char *compile_s, const char *limit)
{
    t_clear_env();
    setenv("CTPU_QUIET", "1", 1);
    setenv("TORCH_TPU_HBM_LIMIT", "1G", 1);
    setenv("TORCH_TPU_DETECT_LOOPS", "off", 1);
    setenv("TORCH_TPU_DEFER_AND_FUSE", "1", 1);
    if (compile_s) setenv("TORCH_TPU_COMPILE_SECONDS", compile_s, 1);
    if (limit) setenv("TORCH_TPU_RECOMPILE_LIMIT", limit, 1);
    ck_assert_msg(ctpu_init() == CTPU_OK, "%s", ctpu_last_error());
}

/* Per step: x [b, N] from the host, u = exp(x) * 2 kept past the step:
 * one program, input x, output u. Returns the last step's u[0]. */
static float run_steps_marked(int64_t mark_hi)
{
    float *xd = malloc(sizeof(float) * 12 * N);
    ck_assert_ptr_nonnull(xd);
    for (int i = 0; i < 12 * N; i++) xd[i] = (float)(i % 13) * 0.125f - 0.75f;
    float last = 0;
    for (int s = 0; s < N_STEPS; s++) {
        int64_t sh[2] = { steps_b[s], N };
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 2, sh);
        if (mark_hi) ck_assert_int_eq(ctpu_mark_dynamic(x, 0, 2, mark_hi), CTPU_OK);
        ctpu_tensor u = ctpu_keep(ctpu_mul_scalar(ctpu_exp(x), 2.0));
        ck_assert(!ctpu_is_null(u));
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
        float *v = t_read(u, NULL);
        last = v[0];
        free(v);
        ctpu_release(u);
    }
    free(xd);
    return last;
}

static float run_steps(void) { return run_steps_marked(0); }

static cJSON *metrics_doc(void)
{
    char *s = ctpu_metrics_json();
    ck_assert_ptr_nonnull(s);
    cJSON *d = cJSON_Parse(s);
    free(s);
    ck_assert_ptr_nonnull(d);
    return d;
}

static const cJSON *item(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    ck_assert_msg(v, "no field %s", k);
    return v;
}
static double num(const cJSON *o, const char *k)
{
    const cJSON *v = item(o, k);
    ck_assert_msg(cJSON_IsNumber(v), "%s is not a number", k);
    return v->valuedouble;
}
static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = item(o, k);
    ck_assert_msg(cJSON_IsString(v), "%s is not a string", k);
    return v->valuestring;
}

static void near(double got, double want, const char *what)
{
    ck_assert_msg(fabs(got - want) <= 1e-12 * fabs(want) + 1e-300, "%s: got %.17g, want %.17g", what, got, want);
}

/* The hand computation (costmodel.h): per launch of b rows on chip c,
 * vector ops b*N*(8 [exp, transcendental] + 1 [mul_scalar]), no MXU work,
 * HBM traffic b*N*4 read + b*N*4 written; total = max(vector_s, hbm_s). */
static double t_launch(const ctpu_chip_info *c, double b)
{
    double vec = b * N * (CTPU_COST_TRANSCENDENTAL + 1.0) / (c->peak_bf16_flops / CTPU_COST_VPU_RATIO);
    double hbm = b * N * 8.0 / (c->hbm_gbps * 1e9);
    return vec > hbm ? vec : hbm;
}

static const cJSON *the_structure(const cJSON *d)
{
    const cJSON *ss = item(item(d, "shape_policies"), "structures");
    ck_assert_int_eq(cJSON_GetArraySize(ss), 1);
    return cJSON_GetArrayItem(ss, 0);
}

static const cJSON *policy(const cJSON *s, const char *name)
{
    const cJSON *ps = item(s, "policies");
    for (int i = 0; i < cJSON_GetArraySize(ps); i++)
        if (strcmp(str(cJSON_GetArrayItem(ps, i), "policy"), name) == 0) return cJSON_GetArrayItem(ps, i);
    ck_abort_msg("no policy row %s", name);
    return NULL;
}

/* b padded to the next power of two, the bound being the last bucket */
static double bucket_of(double b, double bound)
{
    double p = 1;
    while (p < b) p *= 2;
    return p > bound ? bound : p;
}

/* Each policy's figures against the hand computation, on every profile:
 * pad_to_max pads to bound (the largest extent seen, 12, or a mark's hi). */
static void check_figures_to(const cJSON *s, double compile_s, double bound)
{
    int nc;
    const ctpu_chip_info *chips = ctpu_chip_profiles(&nc);
    static const char *const names[3] = { "recompile", "pad_to_max", "bucket_pow2" };
    const double compiles[3] = { 4, 1, 3 };
    double wasted[3] = { 0, 0, 0 };
    for (int i = 0; i < N_STEPS; i++) {
        double b = (double)steps_b[i], bb = bucket_of(b, bound);
        wasted[1] += (bound - b) * N * 8.0;
        wasted[2] += (bb - b) * N * 8.0;
    }
    for (int p = 0; p < 3; p++) {
        const cJSON *r = policy(s, names[p]);
        ck_assert_int_eq((int)num(r, "compiles"), (int)compiles[p]);
        near(num(r, "compile_s"), compiles[p] * compile_s, "compile_s");
        ck_assert(num(r, "wasted_flops") == 0);
        ck_assert_msg(num(r, "wasted_hbm_bytes") == wasted[p], "%s wasted %.0f, want %.0f", names[p],
                      num(r, "wasted_hbm_bytes"), wasted[p]);
        const cJSON *cs = item(r, "chips");
        ck_assert_int_eq(cJSON_GetArraySize(cs), nc);
        for (int c = 0; c < nc; c++) {
            double dev = 0;
            for (int i = 0; i < N_STEPS; i++) {
                double b = (double)steps_b[i];
                double at = p == 0 ? b : p == 1 ? bound : bucket_of(b, bound);
                dev += t_launch(&chips[c], at);
            }
            const cJSON *x = cJSON_GetArrayItem(cs, c);
            ck_assert_str_eq(str(x, "chip"), chips[c].name);
            near(num(x, "device_s"), dev, "device_s");
            near(num(x, "total_s"), dev + compiles[p] * compile_s, "total_s");
            near(num(x, "usd"), (dev + compiles[p] * compile_s) / 3600.0 * chips[c].usd_per_chip_hour[0], "usd");
            if (strcmp(chips[c].name, "v5e") == 0) {
                near(num(r, "device_s"), dev, "device_s (current chip)");
                near(num(r, "usd"), num(x, "usd"), "usd (current chip)");
            }
        }
    }
}

static void check_figures(const cJSON *s, double compile_s) { check_figures_to(s, compile_s, 12); }

START_TEST(policy_figures_by_hand)
{
    init_df("30", NULL);
    run_steps();
    cJSON *d = metrics_doc();
    const cJSON *sp = item(d, "shape_policies");
    ck_assert(num(sp, "compile_seconds") == 30);
    ck_assert(strstr(str(sp, "compile_seconds_source"), "assumption") != NULL);
    ck_assert_str_eq(str(sp, "chip"), "v5e");
    const cJSON *s = the_structure(d);
    ck_assert_str_eq(str(s, "ops"), "exp→mul_scalar");
    ck_assert_int_eq((int)num(s, "shapes"), 4);
    ck_assert_int_eq((int)num(s, "launches"), N_STEPS);
    const cJSON *dims = item(s, "dims");
    ck_assert_int_eq(cJSON_GetArraySize(dims), 1);
    ck_assert_str_eq(str(cJSON_GetArrayItem(dims, 0), "name"), "input 0 dim 0");
    ck_assert(num(cJSON_GetArrayItem(dims, 0), "upper_bound") == 12);
    /* the histogram: extents ascending, launches per extent */
    const cJSON *h = item(s, "histogram");
    static const int64_t ext[4] = { 3, 5, 8, 12 }, launches[4] = { 2, 1, 3, 1 };
    ck_assert_int_eq(cJSON_GetArraySize(h), 4);
    for (int i = 0; i < 4; i++) {
        const cJSON *e = cJSON_GetArrayItem(h, i);
        ck_assert(cJSON_GetArrayItem(item(e, "extent"), 0)->valuedouble == (double)ext[i]);
        ck_assert(num(e, "launches") == (double)launches[i]);
        ck_assert(num(e, "program") == (double)(i == 0 ? 1 : i == 1 ? 2 : i == 2 ? 3 : 4));
        near(num(e, "est_s"), t_launch(ctpu_chip_lookup("v5e"), (double)ext[i]), "histogram est_s");
    }
    ck_assert(cJSON_IsTrue(item(s, "estimated")));
    check_figures(s, 30);
    /* 30 s a compile dwarfs microseconds of device time: one compile wins */
    ck_assert_str_eq(str(s, "cheapest"), "pad_to_max");
    ck_assert(strstr(str(s, "advice"), "cheapest on v5e: pad_to_max") != NULL);
    ck_assert(strstr(str(s, "advice"), "less than recompile") != NULL);
    ck_assert(strstr(str(s, "advice"), "would be the cheapest after") != NULL);
    cJSON_Delete(d);
    ctpu_shutdown();
}
END_TEST

/* A dim marked with ctpu_mark_dynamic(x, 0, 2, 16): pad_to_max pads every
 * launch to the mark's hi, 16 (TorchTPU's bounded dynamism), not to the
 * largest extent seen (12); the buckets are 4, 8 and 16. The same hand
 * computation; results equal the unmarked run's. */
START_TEST(policy_pad_to_max_uses_the_marks_hi)
{
    init_df("30", NULL);
    float plain = run_steps();
    ctpu_shutdown();
    init_df("30", NULL);
    float marked = run_steps_marked(16);
    ck_assert(t_same(marked, plain));
    cJSON *d = metrics_doc();
    const cJSON *s = the_structure(d);
    ck_assert(cJSON_IsTrue(item(s, "dynamic")));
    ck_assert_int_eq((int)num(s, "shapes"), 4);
    const cJSON *dim = cJSON_GetArrayItem(item(s, "dims"), 0);
    ck_assert(num(dim, "upper_bound") == 16);
    ck_assert_str_eq(str(dim, "bound"), "ctpu_mark_dynamic hi");
    check_figures_to(s, 30, 16);
    /* a 16-row launch costs more than a 12-row one: the waste is larger than unmarked */
    ck_assert(num(policy(s, "pad_to_max"), "wasted_hbm_bytes") > 0);
    cJSON_Delete(d);
    ctpu_shutdown();
}
END_TEST

/* The advice follows the cheapest total on v5e: with u the time of one
 * row (HBM-bound, 8 N / 819e9 s), device times are recompile 47u,
 * bucket_pow2 52u, pad_to_max 84u; compiles 4, 3 and 1. bucket_pow2 wins
 * for 5u < C < 16u, recompile below 5u, pad_to_max above 16u. */
START_TEST(policy_advice_choice)
{
    const ctpu_chip_info *v5e = ctpu_chip_lookup("v5e");
    double u = t_launch(v5e, 1);
    struct { double c; const char *want; } cases[] = {
        { 0, "recompile" }, { 2 * u, "recompile" }, { 10 * u, "bucket_pow2" }, { 30 * u, "pad_to_max" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cs[64];
        snprintf(cs, sizeof cs, "%.17g", cases[i].c);
        init_df(cs, NULL);
        run_steps();
        cJSON *d = metrics_doc();
        const cJSON *s = the_structure(d);
        check_figures(s, cases[i].c);
        ck_assert_msg(strcmp(str(s, "cheapest"), cases[i].want) == 0, "compile %g s: cheapest %s, want %s",
                      cases[i].c, str(s, "cheapest"), cases[i].want);
        char want[64];
        snprintf(want, sizeof want, "cheapest on v5e: %s", cases[i].want);
        ck_assert_msg(strstr(str(s, "advice"), want) != NULL, "%s", str(s, "advice"));
        cJSON_Delete(d);
        ctpu_shutdown();
    }
}
END_TEST

/* Past TORCH_TPU_RECOMPILE_LIMIT the traces run op by op; they are launches
 * of their shapes all the same (program 0), and the results do not change. */
START_TEST(policy_counts_limit_fallbacks)
{
    init_df(NULL, NULL);
    float want = run_steps();
    ctpu_shutdown();
    init_df(NULL, "2");
    float got = run_steps();
    ck_assert(t_same(got, want));
    cJSON *d = metrics_doc();
    const cJSON *s = the_structure(d);
    ck_assert_int_eq((int)num(s, "shapes"), 4);
    ck_assert_int_eq((int)num(s, "launches"), N_STEPS);
    const cJSON *h = item(s, "histogram");
    ck_assert(num(cJSON_GetArrayItem(h, 0), "program") == 1);
    ck_assert(num(cJSON_GetArrayItem(h, 2), "program") == 0);   /* 8: past the limit */
    ck_assert(num(cJSON_GetArrayItem(h, 2), "launches") == 3);
    check_figures(s, 30);
    cJSON_Delete(d);
    ctpu_shutdown();
}
END_TEST

/* ---------------------------------------------------------------- the tool */
static char *run_tool(const char *args, int *status)
{
    const char *tool = getenv("CTPU_TEST_REPORT_TOOL");
    ck_assert_msg(tool, "CTPU_TEST_REPORT_TOOL is not set (run through meson test)");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", tool, args);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    char chunk[4096];
    size_t r;
    while ((r = fread(chunk, 1, sizeof chunk, p)) > 0) fwrite(chunk, 1, r, m);
    int st = pclose(p);
    fclose(m);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return buf;
}

START_TEST(policy_tool_reads_them)
{
    init_df("30", NULL);
    run_steps();
    char dir[] = "/tmp/ctpu_policy_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256], args[1024];
    snprintf(path, sizeof path, "%s/run.json", dir);
    ck_assert_int_eq(ctpu_metrics_write(path), CTPU_OK);
    /* the live report and the file's say the same */
    char *live = NULL;
    size_t ll = 0;
    FILE *f = open_memstream(&live, &ll);
    ck_assert_int_eq(ctpu_cache_report(f), CTPU_OK);
    fclose(f);
    ctpu_shutdown();
    int rc;
    snprintf(args, sizeof args, "'%s'", path);
    char *got = run_tool(args, &rc);
    ck_assert_int_eq(rc, 0);
    const char *want_lines[] = {
        "shape policies (TORCH_TPU_COMPILE_SECONDS=30 s per compile",
        "program 1 (exp→mul_scalar): input 0 dim 0 (to 12) took 4 shapes over 7 launches",
        "extents (launches): 3 (2), 5 (1), 8 (3), 12 (1)",
        "  recompile  ", "  pad_to_max  ", "  bucket_pow2  ",
        "advice: cheapest on v5e: pad_to_max",
    };
    for (size_t i = 0; i < sizeof want_lines / sizeof *want_lines; i++) {
        ck_assert_msg(t_contains(got, want_lines[i]), "ctpu-report lacks \"%s\":\n%s", want_lines[i], got);
        ck_assert_msg(t_contains(live, want_lines[i]), "ctpu_cache_report lacks \"%s\"", want_lines[i]);
    }
    free(got);
    /* json: the section is kept */
    snprintf(args, sizeof args, "--format json '%s'", path);
    got = run_tool(args, &rc);
    ck_assert_int_eq(rc, 0);
    cJSON *s = cJSON_Parse(got);
    ck_assert_ptr_nonnull(s);
    const cJSON *st = the_structure(s);
    ck_assert_str_eq(str(st, "cheapest"), "pad_to_max");
    check_figures(st, 30);
    cJSON_Delete(s);
    free(got);
    /* --compare: each policy's compiles and dollars side by side */
    snprintf(args, sizeof args, "--compare '%s' '%s'", path, path);
    got = run_tool(args, &rc);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(t_contains(got, "shape policy recompile: compiles / $") &&
                  t_contains(got, "shape policy pad_to_max: compiles / $") &&
                  t_contains(got, "shape policy bucket_pow2: compiles / $") && t_contains(got, "cheapest shape policy"),
                  "%s", got);
    free(got);
    free(live);
    remove(path);
    rmdir(dir);
}
END_TEST

/* A run with one shape has no section. */
START_TEST(policy_none_for_one_shape)
{
    init_df(NULL, NULL);
    float xd[4 * 8] = { 0 };
    int64_t sh[2] = { 4, 8 };
    for (int s = 0; s < 3; s++) {
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor u = ctpu_keep(ctpu_exp(ctpu_from_host(xd, CTPU_F32, 2, sh)));
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
        ctpu_release(u);
    }
    cJSON *d = metrics_doc();
    ck_assert_int_eq(cJSON_GetArraySize(item(item(d, "shape_policies"), "structures")), 0);
    cJSON_Delete(d);
    char *txt = NULL;
    size_t l = 0;
    FILE *f = open_memstream(&txt, &l);
    ck_assert_int_eq(ctpu_cache_report(f), CTPU_OK);
    fclose(f);
    ck_assert(!t_contains(txt, "shape policies"));
    free(txt);
    ctpu_shutdown();
}
END_TEST

/* Bad values of TORCH_TPU_COMPILE_SECONDS fail ctpu_init naming it. */
START_TEST(policy_env_checked)
{
    const char *bad[] = { "-1", "abc", "1e99", "", "3s", "-", "-nan", "-inf", "--0", " 1" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        t_clear_env();
        setenv("TORCH_TPU_COMPILE_SECONDS", bad[i], 1);
        ck_assert_int_eq(ctpu_init(), CTPU_ERR_ENV);
        ck_assert_msg(t_contains(ctpu_last_error(), "TORCH_TPU_COMPILE_SECONDS"), "%s", ctpu_last_error());
    }
    const char *good[] = { "0.5", "-0", "+2", "-0.0", "0" };   /* -0 is a number >= 0 */
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        t_clear_env();
        setenv("TORCH_TPU_COMPILE_SECONDS", good[i], 1);
        ck_assert_msg(ctpu_init() == CTPU_OK, "%s: %s", good[i], ctpu_last_error());
        ctpu_shutdown();
    }
    unsetenv("TORCH_TPU_COMPILE_SECONDS");
}
END_TEST

/* ---------------------------------------------------------------- automatic dynamic dims */
static void init_mode(const char *mode_var, bool auto_dyn)
{
    t_clear_env();
    setenv("CTPU_QUIET", "1", 1);
    setenv("TORCH_TPU_HBM_LIMIT", "1G", 1);
    setenv("TORCH_TPU_DETECT_LOOPS", "off", 1);
    if (mode_var) setenv(mode_var, "1", 1);
    if (auto_dyn) setenv("TORCH_TPU_AUTO_DYNAMIC", "1", 1);
    ck_assert_msg(ctpu_init() == CTPU_OK, "%s", ctpu_last_error());
}

/* Steps of x [r, c] -> sum(relu(x) * 3) over dim 1, kept; returns every
 * step's results, concatenated. */
static float *run_rc(const int64_t (*rc)[2], int n, int64_t *total)
{
    float *out = malloc(sizeof(float) * 64 * (size_t)n);
    ck_assert_ptr_nonnull(out);
    float xd[64 * 64];
    for (int i = 0; i < 64 * 64; i++) xd[i] = (float)((i * 7) % 23) * 0.25f - 2.0f;
    int64_t k = 0;
    for (int s = 0; s < n; s++) {
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 2, rc[s]);
        int32_t dim = 1;
        ctpu_tensor u = ctpu_keep(ctpu_sum(ctpu_mul_scalar(ctpu_relu(x), 3.0), 1, &dim, false));
        ck_assert_msg(!ctpu_is_null(u), "%s", ctpu_last_error());
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
        int64_t m;
        float *v = t_read(u, &m);
        memcpy(out + k, v, sizeof(float) * (size_t)m);
        k += m;
        free(v);
        ctpu_release(u);
    }
    *total = k;
    return out;
}

static const cJSON *auto_list(const cJSON *d) { return item(item(d, "shape_policies"), "auto_dynamic"); }

/* Detected at the first recompile, exactly once, with the dim and the step;
 * results bit-identical to strict eager. */
START_TEST(auto_dynamic_after_one_recompile)
{
    static const int64_t rc[6][2] = { { 4, 16 }, { 4, 16 }, { 7, 16 }, { 9, 16 }, { 4, 16 }, { 12, 16 } };
    init_mode(NULL, false);
    int64_t n_want, n_got;
    float *want = run_rc(rc, 6, &n_want);
    ctpu_shutdown();
    init_mode("TORCH_TPU_DEFER_AND_FUSE", true);
    float *got = run_rc(rc, 6, &n_got);
    ck_assert_int_eq(n_got, n_want);
    for (int64_t i = 0; i < n_want; i++) ck_assert_msg(t_same(got[i], want[i]), "element %lld differs", (long long)i);
    cJSON *d = metrics_doc();
    const cJSON *a = auto_list(d);
    ck_assert_int_eq(cJSON_GetArraySize(a), 1);
    const cJSON *x = cJSON_GetArrayItem(a, 0);
    ck_assert_str_eq(str(x, "dims"), "input 0 dim 0");
    ck_assert_int_eq((int)num(x, "step"), 2);
    ck_assert_int_eq((int)num(x, "from"), 4);
    ck_assert_int_eq((int)num(x, "to"), 7);
    ck_assert_int_eq((int)num(x, "old_program"), 1);
    ck_assert_int_eq((int)num(x, "program"), 2);
    ck_assert_int_eq((int)num(x, "lo"), 2);
    ck_assert(num(x, "hi") == 2147483647.0);
    /* as torch.compile: 4 static; the recompile at 7 compiles the dynamic
     * program itself; 9 binds it, 4 hits its static program, 12 binds the
     * dynamic one: two compiles, one recompile */
    ck_assert(cJSON_IsTrue(item(x, "dynamic")));
    ck_assert_int_eq((int)num(item(d, "cache"), "compiles"), 2);
    ck_assert_int_eq((int)num(item(d, "cache"), "recompiles"), 1);
    ck_assert_int_eq((int)num(item(d, "counters"), "dynamic_binds"), 2);
    /* the shape policies see every launch at its own extents, the dynamic one's too */
    const cJSON *st = the_structure(d);
    ck_assert(cJSON_IsTrue(item(st, "dynamic")));
    const cJSON *h = item(st, "histogram");
    ck_assert_int_eq(cJSON_GetArraySize(h), 4);
    ck_assert(cJSON_GetArrayItem(item(cJSON_GetArrayItem(h, 3), "extent"), 0)->valuedouble == 12);
    ck_assert(num(cJSON_GetArrayItem(h, 3), "launches") == 1);
    ck_assert(num(cJSON_GetArrayItem(h, 0), "launches") == 3);
    cJSON_Delete(d);
    char *txt = NULL;
    size_t l = 0;
    FILE *f = open_memstream(&txt, &l);
    ck_assert_int_eq(ctpu_cache_report(f), CTPU_OK);
    fclose(f);
    ck_assert_msg(t_contains(txt, "automatic dynamic: program 2 (relu→mul_scalar→sum): input 0 dim 0 became dynamic "
                              "over [2, 2147483647] at step 2 (recompile 4 -> 7, program 1 -> 2)"), "%.1500s", strstr(txt, "shape policies") ? strstr(txt, "shape policies") : txt);
    free(txt);
    free(want);
    free(got);
    ctpu_shutdown();
    /* off by default: nothing detected */
    init_mode("TORCH_TPU_DEFER_AND_FUSE", false);
    got = run_rc(rc, 6, &n_got);
    free(got);
    d = metrics_doc();
    ck_assert_int_eq(cJSON_GetArraySize(auto_list(d)), 0);
    cJSON_Delete(d);
    ctpu_shutdown();
}
END_TEST

/* A recompile that changes two dims is not one dim's: the first recompile
 * that changes one alone is the one recorded. */
START_TEST(auto_dynamic_needs_one_dim)
{
    static const int64_t rc[4][2] = { { 4, 16 }, { 6, 20 }, { 6, 20 }, { 6, 40 } };
    init_mode("TORCH_TPU_DEFER_AND_FUSE", true);
    int64_t n;
    float *got = run_rc(rc, 4, &n);
    free(got);
    cJSON *d = metrics_doc();
    const cJSON *a = auto_list(d);
    ck_assert_int_eq(cJSON_GetArraySize(a), 1);
    const cJSON *x = cJSON_GetArrayItem(a, 0);
    ck_assert_str_eq(str(x, "dims"), "input 0 dim 1");
    ck_assert_int_eq((int)num(x, "step"), 3);
    ck_assert_int_eq((int)num(x, "from"), 20);
    ck_assert_int_eq((int)num(x, "to"), 40);
    /* 4x16, 6x20 (two dims: static), 6x40 (the dynamic program) */
    ck_assert_int_eq((int)num(item(d, "cache"), "compiles"), 3);
    cJSON_Delete(d);
    ctpu_shutdown();
}
END_TEST

/* Two traces a step (a host read between them) whose inputs differ in one
 * dim (x [4, 16], then y [4, 20]): each trace's input differs from the
 * last flushed trace's at its position, so it is marked speculatively, but
 * it is no recompile (its static program hits): the marks are dropped, no
 * dim becomes dynamic, two compiles in all; the same bits as strict eager. */
static void run_two_traces(int steps, float *out)
{
    float xd[4 * 20];
    for (int i = 0; i < 4 * 20; i++) xd[i] = (float)((i * 5) % 17) * 0.25f - 2.0f;
    for (int s = 0; s < steps; s++) {
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 2, (int64_t[]){ 4, 16 });
        int32_t dim = 1;
        ctpu_tensor u = ctpu_sum(ctpu_mul_scalar(ctpu_relu(x), 3.0), 1, &dim, false);
        float *a = t_read(u, NULL);
        ctpu_tensor y = ctpu_from_host(xd, CTPU_F32, 2, (int64_t[]){ 4, 20 });
        ctpu_tensor v = ctpu_keep(ctpu_sum(ctpu_exp(y), 1, &dim, false));
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
        float *b = t_read(v, NULL);
        memcpy(out + s * 8, a, sizeof(float) * 4);
        memcpy(out + s * 8 + 4, b, sizeof(float) * 4);
        free(a);
        free(b);
        ctpu_release(v);
    }
}

START_TEST(auto_dynamic_speculation_dropped)
{
    float want[6 * 8], got[6 * 8];
    init_mode(NULL, false);
    run_two_traces(6, want);
    ctpu_shutdown();
    init_mode("TORCH_TPU_DEFER_AND_FUSE", true);
    run_two_traces(6, got);
    for (int i = 0; i < 6 * 8; i++) ck_assert_msg(t_same(got[i], want[i]), "element %d differs", i);
    cJSON *d = metrics_doc();
    ck_assert_int_eq(cJSON_GetArraySize(auto_list(d)), 0);
    ck_assert_int_eq((int)num(item(d, "cache"), "compiles"), 2);
    ck_assert_int_eq((int)num(item(d, "cache"), "recompiles"), 0);
    ck_assert_int_eq((int)num(item(d, "counters"), "dynamic_binds"), 0);
    cJSON_Delete(d);
    ctpu_shutdown();
}
END_TEST

/* Per-structure automatic-dynamic state: every step runs a "train" trace
 * (x [4, T] and a flat y [4 T]: sum(relu(x) * 3) over dim 1 and sum(exp(y /
 * 8)); a host read cuts it) and an "eval" trace of another structure (e
 * [4, T]: sum(exp(e) - 1) over dim 1), T = 16 20 24 16 28 12. Each structure's
 * first one-dim recompile (16 -> 20) compiles its dynamic program, whatever
 * ran in between (y's dim 0 is 4 x T: the same symbol); later T bind it, 16
 * hits its static program: 4 compiles, 2 recompiles, 6 binds (7 compiles
 * when the speculation compared with the last flushed trace, the other
 * structure's). */
static void run_train_eval(const int64_t *T, int n, float *out)
{
    float xd[4 * 64];
    for (int i = 0; i < 4 * 64; i++) xd[i] = (float)((i * 7) % 23) * 0.25f - 2.0f;
    int32_t dim = 1;
    for (int s = 0; s < n; s++) {
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 2, (int64_t[]){ 4, T[s] });
        ctpu_tensor y = ctpu_from_host(xd, CTPU_F32, 1, (int64_t[]){ 4 * T[s] });
        ctpu_tensor u = ctpu_sum(ctpu_mul_scalar(ctpu_relu(x), 3.0), 1, &dim, false);
        ctpu_tensor z = ctpu_keep(ctpu_sum(ctpu_exp(ctpu_mul_scalar(y, 0.125)), 0, NULL, false));
        float *a = t_read(u, NULL);
        ctpu_tensor e = ctpu_from_host(xd + 3, CTPU_F32, 2, (int64_t[]){ 4, T[s] });
        ctpu_tensor v = ctpu_keep(ctpu_sum(ctpu_add_scalar(ctpu_exp(e), -1.0), 1, &dim, false));
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
        float *b = t_read(v, NULL), *c = t_read(z, NULL);
        memcpy(out + s * 9, a, sizeof(float) * 4);
        memcpy(out + s * 9 + 4, b, sizeof(float) * 4);
        out[s * 9 + 8] = c[0];
        free(a);
        free(b);
        free(c);
        ctpu_release(v);
        ctpu_release(z);
    }
}

START_TEST(auto_dynamic_per_structure)
{
    static const int64_t T[6] = { 16, 20, 24, 16, 28, 12 };
    float want[6 * 9], got[6 * 9];
    init_mode(NULL, false);
    run_train_eval(T, 6, want);
    ctpu_shutdown();
    init_mode("TORCH_TPU_DEFER_AND_FUSE", true);
    run_train_eval(T, 6, got);
    for (int i = 0; i < 6 * 9; i++) ck_assert_msg(t_same(got[i], want[i]), "element %d differs", i);
    cJSON *d = metrics_doc();
    const cJSON *a = auto_list(d);
    ck_assert_int_eq(cJSON_GetArraySize(a), 2);
    for (int k = 0; k < 2; k++) {
        const cJSON *x = cJSON_GetArrayItem(a, k);
        ck_assert_int_eq((int)num(x, "step"), 1);
        ck_assert_int_eq((int)num(x, "from"), 16);
        ck_assert_int_eq((int)num(x, "to"), 20);
        ck_assert(cJSON_IsTrue(item(x, "dynamic")));
    }
    ck_assert_int_eq((int)num(item(d, "cache"), "compiles"), 4);
    ck_assert_int_eq((int)num(item(d, "cache"), "recompiles"), 2);
    ck_assert_int_eq((int)num(item(d, "counters"), "dynamic_binds"), 6);
    cJSON_Delete(d);
    /* the advice names the recompiles that made T dynamic, and does not
     * tell the user to pad a dim that is already dynamic */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(ctpu_cache_report(f), CTPU_OK);
    fclose(f);
    ck_assert_msg(strstr(text, "made the dim dynamic (automatic dynamic)") != NULL, "report:\n%s", text);
    ck_assert_msg(strstr(text, "pad it to a few fixed sizes") == NULL, "report:\n%s", text);
    free(text);
    ctpu_shutdown();
    /* without TORCH_TPU_AUTO_DYNAMIC: one program per T and structure */
    init_mode("TORCH_TPU_DEFER_AND_FUSE", false);
    run_train_eval(T, 6, got);
    for (int i = 0; i < 6 * 9; i++) ck_assert_msg(t_same(got[i], want[i]), "element %d differs", i);
    d = metrics_doc();
    ck_assert_int_eq((int)num(item(d, "cache"), "compiles"), 10);
    cJSON_Delete(d);
    ctpu_shutdown();
}
END_TEST

/* Several dims: after T (dim 1) became dynamic, a change of B (dim 0) is a
 * recompile of the dynamic program at the new B (the structure's first
 * one-dim recompile alone makes a dim dynamic; B stays static): 4x16
 * static, 4x20 dynamic, 6x20 dynamic at B 6, 6x24 and 4x28 bind: 3
 * compiles, 2 binds; the same bits as strict eager (4 compiles when the
 * learnt rule matched an input's whole type but the dim: 6x24 was static). */
START_TEST(auto_dynamic_second_dim)
{
    static const int64_t rc[5][2] = { { 4, 16 }, { 4, 20 }, { 6, 20 }, { 6, 24 }, { 4, 28 } };
    init_mode(NULL, false);
    int64_t n_want, n_got;
    float *want = run_rc(rc, 5, &n_want);
    ctpu_shutdown();
    init_mode("TORCH_TPU_DEFER_AND_FUSE", true);
    float *got = run_rc(rc, 5, &n_got);
    ck_assert_int_eq(n_got, n_want);
    for (int64_t i = 0; i < n_want; i++) ck_assert_msg(t_same(got[i], want[i]), "element %lld differs", (long long)i);
    cJSON *d = metrics_doc();
    const cJSON *a = auto_list(d);
    ck_assert_int_eq(cJSON_GetArraySize(a), 1);
    ck_assert_str_eq(str(cJSON_GetArrayItem(a, 0), "dims"), "input 0 dim 1");
    ck_assert_int_eq((int)num(item(d, "cache"), "compiles"), 3);
    ck_assert_int_eq((int)num(item(d, "counters"), "dynamic_binds"), 2);
    cJSON_Delete(d);
    free(want);
    free(got);
    ctpu_shutdown();
}
END_TEST

/* A dynamic program's launches are priced at the extents they ran at (the
 * tester's report: the matmul table listed them all at the first extent,
 * and the run's FLOPs were the first extent's x launches): per step x [T,
 * 24] from the host, y = relu(x @ w) kept, w [24, 40]; T = 8 12 8 20. With x
 * marked dynamic (one program) the matmul table, the model FLOPs and the
 * estimated run time equal those of the run without marks (one program
 * per T, each priced at its own compile). */
static cJSON *run_dyn_matmuls(bool marked)
{
    static const int64_t T[4] = { 8, 12, 8, 20 };
    float xd[20 * 24], wd[24 * 40];
    for (int i = 0; i < 20 * 24; i++) xd[i] = (float)(i % 11) * 0.25f - 1.0f;
    for (int i = 0; i < 24 * 40; i++) wd[i] = (float)(i % 7) * 0.125f - 0.375f;
    init_df(NULL, NULL);
    ctpu_tensor w = ctpu_from_host(wd, CTPU_F32, 2, (int64_t[]){ 24, 40 });
    for (int s = 0; s < 4; s++) {
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 2, (int64_t[]){ T[s], 24 });
        if (marked) ck_assert_int_eq(ctpu_mark_dynamic(x, 0, 2, 32), CTPU_OK);
        ctpu_tensor y = ctpu_keep(ctpu_relu(ctpu_matmul(x, w)));
        ck_assert(!ctpu_is_null(y));
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
        ctpu_release(y);
    }
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    cJSON *d = metrics_doc();
    ck_assert_int_eq((int)num(item(d, "cache"), "compiles"), marked ? 1 : 3);
    ctpu_release(w);
    ctpu_shutdown();
    return d;
}

static int64_t mm_count(const cJSON *d, int64_t m)
{
    const cJSON *mms = item(d, "matmuls");
    int64_t n = 0;
    for (int i = 0; i < cJSON_GetArraySize(mms); i++) {
        const cJSON *x = cJSON_GetArrayItem(mms, i);
        if ((int64_t)num(x, "m") == m && (int64_t)num(x, "k") == 24 && (int64_t)num(x, "n") == 40)
            n += (int64_t)num(x, "count");
    }
    return n;
}

START_TEST(dynamic_launches_priced_at_their_extents)
{
    cJSON *dyn = run_dyn_matmuls(true), *stat = run_dyn_matmuls(false);
    ck_assert_int_eq(mm_count(dyn, 8), 2);
    ck_assert_int_eq(mm_count(dyn, 12), 1);
    ck_assert_int_eq(mm_count(dyn, 20), 1);
    ck_assert_int_eq(cJSON_GetArraySize(item(dyn, "matmuls")), 3);
    const cJSON *cd = item(dyn, "cost"), *cs = item(stat, "cost");
    ck_assert_double_eq_tol(num(cd, "model_flops"), num(cs, "model_flops"), 1e-6 * num(cs, "model_flops"));
    ck_assert_double_eq_tol(num(cd, "model_flops"), 2.0 * 48 * 24 * 40, 1.0);
    ck_assert_double_eq_tol(num(cd, "hbm_bytes"), num(cs, "hbm_bytes"), 1e-6 * num(cs, "hbm_bytes"));
    ck_assert_double_eq_tol(num(cd, "vector_ops"), num(cs, "vector_ops"), 1e-6 * num(cs, "vector_ops") + 1e-9);
    cJSON_Delete(dyn);
    cJSON_Delete(stat);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("policy");
    TCase *tc = tcase_create("policy");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, policy_figures_by_hand);
    tcase_add_test(tc, policy_pad_to_max_uses_the_marks_hi);
    tcase_add_test(tc, policy_advice_choice);
    tcase_add_test(tc, policy_counts_limit_fallbacks);
    tcase_add_test(tc, policy_tool_reads_them);
    tcase_add_test(tc, policy_none_for_one_shape);
    tcase_add_test(tc, policy_env_checked);
    tcase_add_test(tc, auto_dynamic_after_one_recompile);
    tcase_add_test(tc, auto_dynamic_needs_one_dim);
    tcase_add_test(tc, auto_dynamic_speculation_dropped);
    tcase_add_test(tc, auto_dynamic_per_structure);
    tcase_add_test(tc, dynamic_launches_priced_at_their_extents);
    tcase_add_test(tc, auto_dynamic_second_dim);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
