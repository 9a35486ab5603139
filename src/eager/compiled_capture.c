/* Compiled steps: the capture hooks (what fn does that a replay must redo
 * or that breaks the graph) and the sink that builds a version from the
 * flushed trace (compiled.c has the overview). */
#include "compiled_int.h"

/* ------------------------------------------------------------ capture hooks */

/* Where a graph break is, in issue 11's numbering (ops numbered from 1 in
 * each step, in dispatch order, and the innermost ctpu_label_push label):
 * a host read, a collective or the op past the capture's length limit is
 * itself numbered (the number it takes next); a mode change, a nested
 * compiled call or another cut comes after the op numbered last. */
static void break_where(int why, char *buf, size_t len)
{
    const ctpu_thread_state *s = ctpu__ts;
    bool is_op = why == CTPU_CUT_HOST_READ || why == CTPU_CUT_COLLECTIVE || why == CTPU_CUT_LIMIT;
    uint32_t no = s->label.op_no + (is_op ? 1 : 0);
    int d = s->label.depth;
    const char *l = d ? ctpu_device_label(ctpu_rt->dev, s->label.stack[d - 1]) : NULL;
    snprintf(buf, len, "%s op #%u%s%.64s%s", is_op ? "at" : "after", no, l ? ", \"" : "", l ? l : "", l ? "\"" : "");
}

bool ctpu__capture_break(int why, const char *what)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap || cap->in_final) return true;
    const char *hr = ctpu__ts->label.host_read;
    char where[96], reason[192];
    break_where(why, where, sizeof where);
    snprintf(reason, sizeof reason, "graph break (%.64s): %.80s%s%.24s", where, what, hr[0] && why == CTPU_CUT_HOST_READ ? " at " : "",
             why == CTPU_CUT_HOST_READ ? hr : "");
    if (cap->c->fullgraph) {
        if (!cap->refused) snprintf(cap->reason, sizeof cap->reason, "%s", reason);
        cap->refused = cap->broken = true;
        ctpu_set_error(CTPU_ERR_STATE, "compiled step %s: fullgraph: %s", step_name(cap->c), reason);
        return false;
    }
    if (!cap->broken) snprintf(cap->reason, sizeof cap->reason, "%s", reason);
    cap->broken = true;
    return true;
}

bool ctpu__capture_host_effect(const char *what)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap || cap->in_final) return true;
    return ctpu__capture_break(CTPU_CUT_MODE, what);
}

/* A graph break for what fn did to r, a tensor made before the call (its
 * scope is older than the call's, or global); fn's own tensors are free. */
static bool pre_call_break(const ctpu_trec *r, const char *what, const char *prefix)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap || cap->in_final || (r->scope_id != 0 && r->scope_id >= cap->scope_floor)) return true;
    char buf[96];   /* (a break's reason keeps 80 bytes of it) */
    const char *nm = ctpu_rec_name(r);
    snprintf(buf, sizeof buf, "%s%s%.28s", what, nm[0] ? prefix : "", nm);
    return ctpu__capture_break(CTPU_CUT_MODE, buf);
}

bool ctpu__capture_note_release(const ctpu_trec *r)
{
    return pre_call_break(r, "release of a tensor made before the call", ": ");
}

bool ctpu__capture_note_requires_grad(const ctpu_trec *r)
{
    return pre_call_break(r, "set_requires_grad of a tensor made before the call", " ");
}

bool ctpu__capture_note_history(const ctpu_trec *r)
{
    return pre_call_break(r, "assign with grad on: autograd history for a tensor made before the call", " ");
}

void ctpu__capture_cut(int why)
{
    static const char *const names[CTPU_CUT_COUNT] = { "mark_step", "host read", "sync", "loop", "trace length limit",
                                                       "mode change", "collective" };
    struct ctpu_capture *cap = cap_now();
    if (!cap || cap->in_final || cap->broken) return;
    char what[64];
    snprintf(what, sizeof what, "a trace cut (%s)", why >= 0 && why < CTPU_CUT_COUNT ? names[why] : "?");
    if (!ctpu__capture_break(why, what)) {
        /* the cut happens anyway (it was not asked for: a limit, a collective) */
        cap->broken = true;
    }
}

void ctpu__capture_note_take(uint64_t n, uint64_t seed, uint64_t offset)
{
    struct ctpu_capture *cap = cap_now();
    rng_note r = { -1, -1, n, seed, offset };
    if (cap && !push((void **)&cap->rng, &cap->n_rng, &cap->cap_rng, sizeof r, &r))
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

void ctpu__capture_note_rng(int s, const double *sc)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap) return;
    uint64_t seed = ctpu_scalar_bits(sc[0]), off = ctpu_scalar_bits(sc[1]);
    for (int k = cap->n_rng - 1; k >= 0; k--) {
        rng_note *d = &cap->rng[k];
        if (d->alias >= 0 || d->seed != seed || d->off != off) continue;
        if (d->s < 0) { d->s = s; return; }   /* the draw's own op */
        rng_note r = { s, k, 0, seed, off };  /* another op reads the same draw */
        if (!push((void **)&cap->rng, &cap->n_rng, &cap->cap_rng, sizeof r, &r))
            snprintf(cap->fail, sizeof cap->fail, "out of host memory");
        return;
    }
    /* a draw before the capture (SDPA's backward of a forward outside it):
     * its seed and offset stay the values it was given */
}

static bool contains(const uint64_t *a, int n, uint64_t x);

void ctpu__capture_note_assign(uint64_t h)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap) return;
    /* a tensor fn made (from host data, a view of an input or of an older
     * tensor) is fn's own value, not a tensor each replay writes: noted
     * apart, so that its assign is never in place (its old storage is what
     * the next replay reads) and out[j] is a new tensor at every call */
    const ctpu_trec *r = live_rec(h);
    bool own = r && r->scope_id != 0 && r->scope_id >= cap->scope_floor;
    bool ok = own ? push((void **)&cap->fn_assigned, &cap->n_fn_assigned, &cap->cap_fn_assigned, sizeof h, &h)
                  : push((void **)&cap->assigned, &cap->n_assigned, &cap->cap_assigned, sizeof h, &h);
    if (!ok) snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

