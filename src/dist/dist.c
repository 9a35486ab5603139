/* Distributed runtime over MPI (issue 19): init, rank, world size, the
 * collectives' engine, faults.
 *
 * Determinism beyond MPI's: MPI leaves the order of a reduction unspecified,
 * so ctpu never asks MPI to add. An all_reduce is a personalised exchange
 * (MPI_Ialltoallv: rank c receives chunk c of every rank's buffer), a left
 * fold of the N chunks in rank order on the rank that owns the chunk, and an
 * all-gather of the folded chunks (MPI_Iallgatherv): every element is
 * ((x0 + x1) + x2) + ... rounded to its dtype after each addition, on every
 * rank, whatever the transport, and the bytes moved are the ring algorithm's
 * 2(N-1)/N of the buffer. A mean is that sum divided once by N.
 *
 * Faults. Each collective first exchanges a small metadata record (kind,
 * op, dtype, shape, root, dim) with MPI_Iallgather: a mismatch is an error on
 * every rank naming the collective and both ranks' types, and no data moves.
 * Every request is non-blocking and polled against CTPU_DIST_TIMEOUT
 * (seconds, default 300): a rank that stops calling collectives without
 * exiting makes the others MPI_Abort with a line naming the collective. When
 * a rank dies, mpirun sends SIGTERM to the others; the handler installed by
 * ctpu_dist_init prints "ctpu: rank R: stopped in all_reduce (bucket B, step
 * S)" (what the device thread was doing) and ends the process. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist.h"
#include "device/device.h"
#include "kernels.h"

#ifdef CTPU_HAVE_MPI
#include <mpi.h>
#endif

static const char *const coll_names[CTPU_COLL_COUNT] = { "all_reduce", "broadcast", "all_gather", "reduce_scatter" };

const char *ctpu__coll_name(int kind)
{
    return (unsigned)kind < CTPU_COLL_COUNT ? coll_names[kind] : "collective";
}

/* ------------------------------------------------------------ the fold */
void ctpu__dist_fold(int dtype, int op, int n, const void *const *src, int64_t count, void *dst)
{
    if (dtype == CTPU_F32) {
        float *y = dst;
        for (int64_t i = 0; i < count; i++) {
            float acc = ((const float *)src[0])[i];
            for (int r = 1; r < n; r++) acc = acc + ((const float *)src[r])[i];
            if (op == CTPU_DIST_MEAN) acc = acc / (float)n;
            y[i] = acc;
        }
    } else if (dtype == CTPU_BF16) {
        uint16_t *y = dst;
        for (int64_t i = 0; i < count; i++) {
            uint16_t acc = ((const uint16_t *)src[0])[i];
            for (int r = 1; r < n; r++)
                acc = ctpu_f32_to_bf16(ctpu_bf16_to_f32(acc) + ctpu_bf16_to_f32(((const uint16_t *)src[r])[i]));
            if (op == CTPU_DIST_MEAN) acc = ctpu_f32_to_bf16(ctpu_bf16_to_f32(acc) / (float)n);
            y[i] = acc;
        }
    } else { /* i32: wrapping adds, as ctpu_add on i32 (mean is refused at dispatch) */
        int32_t *y = dst;
        for (int64_t i = 0; i < count; i++) {
            uint32_t acc = (uint32_t)((const int32_t *)src[0])[i];
            for (int r = 1; r < n; r++) acc += (uint32_t)((const int32_t *)src[r])[i];
            y[i] = (int32_t)acc;
        }
    }
}

/* ------------------------------------------------------------ state */
typedef struct {
    bool up;                      /* ctpu_dist_init ran (and MPI is initialised) */
    bool we_init_mpi;             /* MPI_Finalize at shutdown */
    int rank, size, local_rank, local_size;
    double timeout_s;
    /* what the device thread is doing, for the SIGTERM line */
    _Atomic int cur_kind;         /* -1: not in a collective */
    _Atomic int64_t cur_bucket, cur_step;
    _Atomic int64_t last_step;
    _Atomic uint64_t busy_ns;     /* wall time inside ctpu__dist_run, all collectives of the process */
    bool force_one_round;         /* test hook: the one-round all_reduce at any size */
#ifdef CTPU_HAVE_MPI
    MPI_Comm comm;
#endif
} dist_state;

static dist_state g_dist = { .rank = 0, .size = 1, .local_rank = 0, .local_size = 1, .timeout_s = 300,
                             .cur_kind = -1, .cur_bucket = -1 };

int ctpu__dist_local_size(void) { return g_dist.up ? g_dist.local_size : 1; }
uint64_t ctpu__dist_busy_ns(void) { return atomic_load(&g_dist.busy_ns); }

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
void ctpu__dist_test_one_round(bool on) { g_dist.force_one_round = on; }
int ctpu_dist_rank(void) { return g_dist.up ? g_dist.rank : 0; }
int ctpu_dist_world_size(void) { return g_dist.up ? g_dist.size : 1; }
int ctpu_dist_local_rank(void) { return g_dist.up ? g_dist.local_rank : 0; }
int ctpu_dist_local_size(void) { return g_dist.up ? g_dist.local_size : 1; }
bool ctpu_dist_is_initialized(void) { return g_dist.up; }

