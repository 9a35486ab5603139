/* Program caches keyed by the canonical key (DESIGN.md "Cache"): a hash
 * table with a full-key compare on hit, an LRU list bounded by capacity
 * (0 = unbounded: strict eager's table), per-entry counters, recompile
 * reasons (a miss whose structural key matches a cached entry), evictions
 * and thrash (a key compiled again after its eviction).
 *
 * Find and insert: the caller compiles a miss between the two, outside the
 * cache lock; a second thread missing the same key meanwhile waits for that
 * program instead of compiling it again (as TorchTPU's shared futures do). */
#include <stdlib.h>
#include <string.h>

#include "fuse.h"
#include "testing.h"

typedef struct entry {
    uint64_t hash, struct_hash;
    size_t len;
    uint8_t *key;
    ctpu_program *prog;
    ctpu_launch_plan *plan;       /* how a recorded trace binds to it (fused caches), or NULL */
    struct entry *next;           /* bucket chain */
    struct entry *lru_prev, *lru_next;
    ctpu_cache_entry_info info;
    ctpu_vtype *types;            /* inputs then node outputs, for recompile diffs */
    uint16_t *ops;                /* node ops */
    int n_in, n_nodes;
} entry;

#define THRASH_RING 4096
#define RECOMPILE_LOG 64

/* A miss one thread is compiling; others missing the same key wait for it
 * (`done` is broadcast when it is inserted or abandoned). */
struct ctpu_cache_pending {
    struct ctpu_cache_pending *next;
    uint64_t hash;
    size_t len;
    uint8_t *key;
};

struct ctpu_cache {
    pthread_mutex_t mu;
    pthread_cond_t done;
    ctpu_cache_pending *pending;
    entry **buckets;
    size_t nbuckets, count, capacity;
    entry *lru_head, *lru_tail;   /* head = most recent */
    ctpu_cache_stats st;
    bool force_hash;
    uint64_t forced;
    uint64_t next_id;
    uint64_t evicted[THRASH_RING];     /* key hashes of evicted programs */
    uint64_t evicted_id[THRASH_RING];  /* and their program ids (reused on thrash) */
    size_t n_evicted;
    ctpu_recompile_rec log[RECOMPILE_LOG];
    size_t n_log;
};

ctpu_cache *ctpu_cache_create(size_t capacity)
{
    ctpu_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->nbuckets = 256;
    c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
    if (!c->buckets) { free(c); return NULL; }
    c->capacity = capacity;
    c->next_id = 1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->done, NULL);
    return c;
}

static void entry_free(entry *e)
{
    ctpu_program_free(e->prog);
    free(e->plan);
    free(e->key);
    free(e->types);
    free(e->ops);
    free(e);
}

