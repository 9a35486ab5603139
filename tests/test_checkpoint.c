/* Checkpoints (issue 21): safetensors save / load / listing, bad files
 * (each a one-line error naming the file and the tensor, no tensor changed),
 * a mutation fuzz over headers, optimizer and batch-iterator state, and the
 * resume test: stopping after N steps (a new runtime, a differently seeded
 * model) and resuming gives bit-identical losses to the unbroken run, in
 * strict, debug and defer-and-fuse modes, with AdamW, the cosine schedule
 * and dropout. Interop with bench/check_safetensors.py (numpy) when
 * CTPU_TEST_PYTHON can import numpy. */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "t_core.h"
#include "ctpu_nn.h"

static char dir[64];

static void setup(void)
{
    t_setup();
    snprintf(dir, sizeof dir, "/tmp/ctpu_ckpt_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
    t_teardown();
}

static const char *at(const char *name)
{
    static char p[8][256];
    static int k;
    char *s = p[k++ % 8];
    snprintf(s, 256, "%s/%s", dir, name);
    return s;
}

/* Files in dir whose name contains part. */
static int count_files(const char *part)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, part)) n++;
    if (d) closedir(d);
    return n;
}

static void *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc((size_t)n + 1);
    ck_assert_uint_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* A file: header length hn (or strlen(json) when hn is UINT64_MAX), json, data. */
static void write_st(const char *path, uint64_t hn, const char *json, const void *data, size_t dlen)
{
    size_t jn = strlen(json);
    if (hn == UINT64_MAX) hn = jn;
    if (hn == UINT64_MAX - 1) hn = jn + 1;   /* one byte of the data (a NUL of 1.0f) in the header */
    unsigned char *b = malloc(8 + jn + dlen + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hn >> (8 * i));
    memcpy(b + 8, json, jn);
    if (dlen) memcpy(b + 8 + jn, data, dlen);
    spit(path, b, 8 + jn + dlen);
    free(b);
}

static bool same_bits(ctpu_tensor a, ctpu_tensor b)
{
    int64_t na, nb;
    void *x = t_read_raw(a, &na), *y = t_read_raw(b, &nb);
    size_t es = ctpu_dtype_of(a) == CTPU_BF16 ? 2 : 4;
    bool same = na == nb && ctpu_dtype_of(a) == ctpu_dtype_of(b) && !memcmp(x, y, (size_t)na * es);
    free(x);
    free(y);
    return same;
}

/* The error is one line and names the file (and the tensor, when given). */
static void check_msg(const char *path, const char *tensor, const char *part)
{
    const char *m = ctpu_last_error();
    ck_assert_msg(!strchr(m, '\n'), "two lines: %s", m);
    ck_assert_msg(strstr(m, path), "the message does not name %s: %s", path, m);
    if (tensor) {
        char q[128];
        snprintf(q, sizeof q, "'%s'", tensor);
        ck_assert_msg(strstr(m, q), "the message does not name tensor %s: %s", tensor, m);
    }
    if (part) ck_assert_msg(strstr(m, part), "the message lacks '%s': %s", part, m);
}

/* -------------------------------------------------------------- round trip */
static ctpu_tensor make(ctpu_dtype dt, int nd, const int64_t *s, int salt)
{
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= s[d];
    void *b = malloc((size_t)(n ? n : 1) * 4);
    for (int64_t i = 0; i < n; i++) {
        float v = (float)((i * 7 + salt) % 23 - 11) * 0.3f;
        if (dt == CTPU_F32) ((float *)b)[i] = v;
        else if (dt == CTPU_BF16) ((uint16_t *)b)[i] = (uint16_t)(t_f2u(v) >> 16);
        else ((int32_t *)b)[i] = (int32_t)(i * 1000003 - 77 * salt);
    }
    ctpu_tensor t = ctpu_from_host(b, dt, nd, s);
    free(b);
    ck_assert(!ctpu_is_null(t));
    return t;
}

#define N_RT 6
static const char *const RT_NAMES[N_RT] = { "w", "b.bf16", "idx", "scalar", "empty", "deep/odd" };
static const ctpu_dtype RT_DT[N_RT] = { CTPU_F32, CTPU_BF16, CTPU_I32, CTPU_F32, CTPU_F32, CTPU_BF16 };
static const int RT_ND[N_RT] = { 2, 1, 1, 0, 2, 3 };
static const int64_t RT_SHAPE[N_RT][3] = { { 2, 3 }, { 5 }, { 4 }, { 0 }, { 0, 3 }, { 3, 1, 3 } };

static void make_rt(ctpu_tensor *t, int salt)
{
    for (int i = 0; i < N_RT; i++) t[i] = make(RT_DT[i], RT_ND[i], RT_SHAPE[i], salt + i);
}

START_TEST(t_roundtrip)
{
    ctpu_tensor src[N_RT], dst[N_RT];
    make_rt(src, 1);
    make_rt(dst, 50);
    const char *meta[] = { "format", "pt", "note", "caf\xc3\xa9 \"quoted\"\\" };
    const char *p = at("rt.safetensors");
    ck_assert_msg(ctpu_save_ex(p, N_RT, RT_NAMES, src, 2, meta) == CTPU_OK, "%s", ctpu_last_error());
    ck_assert_int_eq(count_files(".tmp."), 0);
    /* the layout: header padded to 8 bytes, 4-byte tensors first */
    size_t len;
    unsigned char *raw = slurp(p, &len);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = hn << 8 | raw[i];
    ck_assert_uint_eq((8 + hn) % 8, 0);
    ck_assert_int_eq(raw[8], '{');
    free(raw);

    ctpu_safetensors *f = ctpu_safetensors_open(p);
    ck_assert_msg(f != NULL, "%s", ctpu_last_error());
    int n;
    const ctpu_safetensors_entry *e = ctpu_safetensors_entries(f, &n);
    ck_assert_int_eq(n, N_RT);
    for (int i = 0; i < N_RT; i++) {
        int k = ctpu_safetensors_find(f, RT_NAMES[i]);
        ck_assert_int_ge(k, 0);
        ck_assert_str_eq(e[k].name, RT_NAMES[i]);
        ck_assert_int_eq(e[k].dtype, RT_DT[i]);
        ck_assert_int_eq(e[k].ndim, RT_ND[i]);
        for (int d = 0; d < RT_ND[i]; d++) ck_assert_int_eq(e[k].shape[d], RT_SHAPE[i][d]);
        ck_assert_uint_eq(e[k].offset % (RT_DT[i] == CTPU_BF16 ? 2 : 4), 0);
        if (RT_DT[i] != CTPU_BF16)   /* every 4-byte tensor precedes every bf16 one */
            for (int j = 0; j < N_RT; j++)
                if (RT_DT[j] == CTPU_BF16 && e[ctpu_safetensors_find(f, RT_NAMES[j])].nbytes)
                    ck_assert_uint_lt(e[k].offset, e[ctpu_safetensors_find(f, RT_NAMES[j])].offset + 1);
        /* a new tensor from the listing */
        ctpu_tensor t = ctpu_safetensors_tensor(f, RT_NAMES[i]);
        ck_assert_msg(!ctpu_is_null(t), "%s", ctpu_last_error());
        ck_assert_msg(same_bits(t, src[i]), "tensor %s differs", RT_NAMES[i]);
    }
    ck_assert_int_eq(ctpu_safetensors_find(f, "nope"), -1);
    ck_assert_int_eq(ctpu_safetensors_metadata_count(f), 2);
    ck_assert_str_eq(ctpu_safetensors_metadata(f, "format"), "pt");
    ck_assert_str_eq(ctpu_safetensors_metadata(f, "note"), meta[3]);
    const char *k, *v;
    ck_assert_int_eq(ctpu_safetensors_metadata_at(f, 1, &k, &v), CTPU_OK);
    ck_assert_str_eq(k, "note");
    ck_assert_int_eq(ctpu_safetensors_metadata_at(f, 2, &k, &v), CTPU_ERR_INVALID_ARG);
    ck_assert_ptr_null(ctpu_safetensors_metadata(f, "absent"));
    ctpu_safetensors_close(f);

    /* load writes into the existing tensors (handles kept) */
    ctpu_tensor before = dst[0];
    ck_assert_msg(ctpu_load(p, N_RT, RT_NAMES, dst) == CTPU_OK, "%s", ctpu_last_error());
    ck_assert_uint_eq(before.id, dst[0].id);
    for (int i = 0; i < N_RT; i++) ck_assert_msg(same_bits(dst[i], src[i]), "tensor %s differs", RT_NAMES[i]);
    /* a subset, in another order */
    ctpu_tensor two[2] = { make(CTPU_I32, 1, RT_SHAPE[2], 9), make(CTPU_F32, 2, RT_SHAPE[0], 9) };
    const char *tn[2] = { "idx", "w" };
    ck_assert_int_eq(ctpu_load(p, 2, tn, two), CTPU_OK);
    ck_assert(same_bits(two[0], src[2]) && same_bits(two[1], src[0]));
    /* overwrite in place; zero tensors and metadata only */
    ck_assert_int_eq(ctpu_save(p, 1, tn + 1, two + 1), CTPU_OK);
    ck_assert_int_eq(ctpu_save_ex(at("meta_only"), 0, NULL, NULL, 1, meta), CTPU_OK);
    f = ctpu_safetensors_open(at("meta_only"));
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(ctpu_safetensors_entries(f, &n));
    ck_assert_int_eq(n, 0);
    ctpu_safetensors_close(f);
    ck_assert_int_eq(count_files(".tmp."), 0);
}
END_TEST

