/* Kernel entries for program steps (exec.c) and the step data they read. */
#ifndef CTPU_EXEC_H
#define CTPU_EXEC_H

#include "fuse.h"

/* One node as a program step: the node, its input types and where its
 * operands are bound (indices into ctpu_exec_ctx.ptr). */
typedef struct {
    ctpu_node node;
    ctpu_vtype in[CTPU_NODE_MAX_IN];
    int32_t in_slot[CTPU_NODE_MAX_IN];
    int32_t out_slot;
    int32_t scalar_base;
    /* a matmul with a fused epilogue (compile.c): x a runtime scalar (a
     * mul_scalar: its index, -1 none), + bias [N] f32, activation, +
     * residual [..., M, N] f32 (the output's shape); slots -1 when absent */
    int32_t epi_bias_slot, epi_res_slot, epi_scale;
    uint8_t epi_act;           /* ctpu_k_act */
    uint8_t epi_softmax;       /* a softmax over the last dim of the result (after the rest) */
    /* operand r (0 A, 1 B) packed at slot pre_slot[r] in the layout pre[r]
     * (NULL: none), shared with other matmul steps: packed there by this
     * step (pre_keep[r]) or by an earlier one (compile.c plan_packs) */
    const ctpu_k_prepack *pre[2];
    int32_t pre_slot[2];
    uint8_t pre_keep[2];
} ctpu_step_data;

/* Broadcast plan: operand strides against the output, adjacent dims
 * collapsed. mode: 0 contiguous (same layout as the output), 1 constant (all
 * strides 0), 2 strided. */
#define CTPU_BCAST_MAX 16
typedef struct {
    int nd;
    int64_t shape[8];
    int64_t stride[CTPU_BCAST_MAX][8];
    int n_in;
    int mode[CTPU_BCAST_MAX];
} bcast_plan;
void ctpu_bcast_plan_make(const ctpu_vtype *out, const ctpu_vtype *const *ins, int n_in, bcast_plan *p);
/* Load operand `opnd` of plan p for output elements [start, start+n) as f32;
 * returns dst, or the operand itself when it is contiguous f32. */
const float *ctpu_load_block(const void *base, int dt, const bcast_plan *p, int opnd, int64_t start,
                             int64_t n, float *dst);
/* Store n f32 values into dst of dtype dt (one rounding). */
void ctpu_from_f32(const float *src, int dt, void *dst, int64_t n);

/* The shape part of matmul node nd's kernel arguments (exec.c): 0 a call
 * per batch element, 1 one call, 2 one call over batch * M rows. */
int ctpu_exec_matmul_args(const ctpu_node *nd, const ctpu_vtype *a, const ctpu_vtype *b, ctpu_mm_args *args,
                           int64_t ast[8], int64_t bst[8]);

/* The kernel entry for an op, or NULL if the op has none (views). */
ctpu_dev_step_fn ctpu_exec_fn_for(int op);

/* Runtime scalars are doubles; 64-bit integers (seeds, offsets) travel as
 * their bit patterns. */
uint64_t ctpu_scalar_bits(double d);
double ctpu_bits_scalar(uint64_t u);

#endif
