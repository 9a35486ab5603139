/* The emulated chip: HBM buffers, the program format and its executor, the
 * stream drained by the device thread, kernel workers, sticky faults,
 * metrics. Knows nothing of traces or handles (docs/DESIGN.md: device never
 * includes fuse). */
#ifndef CTPU_DEVICE_H
#define CTPU_DEVICE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctpu.h"
#include "kernels.h"
#include "metrics.h"

/* ------------------------------------------------------------ buffers */
/* Two cache lines: the first is what the device thread reads (data, fault),
 * written at the allocation and when a fault changes; the second is written
 * by the host on every op that uses the buffer (last_seq at each submit,
 * the reference counts). On one line, every op's submit took that line
 * from the device core and the device took it back to read the data
 * pointer of each input. */
typedef struct ctpu_buffer {
    void *data;
    size_t bytes;
    atomic_uint fault;      /* 0, or 1 + index into the device's fault table */
    char *name;             /* the user's name for the value it holds (ctpu_set_name), malloc'd, or NULL */
    _Alignas(64) atomic_int refs;   /* host-side references: handles, traces, launchers */
    atomic_int handle_refs; /* live handles only (assign's in-place test) */
    /* input entries of pending defer-and-fuse traces (any thread's) that read
     * it: an assign writes in place only when no other trace will read it */
    atomic_int trace_readers;
    /* the last command that reads or writes it: a buffer whose last
     * reference goes while that command is pending is freed once it is done
     * (so the device thread never touches reference counts) */
    atomic_uint_fast64_t last_seq;
    /* a compiled step's binding cache relies on the handles bound to it
     * (src/eager/compiled.c): a change to them bumps ctpu__bind_epoch */
    atomic_bool watched;
    /* this allocation's number (1, 2, ...: the device's allocation count):
     * a freed header's memory is most often the next buffer's, so a pointer
     * kept past the buffer's life does not tell it from a new one; the
     * serial does (defer.c's values the last flush computed) */
    uint64_t serial;
} ctpu_buffer;

/* The binding epoch (compiled steps' binding cache, src/eager/compiled.c):
 * bumped by anything that can change what a compiled step's guards check
 * about the handles it reads and writes: a handle made on or released from
 * a watched buffer, a watched handle assigned, rebound or made pending, a
 * trace reading a watched buffer, any .grad set or cleared. */
extern atomic_uint_fast64_t ctpu__bind_epoch;
static inline void ctpu_bind_bump(void) { atomic_fetch_add(&ctpu__bind_epoch, 1); }
static inline void ctpu_buffer_bind_touch(const ctpu_buffer *b)
{
    if (b && atomic_load_explicit(&b->watched, memory_order_relaxed)) ctpu_bind_bump();
}

/* ------------------------------------------------------------ programs
 * A program is a list of steps; a step is a kernel entry and its immutable
 * data (owned by whoever built the program: the compiler). The executor calls
 * the steps in order with the command's bound buffers and runtime scalars. */
typedef struct ctpu_exec_ctx {
    void **ptr;              /* bound buffer pointers (data + view offset) */
    const double *scalars;   /* runtime scalars */
    ctpu_k_pool *pool;
    ctpu_metrics *metrics;   /* MXU accounting and such */
    int mxu_size;            /* the chip's MXU side, for padding accounting */
    /* A step reports a device fault through this: it latches on the
     * command's outputs and becomes the device's sticky error. */
    ctpu_status fault_status;
    char fault_msg[256];
} ctpu_exec_ctx;

typedef void (*ctpu_dev_step_fn)(const void *data, ctpu_exec_ctx *ctx);

typedef struct {
    ctpu_dev_step_fn fn;
    const void *data;
} ctpu_step;

