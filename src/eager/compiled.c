/* Compiled steps (issue 17): the fourth TorchTPU mode, torch.compile's.
 *
 * Capture: the first call of a compiled step (and a call whose guards fail)
 * runs fn with this thread in defer and fuse and a capture set (eager.h
 * ctpu__capturing): no loop detection, every op recorded into one trace;
 * the hooks note what a replay must redo (random draws, assigns to tensors
 * made before the call, .grads backward made, zero_grads) and what breaks
 * the graph (a host read, a mode change, a nested compiled call, any other
 * cut). At fn's end the trace is flushed like any defer-and-fuse cut (the
 * fused cache compiles or finds its program) with a sink: before the live
 * handles get their buffers, the replay plan is built (ctpu__capture_sink):
 * for each program input, whether it is in[i] (at an offset), a tensor made
 * before the call (its handle, read at each replay: eager and compiled
 * calls mix on the same tensors) or a buffer no handle owns (kept as a
 * constant); for each runtime scalar, a constant, argument i (its value was
 * scalars[i], bit for bit) or a random node's seed/offset; for each
 * live-out, out[j], an assigned tensor (in place or rebound), or a leaf's
 * new .grad (also when fn returns it: out[j] is the leaf's .grad). A
 * handle that was in[i] (a leaf that requires grad, or an input fn
 * assigns) or an input leaf's .grad is bound by position, as torch.compile
 * binds inputs: each call's in[i] gets the .grad or the assign (hpos). The
 * program is held through a cache ref (it stays in the bounded LRU; an
 * evicted one fails the guard and recaptures).
 *
 * Replay: the guards (the inputs' dtypes and exact shapes, a marked dim's
 * by its range: another in-range extent is a dynamic capture that binds
 * the one dynamic program, capture_extent --, how the
 * inputs share storage, which leaf or assigned inputs are one tensor, a
 * non-leaf input's history when the capture's backward ran through it,
 * the scalar count, precision and debug checks, each handle's liveness,
 * in-place targets still unshared, .grad presence, per position for an
 * input leaf) and one command: no fn, no recording, no key.
 *
 * Files: this one has the public calls, the dispatch of a call to a replay
 * or a capture, and running fn; compiled_capture.c the hooks and the sink;
 * compiled_guard.c the guards and the replay; compiled_int.h the types. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cJSON.h>

#include "compiled_int.h"

#define COMPILED_MAGIC 0x6374707573746570ull   /* "ctpustep" */
#define RETIRED_MAGIC 0x6374707572657464ull    /* "ctpuretd": freed by the user, kept for the report */

/* Every ctpu_compiled this process has allocated and not yet freed, so a
 * call given a pointer that was freed (or never was a compiled step) is
 * refused without reading it: the magic alone would be a read of freed
 * memory. Few steps live at once; a linear scan is a few ns. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static const void **live_steps;
static size_t live_n, live_cap;

static bool live_add(const void *c)
{
    pthread_mutex_lock(&live_mu);
    bool ok = true;
    if (live_n == live_cap) {
        size_t cap = live_cap ? live_cap * 2 : 16;
        const void **p = realloc(live_steps, cap * sizeof *p);
        if (p) {
            live_steps = p;
            live_cap = cap;
        } else {
            ok = false;
        }
    }
    if (ok) live_steps[live_n++] = c;
    pthread_mutex_unlock(&live_mu);
    return ok;
}

static bool live_has(const void *c)
{
    if (!c) return false;
    pthread_mutex_lock(&live_mu);
    bool found = false;
    for (size_t i = 0; i < live_n && !found; i++) found = live_steps[i] == c;
    pthread_mutex_unlock(&live_mu);
    return found;
}

static void live_free(void *c)
{
    pthread_mutex_lock(&live_mu);
    for (size_t i = 0; i < live_n; i++)
        if (live_steps[i] == c) {
            live_steps[i] = live_steps[--live_n];
            break;
        }
    if (live_n == 0) {
        free(live_steps);
        live_steps = NULL;
        live_cap = 0;
    }
    pthread_mutex_unlock(&live_mu);
    free(c);
}

void ctpu__cs_version_free(version *v)
{
    if (!v) return;
    if (v->run) ctpu_cache_release(ctpu_rt->fused_cache, v->run);
    if (v->prog) ctpu_cache_release(ctpu_rt->fused_cache, v->prog);
    free(v->user_dyn);
    for (int k = 0; v->in && k < v->n_pin; k++)
        if (v->in[k].kind == IN_CONST && v->in[k].buf) ctpu_buffer_release(ctpu_rt->dev, v->in[k].buf);
    free(v->user_type);
    free(v->user_same);
    free(v->user_rel);
    free(v->in);
    free(v->sc);
    free(v->rq);
    free(v->alias_req);
    free(v->grad_rq);
    free(v->out_bytes);
    free(v->rng);
    free(v->no_grad_leaf);
    free(v->no_grad_in);
    free(v->out_rq);
    free(v->out_fixed);
    free(v->out_in);
    free(v->out_prow);
    free(v->out_grad);
    free(v->out_vbase);
    for (int j = 0; v->out_cbuf && j < v->n_out_user; j++)
        if (v->out_cbuf[j]) {
            atomic_fetch_sub(&v->out_cbuf[j]->handle_refs, 1);
            ctpu_buffer_release(ctpu_rt->dev, v->out_cbuf[j]);
        }
    free(v->out_cbuf);
    free(v->out_vtype);
    free(v->out_vdelta);
    free(v->out_vold);
    free(v->user_ag);
    free(v->user_hsame);
    free(v->user_bound);
    free(v->user_hist);
    free(v->arg_val);
    free(v->hid);
    free(v->inplace_ids);
    free(v->hrole);
    free(v->hag);
    free(v->hrec);
    free(v->hslot);
    free(v->hgen);
    free(v->hdesc);
    free(v->hpos);
    free(v->hnow);
    free(v->prow);
    free(v->hleaf);
    free(v->gobs);
    free(v->kobs);
    free(v->fresh_o);
    free(v->held_hs);
    free(v->pub_q);
    free(v->outb);
    free(v->outo);
    free(v->outk);
    free(v->sc_tmpl);
    free(v->sc_dyn);
    free(v->unconf);
    free(v->pin_b);
    free(v->pin_user);
    free(v->pin_o);
    if (v->scratch) ctpu_buffer_release(ctpu_rt->dev, v->scratch);
    if (v->prov && v->prov_seq && ctpu_rt && ctpu_rt->dev) ctpu_device_wait(ctpu_rt->dev, v->prov_seq);
    free(v->prov);
    free(v);
}

static void versions_free_from(version *v)
{
    for (version *n; v; v = n) {
        n = v->next;
        ctpu__cs_version_free(v);
    }
}

static void versions_free(ctpu_compiled *c)
{
    versions_free_from(c->versions);
    c->versions = NULL;
}


/* ------------------------------------------------------------ running fn */
/* out[j]: kept into the caller's scope; detached when it requires grad (a
 * replay's outputs have no tape: the step's backward is inside fn). */
static bool in_fn_scope(ctpu_tensor t)
{
    const ctpu_thread_state *ts = ctpu__ts;
    const ctpu_trec *r = live_rec(t.id);
    return r && ts->scope_depth > 0 && r->scope_id == ts->scopes[ts->scope_depth - 1].id;
}

