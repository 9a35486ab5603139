/* Runtime lifecycle: per-thread state, errors, the environment (env.h), modes, chip, metrics API. */
#include <ctype.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "eager.h"
#include "env.h"
#include "policy.h"
#include "testing.h"
#include "report.h"
#include "device/tracefile.h"
#include "dist/dist.h"

ctpu_runtime *ctpu_rt = NULL;
static pthread_mutex_t init_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t epoch_counter = 0;

/* ------------------------------------------------------------ per-thread state */
static const ctpu_thread_state ts_none = { .mode_override = -1 };   /* never written */
_Thread_local ctpu_thread_state *ctpu__ts __attribute__((tls_model("initial-exec"))) =
    (ctpu_thread_state *)&ts_none;

static pthread_once_t ts_once = PTHREAD_ONCE_INIT;
static pthread_key_t ts_key;
static bool ts_key_ok;

/* Drop the runtime-bound parts of s; rt is the runtime they belong to
 * while it lives (an unfinished trace gives its input buffers back, the
 * strict front its program references), NULL when that runtime is gone
 * (its buffers and programs went with it). */
static void ts_drop(ctpu_thread_state *s, const ctpu_runtime *rt)
{
    ctpu_device *dev = rt ? rt->dev : NULL;
    ctpu__slots_drop(s, rt ? ctpu_rt : NULL);
    for (int i = 0; i < CTPU_MAX_SCOPES; i++) free(s->scopes[i].items);
    memset(s->scopes, 0, sizeof s->scopes);
    s->scope_depth = 0;
    if (s->df.rec) ctpu_trace_rec_destroy(s->df.rec, dev);
    free(s->df.holders);
    free(s->df.suffix);
    free(s->df.made);
    free(s->df.in_dyn);
    for (int i = 0; i < s->df.n_amem; i++) free(s->df.amem[i].in);
    free(s->df.amem);
    free(s->df.node_dyn);
    free(s->df.in_has_dyn);
    free(s->df.node_has_dyn);
    memset(&s->df, 0, sizeof s->df);
    s->dyn_out_set = false;
    s->quiet_errors = 0;
    ctpu__strict_front_free(s->strict_front, rt ? rt->strict_cache : NULL);
    s->strict_front = NULL;
    s->cap = NULL;
    s->no_grad = 0;
    s->mode_override = -1;
    memset(&s->label, 0, sizeof s->label);
    memset(&s->user, 0, sizeof s->user);
    s->epoch = 0;
}

/* Thread exit (the key's destructor): the state goes with its thread. */
static void ts_thread_exit(void *p)
{
    ctpu_thread_state *s = p;
    ctpu_runtime *rt = ctpu_rt;
    ts_drop(s, rt && s->epoch == rt->epoch ? rt : NULL);
    free(s);
    ctpu__ts = (ctpu_thread_state *)&ts_none;
}

static void ts_key_create(void) { ts_key_ok = pthread_key_create(&ts_key, ts_thread_exit) == 0; }

ctpu_thread_state *ctpu__ts_get(void)
{
    ctpu_thread_state *s = ctpu__ts;
    if (s != &ts_none) return s;
    pthread_once(&ts_once, ts_key_create);
    if (!ts_key_ok || !(s = calloc(1, sizeof *s))) return NULL;
    s->mode_override = -1;
    if (pthread_setspecific(ts_key, s) != 0) {
        free(s);
        return NULL;
    }
    ctpu__ts = s;
    return s;
}

ctpu_thread_state *ctpu__ts_bind(void)
{
    ctpu_thread_state *s = ctpu__ts_get();
    if (s && !ctpu__ts_bound(s, ctpu_rt)) {
        ts_drop(s, NULL);          /* a previous runtime's parts (or none yet) */
        s->epoch = ctpu_rt->epoch;
    }
    return s;
}

void ctpu__ts_drop_runtime(void)
{
    ctpu_thread_state *s = ctpu_ts_current();
    if (s) ts_drop(s, ctpu_rt);
}

/* ------------------------------------------------------------ guarded calls */
/* Threads inside a call that runs long or calls back (a compiled call,
 * backward, sync, a host read): process-wide, not the runtime's, so a
 * shutdown sees them before it frees the runtime. A call and a shutdown
 * meet as in Dekker's algorithm (both sequentially consistent): either the
 * call sees calls_closing and waits for the shutdown to decide, or the
 * shutdown sees the call and refuses. */
static atomic_int calls_busy;
static atomic_bool calls_closing;
static _Thread_local bool closing_self;   /* this thread runs the shutdown: its own calls pass */

bool ctpu__call_enter(const char *op)
{
    atomic_fetch_add(&calls_busy, 1);
    while (atomic_load(&calls_closing) && !closing_self) {
        atomic_fetch_sub(&calls_busy, 1);
        while (atomic_load(&calls_closing)) sched_yield();
        atomic_fetch_add(&calls_busy, 1);
    }
    if (ctpu_rt) return true;
    atomic_fetch_sub(&calls_busy, 1);
    ctpu_check_init(op);
    return false;
}

void ctpu__call_exit(void) { atomic_fetch_sub(&calls_busy, 1); }
int ctpu__test_calls_busy(void) { return atomic_load(&calls_busy); }

ctpu_status ctpu_compiled_call(ctpu_compiled *c, int n_in, const ctpu_tensor *in, int n_scalars, const double *scalars,
                               int n_out, ctpu_tensor *out)
{
    if (!ctpu__call_enter("compiled_call")) {
        for (int j = 0; out && j < n_out && j <= 4096; j++) out[j] = CTPU_NULL;
        return CTPU_ERR_NOT_INITIALIZED;
    }
    ctpu_status st = ctpu__compiled_call(c, n_in, in, n_scalars, scalars, n_out, out);
    ctpu__call_exit();
    return st;
}

/* ------------------------------------------------------------ user frames */
void ctpu__user_enter(ctpu_user_frame *f, const char *op, const char *what)
{
    ctpu_thread_state *s = ctpu_ts();
    f->entered = s != NULL;   /* out of host memory: no floors, as before */
    if (!s) return;
    f->op = op;
    f->what = what;
    f->scope = s->user.scope;
    f->no_grad = s->user.no_grad;
    f->label = s->user.label;
    f->call = s->user.call;
    f->prev_what = s->user.what;
    memcpy(f->prev_bad, s->user.bad, sizeof f->prev_bad);
    s->user.scope = s->scope_depth;
    s->user.no_grad = s->no_grad;
    s->user.label = s->label.depth;
    s->user.call = s->label.call_depth;
    s->user.what = what;
    s->user.bad[0] = 0;
    s->user.depth++;
    atomic_fetch_add(&ctpu_rt->user_frames, 1);
}

bool ctpu__user_underflow(ctpu_thread_state *s, int depth, int floor, const char *op, const char *name,
                          const char *push)
{
    if (depth > floor || s->user.depth == 0) return false;   /* top level: the pop's own "none open" error */
    ctpu_set_error(CTPU_ERR_STATE, "%s: inside %s, no %s of its own is open (those open belong to its caller): "
                   "a pop without its %s; refused", op, s->user.what, name, push);
    if (!s->user.bad[0])
        snprintf(s->user.bad, sizeof s->user.bad, "called %s with no %s of its own open (a pop without its %s; "
                 "refused)", op, name, push);
    return true;
}

