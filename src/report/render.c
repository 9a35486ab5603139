/* Rendering of ctpu metrics JSON documents (ctpu_metrics_json): the cache
 * report and cost table (text / markdown / summary JSON), two runs side by
 * side, and an SVG plot of compiles and hits over steps. The library's
 * ctpu_cache_report and tools/ctpu-report both print through here, so a
 * live report and a report of the written file are the same text. Every
 * field is read defensively: a missing or mistyped field reads as 0 / "".
 * This sits above eager: it reads documents eager/report.c writes, and uses
 * eager only for its error machinery. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "eager/eager.h"
#include "eager/report.h"

/* ------------------------------------------------------------ reading */
static const cJSON *obj(const cJSON *o, const char *k)
{
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return v;
}
static double num(const cJSON *o, const char *k)
{
    const cJSON *v = obj(o, k);
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) ? v->valuedouble : 0;
}
static double val(const cJSON *v) { return cJSON_IsNumber(v) && isfinite(v->valuedouble) ? v->valuedouble : 0; }
static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = obj(o, k);
    return cJSON_IsString(v) && v->valuestring ? v->valuestring : "";
}
static bool boolean(const cJSON *o, const char *k) { return cJSON_IsTrue(obj(o, k)); }
static int arr_n(const cJSON *a) { return cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0; }

static ctpu_status parse_doc(const char *json, const char *name, cJSON **out)
{
    *out = NULL;
    const char *nm = name ? name : "metrics";
    if (!json) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "report: %s: json is NULL", nm);
        return CTPU_ERR_INVALID_ARG;
    }
    const char *end = NULL;
    cJSON *d = cJSON_ParseWithOpts(json, &end, true);
    if (!d) {
        size_t len = strlen(json);
        size_t at = end && end >= json ? (size_t)(end - json) : 0;
        /* a metrics document is one object: a text that does not end with its
         * closing brace was cut short (cJSON's error position points at the
         * start of the cut string or number, not at the end) */
        size_t last = len;
        while (last > 0 && (json[last - 1] == ' ' || json[last - 1] == '\n' || json[last - 1] == '\r' ||
                            json[last - 1] == '\t'))
            last--;
        cJSON *head = cJSON_ParseWithOpts(json, NULL, false);   /* a whole value then junk? */
        bool cut = !head && (at >= len || (last > 0 && json[0] == '{' && json[last - 1] != '}'));
        cJSON_Delete(head);
        if (len == 0) ctpu_set_error(CTPU_ERR_IO, "report: %s: empty file (expected a ctpu metrics JSON document)", nm);
        else if (cut) ctpu_set_error(CTPU_ERR_IO, "report: %s: truncated JSON (ends after %zu bytes)", nm, len);
        else ctpu_set_error(CTPU_ERR_IO, "report: %s: not valid JSON (error near byte %zu of %zu)", nm, at, len);
        return CTPU_ERR_IO;
    }
    if (!cJSON_IsObject(d) || !cJSON_IsNumber(obj(d, "ctpu_metrics_version"))) {
        cJSON_Delete(d);
        ctpu_set_error(CTPU_ERR_IO, "report: %s: JSON but not a ctpu metrics document (no ctpu_metrics_version)", nm);
        return CTPU_ERR_IO;
    }
    if (num(d, "ctpu_metrics_version") != 1) {
        double v = num(d, "ctpu_metrics_version");
        cJSON_Delete(d);
        ctpu_set_error(CTPU_ERR_IO, "report: %s: ctpu_metrics_version %g is not supported (this reader knows 1)", nm, v);
        return CTPU_ERR_IO;
    }
    *out = d;
    return CTPU_OK;
}

/* ------------------------------------------------------------ output helpers */
typedef struct {
    FILE *f;
    bool md;
} out_t;