bool ctpu_dist_available(void)
{
#ifdef CTPU_HAVE_MPI
    return true;
#else
    return false;
#endif
}

/* ------------------------------------------------------------ SIGTERM */
static size_t fmt_i64(char *p, int64_t v)
{
    char t[24];
    size_t n = 0;
    bool neg = v < 0;
    uint64_t u = neg ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do { t[n++] = (char)('0' + u % 10); u /= 10; } while (u);
    size_t k = 0;
    if (neg) p[k++] = '-';
    while (n) p[k++] = t[--n];
    return k;
}

static size_t put_str(char *p, const char *s)
{
    size_t n = strlen(s);
    memcpy(p, s, n);
    return n;
}

/* async-signal-safe: write(2) and raise(3) only */
static void on_sigterm(int sig)
{
    char line[256];
    size_t k = put_str(line, "ctpu: rank ");
    k += fmt_i64(line + k, g_dist.rank);
    int kind = atomic_load(&g_dist.cur_kind);
    if (kind >= 0) {
        k += put_str(line + k, ": stopped in ");
        k += put_str(line + k, ctpu__coll_name(kind));
        int64_t b = atomic_load(&g_dist.cur_bucket);
        k += put_str(line + k, " (");
        if (b >= 0) {
            k += put_str(line + k, "bucket ");
            k += fmt_i64(line + k, b);
            k += put_str(line + k, ", ");
        }
        k += put_str(line + k, "step ");
        k += fmt_i64(line + k, atomic_load(&g_dist.cur_step));
        k += put_str(line + k, ")\n");
    } else {
        k += put_str(line + k, ": stopped outside any collective (after step ");
        k += fmt_i64(line + k, atomic_load(&g_dist.last_step));
        k += put_str(line + k, ")\n");
    }
    ssize_t w = write(STDERR_FILENO, line, k);
    (void)w;
    signal(sig, SIG_DFL);
    raise(sig);
}

/* ------------------------------------------------------------ lifecycle */
static bool parse_timeout(char *err, size_t len)
{
    const char *v = getenv("CTPU_DIST_TIMEOUT");
    g_dist.timeout_s = 300;
    if (!v) return true;
    char *end;
    errno = 0;
    double t = strtod(v, &end);
    if (errno || end == v || *end || !(t > 0) || t > 1e7) {
        snprintf(err, len, "ctpu_dist_init: CTPU_DIST_TIMEOUT=\"%s\" must be a positive number of seconds", v);
        return false;
    }
    g_dist.timeout_s = t;
    return true;
}

ctpu_status ctpu__dist_start(char *err, size_t len)
{
    if (g_dist.up) {
        snprintf(err, len, "ctpu_dist_init: already initialised (call ctpu_dist_shutdown first)");
        return CTPU_ERR_STATE;
    }
    if (!parse_timeout(err, len)) return CTPU_ERR_ENV;
#ifdef CTPU_HAVE_MPI
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) {
        snprintf(err, len, "ctpu_dist_init: MPI was finalised in this process (MPI cannot start twice)");
        return CTPU_ERR_STATE;
    }
    int provided = 0;
    if (!inited) {
        /* the device thread makes every MPI call after this one: serialized */
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
            snprintf(err, len, "ctpu_dist_init: MPI_Init_thread failed");
            return CTPU_ERR_STATE;
        }
        g_dist.we_init_mpi = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        snprintf(err, len, "ctpu_dist_init: the MPI library gives thread level %d, below MPI_THREAD_SERIALIZED "
                 "(the device thread makes the MPI calls)", provided);
        if (g_dist.we_init_mpi) MPI_Finalize();
        g_dist.we_init_mpi = false;
        return CTPU_ERR_STATE;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &g_dist.comm);
    /* errors come back as codes (the default handler aborts without a word
     * about which collective) */
    MPI_Comm_set_errhandler(g_dist.comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g_dist.comm, &g_dist.rank);
    MPI_Comm_size(g_dist.comm, &g_dist.size);
    MPI_Comm local;
    MPI_Comm_split_type(g_dist.comm, MPI_COMM_TYPE_SHARED, g_dist.rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &g_dist.local_rank);
    MPI_Comm_size(local, &g_dist.local_size);
    MPI_Comm_free(&local);
#else
    /* no MPI in this build: one process is the whole world, unless a
     * launcher says otherwise (then refuse, rather than train N copies) */
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE");
    if (!ws) ws = getenv("PMI_SIZE");
    if (ws && atoi(ws) > 1) {
        snprintf(err, len, "ctpu_dist_init: launched with world size %s, but this ctpu was built without MPI "
                 "(meson -Dmpi=enabled with libopenmpi-dev)", ws);
        return CTPU_ERR_STATE;
    }
    g_dist.rank = 0;
    g_dist.size = 1;
    g_dist.local_rank = 0;
    g_dist.local_size = 1;
#endif
    atomic_store(&g_dist.cur_kind, -1);
    atomic_store(&g_dist.last_step, 0);
    g_dist.up = true;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    return CTPU_OK;
}

static void async_stop(void);

