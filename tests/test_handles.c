/* Handles, scopes, assign and the runtime lifecycle (CONTRACTS.md "Handles
 * and values", "Scopes"):
 * - a released handle, or one whose scope ended, is CTPU_ERR_STALE_HANDLE;
 * - keep moves a handle one scope out; scopes nest;
 * - assign writes in place when nothing shares the storage (assign_in_place)
 *   and copies otherwise (assign_copy_on_write); the other handle keeps the
 *   old value; views are never written through;
 * - HBM in use returns to the baseline after a scope ends (no leak);
 * - calls before ctpu_init are CTPU_ERR_NOT_INITIALIZED; init twice is
 *   CTPU_ERR_STATE; init/shutdown/init works and old handles are stale. */
#include "t_core.h"
#include "ctpu_nn.h"

#include <unistd.h>

static void expect_vals(ctpu_tensor t, const float *want, int64_t n)
{
    int64_t got_n;
    float *g = t_read(t, &got_n);
    ck_assert_int_eq(got_n, n);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(t_same(g[i], want[i]), "element %lld: got %g want %g", (long long)i, g[i], want[i]);
    free(g);
}

/* ------------------------------------------------------------ stale */
START_TEST(stale_after_release)
{
    ctpu_tensor a = T_VEC(1, 2, 3);
    ck_assert(ctpu_is_valid(a));
    ck_assert_int_eq(ctpu_release(a), CTPU_OK);
    ck_assert(!ctpu_is_valid(a));
    ck_assert_int_eq(ctpu_ndim(a), -1);
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_STALE_HANDLE);
    ck_assert(t_contains(ctpu_last_error(), "ndim"));
    ck_assert_int_eq(ctpu_release(a), CTPU_ERR_STALE_HANDLE);
    ctpu_clear_error();
    ctpu_tensor b = T_VEC(4, 5, 6);
    ck_assert(ctpu_is_null(ctpu_add(a, b)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_STALE_HANDLE);
    ck_assert(t_contains(ctpu_last_error(), "add"));
    float buf[3];
    ck_assert_int_eq(ctpu_to_host(a, buf, sizeof buf), CTPU_ERR_STALE_HANDLE);
    /* the slot is reused by the next handle: the old one must stay stale */
    ctpu_tensor c = T_VEC(7, 8, 9);
    ck_assert(ctpu_is_valid(c));
    ck_assert(!ctpu_is_valid(a));
    ck_assert_int_eq(ctpu_numel(a), -1);
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_STALE_HANDLE);
    expect_vals(c, (float[]){ 7, 8, 9 }, 3);
}
END_TEST

START_TEST(stale_after_scope_end)
{
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    ctpu_tensor a = T_VEC(1, 2);
    ctpu_tensor b = ctpu_exp(a);
    ck_assert(!ctpu_is_null(b));
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    ck_assert(!ctpu_is_valid(a));
    ck_assert(!ctpu_is_valid(b));
    ck_assert(ctpu_is_null(ctpu_neg(b)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_STALE_HANDLE);
    ck_assert(t_contains(ctpu_last_error(), "neg"));
    ck_assert_int_eq(ctpu_release(b), CTPU_ERR_STALE_HANDLE);
    /* no scope open */
    ck_assert_int_eq(ctpu_scope_end(), CTPU_ERR_STATE);
    ck_assert(t_contains(ctpu_last_error(), "scope_end"));
}
END_TEST

START_TEST(keep_moves_out)
{
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    ctpu_tensor a = T_VEC(1, 2);
    ctpu_tensor b = ctpu_mul_scalar(a, 3);
    ck_assert(ctpu_keep(b).id == b.id);
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    ck_assert(!ctpu_is_valid(a));
    ck_assert(ctpu_is_valid(b));
    expect_vals(b, (float[]){ 3, 6 }, 2);
    /* keep(null) is null with an error naming the call, as every call's null argument */
    ctpu_clear_error();
    ck_assert(ctpu_is_null(ctpu_keep(CTPU_NULL)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_NULL_HANDLE);
    ck_assert_msg(strstr(ctpu_last_error(), "keep") && strstr(ctpu_last_error(), "t"), "%s", ctpu_last_error());
    ctpu_clear_error();
}
END_TEST

START_TEST(nested_scopes)
{
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);          /* A */
    ctpu_tensor a = T_VEC(1);
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);          /* B */
    ctpu_tensor b = T_VEC(2);
    ctpu_tensor k1 = ctpu_keep(ctpu_add(a, b));             /* -> A */
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);          /* C */
    ctpu_tensor c = T_VEC(3);
    ctpu_tensor k2 = ctpu_keep(ctpu_keep(c));               /* C -> B -> A */
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);            /* end C */
    ck_assert(ctpu_is_valid(c) && ctpu_is_valid(k2));
    ck_assert(ctpu_is_valid(b));
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);            /* end B */
    ck_assert(!ctpu_is_valid(b));
    ck_assert(ctpu_is_valid(k1) && ctpu_is_valid(k2) && ctpu_is_valid(a));
    expect_vals(k1, (float[]){ 3 }, 1);
    ctpu_tensor g = ctpu_keep(k1);                          /* -> global */
    ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);            /* end A */
    ck_assert(!ctpu_is_valid(a));
    ck_assert(!ctpu_is_valid(k2));
    ck_assert(ctpu_is_valid(g));
    expect_vals(g, (float[]){ 3 }, 1);
    /* a step scope is a scope too, and must be ended as a step */
    ck_assert_int_eq(ctpu_step_begin(), CTPU_OK);
    ctpu_tensor s = T_VEC(5);
    ck_assert_int_eq(ctpu_scope_end(), CTPU_ERR_STATE);
    ck_assert_int_eq(ctpu_step_end(), CTPU_OK);
    ck_assert(!ctpu_is_valid(s));
    ck_assert_int_eq(ctpu_release(g), CTPU_OK);
}
END_TEST