START_TEST(t_roundtrip_modes)
{
    /* the same file from every mode; loading in defer and fuse is a trace of its own */
    for (int m = 0; m < CTPU_MODE_COUNT; m++) {
        ck_assert_int_eq(ctpu_set_mode((ctpu_mode)m), CTPU_OK);
        ctpu_tensor src[N_RT], dst[N_RT];
        make_rt(src, 3);
        make_rt(dst, 70);
        /* a value not yet computed (a pending trace value in defer and fuse) */
        src[0] = ctpu_add_scalar(ctpu_mul_scalar(src[0], 2.0), 1.0);
        char name[32];
        snprintf(name, sizeof name, "m%d", m);
        ck_assert_msg(ctpu_save(at(name), N_RT, RT_NAMES, src) == CTPU_OK, "%s", ctpu_last_error());
        ck_assert_msg(ctpu_load(at(name), N_RT, RT_NAMES, dst) == CTPU_OK, "%s", ctpu_last_error());
        for (int i = 0; i < N_RT; i++) ck_assert_msg(same_bits(dst[i], src[i]), "mode %d tensor %d", m, i);
        if (m) {
            size_t l0, l1;
            void *a = slurp(at("m0"), &l0), *b = slurp(at(name), &l1);
            ck_assert(l0 == l1 && !memcmp(a, b, l0));
            free(a);
            free(b);
        }
    }
}
END_TEST

START_TEST(t_save_errors)
{
    ctpu_tensor t[2] = { make(CTPU_F32, 1, (int64_t[]){ 3 }, 1), make(CTPU_F32, 1, (int64_t[]){ 2 }, 2) };
    const char *p = at("keep.safetensors");
    const char *nm[2] = { "a", "b" };
    ck_assert_int_eq(ctpu_save(p, 2, nm, t), CTPU_OK);
    size_t l0;
    void *old = slurp(p, &l0);
    /* a failing save leaves the old file as it was and no temporary file */
    const char *dup[2] = { "a", "a" };
    ck_assert_int_eq(ctpu_save(p, 2, dup, t), CTPU_ERR_INVALID_ARG);
    check_msg(p, "a", "twice");
    const char *md[2] = { "__metadata__", "b" };
    ck_assert_int_eq(ctpu_save(p, 2, md, t), CTPU_ERR_INVALID_ARG);
    const char *bad8[2] = { "a", "b\xc3" };
    ck_assert_int_eq(ctpu_save(p, 2, bad8, t), CTPU_ERR_INVALID_ARG);
    check_msg(p, NULL, "UTF-8");
    const char *nul[2] = { "a", NULL };
    ck_assert_int_eq(ctpu_save(p, 2, nul, t), CTPU_ERR_INVALID_ARG);
    ctpu_tensor stale[2] = { t[0], make(CTPU_F32, 1, (int64_t[]){ 2 }, 3) };
    ctpu_release(stale[1]);
    ck_assert_int_eq(ctpu_save(p, 2, nm, stale), CTPU_ERR_STALE_HANDLE);
    check_msg(p, "b", "stale");
    ctpu_tensor null2[2] = { t[0], CTPU_NULL };
    ck_assert_int_eq(ctpu_save(p, 2, nm, null2), CTPU_ERR_NULL_HANDLE);
    const char *meta[2] = { "k", NULL };
    ck_assert_int_eq(ctpu_save_ex(p, 2, nm, t, 1, meta), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_save(NULL, 2, nm, t), CTPU_ERR_INVALID_ARG);
    char *longp = malloc(5000);
    memset(longp, 'x', 4999);
    longp[0] = '/';
    longp[4999] = 0;
    ck_assert_int_eq(ctpu_save(longp, 2, nm, t), CTPU_ERR_INVALID_ARG);
    free(longp);
    ck_assert_int_eq(ctpu_save(p, -1, nm, t), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_save(p, 2, NULL, t), CTPU_ERR_INVALID_ARG);
    size_t l1;
    void *now = slurp(p, &l1);
    ck_assert(l0 == l1 && !memcmp(old, now, l0));
    free(old);
    free(now);
    /* a directory that does not exist; a path that is a directory */
    const char *q = at("no/such/dir.st");
    ck_assert_int_eq(ctpu_save(q, 2, nm, t), CTPU_ERR_IO);
    check_msg(q, NULL, "temporary");
    ck_assert_int_eq(ctpu_save(dir, 2, nm, t), CTPU_ERR_IO);
    ck_assert_int_eq(count_files(".tmp."), 0);
    /* a device fault latched on a tensor: the save fails naming it */
    ctpu_tensor w = make(CTPU_F32, 2, (int64_t[]){ 4, 2 }, 1);
    ctpu_tensor bad_idx = ctpu_from_host((int32_t[]){ 0, 9 }, CTPU_I32, 1, (int64_t[]){ 2 });
    ctpu_tensor g[1] = { ctpu_embedding(w, bad_idx) };
    const char *gn[1] = { "emb" };
    ck_assert_int_eq(ctpu_save(at("fault.st"), 1, gn, g), CTPU_ERR_DEVICE_FAULT);
    check_msg(at("fault.st"), "emb", "embedding");
    ck_assert_int_eq(count_files("fault"), 0);
    ctpu_sync();
    ctpu_clear_error();
}
END_TEST

/* -------------------------------------------------------------- bad files */
static const float F6[6] = { 1, 2, 3, 4, 5, 6 };

typedef struct {
    const char *what;
    uint64_t hn;          /* UINT64_MAX: the json's length */
    const char *json;
    size_t data;          /* bytes of data after the header (from F6) */
    ctpu_status st;
    const char *tensor;   /* named in the message, or NULL */
    const char *part;     /* a piece of the message */
} bad_case;

#define GOOD_A "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"
static const bad_case BAD[] = {
    { "truncated data", UINT64_MAX, "{" GOOD_A "}", 20, CTPU_ERR_IO, "a", "truncated" },
    { "trailing bytes", UINT64_MAX, "{" GOOD_A "}", 28, CTPU_ERR_IO, NULL, "cover" },
    { "header past the end", 4000, "{" GOOD_A "}", 24, CTPU_ERR_IO, NULL, "past the end" },
    { "huge header", 1ull << 40, "{" GOOD_A "}", 24, CTPU_ERR_IO, NULL, "limit" },
    { "header just above the limit", 100000001, "{" GOOD_A "}", 24, CTPU_ERR_IO, NULL, "limit" },
    { "empty header", 0, "", 0, CTPU_ERR_IO, NULL, "too short" },
    { "malformed json", UINT64_MAX, "{\"a\":{\"dtype\":\"F32\",", 24, CTPU_ERR_IO, NULL, "malformed" },
    { "not an object", UINT64_MAX, "[1,2,3]     ", 0, CTPU_ERR_IO, NULL, "malformed" },
    { "not UTF-8", UINT64_MAX, "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
      CTPU_ERR_IO, NULL, "UTF-8" },
    { "overlong UTF-8", UINT64_MAX, "{\"a\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}",
      24, CTPU_ERR_IO, NULL, "UTF-8" },
    { "junk after the object", UINT64_MAX, "{" GOOD_A "}x", 24, CTPU_ERR_IO, NULL, "malformed" },
    { "NUL in the header", UINT64_MAX - 1, "{" GOOD_A "}", 24, CTPU_ERR_IO, NULL, "NUL" },
    { "unknown dtype", UINT64_MAX, "{\"a\":{\"dtype\":\"F33\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
      CTPU_ERR_IO, "a", "unknown dtype" },
    { "dtype not a string", UINT64_MAX, "{\"a\":{\"dtype\":4,\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
      CTPU_ERR_IO, "a", "dtype" },
    { "no shape", UINT64_MAX, "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,24]}}", 24, CTPU_ERR_IO, "a", "shape" },
    { "entry not an object", UINT64_MAX, "{\"a\":[1]}", 0, CTPU_ERR_IO, "a", "object" },
    { "negative extent", UINT64_MAX, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2,3],\"data_offsets\":[0,24]}}", 24,
      CTPU_ERR_IO, "a", "shape[0]" },
    { "fractional extent", UINT64_MAX, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5,3],\"data_offsets\":[0,24]}}", 24,
      CTPU_ERR_IO, "a", "shape[0]" },
    { "nine dims", UINT64_MAX,
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,2,3,1],\"data_offsets\":[0,24]}}", 24, CTPU_ERR_IO, "a",
      "dims" },
    { "size mismatch", UINT64_MAX, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,24]}}", 24,
      CTPU_ERR_IO, "a", "needs 16" },
    { "size overflow", UINT64_MAX,
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,24]}}", 24, CTPU_ERR_IO, "a",
      "more than" },
    { "offsets reversed", UINT64_MAX, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[24,0]}}", 24,
      CTPU_ERR_IO, "a", "begin <= end" },
    { "three offsets", UINT64_MAX, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24,4]}}", 24,
      CTPU_ERR_IO, "a", "data_offsets" },
    { "offsets past the end", UINT64_MAX, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]}}", 24,
      CTPU_ERR_IO, "a", "past the end" },
    { "overlap", UINT64_MAX,
      "{" GOOD_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}", 24, CTPU_ERR_IO, "b",
      "overlap" },
    { "hole", UINT64_MAX, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24, CTPU_ERR_IO, "a",
      "hole" },
    { "duplicate name", UINT64_MAX,
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[12,24]}}", 24, CTPU_ERR_IO, "a", "twice" },
    { "metadata not an object", UINT64_MAX, "{\"__metadata__\":3," GOOD_A "}", 24, CTPU_ERR_IO, NULL, "__metadata__" },
    { "metadata value not a string", UINT64_MAX, "{\"__metadata__\":{\"k\":1}," GOOD_A "}", 24, CTPU_ERR_IO, "k",
      "not a string" },
    /* readable files that do not fit the destination a = f32[2,3] */
    { "dtype ctpu has not", UINT64_MAX, "{\"a\":{\"dtype\":\"F16\",\"shape\":[2,6],\"data_offsets\":[0,24]}}", 24,
      CTPU_ERR_DTYPE, "a", "F16" },
    { "other dtype", UINT64_MAX, "{\"a\":{\"dtype\":\"I32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
      CTPU_ERR_DTYPE, "a", "I32[2,3]" },
    { "other shape", UINT64_MAX, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]}}", 24,
      CTPU_ERR_SHAPE, "a", "F32[3,2] in the file but the destination is f32[2,3]" },
    { "missing name", UINT64_MAX, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
      CTPU_ERR_INVALID_ARG, "a", "not in the file" },
};

