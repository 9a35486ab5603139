/* The environment (issues 10 and 11): the variables are declared once
 * (src/eager/env.h) and README.md's and docs/DESIGN.md's tables list exactly
 * them with the same defaults and effects; src/ reads no other variable of
 * ctpu's; a variable named like ctpu's but unknown gets one warning at
 * init naming the closest known one, a TorchTPU variable ctpu does not
 * implement one saying it has no effect, the reserved CTPU_TEST_ and
 * CTPU_BENCH_ prefixes none; the metrics and trace file paths are checked
 * at init, naming the variable and the reason. */
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "t_core.h"

#ifndef CTPU_SOURCE_ROOT
#error "CTPU_SOURCE_ROOT (tests/meson.build)"
#endif

extern char **environ;

static const struct { const char *name, *dflt, *doc; } vars[] = {
#define X(name, kind, dflt, doc) { #name, dflt, doc },
    CTPU_ENV_VARS(X)
#undef X
};
#define N_VARS ((int)(sizeof vars / sizeof vars[0]))

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f, "%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    ck_assert(b && fread(b, 1, (size_t)n, f) == (size_t)n);
    b[n] = 0;
    fclose(f);
    return b;
}

/* Every TORCH_TPU_ / CTPU_ variable of the outer environment goes (the
 * warnings must come from this test's variables only); CTPU_QUIET=1. */
static void env_clean(void)
{
    for (;;) {
        char name[256] = "";
        for (char **e = environ; *e; e++)
            if ((strncmp(*e, "TORCH_TPU_", 10) == 0 || strncmp(*e, "CTPU_", 5) == 0 || strncmp(*e, "TPU_", 4) == 0) &&
                strncmp(*e, "CTPU_TEST_", 10) != 0) {
                snprintf(name, sizeof name, "%.*s", (int)strcspn(*e, "="), *e);
                break;
            }
        if (!name[0]) break;
        unsetenv(name);
    }
    setenv("CTPU_QUIET", "1", 1);
}

/* What ctpu_init writes on stderr; *st its status. The runtime is shut down. */
static char *init_stderr(ctpu_status *st)
{
    char path[] = "/tmp/ctpu_env_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    *st = ctpu_init();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    ctpu_shutdown();
    char *txt = read_all(path);
    remove(path);
    return txt;
}

static void expect_stderr(const char *want)
{
    ctpu_status st;
    char *got = init_stderr(&st);
    ck_assert_msg(st == CTPU_OK, "init: %s", ctpu_last_error());
    ck_assert_msg(strcmp(got, want) == 0, "stderr at init:\n%s\nwanted:\n%s", got, want);
    free(got);
}

/* ---------------------------------------------------------------- declared once */
/* The rows of the markdown table whose header is "| variable | default |
 * effect |" in file: each must be the declared variable, in order. */
static void check_table(const char *file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", CTPU_SOURCE_ROOT, file);
    char *doc = read_all(path);
    const char *hdr = "\n| variable | default | effect |\n";
    char *t = strstr(doc, hdr);
    ck_assert_msg(t, "%s: no environment table (a line \"| variable | default | effect |\")", file);
    ck_assert_msg(!strstr(t + 1, hdr), "%s: two environment tables", file);
    char *line = strchr(t + 1, '\n') + 1;            /* the |---| line */
    ck_assert_msg(strncmp(line, "|---", 4) == 0, "%s: the table's second line", file);
    line = strchr(line, '\n') + 1;
    int i = 0;
    for (; *line == '|'; i++) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        char want[1024];
        if (i < N_VARS) snprintf(want, sizeof want, "| `%s` | %s | %s |", vars[i].name, vars[i].dflt, vars[i].doc);
        ck_assert_msg(i < N_VARS, "%s: row %d (%.*s) is not a variable of src/eager/env.h", file, i + 1, (int)n, line);
        ck_assert_msg(strlen(want) == n && strncmp(line, want, n) == 0,
                      "%s: row %d is\n%.*s\nsrc/eager/env.h declares\n%s", file, i + 1, (int)n, line, want);
        line = end ? end + 1 : line + n;
    }
    ck_assert_msg(i == N_VARS, "%s: the table has %d rows, src/eager/env.h declares %d (next: %s)", file, i, N_VARS,
                  i < N_VARS ? vars[i].name : "");
    free(doc);
}

START_TEST(docs_tables_match_the_declarations)
{
    check_table("README.md");
    check_table("docs/DESIGN.md");
}
END_TEST

