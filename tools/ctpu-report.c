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
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctpu.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: ctpu-report [--format text|markdown|json] RUN.json [MORE.json ...]\n"
               "       ctpu-report --compare A.json B.json [--format text|markdown|json]\n"
               "       ctpu-report --plot OUT.svg RUN.json [MORE.json ...]\n"
               "       ctpu-report --help | --version\n"
               "Options take their value as --opt VALUE or --opt=VALUE.\n");
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
    enum { O_FORMAT = 256, O_COMPARE, O_PLOT, O_VERSION };
    static const struct option longopts[] = {
        { "format", required_argument, NULL, O_FORMAT }, { "compare", no_argument, NULL, O_COMPARE },
        { "plot", required_argument, NULL, O_PLOT },     { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, O_VERSION },     { NULL, 0, NULL, 0 },
    };
    opterr = 0;
    int c;
    /* getopt_long: --format json, --format=json, -f json; options may follow the files */
    while ((c = getopt_long(argc, argv, ":hf:", longopts, NULL)) != -1) {
        switch (c) {
        case 'f':
        case O_FORMAT:
            if (strcmp(optarg, "text") == 0) fmt = CTPU_REPORT_TEXT;
            else if (strcmp(optarg, "markdown") == 0 || strcmp(optarg, "md") == 0) fmt = CTPU_REPORT_MARKDOWN;
            else if (strcmp(optarg, "json") == 0) fmt = CTPU_REPORT_JSON;
            else {
                fprintf(stderr, "ctpu-report: --format %s: use text, markdown or json\n", optarg);
                return 1;
            }
            break;
        case O_COMPARE: compare = true; break;
        case O_PLOT: plot = optarg; break;
        case 'h': usage(stdout); return 0;
        case O_VERSION: printf("ctpu-report (ctpu %s)\n", ctpu_version()); return 0;
        case ':':
            fprintf(stderr, "ctpu-report: %s needs a value\n", argv[optind - 1]);
            usage(stderr);
            return 1;
        default:
            fprintf(stderr, "ctpu-report: unknown option %s\n", argv[optind - 1]);
            usage(stderr);
            return 1;
        }
    }
    for (int i = optind; i < argc; i++) {
        if (nf == 64) { fprintf(stderr, "ctpu-report: at most 64 files\n"); return 1; }
        files[nf++] = argv[i];
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
