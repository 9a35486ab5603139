/* Defer and fuse (TORCH_TPU_DEFER_AND_FUSE=1): ops are recorded into the
 * calling thread's trace; at a cut (mark_step, end of a step scope, a host
 * read of a pending value, sync, the loop detector, the length limit) the
 * trace is flushed: its live-out values (pending handles still alive) are
 * collected, the trace is keyed and looked up in the bounded fused-program
 * cache (on a miss: finalised -- dead code removed, assigned parameters
 * written in place -- and compiled, the recompile reason recorded), its
 * buffers bound, and it is launched as one program on the device stream;
 * the handles then get their buffers. */
#include <stdlib.h>
#include <string.h>

#include "eager.h"
#include "testing.h"
#include "fuse/exec.h"
#include "fuse/loops.h"
#include "fuse/trace.h"

#define TRACE_MAX_NODES 20000
/* This thread's trace recorder: a part of its state (eager.h), dropped with
 * it at thread exit, shutdown or a new runtime. Valid once state_ready() (or
 * ctpu__defer_flush's check) has passed on the calling path. */
#define t_df (ctpu__ts->df)

/* A compiled step's capture is one program whatever its length (the trace
 * limit does not cut it); past this many ops it is a graph break (fullgraph:
 * the op fails and nothing ran). ctpu__test_capture_limit lowers it. */
#define CAPTURE_MAX_NODES 1000000
static _Atomic uint32_t capture_max_nodes = CAPTURE_MAX_NODES;

void ctpu__test_capture_limit(uint32_t n) { atomic_store(&capture_max_nodes, n ? n : CAPTURE_MAX_NODES); }

/* A capture at its length limit: a graph break before the op is numbered
 * (the trace so far is flushed as defer and fuse); false under fullgraph. */
static bool capture_length_ok(const char *opn)
{
    uint32_t lim = atomic_load_explicit(&capture_max_nodes, memory_order_relaxed);
    if (!ctpu__capturing() || !t_df.rec || (uint32_t)ctpu_trace_rec_nodes(t_df.rec) < lim) return true;
    char what[128];
    snprintf(what, sizeof what, "%s: the capture reached its length limit of %u ops", opn, lim);
    if (!ctpu__capture_break(CTPU_CUT_LIMIT, what)) return false;
    ctpu__defer_flush(CTPU_CUT_LIMIT);
    return true;
}

static const ctpu_counter_id cut_counter[CTPU_CUT_COUNT] = {
    CTPU_CTR_CUT_MARK_STEP, CTPU_CTR_CUT_HOST_READ, CTPU_CTR_CUT_SYNC, CTPU_CTR_CUT_LOOP,
    CTPU_CTR_CUT_LIMIT, CTPU_CTR_CUT_MODE, CTPU_CTR_CUT_COLLECTIVE,
};

static bool state_ready(void)
{
    if (!ctpu_ts()) return false;
    if (!t_df.rec) {
        t_df.rec = ctpu_trace_rec_create();
        if (!t_df.rec) return false;
    }
    if (t_df.id == 0) t_df.id = atomic_fetch_add(&ctpu_rt->next_trace_id, 1);
    return true;
}

/* A holder that no longer names a pending value of this trace (released,
 * or a record of another trace) never will again: a value that becomes
 * pending here once more is added again. When the list is full, these go
 * first, so the cut's walk (collect_live_outs) is over about the live
 * pending values, not every op recorded; it grows only when half of it is
 * still pending (each compaction is paid by as many adds). */
static void compact_holders(void)
{
    ctpu_trec *const *pages = ctpu_rt->pages;
    uint64_t *h = t_df.holders, id = t_df.id;
    size_t k = 0;
    for (size_t i = 0, n = t_df.n_holders; i < n; i++) {
        ctpu_trec *r = ctpu_slot_if_live(pages, h[i]);
        if (r && r->trace_id == id) h[k++] = h[i];
    }
    t_df.n_holders = k;
}

static bool add_holder(uint64_t id)
{
    if (t_df.n_holders == t_df.cap_holders) {
        if (t_df.cap_holders) compact_holders();
        if (!t_df.cap_holders || t_df.n_holders * 2 > t_df.cap_holders) {
            size_t nc = t_df.cap_holders ? t_df.cap_holders * 2 : 32;
            uint64_t *p = realloc(t_df.holders, nc * sizeof *p);
            if (p) {
                t_df.holders = p;
                t_df.cap_holders = nc;
            } else if (t_df.n_holders == t_df.cap_holders) {
                return false;
            }
        }
    }
    t_df.holders[t_df.n_holders++] = id;
    return true;
}

/* A pending handle for value v. */
static ctpu_tensor pending_handle(const ctpu_vtype *type, ctpu_vref v, const char *op, const char *made_by)
{
    ctpu_tensor h = ctpu_handle_new(type, NULL, 0, op);
    if (ctpu_is_null(h)) return h;
    ctpu_trec *r = ctpu_slot(ctpu_handle_slot(h));
    r->trace_id = t_df.id;
    r->tval = v;
    r->made_by = made_by;
    if (!add_holder(h.id)) {
        ctpu_release(h);
        ctpu_set_error(CTPU_ERR_OOM, "%s: out of host memory recording the trace", op);
        return ctpu_failed();
    }
    return h;
}

