/* The reduction SIMD driver (sum / max / min / sqdev columns and softmax
 * rows), written once and stamped per ISA: included (once) by each ISA file
 * after its primitive layer (simd_x86.h). Defines the column kernels of
 * internal.h's ctpu_k_red_variant and the ISA's table ctpu_k_red_<isa>. No
 * include guard: a stamping template. Bit-identical to reduce_ref.c.
 *
 * The 16 virtual lanes of kernels.h's order are an RA: 16 / W vectors (two
 * ymm on AVX2, one zmm on AVX-512):
 *  - col1 (one contiguous column): element j of a chunk is lane j % 16 of the
 *    RA loaded from x + 16 * floor(j / 16); the lane tree's first step
 *    (l[i] op l[i+8]) is vfold8, the rest tree8;
 *  - colv (columns x[j*inner + c]): W columns per vector, acc[j % 16] is
 *    virtual lane j % 16; up to 16 columns are done W at a time.
 * Chunks combine by a binary-counter stack, which builds the nodes of the
 * pairwise tree. max/min: vmaxps/vminps equal `a > b ? a : b` /
 * `a < b ? a : b` for non-NaN inputs (the +-0 choice included); NaN is tracked
 * in a mask and forced at the end, since a NaN anywhere makes the column NaN.
 * Tail lanes are padded with the identity, which leaves every lane unchanged
 * (a sum lane is never -0: it starts at +0; a prod lane times 1 is itself,
 * -0 and NaN included). No FMA: sub, mul, add are separate roundings, as in
 * _ref. */

#define RH (CTPU_K_RED_LANES / W)
_Static_assert(RH == 1 || RH == 2, "the 16 lanes are one or two vectors");
typedef struct { V v[RH]; } RA;

AI int comb_op(int op) { return op >= CTPU_K_RED_SQDEV ? CTPU_K_RED_SUM : op; }
AI bool is_minmax(int op) { return op == CTPU_K_RED_MAX || op == CTPU_K_RED_MIN; }
AI float s_ident(int cop)
{
    return cop == CTPU_K_RED_MAX ? -INFINITY : cop == CTPU_K_RED_MIN ? INFINITY : cop == CTPU_K_RED_PROD ? 1.0f : 0.0f;
}
AI float s_comb(int cop, float a, float b)
{
    return cop == CTPU_K_RED_MAX ? (a > b ? a : b) : cop == CTPU_K_RED_MIN ? (a < b ? a : b)
         : cop == CTPU_K_RED_PROD ? a * b : a + b;
}
AI V v_comb(int cop, V a, V b)
{
    return cop == CTPU_K_RED_MAX ? vmax_raw(a, b) : cop == CTPU_K_RED_MIN ? vmin_raw(a, b)
         : cop == CTPU_K_RED_PROD ? vmul(a, b) : vadd(a, b);
}
/* The element transform of `op` (x -> (x - c)^2 for SQDEV). */
AI V v_elem(int op, V v, V vc)
{
    if (op == CTPU_K_RED_SQDEV) { v = vsub(v, vc); v = vmul(v, v); }
    return v;
}

