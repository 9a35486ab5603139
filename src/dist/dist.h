/* Distributed runtime (issue 19): one emulated chip per MPI process.
 *
 * The MPI layer sits beside the device: it knows buffers, dtypes and shapes,
 * never traces or handles. Every collective runs on the device thread (the
 * only thread that calls MPI after ctpu_dist_init, hence
 * MPI_THREAD_SERIALIZED), as a step of a program like any other op.
 *
 * Process-wide state (the MPI world) lives in dist.c, not in ctpu_runtime:
 * MPI is initialised once per process and outlives ctpu_init/ctpu_shutdown
 * cycles, which the runtime struct does not. */
#ifndef CTPU_DIST_H
#define CTPU_DIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctpu.h"

typedef enum {
    CTPU_COLL_ALL_REDUCE = 0,
    CTPU_COLL_BROADCAST,
    CTPU_COLL_ALL_GATHER,
    CTPU_COLL_REDUCE_SCATTER,
    CTPU_COLL_COUNT
} ctpu_coll_kind;

const char *ctpu__coll_name(int kind);   /* "all_reduce", ... */

/* One collective call on raw device memory. in: the input (dtype, ndim,
 * shape); out: the output buffer (all_gather: dim extent * world size;
 * reduce_scatter: dim extent / world size). */
typedef struct {
    int kind;             /* ctpu_coll_kind */
    int op;               /* ctpu_dist_op (all_reduce, reduce_scatter) */
    int dtype;            /* ctpu_dtype of in and out */
    int ndim;
    int64_t shape[8];     /* input shape */
    int root;             /* broadcast */
    int dim;              /* all_gather, reduce_scatter */
    int64_t bucket;       /* -1: none (the SIGTERM line and error messages name it) */
    int64_t step;         /* marked step at dispatch */
    const void *in;
    void *out;
} ctpu_coll_call;

/* Run a collective (device thread). Shapes and dtypes are exchanged first:
 * a mismatch across ranks is CTPU_ERR_SHAPE / CTPU_ERR_DTYPE with a message
 * naming the collective and both ranks' types (out is zeroed). A rank that
 * stops answering for CTPU_DIST_TIMEOUT seconds ends the job with MPI_Abort
 * naming the collective. Without MPI (or world size 1) the collective is
 * the identity of its semantics on one rank. */
ctpu_status ctpu__dist_run(const ctpu_coll_call *c, char *err, size_t errlen);

/* Overlap (see dist.c, "started all_reduces"). Start: the device thread
 * hands an all_reduce to the comm thread (c->in copied at once; c->out, the
 * started value, gets this rank's own input) and goes on; key names the
 * request (the started value's device address). Wait: the device thread
 * blocks until that request is done and copies its result (bytes) to out;
 * a failure (shapes differing across ranks, MPI) comes back here, with err.
 * On one rank both are copies. */
ctpu_status ctpu__dist_start_async(const ctpu_coll_call *c, const void *key, char *err, size_t errlen);
ctpu_status ctpu__dist_wait_async(const void *key, const void *in, void *out, size_t bytes, const char *name,
                                  char *err, size_t errlen);
/* Started all_reduces of the process: how many, their time from start to
 * done (in flight), and the part of it the device thread spent waiting at
 * the consumers (exposed); in flight less exposed ran under the device's
 * other work (hidden). Monotonic clock. */
typedef struct {
    uint64_t started, in_flight_ns, exposed_ns;
} ctpu_dist_overlap_ns;
void ctpu__dist_overlap(ctpu_dist_overlap_ns *o);

/* MPI start and stop (ctpu_dist_init / ctpu_dist_shutdown call them around
 * ctpu_init / ctpu_shutdown). Start: CTPU_OK, or a status with err set. */
ctpu_status ctpu__dist_start(char *err, size_t len);
void ctpu__dist_stop(void);

/* Test hook: all_reduce always in one round (every buffer to every rank,
 * folded locally), not only at two ranks or for small buffers; the bits are
 * the same either way, which tests/dist checks. */
void ctpu__dist_test_one_round(bool on);

/* Local ranks on this node (1 when not distributed): ctpu_init divides the
 * default HBM cap and kernel thread count by it. */
int ctpu__dist_local_size(void);

/* Wall time the process has spent in ctpu__dist_run (ns, monotonic clock;
 * waiting for the other ranks included): the measured side of the
 * compute / communication split. */
uint64_t ctpu__dist_busy_ns(void);

/* The pure left fold of n rank-ordered blocks of count elements (src[r] is
 * rank r's block), into dst: dst = ((x0 + x1) + x2) + ..., rounded to dtype
 * after each addition; mean divides the sum once by n. Exposed for tests. */
void ctpu__dist_fold(int dtype, int op, int n, const void *const *src, int64_t count, void *dst);

/* Eager side (src/eager/dist_api.c): this run's collective totals, for
 * ctpu_dist_get_stats. add: one collective of `bytes` per chip, at dispatch. */
void ctpu__dist_stats_add(int kind, double bytes, int64_t bucket);
void ctpu__dist_stats_clear(void);
/* Step S (the marked-step count during it) made a collective in a bucket. */
bool ctpu__dist_is_train_step(uint64_t step);
/* The report's per-step figures: per training step when there is one
 * (gradient buckets' collectives, the training steps' compute), else per
 * marked step over every collective. overlap_share: hidden / in flight. */
typedef struct {
    bool train;
    double steps, collectives, bytes, compute_s, ici_s, ici_s_8, ici_s_256, ici_s_pod, overlap_share;
} ctpu_dist_per_step;
void ctpu__dist_per_step(const ctpu_dist_stats *s, ctpu_dist_per_step *p);
/* report.c: the cost estimate (current chip) of the marked steps that were
 * training steps, the step in progress included when it is one. */
double ctpu__report_train_compute_s(void);

#endif
