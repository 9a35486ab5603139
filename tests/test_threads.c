/* Concurrency (issue 7; CONTRACTS.md "Threads"): threads with their own
 * mode overrides (ctpu_set_thread_mode) and their own tensors run a
 * training-like loop (scopes, steps, autograd, assign, host reads, a
 * deliberate error) at the same time. Each thread's results equal the same
 * loop run alone in strict eager, bit for bit; errors, scopes and modes do
 * not leak between threads; the shared device, caches, allocator and
 * metrics stay consistent. Run under ThreadSanitizer by tools/run-tests.sh
 * (build-tsan, --suite threads --setup=tsan). */
#include "t_core.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

/* A thread that used ctpu frees its state when it exits (one struct,
 * eager.h: the trace recorder and pending-handle list, the scope lists, the
 * strict front cache; one pthread key destructor); LeakSanitizer checks it
 * here. */

#define STEPS 60
#define N 24

typedef struct {
    int mode;               /* -1: no override (process mode) */
    int seed;
    float w[N], loss[STEPS];
    int errors_seen;
    char fail[256];
} job;

static void job_fail(job *j, const char *what)
{
    if (!j->fail[0]) snprintf(j->fail, sizeof j->fail, "%s: %s", what, ctpu_last_error());
}

/* y = tanh(x * w + b); loss = mean(y^2); SGD on w by autograd; b by hand. */
static void run_loop(job *j)
{
    if (j->mode >= 0 && ctpu_set_thread_mode((ctpu_mode)j->mode) != CTPU_OK) { job_fail(j, "set_thread_mode"); return; }
    if (j->mode >= 0 && ctpu_get_mode() != (ctpu_mode)j->mode) { job_fail(j, "get_mode"); return; }
    float x0[N], w0[N];
    for (int i = 0; i < N; i++) {
        x0[i] = sinf((float)(i * 3 + j->seed));
        w0[i] = 0.1f * cosf((float)(i + j->seed));
    }
    int64_t n = N;
    ctpu_tensor x = ctpu_keep(ctpu_from_host(x0, CTPU_F32, 1, &n));
    ctpu_tensor w = ctpu_keep(ctpu_from_host(w0, CTPU_F32, 1, &n));
    ctpu_tensor b = ctpu_keep(ctpu_zeros(CTPU_F32, 1, &n));
    if (ctpu_is_null(x) || ctpu_is_null(w) || ctpu_is_null(b)) { job_fail(j, "setup"); return; }
    if (ctpu_set_requires_grad(w, true) != CTPU_OK) { job_fail(j, "requires_grad"); return; }
    for (int s = 0; s < STEPS; s++) {
        if (ctpu_step_begin() != CTPU_OK) { job_fail(j, "step_begin"); return; }
        ctpu_tensor y = ctpu_tanh(ctpu_add(ctpu_mul(x, w), b));
        ctpu_tensor loss = ctpu_mean(ctpu_mul(y, y), 0, NULL, false);
        if (ctpu_backward(loss) != CTPU_OK) { job_fail(j, "backward"); return; }
        ctpu_no_grad_begin();
        ctpu_assign(w, ctpu_sub(w, ctpu_mul_scalar(ctpu_grad(w), 0.1)));
        ctpu_assign(b, ctpu_sub_scalar(b, 0.001 * (s % 3)));
        ctpu_no_grad_end();
        ctpu_zero_grad(w);
        /* a deliberate error in this thread only */
        if (s % 7 == j->seed % 7) {
            ctpu_clear_error();
            ctpu_tensor bad = ctpu_add(x, ctpu_zeros(CTPU_F32, 1, (int64_t[]){ N + 1 }));
            if (!ctpu_is_null(bad) || ctpu_last_status() != CTPU_ERR_SHAPE) { job_fail(j, "expected a shape error"); return; }
            j->errors_seen++;
            ctpu_clear_error();
        }
        double v;
        if (ctpu_item(loss, &v) != CTPU_OK) { job_fail(j, "item"); return; }   /* a host read every step */
        j->loss[s] = (float)v;
        if (ctpu_step_end() != CTPU_OK) { job_fail(j, "step_end"); return; }
        if (ctpu_last_status() != CTPU_OK) { job_fail(j, "an error leaked in from elsewhere"); return; }
    }
    if (ctpu_to_host(w, j->w, sizeof j->w) != CTPU_OK) job_fail(j, "to_host");
    ctpu_release(x);
    ctpu_release(w);
    ctpu_release(b);
    if (ctpu_sync() != CTPU_OK) job_fail(j, "sync");
    ctpu_clear_thread_mode();
}