START_TEST(scope_depth_limit)
{
    int opened = 0;
    while (ctpu_scope_begin() == CTPU_OK && opened < 1000) opened++;
    ck_assert_int_eq(opened, 64);
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_STATE);
    for (int i = 0; i < opened; i++) ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
    ck_assert_int_eq(ctpu_scope_end(), CTPU_ERR_STATE);
    ctpu_tensor a = T_VEC(1);
    ck_assert(ctpu_is_valid(a));
}
END_TEST

/* ------------------------------------------------------------ assign */
START_TEST(assign_in_place)
{
    ctpu_tensor x = T_VEC(1, 2, 3);
    ctpu_tensor y = T_VEC(4, 5, 6);
    int64_t ip = ctpu_metric_counter("assign_in_place"), cw = ctpu_metric_counter("assign_copy_on_write");
    ctpu_trec *rx = ctpu_rec_get(x, "t", "x", false);
    void *data_before = rx->buf->data;
    ck_assert_int_eq(ctpu_assign(x, y), CTPU_OK);
    ck_assert_int_eq(ctpu_metric_counter("assign_in_place"), ip + 1);
    ck_assert_int_eq(ctpu_metric_counter("assign_copy_on_write"), cw);
    ck_assert_ptr_eq(rx->buf->data, data_before);
    expect_vals(x, (float[]){ 4, 5, 6 }, 3);
    expect_vals(y, (float[]){ 4, 5, 6 }, 3);
    /* y is unaffected by a later assign to x */
    ck_assert_int_eq(ctpu_assign(x, ctpu_neg(y)), CTPU_OK);
    expect_vals(x, (float[]){ -4, -5, -6 }, 3);
    expect_vals(y, (float[]){ 4, 5, 6 }, 3);
    /* assign to itself is a no-op */
    ck_assert_int_eq(ctpu_assign(x, x), CTPU_OK);
    expect_vals(x, (float[]){ -4, -5, -6 }, 3);
}
END_TEST

/* An op enqueued before an in-place assign reads the old value. */
START_TEST(assign_in_place_pending_read)
{
    ctpu_tensor x = T_VEC(1, 2, 3);
    ctpu_tensor y = T_VEC(10, 20, 30);
    ctpu__test_device_hold(true);
    ctpu_tensor z = ctpu_mul_scalar(x, 2);
    ck_assert_int_eq(ctpu_assign(x, y), CTPU_OK);
    ctpu_tensor w = ctpu_mul_scalar(x, 2);
    ctpu__test_device_hold(false);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    expect_vals(z, (float[]){ 2, 4, 6 }, 3);
    expect_vals(w, (float[]){ 20, 40, 60 }, 3);
}
END_TEST

