/* Data parallel (issue 19), as torch.nn.parallel.DistributedDataParallel:
 * the parameters are broadcast from rank 0 at creation, and after backward
 * the gradients are averaged over the ranks in buckets (one all_reduce per
 * bucket of flattened, concatenated gradients; buckets in reverse parameter
 * order, as DDP's, since the last layers' gradients are ready first).
 * Built on the public API only.
 *
 * Dropout counter ranges: rank r's step draws the counters that micro-batch
 * r would draw in one process accumulating the N micro-batches in rank
 * order: [base + r * D, base + (r + 1) * D) with D the draws of one
 * micro-batch's forward and backward; after the step every rank's generator
 * is at base + N * D, where the one process would be. */
#include <stdlib.h>
#include <string.h>

#include "ctpu_nn.h"
#include "nn_internal.h"

struct ctpu_ddp {
    int n;
    ctpu_tensor *params;     /* [n], not owned */
    int n_buckets;
    int *bucket_of;          /* [n] */
    int *order;              /* [n] parameter indices in bucket order */
    int *bucket_start;       /* [n_buckets + 1] into order */
    int64_t draws;           /* D, 0 until known */
    uint64_t base;           /* generator offset at step_begin */
    bool in_step;
    int64_t steps;
    /* overlap: buckets started from the gradient hooks during backward */
    bool overlap;
    bool *ready;             /* [n] this round's gradient is final */
    bool *hooked;            /* [n] the hook is registered */
    int *left;               /* [n_buckets] parameters not ready yet */
    ctpu_tensor *started;    /* [n_buckets] the started all_reduce, or null */
    bool stale;              /* a gradient changed after its bucket started (a second backward) */
    int64_t overlapped, blocking;   /* buckets reduced each way */
};

ctpu_ddp_opts ctpu_ddp_defaults(void) { return (ctpu_ddp_opts){ 25ll << 20, 0, true, true }; }

void ctpu_ddp_shard(int64_t n, int rank, int world, int64_t *lo, int64_t *hi)
{
    if (n < 0) n = 0;
    if (world < 1) world = 1;
    if (rank < 0) rank = 0;
    if (rank >= world) rank = world - 1;
    /* floor(n r / N) without overflow: n = q N + m gives q r + floor(m r / N) */
    int64_t q = n / world, m = n % world;
    if (lo) *lo = q * rank + m * rank / world;
    if (hi) *hi = q * (rank + 1) + m * (rank + 1) / world;
}

static int64_t elem_bytes(ctpu_dtype dt) { return dt == CTPU_BF16 ? 2 : 4; }

/* A new round (after sync_grads): nothing ready, nothing started. */
static void round_reset(ctpu_ddp *d)
{
    for (int i = 0; i < d->n; i++) d->ready[i] = false;
    for (int b = 0; b < d->n_buckets; b++) {
        d->left[b] = d->bucket_start[b + 1] - d->bucket_start[b];
        d->started[b] = CTPU_NULL;
    }
    d->stale = false;
}

/* Bucket b's gradients flattened and concatenated (in the current scope);
 * a parameter without a gradient contributes zeros, so every rank makes
 * the same collectives. */
static ctpu_status bucket_flat(ctpu_ddp *d, int b, ctpu_tensor *cat)
{
    int k0 = d->bucket_start[b], k1 = d->bucket_start[b + 1], nk = k1 - k0;
    ctpu_tensor flat[64], *fl = nk <= 64 ? flat : malloc(sizeof(ctpu_tensor) * (size_t)nk);
    if (!fl) return ctpu_report_error(CTPU_ERR_OOM, "ddp_sync_grads: out of host memory");
    ctpu_status st = CTPU_OK;
    for (int k = k0; k < k1 && st == CTPU_OK; k++) {
        ctpu_tensor p = d->params[d->order[k]];
        int64_t numel = ctpu_numel(p);
        if (numel < 0) {
            st = ctpu_last_status();
            break;
        }
        ctpu_tensor g = ctpu_grad(p);
        if (ctpu_is_null(g)) g = ctpu_zeros(ctpu_dtype_of(p), 1, &numel);
        fl[k - k0] = ctpu_reshape(g, 1, &numel);
        if (ctpu_is_null(fl[k - k0])) st = ctpu_last_status();
    }
    if (st == CTPU_OK) {
        *cat = nk == 1 ? fl[0] : ctpu_concat(nk, fl, 0);
        if (ctpu_is_null(*cat)) st = ctpu_last_status();
    }
    if (fl != flat) free(fl);
    return st;
}

/* The reduced bucket back into each .grad (parameters with one). */
static ctpu_status bucket_scatter(ctpu_ddp *d, int b, ctpu_tensor red)
{
    int k0 = d->bucket_start[b], k1 = d->bucket_start[b + 1], nk = k1 - k0;
    ctpu_status st = CTPU_OK;
    int64_t at = 0;
    for (int k = k0; k < k1 && st == CTPU_OK; k++) {
        ctpu_tensor p = d->params[d->order[k]], g = ctpu_grad(p);
        int64_t numel = ctpu_numel(p), sh[CTPU_MAX_DIMS];
        int nd;
        ctpu_shape(p, sh, &nd);
        if (!ctpu_is_null(g)) {
            ctpu_tensor piece = ctpu_reshape(nk == 1 ? red : ctpu_slice(red, 0, at, at + numel, 1), nd, sh);
            st = ctpu_is_null(piece) ? ctpu_last_status() : ctpu_assign(g, piece);
        }
        at += numel;
    }
    return st;
}