/* ---- RA: the 16 virtual lanes ---------------------------------------------------- */
AI RA ra_set(float f)
{
    RA r;
    for (int h = 0; h < RH; h++) r.v[h] = vset(f);
    return r;
}
AI RA ra_ld(const float *p)
{
    RA r;
    for (int h = 0; h < RH; h++) r.v[h] = ld(p + h * W);
    return r;
}
/* Lanes >= cnt read as +0, their memory untouched. */
AI RA ra_ld_tail(const float *p, int64_t cnt)
{
    RA r;
    for (int h = 0; h < RH; h++) r.v[h] = ld_m(p + h * W, tail_mask(cnt - h * W));
    return r;
}
AI void ra_st(float *p, RA a)
{
    for (int h = 0; h < RH; h++) st(p + h * W, a.v[h]);
}
AI void ra_st_tail(float *p, int64_t cnt, RA a)
{
    for (int h = 0; h < RH; h++) st_m(p + h * W, tail_mask(cnt - h * W), a.v[h]);
}
/* Lanes >= cnt replaced by `fill`. */
AI RA ra_pad(RA a, int64_t cnt, RA fill)
{
    for (int h = 0; h < RH; h++) a.v[h] = vsel(tail_mask(cnt - h * W), a.v[h], fill.v[h]);
    return a;
}
AI RA ra_comb(int cop, RA a, RA b)
{
    for (int h = 0; h < RH; h++) a.v[h] = v_comb(cop, a.v[h], b.v[h]);
    return a;
}
AI RA ra_elem(int op, RA a, RA c)
{
    for (int h = 0; h < RH; h++) a.v[h] = v_elem(op, a.v[h], c.v[h]);
    return a;
}
AI RA ra_exp_sub(RA a, RA c)   /* exp(a - c) */
{
    for (int h = 0; h < RH; h++) a.v[h] = vexp(vsub(a.v[h], c.v[h]));
    return a;
}
AI M ra_nan(M nan, RA a)
{
    for (int h = 0; h < RH; h++) nan = m_or(nan, VCMP(a.v[h], a.v[h], _CMP_UNORD_Q));
    return nan;
}
/* The lane tree l[i] op= l[i+8], +4, +2, +1. */
AI float ra_tree(int cop, RA a)
{
    V b = a.v[0];
    if (RH == 2) b = v_comb(cop, b, a.v[RH - 1]);   /* two ymm: lo op hi is the +8 step */
    return tree8(cop, vfold8(cop, b));
}

AI int64_t chunk_len(int64_t n, int64_t k)
{
    int64_t j0 = k * CTPU_K_RED_CHUNK;
    return n - j0 < CTPU_K_RED_CHUNK ? n - j0 : CTPU_K_RED_CHUNK;
}

/* Push chunk value number t (0-based in the range) and merge full pairs. */
#define TREE_PUSH(stk, sp, t, val, comb)                                   \
    do {                                                                   \
        (stk)[(sp)++] = (val);                                             \
        for (int64_t t_ = (t) + 1; (t_ & 1) == 0; t_ >>= 1, (sp)--)        \
            (stk)[(sp) - 2] = comb((stk)[(sp) - 2], (stk)[(sp) - 1]);      \
    } while (0)
#define TREE_FINISH(stk, sp, comb)                                         \
    for (; (sp) > 1; (sp)--) (stk)[(sp) - 2] = comb((stk)[(sp) - 2], (stk)[(sp) - 1])

/* ---- one contiguous column -------------------------------------------------------- */
/* One chunk; returns the lane-tree value. */
AI float chunk1(int op, const float *x, int64_t len, RA vc, M *nan)
{
    const int cop = comb_op(op);
    RA id = ra_set(s_ident(cop)), acc = id;
    int64_t j = 0;
    for (; j + CTPU_K_RED_LANES <= len; j += CTPU_K_RED_LANES) {
        RA v = ra_elem(op, ra_ld(x + j), vc);
        if (is_minmax(op)) *nan = ra_nan(*nan, v);
        acc = ra_comb(cop, acc, v);
    }
    if (j < len) {
        RA v = ra_pad(ra_elem(op, ra_ld_tail(x + j, len - j), vc), len - j, id);
        if (is_minmax(op)) *nan = ra_nan(*nan, v);
        acc = ra_comb(cop, acc, v);
    }
    return ra_tree(cop, acc);
}

/* Four consecutive full chunks at once (independent chains, for ILP). */
AI void chunk4(int op, const float *x, RA vc, M *nan, float out[4])
{
    const int cop = comb_op(op);
    RA acc[4];
    for (int i = 0; i < 4; i++) acc[i] = ra_set(s_ident(cop));
    for (int64_t j = 0; j < CTPU_K_RED_CHUNK; j += CTPU_K_RED_LANES) {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            RA v = ra_elem(op, ra_ld(x + i * CTPU_K_RED_CHUNK + j), vc);
            if (is_minmax(op)) *nan = ra_nan(*nan, v);
            acc[i] = ra_comb(cop, acc[i], v);
        }
    }
    for (int i = 0; i < 4; i++) out[i] = ra_tree(cop, acc[i]);
}