START_TEST(t_bad_files)
{
    const float init[6] = { -1, -1, -1, -1, -1, -1 };
    ctpu_tensor a = t_f32(init, 2, (int64_t[]){ 2, 3 });
    ctpu_tensor ref = t_f32(init, 2, (int64_t[]){ 2, 3 });
    const char *names[1] = { "a" };
    for (size_t c = 0; c < sizeof BAD / sizeof BAD[0]; c++) {
        const bad_case *b = &BAD[c];
        char fn[64];
        snprintf(fn, sizeof fn, "bad%zu.safetensors", c);
        const char *p = at(fn);
        char data[64] = { 0 };
        memcpy(data, F6, 24);
        write_st(p, b->hn, b->json, data, b->data);
        ctpu_clear_error();
        ctpu_status st = ctpu_load(p, 1, names, &a);
        ck_assert_msg(st == b->st, "%s: status %s, want %s (%s)", b->what, ctpu_status_str(st),
                      ctpu_status_str(b->st), ctpu_last_error());
        check_msg(p, b->tensor, b->part);
        ck_assert_msg(same_bits(a, ref), "%s: the destination changed", b->what);
        /* the lister agrees on file errors and never crashes */
        ctpu_safetensors *f = ctpu_safetensors_open(p);
        ck_assert_msg((f == NULL) == (b->st == CTPU_ERR_IO), "%s: open %s", b->what, f ? "succeeded" : "failed");
        if (f) {
            ck_assert_int_eq(ctpu_safetensors_load(f, 1, names, &a), b->st);
            ck_assert(same_bits(a, ref));
            ctpu_safetensors_close(f);
        }
    }
    /* files that are not there or not files */
    ck_assert_int_eq(ctpu_load(at("absent"), 1, names, &a), CTPU_ERR_IO);
    check_msg(at("absent"), NULL, "cannot open");
    ck_assert_int_eq(ctpu_load(dir, 1, names, &a), CTPU_ERR_IO);
    check_msg(dir, NULL, "not a regular file");
    spit(at("short"), "\x10\0\0", 3);
    ck_assert_int_eq(ctpu_load(at("short"), 1, names, &a), CTPU_ERR_IO);
    check_msg(at("short"), NULL, "truncated");
    ck_assert_int_eq(ctpu_load(NULL, 1, names, &a), CTPU_ERR_INVALID_ARG);
    ck_assert_ptr_null(ctpu_safetensors_open(NULL));
    ck_assert(same_bits(a, ref));

    /* all or nothing: a fits, b does not: a is not written either */
    ctpu_tensor two[2] = { a, t_f32(init, 1, (int64_t[]){ 3 }) };
    const char *tn[2] = { "a", "b" };
    const char *p = at("two.safetensors");
    write_st(p, UINT64_MAX, "{" GOOD_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,32]}}      ",
             (const float[]){ 1, 2, 3, 4, 5, 6, 7, 8 }, 32);
    ck_assert_int_eq(ctpu_load(p, 2, tn, two), CTPU_ERR_SHAPE);
    check_msg(p, "b", "F32[2]");
    ck_assert(same_bits(a, ref));
    ctpu_tensor stale = t_f32(init, 1, (int64_t[]){ 2 });
    ctpu_release(stale);
    ctpu_tensor withstale[2] = { a, stale };
    ck_assert_int_eq(ctpu_load(p, 2, tn, withstale), CTPU_ERR_STALE_HANDLE);
    check_msg(p, "b", "stale");
    ck_assert(same_bits(a, ref));
    /* and the good file loads (trailing spaces after the JSON are padding) */
    two[1] = t_f32(init, 1, (int64_t[]){ 2 });
    ck_assert_msg(ctpu_load(p, 2, tn, two) == CTPU_OK, "%s", ctpu_last_error());
    float got[6];
    ck_assert_int_eq(ctpu_to_host(a, got, sizeof got), CTPU_OK);
    ck_assert(!memcmp(got, F6, sizeof got));
    /* not initialised: an error, not a crash */
    ctpu_shutdown();
    ck_assert_int_eq(ctpu_load(p, 2, tn, two), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_save(p, 2, tn, two), CTPU_ERR_NOT_INITIALIZED);
    ctpu_safetensors *f = ctpu_safetensors_open(p);   /* listing needs no runtime */
    ck_assert_ptr_nonnull(f);
    ck_assert(ctpu_is_null(ctpu_safetensors_tensor(f, "a")));
    ctpu_safetensors_close(f);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
}
END_TEST

static uint32_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

/* Mutations of a valid file: every outcome is a clean success or a one-line
 * error with the destinations untouched; never a crash. */
START_TEST(t_fuzz_headers)
{
    ctpu_tensor src[N_RT], dst[N_RT], ref[N_RT];
    make_rt(src, 5);
    make_rt(dst, 90);
    make_rt(ref, 90);
    const char *meta[] = { "format", "pt" };
    const char *p = at("seed.safetensors"), *q = at("mut.safetensors");
    ck_assert_int_eq(ctpu_save_ex(p, N_RT, RT_NAMES, src, 1, meta), CTPU_OK);
    size_t len;
    unsigned char *good = slurp(p, &len);
    uint64_t hn = 0;
    for (int i = 7; i >= 0; i--) hn = hn << 8 | good[i];
    unsigned char *m = malloc(len + 64);
    uint64_t s = 0x9e3779b97f4a7c15ull;
#define RND() lcg(&s)
    static const char alphabet[] = "{}[]\",:0123456789-.eE \\u\x01\xff" "F32BF16I32shapedtypedata_offsets";
    int loaded = 0, failed = 0;
    for (int it = 0; it < 1500; it++) {
        memcpy(m, good, len);
        size_t n = len;
        int kind = (int)(RND() % 6);
        int edits = 1 + (int)(RND() % 3);
        for (int e = 0; e < edits; e++) {
            if (kind == 0) m[8 + RND() % hn] = (unsigned char)alphabet[RND() % (sizeof alphabet - 1)];
            else if (kind == 1) m[8 + RND() % hn] ^= (unsigned char)(1u << (RND() % 8));
            else if (kind == 2) n = RND() % (len + 1);                             /* truncation */
            else if (kind == 3) m[RND() % 8] = (unsigned char)RND();               /* header length */
            else if (kind == 4) {                                                  /* a digit changed */
                size_t k = 8 + RND() % hn;
                while (k < 8 + hn && (m[k] < '0' || m[k] > '9')) k++;
                if (k < 8 + hn) m[k] = (unsigned char)('0' + RND() % 10);
            } else m[8 + hn + RND() % (len - 8 - hn)] ^= 0xff;                     /* data only: loads */
        }
        spit(q, m, n);
        ctpu_clear_error();
        ctpu_status st = ctpu_load(q, N_RT, RT_NAMES, dst);
        if (st == CTPU_OK) {
            loaded++;
            for (int i = 0; i < N_RT; i++) ctpu_assign(dst[i], ref[i]);   /* back to the sentinels */
        } else {
            failed++;
            const char *msg = ctpu_last_error();
            T_CHECK(!strchr(msg, '\n') && strstr(msg, q), "iteration %d: message %s", it, msg);
            for (int i = 0; i < N_RT; i++) T_CHECK(same_bits(dst[i], ref[i]), "iteration %d: tensor %d changed", it, i);
        }
        ctpu_safetensors *f = ctpu_safetensors_open(q);
        if (f) {
            int ne;
            const ctpu_safetensors_entry *e = ctpu_safetensors_entries(f, &ne);
            for (int i = 0; i < ne; i++) {
                T_CHECK(e[i].offset + e[i].nbytes <= (uint64_t)n, "iteration %d: entry past the end", it);
                ctpu_scope_begin();
                ctpu_safetensors_tensor(f, e[i].name);
                ctpu_scope_end();
            }
            ctpu_safetensors_close(f);
        }
    }
#undef RND
    free(m);
    free(good);
    ck_assert_msg(loaded > 100 && failed > 300, "loaded %d, failed %d", loaded, failed);
    ctpu_clear_error();
}
END_TEST

