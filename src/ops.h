/* The op table and the node IR, shared by eager, fuse and device.
 *
 * Every op is declared once, here, as one row of CTPU_OP_TABLE carrying every
 * fact that more than one layer needs:
 *   X(ENUM, "name", kind flags, arity, dtype rule, shape rule, kernel id,
 *     fusion class, cost class, gradient)
 * - kind flags: CTPU_OPK_* (what the op is; CTPU_OPK_FAULTS: it can raise a
 *   device fault, e.g. an out-of-range index);
 * - arity: tensor inputs, -1 = variadic (concat);
 * - dtype rule (CTPU_DT_*) and shape rule (CTPU_SH_*): how dispatch infers the
 *   output type from the arguments (src/eager/dispatch.c has one rule per id);
 * - kernel id: the ctpu_k_unary_op / ctpu_k_binary_op code of elementwise
 *   rows (CTPU_K_E_* for where, clamp, cast), the ctpu_k_red_op of
 *   reductions, 0 elsewhere;
 * - fusion class (CTPU_FUSE_*): how the compiler may fuse it (src/fuse/);
 * - cost class (CTPU_CC_*): which roofline term counts it (the per-op weight
 *   is in the cost model's own table);
 * - gradient (CTPU_GRAD_*): a backward rule in autograd.c's table, or none
 *   (collectives carry none: DDP reduces gradients under no_grad).
 * Facts that only one layer uses live in that layer's table, indexed by op
 * (designated initialisers), each checked complete by a test: exec handlers
 * (src/fuse/exec.c), epilogue activations (src/fuse/vm.c), cost weights
 * (src/cost/costmodel.c), backward rules (src/eager/autograd.c). The data
 * of this table is in src/ops.c, where its row count is pinned.
 */
#ifndef CTPU_OPS_H
#define CTPU_OPS_H

#include <stdint.h>
#include <stdbool.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include "kernels.h"

/* A broken internal invariant (never a user error): abort with file:line. */
#define CTPU_ASSERT(x) do { if (!(x)) { fprintf(stderr, "ctpu: internal error: %s at %s:%d\n", #x, \
                                                __FILE__, __LINE__); abort(); } } while (0)

enum {
    CTPU_OPK_UNARY       = 1u << 0,   /* elementwise, one tensor */
    CTPU_OPK_BINARY      = 1u << 1,   /* elementwise, two tensors, broadcast */
    CTPU_OPK_SCALAR      = 1u << 2,   /* elementwise, tensor op runtime scalar */
    CTPU_OPK_TERNARY     = 1u << 3,   /* where */
    CTPU_OPK_ELEMENTWISE = 1u << 4,   /* any of the above + clamp, cast */
    CTPU_OPK_REDUCTION   = 1u << 5,
    CTPU_OPK_MATMUL      = 1u << 6,
    CTPU_OPK_MOVEMENT    = 1u << 7,   /* reshape, permute, slice, concat, ... */
    CTPU_OPK_VIEW        = 1u << 8,   /* may share storage (metadata only) */
    CTPU_OPK_CREATION    = 1u << 9,   /* no tensor inputs */
    CTPU_OPK_RANDOM      = 1u << 10,
    CTPU_OPK_COMPARE     = 1u << 11,  /* result is an f32 mask */
    CTPU_OPK_FLOAT_OUT   = 1u << 12,  /* i32 inputs give f32 (exp, div, ...) */
    CTPU_OPK_FAULTS      = 1u << 13,  /* may raise a device fault (bounds) */
    CTPU_OPK_BACKWARD    = 1u << 14,  /* a helper op used by backward rules */
    CTPU_OPK_COLLECTIVE  = 1u << 15,  /* across ranks (src/dist/): runs on the device thread, may cut a trace */
    CTPU_OPK_ATTENTION   = 1u << 16,  /* blockwise attention (its two MXU products are inside one kernel) */
};

