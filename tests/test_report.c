/* Reports (issue 6): exact counters for scripted scenarios, the cache report
 * text against a golden file, the JSON round trip through tools/ctpu-report,
 * the Perfetto trace file, the shutdown summary line and metrics file, the
 * cost model against hand-computed cases, bad input.
 *
 * Environment from meson: CTPU_TEST_GOLDEN_DIR (tests/golden), CTPU_TEST_REPORT_TOOL
 * (the built ctpu-report). CTPU_TEST_UPDATE_GOLDEN=1 rewrites the golden file. */
#include <cJSON.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t_core.h"
#include "device/tracefile.h"
#include "cost/costmodel.h"

static void env_base(void)
{
    t_clear_env();
    unsetenv("CTPU_QUIET");
    setenv("TORCH_TPU_HBM_LIMIT", "1G", 1);          /* capacity in the report: not the machine's RAM */
    setenv("TORCH_TPU_DETECT_LOOPS", "off", 1);
}

static void init_df(void)
{
    env_base();
    setenv("TORCH_TPU_DEFER_AND_FUSE", "1", 1);
    setenv("CTPU_QUIET", "1", 1);
    ck_assert_msg(ctpu_init() == CTPU_OK, "%s", ctpu_last_error());
}

/* The scripted loop: w [16,8] a device buffer; per step x [b,16] from the
 * host, y = relu(x @ w), a host read of sum(y) mid-step (label
 * "loss.item"), then sum(y * 2), kept past the step (so computed at its end). b = 8, except 5 in the
 * last of `steps` steps. */
static void scenario(int steps)
{
    float wd[16 * 8], xd[8 * 16];
    for (int i = 0; i < 16 * 8; i++) { wd[i] = (float)((i % 7) - 3) * 0.25f; xd[i] = (float)(i % 5) * 0.5f; }
    int64_t ws[2] = { 16, 8 };
    ctpu_tensor w = ctpu_keep(ctpu_from_host(wd, CTPU_F32, 2, ws));
    ck_assert(!ctpu_is_null(w));
    ck_assert_int_eq(ctpu_set_host_read_label("loss.item"), CTPU_OK);
    for (int s = 0; s < steps; s++) {
        int64_t xs[2] = { s == steps - 1 ? 5 : 8, 16 };
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 2, xs);
        ctpu_tensor y = ctpu_relu(ctpu_matmul(x, w));
        double v;
        ck_assert_msg(ctpu_item(ctpu_sum(y, 0, NULL, false), &v) == CTPU_OK, "%s", ctpu_last_error());
        ctpu_tensor u = ctpu_keep(ctpu_sum(ctpu_mul_scalar(y, 2.0), 0, NULL, false));   /* live at the cut */
        ck_assert(!ctpu_is_null(u));
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
        ctpu_release(u);
    }
    ctpu_set_host_read_label(NULL);
    ctpu_release(w);
}

static cJSON *metrics_doc(void)
{
    char *s = ctpu_metrics_json();
    ck_assert_ptr_nonnull(s);
    cJSON *d = cJSON_Parse(s);
    free(s);
    ck_assert_ptr_nonnull(d);
    return d;
}

static double jnum(const cJSON *o, const char *path)
{
    /* "a.b.c" */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *x = o;
    for (char *save, *tok = strtok_r(buf, ".", &save); tok; tok = strtok_r(NULL, ".", &save))
        x = cJSON_GetObjectItemCaseSensitive(x, tok);
    ck_assert_msg(cJSON_IsNumber(x), "%s is not a number", path);
    return x->valuedouble;
}

/* ---------------------------------------------------------------- counters */
START_TEST(counters_scripted_df)
{
    init_df();
    scenario(6);
    cJSON *d = metrics_doc();
    /* 2 programs per step (host-read cut + step end); the last step's
     * smaller batch recompiles both */
    ck_assert_int_eq((int)jnum(d, "cache.requests"), 12);
    ck_assert_int_eq((int)jnum(d, "cache.hits"), 8);
    ck_assert_int_eq((int)jnum(d, "cache.misses"), 4);
    ck_assert_int_eq((int)jnum(d, "cache.compiles"), 4);
    ck_assert_int_eq((int)jnum(d, "cache.recompiles"), 2);
    ck_assert_int_eq((int)jnum(d, "cache.evictions"), 0);
    ck_assert_int_eq((int)jnum(d, "cache.steps"), 6);
    ck_assert_int_eq((int)jnum(d, "cache.warmup_steps"), 1);
    ck_assert_int_eq((int)jnum(d, "cache.late_compile_steps"), 1);
    ck_assert_int_eq((int)jnum(d, "cuts.host_read"), 6);
    ck_assert_int_eq((int)jnum(d, "cuts.mark_step"), 6);
    ck_assert_int_eq((int)jnum(d, "counters.host_reads"), 6);
    ck_assert_int_eq((int)jnum(d, "timers.fused_kernels_per_program.count"), 4);
    /* recompile reasons with the step and the program's first ops */
    const cJSON *rs = cJSON_GetObjectItem(d, "recompiles");
    ck_assert_int_eq(cJSON_GetArraySize(rs), 2);
    const cJSON *r0 = cJSON_GetArrayItem(rs, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(r0, "reason")->valuestring, "input 0 (op #1): dim 0: 8 -> 5");
    ck_assert_int_eq((int)jnum(r0, "step"), 5);
    ck_assert_int_eq((int)jnum(r0, "old_program"), 1);
    ck_assert_int_eq((int)jnum(r0, "program"), 3);
    ck_assert_str_eq(cJSON_GetObjectItem(r0, "ops")->valuestring, "matmul→relu→sum");
    /* host reads by label */
    const cJSON *hr = cJSON_GetArrayItem(cJSON_GetObjectItem(d, "host_reads"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(hr, "label")->valuestring, "loss.item");
    ck_assert_int_eq((int)jnum(hr, "reads"), 6);
    ck_assert_int_eq((int)jnum(hr, "cuts"), 6);
    /* per program: launches and hits; the shapes */
    const cJSON *ps = cJSON_GetObjectItem(d, "programs");
    ck_assert_int_eq(cJSON_GetArraySize(ps), 4);
    const cJSON *p1 = cJSON_GetArrayItem(ps, 0);
    ck_assert_int_eq((int)jnum(p1, "launches"), 5);
    ck_assert_int_eq((int)jnum(p1, "hits"), 4);
    ck_assert_str_eq(cJSON_GetObjectItem(p1, "inputs")->valuestring, "f32[8,16], f32[16,8]");
    /* history: one point per step, cumulative */
    const cJSON *hc = cJSON_GetObjectItem(cJSON_GetObjectItem(d, "history"), "compiles");
    ck_assert_int_eq(cJSON_GetArraySize(hc), 6);
    ck_assert_int_eq((int)cJSON_GetArrayItem(hc, 0)->valuedouble, 2);
    ck_assert_int_eq((int)cJSON_GetArrayItem(hc, 4)->valuedouble, 2);
    ck_assert_int_eq((int)cJSON_GetArrayItem(hc, 5)->valuedouble, 4);
    /* matmul shapes: [8,16]x[16,8] five times, [5,16]x[16,8] once */
    const cJSON *mm = cJSON_GetObjectItem(d, "matmuls");
    ck_assert_int_eq(cJSON_GetArraySize(mm), 2);
    cJSON_Delete(d);

    /* clear: counters and run totals to zero, the cache stays */
    ctpu_metrics_clear();
    d = metrics_doc();
    ck_assert_int_eq((int)jnum(d, "cache.requests"), 0);
    ck_assert_int_eq((int)jnum(d, "cache.entries"), 4);
    ck_assert(jnum(d, "cost.model_flops") == 0);
    cJSON_Delete(d);
    ctpu_shutdown();
}
END_TEST

START_TEST(counters_strict_and_history)
{
    env_base();
    setenv("CTPU_QUIET", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    float a[4] = { 1, 2, 3, 4 };
    int64_t sh[2] = { 2, 2 };
    for (int s = 0; s < 3; s++) {
        ctpu_step_begin();
        ctpu_tensor x = ctpu_from_host(a, CTPU_F32, 2, sh);
        ctpu_tensor y = ctpu_add(ctpu_matmul(x, x), x);
        ck_assert(!ctpu_is_null(y));
        ctpu_step_end();
    }
    cJSON *d = metrics_doc();
    ck_assert_int_eq((int)jnum(d, "cache.strict_requests"), 6);
    ck_assert_int_eq((int)jnum(d, "cache.strict_hits"), 4);
    ck_assert_int_eq((int)jnum(d, "cache.compiles"), 2);
    ck_assert_int_eq((int)jnum(d, "cache.requests"), 0);
    ck_assert_int_eq((int)jnum(d, "cache.warmup_steps"), 1);
    cJSON_Delete(d);
    /* a long run: the history stays bounded and covers it */
    for (int s = 0; s < 1500; s++) ctpu_mark_step();
    d = metrics_doc();
    const cJSON *st = cJSON_GetObjectItem(cJSON_GetObjectItem(d, "history"), "step");
    int n = cJSON_GetArraySize(st);
    ck_assert_int_le(n, CTPU_HISTORY_CAP);
    ck_assert_int_ge(n, CTPU_HISTORY_CAP / 4);
    ck_assert_int_ge((int)cJSON_GetArrayItem(st, n - 1)->valuedouble, 1500 - 8);
    ck_assert_int_ge((int)jnum(d, "history.stride"), 2);
    cJSON_Delete(d);
    ctpu_shutdown();
}
END_TEST

/* ---------------------------------------------------------------- golden */
/* Timing fields (and the HBM peak and kernel counts, which depend on the
 * device thread's timing and on the fusion pass) zeroed: the rest of the
 * report is a function of the run. */
static char *deterministic_json(void)
{
    cJSON *d = metrics_doc();
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(d, "cache"), "compile_ns", cJSON_CreateNumber(0));
    /* HBM figures depend on when the device thread frees buffers */
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(d, "hbm"), "peak", cJSON_CreateNumber(0));
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(d, "hbm"), "in_use", cJSON_CreateNumber(0));
    cJSON *ps = cJSON_GetObjectItem(d, "programs");
    for (int i = 0; i < cJSON_GetArraySize(ps); i++) {
        cJSON_ReplaceItemInObject(cJSON_GetArrayItem(ps, i), "compile_ns", cJSON_CreateNumber(0));
        /* kernels after fusion: the fusion pass's business, not the report's */
        cJSON_ReplaceItemInObject(cJSON_GetArrayItem(ps, i), "kernels", cJSON_CreateNumber(0));
    }
    char *s = cJSON_Print(d);
    cJSON_Delete(d);
    return s;
}

static char *render(const char *json, const char *name, ctpu_report_format fmt)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    ck_assert_msg(ctpu_report_render(json, name, fmt, f) == CTPU_OK, "%s", ctpu_last_error());
    fclose(f);
    return buf;
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    char chunk[4096];
    size_t r;
    while ((r = fread(chunk, 1, sizeof chunk, f)) > 0) fwrite(chunk, 1, r, m);
    fclose(f);
    fclose(m);
    return buf;
}

/* The advice calls a smaller dim-0 extent "a smaller last batch" only when
 * its program launched few times beside the larger extent's; the warm-up
 * line points past the recompiles list for a later step that compiled a
 * new structure (hand-written documents: the counts are the point). */
