/* The emulated chip: HBM arena, the stream and its device thread, kernel
 * workers, sticky faults. */
#include "device.h"
#include "tracefile.h"

#include <errno.h>
#include <sched.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CTPU_USE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Spin this long before parking (CONTRACTS.md "Threads": a sleep/wake round
 * trip costs about 22 µs here, a short spin about 1 µs). */
#define DEVICE_SPIN_NS 60000ull
#define HOST_SPIN_NS 30000ull
#define POOL_SPIN_NS 30000ull

/* ------------------------------------------------------------ worker pool */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    atomic_uint_fast64_t gen;       /* job generation */
    atomic_int remaining;           /* workers yet to finish the current job */
    atomic_int sleepers;
    void (*fn)(void *, int, int);
    void *ctx;
    int nthreads;
    bool stop;
    pthread_t th[63];
    ctpu_k_pool pool;
} worker_pool;

typedef struct { worker_pool *wp; int tid; } worker_arg;

/* Fields written by one thread and read by the other sit on cache lines of
 * their own (the host submits and allocates, the device completes): a shared
 * line would move between the cores on every op. */
struct ctpu_device {
    /* read-mostly */
    const ctpu_chip_info *chip;
    ctpu_metrics *metrics;
    uint64_t cap;
    unsigned arena;
    bool have_arena;
    atomic_bool stop, hold;
    /* the device thread parks with a process-wide barrier (membarrier), so
     * a submit needs no fence of its own between publishing its slot and
     * reading dev_sleeping (false: the kernel has none; the submit fences) */
    bool park_barrier;
    pthread_t thread;
    bool thread_started;
    ctpu_cmd *ring;
    /* Host-written and device-written groups are 128 bytes apart (pad_*):
     * the L2 prefetcher fetches a line's 128-byte buddy with it, so two
     * lines of one pair behave as one between the cores. */
    char pad_rm_[64];
    /* HBM accounting (host threads) */
    _Alignas(64) atomic_uint_fast64_t in_use;
    atomic_uint_fast64_t peak, allocs, frees;
    /* stream */
    _Alignas(64) atomic_uint_fast64_t tail;      /* commands submitted (host; the device polls the slots' seq) */
    uint64_t done_seen;   /* (under submit_lk) a value of completed: the ring has room below it + RING_SIZE */
    char pad_tail_[64];
    _Alignas(64) atomic_uint_fast64_t completed; /* commands done (device) */
    char pad_done_[64];
    _Alignas(64) atomic_int dev_sleeping;
    atomic_int host_waiters;
    /* the lowest command count a parked host thread waits for (UINT64_MAX:
     * none); set under mu by the waiters, reset by the device when it wakes
     * them, so the device wakes a parked host once per wait, not once per
     * command (a host waiting for half the queued work used to be woken,
     * and go back to sleep, after every command: two futex calls on the
     * device thread per command) */
    atomic_uint_fast64_t wake_seq;
    /* producers: a spinlock (an uncontended pthread mutex is two locked
     * instructions and ~60 more of glibc per op; this is one, its release a
     * plain store). A producer that waits for it spins, then yields: it is
     * held only to fill one ring slot, or while the ring is full. */
    char pad_wake_[64];
    _Alignas(64) atomic_int submit_lk;
    pthread_mutex_t mu;                          /* parking */
    pthread_cond_t cv_work, cv_done, cv_space;
    /* buffers released while a command that uses them is pending */
    pthread_mutex_t defer_mu;
    ctpu_buffer **deferred;
    size_t n_deferred, cap_deferred;
    atomic_size_t n_deferred_hint;
    uint64_t deferred_min;                 /* the lowest last_seq in deferred (under defer_mu) */
    atomic_uint_fast64_t deferred_bytes;   /* HBM held only by pending commands */
    uint64_t deferred_limit;               /* past it, the host waits for the device */
    /* faults */
    pthread_mutex_t fault_mu;
    ctpu_fault_rec faults[CTPU_MAX_FAULTS];
    unsigned n_faults;
    ctpu_status sticky;
    char sticky_msg[256];
    /* region labels: interned under label_mu, read by id without it */
    pthread_mutex_t label_mu;
    _Atomic(char *) labels[CTPU_MAX_LABELS + CTPU_LABELS_RESERVED + 1];
    uint32_t n_labels;
    uint32_t label_slot[4 * CTPU_MAX_LABELS];   /* open addressing: ids by hash */
    /* workers */
    worker_pool wp;
    worker_arg wargs[63];
};

/* ------------------------------------------------------------ HBM */
#ifdef CTPU_USE_JEMALLOC
/* The HBM arena is created once per process and kept across init/shutdown:
 * buffers go through the threads' jemalloc caches (tcache: a strict op's
 * alloc+free costs half as much), and an arena whose regions may still sit in
 * a thread's cache cannot be destroyed safely (jemalloc's arena.<i>.destroy
 * requires every such cache flushed first, which only each thread can do).
 * Shutdown purges its pages instead. */
static pthread_once_t hbm_arena_once = PTHREAD_ONCE_INIT;
/* jemalloc sends requests above opt.oversize_threshold (8 MiB by default) to
 * an automatic arena of its own that returns pages eagerly; the HBM arena must
 * keep them (a fresh 4 KiB page costs ~11 us to touch here). 0 turns that
 * routing off. jemalloc reads this symbol once, at its own start; a program
 * may still set MALLOC_CONF. The one exported symbol of libctpu.so that is
 * not a ctpu_ name (the library is built with -fvisibility=hidden): hidden,
 * jemalloc would not see it and 64 MiB buffers would leave the HBM arena
 * (bench/hbm shows it). tests/check_exports.py allows exactly this one. */
__attribute__((visibility("default"))) const char *malloc_conf = "oversize_threshold:0";
static unsigned hbm_arena;
static bool hbm_arena_ok;

static void hbm_arena_create(void)
{
    size_t sz = sizeof hbm_arena;
    if (mallctl("arenas.create", &hbm_arena, &sz, NULL, 0) != 0) return;
    /* keep freed pages: a step loop reuses them without first-touch faults */
    ssize_t never = -1;
    char name[64];
    snprintf(name, sizeof name, "arena.%u.dirty_decay_ms", hbm_arena);
    mallctl(name, NULL, NULL, &never, sizeof never);
    snprintf(name, sizeof name, "arena.%u.muzzy_decay_ms", hbm_arena);
    mallctl(name, NULL, NULL, &never, sizeof never);
    hbm_arena_ok = true;
}
#endif

