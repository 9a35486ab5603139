/* ctpu_print: a tensor as text in PyTorch's layout (torch/_tensor_str.py's
 * rules, written here from their description): one format for every element
 * (integers "3", integral floats "3.", otherwise 4 decimals, scientific when
 * the magnitudes span more than 1000x or leave [1e-4, 1e8]), right-aligned
 * to one width, rows wrapped at 80 columns, and past 1000 elements each dim
 * summarised by its first and last 3 entries around "...". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eager.h"

#define PRINT_THRESHOLD 1000  /* torch.set_printoptions(threshold=1000) */
#define PRINT_EDGE 3          /* edgeitems=3 */
#define PRINT_LINEWIDTH 80    /* linewidth=80 */

typedef struct {
    FILE *f;
    const double *v;          /* every element, row-major */
    int ndim;
    const int64_t *shape;
    int64_t stride[CTPU_MAX_DIMS];
    bool summarize, is_int, int_mode, sci;
    int width;
} printer;

static bool shown(const printer *p, int d, int64_t i)
{
    return !p->summarize || p->shape[d] <= 2 * PRINT_EDGE || i < PRINT_EDGE || i >= p->shape[d] - PRINT_EDGE;
}

static int fmt_one(const printer *p, double x, char *b, size_t n)
{
    if (isnan(x)) return snprintf(b, n, "nan");
    if (isinf(x)) return snprintf(b, n, x > 0 ? "inf" : "-inf");
    if (p->is_int) return snprintf(b, n, "%.0f", x);
    if (p->sci) return snprintf(b, n, "%.4e", x);
    if (p->int_mode) return snprintf(b, n, "%.0f.", x);
    return snprintf(b, n, "%.4f", x);
}

/* Visit the shown elements (for the formatter's statistics). */
static void scan(printer *p, int d, int64_t off, double *amax, double *amin, bool *all_int, int *nfin)
{
    if (d == p->ndim) {
        double x = p->v[off];
        if (!isfinite(x)) return;
        (*nfin)++;
        if (x != floor(x)) *all_int = false;
        double a = fabs(x);
        if (a > 0) {
            if (a > *amax) *amax = a;
            if (a < *amin) *amin = a;
        }
        return;
    }
    for (int64_t i = 0; i < p->shape[d]; i++)
        if (shown(p, d, i)) scan(p, d + 1, off + i * p->stride[d], amax, amin, all_int, nfin);
}

static void widths(printer *p, int d, int64_t off)
{
    if (d == p->ndim) {
        char b[64];
        int w = fmt_one(p, p->v[off], b, sizeof b);
        if (w > p->width) p->width = w;
        return;
    }
    for (int64_t i = 0; i < p->shape[d]; i++)
        if (shown(p, d, i)) widths(p, d + 1, off + i * p->stride[d]);
}

/* dim d, its "[" at column indent. */
static void emit(const printer *p, int d, int64_t off, int indent)
{
    fputc('[', p->f);
    int64_t n = p->shape[d];
    if (d == p->ndim - 1) {
        /* the last dim: elements, wrapped to the line width */
        int per_line = (PRINT_LINEWIDTH - indent - 1) / (p->width + 2);
        if (per_line < 1) per_line = 1;
        int on_line = 0;
        bool first = true;
        for (int64_t i = 0; i < n; i++) {
            if (!shown(p, d, i)) {
                if (i == PRINT_EDGE) {
                    fprintf(p->f, "%s...", first ? "" : ", ");
                    first = false;
                    on_line++;
                }
                continue;
            }
            if (!first) {
                if (on_line >= per_line) {
                    fprintf(p->f, ",\n%*s", indent + 1, "");
                    on_line = 0;
                } else {
                    fputs(", ", p->f);
                }
            }
            char b[64];
            fmt_one(p, p->v[off + i * p->stride[d]], b, sizeof b);
            fprintf(p->f, "%*s", p->width, b);
            first = false;
            on_line++;
        }
    } else {
        /* sub-tensors: ",\n" plus one blank line per dim below the next */
        int gaps = p->ndim - d - 1;
        bool first = true;
        for (int64_t i = 0; i < n; i++) {
            if (!shown(p, d, i)) {
                if (i == PRINT_EDGE) {
                    fputc(',', p->f);
                    for (int g = 0; g < gaps; g++) fputc('\n', p->f);
                    fprintf(p->f, "%*s...", indent + 1, "");
                    first = false;
                }
                continue;
            }
            if (!first) {
                fputc(',', p->f);
                for (int g = 0; g < gaps; g++) fputc('\n', p->f);
                fprintf(p->f, "%*s", indent + 1, "");
            }
            emit(p, d + 1, off + i * p->stride[d], indent + 1);
            first = false;
        }
    }
    fputc(']', p->f);
}

