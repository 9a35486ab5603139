#include "metrics.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const counter_names[CTPU_CTR_COUNT] = {
#define X(e, n) n,
    CTPU_COUNTER_TABLE(X)
#undef X
};
static const char *const timer_names[CTPU_TMR_COUNT] = {
#define X(e, n, u) n,
    CTPU_TIMER_TABLE(X)
#undef X
};
static const char *const timer_units[CTPU_TMR_COUNT] = {
#define X(e, n, u) u,
    CTPU_TIMER_TABLE(X)
#undef X
};

const char *ctpu_counter_name(ctpu_counter_id id) { return counter_names[id]; }
const char *ctpu_timer_name(ctpu_timer_id id) { return timer_names[id]; }
const char *ctpu_timer_unit(ctpu_timer_id id) { return timer_units[id]; }

uint64_t ctpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------ counter shards */
_Thread_local ctpu_counter_shard *ctpu__ctr_shard __attribute__((tls_model("initial-exec")));
static _Atomic(ctpu_counter_shard *) shard_head;   /* every shard, newest first; never freed */
static pthread_mutex_t shard_mu = PTHREAD_MUTEX_INITIALIZER;   /* claims and pushes */
static pthread_once_t shard_once = PTHREAD_ONCE_INIT;
static pthread_key_t shard_key;   /* its destructor gives a thread's shard up at its exit */
static bool shard_key_ok;
static atomic_uint_fast64_t metrics_gen;

static void shard_give_up(void *p)
{
    ctpu_counter_shard *s = p;
    /* a later destructor that counts binds again (and registers again) */
    if (ctpu__ctr_shard == s) ctpu__ctr_shard = NULL;
    atomic_store(&s->taken, false);
}

static void shard_key_make(void) { shard_key_ok = pthread_key_create(&shard_key, shard_give_up) == 0; }

/* s's values start over for generation gen (its owner, or under shard_mu) */
static void shard_start(ctpu_counter_shard *s, uint64_t gen)
{
    for (int i = 0; i < CTPU_CTR_COUNT; i++) atomic_store_explicit(&s->v[i], 0, memory_order_relaxed);
    atomic_store_explicit(&s->gen, gen, memory_order_release);
}

ctpu_counter_shard *ctpu__counter_shard_bind(ctpu_metrics *m)
{
    ctpu_counter_shard *s = ctpu__ctr_shard;
    if (s) {   /* this thread's, counting for an earlier runtime */
        shard_start(s, m->gen);
        return s;
    }
    pthread_once(&shard_once, shard_key_make);
    if (!shard_key_ok) return NULL;
    pthread_mutex_lock(&shard_mu);
    /* a free shard: one of this generation first (its counts are kept) */
    ctpu_counter_shard *other = NULL;
    for (ctpu_counter_shard *q = atomic_load(&shard_head); q && !s; q = q->next) {
        if (atomic_load(&q->taken)) continue;
        if (atomic_load(&q->gen) == m->gen) s = q;
        else if (!other) other = q;
    }
    if (!s && other) {
        s = other;
        shard_start(s, m->gen);
    }
    /* 128-byte aligned and sized: two threads' shards never share the
     * 128-byte pair of lines the L2 prefetcher fetches together */
    if (!s && (s = aligned_alloc(128, (sizeof *s + 127) & ~(size_t)127))) {
        for (int i = 0; i < CTPU_CTR_COUNT; i++) atomic_init(&s->v[i], 0);
        atomic_init(&s->gen, m->gen);
        atomic_init(&s->taken, false);
        s->next = atomic_load(&shard_head);
        atomic_store_explicit(&shard_head, s, memory_order_release);
    }
    if (s) atomic_store(&s->taken, true);
    pthread_mutex_unlock(&shard_mu);
    if (!s) return NULL;
    if (pthread_setspecific(shard_key, s) != 0) {
        atomic_store(&s->taken, false);
        return NULL;
    }
    ctpu__ctr_shard = s;
    return s;
}

/* The shards' sum of counter id for m's generation. */
static long long shards_sum(const ctpu_metrics *m, int id)
{
    long long v = 0;
    for (ctpu_counter_shard *s = atomic_load_explicit(&shard_head, memory_order_acquire); s; s = s->next)
        if (atomic_load_explicit(&s->gen, memory_order_acquire) == m->gen)
            v += atomic_load_explicit(&s->v[id], memory_order_relaxed);
    return v;
}