static void *hbm_raw_alloc(ctpu_device *dev, size_t bytes)
{
    size_t n = bytes < 64 ? 64 : (bytes + 63) & ~(size_t)63;
#ifdef CTPU_USE_JEMALLOC
    if (dev->have_arena) {
        /* n is a multiple of 64, so its jemalloc size class is too and the
         * region is 64-byte aligned without MALLOCX_ALIGN (its aligned path
         * costs ~2.5 ns more per alloc here); checked, not assumed */
        void *p = mallocx(n, MALLOCX_ARENA(dev->arena));
        if (!p || ((uintptr_t)p & 63) == 0) return p;
        dallocx(p, 0);
        return mallocx(n, MALLOCX_ARENA(dev->arena) | MALLOCX_ALIGN(64));
    }
#else
    (void)dev;
#endif
    return aligned_alloc(64, n);
}

static void hbm_raw_free(ctpu_device *dev, void *p)
{
#ifdef CTPU_USE_JEMALLOC
    if (dev->have_arena) { dallocx(p, 0); return; }
#else
    (void)dev;
#endif
    free(p);
}

/* A buffer is one allocation: a 128-byte header (the ctpu_buffer, two
 * lines) followed by its 64-byte aligned data. */
#define BUF_HDR 128
_Static_assert(sizeof(ctpu_buffer) <= BUF_HDR, "buffer header grew past 128 bytes");

static void buffer_free_now(ctpu_device *dev, ctpu_buffer *b)
{
    uint64_t need = b->bytes < 64 ? 64 : (b->bytes + 63) & ~(uint64_t)63;
    if (b->name) free(b->name);
    hbm_raw_free(dev, b);
    atomic_fetch_sub(&dev->in_use, need);
    atomic_fetch_add(&dev->frees, 1);
}

/* Free the deferred buffers whose last command has run. */
static void drain_deferred(ctpu_device *dev)
{
    if (atomic_load_explicit(&dev->n_deferred_hint, memory_order_relaxed) == 0) return;
    pthread_mutex_lock(&dev->defer_mu);
    uint64_t done = atomic_load(&dev->completed);
    /* nothing has finished yet: no walk (a host running ahead allocates
     * with thousands of buffers deferred) */
    if (done < dev->deferred_min) {
        pthread_mutex_unlock(&dev->defer_mu);
        return;
    }
    size_t k = 0;
    uint64_t lo = UINT64_MAX;
    for (size_t i = 0; i < dev->n_deferred; i++) {
        ctpu_buffer *b = dev->deferred[i];
        uint64_t q = atomic_load(&b->last_seq);
        if (q <= done) {
            atomic_fetch_sub(&dev->deferred_bytes, b->bytes < 64 ? 64 : (b->bytes + 63) & ~(uint64_t)63);
            buffer_free_now(dev, b);
        } else {
            dev->deferred[k++] = b;
            if (q < lo) lo = q;
        }
    }
    dev->n_deferred = k;
    dev->deferred_min = lo;
    atomic_store(&dev->n_deferred_hint, k);
    pthread_mutex_unlock(&dev->defer_mu);
}

/* The newest command that a deferred buffer waits for. */
static uint64_t deferred_max_seq(ctpu_device *dev)
{
    uint64_t m = 0;
    pthread_mutex_lock(&dev->defer_mu);
    for (size_t i = 0; i < dev->n_deferred; i++) {
        uint64_t q = atomic_load(&dev->deferred[i]->last_seq);
        if (q > m) m = q;
    }
    pthread_mutex_unlock(&dev->defer_mu);
    return m;
}

ctpu_buffer *ctpu_buffer_alloc(ctpu_device *dev, size_t bytes, char *err, size_t errlen)
{
    drain_deferred(dev);
    /* The host may run ahead of the device, but the memory that only queued
     * commands still hold is bounded: past the limit, wait until the device
     * is halfway through them. */
    if (atomic_load(&dev->deferred_bytes) > dev->deferred_limit) {
        uint64_t done = atomic_load(&dev->completed), last = deferred_max_seq(dev);
        if (last > done) ctpu_device_wait(dev, done + (last - done + 1) / 2);
    }
    uint64_t need = bytes < 64 ? 64 : (bytes + 63) & ~(uint64_t)63;
    if (bytes > UINT64_MAX - BUF_HDR - 64) need = UINT64_MAX;
    uint64_t cur = atomic_load(&dev->in_use);
    bool waited = false;
    for (;;) {
        if (need > dev->cap || cur + need > dev->cap) {
            /* memory that queued work will give back (buffers released
             * while a pending command still uses them) is not out of
             * memory: wait for the device once, then decide. A request
             * that cannot fit even then fails at once. */
            uint64_t held = atomic_load(&dev->deferred_bytes);
            if (held > cur) held = cur;
            bool fits_later = need <= dev->cap && cur - held <= dev->cap - need;
            if (!waited && fits_later && held) {
                waited = true;
                ctpu_device_wait(dev, 0);
                cur = atomic_load(&dev->in_use);
                continue;
            }
            ctpu_counter_add(dev->metrics, CTPU_CTR_HBM_OOM, 1);
            snprintf(err, errlen,
                     "out of HBM: requested %zu bytes, %llu in use (%llu of them held only by queued commands), "
                     "capacity %llu bytes (%s)",
                     bytes, (unsigned long long)cur, (unsigned long long)held, (unsigned long long)dev->cap,
                     dev->chip->name);
            return NULL;
        }
        if (atomic_compare_exchange_weak(&dev->in_use, &cur, cur + need)) break;
    }
    ctpu_buffer *b = hbm_raw_alloc(dev, (size_t)need + BUF_HDR);
    if (!b) {
        atomic_fetch_sub(&dev->in_use, need);
        snprintf(err, errlen, "out of host memory for a %zu-byte device buffer", bytes);
        return NULL;
    }
    /* The first line is the one the device reads. A buffer is most often
     * the memory of one just freed, of the same size: its first line then
     * already holds these values, and is written only where it does not
     * (a store would take the line from the device core, which read it
     * last, and the next command would take it back). */
    char *data = (char *)b + BUF_HDR;
    if (b->data != data) b->data = data;
    if (b->bytes != bytes) b->bytes = bytes;
    if (atomic_load_explicit(&b->fault, memory_order_relaxed) != 0) atomic_store_explicit(&b->fault, 0, memory_order_relaxed);
    if (b->name) b->name = NULL;
    atomic_init(&b->refs, 1);
    atomic_init(&b->handle_refs, 0);
    atomic_init(&b->trace_readers, 0);
    atomic_init(&b->last_seq, 0);
    atomic_init(&b->watched, false);
    b->serial = (uint64_t)atomic_fetch_add(&dev->allocs, 1) + 1;
    uint64_t now = cur + need, pk = atomic_load(&dev->peak);
    while (now > pk && !atomic_compare_exchange_weak(&dev->peak, &pk, now)) {}
    ctpu_counter_add(dev->metrics, CTPU_CTR_HBM_ALLOCS, 1);
    ctpu_counter_add(dev->metrics, CTPU_CTR_HBM_BYTES_ALLOCATED, (long long)need);
    return b;
}

