/* ctpu nn — layers, initialisers, losses, optimizers and dataset readers,
 * built on the public API of ctpu.h only (src/nn/).
 *
 * A training step reads like its PyTorch twin:
 *
 *   ctpu_optim_zero_grad(opt);                       // set-to-none
 *   ctpu_step_begin();
 *   ctpu_tensor h = ctpu_relu(ctpu_linear_forward(&fc1, x));
 *   ctpu_tensor loss = ctpu_cross_entropy(ctpu_linear_forward(&fc2, h), y, NULL);
 *   ctpu_backward(loss);
 *   ctpu_optim_set_lr(opt, ctpu_lr_cosine(1e-3, step, total, 0));
 *   ctpu_optim_step(opt);                            // updates through ctpu_assign
 *   ctpu_step_end();                                 // releases the step's values and tape
 *
 * Parameters and optimizer state live outside step scopes (docs/CONTRACTS.md):
 * layers and optimizers make theirs in no scope at all, released by their
 * *_free function (or ctpu_shutdown). Randomness (initialisers, dropout)
 * draws from ctpu's counter-based generator: ctpu_manual_seed(s) makes it
 * reproducible in every mode. */
#ifndef CTPU_NN_H
#define CTPU_NN_H

#include "ctpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ initialisers
 * New tensors of shape (ndim >= 2 for the fan-based ones; a weight
 * [out, in, k...] has fan_in = in * prod(k), fan_out = out * prod(k), as
 * PyTorch), f32 or bf16, drawn from the global generator, in the current
 * scope. Errors: CTPU_ERR_SHAPE (ndim < 2, a zero fan), CTPU_ERR_DTYPE,
 * CTPU_ERR_INVALID_ARG (a negative or non-finite parameter). */
typedef enum { CTPU_FAN_IN = 0, CTPU_FAN_OUT = 1 } ctpu_fan_mode;
/* U(-b, b), b = gain * sqrt(3 / fan), gain = sqrt(2 / (1 + a^2)) (leaky_relu). */
CTPU_API ctpu_tensor ctpu_init_kaiming_uniform(ctpu_dtype dt, int ndim, const int64_t *shape, double a, ctpu_fan_mode mode);
/* N(0, std), std = gain / sqrt(fan). */
CTPU_API ctpu_tensor ctpu_init_kaiming_normal(ctpu_dtype dt, int ndim, const int64_t *shape, double a, ctpu_fan_mode mode);
/* U(-b, b), b = gain * sqrt(6 / (fan_in + fan_out)). */
CTPU_API ctpu_tensor ctpu_init_xavier_uniform(ctpu_dtype dt, int ndim, const int64_t *shape, double gain);
/* N(0, std), std = gain * sqrt(2 / (fan_in + fan_out)). */
CTPU_API ctpu_tensor ctpu_init_xavier_normal(ctpu_dtype dt, int ndim, const int64_t *shape, double gain);

/* ------------------------------------------------------------ layers */
/* y = x Wᵀ + b; W [out, in] (PyTorch's layout, used through the
 * transposed-operand matmul, never transposed in memory), b [out].
 * Init as torch.nn.Linear: W kaiming_uniform(a = sqrt(5)), i.e.
 * U(±1/sqrt(in)); b U(±1/sqrt(in)). Parameters require grad and live in no
 * scope. Errors: CTPU_ERR_INVALID_ARG (l NULL, in/out < 1), CTPU_ERR_DTYPE. */
typedef struct {
    ctpu_tensor weight, bias;   /* bias null when made without one */
    int64_t in_features, out_features;
} ctpu_linear;
CTPU_API ctpu_status ctpu_linear_init(ctpu_linear *l, int64_t in_features, int64_t out_features, bool bias, ctpu_dtype dt);
/* x [..., in] -> [..., out]. Errors: those of matmul (shape names the layer). */
CTPU_API ctpu_tensor ctpu_linear_forward(const ctpu_linear *l, ctpu_tensor x);
CTPU_API void ctpu_linear_free(ctpu_linear *l);

/* Layer norm over the last dim (torch.nn.LayerNorm(dim, eps,
 * elementwise_affine)): the layer holding the parameters of ctpu_layer_norm
 * (ctpu.h), weight = 1, bias = 0 at init, both null without
 * elementwise_affine. (Before issue 12 this struct was named
 * ctpu_layer_norm; that name is now the op.) */
typedef struct {
    ctpu_tensor weight, bias;   /* null without elementwise_affine */
    int64_t dim;
    double eps;
} ctpu_layer_norm_layer;
/* Errors: CTPU_ERR_INVALID_ARG (ln NULL, dim < 1, eps negative or not finite), CTPU_ERR_DTYPE. */
CTPU_API ctpu_status ctpu_layer_norm_layer_init(ctpu_layer_norm_layer *ln, int64_t dim, double eps, bool affine, ctpu_dtype dt);
/* ctpu_layer_norm(x, weight, bias, eps); x [..., dim]. Errors: CTPU_ERR_INVALID_ARG (ln NULL),
 * CTPU_ERR_SHAPE (last dim differs), those of ctpu_layer_norm. */
