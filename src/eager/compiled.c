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
 * input leaf) and one command: no fn, no recording, no key. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cJSON.h>

#include "eager.h"
#include "fuse/exec.h"

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
#define MAX_RETIRED 64                           /* freed steps the report keeps (the oldest go first) */
#define N_EVENTS 8                               /* the last guard failures and graph breaks a row lists */
#define MAX_ARGS 4096

enum { IN_USER, IN_OWNER, IN_CONST };
typedef struct {
    uint8_t kind;
    int32_t idx;               /* IN_USER: in[idx] */
    uint64_t owner;            /* IN_OWNER: the handle whose storage it is */
    int64_t delta;             /* bytes from the handle's offset */
    ctpu_buffer *buf;          /* IN_CONST: our ref */
    int32_t hs;                /* IN_OWNER: its row in the version's handle table */
} in_src;

enum { SC_CONST, SC_ARG, SC_SEED, SC_OFF };
typedef struct {
    uint8_t kind;
    int32_t idx;               /* SC_ARG: scalars[idx]; SC_SEED/SC_OFF: random draw idx */
    double v;                  /* SC_CONST */
    bool conf;                 /* SC_ARG: seen to follow scalars[idx] across two captures of the program */
    bool amb;                  /* SC_ARG: at its capture a later scalars[j] had the same bits (it may read j) */
    bool trunc;                /* SC_ARG: an integer operand (*_scalar_int, clamp_int): reads trunc(scalars[idx]) */
} sc_src;

enum { RQ_NONE, RQ_OUT, RQ_INPLACE, RQ_REBIND, RQ_GRAD };
typedef struct {
    uint8_t kind;
    int32_t out;               /* the program output it gets */
    uint64_t h;                /* RQ_INPLACE / RQ_REBIND: the tensor; RQ_GRAD: the leaf */
    int32_t hs;                /* h's row in the version's handle table */
    ctpu_vtype type;
} rq_t;

/* How a version uses a handle made before the call (bits of hrole). */
enum { H_READ = 1, H_ASSIGN = 2, H_INPLACE = 4, H_LEAF = 8 };

/* A draw from the generator during the capture, in order: n taken at
 * (seed, off); s: the first of the two scalar slots that read it (-1: none
 * does, a replay still takes n, as fn would); alias >= 0: no draw, slot s
 * reads draw alias's seed and offset (SDPA's backward reuses its forward's). */
typedef struct { int s, alias; uint64_t n, seed, off; } rng_note;

/* One capture: a program and how a call binds to it. */
typedef struct version {
    struct version *next;
    ctpu_program *prog;        /* our reference: an evicted program lives on for us */
    ctpu_program *run;         /* a dynamic program's launch bound at this version's extents (our ref), or NULL: prog */
    uint64_t program_id;
    int n_user, n_scalars, n_out_user;
    ctpu_vtype *user_type;     /* [n_user] guard: dtype and exact shape */
    ctpu_dyndim (*user_dyn)[CTPU_MAX_DIMS];   /* [n_user] ctpu_mark_dynamic's ranges at the capture, or NULL: none */
    int32_t *user_same;        /* [n_user] the first input sharing its storage at the capture */
    int64_t *user_rel;         /* [n_user] bytes from that input's offset to its own (views of one storage) */
    uint8_t precision;
    bool dbg;
    bool grad_mode;            /* guard: grad mode at the capture (torch.compile's global state guard) */
    uint8_t *user_ag;          /* [n_user] guard: ctpu__ag_kind of each input at the capture */
    int32_t *user_hsame;       /* [n_user] the first input that was the same handle at the capture */
    bool *user_bound;          /* [n_user] guard user_hsame: a leaf input, or an input the step assigns */
    /* [n_user] guard, for a non-leaf input whose history the step's
     * backward ran through (baked: its ops, scalars, saved values, leaves):
     * that history's id (ctpu__ag_history_id), or 0: not guarded */
    uint64_t *user_hist;
    /* guard: the capture's backward released autograd history made before
     * the call (no retain_graph; of a tensor fn reads, or an input's): the
     * next backward through it fails in eager, so no call replays this */
    bool hist_released;
    int n_pin, n_pout, n_psc, nreq, n_rng, n_no_grad;
    in_src *in;                /* [n_pin] */
    sc_src *sc;                /* [n_psc] */
    rq_t *rq;                  /* [nreq] */
    int32_t *alias_req;        /* [n_pout] request written in place, or -1 */
    int32_t *grad_rq;          /* [n_pout] the one RQ_GRAD request it feeds, or -1 */
    size_t *out_bytes;         /* [n_pout] */
    rng_note *rng;             /* [n_rng] */
    uint64_t *no_grad_leaf;    /* [n_no_grad] guard: no .grad at the call's start */
    int32_t *no_grad_in;       /* [n_no_grad] i when the leaf was in[i] (the call's in[i] is guarded), or -1 */
    int32_t *out_rq;           /* [n_out_user] request giving out[j], or -1 */
    uint64_t *out_fixed;       /* [n_out_user] a handle made before the call fn returned, or 0 */
    int32_t *out_in;           /* [n_out_user] the input fn returned as out[j] (each call's in[i]), or -1 */
    int32_t *out_prow;         /* [n_out_user] out_fixed names a row bound by position (an input's .grad), or -1 */
    int32_t *out_grad;         /* [n_out_user] fn returned RQ_GRAD request q's new .grad: the leaf's .grad, or -1 */
    /* out[j] a view fn made (no op recorded) of an input's storage (base i
     * >= 0) or of a tensor the step reads (row h: base -2 - h), -1: none;
     * each replay makes it anew on that call's storage: its type, at the
     * base's offset + delta bytes */
    int32_t *out_vbase;        /* [n_out_user] */
    /* [n_out_user] out[j] fn made on storage no input or older tensor
     * holds (ctpu_from_host inside fn: host data, baked): our ref, and a
     * handle ref so that no assign writes it in place; each replay returns
     * a new handle on it (out_vtype, at byte out_vdelta), or NULL */
    ctpu_buffer **out_cbuf;
    ctpu_vtype *out_vtype;     /* [n_out_user] */
    int64_t *out_vdelta;       /* [n_out_user] */
    /* [n_out_user] the view was taken of the storage row h had at the
     * call's start, before fn assigned it: made before the rebinds */
    bool *out_vold;
    double *arg_val;           /* [n_scalars] scalars[i] at the capture */
    /* the distinct handles it reads, assigns or whose .grad it writes: one
     * lookup each per call (the guards fill hrec; the binding reads it) */
    int n_h;
    uint64_t *hid;             /* [n_h] */
    uint8_t *hrole;            /* [n_h] H_* bits */
    uint8_t *hag;              /* [n_h] guard: ctpu__ag_kind of its tensor at the capture (a parameter frozen since) */
    ctpu_trec **hrec;          /* [n_h] this call's records (NULL: not live) */
    ctpu_trec **hslot;         /* [n_h] the slot each handle names (slots never move) */
    uint32_t *hgen;            /* [n_h] and its generation: live when the slot still has it */
    char (*hdesc)[160];        /* [n_h] for a guard failure: "program input 3 (f32[12,16] w)", at the capture */
    /* rows bound by position, as torch.compile binds inputs: a row that was
     * in[i], a leaf that requires grad, at the capture, or that leaf's
     * .grad, is at each call the call's in[i] or in[i]'s .grad, whatever
     * handle is passed (a new batch leaf each step) */
    int32_t *hpos;             /* [n_h] 2i: in[i]; 2i + 1: in[i]'s .grad; -1: the row's own handle */
    uint64_t *hnow;            /* [n_h] the handle the row names this call (hid, or the call's in[i] or its .grad) */
    int32_t *prow;             /* [n_prow] the rows bound by position */
    int n_prow;
    /* [n_h] a row that was the .grad of a leaf made before the call (not
     * an input): that leaf, whose .grad at each call the row names (hnow),
     * as an input leaf's binds by position: a backward outside the step
     * makes a new .grad handle each step; 0: the row's own handle */
    uint64_t *hleaf;
    /* guard: fn read ctpu_grad of these leaves made before the call (the
     * optimizer skips one without a .grad): each has a .grad, or not, as
     * at the capture (pytorch/pytorch#121291) */
    struct grad_seen { uint64_t leaf; bool has; } *gobs;
    int n_gobs;
    /* guard: fn asked ctpu_requires_grad of these tensors made before the
     * call (a host branch): each of the same autograd kind */
    struct kind_seen { uint64_t t; uint8_t kind; } *kobs;
    int n_kobs;
    uint64_t *inplace_ids;     /* [n_inplace] the H_INPLACE handles, sorted */
    int n_inplace;
    /* the program's scratch buffer, kept across replays: the device runs
     * commands in submission order, so the next replay's command writes it
     * only after the previous one finished with it */
    ctpu_buffer *scratch;
    /* per call (a compiled step runs one call at a time): output buffers */
    ctpu_buffer **outb;        /* [n_pout] */
    size_t *outo;              /* [n_pout] */
    uint8_t *outk;             /* [n_pout] OUT_FRESH (our ref) / OUT_HELD (a handle holds it) / OUT_REUSED (old .grad) */
    /* the scalars' template: constants in place, the rest patched per call
     * (built at the first replay: a confirmation turns arguments to constants) */
    bool prepared;
    double *sc_tmpl;           /* [n_psc] */
    int32_t *sc_dyn;           /* [n_psc] slots of arguments and random draws */
    int n_dyn;
    int32_t *unconf;           /* [n_psc] argument slots not yet confirmed */
    int n_unconf;
    /* the replay's lists, built with the version (each call walks only its own) */
    int32_t *fresh_o;          /* [n_fresh] outputs not written in place: a reused old .grad or a fresh buffer */
    int n_fresh;
    int32_t *held_hs;          /* [n_pout] the handle row whose storage output o is written in place into, or -1 */
    int32_t *pub_q;            /* [n_pub] requests a call publishes: rebinds and new .grads */
    int n_pub;
    /* the capture's provenance of the program's steps (the device's
     * ctpu_cmd prov, n_prov, prov_span), lent to every replay's command so
     * that its faults name the ops and calls fn made (as the capture's
     * did: a compiled call numbers its ops from 1 as each capture does);
     * freed once the last command that borrowed it has run (prov_seq) */
    ctpu_op_prov *prov;
    int n_prov;
    bool prov_span;
    uint64_t prov_seq;
    /* the binding cache: bound when every per-handle guard held at
     * bound_epoch (ctpu__bind_epoch, device.h) and nothing bumped it through
     * the replay after: while the epoch stays there, hrec, the held and
     * reused outputs (outb, outo, outk) and the handles' program inputs
     * (pin_b, pin_o) are as the last call found them, and a call checks only
     * its own inputs and the call-level guards. check_epoch: the epoch read
     * before this call's handle guards; bindable: they watched every buffer
     * they rely on (ctpu_buffer.watched). */
    bool bound, bindable;
    uint64_t bound_epoch, check_epoch;
    ctpu_buffer **pin_b;       /* [n_pin] the program inputs' buffers and offsets at the last call */
    size_t *pin_o;
    int32_t *pin_user;         /* [n_pin_user] the IN_USER program inputs (each call's in[i]) */
    int n_pin_user;
} version;

enum { OUT_FRESH = 1, OUT_HELD, OUT_REUSED };

/* A guard failure, graph break or fallback, for the report's rows. */
typedef struct {
    uint64_t call;                 /* the call it happened in, from 1 */
    const char *kind;              /* "guard failure", "graph break", "not replayable", "recompile limit", "skipped" */
    char reason[192];
} step_event;

