/* Collectives as ops (issue 19): all_reduce, broadcast, all_gather,
 * reduce_scatter. Each is a node of the op table dispatched like any op
 * (strict and debug eager: a one-node program on the device stream; defer
 * and fuse: a node of the trace, keyed like any op), executed on the device
 * thread by src/dist/. In defer and fuse the trace is cut right after the
 * collective unless this thread asked to keep collectives inside the step. */
#include <stdio.h>
#include <string.h>

#include "eager.h"
#include "dist/dist.h"

static bool dist_op_ok(const char *name, ctpu_dist_op op, const ctpu_trec *r)
{
    if ((unsigned)op >= CTPU_DIST_OP_COUNT) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: op=%d is not a ctpu_dist_op (CTPU_DIST_SUM, CTPU_DIST_MEAN)", name,
                       (int)op);
        return false;
    }
    if (op == CTPU_DIST_MEAN && r->type.dtype == CTPU_I32) {
        ctpu_set_error(CTPU_ERR_DTYPE, "%s: a mean of i32 values (CTPU_DIST_MEAN takes f32 or bf16; sum i32)", name);
        return false;
    }
    return true;
}

static ctpu_tensor collective(int op, int kind, ctpu_trec *r, ctpu_tensor t, const ctpu_vtype *out, int extra,
                              int64_t arg)
{
    ctpu_thread_state *ts = ctpu_ts();
    if (!ts) {
        ctpu_set_error(CTPU_ERR_OOM, "%s: out of host memory", ctpu_op_name(op));
        return ctpu_failed();
    }
    if (ctpu__capturing()) {
        /* inside a compiled step: a graph break (the call runs as defer and
         * fuse around it); fullgraph: an error before anything ran */
        char what[96];
        snprintf(what, sizeof what, "a collective (%s)", ctpu_op_name(op));
        if (!ctpu__capture_break(CTPU_CUT_COLLECTIVE, what)) return ctpu_failed();
    }
    ctpu_node n = { .op = (uint16_t)op, .n_in = 1, .n_scalars = 1, .out = *out };
    n.attr.extra = extra;
    n.attr.i64[0] = arg;
    n.attr.i64[1] = ts->dist.bucket_plus1 - 1;
    double step = (double)atomic_load(&ctpu_rt->marked_steps);
    ctpu_trec *in[1] = { r };
    if (!(op == CTPU_OP_ALL_REDUCE && arg == 2))   /* a wait moves nothing of its own */
        ctpu__dist_stats_add(kind, (double)ctpu_vtype_numel(&r->type) * (double)ctpu_kdt_size(r->type.dtype),
                             n.attr.i64[1]);
    ctpu_tensor h = ctpu_dispatch(&n, in, &t, &step);
    if (!ctpu_is_null(h) && ctpu_mode_now() == CTPU_MODE_DEFER_FUSE && !ts->dist.keep_collectives)
        ctpu__defer_flush(CTPU_CUT_COLLECTIVE);   /* errors latch on the values, as at any cut */
    return h;
}

ctpu_tensor ctpu_all_reduce(ctpu_tensor t, ctpu_dist_op op)
{
    if (!ctpu_check_init("all_reduce")) return ctpu_failed();
    ctpu_trec *r = ctpu_rec_get(t, "all_reduce", "t", true);
    if (!r || !dist_op_ok("all_reduce", op, r)) return ctpu_failed();
    return collective(CTPU_OP_ALL_REDUCE, CTPU_COLL_ALL_REDUCE, r, t, &r->type, (int)op, 0);
}

/* Overlap: the started value's handle id is remembered on this thread until
 * it is waited for (so a wait on anything else is an error at the call). */
static bool pending_add(ctpu_thread_state *ts, uint64_t id)
{
    for (int i = 0; i < CTPU_DIST_MAX_STARTED; i++)
        if (!ts->dist.started[i]) {
            ts->dist.started[i] = id;
            return true;
        }
    return false;
}

static bool pending_take(ctpu_thread_state *ts, uint64_t id)
{
    for (int i = 0; i < CTPU_DIST_MAX_STARTED; i++)
        if (ts->dist.started[i] == id) {
            ts->dist.started[i] = 0;
            return true;
        }
    return false;
}

ctpu_tensor ctpu_all_reduce_async(ctpu_tensor t, ctpu_dist_op op)
{
    const char *name = "all_reduce_async";
    if (!ctpu_check_init(name)) return ctpu_failed();
    ctpu_trec *r = ctpu_rec_get(t, name, "t", true);
    if (!r || !dist_op_ok(name, op, r)) return ctpu_failed();
    ctpu_thread_state *ts = ctpu_ts();
    if (!ts) {
        ctpu_set_error(CTPU_ERR_OOM, "%s: out of host memory", name);
        return ctpu_failed();
    }
    if (!pending_take(ts, 0)) {   /* a free slot (0) first: nothing dispatched on failure */
        ctpu_set_error(CTPU_ERR_STATE, "%s: %d all_reduces started on this thread and not waited for "
                       "(ctpu_all_reduce_wait)", name, CTPU_DIST_MAX_STARTED);
        return ctpu_failed();
    }
    ctpu_tensor h = collective(CTPU_OP_ALL_REDUCE, CTPU_COLL_ALL_REDUCE, r, t, &r->type, (int)op, 1);
    if (!ctpu_is_null(h)) pending_add(ts, h.id);
    return h;
}