void ctpu_buffer_retain(ctpu_buffer *b) { atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed); }

void ctpu_buffer_release(ctpu_device *dev, ctpu_buffer *b)
{
    /* refs 1 (acquire: after every other holder's release): the caller's is
     * the last reference and nobody can take another, so no locked
     * subtract is needed to see it reach 0 (an op result released: every
     * strict op's) */
    if (atomic_load_explicit(&b->refs, memory_order_acquire) != 1 &&
        atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (atomic_load(&b->last_seq) <= atomic_load(&dev->completed)) {
        buffer_free_now(dev, b);
        return;
    }
    pthread_mutex_lock(&dev->defer_mu);
    if (dev->n_deferred == dev->cap_deferred) {
        size_t nc = dev->cap_deferred ? dev->cap_deferred * 2 : 256;
        ctpu_buffer **p = realloc(dev->deferred, nc * sizeof *p);
        if (!p) {
            /* no memory to defer: wait for the command instead */
            pthread_mutex_unlock(&dev->defer_mu);
            ctpu_device_wait(dev, atomic_load(&b->last_seq));
            buffer_free_now(dev, b);
            return;
        }
        dev->deferred = p;
        dev->cap_deferred = nc;
    }
    dev->deferred[dev->n_deferred++] = b;
    /* a buffer no handle or command can reach any more: its last_seq is final */
    uint64_t q = atomic_load(&b->last_seq);
    if (dev->n_deferred == 1 || q < dev->deferred_min) dev->deferred_min = q;
    atomic_store(&dev->n_deferred_hint, dev->n_deferred);
    atomic_fetch_add(&dev->deferred_bytes, b->bytes < 64 ? 64 : (b->bytes + 63) & ~(uint64_t)63);
    pthread_mutex_unlock(&dev->defer_mu);
}

void ctpu_hbm_stats_get(ctpu_device *dev, ctpu_hbm_stats *out)
{
    drain_deferred(dev);
    out->in_use = atomic_load(&dev->in_use);
    out->peak = atomic_load(&dev->peak);
    out->capacity = dev->cap;
    out->allocs = atomic_load(&dev->allocs);
    out->frees = atomic_load(&dev->frees);
}

uint64_t ctpu_hbm_queued_bytes(ctpu_device *dev) { return atomic_load(&dev->deferred_bytes); }

void ctpu_hbm_peak_reset(ctpu_device *dev) { atomic_store(&dev->peak, atomic_load(&dev->in_use)); }

/* ------------------------------------------------------------ worker pool */
static void *worker_main(void *p)
{
    worker_arg *a = p;
    worker_pool *wp = a->wp;
    uint64_t seen = 0;
    for (;;) {
        uint64_t t0 = ctpu_now_ns();
        unsigned spins = 0;
        while (atomic_load_explicit(&wp->gen, memory_order_acquire) == seen) {
            cpu_relax();
            if ((++spins & 255) == 0 && ctpu_now_ns() - t0 > POOL_SPIN_NS) {
                pthread_mutex_lock(&wp->mu);
                atomic_fetch_add(&wp->sleepers, 1);
                while (atomic_load(&wp->gen) == seen && !wp->stop) pthread_cond_wait(&wp->cv_job, &wp->mu);
                atomic_fetch_sub(&wp->sleepers, 1);
                bool stop = wp->stop;
                pthread_mutex_unlock(&wp->mu);
                if (stop) return NULL;
                t0 = ctpu_now_ns();
            }
        }
        seen = atomic_load(&wp->gen);
        if (wp->stop) return NULL;
        wp->fn(wp->ctx, a->tid, wp->nthreads);
        if (atomic_fetch_sub_explicit(&wp->remaining, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&wp->mu);
            pthread_cond_broadcast(&wp->cv_done);
            pthread_mutex_unlock(&wp->mu);
        }
    }
}

static void pool_run(ctpu_k_pool *pool, void (*fn)(void *, int, int), void *ctx)
{
    worker_pool *wp = pool->impl;
    if (wp->nthreads <= 1) { fn(ctx, 0, 1); return; }
    wp->fn = fn;
    wp->ctx = ctx;
    atomic_store(&wp->remaining, wp->nthreads - 1);
    atomic_fetch_add_explicit(&wp->gen, 1, memory_order_release);
    if (atomic_load(&wp->sleepers) > 0) {
        pthread_mutex_lock(&wp->mu);
        pthread_cond_broadcast(&wp->cv_job);
        pthread_mutex_unlock(&wp->mu);
    }
    fn(ctx, 0, wp->nthreads);
    uint64_t t0 = ctpu_now_ns();
    unsigned spins = 0;
    while (atomic_load_explicit(&wp->remaining, memory_order_acquire) > 0) {
        cpu_relax();
        if ((++spins & 255) == 0 && ctpu_now_ns() - t0 > POOL_SPIN_NS) {
            pthread_mutex_lock(&wp->mu);
            while (atomic_load(&wp->remaining) > 0) pthread_cond_wait(&wp->cv_done, &wp->mu);
            pthread_mutex_unlock(&wp->mu);
        }
    }
}

ctpu_k_pool *ctpu_device_pool(ctpu_device *dev) { return &dev->wp.pool; }

/* ------------------------------------------------------------ faults */
static unsigned fault_record_ex(ctpu_device *dev, ctpu_status st, const char *msg, bool sticky)
{
    pthread_mutex_lock(&dev->fault_mu);
    unsigned id = dev->n_faults < CTPU_MAX_FAULTS ? dev->n_faults++ : CTPU_MAX_FAULTS - 1;
    dev->faults[id].status = st;
    snprintf(dev->faults[id].msg, sizeof dev->faults[id].msg, "%s", msg);
    if (sticky && dev->sticky == CTPU_OK) {
        dev->sticky = st;
        snprintf(dev->sticky_msg, sizeof dev->sticky_msg, "%s", msg);
    }
    pthread_mutex_unlock(&dev->fault_mu);
    ctpu_counter_add(dev->metrics, CTPU_CTR_DEVICE_FAULTS, 1);
    return id + 1;
}

static unsigned fault_record(ctpu_device *dev, ctpu_status st, const char *msg)
{
    return fault_record_ex(dev, st, msg, true);
}

unsigned ctpu_device_fault_new(ctpu_device *dev, ctpu_status st, const char *msg, bool sticky)
{
    return fault_record_ex(dev, st, msg, sticky);
}

const ctpu_fault_rec *ctpu_device_fault(ctpu_device *dev, unsigned fault_id)
{
    if (fault_id == 0 || fault_id > CTPU_MAX_FAULTS) return NULL;
    return &dev->faults[fault_id - 1];
}

ctpu_status ctpu_device_take_error(ctpu_device *dev, char *msg, size_t len)
{
    pthread_mutex_lock(&dev->fault_mu);
    ctpu_status st = dev->sticky;
    if (st != CTPU_OK && msg) snprintf(msg, len, "%s", dev->sticky_msg);
    dev->sticky = CTPU_OK;
    dev->sticky_msg[0] = 0;
    pthread_mutex_unlock(&dev->fault_mu);
    return st;
}

/* ------------------------------------------------------------ provenance */
static uint32_t label_id_upto(ctpu_device *dev, const char *label, uint32_t limit)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *c = (const unsigned char *)label; *c; c++) h = (h ^ *c) * 1099511628211ull;
    uint32_t mask = 4 * CTPU_MAX_LABELS - 1, id = 0;
    pthread_mutex_lock(&dev->label_mu);
    for (uint32_t k = (uint32_t)h & mask;; k = (k + 1) & mask) {
        uint32_t e = dev->label_slot[k];
        if (e == 0) {
            char *copy = dev->n_labels < limit ? strdup(label) : NULL;
            if (copy) {
                id = ++dev->n_labels;
                atomic_store_explicit(&dev->labels[id], copy, memory_order_release);
                dev->label_slot[k] = id;
            }
            break;
        }
        if (strcmp(atomic_load_explicit(&dev->labels[e], memory_order_relaxed), label) == 0) { id = e; break; }
    }
    pthread_mutex_unlock(&dev->label_mu);
    return id;
}

