/* ctpu-report: render ctpu metrics files (TORCH_TPU_METRICS_FILE).
 *
 *   ctpu-report [--format text|markdown|json] RUN.json [MORE.json ...]
 *   ctpu-report --compare A.json B.json [--format ...]
 *   ctpu-report --plot OUT.svg RUN.json [MORE.json ...]
 *
 * Prints each run's cache report and cost table (the same text as
 * ctpu_cache_report), two runs side by side, or an SVG of compiles and
 * cache hits over steps. Exit status: 0 ok, 1 usage, 2 a file that cannot
 * be read or is not a (complete) ctpu metrics JSON document. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctpu.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: ctpu-report [--format text|markdown|json] RUN.json [MORE.json ...]\n"
               "       ctpu-report --compare A.json B.json [--format text|markdown|json]\n"
               "       ctpu-report --plot OUT.svg RUN.json [MORE.json ...]\n");
}

/* The whole file, NUL-terminated; NULL with a message on stderr. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "ctpu-report: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (n < cap - 1) break;
        if (cap > ((size_t)1 << 30)) { free(buf); buf = NULL; break; }
        char *nb = realloc(buf, cap * 2);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
        cap *= 2;
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "ctpu-report: %s: %s\n", path, buf ? "read error" : "too large or out of memory");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (strlen(buf) != n) {
        fprintf(stderr, "ctpu-report: %s: not a JSON text file (NUL byte at offset %zu)\n", path, strlen(buf));
        free(buf);
        return NULL;
    }
    return buf;
}

int main(int argc, char **argv)
{
    ctpu_report_format fmt = CTPU_REPORT_TEXT;
    const char *plot = NULL;
    bool compare = false;
    const char *files[64];
    int nf = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--format") == 0 || strncmp(a, "--format=", 9) == 0) {
            const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) { usage(stderr); return 1; }
            if (strcmp(v, "text") == 0) fmt = CTPU_REPORT_TEXT;
            else if (strcmp(v, "markdown") == 0 || strcmp(v, "md") == 0) fmt = CTPU_REPORT_MARKDOWN;
            else if (strcmp(v, "json") == 0) fmt = CTPU_REPORT_JSON;
            else {
                fprintf(stderr, "ctpu-report: --format %s: use text, markdown or json\n", v);
                return 1;
            }
        } else if (strcmp(a, "--compare") == 0) {
            compare = true;
        } else if (strcmp(a, "--plot") == 0) {
            if (i + 1 >= argc) { usage(stderr); return 1; }
            plot = argv[++i];
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "ctpu-report: unknown option %s\n", a);
            usage(stderr);
            return 1;
        } else {
            if (nf == 64) { fprintf(stderr, "ctpu-report: at most 64 files\n"); return 1; }
            files[nf++] = a;
        }
    }
    if (nf == 0 || (compare && nf != 2) || (plot && nf > 16)) {
        if (compare && nf != 2) fprintf(stderr, "ctpu-report: --compare takes exactly two files (got %d)\n", nf);
        else if (plot && nf > 16) fprintf(stderr, "ctpu-report: --plot takes at most 16 files\n");
        usage(stderr);
        return 1;
    }
    char *text[64] = { 0 };
    int rc = 0;
    for (int i = 0; i < nf; i++) {
        text[i] = slurp(files[i]);
        if (!text[i]) { rc = 2; goto done; }
    }
    if (plot) {
        FILE *f = fopen(plot, "w");
        if (!f) {
            fprintf(stderr, "ctpu-report: %s: %s\n", plot, strerror(errno));
            rc = 2;
            goto done;
        }
        ctpu_status st = ctpu_report_plot_svg(nf, (const char *const *)text, files, f);
        if (fclose(f) != 0 && st == CTPU_OK) {
            fprintf(stderr, "ctpu-report: %s: write failed\n", plot);
            rc = 2;
        }
        if (st != CTPU_OK) {
            fprintf(stderr, "ctpu-report: %s\n", ctpu_last_error());
            remove(plot);
            rc = 2;
        }
        goto done;
    }
    if (compare) {
        if (ctpu_report_compare(text[0], files[0], text[1], files[1], fmt, stdout) != CTPU_OK) {
            fprintf(stderr, "ctpu-report: %s\n", ctpu_last_error());
            rc = 2;
        }
        goto done;
    }
    /* several files as JSON: one array */
    if (fmt == CTPU_REPORT_JSON && nf > 1) printf("[\n");
    for (int i = 0; i < nf; i++) {
        if (i > 0) printf(fmt == CTPU_REPORT_JSON ? ",\n" : "\n");
        if (ctpu_report_render(text[i], files[i], fmt, stdout) != CTPU_OK) {
            fprintf(stderr, "ctpu-report: %s\n", ctpu_last_error());
            rc = 2;
            goto done;
        }
    }
    if (fmt == CTPU_REPORT_JSON && nf > 1) printf("]\n");
done:
    for (int i = 0; i < nf; i++) free(text[i]);
    return rc;
}