START_TEST(assign_copy_on_write_view)
{
    int64_t s23[2] = { 2, 3 };
    ctpu_tensor x = T_VEC(1, 2, 3, 4, 5, 6);
    ctpu_tensor v = ctpu_reshape(x, 2, s23);            /* shares x's storage */
    ck_assert(!ctpu_is_null(v));
    ctpu_tensor y = T_VEC(9, 8, 7, 6, 5, 4);
    int64_t ip = ctpu_metric_counter("assign_in_place"), cw = ctpu_metric_counter("assign_copy_on_write");
    ck_assert_int_eq(ctpu_assign(x, y), CTPU_OK);
    ck_assert_int_eq(ctpu_metric_counter("assign_copy_on_write"), cw + 1);
    ck_assert_int_eq(ctpu_metric_counter("assign_in_place"), ip);
    expect_vals(x, (float[]){ 9, 8, 7, 6, 5, 4 }, 6);
    expect_vals(v, (float[]){ 1, 2, 3, 4, 5, 6 }, 6);     /* value semantics */
    /* once x has its own storage, the next assign is in place */
    ck_assert_int_eq(ctpu_assign(x, ctpu_neg(y)), CTPU_OK);
    ck_assert_int_eq(ctpu_metric_counter("assign_in_place"), ip + 1);
    expect_vals(v, (float[]){ 1, 2, 3, 4, 5, 6 }, 6);
    /* assigning the view never writes through into ... nothing shares v now */
    ctpu_tensor z = ctpu_zeros(CTPU_F32, 2, s23);
    ck_assert_int_eq(ctpu_assign(v, z), CTPU_OK);
    expect_vals(v, (float[]){ 0, 0, 0, 0, 0, 0 }, 6);
    expect_vals(x, (float[]){ -9, -8, -7, -6, -5, -4 }, 6);
}
END_TEST

START_TEST(assign_copy_on_write_other_handle)
{
    ctpu_tensor x = T_VEC(1, 2, 3);
    ctpu_tensor h = ctpu_contiguous(x);                 /* another handle, same storage */
    ck_assert(!ctpu_is_null(h));
    int64_t cw = ctpu_metric_counter("assign_copy_on_write");
    ck_assert_int_eq(ctpu_assign(h, T_VEC(7, 7, 7)), CTPU_OK);
    ck_assert_int_eq(ctpu_metric_counter("assign_copy_on_write"), cw + 1);
    expect_vals(h, (float[]){ 7, 7, 7 }, 3);
    expect_vals(x, (float[]){ 1, 2, 3 }, 3);
    /* after the sharer is released, the storage is x's alone: in place */
    ctpu_tensor x2 = ctpu_contiguous(x);
    ck_assert_int_eq(ctpu_release(x2), CTPU_OK);
    int64_t ip = ctpu_metric_counter("assign_in_place");
    ck_assert_int_eq(ctpu_assign(x, T_VEC(0, 1, 0)), CTPU_OK);
    ck_assert_int_eq(ctpu_metric_counter("assign_in_place"), ip + 1);
    expect_vals(x, (float[]){ 0, 1, 0 }, 3);
}
END_TEST

START_TEST(slice_view_not_written_through)
{
    int64_t s = 6;
    float d[6] = { 1, 2, 3, 4, 5, 6 };
    ctpu_tensor x = t_f32(d, 1, &s);
    ctpu_tensor a = ctpu_slice(x, 0, 1, 4, 1);          /* contiguous slice: a view */
    ctpu_tensor b = ctpu_slice(x, 0, 3, 6, 1);
    ck_assert(!ctpu_is_null(a) && !ctpu_is_null(b));
    expect_vals(a, (float[]){ 2, 3, 4 }, 3);
    ck_assert_int_eq(ctpu_assign(a, b), CTPU_OK);       /* overlapping storage */
    expect_vals(a, (float[]){ 4, 5, 6 }, 3);
    expect_vals(b, (float[]){ 4, 5, 6 }, 3);
    expect_vals(x, d, 6);
    ck_assert_int_eq(ctpu_assign(b, ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 3 })), CTPU_OK);
    expect_vals(x, d, 6);
    expect_vals(b, (float[]){ 0, 0, 0 }, 3);
    expect_vals(a, (float[]){ 4, 5, 6 }, 3);
}
END_TEST

START_TEST(assign_errors)
{
    ctpu_tensor x = T_VEC(1, 2, 3);
    ck_assert_int_eq(ctpu_assign(x, T_VEC(1, 2)), CTPU_ERR_SHAPE);
    ck_assert(t_contains(ctpu_last_error(), "assign"));
    int32_t iv[3] = { 1, 2, 3 };
    int64_t s3 = 3;
    ck_assert_int_eq(ctpu_assign(x, t_i32(iv, 1, &s3)), CTPU_ERR_DTYPE);
    ck_assert(t_contains(ctpu_last_error(), "assign"));
    expect_vals(x, (float[]){ 1, 2, 3 }, 3);
}
END_TEST

/* After a fault latched on a tensor, assigning it a good value gives a good
 * tensor (the new value replaces the faulted one). */
