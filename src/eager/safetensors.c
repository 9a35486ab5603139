/* Safetensors files (the Hugging Face format, github.com/huggingface/safetensors):
 *
 *   u64 little-endian N | N bytes of JSON header | data section
 *
 * The header maps each tensor name to {"dtype", "shape", "data_offsets":
 * [begin, end]} (byte offsets into the data section) and may hold
 * "__metadata__", a string -> string map. Data is raw little-endian,
 * row-major. As the reference reader does, this one refuses a header above
 * 100,000,000 bytes, offsets that overlap, leave holes or do not cover the
 * data section exactly, and sizes that do not match dtype x shape.
 *
 * Built on the public API only (ctpu.h) plus cJSON. Every failure is one line
 * naming the op, the file and, where there is one, the tensor; loads check
 * every tensor (and read every byte) before they write any. Writes go to a
 * temporary file in the destination's directory, are fsync'd, then renamed
 * into place (and the directory fsync'd), so a crash leaves either the old
 * file or the new one, never half of one. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "ctpu.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors data is little-endian: add byte swaps");

#define ST_MAX_HEADER 100000000ull     /* the reference implementation's limit */
#define ST_MAX_INT 9007199254740992.0  /* 2^53: integers a JSON double holds exactly */
#define NM "%.160s"                    /* names in messages: at most 160 bytes */

struct ctpu_safetensors {
    char *path;
    int fd;
    uint64_t data_start, data_size;   /* bytes: file offset of the data section, its length */
    int n;
    ctpu_safetensors_entry *e;        /* [n], in file order */
    int *by_name;                     /* [n] indices sorted by name */
    int n_meta;
    char **meta;                      /* [2 * n_meta]: key, value */
    char *strings;                    /* cJSON tree kept for the names and metadata strings */
};

static const struct { const char *name; uint64_t size; ctpu_dtype dt; } ST_DTYPES[] = {
    { "F32", 4, CTPU_F32 },   { "BF16", 2, CTPU_BF16 },      { "I32", 4, CTPU_I32 },
    { "BOOL", 1, CTPU_DTYPE_COUNT }, { "U8", 1, CTPU_DTYPE_COUNT },  { "I8", 1, CTPU_DTYPE_COUNT },
    { "F8_E5M2", 1, CTPU_DTYPE_COUNT }, { "F8_E4M3", 1, CTPU_DTYPE_COUNT }, { "I16", 2, CTPU_DTYPE_COUNT },
    { "U16", 2, CTPU_DTYPE_COUNT }, { "F16", 2, CTPU_DTYPE_COUNT }, { "U32", 4, CTPU_DTYPE_COUNT },
    { "F64", 8, CTPU_DTYPE_COUNT }, { "I64", 8, CTPU_DTYPE_COUNT }, { "U64", 8, CTPU_DTYPE_COUNT },
};
#define ST_N_DTYPES ((int)(sizeof ST_DTYPES / sizeof ST_DTYPES[0]))

static const char *st_dtype_name(ctpu_dtype dt) { return dt == CTPU_BF16 ? "BF16" : dt == CTPU_I32 ? "I32" : "F32"; }
static uint64_t elem_size(ctpu_dtype dt) { return dt == CTPU_BF16 ? 2 : 4; }

/* "F32[2,3]" */
static const char *fmt_shape(const char *dt, int nd, const int64_t *s, char *buf, size_t len)
{
    size_t k = (size_t)snprintf(buf, len, "%s[", dt);
    for (int d = 0; d < nd && k < len; d++) k += (size_t)snprintf(buf + k, len - k, d ? ",%lld" : "%lld", (long long)s[d]);
    if (k < len) snprintf(buf + k, len - k, "]");
    return buf;
}

static const char *fmt_tensor(ctpu_tensor t, char *buf, size_t len)
{
    int64_t s[CTPU_MAX_DIMS];
    int nd = 0;
    ctpu_shape(t, s, &nd);
    return fmt_shape(ctpu_dtype_name(ctpu_dtype_of(t)), nd, s, buf, len);
}

/* Well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, at most
 * U+10FFFF), as the reference reader requires of the header. Returns the
 * offset of the first bad byte, or n. */
static size_t utf8_check(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : 4;
        if (k == 4 || i + k >= n + (k == 0)) return i;
        if (k == 0) { i++; continue; }
        unsigned cp = c & (0x3f >> k);
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return i;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        static const unsigned min[4] = { 0, 0x80, 0x800, 0x10000 };
        if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += k + 1;
    }
    return n;
}

