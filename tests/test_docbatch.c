/* The char-level GPT demo's --by-document batches (examples/docbatch.c,
 * issue 14): batch shapes (T = the longest member's positions, at least 2,
 * at most ctx), padding (x pad id, y ignore_index), truncation to ctx + 1
 * tokens, single-token documents left out, each epoch using every document
 * once (but N % batch), similar lengths within a batch (a pool sorted by
 * length, cut into batches), a seed-determined order. */
#include "../examples/docbatch.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

enum { NDOC = 1003, CTX = 16, BATCH = 4 };

static int32_t *tok;
static int64_t doc[NDOC + 1];

/* document i: length 1 + (i * 37) % 41 tokens, every token = i (so a row names its document) */
static int64_t doc_len(int64_t i) { return 1 + (i * 37) % 41; }

static void make_docs(void)
{
    doc[0] = 0;
    for (int64_t i = 0; i < NDOC; i++) doc[i + 1] = doc[i] + doc_len(i);
    tok = malloc(sizeof(int32_t) * (size_t)doc[NDOC]);
    ck_assert_ptr_nonnull(tok);
    for (int64_t i = 0; i < NDOC; i++)
        for (int64_t j = doc[i]; j < doc[i + 1]; j++) tok[j] = (int32_t)i;
}

static int64_t positions(int64_t i)
{
    int64_t t = (doc_len(i) < CTX + 1 ? doc_len(i) : CTX + 1) - 1;
    return t;
}

