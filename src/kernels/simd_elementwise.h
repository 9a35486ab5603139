/* The elementwise SIMD driver, written once and stamped per ISA: included
 * (once) by each ISA file after its primitive layer (simd_x86.h lists what it
 * must define). Defines the kernel ops over that layer, one loop per op of
 * CTPU_K_UNARY_OPS / CTPU_K_BINARY_OPS, where, clamp, the conversions, and
 * the ISA's table ctpu_k_ew_<isa>. No include guard: a stamping template.
 *
 * Each op below is the definition of kernels.h, the operations in _ref's
 * order (elementwise_ref.c), each rounded to f32: the variant equals _ref bit
 * for bit (NaN as a class). The table is built from the X-macros, so an op of
 * the X-macro without its u_ / b_ function here is a build error.
 * Any n: a 4-vector unrolled main loop, then one vector at a time, then a
 * masked tail. */

/* ---- unary ops ------------------------------------------------------------------ */
AI V u_NEG(V x) { return vneg(x); }
AI V u_ABS(V x) { return vabs(x); }
AI V u_EXP(V x) { return vexp(x); }
AI V u_LOG(V x) { return vlog(x); }
AI V u_SQRT(V x) { return vsqrt(x); }
AI V u_RSQRT(V x) { return vdiv(vset(1.0f), vsqrt(x)); }
AI V u_TANH(V x) { return vtanh(x); }
AI V u_SIGMOID(V x) { return vdiv(vset(1.0f), vadd(vset(1.0f), vexp(vneg(x)))); }
AI V u_RELU(V x) { return vmaskz(m_or(VCMP(x, vzero(), _CMP_GT_OQ), VCMP(x, x, _CMP_UNORD_Q)), x); }
AI V u_GELU_TANH(V x)
{
    V x3 = vmul(vmul(x, x), x);
    V inner = vmul(vset(0.7978845608f), vadd(x, vmul(vset(0.044715f), x3)));
    return vmul(vmul(vset(0.5f), x), vadd(vset(1.0f), vtanh(inner)));
}
/* elementwise_ref.c's ref_u_GELU_ERF: the ISA's double steps (vgelu_erf) */
AI V u_GELU_ERF(V x) { return vgelu_erf(x); }
AI V u_RECIP(V x) { return vdiv(vset(1.0f), x); }
AI V u_SQUARE(V x) { return vmul(x, x); }
AI V u_ROUND_BF16(V x) { return vround_bf16(x); }
AI V u_ERF(V x) { return verf(x); }
AI V u_SIN(V x) { return vsin(x); }
AI V u_COS(V x) { return vcos(x); }
AI V u_LOG1P(V x) { return vsel(VCMP(x, vset(1e38f), _CMP_GT_OQ), vlog(x), vlog1p(x)); }
AI V u_EXPM1(V x) { return vexpm1(x); }
AI V u_SOFTPLUS(V x) { return vsel(VCMP(x, vset(20.0f), _CMP_GT_OQ), x, vlog1p(vexp(x))); }

/* ---- binary ops ----------------------------------------------------------------- */
/* MAX/MIN: vmaxps(a, b) is a > b ? a : b (b when either is NaN or both are
 * zero); a NaN a is put back, so the result is NaN iff either input is. */
AI V vmax(V a, V b) { return vsel(VCMP(a, a, _CMP_UNORD_Q), a, vmax_raw(a, b)); }
AI V vmin(V a, V b) { return vsel(VCMP(a, a, _CMP_UNORD_Q), a, vmin_raw(a, b)); }
AI V vsel01(M m) { return vmaskz(m, vset(1.0f)); }

AI V b_ADD(V a, V b) { return vadd(a, b); }
AI V b_SUB(V a, V b) { return vsub(a, b); }
AI V b_MUL(V a, V b) { return vmul(a, b); }
AI V b_DIV(V a, V b) { return vdiv(a, b); }
AI V b_POW(V a, V b) { return vpow(a, b); }
AI V b_MAX(V a, V b) { return vmax(a, b); }
AI V b_MIN(V a, V b) { return vmin(a, b); }
AI V b_EQ(V a, V b) { return vsel01(VCMP(a, b, _CMP_EQ_OQ)); }
AI V b_NE(V a, V b) { return vsel01(VCMP(a, b, _CMP_NEQ_UQ)); }
AI V b_LT(V a, V b) { return vsel01(VCMP(a, b, _CMP_LT_OQ)); }
AI V b_LE(V a, V b) { return vsel01(VCMP(a, b, _CMP_LE_OQ)); }
AI V b_GT(V a, V b) { return vsel01(VCMP(a, b, _CMP_GT_OQ)); }
AI V b_GE(V a, V b) { return vsel01(VCMP(a, b, _CMP_GE_OQ)); }

