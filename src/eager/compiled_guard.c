/* Compiled steps: the guards a call checks against a version, and the
 * replay that launches its program with the call's inputs and scalars
 * (compiled.c has the overview). */
#include "compiled_int.h"

/* ------------------------------------------------------------ guards */
static void describe_type_change(int i, const ctpu_vtype *was, const ctpu_vtype *now, const ctpu_trec *r, char *why,
                                 size_t len)
{
    const char *nm = ctpu_rec_name(r);
    char nb[80] = "";
    if (nm[0]) snprintf(nb, sizeof nb, " (%.64s)", nm);
    if (was->dtype != now->dtype) {
        snprintf(why, len, "input %d%s dtype: %s -> %s", i, nb, ctpu_dtype_name((ctpu_dtype)was->dtype),
                 ctpu_dtype_name((ctpu_dtype)now->dtype));
        return;
    }
    if (was->ndim != now->ndim) {
        snprintf(why, len, "input %d%s ndim: %d -> %d", i, nb, was->ndim, now->ndim);
        return;
    }
    for (int d = 0; d < was->ndim; d++)
        if (was->shape[d] != now->shape[d]) {
            snprintf(why, len, "input %d%s dim %d: %lld -> %lld", i, nb, d, (long long)was->shape[d],
                     (long long)now->shape[d]);
            return;
        }
}

/* Input i of another shape than version v's capture: true when it differs
 * only in dims the capture had marked (ctpu_mark_dynamic), each extent in
 * its range (another extent of the same dynamic program); false with the
 * reason, an extent out of its range as the dynamic key says it
 * ("input 0 dim 1 = 300 outside dynamic range [2, 256]"). */
static bool dyn_extent(const version *v, int i, const ctpu_trec *r, char *why, size_t len)
{
    const ctpu_vtype *was = &v->user_type[i], *now = &r->type;
    if (v->user_dyn && was->dtype == now->dtype && was->ndim == now->ndim) {
        bool ok = true;
        for (int d = 0; d < was->ndim && ok; d++) {
            if (was->shape[d] == now->shape[d]) continue;
            const ctpu_dyndim *y = &v->user_dyn[i][d];
            int64_t x = now->shape[d];
            if (y->coef <= 0) { ok = false; break; }
            if (x % y->coef == 0 && x / y->coef >= y->lo && x / y->coef <= y->hi) continue;
            const char *nm = ctpu_rec_name(r);
            snprintf(why, len, "input %d%s%.64s%s dim %d = %lld outside dynamic range [%lld, %lld]", i, nm[0] ? " (" : "",
                     nm, nm[0] ? ")" : "", d, (long long)x, (long long)y->lo, (long long)y->hi);
            return false;
        }
        if (ok) return true;
    }
    describe_type_change(i, was, now, r, why, len);
    return false;
}

/* ctpu__ag_kind's kinds, in words: now, and at the capture. */
static const char *const ag_kind_now[3] = { "requires no grad", "is a leaf requiring grad", "is a non-leaf requiring grad" };
static const char *const ag_kind_was[3] = { "required none", "was a leaf requiring grad", "was a non-leaf requiring grad" };

/* Handle row h's record if its handle is live. */
static inline ctpu_trec *row_rec(const version *v, int h)
{
    ctpu_trec *r = v->hslot[h];
    return atomic_load_explicit(&r->live, memory_order_relaxed) &&
           atomic_load_explicit(&r->gen, memory_order_relaxed) == v->hgen[h] ? r : NULL;
}

static bool handles_hold(version *v, const ctpu_tensor *in, ctpu_trec *const *inrec, char *why, size_t len);
static bool inputs_not_inplace(const version *v, int n_in, const ctpu_tensor *in, char *why, size_t len);
static bool no_grad_holds(version *v, ctpu_trec *const *inrec, char *why, size_t len);
static bool grads_seen_hold(version *v, char *why, size_t len);

/* The handle row h names this call: its own, or (bound by position) the
 * call's in[i] or in[i]'s .grad (0: none). */
static inline uint64_t row_id_now(const version *v, int h, const ctpu_tensor *in, ctpu_trec *const *inrec)
{
    int p = v->hpos[h];
    return p < 0 ? v->hid[h] : p & 1 ? ctpu__ag_grad_id(inrec[p / 2]) : in[p / 2].id;
}

/* The binding cache holds for the rows bound by position only while each
 * names the handle it named at the last call (in[i] changed: bind anew). */