START_TEST(batch_shapes_padding_epochs)
{
    make_docs();
    int64_t usable = 0;
    for (int64_t i = 0; i < NDOC; i++) usable += positions(i) >= 1;
    docbatch d;
    char err[256];
    ck_assert_msg(docbatch_init(&d, tok, doc, NDOC, BATCH, CTX, 7, 1, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(d.n, usable);
    int64_t nb = usable / BATCH;
    ck_assert_int_eq(d.nb, nb);
    int32_t x[BATCH * CTX], y[BATCH * CTX];
    int *seen = calloc(NDOC, sizeof(int));
    int64_t *los = malloc(sizeof(int64_t) * (size_t)(2 * nb)), *his = malloc(sizeof(int64_t) * (size_t)(2 * nb));
    int64_t tmin = CTX, tmax = 0;
    for (int64_t step = 0; step < 2 * nb; step++) {
        int64_t T = -1;
        int64_t real = docbatch_get(&d, step, x, y, &T);
        ck_assert(T >= 2 && T <= CTX);
        tmin = T < tmin ? T : tmin;
        tmax = T > tmax ? T : tmax;
        int64_t longest = 2, sum = 0, lo = CTX, hi = 0;
        for (int b = 0; b < BATCH; b++) {
            int32_t id = x[b * T];
            ck_assert(id >= 0 && id < NDOC);
            int64_t t = positions(id);
            ck_assert_int_ge(t, 1);   /* single-token documents are left out */
            longest = t > longest ? t : longest;
            lo = t < lo ? t : lo;
            hi = t > hi ? t : hi;
            sum += t;
            for (int64_t i = 0; i < T; i++) {
                ck_assert_int_eq(x[b * T + i], i < t ? id : DOCBATCH_PAD_ID);
                ck_assert_int_eq(y[b * T + i], i < t ? id : DOCBATCH_IGNORE);
            }
            if (step < nb) seen[id]++;
        }
        ck_assert_int_eq(T, longest);
        ck_assert_int_eq(real, sum);
        los[step] = lo;
        his[step] = hi;
    }
    /* similar lengths: a pool's batches are runs of its length-sorted documents, so their length ranges
     * [lo, hi], put in order, only touch (hi of one <= lo of the next) */
    for (int64_t p0 = 0; p0 < 2 * nb; p0 += DOCBATCH_POOL_BATCHES) {
        int64_t e0 = p0 / nb * nb, end = p0 + DOCBATCH_POOL_BATCHES;
        if (end > e0 + nb) end = e0 + nb;
        for (int64_t i = p0; i < end; i++)
            for (int64_t j = p0; j < end; j++)
                if (i != j && los[i] <= los[j]) ck_assert_msg(his[i] <= los[j] || los[i] == los[j],
                    "steps %lld and %lld of one pool: lengths %lld..%lld and %lld..%lld", (long long)i, (long long)j,
                    (long long)los[i], (long long)his[i], (long long)los[j], (long long)his[j]);
        if (end == e0 + nb) p0 = e0 + nb - DOCBATCH_POOL_BATCHES;   /* next epoch's first pool */
    }
    ck_assert_int_eq(tmin, 2);
    ck_assert_int_eq(tmax, CTX);
    int64_t once = 0;
    for (int64_t i = 0; i < NDOC; i++) {
        ck_assert_int_le(seen[i], 1);
        once += seen[i];
    }
    ck_assert_int_eq(once, nb * BATCH);   /* the first epoch: every document once, but usable % batch */
    free(seen);
    free(los);
    free(his);
    docbatch_free(&d);
    free(tok);
}
END_TEST

/* the same seed and stream give the same batches (in any order of asking:
 * the caches are per epoch and pool); another seed or stream others */
START_TEST(batches_are_a_function_of_seed_stream_step)
{
    make_docs();
    docbatch a, b, c, s2;
    char err[256];
    ck_assert_int_eq(docbatch_init(&a, tok, doc, NDOC, BATCH, CTX, 7, 1, err, sizeof err), 0);
    ck_assert_int_eq(docbatch_init(&b, tok, doc, NDOC, BATCH, CTX, 7, 1, err, sizeof err), 0);
    ck_assert_int_eq(docbatch_init(&c, tok, doc, NDOC, BATCH, CTX, 8, 1, err, sizeof err), 0);
    ck_assert_int_eq(docbatch_init(&s2, tok, doc, NDOC, BATCH, CTX, 7, 2, err, sizeof err), 0);
    int32_t xa[BATCH * CTX], ya[BATCH * CTX], xb[BATCH * CTX], yb[BATCH * CTX];
    int64_t steps[] = { 0, 1, 60, 249, 250, 3, 1000, 0 };
    int differ_seed = 0, differ_stream = 0;
    for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
        int64_t Ta, Tb;
        docbatch_get(&a, steps[i], xa, ya, &Ta);
        docbatch_get(&b, steps[sizeof steps / sizeof *steps - 1 - i], xb, yb, &Tb);   /* b walks backwards */
        docbatch_get(&b, steps[i], xb, yb, &Tb);
        ck_assert_int_eq(Ta, Tb);
        ck_assert_mem_eq(xa, xb, sizeof(int32_t) * (size_t)(BATCH * Ta));
        ck_assert_mem_eq(ya, yb, sizeof(int32_t) * (size_t)(BATCH * Ta));
        docbatch_get(&c, steps[i], xb, yb, &Tb);
        differ_seed += Ta != Tb || memcmp(xa, xb, sizeof(int32_t) * (size_t)(BATCH * Ta)) != 0;
        docbatch_get(&s2, steps[i], xb, yb, &Tb);
        differ_stream += Ta != Tb || memcmp(xa, xb, sizeof(int32_t) * (size_t)(BATCH * Ta)) != 0;
    }
    ck_assert_int_ge(differ_seed, 6);
    ck_assert_int_ge(differ_stream, 6);
    docbatch_free(&a);
    docbatch_free(&b);
    docbatch_free(&c);
    docbatch_free(&s2);
    free(tok);
}
END_TEST

/* fixed values of the documented generator, so the Python side (bench/torch_gpt.py) can check its copy */
START_TEST(generator_fixed_values)
{
    ck_assert_uint_eq(docbatch_splitmix64(0), 0xE220A8397B1DCDAFull);
    make_docs();
    docbatch d;
    char err[256];
    ck_assert_int_eq(docbatch_init(&d, tok, doc, 3, BATCH, CTX, 7, 1, err, sizeof err), -1);   /* 2 usable < 4 */
    ck_assert_ptr_nonnull(strstr(err, "fewer than --batch 4"));
    free(tok);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("docbatch");
    TCase *tc = tcase_create("docbatch");
    tcase_add_test(tc, batch_shapes_padding_epochs);
    tcase_add_test(tc, batches_are_a_function_of_seed_stream_step);
    tcase_add_test(tc, generator_fixed_values);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int nf = srunner_ntests_failed(r);
    srunner_free(r);
    return nf ? 1 : 0;
}