static void *thread_main(void *p)
{
    run_loop(p);
    return NULL;
}

static void check_same(const job *a, const job *ref)
{
    ck_assert_msg(!a->fail[0], "thread (mode %d): %s", a->mode, a->fail);
    ck_assert_msg(memcmp(a->w, ref->w, sizeof a->w) == 0, "thread in mode %d: weights differ from strict alone", a->mode);
    ck_assert_msg(memcmp(a->loss, ref->loss, sizeof a->loss) == 0, "thread in mode %d: losses differ", a->mode);
    ck_assert_int_eq(a->errors_seen, ref->errors_seen);
}

START_TEST(threads_with_own_modes)
{
    /* references: each loop alone, strict eager, on this thread */
    static job ref[3], j[3];
    const int modes[3] = { CTPU_MODE_STRICT, CTPU_MODE_DEFER_FUSE, CTPU_MODE_DEBUG };
    for (int k = 0; k < 3; k++) {
        ref[k] = (job){ .mode = CTPU_MODE_STRICT, .seed = k + 1 };
        run_loop(&ref[k]);
        ck_assert_msg(!ref[k].fail[0], "%s", ref[k].fail);
        j[k] = (job){ .mode = modes[k], .seed = k + 1 };
    }
    ck_assert(isfinite(ref[0].loss[STEPS - 1]) && ref[0].loss[STEPS - 1] != ref[0].loss[0]);
    /* two rounds: strict + defer, then defer + debug, with the process mode
     * set to something else (the override must win) */
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEBUG), CTPU_OK);
    for (int round = 0; round < 2; round++) {
        pthread_t th[2];
        int a = round, b = round + 1;
        j[a].fail[0] = j[b].fail[0] = 0;
        j[a].errors_seen = j[b].errors_seen = 0;
        ck_assert_int_eq(pthread_create(&th[0], NULL, thread_main, &j[a]), 0);
        ck_assert_int_eq(pthread_create(&th[1], NULL, thread_main, &j[b]), 0);
        /* the main thread reads shared state meanwhile */
        for (int k = 0; k < 50; k++) {
            ctpu_cache_info ci;
            ctpu_hbm_stats hs;
            ck_assert_int_eq(ctpu_cache_get_info(&ci), CTPU_OK);
            ck_assert_int_eq(ctpu_hbm_get_stats(&hs), CTPU_OK);
            ck_assert_int_ge(ctpu_metric_counter("ops_dispatched"), 0);
            ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_DEBUG);   /* other threads' overrides do not leak */
        }
        pthread_join(th[0], NULL);
        pthread_join(th[1], NULL);
        check_same(&j[a], &ref[a]);
        check_same(&j[b], &ref[b]);
    }
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_STRICT), CTPU_OK);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ctpu_hbm_stats hs;
    ck_assert_int_eq(ctpu_hbm_get_stats(&hs), CTPU_OK);
    ck_assert_uint_eq(hs.in_use, 0);
}
END_TEST

/* Many threads creating and releasing handles at once: the slot table,
 * generations and scopes stay consistent (no handle is ever another's). */
