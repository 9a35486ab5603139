/* ctpu — PyTorch-style tensor programs on an emulated TPU chip, on the CPU.
 *
 * Three execution modes, as in TorchTPU, chosen by environment variables read
 * once by ctpu_init (or by ctpu_set_mode):
 *   strict eager (default)         each op is validated and enqueued on the
 *                                  device stream; the host goes on at once
 *   debug eager                    TORCH_TPU_LAUNCH_BLOCKING=1: each op waits
 *                                  for completion; faults name the op
 *   defer and fuse                 TORCH_TPU_DEFER_AND_FUSE=1: ops recorded
 *                                  into a trace, compiled once per shape
 *
 * Every handle belongs to the scope open when it was made; ending the scope
 * releases it unless kept. Ops never mutate their inputs; ctpu_assign is the
 * one mutation. A failing call returns a status, or an error handle (a null
 * handle that remembers why: see ctpu_tensor), and ctpu_last_error() names
 * the op, the argument and the shapes. An op given a null or error handle
 * returns it unchanged without a new message, so an expression can be
 * checked once at its end: the call that reads it reports the first cause.
 *
 * Example (runs as written; link with -lctpu):
 *
 *   #include <ctpu.h>
 *   #include <stdio.h>
 *   int main(void) {
 *       if (ctpu_init() != CTPU_OK) { fprintf(stderr, "%s\n", ctpu_last_error()); return 1; }
 *       float xa[6] = {1, 2, 3, 4, 5, 6}, wa[6] = {1, 0, 0, 1, 1, 1};
 *       int64_t xs[2] = {2, 3}, ws[2] = {3, 2};
 *       ctpu_scope_begin();
 *       ctpu_tensor x = ctpu_from_host(xa, CTPU_F32, 2, xs);
 *       ctpu_tensor w = ctpu_from_host(wa, CTPU_F32, 2, ws);
 *       ctpu_tensor y = ctpu_relu(ctpu_add_scalar(ctpu_matmul(x, w), -4.0));
 *       ctpu_tensor s = ctpu_sum(y, 0, NULL, false);
 *       double v;
 *       if (ctpu_item(s, &v) != CTPU_OK) { fprintf(stderr, "%s\n", ctpu_last_error()); return 1; }
 *       printf("sum = %g\n", v);          // relu([[0,1],[6,7]]) -> 14
 *       ctpu_scope_end();
 *       ctpu_shutdown();
 *       return 0;
 *   }
 */
#ifndef CTPU_H
#define CTPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CTPU_MAX_DIMS 8

/* CTPU_API marks every public function declaration, in this header and in
 * ctpu_nn.h: the library is compiled with -fvisibility=hidden, so a function
 * is exported from libctpu.so only when its declaration here carries
 * CTPU_API (a meson test, tests/check_exports.py, compares the two lists).
 * CTPU_PRINTF(f, a): printf-style checking of argument f against a. */
#if defined(__GNUC__) || defined(__clang__)
#define CTPU_API __attribute__((visibility("default")))
#define CTPU_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CTPU_API
#define CTPU_PRINTF(f, a)
#endif

/* A value handle: slot index + 1 in the low 32 bits, generation in the high
 * 32. Low 32 bits 0: a null handle. id == 0 is CTPU_NULL; a null handle
 * with a non-zero high half is an *error handle*, returned by a failing call:
 * it carries the id of a record of that failure (status and message) in a
 * per-thread ring of the 32 most recent failures. Ops given an error handle
 * return it unchanged; every other call given one fails with the record's
 * status and a message ending in its cause, e.g. "item: t is the result of a
 * failed call (from matmul: a is f32[2,3], b is f32[2,3]: inner dims differ
 * (3 vs 2))". CTPU_NULL itself gives CTPU_ERR_NULL_HANDLE in every call (an
 * op: "add: b is a null handle (CTPU_NULL)" and a new error handle). A record pushed
 * out of the ring (or made by another thread) gives CTPU_ERR_NULL_HANDLE and
 * says so. */
typedef struct { uint64_t id; } ctpu_tensor;
#define CTPU_NULL ((ctpu_tensor){0})
static inline bool ctpu_is_null(ctpu_tensor t) { return (uint32_t)t.id == 0; }

typedef enum { CTPU_F32 = 0, CTPU_BF16 = 1, CTPU_I32 = 2, CTPU_DTYPE_COUNT } ctpu_dtype;

typedef enum {
    CTPU_OK = 0,
    CTPU_ERR_NOT_INITIALIZED,  /* a call before ctpu_init or after ctpu_shutdown */
    CTPU_ERR_INVALID_ARG,      /* null pointer, bad enum, bad size, bad value */
    CTPU_ERR_NULL_HANDLE,      /* a null tensor handle where a tensor is needed */
    CTPU_ERR_STALE_HANDLE,     /* a released handle (generation mismatch) */
    CTPU_ERR_SHAPE,            /* incompatible shapes, dim out of range */
    CTPU_ERR_DTYPE,            /* a dtype the op does not take */
    CTPU_ERR_OOM,              /* HBM cap exceeded: requested, in use, capacity */
    CTPU_ERR_DEVICE_FAULT,     /* a fault latched on the device (index out of range) */
    CTPU_ERR_NAN,              /* a debug check found NaN in an op's output */
    CTPU_ERR_ENV,              /* a bad environment variable value at init */
    CTPU_ERR_CACHE_MISS,       /* a fused-cache miss in cache-only mode */
    CTPU_ERR_IO,               /* file could not be read or is corrupt */
    CTPU_ERR_STATE,            /* a call that does not fit the current state */
    CTPU_STATUS_COUNT
} ctpu_status;

typedef enum {
    CTPU_MODE_STRICT = 0,      /* strict eager */
    CTPU_MODE_DEBUG = 1,       /* debug eager (TORCH_TPU_LAUNCH_BLOCKING=1) */
    CTPU_MODE_DEFER_FUSE = 2,  /* defer and fuse (TORCH_TPU_DEFER_AND_FUSE=1) */
    CTPU_MODE_COUNT
} ctpu_mode;

typedef enum {
    CTPU_PRECISION_DEFAULT = 0, /* 1 bf16 pass */
    CTPU_PRECISION_HIGH = 1,    /* 3 bf16 passes */
    CTPU_PRECISION_HIGHEST = 2, /* 6 bf16 passes */
    CTPU_PRECISION_COUNT
} ctpu_precision;

/* ---------------------------------------------------------------- runtime */

/* Start the runtime: reads the environment (docs/DESIGN.md's table) once, starts
 * the device thread and kernel workers. Errors: CTPU_ERR_ENV (message names the
 * variable and the value), CTPU_ERR_STATE if already initialised. */
CTPU_API ctpu_status ctpu_init(void);
/* Drain the stream, release every handle and buffer, stop the threads.
 * Safe to call when not initialised. ctpu_init may be called again after.
 * Relying on it to release handles is reported: when handles are still live
 * or this thread's scopes are still open, one line on stderr gives the
 * count and HBM bytes of the live handles, the five ops holding the most
 * and the open scopes ("ctpu: at shutdown 150 handles were still live,
 * holding 37.5 MiB of HBM (most: full 37.5 MiB in 150); ..."). CTPU_QUIET=1
 * silences it.
 * Refused (nothing is shut down, the runtime stays usable; the error is
 * CTPU_ERR_STATE, read with ctpu_last_status / ctpu_last_error) when called
 * from inside a callback ctpu is running (a compiled step's fn, a grad hook:
 * "ctpu_shutdown: called from inside a compiled step's fn ...", and the
 * call that ran the callback fails with CTPU_ERR_STATE), or while another
 * thread is inside one, or inside a call that waits or calls back
 * (ctpu_compiled_call, ctpu_backward*, ctpu_sync, ctpu_to_host*,
 * ctpu_item): that call finishes normally. A guarded call another thread
 * starts while a shutdown runs waits for it, then fails with
 * CTPU_ERR_NOT_INITIALIZED. Other calls racing a shutdown are the
 * caller's to order (join the threads first). See "Callbacks" below
 * ctpu_call_pop. */
CTPU_API void ctpu_shutdown(void);
CTPU_API bool ctpu_is_initialized(void);
/* The library's version, "MAJOR.MINOR.PATCH" (meson.build's project
 * version; ctpu.pc carries the same). No init needed. */
CTPU_API const char *ctpu_version(void);

/* The calling thread's last error message (one line) and status; "" / CTPU_OK
 * if none. Successful calls do not clear it; ctpu_clear_error() does. */
CTPU_API const char *ctpu_last_error(void);
CTPU_API ctpu_status ctpu_last_status(void);
CTPU_API void ctpu_clear_error(void);
CTPU_API const char *ctpu_status_str(ctpu_status s);
/* Set this thread's last error (one line, printf-style, control characters
 * escaped) for libraries built on the public API (src/nn); returns st. */
CTPU_API ctpu_status ctpu_report_error(ctpu_status st, const char *fmt, ...) CTPU_PRINTF(2, 3);
/* The error handle of this thread's most recent failure (ctpu_report_error
 * makes one too), for such libraries to return from a failing call that
 * yields a tensor; CTPU_NULL if that call was given CTPU_NULL itself. */
CTPU_API ctpu_tensor ctpu_error_handle(void);

/* Mode: the process-wide mode, and a per-thread override that wins over it.
 * ctpu_set_thread_mode(-1) (or ctpu_clear_thread_mode) removes the override.
 * Changing mode syncs the stream first. Errors: CTPU_ERR_INVALID_ARG. */
CTPU_API ctpu_status ctpu_set_mode(ctpu_mode m);
CTPU_API ctpu_status ctpu_set_thread_mode(ctpu_mode m);
CTPU_API void ctpu_clear_thread_mode(void);
CTPU_API ctpu_mode ctpu_get_mode(void);           /* effective mode of this thread */
CTPU_API const char *ctpu_mode_name(ctpu_mode m); /* "strict", "debug", "defer_fuse" */

/* Debug checks: an op whose output holds a NaN where none of its inputs
 * holds a NaN or an Inf is an error (CTPU_ERR_NAN) naming it, its op number
 * and label (a gradient rule's: "backward of <op>"; an op inside a library
 * call such as ctpu_cross_entropy is named after the call first:
 * "cross_entropy (op #13): div: debug check: ..."); passing a NaN along (from
 * an input, or a NaN or Inf given as a host number: add_scalar(x, NAN),
 * full(NAN): in strict and debug eager; inside a multi-op program of defer
 * and fuse such a NaN is still reported as made) and Inf results are not
 * errors. Default: they follow this thread's current
 * mode (on in debug eager, off otherwise, ctpu_set_mode and
 * ctpu_set_thread_mode included); TORCH_TPU_ENABLE_DEBUG_CHECKS or
 * ctpu_set_debug_checks forces them on or off in every mode. */
CTPU_API ctpu_status ctpu_set_debug_checks(bool on);
CTPU_API bool ctpu_debug_checks(void);

/* Matmul precision for ops dispatched from now on (default: from
 * TORCH_TPU_MATMUL_PRECISION, else DEFAULT). Part of every cache key. */
CTPU_API ctpu_status ctpu_set_matmul_precision(ctpu_precision p);
CTPU_API ctpu_precision ctpu_get_matmul_precision(void);

/* Wait until every enqueued command has run. Returns the first latched device
 * error (CTPU_ERR_DEVICE_FAULT, CTPU_ERR_NAN) since the last sync, with its
 * message naming the op that caused it, and clears it. */
CTPU_API ctpu_status ctpu_sync(void);

/* ------------------------------------------------------------------ chip */

/* Cloud TPU price plans (the pricing page's columns): on demand, DWS
 * Flex-start, 1-year and 3-year commitments. TORCH_TPU_PRICE_PLAN chooses
 * the one the cost table prices (default on_demand). */
typedef enum {
    CTPU_PRICE_ON_DEMAND = 0, /* "on_demand" */
    CTPU_PRICE_FLEX_START = 1,/* "flex_start" (Dynamic Workload Scheduler) */
    CTPU_PRICE_1Y = 2,        /* "1y": 1-year commitment */
    CTPU_PRICE_3Y = 3,        /* "3y": 3-year commitment */
    CTPU_PRICE_PLAN_COUNT
} ctpu_price_plan;
/* "on_demand", "flex_start", "1y", "3y"; "?" for anything else. */
CTPU_API const char *ctpu_price_plan_name(ctpu_price_plan p);

typedef struct {
    const char *name;        /* "v5e", "v5p", "v6e", "7x" */
    int mxu_size;            /* systolic array side: 128 or 256 */
    int mxu_per_core;        /* MXUs per TensorCore */
    int cores;               /* TensorCores per chip */
    uint64_t hbm_bytes;      /* HBM capacity, bytes */
    double hbm_gbps;         /* HBM bandwidth, GB/s (1e9 bytes/s) */
    double peak_bf16_flops;  /* peak dense bf16, FLOP/s */
    double usd_per_chip_hour[CTPU_PRICE_PLAN_COUNT]; /* list price per chip-hour, USD, by plan */
    const char *price_region;/* the region the prices are quoted for, e.g. "us-central1" */
    const char *source;      /* where the figures come from (pages, date checked) */
} ctpu_chip_info;

/* The emulated chip (TORCH_TPU_CHIP). NULL before init. */
CTPU_API const ctpu_chip_info *ctpu_chip(void);
/* A profile by name ("v5e", "v5p", "v6e", "7x"); NULL if unknown. */
CTPU_API const ctpu_chip_info *ctpu_chip_lookup(const char *name);

/* HBM accounting, bytes. */
typedef struct {
    uint64_t in_use, peak, capacity;
    uint64_t allocs, frees;
} ctpu_hbm_stats;
CTPU_API ctpu_status ctpu_hbm_get_stats(ctpu_hbm_stats *out);
/* Reset the peak to the current in-use figure. */
CTPU_API void ctpu_hbm_reset_peak(void);

/* ------------------------------------------------------------- handles */

/* Tensor queries. On a bad handle they return -1 / CTPU_DTYPE_COUNT and set
 * the error. ctpu_shape copies up to CTPU_MAX_DIMS extents into out. */