typedef struct ctpu_dev_program {   /* the device's program format */
    int n_steps;
    ctpu_step *steps;
    int n_in, n_out;         /* bound buffers: inputs first, then outputs */
    const char *name;        /* for fault messages: the op or program name */
    /* debug checks: per output, dtype and element count to scan for NaN */
    const uint8_t *out_dtype;
    const int64_t *out_numel;
    const char *const *out_op; /* the op that produced each output */
    /* Scratch: values that live only inside the program get "virtual"
     * slots [n_in + n_out, n_in + n_out + n_virtual): pointers at byte
     * offsets virt_off[] into the bound buffer `scratch_slot` (a buffer the
     * launcher allocates with scratch_bytes). n_virtual 0: no scratch. */
    int n_virtual;
    const size_t *virt_off;
    int scratch_slot;
    size_t scratch_bytes;
    /* Faults in multi-step programs (NULL: every output takes any fault).
     * Output j depends on input i when bit i of out_dep_in[j*dep_words_in]
     * is set, and on step s when bit s of out_dep_step[j*dep_words_step] is:
     * a fault poisons only the outputs computed from it. */
    int dep_words_in, dep_words_step;
    const uint64_t *out_dep_in, *out_dep_step;
    /* Debug checks (when a command asks): step s's value is checked for NaN
     * right after it runs, so the error names the op that made the NaN. */
    const int32_t *step_out_slot;
    const uint8_t *step_out_dtype;
    const int64_t *step_out_numel;
    const char *const *step_op;
    /* A NaN is an error only where the op made it: none of its inputs holds
     * a NaN or an Inf. Step s reads the values step_in_slot[step_in_off[s]
     * .. step_in_off[s+1]) (dtype, element count beside); step_nan_ok[s]: the
     * op defines NaN from finite inputs (an empty input: mean over an empty
     * dim; var with n <= correction). One-op programs: the inputs are the
     * program's (in_dtype, in_numel), out_nan_ok per output. */
    const int32_t *step_in_off, *step_in_slot;
    const uint8_t *step_in_dtype;
    const int64_t *step_in_numel;
    const uint8_t *step_nan_ok;
    const uint8_t *in_dtype;
    const int64_t *in_numel;
    const uint8_t *out_nan_ok;
    /* a one-op program: its op's first n_scal_check runtime scalars are host
     * values (not a random op's seed and offset bits); a NaN or an Inf among
     * them is passed along, not made (add_scalar(x, NAN), full(NAN)) */
    int n_scal_check;
} ctpu_dev_program;

/* ------------------------------------------------------------ provenance
 * Which call of the user's made a value: its op number in the step (from 1,
 * 0 = not numbered) and the id of the innermost region label open when it
 * was dispatched (0 = none; the device's label table below). Recorded per
 * dispatch, never part of a program or its key: a cached program reports
 * the numbers of the step that runs it. */
/* call: an interned "call\x1farg" (ctpu_call_push) a device index fault is
 * reported as, 0: the op's own name. */
typedef struct { uint32_t op_no, label, call; } ctpu_op_prov;

/* ------------------------------------------------------------ commands */
#define CTPU_CMD_INLINE_BUFS 8
#define CTPU_CMD_MAX_SCALARS 8
/* A ring slot is 64-byte aligned (the ring is; the size is a multiple of
 * 64; the type itself asks no alignment: commands live in malloc'd
 * structs too) and the submit copies only the parts in use: the fixed fields come first (80 bytes), then the inline arrays, so
 * a one-op command (three buffers, no scalars) fills three cache lines of
 * the slot, the lines that move from the host core to the device core.
 * seq, in the slot's first line, is how a slot is published: the submit
 * stores it last (release) and the device polls the next slot's seq, not a
 * tail counter of the host's (that line moved between the cores on every
 * op, besides the slot's lines). */
typedef struct {
    _Atomic uint64_t seq;    /* (set by the submit) the command's sequence number, from 1 */
    const ctpu_dev_program *prog;
    int n_bufs;
    /* provenance of the program's steps: prov[s] for step s (n_prov of
     * them; a one-op program has prov_inl); n_prov 0: none recorded */
    int n_prov;
    ctpu_op_prov prov_inl;
    bool one_block;          /* buf is one heap block holding off (and scalars unless scal_inl) too: freed once */
    bool debug_checks;
    bool prov_span;          /* prov[n_prov], prov[n_prov + 1]: the program's first and last ops (trace file) */
    bool prov_shared;        /* prov is borrowed (a compiled step's replay: its version owns it): not freed */
    ctpu_buffer **buf;       /* points at buf_inl, or a heap array if more */
    size_t *off;
    double *scalars;         /* scal_inl, or a heap array the command owns */
    ctpu_op_prov *prov;      /* points at prov_inl, or a heap array the command owns */
    uint64_t program_id;     /* the report's program id (fused cache); 0: strict eager's one-op program */
    ctpu_buffer *buf_inl[CTPU_CMD_INLINE_BUFS];
    size_t off_inl[CTPU_CMD_INLINE_BUFS];
    double scal_inl[CTPU_CMD_MAX_SCALARS];
    uint8_t pad_[48];        /* to 320 bytes: five whole lines */
} ctpu_cmd;
_Static_assert(sizeof(ctpu_cmd) % 64 == 0, "a ring slot is whole cache lines");

/* ------------------------------------------------------------ device */
typedef struct ctpu_fault_rec {
    ctpu_status status;
    char msg[256];
} ctpu_fault_rec;

#define CTPU_RING_SIZE 4096
#define CTPU_MAX_FAULTS 256

typedef struct ctpu_device ctpu_device;

/* Create with a chip, an HBM cap (bytes) and a thread count (>= 1, the
 * device thread included). NULL on failure (message in *err). */