static uint64_t op_hash(const ctpu_node *n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ ((uint64_t)n->op << 32) ^ ((uint64_t)n->out.dtype << 8) ^ n->out.ndim;
    for (int d = 0; d < n->out.ndim; d++) {
        h ^= (uint64_t)n->out.shape[d] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return h * 0xff51afd7ed558ccdull;
}

/* ------------------------------------------------------------ dynamic dims
 * The recorded values' dynamic dims (DESIGN.md "Dynamic dims"), by recorded
 * input index and by node vref; the flush keys a trace that has any with
 * symbols in place of their extents. */
static bool dyn_row(ctpu_dyndim (**rows)[CTPU_MAX_DIMS], bool **has, size_t *cap, size_t i)
{
    if (i >= *cap) {
        size_t nc = *cap ? *cap : 64;
        while (nc <= i) nc *= 2;
        ctpu_dyndim (*nr)[CTPU_MAX_DIMS] = realloc(*rows, sizeof **rows * nc);
        if (nr) *rows = nr;
        bool *nh = nr ? realloc(*has, sizeof **has * nc) : NULL;
        if (!nh) return false;
        memset(nh + *cap, 0, sizeof *nh * (nc - *cap));
        *has = nh;
        *cap = nc;
    }
    return true;
}

static void dyn_note(bool input, size_t i, const ctpu_dyndim *d)
{
    ctpu_defer_state *df = &t_df;
    bool ok = input ? dyn_row(&df->in_dyn, &df->in_has_dyn, &df->cap_in_dyn, i)
                    : dyn_row(&df->node_dyn, &df->node_has_dyn, &df->cap_node_dyn, i);
    if (!ok) return;   /* out of memory: the value is keyed static */
    memcpy(input ? df->in_dyn[i] : df->node_dyn[i], d, sizeof(ctpu_dyndim) * CTPU_MAX_DIMS);
    if (input) {
        const ctpu_vtype *it;
        ctpu_buffer *const *ib;
        const size_t *io;
        ctpu_trace_rec_inputs(df->rec, &ib, &io, &it);
        for (int k = 0; k < it[i].ndim; k++) {
            if (d[k].coef <= 0 || it[i].shape[k] % d[k].coef) continue;
            int64_t v = it[i].shape[k] / d[k].coef;
            bool seen = v < d[k].lo || v > d[k].hi;
            for (int q = 0; q < df->n_sym && !seen; q++)
                seen = df->sym[q].lo == d[k].lo && df->sym[q].hi == d[k].hi && df->sym[q].v == v;
            if (!seen && df->n_sym < 8) {
                df->sym[df->n_sym].lo = d[k].lo;
                df->sym[df->n_sym].hi = d[k].hi;
                df->sym[df->n_sym++].v = v;
            }
        }
    }
    (input ? df->in_has_dyn : df->node_has_dyn)[i] = true;
    df->any_dyn = true;
    uint64_t h = df->dyn_sig ^ ((uint64_t)i << 1 | input);
    for (int k = 0; k < CTPU_MAX_DIMS; k++) {   /* the same notes in the same order: the same rows */
        h = (h ^ (uint64_t)d[k].lo) * 0x100000001b3ull;
        h = (h ^ (uint64_t)d[k].hi) * 0x100000001b3ull;
        h = (h ^ (uint64_t)d[k].coef) * 0x9e3779b97f4a7c15ull;
    }
    df->dyn_sig = h ^ (h >> 29);
}

/* A node whose dims no shape-rule probe gave (the backward helpers
 * autograd builds, copies): an output dim takes the dynamic dim of an
 * input dim of the same extent, at the same position first. Only the key
 * depends on it (a wrong guess costs a recompile, never a wrong program:
 * a bind derives every step from the launch's own extents). */
static bool dyn_guess(const ctpu_node *n, ctpu_trec *const *in, ctpu_dyndim *out)
{
    bool any = false;
    memset(out, 0, sizeof(ctpu_dyndim) * CTPU_MAX_DIMS);
    int hint = ctpu__ag_hint_dyn(&n->out, out);
    if (hint) return hint > 0;
    for (int d = 0; d < n->out.ndim; d++) {
        for (int pass = 0; pass < 1 && !out[d].coef; pass++)   /* the same position only: a coincidence elsewhere costs recompiles */
            for (int i = 0; i < n->n_in && !out[d].coef; i++) {
                const ctpu_trec *r = in[i];
                if (!r->dyn) continue;
                for (int e = 0; e < r->type.ndim; e++) {
                    if ((pass == 0 && (e != d || r->type.ndim != n->out.ndim)) || r->dyn[e].coef <= 0) continue;
                    if (r->type.shape[e] == n->out.shape[d]) { out[d] = r->dyn[e]; break; }
                }
            }
        any |= out[d].coef > 0;
    }
    /* a packed flat value (attention's o and lse) of an input with one
     * symbol: a multiple of its value */
    for (int i = 0; !any && n->out.ndim == 1 && i < n->n_in; i++) {
        const ctpu_trec *r = in[i];
        int sd = -1, nsym = 0;
        for (int e = 0; r->dyn && e < r->type.ndim; e++)
            if (r->dyn[e].coef > 0) { sd = e; nsym++; }
        int64_t v = nsym == 1 ? r->type.shape[sd] / r->dyn[sd].coef : 0;
        if (v > 0 && n->out.shape[0] > 0 && n->out.shape[0] % v == 0) {
            out[0] = (ctpu_dyndim){ r->dyn[sd].lo, r->dyn[sd].hi, n->out.shape[0] / v };
            any = true;
        }
    }
    return any;
}

/* Is recorded input j (type ty) what entry e's last trace had there, but
 * for the dims e learnt? */
static bool amem_explains(const ctpu_auto_mem *e, int j, const ctpu_vtype *ty)
{
    const ctpu_vtype *b = &e->in[j];
    for (int q = 0; q < ty->ndim; q++) {
        if (ty->shape[q] == b->shape[q]) continue;
        bool dyn = false;
        for (int k = 0; k < e->n_dims && !dyn && e->learnt; k++)
            dyn = e->rec[k] == j && e->dim[k] == q && ty->shape[q] % e->coef[k] == 0;
        if (!dyn) return false;
    }
    return true;
}

/* TORCH_TPU_AUTO_DYNAMIC: the structure entry recorded input i (of the
 * types it) follows: of those whose input dtypes and ranks agree with the
 * trace's so far, the most recent of the ones whose inputs it explains
 * (the same extents but for its learnt dims), else the most recent. */
static ctpu_auto_mem *amem_follow(const ctpu_vtype *it, size_t i)
{
    ctpu_defer_state *df = &t_df;
    for (size_t j = (size_t)df->amem_hi; j <= i; j++)
        for (int k = 0; k < df->n_amem; k++) {
            const ctpu_auto_mem *e = &df->amem[k];
            uint32_t bit = 1u << k;
            if (!(df->amem_alive & bit)) continue;
            if (j >= (size_t)e->n_in || e->in[j].dtype != it[j].dtype || e->in[j].ndim != it[j].ndim)
                df->amem_alive &= ~bit;
            else if (!amem_explains(e, (int)j, &it[j]))
                df->amem_expl &= ~bit;
        }
    if (i + 1 > (size_t)df->amem_hi) df->amem_hi = (int)(i + 1);
    ctpu_auto_mem *best = NULL;
    for (int pass = 0; pass < 2 && !best; pass++) {
        uint32_t m = df->amem_alive & (pass == 0 ? df->amem_expl : ~0u);
        for (int k = 0; k < df->n_amem; k++)
            if ((m & (1u << k)) && (!best || df->amem[k].used > best->used)) best = &df->amem[k];
    }
    df->amem_none = !best;           /* later inputs cannot agree either */
    return best;
}

/* The extent coefficient of a speculated dim that changed from -> to: 1
 * for the trace's first such change (or the same extents), c when it is
 * c times the first one's in both; 1 otherwise (another dim: the flush
 * will not confirm it). */
static int64_t spec_coef(int64_t from, int64_t to)
{
    if (!t_df.spec_from) { t_df.spec_from = from; t_df.spec_to = to; return 1; }
    int64_t f0 = t_df.spec_from, t0 = t_df.spec_to;
    if (from % f0 == 0 && to % t0 == 0 && from / f0 == to / t0 && from / f0 >= 2) return from / f0;
    return 1;
}

/* TORCH_TPU_AUTO_DYNAMIC: recorded input i (record r, no marks of its own)
 * marked as the structure the trace follows says: its learnt dims, or,
 * none learnt yet, the one dim the input differs in from that structure's
 * last trace, over [2, 2^31-1] (coef c for an extent c x the first changed
 * one's). The marks are tentative (spec) until the flush confirms them. */
static void auto_dynamic_mark(ctpu_trec *r, size_t i)
{
    ctpu_buffer *const *ib;
    const size_t *io;
    const ctpu_vtype *it;
    int ni = ctpu_trace_rec_inputs(t_df.rec, &ib, &io, &it);
    if (i >= (size_t)ni) return;
    ctpu_auto_mem *e = amem_follow(it, i);
    if (!e) return;
    const ctpu_vtype *a = &it[i], *b = &e->in[i];
    ctpu_dyndim d[CTPU_MAX_DIMS];
    memset(d, 0, sizeof d);
    bool any = false;
    if (e->learnt) {
        for (int k = 0; k < e->n_dims; k++) {
            int dim = e->dim[k];
            int64_t c = e->coef[k];
            if (e->rec[k] != (int32_t)i || dim >= a->ndim || c < 1 || a->shape[dim] % c) continue;
            if (a->shape[dim] / c < 2 || a->shape[dim] / c > 2147483647) continue;
            d[dim] = (ctpu_dyndim){ 2, 2147483647, c };
            any = true;
        }
    } else {
        int n = 0, dim = -1;
        for (int q = 0; q < a->ndim; q++)
            if (a->shape[q] != b->shape[q]) { n++; dim = q; }
        if (n != 1 || b->shape[dim] < 1) return;
        int64_t c = spec_coef(b->shape[dim], a->shape[dim]);
        if (a->shape[dim] / c < 2 || a->shape[dim] / c > 2147483647) return;
        d[dim] = (ctpu_dyndim){ 2, 2147483647, c };
        any = true;
    }
    if (!any || !ctpu__rec_set_dyn(r, d, a->ndim)) return;
    for (int q = 0; q < a->ndim; q++) {
        if (d[q].coef <= 0) continue;
        if (t_df.n_spec == (int)(sizeof t_df.spec / sizeof t_df.spec[0])) { t_df.spec_full = true; continue; }
            t_df.spec[t_df.n_spec].rec = (int32_t)i;
        t_df.spec[t_df.n_spec].dim = q;
        t_df.spec[t_df.n_spec].coef = (int32_t)d[q].coef;
        t_df.spec[t_df.n_spec].r = r;
        t_df.spec[t_df.n_spec++].gen = atomic_load_explicit(&r->gen, memory_order_relaxed);
    }
}

static bool is_spec(const ctpu_trec *r)
{
    for (int k = 0; k < t_df.n_spec; k++)
        if (t_df.spec[k].r == r) return true;
    return false;
}

/* Recorded input i has dims marked otherwise than automatically. */
static void note_other(size_t i)
{
    t_df.other_dyn = true;
    for (int k = 0; k < t_df.n_other && k < 16; k++)
        if (t_df.other_rec[k] == (int32_t)i) return;
    if (t_df.n_other < 16) t_df.other_rec[t_df.n_other] = (int32_t)i;
    if (t_df.n_other <= 16) t_df.n_other++;
}

/* The marks of the inputs: the tensor's own (ctpu_mark_dynamic, or a value
 * a trace before made with dynamic dims), or automatic ones. */
static void input_marks(ctpu_trec *r, size_t i)
{
    if (r->dyn) {
        if (!is_spec(r)) note_other(i);
    } else if (ctpu_rt->auto_dynamic && !t_df.amem_none) {
        auto_dynamic_mark(r, i);
    }
    if (r->dyn) dyn_note(true, i, r->dyn);
}

/* The vref of an input record in the current trace. */
static bool input_vref(ctpu_trec *r, const char *op, ctpu_vref *out)
{
    if (ctpu_rec_pending(r)) {
        if (r->trace_id != t_df.id) {
            ctpu_set_error(CTPU_ERR_STATE,
                           "%s: an input is a pending value of another thread's trace (cut it there first)", op);
            return false;
        }
        *out = r->tval;
        return true;
    }
    ctpu_vref v = ctpu_trace_rec_input(t_df.rec, r->buf, r->off, &r->type);
    if (v == CTPU_VREF_OOM) {
        ctpu_set_error(CTPU_ERR_OOM, "%s: out of host memory recording the trace", op);
        return false;
    }
    if (!ctpu__capturing()) input_marks(r, (size_t)(-v - 1));
    else if (r->dyn) dyn_note(true, (size_t)(-v - 1), r->dyn);   /* a capture: ctpu_mark_dynamic's marks only */
    *out = v;
    return true;
}

void ctpu__defer_auto_inputs(ctpu_trec *const *in, int n_in)
{
    if (ctpu__capturing() || !state_ready()) return;
    /* every input in the op's order, a marked one too (recorded, its marks
     * noted by the op's own record): the structure's entry is indexed by
     * recorded input, so skipping a ctpu_mark_dynamic'd batch here would
     * record the next input (a parameter) at the batch's index and mark it
     * with the batch's learnt dims */
    for (int i = 0; i < n_in && !t_df.amem_none; i++) {
        ctpu_trec *r = in[i];
        if (!r || ctpu_rec_pending(r)) continue;
        ctpu_vref v = ctpu_trace_rec_input(t_df.rec, r->buf, r->off, &r->type);
        if (v != CTPU_VREF_OOM && v < 0 && !r->dyn) input_marks(r, (size_t)(-v - 1));
    }
}

ctpu_tensor ctpu__defer_node(ctpu_node *node, const char *call, ctpu_trec *const *inputs, const ctpu_tensor *in_h,
                             const double *scalars)
{
    const char *opn = call ? call : ctpu_op_name(node->op);
    if (!state_ready()) {
        ctpu_set_error(CTPU_ERR_OOM, "%s: out of host memory recording the trace", opn);
        return ctpu_failed();
    }
    if (!capture_length_ok(opn)) return ctpu_failed();
    ctpu_op_prov prov = ctpu_prov_next_ts(ctpu__ts);   /* numbered here: the state is bound */
    /* a value larger than the whole HBM can never be computed: say so here,
     * naming the op, as strict eager does, not at the launch */
    uint64_t bytes = (uint64_t)ctpu_vtype_numel(&node->out) * ctpu_kdt_size(node->out.dtype);
    if (bytes > ctpu_rt->hbm_cap) {
        char tb[128];
        ctpu_set_error(CTPU_ERR_OOM, "%s: output %s: out of HBM: requested %llu bytes, capacity %llu bytes (%s)",
                       opn, ctpu_fmt_type(&node->out, tb, sizeof tb), (unsigned long long)bytes,
                       (unsigned long long)ctpu_rt->hbm_cap, ctpu_rt->chip->name);
        return ctpu_failed();
    }
    for (int i = 0; i < node->n_in; i++)
        if (!input_vref(inputs[i], opn, &node->in[i])) return ctpu_failed();
    bool capturing = ctpu__capturing() != NULL;
    /* the ops whose scalars 0 and 1 are a draw's seed and offset */
    if (capturing && node->n_scalars >= 2 &&
        (node->op == CTPU_OP_RAND_UNIFORM || node->op == CTPU_OP_RAND_NORMAL || node->op == CTPU_OP_RAND_INT ||
         node->op == CTPU_OP_SDPA || node->op == CTPU_OP_SDPA_BACKWARD))
        ctpu__capture_note_rng(ctpu_trace_rec_n_scalars(t_df.rec), scalars);
    if (capturing && (node->attr.flags & CTPU_ATTR_INT_SCALAR))
        for (int k = 0; k < node->n_scalars; k++) ctpu__capture_note_int(ctpu_trace_rec_n_scalars(t_df.rec) + k);
    ctpu_vref v = ctpu_trace_rec_node(t_df.rec, node, scalars, prov);
    if (v < 0) {
        ctpu_set_error(CTPU_ERR_OOM, "%s: out of host memory recording the trace", opn);
        return ctpu_failed();
    }
    ctpu_dyndim gd[CTPU_MAX_DIMS];
    const ctpu_dyndim *dyn = NULL;
    if (ctpu__ts->dyn_out_set) {
        ctpu__ts->dyn_out_set = false;
        dyn = ctpu__ts->dyn_out;
    } else if (t_df.any_dyn && dyn_guess(node, inputs, gd)) {
        dyn = gd;
    }
    if (dyn) dyn_note(false, (size_t)v, dyn);
    ctpu_tensor out = pending_handle(&node->out, v, opn, ctpu_op_name(node->op));
    if (ctpu_is_null(out)) return out;
    if (dyn) ctpu__rec_set_dyn(ctpu_slot(ctpu_handle_slot(out)), dyn, node->out.ndim);
    ctpu_counter_add(&ctpu_rt->metrics, CTPU_CTR_OPS_DISPATCHED, 1);
    ctpu_counter_add(&ctpu_rt->metrics, CTPU_CTR_OPS_RECORDED, 1);
    ctpu__ag_record(node, in_h, scalars, out);

    /* loop boundaries the program did not mark */
    ctpu_detect_loops dl = ctpu_rt->detect_loops;
    bool detect = !capturing &&   /* a capture is one step: no loop inside it */
                  (dl == CTPU_LOOPS_ON || (dl == CTPU_LOOPS_AUTO && !atomic_load(&ctpu_rt->user_marks_steps)));
    if (detect && ctpu_loop_feed(&t_df.loops, op_hash(node), dl == CTPU_LOOPS_AUTO)) {
        ctpu__defer_flush(CTPU_CUT_LOOP);
    } else if (!capturing && ctpu_trace_rec_nodes(t_df.rec) >= TRACE_MAX_NODES) {
        ctpu__defer_flush(CTPU_CUT_LIMIT);
    }
    return out;
}

ctpu_tensor ctpu__defer_alias_handle(ctpu_trec *rec, const char *op)
{
    if (!state_ready() || rec->trace_id != t_df.id) {
        ctpu_set_error(CTPU_ERR_STATE, "%s: the value is pending in another thread's trace (cut it there first)", op);
        return ctpu_failed();
    }
    ctpu_vtype type = rec->type;
    ctpu_vref v = rec->tval;
    ctpu_tensor h = pending_handle(&type, v, op, op);
    if (!ctpu_is_null(h) && rec->dyn) ctpu__rec_set_dyn(ctpu_slot(ctpu_handle_slot(h)), rec->dyn, type.ndim);
    return h;
}

bool ctpu__materialize(ctpu_trec *rec, const char *op, ctpu_cut_reason why)
{
    if (!ctpu_rec_pending(rec)) return true;
    if (!state_ready() || rec->trace_id != t_df.id) {
        ctpu_set_error(CTPU_ERR_STATE, "%s: the value is pending in another thread's trace (cut it there first)", op);
        return false;
    }
    ctpu__defer_flush(why);
    if (ctpu_rec_pending(rec)) {
        if (ctpu_last_status() == CTPU_OK)
            ctpu_set_error(CTPU_ERR_STATE, "%s: the value could not be computed", op);
        return false;
    }
    return true;
}

ctpu_status ctpu__defer_assign(ctpu_trec *dst, ctpu_tensor dst_h, ctpu_trec *src, ctpu_op_prov prov)
{
    if (!state_ready()) {
        ctpu_set_error(CTPU_ERR_OOM, "assign: out of host memory recording the trace");
        return CTPU_ERR_OOM;
    }
    if (ctpu_rec_pending(dst) && dst->trace_id != t_df.id) {
        ctpu_set_error(CTPU_ERR_STATE, "assign: dst is pending in another thread's trace");
        return CTPU_ERR_STATE;
    }
    ctpu_vref v;
    if (ctpu_rec_pending(src)) {
        if (!input_vref(src, "assign", &v)) return ctpu_last_status();
    } else {
        /* a computed src: copy it inside the trace, so reads of dst's old
         * value recorded before still see the old value */
        ctpu_node n = { .op = CTPU_OP_COPY, .n_in = 1, .out = src->type };
        if (!input_vref(src, "assign", &n.in[0])) return ctpu_last_status();
        v = ctpu_trace_rec_node(t_df.rec, &n, NULL, prov);
        if (v < 0) {
            ctpu_set_error(CTPU_ERR_OOM, "assign: out of host memory recording the trace");
            return CTPU_ERR_OOM;
        }
    }
    bool was_pending = ctpu_rec_pending(dst);
    ctpu_buffer_bind_touch(dst->buf);
    dst->trace_id = t_df.id;
    dst->tval = v;
    /* dst->buf stays: the storage the new value is written into at the cut */
    if (!was_pending && !add_holder(dst_h.id)) {
        ctpu_set_error(CTPU_ERR_OOM, "assign: out of host memory recording the trace");
        return CTPU_ERR_OOM;
    }
    if (!was_pending && ctpu__capturing()) ctpu__capture_note_assign(dst_h.id);
    return CTPU_OK;
}

/* Values that could not be computed (a failed launch): every pending handle
 * of the trace gets its fault, reported when it is read. */
static void poison_holders(ctpu_status st, const char *msg)
{
    ctpu_device *dev = ctpu_rt->dev;
    unsigned id = ctpu_device_fault_new(dev, st, msg, false);
    char err[256];
    ctpu_bind_bump();
    for (size_t i = 0; i < t_df.n_holders; i++) {
        ctpu_tensor h = { t_df.holders[i] };
        ctpu_trec *r = ctpu_slot(ctpu_handle_slot(h));
        if (!r->live || r->gen != ctpu_handle_gen(h) || r->trace_id != t_df.id) continue;
        r->trace_id = 0;
        if (r->buf && atomic_load(&r->buf->handle_refs) == 1) {
            atomic_store(&r->buf->fault, id);
            continue;
        }
        if (r->buf) {
            atomic_fetch_sub(&r->buf->handle_refs, 1);
            ctpu_buffer_release(dev, r->buf);
            r->buf = NULL;
        }
        ctpu_buffer *b = ctpu_buffer_alloc(dev, 0, err, sizeof err);
        if (!b) continue;   /* leaves r without storage: reads say "stale" */
        atomic_store(&b->fault, id);
        atomic_fetch_add(&b->handle_refs, 1);
        r->buf = b;
        r->off = 0;
    }
}

/* The automatic marks of the trace: gone from its input handles (the next
 * trace marks them again, as its structure says) and, when the flush did
 * not confirm them, from the values the trace made (their automatic dims). */
static void drop_spec(bool confirmed)
{
    for (int k = 0; k < t_df.n_spec; k++) {
        ctpu_trec *r = t_df.spec[k].r;
        if (!atomic_load(&r->live) || atomic_load(&r->gen) != t_df.spec[k].gen || !r->dyn) continue;
        ctpu_dyndim d[CTPU_MAX_DIMS];
        memcpy(d, r->dyn, sizeof d);
        d[t_df.spec[k].dim] = (ctpu_dyndim){ 0, 0, 0 };
        ctpu__rec_set_dyn(r, d, r->type.ndim);
    }
    if (confirmed) return;
    ctpu_trec *const *pages = ctpu_rt->pages;
    for (size_t i = 0; i < t_df.n_holders; i++) {
        ctpu_trec *r = ctpu_slot_if_live(pages, t_df.holders[i]);
        if (!r || !r->dyn) continue;
        ctpu_dyndim d[CTPU_MAX_DIMS];
        memcpy(d, r->dyn, sizeof d);
        for (int e = 0; e < r->type.ndim; e++)
            if (d[e].lo == 2 && d[e].hi == 2147483647) d[e] = (ctpu_dyndim){ 0, 0, 0 };
        ctpu__rec_set_dyn(r, d, r->type.ndim);
    }
}

/* TORCH_TPU_AUTO_DYNAMIC, after a flush of structure sh: its entry takes
 * this trace's recorded input types and, once the structure's first
 * one-dim recompile is known (fin: the trace compiled here), its dims. */
static void amem_update(uint64_t sh, const ctpu_trace_final *fin, const ctpu_launch_plan *pl)
{
    ctpu_defer_state *df = &t_df;
    ctpu_buffer *const *ib;
    const size_t *io;
    const ctpu_vtype *it;
    int ni = ctpu_trace_rec_inputs(df->rec, &ib, &io, &it);
    if (!sh || ni <= 0) return;
    ctpu_auto_mem *e = NULL;
    for (int k = 0; k < df->n_amem && !e; k++)
        if (df->amem[k].struct_hash == sh) e = &df->amem[k];
    if (!e && df->n_amem < 16) {
        if (df->n_amem == df->cap_amem) {
            ctpu_auto_mem *na = realloc(df->amem, sizeof *na * (size_t)(df->cap_amem ? df->cap_amem * 2 : 4));
            if (!na) return;
            df->amem = na;
            df->cap_amem = df->cap_amem ? df->cap_amem * 2 : 4;
        }
        e = &df->amem[df->n_amem++];
        memset(e, 0, sizeof *e);
    } else if (!e) {                 /* the least recently flushed structure makes room */
        e = &df->amem[0];
        for (int k = 1; k < df->n_amem; k++)
            if (df->amem[k].used < e->used) e = &df->amem[k];
        free(e->in);
        memset(e, 0, sizeof *e);
    }
    if (e->struct_hash != sh || ni > e->n_in) {
        ctpu_vtype *p = realloc(e->in, sizeof *p * (size_t)ni);
        if (!p) { e->n_in = 0; return; }
        e->in = p;
    }
    e->struct_hash = sh;
    e->used = ++df->amem_seq;
    memcpy(e->in, it, sizeof *it * (size_t)ni);
    e->n_in = ni;
    int in[16], dim[16], coef[16];
    int n = !e->learnt && fin && pl ? ctpu__report_auto_pairs(&fin->t, in, dim, coef, 16) : 0;
    for (int k = 0; k < n; k++) {
        if (in[k] < 0 || in[k] >= pl->n_in) continue;
        int32_t rec = pl->in_src[in[k]];
        if (rec < 0 || rec >= ni || dim[k] < 0 || dim[k] >= it[rec].ndim) continue;
        e->rec[e->n_dims] = rec;
        e->dim[e->n_dims] = dim[k];
        e->coef[e->n_dims++] = coef[k];
    }
    e->learnt |= n > 0;
}

/* The structure a program was compiled for (amem_update on a cache hit). */
static void amap_put(uint64_t program, uint64_t sh)
{
    int n = (int)(sizeof t_df.amap / sizeof t_df.amap[0]);
    for (int k = 0; k < t_df.n_amap && k < n; k++)
        if (t_df.amap[k].program == program) { t_df.amap[k].struct_hash = sh; return; }
    int k = t_df.n_amap++ % n;
    t_df.amap[k].program = program;
    t_df.amap[k].struct_hash = sh;
}

static uint64_t amap_get(uint64_t program)
{
    int n = (int)(sizeof t_df.amap / sizeof t_df.amap[0]);
    for (int k = 0; k < t_df.n_amap && k < n; k++)
        if (t_df.amap[k].program == program) return t_df.amap[k].struct_hash;
    return 0;
}

static void reset_trace(void)
{
    if (t_df.n_spec) drop_spec(t_df.spec_ok);
    t_df.n_spec = t_df.n_other = 0;
    t_df.spec_ok = t_df.other_dyn = t_df.spec_full = t_df.amem_none = false;
    t_df.spec_from = t_df.spec_to = 0;
    t_df.amem_alive = t_df.amem_expl = ~0u;
    t_df.amem_hi = 0;
    if (t_df.any_dyn) {
        if (t_df.in_has_dyn) memset(t_df.in_has_dyn, 0, t_df.cap_in_dyn);
        if (t_df.node_has_dyn) memset(t_df.node_has_dyn, 0, t_df.cap_node_dyn);
        t_df.any_dyn = false;
    }
    t_df.dyn_sig = 0;
    t_df.n_sym = 0;
    ctpu_trace_rec_reset(t_df.rec, ctpu_rt->dev);
    t_df.n_holders = 0;
    t_df.id = atomic_fetch_add(&ctpu_rt->next_trace_id, 1);
}

static bool key_append(uint8_t **kb, size_t *len, size_t *cap, const void *p, size_t n)
{
    if (*len + n > *cap) {
        size_t nc = *cap ? *cap * 2 : 1024;
        while (nc < *len + n) nc *= 2;
        uint8_t *q = realloc(*kb, nc);
        if (!q) return false;
        *kb = q;
        *cap = nc;
    }
    memcpy(*kb + *len, p, n);
    *len += n;
    return true;
}

/* The full raw key: the recorded inputs and nodes (encoded and hashed as
 * they were recorded), then the live-out requests with how each assigned
 * parameter's storage relates to the recorded inputs (which inputs view it,
 * at which offset), and the options. *key points into the recorder. */
static bool key_suffix(uint8_t **kb, size_t *len_io, size_t *cap_io, const ctpu_liveout_req *reqs, int nreq, bool dbg);

static bool raw_key(const ctpu_liveout_req *reqs, int nreq, bool dbg, const uint8_t **key, size_t *len_out,
                    uint64_t *hash)
{
    size_t len = 0;
    return key_suffix(&t_df.suffix, &len, &t_df.cap_suffix, reqs, nreq, dbg) &&
           ctpu_trace_rec_key_final(t_df.rec, t_df.suffix, len, key, len_out, hash);
}

/* The requests and options after the recorded trace (both keys). */
static bool key_suffix(uint8_t **kbp, size_t *len_io, size_t *cap_io, const ctpu_liveout_req *reqs, int nreq, bool dbg)
{
    ctpu_buffer *const *ib;
    const size_t *io;
    int ni = ctpu_trace_rec_inputs(t_df.rec, &ib, &io, NULL);
    uint8_t *kb = *kbp;
    size_t len = *len_io, cap = *cap_io;
    bool ok = true;
    uint8_t d = dbg;
    ok = ok && key_append(&kb, &len, &cap, &d, 1);
    for (int q = 0; ok && q < nreq; q++) {
        int32_t v[2] = { reqs[q].v, reqs[q].alias_buf ? 1 : 0 };
        ok = key_append(&kb, &len, &cap, v, sizeof v);
        if (!reqs[q].alias_buf) continue;
        for (int j = 0; ok && j < ni; j++) {
            if (ib[j] != reqs[q].alias_buf) continue;
            int32_t e[2] = { j, io[j] == reqs[q].alias_off };
            ok = key_append(&kb, &len, &cap, e, sizeof e);
        }
        int32_t end = -1;
        ok = ok && key_append(&kb, &len, &cap, &end, sizeof end);
    }
    *kbp = kb;
    *len_io = len;
    *cap_io = cap;
    return ok;
}

/* The dynamic key (DESIGN.md "Dynamic dims"): the recorded trace with each
 * in-range dynamic dim written as its symbol (numbered by first appearance:
 * its range, never its value) and coefficient; a node with a dynamic dim
 * is written without its extent attrs (slice bounds: the bind reads the
 * launch's own). A dim out of its range is written static, and *why says
 * so ("input 0 dim 1 = 300 outside dynamic range [2, 256]"). *any: some
 * dim is symbolic. */
typedef struct {
    int64_t lo[64], hi[64], v[64];
    int n;
    bool any;
    char *why;
    size_t whylen;
    int *why_rec;                    /* the recorded input *why names (the caller renumbers it), or -1 */
} dyn_keyer;

static bool dyn_put_type(dyn_keyer *k, uint8_t **kb, size_t *len, size_t *cap, const ctpu_vtype *t,
                         const ctpu_dyndim *dd, int input, bool *sym_out)
{
    uint8_t h[2] = { t->dtype, t->ndim };
    bool ok = key_append(kb, len, cap, h, 2);
    for (int d = 0; ok && d < t->ndim; d++) {
        int64_t w[2] = { t->shape[d], 0 };
        const ctpu_dyndim *y = dd ? &dd[d] : NULL;
        if (y && y->coef > 0 && t->shape[d] % y->coef == 0) {
            int64_t v = t->shape[d] / y->coef;
            if (v >= y->lo && v <= y->hi) {
                int s = 0;
                while (s < k->n && !(k->lo[s] == y->lo && k->hi[s] == y->hi && k->v[s] == v)) s++;
                if (s == k->n && k->n < 64) { k->lo[s] = y->lo; k->hi[s] = y->hi; k->v[s] = v; k->n++; }
                if (s < 64) {
                    w[0] = -1 - s;
                    w[1] = y->coef;
                    ok = key_append(kb, len, cap, &y->lo, sizeof y->lo) && key_append(kb, len, cap, &y->hi, sizeof y->hi);
                    k->any = *sym_out = true;
                }
            } else if (input >= 0 && !k->why[0]) {
                snprintf(k->why, k->whylen, " dim %d = %lld outside dynamic range [%lld, %lld]", d,
                         (long long)t->shape[d], (long long)y->lo, (long long)y->hi);
                *k->why_rec = input;
            }
        }
        ok = ok && key_append(kb, len, cap, w, sizeof w);
    }
    return ok;
}

static uint8_t *dyn_key(const ctpu_liveout_req *reqs, int nreq, bool dbg, size_t *len_out, bool *any, char *why,
                        size_t whylen, int *why_rec)
{
    ctpu_buffer *const *ib;
    const size_t *io;
    const ctpu_vtype *it;
    int ni = ctpu_trace_rec_inputs(t_df.rec, &ib, &io, &it), nn = ctpu_trace_rec_nodes(t_df.rec);
    dyn_keyer k = { .why = why, .whylen = whylen, .why_rec = why_rec };
    why[0] = 0;
    *why_rec = -1;
    size_t len = 0, cap = 1024 + (size_t)(ni + nn) * 160;
    uint8_t *kb = malloc(cap);
    if (!kb) return NULL;
    int32_t hdr[3] = { 0x314e5944 /* "DYN1" */, ni, nn };
    bool ok = key_append(&kb, &len, &cap, hdr, sizeof hdr);
    bool *in_sym = calloc((size_t)ni + 1, 1);
    ok = ok && in_sym;
    for (int i = 0; ok && i < ni; i++) {
        const ctpu_dyndim *dd = (size_t)i < t_df.cap_in_dyn && t_df.in_has_dyn[i] ? t_df.in_dyn[i] : NULL;
        ok = dyn_put_type(&k, &kb, &len, &cap, &it[i], dd, i, &in_sym[i]);
    }
    bool *nsym = ok ? calloc((size_t)nn + 1, 1) : NULL;
    ok = ok && nsym;
    for (int i = 0; ok && i < nn; i++) {
        const double *sc;
        const ctpu_node *n = ctpu_trace_rec_node_at(t_df.rec, i, &sc);
        uint8_t h[4] = { (uint8_t)(n->op & 0xff), (uint8_t)(n->op >> 8), n->n_in, n->n_scalars };
        ok = key_append(&kb, &len, &cap, h, sizeof h) && key_append(&kb, &len, &cap, n->in, sizeof(int32_t) * n->n_in);
        const ctpu_dyndim *dd = (size_t)i < t_df.cap_node_dyn && t_df.node_has_dyn[i] ? t_df.node_dyn[i] : NULL;
        bool sym = false;
        ok = ok && dyn_put_type(&k, &kb, &len, &cap, &n->out, dd, -1, &sym);
        for (int q = 0; q < n->n_in; q++) sym |= n->in[q] >= 0 ? nsym[n->in[q]] : in_sym[-n->in[q] - 1];
        nsym[i] = sym;
        ctpu_attrs a = n->attr;
        if (sym) memset(a.i64, 0, sizeof a.i64);
        ok = ok && key_append(&kb, &len, &cap, &a, sizeof a);
    }
    free(in_sym);
    free(nsym);
    ok = ok && key_suffix(&kb, &len, &cap, reqs, nreq, dbg);
    if (!ok) { free(kb); return NULL; }
    *any = k.any;
    *len_out = len;
    return kb;
}

static ctpu_status flush_fail(ctpu_status st, const char *msg, ctpu_liveout_req *reqs, ctpu_trec **rrec)
{
    poison_holders(st, msg);
    free(reqs);
    free(rrec);
    reset_trace();
    ctpu_set_error(st, "%s", msg);
    return st;
}

/* One flush: collect live-outs -> look up or compile -> bind buffers ->
 * publish. */
typedef struct {
    ctpu_runtime *rt;
    ctpu_cut_reason why;
    bool dbg;
    ctpu_liveout_req *reqs;        /* [nreq] the live pending values */
    ctpu_trec **rrec;              /* [nreq] their handles' records */
    uint64_t *rh;                  /* [nreq] their handle ids (a capture's flush only) */
    bool sink;                     /* a capture's own flush: hand the replay its facts */
    int nreq;
    ctpu_program *prog;
    const ctpu_launch_plan *plan;
    ctpu_cache_result res;
    ctpu_cmd cmd;
    ctpu_buffer **outb;            /* [plan->n_out] output buffers (our refs) */
    size_t *outo;
    ctpu_buffer *scratch;
    bool op_by_op;                 /* past the recompile limit: run through strict eager, node by node */
    bool dynamic;                  /* keyed by the dynamic key (a miss compiles a dynamic program) */
    ctpu_program *bound;           /* a dynamic program's launch at this trace's extents (ours), or NULL */
    size_t *out_bytes;             /* [plan->n_out] with bound: the outputs' bytes at these extents */
    char dyn_why[160];             /* a dynamic dim out of its range: the recompile reason */
    int dyn_why_rec;               /* >= 0: dyn_why is the dim's part, of this recorded input (dyn_why_text) */
    const uint8_t *key;            /* the static key (a dynamic miss may fall back to it; in the recorder) */
    size_t klen;
    uint64_t khash;                /* its hash */
    uint64_t step;                 /* marked steps at the cut */
    char err[384];
} flush_ctx;

/* Live-out: pending handles of this trace still alive; a parameter whose
 * storage only its handle holds is written in place (not with debug
 * checks: the old value is kept). */
static bool collect_live_outs(flush_ctx *f)
{
    size_t nh = t_df.n_holders;
    f->reqs = malloc(sizeof *f->reqs * (nh + 1));
    f->rrec = malloc(sizeof *f->rrec * (nh + 1));
    if (f->sink) f->rh = malloc(sizeof *f->rh * (nh + 1));
    if (!f->reqs || !f->rrec || (f->sink && !f->rh)) return false;
    const uint64_t *holders = t_df.holders, id = t_df.id;
    ctpu_trec *const *pages = f->rt->pages;
    int nreq = 0;
    for (size_t i = 0; i < nh; i++) {
        ctpu_trec *r = ctpu_slot_if_live(pages, holders[i]);
        if (!r || r->trace_id != id) continue;
        bool own = r->buf && atomic_load(&r->buf->handle_refs) == 1 && !f->dbg;
        if (own) {   /* another thread's pending trace reads it: copy, do not write under that trace */
            int tr = atomic_load_explicit(&r->buf->trace_readers, memory_order_acquire);
            own = tr == 0 || tr == ctpu_trace_rec_reads_buf(t_df.rec, r->buf);
        }
        if (own && f->sink && ctpu__capture_fn_assigned(holders[i])) own = false;   /* its old value is a constant of the capture */
        f->reqs[nreq] = (ctpu_liveout_req){ r->tval, own ? r->buf : NULL, own ? r->off : 0 };
        if (f->rh) f->rh[nreq] = holders[i];
        f->rrec[nreq++] = r;
    }
    f->nreq = nreq;
    return true;
}

/* The report's live-out advice (report.c): at a marked step's cut, the
 * live values an op of this trace also reads. Each gets a buffer only
 * because a handle is still alive: released before the cut, it would fuse
 * away. Assigned tensors are not counted (their storage is written anyway);
 * each is named by its op and its name, or else its region label. */
static void note_held(const flush_ctx *f)
{
    int n = ctpu_trace_rec_nodes(t_df.rec);
    const uint8_t *read = ctpu_trace_rec_read(t_df.rec);   /* noted as the nodes were recorded */
    /* counted values: a few requests look back at the earlier ones, many mark a table */
    uint8_t *seen = f->nreq > 16 ? calloc((size_t)n + 1, 1) : NULL;
    if (f->nreq > 16 && !seen) return;
    const ctpu_op_prov *rp = ctpu_trace_rec_prov(t_df.rec);
    char ex[CTPU_HELD_EXAMPLES][96];
    int nex = 0;
    uint64_t count = 0;
    for (int q = 0; q < f->nreq; q++) {
        int v = f->reqs[q].v;
        const ctpu_trec *r = f->rrec[q];
        if (v < 0 || !read[v] || r->buf) continue;
        if (seen) {
            if (seen[v]) continue;
            seen[v] = 1;
        } else {
            int e = 0;
            while (e < q && (f->reqs[e].v != v || f->rrec[e]->buf)) e++;
            if (e < q) continue;      /* counted at request e */
        }
        count++;
        if (nex == CTPU_HELD_EXAMPLES) continue;
        const char *nm = ctpu_rec_name(r);
        const char *l = nm[0] ? nm : rp ? ctpu__label_text(rp[v].label) : "";
        snprintf(ex[nex++], sizeof ex[0], "%s%s%.64s%s", r->made_by ? r->made_by : "?", l[0] ? " (" : "", l,
                 l[0] ? ")" : "");
    }
    free(seen);
    if (count) ctpu__report_held(count, f->step, (const char (*)[96])ex, nex);
}

/* A miss this thread compiles: finalise the recorded trace (dead code
 * removed, canonical numbering, aliasing, the launch plan), compile it
 * outside the cache lock, insert it with its plan. False if there is no
 * finalised trace (out of memory: err says so). */
/* The user's names (ctpu_set_name) of a finalised trace's canonical inputs,
 * or NULL when none has one (free() the result). */
static const char **input_names(const ctpu_trace_final *fin)
{
    ctpu_buffer *const *ib;
    const size_t *io;
    ctpu_trace_rec_inputs(t_df.rec, &ib, &io, NULL);
    const ctpu_launch_plan *pl = fin->plan;
    if (!pl || pl->n_in <= 0) return NULL;
    bool any = false;
    for (int k = 0; k < pl->n_in && !any; k++) any = ib[pl->in_src[k]] && ib[pl->in_src[k]]->name;
    if (!any) return NULL;
    const char **names = calloc((size_t)pl->n_in, sizeof *names);
    for (int k = 0; names && k < pl->n_in; k++) names[k] = ib[pl->in_src[k]] ? ib[pl->in_src[k]]->name : NULL;
    return names;
}

/* What a recompile reason names, from this recording (never from the step
 * that compiled the program): the inputs' user names, the op (number,
 * label) that reads each canonical input first, each canonical node's.
 * free_diff_names() it. */
static void diff_names_make(const ctpu_trace_final *fin, ctpu_diff_names *dn)
{
    enum { W = 112 };
    memset(dn, 0, sizeof *dn);
    dn->in_names = input_names(fin);
    const ctpu_launch_plan *pl = fin->plan;
    const ctpu_trace *t = &fin->t;
    const ctpu_op_prov *rp = ctpu_trace_rec_prov(t_df.rec);
    if (!pl || !rp || pl->n_nodes != t->n_nodes) return;
    size_t n = (size_t)t->n_inputs + (size_t)t->n_nodes;
    char *mem = malloc(n * (sizeof(char *) + W) + 1);
    if (!mem) return;
    const char **ptr = (const char **)(void *)mem;
    char *txt = mem + n * sizeof(char *);
    for (size_t i = 0; i < n; i++) { ptr[i] = txt + i * W; txt[i * W] = 0; }
    for (int i = 0; i < t->n_nodes; i++) {
        ctpu_op_prov p = rp[pl->node_src[i]];
        ctpu__prov_text(p, (char *)ptr[t->n_inputs + i], W);
        for (int j = 0; j < t->nodes[i].n_in; j++) {
            int32_t v = t->nodes[i].in[j];
            if (v >= 0 && v < t->n_inputs && !ptr[v][0]) ctpu__prov_text(p, (char *)ptr[v], W);
        }
    }
    dn->in_prov = ptr;
    dn->node_prov = ptr + t->n_inputs;
}

static void free_diff_names(ctpu_diff_names *dn)
{
    free((void *)dn->in_names);
    free((void *)dn->in_prov);      /* (node_prov lives in the same block) */
    memset(dn, 0, sizeof *dn);
}

/* A new program in the step after another's: if one of its inputs is a
 * value the last flush computed (a tensor made between steps, such as an accumulator
 * from ctpu_zeros, is folded into the first step's program and is a device
 * buffer in the next), the recompile log says so. */
static void note_structure_change(flush_ctx *f, const ctpu_trace_final *fin, const char **names)
{
    ctpu_buffer *const *ib;
    const size_t *io;
    ctpu_trace_rec_inputs(t_df.rec, &ib, &io, NULL);
    const ctpu_launch_plan *pl = fin->plan ? fin->plan : f->plan;
    if (!pl) return;
    for (int k = 0; k < pl->n_in; k++) {
        const ctpu_buffer *b = ib[pl->in_src[k]];
        for (size_t i = 0; i < t_df.n_made; i++) {
            if (t_df.made[i].buf != b || !b || t_df.made[i].serial != b->serial) continue;
            ctpu_recompile_rec rec = { .step = f->step, .old_program = t_df.last_program,
                                       .new_program = f->res.program_id };
            const char *nm = names && names[k] ? names[k] : t_df.made[i].name;
            snprintf(rec.made_by, sizeof rec.made_by, "%s", t_df.made[i].op ? t_df.made[i].op : "?");
            snprintf(rec.tensor, sizeof rec.tensor, "%s", nm);
            snprintf(rec.reason, sizeof rec.reason, "input %d%s%.64s%s was computed by %s in step %llu, now a device buffer",
                     k, nm[0] ? " (" : "", nm, nm[0] ? ")" : "", rec.made_by, (unsigned long long)t_df.last_step);
            ctpu_cache_log_change(f->rt->fused_cache, &rec);
            return;
        }
    }
}

/* The label of the structure's first op (the recompile-limit warning), or NULL. */
static const char *first_label(const ctpu_trace_final *fin)
{
    const ctpu_op_prov *rp = ctpu_trace_rec_prov(t_df.rec);
    if (!fin->plan || !rp || fin->plan->n_nodes < 1) return NULL;
    const char *l = ctpu__label_text(rp[fin->plan->node_src[0]].label);
    return l[0] ? l : NULL;
}

/* Does the (recorded input, dim, coef) triple of spec entry s, or of the
 * required triple (rec, dim, coef), have its match in the other set? */
static bool spec_has(int32_t rec, int dim, int coef)
{
    for (int s = 0; s < t_df.n_spec; s++)
        if (t_df.spec[s].rec == rec && t_df.spec[s].dim == dim && t_df.spec[s].coef == coef) return true;
    return false;
}

static bool is_other(int32_t rec)
{
    for (int k = 0; k < t_df.n_other && k < 16; k++)
        if (t_df.other_rec[k] == rec) return true;
    return false;
}

/* TORCH_TPU_AUTO_DYNAMIC: the automatic marks of this trace are exactly
 * what its own structure requires (policy.c): the dims its first one-dim
 * recompile made dynamic, or, when this trace is that recompile (the
 * policy's detection, before the compile), the dim it changes. Then they
 * stay and the recompile compiles the dynamic program. Compared as sets of
 * (recorded input, dim, coef): one input read through several handles (the
 * tensor and the copy autograd saves of it for a backward rule) is marked
 * once per handle, one input all the same; inputs marked otherwise
 * (ctpu_mark_dynamic, a value made dynamic) are not compared. */
static bool spec_confirm(const ctpu_trace_final *fin)
{
    int in[16], dim[16], coef[16];
    int32_t rec[16];
    const ctpu_launch_plan *pl = fin->plan;
    if (!pl || t_df.spec_full || t_df.n_other > 16) return false;
    int n = ctpu__report_auto_pairs(&fin->t, in, dim, coef, 16);
    if (n == 0) n = ctpu__report_auto_would(&fin->t, in, dim, coef, 16);
    if (n <= 0) return false;
    for (int k = 0; k < n; k++) {
        if (in[k] < 0 || in[k] >= pl->n_in) return false;
        rec[k] = pl->in_src[in[k]];
        if (!is_other(rec[k]) && !spec_has(rec[k], dim[k], coef[k])) return false;
    }
    for (int s = 0; s < t_df.n_spec; s++) {
        bool found = false;
        for (int k = 0; k < n && !found; k++)
            found = rec[k] == t_df.spec[s].rec && dim[k] == t_df.spec[s].dim && coef[k] == t_df.spec[s].coef;
        if (!found) return false;
    }
    t_df.spec_ok = true;
    return true;
}

/* The out-of-range reason, its input numbered as the other recompile
 * reasons number them (the finalised trace's inputs: a recorded input only
 * a dead op read is not one) and named as they name it: "input 0 (x) dim
 * 0 = 300 outside dynamic range [2, 256]". */
static const char *dyn_why_text(const flush_ctx *f, const ctpu_trace_final *fin, const char **names, char *buf,
                                size_t len)
{
    if (f->dyn_why_rec < 0) return f->dyn_why;
    const ctpu_launch_plan *pl = fin->plan;
    int k = 0;
    while (pl && k < pl->n_in && pl->in_src[k] != f->dyn_why_rec) k++;
    if (!pl || k == pl->n_in) return f->dyn_why + 1;   /* (not an input of the program: the dim's part alone) */
    const char *nm = names && names[k] ? names[k] : "";
    snprintf(buf, len, "input %d%s%.64s%s%s", k, nm[0] ? " (" : "", nm, nm[0] ? ")" : "", f->dyn_why);
    return buf;
}

static bool compile_miss(flush_ctx *f, ctpu_cache_pending *miss, const ctpu_cache_opts *o, ctpu_trace_final *fin)
{
    ctpu_cache *cache = f->rt->fused_cache;
    if (!ctpu_trace_finalize(t_df.rec, f->reqs, f->nreq, 0, (uint8_t)f->dbg, fin)) {
        ctpu_cache_abandon(cache, miss);
        snprintf(f->err, sizeof f->err, "out of host memory finalising the trace");
        return false;
    }
    if (f->dynamic && (t_df.n_spec || t_df.spec_full) && !spec_confirm(fin)) {
        /* automatic marks its structure does not require: the trace is
         * keyed and compiled static */
        ctpu_cache_abandon(cache, miss);
        f->dynamic = false;
        miss = NULL;
        f->prog = ctpu_cache_find_hashed(cache, f->key, f->klen, f->khash, o, &f->res, &f->plan, &miss, f->err,
                                         sizeof f->err);
        if (!miss) return true;   /* another thread compiled it, or a refusal */
    }
    bool first = false;
    char lim[400];
    if (!ctpu_cache_shape_allowed(cache, miss, &fin->t, first_label(fin), &first, lim, sizeof lim)) {
        ctpu_cache_abandon(cache, miss);
        if (first) fprintf(stderr, "ctpu: warning: %s; running it op by op in strict eager\n", lim);
        f->op_by_op = true;
        return true;
    }
    ctpu_program *p = f->dynamic ? ctpu_fuse_compile_dynamic(&fin->t, f->err, sizeof f->err)
                                 : ctpu_fuse_compile(&fin->t, f->err, sizeof f->err);
    if (!p) {
        ctpu_cache_abandon(cache, miss);
        return true;
    }
    ctpu_diff_names dn;
    diff_names_make(fin, &dn);
    const char **names = (const char **)dn.in_names;
    ctpu_cache_opts on = *o;
    on.names = dn;
    char why[240];
    on.reason = f->dyn_why[0] ? dyn_why_text(f, fin, names, why, sizeof why) : NULL;
    ctpu_launch_plan *plan = fin->plan;
    fin->plan = NULL;                       /* the cache's now */
    f->prog = ctpu_cache_insert(cache, miss, &fin->t, p, plan, &on, &f->res, f->err, sizeof f->err);
    f->plan = f->prog ? plan : NULL;
    /* a new program in a new step right after the last step's (cuts within
     * one step, such as a host read's, are a step's parts, not a change; a
     * last cut that read no device buffer only made values: initialisation) */
    if (f->prog && !f->res.recompile && t_df.last_program && t_df.last_program != f->res.program_id &&
        t_df.last_step < f->step && t_df.last_had_inputs)
        note_structure_change(f, fin, names);
    free_diff_names(&dn);
    return true;
}

static void count_lookup(const flush_ctx *f)
{
    ctpu_metrics *m = &f->rt->metrics;
    const ctpu_cache_result *res = &f->res;
    ctpu_counter_add(m, CTPU_CTR_CACHE_REQUESTS, 1);
    ctpu_counter_add(m, CTPU_CTR_FUSED_CACHE_REQUESTS, 1);
    ctpu_counter_add(m, res->hit ? CTPU_CTR_CACHE_HITS : CTPU_CTR_CACHE_MISSES, 1);
    ctpu_counter_add(m, res->hit ? CTPU_CTR_FUSED_CACHE_HITS : CTPU_CTR_FUSED_CACHE_MISSES, 1);
    if (f->prog && !res->hit) {
        ctpu_counter_add(m, CTPU_CTR_PROGRAMS_COMPILED, 1);
        ctpu_timer_add(m, CTPU_TMR_COMPILE_TIME, f->prog->compile_ns);
        if (res->recompile) ctpu_counter_add(m, CTPU_CTR_RECOMPILES, 1);
        if (res->thrash) ctpu_counter_add(m, CTPU_CTR_CACHE_THRASH, 1);
    }
    if (res->evicted) ctpu_counter_add(m, CTPU_CTR_CACHE_EVICTIONS, res->evicted);
    if (res->collisions) ctpu_counter_add(m, CTPU_CTR_CACHE_COLLISIONS, res->collisions);
}

/* The outputs' bytes of a bound launch (at its extents), into f->out_bytes. */
static bool bound_out_bytes(flush_ctx *f)
{
    const ctpu_trace *bt = f->bound->bound_trace;
    if (!bt || !f->out_bytes) return false;
    for (int j = 0; j < bt->n_outputs; j++) {
        int32_t v = bt->outputs[j];
        const ctpu_vtype *vt = v < bt->n_inputs ? &bt->in_type[v] : &bt->nodes[v - bt->n_inputs].out;
        f->out_bytes[j] = (size_t)ctpu_vtype_numel(vt) * ctpu_kdt_size(vt->dtype);
    }
    return true;
}

/* A dynamic program found for this trace: its launch at the recorded
 * extents (ctpu_fuse_bind). False when its fusion groups do not hold here
 * (f->err says so): the caller compiles the trace statically. */
static bool bind_dynamic(flush_ctx *f)
{
    const ctpu_trace *ct = ctpu_program_dyn_trace(f->prog);
    const ctpu_launch_plan *pl = f->plan;
    ctpu_buffer *const *ib;
    const size_t *io;
    const ctpu_vtype *it;
    ctpu_trace_rec_inputs(t_df.rec, &ib, &io, &it);
    ctpu_trace bt = *ct;
    bt.in_type = malloc(sizeof(ctpu_vtype) * ((size_t)ct->n_inputs + 1));
    bt.nodes = malloc(sizeof(ctpu_node) * ((size_t)ct->n_nodes + 1));
    f->out_bytes = malloc(sizeof(size_t) * ((size_t)ct->n_outputs + 1));
    bool ok = bt.in_type && bt.nodes && f->out_bytes && pl->n_in == ct->n_inputs && pl->n_nodes == ct->n_nodes;
    for (int k = 0; ok && k < ct->n_inputs; k++) bt.in_type[k] = it[pl->in_src[k]];
    for (int k = 0; ok && k < ct->n_nodes; k++) {
        const double *sc;
        const ctpu_node *rn = ctpu_trace_rec_node_at(t_df.rec, pl->node_src[k], &sc);
        bt.nodes[k] = ct->nodes[k];
        bt.nodes[k].out = rn->out;
        bt.nodes[k].attr = rn->attr;
    }
    uint64_t t0 = ctpu_now_ns();
    bool reused = false;
    ctpu_program *evicted = NULL;
    if (ok) f->bound = ctpu_fuse_bind_cached(f->prog, &bt, &reused, &evicted, f->err, sizeof f->err);
    if (evicted) ctpu_cache_orphan(f->rt->fused_cache, evicted);   /* it may still be running */
    free(bt.in_type);
    free(bt.nodes);
    if (f->bound && !bound_out_bytes(f)) {
        ctpu_cache_release(f->rt->fused_cache, f->bound);   /* never submitted (the program keeps it) */
        f->bound = NULL;
    }
    if (!f->bound) {
        free(f->out_bytes);
        f->out_bytes = NULL;
        return false;
    }
    ctpu_cache_alias_add(f->rt->fused_cache, f->key, f->klen, f->khash, t_df.dyn_sig, f->prog, f->bound);
    ctpu_counter_add(&f->rt->metrics, CTPU_CTR_DYNAMIC_BINDS, 1);
    if (reused) ctpu_counter_add(&f->rt->metrics, CTPU_CTR_DYNAMIC_BIND_REUSES, 1);
    ctpu_timer_add(&f->rt->metrics, CTPU_TMR_DYNAMIC_BIND_TIME, ctpu_now_ns() - t0);
    return true;
}

/* A trace seen before, bound to a dynamic program then (fuse.h bound
 * aliases: the same static key and dynamic marks): that program and its
 * launch, without the dynamic key or a bind. Counted as a kept bound
 * launch's reuse. */
static bool alias_dynamic(flush_ctx *f, const ctpu_cache_opts *opts)
{
    uint64_t t0 = ctpu_now_ns();
    f->prog = ctpu_cache_peek_alias(f->rt->fused_cache, f->key, f->klen, f->khash, t_df.dyn_sig, opts, &f->res,
                                    &f->plan, &f->bound);
    if (!f->prog) return false;
    f->out_bytes = malloc(sizeof(size_t) * ((size_t)f->bound->bound_trace->n_outputs + 1));
    if (!f->out_bytes || !bound_out_bytes(f)) {   /* out of memory: the dynamic key's way */
        free(f->out_bytes);
        f->out_bytes = NULL;
        ctpu_cache_release(f->rt->fused_cache, f->bound);
        ctpu_cache_release(f->rt->fused_cache, f->prog);
        f->bound = f->prog = NULL;
        f->plan = NULL;
        return false;
    }
    f->dynamic = true;
    ctpu_counter_add(&f->rt->metrics, CTPU_CTR_DYNAMIC_BINDS, 1);
    ctpu_counter_add(&f->rt->metrics, CTPU_CTR_DYNAMIC_BIND_REUSES, 1);
    ctpu_timer_add(&f->rt->metrics, CTPU_TMR_DYNAMIC_BIND_TIME, ctpu_now_ns() - t0);
    return true;
}

/* The program this flush runs: a dynamic program's launch, or the program. */
static inline ctpu_program *run_prog(const flush_ctx *f) { return f->bound ? f->bound : f->prog; }

/* Where the trace was cut: a host read is numbered as an op (the read
 * itself, in the label open at it); any other cut, after the last recorded op. */
static ctpu_op_prov cut_at(const flush_ctx *f)
{
    const ctpu_thread_state *ts = ctpu_ts_current();
    if (f->why == CTPU_CUT_HOST_READ && ts) {
        int d = ts->label.depth;
        return (ctpu_op_prov){ ts->label.op_no, d ? ts->label.stack[d - 1] : 0, ts->label.call };
    }
    int n = ctpu_trace_rec_nodes(t_df.rec);
    const ctpu_op_prov *rp = ctpu_trace_rec_prov(t_df.rec);
    return n > 0 && rp ? rp[n - 1] : (ctpu_op_prov){ 0, 0, 0 };
}

/* Per dim of the canonical inputs of t (plan order), the extent a
 * ctpu_mark_dynamic range pads it to (coef x hi), for the shape policies'
 * pad_to_max; 0 where there is no mark, and for automatic dims and marks
 * without an upper bound (hi 2^31-1: the largest extent seen stands). NULL
 * when nothing is marked (free() it). */
static int64_t *mark_bounds(const ctpu_launch_plan *pl, const ctpu_trace *t)
{
    if (!t_df.any_dyn || !pl || !t || pl->n_in != t->n_inputs) return NULL;
    size_t n = 0, k = 0;
    for (int i = 0; i < t->n_inputs; i++) n += (size_t)t->in_type[i].ndim;
    int64_t *b = calloc(n + 1, sizeof *b);
    for (int i = 0; b && i < t->n_inputs; i++) {
        int32_t rec = pl->in_src[i];
        const ctpu_dyndim *dd = rec >= 0 && (size_t)rec < t_df.cap_in_dyn && t_df.in_has_dyn[rec] ? t_df.in_dyn[rec] : NULL;
        for (int d = 0; d < t->in_type[i].ndim; d++, k++)
            if (dd && dd[d].coef > 0 && dd[d].hi < 2147483647) b[k] = dd[d].coef * dd[d].hi;
    }
    return b;
}

/* Key -> fused cache; a miss is compiled here (or waited for, if another
 * thread is compiling the same key). A trace with dynamic dims: its exact
 * static entry first, then the dynamic key (bound to this trace's extents
 * on a hit). */
static ctpu_status lookup_or_compile(flush_ctx *f)
{
    ctpu_runtime *rt = f->rt;
    size_t klen = 0, dlen = 0;
    const uint8_t *key;
    uint64_t khash = 0;
    if (!raw_key(f->reqs, f->nreq, f->dbg, &key, &klen, &khash))
        return flush_fail(CTPU_ERR_OOM, "mark_step: out of host memory keying the trace", f->reqs, f->rrec);
    uint64_t step = atomic_load(&rt->marked_steps);
    f->step = step;
    bool only = atomic_load(&rt->cache_only) ||
                (rt->cache_only_after >= 0 && step >= (uint64_t)rt->cache_only_after);
    ctpu_cache_opts opts = { .allow_compile = !only, .track_recompiles = true, .step = step, .dev = rt->dev };
    ctpu_cache_pending *miss = NULL;
    f->key = key;
    f->klen = klen;
    f->khash = khash;
    /* marked: the exact static entry, then a launch bound for this very
     * trace before, then the dynamic key */
    f->prog = t_df.any_dyn ? ctpu_cache_peek_hashed(rt->fused_cache, key, klen, khash, &opts, &f->res, &f->plan) : NULL;
    bool any_sym = false;
    f->dyn_why[0] = 0;
    f->dyn_why_rec = -1;
    uint8_t *dkey = t_df.any_dyn && !f->prog && !alias_dynamic(f, &opts)
                        ? dyn_key(f->reqs, f->nreq, f->dbg, &dlen, &any_sym, f->dyn_why, sizeof f->dyn_why,
                                  &f->dyn_why_rec)
                        : NULL;
    if (dkey && any_sym) {
        f->dynamic = true;
        f->prog = ctpu_cache_find(rt->fused_cache, dkey, dlen, &opts, &f->res, &f->plan, &miss, f->err, sizeof f->err);
        if (f->prog && f->prog->dyn && !bind_dynamic(f)) {   /* its groups do not hold here: a static program */
            ctpu_cache_release(rt->fused_cache, f->prog);
            f->prog = NULL;
            f->dynamic = false;
            snprintf(f->dyn_why, sizeof f->dyn_why, "%.150s", f->err);
            f->dyn_why_rec = -1;
            f->err[0] = 0;
        }
    }
    if (!f->prog && !miss)
        f->prog = ctpu_cache_find_hashed(rt->fused_cache, key, klen, khash, &opts, &f->res, &f->plan, &miss, f->err,
                                         sizeof f->err);
    free(dkey);
    ctpu_trace_final fin;
    bool have_fin = miss && compile_miss(f, miss, &opts, &fin);
    f->key = NULL;
    const ctpu_trace *rt_t = have_fin ? &fin.t : f->bound ? f->bound->bound_trace : NULL;
    int64_t *bound = mark_bounds(have_fin && fin.plan ? fin.plan : f->plan, rt_t);
    ctpu__report_cut(f->why, cut_at(f), rt_t, bound, &f->res, f->prog ? run_prog(f) : NULL);   /* report.c: programs, cuts, trace */
    if (have_fin && f->op_by_op) ctpu__report_fallback(&fin.t, bound);   /* report.c: the shape policies */
    free(bound);
    if (rt->auto_dynamic && (have_fin || f->prog)) {
        const ctpu_launch_plan *pl = have_fin && fin.plan ? fin.plan : f->plan;
        uint64_t sh = have_fin ? ctpu_trace_struct_hash(&fin.t) : amap_get(f->res.program_id);
        if (have_fin && f->prog) amap_put(f->res.program_id, sh);
        amem_update(sh, have_fin ? &fin : NULL, pl);
    }
    if (have_fin) ctpu_trace_final_free(&fin);
    count_lookup(f);
    if (f->op_by_op) {
        ctpu_counter_add(&rt->metrics, CTPU_CTR_RECOMPILE_LIMIT_FALLBACKS, 1);
        return CTPU_OK;
    }
    if (!f->prog) {
        char msg[520], diff[200] = "";
        if (f->res.refused && ctpu_trace_finalize(t_df.rec, f->reqs, f->nreq, 0, (uint8_t)f->dbg, &fin)) {
            /* what changed: the error says it, as a recompile reason would */
            ctpu_diff_names dn;
            diff_names_make(&fin, &dn);
            ctpu_cache_describe_miss(rt->fused_cache, &fin.t, &dn, diff, sizeof diff);
            free_diff_names(&dn);
            ctpu_trace_final_free(&fin);
        }
        snprintf(msg, sizeof msg, "defer and fuse: %.300s%s%s", f->err, diff[0] ? ": " : "", diff);
        return flush_fail(f->res.refused ? CTPU_ERR_CACHE_MISS : CTPU_ERR_STATE, msg, f->reqs, f->rrec);
    }
    return CTPU_OK;
}

/* Output j did not fit: f->err gets the op that made its value (and the
 * value's name and type) in front of the allocator's message e. */
static void oom_names_value(flush_ctx *f, int j, const char *e)
{
    const ctpu_trec *r = NULL;
    int v = -1;
    for (int q = 0; q < f->nreq && !r; q++)
        if (f->plan->req_out[q] == j) { r = f->rrec[q]; v = f->reqs[q].v; }
    if (!r) {
        snprintf(f->err, sizeof f->err, "output %d: %s", j, e);
        return;
    }
    /* "the value of exp (op #2, \"act\"; x), f32[200000]: ...": the op
     * and label of this recording that made it, the tensor's name */
    char tb[96], pv[112] = "";
    const ctpu_op_prov *rp = ctpu_trace_rec_prov(t_df.rec);
    if (rp && v >= 0) ctpu__prov_text(rp[v], pv, sizeof pv);
    const char *nm = ctpu_rec_name(r);
    bool paren = nm[0] || pv[0];
    snprintf(f->err, sizeof f->err, "the value of %s%s%s%s%.48s%s, %s: %s", r->made_by ? r->made_by : "assign",
             paren ? " (" : "", pv, pv[0] && nm[0] ? "; " : "", nm, paren ? ")" : "",
             ctpu_fmt_type(&r->type, tb, sizeof tb), e);
}

/* ", ops #3 to #9": the op numbers of this recording the program runs */
static void scratch_span(const flush_ctx *f, char *buf, size_t len)
{
    const ctpu_op_prov *rp = ctpu_trace_rec_prov(t_df.rec);
    uint32_t lo = 0, hi = 0;
    for (int k = 0; rp && k < f->plan->n_nodes; k++) {
        uint32_t n = rp[f->plan->node_src[k]].op_no;
        if (n && (!lo || n < lo)) lo = n;
        if (n > hi) hi = n;
    }
    if (lo) snprintf(buf, len, ", ops #%u to #%u", lo, hi);
}

/* Output buffers: the parameter's own (in place) or fresh ones. */
static ctpu_status alloc_outputs(flush_ctx *f)
{
    const ctpu_launch_plan *pl = f->plan;
    for (int j = 0; j < pl->n_out; j++) {
        int q = pl->alias_req[j];
        if (q >= 0) {
            f->outb[j] = f->reqs[q].alias_buf;
            f->outo[j] = f->reqs[q].alias_off;
            ctpu_buffer_retain(f->outb[j]);
            continue;
        }
        f->outo[j] = 0;
        char e[256];
        f->outb[j] = ctpu_buffer_alloc(f->rt->dev, f->out_bytes ? f->out_bytes[j] : pl->out_bytes[j], e, sizeof e);
        if (!f->outb[j]) {
            oom_names_value(f, j, e);
            return CTPU_ERR_OOM;
        }
    }
    if (run_prog(f)->prog.n_virtual > 0) {
        char e[256];
        f->scratch = ctpu_buffer_alloc(f->rt->dev, run_prog(f)->prog.scratch_bytes, e, sizeof e);
        if (!f->scratch) {
            char sp[64] = "";
            scratch_span(f, sp, sizeof sp);
            snprintf(f->err, sizeof f->err, "its scratch (the values that live only inside it%s): %s", sp, e);
            return CTPU_ERR_OOM;
        }
    }
    return CTPU_OK;
}

/* Each step's op number and label, from this recording (never from the
 * step that compiled the program), then the program's first and last ops
 * (the trace file's device slice). Out of host memory: none. */
static void bind_prov(flush_ctx *f, ctpu_cmd *cmd)
{
    const ctpu_program *pg = run_prog(f);      /* a dynamic program's launch has its own steps */
    const ctpu_op_prov *rp = ctpu_trace_rec_prov(t_df.rec);
    int ns = pg->prog.n_steps, nn = f->plan->n_nodes;
    if (!pg->step_node || ns < 1 || nn < 1) return;
    ctpu_op_prov *p = malloc(sizeof *p * ((size_t)ns + 2));
    if (!p) return;
    for (int s = 0; s < ns; s++) p[s] = rp[f->plan->node_src[pg->step_node[s]]];
    p[ns] = p[ns + 1] = rp[f->plan->node_src[0]];
    /* a program of every recorded node: the span the recorder kept */
    if (nn == ctpu_trace_rec_nodes(t_df.rec) && ctpu_trace_rec_prov_span(t_df.rec, &p[ns], &p[ns + 1])) nn = 0;
    for (int k = 0; k < nn; k++) {
        ctpu_op_prov q = rp[f->plan->node_src[k]];
        if (q.op_no && (q.op_no < p[ns].op_no || !p[ns].op_no)) p[ns] = q;
        if (q.op_no > p[ns + 1].op_no) p[ns + 1] = q;
    }
    cmd->prov = p;
    cmd->n_prov = ns;
    cmd->prov_span = true;
}

/* The command: inputs as recorded, outputs, scratch; the recorded scalars. */
static ctpu_status bind_buffers(flush_ctx *f)
{
    const ctpu_launch_plan *pl = f->plan;
    ctpu_cmd *cmd = &f->cmd;
    ctpu_buffer *const *ib;
    const size_t *io;
    ctpu_trace_rec_inputs(t_df.rec, &ib, &io, NULL);
    const double *rs = ctpu_trace_rec_scalars(t_df.rec);
    int nin = pl->n_in, no = pl->n_out;
    int nb = nin + no + (run_prog(f)->prog.n_virtual > 0 ? 1 : 0);
    memset(cmd, 0, sizeof *cmd);
    cmd->prog = &run_prog(f)->prog;
    cmd->n_bufs = nb;
    cmd->buf = nb <= CTPU_CMD_INLINE_BUFS ? cmd->buf_inl : calloc((size_t)nb, sizeof(ctpu_buffer *));
    cmd->off = nb <= CTPU_CMD_INLINE_BUFS ? cmd->off_inl : calloc((size_t)nb, sizeof(size_t));
    cmd->scalars = pl->n_scal <= CTPU_CMD_MAX_SCALARS ? cmd->scal_inl : malloc(sizeof(double) * (size_t)pl->n_scal);
    f->outb = calloc((size_t)no + 1, sizeof *f->outb);
    f->outo = malloc(sizeof *f->outo * ((size_t)no + 1));
    bool ok = cmd->buf && cmd->off && cmd->scalars && f->outb && f->outo;
    ctpu_status st = ok ? alloc_outputs(f) : CTPU_ERR_OOM;
    if (st != CTPU_OK) {
        for (int j = 0; f->outb && j < no; j++)
            if (f->outb[j]) ctpu_buffer_release(f->rt->dev, f->outb[j]);
        if (f->scratch) ctpu_buffer_release(f->rt->dev, f->scratch);
        if (cmd->buf != cmd->buf_inl) { free(cmd->buf); free(cmd->off); }
        if (cmd->scalars != cmd->scal_inl) free(cmd->scalars);
        free(f->outb);
        free(f->outo);
        char msg[512];
        snprintf(msg, sizeof msg, "fused program %llu: %s", (unsigned long long)f->res.program_id,
                 f->err[0] ? f->err : "out of host memory");
        ctpu_cache_release(f->rt->fused_cache, f->prog);
        ctpu_cache_release(f->rt->fused_cache, f->bound);   /* never submitted (the program keeps it) */
        free(f->out_bytes);
        return flush_fail(st, msg, f->reqs, f->rrec);
    }
    for (int k = 0; k < nin; k++) { cmd->buf[k] = ib[pl->in_src[k]]; cmd->off[k] = io[pl->in_src[k]]; }
    for (int j = 0; j < no; j++) { cmd->buf[nin + j] = f->outb[j]; cmd->off[nin + j] = f->outo[j]; }
    if (f->scratch) { cmd->buf[nb - 1] = f->scratch; cmd->off[nb - 1] = 0; }
    if (pl->scal_ident) { if (pl->n_scal) memcpy(cmd->scalars, rs, sizeof(double) * (size_t)pl->n_scal); }   /* (no scalars: rs may be NULL) */
    else for (int i = 0; i < pl->n_scal; i++) cmd->scalars[i] = rs[pl->scal_src[i]];
    cmd->debug_checks = f->dbg;
    cmd->program_id = f->res.program_id;
    bind_prov(f, cmd);
    return CTPU_OK;
}

/* Launch, then give every live pending handle its value's buffer. */
static void publish(flush_ctx *f)
{
    ctpu_runtime *rt = f->rt;
    ctpu_metrics *m = &rt->metrics;
    if (!f->op_by_op) {
        ctpu_op_prov *cap_prov = NULL;   /* a capture's copy of the launch's provenance, for its replays */
        size_t n_cap_prov = (size_t)f->cmd.n_prov + (f->cmd.prov_span ? 2 : 0);
        if (f->sink && f->cmd.n_prov > 0 && (cap_prov = malloc(sizeof *cap_prov * n_cap_prov)))
            memcpy(cap_prov, f->cmd.prov, sizeof *cap_prov * n_cap_prov);
        uint64_t seq = ctpu_device_submit(rt->dev, &f->cmd);   /* the command owns heap arrays now */
        ctpu_program_note_submit(f->prog, seq);
        ctpu_program *run_keep = NULL;   /* a capture's bound launch, held until its sink took its own ref */
        if (f->bound) {   /* the dynamic program keeps its bound launch (fuse.h ctpu_fuse_bind_cached) */
            ctpu_program_note_submit(f->bound, seq);
            if (f->sink) { ctpu_program_retain(f->bound); run_keep = f->bound; }
            ctpu_cache_release(rt->fused_cache, f->bound);
            f->bound = NULL;
        }
        ctpu_counter_add(m, CTPU_CTR_PROGRAMS_LAUNCHED, 1);
        ctpu_counter_add(m, CTPU_CTR_FUSED_STEPS, f->prog->prog.n_steps);
        if (f->sink) {                        /* before the handles change: owners still hold the inputs */
            ctpu_capture_sink cs = { .program_id = f->res.program_id, .prog = f->prog, .plan = f->plan,
                                     .nreq = f->nreq, .reqs = f->reqs, .rrec = f->rrec, .rh = f->rh,
                                     .run = run_keep, .out_bytes = f->out_bytes,
                                     .prov = cap_prov, .n_prov = cap_prov ? f->cmd.n_prov : 0,
                                     .prov_span = cap_prov && f->cmd.prov_span };
            cs.n_rin = ctpu_trace_rec_inputs(t_df.rec, &cs.rin_buf, &cs.rin_off, &cs.rin_type);
            cs.rscal = ctpu_trace_rec_scalars(t_df.rec);
            cs.n_rscal = ctpu_trace_rec_n_scalars(t_df.rec);
            ctpu__capture_sink(&cs);   /* takes cap_prov */
            cap_prov = NULL;
        }
        free(cap_prov);
        if (run_keep) ctpu_cache_release(rt->fused_cache, run_keep);
    }
    t_df.n_made = 0;
    t_df.last_program = f->res.program_id;
    t_df.last_step = f->step;
    {
        ctpu_buffer *const *ib;
        const size_t *io;
        t_df.last_had_inputs = ctpu_trace_rec_inputs(t_df.rec, &ib, &io, NULL) > 0;
    }
    if (t_df.cap_made < (size_t)f->nreq) {
        struct ctpu_made *nm = realloc(t_df.made, sizeof *nm * (size_t)f->nreq);
        if (nm) { t_df.made = nm; t_df.cap_made = (size_t)f->nreq; }
    }
    for (int q = 0; q < f->nreq; q++) {
        ctpu_trec *r = f->rrec[q];
        int o = f->plan->req_out[q];
        ctpu_buffer *b = f->outb[o];
        r->trace_id = 0;
        if (r->buf != b && t_df.n_made < t_df.cap_made) {
            struct ctpu_made *md = &t_df.made[t_df.n_made++];
            md->buf = b;
            md->serial = b->serial;
            md->op = r->made_by;
            /* a bounded copy, not snprintf: this runs for every live-out of every flush */
            const char *nm = r->name ? r->name : "";
            size_t len = strnlen(nm, sizeof md->name - 1);
            memcpy(md->name, nm, len);
            md->name[len] = 0;
        }
        r->made_by = NULL;
        if (r->buf == b) {
            ctpu_counter_add(m, CTPU_CTR_ASSIGN_IN_PLACE, 1);
            continue;
        }
        if (r->buf) {
            ctpu_buffer_bind_touch(r->buf);
            ctpu_counter_add(m, CTPU_CTR_ASSIGN_COPY, 1);
            atomic_fetch_sub(&r->buf->handle_refs, 1);
            ctpu_buffer_release(rt->dev, r->buf);
        }
        ctpu_buffer_retain(b);
        atomic_fetch_add(&b->handle_refs, 1);
        r->buf = b;
        r->off = f->outo[o];
        ctpu__name_buffer(r, b);
    }
    /* our own refs: the command and the handles hold theirs */
    for (int j = 0; j < f->plan->n_out; j++) ctpu_buffer_release(rt->dev, f->outb[j]);
    f->plan = NULL;
    /* the plan lives with the program: release our reference only after its
     * last read above (the command holds the program until it has run; once
     * it has, the cache may free an evicted one at any time) */
    if (f->prog) ctpu_cache_release(rt->fused_cache, f->prog);
    f->prog = NULL;
    if (f->scratch) ctpu_buffer_release(rt->dev, f->scratch);
    free(f->out_bytes);
    free(f->outb);
    free(f->outo);
    free(f->reqs);
    free(f->rrec);
    free(f->rh);
    reset_trace();
}

/* ------------------------------------------------------------ past the recompile limit */
/* The recorded trace, node by node, through strict eager's program table
 * (ctpu__strict_launch): only the nodes a live-out needs, each value's
 * buffer released after its last read; the same kernels, so the same bits.
 * Then publish gives the live handles their buffers (a one-to-one plan). */
typedef struct {
    ctpu_buffer **buf;             /* [n] node outputs (our refs), NULL: not computed or released */
    int *last;                     /* [n] the last node reading it, or n: a live-out */
    bool *need;                    /* [n] */
    int32_t *req_out;              /* [nreq] identity: request q is output q */
    ctpu_launch_plan plan;
} obo_ctx;

static void obo_free(obo_ctx *o, int n, ctpu_device *dev)
{
    for (int i = 0; o->buf && i < n; i++)
        if (o->buf[i]) ctpu_buffer_release(dev, o->buf[i]);
    free(o->buf);
    free(o->last);
    free(o->need);
    free(o->req_out);
}

/* need[] (a live-out reads it, directly or not) and last[] (its last reader). */
static void obo_plan(flush_ctx *f, obo_ctx *o, int n)
{
    for (int q = 0; q < f->nreq; q++)
        if (f->reqs[q].v >= 0) { o->need[f->reqs[q].v] = true; o->last[f->reqs[q].v] = n; }
    for (int i = n - 1; i >= 0; i--) {
        const double *sc;
        const ctpu_node *nd = ctpu_trace_rec_node_at(t_df.rec, i, &sc);
        if (!o->need[i]) continue;
        for (int k = 0; k < nd->n_in; k++) {
            int v = nd->in[k];
            if (v < 0) continue;
            o->need[v] = true;
            if (o->last[v] < i) o->last[v] = i;
        }
    }
}

/* Run node i: its inputs from the recorded inputs or earlier nodes. */
static ctpu_status obo_node(flush_ctx *f, obo_ctx *o, int i)
{
    ctpu_buffer *const *ib;
    const size_t *io;
    const ctpu_vtype *it;
    ctpu_trace_rec_inputs(t_df.rec, &ib, &io, &it);
    const double *sc, *vs;
    ctpu_node nd = *ctpu_trace_rec_node_at(t_df.rec, i, &sc);
    ctpu_vtype ty[CTPU_NODE_MAX_IN];
    ctpu_buffer *bf[CTPU_NODE_MAX_IN];
    size_t of[CTPU_NODE_MAX_IN];
    for (int k = 0; k < nd.n_in; k++) {
        int v = nd.in[k];
        if (v < 0) { ty[k] = it[-v - 1]; bf[k] = ib[-v - 1]; of[k] = io[-v - 1]; }
        else { ty[k] = ctpu_trace_rec_node_at(t_df.rec, v, &vs)->out; bf[k] = o->buf[v]; of[k] = 0; }
    }
    char e[256];
    size_t bytes = (size_t)ctpu_vtype_numel(&nd.out) * ctpu_kdt_size(nd.out.dtype);
    o->buf[i] = ctpu_buffer_alloc(f->rt->dev, bytes, e, sizeof e);
    if (!o->buf[i]) {
        char tb[96], pv[112];
        ctpu__prov_text(ctpu_trace_rec_prov(t_df.rec)[i], pv, sizeof pv);
        ctpu_set_error(CTPU_ERR_OOM, "%s%s%s%s: output %s: %s", ctpu_op_name(nd.op), pv[0] ? " (" : "", pv,
                       pv[0] ? ")" : "", ctpu_fmt_type(&nd.out, tb, sizeof tb), e);
        return CTPU_ERR_OOM;
    }
    const ctpu_vtype *tp[CTPU_NODE_MAX_IN];
    for (int k = 0; k < nd.n_in; k++) tp[k] = &ty[k];
    ctpu_status st = ctpu__strict_launch(&nd, NULL, tp, bf, of, sc, o->buf[i], 0, ctpu_trace_rec_prov(t_df.rec)[i]);
    if (st != CTPU_OK) return st;
    const ctpu_node *rn = ctpu_trace_rec_node_at(t_df.rec, i, &sc);
    for (int k = 0; k < rn->n_in; k++) {
        int v = rn->in[k];
        if (v >= 0 && o->last[v] == i && o->buf[v]) {
            ctpu_buffer_release(f->rt->dev, o->buf[v]);
            o->buf[v] = NULL;
        }
    }
    return CTPU_OK;
}

static ctpu_status run_op_by_op(flush_ctx *f)
{
    int n = ctpu_trace_rec_nodes(t_df.rec);
    obo_ctx o = { .buf = calloc((size_t)n + 1, sizeof *o.buf), .last = calloc((size_t)n + 1, sizeof *o.last),
                  .need = calloc((size_t)n + 1, sizeof *o.need),
                  .req_out = malloc(sizeof *o.req_out * ((size_t)f->nreq + 1)) };
    f->outb = calloc((size_t)f->nreq + 1, sizeof *f->outb);
    f->outo = calloc((size_t)f->nreq + 1, sizeof *f->outo);
    ctpu_status st = o.buf && o.last && o.need && o.req_out && f->outb && f->outo ? CTPU_OK : CTPU_ERR_OOM;
    if (st == CTPU_ERR_OOM) ctpu_set_error(st, "mark_step: out of host memory running a trace op by op");
    if (st == CTPU_OK) obo_plan(f, &o, n);
    for (int i = 0; st == CTPU_OK && i < n; i++)
        if (o.need[i]) st = obo_node(f, &o, i);
    if (st != CTPU_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ctpu_last_error());
        obo_free(&o, n, f->rt->dev);
        free(f->outb);
        free(f->outo);
        return flush_fail(st, msg, f->reqs, f->rrec);
    }
    ctpu_buffer *const *ib;
    const size_t *io;
    ctpu_trace_rec_inputs(t_df.rec, &ib, &io, NULL);
    for (int q = 0; q < f->nreq; q++) {
        int v = f->reqs[q].v;
        f->outb[q] = v < 0 ? ib[-v - 1] : o.buf[v];
        f->outo[q] = v < 0 ? io[-v - 1] : 0;
        ctpu_buffer_retain(f->outb[q]);     /* publish lets go of one per output */
        o.req_out[q] = q;
    }
    o.plan = (ctpu_launch_plan){ .n_out = f->nreq, .n_req = f->nreq, .req_out = o.req_out };
    f->plan = &o.plan;
    publish(f);
    obo_free(&o, n, f->rt->dev);
    return CTPU_OK;
}