CTPU_API ctpu_tensor ctpu_layer_norm_layer_forward(const ctpu_layer_norm_layer *ln, ctpu_tensor x);
CTPU_API void ctpu_layer_norm_layer_free(ctpu_layer_norm_layer *ln);

/* Embedding table [num, dim], init N(0, 1) as torch.nn.Embedding. */
typedef struct {
    ctpu_tensor weight;
    int64_t num, dim;
} ctpu_embedding_layer;
CTPU_API ctpu_status ctpu_embedding_layer_init(ctpu_embedding_layer *e, int64_t num, int64_t dim, ctpu_dtype dt);
/* indices i32 [...] -> [..., dim]; an index outside [0, num) is a device
 * fault naming embedding (ctpu_embedding). */
CTPU_API ctpu_tensor ctpu_embedding_layer_forward(const ctpu_embedding_layer *e, ctpu_tensor indices);
CTPU_API void ctpu_embedding_layer_free(ctpu_embedding_layer *e);

/* Inverted dropout: in training, x * mask / (1 - p) with mask = (u >= p),
 * u ~ U[0,1) f32 from the counter-based generator (same seed -> same masks in
 * every mode and dtype); otherwise (or p == 0) x itself (a new handle). The
 * result has x's dtype, as torch's (f32 or bf16: the mask in x's dtype, x *
 * mask exact, the scaled value rounded once). p in [0, 1]; p == 1 gives
 * zeros. Errors: CTPU_ERR_INVALID_ARG (p). */
CTPU_API ctpu_tensor ctpu_dropout(ctpu_tensor x, double p, bool training);

/* ------------------------------------------------------------ losses */
typedef enum { CTPU_REDUCE_MEAN = 0, CTPU_REDUCE_SUM = 1, CTPU_REDUCE_NONE = 2 } ctpu_reduction;
typedef struct {
    ctpu_reduction reduction;   /* default MEAN: over the non-ignored rows */
    int32_t ignore_index;       /* default -100: rows with this label add nothing */
    double label_smoothing;     /* in [0, 1]; default 0 */
} ctpu_ce_opts;
/* The defaults: { CTPU_REDUCE_MEAN, -100, 0.0 }. */
CTPU_API ctpu_ce_opts ctpu_ce_defaults(void);
/* Cross entropy from logits [N, C] (f32/bf16) and i32 labels [N], as
 * torch.nn.functional.cross_entropy: log_softmax (max-subtracted, so
 * ce([[1e8, 1e8]], [1]) == ln 2 and -inf logits of other classes are fine),
 * the picked entries through gather, label smoothing eps as
 * (1 - eps) * nll + eps * mean_c(-log_softmax). opts NULL = defaults.
 * Result: a 0-d f32 (mean, sum) or [N] (none); the mean over no
 * non-ignored row is NaN (0 / 0, as torch), which debug checks report as
 * cross_entropy's. A label outside [0, C) other
 * than ignore_index is a device fault naming cross_entropy and the label
 * ("cross_entropy (op #6): labels 7 at position 1 is out of range [0, 5)"), raised
 * at the next sync (strict eager) or at the call (debug eager); validate
 * host labels with ctpu_labels_check first to get the error at once.
 * Errors: CTPU_ERR_SHAPE (C = 0 too: no class to pick, not even for an
 * ignored row, which was a fault naming a label 0 it was not given),
 * CTPU_ERR_DTYPE, CTPU_ERR_INVALID_ARG (opts). */
CTPU_API ctpu_tensor ctpu_cross_entropy(ctpu_tensor logits, ctpu_tensor labels, const ctpu_ce_opts *opts);
/* Host-side label check: every labels[i] in [0, num_classes) or equal to
 * ignore_index. Errors: CTPU_ERR_INVALID_ARG naming the first bad position
 * and value. */
CTPU_API ctpu_status ctpu_labels_check(const int32_t *labels, int64_t n, int64_t num_classes, int32_t ignore_index);
/* Mean (or sum, or none) of (pred - target)^2; same shapes. */
CTPU_API ctpu_tensor ctpu_mse_loss(ctpu_tensor pred, ctpu_tensor target, ctpu_reduction reduction);