/* -------------------------------------------------------------- optimizer */
static void fake_grads(const ctpu_tensor *p, int n, double scale)
{
    /* a backward through sum(p * c) gives each parameter the gradient c */
    ctpu_scope_begin();
    ctpu_tensor total = CTPU_NULL;
    for (int i = 0; i < n; i++) {
        ctpu_tensor c = ctpu_rand_normal(CTPU_F32, 0, NULL, 0.0, scale);
        ctpu_tensor l = ctpu_sum(ctpu_mul(ctpu_mul(p[i], p[i]), c), 0, NULL, false);
        total = ctpu_is_null(total) ? l : ctpu_add(total, l);
    }
    ck_assert_msg(ctpu_backward(total) == CTPU_OK, "%s", ctpu_last_error());
    ctpu_scope_end();
}


/* Parameter groups and Adam round-trip: per-group params, lr scale and
 * weight decay are written and read back, and a loaded optimizer continues
 * bit for bit; another group layout or kind is refused. */
START_TEST(t_optim_groups_roundtrip)
{
    ctpu_manual_seed(4);
    ctpu_linear l1, l2;
    ck_assert_int_eq(ctpu_linear_init(&l1, 5, 4, true, CTPU_F32), CTPU_OK);
    ck_assert_int_eq(ctpu_linear_init(&l2, 4, 3, true, CTPU_F32), CTPU_OK);
    ctpu_tensor decay[2] = { l1.weight, l2.weight }, nodecay[2] = { l1.bias, l2.bias };
    ctpu_tensor all[4] = { l1.weight, l2.weight, l1.bias, l2.bias };
    for (int kind = 0; kind < 2; kind++) {   /* 0: Adam, 1: AdamW */
        ctpu_param_group g[2] = { { decay, 2, 1.0, 0.1 }, { nodecay, 2, 0.5, 0.0 } };
        ctpu_adamw_opts ao = { 2e-2, 0.8, 0.95, 1e-6, 0.0 };
        ctpu_optim *a = kind ? ctpu_adamw_create_groups(2, g, &ao) : ctpu_adam_create_groups(2, g, &ao);
        ck_assert_msg(a != NULL, "%s", ctpu_last_error());
        for (int s = 0; s < 3; s++) {
            ctpu_optim_zero_grad(a);
            fake_grads(all, 4, 1.0);
            ck_assert_int_eq(ctpu_optim_set_lr(a, 0.1 / (s + 3)), CTPU_OK);
            ck_assert_int_eq(ctpu_optim_step(a), CTPU_OK);
        }
        const char *f = at(kind ? "groups_adamw" : "groups_adam");
        ck_assert_msg(ctpu_optim_save(a, f) == CTPU_OK, "%s", ctpu_last_error());
        ctpu_safetensors *sf = ctpu_safetensors_open(f);
        ck_assert_ptr_nonnull(sf);
        ck_assert_str_eq(ctpu_safetensors_metadata(sf, "ctpu.optim.kind"), kind ? "adamw" : "adam");
        ck_assert_str_eq(ctpu_safetensors_metadata(sf, "ctpu.optim.groups"), "2");
        ck_assert_str_eq(ctpu_safetensors_metadata(sf, "ctpu.optim.group.0.params"), "0,1");
        ck_assert_str_eq(ctpu_safetensors_metadata(sf, "ctpu.optim.group.1.params"), "2,3");
        ck_assert_str_eq(ctpu_safetensors_metadata(sf, "ctpu.optim.group.1.lr_scale"), "0.5");
        ck_assert_str_eq(ctpu_safetensors_metadata(sf, "ctpu.optim.group.0.weight_decay"), "0.10000000000000001");
        ck_assert_str_eq(ctpu_safetensors_metadata(sf, "ctpu.optim.group.1.weight_decay"), "0");
        ctpu_safetensors_close(sf);
        /* the same layout made with other scales and decays: all come from the file */
        ctpu_param_group h[2] = { { decay, 2, 3.0, 0.0 }, { nodecay, 2, 1.0, 0.3 } };
        ctpu_adamw_opts bo = { 1e-3, 0.9, 0.999, 1e-8, 0.0 };
        ctpu_optim *b = kind ? ctpu_adamw_create_groups(2, h, &bo) : ctpu_adam_create_groups(2, h, &bo);
        ck_assert_msg(ctpu_optim_load(b, f) == CTPU_OK, "%s", ctpu_last_error());
        ck_assert_int_eq(ctpu_optim_steps(b), 3);
        ck_assert(ctpu_optim_lr(b) == 0.1 / 5);
        for (int i = 0; i < 4; i++)
            for (int k = 0; k < 2; k++) ck_assert(same_bits(ctpu_optim_state(a, i, k), ctpu_optim_state(b, i, k)));
        /* a and b continue identically on copies of the parameters' values */
        float before[4][20];
        for (int i = 0; i < 4; i++) ck_assert_int_eq(ctpu_to_host(all[i], before[i], sizeof before[i]), CTPU_OK);
        float after[2][4][20];
        memset(after, 0, sizeof after);
        for (int r = 0; r < 2; r++) {
            ctpu_no_grad_begin();   /* parameters: leaves that require grad */
            for (int i = 0; i < 4; i++) {
                int64_t sh[CTPU_MAX_DIMS];
                int nd;
                ctpu_shape(all[i], sh, &nd);
                ck_assert_int_eq(ctpu_assign(all[i], ctpu_from_host(before[i], CTPU_F32, nd, sh)), CTPU_OK);
            }
            ctpu_no_grad_end();
            ctpu_manual_seed(9);
            ctpu_optim_zero_grad(r ? b : a);
            fake_grads(all, 4, 1.0);
            ck_assert_int_eq(ctpu_optim_step(r ? b : a), CTPU_OK);
            for (int i = 0; i < 4; i++) ck_assert_int_eq(ctpu_to_host(all[i], after[r][i], sizeof after[r][i]), CTPU_OK);
        }
        ck_assert(memcmp(after[0], after[1], sizeof after[0]) == 0);
        /* refused: one group where the file has two; the other kind */
        ctpu_optim *flat = kind ? ctpu_adamw_create(4, all, &bo) : ctpu_adam_create(4, all, &bo);
        ck_assert_int_eq(ctpu_optim_load(flat, f), CTPU_ERR_IO);
        check_msg(f, NULL, "parameter groups");
        ctpu_optim *other = kind ? ctpu_adam_create_groups(2, g, &ao) : ctpu_adamw_create_groups(2, g, &ao);
        ck_assert_int_eq(ctpu_optim_load(other, f), CTPU_ERR_IO);
        check_msg(f, NULL, kind ? "'adamw' optimizer" : "'adam' optimizer");
        ctpu_param_group sw[2] = { { nodecay, 2, 1.0, 0.0 }, { decay, 2, 1.0, 0.0 } };   /* another layout */
        ctpu_optim *swo = kind ? ctpu_adamw_create_groups(2, sw, &ao) : ctpu_adam_create_groups(2, sw, &ao);
        ck_assert_int_ne(ctpu_optim_load(swo, f), CTPU_OK);
        ctpu_optim_free(swo);
        ctpu_optim_free(other);
        ctpu_optim_free(flat);
        ctpu_optim_free(b);
        ctpu_optim_free(a);
    }
    ctpu_linear_free(&l1);
    ctpu_linear_free(&l2);
}
END_TEST