/* ---- where, clamp ---------------------------------------------------------------- */
AI V where1(V c, V a, V b) { return vsel(VCMP(c, vzero(), _CMP_NEQ_UQ), a, b); }   /* NaN c: a */
AI V clamp1(V x, V lo, V hi) { return vmin(vmax(x, lo), hi); }

/* ---- loops ------------------------------------------------------------------------ */
/* The one loop of every elementwise kernel: y[i..] = CALL(fn, LD, i), with LD
 * loading the operands at element i: EW_LD full vectors, EW_LDM the tail
 * (mask m). The CALL forms name the operands of each kernel's signature. */
#define EW_LD(p) ld(p)
#define EW_LDM(p) ld_m((p), m)
#define EW_CALL_U(fn, LD, i) fn(LD(x + (i)))
#define EW_CALL_B(fn, LD, i) fn(LD(a + (i)), LD(b + (i)))
#define EW_CALL_AS(fn, LD, i) fn(LD(a + (i)), vs)
#define EW_CALL_SA(fn, LD, i) fn(vs, LD(a + (i)))
#define EW_CALL_WHERE(fn, LD, i) fn(LD(c + (i)), LD(a + (i)), LD(b + (i)))
#define EW_CALL_CLAMP(fn, LD, i) fn(LD(x + (i)), vl, vh)
#define EW_LOOP(CALL, fn)                                                                   \
    int64_t i = 0;                                                                          \
    for (; i + 4 * W <= n; i += 4 * W) {                                                    \
        V r0 = CALL(fn, EW_LD, i), r1 = CALL(fn, EW_LD, i + W);                             \
        V r2 = CALL(fn, EW_LD, i + 2 * W), r3 = CALL(fn, EW_LD, i + 3 * W);                 \
        st(y + i, r0); st(y + i + W, r1); st(y + i + 2 * W, r2); st(y + i + 3 * W, r3);     \
    }                                                                                       \
    for (; i + W <= n; i += W) st(y + i, CALL(fn, EW_LD, i));                               \
    if (i < n) {                                                                            \
        M m = tail_mask(n - i);                                                             \
        st_m(y + i, m, CALL(fn, EW_LDM, i));                                                \
    }

/* GELU_ERF with the ISA's two-vector form (VGELU_ERF_X2): 4 vectors an
 * iteration as two interleaved pairs, the same operations per lane */