void ctpu__dist_stop(void)
{
    if (!g_dist.up) return;
    async_stop();
    signal(SIGTERM, SIG_DFL);
#ifdef CTPU_HAVE_MPI
    MPI_Comm_free(&g_dist.comm);
    if (g_dist.we_init_mpi) MPI_Finalize();
    g_dist.we_init_mpi = false;
#endif
    g_dist.up = false;
    g_dist.rank = 0;
    g_dist.size = 1;
    g_dist.local_rank = 0;
    g_dist.local_size = 1;
}

/* ------------------------------------------------------------ types */
static size_t elem_size(int dtype) { return dtype == CTPU_BF16 ? 2 : 4; }

static int64_t numel_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

/* One world of one rank: the collective's meaning with N = 1. */
static void run_single(const ctpu_coll_call *c)
{
    size_t bytes = (size_t)numel_of(c->ndim, c->shape) * elem_size(c->dtype);
    if (bytes) memcpy(c->out, c->in, bytes);
}

#ifdef CTPU_HAVE_MPI
static void fmt_type(char *buf, size_t len, int dtype, int ndim, const int64_t *shape)
{
    const char *dn = dtype == CTPU_F32 ? "f32" : dtype == CTPU_BF16 ? "bf16" : dtype == CTPU_I32 ? "i32" : "?";
    size_t k = (size_t)snprintf(buf, len, "%s[", dn);
    for (int d = 0; d < ndim && k < len; d++)
        k += (size_t)snprintf(buf + k, len - k, d ? ",%lld" : "%lld", (long long)shape[d]);
    if (k < len) snprintf(buf + k, len - k, "]");
}

/* ------------------------------------------------------------ polling */
static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Wait for a request. Open MPI moves a non-blocking collective's fragments
 * only inside MPI_Test, so for the first 20 ms the rank tests continuously,
 * yielding the core between tests (the other ranks are usually close, and a
 * sleep costs ~60 us of timer slack per fragment); after that it sleeps
 * 200 us between tests, leaving the cores to the ranks still computing.
 * Past the timeout the whole job ends: MPI_Abort, naming the collective. */
static int wait_req(MPI_Request *rq, const ctpu_coll_call *c, const char *phase)
{
    double t0 = mono_s();
    for (long it = 0;; it++) {
        int flag = 0;
        int rc = MPI_Test(rq, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return rc;
        if (flag) return MPI_SUCCESS;
        if ((it & 63) != 63) {
            sched_yield();
            continue;
        }
        double el = mono_s() - t0;
        if (el > g_dist.timeout_s) {
            char b[64] = "";
            if (c->bucket >= 0) snprintf(b, sizeof b, "bucket %lld, ", (long long)c->bucket);
            fprintf(stderr, "ctpu: rank %d: %s (%sstep %lld) timed out in its %s after %.0f s (CTPU_DIST_TIMEOUT=%g): "
                    "another rank stopped calling collectives; calling MPI_Abort\n", g_dist.rank,
                    ctpu__coll_name(c->kind), b, (long long)c->step, phase, el, g_dist.timeout_s);
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, 124);
            _exit(124);
        }
        if (el > 0.02) {
            struct timespec ts = { 0, 200000 };
            nanosleep(&ts, NULL);
        }
    }
}

typedef struct {
    int32_t kind, op, dtype, ndim, root, dim;
    int64_t shape[8];
} meta_rec;

static ctpu_status mpi_fail(const ctpu_coll_call *c, int rc, const char *what, char *err, size_t errlen)
{
    char es[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, es, &n);
    snprintf(err, errlen, "%s: %s failed on rank %d: %s", ctpu__coll_name(c->kind), what, g_dist.rank, es);
    return CTPU_ERR_STATE;
}

static void meta_fill(const ctpu_coll_call *c, meta_rec *me)
{
    memset(me, 0, sizeof *me);
    me->kind = c->kind;
    me->op = c->op;
    me->dtype = c->dtype;
    me->ndim = c->ndim;
    me->root = c->root;
    me->dim = c->dim;
    for (int d = 0; d < c->ndim; d++) me->shape[d] = c->shape[d];
}

/* Every rank checks every rank's record the same way, so they agree on the
 * verdict. */
static ctpu_status meta_verify(const ctpu_coll_call *c, const meta_rec *all, char *err, size_t errlen)
{
    ctpu_status st = CTPU_OK;
    for (int r = 1; r < g_dist.size && st == CTPU_OK; r++) {
        const meta_rec *a = &all[0], *b = &all[r];
        if (a->kind != b->kind) {
            snprintf(err, errlen, "%s: rank 0 called %s, rank %d called %s (collectives out of order across ranks)",
                     ctpu__coll_name(c->kind), ctpu__coll_name(a->kind), r, ctpu__coll_name(b->kind));
            st = CTPU_ERR_STATE;
            break;
        }
        bool same_shape = a->ndim == b->ndim;
        for (int d = 0; same_shape && d < a->ndim; d++) same_shape = a->shape[d] == b->shape[d];
        if (!same_shape || a->dtype != b->dtype) {
            char ta[128], tb[128];
            fmt_type(ta, sizeof ta, a->dtype, a->ndim, a->shape);
            fmt_type(tb, sizeof tb, b->dtype, b->ndim, b->shape);
            snprintf(err, errlen, "%s: rank 0 has %s, rank %d has %s (%s differ across ranks)",
                     ctpu__coll_name(c->kind), ta, r, tb, same_shape ? "dtypes" : "shapes");
            st = same_shape ? CTPU_ERR_DTYPE : CTPU_ERR_SHAPE;
        } else if (a->op != b->op || a->root != b->root || a->dim != b->dim) {
            snprintf(err, errlen, "%s: rank 0 has op %d root %d dim %d, rank %d has op %d root %d dim %d "
                     "(arguments differ across ranks)", ctpu__coll_name(c->kind), a->op, a->root, a->dim, r,
                     b->op, b->root, b->dim);
            st = CTPU_ERR_INVALID_ARG;
        }
    }
    return st;
}

