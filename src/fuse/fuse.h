/* Traces, their canonical keys, the program caches and the compiler.
 *
 * Strict and debug eager compile each op as a trace of one node through the
 * same key -> cache -> compile path that defer and fuse uses for whole
 * traces (docs/DESIGN.md "One kernel library, one compiler, one executor"). */
#ifndef CTPU_FUSE_H
#define CTPU_FUSE_H

#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdatomic.h>

#include "ops.h"
#include "cost/costmodel.h"
#include "device/device.h"

/* A trace: SSA values. Ids [0, n_inputs) are inputs (device buffers bound at
 * launch); id n_inputs + i is the output of nodes[i]. */
typedef struct {
    int n_inputs, n_nodes, n_outputs;
    ctpu_vtype *in_type;       /* [n_inputs] */
    ctpu_node *nodes;          /* [n_nodes] */
    int32_t *outputs;          /* [n_outputs] value ids, live-out */
    int32_t *out_alias;        /* [n_outputs] or NULL: the input whose buffer output j
                                  is written into (in place, after every read of the old
                                  value), CTPU_ALIAS_DONATED (a buffer the program does
                                  not read), or -1 (a fresh buffer) */
    int n_scalars;             /* runtime scalars, in node order */
    uint8_t precision;         /* compile options: part of the key */
    uint8_t debug_checks;
} ctpu_trace;

#define CTPU_ALIAS_DONATED (-2)

/* Canonical key: a byte encoding of everything that determines the program
 * (op codes, attrs, dtypes, extents, wiring, live-out, options); host scalars
 * are not in it. Returns the length written (<= cap), or 0 if cap is too
 * small. */
size_t ctpu_trace_key(const ctpu_trace *t, uint8_t *buf, size_t cap);
/* The structural key's hash: the key without extents (shapes and
 * extent-holding attrs zeroed), as the recompile tracking and limit use it;
 * 0 on out of memory. */
uint64_t ctpu_trace_struct_hash(const ctpu_trace *t);
uint64_t ctpu_key_hash(const uint8_t *key, size_t len);   /* XXH3-64 */

/* A compiled program with the data its steps point at.
 *
 * Lifetime: counted references, one held by its cache entry, one by each
 * thread's strict front slot holding it (dispatch.c), one by each caller
 * between a cache lookup and its submit (ctpu_cache_release). An evicted
 * program is an orphan of its cache, freed once no reference is left and
 * the device has run its last command (last_seq), so eviction never frees
 * a program another thread is about to submit or the device is running. */
typedef struct ctpu_program {
    ctpu_dev_program prog;
    void **mem;                /* allocations holding steps and step data */
    int n_mem;
    uint64_t compile_ns;
    ctpu_cost_program cost;    /* the roofline estimate of one launch (src/cost) */
    atomic_int refs;           /* 1 at compile: the compiler's caller's */
    atomic_uint_fast64_t last_seq;  /* the newest command submitted with it */
    struct ctpu_program *orphan_next;
    struct ctpu_launch_plan *plan;  /* the cache's: a fused entry's launch plan, freed with the program */
    const int32_t *step_node;  /* [n_steps] the canonical node naming each step (its group's last) */
    struct ctpu_dyn_info *dyn; /* a dynamic program (ctpu_fuse_compile_dynamic): what a bind reuses; else NULL */
    const ctpu_trace *bound_trace;  /* a bound launch (ctpu_fuse_bind): the trace at its extents (its own copy of
                                       the inputs' and nodes' types and attrs; the rest points into the dynamic
                                       program's), for output sizes and the report; else NULL */
    _Atomic uint64_t struct_hash;   /* a bound launch: ctpu_trace_struct_hash(bound_trace) once computed, else 0 */
} ctpu_program;

/* Compile a trace into a program (one reference, the caller's). NULL with
 * a message on failure. */
ctpu_program *ctpu_fuse_compile(const ctpu_trace *t, char *err, size_t errlen);
void ctpu_program_free(ctpu_program *c);
/* Dynamic dims (DESIGN.md "Dynamic dims"): a program compiled from t that
 * keeps its fusion groups, slots, step order and fault dependencies, so that
 * a trace of the same structure at other extents can be bound to it. */
