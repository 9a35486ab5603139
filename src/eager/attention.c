/* scaled_dot_product_attention: validation, the forward node and the
 * backward node its gradient rule (autograd.c) dispatches.
 *
 * A node has one output, so each of the two nodes packs its results into one
 * flat f32 value and the caller takes contiguous slices of it (views in
 * eager; in defer and fuse, copies of the [B,H,T,Dh] parts, never of
 * anything [T,T]-sized):
 *   scaled_dot_product_attention: o [B,H,Tq,Dh] then lse [B,H,Tq];
 *   sdpa_backward:                dq [B,H,Tq,Dh], dk then dv [B,H,Tk,Dh].
 * Inputs: q, k, v (backward: then the forward's packed output and its
 * gradient), the mask last when there is one. Attributes (part of the key):
 * i64[0] the kernel's mask kind, i64[1] causal, i64[2] the layout
 * (CTPU_K_ATTN_BTHD: ctpu_scaled_dot_product_attention_bthd's q, k, v, o,
 * dq, dk, dv are [B,T,H,Dh]; lse stays [B,H,Tq]), extra the precision.
 * Runtime scalars: seed, offset (bits), dropout p, scale. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "eager.h"
#include "fuse/exec.h"

static const char *const OPN = "scaled_dot_product_attention";

static int64_t numel4(const ctpu_vtype *t) { return ctpu_vtype_numel(t); }

/* q, k, v, mask against the rules of ctpu.h; sets the error. bthd: q is
 * [B,Tq,H,Dh], k and v [B,Tk,H,Dh] (else [B,H,T,Dh]). */
static bool check_qkv(ctpu_trec *const *in, const ctpu_trec *mask, bool bthd)
{
    const ctpu_vtype *q = &in[0]->type, *k = &in[1]->type, *v = &in[2]->type;
    char a[128], b[128], c[128];
    ctpu_fmt_type(q, a, sizeof a);
    ctpu_fmt_type(k, b, sizeof b);
    ctpu_fmt_type(v, c, sizeof c);
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: q is %s, k is %s, v is %s: need 4-D %s tensors", OPN, a, b, c,
                       bthd ? "[B,T,H,Dh]" : "[B,H,T,Dh]");
        return false;
    }
    if (q->dtype == CTPU_I32 || q->dtype != k->dtype || q->dtype != v->dtype) {
        ctpu_set_error(CTPU_ERR_DTYPE, "%s: q is %s, k is %s, v is %s: need one dtype, f32 or bf16", OPN, a, b, c);
        return false;
    }
    int hd = bthd ? 2 : 1, td = 3 - hd;   /* H's and T's dims */
    bool same = q->shape[0] == k->shape[0] && q->shape[hd] == k->shape[hd] && q->shape[3] == k->shape[3];
    for (int d = 0; d < 4; d++) same = same && k->shape[d] == v->shape[d];
    if (!same || q->shape[3] < 1) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: q is %s, k is %s, v is %s: need q %s, k and v %s, Dh >= 1", OPN, a, b,
                       c, bthd ? "[B,Tq,H,Dh]" : "[B,H,Tq,Dh]", bthd ? "[B,Tk,H,Dh]" : "[B,H,Tk,Dh]");
        return false;
    }
    if (!mask) return true;
    const ctpu_vtype *m = &mask->type;
    char mb[128];
    ctpu_fmt_type(m, mb, sizeof mb);
    if (m->dtype != CTPU_F32) {
        ctpu_set_error(CTPU_ERR_DTYPE, "%s: mask is %s: need f32", OPN, mb);
        return false;
    }
    int64_t full[4] = { q->shape[0], q->shape[hd], q->shape[td], k->shape[td] };
    bool ok = m->ndim <= 4;
    for (int d = 0; ok && d < m->ndim; d++) {
        int64_t e = m->shape[d], want = full[d + 4 - m->ndim];
        ok = e == want || e == 1;
    }
    if (!ok) {
        ctpu_set_error(CTPU_ERR_SHAPE, "%s: mask is %s, q is %s, k is %s: the mask must broadcast to [%lld,%lld,%lld,%lld]",
                       OPN, mb, a, b, (long long)full[0], (long long)full[1], (long long)full[2], (long long)full[3]);
        return false;
    }
    return true;
}

