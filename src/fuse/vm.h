/* The block VM for fused elementwise groups (vm.c). */
#ifndef CTPU_VM_H
#define CTPU_VM_H

#include "exec.h"

/* A group of at most 32 nodes and 16 externals always fits: registers <=
 * 48, instructions <= 16 loads + 32 ops + 32 stores. */
#define CTPU_VM_GROUP_NODES 32
#define CTPU_VM_MAX_NODES 64
#define CTPU_VM_MAX_REGS 64
#define CTPU_VM_MAX_INS 192

enum {
    CTPU_VM_LOAD, CTPU_VM_STORE, CTPU_VM_UNARY, CTPU_VM_BINARY, CTPU_VM_SCALAR, CTPU_VM_WHERE,
    CTPU_VM_CLAMP, CTPU_VM_COPY, CTPU_VM_FILL,
};
enum { CTPU_VM_ROUND_BF16 = 1, CTPU_VM_SCALAR_FIRST = 2, CTPU_VM_DIRECT = 4, CTPU_VM_STREAM = 8 };
/* Outputs of at least this many bytes that no later step of the program
 * reads are written with non-temporal stores (STREAM, beside DIRECT: the
 * block is computed in a register, then streamed to the slot): past the
 * last-level cache share, where keeping them cached only evicts the inputs
 * and costs a read-for-ownership per line. */
#define CTPU_VM_STREAM_BYTES ((int64_t)8 << 20)

/* One instruction. LOAD: dst <- external operand a. STORE: register a -> the
 * bound slot `scalar` in dtype `kop`. Others: dst <- kernel kop over a, b, c;
 * `scalar` indexes the runtime scalars; with DIRECT the result is computed
 * in place in the f32 slot `scalar2` (block by block, the register then
 * points there); with DIRECT | STREAM it is computed in its register and
 * copied to `scalar2` with non-temporal stores (the same bits). Safe with in-place parameter writes: a program writes an
 * input's storage only after its last read (trace.c alias_safe). */
typedef struct {
    uint8_t kind, kop, flags;
    int16_t dst, a, b, c;
    int32_t scalar;
    int32_t scalar2;     /* DIRECT: the bound f32 slot the result is written into */
} ctpu_vm_ins;

typedef struct {
    ctpu_vtype shape;                  /* the group's output shape */
    int64_t numel;
    int n_ext;
    int32_t ext_slot[CTPU_BCAST_MAX];
    uint8_t ext_dtype[CTPU_BCAST_MAX];
    bcast_plan plan;                   /* externals against the group shape */
    int n_ins, n_reg;
    ctpu_vm_ins ins[CTPU_VM_MAX_INS];
    /* The same program as a register-resident tape (kernels.h ctpu_k_tape;
     * n_tape 0: none, the instructions run as block kernels): one tape
     * instruction per op instruction, the loads done per block before it
     * (val[e] the external e, val[n_ext + r] register r), the stores folded
     * into their producers (outputs: the slot and the op instruction whose
     * DIRECT / STREAM flags say f32 or non-temporal, or bf16). */
    int n_tape, n_out;
    ctpu_k_tape_ins tape[CTPU_VM_MAX_INS];
    int16_t tape_ins[CTPU_VM_MAX_INS];      /* the op instruction of each tape instruction */
    int32_t out_slot[CTPU_VM_MAX_NODES];
    int16_t out_ins[CTPU_VM_MAX_NODES];     /* its producer's op instruction */
    uint8_t out_bf16[CTPU_VM_MAX_NODES];
} ctpu_vm_prog;

/* Can node n (whose inputs have the given types) run in the VM? */
bool ctpu_vm_fusable(const ctpu_node *n, const ctpu_vtype *const *in_types);
/* The matmul-epilogue activation (ctpu_k_act) of a CTPU_FUSE_ACT op;
 * CTPU_K_ACT_NONE for every other op. */
int ctpu_vm_epi_act(int op);
/* Build the VM program for `count` consecutive nodes (indices into t->nodes)
 * of the last node's shape, or of a shape that broadcasts into it (small
 * producers, computed at every element of the group: elementwise ops are
 * functions of their operands, so the bits are those of the broadcast
 * value). slot_of maps value ids to bound/virtual slots (-1: none);
 * store[k]: node k's value is needed outside the group. scalar_base: per node,
 * its first runtime scalar. Returns 0, or -1 if the group is too big (too
 * many externals, registers or instructions): split it and retry. */