static char *render_doc_with(double small_launches, double late_steps)
{
    char json[1024];
    snprintf(json, sizeof json,
             "{\"ctpu_metrics_version\": 1, \"mode\": \"defer_fuse\", \"cache\": {\"steps\": 8, \"all_hit_reached\": true, \"warmup_steps\": 1, "
             "\"late_compile_steps\": %.0f, \"recompiles\": 1}, "
             "\"programs\": [{\"id\": 1, \"launches\": 8, \"cached\": true}, {\"id\": 2, \"launches\": %.0f, "
             "\"cached\": true}], \"recompiles\": [{\"program\": 2, \"old_program\": 1, \"step\": 3, "
             "\"reason\": \"input 0 dim 0: 8 -> 6\"}]}", late_steps, small_launches);
    return render(json, "doc", CTPU_REPORT_TEXT);
}

START_TEST(report_last_batch_and_warmup_wording)
{
    char *t = render_doc_with(8, 1);   /* 6 as often as 8: the batch size varies */
    ck_assert_msg(t_contains(t, "the batch size varies between steps"), "%s", t);
    ck_assert_msg(!t_contains(t, "a smaller last batch"), "%s", t);
    ck_assert_msg(t_contains(t, "1 later step compiled (see recompiles)"), "%s", t);
    free(t);
    t = render_doc_with(1, 2);   /* one launch at 6 against 8 at 8: a last batch; a second late step not listed */
    ck_assert_msg(t_contains(t, "(8 -> 6, a smaller last batch)"), "%s", t);
    ck_assert_msg(t_contains(t, "2 later steps compiled (1 in recompiles; the other compiled a new program structure, "
                                "not a recompile: see programs)"), "%s", t);
    free(t);
    /* a compiled step past the limit after 2 guard failures of its own: the advice says others used it up */
    const char *cj = "{\"ctpu_metrics_version\": 1, \"mode\": \"strict\", \"cache\": {}, \"compiled_steps\": [{\"name\": \"dyn\", "
                     "\"guard_failures\": 2, \"state\": \"past the recompile limit\", \"events\": [{\"kind\": "
                     "\"recompile limit\", \"reason\": \"past TORCH_TPU_RECOMPILE_LIMIT: the step's program structure "
                     "compiled its limit of shapes, most by other compiled steps or traces of that structure\"}]}]}";
    t = render(cj, "doc", CTPU_REPORT_TEXT);
    ck_assert_msg(t_contains(t, "compiled step dyn: its program structure passed the recompile limit after only 2 guard "
                                "failures of its own: other compiled steps"), "%s", t);
    ck_assert_msg(!t_contains(t, "2 guard failures passed the recompile limit"), "%s", t);
    free(t);
}
END_TEST

START_TEST(golden_report_text)
{
    init_df();
    scenario(6);
    char *json = deterministic_json();
    char *text = render(json, "scenario", CTPU_REPORT_TEXT);
    const char *dir = getenv("CTPU_TEST_GOLDEN_DIR");
    ck_assert_msg(dir, "CTPU_TEST_GOLDEN_DIR is not set (run through meson test)");
    char path[1024];
    snprintf(path, sizeof path, "%s/report_df.txt", dir);
    if (getenv("CTPU_TEST_UPDATE_GOLDEN")) {
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fputs(text, f);
        fclose(f);
    }
    char *want = read_all(path);
    ck_assert_msg(want, "cannot read %s", path);
    if (strcmp(want, text) != 0) {
        fprintf(stderr, "---- got\n%s---- want (%s)\n%s", text, path, want);
        ck_abort_msg("the report differs from %s (CTPU_TEST_UPDATE_GOLDEN=1 rewrites it)", path);
    }
    /* the lines the issue asks for */
    ck_assert(t_contains(text, "program 3 (matmul→relu→sum): input 0 (op #1): dim 0: 8 -> 5, step 5 (was program 1)"));
    ck_assert(t_contains(text, "2 recompiles per run from dim 0 of input 0 (8 -> 5"));
    ck_assert(t_contains(text, "a host read every step (loss.item) cuts the trace in two"));
    ck_assert(t_contains(text, "warm-up: 1 step before the cache went all-hit"));
    ck_assert(t_contains(text, "$ = on_demand list price per chip-hour"));
    ck_assert(t_contains(text, "7x us-central1"));
    ck_assert(!t_contains(text, "n/a"));
    /* markdown renders too */
    char *md = render(json, "scenario", CTPU_REPORT_MARKDOWN);
    ck_assert(t_contains(md, "| chip | MXU |"));
    free(md);
    free(want);
    free(text);
    cJSON_free(json);
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

START_TEST(tool_round_trip)
{
    init_df();
    scenario(4);
    char dir[] = "/tmp/ctpu_report_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256], bad[256], args[1024];
    snprintf(path, sizeof path, "%s/run.json", dir);
    ck_assert_int_eq(ctpu_metrics_write(path), CTPU_OK);
    char *json = read_all(path);
    char *want = render(json, path, CTPU_REPORT_TEXT);
    int rc;
    snprintf(args, sizeof args, "'%s'", path);
    char *got = run_tool(args, &rc);
    ck_assert_int_eq(rc, 0);
    ck_assert_str_eq(got, want);
    free(got);
    /* json format: a summary that parses and holds the counts */
    snprintf(args, sizeof args, "--format json '%s'", path);
    got = run_tool(args, &rc);
    ck_assert_int_eq(rc, 0);
    cJSON *s = cJSON_Parse(got);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq((int)jnum(s, "cache.requests"), 8);
    ck_assert(fabs(jnum(s, "hit_rate") - 4.0 / 8.0) < 1e-12);
    ck_assert_int_gt(cJSON_GetArraySize(cJSON_GetObjectItem(s, "advice")), 0);
    cJSON_Delete(s);
    free(got);
    /* compare: both runs side by side */
    snprintf(args, sizeof args, "--compare '%s' '%s'", path, path);
    got = run_tool(args, &rc);
    ck_assert_int_eq(rc, 0);
    ck_assert(t_contains(got, "est. device time / step"));
    free(got);
    /* plot */
    snprintf(args, sizeof args, "--plot '%s/p.svg' '%s'", dir, path);
    got = run_tool(args, &rc);
    ck_assert_int_eq(rc, 0);
    snprintf(bad, sizeof bad, "%s/p.svg", dir);
    char *svg = read_all(bad);
    ck_assert(svg && strncmp(svg, "<svg", 4) == 0 && t_contains(svg, "</svg>"));
    free(svg);
    free(got);
    remove(bad);
    /* a truncated file: exit 2, one line */
    snprintf(bad, sizeof bad, "%s/bad.json", dir);
    FILE *f = fopen(bad, "w");
    fwrite(json, 1, strlen(json) / 2, f);
    fclose(f);
    snprintf(args, sizeof args, "'%s'", bad);
    got = run_tool(args, &rc);
    ck_assert_int_eq(rc, 2);
    ck_assert(t_contains(got, "truncated JSON"));
    ck_assert_ptr_eq(strchr(got, '\n'), got + strlen(got) - 1);
    free(got);
    /* binary garbage and a missing file */
    f = fopen(bad, "w");
    fwrite("{\"a\":\0\1\2", 1, 8, f);
    fclose(f);
    got = run_tool(args, &rc);
    ck_assert_int_eq(rc, 2);
    free(got);
    snprintf(args, sizeof args, "'%s/missing.json'", dir);
    got = run_tool(args, &rc);
    ck_assert_int_eq(rc, 2);
    free(got);
    got = run_tool("--format xml x.json", &rc);
    ck_assert_int_eq(rc, 1);
    free(got);
    remove(bad);
    remove(path);
    rmdir(dir);
    free(want);
    free(json);
    ctpu_shutdown();
}
END_TEST

/* ---------------------------------------------------------------- compiled steps */
static ctpu_status cstep_scale(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    out[0] = ctpu_mul_scalar(in[0], sc[0]);
    return CTPU_OK;
}

static ctpu_status cstep_item(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    (void)sc;
    double v;
    ctpu_tensor s = ctpu_sum(in[0], 0, NULL, false);                 /* #1 */
    ctpu_status st = ctpu_item(s, &v);                               /* #2: a graph break */
    out[0] = ctpu_add_scalar(s, v);
    return st;
}

static const cJSON *step_row(const cJSON *d, const char *name)
{
    const cJSON *cs = cJSON_GetObjectItem(d, "compiled_steps");
    for (int i = 0; i < cJSON_GetArraySize(cs); i++) {
        const cJSON *r = cJSON_GetArrayItem(cs, i);
        if (strcmp(cJSON_GetObjectItem(r, "name")->valuestring, name) == 0) return r;
    }
    ck_abort_msg("no compiled_steps row %s", name);
    return NULL;
}

/* each compiled step is a row of the metrics JSON, the cache report and
 * ctpu-report: calls, captures, replays, guard failures with reasons in the
 * diff format, graph breaks with op numbers, host time per call and per
 * replay; a freed step keeps its row */
START_TEST(compiled_step_rows)
{
    env_base();
    setenv("CTPU_QUIET", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ctpu_compiled *a = ctpu_compile(cstep_scale, NULL, &(ctpu_compile_opts){ .name = "scale" });
    ctpu_compiled *b = ctpu_compile(cstep_item, NULL, &(ctpu_compile_opts){ .name = "reads" });
    float d8[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    for (int k = 0; k < 6; k++) {
        ctpu_scope_begin();
        ctpu_tensor x = ctpu_from_host(d8, CTPU_F32, 1, (int64_t[]){ k == 4 ? 4 : 8 });
        double sc[1] = { 1.0 + k };
        ctpu_tensor out[1];
        ck_assert_int_eq(ctpu_compiled_call(a, 1, &x, 1, sc, 1, out), CTPU_OK);
        ck_assert_int_eq(ctpu_compiled_call(b, 1, &x, 1, sc, 1, out), CTPU_OK);
        ctpu_scope_end();
    }
    ctpu_compiled_free(b);   /* freed: its row stays */
    cJSON *d = metrics_doc();
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(d, "compiled_steps")), 2);
    const cJSON *ra = step_row(d, "scale"), *rb = step_row(d, "reads");
    /* scale: 8 captured, 8 confirmed (a new scalar), 8 replayed, 8 replayed, 4: a guard failure, 8 replayed */
    ck_assert_int_eq((int)jnum(ra, "calls"), 6);
    ck_assert_int_eq((int)jnum(ra, "captures"), 3);
    ck_assert_int_eq((int)jnum(ra, "replays"), 3);
    ck_assert_int_eq((int)jnum(ra, "guard_failures"), 1);
    ck_assert_int_eq((int)jnum(ra, "graph_breaks"), 0);
    ck_assert_int_eq((int)jnum(ra, "versions"), 2);
    ck_assert(jnum(ra, "host_ns") > 0 && jnum(ra, "replay_host_ns") > 0 && jnum(ra, "replay_host_ns") < jnum(ra, "host_ns"));
    ck_assert(fabs(jnum(ra, "host_us_per_call") - jnum(ra, "host_ns") / 1e3 / 6) < 1e-9);
    ck_assert(fabs(jnum(ra, "host_us_per_replay") - jnum(ra, "replay_host_ns") / 1e3 / 3) < 1e-9);
    ck_assert_str_eq(cJSON_GetObjectItem(ra, "state")->valuestring, "replays");
    ck_assert(!cJSON_IsTrue(cJSON_GetObjectItem(ra, "freed")));
    const cJSON *ev = cJSON_GetObjectItem(ra, "events");
    ck_assert_int_eq(cJSON_GetArraySize(ev), 1);
    ck_assert_int_eq((int)jnum(cJSON_GetArrayItem(ev, 0), "call"), 5);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(ev, 0), "kind")->valuestring, "guard failure");
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(ev, 0), "reason")->valuestring, "input 0 dim 0: 8 -> 4");
    /* reads: a graph break at its first call, then defer and fuse */
    ck_assert_int_eq((int)jnum(rb, "calls"), 6);
    ck_assert_int_eq((int)jnum(rb, "captures"), 1);
    ck_assert_int_eq((int)jnum(rb, "replays"), 0);
    ck_assert_int_eq((int)jnum(rb, "graph_breaks"), 1);
    ck_assert_int_eq((int)jnum(rb, "eager_calls"), 5);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(rb, "freed")));
    ck_assert_str_eq(cJSON_GetObjectItem(rb, "state")->valuestring, "graph break: runs as defer and fuse");
    ev = cJSON_GetObjectItem(rb, "events");
    ck_assert_int_eq(cJSON_GetArraySize(ev), 1);
    ck_assert_int_eq((int)jnum(cJSON_GetArrayItem(ev, 0), "call"), 1);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(ev, 0), "reason")->valuestring,
                     "graph break (at op #2): host read (item) of f32[]");
    cJSON_Delete(d);

    /* the cache report and ctpu-report on the metrics file: the same rows */
    char *txt = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&txt, &len);
    ck_assert_int_eq(ctpu_cache_report(f), CTPU_OK);
    fclose(f);
    ck_assert_msg(t_contains(txt, "compiled steps (2):"), "%s", txt);
    ck_assert_msg(t_contains(txt, "calls  captures  replays  guard failures  graph breaks  eager calls  host/call"), "%s", txt);
    ck_assert_msg(t_contains(txt, "scale: call 5: guard failure: input 0 dim 0: 8 -> 4"), "%s", txt);
    ck_assert_msg(t_contains(txt, "reads: call 1: graph break: graph break (at op #2): host read (item) of f32[]"), "%s", txt);
    ck_assert_msg(t_contains(txt, "reads (freed)"), "%s", txt);
    ck_assert_msg(t_contains(txt, "compiled step reads: graph break (at op #2)"), "%s", txt);   /* the advice */
    char dir[] = "/tmp/ctpu_report_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256], args[512];
    snprintf(path, sizeof path, "%s/run.json", dir);
    ck_assert_int_eq(ctpu_metrics_write(path), CTPU_OK);
    int rc;
    snprintf(args, sizeof args, "'%s'", path);
    char *got = run_tool(args, &rc);
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(t_contains(got, "compiled steps (2):") && t_contains(got, "scale: call 5: guard failure: input 0 dim 0: 8 -> 4"),
                  "%s", got);
    free(got);
    snprintf(args, sizeof args, "--format json '%s'", path);
    got = run_tool(args, &rc);
    ck_assert_int_eq(rc, 0);
    cJSON *s = cJSON_Parse(got);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq((int)jnum(step_row(s, "reads"), "graph_breaks"), 1);
    cJSON_Delete(s);
    free(got);
    remove(path);
    rmdir(dir);
    free(txt);
    ctpu_compiled_free(a);
    ctpu_shutdown();
}
END_TEST