/* Output dtype rules (dispatch: out_dtype). */
enum {
    CTPU_DT_SAME,           /* in[0]'s dtype */
    CTPU_DT_FLOAT,          /* in[0]'s dtype; i32 gives f32 */
    CTPU_DT_PROMOTE,        /* promote(in[0], in[1]): f32 > bf16 > i32 */
    CTPU_DT_PROMOTE_FLOAT,  /* the promotion; i32 gives f32 */
    CTPU_DT_MASK,           /* f32 (comparisons) */
    CTPU_DT_WHERE,          /* promote(in[1], in[2]) */
    CTPU_DT_INDEX,          /* i32 (argmax) */
    CTPU_DT_MATMUL,         /* i32 x i32 -> i32, bf16 x bf16 -> bf16, else f32 */
    CTPU_DT_CAST,           /* the dtype argument, kept in attr.extra */
    CTPU_DT_ARG,            /* the dtype argument (creation) */
    CTPU_DT_GIVEN,          /* set by the op's builder (copy, backward helpers) */
    CTPU_DT_RULE_COUNT
};

/* Output shape rules (dispatch: one function per id). */
enum {
    CTPU_SH_SAME,           /* in[0]'s shape (unary, scalar, clamp, cast) */
    CTPU_SH_BROADCAST,      /* NumPy broadcasting of every input */
    CTPU_SH_REDUCE,         /* the reduced dims dropped (or kept as 1) */
    CTPU_SH_ARGREDUCE,      /* one reduced dim (argmax) */
    CTPU_SH_ALONG,          /* in[0]'s shape, one normalised dim in attrs (softmax, cumsum) */
    CTPU_SH_RESHAPE,
    CTPU_SH_PERMUTE,
    CTPU_SH_SLICE,
    CTPU_SH_CONCAT,
    CTPU_SH_EXPAND,
    CTPU_SH_EMBEDDING,
    CTPU_SH_GATHER,
    CTPU_SH_SCATTER,        /* scatter_add: self's shape (index and src checked against it) */
    CTPU_SH_MATMUL,         /* plain and transposed operands (attr flags) */
    CTPU_SH_CREATE,         /* the shape argument */
    CTPU_SH_GIVEN,          /* set by the op's builder (copy, backward helpers) */
    CTPU_SH_RULE_COUNT
};

/* Kernel ids of the elementwise rows outside ctpu_k_unary_op / _binary_op. */
enum { CTPU_K_E_WHERE = 1, CTPU_K_E_CLAMP, CTPU_K_E_CAST };

/* Fusion classes (src/fuse/compile.c). */
enum {
    CTPU_FUSE_NONE,         /* a step of its own */
    CTPU_FUSE_VM,           /* elementwise: a block-VM group member */
    CTPU_FUSE_ADD,          /* VM member; also a matmul epilogue's bias or residual add */
    CTPU_FUSE_ACT,          /* VM member; also a matmul epilogue's activation (vm.c's table) */
    CTPU_FUSE_REDUCE,       /* a reduction that takes its input straight from a VM group */
    CTPU_FUSE_REDUCE_MEAN,  /* the same, divided by the reduced count */
    CTPU_FUSE_MXU,          /* matmul: heads a bias / activation / residual epilogue */
    CTPU_FUSE_CLASS_COUNT
};

/* Cost classes (src/cost/costmodel.c; the weight per op is its table's). */
enum {
    CTPU_CC_NONE,           /* no compute (movement, views, fills) */
    CTPU_CC_OUT,            /* vector ops: output elements x weight */
    CTPU_CC_IN,             /* vector ops: input elements x weight (reductions) */
    CTPU_CC_MXU,            /* MXU passes over the padded matmul */
    CTPU_CC_ATTN,           /* attention: its MXU products padded, plus the vector work per score */
    CTPU_CC_CLASS_COUNT
};

/* Gradient (src/eager/autograd.c). */
enum {
    CTPU_GRAD_NONE,         /* results carry no gradient (masks, indices, creation, helpers) */
    CTPU_GRAD_RULE,         /* a backward rule in autograd.c's table */
};

