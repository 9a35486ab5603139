/* Differential fuzzer: generation, execution with transcripts, comparison
 * across modes, delta-debugging, C printing, forked campaigns. See fz.h. */
#include "fz.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------ choices */
void fz_rng_seed(fz_rng *r, uint64_t seed)
{
    memset(r, 0, sizeof *r);
    r->state = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
}
void fz_rng_bytes(fz_rng *r, const uint8_t *data, size_t len)
{
    memset(r, 0, sizeof *r);
    r->bytes = data;
    r->len = len;
    r->state = 0x853c49e6748fea9bull ^ len;
}

static uint32_t rn(fz_rng *r)
{
    if (r->bytes) {
        /* libFuzzer: the bytes are the choices; past their end, a stream
         * seeded by them (so short inputs still give whole programs) */
        if (r->pos + 4 <= r->len) {
            uint32_t v;
            memcpy(&v, r->bytes + r->pos, 4);
            r->pos += 4;
            r->state ^= v;
            return v;
        }
    }
    r->state = r->state * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t x = r->state;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x;
}
static int rn_below(fz_rng *r, int n) { return n <= 1 ? 0 : (int)(rn(r) % (uint32_t)n); }
static bool rn_pct(fz_rng *r, int pct) { return rn_below(r, 100) < pct; }

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ------------------------------------------------------------ data */
static size_t esize(int dt) { return dt == CTPU_BF16 ? 2 : 4; }

static int64_t numel_of(int nd, const int64_t *s)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= s[i];
    return n;
}

/* The values of a from_host: deterministic in (seed, dtype, count).
 * bound > 0: i32 indices in [0, bound). Floats mix small values with
 * NaN, +-Inf, -0, subnormals and large magnitudes. */
static void *make_data(uint32_t seed, int dt, int64_t n, int32_t bound)
{
    void *p = malloc((size_t)(n ? n : 1) * 4);
    for (int64_t i = 0; i < n; i++) {
        uint64_t h = mix64(((uint64_t)seed << 32) ^ (uint64_t)i);
        if (dt == CTPU_I32) {
            int32_t v;
            if (bound > 0) v = (int32_t)(h % (uint64_t)bound);
            else if ((h & 31) == 0) v = (h & 32) ? INT32_MAX - (int32_t)(h >> 40 & 7) : INT32_MIN + (int32_t)(h >> 40 & 7);
            else v = (int32_t)((h >> 8) % 21) - 8;
            ((int32_t *)p)[i] = v;
            continue;
        }
        float f;
        switch ((h >> 56) & 31) {
        case 0: f = NAN; break;
        case 1: f = (h & 1) ? INFINITY : -INFINITY; break;
        case 2: f = -0.0f; break;
        case 3: f = (h & 1) ? 1e-40f : -3e-39f; break;     /* subnormal */
        case 4: f = (h & 1) ? 3e37f : -1e30f; break;
        case 5: f = 0.0f; break;
        default: f = (float)((int64_t)(h % 4001) - 2000) / 512.0f; break;
        }
        if (dt == CTPU_F32) ((float *)p)[i] = f;
        else {
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)p)[i] = (uint16_t)(u >> 16);           /* any pattern is a bf16 */
        }
    }
    return p;
}

/* ------------------------------------------------------------ transcripts */
typedef struct {
    int16_t ins;
    uint8_t tag;        /* 0 call status, 1 host read, 2 final value, 3 final grad */
    uint8_t st;
    uint8_t null;
    uint8_t dt;
    uint32_t off, len;
} fz_event;

typedef struct {
    fz_event *ev;
    size_t n, cap;
    uint8_t *data;
    size_t dlen, dcap;
    bool oom;
} fz_tape;

static void tape_free(fz_tape *t) { free(t->ev); free(t->data); memset(t, 0, sizeof *t); }

static void tape_event(fz_tape *t, int ins, int tag, ctpu_status st, bool null, int dt, const void *d, size_t len)
{
    if (!t) return;
    if (st == CTPU_ERR_OOM) t->oom = true;
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 64;
        t->ev = realloc(t->ev, t->cap * sizeof *t->ev);
    }
    if (t->dlen + len > t->dcap) {
        while (t->dlen + len > t->dcap) t->dcap = t->dcap ? t->dcap * 2 : 4096;
        t->data = realloc(t->data, t->dcap);
    }
    /* NaN as a class: one canonical pattern */
    uint8_t *dst = t->data + t->dlen;
    if (len) memcpy(dst, d, len);
    if (dt == CTPU_F32) {
        for (size_t k = 0; k + 4 <= len; k += 4) {
            uint32_t u;
            memcpy(&u, dst + k, 4);
            if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) { u = 0x7fc00000u; memcpy(dst + k, &u, 4); }
        }
    } else if (dt == CTPU_BF16) {
        for (size_t k = 0; k + 2 <= len; k += 2) {
            uint16_t u;
            memcpy(&u, dst + k, 2);
            if ((u & 0x7f80u) == 0x7f80u && (u & 0x7fu)) { u = 0x7fc0u; memcpy(dst + k, &u, 2); }
        }
    }
    t->ev[t->n++] = (fz_event){ .ins = (int16_t)ins, .tag = (uint8_t)tag, .st = (uint8_t)st, .null = null,
                                .dt = (uint8_t)dt, .off = (uint32_t)t->dlen, .len = (uint32_t)len };
    t->dlen += len;
}

/* Read t to host and record it (status, dtype, bytes). */
static void tape_read(fz_tape *t, int ins, int tag, ctpu_tensor h)
{
    ctpu_clear_error();
    int64_t n = ctpu_numel(h);
    ctpu_dtype dt = ctpu_dtype_of(h);
    if (n < 0 || dt >= CTPU_DTYPE_COUNT) {
        tape_event(t, ins, tag, ctpu_last_status(), true, -1, NULL, 0);
        return;
    }
    size_t bytes = (size_t)n * esize(dt);
    void *buf = malloc(bytes ? bytes : 1);
    ctpu_status st = ctpu_to_host(h, buf, bytes);
    tape_event(t, ins, tag, st, false, dt, st == CTPU_OK ? buf : NULL, st == CTPU_OK ? bytes : 0);
    free(buf);
}

/* ------------------------------------------------------------ execution */
typedef struct {
    ctpu_tensor reg[FZ_MAX_INS];
    bool leaf[FZ_MAX_INS];       /* marked requires_grad successfully */
    int step_depth, nograd_depth, label_depth;
    fz_tape *tape;
} fz_exec;

static ctpu_tensor do_unary(int sub, ctpu_tensor a);
static ctpu_tensor do_binary(int k, ctpu_tensor a, ctpu_tensor b);
static ctpu_tensor do_scalar(int k, ctpu_tensor a, double s);
#define N_BINARY 13
#define N_SCALAR 16
static void *make_data(uint32_t seed, int dt, int64_t n, int32_t bound);

/* FZ_VARLEN: p[2] steps of one structure (from host [p[0] + k, p[1]] of
 * dtype dt, unary sub, mul_scalar s0, sum over dim 0, read back), the rows
 * growing each step, inside the label "varlen": past the recompile limit
 * defer and fuse runs them op by op. Every read goes into the tape. */
static ctpu_status exec_varlen(fz_exec *x, const fz_ins *in, int i)
{
    ctpu_status st = ctpu_mark_step();
    for (int k = 0; k < in->p[2] && st == CTPU_OK; k++) {
        int64_t s[2] = { in->p[0] + k, in->p[1] };
        void *d = make_data(in->data + (uint32_t)k, in->dt, s[0] * s[1], 0);
        if ((st = ctpu_scope_begin()) != CTPU_OK) { free(d); break; }
        st = ctpu_label_push("varlen");
        ctpu_tensor h = ctpu_from_host(d, (ctpu_dtype)in->dt, 2, s);
        free(d);
        ctpu_tensor r = ctpu_sum(ctpu_mul_scalar(do_unary(in->sub, h), in->s0), 1, (int[]){ 0 }, false);
        tape_read(x->tape, i, 4, r);
        if (st == CTPU_OK) ctpu_label_pop();
        ctpu_scope_end();
        ctpu_status ms = ctpu_mark_step();
        if (st == CTPU_OK) st = ms;
    }
    return st;
}

/* FZ_DYNAMIC (issue 15): p[2] steps of one structure, step k at rows E =
 * 2 + (p[0] + 13 k) % 47, the batch h = from_host [E, p[1]] (dtype dt)
 * marked dynamic in [2, 48]: y = unary sub (h) + b (a leaf [p[1]],
 * broadcast over the rows) times s0; softmax, log_softmax or nothing over
 * dim 1 (p[3] % 3); a matmul with w [p[1], p[4]]; reduction p[5] % 5 (sum,
 * mean, max, min, var) over dim 0; the backward of its sum. Reads: the
 * matmul flattened (reshape -1), the reduction, b's grad. */
static ctpu_tensor dyn_reduce(int k, ctpu_tensor a)
{
    int d0[1] = { 0 };
    switch (k % 5) {
    case 0: return ctpu_sum(a, 1, d0, false);
    case 1: return ctpu_mean(a, 1, d0, false);
    case 2: return ctpu_max(a, 1, d0, false);
    case 3: return ctpu_min(a, 1, d0, false);
    default: return ctpu_var(a, 1, d0, 1, false);
    }
}

/* FZ_DYNAMIC's tail p[6] (0: none), p[7] its choice: one more op on the
 * matmul's m [E, K] with E of the symbol, so that every op the fuzzer
 * knows runs with a dynamic dim (issue 15): a binary op against a value of
 * m's shape or a static row, a scalar op, where, clamp, cast, argmax, a
 * softmax over the dynamic dim, reshapes (split, flatten, -1), permute,
 * transpose + contiguous, slices (of the dynamic dim too, a step of 2:
 * not c x s, a static value), concat along either dim, expand of a
 * [E, 1], embedding and gather with indices of E rows, creations at
 * [E, K] (zeros, ones, full, arange, rand_uniform, rand_normal), detach,
 * assign, the reductions over dim 1, matmul_t contracting E. */