typedef struct {
    ctpu_reduction reduction;   /* default MEAN: over the non-ignored rows */
    int32_t ignore_index;       /* default -100: rows with this target add nothing */
} ctpu_nll_opts;
/* The defaults: { CTPU_REDUCE_MEAN, -100 }. */
CTPU_API ctpu_nll_opts ctpu_nll_defaults(void);
/* Negative log likelihood, torch.nn.functional.nll_loss: input [N, C]
 * (f32/bf16 log-probabilities, e.g. ctpu_log_softmax's), target i32 [N];
 * row i gives -input[i, target[i]] (0 when target[i] == ignore_index).
 * Reduction MEAN divides the sum by the count of non-ignored rows (all
 * ignored: 0/0 = NaN, as torch), SUM adds them, NONE gives [N]. A
 * composite of gather, neg, where and sum (cross entropy without the
 * log_softmax); computed in f32 (a bf16 input is exact in f32), result a 0-d
 * f32 (mean, sum) or [N] f32 (none); error against a float64 reference:
 * the f32 sum's (docs/CONTRACTS.md order), measured <= 2^-22 relative. A
 * target outside [0, C) other than ignore_index is a device fault naming
 * gather, as cross entropy's. opts NULL = defaults. Errors: CTPU_ERR_SHAPE
 * (C = 0 too, as cross entropy's), CTPU_ERR_DTYPE (i32 input, non-i32
 * target), CTPU_ERR_INVALID_ARG (a bad reduction). */
CTPU_API ctpu_tensor ctpu_nll_loss(ctpu_tensor input, ctpu_tensor target, const ctpu_nll_opts *opts);
/* torch.nn.functional.binary_cross_entropy_with_logits (no weight or
 * pos_weight): torch's (1 - y) x + m + log(exp(-m) + exp(-x - m)),
 * m = max(-x, 0), elementwise, x logits and y targets (f32/bf16, same
 * shape; y usually in [0, 1]), reduced; its gradient is sigmoid(x) - y
 * (scaled by the reduction). A composite computed in f32; the log without log1p
 * loses the tail below 2^-24 (absolute error <= 6e-8 per element, measured
 * against float64). Result f32: 0-d (mean, sum) or x's shape (none).
 * Errors: CTPU_ERR_SHAPE (shapes differ), CTPU_ERR_DTYPE (i32),
 * CTPU_ERR_INVALID_ARG (reduction). */
CTPU_API ctpu_tensor ctpu_bce_with_logits(ctpu_tensor logits, ctpu_tensor target, ctpu_reduction reduction);
/* |pred - target| reduced (torch.nn.functional.l1_loss); same shapes;
 * dtype as ctpu_sub's, the mean/sum as ctpu_mean/ctpu_sum. A composite
 * (sub, abs, the reduction). Error vs float64 (tests/test_nn.c): per
 * element <= 1.2e-7 (1 + |ref|) (the subtraction's rounding), mean / sum
 * within 1e-6 relative. Errors as mse. */
CTPU_API ctpu_tensor ctpu_l1_loss(ctpu_tensor pred, ctpu_tensor target, ctpu_reduction reduction);
/* torch.nn.functional.smooth_l1_loss(beta): d = pred - target;
 * 0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta; beta == 0 is
 * l1_loss. beta finite >= 0 (else CTPU_ERR_INVALID_ARG). A composite
 * (sub, abs, lt_scalar, mul, sub_scalar, where, the reduction). Error vs
 * float64 (tests/test_nn.c): per element <= 1.2e-7 (1 + |ref|), mean / sum
 * within 1e-6 relative. Errors as mse. */
CTPU_API ctpu_tensor ctpu_smooth_l1_loss(ctpu_tensor pred, ctpu_tensor target, ctpu_reduction reduction, double beta);

/* ------------------------------------------------------------ optimizers
 * An optimizer holds its parameters' handles (not owned) and its state
 * (owned, created as zeros at construction, in no scope; a step replaces
 * the state handles with the new values). A step reads each
 * parameter's .grad (parameters without one are skipped, as PyTorch) and
 * writes the new values with ctpu_assign under no_grad. Step counts are
 * per parameter, as torch's state['step']: a step that skips a parameter
 * does not count for it, so its next update takes Adam's bias corrections
 * and SGD's first-step rule (no dampening) from its own count
 * (tests/test_regress2.c); ctpu_optim_steps is the optimizer's count. Two
 * limits: a capturable optimizer keeps one count for every parameter (its
 * step tensor), and a checkpoint (ctpu_optim_save) stores the optimizer's
 * count, which a load (as ctpu_optim_set_steps) gives to every parameter.
 * The learning rate,
 * the step count and every coefficient derived from them are runtime scalars
 * (*_scalar ops), never part of a program's key: a schedule never recompiles. */
typedef struct ctpu_optim ctpu_optim;