CTPU_API int ctpu_ndim(ctpu_tensor t);
CTPU_API int64_t ctpu_dim(ctpu_tensor t, int d);       /* d may be negative */
CTPU_API int64_t ctpu_numel(ctpu_tensor t);
CTPU_API ctpu_dtype ctpu_dtype_of(ctpu_tensor t);
CTPU_API ctpu_status ctpu_shape(ctpu_tensor t, int64_t out[CTPU_MAX_DIMS], int *ndim);

/* Dynamic dims (TorchTPU's torch._dynamo.mark_dynamic; docs/DESIGN.md
 * "Dynamic dims"). Marks dim `dim` (negative counts from the end) of t as
 * dynamic with the extent range [lo, hi]: in defer and fuse, a trace reading
 * t is keyed with a symbol and this range in place of the extent, and one
 * program serves every extent in range (bit-identical to strict eager at
 * that extent, no padding). lo >= 2 (extent 1 changes broadcasting, as in
 * torch), hi >= lo, hi <= 2^40. Dims derived from t (ops, views, reshapes,
 * the gradients) follow the symbol; dims of equal range and equal extent in
 * one trace are one symbol. An extent outside [lo, hi] is a static dim of
 * that trace: it compiles its own program, whose recompile reason reads
 * "input 0 dim 1 = 300 outside dynamic range [2, 256]" (the program's
 * input number, as other recompile reasons give it, then its ctpu_set_name
 * name if any: "input 0 (x) dim 1 = ..."), and counts as a
 * shape for TORCH_TPU_RECOMPILE_LIMIT. Strict and debug eager ignore the
 * mark (their one-op programs see concrete extents). Marking again replaces
 * the dim's range. Each batch is a new tensor: mark it before its first use
 * in the step, or declare the batches' dims once with
 * ctpu_declare_dynamic_inputs (below). A reshape of a dynamic tensor that is not valid for every
 * extent in range is an error at the reshape call (CTPU_ERR_SHAPE, naming
 * the range): give the extent that varies as -1 or as a multiple of the
 * current extent. t must be a computed tensor (not a pending value of the
 * trace: CTPU_ERR_STATE). Errors: CTPU_ERR_INVALID_ARG (bad handle, dim out
 * of range, lo < 2, hi < lo, hi > 2^40), naming the tensor's shape. */
CTPU_API ctpu_status ctpu_mark_dynamic(ctpu_tensor t, int dim, int64_t lo, int64_t hi);
/* Dynamic dims for tensors that do not exist yet (each batch is a new
 * tensor; TorchTPU marks each one): while this declaration stands, every
 * tensor this thread makes from host data (ctpu_from_host,
 * ctpu_from_host_f32_as_bf16, and what is built on them: ctpu_image_set_batch's
 * batches, checkpoint loads) of dtype dt and rank ndim whose extent in dim
 * is in [lo, hi] comes marked as ctpu_mark_dynamic(t, dim, lo, hi) marks it;
 * other tensors are made as before. Declare after making or loading the
 * parameters (one of that dtype and rank made later, with its extent in
 * range, would be marked too). A declaration for the same dt, ndim and dim
 * replaces the old one; at most 4 stand at once; ctpu_clear_dynamic_inputs
 * ends them all. They belong to the calling thread and stay across modes
 * and runtimes until cleared (so both calls work before ctpu_init and after
 * ctpu_shutdown: a declaration is host state, not a device call). Strict and debug eager ignore the marks, as
 * ctpu_mark_dynamic's. Errors: CTPU_ERR_INVALID_ARG (dt not a dtype, ndim
 * outside [1, 8], dim outside [-ndim, ndim), lo < 2, hi < lo, hi > 2^40, a
 * fifth declaration), the message naming the arguments; CTPU_ERR_OOM. A
 * from_host whose mark fails (out of host memory) returns a failed handle. */
CTPU_API ctpu_status ctpu_declare_dynamic_inputs(ctpu_dtype dt, int ndim, int dim, int64_t lo, int64_t hi);
CTPU_API void ctpu_clear_dynamic_inputs(void);
CTPU_API bool ctpu_is_valid(ctpu_tensor t);            /* live and not stale; sets no error */
CTPU_API const char *ctpu_dtype_name(ctpu_dtype dt);   /* "f32", "bf16", "i32" */

/* Release a handle now (its storage is freed when nothing else refers to it).
 * Errors: CTPU_ERR_STALE_HANDLE, CTPU_ERR_NULL_HANDLE, CTPU_ERR_STATE (t is
 * a leaf's .grad from ctpu_grad, which the leaf owns: use ctpu_zero_grad). */
CTPU_API ctpu_status ctpu_release(ctpu_tensor t);

/* Name a tensor, as a module path names a parameter ("fc1.weight"): the
 * name appears where the value is reported: recompile reasons and the
 * recompile log ("input 0 (x) dim 0: 128 -> 96"), cache-only errors,
 * device faults (the tensor read: "... (1 bad index) (t is logits)"; debug
 * eager, at the call: the op's named inputs, "(weight is wte, indices is
 * tokens)"), host-read events in the trace file ("tensor": "loss") and
 * strict-eager op events ("inputs": ["fc1.weight", ""]). The name belongs to
 * the value's storage, so views of it and later handles on the same storage
 * report it too; NULL or "" removes it. Copied (at most CTPU_NAME_MAX bytes,
 * no control characters). Errors: handle errors, CTPU_ERR_INVALID_ARG. */
#define CTPU_NAME_MAX 63
CTPU_API ctpu_status ctpu_set_name(ctpu_tensor t, const char *name);
/* t's name, or "" (none, or a bad handle: no error). Valid until t is
 * released or renamed. */
CTPU_API const char *ctpu_name(ctpu_tensor t);

/* ---------------------------------------------------------------- scopes */

/* Open a scope: handles made from now on belong to it. Scopes nest (up to 64).
 * Leak watch: when HBM in use grows by more than max(16 MiB, 10%) over 100
 * consecutive marked steps (a new high at half of them), one warning on
 * stderr names the likely cause: this thread's scopes growing deeper (a
 * missing ctpu_scope_end), or handles never released and the op that made
 * the most of them. */
CTPU_API ctpu_status ctpu_scope_begin(void);
/* Release every handle of the innermost scope except kept ones, which move to
 * the enclosing scope. Errors: CTPU_ERR_STATE if no scope is open (inside a
 * callback: none the callback opened, "Callbacks" below ctpu_call_pop). */
CTPU_API ctpu_status ctpu_scope_end(void);
/* Keep t past the end of its scope (it moves to the enclosing scope, or
 * becomes global at the outermost). Returns t, or null on a bad handle (CTPU_NULL
 * included: CTPU_ERR_NULL_HANDLE, "keep: t is a null handle"). */
CTPU_API ctpu_tensor ctpu_keep(ctpu_tensor t);
/* A step scope: ctpu_scope_begin plus, at its end, a trace cut (mark_step).
 * In the eager modes a step end is a scope end. step_end errors: as
 * scope_end's, and CTPU_ERR_STATE if the innermost scope is not a step. */
CTPU_API ctpu_status ctpu_step_begin(void);
CTPU_API ctpu_status ctpu_step_end(void);
/* Cut the current trace here (defer and fuse); a no-op in the eager modes
 * apart from counting the step. */
CTPU_API ctpu_status ctpu_mark_step(void);

/* ------------------------------------------------------------- creation */

/* Copy host data into a new device tensor. data holds numel elements of dtype
 * (f32: float, bf16: uint16_t bit patterns, i32: int32_t), row-major.
 * ndim in [0, 8]; extents >= 0; numel*elemsize must not overflow.
 * Errors: CTPU_ERR_INVALID_ARG, CTPU_ERR_SHAPE, CTPU_ERR_OOM. */
CTPU_API ctpu_tensor ctpu_from_host(const void *data, ctpu_dtype dt, int ndim, const int64_t *shape);
/* Copy a tensor to host memory (waits for it). dst_bytes must be at least
 * numel * elemsize. Errors: CTPU_ERR_INVALID_ARG, handle errors, and any device
 * error latched on the tensor (CTPU_ERR_DEVICE_FAULT naming the op). */
CTPU_API ctpu_status ctpu_to_host(ctpu_tensor t, void *dst, size_t dst_bytes);
/* Host f32 data as a new bf16 tensor: each float rounded to bf16 by the
 * rule every bf16 result follows (round to nearest even, bf16 subnormals to
 * signed zero, NaN stays NaN; docs/CONTRACTS.md), the same bits as
 * ctpu_cast(ctpu_from_host(data, CTPU_F32, ...), CTPU_BF16). data holds
 * numel floats. Errors: as ctpu_from_host. */
CTPU_API ctpu_tensor ctpu_from_host_f32_as_bf16(const float *data, int ndim, const int64_t *shape);
/* Copy a tensor of any dtype to host memory as numel floats (waits for it):
 * f32 as is, bf16 widened exactly, i32 converted as (float) (exact up to
 * 2^24 in magnitude). dst_bytes must be at least numel * 4.
 * Errors: as ctpu_to_host. */
CTPU_API ctpu_status ctpu_to_host_as_f32(ctpu_tensor t, float *dst, size_t dst_bytes);
/* Print t to f (stdout if NULL) as PyTorch prints a tensor, then its shape
 * and dtype, and a newline (waits for it):
 *   tensor([[1., 2., 3.],
 *           [4., 5., 6.]], shape=(2, 3), dtype=f32)
 * One format for all elements (torch's rules): i32 as integers; floats
 * "3." when every finite shown value is integral, else 4 decimals
 * ("0.5000"), or scientific ("1.0000e-05") when the nonzero magnitudes span
 * more than 1000x, exceed 1e8 or go below 1e-4; nan, inf, -inf; right-aligned
 * to one width; rows wrapped at 80 columns. Above 1000 elements every dim
 * shows its first and last 3 entries around "..." (torch's threshold=1000,
 * edgeitems=3). Errors: handle errors, CTPU_ERR_NOT_INITIALIZED, device
 * errors latched on t, CTPU_ERR_OOM (host memory for a copy of t),
 * CTPU_ERR_IO (writing to f failed). */
CTPU_API ctpu_status ctpu_print(ctpu_tensor t, FILE *f);
/* The value of a one-element tensor as double (waits for it). */
CTPU_API ctpu_status ctpu_item(ctpu_tensor t, double *out);

CTPU_API ctpu_tensor ctpu_zeros(ctpu_dtype dt, int ndim, const int64_t *shape);
CTPU_API ctpu_tensor ctpu_ones(ctpu_dtype dt, int ndim, const int64_t *shape);
/* value is converted to dt (bf16: RNE; i32: toward zero, saturating). */
CTPU_API ctpu_tensor ctpu_full(ctpu_dtype dt, int ndim, const int64_t *shape, double value);
/* [start, end) in steps of step (step != 0): 1-D, ceil((end-start)/step)
 * elements, value i = start + i*step. As torch: for i32, start and step are
 * truncated toward zero first (arange(0, 5, 1.5, i32) = [0 1 2 3]; the count
 * is still from the doubles). Errors: CTPU_ERR_INVALID_ARG (not finite, step
 * 0 (i32: |step| < 1), end - start of the other sign than step: "upper bound
 * and larger bound inconsistent with step sign"; end == start is empty). */
CTPU_API ctpu_tensor ctpu_arange(double start, double end, double step, ctpu_dtype dt);

/* Counter-based random numbers (Philox4x32-10): element i depends only on
 * (seed, offset, i). The generator's offset advances by numel per draw, so two
 * draws differ; ctpu_manual_seed sets the seed and resets the offset to 0.
 * f32 or bf16. rand_uniform draws from [lo, hi) (lo > hi, or a non-finite
 * bound: CTPU_ERR_INVALID_ARG, as torch's uniform_), rand_normal from
 * N(mean, std^2) (std < 0: CTPU_ERR_INVALID_ARG). */
CTPU_API void ctpu_manual_seed(uint64_t seed);
/* The generator's whole state is (seed, offset): the offset counts the
 * elements drawn since the seed was set (taken when a draw is dispatched or,
 * in defer and fuse, recorded). Setting a state got earlier replays the same
 * draws from there on, in every mode: this is what a checkpoint saves
 * (ctpu_checkpoint_save in ctpu_nn.h stores it as metadata). Errors:
 * CTPU_ERR_NOT_INITIALIZED, CTPU_ERR_INVALID_ARG (a NULL pointer). */
CTPU_API ctpu_status ctpu_rng_get_state(uint64_t *seed, uint64_t *offset);
CTPU_API ctpu_status ctpu_rng_set_state(uint64_t seed, uint64_t offset);
CTPU_API ctpu_tensor ctpu_rand_uniform(ctpu_dtype dt, int ndim, const int64_t *shape, double lo, double hi);
CTPU_API ctpu_tensor ctpu_rand_normal(ctpu_dtype dt, int ndim, const int64_t *shape, double mean, double std);
/* torch.randint(low, high, shape): integers uniform in [low, high), low <
 * high, both in [-2^31, 2^31]; dt i32, f32 or bf16 (the integer rounded to
 * it). Element i is low + (b mod (high - low)), b the 64 bits of words 0 and
 * 1 of Philox block (seed, offset + i): the same bits in every mode, ISA and
 * thread count (the modulo bias is below (high - low) / 2^64). Draws from the
 * generator like ctpu_rand_uniform. Errors: CTPU_ERR_INVALID_ARG (low,
 * high), CTPU_ERR_DTYPE, CTPU_ERR_SHAPE (a bad shape). */
CTPU_API ctpu_tensor ctpu_randint(ctpu_dtype dt, int ndim, const int64_t *shape, int64_t low, int64_t high);
/* Creators shaped like a (a's shape and dtype; torch's *_like): composites of
 * ctpu_full / ctpu_rand_uniform (U[0, 1)) / ctpu_rand_normal (N(0, 1)) /
 * ctpu_randint. rand_like and randn_like need a float a (CTPU_ERR_DTYPE for
 * i32, as torch). Errors: handle errors naming the call. */
