/* Loop detector (docs/DESIGN.md "Cut points"): watches a window of recent op
 * hashes and cuts when a block of ops repeats (TorchTPU: window 256, period
 * 3-128), so an unmarked training loop still compiles once per iteration
 * shape. After the first detection the trace is cut every `period` ops, so
 * every later trace holds exactly one iteration, aligned the same way. */
#ifndef CTPU_LOOPS_H
#define CTPU_LOOPS_H

#include <stdbool.h>
#include <stdint.h>

#define CTPU_LOOP_WINDOW 256
#define CTPU_LOOP_MIN_PERIOD 3
#define CTPU_LOOP_MAX_PERIOD 128

typedef struct {
    uint64_t hist[CTPU_LOOP_WINDOW];
    uint64_t count;
    uint16_t match[CTPU_LOOP_MAX_PERIOD + 1];  /* consecutive hits of h[i] == h[i-P] */
    int period;                                /* 0 = none detected */
    int since_cut;
} ctpu_loop_det;

/* Cautious detection (TORCH_TPU_DETECT_LOOPS=auto, before the program has
 * marked a step): the first period is taken only after it has repeated
 * CTPU_LOOP_CAUTIOUS_REPEATS times in a row, not twice. A step the program
 * will mark at its end often repeats a block inside it (identical layers, an
 * optimizer's per-parameter update): cutting there would split the step
 * into programs the next (marked) step never uses. An unmarked loop pays
 * with a first program of that many iterations. */
#define CTPU_LOOP_CAUTIOUS_REPEATS 32

void ctpu_loop_reset(ctpu_loop_det *d);
/* Feed one op hash; true when the trace should be cut after this op. */
bool ctpu_loop_feed(ctpu_loop_det *d, uint64_t h, bool cautious);

#endif