typedef struct {
    double lr;              /* > 0 */
    double momentum;        /* >= 0 */
    double dampening;       /* as torch.optim.SGD: not applied at the first step */
    double weight_decay;    /* L2, added to the gradient */
    bool nesterov;          /* needs momentum > 0 and dampening == 0 */
} ctpu_sgd_opts;
typedef struct {
    double lr;              /* > 0 */
    double beta1, beta2;    /* in [0, 1) */
    double eps;             /* > 0 */
    double weight_decay;    /* decoupled: p *= 1 - lr * wd before the Adam update */
} ctpu_adamw_opts;
/* Capturable (torch.optim's capturable=True; see ctpu_optim_set_capturable): the optimizer keeps its
 * learning rate and step count as 0-d f32 device tensors, updated by the
 * step's own ops (step + 1, the bias corrections 1 - beta^step, the lr of
 * ctpu_optim_set_lr written into its tensor), and its state is assigned in
 * place. In every mode, so results stay bit-identical across modes; the
 * update follows torch's capturable Adam: step_size = lr / (1 - b1^t),
 * denom = sqrt(v) / (sqrt(1 - b2^t) * -step_size) + eps / -step_size,
 * p += m / denom (AdamW first p *= 1 - lr wd), all in f32 on the device
 * (the non-capturable form computes the coefficients in double on the
 * host, so the two differ in the last bits, and more in Adam's first steps:
 * 1 - beta2^t cancels in f32, 3e-5 relative at t = 2 for beta2 0.999, as in
 * torch's capturable form: tests/test_regress.c, within 1e-5 of torch's
 * eager AdamW over 3 steps of lr 0.1); over a bf16 parameter the
 * update is bf16, the 0-d coefficients rounded to bf16 first (torch's
 * promotion of 0-d tensors). A compiled step
 * (ctpu_compile) needs it: ctpu_optim_step of a non-capturable optimizer
 * inside a capture is CTPU_ERR_STATE, since its host-side lr and step count
 * would be baked into the capture. ctpu_optim_lr and ctpu_optim_steps of a
 * capturable optimizer read the tensors (a host read). */
/* torch defaults: lr 1e-3, betas 0.9 / 0.999, eps 1e-8, weight decay 1e-2. */
CTPU_API ctpu_adamw_opts ctpu_adamw_defaults(void);
/* Adam's (torch.optim.Adam) defaults: as AdamW's with weight decay 0. Adam
 * takes a ctpu_adamw_opts; its weight_decay is L2 (added to the gradient). */
CTPU_API ctpu_adamw_opts ctpu_adam_defaults(void);

/* A parameter group (torch.optim's param_groups): n parameters that share a
 * learning-rate scale (the group's lr is the optimizer's lr, as set by
 * ctpu_optim_set_lr, times lr_scale) and a weight decay (replacing the
 * opts' weight_decay for the group). nanoGPT's split: every parameter with
 * >= 2 dims (matmul weights, embeddings, a tied head) in a group with decay,
 * biases and norm gains in one with weight_decay 0. A parameter is in one
 * group only; parameters are numbered in group order (the state index i of
 * ctpu_optim_state and of checkpoints). */
typedef struct {
    const ctpu_tensor *params;
    int n;                      /* >= 1 */
    double lr_scale;            /* finite >= 0; 1 for the optimizer's lr */
    double weight_decay;        /* finite >= 0 */
} ctpu_param_group;

/* Errors (NULL returned): CTPU_ERR_INVALID_ARG (n < 1, params or opts NULL,
 * a bad hyper-parameter, named), handle errors, CTPU_ERR_DTYPE (i32 param),
 * CTPU_ERR_OOM. */
CTPU_API ctpu_optim *ctpu_sgd_create(int n, const ctpu_tensor *params, const ctpu_sgd_opts *opts);
/* AdamW as torch.optim.AdamW: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). */
CTPU_API ctpu_optim *ctpu_adamw_create(int n, const ctpu_tensor *params, const ctpu_adamw_opts *opts);
/* Adam as torch.optim.Adam (no decoupled decay): g' = g + wd p, then the
 * AdamW update above with g' and no p *= 1 - lr wd. */
CTPU_API ctpu_optim *ctpu_adam_create(int n, const ctpu_tensor *params, const ctpu_adamw_opts *opts);
/* The same over n_groups parameter groups (each group's lr scale and weight
 * decay; the other hyper-parameters from opts). Errors: as the flat forms,
 * and CTPU_ERR_INVALID_ARG for n_groups < 1, groups NULL, a group with
 * n < 1, params NULL, a negative or non-finite lr_scale / weight_decay, or
 * a parameter in two groups (each named groups[g].params[i]). */
CTPU_API ctpu_optim *ctpu_sgd_create_groups(int n_groups, const ctpu_param_group *groups, const ctpu_sgd_opts *opts);
CTPU_API ctpu_optim *ctpu_adam_create_groups(int n_groups, const ctpu_param_group *groups, const ctpu_adamw_opts *opts);
CTPU_API ctpu_optim *ctpu_adamw_create_groups(int n_groups, const ctpu_param_group *groups, const ctpu_adamw_opts *opts);
/* One update of every parameter with a .grad. In strict eager (outside a
 * capture, not capturable) the update of every parameter is one program,
 * as torch.optim.AdamW(fused=True) is one kernel in eager mode: a compiled
 * step of the optimizer's own (it shows in the compiled-steps report as
 * "sgd_step", "adam_step" or "adamw_step"), the same ops as op by op, so
 * the same bits, and all or nothing on error. A step where a parameter has
 * no .grad, every Adam / AdamW step after one (the skipped parameter's own
 * step count gives it other coefficients), or a step whose host coefficients collide (equal bit for bit, e.g. lr
 * 0 over groups of different lr_scale), runs op by op; so does every step
 * under TORCH_COMPILE_DISABLE=1. Errors: those of the ops, and
 * CTPU_ERR_STALE_HANDLE if a parameter was released. */