struct ctpu_compiled {
    uint64_t magic, epoch, id;
    struct ctpu_compiled *next;    /* the runtime's list */
    ctpu_step_fn fn;
    void *ctx;
    char name[64];
    bool fullgraph;
    bool broken;                   /* a graph break: every call runs as defer and fuse */
    bool limited;                  /* past the recompile limit: every call runs fn in the current mode */
    bool skipped;                  /* fn recorded no device op: every call runs fn in the current mode */
    bool trial;                    /* the next capture is an automatic-dynamic trial: abandoned if fn fails */
    bool auto_off;                 /* a trial failed: guard failures recapture static from now on */
    bool outlived;                 /* a capture failed once because fn kept a tensor it made: the next one is the last try */
    char trial_err[192];           /* the failed trial's error */
    bool freed_replaying;          /* freed while it had versions: the report's row keeps "replays" */
    uint64_t recompiles;           /* guard failures whose capture made a version: what the recompile limit counts */
    bool dyn_specialised;          /* a capture at an in-range extent compiled its own program (capture_extent) */
    _Atomic(void *) owner;         /* the thread state of the thread inside a call, NULL when idle */
    version *versions;
    ctpu_compiled_info info;       /* the calling thread's counts */
    /* under rt->compiled_mu: what get_info and the report read */
    ctpu_compiled_info shown;
    const char *shown_state;
    int shown_versions;
    bool retired;                  /* ctpu_compiled_free'd: a report row only */
    uint64_t n_events;
    step_event events[N_EVENTS];   /* ring: events[i % N_EVENTS] */
};

typedef struct { uint64_t leaf, g; bool zeroed; } grad_note;

struct ctpu_capture {
    ctpu_compiled *c;
    bool broken, refused, in_final, empty, op_failed;
    uint64_t scope_floor;          /* scopes opened from here on are the call's (fn's handles) */
    uint64_t ag_pass0;             /* backward passes from here on are fn's (ctpu__ag_pass_next) */
    uint64_t ag_seq0;              /* autograd nodes from here on are fn's (ctpu__ag_seq_next) */
    bool hist_released;            /* fn's backward released history made before the call */
    char reason[192];
    int n_in, n_scalars, n_out;
    const double *scalars;
    ctpu_tensor *out;
    ctpu_trec *const *inrec;
    rng_note *rng;
    int n_rng, cap_rng;
    uint64_t *assigned;
    int n_assigned, cap_assigned;
    uint64_t *fn_assigned;         /* tensors fn made and then assigned (ctpu__capture_note_assign) */
    int n_fn_assigned, cap_fn_assigned;
    uint64_t *zeroed;
    int n_zeroed, cap_zeroed;
    uint64_t *ints;                /* the recorded scalar slots that are integer operands (*_scalar_int, clamp_int) */
    int n_ints, cap_ints;
    grad_note *grads;
    int n_grads, cap_grads;
    grad_note *gread;              /* ctpu_grad of a leaf made before the call, before fn changed its .grad: g = has one */
    int n_gread, cap_gread;
    grad_note *kread;              /* ctpu_requires_grad of a tensor made before the call: g = its ctpu__ag_kind */
    int n_kread, cap_kread;
    version *made;                 /* built by the sink */
    bool *fn_made;                 /* [n_out] out[j] is a handle fn made (kept from its scope), not an input or older tensor */
    char fail[192];                /* why the capture cannot be replayed (not a break) */
    bool fail_outlives;            /* fail: fn kept a tensor it made (state made at its first call?) */
};

static bool push(void **arr, int *n, int *cap, size_t elem, const void *v)
{
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        void *p = realloc(*arr, (size_t)nc * elem);
        if (!p) return false;
        *arr = p;
        *cap = nc;
    }
    memcpy((char *)*arr + (size_t)*n * elem, v, elem);
    (*n)++;
    return true;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);   /* vDSO: ~20 ns (the thread CPU clock is a system call) */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A handle's record if the handle is live (no error set). */
static ctpu_trec *live_rec(uint64_t id)
{
    ctpu_tensor t = { id };
    if (id == 0) return NULL;
    uint32_t idx = ctpu_handle_slot(t);
    if (idx >= atomic_load_explicit(&ctpu_rt->n_slots, memory_order_acquire)) return NULL;
    ctpu_trec *r = ctpu_slot(idx);
    if (!atomic_load_explicit(&r->live, memory_order_relaxed) ||
        atomic_load_explicit(&r->gen, memory_order_relaxed) != ctpu_handle_gen(t))
        return NULL;
    return r;
}

static bool vtype_eq(const ctpu_vtype *a, const ctpu_vtype *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

static void version_free(version *v)
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
        version_free(v);
    }
}

static void versions_free(ctpu_compiled *c)
{
    versions_free_from(c->versions);
    c->versions = NULL;
}

static const char *step_name(const ctpu_compiled *c) { return c->name; }

/* ------------------------------------------------------------ capture hooks */
static struct ctpu_capture *cap_now(void) { return ctpu__capturing(); }

/* Where a graph break is, in issue 11's numbering (ops numbered from 1 in
 * each step, in dispatch order, and the innermost ctpu_label_push label):
 * a host read, a collective or the op past the capture's length limit is
 * itself numbered (the number it takes next); a mode change, a nested
 * compiled call or another cut comes after the op numbered last. */
static void break_where(int why, char *buf, size_t len)
{
    const ctpu_thread_state *s = ctpu__ts;
    bool is_op = why == CTPU_CUT_HOST_READ || why == CTPU_CUT_COLLECTIVE || why == CTPU_CUT_LIMIT;
    uint32_t no = s->label.op_no + (is_op ? 1 : 0);
    int d = s->label.depth;
    const char *l = d ? ctpu_device_label(ctpu_rt->dev, s->label.stack[d - 1]) : NULL;
    snprintf(buf, len, "%s op #%u%s%.64s%s", is_op ? "at" : "after", no, l ? ", \"" : "", l ? l : "", l ? "\"" : "");
}

bool ctpu__capture_break(int why, const char *what)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap || cap->in_final) return true;
    const char *hr = ctpu__ts->label.host_read;
    char where[96], reason[192];
    break_where(why, where, sizeof where);
    snprintf(reason, sizeof reason, "graph break (%.64s): %.80s%s%.24s", where, what, hr[0] && why == CTPU_CUT_HOST_READ ? " at " : "",
             why == CTPU_CUT_HOST_READ ? hr : "");
    if (cap->c->fullgraph) {
        if (!cap->refused) snprintf(cap->reason, sizeof cap->reason, "%s", reason);
        cap->refused = cap->broken = true;
        ctpu_set_error(CTPU_ERR_STATE, "compiled step %s: fullgraph: %s", step_name(cap->c), reason);
        return false;
    }
    if (!cap->broken) snprintf(cap->reason, sizeof cap->reason, "%s", reason);
    cap->broken = true;
    return true;
}

bool ctpu__capture_host_effect(const char *what)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap || cap->in_final) return true;
    return ctpu__capture_break(CTPU_CUT_MODE, what);
}

/* A graph break for what fn did to r, a tensor made before the call (its
 * scope is older than the call's, or global); fn's own tensors are free. */
static bool pre_call_break(const ctpu_trec *r, const char *what, const char *prefix)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap || cap->in_final || (r->scope_id != 0 && r->scope_id >= cap->scope_floor)) return true;
    char buf[96];   /* (a break's reason keeps 80 bytes of it) */
    const char *nm = ctpu_rec_name(r);
    snprintf(buf, sizeof buf, "%s%s%.28s", what, nm[0] ? prefix : "", nm);
    return ctpu__capture_break(CTPU_CUT_MODE, buf);
}

bool ctpu__capture_note_release(const ctpu_trec *r)
{
    return pre_call_break(r, "release of a tensor made before the call", ": ");
}

bool ctpu__capture_note_requires_grad(const ctpu_trec *r)
{
    return pre_call_break(r, "set_requires_grad of a tensor made before the call", " ");
}

bool ctpu__capture_note_history(const ctpu_trec *r)
{
    return pre_call_break(r, "assign with grad on: autograd history for a tensor made before the call", " ");
}

void ctpu__capture_cut(int why)
{
    static const char *const names[CTPU_CUT_COUNT] = { "mark_step", "host read", "sync", "loop", "trace length limit",
                                                       "mode change", "collective" };
    struct ctpu_capture *cap = cap_now();
    if (!cap || cap->in_final || cap->broken) return;
    char what[64];
    snprintf(what, sizeof what, "a trace cut (%s)", why >= 0 && why < CTPU_CUT_COUNT ? names[why] : "?");
    if (!ctpu__capture_break(why, what)) {
        /* the cut happens anyway (it was not asked for: a limit, a collective) */
        cap->broken = true;
    }
}

void ctpu__capture_note_take(uint64_t n, uint64_t seed, uint64_t offset)
{
    struct ctpu_capture *cap = cap_now();
    rng_note r = { -1, -1, n, seed, offset };
    if (cap && !push((void **)&cap->rng, &cap->n_rng, &cap->cap_rng, sizeof r, &r))
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

void ctpu__capture_note_rng(int s, const double *sc)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap) return;
    uint64_t seed = ctpu_scalar_bits(sc[0]), off = ctpu_scalar_bits(sc[1]);
    for (int k = cap->n_rng - 1; k >= 0; k--) {
        rng_note *d = &cap->rng[k];
        if (d->alias >= 0 || d->seed != seed || d->off != off) continue;
        if (d->s < 0) { d->s = s; return; }   /* the draw's own op */
        rng_note r = { s, k, 0, seed, off };  /* another op reads the same draw */
        if (!push((void **)&cap->rng, &cap->n_rng, &cap->cap_rng, sizeof r, &r))
            snprintf(cap->fail, sizeof cap->fail, "out of host memory");
        return;
    }
    /* a draw before the capture (SDPA's backward of a forward outside it):
     * its seed and offset stay the values it was given */
}

static bool contains(const uint64_t *a, int n, uint64_t x);

void ctpu__capture_note_assign(uint64_t h)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap) return;
    /* a tensor fn made (from host data, a view of an input or of an older
     * tensor) is fn's own value, not a tensor each replay writes: noted
     * apart, so that its assign is never in place (its old storage is what
     * the next replay reads) and out[j] is a new tensor at every call */
    const ctpu_trec *r = live_rec(h);
    bool own = r && r->scope_id != 0 && r->scope_id >= cap->scope_floor;
    bool ok = own ? push((void **)&cap->fn_assigned, &cap->n_fn_assigned, &cap->cap_fn_assigned, sizeof h, &h)
                  : push((void **)&cap->assigned, &cap->n_assigned, &cap->cap_assigned, sizeof h, &h);
    if (!ok) snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

bool ctpu__capture_fn_assigned(uint64_t h)
{
    const struct ctpu_capture *cap = cap_now();
    return cap && contains(cap->fn_assigned, cap->n_fn_assigned, h);
}

void ctpu__capture_note_int(int s)
{
    struct ctpu_capture *cap = cap_now();
    uint64_t b = (uint64_t)s;
    if (cap && !push((void **)&cap->ints, &cap->n_ints, &cap->cap_ints, sizeof b, &b))
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

void ctpu__capture_note_zero_grad(uint64_t leaf)
{
    struct ctpu_capture *cap = cap_now();
    if (cap && !push((void **)&cap->zeroed, &cap->n_zeroed, &cap->cap_zeroed, sizeof leaf, &leaf))
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

void ctpu__capture_note_released(uint64_t seq)
{
    struct ctpu_capture *cap = cap_now();
    if (cap && seq < cap->ag_seq0) cap->hist_released = true;
}

void ctpu__capture_note_grad(uint64_t leaf, uint64_t g)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap) return;
    grad_note n = { leaf, g, false };
    for (int i = 0; i < cap->n_zeroed; i++) n.zeroed |= cap->zeroed[i] == leaf;
    if (!push((void **)&cap->grads, &cap->n_grads, &cap->cap_grads, sizeof n, &n))
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

/* t, read by fn during this capture, is a tensor made before the call
 * that is not one of its inputs (an input's .grad and kind are guarded by
 * position; fn's own tensors are fn's): the one a read notes, or NULL. */
static struct ctpu_capture *older_read(uint64_t t)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap || cap->in_final) return NULL;
    const ctpu_trec *r = live_rec(t);
    if (!r || (r->scope_id != 0 && r->scope_id >= cap->scope_floor)) return NULL;
    for (int i = 0; i < cap->n_in; i++)
        if (cap->inrec[i] == r) return NULL;
    return cap;
}