/* Compiled-step replays in the reports (new-user report item 2): a replay is
 * a launch of its program, with its ops and estimate, as the same program
 * launched by defer and fuse. N compiled calls against the same N steps run
 * by TORCH_COMPILE_DISABLE=1 under defer and fuse: the same launches, op
 * counts, FLOPs, HBM bytes, per-step cost, MFU and $ on every chip. */
static ctpu_status cstep_mm_neg(void *ctx, const ctpu_tensor *in, const double *sc, ctpu_tensor *out)
{
    (void)ctx;
    (void)sc;
    out[0] = ctpu_neg(ctpu_matmul(in[0], in[1]));
    return CTPU_OK;
}

typedef struct {
    ctpu_cost_table t;
    double launches, mm_count, neg_count, mm_shape_count, op_s_neg;
} replay_run;

static replay_run run_mm_steps(bool disable, int n)
{
    env_base();
    setenv("CTPU_QUIET", "1", 1);
    if (disable) {
        setenv("TORCH_COMPILE_DISABLE", "1", 1);
        setenv("TORCH_TPU_DEFER_AND_FUSE", "1", 1);
    }
    ck_assert_msg(ctpu_init() == CTPU_OK, "%s", ctpu_last_error());
    float *a = calloc(128 * 256, sizeof *a);
    for (int i = 0; i < 128 * 256; i++) a[i] = (float)(i % 7) * 0.125f;
    ctpu_tensor x = ctpu_keep(ctpu_from_host(a, CTPU_F32, 2, (int64_t[]){ 128, 256 }));
    ctpu_tensor w = ctpu_keep(ctpu_from_host(a, CTPU_F32, 2, (int64_t[]){ 256, 128 }));
    ctpu_compiled *c = ctpu_compile(cstep_mm_neg, NULL, &(ctpu_compile_opts){ .name = "mmneg" });
    ck_assert_ptr_nonnull(c);
    ctpu_tensor in[2] = { x, w };
    for (int k = 0; k < n; k++) {
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor o;
        ck_assert_msg(ctpu_compiled_call(c, 2, in, 0, NULL, 1, &o) == CTPU_OK, "%s", ctpu_last_error());
        ctpu_keep(o);   /* live past the step: defer and fuse computes it */
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
        ctpu_release(o);
    }
    replay_run r = { 0 };
    ck_assert_int_eq(ctpu_cost_table_get(&r.t), CTPU_OK);
    cJSON *d = metrics_doc();
    const cJSON *ps = cJSON_GetObjectItem(d, "programs");
    for (int i = 0; i < cJSON_GetArraySize(ps); i++) r.launches += jnum(cJSON_GetArrayItem(ps, i), "launches");
    const cJSON *ops = cJSON_GetObjectItem(d, "ops");
    for (int i = 0; i < cJSON_GetArraySize(ops); i++) {
        const cJSON *o = cJSON_GetArrayItem(ops, i);
        const char *name = cJSON_GetObjectItem(o, "op")->valuestring;
        if (strcmp(name, "matmul") == 0) r.mm_count = jnum(o, "count");
        if (strcmp(name, "neg") == 0) { r.neg_count = jnum(o, "count"); r.op_s_neg = jnum(o, "est_s"); }
    }
    const cJSON *mms = cJSON_GetObjectItem(d, "matmuls");
    for (int i = 0; i < cJSON_GetArraySize(mms); i++) r.mm_shape_count += jnum(cJSON_GetArrayItem(mms, i), "count");
    cJSON_Delete(d);
    ctpu_compiled_free(c);
    ctpu_release(x);
    ctpu_release(w);
    free(a);
    ctpu_shutdown();
    unsetenv("TORCH_COMPILE_DISABLE");
    unsetenv("TORCH_TPU_DEFER_AND_FUSE");
    return r;
}

static bool near_rel(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b)); }

START_TEST(compiled_replays_counted)
{
    const int n = 20;
    replay_run cr = run_mm_steps(false, n), df = run_mm_steps(true, n);
    ck_assert_uint_eq(cr.t.steps, (uint64_t)n);
    ck_assert_uint_eq(df.t.steps, (uint64_t)n);
    ck_assert_msg(df.launches == n && df.mm_count == n && df.neg_count == n && df.mm_shape_count == n,
                  "defer and fuse: launches %g, matmul %g, neg %g, matmul shapes %g", df.launches, df.mm_count,
                  df.neg_count, df.mm_shape_count);
    ck_assert_msg(cr.launches == n && cr.mm_count == n && cr.neg_count == n && cr.mm_shape_count == n,
                  "compiled: launches %g, matmul %g, neg %g, matmul shapes %g (want %d each)", cr.launches, cr.mm_count,
                  cr.neg_count, cr.mm_shape_count, n);
    ck_assert(cr.op_s_neg > 0 && near_rel(cr.op_s_neg, df.op_s_neg));
    ck_assert(cr.t.model_flops > 0 && near_rel(cr.t.model_flops, df.t.model_flops));
    ck_assert(near_rel(cr.t.hbm_bytes, df.t.hbm_bytes));
    ck_assert(near_rel(cr.t.vector_ops, df.t.vector_ops));
    ck_assert_int_eq(cr.t.n_rows, df.t.n_rows);
    for (int i = 0; i < cr.t.n_rows; i++) {
        const ctpu_cost_row *a = &cr.t.rows[i], *b = &df.t.rows[i];
        ck_assert_msg(a->step_s > 0 && near_rel(a->step_s, b->step_s), "%s: compiled %g s per step, defer and fuse %g",
                      a->chip, a->step_s, b->step_s);
        ck_assert(near_rel(a->run_s, b->run_s) && near_rel(a->mfu, b->mfu));
        ck_assert(near_rel(a->mxu_utilization, b->mxu_utilization) && near_rel(a->usd_run, b->usd_run));
    }
}
END_TEST

/* ---------------------------------------------------------------- trace */
static int count_events(const cJSON *ev, const char *cat, const char *ph, int pid)
{
    int n = 0;
    for (int i = 0; i < cJSON_GetArraySize(ev); i++) {
        const cJSON *e = cJSON_GetArrayItem(ev, i);
        const cJSON *c = cJSON_GetObjectItem(e, "cat");
        if (cat && !(cJSON_IsString(c) && strcmp(c->valuestring, cat) == 0)) continue;
        if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, ph) != 0) continue;
        if (pid && (int)cJSON_GetObjectItem(e, "pid")->valuedouble != pid) continue;
        n++;
    }
    return n;
}

