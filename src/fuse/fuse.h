/* Traces, their canonical keys, the program caches and the compiler.
 *
 * Strict and debug eager compile each op as a trace of one node through the
 * same key -> cache -> compile path that defer and fuse uses for whole
 * traces (DESIGN.md "One kernel library, one compiler, one executor"). */
#ifndef CTPU_FUSE_H
#define CTPU_FUSE_H

#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include "ops.h"
#include "device/device.h"

/* A trace: SSA values. Ids [0, n_inputs) are inputs (device buffers bound at
 * launch); id n_inputs + i is the output of nodes[i]. */
typedef struct {
    int n_inputs, n_nodes, n_outputs;
    ctpu_vtype *in_type;       /* [n_inputs] */
    ctpu_node *nodes;          /* [n_nodes] */
    int32_t *outputs;          /* [n_outputs] value ids, live-out */
    int n_scalars;             /* runtime scalars, in node order */
    uint8_t precision;         /* compile options: part of the key */
    uint8_t debug_checks;
} ctpu_trace;

/* Canonical key: a byte encoding of everything that determines the program
 * (op codes, attrs, dtypes, extents, wiring, live-out, options); host scalars
 * are not in it. Returns the length written (<= cap), or 0 if cap is too
 * small. */
size_t ctpu_trace_key(const ctpu_trace *t, uint8_t *buf, size_t cap);
uint64_t ctpu_key_hash(const uint8_t *key, size_t len);   /* XXH3-64 */

/* A compiled program with the data its steps point at. */
typedef struct ctpu_compiled {
    ctpu_program prog;
    void *mem;                 /* one allocation holding steps and step data */
    uint64_t compile_ns;
    uint64_t hits;
} ctpu_compiled;

/* Compile a trace into a program. NULL with a message on failure. */
ctpu_compiled *ctpu_compile(const ctpu_trace *t, char *err, size_t errlen);
void ctpu_compiled_free(ctpu_compiled *c);

/* Program cache keyed by the canonical key: full compare on hit. A test hook
 * forces every hash to one value (collisions must still give the right
 * program). capacity 0 = unbounded (strict eager's table). */
typedef struct ctpu_cache ctpu_cache;
ctpu_cache *ctpu_cache_create(size_t capacity);
void ctpu_cache_destroy(ctpu_cache *c);
/* Look up a key; on a miss, compile the trace and insert. *hit tells which.
 * NULL on a compile error. */
ctpu_compiled *ctpu_cache_get(ctpu_cache *c, const uint8_t *key, size_t len, const ctpu_trace *t,
                              bool *hit, char *err, size_t errlen);
size_t ctpu_cache_entries(ctpu_cache *c);
uint64_t ctpu_cache_collisions(ctpu_cache *c);
void ctpu_cache_force_hash(ctpu_cache *c, bool on, uint64_t value);

#endif