long long ctpu_counter_get(ctpu_metrics *m, ctpu_counter_id id)
{
    return atomic_load(&m->counters[id].v) + shards_sum(m, id);
}

/* ------------------------------------------------------------ registry */
void ctpu_metrics_init(ctpu_metrics *m)
{
    m->gen = atomic_fetch_add(&metrics_gen, 1) + 1;
    for (int i = 0; i < CTPU_CTR_COUNT; i++) atomic_init(&m->counters[i].v, 0);
    pthread_mutex_init(&m->timer_mu, NULL);
    memset(m->timers, 0, sizeof m->timers);
    memset(&m->hist, 0, sizeof m->hist);
    m->hist.stride = 1;
    m->trace = NULL;
}

void ctpu_metrics_destroy(ctpu_metrics *m) { pthread_mutex_destroy(&m->timer_mu); }

void ctpu_metrics_reset(ctpu_metrics *m)
{
    /* the base cancels what the shards hold (they are their threads' to write) */
    for (int i = 0; i < CTPU_CTR_COUNT; i++) atomic_store(&m->counters[i].v, -shards_sum(m, i));
    pthread_mutex_lock(&m->timer_mu);
    memset(m->timers, 0, sizeof m->timers);
    memset(&m->hist, 0, sizeof m->hist);
    m->hist.stride = 1;
    pthread_mutex_unlock(&m->timer_mu);
}

void ctpu_metrics_history_reset(ctpu_metrics *m)
{
    pthread_mutex_lock(&m->timer_mu);
    uint64_t last = m->hist.last_compiles;
    memset(&m->hist, 0, sizeof m->hist);
    m->hist.stride = 1;
    m->hist.last_compiles = last;
    pthread_mutex_unlock(&m->timer_mu);
}

void ctpu_timer_get(ctpu_metrics *m, ctpu_timer_id id, ctpu_timer *out)
{
    pthread_mutex_lock(&m->timer_mu);
    *out = m->timers[id];
    pthread_mutex_unlock(&m->timer_mu);
}

void ctpu_metrics_step(ctpu_metrics *m, uint64_t step)
{
    ctpu_step_point p = {
        .step = step,
        .requests = (uint64_t)(ctpu_counter_get(m, CTPU_CTR_CACHE_REQUESTS) +
                               ctpu_counter_get(m, CTPU_CTR_STRICT_CACHE_REQUESTS)),
        .hits = (uint64_t)(ctpu_counter_get(m, CTPU_CTR_CACHE_HITS) + ctpu_counter_get(m, CTPU_CTR_STRICT_CACHE_HITS)),
        .compiles = (uint64_t)ctpu_counter_get(m, CTPU_CTR_PROGRAMS_COMPILED),
    };
    pthread_mutex_lock(&m->timer_mu);
    ctpu_step_history *h = &m->hist;
    if (h->stride == 0) h->stride = 1;
    h->steps++;
    bool compiled = p.compiles != h->last_compiles;
    h->last_compiles = p.compiles;
    if (compiled) {
        h->compile_steps++;
        h->last_compile_step = step;
        if (h->warm) h->late_compile_steps++;
        else h->warmup_steps = h->steps;
    } else if (p.compiles > 0) {
        h->warm = true;
    }
    if (h->steps % h->stride == 0) {
        if (h->n == CTPU_HISTORY_CAP) {
            for (size_t i = 0; i < CTPU_HISTORY_CAP / 2; i++) h->pts[i] = h->pts[2 * i + 1];
            h->n = CTPU_HISTORY_CAP / 2;
            h->stride *= 2;
        }
        if (h->steps % h->stride == 0) h->pts[h->n++] = p;
    }
    pthread_mutex_unlock(&m->timer_mu);
}

void ctpu_metrics_history(ctpu_metrics *m, ctpu_step_history *out)
{
    pthread_mutex_lock(&m->timer_mu);
    *out = m->hist;
    pthread_mutex_unlock(&m->timer_mu);
}