#ifdef VGELU_ERF_X2
static void gelu_erf_loop(const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        V r0 = ld(x + i), r1 = ld(x + i + W), r2 = ld(x + i + 2 * W), r3 = ld(x + i + 3 * W);
        vgelu_erf_x2(&r0, &r1);
        vgelu_erf_x2(&r2, &r3);
        st(y + i, r0); st(y + i + W, r1); st(y + i + 2 * W, r2); st(y + i + 3 * W, r3);
    }
    for (; i + 2 * W <= n; i += 2 * W) {
        V r0 = ld(x + i), r1 = ld(x + i + W);
        vgelu_erf_x2(&r0, &r1);
        st(y + i, r0); st(y + i + W, r1);
    }
    for (; i + W <= n; i += W) st(y + i, u_GELU_ERF(ld(x + i)));
    if (i < n) {
        M m = tail_mask(n - i);
        st_m(y + i, m, u_GELU_ERF(ld_m(x + i, m)));
    }
}
#define EW_GELU_ERF_LOOP(NAME, x, y, n) \
    if (CTPU_K_U_##NAME == CTPU_K_U_GELU_ERF) { gelu_erf_loop(x, y, n); return; }
#else
#define EW_GELU_ERF_LOOP(NAME, x, y, n)
#endif
#define EW_UNARY_LOOP(NAME)                                                                 \
    static void loop_u_##NAME(const float *x, float *y, int64_t n)                          \
    {                                                                                       \
        EW_GELU_ERF_LOOP(NAME, x, y, n)                                                     \
        EW_LOOP(EW_CALL_U, u_##NAME)                                                        \
    }
#define EW_BINARY_LOOPS(NAME)                                                               \
    static void loop_b_##NAME(const float *a, const float *b, float *y, int64_t n)          \
    {                                                                                       \
        EW_LOOP(EW_CALL_B, b_##NAME)                                                        \
    }                                                                                       \
    static void loop_as_##NAME(const float *a, float s, float *y, int64_t n)                \
    {                                                                                       \
        V vs = vset(s);                                                                     \
        EW_LOOP(EW_CALL_AS, b_##NAME)                                                       \
    }                                                                                       \
    static void loop_sa_##NAME(const float *a, float s, float *y, int64_t n)                \
    {                                                                                       \
        V vs = vset(s);                                                                     \
        EW_LOOP(EW_CALL_SA, b_##NAME)                                                       \
    }
CTPU_K_UNARY_OPS(EW_UNARY_LOOP)
CTPU_K_BINARY_OPS(EW_BINARY_LOOPS)

static void ew_where(const float *c, const float *a, const float *b, float *y, int64_t n)
{
    EW_LOOP(EW_CALL_WHERE, where1)
}

static void ew_clamp(const float *x, float lo, float hi, float *y, int64_t n)
{
    V vl = vset(lo), vh = vset(hi);
    EW_LOOP(EW_CALL_CLAMP, clamp1)
}

/* ---- conversions: two vectors a step, one, then the scalar definitions of
 * kernels.h for the last < W elements. ---------------------------------------------- */
#define EW_CONVERT(name, TI, TO, LDV, STV, SCALAR)                                          \
    static void name(const TI *x, TO *y, int64_t n)                                         \
    {                                                                                       \
        int64_t i = 0;                                                                      \
        for (; i + 2 * W <= n; i += 2 * W) {                                                \
            V v0 = LDV(x + i), v1 = LDV(x + i + W);                                         \
            STV(y + i, v0); STV(y + i + W, v1);                                             \
        }                                                                                   \
        for (; i + W <= n; i += W) STV(y + i, LDV(x + i));                                  \
        for (; i < n; i++) y[i] = SCALAR(x[i]);                                             \
    }
#define EW_I32_TO_F32(v) ((float)(v))   /* RNE, as cvtdq2ps */
EW_CONVERT(ew_bf16_to_f32, uint16_t, float, ld_bf16, st, ctpu_bf16_to_f32)
EW_CONVERT(ew_f32_to_bf16, float, uint16_t, ld, st_bf16, ctpu_f32_to_bf16)
EW_CONVERT(ew_i32_to_f32, int32_t, float, ld_i32, st, EW_I32_TO_F32)
EW_CONVERT(ew_f32_to_i32, float, int32_t, ld, st_i32, ctpu_f32_to_i32)

/* ---- the fused tape (kernels.h ctpu_k_tape) ---------------------------------------
 * TK vectors a strip (the ISA file's TK): the previous instruction's result
 * stays in the registers acc[], other operands are loaded at the strip.
 * The light ops are their bodies above on registers; the others (the SLEEF
 * ones, POW) run their loop on a strip copy, the same bodies. K and r are
 * constants where tape_strip is inlined: r < W only for a masked tail (K 1). */
#define T_FOR(stmt) _Pragma("GCC unroll 16") for (int k = 0; k < K; k++) { stmt; }
#define T_LD(p, k) ((p) == NULL ? acc[k] : r < W ? ld_m((p) + (k) * W, m) : ld((p) + (k) * W))
#define T_ST(p, k, v) do { if (r < W) st_m((p) + (k) * W, m, (v)); else st((p) + (k) * W, (v)); } while (0)
/* the strip's opcodes: the unary kops, then binary (a op b), AS (a op s0), SA (s0 op a) by kop, then the rest */
enum { T_BIN = 32, T_AS = 64, T_SA = 96, T_WHERE = 128, T_CLAMP, T_FILL, T_COPY };

AI void tape_out(const ctpu_k_tape_out *o, int64_t i, const V *acc, const int K, int64_t r, M m)
{
    if (o->kind == CTPU_K_TO_BF16) {
        uint16_t *q = (uint16_t *)o->p + i;
        if (r < W) {
            uint16_t t[W];
            st_bf16(t, acc[0]);
            for (int64_t l = 0; l < r; l++) q[l] = t[l];
        } else {
            T_FOR(st_bf16(q + k * W, acc[k]))
        }
    } else if (o->kind == CTPU_K_TO_F32_STREAM && r == W) {
        float *q = (float *)o->p + i;
        T_FOR(st_nt(q + k * W, acc[k]))
    } else {
        float *q = (float *)o->p + i;
        T_FOR(T_ST(q, k, acc[k]))
    }
}

/* Only acc[] lives from one instruction to the next: each instruction's
 * sources are one pointer at the strip each (NULL: acc), read inside the
 * case that computes, one case per operand form, so the K vectors and the
 * constants stay in the vector registers (with operand arrays a[], b[], c[]
 * live across the loop and an offset per vector hoisted out of it, GCC
 * spilled operands and offsets to the stack at every instruction). */
#define T_A(k) (r < W ? ld_m(pa + (k) * W, m) : ld(pa + (k) * W))
#define T_B_(k) (r < W ? ld_m(pb + (k) * W, m) : ld(pb + (k) * W))
#define T_U(NAME)                                                                           \
    case CTPU_K_U_##NAME:                                                                   \
        if (pa) { T_FOR(acc[k] = u_##NAME(T_A(k))) } else { T_FOR(acc[k] = u_##NAME(acc[k])) } \
        break;
#define T_B(NAME)                                                                           \
    case T_BIN + CTPU_K_B_##NAME:                                                           \
        if (!pa && pb) { T_FOR(acc[k] = b_##NAME(acc[k], T_B_(k))) }                        \
        else if (pa && !pb) { T_FOR(acc[k] = b_##NAME(T_A(k), acc[k])) }                    \
        else if (pa) { T_FOR(acc[k] = b_##NAME(T_A(k), T_B_(k))) }                          \
        else { T_FOR(acc[k] = b_##NAME(acc[k], acc[k])) }                                   \
        break;                                                                              \
    case T_AS + CTPU_K_B_##NAME:                                                            \
        if (pa) { T_FOR(acc[k] = b_##NAME(T_A(k), s0)) } else { T_FOR(acc[k] = b_##NAME(acc[k], s0)) } \
        break;                                                                              \
    case T_SA + CTPU_K_B_##NAME:                                                            \
        if (pa) { T_FOR(acc[k] = b_##NAME(s0, T_A(k))) } else { T_FOR(acc[k] = b_##NAME(s0, acc[k])) } \
        break;
AI void tape_strip(const ctpu_k_tape_ins *ins, const uint8_t *code, int n_ins, float *const *val,
                   const ctpu_k_tape_out *out, int64_t i, const int K, const int64_t r)
{
    V acc[TK];
    T_FOR(acc[k] = vzero())
    M m = tail_mask(r);
    for (int q = 0; q < n_ins; q++) {
        const ctpu_k_tape_ins *in = &ins[q];
        const float *pa = in->a < 0 ? NULL : val[in->a] + i, *pb = in->b < 0 ? NULL : val[in->b] + i;
        const V s0 = vset(in->s0);
        switch (code[q]) {
        T_U(NEG) T_U(ABS) T_U(SQRT) T_U(RSQRT) T_U(RELU) T_U(RECIP) T_U(SQUARE) T_U(ROUND_BF16)
        T_B(ADD) T_B(SUB) T_B(MUL) T_B(DIV) T_B(MAX) T_B(MIN)
        T_B(EQ) T_B(NE) T_B(LT) T_B(LE) T_B(GT) T_B(GE)
        case T_WHERE: {
            const float *pc = in->c < 0 ? NULL : val[in->c] + i;
            T_FOR(acc[k] = where1(T_LD(pa, k), T_LD(pb, k), T_LD(pc, k)))
            break;
        }
        case T_CLAMP: T_FOR(acc[k] = clamp1(T_LD(pa, k), s0, vset(in->s1))) break;
        case T_FILL: T_FOR(acc[k] = s0) break;
        case T_COPY: T_FOR(acc[k] = T_LD(pa, k)) break;
        default: {   /* a transcendental op or POW (b, or s0 on its side): its loop over the strip */
            float ta[TK * W] __attribute__((aligned(64))), tb[TK * W] __attribute__((aligned(64)));
            int c = code[q];
            if (c < T_BIN) {
                T_FOR(st(ta + k * W, T_LD(pa, k)))
                CTPU_K_PASTE(ctpu_k_ew_, CTPU_K_ISA).unary[in->kop](ta, ta, K * W);
            } else {
                T_FOR(st(ta + k * W, c >= T_SA ? s0 : T_LD(pa, k)))
                T_FOR(st(tb + k * W, c >= T_SA ? T_LD(pa, k) : c >= T_AS ? s0 : T_LD(pb, k)))
                CTPU_K_PASTE(ctpu_k_ew_, CTPU_K_ISA).binary[in->kop](ta, tb, ta, K * W);
            }
            T_FOR(acc[k] = ld(ta + k * W))
            break;
        }
        }
        if (in->round_bf16) { T_FOR(acc[k] = vround_bf16(acc[k])) }
        if (in->dst >= 0) {
            float *pd = val[in->dst] + i;
            T_FOR(T_ST(pd, k, acc[k]))
        }
        if (in->out >= 0) tape_out(&out[in->out], i, acc, K, r, m);
    }
}
#undef T_U
#undef T_B
#undef T_A
#undef T_B_

static void ew_tape(const ctpu_k_tape_ins *ins, int n_ins, float *const *val, const ctpu_k_tape_out *out,
                    int64_t n)
{
    uint8_t code[256];
    ctpu_k_tape_out o[128];
    int n_out = 0;
    if (n_ins > 256) n_ins = 256;
    for (int q = 0; q < n_ins; q++) {
        int kind = ins[q].kind;
        code[q] = (uint8_t)(kind == CTPU_K_T_UNARY ? ins[q].kop
                            : kind == CTPU_K_T_BINARY ? T_BIN + ins[q].kop
                            : kind == CTPU_K_T_AS ? T_AS + ins[q].kop
                            : kind == CTPU_K_T_SA ? T_SA + ins[q].kop
                            : T_WHERE + (kind - CTPU_K_T_WHERE));
        if (ins[q].out >= n_out) n_out = ins[q].out + 1;
    }
    for (int q = 0; q < n_out; q++) {   /* a misaligned non-temporal output: plain stores */
        o[q] = out[q];
        if (o[q].kind == CTPU_K_TO_F32_STREAM && ((uintptr_t)o[q].p & (W * 4 - 1))) o[q].kind = CTPU_K_TO_F32;
    }
    int64_t i = 0;
    for (; i + TK * W <= n; i += TK * W) tape_strip(ins, code, n_ins, val, o, i, TK, W);
    for (; i < n; i += W) tape_strip(ins, code, n_ins, val, o, i, 1, n - i < W ? n - i : W);
}
#undef T_FOR
#undef T_LD
#undef T_ST

/* ---- the ISA's table ------------------------------------------------------------------ */
const ctpu_k_ew_variant CTPU_K_PASTE(ctpu_k_ew_, CTPU_K_ISA) = {
#define X(NAME) [CTPU_K_U_##NAME] = loop_u_##NAME,
    .unary = { CTPU_K_UNARY_OPS(X) },
#undef X
#define X(NAME) [CTPU_K_B_##NAME] = loop_b_##NAME,
    .binary = { CTPU_K_BINARY_OPS(X) },
#undef X
#define X(NAME) [CTPU_K_B_##NAME] = loop_as_##NAME,
    .binary_as = { CTPU_K_BINARY_OPS(X) },
#undef X
#define X(NAME) [CTPU_K_B_##NAME] = loop_sa_##NAME,
    .binary_sa = { CTPU_K_BINARY_OPS(X) },
#undef X
    .where = ew_where,
    .clamp = ew_clamp,
    .bf16_to_f32 = ew_bf16_to_f32,
    .f32_to_bf16 = ew_f32_to_bf16,
    .i32_to_f32 = ew_i32_to_f32,
    .f32_to_i32 = ew_f32_to_i32,
    .tape = ew_tape,
};