uint32_t ctpu_device_label_id(ctpu_device *dev, const char *label) { return label_id_upto(dev, label, CTPU_MAX_LABELS); }

uint32_t ctpu_device_label_id_internal(ctpu_device *dev, const char *label)
{
    return label_id_upto(dev, label, CTPU_MAX_LABELS + CTPU_LABELS_RESERVED);
}

const char *ctpu_device_label(const ctpu_device *dev, uint32_t id)
{
    if (id == 0 || id > CTPU_MAX_LABELS + CTPU_LABELS_RESERVED) return NULL;
    return atomic_load_explicit(&((ctpu_device *)dev)->labels[id], memory_order_acquire);
}

const char *ctpu_device_prov_str(const ctpu_device *dev, ctpu_op_prov p, char *buf, size_t len)
{
    const char *l = ctpu_device_label(dev, p.label);
    if (p.op_no == 0 && !l) buf[0] = 0;
    else if (p.op_no == 0) snprintf(buf, len, " (\"%s\")", l);
    else if (!l) snprintf(buf, len, " (op #%u)", p.op_no);
    else snprintf(buf, len, " (op #%u, \"%s\")", p.op_no, l);
    return buf;
}

/* An index fault under a call scope, reported as the call's (see device.h). */
static bool call_msg(const ctpu_device *dev, ctpu_op_prov p, const char *pv, const char *msg, char *out, size_t len)
{
    const char *ca = ctpu_device_label(dev, p.call);
    const char *sep = ca ? strchr(ca, '\x1f') : NULL;
    const char *colon = strchr(msg, ':');
    if (!sep || !colon) return false;
    int cn = (int)(sep - ca);
    const char *idx = strncmp(colon, ": index ", 8) == 0 ? colon + 8 : NULL;
    if (!idx) {
        snprintf(out, len, "%.*s%s: %s", cn, ca, pv, msg);
        return true;
    }
    /* the library's dim is not the user's: "along dim D" goes */
    const char *along = strstr(idx, " along dim ");
    const char *rest = along ? strchr(along + 11, ' ') : NULL;
    if (along && rest)
        snprintf(out, len, "%.*s%s: %s %.*s%s", cn, ca, pv, sep + 1, (int)(along - idx), idx, rest);
    else
        snprintf(out, len, "%.*s%s: %s %s", cn, ca, pv, sep + 1, idx);
    return true;
}

void ctpu_device_prov_msg(const ctpu_device *dev, ctpu_op_prov p, const char *msg, char *out, size_t len)
{
    char pv[128];
    ctpu_device_prov_str(dev, p, pv, sizeof pv);
    if (p.call && call_msg(dev, p, pv, msg, out, len)) return;
    const char *colon = strchr(msg, ':');
    if (!pv[0] || !colon) { snprintf(out, len, "%s", msg); return; }
    snprintf(out, len, "%.*s%s%s", (int)(colon - msg), msg, pv, colon);
}

/* ------------------------------------------------------------ executor */
/* NaN or Inf anywhere in n values of dtype (bf16 / f32; i32 has neither) */
static bool has_nonfinite(const void *p, int dtype, int64_t n)
{
    if (dtype == CTPU_KDT_F32) {
        const uint32_t *u = p;
        for (int64_t i = 0; i < n; i++)
            if ((u[i] & 0x7f800000u) == 0x7f800000u) return true;
    } else if (dtype == CTPU_KDT_BF16) {
        const uint16_t *u = p;
        for (int64_t i = 0; i < n; i++)
            if ((u[i] & 0x7f80u) == 0x7f80u) return true;
    }
    return false;
}

static ctpu_op_prov cmd_prov(const ctpu_cmd *cmd, int s)
{
    /* a one-op program's steps all run its one op */
    return cmd->n_prov == 1 ? cmd->prov[0] : s < cmd->n_prov ? cmd->prov[s] : (ctpu_op_prov){ 0, 0, 0 };
}

/* The device slice's first and last ops (trace file args): a fused
 * program's command carries them after its steps' (prov_span), a one-op
 * program's are its op. "" when none was recorded. */
static const char *span_args(const ctpu_device *dev, const ctpu_cmd *cmd, char *out, size_t len)
{
    out[0] = 0;
    if (!cmd->n_prov) return out;
    ctpu_op_prov p[2] = { cmd->prov[0], cmd->prov[0] };
    if (cmd->prov_span) { p[0] = cmd->prov[cmd->n_prov]; p[1] = cmd->prov[cmd->n_prov + 1]; }
    size_t k = 0;
    for (int i = 0; i < 2 && k < len; i++) {
        const char *l = ctpu_device_label(dev, p[i].label);
        char esc[48];
        k += (size_t)snprintf(out + k, len - k, ",\"%s_op\":%u", i ? "last" : "first", p[i].op_no);
        if (l && k < len)
            k += (size_t)snprintf(out + k, len - k, ",\"%s_label\":\"%s\"", i ? "last" : "first",
                                  ctpu_json_escape(l, esc, sizeof esc));
    }
    return out;
}

