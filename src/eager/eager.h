/* Eager layer internals: the runtime struct, tensor records and scopes, and
 * the dispatch path every op takes. */
#ifndef CTPU_EAGER_H
#define CTPU_EAGER_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>

#include "ctpu.h"
#include "ops.h"
#include "device/device.h"
#include "fuse/fuse.h"
#include "fuse/loops.h"
#include "fuse/trace.h"

/* ------------------------------------------------------------ runtime */
typedef enum { CTPU_LOOPS_AUTO = 0, CTPU_LOOPS_ON, CTPU_LOOPS_OFF } ctpu_detect_loops;

typedef struct ctpu_runtime {
    /* configuration, read once from the environment by ctpu_init */
    ctpu_mode mode;
    int debug_checks_env;            /* -1 unset, else 0/1 */
    bool debug_checks;
    ctpu_precision precision;
    ctpu_detect_loops detect_loops;
    const ctpu_chip_info *chip;
    uint64_t hbm_cap;
    ctpu_isa isa;
    int nthreads;
    size_t cache_size;
    size_t strict_cache_size;        /* CTPU_STRICT_CACHE_SIZE */
    size_t recompile_limit;          /* TORCH_TPU_RECOMPILE_LIMIT, 0 = none */
    long cache_only_after;           /* -1 unset */
    ctpu_price_plan price_plan;      /* TORCH_TPU_PRICE_PLAN */
    double compile_seconds;          /* TORCH_TPU_COMPILE_SECONDS: assumed TPU compile time, the shape policies */
    bool auto_dynamic;               /* TORCH_TPU_AUTO_DYNAMIC */
    size_t trace_events;             /* TORCH_TPU_TRACE_EVENTS */
    char *metrics_file, *trace_file;
    bool quiet;                      /* CTPU_QUIET: no summary line at shutdown */

    ctpu_metrics metrics;
    ctpu_device *dev;
    ctpu_cache *strict_cache;        /* strict eager's one-node programs */
    /* dispatch.c: the op signatures (a strict key without its extents) the
     * strict table has compiled, each with the marked step it was first
     * compiled in: an open-addressing set of hashes, for strict_recompiles */
    pthread_mutex_t strict_sig_mu;
    uint64_t *strict_sig, *strict_sig_step;
    size_t strict_sig_n, strict_sig_cap;
    /* the last CTPU_STRICT_RC_LOG strict recompiles, for the cache report
     * (under strict_sig_mu; strict_rc_n counts all, the ring keeps the last) */
#define CTPU_STRICT_RC_LOG 16
    struct { uint64_t step, first_step; char what[200]; } strict_rc[CTPU_STRICT_RC_LOG];
    uint64_t strict_rc_n;
    ctpu_cache *fused_cache;         /* defer and fuse: bounded LRU */
    atomic_uint_fast64_t next_trace_id;
    atomic_bool user_marks_steps;    /* loop detector 'auto' turns off at the first mark */
    atomic_uint_fast64_t marked_steps;
    atomic_bool cache_only;          /* ctpu_cache_set_only / TORCH_TPU_CACHE_ONLY */
    struct ctpu_report_state *report; /* reports, cost totals, trace buffer (report.c) */
    bool compile_disable;            /* TORCH_COMPILE_DISABLE: compiled calls run fn in the current mode */
    pthread_mutex_t compiled_mu;     /* compiled.c: the list of compiled steps */
    struct ctpu_compiled *compiled;
    uint64_t next_compiled_id;
    _Atomic uint32_t bw_label[CTPU_OP_COUNT]; /* "backward of <op>" label ids, 0 until first used */
    atomic_int user_frames;          /* runtime.c: threads' user frames open (ctpu__user_enter): shutdown refuses */

    /* tensor records: pages of slots, never moved */
    pthread_mutex_t slot_mu;
    struct ctpu_trec **pages;
    uint32_t n_pages;
    _Atomic uint32_t n_slots;        /* written under slot_mu (release), read without it (acquire) */
    uint32_t *free_list;
    uint32_t n_free, free_cap;

    pthread_mutex_t rng_mu;
    uint64_t rng_seed, rng_offset;

    atomic_uint_fast64_t next_scope_id;
    uint64_t epoch;                  /* bumped by every init: stale thread state detection */
} ctpu_runtime;

extern ctpu_runtime *ctpu_rt;

/* ------------------------------------------------------------ per-thread state */
/* Everything the eager layer keeps per thread, in one struct (runtime.c owns
 * it): allocated at a thread's first call, reached through one initial-exec
 * thread-local pointer, freed by one pthread key destructor at thread exit.
 * The parts after `epoch` belong to the runtime whose epoch it holds; when a
 * thread meets a newer runtime (shutdown, then init), they are dropped in one
 * place (the one epoch check: ctpu_ts / ctpu_ts_current). The last error and
 * the op-trace test hook outlive runtimes. The device's trace-file recorder
 * keeps its own thread id (device/tracefile.c): one thread-local per layer. */
#define CTPU_MAX_SCOPES 64
#define CTPU_FAIL_RING 32            /* failures an error handle can name (ctpu.h) */
#define CTPU_SLOT_STASH 64           /* free slots a thread keeps (half go back when it overflows) */
#define CTPU_LABEL_DEPTH 32          /* ctpu_label_push nests this deep (ctpu.h) */
#define CTPU_DIST_MAX_STARTED 64     /* ctpu_all_reduce_async values in flight per thread (ctpu.h) */

/* A dynamic dim (ctpu_mark_dynamic, DESIGN.md "Dynamic dims"): the extent
 * is coef * s for a symbol s in [lo, hi]; coef 0: a static dim. A symbol is
 * named by its range and its value in the trace at hand: dims of equal range
 * and value are one symbol. */