enum { DT_NONE, DT_BINARY, DT_SCALAR, DT_WHERE, DT_CLAMP, DT_CAST, DT_ARGMAX, DT_SOFTMAX0, DT_RESHAPE, DT_PERMUTE,
       DT_TRANSPOSE, DT_SLICE, DT_CONCAT, DT_EXPAND, DT_EMBEDDING, DT_GATHER, DT_CREATE, DT_DETACH, DT_ASSIGN,
       DT_REDUCE1, DT_MATMUL_T, DT_COUNT };
static const char *const dyn_tail_names[DT_COUNT] = { "none", "binary", "scalar", "where", "clamp", "cast", "argmax",
    "softmax over rows", "reshape", "permute", "transpose", "slice", "concat", "expand", "embedding", "gather",
    "create", "detach", "assign", "reduce over cols", "matmul_t over rows" };

static ctpu_tensor dyn_host(uint32_t seed, int dt, int nd, const int64_t *s)
{
    void *d = make_data(seed, dt, numel_of(nd, s), 0);
    ctpu_tensor t = ctpu_from_host(d, (ctpu_dtype)dt, nd, s);
    free(d);
    return t;
}

static ctpu_tensor dyn_tail(const fz_ins *in, ctpu_tensor m, int64_t E, int64_t K)
{
    int q = in->p[7] < 0 ? -in->p[7] : in->p[7], dt = in->dt;
    double s1 = in->s1;
    int64_t ek[2] = { E, K };
    switch (in->p[6] % DT_COUNT) {
    case DT_BINARY: {
        ctpu_tensor o = q / N_BINARY % 2 ? ctpu_tanh(m) : dyn_host(in->data ^ 0x9e3779b9u, dt, 1, &K);
        return do_binary(q % N_BINARY, m, o);
    }
    case DT_SCALAR: return do_scalar(q % N_SCALAR, m, s1);
    case DT_WHERE: return ctpu_where(ctpu_gt_scalar(m, s1), m, ctpu_neg(m));
    case DT_CLAMP: return ctpu_clamp(m, -fabs(s1) - 0.25, fabs(s1) + 0.25);
    case DT_CAST: return q % 3 == 2 ? ctpu_cast(m, CTPU_I32) : ctpu_cast(ctpu_cast(m, dt == CTPU_F32 ? CTPU_BF16 : CTPU_F32), (ctpu_dtype)dt);
    case DT_ARGMAX: return ctpu_argmax(m, q % 2, q / 2 % 2);
    case DT_SOFTMAX0: return q % 2 ? ctpu_log_softmax(m, 0) : ctpu_softmax(m, 0);
    case DT_RESHAPE: {
        int64_t a[3] = { K, -1 }, b[3] = { E, 1, K }, c[1] = { E * K };
        return q % 3 == 0 ? ctpu_reshape(m, 2, a) : q % 3 == 1 ? ctpu_reshape(m, 3, b) : ctpu_reshape(m, 1, c);
    }
    case DT_PERMUTE: {
        int64_t b[3] = { E, K, 1 };
        static const int perms[3][3] = { { 2, 0, 1 }, { 1, 2, 0 }, { 0, 2, 1 } };
        return ctpu_permute(ctpu_reshape(m, 3, b), perms[q % 3]);
    }
    case DT_TRANSPOSE: return q % 2 ? ctpu_contiguous(ctpu_transpose(m, 0, 1)) : ctpu_transpose(m, 1, 0);
    case DT_SLICE:
        switch (q % 4) {
        case 0: return ctpu_slice(m, 0, 1, E, 1);
        case 1: return ctpu_slice(m, 0, 0, E, 2);                /* ceil(E / 2) rows: static */
        case 2: return ctpu_slice(m, 1, 0, K, 2);
        default: return ctpu_slice(m, 0, 0, E - 1, 1);
        }
    case DT_CONCAT: {
        ctpu_tensor ts[2] = { m, ctpu_neg(m) };
        return ctpu_concat(2, ts, q % 2);
    }
    case DT_EXPAND: return ctpu_expand(ctpu_sum(m, 1, (int[]){ 1 }, true), 2, ek);
    case DT_EMBEDDING: {
        int64_t ts[2] = { K, 3 };
        return ctpu_embedding(dyn_host(in->data ^ 0x85ebca6bu, dt, 2, ts), ctpu_argmax(m, 1, false));
    }
    case DT_GATHER: return ctpu_gather(m, 1, ctpu_argmax(m, 1, true));
    case DT_CREATE: {
        ctpu_tensor c;
        switch (q % 6) {
        case 0: c = ctpu_zeros((ctpu_dtype)dt, 2, ek); break;
        case 1: c = ctpu_ones((ctpu_dtype)dt, 2, ek); break;
        case 2: c = ctpu_full((ctpu_dtype)dt, 2, ek, s1); break;
        case 3: {
            int64_t e1[2] = { E, 1 };
            c = ctpu_reshape(ctpu_arange(0, (double)E, 1, (ctpu_dtype)dt), 2, e1);
            break;
        }
        case 4: c = ctpu_rand_uniform((ctpu_dtype)dt, 2, ek, -1, 1); break;
        default: c = ctpu_rand_normal((ctpu_dtype)dt, 2, ek, 0, 1); break;
        }
        return ctpu_add(m, c);
    }
    case DT_DETACH: return ctpu_mul(ctpu_detach(m), m);
    case DT_ASSIGN: {
        ctpu_tensor z = ctpu_zeros((ctpu_dtype)dt, 2, ek);
        return ctpu_assign(z, ctpu_exp(m)) == CTPU_OK ? z : CTPU_NULL;   /* (its status is the tail's) */
    }
    case DT_REDUCE1: {
        int d1[1] = { 1 };
        bool kd = q / 5 % 2;
        switch (q % 5) {
        case 0: return ctpu_sum(m, 1, d1, kd);
        case 1: return ctpu_mean(m, 1, d1, kd);
        case 2: return ctpu_max(m, 1, d1, kd);
        case 3: return ctpu_min(m, 1, d1, kd);
        default: return ctpu_var(m, 1, d1, q % 2, kd);
        }
    }
    case DT_MATMUL_T: return ctpu_matmul_t(m, ctpu_tanh(m), true, false);   /* [K, K]: E contracted */
    default: return CTPU_NULL;
    }
}

static ctpu_status exec_dynamic(fz_exec *x, const fz_ins *in, int i)
{
    ctpu_status st = ctpu_mark_step();
    int64_t C = in->p[1], K = in->p[4];
    for (int k = 0; k < in->p[2] && st == CTPU_OK; k++) {
        int64_t s[2] = { 2 + (in->p[0] + 13 * k) % 47, C }, ws[2] = { C, K };
        if ((st = ctpu_scope_begin()) != CTPU_OK) break;
        void *d = make_data(in->data + (uint32_t)k, in->dt, s[0] * s[1], 0);
        ctpu_tensor h = ctpu_from_host(d, (ctpu_dtype)in->dt, 2, s);
        free(d);
        d = make_data(in->data ^ 0x5bd1e995u, in->dt, C, 0);
        ctpu_tensor b = ctpu_from_host(d, (ctpu_dtype)in->dt, 1, &C);
        free(d);
        d = make_data(in->data ^ 0x27d4eb2fu, in->dt, C * K, 0);
        ctpu_tensor w = ctpu_from_host(d, (ctpu_dtype)in->dt, 2, ws);
        free(d);
        st = ctpu_mark_dynamic(h, 0, 2, 48);
        ctpu_set_requires_grad(b, true);
        ctpu_tensor y = ctpu_mul_scalar(ctpu_add(do_unary(in->sub, h), b), in->s0);
        if (in->p[3] % 3 == 1) y = ctpu_softmax(y, 1);
        else if (in->p[3] % 3 == 2) y = ctpu_log_softmax(y, 1);
        ctpu_tensor m = ctpu_matmul(y, w);
        int64_t flat = -1;
        tape_read(x->tape, i, 5, ctpu_reshape(m, 1, &flat));
        ctpu_tensor r = dyn_reduce(in->p[5], m);
        tape_read(x->tape, i, 6, r);
        ctpu_tensor loss = ctpu_sum(r, 0, NULL, false);
        if (in->p[6] % DT_COUNT != DT_NONE) {
            ctpu_clear_error();
            ctpu_tensor t = dyn_tail(in, m, s[0], K);
            tape_event(x->tape, i, 9, ctpu_is_null(t) ? ctpu_last_status() : CTPU_OK, ctpu_is_null(t), -1, NULL, 0);
            if (!ctpu_is_null(t)) tape_read(x->tape, i, 10, ctpu_reshape(t, 1, &flat));
            if (!ctpu_is_null(t) && ctpu_dtype_of(t) == (ctpu_dtype)in->dt)   /* its gradient too */
                loss = ctpu_add(loss, ctpu_mul_scalar(ctpu_sum(t, 0, NULL, false), 0.5));
        }
        ctpu_status bs = ctpu_backward(loss);
        tape_event(x->tape, i, 7, bs, false, -1, NULL, 0);
        if (bs == CTPU_OK) tape_read(x->tape, i, 8, ctpu_grad(b));
        ctpu_scope_end();
        ctpu_status ms = ctpu_mark_step();
        if (st == CTPU_OK) st = ms;
    }
    return st;
}

/* labels the fuzzer pushes; the last is invalid (empty) */
#define FZ_N_LABELS 4
static const char *const fz_label_names[FZ_N_LABELS] = { "embed", "block2.attn", "loss", "" };

static const char *const unary_names[] = { "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu",
                                           "gelu_tanh", "gelu" };
