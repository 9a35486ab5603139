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

#define EW_UNARY_LOOP(NAME)                                                                 \
    static void loop_u_##NAME(const float *x, float *y, int64_t n) { EW_LOOP(EW_CALL_U, u_##NAME) }
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
};