static void finish_outputs(ctpu_tensor *out, int n_out)
{
    struct ctpu_capture *cap = cap_now();
    bool *made = cap && cap->out == out ? cap->fn_made : NULL;
    for (int j = 0; j < n_out; j++) {
        /* an error handle fn got from a failed op (no slot: a failure
         * record's id) is returned as eager returns it; garbage is dropped */
        if (ctpu_is_null(out[j])) continue;
        if (!ctpu_is_valid(out[j])) {
            if ((out[j].id & 0xffffffffu) != 0) out[j] = CTPU_NULL;
            continue;
        }
        const ctpu_trec *orec = live_rec(out[j].id);   /* (not ctpu_requires_grad: no host read of fn's to guard) */
        if (orec && ctpu__ag_kind(orec) != 0) out[j] = ctpu_detach(out[j]);
        for (int i = 0; i < j; i++)
            if (out[i].id == out[j].id) goto kept;
        /* into the caller's scope: only what fn made (an input or a tensor
         * made before the call stays in its own scope, as eager's) */
        if (in_fn_scope(out[j])) {
            ctpu_keep(out[j]);
            if (made) made[j] = true;
        }
    kept:;
    }
}

/* fn in its own scope (the current mode, or mode >= 0 for the call). */
/* fn's out array: the call's n_out slots and OUT_GUARD more, all
 * CTPU_NULL (fn has no n_out: one that writes past it, out[0] of a call with
 * n_out = 0 included, writes here, not into the caller's memory or NULL) */
#define OUT_GUARD 8

static ctpu_status run_fn(ctpu_compiled *c, const ctpu_tensor *in, const double *scalars, int n_out, ctpu_tensor *out)
{
    for (int j = 0; j < n_out; j++) out[j] = CTPU_NULL;
    ctpu_tensor local[64 + OUT_GUARD], *fo = n_out <= 64 ? local : malloc(sizeof(ctpu_tensor) * (size_t)(n_out + OUT_GUARD));
    if (!fo) {
        ctpu_set_error(CTPU_ERR_OOM, "compiled step %s: out of host memory for %d outputs", step_name(c), n_out);
        return CTPU_ERR_OOM;
    }
    for (int j = 0; j < n_out + OUT_GUARD; j++) fo[j] = CTPU_NULL;
    ctpu_status st = ctpu_scope_begin();
    if (st != CTPU_OK) {
        if (fo != local) free(fo);
        return st;
    }
    ctpu_user_frame uf;   /* runtime.c: shutdown refused inside fn; its stacks restored at its return */
    ctpu__user_enter(&uf, "compiled_call", "a compiled step's fn");
    st = ctpu__user_exit(&uf, c->fn(c->ctx, in, scalars, fo));
    if (st != CTPU_OK && ctpu_last_status() == CTPU_OK)   /* fn's own status, no error recorded with it */
        ctpu_set_error(st, "compiled step %s: fn returned %s (%d) without an error message", step_name(c),
                       ctpu_status_str(st), (int)st);
    for (int j = n_out; j < n_out + OUT_GUARD && st == CTPU_OK; j++)
        if (!ctpu_is_null(fo[j])) {   /* (released with fn's scope below) */
            ctpu_set_error(CTPU_ERR_INVALID_ARG, "compiled step %s: fn wrote out[%d], but the call has n_out = %d",
                           step_name(c), j, n_out);
            st = CTPU_ERR_INVALID_ARG;
        }
    if (n_out > 0) memcpy(out, fo, sizeof(ctpu_tensor) * (size_t)n_out);
    if (fo != local) free(fo);
    if (st == CTPU_OK) finish_outputs(out, n_out);
    ctpu_status se = ctpu_scope_end();
    if (st != CTPU_OK) for (int j = 0; j < n_out; j++) out[j] = CTPU_NULL;
    return st != CTPU_OK ? st : se;
}

/* A call as defer and fuse (a step that broke its graph): fn recorded, cut
 * where it reads the host, flushed at its end. */
static ctpu_status run_deferred(ctpu_compiled *c, const ctpu_tensor *in, const double *scalars, int n_out,
                                ctpu_tensor *out)
{
    ctpu_thread_state *ts = ctpu__ts;
    int saved = ts->mode_override;
    ts->mode_override = CTPU_MODE_DEFER_FUSE;
    ctpu_status st = run_fn(c, in, scalars, n_out, out);
    ctpu_status fs = ctpu__defer_flush(CTPU_CUT_MARK_STEP);
    ts->mode_override = saved;
    return st != CTPU_OK ? st : fs;
}

static void capture_free(struct ctpu_capture *cap)
{
    free(cap->rng);
    free(cap->assigned);
    free(cap->zeroed);
    free(cap->grads);
    free(cap->ints);
    free(cap->fn_made);
    free(cap->fn_assigned);
    free(cap->gread);
    free(cap->kread);
}

static void note_event(ctpu_compiled *c, const char *kind, const char *reason)
{
    pthread_mutex_lock(&ctpu_rt->compiled_mu);
    step_event *e = &c->events[c->n_events++ % N_EVENTS];
    e->call = c->info.calls + 1;
    e->kind = kind;
    snprintf(e->reason, sizeof e->reason, "%s", reason);
    pthread_mutex_unlock(&ctpu_rt->compiled_mu);
}

static void note_reason(ctpu_compiled *c, const char *kind, const char *what, const char *reason)
{
    size_t n = strlen(what) < sizeof c->info.last_reason ? strlen(what) : 0;
    memcpy(c->info.last_reason, what, n);
    snprintf(c->info.last_reason + n, sizeof c->info.last_reason - n, "%.*s", (int)(sizeof c->info.last_reason - n - 1),
             reason);
    note_event(c, kind, reason);
}

/* The symbols of the capture's dynamic inputs (ctpu_mark_dynamic's marks,
 * or those a capture lends), live in the trace from its start, as
 * ctpu_mark_dynamic makes them live when it marks: a value fn makes from a
 * host int equal to one before it first reads that input (a slice of a
 * position table to [0, T)) takes the symbol (dispatch.c
 * dyn_guess_args), wherever in fn it comes. */
static void note_symbols(int n_in, ctpu_trec *const *inrec)
{
    ctpu_defer_state *df = &ctpu__ts->df;
    for (int i = 0; i < n_in; i++) {
        const ctpu_trec *r = inrec[i];
        for (int d = 0; r->dyn && d < r->type.ndim; d++) {
            const ctpu_dyndim *y = &r->dyn[d];
            if (y->coef <= 0 || r->type.shape[d] % y->coef) continue;
            int64_t v = r->type.shape[d] / y->coef;
            bool seen = v < y->lo || v > y->hi;
            for (int q = 0; q < df->n_sym && !seen; q++)
                seen = df->sym[q].lo == y->lo && df->sym[q].hi == y->hi && df->sym[q].v == v;
            if (!seen && df->n_sym < 8) {
                df->sym[df->n_sym].lo = y->lo;
                df->sym[df->n_sym].hi = y->hi;
                df->sym[df->n_sym++].v = v;
            }
        }
    }
}

/* Capture: fn with the thread in defer and fuse, one trace, compiled whole. */
/* A capture that must leave no trace (a fullgraph refusal, a failed
 * automatic-dynamic trial): the recorded ops never run, fn's outputs go,
 * and the generator is put back where it was (the draws recorded did not
 * happen). */
static void abandon_capture(ctpu_tensor *out, int n_out, uint64_t seed0, uint64_t off0)
{
    ctpu__defer_abandon();
    for (int j = 0; j < n_out; j++) {
        if (ctpu_is_valid(out[j])) ctpu_release(out[j]);
        out[j] = CTPU_NULL;
    }
    ctpu__rng_restore(seed0, off0);
}