void ctpu__capture_note_grad_read(uint64_t leaf, bool has)
{
    struct ctpu_capture *cap = older_read(leaf);
    if (!cap) return;
    for (int i = 0; i < cap->n_zeroed; i++)
        if (cap->zeroed[i] == leaf) return;   /* fn dropped it first: not the call's start */
    for (int i = 0; i < cap->n_grads; i++)
        if (cap->grads[i].leaf == leaf) return;   /* fn's backward made it */
    for (int i = 0; i < cap->n_gread; i++)
        if (cap->gread[i].leaf == leaf) return;
    grad_note n = { leaf, has, false };
    if (!push((void **)&cap->gread, &cap->n_gread, &cap->cap_gread, sizeof n, &n))
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

void ctpu__capture_note_kind_read(uint64_t t, int kind)
{
    struct ctpu_capture *cap = older_read(t);
    if (!cap) return;
    for (int i = 0; i < cap->n_grads; i++)
        if (cap->grads[i].g == t) return;   /* a .grad fn's backward made (in no scope) */
    for (int i = 0; i < cap->n_kread; i++)
        if (cap->kread[i].leaf == t) return;
    grad_note n = { t, (uint64_t)kind, false };
    if (!push((void **)&cap->kread, &cap->n_kread, &cap->cap_kread, sizeof n, &n))
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

/* ------------------------------------------------------------ the sink: building a version */
typedef struct {
    struct ctpu_capture *cap;
    const ctpu_capture_sink *s;
    version *v;
    in_src *rsrc;                  /* [n_rin] per recorded input */
    bool *resolved;
    uint64_t *vowner;              /* [n_out] older tensors out[j] views and the step does not read: rows */
    int n_vowner;
} build_ctx;

/* out[j] of this capture is a handle fn made (an output kept from fn's
 * scope: at the sink, its only handles still live besides older ones). */
static bool fn_made(const struct ctpu_capture *cap, uint64_t id)
{
    for (int j = 0; cap->fn_made && j < cap->n_out; j++)
        if (cap->fn_made[j] && cap->out[j].id == id) return true;
    return false;
}

static bool contains(const uint64_t *a, int n, uint64_t x)
{
    for (int i = 0; i < n; i++)
        if (a[i] == x) return true;
    return false;
}

/* Each recorded input: in[i], an assigned tensor's own storage, or (one
 * pass over the handle table) a tensor made before the call; else a
 * constant buffer. */
static void classify_inputs(build_ctx *b)
{
    const ctpu_capture_sink *s = b->s;
    struct ctpu_capture *cap = b->cap;
    int unresolved = 0;
    for (int r = 0; r < s->n_rin; r++) {
        in_src *x = &b->rsrc[r];
        for (int i = 0; i < cap->n_in && !b->resolved[r]; i++)
            if (cap->inrec[i]->buf == s->rin_buf[r]) {
                *x = (in_src){ .kind = IN_USER, .idx = i,
                               .delta = (int64_t)s->rin_off[r] - (int64_t)cap->inrec[i]->off };
                b->resolved[r] = true;
            }
        for (int q = 0; q < s->nreq && !b->resolved[r]; q++)
            if (s->reqs[q].alias_buf == s->rin_buf[r]) {
                *x = (in_src){ .kind = IN_OWNER, .owner = s->rh[q],
                               .delta = (int64_t)s->rin_off[r] - (int64_t)s->rrec[q]->off };
                b->resolved[r] = true;
            }
        /* an assigned tensor's old storage, rebound (a view of it, such as
         * a slice, was alive): read through that tensor, not the view (the
         * view is gone by the next call) */
        for (int q = 0; q < s->nreq && !b->resolved[r]; q++)
            if (s->rrec[q] && s->rrec[q]->buf == s->rin_buf[r] && live_rec(s->rh[q]) == s->rrec[q] &&
                !contains(cap->fn_assigned, cap->n_fn_assigned, s->rh[q])) {
                *x = (in_src){ .kind = IN_OWNER, .owner = s->rh[q],
                               .delta = (int64_t)s->rin_off[r] - (int64_t)s->rrec[q]->off };
                b->resolved[r] = true;
            }
        unresolved += !b->resolved[r];
    }
    if (unresolved) {
        uint32_t n = atomic_load_explicit(&ctpu_rt->n_slots, memory_order_acquire);
        for (uint32_t idx = 0; idx < n && unresolved; idx++) {
            ctpu_trec *rec = ctpu_slot(idx);
            if (!atomic_load_explicit(&rec->live, memory_order_relaxed) || ctpu_rec_pending(rec) || !rec->buf) continue;
            uint64_t id = ((uint64_t)atomic_load_explicit(&rec->gen, memory_order_relaxed) << 32) | (idx + 1);
            if (fn_made(cap, id)) continue;   /* fn's own output (host data it made): the capture's value */
            for (int r = 0; r < s->n_rin; r++) {
                if (b->resolved[r] || s->rin_buf[r] != rec->buf) continue;
                b->rsrc[r] = (in_src){ .kind = IN_OWNER, .owner = id,
                                       .delta = (int64_t)s->rin_off[r] - (int64_t)rec->off };
                b->resolved[r] = true;
                unresolved--;
            }
        }
    }
    for (int r = 0; r < s->n_rin; r++) {
        if (b->resolved[r]) continue;
        ctpu_buffer_retain(s->rin_buf[r]);
        b->rsrc[r] = (in_src){ .kind = IN_CONST, .buf = s->rin_buf[r], .delta = (int64_t)s->rin_off[r] };
    }
}

static sc_src classify_scalar(const struct ctpu_capture *cap, int r, double val)
{
    for (int k = 0; k < cap->n_rng; k++) {
        if (cap->rng[k].s < 0) continue;
        if (r == cap->rng[k].s) return (sc_src){ .kind = SC_SEED, .idx = k };
        if (r == cap->rng[k].s + 1) return (sc_src){ .kind = SC_OFF, .idx = k };
    }
    uint64_t bits = ctpu_scalar_bits(val);
    if (contains(cap->ints, cap->n_ints, (uint64_t)r)) {
        /* an integer operand: fn converted scalars[i] to an integer (C's
         * cast truncates; an integral value is itself), so a replay gives
         * trunc(scalars[i]), never a fraction an int op could not get */
        for (int i = 0; i < cap->n_scalars; i++)
            if (ctpu_scalar_bits(trunc(cap->scalars[i]) + 0.0) == bits) {   /* (+ 0.0: trunc(-0.5) is -0, the cast 0) */
                bool amb = false;
                for (int j = i + 1; j < cap->n_scalars && !amb; j++)
                    amb = ctpu_scalar_bits(trunc(cap->scalars[j]) + 0.0) == bits;
                return (sc_src){ .kind = SC_ARG, .idx = i, .v = val, .amb = amb, .trunc = true };
            }
    }
    for (int i = 0; i < cap->n_scalars; i++)
        if (ctpu_scalar_bits(cap->scalars[i]) == bits) {
            bool amb = false;
            for (int j = i + 1; j < cap->n_scalars && !amb; j++) amb = ctpu_scalar_bits(cap->scalars[j]) == bits;
            return (sc_src){ .kind = SC_ARG, .idx = i, .v = val, .amb = amb };
        }
    return (sc_src){ .kind = SC_CONST, .v = val };
}

/* out[j] that is an assigned tensor made before the call (fn returned the
 * parameter it updates): each replay returns that handle, or the call's
 * own in[i] when it is an input, never a new handle on the program output
 * (the capture's pending handle is the tensor itself). */
static void set_returned_assigned(version *v, const struct ctpu_capture *cap, uint64_t h)
{
    for (int j = 0; j < cap->n_out; j++) {
        if (cap->out[j].id != h) continue;
        v->out_rq[j] = -1;
        v->out_fixed[j] = v->out_in[j] >= 0 ? 0 : h;
    }
}

/* The first i whose in[i] was handle h, a leaf that requires grad, at the
 * capture (its .grad is bound by position), or -1. */
static int input_leaf(const version *v, const struct ctpu_capture *cap, uint64_t h)
{
    const ctpu_trec *r = live_rec(h);
    for (int i = 0; r && i < v->n_user; i++)
        if (v->user_ag[i] == 1 && cap->inrec[i] == r) return i;
    return -1;
}

/* Each live-out request: out[j], an assigned tensor made before the call
 * (in place or rebound), or a leaf's new .grad. False (cap->fail says why)
 * for anything else: a tensor made in the step that outlives it. */
static bool classify_requests(build_ctx *b)
{
    const ctpu_capture_sink *s = b->s;
    struct ctpu_capture *cap = b->cap;
    version *v = b->v;
    for (int q = 0; q < s->nreq; q++) {
        rq_t *x = &v->rq[q];
        int o = s->plan->req_out[q];
        *x = (rq_t){ .kind = RQ_NONE, .out = o, .type = s->rrec[q]->type };
        if (o < 0) continue;
        uint64_t h = s->rh[q];
        /* a tensor made before the call that fn assigns is written through
         * (in place or rebound) even when fn also returns it: out[j] is then
         * that handle itself, as eager gives (set_returned_assigned) */
        if (contains(cap->assigned, cap->n_assigned, h)) {
            x->kind = s->plan->alias_req[o] == q ? RQ_INPLACE : RQ_REBIND;
            x->h = h;
            set_returned_assigned(v, cap, h);
            continue;
        }
        /* a .grad backward made: set at each replay, even when fn also
         * returns it (out[j] is then the leaf's .grad, as eager's) */
        for (int g = 0; g < cap->n_grads && x->kind == RQ_NONE; g++) {
            if (cap->grads[g].g != h) continue;
            x->kind = RQ_GRAD;
            x->h = cap->grads[g].leaf;
            if (cap->grads[g].zeroed) continue;
            v->no_grad_in[v->n_no_grad] = input_leaf(v, cap, x->h);
            v->no_grad_leaf[v->n_no_grad++] = x->h;
        }
        for (int j = 0; j < cap->n_out; j++)
            if (cap->out[j].id == h) {
                if (x->kind == RQ_GRAD) v->out_grad[j] = q;
                else { v->out_rq[j] = q; x->kind = RQ_OUT; }
            }
        if (x->kind != RQ_NONE) continue;
        const char *nm = ctpu_rec_name(s->rrec[q]);
        char tb[96];
        cap->fail_outlives = true;
        snprintf(cap->fail, sizeof cap->fail, "a tensor made in the step outlives it and is not an output: %s%s%s (made by %s)",
                 nm, nm[0] ? " " : "", ctpu_fmt_type(&x->type, tb, sizeof tb),
                 s->rrec[q]->made_by ? s->rrec[q]->made_by : "?");
        return false;
    }
    return true;
}

/* An in-place target must be the tensor itself, never in[i]'s storage. */
static bool check_inplace(build_ctx *b)
{
    version *v = b->v;
    for (int k = 0; k < v->n_pin; k++)
        for (int q = 0; q < v->nreq; q++) {
            if (v->rq[q].kind != RQ_INPLACE || b->s->reqs[q].alias_buf != b->s->rin_buf[b->s->plan->in_src[k]]) continue;
            if (v->in[k].kind != IN_OWNER) {
                snprintf(b->cap->fail, sizeof b->cap->fail, "in[%d]'s storage is assigned by the step", v->in[k].idx);
                return false;
            }
            v->in[k].owner = v->rq[q].h;
        }
    return true;
}

/* The first input sharing in[i]'s storage (i itself when none does) and
 * how many bytes in[i] starts after it: a program input reading one of
 * them is bound to the first at a fixed offset, so both are guards. */
static int same_input(ctpu_trec *const *inrec, int i, int64_t *rel)
{
    for (int j = 0; j < i; j++)
        if (inrec[j]->buf == inrec[i]->buf) {
            *rel = (int64_t)inrec[i]->off - (int64_t)inrec[j]->off;
            return j;
        }
    *rel = 0;
    return i;
}

static bool version_alloc(version *v, const ctpu_capture_sink *s, const struct ctpu_capture *cap)
{
    const ctpu_launch_plan *pl = s->plan;
    v->n_user = cap->n_in;
    v->n_scalars = cap->n_scalars;
    v->n_out_user = cap->n_out;
    v->n_pin = pl->n_in;
    v->n_pout = pl->n_out;
    v->n_psc = pl->n_scal;
    v->nreq = s->nreq;
    v->n_rng = cap->n_rng;
    v->user_type = malloc(sizeof *v->user_type * ((size_t)v->n_user + 1));
    v->user_same = malloc(sizeof *v->user_same * ((size_t)v->n_user + 1));
    v->user_rel = calloc((size_t)v->n_user + 1, sizeof *v->user_rel);
    v->in = calloc((size_t)v->n_pin + 1, sizeof *v->in);
    v->sc = calloc((size_t)v->n_psc + 1, sizeof *v->sc);
    v->rq = calloc((size_t)v->nreq + 1, sizeof *v->rq);
    v->alias_req = malloc(sizeof *v->alias_req * ((size_t)v->n_pout + 1));
    v->grad_rq = malloc(sizeof *v->grad_rq * ((size_t)v->n_pout + 1));
    v->out_bytes = malloc(sizeof *v->out_bytes * ((size_t)v->n_pout + 1));
    v->rng = malloc(sizeof *v->rng * ((size_t)v->n_rng + 1));
    v->no_grad_leaf = malloc(sizeof *v->no_grad_leaf * ((size_t)cap->n_grads + 1));
    v->no_grad_in = malloc(sizeof *v->no_grad_in * ((size_t)cap->n_grads + 1));
    v->out_rq = malloc(sizeof *v->out_rq * ((size_t)v->n_out_user + 1));
    v->out_fixed = calloc((size_t)v->n_out_user + 1, sizeof *v->out_fixed);
    v->out_in = malloc(sizeof *v->out_in * ((size_t)v->n_out_user + 1));
    v->out_prow = malloc(sizeof *v->out_prow * ((size_t)v->n_out_user + 1));
    v->out_grad = malloc(sizeof *v->out_grad * ((size_t)v->n_out_user + 1));
    v->out_vbase = malloc(sizeof *v->out_vbase * ((size_t)v->n_out_user + 1));
    v->out_cbuf = calloc((size_t)v->n_out_user + 1, sizeof *v->out_cbuf);
    v->out_vtype = malloc(sizeof *v->out_vtype * ((size_t)v->n_out_user + 1));
    v->out_vdelta = malloc(sizeof *v->out_vdelta * ((size_t)v->n_out_user + 1));
    v->out_vold = calloc((size_t)v->n_out_user + 1, sizeof *v->out_vold);
    v->user_ag = calloc((size_t)v->n_user + 1, 1);
    v->user_hsame = malloc(sizeof *v->user_hsame * ((size_t)v->n_user + 1));
    v->user_bound = calloc((size_t)v->n_user + 1, sizeof *v->user_bound);
    v->user_hist = calloc((size_t)v->n_user + 1, sizeof *v->user_hist);
    v->arg_val = malloc(sizeof *v->arg_val * ((size_t)v->n_scalars + 1));
    v->outb = calloc((size_t)v->n_pout + 1, sizeof *v->outb);
    v->outo = calloc((size_t)v->n_pout + 1, sizeof *v->outo);
    v->outk = calloc((size_t)v->n_pout + 1, 1);
    v->sc_tmpl = malloc(sizeof *v->sc_tmpl * ((size_t)v->n_psc + 1));
    v->sc_dyn = malloc(sizeof *v->sc_dyn * ((size_t)v->n_psc + 1));
    v->unconf = malloc(sizeof *v->unconf * ((size_t)v->n_psc + 1));
    v->pin_b = calloc((size_t)v->n_pin + 1, sizeof *v->pin_b);
    v->pin_o = calloc((size_t)v->n_pin + 1, sizeof *v->pin_o);
    v->pin_user = calloc((size_t)v->n_pin + 1, sizeof *v->pin_user);
    if (!v->outb || !v->outo || !v->outk || !v->sc_tmpl || !v->sc_dyn || !v->unconf || !v->pin_b || !v->pin_o || !v->pin_user) return false;
    return v->user_type && v->user_same && v->user_rel && v->in && v->sc && v->rq && v->alias_req && v->grad_rq &&
           v->out_bytes && v->rng && v->no_grad_leaf && v->no_grad_in && v->out_rq && v->out_fixed && v->out_in &&
           v->out_prow && v->out_grad && v->out_vbase && v->out_cbuf && v->out_vtype && v->out_vdelta && v->out_vold &&
           v->user_ag && v->user_hsame && v->user_bound && v->user_hist && v->arg_val;
}

/* The guards' facts and the plan's copies. */
static void version_fill(version *v, const ctpu_capture_sink *s, const struct ctpu_capture *cap)
{
    const ctpu_launch_plan *pl = s->plan;
    for (int i = 0; i < v->n_user; i++) {
        v->user_type[i] = cap->inrec[i]->type;
        if (cap->inrec[i]->dyn && !v->user_dyn) v->user_dyn = calloc((size_t)v->n_user, sizeof *v->user_dyn);
        if (cap->inrec[i]->dyn && v->user_dyn) memcpy(v->user_dyn[i], cap->inrec[i]->dyn, sizeof v->user_dyn[i]);
        v->user_same[i] = same_input(cap->inrec, i, &v->user_rel[i]);
        v->user_ag[i] = (uint8_t)ctpu__ag_kind(cap->inrec[i]);
        v->user_hsame[i] = i;
        v->user_bound[i] = v->user_ag[i] == 1;
        if (v->user_ag[i] == 2 && ctpu__ag_history_reached(cap->inrec[i], cap->ag_pass0))
            v->user_hist[i] = ctpu__ag_history_id(cap->inrec[i]);
        for (int j = 0; j < i; j++)
            if (cap->inrec[j] == cap->inrec[i]) { v->user_hsame[i] = j; break; }
    }
    v->grad_mode = ctpu_grad_enabled();
    v->hist_released = cap->hist_released;
    v->precision = (uint8_t)ctpu_rt->precision;
    v->dbg = ctpu_debug_checks_now();   /* in the capture's defer and fuse: the runtime's setting, as dbg_now() */
    for (int o = 0; o < v->n_pout; o++) {
        v->alias_req[o] = pl->alias_req[o];
        v->out_bytes[o] = s->out_bytes ? s->out_bytes[o] : pl->out_bytes[o];
        v->grad_rq[o] = -1;
    }
    if (v->n_rng) memcpy(v->rng, cap->rng, sizeof *v->rng * (size_t)v->n_rng);
    for (int i = 0; i < v->n_scalars; i++) v->arg_val[i] = cap->scalars[i];
    for (int j = 0; j < v->n_out_user; j++) {
        v->out_rq[j] = -1;
        v->out_in[j] = -1;
        v->out_prow[j] = -1;
        v->out_grad[j] = -1;
        v->out_vbase[j] = -1;
        ctpu_trec *r = live_rec(cap->out[j].id);
        if (r && !ctpu_rec_pending(r)) v->out_fixed[j] = cap->out[j].id;   /* fn returned a tensor made before */
        for (int i = 0; r && i < v->n_user; i++)   /* an input returned: each call returns its own in[i] */
            if (cap->inrec[i] == r) { v->out_in[j] = i; v->out_fixed[j] = 0; break; }
    }
}

static int handle_row(version *v, uint64_t h, uint8_t role)
{
    for (int i = 0; i < v->n_h; i++)
        if (v->hid[i] == h) {
            v->hrole[i] |= role;
            return i;
        }
    v->hid[v->n_h] = h;
    v->hrole[v->n_h] = role;
    return v->n_h++;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool is_inplace_target(const version *v, uint64_t id)
{
    int lo = 0, hi = v->n_inplace;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v->inplace_ids[mid] == id) return true;
        if (v->inplace_ids[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return false;
}

/* Each handle row in words, while its tensor is live (the capture): the
 * first program input that reads it (the cache report's input numbers),
 * its type and name. Out of host memory: none (the guard says less). */
static void describe_rows(version *v)
{
    v->hdesc = malloc(sizeof *v->hdesc * ((size_t)v->n_h + 1));
    for (int h = 0; v->hdesc && h < v->n_h; h++) {
        const ctpu_trec *r = live_rec(v->hid[h]);
        int pin = -1;
        for (int k = 0; k < v->n_pin && pin < 0; k++)
            if (v->in[k].kind == IN_OWNER && v->in[k].hs == h) pin = k;
        char tb[64] = "", at[32] = "";
        if (r) ctpu_fmt_type(&r->type, tb, sizeof tb);
        if (pin >= 0) snprintf(at, sizeof at, "program input %d ", pin);
        if (v->hpos[h] >= 0) snprintf(at, sizeof at, "input %d%s ", v->hpos[h] / 2, v->hpos[h] & 1 ? "'s .grad" : "");
        const char *nm = r ? ctpu_rec_name(r) : "";
        const ctpu_trec *leaf = v->hleaf[h] ? live_rec(v->hleaf[h]) : NULL;
        if (leaf) nm = ctpu_rec_name(leaf)[0] ? ctpu_rec_name(leaf) : "a leaf";
        snprintf(v->hdesc[h], sizeof v->hdesc[h], "%s(%s%s%s%.40s)", at, tb, nm[0] ? " " : "", leaf ? ".grad of " : "", nm);
    }
}

/* Which rows name an input or an input leaf's .grad (hpos): the first
 * input that was the row's handle (a leaf whose .grad the step makes, or
 * a tensor it assigns, in place or rebound: each call's in[i] gets it, as
 * torch.compile's input mutation applies to the tensor passed that call),
 * or whose .grad it was, a leaf that requires grad at the capture. Which
 * inputs an assigned input is one handle with is guarded (user_bound):
 * fn's reads of in[j] after assigning in[i] saw the new value only if
 * they were one tensor. */
static bool bind_positions(version *v, const struct ctpu_capture *cap)
{
    v->hpos = malloc(sizeof *v->hpos * ((size_t)v->n_h + 1));
    v->hnow = malloc(sizeof *v->hnow * ((size_t)v->n_h + 1));
    v->prow = malloc(sizeof *v->prow * ((size_t)v->n_h + 1));
    if (!v->hpos || !v->hnow || !v->prow) return false;
    for (int h = 0; h < v->n_h; h++) {
        const ctpu_trec *r = live_rec(v->hid[h]);
        v->hpos[h] = -1;
        v->hnow[h] = v->hid[h];
        for (int i = 0; i < v->n_user && v->hpos[h] < 0; i++) {
            if (r == cap->inrec[i]) v->hpos[h] = 2 * i;
            else if (v->user_ag[i] == 1 && v->hid[h] == ctpu__ag_grad_id(cap->inrec[i])) v->hpos[h] = 2 * i + 1;
        }
        if (v->hpos[h] < 0) continue;
        v->prow[v->n_prow++] = h;
        for (int i = 0; !(v->hpos[h] & 1) && (v->hrole[h] & (H_ASSIGN | H_INPLACE)) && i < v->n_user; i++)
            if (cap->inrec[i] == r) v->user_bound[i] = true;
    }
    return true;
}

/* Which rows not bound by position are the .grad of a leaf made before
 * the call (hleaf): a row among them, else any live one. */
static bool bind_leaf_grads(version *v)
{
    v->hleaf = calloc((size_t)v->n_h + 1, sizeof *v->hleaf);
    if (!v->hleaf) return false;
    for (int h = 0; h < v->n_h; h++) {
        const ctpu_trec *g = live_rec(v->hid[h]);
        if (v->hpos[h] >= 0 || !g || !g->leaf_grad) continue;
        for (int k = 0; k < v->n_h && !v->hleaf[h]; k++) {
            const ctpu_trec *r = live_rec(v->hid[k]);
            if (r && ctpu__ag_grad_id(r) == v->hid[h]) v->hleaf[h] = v->hid[k];
        }
        uint32_t n = atomic_load_explicit(&ctpu_rt->n_slots, memory_order_acquire);
        for (uint32_t idx = 0; idx < n && !v->hleaf[h]; idx++) {
            ctpu_trec *r = ctpu_slot(idx);
            if (!atomic_load_explicit(&r->live, memory_order_relaxed) || !r->ag || ctpu__ag_grad_id(r) != v->hid[h]) continue;
            v->hleaf[h] = ((uint64_t)atomic_load_explicit(&r->gen, memory_order_relaxed) << 32) | (idx + 1);
        }
    }
    return true;
}

/* Storage an out[j] fn made may be a view of without the version having
 * a row for it: an input's, a program input's or a request's. */
static bool out_base_known(const build_ctx *b, const ctpu_buffer *buf)
{
    const version *v = b->v;
    const struct ctpu_capture *cap = b->cap;
    for (int i = 0; i < v->n_user; i++)
        if (cap->inrec[i]->buf == buf) return true;
    for (int k = 0; k < v->n_pin; k++) {
        const ctpu_trec *o = v->in[k].kind == IN_OWNER ? live_rec(v->in[k].owner) : NULL;
        if (v->in[k].kind == IN_OWNER && (b->s->rin_buf[b->s->plan->in_src[k]] == buf || (o && o->buf == buf)))
            return true;
    }
    for (int q = 0; q < v->nreq; q++) {
        const ctpu_trec *o = v->rq[q].kind != RQ_NONE && v->rq[q].kind != RQ_OUT ? live_rec(v->rq[q].h) : NULL;
        if (o && o->buf == buf) return true;
    }
    return false;
}

/* out[j] fn made as a view (detach, reshape) of a tensor made before the
 * call that the step does not otherwise read (out[0] = ctpu_detach(b)):
 * that tensor becomes a row, so each replay makes the view on its storage
 * then (the capture's handle ends with the caller's scope). False: out of
 * host memory. */
static bool view_owners(build_ctx *b)
{
    const struct ctpu_capture *cap = b->cap;
    const version *v = b->v;
    b->vowner = malloc(sizeof *b->vowner * ((size_t)cap->n_out + 1));
    if (!b->vowner) {
        snprintf(b->cap->fail, sizeof b->cap->fail, "out of host memory");
        return false;
    }
    for (int j = 0; j < cap->n_out; j++) {
        const ctpu_trec *r = v->out_fixed[j] && fn_made(cap, v->out_fixed[j]) ? live_rec(v->out_fixed[j]) : NULL;
        if (!r || !r->buf || out_base_known(b, r->buf)) continue;
        bool have = false;
        for (int i = 0; i < b->n_vowner && !have; i++) {
            const ctpu_trec *o = live_rec(b->vowner[i]);
            have = o && o->buf == r->buf;
        }
        if (have) continue;
        uint32_t n = atomic_load_explicit(&ctpu_rt->n_slots, memory_order_acquire);
        for (uint32_t idx = 0; idx < n; idx++) {
            ctpu_trec *rec = ctpu_slot(idx);
            if (!atomic_load_explicit(&rec->live, memory_order_relaxed) || ctpu_rec_pending(rec) || rec->buf != r->buf)
                continue;
            uint64_t id = ((uint64_t)atomic_load_explicit(&rec->gen, memory_order_relaxed) << 32) | (idx + 1);
            if (fn_made(cap, id)) continue;
            b->vowner[b->n_vowner++] = id;
            break;
        }
    }
    return true;
}

/* The handle table: every IN_OWNER input, every request naming a handle,
 * and each older tensor an out[j] view is taken of (map_out_views). */
static bool build_handles(version *v, const struct ctpu_capture *cap, const build_ctx *b)
{
    size_t n = (size_t)v->n_pin + (size_t)v->nreq + (size_t)b->n_vowner + 1;
    v->hid = malloc(sizeof *v->hid * n);
    v->hrole = malloc(n);
    v->hrec = calloc(n, sizeof *v->hrec);
    if (!v->hid || !v->hrole || !v->hrec) return false;
    for (int k = 0; k < v->n_pin; k++)
        if (v->in[k].kind == IN_OWNER) v->in[k].hs = handle_row(v, v->in[k].owner, H_READ);
    for (int q = 0; q < v->nreq; q++) {
        rq_t *r = &v->rq[q];
        if (r->kind == RQ_INPLACE) r->hs = handle_row(v, r->h, H_INPLACE);
        else if (r->kind == RQ_REBIND) r->hs = handle_row(v, r->h, H_ASSIGN);
        else if (r->kind == RQ_GRAD) r->hs = handle_row(v, r->h, H_LEAF);
    }
    for (int i = 0; i < b->n_vowner; i++) handle_row(v, b->vowner[i], H_READ);
    v->inplace_ids = malloc(sizeof *v->inplace_ids * ((size_t)v->n_h + 1));
    v->hslot = malloc(sizeof *v->hslot * ((size_t)v->n_h + 1));
    v->hgen = malloc(sizeof *v->hgen * ((size_t)v->n_h + 1));
    v->hag = malloc((size_t)v->n_h + 1);
    if (!v->inplace_ids || !v->hslot || !v->hgen || !v->hag || !bind_positions(v, cap) || !bind_leaf_grads(v)) return false;
    for (int h = 0; h < v->n_h; h++) {
        ctpu_tensor t = { v->hid[h] };
        v->hslot[h] = ctpu_slot(ctpu_handle_slot(t));   /* live at the capture: its slot exists */
        v->hgen[h] = ctpu_handle_gen(t);
        const ctpu_trec *r = live_rec(v->hid[h]);
        v->hag[h] = r ? (uint8_t)ctpu__ag_kind(r) : 0;
    }
    for (int h = 0; h < v->n_h; h++)   /* (a row bound by position is checked against the call's handle) */
        if ((v->hrole[h] & H_INPLACE) && v->hpos[h] < 0 && !v->hleaf[h]) v->inplace_ids[v->n_inplace++] = v->hid[h];
    describe_rows(v);
    qsort(v->inplace_ids, (size_t)v->n_inplace, sizeof *v->inplace_ids, cmp_u64);
    return true;
}

/* Outputs that feed exactly one new .grad may reuse the old .grad's storage. */
static void map_grads(version *v)
{
    for (int o = 0; o < v->n_pout; o++) {
        int n = 0, g = -1;
        for (int q = 0; q < v->nreq; q++)
            if (v->rq[q].out == o && v->rq[q].kind != RQ_NONE) {
                n++;
                if (v->rq[q].kind == RQ_GRAD) g = q;
            }
        v->grad_rq[o] = n == 1 ? g : -1;
    }
}

/* The replay's lists: which outputs need a buffer found or made, which are
 * written into a handle's own storage, which requests are published. */
static bool plan_replay(version *v)
{
    v->fresh_o = malloc(sizeof *v->fresh_o * ((size_t)v->n_pout + 1));
    v->held_hs = malloc(sizeof *v->held_hs * ((size_t)v->n_pout + 1));
    v->pub_q = malloc(sizeof *v->pub_q * ((size_t)v->nreq + 1));
    if (!v->fresh_o || !v->held_hs || !v->pub_q) return false;
    for (int o = 0; o < v->n_pout; o++) {
        int q = v->alias_req[o];
        v->held_hs[o] = q >= 0 ? v->rq[q].hs : -1;
        if (q < 0) v->fresh_o[v->n_fresh++] = o;
    }
    for (int q = 0; q < v->nreq; q++)
        if (v->rq[q].kind == RQ_REBIND || v->rq[q].kind == RQ_GRAD) v->pub_q[v->n_pub++] = q;
    for (int k = 0; k < v->n_pin; k++)
        if (v->in[k].kind == IN_USER) v->pin_user[v->n_pin_user++] = k;
    return true;
}

/* An out[j] fn made as a view (a new handle on existing storage, no op
 * recorded: detach, reshape, a transpose) of an input or of a tensor the
 * step reads: each replay makes it on that call's storage (the capture's
 * handle holds the capture's value, and its scope may have ended). A
 * tensor made before the call returned as itself stays fixed. */
/* The handle row whose storage holds a view on (buf, off) at the capture,
 * its offset from that row's in *delta: a live row's storage now, or (old
 * set) its storage at the call's start, which fn assigned after taking the
 * view (the row's pending record still holds it, or a program input read
 * it through the row): the view keeps that value, as eager's.
 * -1: none. */
static int view_base_row(const version *v, const ctpu_capture_sink *s, const ctpu_buffer *buf, size_t off,
                         int64_t *delta, bool *old)
{
    for (int h = 0; h < v->n_h; h++) {
        const ctpu_trec *b = live_rec(v->hid[h]);
        if (!b || b->buf != buf) continue;
        *delta = (int64_t)off - (int64_t)b->off;
        *old = ctpu_rec_pending(b);   /* an assigned tensor's storage before its rebind */
        return h;
    }
    for (int k = 0; k < v->n_pin; k++) {
        int r = s->plan->in_src[k];
        if (v->in[k].kind != IN_OWNER || s->rin_buf[r] != buf) continue;
        *delta = (int64_t)off - ((int64_t)s->rin_off[r] - v->in[k].delta);   /* from the row's offset */
        *old = true;
        return v->in[k].hs;
    }
    return -1;
}

/* An out[j] fn made as a view (a new handle on existing storage, no op
 * recorded: detach, reshape, a transpose) of an input or of a tensor the
 * step reads: each replay makes it on that call's storage (the capture's
 * handle holds the capture's value, and its scope may have ended). A
 * tensor made before the call returned as itself stays fixed. */
static void map_out_views(version *v, const struct ctpu_capture *cap, const ctpu_capture_sink *s)
{
    for (int j = 0; j < v->n_out_user; j++) {
        uint64_t id = v->out_fixed[j];
        const ctpu_trec *r = id ? live_rec(id) : NULL;
        if (!r || !r->buf) continue;
        bool own = false;
        for (int h = 0; h < v->n_h && !own; h++) {
            own = v->hid[h] == id;
            if (own && (v->hpos[h] >= 0 || v->hleaf[h])) v->out_prow[j] = h;   /* a leaf's .grad: this call's */
        }
        if (own) continue;
        int base = -1;
        int64_t delta = 0;
        bool old = false;
        for (int i = 0; i < v->n_user && base == -1; i++)
            if (cap->inrec[i]->buf == r->buf) {
                base = i;
                delta = (int64_t)r->off - (int64_t)cap->inrec[i]->off;
                old = ctpu_rec_pending(cap->inrec[i]);   /* an assigned input's storage before its rebind */
            }
        if (base == -1) {
            int h = view_base_row(v, s, r->buf, r->off, &delta, &old);
            if (h >= 0) base = -2 - h;
        }
        if (base == -1 && fn_made(cap, id)) {
            /* storage fn made that no older tensor holds (host data made
             * inside fn): a constant each replay returns a new handle on;
             * a handle ref of ours makes any assign to it copy */
            ctpu_buffer_retain(r->buf);
            atomic_fetch_add(&r->buf->handle_refs, 1);
            v->out_cbuf[j] = r->buf;
            v->out_vtype[j] = r->type;
            v->out_vdelta[j] = (int64_t)r->off;
            v->out_fixed[j] = 0;
            continue;
        }
        if (base == -1) continue;
        v->out_vbase[j] = base;
        v->out_vtype[j] = r->type;
        v->out_vdelta[j] = delta;
        v->out_vold[j] = old;
        v->out_fixed[j] = 0;
    }
}

void ctpu__capture_sink(const ctpu_capture_sink *s)
{
    struct ctpu_capture *cap = ctpu__ts->cap;
    if (!cap || cap->fail[0]) {
        free(s->prov);
        return;
    }
    version *v = calloc(1, sizeof *v);
    build_ctx b = { .cap = cap, .s = s, .v = v };
    b.rsrc = calloc((size_t)s->n_rin + 1, sizeof *b.rsrc);
    b.resolved = calloc((size_t)s->n_rin + 1, 1);
    bool ok = v && b.rsrc && b.resolved && version_alloc(v, s, cap);
    if (!ok) snprintf(cap->fail, sizeof cap->fail, "out of host memory");
    if (ok) {
        v->program_id = s->program_id;
        version_fill(v, s, cap);
        if (cap->n_gread) {
            v->gobs = malloc(sizeof *v->gobs * (size_t)cap->n_gread);
            for (int i = 0; v->gobs && i < cap->n_gread; i++)
                v->gobs[i] = (struct grad_seen){ cap->gread[i].leaf, cap->gread[i].g != 0 };
            v->n_gobs = v->gobs ? cap->n_gread : 0;
            if (!v->gobs) snprintf(cap->fail, sizeof cap->fail, "out of host memory");
        }
        if (cap->n_kread) {
            v->kobs = malloc(sizeof *v->kobs * (size_t)cap->n_kread);
            for (int i = 0; v->kobs && i < cap->n_kread; i++)
                v->kobs[i] = (struct kind_seen){ cap->kread[i].leaf, (uint8_t)cap->kread[i].g };
            v->n_kobs = v->kobs ? cap->n_kread : 0;
            if (!v->kobs) snprintf(cap->fail, sizeof cap->fail, "out of host memory");
        }
        classify_inputs(&b);
        for (int k = 0; k < v->n_pin; k++) {
            v->in[k] = b.rsrc[s->plan->in_src[k]];
            if (v->in[k].kind == IN_CONST) ctpu_buffer_retain(v->in[k].buf);   /* one ref per program input */
        }
        for (int r = 0; r < s->n_rin; r++)
            if (b.rsrc[r].kind == IN_CONST) ctpu_buffer_release(ctpu_rt->dev, b.rsrc[r].buf);
        for (int i = 0; i < v->n_psc; i++) {
            int r = s->plan->scal_src[i];
            v->sc[i] = classify_scalar(cap, r, s->rscal[r]);
        }
        ok = classify_requests(&b) && check_inplace(&b);
    }
    if (ok) ok = view_owners(&b);
    if (ok && !build_handles(v, cap, &b)) {
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
        ok = false;
    }
    if (ok) map_grads(v);
    if (ok) map_out_views(v, cap, s);
    if (ok && !plan_replay(v)) {
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
        ok = false;
    }
    if (ok) {
        ctpu_program_retain(s->prog);
        v->prog = s->prog;
        if (s->run) ctpu_program_retain(s->run);
        v->run = s->run;
        v->prov = s->prov;
        v->n_prov = s->n_prov;
        v->prov_span = s->prov_span;
    } else {
        free(s->prov);
    }
    free(b.rsrc);
    free(b.resolved);
    free(b.vowner);
    if (!ok) {
        version_free(v);
        return;
    }
    cap->made = v;
}

/* ------------------------------------------------------------ guards */
static void describe_type_change(int i, const ctpu_vtype *was, const ctpu_vtype *now, const ctpu_trec *r, char *why,
                                 size_t len)
{
    const char *nm = ctpu_rec_name(r);
    char nb[80] = "";
    if (nm[0]) snprintf(nb, sizeof nb, " (%.64s)", nm);
    if (was->dtype != now->dtype) {
        snprintf(why, len, "input %d%s dtype: %s -> %s", i, nb, ctpu_dtype_name((ctpu_dtype)was->dtype),
                 ctpu_dtype_name((ctpu_dtype)now->dtype));
        return;
    }
    if (was->ndim != now->ndim) {
        snprintf(why, len, "input %d%s ndim: %d -> %d", i, nb, was->ndim, now->ndim);
        return;
    }
    for (int d = 0; d < was->ndim; d++)
        if (was->shape[d] != now->shape[d]) {
            snprintf(why, len, "input %d%s dim %d: %lld -> %lld", i, nb, d, (long long)was->shape[d],
                     (long long)now->shape[d]);
            return;
        }
}

/* Input i of another shape than version v's capture: true when it differs
 * only in dims the capture had marked (ctpu_mark_dynamic), each extent in
 * its range (another extent of the same dynamic program); false with the
 * reason, an extent out of its range as the dynamic key says it
 * ("input 0 dim 1 = 300 outside dynamic range [2, 256]"). */
static bool dyn_extent(const version *v, int i, const ctpu_trec *r, char *why, size_t len)
{
    const ctpu_vtype *was = &v->user_type[i], *now = &r->type;
    if (v->user_dyn && was->dtype == now->dtype && was->ndim == now->ndim) {
        bool ok = true;
        for (int d = 0; d < was->ndim && ok; d++) {
            if (was->shape[d] == now->shape[d]) continue;
            const ctpu_dyndim *y = &v->user_dyn[i][d];
            int64_t x = now->shape[d];
            if (y->coef <= 0) { ok = false; break; }
            if (x % y->coef == 0 && x / y->coef >= y->lo && x / y->coef <= y->hi) continue;
            const char *nm = ctpu_rec_name(r);
            snprintf(why, len, "input %d%s%.64s%s dim %d = %lld outside dynamic range [%lld, %lld]", i, nm[0] ? " (" : "",
                     nm, nm[0] ? ")" : "", d, (long long)x, (long long)y->lo, (long long)y->hi);
            return false;
        }
        if (ok) return true;
    }
    describe_type_change(i, was, now, r, why, len);
    return false;
}

/* ctpu__ag_kind's kinds, in words: now, and at the capture. */
static const char *const ag_kind_now[3] = { "requires no grad", "is a leaf requiring grad", "is a non-leaf requiring grad" };
static const char *const ag_kind_was[3] = { "required none", "was a leaf requiring grad", "was a non-leaf requiring grad" };

/* Handle row h's record if its handle is live. */
static inline ctpu_trec *row_rec(const version *v, int h)
{
    ctpu_trec *r = v->hslot[h];
    return atomic_load_explicit(&r->live, memory_order_relaxed) &&
           atomic_load_explicit(&r->gen, memory_order_relaxed) == v->hgen[h] ? r : NULL;
}

static bool handles_hold(version *v, const ctpu_tensor *in, ctpu_trec *const *inrec, char *why, size_t len);
static bool inputs_not_inplace(const version *v, int n_in, const ctpu_tensor *in, char *why, size_t len);
static bool no_grad_holds(version *v, ctpu_trec *const *inrec, char *why, size_t len);
static bool grads_seen_hold(version *v, char *why, size_t len);

/* The handle row h names this call: its own, or (bound by position) the
 * call's in[i] or in[i]'s .grad (0: none). */
static inline uint64_t row_id_now(const version *v, int h, const ctpu_tensor *in, ctpu_trec *const *inrec)
{
    int p = v->hpos[h];
    return p < 0 ? v->hid[h] : p & 1 ? ctpu__ag_grad_id(inrec[p / 2]) : in[p / 2].id;
}

/* The binding cache holds for the rows bound by position only while each
 * names the handle it named at the last call (in[i] changed: bind anew). */
static bool rows_same(const version *v, const ctpu_tensor *in, ctpu_trec *const *inrec)
{
    for (int u = 0; u < v->n_prow; u++)
        if (row_id_now(v, v->prow[u], in, inrec) != v->hnow[v->prow[u]]) return false;
    return true;
}

/* A leaf input (or an input the step assigns) that was the same handle
 * as an earlier input at the capture (x passed as in[0] and in[1]: one
 * .grad gets both, fn's reads of in[0] see in[1]'s assign) must be so now,
 * and one that was not must not be (two handles on one storage). */
static bool leaf_identity_holds(const version *v, int n_in, ctpu_trec *const *inrec, char *why, size_t len)
{
    for (int i = 0; i < n_in; i++) {
        if (!v->user_bound[i]) continue;
        int same = i;
        for (int j = 0; j < i; j++)
            if (inrec[j] == inrec[i]) { same = j; break; }
        if (same == v->user_hsame[i]) continue;
        const char *what = v->user_ag[i] == 1 ? "leaf" : "tensor", *other = v->user_ag[i] == 1 ? "leaf" : "handle";
        if (same == i)
            snprintf(why, len, "input %d: no longer the same %s as input %d (it was at the capture)", i, what,
                     v->user_hsame[i]);
        else if (v->user_hsame[i] == i)
            snprintf(why, len, "input %d: now the same %s as input %d (another %s at the capture)", i, what, same,
                     other);
        else
            snprintf(why, len, "input %d: the same %s as input %d, was as input %d at the capture", i, what, same,
                     v->user_hsame[i]);
        return false;
    }
    return true;
}

/* A non-leaf input whose history the step's backward ran through at the
 * capture (in[0] = a * f made before the call) must have that history:
 * the capture baked it (f, a, what its rules saved). Another one (a new
 * f, a new a, or the same ops made anew) fails, as does one a backward
 * has released since (eager's backward would fail): fn runs again. */
static bool history_holds(const version *v, int n_in, ctpu_trec *const *inrec, char *why, size_t len)
{
    for (int i = 0; i < n_in; i++) {
        if (!v->user_hist[i]) continue;
        bool other = ctpu__ag_history_id(inrec[i]) != v->user_hist[i];
        if (!other && !ctpu__ag_history_released(inrec[i])) continue;
        const char *nm = ctpu_rec_name(inrec[i]);
        snprintf(why, len, "input %d%s%.48s%s: a non-leaf whose autograd history %s (the step's backward runs "
                 "through it)", i, nm[0] ? " (" : "", nm, nm[0] ? ")" : "",
                 other ? "is not the capture's" : "was released by a backward since the capture");
        return false;
    }
    if (v->hist_released) {
        snprintf(why, len, "the step's backward released autograd history made before the call (a tensor fn reads "
                 "has one; no retain_graph): a backward through it fails now");
        return false;
    }
    return true;
}

/* The tensors a version reads and writes through handles still fit it;
 * fills v->hrec (one lookup per handle per call). False with the reason
 * (the cache report's diff format); *extent: the inputs differ from the
 * capture's only in its dynamic dims, within their ranges (no guard
 * failure: another extent of the version's dynamic program). */
static bool guards_hold(version *v, int n_in, const ctpu_tensor *in, ctpu_trec *const *inrec, int n_scalars, int n_out,
                        char *why, size_t len, bool *extent)
{
    bool other_extent = false;
    if (n_in != v->n_user || n_scalars != v->n_scalars || n_out != v->n_out_user) {
        snprintf(why, len, "%s: %d -> %d", n_in != v->n_user ? "n_in" : n_scalars != v->n_scalars ? "n_scalars" : "n_out",
                 n_in != v->n_user ? v->n_user : n_scalars != v->n_scalars ? v->n_scalars : v->n_out_user,
                 n_in != v->n_user ? n_in : n_scalars != v->n_scalars ? n_scalars : n_out);
        return false;
    }
    if (v->grad_mode != ctpu_grad_enabled()) {
        snprintf(why, len, "grad mode %s (%s at the capture)", v->grad_mode ? "off" : "on", v->grad_mode ? "on" : "off");
        return false;
    }
    for (int i = 0; i < n_in; i++) {
        if (!vtype_eq(&v->user_type[i], &inrec[i]->type)) {
            if (!dyn_extent(v, i, inrec[i], why, len)) return false;
            other_extent = true;
        }
        int64_t rel;
        int same = same_input(inrec, i, &rel);
        if (same != v->user_same[i]) {
            if (same == i)
                snprintf(why, len, "input %d: no longer shares storage with input %d", i, v->user_same[i]);
            else if (v->user_same[i] == i)
                snprintf(why, len, "input %d: now shares storage with input %d (it did not at capture)", i, same);
            else
                snprintf(why, len, "input %d: shares storage with input %d, was with input %d", i, same, v->user_same[i]);
            return false;
        }
        if (rel != v->user_rel[i]) {
            /* a view of input same's storage at another offset: the
             * program reads it at the capture's (pytorch/pytorch#198095) */
            snprintf(why, len, "input %d: at byte %lld of input %d's storage, %lld at the capture", i,
                     (long long)rel, same, (long long)v->user_rel[i]);
            return false;
        }
    }
    for (int i = 0; i < n_in; i++) {
        int k = ctpu__ag_kind(inrec[i]);
        if (k == v->user_ag[i]) continue;
        snprintf(why, len, "input %d %s now, %s at the capture", i, ag_kind_now[k], ag_kind_was[v->user_ag[i]]);
        return false;
    }
    if (!leaf_identity_holds(v, n_in, inrec, why, len) || !history_holds(v, n_in, inrec, why, len)) return false;
    if (other_extent) {
        *extent = true;
        snprintf(why, len, "another extent of the inputs' dynamic dims");
        return false;
    }
    if (v->precision != (uint8_t)ctpu_rt->precision || v->dbg != ctpu_rt->debug_checks) {
        snprintf(why, len, "%s changed", v->dbg != ctpu_rt->debug_checks ? "debug checks" : "matmul precision");
        return false;
    }
    uint64_t epoch = atomic_load(&ctpu__bind_epoch);
    v->check_epoch = epoch;
    if (v->bound && v->bound_epoch == epoch && rows_same(v, in, inrec))
        return inputs_not_inplace(v, n_in, in, why, len);
    v->bound = false;
    return handles_hold(v, in, inrec, why, len) && inputs_not_inplace(v, n_in, in, why, len) &&
           no_grad_holds(v, inrec, why, len) && grads_seen_hold(v, why, len);
}

/* The per-handle guards (what the binding cache skips): each row live,
 * computed and with storage; in-place targets unshared; each buffer they
 * rely on watched, so a change to it bumps the binding epoch. */
static bool handles_hold(version *v, const ctpu_tensor *in, ctpu_trec *const *inrec, char *why, size_t len)
{
    v->bindable = true;
    for (int h = 0; h < v->n_h; h++) {
        int p = v->hpos[h];
        ctpu_trec *r = p < 0 && !v->hleaf[h] ? row_rec(v, h) : NULL;
        if (p >= 0) {
            v->hnow[h] = row_id_now(v, h, in, inrec);
            r = p & 1 ? live_rec(v->hnow[h]) : inrec[p / 2];
        } else if (v->hleaf[h]) {   /* the leaf's .grad this call (a new one after each zero_grad) */
            const ctpu_trec *leaf = live_rec(v->hleaf[h]);
            v->hnow[h] = leaf ? ctpu__ag_grad_id(leaf) : 0;
            r = live_rec(v->hnow[h]);
            if (!r) {
                snprintf(why, len, "captured tensor %s: %s, which the step %s", leaf ? "no .grad now" : "its leaf released",
                         v->hdesc ? v->hdesc[h] : "", v->hrole[h] & (H_ASSIGN | H_INPLACE) ? "assigns" : "reads");
                return false;
            }
        }
        v->hrec[h] = r;
        uint8_t f = v->hrole[h];
        if (r && r->buf) atomic_store_explicit(&r->buf->watched, true, memory_order_relaxed);
        else if (r) v->bindable = false;
        if (r && p < 0 && ctpu__ag_kind(r) != v->hag[h]) {
            /* a parameter frozen (or unfrozen) since: the capture's
             * backward made its .grad, eager's makes none (torch.compile
             * guards requires_grad: pytorch/pytorch#139476) */
            snprintf(why, len, "captured tensor %s %s now, %s at the capture", v->hdesc ? v->hdesc[h] : "",
                     ag_kind_now[ctpu__ag_kind(r)], ag_kind_was[v->hag[h]]);
            return false;
        }
        if (f == H_LEAF) continue;   /* only its .grad is written: a released leaf gets none */
        if (!r && p >= 0) {   /* the .grad's presence, per position */
            const char *nm = ctpu_rec_name(inrec[p / 2]);
            snprintf(why, len, "input %d%s%.64s%s has no .grad now, one at the capture (which the step %s)", p / 2,
                     nm[0] ? " (" : "", nm, nm[0] ? ")" : "",
                     f & (H_ASSIGN | H_INPLACE) ? "accumulates into" : "reads");
            return false;
        }
        if (!r || ctpu_rec_pending(r) || !r->buf) {
            snprintf(why, len, "captured tensor %s: %s, which the step %s", !r ? "released" : "pending elsewhere",
                     v->hdesc ? v->hdesc[h] : "", f & (H_ASSIGN | H_INPLACE) ? "assigns" : "reads");
            return false;
        }
        if (!(f & H_INPLACE)) continue;
        if (atomic_load_explicit(&r->buf->handle_refs, memory_order_relaxed) != 1) {
            const char *nm = ctpu_rec_name(r);
            snprintf(why, len, "tensor %.64s%sassigned in place shares its storage now", nm, nm[0] ? " " : "");
            return false;
        }
        if (atomic_load_explicit(&r->buf->trace_readers, memory_order_acquire) != 0) {
            const char *nm = ctpu_rec_name(r);
            snprintf(why, len, "tensor %.64s%sassigned in place is read by another thread's pending trace", nm,
                     nm[0] ? " " : "");
            return false;
        }
    }
    return true;
}

static bool inputs_not_inplace(const version *v, int n_in, const ctpu_tensor *in, char *why, size_t len)
{
    /* an input sharing an in-place target's storage: with that storage held
     * by one handle (checked above), the input is that handle */
    for (int i = 0; i < n_in && v->n_inplace; i++)
        if (is_inplace_target(v, in[i].id)) {
            snprintf(why, len, "input %d is the storage of a tensor the step assigns in place", i);
            return false;
        }
    for (int h = 0; h < v->n_h; h++)   /* an older leaf's .grad assigned in place: this call's */
        for (int i = 0; i < n_in && v->hleaf[h] && (v->hrole[h] & H_INPLACE); i++)
            if (in[i].id == v->hnow[h]) {
                snprintf(why, len, "input %d is the .grad %s, which the step assigns in place", i, v->hdesc ? v->hdesc[h] : "");
                return false;
            }
    for (int u = 0; u < v->n_prow; u++) {   /* an input leaf's .grad assigned in place: this call's */
        int h = v->prow[u];
        for (int i = 0; i < n_in && (v->hpos[h] & 1) && (v->hrole[h] & H_INPLACE); i++)
            if (in[i].id == v->hnow[h]) {
                snprintf(why, len, "input %d is input %d's .grad, which the step assigns in place", i, v->hpos[h] / 2);
                return false;
            }
    }
    return true;
}

/* Each leaf fn asked ctpu_grad of has a .grad as it had at the capture
 * (a .grad made, dropped or the leaf released bumps the binding epoch). */
static bool grads_seen_hold(version *v, char *why, size_t len)
{
    for (int i = 0; i < v->n_gobs; i++) {
        const ctpu_trec *leaf = live_rec(v->gobs[i].leaf);
        bool has = leaf && live_rec(ctpu__ag_grad_id(leaf));
        if (leaf && has == v->gobs[i].has) continue;
        char tb[64] = "";
        if (leaf) ctpu_fmt_type(&leaf->type, tb, sizeof tb);
        const char *nm = leaf ? ctpu_rec_name(leaf) : "";
        snprintf(why, len, "leaf (%s%s%.40s) %s, %s at the capture (fn reads its ctpu_grad)", tb, nm[0] ? " " : "", nm,
                 !leaf ? "released" : has ? "has a .grad now" : "has no .grad now", v->gobs[i].has ? "one" : "none");
        return false;
    }
    for (int i = 0; i < v->n_kobs; i++) {   /* (set_requires_grad bumps the binding epoch) */
        const ctpu_trec *r = live_rec(v->kobs[i].t);
        if (r && ctpu__ag_kind(r) == v->kobs[i].kind) continue;
        char tb[64] = "";
        if (r) ctpu_fmt_type(&r->type, tb, sizeof tb);
        const char *nm = r ? ctpu_rec_name(r) : "";
        snprintf(why, len, "tensor (%s%s%.40s) %s now, %s at the capture (fn reads its ctpu_requires_grad)", tb,
                 nm[0] ? " " : "", nm, r ? ag_kind_now[ctpu__ag_kind(r)] : "released", ag_kind_was[v->kobs[i].kind]);
        return false;
    }
    return true;
}

static bool no_grad_holds(version *v, ctpu_trec *const *inrec, char *why, size_t len)
{
    for (int i = 0; i < v->n_no_grad; i++) {
        int k = v->no_grad_in[i];   /* an input leaf: the call's in[k], per position */
        const ctpu_trec *leaf = k >= 0 ? inrec[k] : live_rec(v->no_grad_leaf[i]);
        if (!leaf) {
            snprintf(why, len, "a leaf whose .grad the step makes was released");
            return false;
        }
        if (leaf->buf) atomic_store_explicit(&leaf->buf->watched, true, memory_order_relaxed);
        else v->bindable = false;
        if (live_rec(ctpu__ag_grad_id(leaf))) {
            const char *nm = ctpu_rec_name(leaf);
            char at[96];
            if (k >= 0) snprintf(at, sizeof at, "input %d%s%.64s%s ", k, nm[0] ? " (" : "", nm, nm[0] ? ")" : "");
            else snprintf(at, sizeof at, "%.64s%s", nm, nm[0] ? " " : "");
            snprintf(why, len, "leaf %shas a .grad now, none at the capture (backward would accumulate)", at);
            return false;
        }
    }
    return true;
}

/* ------------------------------------------------------------ replay */
typedef struct {
    version *v;
    const ctpu_tensor *in;     /* the call's inputs */
    ctpu_trec *const *inrec;
    ctpu_buffer **outb;        /* v's arrays */
    size_t *outo;
    uint8_t *outk;
    ctpu_buffer *scratch;      /* v's */
    ctpu_cmd cmd;
    char err[256];
} replay_ctx;

/* The refs a call took: only fresh buffers' (a held or reused one is held
 * by its handle through the call; the command needs no ref: a buffer
 * released while a queued command uses it is freed after that command). */
static void release_fresh(replay_ctx *x)
{
    const version *v = x->v;
    for (int i = 0; i < v->n_fresh; i++) {
        int o = v->fresh_o[i];
        if (x->outk[o] == OUT_FRESH) ctpu_buffer_release(ctpu_rt->dev, x->outb[o]);
    }
}

static void replay_unwind(replay_ctx *x)
{
    release_fresh(x);
    if (x->cmd.one_block) free(x->cmd.buf);
}

/* The program's scratch buffer, kept across replays. */
static bool replay_scratch(replay_ctx *x, const ctpu_program *prog)
{
    version *v = x->v;
    if (prog->prog.n_virtual > 0) {
        if (!v->scratch) {
            v->scratch = ctpu_buffer_alloc(ctpu_rt->dev, prog->prog.scratch_bytes, x->err, sizeof x->err);
            if (!v->scratch) return false;
        }
        x->scratch = v->scratch;
    }
    return true;
}

/* Output buffers: an assigned tensor's own, the old .grad's (nothing else
 * holds it), or fresh. */
static bool replay_outputs(replay_ctx *x, const ctpu_program *prog)
{
    version *v = x->v;
    if (v->bound) {
        /* the binding cache: the held outputs' storage and each reused old
         * .grad are the last call's; only the fresh ones are new */
        for (int i = 0; i < v->n_fresh; i++) {
            int o = v->fresh_o[i];
            if (x->outk[o] == OUT_REUSED) continue;
            x->outk[o] = 0;
            x->outo[o] = 0;
            x->outb[o] = ctpu_buffer_alloc(ctpu_rt->dev, v->out_bytes[o], x->err, sizeof x->err);
            if (!x->outb[o]) return false;
            x->outk[o] = OUT_FRESH;
        }
        return replay_scratch(x, prog);
    }
    for (int i = 0; i < v->n_fresh; i++) x->outk[v->fresh_o[i]] = 0;
    for (int o = 0; o < v->n_pout; o++) {
        int hs = v->held_hs[o];
        if (hs < 0) continue;
        const ctpu_trec *r = v->hrec[hs];
        x->outb[o] = r->buf;
        x->outo[o] = r->off;
    }
    for (int i = 0; i < v->n_fresh; i++) {
        int o = v->fresh_o[i];
        if (v->grad_rq[o] >= 0) {
            const ctpu_trec *leaf = v->hrec[v->rq[v->grad_rq[o]].hs];
            ctpu_trec *gr = leaf ? live_rec(ctpu__ag_grad_id(leaf)) : NULL;
            if (gr && !ctpu_rec_pending(gr) && gr->buf && atomic_load(&gr->buf->handle_refs) == 1 &&
                vtype_eq(&gr->type, &v->rq[v->grad_rq[o]].type)) {
                atomic_store_explicit(&gr->buf->watched, true, memory_order_relaxed);
                x->outb[o] = gr->buf;
                x->outo[o] = gr->off;
                x->outk[o] = OUT_REUSED;
                continue;
            }
        }
        x->outo[o] = 0;
        x->outb[o] = ctpu_buffer_alloc(ctpu_rt->dev, v->out_bytes[o], x->err, sizeof x->err);
        if (!x->outb[o]) return false;
        x->outk[o] = OUT_FRESH;
    }
    return replay_scratch(x, prog);
}

/* The command's arrays: inline when they fit, else one heap block (buffers,
 * offsets, then the scalars when they do not fit inline) the device frees. */
static bool cmd_arrays(ctpu_cmd *cmd, int nb, int n_sc)
{
    cmd->n_bufs = nb;
    cmd->one_block = nb > CTPU_CMD_INLINE_BUFS || n_sc > CTPU_CMD_MAX_SCALARS;
    if (!cmd->one_block) {
        cmd->buf = cmd->buf_inl;
        cmd->off = cmd->off_inl;
        cmd->scalars = cmd->scal_inl;
        return true;
    }
    size_t sc_bytes = n_sc > CTPU_CMD_MAX_SCALARS ? sizeof(double) * (size_t)n_sc : 0;
    char *blk = malloc((sizeof(ctpu_buffer *) + sizeof(size_t)) * (size_t)nb + sc_bytes);
    if (!blk) {
        cmd->one_block = false;
        return false;
    }
    _Static_assert(sizeof(ctpu_buffer *) == sizeof(size_t) && sizeof(double) == sizeof(size_t), "one block's alignment");
    cmd->buf = (ctpu_buffer **)(void *)blk;
    cmd->off = (size_t *)(void *)(blk + sizeof(ctpu_buffer *) * (size_t)nb);
    cmd->scalars = sc_bytes ? (double *)(void *)(blk + (sizeof(ctpu_buffer *) + sizeof(size_t)) * (size_t)nb)
                            : cmd->scal_inl;
    return true;
}

static bool replay_cmd(replay_ctx *x, const ctpu_program *prog, const double *scalars)
{
    const version *v = x->v;
    ctpu_cmd *cmd = &x->cmd;
    int nb = v->n_pin + v->n_pout + (x->scratch ? 1 : 0);
    cmd->prog = &prog->prog;
    if (!cmd_arrays(cmd, nb, v->n_psc)) {
        snprintf(x->err, sizeof x->err, "out of host memory");
        return false;
    }
    ctpu_buffer **cb = cmd->buf;
    size_t *co = cmd->off;
    if (v->bound) {
        /* the binding cache: the handles' inputs are the last call's */
        memcpy(cb, v->pin_b, sizeof *cb * (size_t)v->n_pin);
        memcpy(co, v->pin_o, sizeof *co * (size_t)v->n_pin);
        for (int u = 0; u < v->n_pin_user; u++) {
            int k = v->pin_user[u];
            const in_src *s = &v->in[k];
            const ctpu_trec *r = x->inrec[s->idx];
            cb[k] = r->buf;
            co[k] = (size_t)((int64_t)r->off + s->delta);
        }
    } else {
        for (int k = 0; k < v->n_pin; k++) {
            const in_src *s = &v->in[k];
            const ctpu_trec *r = s->kind == IN_OWNER ? v->hrec[s->hs] : s->kind == IN_USER ? x->inrec[s->idx] : NULL;
            cb[k] = r ? r->buf : s->buf;
            co[k] = (size_t)((int64_t)(r ? r->off : 0) + s->delta);
        }
        memcpy(v->pin_b, cb, sizeof *cb * (size_t)v->n_pin);
        memcpy(v->pin_o, co, sizeof *co * (size_t)v->n_pin);
    }
    memcpy(cb + v->n_pin, x->outb, sizeof *cb * (size_t)v->n_pout);
    memcpy(co + v->n_pin, x->outo, sizeof *co * (size_t)v->n_pout);
    if (x->scratch) { cb[nb - 1] = x->scratch; co[nb - 1] = 0; }
    if (v->n_psc) memcpy(cmd->scalars, v->sc_tmpl, sizeof(double) * (size_t)v->n_psc);
    for (int d = 0; d < v->n_dyn; d++) {
        const sc_src *s = &v->sc[v->sc_dyn[d]];
        if (s->kind == SC_ARG) cmd->scalars[v->sc_dyn[d]] = s->trunc ? trunc(scalars[s->idx]) + 0.0 : scalars[s->idx];
    }
    for (int k = 0; k < v->n_rng; k++) {
        /* as fn would, in order: each draw's seed and offset, into its
         * slots (kept in the note: an alias reads an earlier draw's) */
        rng_note *g = &v->rng[k];
        uint64_t seed, off;
        if (g->alias >= 0) {
            seed = v->rng[g->alias].seed;
            off = v->rng[g->alias].off;
        } else {
            ctpu__rng_take(g->n, &seed, &off);
            g->seed = seed;
            g->off = off;
        }
        if (g->s < 0) continue;
        for (int d = 0; d < v->n_dyn; d++) {
            const sc_src *s = &v->sc[v->sc_dyn[d]];
            if (s->idx != k || (s->kind != SC_SEED && s->kind != SC_OFF)) continue;
            cmd->scalars[v->sc_dyn[d]] = ctpu_bits_scalar(s->kind == SC_SEED ? seed : off);
        }
    }
    cmd->debug_checks = v->dbg;
    cmd->program_id = v->program_id;
    if (v->prov) {   /* borrowed: the version frees it after the last command that read it */
        cmd->prov = v->prov;
        cmd->n_prov = v->n_prov;
        cmd->prov_span = v->prov_span;
        cmd->prov_shared = true;
    }
    return true;
}

/* out[j] a view fn made: a new handle on this call's storage. */
static ctpu_tensor publish_view(const replay_ctx *x, int j)
{
    const version *v = x->v;
    int bs = v->out_vbase[j];
    const ctpu_trec *b = bs >= 0 ? x->inrec[bs] : v->hrec[-2 - bs];
    ctpu_buffer_retain(b->buf);
    return ctpu_handle_new(&v->out_vtype[j], b->buf, (size_t)((int64_t)b->off + v->out_vdelta[j]), "compiled_call");
}

/* Rebound tensors take their new storage; new .grads are set. */
static void publish_requests(replay_ctx *x)
{
    const version *v = x->v;
    ctpu_device *dev = ctpu_rt->dev;
    for (int p = 0; p < v->n_pub; p++) {
        const rq_t *r = &v->rq[v->pub_q[p]];
        ctpu_buffer *b = x->outb[r->out];
        size_t bo = x->outo[r->out];
        if (r->kind == RQ_REBIND) {
            ctpu_trec *t = v->hrec[r->hs];
            if (t->buf == b) continue;
            ctpu_buffer_bind_touch(t->buf);
            ctpu_buffer_retain(b);
            atomic_fetch_add(&b->handle_refs, 1);
            atomic_fetch_sub(&t->buf->handle_refs, 1);
            ctpu_buffer_release(dev, t->buf);
            t->buf = b;
            t->off = bo;
            continue;
        }
        if (x->outk[r->out] == OUT_REUSED) continue;       /* RQ_GRAD written into the old .grad */
        ctpu_buffer_retain(b);
        ctpu_tensor g = ctpu_handle_new(&r->type, b, bo, "compiled_call");
        if (!ctpu_is_null(g) && !ctpu__ag_set_grad((ctpu_tensor){ v->hnow[r->hs] }, g)) ctpu_release(g);
    }
}

/* After the launch: out[j] handles, rebound tensors, new .grads. Views of
 * a tensor's storage at the call's start are made before its rebind. */
static void replay_publish(replay_ctx *x, ctpu_tensor *out)
{
    const version *v = x->v;
    for (int j = 0; j < v->n_out_user; j++)
        if (v->out_vbase[j] != -1 && v->out_vold[j]) out[j] = publish_view(x, j);
    publish_requests(x);
    for (int j = 0; j < v->n_out_user; j++) {
        if (v->out_vbase[j] != -1) {   /* a view: on this call's storage */
            if (!v->out_vold[j]) out[j] = publish_view(x, j);
            continue;
        }
        if (v->out_cbuf[j]) {   /* host data fn made: a new handle on the constant */
            ctpu_buffer_retain(v->out_cbuf[j]);
            out[j] = ctpu_handle_new(&v->out_vtype[j], v->out_cbuf[j], (size_t)v->out_vdelta[j], "compiled_call");
            continue;
        }
        out[j] = v->out_in[j] >= 0 ? x->in[v->out_in[j]] : (ctpu_tensor){ v->out_fixed[j] };
        if (v->out_prow[j] >= 0) out[j] = (ctpu_tensor){ v->hnow[v->out_prow[j]] };
        int q = v->out_rq[j];
        if (v->out_grad[j] >= 0) {   /* the .grad set above (or the old one written into) */
            q = v->out_grad[j];
            const ctpu_trec *leaf = v->hrec[v->rq[q].hs];
            uint64_t g = leaf ? ctpu__ag_grad_id(leaf) : 0;
            if (g) { out[j] = (ctpu_tensor){ g }; continue; }
            for (int i = 0; i < j; i++)   /* a released leaf gets none: a handle on the output, as before */
                if (v->out_grad[i] == q) { q = -1; out[j] = out[i]; break; }
        }
        if (q < 0) continue;
        int first = j;
        for (int i = 0; i < j; i++)
            if (v->out_rq[i] == q) { first = i; break; }
        if (first != j) { out[j] = out[first]; continue; }
        ctpu_buffer *b = x->outb[v->rq[q].out];
        ctpu_buffer_retain(b);
        out[j] = ctpu_handle_new(&v->rq[q].type, b, x->outo[v->rq[q].out], "compiled_call");
    }
}

/* One launch of a version's program (held by the version: an evicted one
 * still runs, freed after its holder lets go and its last command ran). */
static ctpu_status replay(version *v, const ctpu_tensor *in, ctpu_trec *const *inrec, const double *scalars,
                          ctpu_tensor *out)
{
    ctpu_runtime *rt = ctpu_rt;
    ctpu_program *prog = v->run ? v->run : v->prog;   /* a dynamic program's launch at these extents, or the program */
    replay_ctx x = { .v = v, .in = in, .inrec = inrec, .outb = v->outb, .outo = v->outo, .outk = v->outk };
    ctpu_status st = CTPU_OK;
    if (!replay_outputs(&x, prog) || !replay_cmd(&x, prog, scalars)) {
        st = CTPU_ERR_OOM;
        replay_unwind(&x);
    }
    if (st == CTPU_OK) {
        uint64_t seq = ctpu_device_submit(rt->dev, &x.cmd);   /* the command owns heap arrays now */
        if (v->prov) v->prov_seq = seq;
        ctpu_program_note_submit(prog, seq);
        if (prog != v->prog) ctpu_program_note_submit(v->prog, seq);   /* the bound launch reads its tables */
        ctpu_metrics *m = &rt->metrics;
        ctpu_counter_add(m, CTPU_CTR_PROGRAMS_LAUNCHED, 1);
        ctpu_counter_add(m, CTPU_CTR_FUSED_STEPS, prog->prog.n_steps);
        ctpu_counter_add(m, CTPU_CTR_CACHE_REQUESTS, 1);
        ctpu_counter_add(m, CTPU_CTR_FUSED_CACHE_REQUESTS, 1);
        ctpu_counter_add(m, CTPU_CTR_CACHE_HITS, 1);
        ctpu_counter_add(m, CTPU_CTR_FUSED_CACHE_HITS, 1);
        /* report.c: a launch of the program, its ops and estimate (a bound
         * dynamic launch at its own extents) */
        if (v->run || ctpu_program_dyn_trace(v->prog)) ctpu__report_replay_bound(v->program_id, prog);
        else ctpu__report_replay(v->program_id);
        replay_publish(&x, out);
        release_fresh(&x);
        /* bound while nothing bumped the epoch since the guards read it
         * (this call's own rebinds and new .grads do) */
        uint64_t e = atomic_load(&ctpu__bind_epoch);
        v->bound = v->bindable && e == v->check_epoch;
        v->bound_epoch = e;
    } else {
        v->bound = false;
        ctpu_set_error(st, "compiled_call: program %llu: %s", (unsigned long long)v->program_id, x.err);
    }
    return st;
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
static ctpu_status run_fn(ctpu_compiled *c, const ctpu_tensor *in, const double *scalars, int n_out, ctpu_tensor *out)
{
    for (int j = 0; j < n_out; j++) out[j] = CTPU_NULL;
    ctpu_status st = ctpu_scope_begin();
    if (st != CTPU_OK) return st;
    ctpu_user_frame uf;   /* runtime.c: shutdown refused inside fn; its stacks restored at its return */
    ctpu__user_enter(&uf, "compiled_call", "a compiled step's fn");
    st = ctpu__user_exit(&uf, c->fn(c->ctx, in, scalars, out));
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
        version_free(cap.made);
        note_reason(c, "not replayable", "not replayable: ", "an op inside fn failed and fn returned CTPU_OK");
    } else if (st == CTPU_OK && cap.empty && !cap.fail[0] && !cap.broken) {
        /* as torch.compile skips a frame with no tensor ops: fn runs at
         * every call, so its host work and returned handles stay eager's */
        c->skipped = true;
        note_reason(c, "skipped", "", "fn recorded no device op: every call runs fn in the current mode");
    } else {
        version_free(cap.made);
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
    version_free(old);
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
        int same = same_input(inrec, i, &rel);
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
        if (guards_hold(v, n_in, in, inrec, n_scalars, n_out, w, sizeof w, &ext)) {
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
        int same = same_input(inrec, i, &rel);
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
        st = replay(v, in, inrec, scalars, out);
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