ctpu_device *ctpu_device_create(const ctpu_chip_info *chip, uint64_t hbm_cap, int nthreads,
                                ctpu_metrics *metrics, char *err, size_t errlen);
void ctpu_device_destroy(ctpu_device *dev);

/* HBM: a 64-byte aligned buffer counted against the cap, refs = 1,
 * handle_refs = 0. NULL on OOM with the message written to err. */
ctpu_buffer *ctpu_buffer_alloc(ctpu_device *dev, size_t bytes, char *err, size_t errlen);
void ctpu_buffer_retain(ctpu_buffer *b);
void ctpu_buffer_release(ctpu_device *dev, ctpu_buffer *b);
void ctpu_hbm_stats_get(ctpu_device *dev, ctpu_hbm_stats *out);
void ctpu_hbm_peak_reset(ctpu_device *dev);
/* HBM held only by queued commands (buffers released while a pending
 * command still uses them): what the device gives back as it runs. */
uint64_t ctpu_hbm_queued_bytes(ctpu_device *dev);

/* Enqueue a command. The caller holds a reference on every bound buffer
 * while it submits; each buffer records the command as its last use, and is
 * not freed before that command has run.
 * Returns its sequence number. cmd->buf/off may point at the inline arrays. */
uint64_t ctpu_device_submit(ctpu_device *dev, ctpu_cmd *cmd);
/* The same, for a command that uses only n_scal of its inline scalars (a
 * one-op command: the op's); ctpu_device_submit copies all of them. */
uint64_t ctpu_device_submit_n(ctpu_device *dev, ctpu_cmd *cmd, int n_scal);
/* Wait for command seq (0 = everything submitted so far). */
void ctpu_device_wait(ctpu_device *dev, uint64_t seq);
/* The sticky error: first fault latched since the last take. Returns
 * CTPU_OK if none; copies the message. Clears it. */
ctpu_status ctpu_device_take_error(ctpu_device *dev, char *msg, size_t len);
/* Record a fault (for values the host side could not compute: a failed
 * program launch); returns its id for a buffer's `fault`. sticky: also make
 * it the device's sticky error. */
unsigned ctpu_device_fault_new(ctpu_device *dev, ctpu_status st, const char *msg, bool sticky);
/* Fault record of a buffer (0 = none). */
const ctpu_fault_rec *ctpu_device_fault(ctpu_device *dev, unsigned fault_id);
ctpu_k_pool *ctpu_device_pool(ctpu_device *dev);
/* Test hook: count of commands executed; and a gate that holds the device
 * thread before it runs the next command (to prove strict eager is async). */
uint64_t ctpu_device_done_seq(ctpu_device *dev);
/* A function the device thread calls between the steps of a program, after
 * each command and while idle (src/dist/ moves started all_reduces along
 * with it: MPI progresses only inside its calls); NULL: none. Process-wide. */
void ctpu_device_set_progress(void (*fn)(void));
void ctpu_device_hold(ctpu_device *dev, bool hold);

/* Region labels (ctpu_label_push): interned once, never freed before the
 * device; ids from 1. 0 when the table is full or out of memory. A user's
 * label is refused once CTPU_MAX_LABELS names are interned; the library's
 * own names (call scopes, "backward of <op>") may use CTPU_LABELS_RESERVED
 * slots more, so a user who filled the table keeps them. Lookups take no
 * lock. */
#define CTPU_MAX_LABELS 4096
#define CTPU_LABELS_RESERVED 1024
uint32_t ctpu_device_label_id(ctpu_device *dev, const char *label);
uint32_t ctpu_device_label_id_internal(ctpu_device *dev, const char *label);
const char *ctpu_device_label(const ctpu_device *dev, uint32_t id);
/* " (op #4, \"embed\")", " (op #4)", or "" for an unnumbered op. */
const char *ctpu_device_prov_str(const ctpu_device *dev, ctpu_op_prov p, char *buf, size_t len);
/* msg with p after its leading op name: "embedding: index ..." ->
 * "embedding (op #1, \"embed\"): index ..." (written to out). Under a
 * call scope (p.call) an index fault is the call's: "gather: index 7 at
 * position 1 is out of range [0, 5) along dim 1 (1 bad index)" -> "nll_loss
 * (op #5): target 7 at position 1 is out of range [0, 5) (1 bad index)";
 * another fault gets the call in front ("nll_loss (op #5): gather: ..."). */
void ctpu_device_prov_msg(const ctpu_device *dev, ctpu_op_prov p, const char *msg, char *out, size_t len);

/* Chip profiles (chips.c). */
const ctpu_chip_info *ctpu_chip_profiles(int *count);

#endif /* CTPU_DEVICE_H */