/* "2 scopes", appended to buf at *k when n > 0 */
static void user_left(char *buf, size_t len, size_t *k, int n, const char *one, const char *many, const char *why)
{
    if (n <= 0 || *k >= len) return;
    *k += (size_t)snprintf(buf + *k, len - *k, "%s%d %s (%s)", *k ? ", " : "", n, n == 1 ? one : many, why);
}

ctpu_status ctpu__user_exit(ctpu_user_frame *f, ctpu_status st)
{
    if (!f->entered) return st;
    ctpu_thread_state *s = ctpu__ts;   /* still bound: shutdown is refused inside a frame */
    char left[256] = "", bad[200];
    size_t k = 0;
    user_left(left, sizeof left, &k, ctpu__scopes_unwind(s, s->user.scope), "scope", "scopes",
              "a scope or step begin without its end");
    user_left(left, sizeof left, &k, s->no_grad - s->user.no_grad, "no-grad region", "no-grad regions",
              "ctpu_no_grad_begin without ctpu_no_grad_end");
    user_left(left, sizeof left, &k, s->label.depth - s->user.label, "label", "labels",
              "ctpu_label_push without ctpu_label_pop");
    user_left(left, sizeof left, &k, s->label.call_depth - s->user.call, "call scope", "call scopes",
              "ctpu_call_push without ctpu_call_pop");
    s->no_grad = s->user.no_grad;
    s->label.depth = s->user.label;
    s->label.call_depth = s->user.call;
    if (s->user.call == 0) {
        s->label.call = 0;
        s->label.call_name = NULL;
    }
    memcpy(bad, s->user.bad, sizeof bad);
    s->user.scope = f->scope;
    s->user.no_grad = f->no_grad;
    s->user.label = f->label;
    s->user.call = f->call;
    s->user.what = f->prev_what;
    memcpy(s->user.bad, f->prev_bad, sizeof s->user.bad);
    s->user.depth--;
    atomic_fetch_sub(&ctpu_rt->user_frames, 1);
    if (st != CTPU_OK) return st;   /* the callback's own error first (an early return skips its pops) */
    if (left[0]) {
        ctpu_set_error(CTPU_ERR_STATE, "%s: %s left %s open; they were closed when it returned", f->op, f->what, left);
        return CTPU_ERR_STATE;
    }
    if (bad[0]) {
        ctpu_set_error(CTPU_ERR_STATE, "%s: %s %s", f->op, f->what, bad);
        return CTPU_ERR_STATE;
    }
    return st;
}

/* ------------------------------------------------------------ errors */
static const char ts_oom_msg[] = "out of host memory for this thread's ctpu state";

/* Failure ids, unique across threads (an error handle met in another
 * thread finds no record, rather than another failure's). */
static _Atomic uint32_t fail_seq;

/* Record s's current error as a failure and make it what ctpu_failed returns;
 * cause: where the first cause starts in the message. */
static void fail_push(ctpu_thread_state *s, uint16_t cause)
{
    uint32_t id = atomic_fetch_add_explicit(&fail_seq, 1, memory_order_relaxed) + 1;
    if (id == 0) id = atomic_fetch_add_explicit(&fail_seq, 1, memory_order_relaxed) + 1;
    struct ctpu_fail *f = &s->fails[id % CTPU_FAIL_RING];
    f->id = id;
    f->st = s->err_status;
    f->cause = cause;
    memcpy(f->msg, s->err_msg, sizeof f->msg);
    s->fail_handle = (uint64_t)id << 32;
}

void ctpu_set_error(ctpu_status st, const char *fmt, ...)
{
    ctpu_thread_state *s = ctpu__ts_get();
    if (!s) return;                 /* ctpu_last_error says why */
    if (s->quiet_errors > 0) return;   /* a probe of a shape rule (dispatch.c's dynamic dims) */
    s->err_status = st;
    char raw[sizeof s->err_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    /* one line, whatever the user's strings hold (an environment value
     * "1\n", a label): control characters are written as escapes */
    char *msg = s->err_msg;
    size_t o = 0;
    for (const unsigned char *c = (const unsigned char *)raw; *c && o + 5 < sizeof s->err_msg; c++) {
        if (*c >= 0x20 && *c != 0x7f) msg[o++] = (char)*c;
        else if (*c == '\n') { msg[o++] = '\\'; msg[o++] = 'n'; }
        else if (*c == '\t') { msg[o++] = '\\'; msg[o++] = 't'; }
        else o += (size_t)snprintf(msg + o, sizeof s->err_msg - o, "\\x%02x", *c);
    }
    msg[o] = 0;
    fail_push(s, 0);
}

/* The failure record an error handle names, if this thread still has it. */
static const struct ctpu_fail *fail_find(const ctpu_thread_state *s, uint64_t handle)
{
    uint32_t id = (uint32_t)(handle >> 32);
    const struct ctpu_fail *f = &s->fails[id % CTPU_FAIL_RING];
    return id && f->id == id ? f : NULL;
}

void ctpu__fail_from(ctpu_tensor t, const char *op, const char *arg, bool quiet)
{
    ctpu_thread_state *s = ctpu__ts_get();
    if (!s) return;
    const struct ctpu_fail *f = fail_find(s, t.id);
    if (quiet) {
        /* an op passes it along: the handle unchanged, its cause the last error */
        if (f) {
            s->err_status = f->st;
            memcpy(s->err_msg, f->msg, sizeof s->err_msg);
        }
        s->fail_handle = t.id;
        return;
    }
    if (!f) {
        ctpu_set_error(CTPU_ERR_NULL_HANDLE, "%s: %s is the result of a failed call that is no longer recorded "
                       "(this thread keeps its last %d failures; or it failed in another thread)", op, arg,
                       CTPU_FAIL_RING);
        return;
    }
    /* "<op>: <arg> is the result of a failed call (from <first cause>)": the
     * cause of a cause is the first one, so chains do not nest */
    const char *cause = f->msg + f->cause;
    size_t len = strlen(cause) - (f->cause ? 1 : 0);   /* a derived record's cause is followed by ')' */
    char *msg = s->err_msg;
    int n = snprintf(msg, sizeof s->err_msg, "%s: %s is the result of a failed call (from ", op, arg);
    if (n < 0 || (size_t)n > sizeof s->err_msg - 2) n = 0;
    size_t room = sizeof s->err_msg - (size_t)n - 2;
    if (len > room) len = room;
    memmove(msg + n, cause, len);
    msg[n + len] = ')';
    msg[n + len + 1] = 0;
    s->err_status = f->st;
    fail_push(s, (uint16_t)n);
}

ctpu_tensor ctpu_error_handle(void) { return ctpu_failed(); }

/* ------------------------------------------------------------ labels */
const char *ctpu__prov_text(ctpu_op_prov p, char *buf, size_t len)
{
    const char *l = ctpu_rt ? ctpu_device_label(ctpu_rt->dev, p.label) : NULL;
    if (p.op_no == 0 && !l) buf[0] = 0;
    else if (p.op_no == 0) snprintf(buf, len, "\"%s\"", l);
    else if (!l) snprintf(buf, len, "op #%u", p.op_no);
    else snprintf(buf, len, "op #%u, \"%s\"", p.op_no, l);
    return buf;
}

const char *ctpu__label_text(uint32_t id)
{
    const char *l = ctpu_rt ? ctpu_device_label(ctpu_rt->dev, id) : NULL;
    return l ? l : "";
}

bool ctpu__label_push_id(uint32_t id)
{
    ctpu_thread_state *s = ctpu_ts();
    if (!s || s->label.depth == CTPU_LABEL_DEPTH) return false;
    s->label.stack[s->label.depth++] = id;
    return true;
}

void ctpu__label_pop(void)
{
    ctpu_thread_state *s = ctpu_ts_current();
    if (s && s->label.depth > 0) s->label.depth--;
}

uint32_t ctpu__backward_label(int op)
{
    uint32_t id = atomic_load_explicit(&ctpu_rt->bw_label[op], memory_order_relaxed);
    if (id) return id;
    char name[64];
    snprintf(name, sizeof name, "backward of %s", ctpu_op_name(op));
    id = ctpu_device_label_id_internal(ctpu_rt->dev, name);
    atomic_store_explicit(&ctpu_rt->bw_label[op], id, memory_order_relaxed);
    return id;
}

ctpu_status ctpu_label_push(const char *label)
{
    if (!ctpu_check_init("label_push")) return CTPU_ERR_NOT_INITIALIZED;
    size_t n = label ? strlen(label) : 0;
    if (n == 0 || n > 63) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "label_push: the label is %s (1 to 63 bytes)",
                       !label ? "NULL" : n == 0 ? "empty" : "longer than 63 bytes");
        return CTPU_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)label[i] < 0x20 || label[i] == 0x7f) {
            ctpu_set_error(CTPU_ERR_INVALID_ARG, "label_push: the label has a control character at byte %zu", i);
            return CTPU_ERR_INVALID_ARG;
        }
    ctpu_thread_state *s = ctpu_ts();
    if (!s) {
        ctpu_set_error(CTPU_ERR_OOM, "label_push: %s", ts_oom_msg);
        return CTPU_ERR_OOM;
    }
    if (s->label.depth == CTPU_LABEL_DEPTH) {
        ctpu_set_error(CTPU_ERR_STATE, "label_push: labels nest at most %d deep (\"%s\" would be number %d); likely "
                       "cause: a missing ctpu_label_pop (every push needs one, on error paths too)",
                       CTPU_LABEL_DEPTH, label, CTPU_LABEL_DEPTH + 1);
        return CTPU_ERR_STATE;
    }
    uint32_t id = ctpu_device_label_id(ctpu_rt->dev, label);
    if (!id) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "label_push: \"%s\" would be label %d: a runtime keeps at most %d "
                       "distinct labels", label, CTPU_MAX_LABELS + 1, CTPU_MAX_LABELS);
        return CTPU_ERR_INVALID_ARG;
    }
    s->label.stack[s->label.depth++] = id;
    return CTPU_OK;
}