/* The dynamic dims (ctpu_mark_dynamic, defer and fuse) of a packed value:
 * its extent B·H·Tq·D + B·H·Tq (forward) or B·H·Tq·D + 2·B·H·Tk·D
 * (backward), each dim of q, k and v its static extent or coef × s. It is
 * c × s when every dynamic dim of q, k and v is one symbol (one range, one
 * s) and the extent is linear in s (the terms' coefficients are
 * nonnegative, so f(0) = 0 and f(2) = 2 f(1) say it is); else the value is
 * static: a program per extent, never a guess. The guess defer.c made from
 * the first input with one symbol gave a cross attention's backward (Tq and
 * Tk two symbols) and a q-static, k-dynamic forward a wrong multiple, and
 * the parts' reshapes failed (tests/test_regress2.c class 78). */
static void packed_dyn(ctpu_trec *const *in, bool bthd, bool bwd, ctpu_dyndim *out)
{
    memset(out, 0, sizeof(ctpu_dyndim) * CTPU_MAX_DIMS);
    int64_t lo = 0, hi = 0, s = 0;
    for (int i = 0; i < 3; i++)
        for (int d = 0; in[i]->dyn && d < 4; d++) {
            const ctpu_dyndim *y = &in[i]->dyn[d];
            if (y->coef <= 0) continue;
            int64_t e = in[i]->type.shape[d];
            if (e % y->coef || (s && (y->lo != lo || y->hi != hi || e / y->coef != s))) return;   /* two symbols */
            lo = y->lo, hi = y->hi, s = e / y->coef;
        }
    if (!s) return;
    int hd = bthd ? 2 : 1, td = 3 - hd;
    int64_t f[3];
    for (int t = 0; t < 3; t++) {
        int64_t x[2][4];   /* q's and k's dims at s = t */
        for (int i = 0; i < 2; i++)
            for (int d = 0; d < 4; d++) {
                const ctpu_dyndim *y = in[i]->dyn ? &in[i]->dyn[d] : NULL;
                x[i][d] = y && y->coef > 0 ? y->coef * t : in[i]->type.shape[d];
            }
        int64_t bhq = x[0][0] * x[0][hd] * x[0][td];
        f[t] = bwd ? bhq * x[0][3] + 2 * x[1][0] * x[1][hd] * x[1][td] * x[1][3] : bhq * x[0][3] + bhq;
    }
    if (f[0] == 0 && f[1] > 0 && f[2] == 2 * f[1]) out[0] = (ctpu_dyndim){ lo, hi, f[1] };
}

/* ctpu_dispatch of a packed node n with its dynamic dims (packed_dyn's),
 * when some input has any (the mask's alone too: its symbol was guessed for
 * the flat value, and the o part's reshape to q's static shape failed), in
 * defer and fuse. */
static ctpu_tensor dispatch_packed(ctpu_node *n, ctpu_trec *const *in, const ctpu_tensor *ts, const double *sc,
                                   bool bthd, bool bwd)
{
    ctpu_thread_state *st = NULL;
    bool any = false;
    for (int i = 0; i < n->n_in; i++) any |= in[i]->dyn != NULL;
    if (any && ctpu_mode_now() == CTPU_MODE_DEFER_FUSE) st = ctpu__ts_get();
    if (st) {
        packed_dyn(in, bthd, bwd, st->dyn_out);
        st->dyn_out_set = true;
    }
    ctpu_tensor r = ctpu_dispatch(n, in, ts, sc);
    if (st) st->dyn_out_set = false;   /* (not left to the next op when the dispatch failed before recording) */
    return r;
}

/* The packed value's part [start, start + n) as `shape` (4-D), with the
 * dynamic dims of `from` (the input it has the shape of: the flat part's
 * one symbol cannot say which of [B, H, T, Dh] it is when T = B or H). */
static ctpu_tensor part(ctpu_tensor packed, int64_t start, const ctpu_vtype *like, const ctpu_trec *from)
{
    ctpu_tensor s = ctpu_slice(packed, 0, start, start + numel4(like), 1);
    ctpu_thread_state *ts = from && from->dyn ? ctpu__ts_get() : NULL;
    if (ts) ts->dyn_like = from;
    ctpu_tensor r = ctpu_reshape(s, like->ndim, like->shape);
    if (ts) ts->dyn_like = NULL;
    return r;
}

/* Dropout draws one number per probability, [B,H,Tq,Tk] of them (bhq =
 * B·H·Tq): within the element cap, as ctpu_dropout's [B,H,Tq,Tk] would be
 * (the count overflowed int64 past it, and advanced the generator by the
 * wrapped value); sets the error. */