static void *churn(void *p)
{
    int id = (int)(intptr_t)p;
    if (id % 2) ctpu_set_thread_mode(CTPU_MODE_DEFER_FUSE);
    for (int k = 0; k < 300; k++) {
        ctpu_scope_begin();
        ctpu_tensor t = ctpu_full(CTPU_F32, 1, (int64_t[]){ 3 }, (double)(id * 1000 + k));
        ctpu_tensor u = ctpu_add_scalar(t, 0.5);
        double v;
        ctpu_tensor s = ctpu_sum(u, 0, NULL, false);
        if (ctpu_item(s, &v) != CTPU_OK || v != 3.0 * (id * 1000 + k) + 1.5) return (void *)1;
        ctpu_scope_end();
        if (ctpu_is_valid(t)) return (void *)2;
    }
    ctpu_clear_thread_mode();
    return NULL;
}

START_TEST(handle_churn)
{
    pthread_t th[4];
    for (int k = 0; k < 4; k++) ck_assert_int_eq(pthread_create(&th[k], NULL, churn, (void *)(intptr_t)k), 0);
    for (int k = 0; k < 4; k++) {
        void *rv;
        pthread_join(th[k], &rv);
        ck_assert_msg(rv == NULL, "thread %d: %s (%d)", k, ctpu_last_error(), (int)(intptr_t)rv);
    }
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
}
END_TEST

/* Strict eager's one-op table as a tiny LRU (CTPU_STRICT_CACHE_SIZE=2)
 * under four threads with shapes of their own and shared ones: a program
 * one thread found (its front slot, or between lookup and submit) may be
 * evicted by another thread's insert at any moment, and must stay alive
 * until it is submitted and run (ThreadSanitizer and ASan watch). Defer and
 * fuse threads with a 2-entry fused cache evict their programs the same way. */
static void *lru_churn(void *p)
{
    int id = (int)(intptr_t)p;
    if (id >= 4) ctpu_set_thread_mode(CTPU_MODE_DEFER_FUSE);
    for (int k = 0; k < 400; k++) {
        int64_t n = 1 + (k * 7 + id * 13) % 37;       /* 37 shapes, threads overlapping */
        ctpu_scope_begin();
        ctpu_tensor t = ctpu_full(CTPU_F32, 1, &n, 1.0 + id);
        double v;
        if (ctpu_item(ctpu_sum(ctpu_mul_scalar(ctpu_exp(t), 0.5), 0, NULL, false), &v) != CTPU_OK) return (void *)1;
        double want = (double)n * 0.5 * exp(1.0 + id);
        if (fabs(v - want) > 1e-5 * want) return (void *)2;
        ctpu_scope_end();
    }
    ctpu_clear_thread_mode();
    return NULL;
}