static void heading(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void heading(out_t *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (o->md) fputs("\n### ", o->f);
    vfprintf(o->f, fmt, ap);
    fputs(o->md ? "\n\n" : ":\n", o->f);
    va_end(ap);
}

static void line(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line(out_t *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs(o->md ? "- " : "  ", o->f);
    vfprintf(o->f, fmt, ap);
    fputc('\n', o->f);
    va_end(ap);
}

/* A small table: text (aligned columns) or markdown. */
#define TBL_COLS 12
#define TBL_ROWS 80
typedef struct {
    int nc, nr;
    char cell[TBL_ROWS + 1][TBL_COLS][96];
    bool right[TBL_COLS];
} table;

static table *tbl_new(int nc, const char *const *hdr)
{
    table *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->nc = nc;
    for (int c = 0; c < nc; c++) snprintf(t->cell[0][c], sizeof t->cell[0][c], "%s", hdr[c]);
    return t;
}

static void tbl_row(table *t, ...)
{
    if (!t || t->nr >= TBL_ROWS) return;
    t->nr++;
    va_list ap;
    va_start(ap, t);
    for (int c = 0; c < t->nc; c++) snprintf(t->cell[t->nr][c], sizeof t->cell[0][c], "%s", va_arg(ap, const char *));
    va_end(ap);
}

/* display width: UTF-8 continuation bytes take no column */
static int width(const char *s)
{
    int w = 0;
    for (; *s; s++) w += ((unsigned char)*s & 0xC0) != 0x80;
    return w;
}

static void tbl_print(out_t *o, table *t)
{
    if (!t) return;
    if (o->md) {
        for (int r = 0; r <= t->nr; r++) {
            fputs("|", o->f);
            for (int c = 0; c < t->nc; c++) fprintf(o->f, " %s |", t->cell[r][c]);
            fputc('\n', o->f);
            if (r == 0) {
                fputs("|", o->f);
                for (int c = 0; c < t->nc; c++) fputs(t->right[c] ? "---:|" : "---|", o->f);
                fputc('\n', o->f);
            }
        }
        fputc('\n', o->f);
    } else {
        int w[TBL_COLS] = {0};
        for (int r = 0; r <= t->nr; r++)
            for (int c = 0; c < t->nc; c++) if (width(t->cell[r][c]) > w[c]) w[c] = width(t->cell[r][c]);
        for (int r = 0; r <= t->nr; r++) {
            fputs("  ", o->f);
            for (int c = 0; c < t->nc; c++) {
                int pad = w[c] - width(t->cell[r][c]);
                bool last = c == t->nc - 1;
                if (t->right[c] && r > 0) fprintf(o->f, "%*s%s", pad, "", t->cell[r][c]);
                else fprintf(o->f, "%s%*s", t->cell[r][c], last ? 0 : pad, "");
                if (!last) fputs("  ", o->f);
            }
            fputc('\n', o->f);
        }
    }
    free(t);
}

static const char *fmt_time(double s, char *b, size_t n)
{
    double a = fabs(s);
    if (a == 0) snprintf(b, n, "0");
    else if (a < 1e-6) snprintf(b, n, "%.1f ns", s * 1e9);
    else if (a < 1e-3) snprintf(b, n, "%.2f us", s * 1e6);
    else if (a < 1) snprintf(b, n, "%.2f ms", s * 1e3);
    else if (a < 3600) snprintf(b, n, "%.2f s", s);
    else snprintf(b, n, "%.2f h", s / 3600);
    return b;
}

static const char *fmt_usd(double usd, bool known, char *b, size_t n)
{
    if (!known) snprintf(b, n, "n/a");
    else if (usd == 0) snprintf(b, n, "$0");
    else if (usd < 0.01) snprintf(b, n, "$%.2g", usd);
    else snprintf(b, n, "$%.2f", usd);
    return b;
}

static const char *fmt_bytes(double v, char *b, size_t n)
{
    if (v >= 1 << 30) snprintf(b, n, "%.2f GiB", v / (1 << 30));
    else if (v >= 1 << 20) snprintf(b, n, "%.2f MiB", v / (1 << 20));
    else if (v >= 1 << 10) snprintf(b, n, "%.1f KiB", v / (1 << 10));
    else snprintf(b, n, "%.0f B", v);
    return b;
}

/* a as a percentage of b, for "%.1f%%": never 100.0% while a < b (1 miss
 * in 60,000 requests is 99.9%, not 100.0%) */
static double pct(double a, double b)
{
    if (!(b > 0)) return 0;
    double r = 100.0 * a / b;
    if (a < b && r > 99.9) r = 99.9;
    return r;
}

/* ------------------------------------------------------------ advice */
typedef struct {
    char text[8][240];
    int n;
} advice_t;

static void advise(advice_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void advise(advice_t *a, const char *fmt, ...)
{
    if (a->n == 8) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->text[a->n++], sizeof a->text[0], fmt, ap);
    va_end(ap);
}

/* A recompile reason's input, dim and extents: "input 0 dim 0: 8 -> 5",
 * "input 0 (batch.x, op #1, \"blk\"): dim 0: 8 -> 5" (the name and the op
 * reading it, in parentheses, may hold anything: the last " dim " counts). */
static bool parse_reason(const char *reason, int *in, int *dim, long long *from, long long *to)
{
    if (sscanf(reason, "input %d", in) != 1) return false;
    const char *d = NULL;
    for (const char *p = strstr(reason, " dim "); p; p = strstr(p + 1, " dim ")) d = p;
    return d && sscanf(d, " dim %d: %lld -> %lld", dim, from, to) == 3;
}

/* Values a marked step kept live only because their handles were alive
 * (the metrics' live_outs_held): "12 values were live at the cut because
 * their handles were alive: relu (fc1), ...; release them before
 * ctpu_mark_step to let them fuse". */
static void advise_held(const cJSON *d, advice_t *a)
{
    const cJSON *h = obj(d, "live_outs_held");
    double n = num(h, "values");
    if (n < 1) return;
    const cJSON *ex = obj(h, "examples");
    char list[160];
    size_t k = 0;
    list[0] = 0;
    for (int i = 0; i < arr_n(ex) && k < sizeof list; i++) {
        const cJSON *e = cJSON_GetArrayItem(ex, i);
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", cJSON_IsString(e) ? e->valuestring : "?");
    }
    if (n > arr_n(ex) && k < sizeof list) snprintf(list + k, sizeof list - k, ", \u2026");
    bool one = n < 2;
    advise(a, "%.0f value%s live at the cut because %s handle%s alive: %s; release %s before ctpu_mark_step to let "
              "%s fuse", n, one ? " was" : "s were", one ? "its" : "their", one ? " was" : "s were", list,
           one ? "it" : "them", one ? "it" : "them");
}

/* Whether recompile record r is the one automatic dynamic turned into a
 * dynamic program (shape_policies.auto_dynamic: same old and new program). */
static bool made_dim_dynamic(const cJSON *d, const cJSON *r)
{
    const cJSON *ad = obj(obj(d, "shape_policies"), "auto_dynamic");
    for (int i = 0; i < arr_n(ad); i++) {
        const cJSON *e = cJSON_GetArrayItem(ad, i);
        if (boolean(e, "dynamic") && num(e, "program") == num(r, "program") &&
            num(e, "old_program") == num(r, "old_program"))
            return true;
    }
    return false;
}

/* Program id's launches in the document's programs table, -1 if not listed. */
static double program_launches(const cJSON *d, double id)
{
    const cJSON *ps = obj(d, "programs");
    for (int i = 0; i < arr_n(ps); i++)
        if (num(cJSON_GetArrayItem(ps, i), "id") == id) return num(cJSON_GetArrayItem(ps, i), "launches");
    return -1;
}

/* A smaller dim-0 extent reads as a partial last batch only when its
 * program (the recompile's) launched few times beside the larger extent's
 * (the old program's): at most a quarter as often. */
static bool looks_like_last_batch(const cJSON *d, const cJSON *r)
{
    double small = program_launches(d, num(r, "program")), big = program_launches(d, num(r, "old_program"));
    return small >= 0 && big > 0 && small * 4 <= big;
}

/* The compiled steps' advice: a graph break, or the recompile limit (used up
 * by the step itself, or mostly by other steps of its structure). */
static void advise_compiled(const cJSON *d, advice_t *a)
{
    const cJSON *steps_c = obj(d, "compiled_steps");
    for (int i = 0; i < arr_n(steps_c); i++) {
        const cJSON *st = cJSON_GetArrayItem(steps_c, i), *ev = obj(st, "events");
        const char *brk = NULL, *gf = NULL;
        bool shared = false;   /* the structure's limit went mostly to other steps or traces */
        for (int j = 0; j < arr_n(ev); j++) {
            const cJSON *e = cJSON_GetArrayItem(ev, j);
            shared |= strcmp(str(e, "kind"), "recompile limit") == 0 && strstr(str(e, "reason"), "by other compiled");
            if (strcmp(str(e, "kind"), "graph break") == 0) brk = str(e, "reason");
            if (strcmp(str(e, "kind"), "guard failure") == 0) gf = str(e, "reason");
        }
        if (num(st, "graph_breaks") > 0)
            advise(a, "compiled step %s: %s%s; its calls run fn as defer and fuse: move that out of fn (fullgraph "
                      "makes it an error)", str(st, "name"), brk ? brk : "a graph break", brk ? "" : " (not listed)");
        if (shared)
            advise(a, "compiled step %s: its program structure passed the recompile limit after only %.0f guard "
                      "failure%s of its own: other compiled steps or traces of the same structure compiled the rest "
                      "of its shapes (the cache is per structure, as torch.compile's per code object); its calls at "
                      "new shapes run fn in the current mode: mark the dim dynamic (ctpu_mark_dynamic) in the first "
                      "step that compiles the structure, or keep the shapes fixed",
                   str(st, "name"), num(st, "guard_failures"), num(st, "guard_failures") == 1 ? "" : "s");
        else if (num(st, "guard_failures") > 0 && strstr(str(st, "state"), "recompile limit"))
            advise(a, "compiled step %s: %.0f guard failures used up the recompile limit (the last: %s); its calls "
                      "at shapes not captured run fn in the current mode: keep its inputs' shapes fixed, or mark the "
                      "varying dim dynamic (ctpu_mark_dynamic, TORCH_TPU_AUTO_DYNAMIC=1)", str(st, "name"),
                   num(st, "guard_failures"), gf ? gf : "?");
    }
}

static void build_advice(const cJSON *d, advice_t *a)
{
    memset(a, 0, sizeof *a);
    const cJSON *c = obj(d, "cache"), *cuts = obj(d, "cuts"), *cs = obj(d, "counters");
    double steps = num(c, "steps");
    double marked = num(cs, "marked_steps");
    /* recompiles grouped by "input I dim D" */
    const cJSON *rs = obj(d, "recompiles");
    char seen[8][64];
    int nseen = 0;
    for (int i = 0; i < arr_n(rs); i++) {
        const char *reason = str(cJSON_GetArrayItem(rs, i), "reason");
        int in, dim;
        long long from, to;
        if (!parse_reason(reason, &in, &dim, &from, &to)) continue;
        char key[64];
        snprintf(key, sizeof key, "%d/%d", in, dim);
        bool dup = false;
        for (int j = 0; j < nseen; j++) dup |= strcmp(seen[j], key) == 0;
        if (dup || nseen == 8) continue;
        snprintf(seen[nseen++], sizeof seen[0], "%s", key);
        int count = 0, made_dynamic = 0;
        const cJSON *first = cJSON_GetArrayItem(rs, i);
        for (int j = 0; j < arr_n(rs); j++) {
            int i2, d2;
            long long f2, t2;
            const cJSON *r = cJSON_GetArrayItem(rs, j);
            if (parse_reason(str(r, "reason"), &i2, &d2, &f2, &t2) && i2 == in && d2 == dim) {
                count++;
                made_dynamic += made_dim_dynamic(d, r);
            }
        }
        if (made_dynamic == count)
            advise(a, "%d recompile%s from dim %d of input %d (%lld -> %lld) made the dim dynamic (automatic dynamic): "
                      "later extents reuse the dynamic program; ctpu_mark_dynamic before the first step avoids %s too",
                   count, count == 1 ? "" : "s", dim, in, from, to, count == 1 ? "this one" : "these");
        else if (dim == 0 && to < from && !looks_like_last_batch(d, first))
            advise(a, "%d recompile%s from dim 0 of input %d (%lld -> %lld): the batch size varies between steps "
                      "(the smaller extent's program launched about as often as the larger one's, so not only a "
                      "last batch); pad the batch to a few fixed sizes, or ctpu_mark_dynamic dim 0",
                   count, count == 1 ? "" : "s", in, from, to);
        else if (dim == 0 && to < from)
            advise(a, "%d recompile%s per run from dim 0 of input %d (%lld -> %lld, a smaller last batch): "
                      "dropping the last partial batch (drop_last) or padding it to the full size avoids it",
                   count, count == 1 ? "" : "s", in, from, to);
        else
            advise(a, "%d recompile%s from dim %d of input %d (%lld -> %lld): a shape that varies between steps; "
                      "pad it to a few fixed sizes",
                   count, count == 1 ? "" : "s", dim, in, from, to);
    }
    double host_cuts = num(cuts, "host_read");
    if (host_cuts > 0 && marked > 0) {
        const cJSON *hr = obj(d, "host_reads");
        const char *worst = "";
        double wc = 0;
        for (int i = 0; i < arr_n(hr); i++) {
            const cJSON *h = cJSON_GetArrayItem(hr, i);
            if (num(h, "cuts") > wc) { wc = num(h, "cuts"); worst = str(h, "label"); }
        }
        if (host_cuts >= marked * 0.9)
            advise(a, "a host read every step%s%s%s cuts the trace in two (%.0f host-read cuts in %.0f steps): "
                      "each step runs as two programs; read after ctpu_step_end, or every N steps",
                   worst[0] ? " (" : "", worst, worst[0] ? ")" : "", host_cuts, marked);
        else
            advise(a, "%.0f host reads cut a trace mid-step%s%s%s: read values after ctpu_step_end / ctpu_mark_step",
                   host_cuts, worst[0] ? " (most at " : "", worst, worst[0] ? ")" : "");
    }
    double thrash = num(c, "thrash"), ev = num(c, "evictions");
    if (thrash > 0)
        advise(a, "%.0f programs were compiled again after their eviction (thrash): the working set exceeds the "
                  "cache's %.0f entries; raise TORCH_TPU_CACHE_SIZE",
               thrash, num(c, "capacity"));
    else if (ev > 0)
        advise(a, "%.0f programs were evicted (LRU, capacity %.0f) but none was needed again", ev, num(c, "capacity"));
    double loop = num(cuts, "loop_detector");
    if (loop > 0 && marked == 0)
        advise(a, "no step is marked: the loop detector cut %.0f times; ctpu_step_begin/ctpu_step_end (or "
                  "ctpu_mark_step) gives one program per step", loop);
    double limit = num(cuts, "length_limit");
    if (limit > 0)
        advise(a, "%.0f traces hit the length limit: mark steps more often", limit);
    double late = num(c, "late_compile_steps");
    if (steps > 0 && boolean(c, "all_hit_reached") && late > steps * 0.25)
        advise(a, "%.0f of %.0f steps compiled after warm-up: shapes or control flow vary per step", late, steps);
    /* a value made between steps (an accumulator from ctpu_zeros or
     * ctpu_full) folds into the first step's program */
    const cJSON *rcs = obj(d, "recompiles");
    for (int i = 0; i < arr_n(rcs); i++) {
        const cJSON *r = cJSON_GetArrayItem(rcs, i);
        if (!boolean(r, "structure") || num(r, "step") > 1) continue;
        const char *tn = str(r, "tensor");
        char what[96];
        if (tn[0]) snprintf(what, sizeof what, "%s", tn);
        else snprintf(what, sizeof what, "a value");
        advise(a, "the first step compiled a different program: %s (%s, made before the step) was folded into it; "
                  "ctpu_sync() after making it (before the loop) gives every step one program", what, str(r, "made_by"));
        break;
    }
    advise_compiled(d, a);
    advise_held(d, a);
    if (strcmp(str(d, "mode"), "defer_fuse") != 0 && num(c, "strict_requests") > 0)
        advise(a, "strict eager launches one program per op (%.0f launches); TORCH_TPU_DEFER_AND_FUSE=1 fuses each step",
               num(c, "strict_requests"));
}

/* ------------------------------------------------------------ the report */
static void render_cost(out_t *o, const cJSON *d)
{
    const cJSON *cost = obj(d, "cost");
    const cJSON *rows = obj(cost, "rows");
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32];
    heading(o, "TPU cost estimate (roofline estimate, not a measurement; %.0f steps, %.0f per epoch)",
            num(cost, "steps"), num(cost, "steps_per_epoch"));
    static const char *const hdr[] = { "chip", "MXU", "$/chip-h", "per step", "per epoch", "run", "MFU",
                                       "MXU util", "$/epoch", "$/run" };
    table *t = tbl_new(10, hdr);
    if (t) for (int c = 1; c < 10; c++) t->right[c] = true;
    bool unknown = false;
    for (int i = 0; i < arr_n(rows); i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        bool known = boolean(r, "price_known");
        unknown |= !known;
        char chip[48], mxu[16], price[32], mfu[16], util[16];
        snprintf(chip, sizeof chip, "%s%s", str(r, "chip"), strcmp(str(r, "chip"), str(cost, "current")) == 0 ? " *" : "");
        snprintf(mxu, sizeof mxu, "%.0fx%.0f", num(r, "mxu_size"), num(r, "mxu_size"));
        if (known) snprintf(price, sizeof price, "%.2f", num(r, "usd_per_chip_hour"));
        else snprintf(price, sizeof price, "n/a");
        snprintf(mfu, sizeof mfu, "%.1f%%", 100 * num(r, "mfu"));
        snprintf(util, sizeof util, "%.1f%%", 100 * num(r, "mxu_utilization"));
        tbl_row(t, chip, mxu, price, fmt_time(num(r, "step_s"), b1, sizeof b1), fmt_time(num(r, "epoch_s"), b2, sizeof b2),
                fmt_time(num(r, "run_s"), b3, sizeof b3), mfu, util, fmt_usd(num(r, "usd_epoch"), known, b4, sizeof b4),
                fmt_usd(num(r, "usd_run"), known, b5, sizeof b5));
    }
    tbl_print(o, t);
    line(o, "* = the emulated chip; model FLOPs %.3g, HBM traffic %s (%s at %s's bandwidth), vector ops %.3g",
         num(cost, "model_flops"), fmt_bytes(num(cost, "hbm_bytes"), b6, sizeof b6),
         fmt_time(num(cost, "hbm_s"), b7, sizeof b7), str(cost, "current"), num(cost, "vector_ops"));
    line(o, "estimate = max(MXU time with M, N, K padded to the MXU side, vector time, HBM traffic time) per program");
    /* which price: the plan and, per chip, the region it is quoted for */
    char regions[256];
    size_t k = 0;
    regions[0] = 0;
    for (int i = 0; i < arr_n(rows) && k < sizeof regions; i++) {
        const cJSON *r = cJSON_GetArrayItem(rows, i);
        if (*str(r, "price_region"))
            k += (size_t)snprintf(regions + k, sizeof regions - k, "%s%s %s", k ? ", " : "", str(r, "chip"),
                                  str(r, "price_region"));
    }
    const char *plan = *str(cost, "price_plan") ? str(cost, "price_plan") : "on_demand";
    line(o, "$ = %s list price per chip-hour (Cloud TPU pricing, checked 2026-10-25; TORCH_TPU_PRICE_PLAN: "
            "on_demand, flex_start, 1y, 3y)%s%s", plan, k ? " in " : "", regions);
    if (unknown) line(o, "a chip without a published %s price says n/a in its cost columns", plan);
}

/* The title, the two caches, compile totals and warm-up. */
/* Where the warm-up line's later compiles are explained: the recompiles
 * list when it names a step (0-based, from warmup_steps on) for each of
 * them; else the rest compiled a new program structure (not a recompile,
 * not listed there: the programs table has every program). */
static const char *late_pointer(const cJSON *d, double warm, double late, char *b, size_t n)
{
    const cJSON *rs = obj(d, "recompiles");
    double steps[64];
    int k = 0;
    for (int i = 0; i < arr_n(rs) && k < 64; i++) {
        double st = num(cJSON_GetArrayItem(rs, i), "step");
        bool dup = st < warm;
        for (int j = 0; j < k && !dup; j++) dup = steps[j] == st;
        if (!dup) steps[k++] = st;
    }
    if (k >= late) return " (see recompiles)";
    bool fb = num(obj(d, "cache"), "recompile_limit_fallbacks") > 0;
    const char *what = fb ? "a new program structure (not a recompile) or one-op programs past the recompile limit"
                          : "a new program structure, not a recompile";
    if (k == 0) snprintf(b, n, " (%s: see programs)", what);
    else snprintf(b, n, " (%d in recompiles; the other%s compiled %s: see programs)", k, late - k == 1 ? "" : "s", what);
    return b;
}

static void render_overview(out_t *o, const cJSON *d, const char *name)
{
    char late[192];
    const cJSON *c = obj(d, "cache"), *cs = obj(d, "counters");
    char b1[32];
    if (o->md) fprintf(o->f, "## ctpu cache report%s%s\n\n", name ? ": " : "", name ? name : "");
    else fprintf(o->f, "ctpu cache report%s%s\n", name ? ": " : "", name ? name : "");
    line(o, "mode %s, chip %s (MXU %.0fx%.0f), %.0f steps, %.0f ops dispatched", str(d, "mode"), str(d, "chip"),
         num(d, "mxu_size"), num(d, "mxu_size"), num(c, "steps"), num(cs, "ops_dispatched"));
    double req = num(c, "requests"), hits = num(c, "hits");
    line(o, "fused-program cache: %.0f requests, %.0f hits (%.1f%%), %.0f misses, %.0f recompiles, %.0f evictions, "
            "%.0f thrash, %.0f of %.0f entries used",
         req, hits, pct(hits, req), num(c, "misses"), num(c, "recompiles"), num(c, "evictions"), num(c, "thrash"),
         num(c, "entries"), num(c, "capacity"));
    double sreq = num(c, "strict_requests"), shit = num(c, "strict_hits");
    if (sreq > 0)
        line(o, "one-op program table (strict/debug eager): %.0f requests, %.0f hits (%.1f%%), %.0f misses, "
                "%.0f evictions, %.0f of %.0f entries used",
             sreq, shit, pct(shit, sreq), num(c, "strict_misses"), num(c, "strict_cache_evictions"),
             num(c, "strict_cache_entries"), num(c, "strict_cache_capacity"));
    double fb = num(c, "recompile_limit_fallbacks");
    if (fb > 0)
        line(o, "recompile limit: %.0f trace%s of a structure past TORCH_TPU_RECOMPILE_LIMIT=%.0f ran op by op in "
                "strict eager (pad the varying dim to a few sizes, drop_last for a partial batch, or raise the limit)",
             fb, fb == 1 ? "" : "s", num(c, "recompile_limit"));
    double coll = num(c, "collisions");
    if (coll > 0)
        line(o, "hash collisions: %.0f (a key's hash matched a cached program of another key; the full-key compare "
                "told them apart, so no lookup returned a wrong program)", coll);
    line(o, "overall: %.0f requests, %.0f hits (%.1f%%), %.0f programs compiled in %s", req + sreq, hits + shit,
         pct(hits + shit, req + sreq), num(c, "compiles"), fmt_time(num(c, "compile_ns") / 1e9, b1, sizeof b1));
    if (num(c, "steps") > 0) {
        if (boolean(c, "all_hit_reached"))
            line(o, "warm-up: %.0f step%s before the cache went all-hit; %.0f later step%s compiled%s", num(c, "warmup_steps"),
                 num(c, "warmup_steps") == 1 ? "" : "s", num(c, "late_compile_steps"),
                 num(c, "late_compile_steps") == 1 ? "" : "s",
                 num(c, "late_compile_steps") <= 0 ? ""
                 : arr_n(obj(d, "recompiles")) > 0 ? late_pointer(d, num(c, "warmup_steps"), num(c, "late_compile_steps"),
                                                                  late, sizeof late)
                 : strcmp(str(d, "mode"), "defer_fuse") != 0 ? " (one-op programs for an op or shape first seen then)"
                 : " (new programs, listed below)");
        else line(o, "warm-up: the cache never went all-hit (%.0f of %.0f steps compiled)", num(c, "compile_steps"),
                  num(c, "steps"));
    }
}

static void render_programs(out_t *o, const cJSON *d)
{
    char b1[32], b2[32];
    const cJSON *ps = obj(d, "programs");
    if (arr_n(ps) > 0) {
        heading(o, "programs (%d)", arr_n(ps));
        static const char *const hdr[] = { "id", "launches", "hits", "hit%", "ops", "kernels", "compile", "est/launch",
                                           "first ops", "inputs" };
        table *t = tbl_new(10, hdr);
        if (t) for (int k = 1; k < 8; k++) t->right[k] = true;
        for (int i = 0; i < arr_n(ps) && i < TBL_ROWS; i++) {
            const cJSON *p = cJSON_GetArrayItem(ps, i);
            char id[24], la[24], hi[24], hp[16], ops[16], ke[16];
            snprintf(id, sizeof id, "%.0f%s", num(p, "id"), boolean(p, "cached") ? "" : " (evicted)");
            snprintf(la, sizeof la, "%.0f", num(p, "launches"));
            snprintf(hi, sizeof hi, "%.0f", num(p, "hits"));
            snprintf(hp, sizeof hp, "%.1f%%", pct(num(p, "hits"), num(p, "launches")));
            snprintf(ops, sizeof ops, "%.0f", num(p, "n_ops"));
            snprintf(ke, sizeof ke, "%.0f", num(p, "kernels"));
            tbl_row(t, id, la, hi, hp, ops, ke, fmt_time(num(p, "compile_ns") / 1e9, b1, sizeof b1),
                    fmt_time(num(p, "est_s"), b2, sizeof b2), str(p, "ops"), str(p, "inputs"));
        }
        tbl_print(o, t);
    }
}

/* Compiled steps (ctpu_compile): one row each, then their last guard
 * failures, graph breaks and fallbacks with reasons. */
static void render_compiled(out_t *o, const cJSON *d)
{
    const cJSON *cs = obj(d, "compiled_steps");
    if (arr_n(cs) == 0) return;
    heading(o, "compiled steps (%d)", arr_n(cs));
    static const char *const hdr[] = { "step", "calls", "captures", "replays", "guard failures", "graph breaks",
                                       "eager calls", "host/call", "host/replay", "state" };
    table *t = tbl_new(10, hdr);
    if (t) for (int k = 1; k < 9; k++) t->right[k] = true;
    for (int i = 0; i < arr_n(cs) && i < TBL_ROWS; i++) {
        const cJSON *c = cJSON_GetArrayItem(cs, i);
        char nm[96], n[6][24], hc[24], hr[24];
        snprintf(nm, sizeof nm, "%.70s%s%s", str(c, "name"), boolean(c, "fullgraph") ? " (fullgraph)" : "",
                 boolean(c, "freed") ? " (freed)" : "");
        static const char *const k[6] = { "calls", "captures", "replays", "guard_failures", "graph_breaks", "eager_calls" };
        for (int j = 0; j < 6; j++) snprintf(n[j], sizeof n[j], "%.0f", num(c, k[j]));
        snprintf(hc, sizeof hc, "%.2f us", num(c, "host_us_per_call"));
        if (num(c, "replays") > 0) snprintf(hr, sizeof hr, "%.2f us", num(c, "host_us_per_replay"));
        else snprintf(hr, sizeof hr, "-");
        tbl_row(t, nm, n[0], n[1], n[2], n[3], n[4], n[5], hc, hr, str(c, "state"));
    }
    tbl_print(o, t);
    for (int i = 0; i < arr_n(cs); i++) {
        const cJSON *c = cJSON_GetArrayItem(cs, i), *ev = obj(c, "events");
        if (arr_n(ev) == 0) continue;
        double total = num(c, "events_total");
        if (total > arr_n(ev)) line(o, "%s: the last %d of %.0f events", str(c, "name"), arr_n(ev), total);
        for (int j = 0; j < arr_n(ev); j++) {
            const cJSON *e = cJSON_GetArrayItem(ev, j);
            line(o, "%s: call %.0f: %s: %s", str(c, "name"), num(e, "call"), str(e, "kind"), str(e, "reason"));
        }
    }
}

/* Recompiles, trace cuts, host reads, evictions, and the advice. */
static void render_cache_events(out_t *o, const cJSON *d)
{
    const cJSON *c = obj(d, "cache"), *cs = obj(d, "counters"), *cuts = obj(d, "cuts");
    const cJSON *rs = obj(d, "recompiles");
    if (arr_n(rs) > 0) {
        int nstruct = 0;
        for (int i = 0; i < arr_n(rs); i++) nstruct += boolean(cJSON_GetArrayItem(rs, i), "structure");
        if (nstruct)
            heading(o, "recompiles and structure changes (%.0f recompiles; the last %d entries listed, %d of them "
                       "structure changes between consecutive cuts)", num(c, "recompiles"), arr_n(rs), nstruct);
        else heading(o, "recompiles (%.0f; the last %d listed)", num(c, "recompiles"), arr_n(rs));
        for (int i = 0; i < arr_n(rs); i++) {
            const cJSON *r = cJSON_GetArrayItem(rs, i);
            line(o, "program %.0f (%s): %s, step %.0f (was program %.0f%s)", num(r, "program"),
                 str(r, "ops")[0] ? str(r, "ops") : "?", str(r, "reason"), num(r, "step"), num(r, "old_program"),
                 boolean(r, "structure") ? ": a new structure, not a recompile" : "");
        }
    }

    const cJSON *srs = obj(d, "strict_recompiles");
    if (arr_n(srs) > 0) {
        heading(o, "strict recompiles (%.0f; the last %d listed: a one-op program compiled again for a new shape of "
                   "a signature first compiled in an earlier step)", num(c, "strict_recompiles"), arr_n(srs));
        for (int i = 0; i < arr_n(srs); i++) {
            const cJSON *r = cJSON_GetArrayItem(srs, i);
            line(o, "step %.0f: %s (signature first compiled at step %.0f)", num(r, "step"), str(r, "op"),
                 num(r, "first_step"));
        }
    }

    double ncut = num(cs, "trace_cuts");
    if (ncut > 0) {
        heading(o, "trace cuts (%.0f)", ncut);
        char buf[256];
        size_t k = 0;
        buf[0] = 0;
        for (const cJSON *x = cuts ? cuts->child : NULL; x && k < sizeof buf; x = x->next)
            if (cJSON_IsNumber(x) && x->valuedouble > 0)
                k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%s %.0f", k ? ", " : "", x->string, x->valuedouble);
        line(o, "%s", buf);
    }
    const cJSON *hr = obj(d, "host_reads");
    if (arr_n(hr) > 0) {
        heading(o, "host reads by call site (ctpu_set_host_read_label)");
        for (int i = 0; i < arr_n(hr); i++) {
            const cJSON *h = cJSON_GetArrayItem(hr, i);
            line(o, "%s: %.0f reads, %.0f trace cuts", str(h, "label"), num(h, "reads"), num(h, "cuts"));
        }
    }
    heading(o, "evictions and thrash");
    line(o, "%.0f evictions, %.0f thrash (a program compiled again after its eviction); capacity %.0f",
         num(c, "evictions"), num(c, "thrash"), num(c, "capacity"));

    advice_t a;
    build_advice(d, &a);
    if (a.n > 0) {
        heading(o, "advice");
        for (int i = 0; i < a.n; i++) line(o, "%s", a.text[i]);
    }
}

/* The 12 most launched matmul shapes. */
static void render_matmuls(out_t *o, const cJSON *d)
{
    const cJSON *mm = obj(d, "matmuls");
    if (arr_n(mm) > 0) {
        int n = arr_n(mm), idx[64];
        if (n > 64) n = 64;
        for (int i = 0; i < n; i++) idx[i] = i;
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && num(cJSON_GetArrayItem(mm, idx[j]), "count") > num(cJSON_GetArrayItem(mm, idx[j - 1]), "count"); j--) {
                int tmp = idx[j]; idx[j] = idx[j - 1]; idx[j - 1] = tmp;
            }
        heading(o, "matmuls on the %.0fx%.0f MXU (%s)", num(d, "mxu_size"), num(d, "mxu_size"), str(d, "chip"));
        for (int i = 0; i < n && i < 12; i++) {
            const cJSON *x = cJSON_GetArrayItem(mm, idx[i]);
            char bt[32] = "";
            if (num(x, "batch") > 1) snprintf(bt, sizeof bt, "%.0f x ", num(x, "batch"));
            char u[24];
            double up = 100 * num(x, "useful");
            snprintf(u, sizeof u, up >= 1 || up == 0 ? "%.1f%%" : "%.2g%%", up);
            line(o, "matmul %s[%.0f,%.0f]x[%.0f,%.0f] on %.0fx%.0f MXU: %s of MACs useful (%.0f launch%s)", bt,
                 num(x, "m"), num(x, "k"), num(x, "k"), num(x, "n"), num(d, "mxu_size"), num(d, "mxu_size"), u,
                 num(x, "count"), num(x, "count") == 1 ? "" : "es");
        }
        if (n > 12) line(o, "(%d more shapes)", arr_n(mm) - 12);
    }}