int ctpu_vm_build(ctpu_vm_prog *p, const ctpu_trace *t, const int *nodes, int count, const int32_t *slot_of,
                  const bool *store, const int32_t *scalar_base);
void ctpu_vm_exec(const void *data, ctpu_exec_ctx *ctx);

/* A group whose last value feeds a reduction (sum, mean, max, min) over
 * one group of dims, its input seen as [outer, n, inner]: the value is
 * stored to `red_slot` (a slot no buffer has) and reduced chunk by chunk
 * (inner == 1), or an outer slice at a time (inner > 1). */
typedef struct {
    ctpu_vm_prog vm;
    ctpu_k_red_op op;
    bool mean;
    int64_t outer, n, inner;
    int32_t red_slot, out_slot;
    uint8_t out_dtype;
} ctpu_vm_red_prog;
void ctpu_vm_red_exec(const void *data, ctpu_exec_ctx *ctx);

/* ------------------------------------------------------------ row groups (rows.c)
 * A fusion group over rows: every value of the group has the group's shape R
 * (FULL), or R with its trailing dims [first, ndim) set to 1 (ROW: one value
 * per row; a keepdim reduction's result), or is a non-keepdim reduction's
 * result (ROWOUT: stored, not read in the group), or is a producer of a
 * shape that broadcasts into R, computed from outside values at every
 * element of R and read only in the group (BCAST: a weight's cast). Its
 * nodes are
 * elementwise (FULL or ROW), reductions over the trailing dims (sum, mean,
 * max, min, var) and softmax / log_softmax over the last dim, so everything
 * a row needs is in that row: the step runs the nodes row by row on row
 * buffers in cache, each reduction and softmax the kernel the node alone
 * would run (ctpu_k_reduce, ctpu_k_sqdev, ctpu_k_softmax on that row: the
 * same order, the same bits). Layer norm, RMS norm, a residual add before
 * them, mean / var feeding their consumers, softmax with its producers and
 * consumers. A COL value is a reduction of a FULL value over all the row
 * dims [0, first) (sum, mean, max, min: a norm's weight and bias gradients,
 * sums over rows), or a reshape of one; read by nothing else in the group:
 * the FULL value is copied tile by tile into a buffer [rows, n], reduced
 * once every row is done by the kernel the node alone calls (the same
 * order), and stored. */
enum { CTPU_ROW_FULL, CTPU_ROW_ROW, CTPU_ROW_ROWOUT, CTPU_ROW_BCAST, CTPU_ROW_COL };
#define CTPU_ROW_MAX_N 32768       /* the row length (elements) a row group may have */
#define CTPU_ROW_GROUP_NODES 64    /* nodes a row group may take (a norm's forward and backward: 37) */

typedef struct {
    int end;                       /* the group is nodes [i, end) */
    int n_rowops;                  /* reductions and softmaxes in it */
    int first;                     /* first reduced dim */
    int64_t rows, n;
    ctpu_vtype R, P;
    uint8_t cls[CTPU_ROW_GROUP_NODES];
} ctpu_row_scan_info;

/* The longest row group starting at node i (uses: reads of each value, as
 * compile.c counts them; an output counts 2). */
void ctpu_row_scan(const ctpu_trace *t, int i, const int32_t *uses, ctpu_row_scan_info *info);

enum { CTPU_ROWI_EW_FULL, CTPU_ROWI_EW_ROW, CTPU_ROWI_REDUCE, CTPU_ROWI_SOFTMAX, CTPU_ROWI_COLRED, CTPU_ROWI_COLCOPY,
       CTPU_ROWI_SCATTER };   /* gather_backward along the last dim */
enum { CTPU_ROWF_MEAN = 8, CTPU_ROWF_VAR = 16, CTPU_ROWF_LOG = 32 };   /* beside CTPU_VM_ROUND_BF16, _SCALAR_FIRST */
/* value kinds: an in-group FULL value (a row buffer), an in-group ROW value
 * (a per-row register), an external read by FULL nodes (plan against R)
 * or by ROW nodes (plan against P) */
