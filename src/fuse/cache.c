/* Program caches keyed by the canonical key (DESIGN.md "Cache"): a hash
 * table with a full-key compare on hit, an LRU list bounded by capacity
 * (0 = unbounded), per-entry counters, recompile reasons (a miss whose
 * structural key matches a cached entry), evictions and thrash (a key
 * compiled again after its eviction), the recompile limit (per structure,
 * the distinct keys it compiled), and programs' lifetime past eviction
 * (orphans, fuse.h).
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
    ctpu_program *prog;           /* the entry's reference; prog->plan: how a recorded trace binds to it */
    struct entry *next;           /* bucket chain */
    struct entry *lru_prev, *lru_next;
    ctpu_cache_entry_info info;
    ctpu_vtype *types;            /* inputs then node outputs, for recompile diffs */
    uint16_t *ops;                /* node ops */
    int n_in, n_nodes;
} entry;

#define THRASH_RING 4096
#define RECOMPILE_LOG 64
#define SHAPE_HISTORY_MAX 65536   /* extents kept per structure for the limit's message */

/* A program structure (the key without extents) over the cache's lifetime:
 * the distinct keys it compiled (up to the limit) and the extents of the
 * last two, for the recompile limit's message. */
typedef struct srec {
    struct srec *next;
    uint64_t struct_hash;
    uint64_t first_id;            /* its first program */
    uint32_t n_keys;
    bool warned;
    uint64_t *keys;               /* [limit] key hashes */
    int64_t *ext[2];              /* [n_ext] extents, ext[0] the newest (NULL: none) */
    size_t n_ext;
} srec;

/* A miss one thread is compiling; others missing the same key wait for it
 * (`done` is broadcast when it is inserted or abandoned). */
struct ctpu_cache_pending {
    struct ctpu_cache_pending *next;
    uint64_t hash;
    size_t len;
    uint8_t *key;
};

/* A bound alias (fuse.h ctpu_cache_alias_add): tick 0 = free. */
typedef struct {
    uint64_t hash, sig, tick;
    size_t len;
    uint8_t *key;
    struct entry *e;              /* the dynamic program's entry */
    ctpu_program *bound;          /* the alias's reference */
} alias;

struct ctpu_cache {
    pthread_mutex_t mu;
    alias aliases[CTPU_CACHE_ALIASES];
    uint64_t alias_tick;
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
    ctpu_device *dev;
    ctpu_program *orphans;        /* evicted, freed once unreferenced and run */
    size_t n_orphans;
    size_t limit;                 /* recompile limit, 0 = none */
    srec *structs[256];           /* by struct hash */
};

ctpu_cache *ctpu_cache_create(size_t capacity, size_t recompile_limit)
{
    ctpu_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->nbuckets = 256;
    c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
    if (!c->buckets) { free(c); return NULL; }
    c->capacity = capacity;
    c->limit = recompile_limit;
    c->next_id = 1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->done, NULL);
    return c;
}

void ctpu_cache_set_device(ctpu_cache *c, ctpu_device *dev) { c->dev = dev; }

static void prog_free(ctpu_program *p)
{
    free(p->plan);
    ctpu_program_free(p);
}

/* The entry without its program (freed or orphaned by the caller). */
static void entry_free(entry *e)
{
    free(e->key);
    free(e->types);
    free(e->ops);
    free(e);
}

void ctpu_cache_release(ctpu_cache *c, ctpu_program *p)
{
    (void)c;   /* an orphan is freed by the next eviction's sweep (or destroy) */
    if (p) atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel);
}

/* Orphans nobody holds whose last command has run, unlinked (under c->mu)
 * and returned chained, to free outside the lock. */
static ctpu_program *orphans_take_done(ctpu_cache *c)
{
    uint64_t done = c->dev ? ctpu_device_done_seq(c->dev) : UINT64_MAX;
    ctpu_program *freed = NULL, **pp = &c->orphans;
    while (*pp) {
        ctpu_program *p = *pp;
        if (atomic_load_explicit(&p->refs, memory_order_acquire) == 0 && atomic_load(&p->last_seq) <= done) {
            *pp = p->orphan_next;
            c->n_orphans--;
            p->orphan_next = freed;
            freed = p;
        } else {
            pp = &p->orphan_next;
        }
    }
    return freed;
}

static void progs_free_chain(ctpu_program *p)
{
    for (ctpu_program *n; p; p = n) {
        n = p->orphan_next;
        prog_free(p);
    }
}

