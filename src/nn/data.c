/* Datasets: the idx reader (plain or gzip, through zlib, which reads both),
 * image sets, and a seeded batch iterator. Host code only. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "ctpu_nn.h"
#include "nn_internal.h"

/* ------------------------------------------------------------ idx */
#define IDX_MAX_BYTES (UINT64_C(1) << 34)   /* 16 GiB: a larger header is corrupt */

/* Read exactly n bytes; returns the count read (< n at end of file). -1 on
 * a stream error (message in *why). */
static int64_t read_n(gzFile f, void *dst, uint64_t n, const char **why)
{
    uint64_t got = 0;
    while (got < n) {
        unsigned chunk = n - got > (1u << 30) ? (1u << 30) : (unsigned)(n - got);
        int r = gzread(f, (char *)dst + got, chunk);
        if (r < 0) {
            int e;
            *why = gzerror(f, &e);
            return -1;
        }
        if (r == 0) break;
        got += (uint64_t)r;
    }
    int e;
    const char *m = gzerror(f, &e);
    if (e != Z_OK && e != Z_STREAM_END) { *why = m; return -1; }
    return (int64_t)got;
}

/* The data section: up to total bytes into *dst (malloc'd, NULL when out of
 * memory), in a buffer that grows as the bytes arrive, so a short or
 * corrupt file whose header claims 16 GiB never allocates them. Returns
 * the count read, -1 on a stream error (*why). */
static int64_t read_data(gzFile f, uint64_t total, uint8_t **dst, const char **why)
{
    uint64_t cap = total < (UINT64_C(1) << 20) ? total : (UINT64_C(1) << 20), got = 0;
    uint8_t *b = malloc(cap ? (size_t)cap : 1);
    while (b) {
        int64_t r = read_n(f, b + got, cap - got, why);
        if (r < 0) { *dst = b; return -1; }
        got += (uint64_t)r;
        if (got < cap || cap == total) break;   /* the end of the file, or all of the data */
        uint64_t nc = cap * 2 < total ? cap * 2 : total;
        uint8_t *nb = realloc(b, (size_t)nc);
        if (!nb) { free(b); b = NULL; break; }
        b = nb;
        cap = nc;
    }
    *dst = b;
    return (int64_t)got;
}

ctpu_status ctpu_idx_read(const char *path, ctpu_idx *out)
{
    if (!path || !out) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "idx_read: %s is NULL", path ? "out" : "path");
    memset(out, 0, sizeof *out);
    gzFile f = gzopen(path, "rb");
    if (!f) return ctpu_report_error(CTPU_ERR_IO, "idx_read: %s: cannot open: %s", path, strerror(errno));
    gzbuffer(f, 1 << 17);
    const char *why = NULL;
    uint8_t hdr[4 + 4 * 4];
    ctpu_status st = CTPU_OK;
    int64_t r = read_n(f, hdr, 4, &why);
    if (r != 4) {
        st = ctpu_report_error(CTPU_ERR_IO, "idx_read: %s: %s", path, r < 0 ? why : "truncated: shorter than the 4-byte magic");
        goto done;
    }
    if (hdr[0] != 0 || hdr[1] != 0) {
        st = ctpu_report_error(CTPU_ERR_IO, "idx_read: %s: wrong magic %02x %02x %02x %02x: an idx file starts 00 00 <type> <ndim>",
                               path, hdr[0], hdr[1], hdr[2], hdr[3]);
        goto done;
    }
    if (hdr[2] != 0x08) {
        st = ctpu_report_error(CTPU_ERR_IO, "idx_read: %s: element type 0x%02x is not supported (only 0x08, unsigned bytes)",
                               path, hdr[2]);
        goto done;
    }
    int nd = hdr[3];
    if (nd < 1 || nd > 4) {
        st = ctpu_report_error(CTPU_ERR_IO, "idx_read: %s: ndim=%d in the magic is outside [1, 4]", path, nd);
        goto done;
    }
    r = read_n(f, hdr + 4, (uint64_t)(4 * nd), &why);
    if (r != 4 * nd) {
        st = ctpu_report_error(CTPU_ERR_IO, "idx_read: %s: %s", path, r < 0 ? why : "truncated inside the header");
        goto done;
    }
    uint64_t total = 1;
    for (int d = 0; d < nd; d++) {
        const uint8_t *p = hdr + 4 + 4 * d;
        uint64_t e = ((uint64_t)p[0] << 24) | ((uint64_t)p[1] << 16) | ((uint64_t)p[2] << 8) | p[3];
        out->shape[d] = (int64_t)e;
        if (e && total > IDX_MAX_BYTES / e) total = IDX_MAX_BYTES + 1;
        else total *= e;
    }
    out->ndim = nd;
    if (total > IDX_MAX_BYTES) {
        st = ctpu_report_error(CTPU_ERR_IO, "idx_read: %s: the header's extents give more than 2^34 bytes: corrupt header", path);
        goto done;
    }
    r = read_data(f, total, &out->data, &why);
    if (!out->data) {
        st = ctpu_report_error(CTPU_ERR_OOM, "idx_read: %s: out of host memory for %llu bytes", path, (unsigned long long)total);
        goto done;
    }
    if (r < 0) {
        st = ctpu_report_error(CTPU_ERR_IO, "idx_read: %s: corrupt or truncated compressed data: %s", path, why);
        goto done;
    }
    if ((uint64_t)r != total) {
        char dims[96];
        size_t k = 0;
        for (int d = 0; d < nd; d++) k += (size_t)snprintf(dims + k, sizeof dims - k, d ? "x%lld" : "%lld", (long long)out->shape[d]);
        st = ctpu_report_error(CTPU_ERR_IO, "idx_read: %s: truncated: the header says %s (%llu bytes of data), the file has %lld",
                               path, dims, (unsigned long long)total, (long long)r);
        goto done;
    }
    uint8_t extra;
    r = read_n(f, &extra, 1, &why);
    if (r != 0) {
        st = ctpu_report_error(CTPU_ERR_IO, "idx_read: %s: %s", path,
                               r < 0 ? why : "trailing bytes after the data the header describes (count mismatch)");
        goto done;
    }