/* pread the whole range or fail (EOF counts as a failure). */
static bool read_at(int fd, void *dst, uint64_t n, uint64_t off)
{
    char *p = dst;
    while (n) {
        ssize_t r = pread(fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { if (r == 0) errno = 0; return false; }
        p += r;
        n -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return true;
}

static bool write_all(int fd, const void *src, size_t n)
{
    const char *p = src;
    while (n) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

void ctpu_safetensors_close(ctpu_safetensors *f)
{
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free(f->path);
    free(f->e);
    free(f->by_name);
    free(f->meta);
    free(f->strings);
    free(f);
}

/* ------------------------------------------------------------------ open */
static int cmp_name(const void *a, const void *b, void *ctx)
{
    const ctpu_safetensors *f = ctx;
    return strcmp(f->e[*(const int *)a].name, f->e[*(const int *)b].name);
}

static int cmp_offset(const void *a, const void *b, void *ctx)
{
    const ctpu_safetensors *f = ctx;
    const ctpu_safetensors_entry *x = &f->e[*(const int *)a], *y = &f->e[*(const int *)b];
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

/* A JSON number that is a non-negative integer a double holds exactly. */
static bool json_uint(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j)) return false;
    double v = j->valuedouble;
    if (!(v >= 0) || v > ST_MAX_INT || v != (double)(uint64_t)v) return false;
    *out = (uint64_t)v;
    return true;
}

/* Copy every string the file's handle keeps (names, metadata)
 * into one block, so the cJSON tree can be freed. */
typedef struct { char *buf; size_t len, cap; } strpool;

static size_t pool_add(strpool *p, const char *s)
{
    size_t n = strlen(s) + 1, at = p->len;
    if (p->len + n > p->cap) {
        size_t cap = p->cap ? p->cap : 256;
        while (cap < p->len + n) cap *= 2;
        char *nb = realloc(p->buf, cap);
        if (!nb) return SIZE_MAX;
        p->buf = nb;
        p->cap = cap;
    }
    memcpy(p->buf + at, s, n);
    p->len += n;
    return at;
}

/* The entry's checks that need only the entry itself. Returns false with the
 * error set. */
static bool parse_entry(const char *op, const char *path, const cJSON *j, ctpu_safetensors_entry *e, size_t *dt_idx)
{
    const char *name = j->string;
    if (!cJSON_IsObject(j)) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: tensor '" NM "': its entry is not a JSON object", op, path, name);
        return false;
    }
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of)) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: tensor '" NM "': needs \"dtype\" (a string), \"shape\" and "
                          "\"data_offsets\" (arrays)", op, path, name);
        return false;
    }
    int k = -1;
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (!strcmp(dt->valuestring, ST_DTYPES[i].name)) k = i;
    if (k < 0) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: tensor '" NM "': unknown dtype '%.32s'", op, path, name, dt->valuestring);
        return false;
    }
    *dt_idx = (size_t)k;
    e->dtype = ST_DTYPES[k].dt;
    int nd = cJSON_GetArraySize(sh);
    if (nd > CTPU_MAX_DIMS) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: tensor '" NM "': %d dims (ctpu takes at most %d)", op, path, name, nd,
                          CTPU_MAX_DIMS);
        return false;
    }
    e->ndim = nd;
    uint64_t nbytes = ST_DTYPES[k].size;
    bool ovf = false;
    for (int d = 0; d < nd; d++) {
        uint64_t x;
        if (!json_uint(cJSON_GetArrayItem(sh, d), &x)) {
            ctpu_report_error(CTPU_ERR_IO, "%s: %s: tensor '" NM "': shape[%d] is not a non-negative integer", op,
                              path, name, d);
            return false;
        }
        e->shape[d] = (int64_t)x;
        ovf |= __builtin_mul_overflow(nbytes, x, &nbytes);
    }
    uint64_t b, en;
    if (cJSON_GetArraySize(of) != 2 || !json_uint(cJSON_GetArrayItem(of, 0), &b) ||
        !json_uint(cJSON_GetArrayItem(of, 1), &en) || en < b) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: tensor '" NM "': data_offsets must be [begin, end] with "
                          "0 <= begin <= end", op, path, name);
        return false;
    }
    char sb[160];
    if (ovf || en - b != nbytes) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: tensor '" NM "': data_offsets [%llu, %llu] hold %llu bytes but %s "
                          "needs %s%llu", op, path, name, (unsigned long long)b, (unsigned long long)en,
                          (unsigned long long)(en - b), fmt_shape(ST_DTYPES[k].name, nd, e->shape, sb, sizeof sb),
                          ovf ? "more than " : "", (unsigned long long)(ovf ? UINT64_MAX : nbytes));
        return false;
    }
    e->offset = b;
    e->nbytes = nbytes;
    return true;
}

/* Opens the file and reads its header into a NUL-terminated buffer, checking
 * the length word, the size limit, the first byte and UTF-8. NULL on error. */