static bool rows_same(const version *v, const ctpu_tensor *in, ctpu_trec *const *inrec)
{
    for (int u = 0; u < v->n_prow; u++)
        if (row_id_now(v, v->prow[u], in, inrec) != v->hnow[v->prow[u]]) return false;
    return true;
}

/* A leaf input (or an input the step assigns) that was the same handle
 * as an earlier input at the capture (x passed as in[0] and in[1]: one
 * .grad gets both, fn's reads of in[0] see in[1]'s assign) must be so now,
 * and one that was not must not be (two handles on one storage). */
static bool leaf_identity_holds(const version *v, int n_in, ctpu_trec *const *inrec, char *why, size_t len)
{
    for (int i = 0; i < n_in; i++) {
        if (!v->user_bound[i]) continue;
        int same = i;
        for (int j = 0; j < i; j++)
            if (inrec[j] == inrec[i]) { same = j; break; }
        if (same == v->user_hsame[i]) continue;
        const char *what = v->user_ag[i] == 1 ? "leaf" : "tensor", *other = v->user_ag[i] == 1 ? "leaf" : "handle";
        if (same == i)
            snprintf(why, len, "input %d: no longer the same %s as input %d (it was at the capture)", i, what,
                     v->user_hsame[i]);
        else if (v->user_hsame[i] == i)
            snprintf(why, len, "input %d: now the same %s as input %d (another %s at the capture)", i, what, same,
                     other);
        else
            snprintf(why, len, "input %d: the same %s as input %d, was as input %d at the capture", i, what, same,
                     v->user_hsame[i]);
        return false;
    }
    return true;
}

/* A non-leaf input whose history the step's backward ran through at the
 * capture (in[0] = a * f made before the call) must have that history:
 * the capture baked it (f, a, what its rules saved). Another one (a new
 * f, a new a, or the same ops made anew) fails, as does one a backward
 * has released since (eager's backward would fail): fn runs again. */
static bool history_holds(const version *v, int n_in, ctpu_trec *const *inrec, char *why, size_t len)
{
    for (int i = 0; i < n_in; i++) {
        if (!v->user_hist[i]) continue;
        bool other = ctpu__ag_history_id(inrec[i]) != v->user_hist[i];
        if (!other && !ctpu__ag_history_released(inrec[i])) continue;
        const char *nm = ctpu_rec_name(inrec[i]);
        snprintf(why, len, "input %d%s%.48s%s: a non-leaf whose autograd history %s (the step's backward runs "
                 "through it)", i, nm[0] ? " (" : "", nm, nm[0] ? ")" : "",
                 other ? "is not the capture's" : "was released by a backward since the capture");
        return false;
    }
    if (v->hist_released) {
        snprintf(why, len, "the step's backward released autograd history made before the call (a tensor fn reads "
                 "has one; no retain_graph): a backward through it fails now");
        return false;
    }
    return true;
}

/* The tensors a version reads and writes through handles still fit it;
 * fills v->hrec (one lookup per handle per call). False with the reason
 * (the cache report's diff format); *extent: the inputs differ from the
 * capture's only in its dynamic dims, within their ranges (no guard
 * failure: another extent of the version's dynamic program). */