done:
    gzclose(f);
    if (st != CTPU_OK) ctpu_idx_free(out);
    return st;
}

void ctpu_idx_free(ctpu_idx *x)
{
    if (!x) return;
    free(x->data);
    memset(x, 0, sizeof *x);
}

/* ------------------------------------------------------------ image sets */
ctpu_status ctpu_image_set_load(const char *images_path, const char *labels_path, int64_t num_classes,
                                ctpu_image_set *out)
{
    if (!images_path || !labels_path || !out)
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "image_set_load: a NULL argument");
    memset(out, 0, sizeof *out);
    ctpu_idx im, lb;
    ctpu_status st = ctpu_idx_read(images_path, &im);
    if (st != CTPU_OK) return st;
    st = ctpu_idx_read(labels_path, &lb);
    if (st != CTPU_OK) { ctpu_idx_free(&im); return st; }
    if (im.ndim != 3 || lb.ndim != 1) {
        st = ctpu_report_error(CTPU_ERR_IO, "image_set_load: %s has %d dims, %s has %d: need images [N, rows, cols] and labels [N]",
                               images_path, im.ndim, labels_path, lb.ndim);
    } else if (im.shape[0] != lb.shape[0]) {
        st = ctpu_report_error(CTPU_ERR_IO, "image_set_load: count mismatch: %s has %lld images, %s has %lld labels",
                               images_path, (long long)im.shape[0], labels_path, (long long)lb.shape[0]);
    }
    int64_t n = im.shape[0], px = im.shape[1] * im.shape[2];
    for (int64_t i = 0; st == CTPU_OK && num_classes > 0 && i < n; i++)
        if (lb.data[i] >= num_classes)
            st = ctpu_report_error(CTPU_ERR_IO, "image_set_load: %s: label %d at position %lld is out of range [0, %lld)",
                                   labels_path, lb.data[i], (long long)i, (long long)num_classes);
    if (st == CTPU_OK) {
        out->images = malloc((size_t)(n * px > 0 ? n * px : 1) * sizeof(float));
        out->labels = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
        if (!out->images || !out->labels) {
            st = ctpu_report_error(CTPU_ERR_OOM, "image_set_load: out of host memory");
            ctpu_image_set_free(out);
        } else {
            for (int64_t i = 0; i < n * px; i++) out->images[i] = (float)im.data[i] / 255.0f;
            for (int64_t i = 0; i < n; i++) out->labels[i] = lb.data[i];
            out->n = n;
            out->rows = im.shape[1];
            out->cols = im.shape[2];
        }
    }
    ctpu_idx_free(&im);
    ctpu_idx_free(&lb);
    return st;
}

void ctpu_image_set_stats(const ctpu_image_set *s, double *mean, double *std)
{
    double sum = 0, sq = 0;
    int64_t n = s ? s->n * s->rows * s->cols : 0;
    for (int64_t i = 0; i < n; i++) sum += s->images[i];
    double m = n ? sum / (double)n : 0;
    for (int64_t i = 0; i < n; i++) { double d = s->images[i] - m; sq += d * d; }
    if (mean) *mean = m;
    if (std) *std = n ? sqrt(sq / (double)n) : 0;
}