ctpu_program *ctpu_fuse_compile_dynamic(const ctpu_trace *t, char *err, size_t errlen);
/* The launch of dynamic program p for trace t (p's structure, the launch's
 * extents and attrs): the fusion groups are checked to hold at these
 * extents, then each step's data (extents, broadcast plans, block counts,
 * scratch offsets, element counts) and the cost estimate are derived from
 * them. A new program with one reference, run once and dropped (its fault
 * tables point into p: p must outlive it) that keeps a copy of t
 * (bound_trace); NULL with err set when the groups do not hold (compile t
 * statically instead) or out of memory. */
/* The canonical trace a dynamic program was compiled from (NULL: not dynamic). */
const ctpu_trace *ctpu_program_dyn_trace(const ctpu_program *p);
ctpu_program *ctpu_fuse_bind(const ctpu_program *p, const ctpu_trace *t, char *err, size_t errlen);
/* Bound launches a dynamic program keeps (DESIGN.md "Dynamic dims"): a
 * launch at extents bound before reuses that bound program. */
#define CTPU_DYN_BOUND_CAP 16
/* ctpu_fuse_bind through dynamic program p's bound launches: a launch at the
 * extents and attrs of one of the last CTPU_DYN_BOUND_CAP distinct binds
 * (*reused set) returns that bound program, else it is bound and kept in
 * place of the least recently used, which is returned in *evicted (its
 * reference the slot's: the caller hands it to ctpu_cache_orphan, it may
 * still be running) or NULL. The bound program comes with a reference for
 * the caller (ctpu_cache_release after its submit); p's keep theirs until
 * p is freed (ctpu_program_free frees them: nobody can hold one then, a
 * launch holds p while it holds its bound program). NULL with err as
 * ctpu_fuse_bind's. Thread-safe. */
ctpu_program *ctpu_fuse_bind_cached(ctpu_program *p, const ctpu_trace *t, bool *reused, ctpu_program **evicted,
                                    char *err, size_t errlen);
/* Is b still one of dynamic program p's kept bound launches? If so it
 * counts as used now (its slot the most recently used). b must be held
 * (a reference), so that its address cannot be another launch's. */
bool ctpu_fuse_bound_touch(ctpu_program *p, const ctpu_program *b);
/* A command running p was submitted as seq (before its submitter lets go
 * of its reference). */
static inline void ctpu_program_note_submit(ctpu_program *p, uint64_t seq)
{
    uint_fast64_t cur = atomic_load_explicit(&p->last_seq, memory_order_relaxed);
    while (cur < seq && !atomic_compare_exchange_weak(&p->last_seq, &cur, seq)) {}
}
static inline void ctpu_program_retain(ctpu_program *p) { atomic_fetch_add(&p->refs, 1); }

/* The launch plan of a fused program (made by ctpu_trace_finalize, kept in
 * the cache beside the program): how a recorded trace with the same raw key
 * binds its inputs, scalars and live-out requests. One malloc block. */
typedef struct ctpu_launch_plan {
    int n_in, n_out, n_scal, n_req;
    int32_t *in_src;           /* [n_in] recorded input of canonical input k */
    int32_t *req_out;          /* [n_req] output of request q (-1: none) */
    int32_t *alias_req;        /* [n_out] request whose buffer output j writes into, or -1 */
    int32_t *scal_src;         /* [n_scal] recorded scalar index */
    bool scal_ident;           /* scal_src[i] == i for every i: the recorded scalars are the program's */
    int n_nodes;
    int32_t *node_src;         /* [n_nodes] recorded node of canonical node k (its op number, label) */
    size_t *out_bytes;         /* [n_out] */
} ctpu_launch_plan;

/* Program cache keyed by the canonical key: full compare on hit. A test hook
 * (src/testing.h) forces every hash to one value (collisions must still give
 * the right program; they are counted, in the metrics' "cache" object and
 * the cache report). capacity 0 = unbounded. recompile_limit: distinct
 * shapes a structure may compile for (ctpu_cache_shape_allowed; 0 = no
 * limit). */
typedef struct ctpu_cache ctpu_cache;
ctpu_cache *ctpu_cache_create(size_t capacity, size_t recompile_limit);
/* The device whose commands run this cache's programs (orphans are freed
 * once it has run their last command); NULL: freed with their last ref. */
void ctpu_cache_set_device(ctpu_cache *c, ctpu_device *dev);
/* Frees every program, referenced or not (the device is idle or gone). */
void ctpu_cache_destroy(ctpu_cache *c);
/* Let go of a reference got from find, insert or get (or retained). */
void ctpu_cache_release(ctpu_cache *c, ctpu_program *p);

/* What a recompile reason names (each array may be NULL, an entry NULL or
 * ""): per canonical input, its user name (ctpu_set_name) and the op of
 * this recording that reads it first ("op #3, \"block1.attn\""); per
 * canonical node, its op number and label. */