bool ctpu__cs_guards_hold(version *v, int n_in, const ctpu_tensor *in, ctpu_trec *const *inrec, int n_scalars, int n_out,
                          char *why, size_t len, bool *extent)
{
    bool other_extent = false;
    if (n_in != v->n_user || n_scalars != v->n_scalars || n_out != v->n_out_user) {
        snprintf(why, len, "%s: %d -> %d", n_in != v->n_user ? "n_in" : n_scalars != v->n_scalars ? "n_scalars" : "n_out",
                 n_in != v->n_user ? v->n_user : n_scalars != v->n_scalars ? v->n_scalars : v->n_out_user,
                 n_in != v->n_user ? n_in : n_scalars != v->n_scalars ? n_scalars : n_out);
        return false;
    }
    if (v->grad_mode != ctpu_grad_enabled()) {
        snprintf(why, len, "grad mode %s (%s at the capture)", v->grad_mode ? "off" : "on", v->grad_mode ? "on" : "off");
        return false;
    }
    for (int i = 0; i < n_in; i++) {
        if (!vtype_eq(&v->user_type[i], &inrec[i]->type)) {
            if (!dyn_extent(v, i, inrec[i], why, len)) return false;
            other_extent = true;
        }
        int64_t rel;
        int same = ctpu__cs_same_input(inrec, i, &rel);
        if (same != v->user_same[i]) {
            if (same == i)
                snprintf(why, len, "input %d: no longer shares storage with input %d", i, v->user_same[i]);
            else if (v->user_same[i] == i)
                snprintf(why, len, "input %d: now shares storage with input %d (it did not at capture)", i, same);
            else
                snprintf(why, len, "input %d: shares storage with input %d, was with input %d", i, same, v->user_same[i]);
            return false;
        }
        if (rel != v->user_rel[i]) {
            /* a view of input same's storage at another offset: the
             * program reads it at the capture's (pytorch/pytorch#198095) */
            snprintf(why, len, "input %d: at byte %lld of input %d's storage, %lld at the capture", i,
                     (long long)rel, same, (long long)v->user_rel[i]);
            return false;
        }
    }
    for (int i = 0; i < n_in; i++) {
        int k = ctpu__ag_kind(inrec[i]);
        if (k == v->user_ag[i]) continue;
        snprintf(why, len, "input %d %s now, %s at the capture", i, ag_kind_now[k], ag_kind_was[v->user_ag[i]]);
        return false;
    }
    if (!leaf_identity_holds(v, n_in, inrec, why, len) || !history_holds(v, n_in, inrec, why, len)) return false;
    if (other_extent) {
        *extent = true;
        snprintf(why, len, "another extent of the inputs' dynamic dims");
        return false;
    }
    if (v->precision != (uint8_t)ctpu_rt->precision || v->dbg != ctpu_rt->debug_checks) {
        snprintf(why, len, "%s changed", v->dbg != ctpu_rt->debug_checks ? "debug checks" : "matmul precision");
        return false;
    }
    uint64_t epoch = atomic_load(&ctpu__bind_epoch);
    v->check_epoch = epoch;
    if (v->bound && v->bound_epoch == epoch && rows_same(v, in, inrec))
        return inputs_not_inplace(v, n_in, in, why, len);
    v->bound = false;
    return handles_hold(v, in, inrec, why, len) && inputs_not_inplace(v, n_in, in, why, len) &&
           no_grad_holds(v, inrec, why, len) && grads_seen_hold(v, why, len);
}

/* The per-handle guards (what the binding cache skips): each row live,
 * computed and with storage; in-place targets unshared; each buffer they
 * rely on watched, so a change to it bumps the binding epoch. */
static bool handles_hold(version *v, const ctpu_tensor *in, ctpu_trec *const *inrec, char *why, size_t len)
{
    v->bindable = true;
    for (int h = 0; h < v->n_h; h++) {
        int p = v->hpos[h];
        ctpu_trec *r = p < 0 && !v->hleaf[h] ? row_rec(v, h) : NULL;
        if (p >= 0) {
            v->hnow[h] = row_id_now(v, h, in, inrec);
            r = p & 1 ? live_rec(v->hnow[h]) : inrec[p / 2];
        } else if (v->hleaf[h]) {   /* the leaf's .grad this call (a new one after each zero_grad) */
            const ctpu_trec *leaf = live_rec(v->hleaf[h]);
            v->hnow[h] = leaf ? ctpu__ag_grad_id(leaf) : 0;
            r = live_rec(v->hnow[h]);
            if (!r) {
                snprintf(why, len, "captured tensor %s: %s, which the step %s", leaf ? "no .grad now" : "its leaf released",
                         v->hdesc ? v->hdesc[h] : "", v->hrole[h] & (H_ASSIGN | H_INPLACE) ? "assigns" : "reads");
                return false;
            }
        }
        v->hrec[h] = r;
        uint8_t f = v->hrole[h];
        if (r && r->buf) atomic_store_explicit(&r->buf->watched, true, memory_order_relaxed);
        else if (r) v->bindable = false;
        if (r && p < 0 && ctpu__ag_kind(r) != v->hag[h]) {
            /* a parameter frozen (or unfrozen) since: the capture's
             * backward made its .grad, eager's makes none (torch.compile
             * guards requires_grad: pytorch/pytorch#139476) */
            snprintf(why, len, "captured tensor %s %s now, %s at the capture", v->hdesc ? v->hdesc[h] : "",
                     ag_kind_now[ctpu__ag_kind(r)], ag_kind_was[v->hag[h]]);
            return false;
        }
        if (f == H_LEAF) continue;   /* only its .grad is written: a released leaf gets none */
        if (!r && p >= 0) {   /* the .grad's presence, per position */
            const char *nm = ctpu_rec_name(inrec[p / 2]);
            snprintf(why, len, "input %d%s%.64s%s has no .grad now, one at the capture (which the step %s)", p / 2,
                     nm[0] ? " (" : "", nm, nm[0] ? ")" : "",
                     f & (H_ASSIGN | H_INPLACE) ? "accumulates into" : "reads");
            return false;
        }
        if (!r || ctpu_rec_pending(r) || !r->buf) {
            snprintf(why, len, "captured tensor %s: %s, which the step %s", !r ? "released" : "pending elsewhere",
                     v->hdesc ? v->hdesc[h] : "", f & (H_ASSIGN | H_INPLACE) ? "assigns" : "reads");
            return false;
        }
        if (!(f & H_INPLACE)) continue;
        if (atomic_load_explicit(&r->buf->handle_refs, memory_order_relaxed) != 1) {
            const char *nm = ctpu_rec_name(r);
            snprintf(why, len, "tensor %.64s%sassigned in place shares its storage now", nm, nm[0] ? " " : "");
            return false;
        }
        if (atomic_load_explicit(&r->buf->trace_readers, memory_order_acquire) != 0) {
            const char *nm = ctpu_rec_name(r);
            snprintf(why, len, "tensor %.64s%sassigned in place is read by another thread's pending trace", nm,
                     nm[0] ? " " : "");
            return false;
        }
    }
    return true;
}