static bool draws_ok(const ctpu_vtype *q, const ctpu_vtype *k, int64_t bhq, int64_t Tk, double p)
{
    if (bhq == 0 || Tk <= CTPU_NUMEL_CAP / bhq) return true;
    char a[128], b[128];
    ctpu_set_error(CTPU_ERR_SHAPE, "%s: q is %s, k is %s: dropout_p=%g draws B*H*Tq*Tk = %lld * %lld numbers, past the "
                   "2^56 element cap", OPN, ctpu_fmt_type(q, a, sizeof a), ctpu_fmt_type(k, b, sizeof b), p,
                   (long long)bhq, (long long)Tk);
    return false;
}

static ctpu_tensor sdpa(ctpu_tensor q, ctpu_tensor k, ctpu_tensor v, ctpu_tensor mask, ctpu_mask_kind mask_kind,
                        bool is_causal, double scale, double dropout_p, bool bthd)
{
    if (!ctpu_check_init(OPN)) return ctpu_failed();
    if ((unsigned)mask_kind > CTPU_MASK_NONE) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: mask_kind=%d is not CTPU_MASK_ADDITIVE, CTPU_MASK_KEEP01 or CTPU_MASK_NONE",
                       OPN, (int)mask_kind);
        return ctpu_failed();
    }
    if (mask_kind == CTPU_MASK_NONE && !ctpu_absent(mask)) {
        if (!ctpu_rec_get(mask, OPN, "mask", true)) return ctpu_failed();   /* an error handle: its cause */
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: a mask was given with mask_kind CTPU_MASK_NONE", OPN);
        return ctpu_failed();
    }
    if (mask_kind != CTPU_MASK_NONE && ctpu_absent(mask)) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: mask_kind %s needs a mask (CTPU_NULL was given)", OPN,
                       mask_kind == CTPU_MASK_ADDITIVE ? "CTPU_MASK_ADDITIVE" : "CTPU_MASK_KEEP01");
        return ctpu_failed();
    }
    if (!(dropout_p >= 0 && dropout_p < 1)) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: dropout_p=%g must be in [0, 1)", OPN, dropout_p);
        return ctpu_failed();
    }
    if (!(fabs(scale) <= FLT_MAX)) {   /* the kernel's scale is f32: 1e39 was inf there, every score inf or NaN */
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "%s: scale=%g must be finite as an f32 (|scale| <= %g; 0: 1/sqrt(Dh))",
                       OPN, scale, (double)FLT_MAX);
        return ctpu_failed();
    }
    bool has_mask = mask_kind != CTPU_MASK_NONE;
    ctpu_tensor ts[4] = { q, k, v, mask };
    static const char *const names[4] = { "q", "k", "v", "mask" };
    ctpu_trec *in[4];
    for (int i = 0; i < 3 + has_mask; i++)
        if (!(in[i] = ctpu_rec_get(ts[i], OPN, names[i], true))) return ctpu_failed();
    if (!check_qkv(in, has_mask ? in[3] : NULL, bthd)) return ctpu_failed();
    const ctpu_vtype *qt = &in[0]->type, *kt = &in[1]->type;
    int hd = bthd ? 2 : 1, td = 3 - hd;
    int64_t B = qt->shape[0], H = qt->shape[hd], Tq = qt->shape[td], Tk = kt->shape[td], D = qt->shape[3];
    ctpu_node n;
    memset(&n, 0, sizeof n);
    n.op = CTPU_OP_SDPA;
    n.n_in = (uint8_t)(3 + has_mask);
    n.n_scalars = 4;
    n.out.dtype = CTPU_F32;
    n.out.ndim = 1;
    n.out.shape[0] = B * H * Tq * D + B * H * Tq;
    n.attr.i64[0] = !has_mask ? CTPU_K_MASK_NONE : mask_kind == CTPU_MASK_ADDITIVE ? CTPU_K_MASK_ADD : CTPU_K_MASK_KEEP01;
    n.attr.i64[1] = is_causal;
    n.attr.i64[2] = bthd ? CTPU_K_ATTN_BTHD : CTPU_K_ATTN_BHTD;
    n.attr.extra = (int32_t)ctpu_rt->precision;
    uint64_t seed = 0, offset = 0;
    if (dropout_p > 0 && !draws_ok(qt, &in[1]->type, B * H * Tq, Tk, dropout_p)) return ctpu_failed();
    if (dropout_p > 0) ctpu__rng_take((uint64_t)(B * H * Tq * Tk), &seed, &offset);
    double sc[4] = { ctpu_bits_scalar(seed), ctpu_bits_scalar(offset), dropout_p,
                     scale == 0 ? 1.0 / sqrt((double)D) : scale };
    ctpu_vtype ot = *qt;
    ot.dtype = CTPU_F32;
    if (ctpu_scope_begin() != CTPU_OK) return ctpu_failed();
    ctpu_tensor packed = dispatch_packed(&n, in, ts, sc, bthd, false);
    ctpu_tensor o = ctpu_is_null(packed) ? packed : part(packed, 0, &ot, in[0]);
    if (!ctpu_is_null(o) && qt->dtype != CTPU_F32) o = ctpu_cast(o, (ctpu_dtype)qt->dtype);
    if (!ctpu_is_null(o)) o = ctpu_keep(o);
    ctpu_scope_end();
    return o;
}