static ctpu_status run_capture(ctpu_compiled *c, int n_in, const ctpu_tensor *in, ctpu_trec *const *inrec, int n_scalars,
                               const double *scalars, int n_out, ctpu_tensor *out)
{
    ctpu_thread_state *ts = ctpu__ts;
    struct ctpu_capture cap = { .c = c, .n_in = n_in, .n_scalars = n_scalars, .n_out = n_out, .scalars = scalars,
                                .out = out, .inrec = inrec,
                                .scope_floor = atomic_load(&ctpu_rt->next_scope_id),
                                .ag_pass0 = ctpu__ag_pass_next(), .ag_seq0 = ctpu__ag_seq_next() };
    cap.fn_made = calloc((size_t)n_out + 1, sizeof *cap.fn_made);
    if (!cap.fn_made) snprintf(cap.fail, sizeof cap.fail, "out of host memory");
    int saved = ts->mode_override;
    ts->mode_override = CTPU_MODE_DEFER_FUSE;
    ts->cap = &cap;
    note_symbols(n_in, inrec);
    uint64_t fail0 = ts->fail_handle;
    uint64_t seed0, off0;
    ctpu__rng_state(&seed0, &off0);   /* (not ctpu_rng_get_state: inside a capture that is a break) */
    ctpu_status st = run_fn(c, in, scalars, n_out, out);
    cap.in_final = true;
    if (c->trial && !cap.refused && !cap.broken && (st != CTPU_OK || ts->fail_handle != fail0)) {
        /* the automatic-dynamic trial failed (an op's shape rule refused
         * the dynamic dims): nothing ran, the generator is as before; the
         * caller captures static */
        snprintf(c->trial_err, sizeof c->trial_err, "%s", ctpu_last_error());
        abandon_capture(out, n_out, seed0, off0);
        ts->cap = NULL;
        ts->mode_override = saved;
        capture_free(&cap);
        c->auto_off = true;
        return CTPU_ERR_STATE;
    }
    if (cap.refused) {
        /* fullgraph: nothing ran; assigned tensors keep their values */
        abandon_capture(out, n_out, seed0, off0);
        ctpu_set_error(CTPU_ERR_STATE, "compiled step %s: fullgraph: %s", step_name(c), cap.reason);
        st = CTPU_ERR_STATE;
    } else if (st == CTPU_OK && !cap.broken && ts->fail_handle != fail0) {
        /* an op failed and fn went on (its out[j] may be the error handle):
         * the call runs as defer and fuse, as eager would; the next call
         * captures again */
        cap.op_failed = true;
        st = ctpu__defer_flush(CTPU_CUT_MARK_STEP);
    } else if (st != CTPU_OK || cap.broken) {
        ctpu_status fs = ctpu__defer_flush(CTPU_CUT_MARK_STEP);
        if (st == CTPU_OK) st = fs;
    } else if (!ctpu__defer_has_nodes()) {
        cap.empty = true;          /* nothing to compile (out[j] inputs or views, host work only) */
    } else {
        st = ctpu__defer_flush_capture();
    }
    ts->cap = NULL;
    ts->mode_override = saved;
    c->info.captures++;
    if (cap.broken) {
        c->broken = !cap.refused;   /* fullgraph: every later call captures again and fails again */
        c->info.graph_breaks++;
        note_reason(c, "graph break", "", cap.reason);
    }
    if (st == CTPU_OK && cap.made && !cap.fail[0] && !cap.broken) {
        cap.made->next = c->versions;
        c->versions = cap.made;
    } else if (cap.op_failed) {
        ctpu__cs_version_free(cap.made);
        note_reason(c, "not replayable", "not replayable: ", "an op inside fn failed and fn returned CTPU_OK");
    } else if (st == CTPU_OK && cap.empty && !cap.fail[0] && !cap.broken) {
        /* as torch.compile skips a frame with no tensor ops: fn runs at
         * every call, so its host work and returned handles stay eager's */
        c->skipped = true;
        note_reason(c, "skipped", "", "fn recorded no device op: every call runs fn in the current mode");
    } else {
        ctpu__cs_version_free(cap.made);
        if (st == CTPU_OK && !cap.fail[0] && !cap.broken) {
            /* the flush ran it op by op: the cache's TORCH_TPU_RECOMPILE_LIMIT */
            c->limited = true;
            bool shared = ctpu_rt->recompile_limit && c->recompiles + 1 < (uint64_t)ctpu_rt->recompile_limit;
            note_reason(c, "recompile limit", "", shared
                        ? "past TORCH_TPU_RECOMPILE_LIMIT: the step's program structure compiled its limit of shapes, "
                          "most by other compiled steps or traces of that structure (the cache is per structure)"
                        : "past TORCH_TPU_RECOMPILE_LIMIT: the step's program structure compiled its limit of shapes");
        } else if (st == CTPU_OK && cap.fail[0] && cap.fail_outlives && !c->outlived) {
            /* the call ran as defer and fuse. fn kept a tensor it made:
             * state made at its first call (an optimizer's, created
             * lazily) is a tensor made before the next call, whose capture
             * may replay; a second such failure is final (torch.compile
             * recompiles once the state exists) */
            c->outlived = true;
            char why[192];
            snprintf(why, sizeof why, "%.150s; the next call captures again", cap.fail);
            note_reason(c, "not replayable", "not replayable: ", why);
        } else if (st == CTPU_OK && cap.fail[0]) {
            /* the call ran as defer and fuse; later calls will too */
            c->broken = true;
            c->info.graph_breaks++;
            note_reason(c, "not replayable", "not replayable: ", cap.fail);
        }
    }
    capture_free(&cap);
    return st;
}

/* ------------------------------------------------------------ public */
static const char *state_name(const ctpu_compiled *c)
{
    if (ctpu_rt->compile_disable) return "TORCH_COMPILE_DISABLE: fn runs in the current mode";
    if (c->skipped) return "skipped: fn records no device op, it runs in the current mode";
    if (c->limited) return "past the recompile limit: captured shapes replay, others run fn in the current mode";
    if (c->broken) return "graph break: runs as defer and fuse";
    return c->versions || c->freed_replaying ? "replays" : "not captured";
}

/* The counts get_info and the report read (under the runtime's lock). */
static void publish_info(ctpu_compiled *c)
{
    int nv = 0;
    for (const version *v = c->versions; v; v = v->next) nv++;
    const char *state = state_name(c);
    pthread_mutex_lock(&ctpu_rt->compiled_mu);
    c->shown = c->info;
    c->shown_state = state;
    c->shown_versions = nv;
    pthread_mutex_unlock(&ctpu_rt->compiled_mu);
}

ctpu_compiled *ctpu_compile(ctpu_step_fn fn, void *ctx, const ctpu_compile_opts *opts)
{
    if (!ctpu_check_init("compile")) return NULL;
    if (!fn) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "compile: fn is NULL");
        return NULL;
    }
    ctpu_compiled *c = calloc(1, sizeof *c);
    if (!c) {
        ctpu_set_error(CTPU_ERR_OOM, "compile: out of host memory");
        return NULL;
    }
    if (!live_add(c)) {
        free(c);
        ctpu_set_error(CTPU_ERR_OOM, "compile: out of host memory");
        return NULL;
    }
    ctpu_runtime *rt = ctpu_rt;
    c->magic = COMPILED_MAGIC;
    c->epoch = rt->epoch;
    c->fn = fn;
    c->ctx = ctx;
    c->fullgraph = opts && opts->fullgraph;
    pthread_mutex_lock(&rt->compiled_mu);
    c->id = ++rt->next_compiled_id;
    c->next = rt->compiled;
    rt->compiled = c;
    pthread_mutex_unlock(&rt->compiled_mu);
    if (opts && opts->name && opts->name[0]) snprintf(c->name, sizeof c->name, "%s", opts->name);
    else snprintf(c->name, sizeof c->name, "step %llu", (unsigned long long)c->id);
    publish_info(c);
    return c;
}