/* "nll_loss", "target": 1 to 31 bytes, no control character */
static bool call_word(const char *w, const char *what)
{
    size_t n = w ? strlen(w) : 0;
    bool ok = n >= 1 && n <= 31;
    for (size_t i = 0; ok && i < n; i++) ok = (unsigned char)w[i] >= 0x20 && w[i] != 0x7f;
    if (!ok)
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "call_push: %s is %s (1 to 31 bytes, no control character)", what,
                       !w ? "NULL" : n == 0 ? "empty" : n > 31 ? "longer than 31 bytes" : "not printable");
    return ok;
}

ctpu_status ctpu_call_push(const char *call, const char *arg)
{
    if (!ctpu_check_init("call_push")) return CTPU_ERR_NOT_INITIALIZED;
    if (!call_word(call, "call") || !call_word(arg, "arg")) return CTPU_ERR_INVALID_ARG;
    ctpu_thread_state *s = ctpu_ts();
    if (!s) {
        ctpu_set_error(CTPU_ERR_OOM, "call_push: %s", ts_oom_msg);
        return CTPU_ERR_OOM;
    }
    if (s->label.call_depth == 8) {
        ctpu_set_error(CTPU_ERR_STATE, "call_push: call scopes nest at most 8 deep (\"%s\" would be number 9); "
                       "likely cause: a missing ctpu_call_pop", call);
        return CTPU_ERR_STATE;
    }
    if (s->label.call_depth == 0) {   /* the outermost names the fault: the user's call */
        char key[64];
        snprintf(key, sizeof key, "%s\x1f%s", call, arg);
        uint32_t id = ctpu_device_label_id_internal(ctpu_rt->dev, key);   /* reserved slots: user labels cannot fill them */
        if (!id) {
            ctpu_set_error(CTPU_ERR_STATE, "call_push: (\"%s\", \"%s\") does not fit: the runtime's label table "
                           "is full (%d user labels, %d library names)", call, arg, CTPU_MAX_LABELS, CTPU_LABELS_RESERVED);
            return CTPU_ERR_STATE;
        }
        s->label.call = id;
        s->label.call_name = ctpu_device_label(ctpu_rt->dev, ctpu_device_label_id_internal(ctpu_rt->dev, call));
    }
    s->label.call_depth++;
    return CTPU_OK;
}

ctpu_status ctpu_call_pop(void)
{
    if (!ctpu_check_init("call_pop")) return CTPU_ERR_NOT_INITIALIZED;
    ctpu_thread_state *s = ctpu_ts_current();
    if (s && ctpu__user_underflow(s, s->label.call_depth, s->user.call, "call_pop", "call scope", "ctpu_call_push"))
        return CTPU_ERR_STATE;
    if (!s || s->label.call_depth == 0) {
        ctpu_set_error(CTPU_ERR_STATE, "call_pop: no call scope is open (ctpu_call_push)");
        return CTPU_ERR_STATE;
    }
    if (--s->label.call_depth == 0) {
        s->label.call = 0;
        s->label.call_name = NULL;
    }
    return CTPU_OK;
}

ctpu_status ctpu_label_pop(void)
{
    if (!ctpu_check_init("label_pop")) return CTPU_ERR_NOT_INITIALIZED;
    ctpu_thread_state *s = ctpu_ts_current();
    if (s && ctpu__user_underflow(s, s->label.depth, s->user.label, "label_pop", "label", "ctpu_label_push"))
        return CTPU_ERR_STATE;
    if (!s || s->label.depth == 0) {
        ctpu_set_error(CTPU_ERR_STATE, "label_pop: no label is open (ctpu_label_push)");
        return CTPU_ERR_STATE;
    }
    s->label.depth--;
    return CTPU_OK;
}

const char *ctpu_version(void) { return CTPU_VERSION; }

const char *ctpu_last_error(void)
{
    ctpu_thread_state *s = ctpu__ts_get();
    return s ? s->err_msg : ts_oom_msg;
}

ctpu_status ctpu_last_status(void)
{
    ctpu_thread_state *s = ctpu__ts_get();
    return s ? s->err_status : CTPU_ERR_OOM;
}

void ctpu_clear_error(void)
{
    ctpu_thread_state *s = ctpu__ts;
    if (s != &ts_none) { s->err_status = CTPU_OK; s->err_msg[0] = 0; }
}

