/* Metrics registry: named counters and timers (PyTorch/XLA metrics style).
 * Counters are atomics indexed by an enum generated from one table; timers
 * keep count, total, min, max and a bounded ring of recent samples for
 * percentiles (a timer's unit is ns, or "count" for distributions such as
 * fused kernels per program). A bounded per-step history of cumulative
 * cache requests / hits / compiles feeds the reports' plots and warm-up
 * figure. Thread-safe. */
#ifndef CTPU_METRICS_H
#define CTPU_METRICS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CTPU_COUNTER_TABLE(X) \
    X(OPS_DISPATCHED,      "ops_dispatched") \
    X(PROGRAMS_COMPILED,   "programs_compiled") \
    X(CACHE_REQUESTS,      "cache_requests") \
    X(CACHE_HITS,          "cache_hits") \
    X(CACHE_MISSES,        "cache_misses") \
    X(STRICT_CACHE_REQUESTS, "strict_cache_requests") \
    X(STRICT_CACHE_HITS,   "strict_cache_hits") \
    X(STRICT_CACHE_MISSES, "strict_cache_misses") \
    X(STRICT_CACHE_ENTRIES, "strict_cache_entries") \
    X(STRICT_CACHE_EVICTIONS, "strict_cache_evictions") \
    X(RECOMPILE_LIMIT_FALLBACKS, "recompile_limit_fallbacks") \
    X(SYNCS,               "syncs") \
    X(HOST_READS,          "host_reads") \
    X(COMMANDS_EXECUTED,   "commands_executed") \
    X(HBM_BYTES_ALLOCATED, "hbm_bytes_allocated") \
    X(HBM_ALLOCS,          "hbm_allocs") \
    X(HBM_OOM,             "hbm_oom") \
    X(H2D_BYTES,           "host_to_device_bytes") \
    X(D2H_BYTES,           "device_to_host_bytes") \
    X(ASSIGN_IN_PLACE,     "assign_in_place") \
    X(ASSIGN_COPY,         "assign_copy_on_write") \
    X(DEVICE_FAULTS,       "device_faults") \
    X(MARKED_STEPS,        "marked_steps") \
    X(MXU_MACS_USEFUL,     "mxu_macs_useful") \
    X(MXU_MACS_PADDED,     "mxu_macs_padded") \
    X(FUSED_CACHE_REQUESTS, "fused_cache_requests") \
    X(FUSED_CACHE_HITS,    "fused_cache_hits") \
    X(FUSED_CACHE_MISSES,  "fused_cache_misses") \
    X(RECOMPILES,          "recompiles") \
    X(DYNAMIC_BINDS,       "dynamic_binds") \
    X(DYNAMIC_BIND_REUSES, "dynamic_bind_reuses") \
    X(STRICT_RECOMPILES,   "strict_recompiles") \
    X(CACHE_EVICTIONS,     "cache_evictions") \
    X(CACHE_THRASH,        "cache_thrash") \
    X(CACHE_COLLISIONS,    "cache_collisions") \
    X(PROGRAMS_LAUNCHED,   "programs_launched") \
    X(OPS_RECORDED,        "ops_recorded") \
    X(FUSED_STEPS,         "fused_program_steps") \
    X(TRACE_CUTS,          "trace_cuts") \
    X(CUT_MARK_STEP,       "trace_cuts_mark_step") \
    X(CUT_HOST_READ,       "trace_cuts_host_read") \
    X(CUT_SYNC,            "trace_cuts_sync") \
    X(CUT_LOOP,            "trace_cuts_loop_detector") \
    X(CUT_LIMIT,           "trace_cuts_length_limit") \
    X(CUT_MODE,            "trace_cuts_mode_switch") \
    X(CUT_COLLECTIVE,      "trace_cuts_collective")

/* X(ENUM, "name", "unit"): unit "ns" (durations) or "count" (distributions). */
#define CTPU_TIMER_TABLE(X) \
    X(COMPILE_TIME,  "compile_time", "ns") \
    X(DYNAMIC_BIND_TIME, "dynamic_bind_time", "ns") \
    X(EXECUTE_TIME,  "execute_time", "ns") \
    X(SYNC_WAIT,     "sync_wait", "ns") \
    X(PROGRAM_OPS,   "ops_per_program", "count") \
    X(FUSED_KERNELS, "fused_kernels_per_program", "count")

typedef enum {
#define X(e, n) CTPU_CTR_##e,
    CTPU_COUNTER_TABLE(X)
#undef X
    CTPU_CTR_COUNT
} ctpu_counter_id;

typedef enum {
#define X(e, n, u) CTPU_TMR_##e,
    CTPU_TIMER_TABLE(X)
#undef X
    CTPU_TMR_COUNT
} ctpu_timer_id;

#define CTPU_TIMER_SAMPLES 1024
typedef struct {
    uint64_t count, total_ns, min_ns, max_ns;
    uint64_t samples[CTPU_TIMER_SAMPLES];
} ctpu_timer;

/* Per-step history: cumulative figures at recorded steps. Bounded: when the
 * ring is full every other point is dropped and the stride doubles, so the
 * whole run stays covered at a coarser grain. */
#define CTPU_HISTORY_CAP 512
typedef struct {
    uint64_t step, requests, hits, compiles;
} ctpu_step_point;