/* The debug check's message for a NaN op made at step s. */
static ctpu_op_prov cmd_prov(const ctpu_cmd *cmd, int s);

/* Under a call scope the op is named after the user's call, as faults are
 * (call_msg): "cross_entropy (op #9): div: debug check: ...". */
static void nan_msg(const ctpu_device *dev, const ctpu_cmd *cmd, int s, const char *op, char *out, size_t len)
{
    char pv[128];
    ctpu_op_prov p = cmd_prov(cmd, s);
    ctpu_device_prov_str(dev, p, pv, sizeof pv);
    const char *ca = p.call ? ctpu_device_label(dev, p.call) : NULL;
    const char *sep = ca ? strchr(ca, '\x1f') : NULL;
    if (sep)
        snprintf(out, len, "%.*s%s: %s: debug check: NaN in the output, none in its inputs (TORCH_TPU_ENABLE_DEBUG_CHECKS)",
                 (int)(sep - ca), ca, pv, op);
    else
        snprintf(out, len, "%s%s: debug check: NaN in the output, none in its inputs (TORCH_TPU_ENABLE_DEBUG_CHECKS)", op,
                 pv);
}

static bool has_nan(const void *p, int dtype, int64_t n)
{
    if (dtype == CTPU_KDT_F32) {
        const uint32_t *u = p;
        for (int64_t i = 0; i < n; i++)
            if ((u[i] & 0x7fffffffu) > 0x7f800000u) return true;
    } else if (dtype == CTPU_KDT_BF16) {
        const uint16_t *u = p;
        for (int64_t i = 0; i < n; i++)
            if ((u[i] & 0x7fffu) > 0x7f80u) return true;
    }
    return false;
}

static bool bit_set(const uint64_t *w, int i) { return (w[i >> 6] >> (i & 63)) & 1; }

/* A multi-step program with per-output dependencies: every step runs (each
 * kernel is bounds-checked, so computing on a poisoned or faulted value is
 * safe), and each output takes the fault of the first input or step it
 * depends on, or none. With debug checks, each step's value is checked for
 * NaN as soon as it is made, naming its op. */
static void (*_Atomic g_progress)(void);
void ctpu_device_set_progress(void (*fn)(void)) { atomic_store(&g_progress, fn); }

static inline void progress(void)
{
    void (*fn)(void) = atomic_load_explicit(&g_progress, memory_order_relaxed);
    if (fn) fn();
}

static void execute_tracked(ctpu_device *dev, ctpu_cmd *cmd, void **ptr)
{
    const ctpu_dev_program *prog = cmd->prog;
    int ns = prog->n_steps;
    unsigned in_fault_inl[16], step_fault_inl[64];
    unsigned *in_fault = prog->n_in <= 16 ? in_fault_inl : calloc((size_t)prog->n_in, sizeof(unsigned));
    unsigned *step_fault = ns <= 64 ? step_fault_inl : calloc((size_t)ns, sizeof(unsigned));
    if (!in_fault || !step_fault) {
        unsigned id = fault_record(dev, CTPU_ERR_OOM, "fused program: out of host memory tracking faults");
        for (int i = prog->n_in; i < cmd->n_bufs; i++) atomic_store(&cmd->buf[i]->fault, id);
        if (in_fault != in_fault_inl) free(in_fault);
        if (step_fault != step_fault_inl) free(step_fault);
        return;
    }
    bool any = false;
    unsigned oom = 0;   /* a step out of host memory: it computed nothing, so every output takes it */
    for (int i = 0; i < prog->n_in; i++) any |= (in_fault[i] = atomic_load(&cmd->buf[i]->fault)) != 0;
    ctpu_exec_ctx ctx = { .ptr = ptr, .scalars = cmd->scalars, .pool = &dev->wp.pool,
                          .metrics = dev->metrics, .mxu_size = dev->chip->mxu_size, .fault_status = CTPU_OK };
    bool check = cmd->debug_checks && prog->step_out_slot;
    uint64_t t0 = ctpu_now_ns();
    for (int s = 0; s < ns; s++) {
        step_fault[s] = 0;
        if (s) progress();
        prog->steps[s].fn(prog->steps[s].data, &ctx);
        if (ctx.fault_status != CTPU_OK) {
            char msg[256];
            ctpu_device_prov_msg(dev, cmd_prov(cmd, s), ctx.fault_msg, msg, sizeof msg);
            step_fault[s] = fault_record(dev, ctx.fault_status, msg);
            if (ctx.fault_status == CTPU_ERR_OOM && !oom) oom = step_fault[s];
            ctx.fault_status = CTPU_OK;
            any = true;
        } else if (check && prog->step_out_slot[s] >= 0 && !prog->step_nan_ok[s] &&
                   has_nan(ptr[prog->step_out_slot[s]], prog->step_out_dtype[s], prog->step_out_numel[s])) {
            bool made = true;   /* not passed along: no input of the step holds a NaN or an Inf */
            for (int q = prog->step_in_off[s]; q < prog->step_in_off[s + 1] && made; q++)
                made = !has_nonfinite(ptr[prog->step_in_slot[q]], prog->step_in_dtype[q], prog->step_in_numel[q]);
            if (made) {
                char msg[256];
                nan_msg(dev, cmd, s, prog->step_op[s], msg, sizeof msg);
                step_fault[s] = fault_record(dev, CTPU_ERR_NAN, msg);
                any = true;
            }
        }
    }
    uint64_t t1 = ctpu_now_ns();
    ctpu_timer_add(dev->metrics, CTPU_TMR_EXECUTE_TIME, t1 - t0);
    if (dev->metrics->trace) {
        char span[160];
        ctpu_trace_program(dev->metrics->trace, prog->name, cmd->program_id, atomic_load_explicit(&cmd->seq, memory_order_relaxed), ns, t0, t1,
                           span_args(dev, cmd, span, sizeof span));
    }
    for (int j = 0; j < prog->n_out; j++) {
        unsigned f = 0;
        if (any) {
            const uint64_t *di = prog->out_dep_in + (size_t)j * (size_t)prog->dep_words_in;
            const uint64_t *ds = prog->out_dep_step + (size_t)j * (size_t)prog->dep_words_step;
            for (int i = 0; i < prog->n_in && !f; i++) if (in_fault[i] && bit_set(di, i)) f = in_fault[i];
            for (int s = 0; s < ns && !f; s++) if (step_fault[s] && bit_set(ds, s)) f = step_fault[s];
            if (!f) f = oom;
        }
        atomic_store(&cmd->buf[prog->n_in + j]->fault, f);   /* a good result clears an old fault */
    }
    if (in_fault != in_fault_inl) free(in_fault);
    if (step_fault != step_fault_inl) free(step_fault);
}