ctpu_status ctpu_report_error(ctpu_status st, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt ? fmt : "", ap);
    va_end(ap);
    ctpu_set_error(st, "%s", buf);
    return st;
}

const char *ctpu_status_str(ctpu_status s)
{
    static const char *const names[CTPU_STATUS_COUNT] = {
        "ok", "not initialized", "invalid argument", "null handle", "stale handle",
        "shape error", "dtype error", "out of memory", "device fault", "NaN (debug check)",
        "bad environment variable", "cache miss in cache-only mode", "I/O error", "bad state",
    };
    return (unsigned)s < CTPU_STATUS_COUNT ? names[s] : "unknown status";
}

const char *ctpu_fmt_type(const ctpu_vtype *t, char *buf, size_t len)
{
    size_t k = (size_t)snprintf(buf, len, "%s[", ctpu_dtype_name((ctpu_dtype)t->dtype));
    for (int d = 0; d < t->ndim && k < len; d++)
        k += (size_t)snprintf(buf + k, len - k, d ? ",%lld" : "%lld", (long long)t->shape[d]);
    if (k < len) snprintf(buf + k, len - k, "]");
    return buf;
}

const char *ctpu_dtype_name(ctpu_dtype dt)
{
    switch (dt) {
    case CTPU_F32: return "f32";
    case CTPU_BF16: return "bf16";
    case CTPU_I32: return "i32";
    default: return "?";
    }
}

bool ctpu_check_init(const char *op)
{
    if (ctpu_rt) return true;
    ctpu_set_error(CTPU_ERR_NOT_INITIALIZED, "%s: the runtime is not initialised (call ctpu_init; after ctpu_shutdown, again)", op);
    return false;
}

/* ------------------------------------------------------------ environment */
/* The variables and their kinds are declared once, in env.h. */
typedef enum {
    ENV_BOOL, ENV_LOOPS, ENV_CHIP, ENV_BYTES, ENV_PRECISION, ENV_ENTRIES, ENV_STEPS, ENV_PATH, ENV_PLAN, ENV_EVENTS,
    ENV_ISA, ENV_THREADS, ENV_LIMIT, ENV_SECONDS,
    ENV_DIST,                /* read by ctpu_dist_init (src/dist), not here */
} env_kind;

static const struct {
    const char *name;
    env_kind kind;
} env_vars[CTPU_ENV_COUNT] = {
#define X(name, kind, dflt, doc) { #name, ENV_##kind },
    CTPU_ENV_VARS(X)
#undef X
};

/* One variable's value, parsed and checked (set false: not in the
 * environment, or empty where empty means unset). */
typedef struct {
    bool set;
    uint64_t n;              /* booleans 0/1, enums, counts, bytes */
    double d;                /* seconds */
    const void *p;           /* TORCH_TPU_CHIP: the profile */
    const char *s;           /* the raw value */
} env_val;

static bool parse_u64(const char *v, uint64_t *out, bool suffixes)
{
    if (!v || !*v || !isdigit((unsigned char)*v)) return false;
    errno = 0;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno) return false;
    uint64_t mul = 1;
    if (suffixes && *end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': mul = 1ull << 10; break;
        case 'M': mul = 1ull << 20; break;
        case 'G': mul = 1ull << 30; break;
        case 'T': mul = 1ull << 40; break;
        default: return false;
        }
        end++;
        if (toupper((unsigned char)*end) == 'B') end++;
    }
    if (*end) return false;
    if (mul > 1 && x > UINT64_MAX / mul) return false;
    *out = x * mul;
    return true;
}

static bool env_is_bool(const char *v, uint64_t *out)
{
    if (strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0) *out = 1;
    else if (strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0) *out = 0;
    else return false;
    return true;
}

/* The kernel's pseudo-filesystem path is on (its files take no report:
 * /proc/version opens for root, then the write fails), or NULL. */
static const char *pseudo_fs(const char *path)
{
    struct statfs f;
    if (statfs(path, &f) != 0) return NULL;
    switch ((unsigned long)f.f_type) {
    case 0x9fa0UL: return "proc";
    case 0x62656572UL: return "sysfs";
    case 0x64626720UL: return "debugfs";
    case 0x27e0ebUL: return "cgroup";
    case 0x63677270UL: return "cgroup2";
    case 0x73636673UL: return "securityfs";
    case 0x74726163UL: return "tracefs";
    case 0xcafe4a11UL: return "bpf";
    default: return NULL;
    }
}

/* A file written at shutdown: its directory must exist and be writable now,
 * so a wrong path fails ctpu_init with the reason, not the end of a run. A
 * regular file or a new one on a kernel pseudo-filesystem (/proc, /sys) is
 * refused: its write would fail there (a device such as /dev/stdout is
 * fine). */
static bool check_out_path(const char *name, const char *path, char *err, size_t len)
{
    struct stat st;
    int e = 0;
    char dir[4096] = "";
    const char *fs = NULL;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) e = EISDIR;
        else if (access(path, W_OK) != 0) e = errno;
        else if (S_ISREG(st.st_mode) && (fs = pseudo_fs(path)) != NULL) e = EACCES;
    } else if (errno != ENOENT) {
        e = errno;                                  /* e.g. a file where a directory should be */
    } else {
        const char *slash = strrchr(path, '/');
        size_t dl = slash ? (size_t)(slash - path) : 0;
        if (!slash) snprintf(dir, sizeof dir, ".");
        else if (dl == 0) snprintf(dir, sizeof dir, "/");
        else if (dl < sizeof dir) snprintf(dir, sizeof dir, "%.*s", (int)dl, path);
        else e = ENAMETOOLONG;
        if (!e && stat(dir, &st) != 0) e = errno;
        else if (!e && !S_ISDIR(st.st_mode)) e = ENOTDIR;
        else if (!e && access(dir, W_OK | X_OK) != 0) e = errno;
        else if (!e && (fs = pseudo_fs(dir)) != NULL) e = EACCES;
    }
    if (!e) return true;
    if (fs) {
        snprintf(err, len, "ctpu_init: %s=\"%s\" cannot be written: it is on the kernel's %s pseudo-filesystem", name,
                 path, fs);
        return false;
    }
    if (dir[0])
        snprintf(err, len, "ctpu_init: %s=\"%s\" cannot be written: directory \"%s\": %s", name, path, dir,
                 strerror(e));
    else
        snprintf(err, len, "ctpu_init: %s=\"%s\" cannot be written: %s", name, path, strerror(e));
    return false;
}