START_TEST(trace_file)
{
    char dir[] = "/tmp/ctpu_trace_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    env_base();
    setenv("TORCH_TPU_DEFER_AND_FUSE", "1", 1);
    setenv("CTPU_QUIET", "1", 1);
    setenv("TORCH_TPU_TRACE_FILE", path, 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    scenario(3);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ctpu_set_mode(CTPU_MODE_STRICT);
    float a[2] = { 1, 2 };
    int64_t n = 2;
    ctpu_tensor x = ctpu_from_host(a, CTPU_F32, 1, &n);
    ck_assert_int_eq(ctpu_set_name(x, "x.in"), CTPU_OK);
    ck_assert(!ctpu_is_null(ctpu_exp(x)));
    ctpu_shutdown();
    unsetenv("TORCH_TPU_TRACE_FILE");
    char *txt = read_all(path);
    ck_assert_ptr_nonnull(txt);
    cJSON *d = cJSON_Parse(txt);
    ck_assert_msg(d, "the trace file is not JSON");
    const cJSON *ev = cJSON_GetObjectItem(d, "traceEvents");
    ck_assert(cJSON_IsArray(ev));
    ck_assert_int_eq((int)jnum(d, "otherData.dropped_events"), 0);
    /* fused: 2 compiles in step 0, then hits; a recompile at the last step */
    ck_assert_int_eq(count_events(ev, "compile", "X", 1), 4 + 1);   /* + the strict exp */
    ck_assert_int_eq(count_events(ev, "cache", "i", 1), 2);
    ck_assert_int_eq(count_events(ev, "cut", "i", 1), 6);            /* the sync finds an empty trace: no cut */
    ck_assert_int_eq(count_events(ev, "host_read", "i", 1), 3);
    ck_assert_int_eq(count_events(ev, "sync", "X", 1), 1);
    ck_assert_int_eq(count_events(ev, "op", "i", 1), 1);
    ck_assert_int_ge(count_events(ev, "program", "X", 2), 7);          /* device track */
    ck_assert_int_ge(count_events(ev, NULL, "M", 0), 3);
    /* every event has a name, a numeric ts and pid/tid; a compile says hit/miss and why */
    bool saw_reason = false;
    for (int i = 0; i < cJSON_GetArraySize(ev); i++) {
        const cJSON *e = cJSON_GetArrayItem(ev, i);
        ck_assert(cJSON_IsString(cJSON_GetObjectItem(e, "name")));
        ck_assert(cJSON_IsNumber(cJSON_GetObjectItem(e, "pid")) && cJSON_IsNumber(cJSON_GetObjectItem(e, "tid")));
        if (strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "M") != 0)
            ck_assert(cJSON_IsNumber(cJSON_GetObjectItem(e, "ts")));
        const cJSON *args = cJSON_GetObjectItem(e, "args");
        const cJSON *reason = cJSON_GetObjectItem(args, "reason");
        if (cJSON_IsString(reason) && strcmp(reason->valuestring, "input 0 (op #1): dim 0: 8 -> 5") == 0) {
            ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(args, "hit")));
            saw_reason = true;
        }
    }
    ck_assert(saw_reason);
    /* a strict op's event names its named inputs (ctpu_set_name) */
    bool saw_inputs = false;
    for (int i = 0; i < cJSON_GetArraySize(ev); i++) {
        const cJSON *e = cJSON_GetArrayItem(ev, i);
        const cJSON *cat = cJSON_GetObjectItem(e, "cat");
        if (!cJSON_IsString(cat) || strcmp(cat->valuestring, "op") != 0) continue;
        const cJSON *ins = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "inputs");
        ck_assert_msg(cJSON_IsArray(ins) && cJSON_GetArraySize(ins) == 1, "op event without its inputs' names");
        ck_assert_str_eq(cJSON_GetArrayItem(ins, 0)->valuestring, "x.in");
        saw_inputs = true;
    }
    ck_assert(saw_inputs);
    /* device slices: a fused program is "program N: ..." with "program": N,
     * N one of the ids the compile events (and the report) use */
    int fused_slices = 0, strict_slices = 0;
    for (int i = 0; i < cJSON_GetArraySize(ev); i++) {
        const cJSON *e = cJSON_GetArrayItem(ev, i);
        const cJSON *cat = cJSON_GetObjectItem(e, "cat");
        if (!cJSON_IsString(cat) || strcmp(cat->valuestring, "program") != 0) continue;
        const cJSON *pr = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), "program");
        const char *nm = cJSON_GetObjectItem(e, "name")->valuestring;
        if (cJSON_IsNumber(pr)) {
            char want[32];
            snprintf(want, sizeof want, "program %d: ", pr->valueint);
            ck_assert_msg(strncmp(nm, want, strlen(want)) == 0, "%s", nm);
            bool compiled = false;   /* the same id was compiled on the host track */
            for (int j = 0; j < cJSON_GetArraySize(ev) && !compiled; j++) {
                const cJSON *c = cJSON_GetArrayItem(ev, j);
                const cJSON *cp = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "args"), "program");
                compiled = cJSON_IsNumber(cp) && cp->valueint == pr->valueint &&
                           strcmp(cJSON_GetObjectItem(c, "cat")->valuestring, "compile") == 0;
            }
            ck_assert_msg(compiled, "program %d ran but no compile event names it", pr->valueint);
            fused_slices++;
        } else {
            ck_assert(cJSON_IsString(pr) && strcmp(pr->valuestring, "strict") == 0);
            strict_slices++;
        }
    }
    ck_assert_int_ge(fused_slices, 6);
    ck_assert_int_ge(strict_slices, 1);
    cJSON_Delete(d);
    free(txt);
    remove(path);
    rmdir(dir);
}
END_TEST

