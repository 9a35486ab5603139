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
#define TRAIN_RING 16
typedef struct {
    pthread_mutex_t mu;
    uint64_t epoch;
    uint64_t busy0_ns;   /* ctpu__dist_busy_ns() when the totals were cleared */
    ctpu_dist_overlap_ns ov0;   /* the overlap counters then */
    ctpu_dist_stats s;
    uint64_t train_ring[TRAIN_RING];   /* the last training steps' numbers + 1 (0: none) */
    int train_at;
} dist_totals;
static dist_totals g_tot = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void totals_reset_locked(void)
{
    memset(&g_tot.s, 0, sizeof g_tot.s);
    memset(g_tot.train_ring, 0, sizeof g_tot.train_ring);
    g_tot.epoch = ctpu_rt->epoch;
    g_tot.busy0_ns = ctpu__dist_busy_ns();
    ctpu__dist_overlap(&g_tot.ov0);
}

static void totals_fresh_locked(void)
{
    if (g_tot.epoch != ctpu_rt->epoch) totals_reset_locked();
}

void ctpu__dist_stats_clear(void)
{
    if (!ctpu_rt) return;
    pthread_mutex_lock(&g_tot.mu);
    totals_reset_locked();
    pthread_mutex_unlock(&g_tot.mu);
}

bool ctpu__dist_is_train_step(uint64_t step)
{
    if (!ctpu_rt) return false;
    bool yes = false;
    pthread_mutex_lock(&g_tot.mu);
    totals_fresh_locked();
    for (int i = 0; i < TRAIN_RING && !yes; i++) yes = g_tot.train_ring[i] == step + 1;
    pthread_mutex_unlock(&g_tot.mu);
    return yes;
}

static double est(const char *chip, int kind, int64_t n, double bytes)
{
    ctpu_ici_estimate e;
    if (n <= 1) return 0;
    return ctpu_ici_estimate_collective(chip, kind, n, bytes, CTPU_ICI_TORUS, &e) == CTPU_OK ? e.total_s : 0;
}

void ctpu__dist_stats_add(int kind, double bytes, int64_t bucket)
{
    uint64_t step = atomic_load(&ctpu_rt->marked_steps);
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
    if (bucket >= 0) {   /* a gradient bucket: this step trains */
        g_tot.s.grad_collectives++;
        g_tot.s.grad_bytes += bytes;
        g_tot.s.grad_est_ici_s += e_n;
        g_tot.s.grad_est_ici_s_8 += e_8;
        g_tot.s.grad_est_ici_s_256 += e_256;
        g_tot.s.grad_est_ici_s_pod += e_pod;
        if (g_tot.train_ring[g_tot.train_at] != step + 1) {
            g_tot.train_at = (g_tot.train_at + 1) % TRAIN_RING;
            g_tot.train_ring[g_tot.train_at] = step + 1;
            g_tot.s.train_steps++;
        }
    }
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
    ctpu_dist_overlap_ns ov;
    ctpu__dist_overlap(&ov);
    out->started = ov.started - g_tot.ov0.started;
    out->started_in_flight_s = (double)(ov.in_flight_ns - g_tot.ov0.in_flight_ns) * 1e-9;
    out->started_exposed_s = (double)(ov.exposed_ns - g_tot.ov0.exposed_ns) * 1e-9;
    pthread_mutex_unlock(&g_tot.mu);
    ctpu_cost_table tab;
    if (ctpu_cost_table_get(&tab) == CTPU_OK) {
        out->steps = tab.steps;
        out->est_compute_s = tab.rows[tab.current].run_s;
    }
    out->est_compute_train_s = ctpu__report_train_compute_s();
    return CTPU_OK;
}

void ctpu__dist_per_step(const ctpu_dist_stats *s, ctpu_dist_per_step *p)
{
    bool train = s->train_steps > 0;
    p->train = train;
    p->steps = train ? (double)s->train_steps : s->steps ? (double)s->steps : 1.0;
    p->collectives = (double)(train ? s->grad_collectives : s->collectives) / p->steps;
    p->bytes = (train ? s->grad_bytes : s->bytes) / p->steps;
    p->compute_s = (train ? s->est_compute_train_s : s->est_compute_s) / p->steps;
    p->ici_s = (train ? s->grad_est_ici_s : s->est_ici_s) / p->steps;
    p->ici_s_8 = (train ? s->grad_est_ici_s_8 : s->est_ici_s_8) / p->steps;
    p->ici_s_256 = (train ? s->grad_est_ici_s_256 : s->est_ici_s_256) / p->steps;
    p->ici_s_pod = (train ? s->grad_est_ici_s_pod : s->est_ici_s_pod) / p->steps;
    double hidden = s->started_in_flight_s - s->started_exposed_s;
    p->overlap_share = s->started_in_flight_s > 0 ? (hidden > 0 ? hidden : 0) / s->started_in_flight_s : 0;
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
    ctpu_dist_per_step ps;
    ctpu__dist_per_step(&s, &ps);
    double comp = ps.compute_s, comm = ps.ici_s;
    fprintf(f, "Data parallel (ESTIMATE on %s ICI, %.0f GB/s per chip, %dD torus; formulas in ctpu.h): world size %d, "
            "%llu collectives (%llu all_reduce, %llu broadcast, %llu all_gather, %llu reduce_scatter), "
            "%.3g MB per chip\n", chip, ic ? ic->ici_gbytes_s : 0.0, ic ? ic->torus_dims : 0, ctpu_dist_world_size(),
            (unsigned long long)s.collectives, (unsigned long long)s.by_kind[0], (unsigned long long)s.by_kind[1],
            (unsigned long long)s.by_kind[2], (unsigned long long)s.by_kind[3], s.bytes / 1e6);
    char basis[96];
    if (ps.train)
        snprintf(basis, sizeof basis, "training step (%llu of %llu marked steps; gradient buckets only)",
                 (unsigned long long)s.train_steps, (unsigned long long)s.steps);
    else
        snprintf(basis, sizeof basis, "step (%llu marked steps)", (unsigned long long)s.steps);
    fprintf(f, "  per %s: compute %.2f us, communication %.2f us (%.0f%% of the step if not overlapped)\n",
            basis, comp * 1e6, comm * 1e6, comp + comm > 0 ? 100.0 * comm / (comp + comm) : 0.0);
    fprintf(f, "  communication per step at 8 chips %.2f us, 256 chips %.2f us, %lld chips (pod maximum) %.2f us\n",
            ps.ici_s_8 * 1e6, ps.ici_s_256 * 1e6, (long long)(ic ? ic->pod_chips : 0), ps.ici_s_pod * 1e6);
    if (s.started)
        fprintf(f, "  measured overlap: %llu all_reduces started during backward, %.3f ms in flight, %.3f ms of it "
                "exposed (the device waiting), %.0f%% hidden under compute\n", (unsigned long long)s.started,
                s.started_in_flight_s * 1e3, s.started_exposed_s * 1e3, 100 * ps.overlap_share);
    return CTPU_OK;
}