/* The top 10 ops by estimated compute time, and memory. */
static void render_ops_memory(out_t *o, const cJSON *d)
{
    const cJSON *cs = obj(d, "counters");
    char b1[32], b2[32], b3[32];
    const cJSON *ops = obj(d, "ops");
    if (arr_n(ops) > 0) {
        /* top 10 by estimated compute time */
        int n = arr_n(ops), idx[128];
        if (n > 128) n = 128;
        for (int i = 0; i < n; i++) idx[i] = i;
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && num(cJSON_GetArrayItem(ops, idx[j]), "est_s") > num(cJSON_GetArrayItem(ops, idx[j - 1]), "est_s"); j--) {
                int tmp = idx[j]; idx[j] = idx[j - 1]; idx[j - 1] = tmp;
            }
        double tot = 0;
        for (int i = 0; i < n; i++) tot += num(cJSON_GetArrayItem(ops, i), "est_s");
        heading(o, "ops by estimated compute time on %s (MXU or vector work; HBM traffic is per program)", str(d, "chip"));
        static const char *const hdr[] = { "op", "count", "est", "share" };
        table *t = tbl_new(4, hdr);
        if (t) t->right[1] = t->right[2] = t->right[3] = true;
        for (int i = 0; i < n && i < 10; i++) {
            const cJSON *x = cJSON_GetArrayItem(ops, idx[i]);
            char cnt[24], sh[16];
            snprintf(cnt, sizeof cnt, "%.0f", num(x, "count"));
            snprintf(sh, sizeof sh, "%.1f%%", pct(num(x, "est_s"), tot));
            tbl_row(t, str(x, "op"), cnt, fmt_time(num(x, "est_s"), b1, sizeof b1), sh);
        }
        tbl_print(o, t);
    }
    const cJSON *h = obj(d, "hbm");
    heading(o, "memory");
    char b4[32], b5[32];
    line(o, "HBM peak %s, in use at the report %s, capacity %s; host->device %s, device->host %s",
         fmt_bytes(num(h, "peak"), b1, sizeof b1), fmt_bytes(num(h, "in_use"), b2, sizeof b2),
         fmt_bytes(num(h, "capacity"), b3, sizeof b3), fmt_bytes(num(cs, "host_to_device_bytes"), b4, sizeof b4),
         fmt_bytes(num(cs, "device_to_host_bytes"), b5, sizeof b5));
}