CTPU_API ctpu_tensor ctpu_zeros_like(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_ones_like(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_full_like(ctpu_tensor a, double value);
CTPU_API ctpu_tensor ctpu_rand_like(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_randn_like(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_randint_like(ctpu_tensor a, int64_t low, int64_t high);
/* torch.eye(n, m): [n, m] with ones where i == j, zeros elsewhere, in dt. A
 * composite (ctpu_eq of two i32 aranges, exact at any size; cast to dt).
 * Errors: CTPU_ERR_INVALID_ARG (n or m negative or >= 2^31), CTPU_ERR_DTYPE,
 * CTPU_ERR_SHAPE (too many elements). */
CTPU_API ctpu_tensor ctpu_eye(int64_t n, int64_t m, ctpu_dtype dt);
/* torch.linspace(start, end, steps): 1-D [steps], f32 or bf16, by the
 * formula of torch's CPU kernel in dt's arithmetic: step = (end - start) /
 * (steps - 1); element i < steps / 2 is start + step * i, the others end -
 * step * (steps - 1 - i) (so both ends are exact); start, end and step are
 * rounded to dt first; steps == 1 gives [start], 0 an empty tensor. A
 * composite (ctpu_arange, ctpu_mul_scalar, ctpu_add_scalar, ctpu_rsub_scalar,
 * ctpu_where). Error against float64 start + i (end - start) / (steps - 1)
 * (tests/test_ops.c): <= 2 ulp of max(|start|, |end|) in f32 (the step's
 * rounding times the index). Errors: CTPU_ERR_INVALID_ARG (start or end not
 * finite, steps outside [0, 2^24]), CTPU_ERR_DTYPE (i32). */
CTPU_API ctpu_tensor ctpu_linspace(double start, double end, int64_t steps, ctpu_dtype dt);

/* dst takes the value of src (same shape and dtype, else CTPU_ERR_SHAPE /
 * CTPU_ERR_DTYPE). Writes dst's storage in place when no other live handle
 * shares it and no pending defer-and-fuse trace of another thread reads it
 * (the stream is in order, so reads already enqueued see the old value; a
 * trace recorded before the assign reads the old value too), otherwise
 * gives dst a new buffer (copy-on-write). A view of dst (or dst a view of
 * a base) keeps its value: only dst changes.
 * Autograd, as torch's dst.copy_(src) (docs/CONTRACTS.md "Scopes, autograd,
 * optimizers"): with grad mode on, dst a leaf that requires grad is
 * CTPU_ERR_STATE ("assign: dst f32[4] is a leaf that requires grad: ...";
 * nothing changes; write parameters under ctpu_no_grad_begin/end, as the
 * optimizers and ctpu_load do); otherwise, when dst or src requires grad,
 * dst's history is replaced by a copy of src's: backward through dst sends
 * the gradient to src and zeros to dst's old history (torch's
 * CopyBackwards), and a dst that did not require grad now does (it is no
 * longer a leaf). Under no_grad dst keeps its history and leaf status. A
 * value the tape saved before the assign (dst, a view of it, an output)
 * keeps the value it had, so backward reads the old value: the saved
 * reference shares the storage, so the write goes to a new buffer (where
 * torch raises "modified by an inplace operation" at backward). The same in
 * every mode. */
CTPU_API ctpu_status ctpu_assign(ctpu_tensor dst, ctpu_tensor src);

/* --------------------------------------------------------- elementwise
 * NumPy broadcasting; result dtype by PyTorch promotion (f32 wins over bf16,
 * float over i32); a host scalar never changes the tensor's dtype, and, as
 * in torch, neither does a 0-d tensor of the same category: bf16[N] (+) f32[]
 * is a bf16 op, the 0-d value rounded to bf16 first (comparisons and
 * ctpu_where's branches too; two 0-d tensors, or a dimensioned f32, promote
 * as above). Every
 * result is rounded to its dtype. Math in f32 (SLEEF non-FMA u10 for
 * transcendentals; tanh, also inside gelu's tanh form, in double steps rounded
 * once, <= 1 ulp: docs/CONTRACTS.md). Errors: CTPU_ERR_SHAPE (not
 * broadcastable), CTPU_ERR_DTYPE. */
CTPU_API ctpu_tensor ctpu_neg(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_abs(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_exp(ctpu_tensor a);     /* float result (i32 input -> f32) */
CTPU_API ctpu_tensor ctpu_log(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_sqrt(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_rsqrt(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_tanh(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_sigmoid(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_relu(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_gelu(ctpu_tensor a, bool tanh_approx); /* tanh form or exact (erf) */
/* Softplus, torch.nn.functional.softplus with beta = 1, threshold = 20:
 * a > 20 ? a : log1p(exp(a)), elementwise, in f32 with SLEEF's non-FMA u10
 * exp and log1p (the same bits on every ISA); within 1 ulp of the float64
 * value (checked on every f32 in [-120, 25]), exact above 20. Same shape as
 * a; f32 or bf16 as a (i32 input -> f32); NaN gives NaN, -Inf gives +0.
 * Gradient: sigmoid(a), and 1 where a > 20 (PyTorch's rule). Errors: a null
 * or stale handle (named "softplus"). */
CTPU_API ctpu_tensor ctpu_softplus(ctpu_tensor a);
/* SiLU (swish), torch.nn.functional.silu: a * sigmoid(a), computed as exactly
 * those two ops (a composite: its gradient and fusion are theirs). Same shape
 * as a; f32 or bf16 as a (i32 input -> f32). For bf16 the sigmoid is rounded
 * to bf16 before the product (two roundings; torch rounds once). Errors: as
 * ctpu_sigmoid and ctpu_mul (a null or stale handle: named "silu"). */
CTPU_API ctpu_tensor ctpu_silu(ctpu_tensor a);
/* Primitives (own rows and kernels; SLEEF non-FMA u10 functions, the same bits
 * on every ISA: erf, log1p, expm1 in f32; sin, cos in double, rounded once). Same shape as a; f32 or bf16 as a (i32 input -> f32).
 * Measured error vs float64 (tests/test_k_elementwise.c, test_ops.c), f32:
 * erf <= 1 ulp; sin, cos <= 1 ulp for |x| <= 1e4 (torch.sin, cos; rotary
 * embeddings); log1p (x > -1; -1 -> -inf, below -> NaN) and expm1 <= 1 ulp
 * (accurate near 0, where log(1 + x) and exp(x) - 1 cancel). Gradients:
 * 2/sqrt(pi) exp(-x^2); cos x; -sin x; 1/(1 + x); expm1(x) + 1.
 * Errors: CTPU_ERR_NULL_HANDLE / CTPU_ERR_STALE_HANDLE, named by the op. */
CTPU_API ctpu_tensor ctpu_erf(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_sin(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_cos(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_log1p(ctpu_tensor a);
CTPU_API ctpu_tensor ctpu_expm1(ctpu_tensor a);
/* torch.nn.functional.leaky_relu: x > 0 ? x : x * negative_slope (NaN stays
 * NaN). A composite: where(gt_scalar(x, 0), x, mul_scalar(x, slope)); the
 * gradient is 1 / slope (slope at 0, as torch). Same shape and dtype as x
 * (but an i32 x gives f32: the slope is a float scalar). Exact: x, or the f32
 * rounding of x * slope (tests/test_ops.c). Errors: as its ops, and
 * CTPU_ERR_INVALID_ARG for a non-finite slope; named "leaky_relu". */
CTPU_API ctpu_tensor ctpu_leaky_relu(ctpu_tensor a, double negative_slope);
/* torch.nn.functional.elu: x > 0 ? x : alpha * (exp(x) - 1). A composite:
 * where(gt_scalar(x, 0), x, alpha * expm1(clamp(x, -inf, 0))) (the clamp
 * keeps the untaken branch finite, so its gradient is an exact 0). Gradient
 * 1 / alpha * exp(x) (alpha at x = 0, as torch). Error vs float64: <= 2 ulp (expm1 and one product;
 * measured 1.22 ulp on [-12, 12] with specials, tests/test_ops.c).
 * Errors: as its ops, CTPU_ERR_INVALID_ARG for a non-finite alpha; "elu". */
CTPU_API ctpu_tensor ctpu_elu(ctpu_tensor a, double alpha);

CTPU_API ctpu_tensor ctpu_add(ctpu_tensor a, ctpu_tensor b);
CTPU_API ctpu_tensor ctpu_sub(ctpu_tensor a, ctpu_tensor b);
CTPU_API ctpu_tensor ctpu_mul(ctpu_tensor a, ctpu_tensor b);
CTPU_API ctpu_tensor ctpu_div(ctpu_tensor a, ctpu_tensor b);   /* i32/i32 -> f32 (true division) */
CTPU_API ctpu_tensor ctpu_pow(ctpu_tensor a, ctpu_tensor b);
CTPU_API ctpu_tensor ctpu_maximum(ctpu_tensor a, ctpu_tensor b); /* NaN from either side */
CTPU_API ctpu_tensor ctpu_minimum(ctpu_tensor a, ctpu_tensor b);
/* Comparisons give f32 masks (1.0 / 0.0). A bf16 tensor is compared with a
 * host number (the *_scalar forms) in bf16, the number rounded to bf16 first
 * as torch does: eq_scalar(bf16 1, 1.001) is 1. */
CTPU_API ctpu_tensor ctpu_eq(ctpu_tensor a, ctpu_tensor b);
CTPU_API ctpu_tensor ctpu_ne(ctpu_tensor a, ctpu_tensor b);
CTPU_API ctpu_tensor ctpu_lt(ctpu_tensor a, ctpu_tensor b);
CTPU_API ctpu_tensor ctpu_le(ctpu_tensor a, ctpu_tensor b);
CTPU_API ctpu_tensor ctpu_gt(ctpu_tensor a, ctpu_tensor b);
CTPU_API ctpu_tensor ctpu_ge(ctpu_tensor a, ctpu_tensor b);

/* Scalar forms: the scalar is a runtime argument (never part of a cache key).
 * _rscalar forms put the scalar first (s - a, s / a, s ** a).
 * The double s is a float scalar, as a Python float in torch's type
 * promotion: with an i32 tensor, add / sub / rsub / mul / maximum /
 * minimum_scalar (and ctpu_clamp) give f32, the tensor cast to f32 first
 * (torch.tensor([0, 1, 2]) + 0.5 is f32 [0.5, 1.5, 2.5]; i32 * 2.0 is f32
 * too, as in torch: the dtype follows from the call, never from the value).
 * f32 stays f32 and bf16 stays bf16 (computed in f32, rounded once); div and
 * pow give a float (i32 -> f32); comparisons give f32 masks. For an int
 * scalar (Python's int: i32 + 1 stays i32) use the *_scalar_int forms below.
 * Errors: CTPU_ERR_NULL_HANDLE / CTPU_ERR_STALE_HANDLE, named by the op. */
CTPU_API ctpu_tensor ctpu_add_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_sub_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_mul_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_div_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_pow_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_maximum_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_minimum_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_rsub_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_rdiv_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_rpow_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_eq_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_ne_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_lt_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_le_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_gt_scalar(ctpu_tensor a, double s);
CTPU_API ctpu_tensor ctpu_ge_scalar(ctpu_tensor a, double s);
/* Int scalar forms (torch's Python-int scalar): an i32 tensor stays i32, its
 * arithmetic saturating at the i32 range as add_scalar's (README "Where ctpu
 * differs": torch wraps); an f32 or bf16 tensor gives what the double form
 * gives with (double)s (s exact for |s| <= 2^53). Same shape as a.
 * Errors: CTPU_ERR_NULL_HANDLE / CTPU_ERR_STALE_HANDLE, named by the op
 * ("add_scalar", ...). */
CTPU_API ctpu_tensor ctpu_add_scalar_int(ctpu_tensor a, int64_t s);
CTPU_API ctpu_tensor ctpu_sub_scalar_int(ctpu_tensor a, int64_t s);
CTPU_API ctpu_tensor ctpu_mul_scalar_int(ctpu_tensor a, int64_t s);
CTPU_API ctpu_tensor ctpu_rsub_scalar_int(ctpu_tensor a, int64_t s);   /* s - a */
CTPU_API ctpu_tensor ctpu_maximum_scalar_int(ctpu_tensor a, int64_t s);
CTPU_API ctpu_tensor ctpu_minimum_scalar_int(ctpu_tensor a, int64_t s);

/* cond != 0 ? a : b, all three broadcast together; cond of any dtype.
 * Gradient: g to a where cond != 0 and to b elsewhere, each summed to its
 * shape; a float cond that requires grad gets 0 (a step in cond; torch's
 * conditions are bool, without a gradient). */
CTPU_API ctpu_tensor ctpu_where(ctpu_tensor cond, ctpu_tensor a, ctpu_tensor b);
/* min(max(a, lo), hi); NaN propagates. lo <= hi is not required (as torch).
 * Float bounds: an i32 a gives f32 (torch.clamp(i32 [0, 1, 2], 1.5, 2.5) is
 * f32 [1.5, 1.5, 2]); ctpu_clamp_int's int bounds keep i32. Same shape as a.
 * Errors: CTPU_ERR_NULL_HANDLE / CTPU_ERR_STALE_HANDLE, named "clamp". */
CTPU_API ctpu_tensor ctpu_clamp(ctpu_tensor a, double lo, double hi);
CTPU_API ctpu_tensor ctpu_clamp_int(ctpu_tensor a, int64_t lo, int64_t hi);
/* Convert to dt: f32->bf16 RNE (subnormal -> 0), f32->i32 toward zero,
 * saturating, NaN -> 0 (docs/CONTRACTS.md "Dtypes"). */
CTPU_API ctpu_tensor ctpu_cast(ctpu_tensor a, ctpu_dtype dt);

/* ----------------------------------------------------------- reductions
 * dims: ndims entries in [-ndim, ndim), distinct; ndims == 0 (dims NULL)
 * reduces every dim. keepdim keeps reduced dims as extent 1. Order: the one
 * fixed order of docs/CONTRACTS.md (chunks of 4096, 16 virtual lanes, fixed trees),
 * depending only on the shape. Result f32 (bf16 input -> bf16 result). */
CTPU_API ctpu_tensor ctpu_sum(ctpu_tensor a, int ndims, const int *dims, bool keepdim);
CTPU_API ctpu_tensor ctpu_mean(ctpu_tensor a, int ndims, const int *dims, bool keepdim); /* sum / n */
CTPU_API ctpu_tensor ctpu_max(ctpu_tensor a, int ndims, const int *dims, bool keepdim);  /* NaN wins */
CTPU_API ctpu_tensor ctpu_min(ctpu_tensor a, int ndims, const int *dims, bool keepdim);
/* var = sum((x - mean)^2) / (n - correction) (correction 1: unbiased). */
CTPU_API ctpu_tensor ctpu_var(ctpu_tensor a, int ndims, const int *dims, int correction, bool keepdim);
/* Product over dims (torch.prod; here over any set of dims like ctpu_sum):
 * a primitive with ctpu_sum's order (chunks of 4096 into 16 lanes, each
 * lane multiplying left to right from 1, the fixed trees), every product
 * rounded to f32. An empty slice gives 1; i32 input gives f32 (as ctpu_sum).
 * Gradient: torch's prod_backward (y / x without zeros; the product of the
 * nonzeros at a single zero; 0 with two or more zeros). Error against
 * float64 (tests/test_ops.c, factors of magnitude in [0.9, 1.1], up to 20000
 * of them): |y - ref| <= (n + 1) 2^-24 |ref| + 1 ulp. Errors: as ctpu_sum. */
CTPU_API ctpu_tensor ctpu_prod(ctpu_tensor a, int ndims, const int *dims, bool keepdim);
/* First index of the maximum along dim (a NaN counts as maximal) -> i32. */
CTPU_API ctpu_tensor ctpu_argmax(ctpu_tensor a, int dim, bool keepdim);
/* First index of the minimum along dim -> i32 (torch.argmin). The NaN rule
 * is argmax's: a NaN counts as minimal, the first NaN wins. i32 input is
 * compared as integers. Errors: CTPU_ERR_SHAPE (dim out of range, the dim of
 * extent 0), handle errors. */
CTPU_API ctpu_tensor ctpu_argmin(ctpu_tensor a, int dim, bool keepdim);
/* torch.logsumexp over dims (ndims == 0: every dim; keepdim as ctpu_sum):
 * log(sum(exp(a - m))) + m with m the max over the dims, set to 0 where it
 * is infinite (an all -inf slice gives -inf, a +inf gives +inf, a NaN NaN;
 * an empty slice -inf). A composite (docs/DESIGN.md) of ctpu_max (of a
 * detached a), ctpu_where, ctpu_sub, ctpu_exp, ctpu_sum, ctpu_log and
 * ctpu_add, in f32: a bf16 a is cast to f32 and the result rounded to bf16
 * once; i32 gives f32. Gradient: softmax(a) * g (through exp and sum; m
 * carries none). Error against float64 (tests/test_ops.c, n up to 9001):
 * |y - ref| <= (n + 8) 2^-24 + 2 ulp(ref) (measured 1.4e-6 at n = 9001, |x| <= 30).
 * Errors: as ctpu_sum, naming logsumexp. */
CTPU_API ctpu_tensor ctpu_logsumexp(ctpu_tensor a, int ndims, const int *dims, bool keepdim);
/* torch.cumsum along dim (in [-ndim, ndim); a 0-d a takes 0 / -1): y_j =
 * x_0 + ... + x_j added left to right into an f32 accumulator from +0 (one
 * rounding per addition, so element j equals a left-to-right sum of j + 1
 * terms; not ctpu_sum's tree order), each y_j rounded to the output dtype
 * (bf16 in -> bf16 out; i32 in -> f32 out). A primitive; its gradient is the
 * cumsum of g from the end. Error against float64: |y_j - ref_j| <=
 * (j + 1) 2^-24 sum_k<=j |x_k|. Errors: CTPU_ERR_SHAPE (dim), handle errors. */
CTPU_API ctpu_tensor ctpu_cumsum(ctpu_tensor a, int dim);
/* max-subtracted softmax / log_softmax along dim. */
CTPU_API ctpu_tensor ctpu_softmax(ctpu_tensor a, int dim);
CTPU_API ctpu_tensor ctpu_log_softmax(ctpu_tensor a, int dim);

/* ------------------------------------------------------- normalisation
 * Over the last dim D of x [..., D] (f32 or bf16), as
 * torch.nn.functional.layer_norm(x, (D,), weight, bias, eps) and
 * torch.nn.functional.rms_norm(x, (D,), weight, eps). weight and bias are
 * [D] (f32 or bf16) or CTPU_NULL (elementwise_affine=False). Composites
 * (docs/DESIGN.md): made of ctpu_mean / ctpu_var / ctpu_sub / ctpu_rsqrt /
 * ctpu_mul / ctpu_add (their gradients and fusion); a bf16 x, weight or bias
 * is cast to f32 first and the result cast back to x's dtype once, as torch
 * computes bf16 norms in f32. Result: x's shape and dtype. Error against a
 * float64 reference (tests/test_ops.c, D = 37): |y - ref| <= 4e-7 (1 + |ref|)
 * in f32 (measured 9.3e-8), <= 2^-7 (1 + |ref|) in bf16 (x's and y's
 * roundings; measured 4.3e-3); the gradient of x <= 2e-7 (1 + |ref|)
 * (measured 4.6e-8).
 * Errors: handle errors naming the op and argument; CTPU_ERR_DTYPE (an i32
 * x, weight or bias); CTPU_ERR_SHAPE (x 0-d or D == 0, weight or bias not
 * [D]); CTPU_ERR_INVALID_ARG (eps negative or not finite). */
/* (x - mean) / sqrt(var + eps) * weight + bias; var biased (divides by D). */
CTPU_API ctpu_tensor ctpu_layer_norm(ctpu_tensor x, ctpu_tensor weight, ctpu_tensor bias, double eps);
/* x * rsqrt(mean(x^2) + eps) * weight. */
CTPU_API ctpu_tensor ctpu_rms_norm(ctpu_tensor x, ctpu_tensor weight, double eps);

/* ------------------------------------------------------- data movement */
/* New shape with the same numel; one extent may be -1 (inferred). Shares
 * storage when the input is contiguous (always, in ctpu). */
CTPU_API ctpu_tensor ctpu_reshape(ctpu_tensor a, int ndim, const int64_t *shape);
/* perm is a permutation of [0, ndim). */
CTPU_API ctpu_tensor ctpu_permute(ctpu_tensor a, const int *perm);
CTPU_API ctpu_tensor ctpu_transpose(ctpu_tensor a, int d0, int d1);
CTPU_API ctpu_tensor ctpu_contiguous(ctpu_tensor a);
/* Elements start, start+step, ... < end along dim (python slicing: negative
 * start/end count from the end and are clamped; step >= 1). */
CTPU_API ctpu_tensor ctpu_slice(ctpu_tensor a, int dim, int64_t start, int64_t end, int64_t step);
/* Concatenate n >= 1 tensors of the same dtype, equal extents except dim. */
CTPU_API ctpu_tensor ctpu_concat(int n, const ctpu_tensor *ts, int dim);
/* Broadcast to shape (extent 1 or new leading dims expand; -1 keeps). */
CTPU_API ctpu_tensor ctpu_expand(ctpu_tensor a, int ndim, const int64_t *shape);
/* Movement composites (docs/DESIGN.md): reshapes, concat, where over
 * arange masks; exact (no arithmetic on the values), gradients theirs.
 * Errors name the op: handle errors, CTPU_ERR_SHAPE for a dim out of range
 * (named with the valid range), CTPU_ERR_INVALID_ARG for a bad count. */
/* torch.unsqueeze: a new extent-1 dim at dim in [-ndim-1, ndim] (ndim < 8). */
CTPU_API ctpu_tensor ctpu_unsqueeze(ctpu_tensor a, int dim);
/* torch.squeeze(a, dim): drops dim (in [-ndim, ndim)) if its extent is 1,
 * else the same shape (a new handle), as torch. */
CTPU_API ctpu_tensor ctpu_squeeze(ctpu_tensor a, int dim);
/* torch.flatten(a, start, end): dims start..end (inclusive, negative count
 * from the end, start <= end) merged into one; a 0-d a gives [1]. */
CTPU_API ctpu_tensor ctpu_flatten(ctpu_tensor a, int start, int end);
/* torch.stack: n >= 1 tensors of one shape and dtype along a new dim in
 * [-ndim-1, ndim] (unsqueeze each, then concat). */
CTPU_API ctpu_tensor ctpu_stack(int n, const ctpu_tensor *ts, int dim);
/* torch.tril / torch.triu over the last two dims (ndim >= 2): keeps
 * a[..., i, j] where j - i <= k (tril) or j - i >= k (triu), else 0. */
CTPU_API ctpu_tensor ctpu_tril(ctpu_tensor a, int64_t k);
CTPU_API ctpu_tensor ctpu_triu(ctpu_tensor a, int64_t k);
/* torch.index_select: index i32 [n] (1-D) picks slices of a along dim (in
 * [-ndim, ndim)); result a's shape with extent n at dim. A composite: the
 * index reshaped and expanded to the result's shape, then ctpu_gather (its
 * gradient; an index outside [0, extent) is gather's device fault, never an
 * out-of-bounds read). Errors: CTPU_ERR_DTYPE (index not i32),
 * CTPU_ERR_SHAPE (index not 1-D, a 0-d, dim out of range). */
CTPU_API ctpu_tensor ctpu_index_select(ctpu_tensor a, int dim, ctpu_tensor index);
/* A causal attention mask f32 [T, S]: position (i, j) is allowed when
 * j <= i (top-left aligned, as torch's tril(ones(T, S)) and
 * scaled_dot_product_attention(is_causal=True)). CTPU_MASK_ADDITIVE gives 0
 * where allowed and -inf elsewhere (add it to the scores); CTPU_MASK_BINARY
 * gives 1 / 0. Errors: CTPU_ERR_INVALID_ARG (T or S < 1 or > 2^24, T*S >
 * 2^36, another kind); its failures (out of HBM) name causal_mask. */
typedef enum {
    CTPU_MASK_ADDITIVE = 0,   /* f32 added to the scores (0 keeps, -inf drops) */
    CTPU_MASK_BINARY = 1,     /* f32 1 / 0 (causal_mask's second kind) */
    CTPU_MASK_KEEP01 = 1,     /* the same, as attention reads it: 0 drops a key, any other value keeps it */
    CTPU_MASK_NONE = 2        /* no mask (scaled_dot_product_attention only) */
} ctpu_mask_kind;
CTPU_API ctpu_tensor ctpu_causal_mask(int64_t T, int64_t S, ctpu_mask_kind kind);
/* torch.nn.functional.scaled_dot_product_attention, as one blockwise kernel
 * (flash-attention style): softmax(q kᵀ * scale + mask) v without a
 * [B,H,Tq,Tk] score tensor in any mode.
 * q [B,H,Tq,Dh], k and v [B,H,Tk,Dh]: 4-D, contiguous or not, one dtype (f32
 * or bf16); the result is [B,H,Tq,Dh] in that dtype (bf16: rounded once from
 * the f32 result).
 * mask: f32, at most 4-D, broadcastable to [B,H,Tq,Tk]; mask_kind
 * CTPU_MASK_ADDITIVE adds it to the scores, CTPU_MASK_KEEP01 drops the keys
 * where it is 0; CTPU_MASK_NONE: no mask (mask must be CTPU_NULL).
 * is_causal: key j is dropped for query i when j > i (top-left aligned, as
 * torch; unlike torch it may be combined with a mask).
 * scale: 0 means 1/sqrt(Dh); otherwise any value finite as an f32, the
 * kernel's (|scale| <= FLT_MAX; negative allowed, as torch).
 * dropout_p in [0, 1): each probability is kept where the counter-based
 * generator's uniform draw u >= p and scaled by 1/(1-p), as ctpu_dropout on
 * the [B,H,Tq,Tk] probabilities would do (the draws are the same elements of
 * the same generator; applied whenever p > 0: there is no training flag, as
 * in torch). It advances the generator by B*H*Tq*Tk when p > 0.
 * A fully masked row (every key dropped by the mask and/or is_causal) gives
 * 0 and a zero gradient, as torch's _safe_softmax since 2.5
 * (pytorch/pytorch#131863; torch 1.13 gave NaN for an additive -inf row):
 * padded rows then poison neither the loss nor debug checks.
 * Numerics: blocks of 128 queries x 128 keys, the online softmax with the
 * probabilities rounded to bf16, both products on the MXU at the matmul
 * precision setting (docs/CONTRACTS.md "Attention"); bit-identical in every
 * mode, ISA and thread count. Its gradient (q, k and v; not the mask's)
 * recomputes the probabilities from the saved log-sum-exp. Dynamic dims
 * (ctpu_mark_dynamic): when the marked dims of q, k and v are one symbol
 * (self-attention's T, a batch) every extent binds one program; q's and
 * k's lengths as two symbols (a cross attention) or one of them static
 * (a decode step's q) compile the backward per extent.
 * Errors: CTPU_ERR_SHAPE (not 4-D, B/H/Dh or Tk differ, Dh = 0, mask not
 * broadcastable, dropout_p > 0 over more than 2^56 probabilities: the
 * element cap of the [B,H,Tq,Tk] draws), CTPU_ERR_DTYPE (i32 or mixed
 * q/k/v, mask not f32), CTPU_ERR_INVALID_ARG (bad mask_kind, a mask with
 * CTPU_MASK_NONE, scale not finite as an f32, dropout_p outside [0, 1));
 * at the backward CTPU_ERR_STATE when the mask requires grad (its
 * gradient is not computed). Nothing is drawn from the generator on an
 * error. */
CTPU_API ctpu_tensor ctpu_scaled_dot_product_attention(ctpu_tensor q, ctpu_tensor k, ctpu_tensor v, ctpu_tensor mask,
                                                       ctpu_mask_kind mask_kind, bool is_causal, double scale,
                                                       double dropout_p);
/* ctpu_scaled_dot_product_attention with heads as the third dim, the layout
 * a [B,T,H*Dh] projection has once reshaped: q [B,Tq,H,Dh], k and v
 * [B,Tk,H,Dh]; the result is [B,Tq,H,Dh] and the gradients are of q's, k's
 * and v's shapes. Equal bit for bit, result and gradients, to
 * permute(ctpu_scaled_dot_product_attention(permute(q, {0,2,1,3}), ...,
 * same mask, kind, is_causal, scale, dropout_p), {0,2,1,3}), the mask and
 * the dropout draws indexed as there ([B,H,Tq,Tk]), without the four
 * permute copies forward and back. Errors as
 * ctpu_scaled_dot_product_attention's, the shapes read in this layout. */
CTPU_API ctpu_tensor ctpu_scaled_dot_product_attention_bthd(ctpu_tensor q, ctpu_tensor k, ctpu_tensor v,
                                                            ctpu_tensor mask, ctpu_mask_kind mask_kind,
                                                            bool is_causal, double scale, double dropout_p);
/* weight [V, D] (f32/bf16), indices i32 of any shape -> [..., D]. An index
 * outside [0, V) is a device fault naming `embedding` and the index, raised
 * at the next sync (strict eager) or at the call (debug eager); its row is 0. */
CTPU_API ctpu_tensor ctpu_embedding(ctpu_tensor weight, ctpu_tensor indices);
/* out[i][j] = a[i][index[i][j]] along dim (torch.gather); index i32 with the
 * same ndim as a; bounds checked on the device like embedding. */
CTPU_API ctpu_tensor ctpu_gather(ctpu_tensor a, int dim, ctpu_tensor index);
/* torch.scatter_add (out of place): a copy of self with, for every position p
 * of index (row-major order), out[.., index[p], ..] += src[p] along dim (in
 * [-ndim, ndim)). self, index (i32) and src have one ndim >= 1; src has
 * self's dtype; index.shape[d] <= src.shape[d] for every d and <=
 * self.shape[d] for d != dim (src's elements beyond index's extents are not
 * used). A primitive. Order (docs/CONTRACTS.md): deterministic, no atomics:
 * f32 / bf16 add into an f32 copy of self in index order, one rounding per
 * addition, and round once to self's dtype at the end (bf16: one rounding,
 * not one per addition as torch); i32 adds wrap. An index outside [0,
 * self.shape[dim]) is a device fault naming scatter_add and the index (at
 * the next sync in strict eager, at the call in debug eager); it adds
 * nothing. Gradient: g for self, gather(g, dim, index) for src (zeros
 * beyond index's extents). Errors: CTPU_ERR_DTYPE (index not i32, src's
 * dtype not self's), CTPU_ERR_SHAPE (ndims, extents, dim), handle errors. */
CTPU_API ctpu_tensor ctpu_scatter_add(ctpu_tensor self, int dim, ctpu_tensor index, ctpu_tensor src);
/* torch.index_add (out of place): out[.., index[i], ..] += alpha * source[.., i, ..]
 * along dim, index i32 [n], source self's shape with extent n at dim, of
 * self's dtype; alpha finite. A composite: index reshaped and expanded to
 * source's shape, then ctpu_scatter_add (so its order: i ascending for each
 * destination, and its fault and gradient); alpha != 1 multiplies source
 * first (ctpu_mul_scalar: one more rounding, as torch's alpha * source).
 * Errors: CTPU_ERR_DTYPE, CTPU_ERR_SHAPE, CTPU_ERR_INVALID_ARG (alpha not
 * finite), handle errors, all naming index_add. */
CTPU_API ctpu_tensor ctpu_index_add(ctpu_tensor self, int dim, ctpu_tensor index, ctpu_tensor source, double alpha);

/* --------------------------------------------------------------- matmul
 * torch.matmul semantics for ndim >= 1 (1-D operands promoted and squeezed,
 * batch dims broadcast). MXU numerics (docs/CONTRACTS.md): operands rounded to
 * bf16 (RNE), exact products, fp32 accumulation in vdpbf16ps pair order,
 * subnormals flushed; precision from ctpu_set_matmul_precision.
 * f32@f32 -> f32; bf16@bf16 -> bf16 (rounded once); mixed -> f32; i32@i32 -> i32 exact.
 * Gradient: dA = dC @ Bᵀ, dB = Aᵀ @ dC; for a [..., M, K] (>= 3-d) times a
 * matrix b, b's gradient is one product over the flattened rows (contraction
 * length batch x M), as torch's matmul folds the batch; other broadcast batch
 * dims: the batched product, summed over them (docs/CONTRACTS.md).
 * Errors: CTPU_ERR_SHAPE ("matmul: a is f32[64,100], b is f32[99,10]: inner dims differ"). */
CTPU_API ctpu_tensor ctpu_matmul(ctpu_tensor a, ctpu_tensor b);
/* Matmul with transposed operands and no materialised transpose: a is used as
 * its transpose over the last two dims when transpose_a (a stored [..., K, M]),
 * b likewise (b stored [..., N, K]); ndim >= 2 for a transposed operand.
 * Otherwise as ctpu_matmul (same numerics, batch broadcasting, dtypes,
 * errors). Used by linear layers (y = x @ Wᵀ) and matmul's backward. */
CTPU_API ctpu_tensor ctpu_matmul_t(ctpu_tensor a, ctpu_tensor b, bool transpose_a, bool transpose_b);

/* ------------------------------------------------------------- metrics */
/* Counter value by name (e.g. "ops_dispatched", "programs_compiled",
 * "cache_requests", "cache_hits", "cache_misses", "syncs", "hbm_bytes_allocated").
 * Unknown names give 0. */
CTPU_API int64_t ctpu_metric_counter(const char *name);
/* Print the metrics report to f (stderr if NULL), as PyTorch/XLA's
 * metrics report: every timer (TotalSamples, Accumulator, Mean,
 * Percentiles in us; "count" distributions such as
 * fused_kernels_per_program without units), then every non-zero counter,
 * then HBM in use / peak and the cache hit rate. */
CTPU_API void ctpu_metrics_report(FILE *f);
/* Zero counters, timers, the per-step history and the run's cost totals
 * (the program cache and its entries stay). */
CTPU_API void ctpu_metrics_clear(void);


/* ============================================================== autograd
 * Reverse mode on a tape (docs/CONTRACTS.md "Scopes, autograd, optimizers").
 * While grad mode is on (the default; see ctpu_no_grad_begin), every op with
 * an input that requires grad records a tape entry holding its own
 * references to what its backward rule needs, so releasing intermediate
 * handles (or ending their scope) never breaks a later backward. The tape of
 * a value is released when backward has run through it (unless
 * retain_graph) or when the last handle depending on it is released (the end
 * of its step scope). Backward ops go through the same dispatcher as forward
 * ops (in defer and fuse they land in the same trace). Gradients are f32/bf16
 * like their leaves; only leaves (tensors marked with ctpu_set_requires_grad)
 * keep a .grad. One thread runs a given graph's backward at a time. */

/* Mark a float leaf as requiring grad (or not: dropping it also drops its
 * .grad). Errors: CTPU_ERR_DTYPE (i32), CTPU_ERR_STATE (turning it off on a
 * non-leaf: use ctpu_detach), handle errors. */
CTPU_API ctpu_status ctpu_set_requires_grad(ctpu_tensor t, bool requires_grad);
/* A leaf marked above, or a value computed from one under grad mode. False
 * (no error) for a null or stale handle. */
CTPU_API bool ctpu_requires_grad(ctpu_tensor t);
/* Backward from a one-element loss (gradient 1), releasing the tape.
 * Same as ctpu_backward_ex(loss, CTPU_NULL, false). */
CTPU_API ctpu_status ctpu_backward(ctpu_tensor loss);
/* Backward from t with upstream gradient grad (t's shape; f32 or bf16, cast
 * to t's dtype), or 1 when grad is null (t must have one element). Leaf
 * gradients accumulate into .grad (added when one exists). retain_graph
 * keeps the tape for another backward. Errors: CTPU_ERR_STATE (t does not
 * require grad; the tape was released by an earlier backward), CTPU_ERR_SHAPE
 * (grad's shape, or a non-scalar t without grad), CTPU_ERR_DTYPE, and the
 * errors of the backward ops. */
CTPU_API ctpu_status ctpu_backward_ex(ctpu_tensor t, ctpu_tensor grad, bool retain_graph);
/* ctpu_backward_ex(t, grad, false). */
CTPU_API ctpu_status ctpu_backward_with(ctpu_tensor t, ctpu_tensor grad);
/* The accumulated .grad of a leaf (same shape and dtype), or a null handle
 * with no error when it has none (never backpropagated, after
 * ctpu_zero_grad, or t is not a leaf). The handle is owned by t: it lives in
 * no scope, stays the same across accumulations, and is released by
 * ctpu_zero_grad or with t. ctpu_release on it is CTPU_ERR_STATE (the
 * message points to ctpu_zero_grad), and the .grad stays. */
CTPU_API ctpu_tensor ctpu_grad(ctpu_tensor t);
/* Drop t's .grad (set-to-none, as PyTorch's zero_grad(set_to_none=True)):
 * the next backward creates it afresh, so every step records the same ops. */
CTPU_API ctpu_status ctpu_zero_grad(ctpu_tensor t);
/* A hook called when a leaf's gradient is final in a backward, as PyTorch's
 * register_post_accumulate_grad_hook: right after this backward added its
 * last contribution to the leaf's .grad, from inside the backward, on its
 * thread, under no_grad, with the ops of the backward still to come not yet
 * dispatched (in defer and fuse: later in the same trace). fn may dispatch
 * ops (ctpu_grad(leaf) is the final .grad; handles it makes belong to the
 * backward's scope unless kept) and start collectives (ctpu_all_reduce_async:
 * DDP overlaps the gradient reduction with the rest of the backward this
 * way). One hook per leaf (a second call replaces it; fn NULL removes it).
 * The same bits as without a hook: with one, the backward writes each hooked
 * leaf's .grad as soon as its last contribution is in, instead of at its end.
 * fn is a callback ("Callbacks" below ctpu_call_pop): a hook that leaves a
 * scope, no-grad region, label or call scope open, pops one it did not
 * open, or calls ctpu_shutdown makes the backward fail with CTPU_ERR_STATE
 * (its stacks restored; the .grad written before it stays).
 * Errors: CTPU_ERR_STATE (t is not a leaf that requires grad), handle errors. */
typedef void (*ctpu_grad_hook)(ctpu_tensor leaf, void *ctx);
CTPU_API ctpu_status ctpu_register_post_accumulate_grad_hook(ctpu_tensor t, ctpu_grad_hook fn, void *ctx);
/* No-grad regions (per thread, nest): ops record nothing. end without begin:
 * CTPU_ERR_STATE (inside a callback: without a begin of its own, e.g. a
 * grad hook ending backward's region; "Callbacks" below ctpu_call_pop).
 * Optimizer updates run in one. */
CTPU_API ctpu_status ctpu_no_grad_begin(void);
CTPU_API ctpu_status ctpu_no_grad_end(void);
CTPU_API bool ctpu_grad_enabled(void);
/* A new handle (current scope) on t's value that requires no grad. */
CTPU_API ctpu_tensor ctpu_detach(ctpu_tensor t);

/* ------------------------------------------------- defer and fuse: the cache
 * In defer and fuse, each cut trace is keyed by its canonical encoding (ops,
 * attrs, dtypes, extents, wiring, aliasing, live-out; never host scalars) and
 * looked up in a bounded LRU cache (TORCH_TPU_CACHE_SIZE entries). A miss
 * whose structure matches a cached program is a recompile, recorded with the
 * dim that changed ("input 0 dim 0: 128 -> 96"). */
typedef struct {
    uint64_t requests, hits, misses, compiles;
    uint64_t recompiles;   /* misses whose structure (the key without extents) was cached */
    uint64_t evictions;    /* programs dropped by the LRU bound */
    uint64_t thrash;       /* keys compiled again after their eviction */
    uint64_t entries, capacity;
} ctpu_cache_info;
/* Fused-program cache counters. Errors: CTPU_ERR_INVALID_ARG (out NULL). */
CTPU_API ctpu_status ctpu_cache_get_info(ctpu_cache_info *out);
/* Cache-only mode: from now on a fused-cache miss is CTPU_ERR_CACHE_MISS at
 * the cut (mark_step, host read) instead of a compile; the trace's values
 * carry the error. TORCH_TPU_CACHE_ONLY=N turns it on after N marked steps. */
CTPU_API ctpu_status ctpu_cache_set_only(bool on);
/* The recent recompiles (up to 64), one line each, oldest first:
 * "step 469: program 2 -> 3: input 0 dim 0: 128 -> 96" (a named input
 * shows its name: "input 0 (batch.x) dim 0: ..."). Also listed (not counted
 * as recompiles): structure changes between consecutive steps, when a step
 * compiles a new program one of whose inputs the previous step's program
 * computed, e.g. an accumulator made between steps that the first step's
 * program folded in: "step 1: program 2 -> 3: input 0 (acc) was computed by
 * full in step 0, now a device buffer". Writes at most len bytes
 * (NUL-terminated); returns the number of lines. */
CTPU_API int ctpu_cache_recompile_log(char *buf, size_t len);

/* ------------------------------------------------- compiled steps
 * The fourth TorchTPU mode, torch.compile's: a step function is captured
 * once and replayed with no per-op host work. The first ctpu_compiled_call
 * (and any call whose guards fail) runs fn in capture mode: every op it
 * makes (forward, backward, the optimizer's update, assigns) is recorded
 * into one trace, whatever the thread's mode, and compiled whole by the
 * defer-and-fuse compiler into a program of the fused-program cache. Later
 * calls check the guards and launch that program with the new inputs and
 * scalars: fn does not run, and nothing is recorded or keyed.
 *
 * What a replay reads and writes:
 * - in[i]: bound by position each call (guard: the same dtype, whether it
 *   requires grad and is a leaf, and exact shape as at the capture; and
 *   the grad mode, as torch.compile guards them; inputs that share storage
 *   (views of one tensor) share it as at the capture, each at the same byte
 *   offset from the first; except dims in[i] had marked with
 *   ctpu_mark_dynamic at the capture: guarded by their range. A call at a
 *   new in-range extent records fn once more and binds the one dynamic
 *   program at it, no compile (ctpu_compiled_info.dynamic_captures, not a
 *   guard failure); later calls at that extent replay; an extent out of
 *   range is a guard failure, "input 0 dim 0 = 300 outside dynamic range
 *   [2, 256]". A dynamic extent is c x s: an extent fn derives otherwise
 *   (a slice to B - 1 or B / 2) is static in the trace, so a capture at a
 *   new extent compiles its own program instead of binding: a guard
 *   failure, counted toward the recompile limit, whose reason reads "input
 *   0 dim 0: 5 -> 6 in the dynamic range, but fn's trace specialises it"
 *   with the cache's own reason, as torch.compile recompiles when a guard
 *   specialises a symbol). An in[i] that is a leaf requiring grad (a new
 *   batch tensor each step, ctpu_set_requires_grad) gets its .grad by
 *   position too: after the call ctpu_grad(in[i]) is what strict eager
 *   gives, accumulated into the .grad in[i] had, whichever tensor is passed
 *   (a new one each call replays); guarded per position: whether in[i] has
 *   a .grad (as at the capture: "input 0 has no .grad now, one at the
 *   capture"), and which leaf inputs are one tensor (x as in[0] and in[1]).
 *   An in[i] fn assigns (ctpu_assign while a view of it is alive, or a
 *   write it does not read) is written by position too: after the call
 *   in[i] holds the new value, whichever tensor is passed, and the tensors
 *   passed before keep theirs, as torch.compile's input mutation applies
 *   to the tensor passed that call (guard: which inputs are one handle).
 *   A non-leaf in[i] (computed before the call from tensors that require
 *   grad, in[0] = a * f) whose history fn's backward runs through: the
 *   capture bakes that history (its ops, scalars, saved values, leaves:
 *   f, and a.grad is a's), so the guard is that history's identity
 *   (torch.compile's compiled backward hands the input's gradient to the
 *   outside graph instead; ctpu does not split fn's backward there). A
 *   call with another history (in[0] made anew each call, another
 *   f or a) recaptures ("input 0: a non-leaf whose autograd history is not
 *   the capture's"): such a step captures every call up to the recompile
 *   limit, then runs fn in the current mode every call; to replay, pass
 *   the leaf (or a detached value) and compute in[0] inside fn. The same
 *   history each call replays (fn's backward retains it); a history a
 *   backward released since fails the guard, and a capture whose backward
 *   released history made before the call (no retain_graph) replays no
 *   call: the next recaptures and fails as eager's backward does.
 *   Not guarded: an in[i] that fn also reads through ctx (a parameter
 *   passed as in[0] and read as ctx->w, or a view of its storage) is one
 *   tensor in the capture, bound as in[i]: a later call with another
 *   in[0] reads that one in both places (torch.compile tells the two apart
 *   by their source and guards them as duplicates; a capture cannot see
 *   how fn reached a tensor). Pass such a tensor one way only.
 * - scalars[i]: runtime arguments of the program. A recorded *_scalar
 *   operand, creation value or clamp bound whose value equals scalars[i]
 *   bit for bit reads argument i at every call (the lowest such i; so give
 *   distinct values distinct slots). A value fn computes on the host from
 *   a scalar (scalars[0] * 0.5) is a new double and is baked in: pass it as
 *   its own scalar. An integer operand (ctpu_add_scalar_int and the other
 *   *_scalar_int forms, ctpu_clamp_int) equal to trunc(scalars[i]) reads
 *   trunc(scalars[i]) at every call, as C's (int64_t) cast gives (fn
 *   rounding another way is a host computation: baked).
 * - tensors made before the call (parameters, optimizer state, their
 *   .grad; not an input leaf's .grad, above): read and assigned through
 *   their handles, so eager and compiled calls mix on the same tensors
 *   (guard: each handle still live, and requiring grad or not, as a leaf
 *   or not, as at the capture: a parameter frozen or unfrozen since is a
 *   guard failure, as torch.compile guards a parameter's requires_grad).
 *   A .grad of such a tensor is its leaf's .grad at each call, so a step
 *   that only runs the optimizer (zero_grad and backward outside it: a
 *   new .grad handle each step) replays; whether each leaf fn asks
 *   ctpu_grad of has a .grad is a guard (an optimizer skips a parameter
 *   without one), as torch.compile guards a grad being None; so is the
 *   autograd kind of each such tensor fn asks ctpu_requires_grad of.
 * - random ops draw from the global generator at every replay, as fn would.
 * - any other host state fn reads (globals, fields of ctx, a branch on a
 *   step counter, an optimizer's host-side lr or step count) is baked into
 *   the capture, as torch.compile specialises Python values.
 * - out[j]: fn's results, new handles in the caller's scope at each call
 *   (detached: the step's backward is inside fn); an input or a tensor
 *   made before the call that fn returns stays in its own scope; an error
 *   handle fn got from a failed op and returned is returned (that call runs
 *   as defer and fuse and is not captured; a later call captures). An input fn returns is
 *   that call's in[i]; a .grad backward made that fn returns
 *   (ctpu_grad(W), ctpu_grad(in[0])) is the leaf's .grad after the call,
 *   set by each replay, as eager returns it; a view fn makes without an op
 *   (detach, reshape, transpose) of an input or of a tensor made before the
 *   call is made anew on that call's storage, as torch.compile regenerates
 *   output views; host data fn makes (ctpu_from_host inside fn) is baked,
 *   each call returning a new handle on it (an assign to one copies); a
 *   tensor fn makes and then assigns is that call's value, a new tensor
 *   each call.
 * A graph break (a host read such as ctpu_item or ctpu_to_host, a mode
 * change, a collective such as ctpu_all_reduce, a nested
 * ctpu_compiled_call of another step inside fn, a ctpu_sync, ctpu_mark_step or
 * ctpu_step_end inside fn, a capture past 1,000,000 ops, and host effects a
 * replay would not repeat: ctpu_manual_seed, ctpu_rng_set_state or
 * ctpu_rng_get_state, a ctpu_release of a tensor made before the call, an
 * assign with grad mode on that gives such a tensor an autograd history, a
 * ctpu_set_requires_grad that changes such a tensor)
 * makes that
 * call run as defer and fuse around it and is reported with its op number
 * and label as faults are (ops numbered from 1 within each call in dispatch
 * order, the innermost ctpu_label_push label: 'graph break (at op #4,
 * "read"): host read (item) of f32[]'); a compiled step that broke runs
 * every later call that way. With opts->fullgraph it is an error instead,
 * raised before the op that breaks runs (nothing of the call ran: assigned
 * tensors and the generator are as before). A capture longer than defer and
 * fuse's trace-length cut (20,000 ops) is still one program. Guard failures recapture, up to
 * the recompile limit (8 versions, the first capture included; a recapture whose fn returned an error does not
 * count, as a failed compile adds no torch.compile cache entry, and its error
 * names the failed guard before fn's); past it, a call at a shape already captured still
 * replays and only an unseen shape runs fn in the current mode.
 * A capture that records no device op (fn returns inputs or views, or does
 * host work only) is skipped, as torch.compile skips such a frame: every
 * call runs fn in the current mode (the report's reason: "fn recorded no
 * device op").
 * A step whose fn assigns in place into an input's storage it read
 * (ctpu_assign of in[i] where nothing else shares it) is not replayable: that call and
 * every later one run as defer and fuse (the report's reason: "in[0]'s
 * storage is assigned by the step"); assign a tensor made before the call.
 * A step whose fn keeps a tensor it made outside the step (in ctx: the
 * state of an optimizer fn creates at its first call) is not replayable
 * for that call, which runs as defer and fuse; the next call captures
 * again (the state is a tensor made before it, as torch.compile recompiles
 * once the state exists), and a second such failure is final (the
 * report's reason: "a tensor made in the step outlives it and is not an
 * output").
 * TORCH_COMPILE_DISABLE=1 makes every call run fn in the current mode.
 * Results are bit-identical to running fn in strict eager. A device fault in
 * a replay (an index out of range) is reported as the capture's ops made it:
 * the op (or the library call, ctpu_call_push: "cross_entropy", not its
 * gather), its number in the call and its label. */
typedef struct ctpu_compiled ctpu_compiled;
/* A step: reads in[0..n_in) and scalars[0..n_scalars), writes out[0..n_out)
 * (every slot NULL-initialised by the caller of fn). Returns CTPU_OK or the
 * error of the op that failed. */
typedef ctpu_status (*ctpu_step_fn)(void *ctx, const ctpu_tensor *in, const double *scalars, ctpu_tensor *out);
typedef struct {
    const char *name;      /* the report row's label, copied (up to 63 bytes); NULL: "step <n>" */
    bool fullgraph;        /* a graph break is an error (torch.compile fullgraph=True) */
} ctpu_compile_opts;
/* A compiled step for fn (opts may be NULL: no name, fullgraph off). Nothing
 * is captured until the first call. NULL with CTPU_ERR_INVALID_ARG (fn
 * NULL), CTPU_ERR_NOT_INITIALIZED or CTPU_ERR_OOM. Freed by
 * ctpu_compiled_free, or with the runtime at ctpu_shutdown (a call after
 * that is CTPU_ERR_NOT_INITIALIZED, or CTPU_ERR_STATE once ctpu_init made a
 * new runtime). */
CTPU_API ctpu_compiled *ctpu_compile(ctpu_step_fn fn, void *ctx, const ctpu_compile_opts *opts);
/* Run the step: capture and compile (first call, guard failure) or replay.
 * n_in tensors in (0..4096), n_scalars doubles (0..4096), n_out slots out
 * (0..4096; each set to a new handle, or CTPU_NULL on error). Errors:
 * CTPU_ERR_INVALID_ARG (c NULL or freed, a count out of range, a NULL array
 * with a count > 0), handle errors on in[i], fn's own error (its ops'),
 * CTPU_ERR_STATE (a graph break under fullgraph: nothing changed; c from a
 * previous runtime; another thread is inside a call of c: one call at a
 * time per compiled step, so compile one step per thread; c called from
 * inside its own call, by its fn or a step its fn calls: a recursion; fn
 * mis-nested a scope, no-grad region, label or call scope, or called
 * ctpu_shutdown: "Callbacks" below ctpu_call_pop),
 * CTPU_ERR_OOM. A pending trace of this thread (defer
 * and fuse) is cut first. out may be the in array (or overlap it): the call
 * reads its inputs first, then writes every out[j]. */
CTPU_API ctpu_status ctpu_compiled_call(ctpu_compiled *c, int n_in, const ctpu_tensor *in, int n_scalars,
                                        const double *scalars, int n_out, ctpu_tensor *out);
/* What a compiled step did so far. host_ns: wall time (CLOCK_MONOTONIC) the
 * calling threads spent in its calls, captures included (a replay does not
 * wait for the device, so this is its host work); replay_host_ns: the part
 * spent in calls that replayed. The metrics JSON ("compiled_steps") and the
 * cache report give one row per compiled step with these counts, the host
 * time per call and per replay, and its last 8 guard failures, graph breaks
 * and fallbacks with their reasons (freed steps included, up to 64). */
typedef struct {
    uint64_t calls, captures, replays, guard_failures, graph_breaks, eager_calls;
    uint64_t host_ns, replay_host_ns;
    uint64_t dynamic_captures;   /* captures at a new in-range extent of a ctpu_mark_dynamic input (binds, no compile) */
    char last_reason[192];   /* the last guard failure or graph break, "" if none */
} ctpu_compiled_info;
/* Errors: CTPU_ERR_INVALID_ARG (c or out NULL). */
CTPU_API ctpu_status ctpu_compiled_get_info(const ctpu_compiled *c, ctpu_compiled_info *out);
/* True while this thread runs a compiled step's fn in capture mode (as
 * torch.compiler.is_compiling()): libraries use it to refuse host state a
 * replay would not see. */
CTPU_API bool ctpu_is_compiling(void);
/* Free a compiled step (NULL: no-op). Its programs stay in the cache.
 * Refused while a call of c runs (from c's own fn, or on another thread):
 * CTPU_ERR_STATE ("ctpu_compiled_free: compiled step ... is inside a
 * call"), c stays valid; free it after the call returns. */
CTPU_API void ctpu_compiled_free(ctpu_compiled *c);


/* ============================================================== reports
 * Observability (docs/DESIGN.md "Observability"): the metrics registry, the
 * compile-cache report, a Perfetto/Chrome trace and a TPU cost estimate.
 *
 * At ctpu_shutdown: TORCH_TPU_METRICS_FILE=path writes ctpu_metrics_json()
 * to path; TORCH_TPU_TRACE_FILE=path writes the trace (TORCH_TPU_TRACE_EVENTS
 * events at most; device slices carry the report's program ids); without a metrics
 * file, one line on stderr gives the compile-cache totals (requests, hits
 * and hit rate, compiles, compile time) when anything was compiled;
 * CTPU_QUIET=1 silences it. tools/ctpu-report renders metrics files. */

/* The metrics as a JSON document (counters, timers with percentiles, HBM,
 * cache and per-program figures, recompiles, trace cuts, host reads,
 * matmul shapes, per-op and per-run cost estimates, the per-step history).
 * Returns a string allocated with malloc: the caller frees it with free().
 * NULL with CTPU_ERR_NOT_INITIALIZED or CTPU_ERR_OOM. */
CTPU_API char *ctpu_metrics_json(void);
/* Write ctpu_metrics_json() to path. Errors: CTPU_ERR_INVALID_ARG (NULL
 * path), CTPU_ERR_IO (the message names the file and the reason). */
CTPU_API ctpu_status ctpu_metrics_write(const char *path);

/* The compile-cache report and the cost table of this run, as text, to f
 * (stdout if NULL): hit rate overall and per program (first ops, input
 * shapes), compiles, recompiles with the dim that changed and the step,
 * trace cuts by reason, host reads by label, evictions and thrash, warm-up
 * steps, advice lines, matmul MXU utilisation, estimated device time, MFU
 * and cost per chip. Same text as `ctpu-report` on the metrics file; a run
 * that made collectives adds ctpu_dist_report's lines (live runs only). */
CTPU_API ctpu_status ctpu_cache_report(FILE *f);

/* Op provenance. Each thread numbers its ops from 1 within each step, in
 * dispatch order (ctpu_mark_step and ctpu_step_end restart the count;
 * tensors made from host data are not numbered, host reads are), and keeps
 * a stack of region labels. Device faults, debug-check errors, recompile
 * reasons and trace events name both: "embedding (op #1, \"embed\"): index
 * 57 >= 50 (dim 0) of weight f32[50,8], raised at item (op #4)"; a
 * recompile reason names the op reading the input that changed ("input 0
 * (op #3, \"block1.attn\"): dim 0: 128 -> 10"); a trace cut event where it
 * cut ("trace cut: host_read at op #4, \"eval\""); a device slice its
 * first and last ops (args first_op, first_label, last_op, last_label); an
 * out-of-HBM error in defer and fuse the op whose value did not fit; the
 * leak lines the region of the ops holding the most; the recompile-limit
 * warning the label its structure starts in. On a cache
 * hit they come from the step that runs, never from the one that compiled.
 * ctpu_label_push names the region of the user's code that follows
 * ("block2.attn"; copied and interned: at most 4096 distinct labels per
 * runtime), until the matching ctpu_label_pop; labels nest at most 32 deep
 * (the innermost names an op). A gradient rule's ops carry "backward of
 * <op>". Errors: CTPU_ERR_NOT_INITIALIZED; CTPU_ERR_INVALID_ARG (NULL or ""
 * label, more than 63 bytes, a control character, or the 4097th distinct
 * label); CTPU_ERR_STATE (the 33rd nested label, likely a missing
 * ctpu_label_pop; a pop with no label open). */
CTPU_API ctpu_status ctpu_label_push(const char *label);
CTPU_API ctpu_status ctpu_label_pop(void);
/* Call scope, for libraries built on this API whose functions index with a
 * user's argument (src/nn's losses): until the matching ctpu_call_pop, a
 * device index fault of an op this thread dispatches is reported as call's,
 * its index as argument arg, in every mode: "nll_loss (op #5): target 7 at
 * position 1 is out of range [0, 5) (1 bad index)", not as the gather the
 * library made. Scopes nest at most 8 deep; the outermost names the fault
 * (the user's call). call and arg: 1 to 31 bytes, no control character.
 * Call names are interned in 1024 slots of their own, so a program that
 * used all 4096 labels keeps them. Errors: CTPU_ERR_NOT_INITIALIZED;
 * CTPU_ERR_INVALID_ARG; CTPU_ERR_STATE (the 9th nested scope; a pop with
 * no scope open; more than 1024 distinct call/arg pairs). */
CTPU_API ctpu_status ctpu_call_push(const char *call, const char *arg);
CTPU_API ctpu_status ctpu_call_pop(void);

/* Callbacks. ctpu calls back into user code in two places: a compiled
 * step's fn (ctpu_compiled_call) and a grad hook
 * (ctpu_register_post_accumulate_grad_hook, inside ctpu_backward). Inside
 * one (docs/CONTRACTS.md "Callbacks"):
 * - ctpu_shutdown is refused (CTPU_ERR_STATE, nothing changes), and so is
 *   ctpu_compiled_free of the step whose call is running;
 * - the per-thread stacks (scopes and step scopes, no-grad regions,
 *   ctpu_label_push labels, ctpu_call_push call scopes) have a floor at
 *   their depth on entry: a pop the callback did not push (scope_end,
 *   step_end, no_grad_end, label_pop, call_pop) is refused with
 *   CTPU_ERR_STATE naming it ("scope_end: inside a compiled step's fn, no
 *   scope of its own is open ..."), and what it leaves open is closed when
 *   it returns (a scope's handles released, no trace cut);
 * - a refused ctpu_shutdown, a refused pop or a stack left open makes the
 *   call that ran the callback (ctpu_compiled_call, ctpu_backward) fail
 *   with CTPU_ERR_STATE, unless fn returned an error of its own: that
 *   error is returned (the stacks are restored all the same). So after the
 *   call the stacks are as they were before it, whatever the callback did.
 *   A refused ctpu_compiled_free only sets the error (the step stays valid,
 *   nothing is lost) and the call goes on.
 * At top level a pop with nothing open is CTPU_ERR_STATE, never an
 * underflow. Callbacks nest (a hook inside a backward inside a fn). */

/* A call-site label for this thread's host reads (ctpu_to_host, ctpu_item)
 * from now on, e.g. "loss.item"; the cache report counts reads and the
 * trace cuts they cause per label. NULL or "" clears it. Copied (up to 63
 * bytes). Errors: CTPU_ERR_NOT_INITIALIZED. */
CTPU_API ctpu_status ctpu_set_host_read_label(const char *label);

/* Steps per epoch, for the per-epoch figures of the cost table (default:
 * the whole run is one epoch). Errors: CTPU_ERR_INVALID_ARG (n < 0; 0
 * restores the default), CTPU_ERR_NOT_INITIALIZED. */
CTPU_API ctpu_status ctpu_set_steps_per_epoch(int64_t n);

/* A roofline ESTIMATE of device time (not a measurement). Formula:
 *   mxu_s    = 2 * padded MACs * passes / peak_bf16_flops, each of M, N, K
 *              rounded up to a multiple of the MXU side (128 or 256);
 *              passes 1/3/6 for precision default/high/highest
 *   vector_s = vector ops / (peak_bf16_flops / 32): 1 op per element for
 *              simple elementwise ops, 8 for transcendentals and division,
 *              1 per input element for reductions, 12 for softmax
 *   hbm_s    = bytes read and written at the program's boundary /
 *              (hbm_gbps * 1e9)
 *   total_s  = max(mxu_s, vector_s, hbm_s)
 * The VPU rate (1/32 of the MXU peak) is an assumption. */
typedef struct {
    double mxu_s, vector_s, hbm_s, total_s;  /* seconds */
    double flops;             /* useful matmul FLOPs (2 per MAC) */
    double vector_ops;        /* vector-unit operations */
    double hbm_bytes;         /* bytes moved to and from HBM */
    double macs_useful;       /* batch * M * N * K */
    double macs_padded;       /* with M, N, K padded to the MXU side */
    double mxu_utilization;   /* macs_useful / macs_padded; 0 without matmul */
} ctpu_cost_estimate;

/* Estimate one matmul [batch x] [m,k] x [k,n] -> [m,n] on a chip profile
 * ("v5e", "v5p", "v6e", "7x"), operands and result of dtype dt read from and
 * written to HBM once, at precision p. Example: 256x256x256 bf16 on v5e:
 * mxu_s = 2*256^3/197e12 = 0.170 us, hbm_s = 3*256*256*2 B / 819 GB/s =
 * 0.480 us, total 0.480 us. Errors: CTPU_ERR_INVALID_ARG (unknown chip,
 * negative extent, bad dtype or precision, NULL out). No init needed. */
CTPU_API ctpu_status ctpu_cost_matmul(const char *chip, int64_t batch, int64_t m, int64_t k, int64_t n, ctpu_dtype dt,
                                      ctpu_precision p, ctpu_cost_estimate *out);

#define CTPU_COST_MAX_CHIPS 8
/* The run on one chip profile, from the per-op / per-program estimates of
 * every program launched so far (all modes). */
typedef struct {
    const char *chip;          /* profile name */
    int mxu_size;              /* MXU side */
    bool price_known;          /* false: no public price for the plan (every profile has one today) */
    double usd_per_chip_hour;  /* list price of the table's plan, USD; 0 if unknown */
    const char *price_region;  /* the region that price is quoted for */
    double run_s;              /* estimated device seconds for the run */
    double step_s, epoch_s;    /* per step and per epoch, seconds */
    double mfu;                /* model FLOPs / (run_s * peak_bf16_flops), in [0,1] */
    double mxu_utilization;    /* useful / padded MACs on this chip's MXU */
    double usd_run, usd_epoch; /* one chip; -1 when the price is unknown */
} ctpu_cost_row;

typedef struct {
    int n_rows;                /* one per chip profile */
    ctpu_cost_row rows[CTPU_COST_MAX_CHIPS];
    int current;               /* the row of the emulated chip */
    uint64_t steps;            /* marked steps so far (per-step figures divide by max(1, steps)) */
    uint64_t steps_per_epoch;  /* ctpu_set_steps_per_epoch, else steps */
    double model_flops;        /* useful matmul FLOPs of the run */
    double hbm_bytes;          /* estimated HBM traffic of the run on the current chip, bytes */
    double vector_ops;
    ctpu_price_plan plan;      /* the plan the $ columns use (TORCH_TPU_PRICE_PLAN) */
} ctpu_cost_table;

/* The cost table of the run so far. Errors: CTPU_ERR_NOT_INITIALIZED,
 * CTPU_ERR_INVALID_ARG (out NULL). */
CTPU_API ctpu_status ctpu_cost_table_get(ctpu_cost_table *out);
/* Print a cost table (labelled as an estimate) to f (stdout if NULL).
 * Errors: CTPU_ERR_INVALID_ARG (t NULL or n_rows out of range). */
CTPU_API ctpu_status ctpu_cost_table_print(const ctpu_cost_table *t, FILE *f);

/* Rendering of metrics JSON documents (what tools/ctpu-report prints). No
 * init needed. Errors: CTPU_ERR_INVALID_ARG (NULL or bad format),
 * CTPU_ERR_IO (not JSON, truncated, or not a ctpu metrics document: the
 * message says which and where). */
typedef enum { CTPU_REPORT_TEXT = 0, CTPU_REPORT_MARKDOWN = 1, CTPU_REPORT_JSON = 2, CTPU_REPORT_FORMAT_COUNT }
    ctpu_report_format;
/* The cache report and cost table of one run; name labels it (may be NULL). */
CTPU_API ctpu_status ctpu_report_render(const char *json, const char *name, ctpu_report_format fmt, FILE *f);
/* Two runs side by side (e.g. strict vs fused): counters, hit rates,
 * compile and execute time, estimated device time, MFU and cost. */
CTPU_API ctpu_status ctpu_report_compare(const char *json_a, const char *name_a, const char *json_b, const char *name_b,
                                         ctpu_report_format fmt, FILE *f);
/* An SVG plot of compiles (cumulative) and cache hits per step for n >= 1
 * runs (from their per-step history). */
CTPU_API ctpu_status ctpu_report_plot_svg(int n, const char *const *jsons, const char *const *names, FILE *f);

/* ========================================================== checkpoints
 * Tensors to and from safetensors files (the Hugging Face format,
 * github.com/huggingface/safetensors, readable by its Python package and by
 * bench/check_safetensors.py):
 *
 *   8 bytes   N, the header length, unsigned little-endian
 *   N bytes   a JSON object: each tensor name -> {"dtype": "F32" | "BF16" |
 *             "I32", "shape": [extents...], "data_offsets": [begin, end]},
 *             plus an optional "__metadata__": {string: string}; written
 *             padded with spaces so the data starts 8-byte aligned
 *   the rest  the data section: each tensor's elements, row-major,
 *             little-endian (BF16 as its 16-bit patterns), at
 *             [begin, end) from the start of the section
 *
 * Writing (ctpu_save, ctpu_save_ex): the header is written, then each tensor
 * is read from the device (waiting for it; in defer and fuse a host read)
 * into a temporary file beside path ("<path>.tmp.<pid>.<n>"), which is
 * fsync'd and renamed onto path (then the directory is fsync'd): a crash or
 * an error leaves the old file (or none) in place, never half a file, and no
 * temporary file behind. 4-byte tensors come first in the data section (then
 * BF16), each in the order given.
 *
 * Reading checks the whole header before anything is used, as the reference
 * reader does: a header length above 100,000,000 bytes (the reference
 * implementation's limit) or past the end of the file, a header that is
 * not well-formed UTF-8, malformed JSON or
 * trailing bytes other than spaces after it, an entry without dtype / shape
 * / data_offsets, an unknown dtype string, more than 8 dims, a size that
 * does not match dtype x shape, offsets that overlap, leave a hole or do not
 * end exactly at the end of the file (truncated or trailing bytes), a name
 * given twice, a non-string metadata value: each is CTPU_ERR_IO with one line
 * naming the op, the file and the tensor. The format's other dtypes (F16,
 * F64, I64, U8, BOOL, ...) are listed but ctpu cannot make tensors of them
 * (CTPU_ERR_DTYPE when asked to). A bad file never crashes a reader. */

/* Write n tensors (f32, bf16, i32; any shape, zero-size and 0-d included)
 * under distinct names to path. Errors: CTPU_ERR_NOT_INITIALIZED,
 * CTPU_ERR_INVALID_ARG (NULL path / names, a NULL or repeated name, a name
 * that is not valid UTF-8, "__metadata__" as a name), handle errors naming the tensor, a device error
 * latched on a tensor (its message, prefixed by the file and the tensor),
 * CTPU_ERR_IO (the temporary file cannot be made or written, fsync or
 * rename fails: the message names the file and strerror). */
CTPU_API ctpu_status ctpu_save(const char *path, int n, const char *const *names, const ctpu_tensor *tensors);
/* ctpu_save with n_meta metadata pairs: meta[2i] is a key, meta[2i+1] its
 * value (NUL-terminated strings; distinct keys), written as "__metadata__".
 * Errors: those of ctpu_save, CTPU_ERR_INVALID_ARG for a NULL or repeated key,
 * a NULL value, a key or value that is not valid UTF-8. */
CTPU_API ctpu_status ctpu_save_ex(const char *path, int n, const char *const *names, const ctpu_tensor *tensors,
                                  int n_meta, const char *const *meta);
/* Load the tensors called names[i] from path into tensors[i], which must
 * exist with the file's dtype and shape (as ctpu_assign, under no_grad: the
 * destination keeps its handle and takes the value; a leaf that requires
 * grad stays one, as torch's load_state_dict). The file may hold other tensors
 * too. Every destination is checked against the header and every byte is
 * read (into new device tensors: the destinations' size again in HBM, plus
 * a host buffer of the largest tensor) before any tensor is written, so on
 * an error no tensor has changed (short of running out of device memory in
 * the copies themselves). Ends with ctpu_sync (in defer and fuse the writes
 * are a trace of their own).
 * Errors: CTPU_ERR_NOT_INITIALIZED, CTPU_ERR_INVALID_ARG (NULL arguments; a
 * name not in the file: "load: ck.safetensors: tensor 'fc1.weight' is not in
 * the file (4 tensors)"), handle errors, CTPU_ERR_DTYPE / CTPU_ERR_SHAPE
 * ("tensor 'b' is F32[10] in the file but the destination is f32[12]";
 * also a dtype ctpu lacks), CTPU_ERR_IO (a bad file, as above). */
CTPU_API ctpu_status ctpu_load(const char *path, int n, const char *const *names, const ctpu_tensor *tensors);

/* An open safetensors file: its header checked (as above), its tensors
 * listed, read on demand. Needs no ctpu_init (only making tensors does). */
typedef struct ctpu_safetensors ctpu_safetensors;
typedef struct {
    const char *name;
    const char *dtype_name;    /* as in the file: "F32", "BF16", "I32", "F16", "I64", ... */
    ctpu_dtype dtype;          /* CTPU_DTYPE_COUNT for a dtype ctpu has not */
    int ndim;                  /* 0 for a scalar */
    int64_t shape[CTPU_MAX_DIMS];
    uint64_t offset, nbytes;   /* bytes, from the start of the data section */
} ctpu_safetensors_entry;
/* Open and check path. NULL with CTPU_ERR_INVALID_ARG (NULL path),
 * CTPU_ERR_IO (cannot open, not a regular file, a bad file: the message
 * names the file and the tensor), CTPU_ERR_OOM. */
CTPU_API ctpu_safetensors *ctpu_safetensors_open(const char *path);
/* The entries in header order (*n of them); valid until close. NULL with
 * *n = 0 and CTPU_ERR_INVALID_ARG for a NULL argument. */
CTPU_API const ctpu_safetensors_entry *ctpu_safetensors_entries(const ctpu_safetensors *f, int *n);
/* The index of name among the entries, or -1 (no error set) if absent. */
CTPU_API int ctpu_safetensors_find(const ctpu_safetensors *f, const char *name);
/* A new tensor (current scope) holding the file's tensor name. Null handle
 * with CTPU_ERR_INVALID_ARG (absent name), CTPU_ERR_DTYPE (a dtype ctpu
 * has not), CTPU_ERR_IO (the read fails: the file changed), CTPU_ERR_OOM,
 * CTPU_ERR_NOT_INITIALIZED. */
CTPU_API ctpu_tensor ctpu_safetensors_tensor(const ctpu_safetensors *f, const char *name);
/* ctpu_load from an open file (same checks, same all-or-nothing rule). */
CTPU_API ctpu_status ctpu_safetensors_load(const ctpu_safetensors *f, int n, const char *const *names,
                                           const ctpu_tensor *tensors);
/* Metadata: the value of key (NULL if absent or f NULL; valid until close),
 * the number of pairs, and pair i in header order (CTPU_ERR_INVALID_ARG for
 * a NULL argument or i out of range). */
CTPU_API const char *ctpu_safetensors_metadata(const ctpu_safetensors *f, const char *key);
CTPU_API int ctpu_safetensors_metadata_count(const ctpu_safetensors *f);
CTPU_API ctpu_status ctpu_safetensors_metadata_at(const ctpu_safetensors *f, int i, const char **key,
                                                  const char **value);
/* Close the file and free the listing (NULL is fine). */
CTPU_API void ctpu_safetensors_close(ctpu_safetensors *f);


/* ========================================================== distributed
 * Data parallel over MPI (Open MPI; docs/DESIGN.md "Distributed"). Each
 * process is one emulated chip (a rank) with its own HBM and kernel
 * threads; `mpirun -np N prog` starts N of them. ctpu.h never includes
 * mpi.h: a ctpu built without MPI (meson -Dmpi=disabled) still has every
 * call below, with a world of one rank.
 *
 * Collectives are ops: in strict and debug eager each runs when dispatched
 * (on the device stream, in order with the ops before it); in defer and
 * fuse it is a node of the trace, keyed like any op, and by default it cuts
 * the trace after itself, as TorchTPU materialises at collectives
 * (ctpu_dist_set_collective_cut(false) keeps collectives inside the step's
 * program). They run on the device thread, the only thread that calls MPI.
 *
 * Determinism beyond MPI's: sums are a left fold in rank order,
 * ((x0 + x1) + x2) + ..., rounded to the dtype after each addition, on
 * every rank (MPI's own reduction order is unspecified); a mean is that sum
 * divided once by N. So a world-size-N step equals, bit for bit, one process
 * accumulating the same N micro-batches in rank order.
 *
 * Faults: the ranks first exchange each collective's shape and dtype; a
 * mismatch is an error naming the collective and both ranks' types
 * ("all_reduce: rank 0 has f32[4,3], rank 1 has f32[4,2] (shapes differ
 * across ranks)"), raised like a device fault (at the next sync or host
 * read; at the call in debug eager). A rank that stops calling collectives
 * for CTPU_DIST_TIMEOUT seconds (default 300) ends the job through
 * MPI_Abort with a line naming the collective. When a rank dies, mpirun
 * stops the others with SIGTERM and each prints "ctpu: rank R: stopped in
 * all_reduce (bucket B, step S)". */

typedef enum { CTPU_DIST_SUM = 0, CTPU_DIST_MEAN = 1, CTPU_DIST_OP_COUNT } ctpu_dist_op;

/* Start MPI (MPI_Init_thread, MPI_THREAD_SERIALIZED or better, unless the
 * program started it) and then the runtime as ctpu_init does, with each
 * rank's defaults divided among the ranks on this node: HBM cap = the
 * chip's default cap / local ranks, kernel threads = cores / local ranks
 * (at least 1); TORCH_TPU_HBM_LIMIT and CTPU_NUM_THREADS still win.
 * Without mpirun (or without MPI) the world is one rank. Errors: those of
 * ctpu_init; CTPU_ERR_STATE (already initialised, MPI finalised before,
 * a thread level below SERIALIZED, or launched as N > 1 ranks by a ctpu
 * built without MPI); CTPU_ERR_ENV (CTPU_DIST_TIMEOUT not a positive number). */
CTPU_API ctpu_status ctpu_dist_init(void);
/* ctpu_shutdown, then MPI_Finalize (when ctpu_dist_init started MPI). MPI
 * cannot start twice in a process: ctpu_dist_init after this fails. */
CTPU_API void ctpu_dist_shutdown(void);
CTPU_API int ctpu_dist_rank(void);          /* 0 .. world_size-1; 0 when not distributed */
CTPU_API int ctpu_dist_world_size(void);    /* 1 when not distributed */
CTPU_API int ctpu_dist_local_rank(void);    /* rank among the ranks on this node */
CTPU_API int ctpu_dist_local_size(void);    /* ranks on this node */
CTPU_API bool ctpu_dist_available(void);    /* this ctpu was built with MPI */
CTPU_API bool ctpu_dist_is_initialized(void);

/* Sum (or mean) of t over the ranks, on every rank; same shape and dtype.
 * f32 and bf16 (i32: sum only). Errors: CTPU_ERR_DTYPE (i32 mean),
 * CTPU_ERR_INVALID_ARG (op), handle errors; across ranks: see above. */
CTPU_API ctpu_tensor ctpu_all_reduce(ctpu_tensor t, ctpu_dist_op op);
/* Overlap, as torch.distributed.all_reduce(async_op=True) and its
 * work.wait(): ctpu_all_reduce_async starts the same all_reduce and returns
 * at once; its result is a placeholder (this rank's own t) that only
 * ctpu_all_reduce_wait reads: the wait returns what ctpu_all_reduce(t, op)
 * returns, bit for bit (the same rank-order fold). Between the two, the
 * device thread runs the ops dispatched in between while a comm thread
 * moves the bytes (MPI_Iallgather of the buffer, then the fold; a
 * metadata exchange first, as every collective), so compute hides the
 * communication; the device thread blocks only at the wait. Started
 * all_reduces run one at a time in start order; a blocking collective
 * waits for them first. Release the placeholder after the wait (not
 * before: the request is found by it). In defer and fuse both calls cut the
 * trace as any collective unless ctpu_dist_set_collective_cut(false) keeps
 * them in the step's program (the start and the wait are then steps of it,
 * in call order). On one rank both are copies.
 * Errors: as ctpu_all_reduce; async: CTPU_ERR_STATE past 64 started and not
 * waited on this thread; wait: CTPU_ERR_INVALID_ARG when started is not
 * a value this thread started and has not waited for. Shapes or dtypes that
 * differ across ranks fault the wait's value (read it to see the message). */
CTPU_API ctpu_tensor ctpu_all_reduce_async(ctpu_tensor t, ctpu_dist_op op);
CTPU_API ctpu_tensor ctpu_all_reduce_wait(ctpu_tensor started);
/* Rank root's t on every rank (every rank passes a t of the same shape and
 * dtype). Errors: CTPU_ERR_INVALID_ARG (root outside [0, world size)). */
CTPU_API ctpu_tensor ctpu_broadcast(ctpu_tensor t, int root);
/* The ranks' t concatenated along dim in rank order: extent(dim) x world
 * size. ndim >= 1. Errors: CTPU_ERR_SHAPE (dim out of range, 0-d t). */
CTPU_API ctpu_tensor ctpu_all_gather(ctpu_tensor t, int dim);
/* Sum (or mean) over the ranks as all_reduce, of which rank r keeps slice r
 * along dim (extent(dim) / world size rows). Errors: CTPU_ERR_SHAPE (dim
 * out of range, or extent(dim) not a multiple of the world size), as
 * ctpu_all_reduce otherwise. */
CTPU_API ctpu_tensor ctpu_reduce_scatter(ctpu_tensor t, int dim, ctpu_dist_op op);
/* A bucket number for this thread's collectives from now on (-1: none), for
 * the SIGTERM line, error messages and the per-step report (DDP sets it). */
CTPU_API ctpu_status ctpu_dist_set_bucket(int64_t bucket);
/* Defer and fuse: cut the trace at each collective (true, the default) or
 * keep collectives inside the step's program (false): one program per step
 * instead of one per collective and what follows it. A blocking collective
 * (ctpu_all_reduce, ...) still blocks the device thread until its data have
 * moved; the overlap comes from ctpu_all_reduce_async / _wait, which
 * ctpu_ddp uses from the backward's gradient hooks (bench/ddp measures the
 * settings: ddp_np2_fused[_kept][_overlap]_*, overlap_share). */
CTPU_API ctpu_status ctpu_dist_set_collective_cut(bool cut);

/* ICI cost model: an ESTIMATE of what a collective costs on a TPU pod, from
 * the public per-chip inter-chip-interconnect figures (sources in
 * src/dist/ici.c: the Cloud TPU system architecture pages).
 *   per-dimension bandwidth b = bidirectional ICI bandwidth per chip / D
 *     (D torus dims: 2 ports of the chip's 2D ports serve each dim)
 *   ring over n chips: t = 2(n-1)/n * bytes / b + 2(n-1) * hop latency
 *   D-dim torus k1 x .. x kD (reduce-scatter, then all-gather, one dim at
 *     a time): t = sum_i 2(k_i-1)/k_i * bytes_i / b + 2(k_i-1) * hop,
 *     bytes_i = bytes / (k_1 ... k_{i-1})
 *   all_gather and reduce_scatter are half of that (one pass); broadcast
 *   is a pipelined pass: bytes / b + (n-1) * hop.
 * The hop latency (1 us) is an assumption, not a published figure. */
typedef enum { CTPU_ICI_RING = 0, CTPU_ICI_TORUS = 1, CTPU_ICI_TOPOLOGY_COUNT } ctpu_ici_topology;
typedef struct {
    const char *chip;          /* "v5e", "v5p", "v6e", "7x" */
    double ici_gbytes_s;       /* bidirectional ICI bandwidth per chip, GB/s (1e9 B/s) */
    int torus_dims;            /* 2 (v5e, v6e) or 3 (v5p, 7x) */
    int64_t pod_chips;         /* the largest slice (v5p: 6144 of its 8960-chip pod) */
    const char *source;
} ctpu_ici_info;
typedef struct {
    int64_t n_chips;
    int dims;                  /* 1 for a ring */
    int64_t shape[3];          /* the torus shape chosen for n_chips (near-cubic) */
    double bytes;              /* payload per chip, bytes */
    double bw_s, latency_s, total_s; /* seconds */
} ctpu_ici_estimate;
/* ICI figures of a chip profile; NULL if unknown. */
CTPU_API const ctpu_ici_info *ctpu_ici_lookup(const char *chip);
/* Estimate one collective (kind: 0 all_reduce, 1 broadcast, 2 all_gather,
 * 3 reduce_scatter) of `bytes` per chip over n_chips. Errors:
 * CTPU_ERR_INVALID_ARG (unknown chip or kind, n_chips outside [1, 2^20], bytes negative or
 * not finite, bad topology, out NULL). */
CTPU_API ctpu_status ctpu_ici_estimate_collective(const char *chip, int kind, int64_t n_chips, double bytes,
                                                  ctpu_ici_topology topo, ctpu_ici_estimate *out);

/* This run's collectives (since ctpu_init or ctpu_metrics_clear) and their
 * ICI estimates on the emulated chip's torus. */
typedef struct {
    uint64_t collectives;          /* dispatched */
    uint64_t by_kind[4];           /* all_reduce, broadcast, all_gather, reduce_scatter */
    double bytes;                  /* payload per chip, bytes */
    uint64_t steps;                /* marked steps */
    double est_ici_s;              /* at this world size (the torus of world_size chips) */
    double est_ici_s_8, est_ici_s_256, est_ici_s_pod; /* the same collectives at 8, 256 and the pod's maximum */
    double est_compute_s;          /* the cost table's device estimate of the run (current chip) */
    double comm_wall_s;            /* MEASURED: seconds the device thread spent in collectives here (the CPU
                                      emulation over MPI, waiting for the other ranks included) */
    /* Training steps: the marked steps that reduced gradients (made a
     * collective inside a bucket, ctpu_dist_set_bucket >= 0, as ctpu_ddp
     * does); evaluation steps and other collectives are not counted here.
     * The report's per-step figures are per training step when there is one. */
    uint64_t train_steps;
    uint64_t grad_collectives;     /* collectives in buckets */
    double grad_bytes;             /* their payload per chip */
    double grad_est_ici_s, grad_est_ici_s_8, grad_est_ici_s_256, grad_est_ici_s_pod; /* their estimates */
    double est_compute_train_s;    /* the cost estimate of the training steps alone (current chip) */
    /* MEASURED overlap (ctpu_all_reduce_async): started all_reduces, the
     * seconds from each start to its completion (in flight), and the part of
     * those the device thread spent blocked waiting for them (exposed); in
     * flight less exposed ran while the device computed (hidden). */
    uint64_t started;
    double started_in_flight_s, started_exposed_s;
} ctpu_dist_stats;
CTPU_API ctpu_status ctpu_dist_get_stats(ctpu_dist_stats *out);
/* Print compute against communication per step (estimates) and the ICI
 * estimate at 8, 256 chips and the pod's maximum, to f (stdout if NULL). */
CTPU_API ctpu_status ctpu_dist_report(FILE *f);

#ifdef __cplusplus
}
#endif
#endif /* CTPU_H */