void ctpu_cache_destroy(ctpu_cache *c)
{
    if (!c) return;
    for (entry *e = c->lru_head, *n; e; e = n) {
        n = e->lru_next;
        entry_free(e);
    }
    free(c->buckets);
    pthread_cond_destroy(&c->done);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void grow(ctpu_cache *c)
{
    size_t nb = c->nbuckets * 2;
    entry **b = calloc(nb, sizeof *b);
    if (!b) return;
    for (size_t i = 0; i < c->nbuckets; i++) {
        for (entry *e = c->buckets[i], *n; e; e = n) {
            n = e->next;
            e->next = b[e->hash & (nb - 1)];
            b[e->hash & (nb - 1)] = e;
        }
    }
    free(c->buckets);
    c->buckets = b;
    c->nbuckets = nb;
}

static void lru_unlink(ctpu_cache *c, entry *e)
{
    if (e->lru_prev) e->lru_prev->lru_next = e->lru_next; else c->lru_head = e->lru_next;
    if (e->lru_next) e->lru_next->lru_prev = e->lru_prev; else c->lru_tail = e->lru_prev;
    e->lru_prev = e->lru_next = NULL;
}

static void lru_push_front(ctpu_cache *c, entry *e)
{
    e->lru_prev = NULL;
    e->lru_next = c->lru_head;
    if (c->lru_head) c->lru_head->lru_prev = e;
    c->lru_head = e;
    if (!c->lru_tail) c->lru_tail = e;
}

static void table_remove(ctpu_cache *c, entry *e)
{
    entry **pp = &c->buckets[e->hash & (c->nbuckets - 1)];
    while (*pp && *pp != e) pp = &(*pp)->next;
    if (*pp) *pp = e->next;
}

static uint64_t struct_hash_of(const ctpu_trace *t)
{
    /* the key without extents: shapes zeroed, everything else kept */
    size_t nv = (size_t)t->n_inputs + (size_t)t->n_nodes;
    ctpu_vtype *in = malloc(sizeof(ctpu_vtype) * ((size_t)t->n_inputs + 1));
    ctpu_node *nodes = malloc(sizeof(ctpu_node) * ((size_t)t->n_nodes + 1));
    uint8_t *buf = malloc(64 + nv * 256 + (size_t)t->n_outputs * 8);
    uint64_t h = 0;
    if (in && nodes && buf) {
        ctpu_trace s = *t;
        for (int i = 0; i < t->n_inputs; i++) { in[i] = t->in_type[i]; memset(in[i].shape, 0, sizeof in[i].shape); }
        for (int i = 0; i < t->n_nodes; i++) {
            nodes[i] = t->nodes[i];
            memset(nodes[i].out.shape, 0, sizeof nodes[i].out.shape);
            /* attrs holding extents (slice bounds) are part of the shape */
            memset(nodes[i].attr.i64, 0, sizeof nodes[i].attr.i64);
        }
        s.in_type = in;
        s.nodes = nodes;
        size_t len = ctpu_trace_key(&s, buf, 64 + nv * 256 + (size_t)t->n_outputs * 8);
        h = len ? ctpu_key_hash(buf, len) : 0;
    }
    free(in);
    free(nodes);
    free(buf);
    return h;
}

static void describe_diff(const entry *old, const ctpu_trace *t, const char *const *in_names, char *out, size_t len)
{
    snprintf(out, len, "structure matches program %llu; a value's extents changed",
             (unsigned long long)old->info.id);
    for (int i = 0; i < t->n_inputs && i < old->n_in; i++) {
        const ctpu_vtype *a = &old->types[i], *b = &t->in_type[i];
        for (int d = 0; d < a->ndim && d < b->ndim; d++)
            if (a->shape[d] != b->shape[d]) {
                const char *nm = in_names && in_names[i] && in_names[i][0] ? in_names[i] : NULL;
                snprintf(out, len, "input %d%s%.48s%s dim %d: %lld -> %lld", i, nm ? " (" : "", nm ? nm : "",
                         nm ? ")" : "", d, (long long)a->shape[d], (long long)b->shape[d]);
                return;
            }
    }
    for (int i = 0; i < t->n_nodes && i < old->n_nodes; i++) {
        const ctpu_vtype *a = &old->types[old->n_in + i], *b = &t->nodes[i].out;
        for (int d = 0; d < a->ndim && d < b->ndim; d++)
            if (a->shape[d] != b->shape[d]) {
                snprintf(out, len, "node %d (%s) dim %d: %lld -> %lld", i, ctpu_op_name(t->nodes[i].op), d,
                         (long long)a->shape[d], (long long)b->shape[d]);
                return;
            }
    }
}

/* ------------------------------------------------------------ find */
/* The entry of a key, or NULL; count: add colliding entries to the stats. */
static entry *table_find(ctpu_cache *c, uint64_t h, const uint8_t *key, size_t len, int *count)
{
    for (entry *e = c->buckets[h & (c->nbuckets - 1)]; e; e = e->next) {
        if (e->hash != h) continue;
        if (e->len == len && memcmp(e->key, key, len) == 0) return e;
        if (count) {
            c->st.collisions++;
            (*count)++;
        }
    }
    return NULL;
}

static bool pending_has(const ctpu_cache *c, uint64_t h, const uint8_t *key, size_t len)
{
    for (const ctpu_cache_pending *p = c->pending; p; p = p->next)
        if (p->hash == h && p->len == len && memcmp(p->key, key, len) == 0) return true;
    return false;
}

static void pending_unlink(ctpu_cache *c, ctpu_cache_pending *p)
{
    ctpu_cache_pending **pp = &c->pending;
    while (*pp && *pp != p) pp = &(*pp)->next;
    if (*pp) *pp = p->next;
}

ctpu_program *ctpu_cache_find(ctpu_cache *c, const uint8_t *key, size_t len, const ctpu_cache_opts *o,
                              ctpu_cache_result *res, const ctpu_launch_plan **plan, ctpu_cache_pending **miss,
                              char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    *miss = NULL;
    if (plan) *plan = NULL;
    uint64_t h = c->force_hash ? c->forced : ctpu_key_hash(key, len);
    pthread_mutex_lock(&c->mu);
    c->st.requests++;
    for (bool first = true;; first = false) {
        entry *e = table_find(c, h, key, len, first ? &res->collisions : NULL);
        if (e) {
            e->info.hits++;
            e->info.last_use = o ? o->step : 0;
            c->st.hits++;
            if (c->capacity && c->lru_head != e) { lru_unlink(c, e); lru_push_front(c, e); }
            res->hit = true;
            res->program_id = e->info.id;
            if (plan) *plan = e->plan;
            pthread_mutex_unlock(&c->mu);
            return e->prog;
        }
        /* another thread is compiling this key: wait for its program (or
         * for it to give up, then compile it here) */
        if (!pending_has(c, h, key, len)) break;
        pthread_cond_wait(&c->done, &c->mu);
    }
    c->st.misses++;
    if (o && !o->allow_compile) {
        pthread_mutex_unlock(&c->mu);
        snprintf(err, errlen, "cache-only mode: no compiled program for this trace (a miss after step %llu)",
                 (unsigned long long)o->step);
        res->refused = true;
        return NULL;
    }
    ctpu_cache_pending *p = malloc(sizeof *p);
    uint8_t *k = p ? malloc(len ? len : 1) : NULL;
    if (!k) {
        pthread_mutex_unlock(&c->mu);
        free(p);
        snprintf(err, errlen, "out of host memory for the program cache");
        return NULL;
    }
    memcpy(k, key, len);
    *p = (ctpu_cache_pending){ .next = c->pending, .hash = h, .len = len, .key = k };
    c->pending = p;
    pthread_mutex_unlock(&c->mu);
    *miss = p;
    return NULL;
}

void ctpu_cache_abandon(ctpu_cache *c, ctpu_cache_pending *p)
{
    if (!p) return;
    pthread_mutex_lock(&c->mu);
    pending_unlink(c, p);
    pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->mu);
    free(p->key);
    free(p);
}