AI float col1_impl(int op, const float *x, float c, int64_t n, int64_t k0, int64_t k1)
{
    const int cop = comb_op(op);
    if (k1 <= k0) return s_ident(cop);
    float stk[64];
    int sp = 0;
    M nan = m_zero();
    RA vc = ra_set(c);
#define COMB(a, b) s_comb(cop, a, b)
    int64_t k = k0;
    for (; k + 4 <= k1 && (k + 4) * CTPU_K_RED_CHUNK <= n; k += 4) {
        float v4[4];
        chunk4(op, x + k * CTPU_K_RED_CHUNK, vc, &nan, v4);
        for (int i = 0; i < 4; i++) TREE_PUSH(stk, sp, k + i - k0, v4[i], COMB);
    }
    for (; k < k1; k++) {
        float v = chunk1(op, x + k * CTPU_K_RED_CHUNK, chunk_len(n, k), vc, &nan);
        TREE_PUSH(stk, sp, k - k0, v, COMB);
    }
    TREE_FINISH(stk, sp, COMB);
#undef COMB
    return m_any(nan) ? NAN : stk[0];
}

/* Whole contiguous columns; a column of one chunk skips the chunk tree. */
AI void rows1_impl(int op, const float *x, const float *c, int64_t n, int64_t rows, float *y)
{
    int64_t m = (n + CTPU_K_RED_CHUNK - 1) / CTPU_K_RED_CHUNK;
    for (int64_t r = 0; r < rows; r++) {
        float cr = c ? c[r] : 0.0f;
        if (m == 1) {
            M nan = m_zero();
            float v = chunk1(op, x + r * n, n, ra_set(cr), &nan);
            y[r] = m_any(nan) ? NAN : v;
        } else {
            y[r] = col1_impl(op, x + r * n, cr, n, 0, m);
        }
    }
}

/* ---- columns at stride `inner` -------------------------------------------------------- */
/* Up to W columns (masked-off columns are computed on zeros and never stored). */
AI void colvW(int op, const float *x, const float *cv, int64_t n, int64_t inner, int ncols,
              int64_t k0, int64_t k1, float *out)
{
    const int cop = comb_op(op);
    M km = tail_mask(ncols);
    V vc = cv ? ld_m(cv, km) : vzero();
    V id = vset(s_ident(cop));
    V stk[64];
    int sp = 0;
    M nan = m_zero();
    V r = id;
#define COMB(a, b) v_comb(cop, a, b)
    for (int64_t k = k0; k < k1; k++) {
        const float *xc = x + k * CTPU_K_RED_CHUNK * inner;
        int64_t len = chunk_len(n, k);
        V acc[CTPU_K_RED_LANES];
#pragma GCC unroll 16
        for (int l = 0; l < CTPU_K_RED_LANES; l++) acc[l] = id;
        int64_t j = 0;
        for (; j + CTPU_K_RED_LANES <= len; j += CTPU_K_RED_LANES) {
#pragma GCC unroll 16
            for (int l = 0; l < CTPU_K_RED_LANES; l++) {
                V v = v_elem(op, ld_m(xc + (j + l) * inner, km), vc);
                if (is_minmax(op)) nan = m_or(nan, VCMP(v, v, _CMP_UNORD_Q));
                acc[l] = v_comb(cop, acc[l], v);
            }
        }
        int rem = (int)(len - j);
#pragma GCC unroll 16
        for (int l = 0; l < CTPU_K_RED_LANES; l++) {
            if (l < rem) {
                V v = v_elem(op, ld_m(xc + (j + l) * inner, km), vc);
                if (is_minmax(op)) nan = m_or(nan, VCMP(v, v, _CMP_UNORD_Q));
                acc[l] = v_comb(cop, acc[l], v);
            }
        }
#pragma GCC unroll 8
        for (int s = CTPU_K_RED_LANES / 2; s > 0; s /= 2)
#pragma GCC unroll 8
            for (int i = 0; i < s; i++) acc[i] = v_comb(cop, acc[i], acc[i + s]);
        TREE_PUSH(stk, sp, k - k0, acc[0], COMB);
    }
    if (sp) {
        TREE_FINISH(stk, sp, COMB);
        r = stk[0];
    }
#undef COMB
    r = vsel(nan, vset(NAN), r);
    st_m(out, km, r);
}

