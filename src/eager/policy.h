/* Shape policies (policy.c, issue 16): per program structure, the shapes
 * its traces took, the launches at each, and the estimated cost of a real
 * TPU run under the recompile, pad_to_max and bucket_pow2 policies, for the
 * metrics JSON ("shape_policies"). Called under the report's lock. */
#ifndef CTPU_POLICY_H
#define CTPU_POLICY_H

#include "eager.h"
#include "cost/costmodel.h"

enum { CTPU_POLICY_RECOMPILE, CTPU_POLICY_PAD_TO_MAX, CTPU_POLICY_BUCKET_POW2, CTPU_POLICY_COUNT };

/* TORCH_TPU_COMPILE_SECONDS's default and where it comes from. */
#define CTPU_COMPILE_SECONDS_DEFAULT 30.0
#define CTPU_COMPILE_SECONDS_SOURCE                                                                              \
    "an assumption, not a measurement: XLA compiles a training step for a TPU on the host in seconds to minutes " \
    "(PyTorch/XLA's recompilation guide calls each compile 'pretty expensive' and gives no figure); 30 s is "      \
    "taken for a small model's step, during which the chip is held and paid for. Set it from the compile_time "    \
    "of a real TPU run"

/* Automatic dynamic dims of one structure (TORCH_TPU_AUTO_DYNAMIC). */
typedef struct {
    bool detected;                 /* a recompile changed only one dim's extent */
    uint64_t step, program, old_program;
    int n_dims;
    char dims[160];                /* "input 0 dim 1, input 1 dim 1" (the class; derived c x v dims after it) */
    int n_pairs;                   /* the dims to mark, as (canonical input, dim, coef) triples (at most 16): */
    int in[16], dim[16], coef[16]; /* the class's dims (coef 1), then the c x v ones derived from it (coef c) */
    int64_t from, to;
    bool dynamic;                  /* handed to defer.c, which marks them dynamic in later traces */
} ctpu_policy_auto;

typedef struct ctpu_policy_state ctpu_policy_state;

/* The estimate of one launch at one shape's own extents (a dynamic
 * program's launch is priced at the extents it ran at, not those it was
 * compiled at): what the report's run totals, ops and matmul tables add per
 * launch. Per chip profile where indexed, else on the current chip. */
typedef struct {
    double est_s[CTPU_COST_MAX_CHIPS], macs_useful[CTPU_COST_MAX_CHIPS], macs_padded[CTPU_COST_MAX_CHIPS];
    double flops, hbm_bytes, vector_ops;
    int n_mm;
    ctpu_cost_mm mm[CTPU_COST_PROGRAM_MMS];
    int n_ops;
    struct ctpu_policy_op {
        uint16_t op;
        uint32_t nodes;
        float s;                   /* its nodes' compute seconds on the current chip */
    } *ops;
} ctpu_policy_est;

/* current: the index in chips of the emulated chip (the ops' seconds). */
ctpu_policy_state *ctpu__policy_create(const ctpu_chip_info *const *chips, int n_chips, int current, bool auto_dynamic);
void ctpu__policy_free(ctpu_policy_state *ps);
/* ctpu_metrics_clear: launches back to 0 (the shapes stay known). */
void ctpu__policy_clear(ctpu_policy_state *ps);
/* One launch of trace t (struct_hash = ctpu_trace_struct_hash(t)): a newly
 * compiled program (program > 0; recompile: the cache called it one), or
 * past the recompile limit, op by op (program 0). With auto_dynamic, the
 * structure's first recompile that changed one dim's extent alone is
 * recorded (ctpu_policy_auto). */
/* bound (or NULL): per dim of t's inputs, the extent a ctpu_mark_dynamic
 * range pads it to (coef x hi), 0 where none: pad_to_max pads a marked
 * dim to it (TorchTPU's bounded dynamism), an automatic or unmarked one to
 * the largest extent seen. */
/* Returns, for a dynamic launch (dynamic: through a dynamic program), the
 * estimate at t's extents (made once per shape; valid under the report's
 * lock until ctpu__policy_free), else NULL (also when out of memory). */
const ctpu_policy_est *ctpu__policy_launch(ctpu_policy_state *ps, uint64_t struct_hash, const ctpu_trace *t,
                                           const int64_t *bound, uint64_t program, uint64_t step, bool recompile,
                                           bool dynamic);
/* Before t (a new shape of a known structure) is compiled: the canonical
 * (input, dim, coef) triples of the one dim whose extent alone changed
 * against the structure's last launched shape (coef 1; an input extent
 * derived from it as c x v, coef c), when it has had no such recompile yet
 * (the detection ctpu__policy_launch then records); 0 otherwise. Adds t's
 * shape (no launch). */
int ctpu__policy_auto_would(ctpu_policy_state *ps, uint64_t struct_hash, const ctpu_trace *t, uint64_t step, int *in,
                            int *dim, int *coef, int max);
/* The triples structure struct_hash's detection made dynamic (see
 * ctpu_policy_auto); 0 before it has had one. */
int ctpu__policy_auto_pairs(ctpu_policy_state *ps, uint64_t struct_hash, int *in, int *dim, int *coef, int max);
/* One launch of a cached program. */
void ctpu__policy_hit(ctpu_policy_state *ps, uint64_t program);
/* The automatic-dynamic record of a structure, or NULL if it is not known. */
ctpu_policy_auto *ctpu__policy_auto(ctpu_policy_state *ps, uint64_t struct_hash);
const char *ctpu__policy_name(int i);
/* doc.shape_policies: the assumption, and one object per structure that
 * took two or more shapes. */
struct cJSON;
void ctpu__policy_json(struct cJSON *doc, const ctpu_policy_state *ps, double compile_s, ctpu_price_plan plan,
                       int current);

#endif