/* The metadata exchange before each collective. */
static ctpu_status check_meta(const ctpu_coll_call *c, char *err, size_t errlen)
{
    meta_rec me;
    meta_fill(c, &me);
    int n = g_dist.size;
    meta_rec *all = malloc(sizeof *all * (size_t)n);
    if (!all) {
        snprintf(err, errlen, "%s: out of host memory", ctpu__coll_name(c->kind));
        return CTPU_ERR_OOM;
    }
    MPI_Request rq;
    int rc = MPI_Iallgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, g_dist.comm, &rq);
    if (rc == MPI_SUCCESS) rc = wait_req(&rq, c, "shape exchange");
    if (rc != MPI_SUCCESS) {
        free(all);
        return mpi_fail(c, rc, "the shape exchange", err, errlen);
    }
    ctpu_status st = meta_verify(c, all, err, errlen);
    free(all);
    return st;
}

/* chunk c of count elements split in n parts: [lo, hi) */
static int64_t chunk_lo(int64_t count, int n, int c) { return count * c / n; }

/* The deterministic all_reduce (and reduce_scatter's first half): rank c
 * ends with chunk c folded in rank order, in `mine` (chunk-sized). */
static int exchange_and_fold(const ctpu_coll_call *c, const char *src, int64_t count, int64_t (*lo)(int64_t, int, int),
                             char *mine, int64_t *my_lo, int64_t *my_n)
{
    int n = g_dist.size, me = g_dist.rank;
    size_t es = elem_size(c->dtype);
    int64_t mlo = lo(count, n, me), mhi = lo(count, n, me + 1);
    int *scnt = malloc(sizeof(int) * (size_t)n * 4);
    char *recv = malloc((size_t)(mhi - mlo) * es * (size_t)n + 1);
    const void **blocks = malloc(sizeof(void *) * (size_t)n);
    if (!scnt || !recv || !blocks) {
        free(scnt);
        free(recv);
        free(blocks);
        return MPI_ERR_NO_MEM;
    }
    int *sdsp = scnt + n, *rcnt = scnt + 2 * n, *rdsp = scnt + 3 * n;
    for (int r = 0; r < n; r++) {
        int64_t l = lo(count, n, r), h = lo(count, n, r + 1);
        scnt[r] = (int)((h - l) * (int64_t)es);
        sdsp[r] = (int)(l * (int64_t)es);
        rcnt[r] = (int)((mhi - mlo) * (int64_t)es);
        rdsp[r] = (int)((int64_t)r * (mhi - mlo) * (int64_t)es);
    }
    MPI_Request rq;
    int rc = MPI_Ialltoallv(src, scnt, sdsp, MPI_BYTE, recv, rcnt, rdsp, MPI_BYTE, g_dist.comm, &rq);
    if (rc == MPI_SUCCESS) rc = wait_req(&rq, c, "exchange");
    if (rc == MPI_SUCCESS) {
        for (int r = 0; r < n; r++) blocks[r] = recv + (size_t)r * (size_t)(mhi - mlo) * es;
        ctpu__dist_fold(c->dtype, c->op, n, blocks, mhi - mlo, mine);
    }
    *my_lo = mlo;
    *my_n = mhi - mlo;
    free(scnt);
    free(recv);
    free(blocks);
    return rc;
}

/* Two ranks (or a small buffer): one round instead of two. Every rank gets
 * every rank's buffer (MPI_Iallgather) and folds all of it in rank order:
 * the same bits as the two-phase path, half the synchronisations (which is
 * what costs on a loaded machine), the same bytes at N = 2. */
static int all_reduce_one_round(const ctpu_coll_call *c, int64_t count)
{
    int n = g_dist.size;
    size_t bytes = (size_t)count * elem_size(c->dtype);
    char *recv = malloc(bytes * (size_t)n + 1);
    const void **blocks = malloc(sizeof(void *) * (size_t)n);
    if (!recv || !blocks) {
        free(recv);
        free(blocks);
        return MPI_ERR_NO_MEM;
    }
    MPI_Request rq;
    int rc = MPI_Iallgather(c->in, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, g_dist.comm, &rq);
    if (rc == MPI_SUCCESS) rc = wait_req(&rq, c, "gather");
    if (rc == MPI_SUCCESS) {
        for (int r = 0; r < n; r++) blocks[r] = recv + (size_t)r * bytes;
        ctpu__dist_fold(c->dtype, c->op, n, blocks, count, c->out);
    }
    free(recv);
    free(blocks);
    return rc;
}

