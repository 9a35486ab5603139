/* Reports (DESIGN.md "Observability"): the runtime's report state (programs
 * seen, host reads by label, matmul shapes, per-op and per-run cost
 * estimates), the hooks the dispatch / defer / step paths call, the metrics
 * JSON document, the shutdown summary and files, and the public cost API.
 * Rendering of JSON documents (text, markdown, comparisons, plots, and
 * ctpu_cache_report) is above eager, in src/report/render.c, so the library
 * and tools/ctpu-report print the same. */
#include <math.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <strings.h>

#include <cJSON.h>

#include "eager.h"
#include "report.h"
#include "policy.h"
#include "cost/costmodel.h"
#include "dist/dist.h"
#include "device/tracefile.h"

#define MAX_LABELS 32
#define MAX_MMS 256

typedef ctpu_cost_mm mm_dims;

#define MAX_PROG_RECS 4096

typedef struct {
    bool known;                      /* compiled while the report saw its trace */
    char ops[128];                   /* first ops, "matmul→add→relu→…" */
    char inputs[200];                /* first input types */
    int n_ops, n_kernels, n_inputs;
    uint64_t compile_ns;
    uint64_t launches, hits, first_step, last_step;
    uint64_t replays_unfolded;       /* compiled-step replays not yet in the run totals (fold_replays) */
    uint64_t priced_launches;        /* launches priced at their own extents (a dynamic program's), whose
                                      * matmuls are in the report's table already */
    double est_s[CTPU_COST_MAX_CHIPS];   /* per launch, per chip profile */
    double hbm_bytes, flops, vector_ops;
    double macs_useful[CTPU_COST_MAX_CHIPS], macs_padded[CTPU_COST_MAX_CHIPS];
    mm_dims mm[CTPU_COST_PROGRAM_MMS];
    int n_mm;
    int n_op_s;
    struct prog_op {
        uint16_t op;
        uint32_t nodes;
        float s;                     /* its nodes' compute seconds on the current chip */
    } *op_s;                         /* [n_op_s], one per distinct op */
} prog_rec;

typedef struct {
    char label[64];
    uint64_t reads, cuts;
} label_rec;

typedef struct {
    mm_dims d;
    uint64_t count;
} mm_rec;

#define LEAK_WINDOW 100              /* marked steps the leak watch looks back over */

struct ctpu_report_state {
    pthread_mutex_t mu;
    prog_rec *progs;                 /* index = program id - 1 */
    size_t n_progs;
    label_rec labels[MAX_LABELS];
    int n_labels;
    mm_rec mms[MAX_MMS];             /* strict-mode matmuls and dynamic launches' (other fused ones are per program) */
    int n_mms;
    uint64_t op_count[CTPU_OP_COUNT];
    double op_s[CTPU_OP_COUNT];      /* compute seconds per op on the current chip */
    int n_chips, current;
    const ctpu_chip_info *chips[CTPU_COST_MAX_CHIPS];
    double run_s[CTPU_COST_MAX_CHIPS];
    double step_s, train_s;          /* current chip: this marked step's estimate so far; the training steps' (dist) */
    double macs_useful[CTPU_COST_MAX_CHIPS], macs_padded[CTPU_COST_MAX_CHIPS];
    double flops, hbm_bytes, hbm_s, vector_ops;
    uint64_t loop_cuts;
    int64_t steps_per_epoch;
    bool quiet;
    ctpu_tracebuf *trace;
    /* leak watch: HBM in use and the marking thread's scope depth at the
     * last LEAK_WINDOW + 1 marks */
    uint64_t leak_hbm[LEAK_WINDOW + 1];
    int leak_depth[LEAK_WINDOW + 1];
    uint64_t leak_n;
    bool leak_warned;
    ctpu_policy_state *policy;       /* shapes per structure, the shape-policy estimates (policy.c) */
    struct {                         /* the marked step's cut that kept the most values live by their handles */
        uint64_t count, step;
        int n_ex;
        char ex[CTPU_HELD_EXAMPLES][96];
    } held;
};

static const char *const cut_names[CTPU_CUT_COUNT] = {
    "mark_step", "host_read", "sync", "loop_detector", "length_limit", "mode_switch", "collective",
};

/* ------------------------------------------------------------ lifecycle */
ctpu_status ctpu__report_init(ctpu_runtime *rt, char *err, size_t len)
{
    ctpu_report_state *r = calloc(1, sizeof *r);
    if (!r) { snprintf(err, len, "ctpu_init: out of host memory"); return CTPU_ERR_OOM; }
    pthread_mutex_init(&r->mu, NULL);
    r->quiet = rt->quiet;
    int n;
    const ctpu_chip_info *p = ctpu_chip_profiles(&n);
    if (n > CTPU_COST_MAX_CHIPS) n = CTPU_COST_MAX_CHIPS;
    r->n_chips = n;
    for (int i = 0; i < n; i++) {
        r->chips[i] = &p[i];
        if (rt->chip && strcmp(p[i].name, rt->chip->name) == 0) r->current = i;
    }
    if (rt->trace_file) {
        r->trace = ctpu_tracebuf_create(rt->trace_events);
        if (!r->trace) {
            snprintf(err, len, "ctpu_init: out of host memory for the trace buffer (TORCH_TPU_TRACE_FILE)");
            pthread_mutex_destroy(&r->mu);
            free(r);
            return CTPU_ERR_OOM;
        }
    }
    r->policy = ctpu__policy_create(r->chips, r->n_chips, r->current, rt->auto_dynamic);
    if (!r->policy) {
        snprintf(err, len, "ctpu_init: out of host memory");
        ctpu_tracebuf_destroy(r->trace);
        pthread_mutex_destroy(&r->mu);
        free(r);
        return CTPU_ERR_OOM;
    }
    rt->metrics.trace = r->trace;
    rt->report = r;
    return CTPU_OK;
}

static void prog_free(prog_rec *p) { free(p->op_s); }

void ctpu__report_free(ctpu_runtime *rt)
{
    ctpu_report_state *r = rt ? rt->report : NULL;
    if (!r) return;
    for (size_t i = 0; i < r->n_progs; i++) prog_free(&r->progs[i]);
    free(r->progs);
    ctpu__policy_free(r->policy);
    rt->metrics.trace = NULL;
    ctpu_tracebuf_destroy(r->trace);
    pthread_mutex_destroy(&r->mu);
    free(r);
    rt->report = NULL;
}

static void totals_clear(ctpu_report_state *r)
{
    for (size_t i = 0; i < r->n_progs; i++) {
        r->progs[i].launches = 0;
        r->progs[i].hits = 0;
        r->progs[i].replays_unfolded = 0;
        r->progs[i].priced_launches = 0;
    }
    for (int i = 0; i < r->n_labels; i++) r->labels[i].reads = r->labels[i].cuts = 0;
    r->n_mms = 0;
    memset(r->op_count, 0, sizeof r->op_count);
    memset(r->op_s, 0, sizeof r->op_s);
    memset(r->run_s, 0, sizeof r->run_s);
    r->step_s = r->train_s = 0;
    memset(r->macs_useful, 0, sizeof r->macs_useful);
    memset(r->macs_padded, 0, sizeof r->macs_padded);
    r->flops = r->hbm_bytes = r->hbm_s = r->vector_ops = 0;
    r->loop_cuts = 0;
    ctpu__policy_clear(r->policy);
}

/* ------------------------------------------------------------ helpers */
/* This thread's host-read label (a part of its state, eager.h). */
static const char *label_now(void)
{
    const ctpu_thread_state *ts = ctpu_ts_current();
    return ts ? ts->label.host_read : "";
}

static label_rec *label_get(ctpu_report_state *r, const char *label)
{
    const char *l = label[0] ? label : "(unlabelled)";
    for (int i = 0; i < r->n_labels; i++)
        if (strcmp(r->labels[i].label, l) == 0) return &r->labels[i];
    if (r->n_labels == MAX_LABELS) l = "(other labels)";
    for (int i = 0; i < r->n_labels; i++)
        if (strcmp(r->labels[i].label, l) == 0) return &r->labels[i];
    int i = r->n_labels < MAX_LABELS ? r->n_labels++ : MAX_LABELS - 1;
    snprintf(r->labels[i].label, sizeof r->labels[i].label, "%s", l);
    r->labels[i].reads = r->labels[i].cuts = 0;
    return &r->labels[i];
}

static void mm_add(ctpu_report_state *r, mm_dims d, uint64_t n)
{
    for (int i = 0; i < r->n_mms; i++)
        if (memcmp(&r->mms[i].d, &d, sizeof d) == 0) { r->mms[i].count += n; return; }
    if (r->n_mms == MAX_MMS) return;
    r->mms[r->n_mms].d = d;
    r->mms[r->n_mms++].count = n;
}

