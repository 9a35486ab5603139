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
} ctpu_step_data;

/* The kernel entry for an op, or NULL if the op has none (views). */
ctpu_step_fn ctpu_exec_fn_for(int op);

/* Runtime scalars are doubles; 64-bit integers (seeds, offsets) travel as
 * their bit patterns. */
uint64_t ctpu_scalar_bits(double d);
double ctpu_bits_scalar(uint64_t u);

#endif