/* Columns shorter than the 16 lanes (one chunk: a sum over a batch of 2):
 * colvW's values without its loops. Lane l < n holds ident op x[l]; the
 * lanes >= n hold the identity, and a lane op the identity is that lane (the
 * file comment), so only the tree's combines of two such lanes are done, in
 * their places: the same bits. */
AI void colv_short(int op, const float *x, const float *cv, int n, int64_t inner, int ncols, float *out)
{
    const int cop = comb_op(op);
    for (int g = 0; g < ncols; g += W) {
        M km = tail_mask(ncols - g < W ? ncols - g : W);
        V vc = cv ? ld_m(cv + g, km) : vzero();
        V id = vset(s_ident(cop));
        V acc[CTPU_K_RED_LANES];
        M nan = m_zero();
#pragma GCC unroll 16
        for (int l = 0; l < CTPU_K_RED_LANES; l++) {
            if (l < n) {
                V v = v_elem(op, ld_m(x + g + l * inner, km), vc);
                if (is_minmax(op)) nan = m_or(nan, VCMP(v, v, _CMP_UNORD_Q));
                acc[l] = v_comb(cop, id, v);
            }
        }
        int live = n;
#pragma GCC unroll 8
        for (int s = CTPU_K_RED_LANES / 2; s > 0; s /= 2) {
#pragma GCC unroll 8
            for (int i = 0; i < s; i++)
                if (i + s < live) acc[i] = v_comb(cop, acc[i], acc[i + s]);
            if (live > s) live = s;
        }
        st_m(out + g, km, vsel(nan, vset(NAN), acc[0]));
    }
}

/* Up to CV_COLS adjacent columns in one sweep down the rows: each row's
 * ncols floats are read contiguously (CV_COLS * 4 bytes, not one 64-byte
 * line per row and pass as colvW does), the G = ceil(ncols / W) groups'
 * 16 lane accumulators held in L1 (acc[g][l] is colvW's acc[l] of group g:
 * the same operations in the same order, so the same bits). Chunk ranges
 * of at most 2^CV_DEPTH_LOG chunks (the stacks' depth). */