ctpu_tensor ctpu_all_reduce_wait(ctpu_tensor started)
{
    const char *name = "all_reduce_wait";
    if (!ctpu_check_init(name)) return ctpu_failed();
    ctpu_trec *r = ctpu_rec_get(started, name, "started", true);
    if (!r) return ctpu_failed();
    ctpu_thread_state *ts = ctpu_ts();
    if (!ts || !pending_take(ts, started.id)) {
        char tb[128];
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: started (%s) is not an all_reduce this thread started with "
                       "ctpu_all_reduce_async and has not waited for", name, ctpu_fmt_type(&r->type, tb, sizeof tb));
        return ctpu_failed();
    }
    return collective(CTPU_OP_ALL_REDUCE, CTPU_COLL_ALL_REDUCE, r, started, &r->type, 0, 2);
}

ctpu_tensor ctpu_broadcast(ctpu_tensor t, int root)
{
    if (!ctpu_check_init("broadcast")) return ctpu_failed();
    ctpu_trec *r = ctpu_rec_get(t, "broadcast", "t", true);
    if (!r) return ctpu_failed();
    if (root < 0 || root >= ctpu_dist_world_size()) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "broadcast: root=%d is not a rank (world size %d)", root,
                       ctpu_dist_world_size());
        return ctpu_failed();
    }
    return collective(CTPU_OP_BROADCAST, CTPU_COLL_BROADCAST, r, t, &r->type, 0, root);
}

static int along(const char *name, const ctpu_trec *r, int dim)
{
    char tb[128];
    int nd = r->type.ndim;
    if (nd == 0) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: t is %s: needs at least one dim", name,
                       ctpu_fmt_type(&r->type, tb, sizeof tb));
        return -1;
    }
    if (dim < -nd || dim >= nd) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: dim=%d is out of range for a %s (valid: [%d, %d])", name, dim,
                       ctpu_fmt_type(&r->type, tb, sizeof tb), -nd, nd - 1);
        return -1;
    }
    return dim < 0 ? dim + nd : dim;
}

ctpu_tensor ctpu_all_gather(ctpu_tensor t, int dim)
{
    if (!ctpu_check_init("all_gather")) return ctpu_failed();
    ctpu_trec *r = ctpu_rec_get(t, "all_gather", "t", true);
    if (!r) return ctpu_failed();
    int d = along("all_gather", r, dim);
    if (d < 0) return ctpu_failed();
    ctpu_vtype out = r->type;
    int n = ctpu_dist_world_size();
    if (out.shape[d] > INT64_MAX / n || ctpu_vtype_numel(&r->type) > INT64_MAX / 4 / n) {
        char tb[128];
        ctpu_set_error(CTPU_ERR_SHAPE, "all_gather: t is %s: %d ranks of it overflow a size",
                       ctpu_fmt_type(&r->type, tb, sizeof tb), n);
        return ctpu_failed();
    }
    out.shape[d] *= n;
    return collective(CTPU_OP_ALL_GATHER, CTPU_COLL_ALL_GATHER, r, t, &out, 0, d);
}

ctpu_tensor ctpu_reduce_scatter(ctpu_tensor t, int dim, ctpu_dist_op op)
{
    if (!ctpu_check_init("reduce_scatter")) return ctpu_failed();
    ctpu_trec *r = ctpu_rec_get(t, "reduce_scatter", "t", true);
    if (!r || !dist_op_ok("reduce_scatter", op, r)) return ctpu_failed();
    int d = along("reduce_scatter", r, dim);
    if (d < 0) return ctpu_failed();
    int n = ctpu_dist_world_size();
    if (r->type.shape[d] % n != 0) {
        char tb[128];
        ctpu_set_error(CTPU_ERR_SHAPE, "reduce_scatter: t is %s: dim %d (%lld) is not a multiple of the world size %d",
                       ctpu_fmt_type(&r->type, tb, sizeof tb), d, (long long)r->type.shape[d], n);
        return ctpu_failed();
    }
    ctpu_vtype out = r->type;
    out.shape[d] /= n;
    return collective(CTPU_OP_REDUCE_SCATTER, CTPU_COLL_REDUCE_SCATTER, r, t, &out, (int)op, d);
}

ctpu_status ctpu_dist_set_bucket(int64_t bucket)
{
    if (!ctpu_check_init("dist_set_bucket")) return CTPU_ERR_NOT_INITIALIZED;
    if (bucket < -1 || bucket > INT64_MAX - 1) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "dist_set_bucket: bucket=%lld (a bucket number >= 0, or -1 for none)",
                       (long long)bucket);
        return CTPU_ERR_INVALID_ARG;
    }
    ctpu_thread_state *ts = ctpu_ts();
    if (!ts) {
        ctpu_set_error(CTPU_ERR_OOM, "dist_set_bucket: out of host memory");
        return CTPU_ERR_OOM;
    }
    ts->dist.bucket_plus1 = bucket + 1;
    return CTPU_OK;
}

ctpu_status ctpu_dist_set_collective_cut(bool cut)
{
    if (!ctpu_check_init("dist_set_collective_cut")) return CTPU_ERR_NOT_INITIALIZED;
    ctpu_thread_state *ts = ctpu_ts();
    if (!ts) {
        ctpu_set_error(CTPU_ERR_OOM, "dist_set_collective_cut: out of host memory");
        return CTPU_ERR_OOM;
    }
    ts->dist.keep_collectives = !cut;
    return CTPU_OK;
}
