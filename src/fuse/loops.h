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

void ctpu_loop_reset(ctpu_loop_det *d);
/* Feed one op hash; true when the trace should be cut after this op. */
bool ctpu_loop_feed(ctpu_loop_det *d, uint64_t h);

#endif
