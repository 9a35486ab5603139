/* The distributed runtime's public entry points (issue 19): start and stop
 * around ctpu_init / ctpu_shutdown, this run's collective statistics with
 * their ICI estimates, and the compute-against-communication report. The
 * collectives themselves are ops (collective.c); MPI is in src/dist/. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "eager.h"
#include "dist/dist.h"

ctpu_status ctpu_dist_init(void)
{
    if (ctpu_rt) {
        ctpu_set_error(CTPU_ERR_STATE, "ctpu_dist_init: the runtime is already initialised (ctpu_dist_init starts "
                       "it: call it instead of ctpu_init)");
        return CTPU_ERR_STATE;
    }
    char err[512] = "";
    ctpu_status st = ctpu__dist_start(err, sizeof err);
    if (st != CTPU_OK) {
        ctpu_set_error(st, "%s", err);
        return st;
    }
    st = ctpu_init();
    if (st != CTPU_OK) ctpu__dist_stop();
    return st;
}

void ctpu_dist_shutdown(void)
{
    ctpu_shutdown();
    ctpu__dist_stop();
}

/* ------------------------------------------------------------ statistics
 * Accumulated at dispatch (the host knows every collective's size then);
 * reset by ctpu_init and ctpu_metrics_clear through the epoch/clear hook. */
typedef struct {
    pthread_mutex_t mu;
    uint64_t epoch;
    uint64_t busy0_ns;   /* ctpu__dist_busy_ns() when the totals were cleared */
    ctpu_dist_stats s;
} dist_totals;
static dist_totals g_tot = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void totals_fresh_locked(void)
{
    if (g_tot.epoch != ctpu_rt->epoch) {
        memset(&g_tot.s, 0, sizeof g_tot.s);
        g_tot.epoch = ctpu_rt->epoch;
        g_tot.busy0_ns = ctpu__dist_busy_ns();
    }
}

void ctpu__dist_stats_clear(void)
{
    if (!ctpu_rt) return;
    pthread_mutex_lock(&g_tot.mu);
    memset(&g_tot.s, 0, sizeof g_tot.s);
    g_tot.epoch = ctpu_rt->epoch;
    g_tot.busy0_ns = ctpu__dist_busy_ns();
    pthread_mutex_unlock(&g_tot.mu);
}

static double est(const char *chip, int kind, int64_t n, double bytes)
{
    ctpu_ici_estimate e;
    if (n <= 1) return 0;
    return ctpu_ici_estimate_collective(chip, kind, n, bytes, CTPU_ICI_TORUS, &e) == CTPU_OK ? e.total_s : 0;
}

void ctpu__dist_stats_add(int kind, double bytes)
{
    const char *chip = ctpu_rt->chip->name;
    const ctpu_ici_info *ic = ctpu_ici_lookup(chip);
    int64_t pod = ic ? ic->pod_chips : 256;
    double e_n = est(chip, kind, ctpu_dist_world_size(), bytes);
    double e_8 = est(chip, kind, 8, bytes), e_256 = est(chip, kind, 256, bytes), e_pod = est(chip, kind, pod, bytes);
    pthread_mutex_lock(&g_tot.mu);
    totals_fresh_locked();
    g_tot.s.collectives++;
    if ((unsigned)kind < 4) g_tot.s.by_kind[kind]++;
    g_tot.s.bytes += bytes;
    g_tot.s.est_ici_s += e_n;
    g_tot.s.est_ici_s_8 += e_8;
    g_tot.s.est_ici_s_256 += e_256;
    g_tot.s.est_ici_s_pod += e_pod;
    pthread_mutex_unlock(&g_tot.mu);
}

ctpu_status ctpu_dist_get_stats(ctpu_dist_stats *out)
{
    if (!ctpu_check_init("dist_get_stats")) return CTPU_ERR_NOT_INITIALIZED;
    if (!out) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "dist_get_stats: out is NULL");
        return CTPU_ERR_INVALID_ARG;
    }
    pthread_mutex_lock(&g_tot.mu);
    totals_fresh_locked();
    *out = g_tot.s;
    out->comm_wall_s = (double)(ctpu__dist_busy_ns() - g_tot.busy0_ns) * 1e-9;
    pthread_mutex_unlock(&g_tot.mu);
    ctpu_cost_table tab;
    if (ctpu_cost_table_get(&tab) == CTPU_OK) {
        out->steps = tab.steps;
        out->est_compute_s = tab.rows[tab.current].run_s;
    }
    return CTPU_OK;
}

ctpu_status ctpu_dist_report(FILE *f)
{
    if (!ctpu_check_init("dist_report")) return CTPU_ERR_NOT_INITIALIZED;
    if (!f) f = stdout;
    ctpu_dist_stats s;
    ctpu_status st = ctpu_dist_get_stats(&s);
    if (st != CTPU_OK) return st;
    const char *chip = ctpu_rt->chip->name;
    const ctpu_ici_info *ic = ctpu_ici_lookup(chip);
    double steps = s.steps ? (double)s.steps : 1.0;
    double comp = s.est_compute_s / steps, comm = s.est_ici_s / steps;
    fprintf(f, "Data parallel (ESTIMATE on %s ICI, %.0f GB/s per chip, %dD torus; formulas in ctpu.h): world size %d, "
            "%llu collectives (%llu all_reduce, %llu broadcast, %llu all_gather, %llu reduce_scatter), "
            "%.3g MB per chip\n", chip, ic ? ic->ici_gbytes_s : 0.0, ic ? ic->torus_dims : 0, ctpu_dist_world_size(),
            (unsigned long long)s.collectives, (unsigned long long)s.by_kind[0], (unsigned long long)s.by_kind[1],
            (unsigned long long)s.by_kind[2], (unsigned long long)s.by_kind[3], s.bytes / 1e6);
    fprintf(f, "  per step (%llu steps): compute %.2f us, communication %.2f us (%.0f%% of the step if not overlapped)\n",
            (unsigned long long)s.steps, comp * 1e6, comm * 1e6,
            comp + comm > 0 ? 100.0 * comm / (comp + comm) : 0.0);
    fprintf(f, "  communication per step at 8 chips %.2f us, 256 chips %.2f us, %lld chips (pod maximum) %.2f us\n",
            s.est_ici_s_8 / steps * 1e6, s.est_ici_s_256 / steps * 1e6, (long long)(ic ? ic->pod_chips : 0),
            s.est_ici_s_pod / steps * 1e6);
    return CTPU_OK;
}