/* TORCH_TPU_TRACE_EVENTS sizes the buffer; drops name the setting that avoids them. */
START_TEST(trace_events_setting)
{
    char dir[] = "/tmp/ctpu_trace_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256], errp[256];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    snprintf(errp, sizeof errp, "%s/stderr.txt", dir);
    env_base();
    setenv("CTPU_QUIET", "1", 1);
    setenv("TORCH_TPU_TRACE_FILE", path, 1);
    setenv("TORCH_TPU_TRACE_EVENTS", "16", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ctpu_tensor x = ctpu_ones(CTPU_F32, 1, (int64_t[]){ 4 });
    for (int i = 0; i < 40; i++) x = ctpu_exp(ctpu_neg(x));   /* 80 ops: 160+ events */
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    fflush(stderr);
    int fd = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int saved = dup(2);
    dup2(fd, 2);
    ctpu_shutdown();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    char *err = read_all(errp);
    ck_assert_msg(t_contains(err, "buffer of 16 events full") && t_contains(err, "TORCH_TPU_TRACE_EVENTS="), "%s", err);
    char *txt = read_all(path);
    cJSON *d = cJSON_Parse(txt);
    ck_assert_ptr_nonnull(d);
    ck_assert_int_eq((int)jnum(d, "otherData.buffer_events"), 16);
    int dropped = (int)jnum(d, "otherData.dropped_events");
    ck_assert_int_gt(dropped, 100);
    char want[96];
    snprintf(want, sizeof want, "TORCH_TPU_TRACE_EVENTS=%d keeps them", 16 + dropped);
    ck_assert_msg(t_contains(txt, want) && t_contains(err, want + 0), "%s / %s", want, err);
    cJSON_Delete(d);
    free(txt);
    free(err);
    /* with the suggested size nothing is dropped */
    char nb[32];
    snprintf(nb, sizeof nb, "%d", 16 + dropped);
    setenv("TORCH_TPU_TRACE_EVENTS", nb, 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    x = ctpu_ones(CTPU_F32, 1, (int64_t[]){ 4 });
    for (int i = 0; i < 40; i++) x = ctpu_exp(ctpu_neg(x));
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ctpu_shutdown();
    txt = read_all(path);
    d = cJSON_Parse(txt);
    ck_assert_int_eq((int)jnum(d, "otherData.dropped_events"), 0);
    cJSON_Delete(d);
    free(txt);
    /* bad values: an error at init naming the variable */
    static const char *const bad[] = { "0", "15", "16777217", "1G", "lots", "-5" };
    for (int i = 0; i < 6; i++) {
        setenv("TORCH_TPU_TRACE_EVENTS", bad[i], 1);
        ck_assert_int_eq(ctpu_init(), CTPU_ERR_ENV);
        ck_assert(t_contains(ctpu_last_error(), "TORCH_TPU_TRACE_EVENTS"));
    }
    setenv("TORCH_TPU_TRACE_EVENTS", "1M", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ctpu_shutdown();
    unsetenv("TORCH_TPU_TRACE_EVENTS");
    unsetenv("TORCH_TPU_TRACE_FILE");
    remove(path);
    remove(errp);
    rmdir(dir);
}
END_TEST

START_TEST(trace_buffer_drops)
{
    ctpu_tracebuf *tb = ctpu_tracebuf_create(4);
    ck_assert_ptr_nonnull(tb);
    uint64_t t = ctpu_now_ns();
    for (int i = 0; i < 10; i++) ctpu_trace_complete(tb, CTPU_TRACK_HOST, "op", "a \"quoted\" name\n", t, t + 1000, "\"i\":1");
    ck_assert_uint_eq(ctpu_tracebuf_count(tb), 4);
    ck_assert_uint_eq(ctpu_tracebuf_dropped(tb), 6);
    char path[] = "/tmp/ctpu_tb_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    char err[256];
    ck_assert(ctpu_tracebuf_write(tb, path, err, sizeof err));
    char *txt = read_all(path);
    cJSON *d = cJSON_Parse(txt);
    ck_assert_ptr_nonnull(d);
    ck_assert_int_eq((int)jnum(d, "otherData.dropped_events"), 6);
    ck_assert(t_contains(txt, "6 later events dropped"));
    ck_assert(!ctpu_tracebuf_write(tb, "/nonexistent-dir/x.json", err, sizeof err));
    ck_assert(t_contains(err, "/nonexistent-dir/x.json"));
    cJSON_Delete(d);
    free(txt);
    remove(path);
    ctpu_tracebuf_destroy(tb);
    /* escaping never splits a UTF-8 character */
    char out[8];
    ctpu_json_escape("ab→→", out, sizeof out);
    ck_assert_str_eq(out, "ab→");
}
END_TEST

/* ---------------------------------------------------------------- shutdown */
/* stderr of init, two ops, shutdown; gone_dir (if set) is removed before
 * the shutdown (a metrics file whose directory vanished during the run). */
static char *stderr_of_run(const char *quiet, const char *metrics_file, const char *gone_dir)
{
    char path[] = "/tmp/ctpu_err_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    int saved = dup(2);
    dup2(fd, 2);
    env_base();
    if (quiet) setenv("CTPU_QUIET", quiet, 1);
    if (metrics_file) setenv("TORCH_TPU_METRICS_FILE", metrics_file, 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    float a[2] = { 1, 2 };
    int64_t n = 2;
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);   /* nothing left to shutdown: no leak line */
    ctpu_tensor x = ctpu_from_host(a, CTPU_F32, 1, &n);
    ck_assert(!ctpu_is_null(ctpu_exp(ctpu_exp(x))));
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    if (gone_dir) ck_assert_int_eq(rmdir(gone_dir), 0);
    ctpu_shutdown();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    unsetenv("TORCH_TPU_METRICS_FILE");
    char *txt = read_all(path);
    remove(path);
    return txt;
}

START_TEST(shutdown_summary_and_file)
{
    char *txt = stderr_of_run(NULL, NULL, NULL);
    ck_assert_msg(strncmp(txt, "ctpu: compile cache: 2 requests, 1 hits (50.0%), 1 compiles, ", 61) == 0, "got: %s", txt);
    ck_assert_ptr_eq(strchr(txt, '\n'), txt + strlen(txt) - 1);   /* one line */
    free(txt);
    txt = stderr_of_run("1", NULL, NULL);
    ck_assert_str_eq(txt, "");
    free(txt);
    char path[] = "/tmp/ctpu_mf_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    txt = stderr_of_run(NULL, path, NULL);
    ck_assert_str_eq(txt, "");                                      /* the file replaces the line */
    free(txt);
    char *json = read_all(path);
    cJSON *d = cJSON_Parse(json);
    ck_assert_ptr_nonnull(d);
    ck_assert_int_eq((int)jnum(d, "cache.strict_requests"), 2);
    ck_assert_str_eq(cJSON_GetObjectItem(d, "mode")->valuestring, "strict");
    cJSON_Delete(d);
    free(json);
    remove(path);
    /* a bad CTPU_QUIET fails init, naming it */
    env_base();
    setenv("CTPU_QUIET", "maybe", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_ERR_ENV);
    ck_assert(t_contains(ctpu_last_error(), "CTPU_QUIET"));
    unsetenv("CTPU_QUIET");
    /* a metrics file that cannot be written at shutdown (its directory was
     * removed during the run; init checks it exists): one line, shutdown goes on */
    char dir[] = "/tmp/ctpu_gone_XXXXXX", mf[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(mf, sizeof mf, "%s/m.json", dir);
    txt = stderr_of_run("1", mf, dir);
    ck_assert(t_contains(txt, "TORCH_TPU_METRICS_FILE"));
    free(txt);
}
END_TEST

/* ---------------------------------------------------------------- cost model */
START_TEST(cost_matmul_hand_computed)
{
    ctpu_cost_estimate e;
    /* 256x256x256 bf16 on v5e: 128x128 MXU, 197 TFLOP/s, 819 GB/s */
    ck_assert_int_eq(ctpu_cost_matmul("v5e", 1, 256, 256, 256, CTPU_BF16, CTPU_PRECISION_DEFAULT, &e), CTPU_OK);
    double macs = 256.0 * 256 * 256, bytes = 3.0 * 256 * 256 * 2;
    ck_assert(fabs(e.macs_useful - macs) < 0.5 && fabs(e.macs_padded - macs) < 0.5);
    ck_assert(fabs(e.flops - 2 * macs) < 0.5);
    ck_assert(fabs(e.mxu_s - 2 * macs / 197e12) < 1e-18);      /* 0.1703 us */
    ck_assert(fabs(e.hbm_bytes - bytes) < 0.5);
    ck_assert(fabs(e.hbm_s - bytes / 819e9) < 1e-18);          /* 0.4801 us */
    ck_assert(fabs(e.total_s - bytes / 819e9) < 1e-18);        /* HBM-bound */
    ck_assert(e.vector_s == 0 && e.mxu_utilization == 1.0);
    /* on v6e: 256x256 MXU, 918 TFLOP/s, 1,638 GB/s */
    ck_assert_int_eq(ctpu_cost_matmul("v6e", 1, 256, 256, 256, CTPU_BF16, CTPU_PRECISION_DEFAULT, &e), CTPU_OK);
    ck_assert(fabs(e.mxu_s - 2 * macs / 918e12) < 1e-18);      /* 0.0366 us */
    ck_assert(fabs(e.hbm_s - bytes / 1638e9) < 1e-18);         /* 0.2401 us */
    ck_assert(fabs(e.total_s - bytes / 1638e9) < 1e-18);
    ck_assert(e.mxu_utilization == 1.0);
    /* padding: [128,784]x[784,256] is 87.5% useful on 128x128 (K 784 -> 896) and
     * 128*784*256 / (256*1024*256) on 256x256 */
    ck_assert_int_eq(ctpu_cost_matmul("v5e", 1, 128, 784, 256, CTPU_F32, CTPU_PRECISION_DEFAULT, &e), CTPU_OK);
    ck_assert(fabs(e.mxu_utilization - 0.875) < 1e-12);
    ck_assert_int_eq(ctpu_cost_matmul("7x", 1, 128, 784, 256, CTPU_F32, CTPU_PRECISION_DEFAULT, &e), CTPU_OK);
    ck_assert(fabs(e.mxu_utilization - 128.0 * 784 * 256 / (256.0 * 1024 * 256)) < 1e-12);
    /* precision passes: highest = 6x the MXU time */
    ctpu_cost_estimate h;
    ck_assert_int_eq(ctpu_cost_matmul("v5e", 4, 512, 512, 512, CTPU_BF16, CTPU_PRECISION_HIGHEST, &h), CTPU_OK);
    ck_assert_int_eq(ctpu_cost_matmul("v5e", 4, 512, 512, 512, CTPU_BF16, CTPU_PRECISION_DEFAULT, &e), CTPU_OK);
    ck_assert(fabs(h.mxu_s - 6 * e.mxu_s) < 1e-15);
    ck_assert(fabs(e.flops - 2.0 * 4 * 512 * 512 * 512) < 1);
    /* bad input */
    ck_assert_int_eq(ctpu_cost_matmul("v9", 1, 1, 1, 1, CTPU_F32, CTPU_PRECISION_DEFAULT, &e), CTPU_ERR_INVALID_ARG);
    ck_assert(t_contains(ctpu_last_error(), "v9"));
    ck_assert_int_eq(ctpu_cost_matmul(NULL, 1, 1, 1, 1, CTPU_F32, CTPU_PRECISION_DEFAULT, &e), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_cost_matmul("v5e", 1, -1, 1, 1, CTPU_F32, CTPU_PRECISION_DEFAULT, &e), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_cost_matmul("v5e", 1, 1, 1, 1, CTPU_DTYPE_COUNT, CTPU_PRECISION_DEFAULT, &e), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_cost_matmul("v5e", 1, 1, 1, 1, CTPU_F32, CTPU_PRECISION_COUNT, &e), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_cost_matmul("v5e", 1, 1, 1, 1, CTPU_F32, CTPU_PRECISION_DEFAULT, NULL), CTPU_ERR_INVALID_ARG);
}
END_TEST

START_TEST(cost_table_strict_matmul)
{
    env_base();
    setenv("CTPU_QUIET", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    float *a = calloc(256 * 256, sizeof *a);
    int64_t sh[2] = { 256, 256 };
    ctpu_tensor x = ctpu_from_host(a, CTPU_F32, 2, sh);
    ck_assert(!ctpu_is_null(ctpu_matmul(x, x)));
    ctpu_mark_step();
    ck_assert_int_eq(ctpu_set_steps_per_epoch(10), CTPU_OK);
    ctpu_cost_table t;
    ck_assert_int_eq(ctpu_cost_table_get(&t), CTPU_OK);
    ck_assert_int_eq(t.n_rows, 4);
    ck_assert_str_eq(t.rows[t.current].chip, "v5e");
    ck_assert_uint_eq(t.steps, 1);
    ck_assert_uint_eq(t.steps_per_epoch, 10);
    for (int i = 0; i < t.n_rows; i++) {
        ctpu_cost_estimate e;
        ck_assert_int_eq(ctpu_cost_matmul(t.rows[i].chip, 1, 256, 256, 256, CTPU_F32, CTPU_PRECISION_DEFAULT, &e), CTPU_OK);
        ck_assert_msg(fabs(t.rows[i].run_s - e.total_s) < 1e-15, "%s: %g vs %g", t.rows[i].chip, t.rows[i].run_s, e.total_s);
        ck_assert(fabs(t.rows[i].epoch_s - 10 * e.total_s) < 1e-14);
        ck_assert(fabs(t.rows[i].mfu - e.flops / (e.total_s * ctpu_chip_lookup(t.rows[i].chip)->peak_bf16_flops)) < 1e-12);
        /* every profile has a published price (7x: $12.00 on demand in us-central1) */
        ck_assert(t.rows[i].price_known);
        ck_assert(t.rows[i].usd_per_chip_hour == ctpu_chip_lookup(t.rows[i].chip)->usd_per_chip_hour[CTPU_PRICE_ON_DEMAND]);
        ck_assert(fabs(t.rows[i].usd_run - e.total_s / 3600 * t.rows[i].usd_per_chip_hour) < 1e-18);
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_int_eq(ctpu_cost_table_print(&t, f), CTPU_OK);
    fclose(f);
    ck_assert(t_contains(buf, "roofline estimate, not a measurement"));
    ck_assert(t_contains(buf, "v5e *"));
    free(buf);
    ck_assert_int_eq(ctpu_set_steps_per_epoch(-1), CTPU_ERR_INVALID_ARG);
    free(a);
    ctpu_shutdown();
}
END_TEST

/* The published Cloud TPU price table (checked 2026-10-25), and
 * TORCH_TPU_PRICE_PLAN choosing the column the cost table prices. */
START_TEST(price_plans)
{
    static const struct { const char *chip, *region; double usd[4]; double hbm_gbps; } want[] = {
        { "7x", "us-central1", { 12.00, 6.00, 8.40, 5.40 }, 7380 },
        { "v6e", "asia-northeast1", { 3.24, 1.35, 2.27, 1.46 }, 1638 },
        { "v5p", "us-east5", { 4.20, 2.10, 2.94, 1.89 }, 2765 },
        { "v5e", "us-central1", { 1.20, 0.60, 0.84, 0.54 }, 819 },
    };
    for (int i = 0; i < 4; i++) {
        const ctpu_chip_info *ci = ctpu_chip_lookup(want[i].chip);
        ck_assert_ptr_nonnull(ci);
        ck_assert_str_eq(ci->price_region, want[i].region);
        ck_assert(ci->hbm_gbps == want[i].hbm_gbps);
        for (int p = 0; p < 4; p++) ck_assert_msg(ci->usd_per_chip_hour[p] == want[i].usd[p], "%s plan %d", want[i].chip, p);
        ck_assert(t_contains(ci->source, "2026-10-25"));
    }
    ck_assert_str_eq(ctpu_price_plan_name(CTPU_PRICE_ON_DEMAND), "on_demand");
    ck_assert_str_eq(ctpu_price_plan_name(CTPU_PRICE_FLEX_START), "flex_start");
    ck_assert_str_eq(ctpu_price_plan_name(CTPU_PRICE_1Y), "1y");
    ck_assert_str_eq(ctpu_price_plan_name(CTPU_PRICE_3Y), "3y");
    ck_assert_str_eq(ctpu_price_plan_name(CTPU_PRICE_PLAN_COUNT), "?");
    ck_assert_str_eq(ctpu_price_plan_name((ctpu_price_plan)-1), "?");

    static const char *const plans[] = { "on_demand", "flex_start", "1y", "3Y" };
    for (int p = 0; p < 4; p++) {
        env_base();
        setenv("CTPU_QUIET", "1", 1);
        setenv("TORCH_TPU_CHIP", "7x", 1);
        setenv("TORCH_TPU_PRICE_PLAN", plans[p], 1);
        ck_assert_int_eq(ctpu_init(), CTPU_OK);
        int64_t sh[2] = { 256, 256 };
        ctpu_tensor x = ctpu_zeros(CTPU_F32, 2, sh);
        ck_assert(!ctpu_is_null(ctpu_matmul(x, x)));
        ctpu_mark_step();
        ck_assert_int_eq(ctpu_sync(), CTPU_OK);
        ctpu_cost_table t;
        ck_assert_int_eq(ctpu_cost_table_get(&t), CTPU_OK);
        ck_assert_int_eq(t.plan, p);
        for (int i = 0; i < t.n_rows; i++) {
            const ctpu_chip_info *ci = ctpu_chip_lookup(t.rows[i].chip);
            ck_assert(t.rows[i].price_known);
            ck_assert(t.rows[i].usd_per_chip_hour == ci->usd_per_chip_hour[p]);
            ck_assert_str_eq(t.rows[i].price_region, ci->price_region);
            ck_assert(t.rows[i].usd_run > 0);
        }
        char *json = ctpu_metrics_json();
        ck_assert_ptr_nonnull(json);
        char *text = render(json, NULL, CTPU_REPORT_TEXT);
        char want_line[128];
        snprintf(want_line, sizeof want_line, "$ = %s list price per chip-hour", ctpu_price_plan_name((ctpu_price_plan)p));
        ck_assert_msg(t_contains(text, want_line), "%s", text);
        ck_assert(!t_contains(text, "n/a"));
        ck_assert(t_contains(text, p == 0 ? "12.00" : p == 1 ? "6.00" : p == 2 ? "8.40" : "5.40"));
        free(text);
        free(json);
        ctpu_shutdown();
        unsetenv("TORCH_TPU_PRICE_PLAN");
    }
}
END_TEST

/* The glitches a new user met (issue 20): strict eager's late compiles are
 * not called recompiles; a hit rate with misses never reads 100.0%; the plot
 * gives each run its own axes. */
START_TEST(report_new_user_glitches)
{
    env_base();
    setenv("CTPU_QUIET", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    float a[4] = { 1, 2, 3, 4 };
    for (int s = 0; s < 4; s++) {
        ctpu_step_begin();
        int64_t sh[2] = { 2, s == 3 ? 1 : 2 };    /* the last step: a new shape */
        ctpu_tensor x = ctpu_from_host(a, CTPU_F32, 2, sh);
        ck_assert(!ctpu_is_null(ctpu_exp(x)));
        ctpu_step_end();
    }
    char *strict = ctpu_metrics_json();
    char *text = render(strict, NULL, CTPU_REPORT_TEXT);
    ck_assert_msg(t_contains(text, "1 later step compiled (one-op programs for an op or shape first seen then)"), "%s", text);
    ck_assert(!t_contains(text, "see recompiles"));
    free(text);
    ctpu_shutdown();
    /* 59,999 hits of 60,000 requests */
    cJSON *d = cJSON_Parse(strict);
    cJSON *c = cJSON_GetObjectItem(d, "cache");
    cJSON_SetNumberValue(cJSON_GetObjectItem(c, "strict_requests"), 60000);
    cJSON_SetNumberValue(cJSON_GetObjectItem(c, "strict_hits"), 59999);
    cJSON_SetNumberValue(cJSON_GetObjectItem(c, "strict_misses"), 1);
    char *odd = cJSON_PrintUnformatted(d);
    text = render(odd, NULL, CTPU_REPORT_TEXT);
    ck_assert_msg(t_contains(text, "60000 requests, 59999 hits (99.9%), 1 misses"), "%s", text);
    ck_assert_msg(!t_contains(text, "(100.0%)"), "%s", text);
    free(text);
    text = render(odd, NULL, CTPU_REPORT_MARKDOWN);
    ck_assert(!t_contains(text, "(100.0%)"));
    free(text);
    /* the plot: one row of panels per run, each with its own y axis */
    cJSON_SetNumberValue(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(d, "history"), "compiles"), 0), 500);
    char *big = cJSON_PrintUnformatted(d);
    const char *runs[2] = { strict, big };
    const char *names[2] = { "small.json", "big.json" };
    char *svg = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&svg, &len);
    ck_assert_int_eq(ctpu_report_plot_svg(2, runs, names, f), CTPU_OK);
    fclose(f);
    int panels = 0;
    for (const char *p = svg; (p = strstr(p, "stroke=\"#888\"")); p++) panels++;
    ck_assert_int_eq(panels, 4);
    ck_assert(t_contains(svg, "small.json (strict") && t_contains(svg, "big.json (strict"));
    ck_assert(t_contains(svg, ">500</text>"));                 /* big.json's compile axis */
    ck_assert(t_contains(svg, "text-anchor=\"end\">2</text>"));   /* small.json's: its own 2 compiles */
    free(svg);
    free(big);
    free(odd);
    cJSON_Delete(d);
    free(strict);
}
END_TEST

/* ctpu_set_name: names in recompile reasons, the recompile log, cache-only
 * errors (which carry the diff) and trace host-read events. */
START_TEST(names_and_cache_only_diff)
{
    char dir[] = "/tmp/ctpu_names_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    init_df();
    ctpu_shutdown();
    setenv("TORCH_TPU_TRACE_FILE", path, 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    float wd[16 * 8] = { 0 }, xd[8 * 16] = { 0 };
    ctpu_tensor w = ctpu_keep(ctpu_from_host(wd, CTPU_F32, 2, (int64_t[]){ 16, 8 }));
    ck_assert_int_eq(ctpu_set_name(w, "fc1.weight"), CTPU_OK);
    ck_assert_str_eq(ctpu_name(w), "fc1.weight");
    for (int s = 0; s < 3; s++) {
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 2, (int64_t[]){ s == 2 ? 5 : 8, 16 });
        ck_assert_int_eq(ctpu_set_name(x, "batch.x"), CTPU_OK);
        ctpu_tensor loss = ctpu_sum(ctpu_relu(ctpu_matmul(x, w)), 0, NULL, false);
        ck_assert_int_eq(ctpu_set_name(loss, "loss"), CTPU_OK);
        double v;
        ck_assert_int_eq(ctpu_item(loss, &v), CTPU_OK);
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    }
    char log[2048];
    ck_assert_int_ge(ctpu_cache_recompile_log(log, sizeof log), 1);
    ck_assert_msg(t_contains(log, "input 0 (batch.x, op #1): dim 0: 8 -> 5"), "%s", log);
    /* cache-only: the error says what changed */
    ck_assert_int_eq(ctpu_cache_set_only(true), CTPU_OK);
    ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
    ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 2, (int64_t[]){ 3, 16 });
    ctpu_set_name(x, "batch.x");
    double v;
    ck_assert_int_eq(ctpu_item(ctpu_sum(ctpu_relu(ctpu_matmul(x, w)), 0, NULL, false), &v), CTPU_ERR_CACHE_MISS);
    ck_assert_msg(t_contains(ctpu_last_error(), "cache-only") &&
                  t_contains(ctpu_last_error(), "input 0 (batch.x, op #1): dim 0: ") &&
                  t_contains(ctpu_last_error(), "-> 3, was program"), "%s", ctpu_last_error());
    ctpu_clear_error();
    ctpu_step_end();
    /* a structure never seen */
    ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
    ck_assert_int_eq(ctpu_item(ctpu_sum(ctpu_exp(ctpu_from_host(xd, CTPU_F32, 1, (int64_t[]){ 7 })), 0, NULL, false), &v),
                     CTPU_ERR_CACHE_MISS);
    ck_assert_msg(t_contains(ctpu_last_error(), "no cached program has this structure"), "%s", ctpu_last_error());
    ctpu_clear_error();
    ctpu_step_end();
    ctpu_cache_set_only(false);
    /* names: cleared, bad ones refused, views report the storage's */
    ctpu_tensor row = ctpu_slice(w, 0, 0, 1, 1);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ck_assert_str_eq(ctpu_name(row), "fc1.weight");
    char big[CTPU_NAME_MAX + 2];
    memset(big, 'n', sizeof big - 1);
    big[sizeof big - 1] = 0;
    ck_assert_int_eq(ctpu_set_name(w, big), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_set_name(w, "a\nb"), CTPU_ERR_INVALID_ARG);
    ck_assert_str_eq(ctpu_name(w), "fc1.weight");
    ck_assert_int_eq(ctpu_set_name(w, NULL), CTPU_OK);
    ck_assert_str_eq(ctpu_name(w), "");
    ck_assert_str_eq(ctpu_name(CTPU_NULL), "");
    ctpu_release(row);
    ctpu_release(w);
    ctpu_shutdown();
    unsetenv("TORCH_TPU_TRACE_FILE");
    char *txt = read_all(path);
    ck_assert_ptr_nonnull(txt);
    ck_assert_msg(t_contains(txt, "\"tensor\":\"loss\""), "the trace's host reads do not name the tensor");
    ck_assert(t_contains(txt, "batch.x"));   /* the recompile event's reason */
    free(txt);
    remove(path);
    rmdir(dir);
}
END_TEST

/* Op provenance in what the cache and the trace file say (issue 11): a
 * recompile reason names the op (number, label) reading the input that
 * changed; a trace cut names where it cut; device slices carry their first
 * and last ops; strict op events their number and region. On a cache hit
 * (step 1) and on the recompile (step 2) they come from that step's
 * recording, never from step 0, which compiled the program. */
static const cJSON *arg_of(const cJSON *e, const char *k) { return cJSON_GetObjectItem(cJSON_GetObjectItem(e, "args"), k); }

START_TEST(provenance_in_reasons_cuts_and_slices)
{
    char dir[] = "/tmp/ctpu_prov_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    init_df();
    ctpu_shutdown();
    setenv("TORCH_TPU_TRACE_FILE", path, 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    float xd[8 * 4] = { 0 };
    for (int s = 0; s < 4; s++) {
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 2, (int64_t[]){ s == 2 ? 5 : 8, 4 });
        ck_assert_int_eq(ctpu_label_push(s == 0 ? "warmup" : "block1.attn"), CTPU_OK);
        ctpu_tensor y = ctpu_relu(ctpu_mul_scalar(x, 2.0));            /* ops #1, #2 */
        ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
        ck_assert_int_eq(ctpu_label_push(s == 0 ? "loss0" : "loss"), CTPU_OK);
        ctpu_tensor l = ctpu_sum(y, 0, NULL, false);                    /* op #3 */
        ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
        ck_assert_int_eq(ctpu_release(y), CTPU_OK);
        if (s < 3) {                                                    /* a host read cuts: op #4 */
            double v;
            ck_assert_int_eq(ctpu_label_push(s == 0 ? "eval0" : "eval"), CTPU_OK);
            ck_assert_int_eq(ctpu_item(l, &v), CTPU_OK);
            ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
        }
        ctpu_keep(l);
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);                     /* step 3: cut here */
        ctpu_release(l);
    }
    char log[1024];
    ck_assert_int_ge(ctpu_cache_recompile_log(log, sizeof log), 1);
    static const char first[] = "step 2: program 1 -> 2: input 0 (op #1, \"block1.attn\"): dim 0: 8 -> 5\n";
    ck_assert_msg(strncmp(log, first, sizeof first - 1) == 0, "%s", log);
    /* strict eager's op events: number and region */
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    ck_assert_int_eq(ctpu_label_push("head"), CTPU_OK);
    ck_assert(!ctpu_is_null(ctpu_exp(ctpu_from_host(xd, CTPU_F32, 1, (int64_t[]){ 4 }))));
    ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
    ctpu_shutdown();
    unsetenv("TORCH_TPU_TRACE_FILE");
    char *txt = read_all(path);
    ck_assert_ptr_nonnull(txt);
    cJSON *d = cJSON_Parse(txt);
    ck_assert_msg(d, "the trace file is not JSON");
    const cJSON *ev = cJSON_GetObjectItem(d, "traceEvents");
    const char *cuts[4] = { NULL, NULL, NULL, NULL };
    int n_cuts = 0, n_slices = 0, saw_op = 0;
    static const char *const want_first[3] = { "warmup", "block1.attn", "block1.attn" };
    static const char *const want_last[3] = { "loss0", "loss", "loss" };
    bool saw_reason = false;
    for (int i = 0; i < cJSON_GetArraySize(ev); i++) {
        const cJSON *e = cJSON_GetArrayItem(ev, i);
        const cJSON *cat = cJSON_GetObjectItem(e, "cat");
        const char *c = cJSON_IsString(cat) ? cat->valuestring : "";
        const char *nm = cJSON_GetObjectItem(e, "name")->valuestring;
        if (!strcmp(c, "cut") && n_cuts < 4) cuts[n_cuts++] = nm;
        if (!strcmp(c, "cut") && t_contains(nm, "host_read")) {
            ck_assert_int_eq((int)arg_of(e, "op")->valuedouble, 4);
            ck_assert(t_contains(arg_of(e, "region")->valuestring, "eval"));
        }
        if (!strcmp(c, "program") && cJSON_IsNumber(arg_of(e, "program")) && n_slices < 3) {
            ck_assert_int_eq((int)arg_of(e, "program")->valuedouble, n_slices == 2 ? 2 : 1);
            ck_assert_int_eq((int)arg_of(e, "first_op")->valuedouble, 1);
            ck_assert_int_eq((int)arg_of(e, "last_op")->valuedouble, 3);
            ck_assert_str_eq(arg_of(e, "first_label")->valuestring, want_first[n_slices]);
            ck_assert_str_eq(arg_of(e, "last_label")->valuestring, want_last[n_slices]);
            n_slices++;
        }
        if (!strcmp(c, "op") && !strcmp(nm, "exp")) {
            ck_assert_int_eq((int)arg_of(e, "op")->valuedouble, 1);
            ck_assert_str_eq(arg_of(e, "region")->valuestring, "head");
            saw_op++;
        }
        const cJSON *r = arg_of(e, "reason");
        if (!strcmp(c, "compile") && cJSON_IsString(r) &&
            !strcmp(r->valuestring, "input 0 (op #1, \"block1.attn\"): dim 0: 8 -> 5"))
            saw_reason = true;
    }
    ck_assert_int_eq(n_cuts, 4);
    ck_assert_str_eq(cuts[0], "trace cut: host_read at op #4, \"eval0\"");
    ck_assert_str_eq(cuts[1], "trace cut: host_read at op #4, \"eval\"");   /* the hit: this step's label */
    ck_assert_str_eq(cuts[2], "trace cut: host_read at op #4, \"eval\"");
    ck_assert_str_eq(cuts[3], "trace cut: mark_step at op #3, \"loss\"");    /* after the last recorded op */
    ck_assert_int_eq(n_slices, 3);
    ck_assert_int_eq(saw_op, 1);
    ck_assert(saw_reason);
    cJSON_Delete(d);
    free(txt);
    remove(path);
    rmdir(dir);
}
END_TEST

/* Values kept live at a marked step only because their handles were alive
 * (a loop that marks steps and never releases its intermediates): the
 * metrics count them, the report's advice names them (op and label or
 * name) and says what to do; a loop that releases them gets no such line. */
START_TEST(live_outs_held_by_handles)
{
    init_df();
    float wd[8 * 4] = { 0 }, xd[4 * 8] = { 0 };
    ctpu_tensor w = ctpu_from_host(wd, CTPU_F32, 2, (int64_t[]){ 8, 4 });
    for (int s = 0; s < 3; s++) {
        ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 2, (int64_t[]){ 4, 8 });
        ck_assert_int_eq(ctpu_label_push("fc1"), CTPU_OK);
        ctpu_tensor m = ctpu_matmul(x, w);
        ctpu_tensor h = ctpu_relu(m);
        ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
        ctpu_tensor o = ctpu_add_scalar(h, 1.0);
        ck_assert_int_eq(ctpu_set_name(o, "logits"), CTPU_OK);
        ctpu_tensor l = ctpu_sum(o, 0, NULL, false);
        ck_assert_int_eq(ctpu_mark_step(), CTPU_OK);      /* m, h and o are alive: each a live-out */
        ctpu_tensor all[5] = { x, m, h, o, l };
        for (int i = 0; i < 5; i++) ctpu_release(all[i]);
    }
    char *json = ctpu_metrics_json();
    cJSON *d = cJSON_Parse(json);
    ck_assert_int_eq((int)jnum(d, "live_outs_held.values"), 3);
    cJSON_Delete(d);
    char *text = render(json, NULL, CTPU_REPORT_TEXT);
    ck_assert_msg(t_contains(text, "\n  3 values were live at the cut because their handles were alive: matmul (fc1), "
                                   "relu (fc1), add_scalar (logits); release them before ctpu_mark_step to let them "
                                   "fuse\n"), "%s", text);
    free(text);
    free(json);
    /* released before the mark: nothing held */
    ctpu_shutdown();
    init_df();
    w = ctpu_from_host(wd, CTPU_F32, 2, (int64_t[]){ 8, 4 });
    for (int s = 0; s < 3; s++) {
        ctpu_scope_begin();
        ctpu_tensor l = ctpu_keep(ctpu_sum(ctpu_add_scalar(ctpu_relu(ctpu_matmul(ctpu_from_host(xd, CTPU_F32, 2,
                                                                     (int64_t[]){ 4, 8 }), w)), 1.0), 0, NULL, false));
        ctpu_scope_end();
        ck_assert_int_eq(ctpu_mark_step(), CTPU_OK);
        ctpu_release(l);
    }
    json = ctpu_metrics_json();
    text = render(json, NULL, CTPU_REPORT_TEXT);
    ck_assert_msg(!t_contains(text, "live at the cut"), "%s", text);
    free(text);
    free(json);
    ctpu_release(w);
}
END_TEST

/* An accumulator made between steps folds into the first step's program:
 * the recompile log and the report say so, with the tensor's name. */
START_TEST(structure_change_explained)
{
    init_df();
    float xd[8] = { 1, -2, 3, -4, 5, -6, 7, -8 };
    ctpu_tensor acc = ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 8 });
    ck_assert_int_eq(ctpu_set_name(acc, "acc"), CTPU_OK);
    for (int s = 0; s < 4; s++) {
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 1, (int64_t[]){ 8 });
        ck_assert_int_eq(ctpu_assign(acc, ctpu_add(acc, ctpu_relu(x))), CTPU_OK);
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    }
    char log[1024];
    ck_assert_int_eq(ctpu_cache_recompile_log(log, sizeof log), 1);
    ck_assert_str_eq(log, "step 1: program 1 -> 2: input 1 (acc) was computed by full in step 0, now a device buffer\n");
    ctpu_cache_info ci;
    ck_assert_int_eq(ctpu_cache_get_info(&ci), CTPU_OK);
    ck_assert_uint_eq(ci.recompiles, 0);                 /* logged, not counted as a recompile */
    char *json = ctpu_metrics_json();
    char *text = render(json, NULL, CTPU_REPORT_TEXT);
    ck_assert_msg(t_contains(text, "\n  the first step compiled a different program: acc (full, made before the step) "
                                   "was folded into it; ctpu_sync() after making it (before the loop) gives every step "
                                   "one program\n"), "%s", text);
    ck_assert(t_contains(text, "a new structure, not a recompile"));
    free(text);
    free(json);
    float v[8];
    ck_assert_int_eq(ctpu_to_host(acc, v, sizeof v), CTPU_OK);
    ck_assert(v[0] == 4 && v[1] == 0 && v[6] == 28);
    ctpu_release(acc);
    ctpu_shutdown();
    /* made and synced before the loop: one program, nothing logged */
    init_df();
    acc = ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 8 });
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    for (int s = 0; s < 4; s++) {
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor x = ctpu_from_host(xd, CTPU_F32, 1, (int64_t[]){ 8 });
        ck_assert_int_eq(ctpu_assign(acc, ctpu_add(acc, ctpu_relu(x))), CTPU_OK);
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    }
    ck_assert_int_eq(ctpu_cache_recompile_log(log, sizeof log), 0);
    ck_assert_int_eq(ctpu_cache_get_info(&ci), CTPU_OK);
    ck_assert_uint_eq(ci.compiles, 2);                   /* the sync's own program (full), then the step's */
    ctpu_release(acc);
    ctpu_shutdown();
}
END_TEST

