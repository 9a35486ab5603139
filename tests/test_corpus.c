/* The char-level GPT demo's corpus reader (examples/corpus.c): a directory
 * is its regular files not ending in .dat, symlinks skipped, sorted; '%'
 * lines separate fortunes; every 10th fortune is validation; control bytes
 * are kept; the vocabulary is the training bytes plus one unseen id. */
#include "../examples/corpus.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];

static void put(const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void rm_all(void)
{
    const char *names[] = { "b", "a", "x.dat", "link", "one" };
    char p[512];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

static char decode(const corpus *c, int32_t id) { return id == c->vocab - 1 ? '?' : (char)c->byte_of[id]; }

START_TEST(directory_order_dat_symlink_split)
{
    snprintf(dir, sizeof dir, "/tmp/ctpu_corpus_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    /* "a": fortunes A0..A8 (9), with a BEL and an overstrike; "b": B9, B10 (no final newline) */
    put("a", "A0\x07\n%\nA1\n%\nA2\n%\nA3\n%\nA4\n%\nA5\n%\nA6\n%\nA7\n%\n_\bA8\n%\n");
    put("b", "B9\n%\n%\nB10");
    put("x.dat", "D\n%\nD\n%\nD\n%\nD\n");
    char p[512];
    snprintf(p, sizeof p, "%s/a", dir);
    char l[512];
    snprintf(l, sizeof l, "%s/link", dir);
    ck_assert_int_eq(symlink(p, l), 0);
    corpus c;
    char err[256] = "";
    ck_assert_msg(corpus_load(dir, &c, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.files, 2);   /* a, b: not x.dat, not the link */
    ck_assert_int_eq(c.fortunes_train, 10);   /* A0..A8, B10 (the empty one skipped) */
    ck_assert_int_eq(c.fortunes_val, 1);      /* B9: fortune index 9 */
    char val[16] = { 0 };
    for (int64_t i = 0; i < c.n_val; i++) val[i] = decode(&c, c.val[i]);
    ck_assert_str_eq(val, "B?\n");   /* its 9 is not in the training split */
    char tr[128] = { 0 };
    for (int64_t i = 0; i < c.n_train && i < 127; i++) tr[i] = decode(&c, c.train[i]);
    ck_assert_str_eq(tr, "A0\x07\nA1\nA2\nA3\nA4\nA5\nA6\nA7\n_\bA8\nB10");
    /* vocab: \b \a \n 0-8 A B _ (no '9': unseen in training) + unseen id */
    ck_assert_int_eq(c.vocab, 3 + 9 + 3 + 1);
    ck_assert_int_eq(c.id_of['9'], c.vocab - 1);
    ck_assert_int_eq(c.id_of['D'], c.vocab - 1);
    ck_assert_int_eq(c.byte_of[0], 0x07);
    ck_assert_int_eq(c.byte_of[1], 0x08);
    /* document offsets (for --by-document): A0's 4 bytes, then A1's 3, ..., B10 ends the split */
    ck_assert_int_eq(c.doc_train[0], 0);
    ck_assert_int_eq(c.doc_train[1], 4);
    ck_assert_int_eq(c.doc_train[2], 7);
    ck_assert_int_eq(c.doc_train[9], c.n_train - 3);
    ck_assert_int_eq(c.doc_train[10], c.n_train);
    ck_assert_int_eq(c.doc_val[0], 0);
    ck_assert_int_eq(c.doc_val[1], c.n_val);
    corpus_free(&c);
    /* a single file; and errors */
    put("one", "x\n%\ny\n");
    snprintf(p, sizeof p, "%s/one", dir);
    ck_assert_int_eq(corpus_load(p, &c, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "at least 10"));
    ck_assert_int_eq(corpus_load("/nonexistent/fortunes", &c, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/fortunes"));
    rm_all();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("corpus");
    TCase *tc = tcase_create("reader");
    tcase_add_test(tc, directory_order_dat_symlink_split);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