static void fmt_types(const ctpu_vtype *types, int n, char *out, size_t len)
{
    size_t k = 0;
    out[0] = 0;
    char tb[128];
    for (int i = 0; i < n && k < len; i++) {
        if (i == 4) { snprintf(out + k, len - k, ", … (%d inputs)", n); return; }
        k += (size_t)snprintf(out + k, len - k, "%s%s", i ? ", " : "", ctpu_fmt_type(&types[i], tb, sizeof tb));
    }
}

/* A program seen compiled: what it runs, and the compiler's estimate of one
 * launch (per chip; per op on the current chip). */
static void describe_program(ctpu_report_state *r, prog_rec *p, const ctpu_trace *t, const ctpu_program *prog)
{
    const ctpu_cost_program *cp = &prog->cost;
    p->known = true;
    p->n_ops = t->n_nodes;
    p->n_inputs = t->n_inputs;
    p->n_kernels = prog->prog.n_steps;
    p->compile_ns = prog->compile_ns;
    size_t k = 0;
    p->ops[0] = 0;
    for (int i = 0; i < t->n_nodes && k < sizeof p->ops; i++) {
        if (i == 4) { snprintf(p->ops + k, sizeof p->ops - k, "→…"); break; }
        k += (size_t)snprintf(p->ops + k, sizeof p->ops - k, "%s%s", i ? "→" : "", ctpu_op_name(t->nodes[i].op));
    }
    fmt_types(t->in_type, t->n_inputs, p->inputs, sizeof p->inputs);
    p->op_s = cp->n_ops ? calloc((size_t)cp->n_ops, sizeof *p->op_s) : NULL;
    p->n_op_s = p->op_s ? cp->n_ops : 0;
    for (int i = 0; i < p->n_op_s; i++)
        p->op_s[i] = (struct prog_op){ cp->ops[i].op, cp->ops[i].nodes, cp->ops[i].s_f[r->current] };
    for (int c = 0; c < r->n_chips && c < cp->n_chips; c++) {
        p->est_s[c] = cp->chip[c].total_s;
        p->macs_useful[c] = cp->chip[c].macs_useful;
        p->macs_padded[c] = cp->chip[c].macs_padded;
    }
    p->n_mm = cp->n_mm;
    memcpy(p->mm, cp->mm, sizeof p->mm);
    p->hbm_bytes = cp->chip[r->current].hbm_bytes;
    p->flops = cp->chip[r->current].flops;
    p->vector_ops = cp->chip[r->current].vector_ops;
}

/* n launches of p into the run totals; step: into this marked step's too. */
static void launch_add_n(ctpu_report_state *r, const prog_rec *p, uint64_t n, bool step)
{
    double f = (double)n;
    for (int c = 0; c < r->n_chips; c++) {
        r->run_s[c] += f * p->est_s[c];
        if (step && c == r->current) r->step_s += f * p->est_s[c];
        r->macs_useful[c] += f * p->macs_useful[c];
        r->macs_padded[c] += f * p->macs_padded[c];
    }
    r->flops += f * p->flops;
    r->vector_ops += f * p->vector_ops;
    r->hbm_bytes += f * p->hbm_bytes;
    r->hbm_s += f * p->hbm_bytes / (r->chips[r->current]->hbm_gbps * 1e9);
    for (int i = 0; i < p->n_op_s; i++) {
        r->op_s[p->op_s[i].op] += f * p->op_s[i].s;
        r->op_count[p->op_s[i].op] += n * p->op_s[i].nodes;
    }
}

static void launch_add(ctpu_report_state *r, prog_rec *p) { launch_add_n(r, p, 1, true); }

/* One launch of a dynamic program, priced at the extents it ran at (e, from
 * the shape policies' records) rather than those it was compiled at. */
static void launch_add_est(ctpu_report_state *r, prog_rec *p, const ctpu_policy_est *e)
{
    for (int c = 0; c < r->n_chips; c++) {
        r->run_s[c] += e->est_s[c];
        if (c == r->current) r->step_s += e->est_s[c];
        r->macs_useful[c] += e->macs_useful[c];
        r->macs_padded[c] += e->macs_padded[c];
    }
    r->flops += e->flops;
    r->vector_ops += e->vector_ops;
    r->hbm_bytes += e->hbm_bytes;
    r->hbm_s += e->hbm_bytes / (r->chips[r->current]->hbm_gbps * 1e9);
    for (int i = 0; i < e->n_ops; i++) {
        r->op_s[e->ops[i].op] += e->ops[i].s;
        r->op_count[e->ops[i].op] += e->ops[i].nodes;
    }
    for (int j = 0; j < e->n_mm; j++) mm_add(r, e->mm[j], 1);
    p->priced_launches++;
}

/* The compiled-step replays counted since the last read (their launches,
 * hits and step estimate are already in), into the run totals. Every
 * reader of the totals calls it first. Under r->mu. */
static void fold_replays(ctpu_report_state *r)
{
    for (size_t i = 0; i < r->n_progs; i++) {
        prog_rec *p = &r->progs[i];
        if (!p->replays_unfolded) continue;
        launch_add_n(r, p, p->replays_unfolded, false);
        p->replays_unfolded = 0;
    }
}

/* ------------------------------------------------------------ hooks */
/* The trace file's cut event: "trace cut: host_read at op #5, \"eval\""
 * with the op number and region label in its args (the host-read call-site
 * label too, when set). */
static void cut_event(int why, ctpu_op_prov at, const char *label, uint64_t step, char *name, size_t nlen,
                      char *args, size_t alen)
{
    char pv[112], lab[96], rl[96];
    ctpu__prov_text(at, pv, sizeof pv);
    snprintf(name, nlen, "trace cut: %s%s%s", cut_names[why], pv[0] ? " at " : "", pv);
    int k = snprintf(args, alen, "\"reason\":\"%s\",\"step\":%llu", cut_names[why], (unsigned long long)step);
    if (why == CTPU_CUT_HOST_READ && label[0] && k > 0 && (size_t)k < alen)
        k += snprintf(args + k, alen - (size_t)k, ",\"label\":\"%s\"", ctpu_json_escape(label, lab, sizeof lab));
    if (at.op_no && k > 0 && (size_t)k < alen) k += snprintf(args + k, alen - (size_t)k, ",\"op\":%u", at.op_no);
    const char *l = ctpu__label_text(at.label);
    if (l[0] && k > 0 && (size_t)k < alen)
        snprintf(args + k, alen - (size_t)k, ",\"region\":\"%s\"", ctpu_json_escape(l, rl, sizeof rl));
}