static bool parse_var(int id, const char *v, env_val *out, char *err, size_t len)
{
    const char *name = env_vars[id].name;
    out->s = v;
    out->set = true;
    uint64_t n = 0;
    switch (env_vars[id].kind) {
    case ENV_BOOL:
        if (env_is_bool(v, &out->n)) return true;
        snprintf(err, len, "ctpu_init: %s=\"%s\" is not a boolean (use 1/0/true/false)", name, v);
        return false;
    case ENV_LOOPS:
        if (strcasecmp(v, "auto") == 0) out->n = CTPU_LOOPS_AUTO;
        else if (strcasecmp(v, "on") == 0 || (env_is_bool(v, &n) && n == 1)) out->n = CTPU_LOOPS_ON;
        else if (strcasecmp(v, "off") == 0 || (env_is_bool(v, &n) && n == 0)) out->n = CTPU_LOOPS_OFF;
        else break;
        return true;
    case ENV_CHIP:
        if ((out->p = ctpu_chip_lookup(v))) return true;
        break;
    case ENV_BYTES:
        if (parse_u64(v, &out->n, true) && out->n > 0) return true;
        break;
    case ENV_PRECISION:
        if (strcasecmp(v, "default") == 0) out->n = CTPU_PRECISION_DEFAULT;
        else if (strcasecmp(v, "high") == 0) out->n = CTPU_PRECISION_HIGH;
        else if (strcasecmp(v, "highest") == 0) out->n = CTPU_PRECISION_HIGHEST;
        else break;
        return true;
    case ENV_ENTRIES:
        if (parse_u64(v, &out->n, false) && out->n >= 1 && out->n <= (1u << 24)) return true;
        break;
    case ENV_STEPS:
        if (!*v) { out->set = false; return true; }  /* empty: unset */
        if (parse_u64(v, &out->n, false) && out->n <= (1ull << 40)) return true;
        break;
    case ENV_PATH:
        if (!*v) { out->set = false; return true; }  /* empty: unset */
        return check_out_path(name, v, err, len);
    case ENV_PLAN:
        for (int i = 0; i < CTPU_PRICE_PLAN_COUNT; i++)
            if (strcasecmp(v, ctpu_price_plan_name((ctpu_price_plan)i)) == 0) { out->n = (uint64_t)i; return true; }
        break;
    case ENV_EVENTS:
        if (parse_u64(v, &out->n, true) && out->n >= 16 && out->n <= CTPU_TRACE_MAX_EVENTS) return true;
        snprintf(err, len, "ctpu_init: %s=\"%s\" must be an event count in [16, %u] "
                 "(K/M suffixes; about 340 bytes an event)", name, v, CTPU_TRACE_MAX_EVENTS);
        return false;
    case ENV_DIST:
        out->set = false;
        return true;
    case ENV_ISA:
        for (int i = 0; i < CTPU_ISA_COUNT; i++)
            if (strcasecmp(v, ctpu_isa_name((ctpu_isa)i)) == 0) { out->n = (uint64_t)i; return true; }
        break;
    case ENV_THREADS:
        if (parse_u64(v, &out->n, false) && out->n >= 1 && out->n <= 64) return true;
        break;
    case ENV_LIMIT:
        if (parse_u64(v, &out->n, false) && out->n <= 65536) return true;
        break;
    case ENV_SECONDS: {
        char *end;
        errno = 0;
        const char *m = *v == '-' || *v == '+' ? v + 1 : v;   /* a sign: "-0" is 0, as the README's ">= 0" says */
        out->d = *m && (isdigit((unsigned char)*m) || *m == '.') ? strtod(v, &end) : -1;
        if (out->d >= 0 && out->d <= 1e7 && !errno && !*end) { out->d += 0.0; return true; }   /* -0 -> +0 */
        break;
    }
    }
    static const char *const what[] = {
        [ENV_LOOPS] = "must be auto, on or off",
        [ENV_CHIP] = "is not a known chip (v5e, v5p, v6e, 7x)",
        [ENV_BYTES] = "is not a positive byte count (digits with an optional K/M/G/T suffix)",
        [ENV_PRECISION] = "must be default, high or highest",
        [ENV_ENTRIES] = "must be an entry count in [1, 16777216]",
        [ENV_STEPS] = "must be a step count",
        [ENV_PLAN] = "must be on_demand, flex_start, 1y or 3y",
        [ENV_ISA] = "must be scalar, avx2 or avx512",
        [ENV_THREADS] = "must be a thread count in [1, 64]",
        [ENV_LIMIT] = "must be a shape count in [0, 65536] (0: no limit)",
        [ENV_SECONDS] = "must be a number of seconds in [0, 1e7]",
    };
    snprintf(err, len, "ctpu_init: %s=\"%s\" %s", name, v, what[env_vars[id].kind]);
    return false;
}

/* ---- names ctpu_init does not know */
extern char **environ;

static bool has_prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* Edit distance with adjacent transpositions (optimal string alignment),
 * over the first 63 characters of each name. */
static int name_distance(const char *a, const char *b)
{
    enum { M = 64 };
    int la = (int)strnlen(a, M - 1), lb = (int)strnlen(b, M - 1);
    int d[M][M];
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
                c = d[i - 2][j - 2] + 1;
            d[i][j] = c;
        }
    return d[la][lb];
}

static int env_known(const char *name)
{
    for (int i = 0; i < CTPU_ENV_COUNT; i++)
        if (strcmp(name, env_vars[i].name) == 0) return i;
    return -1;
}

/* One warning on stderr for each variable named like one of ctpu's (prefix
 * TORCH_TPU_ or CTPU_, or TorchTPU's own spelling of the mode switches)
 * that ctpu does not read: a TorchTPU variable ctpu does not implement has
 * no effect; anything else is most likely a misspelling. CTPU_QUIET does
 * not silence these (a misspelled variable is a configuration error). */
static void env_warn_unknown(void)
{
    static const char *const prefixes[] = { CTPU_ENV_PREFIXES }, *const reserved[] = { CTPU_ENV_RESERVED };
    static const char *const torchtpu_only[] = { CTPU_ENV_TORCHTPU_ONLY };
    static const char *const also[] = { "TPU_DEFER_AND_FUSE", "TPU_LAUNCH_BLOCKING" };
    for (char **ep = environ; ep && *ep; ep++) {
        char name[128];
        size_t n = strcspn(*ep, "=");
        if (n >= sizeof name) n = sizeof name - 1;
        for (size_t i = 0; i < n; i++) {              /* one line whatever the name holds */
            unsigned char c = (unsigned char)(*ep)[i];
            name[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
        }
        name[n] = 0;
        bool ours = false;
        for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) ours |= has_prefix(name, prefixes[i]);
        for (size_t i = 0; i < sizeof also / sizeof *also; i++) ours |= strcmp(name, also[i]) == 0;
        for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++) ours &= !has_prefix(name, reserved[i]);
        if (!ours || env_known(name) >= 0) continue;
        bool theirs = false;
        for (size_t i = 0; i < sizeof torchtpu_only / sizeof *torchtpu_only; i++) {
            const char *t = torchtpu_only[i];
            size_t tl = strlen(t);
            theirs |= t[tl - 1] == '*' ? strncmp(name, t, tl - 1) == 0 : strcmp(name, t) == 0;
        }
        if (theirs) {
            /* TORCH_TPU_INTERNAL_X where ctpu reads TORCH_TPU_X: say so */
            char pub[sizeof name];
            const char *in = "TORCH_TPU_INTERNAL_";
            bool hint = has_prefix(name, in) &&
                        snprintf(pub, sizeof pub, "TORCH_TPU_%s", name + strlen(in)) < (int)sizeof pub &&
                        env_known(pub) >= 0;
            fprintf(stderr, "ctpu: warning: %s is a TorchTPU variable that has no effect in ctpu%s%s%s\n", name,
                    hint ? " (ctpu reads " : "", hint ? pub : "", hint ? ")" : "");
            continue;
        }
        int best = 0, bd = name_distance(name, env_vars[0].name);
        for (int i = 1; i < CTPU_ENV_COUNT; i++) {
            int d = name_distance(name, env_vars[i].name);
            if (d < bd) { bd = d; best = i; }
        }
        fprintf(stderr, "ctpu: warning: %s is not a ctpu variable; did you mean %s?\n", name, env_vars[best].name);
    }
}