static ctpu_status bad_arg(const char *fmt, int v)
{
    ctpu_set_error(CTPU_ERR_INVALID_ARG, fmt, v);
    return CTPU_ERR_INVALID_ARG;
}

static ctpu_status check_call_args(const ctpu_compiled *c, int n_in, const ctpu_tensor *in, int n_scalars,
                                   const double *scalars, int n_out, const ctpu_tensor *out)
{
    if (!ctpu_check_init("compiled_call")) return CTPU_ERR_NOT_INITIALIZED;
    if (!live_has(c) || c->magic != COMPILED_MAGIC) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "compiled_call: c is %s", c ? "not a compiled step (freed?)" : "NULL");
        return CTPU_ERR_INVALID_ARG;
    }
    if (c->epoch != ctpu_rt->epoch) {
        ctpu_set_error(CTPU_ERR_STATE, "compiled_call: compiled step %s belongs to a runtime that was shut down", c->name);
        return CTPU_ERR_STATE;
    }
    if (n_in < 0 || n_in > MAX_ARGS) return bad_arg("compiled_call: n_in=%d is outside [0, 4096]", n_in);
    if (n_scalars < 0 || n_scalars > MAX_ARGS) return bad_arg("compiled_call: n_scalars=%d is outside [0, 4096]", n_scalars);
    if (n_out < 0 || n_out > MAX_ARGS) return bad_arg("compiled_call: n_out=%d is outside [0, 4096]", n_out);
    if (n_in > 0 && !in) return bad_arg("compiled_call: in is NULL with n_in=%d", n_in);
    if (n_scalars > 0 && !scalars) return bad_arg("compiled_call: scalars is NULL with n_scalars=%d", n_scalars);
    if (n_out > 0 && !out) return bad_arg("compiled_call: out is NULL with n_out=%d", n_out);
    return CTPU_OK;
}

/* in[i]'s records, computed (a pending trace of this thread was cut). */
static ctpu_status resolve_inputs(int n_in, const ctpu_tensor *in, ctpu_trec **inrec)
{
    char arg[24];
    for (int i = 0; i < n_in; i++) {
        ctpu_trec *fast = live_rec(in[i].id);
        if (fast && !ctpu_rec_pending(fast)) {   /* the common case: no message to name it */
            inrec[i] = fast;
            continue;
        }
        snprintf(arg, sizeof arg, "in[%d]", i);
        ctpu_trec *r = ctpu_rec_get(in[i], "compiled_call", arg, false);
        if (!r) return ctpu_last_status();
        if (ctpu_rec_pending(r) && !ctpu__materialize(r, "compiled_call", CTPU_CUT_MODE)) return ctpu_last_status();
        inrec[i] = r;
    }
    return CTPU_OK;
}

/* Guards of each version, newest first; the first that holds, or NULL with
 * the newest one's reason. */
/* A slot is argument i when its value was scalars[i] bit for bit; until it
 * has followed scalars[i] across two captures it may be a constant that
 * happened to be equal (1 - 0.9 beside a bias correction 1 - 0.9^1): a call
 * with a new value for such an argument captures again to tell them apart. */
static bool needs_confirm(const version *v, const double *scalars)
{
    for (int u = 0; u < v->n_unconf; u++) {
        const sc_src *s = &v->sc[v->unconf[u]];
        uint64_t was = ctpu_scalar_bits(v->arg_val[s->idx]);
        if (ctpu_scalar_bits(scalars[s->idx]) != was) return true;
        /* an ambiguous slot may read any argument that had its value: a new
         * value of any of them captures again (else it would stay baked) */
        for (int j = s->idx + 1; j < v->n_scalars && s->amb; j++)
            if (ctpu_scalar_bits(v->arg_val[j]) == was && ctpu_scalar_bits(scalars[j]) != was) return true;
    }
    return false;
}

/* The scalars' template and the unconfirmed arguments, once per version
 * (after any merge_confirmed turned its arguments to constants). */
static void prepare(version *v)
{
    v->n_dyn = v->n_unconf = 0;
    for (int k = 0; k < v->n_psc; k++) {
        const sc_src *s = &v->sc[k];
        v->sc_tmpl[k] = s->kind == SC_CONST ? s->v : 0;
        if (s->kind != SC_CONST) v->sc_dyn[v->n_dyn++] = k;
        if (s->kind == SC_ARG && !s->conf) v->unconf[v->n_unconf++] = k;
    }
    v->prepared = true;
}

/* What two captures of one program (two versions: the same shapes, or two
 * extents of one dynamic program) tell about w's scalar slots from src's:
 * a slot src holds as a constant is one in w too (an argument equals its
 * scalar at every capture); one both hold as argument i is confirmed when
 * src's is, or when scalars[i] differed between the two captures. */
static bool same_program(const version *a, const version *b)
{
    return a != b && a->program_id == b->program_id && a->n_psc == b->n_psc && a->n_scalars == b->n_scalars;
}

static void learn_scalars(version *w, const version *src)
{
    if (!same_program(w, src)) return;
    for (int k = 0; k < w->n_psc; k++) {
        sc_src *s = &w->sc[k];
        const sc_src *o = &src->sc[k];
        if (s->kind != SC_ARG || s->conf) continue;
        if (o->kind == SC_CONST) {
            s->kind = SC_CONST;   /* .v holds its value at w's capture */
            w->prepared = false;
            continue;
        }
        if (o->kind != SC_ARG || o->trunc != s->trunc) continue;
        /* an op reads one fixed argument: where src's capture tells which
         * (no other argument had its value) and w's value allows it, w's
         * slot reads that one too */
        if (s->amb && !o->amb && o->idx != s->idx && o->idx < w->n_scalars &&
            ctpu_scalar_bits(w->arg_val[o->idx]) == ctpu_scalar_bits(s->v)) {
            s->idx = o->idx;
            s->amb = false;
            w->prepared = false;
        }
        if (o->idx != s->idx) continue;
        if (s->amb && (!o->amb || o->conf)) {
            s->amb = false;
            w->prepared = false;
        }
        if (!s->amb && (o->conf || ctpu_scalar_bits(src->arg_val[s->idx]) != ctpu_scalar_bits(w->arg_val[s->idx]))) {
            s->conf = true;
            w->prepared = false;
        }
    }
}

/* A new version nv learns from every version of its program and teaches
 * them back, so a schedule's new value is confirmed once per program, not
 * once per extent or shape. */
static void share_scalars(ctpu_compiled *c, version *nv)
{
    for (const version *w = c->versions; w; w = w->next) learn_scalars(nv, w);
    for (version *w = c->versions; w; w = w->next) learn_scalars(w, nv);
}

/* Two captures of one shape with different scalars: what they tell is
 * shared, and old is dropped (nv replaces it). */
static void merge_confirmed(ctpu_compiled *c, version *old, version *nv)
{
    if (!same_program(old, nv)) return;
    learn_scalars(nv, old);
    version **pp = &c->versions;
    while (*pp && *pp != old) pp = &(*pp)->next;
    if (*pp) *pp = old->next;
    ctpu__cs_version_free(old);
    share_scalars(c, nv);
}

/* How many of version v's call-level guards the call fails (counts of
 * arguments, each input's dtype, rank and each extent, storage sharing,
 * the mode); at least 1 for a version whose guards do not hold. Only on a
 * miss: it picks the version a guard-failure reason is a diff against. */