static bool inputs_not_inplace(const version *v, int n_in, const ctpu_tensor *in, char *why, size_t len)
{
    /* an input sharing an in-place target's storage: with that storage held
     * by one handle (checked above), the input is that handle */
    for (int i = 0; i < n_in && v->n_inplace; i++)
        if (ctpu__cs_is_inplace_target(v, in[i].id)) {
            snprintf(why, len, "input %d is the storage of a tensor the step assigns in place", i);
            return false;
        }
    for (int h = 0; h < v->n_h; h++)   /* an older leaf's .grad assigned in place: this call's */
        for (int i = 0; i < n_in && v->hleaf[h] && (v->hrole[h] & H_INPLACE); i++)
            if (in[i].id == v->hnow[h]) {
                snprintf(why, len, "input %d is the .grad %s, which the step assigns in place", i, v->hdesc ? v->hdesc[h] : "");
                return false;
            }
    for (int u = 0; u < v->n_prow; u++) {   /* an input leaf's .grad assigned in place: this call's */
        int h = v->prow[u];
        for (int i = 0; i < n_in && (v->hpos[h] & 1) && (v->hrole[h] & H_INPLACE); i++)
            if (in[i].id == v->hnow[h]) {
                snprintf(why, len, "input %d is input %d's .grad, which the step assigns in place", i, v->hpos[h] / 2);
                return false;
            }
    }
    return true;
}

/* Each leaf fn asked ctpu_grad of has a .grad as it had at the capture
 * (a .grad made, dropped or the leaf released bumps the binding epoch). */
static bool grads_seen_hold(version *v, char *why, size_t len)
{
    for (int i = 0; i < v->n_gobs; i++) {
        const ctpu_trec *leaf = live_rec(v->gobs[i].leaf);
        bool has = leaf && live_rec(ctpu__ag_grad_id(leaf));
        if (leaf && has == v->gobs[i].has) continue;
        char tb[64] = "";
        if (leaf) ctpu_fmt_type(&leaf->type, tb, sizeof tb);
        const char *nm = leaf ? ctpu_rec_name(leaf) : "";
        snprintf(why, len, "leaf (%s%s%.40s) %s, %s at the capture (fn reads its ctpu_grad)", tb, nm[0] ? " " : "", nm,
                 !leaf ? "released" : has ? "has a .grad now" : "has no .grad now", v->gobs[i].has ? "one" : "none");
        return false;
    }
    for (int i = 0; i < v->n_kobs; i++) {   /* (set_requires_grad bumps the binding epoch) */
        const ctpu_trec *r = live_rec(v->kobs[i].t);
        if (r && ctpu__ag_kind(r) == v->kobs[i].kind) continue;
        char tb[64] = "";
        if (r) ctpu_fmt_type(&r->type, tb, sizeof tb);
        const char *nm = r ? ctpu_rec_name(r) : "";
        snprintf(why, len, "tensor (%s%s%.40s) %s now, %s at the capture (fn reads its ctpu_requires_grad)", tb,
                 nm[0] ? " " : "", nm, r ? ag_kind_now[ctpu__ag_kind(r)] : "released", ag_kind_was[v->kobs[i].kind]);
        return false;
    }
    return true;
}