static char *st_read_header(const char *op, const char *path, ctpu_safetensors *f, uint64_t *hn_out)
{
    struct stat sb;
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0 || fstat(f->fd, &sb) != 0) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: cannot open: %s", op, path, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(sb.st_mode)) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: not a regular file", op, path);
        return NULL;
    }
    uint64_t size = (uint64_t)sb.st_size;
    unsigned char lenb[8];
    if (size < 8 || !read_at(f->fd, lenb, 8, 0)) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: %llu bytes: truncated before the 8-byte header length", op, path,
                          (unsigned long long)size);
        return NULL;
    }
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = hn << 8 | lenb[i];
    if (hn > ST_MAX_HEADER) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: header length %llu is above the %llu-byte limit", op, path,
                          (unsigned long long)hn, ST_MAX_HEADER);
        return NULL;
    }
    if (hn > size - 8) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: header length %llu runs past the end of the file (%llu bytes): "
                          "truncated", op, path, (unsigned long long)hn, (unsigned long long)size);
        return NULL;
    }
    if (hn < 2) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: header length %llu: too short for a JSON object", op, path,
                          (unsigned long long)hn);
        return NULL;
    }
    char *hdr = malloc((size_t)hn + 1);
    if (!hdr) { ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory for the header", op, path); return NULL; }
    if (!read_at(f->fd, hdr, hn, 8)) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: reading the header: %s", op, path, errno ? strerror(errno) : "end of file");
        free(hdr);
        return NULL;
    }
    hdr[hn] = 0;
    f->data_start = 8 + hn;
    f->data_size = size - 8 - hn;
    if (memchr(hdr, 0, (size_t)hn) || hdr[0] != '{') {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: malformed header: %s", op, path,
                          hdr[0] != '{' ? "it does not start with '{'" : "it holds a NUL byte");
        free(hdr);
        return NULL;
    }
    size_t bad = utf8_check((const unsigned char *)hdr, (size_t)hn);
    if (bad != hn) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: malformed header: not valid UTF-8 at byte %zu", op, path, bad);
        free(hdr);
        return NULL;
    }
    *hn_out = hn;
    return hdr;
}

/* Parses the header text as one JSON object (trailing spaces allowed: the
 * format's padding). NULL on error. */
static cJSON *st_parse_json(const char *op, const char *path, const char *hdr, uint64_t hn)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hn, &end, false);
    if (root) {
        for (const char *c = end; c < hdr + hn; c++)
            if (*c != ' ') { cJSON_Delete(root); root = NULL; break; }
    }
    if (!root || !cJSON_IsObject(root)) {
        long at = end && end >= hdr && end <= hdr + hn ? (long)(end - hdr) : -1;
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: malformed header: not one JSON object (error near byte %ld of %llu)",
                          op, path, at, (unsigned long long)hn);
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

/* Counts the tensor entries and metadata strings; false if __metadata__ is malformed. */
static bool st_count(const char *op, const char *path, const cJSON *root, int *n_out, int *n_meta_out)
{
    int n = 0, n_meta = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (strcmp(c->string, "__metadata__")) { n++; continue; }
        if (!cJSON_IsObject(c)) {
            ctpu_report_error(CTPU_ERR_IO, "%s: %s: __metadata__ is not a JSON object", op, path);
            return false;
        }
        for (const cJSON *m = c->child; m; m = m->next) {
            if (!cJSON_IsString(m)) {
                ctpu_report_error(CTPU_ERR_IO, "%s: %s: __metadata__ '" NM "' is not a string", op, path, m->string);
                return false;
            }
            n_meta++;
        }
    }
    *n_out = n;
    *n_meta_out = n_meta;
    return true;
}

/* Fills f's entries and metadata from the parsed header; names live in one string pool. */
static bool st_fill(const char *op, const char *path, ctpu_safetensors *f, const cJSON *root)
{
    int n = 0, n_meta = 0;
    if (!st_count(op, path, root, &n, &n_meta)) return false;
    strpool pool = { 0 };
    f->e = calloc((size_t)(n ? n : 1), sizeof *f->e);
    f->by_name = calloc((size_t)(n ? n : 1), sizeof(int));
    f->meta = calloc((size_t)(n_meta ? 2 * n_meta : 1), sizeof(char *));
    size_t *name_at = calloc((size_t)(n ? n : 1), sizeof(size_t));
    size_t *meta_at = calloc((size_t)(n_meta ? 2 * n_meta : 1), sizeof(size_t));
    bool ok = f->e && f->by_name && f->meta && name_at && meta_at;
    if (!ok) ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory for %d tensors", op, path, n);
    int i = 0, mi = 0;
    for (const cJSON *c = root->child; ok && c; c = c->next) {
        if (!strcmp(c->string, "__metadata__")) {
            for (const cJSON *m = c->child; ok && m; m = m->next, mi++) {
                meta_at[2 * mi] = pool_add(&pool, m->string);
                meta_at[2 * mi + 1] = pool_add(&pool, m->valuestring);
                ok = meta_at[2 * mi] != SIZE_MAX && meta_at[2 * mi + 1] != SIZE_MAX;
            }
            continue;
        }
        size_t k = 0;
        if (!parse_entry(op, path, c, &f->e[i], &k)) { ok = false; break; }
        if (f->e[i].offset + f->e[i].nbytes > f->data_size) {
            ctpu_report_error(CTPU_ERR_IO, "%s: %s: tensor '" NM "': data_offsets end %llu is past the end of the "
                              "data (%llu bytes): truncated", op, path, c->string,
                              (unsigned long long)(f->e[i].offset + f->e[i].nbytes), (unsigned long long)f->data_size);
            ok = false;
            break;
        }
        name_at[i] = pool_add(&pool, c->string);
        f->e[i].dtype_name = ST_DTYPES[k].name;
        if (name_at[i] == SIZE_MAX) {
            ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory", op, path);
            ok = false;
        }
        f->by_name[i] = i;
        i++;
    }
    if (ok) {
        f->n = n;
        f->n_meta = n_meta;
        f->strings = pool.buf;
        pool.buf = NULL;
        for (int t = 0; t < n; t++) f->e[t].name = f->strings + name_at[t];
        for (int m = 0; m < 2 * n_meta; m++) f->meta[m] = f->strings + meta_at[m];
    }
    free(name_at);
    free(meta_at);
    free(pool.buf);
    return ok;
}