bool ctpu__capture_fn_assigned(uint64_t h)
{
    const struct ctpu_capture *cap = cap_now();
    return cap && contains(cap->fn_assigned, cap->n_fn_assigned, h);
}

void ctpu__capture_note_int(int s)
{
    struct ctpu_capture *cap = cap_now();
    uint64_t b = (uint64_t)s;
    if (cap && !push((void **)&cap->ints, &cap->n_ints, &cap->cap_ints, sizeof b, &b))
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

void ctpu__capture_note_zero_grad(uint64_t leaf)
{
    struct ctpu_capture *cap = cap_now();
    if (cap && !push((void **)&cap->zeroed, &cap->n_zeroed, &cap->cap_zeroed, sizeof leaf, &leaf))
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

void ctpu__capture_note_released(uint64_t seq)
{
    struct ctpu_capture *cap = cap_now();
    if (cap && seq < cap->ag_seq0) cap->hist_released = true;
}

void ctpu__capture_note_grad(uint64_t leaf, uint64_t g)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap) return;
    grad_note n = { leaf, g, false };
    for (int i = 0; i < cap->n_zeroed; i++) n.zeroed |= cap->zeroed[i] == leaf;
    if (!push((void **)&cap->grads, &cap->n_grads, &cap->cap_grads, sizeof n, &n))
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

/* t, read by fn during this capture, is a tensor made before the call
 * that is not one of its inputs (an input's .grad and kind are guarded by
 * position; fn's own tensors are fn's): the one a read notes, or NULL. */
static struct ctpu_capture *older_read(uint64_t t)
{
    struct ctpu_capture *cap = cap_now();
    if (!cap || cap->in_final) return NULL;
    const ctpu_trec *r = live_rec(t);
    if (!r || (r->scope_id != 0 && r->scope_id >= cap->scope_floor)) return NULL;
    for (int i = 0; i < cap->n_in; i++)
        if (cap->inrec[i] == r) return NULL;
    return cap;
}

void ctpu__capture_note_grad_read(uint64_t leaf, bool has)
{
    struct ctpu_capture *cap = older_read(leaf);
    if (!cap) return;
    for (int i = 0; i < cap->n_zeroed; i++)
        if (cap->zeroed[i] == leaf) return;   /* fn dropped it first: not the call's start */
    for (int i = 0; i < cap->n_grads; i++)
        if (cap->grads[i].leaf == leaf) return;   /* fn's backward made it */
    for (int i = 0; i < cap->n_gread; i++)
        if (cap->gread[i].leaf == leaf) return;
    grad_note n = { leaf, has, false };
    if (!push((void **)&cap->gread, &cap->n_gread, &cap->cap_gread, sizeof n, &n))
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

void ctpu__capture_note_kind_read(uint64_t t, int kind)
{
    struct ctpu_capture *cap = older_read(t);
    if (!cap) return;
    for (int i = 0; i < cap->n_grads; i++)
        if (cap->grads[i].g == t) return;   /* a .grad fn's backward made (in no scope) */
    for (int i = 0; i < cap->n_kread; i++)
        if (cap->kread[i].leaf == t) return;
    grad_note n = { t, (uint64_t)kind, false };
    if (!push((void **)&cap->kread, &cap->n_kread, &cap->cap_kread, sizeof n, &n))
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
}

/* ------------------------------------------------------------ the sink: building a version */
typedef struct {
    struct ctpu_capture *cap;
    const ctpu_capture_sink *s;
    version *v;
    in_src *rsrc;                  /* [n_rin] per recorded input */
    bool *resolved;
    uint64_t *vowner;              /* [n_out] older tensors out[j] views and the step does not read: rows */
    int n_vowner;
} build_ctx;

/* out[j] of this capture is a handle fn made (an output kept from fn's
 * scope: at the sink, its only handles still live besides older ones). */
static bool fn_made(const struct ctpu_capture *cap, uint64_t id)
{
    for (int j = 0; cap->fn_made && j < cap->n_out; j++)
        if (cap->fn_made[j] && cap->out[j].id == id) return true;
    return false;
}

static bool contains(const uint64_t *a, int n, uint64_t x)
{
    for (int i = 0; i < n; i++)
        if (a[i] == x) return true;
    return false;
}

/* Each recorded input: in[i], an assigned tensor's own storage, or (one
 * pass over the handle table) a tensor made before the call; else a
 * constant buffer. */
static void classify_inputs(build_ctx *b)
{
    const ctpu_capture_sink *s = b->s;
    struct ctpu_capture *cap = b->cap;
    int unresolved = 0;
    for (int r = 0; r < s->n_rin; r++) {
        in_src *x = &b->rsrc[r];
        for (int i = 0; i < cap->n_in && !b->resolved[r]; i++)
            if (cap->inrec[i]->buf == s->rin_buf[r]) {
                *x = (in_src){ .kind = IN_USER, .idx = i,
                               .delta = (int64_t)s->rin_off[r] - (int64_t)cap->inrec[i]->off };
                b->resolved[r] = true;
            }
        for (int q = 0; q < s->nreq && !b->resolved[r]; q++)
            if (s->reqs[q].alias_buf == s->rin_buf[r]) {
                *x = (in_src){ .kind = IN_OWNER, .owner = s->rh[q],
                               .delta = (int64_t)s->rin_off[r] - (int64_t)s->rrec[q]->off };
                b->resolved[r] = true;
            }
        /* an assigned tensor's old storage, rebound (a view of it, such as
         * a slice, was alive): read through that tensor, not the view (the
         * view is gone by the next call) */
        for (int q = 0; q < s->nreq && !b->resolved[r]; q++)
            if (s->rrec[q] && s->rrec[q]->buf == s->rin_buf[r] && live_rec(s->rh[q]) == s->rrec[q] &&
                !contains(cap->fn_assigned, cap->n_fn_assigned, s->rh[q])) {
                *x = (in_src){ .kind = IN_OWNER, .owner = s->rh[q],
                               .delta = (int64_t)s->rin_off[r] - (int64_t)s->rrec[q]->off };
                b->resolved[r] = true;
            }
        unresolved += !b->resolved[r];
    }
    if (unresolved) {
        uint32_t n = atomic_load_explicit(&ctpu_rt->n_slots, memory_order_acquire);
        for (uint32_t idx = 0; idx < n && unresolved; idx++) {
            ctpu_trec *rec = ctpu_slot(idx);
            if (!atomic_load_explicit(&rec->live, memory_order_relaxed) || ctpu_rec_pending(rec) || !rec->buf) continue;
            uint64_t id = ((uint64_t)atomic_load_explicit(&rec->gen, memory_order_relaxed) << 32) | (idx + 1);
            if (fn_made(cap, id)) continue;   /* fn's own output (host data it made): the capture's value */
            for (int r = 0; r < s->n_rin; r++) {
                if (b->resolved[r] || s->rin_buf[r] != rec->buf) continue;
                b->rsrc[r] = (in_src){ .kind = IN_OWNER, .owner = id,
                                       .delta = (int64_t)s->rin_off[r] - (int64_t)rec->off };
                b->resolved[r] = true;
                unresolved--;
            }
        }
    }
    for (int r = 0; r < s->n_rin; r++) {
        if (b->resolved[r]) continue;
        ctpu_buffer_retain(s->rin_buf[r]);
        b->rsrc[r] = (in_src){ .kind = IN_CONST, .buf = s->rin_buf[r], .delta = (int64_t)s->rin_off[r] };
    }
}

static sc_src classify_scalar(const struct ctpu_capture *cap, int r, double val)
{
    for (int k = 0; k < cap->n_rng; k++) {
        if (cap->rng[k].s < 0) continue;
        if (r == cap->rng[k].s) return (sc_src){ .kind = SC_SEED, .idx = k };
        if (r == cap->rng[k].s + 1) return (sc_src){ .kind = SC_OFF, .idx = k };
    }
    uint64_t bits = ctpu_scalar_bits(val);
    if (contains(cap->ints, cap->n_ints, (uint64_t)r)) {
        /* an integer operand: fn converted scalars[i] to an integer (C's
         * cast truncates; an integral value is itself), so a replay gives
         * trunc(scalars[i]), never a fraction an int op could not get */
        for (int i = 0; i < cap->n_scalars; i++)
            if (ctpu_scalar_bits(trunc(cap->scalars[i]) + 0.0) == bits) {   /* (+ 0.0: trunc(-0.5) is -0, the cast 0) */
                bool amb = false;
                for (int j = i + 1; j < cap->n_scalars && !amb; j++)
                    amb = ctpu_scalar_bits(trunc(cap->scalars[j]) + 0.0) == bits;
                return (sc_src){ .kind = SC_ARG, .idx = i, .v = val, .amb = amb, .trunc = true };
            }
    }
    for (int i = 0; i < cap->n_scalars; i++)
        if (ctpu_scalar_bits(cap->scalars[i]) == bits) {
            bool amb = false;
            for (int j = i + 1; j < cap->n_scalars && !amb; j++) amb = ctpu_scalar_bits(cap->scalars[j]) == bits;
            return (sc_src){ .kind = SC_ARG, .idx = i, .v = val, .amb = amb };
        }
    return (sc_src){ .kind = SC_CONST, .v = val };
}

/* out[j] that is an assigned tensor made before the call (fn returned the
 * parameter it updates): each replay returns that handle, or the call's
 * own in[i] when it is an input, never a new handle on the program output
 * (the capture's pending handle is the tensor itself). */
static void set_returned_assigned(version *v, const struct ctpu_capture *cap, uint64_t h)
{
    for (int j = 0; j < cap->n_out; j++) {
        if (cap->out[j].id != h) continue;
        v->out_rq[j] = -1;
        v->out_fixed[j] = v->out_in[j] >= 0 ? 0 : h;
    }
}

/* The first i whose in[i] was handle h, a leaf that requires grad, at the
 * capture (its .grad is bound by position), or -1. */
static int input_leaf(const version *v, const struct ctpu_capture *cap, uint64_t h)
{
    const ctpu_trec *r = live_rec(h);
    for (int i = 0; r && i < v->n_user; i++)
        if (v->user_ag[i] == 1 && cap->inrec[i] == r) return i;
    return -1;
}

/* Each live-out request: out[j], an assigned tensor made before the call
 * (in place or rebound), or a leaf's new .grad. False (cap->fail says why)
 * for anything else: a tensor made in the step that outlives it. */
static bool classify_requests(build_ctx *b)
{
    const ctpu_capture_sink *s = b->s;
    struct ctpu_capture *cap = b->cap;
    version *v = b->v;
    for (int q = 0; q < s->nreq; q++) {
        rq_t *x = &v->rq[q];
        int o = s->plan->req_out[q];
        *x = (rq_t){ .kind = RQ_NONE, .out = o, .type = s->rrec[q]->type };
        if (o < 0) continue;
        uint64_t h = s->rh[q];
        /* a tensor made before the call that fn assigns is written through
         * (in place or rebound) even when fn also returns it: out[j] is then
         * that handle itself, as eager gives (set_returned_assigned) */
        if (contains(cap->assigned, cap->n_assigned, h)) {
            x->kind = s->plan->alias_req[o] == q ? RQ_INPLACE : RQ_REBIND;
            x->h = h;
            set_returned_assigned(v, cap, h);
            continue;
        }
        /* a .grad backward made: set at each replay, even when fn also
         * returns it (out[j] is then the leaf's .grad, as eager's) */
        for (int g = 0; g < cap->n_grads && x->kind == RQ_NONE; g++) {
            if (cap->grads[g].g != h) continue;
            x->kind = RQ_GRAD;
            x->h = cap->grads[g].leaf;
            if (cap->grads[g].zeroed) continue;
            v->no_grad_in[v->n_no_grad] = input_leaf(v, cap, x->h);
            v->no_grad_leaf[v->n_no_grad++] = x->h;
        }
        for (int j = 0; j < cap->n_out; j++)
            if (cap->out[j].id == h) {
                if (x->kind == RQ_GRAD) v->out_grad[j] = q;
                else { v->out_rq[j] = q; x->kind = RQ_OUT; }
            }
        if (x->kind != RQ_NONE) continue;
        const char *nm = ctpu_rec_name(s->rrec[q]);
        char tb[96];
        cap->fail_outlives = true;
        snprintf(cap->fail, sizeof cap->fail, "a tensor made in the step outlives it and is not an output: %s%s%s (made by %s)",
                 nm, nm[0] ? " " : "", ctpu_fmt_type(&x->type, tb, sizeof tb),
                 s->rrec[q]->made_by ? s->rrec[q]->made_by : "?");
        return false;
    }
    return true;
}

/* An in-place target must be the tensor itself, never in[i]'s storage. */
static bool check_inplace(build_ctx *b)
{
    version *v = b->v;
    for (int k = 0; k < v->n_pin; k++)
        for (int q = 0; q < v->nreq; q++) {
            if (v->rq[q].kind != RQ_INPLACE || b->s->reqs[q].alias_buf != b->s->rin_buf[b->s->plan->in_src[k]]) continue;
            if (v->in[k].kind != IN_OWNER) {
                snprintf(b->cap->fail, sizeof b->cap->fail, "in[%d]'s storage is assigned by the step", v->in[k].idx);
                return false;
            }
            v->in[k].owner = v->rq[q].h;
        }
    return true;
}

/* The first input sharing in[i]'s storage (i itself when none does) and
 * how many bytes in[i] starts after it: a program input reading one of
 * them is bound to the first at a fixed offset, so both are guards. */
int ctpu__cs_same_input(ctpu_trec *const *inrec, int i, int64_t *rel)
{
    for (int j = 0; j < i; j++)
        if (inrec[j]->buf == inrec[i]->buf) {
            *rel = (int64_t)inrec[i]->off - (int64_t)inrec[j]->off;
            return j;
        }
    *rel = 0;
    return i;
}

static bool version_alloc(version *v, const ctpu_capture_sink *s, const struct ctpu_capture *cap)
{
    const ctpu_launch_plan *pl = s->plan;
    v->n_user = cap->n_in;
    v->n_scalars = cap->n_scalars;
    v->n_out_user = cap->n_out;
    v->n_pin = pl->n_in;
    v->n_pout = pl->n_out;
    v->n_psc = pl->n_scal;
    v->nreq = s->nreq;
    v->n_rng = cap->n_rng;
    v->user_type = malloc(sizeof *v->user_type * ((size_t)v->n_user + 1));
    v->user_same = malloc(sizeof *v->user_same * ((size_t)v->n_user + 1));
    v->user_rel = calloc((size_t)v->n_user + 1, sizeof *v->user_rel);
    v->in = calloc((size_t)v->n_pin + 1, sizeof *v->in);
    v->sc = calloc((size_t)v->n_psc + 1, sizeof *v->sc);
    v->rq = calloc((size_t)v->nreq + 1, sizeof *v->rq);
    v->alias_req = malloc(sizeof *v->alias_req * ((size_t)v->n_pout + 1));
    v->grad_rq = malloc(sizeof *v->grad_rq * ((size_t)v->n_pout + 1));
    v->out_bytes = malloc(sizeof *v->out_bytes * ((size_t)v->n_pout + 1));
    v->rng = malloc(sizeof *v->rng * ((size_t)v->n_rng + 1));
    v->no_grad_leaf = malloc(sizeof *v->no_grad_leaf * ((size_t)cap->n_grads + 1));
    v->no_grad_in = malloc(sizeof *v->no_grad_in * ((size_t)cap->n_grads + 1));
    v->out_rq = malloc(sizeof *v->out_rq * ((size_t)v->n_out_user + 1));
    v->out_fixed = calloc((size_t)v->n_out_user + 1, sizeof *v->out_fixed);
    v->out_in = malloc(sizeof *v->out_in * ((size_t)v->n_out_user + 1));
    v->out_prow = malloc(sizeof *v->out_prow * ((size_t)v->n_out_user + 1));
    v->out_grad = malloc(sizeof *v->out_grad * ((size_t)v->n_out_user + 1));
    v->out_vbase = malloc(sizeof *v->out_vbase * ((size_t)v->n_out_user + 1));
    v->out_cbuf = calloc((size_t)v->n_out_user + 1, sizeof *v->out_cbuf);
    v->out_vtype = malloc(sizeof *v->out_vtype * ((size_t)v->n_out_user + 1));
    v->out_vdelta = malloc(sizeof *v->out_vdelta * ((size_t)v->n_out_user + 1));
    v->out_vold = calloc((size_t)v->n_out_user + 1, sizeof *v->out_vold);
    v->user_ag = calloc((size_t)v->n_user + 1, 1);
    v->user_hsame = malloc(sizeof *v->user_hsame * ((size_t)v->n_user + 1));
    v->user_bound = calloc((size_t)v->n_user + 1, sizeof *v->user_bound);
    v->user_hist = calloc((size_t)v->n_user + 1, sizeof *v->user_hist);
    v->arg_val = malloc(sizeof *v->arg_val * ((size_t)v->n_scalars + 1));
    v->outb = calloc((size_t)v->n_pout + 1, sizeof *v->outb);
    v->outo = calloc((size_t)v->n_pout + 1, sizeof *v->outo);
    v->outk = calloc((size_t)v->n_pout + 1, 1);
    v->sc_tmpl = malloc(sizeof *v->sc_tmpl * ((size_t)v->n_psc + 1));
    v->sc_dyn = malloc(sizeof *v->sc_dyn * ((size_t)v->n_psc + 1));
    v->unconf = malloc(sizeof *v->unconf * ((size_t)v->n_psc + 1));
    v->pin_b = calloc((size_t)v->n_pin + 1, sizeof *v->pin_b);
    v->pin_o = calloc((size_t)v->n_pin + 1, sizeof *v->pin_o);
    v->pin_user = calloc((size_t)v->n_pin + 1, sizeof *v->pin_user);
    if (!v->outb || !v->outo || !v->outk || !v->sc_tmpl || !v->sc_dyn || !v->unconf || !v->pin_b || !v->pin_o || !v->pin_user) return false;
    return v->user_type && v->user_same && v->user_rel && v->in && v->sc && v->rq && v->alias_req && v->grad_rq &&
           v->out_bytes && v->rng && v->no_grad_leaf && v->no_grad_in && v->out_rq && v->out_fixed && v->out_in &&
           v->out_prow && v->out_grad && v->out_vbase && v->out_cbuf && v->out_vtype && v->out_vdelta && v->out_vold &&
           v->user_ag && v->user_hsame && v->user_bound && v->user_hist && v->arg_val;
}

/* The guards' facts and the plan's copies. */
static void version_fill(version *v, const ctpu_capture_sink *s, const struct ctpu_capture *cap)
{
    const ctpu_launch_plan *pl = s->plan;
    for (int i = 0; i < v->n_user; i++) {
        v->user_type[i] = cap->inrec[i]->type;
        if (cap->inrec[i]->dyn && !v->user_dyn) v->user_dyn = calloc((size_t)v->n_user, sizeof *v->user_dyn);
        if (cap->inrec[i]->dyn && v->user_dyn) memcpy(v->user_dyn[i], cap->inrec[i]->dyn, sizeof v->user_dyn[i]);
        v->user_same[i] = ctpu__cs_same_input(cap->inrec, i, &v->user_rel[i]);
        v->user_ag[i] = (uint8_t)ctpu__ag_kind(cap->inrec[i]);
        v->user_hsame[i] = i;
        v->user_bound[i] = v->user_ag[i] == 1;
        if (v->user_ag[i] == 2 && ctpu__ag_history_reached(cap->inrec[i], cap->ag_pass0))
            v->user_hist[i] = ctpu__ag_history_id(cap->inrec[i]);
        for (int j = 0; j < i; j++)
            if (cap->inrec[j] == cap->inrec[i]) { v->user_hsame[i] = j; break; }
    }
    v->grad_mode = ctpu_grad_enabled();
    v->hist_released = cap->hist_released;
    v->precision = (uint8_t)ctpu_rt->precision;
    v->dbg = ctpu_debug_checks_now();   /* in the capture's defer and fuse: the runtime's setting, as dbg_now() */
    for (int o = 0; o < v->n_pout; o++) {
        v->alias_req[o] = pl->alias_req[o];
        v->out_bytes[o] = s->out_bytes ? s->out_bytes[o] : pl->out_bytes[o];
        v->grad_rq[o] = -1;
    }
    if (v->n_rng) memcpy(v->rng, cap->rng, sizeof *v->rng * (size_t)v->n_rng);
    for (int i = 0; i < v->n_scalars; i++) v->arg_val[i] = cap->scalars[i];
    for (int j = 0; j < v->n_out_user; j++) {
        v->out_rq[j] = -1;
        v->out_in[j] = -1;
        v->out_prow[j] = -1;
        v->out_grad[j] = -1;
        v->out_vbase[j] = -1;
        ctpu_trec *r = live_rec(cap->out[j].id);
        if (r && !ctpu_rec_pending(r)) v->out_fixed[j] = cap->out[j].id;   /* fn returned a tensor made before */
        for (int i = 0; r && i < v->n_user; i++)   /* an input returned: each call returns its own in[i] */
            if (cap->inrec[i] == r) { v->out_in[j] = i; v->out_fixed[j] = 0; break; }
    }
}

static int handle_row(version *v, uint64_t h, uint8_t role)
{
    for (int i = 0; i < v->n_h; i++)
        if (v->hid[i] == h) {
            v->hrole[i] |= role;
            return i;
        }
    v->hid[v->n_h] = h;
    v->hrole[v->n_h] = role;
    return v->n_h++;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

bool ctpu__cs_is_inplace_target(const version *v, uint64_t id)
{
    int lo = 0, hi = v->n_inplace;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v->inplace_ids[mid] == id) return true;
        if (v->inplace_ids[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return false;
}

/* Each handle row in words, while its tensor is live (the capture): the
 * first program input that reads it (the cache report's input numbers),
 * its type and name. Out of host memory: none (the guard says less). */
static void describe_rows(version *v)
{
    v->hdesc = malloc(sizeof *v->hdesc * ((size_t)v->n_h + 1));
    for (int h = 0; v->hdesc && h < v->n_h; h++) {
        const ctpu_trec *r = live_rec(v->hid[h]);
        int pin = -1;
        for (int k = 0; k < v->n_pin && pin < 0; k++)
            if (v->in[k].kind == IN_OWNER && v->in[k].hs == h) pin = k;
        char tb[64] = "", at[32] = "";
        if (r) ctpu_fmt_type(&r->type, tb, sizeof tb);
        if (pin >= 0) snprintf(at, sizeof at, "program input %d ", pin);
        if (v->hpos[h] >= 0) snprintf(at, sizeof at, "input %d%s ", v->hpos[h] / 2, v->hpos[h] & 1 ? "'s .grad" : "");
        const char *nm = r ? ctpu_rec_name(r) : "";
        const ctpu_trec *leaf = v->hleaf[h] ? live_rec(v->hleaf[h]) : NULL;
        if (leaf) nm = ctpu_rec_name(leaf)[0] ? ctpu_rec_name(leaf) : "a leaf";
        snprintf(v->hdesc[h], sizeof v->hdesc[h], "%s(%s%s%s%.40s)", at, tb, nm[0] ? " " : "", leaf ? ".grad of " : "", nm);
    }
}

/* Which rows name an input or an input leaf's .grad (hpos): the first
 * input that was the row's handle (a leaf whose .grad the step makes, or
 * a tensor it assigns, in place or rebound: each call's in[i] gets it, as
 * torch.compile's input mutation applies to the tensor passed that call),
 * or whose .grad it was, a leaf that requires grad at the capture. Which
 * inputs an assigned input is one handle with is guarded (user_bound):
 * fn's reads of in[j] after assigning in[i] saw the new value only if
 * they were one tensor. */
static bool bind_positions(version *v, const struct ctpu_capture *cap)
{
    v->hpos = malloc(sizeof *v->hpos * ((size_t)v->n_h + 1));
    v->hnow = malloc(sizeof *v->hnow * ((size_t)v->n_h + 1));
    v->prow = malloc(sizeof *v->prow * ((size_t)v->n_h + 1));
    if (!v->hpos || !v->hnow || !v->prow) return false;
    for (int h = 0; h < v->n_h; h++) {
        const ctpu_trec *r = live_rec(v->hid[h]);
        v->hpos[h] = -1;
        v->hnow[h] = v->hid[h];
        for (int i = 0; i < v->n_user && v->hpos[h] < 0; i++) {
            if (r == cap->inrec[i]) v->hpos[h] = 2 * i;
            else if (v->user_ag[i] == 1 && v->hid[h] == ctpu__ag_grad_id(cap->inrec[i])) v->hpos[h] = 2 * i + 1;
        }
        if (v->hpos[h] < 0) continue;
        v->prow[v->n_prow++] = h;
        for (int i = 0; !(v->hpos[h] & 1) && (v->hrole[h] & (H_ASSIGN | H_INPLACE)) && i < v->n_user; i++)
            if (cap->inrec[i] == r) v->user_bound[i] = true;
    }
    return true;
}

/* Which rows not bound by position are the .grad of a leaf made before
 * the call (hleaf): a row among them, else any live one. */
static bool bind_leaf_grads(version *v)
{
    v->hleaf = calloc((size_t)v->n_h + 1, sizeof *v->hleaf);
    if (!v->hleaf) return false;
    for (int h = 0; h < v->n_h; h++) {
        const ctpu_trec *g = live_rec(v->hid[h]);
        if (v->hpos[h] >= 0 || !g || !g->leaf_grad) continue;
        for (int k = 0; k < v->n_h && !v->hleaf[h]; k++) {
            const ctpu_trec *r = live_rec(v->hid[k]);
            if (r && ctpu__ag_grad_id(r) == v->hid[h]) v->hleaf[h] = v->hid[k];
        }
        uint32_t n = atomic_load_explicit(&ctpu_rt->n_slots, memory_order_acquire);
        for (uint32_t idx = 0; idx < n && !v->hleaf[h]; idx++) {
            ctpu_trec *r = ctpu_slot(idx);
            if (!atomic_load_explicit(&r->live, memory_order_relaxed) || !r->ag || ctpu__ag_grad_id(r) != v->hid[h]) continue;
            v->hleaf[h] = ((uint64_t)atomic_load_explicit(&r->gen, memory_order_relaxed) << 32) | (idx + 1);
        }
    }
    return true;
}

/* Storage an out[j] fn made may be a view of without the version having
 * a row for it: an input's, a program input's or a request's. */
static bool out_base_known(const build_ctx *b, const ctpu_buffer *buf)
{
    const version *v = b->v;
    const struct ctpu_capture *cap = b->cap;
    for (int i = 0; i < v->n_user; i++)
        if (cap->inrec[i]->buf == buf) return true;
    for (int k = 0; k < v->n_pin; k++) {
        const ctpu_trec *o = v->in[k].kind == IN_OWNER ? live_rec(v->in[k].owner) : NULL;
        if (v->in[k].kind == IN_OWNER && (b->s->rin_buf[b->s->plan->in_src[k]] == buf || (o && o->buf == buf)))
            return true;
    }
    for (int q = 0; q < v->nreq; q++) {
        const ctpu_trec *o = v->rq[q].kind != RQ_NONE && v->rq[q].kind != RQ_OUT ? live_rec(v->rq[q].h) : NULL;
        if (o && o->buf == buf) return true;
    }
    return false;
}

/* out[j] fn made as a view (detach, reshape) of a tensor made before the
 * call that the step does not otherwise read (out[0] = ctpu_detach(b)):
 * that tensor becomes a row, so each replay makes the view on its storage
 * then (the capture's handle ends with the caller's scope). False: out of
 * host memory. */
static bool view_owners(build_ctx *b)
{
    const struct ctpu_capture *cap = b->cap;
    const version *v = b->v;
    b->vowner = malloc(sizeof *b->vowner * ((size_t)cap->n_out + 1));
    if (!b->vowner) {
        snprintf(b->cap->fail, sizeof b->cap->fail, "out of host memory");
        return false;
    }
    for (int j = 0; j < cap->n_out; j++) {
        const ctpu_trec *r = v->out_fixed[j] && fn_made(cap, v->out_fixed[j]) ? live_rec(v->out_fixed[j]) : NULL;
        if (!r || !r->buf || out_base_known(b, r->buf)) continue;
        bool have = false;
        for (int i = 0; i < b->n_vowner && !have; i++) {
            const ctpu_trec *o = live_rec(b->vowner[i]);
            have = o && o->buf == r->buf;
        }
        if (have) continue;
        uint32_t n = atomic_load_explicit(&ctpu_rt->n_slots, memory_order_acquire);
        for (uint32_t idx = 0; idx < n; idx++) {
            ctpu_trec *rec = ctpu_slot(idx);
            if (!atomic_load_explicit(&rec->live, memory_order_relaxed) || ctpu_rec_pending(rec) || rec->buf != r->buf)
                continue;
            uint64_t id = ((uint64_t)atomic_load_explicit(&rec->gen, memory_order_relaxed) << 32) | (idx + 1);
            if (fn_made(cap, id)) continue;
            b->vowner[b->n_vowner++] = id;
            break;
        }
    }
    return true;
}

/* The handle table: every IN_OWNER input, every request naming a handle,
 * and each older tensor an out[j] view is taken of (map_out_views). */
static bool build_handles(version *v, const struct ctpu_capture *cap, const build_ctx *b)
{
    size_t n = (size_t)v->n_pin + (size_t)v->nreq + (size_t)b->n_vowner + 1;
    v->hid = malloc(sizeof *v->hid * n);
    v->hrole = malloc(n);
    v->hrec = calloc(n, sizeof *v->hrec);
    if (!v->hid || !v->hrole || !v->hrec) return false;
    for (int k = 0; k < v->n_pin; k++)
        if (v->in[k].kind == IN_OWNER) v->in[k].hs = handle_row(v, v->in[k].owner, H_READ);
    for (int q = 0; q < v->nreq; q++) {
        rq_t *r = &v->rq[q];
        if (r->kind == RQ_INPLACE) r->hs = handle_row(v, r->h, H_INPLACE);
        else if (r->kind == RQ_REBIND) r->hs = handle_row(v, r->h, H_ASSIGN);
        else if (r->kind == RQ_GRAD) r->hs = handle_row(v, r->h, H_LEAF);
    }
    for (int i = 0; i < b->n_vowner; i++) handle_row(v, b->vowner[i], H_READ);
    v->inplace_ids = malloc(sizeof *v->inplace_ids * ((size_t)v->n_h + 1));
    v->hslot = malloc(sizeof *v->hslot * ((size_t)v->n_h + 1));
    v->hgen = malloc(sizeof *v->hgen * ((size_t)v->n_h + 1));
    v->hag = malloc((size_t)v->n_h + 1);
    if (!v->inplace_ids || !v->hslot || !v->hgen || !v->hag || !bind_positions(v, cap) || !bind_leaf_grads(v)) return false;
    for (int h = 0; h < v->n_h; h++) {
        ctpu_tensor t = { v->hid[h] };
        v->hslot[h] = ctpu_slot(ctpu_handle_slot(t));   /* live at the capture: its slot exists */
        v->hgen[h] = ctpu_handle_gen(t);
        const ctpu_trec *r = live_rec(v->hid[h]);
        v->hag[h] = r ? (uint8_t)ctpu__ag_kind(r) : 0;
    }
    for (int h = 0; h < v->n_h; h++)   /* (a row bound by position is checked against the call's handle) */
        if ((v->hrole[h] & H_INPLACE) && v->hpos[h] < 0 && !v->hleaf[h]) v->inplace_ids[v->n_inplace++] = v->hid[h];
    describe_rows(v);
    qsort(v->inplace_ids, (size_t)v->n_inplace, sizeof *v->inplace_ids, cmp_u64);
    return true;
}

/* Outputs that feed exactly one new .grad may reuse the old .grad's storage. */
static void map_grads(version *v)
{
    for (int o = 0; o < v->n_pout; o++) {
        int n = 0, g = -1;
        for (int q = 0; q < v->nreq; q++)
            if (v->rq[q].out == o && v->rq[q].kind != RQ_NONE) {
                n++;
                if (v->rq[q].kind == RQ_GRAD) g = q;
            }
        v->grad_rq[o] = n == 1 ? g : -1;
    }
}

/* The replay's lists: which outputs need a buffer found or made, which are
 * written into a handle's own storage, which requests are published. */
static bool plan_replay(version *v)
{
    v->fresh_o = malloc(sizeof *v->fresh_o * ((size_t)v->n_pout + 1));
    v->held_hs = malloc(sizeof *v->held_hs * ((size_t)v->n_pout + 1));
    v->pub_q = malloc(sizeof *v->pub_q * ((size_t)v->nreq + 1));
    if (!v->fresh_o || !v->held_hs || !v->pub_q) return false;
    for (int o = 0; o < v->n_pout; o++) {
        int q = v->alias_req[o];
        v->held_hs[o] = q >= 0 ? v->rq[q].hs : -1;
        if (q < 0) v->fresh_o[v->n_fresh++] = o;
    }
    for (int q = 0; q < v->nreq; q++)
        if (v->rq[q].kind == RQ_REBIND || v->rq[q].kind == RQ_GRAD) v->pub_q[v->n_pub++] = q;
    for (int k = 0; k < v->n_pin; k++)
        if (v->in[k].kind == IN_USER) v->pin_user[v->n_pin_user++] = k;
    return true;
}

/* An out[j] fn made as a view (a new handle on existing storage, no op
 * recorded: detach, reshape, a transpose) of an input or of a tensor the
 * step reads: each replay makes it on that call's storage (the capture's
 * handle holds the capture's value, and its scope may have ended). A
 * tensor made before the call returned as itself stays fixed. */
/* The handle row whose storage holds a view on (buf, off) at the capture,
 * its offset from that row's in *delta: a live row's storage now, or (old
 * set) its storage at the call's start, which fn assigned after taking the
 * view (the row's pending record still holds it, or a program input read
 * it through the row): the view keeps that value, as eager's.
 * -1: none. */
static int view_base_row(const version *v, const ctpu_capture_sink *s, const ctpu_buffer *buf, size_t off,
                         int64_t *delta, bool *old)
{
    for (int h = 0; h < v->n_h; h++) {
        const ctpu_trec *b = live_rec(v->hid[h]);
        if (!b || b->buf != buf) continue;
        *delta = (int64_t)off - (int64_t)b->off;
        *old = ctpu_rec_pending(b);   /* an assigned tensor's storage before its rebind */
        return h;
    }
    for (int k = 0; k < v->n_pin; k++) {
        int r = s->plan->in_src[k];
        if (v->in[k].kind != IN_OWNER || s->rin_buf[r] != buf) continue;
        *delta = (int64_t)off - ((int64_t)s->rin_off[r] - v->in[k].delta);   /* from the row's offset */
        *old = true;
        return v->in[k].hs;
    }
    return -1;
}

/* An out[j] fn made as a view (a new handle on existing storage, no op
 * recorded: detach, reshape, a transpose) of an input or of a tensor the
 * step reads: each replay makes it on that call's storage (the capture's
 * handle holds the capture's value, and its scope may have ended). A
 * tensor made before the call returned as itself stays fixed. */
static void map_out_views(version *v, const struct ctpu_capture *cap, const ctpu_capture_sink *s)
{
    for (int j = 0; j < v->n_out_user; j++) {
        uint64_t id = v->out_fixed[j];
        const ctpu_trec *r = id ? live_rec(id) : NULL;
        if (!r || !r->buf) continue;
        bool own = false;
        for (int h = 0; h < v->n_h && !own; h++) {
            own = v->hid[h] == id;
            if (own && (v->hpos[h] >= 0 || v->hleaf[h])) v->out_prow[j] = h;   /* a leaf's .grad: this call's */
        }
        if (own) continue;
        int base = -1;
        int64_t delta = 0;
        bool old = false;
        for (int i = 0; i < v->n_user && base == -1; i++)
            if (cap->inrec[i]->buf == r->buf) {
                base = i;
                delta = (int64_t)r->off - (int64_t)cap->inrec[i]->off;
                old = ctpu_rec_pending(cap->inrec[i]);   /* an assigned input's storage before its rebind */
            }
        if (base == -1) {
            int h = view_base_row(v, s, r->buf, r->off, &delta, &old);
            if (h >= 0) base = -2 - h;
        }
        if (base == -1 && fn_made(cap, id)) {
            /* storage fn made that no older tensor holds (host data made
             * inside fn): a constant each replay returns a new handle on;
             * a handle ref of ours makes any assign to it copy */
            ctpu_buffer_retain(r->buf);
            atomic_fetch_add(&r->buf->handle_refs, 1);
            v->out_cbuf[j] = r->buf;
            v->out_vtype[j] = r->type;
            v->out_vdelta[j] = (int64_t)r->off;
            v->out_fixed[j] = 0;
            continue;
        }
        if (base == -1) continue;
        v->out_vbase[j] = base;
        v->out_vtype[j] = r->type;
        v->out_vdelta[j] = delta;
        v->out_vold[j] = old;
        v->out_fixed[j] = 0;
    }
}

void ctpu__capture_sink(const ctpu_capture_sink *s)
{
    struct ctpu_capture *cap = ctpu__ts->cap;
    if (!cap || cap->fail[0]) {
        free(s->prov);
        return;
    }
    version *v = calloc(1, sizeof *v);
    build_ctx b = { .cap = cap, .s = s, .v = v };
    b.rsrc = calloc((size_t)s->n_rin + 1, sizeof *b.rsrc);
    b.resolved = calloc((size_t)s->n_rin + 1, 1);
    bool ok = v && b.rsrc && b.resolved && version_alloc(v, s, cap);
    if (!ok) snprintf(cap->fail, sizeof cap->fail, "out of host memory");
    if (ok) {
        v->program_id = s->program_id;
        version_fill(v, s, cap);
        if (cap->n_gread) {
            v->gobs = malloc(sizeof *v->gobs * (size_t)cap->n_gread);
            for (int i = 0; v->gobs && i < cap->n_gread; i++)
                v->gobs[i] = (struct grad_seen){ cap->gread[i].leaf, cap->gread[i].g != 0 };
            v->n_gobs = v->gobs ? cap->n_gread : 0;
            if (!v->gobs) snprintf(cap->fail, sizeof cap->fail, "out of host memory");
        }
        if (cap->n_kread) {
            v->kobs = malloc(sizeof *v->kobs * (size_t)cap->n_kread);
            for (int i = 0; v->kobs && i < cap->n_kread; i++)
                v->kobs[i] = (struct kind_seen){ cap->kread[i].leaf, (uint8_t)cap->kread[i].g };
            v->n_kobs = v->kobs ? cap->n_kread : 0;
            if (!v->kobs) snprintf(cap->fail, sizeof cap->fail, "out of host memory");
        }
        classify_inputs(&b);
        for (int k = 0; k < v->n_pin; k++) {
            v->in[k] = b.rsrc[s->plan->in_src[k]];
            if (v->in[k].kind == IN_CONST) ctpu_buffer_retain(v->in[k].buf);   /* one ref per program input */
        }
        for (int r = 0; r < s->n_rin; r++)
            if (b.rsrc[r].kind == IN_CONST) ctpu_buffer_release(ctpu_rt->dev, b.rsrc[r].buf);
        for (int i = 0; i < v->n_psc; i++) {
            int r = s->plan->scal_src[i];
            v->sc[i] = classify_scalar(cap, r, s->rscal[r]);
        }
        ok = classify_requests(&b) && check_inplace(&b);
    }
    if (ok) ok = view_owners(&b);
    if (ok && !build_handles(v, cap, &b)) {
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
        ok = false;
    }
    if (ok) map_grads(v);
    if (ok) map_out_views(v, cap, s);
    if (ok && !plan_replay(v)) {
        snprintf(cap->fail, sizeof cap->fail, "out of host memory");
        ok = false;
    }
    if (ok) {
        ctpu_program_retain(s->prog);
        v->prog = s->prog;
        if (s->run) ctpu_program_retain(s->run);
        v->run = s->run;
        v->prov = s->prov;
        v->n_prov = s->n_prov;
        v->prov_span = s->prov_span;
    } else {
        free(s->prov);
    }
    free(b.rsrc);
    free(b.resolved);
    free(b.vowner);
    if (!ok) {
        ctpu__cs_version_free(v);
        return;
    }
    cap->made = v;
}