static bool read_env(ctpu_runtime *rt, char *err, size_t len)
{
    env_warn_unknown();
    env_val e[CTPU_ENV_COUNT];
    memset(e, 0, sizeof e);
    for (int i = 0; i < CTPU_ENV_COUNT; i++) {
        const char *v = getenv(env_vars[i].name);
        if (v && !parse_var(i, v, &e[i], err, len)) return false;
    }
#define ENV(name) (&e[CTPU_ENV_##name])
    /* TorchTPU checks LAUNCH_BLOCKING first; it wins */
    rt->mode = ENV(TORCH_TPU_LAUNCH_BLOCKING)->n == 1 ? CTPU_MODE_DEBUG
             : ENV(TORCH_TPU_DEFER_AND_FUSE)->n == 1  ? CTPU_MODE_DEFER_FUSE
                                                      : CTPU_MODE_STRICT;
    rt->debug_checks_env = ENV(TORCH_TPU_ENABLE_DEBUG_CHECKS)->set ? (int)ENV(TORCH_TPU_ENABLE_DEBUG_CHECKS)->n : -1;
    rt->detect_loops = ENV(TORCH_TPU_DETECT_LOOPS)->set ? (ctpu_detect_loops)ENV(TORCH_TPU_DETECT_LOOPS)->n
                                                        : CTPU_LOOPS_AUTO;
    rt->chip = ENV(TORCH_TPU_CHIP)->set ? ENV(TORCH_TPU_CHIP)->p : ctpu_chip_lookup("v5e");

    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t half_ram = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz / 2 : rt->chip->hbm_bytes;
    rt->hbm_cap = rt->chip->hbm_bytes < half_ram ? rt->chip->hbm_bytes : half_ram;
    /* ctpu_dist_init: each rank on this node is a chip of its own and gets
     * its share of the default (issue 19) */
    int local_ranks = ctpu__dist_local_size();
    rt->hbm_cap /= (uint64_t)local_ranks;
    if (ENV(TORCH_TPU_HBM_LIMIT)->set) rt->hbm_cap = ENV(TORCH_TPU_HBM_LIMIT)->n;

    rt->precision = ENV(TORCH_TPU_MATMUL_PRECISION)->set ? (ctpu_precision)ENV(TORCH_TPU_MATMUL_PRECISION)->n
                                                         : CTPU_PRECISION_DEFAULT;
    rt->cache_size = ENV(TORCH_TPU_CACHE_SIZE)->set ? (size_t)ENV(TORCH_TPU_CACHE_SIZE)->n : 1024;
    rt->strict_cache_size = ENV(CTPU_STRICT_CACHE_SIZE)->set ? (size_t)ENV(CTPU_STRICT_CACHE_SIZE)->n : 4096;
    rt->recompile_limit = ENV(TORCH_TPU_RECOMPILE_LIMIT)->set ? (size_t)ENV(TORCH_TPU_RECOMPILE_LIMIT)->n : 8;
    rt->cache_only_after = ENV(TORCH_TPU_CACHE_ONLY)->set ? (long)ENV(TORCH_TPU_CACHE_ONLY)->n : -1;
    if (ENV(TORCH_TPU_METRICS_FILE)->set && !(rt->metrics_file = strdup(ENV(TORCH_TPU_METRICS_FILE)->s))) {
        snprintf(err, len, "ctpu_init: out of host memory");
        return false;
    }
    if (ENV(TORCH_TPU_TRACE_FILE)->set && !(rt->trace_file = strdup(ENV(TORCH_TPU_TRACE_FILE)->s))) {
        snprintf(err, len, "ctpu_init: out of host memory");
        return false;
    }
    rt->quiet = ENV(CTPU_QUIET)->n == 1;
    rt->compile_disable = ENV(TORCH_COMPILE_DISABLE)->n == 1;
    rt->compile_seconds = ENV(TORCH_TPU_COMPILE_SECONDS)->set ? ENV(TORCH_TPU_COMPILE_SECONDS)->d
                                                             : CTPU_COMPILE_SECONDS_DEFAULT;
    rt->auto_dynamic = ENV(TORCH_TPU_AUTO_DYNAMIC)->n == 1;

    rt->price_plan = ENV(TORCH_TPU_PRICE_PLAN)->set ? (ctpu_price_plan)ENV(TORCH_TPU_PRICE_PLAN)->n
                                                 : CTPU_PRICE_ON_DEMAND;
    rt->trace_events = ENV(TORCH_TPU_TRACE_EVENTS)->set ? (size_t)ENV(TORCH_TPU_TRACE_EVENTS)->n
                                                     : CTPU_TRACE_DEFAULT_EVENTS;

    rt->isa = ctpu_isa_detect();
    if (ENV(CTPU_ISA)->set) {
        ctpu_isa want = (ctpu_isa)ENV(CTPU_ISA)->n;
        if (want > rt->isa) {
            snprintf(err, len, "ctpu_init: CTPU_ISA=\"%s\": this CPU supports at most %s", ENV(CTPU_ISA)->s,
                     ctpu_isa_name(rt->isa));
            return false;
        }
        rt->isa = want;
    }

    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    rt->nthreads = ncpu > 0 ? (int)(ncpu > 64 ? 64 : ncpu) : 1;
    rt->nthreads = rt->nthreads / local_ranks > 0 ? rt->nthreads / local_ranks : 1;
    if (ENV(CTPU_NUM_THREADS)->set) rt->nthreads = (int)ENV(CTPU_NUM_THREADS)->n;
#undef ENV
    return true;
}

/* ------------------------------------------------------------ lifecycle */
static void runtime_free(ctpu_runtime *rt)
{
    if (!rt) return;
    ctpu_device_destroy(rt->dev);
    ctpu_cache_destroy(rt->strict_cache);
    ctpu_cache_destroy(rt->fused_cache);
    for (uint32_t p = 0; p < rt->n_pages; p++) free(rt->pages[p]);
    free(rt->pages);
    free(rt->free_list);
    ctpu__report_free(rt);
    free(rt->metrics_file);
    free(rt->trace_file);
    ctpu_metrics_destroy(&rt->metrics);
    pthread_mutex_destroy(&rt->slot_mu);
    pthread_mutex_destroy(&rt->rng_mu);
    pthread_mutex_destroy(&rt->compiled_mu);
    pthread_mutex_destroy(&rt->strict_sig_mu);
    free(rt->strict_sig);
    free(rt->strict_sig_step);
    free(rt);
}

