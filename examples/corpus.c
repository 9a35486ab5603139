/* The fortunes corpus reader: see corpus.h. */
#include "corpus.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct { uint8_t *p; int64_t n, cap; } buf;

static bool buf_put(buf *b, const uint8_t *s, int64_t n)
{
    if (b->n + n > b->cap) {
        int64_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        uint8_t *q = realloc(b->p, (size_t)cap);
        if (!q) return false;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
    return true;
}

typedef struct { int64_t *p; int64_t n, cap; } offs;

static bool offs_put(offs *o, int64_t v)
{
    if (o->n == o->cap) {
        int64_t cap = o->cap ? o->cap * 2 : 1024;
        int64_t *q = realloc(o->p, sizeof(int64_t) * (size_t)cap);
        if (!q) return false;
        o->p = q;
        o->cap = cap;
    }
    o->p[o->n++] = v;
    return true;
}

typedef struct { buf tr, va; offs otr, ova; int64_t nf_tr, nf_va, index; } split;

static bool add_fortune(split *s, const uint8_t *p, int64_t n)
{
    if (n == 0) return true;
    bool val = s->index++ % 10 == 9;
    if (val) s->nf_va++;
    else s->nf_tr++;
    buf *b = val ? &s->va : &s->tr;
    return offs_put(val ? &s->ova : &s->otr, b->n) && buf_put(b, p, n);
}

static int read_file(const char *path, split *s, char *err, int errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, (size_t)errlen, "corpus: cannot open %s: %s", path, strerror(errno)); return -1; }
    buf all = { 0 };
    uint8_t chunk[65536];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (!buf_put(&all, chunk, (int64_t)k)) { fclose(f); free(all.p); snprintf(err, (size_t)errlen, "corpus: out of memory reading %s", path); return -1; }
    bool bad = ferror(f);
    fclose(f);
    if (bad) { free(all.p); snprintf(err, (size_t)errlen, "corpus: read error in %s", path); return -1; }
    int64_t start = 0, i = 0;
    while (i < all.n) {   /* line by line */
        int64_t e = i;
        while (e < all.n && all.p[e] != '\n') e++;
        bool pct = e - i == 1 && all.p[i] == '%';
        int64_t next = e < all.n ? e + 1 : e;
        if (pct) {
            if (!add_fortune(s, all.p + start, i - start)) goto oom;
            start = next;
        }
        i = next;
    }
    if (!add_fortune(s, all.p + start, all.n - start)) goto oom;
    free(all.p);
    return 0;
oom:
    free(all.p);
    snprintf(err, (size_t)errlen, "corpus: out of memory reading %s", path);
    return -1;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int read_dir(const char *path, split *s, int64_t *files, char *err, int errlen)
{
    DIR *d = opendir(path);
    if (!d) { snprintf(err, (size_t)errlen, "corpus: cannot open directory %s: %s", path, strerror(errno)); return -1; }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (de->d_name[0] == '.' && (l == 1 || (l == 2 && de->d_name[1] == '.'))) continue;
        if (l >= 4 && strcmp(de->d_name + l - 4, ".dat") == 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **q = realloc(names, cap * sizeof *q);
            if (!q) { rc = -1; break; }
            names = q;
        }
        if (!(names[n] = strdup(de->d_name))) { rc = -1; break; }
        n++;
    }
    closedir(d);
    if (rc) snprintf(err, (size_t)errlen, "corpus: out of memory listing %s", path);
    if (!rc) qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; !rc && i < n; i++) {
        size_t pl = strlen(path) + strlen(names[i]) + 2;
        char *full = malloc(pl);
        if (!full) { rc = -1; snprintf(err, (size_t)errlen, "corpus: out of memory"); break; }
        snprintf(full, pl, "%s/%s", path, names[i]);
        struct stat st;
        if (lstat(full, &st) == 0 && S_ISREG(st.st_mode)) {   /* symlinks, directories, devices skipped */
            rc = read_file(full, s, err, errlen);
            (*files)++;
        }
        free(full);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

int corpus_load(const char *path, corpus *c, char *err, int errlen)
{
    memset(c, 0, sizeof *c);
    split s = { 0 };
    struct stat st;
    int rc;
    if (stat(path, &st) != 0) {
        snprintf(err, (size_t)errlen, "corpus: cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) rc = read_dir(path, &s, &c->files, err, errlen);
    else if (S_ISREG(st.st_mode)) { rc = read_file(path, &s, err, errlen); c->files = 1; }
    else { snprintf(err, (size_t)errlen, "corpus: %s is not a file or directory", path); rc = -1; }
    if (!rc && (s.nf_tr == 0 || s.nf_va == 0)) {
        snprintf(err, (size_t)errlen, "corpus: %s has %lld fortunes; the 90/10 split needs at least 10", path,
                 (long long)(s.nf_tr + s.nf_va));
        rc = -1;
    }
    if (!rc) {
        bool seen[256] = { false };
        for (int64_t i = 0; i < s.tr.n; i++) seen[s.tr.p[i]] = true;
        int v = 0;
        for (int b = 0; b < 256; b++)
            if (seen[b]) { c->byte_of[v] = (uint8_t)b; c->id_of[b] = v++; }
        for (int b = 0; b < 256; b++)
            if (!seen[b]) c->id_of[b] = v;
        c->vocab = v + 1;
        c->train = malloc(sizeof(int32_t) * (size_t)s.tr.n);
        c->val = malloc(sizeof(int32_t) * (size_t)(s.va.n ? s.va.n : 1));
        bool offs_ok = offs_put(&s.otr, s.tr.n) && offs_put(&s.ova, s.va.n);   /* the end offsets */
        c->doc_train = s.otr.p;
        c->doc_val = s.ova.p;
        s.otr.p = s.ova.p = NULL;
        if (!c->train || !c->val || !offs_ok) { snprintf(err, (size_t)errlen, "corpus: out of memory"); rc = -1; }
        else {
            for (int64_t i = 0; i < s.tr.n; i++) c->train[i] = c->id_of[s.tr.p[i]];
            for (int64_t i = 0; i < s.va.n; i++) c->val[i] = c->id_of[s.va.p[i]];
            c->n_train = s.tr.n;
            c->n_val = s.va.n;
            c->fortunes_train = s.nf_tr;
            c->fortunes_val = s.nf_va;
        }
    }
    free(s.tr.p);
    free(s.va.p);
    free(s.otr.p);
    free(s.ova.p);
    if (rc) corpus_free(c);
    return rc;
}

void corpus_free(corpus *c)
{
    free(c->train);
    free(c->val);
    free(c->doc_train);
    free(c->doc_val);
    c->train = c->val = NULL;
    c->doc_train = c->doc_val = NULL;
}