typedef struct { int64_t lo, hi, coef; } ctpu_dyndim;

typedef struct {                     /* tensor.c */
    uint64_t id;
    uint64_t *items;                 /* handle ids made in (or kept into) this scope */
    size_t n, cap;
    bool step;
} ctpu_scope;

/* TORCH_TPU_AUTO_DYNAMIC: one structure's automatic-dynamic state (defer.c). */
typedef struct {
    uint64_t struct_hash, used;
    ctpu_vtype *in;                  /* its last flushed trace's recorded input types */
    int n_in, n_dims;
    int32_t rec[16], dim[16], coef[16];   /* its learnt dims (n_dims of them) */
    bool learnt;
} ctpu_auto_mem;

typedef struct {                     /* defer.c: this thread's defer-and-fuse trace */
    ctpu_trace_rec *rec;
    uint64_t id;                     /* current trace id, 0 = none yet */
    uint64_t *holders;               /* handle ids that became pending in this trace */
    size_t n_holders, cap_holders;
    uint8_t *suffix;                 /* the key's live-out suffix at a cut (kept for the next) */
    size_t cap_suffix;
    ctpu_loop_det loops;
    /* the last flush: its program, step, and the buffers it gave pending
     * values, with the op that made each (structure changes between cuts);
     * each buffer with its allocation serial (the pointer alone matches a
     * later buffer at the same address) */
    struct ctpu_made { const ctpu_buffer *buf; uint64_t serial; const char *op; char name[64]; } *made;
    size_t n_made, cap_made;
    uint64_t last_program, last_step;
    bool last_had_inputs;            /* the last flush read device buffers (a step, not only creation) */
    /* dynamic dims of the recorded values (NULL rows: static): inputs by
     * recorded index, nodes by vref */
    ctpu_dyndim (*in_dyn)[CTPU_MAX_DIMS], (*node_dyn)[CTPU_MAX_DIMS];
    bool *in_has_dyn, *node_has_dyn;
    size_t cap_in_dyn, cap_node_dyn;
    bool any_dyn;                    /* some recorded value has a dynamic dim */
    uint64_t dyn_sig;                /* a hash of every dynamic-dim note of the trace, in order (the bound
                                        alias's signature, fuse.h ctpu_cache_alias_add) */
    struct { int64_t lo, hi, v; } sym[8];   /* the symbols of the marked inputs recorded so far */
    int n_sym;
    /* TORCH_TPU_AUTO_DYNAMIC (policy.c detects, defer.c marks), per
     * structure as torch.compile's per-frame automatic-dynamic state: the
     * recorded input types of each structure's last flushed trace and,
     * once its first one-dim recompile is known, the (recorded input, dim,
     * coef) triples it made dynamic. A trace's inputs are marked as the
     * most recent structure whose input dtypes and ranks agree so far says
     * (its learnt dims; before that, the one dim an input differs in from
     * it, speculatively); the flush keeps the marks (spec) only when they
     * are exactly what the trace's own structure requires, else the trace
     * is keyed and compiled static and the marks are dropped */
    ctpu_auto_mem *amem;
    int n_amem, cap_amem;            /* at most 16 */
    uint32_t amem_alive, amem_expl;  /* entries whose input dtypes and ranks agree with this trace's so far; whose
                                        inputs it explains (learnt dims aside) */
    int amem_hi;                     /* recorded inputs compared so far */
    bool amem_none;                  /* no entry agrees with this trace's inputs so far */
    uint64_t amem_seq;
    struct { uint64_t program, struct_hash; } amap[128];  /* program id -> structure (ring) */
    int n_amap;
    int64_t spec_from, spec_to;      /* the first speculated dim's old and new extent (0: none yet) */
    struct { int32_t rec, dim, coef; struct ctpu_trec *r; uint32_t gen; } spec[32];
    int n_spec;
    bool spec_ok;                    /* the flush confirmed them: the values the trace made keep them */
    bool spec_full;                  /* more marks than spec holds: not confirmed */
    bool other_dyn;                  /* an input with dims marked otherwise (ctpu_mark_dynamic, a value made dynamic) */
    int32_t other_rec[16];           /* those inputs (recorded index; n_other > 16: more) */
    int n_other;
} ctpu_defer_state;

struct ctpu_strict_front;            /* dispatch.c */
struct ctpu_capture;                 /* compiled.c: a compiled step's capture in progress */

#define CTPU_DYN_DECLS 4             /* ctpu_declare_dynamic_inputs: declarations a thread may hold */
/* t made from host data of dtype dt and rank ndim (tensor.c's from_host),
 * marked as the thread's dynamic-input declarations say (dispatch.c);
 * returns t, or a failure (t released) when a mark fails. */
ctpu_tensor ctpu__declared_dynamic(ctpu_tensor t, int dt, int ndim, const int64_t *shape);

