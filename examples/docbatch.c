/* --by-document batches: see docbatch.h. */
#include "docbatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t docbatch_splitmix64(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t draw(uint64_t k, uint64_t i) { return docbatch_splitmix64(k + 0x9E3779B97F4A7C15ull * (1 + i)); }

static void shuffle(int64_t *a, int64_t n, uint64_t k)
{
    for (int64_t i = n - 1; i >= 1; i--) {
        int64_t j = (int64_t)(draw(k, (uint64_t)(n - 1 - i)) % (uint64_t)(i + 1));
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

static uint64_t key(uint64_t seed, int m, const uint64_t *v)
{
    uint64_t k = seed;
    for (int i = 0; i < m; i++) k = docbatch_splitmix64(k + v[i]);
    return k;
}

int docbatch_init(docbatch *d, const int32_t *tok, const int64_t *doc, int64_t n_docs, int64_t batch, int64_t ctx,
                  uint64_t seed, uint64_t stream, char *err, int errlen)
{
    memset(d, 0, sizeof *d);
    d->tok = tok, d->batch = batch, d->ctx = ctx, d->seed = seed, d->stream = stream;
    d->epoch = d->pool = -1;
    d->start = malloc(sizeof(int64_t) * (size_t)(n_docs ? n_docs : 1));
    d->len = malloc(sizeof(int64_t) * (size_t)(n_docs ? n_docs : 1));
    d->perm = malloc(sizeof(int64_t) * (size_t)(n_docs ? n_docs : 1));
    d->sorted = malloc(sizeof(int64_t) * (size_t)(DOCBATCH_POOL_BATCHES * batch));
    d->order = malloc(sizeof(int64_t) * DOCBATCH_POOL_BATCHES);
    if (!d->start || !d->len || !d->perm || !d->sorted || !d->order) {
        docbatch_free(d);
        snprintf(err, (size_t)errlen, "by-document batches: out of memory");
        return -1;
    }
    for (int64_t i = 0; i < n_docs; i++) {
        int64_t n = doc[i + 1] - doc[i], t = (n < ctx + 1 ? n : ctx + 1) - 1;
        if (t < 1) continue;
        d->start[d->n] = doc[i];
        d->len[d->n++] = t;
    }
    if (d->n < batch) {
        snprintf(err, (size_t)errlen, "by-document batches: %lld documents of 2 or more tokens, fewer than --batch %lld",
                 (long long)d->n, (long long)batch);
        docbatch_free(d);
        return -1;
    }
    d->nb = d->n / batch;
    return 0;
}

static const docbatch *sort_ctx;   /* qsort has no context argument; single-threaded use */

static int by_len(const void *a, const void *b)
{
    int64_t i = *(const int64_t *)a, j = *(const int64_t *)b;   /* shuffled positions */
    int64_t li = sort_ctx->len[sort_ctx->perm[i]], lj = sort_ctx->len[sort_ctx->perm[j]];
    if (li != lj) return li < lj ? -1 : 1;
    return i < j ? -1 : i > j;
}

int64_t docbatch_get(docbatch *d, int64_t step, int32_t *x, int32_t *y, int64_t *T)
{
    int64_t e = step / d->nb, r = step % d->nb, k = r / DOCBATCH_POOL_BATCHES;
    if (e != d->epoch) {
        for (int64_t i = 0; i < d->n; i++) d->perm[i] = i;
        shuffle(d->perm, d->n, key(d->seed, 2, (uint64_t[]){ d->stream, (uint64_t)e }));
        d->epoch = e;
        d->pool = -1;
    }
    if (k != d->pool) {
        int64_t lo = k * DOCBATCH_POOL_BATCHES * d->batch, hi = lo + DOCBATCH_POOL_BATCHES * d->batch;
        if (hi > d->nb * d->batch) hi = d->nb * d->batch;
        for (int64_t i = lo; i < hi; i++) d->sorted[i - lo] = i;
        sort_ctx = d;
        qsort(d->sorted, (size_t)(hi - lo), sizeof(int64_t), by_len);
        for (int64_t i = 0; i < hi - lo; i++) d->sorted[i] = d->perm[d->sorted[i]];   /* positions -> documents */
        d->pool_batches = (hi - lo) / d->batch;
        for (int64_t i = 0; i < d->pool_batches; i++) d->order[i] = i;
        shuffle(d->order, d->pool_batches, key(d->seed, 3, (uint64_t[]){ d->stream, (uint64_t)e, 1 + (uint64_t)k }));
        d->pool = k;
    }
    const int64_t *docs = d->sorted + d->order[r % DOCBATCH_POOL_BATCHES] * d->batch;
    int64_t t = 2, real = 0;
    for (int64_t b = 0; b < d->batch; b++)
        if (d->len[docs[b]] > t) t = d->len[docs[b]];
    for (int64_t b = 0; b < d->batch; b++) {
        int64_t n = d->len[docs[b]];
        const int32_t *p = d->tok + d->start[docs[b]];
        for (int64_t i = 0; i < t; i++) {
            x[b * t + i] = i < n ? p[i] : DOCBATCH_PAD_ID;
            y[b * t + i] = i < n ? p[i + 1] : DOCBATCH_IGNORE;
        }
        real += n;
    }
    *T = t;
    return real;
}

void docbatch_free(docbatch *d)
{
    free(d->start);
    free(d->len);
    free(d->perm);
    free(d->sorted);
    free(d->order);
    memset(d, 0, sizeof *d);
}