typedef struct {
    const char *const *in_names;   /* [n_inputs] */
    const char *const *in_prov;    /* [n_inputs] */
    const char *const *node_prov;  /* [n_nodes] */
} ctpu_diff_names;

typedef struct {
    bool allow_compile;            /* false: cache-only, a miss is refused */
    bool track_recompiles;         /* compute structural keys, reasons, thrash */
    uint64_t step;                 /* the marked step count, for reports */
    ctpu_device *dev;              /* evicted programs are freed once its commands are done */
    ctpu_diff_names names;         /* what a recompile reason names (from this recording, never the compiling one) */
    const char *reason;            /* a recompile's reason when the caller knows it better (a dynamic dim
                                      out of its range), or NULL */
} ctpu_cache_opts;

typedef struct {
    bool hit, refused, recompile, thrash;
    int evicted;
    int collisions;                /* entries whose hash matched but full key did not (the compare kept them apart) */
    uint64_t program_id;
    char reason[160];              /* recompile: "input 0 dim 0: 128 -> 96", "input 0 (x, op #3): dim 0: ..." */
} ctpu_cache_result;

typedef struct {
    uint64_t requests, hits, misses, compiles, recompiles, evictions, thrash, collisions;
    uint64_t limit_fallbacks;      /* misses refused by the recompile limit */
    size_t entries, capacity;
    size_t orphans;                /* evicted programs not freed yet */
} ctpu_cache_stats;

typedef struct {
    uint64_t id, hits, compile_ns, first_use, last_use;
    size_t bytes;
    int n_nodes, n_steps;
    char summary[96];              /* first ops: "matmul>add>relu>..." */
} ctpu_cache_entry_info;

typedef struct {
    uint64_t step, old_program, new_program;
    char reason[160];
    /* a structure change between consecutive cuts (not a recompile): the
     * input that was a value computed by op made_by in the previous program */
    bool structure;
    char made_by[24];
    char tensor[64];               /* that input's name (ctpu_set_name), or "" */
} ctpu_recompile_rec;

/* A miss the caller compiles (outside the cache lock), then inserts or
 * abandons; until then, other threads missing the same key wait. */
typedef struct ctpu_cache_pending ctpu_cache_pending;

/* Find a key (o may be NULL: compile allowed, no recompile tracking). A hit
 * returns the program with a reference for the caller (and its launch plan
 * in *plan, if asked: valid while that reference is held). A miss
 * returns NULL with *miss set: compile, then ctpu_cache_insert or
 * ctpu_cache_abandon. NULL with *miss NULL: refused (cache-only: res->refused)
 * or out of memory; err says which. */
ctpu_program *ctpu_cache_find(ctpu_cache *c, const uint8_t *key, size_t len, const ctpu_cache_opts *o,
                              ctpu_cache_result *res, const ctpu_launch_plan **plan, ctpu_cache_pending **miss,
                              char *err, size_t errlen);
/* The same with the key's hash given (ctpu_key_hash(key, len); a trace's key
 * is hashed while it is recorded, ctpu_trace_rec_key_final). */
ctpu_program *ctpu_cache_find_hashed(ctpu_cache *c, const uint8_t *key, size_t len, uint64_t hash,
                                     const ctpu_cache_opts *o, ctpu_cache_result *res, const ctpu_launch_plan **plan,
                                     ctpu_cache_pending **miss, char *err, size_t errlen);
/* Insert the program compiled for a miss from trace t (plan may be NULL),
 * taking both (the program's reference becomes the entry's); evicts past
 * capacity. Returns prog with a reference for the caller, or NULL on out of memory
 * (both freed, the miss abandoned). Fills res's recompile, thrash, evicted,
 * program_id. */
ctpu_program *ctpu_cache_insert(ctpu_cache *c, ctpu_cache_pending *miss, const ctpu_trace *t, ctpu_program *prog,
                                ctpu_launch_plan *plan, const ctpu_cache_opts *o, ctpu_cache_result *res,
                                char *err, size_t errlen);
void ctpu_cache_abandon(ctpu_cache *c, ctpu_cache_pending *miss);
/* A hit as ctpu_cache_find's (counted as a request and a hit), or NULL
 * with nothing counted or registered (a dynamic trace's exact static entry
 * is looked for first, DESIGN.md "Dynamic dims"). */