void ctpu__report_cut(int why, ctpu_op_prov at, const ctpu_trace *t, const int64_t *bound, const ctpu_cache_result *res,
                      const ctpu_program *prog)
{
    ctpu_runtime *rt = ctpu_rt;
    ctpu_report_state *r = rt ? rt->report : NULL;
    if (!r || why < 0 || why >= CTPU_CUT_COUNT) return;
    uint64_t now = ctpu_now_ns();
    uint64_t step = atomic_load(&rt->marked_steps);
    const char *label = label_now();
    /* a new program, or a dynamic program's launch (t: its trace at the
     * launch's extents): its structure, hashed outside the lock */
    uint64_t sh = 0;
    if (res && prog && t) {   /* a bound launch keeps its structure's hash */
        sh = prog->bound_trace == t ? atomic_load(&((ctpu_program *)prog)->struct_hash) : 0;
        if (!sh) sh = ctpu_trace_struct_hash(t);
        if (prog->bound_trace == t) atomic_store(&((ctpu_program *)prog)->struct_hash, sh);
    }
    pthread_mutex_lock(&r->mu);
    if (why == CTPU_CUT_HOST_READ) label_get(r, label)->cuts++;
    const ctpu_policy_est *pe = NULL;   /* a dynamic launch's estimate at its own extents */
    if (res && prog && res->hit && !sh) ctpu__policy_hit(r->policy, res->program_id);
    else if (sh) pe = ctpu__policy_launch(r->policy, sh, t, bound, res->program_id, step, !res->hit && res->recompile,
                                          res->hit || ctpu_program_dyn_trace(prog) != NULL);
    prog_rec *p = NULL;
    if (res && prog && res->program_id > 0 && res->program_id <= MAX_PROG_RECS) {
        /* ids are bounded by distinct programs (a thrashed key keeps its id);
         * past MAX_PROG_RECS programs, later ones go unrecorded */
        size_t idx = (size_t)res->program_id - 1;
        if (idx >= r->n_progs) {
            size_t nn = idx + 1 > r->n_progs * 2 ? idx + 1 : r->n_progs * 2;
            prog_rec *np = realloc(r->progs, nn * sizeof *np);
            if (np) {
                memset(np + r->n_progs, 0, (nn - r->n_progs) * sizeof *np);
                r->progs = np;
                r->n_progs = nn;
            }
        }
        if (idx < r->n_progs) {
            p = &r->progs[idx];
            if (!res->hit && t && !p->known) {
                describe_program(r, p, t, prog);
                p->first_step = step;
            }
            if (!p->known && !res->hit) p->first_step = step;
            p->launches++;
            if (res->hit) p->hits++;
            p->last_step = step;
            if (pe) launch_add_est(r, p, pe);
            else launch_add(r, p);
        }
    }
    if (why == CTPU_CUT_LOOP) r->loop_cuts++;
    uint64_t loop_cuts = r->loop_cuts;
    pthread_mutex_unlock(&r->mu);

    if (res && prog && !res->hit) {
        ctpu_timer_add(&rt->metrics, CTPU_TMR_PROGRAM_OPS, t ? (uint64_t)t->n_nodes : 0);
        ctpu_timer_add(&rt->metrics, CTPU_TMR_FUSED_KERNELS, (uint64_t)prog->prog.n_steps);
    }
    /* no marked steps: each loop-detector cut is a step of the history */
    if (why == CTPU_CUT_LOOP && !atomic_load(&rt->user_marks_steps)) ctpu_metrics_step(&rt->metrics, loop_cuts - 1);

    if (r->trace) {
        char args[224], name[160];
        cut_event(why, at, label, step, name, sizeof name, args, sizeof args);
        ctpu_trace_instant(r->trace, CTPU_TRACK_HOST, "cut", name, now, args);
        if (res && prog) {
            char reason[200];
            ctpu_json_escape(res->reason, reason, sizeof reason);
            if (res->hit) {
                snprintf(name, sizeof name, "cache hit: program %llu", (unsigned long long)res->program_id);
                snprintf(args, sizeof args, "\"program\":%llu,\"hit\":true,\"ops\":%d", (unsigned long long)res->program_id,
                         t ? t->n_nodes : 0);
                ctpu_trace_instant(r->trace, CTPU_TRACK_HOST, "cache", name, now, args);
            } else {
                snprintf(name, sizeof name, "compile program %llu%s", (unsigned long long)res->program_id,
                         res->recompile ? " (recompile)" : "");
                char a2[400];
                snprintf(a2, sizeof a2, "\"program\":%llu,\"hit\":false,\"recompile\":%s,\"thrash\":%s,\"ops\":%d,"
                                        "\"kernels\":%d,\"reason\":\"%s\"",
                         (unsigned long long)res->program_id, res->recompile ? "true" : "false",
                         res->thrash ? "true" : "false", t ? t->n_nodes : 0, prog->prog.n_steps,
                         res->recompile ? reason : "new program");
                uint64_t t0 = now > prog->compile_ns ? now - prog->compile_ns : now;
                ctpu_trace_complete(r->trace, CTPU_TRACK_HOST, "compile", name, t0, now, a2);
            }
        }
    }
}

/* A compiled step's replay of a dynamic program bound at a version's
 * extents (run: the bound launch, or the dynamic program itself at the
 * extents it was compiled at): priced and counted in the shape
 * policies' histogram at those extents, as defer and fuse's launches of a
 * dynamic program are (ctpu__report_replay would count it at the extents
 * the program last launched at). */
void ctpu__report_replay_bound(uint64_t program_id, const ctpu_program *run)
{
    ctpu_runtime *rt = ctpu_rt;
    ctpu_report_state *r = rt ? rt->report : NULL;
    if (!r || program_id == 0) return;
    const ctpu_trace *t = !run ? NULL : run->bound_trace ? run->bound_trace : ctpu_program_dyn_trace(run);
    if (!t) { ctpu__report_replay(program_id); return; }
    uint64_t sh = atomic_load(&((ctpu_program *)run)->struct_hash);
    if (!sh) {
        sh = ctpu_trace_struct_hash(t);
        atomic_store(&((ctpu_program *)run)->struct_hash, sh);
    }
    uint64_t step = atomic_load(&rt->marked_steps);
    pthread_mutex_lock(&r->mu);
    const ctpu_policy_est *pe = ctpu__policy_launch(r->policy, sh, t, NULL, program_id, step, false, true);
    if (program_id <= r->n_progs) {
        prog_rec *p = &r->progs[program_id - 1];
        p->launches++;
        p->hits++;
        p->last_step = step;
        if (pe) launch_add_est(r, p, pe);
        else launch_add(r, p);
    }
    pthread_mutex_unlock(&r->mu);
}

void ctpu__report_replay(uint64_t program_id)
{
    ctpu_runtime *rt = ctpu_rt;
    ctpu_report_state *r = rt ? rt->report : NULL;
    if (!r || program_id == 0) return;
    uint64_t step = atomic_load(&rt->marked_steps);
    pthread_mutex_lock(&r->mu);
    ctpu__policy_hit(r->policy, program_id);
    if (program_id <= r->n_progs) {   /* its capture's launch made the record */
        prog_rec *p = &r->progs[program_id - 1];
        p->launches++;
        p->hits++;
        p->last_step = step;
        p->replays_unfolded++;
        r->step_s += p->est_s[r->current];
    }
    pthread_mutex_unlock(&r->mu);
}

void ctpu__report_fallback(const ctpu_trace *t, const int64_t *bound)
{
    ctpu_runtime *rt = ctpu_rt;
    ctpu_report_state *r = rt ? rt->report : NULL;
    if (!r || !t) return;
    uint64_t sh = ctpu_trace_struct_hash(t);
    uint64_t step = atomic_load(&rt->marked_steps);
    pthread_mutex_lock(&r->mu);
    ctpu__policy_launch(r->policy, sh, t, bound, 0, step, true, false);
    pthread_mutex_unlock(&r->mu);
}

int ctpu__report_auto_pairs(const ctpu_trace *t, int *in, int *dim, int *coef, int max)
{
    ctpu_runtime *rt = ctpu_rt;
    ctpu_report_state *r = rt ? rt->report : NULL;
    if (!r || !t) return 0;
    uint64_t sh = ctpu_trace_struct_hash(t);
    pthread_mutex_lock(&r->mu);
    int n = ctpu__policy_auto_pairs(r->policy, sh, in, dim, coef, max);
    pthread_mutex_unlock(&r->mu);
    return n;
}

int ctpu__report_auto_would(const ctpu_trace *t, int *in, int *dim, int *coef, int max)
{
    ctpu_runtime *rt = ctpu_rt;
    ctpu_report_state *r = rt ? rt->report : NULL;
    if (!r || !t) return 0;
    uint64_t sh = ctpu_trace_struct_hash(t);
    uint64_t step = atomic_load(&rt->marked_steps);
    pthread_mutex_lock(&r->mu);
    int n = ctpu__policy_auto_would(r->policy, sh, t, step, in, dim, coef, max);
    pthread_mutex_unlock(&r->mu);
    return n;
}

void ctpu__report_held(uint64_t count, uint64_t step, const char (*ex)[96], int n_ex)
{
    ctpu_runtime *rt = ctpu_rt;
    ctpu_report_state *r = rt ? rt->report : NULL;
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    if (count > r->held.count) {
        r->held.count = count;
        r->held.step = step;
        r->held.n_ex = n_ex;
        memcpy(r->held.ex, ex, sizeof r->held.ex[0] * (size_t)n_ex);
    }
    pthread_mutex_unlock(&r->mu);
}

/* "live_outs_held": the worst marked step's values kept live by their
 * handles (the report's advice). Under r->mu. */
static void held_json(cJSON *doc, const ctpu_report_state *r)
{
    cJSON *o = cJSON_AddObjectToObject(doc, "live_outs_held");
    cJSON_AddNumberToObject(o, "values", (double)r->held.count);
    cJSON_AddNumberToObject(o, "step", (double)r->held.step);
    cJSON *ex = cJSON_AddArrayToObject(o, "examples");
    for (int i = 0; i < r->held.n_ex; i++) cJSON_AddItemToArray(ex, cJSON_CreateString(r->held.ex[i]));
}

/* ,"op":N,"region":"label" after args[0, k) (what fits) */
static void prov_args(ctpu_op_prov p, char *args, size_t len, int k)
{
    char rl[96];
    const char *l = ctpu__label_text(p.label);
    if (p.op_no && k > 0 && (size_t)k < len) k += snprintf(args + k, len - (size_t)k, ",\"op\":%u", p.op_no);
    if (l[0] && k > 0 && (size_t)k + 16 + strlen(l) * 2 < len)
        snprintf(args + k, len - (size_t)k, ",\"region\":\"%s\"", ctpu_json_escape(l, rl, sizeof rl));
}

/* A strict op's estimate depends only on its program (op, attrs, shapes):
 * the compiler made it once; each launch adds it up. */
