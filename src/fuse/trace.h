/* Recording a trace (defer and fuse) and finalising it at a cut into a
 * canonical trace: dead code removed, inputs numbered by first use, live-out
 * values as outputs, parameter writes as input-output aliases. */
#ifndef CTPU_TRACE_H
#define CTPU_TRACE_H

#include "fuse.h"

/* A value reference while recording: >= 0 is node i's output, < 0 is input
 * -(v+1). CTPU_VREF_OOM (and its negation) say "out of memory". */
typedef int32_t ctpu_vref;
#define CTPU_VREF_OOM 0x7fffffff

typedef struct ctpu_trace_rec ctpu_trace_rec;

ctpu_trace_rec *ctpu_trace_rec_create(void);
void ctpu_trace_rec_destroy(ctpu_trace_rec *r, ctpu_device *dev);
/* Drop everything recorded (releases the input buffer refs). */
void ctpu_trace_rec_reset(ctpu_trace_rec *r, ctpu_device *dev);
int ctpu_trace_rec_nodes(const ctpu_trace_rec *r);

/* An input: a device buffer (a ref is taken) viewed at off with type t. The
 * same (buffer, offset, type) gives the same input. Returns its vref (< 0),
 * or CTPU_VREF_OOM on out of memory. */
ctpu_vref ctpu_trace_rec_input(ctpu_trace_rec *r, ctpu_buffer *buf, size_t off, const ctpu_vtype *t);
/* A node; node->in[] hold vrefs; its n_scalars runtime scalars are copied.
 * Returns its vref (>= 0), or -CTPU_VREF_OOM on out of memory. */
ctpu_vref ctpu_trace_rec_node(ctpu_trace_rec *r, const ctpu_node *node, const double *scalars, ctpu_op_prov prov);
/* The raw key so far: every input and node in recording order (types,
 * wiring, attrs; no scalar values). False if it ran out of memory. */
bool ctpu_trace_rec_key(const ctpu_trace_rec *r, const uint8_t **key, size_t *len);
/* The full key at a cut, built and hashed while recording: the raw key
 * followed by the caller's suffix (the live-out requests and options), and
 * its XXH3-64 (the running hash of the recorded bytes, folded in as they
 * come, carried over the suffix: no walk over the trace). *key points into
 * the recorder (valid until it records or resets again). False if it ran
 * out of memory. */
bool ctpu_trace_rec_key_final(ctpu_trace_rec *r, const void *suffix, size_t slen, const uint8_t **key, size_t *len,
                              uint64_t *hash);
/* The raw key written from scratch by walking the recorded inputs and
 * nodes (the incremental key's specification; tests compare the two).
 * Returns its length, or 0 if cap is too small. */
size_t ctpu_trace_rec_key_scratch(const ctpu_trace_rec *r, uint8_t *buf, size_t cap);
/* [nodes] 1 where some recorded node reads that node's value. */
const uint8_t *ctpu_trace_rec_read(const ctpu_trace_rec *r);
/* The provenance of the recorded nodes with the lowest nonzero and the
 * highest op number (the first of equals; node 0 when none is numbered):
 * what a program running every recorded node spans. False: no nodes. */
bool ctpu_trace_rec_prov_span(const ctpu_trace_rec *r, ctpu_op_prov *lo, ctpu_op_prov *hi);
int ctpu_trace_rec_inputs(const ctpu_trace_rec *r, ctpu_buffer *const **bufs, const size_t **offs,
                          const ctpu_vtype **types);
/* How many of r's input entries read buf (each counts once in buf's
 * trace_readers while r holds it). */
int ctpu_trace_rec_reads_buf(const ctpu_trace_rec *r, const ctpu_buffer *buf);
const double *ctpu_trace_rec_scalars(const ctpu_trace_rec *r);
/* Node i as recorded (its in[] are vrefs) and its runtime scalars. */
const ctpu_node *ctpu_trace_rec_node_at(const ctpu_trace_rec *r, int i, const double **scalars);
int ctpu_trace_rec_n_scalars(const ctpu_trace_rec *r);
/* Each recorded node's op number and label (the plan's node_src maps a
 * program's nodes to them). */
const ctpu_op_prov *ctpu_trace_rec_prov(const ctpu_trace_rec *r);

/* One live-out request: value v is wanted in a buffer; alias_buf (may be
 * NULL) is a buffer it should be written into in place (an assigned
 * parameter whose storage nothing else shares). */
typedef struct {
    ctpu_vref v;
    ctpu_buffer *alias_buf;
    size_t alias_off;
} ctpu_liveout_req;

typedef struct {
    ctpu_trace t;              /* canonical trace (owns its arrays) */
    ctpu_launch_plan *plan;    /* how a later trace with the same raw key binds (owned; a
                                  caller may take it and set this NULL) */
} ctpu_trace_final;

/* Finalise for the given requests. Returns false on out of memory. */
bool ctpu_trace_finalize(const ctpu_trace_rec *r, const ctpu_liveout_req *reqs, int nreq,
                         uint8_t precision, uint8_t debug_checks, ctpu_trace_final *out);
void ctpu_trace_final_free(ctpu_trace_final *f);

#endif
