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
};

ctpu_ddp_opts ctpu_ddp_defaults(void) { return (ctpu_ddp_opts){ 25ll << 20, 0, true }; }

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
    }
    if (!d || !d->params || !d->bucket_of || !d->order || !d->bucket_start) {
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
        int k0 = d->bucket_start[b], k1 = d->bucket_start[b + 1], nk = k1 - k0;
        ctpu_tensor flat[64], *fl = nk <= 64 ? flat : malloc(sizeof(ctpu_tensor) * (size_t)nk);
        if (!fl) {
            st = ctpu_report_error(CTPU_ERR_OOM, "ddp_sync_grads: out of host memory");
            break;
        }
        ctpu_scope_begin();
        ctpu_dist_set_bucket(b);
        for (int k = k0; k < k1 && st == CTPU_OK; k++) {
            ctpu_tensor p = d->params[d->order[k]];
            int64_t numel = ctpu_numel(p);
            if (numel < 0) {
                st = ctpu_last_status();
                break;
            }
            ctpu_tensor g = ctpu_grad(p);
            /* a parameter without a gradient contributes zeros, so every
             * rank makes the same collectives */
            if (ctpu_is_null(g)) g = ctpu_zeros(ctpu_dtype_of(p), 1, &numel);
            fl[k - k0] = ctpu_reshape(g, 1, &numel);
            if (ctpu_is_null(fl[k - k0])) st = ctpu_last_status();
        }
        ctpu_tensor red = CTPU_NULL;
        if (st == CTPU_OK) {
            ctpu_tensor cat = nk == 1 ? fl[0] : ctpu_concat(nk, fl, 0);
            red = ctpu_all_reduce(cat, CTPU_DIST_MEAN);
            if (ctpu_is_null(red)) st = ctpu_last_status();
        }
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
        ctpu_dist_set_bucket(-1);
        ctpu_scope_end();
        if (fl != flat) free(fl);
    }
    ctpu_no_grad_end();
    if (st == CTPU_OK) d->steps++;
    return st;
}

void ctpu_ddp_free(ctpu_ddp *d)
{
    if (!d) return;
    free(d->params);
    free(d->bucket_of);
    free(d->order);
    free(d->bucket_start);
    free(d);
}