static int guard_distance(const version *v, int n_in, ctpu_trec *const *inrec, int n_scalars, int n_out)
{
    int n = (n_in != v->n_user) + (n_scalars != v->n_scalars) + (n_out != v->n_out_user);
    for (int i = 0; i < n_in && i < v->n_user; i++) {
        const ctpu_vtype *was = &v->user_type[i], *now = &inrec[i]->type;
        n += was->dtype != now->dtype;
        if (was->ndim != now->ndim) n++;
        else
            for (int d = 0; d < was->ndim; d++) n += was->shape[d] != now->shape[d];
        int64_t rel;
        int same = ctpu__cs_same_input(inrec, i, &rel);
        n += same != v->user_same[i] || rel != v->user_rel[i];
    }
    n += v->precision != (uint8_t)ctpu_rt->precision || v->dbg != ctpu_rt->debug_checks;
    return n ? n : 1;
}

/* ... *extent: no version holds, but one differs only by an in-range
 * extent of its dynamic dims (a capture at this extent binds its program).
 * On a miss, why names the first failing guard of the closest version
 * (fewest guards failed; of those, the newest), as torch's
 * TORCH_LOGS=recompiles names each cache entry's failing guard. */
static version *find_version(ctpu_compiled *c, int n_in, const ctpu_tensor *in, ctpu_trec *const *inrec, int n_scalars,
                             int n_out, char *why, size_t len, version **dyn_of)
{
    why[0] = 0;
    *dyn_of = NULL;
    char w[192] = "";   /* (no version: no reason) */
    int best = INT_MAX;
    for (version *v = c->versions; v; v = v->next) {
        bool ext = false;
        if (ctpu__cs_guards_hold(v, n_in, in, inrec, n_scalars, n_out, w, sizeof w, &ext)) {
            if (!v->prepared) prepare(v);
            return v;
        }
        if (ext && !*dyn_of) *dyn_of = v;
        if (ext) continue;
        int d = guard_distance(v, n_in, inrec, n_scalars, n_out);
        if (d < best) {
            best = d;
            snprintf(why, len, "%s", w);
        }
    }
    if (!why[0]) snprintf(why, len, "%s", w);
    return NULL;
}

#define MAX_VERSIONS 64
/* The marks of version dv's dynamic dims, lent to unmarked inputs for a
 * capture (lent[i]: to take back after it). */
static void lend_marks(const version *dv, int n_in, ctpu_trec *const *inrec, bool *lent)
{
    for (int i = 0; i < n_in && i < 64; i++) {
        bool any = false;
        lent[i] = false;
        for (int d = 0; d < CTPU_MAX_DIMS && dv->user_dyn; d++) any |= dv->user_dyn[i][d].coef > 0;
        if (any && !inrec[i]->dyn) lent[i] = ctpu__rec_set_dyn(inrec[i], dv->user_dyn[i], inrec[i]->type.ndim);
    }
}

static void take_back_marks(int n_in, ctpu_trec *const *inrec, const bool *lent)
{
    for (int i = 0; i < n_in && i < 64; i++)
        if (lent[i]) ctpu__rec_set_dyn(inrec[i], NULL, 0);
}

/* A capture at dv's shapes or at another extent of its dynamic dims (dv's
 * marks lent); a new version of dv's program learns and shares what the
 * captures tell of the scalars. */
static ctpu_status capture_like(ctpu_compiled *c, const version *dv, int n_in, const ctpu_tensor *in,
                                ctpu_trec *const *inrec, int n_scalars, const double *scalars, int n_out,
                                ctpu_tensor *out)
{
    bool lent[64];
    lend_marks(dv, n_in, inrec, lent);
    const version *head = c->versions;
    ctpu_status st = run_capture(c, n_in, in, inrec, n_scalars, scalars, n_out, out);
    take_back_marks(n_in, inrec, lent);
    if (st == CTPU_OK && c->versions && c->versions != head) share_scalars(c, c->versions);
    return st;
}

/* A call at another in-range extent of version dv's dynamic inputs: a
 * capture at it, with dv's ranges on the inputs (a tensor the user did not
 * mark gets them for the capture only), so its flush finds the dynamic
 * program by its dynamic key and binds it at these extents (no compile).
 * Not a guard failure. The versions kept are bounded: past MAX_VERSIONS
 * the oldest goes. */
/* The fused cache's recompile reason for program id (its log's newest
 * record naming it as the new program), or "". */
static void cache_reason(uint64_t id, char *buf, size_t len)
{
    ctpu_recompile_rec recs[64];
    size_t n = ctpu_cache_recompiles(ctpu_rt->fused_cache, recs, 64);
    buf[0] = 0;
    for (size_t i = n; i-- > 0;)
        if (recs[i].new_program == id && !recs[i].structure) {
            snprintf(buf, len, "%s", recs[i].reason);
            return;
        }
}

/* The first input extent of this call that differs from version v's:
 * "input 0 dim 0: 4 -> 6". */
static void extent_change(const version *v, int n_in, ctpu_trec *const *inrec, char *buf, size_t len)
{
    snprintf(buf, len, "an input's dynamic extent");
    for (int i = 0; i < n_in && i < v->n_user; i++)
        for (int q = 0; q < v->user_type[i].ndim && q < inrec[i]->type.ndim; q++)
            if (v->user_type[i].shape[q] != inrec[i]->type.shape[q]) {
                snprintf(buf, len, "input %d dim %d: %lld -> %lld", i, q, (long long)v->user_type[i].shape[q],
                         (long long)inrec[i]->type.shape[q]);
                return;
            }
}

static ctpu_status capture_extent(ctpu_compiled *c, const version *dv, int n_in, const ctpu_tensor *in,
                                  ctpu_trec *const *inrec, int n_scalars, const double *scalars, int n_out,
                                  ctpu_tensor *out)
{
    c->info.dynamic_captures++;
    char change[96];
    extent_change(dv, n_in, inrec, change, sizeof change);
    uint64_t dyn_id = dv->program_id;   /* the dynamic program the capture should bind (for the reason) */
    for (const version *w = c->versions; w; w = w->next)
        if (ctpu_program_dyn_trace(w->prog)) { dyn_id = w->program_id; break; }
    const version *head = c->versions;
    ctpu_status st = capture_like(c, dv, n_in, in, inrec, n_scalars, scalars, n_out, out);
    /* specialised: the new version's program is none the step had (a bind
     * of the dynamic program, or of another version's, is not: dv may be an
     * out-of-range capture's static program, newer than the dynamic one) */
    bool seen = false;
    for (const version *w = head; w && c->versions && c->versions != head; w = w->next)
        seen |= w->program_id == c->versions->program_id;
    if (st == CTPU_OK && c->versions && c->versions != head && !seen) {
        /* the capture at this extent did not bind the dynamic program: a
         * value fn derives from the extent (a slice to B / 2, a host branch
         * on it) is static in the trace, so it keyed and compiled another
         * program, as torch.compile's guard on a specialised symbol
         * recompiles: a guard failure that counts toward the recompile
         * limit, with the cache's reason */
        c->recompiles++;
        c->info.guard_failures++;
        c->info.dynamic_captures--;   /* not a bind: a recapture */
        c->dyn_specialised = true;
        char cr[160], r[400];
        cache_reason(c->versions->program_id, cr, sizeof cr);
        snprintf(r, sizeof r, "%s in the dynamic range, but fn's trace specialises it: program %llu compiled, not "
                 "dynamic program %llu's bind%s%s%s", change, (unsigned long long)c->versions->program_id,
                 (unsigned long long)dyn_id, cr[0] ? " (" : "", cr, cr[0] ? ")" : "");
        note_reason(c, "guard failure", "guard failed: ", r);
    }
    int n = 0;
    for (version **pp = &c->versions; *pp; pp = &(*pp)->next)
        if (++n == MAX_VERSIONS) {
            versions_free_from(*pp);
            *pp = NULL;
            break;
        }
    return st;
}