/* Duplicate names (JSON allows them; the format does not). */
static bool st_check_unique(const char *op, const char *path, ctpu_safetensors *f)
{
    qsort_r(f->by_name, (size_t)f->n, sizeof(int), cmp_name, f);
    for (int t = 1; t < f->n; t++)
        if (!strcmp(f->e[f->by_name[t]].name, f->e[f->by_name[t - 1]].name)) {
            ctpu_report_error(CTPU_ERR_IO, "%s: %s: tensor '" NM "' appears twice in the header", op, path,
                              f->e[f->by_name[t]].name);
            return false;
        }
    for (int a = 0; a < f->n_meta; a++)
        for (int b = a + 1; b < f->n_meta; b++)
            if (!strcmp(f->meta[2 * a], f->meta[2 * b])) {
                ctpu_report_error(CTPU_ERR_IO, "%s: %s: __metadata__ '" NM "' appears twice", op, path, f->meta[2 * a]);
                return false;
            }
    return true;
}

/* Offsets: in order, no overlap, no hole, covering the data section exactly. */
static bool st_check_offsets(const char *op, const char *path, ctpu_safetensors *f)
{
    int n = f->n;
    int *ord = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!ord) { ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory", op, path); return false; }
    for (int t = 0; t < n; t++) ord[t] = t;
    qsort_r(ord, (size_t)n, sizeof(int), cmp_offset, f);
    uint64_t at = 0;
    for (int t = 0; t < n; t++) {
        const ctpu_safetensors_entry *e = &f->e[ord[t]];
        if (e->offset != at) {
            if (e->offset < at)
                ctpu_report_error(CTPU_ERR_IO, "%s: %s: tensor '" NM "': data_offsets [%llu, %llu] overlap tensor '"
                                  NM "'", op, path, e->name, (unsigned long long)e->offset,
                                  (unsigned long long)(e->offset + e->nbytes), f->e[ord[t - 1]].name);
            else
                ctpu_report_error(CTPU_ERR_IO, "%s: %s: tensor '" NM "': data_offsets begin %llu leaves a hole after "
                                  "byte %llu (tensors must cover the data section)", op, path, e->name,
                                  (unsigned long long)e->offset, (unsigned long long)at);
            free(ord);
            return false;
        }
        at = e->offset + e->nbytes;
    }
    free(ord);
    if (at != f->data_size) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: the data section has %llu bytes but the tensors cover %llu", op, path,
                          (unsigned long long)f->data_size, (unsigned long long)at);
        return false;
    }
    return true;
}

static ctpu_safetensors *st_open(const char *op, const char *path)
{
    if (!path) { ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: path is NULL", op); return NULL; }
    ctpu_safetensors *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory", op, path);
        return NULL;
    }
    f->fd = -1;
    uint64_t hn = 0;
    char *hdr = st_read_header(op, path, f, &hn);
    cJSON *root = hdr ? st_parse_json(op, path, hdr, hn) : NULL;
    bool ok = root && st_fill(op, path, f, root) && st_check_unique(op, path, f) && st_check_offsets(op, path, f);
    cJSON_Delete(root);
    free(hdr);
    if (ok) return f;
    ctpu_safetensors_close(f);
    return NULL;
}

ctpu_safetensors *ctpu_safetensors_open(const char *path) { return st_open("safetensors_open", path); }

const ctpu_safetensors_entry *ctpu_safetensors_entries(const ctpu_safetensors *f, int *n)
{
    if (!f || !n) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "safetensors_entries: %s is NULL", f ? "n" : "f");
        if (n) *n = 0;
        return NULL;
    }
    *n = f->n;
    return f->e;
}

static int find(const ctpu_safetensors *f, const char *name)
{
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->e[f->by_name[mid]].name, name);
        if (!c) return f->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

int ctpu_safetensors_find(const ctpu_safetensors *f, const char *name)
{
    if (!f || !name) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "safetensors_find: %s is NULL", f ? "name" : "f");
        return -1;
    }
    return find(f, name);
}