static void execute(ctpu_device *dev, ctpu_cmd *cmd)
{
    const ctpu_dev_program *prog = cmd->prog;
    void *ptr_inl[CTPU_CMD_INLINE_BUFS];
    int nptr = cmd->n_bufs + prog->n_virtual;
    void **ptr = nptr <= CTPU_CMD_INLINE_BUFS ? ptr_inl : malloc(sizeof(void *) * (size_t)nptr);
    unsigned poison = 0;
    for (int i = 0; i < cmd->n_bufs; i++) {
        ptr[i] = (char *)cmd->buf[i]->data + cmd->off[i];
        if (i < prog->n_in && !poison) poison = atomic_load(&cmd->buf[i]->fault);
    }
    for (int k = 0; k < prog->n_virtual; k++)
        ptr[cmd->n_bufs + k] = (char *)ptr[prog->scratch_slot] + prog->virt_off[k];
    if (prog->out_dep_in) {
        execute_tracked(dev, cmd, ptr);
    } else if (poison) {
        /* a dependent of a faulted value: poisoned, not computed */
        for (int i = prog->n_in; i < cmd->n_bufs; i++) atomic_store(&cmd->buf[i]->fault, poison);
    } else {
        ctpu_exec_ctx ctx = { .ptr = ptr, .scalars = cmd->scalars, .pool = &dev->wp.pool,
                              .metrics = dev->metrics, .mxu_size = dev->chip->mxu_size,
                              .fault_status = CTPU_OK };
        uint64_t t0 = ctpu_now_ns();
        for (int s = 0; s < prog->n_steps; s++) {
            if (s) progress();
            prog->steps[s].fn(prog->steps[s].data, &ctx);
            if (ctx.fault_status != CTPU_OK) {
                if (cmd->n_prov) {
                    char msg[sizeof ctx.fault_msg];
                    ctpu_device_prov_msg(dev, cmd_prov(cmd, s), ctx.fault_msg, msg, sizeof msg);
                    memcpy(ctx.fault_msg, msg, sizeof msg);
                }
                break;
            }
        }
        uint64_t t1 = ctpu_now_ns();
        ctpu_timer_add(dev->metrics, CTPU_TMR_EXECUTE_TIME, t1 - t0);
        if (dev->metrics->trace) {
            char span[160];
            ctpu_trace_program(dev->metrics->trace, prog->name, cmd->program_id,
                               atomic_load_explicit(&cmd->seq, memory_order_relaxed), prog->n_steps, t0, t1,
                               span_args(dev, cmd, span, sizeof span));
        }
        if (ctx.fault_status == CTPU_OK && cmd->debug_checks && prog->out_dtype) {
            /* a one-op program: its inputs are the op's (a larger one without
             * per-step tables: the program's inputs) */
            for (int o = 0; o < prog->n_out; o++) {
                if (prog->out_nan_ok[o] || !has_nan(ptr[prog->n_in + o], prog->out_dtype[o], prog->out_numel[o]))
                    continue;
                bool made = true;
                for (int i = 0; i < prog->n_in && made; i++)
                    made = !has_nonfinite(ptr[i], prog->in_dtype[i], prog->in_numel[i]);
                for (int i = 0; i < prog->n_scal_check && made; i++) made = isfinite(cmd->scalars[i]);
                if (!made) continue;
                ctx.fault_status = CTPU_ERR_NAN;
                nan_msg(dev, cmd, prog->n_steps - 1, prog->out_op ? prog->out_op[o] : prog->name, ctx.fault_msg,
                        sizeof ctx.fault_msg);
                break;
            }
        }
        /* a good result replaces whatever fault the output held before
         * (assign in place over a faulted value) */
        unsigned id = ctx.fault_status != CTPU_OK ? fault_record(dev, ctx.fault_status, ctx.fault_msg) : 0;
        for (int i = prog->n_in; i < cmd->n_bufs; i++)
            if (atomic_load_explicit(&cmd->buf[i]->fault, memory_order_relaxed) != id)
                atomic_store(&cmd->buf[i]->fault, id);
    }
    if (ptr != ptr_inl) free(ptr);
    if (cmd->one_block) {
        free(cmd->buf);
    } else {
        if (cmd->buf != cmd->buf_inl) { free(cmd->buf); free(cmd->off); }
        if (cmd->scalars != cmd->scal_inl) free(cmd->scalars);
    }
    if (cmd->n_prov && cmd->prov != &cmd->prov_inl && !cmd->prov_shared) free(cmd->prov);
    ctpu_counter_add(dev->metrics, CTPU_CTR_COMMANDS_EXECUTED, 1);
}

/* Is command head + 1 (the next in the ring) published, and not held? */
static inline bool next_ready(ctpu_device *dev, const ctpu_cmd *slot, uint64_t head)
{
    return atomic_load_explicit(&slot->seq, memory_order_acquire) == head + 1 &&
           !atomic_load_explicit(&dev->hold, memory_order_acquire);
}

/* Park until the next command is published (or stop). dev_sleeping is
 * stored, then the slot read again: against a submit's store of the slot's
 * seq then load of dev_sleeping, Dekker's pattern. The submit has no fence
 * between the two (it would cost every op); the barrier here
 * (MEMBARRIER_CMD_PRIVATE_EXPEDITED: every running thread of the process
 * passes a full barrier) orders them: either this thread sees the seq or
 * the submit sees dev_sleeping. */
static void device_park(ctpu_device *dev, const ctpu_cmd *slot, uint64_t head)
{
    pthread_mutex_lock(&dev->mu);
    atomic_store(&dev->dev_sleeping, 1);
#if defined(__linux__)
    if (dev->park_barrier) syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
#endif
    while (!next_ready(dev, slot, head) && !atomic_load(&dev->stop)) pthread_cond_wait(&dev->cv_work, &dev->mu);
    atomic_store(&dev->dev_sleeping, 0);
    pthread_mutex_unlock(&dev->mu);
}

