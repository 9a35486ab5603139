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
uint64_t ctpu_key_hash(const uint8_t *key, size_t len);   /* XXH3-64 */

/* A compiled program with the data its steps point at. */
typedef struct ctpu_program {
    ctpu_dev_program prog;
    void **mem;                /* allocations holding steps and step data */
    int n_mem;
    uint64_t compile_ns;
    ctpu_cost_program cost;    /* the roofline estimate of one launch (src/cost) */
} ctpu_program;

/* Compile a trace into a program. NULL with a message on failure. */
ctpu_program *ctpu_fuse_compile(const ctpu_trace *t, char *err, size_t errlen);
void ctpu_program_free(ctpu_program *c);

/* The launch plan of a fused program (made by ctpu_trace_finalize, kept in
 * the cache beside the program): how a recorded trace with the same raw key
 * binds its inputs, scalars and live-out requests. One malloc block. */
typedef struct ctpu_launch_plan {
    int n_in, n_out, n_scal, n_req;
    int32_t *in_src;           /* [n_in] recorded input of canonical input k */
    int32_t *req_out;          /* [n_req] output of request q (-1: none) */
    int32_t *alias_req;        /* [n_out] request whose buffer output j writes into, or -1 */
    int32_t *scal_src;         /* [n_scal] recorded scalar index */
    size_t *out_bytes;         /* [n_out] */
} ctpu_launch_plan;

/* Program cache keyed by the canonical key: full compare on hit. A test hook
 * (src/testing.h) forces every hash to one value (collisions must still give
 * the right program; they are counted, in the metrics' "cache" object and
 * the cache report). capacity 0 = unbounded (strict eager's table). */
typedef struct ctpu_cache ctpu_cache;
ctpu_cache *ctpu_cache_create(size_t capacity);
void ctpu_cache_destroy(ctpu_cache *c);

typedef struct {
    bool allow_compile;            /* false: cache-only, a miss is refused */
    bool track_recompiles;         /* compute structural keys, reasons, thrash */
    uint64_t step;                 /* the marked step count, for reports */
    ctpu_device *dev;              /* evicted programs are freed once its commands are done */
    const char *const *in_names;   /* [n_inputs] user names of the canonical inputs (ctpu_set_name), or NULL */
} ctpu_cache_opts;

typedef struct {
    bool hit, refused, recompile, thrash;
    int evicted;
    int collisions;                /* entries whose hash matched but full key did not (the compare kept them apart) */
    uint64_t program_id;
    char reason[160];              /* recompile: "input 0 dim 0: 128 -> 96" */
} ctpu_cache_result;

typedef struct {
    uint64_t requests, hits, misses, compiles, recompiles, evictions, thrash, collisions;
    size_t entries, capacity;
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
 * returns the program (and its launch plan in *plan, if asked). A miss
 * returns NULL with *miss set: compile, then ctpu_cache_insert or
 * ctpu_cache_abandon. NULL with *miss NULL: refused (cache-only: res->refused)
 * or out of memory; err says which. */
ctpu_program *ctpu_cache_find(ctpu_cache *c, const uint8_t *key, size_t len, const ctpu_cache_opts *o,
                              ctpu_cache_result *res, const ctpu_launch_plan **plan, ctpu_cache_pending **miss,
                              char *err, size_t errlen);
/* Insert the program compiled for a miss from trace t (plan may be NULL),
 * taking both; evicts past capacity. Returns prog, or NULL on out of memory
 * (both freed, the miss abandoned). Fills res's recompile, thrash, evicted,
 * program_id. */
ctpu_program *ctpu_cache_insert(ctpu_cache *c, ctpu_cache_pending *miss, const ctpu_trace *t, ctpu_program *prog,
                                ctpu_launch_plan *plan, const ctpu_cache_opts *o, ctpu_cache_result *res,
                                char *err, size_t errlen);
void ctpu_cache_abandon(ctpu_cache *c, ctpu_cache_pending *miss);
/* What a trace that missed differs in from the cached programs (cache-only
 * errors): a cached program of the same structure gives the dim that
 * changed, as a recompile reason does ("input 0 (x) dim 0: 128 -> 96, was
 * program 2"); otherwise "no cached program has this structure". in_names
 * as in ctpu_cache_opts (may be NULL). */
/* Log a structure change between consecutive cuts in the recompile log
 * (no recompile counted). */
void ctpu_cache_log_change(ctpu_cache *c, const ctpu_recompile_rec *rec);
void ctpu_cache_describe_miss(ctpu_cache *c, const ctpu_trace *t, const char *const *in_names, char *out, size_t len);
/* Find, compile a miss, insert (strict eager's one-node programs). *hit
 * tells which; *collisions (may be NULL) gets the hash collisions the
 * lookup met. NULL on a compile error. */
ctpu_program *ctpu_cache_get(ctpu_cache *c, const uint8_t *key, size_t len, const ctpu_trace *t,
                             bool *hit, int *collisions, char *err, size_t errlen);

void ctpu_cache_get_stats(ctpu_cache *c, ctpu_cache_stats *out);
/* Most recently used first; returns the count written. */
size_t ctpu_cache_entries_info(ctpu_cache *c, ctpu_cache_entry_info *out, size_t max);
/* The last recompiles (up to 64), oldest first. */
size_t ctpu_cache_recompiles(ctpu_cache *c, ctpu_recompile_rec *out, size_t max);
/* ctpu_cache_entries, ctpu_cache_collisions, ctpu_cache_force_hash: test
 * hooks, declared in src/testing.h */

#endif