START_TEST(t_optim_roundtrip)
{
    ctpu_manual_seed(3);
    ctpu_linear l;
    ck_assert_int_eq(ctpu_linear_init(&l, 5, 4, true, CTPU_F32), CTPU_OK);
    ctpu_tensor p[2] = { l.weight, l.bias };
    ctpu_adamw_opts ao = { 2e-2, 0.8, 0.95, 1e-6, 0.05 };
    ctpu_optim *a = ctpu_adamw_create(2, p, &ao);
    for (int s = 0; s < 3; s++) {
        ctpu_optim_zero_grad(a);
        fake_grads(p, 2, 1.0);
        ck_assert_int_eq(ctpu_optim_set_lr(a, 0.1 / (s + 3)), CTPU_OK);
        ck_assert_int_eq(ctpu_optim_step(a), CTPU_OK);
    }
    const char *f = at("adamw.safetensors");
    ck_assert_msg(ctpu_optim_save(a, f) == CTPU_OK, "%s", ctpu_last_error());
    ctpu_safetensors *sf = ctpu_safetensors_open(f);
    ck_assert_ptr_nonnull(sf);
    ck_assert_str_eq(ctpu_safetensors_metadata(sf, "ctpu.optim.kind"), "adamw");
    ck_assert_str_eq(ctpu_safetensors_metadata(sf, "ctpu.optim.step"), "3");
    ck_assert_str_eq(ctpu_safetensors_metadata(sf, "ctpu.optim.groups"), "1");
    ck_assert_str_eq(ctpu_safetensors_metadata(sf, "ctpu.optim.group.0.params"), "0,1");
    ck_assert_str_eq(ctpu_safetensors_metadata(sf, "ctpu.optim.group.0.beta1"), "0.80000000000000004");
    ck_assert_int_ge(ctpu_safetensors_find(sf, "optim.state.1.exp_avg_sq"), 0);
    ctpu_safetensors_close(sf);

    /* another optimizer over the same parameters, other hyper-parameters */
    ctpu_adamw_opts bo = ctpu_adamw_defaults();
    ctpu_optim *b = ctpu_adamw_create(2, p, &bo);
    ck_assert_msg(ctpu_optim_load(b, f) == CTPU_OK, "%s", ctpu_last_error());
    ck_assert_int_eq(ctpu_optim_steps(b), 3);
    ck_assert(ctpu_optim_lr(b) == 0.1 / 5);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++) ck_assert(same_bits(ctpu_optim_state(a, i, k), ctpu_optim_state(b, i, k)));
    /* the next step of each, from the same start, ends at the same bits */
    ctpu_tensor q0 = ctpu_keep(ctpu_detach(ctpu_add_scalar(p[0], 0.0)));
    ctpu_tensor q1 = ctpu_keep(ctpu_detach(ctpu_add_scalar(p[1], 0.0)));
    ctpu_tensor pw[2];
    for (int r = 0; r < 2; r++) {
        ctpu_no_grad_begin();
        ck_assert_int_eq(ctpu_assign(p[0], q0), CTPU_OK);
        ck_assert_int_eq(ctpu_assign(p[1], q1), CTPU_OK);
        ctpu_no_grad_end();
        ctpu_manual_seed(11);
        ctpu_optim_zero_grad(a);
        fake_grads(p, 2, 1.0);
        ck_assert_int_eq(ctpu_optim_step(r ? b : a), CTPU_OK);
        pw[r] = ctpu_keep(ctpu_add_scalar(p[0], 0.0));
    }
    ck_assert(same_bits(pw[0], pw[1]));

    /* set_steps */
    ck_assert_int_eq(ctpu_optim_set_steps(b, 42), CTPU_OK);
    ck_assert_int_eq(ctpu_optim_steps(b), 42);
    ck_assert_int_eq(ctpu_optim_set_steps(b, -1), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_optim_set_steps(NULL, 1), CTPU_ERR_INVALID_ARG);

    /* mismatches: nothing changes */
    ctpu_sgd_opts so = { 0.1, 0.9, 0, 0, false };
    ctpu_optim *sgd = ctpu_sgd_create(2, p, &so);
    ck_assert_int_eq(ctpu_optim_load(sgd, f), CTPU_ERR_IO);
    check_msg(f, NULL, "'adamw' optimizer");
    ctpu_optim *one = ctpu_adamw_create(1, p, &bo);
    ck_assert_int_eq(ctpu_optim_load(one, f), CTPU_ERR_IO);
    check_msg(f, NULL, "2 parameters");
    ctpu_tensor p2[2] = { p[1], p[0] };   /* shapes swapped: the moments do not fit */
    ctpu_optim *sw = ctpu_adamw_create(2, p2, &bo);
    ck_assert_int_eq(ctpu_optim_load(sw, f), CTPU_ERR_SHAPE);
    check_msg(f, "optim.state.0.exp_avg", NULL);
    ck_assert_int_eq(ctpu_optim_steps(sw), 0);
    ck_assert(ctpu_optim_lr(sw) == bo.lr);
    ck_assert_int_eq(ctpu_optim_load(NULL, f), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_optim_load(sw, at("absent")), CTPU_ERR_IO);
    check_msg(at("absent"), NULL, "optim_load");
    /* a file with a bad hyper-parameter or a missing key */
    ctpu_tensor st0[4] = { ctpu_optim_state(a, 0, 0), ctpu_optim_state(a, 0, 1), ctpu_optim_state(a, 1, 0),
                           ctpu_optim_state(a, 1, 1) };
    const char *sn[4] = { "optim.state.0.exp_avg", "optim.state.0.exp_avg_sq", "optim.state.1.exp_avg",
                          "optim.state.1.exp_avg_sq" };
    const char *meta[] = { "ctpu.optim.kind", "adamw", "ctpu.optim.n_params", "2", "ctpu.optim.step", "7",
                           "ctpu.optim.groups", "1", "ctpu.optim.group.0.params", "0,1", "ctpu.optim.group.0.lr",
                           "0.01", "ctpu.optim.group.0.initial_lr", "0.01", "ctpu.optim.group.0.beta1", "1.5",
                           "ctpu.optim.group.0.beta2", "0.9", "ctpu.optim.group.0.eps", "1e-8",
                           "ctpu.optim.group.0.weight_decay", "0" };
    ck_assert_int_eq(ctpu_save_ex(at("badhp"), 4, sn, st0, 11, meta), CTPU_OK);
    ck_assert_int_eq(ctpu_optim_load(b, at("badhp")), CTPU_ERR_IO);
    check_msg(at("badhp"), NULL, "ctpu.optim.group.0.beta1 = 1.5 (need [0, 1))");   /* the key, the value, the rule */
    ck_assert_int_eq(ctpu_optim_steps(b), 42);
    /* each bad key is named (not "lr and step"): eps, weight_decay, a NaN lr_scale */
    static const char *bad_kv[][3] = { { "ctpu.optim.group.0.eps", "0", "ctpu.optim.group.0.eps = 0" },
                                       { "ctpu.optim.group.0.weight_decay", "-1", "ctpu.optim.group.0.weight_decay = -1" },
                                       { "ctpu.optim.group.0.beta2", "1", "ctpu.optim.group.0.beta2 = 1" } };
    for (int k = 0; k < 3; k++) {
        const char *m2[22];
        memcpy(m2, meta, sizeof m2);
        m2[15] = "0.9";   /* beta1 fixed */
        for (int i = 0; i < 22; i += 2)
            if (!strcmp(m2[i], bad_kv[k][0])) m2[i + 1] = bad_kv[k][1];
        ck_assert_int_eq(ctpu_save_ex(at("badhp2"), 4, sn, st0, 11, m2), CTPU_OK);
        ck_assert_int_eq(ctpu_optim_load(b, at("badhp2")), CTPU_ERR_IO);
        check_msg(at("badhp2"), NULL, bad_kv[k][2]);
    }
    ck_assert_int_eq(ctpu_save_ex(at("nokey"), 4, sn, st0, 10, meta), CTPU_OK);
    ck_assert_int_eq(ctpu_optim_load(b, at("nokey")), CTPU_ERR_IO);
    check_msg(at("nokey"), NULL, "'ctpu.optim.group.0.weight_decay' is missing");
    meta[5] = "x7";
    ck_assert_int_eq(ctpu_save_ex(at("badstep"), 4, sn, st0, 11, meta), CTPU_OK);
    ck_assert_int_eq(ctpu_optim_load(b, at("badstep")), CTPU_ERR_IO);
    check_msg(at("badstep"), NULL, "'ctpu.optim.step' is 'x7'");

    /* SGD with momentum round trip */
    for (int s = 0; s < 2; s++) {
        ctpu_optim_zero_grad(sgd);
        fake_grads(p, 2, 1.0);
        ck_assert_int_eq(ctpu_optim_step(sgd), CTPU_OK);
    }
    ck_assert_int_eq(ctpu_optim_save(sgd, at("sgd")), CTPU_OK);
    ctpu_sgd_opts so2 = { 0.5, 0.5, 0.1, 0.01, false };
    ctpu_optim *sgd2 = ctpu_sgd_create(2, p, &so2);
    ck_assert_msg(ctpu_optim_load(sgd2, at("sgd")) == CTPU_OK, "%s", ctpu_last_error());
    ck_assert_int_eq(ctpu_optim_steps(sgd2), 2);
    ck_assert(same_bits(ctpu_optim_state(sgd, 1, 0), ctpu_optim_state(sgd2, 1, 0)));
    ctpu_sgd_opts so3 = { 0.5, 0, 0, 0, false };   /* no momentum buffers */
    ctpu_optim *sgd3 = ctpu_sgd_create(2, p, &so3);
    ck_assert_int_eq(ctpu_optim_load(sgd3, at("sgd")), CTPU_ERR_IO);
    check_msg(at("sgd"), NULL, "momentum");
    ctpu_optim_free(a);
    ctpu_optim_free(b);
    ctpu_optim_free(sgd);
    ctpu_optim_free(sgd2);
    ctpu_optim_free(sgd3);
    ctpu_optim_free(one);
    ctpu_optim_free(sw);
    ctpu_linear_free(&l);
}
END_TEST