/* Shape policies (issue 16): per structure that took several shapes, the
 * histogram of its varying dims' extents and the three policies' estimates. */
static void render_policies(out_t *o, const cJSON *d)
{
    const cJSON *sp = obj(d, "shape_policies"), *ss = obj(sp, "structures");
    const cJSON *ad = obj(sp, "auto_dynamic");
    if (arr_n(ss) == 0 && arr_n(ad) == 0) return;
    char b1[32], b2[32], b3[32], b4[32];
    heading(o, "shape policies (TORCH_TPU_COMPILE_SECONDS=%g s per compile, an assumption; device time is the "
               "roofline estimate at each padded extent; %s prices)", num(sp, "compile_seconds"),
            *str(sp, "price_plan") ? str(sp, "price_plan") : "on_demand");
    for (int i = 0; i < arr_n(ad); i++) {
        const cJSON *a = cJSON_GetArrayItem(ad, i);
        if (boolean(a, "dynamic"))
            line(o, "automatic dynamic: program %.0f (%s): %s became dynamic over [%.0f, %.0f] at step %.0f (recompile "
                    "%.0f -> %.0f, program %.0f -> %.0f)", num(a, "program"), str(a, "ops"), str(a, "dims"), num(a, "lo"),
                 num(a, "hi"), num(a, "step"), num(a, "from"), num(a, "to"), num(a, "old_program"), num(a, "program"));
        else
            line(o, "automatic dynamic: program %.0f (%s): %s changed alone at step %.0f (recompile %.0f -> %.0f, "
                    "program %.0f -> %.0f), not marked dynamic", num(a, "program"), str(a, "ops"), str(a, "dims"),
                 num(a, "step"), num(a, "from"), num(a, "to"), num(a, "old_program"), num(a, "program"));
    }
    for (int i = 0; i < arr_n(ss); i++) {
        const cJSON *s = cJSON_GetArrayItem(ss, i), *dims = obj(s, "dims"), *h = obj(s, "histogram");
        char dn[200];
        size_t k = 0;
        dn[0] = 0;
        for (int j = 0; j < arr_n(dims) && k < sizeof dn; j++)
            k += (size_t)snprintf(dn + k, sizeof dn - k, "%s%s (to %.0f)", j ? ", " : "", str(cJSON_GetArrayItem(dims, j), "name"),
                                  num(cJSON_GetArrayItem(dims, j), "upper_bound"));
        line(o, "program %.0f (%s): %s took %.0f shape%s over %.0f launch%s", num(s, "program"), str(s, "ops"),
             dn[0] ? dn : "its extents", num(s, "shapes"), num(s, "shapes") == 1 ? "" : "s", num(s, "launches"),
             num(s, "launches") == 1 ? "" : "es");
        /* the histogram: "extent (launches)", 12 to a line */
        char hb[640];
        k = 0;
        hb[0] = 0;
        int n_h = arr_n(h);
        for (int j = 0; j < n_h; j++) {
            const cJSON *e = cJSON_GetArrayItem(h, j), *ex = obj(e, "extent");
            k += (size_t)snprintf(hb + k, sizeof hb - k, "%s", j % 12 ? ", " : "");
            if (arr_n(ex) == 0 && k < sizeof hb) k += (size_t)snprintf(hb + k, sizeof hb - k, "one shape");
            for (int q = 0; q < arr_n(ex) && k < sizeof hb; q++)
                k += (size_t)snprintf(hb + k, sizeof hb - k, "%s%.0f", q ? "x" : "", val(cJSON_GetArrayItem(ex, q)));
            if (k < sizeof hb) k += (size_t)snprintf(hb + k, sizeof hb - k, " (%.0f)", num(e, "launches"));
            if (j % 12 == 11 || j == n_h - 1) {
                line(o, "%s%s%s", j < 12 ? "extents (launches): " : "  ", hb, j == n_h - 1 ? "" : ",");
                k = 0;
                hb[0] = 0;
            }
        }
        const cJSON *pol = obj(s, "policies");
        static const char *const hdr[] = { "policy", "compiles", "compile", "device", "total", "FLOPs wasted",
                                           "HBM wasted" };
        int nchips = arr_n(obj(cJSON_GetArrayItem(pol, 0), "chips"));
        if (nchips > 4) nchips = 4;
        const char *h2[12];
        for (int c = 0; c < 7; c++) h2[c] = hdr[c];
        const cJSON *ch0 = obj(cJSON_GetArrayItem(pol, 0), "chips");
        char chn[4][32];
        for (int c = 0; c < nchips; c++) {
            const char *cn = str(cJSON_GetArrayItem(ch0, c), "chip");
            snprintf(chn[c], sizeof chn[c], "$ %s%s", cn, strcmp(cn, str(sp, "chip")) == 0 ? " *" : "");
            h2[7 + c] = chn[c];
        }
        table *t = tbl_new(7 + nchips, h2);
        if (t) for (int c = 1; c < 7 + nchips; c++) t->right[c] = true;
        for (int j = 0; j < arr_n(pol); j++) {
            const cJSON *r = cJSON_GetArrayItem(pol, j), *chips = obj(r, "chips");
            char cm[24], fw[32], cu[4][32];
            snprintf(cm, sizeof cm, "%.0f", num(r, "compiles"));
            snprintf(fw, sizeof fw, "%.3g", num(r, "wasted_flops"));
            for (int c = 0; c < 4; c++) cu[c][0] = 0;
            for (int c = 0; c < nchips; c++) {
                double u = num(cJSON_GetArrayItem(chips, c), "usd");
                if (u >= 0) snprintf(cu[c], sizeof cu[c], "$%.4g", u);
                else snprintf(cu[c], sizeof cu[c], "n/a");
            }
            tbl_row(t, str(r, "policy"), cm, fmt_time(num(r, "compile_s"), b1, sizeof b1),
                    fmt_time(num(r, "device_s"), b2, sizeof b2), fmt_time(num(r, "total_s"), b3, sizeof b3), fw,
                    fmt_bytes(num(r, "wasted_hbm_bytes"), b4, sizeof b4), cu[0], cu[1], cu[2], cu[3]);
        }
        tbl_print(o, t);
        if (*str(s, "note")) line(o, "%s", str(s, "note"));
        line(o, "advice: %s", str(s, "advice"));
    }
    line(o, "* = the emulated chip; compile, device and total on %s; recompile = one program per shape; pad_to_max = every launch padded to "
            "the upper bound (a ctpu_mark_dynamic range's hi, else the largest extent seen); bucket_pow2 = padded to the next power of two (the bound "
            "the last bucket); the chip is paid for while it compiles", str(sp, "chip"));
}