CTPU_API ctpu_status ctpu_optim_step(ctpu_optim *o);
/* ctpu_zero_grad (set-to-none) on every parameter. */
CTPU_API ctpu_status ctpu_optim_zero_grad(ctpu_optim *o);
CTPU_API ctpu_status ctpu_optim_set_lr(ctpu_optim *o, double lr);
/* Make o capturable (described above ctpu_adamw_defaults; on = false goes
 * back to host scalars, the tensors' values read back). The lr and step
 * count so far carry over. Errors: CTPU_ERR_INVALID_ARG (o NULL), those of
 * the ops (CTPU_ERR_OOM). */
CTPU_API ctpu_status ctpu_optim_set_capturable(ctpu_optim *o, bool on);
CTPU_API double ctpu_optim_lr(const ctpu_optim *o);
CTPU_API int64_t ctpu_optim_steps(const ctpu_optim *o);   /* steps taken so far */
/* Set the step count of the optimizer and of every parameter (AdamW's bias
 * corrections use steps + 1; SGD's first step skips dampening), e.g. when
 * resuming. Errors: CTPU_ERR_INVALID_ARG
 * (o NULL, steps < 0 or above CTPU_OPTIM_MAX_STEPS = 2^62, so that counting
 * on never overflows). */
#define CTPU_OPTIM_MAX_STEPS (INT64_C(1) << 62)
CTPU_API ctpu_status ctpu_optim_set_steps(ctpu_optim *o, int64_t steps);
/* The state tensor k of parameter i (SGD: 0 = momentum buffer; AdamW: 0 =
 * exp_avg, 1 = exp_avg_sq), or a null handle (CTPU_ERR_INVALID_ARG: o NULL,
 * i or k out of range); valid until the next step.
 * For tests and checkpoints. */
CTPU_API ctpu_tensor ctpu_optim_state(const ctpu_optim *o, int i, int k);
CTPU_API void ctpu_optim_free(ctpu_optim *o);
/* torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type): the total
 * norm of the n parameters' gradients (parameters without a .grad are
 * skipped; none: 0), the norm of the per-gradient norms (norm_type 2:
 * sqrt(sum g^2); 1: sum |g|; inf: max |g|; p: (sum |g|^p)^(1/p)), computed in
 * f32 (bf16 gradients cast first); then every gradient is multiplied by
 * min(max_norm / (total + 1e-6), 1) (as torch, the quotient is the
 * reciprocal times max_norm) and written back with ctpu_assign, under
 * no_grad (bf16 gradients: the product rounded to bf16). Returns the total
 * as an f32 0-d tensor in the caller's scope. Every step is an op, with no
 * host read: in defer and fuse the whole call records into the current
 * trace, so between two marked steps it is one program (the loop detector,
 * on while a program never marks steps, may still cut repeating per-layer
 * blocks). Same bits in every mode. Errors (a handle naming clip_grad_norm):
 * CTPU_ERR_INVALID_ARG (n < 0, params NULL, max_norm negative or NaN,
 * norm_type <= 0 or NaN), a handle error for a null or released
 * params[i]; a params[i] that is the result of a failed call is returned
 * (its cause the last error, as ops pass error handles along); an
 * infinite or NaN total is not an error (torch's error_if_nonfinite=False). */
CTPU_API ctpu_tensor ctpu_clip_grad_norm(int n, const ctpu_tensor *params, double max_norm, double norm_type);

/* ------------------------------------------------------------ data parallel
 * As torch.nn.parallel.DistributedDataParallel, over ctpu_dist_init's ranks
 * (ctpu.h "distributed"): creating it broadcasts every parameter from rank 0;
 * after backward, ctpu_ddp_sync_grads averages the gradients over the ranks,
 * in buckets: the parameters in reverse order (DDP's: the last layers'
 * gradients are ready first), a new bucket when the dtype changes or the
 * bucket would pass bucket_bytes; one all_reduce (mean) of the flattened,
 * concatenated gradients per bucket, labelled with its bucket number. Every
 * rank must use every parameter (a parameter without a gradient adds zeros
 * and stays without one, as DDP without find_unused_parameters expects).
 * Overlap (opts.overlap, the default): each bucket's all_reduce starts from
 * the backward once its last gradient is final, and sync_grads waits for it
 * (a second backward before sync_grads makes sync_grads reduce again).
 * The mean is the rank-order left fold divided once by N, so a world-size-N
 * run equals, bit for bit, one process that accumulates the same N
 * micro-batches in rank order and divides the gradients by N.
 * Randomness: between ctpu_ddp_step_begin and ctpu_ddp_sync_grads, rank r's
 * generator draws the counters micro-batch r would draw in that one process
 * ([base + r D, base + (r+1) D), D = draws of one micro-batch, from opts or
 * measured on the first step; until measured, ranks > 0 repeat rank 0's
 * range), and sync_grads leaves every rank at base + N D. A loop:
 *   ctpu_optim_zero_grad(opt); ctpu_step_begin(); ctpu_ddp_step_begin(ddp);
 *   ... forward on this rank's rows (ctpu_ddp_shard), backward ...
 *   ctpu_ddp_sync_grads(ddp); ctpu_optim_step(opt); ctpu_step_end(); */
