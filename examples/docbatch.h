/* --by-document batches for the char-level GPT demo (examples/char_gpt.c,
 * issue 14): variable-length batches of whole documents, as real
 * variable-length data gives. bench/torch_gpt.py implements the same rules.
 *
 * Documents: a split's fortunes (corpus.h offsets), each truncated to its
 * first ctx + 1 tokens: a document of n tokens has t = min(n, ctx + 1) - 1
 * positions, inputs x = doc[0, t) and next-token targets y = doc[1, t + 1).
 * Documents with t < 1 (a single byte) are left out; N = the rest.
 *
 * Generator: u(k, i) = splitmix64(k + 0x9E3779B97F4A7C15 * (1 + i)) (the
 * finaliser of char_gpt.c's sampler, uint64 arithmetic). Shuffling a[0, n)
 * with key k is Fisher-Yates: for i = n - 1 down to 1, with draw number
 * d = n - 1 - i, j = u(k, d) % (i + 1), swap a[i] and a[j]. Keys are chains:
 * key(v1, ..., vm) = fold k = seed, then k = splitmix64(k + v) for each v.
 *
 * Stream s (1: training, 2: validation), epoch e: the N documents in corpus
 * order shuffled with key(s, e). An epoch has nb = floor(N / batch) batches
 * from the first nb * batch documents of that order (the other N % batch
 * wait for a later epoch's shuffle). Pools: consecutive runs of 50 * batch
 * of those documents (the last pool may be shorter, a multiple of batch).
 * A pool is sorted by t (ties by shuffled position), cut into batches of
 * batch consecutive documents (similar lengths), and its batches shuffled
 * with key(s, e, 1 + k) for pool k. Step i of the stream (0-based): epoch
 * e = i / nb, r = i % nb, pool k = r / 50, batch r % 50 of that pool's
 * shuffled batches.
 *
 * A batch is x, y [batch, T] i32 with T = max(2, the longest member's t)
 * (so T is in [2, ctx]); row b holds its document's x and y, then padding:
 * x = DOCBATCH_PAD_ID, y = DOCBATCH_IGNORE (cross entropy's ignore_index,
 * so padding adds nothing to the loss; with causal attention the padding,
 * after the real tokens, changes none of their outputs). */
#ifndef CHAR_GPT_DOCBATCH_H
#define CHAR_GPT_DOCBATCH_H
#include <stdint.h>

#define DOCBATCH_PAD_ID 0
#define DOCBATCH_IGNORE (-100)
#define DOCBATCH_POOL_BATCHES 50

typedef struct {
    const int32_t *tok;
    int64_t *start, *len;     /* usable documents (corpus order): first token, t */
    int64_t n, batch, ctx, nb;
    uint64_t seed, stream;
    int64_t epoch, pool;      /* what perm and order hold (-1: nothing yet) */
    int64_t *perm;            /* [n] the epoch's shuffled documents */
    int64_t *sorted;          /* [50 batch] the pool's documents, sorted */
    int64_t *order;           /* [50] the pool's batches, shuffled */
    int64_t pool_batches;
} docbatch;

uint64_t docbatch_splitmix64(uint64_t z);
/* 0, or -1 with a one-line message in err (fewer than batch usable
 * documents, out of memory). tok and doc (n_docs + 1 offsets) must outlive d. */
int docbatch_init(docbatch *d, const int32_t *tok, const int64_t *doc, int64_t n_docs, int64_t batch, int64_t ctx,
                  uint64_t seed, uint64_t stream, char *err, int errlen);
/* Batch `step` (>= 0) of the stream into x, y (room for batch * ctx each,
 * written [batch, T] row-major) and *T; returns the number of real
 * (non-padding) target tokens. Keeps the current epoch's and pool's order
 * (a walk through the steps in order shuffles and sorts once per pool). */
int64_t docbatch_get(docbatch *d, int64_t step, int32_t *x, int32_t *y, int64_t *T);
void docbatch_free(docbatch *d);
#endif