/* TORCH_TPU_AUTO_DYNAMIC: the marks that make a guard failure against the
 * newest version v a change of one symbol's extent in dims v has static
 * (policy.c's rule: every such changed input extent equal to one symbol's,
 * old and new, or c x it, c an integer >= 2), over [2, 2^31-1] in that
 * symbol, with the dims v has dynamic already (an earlier automatic
 * recapture's: as torch.compile's automatic dynamic shapes, each size
 * that changes becomes dynamic, the ones before it stay); false when the
 * failure is anything else (dtype, rank, storage, a dynamic dim out of its
 * range, an input marked by the caller, no static dim changed). */
static bool auto_marks(const version *v, int n_in, ctpu_trec *const *inrec, int n_scalars, int n_out,
                       ctpu_dyndim (*d)[CTPU_MAX_DIMS])
{
    if (n_in != v->n_user || n_scalars != v->n_scalars || n_out != v->n_out_user || n_in > 64) return false;
    int64_t v0 = 0, v1 = 0;
    for (int i = 0; i < n_in; i++) {   /* the symbol: the changed static extent smallest before */
        const ctpu_vtype *was = &v->user_type[i], *now = &inrec[i]->type;
        if (inrec[i]->dyn || was->dtype != now->dtype || was->ndim != now->ndim) return false;
        for (int q = 0; q < was->ndim; q++) {
            const ctpu_dyndim *y = v->user_dyn ? &v->user_dyn[i][q] : NULL;
            if (y && y->coef > 0) {
                int64_t x = now->shape[q];
                if (x % y->coef || x / y->coef < y->lo || x / y->coef > y->hi) return false;
                continue;
            }
            if (was->shape[q] != now->shape[q] && (!v0 || was->shape[q] < v0)) { v0 = was->shape[q]; v1 = now->shape[q]; }
        }
    }
    if (v0 < 1 || v1 < 2 || v1 > 2147483647) return false;
    memset(d, 0, sizeof *d * (size_t)n_in);
    if (v->user_dyn) memcpy(d, v->user_dyn, sizeof *d * (size_t)n_in);
    for (int i = 0; i < n_in; i++) {
        const ctpu_vtype *was = &v->user_type[i], *now = &inrec[i]->type;
        for (int q = 0; q < was->ndim; q++) {
            if (was->shape[q] == now->shape[q] || d[i][q].coef > 0) continue;
            int64_t c = was->shape[q] / v0;
            if (was->shape[q] % v0 || now->shape[q] != c * v1 || c > 2147483647) return false;
            d[i][q] = (ctpu_dyndim){ 2, 2147483647, c };
        }
        int64_t rel;
        int same = ctpu__cs_same_input(inrec, i, &rel);
        if (same != v->user_same[i] || rel != v->user_rel[i]) return false;
    }
    return true;
}

/* The automatic recapture: the capture at these shapes with the changed
 * dims marked (ctpu_mark_dynamic's path: lent to the inputs for the capture
 * only, kept by the version as its dynamic dims), so its flush compiles the
 * dynamic program and later extents bind it (capture_extent). */
static ctpu_status capture_auto(ctpu_compiled *c, int n_in, const ctpu_tensor *in, ctpu_trec *const *inrec,
                                int n_scalars, const double *scalars, int n_out, ctpu_tensor *out,
                                ctpu_dyndim (*d)[CTPU_MAX_DIMS])
{
    bool lent[64];
    for (int i = 0; i < n_in; i++) {
        bool any = false;
        for (int q = 0; q < CTPU_MAX_DIMS; q++) any |= d[i][q].coef > 0;
        lent[i] = any && ctpu__rec_set_dyn(inrec[i], d[i], inrec[i]->type.ndim);
    }
    const version *head = c->versions;
    c->trial = true;
    ctpu_status st = run_capture(c, n_in, in, inrec, n_scalars, scalars, n_out, out);
    c->trial = false;
    take_back_marks(n_in, inrec, lent);
    if (c->auto_off && c->versions == head) {
        /* fn failed under the marks (a reshape valid only for some
         * extents): as torch.compile specialises a dim whose dynamic trace
         * fails, capture these shapes static; later failures do too */
        char r[192];
        snprintf(r, sizeof r, "off for this step: fn failed with the dims dynamic (%.120s); captured static",
                 c->trial_err);
        note_event(c, "automatic dynamic", r);
        return run_capture(c, n_in, in, inrec, n_scalars, scalars, n_out, out);
    }
    if (c->versions != head) {   /* the report's row: which dims are new ("input 0 dim 1, input 1 dim 1") */
        char dims[192] = "";
        size_t k = 0;
        for (int i = 0; i < n_in; i++)
            for (int q = 0; q < CTPU_MAX_DIMS && k < 120; q++)
                if (d[i][q].coef > 0 && !(head->user_dyn && head->user_dyn[i][q].coef > 0))
                    k += (size_t)snprintf(dims + k, sizeof dims - k, "%sinput %d dim %d", k ? ", " : "", i, q);
        char r[192];
        snprintf(r, sizeof r, "%.80s became dynamic over [2, 2147483647] (this capture compiled the dynamic program; "
                 "later extents bind it)", dims);
        note_event(c, "automatic dynamic", r);
    }
    return st;
}

/* The capture after a guard failure (why: its reason). As torch.compile's
 * recompile limit counts the frame's cache entries, which only a compile
 * that succeeded adds (torch/_dynamo/cache_size.py compute_cache_size,
 * exceeds_cache_size_limit), only a capture that made a version counts
 * against TORCH_TPU_RECOMPILE_LIMIT: fn returning an error does not. A
 * failed capture's error names the guard that sent the call to fn first
 * (a parameter released after the capture: "captured tensor released:
 * program input 3 (f32[12,16] w)", then the op inside fn that found it). */
static ctpu_status recapture(ctpu_compiled *c, const char *why, int n_in, const ctpu_tensor *in,
                             ctpu_trec *const *inrec, int n_scalars, const double *scalars, int n_out,
                             ctpu_tensor *out)
{
    const version *head = c->versions;
    ctpu_dyndim d[64][CTPU_MAX_DIMS];
    ctpu_status st;
    if (ctpu_rt->auto_dynamic && !c->auto_off && auto_marks(c->versions, n_in, inrec, n_scalars, n_out, d))
        st = capture_auto(c, n_in, in, inrec, n_scalars, scalars, n_out, out, d);
    else
        st = run_capture(c, n_in, in, inrec, n_scalars, scalars, n_out, out);
    if (c->versions != head) c->recompiles++;
    else if (st != CTPU_OK && ctpu_last_status() == st) {
        char msg[sizeof ctpu__ts->err_msg];
        snprintf(msg, sizeof msg, "%s", ctpu_last_error());
        ctpu_set_error(st, "compiled_call: compiled step %s: guard failed: %s; recapturing: %s", step_name(c), why, msg);
    }
    return st;
}