void ctpu_timer_add(ctpu_metrics *m, ctpu_timer_id id, uint64_t ns)
{
    pthread_mutex_lock(&m->timer_mu);
    ctpu_timer *t = &m->timers[id];
    if (t->count == 0 || ns < t->min_ns) t->min_ns = ns;
    if (ns > t->max_ns) t->max_ns = ns;
    t->samples[t->count % CTPU_TIMER_SAMPLES] = ns;
    t->count++;
    t->total_ns += ns;
    pthread_mutex_unlock(&m->timer_mu);
}

long long ctpu_metrics_counter_by_name(ctpu_metrics *m, const char *name)
{
    if (!name) return -1;
    for (int i = 0; i < CTPU_CTR_COUNT; i++)
        if (strcmp(counter_names[i], name) == 0) return ctpu_counter_get(m, (ctpu_counter_id)i);
    for (int i = 0; i < CTPU_TMR_COUNT; i++)
        if (strcmp(timer_names[i], name) == 0) {
            pthread_mutex_lock(&m->timer_mu);
            long long c = (long long)m->timers[i].count;
            pthread_mutex_unlock(&m->timer_mu);
            return c;
        }
    return -1;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t percentile_locked(const ctpu_timer *t, double p)
{
    size_t n = t->count < CTPU_TIMER_SAMPLES ? (size_t)t->count : CTPU_TIMER_SAMPLES;
    if (n == 0) return 0;
    uint64_t tmp[CTPU_TIMER_SAMPLES];
    memcpy(tmp, t->samples, n * sizeof tmp[0]);
    qsort(tmp, n, sizeof tmp[0], cmp_u64);
    size_t k = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
    return tmp[k < n ? k : n - 1];
}

uint64_t ctpu_timer_sample_percentile(const ctpu_timer *t, double p) { return percentile_locked(t, p); }

uint64_t ctpu_timer_percentile(ctpu_metrics *m, ctpu_timer_id id, double p)
{
    pthread_mutex_lock(&m->timer_mu);
    uint64_t v = percentile_locked(&m->timers[id], p);
    pthread_mutex_unlock(&m->timer_mu);
    return v;
}

void ctpu_metrics_print(ctpu_metrics *m, FILE *f)
{
    fprintf(f, "ctpu metrics report\n");
    pthread_mutex_lock(&m->timer_mu);
    for (int i = 0; i < CTPU_TMR_COUNT; i++) {
        const ctpu_timer *t = &m->timers[i];
        if (t->count == 0) continue;
        if (strcmp(timer_units[i], "ns") != 0) {
            fprintf(f, "Metric: %s\n  TotalSamples: %llu\n  Accumulator: %llu\n  ValueRate: %.3f per sample\n"
                       "  Percentiles: 1%%=%llu; 50%%=%llu; 95%%=%llu; 99%%=%llu; max=%llu\n",
                    timer_names[i], (unsigned long long)t->count, (unsigned long long)t->total_ns,
                    (double)t->total_ns / (double)t->count, (unsigned long long)percentile_locked(t, 1),
                    (unsigned long long)percentile_locked(t, 50), (unsigned long long)percentile_locked(t, 95),
                    (unsigned long long)percentile_locked(t, 99), (unsigned long long)t->max_ns);
            continue;
        }
        fprintf(f, "Metric: %s\n  TotalSamples: %llu\n  Accumulator: %.3f ms\n  Mean: %.3f us\n"
                   "  Percentiles: 1%%=%.3f us; 50%%=%.3f us; 95%%=%.3f us; 99%%=%.3f us; max=%.3f us\n",
                timer_names[i], (unsigned long long)t->count, (double)t->total_ns / 1e6,
                (double)t->total_ns / (double)t->count / 1e3,
                (double)percentile_locked(t, 1) / 1e3, (double)percentile_locked(t, 50) / 1e3,
                (double)percentile_locked(t, 95) / 1e3, (double)percentile_locked(t, 99) / 1e3,
                (double)t->max_ns / 1e3);
    }
    pthread_mutex_unlock(&m->timer_mu);
    for (int i = 0; i < CTPU_CTR_COUNT; i++) {
        long long v = ctpu_counter_get(m, (ctpu_counter_id)i);
        if (v) fprintf(f, "Counter: %s\n  Value: %lld\n", counter_names[i], v);
    }
}
