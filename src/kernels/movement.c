/* Data movement: generic strided copy and embedding gather. */
#include <assert.h>
#include <string.h>
#include "internal.h"

/* Copy one element of esize bytes. */
static inline void mv_copy1(char *d, const char *s, size_t esize)
{
    switch (esize) {
    case 1: *d = *s; break;
    case 2: memcpy(d, s, 2); break;
    case 4: memcpy(d, s, 4); break;
    case 8: memcpy(d, s, 8); break;
    default: memcpy(d, s, esize); break;
    }
}

/* Innermost run of n elements: memcpy when both sides are contiguous, a fill
 * when the source is broadcast, else element by element. Strides in elements. */
static void mv_run(char *d, int64_t ds, const char *s, int64_t ss, int64_t n, size_t esize)
{
    if (ds == 1 && ss == 1) {
        memcpy(d, s, (size_t)n * esize);
    } else if (ss == 0 && esize == 4 && ds == 1) {
        uint32_t v;
        memcpy(&v, s, 4);
        uint32_t *d4 = (uint32_t *)(void *)d;
        if (((uintptr_t)d & 3) == 0)
            for (int64_t i = 0; i < n; i++) d4[i] = v;
        else
            for (int64_t i = 0; i < n; i++) memcpy(d + i * 4, &v, 4);
    } else {
        int64_t db = ds * (int64_t)esize, sb = ss * (int64_t)esize;
        for (int64_t i = 0; i < n; i++) mv_copy1(d + i * db, s + i * sb, esize);
    }
}

/* shape [ndim], strides in elements. Dims of extent 1 are dropped and adjacent
 * dims that are contiguous with each other on both sides are merged, so e.g. a
 * slice of whole rows becomes one memcpy per run. */
void ctpu_k_strided_copy(const void *src, const int64_t *src_strides, void *dst,
                         const int64_t *dst_strides, const int64_t *shape, int ndim, size_t esize)
{
    int64_t sh[8], ss[8], ds[8];
    int nd = 0;
    assert(ndim >= 0 && ndim <= 8);
    for (int k = 0; k < ndim; k++) {
        if (shape[k] == 0) return;
        if (shape[k] == 1) continue;
        if (nd > 0 && ss[nd - 1] == src_strides[k] * shape[k] &&
            ds[nd - 1] == dst_strides[k] * shape[k]) {
            sh[nd - 1] *= shape[k];          /* merge into the outer dim */
            ss[nd - 1] = src_strides[k];
            ds[nd - 1] = dst_strides[k];
            continue;
        }
        sh[nd] = shape[k]; ss[nd] = src_strides[k]; ds[nd] = dst_strides[k];
        nd++;
    }
    const char *s = src;
    char *d = dst;
    if (nd == 0) { mv_copy1(d, s, esize); return; }
    int64_t idx[8] = { 0 };
    int inner = nd - 1;
    int64_t eb = (int64_t)esize;
    for (;;) {
        int64_t so = 0, dof = 0;
        for (int k = 0; k < inner; k++) { so += idx[k] * ss[k]; dof += idx[k] * ds[k]; }
        mv_run(d + dof * eb, ds[inner], s + so * eb, ss[inner], sh[inner], esize);
        int k = inner - 1;
        while (k >= 0 && ++idx[k] == sh[k]) idx[k--] = 0;
        if (k < 0) break;
    }
}

/* w [V, D], idx [n], out [n, D]; elements of esize bytes. */
int64_t ctpu_k_embedding(const void *w, int64_t V, int64_t D, size_t esize, const int32_t *idx,
                         int64_t n, void *out, int64_t *bad_pos, int64_t *bad_val)
{
    size_t row = (size_t)D * esize;
    const char *wb = w;
    char *ob = out;
    int64_t nbad = 0;
    if (bad_pos) *bad_pos = -1;
    if (bad_val) *bad_val = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = idx[i];
        if (v < 0 || v >= V) {
            if (row) memset(ob + (size_t)i * row, 0, row);
            if (nbad++ == 0) {
                if (bad_pos) *bad_pos = i;
                if (bad_val) *bad_val = v;
            }
            continue;
        }
        if (row) memcpy(ob + (size_t)i * row, wb + (size_t)v * row, row);
    }
    return nbad;
}

/* Non-temporal copy (SSE2 streaming stores, part of x86-64's baseline):
 * the bytes of memcpy, written past the caches so a large output does not
 * first read its lines in (no read-for-ownership) nor evict the inputs.
 * The caller orders the stores with ctpu_k_stream_fence before another
 * thread or step reads dst. Elsewhere a plain copy. */
#if defined(__SSE2__)
#include <emmintrin.h>
void ctpu_k_stream_f32(float *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    while (i < n && ((uintptr_t)(dst + i) & 15) != 0) { dst[i] = src[i]; i++; }
    for (; i + 16 <= n; i += 16) {
        __m128 a = _mm_loadu_ps(src + i), b = _mm_loadu_ps(src + i + 4);
        __m128 c = _mm_loadu_ps(src + i + 8), d = _mm_loadu_ps(src + i + 12);
        _mm_stream_ps(dst + i, a);
        _mm_stream_ps(dst + i + 4, b);
        _mm_stream_ps(dst + i + 8, c);
        _mm_stream_ps(dst + i + 12, d);
    }
    for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
    for (; i < n; i++) dst[i] = src[i];
}
void ctpu_k_stream_fence(void) { _mm_sfence(); }
#else
void ctpu_k_stream_f32(float *dst, const float *src, int64_t n) { memcpy(dst, src, sizeof(float) * (size_t)n); }
void ctpu_k_stream_fence(void) {}
#endif