/* Data parallel (issue 19): the metrics document's "dist" section. */
static void render_dist(out_t *o, const cJSON *d)
{
    const cJSON *x = obj(d, "dist");
    if (!x) return;
    char b1[32];
    heading(o, "Data parallel (ESTIMATE on %s ICI, %.0f GB/s per chip, %.0fD torus; formulas in ctpu.h): world size "
            "%.0f, %.0f collectives (%.0f all_reduce, %.0f broadcast, %.0f all_gather, %.0f reduce_scatter), %s per chip",
            str(x, "chip"), num(x, "ici_gbytes_s"), num(x, "torus_dims"), num(x, "world_size"), num(x, "collectives"),
            num(x, "all_reduce"), num(x, "broadcast"), num(x, "all_gather"), num(x, "reduce_scatter"),
            fmt_bytes(num(x, "bytes"), b1, sizeof b1));
    const char *basis = str(x, "per_step_basis");
    char bs[96];
    if (basis && !strcmp(basis, "train_steps"))
        snprintf(bs, sizeof bs, "training step (%.0f of %.0f marked steps; gradient buckets only)",
                 num(x, "train_steps"), num(x, "steps"));
    else
        snprintf(bs, sizeof bs, "step (%.0f steps)", num(x, "steps"));
    line(o, "per %s: %.2f collectives, %s; compute %.2f us, communication %.2f us (%.0f%% of the step "
            "if not overlapped)", bs, num(x, "collectives_per_step"),
         fmt_bytes(num(x, "bytes_per_step"), b1, sizeof b1), num(x, "est_compute_us_per_step"),
         num(x, "est_ici_us_per_step"), 100 * num(x, "est_comm_fraction"));
    line(o, "communication per step at 8 chips %.2f us, 256 chips %.2f us, %.0f chips (pod maximum) %.2f us",
         num(x, "est_ici_us_per_step_8"), num(x, "est_ici_us_per_step_256"), num(x, "pod_chips"),
         num(x, "est_ici_us_per_step_pod"));
    line(o, "measured here (CPU emulation over MPI, waiting for the other ranks included): %s in collectives",
         fmt_time(num(x, "comm_wall_s"), b1, sizeof b1));
    if (num(x, "started_all_reduces") > 0) {
        char b2[32];
        line(o, "measured overlap: %.0f all_reduces started during backward, %s in flight, %s of it exposed (the device "
                "waiting), %.0f%% hidden under compute", num(x, "started_all_reduces"),
             fmt_time(num(x, "comm_in_flight_s"), b1, sizeof b1), fmt_time(num(x, "comm_exposed_s"), b2, sizeof b2),
             100 * num(x, "overlap_share"));
    }
}