static ctpu_status run_all_reduce(const ctpu_coll_call *c, char *err, size_t errlen)
{
    int n = g_dist.size;
    size_t es = elem_size(c->dtype);
    int64_t count = numel_of(c->ndim, c->shape);
    if ((uint64_t)count * es * (uint64_t)n > (uint64_t)INT32_MAX) {
        snprintf(err, errlen, "%s: %lld bytes is more than one MPI call moves here (2 GiB over the ranks)",
                 ctpu__coll_name(c->kind), (long long)((uint64_t)count * es));
        return CTPU_ERR_INVALID_ARG;
    }
    if (n == 2 || (uint64_t)count * es * (uint64_t)n <= (256u << 10) || g_dist.force_one_round) {
        int rc1 = all_reduce_one_round(c, count);
        return rc1 == MPI_SUCCESS ? CTPU_OK : mpi_fail(c, rc1, "the gather", err, errlen);
    }
    char *mine = malloc((size_t)(count / n + 1) * es);
    int *cnt = malloc(sizeof(int) * (size_t)n * 2);
    if (!mine || !cnt) {
        free(mine);
        free(cnt);
        snprintf(err, errlen, "%s: out of host memory", ctpu__coll_name(c->kind));
        return CTPU_ERR_OOM;
    }
    int64_t mlo, mn;
    int rc = exchange_and_fold(c, c->in, count, chunk_lo, mine, &mlo, &mn);
    if (rc == MPI_SUCCESS) {
        int *dsp = cnt + n;
        for (int r = 0; r < n; r++) {
            int64_t l = chunk_lo(count, n, r), h = chunk_lo(count, n, r + 1);
            cnt[r] = (int)((h - l) * (int64_t)es);
            dsp[r] = (int)(l * (int64_t)es);
        }
        MPI_Request rq;
        rc = MPI_Iallgatherv(mine, (int)(mn * (int64_t)es), MPI_BYTE, c->out, cnt, dsp, MPI_BYTE, g_dist.comm, &rq);
        if (rc == MPI_SUCCESS) rc = wait_req(&rq, c, "gather");
    }
    free(mine);
    free(cnt);
    return rc == MPI_SUCCESS ? CTPU_OK : mpi_fail(c, rc, "the data exchange", err, errlen);
}

/* outer x extent(dim) x inner view of the input */
static void split_dims(const ctpu_coll_call *c, int64_t *outer, int64_t *ext, int64_t *inner)
{
    *outer = 1;
    *inner = 1;
    for (int d = 0; d < c->dim; d++) *outer *= c->shape[d];
    for (int d = c->dim + 1; d < c->ndim; d++) *inner *= c->shape[d];
    *ext = c->ndim ? c->shape[c->dim] : 1;
}

static ctpu_status run_all_gather(const ctpu_coll_call *c, char *err, size_t errlen)
{
    int n = g_dist.size;
    size_t es = elem_size(c->dtype);
    int64_t count = numel_of(c->ndim, c->shape);
    size_t bytes = (size_t)count * es;
    if ((uint64_t)bytes * (uint64_t)n > (uint64_t)INT32_MAX) {
        snprintf(err, errlen, "%s: %llu bytes is more than one MPI call moves here (2 GiB)", ctpu__coll_name(c->kind),
                 (unsigned long long)bytes * (unsigned long long)n);
        return CTPU_ERR_INVALID_ARG;
    }
    char *recv = malloc(bytes * (size_t)n + 1);
    if (!recv) {
        snprintf(err, errlen, "%s: out of host memory", ctpu__coll_name(c->kind));
        return CTPU_ERR_OOM;
    }
    MPI_Request rq;
    int rc = MPI_Iallgather(c->in, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, g_dist.comm, &rq);
    if (rc == MPI_SUCCESS) rc = wait_req(&rq, c, "gather");
    if (rc == MPI_SUCCESS) {
        /* out[o][r*ext + e][i] = rank r's in[o][e][i] */
        int64_t outer, ext, inner;
        split_dims(c, &outer, &ext, &inner);
        size_t row = (size_t)(ext * inner) * es;
        for (int64_t o = 0; o < outer; o++)
            for (int r = 0; r < n; r++)
                memcpy((char *)c->out + ((size_t)o * (size_t)n + (size_t)r) * row,
                       recv + (size_t)r * bytes + (size_t)o * row, row);
    }
    free(recv);
    return rc == MPI_SUCCESS ? CTPU_OK : mpi_fail(c, rc, "the gather", err, errlen);
}

