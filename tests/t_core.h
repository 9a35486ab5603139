/* Shared helpers for the core Check suites (test_ops, test_modes,
 * test_handles, test_badinput): a clean environment, init/shutdown fixtures,
 * tensors from literals, host reads, ulp distance. Header-only (static). */
#ifndef T_CORE_H
#define T_CORE_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctpu.h"
#include "eager/eager.h"
#include "eager/env.h"
#include "testing.h"

/* Every variable ctpu_init reads (src/eager/env.h). */
static const char *const T_ENV_VARS[] = {
#define T_ENV_NAME_(name, kind, dflt, doc) #name,
    CTPU_ENV_VARS(T_ENV_NAME_)
#undef T_ENV_NAME_
};
#define T_N_ENV ((int)(sizeof T_ENV_VARS / sizeof T_ENV_VARS[0]))

/* CTPU_ISA as the test process was started with it: tools/run-tests.sh runs
 * the suites again with CTPU_ISA=avx2 and scalar, and every fixture keeps
 * that choice (NULL when it was not set). */
static char t_isa_at_start_[16];
static bool t_isa_forced_;
__attribute__((constructor)) static void t_isa_capture_(void)
{
    const char *v = getenv("CTPU_ISA");
    if (v && strlen(v) < sizeof t_isa_at_start_) { strcpy(t_isa_at_start_, v); t_isa_forced_ = true; }
}
static inline const char *t_forced_isa(void) { return t_isa_forced_ ? t_isa_at_start_ : NULL; }

/* Unset all of them but CTPU_QUIET, which changes only what shutdown
 * prints (meson sets it for the suites whose output it keeps short); then
 * CTPU_ISA back to the value the process started with. */
static inline void t_clear_env(void)
{
    for (int i = 0; i < T_N_ENV; i++)
        if (strcmp(T_ENV_VARS[i], "CTPU_QUIET") != 0) unsetenv(T_ENV_VARS[i]);
    if (t_forced_isa()) setenv("CTPU_ISA", t_forced_isa(), 1);
}

/* Fixtures (checked: they run in the forked child). */
static inline void t_setup(void)
{
    t_clear_env();
    ctpu_status st = ctpu_init();
    ck_assert_msg(st == CTPU_OK, "ctpu_init: %s", ctpu_last_error());
    ctpu_clear_error();
}
static inline void t_teardown(void) { ctpu_shutdown(); }

/* An assertion for hot loops: ck_assert* records a mark point (a pipe write
 * to the parent in fork mode) on every success; this only on failure. */
#define T_CHECK(cond, ...) do { if (!(cond)) ck_abort_msg(__VA_ARGS__); } while (0)

/* ---------------------------------------------------------------- bits */
static inline uint32_t t_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float t_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline bool t_same(float a, float b) { return (a != a && b != b) || t_f2u(a) == t_f2u(b); }

/* Distance in f32 ulps between a and b (ordered integer line); 0 for equal
 * bits, huge for NaN vs non-NaN. */
static inline double t_ulps(float a, float b)
{
    if (a != a || b != b) return (a != a && b != b) ? 0 : 1e30;
    if (a == b) return 0;
    int64_t ia = (int32_t)t_f2u(a), ib = (int32_t)t_f2u(b);
    if (ia < 0) ia = (int64_t)INT32_MIN - ia;
    if (ib < 0) ib = (int64_t)INT32_MIN - ib;
    return (double)llabs(ia - ib);
}

/* ulp of a float value (spacing at |x|). */
static inline double t_ulp_of(double x)
{
    x = fabs(x);
    if (x < 1.1754943508222875e-38) return ldexp(1.0, -149);
    int e;
    frexp(x, &e);
    return ldexp(1.0, e - 24);
}

/* -------------------------------------------------------------- tensors */
static inline ctpu_tensor t_f32(const float *d, int nd, const int64_t *shape)
{
    ctpu_tensor t = ctpu_from_host(d, CTPU_F32, nd, shape);
    ck_assert_msg(!ctpu_is_null(t), "from_host: %s", ctpu_last_error());
    return t;
}
static inline ctpu_tensor t_i32(const int32_t *d, int nd, const int64_t *shape)
{
    ctpu_tensor t = ctpu_from_host(d, CTPU_I32, nd, shape);
    ck_assert_msg(!ctpu_is_null(t), "from_host: %s", ctpu_last_error());
    return t;
}
/* 1-D f32 tensor from a literal list. */
#define T_VEC(...) t_vec_((const float[]){ __VA_ARGS__ }, \
                          (int64_t)(sizeof((const float[]){ __VA_ARGS__ }) / sizeof(float)))
static inline ctpu_tensor t_vec_(const float *d, int64_t n) { return t_f32(d, 1, &n); }

/* Read a tensor (any dtype) as a malloc'd array of its raw elements. */
static inline void *t_read_raw(ctpu_tensor t, int64_t *numel)
{
    int64_t n = ctpu_numel(t);
    ck_assert_msg(n >= 0, "numel: %s", ctpu_last_error());
    size_t es = ctpu_dtype_of(t) == CTPU_BF16 ? 2 : 4;
    void *p = malloc((size_t)(n ? n : 1) * es);
    ck_assert_ptr_nonnull(p);
    ctpu_status st = ctpu_to_host(t, p, (size_t)n * es);
    ck_assert_msg(st == CTPU_OK, "to_host: %s", ctpu_last_error());
    if (numel) *numel = n;
    return p;
}

/* Read any dtype as floats (bf16 widened, i32 converted). */
static inline float *t_read(ctpu_tensor t, int64_t *numel)
{
    int64_t n;
    void *raw = t_read_raw(t, &n);
    ctpu_dtype dt = ctpu_dtype_of(t);
    float *f = malloc((size_t)(n ? n : 1) * 4);
    for (int64_t i = 0; i < n; i++) {
        if (dt == CTPU_F32) f[i] = ((float *)raw)[i];
        else if (dt == CTPU_BF16) f[i] = ctpu_bf16_to_f32(((uint16_t *)raw)[i]);
        else f[i] = (float)((int32_t *)raw)[i];
    }
    free(raw);
    if (numel) *numel = n;
    return f;
}

static inline void t_expect_shape(ctpu_tensor t, int nd, const int64_t *shape)
{
    int64_t s[CTPU_MAX_DIMS];
    int n = -1;
    ck_assert_msg(ctpu_shape(t, s, &n) == CTPU_OK, "shape: %s", ctpu_last_error());
    ck_assert_int_eq(n, nd);
    for (int i = 0; i < nd; i++) ck_assert_int_eq(s[i], shape[i]);
}

static inline bool t_contains(const char *hay, const char *needle)
{
    return hay && needle && strstr(hay, needle) != NULL;
}

/* Deterministic pseudo-random floats (xorshift), independent of ctpu. */
static inline uint64_t t_rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return *s = x;
}
static inline float t_rand_f(uint64_t *s, float lo, float hi)
{
    double u = (double)(t_rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

static inline int64_t t_numel(int nd, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= shape[i];
    return n;
}

#endif /* T_CORE_H */