ctpu_tensor ctpu_scaled_dot_product_attention(ctpu_tensor q, ctpu_tensor k, ctpu_tensor v, ctpu_tensor mask,
                                              ctpu_mask_kind mask_kind, bool is_causal, double scale,
                                              double dropout_p)
{
    return sdpa(q, k, v, mask, mask_kind, is_causal, scale, dropout_p, false);
}

ctpu_tensor ctpu_scaled_dot_product_attention_bthd(ctpu_tensor q, ctpu_tensor k, ctpu_tensor v, ctpu_tensor mask,
                                                   ctpu_mask_kind mask_kind, bool is_causal, double scale,
                                                   double dropout_p)
{
    ctpu_tensor o = sdpa(q, k, v, mask, mask_kind, is_causal, scale, dropout_p, true);
    if (!ctpu_is_null(o)) return o;
    /* its errors name it (sdpa's checks name the [B,H,T,Dh] op) */
    const char *m = ctpu_last_error();
    size_t n = strlen(OPN);
    ctpu_status st = ctpu_last_status();
    if (st != CTPU_OK && strncmp(m, OPN, n) == 0 && m[n] == ':') {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", m + n);
        ctpu_set_error(st, "%s_bthd%s", OPN, buf);
    }
    return o;
}

/* The backward rule's node (autograd.c's bw_sdpa): the gradients of q, k
 * and v (f32) from the forward node `fwd` (its attributes, its runtime
 * scalars `sc`), its inputs, its packed output and that output's gradient. */
bool ctpu__sdpa_backward(const ctpu_node *fwd, const double *sc, const ctpu_tensor *ins, ctpu_tensor out,
                         ctpu_tensor gout, ctpu_tensor *gq, ctpu_tensor *gk, ctpu_tensor *gv)
{
    int has_mask = fwd->n_in > 3;
    ctpu_tensor ts[6] = { ins[0], ins[1], ins[2], out, gout, has_mask ? ins[3] : CTPU_NULL };
    ctpu_trec *in[6];
    for (int i = 0; i < 5 + has_mask; i++)
        if (!(in[i] = ctpu_rec_get(ts[i], "sdpa_backward", "input", false))) return false;
    ctpu_vtype qt = in[0]->type, kt = in[1]->type;
    qt.dtype = kt.dtype = CTPU_F32;
    ctpu_node n;
    memset(&n, 0, sizeof n);
    n.op = CTPU_OP_SDPA_BACKWARD;
    n.n_in = (uint8_t)(5 + has_mask);
    n.n_scalars = 4;
    n.attr = fwd->attr;
    n.out.dtype = CTPU_F32;
    n.out.ndim = 1;
    n.out.shape[0] = numel4(&qt) + 2 * numel4(&kt);
    ctpu_tensor r = dispatch_packed(&n, in, ts, sc, fwd->attr.i64[2] == CTPU_K_ATTN_BTHD, true);
    if (ctpu_is_null(r)) return false;
    *gq = part(r, 0, &qt, in[0]);
    *gk = part(r, numel4(&qt), &kt, in[1]);
    *gv = part(r, numel4(&qt) + numel4(&kt), &kt, in[2]);
    return !ctpu_is_null(*gq) && !ctpu_is_null(*gk) && !ctpu_is_null(*gv);
}