typedef struct ctpu_thread_state {
    /* kept across runtimes */
    ctpu_status err_status;          /* runtime.c: ctpu_last_status / ctpu_last_error */
    char err_msg[512];
    /* runtime.c: the ring of recent failures an error handle names (id in
     * its high 32 bits), and the handle the last failing call returns */
    struct ctpu_fail { uint32_t id; ctpu_status st; uint16_t cause; char msg[512]; } fails[CTPU_FAIL_RING];
    uint64_t fail_handle;
    struct { uint64_t *buf; size_t cap, n; } op_trace;  /* autograd.c: ctpu__test_op_trace */

    uint64_t epoch;                  /* runtime the parts below belong to; 0 = none */
    int mode_override;               /* runtime.c: ctpu_set_thread_mode; -1 = none */
    int no_grad;                     /* autograd.c: no-grad depth */
    int scope_depth;                 /* tensor.c: the scope stack */
    ctpu_scope scopes[CTPU_MAX_SCOPES];
    ctpu_defer_state df;             /* defer.c: the trace recorder */
    int quiet_errors;                /* dispatch.c: > 0 while probing a shape rule (ctpu_set_error records nothing) */
    const void *ag_hint;             /* autograd.c: the tape entry whose backward rule runs (its dynamic dims) */
    bool dyn_out_set;                /* dispatch.c: the dynamic dims the last shape rule's probe gave the node */
    ctpu_dyndim dyn_out[CTPU_MAX_DIMS];
    const struct ctpu_trec *dyn_like; /* attention.c: a packed value's part is reshaped to this value's type, and
                                        takes its dynamic dims (dispatch.c infer_named), or NULL */
    struct ctpu_strict_front *strict_front; /* dispatch.c: lock-free front of the strict program table */
    struct ctpu_capture *cap;        /* compiled.c: the capture fn is running in, or NULL */
    struct { int dt, ndim, dim; int64_t lo, hi; } dyn_decl[CTPU_DYN_DECLS];  /* dispatch.c: ctpu_declare_dynamic_inputs */
    int n_dyn_decl;
    struct {
        uint32_t idx[CTPU_SLOT_STASH];
        int n;
    } slots;                         /* tensor.c: free handle slots this thread reuses without slot_mu */
    struct {
        char host_read[64];          /* report.c: ctpu_set_host_read_label */
        uint32_t op_no;              /* dispatch.c: ops (and host reads) numbered in this step */
        int depth;                   /* runtime.c: ctpu_label_push's stack of label ids */
        uint32_t stack[CTPU_LABEL_DEPTH];
        uint32_t call;               /* runtime.c: ctpu_call_push's outermost (call, arg), interned; 0: none */
        const char *call_name;       /* runtime.c: that call alone, interned (handles made in the scope name it); NULL: none */
        int call_depth;
    } label;
    struct {                         /* runtime.c: the user frame this thread is in (ctpu__user_enter) */
        int depth;                   /* frames open (0: not inside user code called back by ctpu) */
        const char *what;            /* the innermost's name, "a compiled step's fn", or NULL */
        int scope, no_grad, label, call;  /* its floors: the depths on entry (pops never go below them) */
        char bad[200];               /* the first mis-nesting inside it, "" if none */
    } user;
    struct {
        int64_t bucket_plus1;        /* collective.c: ctpu_dist_set_bucket + 1 (0 = none) */
        bool keep_collectives;       /* collective.c: ctpu_dist_set_collective_cut(false) */
        uint64_t started[CTPU_DIST_MAX_STARTED]; /* collective.c: ctpu_all_reduce_async handles not waited (0: free) */
    } dist;
} ctpu_thread_state;

/* This thread's state; until its first call (and after it exits), a shared
 * read-only state with every default and epoch 0, so readers need no NULL
 * check and only ctpu__ts_get / ctpu_ts hand out a writable one. */
extern _Thread_local ctpu_thread_state *ctpu__ts __attribute__((tls_model("initial-exec")));
/* The state, allocated at the first call, not bound to any runtime (the last
 * error, test hooks). NULL only when the host is out of memory. */
ctpu_thread_state *ctpu__ts_get(void);
/* Slow path of ctpu_ts: allocate the state, or drop a previous runtime's parts. */
ctpu_thread_state *ctpu__ts_bind(void);

/* The next op number of this thread's step and the innermost label: a
 * counter and an id, a few instructions per op (defined below ctpu_ts). */
static inline ctpu_op_prov ctpu_prov_next(void);

/* The one epoch check: s holds parts of runtime rt (not NULL; runtime
 * epochs start at 1). */
static inline bool ctpu__ts_bound(const ctpu_thread_state *s, const ctpu_runtime *rt)
{
    return s->epoch == rt->epoch;
}
/* This thread's state, bound to the current runtime (ctpu_rt must be set).
 * NULL only when the host is out of memory. */
static inline ctpu_thread_state *ctpu_ts(void)
{
    ctpu_thread_state *s = ctpu__ts;
    if (__builtin_expect(ctpu__ts_bound(s, ctpu_rt), 1)) return s;
    return ctpu__ts_bind();
}
/* The state if it is already bound to the current runtime, else NULL (for
 * readers that must not allocate: a thread without state has defaults). */
static inline ctpu_thread_state *ctpu_ts_current(void)
{
    ctpu_thread_state *s = ctpu__ts;
    const ctpu_runtime *rt = ctpu_rt;
    return rt != NULL && ctpu__ts_bound(s, rt) ? s : NULL;
}
static inline ctpu_op_prov ctpu_prov_next_ts(ctpu_thread_state *s)
{
    int d = s->label.depth;
    return (ctpu_op_prov){ ++s->label.op_no, d ? s->label.stack[d - 1] : 0, s->label.call };
}
static inline ctpu_op_prov ctpu_prov_next(void)
{
    ctpu_thread_state *s = ctpu_ts();
    if (__builtin_expect(s == NULL, 0)) return (ctpu_op_prov){ 0, 0, 0 };
    return ctpu_prov_next_ts(s);
}
/* runtime.c: "op #3, \"block1.attn\"", "op #3", "\"blk\"" or "" (no number,
 * no label): an op's provenance inside a message's parentheses. */
const char *ctpu__prov_text(ctpu_op_prov p, char *buf, size_t len);
/* The text of label id ("" for 0 or an unknown id). */
const char *ctpu__label_text(uint32_t id);
/* runtime.c: push a label id (autograd's "backward of <op>"); pop it. */
bool ctpu__label_push_id(uint32_t id);
void ctpu__label_pop(void);
/* The label id of "backward of <op>" (interned once per op). */
uint32_t ctpu__backward_label(int op);