int ctpu_safetensors_metadata_count(const ctpu_safetensors *f) { return f ? f->n_meta : 0; }

const char *ctpu_safetensors_metadata(const ctpu_safetensors *f, const char *key)
{
    if (!f || !key) return NULL;
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

ctpu_status ctpu_safetensors_metadata_at(const ctpu_safetensors *f, int i, const char **key, const char **value)
{
    if (!f || !key || !value || i < 0 || i >= f->n_meta)
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "safetensors_metadata_at: %s", !f || !key || !value
                                 ? "a NULL argument" : "index out of range");
    *key = f->meta[2 * i];
    *value = f->meta[2 * i + 1];
    return CTPU_OK;
}

/* An entry's bytes into dst (e->nbytes of room). */
static ctpu_status read_entry(const char *op, const ctpu_safetensors *f, const ctpu_safetensors_entry *e, void *dst)
{
    if (!read_at(f->fd, dst, e->nbytes, f->data_start + e->offset)) {
        return ctpu_report_error(CTPU_ERR_IO, "%s: %s: tensor '" NM "': reading %llu bytes at %llu: %s", op, f->path,
                                 e->name, (unsigned long long)e->nbytes,
                                 (unsigned long long)(f->data_start + e->offset),
                                 errno ? strerror(errno) : "end of file (the file shrank since it was opened)");
    }
    return CTPU_OK;
}

static ctpu_status dtype_unsupported(const char *op, const ctpu_safetensors *f, const ctpu_safetensors_entry *e)
{
    return ctpu_report_error(CTPU_ERR_DTYPE, "%s: %s: tensor '" NM "' is %s: ctpu reads F32, BF16 and I32", op,
                             f->path, e->name, e->dtype_name);
}

ctpu_tensor ctpu_safetensors_tensor(const ctpu_safetensors *f, const char *name)
{
    const char *op = "safetensors_tensor";
    if (!f || !name) { ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s is NULL", op, f ? "name" : "f"); return ctpu_error_handle(); }
    int i = find(f, name);
    if (i < 0) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: tensor '" NM "' is not in the file (%d tensors)", op, f->path,
                          name, f->n);
        return ctpu_error_handle();
    }
    const ctpu_safetensors_entry *e = &f->e[i];
    if (e->dtype == CTPU_DTYPE_COUNT) { dtype_unsupported(op, f, e); return ctpu_error_handle(); }
    void *buf = malloc(e->nbytes ? (size_t)e->nbytes : 1);
    if (!buf) {
        ctpu_report_error(CTPU_ERR_OOM, "%s: %s: tensor '" NM "': out of host memory for %llu bytes", op, f->path,
                          e->name, (unsigned long long)e->nbytes);
        return ctpu_error_handle();
    }
    if (read_entry(op, f, e, buf) != CTPU_OK) { free(buf); return ctpu_error_handle(); }
    ctpu_tensor t = ctpu_from_host(buf, e->dtype, e->ndim, e->shape);
    free(buf);
    if (ctpu_is_null(t)) {
        ctpu_report_error(ctpu_last_status(), "%s: %s: tensor '" NM "': %s", op, f->path, name, ctpu_last_error());
        return ctpu_error_handle();
    }
    return t;
}