static ctpu_status call_dispatch(ctpu_compiled *c, int n_in, const ctpu_tensor *in, ctpu_trec **inrec, int n_scalars,
                                 const double *scalars, int n_out, ctpu_tensor *out)
{
    ctpu_runtime *rt = ctpu_rt;
    if (rt->compile_disable) { c->info.eager_calls++; return run_fn(c, in, scalars, n_out, out); }
    if (ctpu__capturing()) {
        /* nested inside another step's capture: a graph break there; this
         * step's fn runs inline, as defer and fuse */
        if (!ctpu__capture_break(CTPU_CUT_MODE, "a nested compiled_call")) return ctpu_last_status();
        c->info.eager_calls++;
        return run_fn(c, in, scalars, n_out, out);
    }
    if (ctpu__defer_has_nodes()) {
        ctpu_status fs = ctpu__defer_flush(CTPU_CUT_MODE);
        if (fs != CTPU_OK) return fs;
    }
    ctpu_status st = resolve_inputs(n_in, in, inrec);
    if (st != CTPU_OK) return st;
    ctpu__ts->label.op_no = 0;   /* a compiled call is a step: its ops are numbered from 1 (issue 11) */
    if (c->broken) { c->info.eager_calls++; return run_deferred(c, in, scalars, n_out, out); }
    if (c->skipped) { c->info.eager_calls++; return run_fn(c, in, scalars, n_out, out); }
    char why[192];
    version *dv;
    version *v = find_version(c, n_in, in, inrec, n_scalars, n_out, why, sizeof why, &dv);
    if (c->limited && !(v && !needs_confirm(v, scalars))) {
        /* past the recompile limit: the versions captured keep serving (as
         * torch.compile keeps its cache entries); an unseen shape, or a
         * value that would need a capture to confirm, runs fn in the
         * current mode */
        c->info.eager_calls++;
        return run_fn(c, in, scalars, n_out, out);
    }
    if (!v && dv && c->dyn_specialised && rt->recompile_limit && c->recompiles + 1 >= (uint64_t)rt->recompile_limit) {
        /* fn's trace has specialised an extent of its dynamic dims before
         * (each capture at a new extent compiled a program): past the limit
         * a new extent runs fn in the current mode, as a guard failure's */
        char change[96], lim[256];
        extent_change(dv, n_in, inrec, change, sizeof change);
        c->limited = true;
        c->info.guard_failures++;
        snprintf(lim, sizeof lim, "past TORCH_TPU_RECOMPILE_LIMIT=%zu (%llu versions captured): %.60s, an extent fn's "
                 "trace specialises; fn runs in the current mode", rt->recompile_limit,
                 (unsigned long long)(c->recompiles + 1), change);
        note_reason(c, "recompile limit", "", lim);
        c->info.eager_calls++;
        return run_fn(c, in, scalars, n_out, out);
    }
    if (!v && dv) return capture_extent(c, dv, n_in, in, inrec, n_scalars, scalars, n_out, out);
    if (v && needs_confirm(v, scalars)) {
        /* (capture_like shares what it tells with every version of the
         * program; the old one at these shapes is then dropped) */
        version *head = c->versions;
        st = capture_like(c, v, n_in, in, inrec, n_scalars, scalars, n_out, out);
        if (st == CTPU_OK && c->versions && c->versions != head) merge_confirmed(c, v, c->versions);
        return st;
    }
    if (v) {
        st = ctpu__cs_replay(v, in, inrec, scalars, out);
        if (st == CTPU_OK) c->info.replays++;
        return st;
    }
    if (c->versions) {
        c->info.guard_failures++;
        note_reason(c, "guard failure", "guard failed: ", why);
        if (rt->recompile_limit && c->recompiles + 1 >= (uint64_t)rt->recompile_limit) {
            /* torch: a frame holds at most cache_size_limit entries (the
             * first capture and its recaptures: 1 + recompiles versions);
             * past it the frame runs without compiling. As the fused
             * cache's per-structure limit, so no capture is made that the
             * cache would refuse to compile */
            c->limited = true;
            char lim[256];
            snprintf(lim, sizeof lim, "past TORCH_TPU_RECOMPILE_LIMIT=%zu (%llu versions captured): %.150s; fn runs in the "
                     "current mode", rt->recompile_limit, (unsigned long long)(c->recompiles + 1), why);
            note_reason(c, "recompile limit", "", lim);
            c->info.eager_calls++;
            return run_fn(c, in, scalars, n_out, out);
        }
        return recapture(c, why, n_in, in, inrec, n_scalars, scalars, n_out, out);
    }
    return run_capture(c, n_in, in, inrec, n_scalars, scalars, n_out, out);
}

static ctpu_status compiled_call_owned(ctpu_compiled *c, int n_in, const ctpu_tensor *in, int n_scalars,
                                       const double *scalars, int n_out, ctpu_tensor *out);

ctpu_status ctpu__compiled_call(ctpu_compiled *c, int n_in, const ctpu_tensor *in, int n_scalars, const double *scalars,
                                int n_out, ctpu_tensor *out)
{
    ctpu_status st = check_call_args(c, n_in, in, n_scalars, scalars, n_out, out);
    if (st != CTPU_OK) {
        for (int j = 0; out && n_out > 0 && n_out <= MAX_ARGS && j < n_out; j++) out[j] = CTPU_NULL;
        return st;
    }
    ctpu_thread_state *me = ctpu_ts();
    if (!me) {
        ctpu_set_error(CTPU_ERR_OOM, "compiled_call: out of host memory for this thread's state");
        return CTPU_ERR_OOM;
    }
    /* one call at a time per compiled step: a replay's scratch arrays and
     * counts belong to the step, not to the thread (a nested call of another
     * step from the same thread is a graph break; of this one, an error) */
    void *idle = NULL;
    bool owner = atomic_compare_exchange_strong(&c->owner, &idle, (void *)me);
    if (!owner && idle != (void *)me) {
        for (int j = 0; j < n_out; j++) out[j] = CTPU_NULL;
        ctpu_set_error(CTPU_ERR_STATE, "compiled_call: compiled step %s is inside a call on another thread "
                       "(one call at a time per compiled step; compile one step per thread)", c->name);
        return CTPU_ERR_STATE;
    }
    if (!owner) {   /* fn (or a step fn calls) calls c again: a recursion that would never end */
        for (int j = 0; j < n_out; j++) out[j] = CTPU_NULL;
        ctpu_set_error(CTPU_ERR_STATE, "compiled_call: compiled step %s is called from inside its own call "
                       "(its fn, or a step its fn calls, calls it again)", c->name);
        return CTPU_ERR_STATE;
    }
    /* out overlapping in (the caller passes one array for both): the call
     * reads its own copy of in, so writing out[j] never changes an input */
    ctpu_tensor in_inl[16], *in_copy = NULL;
    uintptr_t ib = (uintptr_t)in, ie = ib + sizeof *in * (size_t)n_in, ob = (uintptr_t)out;
    if (n_in > 0 && n_out > 0 && ib < ob + sizeof *out * (size_t)n_out && ob < ie) {
        in_copy = n_in <= 16 ? in_inl : malloc(sizeof *in * (size_t)n_in);
        if (!in_copy) {
            atomic_store(&c->owner, NULL);
            ctpu_set_error(CTPU_ERR_OOM, "compiled_call: out of host memory");
            return CTPU_ERR_OOM;
        }
        memcpy(in_copy, in, sizeof *in * (size_t)n_in);
        in = in_copy;
    }
    ctpu_status res = compiled_call_owned(c, n_in, in, n_scalars, scalars, n_out, out);
    if (in_copy != in_inl) free(in_copy);
    atomic_store(&c->owner, NULL);
    return res;
}