START_TEST(assign_over_faulted_value)
{
    float w[4] = { 1, 2, 3, 4 };
    int64_t ws[2] = { 2, 2 }, is = 1;
    int32_t bad = 5;
    ctpu_tensor e = ctpu_embedding(t_f32(w, 2, ws), t_i32(&bad, 1, &is));
    ck_assert(!ctpu_is_null(e));
    ck_assert_int_eq(ctpu_sync(), CTPU_ERR_DEVICE_FAULT);
    int64_t s12[2] = { 1, 2 };
    ctpu_tensor good = ctpu_full(CTPU_F32, 2, s12, 3.0);
    ck_assert_int_eq(ctpu_assign(e, good), CTPU_OK);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    expect_vals(e, (float[]){ 3, 3 }, 2);
}
END_TEST

/* ------------------------------------------------------------ memory */
START_TEST(no_leak_after_scope)
{
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ctpu_hbm_stats base;
    ck_assert_int_eq(ctpu_hbm_get_stats(&base), CTPU_OK);
    for (int it = 0; it < 3; it++) {
        ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
        int64_t s[2] = { 33, 17 };
        ctpu_tensor a = ctpu_rand_uniform(CTPU_F32, 2, s, -1, 1);
        ctpu_tensor b = ctpu_reshape(a, 2, (int64_t[]){ 17, 33 });
        ctpu_tensor c = ctpu_matmul(a, b);
        ctpu_tensor d = ctpu_softmax(ctpu_add(c, ctpu_sum(c, 1, (int[]){ 0 }, true)), -1);
        ctpu_tensor e = ctpu_concat(2, (ctpu_tensor[]){ d, d }, 0);
        ctpu_tensor f = ctpu_slice(e, 1, 0, 10, 3);
        ck_assert(!ctpu_is_null(f));
        ck_assert_int_eq(ctpu_assign(a, ctpu_neg(a)), CTPU_OK);   /* copy-on-write (b shares) */
        ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        ck_assert_int_eq(ctpu_sync(), CTPU_OK);
        ctpu_hbm_stats now;
        ck_assert_int_eq(ctpu_hbm_get_stats(&now), CTPU_OK);
        ck_assert_uint_eq(now.in_use, base.in_use);
        ck_assert_uint_eq(now.allocs - base.allocs, now.frees - base.frees);
    }
    /* explicit release, no scope */
    ctpu_tensor g = ctpu_ones(CTPU_BF16, 1, (int64_t[]){ 1000 });
    ctpu_tensor h = ctpu_reshape(g, 2, (int64_t[]){ 10, 100 });
    ck_assert_int_eq(ctpu_release(g), CTPU_OK);
    ctpu_hbm_stats mid;
    ctpu_hbm_get_stats(&mid);
    ck_assert_uint_gt(mid.in_use, base.in_use);         /* h still holds it */
    ck_assert_int_eq(ctpu_release(h), CTPU_OK);
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    ctpu_hbm_get_stats(&mid);
    ck_assert_uint_eq(mid.in_use, base.in_use);
}
END_TEST