/* Start bucket b's all_reduce now (from the hook, inside backward: the
 * handles made here belong to backward's scope; the started value is kept
 * past it, into the caller's). A failure leaves the bucket to sync_grads. */
static void launch(ctpu_ddp *d, int b)
{
    ctpu_dist_set_bucket(b);
    ctpu_tensor cat = CTPU_NULL;
    if (bucket_flat(d, b, &cat) == CTPU_OK) {
        ctpu_tensor h = ctpu_all_reduce_async(cat, CTPU_DIST_MEAN);
        if (!ctpu_is_null(h)) d->started[b] = ctpu_keep(h);
    }
    ctpu_dist_set_bucket(-1);
}

/* The gradient hook: a parameter's gradient is final; its bucket starts
 * once all of its parameters' are. */
static void grad_ready(ctpu_tensor leaf, void *ctx)
{
    ctpu_ddp *d = ctx;
    int i = 0;
    while (i < d->n && d->params[i].id != leaf.id) i++;
    if (i == d->n) return;
    int b = d->bucket_of[i];
    if (d->ready[i]) {   /* a second backward before sync_grads: reduce at sync instead */
        d->stale = true;
        return;
    }
    d->ready[i] = true;
    if (--d->left[b] == 0 && !d->stale) launch(d, b);
}

ctpu_ddp *ctpu_ddp_create(int n, const ctpu_tensor *params, const ctpu_ddp_opts *opts)
{
    ctpu_ddp_opts o = opts ? *opts : ctpu_ddp_defaults();
    if (n < 1 || !params) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "ddp_create: n=%d with params %s: need n >= 1 parameters", n,
                          params ? "given" : "NULL");
        return NULL;
    }
    if (o.bucket_bytes < 1 || o.rng_per_microbatch < 0) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "ddp_create: bucket_bytes=%lld (>= 1), rng_per_microbatch=%lld (>= 0)",
                          (long long)o.bucket_bytes, (long long)o.rng_per_microbatch);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!ctpu_is_valid(params[i])) {
            ctpu_status st;
            char why[512];
            ctpu__nn_why(params[i], &st, why, sizeof why);
            ctpu_report_error(st, "ddp_create: params[%d] is %s", i, why);
            return NULL;
        }
        if (ctpu_dtype_of(params[i]) == CTPU_I32) {
            ctpu_report_error(CTPU_ERR_DTYPE, "ddp_create: params[%d] is i32 (gradients are f32 or bf16)", i);
            return NULL;
        }
    }
    ctpu_ddp *d = calloc(1, sizeof *d);
    if (d) {
        d->params = malloc(sizeof(ctpu_tensor) * (size_t)n);
        d->bucket_of = malloc(sizeof(int) * (size_t)n);
        d->order = malloc(sizeof(int) * (size_t)n);
        d->bucket_start = malloc(sizeof(int) * ((size_t)n + 1));
        d->ready = calloc((size_t)n, sizeof(bool));
        d->hooked = calloc((size_t)n, sizeof(bool));
        d->left = calloc((size_t)n + 1, sizeof(int));
        d->started = calloc((size_t)n + 1, sizeof(ctpu_tensor));
    }
    if (!d || !d->params || !d->bucket_of || !d->order || !d->bucket_start || !d->ready || !d->hooked || !d->left ||
        !d->started) {
        ctpu_ddp_free(d);
        ctpu_report_error(CTPU_ERR_OOM, "ddp_create: out of host memory");
        return NULL;
    }
    d->n = n;
    memcpy(d->params, params, sizeof(ctpu_tensor) * (size_t)n);
    d->draws = o.rng_per_microbatch;
    /* buckets: reverse order, a new bucket when the dtype changes or the
     * bytes would pass bucket_bytes (a parameter larger than that is a
     * bucket of its own) */
    int64_t fill = 0;
    ctpu_dtype cur = CTPU_DTYPE_COUNT;
    d->n_buckets = 0;
    for (int k = 0; k < n; k++) {
        int i = n - 1 - k;
        ctpu_dtype dt = ctpu_dtype_of(params[i]);
        int64_t b = ctpu_numel(params[i]) * elem_bytes(dt);
        if (d->n_buckets == 0 || dt != cur || (fill > 0 && fill + b > o.bucket_bytes)) {
            d->bucket_start[d->n_buckets++] = k;
            fill = 0;
            cur = dt;
        }
        fill += b;
        d->order[k] = i;
        d->bucket_of[i] = d->n_buckets - 1;
    }
    d->bucket_start[d->n_buckets] = n;
    d->overlap = o.overlap;
    round_reset(d);
    if (o.broadcast_params) {
        ctpu_status st = CTPU_OK;
        ctpu_no_grad_begin();
        ctpu_scope_begin();
        for (int i = 0; i < n && st == CTPU_OK; i++) {
            ctpu_tensor b = ctpu_broadcast(params[i], 0);
            st = ctpu_is_null(b) ? ctpu_last_status() : ctpu_assign(params[i], b);
        }
        ctpu_scope_end();
        ctpu_no_grad_end();
        if (st != CTPU_OK) {
            ctpu_ddp_free(d);
            return NULL;
        }
    }
    for (int i = 0; d->overlap && i < n; i++)   /* a parameter without the hook is reduced at sync_grads */
        d->hooked[i] = ctpu_register_post_accumulate_grad_hook(params[i], grad_ready, d) == CTPU_OK;
    ctpu_clear_error();
    return d;
}