void ctpu__report_op(const ctpu_node *n, bool hit, const ctpu_program *prog, ctpu_trec *const *in, ctpu_op_prov prov)
{
    ctpu_runtime *rt = ctpu_rt;
    ctpu_report_state *r = rt ? rt->report : NULL;
    if (!r || !n || n->op >= CTPU_OP_COUNT || !prog) return;
    const ctpu_cost_program *cp = &prog->cost;
    const ctpu_cost_estimate *cur = &cp->chip[r->current];
    pthread_mutex_lock(&r->mu);
    for (int c = 0; c < r->n_chips && c < cp->n_chips; c++) {
        r->run_s[c] += cp->chip[c].total_s;
        r->macs_useful[c] += cp->chip[c].macs_useful;
        r->macs_padded[c] += cp->chip[c].macs_padded;
    }
    r->step_s += cur->total_s;
    r->flops += cur->flops;
    r->vector_ops += cur->vector_ops;
    r->hbm_bytes += cur->hbm_bytes;
    r->hbm_s += cur->hbm_s;
    r->op_s[n->op] += cp->n_ops ? cp->ops[0].s[r->current] : 0;
    r->op_count[n->op]++;
    if (cp->n_mm) mm_add(r, cp->mm[0], 1);
    pthread_mutex_unlock(&r->mu);
    if (r->trace) {
        uint64_t now = ctpu_now_ns();
        char args[400], tb[128];
        int k = snprintf(args, sizeof args, "\"hit\":%s,\"out\":\"%s\"", hit ? "true" : "false",
                         ctpu_fmt_type(&n->out, tb, sizeof tb));
        /* the inputs' names (ctpu_set_name), when one has a name */
        bool named = false;
        for (int i = 0; in && i < n->n_in; i++) named |= ctpu_rec_name(in[i])[0] != 0;
        for (int i = 0; named && i < n->n_in && k > 0 && (size_t)k < sizeof args; i++) {
            char esc[136];
            k += snprintf(args + k, sizeof args - (size_t)k, "%s\"%s\"%s", i ? "," : ",\"inputs\":[",
                          ctpu_json_escape(ctpu_rec_name(in[i]), esc, sizeof esc), i == n->n_in - 1 ? "]" : "");
        }
        if (k < 0 || (size_t)k >= sizeof args)   /* (names cut short: the event without them) */
            k = snprintf(args, sizeof args, "\"hit\":%s,\"out\":\"%s\"", hit ? "true" : "false", tb);
        prov_args(prov, args, sizeof args, k);
        if (!hit) {
            char name[96];
            snprintf(name, sizeof name, "compile %s", ctpu_op_name(n->op));
            ctpu_trace_complete(r->trace, CTPU_TRACK_HOST, "compile", name,
                                now > prog->compile_ns ? now - prog->compile_ns : now, now, args);
        }
        ctpu_trace_instant(r->trace, CTPU_TRACK_HOST, "op", ctpu_op_name(n->op), now, args);
    }
}

void ctpu__report_host_read(size_t bytes, const char *tensor)
{
    ctpu_runtime *rt = ctpu_rt;
    ctpu_report_state *r = rt ? rt->report : NULL;
    if (!r) return;
    const char *label = label_now();
    pthread_mutex_lock(&r->mu);
    label_get(r, label)->reads++;
    pthread_mutex_unlock(&r->mu);
    if (r->trace) {
        char args[320], lab[96], tn[160];
        snprintf(args, sizeof args, "\"label\":\"%s\",\"bytes\":%zu%s%s%s", ctpu_json_escape(label, lab, sizeof lab), bytes,
                 tensor && tensor[0] ? ",\"tensor\":\"" : "", tensor && tensor[0] ? ctpu_json_escape(tensor, tn, sizeof tn) : "",
                 tensor && tensor[0] ? "\"" : "");
        ctpu_trace_instant(r->trace, CTPU_TRACK_HOST, "host_read", label[0] ? label : "host read", ctpu_now_ns(), args);
    }
}

/* Leak watch (at each mark): HBM in use (less what queued commands hold
 * only until they run) grew by more than max(16 MiB, 10%) over the last
 * LEAK_WINDOW marked steps, reaching a new high at half of them at least (a
 * one-time allocation is not a leak): one warning for the run, naming the
 * likely cause. */
static void leak_watch(ctpu_runtime *rt, uint64_t step)
{
    ctpu_report_state *r = rt->report;
    ctpu_hbm_stats hs;
    ctpu_hbm_stats_get(rt->dev, &hs);
    uint64_t q = ctpu_hbm_queued_bytes(rt->dev);
    hs.in_use = hs.in_use > q ? hs.in_use - q : 0;
    const ctpu_thread_state *ts = ctpu_ts_current();
    int depth = ts ? ts->scope_depth : 0;
    pthread_mutex_lock(&r->mu);
    uint64_t n = r->leak_n++;
    r->leak_hbm[n % (LEAK_WINDOW + 1)] = hs.in_use;
    r->leak_depth[n % (LEAK_WINDOW + 1)] = depth;
    bool warn = false;
    uint64_t old = 0;
    int old_depth = 0;
    if (!r->leak_warned && n >= LEAK_WINDOW) {
        old = r->leak_hbm[(n - LEAK_WINDOW) % (LEAK_WINDOW + 1)];
        old_depth = r->leak_depth[(n - LEAK_WINDOW) % (LEAK_WINDOW + 1)];
        uint64_t thr = old / 10 > (16u << 20) ? old / 10 : (16u << 20);
        int highs = 0;
        uint64_t hi = old;
        for (uint64_t i = n - LEAK_WINDOW + 1; i <= n; i++) {
            uint64_t v = r->leak_hbm[i % (LEAK_WINDOW + 1)];
            if (v > hi) { highs++; hi = v; }
        }
        warn = hs.in_use > old + thr && highs >= LEAK_WINDOW / 2;
        r->leak_warned = warn;
    }
    pthread_mutex_unlock(&r->mu);
    if (!warn) return;
    char b0[32], b1[32], cause[384];
    if (depth > old_depth) {
        snprintf(cause, sizeof cause, "a missing ctpu_scope_end (this thread's scopes went from %d to %d deep)",
                 old_depth, depth);
    } else {
        uint64_t nh, nb;
        ctpu_holder top[1];
        size_t k = ctpu__live_holders(rt, &nh, &nb, top, 1);
        char hn[128];
        snprintf(cause, sizeof cause, "handles made outside a scope (or kept) and never released: %llu live, the "
                 "most made by %s (%s in %llu handles)", (unsigned long long)nh,
                 k ? ctpu__holder_name(&top[0], hn, sizeof hn) : "?",
                 ctpu__fmt_bytes(k ? top[0].bytes : 0, b0, sizeof b0), k ? (unsigned long long)top[0].handles : 0ull);
    }
    fprintf(stderr, "ctpu: warning: HBM in use grew from %s to %s over the last %d marked steps (to step %llu); "
            "likely cause: %s\n", ctpu__fmt_bytes(old, b0, sizeof b0), ctpu__fmt_bytes(hs.in_use, b1, sizeof b1),
            LEAK_WINDOW, (unsigned long long)step, cause);
}

/* Data parallel: the step that just ended adds its estimate to the
 * training steps' when it reduced gradients (dist_api.c knows). */
static void train_fold(ctpu_report_state *r, uint64_t ended)
{
    bool train = ctpu__dist_is_train_step(ended);
    pthread_mutex_lock(&r->mu);
    if (train) r->train_s += r->step_s;
    r->step_s = 0;
    pthread_mutex_unlock(&r->mu);
}

double ctpu__report_train_compute_s(void)
{
    ctpu_runtime *rt = ctpu_rt;
    if (!rt || !rt->report) return 0;
    bool now = ctpu__dist_is_train_step(atomic_load(&rt->marked_steps));
    pthread_mutex_lock(&rt->report->mu);
    double s = rt->report->train_s + (now ? rt->report->step_s : 0);
    pthread_mutex_unlock(&rt->report->mu);
    return s;
}

void ctpu__report_step(void)
{
    ctpu_runtime *rt = ctpu_rt;
    if (!rt) return;
    uint64_t s = atomic_load(&rt->marked_steps);
    /* the program marks its steps: the loop detector's cuts before the
     * first mark were not steps (the history counts marked steps only) */
    if (s == 1 && rt->report) {
        pthread_mutex_lock(&rt->report->mu);
        uint64_t loop_cuts = rt->report->loop_cuts;
        pthread_mutex_unlock(&rt->report->mu);
        if (loop_cuts) ctpu_metrics_history_reset(&rt->metrics);
    }
    ctpu_metrics_step(&rt->metrics, s ? s - 1 : 0);
    if (rt->report) train_fold(rt->report, s ? s - 1 : 0);
    if (rt->report) leak_watch(rt, s);
    if (rt->report && rt->report->trace) {
        char args[64];
        snprintf(args, sizeof args, "\"step\":%llu", (unsigned long long)(s ? s - 1 : 0));
        ctpu_trace_instant(rt->report->trace, CTPU_TRACK_HOST, "step", "mark_step", ctpu_now_ns(), args);
    }
}