/* ------------------------------------------------------------ lifecycle */
START_TEST(before_init)
{
    t_clear_env();
    ck_assert(!ctpu_is_initialized());
    ctpu_tensor fake = { ((uint64_t)1 << 32) | 1 };
    float x = 1;
    int64_t s = 1;
    double v;
    ctpu_hbm_stats hs;
    uint64_t a, b;
    ck_assert(ctpu_is_null(ctpu_from_host(&x, CTPU_F32, 1, &s)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_NOT_INITIALIZED);
    ck_assert(t_contains(ctpu_last_error(), "from_host"));
    ck_assert(ctpu_is_null(ctpu_add(fake, fake)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_NOT_INITIALIZED);
    ck_assert(t_contains(ctpu_last_error(), "add"));
    ck_assert(ctpu_is_null(ctpu_zeros(CTPU_F32, 1, &s)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_sync(), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_scope_end(), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_step_begin(), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_mark_step(), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_release(fake), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_item(fake, &v), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_to_host(fake, &x, 4), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_assign(fake, fake), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_ndim(fake), -1);
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_hbm_get_stats(&hs), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEBUG), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_set_thread_mode(CTPU_MODE_DEBUG), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_set_debug_checks(true), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_set_matmul_precision(CTPU_PRECISION_HIGH), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_rng_get_state(&a, &b), CTPU_ERR_NOT_INITIALIZED);
    ck_assert_int_eq(ctpu_rng_set_state(1, 2), CTPU_ERR_NOT_INITIALIZED);
    ck_assert(ctpu_is_null(ctpu_rand_uniform(CTPU_F32, 1, &s, 0, 1)));
    ck_assert(ctpu_is_null(ctpu_arange(0, 4, 1, CTPU_F32)));
    ck_assert(ctpu_is_null(ctpu_concat(1, &fake, 0)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_NOT_INITIALIZED);
    ck_assert(ctpu_is_null(ctpu_keep(fake)));
    ck_assert(!ctpu_is_valid(fake));
    ck_assert_ptr_null(ctpu_chip());
    ck_assert_int_eq(ctpu_metric_counter("syncs"), 0);
    ctpu_manual_seed(3);          /* no-ops, no crash */
    ctpu_hbm_reset_peak();
    ctpu_metrics_clear();
    ctpu_shutdown();
    ctpu_metrics_report(NULL);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert(ctpu_is_initialized());
    ctpu_shutdown();
    ck_assert(!ctpu_is_initialized());
    ck_assert(ctpu_is_null(ctpu_from_host(&x, CTPU_F32, 1, &s)));
    ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_NOT_INITIALIZED);
}
END_TEST

START_TEST(init_twice)
{
    t_clear_env();
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ck_assert_int_eq(ctpu_init(), CTPU_ERR_STATE);
    ck_assert(t_contains(ctpu_last_error(), "init"));
    ctpu_tensor a = T_VEC(1, 2);          /* still usable */
    expect_vals(ctpu_add(a, a), (float[]){ 2, 4 }, 2);
    ctpu_shutdown();
    ctpu_shutdown();                       /* safe twice */
}
END_TEST

START_TEST(init_shutdown_init)
{
    t_clear_env();
    ctpu_tensor old[4];
    for (int round = 0; round < 3; round++) {
        ck_assert_int_eq(ctpu_init(), CTPU_OK);
        /* handles of the previous runtime are stale, never aliases of new ones */
        ctpu_tensor fresh[4];
        for (int i = 0; i < 4; i++) fresh[i] = T_VEC((float)(round * 10 + i));
        if (round > 0) {
            for (int i = 0; i < 4; i++) {
                ck_assert(!ctpu_is_valid(old[i]));
                ck_assert_int_eq(ctpu_numel(old[i]), -1);
                ck_assert_int_eq(ctpu_last_status(), CTPU_ERR_STALE_HANDLE);
            }
        }
        ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);   /* left open on purpose */
        ctpu_tensor s = ctpu_sum(ctpu_concat(4, fresh, 0), 0, NULL, false);
        double v;
        ck_assert_int_eq(ctpu_item(s, &v), CTPU_OK);
        ck_assert(v == round * 40 + 6);
        for (int i = 0; i < 4; i++) old[i] = fresh[i];
        ctpu_shutdown();
    }
}
END_TEST

/* ctpu_print: PyTorch's layout, shape and dtype. */
static char *printed(ctpu_tensor t)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    ck_assert_msg(ctpu_print(t, f) == CTPU_OK, "%s", ctpu_last_error());
    fclose(f);
    return buf;
}
#define PRINTS(t, want)                                                                                       \
    do {                                                                                                      \
        char *got_ = printed(t);                                                                              \
        ck_assert_msg(strcmp(got_, want) == 0, "got:\n%s\nwant:\n%s", got_, want);                           \
        free(got_);                                                                                           \
    } while (0)

/* A write error the stream buffers (a full device) is CTPU_ERR_IO, as the
 * docstring promises: found by a new-user trial (print checked ferror before
 * fflush, so it returned OK). */
START_TEST(print_write_error_is_io)
{
    FILE *f = fopen("/dev/full", "w");
    if (!f) return;   /* no /dev/full here: nothing to check */
    ctpu_tensor t = ctpu_from_host((float[]){ 1, 2 }, CTPU_F32, 1, (int64_t[]){ 2 });
    ck_assert_int_eq(ctpu_print(t, f), CTPU_ERR_IO);
    ck_assert_ptr_nonnull(strstr(ctpu_last_error(), "print"));
    fclose(f);
    ck_assert(!ctpu_is_null(ctpu_neg(t)));   /* the runtime stays usable */
}
END_TEST