static ctpu_status flush(ctpu_cut_reason why, bool sink)
{
    ctpu_runtime *rt = ctpu_rt;
    if (!ctpu_ts_current() || !t_df.rec) return CTPU_OK;
    if (ctpu_trace_rec_nodes(t_df.rec) == 0) { reset_trace(); return CTPU_OK; }
    if (!sink && ctpu__capturing()) ctpu__capture_cut(why);   /* a graph break */
    ctpu_counter_add(&rt->metrics, CTPU_CTR_TRACE_CUTS, 1);
    ctpu_counter_add(&rt->metrics, cut_counter[why], 1);

    flush_ctx f = { .rt = rt, .why = why, .dbg = ctpu_debug_checks_now(), .sink = sink };
    if (!collect_live_outs(&f)) {
        free(f.rh);
        return flush_fail(CTPU_ERR_OOM, "mark_step: out of host memory at a trace cut", f.reqs, f.rrec);
    }
    if (f.nreq == 0) {                       /* nothing alive needs computing */
        free(f.reqs);
        free(f.rrec);
        free(f.rh);
        reset_trace();
        return CTPU_OK;
    }
    f.step = atomic_load(&rt->marked_steps);
    if (why == CTPU_CUT_MARK_STEP && !sink) note_held(&f);
    ctpu_status st = lookup_or_compile(&f);
    if (st == CTPU_OK && f.op_by_op) return run_op_by_op(&f);   /* it publishes */
    if (st == CTPU_OK) st = bind_buffers(&f);
    if (st == CTPU_OK) publish(&f);
    else free(f.rh);
    return st;
}