ctpu_status ctpu_init(void)
{
    pthread_mutex_lock(&init_mu);
    if (ctpu_rt) {
        pthread_mutex_unlock(&init_mu);
        ctpu_set_error(CTPU_ERR_STATE, "ctpu_init: already initialised (call ctpu_shutdown first)");
        return CTPU_ERR_STATE;
    }
    char err[512] = "";
    ctpu_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) {
        pthread_mutex_unlock(&init_mu);
        ctpu_set_error(CTPU_ERR_OOM, "ctpu_init: out of host memory");
        return CTPU_ERR_OOM;
    }
    pthread_mutex_init(&rt->slot_mu, NULL);
    pthread_mutex_init(&rt->rng_mu, NULL);
    pthread_mutex_init(&rt->compiled_mu, NULL);
    pthread_mutex_init(&rt->strict_sig_mu, NULL);
    ctpu_metrics_init(&rt->metrics);
    if (!read_env(rt, err, sizeof err)) {
        runtime_free(rt);
        pthread_mutex_unlock(&init_mu);
        ctpu_set_error(CTPU_ERR_ENV, "%s", err);
        return CTPU_ERR_ENV;
    }
    ctpu_status rst = ctpu__report_init(rt, err, sizeof err);
    if (rst != CTPU_OK) {
        runtime_free(rt);
        pthread_mutex_unlock(&init_mu);
        ctpu_set_error(rst, "%s", err);
        return rst;
    }
    rt->debug_checks = rt->debug_checks_env == 1;   /* unset: they follow the mode (ctpu_debug_checks_now) */
    ctpu_kernels_set_isa(rt->isa);
    rt->pages = calloc(CTPU_MAX_PAGES, sizeof *rt->pages);
    rt->strict_cache = ctpu_cache_create(rt->strict_cache_size, 0);
    rt->fused_cache = ctpu_cache_create(rt->cache_size, rt->recompile_limit);
    rt->dev = rt->pages && rt->strict_cache && rt->fused_cache
                  ? ctpu_device_create(rt->chip, rt->hbm_cap, rt->nthreads, &rt->metrics, err, sizeof err)
                  : NULL;
    if (!rt->dev) {
        runtime_free(rt);
        pthread_mutex_unlock(&init_mu);
        ctpu_set_error(CTPU_ERR_OOM, "ctpu_init: %s", err[0] ? err : "out of host memory");
        return CTPU_ERR_OOM;
    }
    ctpu_cache_set_device(rt->strict_cache, rt->dev);
    ctpu_cache_set_device(rt->fused_cache, rt->dev);
    atomic_init(&rt->next_scope_id, 1);
    atomic_init(&rt->next_trace_id, 1);
    rt->epoch = ++epoch_counter;
    ctpu_rt = rt;
    pthread_mutex_unlock(&init_mu);
    return CTPU_OK;
}

bool ctpu_is_initialized(void) { return ctpu_rt != NULL; }

/* Leak watch at shutdown: one line on what the program left to it (live
 * handles, the HBM they hold, the origins holding the most; this thread's
 * open scopes). CTPU_QUIET=1 silences it. */
static void shutdown_leak_line(ctpu_runtime *rt, char *line, size_t len)
{
    line[0] = 0;
    if (rt->quiet) return;
    const ctpu_thread_state *ts = ctpu_ts_current();
    int depth = ts ? ts->scope_depth : 0;
    uint64_t nh, nb;
    ctpu_holder top[5];
    size_t n = ctpu__live_holders(rt, &nh, &nb, top, 5);
    if (!nh && !depth) return;
    char b[32], hn[128];
    size_t k = 0;
    k += (size_t)snprintf(line + k, len - k, "ctpu: at shutdown %llu handle%s still live, holding %s of HBM",
                          (unsigned long long)nh, nh == 1 ? " was" : "s were", ctpu__fmt_bytes(nb, b, sizeof b));
    for (size_t i = 0; i < n && k < len; i++)
        k += (size_t)snprintf(line + k, len - k, "%s%s %s in %llu", i ? ", " : " (most: ",
                              ctpu__holder_name(&top[i], hn, sizeof hn), ctpu__fmt_bytes(top[i].bytes, b, sizeof b),
                              (unsigned long long)top[i].handles);
    if (n && k < len) k += (size_t)snprintf(line + k, len - k, ")");
    if (depth && k < len)
        k += (size_t)snprintf(line + k, len - k, "; %d scope%s still open on this thread (a missing "
                              "ctpu_scope_end or ctpu_step_end)", depth, depth == 1 ? "" : "s");
    if (k < len) snprintf(line + k, len - k, "; ctpu_shutdown released them");
}

/* Shutdown would free the runtime under a caller: from inside a user frame
 * (a compiled step's fn, a grad hook) of this thread or while another
 * thread is in one. Refused: the error is set and nothing changes. */
static bool shutdown_refused(ctpu_runtime *rt)
{
    int frames = atomic_load(&rt->user_frames), busy = atomic_load(&calls_busy);
    if (frames == 0 && busy == 0) return false;
    ctpu_thread_state *s = ctpu_ts_current();
    if (s && s->user.depth > 0) {
        ctpu_set_error(CTPU_ERR_STATE, "ctpu_shutdown: called from inside %s (ctpu is still running its caller): "
                       "nothing was shut down, the runtime stays usable; shut down after that call returns",
                       s->user.what);
        if (!s->user.bad[0])
            snprintf(s->user.bad, sizeof s->user.bad, "called ctpu_shutdown (refused: the runtime stays up)");
    } else if (frames > 0) {
        ctpu_set_error(CTPU_ERR_STATE, "ctpu_shutdown: %d other thread%s inside a compiled step's fn or a grad "
                       "hook: nothing was shut down, the runtime stays usable; shut down once they return",
                       frames, frames == 1 ? " is" : "s are");
    } else {
        ctpu_set_error(CTPU_ERR_STATE, "ctpu_shutdown: %d other thread%s inside a ctpu call (a compiled call, "
                       "backward, sync or a host read): nothing was shut down, the runtime stays usable; shut down "
                       "once they return", busy, busy == 1 ? " is" : "s are");
    }
    return true;
}

void ctpu_shutdown(void)
{
    pthread_mutex_lock(&init_mu);
    ctpu_runtime *rt = ctpu_rt;
    if (!rt) { pthread_mutex_unlock(&init_mu); return; }
    atomic_store(&calls_closing, true);   /* guarded calls starting now wait for the outcome */
    if (shutdown_refused(rt)) {
        atomic_store(&calls_closing, false);
        pthread_mutex_unlock(&init_mu);
        return;
    }
    closing_self = true;
    char leaks[1024];
    shutdown_leak_line(rt, leaks, sizeof leaks);   /* before this thread's scopes go */
    ctpu__ts_drop_runtime();        /* this thread's unfinished trace, scopes, overrides */
    ctpu_device_wait(rt->dev, 0);
    ctpu__compiled_shutdown(rt);    /* compiled steps let go of their programs and tensors */
    ctpu__report_shutdown(rt);      /* TORCH_TPU_METRICS_FILE / summary line, TORCH_TPU_TRACE_FILE */
    ctpu__compiled_final(rt);       /* the compiled steps' report rows */
    if (leaks[0]) fprintf(stderr, "%s\n", leaks);
    ctpu__tensors_shutdown(rt);
    ctpu_device_wait(rt->dev, 0);
    ctpu_rt = NULL;
    runtime_free(rt);
    closing_self = false;
    atomic_store(&calls_closing, false);
    pthread_mutex_unlock(&init_mu);
}