START_TEST(bounded_tables_under_threads)
{
    ctpu_shutdown();
    t_clear_env();
    setenv("CTPU_STRICT_CACHE_SIZE", "2", 1);
    setenv("TORCH_TPU_CACHE_SIZE", "2", 1);
    setenv("TORCH_TPU_RECOMPILE_LIMIT", "0", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    pthread_t th[6];
    for (int k = 0; k < 6; k++) ck_assert_int_eq(pthread_create(&th[k], NULL, lru_churn, (void *)(intptr_t)k), 0);
    for (int k = 0; k < 6; k++) {
        void *rv;
        pthread_join(th[k], &rv);
        ck_assert_msg(rv == NULL, "thread %d: %s (%d)", k, ctpu_last_error(), (int)(intptr_t)rv);
    }
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ck_assert_int_gt(ctpu_metric_counter("strict_cache_evictions"), 100);
    ck_assert_int_gt(ctpu_metric_counter("cache_evictions"), 100);
    unsetenv("CTPU_STRICT_CACHE_SIZE");
    unsetenv("TORCH_TPU_CACHE_SIZE");
    unsetenv("TORCH_TPU_RECOMPILE_LIMIT");
}
END_TEST

/* A thread's state belongs to one runtime: what a thread left open (a
 * scope, a no-grad region, a mode override, a host-read label, a trace
 * holding input buffers) is gone after shutdown and init, while its last
 * error stays readable. A thread that exits with all of that open gives its
 * buffers back (HBM returns to zero) and leaks nothing (LeakSanitizer). */
static void *leave_everything_open(void *p)
{
    (void)p;
    if (ctpu_set_thread_mode(CTPU_MODE_DEFER_FUSE) != CTPU_OK) return (void *)1;
    if (ctpu_scope_begin() != CTPU_OK || ctpu_no_grad_begin() != CTPU_OK) return (void *)2;
    if (ctpu_set_host_read_label("left.open") != CTPU_OK) return (void *)3;
    ctpu_tensor a = ctpu_full(CTPU_F32, 1, (int64_t[]){ 1024 }, 2.0);
    ctpu_tensor b = ctpu_add(a, a);            /* pending: the trace holds a's buffer */
    if (ctpu_is_null(b) || ctpu_grad_enabled()) return (void *)4;
    return NULL;                               /* no mark_step, no scope_end, no no_grad_end */
}

static pthread_barrier_t g_barrier;

static void *open_then_wait(void *p)
{
    void *rv = leave_everything_open(p);
    pthread_barrier_wait(&g_barrier);
    pthread_barrier_wait(&g_barrier);
    return rv;
}

static void expect_two(ctpu_tensor t)
{
    float v[4];
    ck_assert_int_eq(ctpu_to_host(t, v, sizeof v), CTPU_OK);
    for (int i = 0; i < 4; i++) ck_assert(v[i] == 2.0f);
}

START_TEST(thread_state_per_runtime)
{
    ck_assert_str_eq(ctpu_last_error(), "");
    /* a thread exits with everything open */
    pthread_t th;
    void *rv;
    ck_assert_int_eq(pthread_create(&th, NULL, leave_everything_open, NULL), 0);
    pthread_join(th, &rv);
    ck_assert_msg(rv == NULL, "thread: step %d: %s", (int)(intptr_t)rv, ctpu_last_error());
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ctpu_hbm_stats hs;
    ck_assert_int_eq(ctpu_hbm_get_stats(&hs), CTPU_OK);
    ck_assert_uint_eq(hs.in_use, 0);

    /* this thread leaves the same open across shutdown and init */
    ck_assert_ptr_null(leave_everything_open(NULL));
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_DEFER_FUSE);
    ctpu_tensor bad = ctpu_add(ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 2 }), ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 3 }));
    ck_assert(ctpu_is_null(bad));
    char msg[512];
    snprintf(msg, sizeof msg, "%s", ctpu_last_error());
    ctpu_shutdown();
    ck_assert_str_eq(ctpu_last_error(), msg);            /* the last error outlives the runtime */
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_SHAPE);
    t_clear_env();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_STRICT);  /* the override was the old runtime's */
    ck_assert(ctpu_grad_enabled());
    ck_assert_int_eq(ctpu_no_grad_end(), CTPU_ERR_STATE);
    ck_assert_int_eq(ctpu_scope_end(), CTPU_ERR_STATE);
    ck_assert(strstr(ctpu_last_error(), "no scope is open"));
    ck_assert_int_eq(ctpu_mark_step(), CTPU_OK);          /* no trace of the old runtime is flushed */

    /* a thread whose state is left from the previous runtime exits after
     * this init: its stale parts are dropped without touching the new one */
    ck_assert_int_eq(pthread_barrier_init(&g_barrier, NULL, 2), 0);
    ck_assert_int_eq(pthread_create(&th, NULL, open_then_wait, NULL), 0);
    pthread_barrier_wait(&g_barrier);          /* it has left everything open */
    ctpu_shutdown();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    pthread_barrier_wait(&g_barrier);          /* now it exits */
    pthread_join(th, &rv);
    pthread_barrier_destroy(&g_barrier);
    ck_assert_ptr_null(rv);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ck_assert_int_eq(ctpu_hbm_get_stats(&hs), CTPU_OK);
    ck_assert_uint_eq(hs.in_use, 0);
    expect_two(ctpu_add_scalar(ctpu_ones(CTPU_F32, 1, (int64_t[]){ 4 }), 1.0));
}
END_TEST