void ctpu__report_sync(uint64_t t0_ns)
{
    ctpu_runtime *rt = ctpu_rt;
    if (rt && rt->report && rt->report->trace)
        ctpu_trace_complete(rt->report->trace, CTPU_TRACK_HOST, "sync", "sync", t0_ns, ctpu_now_ns(), NULL);
}

/* ------------------------------------------------------------ public */
ctpu_status ctpu_set_host_read_label(const char *label)
{
    if (!ctpu_check_init("set_host_read_label")) return CTPU_ERR_NOT_INITIALIZED;
    ctpu_thread_state *ts = ctpu_ts();
    if (!ts) {
        ctpu_set_error(CTPU_ERR_OOM, "set_host_read_label: out of host memory");
        return CTPU_ERR_OOM;
    }
    snprintf(ts->label.host_read, sizeof ts->label.host_read, "%s", label ? label : "");
    return CTPU_OK;
}

ctpu_status ctpu_set_steps_per_epoch(int64_t n)
{
    if (!ctpu_check_init("set_steps_per_epoch")) return CTPU_ERR_NOT_INITIALIZED;
    if (n < 0) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "set_steps_per_epoch: n=%lld is negative", (long long)n);
        return CTPU_ERR_INVALID_ARG;
    }
    pthread_mutex_lock(&ctpu_rt->report->mu);
    ctpu_rt->report->steps_per_epoch = n;
    pthread_mutex_unlock(&ctpu_rt->report->mu);
    return CTPU_OK;
}

ctpu_status ctpu_cost_matmul(const char *chip, int64_t batch, int64_t m, int64_t k, int64_t n, ctpu_dtype dt,
                             ctpu_precision p, ctpu_cost_estimate *out)
{
    const ctpu_chip_info *c = ctpu_chip_lookup(chip);
    if (!c) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "cost_matmul: chip \"%s\" is not a known chip (v5e, v5p, v6e, 7x)",
                       chip ? chip : "(null)");
        return CTPU_ERR_INVALID_ARG;
    }
    if (!out || batch < 0 || m < 0 || k < 0 || n < 0 || (unsigned)dt >= CTPU_DTYPE_COUNT ||
        (unsigned)p >= CTPU_PRECISION_COUNT) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG,
                       "cost_matmul: batch=%lld m=%lld k=%lld n=%lld dtype=%d precision=%d out=%s: extents must be "
                       ">= 0, dtype and precision valid, out not NULL",
                       (long long)batch, (long long)m, (long long)k, (long long)n, (int)dt, (int)p,
                       out ? "set" : "NULL");
        return CTPU_ERR_INVALID_ARG;
    }
    memset(out, 0, sizeof *out);
    int passes = p == CTPU_PRECISION_HIGHEST ? 6 : p == CTPU_PRECISION_HIGH ? 3 : 1;
    ctpu_cost_add_matmul(c, batch, m, k, n, passes, out);
    double es = (double)ctpu_kdt_size(dt);
    out->hbm_bytes = (double)batch * ((double)m * (double)k + (double)k * (double)n + (double)m * (double)n) * es;
    ctpu_cost_finish(c, out);
    return CTPU_OK;
}

static void cost_table_locked(ctpu_runtime *rt, ctpu_cost_table *out)
{
    ctpu_report_state *r = rt->report;
    memset(out, 0, sizeof *out);
    uint64_t steps = atomic_load(&rt->marked_steps);
    if (steps == 0) steps = r->loop_cuts;
    out->steps = steps;
    uint64_t den = steps ? steps : 1;
    out->steps_per_epoch = r->steps_per_epoch > 0 ? (uint64_t)r->steps_per_epoch : den;
    fold_replays(r);
    out->model_flops = r->flops;
    out->hbm_bytes = r->hbm_bytes;
    out->vector_ops = r->vector_ops;
    out->n_rows = r->n_chips;
    out->current = r->current;
    out->plan = rt->price_plan;
    for (int c = 0; c < r->n_chips; c++) {
        const ctpu_chip_info *ci = r->chips[c];
        ctpu_cost_row *w = &out->rows[c];
        w->chip = ci->name;
        w->mxu_size = ci->mxu_size;
        w->usd_per_chip_hour = ci->usd_per_chip_hour[out->plan];
        w->price_known = w->usd_per_chip_hour > 0;
        w->price_region = ci->price_region;
        w->run_s = r->run_s[c];
        w->step_s = r->run_s[c] / (double)den;
        w->epoch_s = w->step_s * (double)out->steps_per_epoch;
        w->mfu = r->run_s[c] > 0 ? r->flops / (r->run_s[c] * ci->peak_bf16_flops) : 0;
        w->mxu_utilization = r->macs_padded[c] > 0 ? r->macs_useful[c] / r->macs_padded[c] : 0;
        w->usd_run = w->price_known ? w->run_s / 3600.0 * w->usd_per_chip_hour : -1;
        w->usd_epoch = w->price_known ? w->epoch_s / 3600.0 * w->usd_per_chip_hour : -1;
    }
}

ctpu_status ctpu_cost_table_get(ctpu_cost_table *out)
{
    if (!ctpu_check_init("cost_table_get")) return CTPU_ERR_NOT_INITIALIZED;
    if (!out) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "cost_table_get: out is NULL");
        return CTPU_ERR_INVALID_ARG;
    }
    pthread_mutex_lock(&ctpu_rt->report->mu);
    cost_table_locked(ctpu_rt, out);
    pthread_mutex_unlock(&ctpu_rt->report->mu);
    return CTPU_OK;
}

/* ------------------------------------------------------------ JSON */
/* One row of the cost table as a JSON object (the metrics document and the
 * json output format share it). */
cJSON *ctpu__cost_row_json(const ctpu_cost_row *w)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "chip", w->chip ? w->chip : "?");
    cJSON_AddNumberToObject(o, "mxu_size", w->mxu_size);
    cJSON_AddBoolToObject(o, "price_known", w->price_known);
    cJSON_AddNumberToObject(o, "usd_per_chip_hour", w->usd_per_chip_hour);
    cJSON_AddStringToObject(o, "price_region", w->price_region ? w->price_region : "");
    cJSON_AddNumberToObject(o, "run_s", w->run_s);
    cJSON_AddNumberToObject(o, "step_s", w->step_s);
    cJSON_AddNumberToObject(o, "epoch_s", w->epoch_s);
    cJSON_AddNumberToObject(o, "mfu", w->mfu);
    cJSON_AddNumberToObject(o, "mxu_utilization", w->mxu_utilization);
    cJSON_AddNumberToObject(o, "usd_run", w->usd_run);
    cJSON_AddNumberToObject(o, "usd_epoch", w->usd_epoch);
    return o;
}

static cJSON *timer_json(ctpu_metrics *m, ctpu_timer_id id)
{
    ctpu_timer t;
    ctpu_timer_get(m, id, &t);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "unit", ctpu_timer_unit(id));
    cJSON_AddNumberToObject(o, "count", (double)t.count);
    cJSON_AddNumberToObject(o, "total", (double)t.total_ns);
    cJSON_AddNumberToObject(o, "min", (double)(t.count ? t.min_ns : 0));
    cJSON_AddNumberToObject(o, "max", (double)t.max_ns);
    cJSON_AddNumberToObject(o, "p50", (double)ctpu_timer_sample_percentile(&t, 50));
    cJSON_AddNumberToObject(o, "p95", (double)ctpu_timer_sample_percentile(&t, 95));
    cJSON_AddNumberToObject(o, "p99", (double)ctpu_timer_sample_percentile(&t, 99));
    return o;
}

static double ctr(ctpu_metrics *m, ctpu_counter_id id) { return (double)ctpu_counter_get(m, id); }
/* hits as a percentage of requests for "%.1f%%": never 100.0% with a miss */
static double hit_pct(double hit, double req)
{
    double r = req > 0 ? 100.0 * hit / req : 0.0;
    return hit < req && r > 99.9 ? 99.9 : r;
}

/* The run: mode, chip, counters, timers, HBM. */
static void header_json(cJSON *doc, ctpu_runtime *rt)
{
    ctpu_metrics *m = &rt->metrics;
    cJSON_AddNumberToObject(doc, "ctpu_metrics_version", 1);
    cJSON_AddStringToObject(doc, "mode", ctpu_mode_name(rt->mode));
    cJSON_AddStringToObject(doc, "chip", rt->chip->name);
    cJSON_AddNumberToObject(doc, "mxu_size", rt->chip->mxu_size);

    cJSON *cs = cJSON_AddObjectToObject(doc, "counters");
    for (int i = 0; i < CTPU_CTR_COUNT; i++) cJSON_AddNumberToObject(cs, ctpu_counter_name((ctpu_counter_id)i), ctr(m, (ctpu_counter_id)i));
    cJSON *ts = cJSON_AddObjectToObject(doc, "timers");
    for (int i = 0; i < CTPU_TMR_COUNT; i++) cJSON_AddItemToObject(ts, ctpu_timer_name((ctpu_timer_id)i), timer_json(m, (ctpu_timer_id)i));

    ctpu_hbm_stats hs;
    ctpu_hbm_stats_get(rt->dev, &hs);
    cJSON *h = cJSON_AddObjectToObject(doc, "hbm");
    cJSON_AddNumberToObject(h, "in_use", (double)hs.in_use);
    cJSON_AddNumberToObject(h, "peak", (double)hs.peak);
    cJSON_AddNumberToObject(h, "capacity", (double)hs.capacity);
}

