/* The char-level GPT demo's corpus (examples/char_gpt.c, issue 14): the
 * Debian fortunes files, read as bytes.
 *
 * A path is a file or a directory. A directory is read as its regular files
 * whose names do not end in ".dat" (the strfile indexes), symlinks skipped
 * (lstat: fortunes' "*.u8" links and the off/ links), in strcmp order of the
 * names; subdirectories are not entered. Each file is split into fortunes at
 * lines holding only "%" (a last line without its newline counts); the
 * newline ending a fortune's last line is kept, the "%" line is dropped, and
 * empty fortunes are skipped.
 *
 * Tokens are bytes. Control characters (the corpus holds BEL 0x07 and
 * backspace overstrikes "_\bx") and bytes >= 0x80 (UTF-8) are kept as
 * ordinary bytes: no byte is rewritten or dropped.
 *
 * Split: fortune i (0-based, over all files in order) goes to validation
 * when i % 10 == 9, else to training: 90/10, deterministic, no generator.
 * Vocabulary: the distinct bytes seen in the training split, in byte order,
 * ids 0..V-2, plus id V-1 for any byte not seen in training ("unseen"). */
#ifndef CHAR_GPT_CORPUS_H
#define CHAR_GPT_CORPUS_H
#include <stdint.h>

typedef struct {
    int32_t *train, *val;        /* token ids, the split's fortunes concatenated */
    int64_t n_train, n_val;      /* tokens */
    /* fortune i of a split is tokens [doc[i], doc[i + 1]) (fortunes_* + 1 offsets) */
    int64_t *doc_train, *doc_val;
    int64_t fortunes_train, fortunes_val, files;
    int vocab;                   /* V: seen bytes + 1 */
    int32_t id_of[256];          /* byte -> id (V-1 for unseen) */
    uint8_t byte_of[256];        /* id -> byte (ids < V-1) */
} corpus;

/* 0 on success; -1 with a one-line message in err (the path and what is
 * wrong: cannot open, not a file or directory, no fortunes, out of memory). */
int corpus_load(const char *path, corpus *c, char *err, int errlen);
void corpus_free(corpus *c);
#endif