/* --------------------------------------------------------------- load */
static ctpu_status st_load(const char *op, const ctpu_safetensors *f, int n, const char *const *names,
                           const ctpu_tensor *tensors)
{
    if (n < 0 || (n > 0 && (!names || !tensors)))
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: n=%d with names %s, tensors %s", op, f->path, n,
                                 names ? "given" : "NULL", tensors ? "given" : "NULL");
    char sa[160], sb[160];
    const ctpu_safetensors_entry **ent = calloc((size_t)(n ? n : 1), sizeof *ent);
    ctpu_status st = ent ? CTPU_OK : ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory", op, f->path);
    /* 1. every destination against its entry: nothing is written unless all fit */
    for (int i = 0; st == CTPU_OK && i < n; i++) {
        if (!names[i]) { st = ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: names[%d] is NULL", op, f->path, i); break; }
        if (ctpu_ndim(tensors[i]) < 0) {   /* "ndim: t is <why>" */
            st = ctpu_report_error(ctpu_last_status(), "%s: %s: tensor '" NM "': the destination is %s", op, f->path,
                                   names[i], ctpu_last_error() + 11);
            break;
        }
        int k = find(f, names[i]);
        if (k < 0) {
            st = ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: tensor '" NM "' is not in the file (%d tensors)", op,
                                   f->path, names[i], f->n);
            break;
        }
        const ctpu_safetensors_entry *e = ent[i] = &f->e[k];
        if (e->dtype == CTPU_DTYPE_COUNT) { st = dtype_unsupported(op, f, e); break; }
        int64_t s[CTPU_MAX_DIMS];
        int nd = 0;
        ctpu_shape(tensors[i], s, &nd);
        ctpu_dtype dt = ctpu_dtype_of(tensors[i]);
        bool same = nd == e->ndim;
        for (int d = 0; same && d < nd; d++) same = s[d] == e->shape[d];
        if (dt != e->dtype || !same) {
            st = ctpu_report_error(dt != e->dtype ? CTPU_ERR_DTYPE : CTPU_ERR_SHAPE,
                                   "%s: %s: tensor '" NM "' is %s in the file but the destination is %s", op, f->path,
                                   names[i], fmt_shape(e->dtype_name, e->ndim, e->shape, sa, sizeof sa),
                                   fmt_tensor(tensors[i], sb, sizeof sb));
            break;
        }
    }
    /* 2. every tensor read into a new device tensor (one host buffer, reused:
     * fresh pages cost more than the copy), 3. then the assigns */
    uint64_t max_bytes = 1;
    for (int i = 0; st == CTPU_OK && i < n; i++)
        if (ent[i]->nbytes > max_bytes) max_bytes = ent[i]->nbytes;
    void *buf = st == CTPU_OK ? malloc((size_t)max_bytes) : NULL;
    if (st == CTPU_OK && !buf)
        st = ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory for %llu bytes", op, f->path,
                               (unsigned long long)max_bytes);
    if (st == CTPU_OK && (st = ctpu_scope_begin()) == CTPU_OK) {
        ctpu_tensor *src = calloc((size_t)(n ? n : 1), sizeof *src);
        if (!src) st = ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory", op, f->path);
        for (int i = 0; st == CTPU_OK && i < n; i++) {
            if ((st = read_entry(op, f, ent[i], buf)) != CTPU_OK) break;
            src[i] = ctpu_from_host(buf, ent[i]->dtype, ent[i]->ndim, ent[i]->shape);
            if (ctpu_is_null(src[i]))
                st = ctpu_report_error(ctpu_last_status(), "%s: %s: tensor '" NM "': %s", op, f->path, names[i],
                                       ctpu_last_error());
        }
        /* under no_grad, as torch's load_state_dict copies: a parameter is a
         * leaf that requires grad, which assign refuses with grad mode on */
        bool ng = st == CTPU_OK && (st = ctpu_no_grad_begin()) == CTPU_OK;
        for (int i = 0; st == CTPU_OK && i < n; i++)
            if ((st = ctpu_assign(tensors[i], src[i])) != CTPU_OK)
                ctpu_report_error(st, "%s: %s: tensor '" NM "': %s", op, f->path, names[i], ctpu_last_error());
        if (ng) ctpu_no_grad_end();
        free(src);
        ctpu_scope_end();
        /* a cut: in defer and fuse the assigns run now, apart from the next step's trace */
        if (st == CTPU_OK && (st = ctpu_sync()) != CTPU_OK)
            ctpu_report_error(st, "%s: %s: %s", op, f->path, ctpu_last_error());
    }
    free(buf);
    free(ent);
    return st;
}

ctpu_status ctpu_safetensors_load(const ctpu_safetensors *f, int n, const char *const *names, const ctpu_tensor *tensors)
{
    if (!f) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "safetensors_load: f is NULL");
    return st_load("safetensors_load", f, n, names, tensors);
}

ctpu_status ctpu_load(const char *path, int n, const char *const *names, const ctpu_tensor *tensors)
{
    if (!ctpu_is_initialized())
        return ctpu_report_error(CTPU_ERR_NOT_INITIALIZED, "load: the runtime is not initialised (call ctpu_init)");
    ctpu_safetensors *f = st_open("load", path);
    if (!f) return ctpu_last_status();
    ctpu_status st = st_load("load", f, n, names, tensors);
    ctpu_safetensors_close(f);
    return st;
}

/* --------------------------------------------------------------- save */
static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* NULL-free, distinct strings (names or metadata keys); what names the first bad one. */
static ctpu_status distinct(const char *op, const char *path, const char *what, int n, const char *const *s,
                            int stride)
{
    const char **c = malloc(sizeof(char *) * (size_t)(n ? n : 1));
    if (!c) return ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory", op, path);
    for (int i = 0; i < n; i++) {
        c[i] = s[i * stride];
        if (!c[i]) { free(c); return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: %s %d is NULL", op, path, what, i); }
    }
    qsort(c, (size_t)n, sizeof *c, cmp_str);
    for (int i = 1; i < n; i++)
        if (!strcmp(c[i], c[i - 1])) {
            ctpu_status st = ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: %s '" NM "' appears twice", op, path,
                                               what, c[i]);
            free(c);
            return st;
        }
    free(c);
    return CTPU_OK;
}

static _Atomic unsigned g_tmp_counter;