/* The caches' totals and the step history's warm-up figures. */
static void cache_json(cJSON *doc, ctpu_runtime *rt, const ctpu_cache_stats *st, const ctpu_step_history *hist)
{
    ctpu_metrics *m = &rt->metrics;
    ctpu_timer ct;
    ctpu_timer_get(m, CTPU_TMR_COMPILE_TIME, &ct);
    cJSON *c = cJSON_AddObjectToObject(doc, "cache");
    cJSON_AddNumberToObject(c, "requests", ctr(m, CTPU_CTR_FUSED_CACHE_REQUESTS));
    cJSON_AddNumberToObject(c, "hits", ctr(m, CTPU_CTR_FUSED_CACHE_HITS));
    cJSON_AddNumberToObject(c, "misses", ctr(m, CTPU_CTR_FUSED_CACHE_MISSES));
    cJSON_AddNumberToObject(c, "compiles", ctr(m, CTPU_CTR_PROGRAMS_COMPILED));
    cJSON_AddNumberToObject(c, "recompiles", ctr(m, CTPU_CTR_RECOMPILES));
    cJSON_AddNumberToObject(c, "evictions", ctr(m, CTPU_CTR_CACHE_EVICTIONS));
    cJSON_AddNumberToObject(c, "thrash", ctr(m, CTPU_CTR_CACHE_THRASH));
    cJSON_AddNumberToObject(c, "collisions", ctr(m, CTPU_CTR_CACHE_COLLISIONS));
    cJSON_AddNumberToObject(c, "entries", (double)st->entries);
    cJSON_AddNumberToObject(c, "capacity", (double)st->capacity);
    cJSON_AddNumberToObject(c, "compile_ns", (double)ct.total_ns);
    cJSON_AddNumberToObject(c, "strict_requests", ctr(m, CTPU_CTR_STRICT_CACHE_REQUESTS));
    cJSON_AddNumberToObject(c, "strict_hits", ctr(m, CTPU_CTR_STRICT_CACHE_HITS));
    cJSON_AddNumberToObject(c, "strict_misses", ctr(m, CTPU_CTR_STRICT_CACHE_MISSES));
    cJSON_AddNumberToObject(c, "strict_recompiles", ctr(m, CTPU_CTR_STRICT_RECOMPILES));
    ctpu_cache_stats ss;
    ctpu_cache_get_stats(rt->strict_cache, &ss);
    cJSON_AddNumberToObject(c, "strict_cache_entries", (double)ss.entries);
    cJSON_AddNumberToObject(c, "strict_cache_capacity", (double)ss.capacity);
    cJSON_AddNumberToObject(c, "strict_cache_evictions", ctr(m, CTPU_CTR_STRICT_CACHE_EVICTIONS));
    cJSON_AddNumberToObject(c, "recompile_limit", (double)rt->recompile_limit);
    cJSON_AddNumberToObject(c, "recompile_limit_fallbacks", ctr(m, CTPU_CTR_RECOMPILE_LIMIT_FALLBACKS));
    cJSON_AddNumberToObject(c, "steps", (double)hist->steps);
    cJSON_AddNumberToObject(c, "warmup_steps", (double)hist->warmup_steps);
    cJSON_AddNumberToObject(c, "compile_steps", (double)hist->compile_steps);
    cJSON_AddNumberToObject(c, "late_compile_steps", (double)hist->late_compile_steps);
    cJSON_AddNumberToObject(c, "last_compile_step", (double)hist->last_compile_step);
    cJSON_AddBoolToObject(c, "all_hit_reached", hist->warm);
}

/* Programs: the cache's entries (hits, bytes) merged with what the report
 * saw (ops, inputs, kernels, launches, estimate). Under r->mu. */
static void programs_json(cJSON *doc, ctpu_report_state *r, const ctpu_cache_entry_info *ei, size_t ne)
{
    cJSON *ps = cJSON_AddArrayToObject(doc, "programs");
    uint64_t max_id = r->n_progs;
    for (size_t i = 0; i < ne; i++) if (ei[i].id > max_id) max_id = ei[i].id;
    for (uint64_t id = 1; id <= max_id; id++) {
        const ctpu_cache_entry_info *e = NULL;
        for (size_t i = 0; i < ne; i++) if (ei[i].id == id) e = &ei[i];
        const prog_rec *p = id <= r->n_progs ? &r->progs[id - 1] : NULL;
        if (p && !p->known && !p->launches) p = NULL;
        if (!e && !p) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", (double)id);
        cJSON_AddStringToObject(o, "ops", p && p->known ? p->ops : e ? e->summary : "");
        cJSON_AddStringToObject(o, "inputs", p && p->known ? p->inputs : "");
        cJSON_AddNumberToObject(o, "n_ops", p && p->known ? p->n_ops : e ? e->n_nodes : 0);
        cJSON_AddNumberToObject(o, "kernels", p && p->known ? p->n_kernels : e ? e->n_steps : 0);
        cJSON_AddNumberToObject(o, "launches", p ? (double)p->launches : e ? (double)e->hits + 1 : 0);
        cJSON_AddNumberToObject(o, "hits", p ? (double)p->hits : e ? (double)e->hits : 0);
        cJSON_AddNumberToObject(o, "compile_ns", e ? (double)e->compile_ns : p ? (double)p->compile_ns : 0);
        cJSON_AddNumberToObject(o, "first_step", e ? (double)e->first_use : p ? (double)p->first_step : 0);
        cJSON_AddNumberToObject(o, "last_step", e ? (double)e->last_use : p ? (double)p->last_step : 0);
        cJSON_AddNumberToObject(o, "bytes", e ? (double)e->bytes : 0);
        cJSON_AddBoolToObject(o, "cached", e != NULL);
        cJSON_AddNumberToObject(o, "est_s", p && p->known ? p->est_s[r->current] : 0);
        cJSON_AddNumberToObject(o, "hbm_bytes", p && p->known ? p->hbm_bytes : 0);
        cJSON_AddItemToArray(ps, o);
    }
}

/* The recompile log, with each program's first ops. Under r->mu. */
static void recompiles_json(cJSON *doc, ctpu_runtime *rt, ctpu_report_state *r)
{
    ctpu_recompile_rec recs[64];
    size_t nr = ctpu_cache_recompiles(rt->fused_cache, recs, 64);
    cJSON *rs = cJSON_AddArrayToObject(doc, "recompiles");
    for (size_t i = 0; i < nr; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "step", (double)recs[i].step);
        cJSON_AddNumberToObject(o, "old_program", (double)recs[i].old_program);
        cJSON_AddNumberToObject(o, "program", (double)recs[i].new_program);
        uint64_t pid = recs[i].new_program;
        const prog_rec *p = pid >= 1 && pid <= r->n_progs && r->progs[pid - 1].known ? &r->progs[pid - 1] : NULL;
        if (!p && recs[i].old_program >= 1 && recs[i].old_program <= r->n_progs && r->progs[recs[i].old_program - 1].known)
            p = &r->progs[recs[i].old_program - 1];
        cJSON_AddStringToObject(o, "ops", p ? p->ops : "");
        cJSON_AddStringToObject(o, "reason", recs[i].reason);
        cJSON_AddBoolToObject(o, "structure", recs[i].structure);
        if (recs[i].structure) {
            cJSON_AddStringToObject(o, "made_by", recs[i].made_by);
            cJSON_AddStringToObject(o, "tensor", recs[i].tensor);
        }
        cJSON_AddItemToArray(rs, o);
    }
}

/* The last strict recompiles (one-op programs of strict and debug eager
 * compiled again for a new shape in a later step than their signature's
 * first compile). */
static void strict_recompiles_json(cJSON *doc, ctpu_runtime *rt)
{
    cJSON *rs = cJSON_AddArrayToObject(doc, "strict_recompiles");
    pthread_mutex_lock(&rt->strict_sig_mu);
    uint64_t n = rt->strict_rc_n, first = n > CTPU_STRICT_RC_LOG ? n - CTPU_STRICT_RC_LOG : 0;
    for (uint64_t i = first; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "step", (double)rt->strict_rc[i % CTPU_STRICT_RC_LOG].step);
        cJSON_AddNumberToObject(o, "first_step", (double)rt->strict_rc[i % CTPU_STRICT_RC_LOG].first_step);
        cJSON_AddStringToObject(o, "op", rt->strict_rc[i % CTPU_STRICT_RC_LOG].what);
        cJSON_AddItemToArray(rs, o);
    }
    pthread_mutex_unlock(&rt->strict_sig_mu);
}