static void render_doc(out_t *o, const cJSON *d, const char *name)
{
    render_overview(o, d, name);
    render_programs(o, d);
    render_compiled(o, d);
    render_cache_events(o, d);
    render_matmuls(o, d);
    render_ops_memory(o, d);
    render_cost(o, d);
    render_policies(o, d);
    render_dist(o, d);
}

static cJSON *summary_json(const cJSON *d, const char *name)
{
    cJSON *s = cJSON_CreateObject();
    if (name) cJSON_AddStringToObject(s, "name", name);
    cJSON_AddStringToObject(s, "mode", str(d, "mode"));
    cJSON_AddStringToObject(s, "chip", str(d, "chip"));
    const cJSON *c = obj(d, "cache");
    double req = num(c, "requests") + num(c, "strict_requests"), hits = num(c, "hits") + num(c, "strict_hits");
    cJSON_AddNumberToObject(s, "hit_rate", req > 0 ? hits / req : 0);
    static const char *const keep[] = { "cache", "recompiles", "strict_recompiles", "cuts", "host_reads", "matmuls",
                                        "cost", "hbm", "shape_policies", "dist", "compiled_steps" };
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) {
        const cJSON *x = obj(d, keep[i]);
        if (x) cJSON_AddItemToObject(s, keep[i], cJSON_Duplicate(x, true));
    }
    advice_t a;
    build_advice(d, &a);
    cJSON *adv = cJSON_AddArrayToObject(s, "advice");
    for (int i = 0; i < a.n; i++) cJSON_AddItemToArray(adv, cJSON_CreateString(a.text[i]));
    return s;
}

static ctpu_status print_json(cJSON *s, FILE *f)
{
    char *txt = s ? cJSON_Print(s) : NULL;
    cJSON_Delete(s);
    if (!txt) {
        ctpu_set_error(CTPU_ERR_OOM, "report: out of host memory");
        return CTPU_ERR_OOM;
    }
    fprintf(f, "%s\n", txt);
    cJSON_free(txt);
    return CTPU_OK;
}

static bool bad_args(ctpu_report_format fmt, FILE *f, const char *fn)
{
    if ((unsigned)fmt >= CTPU_REPORT_FORMAT_COUNT || !f) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: %s", fn, !f ? "f is NULL" : "format is not a ctpu_report_format");
        return true;
    }
    return false;
}