START_TEST(print_like_torch)
{
    float a[6] = { 1, 2, 3, 4, 5, 6 };
    PRINTS(ctpu_from_host(a, CTPU_F32, 2, (int64_t[]){ 2, 3 }),
           "tensor([[1., 2., 3.],\n        [4., 5., 6.]], shape=(2, 3), dtype=f32)\n");
    PRINTS(ctpu_from_host((float[]){ 0.5f, -1.25f, 3 }, CTPU_F32, 1, (int64_t[]){ 3 }),
           "tensor([ 0.5000, -1.2500,  3.0000], shape=(3,), dtype=f32)\n");
    PRINTS(ctpu_from_host((float[]){ 1e-5f, 1 }, CTPU_F32, 1, (int64_t[]){ 2 }),
           "tensor([1.0000e-05, 1.0000e+00], shape=(2,), dtype=f32)\n");
    PRINTS(ctpu_full(CTPU_BF16, 0, NULL, 2.5), "tensor(2.5000, shape=(), dtype=bf16)\n");
    PRINTS(ctpu_arange(0, 4, 1, CTPU_I32), "tensor([0, 1, 2, 3], shape=(4,), dtype=i32)\n");
    PRINTS(ctpu_zeros(CTPU_F32, 2, (int64_t[]){ 0, 3 }), "tensor([], shape=(0, 3), dtype=f32)\n");
    PRINTS(ctpu_div(ctpu_arange(-1, 2, 1, CTPU_F32), ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 3 })),
           "tensor([-inf,  nan,  inf], shape=(3,), dtype=f32)\n");
    /* 3-D: a blank line between the first dim's entries */
    PRINTS(ctpu_reshape(ctpu_arange(0, 8, 1, CTPU_I32), 3, (int64_t[]){ 2, 2, 2 }),
           "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]], shape=(2, 2, 2), dtype=i32)\n");
    /* past 1000 elements: first and last 3 of each dim around ... */
    PRINTS(ctpu_arange(0, 2000, 1, CTPU_I32), "tensor([   0,    1,    2, ..., 1997, 1998, 1999], shape=(2000,), dtype=i32)\n");
    PRINTS(ctpu_reshape(ctpu_arange(0, 1010, 1, CTPU_F32), 2, (int64_t[]){ 101, 10 }),
           "tensor([[   0.,    1.,    2., ...,    7.,    8.,    9.],\n"
           "        [  10.,   11.,   12., ...,   17.,   18.,   19.],\n"
           "        [  20.,   21.,   22., ...,   27.,   28.,   29.],\n"
           "        ...,\n"
           "        [ 980.,  981.,  982., ...,  987.,  988.,  989.],\n"
           "        [ 990.,  991.,  992., ...,  997.,  998.,  999.],\n"
           "        [1000., 1001., 1002., ..., 1007., 1008., 1009.]], shape=(101, 10), dtype=f32)\n");
    /* exactly 1000 elements: all of them; a long row wraps at 80 columns */
    char *all = printed(ctpu_arange(0, 1000, 1, CTPU_I32));
    ck_assert(!strstr(all, "..."));
    ck_assert(strstr(all, " 999]"));
    for (char *l = all; *l; ) {
        char *nl = strchr(l, '\n');
        ck_assert_int_le(nl - l, 80 + 30);   /* the last line carries shape and dtype */
        l = nl + 1;
    }
    free(all);
    /* the same in defer and fuse (a host read cuts the trace) */
    ck_assert_int_eq(ctpu_set_mode(CTPU_MODE_DEFER_FUSE), CTPU_OK);
    PRINTS(ctpu_mul_scalar(ctpu_from_host(a, CTPU_F32, 1, (int64_t[]){ 6 }), 0.5),
           "tensor([0.5000, 1.0000, 1.5000, 2.0000, 2.5000, 3.0000], shape=(6,), dtype=f32)\n");
}
END_TEST

/* Host bf16 data from floats, and any dtype back as floats. */
START_TEST(host_bf16_helpers)
{
    float src[8] = { 1.0f, 1.00390625f, 1.01171875f, -3.14159f, 1e-40f, INFINITY, NAN, 65504.0f };
    int64_t n = 8;
    ctpu_tensor h = ctpu_from_host_f32_as_bf16(src, 1, &n);
    ck_assert_int_eq(ctpu_dtype_of(h), CTPU_BF16);
    ctpu_tensor c = ctpu_cast(ctpu_from_host(src, CTPU_F32, 1, &n), CTPU_BF16);
    uint16_t hb[8], cb[8];
    ck_assert_int_eq(ctpu_to_host(h, hb, sizeof hb), CTPU_OK);
    ck_assert_int_eq(ctpu_to_host(c, cb, sizeof cb), CTPU_OK);
    for (int i = 0; i < 8; i++) ck_assert_msg(hb[i] == cb[i], "element %d: %04x vs cast %04x", i, hb[i], cb[i]);
    ck_assert_uint_eq(hb[0], 0x3f80);
    ck_assert_uint_eq(hb[1], 0x3f80);        /* a tie rounds to even */
    ck_assert_uint_eq(hb[4], 0x0000);        /* a bf16 subnormal is zero */
    float back[8];
    ck_assert_int_eq(ctpu_to_host_as_f32(h, back, sizeof back), CTPU_OK);
    for (int i = 0; i < 8; i++) ck_assert(t_same(back[i], ctpu_bf16_to_f32(hb[i])));
    ck_assert_int_eq(ctpu_to_host_as_f32(h, back, 31), CTPU_ERR_INVALID_ARG);   /* needs 8 floats */
    ck_assert(t_contains(ctpu_last_error(), "to_host_as_f32"));
    /* i32 and f32 */
    float iv[4];
    ck_assert_int_eq(ctpu_to_host_as_f32(ctpu_arange(-2, 2, 1, CTPU_I32), iv, sizeof iv), CTPU_OK);
    ck_assert(iv[0] == -2 && iv[3] == 1);
    float fv[8];
    ck_assert_int_eq(ctpu_to_host_as_f32(ctpu_from_host(src, CTPU_F32, 1, &n), fv, sizeof fv), CTPU_OK);
    for (int i = 0; i < 8; i++) ck_assert(t_same(fv[i], src[i]));
}
END_TEST

