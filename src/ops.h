/* The op table and the node IR, shared by eager, fuse and device.
 *
 * Every op is declared once, here. A row is
 *   X(ENUM, "name", kind flags, arity, kernel op)
 * arity -1 = variadic (concat). The kernel op is the ctpu_k_unary_op /
 * ctpu_k_binary_op code for elementwise rows, the ctpu_k_red_op for
 * reductions, and 0 elsewhere. Dispatch (shape rules), hashing, emission,
 * autograd and error messages derive from it.
 */
#ifndef CTPU_OPS_H
#define CTPU_OPS_H

#include <stdint.h>
#include <stdbool.h>
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

#define CTPU_OP_TABLE(X) \
    X(NEG,         "neg",          CTPU_OPK__U,  1, CTPU_K_U_NEG) \
    X(ABS,         "abs",          CTPU_OPK__U,  1, CTPU_K_U_ABS) \
    X(EXP,         "exp",          CTPU_OPK__UF, 1, CTPU_K_U_EXP) \
    X(LOG,         "log",          CTPU_OPK__UF, 1, CTPU_K_U_LOG) \
    X(SQRT,        "sqrt",         CTPU_OPK__UF, 1, CTPU_K_U_SQRT) \
    X(RSQRT,       "rsqrt",        CTPU_OPK__UF, 1, CTPU_K_U_RSQRT) \
    X(TANH,        "tanh",         CTPU_OPK__UF, 1, CTPU_K_U_TANH) \
    X(SIGMOID,     "sigmoid",      CTPU_OPK__UF, 1, CTPU_K_U_SIGMOID) \
    X(RELU,        "relu",         CTPU_OPK__U,  1, CTPU_K_U_RELU) \
    X(GELU_TANH,   "gelu_tanh",    CTPU_OPK__UF, 1, CTPU_K_U_GELU_TANH) \
    X(GELU_ERF,    "gelu",         CTPU_OPK__UF, 1, CTPU_K_U_GELU_ERF) \
    X(ADD,         "add",          CTPU_OPK__B,  2, CTPU_K_B_ADD) \
    X(SUB,         "sub",          CTPU_OPK__B,  2, CTPU_K_B_SUB) \
    X(MUL,         "mul",          CTPU_OPK__B,  2, CTPU_K_B_MUL) \
    X(DIV,         "div",          CTPU_OPK__BF, 2, CTPU_K_B_DIV) \
    X(POW,         "pow",          CTPU_OPK__BF, 2, CTPU_K_B_POW) \
    X(MAXIMUM,     "maximum",      CTPU_OPK__B,  2, CTPU_K_B_MAX) \
    X(MINIMUM,     "minimum",      CTPU_OPK__B,  2, CTPU_K_B_MIN) \
    X(EQ,          "eq",           CTPU_OPK__BC, 2, CTPU_K_B_EQ) \
    X(NE,          "ne",           CTPU_OPK__BC, 2, CTPU_K_B_NE) \
    X(LT,          "lt",           CTPU_OPK__BC, 2, CTPU_K_B_LT) \
    X(LE,          "le",           CTPU_OPK__BC, 2, CTPU_K_B_LE) \
    X(GT,          "gt",           CTPU_OPK__BC, 2, CTPU_K_B_GT) \
    X(GE,          "ge",           CTPU_OPK__BC, 2, CTPU_K_B_GE) \
    X(ADD_SCALAR,  "add_scalar",   CTPU_OPK__S,  1, CTPU_K_B_ADD) \
    X(SUB_SCALAR,  "sub_scalar",   CTPU_OPK__S,  1, CTPU_K_B_SUB) \
    X(MUL_SCALAR,  "mul_scalar",   CTPU_OPK__S,  1, CTPU_K_B_MUL) \
    X(DIV_SCALAR,  "div_scalar",   CTPU_OPK__SF, 1, CTPU_K_B_DIV) \
    X(POW_SCALAR,  "pow_scalar",   CTPU_OPK__SF, 1, CTPU_K_B_POW) \
    X(MAXIMUM_SCALAR, "maximum_scalar", CTPU_OPK__S, 1, CTPU_K_B_MAX) \
    X(MINIMUM_SCALAR, "minimum_scalar", CTPU_OPK__S, 1, CTPU_K_B_MIN) \
    X(EQ_SCALAR,   "eq_scalar",    CTPU_OPK__SC, 1, CTPU_K_B_EQ) \
    X(NE_SCALAR,   "ne_scalar",    CTPU_OPK__SC, 1, CTPU_K_B_NE) \
    X(LT_SCALAR,   "lt_scalar",    CTPU_OPK__SC, 1, CTPU_K_B_LT) \
    X(LE_SCALAR,   "le_scalar",    CTPU_OPK__SC, 1, CTPU_K_B_LE) \
    X(GT_SCALAR,   "gt_scalar",    CTPU_OPK__SC, 1, CTPU_K_B_GT) \
    X(GE_SCALAR,   "ge_scalar",    CTPU_OPK__SC, 1, CTPU_K_B_GE) \
    X(WHERE,       "where",        CTPU_OPK_TERNARY | CTPU_OPK_ELEMENTWISE, 3, 0) \
    X(CLAMP,       "clamp",        CTPU_OPK_ELEMENTWISE, 1, 0) \
    X(CAST,        "cast",         CTPU_OPK_ELEMENTWISE, 1, 0) \
    X(SUM,         "sum",          CTPU_OPK__R,  1, CTPU_K_RED_SUM) \
    X(MEAN,        "mean",         CTPU_OPK__R,  1, CTPU_K_RED_SUM) \
    X(MAX,         "max",          CTPU_OPK__R,  1, CTPU_K_RED_MAX) \
    X(MIN,         "min",          CTPU_OPK__R,  1, CTPU_K_RED_MIN) \
    X(VAR,         "var",          CTPU_OPK__R,  1, CTPU_K_RED_SUM) \
    X(ARGMAX,      "argmax",       CTPU_OPK__R,  1, 0) \
    X(SOFTMAX,     "softmax",      CTPU_OPK__R,  1, 0) \
    X(LOG_SOFTMAX, "log_softmax",  CTPU_OPK__R,  1, 0) \
    X(RESHAPE,     "reshape",      CTPU_OPK__MV | CTPU_OPK_VIEW, 1, 0) \
    X(PERMUTE,     "permute",      CTPU_OPK__MV, 1, 0) \
    X(SLICE,       "slice",        CTPU_OPK__MV, 1, 0) \
    X(CONCAT,      "concat",       CTPU_OPK__MV, -1, 0) \
    X(EXPAND,      "expand",       CTPU_OPK__MV, 1, 0) \
    X(EMBEDDING,   "embedding",    CTPU_OPK__MV | CTPU_OPK_FAULTS, 2, 0) \
    X(GATHER,      "gather",       CTPU_OPK__MV | CTPU_OPK_FAULTS, 2, 0) \
    X(MATMUL,      "matmul",       CTPU_OPK_MATMUL, 2, 0) \
    X(COPY,        "copy",         CTPU_OPK__MV, 1, 0) \
    X(FULL,        "full",         CTPU_OPK__CR, 0, 0) \
    X(ARANGE,      "arange",       CTPU_OPK__CR, 0, 0) \
    X(RAND_UNIFORM,"rand_uniform", CTPU_OPK__CR | CTPU_OPK_RANDOM, 0, 0) \
    X(RAND_NORMAL, "rand_normal",  CTPU_OPK__CR | CTPU_OPK_RANDOM, 0, 0) \
    /* backward helpers (autograd.c builds them; exec at the end of exec.c) */ \
    X(SLICE_BACKWARD,     "slice_backward",     CTPU_OPK__MV | CTPU_OPK_BACKWARD, 1, 0) \
    X(EMBEDDING_BACKWARD, "embedding_backward", CTPU_OPK__MV | CTPU_OPK_BACKWARD, 2, 0) \
    X(GATHER_BACKWARD,    "gather_backward",    CTPU_OPK__MV | CTPU_OPK_BACKWARD, 2, 0)

typedef enum {
#define X(e, n, k, a, ko) CTPU_OP_##e,
    CTPU_OP_TABLE(X)
#undef X
    CTPU_OP_COUNT
} ctpu_op;


typedef struct {
    const char *name;
    uint32_t kind;
    int arity;
    int kop;
} ctpu_op_info;

extern const ctpu_op_info ctpu_op_infos[CTPU_OP_COUNT];
static inline bool ctpu_op_is(int op, uint32_t kind) { return (ctpu_op_infos[op].kind & kind) != 0; }
static inline const char *ctpu_op_name(int op) { return ctpu_op_infos[op].name; }

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
} ctpu_attrs;

enum {
    CTPU_ATTR_KEEPDIM      = 1u << 0,
    CTPU_ATTR_SCALAR_FIRST = 1u << 1,   /* s op a */
    CTPU_ATTR_TRANS_A      = 1u << 2,   /* matmul: a is stored [.., K, M] (used as its transpose) */
    CTPU_ATTR_TRANS_B      = 1u << 3,   /* matmul: b is stored [.., N, K] */
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