/* ------------------------------------------------------------ one compile per key */
/* Two threads miss the same key of one program cache: the first compiles
 * (outside the cache lock), the second waits for that program and hits; if
 * the first gives up, the second compiles it itself. */
typedef struct {
    ctpu_cache *c;
    ctpu_trace *t;
    uint8_t key[512];
    size_t len;
    atomic_int stage;            /* 1: the first thread holds the miss; 2: the second is looking */
    atomic_int done;             /* the first thread is inserting (or abandoning) now */
    bool abandon;
    ctpu_program *first, *second;
    bool second_hit, second_after_done;
} same_key_job;

static void wait_stage(atomic_int *s, int v)
{
    while (atomic_load(s) < v) {
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
}

static void *first_miss(void *p)
{
    same_key_job *j = p;
    ctpu_cache_result res;
    ctpu_cache_pending *miss = NULL;
    char err[256];
    j->first = ctpu_cache_find(j->c, j->key, j->len, NULL, &res, NULL, &miss, err, sizeof err);
    if (j->first || !miss) return (void *)1;
    atomic_store(&j->stage, 1);
    wait_stage(&j->stage, 2);
    struct timespec ts = { 0, 50000000 };   /* let the second thread reach its wait */
    nanosleep(&ts, NULL);
    atomic_store(&j->done, 1);
    if (j->abandon) {
        ctpu_cache_abandon(j->c, miss);
        return NULL;
    }
    ctpu_program *prog = ctpu_fuse_compile(j->t, err, sizeof err);
    if (!prog) return (void *)2;
    j->first = ctpu_cache_insert(j->c, miss, j->t, prog, NULL, NULL, &res, err, sizeof err);
    return j->first ? NULL : (void *)3;
}

static void *second_miss(void *p)
{
    same_key_job *j = p;
    wait_stage(&j->stage, 1);
    atomic_store(&j->stage, 2);
    char err[256];
    ctpu_cache_result res;
    j->second = ctpu_cache_get(j->c, j->key, j->len, j->t, &res, err, sizeof err);
    j->second_hit = res.hit;
    j->second_after_done = atomic_load(&j->done) == 1;
    return j->second ? NULL : (void *)1;
}

static void same_key_run(bool abandon, ctpu_cache_stats *st, same_key_job *j)
{
    ctpu_vtype x = { .dtype = CTPU_KDT_F32, .ndim = 1, .shape = { 16 } };
    ctpu_node n = { .op = CTPU_OP_RELU, .n_in = 1, .in = { 0 }, .out = x };
    int32_t out = 1;
    ctpu_trace t = { .n_inputs = 1, .n_nodes = 1, .n_outputs = 1, .in_type = &x, .nodes = &n, .outputs = &out };
    memset(j, 0, sizeof *j);
    j->c = ctpu_cache_create(0, 0);
    ck_assert_ptr_nonnull(j->c);
    j->t = &t;
    j->abandon = abandon;
    j->len = ctpu_trace_key(&t, j->key, sizeof j->key);
    ck_assert_uint_gt(j->len, 0);
    pthread_t a, b;
    void *ra, *rb;
    ck_assert_int_eq(pthread_create(&a, NULL, first_miss, j), 0);
    ck_assert_int_eq(pthread_create(&b, NULL, second_miss, j), 0);
    pthread_join(a, &ra);
    pthread_join(b, &rb);
    ck_assert_msg(ra == NULL && rb == NULL, "first thread %d, second thread %d", (int)(intptr_t)ra,
                  (int)(intptr_t)rb);
    ck_assert_msg(j->second_after_done, "the second thread returned before the first one's program or give-up");
    ctpu_cache_get_stats(j->c, st);
    ctpu_cache_destroy(j->c);
}

START_TEST(same_key_compiled_once)
{
    same_key_job j;
    ctpu_cache_stats st;
    same_key_run(false, &st, &j);
    ck_assert(j.second_hit);
    ck_assert_ptr_eq(j.first, j.second);
    ck_assert_uint_eq(st.requests, 2);
    ck_assert_uint_eq(st.misses, 1);
    ck_assert_uint_eq(st.hits, 1);
    ck_assert_uint_eq(st.compiles, 1);
    ck_assert_uint_eq(st.entries, 1);
}
END_TEST

START_TEST(same_key_given_up_compiled_by_the_waiter)
{
    same_key_job j;
    ctpu_cache_stats st;
    same_key_run(true, &st, &j);
    ck_assert(!j.second_hit);
    ck_assert_uint_eq(st.requests, 2);
    ck_assert_uint_eq(st.misses, 2);
    ck_assert_uint_eq(st.hits, 0);
    ck_assert_uint_eq(st.compiles, 1);
    ck_assert_uint_eq(st.entries, 1);
}
END_TEST

/* ------------------------------------------------ one call per compiled step */
/* A second thread calling a compiled step while another thread is inside
 * its call (here: inside fn's capture) gets CTPU_ERR_STATE and null outputs,
 * not a shared scratch array; once the first call is over the same thread's
 * call replays. */
typedef struct {
    ctpu_compiled *c;
    ctpu_tensor x;
    atomic_int inside, tried;
    ctpu_status busy_st;
    ctpu_tensor busy_out;
} busy_job;

static ctpu_status busy_fn(void *ctx, const ctpu_tensor *in, const double *scalars, ctpu_tensor *out)
{
    busy_job *j = ctx;
    (void)scalars;
    atomic_store(&j->inside, 1);
    while (!atomic_load(&j->tried)) sched_yield();
    out[0] = ctpu_add_scalar(in[0], 1.0);
    return ctpu_is_null(out[0]) ? ctpu_last_status() : CTPU_OK;
}

static void *busy_other(void *arg)
{
    busy_job *j = arg;
    while (!atomic_load(&j->inside)) sched_yield();
    j->busy_out = CTPU_NULL;
    j->busy_st = ctpu_compiled_call(j->c, 1, &j->x, 0, NULL, 1, &j->busy_out);
    atomic_store(&j->tried, 1);
    return NULL;
}

START_TEST(compiled_step_one_call_at_a_time)
{
    busy_job j = {0};
    float h[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    j.x = ctpu_from_host(h, CTPU_F32, 1, shape);
    ck_assert(!ctpu_is_null(j.x));
    j.c = ctpu_compile(busy_fn, &j, &(ctpu_compile_opts){.name = "busy"});
    ck_assert_ptr_nonnull(j.c);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, busy_other, &j), 0);
    ctpu_tensor y = CTPU_NULL;
    ck_assert_int_eq(ctpu_compiled_call(j.c, 1, &j.x, 0, NULL, 1, &y), CTPU_OK);
    pthread_join(th, NULL);
    ck_assert_int_eq(j.busy_st, CTPU_ERR_STATE);
    ck_assert(ctpu_is_null(j.busy_out));
    double v = 0;
    ctpu_tensor s0 = ctpu_sum(y, 0, NULL, false);
    ck_assert_int_eq(ctpu_item(s0, &v), CTPU_OK);
    ck_assert(v == 14.0);
    ctpu_release(s0);
    /* the step is idle again: this thread's next call replays */
    ctpu_tensor z = CTPU_NULL;
    atomic_store(&j.inside, 0);
    ck_assert_int_eq(ctpu_compiled_call(j.c, 1, &j.x, 0, NULL, 1, &z), CTPU_OK);
    ctpu_tensor s1 = ctpu_sum(z, 0, NULL, false);
    ck_assert_int_eq(ctpu_item(s1, &v), CTPU_OK);
    ck_assert(v == 14.0);
    ctpu_release(s1);
    ctpu_compiled_info info;
    ck_assert_int_eq(ctpu_compiled_get_info(j.c, &info), CTPU_OK);
    ck_assert_uint_eq(info.captures, 1);
    ck_assert_uint_eq(info.replays, 1);
    ctpu_release(y);
    ctpu_release(z);
    ctpu_release(j.x);
    ctpu_compiled_free(j.c);
}
END_TEST