/* A guarded call (runtime.c): ctpu_shutdown on another thread is refused
 * until ctpu__call_exit; false (CTPU_ERR_NOT_INITIALIZED set, no exit
 * needed) when there is no runtime. The first thing such a call does,
 * before it reads ctpu_rt. Guarded: ctpu_compiled_call, backward, sync and
 * the host reads. */
bool ctpu__call_enter(const char *op);
void ctpu__call_exit(void);
/* compiled.c: ctpu_compiled_call's body (runtime.c guards it). */
ctpu_status ctpu__compiled_call(ctpu_compiled *c, int n_in, const ctpu_tensor *in, int n_scalars,
                                const double *scalars, int n_out, ctpu_tensor *out);

/* A user frame: ctpu calling back into user code (a compiled step's fn, a
 * grad hook). Inside one, ctpu_shutdown is refused (the runtime would be
 * freed under its caller), and the scope, no-grad, label and call-scope
 * stacks have a floor: a pop below the depth they had on entry is refused
 * (CTPU_ERR_STATE), and whatever the callback left open is closed on
 * exit. op names the call that runs it ("compiled_call", "backward"), what
 * the callback ("a compiled step's fn"). Frames nest. */
typedef struct {
    const char *op, *what;
    int scope, no_grad, label, call;  /* the enclosing frame's floors */
    const char *prev_what;
    char prev_bad[200];
    bool entered;
} ctpu_user_frame;
void ctpu__user_enter(ctpu_user_frame *f, const char *op, const char *what);
/* Close the frame: restore the stacks to their depth on entry. Returns st,
 * or CTPU_ERR_STATE (message set) when st is CTPU_OK and the callback
 * mis-nested (left a scope open, popped below its floor, called
 * ctpu_shutdown). */
ctpu_status ctpu__user_exit(ctpu_user_frame *f, ctpu_status st);
/* A pop of stack `name` (e.g. "scope") at depth, whose floor is floor: true
 * (error set, recorded for the frame's exit) when it would go below the
 * floor of the user frame the thread is in, or below zero. op is the pop
 * ("scope_end"), push its pair ("ctpu_scope_begin"). */
bool ctpu__user_underflow(ctpu_thread_state *s, int depth, int floor, const char *op, const char *name,
                          const char *push);
/* tensor.c: end this thread's scopes down to depth (their handles released,
 * no trace cut even for a step scope); returns how many were open. */
int ctpu__scopes_unwind(ctpu_thread_state *s, int depth);

/* Drop the calling thread's runtime-bound parts while the runtime still
 * lives (ctpu_shutdown: its unfinished trace releases its input buffers). */
void ctpu__ts_drop_runtime(void);
/* tensor.c: give s's stashed free slots back to the runtime they belong to
 * (ctpu_rt, still alive); rt NULL: that runtime is gone, they are dropped. */
void ctpu__slots_drop(ctpu_thread_state *s, ctpu_runtime *rt);
/* dispatch.c: free a strict front table; c: the live runtime's strict
 * table, whose programs it lets go of (NULL: that runtime is gone). */
void ctpu__strict_front_free(struct ctpu_strict_front *f, ctpu_cache *c);

/* ------------------------------------------------------------ records */
#define CTPU_SLOTS_PER_PAGE 4096u
#define CTPU_MAX_PAGES 1024u

typedef struct ctpu_trec {
    /* gen and live are read without a lock by threads checking their own
     * handles (and by the defer flush scanning released ones) while another
     * thread may be reusing the slot: atomics, written relaxed (slot_mu
     * orders reuse); a mismatch is all a reader needs to see */
    _Atomic uint32_t gen;            /* bumped at release */
    _Atomic bool live;
    ctpu_vtype type;
    ctpu_buffer *buf;
    size_t off;                      /* bytes into buf (views) */
    uint64_t scope_id;               /* 0 = global */
    void *ag;                        /* autograd metadata (autograd.c) */
    /* defer and fuse: a value not computed yet. trace_id != 0: the handle
     * stands for value tval of that (per-thread) trace; buf, if set, is the
     * storage the value should be written into (an assigned parameter). */
    uint64_t trace_id;
    int32_t tval;
    bool leaf_grad;                  /* the .grad handle of a leaf (ctpu_grad): the user may not release it */
    char *name;                      /* ctpu_set_name (malloc'd; also on buf once it has one), or NULL */
    const char *made_by;             /* defer and fuse: the op that made a pending value (static), or NULL */
    const char *origin;              /* the op (or call) that made the handle (static): the leak watch */
    ctpu_dyndim *dyn;                /* [CTPU_MAX_DIMS] its dynamic dims (malloc'd), or NULL: all static */
    uint32_t origin_label;           /* the region label open when it was made (ctpu_label_push), 0: none */
} ctpu_trec;

static inline bool ctpu_rec_pending(const ctpu_trec *r) { return r->trace_id != 0; }

static inline ctpu_trec *ctpu_slot(uint32_t idx)
{
    return &ctpu_rt->pages[idx / CTPU_SLOTS_PER_PAGE][idx % CTPU_SLOTS_PER_PAGE];
}
static inline uint32_t ctpu_handle_slot(ctpu_tensor t) { return (uint32_t)(t.id & 0xffffffffu) - 1u; }
static inline uint32_t ctpu_handle_gen(ctpu_tensor t) { return (uint32_t)(t.id >> 32); }
/* The record of handle id h if h still names it, else NULL: for loops over
 * handle ids a thread made (scope items, trace holders), with pages =
 * ctpu_rt->pages read once. Relaxed reads: another thread may be reusing a
 * released slot, and a mismatch is all this needs to see (a seq_cst load
 * here made every iteration reload the loop's state). */