static void *device_main(void *p)
{
    ctpu_device *dev = p;
    uint64_t head = 0;
    for (;;) {
        uint64_t t0 = ctpu_now_ns();
        unsigned spins = 0;
        ctpu_cmd *slot = &dev->ring[head % CTPU_RING_SIZE];
        while (!next_ready(dev, slot, head)) {
            /* stop comes after the host waited for every command */
            if (atomic_load(&dev->stop) && atomic_load_explicit(&slot->seq, memory_order_acquire) != head + 1)
                return NULL;
            cpu_relax();
            if ((spins & 255) == 0) progress();
            if ((++spins & 255) == 0 && ctpu_now_ns() - t0 > DEVICE_SPIN_NS) {
                device_park(dev, slot, head);
                t0 = ctpu_now_ns();
            }
        }
        execute(dev, slot);
        progress();
        head++;
        /* seq_cst, not release: with the host's host_waiters++ then completed
         * read, this is Dekker's pattern; a release store lets the
         * host_waiters load pass it and a host going to sleep is never woken */
        atomic_store_explicit(&dev->completed, head, memory_order_seq_cst);
        if (atomic_load(&dev->host_waiters) > 0 && head >= atomic_load(&dev->wake_seq)) {
            /* the broadcasts after the unlock (as wake_device's signal):
             * a waiter is on the condition before the lock is taken here */
            pthread_mutex_lock(&dev->mu);
            atomic_store(&dev->wake_seq, UINT64_MAX);   /* the woken re-register what they still wait for */
            pthread_mutex_unlock(&dev->mu);
            pthread_cond_broadcast(&dev->cv_done);
            pthread_cond_broadcast(&dev->cv_space);
        }
    }
}

/* The lock only orders this against device_park: a parked device set
 * dev_sleeping under it and is inside pthread_cond_wait once it is free.
 * The signal comes after the unlock: signalled under the lock, the device
 * thread woke on its core, found the mutex held and slept on it again, and
 * the unlock paid a second futex wake-up (perf: __lll_lock_wake in every
 * cache hit that found the device parked). */
static void wake_device(ctpu_device *dev)
{
    if (atomic_load(&dev->dev_sleeping)) {
        pthread_mutex_lock(&dev->mu);
        pthread_mutex_unlock(&dev->mu);
        pthread_cond_signal(&dev->cv_work);
    }
}

static void wait_until(ctpu_device *dev, uint64_t seq, pthread_cond_t *cv)
{
    uint64_t t0 = ctpu_now_ns();
    unsigned spins = 0;
    while (atomic_load_explicit(&dev->completed, memory_order_acquire) < seq) {
        cpu_relax();
        if ((++spins & 63) == 0 && ctpu_now_ns() - t0 > HOST_SPIN_NS) {
            pthread_mutex_lock(&dev->mu);
            atomic_fetch_add(&dev->host_waiters, 1);
            /* seq_cst: wake_seq stored, then completed loaded, against the
             * device's completed stored, then wake_seq loaded (Dekker's) */
            while (atomic_load(&dev->completed) < seq) {
                if (seq < atomic_load(&dev->wake_seq)) atomic_store(&dev->wake_seq, seq);
                if (atomic_load(&dev->completed) >= seq) break;
                pthread_cond_wait(cv, &dev->mu);
            }
            atomic_fetch_sub(&dev->host_waiters, 1);
            pthread_mutex_unlock(&dev->mu);
        }
    }
}

static void submit_lock(ctpu_device *dev)
{
    unsigned spins = 0;
    while (atomic_exchange_explicit(&dev->submit_lk, 1, memory_order_acquire)) {
        while (atomic_load_explicit(&dev->submit_lk, memory_order_relaxed)) {
            cpu_relax();
            if (++spins >= 256) {
                spins = 0;
                sched_yield();
            }
        }
    }
}

/* cmd into its ring slot: the fixed fields, and of the inline arrays the
 * parts in use (the slot's other lines are not written: they stay in the
 * cache of the device core, which read them last) */
static void cmd_copy(ctpu_cmd *slot, const ctpu_cmd *cmd, int n_scal)
{
    slot->prog = cmd->prog;
    slot->n_bufs = cmd->n_bufs;
    slot->n_prov = cmd->n_prov;
    slot->prov_inl = cmd->prov_inl;
    slot->one_block = cmd->one_block;
    slot->debug_checks = cmd->debug_checks;
    slot->prov_span = cmd->prov_span;
    slot->prov_shared = cmd->prov_shared;
    slot->program_id = cmd->program_id;
    int nb = cmd->n_bufs < CTPU_CMD_INLINE_BUFS ? cmd->n_bufs : CTPU_CMD_INLINE_BUFS;
    slot->buf = cmd->buf;
    if (cmd->buf == cmd->buf_inl) {
        slot->buf = slot->buf_inl;
        for (int i = 0; i < nb; i++) slot->buf_inl[i] = cmd->buf_inl[i];
    }
    slot->off = cmd->off;
    if (cmd->off == cmd->off_inl) {
        slot->off = slot->off_inl;
        for (int i = 0; i < nb; i++) slot->off_inl[i] = cmd->off_inl[i];
    }
    slot->scalars = cmd->scalars;
    if (cmd->scalars == cmd->scal_inl) {
        slot->scalars = slot->scal_inl;
        for (int i = 0; i < n_scal && i < CTPU_CMD_MAX_SCALARS; i++) slot->scal_inl[i] = cmd->scal_inl[i];
    }
    slot->prov = cmd->prov == &cmd->prov_inl ? &slot->prov_inl : cmd->prov;
}

atomic_uint_fast64_t ctpu__bind_epoch = 1;

uint64_t ctpu_device_submit(ctpu_device *dev, ctpu_cmd *cmd)
{
    return ctpu_device_submit_n(dev, cmd, CTPU_CMD_MAX_SCALARS);
}

uint64_t ctpu_device_submit_n(ctpu_device *dev, ctpu_cmd *cmd, int n_scal)
{
    submit_lock(dev);
    uint64_t t = atomic_load_explicit(&dev->tail, memory_order_relaxed);
    /* completed is read only when the ring may be full by the last value
     * read: it is the device's line, written at every command, and a read
     * on every submit moved it to the host core and back */
    if (t - dev->done_seen >= CTPU_RING_SIZE) dev->done_seen = atomic_load(&dev->completed);
    if (t - dev->done_seen >= CTPU_RING_SIZE) {
        /* a full ring: wait until half of it has run, not for one slot
         * (one wake-up per half ring instead of one per command) */
        wake_device(dev);
        wait_until(dev, t - CTPU_RING_SIZE / 2 + 1, &dev->cv_space);
    }
    ctpu_cmd *slot = &dev->ring[t % CTPU_RING_SIZE];
    cmd_copy(slot, cmd, n_scal);
    for (int i = 0; i < slot->n_bufs; i++)
        atomic_store_explicit(&slot->buf[i]->last_seq, t + 1, memory_order_relaxed);
    atomic_store_explicit(&slot->seq, t + 1, memory_order_release);   /* published */
    atomic_store_explicit(&dev->tail, t + 1, memory_order_release);
    atomic_store_explicit(&dev->submit_lk, 0, memory_order_release);
    /* (device_park's barrier orders the seq store before the dev_sleeping
     * load; without it, a fence here does) */
    if (!dev->park_barrier) atomic_thread_fence(memory_order_seq_cst);
    wake_device(dev);
    return t + 1;
}