static bool no_grad_holds(version *v, ctpu_trec *const *inrec, char *why, size_t len)
{
    for (int i = 0; i < v->n_no_grad; i++) {
        int k = v->no_grad_in[i];   /* an input leaf: the call's in[k], per position */
        const ctpu_trec *leaf = k >= 0 ? inrec[k] : live_rec(v->no_grad_leaf[i]);
        if (!leaf) {
            snprintf(why, len, "a leaf whose .grad the step makes was released");
            return false;
        }
        if (leaf->buf) atomic_store_explicit(&leaf->buf->watched, true, memory_order_relaxed);
        else v->bindable = false;
        if (live_rec(ctpu__ag_grad_id(leaf))) {
            const char *nm = ctpu_rec_name(leaf);
            char at[96];
            if (k >= 0) snprintf(at, sizeof at, "input %d%s%.64s%s ", k, nm[0] ? " (" : "", nm, nm[0] ? ")" : "");
            else snprintf(at, sizeof at, "%.64s%s", nm, nm[0] ? " " : "");
            snprintf(why, len, "leaf %shas a .grad now, none at the capture (backward would accumulate)", at);
            return false;
        }
    }
    return true;
}

/* ------------------------------------------------------------ replay */
typedef struct {
    version *v;
    const ctpu_tensor *in;     /* the call's inputs */
    ctpu_trec *const *inrec;
    ctpu_buffer **outb;        /* v's arrays */
    size_t *outo;
    uint8_t *outk;
    ctpu_buffer *scratch;      /* v's */
    ctpu_cmd cmd;
    char err[256];
} replay_ctx;

/* The refs a call took: only fresh buffers' (a held or reused one is held
 * by its handle through the call; the command needs no ref: a buffer
 * released while a queued command uses it is freed after that command). */
static void release_fresh(replay_ctx *x)
{
    const version *v = x->v;
    for (int i = 0; i < v->n_fresh; i++) {
        int o = v->fresh_o[i];
        if (x->outk[o] == OUT_FRESH) ctpu_buffer_release(ctpu_rt->dev, x->outb[o]);
    }
}

static void replay_unwind(replay_ctx *x)
{
    release_fresh(x);
    if (x->cmd.one_block) free(x->cmd.buf);
}

/* The program's scratch buffer, kept across replays. */
static bool replay_scratch(replay_ctx *x, const ctpu_program *prog)
{
    version *v = x->v;
    if (prog->prog.n_virtual > 0) {
        if (!v->scratch) {
            v->scratch = ctpu_buffer_alloc(ctpu_rt->dev, prog->prog.scratch_bytes, x->err, sizeof x->err);
            if (!v->scratch) return false;
        }
        x->scratch = v->scratch;
    }
    return true;
}

/* Output buffers: an assigned tensor's own, the old .grad's (nothing else
 * holds it), or fresh. */
static bool replay_outputs(replay_ctx *x, const ctpu_program *prog)
{
    version *v = x->v;
    if (v->bound) {
        /* the binding cache: the held outputs' storage and each reused old
         * .grad are the last call's; only the fresh ones are new */
        for (int i = 0; i < v->n_fresh; i++) {
            int o = v->fresh_o[i];
            if (x->outk[o] == OUT_REUSED) continue;
            x->outk[o] = 0;
            x->outo[o] = 0;
            x->outb[o] = ctpu_buffer_alloc(ctpu_rt->dev, v->out_bytes[o], x->err, sizeof x->err);
            if (!x->outb[o]) return false;
            x->outk[o] = OUT_FRESH;
        }
        return replay_scratch(x, prog);
    }
    for (int i = 0; i < v->n_fresh; i++) x->outk[v->fresh_o[i]] = 0;
    for (int o = 0; o < v->n_pout; o++) {
        int hs = v->held_hs[o];
        if (hs < 0) continue;
        const ctpu_trec *r = v->hrec[hs];
        x->outb[o] = r->buf;
        x->outo[o] = r->off;
    }
    for (int i = 0; i < v->n_fresh; i++) {
        int o = v->fresh_o[i];
        if (v->grad_rq[o] >= 0) {
            const ctpu_trec *leaf = v->hrec[v->rq[v->grad_rq[o]].hs];
            ctpu_trec *gr = leaf ? live_rec(ctpu__ag_grad_id(leaf)) : NULL;
            if (gr && !ctpu_rec_pending(gr) && gr->buf && atomic_load(&gr->buf->handle_refs) == 1 &&
                vtype_eq(&gr->type, &v->rq[v->grad_rq[o]].type)) {
                atomic_store_explicit(&gr->buf->watched, true, memory_order_relaxed);
                x->outb[o] = gr->buf;
                x->outo[o] = gr->off;
                x->outk[o] = OUT_REUSED;
                continue;
            }
        }
        x->outo[o] = 0;
        x->outb[o] = ctpu_buffer_alloc(ctpu_rt->dev, v->out_bytes[o], x->err, sizeof x->err);
        if (!x->outb[o]) return false;
        x->outk[o] = OUT_FRESH;
    }
    return replay_scratch(x, prog);
}

