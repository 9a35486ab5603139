/* Program cache: hash table keyed by the canonical key (full compare on hit). */
#include <stdlib.h>
#include <string.h>

#include "fuse.h"

typedef struct entry {
    uint64_t hash;
    size_t len;
    uint8_t *key;
    ctpu_compiled *prog;
    struct entry *next;
} entry;

struct ctpu_cache {
    pthread_mutex_t mu;
    entry **buckets;
    size_t nbuckets, count, capacity;
    uint64_t collisions;
    bool force_hash;
    uint64_t forced;
};

ctpu_cache *ctpu_cache_create(size_t capacity)
{
    ctpu_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->nbuckets = 256;
    c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
    if (!c->buckets) { free(c); return NULL; }
    c->capacity = capacity;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void ctpu_cache_destroy(ctpu_cache *c)
{
    if (!c) return;
    for (size_t i = 0; i < c->nbuckets; i++) {
        for (entry *e = c->buckets[i], *n; e; e = n) {
            n = e->next;
            ctpu_compiled_free(e->prog);
            free(e->key);
            free(e);
        }
    }
    free(c->buckets);
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

ctpu_compiled *ctpu_cache_get(ctpu_cache *c, const uint8_t *key, size_t len, const ctpu_trace *t,
                              bool *hit, char *err, size_t errlen)
{
    uint64_t h = c->force_hash ? c->forced : ctpu_key_hash(key, len);
    pthread_mutex_lock(&c->mu);
    entry **slot = &c->buckets[h & (c->nbuckets - 1)];
    for (entry *e = *slot; e; e = e->next) {
        if (e->hash != h) continue;
        if (e->len == len && memcmp(e->key, key, len) == 0) {
            e->prog->hits++;
            pthread_mutex_unlock(&c->mu);
            *hit = true;
            return e->prog;
        }
        c->collisions++;
    }
    *hit = false;
    ctpu_compiled *p = ctpu_compile(t, err, errlen);
    entry *e = p ? malloc(sizeof *e) : NULL;
    uint8_t *k = e ? malloc(len) : NULL;
    if (!k) {
        free(e);
        ctpu_compiled_free(p);
        pthread_mutex_unlock(&c->mu);
        if (p) snprintf(err, errlen, "out of host memory for the program cache");
        return NULL;
    }
    memcpy(k, key, len);
    *e = (entry){ h, len, k, p, *slot };
    *slot = e;
    if (++c->count > c->nbuckets * 3 / 4) grow(c);
    pthread_mutex_unlock(&c->mu);
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
    uint64_t n = c->collisions;
    pthread_mutex_unlock(&c->mu);
    return n;
}

void ctpu_cache_force_hash(ctpu_cache *c, bool on, uint64_t value)
{
    pthread_mutex_lock(&c->mu);
    c->force_hash = on;
    c->forced = value;
    pthread_mutex_unlock(&c->mu);
}