/* Every argument checked before anything is written. */
static ctpu_status save_check_args(const char *op, const char *path, int n, const char *const *names,
                                   const ctpu_tensor *tensors, int n_meta, const char *const *meta)
{
    if (!ctpu_is_initialized())
        return ctpu_report_error(CTPU_ERR_NOT_INITIALIZED, "%s: the runtime is not initialised (call ctpu_init)", op);
    if (!path) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: path is NULL", op);
    if (strlen(path) > 4000)   /* the temporary file's name must fit beside it */
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %.64s...: the path has %zu bytes (at most 4000)", op, path,
                                 strlen(path));
    if (n < 0 || (n > 0 && (!names || !tensors)) || n_meta < 0 || (n_meta > 0 && !meta))
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: n=%d (names %s, tensors %s), n_meta=%d (meta %s)", op,
                                 path, n, names ? "given" : "NULL", tensors ? "given" : "NULL", n_meta,
                                 meta ? "given" : "NULL");
    ctpu_status st = distinct(op, path, "tensor name", n, names, 1);
    if (st == CTPU_OK) st = distinct(op, path, "metadata key", n_meta, meta, 2);
    if (st != CTPU_OK) return st;
    for (int i = 0; i < n_meta; i++) {
        if (!meta[2 * i + 1])
            return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: the value of metadata '" NM "' is NULL", op, path,
                                     meta[2 * i]);
        for (int j = 0; j < 2; j++) {
            const char *m = meta[2 * i + j];
            if (utf8_check((const unsigned char *)m, strlen(m)) != strlen(m))
                return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: metadata %s '" NM "' is not valid UTF-8 (the "
                                         "header is UTF-8 JSON)", op, path, j ? "value of" : "key", meta[2 * i]);
        }
    }
    for (int i = 0; i < n; i++) {
        if (!strcmp(names[i], "__metadata__"))
            return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: tensor name '__metadata__' is reserved", op, path);
        if (utf8_check((const unsigned char *)names[i], strlen(names[i])) != strlen(names[i]))
            return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: tensor '" NM "': the name is not valid UTF-8 (the "
                                     "header is UTF-8 JSON)", op, path, names[i]);
        if (ctpu_ndim(tensors[i]) < 0)     /* "ndim: t is <why>" */
            return ctpu_report_error(ctpu_last_status(), "%s: %s: tensor '" NM "' is %s", op, path, names[i],
                                     ctpu_last_error() + 11);
    }
    return CTPU_OK;
}

/* One tensor's header entry: dtype, shape and data_offsets [at, at + bytes). */
static bool save_entry(cJSON *root, const char *name, ctpu_tensor t, uint64_t at, uint64_t bytes)
{
    int64_t s[CTPU_MAX_DIMS];
    int nd = 0;
    ctpu_shape(t, s, &nd);
    char num[2][32];
    snprintf(num[0], sizeof num[0], "%llu", (unsigned long long)at);
    snprintf(num[1], sizeof num[1], "%llu", (unsigned long long)(at + bytes));
    cJSON *e = cJSON_CreateObject(), *sh = cJSON_CreateArray(), *of = cJSON_CreateArray();
    bool ok = e && sh && of && cJSON_AddStringToObject(e, "dtype", st_dtype_name(ctpu_dtype_of(t)));
    for (int d = 0; ok && d < nd; d++) {
        char x[32];
        snprintf(x, sizeof x, "%lld", (long long)s[d]);
        cJSON *r = cJSON_CreateRaw(x);   /* integers verbatim: never "1e+15" */
        ok = r && cJSON_AddItemToArray(sh, r);
    }
    for (int d = 0; ok && d < 2; d++) {
        cJSON *r = cJSON_CreateRaw(num[d]);
        ok = r && cJSON_AddItemToArray(of, r);
    }
    ok = ok && cJSON_AddItemToObject(e, "shape", sh);
    if (ok) sh = NULL;
    ok = ok && cJSON_AddItemToObject(e, "data_offsets", of);
    if (ok) of = NULL;
    ok = ok && cJSON_AddItemToObject(root, name, e);
    if (ok) e = NULL;
    cJSON_Delete(e);
    cJSON_Delete(sh);
    cJSON_Delete(of);
    return ok;
}

/* The header as JSON text, tensors in data order `ord`; *max_bytes gets the
 * largest tensor's size. NULL when out of host memory. */
static char *save_header(int n, const char *const *names, const ctpu_tensor *tensors, int n_meta,
                         const char *const *meta, const int *ord, uint64_t *max_bytes)
{
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; m && i < n_meta; i++)
            if (!cJSON_AddStringToObject(m, meta[2 * i], meta[2 * i + 1])) m = NULL;
        ok = m != NULL;
    }
    uint64_t at = 0;
    *max_bytes = 0;
    for (int j = 0; ok && j < n; j++) {
        int i = ord[j];
        uint64_t bytes = (uint64_t)ctpu_numel(tensors[i]) * elem_size(ctpu_dtype_of(tensors[i]));
        ok = save_entry(root, names[i], tensors[i], at, bytes);
        at += bytes;
        if (bytes > *max_bytes) *max_bytes = bytes;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return json;
}