/* -------------------------------------------------------------- batch iterator */
START_TEST(t_batch_iter_state)
{
    for (int dl = 0; dl < 2; dl++) {
        /* stop after every number of calls in three epochs; the copy goes on the same */
        for (int stop = 0; stop < 16; stop++) {
            ctpu_batch_iter *a = ctpu_batch_iter_create(23, 5, true, dl, 77);
            const int64_t *ia, *ib;
            for (int c = 0; c < stop; c++) ctpu_batch_iter_next(a, &ia);
            ctpu_batch_iter_state s;
            ck_assert_int_eq(ctpu_batch_iter_get_state(a, &s), CTPU_OK);
            ctpu_batch_iter *b = ctpu_batch_iter_create(23, 5, true, dl, 77);
            ck_assert_msg(ctpu_batch_iter_set_state(b, &s) == CTPU_OK, "%s", ctpu_last_error());
            for (int c = 0; c < 16; c++) {
                int64_t ka = ctpu_batch_iter_next(a, &ia), kb = ctpu_batch_iter_next(b, &ib);
                ck_assert_int_eq(ka, kb);
                ck_assert_int_eq(ctpu_batch_iter_epoch(a), ctpu_batch_iter_epoch(b));
                for (int64_t i = 0; i < ka; i++) ck_assert_int_eq(ia[i], ib[i]);
            }
            ctpu_batch_iter_free(a);
            ctpu_batch_iter_free(b);
        }
    }
    ctpu_batch_iter *it = ctpu_batch_iter_create(23, 5, true, false, 77);
    ctpu_batch_iter_state s;
    ctpu_batch_iter_get_state(it, &s);
    ck_assert_int_eq(s.epoch, 0);
    ck_assert_int_eq(s.position, 0);
    ctpu_batch_iter_state bad = s;
    bad.seed = 78;
    ck_assert_int_eq(ctpu_batch_iter_set_state(it, &bad), CTPU_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "seed=78"));
    bad = s;
    bad.position = 7;
    ck_assert_int_eq(ctpu_batch_iter_set_state(it, &bad), CTPU_ERR_INVALID_ARG);
    bad.position = 24;
    ck_assert_int_eq(ctpu_batch_iter_set_state(it, &bad), CTPU_ERR_INVALID_ARG);
    bad.position = 23;
    ck_assert_int_eq(ctpu_batch_iter_set_state(it, &bad), CTPU_OK);
    bad.epoch = -1;
    ck_assert_int_eq(ctpu_batch_iter_set_state(it, &bad), CTPU_ERR_INVALID_ARG);
    /* an epoch near INT64_MAX (a tampered checkpoint) is refused: the next epoch's number would overflow */
    bad.epoch = INT64_MAX;
    ck_assert_int_eq(ctpu_batch_iter_set_state(it, &bad), CTPU_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "2^62"));
    bad.epoch = CTPU_BATCH_ITER_MAX_EPOCH + 1;
    ck_assert_int_eq(ctpu_batch_iter_set_state(it, &bad), CTPU_ERR_INVALID_ARG);
    bad.epoch = CTPU_BATCH_ITER_MAX_EPOCH;   /* the largest: its order is made, the next epoch follows */
    bad.position = 0;
    ck_assert_msg(ctpu_batch_iter_set_state(it, &bad) == CTPU_OK, "%s", ctpu_last_error());
    const int64_t *ix;
    for (int c = 0; c < 6; c++) ctpu_batch_iter_next(it, &ix);
    ck_assert(ctpu_batch_iter_epoch(it) >= CTPU_BATCH_ITER_MAX_EPOCH);
    ck_assert_int_eq(ctpu_batch_iter_set_state(NULL, &s), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_batch_iter_get_state(it, NULL), CTPU_ERR_INVALID_ARG);
    ctpu_batch_iter_free(it);
}
END_TEST

/* -------------------------------------------------------------- resume */
#define R_N 200
#define R_F 64
#define R_BATCH 32
#define R_EPOCHS 2
#define R_PER_EPOCH 7   /* 200 = 6 x 32 + 8, the last partial batch kept */
#define R_STEPS (R_PER_EPOCH * R_EPOCHS)

typedef struct {
    ctpu_linear fc1, fc2;
    ctpu_optim *opt;
    ctpu_batch_iter *it;
} run;

static ctpu_image_set r_data;

static void r_make_data(void)
{
    r_data.n = R_N;
    r_data.rows = r_data.cols = 8;
    r_data.images = malloc(sizeof(float) * R_N * R_F);
    r_data.labels = malloc(sizeof(int32_t) * R_N);
    uint64_t s = 99;
    for (int i = 0; i < R_N; i++) {
        int c = i % 4;
        r_data.labels[i] = c;
        for (int p = 0; p < R_F; p++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            r_data.images[i * R_F + p] = (p / 16 == c ? 1.0f : 0.0f) + (float)(s >> 40) * 0x1p-24f - 0.5f;
        }
    }
}

static const char *const R_NAMES[4] = { "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias" };

static void r_open(run *r, uint64_t seed)
{
    ctpu_manual_seed(seed);
    ck_assert_int_eq(ctpu_linear_init(&r->fc1, R_F, 32, true, CTPU_F32), CTPU_OK);
    ck_assert_int_eq(ctpu_linear_init(&r->fc2, 32, 4, true, CTPU_F32), CTPU_OK);
    ctpu_tensor p[4] = { r->fc1.weight, r->fc1.bias, r->fc2.weight, r->fc2.bias };
    ctpu_adamw_opts ao = { 1e-2, 0.9, 0.999, 1e-8, 1e-2 };
    r->opt = ctpu_adamw_create(4, p, &ao);
    ck_assert_ptr_nonnull(r->opt);
    r->it = ctpu_batch_iter_create(R_N, R_BATCH, true, false, 5);
    ck_assert_ptr_nonnull(r->it);
}

static void r_close(run *r)
{
    ctpu_batch_iter_free(r->it);
    ctpu_optim_free(r->opt);
    ctpu_linear_free(&r->fc1);
    ctpu_linear_free(&r->fc2);
}

/* Steps until the optimizer has taken `until`; loss[step] for each. */
static void r_train(run *r, int until, float *loss)
{
    while (ctpu_optim_steps(r->opt) < until) {
        int64_t step = ctpu_optim_steps(r->opt);
        const int64_t *idx;
        int64_t k = ctpu_batch_iter_next(r->it, &idx);
        if (k == 0) continue;   /* the epoch's end; the next call starts the next */
        ctpu_optim_zero_grad(r->opt);
        ctpu_step_begin();
        ctpu_tensor x, y;
        ck_assert_int_eq(ctpu_image_set_batch(&r_data, idx, k, &x, &y), CTPU_OK);
        ctpu_tensor h = ctpu_dropout(ctpu_relu(ctpu_linear_forward(&r->fc1, x)), 0.25, true);
        ctpu_tensor l = ctpu_cross_entropy(ctpu_linear_forward(&r->fc2, h), y, NULL);
        ck_assert_msg(ctpu_backward(l) == CTPU_OK, "%s", ctpu_last_error());
        ctpu_optim_set_lr(r->opt, ctpu_lr_cosine(1e-2, step, R_STEPS, 1e-4));
        ck_assert_msg(ctpu_optim_step(r->opt) == CTPU_OK, "%s", ctpu_last_error());
        ctpu_tensor kept = ctpu_keep(ctpu_detach(l));
        ctpu_step_end();
        ck_assert_int_eq(ctpu_to_host(kept, &loss[step], 4), CTPU_OK);
        ctpu_release(kept);
    }
}

static void resume_in(ctpu_mode m)
{
    r_make_data();
    float whole[R_STEPS], parts[R_STEPS];
    ck_assert_int_eq(ctpu_set_mode(m), CTPU_OK);
    run r;
    r_open(&r, 1);
    r_train(&r, R_STEPS, whole);
    r_close(&r);
    /* stop mid-epoch (5), at the end of an epoch's batches (7) and right after the epoch turned (8) */
    static const int stops[] = { 5, 7, 8 };
    for (size_t si = 0; si < sizeof stops / sizeof stops[0]; si++) {
        int stop = stops[si];
        memset(parts, 0, sizeof parts);
        ctpu_shutdown();
        ck_assert_int_eq(ctpu_init(), CTPU_OK);
        ck_assert_int_eq(ctpu_set_mode(m), CTPU_OK);
        r_open(&r, 1);
        r_train(&r, stop, parts);
        if (stop == 8) {   /* an iterator that has just returned the end of epoch 0 */
            ctpu_batch_iter_state s;
            ctpu_batch_iter_get_state(r.it, &s);
            ck_assert_int_eq(s.epoch, 1);
        }
        ctpu_tensor p[4] = { r.fc1.weight, r.fc1.bias, r.fc2.weight, r.fc2.bias };
        const char *meta[] = { "run", "resume test" };
        ck_assert_msg(ctpu_checkpoint_save(at("run.safetensors"), 4, R_NAMES, p, r.opt, r.it, 1, meta) == CTPU_OK,
                      "%s", ctpu_last_error());
        r_close(&r);
        /* a new runtime (a new process, as far as ctpu can tell), a model seeded otherwise */
        ctpu_shutdown();
        ck_assert_int_eq(ctpu_init(), CTPU_OK);
        ck_assert_int_eq(ctpu_set_mode(m), CTPU_OK);
        r_open(&r, 1234);
        ctpu_tensor q[4] = { r.fc1.weight, r.fc1.bias, r.fc2.weight, r.fc2.bias };
        ck_assert_msg(ctpu_checkpoint_load(at("run.safetensors"), 4, R_NAMES, q, r.opt, r.it) == CTPU_OK, "%s",
                      ctpu_last_error());
        ck_assert_int_eq(ctpu_optim_steps(r.opt), stop);
        r_train(&r, R_STEPS, parts);
        r_close(&r);
        for (int i = 0; i < stop; i++)
            ck_assert_msg(t_same(whole[i], parts[i]), "stop %d, step %d (before the stop) %.9g vs %.9g", stop, i,
                          whole[i], parts[i]);
        for (int i = stop; i < R_STEPS; i++)
            ck_assert_msg(t_same(whole[i], parts[i]), "%s: stop %d, step %d: unbroken %.9g, resumed %.9g",
                          ctpu_mode_name(m), stop, i, whole[i], parts[i]);
    }
    /* the loss fell: the run is a real one */
    ck_assert_msg(whole[R_STEPS - 1] < 0.7 * whole[0], "loss %.4f -> %.4f", whole[0], whole[R_STEPS - 1]);
    free(r_data.images);
    free(r_data.labels);
}