/* Every variable of ctpu's that src/ reads by name (getenv("...")) is a
 * declared one (read_env itself reads them through the list). Returns the
 * number of getenv calls seen; undeclared names go into `where`. */
static int count_getenv(const char *dir, char *where, size_t wlen)
{
    DIR *d = opendir(dir);
    ck_assert_msg(d, "%s: %s", dir, strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        ck_assert_int_eq(stat(p, &st), 0);
        if (S_ISDIR(st.st_mode)) { n += count_getenv(p, where, wlen); continue; }
        size_t l = strlen(p);
        if (l < 2 || (strcmp(p + l - 2, ".c") != 0 && strcmp(p + l - 2, ".h") != 0)) continue;
        char *src = read_all(p);
        for (char *s = strstr(src, "getenv("); s; s = strstr(s + 1, "getenv(")) {
            n++;
            if (s[7] != '"') continue;
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)strcspn(s + 8, "\""), s + 8);
            if (strncmp(name, "TORCH_TPU_", 10) != 0 && strncmp(name, "CTPU_", 5) != 0) continue;
            bool known = false;
            for (int i = 0; i < N_VARS; i++) known |= strcmp(name, vars[i].name) == 0;
            if (known) continue;
            size_t k = strlen(where);
            snprintf(where + k, wlen - k, " %s in %s", name, p + strlen(CTPU_SOURCE_ROOT) + 1);
        }
        free(src);
    }
    closedir(d);
    return n;
}

START_TEST(every_variable_read_is_declared)
{
    char where[2048] = "";
    int n = count_getenv(CTPU_SOURCE_ROOT "/src", where, sizeof where);
    ck_assert_msg(n >= 1 && !where[0], "variables read but not declared in src/eager/env.h:%s", where);
    /* the tests' list is the declared one */
    ck_assert_int_eq(T_N_ENV, CTPU_ENV_COUNT);
    for (int i = 0; i < T_N_ENV; i++) ck_assert_str_eq(T_ENV_VARS[i], vars[i].name);
}
END_TEST

/* ---------------------------------------------------------------- unknown names */
START_TEST(misspelled_variable_gets_one_warning)
{
    env_clean();
    expect_stderr("");
    setenv("TORCH_TPU_DEFER_AND_FUSED", "1", 1);
    expect_stderr("ctpu: warning: TORCH_TPU_DEFER_AND_FUSED is not a ctpu variable; "
                  "did you mean TORCH_TPU_DEFER_AND_FUSE?\n");
    /* it really is ignored */
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert_int_eq(ctpu_get_mode(), CTPU_MODE_STRICT);
    ctpu_shutdown();
    /* CTPU_QUIET does not silence it (it silences the shutdown summary) */
    setenv("CTPU_QUIET", "1", 1);
    expect_stderr("ctpu: warning: TORCH_TPU_DEFER_AND_FUSED is not a ctpu variable; "
                  "did you mean TORCH_TPU_DEFER_AND_FUSE?\n");
    unsetenv("TORCH_TPU_DEFER_AND_FUSED");
    /* CTPU_ names, transpositions, a misspelt CTPU_QUIET itself */
    setenv("CTPU_NUM_THREAD", "2", 1);
    expect_stderr("ctpu: warning: CTPU_NUM_THREAD is not a ctpu variable; did you mean CTPU_NUM_THREADS?\n");
    unsetenv("CTPU_NUM_THREAD");
    setenv("CTPU_QUITE", "1", 1);
    expect_stderr("ctpu: warning: CTPU_QUITE is not a ctpu variable; did you mean CTPU_QUIET?\n");
    unsetenv("CTPU_QUITE");
    setenv("TORCH_TPU_HBM_LIMTI", "1G", 1);
    expect_stderr("ctpu: warning: TORCH_TPU_HBM_LIMTI is not a ctpu variable; did you mean TORCH_TPU_HBM_LIMIT?\n");
    unsetenv("TORCH_TPU_HBM_LIMTI");
    /* TorchTPU's own spelling of the mode switches (its env_vars.h) */
    setenv("TPU_LAUNCH_BLOCKING", "1", 1);
    expect_stderr("ctpu: warning: TPU_LAUNCH_BLOCKING is not a ctpu variable; did you mean TORCH_TPU_LAUNCH_BLOCKING?\n");
    unsetenv("TPU_LAUNCH_BLOCKING");
    /* a name that holds a newline stays one line */
    setenv("CTPU_BAD\nNAME", "1", 1);
    ctpu_status st;
    char *txt = init_stderr(&st);
    ck_assert_int_eq(st, CTPU_OK);
    ck_assert_msg(strncmp(txt, "ctpu: warning: CTPU_BAD?NAME is not a ctpu variable; did you mean ", 66) == 0 &&
                  strchr(txt, '\n') == txt + strlen(txt) - 1, "%s", txt);
    free(txt);
}
END_TEST