void ctpu_image_set_normalize(ctpu_image_set *s, double mean, double std)
{
    if (!s || !(std > 0)) return;
    int64_t n = s->n * s->rows * s->cols;
    float m = (float)mean, sd = (float)std;
    for (int64_t i = 0; i < n; i++) s->images[i] = (s->images[i] - m) / sd;
}

void ctpu_image_set_free(ctpu_image_set *s)
{
    if (!s) return;
    free(s->images);
    free(s->labels);
    memset(s, 0, sizeof *s);
}

ctpu_status ctpu_image_set_batch(const ctpu_image_set *s, const int64_t *idx, int64_t n, ctpu_tensor *x,
                                 ctpu_tensor *y)
{
    if (!ctpu__nn_ready("image_set_batch")) return CTPU_ERR_NOT_INITIALIZED;
    if (!s || (!idx && n) || n < 0 || !x || !y)
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "image_set_batch: a NULL argument or n < 0");
    int64_t px = s->rows * s->cols;
    /* the rows' bytes: a product that overflows would make a short buffer the copies run past */
    uint64_t xbytes;
    if (px < 0 || __builtin_mul_overflow((uint64_t)n, (uint64_t)px * sizeof(float), &xbytes) || xbytes > SIZE_MAX / 2)
        return ctpu_report_error(CTPU_ERR_INVALID_ARG, "image_set_batch: n=%lld rows of %lld pixels: more than 2^63 "
                                 "bytes", (long long)n, (long long)px);
    float *xb = malloc(xbytes ? (size_t)xbytes : 1);
    int32_t *yb = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    ctpu_status st = CTPU_OK;
    if (!xb || !yb)
        st = ctpu_report_error(CTPU_ERR_OOM, "image_set_batch: n=%lld: out of host memory for %llu bytes", (long long)n,
                               (unsigned long long)xbytes);
    for (int64_t i = 0; st == CTPU_OK && i < n; i++) {
        if (idx[i] < 0 || idx[i] >= s->n) {
            st = ctpu_report_error(CTPU_ERR_INVALID_ARG, "image_set_batch: idx[%lld]=%lld is outside [0, %lld)",
                                   (long long)i, (long long)idx[i], (long long)s->n);
            break;
        }
        memcpy(xb + i * px, s->images + idx[i] * px, (size_t)px * sizeof(float));
        yb[i] = s->labels[idx[i]];
    }
    if (st == CTPU_OK) {
        int64_t xs[2] = { n, px };
        *x = ctpu_from_host(xb, CTPU_F32, 2, xs);
        *y = ctpu_from_host(yb, CTPU_I32, 1, &n);
        if (ctpu_is_null(*x) || ctpu_is_null(*y)) {
            st = ctpu_last_status();
            if (!ctpu_is_null(*x)) ctpu_release(*x);
            if (!ctpu_is_null(*y)) ctpu_release(*y);
            *x = *y = CTPU_NULL;
        }
    }
    free(xb);
    free(yb);
    return st;
}

/* ------------------------------------------------------------ batches */
struct ctpu_batch_iter {
    int64_t n, batch, pos, epoch, last_epoch;
    bool shuffle, drop_last, fresh;
    uint64_t seed;
    int64_t *perm;
};

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

ctpu_batch_iter *ctpu_batch_iter_create(int64_t n, int64_t batch, bool shuffle, bool drop_last, uint64_t seed)
{
    if (n < 0 || n > CTPU_BATCH_ITER_MAX_N || batch < 1) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "batch_iter_create: n=%lld batch=%lld: need 0 <= n <= 2^56 and batch >= 1",
                          (long long)n, (long long)batch);
        return NULL;
    }
    ctpu_batch_iter *it = calloc(1, sizeof *it);
    if (it) it->perm = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (!it || !it->perm) {
        if (it) free(it);
        ctpu_report_error(CTPU_ERR_OOM, "batch_iter_create: n=%lld: out of host memory for %llu bytes of indices",
                          (long long)n, (unsigned long long)(n ? n : 1) * 8ull);
        return NULL;
    }
    it->n = n;
    it->batch = batch;
    it->shuffle = shuffle;
    it->drop_last = drop_last;
    it->seed = seed;
    it->fresh = true;
    return it;
}