ctpu_status ctpu_print(ctpu_tensor t, FILE *f)
{
    if (!ctpu_check_init("print")) return CTPU_ERR_NOT_INITIALIZED;
    if (!f) f = stdout;
    int64_t shape[CTPU_MAX_DIMS];
    int nd;
    if (!ctpu_rec_get(t, "print", "t", false)) return ctpu_last_status();
    ctpu_status st = ctpu_shape(t, shape, &nd);
    if (st != CTPU_OK) return st;
    ctpu_dtype dt = ctpu_dtype_of(t);
    int64_t numel = ctpu_numel(t);
    size_t es = dt == CTPU_BF16 ? 2 : 4;
    void *raw = malloc(numel ? (size_t)numel * es : 1);
    double *v = malloc(numel ? (size_t)numel * sizeof(double) : sizeof(double));
    if (!raw || !v) {
        free(raw);
        free(v);
        ctpu_set_error(CTPU_ERR_OOM, "print: out of host memory for %lld elements", (long long)numel);
        return CTPU_ERR_OOM;
    }
    st = ctpu__to_host_op("print", t, raw, (size_t)numel * es);
    if (st != CTPU_OK) {
        free(raw);
        free(v);
        return st;
    }
    for (int64_t i = 0; i < numel; i++)
        v[i] = dt == CTPU_F32 ? (double)((float *)raw)[i]
             : dt == CTPU_BF16 ? (double)ctpu_bf16_to_f32(((uint16_t *)raw)[i]) : (double)((int32_t *)raw)[i];
    free(raw);

    printer p = { .f = f, .v = v, .ndim = nd, .shape = shape };
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) { p.stride[d] = s; s *= shape[d]; }
    p.summarize = numel > PRINT_THRESHOLD;
    p.is_int = dt == CTPU_I32;
    double amax = 0, amin = INFINITY;
    bool all_int = true;
    int nfin = 0;
    scan(&p, 0, 0, &amax, &amin, &all_int, &nfin);
    if (!p.is_int && nfin > 0) {
        p.int_mode = all_int;
        if (all_int) p.sci = amax > 1e8;
        else p.sci = (amin < INFINITY && amax / amin > 1000.0) || amax > 1e8 || (amin < INFINITY && amin < 1e-4);
    }
    char tail[160];
    size_t k = (size_t)snprintf(tail, sizeof tail, "shape=(");
    for (int d = 0; d < nd; d++) k += (size_t)snprintf(tail + k, sizeof tail - k, d ? ", %lld" : "%lld", (long long)shape[d]);
    snprintf(tail + k, sizeof tail - k, "%s), dtype=%s", nd == 1 ? "," : "", ctpu_dtype_name(dt));

    fputs("tensor(", f);
    if (nd == 0) {
        char b[64];
        fmt_one(&p, v[0], b, sizeof b);
        fputs(b, f);
    } else if (numel == 0) {
        fputs("[]", f);
    } else {
        widths(&p, 0, 0);
        emit(&p, 0, 0, (int)strlen("tensor("));
    }
    fprintf(f, ", %s)\n", tail);
    free(v);
    if (fflush(f) != 0 || ferror(f)) {   /* a buffered write fails only at the flush (e.g. /dev/full) */
        ctpu_set_error(CTPU_ERR_IO, "print: writing to the stream failed");
        return CTPU_ERR_IO;
    }
    return CTPU_OK;
}