static ctpu_status compiled_call_owned(ctpu_compiled *c, int n_in, const ctpu_tensor *in, int n_scalars,
                                       const double *scalars, int n_out, ctpu_tensor *out)
{
    ctpu_status st;
    uint64_t t0 = now_ns(), replays0 = c->info.replays;
    ctpu_trec *inrec_inl[16];
    ctpu_trec **inrec = n_in <= 16 ? inrec_inl : malloc(sizeof *inrec * (size_t)n_in);
    if (!inrec) {
        ctpu_set_error(CTPU_ERR_OOM, "compiled_call: out of host memory");
        return CTPU_ERR_OOM;
    }
    ctpu_mode outer = ctpu_mode_now();
    st = call_dispatch(c, n_in, in, inrec, n_scalars, scalars, n_out, out);
    if (inrec != inrec_inl) free(inrec);
    if (st == CTPU_OK && outer == CTPU_MODE_DEBUG) {
        /* debug eager: wait, and report a device fault at the call */
        ctpu_device_wait(ctpu_rt->dev, 0);
        char msg[256];
        st = ctpu_device_take_error(ctpu_rt->dev, msg, sizeof msg);
        if (st != CTPU_OK) ctpu_set_error(st, "compiled_call: %s", msg);
    }
    if (st != CTPU_OK)
        for (int j = 0; j < n_out; j++) out[j] = ctpu_failed();   /* error handles: later ops keep the cause */
    uint64_t dt = now_ns() - t0;
    c->info.calls++;
    c->info.host_ns += dt;
    if (c->info.replays != replays0) c->info.replay_host_ns += dt;
    publish_info(c);
    return st;
}

bool ctpu_is_compiling(void) { return ctpu_rt && ctpu__capturing() != NULL; }

ctpu_status ctpu_compiled_get_info(const ctpu_compiled *c, ctpu_compiled_info *out)
{
    if (!live_has(c) || c->magic != COMPILED_MAGIC || !out) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "compiled_get_info: %s", !out ? "out is NULL" : c ? "c is not a compiled step (freed?)" : "c is NULL");
        return CTPU_ERR_INVALID_ARG;
    }
    if (ctpu_rt && c->epoch == ctpu_rt->epoch) {
        pthread_mutex_lock(&ctpu_rt->compiled_mu);
        *out = c->shown;
        pthread_mutex_unlock(&ctpu_rt->compiled_mu);
    } else {
        *out = c->info;   /* its runtime is gone: nobody else reads it */
    }
    return CTPU_OK;
}

/* A freed step stays a report row (its programs and tensors let go); past
 * MAX_RETIRED freed rows the oldest is dropped. */
void ctpu_compiled_free(ctpu_compiled *c)
{
    if (!live_has(c) || c->magic != COMPILED_MAGIC) return;
    if (atomic_load(&c->owner)) {   /* its call is running (its fn frees it, or another thread): refused */
        ctpu_set_error(CTPU_ERR_STATE, "ctpu_compiled_free: compiled step %s is inside a call (from its own fn, "
                       "or on another thread): not freed; free it after the call returns", c->name);
        return;
    }
    ctpu_runtime *rt = ctpu_rt;
    if (!rt || c->epoch != rt->epoch) {
        c->magic = 0;
        live_free(c);
        return;
    }
    c->freed_replaying = c->versions != NULL;
    versions_free(c);
    publish_info(c);
    ctpu_compiled *drop = NULL;
    pthread_mutex_lock(&rt->compiled_mu);
    c->magic = RETIRED_MAGIC;
    c->retired = true;
    int n = 0;
    ctpu_compiled **last = NULL;
    for (ctpu_compiled **pp = &rt->compiled; *pp; pp = &(*pp)->next)
        if ((*pp)->retired) { n++; last = pp; }
    if (n > MAX_RETIRED && last) {
        drop = *last;
        *last = drop->next;
    }
    pthread_mutex_unlock(&rt->compiled_mu);
    if (drop) {
        drop->magic = 0;
        live_free(drop);
    }
}

void ctpu__compiled_shutdown(ctpu_runtime *rt)
{
    pthread_mutex_lock(&rt->compiled_mu);
    for (ctpu_compiled *c = rt->compiled; c; c = c->next) versions_free(c);   /* the rows stay for the report */
    pthread_mutex_unlock(&rt->compiled_mu);
}

void ctpu__compiled_final(ctpu_runtime *rt)
{
    pthread_mutex_lock(&rt->compiled_mu);
    for (ctpu_compiled *c = rt->compiled, *n; c; c = n) {
        n = c->next;
        if (c->retired) {
            c->magic = 0;
            live_free(c);
        } else {
            c->epoch = 0;     /* a later call is CTPU_ERR_STATE; free only frees it */
        }
    }
    rt->compiled = NULL;
    pthread_mutex_unlock(&rt->compiled_mu);
}

/* The report's rows (report.c's metrics JSON), oldest first. */
void ctpu__compiled_json(cJSON *doc, ctpu_runtime *rt)
{
    cJSON *arr = cJSON_AddArrayToObject(doc, "compiled_steps");
    pthread_mutex_lock(&rt->compiled_mu);
    for (const ctpu_compiled *c = rt->compiled; c && arr; c = c->next) {
        const ctpu_compiled_info *i = &c->shown;
        cJSON *o = cJSON_CreateObject();
        if (!o) break;
        cJSON_AddNumberToObject(o, "id", (double)c->id);
        cJSON_AddStringToObject(o, "name", c->name);
        cJSON_AddBoolToObject(o, "fullgraph", c->fullgraph);
        cJSON_AddBoolToObject(o, "freed", c->retired);
        cJSON_AddStringToObject(o, "state", c->shown_state ? c->shown_state : "");
        cJSON_AddNumberToObject(o, "versions", c->shown_versions);
        cJSON_AddNumberToObject(o, "calls", (double)i->calls);
        cJSON_AddNumberToObject(o, "captures", (double)i->captures);
        cJSON_AddNumberToObject(o, "replays", (double)i->replays);
        cJSON_AddNumberToObject(o, "guard_failures", (double)i->guard_failures);
        cJSON_AddNumberToObject(o, "dynamic_captures", (double)i->dynamic_captures);
        cJSON_AddNumberToObject(o, "graph_breaks", (double)i->graph_breaks);
        cJSON_AddNumberToObject(o, "eager_calls", (double)i->eager_calls);
        cJSON_AddNumberToObject(o, "host_ns", (double)i->host_ns);
        cJSON_AddNumberToObject(o, "host_us_per_call", i->calls ? (double)i->host_ns / 1e3 / (double)i->calls : 0);
        cJSON_AddNumberToObject(o, "replay_host_ns", (double)i->replay_host_ns);
        cJSON_AddNumberToObject(o, "host_us_per_replay",
                                i->replays ? (double)i->replay_host_ns / 1e3 / (double)i->replays : 0);
        cJSON_AddStringToObject(o, "last_reason", i->last_reason);
        cJSON_AddNumberToObject(o, "events_total", (double)c->n_events);
        cJSON *ev = cJSON_AddArrayToObject(o, "events");
        uint64_t first = c->n_events > N_EVENTS ? c->n_events - N_EVENTS : 0;
        for (uint64_t k = first; k < c->n_events && ev; k++) {
            const step_event *e = &c->events[k % N_EVENTS];
            cJSON *x = cJSON_CreateObject();
            if (!x) break;
            cJSON_AddNumberToObject(x, "call", (double)e->call);
            cJSON_AddStringToObject(x, "kind", e->kind);
            cJSON_AddStringToObject(x, "reason", e->reason);
            cJSON_AddItemToArray(ev, x);
        }
        cJSON_InsertItemInArray(arr, 0, o);   /* the list is newest first */
    }
    pthread_mutex_unlock(&rt->compiled_mu);
}