void ctpu_cache_log_change(ctpu_cache *c, const ctpu_recompile_rec *rec)
{
    pthread_mutex_lock(&c->mu);
    c->log[c->n_log % RECOMPILE_LOG] = *rec;
    c->log[c->n_log % RECOMPILE_LOG].structure = true;
    c->n_log++;
    pthread_mutex_unlock(&c->mu);
}

void ctpu_cache_describe_miss(ctpu_cache *c, const ctpu_trace *t, const char *const *in_names, char *out, size_t len)
{
    uint64_t sh = struct_hash_of(t);
    pthread_mutex_lock(&c->mu);
    size_t n = c->count;
    const entry *same = NULL;
    for (const entry *e = c->lru_head; e && !same; e = e->lru_next)
        if (sh && e->struct_hash == sh) same = e;
    if (same) {
        char diff[160];
        describe_diff(same, t, in_names, diff, sizeof diff);
        snprintf(out, len, "%s, was program %llu", diff, (unsigned long long)same->info.id);
    } else {
        char ops[64];
        size_t k = 0;
        ops[0] = 0;
        for (int i = 0; i < t->n_nodes && i < 4 && k < sizeof ops; i++)
            k += (size_t)snprintf(ops + k, sizeof ops - k, "%s%s", i ? ">" : "", ctpu_op_name(t->nodes[i].op));
        snprintf(out, len, "no cached program has this structure (%d ops: %s%s; %zu programs cached)", t->n_nodes,
                 ops, t->n_nodes > 4 ? ">..." : "", n);
    }
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------ insert */
/* The entry for a compiled program, or NULL on out of memory. It takes the
 * pending miss's key (read-only while the miss is pending). */
static entry *entry_make(ctpu_cache_pending *p, const ctpu_trace *t, ctpu_program *prog,
                         ctpu_launch_plan *plan, uint64_t struct_hash)
{
    size_t nv = (size_t)t->n_inputs + (size_t)t->n_nodes;
    entry *e = calloc(1, sizeof *e);
    ctpu_vtype *types = e ? malloc(sizeof(ctpu_vtype) * (nv + 1)) : NULL;
    uint16_t *ops = types ? malloc(sizeof(uint16_t) * ((size_t)t->n_nodes + 1)) : NULL;
    if (!ops) {
        free(e);
        free(types);
        return NULL;
    }
    for (int i = 0; i < t->n_inputs; i++) types[i] = t->in_type[i];
    for (int i = 0; i < t->n_nodes; i++) { types[t->n_inputs + i] = t->nodes[i].out; ops[i] = t->nodes[i].op; }
    *e = (entry){ .hash = p->hash, .struct_hash = struct_hash, .len = p->len, .key = p->key, .prog = prog,
                  .plan = plan, .types = types, .ops = ops, .n_in = t->n_inputs, .n_nodes = t->n_nodes };
    e->info.compile_ns = prog->compile_ns;
    e->info.n_nodes = t->n_nodes;
    e->info.n_steps = prog->prog.n_steps;
    e->info.bytes = e->len + sizeof *e + nv * sizeof(ctpu_vtype) + (size_t)prog->n_mem * 64;
    return e;
}

/* Recompile? Thrash? (caches that track them): a key evicted before gets its
 * old program id back; a cached entry of the same structure gives the
 * reason. Returns the id to reuse, or 0. */
static uint64_t note_recompile(ctpu_cache *c, const entry *ne, const ctpu_trace *t, const ctpu_cache_opts *o,
                               ctpu_cache_result *res)
{
    uint64_t reuse_id = 0;
    size_t n = c->n_evicted < THRASH_RING ? c->n_evicted : THRASH_RING;
    for (size_t i = 0; i < n; i++)
        if (c->evicted[i] == ne->hash) {
            res->thrash = true;
            c->st.thrash++;
            reuse_id = c->evicted_id[i];   /* the same program again: the same id in reports */
            c->evicted[i] = 0;
            break;
        }
    for (entry *e = c->lru_head; e; e = e->lru_next) {
        if (e->struct_hash != ne->struct_hash) continue;
        res->recompile = true;
        describe_diff(e, t, o->in_names, res->reason, sizeof res->reason);
        c->st.recompiles++;
        ctpu_recompile_rec *r = &c->log[c->n_log % RECOMPILE_LOG];
        c->n_log++;
        memset(r, 0, sizeof *r);
        r->step = o->step;
        r->old_program = e->info.id;
        r->new_program = reuse_id ? reuse_id : c->next_id;
        snprintf(r->reason, sizeof r->reason, "%s", res->reason);
        break;
    }
    return reuse_id;
}

/* Bounded: unlink entries from the LRU tail (never e); returns them chained
 * by lru_next, to free once no command can still run them. */
static entry *evict_over_capacity(ctpu_cache *c, const entry *e, ctpu_cache_result *res)
{
    entry *victims = NULL;
    while (c->capacity && c->count > c->capacity && c->lru_tail && c->lru_tail != e) {
        entry *v = c->lru_tail;
        lru_unlink(c, v);
        table_remove(c, v);
        c->evicted_id[c->n_evicted % THRASH_RING] = v->info.id;
        c->evicted[c->n_evicted++ % THRASH_RING] = v->hash;
        c->count--;
        c->st.evictions++;
        res->evicted++;
        v->lru_next = victims;
        victims = v;
    }
    return victims;
}

ctpu_program *ctpu_cache_insert(ctpu_cache *c, ctpu_cache_pending *p, const ctpu_trace *t, ctpu_program *prog,
                                ctpu_launch_plan *plan, const ctpu_cache_opts *o, ctpu_cache_result *res,
                                char *err, size_t errlen)
{
    bool track = o && o->track_recompiles;
    entry *e = entry_make(p, t, prog, plan, track ? struct_hash_of(t) : 0);
    if (!e) {
        ctpu_program_free(prog);
        free(plan);
        ctpu_cache_abandon(c, p);
        snprintf(err, errlen, "out of host memory for the program cache");
        return NULL;
    }
    pthread_mutex_lock(&c->mu);
    uint64_t reuse_id = track ? note_recompile(c, e, t, o, res) : 0;
    e->info.id = reuse_id ? reuse_id : c->next_id++;
    e->info.last_use = o ? o->step : 0;
    e->info.first_use = e->info.last_use;
    entry **slot = &c->buckets[e->hash & (c->nbuckets - 1)];
    e->next = *slot;
    *slot = e;
    lru_push_front(c, e);
    c->st.compiles++;
    res->program_id = e->info.id;
    if (++c->count > c->nbuckets * 3 / 4) grow(c);
    entry *victims = evict_over_capacity(c, e, res);
    pending_unlink(c, p);
    pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->mu);
    free(p);                              /* its key is the entry's now */
    if (victims && o && o->dev) ctpu_device_wait(o->dev, 0);   /* no command may still run them */
    for (entry *v = victims, *n; v; v = n) {
        n = v->lru_next;
        entry_free(v);
    }
    return prog;
}