enum { CV_COLS = 128, CV_G = CV_COLS / W, CV_DEPTH_LOG = 20 };
AI void colvG(int op, const float *x, const float *cv, int64_t n, int64_t inner, int ncols,
              int64_t k0, int64_t k1, float *out)
{
    const int cop = comb_op(op);
    const int G = (ncols + W - 1) / W, Gf = ncols / W;   /* groups, full groups */
    const M kl = tail_mask(ncols - Gf * W);               /* the partial last group's lanes */
    const V id = vset(s_ident(cop));
    V vc[CV_G];
    M nan[CV_G];
    for (int g = 0; g < G; g++) {
        vc[g] = cv ? ld_m(cv + g * W, tail_mask(ncols - g * W)) : vzero();
        nan[g] = m_zero();
    }
    V acc[CV_G][CTPU_K_RED_LANES] __attribute__((aligned(64)));
    V stk[CV_DEPTH_LOG + 2][CV_G] __attribute__((aligned(64)));
    int sp = 0;
#define ROW(rp, l)                                                                   \
    do {                                                                             \
        for (int g = 0; g < Gf; g++) {                                               \
            V v_ = v_elem(op, ld((rp) + g * W), vc[g]);                              \
            if (is_minmax(op)) nan[g] = m_or(nan[g], VCMP(v_, v_, _CMP_UNORD_Q));     \
            acc[g][l] = v_comb(cop, acc[g][l], v_);                                  \
        }                                                                            \
        if (Gf < G) {                                                                \
            V v_ = v_elem(op, ld_m((rp) + Gf * W, kl), vc[Gf]);                      \
            if (is_minmax(op)) nan[Gf] = m_or(nan[Gf], VCMP(v_, v_, _CMP_UNORD_Q));   \
            acc[Gf][l] = v_comb(cop, acc[Gf][l], v_);                                \
        }                                                                            \
    } while (0)
    for (int64_t k = k0; k < k1; k++) {
        const float *xc = x + k * CTPU_K_RED_CHUNK * inner;
        int64_t len = chunk_len(n, k);
        for (int g = 0; g < G; g++)
            for (int l = 0; l < CTPU_K_RED_LANES; l++) acc[g][l] = id;
        int64_t j = 0;
        for (; j + CTPU_K_RED_LANES <= len; j += CTPU_K_RED_LANES) {
#pragma GCC unroll 16
            for (int l = 0; l < CTPU_K_RED_LANES; l++) ROW(xc + (j + l) * inner, l);
        }
        for (int l = 0; l < (int)(len - j); l++) ROW(xc + (j + l) * inner, l);
        for (int g = 0; g < G; g++) {
#pragma GCC unroll 8
            for (int s = CTPU_K_RED_LANES / 2; s > 0; s /= 2)
#pragma GCC unroll 8
                for (int i = 0; i < s; i++) acc[g][i] = v_comb(cop, acc[g][i], acc[g][i + s]);
            stk[sp][g] = acc[g][0];
        }
        sp++;
        for (int64_t t = k - k0 + 1; (t & 1) == 0; t >>= 1, sp--)
            for (int g = 0; g < G; g++) stk[sp - 2][g] = v_comb(cop, stk[sp - 2][g], stk[sp - 1][g]);
    }
#undef ROW
    for (; sp > 1; sp--)
        for (int g = 0; g < G; g++) stk[sp - 2][g] = v_comb(cop, stk[sp - 2][g], stk[sp - 1][g]);
    for (int g = 0; g < G; g++) {
        V r = sp ? stk[0][g] : id;
        r = vsel(nan[g], vset(NAN), r);
        st_m(out + g * W, tail_mask(ncols - g * W), r);
    }
}

AI void colv_impl(int op, const float *x, const float *cv, int64_t n, int64_t inner, int ncols,
                  int64_t k0, int64_t k1, float *out)
{
    if (k0 == 0 && k1 == 1 && n < CTPU_K_RED_LANES) {
        colv_short(op, x, cv, (int)n, inner, ncols, out);
        return;
    }
    if (ncols > W && k1 - k0 <= ((int64_t)1 << CV_DEPTH_LOG)) {
        for (int c = 0; c < ncols; c += CV_COLS)
            colvG(op, x + c, cv ? cv + c : NULL, n, inner, ncols - c < CV_COLS ? ncols - c : CV_COLS, k0, k1,
                  out + c);
        return;
    }
    for (int g = 0; g < ncols; g += W)
        colvW(op, x + g, cv ? cv + g : NULL, n, inner, ncols - g < W ? ncols - g : W, k0, k1,
              out + g);
}

/* ---- entry points: the op folded into a constant for each body -------------------- */
#define RED_OP_SWITCH(CALL)                                                                 \
    switch (op) {                                                                           \
    case CTPU_K_RED_SUM: CALL(CTPU_K_RED_SUM); break;                                       \
    case CTPU_K_RED_MAX: CALL(CTPU_K_RED_MAX); break;                                       \
    case CTPU_K_RED_MIN: CALL(CTPU_K_RED_MIN); break;                                       \
    case CTPU_K_RED_PROD: CALL(CTPU_K_RED_PROD); break;                                     \
    default: CALL(CTPU_K_RED_SQDEV); break;                                                 \
    }