#define CTPU_OPK__U  (CTPU_OPK_UNARY | CTPU_OPK_ELEMENTWISE)
#define CTPU_OPK__UF (CTPU_OPK_UNARY | CTPU_OPK_ELEMENTWISE | CTPU_OPK_FLOAT_OUT)
#define CTPU_OPK__B  (CTPU_OPK_BINARY | CTPU_OPK_ELEMENTWISE)
#define CTPU_OPK__BC (CTPU_OPK_BINARY | CTPU_OPK_ELEMENTWISE | CTPU_OPK_COMPARE)
#define CTPU_OPK__BF (CTPU_OPK_BINARY | CTPU_OPK_ELEMENTWISE | CTPU_OPK_FLOAT_OUT)
#define CTPU_OPK__S  (CTPU_OPK_SCALAR | CTPU_OPK_ELEMENTWISE)
#define CTPU_OPK__SC (CTPU_OPK_SCALAR | CTPU_OPK_ELEMENTWISE | CTPU_OPK_COMPARE)
#define CTPU_OPK__SF (CTPU_OPK_SCALAR | CTPU_OPK_ELEMENTWISE | CTPU_OPK_FLOAT_OUT)
#define CTPU_OPK__R  CTPU_OPK_REDUCTION
#define CTPU_OPK__MV CTPU_OPK_MOVEMENT
#define CTPU_OPK__CR CTPU_OPK_CREATION

/* The rows. Columns: enum, name, kind, arity, dtype rule, shape rule,
 * kernel id, fusion class, cost class, gradient (the prefixes CTPU_DT_,
 * CTPU_SH_, CTPU_FUSE_, CTPU_CC_, CTPU_GRAD_ are added by the expansion). */