static void start_epoch(ctpu_batch_iter *it)
{
    for (int64_t i = 0; i < it->n; i++) it->perm[i] = i;
    if (it->shuffle) {
        uint64_t s = it->seed ^ (0xd1b54a32d192ed03ull * ((uint64_t)it->epoch + 1));
        for (int64_t i = it->n - 1; i > 0; i--) {
            uint64_t j = (uint64_t)(((unsigned __int128)splitmix64(&s) * (uint64_t)(i + 1)) >> 64);
            int64_t t = it->perm[i];
            it->perm[i] = it->perm[j];
            it->perm[j] = t;
        }
    }
    it->pos = 0;
    it->fresh = false;
}

int64_t ctpu_batch_iter_next(ctpu_batch_iter *it, const int64_t **idx)
{
    if (!it || !idx) { ctpu_report_error(CTPU_ERR_INVALID_ARG, "batch_iter_next: a NULL argument"); return 0; }
    if (it->fresh) start_epoch(it);
    int64_t left = it->n - it->pos;
    int64_t k = left < it->batch ? left : it->batch;
    if (k == 0 || (k < it->batch && it->drop_last)) {
        if (it->epoch < INT64_MAX) it->epoch++;   /* unreachable in practice: 2^62 epochs at most are restored */
        it->fresh = true;
        *idx = NULL;
        return 0;
    }
    *idx = it->perm + it->pos;
    it->pos += k;
    it->last_epoch = it->epoch;
    return k;
}

int64_t ctpu_batch_iter_batches_per_epoch(const ctpu_batch_iter *it)
{
    if (!it) return 0;
    /* ceil without n + batch - 1, which overflows for a batch near INT64_MAX */
    return it->n / it->batch + (!it->drop_last && it->n % it->batch != 0);
}

int64_t ctpu_batch_iter_epoch(const ctpu_batch_iter *it) { return it ? it->last_epoch : 0; }

ctpu_status ctpu_batch_iter_get_state(const ctpu_batch_iter *it, ctpu_batch_iter_state *out)
{
    if (!it || !out) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "batch_iter_get_state: %s is NULL", it ? "out" : "it");
    /* fresh: the next call starts epoch `epoch` at position 0 */
    *out = (ctpu_batch_iter_state){ .n = it->n, .batch = it->batch, .shuffle = it->shuffle, .drop_last = it->drop_last,
                                    .seed = it->seed, .epoch = it->epoch, .position = it->fresh ? 0 : it->pos };
    return CTPU_OK;
}

ctpu_status ctpu__batch_iter_check(const char *op, const ctpu_batch_iter *it, const ctpu_batch_iter_state *s)
{
    if (s->n != it->n || s->batch != it->batch || s->shuffle != it->shuffle || s->drop_last != it->drop_last ||
        s->seed != it->seed)
        return ctpu_report_error(CTPU_ERR_INVALID_ARG,
                                 "%s: the state is of an iterator over n=%lld batch=%lld shuffle=%d drop_last=%d "
                                 "seed=%llu, this one has n=%lld batch=%lld shuffle=%d drop_last=%d seed=%llu", op,
                                 (long long)s->n, (long long)s->batch, (int)s->shuffle, (int)s->drop_last,
                                 (unsigned long long)s->seed, (long long)it->n, (long long)it->batch,
                                 (int)it->shuffle, (int)it->drop_last, (unsigned long long)it->seed);
    if (s->epoch < 0 || s->epoch > CTPU_BATCH_ITER_MAX_EPOCH || s->position < 0 || s->position > it->n ||
        (s->position % it->batch && s->position != it->n))
        return ctpu_report_error(CTPU_ERR_INVALID_ARG,
                                 "%s: epoch=%lld position=%lld: need 0 <= epoch <= 2^62 and a position that is a multiple of "
                                 "the batch (%lld) or n (%lld)", op, (long long)s->epoch, (long long)s->position,
                                 (long long)it->batch, (long long)it->n);
    return CTPU_OK;
}

ctpu_status ctpu_batch_iter_set_state(ctpu_batch_iter *it, const ctpu_batch_iter_state *s)
{
    const char *op = "batch_iter_set_state";
    if (!it || !s) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "%s: %s is NULL", op, it ? "s" : "it");
    ctpu_status st = ctpu__batch_iter_check(op, it, s);
    if (st != CTPU_OK) return st;
    it->epoch = s->epoch;
    if (s->position == 0) {
        it->fresh = true;
        it->pos = 0;
        it->last_epoch = s->epoch > 0 ? s->epoch - 1 : 0;
    } else {
        start_epoch(it);   /* the epoch's order is a function of (seed, epoch) */
        it->pos = s->position;
        it->last_epoch = s->epoch;
    }
    return CTPU_OK;
}

void ctpu_batch_iter_free(ctpu_batch_iter *it)
{
    if (!it) return;
    free(it->perm);
    free(it);
}