/* ------------------------------------------------------------ modes */
ctpu_mode ctpu_mode_now(void)
{
    /* on every op's path: the epoch is checked only when an override is set */
    const ctpu_thread_state *s = ctpu__ts;
    if (s->mode_override >= 0 && ctpu_ts_current() == s) return (ctpu_mode)s->mode_override;
    return ctpu_rt ? ctpu_rt->mode : CTPU_MODE_STRICT;
}

bool ctpu_debug_checks_now(void)
{
    if (!ctpu_rt) return false;
    /* forced by the variable or ctpu_set_debug_checks; else the current
     * mode's (process mode and thread override): on in debug eager only */
    if (ctpu_rt->debug_checks_env >= 0) return ctpu_rt->debug_checks;
    return ctpu_mode_now() == CTPU_MODE_DEBUG;
}

ctpu_status ctpu_set_mode(ctpu_mode m)
{
    if (!ctpu_check_init("set_mode")) return CTPU_ERR_NOT_INITIALIZED;
    if ((unsigned)m >= CTPU_MODE_COUNT) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "set_mode: mode %d is not a ctpu_mode", (int)m);
        return CTPU_ERR_INVALID_ARG;
    }
    if (ctpu__capturing() && !ctpu__capture_break(CTPU_CUT_MODE, "set_mode")) return ctpu_last_status();
    ctpu__defer_flush(CTPU_CUT_MODE);
    ctpu_device_wait(ctpu_rt->dev, 0);
    ctpu_rt->mode = m;
    return CTPU_OK;
}

ctpu_status ctpu_set_thread_mode(ctpu_mode m)
{
    if (!ctpu_check_init("set_thread_mode")) return CTPU_ERR_NOT_INITIALIZED;
    if ((int)m == -1) { ctpu_clear_thread_mode(); return CTPU_OK; }
    if ((unsigned)m >= CTPU_MODE_COUNT) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "set_thread_mode: mode %d is not a ctpu_mode", (int)m);
        return CTPU_ERR_INVALID_ARG;
    }
    ctpu_thread_state *s = ctpu_ts();
    if (!s) {
        ctpu_set_error(CTPU_ERR_OOM, "set_thread_mode: %s", ts_oom_msg);
        return CTPU_ERR_OOM;
    }
    if (ctpu__capturing() && !ctpu__capture_break(CTPU_CUT_MODE, "set_thread_mode")) return ctpu_last_status();
    ctpu__defer_flush(CTPU_CUT_MODE);
    s->mode_override = (int)m;
    return CTPU_OK;
}

void ctpu_clear_thread_mode(void)
{
    if (ctpu__capturing() && !ctpu__capture_break(CTPU_CUT_MODE, "clear_thread_mode")) return;
    ctpu_thread_state *s = ctpu__ts;
    if (s != &ts_none) s->mode_override = -1;
}

ctpu_mode ctpu_get_mode(void) { return ctpu_mode_now(); }

const char *ctpu_mode_name(ctpu_mode m)
{
    switch (m) {
    case CTPU_MODE_STRICT: return "strict";
    case CTPU_MODE_DEBUG: return "debug";
    case CTPU_MODE_DEFER_FUSE: return "defer_fuse";
    default: return "?";
    }
}

ctpu_status ctpu_set_debug_checks(bool on)
{
    if (!ctpu_check_init("set_debug_checks")) return CTPU_ERR_NOT_INITIALIZED;
    ctpu_rt->debug_checks = on;
    ctpu_rt->debug_checks_env = on ? 1 : 0;
    return CTPU_OK;
}

bool ctpu_debug_checks(void) { return ctpu_debug_checks_now(); }

ctpu_status ctpu_set_matmul_precision(ctpu_precision p)
{
    if (!ctpu_check_init("set_matmul_precision")) return CTPU_ERR_NOT_INITIALIZED;
    if ((unsigned)p >= CTPU_PRECISION_COUNT) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "set_matmul_precision: %d is not a ctpu_precision", (int)p);
        return CTPU_ERR_INVALID_ARG;
    }
    ctpu_rt->precision = p;
    return CTPU_OK;
}

ctpu_precision ctpu_get_matmul_precision(void)
{
    return ctpu_rt ? ctpu_rt->precision : CTPU_PRECISION_DEFAULT;
}

static ctpu_status sync_run(void);

ctpu_status ctpu_sync(void)
{
    if (!ctpu__call_enter("sync")) return CTPU_ERR_NOT_INITIALIZED;
    ctpu_status st = sync_run();
    ctpu__call_exit();
    return st;
}

static ctpu_status sync_run(void)
{
    /* inside a compiled step's capture: a graph break, checked before
     * anything is cut (fullgraph: the error, nothing ran) */
    if (ctpu__capturing() && !ctpu__capture_break(CTPU_CUT_SYNC, "a trace cut (sync)")) return ctpu_last_status();
    uint64_t t0 = ctpu_now_ns();
    ctpu_counter_add(&ctpu_rt->metrics, CTPU_CTR_SYNCS, 1);
    ctpu_status fst = ctpu__defer_flush(CTPU_CUT_SYNC);
    ctpu_device_wait(ctpu_rt->dev, 0);
    char msg[256];
    ctpu_status st = ctpu_device_take_error(ctpu_rt->dev, msg, sizeof msg);
    if (st != CTPU_OK) ctpu_set_error(st, "%s", msg);
    ctpu__report_sync(t0);
    return st != CTPU_OK ? st : fst;
}

/* ------------------------------------------------------------ chip, HBM */
const ctpu_chip_info *ctpu_chip(void) { return ctpu_rt ? ctpu_rt->chip : NULL; }

const ctpu_chip_info *ctpu_chip_lookup(const char *name)
{
    if (!name) return NULL;
    int n;
    const ctpu_chip_info *p = ctpu_chip_profiles(&n);
    for (int i = 0; i < n; i++)
        if (strcasecmp(p[i].name, name) == 0) return &p[i];
    return NULL;
}

ctpu_status ctpu_hbm_get_stats(ctpu_hbm_stats *out)
{
    if (!ctpu_check_init("hbm_get_stats")) return CTPU_ERR_NOT_INITIALIZED;
    if (!out) {
        ctpu_set_error(CTPU_ERR_INVALID_ARG, "hbm_get_stats: out is NULL");
        return CTPU_ERR_INVALID_ARG;
    }
    ctpu_hbm_stats_get(ctpu_rt->dev, out);
    return CTPU_OK;
}

void ctpu_hbm_reset_peak(void)
{
    if (ctpu_rt) ctpu_hbm_peak_reset(ctpu_rt->dev);
}

/* ------------------------------------------------------------ metrics */
int64_t ctpu_metric_counter(const char *name)
{
    if (!ctpu_rt) return 0;
    long long v = ctpu_metrics_counter_by_name(&ctpu_rt->metrics, name);
    return v < 0 ? 0 : v;
}

/* ctpu_metrics_report, ctpu_metrics_clear: report.c */

/* ------------------------------------------------------------ test hooks */
void ctpu__test_device_hold(bool hold)
{
    if (ctpu_rt) ctpu_device_hold(ctpu_rt->dev, hold);
}

ctpu_cache *ctpu__test_strict_cache(void) { return ctpu_rt ? ctpu_rt->strict_cache : NULL; }
