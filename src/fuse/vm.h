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
    CTPU_VM_CLAMP, CTPU_VM_COPY,
};
enum { CTPU_VM_ROUND_BF16 = 1, CTPU_VM_SCALAR_FIRST = 2, CTPU_VM_DIRECT = 4 };

/* One instruction. LOAD: dst <- external operand a. STORE: register a -> the
 * bound slot `scalar` in dtype `kop`. Others: dst <- kernel kop over a, b, c;
 * `scalar` indexes the runtime scalars; with DIRECT the result is computed
 * in place in the f32 slot `scalar2` (block by block, the register then
 * points there). Safe with in-place parameter writes: a program writes an
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

/* A group whose last value feeds a reduction over trailing dims (sum, mean,
 * max, min with inner == 1): the value is stored to `red_slot` (a slot no
 * buffer has) and reduced chunk by chunk. */
typedef struct {
    ctpu_vm_prog vm;
    ctpu_k_red_op op;
    bool mean;
    int64_t outer, n;
    int32_t red_slot, out_slot;
    uint8_t out_dtype;
} ctpu_vm_red_prog;
void ctpu_vm_red_exec(const void *data, ctpu_exec_ctx *ctx);

#endif