START_TEST(one_warning_per_variable_even_when_init_fails)
{
    env_clean();
    setenv("TORCH_TPU_CHIPS", "v5p", 1);
    setenv("TORCH_TPU_CACHESIZE", "8", 1);
    setenv("TORCH_TPU_CHIP", "v4", 1);         /* a bad value of a known variable: init fails */
    ctpu_status st;
    char *txt = init_stderr(&st);
    ck_assert_int_eq(st, CTPU_ERR_ENV);
    ck_assert(t_contains(ctpu_last_error(), "TORCH_TPU_CHIP=\"v4\""));
    int lines = 0;
    for (const char *c = txt; *c; c++) lines += *c == '\n';
    ck_assert_msg(lines == 2, "%s", txt);
    ck_assert(t_contains(txt, "ctpu: warning: TORCH_TPU_CHIPS is not a ctpu variable; did you mean TORCH_TPU_CHIP?\n"));
    ck_assert(t_contains(txt, "ctpu: warning: TORCH_TPU_CACHESIZE is not a ctpu variable; "
                              "did you mean TORCH_TPU_CACHE_SIZE?\n"));
    free(txt);
}
END_TEST

START_TEST(torchtpu_variables_have_no_effect)
{
    env_clean();
    setenv("TORCH_TPU_TIER2_COMPILATION_CACHE", "my_cache", 1);
    expect_stderr("ctpu: warning: TORCH_TPU_TIER2_COMPILATION_CACHE is a TorchTPU variable that has no effect in ctpu\n");
    unsetenv("TORCH_TPU_TIER2_COMPILATION_CACHE");
    setenv("TORCH_TPU_INTERNAL_XLA_OPTIONS", "a=b", 1);
    expect_stderr("ctpu: warning: TORCH_TPU_INTERNAL_XLA_OPTIONS is a TorchTPU variable that has no effect in ctpu\n");
    unsetenv("TORCH_TPU_INTERNAL_XLA_OPTIONS");
    setenv("TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS", "1", 1);
    expect_stderr("ctpu: warning: TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS is a TorchTPU variable that has no effect "
                  "in ctpu (ctpu reads TORCH_TPU_ENABLE_DEBUG_CHECKS)\n");
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert(!ctpu_debug_checks());
    ctpu_shutdown();
    unsetenv("TORCH_TPU_INTERNAL_ENABLE_DEBUG_CHECKS");
    setenv("TORCH_TPU_TOPOLOGY", "2x2x1", 1);
    expect_stderr("ctpu: warning: TORCH_TPU_TOPOLOGY is a TorchTPU variable that has no effect in ctpu\n");
}
END_TEST

START_TEST(reserved_and_foreign_names_are_quiet)
{
    env_clean();
    setenv("CTPU_TEST_ANYTHING", "1", 1);
    setenv("CTPU_BENCH_REEXEC", "1", 1);
    setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x", 1);
    setenv("PT_XLA_DEBUG", "1", 1);
    setenv("TORCHTPU_CHIP", "v5p", 1);
    setenv("TPU_WORKER_ID", "0", 1);
    setenv("ctpu_quiet", "1", 1);
    expect_stderr("");
    /* every declared variable, set to a valid value, is quiet too */
    setenv("TORCH_TPU_DETECT_LOOPS", "on", 1);
    setenv("TORCH_TPU_CACHE_ONLY", "", 1);
    setenv("CTPU_NUM_THREADS", "2", 1);
    expect_stderr("");
}
END_TEST

/* ---------------------------------------------------------------- output paths */
static void expect_path_error(const char *var, const char *path, const char *reason)
{
    env_clean();
    setenv(var, path, 1);
    ctpu_clear_error();
    ck_assert_int_eq(ctpu_init(), CTPU_ERR_ENV);
    const char *m = ctpu_last_error();
    char want[512];
    snprintf(want, sizeof want, "ctpu_init: %s=\"%s\" cannot be written: ", var, path);
    ck_assert_msg(strncmp(m, want, strlen(want)) == 0 && t_contains(m, reason), "%s (wanted %s...%s)", m, want,
                  reason);
    ck_assert(!ctpu_is_initialized());
    unsetenv(var);
}