ctpu_status ctpu_report_render(const char *json, const char *name, ctpu_report_format fmt, FILE *f)
{
    if (bad_args(fmt, f, "report_render")) return CTPU_ERR_INVALID_ARG;
    cJSON *d;
    ctpu_status st = parse_doc(json, name, &d);
    if (st != CTPU_OK) return st;
    if (fmt == CTPU_REPORT_JSON) {
        st = print_json(summary_json(d, name), f);
    } else {
        out_t o = { f, fmt == CTPU_REPORT_MARKDOWN };
        render_doc(&o, d, name);
    }
    cJSON_Delete(d);
    return st;
}

/* ------------------------------------------------------------ compare */
static const char *const policy_row_names[3] = { "recompile", "pad_to_max", "bucket_pow2" };

/* ROW for the helpers below: one row, a value per run (D is run i's document) */
#define CMP_ROW(t, d, label, ...) do { \
        char v_[2][96]; \
        for (int i_ = 0; i_ < 2; i_++) { const cJSON *D = (d)[i_]; (void)D; snprintf(v_[i_], sizeof v_[i_], __VA_ARGS__); } \
        tbl_row(t, label, v_[0], v_[1]); } while (0)

/* Data parallel rows (issue 19), when either run has a "dist" section. */
static void compare_dist_rows(table *t, const cJSON *const d[2])
{
    if (!obj(d[0], "dist") && !obj(d[1], "dist")) return;
    char tb[32];
    CMP_ROW(t, d, "world size", "%.0f", obj(D, "dist") ? num(obj(D, "dist"), "world_size") : 1.0);
    CMP_ROW(t, d, "collectives / step", "%.2f", num(obj(D, "dist"), "collectives_per_step"));
    CMP_ROW(t, d, "collective bytes / step", "%s", fmt_bytes(num(obj(D, "dist"), "bytes_per_step"), tb, sizeof tb));
    CMP_ROW(t, d, "est. ICI time / step", "%s",
            fmt_time(num(obj(D, "dist"), "est_ici_us_per_step") * 1e-6, tb, sizeof tb));
    CMP_ROW(t, d, "est. communication share", "%.0f%%", 100 * num(obj(D, "dist"), "est_comm_fraction"));
    CMP_ROW(t, d, "time in collectives (measured)", "%s", fmt_time(num(obj(D, "dist"), "comm_wall_s"), tb, sizeof tb));
    CMP_ROW(t, d, "training steps", "%.0f", num(obj(D, "dist"), "train_steps"));
    CMP_ROW(t, d, "comm hidden under compute (measured)", "%.0f%%", 100 * num(obj(D, "dist"), "overlap_share"));
}

/* Shape policies (issue 16): each policy summed over the structures, on
 * each run's chip, then the cheapest per run. */
static void compare_policy_rows(table *t, const cJSON *const d[2])
{
    double pol_usd[2][3] = { { 0 } };
    int pol_any = 0;
    char v[2][96];
    for (int p = 0; p < 3; p++) {
        char label[64];
        snprintf(label, sizeof label, "shape policy %s: compiles / $", policy_row_names[p]);
        int any = 0;
        for (int i = 0; i < 2; i++) {
            const cJSON *ss = obj(obj(d[i], "shape_policies"), "structures");
            double comp = 0, usd = 0;
            int have = 0;
            for (int j = 0; j < arr_n(ss); j++) {
                const cJSON *pol = obj(cJSON_GetArrayItem(ss, j), "policies");
                for (int q = 0; q < arr_n(pol); q++) {
                    const cJSON *r = cJSON_GetArrayItem(pol, q);
                    if (strcmp(str(r, "policy"), policy_row_names[p]) != 0) continue;
                    comp += num(r, "compiles");
                    usd += num(r, "usd") > 0 ? num(r, "usd") : 0;
                    have++;
                }
            }
            any |= have;
            pol_usd[i][p] = have ? usd : -1;
            if (have) snprintf(v[i], sizeof v[i], "%.0f / $%.4g", comp, usd);
            else snprintf(v[i], sizeof v[i], "-");
        }
        if (any) tbl_row(t, label, v[0], v[1]);
        pol_any |= any;
    }
    if (!pol_any) return;
    for (int i = 0; i < 2; i++) {
        int best = -1;
        for (int p = 0; p < 3; p++)
            if (pol_usd[i][p] >= 0 && (best < 0 || pol_usd[i][p] < pol_usd[i][best])) best = p;
        snprintf(v[i], sizeof v[i], "%s", best >= 0 ? policy_row_names[best] : "-");
    }
    tbl_row(t, "cheapest shape policy (all structures)", v[0], v[1]);
}
#undef CMP_ROW

ctpu_status ctpu_report_compare(const char *json_a, const char *name_a, const char *json_b, const char *name_b,
                                ctpu_report_format fmt, FILE *f)
{
    if (bad_args(fmt, f, "report_compare")) return CTPU_ERR_INVALID_ARG;
    cJSON *a, *b;
    const char *na = name_a ? name_a : "A", *nb = name_b ? name_b : "B";
    ctpu_status st = parse_doc(json_a, na, &a);
    if (st != CTPU_OK) return st;
    st = parse_doc(json_b, nb, &b);
    if (st != CTPU_OK) { cJSON_Delete(a); return st; }
    if (fmt == CTPU_REPORT_JSON) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddItemToObject(s, "a", summary_json(a, na));
        cJSON_AddItemToObject(s, "b", summary_json(b, nb));
        st = print_json(s, f);
        cJSON_Delete(a);
        cJSON_Delete(b);
        return st;
    }
    out_t o = { f, fmt == CTPU_REPORT_MARKDOWN };
    if (o.md) fprintf(f, "## ctpu: %s vs %s\n\n", na, nb);
    else fprintf(f, "ctpu: %s vs %s\n", na, nb);
    static const char *hdr[3];
    hdr[0] = "";
    hdr[1] = na;
    hdr[2] = nb;
    table *t = tbl_new(3, hdr);
    if (t) t->right[1] = t->right[2] = true;
    const cJSON *d[2] = { a, b };
    char v[2][96];
#define ROW(label, ...) do { \
        for (int i = 0; i < 2; i++) { const cJSON *D = d[i]; (void)D; snprintf(v[i], sizeof v[i], __VA_ARGS__); } \
        tbl_row(t, label, v[0], v[1]); } while (0)
    char tb[32];
    ROW("mode", "%s", str(D, "mode"));
    ROW("chip", "%s", str(D, "chip"));
    ROW("steps", "%.0f", num(obj(D, "cache"), "steps"));
    ROW("ops dispatched", "%.0f", num(obj(D, "counters"), "ops_dispatched"));
    ROW("programs launched", "%.0f",
        num(obj(D, "counters"), "programs_launched") + num(obj(D, "cache"), "strict_requests"));
    ROW("programs compiled", "%.0f", num(obj(D, "cache"), "compiles"));
    ROW("cache requests", "%.0f", num(obj(D, "cache"), "requests") + num(obj(D, "cache"), "strict_requests"));
    ROW("cache hits", "%.0f (%.1f%%)", num(obj(D, "cache"), "hits") + num(obj(D, "cache"), "strict_hits"),
        pct(num(obj(D, "cache"), "hits") + num(obj(D, "cache"), "strict_hits"),
            num(obj(D, "cache"), "requests") + num(obj(D, "cache"), "strict_requests")));
    ROW("recompiles", "%.0f", num(obj(D, "cache"), "recompiles"));
    ROW("evictions / thrash", "%.0f / %.0f", num(obj(D, "cache"), "evictions"), num(obj(D, "cache"), "thrash"));
    ROW("one-op table entries / evictions", "%.0f / %.0f", num(obj(D, "cache"), "strict_cache_entries"),
        num(obj(D, "cache"), "strict_cache_evictions"));
    ROW("recompile-limit fallbacks", "%.0f", num(obj(D, "cache"), "recompile_limit_fallbacks"));
    ROW("warm-up steps", "%.0f", num(obj(D, "cache"), "warmup_steps"));
    ROW("trace cuts", "%.0f", num(obj(D, "counters"), "trace_cuts"));
    ROW("host reads", "%.0f", num(obj(D, "counters"), "host_reads"));
    ROW("compile time", "%s", fmt_time(num(obj(obj(D, "timers"), "compile_time"), "total") / 1e9, tb, sizeof tb));
    ROW("execute time (CPU emulation)", "%s",
        fmt_time(num(obj(obj(D, "timers"), "execute_time"), "total") / 1e9, tb, sizeof tb));
    ROW("sync wait", "%s", fmt_time(num(obj(obj(D, "timers"), "sync_wait"), "total") / 1e9, tb, sizeof tb));
    ROW("HBM peak", "%s", fmt_bytes(num(obj(D, "hbm"), "peak"), tb, sizeof tb));
    ROW("est. HBM traffic", "%s", fmt_bytes(num(obj(D, "cost"), "hbm_bytes"), tb, sizeof tb));
    /* the emulated chip's cost row of each run */
    const cJSON *row[2] = { NULL, NULL };
    for (int i = 0; i < 2; i++) {
        const cJSON *rows = obj(obj(d[i], "cost"), "rows");
        for (int j = 0; j < arr_n(rows); j++)
            if (strcmp(str(cJSON_GetArrayItem(rows, j), "chip"), str(obj(d[i], "cost"), "current")) == 0)
                row[i] = cJSON_GetArrayItem(rows, j);
    }