static float red_col1(int op, const float *x, float c, int64_t n, int64_t k0, int64_t k1)
{
    float r = 0.0f;
#define CALL(o) r = col1_impl(o, x, c, n, k0, k1)
    RED_OP_SWITCH(CALL)
#undef CALL
    return r;
}

static void red_rows1(int op, const float *x, const float *c, int64_t n, int64_t rows, float *y)
{
#define CALL(o) rows1_impl(o, x, c, n, rows, y)
    RED_OP_SWITCH(CALL)
#undef CALL
}

static void red_colv(int op, const float *x, const float *cv, int64_t n, int64_t inner, int ncols,
                     int64_t k0, int64_t k1, float *out)
{
#define CALL(o) colv_impl(o, x, cv, n, inner, ncols, k0, k1, out)
    RED_OP_SWITCH(CALL)
#undef CALL
}

/* softmax / log_softmax of one row (n > 0): m = max, e = exp(x - m) summed
 * in the order (stored to y for softmax), then y = e / s or (x - m) - log s. */
static void red_softmax_row(const float *x, int64_t n, float *y, bool log)
{
    int64_t m = (n + CTPU_K_RED_CHUNK - 1) / CTPU_K_RED_CHUNK;
    float mx;
    if (m == 1) {
        M nan = m_zero();
        mx = chunk1(CTPU_K_RED_MAX, x, n, ra_set(0.0f), &nan);
        if (m_any(nan)) mx = NAN;
    } else {
        mx = col1_impl(CTPU_K_RED_MAX, x, 0.0f, n, 0, m);
    }
    RA vm = ra_set(mx), zero = ra_set(0.0f);
    float stk[64] = { 0.0f };
    int sp = 0;
#define COMB(a, b) ((a) + (b))
    for (int64_t k = 0; k < m; k++) {
        const float *xc = x + k * CTPU_K_RED_CHUNK;
        float *yc = y + k * CTPU_K_RED_CHUNK;
        int64_t len = chunk_len(n, k), j = 0;
        RA acc = zero;
        for (; j + CTPU_K_RED_LANES <= len; j += CTPU_K_RED_LANES) {
            RA e = ra_exp_sub(ra_ld(xc + j), vm);
            if (!log) ra_st(yc + j, e);
            acc = ra_comb(CTPU_K_RED_SUM, acc, e);
        }
        if (j < len) {
            RA e = ra_exp_sub(ra_ld_tail(xc + j, len - j), vm);
            if (!log) ra_st_tail(yc + j, len - j, e);
            acc = ra_comb(CTPU_K_RED_SUM, acc, ra_pad(e, len - j, zero));
        }
        TREE_PUSH(stk, sp, k, ra_tree(CTPU_K_RED_SUM, acc), COMB);
    }
    TREE_FINISH(stk, sp, COMB);
#undef COMB
    float s = stk[0];
    V vm1 = vset(mx);
    int64_t j = 0;
    if (!log) {
        V vs = vset(s);
        for (; j + W <= n; j += W) st(y + j, vdiv(ld(y + j), vs));
        if (j < n) {
            M km = tail_mask(n - j);
            st_m(y + j, km, vdiv(ld_m(y + j, km), vs));
        }
    } else {
        V vl = vlog(vset(s));
        for (; j + W <= n; j += W) st(y + j, vsub(vsub(ld(x + j), vm1), vl));
        if (j < n) {
            M km = tail_mask(n - j);
            st_m(y + j, km, vsub(vsub(ld_m(x + j, km), vm1), vl));
        }
    }
}

const ctpu_k_red_variant CTPU_K_PASTE(ctpu_k_red_, CTPU_K_ISA) = {
    .rows1 = red_rows1, .col1 = red_col1, .colv = red_colv, .softmax_row = red_softmax_row,
};