enum { CTPU_ROWV_BUF, CTPU_ROWV_REG, CTPU_ROWV_EXT_FULL, CTPU_ROWV_EXT_ROW,
       CTPU_ROWV_OUT,     /* a stored f32 FULL value computed in its output (idx: its instruction); safe
                             with in-place writes as the VM's DIRECT is (a tile's rows only) */
       CTPU_ROWV_COL };   /* a COL value (idx: its column buffer and result) */

typedef struct {
    uint8_t kind, vkind, kop, flags;   /* vkind, kop: as the VM's instruction (elementwise) or ctpu_k_red_op */
    int16_t dst, src[3];               /* value indices (src[1..2] -1 when absent) */
    int32_t scalar;                    /* the node's first runtime scalar */
    int32_t store_slot;                /* -1: not needed outside the group */
    uint8_t store_dtype, n_src;
    int64_t den;                       /* var: the divisor, max(0, n - correction) */
} ctpu_row_ins;

typedef struct {
    uint8_t kind;
    int16_t idx;                       /* buffer, register, external operand or instruction index */
} ctpu_row_val;

typedef struct {
    int64_t rows, n;
    int n_ins, n_vals, n_buf, n_reg;
    int n_col;                         /* COL values */
    ctpu_row_ins ins[CTPU_ROW_GROUP_NODES];
    ctpu_row_val val[CTPU_ROW_GROUP_NODES + 2 * CTPU_BCAST_MAX];
    int n_ef, n_er;                    /* externals read by FULL / by ROW nodes */
    int32_t ef_slot[CTPU_BCAST_MAX], er_slot[CTPU_BCAST_MAX];
    uint8_t ef_dtype[CTPU_BCAST_MAX], er_dtype[CTPU_BCAST_MAX];
    bcast_plan plan_full, plan_row;
} ctpu_row_prog;

/* Build the row program of nodes [i, end) as ctpu_row_scan classified them
 * (slot_of, store, scalar_base as ctpu_vm_build's). 0, or -1 when it does
 * not fit (too many externals). */
int ctpu_row_build(ctpu_row_prog *p, const ctpu_trace *t, int i, const ctpu_row_scan_info *info,
                   const int32_t *slot_of, const bool *store, const int32_t *scalar_base);
void ctpu_row_exec(const void *data, ctpu_exec_ctx *ctx);

/* ------------------------------------------------------------ loss step (loss.c)
 * A classification loss's label path, reduction and gradient after
 * log_softmax (cross_entropy, nll_loss: every reduction, label smoothing,
 * forward and backward) as one step over N rows of C classes: the values of
 * one element or one per row by their nodes' kernel entries on
 * step-private buffers (phase 1, node order), then the [N, C] values as a
 * row program (phase 2). */
#define CTPU_LOSS_NODES 64
#define CTPU_LOSS_VALS (2 * CTPU_LOSS_NODES)
typedef struct {
    int n_local;                            /* the values the step reads or writes */
    int32_t prog_slot[CTPU_LOSS_VALS];      /* a program slot, or -1: step-private */
    int64_t priv_bytes[CTPU_LOSS_VALS];
    int n_vec;                              /* phase 1: node step data, slots into the local table */
    ctpu_step_data vec[CTPU_LOSS_NODES];
    ctpu_dev_step_fn vec_fn[CTPU_LOSS_NODES];
    bool has_rows;
    ctpu_row_prog rows;                     /* phase 2, slots into the local table */
} ctpu_loss_prog;

/* The end of the longest loss step starting at node i (at least 3 nodes,
 * holding a gather or gather_backward along dim 1 with an i32 [N, 1]
 * index), or -1. uses: as compile.c counts them. */
int ctpu_loss_match(const ctpu_trace *t, int i, const int32_t *uses);
/* Build nodes [i, end) (ctpu_loss_match's result); slot_of: program slots;
 * used_outside: per node of t. 0, or -1. */
int ctpu_loss_build(ctpu_loss_prog *p, const ctpu_trace *t, int i, int end, const int32_t *uses,
                    const int32_t *slot_of, const bool *used_outside, const int32_t *scalar_base);
void ctpu_loss_exec(const void *data, ctpu_exec_ctx *ctx);

#endif