/* ---------------------------------------------------------------- bad input */
START_TEST(bad_input)
{
    t_clear_env();
    /* before init */
    ck_assert_ptr_null(ctpu_metrics_json());
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_cache_report(NULL), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_set_host_read_label("x"), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_metrics_write("/tmp/x"), CTPU_ERR_NOT_INITIALIZED);
    ctpu_cost_table t;
    ck_assert_int_eq(ctpu_cost_table_get(&t), CTPU_ERR_NOT_INITIALIZED);
    ctpu_metrics_clear();
    /* renderers (no init needed) */
    ck_assert_int_eq(ctpu_report_render(NULL, NULL, CTPU_REPORT_TEXT, stdout), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_report_render("{}", NULL, CTPU_REPORT_FORMAT_COUNT, stdout), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_report_render("{}", NULL, CTPU_REPORT_TEXT, NULL), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_report_render("", "e.json", CTPU_REPORT_TEXT, stdout), CTPU_ERR_IO);
    ck_assert(t_contains(ctpu_last_error(), "e.json: empty"));
    ck_assert_int_eq(ctpu_report_render("{\"ctpu_metrics_version\": 1, \"cache\": [", "t", CTPU_REPORT_TEXT, stdout), CTPU_ERR_IO);
    ck_assert(t_contains(ctpu_last_error(), "truncated"));
    ck_assert_int_eq(ctpu_report_render("{\"x\": 1} junk", "j", CTPU_REPORT_TEXT, stdout), CTPU_ERR_IO);
    ck_assert(t_contains(ctpu_last_error(), "not valid JSON"));
    ck_assert_int_eq(ctpu_report_render("{\"ctpu_metrics_version\": 7}", "v", CTPU_REPORT_TEXT, stdout), CTPU_ERR_IO);
    ck_assert_int_eq(ctpu_report_compare("{}", "a", NULL, "b", CTPU_REPORT_TEXT, stdout), CTPU_ERR_IO);
    ck_assert_int_eq(ctpu_report_plot_svg(0, NULL, NULL, stdout), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_cost_table_print(NULL, stdout), CTPU_ERR_INVALID_ARG);
    /* a minimal document with wrong field types renders without crashing */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_int_eq(ctpu_report_render("{\"ctpu_metrics_version\":1,\"cache\":\"x\",\"programs\":{},\"recompiles\":[1,\"a\",{}],"
                                        "\"matmuls\":[{\"m\":\"q\"}],\"cost\":{\"rows\":[{},{\"chip\":5}]},"
                                        "\"history\":{\"step\":[1,2],\"hits\":[\"a\"]}}",
                                        "odd", CTPU_REPORT_TEXT, f),
                     CTPU_OK);
    const char *odd = "{\"ctpu_metrics_version\":1,\"history\":{\"step\":[1,\"x\",3],\"compiles\":[{},2],\"hits\":[5]}}";
    ck_assert_int_eq(ctpu_report_plot_svg(1, &odd, NULL, f), CTPU_OK);
    ck_assert_int_eq(ctpu_report_compare(odd, NULL, odd, NULL, CTPU_REPORT_MARKDOWN, f), CTPU_OK);
    fclose(f);
    free(buf);
    /* after init */
    env_base();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert_int_eq(ctpu_metrics_write(NULL), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_metrics_write("/nonexistent-dir/m.json"), CTPU_ERR_IO);
    ck_assert(t_contains(ctpu_last_error(), "/nonexistent-dir/m.json"));
    ck_assert_int_eq(ctpu_cost_table_get(NULL), CTPU_ERR_INVALID_ARG);
    char longlabel[200];
    memset(longlabel, 'x', sizeof longlabel - 1);
    longlabel[sizeof longlabel - 1] = 0;
    ck_assert_int_eq(ctpu_set_host_read_label(longlabel), CTPU_OK);
    ck_assert_int_eq(ctpu_set_host_read_label("quote \" and \\ and \n"), CTPU_OK);
    float a = 1;
    int64_t n = 1;
    double v;
    ck_assert_int_eq(ctpu_item(ctpu_from_host(&a, CTPU_F32, 1, &n), &v), CTPU_OK);
    char *j = ctpu_metrics_json();
    cJSON *d = cJSON_Parse(j);
    ck_assert_ptr_nonnull(d);
    cJSON_Delete(d);
    free(j);
    ctpu_shutdown();
}
END_TEST