static ctpu_status run_reduce_scatter(const ctpu_coll_call *c, char *err, size_t errlen)
{
    int n = g_dist.size;
    size_t es = elem_size(c->dtype);
    int64_t count = numel_of(c->ndim, c->shape);
    if ((uint64_t)count * es > (uint64_t)INT32_MAX) {
        snprintf(err, errlen, "%s: %lld bytes is more than one MPI call moves here (2 GiB)", ctpu__coll_name(c->kind),
                 (long long)((uint64_t)count * es));
        return CTPU_ERR_INVALID_ARG;
    }
    /* pack so that chunk r (rank r's slice along dim) is contiguous */
    int64_t outer, ext, inner;
    split_dims(c, &outer, &ext, &inner);
    int64_t part = ext / n;
    size_t prow = (size_t)(part * inner) * es;
    char *packed = malloc((size_t)count * es + 1);
    char *mine = malloc((size_t)(count / n) * es + 1);
    if (!packed || !mine) {
        free(packed);
        free(mine);
        snprintf(err, errlen, "%s: out of host memory", ctpu__coll_name(c->kind));
        return CTPU_ERR_OOM;
    }
    for (int r = 0; r < n; r++)
        for (int64_t o = 0; o < outer; o++)
            memcpy(packed + ((size_t)r * (size_t)outer + (size_t)o) * prow,
                   (const char *)c->in + ((size_t)o * (size_t)n + (size_t)r) * prow, prow);
    int64_t mlo, mn;
    int rc = exchange_and_fold(c, packed, count, chunk_lo, mine, &mlo, &mn);
    if (rc == MPI_SUCCESS) memcpy(c->out, mine, (size_t)mn * es);
    free(packed);
    free(mine);
    return rc == MPI_SUCCESS ? CTPU_OK : mpi_fail(c, rc, "the exchange", err, errlen);
}

static ctpu_status run_broadcast(const ctpu_coll_call *c, char *err, size_t errlen)
{
    size_t bytes = (size_t)numel_of(c->ndim, c->shape) * elem_size(c->dtype);
    if ((uint64_t)bytes > (uint64_t)INT32_MAX) {
        snprintf(err, errlen, "%s: %zu bytes is more than one MPI call moves here (2 GiB)", ctpu__coll_name(c->kind),
                 bytes);
        return CTPU_ERR_INVALID_ARG;
    }
    if (g_dist.rank == c->root && bytes) memcpy(c->out, c->in, bytes);
    MPI_Request rq;
    int rc = MPI_Ibcast(c->out, (int)bytes, MPI_BYTE, c->root, g_dist.comm, &rq);
    if (rc == MPI_SUCCESS) rc = wait_req(&rq, c, "broadcast");
    return rc == MPI_SUCCESS ? CTPU_OK : mpi_fail(c, rc, "the broadcast", err, errlen);
}
#endif /* CTPU_HAVE_MPI */

/* One collective now, on the calling thread (the device thread, or the
 * comm thread for a started all_reduce), with what it is doing published
 * for the SIGTERM line. */
static ctpu_status run_now(const ctpu_coll_call *c, char *err, size_t errlen)
{
    atomic_store(&g_dist.cur_bucket, c->bucket);
    atomic_store(&g_dist.cur_step, c->step);
    atomic_store(&g_dist.last_step, c->step);
    atomic_store(&g_dist.cur_kind, c->kind);
    ctpu_status st = CTPU_OK;
    (void)err;
    (void)errlen;
#ifdef CTPU_HAVE_MPI
    if (g_dist.up && g_dist.size > 1) {
        st = check_meta(c, err, errlen);
        if (st == CTPU_OK) {
            switch (c->kind) {
            case CTPU_COLL_ALL_REDUCE: st = run_all_reduce(c, err, errlen); break;
            case CTPU_COLL_BROADCAST: st = run_broadcast(c, err, errlen); break;
            case CTPU_COLL_ALL_GATHER: st = run_all_gather(c, err, errlen); break;
            case CTPU_COLL_REDUCE_SCATTER: st = run_reduce_scatter(c, err, errlen); break;
            default: snprintf(err, errlen, "collective %d is unknown", c->kind); st = CTPU_ERR_STATE; break;
            }
        }
    } else
#endif
    {
        run_single(c);
    }
    atomic_store(&g_dist.cur_kind, -1);
    return st;
}

/* ------------------------------------------------------------ started all_reduces
 * Overlap (ctpu_all_reduce_async): the device thread starts an all_reduce
 * (its input copied into a buffer of the request, so no device memory is
 * touched behind the device's back) and goes on with the next commands.
 * Open MPI moves a non-blocking collective only inside MPI calls, so the
 * device thread itself advances the started requests between the steps of
 * its programs, after each command and while idle (ctpu_device_set_progress:
 * one MPI_Test per call, the next MPI call posted when one completes): the
 * waiting for the other ranks, which is what a collective costs here, runs
 * under the backward's compute. A request is the metadata exchange, then
 * one MPI_Iallgather of the whole buffer and the same rank-order left fold
 * as the blocking path (so the same bits; at N > 2 it receives (N-1) x the
 * buffer instead of the two-phase path's 2(N-1)/N). Requests run one at a
 * time in start order, which is the same on every rank, and a blocking
 * collective first finishes every started one. Only the device thread
 * calls MPI. At the consumer (ctpu_all_reduce_wait) the device thread
 * tests the request until it is done, against CTPU_DIST_TIMEOUT, and copies
 * the result out. Requests are found by key: the started value's device
 * address, unique while the request is pending (the wait reads it). */
typedef struct areq {
    struct areq *next;
    const void *key;
    ctpu_coll_call c;      /* in: the copy below; out: the result below */
    char *buf;             /* the input's copy, then the result */
    size_t bytes;
    int stage;             /* 0 queued, 1 metadata exchange in flight, 2 gather in flight, 3 done */
#ifdef CTPU_HAVE_MPI
    MPI_Request rq;
    meta_rec me, *all;     /* the metadata exchange */
    char *recv;            /* the gather: every rank's buffer */
#endif
    uint64_t t_post;
    ctpu_status st;
    char err[512];
} areq;

