/* ICI cost model (issue 19): what a collective would cost on a TPU pod.
 *
 * Per-chip figures, from the Cloud TPU system architecture pages
 * (docs.cloud.google.com/tpu/docs/<version>), "Bidirectional inter-chip
 * interconnect (ICI) bandwidth (per chip)" and "Interconnect topology":
 *   v5e  400 GB/s, 4 ICI ports, 2D torus, 256 chips per pod (tpu/docs/v5e)
 *   v5p 1200 GB/s, 3D torus, 8960 chips per pod, largest slice 16x16x24 =
 *        6144 chips (tpu/docs/v5p)
 *   v6e  800 GB/s, 4 ICI ports, 2D torus, 256 chips per pod (tpu/docs/v6e)
 *   7x  1200 GB/s, 3D torus, 9216 chips per pod (tpu/docs/tpu7x, whose table
 *        compares v5p, v6e and TPU7x)
 * The model (formulas in include/ctpu.h): a D-dim torus gives each
 * dimension 1/D of the chip's bandwidth (two of its 2D ports); an
 * all-reduce runs reduce-scatter then all-gather along one dimension at a
 * time (2(k-1)/k of the remaining bytes per dimension); each step of a ring
 * pays a hop latency of 1 us (an assumption: no public figure). */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "ctpu.h"

#define CTPU_ICI_HOP_S 1e-6
#define CTPU_ICI_MAX_CHIPS (1 << 20)

static const ctpu_ici_info ici_table[] = {
    { "v5e", 400.0, 2, 256,
      "docs.cloud.google.com/tpu/docs/v5e: bidirectional ICI bandwidth per chip 400 GBps, 4 ICI ports, "
      "2D torus, 256 chips per pod" },
    { "v5p", 1200.0, 3, 6144,
      "docs.cloud.google.com/tpu/docs/v5p: bidirectional ICI bandwidth per chip 1200 GBps, 3D torus, "
      "8960 chips per pod, largest slice 16x16x24 (6144 chips)" },
    { "v6e", 800.0, 2, 256,
      "docs.cloud.google.com/tpu/docs/v6e: bidirectional ICI bandwidth per chip 800 GBps, 4 ICI ports, "
      "2D torus, 256 chips per pod" },
    { "7x", 1200.0, 3, 9216,
      "docs.cloud.google.com/tpu/docs/tpu7x: bidirectional ICI bandwidth per chip 1200 GB/s, 3D torus, "
      "9216 chips per pod" },
};

const ctpu_ici_info *ctpu_ici_lookup(const char *chip)
{
    if (!chip) return NULL;
    for (size_t i = 0; i < sizeof ici_table / sizeof ici_table[0]; i++)
        if (strcasecmp(ici_table[i].chip, chip) == 0) return &ici_table[i];
    return NULL;
}

/* The near-cubic torus for n chips: k1 <= k2 <= k3 with the smallest sum
 * (16x16 for 256 on a 2D torus, 4x8x8 on a 3D one, 16x24x24 for 9216). */
static void torus_shape(int64_t n, int dims, int64_t *k)
{
    k[0] = k[1] = k[2] = 1;
    if (dims == 2) {
        int64_t best = 1;
        for (int64_t a = 1; a * a <= n; a++)
            if (n % a == 0) best = a;
        k[0] = best;
        k[1] = n / best;
        return;
    }
    int64_t bsum = INT64_MAX;
    for (int64_t a = 1; a * a * a <= n; a++) {
        if (n % a) continue;
        int64_t m = n / a;
        for (int64_t b = a; b * b <= m; b++) {
            if (m % b) continue;
            int64_t c = m / b, s = a + b + c;
            if (s < bsum) {
                bsum = s;
                k[0] = a;
                k[1] = b;
                k[2] = c;
            }
        }
    }
}

ctpu_status ctpu_ici_estimate_collective(const char *chip, int kind, int64_t n_chips, double bytes,
                                         ctpu_ici_topology topo, ctpu_ici_estimate *out)
{
    const ctpu_ici_info *ic = ctpu_ici_lookup(chip);
    if (!out || !ic || kind < 0 || kind > 3 || n_chips < 1 || n_chips > CTPU_ICI_MAX_CHIPS || !(bytes >= 0) || !isfinite(bytes) ||
        (unsigned)topo >= CTPU_ICI_TOPOLOGY_COUNT) {
        ctpu_report_error(CTPU_ERR_INVALID_ARG, "ici_estimate_collective: chip=%s kind=%d n_chips=%lld bytes=%g: "
                          "needs a known chip (v5e, v5p, v6e, 7x), kind in [0, 3], n_chips in [1, 2^20], finite bytes >= 0, "
                          "a topology and out",
                          chip ? chip : "(null)", kind, (long long)n_chips, bytes);
        return CTPU_ERR_INVALID_ARG;
    }
    memset(out, 0, sizeof *out);
    out->n_chips = n_chips;
    out->bytes = bytes;
    int dims = topo == CTPU_ICI_RING ? 1 : ic->torus_dims;
    int64_t k[3] = { n_chips, 1, 1 };
    if (dims > 1) torus_shape(n_chips, dims, k);
    out->dims = dims;
    for (int d = 0; d < 3; d++) out->shape[d] = k[d];
    double b = ic->ici_gbytes_s * 1e9 / (double)ic->torus_dims;   /* bytes/s along one dimension */
    double left = bytes, bw = 0, lat = 0;
    for (int d = 0; d < dims; d++) {
        double kk = (double)k[d];
        if (k[d] <= 1) continue;
        if (kind == 1) {                       /* broadcast: one pipelined pass */
            if (bw == 0) bw = bytes / b;
            lat += (kk - 1) * CTPU_ICI_HOP_S;
            continue;
        }
        double passes = kind == 0 ? 2.0 : 1.0; /* all_reduce: reduce-scatter + all-gather */
        bw += passes * (kk - 1) / kk * left / b;
        lat += passes * (kk - 1) * CTPU_ICI_HOP_S;
        left /= kk;
    }
    out->bw_s = bw;
    out->latency_s = lat;
    out->total_s = bw + lat;
    return CTPU_OK;
}