#define CTPU_OP_TABLE(X) \
    X(NEG,         "neg",          CTPU_OPK__U,  1, SAME,          SAME,      CTPU_K_U_NEG,       VM,     OUT, RULE) \
    X(ABS,         "abs",          CTPU_OPK__U,  1, SAME,          SAME,      CTPU_K_U_ABS,       VM,     OUT, RULE) \
    X(EXP,         "exp",          CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_EXP,       VM,     OUT, RULE) \
    X(LOG,         "log",          CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_LOG,       VM,     OUT, RULE) \
    X(SQRT,        "sqrt",         CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_SQRT,      VM,     OUT, RULE) \
    X(RSQRT,       "rsqrt",        CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_RSQRT,     VM,     OUT, RULE) \
    X(TANH,        "tanh",         CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_TANH,      VM,     OUT, RULE) \
    X(SIGMOID,     "sigmoid",      CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_SIGMOID,   VM,     OUT, RULE) \
    X(RELU,        "relu",         CTPU_OPK__U,  1, SAME,          SAME,      CTPU_K_U_RELU,      ACT,    OUT, RULE) \
    X(GELU_TANH,   "gelu_tanh",    CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_GELU_TANH, ACT,    OUT, RULE) \
    X(GELU_ERF,    "gelu",         CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_GELU_ERF,  ACT,    OUT, RULE) \
    X(SOFTPLUS,    "softplus",     CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_SOFTPLUS,  VM,     OUT, RULE) \
    X(ERF,         "erf",          CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_ERF,       VM,     OUT, RULE) \
    X(SIN,         "sin",          CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_SIN,       VM,     OUT, RULE) \
    X(COS,         "cos",          CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_COS,       VM,     OUT, RULE) \
    X(LOG1P,       "log1p",        CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_LOG1P,     VM,     OUT, RULE) \
    X(EXPM1,       "expm1",        CTPU_OPK__UF, 1, FLOAT,         SAME,      CTPU_K_U_EXPM1,     VM,     OUT, RULE) \
    X(ADD,         "add",          CTPU_OPK__B,  2, PROMOTE,       BROADCAST, CTPU_K_B_ADD,       ADD,    OUT, RULE) \
    X(SUB,         "sub",          CTPU_OPK__B,  2, PROMOTE,       BROADCAST, CTPU_K_B_SUB,       VM,     OUT, RULE) \
    X(MUL,         "mul",          CTPU_OPK__B,  2, PROMOTE,       BROADCAST, CTPU_K_B_MUL,       VM,     OUT, RULE) \
    X(DIV,         "div",          CTPU_OPK__BF, 2, PROMOTE_FLOAT, BROADCAST, CTPU_K_B_DIV,       VM,     OUT, RULE) \
    X(POW,         "pow",          CTPU_OPK__BF, 2, PROMOTE_FLOAT, BROADCAST, CTPU_K_B_POW,       VM,     OUT, RULE) \
    X(MAXIMUM,     "maximum",      CTPU_OPK__B,  2, PROMOTE,       BROADCAST, CTPU_K_B_MAX,       VM,     OUT, RULE) \
    X(MINIMUM,     "minimum",      CTPU_OPK__B,  2, PROMOTE,       BROADCAST, CTPU_K_B_MIN,       VM,     OUT, RULE) \
    X(EQ,          "eq",           CTPU_OPK__BC, 2, MASK,          BROADCAST, CTPU_K_B_EQ,        VM,     OUT, NONE) \
    X(NE,          "ne",           CTPU_OPK__BC, 2, MASK,          BROADCAST, CTPU_K_B_NE,        VM,     OUT, NONE) \
    X(LT,          "lt",           CTPU_OPK__BC, 2, MASK,          BROADCAST, CTPU_K_B_LT,        VM,     OUT, NONE) \
    X(LE,          "le",           CTPU_OPK__BC, 2, MASK,          BROADCAST, CTPU_K_B_LE,        VM,     OUT, NONE) \
    X(GT,          "gt",           CTPU_OPK__BC, 2, MASK,          BROADCAST, CTPU_K_B_GT,        VM,     OUT, NONE) \
    X(GE,          "ge",           CTPU_OPK__BC, 2, MASK,          BROADCAST, CTPU_K_B_GE,        VM,     OUT, NONE) \
    X(ADD_SCALAR,  "add_scalar",   CTPU_OPK__S,  1, SAME,          SAME,      CTPU_K_B_ADD,       VM,     OUT, RULE) \
    X(SUB_SCALAR,  "sub_scalar",   CTPU_OPK__S,  1, SAME,          SAME,      CTPU_K_B_SUB,       VM,     OUT, RULE) \
    X(MUL_SCALAR,  "mul_scalar",   CTPU_OPK__S,  1, SAME,          SAME,      CTPU_K_B_MUL,       VM,     OUT, RULE) \
    X(DIV_SCALAR,  "div_scalar",   CTPU_OPK__SF, 1, FLOAT,         SAME,      CTPU_K_B_DIV,       VM,     OUT, RULE) \
    X(POW_SCALAR,  "pow_scalar",   CTPU_OPK__SF, 1, FLOAT,         SAME,      CTPU_K_B_POW,       VM,     OUT, RULE) \
    X(MAXIMUM_SCALAR, "maximum_scalar", CTPU_OPK__S, 1, SAME,      SAME,      CTPU_K_B_MAX,       VM,     OUT, RULE) \
    X(MINIMUM_SCALAR, "minimum_scalar", CTPU_OPK__S, 1, SAME,      SAME,      CTPU_K_B_MIN,       VM,     OUT, RULE) \
    X(EQ_SCALAR,   "eq_scalar",    CTPU_OPK__SC, 1, MASK,          SAME,      CTPU_K_B_EQ,        VM,     OUT, NONE) \
    X(NE_SCALAR,   "ne_scalar",    CTPU_OPK__SC, 1, MASK,          SAME,      CTPU_K_B_NE,        VM,     OUT, NONE) \
    X(LT_SCALAR,   "lt_scalar",    CTPU_OPK__SC, 1, MASK,          SAME,      CTPU_K_B_LT,        VM,     OUT, NONE) \
    X(LE_SCALAR,   "le_scalar",    CTPU_OPK__SC, 1, MASK,          SAME,      CTPU_K_B_LE,        VM,     OUT, NONE) \
    X(GT_SCALAR,   "gt_scalar",    CTPU_OPK__SC, 1, MASK,          SAME,      CTPU_K_B_GT,        VM,     OUT, NONE) \
    X(GE_SCALAR,   "ge_scalar",    CTPU_OPK__SC, 1, MASK,          SAME,      CTPU_K_B_GE,        VM,     OUT, NONE) \
    X(WHERE,       "where",        CTPU_OPK_TERNARY | CTPU_OPK_ELEMENTWISE, 3, WHERE, BROADCAST, CTPU_K_E_WHERE, VM, OUT, RULE) \
    X(CLAMP,       "clamp",        CTPU_OPK_ELEMENTWISE, 1, SAME,  SAME,      CTPU_K_E_CLAMP,     VM,     OUT, RULE) \
    X(CAST,        "cast",         CTPU_OPK_ELEMENTWISE, 1, CAST,  SAME,      CTPU_K_E_CAST,      VM,     OUT, RULE) \
    X(SUM,         "sum",          CTPU_OPK__R,  1, FLOAT,         REDUCE,    CTPU_K_RED_SUM,     REDUCE, IN,  RULE) \
    X(MEAN,        "mean",         CTPU_OPK__R,  1, FLOAT,         REDUCE,    CTPU_K_RED_SUM,     REDUCE_MEAN, IN, RULE) \
    X(MAX,         "max",          CTPU_OPK__R,  1, SAME,          REDUCE,    CTPU_K_RED_MAX,     REDUCE, IN,  RULE) \
    X(MIN,         "min",          CTPU_OPK__R,  1, SAME,          REDUCE,    CTPU_K_RED_MIN,     REDUCE, IN,  RULE) \
    X(VAR,         "var",          CTPU_OPK__R,  1, FLOAT,         REDUCE,    CTPU_K_RED_SUM,     NONE,   IN,  RULE) \
    X(ARGMAX,      "argmax",       CTPU_OPK__R,  1, INDEX,         ARGREDUCE, 0,                  NONE,   IN,  NONE) \
    X(ARGMIN,      "argmin",       CTPU_OPK__R,  1, INDEX,         ARGREDUCE, 0,                  NONE,   IN,  NONE) \
    X(PROD,        "prod",         CTPU_OPK__R,  1, FLOAT,         REDUCE,    CTPU_K_RED_PROD,    NONE,   IN,  RULE) \
    X(CUMSUM,      "cumsum",       CTPU_OPK__R,  1, FLOAT,         ALONG,     0,                  NONE,   IN,  RULE) \
    X(SOFTMAX,     "softmax",      CTPU_OPK__R,  1, FLOAT,         ALONG,     0,                  NONE,   IN,  RULE) \
    X(LOG_SOFTMAX, "log_softmax",  CTPU_OPK__R,  1, FLOAT,         ALONG,     0,                  NONE,   IN,  RULE) \
    X(RESHAPE,     "reshape",      CTPU_OPK__MV | CTPU_OPK_VIEW, 1, SAME, RESHAPE, 0,             NONE,   NONE, RULE) \
    X(PERMUTE,     "permute",      CTPU_OPK__MV, 1, SAME,          PERMUTE,   0,                  NONE,   NONE, RULE) \
    X(SLICE,       "slice",        CTPU_OPK__MV, 1, SAME,          SLICE,     0,                  NONE,   NONE, RULE) \
    X(CONCAT,      "concat",       CTPU_OPK__MV, -1, SAME,         CONCAT,    0,                  NONE,   NONE, RULE) \
    X(EXPAND,      "expand",       CTPU_OPK__MV, 1, SAME,          EXPAND,    0,                  NONE,   NONE, RULE) \
    X(EMBEDDING,   "embedding",    CTPU_OPK__MV | CTPU_OPK_FAULTS, 2, SAME, EMBEDDING, 0,         NONE,   NONE, RULE) \
    X(GATHER,      "gather",       CTPU_OPK__MV | CTPU_OPK_FAULTS, 2, SAME, GATHER, 0,            NONE,   NONE, RULE) \
    X(SCATTER_ADD, "scatter_add",  CTPU_OPK__MV | CTPU_OPK_FAULTS, 3, SAME, SCATTER, 0,           NONE,   OUT, RULE) \
    X(MATMUL,      "matmul",       CTPU_OPK_MATMUL, 2, MATMUL,     MATMUL,    0,                  MXU,    MXU, RULE) \
    /* inputs q, k, v[, mask]; the output packs o then lse, f32 (dispatch's ctpu_scaled_dot_product_attention \
     * slices it); attr.i64[0]: CTPU_K_MASK_*, i64[1]: causal, extra: precision; scalars: seed, offset, \
     * dropout p, scale */ \
    X(SDPA,        "scaled_dot_product_attention", CTPU_OPK_ATTENTION, -1, GIVEN, GIVEN, 0,     NONE,   ATTN, RULE) \
    X(COPY,        "copy",         CTPU_OPK__MV, 1, GIVEN,         GIVEN,     0,                  NONE,   NONE, NONE) \
    X(FULL,        "full",         CTPU_OPK__CR, 0, ARG,           CREATE,    0,                  NONE,   NONE, NONE) \
    X(ARANGE,      "arange",       CTPU_OPK__CR, 0, ARG,           CREATE,    0,                  NONE,   NONE, NONE) \
    X(RAND_UNIFORM,"rand_uniform", CTPU_OPK__CR | CTPU_OPK_RANDOM, 0, ARG, CREATE, 0,             NONE,   OUT, NONE) \
    X(RAND_NORMAL, "rand_normal",  CTPU_OPK__CR | CTPU_OPK_RANDOM, 0, ARG, CREATE, 0,             NONE,   OUT, NONE) \
    X(RAND_INT,    "randint",      CTPU_OPK__CR | CTPU_OPK_RANDOM, 0, ARG, CREATE, 0,             NONE,   OUT, NONE) \
    /* backward helpers (autograd.c builds them; exec at the end of exec.c) */ \
    X(SLICE_BACKWARD,     "slice_backward",     CTPU_OPK__MV | CTPU_OPK_BACKWARD, 1, GIVEN, GIVEN, 0, NONE, NONE, NONE) \
    X(EMBEDDING_BACKWARD, "embedding_backward", CTPU_OPK__MV | CTPU_OPK_BACKWARD, 2, GIVEN, GIVEN, 0, NONE, OUT, NONE) \
    X(GATHER_BACKWARD,    "gather_backward",    CTPU_OPK__MV | CTPU_OPK_BACKWARD, 2, GIVEN, GIVEN, 0, NONE, OUT, NONE) \
    /* inputs q, k, v, the forward's packed output, its gradient[, mask]; the output packs dq, dk, dv (f32); \
     * attrs and scalars as the forward's */ \
    X(SDPA_BACKWARD,      "sdpa_backward",      CTPU_OPK_ATTENTION | CTPU_OPK_BACKWARD, -1, GIVEN, GIVEN, 0, NONE, ATTN, NONE) \
    /* collectives (src/eager/collective.c builds them; src/dist/ runs them; the ICI \
     * cost is the dist cost model's, not the roofline's). attr.extra: ctpu_dist_op; \
     * attr.i64[0]: root (broadcast) or dim; all_reduce: 0 run, 1 start, 2 wait (overlap); \
     * attr.i64[1]: bucket (-1 none); one \
     * runtime scalar: the marked step at dispatch (for the SIGTERM line) */ \
    X(ALL_REDUCE,     "all_reduce",     CTPU_OPK_COLLECTIVE, 1, SAME, SAME,  0, NONE, NONE, NONE) \
    X(BROADCAST,      "broadcast",      CTPU_OPK_COLLECTIVE, 1, SAME, SAME,  0, NONE, NONE, NONE) \
    X(ALL_GATHER,     "all_gather",     CTPU_OPK_COLLECTIVE, 1, SAME, GIVEN, 0, NONE, NONE, NONE) \
    X(REDUCE_SCATTER, "reduce_scatter", CTPU_OPK_COLLECTIVE, 1, SAME, GIVEN, 0, NONE, NONE, NONE)