void ctpu_device_wait(ctpu_device *dev, uint64_t seq)
{
    if (seq == 0) seq = atomic_load(&dev->tail);
    if (atomic_load(&dev->completed) < seq) {
        wake_device(dev);
        uint64_t t0 = ctpu_now_ns();
        wait_until(dev, seq, &dev->cv_done);
        ctpu_timer_add(dev->metrics, CTPU_TMR_SYNC_WAIT, ctpu_now_ns() - t0);
    }
    drain_deferred(dev);
}

uint64_t ctpu_device_done_seq(ctpu_device *dev) { return atomic_load(&dev->completed); }

void ctpu_device_hold(ctpu_device *dev, bool hold)
{
    atomic_store(&dev->hold, hold);
    if (!hold) {
        pthread_mutex_lock(&dev->mu);
        pthread_mutex_unlock(&dev->mu);
        pthread_cond_signal(&dev->cv_work);   /* after the unlock: wake_device */
    }
}

/* ------------------------------------------------------------ lifecycle */
/* The run-ahead bound: the bytes of released buffers queued commands may
 * still hold before an allocation waits for the device. The host running
 * far ahead keeps every step's buffers alive at once, so the device thread
 * works on memory that has left its cache (and the allocator hands out
 * cold pages): on the small GPT step of bench/compile (about 0.6 MiB freed
 * per step) 64 MiB let the host run about 16 steps ahead and the device
 * thread spent 32% more CPU time per step than at 4 MiB (one cpu-clock
 * profile each, Sapphire Rapids, 2 MiB L2; the MLP step 9% more). So: the
 * larger of 4 MiB and the core's L2 (a few steps of a small model, still
 * whole steps of overlap), at most 64 MiB and an eighth of the HBM cap. */
static uint64_t runahead_limit(uint64_t hbm_cap)
{
    uint64_t lim = 4u << 20;
#ifdef _SC_LEVEL2_CACHE_SIZE
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 > 0 && (uint64_t)l2 > lim) lim = (uint64_t)l2;
#endif
    if (lim > (64u << 20)) lim = 64u << 20;
    return hbm_cap / 8 < lim ? hbm_cap / 8 : lim;
}

ctpu_device *ctpu_device_create(const ctpu_chip_info *chip, uint64_t hbm_cap, int nthreads,
                                ctpu_metrics *metrics, char *err, size_t errlen)
{
    ctpu_device *dev = calloc(1, sizeof *dev);
    if (!dev) { snprintf(err, errlen, "out of host memory"); return NULL; }
    dev->ring = aligned_alloc(64, CTPU_RING_SIZE * sizeof *dev->ring);
    if (dev->ring) memset(dev->ring, 0, CTPU_RING_SIZE * sizeof *dev->ring);
    if (!dev->ring) { free(dev); snprintf(err, errlen, "out of host memory"); return NULL; }
    dev->chip = chip;
    dev->metrics = metrics;
    dev->cap = hbm_cap;
    dev->deferred_limit = runahead_limit(hbm_cap);
#ifdef CTPU_USE_JEMALLOC
    pthread_once(&hbm_arena_once, hbm_arena_create);
    if (hbm_arena_ok) {
        dev->arena = hbm_arena;
        dev->have_arena = true;
    }
#endif
    atomic_init(&dev->submit_lk, 0);
    pthread_mutex_init(&dev->mu, NULL);
    pthread_mutex_init(&dev->fault_mu, NULL);
    pthread_mutex_init(&dev->label_mu, NULL);
    pthread_mutex_init(&dev->defer_mu, NULL);
    pthread_cond_init(&dev->cv_work, NULL);
    pthread_cond_init(&dev->cv_done, NULL);
    pthread_cond_init(&dev->cv_space, NULL);
    atomic_init(&dev->wake_seq, UINT64_MAX);
#if defined(__linux__)
    /* registration once per process is enough; a second is a no-op */
    long mb = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    dev->park_barrier = mb > 0 && (mb & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
                        syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
#endif

    worker_pool *wp = &dev->wp;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > 64) nthreads = 64;
    wp->nthreads = nthreads;
    pthread_mutex_init(&wp->mu, NULL);
    pthread_cond_init(&wp->cv_job, NULL);
    pthread_cond_init(&wp->cv_done, NULL);
    wp->pool = (ctpu_k_pool){ .nthreads = nthreads, .run = pool_run, .impl = wp };
    for (int t = 1; t < nthreads; t++) {
        dev->wargs[t - 1] = (worker_arg){ wp, t };
        if (pthread_create(&wp->th[t - 1], NULL, worker_main, &dev->wargs[t - 1]) != 0) {
            wp->nthreads = t;
            wp->pool.nthreads = t;
            break;
        }
    }
    if (pthread_create(&dev->thread, NULL, device_main, dev) != 0) {
        snprintf(err, errlen, "cannot start the device thread: %s", strerror(errno));
        ctpu_device_destroy(dev);
        return NULL;
    }
    dev->thread_started = true;
    return dev;
}

void ctpu_device_destroy(ctpu_device *dev)
{
    if (!dev) return;
    if (dev->thread_started) {
        ctpu_device_hold(dev, false);
        ctpu_device_wait(dev, 0);
        atomic_store(&dev->stop, true);
        pthread_mutex_lock(&dev->mu);
        pthread_cond_broadcast(&dev->cv_work);
        pthread_mutex_unlock(&dev->mu);
        pthread_join(dev->thread, NULL);
    }
    drain_deferred(dev);
    free(dev->deferred);
    for (uint32_t i = 1; i <= dev->n_labels; i++) free(atomic_load(&dev->labels[i]));
    worker_pool *wp = &dev->wp;
    pthread_mutex_lock(&wp->mu);
    wp->stop = true;
    atomic_fetch_add(&wp->gen, 1);
    pthread_cond_broadcast(&wp->cv_job);
    pthread_mutex_unlock(&wp->mu);
    for (int t = 1; t < wp->nthreads; t++) pthread_join(wp->th[t - 1], NULL);
#ifdef CTPU_USE_JEMALLOC
    if (dev->have_arena) {
        /* give the pages back; the arena itself stays (see hbm_arena_create) */
        char name[64];
        snprintf(name, sizeof name, "arena.%u.purge", dev->arena);
        mallctl(name, NULL, NULL, NULL, 0);
    }
#endif
    free(dev->ring);
    free(dev);
}