START_TEST(output_paths_are_checked_at_init)
{
    char dir[] = "/tmp/ctpu_paths_XXXXXX", file[128], p[256];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(file, sizeof file, "%s/plain", dir);
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    const char *const names[] = { "TORCH_TPU_METRICS_FILE", "TORCH_TPU_TRACE_FILE" };
    for (int k = 0; k < 2; k++) {
        const char *v = names[k];
        expect_path_error(v, "/nonexistent-dir/out.json", "directory \"/nonexistent-dir\": No such file or directory");
        ck_assert_str_eq(ctpu_last_error(), k == 0 ? "ctpu_init: TORCH_TPU_METRICS_FILE=\"/nonexistent-dir/out.json\" "
                                                     "cannot be written: directory \"/nonexistent-dir\": No such file "
                                                     "or directory"
                                                   : "ctpu_init: TORCH_TPU_TRACE_FILE=\"/nonexistent-dir/out.json\" "
                                                     "cannot be written: directory \"/nonexistent-dir\": No such file "
                                                     "or directory");
        expect_path_error(v, dir, strerror(EISDIR));                 /* the path is a directory */
        snprintf(p, sizeof p, "%s/out.json", file);
        expect_path_error(v, p, strerror(ENOTDIR));                  /* a file where a directory should be */
        snprintf(p, sizeof p, "%s/no/out.json", dir);
        expect_path_error(v, p, "No such file or directory");
        /* the kernel's pseudo-filesystems: root opens /proc/version, the
         * write fails at shutdown; refused at init, a file or a new one */
        struct stat pst;
        if (stat("/proc/version", &pst) == 0) {
            expect_path_error(v, "/proc/version", "on the kernel's proc pseudo-filesystem");
            expect_path_error(v, "/proc/ctpu-out.json", "");   /* (root: proc; others: EACCES) */
        }
        if (stat("/sys/kernel", &pst) == 0) expect_path_error(v, "/sys/kernel/ctpu-out.json", "");
        env_clean();
        setenv(v, "/dev/null", 1);                                   /* a device is fine */
        ck_assert_msg(ctpu_init() == CTPU_OK, "%s", ctpu_last_error());
        ctpu_shutdown();
        if (geteuid() != 0) {                                        /* root may write anywhere */
            snprintf(p, sizeof p, "%s/ro", dir);
            ck_assert_int_eq(mkdir(p, 0500), 0);
            snprintf(p, sizeof p, "%s/ro/out.json", dir);
            expect_path_error(v, p, strerror(EACCES));
            snprintf(p, sizeof p, "%s/ro", dir);
            rmdir(p);
        }
        /* good ones: a new file in a writable directory, an existing file,
         * a bare name (the current directory), empty (unset) */
        env_clean();
        snprintf(p, sizeof p, "%s/out%d.json", dir, k);
        setenv(v, p, 1);
        ck_assert_msg(ctpu_init() == CTPU_OK, "%s", ctpu_last_error());
        ctpu_shutdown();
        struct stat st;
        ck_assert_msg(stat(p, &st) == 0 && st.st_size > 0, "%s was not written", p);
        remove(p);
        setenv(v, file, 1);
        ck_assert_msg(ctpu_init() == CTPU_OK, "%s", ctpu_last_error());
        ctpu_shutdown();
        ck_assert_int_eq(chdir(dir), 0);
        setenv(v, "bare.json", 1);
        ck_assert_msg(ctpu_init() == CTPU_OK, "%s", ctpu_last_error());
        ctpu_shutdown();
        remove("bare.json");
        setenv(v, "", 1);
        ck_assert_int_eq(ctpu_init(), CTPU_OK);
        ctpu_shutdown();
        unsetenv(v);
    }
    remove(file);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("env");
    TCase *t = tcase_create("env");
    tcase_set_timeout(t, 120);
    tcase_add_test(t, docs_tables_match_the_declarations);
    tcase_add_test(t, every_variable_read_is_declared);
    tcase_add_test(t, misspelled_variable_gets_one_warning);
    tcase_add_test(t, one_warning_per_variable_even_when_init_fails);
    tcase_add_test(t, torchtpu_variables_have_no_effect);
    tcase_add_test(t, reserved_and_foreign_names_are_quiet);
    tcase_add_test(t, output_paths_are_checked_at_init);
    suite_add_tcase(s, t);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
