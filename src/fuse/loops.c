#include <string.h>

#include "loops.h"

void ctpu_loop_reset(ctpu_loop_det *d) { memset(d, 0, sizeof *d); }

bool ctpu_loop_feed(ctpu_loop_det *d, uint64_t h, bool cautious)
{
    uint64_t pos = d->count++;
    d->hist[pos % CTPU_LOOP_WINDOW] = h;
    for (int p = CTPU_LOOP_MIN_PERIOD; p <= CTPU_LOOP_MAX_PERIOD; p++) {
        if (pos >= (uint64_t)p && d->hist[(pos - (uint64_t)p) % CTPU_LOOP_WINDOW] == h) {
            if (d->match[p] < UINT16_MAX) d->match[p]++;
        } else {
            d->match[p] = 0;
        }
    }
    if (d->period > 0) {
        if (d->match[d->period] == 0) {      /* the pattern broke: detect again */
            d->period = 0;
        } else if (++d->since_cut >= d->period) {
            d->since_cut = 0;
            return true;
        }
        return false;
    }
    for (int p = CTPU_LOOP_MIN_PERIOD; p <= CTPU_LOOP_MAX_PERIOD; p++) {
        /* a whole period repeated (cautious: that many times) */
        if (d->match[p] >= (cautious ? p * (CTPU_LOOP_CAUTIOUS_REPEATS - 1) : p)) {
            d->period = p;
            d->since_cut = 0;
            return true;
        }
    }
    return false;
}
