/* Helpers shared by the nn sources (public API only, but for one entry below). */
#ifndef CTPU_NN_INTERNAL_H
#define CTPU_NN_INTERNAL_H

#include <stddef.h>
#include "ctpu_nn.h"

/* (src/eager/dispatch.c, the one core entry nn uses beyond the public API)
 * f32 uniform [0, 1) draws at t's shape, taking t's dynamic dims
 * (ctpu_mark_dynamic) as ctpu_rand_like does: ctpu_dropout's mask, so a
 * compiled step binds its dynamic program at a new extent, no compile. */
ctpu_tensor ctpu__rand_uniform_f32_like(ctpu_tensor t);
/* Move t to no scope (parameters, optimizer state); returns t. */
ctpu_tensor ctpu__nn_global(ctpu_tensor t);
/* Before ctpu_init, an nn call's message names that call (not the ctpu op
 * it would reach first): false with CTPU_ERR_NOT_INITIALIZED. */
bool ctpu__nn_ready(const char *op);
/* A failure inside an nn call: the last error is prefixed with the user's
 * call and what it was making ("linear_init: weight: rand_uniform: ...")
 * unless it already starts with op; returns the last status. */
ctpu_status ctpu__nn_blame(const char *op, const char *what);
/* Why t (not a valid handle) cannot be used: "a null handle", "a released
 * (stale) handle: ...", "the result of a failed call (from <cause>)"; *st the
 * status to report. */
const char *ctpu__nn_why(ctpu_tensor t, ctpu_status *st, char *buf, size_t len);
/* t usable as argument `arg` of nn call `op`: else false with the error
 * "op: arg is <why>" (a null, released or foreign handle). */
bool ctpu__nn_arg(const char *op, const char *arg, ctpu_tensor t);
/* An error handle given to an nn call: returned unchanged with its cause
 * the last error again (ctpu_keep, an op, does both), as ctpu's ops do. */
static inline ctpu_tensor ctpu__nn_pass(ctpu_tensor e) { return ctpu_keep(e); }
/* t is an error handle (a failed call's result, not CTPU_NULL itself) */
static inline bool ctpu__nn_is_error(ctpu_tensor t) { return t.id != 0 && ctpu_is_null(t); }
/* "f32[2,3]" */
const char *ctpu__nn_fmt(ctpu_tensor t, char *buf, size_t len);

/* An optimizer's scalar state, for checkpoints (optim.c). n_state: state
 * tensors per parameter (ctpu_optim_state's k). */
typedef struct {
    bool adamw;             /* Adam or AdamW (state exp_avg, exp_avg_sq); else SGD */
    bool l2;                /* Adam (L2 weight decay), not AdamW */
    int n_params, n_state;
    double lr;              /* the current learning rate */
    int64_t steps;
    ctpu_sgd_opts sgd;      /* the one of the kind */
    ctpu_adamw_opts adam;
    int n_groups;
    const int *group_of;    /* [n_params]: each parameter's group (get: the optimizer's own) */
    double *lr_scale;       /* [n_groups] (get: the optimizer's; a load's: its own copy) */
    double *group_wd;       /* [n_groups] */
} ctpu__optim_hp;
void ctpu__optim_get(const ctpu_optim *o, ctpu__optim_hp *hp);
/* hyper-parameters as the create functions accept them; lr >= 0, steps >= 0 */
/* false with "KEY = VALUE (need RULE)" in why[0, n) for the first bad field */
bool ctpu__optim_hp_valid(const ctpu__optim_hp *hp, char *why, size_t n);
/* lr, steps and the hyper-parameters of o's kind */
void ctpu__optim_put(ctpu_optim *o, const ctpu__optim_hp *hp);

/* ctpu_batch_iter_set_state's checks, nothing changed; messages start "op: " (data.c). */
ctpu_status ctpu__batch_iter_check(const char *op, const ctpu_batch_iter *it, const ctpu_batch_iter_state *s);

#endif