/* Counters are per-thread shards summed on read (metrics.h): counts made
 * by threads that have exited stay in the sums, a later thread takes an
 * exited thread's shard over, ctpu_metrics_clear zeroes every shard's
 * share, and a new runtime starts from zero. */
#define COUNT_OPS 50
static void *count_ops(void *p)
{
    ctpu_tensor x = *(ctpu_tensor *)p;
    for (int i = 0; i < COUNT_OPS; i++) ctpu_release(ctpu_add(x, x));
    return NULL;
}

static void count_in_threads(ctpu_tensor x, int n)
{
    pthread_t th[4];
    for (int i = 0; i < n; i++) ck_assert_int_eq(pthread_create(&th[i], NULL, count_ops, &x), 0);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

START_TEST(counters_sum_over_threads)
{
    int64_t n = 8;
    ctpu_tensor x = ctpu_keep(ctpu_ones(CTPU_F32, 1, &n));
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ctpu_metrics_clear();
    ck_assert_int_eq(ctpu_metric_counter("ops_dispatched"), 0);
    count_in_threads(x, 4);   /* four threads, exited by now */
    count_ops(&x);            /* and this one */
    ck_assert_int_eq(ctpu_metric_counter("ops_dispatched"), 5 * COUNT_OPS);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ck_assert_int_eq(ctpu_metric_counter("commands_executed"), 5 * COUNT_OPS);   /* the device thread's */
    count_in_threads(x, 2);   /* they take over two exited threads' shards */
    ck_assert_int_eq(ctpu_metric_counter("ops_dispatched"), 7 * COUNT_OPS);
    ctpu_metrics_clear();
    ck_assert_int_eq(ctpu_metric_counter("ops_dispatched"), 0);
    count_in_threads(x, 3);
    ck_assert_int_eq(ctpu_metric_counter("ops_dispatched"), 3 * COUNT_OPS);
    ctpu_release(x);
    ctpu_shutdown();   /* a new runtime: the old shards count for the old one */
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert_int_eq(ctpu_metric_counter("ops_dispatched"), 0);
    x = ctpu_keep(ctpu_ones(CTPU_F32, 1, &n));
    int64_t base = ctpu_metric_counter("ops_dispatched");
    count_in_threads(x, 2);
    count_ops(&x);
    ck_assert_int_eq(ctpu_metric_counter("ops_dispatched") - base, 3 * COUNT_OPS);
    ctpu_release(x);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("threads");
    TCase *t = tcase_create("threads");
    tcase_add_checked_fixture(t, t_setup, t_teardown);
    tcase_set_timeout(t, 300);
    tcase_add_test(t, threads_with_own_modes);
    tcase_add_test(t, handle_churn);
    tcase_add_test(t, bounded_tables_under_threads);
    tcase_add_test(t, thread_state_per_runtime);
    tcase_add_test(t, same_key_compiled_once);
    tcase_add_test(t, same_key_given_up_compiled_by_the_waiter);
    tcase_add_test(t, compiled_step_one_call_at_a_time);
    tcase_add_test(t, counters_sum_over_threads);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