ctpu_program *ctpu_cache_peek(ctpu_cache *c, const uint8_t *key, size_t len, const ctpu_cache_opts *o,
                              ctpu_cache_result *res, const ctpu_launch_plan **plan);
ctpu_program *ctpu_cache_peek_hashed(ctpu_cache *c, const uint8_t *key, size_t len, uint64_t hash,
                                     const ctpu_cache_opts *o, ctpu_cache_result *res, const ctpu_launch_plan **plan);
/* Bound aliases (DESIGN.md "Dynamic dims"): a dynamic program's launch
 * remembered by the exact static key of the trace that bound it and a
 * signature of that trace's dynamic marks (sig, the caller's hash of every
 * mark it recorded), so the same trace again resolves to the same program
 * and bound launch without building its dynamic key or binding. At most
 * CTPU_CACHE_ALIASES, least recently used replaced; an alias goes with its
 * program's entry. ctpu_cache_alias_add: prog is a cached dynamic program,
 * bound its launch (the alias takes a reference). ctpu_cache_peek_alias: a
 * hit on prog's entry as ctpu_cache_peek's (counted, prog with a reference,
 * *plan its plan) and *bound with a reference for the caller (ctpu_cache_release
 * after its submit), or NULL with nothing counted. */
#define CTPU_CACHE_ALIASES 64
void ctpu_cache_alias_add(ctpu_cache *c, const uint8_t *key, size_t len, uint64_t hash, uint64_t sig,
                          ctpu_program *prog, ctpu_program *bound);
ctpu_program *ctpu_cache_peek_alias(ctpu_cache *c, const uint8_t *key, size_t len, uint64_t hash, uint64_t sig,
                                    const ctpu_cache_opts *o, ctpu_cache_result *res, const ctpu_launch_plan **plan,
                                    ctpu_program **bound);
/* Hand over a program nobody else holds (a dynamic program's bound launch,
 * submitted): it is freed once its last command has run, the caller's
 * reference dropped here. */
void ctpu_cache_orphan(ctpu_cache *c, ctpu_program *p);
/* Recompile limit (tracked caches): before compiling a miss from trace t,
 * count its shape against its structure's (the key without extents) over
 * the cache's lifetime, evicted programs included; a key compiled before
 * counts once. True: compile it. False: the structure has compiled
 * recompile_limit shapes and this is a new one (the caller abandons the
 * miss and runs the trace op by op); the first time for a structure,
 * *first is set and msg says which ("program 2 (rand_normal→relu→sum)
 * passed TORCH_TPU_RECOMPILE_LIMIT=8: dim 0 varies: 7 -> 8 -> 9"); where:
 * the label the structure starts in, or NULL ("program 2 (rand_normal→relu
 * →sum, from \"block1\") passed ..."). */
bool ctpu_cache_shape_allowed(ctpu_cache *c, const ctpu_cache_pending *miss, const ctpu_trace *t, const char *where,
                              bool *first, char *msg, size_t len);
/* What a trace that missed differs in from the cached programs (cache-only
 * errors): a cached program of the same structure gives the dim that
 * changed, as a recompile reason does ("input 0 (x) dim 0: 128 -> 96, was
 * program 2"); otherwise "no cached program has this structure". in_names
 * as in ctpu_cache_opts (may be NULL). */
/* Log a structure change between consecutive cuts in the recompile log
 * (no recompile counted). */
void ctpu_cache_log_change(ctpu_cache *c, const ctpu_recompile_rec *rec);
void ctpu_cache_describe_miss(ctpu_cache *c, const ctpu_trace *t, const ctpu_diff_names *dn, char *out, size_t len);
/* Find, compile a miss, insert (strict eager's one-node programs), the
 * program returned with a reference for the caller. res (hit, collisions
 * the lookup met, evicted) is filled. NULL on a compile error. */
ctpu_program *ctpu_cache_get(ctpu_cache *c, const uint8_t *key, size_t len, const ctpu_trace *t,
                             ctpu_cache_result *res, char *err, size_t errlen);

void ctpu_cache_get_stats(ctpu_cache *c, ctpu_cache_stats *out);
/* Most recently used first; returns the count written. */
size_t ctpu_cache_entries_info(ctpu_cache *c, ctpu_cache_entry_info *out, size_t max);
/* The last recompiles (up to 64), oldest first. */
size_t ctpu_cache_recompiles(ctpu_cache *c, ctpu_recompile_rec *out, size_t max);
/* ctpu_cache_entries, ctpu_cache_collisions, ctpu_cache_force_hash: test
 * hooks, declared in src/testing.h */

#endif