#define CROW(label, ...) do { \
        for (int i = 0; i < 2; i++) { const cJSON *R = row[i]; (void)R; snprintf(v[i], sizeof v[i], __VA_ARGS__); } \
        tbl_row(t, label, v[0], v[1]); } while (0)
    CROW("est. device time / step", "%s", fmt_time(num(R, "step_s"), tb, sizeof tb));
    CROW("est. device time / epoch", "%s", fmt_time(num(R, "epoch_s"), tb, sizeof tb));
    CROW("est. MFU", "%.1f%%", 100 * num(R, "mfu"));
    CROW("est. MXU utilisation", "%.1f%%", 100 * num(R, "mxu_utilization"));
    CROW("est. $ / epoch (this chip)", "%s", fmt_usd(num(R, "usd_epoch"), boolean(R, "price_known"), tb, sizeof tb));
    compare_dist_rows(t, d);
    compare_policy_rows(t, d);
#undef ROW
#undef CROW
    tbl_print(&o, t);
    double sa = row[0] ? num(row[0], "step_s") : 0, sb = row[1] ? num(row[1], "step_s") : 0;
    if (sa > 0 && sb > 0) line(&o, "estimated device time per step: %s / %s = %.2fx", nb, na, sb / sa);
    line(&o, "estimates are roofline estimates on the emulated chip's profile, not measurements");
    cJSON_Delete(a);
    cJSON_Delete(b);
    return CTPU_OK;
}

/* ------------------------------------------------------------ plot */
ctpu_status ctpu_report_plot_svg(int n, const char *const *jsons, const char *const *names, FILE *f)
{
    if (n < 1 || n > 16 || !jsons || !f) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "report_plot_svg: n=%d (1..16), jsons %s, f %s", n, jsons ? "set" : "NULL",
                       f ? "set" : "NULL");
        return CTPU_ERR_INVALID_ARG;
    }
    cJSON *d[16] = { 0 };
    for (int i = 0; i < n; i++) {
        ctpu_status st = parse_doc(jsons[i], names ? names[i] : NULL, &d[i]);
        if (st != CTPU_OK) {
            for (int j = 0; j < i; j++) cJSON_Delete(d[j]);
            return st;
        }
    }
    /* one row of two panels per run (compiles, hits per step), each panel
     * with its own axes: runs of very different sizes (strict eager's
     * thousands of one-op hits per step beside a fused run's one) stay
     * readable */
    static const char *const colors[] = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b" };
    const int PW = 360, PH = 150, L = 60, GAP = 70, ROW = PH + 80, TOP = 30;
    const int W = L + 2 * PW + GAP + 20, H = TOP + n * ROW;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
    const char *titles[2] = { "programs compiled (cumulative)", "cache hits per step" };
    for (int i = 0; i < n; i++) {
        const cJSON *h = obj(d[i], "history");
        const cJSON *st = obj(h, "step");
        int m = arr_n(st);
        /* this run's ranges */
        double xmax = 1, ymax[2] = { 1, 1 };
        for (int p = 0; p < 2; p++) {
            const cJSON *ys = obj(h, p == 0 ? "compiles" : "hits");
            double px = 0, py = 0;
            for (int k = 0; k < m && k < arr_n(ys); k++) {
                double x = val(cJSON_GetArrayItem(st, k)) + 1;
                double y = val(cJSON_GetArrayItem(ys, k));
                double v = p == 1 ? (x - px > 0 ? (y - py) / (x - px) : 0) : y;
                px = x;
                py = y;
                if (x > xmax) xmax = x;
                if (v > ymax[p]) ymax[p] = v;
            }
        }
        char esc[128];
        const char *nm = names && names[i] ? names[i] : str(d[i], "mode");
        size_t k = 0;
        for (const char *c = nm; *c && k + 6 < sizeof esc; c++) {
            if (*c == '<') { memcpy(esc + k, "&lt;", 4); k += 4; }
            else if (*c == '&') { memcpy(esc + k, "&amp;", 5); k += 5; }
            else if (*c == '>') { memcpy(esc + k, "&gt;", 4); k += 4; }
            else if (*c == '"') { memcpy(esc + k, "&quot;", 6); k += 6; }
            else esc[k++] = *c;
        }
        esc[k] = 0;
        int y0 = TOP + i * ROW + 30;
        const char *color = colors[i % 6];
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\" fill=\"%s\">%s (%s, %s)</text>\n", L,
                y0 - 22, color, esc, str(d[i], "mode"), str(d[i], "chip"));
        for (int p = 0; p < 2; p++) {
            int x0 = L + p * (PW + GAP);
            fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", x0, y0 - 6, titles[p]);
            fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", x0, y0,
                    PW, PH);
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.0f</text>\n", x0 - 5, y0 + 10, ymax[p]);
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">0</text>\n", x0 - 5, y0 + PH);
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">step %.0f</text>\n", x0 + PW, y0 + PH + 15, xmax);
            const cJSON *ys = obj(h, p == 0 ? "compiles" : "hits");
            int mm = m < arr_n(ys) ? m : arr_n(ys);
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
            double px = 0, py = 0;
            for (int q = 0; q < mm; q++) {
                double x = val(cJSON_GetArrayItem(st, q)) + 1;
                double y = val(cJSON_GetArrayItem(ys, q));
                double v = p == 1 ? (x - px > 0 ? (y - py) / (x - px) : 0) : y;
                px = x;
                py = y;
                double sx = x0 + (x / xmax) * PW, sy = y0 + PH - (v / ymax[p]) * PH;
                fprintf(f, "%.1f,%.1f ", sx, sy);
            }
            fprintf(f, "\"/>\n");
        }
    }
    fprintf(f, "</svg>\n");
    for (int i = 0; i < n; i++) cJSON_Delete(d[i]);
    return CTPU_OK;
}

/* ------------------------------------------------------------ the live run */
/* The live run's cache report: its metrics document, rendered as text. */
ctpu_status ctpu_cache_report(FILE *f)
{
    if (!ctpu_check_init("cache_report")) return CTPU_ERR_NOT_INITIALIZED;
    char *s = ctpu_metrics_json();
    if (!s) return ctpu_last_status();
    ctpu_status st = ctpu_report_render(s, NULL, CTPU_REPORT_TEXT, f ? f : stdout);
    free(s);
    return st;   /* with collectives: the document's "dist" section (render_dist) */
}

/* ------------------------------------------------------------ cost table print */
ctpu_status ctpu_cost_table_print(const ctpu_cost_table *t, FILE *f)
{
    if (!t || t->n_rows < 0 || t->n_rows > CTPU_COST_MAX_CHIPS) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "cost_table_print: %s", !t ? "t is NULL" : "n_rows out of range");
        return CTPU_ERR_INVALID_ARG;
    }
    if (!f) f = stdout;
    cJSON *d = cJSON_CreateObject();
    cJSON *cost = cJSON_AddObjectToObject(d, "cost");
    cJSON_AddNumberToObject(cost, "steps", (double)t->steps);
    cJSON_AddNumberToObject(cost, "steps_per_epoch", (double)t->steps_per_epoch);
    cJSON_AddNumberToObject(cost, "model_flops", t->model_flops);
    cJSON_AddNumberToObject(cost, "hbm_bytes", t->hbm_bytes);
    cJSON_AddNumberToObject(cost, "vector_ops", t->vector_ops);
    const char *cur = t->current >= 0 && t->current < t->n_rows && t->rows[t->current].chip ? t->rows[t->current].chip : "";
    cJSON_AddStringToObject(cost, "current", cur);
    cJSON_AddStringToObject(cost, "price_plan", ctpu_price_plan_name(t->plan));
    cJSON *rows = cJSON_AddArrayToObject(cost, "rows");
    for (int i = 0; i < t->n_rows; i++) {
        cJSON_AddItemToArray(rows, ctpu__cost_row_json(&t->rows[i]));
    }
    out_t o = { f, false };
    render_cost(&o, d);
    cJSON_Delete(d);
    return CTPU_OK;
}