static struct {
    areq *head;               /* started and not yet waited, in start order (device thread only) */
    int undone;               /* started, not finished */
    _Atomic uint64_t flight_ns, exposed_ns, n_async;
} g_as;

static bool distributed(void) { return g_dist.up && g_dist.size > 1; }

static void req_finish(areq *q, ctpu_status st)
{
    q->st = st;
    q->stage = 3;
    g_as.undone--;
    atomic_fetch_add(&g_as.flight_ns, mono_ns() - q->t_post);
    atomic_store(&g_dist.cur_kind, -1);
}

#ifdef CTPU_HAVE_MPI

/* One step of the oldest unfinished request: post its next MPI call, or
 * test the one in flight and go on when it completed. True: it moved. */
static bool req_step(areq *q)
{
    int n = g_dist.size, flag = 0, rc = MPI_SUCCESS;
    if (q->stage == 0) {
        atomic_store(&g_dist.cur_bucket, q->c.bucket);
        atomic_store(&g_dist.cur_step, q->c.step);
        atomic_store(&g_dist.last_step, q->c.step);
        atomic_store(&g_dist.cur_kind, q->c.kind);
        q->all = malloc(sizeof *q->all * (size_t)n);
        q->recv = malloc(q->bytes * (size_t)n + 1);
        if (!q->all || !q->recv) {
            snprintf(q->err, sizeof q->err, "%s: out of host memory", ctpu__coll_name(q->c.kind));
            req_finish(q, CTPU_ERR_OOM);
            return true;
        }
        meta_fill(&q->c, &q->me);
        rc = MPI_Iallgather(&q->me, (int)sizeof q->me, MPI_BYTE, q->all, (int)sizeof q->me, MPI_BYTE, g_dist.comm,
                            &q->rq);
        if (rc == MPI_SUCCESS) q->stage = 1;
    } else {
        rc = MPI_Test(&q->rq, &flag, MPI_STATUS_IGNORE);
        if (rc == MPI_SUCCESS && !flag) return false;
        if (rc == MPI_SUCCESS && q->stage == 1) {
            ctpu_status st = meta_verify(&q->c, q->all, q->err, sizeof q->err);
            if (st != CTPU_OK) {
                req_finish(q, st);
                return true;
            }
            rc = MPI_Iallgather(q->c.in, (int)q->bytes, MPI_BYTE, q->recv, (int)q->bytes, MPI_BYTE, g_dist.comm,
                                &q->rq);
            if (rc == MPI_SUCCESS) q->stage = 2;
        } else if (rc == MPI_SUCCESS) {
            const void **bl = malloc(sizeof(void *) * (size_t)n);
            if (!bl) {
                snprintf(q->err, sizeof q->err, "%s: out of host memory", ctpu__coll_name(q->c.kind));
                req_finish(q, CTPU_ERR_OOM);
                return true;
            }
            for (int r = 0; r < n; r++) bl[r] = q->recv + (size_t)r * q->bytes;
            ctpu__dist_fold(q->c.dtype, q->c.op, n, bl, numel_of(q->c.ndim, q->c.shape), q->c.out);
            free(bl);
            req_finish(q, CTPU_OK);
            return true;
        }
    }
    if (rc != MPI_SUCCESS) req_finish(q, mpi_fail(&q->c, rc, "the started all_reduce", q->err, sizeof q->err));
    return true;
}
#endif

/* Advance the started requests as far as they go without waiting. */
static void async_progress(void)
{
#ifdef CTPU_HAVE_MPI
    for (areq *q = g_as.head; q && g_as.undone > 0; q = q->next) {
        if (q->stage == 3) continue;
        while (q->stage != 3 && req_step(q)) {}
        if (q->stage != 3) return;   /* in flight: one request at a time */
    }
#endif
}

static void progress_hook(void)
{
    if (g_as.undone > 0) async_progress();
}

/* Until q (NULL: every started request) is done: test, yield, then sleep
 * as wait_req does; past CTPU_DIST_TIMEOUT, MPI_Abort naming it. */
static void async_wait(areq *q)
{
    double t0 = mono_s();
    for (long it = 0;; it++) {
        async_progress();
        if (q ? q->stage == 3 : g_as.undone == 0) return;
        if ((it & 63) != 63) {
            sched_yield();
            continue;
        }
        double el = mono_s() - t0;
        if (el > g_dist.timeout_s) {
            const areq *h = g_as.head;
            while (h && h->stage == 3) h = h->next;
            const ctpu_coll_call *c = h ? &h->c : &q->c;
            char b[64] = "";
            if (c->bucket >= 0) snprintf(b, sizeof b, "bucket %lld, ", (long long)c->bucket);
            fprintf(stderr, "ctpu: rank %d: %s (%sstep %lld) timed out in its started exchange after %.0f s "
                    "(CTPU_DIST_TIMEOUT=%g): another rank stopped calling collectives; calling MPI_Abort\n",
                    g_dist.rank, ctpu__coll_name(c->kind), b, (long long)c->step, el, g_dist.timeout_s);
            fflush(stderr);
#ifdef CTPU_HAVE_MPI
            MPI_Abort(MPI_COMM_WORLD, 124);
#endif
            _exit(124);
        }
        if (el > 0.02) {
            struct timespec ts = { 0, 200000 };
            nanosleep(&ts, NULL);
        }
    }
}