/* ------------------------------------------------------------ leak watch */
/* What fn writes on stderr (at most 4 KiB). */
static const char *stderr_during(void (*fn)(int), int arg)
{
    static char buf[4096];
    char path[] = "/tmp/ctpu_leak_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fdopen(fd, "r");
    fseek(f, 0, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    remove(path);
    return buf;
}

static void leave_and_shut_down(int quiet)
{
    ctpu_shutdown();
    t_clear_env();
    if (quiet) setenv("CTPU_QUIET", "1", 1); else unsetenv("CTPU_QUIET");
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    ctpu_tensor a = ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 1024 });         /* 4 KiB */
    ctpu_tensor v = ctpu_reshape(a, 2, (int64_t[]){ 32, 32 });            /* a view: no more bytes */
    ck_assert_int_eq(ctpu_label_push("block1"), CTPU_OK);     /* the lines name the region */
    ctpu_tensor b = ctpu_exp(a);
    ctpu_tensor c = ctpu_exp(b);
    ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
    ck_assert(!ctpu_is_null(v) && !ctpu_is_null(c));
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
    ctpu_tensor d = ctpu_full(CTPU_F32, 1, (int64_t[]){ 16 }, 1);         /* 64 bytes, in the open scope */
    ck_assert(!ctpu_is_null(d));
    ctpu_set_mode(CTPU_MODE_STRICT);
    ctpu_shutdown();
    setenv("CTPU_QUIET", "1", 1);
}

START_TEST(shutdown_reports_what_it_released)
{
    const char *e = stderr_during(leave_and_shut_down, 0);
    const char *line = strstr(e, "ctpu: at shutdown");
    ck_assert_msg(line != NULL, "stderr: %s", e);
    ck_assert_str_eq(line, "ctpu: at shutdown 5 handles were still live, holding 12.1 KiB of HBM (most: exp (\"block1\") "
                           "8.0 KiB in 2, full 4.1 KiB in 2, reshape 0 bytes in 1); 2 scopes still open on this thread (a "
                           "missing ctpu_scope_end or ctpu_step_end); ctpu_shutdown released them\n");
    ck_assert_str_eq(stderr_during(leave_and_shut_down, 1), "");   /* CTPU_QUIET=1 */
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
}
END_TEST

/* A loss left live: the leak line names the user's call, not the div the
 * library made last (mode 0 strict, 1 defer and fuse). */
static void leave_a_loss(int mode)
{
    ctpu_shutdown();
    t_clear_env();
    unsetenv("CTPU_QUIET");
    if (mode) setenv("TORCH_TPU_DEFER_AND_FUSE", "1", 1);
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
    float lg[6] = { 1, 2, 3, 4, 5, 6 };
    int32_t lb[2] = { 1, 2 };
    ctpu_tensor L = ctpu_from_host(lg, CTPU_F32, 2, (int64_t[]){ 2, 3 });
    ctpu_tensor T = ctpu_from_host(lb, CTPU_I32, 1, (int64_t[]){ 2 });
    ctpu_tensor ce = ctpu_cross_entropy(L, T, NULL);
    ctpu_tensor nl = ctpu_nll_loss(L, T, NULL);
    ck_assert(!ctpu_is_null(ce) && !ctpu_is_null(nl));
    ctpu_release(L);
    ctpu_release(T);
    ctpu_sync();
    ctpu_shutdown();
    unsetenv("TORCH_TPU_DEFER_AND_FUSE");
    setenv("CTPU_QUIET", "1", 1);
}