typedef enum {
#define X(e, n, k, a, dt, sh, ko, fu, co, gr) CTPU_OP_##e,
    CTPU_OP_TABLE(X)
#undef X
    CTPU_OP_COUNT
} ctpu_op;

typedef struct {
    const char *name;
    uint32_t kind;
    int8_t arity;
    uint8_t dtype_rule, shape_rule;
    uint8_t fusion, cost, grad;
    int kop;                        /* kernel id */
} ctpu_op_info;

extern const ctpu_op_info ctpu_op_infos[CTPU_OP_COUNT];   /* src/ops.c */
static inline bool ctpu_op_is(int op, uint32_t kind) { return (ctpu_op_infos[op].kind & kind) != 0; }
static inline const char *ctpu_op_name(int op) { return ctpu_op_infos[op].name; }
static inline int ctpu_op_kop(int op) { return ctpu_op_infos[op].kop; }
static inline int ctpu_op_fusion(int op) { return ctpu_op_infos[op].fusion; }
static inline int ctpu_op_cost(int op) { return ctpu_op_infos[op].cost; }
static inline bool ctpu_op_has_grad(int op) { return ctpu_op_infos[op].grad == CTPU_GRAD_RULE; }
static inline bool ctpu_op_can_fault(int op) { return ctpu_op_is(op, CTPU_OPK_FAULTS); }