ctpu_program *ctpu_cache_get(ctpu_cache *c, const uint8_t *key, size_t len, const ctpu_trace *t,
                             bool *hit, int *collisions, char *err, size_t errlen)
{
    ctpu_cache_result r;
    ctpu_cache_pending *miss;
    ctpu_program *p = ctpu_cache_find(c, key, len, NULL, &r, NULL, &miss, err, errlen);
    *hit = r.hit;
    if (collisions) *collisions = r.collisions;
    if (!miss) return p;
    p = ctpu_fuse_compile(t, err, errlen);   /* outside the cache lock */
    if (!p) {
        ctpu_cache_abandon(c, miss);
        return NULL;
    }
    return ctpu_cache_insert(c, miss, t, p, NULL, NULL, &r, err, errlen);
}

size_t ctpu_cache_entries(ctpu_cache *c)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->count;
    pthread_mutex_unlock(&c->mu);
    return n;
}

uint64_t ctpu_cache_collisions(ctpu_cache *c)
{
    pthread_mutex_lock(&c->mu);
    uint64_t n = c->st.collisions;
    pthread_mutex_unlock(&c->mu);
    return n;
}

void ctpu_cache_get_stats(ctpu_cache *c, ctpu_cache_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    out->entries = c->count;
    out->capacity = c->capacity;
    pthread_mutex_unlock(&c->mu);
}