START_TEST(shutdown_names_the_loss_not_its_ops)
{
    for (int mode = 0; mode < 2; mode++) {
        const char *e = stderr_during(leave_a_loss, mode);
        const char *line = strstr(e, "ctpu: at shutdown 2 handles were still live");
        ck_assert_msg(line != NULL, "stderr: %s", e);
        ck_assert_msg(strstr(line, "cross_entropy") && strstr(line, "nll_loss"), "%s", line);
        ck_assert_msg(!strstr(line, "div") && !strstr(line, "gather"), "%s", line);
    }
    ck_assert_int_eq(ctpu_init(), CTPU_OK);
}
END_TEST

/* kind 0: a 256 KiB tensor per step never released; 1: a scope per step
 * never ended; 2: released every step, one 64 MiB allocation at step 50
 * (no warning). */
static void leaky_loop(int kind)
{
    ctpu_tensor big = CTPU_NULL;
    for (int s = 0; s < 240; s++) {
        if (kind == 1 && s < 60) ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
        if (kind == 2) ck_assert_int_eq(ctpu_scope_begin(), CTPU_OK);
        if (kind == 0) ck_assert_int_eq(ctpu_label_push("cache.kv"), CTPU_OK);
        ctpu_tensor t = ctpu_full(CTPU_F32, 1, (int64_t[]){ 65536 }, s);
        if (kind == 0) ck_assert_int_eq(ctpu_label_pop(), CTPU_OK);
        ck_assert(!ctpu_is_null(t));
        if (kind == 2 && s == 50) big = ctpu_keep(ctpu_zeros(CTPU_F32, 1, (int64_t[]){ 16 << 20 }));
        if (kind == 2) ck_assert_int_eq(ctpu_scope_end(), CTPU_OK);
        ck_assert_int_eq(ctpu_mark_step(), CTPU_OK);
    }
    ck_assert_int_eq(ctpu_sync(), CTPU_OK);
    if (!ctpu_is_null(big)) ctpu_release(big);
}

START_TEST(hbm_growth_warns_once_with_its_cause)
{
    const char *e = stderr_during(leaky_loop, 0);
    ck_assert_msg(strncmp(e, "ctpu: warning: HBM in use grew from ", 36) == 0 && strchr(e, '\n') == e + strlen(e) - 1,
                  "one warning wanted: %s", e);
    ck_assert_msg(strstr(e, "over the last 100 marked steps (to step ") &&
                  strstr(e, "likely cause: handles made outside a scope (or kept) and never released: ") &&
                  strstr(e, "the most made by full (\"cache.kv\") ("), "%s", e);
}
END_TEST

START_TEST(hbm_growth_names_a_missing_scope_end)
{
    const char *e = stderr_during(leaky_loop, 1);
    ck_assert_msg(strstr(e, "likely cause: a missing ctpu_scope_end (this thread's scopes went from 1 to 60 deep)") &&
                  strchr(e, '\n') == e + strlen(e) - 1, "%s", e);
}
END_TEST

START_TEST(hbm_one_time_growth_is_no_leak)
{
    ck_assert_str_eq(stderr_during(leaky_loop, 2), "");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("handles");
    TCase *t = tcase_create("handles");
    tcase_add_checked_fixture(t, t_setup, t_teardown);
    tcase_set_timeout(t, 60);
    tcase_add_test(t, stale_after_release);
    tcase_add_test(t, stale_after_scope_end);
    tcase_add_test(t, keep_moves_out);
    tcase_add_test(t, nested_scopes);
    tcase_add_test(t, scope_depth_limit);
    tcase_add_test(t, assign_in_place);
    tcase_add_test(t, assign_in_place_pending_read);
    tcase_add_test(t, assign_copy_on_write_view);
    tcase_add_test(t, assign_copy_on_write_other_handle);
    tcase_add_test(t, slice_view_not_written_through);
    tcase_add_test(t, assign_errors);
    tcase_add_test(t, assign_over_faulted_value);
    tcase_add_test(t, no_leak_after_scope);
    tcase_add_test(t, shutdown_names_the_loss_not_its_ops);
    tcase_add_test(t, print_like_torch);
    tcase_add_test(t, print_write_error_is_io);
    tcase_add_test(t, host_bf16_helpers);
    tcase_add_test(t, shutdown_reports_what_it_released);
    tcase_add_test(t, hbm_growth_warns_once_with_its_cause);
    tcase_add_test(t, hbm_growth_names_a_missing_scope_end);
    tcase_add_test(t, hbm_one_time_growth_is_no_leak);
    suite_add_tcase(s, t);
    TCase *l = tcase_create("lifecycle");
    tcase_set_timeout(l, 60);
    tcase_add_test(l, before_init);
    tcase_add_test(l, init_twice);
    tcase_add_test(l, init_shutdown_init);
    suite_add_tcase(s, l);
    return s;
}

int main(void)
{
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
