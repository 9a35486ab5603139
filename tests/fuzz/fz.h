/* Differential fuzzer over the public API (issue 7).
 *
 * A program is a list of instructions (fz_ins), each one public call (an op
 * from the op table, a creation, an assign, a host read, a mark_step, a
 * scope, autograd). Operands name earlier instructions by index, so a
 * program is self-contained and can be minimised by dropping instructions
 * (an operand whose instruction was dropped makes its user a no-op). Region
 * labels (ctpu_label_push / pop, issue 11) are instructions too: they must
 * change no value or status in any mode. So is a loop of steps over one
 * structure whose rows grow each step (FZ_VARLEN): the campaign runs with
 * TORCH_TPU_RECOMPILE_LIMIT=2 (FZ_RECOMPILE_LIMIT), so defer and fuse runs
 * most of those steps op by op in strict eager, and the bits must not change.
 * FZ_DYNAMIC is a loop of steps whose rows change each step with the batch
 * marked dynamic (ctpu_mark_dynamic, issue 15): in defer and fuse one
 * program bound at every extent, through a unary op, a broadcast add of a
 * leaf, a scalar op, a softmax, a matmul, a reduction, one more op of any
 * kind the fuzzer knows (its tail: binary, scalar, where, clamp, cast,
 * argmax, softmax, reshape, permute, transpose, contiguous, slice, concat,
 * expand, embedding, gather, creations, detach, assign, reductions,
 * matmul_t) and the backward; the bits must be strict eager's at every
 * extent.
 *
 * A program is generated from a seed (or from a byte string: libFuzzer)
 * by running it once in strict eager, choosing each call's arguments from
 * the live tensors' real shapes (mostly valid, sometimes deliberately not).
 * It is then replayed in debug eager (debug checks off) and in defer and
 * fuse; each run writes a transcript: every call's status (null or not,
 * ctpu_last_status), the bytes of every host read, and at the end every
 * live tensor and every leaf's .grad (NaN compared as a class). The
 * transcripts must be identical, and HBM in use must return to where it was.
 * Resource errors (OOM) are outside parity: such a program is skipped.
 */
#ifndef FZ_H
#define FZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ctpu.h"

#define FZ_MAX_INS 80
/* The recompile limit the campaigns run with (issue 11): low, so structures
 * whose shapes vary pass it. */
#define FZ_RECOMPILE_LIMIT "2"

typedef enum {
    FZ_FROM_HOST, FZ_CREATE, FZ_UNARY, FZ_BINARY, FZ_SCALAR, FZ_WHERE, FZ_CLAMP, FZ_CAST, FZ_REDUCE,
    FZ_ARGMAX, FZ_SOFTMAX, FZ_RESHAPE, FZ_PERMUTE, FZ_TRANSPOSE, FZ_CONTIGUOUS, FZ_SLICE, FZ_CONCAT,
    FZ_EXPAND, FZ_EMBEDDING, FZ_GATHER, FZ_MATMUL, FZ_DETACH, FZ_ASSIGN, FZ_READ, FZ_ITEM, FZ_MARK_STEP,
    FZ_STEP_BEGIN, FZ_STEP_END, FZ_KEEP, FZ_RELEASE, FZ_REQ_GRAD, FZ_BACKWARD, FZ_ZERO_GRAD, FZ_SYNC,
    FZ_NO_GRAD_BEGIN, FZ_NO_GRAD_END, FZ_LABEL_PUSH, FZ_LABEL_POP, FZ_VARLEN, FZ_DYNAMIC, FZ_KIND_COUNT
} fz_kind;

typedef struct {
    uint8_t kind, sub, dt, nd, flag;
    int16_t a, b, c;        /* operand instruction indices; -1 none, -2 dropped by the minimiser */
    int32_t p[8];           /* dims, perm, upper bound of index data */
    int64_t shape[8];       /* shape; slice start/end/step */
    double s0, s1;
    uint32_t data;          /* from_host: seed of the data */
} fz_ins;

typedef struct {
    uint64_t seed;
    uint8_t precision;
    int n;
    fz_ins ins[FZ_MAX_INS];
} fz_prog;

/* A source of choices: a PCG stream from a seed, or a byte string. */
typedef struct {
    uint64_t state;
    const uint8_t *bytes;
    size_t len, pos;
} fz_rng;

/* Options of a generation. */
typedef struct {
    int max_ins;            /* instructions to aim for (<= FZ_MAX_INS) */
    bool autograd;          /* requires_grad / backward / zero_grad */
    bool invalid;           /* sometimes pass bad arguments on purpose */
} fz_opts;

/* Generate a program (the runtime must be up; runs it in strict eager).
 * `sink`, if set, receives each instruction before it runs (crash capture). */
void fz_generate(fz_rng *r, const fz_opts *o, fz_prog *out, fz_prog *sink);

/* Run a program in all three modes. Returns true if they agree (or the
 * program hit a resource error, *skipped set); otherwise writes a one-line
 * description of the first difference into why. */
bool fz_check(const fz_prog *p, char *why, size_t why_len, bool *skipped);

/* Delta-debug p down to a 1-minimal program for which `fails` holds. */
void fz_minimise(fz_prog *p, bool (*fails)(const fz_prog *, void *), void *ctx);

/* Print p as a small C test (a fz_prog initialiser plus the calls it makes). */
void fz_print_c(const fz_prog *p, const char *name, FILE *f);
/* One instruction as the C call it makes ("r3 = ctpu_add(r1, r2)"). */
void fz_describe(const fz_prog *p, int i, char *buf, size_t len);

/* A campaign: programs seed0 .. seed0+count-1, each generated and checked in
 * a forked child (a crash is caught and its program recovered); a failing
 * program is minimised (each trial in a child) and printed to `report`.
 * Returns the number of failing programs; *ran gets the number run. */
int fz_campaign(uint64_t seed0, int count, const fz_opts *o, FILE *report, int *ran, int *skipped);

/* Calls made by fz_generate in this process, by kind: [k][0] succeeded,
 * [k][1] gave an error (statistics for the CLI's --stats). */
extern uint64_t fz_gen_stats[FZ_KIND_COUNT][2];
const char *fz_kind_name(int k);
/* Test hook: flip one bit of the last value recorded in this mode's
 * transcript (-1: off), to check that fz_check sees a difference. */
extern int fz_test_corrupt_mode;

void fz_rng_seed(fz_rng *r, uint64_t seed);
void fz_rng_bytes(fz_rng *r, const uint8_t *data, size_t len);

#endif