/* The cost model's weight table has an entry for exactly the ops whose cost
 * class counts elements (a new op cannot silently cost nothing). */
START_TEST(cost_weights_complete)
{
    for (int op = 0; op < CTPU_OP_COUNT; op++) {
        int cc = ctpu_op_cost(op);
        ck_assert_msg(cc >= 0 && cc < CTPU_CC_CLASS_COUNT, "op %s: cost class %d is not a CTPU_CC_*",
                      ctpu_op_name(op), cc);
        bool counted = cc == CTPU_CC_OUT || cc == CTPU_CC_IN;
        double w = ctpu_cost_op_weight(op);
        ck_assert_msg(counted ? w > 0 : w == 0, "op %s: cost class %d but weight %g in costmodel.c's table",
                      ctpu_op_name(op), cc, w);
        ck_assert_msg((cc == CTPU_CC_MXU) == ctpu_op_is(op, CTPU_OPK_MATMUL), "op %s: MXU cost iff matmul",
                      ctpu_op_name(op));
    }
}
END_TEST


/* Data parallel figures (issue 19) in the metrics document, the text report
 * and the comparison, in a world of one rank (the dist suite checks them at
 * 2 and 3): per marked step, the collectives, their bytes and the ICI
 * estimates at 8 and 256 chips equal the model's; no collectives, no
 * section. */