/* The command's arrays: inline when they fit, else one heap block (buffers,
 * offsets, then the scalars when they do not fit inline) the device frees. */
static bool cmd_arrays(ctpu_cmd *cmd, int nb, int n_sc)
{
    cmd->n_bufs = nb;
    cmd->one_block = nb > CTPU_CMD_INLINE_BUFS || n_sc > CTPU_CMD_MAX_SCALARS;
    if (!cmd->one_block) {
        cmd->buf = cmd->buf_inl;
        cmd->off = cmd->off_inl;
        cmd->scalars = cmd->scal_inl;
        return true;
    }
    size_t sc_bytes = n_sc > CTPU_CMD_MAX_SCALARS ? sizeof(double) * (size_t)n_sc : 0;
    char *blk = malloc((sizeof(ctpu_buffer *) + sizeof(size_t)) * (size_t)nb + sc_bytes);
    if (!blk) {
        cmd->one_block = false;
        return false;
    }
    _Static_assert(sizeof(ctpu_buffer *) == sizeof(size_t) && sizeof(double) == sizeof(size_t), "one block's alignment");
    cmd->buf = (ctpu_buffer **)(void *)blk;
    cmd->off = (size_t *)(void *)(blk + sizeof(ctpu_buffer *) * (size_t)nb);
    cmd->scalars = sc_bytes ? (double *)(void *)(blk + (sizeof(ctpu_buffer *) + sizeof(size_t)) * (size_t)nb)
                            : cmd->scal_inl;
    return true;
}