typedef struct ctpu_ddp ctpu_ddp;
typedef struct {
    int64_t bucket_bytes;       /* gradient bytes per bucket, >= 1 (default 25 MiB, torch's bucket_cap_mb) */
    int64_t rng_per_microbatch; /* D above (elements drawn per micro-batch); 0: measure it on the first step */
    bool broadcast_params;      /* broadcast the parameters from rank 0 at creation (default true) */
    bool overlap;               /* start each bucket's all_reduce from the backward as soon as its gradients are
                                   final (ctpu_register_post_accumulate_grad_hook, ctpu_all_reduce_async) and wait
                                   for it in sync_grads, so the reduction runs while the backward computes
                                   (default true, as DDP's); false: every bucket is reduced in sync_grads */
} ctpu_ddp_opts;
CTPU_API ctpu_ddp_opts ctpu_ddp_defaults(void);
/* params (not owned) as an optimizer's. opts NULL: the defaults. Errors
 * (NULL returned): CTPU_ERR_INVALID_ARG (n < 1, params NULL, bucket_bytes
 * < 1, rng_per_microbatch < 0), handle errors, CTPU_ERR_DTYPE (i32),
 * CTPU_ERR_OOM, and those of the broadcast. */
CTPU_API ctpu_ddp *ctpu_ddp_create(int n, const ctpu_tensor *params, const ctpu_ddp_opts *opts);
/* Start a step: this rank's dropout counter range. Errors: CTPU_ERR_INVALID_ARG (d NULL). */
CTPU_API ctpu_status ctpu_ddp_step_begin(ctpu_ddp *d);
/* Average the gradients over the ranks (in place, through ctpu_assign on each
 * .grad), under no_grad. Errors: those of the ops and collectives. */
CTPU_API ctpu_status ctpu_ddp_sync_grads(ctpu_ddp *d);
CTPU_API int ctpu_ddp_buckets(const ctpu_ddp *d);   /* 0 for NULL */
/* Buckets this DDP reduced so far: started from the backward and waited for
 * in sync_grads (overlapped), and reduced in sync_grads (blocking: overlap
 * off, a parameter without a gradient, or a second backward before
 * sync_grads, after which the started values are waited for and dropped).
 * Same bits either way. d NULL: zeros. */
CTPU_API void ctpu_ddp_overlap_counts(const ctpu_ddp *d, int64_t *overlapped, int64_t *blocking);
CTPU_API void ctpu_ddp_free(ctpu_ddp *d);
/* Rank r's rows of a global batch of n: [n r / N, n (r+1) / N) (the last
 * partial batch split the same way). Out-of-range rank or world are clamped. */
CTPU_API void ctpu_ddp_shard(int64_t n, int rank, int world, int64_t *lo, int64_t *hi);

/* ------------------------------------------------------------ schedules
 * Learning rate before optimizer step `step` (0-based) of `total`: */
/* min_lr + (base_lr - min_lr) * (1 + cos(pi * step / total)) / 2, as
 * torch.optim.lr_scheduler.CosineAnnealingLR(T_max = total) stepped per
 * batch; step >= total gives min_lr. */
CTPU_API double ctpu_lr_cosine(double base_lr, int64_t step, int64_t total, double min_lr);
/* Linear warmup then cosine decay, as nanoGPT's get_lr: step < warmup gives
 * base_lr * (step + 1) / (warmup + 1); then min_lr + (base_lr - min_lr) *
 * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2; step >= total
 * (or total <= warmup after the warmup) gives min_lr. A negative step counts
 * as 0. Pure host arithmetic: never fails. */
CTPU_API double ctpu_lr_warmup_cosine(double base_lr, int64_t step, int64_t warmup, int64_t total, double min_lr);
/* base_lr * gamma ^ floor(step / step_size), as StepLR. step_size <= 0 or a
 * negative step gives base_lr (torch's StepLR(step_size=0) raises
 * ZeroDivisionError; this never fails). */
CTPU_API double ctpu_lr_step(double base_lr, int64_t step, int64_t step_size, double gamma);

/* ------------------------------------------------------------ data */
/* An idx file (the MNIST family's format, yann.lecun.com/exdb/mnist):
 * magic 00 00 08 ndim, ndim big-endian u32 extents, then the u8 data. Read
 * plain or gzip-compressed (detected from the bytes, via zlib). The header
 * and the size are validated: a wrong magic, a type other than u8 (0x08),
 * ndim outside [1, 4], a truncated file or trailing bytes are
 * CTPU_ERR_IO errors naming the file and what is wrong; never a crash. */