/* Trace cuts by reason, host reads by label. Under r->mu. */
static void cuts_json(cJSON *doc, ctpu_runtime *rt, ctpu_report_state *r)
{
    ctpu_metrics *m = &rt->metrics;
    cJSON *cuts = cJSON_AddObjectToObject(doc, "cuts");
    static const ctpu_counter_id cut_ctr[CTPU_CUT_COUNT] = {
        CTPU_CTR_CUT_MARK_STEP, CTPU_CTR_CUT_HOST_READ, CTPU_CTR_CUT_SYNC,
        CTPU_CTR_CUT_LOOP, CTPU_CTR_CUT_LIMIT, CTPU_CTR_CUT_MODE, CTPU_CTR_CUT_COLLECTIVE,
    };
    for (int i = 0; i < CTPU_CUT_COUNT; i++) cJSON_AddNumberToObject(cuts, cut_names[i], ctr(m, cut_ctr[i]));

    cJSON *hr = cJSON_AddArrayToObject(doc, "host_reads");
    for (int i = 0; i < r->n_labels; i++) {
        if (!r->labels[i].reads && !r->labels[i].cuts) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "label", r->labels[i].label);
        cJSON_AddNumberToObject(o, "reads", (double)r->labels[i].reads);
        cJSON_AddNumberToObject(o, "cuts", (double)r->labels[i].cuts);
        cJSON_AddItemToArray(hr, o);
    }
}

/* Matmul shapes: strict-mode ops and dynamic launches (at their own extents)
 * plus each program's matmuls x its other launches;
 * ops by estimated compute time. Under r->mu. */
static void shapes_ops_json(cJSON *doc, ctpu_runtime *rt, ctpu_report_state *r)
{
    mm_rec all[MAX_MMS];
    int nall = 0;
    for (int i = 0; i < r->n_mms; i++) all[nall++] = r->mms[i];
    for (size_t pi = 0; pi < r->n_progs; pi++) {
        const prog_rec *p = &r->progs[pi];
        uint64_t n = p->launches - p->priced_launches;   /* at the compile's extents */
        for (int j = 0; j < p->n_mm && n; j++) {
            int f = -1;
            for (int q = 0; q < nall; q++) if (memcmp(&all[q].d, &p->mm[j], sizeof p->mm[j]) == 0) f = q;
            if (f >= 0) all[f].count += n;
            else if (nall < MAX_MMS) all[nall++] = (mm_rec){ p->mm[j], n };
        }
    }
    cJSON *mms = cJSON_AddArrayToObject(doc, "matmuls");
    int q = rt->chip->mxu_size;
    for (int i = 0; i < nall; i++) {
        cJSON *o = cJSON_CreateObject();
        mm_dims d = all[i].d;
        double pad = (double)((d.m + q - 1) / q * q) * (double)((d.k + q - 1) / q * q) * (double)((d.n + q - 1) / q * q);
        cJSON_AddNumberToObject(o, "batch", (double)d.batch);
        cJSON_AddNumberToObject(o, "m", (double)d.m);
        cJSON_AddNumberToObject(o, "k", (double)d.k);
        cJSON_AddNumberToObject(o, "n", (double)d.n);
        cJSON_AddNumberToObject(o, "count", (double)all[i].count);
        cJSON_AddNumberToObject(o, "useful", pad > 0 ? (double)d.m * (double)d.k * (double)d.n / pad : 0);
        cJSON_AddItemToArray(mms, o);
    }

    cJSON *ops = cJSON_AddArrayToObject(doc, "ops");
    for (int o = 0; o < CTPU_OP_COUNT; o++) {
        if (!r->op_count[o]) continue;
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "op", ctpu_op_name(o));
        cJSON_AddNumberToObject(x, "count", (double)r->op_count[o]);
        cJSON_AddNumberToObject(x, "est_s", r->op_s[o]);
        cJSON_AddItemToArray(ops, x);
    }
}

static void cost_json(cJSON *doc, ctpu_runtime *rt, const ctpu_cost_table *tbl, double hbm_s)
{
    cJSON *cost = cJSON_AddObjectToObject(doc, "cost");
    cJSON_AddBoolToObject(cost, "estimate", true);
    cJSON_AddStringToObject(cost, "model", "roofline: max(MXU with dims padded to the MXU side, vector, HBM traffic)");
    cJSON_AddNumberToObject(cost, "steps", (double)tbl->steps);
    cJSON_AddNumberToObject(cost, "steps_per_epoch", (double)tbl->steps_per_epoch);
    cJSON_AddNumberToObject(cost, "model_flops", tbl->model_flops);
    cJSON_AddNumberToObject(cost, "hbm_bytes", tbl->hbm_bytes);
    cJSON_AddNumberToObject(cost, "hbm_s", hbm_s);
    cJSON_AddNumberToObject(cost, "vector_ops", tbl->vector_ops);
    cJSON_AddStringToObject(cost, "current", rt->chip->name);
    cJSON_AddStringToObject(cost, "price_plan", ctpu_price_plan_name(tbl->plan));
    cJSON *rows = cJSON_AddArrayToObject(cost, "rows");
    for (int i = 0; i < tbl->n_rows; i++) {
        cJSON_AddItemToArray(rows, ctpu__cost_row_json(&tbl->rows[i]));
    }
}

static void history_json(cJSON *doc, const ctpu_step_history *hist)
{
    cJSON *hj = cJSON_AddObjectToObject(doc, "history");
    cJSON_AddNumberToObject(hj, "stride", (double)hist->stride);
    cJSON *hs_step = cJSON_AddArrayToObject(hj, "step");
    cJSON *hs_req = cJSON_AddArrayToObject(hj, "requests");
    cJSON *hs_hit = cJSON_AddArrayToObject(hj, "hits");
    cJSON *hs_cmp = cJSON_AddArrayToObject(hj, "compiles");
    for (size_t i = 0; i < hist->n; i++) {
        cJSON_AddItemToArray(hs_step, cJSON_CreateNumber((double)hist->pts[i].step));
        cJSON_AddItemToArray(hs_req, cJSON_CreateNumber((double)hist->pts[i].requests));
        cJSON_AddItemToArray(hs_hit, cJSON_CreateNumber((double)hist->pts[i].hits));
        cJSON_AddItemToArray(hs_cmp, cJSON_CreateNumber((double)hist->pts[i].compiles));
    }
}

/* Data parallel (issue 19), when the run made collectives or has several
 * ranks: counts per marked step, bytes, the ICI estimates at this world
 * size, 8 and 256 chips and the pod's maximum against the estimated
 * compute per step (the emulated chip's cost row), and the measured time
 * in collectives on this machine. Not under r->mu (the stats take it). */
static void dist_json(cJSON *doc, ctpu_runtime *rt)
{
    ctpu_dist_stats s;
    if (ctpu_dist_get_stats(&s) != CTPU_OK || (s.collectives == 0 && ctpu_dist_world_size() == 1)) return;
    const ctpu_ici_info *ic = ctpu_ici_lookup(rt->chip->name);
    ctpu_dist_per_step ps;
    ctpu__dist_per_step(&s, &ps);
    cJSON *o = cJSON_AddObjectToObject(doc, "dist");
    cJSON_AddBoolToObject(o, "estimate", true);
    cJSON_AddStringToObject(o, "model", "ring / torus all-reduce: 2(k-1)/k x bytes / (ICI bandwidth / torus dims) "
                            "per dimension + 1 us per hop (include/ctpu.h)");
    cJSON_AddNumberToObject(o, "world_size", ctpu_dist_world_size());
    cJSON_AddNumberToObject(o, "rank", ctpu_dist_rank());
    cJSON_AddStringToObject(o, "chip", rt->chip->name);
    cJSON_AddNumberToObject(o, "ici_gbytes_s", ic ? ic->ici_gbytes_s : 0);
    cJSON_AddNumberToObject(o, "torus_dims", ic ? ic->torus_dims : 0);
    cJSON_AddNumberToObject(o, "pod_chips", ic ? (double)ic->pod_chips : 0);
    cJSON_AddNumberToObject(o, "steps", (double)s.steps);
    cJSON_AddNumberToObject(o, "collectives", (double)s.collectives);
    static const char *const kinds[4] = { "all_reduce", "broadcast", "all_gather", "reduce_scatter" };
    for (int k = 0; k < 4; k++) cJSON_AddNumberToObject(o, kinds[k], (double)s.by_kind[k]);
    cJSON_AddNumberToObject(o, "bytes", s.bytes);
    /* per-step figures: per training step (gradient buckets) when the run
     * trained, so evaluation steps do not dilute them; per_step_basis says */
    cJSON_AddNumberToObject(o, "train_steps", (double)s.train_steps);
    cJSON_AddStringToObject(o, "per_step_basis", ps.train ? "train_steps" : "steps");
    cJSON_AddNumberToObject(o, "grad_collectives", (double)s.grad_collectives);
    cJSON_AddNumberToObject(o, "grad_bytes", s.grad_bytes);
    cJSON_AddNumberToObject(o, "collectives_per_step", ps.collectives);
    cJSON_AddNumberToObject(o, "bytes_per_step", ps.bytes);
    double comp = ps.compute_s * 1e6, comm = ps.ici_s * 1e6;
    cJSON_AddNumberToObject(o, "est_compute_us_per_step", comp);
    cJSON_AddNumberToObject(o, "est_ici_us_per_step", comm);
    cJSON_AddNumberToObject(o, "est_comm_fraction", comp + comm > 0 ? comm / (comp + comm) : 0);
    cJSON_AddNumberToObject(o, "est_ici_us_per_step_8", ps.ici_s_8 * 1e6);
    cJSON_AddNumberToObject(o, "est_ici_us_per_step_256", ps.ici_s_256 * 1e6);
    cJSON_AddNumberToObject(o, "est_ici_us_per_step_pod", ps.ici_s_pod * 1e6);
    cJSON_AddNumberToObject(o, "comm_wall_s", s.comm_wall_s);
    cJSON_AddNumberToObject(o, "started_all_reduces", (double)s.started);
    cJSON_AddNumberToObject(o, "comm_in_flight_s", s.started_in_flight_s);
    cJSON_AddNumberToObject(o, "comm_exposed_s", s.started_exposed_s);
    cJSON_AddNumberToObject(o, "overlap_share", ps.overlap_share);
}