/* ------------------------------------------------------------------ IR */
#define CTPU_NODE_MAX_IN 16
#define CTPU_NODE_MAX_SCALARS 4

/* Attributes: everything about a node that is part of its cache key, apart
 * from shapes and dtypes. Runtime scalars are NOT here (they are arguments). */
typedef struct {
    int32_t dims[8];      /* reduce mask as dims list, permute perm, softmax dim, ... */
    int64_t i64[4];       /* slice start/end/step, correction, ... */
    uint32_t flags;       /* CTPU_ATTR_* */
    int32_t n_dims;
    int32_t extra;        /* cast dtype, concat dim, gather dim, precision */
    int32_t call;         /* CTPU_CALL_*: the public composite a faulting node was made for (its fault names it) */
} ctpu_attrs;

/* attrs.call: which public call a device fault of the node is reported as
 * (0: the op's own name). A composite whose primitive can fault sets it, so
 * its message names the user's call and the user's positions. */
enum {
    CTPU_CALL_OP = 0,
    CTPU_CALL_INDEX_SELECT,   /* gather of an index [n] expanded along dim */
};

/* attrs all zero (node builders zero a node whole, padding included, so
 * this is memcmp against zeroes), as word loads rather than a libc call:
 * on every op's path (strict keys, trace keys) */