typedef struct {
    int ndim;
    int64_t shape[4];
    uint8_t *data;          /* prod(shape) bytes, malloc'd */
} ctpu_idx;
CTPU_API ctpu_status ctpu_idx_read(const char *path, ctpu_idx *out);
CTPU_API void ctpu_idx_free(ctpu_idx *x);

/* An image-classification set from an images file [N, rows, cols] and a
 * labels file [N] (e.g. Fashion-MNIST's train-images-idx3-ubyte.gz and
 * train-labels-idx1-ubyte.gz). Pixels become f32 in [0, 1] (byte / 255).
 * Errors: those of ctpu_idx_read; CTPU_ERR_IO for counts that differ
 * ("images has 60000, labels has 59999") or a label >= num_classes. */
typedef struct {
    int64_t n, rows, cols;
    float *images;          /* [n, rows*cols] */
    int32_t *labels;        /* [n] */
} ctpu_image_set;
CTPU_API ctpu_status ctpu_image_set_load(const char *images_path, const char *labels_path, int64_t num_classes,
                                         ctpu_image_set *out);
/* Mean and std (population) of every pixel. */
CTPU_API void ctpu_image_set_stats(const ctpu_image_set *s, double *mean, double *std);
/* x = (x - mean) / std in place. */
CTPU_API void ctpu_image_set_normalize(ctpu_image_set *s, double mean, double std);
CTPU_API void ctpu_image_set_free(ctpu_image_set *s);

/* Batches of indices into [0, n): in order, or reshuffled at every epoch
 * (Fisher-Yates driven by splitmix64 of (seed, epoch), so a seed gives the same
 * batches on every machine); the last partial batch is kept or dropped. */
typedef struct ctpu_batch_iter ctpu_batch_iter;
/* NULL with CTPU_ERR_INVALID_ARG for n < 0, n above CTPU_BATCH_ITER_MAX_N
 * (2^56, ctpu's element cap: the iterator holds n 8-byte indices) or
 * batch < 1; CTPU_ERR_OOM when the indices do not fit in host memory. */
#define CTPU_BATCH_ITER_MAX_N (INT64_C(1) << 56)
CTPU_API ctpu_batch_iter *ctpu_batch_iter_create(int64_t n, int64_t batch, bool shuffle, bool drop_last, uint64_t seed);
/* The next batch of this epoch: *idx points at its indices (valid until the
 * next call); returns its size, or 0 at the end of the epoch, after which
 * the next call starts a new epoch (reshuffled). */
CTPU_API int64_t ctpu_batch_iter_next(ctpu_batch_iter *it, const int64_t **idx);
/* Batches next returns per epoch: ceil(n / batch), floor(n / batch) with
 * drop_last (len(DataLoader)); 0 for NULL. */
CTPU_API int64_t ctpu_batch_iter_batches_per_epoch(const ctpu_batch_iter *it);
CTPU_API int64_t ctpu_batch_iter_epoch(const ctpu_batch_iter *it);   /* 0-based, of the batch last returned */
/* Where an iterator is, for checkpoints: its arguments and (epoch,
 * position), position being the indices of that epoch already handed out
 * (0 at the start of an epoch, which is also the state right after the
 * call that returned 0). Setting a state got from an iterator made with
 * the same arguments makes the next calls return what that iterator's
 * would have (an epoch's order is a function of (seed, epoch) only).
 * Errors: CTPU_ERR_INVALID_ARG (a NULL pointer; arguments that differ from
 * this iterator's, named; epoch < 0 or above CTPU_BATCH_ITER_MAX_EPOCH;
 * a position outside [0, n] that is neither a multiple of the batch nor n). */
#define CTPU_BATCH_ITER_MAX_EPOCH (INT64_C(1) << 62)
typedef struct {
    int64_t n, batch;
    bool shuffle, drop_last;
    uint64_t seed;
    int64_t epoch, position;
} ctpu_batch_iter_state;
CTPU_API ctpu_status ctpu_batch_iter_get_state(const ctpu_batch_iter *it, ctpu_batch_iter_state *out);
CTPU_API ctpu_status ctpu_batch_iter_set_state(ctpu_batch_iter *it, const ctpu_batch_iter_state *s);
CTPU_API void ctpu_batch_iter_free(ctpu_batch_iter *it);
/* Gather the rows idx[0..n) of an image set into host buffers x [n, rows*cols]
 * and y [n] and copy them to the device (current scope). Errors:
 * CTPU_ERR_INVALID_ARG (a NULL argument, n < 0, an idx[i] outside [0, s->n),
 * n rows whose bytes overflow), CTPU_ERR_OOM, those of ctpu_from_host. */
CTPU_API ctpu_status ctpu_image_set_batch(const ctpu_image_set *s, const int64_t *idx, int64_t n, ctpu_tensor *x,
                                          ctpu_tensor *y);