typedef struct {
    ctpu_step_point pts[CTPU_HISTORY_CAP];
    size_t n;
    uint64_t stride;         /* a point every stride-th step */
    uint64_t steps;          /* steps seen */
    uint64_t last_compiles;
    uint64_t warmup_steps;   /* steps up to the last compile before the first all-hit step */
    uint64_t compile_steps;  /* steps that compiled anything */
    uint64_t late_compile_steps; /* ... after the cache first went all-hit */
    uint64_t last_compile_step;
    bool warm;               /* an all-hit step has been seen */
} ctpu_step_history;

struct ctpu_tracebuf;

/* One cache line per counter: the host thread and the device thread bump
 * different counters at the same time, and a shared line would bounce
 * between the cores on every op. */
typedef struct {
    _Alignas(64) atomic_llong v;
} ctpu_counter_slot;

/* Counters are sharded by thread: each thread that bumps one has a shard of
 * its own, written only by it with a plain load and store (no locked
 * instruction: an atomic add costs ~5 ns on the Intel machines, and a
 * strict op bumped five of them on the host and more on the device); a
 * read sums the shards. A shard belongs to one metrics generation (gen);
 * shards are never freed (a process-wide list): a thread that exits gives
 * its shard up with its counts, which stay in the sums, and a later thread
 * takes it over. */
typedef struct ctpu_counter_shard {
    _Alignas(64) atomic_llong v[CTPU_CTR_COUNT];
    atomic_uint_fast64_t gen;    /* the metrics generation its values count for (0: none) */
    atomic_bool taken;           /* a live thread owns it */
    struct ctpu_counter_shard *next;
} ctpu_counter_shard;

extern _Thread_local ctpu_counter_shard *ctpu__ctr_shard __attribute__((tls_model("initial-exec")));

typedef struct ctpu_metrics {
    /* the base: adds of a thread that has no shard (out of host memory),
     * less the shards' sums at the last reset */
    ctpu_counter_slot counters[CTPU_CTR_COUNT];
    uint64_t gen;                  /* unique per ctpu_metrics_init in the process */
    /* gen is read at every counter add (the host's several per op); the
     * device thread takes timer_mu at every command: 128 bytes apart, so
     * they are not one line, nor the two lines of a 128-byte pair that the
     * L2 prefetcher fetches together (on one, each op's first counter add
     * waited for the line from the device core) */
    char pad_gen_[128];
    pthread_mutex_t timer_mu;
    ctpu_timer timers[CTPU_TMR_COUNT];
    ctpu_step_history hist;        /* under timer_mu */
    struct ctpu_tracebuf *trace;   /* Perfetto events, or NULL (not owned; tracefile.h) */
} ctpu_metrics;

void ctpu_metrics_init(ctpu_metrics *m);
void ctpu_metrics_destroy(ctpu_metrics *m);
/* The calling thread's shard for m (slow path of ctpu_counter_add: the
 * thread's first count, or its first under a new runtime); NULL when out of
 * host memory. */
ctpu_counter_shard *ctpu__counter_shard_bind(ctpu_metrics *m);
static inline void ctpu_counter_add(ctpu_metrics *m, ctpu_counter_id id, long long v)
{
    ctpu_counter_shard *s = ctpu__ctr_shard;
    if (__builtin_expect(!s || atomic_load_explicit(&s->gen, memory_order_relaxed) != m->gen, 0))
        s = ctpu__counter_shard_bind(m);
    if (s)   /* only this thread writes it */
        atomic_store_explicit(&s->v[id], atomic_load_explicit(&s->v[id], memory_order_relaxed) + v,
                              memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&m->counters[id].v, v, memory_order_relaxed);
}
/* A counter's value now (the base and every shard of m's generation). */
long long ctpu_counter_get(ctpu_metrics *m, ctpu_counter_id id);
void ctpu_timer_add(ctpu_metrics *m, ctpu_timer_id id, uint64_t ns);
/* Value of a counter by name; -1 if the name is unknown. */
long long ctpu_metrics_counter_by_name(ctpu_metrics *m, const char *name);
/* Percentile p in [0,100] of a timer's recent samples (ns). */
uint64_t ctpu_timer_percentile(ctpu_metrics *m, ctpu_timer_id id, double p);
/* The same on a copy (ctpu_timer_get). */
uint64_t ctpu_timer_sample_percentile(const ctpu_timer *t, double p);
void ctpu_metrics_print(ctpu_metrics *m, FILE *f);
/* Zero counters, timers and the history (the trace buffer is kept). */
void ctpu_metrics_reset(ctpu_metrics *m);
const char *ctpu_counter_name(ctpu_counter_id id);
const char *ctpu_timer_name(ctpu_timer_id id);
const char *ctpu_timer_unit(ctpu_timer_id id);
/* A consistent copy of a timer (for reports). */
void ctpu_timer_get(ctpu_metrics *m, ctpu_timer_id id, ctpu_timer *out);
/* End of a step (mark_step, or a loop-detector cut when no step is marked):
 * appends the cumulative cache figures to the history. */
/* Forget the step history (the per-step points and warm-up figures), not the
 * counters: the first marked step after loop-detector steps starts it over. */
void ctpu_metrics_history_reset(ctpu_metrics *m);
void ctpu_metrics_step(ctpu_metrics *m, uint64_t step);
/* A copy of the history. */
void ctpu_metrics_history(ctpu_metrics *m, ctpu_step_history *out);

uint64_t ctpu_now_ns(void);

#endif