ctpu_status ctpu__defer_flush(ctpu_cut_reason why) { return flush(why, false); }

ctpu_status ctpu__defer_flush_capture(void) { return flush(CTPU_CUT_MARK_STEP, true); }

bool ctpu__defer_has_nodes(void)
{
    return ctpu_ts_current() && t_df.rec && ctpu_trace_rec_nodes(t_df.rec) > 0;
}

void ctpu__defer_abandon(void)
{
    if (!ctpu_ts_current() || !t_df.rec) return;
    ctpu_bind_bump();
    /* a tensor assigned in the trace keeps its storage, which still holds
     * its old value: it is simply not pending any more */
    for (size_t i = 0; i < t_df.n_holders; i++) {
        ctpu_tensor h = { t_df.holders[i] };
        ctpu_trec *r = ctpu_slot(ctpu_handle_slot(h));
        if (r->live && r->gen == ctpu_handle_gen(h) && r->trace_id == t_df.id && r->buf) {
            r->trace_id = 0;
            r->made_by = NULL;
        }
    }
    poison_holders(CTPU_ERR_STATE, "compiled step: the value was made by a call that stopped at a graph break");
    reset_trace();
}

/* ------------------------------------------------------------ public: cache */
ctpu_status ctpu_cache_get_info(ctpu_cache_info *out)
{
    if (!ctpu_check_init("cache_get_info")) return CTPU_ERR_NOT_INITIALIZED;
    if (!out) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "cache_get_info: out is NULL");
        return CTPU_ERR_INVALID_ARG;
    }
    ctpu_cache_stats st;
    ctpu_cache_get_stats(ctpu_rt->fused_cache, &st);
    *out = (ctpu_cache_info){ st.requests, st.hits, st.misses, st.compiles, st.recompiles, st.evictions,
                              st.thrash, st.entries, st.capacity };
    return CTPU_OK;
}

ctpu_status ctpu_cache_set_only(bool on)
{
    if (!ctpu_check_init("cache_set_only")) return CTPU_ERR_NOT_INITIALIZED;
    atomic_store(&ctpu_rt->cache_only, on);
    return CTPU_OK;
}

int ctpu_cache_recompile_log(char *buf, size_t len)
{
    if (!ctpu_check_init("cache_recompile_log")) return -1;
    if (!buf && len) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "cache_recompile_log: buf is NULL with len %zu", len);
        return -1;
    }
    ctpu_recompile_rec recs[64];
    size_t n = ctpu_cache_recompiles(ctpu_rt->fused_cache, recs, 64);
    size_t k = 0;
    if (len) buf[0] = 0;
    for (size_t i = 0; i < n && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, "step %llu: program %llu -> %llu: %s\n",
                              (unsigned long long)recs[i].step, (unsigned long long)recs[i].old_program,
                              (unsigned long long)recs[i].new_program, recs[i].reason);
    return (int)n;
}

ctpu_cache *ctpu__test_fused_cache(void) { return ctpu_rt ? ctpu_rt->fused_cache : NULL; }