/* ------------------------------------------------------------ checkpoints
 * Optimizer and whole-run state in safetensors files (ctpu_save_ex, see
 * ctpu.h "checkpoints"). An optimizer's part of a file:
 *   tensors   "optim.state.<i>.exp_avg", "optim.state.<i>.exp_avg_sq"
 *             (Adam, AdamW), "optim.state.<i>.momentum_buffer" (SGD with
 *             momentum), i the parameter's index at creation (in group
 *             order; as the keys of torch's optimizer state_dict), each of
 *             its parameter's dtype and shape
 *   metadata  "ctpu.optim.kind" "adam" | "adamw" | "sgd", "ctpu.optim.n_params",
 *             "ctpu.optim.step" (steps taken), "ctpu.optim.lr" (the
 *             optimizer's current lr, before group scales),
 *             "ctpu.optim.groups" (the group count), and per group g
 *             (torch's param_groups): "ctpu.optim.group.<g>.params" (its
 *             indices, "0,1,2,3"), ".lr" (the group's current lr),
 *             ".lr_scale", ".weight_decay", ".initial_lr" (the group's lr at
 *             creation), ".beta1", ".beta2", ".eps" (Adam, AdamW) or
 *             ".momentum", ".dampening", ".nesterov" ("true" | "false") (SGD)
 * Numbers are decimal; doubles with 17 significant digits (%.17g), so they
 * read back bit for bit. A load needs the same group layout (count and
 * indices per group); each group's lr scale and weight decay come from the
 * file. Every group's keys are read and checked; the betas and eps (Adam,
 * AdamW) or momentum, dampening and nesterov (SGD) are one value per
 * optimizer in ctpu, so a file whose groups disagree on one is refused
 * (naming the key and group 0's value); "ctpu.optim.step" is at most
 * CTPU_OPTIM_MAX_STEPS. Files without "ctpu.optim.lr" / ".lr_scale" (one group, written
 * before groups existed) read with the group's lr and scale 1. */

/* Write o's state (moments, step count, lr, hyper-parameters) to path, as
 * above. Errors: those of ctpu_save_ex; CTPU_ERR_INVALID_ARG (o NULL). */
CTPU_API ctpu_status ctpu_optim_save(const ctpu_optim *o, const char *path);
/* Load an optimizer file into o, made with the same kind and parameters
 * (count, dtypes, shapes): moments, step count, lr and hyper-parameters
 * all come from the file (as torch's load_state_dict). Checked whole before
 * anything changes; on an error o is as it was. Errors: those of ctpu_load,
 * CTPU_ERR_IO (a missing or malformed key, another kind, another parameter
 * count or group layout, an invalid hyper-parameter: the message names the
 * file and the key). */
CTPU_API ctpu_status ctpu_optim_load(ctpu_optim *o, const char *path);

/* A whole run in one file, so that stopping after step N and resuming gives
 * bit-identical losses to the run that did not stop (in every mode): the
 * parameters under names[i] as ctpu_save writes them (a weights-only
 * reader sees them as any safetensors file), the optimizer's part as above
 * (when o is not NULL), the generator's (seed, offset) as "ctpu.rng.seed" /
 * "ctpu.rng.offset", the batch iterator's state (when it is not NULL) as
 * "ctpu.data.n", ".batch", ".shuffle", ".drop_last", ".seed", ".epoch",
 * ".position", "ctpu.checkpoint" = "1" (the layout's version), and n_meta
 * extra metadata pairs of the caller (meta as in ctpu_save_ex; keys
 * starting "ctpu." are reserved). One atomic write: the parts never come
 * from different steps. Errors: those of ctpu_save_ex; CTPU_ERR_INVALID_ARG
 * (a name starting "optim.state." or a reserved key). */
CTPU_API ctpu_status ctpu_checkpoint_save(const char *path, int n, const char *const *names, const ctpu_tensor *params,
                                          const ctpu_optim *o, const ctpu_batch_iter *it, int n_meta,
                                          const char *const *meta);
/* Restore what ctpu_checkpoint_save wrote into existing parameters, o (same
 * kind and parameters) and it (same arguments), and set the generator's
 * state; o or it NULL skips that part. Every part is checked before any is
 * written; on an error nothing has changed. Extra metadata: read it with
 * ctpu_safetensors_open. Errors: those of ctpu_load and ctpu_optim_load;
 * CTPU_ERR_IO for a file without "ctpu.checkpoint", without the optimizer
 * or iterator part asked for, or with a malformed key (named);
 * CTPU_ERR_INVALID_ARG for an iterator with other arguments. */
CTPU_API ctpu_status ctpu_checkpoint_load(const char *path, int n, const char *const *names, const ctpu_tensor *params,
                                          ctpu_optim *o, ctpu_batch_iter *it);

#ifdef __cplusplus
}
#endif
#endif /* CTPU_NN_H */