void ctpu_cache_destroy(ctpu_cache *c)
{
    if (!c) return;
    for (int i = 0; i < CTPU_CACHE_ALIASES; i++) free(c->aliases[i].key);   /* the programs go below */
    for (entry *e = c->lru_head, *n; e; e = n) {
        n = e->lru_next;
        prog_free(e->prog);
        entry_free(e);
    }
    progs_free_chain(c->orphans);
    for (size_t i = 0; i < sizeof c->structs / sizeof c->structs[0]; i++)
        for (srec *r = c->structs[i], *n; r; r = n) {
            n = r->next;
            free(r->keys);
            free(r->ext[0]);
            free(r->ext[1]);
            free(r);
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

uint64_t ctpu_trace_struct_hash(const ctpu_trace *t) { return struct_hash_of(t); }

/* "input 0 (x, op #3, \"blk\"): dim 0: 128 -> 96": the canonical input's
 * name and the op (number, label) of this recording that reads it first;
 * without either, "input 0 dim 0: ...". */
static void describe_diff(const entry *old, const ctpu_trace *t, const ctpu_diff_names *dn, char *out, size_t len)
{
    snprintf(out, len, "structure matches program %llu; a value's extents changed",
             (unsigned long long)old->info.id);
    for (int i = 0; i < t->n_inputs && i < old->n_in; i++) {
        const ctpu_vtype *a = &old->types[i], *b = &t->in_type[i];
        for (int d = 0; d < a->ndim && d < b->ndim; d++)
            if (a->shape[d] != b->shape[d]) {
                const char *nm = dn && dn->in_names && dn->in_names[i] && dn->in_names[i][0] ? dn->in_names[i] : NULL;
                const char *pv = dn && dn->in_prov && dn->in_prov[i] && dn->in_prov[i][0] ? dn->in_prov[i] : NULL;
                if (pv)
                    snprintf(out, len, "input %d (%.48s%s%.80s): dim %d: %lld -> %lld", i, nm ? nm : "", nm ? ", " : "",
                             pv, d, (long long)a->shape[d], (long long)b->shape[d]);
                else
                    snprintf(out, len, "input %d%s%.48s%s dim %d: %lld -> %lld", i, nm ? " (" : "", nm ? nm : "",
                             nm ? ")" : "", d, (long long)a->shape[d], (long long)b->shape[d]);
                return;
            }
    }
    for (int i = 0; i < t->n_nodes && i < old->n_nodes; i++) {
        const ctpu_vtype *a = &old->types[old->n_in + i], *b = &t->nodes[i].out;
        for (int d = 0; d < a->ndim && d < b->ndim; d++)
            if (a->shape[d] != b->shape[d]) {
                const char *pv = dn && dn->node_prov && dn->node_prov[i] && dn->node_prov[i][0] ? dn->node_prov[i] : NULL;
                snprintf(out, len, "node %d (%s%s%.80s)%s dim %d: %lld -> %lld", i, ctpu_op_name(t->nodes[i].op),
                         pv ? ", " : "", pv ? pv : "", pv ? ":" : "", d, (long long)a->shape[d], (long long)b->shape[d]);
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
    return ctpu_cache_find_hashed(c, key, len, c->force_hash ? 0 : ctpu_key_hash(key, len), o, res, plan, miss, err,
                                  errlen);
}

/* A hit on e (c->mu held; requests counted by the caller): its counts, its
 * LRU place, the result, and the program retained for the caller (read under
 * the lock: once it is released, another thread's insert may evict and free e). */
static ctpu_program *take_hit(ctpu_cache *c, entry *e, const ctpu_cache_opts *o, ctpu_cache_result *res,
                              const ctpu_launch_plan **plan)
{
    e->info.hits++;
    e->info.last_use = o ? o->step : 0;
    c->st.hits++;
    if (c->capacity && c->lru_head != e) { lru_unlink(c, e); lru_push_front(c, e); }
    res->hit = true;
    res->program_id = e->info.id;
    if (plan) *plan = e->prog->plan;
    ctpu_program_retain(e->prog);   /* the caller's, until it has submitted */
    return e->prog;
}

ctpu_program *ctpu_cache_find_hashed(ctpu_cache *c, const uint8_t *key, size_t len, uint64_t hash,
                                     const ctpu_cache_opts *o, ctpu_cache_result *res, const ctpu_launch_plan **plan,
                                     ctpu_cache_pending **miss, char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    *miss = NULL;
    if (plan) *plan = NULL;
    uint64_t h = c->force_hash ? c->forced : hash;
    pthread_mutex_lock(&c->mu);
    c->st.requests++;
    for (bool first = true;; first = false) {
        entry *e = table_find(c, h, key, len, first ? &res->collisions : NULL);
        if (e) {
            ctpu_program *prog = take_hit(c, e, o, res, plan);
            pthread_mutex_unlock(&c->mu);
            return prog;
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

ctpu_program *ctpu_cache_peek(ctpu_cache *c, const uint8_t *key, size_t len, const ctpu_cache_opts *o,
                              ctpu_cache_result *res, const ctpu_launch_plan **plan)
{
    return ctpu_cache_peek_hashed(c, key, len, c->force_hash ? 0 : ctpu_key_hash(key, len), o, res, plan);
}

ctpu_program *ctpu_cache_peek_hashed(ctpu_cache *c, const uint8_t *key, size_t len, uint64_t hash,
                                     const ctpu_cache_opts *o, ctpu_cache_result *res, const ctpu_launch_plan **plan)
{
    memset(res, 0, sizeof *res);
    *plan = NULL;
    uint64_t h = c->force_hash ? c->forced : hash;
    pthread_mutex_lock(&c->mu);
    entry *e = table_find(c, h, key, len, NULL);
    ctpu_program *prog = NULL;
    if (e) {
        c->st.requests++;
        prog = take_hit(c, e, o, res, plan);
    }
    pthread_mutex_unlock(&c->mu);
    return prog;
}

void ctpu_cache_orphan(ctpu_cache *c, ctpu_program *p)
{
    pthread_mutex_lock(&c->mu);
    p->orphan_next = c->orphans;
    c->orphans = p;
    c->n_orphans++;
    atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel);
    ctpu_program *freed = orphans_take_done(c);
    pthread_mutex_unlock(&c->mu);
    progs_free_chain(freed);
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

void ctpu_cache_describe_miss(ctpu_cache *c, const ctpu_trace *t, const ctpu_diff_names *dn, char *out, size_t len)
{
    uint64_t sh = struct_hash_of(t);
    pthread_mutex_lock(&c->mu);
    size_t n = c->count;
    const entry *same = NULL;
    for (const entry *e = c->lru_head; e && !same; e = e->lru_next)
        if (sh && e->struct_hash == sh) same = e;
    if (same) {
        char diff[160];
        describe_diff(same, t, dn, diff, sizeof diff);
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
    prog->plan = plan;
    *e = (entry){ .hash = p->hash, .struct_hash = struct_hash, .len = p->len, .key = p->key, .prog = prog,
                  .types = types, .ops = ops, .n_in = t->n_inputs, .n_nodes = t->n_nodes };
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
        if (o->reason) snprintf(res->reason, sizeof res->reason, "%s", o->reason);
        else describe_diff(e, t, &o->names, res->reason, sizeof res->reason);
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

/* ------------------------------------------------------------ recompile limit */
/* The record of structure sh (under c->mu), made if asked; NULL if not
 * found (or out of memory). */
static srec *struct_find(ctpu_cache *c, uint64_t sh, bool make)
{
    srec **b = &c->structs[sh % (sizeof c->structs / sizeof c->structs[0])];
    for (srec *r = *b; r; r = r->next)
        if (r->struct_hash == sh) return r;
    if (!make) return NULL;
    srec *r = calloc(1, sizeof *r);
    uint64_t *keys = r ? calloc(c->limit, sizeof *keys) : NULL;
    if (!keys) { free(r); return NULL; }
    r->struct_hash = sh;
    r->keys = keys;
    r->next = *b;
    *b = r;
    return r;
}

static void struct_note_program(ctpu_cache *c, const entry *e)
{
    srec *r = c->limit && e->struct_hash ? struct_find(c, e->struct_hash, false) : NULL;
    if (r && !r->first_id) r->first_id = e->info.id;
}

/* Every extent of t's values in order (inputs, then node outputs); n_ext 0
 * past SHAPE_HISTORY_MAX. */
static int64_t *extents_of(const ctpu_trace *t, size_t *n_ext)
{
    size_t n = 0;
    for (int i = 0; i < t->n_inputs; i++) n += t->in_type[i].ndim;
    for (int i = 0; i < t->n_nodes; i++) n += t->nodes[i].out.ndim;
    *n_ext = 0;
    int64_t *x = n && n <= SHAPE_HISTORY_MAX ? malloc(n * sizeof *x) : NULL;
    if (!x) return NULL;
    size_t k = 0;
    for (int i = 0; i < t->n_inputs; i++)
        for (int d = 0; d < t->in_type[i].ndim; d++) x[k++] = t->in_type[i].shape[d];
    for (int i = 0; i < t->n_nodes; i++)
        for (int d = 0; d < t->nodes[i].out.ndim; d++) x[k++] = t->nodes[i].out.shape[d];
    *n_ext = n;
    return x;
}

/* The dim of extent position k in t's value order. */
static int dim_at(const ctpu_trace *t, size_t k)
{
    for (int i = 0; i < t->n_inputs; i++) {
        if (k < t->in_type[i].ndim) return (int)k;
        k -= t->in_type[i].ndim;
    }
    for (int i = 0; i < t->n_nodes; i++) {
        if (k < t->nodes[i].out.ndim) return (int)k;
        k -= t->nodes[i].out.ndim;
    }
    return -1;
}

/* "program 2 (rand_normal→relu→sum) passed TORCH_TPU_RECOMPILE_LIMIT=8:
 * dim 0 varies: 7 -> 8 -> 9" */
static void limit_message(const ctpu_cache *c, const srec *r, const ctpu_trace *t, const char *where,
                          const int64_t *now, size_t n_ext, char *msg, size_t len)
{
    char ops[160];
    size_t k = 0;
    ops[0] = 0;
    for (int i = 0; i < t->n_nodes && i < 6 && k < sizeof ops; i++)
        k += (size_t)snprintf(ops + k, sizeof ops - k, "%s%s", i ? "\u2192" : "", ctpu_op_name(t->nodes[i].op));
    if (t->n_nodes > 6 && k < sizeof ops) snprintf(ops + k, sizeof ops - k, "\u2192\u2026 (%d ops)", t->n_nodes);
    char prog[32] = "a program";
    if (r->first_id) snprintf(prog, sizeof prog, "program %llu", (unsigned long long)r->first_id);
    char vary[96] = "its extents vary";
    if (now && r->ext[0] && r->n_ext == n_ext) {
        for (size_t i = 0; i < n_ext; i++) {
            if (now[i] == r->ext[0][i]) continue;
            int o = 0;
            o += snprintf(vary + o, sizeof vary - (size_t)o, "dim %d varies: ", dim_at(t, i));
            if (r->ext[1] && r->ext[1][i] != r->ext[0][i]) o += snprintf(vary + o, sizeof vary - (size_t)o, "%lld -> ", (long long)r->ext[1][i]);
            snprintf(vary + o, sizeof vary - (size_t)o, "%lld -> %lld", (long long)r->ext[0][i], (long long)now[i]);
            break;
        }
    }
    snprintf(msg, len, "%s (%s%s%.80s%s) passed TORCH_TPU_RECOMPILE_LIMIT=%zu: %s", prog, ops,
             where && where[0] ? ", from \"" : "", where ? where : "", where && where[0] ? "\"" : "", c->limit, vary);
}

bool ctpu_cache_shape_allowed(ctpu_cache *c, const ctpu_cache_pending *miss, const ctpu_trace *t, const char *where,
                              bool *first, char *msg, size_t len)
{
    *first = false;
    if (!c->limit) return true;
    uint64_t sh = struct_hash_of(t);
    if (!sh) return true;
    size_t n_ext;
    int64_t *now = extents_of(t, &n_ext);
    bool ok = true;
    pthread_mutex_lock(&c->mu);
    srec *r = struct_find(c, sh, true);
    if (r) {
        bool known = false;
        for (uint32_t i = 0; i < r->n_keys && !known; i++) known = r->keys[i] == miss->hash;
        if (!known && r->n_keys < c->limit) {
            r->keys[r->n_keys++] = miss->hash;
            known = true;
        } else if (!known) {
            ok = false;
            c->st.limit_fallbacks++;
            if (!r->warned) {
                r->warned = *first = true;
                limit_message(c, r, t, where, now, n_ext, msg, len);
                free(r->ext[0]);                  /* no further message needs them */
                free(r->ext[1]);
                r->ext[0] = r->ext[1] = NULL;
            }
        }
        if (known && !r->warned && now) {          /* the newest shape first */
            free(r->ext[1]);
            r->ext[1] = r->ext[0];
            r->ext[0] = now;
            r->n_ext = n_ext;
            now = NULL;
        }
    }
    pthread_mutex_unlock(&c->mu);
    free(now);
    return ok;
}

/* ------------------------------------------------------------ bound aliases */
static void alias_clear(alias *a)
{
    free(a->key);
    if (a->bound) atomic_fetch_sub_explicit(&a->bound->refs, 1, memory_order_acq_rel);   /* kept by its program */
    *a = (alias){ 0 };
}

/* The aliases of entry e (its program leaves the table), under c->mu: the
 * bound launches stay with the program (or are orphans already). */
static void aliases_drop(ctpu_cache *c, const entry *e)
{
    for (int i = 0; i < CTPU_CACHE_ALIASES; i++)
        if (c->aliases[i].tick && c->aliases[i].e == e) alias_clear(&c->aliases[i]);
}

static alias *alias_find(ctpu_cache *c, const uint8_t *key, size_t len, uint64_t hash, uint64_t sig)
{
    for (int i = 0; i < CTPU_CACHE_ALIASES; i++) {
        alias *a = &c->aliases[i];
        if (a->tick && a->hash == hash && a->sig == sig && a->len == len && memcmp(a->key, key, len) == 0) return a;
    }
    return NULL;
}

void ctpu_cache_alias_add(ctpu_cache *c, const uint8_t *key, size_t len, uint64_t hash, uint64_t sig,
                          ctpu_program *prog, ctpu_program *bound)
{
    uint8_t *k = malloc(len ? len : 1);
    if (!k) return;   /* out of memory: no alias, the next launch binds through the dynamic key */
    memcpy(k, key, len);
    pthread_mutex_lock(&c->mu);
    entry *e = NULL;
    for (entry *x = c->lru_head; x && !e; x = x->lru_next)
        if (x->prog == prog) e = x;
    alias *a = e ? alias_find(c, key, len, hash, sig) : NULL;
    if (e && !a) {
        a = &c->aliases[0];
        for (int i = 1; i < CTPU_CACHE_ALIASES && a->tick; i++)
            if (c->aliases[i].tick < a->tick) a = &c->aliases[i];
    }
    if (a) {
        alias_clear(a);
        ctpu_program_retain(bound);
        *a = (alias){ .hash = hash, .sig = sig, .tick = ++c->alias_tick, .len = len, .key = k, .e = e, .bound = bound };
        k = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    free(k);
}

ctpu_program *ctpu_cache_peek_alias(ctpu_cache *c, const uint8_t *key, size_t len, uint64_t hash, uint64_t sig,
                                    const ctpu_cache_opts *o, ctpu_cache_result *res, const ctpu_launch_plan **plan,
                                    ctpu_program **bound)
{
    memset(res, 0, sizeof *res);
    *plan = NULL;
    *bound = NULL;
    pthread_mutex_lock(&c->mu);
    alias *a = alias_find(c, key, len, hash, sig);
    if (a && !ctpu_fuse_bound_touch(a->e->prog, a->bound)) {   /* its program let the launch go */
        alias_clear(a);
        a = NULL;
    }
    ctpu_program *prog = NULL;
    if (a) {
        a->tick = ++c->alias_tick;
        c->st.requests++;
        prog = take_hit(c, a->e, o, res, plan);
        ctpu_program_retain(a->bound);
        *bound = a->bound;
    }
    pthread_mutex_unlock(&c->mu);
    return prog;
}

/* Bounded: unlink entries from the LRU tail (never e), their programs
 * orphaned (the entry's reference dropped); returns the entries chained by
 * lru_next, to free outside the lock. */
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
        aliases_drop(c, v);
        v->prog->orphan_next = c->orphans;
        c->orphans = v->prog;
        c->n_orphans++;
        atomic_fetch_sub_explicit(&v->prog->refs, 1, memory_order_acq_rel);
        v->prog = NULL;
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
    if (track) struct_note_program(c, e);
    if (++c->count > c->nbuckets * 3 / 4) grow(c);
    ctpu_program_retain(prog);            /* the caller's; the compiler's is the entry's */
    entry *victims = evict_over_capacity(c, e, res);
    ctpu_program *freed = c->orphans ? orphans_take_done(c) : NULL;
    pending_unlink(c, p);
    pthread_cond_broadcast(&c->done);
    pthread_mutex_unlock(&c->mu);
    free(p);                              /* its key is the entry's now */
    for (entry *v = victims, *n; v; v = n) {
        n = v->lru_next;
        entry_free(v);
    }
    progs_free_chain(freed);
    return prog;
}

ctpu_program *ctpu_cache_get(ctpu_cache *c, const uint8_t *key, size_t len, const ctpu_trace *t,
                             ctpu_cache_result *res, char *err, size_t errlen)
{
    ctpu_cache_pending *miss;
    ctpu_program *p = ctpu_cache_find(c, key, len, NULL, res, NULL, &miss, err, errlen);
    if (!miss) return p;
    p = ctpu_fuse_compile(t, err, errlen);   /* outside the cache lock */
    if (!p) {
        ctpu_cache_abandon(c, miss);
        return NULL;
    }
    int coll = res->collisions;
    p = ctpu_cache_insert(c, miss, t, p, NULL, NULL, res, err, errlen);
    res->collisions = coll;
    return p;
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
    out->orphans = c->n_orphans;
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