static bool replay_cmd(replay_ctx *x, const ctpu_program *prog, const double *scalars)
{
    const version *v = x->v;
    ctpu_cmd *cmd = &x->cmd;
    int nb = v->n_pin + v->n_pout + (x->scratch ? 1 : 0);
    cmd->prog = &prog->prog;
    if (!cmd_arrays(cmd, nb, v->n_psc)) {
        snprintf(x->err, sizeof x->err, "out of host memory");
        return false;
    }
    ctpu_buffer **cb = cmd->buf;
    size_t *co = cmd->off;
    if (v->bound) {
        /* the binding cache: the handles' inputs are the last call's */
        memcpy(cb, v->pin_b, sizeof *cb * (size_t)v->n_pin);
        memcpy(co, v->pin_o, sizeof *co * (size_t)v->n_pin);
        for (int u = 0; u < v->n_pin_user; u++) {
            int k = v->pin_user[u];
            const in_src *s = &v->in[k];
            const ctpu_trec *r = x->inrec[s->idx];
            cb[k] = r->buf;
            co[k] = (size_t)((int64_t)r->off + s->delta);
        }
    } else {
        for (int k = 0; k < v->n_pin; k++) {
            const in_src *s = &v->in[k];
            const ctpu_trec *r = s->kind == IN_OWNER ? v->hrec[s->hs] : s->kind == IN_USER ? x->inrec[s->idx] : NULL;
            cb[k] = r ? r->buf : s->buf;
            co[k] = (size_t)((int64_t)(r ? r->off : 0) + s->delta);
        }
        memcpy(v->pin_b, cb, sizeof *cb * (size_t)v->n_pin);
        memcpy(v->pin_o, co, sizeof *co * (size_t)v->n_pin);
    }
    memcpy(cb + v->n_pin, x->outb, sizeof *cb * (size_t)v->n_pout);
    memcpy(co + v->n_pin, x->outo, sizeof *co * (size_t)v->n_pout);
    if (x->scratch) { cb[nb - 1] = x->scratch; co[nb - 1] = 0; }
    if (v->n_psc) memcpy(cmd->scalars, v->sc_tmpl, sizeof(double) * (size_t)v->n_psc);
    for (int d = 0; d < v->n_dyn; d++) {
        const sc_src *s = &v->sc[v->sc_dyn[d]];
        if (s->kind == SC_ARG) cmd->scalars[v->sc_dyn[d]] = s->trunc ? trunc(scalars[s->idx]) + 0.0 : scalars[s->idx];
    }
    for (int k = 0; k < v->n_rng; k++) {
        /* as fn would, in order: each draw's seed and offset, into its
         * slots (kept in the note: an alias reads an earlier draw's) */
        rng_note *g = &v->rng[k];
        uint64_t seed, off;
        if (g->alias >= 0) {
            seed = v->rng[g->alias].seed;
            off = v->rng[g->alias].off;
        } else {
            ctpu__rng_take(g->n, &seed, &off);
            g->seed = seed;
            g->off = off;
        }
        if (g->s < 0) continue;
        for (int d = 0; d < v->n_dyn; d++) {
            const sc_src *s = &v->sc[v->sc_dyn[d]];
            if (s->idx != k || (s->kind != SC_SEED && s->kind != SC_OFF)) continue;
            cmd->scalars[v->sc_dyn[d]] = ctpu_bits_scalar(s->kind == SC_SEED ? seed : off);
        }
    }
    cmd->debug_checks = v->dbg;
    cmd->program_id = v->program_id;
    if (v->prov) {   /* borrowed: the version frees it after the last command that read it */
        cmd->prov = v->prov;
        cmd->n_prov = v->n_prov;
        cmd->prov_span = v->prov_span;
        cmd->prov_shared = true;
    }
    return true;
}

/* out[j] a view fn made: a new handle on this call's storage. */
static ctpu_tensor publish_view(const replay_ctx *x, int j)
{
    const version *v = x->v;
    int bs = v->out_vbase[j];
    const ctpu_trec *b = bs >= 0 ? x->inrec[bs] : v->hrec[-2 - bs];
    ctpu_buffer_retain(b->buf);
    return ctpu_handle_new(&v->out_vtype[j], b->buf, (size_t)((int64_t)b->off + v->out_vdelta[j]), "compiled_call");
}

/* Rebound tensors take their new storage; new .grads are set. */
static void publish_requests(replay_ctx *x)
{
    const version *v = x->v;
    ctpu_device *dev = ctpu_rt->dev;
    for (int p = 0; p < v->n_pub; p++) {
        const rq_t *r = &v->rq[v->pub_q[p]];
        ctpu_buffer *b = x->outb[r->out];
        size_t bo = x->outo[r->out];
        if (r->kind == RQ_REBIND) {
            ctpu_trec *t = v->hrec[r->hs];
            if (t->buf == b) continue;
            ctpu_buffer_bind_touch(t->buf);
            ctpu_buffer_retain(b);
            atomic_fetch_add(&b->handle_refs, 1);
            atomic_fetch_sub(&t->buf->handle_refs, 1);
            ctpu_buffer_release(dev, t->buf);
            t->buf = b;
            t->off = bo;
            continue;
        }
        if (x->outk[r->out] == OUT_REUSED) continue;       /* RQ_GRAD written into the old .grad */
        ctpu_buffer_retain(b);
        ctpu_tensor g = ctpu_handle_new(&r->type, b, bo, "compiled_call");
        if (!ctpu_is_null(g) && !ctpu__ag_set_grad((ctpu_tensor){ v->hnow[r->hs] }, g)) ctpu_release(g);
    }
}

/* After the launch: out[j] handles, rebound tensors, new .grads. Views of
 * a tensor's storage at the call's start are made before its rebind. */