static void req_free(areq *q)
{
#ifdef CTPU_HAVE_MPI
    free(q->all);
    free(q->recv);
#endif
    free(q->buf);
    free(q);
}

ctpu_status ctpu__dist_start_async(const ctpu_coll_call *c, const void *key, char *err, size_t errlen)
{
    uint64_t t0 = mono_ns();
    size_t bytes = (size_t)numel_of(c->ndim, c->shape) * elem_size(c->dtype);
    if (c->kind != CTPU_COLL_ALL_REDUCE) {
        snprintf(err, errlen, "%s: only all_reduce is started without waiting", ctpu__coll_name(c->kind));
        return CTPU_ERR_STATE;
    }
    if (!distributed()) {   /* one rank: the started value is the result */
        if (bytes && c->out != c->in) memcpy(c->out, c->in, bytes);
        return CTPU_OK;
    }
    if ((uint64_t)bytes * (uint64_t)g_dist.size > (uint64_t)INT32_MAX) {
        snprintf(err, errlen, "%s: %zu bytes is more than one MPI call moves here (2 GiB over the ranks)",
                 ctpu__coll_name(c->kind), bytes);
        return CTPU_ERR_INVALID_ARG;
    }
    areq *q = calloc(1, sizeof *q);
    char *buf = q ? malloc(2 * bytes + 1) : NULL;
    if (!buf) {
        free(q);
        snprintf(err, errlen, "%s: out of host memory", ctpu__coll_name(c->kind));
        return CTPU_ERR_OOM;
    }
    if (bytes) {
        memcpy(buf, c->in, bytes);
        if (c->out != c->in) memcpy(c->out, c->in, bytes);   /* the started value: this rank's own */
    }
    q->key = key;
    q->c = *c;
    q->c.in = buf;
    q->c.out = buf + bytes;
    q->buf = buf;
    q->bytes = bytes;
    q->t_post = t0;
    areq **pp = &g_as.head;
    while (*pp) pp = &(*pp)->next;
    *pp = q;
    g_as.undone++;
    atomic_fetch_add(&g_as.n_async, 1);
    ctpu_device_set_progress(progress_hook);
    async_progress();   /* post it now when nothing is ahead of it */
    atomic_fetch_add(&g_dist.busy_ns, mono_ns() - t0);
    return CTPU_OK;
}

ctpu_status ctpu__dist_wait_async(const void *key, const void *in, void *out, size_t bytes, const char *name,
                                  char *err, size_t errlen)
{
    uint64_t t0 = mono_ns();
    if (!distributed()) {
        if (bytes && out != in) memcpy(out, in, bytes);
        return CTPU_OK;
    }
    areq **pp = &g_as.head;
    while (*pp && (*pp)->key != key) pp = &(*pp)->next;
    areq *q = *pp;
    if (!q) {
        snprintf(err, errlen, "%s: no started all_reduce holds this value (waited twice?)", name);
        return CTPU_ERR_STATE;
    }
    async_wait(q);
    *pp = q->next;
    uint64_t waited = mono_ns() - t0;
    atomic_fetch_add(&g_as.exposed_ns, waited);
    atomic_fetch_add(&g_dist.busy_ns, waited);
    ctpu_status st = q->st;
    if (st == CTPU_OK && bytes == q->bytes) {
        if (bytes) memcpy(out, q->buf + q->bytes, bytes);
    } else {
        if (st == CTPU_OK) {
            snprintf(q->err, sizeof q->err, "%s: the started value has %zu bytes, the wait %zu", name, q->bytes, bytes);
            st = CTPU_ERR_STATE;
        }
        snprintf(err, errlen, "%s", q->err);
    }
    req_free(q);
    return st;
}

void ctpu__dist_overlap(ctpu_dist_overlap_ns *o)
{
    o->started = atomic_load(&g_as.n_async);
    o->in_flight_ns = atomic_load(&g_as.flight_ns);
    o->exposed_ns = atomic_load(&g_as.exposed_ns);
}

/* At ctpu__dist_stop (the device is gone: this thread is the only one
 * left): finish every started request (the other ranks take part in it),
 * drop those never waited. */
static void async_stop(void)
{
    ctpu_device_set_progress(NULL);
    if (g_as.undone > 0) async_wait(NULL);
    while (g_as.head) {
        areq *q = g_as.head;
        g_as.head = q->next;
        req_free(q);
    }
    g_as.undone = 0;
}

ctpu_status ctpu__dist_run(const ctpu_coll_call *c, char *err, size_t errlen)
{
    uint64_t t0 = mono_ns();
    if (g_as.undone > 0) {   /* collectives run in the order they were made: started ones first */
        async_wait(NULL);
        atomic_fetch_add(&g_as.exposed_ns, mono_ns() - t0);
    }
    ctpu_status st = run_now(c, err, errlen);
    atomic_fetch_add(&g_dist.busy_ns, mono_ns() - t0);
    return st;
}