void ctpu_cache_force_hash(ctpu_cache *c, bool on, uint64_t value)
{
    pthread_mutex_lock(&c->mu);
    c->force_hash = on;
    c->forced = value;
    pthread_mutex_unlock(&c->mu);
}

size_t ctpu_cache_entries_info(ctpu_cache *c, ctpu_cache_entry_info *out, size_t max)
{
    pthread_mutex_lock(&c->mu);
    size_t n = 0;
    for (entry *e = c->lru_head; e && n < max; e = e->lru_next) {
        out[n] = e->info;
        size_t k = 0;
        out[n].summary[0] = 0;
        for (int i = 0; i < e->n_nodes && i < 4 && k < sizeof out[n].summary; i++)
            k += (size_t)snprintf(out[n].summary + k, sizeof out[n].summary - k, "%s%s", i ? ">" : "",
                                  ctpu_op_name(e->ops[i]));
        if (e->n_nodes > 4 && k < sizeof out[n].summary) snprintf(out[n].summary + k, sizeof out[n].summary - k, ">...");
        n++;
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

size_t ctpu_cache_recompiles(ctpu_cache *c, ctpu_recompile_rec *out, size_t max)
{
    pthread_mutex_lock(&c->mu);
    size_t total = c->n_log < RECOMPILE_LOG ? c->n_log : RECOMPILE_LOG;
    size_t start = c->n_log - total, n = 0;
    for (size_t i = 0; i < total && n < max; i++) out[n++] = c->log[(start + i) % RECOMPILE_LOG];
    pthread_mutex_unlock(&c->mu);
    return n;
}