START_TEST(t_resume_strict) { resume_in(CTPU_MODE_STRICT); }
END_TEST
START_TEST(t_resume_debug) { resume_in(CTPU_MODE_DEBUG); }
END_TEST
START_TEST(t_resume_defer_fuse) { resume_in(CTPU_MODE_DEFER_FUSE); }
END_TEST

START_TEST(t_checkpoint_errors)
{
    r_make_data();
    run r;
    r_open(&r, 1);
    float loss[R_STEPS];
    r_train(&r, 3, loss);
    ctpu_tensor p[4] = { r.fc1.weight, r.fc1.bias, r.fc2.weight, r.fc2.bias };
    const char *f = at("ck.safetensors");
    ck_assert_int_eq(ctpu_checkpoint_save(f, 4, R_NAMES, p, r.opt, r.it, 0, NULL), CTPU_OK);
    /* a weights-only reader sees the parameters */
    ctpu_tensor w = ctpu_keep(ctpu_add_scalar(r.fc1.weight, 0.0));
    ctpu_linear other;
    ck_assert_int_eq(ctpu_linear_init(&other, R_F, 32, true, CTPU_F32), CTPU_OK);
    ck_assert_int_eq(ctpu_load(f, 1, R_NAMES, &other.weight), CTPU_OK);
    ck_assert(same_bits(other.weight, w));
    /* reserved names and keys */
    const char *bn[1] = { "optim.state.0.exp_avg" };
    ck_assert_int_eq(ctpu_checkpoint_save(f, 1, bn, p, NULL, NULL, 0, NULL), CTPU_ERR_INVALID_ARG);
    const char *bm[2] = { "ctpu.mine", "x" };
    ck_assert_int_eq(ctpu_checkpoint_save(f, 4, R_NAMES, p, NULL, NULL, 1, bm), CTPU_ERR_INVALID_ARG);
    /* an iterator with other arguments: nothing changes */
    uint64_t s0, o0;
    ctpu_rng_get_state(&s0, &o0);
    ctpu_batch_iter *it2 = ctpu_batch_iter_create(R_N, 16, true, false, 5);
    ctpu_tensor w0 = ctpu_keep(ctpu_add_scalar(r.fc2.bias, 0.0));
    ctpu_optim_set_steps(r.opt, 99);
    ck_assert_int_eq(ctpu_checkpoint_load(f, 4, R_NAMES, p, r.opt, it2), CTPU_ERR_INVALID_ARG);
    check_msg(f, NULL, "batch=32");
    ck_assert_int_eq(ctpu_optim_steps(r.opt), 99);
    uint64_t s1, o1;
    ctpu_rng_get_state(&s1, &o1);
    ck_assert(s0 == s1 && o0 == o1);
    ck_assert(same_bits(w0, r.fc2.bias));
    /* a weights-only file is no checkpoint */
    ck_assert_int_eq(ctpu_save(at("weights"), 4, R_NAMES, p), CTPU_OK);
    ck_assert_int_eq(ctpu_checkpoint_load(at("weights"), 4, R_NAMES, p, r.opt, r.it), CTPU_ERR_IO);
    check_msg(at("weights"), NULL, "'ctpu.checkpoint' is missing");
    /* a checkpoint without the optimizer part, asked for */
    ck_assert_int_eq(ctpu_checkpoint_save(at("noopt"), 4, R_NAMES, p, NULL, r.it, 0, NULL), CTPU_OK);
    ck_assert_int_eq(ctpu_checkpoint_load(at("noopt"), 4, R_NAMES, p, r.opt, r.it), CTPU_ERR_IO);
    check_msg(at("noopt"), NULL, "ctpu.optim.kind");
    ck_assert_int_eq(ctpu_checkpoint_load(at("noopt"), 4, R_NAMES, p, NULL, r.it), CTPU_OK);
    ck_assert_int_eq(ctpu_checkpoint_load(NULL, 4, R_NAMES, p, NULL, NULL), CTPU_ERR_INVALID_ARG);
    ck_assert_int_eq(ctpu_checkpoint_load(f, 4, NULL, p, NULL, NULL), CTPU_ERR_INVALID_ARG);
    ctpu_batch_iter_free(it2);
    ctpu_linear_free(&other);
    r_close(&r);
    free(r_data.images);
    free(r_data.labels);
}
END_TEST

/* Every metadata value of a whole-run checkpoint (AdamW and SGD in two
 * groups, an iterator mid-epoch) replaced by hostile strings: numbers at
 * and past int64 / uint64 / 2^53 / 2^62, signs, blanks, hex, NaN, Inf,
 * underflow, overflow, lists, booleans, 20,000 digits. Every outcome is a
 * load or a one-line error naming checkpoint_load, the file and the key,
 * after which nothing changed (parameters, optimizer steps and lr, the
 * generator, the iterator); a load that succeeds leaves an optimizer that
 * steps to finite values with a finite step count (found: a step count of
 * INT64_MAX overflowed, and groups other than the last were never checked). */
static const char *const FZ_VALUES[] = {
    "", "-1", "0", "1", "2", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
    "18446744073709551615", "18446744073709551616", "4611686018427387904", "4611686018427387905", "9007199254740993",
    "4294967296", "nan", "-nan", "inf", "-inf", "1e999", "1e-999", "4.9e-324", "0x10", " 5", "5 ", "+5", "-0", "0.5",
    "0.99999999999999989", "true", "false", "yes", "0,1", "1,0", "0,0", "0,", ",0", "01", "1,1", "adam", "sgd",
};
static void fz_grads(const ctpu_tensor *p)
{
    ctpu_scope_begin();
    ctpu_tensor l = ctpu_add(ctpu_sum(ctpu_mul(ctpu_mul(p[0], p[0]), ctpu_full(CTPU_F32, 0, NULL, 0.7)), 0, NULL, false),
                             ctpu_sum(ctpu_mul(p[1], p[1]), 0, NULL, false));
    ck_assert_int_eq(ctpu_backward(l), CTPU_OK);
    ctpu_scope_end();
}
START_TEST(t_fuzz_checkpoint_metadata)
{
    char *digits = malloc(20001);
    memset(digits, '7', 20000);
    digits[20000] = 0;
    const char *names[2] = { "w", "b" };
    int loaded = 0, refused = 0;
    for (int kind = 0; kind < 2; kind++) {
        ctpu_tensor p[2] = { t_f32((const float[]){ 1, -2, 3, 0.5f }, 1, (int64_t[]){ 4 }),
                             t_f32((const float[]){ 0.25f, -1 }, 1, (int64_t[]){ 2 }) };
        ctpu_tensor keep[2] = { t_f32((const float[]){ 0, 0, 0, 0 }, 1, (int64_t[]){ 4 }),
                                t_f32((const float[]){ 0, 0 }, 1, (int64_t[]){ 2 }) };
        for (int i = 0; i < 2; i++) ck_assert_int_eq(ctpu_set_requires_grad(p[i], true), CTPU_OK);
        ctpu_param_group g[2] = { { p, 1, 1.0, 0.1 }, { p + 1, 1, 0.5, 0.0 } };
        ctpu_adamw_opts a = ctpu_adamw_defaults();
        ctpu_sgd_opts sg = { 0.05, 0.9, 0.1, 0.0, false };
        ctpu_optim *o = kind ? ctpu_sgd_create_groups(2, g, &sg) : ctpu_adamw_create_groups(2, g, &a);
        ctpu_batch_iter *it = ctpu_batch_iter_create(100, 8, true, false, 3);
        ck_assert(o && it);
        const int64_t *idx;
        ck_assert_int_eq(ctpu_batch_iter_next(it, &idx), 8);
        for (int s = 0; s < 2; s++) {
            ctpu_optim_zero_grad(o);
            fz_grads(p);
            ck_assert_int_eq(ctpu_optim_step(o), CTPU_OK);
        }
        const char *good = at("fz_good.st"), *mut = at("fz_mut.st");
        ck_assert_msg(ctpu_checkpoint_save(good, 2, names, p, o, it, 0, NULL) == CTPU_OK, "%s", ctpu_last_error());
        ctpu_safetensors *f = ctpu_safetensors_open(good);
        ck_assert_ptr_nonnull(f);
        int ne, nm = ctpu_safetensors_metadata_count(f);
        const ctpu_safetensors_entry *e = ctpu_safetensors_entries(f, &ne);
        ck_assert(ne <= 8 && nm <= 64);
        const char *tn[8], *meta[128];
        ctpu_tensor ts[8];
        for (int i = 0; i < ne; i++) ts[i] = ctpu_keep(ctpu_safetensors_tensor(f, tn[i] = e[i].name));
        int nv = (int)(sizeof FZ_VALUES / sizeof FZ_VALUES[0]);
        for (int k = 0; k < nm; k++)
            for (int v = 0; v <= nv; v++) {
                for (int i = 0; i < nm; i++) ctpu_safetensors_metadata_at(f, i, &meta[2 * i], &meta[2 * i + 1]);
                const char *key = meta[2 * k];
                meta[2 * k + 1] = v < nv ? FZ_VALUES[v] : digits;
                ck_assert_msg(ctpu_save_ex(mut, ne, tn, ts, nm, meta) == CTPU_OK, "%s", ctpu_last_error());
                ctpu_no_grad_begin();
                for (int i = 0; i < 2; i++) ck_assert_int_eq(ctpu_assign(keep[i], p[i]), CTPU_OK);
                ctpu_no_grad_end();
                int64_t steps = ctpu_optim_steps(o);
                double lr = ctpu_optim_lr(o);
                uint64_t seed, off, seed2, off2;
                ctpu_rng_get_state(&seed, &off);
                ctpu_batch_iter_state bs, bs2;
                ctpu_batch_iter_get_state(it, &bs);
                ctpu_clear_error();
                ctpu_status st = ctpu_checkpoint_load(mut, 2, names, p, o, it);
                if (st != CTPU_OK) {
                    refused++;
                    const char *m = ctpu_last_error();
                    T_CHECK(!strchr(m, '\n') && strstr(m, "checkpoint_load: ") && strstr(m, mut), "%s = '%.20s': %s", key,
                            meta[2 * k + 1], m);
                    /* the key, or the keys of a derived value ("initial_lr / lr_scale"); the iterator's
                     * fields are named as ctpu_batch_iter_set_state names them */
                    T_CHECK(strstr(m, key) || strstr(m, "ctpu.optim.") || !strncmp(key, "ctpu.data.", 10),
                            "%s = '%.20s': no key is named: %s", key, meta[2 * k + 1], m);
                    for (int i = 0; i < 2; i++) T_CHECK(same_bits(keep[i], p[i]), "%s: parameter %d changed", key, i);
                    ctpu_rng_get_state(&seed2, &off2);
                    ctpu_batch_iter_get_state(it, &bs2);
                    T_CHECK(ctpu_optim_steps(o) == steps && ctpu_optim_lr(o) == lr && seed == seed2 && off == off2 &&
                            bs.epoch == bs2.epoch && bs.position == bs2.position, "%s = '%.20s': state changed (steps %lld -> %lld, lr %g -> %g, "
                            "rng %llu/%llu -> %llu/%llu, iterator epoch %lld position %lld -> %lld %lld)", key,
                            meta[2 * k + 1], (long long)steps, (long long)ctpu_optim_steps(o), lr, ctpu_optim_lr(o),
                            (unsigned long long)seed, (unsigned long long)off, (unsigned long long)seed2,
                            (unsigned long long)off2, (long long)bs.epoch, (long long)bs.position, (long long)bs2.epoch,
                            (long long)bs2.position);
                    continue;
                }
                loaded++;
                ctpu_optim_zero_grad(o);
                fz_grads(p);
                T_CHECK(ctpu_optim_step(o) == CTPU_OK, "%s = '%.20s': %s", key, meta[2 * k + 1], ctpu_last_error());
                T_CHECK(ctpu_optim_steps(o) > 0, "%s = '%.20s': steps %lld", key, meta[2 * k + 1],
                        (long long)ctpu_optim_steps(o));
                while (ctpu_batch_iter_next(it, &idx) > 0) {}
                /* back to the good state */
                ck_assert_msg(ctpu_checkpoint_load(good, 2, names, p, o, it) == CTPU_OK, "%s", ctpu_last_error());
            }
        for (int i = 0; i < ne; i++) ctpu_release(ts[i]);
        ctpu_safetensors_close(f);
        ctpu_batch_iter_free(it);
        ctpu_optim_free(o);
    }
    free(digits);
    ck_assert_msg(loaded > 100 && refused > 500, "loaded %d, refused %d", loaded, refused);
    ctpu_clear_error();
}
END_TEST

