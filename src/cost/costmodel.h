/* TPU cost model: a roofline ESTIMATE (not a measurement) of device time on
 * a chip profile (src/device/chips.c), per op and per program. It sits below
 * the compiler (src/fuse computes each program's estimate when it compiles
 * it) and knows only the op table and the public types.
 *
 *   mxu_s    = 2 * padded_MACs * passes / peak_bf16_flops
 *              padded_MACs = batch * pad(M) * pad(N) * pad(K), pad(x) = x
 *              rounded up to a multiple of the MXU side (128 or 256);
 *              passes = 1 / 3 / 6 for matmul precision default/high/highest
 *   vector_s = vector_ops / (peak_bf16_flops / CTPU_COST_VPU_RATIO)
 *              vector_ops per output element: 1 for simple elementwise ops,
 *              CTPU_COST_TRANSCENDENTAL for exp/log/tanh/sigmoid/gelu/pow/
 *              sqrt/rsqrt/div; per input element: 1 for reductions,
 *              CTPU_COST_SOFTMAX for softmax/log_softmax, 3 for var; 0 for
 *              data movement (the op table's cost class picks the term, the
 *              weights are costmodel.c's table)
 *              attention (scaled_dot_product_attention and its backward):
 *              its products as matmuls of the whole [Tq, Tk] problem per
 *              (b, h) (forward Q Kᵀ and P V; backward Q Kᵀ, dO Vᵀ, Pᵀ dO,
 *              dS K, dSᵀ Q), each padded as above (a causal mask's skipped
 *              blocks are not credited), plus CTPU_COST_ATTN_FWD / _BWD
 *              vector ops per score
 *   hbm_s    = (bytes read + bytes written at the program's boundary) /
 *              (hbm_gbps * 1e9); a one-op program reads its inputs and
 *              writes its output; in a fused program intermediates stay on
 *              chip and only inputs and live-outs count
 *   total_s  = max(mxu_s, vector_s, hbm_s)   (compute and traffic overlap)
 *
 * Utilisation per matmul = useful / padded MACs; MFU of a run = useful
 * matmul FLOPs / (estimated time * peak_bf16_flops). The VPU ratio is an
 * assumption (no public per-chip VPU figure is in the profiles). */
#ifndef CTPU_COSTMODEL_H
#define CTPU_COSTMODEL_H

#include "ctpu.h"
#include "ops.h"

#define CTPU_COST_VPU_RATIO 32.0
#define CTPU_COST_TRANSCENDENTAL 8.0
#define CTPU_COST_SOFTMAX 12.0
/* per score: scale, mask, max, subtract, exp, bf16 round, sum, (dropout) */
#define CTPU_COST_ATTN_FWD (6.0 + CTPU_COST_TRANSCENDENTAL)
/* per score: scale, mask, subtract, exp, dropout, dS (3 ops), accumulate */
#define CTPU_COST_ATTN_BWD (8.0 + CTPU_COST_TRANSCENDENTAL)

/* Matmul dims of a matmul node (out [..., M, N], K from a); false if n is
 * not a matmul. */
bool ctpu_cost_matmul_dims(const ctpu_node *n, const ctpu_vtype *a, int64_t *batch, int64_t *m, int64_t *k,
                           int64_t *nn);
/* Add a matmul's MXU work to e (no HBM traffic). */
void ctpu_cost_add_matmul(const ctpu_chip_info *c, int64_t batch, int64_t m, int64_t k, int64_t n, int passes,
                          ctpu_cost_estimate *e);
/* Add one node's compute (MXU or vector; no HBM traffic). in[i] is the type
 * of input i. */
void ctpu_cost_add_node(const ctpu_chip_info *c, const ctpu_node *n, const ctpu_vtype *const *in,
                        ctpu_cost_estimate *e);
/* The vector-op weight of an op whose cost class counts elements (CTPU_CC_OUT,
 * CTPU_CC_IN); 0 for the other classes. */
double ctpu_cost_op_weight(int op);
/* Bytes of a value of this type. */
double ctpu_cost_bytes(const ctpu_vtype *t);
/* Fill hbm_s, total_s and mxu_utilization from the sums. */
void ctpu_cost_finish(const ctpu_chip_info *c, ctpu_cost_estimate *e);

/* ------------------------------------------------------------ programs
 * A program's estimate on every chip profile, made once when it is compiled
 * and read by the report at each launch. */
#define CTPU_COST_PROGRAM_MMS 8

typedef struct {
    int64_t batch, m, k, n;
} ctpu_cost_mm;

/* One op's nodes in a program: compute seconds per chip (per node the larger
 * of its MXU and vector time; traffic is the program's), summed in node
 * order in double (s) and in float (s_f). */
typedef struct {
    uint16_t op;
    uint32_t nodes;
    double s[CTPU_COST_MAX_CHIPS];
    float s_f[CTPU_COST_MAX_CHIPS];
} ctpu_cost_op;

typedef struct {
    int n_chips;                          /* chip profiles, in their table's order */
    ctpu_cost_estimate chip[CTPU_COST_MAX_CHIPS];
    int n_mm;                             /* the first matmuls' dims, in node order */
    ctpu_cost_mm mm[CTPU_COST_PROGRAM_MMS];
    int n_ops;                            /* distinct ops, in order of first node */
    ctpu_cost_op *ops;                    /* storage owned by the program */
} ctpu_cost_program;

/* The MXU products of an attention node (forward 2, backward 5; 0 for other
 * ops) as matmul dims, in the kernel's order. */
#define CTPU_COST_ATTN_MMS 5
int ctpu_cost_attn_mms(const ctpu_node *n, const ctpu_vtype *const *in, ctpu_cost_mm *mm);

/* Start an estimate over n_chips profiles (at most CTPU_COST_MAX_CHIPS), with
 * room in ops for one entry per distinct op of the program. */
void ctpu_cost_program_begin(ctpu_cost_program *p, int n_chips, ctpu_cost_op *ops);
/* Add node n (in[i]: the type of its input i) to the entry `op` (an entry of
 * p->ops, or a new one at p->ops[p->n_ops] when op == NULL; returns it). */
ctpu_cost_op *ctpu_cost_program_node(ctpu_cost_program *p, const ctpu_chip_info *chips, const ctpu_node *n,
                                     const ctpu_vtype *const *in, ctpu_cost_op *op);
/* hbm_bytes: the program's boundary traffic (inputs read, outputs written). */
void ctpu_cost_program_finish(ctpu_cost_program *p, const ctpu_chip_info *chips, double hbm_bytes);

/* Distinct ops of nodes[0, n) (the room ctpu_cost_program_of needs in ops). */
int ctpu_cost_distinct_ops(const ctpu_node *nodes, int n);
/* A program's whole estimate from its trace as arrays, every extent read
 * from the types (so a function of the extents: the same nodes with other
 * extents in in_type[] and the nodes' out types give the estimate at those
 * extents; the shape-policy report re-evaluates programs that way). Value
 * ids as in a trace: v < n_in is input v (in_type[v]), else the output of
 * nodes[v - n_in]. Each node's compute as ctpu_cost_program_node, traffic
 * the boundary's (every input read once, every output written once). ops:
 * room for ctpu_cost_distinct_ops(nodes, n_nodes) entries. */
void ctpu_cost_program_of(ctpu_cost_program *p, const ctpu_chip_info *chips, int n_chips, const ctpu_node *nodes,
                          int n_nodes, const ctpu_vtype *in_type, int n_in, const int32_t *outputs, int n_out,
                          ctpu_cost_op *ops);

#endif