/* A metrics file that cannot take the write says why (a full device:
 * /dev/full fails at the flush; was only "writing /dev/full failed"). */
START_TEST(metrics_write_says_why)
{
    struct stat st;
    if (stat("/dev/full", &st) != 0) return;
    bool own = !ctpu_is_initialized();
    if (own) ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert_int_eq(ctpu_metrics_write("/dev/full"), CTPU_ERR_IO);
    ck_assert_msg(t_contains(ctpu_last_error(), "writing /dev/full failed: No space left on device"), "%s",
                  ctpu_last_error());
    ck_assert_int_eq(ctpu_metrics_write("/nonexistent-dir/m.json"), CTPU_ERR_IO);
    ck_assert_msg(t_contains(ctpu_last_error(), "cannot open /nonexistent-dir/m.json for writing: No such file"), "%s",
                  ctpu_last_error());
    if (own) ctpu_shutdown();
}
END_TEST

START_TEST(dist_section)
{
    init_df();
    cJSON *d0 = metrics_doc();
    ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(d0, "dist"));
    char *plain = ctpu_metrics_json();
    int64_t n = 1000;
    for (int s = 0; s < 4; s++) {
        ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
        ctpu_tensor x = ctpu_full(CTPU_F32, 1, &n, 1.5);
        double v;
        ck_assert_int_eq(ctpu_item(ctpu_sum(ctpu_all_reduce(x, CTPU_DIST_MEAN), 0, NULL, false), &v), CTPU_OK);
        ck_assert(v == 1500);
        ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    }
    cJSON *d = metrics_doc();
    ck_assert_ptr_nonnull(cJSON_GetObjectItemCaseSensitive(d, "dist"));
    ck_assert(jnum(d, "dist.world_size") == 1 && jnum(d, "dist.rank") == 0);
    ck_assert(jnum(d, "dist.collectives") == 4 && jnum(d, "dist.all_reduce") == 4 && jnum(d, "dist.broadcast") == 0);
    ck_assert(jnum(d, "dist.steps") == 4);
    ck_assert(jnum(d, "dist.collectives_per_step") == 1 && jnum(d, "dist.bytes_per_step") == 4000);
    ck_assert(jnum(d, "dist.est_ici_us_per_step") == 0);   /* one chip: no ICI */
    ctpu_ici_estimate e8, e256;
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 0, 8, 4000, CTPU_ICI_TORUS, &e8), CTPU_OK);
    ck_assert_int_eq(ctpu_ici_estimate_collective("v5e", 0, 256, 4000, CTPU_ICI_TORUS, &e256), CTPU_OK);
    ck_assert(fabs(jnum(d, "dist.est_ici_us_per_step_8") - e8.total_s * 1e6) < 1e-9);
    ck_assert(fabs(jnum(d, "dist.est_ici_us_per_step_256") - e256.total_s * 1e6) < 1e-9);
    ck_assert(jnum(d, "dist.est_ici_us_per_step_pod") == jnum(d, "dist.est_ici_us_per_step_256"));   /* v5e: 256 */
    ck_assert(jnum(d, "dist.ici_gbytes_s") == 400 && jnum(d, "dist.torus_dims") == 2);
    ck_assert(jnum(d, "dist.est_compute_us_per_step") > 0 && jnum(d, "dist.comm_wall_s") >= 0);
    cJSON_Delete(d0);
    cJSON_Delete(d);
    char *s = ctpu_metrics_json();
    char *txt = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&txt, &len);
    ck_assert_int_eq(ctpu_report_render(s, "ddp", CTPU_REPORT_TEXT, f), CTPU_OK);
    ck_assert_int_eq(ctpu_report_compare(plain, "plain", s, "ddp", CTPU_REPORT_TEXT, f), CTPU_OK);
    fclose(f);
    ck_assert_msg(strstr(txt, "Data parallel (ESTIMATE on v5e ICI, 400 GB/s per chip, 2D torus") != NULL, "%s", txt);
    ck_assert_msg(strstr(txt, "per step (4 steps): 1.00 collectives, 3.9 KiB;") != NULL, "%s", txt);
    ck_assert_msg(strstr(txt, "communication per step at 8 chips") != NULL, "%s", txt);
    ck_assert_msg(strstr(txt, "collectives / step") != NULL && strstr(txt, "est. ICI time / step") != NULL, "%s", txt);
    free(txt);
    free(s);
    free(plain);
    ctpu_shutdown();
}
END_TEST

/* One training step (a gradient bucket's all_reduce, as ctpu_ddp makes)
 * and, when eval, an evaluation step (a big matmul and an all_reduce of its
 * loss outside any bucket), defer and fuse. */
static void dist_step(bool eval)
{
    int64_t n = 1000, sq[2] = { 96, 96 };
    ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
    ctpu_tensor x = ctpu_full(CTPU_F32, 1, &n, 1.5);
    ck_assert_int_eq(ctpu_dist_set_bucket(0), CTPU_OK);
    ctpu_tensor g = ctpu_all_reduce(ctpu_mul_scalar(x, 2.0), CTPU_DIST_MEAN);
    ck_assert_int_eq(ctpu_dist_set_bucket(-1), CTPU_OK);
    double v;
    ck_assert_int_eq(ctpu_item(ctpu_sum(g, 0, NULL, false), &v), CTPU_OK);
    ck_assert(v == 3000);
    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    if (!eval) return;
    ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
    ctpu_tensor a = ctpu_full(CTPU_F32, 2, sq, 0.5);
    ctpu_tensor l = ctpu_all_reduce(ctpu_sum(ctpu_matmul(a, ctpu_matmul(a, a)), 0, NULL, false), CTPU_DIST_SUM);
    ck_assert_int_eq(ctpu_item(l, &v), CTPU_OK);
    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
}

/* Issue 19: the per-step figures count training steps only (the steps that
 * reduced gradients), so evaluation steps between them change nothing: the
 * estimated compute per step equals the run without evaluation, bit for
 * bit; the totals still count every collective; the report says so. */
START_TEST(dist_per_step_counts_training_steps)
{
    init_df();
    for (int s = 0; s < 4; s++) dist_step(false);
    cJSON *alone = metrics_doc();
    ctpu_dist_stats a;
    ck_assert_int_eq(ctpu_dist_get_stats(&a), CTPU_OK);
    ck_assert(a.train_steps == 4 && a.steps == 4 && a.grad_collectives == 4);
    ctpu_shutdown();
    init_df();
    for (int s = 0; s < 4; s++) dist_step(true);
    cJSON *mixed = metrics_doc();
    ctpu_dist_stats m;
    ck_assert_int_eq(ctpu_dist_get_stats(&m), CTPU_OK);
    ck_assert(m.train_steps == 4 && m.steps == 8 && m.collectives == 8 && m.grad_collectives == 4);
    /* the same per-program estimates, summed per step first: equal up to the order of the additions */
    ck_assert_msg(fabs(m.est_compute_train_s - a.est_compute_s) <= 1e-12 * a.est_compute_s && m.est_compute_s > a.est_compute_s, "train %.9g alone %.9g all %.9g", m.est_compute_train_s, a.est_compute_s, m.est_compute_s);
    const char *keys[] = { "dist.collectives_per_step", "dist.bytes_per_step", "dist.est_ici_us_per_step",
                           "dist.est_ici_us_per_step_8", "dist.est_ici_us_per_step_256", "dist.train_steps" };
    ck_assert(fabs(jnum(mixed, "dist.est_compute_us_per_step") - jnum(alone, "dist.est_compute_us_per_step")) <=
              1e-12 * jnum(alone, "dist.est_compute_us_per_step"));
    for (int k = 0; k < 6; k++)
        ck_assert_msg(jnum(mixed, keys[k]) == jnum(alone, keys[k]), "%s: %g with eval steps, %g without", keys[k],
                      jnum(mixed, keys[k]), jnum(alone, keys[k]));
    ck_assert(jnum(mixed, "dist.collectives_per_step") == 1 && jnum(mixed, "dist.bytes_per_step") == 4000);
    ck_assert(jnum(mixed, "dist.steps") == 8 && jnum(mixed, "dist.collectives") == 8);
    ck_assert_str_eq(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(mixed, "dist"),
                                                      "per_step_basis")->valuestring, "train_steps");
    char *s = ctpu_metrics_json(), *txt = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&txt, &len);
    ck_assert_int_eq(ctpu_report_render(s, "ddp", CTPU_REPORT_TEXT, f), CTPU_OK);
    ck_assert_int_eq(ctpu_dist_report(f), CTPU_OK);
    fclose(f);
    ck_assert_msg(strstr(txt, "per training step (4 of 8 marked steps; gradient buckets only): 1.00 collectives, "
                              "3.9 KiB;") != NULL, "%s", txt);
    ck_assert_msg(strstr(txt, "  per training step (4 of 8 marked steps; gradient buckets only): compute ") != NULL,
                  "%s", txt);
    free(txt);
    free(s);
    cJSON_Delete(alone);
    cJSON_Delete(mixed);
    ctpu_shutdown();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("report");
    TCase *tc = tcase_create("report");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, cost_weights_complete);
    tcase_add_test(tc, report_last_batch_and_warmup_wording);
    tcase_add_test(tc, dist_per_step_counts_training_steps);
    tcase_add_test(tc, counters_scripted_df);
    tcase_add_test(tc, counters_strict_and_history);
    tcase_add_test(tc, golden_report_text);
    tcase_add_test(tc, tool_round_trip);
    tcase_add_test(tc, compiled_step_rows);
    tcase_add_test(tc, compiled_replays_counted);
    tcase_add_test(tc, trace_file);
    tcase_add_test(tc, trace_buffer_drops);
    tcase_add_test(tc, trace_events_setting);
    tcase_add_test(tc, shutdown_summary_and_file);
    tcase_add_test(tc, cost_matmul_hand_computed);
    tcase_add_test(tc, cost_table_strict_matmul);
    tcase_add_test(tc, price_plans);
    tcase_add_test(tc, report_new_user_glitches);
    tcase_add_test(tc, names_and_cache_only_diff);
    tcase_add_test(tc, structure_change_explained);
    tcase_add_test(tc, provenance_in_reasons_cuts_and_slices);
    tcase_add_test(tc, live_outs_held_by_handles);
    tcase_add_test(tc, bad_input);
    tcase_add_test(tc, dist_section);
    tcase_add_test(tc, metrics_write_says_why);
    suite_add_tcase(s, tc);
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