/* -------------------------------------------------------------- interop */
/* The reference tensors of bench/check_safetensors.py. */
#define N_REF 5
static const char *const REF_NAMES[N_REF] = { "f32", "bf16", "i32", "scalar", "empty" };

static void ref_tensors(ctpu_tensor *t)
{
    float f[24], s = -2.5f;
    uint16_t b[15];
    int32_t k[7];
    for (int i = 0; i < 24; i++) f[i] = (float)((i - 7) * 0.375);
    for (int j = 0; j < 15; j++) b[j] = (uint16_t)(t_f2u((float)((j * 3 - 20) * 0.125)) >> 16);
    for (int i = 0; i < 7; i++) k[i] = (int32_t)((int64_t)i * i * 100003 - 1234567);
    t[0] = ctpu_from_host(f, CTPU_F32, 3, (int64_t[]){ 2, 3, 4 });
    t[1] = ctpu_from_host(b, CTPU_BF16, 2, (int64_t[]){ 5, 3 });
    t[2] = ctpu_from_host(k, CTPU_I32, 1, (int64_t[]){ 7 });
    t[3] = ctpu_from_host(&s, CTPU_F32, 0, NULL);
    t[4] = ctpu_from_host(NULL, CTPU_F32, 2, (int64_t[]){ 0, 3 });
    for (int i = 0; i < N_REF; i++) ck_assert(!ctpu_is_null(t[i]));
}

static int run_py(const char *py, const char *script, const char *cmd, const char *path)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl(py, py, script, cmd, path, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

START_TEST(t_python_interop)
{
    const char *py = getenv("CTPU_TEST_PYTHON"), *script = getenv("CTPU_TEST_CHECK_SAFETENSORS");
    if (!py || !script || access(py, X_OK) != 0 || access(script, R_OK) != 0) {
        printf("SKIP t_python_interop: CTPU_TEST_PYTHON / CTPU_TEST_CHECK_SAFETENSORS not set or not there\n");
        return;
    }
    char probe[512];
    snprintf(probe, sizeof probe, "'%s' -c 'import numpy' 2>/dev/null", py);
    if (system(probe) != 0) {
        printf("SKIP t_python_interop: %s cannot import numpy (Debian: python3-numpy)\n", py);
        return;
    }
    ctpu_tensor t[N_REF], u[N_REF];
    ref_tensors(t);
    const char *meta[] = { "writer", "ctpu" };
    const char *mine = at("from_ctpu.safetensors"), *theirs = at("from_numpy.safetensors");
    ck_assert_int_eq(ctpu_save_ex(mine, N_REF, REF_NAMES, t, 1, meta), CTPU_OK);
    ck_assert_msg(run_py(py, script, "check", mine) == 0, "check_safetensors.py check %s failed", mine);
    ck_assert_msg(run_py(py, script, "write", theirs) == 0, "check_safetensors.py write %s failed", theirs);
    ctpu_safetensors *f = ctpu_safetensors_open(theirs);
    ck_assert_msg(f != NULL, "%s", ctpu_last_error());
    ck_assert_str_eq(ctpu_safetensors_metadata(f, "writer"), "numpy");
    for (int i = 0; i < N_REF; i++) {
        u[i] = ctpu_safetensors_tensor(f, REF_NAMES[i]);
        ck_assert_msg(!ctpu_is_null(u[i]), "%s", ctpu_last_error());
        ck_assert_msg(same_bits(u[i], t[i]), "tensor %s differs", REF_NAMES[i]);
    }
    ctpu_safetensors_close(f);
    ref_tensors(u);
    ck_assert_int_eq(ctpu_assign(u[0], ctpu_zeros(CTPU_F32, 3, (int64_t[]){ 2, 3, 4 })), CTPU_OK);
    ck_assert_msg(ctpu_load(theirs, N_REF, REF_NAMES, u) == CTPU_OK, "%s", ctpu_last_error());
    for (int i = 0; i < N_REF; i++) ck_assert_msg(same_bits(u[i], t[i]), "tensor %s differs", REF_NAMES[i]);
    /* the reader lists a file, and refuses what ctpu refuses */
    ck_assert_msg(run_py(py, script, "read", mine) == 0, "check_safetensors.py read %s failed", mine);
    const char *bad = at("overlap.safetensors");
    write_st(bad, UINT64_MAX, "{" GOOD_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}", F6, 24);
    ck_assert_int_eq(run_py(py, script, "read", bad), 1);
    ck_assert_ptr_null(ctpu_safetensors_open(bad));
    ck_assert(ctpu_is_null(ctpu_safetensors_tensor(NULL, "x")));
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("safetensors");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, t_roundtrip);
    tcase_add_test(tc, t_roundtrip_modes);
    tcase_add_test(tc, t_save_errors);
    tcase_add_test(tc, t_bad_files);
    tcase_add_test(tc, t_fuzz_headers);
    tcase_add_test(tc, t_python_interop);
    suite_add_tcase(s, tc);
    TCase *ts = tcase_create("state");
    tcase_add_checked_fixture(ts, setup, teardown);
    tcase_set_timeout(ts, 300);
    tcase_add_test(ts, t_optim_roundtrip);
    tcase_add_test(ts, t_optim_groups_roundtrip);
    tcase_add_test(ts, t_batch_iter_state);
    tcase_add_test(ts, t_checkpoint_errors);
    tcase_add_test(ts, t_fuzz_checkpoint_metadata);
    tcase_add_test(ts, t_resume_strict);
    tcase_add_test(ts, t_resume_debug);
    tcase_add_test(ts, t_resume_defer_fuse);
    suite_add_tcase(s, ts);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? 1 : 0;
}
