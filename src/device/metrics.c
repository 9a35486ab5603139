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
#define X(e, n) n,
    CTPU_TIMER_TABLE(X)
#undef X
};

const char *ctpu_counter_name(ctpu_counter_id id) { return counter_names[id]; }
const char *ctpu_timer_name(ctpu_timer_id id) { return timer_names[id]; }

uint64_t ctpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void ctpu_metrics_init(ctpu_metrics *m)
{
    for (int i = 0; i < CTPU_CTR_COUNT; i++) atomic_init(&m->counters[i], 0);
    pthread_mutex_init(&m->timer_mu, NULL);
    memset(m->timers, 0, sizeof m->timers);
}

void ctpu_metrics_destroy(ctpu_metrics *m) { pthread_mutex_destroy(&m->timer_mu); }

void ctpu_metrics_reset(ctpu_metrics *m)
{
    for (int i = 0; i < CTPU_CTR_COUNT; i++) atomic_store(&m->counters[i], 0);
    pthread_mutex_lock(&m->timer_mu);
    memset(m->timers, 0, sizeof m->timers);
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
        if (strcmp(counter_names[i], name) == 0) return atomic_load(&m->counters[i]);
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
        fprintf(f, "Metric: %s\n  TotalSamples: %llu\n  Accumulator: %.3f ms\n"
                   "  Percentiles: 1%%=%.3f us; 50%%=%.3f us; 95%%=%.3f us; 99%%=%.3f us\n",
                timer_names[i], (unsigned long long)t->count, (double)t->total_ns / 1e6,
                (double)percentile_locked(t, 1) / 1e3, (double)percentile_locked(t, 50) / 1e3,
                (double)percentile_locked(t, 95) / 1e3, (double)percentile_locked(t, 99) / 1e3);
    }
    pthread_mutex_unlock(&m->timer_mu);
    for (int i = 0; i < CTPU_CTR_COUNT; i++) {
        long long v = atomic_load(&m->counters[i]);
        if (v) fprintf(f, "Counter: %s\n  Value: %lld\n", counter_names[i], v);
    }
}