int ctpu_ddp_buckets(const ctpu_ddp *d) { return d ? d->n_buckets : 0; }

ctpu_status ctpu_ddp_step_begin(ctpu_ddp *d)
{
    if (!d) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "ddp_step_begin: d is NULL");
    uint64_t seed, off;
    ctpu_status st = ctpu_rng_get_state(&seed, &off);
    if (st != CTPU_OK) return st;
    d->base = off;
    d->in_step = true;
    return ctpu_rng_set_state(seed, off + (uint64_t)ctpu_dist_rank() * (uint64_t)d->draws);
}

ctpu_status ctpu_ddp_sync_grads(ctpu_ddp *d)
{
    if (!d) return ctpu_report_error(CTPU_ERR_INVALID_ARG, "ddp_sync_grads: d is NULL");
    uint64_t seed, off;
    ctpu_status st = ctpu_rng_get_state(&seed, &off);
    if (st != CTPU_OK) return st;
    if (d->in_step) {
        uint64_t mine = d->base + (uint64_t)ctpu_dist_rank() * (uint64_t)d->draws;
        if (d->draws == 0 && off > mine) d->draws = (int64_t)(off - mine);
        off = d->base + (uint64_t)ctpu_dist_world_size() * (uint64_t)d->draws;
        st = ctpu_rng_set_state(seed, off);
        if (st != CTPU_OK) return st;
    }
    d->in_step = false;
    ctpu_no_grad_begin();
    for (int b = 0; b < d->n_buckets && st == CTPU_OK; b++) {
        ctpu_scope_begin();
        ctpu_dist_set_bucket(b);
        ctpu_tensor red = CTPU_NULL, h = d->started[b];
        if (!ctpu_is_null(h)) {   /* started during backward: wait for it here, its consumer */
            red = ctpu_all_reduce_wait(h);
            ctpu_release(h);
            d->started[b] = CTPU_NULL;
            if (ctpu_is_null(red)) st = ctpu_last_status();
            else if (d->stale) red = CTPU_NULL;   /* gradients changed since: reduce them again */
            if (st == CTPU_OK && !ctpu_is_null(red)) d->overlapped++;
        }
        if (st == CTPU_OK && ctpu_is_null(red)) {
            ctpu_tensor cat = CTPU_NULL;
            st = bucket_flat(d, b, &cat);
            if (st == CTPU_OK) {
                red = ctpu_all_reduce(cat, CTPU_DIST_MEAN);
                if (ctpu_is_null(red)) st = ctpu_last_status();
                else d->blocking++;
            }
        }
        if (st == CTPU_OK) st = bucket_scatter(d, b, red);
        ctpu_dist_set_bucket(-1);
        ctpu_scope_end();
    }
    for (int b = 0; b < d->n_buckets; b++)   /* after a failure: no started value left behind */
        if (!ctpu_is_null(d->started[b])) {
            ctpu_tensor r = ctpu_all_reduce_wait(d->started[b]);
            ctpu_release(r);
            ctpu_release(d->started[b]);
        }
    round_reset(d);
    ctpu_no_grad_end();
    if (st == CTPU_OK) d->steps++;
    return st;
}

void ctpu_ddp_overlap_counts(const ctpu_ddp *d, int64_t *overlapped, int64_t *blocking)
{
    if (overlapped) *overlapped = d ? d->overlapped : 0;
    if (blocking) *blocking = d ? d->blocking : 0;
}

void ctpu_ddp_free(ctpu_ddp *d)
{
    if (!d) return;
    for (int i = 0; d->hooked && i < d->n; i++)
        if (d->hooked[i] && ctpu_is_valid(d->params[i]))
            ctpu_register_post_accumulate_grad_hook(d->params[i], NULL, NULL);
    for (int b = 0; d->started && b < d->n_buckets; b++)
        if (!ctpu_is_null(d->started[b])) {
            ctpu_tensor r = ctpu_all_reduce_wait(d->started[b]);
            ctpu_release(r);
            ctpu_release(d->started[b]);
        }
    free(d->ready);
    free(d->hooked);
    free(d->left);
    free(d->started);
    free(d->params);
    free(d->bucket_of);
    free(d->order);
    free(d->bucket_start);
    free(d);
}