static inline ctpu_trec *ctpu_slot_if_live(ctpu_trec *const *pages, uint64_t h)
{
    ctpu_tensor t = { h };
    uint32_t idx = ctpu_handle_slot(t);
    ctpu_trec *r = &pages[idx / CTPU_SLOTS_PER_PAGE][idx % CTPU_SLOTS_PER_PAGE];
    bool live = atomic_load_explicit(&r->live, memory_order_relaxed);
    return live && atomic_load_explicit(&r->gen, memory_order_relaxed) == ctpu_handle_gen(t) ? r : NULL;
}

/* The user's name of a record's value ("" if none). */
static inline const char *ctpu_rec_name(const ctpu_trec *r)
{
    return r->name ? r->name : r->buf && r->buf->name ? r->buf->name : "";
}
/* Give buffer b the record's name (defer and fuse: when a pending value gets its storage). */
void ctpu__name_buffer(const ctpu_trec *r, ctpu_buffer *b);

/* ctpu_to_host with the user's call named in messages (ctpu_print). */
ctpu_status ctpu__to_host_op(const char *op, ctpu_tensor t, void *dst, size_t dst_bytes);

/* ------------------------------------------------------------ errors */
/* Set the thread's error: status + printf-style one-line message. */
void ctpu_set_error(ctpu_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Format a value type as "f32[2,3]" into buf. */
const char *ctpu_fmt_type(const ctpu_vtype *t, char *buf, size_t len);

/* The handle a call that just failed returns: the error handle of the
 * failure ctpu_set_error recorded, or the null or error handle an op was
 * given (ctpu_rec_get with quiet_null), returned unchanged. */
static inline ctpu_tensor ctpu_failed(void) { return (ctpu_tensor){ ctpu__ts->fail_handle }; }
/* A null handle t given for op's argument arg (tensor.c's ctpu_rec_get):
 * an error handle's message, or with quiet its record put back. */
void ctpu__fail_from(ctpu_tensor t, const char *op, const char *arg, bool quiet);
/* A literal CTPU_NULL (an optional argument left out), not an error handle. */
static inline bool ctpu_absent(ctpu_tensor t) { return t.id == 0; }

/* Check the runtime is up; sets CTPU_ERR_NOT_INITIALIZED naming `op`. */
bool ctpu_check_init(const char *op);

/* Resolve a handle for op's argument `arg`. On failure sets the error and
 * returns NULL: CTPU_NULL is CTPU_ERR_NULL_HANDLE, an error handle its
 * record's status with a message ending "(from <cause>)"; with quiet_null
 * neither sets a new message (an error handle puts its record back as the
 * last error) and ctpu_failed() returns the handle given. */
ctpu_trec *ctpu_rec_get(ctpu_tensor t, const char *op, const char *arg, bool quiet_null);
/* r's dynamic dims: a copy of d[0..ndim) (NULL or all static: none). False
 * on out of memory (r keeps none). */
bool ctpu__rec_set_dyn(ctpu_trec *r, const ctpu_dyndim *d, int ndim);
/* In a backward rule, a tensor of type t (autograd.c): 1, *out the
 * dynamic dims of the tape entry's first input of that shape (or else of
 * its output); -1: that input is static (slice_backward's result at
 * T = ctx is the position table's shape, not the slice's); 0: no hint. */
int ctpu__ag_hint_dyn(const ctpu_vtype *t, ctpu_dyndim *out);

/* Make a handle for a new record owning one handle ref on buf (buf's
 * handle_refs is incremented; the caller's buffer ref is transferred).
 * Null (with error) if the slot table is full. */
ctpu_tensor ctpu_handle_new(const ctpu_vtype *type, ctpu_buffer *buf, size_t off, const char *op);
/* A new handle viewing rec's storage with another type (reshape, slices). */
ctpu_tensor ctpu_handle_view(ctpu_trec *rec, const ctpu_vtype *type, size_t off, const char *op);
void ctpu_handle_release_rec(ctpu_trec *rec, uint32_t slot);

/* Effective mode of this thread. */
ctpu_mode ctpu_mode_now(void);
bool ctpu_debug_checks_now(void);

/* ------------------------------------------------------------ dispatch */
/* Run one node (its inputs' records, their handles for autograd, its
 * runtime scalars): in defer and fuse, record it into this thread's trace
 * (the output is a pending handle); otherwise compile it through the strict
 * program table and enqueue it, its output in a fresh HBM buffer (in debug
 * eager, wait and report a device fault here). Records autograd. Returns
 * the output handle, or CTPU_NULL with the error set. */
ctpu_tensor ctpu_dispatch(ctpu_node *node, ctpu_trec *const *inputs, const ctpu_tensor *in_h,
                          const double *scalars);
/* The same, for the public call `call` (its errors name it; NULL: the op's name). */
ctpu_tensor ctpu_dispatch_as(ctpu_node *node, const char *call, ctpu_trec *const *inputs, const ctpu_tensor *in_h,
                             const double *scalars);
/* matmul_t's rule (dispatch.c), at an explicit precision (the matmul
 * backward rule passes the forward op's). */
ctpu_tensor ctpu__matmul_t(ctpu_tensor a, ctpu_tensor b, bool ta, bool tb, int precision);
/* scaled_dot_product_attention's backward node (attention.c): dq, dk, dv
 * (f32) from the forward node, its runtime scalars, its inputs (q, k, v
 * [, mask]), its packed output and that output's gradient. False with the
 * error set. */
bool ctpu__sdpa_backward(const ctpu_node *fwd, const double *sc, const ctpu_tensor *ins, ctpu_tensor out,
                         ctpu_tensor gout, ctpu_tensor *gq, ctpu_tensor *gk, ctpu_tensor *gv);
/* tensor.c: validate a creation shape into *out (sets the error naming op);
 * take n numbers from the global generator (its seed and start offset);
 * release every record at shutdown. */
bool ctpu__validate_shape(const char *op, int ndim, const int64_t *shape, ctpu_dtype dt, ctpu_vtype *out);
/* The element cap every shape keeps: each extent, and the product of the
 * nonzero extents, at most 2^56. ctpu__type_ok checks a shape an op made
 * (false with the error set: "op: what would be f32[...]: dim d ..."). */
#define CTPU_NUMEL_CAP (INT64_C(1) << 56)
bool ctpu__type_ok(const char *op, const char *what, const ctpu_vtype *t);
void ctpu__rng_take(uint64_t n, uint64_t *seed, uint64_t *offset);
/* The generator's state, read and set without the public calls' checks
 * (inside a capture those are graph breaks; compiled.c puts a refused
 * capture's draws back). */
void ctpu__rng_state(uint64_t *seed, uint64_t *offset);
void ctpu__rng_restore(uint64_t seed, uint64_t offset);
/* dispatch.c, for ctpu_dropout (declared in src/nn/nn_internal.h too) */
ctpu_tensor ctpu__rand_uniform_f32_like(ctpu_tensor a);
void ctpu__tensors_shutdown(ctpu_runtime *rt);
/* Leak watch (tensor.c): the live handles, the distinct HBM bytes they
 * hold, and the origins holding the most (bytes, then handles), most first.
 * Reads every slot: at shutdown, or once for a warning. */
typedef struct { const char *op; uint32_t label; uint64_t bytes, handles; } ctpu_holder;
/* "full" or "full (\"block1\")": a holder row as the leak lines name it */
const char *ctpu__holder_name(const ctpu_holder *h, char *buf, size_t len);
size_t ctpu__live_holders(ctpu_runtime *rt, uint64_t *handles, uint64_t *bytes, ctpu_holder *top, size_t max);
/* "2.0 MiB" */
const char *ctpu__fmt_bytes(uint64_t b, char *buf, size_t len);

/* Autograd (autograd.c): called for every op and view that produced `out`
 * from the handles `inputs` (node->n_in of them) and runtime scalars. Records
 * a tape entry when grad mode is on and an input requires grad. */
void ctpu__ag_record(const ctpu_node *node, const ctpu_tensor *inputs, const double *scalars, ctpu_tensor out);
/* Called when a record is released (drops its autograd metadata). */
void ctpu__ag_release(ctpu_trec *rec);
/* ctpu_assign's autograd, as torch's dst.copy_(src). Before the write:
 * CTPU_ERR_STATE (message set) when grad mode is on and dst is a leaf that
 * requires grad. After a successful write, with grad mode on and dst or src
 * requiring grad: dst's history is rebased onto a copy node whose gradient
 * goes to src, zeros to dst's old history (torch's CopyBackwards). */
ctpu_status ctpu__ag_assign_check(const ctpu_trec *dst);
void ctpu__ag_assign(ctpu_tensor dst, ctpu_tensor src);
/* Whether ctpu__ag_assign would give dst a history (grad mode on, dst not
 * a leaf, dst or src requiring grad). */
bool ctpu__ag_assign_records(const struct ctpu_trec *d, const struct ctpu_trec *s);
/* r's autograd kind: 0 no grad, 1 a leaf that requires grad, 2 a non-leaf
 * with a history (a compiled step's guard, as torch.compile's requires_grad). */
int ctpu__ag_kind(const struct ctpu_trec *r);
/* Autograd history made before a compiled call, for its guards: the id of
 * the next backward pass and of the next node; r's node's creation number
 * (0: a leaf, no grad); whether a pass numbered pass0 or later walked r's
 * node; whether a node of r's history was released by a backward (a
 * backward through r would fail). */
uint64_t ctpu__ag_pass_next(void);
uint64_t ctpu__ag_seq_next(void);
uint64_t ctpu__ag_history_id(const struct ctpu_trec *r);
bool ctpu__ag_history_reached(const struct ctpu_trec *r, uint64_t pass0);
bool ctpu__ag_history_released(const struct ctpu_trec *r);
/* compiled.c: a capture's backward released node seq (no retain_graph). */
void ctpu__capture_note_released(uint64_t seq);
/* compiled.c: fn gives a tensor made before the call an autograd history
 * (an assign with grad mode on): a graph break (a replay cannot make that
 * history). True: go on; false: fullgraph, the error is set. */
bool ctpu__capture_note_history(const struct ctpu_trec *dst);
/* Autograd's rule table against the op table's gradient column (autograd.c):
 * 1 = a backward rule, 2 = no gradient (comparisons, argmax, creation),
 * 0 = the two disagree (a rule missing or extra: a test fails). */
int ctpu__ag_rule_kind(int op);
/* Strict/debug: run one node into `out` at out_off (assign's in-place write;
 * no handle, no autograd). Returns the status (the error set). */
ctpu_status ctpu_dispatch_into(ctpu_node *node, ctpu_trec *const *inputs, const double *scalars,
                               ctpu_buffer *out, size_t out_off, ctpu_op_prov prov);

/* Strict eager's path for one node on device buffers (dispatch.c): the
 * one-op program table, then the stream (in debug eager, wait and report a
 * device fault here). node->in[] is overwritten. in: the inputs' records
 * when it has them (their names go into trace events and a fault reported
 * here), else NULL. Defer and fuse runs a trace past the recompile limit
 * through it, op by op. */
ctpu_status ctpu__strict_launch(ctpu_node *node, ctpu_trec *const *in, const ctpu_vtype *const *in_type,
                                ctpu_buffer *const *in_buf, const size_t *in_off, const double *scalars,
                                ctpu_buffer *out, size_t out_off, ctpu_op_prov prov);

/* ------------------------------------------------------------ defer and fuse (defer.c) */
typedef enum {
    CTPU_CUT_MARK_STEP, CTPU_CUT_HOST_READ, CTPU_CUT_SYNC, CTPU_CUT_LOOP, CTPU_CUT_LIMIT, CTPU_CUT_MODE,
    CTPU_CUT_COLLECTIVE,             /* after a collective (ctpu_dist_set_collective_cut) */
    CTPU_CUT_COUNT
} ctpu_cut_reason;
/* Record a node into this thread's trace; returns the pending output handle.
 * call: the public call its errors name (NULL: the op's name). */
/* TORCH_TPU_AUTO_DYNAMIC, defer and fuse: the automatic marks of an op's
 * device-buffer inputs, recorded into the trace before the op's shape rule
 * is probed for dynamic dims (dispatch.c), so its first op sees them. */
void ctpu__defer_auto_inputs(ctpu_trec *const *in, int n_in);
ctpu_tensor ctpu__defer_node(ctpu_node *node, const char *call, ctpu_trec *const *inputs, const ctpu_tensor *in_h,
                             const double *scalars);
/* Cut this thread's trace: compile (or hit the cache), launch, give every
 * live pending handle its buffer. Errors (OOM, cache-only miss) are returned
 * here and latched on the values. */
ctpu_status ctpu__defer_flush(ctpu_cut_reason why);
/* Make rec's value computed (flushes its trace if it is pending in this
 * thread's trace). False with an error if it belongs to another thread's trace. */
bool ctpu__materialize(ctpu_trec *rec, const char *op, ctpu_cut_reason why);
/* assign in defer and fuse (value semantics through the trace). */
ctpu_status ctpu__defer_assign(ctpu_trec *dst, ctpu_tensor dst_h, ctpu_trec *src, ctpu_op_prov prov);
/* A new handle for the same pending value (views of pending values). */
ctpu_tensor ctpu__defer_alias_handle(ctpu_trec *rec, const char *op);

/* What a capture's flush hands the compiled step (defer.c -> compiled.c),
 * after the launch and before the live handles get their buffers. */
typedef struct {
    uint64_t program_id;
    struct ctpu_program *prog;       /* the caller's reference (retain it to keep it) */
    const ctpu_launch_plan *plan;
    int n_rin;                       /* recorded inputs */
    ctpu_buffer *const *rin_buf;
    const size_t *rin_off;
    const ctpu_vtype *rin_type;
    int n_rscal;                     /* recorded scalars */
    const double *rscal;
    int nreq;                        /* live-out requests */
    const ctpu_liveout_req *reqs;
    ctpu_trec *const *rrec;
    const uint64_t *rh;              /* [nreq] their handle ids */
    /* a dynamic program's launch at the capture's extents (ctpu_mark_dynamic
     * on an input): the bound program that ran (the caller's reference) and
     * its outputs' bytes; NULL: prog ran as compiled, plan->out_bytes */
    struct ctpu_program *run;
    const size_t *out_bytes;
    /* the capture's launch provenance (its command's prov, n_prov, prov_span),
     * a malloc'd copy the sink takes (NULL: none): a replay's device faults
     * name the ops and calls of the capture (op numbers, labels, the call a
     * loss's gather is reported as) */
    ctpu_op_prov *prov;
    int n_prov;
    bool prov_span;
} ctpu_capture_sink;

/* ------------------------------------------------------------ compiled steps (compiled.c) */
/* The capture of this thread, or NULL (cheap: one load). */
static inline struct ctpu_capture *ctpu__capturing(void)
{
    const ctpu_thread_state *s = ctpu__ts;
    return s->cap && ctpu_ts_current() == s ? s->cap : NULL;
}
/* A graph break inside a capture (what: "host read of loss", "set_mode";
 * why a ctpu_cut_reason). True: recorded, the call goes on as defer and
 * fuse. False: the capture is fullgraph, the error is set; the caller fails. */
bool ctpu__capture_break(int why, const char *what);
/* defer.c: a trace cut during a capture (not the capture's own flush). */
void ctpu__capture_cut(int why);
/* tensor.c (ctpu__rng_take): a draw of n from the generator during a
 * capture, at (seed, offset); a replay takes n again, in the same order. */
void ctpu__capture_note_take(uint64_t n, uint64_t seed, uint64_t offset);
/* defer.c: a recorded node reads a draw's seed and offset, its scalars s
 * and s + 1 (sc: the node's scalars from s); a replay puts that draw's new
 * seed and offset there (the draw's op, or an op that reuses its draw:
 * SDPA's backward). */
void ctpu__capture_note_rng(int s, const double *sc);
/* tensor.c: fn changes host state a replay would not change again: the
 * generator's state (ctpu_manual_seed, ctpu_rng_set_state, read by
 * ctpu_rng_get_state) or a release of a tensor made before the call
 * (what names it). A graph break (true: go on as defer and fuse; false:
 * fullgraph, the error is set, the caller changes nothing). True outside
 * a capture. */
bool ctpu__capture_host_effect(const char *what);
/* tensor.c: release of r inside a capture: a graph break when r was made
 * before the call (see ctpu__capture_host_effect). */
bool ctpu__capture_note_release(const struct ctpu_trec *r);
/* defer.c: handle h was assigned in the capture (made before it: a tensor
 * each replay writes; made by fn: its own value). */
void ctpu__capture_note_assign(uint64_t h);
/* defer.c: h is a tensor fn made and assigned in this capture: its write
 * is never in place (the capture's flush gives it new storage). */
bool ctpu__capture_fn_assigned(uint64_t h);
/* defer.c: recorded scalar slot s is an integer operand (a node with
 * CTPU_ATTR_INT_SCALAR: *_scalar_int, clamp_int): when its value equals
 * trunc(scalars[i]) it reads trunc(scalars[i]) at each replay. */
void ctpu__capture_note_int(int s);
/* autograd.c: ctpu_zero_grad(leaf); backward made leaf's .grad g. */
void ctpu__capture_note_zero_grad(uint64_t leaf);
void ctpu__capture_note_grad(uint64_t leaf, uint64_t g);
/* autograd.c: fn read leaf's .grad (ctpu_grad: has, or NULL): whether a
 * leaf made before the call has a .grad is a guard (fn may skip it). */
void ctpu__capture_note_grad_read(uint64_t leaf, bool has);
/* autograd.c: fn asked ctpu_requires_grad of t (ctpu__ag_kind: kind):
 * for a tensor made before the call (not an input), a guard. */
void ctpu__capture_note_kind_read(uint64_t t, int kind);
/* autograd.c: ctpu_set_requires_grad changes r inside a capture: a graph
 * break when r was made before the call (see ctpu__capture_host_effect). */
bool ctpu__capture_note_requires_grad(const struct ctpu_trec *r);
/* defer.c -> compiled.c: the capture's own flush launched; build the replay. */
void ctpu__capture_sink(const ctpu_capture_sink *s);
/* autograd.c: make g (a handle of no scope) leaf's .grad, releasing the old
 * one. False if leaf is not a live leaf. */
bool ctpu__ag_set_grad(ctpu_tensor leaf, ctpu_tensor g);
/* autograd.c: the handle id of leaf record r's .grad (0: none; it may be
 * stale: check it with a live lookup). No validation: for compiled replays. */
uint64_t ctpu__ag_grad_id(const ctpu_trec *r);
/* defer.c: flush with a sink (the capture's own cut); abandon the trace
 * (fullgraph break): assigned tensors keep their old values, the rest is
 * poisoned. */
ctpu_status ctpu__defer_flush_capture(void);
void ctpu__defer_abandon(void);
bool ctpu__defer_has_nodes(void);
/* runtime.c at shutdown: free every compiled step's hold on the cache (the
 * rows stay for the report); after the report, free the freed steps' rows. */
void ctpu__compiled_shutdown(ctpu_runtime *rt);
void ctpu__compiled_final(ctpu_runtime *rt);
/* report.c: the metrics JSON's "compiled_steps" rows. */
struct cJSON;
void ctpu__compiled_json(struct cJSON *doc, ctpu_runtime *rt);

/* ------------------------------------------------------------ reports (report.c) */
/* A defer-and-fuse cut (defer.c, after the cache lookup): why is a
 * ctpu_cut_reason; t the keyed trace (NULL if none: the program's shapes
 * stay unknown); res NULL when no lookup happened; prog NULL when nothing
 * launches. */
/* at: where the trace was cut (a host read: the read; otherwise the last
 * recorded op), its number and label in the trace file's cut event */
/* bound: per dim of t's inputs (in order), the extent a ctpu_mark_dynamic
 * range pads it to (coef x hi; 0: not marked, or automatic), or NULL */
void ctpu__report_cut(int why, ctpu_op_prov at, const ctpu_trace *t, const int64_t *bound, const ctpu_cache_result *res,
                      const ctpu_program *prog);
/* A marked step's cut kept count values live only because their handles
 * were alive (defer.c): the worst cut's count, step and up to
 * CTPU_HELD_EXAMPLES of them ("relu (fc1)") for the report's advice. */
#define CTPU_HELD_EXAMPLES 4
void ctpu__report_held(uint64_t count, uint64_t step, const char (*ex)[96], int n_ex);
/* A defer-and-fuse trace past the recompile limit, run op by op
 * (defer.c): a launch of its structure at its shape (the shape policies). */
void ctpu__report_fallback(const ctpu_trace *t, const int64_t *bound);
/* TORCH_TPU_AUTO_DYNAMIC: the canonical (input, dim, coef) triples that
 * t's structure's first one-dim recompile made dynamic (at most max; 0:
 * it has had none); the report then says they became dynamic. */
int ctpu__report_auto_pairs(const ctpu_trace *t, int *in, int *dim, int *coef, int max);
/* TORCH_TPU_AUTO_DYNAMIC, before t is compiled: the canonical (input, dim,
 * coef) triples of one dim whose extent alone differs from the last
 * launched shape of t's structure (coef c: an extent c x it), if that
 * structure has not had its one-dim recompile yet (at most max; 0: none).
 * Records nothing but t's shape. */
int ctpu__report_auto_would(const ctpu_trace *t, int *in, int *dim, int *coef, int max);
/* A compiled step's replay of program program_id (compiled.c): a launch
 * and cache hit of that program, as defer and fuse counts one (launches,
 * per-op counts, estimates, MFU, $). O(1): the per-op and per-run totals
 * take the replays at the next read. */
void ctpu__report_replay(uint64_t program_id);
void ctpu__report_replay_bound(uint64_t program_id, const ctpu_program *run);
/* A strict/debug op launched (dispatch.c): the node and its program (whose
 * estimate it adds up). */
void ctpu__report_op(const ctpu_node *n, bool hit, const ctpu_program *prog, ctpu_trec *const *in, ctpu_op_prov prov);
/* A host read (tensor.c ctpu_to_host), before it waits. */
void ctpu__report_host_read(size_t bytes, const char *tensor);
/* After a marked step (tensor.c ctpu_mark_step). */
void ctpu__report_step(void);
/* ctpu_sync, at its end; t0 = its start. */
void ctpu__report_sync(uint64_t t0_ns);

#endif
