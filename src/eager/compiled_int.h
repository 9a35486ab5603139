/* Compiled steps: the types and helpers compiled.c, compiled_capture.c
 * (the capture hooks and the sink that builds a version) and
 * compiled_guard.c (the guards and the replay) share. Not a public header. */
#ifndef CTPU_COMPILED_INT_H
#define CTPU_COMPILED_INT_H

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eager.h"
#include "fuse/exec.h"

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

static inline bool push(void **arr, int *n, int *cap, size_t elem, const void *v)
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

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);   /* vDSO: ~20 ns (the thread CPU clock is a system call) */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A handle's record if the handle is live (no error set). */
static inline ctpu_trec *live_rec(uint64_t id)
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

static inline bool vtype_eq(const ctpu_vtype *a, const ctpu_vtype *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

static inline struct ctpu_capture *cap_now(void) { return ctpu__capturing(); }
static inline const char *step_name(const ctpu_compiled *c) { return c->name; }

/* defined in one of the three files, used in another */
void ctpu__cs_version_free(version *v);
int ctpu__cs_same_input(ctpu_trec *const *inrec, int i, int64_t *rel);
bool ctpu__cs_is_inplace_target(const version *v, uint64_t id);
bool ctpu__cs_guards_hold(version *v, int n_in, const ctpu_tensor *in, ctpu_trec *const *inrec, int n_scalars, int n_out,
                          char *why, size_t len, bool *extent);
ctpu_status ctpu__cs_replay(version *v, const ctpu_tensor *in, ctpu_trec *const *inrec, const double *scalars,
                              ctpu_tensor *out);

#endif