static void replay_publish(replay_ctx *x, ctpu_tensor *out)
{
    const version *v = x->v;
    for (int j = 0; j < v->n_out_user; j++)
        if (v->out_vbase[j] != -1 && v->out_vold[j]) out[j] = publish_view(x, j);
    publish_requests(x);
    for (int j = 0; j < v->n_out_user; j++) {
        if (v->out_vbase[j] != -1) {   /* a view: on this call's storage */
            if (!v->out_vold[j]) out[j] = publish_view(x, j);
            continue;
        }
        if (v->out_cbuf[j]) {   /* host data fn made: a new handle on the constant */
            ctpu_buffer_retain(v->out_cbuf[j]);
            out[j] = ctpu_handle_new(&v->out_vtype[j], v->out_cbuf[j], (size_t)v->out_vdelta[j], "compiled_call");
            continue;
        }
        out[j] = v->out_in[j] >= 0 ? x->in[v->out_in[j]] : (ctpu_tensor){ v->out_fixed[j] };
        if (v->out_prow[j] >= 0) out[j] = (ctpu_tensor){ v->hnow[v->out_prow[j]] };
        int q = v->out_rq[j];
        if (v->out_grad[j] >= 0) {   /* the .grad set above (or the old one written into) */
            q = v->out_grad[j];
            const ctpu_trec *leaf = v->hrec[v->rq[q].hs];
            uint64_t g = leaf ? ctpu__ag_grad_id(leaf) : 0;
            if (g) { out[j] = (ctpu_tensor){ g }; continue; }
            for (int i = 0; i < j; i++)   /* a released leaf gets none: a handle on the output, as before */
                if (v->out_grad[i] == q) { q = -1; out[j] = out[i]; break; }
        }
        if (q < 0) continue;
        int first = j;
        for (int i = 0; i < j; i++)
            if (v->out_rq[i] == q) { first = i; break; }
        if (first != j) { out[j] = out[first]; continue; }
        ctpu_buffer *b = x->outb[v->rq[q].out];
        ctpu_buffer_retain(b);
        out[j] = ctpu_handle_new(&v->rq[q].type, b, x->outo[v->rq[q].out], "compiled_call");
    }
}

/* One launch of a version's program (held by the version: an evicted one
 * still runs, freed after its holder lets go and its last command ran). */
ctpu_status ctpu__cs_replay(version *v, const ctpu_tensor *in, ctpu_trec *const *inrec, const double *scalars,
                              ctpu_tensor *out)
{
    ctpu_runtime *rt = ctpu_rt;
    ctpu_program *prog = v->run ? v->run : v->prog;   /* a dynamic program's launch at these extents, or the program */
    replay_ctx x = { .v = v, .in = in, .inrec = inrec, .outb = v->outb, .outo = v->outo, .outk = v->outk };
    ctpu_status st = CTPU_OK;
    if (!replay_outputs(&x, prog) || !replay_cmd(&x, prog, scalars)) {
        st = CTPU_ERR_OOM;
        replay_unwind(&x);
    }
    if (st == CTPU_OK) {
        uint64_t seq = ctpu_device_submit(rt->dev, &x.cmd);   /* the command owns heap arrays now */
        if (v->prov) v->prov_seq = seq;
        ctpu_program_note_submit(prog, seq);
        if (prog != v->prog) ctpu_program_note_submit(v->prog, seq);   /* the bound launch reads its tables */
        ctpu_metrics *m = &rt->metrics;
        ctpu_counter_add(m, CTPU_CTR_PROGRAMS_LAUNCHED, 1);
        ctpu_counter_add(m, CTPU_CTR_FUSED_STEPS, prog->prog.n_steps);
        ctpu_counter_add(m, CTPU_CTR_CACHE_REQUESTS, 1);
        ctpu_counter_add(m, CTPU_CTR_FUSED_CACHE_REQUESTS, 1);
        ctpu_counter_add(m, CTPU_CTR_CACHE_HITS, 1);
        ctpu_counter_add(m, CTPU_CTR_FUSED_CACHE_HITS, 1);
        /* report.c: a launch of the program, its ops and estimate (a bound
         * dynamic launch at its own extents) */
        if (v->run || ctpu_program_dyn_trace(v->prog)) ctpu__report_replay_bound(v->program_id, prog);
        else ctpu__report_replay(v->program_id);
        replay_publish(&x, out);
        release_fresh(&x);
        /* bound while nothing bumped the epoch since the guards read it
         * (this call's own rebinds and new .grads do) */
        uint64_t e = atomic_load(&ctpu__bind_epoch);
        v->bound = v->bindable && e == v->check_epoch;
        v->bound_epoch = e;
    } else {
        v->bound = false;
        ctpu_set_error(st, "compiled_call: program %llu: %s", (unsigned long long)v->program_id, x.err);
    }
    return st;
}