/* Creates a temporary file beside path (its name in tmp); -1 on error, reported. */
static int save_tmp_open(const char *op, const char *path, char *tmp, size_t tmp_len)
{
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        snprintf(tmp, tmp_len, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&g_tmp_counter, 1));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        ctpu_report_error(CTPU_ERR_IO, "%s: %s: cannot create the temporary file %s: %s", op, path, tmp,
                          strerror(errno));
        tmp[0] = 0;
    }
    return fd;
}

/* Writes the header (buf holds its 8 + hn bytes) and every tensor's data in
 * order `ord` through buf, then fsyncs. */
static ctpu_status save_write(const char *op, const char *path, int fd, char *buf, size_t hn, int n,
                              const char *const *names, const ctpu_tensor *tensors, const int *ord)
{
    ctpu_status st;
    if (!write_all(fd, buf, 8 + hn))
        return ctpu_report_error(CTPU_ERR_IO, "%s: %s: writing the header: %s", op, path, strerror(errno));
    for (int j = 0; j < n; j++) {
        int i = ord[j];
        uint64_t bytes = (uint64_t)ctpu_numel(tensors[i]) * elem_size(ctpu_dtype_of(tensors[i]));
        if ((st = ctpu_to_host(tensors[i], buf, (size_t)bytes)) != CTPU_OK)
            return ctpu_report_error(st, "%s: %s: tensor '" NM "': %s", op, path, names[i], ctpu_last_error());
        if (!write_all(fd, buf, (size_t)bytes))
            return ctpu_report_error(CTPU_ERR_IO, "%s: %s: tensor '" NM "': writing %llu bytes: %s", op, path, names[i],
                                     (unsigned long long)bytes, strerror(errno));
    }
    if (fsync(fd) != 0) return ctpu_report_error(CTPU_ERR_IO, "%s: %s: fsync: %s", op, path, strerror(errno));
    return CTPU_OK;
}

/* The rename made durable: fsync the directory that holds path. */
static void fsync_dir_of(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path < 4095 ? slash - path : 4095), path);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

ctpu_status ctpu_save_ex(const char *path, int n, const char *const *names, const ctpu_tensor *tensors, int n_meta,
                         const char *const *meta)
{
    const char *op = "save";
    ctpu_status st = save_check_args(op, path, n, names, tensors, n_meta, meta);
    if (st != CTPU_OK) return st;
    /* data order: wider elements first (4-byte before 2-byte), so each tensor
     * starts aligned to its element size; otherwise as given */
    int *ord = malloc(sizeof(int) * (size_t)(n ? n : 1));
    char *json = NULL, *buf = NULL;
    int fd = -1;
    char tmp[4096 + 64];
    tmp[0] = 0;
    uint64_t max_bytes = 0;
    if (ord) {
        int k = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int i = 0; i < n; i++)
                if ((elem_size(ctpu_dtype_of(tensors[i])) == 4) == (pass == 0)) ord[k++] = i;
        json = save_header(n, names, tensors, n_meta, meta, ord, &max_bytes);
    }
    if (!json) { st = ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory", op, path); goto done; }
    size_t jn = strlen(json);
    size_t hn = (jn + 7) / 8 * 8;   /* spaces up to 8-byte alignment of the data section */
    if (hn > ST_MAX_HEADER) {
        st = ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s: the header would have %zu bytes, above the %llu-byte "
                               "limit", op, path, hn, ST_MAX_HEADER);
        goto done;
    }
    buf = malloc(max_bytes > 8 + hn ? (size_t)max_bytes : 8 + hn);
    if (!buf) { st = ctpu_report_error(CTPU_ERR_OOM, "%s: %s: out of host memory", op, path); goto done; }
    for (int b = 0; b < 8; b++) buf[b] = (char)(((uint64_t)hn >> (8 * b)) & 0xff);
    memcpy(buf + 8, json, jn);
    memset(buf + 8 + jn, ' ', hn - jn);
    if ((fd = save_tmp_open(op, path, tmp, sizeof tmp)) < 0) { st = CTPU_ERR_IO; goto done; }
    if ((st = save_write(op, path, fd, buf, hn, n, names, tensors, ord)) != CTPU_OK) goto done;
    int cr = close(fd);
    fd = -1;
    if (cr != 0 || rename(tmp, path) != 0) {
        st = ctpu_report_error(CTPU_ERR_IO, "%s: %s: %s: %s", op, path, cr ? "close" : "renaming the temporary file",
                               strerror(errno));
        goto done;
    }
    tmp[0] = 0;
    fsync_dir_of(path);
done:
    if (fd >= 0) close(fd);
    if (tmp[0]) unlink(tmp);
    free(buf);
    cJSON_free(json);
    free(ord);
    return st;
}

ctpu_status ctpu_save(const char *path, int n, const char *const *names, const ctpu_tensor *tensors)
{
    return ctpu_save_ex(path, n, names, tensors, 0, NULL);
}