static cJSON *build_json(ctpu_runtime *rt)
{
    ctpu_report_state *r = rt->report;
    cJSON *doc = cJSON_CreateObject();
    if (!doc) return NULL;
    header_json(doc, rt);
    ctpu_cache_stats st;
    ctpu_cache_get_stats(rt->fused_cache, &st);
    ctpu_step_history hist;
    ctpu_metrics_history(&rt->metrics, &hist);
    cache_json(doc, rt, &st, &hist);

    size_t ne = st.entries;
    ctpu_cache_entry_info *ei = calloc(ne + 1, sizeof *ei);
    ne = ei ? ctpu_cache_entries_info(rt->fused_cache, ei, ne) : 0;
    pthread_mutex_lock(&r->mu);
    fold_replays(r);
    programs_json(doc, r, ei, ne);
    free(ei);
    recompiles_json(doc, rt, r);
    strict_recompiles_json(doc, rt);
    cuts_json(doc, rt, r);
    shapes_ops_json(doc, rt, r);
    ctpu_cost_table tbl;
    cost_table_locked(rt, &tbl);
    double hbm_s = r->hbm_s;
    ctpu__policy_json(doc, r->policy, rt->compile_seconds, rt->price_plan, r->current);
    held_json(doc, r);
    pthread_mutex_unlock(&r->mu);
    cost_json(doc, rt, &tbl, hbm_s);
    history_json(doc, &hist);
    dist_json(doc, rt);
    ctpu__compiled_json(doc, rt);
    return doc;
}

char *ctpu_metrics_json(void)
{
    if (!ctpu_check_init("metrics_json")) return NULL;
    cJSON *doc = build_json(ctpu_rt);
    char *s = doc ? cJSON_Print(doc) : NULL;
    cJSON_Delete(doc);
    char *out = s ? strdup(s) : NULL;
    cJSON_free(s);
    if (!out) ctpu_set_error(CTPU_ERR_OOM, "metrics_json: out of host memory");
    return out;
}

ctpu_status ctpu_metrics_write(const char *path)
{
    if (!ctpu_check_init("metrics_write")) return CTPU_ERR_NOT_INITIALIZED;
    if (!path || !*path) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "metrics_write: path is %s", path ? "empty" : "NULL");
        return CTPU_ERR_INVALID_ARG;
    }
    char *s = ctpu_metrics_json();
    if (!s) return ctpu_last_status();
    FILE *f = fopen(path, "w");
    if (!f) {
        int e = errno;
        free(s);
        ctpu_set_error(CTPU_ERR_IO, "metrics_write: cannot open %s for writing: %s", path, strerror(e));
        return CTPU_ERR_IO;
    }
    errno = 0;
    bool ok = fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    int e = ok ? 0 : errno;
    if (fclose(f) != 0) {
        if (ok) e = errno;
        ok = false;
    }
    free(s);
    if (!ok) {   /* (a full device, /dev/full, fails at the flush: "No space left on device") */
        ctpu_set_error(CTPU_ERR_IO, "metrics_write: writing %s failed: %s", path, e ? strerror(e) : "I/O error");
        return CTPU_ERR_IO;
    }
    return CTPU_OK;
}

void ctpu_metrics_report(FILE *f)
{
    if (!f) f = stderr;
    if (!ctpu_rt) { fprintf(f, "ctpu metrics report: runtime not initialised\n"); return; }
    ctpu_metrics *m = &ctpu_rt->metrics;
    ctpu_metrics_print(m, f);
    ctpu_hbm_stats hs;
    ctpu_hbm_stats_get(ctpu_rt->dev, &hs);
    fprintf(f, "Metric: hbm\n  InUse: %llu bytes\n  Peak: %llu bytes\n  Capacity: %llu bytes\n",
            (unsigned long long)hs.in_use, (unsigned long long)hs.peak, (unsigned long long)hs.capacity);
    double req = ctr(m, CTPU_CTR_FUSED_CACHE_REQUESTS) + ctr(m, CTPU_CTR_STRICT_CACHE_REQUESTS);
    double hit = ctr(m, CTPU_CTR_FUSED_CACHE_HITS) + ctr(m, CTPU_CTR_STRICT_CACHE_HITS);
    fprintf(f, "Metric: cache_hit_rate\n  Value: %.1f%% (%.0f of %.0f requests)\n", hit_pct(hit, req),
            hit, req);
}

void ctpu_metrics_clear(void)
{
    if (!ctpu_rt) return;
    ctpu_metrics_reset(&ctpu_rt->metrics);
    /* a gauge, not a count of events: the table keeps its entries */
    ctpu_cache_stats ss;
    ctpu_cache_get_stats(ctpu_rt->strict_cache, &ss);
    ctpu_counter_add(&ctpu_rt->metrics, CTPU_CTR_STRICT_CACHE_ENTRIES, (long long)ss.entries);
    pthread_mutex_lock(&ctpu_rt->report->mu);
    totals_clear(ctpu_rt->report);
    pthread_mutex_unlock(&ctpu_rt->report->mu);
    ctpu__dist_stats_clear();
}

/* ------------------------------------------------------------ shutdown */
void ctpu__report_shutdown(ctpu_runtime *rt)
{
    ctpu_report_state *r = rt->report;
    if (!r) return;
    ctpu_runtime *saved = ctpu_rt;
    ctpu_rt = rt;   /* the public JSON path checks it */
    if (rt->metrics_file) {
        if (ctpu_metrics_write(rt->metrics_file) != CTPU_OK)
            fprintf(stderr, "ctpu: TORCH_TPU_METRICS_FILE: %s\n", ctpu_last_error());
    } else if (!r->quiet) {
        ctpu_metrics *m = &rt->metrics;
        double req = ctr(m, CTPU_CTR_FUSED_CACHE_REQUESTS) + ctr(m, CTPU_CTR_STRICT_CACHE_REQUESTS);
        double hit = ctr(m, CTPU_CTR_FUSED_CACHE_HITS) + ctr(m, CTPU_CTR_STRICT_CACHE_HITS);
        ctpu_timer ct;
        ctpu_timer_get(m, CTPU_TMR_COMPILE_TIME, &ct);
        if (req > 0)
            fprintf(stderr, "ctpu: compile cache: %.0f requests, %.0f hits (%.1f%%), %.0f compiles, %.1f ms compiling [%s, %s]\n",
                    req, hit, hit_pct(hit, req), ctr(m, CTPU_CTR_PROGRAMS_COMPILED), (double)ct.total_ns / 1e6,
                    ctpu_mode_name(rt->mode), rt->chip->name);
    }
    if (r->trace && rt->trace_file) {
        char err[256];
        if (!ctpu_tracebuf_write(r->trace, rt->trace_file, err, sizeof err))
            fprintf(stderr, "ctpu: TORCH_TPU_TRACE_FILE: %s\n", err);
        else if (ctpu_tracebuf_dropped(r->trace))
            fprintf(stderr, "ctpu: trace %s: buffer of %zu events full, %llu later events dropped; "
                    "TORCH_TPU_TRACE_EVENTS=%llu keeps them\n", rt->trace_file, ctpu_tracebuf_capacity(r->trace),
                    (unsigned long long)ctpu_tracebuf_dropped(r->trace),
                    (unsigned long long)(ctpu_tracebuf_count(r->trace) + ctpu_tracebuf_dropped(r->trace)));
    }
    ctpu_rt = saved;
}