static const char *const binary_names[] = { "add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                            "eq", "ne", "lt", "le", "gt", "ge" };
static const char *const scalar_names[] = { "add_scalar", "sub_scalar", "mul_scalar", "div_scalar", "pow_scalar",
                                            "maximum_scalar", "minimum_scalar", "rsub_scalar", "rdiv_scalar",
                                            "rpow_scalar", "eq_scalar", "ne_scalar", "lt_scalar", "le_scalar",
                                            "gt_scalar", "ge_scalar" };
static const char *const reduce_names[] = { "sum", "mean", "max", "min", "var" };
static const char *const create_names[] = { "zeros", "ones", "full", "arange", "rand_uniform", "rand_normal" };
#define N_UNARY 11
#define N_REDUCE 5
#define N_CREATE 6

static ctpu_tensor do_unary(int k, ctpu_tensor a)
{
    switch (k) {
    case 0: return ctpu_neg(a);
    case 1: return ctpu_abs(a);
    case 2: return ctpu_exp(a);
    case 3: return ctpu_log(a);
    case 4: return ctpu_sqrt(a);
    case 5: return ctpu_rsqrt(a);
    case 6: return ctpu_tanh(a);
    case 7: return ctpu_sigmoid(a);
    case 8: return ctpu_relu(a);
    case 9: return ctpu_gelu(a, true);
    default: return ctpu_gelu(a, false);
    }
}
static ctpu_tensor do_binary(int k, ctpu_tensor a, ctpu_tensor b)
{
    switch (k) {
    case 0: return ctpu_add(a, b);
    case 1: return ctpu_sub(a, b);
    case 2: return ctpu_mul(a, b);
    case 3: return ctpu_div(a, b);
    case 4: return ctpu_pow(a, b);
    case 5: return ctpu_maximum(a, b);
    case 6: return ctpu_minimum(a, b);
    case 7: return ctpu_eq(a, b);
    case 8: return ctpu_ne(a, b);
    case 9: return ctpu_lt(a, b);
    case 10: return ctpu_le(a, b);
    case 11: return ctpu_gt(a, b);
    default: return ctpu_ge(a, b);
    }
}
static ctpu_tensor do_scalar(int k, ctpu_tensor a, double s)
{
    switch (k) {
    case 0: return ctpu_add_scalar(a, s);
    case 1: return ctpu_sub_scalar(a, s);
    case 2: return ctpu_mul_scalar(a, s);
    case 3: return ctpu_div_scalar(a, s);
    case 4: return ctpu_pow_scalar(a, s);
    case 5: return ctpu_maximum_scalar(a, s);
    case 6: return ctpu_minimum_scalar(a, s);
    case 7: return ctpu_rsub_scalar(a, s);
    case 8: return ctpu_rdiv_scalar(a, s);
    case 9: return ctpu_rpow_scalar(a, s);
    case 10: return ctpu_eq_scalar(a, s);
    case 11: return ctpu_ne_scalar(a, s);
    case 12: return ctpu_lt_scalar(a, s);
    case 13: return ctpu_le_scalar(a, s);
    case 14: return ctpu_gt_scalar(a, s);
    default: return ctpu_ge_scalar(a, s);
    }
}

/* Execute instruction i; records its status into the tape. */
static void exec_one(fz_exec *x, const fz_prog *p, int i)
{
    const fz_ins *in = &p->ins[i];
    x->reg[i] = CTPU_NULL;
    /* an operand dropped by the minimiser: this call is dropped too */
    if (in->a == -2 || in->b == -2 || in->c == -2) return;
    ctpu_tensor A = in->a >= 0 ? x->reg[in->a] : CTPU_NULL, B = in->b >= 0 ? x->reg[in->b] : CTPU_NULL,
                Cc = in->c >= 0 ? x->reg[in->c] : CTPU_NULL;
    ctpu_tensor r = CTPU_NULL;
    ctpu_status st = CTPU_OK;
    bool tensor_out = true;
    ctpu_clear_error();
    switch ((fz_kind)in->kind) {
    case FZ_FROM_HOST: {
        int64_t n = numel_of(in->nd, in->shape);
        void *d = make_data(in->data, in->dt, n, in->p[0]);
        r = ctpu_from_host(d, (ctpu_dtype)in->dt, in->nd, in->shape);
        free(d);
        break;
    }
    case FZ_CREATE:
        switch (in->sub) {
        case 0: r = ctpu_zeros((ctpu_dtype)in->dt, in->nd, in->shape); break;
        case 1: r = ctpu_ones((ctpu_dtype)in->dt, in->nd, in->shape); break;
        case 2: r = ctpu_full((ctpu_dtype)in->dt, in->nd, in->shape, in->s0); break;
        case 3: r = ctpu_arange(in->s0, in->s1, (double)in->p[0] / 4.0, (ctpu_dtype)in->dt); break;
        case 4: r = ctpu_rand_uniform((ctpu_dtype)in->dt, in->nd, in->shape, in->s0, in->s1); break;
        default: r = ctpu_rand_normal((ctpu_dtype)in->dt, in->nd, in->shape, in->s0, in->s1); break;
        }
        break;
    case FZ_UNARY: r = do_unary(in->sub, A); break;
    case FZ_BINARY: r = do_binary(in->sub, A, B); break;
    case FZ_SCALAR: r = do_scalar(in->sub, A, in->s0); break;
    case FZ_WHERE: r = ctpu_where(A, B, Cc); break;
    case FZ_CLAMP: r = ctpu_clamp(A, in->s0, in->s1); break;
    case FZ_CAST: r = ctpu_cast(A, (ctpu_dtype)in->dt); break;
    case FZ_REDUCE: {
        const int *dims = in->nd ? in->p : NULL;
        bool kd = in->flag & 1;
        switch (in->sub) {
        case 0: r = ctpu_sum(A, in->nd, dims, kd); break;
        case 1: r = ctpu_mean(A, in->nd, dims, kd); break;
        case 2: r = ctpu_max(A, in->nd, dims, kd); break;
        case 3: r = ctpu_min(A, in->nd, dims, kd); break;
        default: r = ctpu_var(A, in->nd, dims, (int)in->shape[0], kd); break;
        }
        break;
    }
    case FZ_ARGMAX: r = ctpu_argmax(A, in->p[0], in->flag & 1); break;
    case FZ_SOFTMAX: r = in->sub ? ctpu_log_softmax(A, in->p[0]) : ctpu_softmax(A, in->p[0]); break;
    case FZ_RESHAPE: r = ctpu_reshape(A, in->nd, in->shape); break;
    case FZ_PERMUTE: r = ctpu_permute(A, in->p); break;
    case FZ_TRANSPOSE: r = ctpu_transpose(A, in->p[0], in->p[1]); break;
    case FZ_CONTIGUOUS: r = ctpu_contiguous(A); break;
    case FZ_SLICE: r = ctpu_slice(A, in->p[0], in->shape[0], in->shape[1], in->shape[2]); break;
    case FZ_CONCAT: {
        ctpu_tensor ts[3] = { A, B, Cc };
        r = ctpu_concat(in->c >= 0 ? 3 : in->b >= 0 ? 2 : 1, ts, in->p[0]);
        break;
    }
    case FZ_EXPAND: r = ctpu_expand(A, in->nd, in->shape); break;
    case FZ_EMBEDDING: r = ctpu_embedding(A, B); break;
    case FZ_GATHER: r = ctpu_gather(A, in->p[0], B); break;
    case FZ_MATMUL:
        r = in->sub ? ctpu_matmul_t(A, B, in->flag & 1, in->flag & 2) : ctpu_matmul(A, B);
        break;
    case FZ_DETACH: r = ctpu_detach(A); break;
    case FZ_KEEP: r = ctpu_keep(A); break;   /* the same handle, now also in r */
    default: tensor_out = false; break;
    }
    if (tensor_out) {
        x->reg[i] = r;
        st = ctpu_is_null(r) ? ctpu_last_status() : CTPU_OK;
        tape_event(x->tape, i, 0, st, ctpu_is_null(r), -1, NULL, 0);
        return;
    }
    switch ((fz_kind)in->kind) {
    case FZ_ASSIGN: st = ctpu_assign(A, B); break;
    case FZ_READ: tape_read(x->tape, i, 1, A); return;
    case FZ_ITEM: {
        double v = 0;
        st = ctpu_item(A, &v);
        tape_event(x->tape, i, 1, st, false, -1, st == CTPU_OK ? &v : NULL, st == CTPU_OK ? sizeof v : 0);
        return;
    }
    case FZ_MARK_STEP: st = ctpu_mark_step(); break;
    case FZ_STEP_BEGIN:
        st = ctpu_step_begin();
        if (st == CTPU_OK) x->step_depth++;
        break;
    case FZ_STEP_END:
        st = ctpu_step_end();
        if (st == CTPU_OK) x->step_depth--;
        break;
    case FZ_RELEASE:
        st = ctpu_release(A);        /* later uses see a stale handle */
        break;
    case FZ_REQ_GRAD:
        st = ctpu_set_requires_grad(A, in->flag & 1);
        if (st == CTPU_OK) x->leaf[in->a] = in->flag & 1;
        break;
    case FZ_BACKWARD:
        if (in->sub == 0) {
            ctpu_tensor l = ctpu_sum(A, 0, NULL, false);
            st = ctpu_is_null(l) && !ctpu_is_null(A) ? ctpu_last_status() : ctpu_backward(l);
            if (!ctpu_is_null(l)) ctpu_release(l);
        } else {
            st = ctpu_backward_ex(A, B, in->flag & 1);
        }
        break;
    case FZ_ZERO_GRAD: st = ctpu_zero_grad(A); break;
    case FZ_SYNC: st = ctpu_sync(); break;
    case FZ_NO_GRAD_BEGIN:
        st = ctpu_no_grad_begin();
        if (st == CTPU_OK) x->nograd_depth++;
        break;
    case FZ_NO_GRAD_END:
        st = ctpu_no_grad_end();
        if (st == CTPU_OK) x->nograd_depth--;
        break;
    case FZ_LABEL_PUSH:   /* region labels (issue 11): provenance only, the values never change */
        st = ctpu_label_push(fz_label_names[in->sub % FZ_N_LABELS]);
        if (st == CTPU_OK) x->label_depth++;
        break;
    case FZ_LABEL_POP:
        st = ctpu_label_pop();
        if (st == CTPU_OK) x->label_depth--;
        break;
    case FZ_VARLEN: st = exec_varlen(x, in, i); break;
    case FZ_DYNAMIC: st = exec_dynamic(x, in, i); break;
    default: break;
    }
    tape_event(x->tape, i, 0, st, false, -1, NULL, 0);
}

static void exec_begin(fz_exec *x, const fz_prog *p, fz_tape *tape)
{
    memset(x, 0, sizeof *x);
    x->tape = tape;
    ctpu_manual_seed(p->seed);
    ctpu_set_matmul_precision((ctpu_precision)(p->precision % CTPU_PRECISION_COUNT));
    ctpu_scope_begin();
}

/* The end of a run: every live tensor and every leaf's grad into the tape,
 * then everything released. */
static void exec_end(fz_exec *x, const fz_prog *p)
{
    for (int i = 0; i < p->n; i++)
        if (!ctpu_is_null(x->reg[i]) && ctpu_is_valid(x->reg[i])) tape_read(x->tape, i, 2, x->reg[i]);
    for (int i = 0; i < p->n; i++) {
        if (!x->leaf[i] || ctpu_is_null(x->reg[i]) || !ctpu_is_valid(x->reg[i])) continue;
        ctpu_tensor g = ctpu_grad(x->reg[i]);
        if (ctpu_is_null(g)) tape_event(x->tape, i, 3, CTPU_OK, true, -1, NULL, 0);
        else tape_read(x->tape, i, 3, g);
    }
    ctpu_status st = ctpu_sync();
    tape_event(x->tape, -1, 0, st, false, -1, NULL, 0);
    while (x->nograd_depth-- > 0) ctpu_no_grad_end();
    while (x->label_depth-- > 0) ctpu_label_pop();
    while (x->step_depth-- > 0) ctpu_step_end();
    for (int i = 0; i < p->n; i++)
        if (!ctpu_is_null(x->reg[i]) && ctpu_is_valid(x->reg[i])) ctpu_release(x->reg[i]);
    ctpu_scope_end();
    ctpu_sync();
    ctpu_clear_error();
}

static uint64_t hbm_in_use(void)
{
    ctpu_hbm_stats s;
    ctpu_sync();
    return ctpu_hbm_get_stats(&s) == CTPU_OK ? s.in_use : 0;
}

int fz_test_corrupt_mode = -1;

static void run_mode(const fz_prog *p, ctpu_mode m, fz_tape *tape, uint64_t *leak)
{
    ctpu_set_mode(m);
    ctpu_set_debug_checks(false);
    uint64_t before = hbm_in_use();
    fz_exec x;
    exec_begin(&x, p, tape);
    for (int i = 0; i < p->n; i++) exec_one(&x, p, i);
    exec_end(&x, p);
    uint64_t after = hbm_in_use();
    *leak = after > before ? after - before : 0;
    ctpu_set_mode(CTPU_MODE_STRICT);
    if ((int)m == fz_test_corrupt_mode)    /* the harness's self-test: one flipped bit must be seen */
        for (size_t k = tape->n; k-- > 0;)
            if (tape->ev[k].len) { tape->data[tape->ev[k].off] ^= 0x10; break; }
}

/* ------------------------------------------------------------ describe / print */
static const char *dtn(int dt) { return dt == CTPU_F32 ? "CTPU_F32" : dt == CTPU_BF16 ? "CTPU_BF16" : dt == CTPU_I32 ? "CTPU_I32" : "(ctpu_dtype)9"; }

static void shape_str(int nd, const int64_t *s, char *b, size_t n)
{
    size_t o = (size_t)snprintf(b, n, "(int64_t[]){");
    for (int d = 0; d < nd && o < n; d++) o += (size_t)snprintf(b + o, n - o, "%s%lld", d ? ", " : "", (long long)s[d]);
    if (o < n) snprintf(b + o, n - o, "%s}", nd ? "" : "0");
}
static void ints_str(int nd, const int32_t *s, char *b, size_t n)
{
    size_t o = (size_t)snprintf(b, n, "(int[]){");
    for (int d = 0; d < nd && o < n; d++) o += (size_t)snprintf(b + o, n - o, "%s%d", d ? ", " : "", s[d]);
    if (o < n) snprintf(b + o, n - o, "%s}", nd ? "" : "0");
}

const char *fz_kind_name(int k)
{
    static const char *const names[FZ_KIND_COUNT] = {
        "from_host", "create", "unary", "binary", "scalar", "where", "clamp", "cast", "reduce", "argmax", "softmax",
        "reshape", "permute", "transpose", "contiguous", "slice", "concat", "expand", "embedding", "gather", "matmul",
        "detach", "assign", "read", "item", "mark_step", "step_begin", "step_end", "keep", "release",
        "requires_grad", "backward", "zero_grad", "sync", "no_grad_begin", "no_grad_end", "label_push", "label_pop",
        "varlen", "dynamic" };
    return k >= 0 && k < FZ_KIND_COUNT ? names[k] : "?";
}

void fz_describe(const fz_prog *p, int i, char *buf, size_t len)
{
    const fz_ins *in = &p->ins[i];
    char sh[160], dm[96], a[12], b[12], c[12];
    snprintf(a, sizeof a, "r%d", in->a);
    snprintf(b, sizeof b, "r%d", in->b);
    snprintf(c, sizeof c, "r%d", in->c);
    shape_str(in->nd, in->shape, sh, sizeof sh);
    ints_str(in->nd, in->p, dm, sizeof dm);
    switch ((fz_kind)in->kind) {
    case FZ_FROM_HOST:
        snprintf(buf, len, "r%d = ctpu_from_host(data(seed %u%s), %s, %d, %s)", i, in->data,
                 in->p[0] ? ", indices" : "", dtn(in->dt), in->nd, sh);
        break;
    case FZ_CREATE:
        if (in->sub == 3) snprintf(buf, len, "r%d = ctpu_arange(%g, %g, %g, %s)", i, in->s0, in->s1, in->p[0] / 4.0, dtn(in->dt));
        else if (in->sub < 2) snprintf(buf, len, "r%d = ctpu_%s(%s, %d, %s)", i, create_names[in->sub], dtn(in->dt), in->nd, sh);
        else if (in->sub == 2) snprintf(buf, len, "r%d = ctpu_full(%s, %d, %s, %g)", i, dtn(in->dt), in->nd, sh, in->s0);
        else snprintf(buf, len, "r%d = ctpu_%s(%s, %d, %s, %g, %g)", i, create_names[in->sub], dtn(in->dt), in->nd, sh, in->s0, in->s1);
        break;
    case FZ_UNARY:
        if (in->sub >= 9) snprintf(buf, len, "r%d = ctpu_gelu(%s, %s)", i, a, in->sub == 9 ? "true" : "false");
        else snprintf(buf, len, "r%d = ctpu_%s(%s)", i, unary_names[in->sub], a);
        break;
    case FZ_BINARY: snprintf(buf, len, "r%d = ctpu_%s(%s, %s)", i, binary_names[in->sub], a, b); break;
    case FZ_SCALAR: snprintf(buf, len, "r%d = ctpu_%s(%s, %a)", i, scalar_names[in->sub], a, in->s0); break;
    case FZ_WHERE: snprintf(buf, len, "r%d = ctpu_where(%s, %s, %s)", i, a, b, c); break;
    case FZ_CLAMP: snprintf(buf, len, "r%d = ctpu_clamp(%s, %a, %a)", i, a, in->s0, in->s1); break;
    case FZ_CAST: snprintf(buf, len, "r%d = ctpu_cast(%s, %s)", i, a, dtn(in->dt)); break;
    case FZ_REDUCE:
        if (in->sub == 4)
            snprintf(buf, len, "r%d = ctpu_var(%s, %d, %s, %d, %s)", i, a, in->nd, in->nd ? dm : "NULL",
                     (int)in->shape[0], in->flag & 1 ? "true" : "false");
        else
            snprintf(buf, len, "r%d = ctpu_%s(%s, %d, %s, %s)", i, reduce_names[in->sub], a, in->nd, in->nd ? dm : "NULL",
                     in->flag & 1 ? "true" : "false");
        break;
    case FZ_ARGMAX: snprintf(buf, len, "r%d = ctpu_argmax(%s, %d, %s)", i, a, in->p[0], in->flag & 1 ? "true" : "false"); break;
    case FZ_SOFTMAX: snprintf(buf, len, "r%d = ctpu_%s(%s, %d)", i, in->sub ? "log_softmax" : "softmax", a, in->p[0]); break;
    case FZ_RESHAPE: snprintf(buf, len, "r%d = ctpu_reshape(%s, %d, %s)", i, a, in->nd, sh); break;
    case FZ_PERMUTE: snprintf(buf, len, "r%d = ctpu_permute(%s, %s)", i, a, dm); break;
    case FZ_TRANSPOSE: snprintf(buf, len, "r%d = ctpu_transpose(%s, %d, %d)", i, a, in->p[0], in->p[1]); break;
    case FZ_CONTIGUOUS: snprintf(buf, len, "r%d = ctpu_contiguous(%s)", i, a); break;
    case FZ_SLICE:
        snprintf(buf, len, "r%d = ctpu_slice(%s, %d, %lld, %lld, %lld)", i, a, in->p[0], (long long)in->shape[0],
                 (long long)in->shape[1], (long long)in->shape[2]);
        break;
    case FZ_CONCAT:
        snprintf(buf, len, "r%d = ctpu_concat(%d, (ctpu_tensor[]){%s%s%s%s%s}, %d)", i, in->c >= 0 ? 3 : in->b >= 0 ? 2 : 1,
                 a, in->b >= 0 ? ", " : "", in->b >= 0 ? b : "", in->c >= 0 ? ", " : "", in->c >= 0 ? c : "", in->p[0]);
        break;
    case FZ_EXPAND: snprintf(buf, len, "r%d = ctpu_expand(%s, %d, %s)", i, a, in->nd, sh); break;
    case FZ_EMBEDDING: snprintf(buf, len, "r%d = ctpu_embedding(%s, %s)", i, a, b); break;
    case FZ_GATHER: snprintf(buf, len, "r%d = ctpu_gather(%s, %d, %s)", i, a, in->p[0], b); break;
    case FZ_MATMUL:
        if (in->sub) snprintf(buf, len, "r%d = ctpu_matmul_t(%s, %s, %s, %s)", i, a, b, in->flag & 1 ? "true" : "false", in->flag & 2 ? "true" : "false");
        else snprintf(buf, len, "r%d = ctpu_matmul(%s, %s)", i, a, b);
        break;
    case FZ_DETACH: snprintf(buf, len, "r%d = ctpu_detach(%s)", i, a); break;
    case FZ_KEEP: snprintf(buf, len, "r%d = ctpu_keep(%s)", i, a); break;
    case FZ_ASSIGN: snprintf(buf, len, "ctpu_assign(%s, %s)", a, b); break;
    case FZ_READ: snprintf(buf, len, "ctpu_to_host(%s, buf, bytes)", a); break;
    case FZ_ITEM: snprintf(buf, len, "ctpu_item(%s, &v)", a); break;
    case FZ_MARK_STEP: snprintf(buf, len, "ctpu_mark_step()"); break;
    case FZ_STEP_BEGIN: snprintf(buf, len, "ctpu_step_begin()"); break;
    case FZ_STEP_END: snprintf(buf, len, "ctpu_step_end()"); break;
    case FZ_RELEASE: snprintf(buf, len, "ctpu_release(%s)", a); break;
    case FZ_REQ_GRAD: snprintf(buf, len, "ctpu_set_requires_grad(%s, %s)", a, in->flag & 1 ? "true" : "false"); break;
    case FZ_BACKWARD:
        if (in->sub == 0) snprintf(buf, len, "ctpu_backward(ctpu_sum(%s, 0, NULL, false))", a);
        else snprintf(buf, len, "ctpu_backward_ex(%s, %s, %s)", a, in->b >= 0 ? b : "CTPU_NULL", in->flag & 1 ? "true" : "false");
        break;
    case FZ_ZERO_GRAD: snprintf(buf, len, "ctpu_zero_grad(%s)", a); break;
    case FZ_SYNC: snprintf(buf, len, "ctpu_sync()"); break;
    case FZ_NO_GRAD_BEGIN: snprintf(buf, len, "ctpu_no_grad_begin()"); break;
    case FZ_NO_GRAD_END: snprintf(buf, len, "ctpu_no_grad_end()"); break;
    case FZ_LABEL_PUSH: snprintf(buf, len, "ctpu_label_push(\"%s\")", fz_label_names[in->sub % FZ_N_LABELS]); break;
    case FZ_LABEL_POP: snprintf(buf, len, "ctpu_label_pop()"); break;
    case FZ_VARLEN:
        snprintf(buf, len, "varlen: %d steps of sum(%s(from_host(data(seed %u + k), %s, [%d + k, %d])) * %a, dim 0)",
                 in->p[2], in->sub >= 9 ? "gelu" : unary_names[in->sub], in->data, dtn(in->dt), in->p[0], in->p[1], in->s0);
        break;
    case FZ_DYNAMIC:
        snprintf(buf, len, "dynamic: %d steps of rows 2 + (%d + 13k) %% 47 marked in [2, 48], %s, cols %d, %s, "
                 "softmax kind %d, matmul to %d, reduce %d, tail %s (%d), backward", in->p[2], in->p[0], dtn(in->dt),
                 in->p[1], in->sub >= 9 ? "gelu" : unary_names[in->sub], in->p[3] % 3, in->p[4], in->p[5] % 5,
                 dyn_tail_names[in->p[6] % DT_COUNT], in->p[7]);
        break;
    default: snprintf(buf, len, "?"); break;
    }
}

void fz_print_c(const fz_prog *p, const char *name, FILE *f)
{
    fprintf(f, "/* Found by tests/fuzz (seed %llu), minimised to %d calls:\n", (unsigned long long)p->seed, p->n);
    for (int i = 0; i < p->n; i++) {
        char d[512];
        fz_describe(p, i, d, sizeof d);
        fprintf(f, " *   %s;\n", d);
    }
    fprintf(f, " * Strict eager, debug eager and defer and fuse must agree. */\n");
    fprintf(f, "static const fz_prog %s = { .seed = %lluull, .precision = %u, .n = %d, .ins = {\n", name,
            (unsigned long long)p->seed, p->precision, p->n);
    for (int i = 0; i < p->n; i++) {
        const fz_ins *in = &p->ins[i];
        fprintf(f, "    { .kind = %u, .sub = %u, .dt = %u, .nd = %u, .flag = %u, .a = %d, .b = %d, .c = %d, .data = %uu,\n"
                   "      .p = { %d, %d, %d, %d, %d, %d, %d, %d }, .shape = { ",
                in->kind, in->sub, in->dt, in->nd, in->flag, in->a, in->b, in->c, in->data, in->p[0], in->p[1],
                in->p[2], in->p[3], in->p[4], in->p[5], in->p[6], in->p[7]);
        for (int k = 0; k < 8; k++) fprintf(f, "%lldll%s", (long long)in->shape[k], k < 7 ? ", " : "");
        fprintf(f, " }, .s0 = %a, .s1 = %a },\n", in->s0, in->s1);
    }
    fprintf(f, "} };\n");
    fprintf(f, "START_TEST(%s_parity) { fz_expect_parity(&%s); } END_TEST\n", name, name);
}

/* ------------------------------------------------------------ comparison */
static const char *mode_label[3] = { "strict", "debug", "defer_fuse" };

static bool same_event(const fz_tape *x, size_t i, const fz_tape *y, size_t j)
{
    const fz_event *a = &x->ev[i], *b = &y->ev[j];
    if (a->ins != b->ins || a->tag != b->tag || a->st != b->st || a->null != b->null || a->dt != b->dt ||
        a->len != b->len)
        return false;
    return a->len == 0 || memcmp(x->data + a->off, y->data + b->off, a->len) == 0;
}

static void explain(const fz_prog *p, const fz_tape *x, const fz_tape *y, int my, char *why, size_t wl)
{
    size_t n = x->n < y->n ? x->n : y->n, k = 0;
    while (k < n && same_event(x, k, y, k)) k++;
    if (k == n) {
        snprintf(why, wl, "%s recorded %zu events, strict %zu", mode_label[my], y->n, x->n);
        return;
    }
    const fz_event *a = &x->ev[k], *b = &y->ev[k];
    static const char *const tags[] = { "status", "host read", "final value", "final grad" };
    char d[400] = "end of run";
    if (a->ins >= 0 && a->ins < p->n) fz_describe(p, a->ins, d, sizeof d);
    size_t first = 0;
    if (a->len == b->len && a->st == b->st)
        while (first < a->len && x->data[a->off + first] == y->data[b->off + first]) first++;
    snprintf(why, wl, "%s of [%d] %s: strict %s%s, %s %s%s (%s byte %zu of %u)", tags[a->tag < 4 ? a->tag : 0], a->ins,
             d, ctpu_status_str((ctpu_status)a->st), a->null ? " (null)" : "", mode_label[my],
             ctpu_status_str((ctpu_status)b->st), b->null ? " (null)" : "", a->ins == b->ins ? "same call" : "other call",
             first, a->len);
}

bool fz_check(const fz_prog *p, char *why, size_t why_len, bool *skipped)
{
    fz_tape t[3];
    memset(t, 0, sizeof t);
    uint64_t leak[3];
    const ctpu_mode modes[3] = { CTPU_MODE_STRICT, CTPU_MODE_DEBUG, CTPU_MODE_DEFER_FUSE };
    for (int m = 0; m < 3; m++) run_mode(p, modes[m], &t[m], &leak[m]);
    bool ok = true;
    if (skipped) *skipped = false;
    if (t[0].oom || t[1].oom || t[2].oom) {
        if (skipped) *skipped = true;
    } else {
        for (int m = 1; m < 3 && ok; m++) {
            bool same = t[0].n == t[m].n;
            for (size_t k = 0; same && k < t[0].n; k++) same = same_event(&t[0], k, &t[m], k);
            if (!same) {
                ok = false;
                explain(p, &t[0], &t[m], m, why, why_len);
            }
        }
        for (int m = 0; m < 3 && ok; m++)
            if (leak[m]) {
                ok = false;
                snprintf(why, why_len, "%s: %llu bytes of HBM still in use after every handle was released",
                         mode_label[m], (unsigned long long)leak[m]);
            }
    }
    for (int m = 0; m < 3; m++) tape_free(&t[m]);
    return ok;
}

/* ------------------------------------------------------------ generation */
typedef struct {
    fz_rng *r;
    const fz_opts *o;
    fz_prog *p, *sink;
    fz_exec x;
} gen;

typedef struct { int nd; int64_t s[8]; ctpu_dtype dt; } tinfo;

uint64_t fz_gen_stats[FZ_KIND_COUNT][2];

static bool info_of(gen *g, int i, tinfo *t)
{
    ctpu_tensor h = g->x.reg[i];
    if (ctpu_is_null(h) || !ctpu_is_valid(h)) return false;
    int nd = 0;
    if (ctpu_shape(h, t->s, &nd) != CTPU_OK) { ctpu_clear_error(); return false; }
    t->nd = nd;
    t->dt = ctpu_dtype_of(h);
    return true;
}

/* Append instruction `in` and run it (strict eager). Returns its index or -1. */
static int emit(gen *g, fz_ins in)
{
    if (g->p->n >= g->o->max_ins || g->p->n >= FZ_MAX_INS) return -1;
    int i = g->p->n;
    g->p->ins[i] = in;
    if (g->sink) { g->sink->ins[i] = in; g->sink->n = i + 1; __atomic_thread_fence(__ATOMIC_SEQ_CST); }
    g->p->n++;
    ctpu_clear_error();
    exec_one(&g->x, g->p, i);
    fz_gen_stats[in.kind][ctpu_last_status() == CTPU_OK ? 0 : 1]++;
    return i;
}

/* A random live tensor (optionally of a float dtype / ndim >= min_nd). */
static int pick(gen *g, bool want_float, int min_nd, tinfo *t)
{
    int n = g->p->n;
    if (n == 0) return -1;
    for (int tries = 0; tries < 12; tries++) {
        int i = rn_below(g->r, n);
        /* recent values more often: chains fuse */
        if (rn_pct(g->r, 50) && n > 4) i = n - 1 - rn_below(g->r, 4);
        if (!info_of(g, i, t)) continue;
        if (want_float && t->dt == CTPU_I32) continue;
        if (t->nd < min_nd) continue;
        return i;
    }
    return -1;
}

static int64_t rand_extent(gen *g)
{
    static const int64_t ex[] = { 0, 1, 1, 1, 2, 2, 3, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 33 };
    if (rn_pct(g->r, 2)) return 130;
    return ex[rn_below(g->r, (int)(sizeof ex / sizeof ex[0]))];
}

static void rand_shape(gen *g, int *nd, int64_t *s)
{
    static const int nds[] = { 0, 1, 1, 2, 2, 2, 3, 3, 4 };
    *nd = nds[rn_below(g->r, 9)];
    int64_t total = 1;
    for (int d = 0; d < *nd; d++) {
        s[d] = rand_extent(g);
        if (total * (s[d] ? s[d] : 1) > 4096) s[d] = 1;
        total *= s[d] ? s[d] : 1;
    }
}

static int rand_dtype(gen *g, bool allow_i32)
{
    int k = rn_below(g->r, 10);
    if (k < 6) return CTPU_F32;
    if (k < 8 || !allow_i32) return CTPU_BF16;
    return CTPU_I32;
}

static int new_host(gen *g, int dt, int nd, const int64_t *s, int32_t bound)
{
    fz_ins in = { .kind = FZ_FROM_HOST, .dt = (uint8_t)dt, .nd = (uint8_t)nd, .a = -1, .b = -1, .c = -1 };
    memcpy(in.shape, s, sizeof(int64_t) * (size_t)nd);
    in.p[0] = bound;
    in.data = rn(g->r);
    return emit(g, in);
}

static double rand_scalar(gen *g)
{
    static const double sc[] = { 0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.0, -2.5, 0.1, 1e-3, 7.0, 1e30, -1e38, 1e-42 };
    int k = rn_below(g->r, 18);
    if (k < 14) return sc[k];
    if (k == 14) return NAN;
    if (k == 15) return INFINITY;
    return (double)((int)(rn(g->r) % 2001) - 1000) / 64.0;
}

/* A shape broadcast-compatible with t: some dims set to 1, leading dims dropped. */
static void bcast_shape(gen *g, const tinfo *t, int *nd, int64_t *s)
{
    int drop = rn_pct(g->r, 30) ? rn_below(g->r, t->nd + 1) : 0;
    *nd = t->nd - drop;
    for (int d = 0; d < *nd; d++) s[d] = rn_pct(g->r, 30) ? 1 : t->s[d + drop];
    if (rn_pct(g->r, 10) && *nd < 8) {   /* or more leading dims on the other side */
        memmove(s + 1, s, sizeof(int64_t) * (size_t)*nd);
        s[0] = 1 + rn_below(g->r, 3);
        (*nd)++;
    }
}

/* A second operand for a with a compatible shape: an existing tensor of that
 * shape, else a new one from host data. */
static int partner(gen *g, const tinfo *ta, bool same_shape, int dt)
{
    tinfo tb;
    for (int tries = 0; tries < 4; tries++) {
        int j = pick(g, false, 0, &tb);
        if (j < 0) break;
        if (tb.nd == ta->nd && memcmp(tb.s, ta->s, sizeof(int64_t) * (size_t)ta->nd) == 0 && (dt < 0 || (int)tb.dt == dt))
            return j;
    }
    int nd;
    int64_t s[8];
    if (same_shape) { nd = ta->nd; memcpy(s, ta->s, sizeof s); }
    else bcast_shape(g, ta, &nd, s);
    if (g->o->invalid && rn_pct(g->r, 3) && nd > 0) s[rn_below(g->r, nd)] += 1 + rn_below(g->r, 2);
    return new_host(g, dt >= 0 ? dt : rand_dtype(g, true), nd, s, 0);
}

/* Once gated on CTPU_TEST_KNOWN_BUGS (backward started at a leaf, fixed in
 * autograd.c): always on now. */
static bool fz_known_bugs_on(void) { return true; }

static void gen_one(gen *g)
{
    fz_ins in = { .a = -1, .b = -1, .c = -1 };
    tinfo ta;
    bool bad = g->o->invalid && rn_pct(g->r, 4);
    int k = rn_below(g->r, 100);
    if (g->p->n > 0 && rn_pct(g->r, 4)) {
        /* a region label (issue 11): pushed (sometimes an invalid one) or popped; provenance only */
        bool push = g->x.label_depth == 0 || rn_pct(g->r, 55);
        uint8_t sub = (uint8_t)(bad ? FZ_N_LABELS - 1 : rn_below(g->r, FZ_N_LABELS - 1));
        emit(g, (fz_ins){ .kind = push ? FZ_LABEL_PUSH : FZ_LABEL_POP, .sub = sub, .a = -1, .b = -1, .c = -1 });
        return;
    }
    if (g->p->n > 0 && rn_pct(g->r, 2) && g->p->n + 1 < g->o->max_ins) {
        /* steps over one structure with the rows marked dynamic (issue 15) */
        emit(g, (fz_ins){ .kind = FZ_DYNAMIC, .sub = (uint8_t)rn_below(g->r, N_UNARY), .a = -1, .b = -1, .c = -1,
                          .dt = (uint8_t)(rn_pct(g->r, 70) ? CTPU_F32 : CTPU_BF16),
                          .p = { rn_below(g->r, 47), 2 + rn_below(g->r, 9), 3 + rn_below(g->r, 4), rn_below(g->r, 3),
                                 1 + rn_below(g->r, 6), rn_below(g->r, 5), rn_below(g->r, DT_COUNT), rn_below(g->r, 64) },
                          .s0 = rand_scalar(g), .s1 = rand_scalar(g), .data = (uint32_t)rn_below(g->r, 1 << 30) });
        return;
    }
    if (g->p->n > 0 && rn_pct(g->r, 2) && g->p->n + 1 < g->o->max_ins) {
        /* steps over one structure, rows growing: past the recompile limit (issue 11) */
        emit(g, (fz_ins){ .kind = FZ_VARLEN, .sub = (uint8_t)rn_below(g->r, N_UNARY), .a = -1, .b = -1, .c = -1,
                          .dt = (uint8_t)(rn_pct(g->r, 70) ? CTPU_F32 : CTPU_BF16),
                          .p = { 1 + rn_below(g->r, 6), 1 + rn_below(g->r, 5), 3 + rn_below(g->r, 3) },
                          .s0 = rand_scalar(g), .data = (uint32_t)rn_below(g->r, 1 << 30) });
        return;
    }
    if (g->p->n == 0 || k < 10) {                       /* from host */
        int nd;
        int64_t s[8];
        rand_shape(g, &nd, s);
        int i = new_host(g, rand_dtype(g, true), nd, s, 0);
        if (i >= 0 && g->o->autograd && rn_pct(g->r, 35) && !ctpu_is_null(g->x.reg[i]) &&
            ctpu_dtype_of(g->x.reg[i]) != CTPU_I32)
            emit(g, (fz_ins){ .kind = FZ_REQ_GRAD, .a = (int16_t)i, .b = -1, .c = -1, .flag = 1 });
        return;
    }
    if (k < 14) {                                       /* creation */
        in.kind = FZ_CREATE;
        in.sub = (uint8_t)rn_below(g->r, N_CREATE);
        int nd;
        rand_shape(g, &nd, in.shape);
        in.nd = (uint8_t)nd;
        in.dt = (uint8_t)rand_dtype(g, in.sub < 4);
        in.s0 = in.sub == 2 ? rand_scalar(g) : (double)rn_below(g->r, 5) - 2;
        in.s1 = in.s0 + 0.5 + rn_below(g->r, 20);
        in.p[0] = 1 + rn_below(g->r, 8);                /* arange step * 4 */
        if (bad) { if (in.sub >= 4) in.dt = CTPU_I32; else if (nd) in.shape[0] = -1; }
        emit(g, in);
        return;
    }
    if (k < 86) {
        int a = pick(g, false, 0, &ta);
        if (a < 0) return;
        in.a = (int16_t)a;
        if (k < 24) {
            in.kind = FZ_UNARY;
            in.sub = (uint8_t)rn_below(g->r, N_UNARY);
        } else if (k < 36) {
            in.kind = FZ_BINARY;
            in.sub = (uint8_t)rn_below(g->r, N_BINARY);
            int b = partner(g, &ta, false, -1);
            if (b < 0) return;
            if (rn_pct(g->r, 50)) { in.b = (int16_t)b; } else { in.b = in.a; in.a = (int16_t)b; }
        } else if (k < 44) {
            in.kind = FZ_SCALAR;
            in.sub = (uint8_t)rn_below(g->r, N_SCALAR);
            in.s0 = rand_scalar(g);
        } else if (k < 46) {
            in.kind = FZ_WHERE;
            int b = partner(g, &ta, false, -1), c = partner(g, &ta, false, -1);
            if (b < 0 || c < 0) return;
            in.b = (int16_t)b;
            in.c = (int16_t)c;
        } else if (k < 48) {
            in.kind = FZ_CLAMP;
            in.s0 = rand_scalar(g);
            in.s1 = rn_pct(g->r, 80) ? in.s0 + rn_below(g->r, 4) : rand_scalar(g);
        } else if (k < 51) {
            in.kind = FZ_CAST;
            in.dt = (uint8_t)(bad ? 7 : rand_dtype(g, true));
        } else if (k < 57) {
            in.kind = FZ_REDUCE;
            in.sub = (uint8_t)rn_below(g->r, N_REDUCE);
            in.flag = (uint8_t)rn_below(g->r, 2);
            int nd = rn_pct(g->r, 30) ? 0 : rn_below(g->r, ta.nd + 1);
            uint32_t used = 0;
            int m = 0;
            for (int d = 0; d < nd; d++) {
                int v = rn_below(g->r, ta.nd);
                if (used & (1u << v)) continue;
                used |= 1u << v;
                in.p[m++] = rn_pct(g->r, 30) ? v - ta.nd : v;
            }
            if (bad) in.p[m++] = ta.nd;
            in.nd = (uint8_t)m;
            in.shape[0] = rn_below(g->r, 3);
        } else if (k < 59) {
            in.kind = FZ_ARGMAX;
            in.p[0] = ta.nd ? rn_below(g->r, 2 * ta.nd) - ta.nd : 0;
            if (bad) in.p[0] = ta.nd + 1;
            in.flag = (uint8_t)rn_below(g->r, 2);
        } else if (k < 62) {
            in.kind = FZ_SOFTMAX;
            in.sub = (uint8_t)rn_below(g->r, 2);
            in.p[0] = ta.nd ? rn_below(g->r, ta.nd) : 0;
        } else if (k < 65) {
            in.kind = FZ_RESHAPE;
            int64_t n = numel_of(ta.nd, ta.s);
            switch (rn_below(g->r, 4)) {
            case 0: in.nd = 1; in.shape[0] = rn_pct(g->r, 50) ? -1 : n; break;
            case 1: in.nd = (uint8_t)ta.nd; for (int d = 0; d < ta.nd; d++) in.shape[d] = ta.s[ta.nd - 1 - d]; break;
            case 2: in.nd = 3; in.shape[0] = 1; in.shape[1] = n; in.shape[2] = 1; break;
            default: {
                int64_t f = 1;
                for (int64_t q = 2; q <= 7; q++) if (n % q == 0) { f = q; break; }
                in.nd = 2; in.shape[0] = f; in.shape[1] = rn_pct(g->r, 50) ? -1 : (f ? n / f : 0);
            }
            }
            if (bad) in.shape[0] += 1;
        } else if (k < 67) {
            in.kind = FZ_PERMUTE;
            in.nd = (uint8_t)ta.nd;
            for (int d = 0; d < ta.nd; d++) in.p[d] = d;
            for (int d = ta.nd - 1; d > 0; d--) { int j = rn_below(g->r, d + 1); int t = in.p[d]; in.p[d] = in.p[j]; in.p[j] = t; }
            if (bad && ta.nd > 1) in.p[0] = in.p[1];
        } else if (k < 69) {
            if (ta.nd == 0) return;
            in.kind = FZ_TRANSPOSE;
            in.p[0] = rn_below(g->r, ta.nd);
            in.p[1] = rn_below(g->r, ta.nd) - (rn_pct(g->r, 30) ? ta.nd : 0);
        } else if (k < 70) {
            in.kind = rn_pct(g->r, 50) ? FZ_CONTIGUOUS : FZ_DETACH;
        } else if (k < 74) {
            if (ta.nd == 0) return;
            in.kind = FZ_SLICE;
            int d = rn_below(g->r, ta.nd);
            int64_t e = ta.s[d];
            in.p[0] = d;
            in.shape[0] = rn_below(g->r, (int)e + 3) - 1 - (rn_pct(g->r, 20) ? (int)e : 0);
            in.shape[1] = rn_pct(g->r, 20) ? INT64_MAX : rn_below(g->r, (int)e + 3) - (rn_pct(g->r, 20) ? (int)e : 0);
            in.shape[2] = bad ? 0 : 1 + (rn_pct(g->r, 40) ? rn_below(g->r, 3) : 0);
        } else if (k < 77) {
            if (ta.nd == 0) return;
            in.kind = FZ_CONCAT;
            int d = rn_below(g->r, ta.nd);
            in.p[0] = rn_pct(g->r, 20) ? d - ta.nd : d;
            int cnt = 1 + rn_below(g->r, 3);
            for (int q = 1; q < cnt; q++) {
                int64_t s[8];
                memcpy(s, ta.s, sizeof s);
                s[d] = rn_below(g->r, 4);
                if (bad && ta.nd > 1) s[(d + 1) % ta.nd] += 1;
                int j = new_host(g, ta.dt, ta.nd, s, 0);
                if (j < 0) return;
                if (q == 1) in.b = (int16_t)j; else in.c = (int16_t)j;
            }
        } else if (k < 80) {
            in.kind = FZ_EXPAND;
            int lead = rn_pct(g->r, 40) ? 1 + rn_below(g->r, 2) : 0;
            if (ta.nd + lead > 8) lead = 0;
            in.nd = (uint8_t)(ta.nd + lead);
            for (int d = 0; d < lead; d++) in.shape[d] = 1 + rn_below(g->r, 3);
            for (int d = 0; d < ta.nd; d++)
                in.shape[lead + d] = ta.s[d] == 1 ? (rn_pct(g->r, 60) ? 1 + rn_below(g->r, 4) : 1) : (rn_pct(g->r, 20) ? -1 : ta.s[d]);
            if (bad && ta.nd) in.shape[lead] = ta.s[0] + 2;
        } else if (k < 82) {
            /* embedding: a float [V, D] weight and i32 indices in [0, V) */
            in.kind = FZ_EMBEDDING;
            if (ta.nd != 2 || ta.dt == CTPU_I32 || ta.s[0] == 0) {
                int64_t s[2] = { 1 + rn_below(g->r, 9), rand_extent(g) };
                int w = new_host(g, rn_pct(g->r, 70) ? CTPU_F32 : CTPU_BF16, 2, s, 0);
                if (w < 0 || !info_of(g, w, &ta)) return;
                in.a = (int16_t)w;
            }
            int nd = rn_below(g->r, 3);
            int64_t s[8];
            for (int d = 0; d < nd; d++) s[d] = rand_extent(g) % 6;
            int j = new_host(g, CTPU_I32, nd, s, (int32_t)ta.s[0]);
            if (j < 0) return;
            in.b = (int16_t)j;
            if (g->o->autograd && rn_pct(g->r, 30) && !g->x.leaf[in.a])
                emit(g, (fz_ins){ .kind = FZ_REQ_GRAD, .a = in.a, .b = -1, .c = -1, .flag = 1 });
        } else if (k < 84) {
            if (ta.nd == 0) return;
            in.kind = FZ_GATHER;
            int d = rn_below(g->r, ta.nd);
            if (ta.s[d] == 0) return;
            in.p[0] = d;
            int64_t s[8];
            for (int q = 0; q < ta.nd; q++) s[q] = q == d ? 1 + rn_below(g->r, 4) : rn_below(g->r, (int)ta.s[q] + 1);
            int j = new_host(g, CTPU_I32, ta.nd, s, (int32_t)ta.s[d]);
            if (j < 0) return;
            in.b = (int16_t)j;
        } else {
            /* matmul: b [K, N], [K] or batched, maybe stored transposed */
            if (ta.nd == 0 || ta.nd > 3) return;
            in.kind = FZ_MATMUL;
            in.sub = (uint8_t)rn_pct(g->r, 30);
            if (in.sub && ta.nd >= 2 && rn_pct(g->r, 40)) in.flag |= 1;
            int64_t K = (in.flag & 1) ? ta.s[ta.nd - 2] : ta.s[ta.nd - 1];
            int64_t N = rand_extent(g);
            int nd = (ta.nd == 1 || in.sub) ? 2 : 1 + rn_below(g->r, 3);
            if (in.sub && rn_pct(g->r, 50)) in.flag |= 2;
            int64_t s[3];
            if (nd == 1) s[0] = K;
            else if (nd == 2) { s[0] = K; s[1] = N; }
            else { s[0] = rn_pct(g->r, 50) ? 1 : (ta.nd == 3 ? ta.s[0] : 2); s[1] = K; s[2] = N; }
            if (in.flag & 2) { int64_t t = s[nd - 1]; s[nd - 1] = s[nd - 2]; s[nd - 2] = t; }
            if (bad) s[nd - 1] += 1;
            int dt = rn_pct(g->r, 80) ? (ta.dt == CTPU_I32 ? (int)CTPU_F32 : (int)ta.dt) : rand_dtype(g, true);
            int j = new_host(g, dt, nd, s, 0);
            if (j < 0) return;
            in.b = (int16_t)j;
        }
        /* sometimes any earlier value instead (maybe released, stale, or of
         * another shape); not for gather/embedding, whose index data was
         * made in range for `a` (a device fault is outside parity: it is
         * reported at the call in debug eager and at the next sync otherwise) */
        if (bad && rn_pct(g->r, 25) && in.kind != FZ_GATHER && in.kind != FZ_EMBEDDING)
            in.a = (int16_t)rn_below(g->r, g->p->n);
        emit(g, in);
        return;
    }
    /* state, autograd, reads */
    if (k < 88) {                                     /* assign: the parameter update pattern */
        int a = pick(g, false, 0, &ta);
        if (a < 0) return;
        int b;
        if (rn_pct(g->r, 60)) {
            fz_ins u = { .kind = FZ_SCALAR, .sub = (uint8_t)rn_below(g->r, 3), .a = (int16_t)a, .b = -1, .c = -1, .s0 = rand_scalar(g) };
            b = emit(g, u);
        } else {
            b = partner(g, &ta, true, bad ? -1 : (int)ta.dt);
        }
        if (b < 0) return;
        emit(g, (fz_ins){ .kind = FZ_ASSIGN, .a = (int16_t)a, .b = (int16_t)b, .c = -1 });
        return;
    }
    if (k < 91) { int a = pick(g, false, 0, &ta); if (a >= 0) emit(g, (fz_ins){ .kind = FZ_READ, .a = (int16_t)a, .b = -1, .c = -1 }); return; }
    if (k < 92) {                                    /* item of a full reduction (or of anything) */
        int a = pick(g, false, 0, &ta);
        if (a < 0) return;
        if (rn_pct(g->r, 80)) a = emit(g, (fz_ins){ .kind = FZ_REDUCE, .sub = (uint8_t)rn_below(g->r, N_REDUCE), .a = (int16_t)a, .b = -1, .c = -1 });
        if (a >= 0) emit(g, (fz_ins){ .kind = FZ_ITEM, .a = (int16_t)a, .b = -1, .c = -1 });
        return;
    }
    if (k < 93) { emit(g, (fz_ins){ .kind = FZ_MARK_STEP, .a = -1, .b = -1, .c = -1 }); return; }
    if (k < 95) {
        if (g->x.step_depth > 0 && rn_pct(g->r, 70)) {
            /* keep one value past the step's end, sometimes */
            int a = pick(g, false, 0, &ta);
            if (a >= 0 && rn_pct(g->r, 60)) emit(g, (fz_ins){ .kind = FZ_KEEP, .a = (int16_t)a, .b = -1, .c = -1 });
            emit(g, (fz_ins){ .kind = FZ_STEP_END, .a = -1, .b = -1, .c = -1 });
        } else {
            emit(g, (fz_ins){ .kind = FZ_STEP_BEGIN, .a = -1, .b = -1, .c = -1 });
        }
        return;
    }
    if (k < 96) {
        int a = pick(g, false, 0, &ta);
        if (a >= 0) emit(g, (fz_ins){ .kind = FZ_RELEASE, .a = (int16_t)a, .b = -1, .c = -1 });
        return;
    }
    if (k < 97) { emit(g, (fz_ins){ .kind = FZ_SYNC, .a = -1, .b = -1, .c = -1 }); return; }
    if (!g->o->autograd) return;
    if (k < 99) {                                      /* backward from something that requires grad */
        for (int tries = 0; tries < 8; tries++) {
            int a = pick(g, true, 0, &ta);
            if (a < 0) return;
            if (!ctpu_requires_grad(g->x.reg[a]) && !rn_pct(g->r, 5)) continue;
            fz_ins b = { .kind = FZ_BACKWARD, .a = (int16_t)a, .b = -1, .c = -1 };
            /* backward_ex straight from a leaf: autograd.c's qsort(NULL, 0)
             * (open bug, regressions.inc fuzz_seed_100019) */
            bool leaf_root = g->x.leaf[a] && !fz_known_bugs_on();
            if (rn_pct(g->r, 30) && !leaf_root) {
                b.sub = 1;
                b.flag = (uint8_t)rn_below(g->r, 2);
                int j = new_host(g, ta.dt, ta.nd, ta.s, 0);
                if (j < 0) return;
                b.b = (int16_t)j;
            }
            emit(g, b);
            return;
        }
        return;
    }
    if (rn_pct(g->r, 50)) {
        for (int i = 0; i < g->p->n; i++)
            if (g->x.leaf[i] && !ctpu_is_null(g->x.reg[i])) { emit(g, (fz_ins){ .kind = FZ_ZERO_GRAD, .a = (int16_t)i, .b = -1, .c = -1 }); return; }
    } else if (g->x.nograd_depth > 0) {
        emit(g, (fz_ins){ .kind = FZ_NO_GRAD_END, .a = -1, .b = -1, .c = -1 });
    } else {
        emit(g, (fz_ins){ .kind = FZ_NO_GRAD_BEGIN, .a = -1, .b = -1, .c = -1 });
    }
}

void fz_generate(fz_rng *r, const fz_opts *o, fz_prog *out, fz_prog *sink)
{
    memset(out, 0, sizeof *out);
    out->seed = r->state ^ 0x5eed;
    out->precision = (uint8_t)(rn_below(r, 10) < 7 ? 0 : rn_below(r, 3));
    if (sink) { memset(sink, 0, sizeof *sink); sink->seed = out->seed; sink->precision = out->precision; }
    gen g = { .r = r, .o = o, .p = out, .sink = sink };
    ctpu_set_mode(CTPU_MODE_STRICT);
    ctpu_set_debug_checks(false);
    exec_begin(&g.x, out, NULL);
    int guard = 0;
    while (out->n < o->max_ins && out->n < FZ_MAX_INS && guard++ < 4 * FZ_MAX_INS) gen_one(&g);
    g.x.tape = NULL;
    exec_end(&g.x, out);
}

/* ------------------------------------------------------------ minimisation */
/* The program with instructions keep[i] == false removed; operands that
 * pointed at a removed instruction become -2 (the user is then a no-op). */
static void subset(const fz_prog *p, const bool *keep, fz_prog *out)
{
    int map[FZ_MAX_INS];
    memset(out, 0, sizeof *out);
    out->seed = p->seed;
    out->precision = p->precision;
    for (int i = 0; i < p->n; i++) {
        if (!keep[i]) { map[i] = -2; continue; }
        fz_ins in = p->ins[i];
        int16_t *ops[3] = { &in.a, &in.b, &in.c };
        for (int k = 0; k < 3; k++)
            if (*ops[k] >= 0) *ops[k] = (int16_t)map[*ops[k]];
        map[i] = out->n;
        out->ins[out->n++] = in;
    }
    /* drop users of dropped operands too, so the printed case is clean */
    bool again = true;
    while (again) {
        again = false;
        for (int i = 0; i < out->n; i++) {
            fz_ins *in = &out->ins[i];
            if (in->a == -2 || in->b == -2 || in->c == -2) {
                bool k2[FZ_MAX_INS];
                for (int j = 0; j < out->n; j++) k2[j] = j != i;
                fz_prog tmp = *out;
                subset(&tmp, k2, out);
                again = true;
                break;
            }
        }
    }
}

void fz_minimise(fz_prog *p, bool (*fails)(const fz_prog *, void *), void *ctx)
{
    int gran = 2;
    while (p->n >= 2) {
        int chunk = (p->n + gran - 1) / gran;
        bool reduced = false;
        for (int start = 0; start < p->n; start += chunk) {
            bool keep[FZ_MAX_INS];
            for (int i = 0; i < p->n; i++) keep[i] = i < start || i >= start + chunk;
            fz_prog cand;
            subset(p, keep, &cand);
            if (cand.n < p->n && cand.n > 0 && fails(&cand, ctx)) {
                *p = cand;
                gran = gran > 2 ? gran - 1 : 2;
                reduced = true;
                break;
            }
        }
        if (!reduced) {
            if (chunk == 1) break;
            gran = gran * 2 > p->n ? p->n : gran * 2;
        }
    }
}

/* ------------------------------------------------------------ forked campaigns */
/* Seconds one program (three modes) may take before it counts as hung: a
 * program takes milliseconds, so this is generous even under sanitizers. */
#define FZ_HANG_SECONDS 60
typedef struct {
    volatile int phase;            /* 0 idle, 1 generating, 2 checking */
    volatile uint64_t seed;        /* the program being run */
    volatile int done;             /* programs finished by the child */
    volatile int skipped;
    fz_prog prog;                  /* the program being generated / checked */
    char why[512];
} fz_shared;

/* In a child: init, then generate and check programs from `seed` on. Exit 0
 * when all passed, 3 when a program's modes differ (left in sh). */
static void child_campaign(fz_shared *sh, uint64_t seed, int count, const fz_opts *o)
{
    setenv("TORCH_TPU_RECOMPILE_LIMIT", FZ_RECOMPILE_LIMIT, 1);
    if (ctpu_init() != CTPU_OK) { fprintf(stderr, "fuzz: init: %s\n", ctpu_last_error()); _exit(2); }
    for (int k = 0; k < count; k++) {
        alarm(FZ_HANG_SECONDS);        /* a hang (a lost wake-up, a deadlock) is a failure too */
        fz_rng r;
        fz_rng_seed(&r, seed + (uint64_t)k);
        sh->seed = seed + (uint64_t)k;
        sh->phase = 1;
        fz_prog p;
        fz_generate(&r, o, &p, &sh->prog);
        sh->prog = p;
        sh->phase = 2;
        bool skipped = false;
        if (!fz_check(&p, sh->why, sizeof sh->why, &skipped)) { ctpu_shutdown(); _exit(3); }
        if (skipped) sh->skipped++;
        sh->done++;
        sh->phase = 0;
    }
    ctpu_shutdown();
    _exit(0);
}

/* Run fn in a child; returns its exit status, or 128 + signal. */
static int in_child(void (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) { fn(arg); _exit(0); }
    if (pid < 0) return -1;
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

typedef struct { fz_shared *sh; const fz_prog *p; } trial_arg;
static void trial_fn(void *v)
{
    trial_arg *t = v;
    alarm(FZ_HANG_SECONDS);
    setenv("TORCH_TPU_RECOMPILE_LIMIT", FZ_RECOMPILE_LIMIT, 1);
    if (ctpu_init() != CTPU_OK) _exit(2);
    bool skipped;
    bool ok = fz_check(t->p, t->sh->why, sizeof t->sh->why, &skipped);
    ctpu_shutdown();
    _exit(ok || skipped ? 0 : 3);
}

typedef struct { fz_shared *sh; int want; } fail_ctx;
/* The same failure: a difference (3) stays a difference; a crash stays the
 * same signal (SIGALRM: a hang). */
static bool trial_fails(const fz_prog *p, void *v)
{
    fail_ctx *c = v;
    trial_arg t = { c->sh, p };
    return in_child(trial_fn, &t) == c->want;
}

typedef struct { fz_shared *sh; uint64_t seed; int count; const fz_opts *o; } camp_arg;
static void camp_fn(void *v)
{
    camp_arg *a = v;
    child_campaign(a->sh, a->seed, a->count, a->o);
}

int fz_campaign(uint64_t seed0, int count, const fz_opts *o, FILE *report, int *ran, int *skipped)
{
    fz_shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) return -1;
    int failures = 0, total = 0, skips = 0;
    uint64_t seed = seed0, end = seed0 + (uint64_t)count;
    while (seed < end) {
        memset(sh, 0, sizeof *sh);
        camp_arg a = { sh, seed, (int)(end - seed), o };
        int rc = in_child(camp_fn, &a);
        total += sh->done;
        skips += sh->skipped;
        if (rc == 0) break;
        if (rc != 3 && rc != 1 && rc < 128) {
            fprintf(report, "fuzz: campaign child exited with %d at seed %llu\n", rc, (unsigned long long)sh->seed);
            failures++;
            break;
        }
        failures++;
        total++;
        uint64_t bad = sh->seed;
        fz_prog p = sh->prog;
        int want = rc;       /* 3: modes differ; 1: a sanitizer report (exitcode 1); >= 128: a signal */
        fprintf(report, "fuzz: seed %llu: %s%s\n", (unsigned long long)bad,
                rc == 3 ? sh->why : rc == 1 ? "sanitizer report (exit status 1)" : strsignal(rc - 128),
                rc == 128 + SIGALRM ? " (hung)" : "");
        fflush(report);
        int before = p.n;
        fail_ctx fc = { sh, want };
        if (trial_fails(&p, &fc)) {
            fz_minimise(&p, trial_fails, &fc);
            trial_fails(&p, &fc);   /* leaves the minimal case's description in sh->why */
            fprintf(report, "fuzz: minimised %d -> %d calls: %s\n", before, p.n,
                    want == 3 ? sh->why : want == 1 ? "sanitizer report" : strsignal(want - 128));
        } else {
            fprintf(report, "fuzz: the failure did not reproduce in a fresh process (state from earlier programs)\n");
        }
        char name[64];
        snprintf(name, sizeof name, "fuzz_seed_%llu", (unsigned long long)bad);
        fz_print_c(&p, name, report);
        fflush(report);
        seed = bad + 1;
    }
    munmap(sh, sizeof *sh);
    if (ran) *ran = total;
    if (skipped) *skipped = skips;
    return failures;
}