static inline bool ctpu_attrs_zero(const ctpu_attrs *a)
{
    _Static_assert(sizeof(ctpu_attrs) % sizeof(uint64_t) == 0, "ctpu_attrs is whole words");
    const unsigned char *b = (const unsigned char *)a;
    uint64_t acc = 0;
    for (size_t i = 0; i < sizeof(ctpu_attrs); i += sizeof(uint64_t)) {
        uint64_t w;
        memcpy(&w, b + i, sizeof w);
        acc |= w;
    }
    return acc == 0;
}

enum {
    CTPU_ATTR_KEEPDIM      = 1u << 0,
    CTPU_ATTR_SCALAR_FIRST = 1u << 1,   /* s op a */
    CTPU_ATTR_TRANS_A      = 1u << 2,   /* matmul: a is stored [.., K, M] (used as its transpose) */
    CTPU_ATTR_TRANS_B      = 1u << 3,   /* matmul: b is stored [.., N, K] */
    CTPU_ATTR_REVERSE      = 1u << 4,   /* cumsum: from the end of the dim (its backward) */
    CTPU_ATTR_INT_SCALAR   = 1u << 5,   /* *_scalar_int, clamp_int: the host scalars are integers (a compiled
                                           step's replay gives trunc(scalars[i]) there); no kernel reads it */
};

/* A value's type: dtype + shape. */
typedef struct {
    uint8_t dtype, ndim;
    int64_t shape[8];
} ctpu_vtype;

/* One node: op applied to n_in values; produces one value of type `out`. */
typedef struct {
    uint16_t op;
    uint8_t n_in, n_scalars;
    int32_t in[CTPU_NODE_MAX_IN];   /* value ids in the trace */
    ctpu_vtype out;
    ctpu_attrs attr;
} ctpu_node;

static inline int64_t ctpu_vtype_numel(const ctpu_vtype *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

#endif /* CTPU_OPS_H */
